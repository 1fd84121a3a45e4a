//! Logging: klog's `-v` verbosity on tracing's levels, changeable while
//! running, as upstream's `logging.verbosity` (applied once the config file
//! is read, the flag overriding it) and `PUT /debug/flags/v`
//! (component-base `logs.GlogSetter`) are.
//!
//! Levels: 0-1 info, 2-4 debug, 5+ trace for rkubelet's own events;
//! libraries (h2, hyper, tonic) only warn below 6, since their debug
//! output drowns ours.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::OnceLock;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::{self, FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{reload, Registry};

static VERBOSITY: AtomicU32 = AtomicU32::new(0);

/// `logging.format: json` (`--logging-format=json`) is in force.
static JSON: AtomicBool = AtomicBool::new(false);

/// Switches the subscriber `init` installed between text and upstream's
/// JSON lines (`logging.format`, applied once flags and file are merged).
pub fn set_json(on: bool) {
    JSON.store(on, Ordering::Relaxed);
}

/// The event format: tracing's text, or one JSON object per line as
/// component-base's JSON logger writes them (`ts` in seconds since the
/// epoch, `caller`, `msg`, then `v` for anything below an error, then the
/// event's fields; an `error` field is named `err`, as klog's ErrorS
/// names it).
struct Switch(format::Format);

impl<S, N> FormatEvent<S, N> for Switch
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        if !JSON.load(Ordering::Relaxed) {
            return self.0.format_event(ctx, w, event);
        }
        // The fields of the spans the event is in (pod, container, ...),
        // as tracing's text shows them, then the event's own.
        let mut spans = String::new();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                if let Some(f) = ext.get::<tracing_subscriber::fmt::FormattedFields<N>>() {
                    if !f.is_empty() {
                        if !spans.is_empty() {
                            spans.push(' ');
                        }
                        spans.push_str(&strip_ansi(f));
                    }
                }
            }
        }
        writeln!(
            w,
            "{}",
            json_line(event, std::time::SystemTime::now(), &spans)
        )
    }
}

/// Text without its terminal colour codes (`ESC [ ... m`), which the span
/// fields carry when stderr is a terminal.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Collects an event's message and fields as JSON values.
#[derive(Default)]
struct Fields {
    msg: String,
    kv: Vec<(String, serde_json::Value)>,
}

impl Fields {
    fn put(&mut self, field: &Field, v: serde_json::Value) {
        let name = match field.name() {
            "message" => {
                self.msg = match v {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                };
                return;
            }
            "error" => "err",
            n => n,
        };
        self.kv.push((name.to_string(), v));
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, format!("{value:?}").into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, value.into());
    }
}

/// One event as upstream's JSON logger writes it.
fn json_line(event: &Event<'_>, now: std::time::SystemTime, spans: &str) -> String {
    let mut f = Fields::default();
    event.record(&mut f);
    let meta = event.metadata();
    let ts = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let file = meta.file().unwrap_or("");
    let caller = format!(
        "{}:{}",
        file.strip_prefix("src/").unwrap_or(file),
        meta.line().unwrap_or(0)
    );
    let q = |v: &serde_json::Value| serde_json::to_string(v).unwrap_or_default();
    let mut out = format!(
        "{{\"ts\":{ts:.6},\"caller\":{},\"msg\":{}",
        q(&caller.into()),
        q(&f.msg.into())
    );
    if *meta.level() != Level::ERROR {
        // klog's verbosity for tracing's levels (see `targets`).
        let v = match *meta.level() {
            Level::TRACE => 5,
            Level::DEBUG => 2,
            _ => 0,
        };
        let _ = write!(out, ",\"v\":{v}");
    }
    if !spans.is_empty() {
        let _ = write!(out, ",\"span\":{}", q(&spans.into()));
    }
    for (k, v) in &f.kv {
        let _ = write!(out, ",{}:{}", q(&k.as_str().into()), q(v));
    }
    out.push('}');
    out
}

/// Held by tests that change the process-wide verbosity.
#[cfg(test)]
pub(crate) static TEST_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
static FILTER: OnceLock<reload::Handle<Targets, Registry>> = OnceLock::new();

/// The filter for klog verbosity `v`.
fn targets(v: u32) -> Targets {
    let own = match v {
        0..=1 => tracing::Level::INFO,
        2..=4 => tracing::Level::DEBUG,
        _ => tracing::Level::TRACE,
    };
    let deps = if v >= 6 {
        tracing::Level::DEBUG
    } else {
        tracing::Level::WARN
    };
    Targets::new()
        .with_target("rkubelet", own)
        .with_default(deps)
}

/// Installs the process's subscriber (stderr, colours on a terminal) at
/// verbosity `v`. A second call does nothing.
pub fn init(v: u32) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let (filter, handle) = reload::Layer::new(targets(v));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let installed = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(ansi)
                .event_format(Switch(format::format().with_target(false).with_ansi(ansi)))
                .with_filter(filter),
        )
        .try_init();
    if installed.is_ok() {
        let _ = FILTER.set(handle);
        VERBOSITY.store(v, Ordering::Relaxed);
    }
}

/// The verbosity in force.
pub fn verbosity() -> u32 {
    VERBOSITY.load(Ordering::Relaxed)
}

/// Changes the verbosity of the subscriber `init` installed (a no-op
/// without one, as in tests).
pub fn set_verbosity(v: u32) {
    if let Some(h) = FILTER.get() {
        if let Err(e) = h.reload(targets(v)) {
            tracing::warn!(error = %e, "changing the log verbosity");
            return;
        }
    }
    VERBOSITY.store(v, Ordering::Relaxed);
}

/// `PUT /debug/flags/v`'s setter (`logs.GlogSetter`): the body must be a
/// decimal verbosity, taken as Go's `strconv.ParseUint(val, 10, 32)` and
/// klog's `Level.Set` (an int32) take it, and is answered as they answer.
pub fn glog_setter(val: &str) -> Result<String, String> {
    let quoted = crate::volume::payload::go_quote(val);
    if val.is_empty() || !val.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "strconv.ParseUint: parsing {quoted}: invalid syntax"
        ));
    }
    let Ok(v) = val.parse::<u32>() else {
        return Err(format!(
            "strconv.ParseUint: parsing {quoted}: value out of range"
        ));
    };
    if i32::try_from(v).is_err() {
        return Err(format!(
            "failed set klog.logging.verbosity {val}: strconv.ParseInt: parsing {quoted}: value out of range"
        ));
    }
    set_verbosity(v);
    tracing::info!(verbosity = v, "log verbosity changed");
    Ok(format!("successfully set klog.logging.verbosity to {val}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setter_takes_what_glog_setter_takes_and_says_what_it_says() {
        let _g = TEST_LOCK.lock();
        assert_eq!(
            glog_setter("4"),
            Ok("successfully set klog.logging.verbosity to 4".into())
        );
        assert_eq!(verbosity(), 4);
        assert_eq!(
            glog_setter("04"),
            Ok("successfully set klog.logging.verbosity to 04".into())
        );
        for (val, err) in [
            ("", "strconv.ParseUint: parsing \"\": invalid syntax"),
            ("4\n", "strconv.ParseUint: parsing \"4\\n\": invalid syntax"),
            ("-1", "strconv.ParseUint: parsing \"-1\": invalid syntax"),
            ("+3", "strconv.ParseUint: parsing \"+3\": invalid syntax"),
            (
                "4294967296",
                "strconv.ParseUint: parsing \"4294967296\": value out of range",
            ),
            (
                "2147483648",
                "failed set klog.logging.verbosity 2147483648: strconv.ParseInt: parsing \"2147483648\": value out of range",
            ),
        ] {
            assert_eq!(glog_setter(val), Err(err.to_string()), "{val:?}");
        }
        // A refused value leaves the verbosity as it was.
        assert_eq!(verbosity(), 4);
        set_verbosity(0);
    }

    #[test]
    fn json_lines_are_shaped_as_upstreams_json_logger() {
        use tracing_subscriber::layer::SubscriberExt;
        // Capture the lines the formatter writes.
        #[derive(Clone, Default)]
        struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let _g = TEST_LOCK.lock();
        let buf = Buf::default();
        let b2 = buf.clone();
        let sub = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .with_writer(move || b2.clone())
                .event_format(Switch(format::format())),
        );
        set_json(true);
        tracing::subscriber::with_default(sub, || {
            let span = tracing::info_span!("worker", pod = "web-1");
            let _e = span.enter();
            tracing::info!(container = "app", restarts = 3u64, "container started");
            tracing::error!(error = "boom", "sync failed");
        });
        set_json(false);
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        let info = &lines[0];
        assert!(info["ts"].as_f64().unwrap() > 1.6e9);
        assert!(info["caller"].as_str().unwrap().starts_with("logging.rs:"));
        assert_eq!(info["msg"], "container started");
        assert_eq!(info["v"], 0);
        assert_eq!(info["container"], "app");
        assert_eq!(info["restarts"], 3);
        assert_eq!(info["span"], "pod=\"web-1\"");
        // Errors carry no verbosity and name the error `err`.
        let err = &lines[1];
        assert_eq!(err["msg"], "sync failed");
        assert!(err.get("v").is_none());
        assert_eq!(err["err"], "boom");
        // Keys in upstream's order.
        assert!(text.starts_with("{\"ts\":"), "{text}");
    }

    #[test]
    fn levels_follow_klog_verbosity() {
        use tracing::Level;
        use tracing_subscriber::filter::Targets;
        let enabled = |t: &Targets, target: &str, l: Level| t.would_enable(target, &l);
        let t = targets(0);
        assert!(enabled(&t, "rkubelet::pleg", Level::INFO));
        assert!(!enabled(&t, "rkubelet::pleg", Level::DEBUG));
        assert!(!enabled(&t, "h2::codec", Level::INFO));
        let t = targets(4);
        assert!(enabled(&t, "rkubelet::pleg", Level::DEBUG));
        assert!(!enabled(&t, "rkubelet::pleg", Level::TRACE));
        let t = targets(6);
        assert!(enabled(&t, "rkubelet::pleg", Level::TRACE));
        assert!(enabled(&t, "h2::codec", Level::DEBUG));
    }
}
