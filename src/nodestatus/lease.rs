//! The node's heartbeat: `kube-node-lease/<node>` renewed every quarter of
//! `nodeLeaseDurationSeconds` (upstream `component-helpers/apimachinery/
//! lease` controller with NodeLeaseRenewIntervalFraction 0.25), owned by the
//! Node so it goes when the Node does.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::apiclient::ApiClient;

pub const LEASE_NAMESPACE: &str = "kube-node-lease";

/// The renew interval for a lease duration (upstream: a quarter of it).
pub fn renew_interval(duration_seconds: i32) -> Duration {
    Duration::from_millis((duration_seconds.max(1) as u64) * 1000 / 4)
}

fn owner(node: &str, node_uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.into(),
        uid: node_uid.into(),
        ..Default::default()
    }
}

/// The lease as the kubelet writes it, from `base` (the last one read).
pub fn renewed(base: Option<Lease>, node: &str, node_uid: Option<&str>, duration: i32) -> Lease {
    let mut lease = base.unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(node.into()),
            namespace: Some(LEASE_NAMESPACE.into()),
            ..Default::default()
        },
        spec: None,
    });
    if let Some(uid) = node_uid.filter(|u| !u.is_empty()) {
        let refs = lease.metadata.owner_references.get_or_insert_with(Vec::new);
        if !refs.iter().any(|r| r.kind == "Node" && r.uid == uid) {
            refs.push(owner(node, uid));
        }
    }
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(node.into());
    spec.lease_duration_seconds = Some(duration);
    spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
    lease
}

/// Renews the lease until `token` is cancelled. `node_uid` is the
/// registered Node's UID once known (for the owner reference). Each renewal
/// may take `try_timeout` (upstream's heartbeat client timeout, the smaller
/// of the status period and the lease duration): a hung request is given
/// up and retried, and shutdown never waits for one.
pub async fn run(
    api: ApiClient,
    node: String,
    duration_seconds: i32,
    try_timeout: Duration,
    mut node_uid: tokio::sync::watch::Receiver<Option<String>>,
    health: crate::apiclient::ApiHealth,
    token: CancellationToken,
) {
    let interval = renew_interval(duration_seconds);
    let mut latest: Option<Lease> = None;
    let mut backoff = Duration::from_millis(200);
    loop {
        let uid = node_uid.borrow_and_update().clone();
        let tried = tokio::select! {
            _ = token.cancelled() => return,
            r = tokio::time::timeout(
                try_timeout,
                renew(&api, &node, uid.as_deref(), duration_seconds, latest.take()),
            ) => r
                .map_err(|_| format!("no answer within {try_timeout:?}"))
                .and_then(|r| r.map_err(|e| e.to_string())),
        };
        let wait = match tried {
            Ok(l) => {
                health.ok();
                latest = Some(l);
                backoff = Duration::from_millis(200);
                interval
            }
            Err(e) => {
                health.failed(e.clone());
                warn!(node = %node, error = %e, "failed to renew the node lease, will retry");
                let w = backoff;
                backoff = (backoff * 2).min(Duration::from_secs(7));
                w
            }
        };
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
            // Set the owner reference as soon as the Node is registered.
            _ = node_uid.changed(), if latest.as_ref().is_some_and(|l| l.metadata.owner_references.is_none()) => {}
        }
    }
}

async fn renew(
    api: &ApiClient,
    node: &str,
    node_uid: Option<&str>,
    duration: i32,
    latest: Option<Lease>,
) -> Result<Lease, kube::Error> {
    let leases: Api<Lease> = Api::namespaced(api.heartbeat_client().await, LEASE_NAMESPACE);
    let pp = PostParams::default();
    // Upstream reuses the lease from its last update and reads it again
    // only after a failure: one request per renewal.
    let base = match latest {
        Some(l) => Some(l),
        None => match leases.get_opt(node).await? {
            Some(l) => Some(l),
            None => {
                let fresh = renewed(None, node, node_uid, duration);
                let leases: Api<Lease> =
                    Api::namespaced(api.heartbeat_client().await, LEASE_NAMESPACE);
                debug!(node, "creating the node lease");
                return leases.create(&pp, &fresh).await;
            }
        },
    };
    let next = renewed(base, node, node_uid, duration);
    let leases: Api<Lease> = Api::namespaced(api.heartbeat_client().await, LEASE_NAMESPACE);
    leases.replace(node, &pp, &next).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease renewal the API server never answers is given up after the
    /// heartbeat timeout (reported, then retried), and cancelling the task
    /// ends it while a renewal hangs.
    #[tokio::test]
    async fn a_hung_renewal_times_out_and_never_holds_shutdown() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Accepts and reads nothing back: every request hangs.
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((sock, _)) = listener.accept().await {
                held.push(sock);
            }
        });
        let dir = crate::testutil::tempdir("lease-hung");
        let kc = crate::testutil::plain_http_kubeconfig(&dir, addr);
        let api = ApiClient::from_kubeconfig(&kc, 50, 100).await.unwrap();
        let health = crate::apiclient::ApiHealth::default();
        let token = CancellationToken::new();
        let (_uid_tx, uid_rx) = tokio::sync::watch::channel(None);
        let task = tokio::spawn(run(
            api,
            "n".into(),
            40,
            Duration::from_millis(300),
            uid_rx,
            health.clone(),
            token.clone(),
        ));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match health.status() {
                Err(e) if e.contains("no answer within") => break,
                other => assert!(
                    tokio::time::Instant::now() < deadline,
                    "renewal not given up: {other:?}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The task is in a renewal or its backoff: cancelling ends it.
        token.cancel();
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("the lease task ends when cancelled")
            .unwrap();
        server.abort();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_40_second_lease_is_renewed_every_10_seconds() {
        assert_eq!(renew_interval(40), Duration::from_secs(10));
    }

    #[test]
    fn the_lease_names_its_holder_and_is_owned_by_the_node() {
        let l = renewed(None, "n1", Some("uid-1"), 40);
        assert_eq!(l.metadata.namespace.as_deref(), Some(LEASE_NAMESPACE));
        let s = l.spec.clone().unwrap();
        assert_eq!(s.holder_identity.as_deref(), Some("n1"));
        assert_eq!(s.lease_duration_seconds, Some(40));
        assert!(s.renew_time.is_some());
        let refs = l.metadata.owner_references.clone().unwrap();
        assert_eq!(
            (refs[0].kind.as_str(), refs[0].uid.as_str()),
            ("Node", "uid-1")
        );
        // Renewing keeps one owner reference.
        let again = renewed(Some(l), "n1", Some("uid-1"), 40);
        assert_eq!(again.metadata.owner_references.unwrap().len(), 1);
    }
}
