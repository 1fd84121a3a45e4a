//! `/metrics/slis`: component-base's health-check SLIs
//! (`metrics/prometheus/slis`), which upstream's server installs beside
//! `/healthz` (`slis.SLIMetricsWithReset{}.Install` in
//! `pkg/kubelet/server/server.go`).
//!
//! Each `/healthz` request, on any port, records every check it ran (not
//! those `?exclude` left out) under `type="healthz"`, as the apiserver's
//! healthz handler does: `kubernetes_healthcheck{name,type}` is 1 when the
//! last result passed and 0 when it failed, and
//! `kubernetes_healthchecks_total{name,status,type}` counts results by
//! `success`/`error`. The registry also carries
//! `process_start_time_seconds` (`RegisterProcessStartTime`), the same
//! gauge `/metrics/probes` shows.
//!
//! `DELETE /metrics/slis` resets the registry (`HandlerWithReset`): the
//! two health families lose their series, and so does the start-time gauge,
//! which is one vector shared with `/metrics/probes` upstream, so it leaves
//! both endpoints until a restart.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

const HEALTHCHECK_HELP: &str = stable!("This metric records the result of a single healthcheck.");
const HEALTHCHECKS_TOTAL_HELP: &str =
    stable!("This metric records the results of all healthcheck.");
pub(super) const START_TIME_HELP: &str =
    alpha!("Start time of the process since unix epoch in seconds.");

/// The SLI registry's state, shared by every server of the process.
#[derive(Clone, Default)]
pub struct Slis(Arc<Mutex<State>>);

#[derive(Default)]
struct State {
    /// (check name, type) → its results.
    checks: BTreeMap<(String, &'static str), Results>,
    /// The start-time gauge lost its series to a reset.
    start_time_reset: bool,
}

#[derive(Default)]
struct Results {
    last_ok: bool,
    success: u64,
    error: u64,
}

impl std::fmt::Debug for Slis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Slis")
    }
}

impl Slis {
    /// Records one result of check `name` run by a `kind` handler
    /// (`slis.ObserveHealthcheck`).
    pub fn observe(&self, name: &str, kind: &'static str, ok: bool) {
        let mut s = self.0.lock();
        let r = s.checks.entry((name.to_string(), kind)).or_default();
        r.last_ok = ok;
        if ok {
            r.success += 1;
        } else {
            r.error += 1;
        }
    }

    /// `DELETE /metrics/slis`: every resettable metric of the registry
    /// loses its series.
    pub fn reset(&self) {
        let mut s = self.0.lock();
        s.checks.clear();
        s.start_time_reset = true;
    }

    /// The process start time while the shared gauge has its series.
    pub fn start_time(&self) -> Option<f64> {
        (!self.0.lock().start_time_reset).then(super::process::start_time)?
    }

    /// The registry's text in upstream's form.
    pub fn text(&self) -> String {
        render(Collected(self.clone()))
    }

    /// `process_start_time_seconds` alone, for `/metrics/probes` (empty
    /// after a reset).
    pub fn start_time_text(&self) -> String {
        render(StartTime(self.start_time()))
    }
}

fn render(c: impl Collector) -> String {
    let mut reg = Registry::default();
    reg.register_collector(Box::new(c));
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
    super::to_prometheus_text(&out)
}

#[derive(Debug)]
struct StartTime(Option<f64>);

impl Collector for StartTime {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        match self.0 {
            Some(t) => encode_start_time(&mut enc, t),
            None => Ok(()),
        }
    }
}

#[derive(Debug)]
struct Collected(Slis);

impl Collector for Collected {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let start = self.0.start_time();
        let s = self.0 .0.lock();
        // client_golang leaves out families without series, sorts families
        // by name and series by their label values (names in order).
        if !s.checks.is_empty() {
            let mut g = enc.encode_descriptor(
                "kubernetes_healthcheck",
                HEALTHCHECK_HELP,
                None,
                MetricType::Gauge,
            )?;
            for ((name, kind), r) in &s.checks {
                let l = [("name", name.as_str()), ("type", kind)];
                ConstGauge::new(if r.last_ok { 1i64 } else { 0 }).encode(g.encode_family(&l)?)?;
            }
            let mut c = enc.encode_descriptor(
                "kubernetes_healthchecks",
                HEALTHCHECKS_TOTAL_HELP,
                None,
                MetricType::Counter,
            )?;
            for ((name, kind), r) in &s.checks {
                for (status, n) in [("error", r.error), ("success", r.success)] {
                    if n > 0 {
                        let l = [("name", name.as_str()), ("status", status), ("type", kind)];
                        ConstCounter::new(n).encode(c.encode_family(&l)?)?;
                    }
                }
            }
        }
        drop(s);
        StartTime(start).encode(enc)
    }
}

/// `process_start_time_seconds` as `RegisterProcessStartTime` registers it
/// (a component-base gauge, so its help carries the level).
fn encode_start_time(enc: &mut DescriptorEncoder, t: f64) -> std::fmt::Result {
    ConstGauge::new(t).encode(enc.encode_descriptor(
        "process_start_time_seconds",
        START_TIME_HELP,
        None,
        MetricType::Gauge,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_show_as_upstreams_healthcheck_families_until_a_reset() {
        let s = Slis::default();
        let t = s.text();
        assert!(!t.contains("kubernetes_health"), "{t}");
        assert!(
            t.contains("# HELP process_start_time_seconds [ALPHA] Start time of the process since unix epoch in seconds.\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds "),
            "{t}"
        );
        s.observe("ping", "healthz", true);
        s.observe("syncloop", "healthz", true);
        s.observe("syncloop", "healthz", false);
        s.observe("ping", "healthz", true);
        let t = s.text();
        let want = "\
# HELP kubernetes_healthcheck [STABLE] This metric records the result of a single healthcheck.
# TYPE kubernetes_healthcheck gauge
kubernetes_healthcheck{name=\"ping\",type=\"healthz\"} 1
kubernetes_healthcheck{name=\"syncloop\",type=\"healthz\"} 0
# HELP kubernetes_healthchecks_total [STABLE] This metric records the results of all healthcheck.
# TYPE kubernetes_healthchecks_total counter
kubernetes_healthchecks_total{name=\"ping\",status=\"success\",type=\"healthz\"} 2
kubernetes_healthchecks_total{name=\"syncloop\",status=\"error\",type=\"healthz\"} 1
kubernetes_healthchecks_total{name=\"syncloop\",status=\"success\",type=\"healthz\"} 1
# HELP process_start_time_seconds ";
        assert!(t.starts_with(want), "{t}");
        s.reset();
        assert_eq!(s.text(), "");
        assert_eq!(s.start_time(), None);
        // Results after a reset count from zero.
        s.observe("ping", "healthz", true);
        assert!(s
            .text()
            .contains("{name=\"ping\",status=\"success\",type=\"healthz\"} 1\n"));
    }
}
