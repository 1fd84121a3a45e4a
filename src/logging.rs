//! Logging: klog's `-v` verbosity on tracing's levels, changeable while
//! running, as upstream's `logging.verbosity` (applied once the config file
//! is read, the flag overriding it) and `PUT /debug/flags/v`
//! (component-base `logs.GlogSetter`) are.
//!
//! Levels: 0-1 info, 2-4 debug, 5+ trace for rkubelet's own events;
//! libraries (h2, hyper, tonic) only warn below 6, since their debug
//! output drowns ours.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use tracing_subscriber::filter::Targets;
use tracing_subscriber::{reload, Registry};

static VERBOSITY: AtomicU32 = AtomicU32::new(0);

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
                .with_target(false)
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
