//! Pod sources and their merger: the shared update types plus `PodConfig`, which mirrors
//! upstream's pkg/kubelet/config/config.go (podStorage.merge in incremental mode) and
//! pkg/kubelet/types/pod_update.go.

pub mod api;
pub mod file;
pub mod http;
pub mod static_pod;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

pub use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{mpsc, watch};

/// What a `PodUpdate` means, as upstream's kubetypes.PodOperation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodOperation {
    /// The full current set of one source (sources send this).
    Set,
    /// Pods new to their source.
    Add,
    /// Pods whose spec, labels or annotations changed.
    Update,
    /// Pods gracefully deleted in their source (deletionTimestamp set).
    Delete,
    /// Pods gone from their source.
    Remove,
    /// Pods whose only change is the status: the kubelet reconciles it.
    Reconcile,
}

/// One message on a source channel or on the merged output channel.
#[derive(Debug, Clone)]
pub struct PodUpdate {
    pub pods: Vec<Pod>,
    pub op: PodOperation,
    pub source: String,
}

pub const FILE_SOURCE: &str = "file";
pub const HTTP_SOURCE: &str = "http";
pub const API_SOURCE: &str = "api";

/// Annotations the kubelet manages itself (upstream kubetypes constants).
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
pub const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
pub const CONFIG_FIRST_SEEN_ANNOTATION: &str = "kubernetes.io/config.seen";
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";

/// Local annotations never count as a change of the pod (upstream localAnnotations).
const LOCAL_ANNOTATIONS: [&str; 3] = [
    CONFIG_SOURCE_ANNOTATION,
    CONFIG_MIRROR_ANNOTATION,
    CONFIG_FIRST_SEEN_ANNOTATION,
];

/// Capacity of each source channel and of the merger's inbox (upstream uses 50).
const CHANNEL_CAPACITY: usize = 50;

/// Errors of the pod sources.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("failed to read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: manifest is larger than {limit} bytes", path.display())]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("{}: couldn't parse as pod: {reason}", path.display())]
    Decode { path: PathBuf, reason: String },
    #[error("{}: invalid pod: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("{}: pod {name:?} has forbidden references to API objects: {references}", path.display())]
    ApiReferences {
        path: PathBuf,
        name: String,
        references: String,
    },
}

/// "name_namespace", as upstream's kubecontainer.GetPodFullName.
pub fn pod_full_name(pod: &Pod) -> String {
    format!(
        "{}_{}",
        pod.metadata.name.as_deref().unwrap_or(""),
        pod.metadata.namespace.as_deref().unwrap_or("")
    )
}

/// The pod's UID, "" when unset.
pub fn pod_uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or("")
}

/// Formats a time as upstream's RFC3339NanoFixed (always nine fraction digits), in UTC.
pub fn format_timestamp(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's civil_from_days).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// What merging one incoming pod did to the stored copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Add,
    Update,
    Delete,
    Reconcile,
    Unchanged,
}

/// Per-source pod state keyed by UID: the pure core of `PodConfig` (upstream podStorage).
#[derive(Debug, Default, Clone)]
pub struct PodStorage {
    pods: BTreeMap<String, BTreeMap<String, Pod>>,
    seen: BTreeSet<String>,
}

impl PodStorage {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sources that have sent at least one `Set`.
    pub fn seen_sources(&self) -> &BTreeSet<String> {
        &self.seen
    }

    /// The stored pods of one source, by UID order.
    pub fn source_pods(&self, source: &str) -> Vec<Pod> {
        self.pods
            .get(source)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// All stored pods of all sources.
    pub fn merged_state(&self) -> Vec<Pod> {
        self.pods
            .values()
            .flat_map(|m| m.values().cloned())
            .collect()
    }

    /// Applies one update of `source` and returns the incremental updates to deliver, in
    /// upstream's order: Remove, Add, Update, Delete, Reconcile. The first `Set` of a source
    /// that yields no Add/Update/Delete still produces an empty `Add`, which tells the
    /// kubelet the source is ready. `now` stamps config.seen on new pods that lack it.
    pub fn merge(&mut self, source: &str, update: PodUpdate, now: SystemTime) -> Vec<PodUpdate> {
        let seen_before = self.seen.contains(source);
        let stamp = format_timestamp(now);
        let mut adds = Vec::new();
        let mut updates = Vec::new();
        let mut deletes = Vec::new();
        let mut removes = Vec::new();
        let mut reconciles = Vec::new();
        let mut record = |outcome: Outcome, pod: &Pod| match outcome {
            Outcome::Add => adds.push(pod.clone()),
            Outcome::Update => updates.push(pod.clone()),
            Outcome::Delete => deletes.push(pod.clone()),
            Outcome::Reconcile => reconciles.push(pod.clone()),
            Outcome::Unchanged => {}
        };

        let mut pods = self.pods.remove(source).unwrap_or_default();
        match update.op {
            PodOperation::Add | PodOperation::Update | PodOperation::Delete => {
                tracing::debug!(source, op = ?update.op, count = update.pods.len(), "merging pods from source");
                for incoming in filter_duplicate_names(update.pods, source) {
                    let uid = pod_uid(&incoming).to_string();
                    let (pod, outcome) = merge_one(pods.remove(&uid), incoming, source, &stamp);
                    record(outcome, &pod);
                    pods.insert(uid, pod);
                }
            }
            PodOperation::Remove => {
                tracing::debug!(
                    source,
                    count = update.pods.len(),
                    "removing pods from source"
                );
                for gone in &update.pods {
                    if let Some(existing) = pods.remove(pod_uid(gone)) {
                        removes.push(existing);
                    }
                }
            }
            PodOperation::Set => {
                tracing::debug!(source, count = update.pods.len(), "setting pods of source");
                self.seen.insert(source.to_string());
                let old = std::mem::take(&mut pods);
                for incoming in filter_duplicate_names(update.pods, source) {
                    let uid = pod_uid(&incoming).to_string();
                    let (pod, outcome) =
                        merge_one(old.get(&uid).cloned(), incoming, source, &stamp);
                    record(outcome, &pod);
                    pods.insert(uid, pod);
                }
                removes.extend(
                    old.into_iter()
                        .filter(|(uid, _)| !pods.contains_key(uid))
                        .map(|(_, pod)| pod),
                );
            }
            PodOperation::Reconcile => {
                tracing::warn!(source, "ignoring a reconcile update sent by a source");
            }
        }
        self.pods.insert(source.to_string(), pods);

        let first_set = !seen_before && self.seen.contains(source);
        let ready_signal = first_set && adds.is_empty() && updates.is_empty() && deletes.is_empty();
        let mut out = Vec::new();
        let mut emit = |op: PodOperation, pods: Vec<Pod>, even_empty: bool| {
            if !pods.is_empty() || even_empty {
                out.push(PodUpdate {
                    pods,
                    op,
                    source: source.to_string(),
                });
            }
        };
        emit(PodOperation::Remove, removes, false);
        emit(PodOperation::Add, adds, ready_signal);
        emit(PodOperation::Update, updates, false);
        emit(PodOperation::Delete, deletes, false);
        emit(PodOperation::Reconcile, reconciles, false);
        out
    }
}

/// Drops pods whose full name repeats within one update; the first one wins (upstream
/// filterInvalidPods).
fn filter_duplicate_names(pods: Vec<Pod>, source: &str) -> Vec<Pod> {
    let mut names = BTreeSet::new();
    pods.into_iter()
        .filter(|pod| {
            let name = pod_full_name(pod);
            let fresh = names.insert(name.clone());
            if !fresh {
                tracing::warn!(pod = %name, pod_uid = pod_uid(pod), source, "pod failed validation due to duplicate pod name, ignoring");
            }
            fresh
        })
        .collect()
}

/// Merges one incoming pod into the stored copy (if any), returning what to store.
fn merge_one(
    existing: Option<Pod>,
    mut incoming: Pod,
    source: &str,
    stamp: &str,
) -> (Pod, Outcome) {
    // The source annotation is set before any comparison, as upstream does.
    incoming
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(CONFIG_SOURCE_ANNOTATION.to_string(), source.to_string());
    match existing {
        None => {
            // Upstream always stamps here; a source that already stamped the time it read
            // the pod (the file source) knows better, so keep that.
            incoming
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .entry(CONFIG_FIRST_SEEN_ANNOTATION.to_string())
                .or_insert_with(|| stamp.to_string());
            tracing::debug!(pod = %pod_full_name(&incoming), pod_uid = pod_uid(&incoming), source, "new pod from source");
            (incoming, Outcome::Add)
        }
        Some(mut existing) => {
            let outcome = check_and_update(&mut existing, incoming);
            (existing, outcome)
        }
    }
}

fn is_local_annotation(key: &str) -> bool {
    LOCAL_ANNOTATIONS.contains(&key)
}

/// Equal except for the kubelet's local annotations (upstream isAnnotationMapEqual).
fn annotations_equal(
    existing: Option<&BTreeMap<String, String>>,
    candidate: Option<&BTreeMap<String, String>>,
) -> bool {
    let empty = BTreeMap::new();
    let existing = existing.unwrap_or(&empty);
    let candidate = candidate.unwrap_or(&empty);
    let strip = |m: &BTreeMap<String, String>| -> BTreeMap<String, String> {
        m.iter()
            .filter(|(k, _)| !is_local_annotation(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    strip(existing) == strip(candidate)
}

fn pods_differ_semantically(existing: &Pod, incoming: &Pod) -> bool {
    let (e, i) = (&existing.metadata, &incoming.metadata);
    existing.spec != incoming.spec
        || labels_or_empty(e.labels.as_ref()) != labels_or_empty(i.labels.as_ref())
        || e.deletion_timestamp != i.deletion_timestamp
        || e.deletion_grace_period_seconds != i.deletion_grace_period_seconds
        || !annotations_equal(e.annotations.as_ref(), i.annotations.as_ref())
}

/// Go's DeepEqual treats a nil map and an empty map as different, but k8s-openapi folds
/// both into `None` on decode anyway; compare them as equal so a re-encoded pod never
/// looks changed.
fn labels_or_empty(labels: Option<&BTreeMap<String, String>>) -> BTreeMap<String, String> {
    labels.cloned().unwrap_or_default()
}

/// Upstream checkAndUpdatePod: folds `incoming` into `existing` and says what changed.
fn check_and_update(existing: &mut Pod, mut incoming: Pod) -> Outcome {
    if !pods_differ_semantically(existing, &incoming) {
        // Only the status may differ: the kubelet is the source of truth for it.
        if existing.status != incoming.status {
            existing.status = incoming.status;
            return Outcome::Reconcile;
        }
        return Outcome::Unchanged;
    }

    // Keep our own first-seen time, and the other local annotations of the stored copy.
    let mut annotations = incoming.metadata.annotations.take().unwrap_or_default();
    if let Some(old) = existing.metadata.annotations.as_ref() {
        for key in LOCAL_ANNOTATIONS {
            match old.get(key) {
                Some(v) => {
                    annotations.insert(key.to_string(), v.clone());
                }
                None if key == CONFIG_FIRST_SEEN_ANNOTATION => {
                    annotations.remove(key);
                }
                None => {}
            }
        }
    }
    existing.spec = incoming.spec;
    existing.metadata.labels = incoming.metadata.labels;
    existing.metadata.deletion_timestamp = incoming.metadata.deletion_timestamp;
    existing.metadata.deletion_grace_period_seconds =
        incoming.metadata.deletion_grace_period_seconds;
    existing.metadata.generation = incoming.metadata.generation;
    existing.status = incoming.status;
    existing.metadata.annotations = Some(annotations);

    if existing.metadata.deletion_timestamp.is_some() {
        Outcome::Delete
    } else {
        Outcome::Update
    }
}

/// Merges the pod sources into one stream of incremental updates (upstream PodConfig in
/// PodConfigNotificationIncremental mode). Must be created inside a tokio runtime.
#[derive(Debug)]
pub struct PodConfig {
    inbox: mpsc::Sender<PodUpdate>,
    sources: Arc<Mutex<BTreeSet<String>>>,
    seen: watch::Receiver<BTreeSet<String>>,
}

impl PodConfig {
    /// Starts the merger task, which delivers on `out` until every source channel and this
    /// `PodConfig` are dropped, or `out` is closed.
    pub fn new(out: mpsc::Sender<PodUpdate>) -> Self {
        let (inbox, mut rx) = mpsc::channel::<PodUpdate>(CHANNEL_CAPACITY);
        let (seen_tx, seen) = watch::channel(BTreeSet::new());
        tokio::spawn(async move {
            let mut storage = PodStorage::new();
            while let Some(update) = rx.recv().await {
                let source = update.source.clone();
                for merged in storage.merge(&source, update, SystemTime::now()) {
                    if out.send(merged).await.is_err() {
                        tracing::debug!(
                            "pod update receiver dropped, stopping the pod config merger"
                        );
                        return;
                    }
                }
                // Published after the updates are queued, so "all sources seen" never
                // runs ahead of the pods that made it true.
                if *seen_tx.borrow() != *storage.seen_sources() {
                    seen_tx.send_replace(storage.seen_sources().clone());
                }
            }
        });
        Self {
            inbox,
            sources: Arc::new(Mutex::new(BTreeSet::new())),
            seen,
        }
    }

    /// A channel for one source: whatever is sent on it is merged as coming from `source`
    /// (the `source` field of the sent updates is overwritten). Spawns a forwarding task, so
    /// it must be called inside a tokio runtime.
    pub fn channel(&self, source: &str) -> mpsc::Sender<PodUpdate> {
        self.sources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(source.to_string());
        let (tx, mut rx) = mpsc::channel::<PodUpdate>(CHANNEL_CAPACITY);
        let inbox = self.inbox.clone();
        let source = source.to_string();
        tokio::spawn(async move {
            while let Some(mut update) = rx.recv().await {
                update.source.clone_from(&source);
                if inbox.send(update).await.is_err() {
                    return;
                }
            }
        });
        tx
    }

    /// True once every source in `expected` and every source with a channel has sent a
    /// `Set` (upstream SeenAllSources). The kubelet must not clean up pods before that.
    pub fn seen_all_sources(&self, expected: &[&str]) -> bool {
        let seen = self.seen.borrow();
        let registered = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        expected.iter().all(|s| seen.contains(*s)) && registered.iter().all(|s| seen.contains(s))
    }

    /// The sources that have sent at least one `Set`, updated as they do.
    pub fn seen_sources(&self) -> watch::Receiver<BTreeSet<String>> {
        self.seen.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use std::time::Duration;

    fn pod(name: &str, uid: &str, image: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some("default".to_string()),
                uid: Some(uid.to_string()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".to_string(),
                    image: Some(image.to_string()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        }
    }

    fn set(pods: Vec<Pod>) -> PodUpdate {
        PodUpdate {
            pods,
            op: PodOperation::Set,
            source: API_SOURCE.to_string(),
        }
    }

    fn ops(updates: &[PodUpdate]) -> Vec<(PodOperation, Vec<String>)> {
        updates
            .iter()
            .map(|u| {
                (
                    u.op,
                    u.pods.iter().map(|p| pod_uid(p).to_string()).collect(),
                )
            })
            .collect()
    }

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000)
    }

    #[test]
    fn helpers() {
        let p = pod("web", "u1", "nginx");
        assert_eq!(pod_full_name(&p), "web_default");
        assert_eq!(pod_uid(&p), "u1");
        assert_eq!(pod_uid(&Pod::default()), "");
        assert_eq!(
            format_timestamp(UNIX_EPOCH),
            "1970-01-01T00:00:00.000000000Z"
        );
        assert_eq!(
            format_timestamp(UNIX_EPOCH + Duration::new(1_709_210_096, 5)),
            "2024-02-29T12:34:56.000000005Z"
        );
    }

    #[test]
    fn first_set_adds_and_marks_seen() {
        let mut s = PodStorage::new();
        let out = s.merge(
            API_SOURCE,
            set(vec![pod("a", "1", "x"), pod("b", "2", "x")]),
            now(),
        );
        assert_eq!(
            ops(&out),
            vec![(PodOperation::Add, vec!["1".to_string(), "2".to_string()])]
        );
        assert!(s.seen_sources().contains(API_SOURCE));
        let added = &out[0].pods[0];
        let ann = added.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[CONFIG_SOURCE_ANNOTATION], API_SOURCE);
        assert_eq!(ann[CONFIG_FIRST_SEEN_ANNOTATION], format_timestamp(now()));
    }

    #[test]
    fn empty_first_set_sends_empty_add_once() {
        let mut s = PodStorage::new();
        let out = s.merge(FILE_SOURCE, set(vec![]), now());
        assert_eq!(ops(&out), vec![(PodOperation::Add, vec![])]);
        assert_eq!(out[0].source, FILE_SOURCE);
        assert!(s.merge(FILE_SOURCE, set(vec![]), now()).is_empty());
    }

    #[test]
    fn unchanged_set_is_silent_and_keeps_first_seen() {
        let mut s = PodStorage::new();
        s.merge(API_SOURCE, set(vec![pod("a", "1", "x")]), now());
        let later = now() + Duration::from_secs(60);
        assert!(s
            .merge(API_SOURCE, set(vec![pod("a", "1", "x")]), later)
            .is_empty());
        let stored = &s.source_pods(API_SOURCE)[0];
        assert_eq!(
            stored.metadata.annotations.as_ref().unwrap()[CONFIG_FIRST_SEEN_ANNOTATION],
            format_timestamp(now())
        );
    }

    #[test]
    fn spec_change_is_update_keeping_local_annotations() {
        let mut s = PodStorage::new();
        s.merge(API_SOURCE, set(vec![pod("a", "1", "x")]), now());
        let mut changed = pod("a", "1", "y");
        changed.metadata.annotations = Some(BTreeMap::from([
            (
                CONFIG_FIRST_SEEN_ANNOTATION.to_string(),
                "bogus".to_string(),
            ),
            ("team".to_string(), "blue".to_string()),
        ]));
        let out = s.merge(
            API_SOURCE,
            set(vec![changed]),
            now() + Duration::from_secs(5),
        );
        assert_eq!(
            ops(&out),
            vec![(PodOperation::Update, vec!["1".to_string()])]
        );
        let updated = &out[0].pods[0];
        assert_eq!(
            updated.spec.as_ref().unwrap().containers[0]
                .image
                .as_deref(),
            Some("y")
        );
        let ann = updated.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[CONFIG_FIRST_SEEN_ANNOTATION], format_timestamp(now()));
        assert_eq!(ann["team"], "blue");
        assert_eq!(ann[CONFIG_SOURCE_ANNOTATION], API_SOURCE);
    }

    #[test]
    fn label_and_annotation_changes_are_updates_local_ones_are_not() {
        let mut s = PodStorage::new();
        s.merge(API_SOURCE, set(vec![pod("a", "1", "x")]), now());
        let mut local_only = pod("a", "1", "x");
        local_only.metadata.annotations = Some(BTreeMap::from([(
            CONFIG_MIRROR_ANNOTATION.to_string(),
            "m".to_string(),
        )]));
        assert!(s.merge(API_SOURCE, set(vec![local_only]), now()).is_empty());

        let mut labelled = pod("a", "1", "x");
        labelled.metadata.labels = Some(BTreeMap::from([("k".to_string(), "v".to_string())]));
        let out = s.merge(API_SOURCE, set(vec![labelled]), now());
        assert_eq!(
            ops(&out),
            vec![(PodOperation::Update, vec!["1".to_string()])]
        );
    }

    #[test]
    fn status_only_change_is_reconcile() {
        let mut s = PodStorage::new();
        s.merge(API_SOURCE, set(vec![pod("a", "1", "x")]), now());
        let mut with_status = pod("a", "1", "x");
        with_status.status = Some(PodStatus {
            phase: Some("Running".to_string()),
            ..Default::default()
        });
        let out = s.merge(API_SOURCE, set(vec![with_status]), now());
        assert_eq!(
            ops(&out),
            vec![(PodOperation::Reconcile, vec!["1".to_string()])]
        );
        assert_eq!(
            out[0].pods[0].status.as_ref().unwrap().phase.as_deref(),
            Some("Running")
        );
    }

    #[test]
    fn deletion_timestamp_is_graceful_delete() {
        let mut s = PodStorage::new();
        s.merge(API_SOURCE, set(vec![pod("a", "1", "x")]), now());
        let mut deleting = pod("a", "1", "x");
        deleting.metadata.deletion_timestamp = Some(Time("2024-01-01T00:00:00Z".parse().unwrap()));
        deleting.metadata.deletion_grace_period_seconds = Some(30);
        let out = s.merge(API_SOURCE, set(vec![deleting]), now());
        assert_eq!(
            ops(&out),
            vec![(PodOperation::Delete, vec!["1".to_string()])]
        );
        assert_eq!(
            out[0].pods[0].metadata.deletion_grace_period_seconds,
            Some(30)
        );
    }

    #[test]
    fn missing_from_set_is_remove_and_order_is_remove_then_add() {
        let mut s = PodStorage::new();
        s.merge(API_SOURCE, set(vec![pod("a", "1", "x")]), now());
        let out = s.merge(API_SOURCE, set(vec![pod("b", "2", "x")]), now());
        assert_eq!(
            ops(&out),
            vec![
                (PodOperation::Remove, vec!["1".to_string()]),
                (PodOperation::Add, vec!["2".to_string()]),
            ]
        );
        assert_eq!(s.source_pods(API_SOURCE).len(), 1);
    }

    #[test]
    fn incremental_ops_from_a_source() {
        let mut s = PodStorage::new();
        let add = PodUpdate {
            pods: vec![pod("a", "1", "x")],
            op: PodOperation::Add,
            source: HTTP_SOURCE.to_string(),
        };
        assert_eq!(
            ops(&s.merge(HTTP_SOURCE, add, now())),
            vec![(PodOperation::Add, vec!["1".to_string()])]
        );
        // Incremental ops do not mark the source as seen; only a Set does.
        assert!(!s.seen_sources().contains(HTTP_SOURCE));
        let update = PodUpdate {
            pods: vec![pod("a", "1", "z")],
            op: PodOperation::Update,
            source: HTTP_SOURCE.to_string(),
        };
        assert_eq!(
            ops(&s.merge(HTTP_SOURCE, update, now())),
            vec![(PodOperation::Update, vec!["1".to_string()])]
        );
        let remove = PodUpdate {
            pods: vec![pod("a", "1", "z"), pod("ghost", "9", "z")],
            op: PodOperation::Remove,
            source: HTTP_SOURCE.to_string(),
        };
        assert_eq!(
            ops(&s.merge(HTTP_SOURCE, remove, now())),
            vec![(PodOperation::Remove, vec!["1".to_string()])]
        );
        assert!(s.merged_state().is_empty());
    }

    #[test]
    fn duplicate_full_names_keep_the_first() {
        let mut s = PodStorage::new();
        let out = s.merge(
            API_SOURCE,
            set(vec![pod("a", "1", "x"), pod("a", "2", "y")]),
            now(),
        );
        assert_eq!(ops(&out), vec![(PodOperation::Add, vec!["1".to_string()])]);
    }

    #[test]
    fn sources_are_independent() {
        let mut s = PodStorage::new();
        s.merge(API_SOURCE, set(vec![pod("a", "1", "x")]), now());
        let out = s.merge(FILE_SOURCE, set(vec![]), now());
        assert_eq!(ops(&out), vec![(PodOperation::Add, vec![])]);
        assert_eq!(s.merged_state().len(), 1);
    }

    async fn recv(rx: &mut mpsc::Receiver<PodUpdate>) -> PodUpdate {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("timed out waiting for a pod update")
            .expect("merger stopped")
    }

    #[tokio::test]
    async fn pod_config_merges_sources_and_tracks_seen() {
        let (out_tx, mut out) = mpsc::channel(16);
        let config = PodConfig::new(out_tx);
        let api = config.channel(API_SOURCE);
        let file = config.channel(FILE_SOURCE);
        assert!(!config.seen_all_sources(&[]));

        // The channel decides the source, whatever the update says.
        let mut wrong = set(vec![pod("a", "1", "x")]);
        wrong.source = "bogus".to_string();
        api.send(wrong).await.unwrap();
        let u = recv(&mut out).await;
        assert_eq!(
            (u.op, u.source.as_str(), u.pods.len()),
            (PodOperation::Add, API_SOURCE, 1)
        );
        assert!(!config.seen_all_sources(&[API_SOURCE]));

        file.send(set(vec![])).await.unwrap();
        let u = recv(&mut out).await;
        assert_eq!(
            (u.op, u.source.as_str(), u.pods.len()),
            (PodOperation::Add, FILE_SOURCE, 0)
        );
        let mut seen = config.seen_sources();
        tokio::time::timeout(
            Duration::from_secs(5),
            seen.wait_for(|s| s.contains(FILE_SOURCE) && s.contains(API_SOURCE)),
        )
        .await
        .unwrap()
        .unwrap();
        assert!(config.seen_all_sources(&[API_SOURCE, FILE_SOURCE]));
        assert!(!config.seen_all_sources(&[HTTP_SOURCE]));

        api.send(set(vec![])).await.unwrap();
        let u = recv(&mut out).await;
        assert_eq!((u.op, u.pods.len()), (PodOperation::Remove, 1));
    }
}
