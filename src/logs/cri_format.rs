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
        let timestamp = std::str::from_utf8(ts).ok()?.parse().ok();
        timestamp?;
        Some(LogLine {
            timestamp,
            stream,
            partial,
            content,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
