//! The cache of clean pages: decoded nodes by address, bounded in pages, evicted by CLOCK
//! (a reference bit per entry, a hand that clears it or evicts). Pages a checkpoint is
//! still writing are pinned: evicting one would read it back before its write landed.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::store::Node;
use crate::PageAddr;

struct Entry {
    node: Arc<Node>,
    referenced: bool,
    /// Pinned until the checkpoint of this generation is written.
    pinned_until: Option<u64>,
}

pub(crate) struct PageCache {
    capacity: usize,
    /// Keyed with a cheap integer hash: the default one showed in profiles of lookups.
    entries: FxHashMap<PageAddr, Entry>,
    /// The CLOCK ring; may hold addresses already removed (skipped and dropped by the hand).
    ring: Vec<PageAddr>,
    hand: usize,
    pinned: usize,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    pub(crate) evictions: u64,
}

impl PageCache {
    pub(crate) fn new(capacity: usize) -> PageCache {
        PageCache {
            capacity: capacity.max(1),
            entries: FxHashMap::default(),
            ring: Vec::new(),
            hand: 0,
            pinned: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
        }
    }

    pub(crate) fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(1);
        self.evict();
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn get(&mut self, addr: PageAddr) -> Option<Arc<Node>> {
        match self.entries.get_mut(&addr) {
            Some(e) => {
                e.referenced = true;
                self.hits += 1;
                Some(e.node.clone())
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    pub(crate) fn insert(&mut self, addr: PageAddr, node: Arc<Node>, pinned_until: Option<u64>) {
        if pinned_until.is_some() {
            self.pinned += 1;
        }
        let old = self.entries.insert(
            addr,
            Entry {
                node,
                referenced: false,
                pinned_until,
            },
        );
        match old {
            Some(old) => {
                if old.pinned_until.is_some() {
                    self.pinned -= 1;
                }
            }
            None => self.ring.push(addr),
        }
        self.evict();
    }

    pub(crate) fn remove(&mut self, addr: PageAddr) {
        if let Some(e) = self.entries.remove(&addr) {
            if e.pinned_until.is_some() {
                self.pinned -= 1;
            }
        }
    }

    /// Unpins the pages of every checkpoint up to `generation`, now on disk.
    pub(crate) fn unpin(&mut self, generation: u64) {
        for e in self.entries.values_mut() {
            if e.pinned_until.is_some_and(|g| g <= generation) {
                e.pinned_until = None;
                self.pinned -= 1;
            }
        }
        self.evict();
    }

    fn evict(&mut self) {
        // Pinned pages cannot go, so the cache may stay over its capacity by what is pinned.
        let mut sweeps = 0;
        while self.entries.len() > self.capacity.max(self.pinned) && !self.ring.is_empty() {
            if self.hand >= self.ring.len() {
                self.hand = 0;
                sweeps += 1;
                if sweeps > 2 {
                    break;
                }
            }
            let addr = self.ring[self.hand];
            match self.entries.get_mut(&addr) {
                None => {
                    self.ring.swap_remove(self.hand);
                }
                Some(e) if e.pinned_until.is_some() => self.hand += 1,
                Some(e) if e.referenced => {
                    e.referenced = false;
                    self.hand += 1;
                }
                Some(_) => {
                    self.entries.remove(&addr);
                    self.ring.swap_remove(self.hand);
                    self.evictions += 1;
                }
            }
        }
        // Keep the ring from growing without bound with addresses removed by `remove`.
        if self.ring.len() > 2 * self.entries.len() + 64 {
            let entries = &self.entries;
            self.ring.retain(|a| entries.contains_key(a));
            self.hand = 0;
        }
    }
}
