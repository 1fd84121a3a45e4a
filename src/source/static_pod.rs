//! Static pod manifests: decode, default and validate one Pod per file, mirroring upstream's
//! pkg/kubelet/config/common.go (tryDecodeSinglePod, applyDefaults, getAPIReferences) and the
//! v1 Pod defaulting of pkg/apis/core/v1/defaults.go + zz_generated.defaults.go.

use std::collections::HashMap;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvFromSource, EnvVar, EphemeralContainer, HTTPGetAction,
    Lifecycle, LocalObjectReference, PodSecurityContext, PodSpec, PodStatus, Probe, Toleration,
    Volume,
};
use md5::{Digest, Md5};

use super::{
    format_timestamp, Pod, SourceError, CONFIG_FIRST_SEEN_ANNOTATION, CONFIG_HASH_ANNOTATION,
    CONFIG_SOURCE_ANNOTATION, FILE_SOURCE,
};

/// Manifests larger than this are refused (upstream maxConfigLength, 10 MiB).
pub const MAX_MANIFEST_BYTES: u64 = 10 << 20;

/// Reads, decodes and defaults the static pod in `path`; `now` becomes config.seen.
pub fn read_static_pod(path: &Path, node_name: &str, now: SystemTime) -> Result<Pod, SourceError> {
    let bytes = read_manifest(path)?;
    decode_static_pod_at(&bytes, path, node_name, now)
}

/// Reads a manifest file, refusing ones over `MAX_MANIFEST_BYTES`.
pub fn read_manifest(path: &Path) -> Result<Vec<u8>, SourceError> {
    let io_err = |source| SourceError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io_err)?;
    let mut bytes = Vec::new();
    file.take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io_err)?;
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(SourceError::TooLarge {
            path: path.to_path_buf(),
            limit: MAX_MANIFEST_BYTES,
        });
    }
    Ok(bytes)
}

/// Decodes a manifest read from `path` (named in errors and hashed into the UID), stamping
/// config.seen with the current time.
pub fn decode_static_pod(bytes: &[u8], path: &Path, node_name: &str) -> Result<Pod, SourceError> {
    decode_static_pod_at(bytes, path, node_name, SystemTime::now())
}

/// As `decode_static_pod`, with config.seen set to `now`.
pub fn decode_static_pod_at(
    bytes: &[u8],
    path: &Path,
    node_name: &str,
    now: SystemTime,
) -> Result<Pod, SourceError> {
    decode_static_pod_adopting(bytes, path, node_name, now, |_, _| None)
}

/// As `decode_static_pod_at`; a manifest without metadata.uid takes the UID
/// `adopt(namespace, full name)` returns, if any, instead of computing one.
pub fn decode_static_pod_adopting(
    bytes: &[u8],
    path: &Path,
    node_name: &str,
    now: SystemTime,
    adopt: impl FnOnce(&str, &str) -> Option<String>,
) -> Result<Pod, SourceError> {
    let pod = parse_pod(bytes, path)?;
    let origin = format!("file:{}", path.display());
    finish_static_pod(pod, path, &origin, node_name, now, adopt)
}

/// A pod of the HTTP source (`staticPodURL`): defaulted and validated as a
/// manifest file's, its UID hashed with `url:<url>` instead of the path,
/// as upstream's applyDefaults does for URLs.
pub fn http_static_pod(
    pod: Pod,
    url: &str,
    node_name: &str,
    now: SystemTime,
) -> Result<Pod, SourceError> {
    finish_static_pod(
        pod,
        Path::new(url),
        &format!("url:{url}"),
        node_name,
        now,
        |_, _| None,
    )
}

/// Decodes the body the HTTP source fetched: one Pod, else a PodList
/// (upstream's tryDecodeSinglePod, then tryDecodePodList).
pub fn parse_pods(bytes: &[u8], url: &str) -> Result<Vec<Pod>, SourceError> {
    let single = parse_pod(bytes, Path::new(url));
    let single_err = match single {
        Ok(p) => return Ok(vec![p]),
        Err(e) => e,
    };
    #[derive(serde::Deserialize)]
    struct PodList {
        kind: String,
        #[serde(rename = "apiVersion", default)]
        api_version: String,
        #[serde(default)]
        items: Vec<Pod>,
    }
    let list = crate::yaml::from_slice::<PodList>(bytes).and_then(|l| {
        // Upstream's decoder needs both, as for a single pod.
        if l.api_version != "v1" {
            Err(serde::de::Error::custom(format!(
                "apiVersion is {:?}, expected \"v1\"",
                l.api_version
            )))
        } else if l.kind == "PodList" {
            Ok(l.items)
        } else {
            Err(serde::de::Error::custom(format!(
                "kind is {:?}, expected \"PodList\"",
                l.kind
            )))
        }
    });
    match list {
        Ok(items) => Ok(items),
        Err(e) => Err(SourceError::Decode {
            path: url.into(),
            reason: clipped(&format_args!(
                "couldn't parse as single pod ({single_err}) or pod list ({e})"
            )),
        }),
    }
}

fn finish_static_pod(
    mut pod: Pod,
    path: &Path,
    origin: &str,
    node_name: &str,
    now: SystemTime,
    adopt: impl FnOnce(&str, &str) -> Option<String>,
) -> Result<Pod, SourceError> {
    if pod.metadata.name.as_deref().unwrap_or("").is_empty() {
        return Err(invalid(
            path,
            vec!["metadata.name: Required value".to_string()],
        ));
    }
    if pod.metadata.uid.as_deref().unwrap_or("").is_empty() {
        let ns = match pod.metadata.namespace.as_deref() {
            Some(ns) if !ns.is_empty() => ns,
            _ => "default",
        };
        let full = static_pod_name(pod.metadata.name.as_deref().unwrap_or(""), node_name);
        let uid = adopt(ns, &full).unwrap_or_else(|| pod_uid_for(&pod, node_name, origin));
        pod.metadata.uid = Some(uid);
    }
    apply_pod_defaults(&mut pod);
    apply_static_defaults(&mut pod, node_name, now, origin.starts_with("file:"));

    let errors = validate_pod(&pod);
    if !errors.is_empty() {
        return Err(invalid(path, errors));
    }
    let references = api_references(&pod);
    if !references.is_empty() {
        return Err(SourceError::ApiReferences {
            path: path.to_path_buf(),
            name: clip(pod.metadata.name.clone().unwrap_or_default()),
            references: clip(references.into_iter().collect::<Vec<_>>().join(", ")),
        });
    }
    tracing::debug!(
        pod = pod.metadata.name.as_deref().unwrap_or(""),
        namespace = pod.metadata.namespace.as_deref().unwrap_or(""),
        pod_uid = pod.metadata.uid.as_deref().unwrap_or(""),
        path = %path.display(),
        "decoded static pod"
    );
    Ok(pod)
}

fn invalid(path: &Path, errors: Vec<String>) -> SourceError {
    SourceError::Invalid {
        path: path.to_path_buf(),
        reason: clip(errors.join("; ")),
    }
}

/// Longest decode error kept: serde quotes the offending value whole, and a
/// multi-megabyte string must not become a multi-megabyte log line.
const MAX_ERROR_CHARS: usize = 512;

fn clip(reason: String) -> String {
    if reason.len() <= MAX_ERROR_CHARS {
        return reason;
    }
    // A fresh string: truncating in place would keep the megabytes allocated.
    clipped(&reason)
}

/// `value` formatted into at most `MAX_ERROR_CHARS` bytes, without ever
/// holding the whole text (serde's messages quote the offending value).
fn clipped(value: &dyn std::fmt::Display) -> String {
    struct Bounded(String, bool);
    impl std::fmt::Write for Bounded {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let room = MAX_ERROR_CHARS - self.0.len();
            if s.len() <= room {
                self.0.push_str(s);
                return Ok(());
            }
            let mut cut = room;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            self.0.push_str(&s[..cut]);
            self.1 = true;
            // Stops the formatter: nothing more is wanted.
            Err(std::fmt::Error)
        }
    }
    let mut out = Bounded(String::new(), false);
    let _ = std::fmt::write(&mut out, format_args!("{value}"));
    if out.1 {
        out.0.push_str("... (truncated)");
    }
    out.0.shrink_to_fit();
    out.0
}

/// YAML or JSON (JSON is YAML) holding exactly one `v1` `Pod`.
fn parse_pod(bytes: &[u8], path: &Path) -> Result<Pod, SourceError> {
    let decode_err = |reason: &dyn std::fmt::Display| SourceError::Decode {
        path: path.to_path_buf(),
        reason: clipped(reason),
    };
    // k8s-openapi rejects a wrong kind/apiVersion but accepts missing ones; upstream's
    // decoder needs both. Check them first with a struct that skips every other field,
    // so a hostile manifest is not held as a whole value tree besides its text.
    #[derive(serde::Deserialize)]
    struct TypeMeta {
        kind: Option<serde_json::Value>,
        #[serde(rename = "apiVersion")]
        api_version: Option<serde_json::Value>,
    }
    let meta: TypeMeta = crate::yaml::from_slice(bytes)
        .map_err(|e| decode_err(&format_args!("expected an object with kind Pod: {e}")))?;
    for (field, got, want) in [
        ("kind", meta.kind, "Pod"),
        ("apiVersion", meta.api_version, "v1"),
    ] {
        match got {
            Some(serde_json::Value::String(got)) if got == want => {}
            Some(got) => {
                return Err(decode_err(&format_args!(
                    "{field} is {got}, expected {want:?}"
                )))
            }
            None => return Err(decode_err(&format_args!("{field} is missing"))),
        }
    }
    // Decode the typed pod from the source text so errors carry line and column.
    crate::yaml::from_slice::<Pod>(bytes).map_err(|e| decode_err(&e))
}

/// The UID a static pod gets when its manifest has none: md5 hex over the pod's content,
/// then "host:<nodeName>" and "file:<path>", in upstream's order. Upstream hashes Go's
/// DeepHashObject dump of the defaulted pod, which cannot be reproduced byte for byte; this
/// hashes the canonical JSON of the pod as decoded (k8s-openapi serializes fields in a fixed
/// order and maps sorted), before any defaulting or annotation, so the UID depends only on
/// the manifest's content, the node and the path: stable across restarts and independent of
/// the config.seen time.
pub fn static_pod_uid(pod: &Pod, node_name: &str, path: &Path) -> String {
    pod_uid_for(pod, node_name, &format!("file:{}", path.display()))
}

/// As `static_pod_uid`, with the origin given (`file:<path>`, `url:<url>`).
/// As upstream's applyDefaults, only a file's pod is hashed with the node
/// name: a URL's pods get the same UID on every node that polls it.
fn pod_uid_for(pod: &Pod, node_name: &str, origin: &str) -> String {
    let mut hasher = Md5::new();
    hasher.update(serde_json::to_vec(pod).unwrap_or_default());
    if origin.starts_with("file:") {
        hasher.update(format!("host:{node_name}"));
    }
    hasher.update(origin);
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A static pod's name: the manifest's, suffixed with the node name.
fn static_pod_name(name: &str, node_name: &str) -> String {
    format!("{name}-{}", node_name.to_lowercase())
}

/// (namespace, full name) → (UID, sandbox creation time).
type RunningStatic = HashMap<(String, String), (String, SystemTime)>;

/// Static pods another kubelet (upstream, on a node being taken over) left
/// running, keyed by (namespace, full name), with their UID and the time
/// their sandbox was created.
///
/// Upstream names a manifest without metadata.uid by an MD5 over go-spew's
/// dump of the decoded Go struct, which cannot be reproduced outside Go;
/// rkubelet's own UID differs, so taking over a kubeadm control-plane node
/// would restart etcd and the API server. Instead, a uid-less manifest not
/// modified since the running sandbox of the same pod was created is that
/// pod: it takes the sandbox's UID. Each is claimed at most once; a
/// manifest edited since then gets its own UID and waits, by full name, for
/// the old pod to terminate.
#[derive(Debug, Default, Clone)]
pub struct Takeover(std::sync::Arc<parking_lot::Mutex<RunningStatic>>);

impl Takeover {
    pub fn new(
        running: impl IntoIterator<Item = ((String, String), (String, SystemTime))>,
    ) -> Self {
        Takeover(std::sync::Arc::new(parking_lot::Mutex::new(
            running.into_iter().collect(),
        )))
    }

    pub fn is_empty(&self) -> bool {
        self.0.lock().is_empty()
    }

    /// The UID of the running pod `namespace/name`, if the manifest (last
    /// modified at `mtime`) predates its sandbox.
    pub fn claim(&self, namespace: &str, name: &str, mtime: SystemTime) -> Option<String> {
        let mut running = self.0.lock();
        let key = (namespace.to_string(), name.to_string());
        let (_, created) = running.get(&key)?;
        if mtime > *created {
            return None;
        }
        running.remove(&key).map(|(uid, _)| uid)
    }
}

/// Upstream applyDefaults (the UID is set before this); `is_file`: a
/// manifest file's pod, which alone gets the NoExecute toleration.
fn apply_static_defaults(pod: &mut Pod, node_name: &str, now: SystemTime, is_file: bool) {
    let meta = &mut pod.metadata;
    let uid = meta.uid.clone().unwrap_or_default();
    // Unique among nodes once mirrored to the apiserver.
    meta.name = Some(static_pod_name(
        meta.name.as_deref().unwrap_or(""),
        node_name,
    ));
    if meta.namespace.as_deref().unwrap_or("").is_empty() {
        meta.namespace = Some("default".to_string());
    }
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(CONFIG_HASH_ANNOTATION.to_string(), uid);
    annotations.insert(
        CONFIG_FIRST_SEEN_ANNOTATION.to_string(),
        format_timestamp(now),
    );
    annotations.insert(
        CONFIG_SOURCE_ANNOTATION.to_string(),
        FILE_SOURCE.to_string(),
    );

    let spec = pod.spec.get_or_insert_with(Default::default);
    // Scheduled here; upstream leaves spec.hostname alone.
    spec.node_name = Some(node_name.to_string());
    // Pods from files tolerate every NoExecute taint so node problems
    // never evict them (upstream: `if isFile`; a URL's pods do not).
    if is_file {
        add_or_update_toleration(
            spec,
            Toleration {
                operator: Some("Exists".to_string()),
                effect: Some("NoExecute".to_string()),
                ..Default::default()
            },
        );
    }
    pod.status.get_or_insert_with(PodStatus::default).phase = Some("Pending".to_string());
}

/// Upstream helper.AddOrUpdateTolerationInPod: replaces a toleration with the same key,
/// effect, operator and value, else appends.
fn add_or_update_toleration(spec: &mut PodSpec, toleration: Toleration) {
    let same = |t: &Toleration| {
        t.key.as_deref().unwrap_or("") == toleration.key.as_deref().unwrap_or("")
            && t.effect.as_deref().unwrap_or("") == toleration.effect.as_deref().unwrap_or("")
            && t.operator.as_deref().unwrap_or("") == toleration.operator.as_deref().unwrap_or("")
            && t.value.as_deref().unwrap_or("") == toleration.value.as_deref().unwrap_or("")
    };
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    match tolerations.iter_mut().find(|t| same(t)) {
        Some(existing) => *existing = toleration,
        None => tolerations.push(toleration),
    }
}

fn set_if_empty(field: &mut Option<String>, value: &str) {
    if field.as_deref().unwrap_or("").is_empty() {
        *field = Some(value.to_string());
    }
}

fn set_if_zero(field: &mut Option<i32>, value: i32) {
    if field.unwrap_or(0) == 0 {
        *field = Some(value);
    }
}

/// The v1 Pod defaults the apiserver would apply (SetObjectDefaults_Pod). Not done: the
/// milli-scale rounding of resource quantities and the pod-level resources defaulting of
/// the PodLevelResources feature.
pub fn apply_pod_defaults(pod: &mut Pod) {
    let spec = pod.spec.get_or_insert_with(Default::default);

    // SetDefaults_Pod.
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        default_requests_from_limits(c);
    }
    if spec.enable_service_links.is_none() {
        spec.enable_service_links = Some(true);
    }
    if spec.host_network == Some(true) {
        for c in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            for p in c.ports.iter_mut().flatten() {
                if p.host_port.unwrap_or(0) == 0 {
                    p.host_port = Some(p.container_port);
                }
            }
        }
    }

    // SetDefaults_PodSpec.
    set_if_empty(&mut spec.dns_policy, "ClusterFirst");
    set_if_empty(&mut spec.restart_policy, "Always");
    if spec.security_context.is_none() {
        spec.security_context = Some(PodSecurityContext::default());
    }
    if spec.termination_grace_period_seconds.is_none() {
        spec.termination_grace_period_seconds = Some(30);
    }
    set_if_empty(&mut spec.scheduler_name, "default-scheduler");

    for v in spec.volumes.iter_mut().flatten() {
        default_volume(v);
    }
    for c in spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut())
    {
        default_container(c);
    }
    for c in spec.ephemeral_containers.iter_mut().flatten() {
        default_ephemeral_container(c);
    }
}

fn default_requests_from_limits(c: &mut Container) {
    let Some(resources) = c.resources.as_mut() else {
        return;
    };
    let Some(limits) = resources.limits.as_ref() else {
        return;
    };
    let requests = resources.requests.get_or_insert_with(BTreeMap::new);
    for (name, quantity) in limits {
        requests
            .entry(name.clone())
            .or_insert_with(|| quantity.clone());
    }
}

/// Always when the tag is "latest", or there is neither tag nor digest; else IfNotPresent
/// (upstream parsers.ParseImageName; an unparsable empty image counts as IfNotPresent).
pub fn default_pull_policy(image: &str) -> &'static str {
    if image.is_empty() {
        return "IfNotPresent";
    }
    let (name, digest) = match image.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (image, None),
    };
    // A ':' in the last path segment starts the tag; one before a '/' is a registry port.
    let last_segment = name.rsplit('/').next().unwrap_or(name);
    let tag = last_segment.split_once(':').map(|(_, tag)| tag);
    match (tag, digest) {
        (Some(tag), _) => {
            if tag == "latest" {
                "Always"
            } else {
                "IfNotPresent"
            }
        }
        (None, Some(_)) => "IfNotPresent",
        (None, None) => "Always",
    }
}

fn default_probe(probe: &mut Probe) {
    set_if_zero(&mut probe.timeout_seconds, 1);
    set_if_zero(&mut probe.period_seconds, 10);
    set_if_zero(&mut probe.success_threshold, 1);
    set_if_zero(&mut probe.failure_threshold, 3);
    if let Some(http) = probe.http_get.as_mut() {
        default_http_get(http);
    }
    if let Some(grpc) = probe.grpc.as_mut() {
        // Declarative default of GRPCAction.service.
        grpc.service.get_or_insert_with(String::new);
    }
}

fn default_http_get(http: &mut HTTPGetAction) {
    set_if_empty(&mut http.path, "/");
    set_if_empty(&mut http.scheme, "HTTP");
}

fn default_lifecycle(lifecycle: &mut Lifecycle) {
    for handler in [lifecycle.post_start.as_mut(), lifecycle.pre_stop.as_mut()]
        .into_iter()
        .flatten()
    {
        if let Some(http) = handler.http_get.as_mut() {
            default_http_get(http);
        }
    }
}

fn default_env(env: &mut [EnvVar]) {
    for var in env {
        if let Some(field_ref) = var.value_from.as_mut().and_then(|v| v.field_ref.as_mut()) {
            set_if_empty(&mut field_ref.api_version, "v1");
        }
    }
}

/// SetDefaults_Container plus the generated per-field container defaults; a macro because
/// `Container` and `EphemeralContainer` are distinct types with the same fields.
macro_rules! default_container_fields {
    ($c:expr) => {{
        let c = $c;
        if c.image_pull_policy.as_deref().unwrap_or("").is_empty() {
            let policy = default_pull_policy(c.image.as_deref().unwrap_or(""));
            c.image_pull_policy = Some(policy.to_string());
        }
        set_if_empty(&mut c.termination_message_path, "/dev/termination-log");
        set_if_empty(&mut c.termination_message_policy, "File");
        for p in c.ports.iter_mut().flatten() {
            set_if_empty(&mut p.protocol, "TCP");
        }
        default_env(c.env.as_deref_mut().unwrap_or_default());
        for probe in [
            c.liveness_probe.as_mut(),
            c.readiness_probe.as_mut(),
            c.startup_probe.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            default_probe(probe);
        }
        if let Some(lifecycle) = c.lifecycle.as_mut() {
            default_lifecycle(lifecycle);
        }
    }};
}

fn default_container(c: &mut Container) {
    default_container_fields!(c);
}

fn default_ephemeral_container(c: &mut EphemeralContainer) {
    default_container_fields!(c);
}

/// True when the volume names no source at all (upstream ptr.AllPtrFieldsNil).
fn volume_has_no_source(v: &Volume) -> bool {
    volume_source_count(v) == 0
}

/// How many volume sources are set: every serialized field but "name" is one.
fn volume_source_count(v: &Volume) -> usize {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::Object(fields)) => fields.keys().filter(|k| *k != "name").count(),
        _ => 0,
    }
}

fn default_volume(v: &mut Volume) {
    if volume_has_no_source(v) {
        v.empty_dir = Some(EmptyDirVolumeSource::default());
    }
    if let Some(image) = v.image.as_mut() {
        if image.pull_policy.as_deref().unwrap_or("").is_empty() {
            // Image volumes: only an explicit or implied "latest" tag pulls always.
            let policy = default_pull_policy(image.reference.as_deref().unwrap_or(""));
            image.pull_policy = Some(policy.to_string());
        }
    }
    if let Some(host_path) = v.host_path.as_mut() {
        // HostPathUnset: the field is set, to the empty string.
        host_path.type_.get_or_insert_with(String::new);
    }
    if let Some(secret) = v.secret.as_mut() {
        secret.default_mode.get_or_insert(0o644);
    }
    if let Some(config_map) = v.config_map.as_mut() {
        config_map.default_mode.get_or_insert(0o644);
    }
    if let Some(downward) = v.downward_api.as_mut() {
        downward.default_mode.get_or_insert(0o644);
        for item in downward.items.iter_mut().flatten() {
            if let Some(field_ref) = item.field_ref.as_mut() {
                set_if_empty(&mut field_ref.api_version, "v1");
            }
        }
    }
    if let Some(projected) = v.projected.as_mut() {
        projected.default_mode.get_or_insert(0o644);
        for source in projected.sources.iter_mut().flatten() {
            if let Some(downward) = source.downward_api.as_mut() {
                for item in downward.items.iter_mut().flatten() {
                    if let Some(field_ref) = item.field_ref.as_mut() {
                        set_if_empty(&mut field_ref.api_version, "v1");
                    }
                }
            }
            if let Some(token) = source.service_account_token.as_mut() {
                token.expiration_seconds.get_or_insert(3600);
            }
        }
    }
    // Declarative defaults of the in-tree volume plugins.
    if let Some(iscsi) = v.iscsi.as_mut() {
        set_if_empty(&mut iscsi.iscsi_interface, "default");
    }
    if let Some(rbd) = v.rbd.as_mut() {
        set_if_empty(&mut rbd.pool, "rbd");
        set_if_empty(&mut rbd.user, "admin");
        set_if_empty(&mut rbd.keyring, "/etc/ceph/keyring");
    }
    if let Some(azure) = v.azure_disk.as_mut() {
        set_if_empty(&mut azure.caching_mode, "ReadWrite");
        set_if_empty(&mut azure.fs_type, "ext4");
        azure.read_only.get_or_insert(false);
        set_if_empty(&mut azure.kind, "Shared");
    }
    if let Some(scale_io) = v.scale_io.as_mut() {
        set_if_empty(&mut scale_io.storage_mode, "ThinProvisioned");
        set_if_empty(&mut scale_io.fs_type, "xfs");
    }
}

/// A DNS-1123 label: at most 63 of [a-z0-9-], starting and ending alphanumeric.
pub fn is_dns1123_label(s: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && alnum(bytes[0])
        && alnum(bytes[bytes.len() - 1])
        && bytes.iter().all(|&c| alnum(c) || c == b'-')
}

/// A DNS-1123 subdomain: at most 253 characters of dot-separated labels.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            // Subdomain labels are not limited to 63 characters on their own.
            let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
            let b = label.as_bytes();
            !b.is_empty()
                && alnum(b[0])
                && alnum(b[b.len() - 1])
                && b.iter().all(|&c| alnum(c) || c == b'-')
        })
}

/// The subset of upstream ValidatePodCreate a static pod is held to: names, containers,
/// volumes, ports and the enumerated policies. Returns "field: problem" strings.
fn validate_pod(pod: &Pod) -> Vec<String> {
    let mut errors = Vec::new();
    let name = pod.metadata.name.as_deref().unwrap_or("");
    if !is_dns1123_subdomain(name) {
        errors.push(format!(
            "metadata.name: Invalid value: {name:?}: must be a lowercase RFC 1123 subdomain"
        ));
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("");
    if !is_dns1123_label(namespace) {
        errors.push(format!(
            "metadata.namespace: Invalid value: {namespace:?}: must be a lowercase RFC 1123 label"
        ));
    }
    let Some(spec) = pod.spec.as_ref() else {
        errors.push("spec.containers: Required value".to_string());
        return errors;
    };

    let mut volumes = BTreeSet::new();
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        let field = format!("spec.volumes[{i}]");
        if !is_dns1123_label(&v.name) {
            errors.push(format!(
                "{field}.name: Invalid value: {:?}: must be a lowercase RFC 1123 label",
                v.name
            ));
        } else if !volumes.insert(v.name.as_str()) {
            errors.push(format!("{field}.name: Duplicate value: {:?}", v.name));
        }
        if volume_source_count(v) > 1 {
            errors.push(format!("{field}: may not specify more than 1 volume type"));
        }
        if let Some(host_path) = v.host_path.as_ref() {
            if host_path.path.is_empty() {
                errors.push(format!("{field}.hostPath.path: Required value"));
            }
        }
    }

    if spec.containers.is_empty() {
        errors.push("spec.containers: Required value".to_string());
    }
    let mut names = BTreeSet::new();
    let groups: [(&str, Vec<&Container>); 2] = [
        (
            "spec.initContainers",
            spec.init_containers.iter().flatten().collect(),
        ),
        ("spec.containers", spec.containers.iter().collect()),
    ];
    for (group, containers) in groups {
        for (i, c) in containers.into_iter().enumerate() {
            validate_container(
                &format!("{group}[{i}]"),
                c,
                &volumes,
                &mut names,
                &mut errors,
            );
        }
    }
    for (i, c) in spec.ephemeral_containers.iter().flatten().enumerate() {
        let field = format!("spec.ephemeralContainers[{i}]");
        if !is_dns1123_label(&c.name) {
            errors.push(format!(
                "{field}.name: Invalid value: {:?}: must be a lowercase RFC 1123 label",
                c.name
            ));
        } else if !names.insert(c.name.clone()) {
            errors.push(format!("{field}.name: Duplicate value: {:?}", c.name));
        }
    }

    let check_enum =
        |errors: &mut Vec<String>, field: &str, value: Option<&str>, allowed: &[&str]| {
            if let Some(v) = value {
                if !allowed.contains(&v) {
                    errors.push(format!(
                        "{field}: Unsupported value: {v:?}: supported values: {}",
                        allowed.join(", ")
                    ));
                }
            }
        };
    check_enum(
        &mut errors,
        "spec.restartPolicy",
        spec.restart_policy.as_deref(),
        &["Always", "OnFailure", "Never"],
    );
    check_enum(
        &mut errors,
        "spec.dnsPolicy",
        spec.dns_policy.as_deref(),
        &["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"],
    );
    errors
}

fn validate_container(
    field: &str,
    c: &Container,
    volumes: &BTreeSet<&str>,
    names: &mut BTreeSet<String>,
    errors: &mut Vec<String>,
) {
    if c.name.is_empty() {
        errors.push(format!("{field}.name: Required value"));
    } else if !is_dns1123_label(&c.name) {
        errors.push(format!(
            "{field}.name: Invalid value: {:?}: must be a lowercase RFC 1123 label",
            c.name
        ));
    } else if !names.insert(c.name.clone()) {
        errors.push(format!("{field}.name: Duplicate value: {:?}", c.name));
    }
    let image = c.image.as_deref().unwrap_or("");
    if image.is_empty() {
        errors.push(format!("{field}.image: Required value"));
    } else if image.trim() != image {
        errors.push(format!(
            "{field}.image: Invalid value: {image:?}: must not have leading or trailing whitespace"
        ));
    }
    if let Some(policy) = c.image_pull_policy.as_deref() {
        if !["Always", "IfNotPresent", "Never"].contains(&policy) {
            errors.push(format!(
                "{field}.imagePullPolicy: Unsupported value: {policy:?}"
            ));
        }
    }
    if let Some(policy) = c.termination_message_policy.as_deref() {
        if !["File", "FallbackToLogsOnError"].contains(&policy) {
            errors.push(format!(
                "{field}.terminationMessagePolicy: Unsupported value: {policy:?}"
            ));
        }
    }
    for (j, p) in c.ports.iter().flatten().enumerate() {
        if !(1..=65535).contains(&p.container_port) {
            errors.push(format!(
                "{field}.ports[{j}].containerPort: Invalid value: {}: must be between 1 and 65535, inclusive",
                p.container_port
            ));
        }
        if let Some(host_port) = p.host_port.filter(|&h| h != 0) {
            if !(1..=65535).contains(&host_port) {
                errors.push(format!(
                    "{field}.ports[{j}].hostPort: Invalid value: {host_port}: must be between 1 and 65535, inclusive"
                ));
            }
        }
        if let Some(protocol) = p.protocol.as_deref() {
            if !["TCP", "UDP", "SCTP"].contains(&protocol) {
                errors.push(format!(
                    "{field}.ports[{j}].protocol: Unsupported value: {protocol:?}"
                ));
            }
        }
    }
    for (j, m) in c.volume_mounts.iter().flatten().enumerate() {
        if !volumes.contains(m.name.as_str()) {
            errors.push(format!(
                "{field}.volumeMounts[{j}].name: Not found: {:?}",
                m.name
            ));
        }
        if m.mount_path.is_empty() {
            errors.push(format!(
                "{field}.volumeMounts[{j}].mountPath: Required value"
            ));
        }
    }
}

/// Upstream getAPIReferences: static pods may not use the service account, secrets,
/// config maps or volume types that need the Kubernetes API.
fn api_references(pod: &Pod) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let Some(spec) = pod.spec.as_ref() else {
        return refs;
    };
    // The deprecated serviceAccount field converts into serviceAccountName.
    let service_account = spec
        .service_account_name
        .as_deref()
        .filter(|s| !s.is_empty())
        .or(spec.service_account.as_deref())
        .unwrap_or("");
    if !service_account.is_empty() {
        refs.insert(format!("ServiceAccount {service_account:?}"));
    }
    let mut named = |kind: &str, name: &str| {
        if !name.is_empty() {
            refs.insert(format!("{kind} {name:?}"));
        }
    };
    for r in spec.image_pull_secrets.iter().flatten() {
        named("Secret", &r.name);
    }
    let env_refs = |env: Option<&Vec<EnvVar>>, env_from: Option<&Vec<EnvFromSource>>| {
        let mut found = Vec::new();
        for from in env
            .into_iter()
            .flatten()
            .filter_map(|v| v.value_from.as_ref())
        {
            if let Some(s) = from.secret_key_ref.as_ref() {
                found.push(("Secret", s.name.clone()));
            }
            if let Some(c) = from.config_map_key_ref.as_ref() {
                found.push(("ConfigMap", c.name.clone()));
            }
        }
        for from in env_from.into_iter().flatten() {
            if let Some(s) = from.secret_ref.as_ref() {
                found.push(("Secret", s.name.clone()));
            }
            if let Some(c) = from.config_map_ref.as_ref() {
                found.push(("ConfigMap", c.name.clone()));
            }
        }
        found
    };
    let mut found = Vec::new();
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
    {
        found.extend(env_refs(c.env.as_ref(), c.env_from.as_ref()));
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        found.extend(env_refs(c.env.as_ref(), c.env_from.as_ref()));
    }
    for (kind, name) in found {
        named(kind, &name);
    }

    // Claims are API objects too (upstream's HasAPIObjectReference).
    for c in spec.resource_claims.iter().flatten() {
        named("ResourceClaim", &c.name);
    }
    for v in spec.volumes.iter().flatten() {
        // Secrets named by in-tree volume plugins.
        let local = |r: Option<&LocalObjectReference>| r.map(|r| r.name.clone());
        let plugin_secrets = [
            v.azure_file.as_ref().map(|s| s.secret_name.clone()),
            local(v.cephfs.as_ref().and_then(|s| s.secret_ref.as_ref())),
            local(v.cinder.as_ref().and_then(|s| s.secret_ref.as_ref())),
            local(v.flex_volume.as_ref().and_then(|s| s.secret_ref.as_ref())),
            local(v.rbd.as_ref().and_then(|s| s.secret_ref.as_ref())),
            v.scale_io.as_ref().map(|s| s.secret_ref.name.clone()),
            local(v.iscsi.as_ref().and_then(|s| s.secret_ref.as_ref())),
            local(v.storageos.as_ref().and_then(|s| s.secret_ref.as_ref())),
            local(
                v.csi
                    .as_ref()
                    .and_then(|s| s.node_publish_secret_ref.as_ref()),
            ),
            v.secret.as_ref().and_then(|s| s.secret_name.clone()),
        ];
        for name in plugin_secrets.into_iter().flatten() {
            named("Secret", &name);
        }
        if let Some(c) = v.config_map.as_ref() {
            named("ConfigMap", &c.name);
        }
        for source in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(s) = source.secret.as_ref() {
                named("Secret", &s.name);
            }
            if let Some(c) = source.config_map.as_ref() {
                named("ConfigMap", &c.name);
            }
        }
    }

    for v in spec.volumes.iter().flatten() {
        let name = &v.name;
        let api_free = v.aws_elastic_block_store.is_some()
            || v.azure_disk.is_some()
            || v.azure_file.is_some()
            || v.cephfs.is_some()
            || v.cinder.is_some()
            || v.downward_api.is_some()
            || v.empty_dir.is_some()
            || v.fc.is_some()
            || v.flex_volume.is_some()
            || v.flocker.is_some()
            || v.gce_persistent_disk.is_some()
            || v.git_repo.is_some()
            || v.host_path.is_some()
            || v.iscsi.is_some()
            || v.nfs.is_some()
            || v.photon_persistent_disk.is_some()
            || v.portworx_volume.is_some()
            || v.quobyte.is_some()
            || v.rbd.is_some()
            || v.scale_io.is_some()
            || v.storageos.is_some()
            || v.vsphere_volume.is_some();
        if api_free {
            continue;
        }
        if let Some(projected) = v.projected.as_ref() {
            for source in projected.sources.iter().flatten() {
                if source.config_map.is_some() {
                    refs.insert(format!("configMap projected volume {name:?}"));
                } else if source.secret.is_some() {
                    refs.insert(format!("secret projected volume {name:?}"));
                } else if source.service_account_token.is_some() {
                    refs.insert(format!("serviceAccountToken projected volume {name:?}"));
                } else if source.downward_api.is_none() {
                    refs.insert(format!("unknown source for projected volume {name:?}"));
                }
            }
        } else if v.config_map.is_some() {
            refs.insert(format!("ConfigMap volume {name:?}"));
        } else if v.csi.is_some() {
            refs.insert(format!("CSI volume {name:?}"));
        } else if v.ephemeral.is_some() {
            refs.insert(format!("Ephemeral volume {name:?}"));
        } else if v.persistent_volume_claim.is_some() {
            refs.insert(format!("PersistentVolumeClaim volume {name:?}"));
        } else if v.secret.is_some() {
            refs.insert(format!("Secret volume {name:?}"));
        } else if v.glusterfs.is_some() {
            // Its endpoints object is read from the API.
            refs.insert(format!("Endpoints (via glusterFS volume {name:?})"));
        } else {
            refs.insert(format!("unknown type for volume {name:?}"));
        }
    }
    refs
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::time::{Duration, UNIX_EPOCH};

    /// Manifests a hostile or careless user drops in: each is rejected with
    /// a short error, quickly, without blowing up memory.
    /// Upstream decodes manifests through sigs.k8s.io/yaml (go-yaml v2): a plain `0644` is
    /// octal, `yes` is true, a repeated key keeps its last value, and only the first
    /// document counts (a trailing `---`). libyaml through serde_yaml_ng refused the octal,
    /// the repeated key and the second document.
    #[test]
    fn manifests_read_yaml_scalars_and_repeated_keys_as_upstream() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers:\n  - name: c\n    image: old\n    image: busybox\n  securityContext: {runAsNonRoot: yes}\n  volumes:\n  - name: v\n    downwardAPI: {defaultMode: 0644}\n---\n";
        let pod = decode_static_pod(text.as_bytes(), Path::new("/m/web.yaml"), "node").unwrap();
        let spec = pod.spec.unwrap();
        assert_eq!(spec.containers[0].image.as_deref(), Some("busybox"));
        assert_eq!(spec.security_context.unwrap().run_as_non_root, Some(true));
        let dapi = spec.volumes.unwrap()[0].downward_api.clone().unwrap();
        assert_eq!(dapi.default_mode, Some(0o644));
    }

    #[test]
    fn hostile_manifests_are_rejected_cheaply_with_short_errors() {
        let p = Path::new("/m/x.yaml");
        let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            bomb.push_str(&format!(
                "{}: &{} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n",
                (b'a' + i) as char,
                (b'a' + i) as char,
                p = (b'a' + i - 1) as char
            ));
        }
        let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
        let deep_map = "a:\n".to_string()
            + &(1..3000)
                .map(|i| format!("{}a:\n", " ".repeat(i)))
                .collect::<String>();
        let huge = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {}\nspec:\n  containers: []\n",
            "x".repeat(5 << 20)
        );
        let huge_type = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers: \"{}\"\n",
            "y".repeat(5 << 20)
        );
        let dup =
            "apiVersion: v1\nkind: Pod\nkind: Pod\nmetadata: {name: d}\nspec: {containers: []}\n";
        let big_num = format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: n}}\nspec:\n  activeDeadlineSeconds: 1{}\n  containers: []\n", "0".repeat(400));
        let garbage: Vec<u8> = (0..100_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("alias bomb", bomb.into_bytes()),
            ("deep flow nesting", deep.into_bytes()),
            ("deep block nesting", deep_map.into_bytes()),
            ("5 MiB name", huge.into_bytes()),
            ("5 MiB string of the wrong type", huge_type.into_bytes()),
            ("duplicate key", dup.as_bytes().to_vec()),
            ("huge number", big_num.into_bytes()),
            ("binary garbage", garbage),
        ];
        for (what, bytes) in cases {
            let e = decode_static_pod(&bytes, p, "node").expect_err(what);
            let msg = e.to_string();
            assert!(msg.len() < 1024, "{what}: error of {} bytes", msg.len());
            // Nothing of a rejected manifest is kept: not even spare capacity.
            if let SourceError::Decode { reason, .. } | SourceError::Invalid { reason, .. } = &e {
                assert!(
                    reason.capacity() <= 1024,
                    "{what}: {} bytes held",
                    reason.capacity()
                );
            }
        }
    }

    #[test]
    fn clipped_errors_end_on_a_char_boundary_and_say_so() {
        let long = format!("{}é{}", "a".repeat(MAX_ERROR_CHARS - 1), "b".repeat(100));
        let c = clipped(&long);
        assert_eq!(
            c,
            format!("{}... (truncated)", "a".repeat(MAX_ERROR_CHARS - 1))
        );
        assert_eq!(clipped(&"short"), "short");
        assert_eq!(clip("x".repeat(10 << 20)).capacity(), MAX_ERROR_CHARS + 15);
        assert_eq!(
            clipped(&"y".repeat(10 << 20)).capacity(),
            MAX_ERROR_CHARS + 15
        );
    }

    const YAML: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: etcd
  namespace: kube-system
  labels:
    component: etcd
spec:
  hostNetwork: true
  volumes:
  - name: data
    hostPath:
      path: /var/lib/etcd
  - name: scratch
  containers:
  - name: etcd
    image: registry.k8s.io/etcd:3.5.9-0
    ports:
    - containerPort: 2379
    resources:
      limits:
        memory: 100Mi
    volumeMounts:
    - name: data
      mountPath: /var/lib/etcd
    livenessProbe:
      httpGet:
        port: 2381
        path: /health
  - name: sidecar
    image: busybox
"#;

    fn path() -> PathBuf {
        PathBuf::from("/etc/kubernetes/manifests/etcd.yaml")
    }

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn decode(text: &str) -> Result<Pod, SourceError> {
        decode_static_pod_at(text.as_bytes(), &path(), "Node-1", at(1_700_000_000))
    }

    #[test]
    fn names_uid_and_annotations() {
        let pod = decode(YAML).unwrap();
        let meta = &pod.metadata;
        assert_eq!(meta.name.as_deref(), Some("etcd-node-1"));
        assert_eq!(meta.namespace.as_deref(), Some("kube-system"));
        let uid = meta.uid.clone().unwrap();
        assert_eq!(uid.len(), 32);
        assert!(uid.chars().all(|c| c.is_ascii_hexdigit()));
        let ann = meta.annotations.as_ref().unwrap();
        assert_eq!(ann[CONFIG_HASH_ANNOTATION], uid);
        assert_eq!(ann[CONFIG_SOURCE_ANNOTATION], "file");
        assert_eq!(
            ann[CONFIG_FIRST_SEEN_ANNOTATION],
            "2023-11-14T22:13:20.000000000Z"
        );
        assert_eq!(meta.labels.as_ref().unwrap()["component"], "etcd");

        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("Node-1"));
        assert_eq!(spec.hostname, None);
        assert_eq!(
            spec.tolerations.as_deref().unwrap(),
            &[Toleration {
                operator: Some("Exists".to_string()),
                effect: Some("NoExecute".to_string()),
                ..Default::default()
            }]
        );
        assert_eq!(
            pod.status.as_ref().unwrap().phase.as_deref(),
            Some("Pending")
        );
    }

    #[test]
    fn default_namespace_and_existing_toleration_is_not_duplicated() {
        let text = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web"},
            "spec":{"tolerations":[{"operator":"Exists","effect":"NoExecute","tolerationSeconds":5},
                                   {"key":"k","operator":"Exists"}],
                    "containers":[{"name":"web","image":"nginx:1.25"}]}}"#;
        let pod = decode(text).unwrap();
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        let tolerations = pod.spec.unwrap().tolerations.unwrap();
        assert_eq!(tolerations.len(), 2);
        assert_eq!(tolerations[0].toleration_seconds, None);
        assert_eq!(tolerations[1].key.as_deref(), Some("k"));
    }

    #[test]
    fn api_defaults() {
        let pod = decode(YAML).unwrap();
        let spec = pod.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        assert_eq!(spec.scheduler_name.as_deref(), Some("default-scheduler"));
        assert_eq!(spec.security_context, Some(PodSecurityContext::default()));
        assert_eq!(spec.enable_service_links, Some(true));

        let volumes = spec.volumes.unwrap();
        assert_eq!(
            volumes[0].host_path.as_ref().unwrap().type_.as_deref(),
            Some("")
        );
        assert_eq!(volumes[1].empty_dir, Some(EmptyDirVolumeSource::default()));

        let etcd = &spec.containers[0];
        assert_eq!(etcd.image_pull_policy.as_deref(), Some("IfNotPresent"));
        assert_eq!(
            etcd.termination_message_path.as_deref(),
            Some("/dev/termination-log")
        );
        assert_eq!(etcd.termination_message_policy.as_deref(), Some("File"));
        let port = &etcd.ports.as_ref().unwrap()[0];
        assert_eq!(port.protocol.as_deref(), Some("TCP"));
        // hostNetwork: the host port follows the container port.
        assert_eq!(port.host_port, Some(2379));
        let resources = etcd.resources.as_ref().unwrap();
        assert_eq!(resources.requests, resources.limits);
        let probe = etcd.liveness_probe.as_ref().unwrap();
        assert_eq!(
            (
                probe.timeout_seconds,
                probe.period_seconds,
                probe.success_threshold,
                probe.failure_threshold
            ),
            (Some(1), Some(10), Some(1), Some(3))
        );
        let http = probe.http_get.as_ref().unwrap();
        assert_eq!(http.scheme.as_deref(), Some("HTTP"));
        assert_eq!(http.path.as_deref(), Some("/health"));
        assert_eq!(
            spec.containers[1].image_pull_policy.as_deref(),
            Some("Always")
        );
    }

    #[test]
    fn pull_policy_rules() {
        for (image, want) in [
            ("nginx", "Always"),
            ("nginx:latest", "Always"),
            ("nginx:1.25", "IfNotPresent"),
            ("localhost:5000/nginx", "Always"),
            ("localhost:5000/nginx:v1", "IfNotPresent"),
            ("nginx@sha256:abcd", "IfNotPresent"),
            ("nginx:latest@sha256:abcd", "Always"),
            ("", "IfNotPresent"),
        ] {
            assert_eq!(default_pull_policy(image), want, "{image}");
        }
    }

    #[test]
    fn volume_defaults() {
        let mut pod: Pod = serde_json::from_str(
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"v"},"spec":{
                "containers":[{"name":"c","image":"i"}],
                "volumes":[
                  {"name":"s","secret":{"secretName":"x"}},
                  {"name":"c","configMap":{"name":"y"}},
                  {"name":"d","downwardAPI":{"items":[{"path":"p","fieldRef":{"fieldPath":"metadata.name"}}]}},
                  {"name":"p","projected":{"sources":[{"serviceAccountToken":{"path":"t"}}]}}]}}"#,
        )
        .unwrap();
        apply_pod_defaults(&mut pod);
        let volumes = pod.spec.unwrap().volumes.unwrap();
        assert_eq!(volumes[0].secret.as_ref().unwrap().default_mode, Some(420));
        assert_eq!(
            volumes[1].config_map.as_ref().unwrap().default_mode,
            Some(420)
        );
        let downward = volumes[2].downward_api.as_ref().unwrap();
        assert_eq!(downward.default_mode, Some(420));
        assert_eq!(
            downward.items.as_ref().unwrap()[0]
                .field_ref
                .as_ref()
                .unwrap()
                .api_version
                .as_deref(),
            Some("v1")
        );
        let projected = volumes[3].projected.as_ref().unwrap();
        assert_eq!(projected.default_mode, Some(420));
        assert_eq!(
            projected.sources.as_ref().unwrap()[0]
                .service_account_token
                .as_ref()
                .unwrap()
                .expiration_seconds,
            Some(3600)
        );
    }

    #[test]
    fn json_and_yaml_decode_to_the_same_pod() {
        let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web"},
                       "spec":{"containers":[{"name":"web","image":"nginx:1.25"}]}}"#;
        let yaml = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - image: nginx:1.25\n    name: web\n";
        assert_eq!(decode(json).unwrap(), decode(yaml).unwrap());
    }

    #[test]
    fn uid_is_stable_and_depends_on_node_path_and_content() {
        let a = decode(YAML).unwrap();
        let later =
            decode_static_pod_at(YAML.as_bytes(), &path(), "Node-1", at(1_800_000_000)).unwrap();
        assert_eq!(a.metadata.uid, later.metadata.uid);
        assert_ne!(
            a.metadata.annotations.as_ref().unwrap()[CONFIG_FIRST_SEEN_ANNOTATION],
            later.metadata.annotations.as_ref().unwrap()[CONFIG_FIRST_SEEN_ANNOTATION]
        );
        let other_node = decode_static_pod_at(YAML.as_bytes(), &path(), "node-2", at(0)).unwrap();
        assert_ne!(a.metadata.uid, other_node.metadata.uid);
        let other_path =
            decode_static_pod_at(YAML.as_bytes(), Path::new("/other.yaml"), "Node-1", at(0))
                .unwrap();
        assert_ne!(a.metadata.uid, other_path.metadata.uid);
        let edited = decode(&YAML.replace("3.5.9-0", "3.5.10-0")).unwrap();
        assert_ne!(a.metadata.uid, edited.metadata.uid);
        // Formatting alone does not change the content.
        let reformatted = decode(&YAML.replace(
            "  labels:\n    component: etcd\n",
            "  labels: {component: etcd}\n",
        ))
        .unwrap();
        assert_eq!(a.metadata.uid, reformatted.metadata.uid);
    }

    #[test]
    fn a_urls_pod_has_one_uid_on_every_node_as_upstream() {
        // Old code hashed the node name in for URL pods too; upstream's
        // applyDefaults writes only "url:<url>" after the pod.
        let pod = || crate::yaml::from_slice::<Pod>(YAML.as_bytes()).unwrap();
        let url = "http://config.example/pods";
        let a = http_static_pod(pod(), url, "node-1", at(0)).unwrap();
        let b = http_static_pod(pod(), url, "node-2", at(0)).unwrap();
        assert_eq!(a.metadata.uid, b.metadata.uid);
        let c = http_static_pod(pod(), "http://other.example/pods", "node-1", at(0)).unwrap();
        assert_ne!(a.metadata.uid, c.metadata.uid);
    }

    #[test]
    fn a_uidless_manifest_takes_over_the_running_pod_it_predates() {
        // Old code: the computed UID always, so a node taken over from the
        // upstream kubelet had its kubeadm static pods replaced.
        let text = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: etcd\n  namespace: kube-system\nspec:\n  containers:\n  - name: etcd\n    image: etcd\n";
        let created = at(1000);
        let running = |uid: &str| {
            Takeover::new([(
                ("kube-system".to_string(), "etcd-node".to_string()),
                (uid.to_string(), created),
            )])
        };
        let decode_with = |t: &Takeover, mtime| {
            decode_static_pod_adopting(text.as_bytes(), &path(), "node", at(2000), |ns, name| {
                t.claim(ns, name, mtime)
            })
            .unwrap()
        };
        let t = running("upstream-uid");
        let pod = decode_with(&t, at(900));
        assert_eq!(pod.metadata.uid.as_deref(), Some("upstream-uid"));
        assert_eq!(
            pod.metadata.annotations.as_ref().unwrap()[CONFIG_HASH_ANNOTATION],
            "upstream-uid"
        );
        // Claimed once: a second manifest of the same name computes its own.
        let own = decode_static_pod_at(text.as_bytes(), &path(), "node", at(2000))
            .unwrap()
            .metadata
            .uid;
        assert_eq!(decode_with(&t, at(900)).metadata.uid, own);
        // Edited after the sandbox started: a new pod, with its own UID.
        let t = running("upstream-uid");
        assert_eq!(decode_with(&t, at(1001)).metadata.uid, own);
        // An explicit metadata.uid is never replaced.
        let t = running("upstream-uid");
        let explicit = text.replace(
            "name: etcd\n  namespace",
            "name: etcd\n  uid: mine\n  namespace",
        );
        let pod = decode_static_pod_adopting(
            explicit.as_bytes(),
            &path(),
            "node",
            at(2000),
            |ns, name| t.claim(ns, name, at(900)),
        )
        .unwrap();
        assert_eq!(pod.metadata.uid.as_deref(), Some("mine"));
    }

    #[test]
    fn explicit_uid_is_kept() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  uid: fixed-uid\nspec:\n  containers:\n  - name: web\n    image: nginx\n";
        let pod = decode(text).unwrap();
        assert_eq!(pod.metadata.uid.as_deref(), Some("fixed-uid"));
        assert_eq!(
            pod.metadata.annotations.unwrap()[CONFIG_HASH_ANNOTATION],
            "fixed-uid"
        );
    }

    fn err(text: &str) -> String {
        decode(text).unwrap_err().to_string()
    }

    #[test]
    fn decode_errors_name_the_file() {
        let garbage = err("this: is: not: yaml: [");
        assert!(
            garbage.starts_with("/etc/kubernetes/manifests/etcd.yaml: couldn't parse as pod"),
            "{garbage}"
        );
        assert!(err("").contains("couldn't parse as pod"));
        let wrong_kind = err("apiVersion: v1\nkind: Service\nmetadata:\n  name: x\n");
        assert!(wrong_kind.contains("kind is \"Service\""), "{wrong_kind}");
        assert!(err("kind: Pod\nmetadata:\n  name: x\n").contains("apiVersion is missing"));
        assert!(err("apiVersion: apps/v1\nkind: Pod\n").contains("apiVersion is \"apps/v1\""));
        let bad_type =
            err("apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\nspec:\n  containers: 5\n");
        assert!(bad_type.contains("couldn't parse as pod"), "{bad_type}");
    }

    #[test]
    fn validation_errors() {
        let pod = |body: &str| {
            format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n{body}")
        };
        let no_name =
            err("apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: a\n    image: i\n");
        assert!(
            no_name.contains("invalid pod: metadata.name: Required value"),
            "{no_name}"
        );
        assert!(err(&pod("  containers: []\n")).contains("spec.containers: Required value"));
        let dup = err(&pod(
            "  containers:\n  - name: a\n    image: i\n  - name: a\n    image: i\n",
        ));
        assert!(
            dup.contains("spec.containers[1].name: Duplicate value"),
            "{dup}"
        );
        let dup_init = err(&pod("  initContainers:\n  - name: a\n    image: i\n  containers:\n  - name: a\n    image: i\n"));
        assert!(
            dup_init.contains("spec.containers[0].name: Duplicate value"),
            "{dup_init}"
        );
        let bad_name = err(&pod("  containers:\n  - name: Bad_Name\n    image: i\n"));
        assert!(
            bad_name.contains("spec.containers[0].name: Invalid value"),
            "{bad_name}"
        );
        let no_image = err(&pod("  containers:\n  - name: a\n"));
        assert!(
            no_image.contains("spec.containers[0].image: Required value"),
            "{no_image}"
        );
        let bad_mount = err(&pod("  containers:\n  - name: a\n    image: i\n    volumeMounts:\n    - name: nope\n      mountPath: /x\n"));
        assert!(
            bad_mount.contains("volumeMounts[0].name: Not found"),
            "{bad_mount}"
        );
        let bad_policy = err(&pod(
            "  restartPolicy: Sometimes\n  containers:\n  - name: a\n    image: i\n",
        ));
        assert!(
            bad_policy.contains("spec.restartPolicy: Unsupported value"),
            "{bad_policy}"
        );
        let bad_port = err(&pod(
            "  containers:\n  - name: a\n    image: i\n    ports:\n    - containerPort: 70000\n",
        ));
        assert!(
            bad_port.contains("containerPort: Invalid value: 70000"),
            "{bad_port}"
        );
        let bad_node = decode_static_pod_at(
            pod("  containers:\n  - name: a\n    image: i\n").as_bytes(),
            &path(),
            "node_with_underscore",
            at(0),
        )
        .unwrap_err()
        .to_string();
        assert!(
            bad_node.contains("metadata.name: Invalid value"),
            "{bad_node}"
        );
    }

    #[test]
    fn api_references_are_forbidden() {
        let text = r#"apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  serviceAccountName: robot
  containers:
  - name: web
    image: nginx
    env:
    - name: PASSWORD
      valueFrom:
        secretKeyRef: {name: creds, key: password}
  volumes:
  - name: conf
    configMap: {name: settings}
"#;
        let e = err(text);
        assert!(
            e.contains("pod \"web-node-1\" has forbidden references to API objects"),
            "{e}"
        );
        for want in [
            "ServiceAccount \"robot\"",
            "Secret \"creds\"",
            "ConfigMap \"settings\"",
            "ConfigMap volume \"conf\"",
        ] {
            assert!(e.contains(want), "{want} missing in {e}");
        }
        // Resource claims and a glusterFS volume's endpoints are API
        // objects too (upstream's HasAPIObjectReference); both passed.
        let claims = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  resourceClaims:\n  - name: gpu\n    resourceClaimName: gpu-claim\n  containers:\n  - name: web\n    image: nginx\n  volumes:\n  - name: g\n    glusterfs: {endpoints: gl, path: vol}\n";
        let e = err(claims);
        assert!(e.contains("ResourceClaim \"gpu\""), "{e}");
        assert!(e.contains("Endpoints (via glusterFS volume \"g\")"), "{e}");
        let downward_ok = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: web\n    image: nginx\n  volumes:\n  - name: info\n    projected:\n      sources:\n      - downwardAPI:\n          items:\n          - path: name\n            fieldRef: {fieldPath: metadata.name}\n";
        decode(downward_ok).unwrap();
    }

    #[test]
    fn read_static_pod_reads_and_limits_size() {
        let dir = std::env::temp_dir().join(format!("rkubelet-static-pod-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("etcd.yaml");
        std::fs::write(&file, YAML).unwrap();
        let pod = read_static_pod(&file, "node-1", at(0)).unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("etcd-node-1"));

        let missing = read_static_pod(&dir.join("missing.yaml"), "node-1", at(0)).unwrap_err();
        assert!(matches!(missing, SourceError::Io { .. }));
        assert!(missing.to_string().contains("missing.yaml"), "{missing}");

        let big = dir.join("big.yaml");
        std::fs::write(&big, vec![b' '; MAX_MANIFEST_BYTES as usize + 1]).unwrap();
        let too_large = read_static_pod(&big, "node-1", at(0)).unwrap_err();
        assert!(
            matches!(too_large, SourceError::TooLarge { .. }),
            "{too_large}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
