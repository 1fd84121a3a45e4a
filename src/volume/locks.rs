//! One operation at a time per volume, across pods.
//!
//! Upstream's operation executor runs a device-mountable volume's mount,
//! unmount and expansion under one key per volume (nestedpendingoperations
//! with an empty pod name for MountVolume, which conflicts with every
//! operation on that volume), and the CSI spec asks the CO to keep at most
//! one call in flight per volume. Without it, pod A's tear-down could
//! unstage a volume under pod B's publish.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::OwnedMutexGuard;

type Entries = Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>;

/// Locks keyed by a volume's unique name; an entry lives while someone
/// holds or waits for it.
#[derive(Default, Clone)]
pub struct VolumeLocks {
    entries: Entries,
}

/// Held while an operation runs on the volume; released on drop.
pub struct VolumeGuard {
    entries: Entries,
    key: String,
    guard: Option<OwnedMutexGuard<()>>,
}

impl VolumeLocks {
    /// Waits until no other operation runs on volume `key`.
    pub async fn lock(&self, key: &str) -> VolumeGuard {
        let m = self
            .entries
            .lock()
            .entry(key.to_string())
            .or_default()
            .clone();
        // Cancel-safe: dropping the wait drops the clone, and the entry goes
        // with the next guard's release.
        let guard = m.lock_owned().await;
        VolumeGuard {
            entries: self.entries.clone(),
            key: key.to_string(),
            guard: Some(guard),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().len()
    }

    /// How many hold or wait for volume `key` (tests).
    #[cfg(test)]
    pub fn users(&self, key: &str) -> usize {
        // The map's own reference aside; a holder's guard keeps one.
        self.entries
            .lock()
            .get(key)
            .map_or(0, |m| Arc::strong_count(m) - 1)
    }
}

impl Drop for VolumeGuard {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut entries = self.entries.lock();
        // Only the map holds it: nobody waits.
        if entries
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            entries.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn operations_on_one_volume_wait_for_each_other_others_do_not() {
        let locks = VolumeLocks::default();
        let a = locks.lock("v1").await;
        // Another volume is free.
        let other = locks.lock("v2").await;
        drop(other);
        let l = locks.clone();
        let waiter = tokio::spawn(async move { l.lock("v1").await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "v1 is held");
        drop(a);
        let b = waiter.await.unwrap();
        assert_eq!(locks.len(), 1);
        drop(b);
        assert_eq!(locks.len(), 0, "entries go with their last holder");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_wait_leaves_no_entry_behind() {
        let locks = VolumeLocks::default();
        let a = locks.lock("v").await;
        let l = locks.clone();
        let waiter = tokio::spawn(async move { l.lock("v").await });
        tokio::task::yield_now().await;
        waiter.abort();
        assert!(waiter.await.is_err_and(|e| e.is_cancelled()));
        drop(a);
        assert_eq!(locks.len(), 0);
    }
}
