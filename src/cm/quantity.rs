//! Kubernetes resource quantities ("100m", "1.5", "64Mi", "1G", "129e6"),
//! parsed to millicores or bytes (upstream `apimachinery/pkg/api/resource`).

#[derive(Debug, thiserror::Error)]
#[error("invalid quantity {0:?}")]
pub struct QuantityError(pub String);

/// Parses to a value scaled by 1000 (milli-units), rounding up as upstream's
/// MilliValue does.
pub fn parse_milli(s: &str) -> Result<i128, QuantityError> {
    let err = || QuantityError(s.to_string());
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    if num.is_empty() {
        return Err(err());
    }
    let (neg, num) = match num.strip_prefix('-') {
        Some(n) => (true, n),
        None => (false, num.strip_prefix('+').unwrap_or(num)),
    };
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(err());
    }
    let digits = format!("{int_part}{frac_part}");
    if !digits.chars().all(|c| c.is_ascii_digit()) {
        return Err(err());
    }
    let mantissa: i128 = digits.parse().map_err(|_| err())?;
    // value = mantissa * 10^-frac_len * multiplier; work in milli-units.
    let (mul_num, mul_exp10): (i128, i32) = match suffix {
        "" => (1, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        e if e.starts_with(['e', 'E']) => (1, e[1..].parse::<i32>().map_err(|_| err())?),
        _ => return Err(err()),
    };
    let exp = mul_exp10 + 3 - frac_part.len() as i32;
    let mut v = mantissa * mul_num;
    if exp >= 0 {
        v = v
            .checked_mul(10i128.checked_pow(exp as u32).ok_or_else(err)?)
            .ok_or_else(err)?;
    } else {
        let d = 10i128.checked_pow((-exp) as u32).ok_or_else(err)?;
        v = (v + d - 1) / d;
    }
    Ok(if neg { -v } else { v })
}

pub fn parse_cpu_millis(s: &str) -> Result<i64, QuantityError> {
    Ok(parse_milli(s)? as i64)
}

/// Bytes, rounded up.
pub fn parse_bytes(s: &str) -> Result<i64, QuantityError> {
    let m = parse_milli(s)?;
    Ok(((m + 999) / 1000) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_forms() {
        assert_eq!(parse_cpu_millis("100m").unwrap(), 100);
        assert_eq!(parse_cpu_millis("1").unwrap(), 1000);
        assert_eq!(parse_cpu_millis("0.5").unwrap(), 500);
        assert_eq!(parse_cpu_millis("1.5").unwrap(), 1500);
        assert!(parse_cpu_millis("abc").is_err());
    }

    #[test]
    fn memory_forms() {
        assert_eq!(parse_bytes("64Mi").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("1G").unwrap(), 1_000_000_000);
        assert_eq!(parse_bytes("129e6").unwrap(), 129_000_000);
        assert_eq!(parse_bytes("128974848").unwrap(), 128_974_848);
        assert_eq!(parse_bytes("1.5Gi").unwrap(), 3 << 29);
        assert!(parse_bytes("12Qi").is_err());
    }
}
