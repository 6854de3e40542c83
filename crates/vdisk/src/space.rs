//! Free space of one pdisk's data area, in sectors. Derived at open from the stripe maps,
//! never stored: a slot is used exactly when a stripe map points at it.

use std::collections::BTreeMap;

/// Free extents of a pdisk: start sector to length.
#[derive(Debug, Clone)]
pub struct Extents {
    free: BTreeMap<u64, u64>,
    free_sectors: u64,
    total_sectors: u64,
}

impl Extents {
    /// All of `[start, start + len)` free.
    pub fn new(start: u64, len: u64) -> Extents {
        let mut free = BTreeMap::new();
        if len > 0 {
            free.insert(start, len);
        }
        Extents {
            free,
            free_sectors: len,
            total_sectors: len,
        }
    }

    pub fn free_sectors(&self) -> u64 {
        self.free_sectors
    }

    pub fn used_sectors(&self) -> u64 {
        self.total_sectors - self.free_sectors
    }

    pub fn total_sectors(&self) -> u64 {
        self.total_sectors
    }

    /// How many slots of `len` sectors still fit.
    pub fn slots_free(&self, len: u64) -> u64 {
        self.free.values().map(|l| l / len).sum()
    }

    /// First fit: the start of `len` free sectors, now used.
    pub fn alloc(&mut self, len: u64) -> Option<u64> {
        assert!(len > 0);
        let (&start, &have) = self.free.iter().find(|(_, &l)| l >= len)?;
        self.free.remove(&start);
        if have > len {
            self.free.insert(start + len, have - len);
        }
        self.free_sectors -= len;
        Some(start)
    }

    /// Marks `[start, start + len)` used; false (and no change) unless all of it was free.
    pub fn take(&mut self, start: u64, len: u64) -> bool {
        let Some((&fs, &fl)) = self.free.range(..=start).next_back() else {
            return false;
        };
        if fs + fl < start + len {
            return false;
        }
        self.free.remove(&fs);
        if start > fs {
            self.free.insert(fs, start - fs);
        }
        if fs + fl > start + len {
            self.free.insert(start + len, fs + fl - start - len);
        }
        self.free_sectors -= len;
        true
    }

    /// Returns `[start, start + len)`, which must be used, to the free space.
    pub fn release(&mut self, start: u64, len: u64) {
        let mut s = start;
        let mut l = len;
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            assert!(ps + pl <= start, "double free at sector {start}");
            if ps + pl == start {
                self.free.remove(&ps);
                s = ps;
                l += pl;
            }
        }
        if let Some((&ns, &nl)) = self.free.range(start..).next() {
            assert!(start + len <= ns, "double free at sector {start}");
            if start + len == ns {
                self.free.remove(&ns);
                l += nl;
            }
        }
        self.free.insert(s, l);
        self.free_sectors += len;
        assert!(self.free_sectors <= self.total_sectors);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_take_release_merge() {
        let mut e = Extents::new(100, 50);
        assert_eq!(e.alloc(10), Some(100));
        assert!(e.take(120, 5));
        assert!(!e.take(118, 5));
        assert_eq!(e.free_sectors(), 35);
        assert_eq!(e.slots_free(10), 3);
        e.release(100, 10);
        e.release(120, 5);
        assert_eq!(e.free_sectors(), 50);
        assert_eq!(e.alloc(50), Some(100));
        assert_eq!(e.alloc(1), None);
    }
}
