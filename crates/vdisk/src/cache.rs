//! A bounded cache of strip headers, so that a small read of a strip whose header was read
//! recently is one I/O instead of two.
//!
//! Two generations approximate LRU at O(1) cost: hits in the old generation move to the
//! new one, and when the new generation fills half the budget it becomes the old one and
//! the previous old one is dropped. Entries are keyed by strip and remember the slot they
//! were read from, so a strip that moved never returns its previous header.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::layout::StripHeader;

/// Bytes of headers kept (tables dominate: `4 * strips * sectors_per_strip` each).
pub const HEADER_CACHE_BYTES: usize = 32 << 20;

/// (vdisk id, stripe, strip index).
pub type Key = (u32, u64, u16);

#[derive(Default)]
struct Gen {
    map: HashMap<Key, (u64, Arc<StripHeader>)>,
    bytes: usize,
}

#[derive(Default)]
pub struct HeaderCache {
    inner: Mutex<(Gen, Gen)>,
}

fn cost(h: &StripHeader) -> usize {
    96 + 4 * h.table.len()
}

impl HeaderCache {
    /// The header of `key` if cached for slot `loc`.
    pub fn get(&self, key: Key, loc: u64) -> Option<Arc<StripHeader>> {
        let mut g = self.inner.lock();
        if let Some((l, h)) = g.0.map.get(&key) {
            return (*l == loc).then(|| h.clone());
        }
        let (l, h) = g.1.map.remove(&key)?;
        g.1.bytes -= cost(&h);
        if l != loc {
            return None;
        }
        Self::put(&mut g, key, loc, h.clone());
        Some(h)
    }

    pub fn insert(&self, key: Key, loc: u64, h: Arc<StripHeader>) {
        let mut g = self.inner.lock();
        if let Some((_, old)) = g.1.map.remove(&key) {
            g.1.bytes -= cost(&old);
        }
        Self::put(&mut g, key, loc, h);
    }

    pub fn remove(&self, key: Key) {
        let mut g = self.inner.lock();
        if let Some((_, old)) = g.0.map.remove(&key) {
            g.0.bytes -= cost(&old);
        }
        if let Some((_, old)) = g.1.map.remove(&key) {
            g.1.bytes -= cost(&old);
        }
    }

    fn put(g: &mut (Gen, Gen), key: Key, loc: u64, h: Arc<StripHeader>) {
        let c = cost(&h);
        if let Some((_, old)) = g.0.map.insert(key, (loc, h)) {
            g.0.bytes -= cost(&old);
        }
        g.0.bytes += c;
        if g.0.bytes > HEADER_CACHE_BYTES / 2 {
            let young = std::mem::take(&mut g.0);
            g.1 = young;
        }
    }
}
