//! Go-style durations: parsing and formatting that match Go's `time.ParseDuration` and
//! `time.Duration.String()`, plus `GoDuration`, the counterpart of `metav1.Duration`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::ConfigError;

const NS_PER_US: u64 = 1_000;
const NS_PER_MS: u64 = 1_000_000;
const NS_PER_S: u64 = 1_000_000_000;
const NS_PER_M: u64 = 60 * NS_PER_S;
const NS_PER_H: u64 = 60 * NS_PER_M;
/// Go durations are int64 nanoseconds; anything larger is an overflow there.
const MAX_NANOS: u64 = i64::MAX as u64;

fn invalid(input: &str) -> ConfigError {
    ConfigError::InvalidDuration(format!("time: invalid duration \"{input}\""))
}

/// Parses a Go duration string such as `"1m30s"`, `"100ms"`, `"1.5h"` or `"0"`.
///
/// Error texts mirror Go's (`time: invalid duration "x"`, `time: missing unit ...`,
/// `time: unknown unit ...`). Negative durations are rejected because every kubelet
/// duration we model is a period or timeout; `-0s` still means zero, as in Go.
pub fn parse_go_duration(input: &str) -> Result<Duration, ConfigError> {
    let mut rest = input;
    let mut negative = false;
    if let Some(r) = rest.strip_prefix('-') {
        negative = true;
        rest = r;
    } else if let Some(r) = rest.strip_prefix('+') {
        rest = r;
    }
    // Go accepts a bare "0" (and only "0") without a unit.
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid(input));
    }

    let mut total: u64 = 0;
    while !rest.is_empty() {
        let first = rest.as_bytes()[0];
        if first != b'.' && !first.is_ascii_digit() {
            return Err(invalid(input));
        }

        // Integer part.
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let mut value: u64 = 0;
        for b in rest[..int_len].bytes() {
            value = value
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(b - b'0')))
                .filter(|v| *v <= MAX_NANOS)
                .ok_or_else(|| invalid(input))?;
        }
        let had_int = int_len > 0;
        rest = &rest[int_len..];

        // Fraction part: like Go, extra digits past u64 precision are consumed but ignored.
        let mut frac: u64 = 0;
        let mut scale: f64 = 1.0;
        let mut had_frac = false;
        if let Some(r) = rest.strip_prefix('.') {
            let frac_len = r.bytes().take_while(u8::is_ascii_digit).count();
            let mut overflowed = false;
            for b in r[..frac_len].bytes() {
                if overflowed {
                    continue;
                }
                match frac
                    .checked_mul(10)
                    .and_then(|v| v.checked_add(u64::from(b - b'0')))
                {
                    Some(v) if v <= MAX_NANOS => {
                        frac = v;
                        scale *= 10.0;
                    }
                    _ => overflowed = true,
                }
            }
            had_frac = frac_len > 0;
            rest = &r[frac_len..];
        }
        if !had_int && !had_frac {
            // "." or ".s": no digits at all.
            return Err(invalid(input));
        }

        let unit_len = rest
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(rest.len());
        if unit_len == 0 {
            return Err(ConfigError::InvalidDuration(format!(
                "time: missing unit in duration \"{input}\""
            )));
        }
        let unit_str = &rest[..unit_len];
        rest = &rest[unit_len..];
        let unit = match unit_str {
            "ns" => 1,
            // U+00B5 (micro sign) and U+03BC (Greek mu) are both accepted by Go.
            "us" | "\u{b5}s" | "\u{3bc}s" => NS_PER_US,
            "ms" => NS_PER_MS,
            "s" => NS_PER_S,
            "m" => NS_PER_M,
            "h" => NS_PER_H,
            _ => {
                return Err(ConfigError::InvalidDuration(format!(
                    "time: unknown unit \"{unit_str}\" in duration \"{input}\""
                )))
            }
        };

        let mut part = value
            .checked_mul(unit)
            .filter(|v| *v <= MAX_NANOS)
            .ok_or_else(|| invalid(input))?;
        if frac > 0 {
            // Same float arithmetic as Go so fractional inputs round identically.
            let extra = (frac as f64 * (unit as f64 / scale)) as u64;
            part = part
                .checked_add(extra)
                .filter(|v| *v <= MAX_NANOS)
                .ok_or_else(|| invalid(input))?;
        }
        total = total
            .checked_add(part)
            .filter(|v| *v <= MAX_NANOS)
            .ok_or_else(|| invalid(input))?;
    }

    if negative && total != 0 {
        return Err(ConfigError::InvalidDuration(format!(
            "negative duration \"{input}\" is not allowed"
        )));
    }
    Ok(Duration::from_nanos(total))
}

/// Writes the low `prec` decimal digits of `v` as a fraction (trailing zeros dropped)
/// and returns the remaining high part, like Go's `fmtFrac`.
fn push_frac(out: &mut String, v: u128, prec: u32) -> u128 {
    let div = 10u128.pow(prec);
    let frac = v % div;
    if frac != 0 {
        let digits = format!("{:0width$}", frac, width = prec as usize);
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
    v / div
}

/// Formats a duration the way Go's `time.Duration.String()` does:
/// `"0s"`, `"100ms"`, `"1.5µs"`, `"20s"`, `"1m0s"`, `"1h2m3.5s"`.
pub fn format_go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    if nanos < u128::from(NS_PER_S) {
        // Sub-second values use the largest unit that keeps an integer part.
        let (prec, unit) = if nanos < u128::from(NS_PER_US) {
            return format!("{nanos}ns");
        } else if nanos < u128::from(NS_PER_MS) {
            (3, "\u{b5}s")
        } else {
            (6, "ms")
        };
        let mut frac = String::new();
        let whole = push_frac(&mut frac, nanos, prec);
        return format!("{whole}{frac}{unit}");
    }

    let mut frac = String::new();
    let secs_total = push_frac(&mut frac, nanos, 9);
    let secs = secs_total % 60;
    let mins_total = secs_total / 60;
    let mins = mins_total % 60;
    let hours = mins_total / 60;
    if hours > 0 {
        format!("{hours}h{mins}m{secs}{frac}s")
    } else if mins_total > 0 {
        format!("{mins}m{secs}{frac}s")
    } else {
        format!("{secs}{frac}s")
    }
}

/// A duration that (de)serializes as a Go duration string, like `metav1.Duration`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GoDuration(pub Duration);

impl GoDuration {
    pub const ZERO: GoDuration = GoDuration(Duration::ZERO);

    pub const fn from_secs(secs: u64) -> Self {
        GoDuration(Duration::from_secs(secs))
    }

    pub const fn from_millis(millis: u64) -> Self {
        GoDuration(Duration::from_millis(millis))
    }

    pub const fn from_mins(mins: u64) -> Self {
        GoDuration(Duration::from_secs(mins * 60))
    }

    pub const fn as_duration(self) -> Duration {
        self.0
    }

    pub fn is_zero(self) -> bool {
        self.0.is_zero()
    }
}

impl From<Duration> for GoDuration {
    fn from(d: Duration) -> Self {
        GoDuration(d)
    }
}

impl From<GoDuration> for Duration {
    fn from(d: GoDuration) -> Self {
        d.0
    }
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_go_duration(self.0))
    }
}

impl FromStr for GoDuration {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_go_duration(s).map(GoDuration)
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format_go_duration(self.0))
    }
}

struct GoDurationVisitor;

impl Visitor<'_> for GoDurationVisitor {
    type Value = GoDuration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // metav1.Duration only accepts strings; a bare number is an error upstream too.
        f.write_str("a Go duration string such as \"1m30s\"")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<GoDuration, E> {
        v.parse().map_err(E::custom)
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(GoDurationVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Duration {
        parse_go_duration(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn parses_go_forms() {
        assert_eq!(p("0"), Duration::ZERO);
        assert_eq!(p("0s"), Duration::ZERO);
        assert_eq!(p("-0s"), Duration::ZERO);
        assert_eq!(p("20s"), Duration::from_secs(20));
        assert_eq!(p("1m0s"), Duration::from_secs(60));
        assert_eq!(p("100ms"), Duration::from_millis(100));
        assert_eq!(p("1.5h"), Duration::from_secs(5400));
        assert_eq!(p("1h2m3.5s"), Duration::from_millis(3_723_500));
        assert_eq!(p("+5m"), Duration::from_secs(300));
        assert_eq!(p("1.s"), Duration::from_secs(1));
        assert_eq!(p(".5s"), Duration::from_millis(500));
        assert_eq!(p("3us"), Duration::from_micros(3));
        assert_eq!(p("3\u{b5}s"), Duration::from_micros(3));
        assert_eq!(p("3\u{3bc}s"), Duration::from_micros(3));
        assert_eq!(p("7ns"), Duration::from_nanos(7));
        assert_eq!(p("1h1h"), Duration::from_secs(7200));
    }

    #[test]
    fn rejects_bad_input_with_go_messages() {
        let msg = |s: &str| parse_go_duration(s).unwrap_err().to_string();
        assert_eq!(msg(""), "time: invalid duration \"\"");
        assert_eq!(msg("abc"), "time: invalid duration \"abc\"");
        assert_eq!(msg("."), "time: invalid duration \".\"");
        assert_eq!(msg(".s"), "time: invalid duration \".s\"");
        assert_eq!(msg("1"), "time: missing unit in duration \"1\"");
        assert_eq!(msg("10x"), "time: unknown unit \"x\" in duration \"10x\"");
        assert_eq!(msg("1d"), "time: unknown unit \"d\" in duration \"1d\"");
        assert_eq!(msg("-1s"), "negative duration \"-1s\" is not allowed");
        // Beyond Go's int64 nanoseconds.
        assert_eq!(msg("9999999999h"), "time: invalid duration \"9999999999h\"");
        assert!(parse_go_duration("2562047h47m16.854775807s").is_ok());
        assert!(parse_go_duration("2562047h47m16.854775808s").is_err());
    }

    #[test]
    fn formats_like_go() {
        let f = |d: Duration| format_go_duration(d);
        assert_eq!(f(Duration::ZERO), "0s");
        assert_eq!(f(Duration::from_secs(20)), "20s");
        assert_eq!(f(Duration::from_secs(60)), "1m0s");
        assert_eq!(f(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(f(Duration::from_secs(4 * 3600)), "4h0m0s");
        assert_eq!(f(Duration::from_millis(100)), "100ms");
        assert_eq!(f(Duration::from_millis(1500)), "1.5s");
        assert_eq!(f(Duration::from_millis(3_723_500)), "1h2m3.5s");
        assert_eq!(f(Duration::from_nanos(1500)), "1.5\u{b5}s");
        assert_eq!(f(Duration::from_nanos(999)), "999ns");
        assert_eq!(f(Duration::from_nanos(1_000_001)), "1.000001ms");
        assert_eq!(f(Duration::from_nanos(61_000_000_001)), "1m1.000000001s");
    }

    #[test]
    fn round_trips() {
        for s in [
            "0s",
            "1ns",
            "1.5\u{b5}s",
            "100ms",
            "1s",
            "20s",
            "1m0s",
            "1m30s",
            "2m0s",
            "5m0s",
            "1h0m0s",
            "4h0m0s",
            "1h2m3.5s",
            "26h3m4.000000005s",
        ] {
            assert_eq!(format_go_duration(p(s)), s, "round trip of {s}");
        }
        // Non-canonical inputs normalise to Go's canonical output.
        assert_eq!(format_go_duration(p("90s")), "1m30s");
        assert_eq!(format_go_duration(p("1.5h")), "1h30m0s");
        assert_eq!(format_go_duration(p("0")), "0s");
    }

    #[test]
    fn go_duration_serde() {
        let d: GoDuration = serde_json::from_str("\"1m30s\"").unwrap();
        assert_eq!(d, GoDuration::from_secs(90));
        assert_eq!(serde_json::to_string(&d).unwrap(), "\"1m30s\"");
        assert_eq!(
            serde_json::to_string(&GoDuration::default()).unwrap(),
            "\"0s\""
        );
        // Numbers are rejected, as metav1.Duration does.
        assert!(serde_json::from_str::<GoDuration>("30").is_err());
        let err = serde_json::from_str::<GoDuration>("\"5x\"").unwrap_err();
        assert!(err.to_string().contains("unknown unit \"x\""), "{err}");
        assert_eq!(
            "2m".parse::<GoDuration>().unwrap(),
            GoDuration::from_mins(2)
        );
        assert_eq!(GoDuration::from_millis(100).to_string(), "100ms");
    }
}
