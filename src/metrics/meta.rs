//! component-base's registry meta-metrics (`metrics/registry.go`):
//! `registered_metrics_total{deprecated_version,stability_level}`,
//! `disabled_metrics_total`, `hidden_metrics_total` (BETA) and
//! `cardinality_enforcement_unexpected_categorizations_total` (ALPHA), which
//! the legacy registry (`/metrics`) carries.
//!
//! Upstream increments `registered_metrics_total` in `lazyMetric.Create`
//! (`metric.go`), by the metric's stability level and deprecated version:
//! once per component-base metric registered with `Register` or
//! `MustRegister` in any of the process's registries (the meta-metrics
//! themselves included, and `/metrics/probes`' families), and once per
//! `NewGaugeFunc` (which calls `Create`). Custom collectors
//! (`CustomMustRegister`: their `Desc.create` counts nothing) and raw
//! Prometheus collectors (`RawMustRegister`: process) are not counted.
//! A metric hidden at registration (deprecated beyond the
//! `--show-hidden-metrics-for-version` window, or disabled) counts in
//! `hidden_metrics_total` instead; `SetDisabledMetric` (the components'
//! `--disabled-metrics`, which the kubelet does not have) in
//! `disabled_metrics_total`; the label allow-lists (`--allow-metric-labels`,
//! also not a kubelet flag) in the cardinality counter.
//!
//! rkubelet's values count its own registrations the same way: each family
//! of its `/metrics` registry that upstream registers as a component-base
//! metric, by the level its help carries, once its part registers it (the
//! gated families), and the two `/metrics/probes` families. No rkubelet
//! family is deprecated (so `deprecated_version=""`) or hidden, and there
//! is no disabling or allow-list, so the other three stay 0.

use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;

use super::Described;

/// component-base's stability levels, in the order client_golang sorts
/// their label values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Level {
    Alpha,
    Beta,
    Internal,
    Stable,
}

const LEVELS: [Level; 4] = [Level::Alpha, Level::Beta, Level::Internal, Level::Stable];

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Alpha => "ALPHA",
            Level::Beta => "BETA",
            Level::Internal => "INTERNAL",
            Level::Stable => "STABLE",
        }
    }

    /// The level `annotateStabilityLevel` put in front of a help text.
    pub(super) fn of_help(help: &str) -> Option<Level> {
        let rest = help.strip_prefix('[')?;
        let (level, _) = rest.split_once("] ")?;
        LEVELS.into_iter().find(|l| l.as_str() == level)
    }
}

/// Families of rkubelet's `/metrics` that upstream exposes through custom
/// collectors: the volume stats collector (`collectors/volume_stats.go`,
/// health included, registered in its own list), the log metrics collector
/// (in its own collector here), the volume manager's total volumes and the
/// credential provider config info (likewise), and DRA's claims-in-use
/// collector (`cm/dra/claiminfo.go`).
const CUSTOM_COLLECTED: &[&str] = &[
    "kubelet_volume_stats_capacity_bytes",
    "kubelet_volume_stats_available_bytes",
    "kubelet_volume_stats_used_bytes",
    "kubelet_volume_stats_inodes",
    "kubelet_volume_stats_inodes_free",
    "kubelet_volume_stats_inodes_used",
    "dra_resource_claims_in_use",
];

const REGISTERED_HELP: &str =
    beta!("The count of registered metrics broken by stability level and deprecation version.");
const DISABLED_HELP: &str = beta!("The count of disabled metrics.");
const HIDDEN_HELP: &str = beta!("The count of hidden metrics.");
const CARDINALITY_HELP: &str =
    alpha!("The count of unexpected categorizations during cardinality enforcement.");

/// One registration: counted while `gate` is on (always without one).
#[derive(Debug, Clone, Copy)]
pub(super) struct Registration {
    gate: Option<&'static AtomicBool>,
    level: Level,
}

/// The registrations a list of families makes, gated as the list is.
pub(super) fn registrations(
    list: &[Described],
    gate: Option<&'static AtomicBool>,
) -> Vec<Registration> {
    helps(list.iter().map(|d| (d.0, d.1)), gate)
}

/// The same from (name, help) pairs.
pub(super) fn helps<'a>(
    list: impl IntoIterator<Item = (&'a str, &'a str)>,
    gate: Option<&'static AtomicBool>,
) -> Vec<Registration> {
    list.into_iter()
        .filter(|(name, _)| !CUSTOM_COLLECTED.contains(name))
        .filter_map(|(_, help)| Level::of_help(help))
        .map(|level| Registration { gate, level })
        .collect()
}

/// Registrations every rkubelet makes besides its lists: the four
/// meta-metrics, the `/metrics/probes` registry's three families
/// (`prober_probe_total` BETA and `prober_probe_duration_seconds` ALPHA, as
/// `prober/mod.rs` describes them, and `process_start_time_seconds`
/// ALPHA) and the `/metrics/slis` registry's three (`kubernetes_healthcheck`
/// and `kubernetes_healthchecks_total` STABLE, `process_start_time_seconds`
/// again: `RegisterProcessStartTime` counts at each registration).
pub(super) fn own() -> Vec<Registration> {
    let mut v = helps(
        [
            ("registered_metrics_total", REGISTERED_HELP),
            ("disabled_metrics_total", DISABLED_HELP),
            ("hidden_metrics_total", HIDDEN_HELP),
            (
                "cardinality_enforcement_unexpected_categorizations_total",
                CARDINALITY_HELP,
            ),
        ],
        None,
    );
    v.extend(
        [
            Level::Beta,
            Level::Alpha,
            Level::Alpha,
            Level::Stable,
            Level::Stable,
            Level::Alpha,
        ]
        .map(|level| Registration { gate: None, level }),
    );
    v
}

/// Counts by level of the registrations made so far.
pub(super) fn counts(regs: &[Registration]) -> [u64; 4] {
    let mut n = [0u64; 4];
    for r in regs {
        if r.gate.is_none_or(|g| g.load(Ordering::Relaxed)) {
            n[r.level as usize] += 1;
        }
    }
    n
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RegisteredLabels {
    deprecated_version: &'static str,
    stability_level: &'static str,
}

/// The four families, computed at each scrape from the table built with
/// the registry.
#[derive(Debug)]
pub(super) struct MetaMetrics(pub(super) Vec<Registration>);

impl Collector for MetaMetrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let n = counts(&self.0);
        let mut m = enc.encode_descriptor(
            "registered_metrics",
            REGISTERED_HELP,
            None,
            MetricType::Counter,
        )?;
        for level in LEVELS {
            // A vector's series appear with their first increment.
            if n[level as usize] > 0 {
                let l = RegisteredLabels {
                    deprecated_version: "",
                    stability_level: level.as_str(),
                };
                ConstCounter::new(n[level as usize]).encode(m.encode_family(&l)?)?;
            }
        }
        for (name, help) in [
            ("disabled_metrics", DISABLED_HELP),
            ("hidden_metrics", HIDDEN_HELP),
            (
                "cardinality_enforcement_unexpected_categorizations",
                CARDINALITY_HELP,
            ),
        ] {
            ConstCounter::new(0u64).encode(enc.encode_descriptor(
                name,
                help,
                None,
                MetricType::Counter,
            )?)?;
        }
        Ok(())
    }
}
