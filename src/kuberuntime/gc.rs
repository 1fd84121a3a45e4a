//! Container garbage collection's policy pass (upstream `evictContainers`
//! in `pkg/kubelet/kuberuntime/kuberuntime_gc.go`, run once a minute):
//! of the containers that are not running and were created at least
//! `--minimum-container-ttl-duration` ago, grouped by pod and container
//! name, each group keeps its newest `--maximum-dead-containers-per-container`
//! and all together keep at most `--maximum-dead-containers` (first an
//! equal share per group, at least one, then the oldest go).
//!
//! The other parts of upstream's collection live elsewhere: the containers
//! of pods that are gone go at housekeeping, an evicted pod's at the same
//! minute pass, and a pod's sync already keeps its newest instance and one
//! dead one before it (`RuntimeManager::prune_dead`).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::cri::v1::{Container, ContainerState};

use super::labels;

/// Upstream's GCPolicy from the deprecated flags (their defaults: no
/// minimum age, one dead container per pod and name, no overall cap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub min_age: Duration,
    /// Negative: no limit.
    pub max_per_pod_container: i32,
    /// Negative: no limit.
    pub max_containers: i32,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            min_age: Duration::ZERO,
            max_per_pod_container: 1,
            max_containers: -1,
        }
    }
}

/// One container the pass may remove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evictable {
    pub id: String,
    pub name: String,
    pub created_at: i64,
    /// In an unknown state: stopped before it is removed, as upstream.
    pub unknown: bool,
}

/// The containers to remove, oldest of each cut first, by upstream's
/// rules over `containers` (a CRI listing) at `now_ns`.
pub fn evictions(containers: &[Container], policy: Policy, now_ns: i64) -> Vec<Evictable> {
    let newest = now_ns.saturating_sub(policy.min_age.as_nanos().min(i64::MAX as u128) as i64);
    let mut units: BTreeMap<(String, String), Vec<Evictable>> = BTreeMap::new();
    for c in containers {
        if c.state == ContainerState::ContainerRunning as i32 || c.created_at > newest {
            continue;
        }
        let uid = c.labels.get(labels::POD_UID).cloned().unwrap_or_default();
        let name = c
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        units
            .entry((uid, name.clone()))
            .or_default()
            .push(Evictable {
                id: c.id.clone(),
                name,
                created_at: c.created_at,
                unknown: c.state == ContainerState::ContainerUnknown as i32,
            });
    }
    for unit in units.values_mut() {
        // Newest first (ties by id, so a pass is the same every time).
        unit.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
    }
    let mut out = Vec::new();
    let cap_each =
        |units: &mut BTreeMap<_, Vec<Evictable>>, keep: usize, out: &mut Vec<Evictable>| {
            for unit in units.values_mut() {
                if unit.len() > keep {
                    out.extend(unit.drain(keep..).rev());
                }
            }
        };
    if policy.max_per_pod_container >= 0 {
        cap_each(&mut units, policy.max_per_pod_container as usize, &mut out);
    }
    let total = |units: &BTreeMap<_, Vec<Evictable>>| units.values().map(Vec::len).sum::<usize>();
    if policy.max_containers >= 0 && total(&units) > policy.max_containers as usize {
        let max = policy.max_containers as usize;
        let share = (max / units.len().max(1)).max(1);
        cap_each(&mut units, share, &mut out);
        let left = total(&units);
        if left > max {
            let mut all: Vec<Evictable> = units.into_values().flatten().collect();
            all.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
            out.extend(all.drain(max..).rev());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::v1::ContainerMetadata;

    fn c(id: &str, uid: &str, name: &str, created: i64, state: ContainerState) -> Container {
        Container {
            id: id.into(),
            metadata: Some(ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            labels: [(labels::POD_UID.to_string(), uid.to_string())].into(),
            created_at: created,
            state: state as i32,
            ..Default::default()
        }
    }

    fn ids(v: &[Evictable]) -> Vec<&str> {
        v.iter().map(|e| e.id.as_str()).collect()
    }

    const EXITED: ContainerState = ContainerState::ContainerExited;
    const RUNNING: ContainerState = ContainerState::ContainerRunning;

    #[test]
    fn each_pod_and_name_keeps_its_newest_dead_containers() {
        let list = [
            c("a1", "p", "a", 1, EXITED),
            c("a2", "p", "a", 2, EXITED),
            c("a3", "p", "a", 3, EXITED),
            c("a4", "p", "a", 4, RUNNING),
            c("b1", "p", "b", 1, EXITED),
            c("q1", "q", "a", 1, EXITED),
        ];
        // The default keeps one dead per pod and name; a running one is
        // never counted.
        assert_eq!(ids(&evictions(&list, Policy::default(), 10)), ["a1", "a2"]);
        let two = Policy {
            max_per_pod_container: 2,
            ..Policy::default()
        };
        assert_eq!(ids(&evictions(&list, two, 10)), ["a1"]);
        let none = Policy {
            max_per_pod_container: -1,
            ..Policy::default()
        };
        assert!(evictions(&list, none, 10).is_empty());
    }

    #[test]
    fn younger_than_the_minimum_age_is_kept() {
        let list = [
            c("a1", "p", "a", 1, EXITED),
            c("a2", "p", "a", 2, EXITED),
            c("a3", "p", "a", 9, EXITED),
        ];
        let p = Policy {
            min_age: Duration::from_nanos(5),
            ..Policy::default()
        };
        // a3 is too young to count: of a1 and a2 the newer stays.
        assert_eq!(ids(&evictions(&list, p, 10)), ["a1"]);
    }

    #[test]
    fn the_overall_cap_shares_out_then_takes_the_oldest() {
        let list = [
            c("a1", "p", "a", 1, EXITED),
            c("a2", "p", "a", 5, EXITED),
            c("a3", "p", "a", 6, EXITED),
            c("b1", "p", "b", 2, EXITED),
            c("b2", "p", "b", 3, EXITED),
            c("c1", "q", "c", 4, EXITED),
        ];
        let p = Policy {
            max_per_pod_container: -1,
            max_containers: 3,
            ..Policy::default()
        };
        // Three groups share three: one each (a3, b2, c1).
        assert_eq!(ids(&evictions(&list, p, 10)), ["a1", "a2", "b1"]);
        // A cap below the groups: one each, then the oldest go.
        let p = Policy {
            max_containers: 1,
            ..p
        };
        assert_eq!(
            ids(&evictions(&list, p, 10)),
            ["a1", "a2", "b1", "b2", "c1"]
        );
        // Zero removes every dead container.
        let p = Policy {
            max_containers: 0,
            ..p
        };
        assert_eq!(evictions(&list, p, 10).len(), 6);
    }
}
