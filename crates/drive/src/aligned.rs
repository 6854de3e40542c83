use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};

use crate::SECTOR_BYTES;

/// A heap buffer aligned to [`SECTOR_BYTES`], as O_DIRECT requires.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

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
            };
        }
        let layout = Layout::from_size_align(len, sector).expect("valid layout");
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory allocating {len} bytes");
        AlignedBuf { ptr, len }
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
        if self.len > 0 {
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
