//! The event recorder (upstream client-go `tools/record` as the kubelet
//! uses it): core/v1 Events with `source.component: kubelet`, `source.host`
//! and `reportingInstance` the node, and upstream's reasons. Identical
//! events (same object, field path, type, reason and message) within ten
//! minutes are aggregated into one Event whose `count` and `lastTimestamp`
//! are patched, as the EventCorrelator does. Posting is limited to
//! `eventRecordQPS`/`eventBurst`; events are dropped, never queued forever:
//! a full queue, an API error or an absent API server loses them (logged at
//! debug), and recording never blocks the caller.
//!
//! In standalone mode no recorder is installed and recording costs nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::apiclient::{ApiClient, RateLimiter};

pub const NORMAL: &str = "Normal";
pub const WARNING: &str = "Warning";

/// Events waiting to be posted; beyond this they are dropped.
const QUEUE: usize = 1000;
/// Aggregation window and the most keys remembered (LRU-ish: oldest go).
const AGGREGATE_FOR: Duration = Duration::from_secs(600);
const MAX_KEYS: usize = 4096;

struct Pending {
    object: ObjectReference,
    kind: &'static str,
    reason: String,
    message: String,
    /// The Event's own annotations (upstream's AnnotatedEventf).
    annotations: BTreeMap<String, String>,
}

static SINK: OnceLock<mpsc::Sender<Pending>> = OnceLock::new();

/// Events recorded in unit tests, which install no sink: (object name,
/// type, reason, message).
#[cfg(test)]
pub static CAPTURED: std::sync::Mutex<Vec<(String, &'static str, String, String)>> =
    std::sync::Mutex::new(Vec::new());

/// The events unit tests recorded about the object named `name`.
#[cfg(test)]
pub fn captured(name: &str) -> Vec<(&'static str, String, String)> {
    CAPTURED
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.0 == name)
        .map(|e| (e.1, e.2.clone(), e.3.clone()))
        .collect()
}

/// Records an event about `object` (never blocks; dropped if the queue is full).
pub fn record(object: ObjectReference, kind: &'static str, reason: &str, message: String) {
    record_annotated(object, kind, reason, message, BTreeMap::new());
}

/// `record` with annotations on the Event object (upstream's
/// AnnotatedEventf, which the eviction manager uses).
pub fn record_annotated(
    object: ObjectReference,
    kind: &'static str,
    reason: &str,
    message: String,
    annotations: BTreeMap<String, String>,
) {
    #[cfg(test)]
    CAPTURED.lock().unwrap().push((
        object.name.clone().unwrap_or_default(),
        kind,
        reason.to_string(),
        message.clone(),
    ));
    let Some(tx) = SINK.get() else { return };
    let p = Pending {
        object,
        kind,
        reason: reason.to_string(),
        message,
        annotations,
    };
    if tx.try_send(p).is_err() {
        debug!(reason, "event dropped: recorder queue full");
    }
}

/// The reference upstream's recorder takes for a pod, with the container's
/// field path (`spec.containers{name}`) when the event is about one.
pub fn pod_ref(pod: &Pod, container: Option<(&str, bool)>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: pod.metadata.name.clone(),
        namespace: pod.metadata.namespace.clone(),
        uid: pod.metadata.uid.clone(),
        field_path: container.map(|(name, init)| {
            let ephemeral = pod
                .spec
                .iter()
                .flat_map(|s| s.ephemeral_containers.iter().flatten())
                .any(|e| e.name == name);
            if ephemeral {
                format!("spec.ephemeralContainers{{{name}}}")
            } else if init {
                format!("spec.initContainers{{{name}}}")
            } else {
                format!("spec.containers{{{name}}}")
            }
        }),
        ..Default::default()
    }
}

/// Records an annotated event about a pod.
pub fn pod_annotated(
    pod: &Pod,
    kind: &'static str,
    reason: &str,
    message: String,
    annotations: BTreeMap<String, String>,
) {
    if SINK.get().is_some() || cfg!(test) {
        record_annotated(pod_ref(pod, None), kind, reason, message, annotations);
    }
}

/// Records an event about a pod, or one of its containers.
pub fn pod(
    pod: &Pod,
    container: Option<(&str, bool)>,
    kind: &'static str,
    reason: &str,
    message: String,
) {
    if SINK.get().is_some() || cfg!(test) {
        record(pod_ref(pod, container), kind, reason, message);
    }
}

/// The node's reference (upstream kl.nodeRef: kind Node, name and UID the
/// node name, no namespace).
pub fn node_ref(node: &str) -> ObjectReference {
    ObjectReference {
        kind: Some("Node".into()),
        name: Some(node.into()),
        uid: Some(node.into()),
        ..Default::default()
    }
}

/// Installs the recorder and starts posting until `token` is cancelled.
/// A second install is ignored.
pub fn install(
    tasks: &tokio_util::task::TaskTracker,
    api: ApiClient,
    node: String,
    qps: i32,
    burst: i32,
    token: CancellationToken,
) {
    let (tx, rx) = mpsc::channel(QUEUE);
    if SINK.set(tx).is_err() {
        return;
    }
    let span = tracing::info_span!("events");
    tasks.spawn(tracing::Instrument::instrument(
        async move {
            tokio::select! {
                _ = token.cancelled() => {}
                _ = post_loop(api, node, qps, burst, rx) => {}
            }
        },
        span,
    ));
}

#[derive(Hash, PartialEq, Eq, Clone)]
struct Key {
    uid: String,
    field_path: String,
    kind: &'static str,
    reason: String,
    message: String,
}

struct Seen {
    name: String,
    namespace: String,
    count: i32,
    at: tokio::time::Instant,
}

/// Upstream's recorder tries an event this many times in all...
const MAX_TRIES: u32 = 12;
/// ...sleeping this long between tries (the first sleep jittered).
const RETRY_SLEEP: Duration = Duration::from_secs(10);

/// Whether a failed post is tried again, and after how long (client-go's
/// recordToSink/recordEvent): an answer from the API server (the event
/// is rejected, or already exists) is final; a transport error is retried
/// up to `MAX_TRIES` in all. Meanwhile new events wait in the bounded
/// queue, and are dropped when it is full.
fn retry_after(err: &kube::Error, tries: u32) -> Option<Duration> {
    if matches!(err, kube::Error::Api(_)) || tries >= MAX_TRIES {
        return None;
    }
    if tries == 1 {
        let jitter = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0) as f64
            / 1e9;
        return Some(RETRY_SLEEP.mul_f64(jitter));
    }
    Some(RETRY_SLEEP)
}

async fn post_loop(
    api: ApiClient,
    node: String,
    qps: i32,
    burst: i32,
    mut rx: mpsc::Receiver<Pending>,
) {
    // Upstream: eventRecordQPS 0 means no limit.
    let limiter = (qps > 0).then(|| RateLimiter::new(qps, burst));
    let mut seen: HashMap<Key, Seen> = HashMap::new();
    while let Some(p) = rx.recv().await {
        if let Some(l) = &limiter {
            l.acquire().await;
        }
        let now = crate::nodestatus::now();
        let key = Key {
            uid: p.object.uid.clone().unwrap_or_default(),
            field_path: p.object.field_path.clone().unwrap_or_default(),
            kind: p.kind,
            reason: p.reason.clone(),
            message: p.message.clone(),
        };
        seen.retain(|_, s| s.at.elapsed() < AGGREGATE_FOR);
        if seen.len() >= MAX_KEYS {
            if let Some(oldest) = seen
                .iter()
                .min_by_key(|(_, s)| s.at)
                .map(|(k, _)| k.clone())
            {
                seen.remove(&oldest);
            }
        }
        let namespace = p
            .object
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into());
        if let Some(s) = seen.get_mut(&key) {
            let patch = serde_json::json!({"count": s.count + 1, "lastTimestamp": now});
            let events: Api<Event> = Api::namespaced(api.client().await, &s.namespace);
            match events
                .patch(&s.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    s.count += 1;
                    s.at = tokio::time::Instant::now();
                    continue;
                }
                Err(e) => {
                    debug!(reason = %p.reason, error = %e, "event aggregation failed; posting anew");
                    seen.remove(&key);
                }
            }
        }
        let stamp = now.0.as_nanosecond();
        let name = format!("{}.{:x}", p.object.name.clone().unwrap_or_default(), stamp);
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                annotations: (!p.annotations.is_empty()).then_some(p.annotations),
                ..Default::default()
            },
            involved_object: p.object,
            reason: Some(p.reason.clone()),
            message: Some(p.message),
            source: Some(EventSource {
                component: Some("kubelet".into()),
                host: Some(node.clone()),
            }),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now.clone()),
            count: Some(1),
            type_: Some(p.kind.to_string()),
            reporting_component: Some("kubelet".into()),
            reporting_instance: Some(node.clone()),
            ..Default::default()
        };
        let mut tries = 0;
        let created = loop {
            tries += 1;
            let events: Api<Event> = Api::namespaced(api.client().await, &namespace);
            let err = match events.create(&PostParams::default(), &ev).await {
                Ok(_) => break Ok(()),
                Err(e) => e,
            };
            match retry_after(&err, tries) {
                Some(wait) => {
                    debug!(reason = %p.reason, error = %err, retry_in = ?wait, "unable to write event; may retry after sleeping");
                    tokio::time::sleep(wait).await;
                }
                None => break Err(err),
            }
        };
        match created {
            Ok(()) => {
                seen.insert(
                    key,
                    Seen {
                        name,
                        namespace,
                        count: 1,
                        at: tokio::time::Instant::now(),
                    },
                );
            }
            Err(e) => {
                debug!(reason = %p.reason, error = %e, "event dropped: the API server refused it or is away")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_errors_are_retried_a_bounded_number_of_times_api_answers_never() {
        let transport = kube::Error::Service(Box::new(std::io::Error::other("connection refused")));
        assert!(retry_after(&transport, 1).is_some_and(|d| d <= RETRY_SLEEP));
        assert_eq!(retry_after(&transport, 2), Some(RETRY_SLEEP));
        assert_eq!(retry_after(&transport, MAX_TRIES - 1), Some(RETRY_SLEEP));
        assert_eq!(retry_after(&transport, MAX_TRIES), None);
        let rejected = kube::Error::Api(Box::new(
            serde_json::from_value(serde_json::json!({
                "status": "Failure", "message": "invalid", "reason": "Invalid", "code": 422
            }))
            .unwrap(),
        ));
        assert_eq!(retry_after(&rejected, 1), None);
    }

    #[test]
    fn container_events_carry_upstreams_field_paths() {
        let mut p = Pod::default();
        p.metadata.name = Some("web".into());
        p.metadata.namespace = Some("default".into());
        p.metadata.uid = Some("u1".into());
        let r = pod_ref(&p, Some(("app", false)));
        assert_eq!(r.field_path.as_deref(), Some("spec.containers{app}"));
        assert_eq!(r.kind.as_deref(), Some("Pod"));
        let r = pod_ref(&p, Some(("init", true)));
        assert_eq!(r.field_path.as_deref(), Some("spec.initContainers{init}"));
        assert_eq!(pod_ref(&p, None).field_path, None);
        let n = node_ref("n1");
        assert_eq!(
            (n.kind.as_deref(), n.uid.as_deref()),
            (Some("Node"), Some("n1"))
        );
    }
}
