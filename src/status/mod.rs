//! The status manager: computes each pod's API status from its spec and the
//! runtime's view, and keeps the latest one per pod for the servers (and,
//! in cluster mode, for patching `pods/status`). Upstream
//! `pkg/kubelet/status` plus generateAPIPodStatus in `kubelet_pods.go`.

pub mod apisync;
pub mod generate;

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::PodStatus;
use parking_lot::RwLock;

pub use generate::{generate_pod_status, StatusInput};

#[derive(Default, Clone)]
pub struct StatusManager {
    statuses: Arc<RwLock<HashMap<String, Versioned>>>,
    /// Woken when a status changes, for the API sync.
    changed: Arc<tokio::sync::Notify>,
    /// Cluster mode: the last status of pods removed, until the API sync
    /// has sent it (None: not kept, standalone).
    finals: Arc<RwLock<Option<HashMap<String, Versioned>>>>,
}

/// At most this many final statuses wait for the API sync; beyond, the
/// oldest are dropped (an API server away for long loses the oldest).
const MAX_FINALS: usize = 4096;

/// A status and its version: bumped only when the status really changes,
/// so the API sync sends each new status once (upstream versionedPodStatus).
#[derive(Clone)]
struct Versioned {
    status: Arc<PodStatus>,
    version: u64,
}

impl StatusManager {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, uid: &str) -> Option<Arc<PodStatus>> {
        self.statuses.read().get(uid).map(|v| v.status.clone())
    }

    /// The status with its version.
    pub fn get_versioned(&self, uid: &str) -> Option<(Arc<PodStatus>, u64)> {
        self.statuses
            .read()
            .get(uid)
            .map(|v| (v.status.clone(), v.version))
    }

    /// Resolves when a status changed since the last call returned.
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    /// Stores a status. A pod that reached Succeeded or Failed never goes
    /// back to a running phase, and keeps the reason and message that came
    /// with it (upstream's terminal-phase guard).
    pub fn set(&self, uid: &str, mut status: PodStatus) {
        let mut map = self.statuses.write();
        let mut version = 1;
        if let Some(old) = map.get(uid) {
            let o = &old.status;
            if generate::is_terminal(o.phase.as_deref())
                && !generate::is_terminal(status.phase.as_deref())
            {
                status.phase = o.phase.clone();
                status.reason = o.reason.clone();
                status.message = o.message.clone();
            }
            if **o == status {
                return;
            }
            version = old.version + 1;
        }
        crate::metrics::startup::status_updated(uid, &status);
        map.insert(
            uid.to_string(),
            Versioned {
                status: Arc::new(status),
                version,
            },
        );
        drop(map);
        self.changed.notify_one();
    }

    /// Wakes the API sync without a status change: a pod's containers
    /// have all stopped, so a terminal phase held back can go now.
    pub fn touch(&self) {
        self.changed.notify_one();
    }

    pub fn remove(&self, uid: &str) {
        let gone = self.statuses.write().remove(uid);
        if let (Some(v), Some(finals)) = (gone, self.finals.write().as_mut()) {
            if finals.len() >= MAX_FINALS {
                let oldest = finals
                    .iter()
                    .min_by_key(|(_, v)| v.version)
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    finals.remove(&k);
                }
            }
            finals.insert(uid.to_string(), v);
            self.changed.notify_one();
        }
    }

    /// Keeps the last status of removed pods for `take_finals` (cluster mode).
    pub fn keep_finals(&self) {
        self.finals.write().get_or_insert_with(HashMap::new);
    }

    /// The last statuses of removed pods, with their versions.
    pub fn take_finals(&self) -> Vec<(String, Arc<PodStatus>, u64)> {
        match self.finals.write().as_mut() {
            Some(f) => f.drain().map(|(k, v)| (k, v.status, v.version)).collect(),
            None => Vec::new(),
        }
    }

    /// Puts back a final status that could not be sent (retried on the
    /// next pass; no wake-up, so an absent API server is not spun on).
    pub fn return_final(&self, uid: &str, status: Arc<PodStatus>, version: u64) {
        if let Some(f) = self.finals.write().as_mut() {
            f.entry(uid.to_string())
                .or_insert(Versioned { status, version });
        }
    }

    /// Whether a removed pod's last status still waits to be taken.
    pub fn has_final(&self, uid: &str) -> bool {
        self.finals
            .read()
            .as_ref()
            .is_some_and(|f| f.contains_key(uid))
    }

    pub fn uids(&self) -> Vec<String> {
        self.statuses.read().keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Old behaviour: only the phase was kept; reason and message were lost.
    #[test]
    fn a_terminal_status_is_kept_with_its_reason_and_message() {
        let m = StatusManager::new();
        m.set(
            "u",
            PodStatus {
                phase: Some("Failed".into()),
                reason: Some("Evicted".into()),
                message: Some("low on memory".into()),
                ..Default::default()
            },
        );
        m.set(
            "u",
            PodStatus {
                phase: Some("Running".into()),
                ..Default::default()
            },
        );
        let s = m.get("u").unwrap();
        assert_eq!(s.phase.as_deref(), Some("Failed"));
        assert_eq!(s.reason.as_deref(), Some("Evicted"));
        assert_eq!(s.message.as_deref(), Some("low on memory"));
    }
}
