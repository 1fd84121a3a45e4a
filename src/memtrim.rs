//! Giving freed heap back to the operating system.
//!
//! glibc keeps freed memory in per-thread arenas and returns little of it
//! on its own; after a burst of large, short-lived allocations (a storm of
//! multi-megabyte or malformed manifests decoded on blocking threads) RSS
//! would stay at its peak for good. No maintained crate wraps these two
//! glibc calls, hence the few lines here.

/// Caps the number of malloc arenas (glibc's default is 8 per core), so
/// memory freed by short-lived blocking threads is not stranded in arenas of
/// their own. Call once at start, before threads are spawned.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
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
