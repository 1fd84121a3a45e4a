//! The certificate manager's and volume manager's `/metrics` families
//! (issue 8).
//!
//! Certificates (`pkg/kubelet/certificate/kubelet.go`,
//! `cmd/kubelet/app/server.go`, client-go's `certificate_manager.go`):
//! the client certificate's TTL gauge and renewal-error counter, registered
//! in cluster mode with `rotateCertificates`; the serving certificate's TTL
//! gauge, renewal-error counter and rotation histogram, registered with
//! `serverTLSBootstrap`. The TTL is computed at scrape, as upstream's
//! GaugeFunc: whole seconds until notAfter (negative once expired), +Inf
//! with no certificate. Each failed renewal attempt counts one error; each
//! renewal that replaces a certificate observes how long the old one had
//! lived (now less its notBefore).
//!
//! Volumes (`pkg/kubelet/volumemanager/metrics/metrics.go`,
//! `pkg/volume/util/metrics.go`, `volumemanager/cache/
//! desired_state_of_world.go`): `volume_manager_total_volumes{plugin_name,
//! state}` counted at scrape from the volume manager's desired and actual
//! states (no series for a zero count, as upstream's collector),
//! `storage_operation_duration_seconds` around each operation rkubelet
//! does under upstream's operation name (`operationexecutor/
//! operation_generator.go`, `volume_linux.go`): `volume_mount` and
//! `volume_unmount` (a CSI volume's unmount is its NodeUnpublish and
//! directory), `map_volume`, `unmap_volume` and `unmap_device` (the last
//! pod's unmapping removes the global map path) for raw block volumes,
//! `unmount_device` (a CSI NodeUnstage and its global directory),
//! `verify_controller_attached_volume` (an attachable CSI volume checked
//! against the Node), `volume_fs_resize` (an in-use expansion the claim
//! asked for) and `volume_fsgroup_recursive_apply` (each fsGroup walk),
//! `csi_operations_seconds` around each call to a CSI driver's node
//! service, `volume_operation_total_seconds{operation_name=
//! "overall_volume_mount"}` from a volume's mount request to its
//! successful set-up (operation_generator.go; the request time renewed at
//! each set-up of a remounting plugin's volume, as desired_state_of_world
//! does), and, registered with no series as rkubelet never feeds them, the
//! SELinux mount gauges (rkubelet mounts nothing with an SELinux context). The volume manager's
//! reconstruction counters (`reconstruct_volume_operations_total`,
//! `..._errors_total`, `force_cleaned_failed_volume_operations_total`,
//! `..._errors_total`) are plain counters, so shown, at 0: rkubelet
//! rebuilds its state from the pod specs at start and reconstructs no
//! volume from the mounts it finds.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;

use super::{add, Described, HistFamily};

/// `certificateRotationAge`'s buckets (kubelet.go): a minute to four years.
pub const CERT_ROTATION_BUCKETS: [f64; 10] = [
    60.0,
    3600.0,
    14400.0,
    86400.0,
    604800.0,
    2592000.0,
    7776000.0,
    15552000.0,
    31104000.0,
    124416000.0,
];

/// The storage operation histograms' buckets (pkg/volume/util/metrics.go).
pub const STORAGE_OPERATION_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

fn storage_histogram() -> Histogram {
    Histogram::new(STORAGE_OPERATION_BUCKETS)
}

/// Label names sorted, as client_golang exposes them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StorageOperationLabels {
    pub migrated: &'static str,
    pub operation_name: &'static str,
    pub status: &'static str,
    pub volume_plugin: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginOperationLabels {
    pub operation_name: String,
    pub plugin_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CsiOperationLabels {
    pub driver_name: String,
    pub grpc_status_code: String,
    pub method_name: String,
    pub migrated: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AccessModeLabel {
    pub access_mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AccessModePluginLabels {
    pub access_mode: String,
    pub volume_plugin: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TotalVolumesLabels {
    pub plugin_name: String,
    pub state: &'static str,
}

/// One certificate manager's figures.
pub struct CertFigures {
    /// Whether upstream would have registered this manager's families.
    registered: AtomicBool,
    /// notAfter (Unix seconds) of the certificate in use; `i64::MIN` when
    /// there is none.
    not_after: AtomicI64,
    pub renew_errors: Counter,
}

impl CertFigures {
    fn new() -> Self {
        CertFigures {
            registered: AtomicBool::new(false),
            not_after: AtomicI64::new(i64::MIN),
            renew_errors: Counter::default(),
        }
    }

    /// Upstream's GaugeFunc at `now` (Unix seconds): whole seconds left,
    /// +Inf without a certificate.
    pub fn ttl_at(&self, now: f64) -> f64 {
        match self.not_after.load(Ordering::Relaxed) {
            i64::MIN => f64::INFINITY,
            t => (t as f64 - now).trunc(),
        }
    }
}

pub struct CertVolMetrics {
    pub client: CertFigures,
    pub server: CertFigures,
    pub server_rotation: Histogram,
    pub storage_operation_duration: HistFamily<StorageOperationLabels>,
    pub volume_operation_total_seconds: HistFamily<PluginOperationLabels>,
    pub csi_operations: HistFamily<CsiOperationLabels>,
    /// container_errors, container_warnings, pod_context_mismatch_errors,
    /// pod_context_mismatch_warnings.
    pub selinux_by_mode: [Family<AccessModeLabel, Gauge>; 4],
    /// volume_context_mismatch_errors, volume_context_mismatch_warnings,
    /// volumes_admitted.
    pub selinux_by_plugin: [Family<AccessModePluginLabels, Gauge>; 3],
    /// reconstruct_volume_operations, reconstruct_volume_operations_errors,
    /// force_cleaned_failed_volume_operations,
    /// force_cleaned_failed_volume_operation_errors.
    pub reconstruction: [Counter; 4],
}

pub static CERTVOL: LazyLock<CertVolMetrics> = LazyLock::new(|| CertVolMetrics {
    client: CertFigures::new(),
    server: CertFigures::new(),
    server_rotation: Histogram::new(CERT_ROTATION_BUCKETS),
    storage_operation_duration: Family::new_with_constructor(storage_histogram),
    volume_operation_total_seconds: Family::new_with_constructor(storage_histogram),
    csi_operations: Family::new_with_constructor(storage_histogram),
    selinux_by_mode: Default::default(),
    selinux_by_plugin: Default::default(),
    reconstruction: Default::default(),
});

const CLIENT_TTL_HELP: &str = alpha!("Gauge of the TTL (time-to-live) of the Kubelet's client certificate. The value is in seconds until certificate expiry (negative if already expired). If client certificate is invalid or unused, the value will be +INF.");
const SERVER_TTL_HELP: &str = alpha!("Gauge of the shortest TTL (time-to-live) of the Kubelet's serving certificate. The value is in seconds until certificate expiry (negative if already expired). If serving certificate is invalid or unused, the value will be +INF.");
const RENEW_ERRORS_HELP: &str = alpha!("Counter of certificate renewal errors.");
const ROTATION_HELP: &str = alpha!(
    "Histogram of the number of seconds the previous certificate lived before being rotated."
);

/// Each manager's families with the flag that registers them, for
/// `registered_metrics_total`: the TTL gauges are `NewGaugeFunc`s upstream,
/// counted at creation like the registered counters and histogram.
pub(super) fn registrations() -> [(&'static AtomicBool, Vec<(&'static str, &'static str)>); 2] {
    let c = &*CERTVOL;
    [
        (
            &c.client.registered,
            vec![
                (
                    "kubelet_certificate_manager_client_expiration_renew_errors",
                    RENEW_ERRORS_HELP,
                ),
                (
                    "kubelet_certificate_manager_client_ttl_seconds",
                    CLIENT_TTL_HELP,
                ),
            ],
        ),
        (
            &c.server.registered,
            vec![
                ("kubelet_server_expiration_renew_errors", RENEW_ERRORS_HELP),
                (
                    "kubelet_certificate_manager_server_rotation_seconds",
                    ROTATION_HELP,
                ),
                (
                    "kubelet_certificate_manager_server_ttl_seconds",
                    SERVER_TTL_HELP,
                ),
            ],
        ),
    ]
}

fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// The certificate families, each manager's once it is registered.
#[derive(Debug)]
pub(super) struct CertCollector;

fn encode_ttl(enc: &mut DescriptorEncoder, name: &str, help: &str, ttl: f64) -> std::fmt::Result {
    let m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(ttl).encode(m)
}

fn encode_metric(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    m: &(impl EncodeMetric + ?Sized),
) -> std::fmt::Result {
    m.encode(enc.encode_descriptor(name, help, None, m.metric_type())?)
}

impl Collector for CertCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let c = &*CERTVOL;
        let now = now_secs();
        if c.client.registered.load(Ordering::Relaxed) {
            encode_metric(
                &mut enc,
                "kubelet_certificate_manager_client_expiration_renew_errors",
                RENEW_ERRORS_HELP,
                &c.client.renew_errors,
            )?;
            encode_ttl(
                &mut enc,
                "kubelet_certificate_manager_client_ttl_seconds",
                CLIENT_TTL_HELP,
                c.client.ttl_at(now),
            )?;
        }
        if c.server.registered.load(Ordering::Relaxed) {
            encode_metric(
                &mut enc,
                "kubelet_server_expiration_renew_errors",
                RENEW_ERRORS_HELP,
                &c.server.renew_errors,
            )?;
            encode_metric(
                &mut enc,
                "kubelet_certificate_manager_server_rotation_seconds",
                ROTATION_HELP,
                &c.server_rotation,
            )?;
            encode_ttl(
                &mut enc,
                "kubelet_certificate_manager_server_ttl_seconds",
                SERVER_TTL_HELP,
                c.server.ttl_at(now),
            )?;
        }
        Ok(())
    }
}

// ------------------------------------------------------------ certificates

/// Which certificate manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cert {
    Client,
    Server,
}

fn figures(which: Cert) -> &'static CertFigures {
    match which {
        Cert::Client => &CERTVOL.client,
        Cert::Server => &CERTVOL.server,
    }
}

/// The manager starts: its families are exposed from now on (upstream
/// registers them when it builds the manager).
pub fn register_certificate_manager(which: Cert) {
    figures(which).registered.store(true, Ordering::Relaxed);
}

/// The certificate in use now has this notAfter (Unix seconds); `None`
/// when there is none (the TTL shows +Inf).
pub fn set_certificate_not_after(which: Cert, not_after: Option<i64>) {
    figures(which)
        .not_after
        .store(not_after.unwrap_or(i64::MIN), Ordering::Relaxed);
}

/// One failed renewal attempt (upstream counts each failed step of
/// rotateCerts: key, CSR, wait, store).
pub fn certificate_renew_failed(which: Cert) {
    figures(which).renew_errors.inc();
}

/// A renewal replaced a certificate valid from `old_not_before` (Unix
/// seconds): the serving manager observes how long it lived (the client
/// manager has no such histogram upstream).
pub fn certificate_rotated(which: Cert, old_not_before: Option<i64>, now: f64) {
    if let (Cert::Server, Some(nb)) = (which, old_not_before) {
        CERTVOL.server_rotation.observe(now - nb as f64);
    }
}

/// The notAfter of the first certificate in a PEM file, read off the async
/// threads; `None` when missing or unreadable.
pub async fn not_after_of(path: std::path::PathBuf) -> Option<i64> {
    let pem = tokio::fs::read(path).await.ok()?;
    crate::certificate::not_after(&pem).ok()
}

// ------------------------------------------------------------ volumes

/// Upstream's status label values.
pub const STATUS_SUCCESS: &str = "success";
pub const STATUS_FAIL: &str = "fail-unknown";

/// One storage operation (upstream's OperationCompleteHook): observed
/// whatever the outcome, with `status` success or fail-unknown; rkubelet
/// migrates no in-tree plugin to CSI, so `migrated` is "false".
pub fn storage_operation(plugin: &str, operation: &'static str, took: Duration, ok: bool) {
    CERTVOL
        .storage_operation_duration
        .get_or_create(&StorageOperationLabels {
            migrated: "false",
            operation_name: operation,
            status: if ok { STATUS_SUCCESS } else { STATUS_FAIL },
            volume_plugin: plugin.to_string(),
        })
        .observe(took.as_secs_f64());
}

/// An operation's end-to-end time (upstream's RecordOperationLatencyMetric
/// into `volume_operation_total_seconds{plugin_name,operation_name}`).
pub fn volume_operation_total(plugin: &str, operation: &str, took: Duration) {
    CERTVOL
        .volume_operation_total_seconds
        .get_or_create(&PluginOperationLabels {
            operation_name: operation.to_string(),
            plugin_name: plugin.to_string(),
        })
        .observe(took.as_secs_f64());
}

/// CSI driver endpoint → name, as registered (upstream's csiClient knows
/// its driver; rkubelet's node service client its endpoint).
static CSI_DRIVERS: LazyLock<Mutex<std::collections::HashMap<String, String>>> =
    LazyLock::new(Default::default);

/// A CSI driver registered at `endpoint`.
pub fn csi_driver_endpoint(endpoint: &str, driver: &str) {
    CSI_DRIVERS
        .lock()
        .insert(endpoint.to_string(), driver.to_string());
}

/// One call to a CSI driver's node service (upstream's
/// RecordMetricsInterceptor): the full gRPC method name, the call's gRPC
/// code as Go names it (a deadline rkubelet enforces is DeadlineExceeded,
/// as the context's would be), `migrated` "false" (no in-tree migration).
pub fn csi_operation(endpoint: &str, method: &'static str, code: tonic::Code, took: Duration) {
    let driver = CSI_DRIVERS
        .lock()
        .get(endpoint)
        .cloned()
        .unwrap_or_default();
    CERTVOL
        .csi_operations
        .get_or_create(&CsiOperationLabels {
            driver_name: driver,
            grpc_status_code: super::grpc_code_name(code).to_string(),
            method_name: method.to_string(),
            migrated: "false".into(),
        })
        .observe(took.as_secs_f64());
}

/// What the volume manager reports at each scrape: one entry per (pod,
/// volume) of each state, by full plugin name.
pub type VolumeCounts = Vec<(String, &'static str)>;
/// A volume manager's counting function; `None` once the manager is gone.
pub type VolumeSource = Box<dyn Fn() -> Option<VolumeCounts> + Send + Sync>;

/// The volume managers' counting functions (upstream's Register, once per
/// process: one manager outside tests). Sources whose manager is gone are
/// dropped at the next scrape.
static VOLUME_SOURCES: Mutex<Vec<VolumeSource>> = Mutex::new(Vec::new());

pub const STATE_DESIRED: &str = "desired_state_of_world";
pub const STATE_ACTUAL: &str = "actual_state_of_world";

/// A volume manager starts: its states are counted at each scrape.
pub fn add_volume_source(f: VolumeSource) {
    VOLUME_SOURCES.lock().push(f);
}

fn volume_entries() -> VolumeCounts {
    let mut out = Vec::new();
    VOLUME_SOURCES.lock().retain(|f| match f() {
        Some(v) => {
            out.extend(v);
            true
        }
        None => false,
    });
    out
}

/// `volume_manager_total_volumes`: counts per (plugin, state), only those
/// above zero (upstream's collector emits what it counted).
pub fn total_volumes(entries: &[(String, &'static str)]) -> Vec<(TotalVolumesLabels, i64)> {
    let mut out: Vec<(TotalVolumesLabels, i64)> = Vec::new();
    for (plugin, state) in entries {
        match out
            .iter_mut()
            .find(|(l, _)| l.state == *state && l.plugin_name == *plugin)
        {
            Some(e) => e.1 += 1,
            None => out.push((
                TotalVolumesLabels {
                    plugin_name: plugin.clone(),
                    state,
                },
                1,
            )),
        }
    }
    out
}

/// The volume manager's total volumes, computed as each scrape encodes.
#[derive(Debug)]
pub(super) struct TotalVolumes;

impl Collector for TotalVolumes {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let entries = volume_entries();
        let mut m = enc.encode_descriptor(
            "volume_manager_total_volumes",
            alpha!("Number of volumes in Volume Manager"),
            None,
            MetricType::Gauge,
        )?;
        for (l, n) in total_volumes(&entries) {
            ConstGauge::new(n).encode(m.encode_family(&l)?)?;
        }
        Ok(())
    }
}

/// The registered families with a fixed description.
pub(super) fn described() -> Vec<Described> {
    let c = &*CERTVOL;
    let mut v: Vec<Described> = Vec::new();
    add(
        &mut v,
        "storage_operation_duration_seconds",
        alpha!("Storage operation duration"),
        c.storage_operation_duration.clone(),
    );
    add(
        &mut v,
        "volume_operation_total_seconds",
        alpha!("Storage operation end to end duration in seconds"),
        c.volume_operation_total_seconds.clone(),
    );
    add(
        &mut v,
        "csi_operations_seconds",
        alpha!("Container Storage Interface operation duration with gRPC error code status total"),
        c.csi_operations.clone(),
    );
    let [ce, cw, pe, pw] = &c.selinux_by_mode;
    for (name, help, f) in [
        (
            "volume_manager_selinux_container_errors_total",
            alpha!("Number of errors when kubelet cannot compute SELinux context for a container. Kubelet can't start such a Pod then and it will retry, therefore value of this metric may not represent the actual nr. of containers."),
            ce,
        ),
        (
            "volume_manager_selinux_container_warnings_total",
            alpha!("Number of errors when kubelet cannot compute SELinux context for a container that are ignored. They will become real errors when SELinuxMountReadWriteOncePod feature is expanded to all volume access modes."),
            cw,
        ),
        (
            "volume_manager_selinux_pod_context_mismatch_errors_total",
            alpha!("Number of errors when a Pod defines different SELinux contexts for its containers that use the same volume. Kubelet can't start such a Pod then and it will retry, therefore value of this metric may not represent the actual nr. of Pods."),
            pe,
        ),
        (
            "volume_manager_selinux_pod_context_mismatch_warnings_total",
            alpha!("Number of errors when a Pod defines different SELinux contexts for its containers that use the same volume. They are not errors yet, but they will become real errors when SELinuxMountReadWriteOncePod feature is expanded to all volume access modes."),
            pw,
        ),
    ] {
        add(&mut v, name, help, f.clone());
    }
    let [ve, vw, va] = &c.selinux_by_plugin;
    for (name, help, f) in [
        (
            "volume_manager_selinux_volume_context_mismatch_errors_total",
            alpha!("Number of errors when a Pod uses a volume that is already mounted with a different SELinux context than the Pod needs. Kubelet can't start such a Pod then and it will retry, therefore value of this metric may not represent the actual nr. of Pods."),
            ve,
        ),
        (
            "volume_manager_selinux_volume_context_mismatch_warnings_total",
            alpha!("Number of errors when a Pod uses a volume that is already mounted with a different SELinux context than the Pod needs. They are not errors yet, but they will become real errors when SELinuxMountReadWriteOncePod feature is expanded to all volume access modes."),
            vw,
        ),
        (
            "volume_manager_selinux_volumes_admitted_total",
            alpha!("Number of volumes whose SELinux context was fine and will be mounted with mount -o context option."),
            va,
        ),
    ] {
        add(&mut v, name, help, f.clone());
    }
    // volumemanager/metrics (help as the 1.34 metrics reference lists it).
    let [rec, rec_err, forced, forced_err] = &c.reconstruction;
    for (name, help, f) in [
        (
            "reconstruct_volume_operations",
            alpha!("The number of volumes that were attempted to be reconstructed from the operating system during kubelet startup. This includes both successful and failed reconstruction."),
            rec,
        ),
        (
            "reconstruct_volume_operations_errors",
            alpha!("The number of volumes that failed reconstruction from the operating system during kubelet startup."),
            rec_err,
        ),
        (
            "force_cleaned_failed_volume_operations",
            alpha!("The number of volumes that were force cleaned after their reconstruction failed during kubelet startup. This includes both successful and failed cleanups."),
            forced,
        ),
        (
            "force_cleaned_failed_volume_operation_errors",
            alpha!("The number of volumes that failed force cleanup after their reconstruction failed during kubelet startup."),
            forced_err,
        ),
    ] {
        add(&mut v, name, help, f.clone());
    }
    v
}

/// How many `operation` observations `plugin` has with `status` (tests).
#[cfg(test)]
pub fn storage_operation_count(plugin: &str, operation: &str, status: &str) -> u64 {
    let mut r = prometheus_client::registry::Registry::default();
    r.register("s", "", CERTVOL.storage_operation_duration.clone());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &r).unwrap_or_default();
    let want = format!(
        "s_count{{migrated=\"false\",operation_name=\"{operation}\",status=\"{status}\",volume_plugin=\"{plugin}\"}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&want)?.parse().ok())
        .unwrap_or(0)
}

/// How many `operation` end-to-end times `plugin` has (tests).
#[cfg(test)]
pub fn volume_operation_total_count(plugin: &str, operation: &str) -> u64 {
    let mut r = prometheus_client::registry::Registry::default();
    r.register("t", "", CERTVOL.volume_operation_total_seconds.clone());
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &r).unwrap_or_default();
    let want = format!("t_count{{operation_name=\"{operation}\",plugin_name=\"{plugin}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&want)?.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ttl_is_whole_seconds_left_and_inf_without_a_certificate() {
        let c = CertFigures::new();
        assert_eq!(c.ttl_at(1000.0), f64::INFINITY);
        c.not_after.store(2000, Ordering::Relaxed);
        assert_eq!(c.ttl_at(1000.4), 999.0);
        assert_eq!(c.ttl_at(2500.0), -500.0);
    }
}
