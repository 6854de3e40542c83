use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};

use crate::SECTOR_BYTES;

/// A heap buffer aligned to [`SECTOR_BYTES`], as O_DIRECT requires.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    /// Bytes mapped with mmap by [`AlignedBuf::huge`]; 0 for a heap allocation.
    mapped: usize,
}

/// Size of a transparent huge page on x86-64 and arm64 (4 KiB base pages).
const HUGE_PAGE_BYTES: usize = 2 << 20;
/// From this size [`AlignedBuf::for_io`] uses huge pages: a 256 KiB request from base pages
/// already needs 64 segments.
const IO_HUGE_MIN_BYTES: usize = 256 << 10;

// The buffer owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zero-filled buffer of `len` bytes; `len` is rounded up to a whole sector.
    pub fn zeroed(len: usize) -> AlignedBuf {
        let sector = SECTOR_BYTES as usize;
        let len = len.div_ceil(sector) * sector;
        if len == 0 {
            return AlignedBuf {
                ptr: sector as *mut u8,
                len: 0,
                mapped: 0,
            };
        }
        let layout = Layout::from_size_align(len, sector).expect("valid layout");
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory allocating {len} bytes");
        AlignedBuf {
            ptr,
            len,
            mapped: 0,
        }
    }

    /// A zero-filled buffer of `len` bytes (rounded up to a whole sector) on transparent
    /// huge pages where the kernel allows them, for long-lived I/O buffers of a megabyte or
    /// more. A drive request can only carry so many memory segments (254 on virtio-blk),
    /// so with 4 KiB pages a 4 MiB O_DIRECT read leaves as five or six requests; from 2 MiB
    /// pages it leaves as one. Measured on this project's virtual disk: 4 MiB reads at
    /// 4 threads went from 0.73–0.81 GB/s to 3.7–3.9 GB/s. Falls back to
    /// [`AlignedBuf::zeroed`] if the mapping fails.
    pub fn huge(len: usize) -> AlignedBuf {
        let sector = SECTOR_BYTES as usize;
        let len = len.div_ceil(sector) * sector;
        if len == 0 {
            return AlignedBuf::zeroed(0);
        }
        let want = len.div_ceil(HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES;
        // Map one huge page more than needed and trim, so the buffer starts on a huge-page
        // boundary (mmap only promises base-page alignment).
        let span = want + HUGE_PAGE_BYTES;
        // SAFETY: an anonymous private mapping with no address hint.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return AlignedBuf::zeroed(len);
        }
        let start = raw as usize;
        let aligned = start.div_ceil(HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES;
        let head = aligned - start;
        let tail = span - head - want;
        // SAFETY: both ranges lie inside the mapping just made and are not used after.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + want) as *mut libc::c_void, tail);
            }
            // Advice only: without THP the buffer works on base pages.
            libc::madvise(aligned as *mut libc::c_void, want, libc::MADV_HUGEPAGE);
        }
        AlignedBuf {
            ptr: aligned as *mut u8,
            len,
            mapped: want,
        }
    }

    /// A zero-filled buffer for one drive request of `len` bytes: on huge pages from
    /// 256 KiB up (a large request then leaves as one request, see [`AlignedBuf::huge`]),
    /// on the heap below, where a huge page would be mostly wasted.
    pub fn for_io(len: usize) -> AlignedBuf {
        if len >= IO_HUGE_MIN_BYTES {
            AlignedBuf::huge(len)
        } else {
            AlignedBuf::zeroed(len)
        }
    }

    /// An aligned copy of `data`, zero-padded to a whole sector.
    pub fn from_slice(data: &[u8]) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(data.len());
        buf[..data.len()].copy_from_slice(data);
        buf
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes (or dangling and aligned with len 0).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and we hold &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.mapped > 0 {
            // SAFETY: mapped in huge() with exactly this address and length.
            unsafe { libc::munmap(self.ptr.cast(), self.mapped) };
        } else if self.len > 0 {
            let layout = Layout::from_size_align(self.len, SECTOR_BYTES as usize).unwrap();
            // SAFETY: allocated in zeroed() with this layout.
            unsafe { dealloc(self.ptr, layout) }
        }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_buffers_are_zeroed_aligned_and_sized() {
        for len in [1, 4096, (1 << 20) + 1, 4 << 20, (4 << 20) + 4096] {
            let mut b = AlignedBuf::huge(len);
            assert_eq!(b.len(), len.div_ceil(4096) * 4096);
            assert_eq!(b.as_ptr() as usize % HUGE_PAGE_BYTES, 0);
            assert!(b.iter().all(|&x| x == 0));
            b.fill(0xA5);
            assert!(b.iter().all(|&x| x == 0xA5));
        }
        assert_eq!(AlignedBuf::huge(0).len(), 0);
    }
}
