//! The object store of the API server double: objects as JSON, one global
//! resourceVersion counter, an event history for watches, and the write
//! rules (create, update, status subresource, patch, graceful delete) of
//! the real API server's generic registry and pod strategy.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};
use tokio::sync::broadcast;

use super::patch;
use super::pki::Pki;
use super::serviceaccount::{self, Tokens};

/// One API resource the double serves.
#[derive(Debug)]
pub struct ResourceInfo {
    /// Plural lowercase resource name ("pods").
    pub plural: &'static str,
    /// API group ("" for core).
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Has a `/status` subresource (writes to the main resource then keep the
    /// stored status, as upstream's strategies for these kinds do).
    pub status: bool,
    /// `metadata.generation` is set at create and bumped on spec changes.
    pub generation: bool,
}

impl ResourceInfo {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The name tests use for this resource: the plural, plus `.group` for
    /// resources outside the core group whose plural is ambiguous.
    pub fn key(&self) -> String {
        if self.group.is_empty() || self.plural != "events" {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

macro_rules! res {
    ($plural:expr, $group:expr, $version:expr, $kind:expr, $ns:expr, $status:expr, $gen:expr) => {
        ResourceInfo {
            plural: $plural,
            group: $group,
            version: $version,
            kind: $kind,
            namespaced: $ns,
            status: $status,
            generation: $gen,
        }
    };
}

/// Every resource the double serves.
pub static RESOURCES: &[ResourceInfo] = &[
    res!("pods", "", "v1", "Pod", true, true, true),
    res!("nodes", "", "v1", "Node", false, true, false),
    res!("namespaces", "", "v1", "Namespace", false, true, false),
    res!("events", "", "v1", "Event", true, false, false),
    res!("configmaps", "", "v1", "ConfigMap", true, false, false),
    res!("secrets", "", "v1", "Secret", true, false, false),
    res!("services", "", "v1", "Service", true, true, false),
    res!(
        "persistentvolumes",
        "",
        "v1",
        "PersistentVolume",
        false,
        true,
        false
    ),
    res!(
        "persistentvolumeclaims",
        "",
        "v1",
        "PersistentVolumeClaim",
        true,
        true,
        false
    ),
    res!(
        "serviceaccounts",
        "",
        "v1",
        "ServiceAccount",
        true,
        false,
        false
    ),
    res!(
        "leases",
        "coordination.k8s.io",
        "v1",
        "Lease",
        true,
        false,
        false
    ),
    res!("events", "events.k8s.io", "v1", "Event", true, false, false),
    res!(
        "certificatesigningrequests",
        "certificates.k8s.io",
        "v1",
        "CertificateSigningRequest",
        false,
        true,
        false
    ),
    // v1beta1 as a 1.34 cluster serves it with the ClusterTrustBundle gate
    // and runtime-config on (see trustbundle.rs).
    res!(
        "clustertrustbundles",
        "certificates.k8s.io",
        "v1beta1",
        "ClusterTrustBundle",
        false,
        false,
        false
    ),
    // PodCertificateRequests (see podcert.rs): v1alpha1 in 1.34, with the
    // signer's /status.
    res!(
        "podcertificaterequests",
        "certificates.k8s.io",
        "v1alpha1",
        "PodCertificateRequest",
        true,
        true,
        false
    ),
    // CSI: the kubelet reads a driver's CSIDriver (podInfoOnMount,
    // volumeLifecycleModes); cluster-scoped, no status subresource.
    res!(
        "csidrivers",
        "storage.k8s.io",
        "v1",
        "CSIDriver",
        false,
        false,
        false
    ),
    // The kubelet keeps its node's CSINode (registered drivers).
    res!(
        "csinodes",
        "storage.k8s.io",
        "v1",
        "CSINode",
        false,
        false,
        false
    ),
    // The attach/detach controller's VolumeAttachments, whose status the
    // external-attacher writes; the kubelet reads them (see
    // volumeattachment_prepare_* below).
    res!(
        "volumeattachments",
        "storage.k8s.io",
        "v1",
        "VolumeAttachment",
        false,
        true,
        false
    ),
];

/// The resource served at `group`/`version`/`plural`.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceInfo> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The resource tests name `name` ("pods", "events.events.k8s.io").
pub fn by_name(name: &str) -> &'static ResourceInfo {
    RESOURCES
        .iter()
        .find(|r| r.key() == name)
        .unwrap_or_else(|| panic!("the API server double does not serve {name:?}"))
}

/// The resource of an object, from its apiVersion and kind.
pub fn by_kind(api_version: &str, kind: &str) -> Option<&'static ResourceInfo> {
    RESOURCES
        .iter()
        .find(|r| r.api_version() == api_version && r.kind == kind)
}

/// A `metav1.Status` failure, as the real server returns for every error.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, res: &ResourceInfo, name: &str) -> ApiError {
        let mut d = json!({ "name": name, "kind": res.plural });
        if !res.group.is_empty() {
            d["group"] = json!(res.group);
        }
        self.details = Some(d);
        self
    }

    pub fn not_found(res: &ResourceInfo, name: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(res)),
        )
        .with_details(res, name)
    }

    pub fn already_exists(res: &ResourceInfo, name: &str) -> ApiError {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(res)),
        )
        .with_details(res, name)
    }

    pub fn conflict(res: &ResourceInfo, name: &str, why: &str) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(res)
            ),
        )
        .with_details(res, name)
    }

    /// A Conflict naming the kind, as rest.BeforeDelete's precondition
    /// errors do.
    pub fn conflict_kind(res: &ResourceInfo, name: &str, why: &str) -> ApiError {
        let what = if res.group.is_empty() {
            res.kind.to_string()
        } else {
            format!("{}.{}", res.kind, res.group)
        };
        ApiError::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {what} \"{name}\": {why}"),
        )
        .with_details(res, name)
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    pub fn expired(message: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", message)
    }

    /// The Status object.
    pub fn status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

/// "pods" or "leases.coordination.k8s.io", as upstream's error messages
/// name a resource.
fn qualified(res: &ResourceInfo) -> String {
    if res.group.is_empty() {
        res.plural.to_string()
    } else {
        format!("{}.{}", res.plural, res.group)
    }
}

pub const CONFLICT_MODIFIED: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

/// Now as RFC 3339 with whole seconds, as metav1.Time serializes.
pub fn now_rfc3339() -> String {
    rfc3339(SystemTime::now())
}

pub fn rfc3339(t: SystemTime) -> String {
    rfc3339_secs(
        t.duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0),
    )
}

/// Seconds since the epoch of an RFC 3339 time (0 if unparsable).
pub fn parse_rfc3339(s: &str) -> i64 {
    s.parse::<k8s_openapi::jiff::Timestamp>()
        .map(|t| t.as_second())
        .unwrap_or(0)
}

/// RFC 3339 (whole seconds) of seconds since the epoch.
pub fn rfc3339_secs(secs: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// A random UUID (version 4 layout) from std's randomly keyed hasher.
pub fn new_uid() -> String {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let word = || {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        h.finish()
    };
    let (a, b) = (word(), word());
    let v = ((a as u128) << 64) | b as u128;
    let v = (v & !(0xf000u128 << 64)) | (0x4000u128 << 64);
    let v = (v & !(0xc000u128 << 48)) | (0x8000u128 << 48);
    let hex = format!("{v:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One write, as watchers see it.
#[derive(Debug)]
pub struct StoredEvent {
    pub rv: u64,
    pub typ: EventType,
    pub res: &'static ResourceInfo,
    pub ns: String,
    /// The object after the write (for DELETED: the last state, with the
    /// delete's resourceVersion).
    pub object: Value,
    /// The object before the write (MODIFIED only), for selector transitions.
    pub old: Option<Value>,
}

/// One requirement of a label or field selector.
#[derive(Debug, Clone)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector` + `fieldSelector` (equality-based only, plus
/// label existence; set-based `in`/`notin` is not implemented).
#[derive(Debug, Clone, Default)]
pub struct Selector {
    labels: Vec<Req>,
    fields: Vec<Req>,
}

fn parse_reqs(s: &str, allow_exists: bool) -> Result<Vec<Req>, ApiError> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((k, v)) = part.split_once("!=") {
            out.push(Req::NotEq(k.trim().into(), v.trim().into()));
        } else if let Some((k, v)) = part.split_once("==") {
            out.push(Req::Eq(k.trim().into(), v.trim().into()));
        } else if let Some((k, v)) = part.split_once('=') {
            out.push(Req::Eq(k.trim().into(), v.trim().into()));
        } else if allow_exists && !part.contains(' ') {
            match part.strip_prefix('!') {
                Some(k) => out.push(Req::NotExists(k.into())),
                None => out.push(Req::Exists(part.into())),
            }
        } else {
            return Err(ApiError::bad_request(format!(
                "unable to parse requirement: {part:?} (the API server double supports only =, ==, != and existence)"
            )));
        }
    }
    Ok(out)
}

/// The field labels a kind's field selectors accept, as the conversion
/// funcs the handler applies before listing (Scheme.ConvertFieldLabel:
/// pkg/apis/core/v1/conversion.go for Pod, Node, Namespace, Event, Secret
/// and Service, runtime.DefaultMetaV1FieldSelectorConversion for every
/// kind without one). Returns the label to match (pods' `spec.host` is
/// `spec.nodeName`) or the error text. CSRs and events.k8s.io events are
/// not checked.
fn convert_field_label(res: &ResourceInfo, label: &str) -> Result<String, String> {
    let unsupported = || Err(format!("field label not supported: {label}"));
    let ok = |l: &str| Ok(l.to_string());
    let core = res.group.is_empty();
    match (core, res.plural) {
        (true, "pods") => match label {
            "metadata.name" | "metadata.namespace" | "spec.nodeName" | "spec.restartPolicy"
            | "spec.schedulerName" | "spec.serviceAccountName" | "spec.hostNetwork"
            | "status.phase" | "status.podIP" | "status.podIPs" | "status.nominatedNodeName" => {
                ok(label)
            }
            "spec.host" => ok("spec.nodeName"),
            _ => unsupported(),
        },
        (true, "nodes") => match label {
            "metadata.name" | "spec.unschedulable" => ok(label),
            _ => unsupported(),
        },
        (true, "namespaces") => match label {
            "metadata.name" | "status.phase" => ok(label),
            _ => unsupported(),
        },
        (true, "events") => match label {
            "involvedObject.kind"
            | "involvedObject.namespace"
            | "involvedObject.name"
            | "involvedObject.uid"
            | "involvedObject.apiVersion"
            | "involvedObject.resourceVersion"
            | "involvedObject.fieldPath"
            | "reason"
            | "reportingComponent"
            | "source"
            | "type"
            | "metadata.namespace"
            | "metadata.name" => ok(label),
            _ => unsupported(),
        },
        (true, "secrets") => match label {
            "type" | "metadata.namespace" | "metadata.name" => ok(label),
            _ => unsupported(),
        },
        (true, "services") => match label {
            "metadata.namespace" | "metadata.name" | "spec.clusterIP" | "spec.type" => ok(label),
            _ => unsupported(),
        },
        (false, "certificatesigningrequests") | (false, "events") => ok(label),
        (false, "clustertrustbundles") => super::trustbundle::convert_field_label(label),
        (false, "podcertificaterequests") => super::podcert::convert_field_label(label),
        _ => match label {
            "metadata.name" | "metadata.namespace" => ok(label),
            _ => Err(format!(
                "{label:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
            )),
        },
    }
}

impl Selector {
    /// Parses the selectors of a list or watch of `res`; an unknown field
    /// label is a 400 BadRequest, as the list handler's
    /// `FieldSelector.Transform` error.
    pub fn parse(
        res: &ResourceInfo,
        labels: Option<&str>,
        fields: Option<&str>,
    ) -> Result<Selector, ApiError> {
        let mut fields = parse_reqs(fields.unwrap_or(""), false)?;
        for r in &mut fields {
            if let Req::Eq(k, _) | Req::NotEq(k, _) = r {
                *k = convert_field_label(res, k).map_err(ApiError::bad_request)?;
            }
        }
        Ok(Selector {
            labels: parse_reqs(labels.unwrap_or(""), true)?,
            fields,
        })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        let labels_ok = self.labels.iter().all(|r| match r {
            Req::Eq(k, v) => label(k) == Some(v.as_str()),
            Req::NotEq(k, v) => label(k) != Some(v.as_str()),
            Req::Exists(k) => label(k).is_some(),
            Req::NotExists(k) => label(k).is_none(),
        });
        let field = |k: &str| field_value(obj, k);
        labels_ok
            && self.fields.iter().all(|r| match r {
                Req::Eq(k, v) => field(k) == *v,
                Req::NotEq(k, v) => field(k) != *v,
                Req::Exists(_) | Req::NotExists(_) => true,
            })
    }
}

/// A field selector's view of a field: its value as a string, "" if absent.
fn field_value(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for seg in path.split('.') {
        match cur.get(seg) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The PersistentVolume status strategy's PrepareForUpdate
/// (PersistentVolumeLastPhaseTransitionTime): an unchanged phase keeps the
/// stored transition time unless the write sets one; a changed phase gets
/// now unless the write sets a new time.
fn pv_phase_transition(old: &Value, next: &mut Value) {
    let key = "lastPhaseTransitionTime";
    let old_phase = old.pointer("/status/phase").cloned();
    let old_time = old.pointer("/status/lastPhaseTransitionTime").cloned();
    if !next["status"].is_object() {
        next["status"] = json!({});
    }
    let new_time = next["status"].get(key).filter(|t| !t.is_null()).cloned();
    if next["status"].get("phase").cloned() == old_phase {
        if new_time.is_none() {
            match old_time {
                Some(t) => next["status"][key] = t,
                None => {
                    next["status"].as_object_mut().expect("status").remove(key);
                }
            }
        }
    } else if new_time.is_none() || new_time == old_time {
        next["status"][key] = json!(now_rfc3339());
    }
}

/// Options of a delete (`metav1.DeleteOptions`, the parts the double reads).
#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    pub grace: Option<i64>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// What a delete did.
#[derive(Debug)]
pub enum Deleted {
    /// Removed from the store; the last state.
    Gone(Value),
    /// Graceful deletion (or finalizers) pending; the object as it now is.
    Pending(Value),
}

/// Which part of an object a write targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sub {
    Main,
    Status,
    Approval,
    /// pods/{name}/ephemeralcontainers.
    EphemeralContainers,
    /// pods/{name}/resize.
    Resize,
}

/// Knobs of the CSR signer.
#[derive(Debug)]
pub struct CsrConfig {
    pub auto_approve: bool,
    pub lifetime: Duration,
}

type Key = (String, String, String);

pub struct Store {
    rv: u64,
    /// Watch history before (and at) this resourceVersion is forgotten.
    compacted: u64,
    objects: BTreeMap<Key, Value>,
    history: Vec<Arc<StoredEvent>>,
    tx: broadcast::Sender<Arc<StoredEvent>>,
    pub pki: Arc<Pki>,
    pub csr: CsrConfig,
    /// TokenRequest knobs, requests and issued tokens.
    pub tokens: Tokens,
    /// The ServiceAccount admission plugin runs on pod creates.
    pub sa_admission: bool,
}

fn key(res: &ResourceInfo, ns: &str, name: &str) -> Key {
    (res.key(), ns.to_string(), name.to_string())
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = json!({});
    }
    let o = obj.as_object_mut().expect("object");
    let m = o.entry("metadata").or_insert_with(|| json!({}));
    if !m.is_object() {
        *m = json!({});
    }
    m.as_object_mut().expect("metadata")
}

fn finalizers_empty(obj: &Value) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_none_or(|f| f.is_empty())
}

/// names.SimpleNameGenerator's 5-character suffix.
pub fn random_suffix() -> String {
    const ALPHA: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let uid = new_uid().replace('-', "");
    let n = u64::from_str_radix(&uid[..16], 16).unwrap_or(0);
    (0..5)
        .map(|i| ALPHA[((n >> (i * 8)) % ALPHA.len() as u64) as usize] as char)
        .collect()
}

impl Store {
    pub fn new(pki: Arc<Pki>) -> Store {
        let (tx, _) = broadcast::channel(100_000);
        let mut s = Store {
            rv: 0,
            compacted: 0,
            objects: BTreeMap::new(),
            history: Vec::new(),
            tx,
            pki,
            csr: CsrConfig {
                auto_approve: false,
                lifetime: Duration::from_secs(365 * 24 * 3600),
            },
            tokens: Tokens::default(),
            sa_admission: false,
        };
        let ns = by_name("namespaces");
        for name in ["default", "kube-system", "kube-node-lease", "kube-public"] {
            let obj = json!({"metadata": {"name": name}, "spec": {"finalizers": ["kubernetes"]},
                             "status": {"phase": "Active"}});
            s.create(ns, "", obj, None).expect("namespace");
        }
        s
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    /// Forgets the watch history up to now.
    pub fn compact(&mut self) {
        self.compacted = self.rv;
        self.history.clear();
    }

    /// Records one write: bumps the resourceVersion, stores or removes the
    /// object, keeps the event for watches from older versions and sends it
    /// to open watches.
    fn commit(
        &mut self,
        res: &'static ResourceInfo,
        ns: &str,
        name: &str,
        typ: EventType,
        mut obj: Value,
        old: Option<Value>,
    ) -> Value {
        self.rv += 1;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let k = key(res, ns, name);
        if typ == EventType::Deleted {
            self.objects.remove(&k);
        } else {
            self.objects.insert(k, obj.clone());
        }
        let ev = Arc::new(StoredEvent {
            rv: self.rv,
            typ,
            res,
            ns: ns.to_string(),
            object: obj.clone(),
            old,
        });
        self.history.push(ev.clone());
        let _ = self.tx.send(ev);
        obj
    }

    pub fn get(&self, res: &ResourceInfo, ns: &str, name: &str) -> Option<Value> {
        self.objects.get(&key(res, ns, name)).cloned()
    }

    /// Objects of `res` (in `ns` if given) matching `sel`, in key order.
    pub fn list(&self, res: &ResourceInfo, ns: Option<&str>, sel: &Selector) -> Vec<(Key, Value)> {
        let rk = res.key();
        self.objects
            .iter()
            .filter(|((r, n, _), v)| *r == rk && ns.is_none_or(|ns| ns == n) && sel.matches(v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// POST: a new object, with the server-set metadata.
    pub fn create(
        &mut self,
        res: &'static ResourceInfo,
        ns: &str,
        mut obj: Value,
        user: Option<(&str, &[String])>,
    ) -> Result<Value, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request was not an object",
            ));
        }
        obj["apiVersion"] = json!(res.api_version());
        obj["kind"] = json!(res.kind);
        let meta = meta_mut(&mut obj);
        if res.namespaced {
            match meta.get("namespace").and_then(Value::as_str) {
                Some(n) if !n.is_empty() && n != ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ => {
                    meta.insert("namespace".into(), json!(ns));
                }
            }
        } else {
            meta.remove("namespace");
        }
        // Mutating and validating admission run before the name is
        // generated and before the store sees the object.
        if res.plural == "pods" && self.sa_admission {
            serviceaccount::admit_pod(self, ns, &mut obj)?;
        }
        let meta = meta_mut(&mut obj);
        let mut name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if name.is_empty() {
            match meta.get("generateName").and_then(Value::as_str) {
                Some(prefix) if !prefix.is_empty() => {
                    name = format!("{prefix}{}", random_suffix());
                    meta.insert("name".into(), json!(name));
                }
                _ => {
                    return Err(ApiError::new(
                        422,
                        "Invalid",
                        format!(
                            "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                            res.kind
                        ),
                    ))
                }
            }
        }
        if self.objects.contains_key(&key(res, ns, &name)) {
            return Err(ApiError::already_exists(res, &name));
        }
        meta.insert("uid".into(), json!(new_uid()));
        meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
        for f in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            meta.remove(f);
        }
        if res.generation {
            meta.insert("generation".into(), json!(1));
        }
        match res.plural {
            "pods" => {
                // ValidatePodCreate: ephemeral containers come only through
                // their subresource.
                let eph = obj.pointer("/spec/ephemeralContainers");
                if eph.and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
                    return Err(ApiError::new(
                        422,
                        "Invalid",
                        format!("Pod {name:?} is invalid: spec.ephemeralContainers: Forbidden: cannot be set on create"),
                    ));
                }
                // Defaulting (SetDefaults_PodSpec): the grace period.
                if obj["spec"].is_object()
                    && obj["spec"].get("terminationGracePeriodSeconds").is_none()
                {
                    obj["spec"]["terminationGracePeriodSeconds"] = json!(30);
                }
                let status = obj
                    .as_object_mut()
                    .expect("object")
                    .entry("status")
                    .or_insert_with(|| json!({}));
                if status.get("phase").is_none() {
                    status["phase"] = json!("Pending");
                }
                // Defaulting (defaultPodRequests), then PrepareForCreate's
                // status.qosClass = ComputePodQOS(pod).
                super::resize::default_pod_requests(&mut obj);
                obj["status"]["qosClass"] = json!(super::resize::compute_qos(&obj));
            }
            "persistentvolumes" => {
                // SetDefaults_PersistentVolume; the strategy's
                // PrepareForCreate resets status to phase Pending with
                // lastPhaseTransitionTime now.
                if !obj["spec"].is_object() {
                    obj["spec"] = json!({});
                }
                for (k, v) in [
                    ("persistentVolumeReclaimPolicy", "Retain"),
                    ("volumeMode", "Filesystem"),
                ] {
                    if obj["spec"].get(k).is_none_or(Value::is_null) {
                        obj["spec"][k] = json!(v);
                    }
                }
                obj["status"] =
                    json!({"phase": "Pending", "lastPhaseTransitionTime": now_rfc3339()});
            }
            "persistentvolumeclaims" => {
                // PrepareForCreate clears status; SetDefaults_* give phase
                // Pending and spec.volumeMode Filesystem.
                if !obj["spec"].is_object() {
                    obj["spec"] = json!({});
                }
                if obj["spec"].get("volumeMode").is_none_or(Value::is_null) {
                    obj["spec"]["volumeMode"] = json!("Filesystem");
                }
                obj["status"] = json!({"phase": "Pending"});
            }
            "certificatesigningrequests" => {
                obj["status"] = json!({});
                if let Some((u, groups)) = user {
                    obj["spec"]["username"] = json!(u);
                    obj["spec"]["groups"] = json!(groups);
                }
            }
            _ => {}
        }
        if res.plural == "clustertrustbundles" {
            super::trustbundle::validate(&obj, None)?;
        }
        if res.plural == "csidrivers" {
            csidriver_defaults(&mut obj);
        }
        if res.plural == "volumeattachments" {
            volumeattachment_prepare_for_create(&mut obj);
        }
        if res.plural == "podcertificaterequests" {
            super::podcert::prepare_for_create(&mut obj);
            super::podcert::validate_create(&obj)?;
        }
        let created = self.commit(res, ns, &name, EventType::Added, obj, None);
        if res.plural == "certificatesigningrequests" && self.csr.auto_approve {
            self.approve_csr(&name, "AutoApproved", "approved by the API server double");
        }
        Ok(created)
    }

    /// PUT (and the end of PATCH): replaces the object, or its status.
    /// `new`'s resourceVersion, when set, must be the stored one.
    pub fn update(
        &mut self,
        res: &'static ResourceInfo,
        ns: &str,
        name: &str,
        new: Value,
        sub: Sub,
    ) -> Result<Value, ApiError> {
        let old = self
            .get(res, ns, name)
            .ok_or_else(|| ApiError::not_found(res, name))?;
        if !new.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request was not an object",
            ));
        }
        if let Some(n) = meta_str(&new, "name") {
            if n != name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
        }
        if let Some(rv) = meta_str(&new, "resourceVersion") {
            if !rv.is_empty() && Some(rv) != meta_str(&old, "resourceVersion") {
                return Err(ApiError::conflict(res, name, CONFLICT_MODIFIED));
            }
        }
        if let Some(uid) = meta_str(&new, "uid") {
            let stored = meta_str(&old, "uid").unwrap_or("");
            if !uid.is_empty() && uid != stored {
                return Err(ApiError::conflict(
                    res,
                    name,
                    &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {stored}"),
                ));
            }
        }
        let mut next = match sub {
            Sub::Status => {
                // The status strategies of the kinds served here (pods,
                // nodes, PVs, PVCs, CSRs, namespaces) reset spec to the
                // stored one and keep the rest of the write, metadata
                // included; pods also keep their ownerReferences
                // (podStatusStrategy.PrepareForUpdate). System fields stay
                // as stored (rest.BeforeUpdate).
                let mut next = new;
                next["apiVersion"] = json!(res.api_version());
                next["kind"] = json!(res.kind);
                match old.get("spec") {
                    Some(s) => next["spec"] = s.clone(),
                    None => {
                        next.as_object_mut().expect("object").remove("spec");
                    }
                }
                let old_meta = old["metadata"].as_object().cloned().unwrap_or_default();
                let meta = meta_mut(&mut next);
                let mut kept = vec![
                    "name",
                    "namespace",
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "generation",
                ];
                if res.plural == "pods" {
                    kept.push("ownerReferences");
                }
                for f in kept {
                    match old_meta.get(f) {
                        Some(v) => meta.insert(f.into(), v.clone()),
                        None => meta.remove(f),
                    };
                }
                if res.plural == "persistentvolumes" {
                    pv_phase_transition(&old, &mut next);
                }
                if res.plural == "volumeattachments" {
                    volumeattachment_prepare_status_update(&old, &mut next);
                }
                if res.plural == "pods" {
                    // ValidatePodStatusUpdate: "Pod QoS is immutable".
                    let qos =
                        |o: &Value| o["status"]["qosClass"].as_str().unwrap_or("").to_string();
                    let (was, now) = (qos(&old), qos(&next));
                    if was != now {
                        return Err(ApiError::new(
                            422,
                            "Invalid",
                            format!("Pod {name:?} is invalid: status.qosClass: Invalid value: {now:?}: field is immutable"),
                        ));
                    }
                }
                next
            }
            Sub::EphemeralContainers => super::ephemeral::update(name, &old, &new)?,
            Sub::Resize => super::resize::update(name, &old, &new)?,
            Sub::Approval => {
                let mut next = old.clone();
                let conds = new
                    .pointer("/status/conditions")
                    .cloned()
                    .unwrap_or(Value::Null);
                if !next["status"].is_object() {
                    next["status"] = json!({});
                }
                next["status"]["conditions"] = conds;
                next
            }
            Sub::Main => {
                let mut next = new;
                next["apiVersion"] = json!(res.api_version());
                next["kind"] = json!(res.kind);
                let old_meta = old["metadata"].as_object().cloned().unwrap_or_default();
                let meta = meta_mut(&mut next);
                meta.insert("name".into(), json!(name));
                if res.namespaced {
                    meta.insert("namespace".into(), json!(ns));
                }
                for f in [
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "generation",
                ] {
                    match old_meta.get(f) {
                        Some(v) => meta.insert(f.into(), v.clone()),
                        None => meta.remove(f),
                    };
                }
                if res.status {
                    match old.get("status") {
                        Some(s) => next["status"] = s.clone(),
                        None => {
                            next.as_object_mut().expect("object").remove("status");
                        }
                    }
                }
                if res.generation && next.get("spec") != old.get("spec") {
                    let g = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
                    meta_mut(&mut next).insert("generation".into(), json!(g));
                }
                if res.plural == "pods" {
                    super::resize::check_pod_update(name, &old, &next)?;
                }
                next
            }
        };
        // A write that changes nothing is not a write: same resourceVersion,
        // no event (upstream's GuaranteedUpdate skips no-op updates).
        meta_mut(&mut next).insert(
            "resourceVersion".into(),
            old["metadata"]["resourceVersion"].clone(),
        );
        if res.plural == "csidrivers" {
            csidriver_defaults(&mut next);
        }
        if next == old {
            return Ok(old);
        }
        if res.plural == "clustertrustbundles" {
            super::trustbundle::validate(&next, Some(&old))?;
        }
        // Removing the last finalizer of an object marked deleting (grace 0)
        // deletes it, in place of the update (ShouldDeleteDuringUpdate).
        if old.pointer("/metadata/deletionTimestamp").is_some()
            && finalizers_empty(&next)
            && old
                .pointer("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_i64)
                == Some(0)
        {
            return Ok(self.commit(res, ns, name, EventType::Deleted, next, None));
        }
        let updated = self.commit(res, ns, name, EventType::Modified, next, Some(old));
        if res.plural == "certificatesigningrequests" {
            self.sign_if_approved(name);
        }
        Ok(updated)
    }

    /// PATCH: applies the patch to the stored object, then updates it.
    pub fn patch(
        &mut self,
        res: &'static ResourceInfo,
        ns: &str,
        name: &str,
        content_type: &str,
        body: &Value,
        sub: Sub,
    ) -> Result<Value, ApiError> {
        let old = self
            .get(res, ns, name)
            .ok_or_else(|| ApiError::not_found(res, name))?;
        let mut patched = match content_type {
            "application/merge-patch+json" => patch::merge_patch(&old, body),
            "application/strategic-merge-patch+json" => patch::strategic_merge(&old, body)
                .map_err(|e| ApiError::bad_request(format!("strategic merge patch: {e}")))?,
            "application/json-patch+json" => patch::json_patch(&old, body).map_err(|e| {
                ApiError::new(422, "Invalid", format!("the server rejected our request due to an error in our request: {e}"))
            })?,
            other => {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {other:?})"),
                ))
            }
        };
        // A patch that sets metadata.resourceVersion is a precondition on it;
        // one that does not applies to whatever is stored.
        let patch_rv = body
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
        match patch_rv {
            Some(rv) => {
                meta_mut(&mut patched).insert("resourceVersion".into(), json!(rv));
            }
            None => {
                meta_mut(&mut patched).remove("resourceVersion");
            }
        }
        self.update(res, ns, name, patched, sub)
    }

    /// DELETE, as upstream's generic store with rest.BeforeDelete: pods
    /// (the only kind here with a graceful-delete strategy) get
    /// deletionTimestamp + deletionGracePeriodSeconds and stay while the
    /// period is > 0 (a later delete may only shorten it; grace 0 writes the
    /// object, then deletes it); objects with finalizers are marked deleting
    /// and stay until the last finalizer goes; everything else goes at once.
    pub fn delete(
        &mut self,
        res: &'static ResourceInfo,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Deleted, ApiError> {
        let old = self
            .get(res, ns, name)
            .ok_or_else(|| ApiError::not_found(res, name))?;
        let stored_uid = meta_str(&old, "uid").unwrap_or("").to_string();
        if let Some(uid) = &opts.uid {
            if *uid != stored_uid {
                return Err(ApiError::conflict_kind(
                    res,
                    name,
                    &format!("the UID in the precondition ({uid}) does not match the UID in record ({stored_uid}). The object might have been deleted and then recreated"),
                ));
            }
        }
        if let Some(rv) = &opts.resource_version {
            let stored = meta_str(&old, "resourceVersion").unwrap_or("");
            if rv != stored {
                return Err(ApiError::conflict_kind(
                    res,
                    name,
                    &format!("the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record ({stored}). The object might have been modified"),
                ));
            }
        }
        // Negative grace periods count as 1 s.
        let opt_grace = opts.grace.map(|g| if g < 0 { 1 } else { g });
        let has_finalizers = !finalizers_empty(&old);
        let deletion_ts = meta_str(&old, "deletionTimestamp").map(str::to_string);
        let pending_grace = old
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64);
        let generation = old["metadata"]["generation"].as_i64().unwrap_or(0);
        // (deletionTimestamp, grace, bump generation) of a graceful delete.
        let graceful: Option<(String, i64, bool)> = match (&deletion_ts, pending_grace) {
            // Graceful deletion already pending: it may only get shorter,
            // counted from when it started.
            (Some(ts), Some(cur)) if cur > 0 => match opt_grace {
                Some(g) if g < cur => {
                    let start = parse_rfc3339(ts) - cur;
                    Some((rfc3339_secs(start + g), g, false))
                }
                _ => return Ok(Deleted::Pending(old)),
            },
            (Some(_), _) => None,
            (None, _) if res.plural == "pods" => {
                // Pod strategy CheckGracefulDelete.
                let mut g = opt_grace.unwrap_or_else(|| {
                    old.pointer("/spec/terminationGracePeriodSeconds")
                        .and_then(Value::as_i64)
                        .unwrap_or(0)
                });
                let node = old
                    .pointer("/spec/nodeName")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let phase = old
                    .pointer("/status/phase")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if node.is_empty() || phase == "Succeeded" || phase == "Failed" {
                    g = 0;
                }
                if g < 0 {
                    g = 1;
                }
                let when = SystemTime::now() + Duration::from_secs(g as u64);
                Some((rfc3339(when), g, true))
            }
            (None, _) => None,
        };
        match graceful {
            Some((ts, grace, bump)) => {
                let mut next = old.clone();
                let meta = meta_mut(&mut next);
                meta.insert("deletionTimestamp".into(), json!(ts));
                meta.insert("deletionGracePeriodSeconds".into(), json!(grace));
                if bump && generation > 0 {
                    meta.insert("generation".into(), json!(generation + 1));
                }
                let updated = self.commit(res, ns, name, EventType::Modified, next, Some(old));
                if has_finalizers || grace > 0 {
                    return Ok(Deleted::Pending(updated));
                }
                let gone = self.commit(res, ns, name, EventType::Deleted, updated, None);
                Ok(Deleted::Gone(gone))
            }
            None if has_finalizers => {
                // markAsDeleting.
                let mut next = old.clone();
                let now = rfc3339(SystemTime::now());
                let meta = meta_mut(&mut next);
                if deletion_ts.is_none() && generation > 0 {
                    meta.insert("generation".into(), json!(generation + 1));
                }
                if deletion_ts
                    .as_deref()
                    .is_none_or(|ts| parse_rfc3339(ts) > parse_rfc3339(&now))
                {
                    meta.insert("deletionTimestamp".into(), json!(now));
                }
                meta.insert("deletionGracePeriodSeconds".into(), json!(0));
                if next == old {
                    return Ok(Deleted::Pending(old));
                }
                let updated = self.commit(res, ns, name, EventType::Modified, next, Some(old));
                Ok(Deleted::Pending(updated))
            }
            None => {
                let gone = self.commit(res, ns, name, EventType::Deleted, old, None);
                Ok(Deleted::Gone(gone))
            }
        }
    }

    /// Starts a watch under the store lock, so that no write falls between
    /// the initial events and the live ones. `rv` is the watch's
    /// resourceVersion parameter (None/""/"0": the current state as ADDED).
    #[allow(clippy::type_complexity)]
    pub fn watch(
        &self,
        res: &'static ResourceInfo,
        ns: Option<&str>,
        rv: Option<&str>,
        sel: &Selector,
    ) -> Result<(Vec<Value>, u64, broadcast::Receiver<Arc<StoredEvent>>), ApiError> {
        let rx = self.tx.subscribe();
        let mut initial = Vec::new();
        let from = match rv.filter(|rv| !rv.is_empty() && *rv != "0") {
            None => {
                for (_, obj) in self.list(res, ns, sel) {
                    initial.push(json!({"type": "ADDED", "object": obj}));
                }
                self.rv
            }
            Some(rv) => {
                let n: u64 = rv.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid resource version: {rv:?}"))
                })?;
                if n < self.compacted {
                    return Err(ApiError::expired(format!(
                        "too old resource version: {n} ({})",
                        self.compacted
                    )));
                }
                for ev in self.history.iter().filter(|e| e.rv > n) {
                    if let Some(v) = watch_event(ev, res, ns, sel) {
                        initial.push(v);
                    }
                }
                self.rv.max(n)
            }
        };
        Ok((initial, from, rx))
    }

    // --- CertificateSigningRequests ---

    /// Adds the Approved condition (as `kubectl certificate approve` or the
    /// kubelet CSR approver does), then signs.
    pub fn approve_csr(&mut self, name: &str, reason: &str, message: &str) -> bool {
        let res = by_name("certificatesigningrequests");
        let Some(old) = self.get(res, "", name) else {
            return false;
        };
        let mut next = old.clone();
        if !next["status"].is_object() {
            next["status"] = json!({});
        }
        let conds = next["status"]
            .as_object_mut()
            .expect("status")
            .entry("conditions")
            .or_insert_with(|| json!([]));
        if !conds.is_array() {
            *conds = json!([]);
        }
        let list = conds.as_array_mut().expect("conditions");
        if !list.iter().any(|c| c["type"] == "Approved") {
            let now = now_rfc3339();
            list.push(
                json!({"type": "Approved", "status": "True", "reason": reason,
                "message": message, "lastUpdateTime": now, "lastTransitionTime": now}),
            );
            self.commit(res, "", name, EventType::Modified, next, Some(old));
        }
        self.sign_if_approved(name);
        true
    }

    /// The signer controller: an approved, not denied, unsigned CSR of a
    /// known signer gets `status.certificate`.
    fn sign_if_approved(&mut self, name: &str) {
        let res = by_name("certificatesigningrequests");
        let Some(old) = self.get(res, "", name) else {
            return;
        };
        let conds = old
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let has = |t: &str| {
            conds
                .iter()
                .any(|c| c["type"] == t && c["status"] != "False")
        };
        if !has("Approved") || has("Denied") || has("Failed") {
            return;
        }
        if old
            .pointer("/status/certificate")
            .is_some_and(|c| !c.is_null() && c != "")
        {
            return;
        }
        let mut next = old.clone();
        match self.pki.sign_csr(&old["spec"], self.csr.lifetime) {
            Ok(pem) => {
                let b64 = serde_json::to_value(k8s_openapi::ByteString(pem.into_bytes()))
                    .expect("base64");
                next["status"]["certificate"] = b64;
            }
            Err(e) => {
                let now = now_rfc3339();
                let mut conds = conds;
                conds.push(
                    json!({"type": "Failed", "status": "True", "reason": "SignerValidationFailure",
                    "message": e, "lastUpdateTime": now, "lastTransitionTime": now}),
                );
                next["status"]["conditions"] = json!(conds);
            }
        }
        self.commit(res, "", name, EventType::Modified, next, Some(old));
    }
}

/// The event a watcher of `res` in `ns` with `sel` gets for a write, if
/// any: a MODIFIED object that starts matching is ADDED, one that stops
/// matching is DELETED (its previous state with the new resourceVersion),
/// as upstream's watch cache does.
pub fn watch_event(
    ev: &StoredEvent,
    res: &ResourceInfo,
    ns: Option<&str>,
    sel: &Selector,
) -> Option<Value> {
    if ev.res.key() != res.key() || ns.is_some_and(|ns| ns != ev.ns) {
        return None;
    }
    let now = sel.matches(&ev.object);
    match (ev.typ, &ev.old) {
        (EventType::Modified, Some(old)) => {
            let before = sel.matches(old);
            match (before, now) {
                (true, true) => Some(json!({"type": "MODIFIED", "object": ev.object})),
                (false, true) => Some(json!({"type": "ADDED", "object": ev.object})),
                (true, false) => {
                    let mut gone = old.clone();
                    meta_mut(&mut gone).insert("resourceVersion".into(), json!(ev.rv.to_string()));
                    Some(json!({"type": "DELETED", "object": gone}))
                }
                (false, false) => None,
            }
        }
        _ if now => Some(json!({"type": ev.typ.as_str(), "object": ev.object})),
        _ => None,
    }
}

/// VolumeAttachment create (pkg/registry/storage/volumeattachment
/// strategy PrepareForCreate): the status is cleared, only the
/// external-attacher sets it, through `/status`.
fn volumeattachment_prepare_for_create(obj: &mut Value) {
    if let Some(o) = obj.as_object_mut() {
        o.remove("status");
    }
}

/// VolumeAttachment `/status` writes (volumeAttachmentStatusStrategy
/// PrepareForUpdate): spec (already kept by the caller) and the whole of
/// metadata stay as stored (ResetObjectMetaForStatus), unlike the pod and
/// node status strategies, which take labels and annotations.
fn volumeattachment_prepare_status_update(old: &Value, next: &mut Value) {
    let rv = next["metadata"]["resourceVersion"].clone();
    next["metadata"] = old["metadata"].clone();
    if !rv.is_null() {
        next["metadata"]["resourceVersion"] = rv;
    }
}

/// CSIDriver defaulting (pkg/apis/storage/v1 SetDefaults_CSIDriver),
/// applied when a write is decoded: attachRequired true, podInfoOnMount,
/// storageCapacity, requiresRepublish and seLinuxMount false,
/// fsGroupPolicy ReadWriteOnceWithFSType, volumeLifecycleModes
/// [Persistent] when empty.
fn csidriver_defaults(obj: &mut Value) {
    if !obj["spec"].is_object() {
        obj["spec"] = json!({});
    }
    let spec = &mut obj["spec"];
    for (k, v) in [
        ("attachRequired", json!(true)),
        ("podInfoOnMount", json!(false)),
        ("storageCapacity", json!(false)),
        ("fsGroupPolicy", json!("ReadWriteOnceWithFSType")),
        ("requiresRepublish", json!(false)),
        ("seLinuxMount", json!(false)),
    ] {
        if spec.get(k).is_none_or(Value::is_null) {
            spec[k] = v;
        }
    }
    if spec["volumeLifecycleModes"]
        .as_array()
        .is_none_or(|m| m.is_empty())
    {
        spec["volumeLifecycleModes"] = json!(["Persistent"]);
    }
}
