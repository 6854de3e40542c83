//! The daemon's heap: what glibc's allocator keeps after the metadata caches free it.
//!
//! The metadata page cache (`pagepool`) frees and allocates page-sized nodes all the time,
//! from every FUSE thread. glibc gives each thread that allocates its own arena and keeps
//! freed memory in it: creating, stating and deleting ten million files left the daemon at
//! 1.84 GiB resident with 0.91 GiB in the pool, and one `malloc_trim` gave 540 MiB back.
//! So the daemon caps the arenas and trims on a timer.

/// Arenas for the whole process: enough that the FUSE threads rarely wait on each other's
/// allocations (each arena has its own lock), few enough that free memory does not spread
/// over dozens of 64 MiB heaps.
const ARENAS: libc::c_int = 4;

/// Caps the allocator's arenas; called at startup, before the worker threads allocate. An
/// administrator's `MALLOC_ARENA_MAX` in the daemon's environment wins.
pub(super) fn limit_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    // SAFETY: mallopt only changes a tuning value of the allocator.
    if unsafe { libc::mallopt(libc::M_ARENA_MAX, ARENAS) } != 1 {
        tracing::warn!("cannot limit the allocator to {ARENAS} arenas");
    }
}

/// Gives the allocator's free pages back to the system. Walks the free lists of every
/// arena: milliseconds for gigabytes, so it runs every few seconds, not per operation.
pub(super) fn trim() {
    // SAFETY: malloc_trim is thread safe and only releases memory nobody holds.
    unsafe {
        libc::malloc_trim(0);
    }
}
