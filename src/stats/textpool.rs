//! Text buffers kept from one cAdvisor rendering to the next.
//!
//! cAdvisor's text at 110 pods is 5 to 6 MB in about 100 family buffers,
//! most over glibc's fixed 128 KiB mmap threshold (`memtrim`): each scrape
//! mapped them afresh, faulted in and zeroed every page, and unmapped them
//! once sent; page faults were a tenth of the scrape's CPU. Kept here, the
//! next scrape writes into pages already resident. The cost is that memory
//! staying resident between scrapes (bounded by `POOL_MAX`), given back
//! once no scrape has taken a buffer for `POOL_IDLE`.

use std::time::{Duration, Instant};

/// The most buffer capacity kept: a 110-pod scrape's buffers, with room.
const POOL_MAX: usize = 16 << 20;

/// Buffers unused this long are freed (at the kubelet's next heap trim,
/// at most a minute later): longer than any usual Prometheus interval.
pub const POOL_IDLE: Duration = Duration::from_secs(120);

/// Smaller buffers come from glibc's arenas, which reuse them anyway.
const POOL_MIN: usize = 64 << 10;

/// Free buffers, smallest capacity first.
#[derive(Default)]
struct Pool {
    free: Vec<String>,
    /// Their total capacity.
    held: usize,
    /// When a buffer was last asked for.
    last_used: Option<Instant>,
}

impl Pool {
    /// The smallest free buffer of at least `cap` bytes, else a new one.
    fn take(&mut self, cap: usize, now: Instant) -> String {
        self.last_used = Some(now);
        let i = self.free.partition_point(|s| s.capacity() < cap);
        if i == self.free.len() {
            return String::with_capacity(cap);
        }
        let s = self.free.remove(i);
        self.held -= s.capacity();
        s
    }

    /// Keeps `s` (emptied) unless it is small or the pool is full; what
    /// it does not keep is handed back to be dropped outside the lock.
    fn give_back(&mut self, mut s: String) -> Option<String> {
        let cap = s.capacity();
        if cap < POOL_MIN || self.held + cap > POOL_MAX {
            return Some(s);
        }
        s.clear();
        let i = self.free.partition_point(|f| f.capacity() < cap);
        self.free.insert(i, s);
        self.held += cap;
        None
    }

    /// Lets every buffer go when none was asked for in `POOL_IDLE`.
    fn release_idle(&mut self, now: Instant) -> Vec<String> {
        match self.last_used {
            Some(at) if now.saturating_duration_since(at) >= POOL_IDLE => {
                self.held = 0;
                std::mem::take(&mut self.free)
            }
            _ => Vec::new(),
        }
    }
}

static POOL: parking_lot::Mutex<Pool> = parking_lot::Mutex::new(Pool {
    free: Vec::new(),
    held: 0,
    last_used: None,
});

/// Frees the kept buffers if no scrape used them lately (called with the
/// kubelet's periodic heap trim).
pub fn release_idle() {
    let gone = POOL.lock().release_idle(Instant::now());
    drop(gone);
}

/// A text buffer that goes back to the pool when dropped (its `Bytes`
/// sent, or its family absorbed into another), when taken from it.
pub struct Text {
    text: String,
    pooled: bool,
}

impl Text {
    /// A buffer of at least `cap` bytes, from the pool when `pooled`.
    pub fn with_capacity(cap: usize, pooled: bool) -> Self {
        let text = if pooled {
            POOL.lock().take(cap, Instant::now())
        } else {
            String::with_capacity(cap)
        };
        Text { text, pooled }
    }
}

impl Text {
    /// Whether this buffer goes back to the pool.
    pub fn pooled(&self) -> bool {
        self.pooled
    }
}

impl std::ops::Deref for Text {
    type Target = String;
    fn deref(&self) -> &String {
        &self.text
    }
}

impl std::ops::DerefMut for Text {
    fn deref_mut(&mut self) -> &mut String {
        &mut self.text
    }
}

impl AsRef<[u8]> for Text {
    fn as_ref(&self) -> &[u8] {
        self.text.as_bytes()
    }
}

impl Drop for Text {
    fn drop(&mut self) {
        if self.pooled {
            let rest = POOL.lock().give_back(std::mem::take(&mut self.text));
            drop(rest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer given back is the one the next request of its size gets
    /// (the same allocation, emptied); small ones and those past the cap
    /// are not kept.
    #[test]
    fn buffers_are_reused_by_size_and_bounded() {
        let mut p = Pool::default();
        let t0 = Instant::now();
        let mut a = p.take(200 << 10, t0);
        a.push_str("old text");
        let a_ptr = a.as_ptr();
        let b = p.take(100 << 10, t0);
        let b_ptr = b.as_ptr();
        assert!(p.give_back(a).is_none());
        assert!(p.give_back(b).is_none());
        assert_eq!(p.held, (200 << 10) + (100 << 10));
        // The smallest that fits: b for a small request, a for a big one.
        let b2 = p.take(90 << 10, t0);
        assert_eq!(b2.as_ptr(), b_ptr);
        let a2 = p.take(150 << 10, t0);
        assert_eq!((a2.as_ptr(), a2.len()), (a_ptr, 0), "emptied");
        // Nothing fits: a new buffer.
        assert!(p.take(1 << 20, t0).capacity() >= 1 << 20);
        assert_eq!(p.held, 0);
        assert!(p.give_back(String::with_capacity(1024)).is_some(), "small");
        let big = String::with_capacity(POOL_MAX - (64 << 10));
        assert!(p.give_back(big).is_none());
        assert!(p.give_back(a2).is_some(), "over the cap");
        assert!(p.held <= POOL_MAX);
    }

    #[test]
    fn idle_buffers_are_released_and_busy_ones_kept() {
        let mut p = Pool::default();
        let t0 = Instant::now();
        let s = p.take(128 << 10, t0);
        assert!(p.give_back(s).is_none());
        let busy = t0 + POOL_IDLE - Duration::from_secs(1);
        assert!(p.release_idle(busy).is_empty());
        assert_eq!(p.free.len(), 1);
        assert_eq!(p.release_idle(t0 + POOL_IDLE).len(), 1);
        assert_eq!((p.free.len(), p.held), (0, 0));
    }
}
