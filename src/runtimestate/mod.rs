//! The container runtime's health as the kubelet sees it (upstream
//! `pkg/kubelet/runtime.go` runtimeState, fed by `updateRuntimeUp` every
//! 5 s): whether CRI `Status` answers, and its RuntimeReady and
//! NetworkReady conditions. Readers get the last answer without a CRI call,
//! so `/healthz` and the pod workers never wait on a slow runtime.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};

use crate::cri::{v1, RuntimeService};

/// Upstream polls the runtime's status every 5 s.
pub const POLL_PERIOD: Duration = Duration::from_secs(5);
/// Upstream maxWaitForContainerRuntime: no good answer for this long and
/// the runtime counts as down.
pub const RUNTIME_SYNC_THRESHOLD: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
struct Inner {
    /// When RuntimeReady was last seen true.
    last_ok: Option<Instant>,
    runtime_error: Option<String>,
    network_error: Option<String>,
    /// Why the last Status call failed, if it did.
    unreachable: Option<String>,
    /// The handlers the runtime reported (CRI 1.30+; containerd 1.7 sends
    /// none), for the Node's status.runtimeHandlers.
    handlers: Vec<v1::RuntimeHandler>,
    /// The runtime's features (CRI 1.31+), if it reported any.
    features: Option<v1::RuntimeFeatures>,
    /// The pod CIDR last given to the runtime (upstream runtimeState.podCIDR).
    pod_cidr: String,
}

/// A cheap, clonable view of the runtime's last reported state.
#[derive(Clone, Default)]
pub struct RuntimeState {
    inner: Arc<RwLock<Inner>>,
}

/// Upstream formats a condition as `Type=bool reason:R message:M`.
fn condition_text(c: Option<&v1::RuntimeCondition>, ty: &str) -> String {
    match c {
        Some(c) => format!(
            "{}={} reason:{} message:{}",
            c.r#type, c.status, c.reason, c.message
        ),
        None => format!("{ty} condition missing"),
    }
}

impl RuntimeState {
    /// Upstream's updatePodCIDR: tells the runtime a pod CIDR that differs
    /// from the last one it was told (CRI UpdateRuntimeConfig); true when it
    /// changed. On failure the old value stays, so the next call retries.
    pub async fn update_pod_cidr(
        &self,
        runtime: &dyn RuntimeService,
        cidr: &str,
    ) -> Result<bool, crate::cri::CriError> {
        let was = self.inner.read().pod_cidr.clone();
        if was == cidr {
            return Ok(false);
        }
        info!(cidr, "updating runtime config through cri with pod CIDR");
        runtime.update_runtime_config(cidr).await?;
        info!(original_pod_cidr = %was, new_pod_cidr = %cidr, "updating pod CIDR");
        self.inner.write().pod_cidr = cidr.to_string();
        Ok(true)
    }

    /// Asks the runtime for its status and records the answer (upstream's
    /// updateRuntimeUp): the poller's step, and the start-up fast path's.
    pub async fn refresh(&self, runtime: &dyn RuntimeService) {
        self.record(runtime.status().await.map_err(|e| e.to_string()));
    }

    /// Records one CRI Status answer (or failure), as updateRuntimeUp does.
    pub fn record(&self, r: Result<v1::StatusResponse, String>) {
        let mut s = self.inner.write();
        let status = match r {
            Ok(st) => st,
            Err(e) => {
                // Upstream keeps the old state and lets the threshold turn
                // it into "runtime is down"; rkubelet also says so at once,
                // its documented /healthz choice.
                s.unreachable = Some(e);
                return;
            }
        };
        s.unreachable = None;
        s.handlers = status.runtime_handlers;
        s.features = status.features;
        let conds = status.status.map(|st| st.conditions).unwrap_or_default();
        let find = |ty: &str| conds.iter().find(|c| c.r#type == ty);
        let net = find("NetworkReady");
        s.network_error = (!net.is_some_and(|c| c.status)).then(|| {
            format!(
                "container runtime network not ready: {}",
                condition_text(net, "NetworkReady")
            )
        });
        let rt = find("RuntimeReady");
        if rt.is_some_and(|c| c.status) {
            s.runtime_error = None;
            s.last_ok = Some(Instant::now());
        } else {
            s.runtime_error = Some(format!(
                "container runtime not ready: {}",
                condition_text(rt, "RuntimeReady")
            ));
        }
    }

    /// Whether the runtime applies `supplementalGroupsPolicy: Strict`
    /// (CRI RuntimeFeatures); None from a runtime that reports no features.
    pub fn supplemental_groups_policy(&self) -> Option<bool> {
        self.inner
            .read()
            .features
            .map(|f| f.supplemental_groups_policy)
    }

    /// The runtime's handlers and whether each supports user namespaces
    /// (upstream runtimeState.runtimeHandlers).
    pub fn handlers(&self) -> Vec<(String, bool)> {
        self.inner
            .read()
            .handlers
            .iter()
            .map(|h| {
                (
                    h.name.clone(),
                    h.features.is_some_and(|f| f.user_namespaces),
                )
            })
            .collect()
    }

    /// The runtime's handlers as the Node reports them (upstream setter
    /// RuntimeHandlers: name and both features, always present).
    pub fn node_runtime_handlers(&self) -> Vec<k8s_openapi::api::core::v1::NodeRuntimeHandler> {
        use k8s_openapi::api::core::v1::{NodeRuntimeHandler, NodeRuntimeHandlerFeatures};
        self.inner
            .read()
            .handlers
            .iter()
            .map(|h| {
                let f = h.features.unwrap_or_default();
                NodeRuntimeHandler {
                    name: Some(h.name.clone()),
                    features: Some(NodeRuntimeHandlerFeatures {
                        recursive_read_only_mounts: Some(f.recursive_read_only_mounts),
                        user_namespaces: Some(f.user_namespaces),
                    }),
                }
            })
            .collect()
    }

    /// Why the runtime is not usable, if it is not (upstream
    /// runtimeErrors, without the PLEG check, which /healthz lists apart).
    pub fn runtime_error(&self) -> Option<String> {
        let s = self.inner.read();
        if let Some(e) = &s.unreachable {
            return Some(format!("container runtime is unreachable: {e}"));
        }
        if let Some(e) = &s.runtime_error {
            return Some(e.clone());
        }
        match s.last_ok {
            None => Some("container runtime status check may not have completed yet".into()),
            Some(t) if t.elapsed() > RUNTIME_SYNC_THRESHOLD => {
                Some("container runtime is down".into())
            }
            Some(_) => None,
        }
    }

    /// Why the pod network is not ready, if it is not (upstream
    /// networkErrors). Unknown until the first answer: pods then wait
    /// the one poll period rather than start without a network.
    pub fn network_error(&self) -> Option<String> {
        let s = self.inner.read();
        if s.last_ok.is_none() && s.network_error.is_none() {
            return Some("network state unknown".into());
        }
        s.network_error.clone()
    }
}

/// Polls CRI Status every `period` until the token is cancelled; the task
/// is returned so shutdown can await it.
pub fn spawn(
    state: RuntimeState,
    runtime: Arc<dyn RuntimeService>,
    period: Duration,
    token: CancellationToken,
) -> (RuntimeState, tokio::task::JoinHandle<()>) {
    let st = state.clone();
    let task = tokio::spawn(
        async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let (mut was_net, mut was_rt) = (None::<String>, None::<String>);
            loop {
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tick.tick() => {}
                }
                st.refresh(runtime.as_ref()).await;
                // Log transitions only, not every poll.
                let (net, rt) = (st.network_error(), st.runtime_error());
                if net != was_net {
                    match &net {
                        Some(e) => warn!(error = %e, "container runtime network not ready"),
                        None => info!("container runtime network ready"),
                    }
                }
                if rt != was_rt {
                    match &rt {
                        Some(e) => warn!(error = %e, "container runtime not ready"),
                        None => info!("container runtime ready"),
                    }
                }
                (was_net, was_rt) = (net, rt);
            }
        }
        .instrument(tracing::info_span!("runtime_state")),
    );
    (state, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(ty: &str, ok: bool, reason: &str) -> v1::RuntimeCondition {
        v1::RuntimeCondition {
            r#type: ty.into(),
            status: ok,
            reason: reason.into(),
            message: String::new(),
        }
    }

    fn status(conds: Vec<v1::RuntimeCondition>) -> v1::StatusResponse {
        v1::StatusResponse {
            status: Some(v1::RuntimeStatus { conditions: conds }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_pod_cidr_reaches_the_runtime_once_per_change() {
        // Old code accepted podCIDR (and node.spec.podCIDRs) and told the
        // runtime nothing.
        let fake = crate::cri::fake::FakeRuntime::new();
        let st = RuntimeState::default();
        let told = |f: &crate::cri::fake::FakeRuntime| {
            f.calls()
                .into_iter()
                .filter(|c| c.starts_with("UpdateRuntimeConfig"))
                .collect::<Vec<_>>()
        };
        assert!(
            !st.update_pod_cidr(&fake, "").await.unwrap(),
            "empty is no change"
        );
        assert!(st.update_pod_cidr(&fake, "10.244.1.0/24").await.unwrap());
        assert!(!st.update_pod_cidr(&fake, "10.244.1.0/24").await.unwrap());
        assert!(st
            .update_pod_cidr(&fake, "10.244.1.0/24,fd00:10:244:1::/64")
            .await
            .unwrap());
        assert_eq!(
            told(&fake),
            [
                "UpdateRuntimeConfig 10.244.1.0/24",
                "UpdateRuntimeConfig 10.244.1.0/24,fd00:10:244:1::/64"
            ]
        );
    }

    #[test]
    fn runtime_handlers_reach_the_node_with_both_features() {
        let s = RuntimeState::default();
        assert!(s.node_runtime_handlers().is_empty());
        let mut st = status(vec![cond("RuntimeReady", true, "")]);
        st.runtime_handlers = vec![
            v1::RuntimeHandler {
                name: String::new(),
                features: Some(v1::RuntimeHandlerFeatures {
                    recursive_read_only_mounts: true,
                    user_namespaces: false,
                }),
            },
            v1::RuntimeHandler {
                name: "kata".into(),
                features: None,
            },
        ];
        s.record(Ok(st));
        let h = serde_json::to_value(s.node_runtime_handlers()).unwrap();
        assert_eq!(
            h,
            serde_json::json!([
                {"name": "", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": false}},
                {"name": "kata", "features": {"recursiveReadOnlyMounts": false, "userNamespaces": false}}
            ])
        );
    }

    #[test]
    fn conditions_become_upstreams_errors() {
        let s = RuntimeState::default();
        assert!(s
            .runtime_error()
            .unwrap()
            .contains("may not have completed"));
        s.record(Ok(status(vec![
            cond("RuntimeReady", true, ""),
            cond("NetworkReady", false, "NetworkPluginNotReady"),
        ])));
        assert_eq!(s.runtime_error(), None);
        assert_eq!(
            s.network_error().as_deref(),
            Some("container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:")
        );
        s.record(Ok(status(vec![
            cond("RuntimeReady", true, ""),
            cond("NetworkReady", true, ""),
        ])));
        assert_eq!(s.network_error(), None);
        s.record(Err("connection refused".into()));
        assert!(s
            .runtime_error()
            .unwrap()
            .contains("unreachable: connection refused"));
        s.record(Ok(status(vec![cond("RuntimeReady", false, "Broken")])));
        assert!(s
            .runtime_error()
            .unwrap()
            .starts_with("container runtime not ready: RuntimeReady=false reason:Broken"));
        assert!(s
            .network_error()
            .unwrap()
            .contains("NetworkReady condition missing"));
    }

    #[tokio::test(start_paused = true)]
    async fn no_good_answer_for_the_threshold_means_down() {
        let s = RuntimeState::default();
        s.record(Ok(status(vec![
            cond("RuntimeReady", true, ""),
            cond("NetworkReady", true, ""),
        ])));
        assert_eq!(s.runtime_error(), None);
        tokio::time::advance(RUNTIME_SYNC_THRESHOLD + Duration::from_secs(1)).await;
        assert_eq!(
            s.runtime_error().as_deref(),
            Some("container runtime is down")
        );
    }
}
