//! The CRI log format: `<RFC3339Nano time> <stdout|stderr> <P|F> <content>`
//! per line, `P` marking a fragment of a longer line (upstream's
//! `pkg/kubelet/kuberuntime/logs` parseCRILog).

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

#[derive(Debug)]
pub struct LogLine<'a> {
    pub timestamp: Option<k8s_openapi::jiff::Timestamp>,
    /// The time as the runtime wrote it (with its offset).
    pub raw_time: &'a str,
    pub stream: Stream,
    /// A fragment: the line goes on in the next entry.
    pub partial: bool,
    pub content: &'a [u8],
}

impl<'a> LogLine<'a> {
    /// One line without its newline; `None` when it is not in the format
    /// (upstream skips such lines too).
    pub fn parse(raw: &'a [u8]) -> Option<Self> {
        let mut parts = raw.splitn(4, |b| *b == b' ');
        let ts = parts.next()?;
        let stream = match parts.next()? {
            b"stdout" => Stream::Stdout,
            b"stderr" => Stream::Stderr,
            _ => return None,
        };
        // Old runtimes wrote no tag: the rest is the content, a full line.
        let rest = parts.next()?;
        let (partial, content) = match rest {
            b"P" => (true, parts.next().unwrap_or_default()),
            b"F" => (false, parts.next().unwrap_or_default()),
            _ => {
                let start = raw.len() - rest.len() - parts.next().map_or(0, |c| c.len() + 1);
                (false, &raw[start..])
            }
        };
        let raw_time = std::str::from_utf8(ts).ok()?;
        let timestamp = raw_time.parse().ok();
        timestamp?;
        Some(LogLine {
            timestamp,
            raw_time,
            stream,
            partial,
            content,
        })
    }
}

impl LogLine<'_> {
    /// The time as `--timestamps` shows it: upstream formats the parsed
    /// time as RFC3339NanoFixed (nine fraction digits, trailing zeros
    /// kept) in the offset the runtime wrote, `Z` for UTC.
    pub fn fixed_time(&self) -> String {
        let raw = self.raw_time.as_bytes();
        // `YYYY-MM-DDTHH:MM:SS`, then an optional fraction, then the offset.
        let shaped = raw.len() > 19
            && raw[10] == b'T'
            && raw[..19]
                .iter()
                .enumerate()
                .all(|(i, b)| matches!(i, 4 | 7 | 10 | 13 | 16) || b.is_ascii_digit());
        let Some(ts) = self.timestamp.filter(|_| shaped) else {
            return self.timestamp.map(utc_fixed).unwrap_or_default();
        };
        let rest = &self.raw_time[19..];
        let (frac, offset) = match rest.strip_prefix('.') {
            Some(f) => {
                let digits = f.bytes().take_while(u8::is_ascii_digit).count();
                (&f[..digits], &f[digits..])
            }
            None => ("", rest),
        };
        let offset = match offset {
            "z" | "Z" | "+00:00" | "-00:00" => "Z",
            o if o.len() == 6 && (o.starts_with('+') || o.starts_with('-')) => o,
            _ => return utc_fixed(ts),
        };
        // Go parses at most nine digits and rounds nothing: cut, then pad.
        let frac = &frac[..frac.len().min(9)];
        format!("{}.{frac:0<9}{offset}", &self.raw_time[..19])
    }
}

/// `t` as RFC3339NanoFixed in UTC.
fn utc_fixed(t: k8s_openapi::jiff::Timestamp) -> String {
    let ns = u64::try_from(t.as_nanosecond()).unwrap_or(0);
    crate::source::format_timestamp(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--timestamps` as upstream's logWriter writes them: always nine
    /// fraction digits, in the offset of the log line.
    #[test]
    fn times_are_shown_fixed_width_in_their_own_offset() {
        let t = |raw: &str| {
            let line = format!("{raw} stdout F x");
            LogLine::parse(line.as_bytes()).unwrap().fixed_time()
        };
        assert_eq!(t("2026-11-23T09:00:02Z"), "2026-11-23T09:00:02.000000000Z");
        assert_eq!(
            t("2026-11-23T09:00:02.5Z"),
            "2026-11-23T09:00:02.500000000Z"
        );
        assert_eq!(
            t("2016-10-06T00:17:09.669794202Z"),
            "2016-10-06T00:17:09.669794202Z"
        );
        assert_eq!(
            t("2026-11-23T10:00:02.12+01:00"),
            "2026-11-23T10:00:02.120000000+01:00"
        );
        assert_eq!(
            t("2026-11-23T09:00:02+00:00"),
            "2026-11-23T09:00:02.000000000Z"
        );
    }

    #[test]
    fn parses_full_and_partial_lines() {
        let l = LogLine::parse(b"2016-10-06T00:17:09.669794202Z stdout F log content 1").unwrap();
        assert_eq!(l.stream, Stream::Stdout);
        assert!(!l.partial);
        assert_eq!(l.content, b"log content 1");
        let l = LogLine::parse(b"2016-10-06T00:17:09.669794203Z stderr P part").unwrap();
        assert!(l.partial);
        assert_eq!(l.stream, Stream::Stderr);
        assert_eq!(l.content, b"part");
        let l = LogLine::parse(b"2016-10-06T00:17:09.669794203Z stdout F ").unwrap();
        assert_eq!(l.content, b"");
        assert!(LogLine::parse(b"garbage").is_none());
        assert!(LogLine::parse(b"notatime stdout F x").is_none());
    }
}
