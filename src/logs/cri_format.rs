//! The CRI log format: `<RFC3339Nano time> <stdout|stderr> <P|F> <content>`
//! per line, `P` marking a fragment of a longer line (upstream's
//! `pkg/kubelet/kuberuntime/logs` parseCRILog), and Docker's json-file
//! lines, which upstream reads too.

use std::borrow::Cow;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

#[derive(Debug)]
pub struct LogLine<'a> {
    pub timestamp: Option<k8s_openapi::jiff::Timestamp>,
    /// The time as the runtime wrote it (with its offset).
    pub raw_time: Cow<'a, str>,
    pub stream: Stream,
    /// A fragment: the line goes on in the next entry.
    pub partial: bool,
    /// Without the newline that ends a whole line.
    pub content: Cow<'a, [u8]>,
}

/// The two formats upstream's ReadLogs reads; which one a file is in is
/// decided by its first line (getParseFunc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The CRI format, as containerd and CRI-O write it.
    Cri,
    /// Docker's json-file lines (`{"log":…,"stream":…,"time":…}`), as
    /// cri-dockerd leaves them.
    DockerJson,
}

impl Format {
    /// The format `first` is in: CRI, then Docker JSON, as upstream tries.
    pub fn detect(first: &[u8]) -> Option<Format> {
        [Format::Cri, Format::DockerJson]
            .into_iter()
            .find(|f| f.parse(first).is_some())
    }

    /// One line without its newline; `None` when it is not in the format
    /// (upstream skips such lines).
    pub fn parse(self, raw: &[u8]) -> Option<LogLine<'_>> {
        match self {
            Format::Cri => LogLine::parse(raw),
            Format::DockerJson => LogLine::parse_docker(raw),
        }
    }
}

impl<'a> LogLine<'a> {
    /// One CRI line without its newline, as upstream's parseCRILog: the
    /// time, the stream, a tag (`P`, or `P:…`, marks a fragment; anything
    /// else a whole line), then the content.
    pub fn parse(raw: &'a [u8]) -> Option<Self> {
        let mut parts = raw.splitn(4, |b| *b == b' ');
        let ts = parts.next()?;
        let stream = match parts.next()? {
            b"stdout" => Stream::Stdout,
            b"stderr" => Stream::Stderr,
            _ => return None,
        };
        let tag = parts.next()?;
        let content = parts.next()?;
        let partial = tag.split(|b| *b == b':').next() == Some(b"P");
        let raw_time = std::str::from_utf8(ts).ok()?;
        let timestamp = Some(raw_time.parse().ok()?);
        Some(LogLine {
            timestamp,
            raw_time: Cow::Borrowed(raw_time),
            stream,
            partial,
            content: Cow::Borrowed(content),
        })
    }

    /// One Docker json-file line (upstream's parseDockerJSONLog): its
    /// `log` carries its own newline, so one without is a fragment.
    pub fn parse_docker(raw: &[u8]) -> Option<LogLine<'static>> {
        #[derive(serde::Deserialize)]
        struct Entry {
            #[serde(default)]
            log: String,
            #[serde(default)]
            stream: String,
            #[serde(default)]
            time: String,
        }
        let e: Entry = serde_json::from_slice(raw).ok()?;
        let stream = match e.stream.as_str() {
            "stdout" => Stream::Stdout,
            "stderr" => Stream::Stderr,
            _ => return None,
        };
        let mut content = e.log.into_bytes();
        let partial = content.last() != Some(&b'\n');
        if !partial {
            content.pop();
        }
        Some(LogLine {
            timestamp: e.time.parse().ok(),
            raw_time: Cow::Owned(e.time),
            stream,
            partial,
            content: Cow::Owned(content),
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
        assert_eq!(&*l.content, b"log content 1");
        let l = LogLine::parse(b"2016-10-06T00:17:09.669794203Z stderr P part").unwrap();
        assert!(l.partial);
        assert_eq!(l.stream, Stream::Stderr);
        assert_eq!(&*l.content, b"part");
        let l = LogLine::parse(b"2016-10-06T00:17:09.669794203Z stdout F ").unwrap();
        assert_eq!(&*l.content, b"");
        // A tag with attributes (`P:…`), as upstream keeps it forward
        // compatible; the tag is the third field whatever it says.
        let l = LogLine::parse(b"2016-10-06T00:17:09.669794203Z stdout P:x part").unwrap();
        assert!(l.partial);
        let l = LogLine::parse(b"2016-10-06T00:17:09.669794203Z stdout hello world").unwrap();
        assert_eq!((&*l.content, l.partial), (&b"world"[..], false));
        assert!(LogLine::parse(b"2016-10-06T00:17:09.669794203Z stdout F").is_none());
        assert!(LogLine::parse(b"garbage").is_none());
        assert!(LogLine::parse(b"notatime stdout F x").is_none());
    }

    /// Docker json-file lines (cri-dockerd): the format is told by the
    /// first line; `log` without a newline is a fragment.
    #[test]
    fn reads_docker_json_lines() {
        let whole = br#"{"log":"hello \"you\"\n","stream":"stderr","time":"2016-10-06T00:17:09.669794202Z"}"#;
        assert_eq!(Format::detect(whole), Some(Format::DockerJson));
        let l = Format::DockerJson.parse(whole).unwrap();
        assert_eq!(&*l.content, br#"hello "you""#);
        assert_eq!((l.stream, l.partial), (Stream::Stderr, false));
        assert_eq!(l.fixed_time(), "2016-10-06T00:17:09.669794202Z");
        let part = br#"{"log":"par","stream":"stdout","time":"2016-10-06T00:17:09Z"}"#;
        assert!(Format::DockerJson.parse(part).unwrap().partial);
        assert_eq!(
            Format::detect(b"2016-10-06T00:17:09.669794202Z stdout F x"),
            Some(Format::Cri)
        );
        assert_eq!(Format::detect(b"plain text"), None);
        assert!(Format::Cri.parse(whole).is_none());
    }
}
