//! Per-key exponential backoff for restarting crashed containers and retrying
//! image pulls (upstream `client-go/util/flowcontrol.Backoff`, used with
//! 10 s initial and 300 s max as `containerBackOffPeriod`/`MaxContainerBackOff`).
//! Times are passed in (wall clock since the epoch, as CRI reports a
//! container's finish time), so the rules are tested without clocks.

use std::collections::HashMap;
use std::time::Duration;

/// Upstream `containerBackOffPeriod`.
pub const CONTAINER_BACKOFF_INITIAL: Duration = Duration::from_secs(10);
/// Upstream `MaxContainerBackOff`.
pub const CONTAINER_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Upstream's reducedInitialCrashLoopBackOff and reducedMaxCrashLoopBackOff
/// (gate ReduceDefaultCrashLoopBackOffDecay).
const REDUCED_INITIAL: Duration = Duration::from_secs(1);
const REDUCED_MAX: Duration = Duration::from_secs(60);

/// The crash loop backoff's initial and maximum periods (upstream
/// newCrashLoopBackOff): 10 s to 5 min; 1 s to 1 min with
/// ReduceDefaultCrashLoopBackOffDecay; with KubeletCrashLoopBackOffMax the
/// configured `crashLoopBackOff.maxContainerRestartPeriod` is the maximum,
/// and the initial too when it is shorter.
pub fn crash_loop_backoff(cfg: &crate::config::KubeletConfiguration) -> (Duration, Duration) {
    let (mut initial, mut max) = if cfg.feature_gate("ReduceDefaultCrashLoopBackOffDecay") {
        (REDUCED_INITIAL, REDUCED_MAX)
    } else {
        (CONTAINER_BACKOFF_INITIAL, CONTAINER_BACKOFF_MAX)
    };
    if cfg.feature_gate("KubeletCrashLoopBackOffMax") {
        if let Some(m) = cfg.crash_loop_back_off.max_container_restart_period {
            max = m.0;
            initial = initial.min(max);
        }
    }
    (initial, max)
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    backoff: Duration,
    last_update: Duration,
}

#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, Entry>,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            entries: HashMap::new(),
        }
    }

    pub fn container() -> Self {
        Self::new(CONTAINER_BACKOFF_INITIAL, CONTAINER_BACKOFF_MAX)
    }

    /// An entry is forgotten once the key stayed quiet for twice the max
    /// (upstream's `hasExpired`): ten minutes of running resets the backoff.
    fn expired(&self, event: Duration, e: &Entry) -> bool {
        event.saturating_sub(e.last_update) > self.max * 2
    }

    /// How much longer `key` must wait, counting from `event` (when the
    /// container finished), or `None` if it may restart now.
    pub fn remaining(&self, key: &str, event: Duration, now: Duration) -> Option<Duration> {
        let e = self.entries.get(key)?;
        if self.expired(event, e) {
            return None;
        }
        let elapsed = now.saturating_sub(event);
        (elapsed < e.backoff).then(|| e.backoff - elapsed)
    }

    /// Upstream IsInBackOffSinceUpdate: how much longer `key` must wait,
    /// counted from its last failure, or `None` once that window has passed.
    pub fn remaining_since_update(&self, key: &str, now: Duration) -> Option<Duration> {
        let e = self.entries.get(key)?;
        if self.expired(now, e) {
            return None;
        }
        let elapsed = now.saturating_sub(e.last_update);
        (elapsed < e.backoff).then(|| e.backoff - elapsed)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Records a restart: the next wait doubles, capped at the max.
    pub fn next(&mut self, key: &str, event: Duration, now: Duration) {
        let backoff = match self.entries.get(key) {
            Some(e) if !self.expired(event, e) => (e.backoff * 2).min(self.max),
            _ => self.initial,
        };
        self.entries.insert(
            key.to_string(),
            Entry {
                backoff,
                last_update: now,
            },
        );
    }

    /// The current window for `key`, for messages such as "back-off 20s".
    pub fn current(&self, key: &str) -> Option<Duration> {
        self.entries.get(key).map(|e| e.backoff)
    }

    /// Drops entries that would be reset anyway, bounding the map.
    pub fn gc(&mut self, now: Duration) {
        let max = self.max;
        self.entries
            .retain(|_, e| now.saturating_sub(e.last_update) <= max * 2);
    }

    pub fn reset(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// (key, current window, time since the last update) of the entries
    /// whose key starts with `prefix`, for `/debug/pods`.
    pub fn entries_with_prefix(
        &self,
        prefix: &str,
        now: Duration,
    ) -> Vec<(String, Duration, Duration)> {
        let mut v: Vec<_> = self
            .entries
            .iter()
            .filter(|(k, e)| k.starts_with(prefix) && !self.expired(now, e))
            .map(|(k, e)| (k.clone(), e.backoff, now.saturating_sub(e.last_update)))
            .collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn config(body: &str) -> crate::config::KubeletConfiguration {
        let text = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{body}"
        );
        crate::config::KubeletConfiguration::load_str(&text)
            .unwrap()
            .0
    }

    #[test]
    fn the_crash_loop_periods_follow_upstreams_gates_and_configuration() {
        // Old code: 10 s to 5 min whatever the gates and configuration.
        assert_eq!(crash_loop_backoff(&config("")), (S(10), S(300)));
        let reduced = "featureGates:\n  ReduceDefaultCrashLoopBackOffDecay: true\n";
        assert_eq!(crash_loop_backoff(&config(reduced)), (S(1), S(60)));
        let max = "featureGates:\n  KubeletCrashLoopBackOffMax: true\ncrashLoopBackOff:\n  maxContainerRestartPeriod: 5s\n";
        assert_eq!(crash_loop_backoff(&config(max)), (S(5), S(5)));
        let max = "featureGates:\n  KubeletCrashLoopBackOffMax: true\ncrashLoopBackOff:\n  maxContainerRestartPeriod: 30s\n";
        assert_eq!(crash_loop_backoff(&config(max)), (S(10), S(30)));
        // The gate's default maximum is 300 s.
        let gate = "featureGates:\n  KubeletCrashLoopBackOffMax: true\n";
        assert_eq!(crash_loop_backoff(&config(gate)), (S(10), S(300)));
    }

    #[test]
    fn first_crash_restarts_at_once_then_waits_doubling_to_the_cap() {
        let mut b = Backoff::container();
        assert_eq!(b.remaining("k", S(100), S(100)), None);
        b.next("k", S(100), S(100));
        // Crashed again right after the restart: wait 10 s from the finish.
        assert_eq!(b.remaining("k", S(101), S(101)), Some(S(10)));
        assert_eq!(b.remaining("k", S(101), S(106)), Some(S(5)));
        assert_eq!(b.remaining("k", S(101), S(111)), None);
        b.next("k", S(101), S(111));
        assert_eq!(b.current("k"), Some(S(20)));
        for _ in 0..10 {
            b.next("k", S(112), S(112));
        }
        assert_eq!(b.current("k"), Some(CONTAINER_BACKOFF_MAX));
    }

    #[test]
    fn ten_minutes_of_running_resets_the_backoff() {
        let mut b = Backoff::container();
        b.next("k", S(0), S(0));
        b.next("k", S(1), S(1));
        assert_eq!(b.current("k"), Some(S(20)));
        // Finished 601 s after the last restart: the entry has expired.
        assert_eq!(b.remaining("k", S(602), S(602)), None);
        b.next("k", S(602), S(602));
        assert_eq!(b.current("k"), Some(S(10)));
    }

    #[test]
    fn gc_drops_quiet_keys() {
        let mut b = Backoff::container();
        b.next("a", S(0), S(0));
        b.next("b", S(500), S(500));
        b.gc(S(700));
        assert_eq!(b.current("a"), None);
        assert!(b.current("b").is_some());
    }
}
