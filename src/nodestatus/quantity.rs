//! The few `resource.Quantity` rules node status needs: parsing reserved
//! amounts ("100m", "1Gi", "10%") and printing capacities in canonical form
//! ("32863392Ki", "1900m"), as apimachinery does.

/// A quantity in thousandths of its unit (millicores for CPU, millibytes for
/// memory), so "100m" and "1Gi" share one integer type.
pub fn parse_milli(s: &str) -> Option<i128> {
    crate::cm::quantity::parse_milli(s).ok()
}

/// A percentage ("10%") of a total, or an absolute quantity in milli-units.
pub fn parse_threshold_milli(s: &str, total_milli: i128) -> Option<i128> {
    match s.trim().strip_suffix('%') {
        Some(p) => {
            let p: f64 = p.parse().ok()?;
            Some((total_milli as f64 * p / 100.0) as i128)
        }
        None => parse_milli(s),
    }
}

/// Bytes in apimachinery's canonical binary form: the largest binary
/// suffix that divides the value exactly ("32863392Ki", "8Gi", "1000").
pub fn format_binary(bytes: i128) -> String {
    if bytes == 0 {
        return "0".into();
    }
    let mut v = bytes;
    let mut i = 0;
    while i < 6 && v % 1024 == 0 {
        v /= 1024;
        i += 1;
    }
    let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][i];
    format!("{v}{suffix}")
}

/// Milli-units in canonical decimal form: whole units without a suffix,
/// else millis ("2", "1900m").
pub fn format_decimal_milli(milli: i128) -> String {
    if milli % 1000 == 0 {
        format!("{}", milli / 1000)
    } else {
        format!("{milli}m")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_as_apimachinery() {
        assert_eq!(parse_milli("100m"), Some(100));
        assert_eq!(parse_milli("2"), Some(2000));
        assert_eq!(parse_milli("0.5"), Some(500));
        assert_eq!(parse_milli("100Mi"), Some(100 * 1000 * (1 << 20)));
        assert_eq!(parse_milli("1G"), Some(1000 * 1_000_000_000));
        assert_eq!(parse_milli("1x"), None);
        assert_eq!(parse_threshold_milli("10%", 1000), Some(100));
        assert_eq!(format_binary(33_652_113_408), "32863392Ki");
        assert_eq!(format_binary(8 << 30), "8Gi");
        assert_eq!(format_binary(1000), "1000");
        assert_eq!(format_decimal_milli(2000), "2");
        assert_eq!(format_decimal_milli(1900), "1900m");
    }
}
