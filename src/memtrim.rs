//! Giving freed heap back to the operating system.
//!
//! glibc keeps freed memory in per-thread arenas and returns little of it
//! on its own; after a burst of large, short-lived allocations (a storm of
//! multi-megabyte or malformed manifests decoded on blocking threads) RSS
//! would stay at its peak for good. No maintained crate wraps these two
//! glibc calls, hence the few lines here.

/// Fixed point at or above which allocations get their own mapping.
const MMAP_THRESHOLD: libc::c_int = 128 * 1024;

/// Tunes glibc malloc for a long-running agent that sees rare large bursts.
/// Call once at start, before threads are spawned.
///
/// - At most two arenas (glibc's default is 8 per core), so memory freed by
///   short-lived blocking threads is not stranded in arenas of their own.
/// - A fixed mmap threshold: glibc otherwise raises it to the size of the
///   largest mapped block freed so far (up to 32 MiB), after which one
///   multi-megabyte manifest's buffers come from an arena and stay resident;
///   `malloc_trim` cannot shrink the top of a thread arena. Fixed, every
///   large buffer is its own mapping and goes back to the kernel when freed.
/// - A trim threshold as small, so the main heap's top is given back too.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// Returns free heap pages of every arena to the kernel.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases memory malloc no longer uses.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// Whether glibc served `p` with a mapping of its own: the IS_MMAPPED
    /// bit of the chunk's size word, just before the pointer (a layout glibc
    /// has kept since its first ptmalloc).
    fn is_mmapped(p: *mut libc::c_void) -> bool {
        // SAFETY: `p` is a live malloc chunk; its size word precedes it.
        unsafe { *(p as *const usize).sub(1) & 2 != 0 }
    }

    #[test]
    fn large_buffers_stay_mapped_after_a_larger_one_was_freed() {
        tune_allocator();
        // SAFETY: plain malloc/free pairs; the memory is never read.
        unsafe {
            let big = libc::malloc(6 << 20);
            assert!(is_mmapped(big));
            // Untuned glibc now raises its mmap threshold past 6 MiB...
            libc::free(big);
            // ...so this would come from an arena and stay resident. (4 MiB:
            // a free run that large left in an arena by tests running beside
            // this one is far less likely than a 1 MiB one, which once made
            // this test fail.)
            let next = libc::malloc(4 << 20);
            let mapped = is_mmapped(next);
            libc::free(next);
            assert!(mapped, "a 4 MiB buffer came from an arena");
        }
    }
}
