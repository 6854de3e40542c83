//! Large data buffers of the target, used again instead of allocated per command: the
//! worker-pool path's and the connections' io_uring reads (`super::uring`).
//!
//! A request of 256 KiB or more gets a buffer on transparent huge pages
//! (`AlignedBuf::for_io`), and a fresh mapping is zeroed by the kernel when the drive
//! first writes into it: a 1 MiB Read through the worker pool cleared 2 MiB of memory, a
//! tenth of the server's CPU time in a profile of an NSD server streaming reads. Buffers
//! come back here when their command is answered and go to the next command of the same
//! size; a bounded number are kept per size, the rest are freed.
//!
//! A buffer taken from here holds an earlier command's bytes: a Read fills all of it from
//! the drive before it is sent (a failed read sends none of it), and a Write's buffer is
//! filled from the host before it reaches the drive.

use std::collections::HashMap;
use std::sync::OnceLock;

use parking_lot::Mutex;
use tessera_drive::AlignedBuf;

/// Bytes kept idle per buffer size (for every connection of the process together).
const IDLE_BYTES_PER_SIZE: usize = 64 << 20;
/// Smaller buffers are cheap to allocate and not kept here (a connection's ring keeps its
/// own, without a lock, for 4 KiB reads).
pub(crate) const POOLED_MIN_BYTES: usize = 64 << 10;

fn idle() -> &'static Mutex<HashMap<usize, Vec<AlignedBuf>>> {
    static IDLE: OnceLock<Mutex<HashMap<usize, Vec<AlignedBuf>>>> = OnceLock::new();
    IDLE.get_or_init(Mutex::default)
}

/// A buffer of `len` bytes (rounded up to a whole sector) whose contents are undefined:
/// the caller overwrites all of it before anyone reads it.
pub(crate) fn take(len: usize) -> AlignedBuf {
    let rounded =
        len.div_ceil(tessera_drive::SECTOR_BYTES as usize) * tessera_drive::SECTOR_BYTES as usize;
    if rounded >= POOLED_MIN_BYTES {
        if let Some(buf) = idle().lock().get_mut(&rounded).and_then(Vec::pop) {
            return buf;
        }
    }
    AlignedBuf::for_io(len)
}

/// Gives back a buffer of [`take`] once its command is done with it.
pub(crate) fn give(buf: AlignedBuf) {
    let len = buf.len();
    if len < POOLED_MIN_BYTES {
        return;
    }
    let mut idle = idle().lock();
    let kept = idle.entry(len).or_default();
    if (kept.len() + 1) * len <= IDLE_BYTES_PER_SIZE {
        kept.push(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_taken_again_for_the_same_size_only() {
        let len = 768 << 10;
        let buf = take(len);
        assert_eq!(buf.len(), len);
        let at = buf.as_ptr();
        give(buf);
        assert_eq!(
            take(len + 4096).len(),
            len + 4096,
            "another size is a new buffer"
        );
        let again = take(len);
        assert_eq!(again.as_ptr(), at, "the idle buffer is used again");
        give(again);
        // Small buffers are not kept.
        let small = take(4096);
        give(small);
        assert!(idle().lock().get(&4096).is_none());
    }
}
