//! The API server source (upstream `config/apiserver.go`): pods bound to
//! this node, listed and watched with the `spec.nodeName=<node>` field
//! selector (the node authorizer lets a kubelet see nothing else), sent as
//! the source's full set after each change. The watcher re-lists on 410
//! Gone and retries a lost API server with backoff; running pods are never
//! touched because of either, since the set only changes when the API
//! server says so. Mirror pods (the API copies of static pods) are not run:
//! they are handed to `MirrorPods` for the mirror-pod and status logic.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::Api;
use parking_lot::RwLock;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::{pod_full_name, PodOperation, PodUpdate, API_SOURCE, CONFIG_MIRROR_ANNOTATION};
use crate::apiclient::ApiClient;

/// Mirror pods seen in the API, by full name (`<name>_<namespace>`).
#[derive(Debug, Default, Clone)]
pub struct MirrorPods(Arc<RwLock<BTreeMap<String, Pod>>>);

impl MirrorPods {
    pub fn get(&self, full_name: &str) -> Option<Pod> {
        self.0.read().get(full_name).cloned()
    }

    pub fn all(&self) -> Vec<Pod> {
        self.0.read().values().cloned().collect()
    }

    /// Records a mirror pod this kubelet created or found, before the
    /// watch reports it: after an outage the watch may still be backing
    /// off, and the static pod's status must not wait for it.
    pub fn insert(&self, pod: Pod) {
        let mut m = self.0.write();
        m.insert(pod_full_name(&pod), pod);
        crate::metrics::set_mirror_pods(m.len());
    }

    fn replace(&self, pods: BTreeMap<String, Pod>) {
        crate::metrics::set_mirror_pods(pods.len());
        *self.0.write() = pods;
    }
}

pub fn is_mirror_pod(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(CONFIG_MIRROR_ANNOTATION))
}

/// Splits the API's pods into the pods to run and the mirror pods.
fn split(pods: &BTreeMap<String, Pod>) -> (Vec<Pod>, BTreeMap<String, Pod>) {
    let mut run = Vec::new();
    let mut mirrors = BTreeMap::new();
    for p in pods.values() {
        if is_mirror_pod(p) {
            mirrors.insert(pod_full_name(p), p.clone());
        } else {
            run.push(p.clone());
        }
    }
    (run, mirrors)
}

/// Watches this node's pods until `token` is cancelled.
pub fn spawn_api_source(
    tasks: &tokio_util::task::TaskTracker,
    api: ApiClient,
    node_name: String,
    out: mpsc::Sender<PodUpdate>,
    mirrors: MirrorPods,
    token: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let span = tracing::info_span!("api-source", node = %node_name);
    tasks.spawn(tracing::Instrument::instrument(
        async move {
            tokio::select! {
                _ = token.cancelled() => {}
                _ = run(api, node_name, out, mirrors) => {}
            }
        },
        span,
    ))
}

async fn run(api: ApiClient, node_name: String, out: mpsc::Sender<PodUpdate>, mirrors: MirrorPods) {
    let mut generation = api.generation();
    let mut store: BTreeMap<String, Pod> = BTreeMap::new();
    loop {
        generation.borrow_and_update();
        let pods: Api<Pod> = Api::all(api.client().await);
        let cfg = watcher::Config::default()
            .fields(&format!("spec.nodeName={node_name}"))
            // The server closes each watch within this, and it is opened
            // again from the last resourceVersion (client-go's reflector does
            // the same with a random 5-10 min).
            .timeout(290);
        let stream = watcher(pods, cfg).default_backoff().boxed();
        tokio::select! {
            // New credentials (a rotated certificate): watch again with
            // them. The re-list replaces the set; pods that stay are untouched.
            _ = generation.changed() => {
                debug!("API client changed; reopening the pod watch");
                continue;
            }
            done = follow(stream, &mut store, &out, &mirrors) => {
                if done { return; }
            }
        }
    }
}

/// Applies watch events to `store` and sends the set after each change.
/// True when the output channel is closed.
async fn follow(
    mut stream: futures::stream::BoxStream<'_, Result<watcher::Event<Pod>, watcher::Error>>,
    store: &mut BTreeMap<String, Pod>,
    out: &mpsc::Sender<PodUpdate>,
    mirrors: &MirrorPods,
) -> bool {
    let mut init: Option<BTreeMap<String, Pod>> = None;
    let uid = |p: &Pod| p.metadata.uid.clone().unwrap_or_default();
    while let Some(ev) = stream.next().await {
        let changed = match ev {
            Ok(watcher::Event::Init) => {
                init = Some(BTreeMap::new());
                false
            }
            Ok(watcher::Event::InitApply(p)) => {
                if let Some(buf) = init.as_mut() {
                    buf.insert(uid(&p), p);
                }
                false
            }
            Ok(watcher::Event::InitDone) => {
                // A re-list (first start, or after 410 Gone) replaces the set
                // at once: pods that stayed keep running untouched.
                let listed = init.take().unwrap_or_default();
                // Pods deleted while the watch was down leave no Delete.
                store
                    .keys()
                    .filter(|u| !listed.contains_key(*u))
                    .for_each(|u| crate::metrics::startup::forget(u));
                *store = listed;
                store
                    .values()
                    .for_each(crate::metrics::startup::observed_on_watch);
                true
            }
            Ok(watcher::Event::Apply(p)) => {
                // The startup SLI ends when the watch shows the pod started.
                crate::metrics::startup::observed_on_watch(&p);
                store.insert(uid(&p), p);
                true
            }
            Ok(watcher::Event::Delete(p)) => {
                crate::metrics::startup::forget(&uid(&p));
                store.remove(&uid(&p));
                true
            }
            Err(e) => {
                warn!(error = %e, "watch of this node's pods failed; retrying with backoff");
                false
            }
        };
        if !changed {
            continue;
        }
        let (run, mirror) = split(store);
        mirrors.replace(mirror);
        debug!(pods = run.len(), "API pods changed");
        let update = PodUpdate {
            pods: run,
            op: PodOperation::Set,
            source: API_SOURCE.to_string(),
        };
        if out.send(update).await.is_err() {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror_pods_are_kept_apart_from_the_pods_to_run() {
        let pod = |name: &str, mirror: bool| {
            let mut p = Pod::default();
            p.metadata.name = Some(name.into());
            p.metadata.namespace = Some("kube-system".into());
            p.metadata.uid = Some(format!("u-{name}"));
            if mirror {
                p.metadata.annotations =
                    Some([(CONFIG_MIRROR_ANNOTATION.to_string(), "h".to_string())].into());
            }
            p
        };
        let store: BTreeMap<_, _> = [pod("a", false), pod("etcd-n1", true)]
            .into_iter()
            .map(|p| (p.metadata.uid.clone().unwrap(), p))
            .collect();
        let (run, mirrors) = split(&store);
        assert_eq!(run.len(), 1);
        assert_eq!(run[0].metadata.name.as_deref(), Some("a"));
        assert!(mirrors.contains_key("etcd-n1_kube-system"));
    }
}
