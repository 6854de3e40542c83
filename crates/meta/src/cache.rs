//! The cache of clean pages: decoded nodes by address, bounded in pages, evicted by CLOCK
//! (a reference bit per entry, a hand that clears it or evicts). Pages a checkpoint is
//! still writing are pinned: evicting one would read it back before its write landed.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::store::Node;
use crate::PageAddr;

struct Entry {
    node: Arc<Node>,
    /// `node.memory_bytes()` when it came in (a cached node does not change).
    bytes: usize,
    referenced: bool,
    /// Pinned until the checkpoint of this generation is written.
    pinned_until: Option<u64>,
}

pub(crate) struct PageCache {
    capacity: usize,
    /// Pages of the budget that changed pages hold now (see `set_reserved`).
    reserved: usize,
    /// The memory bound (`pagepool`), and what changed pages take of it now.
    capacity_bytes: usize,
    reserved_bytes: usize,
    /// Memory of the cached nodes.
    bytes: usize,
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
            reserved: 0,
            capacity_bytes: usize::MAX,
            reserved_bytes: 0,
            bytes: 0,
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

    /// Changed pages share the budget with clean ones (`pagepool` bounds both): the cache
    /// keeps `capacity - reserved` clean pages, but never fewer than a quarter of its
    /// capacity, so that lookups keep their inner nodes while changes pile up.
    /// `reserved_bytes` is the memory the changed pages take.
    pub(crate) fn set_reserved(&mut self, reserved: usize, reserved_bytes: usize) {
        self.reserved = reserved;
        self.reserved_bytes = reserved_bytes;
        self.evict();
    }

    /// Bounds the memory of the cached nodes as well as their count (`pagepool` is
    /// memory: a node takes more than its page, by how full it is and how small its entries).
    pub(crate) fn set_capacity_bytes(&mut self, bytes: usize) {
        self.capacity_bytes = bytes;
        self.evict();
    }

    /// Memory of the cached nodes.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    fn limit(&self) -> usize {
        self.capacity
            .saturating_sub(self.reserved)
            .max(self.capacity / 4)
            .max(1)
    }

    fn limit_bytes(&self) -> usize {
        self.capacity_bytes
            .saturating_sub(self.reserved_bytes)
            .max(self.capacity_bytes / 4)
    }

    fn over(&self, limit: usize, limit_bytes: usize) -> bool {
        self.entries.len() > limit || (self.bytes > limit_bytes && self.entries.len() > self.pinned)
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether `addr` is cached, without counting a hit or a miss or marking it used.
    pub(crate) fn contains(&self, addr: PageAddr) -> bool {
        self.entries.contains_key(&addr)
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
        let bytes = node.memory_bytes();
        self.bytes += bytes;
        // A new page starts unreferenced: it is placed behind the hand (see `evict`), so it
        // has a full turn to be used again before it can go, and pages used once (a scan
        // of leaves) leave without pushing out those used again and again.
        let old = self.entries.insert(
            addr,
            Entry {
                node,
                bytes,
                referenced: false,
                pinned_until,
            },
        );
        match old {
            Some(old) => {
                self.bytes -= old.bytes;
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
            self.bytes -= e.bytes;
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
        let limit = self.limit().max(self.pinned);
        let limit_bytes = self.limit_bytes();
        while self.over(limit, limit_bytes) && !self.ring.is_empty() {
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
                Some(e) => {
                    self.bytes -= e.bytes;
                    self.entries.remove(&addr);
                    // The last slot (the newest page) moves into the hole. The hand steps
                    // past it: under the hand it would be the next to go, and a lookup's
                    // inner nodes and leaf, read one after the other, would evict each
                    // other before their second use (every stat of a directory larger
                    // than the cache read its whole path from disk).
                    self.ring.swap_remove(self.hand);
                    self.hand += 1;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> Arc<Node> {
        Arc::new(Node::Branch {
            level: 1,
            keys: Vec::new(),
            children: Vec::new(),
        })
    }

    /// Looks `addr` up, reading it ("from disk": a miss) when absent.
    fn touch(cache: &mut PageCache, addr: u64) {
        if cache.get(PageAddr(addr)).is_none() {
            cache.insert(PageAddr(addr), node(), None);
        }
    }

    /// Lookups in a tree larger than the cache: each goes root, inner node, then a leaf
    /// seen once. The root and inner node are read once; only the leaves miss.
    #[test]
    fn a_lookup_path_stays_while_leaves_stream_through() {
        let mut cache = PageCache::new(1024);
        let lookups = 10_000u64;
        for i in 0..lookups {
            touch(&mut cache, 1);
            touch(&mut cache, 2);
            touch(&mut cache, 1000 + i);
        }
        assert_eq!(
            cache.misses,
            2 + lookups,
            "root and inner node read once each"
        );
        assert!(cache.len() <= 1024);
    }

    /// What a cold `stat` of every file of a huge directory does, in creation order: the
    /// directory's root and one of its inner nodes, a directory leaf seen once (entries in
    /// hash order), then the inode tree's root and the inode page of the file (160 files
    /// to a page, in order). The working set (53 pages) fits the cache many times over:
    /// only leaves, and each inode page once, may miss. (Before the hand stepped past the
    /// page it moved, every new page went into one slot: each stat read its leaf, inner
    /// node and inode page again, 2.4 reads per stat here and 8 at ten million files.)
    #[test]
    fn a_stat_of_every_file_reads_each_page_about_once() {
        let mut cache = PageCache::new(1024);
        let files = 16_000u64;
        for i in 0..files {
            touch(&mut cache, 1);
            touch(&mut cache, 2 + (i * 7919) % 50);
            touch(&mut cache, 1_000_000 + i);
            touch(&mut cache, 3);
            touch(&mut cache, 2_000_000 + i / 160);
        }
        let needed = 1 + 50 + files + 1 + files / 160;
        assert!(
            cache.misses <= needed + needed / 100,
            "{} page reads for {files} stats, {needed} needed",
            cache.misses
        );
    }

    /// A hot set used again and again survives a stream of pages used once.
    #[test]
    fn hot_pages_survive_a_scan() {
        let mut cache = PageCache::new(1024);
        for round in 0..1_000u64 {
            for hot in 0..10 {
                touch(&mut cache, hot);
            }
            for cold in 0..20 {
                touch(&mut cache, 1_000 + round * 20 + cold);
            }
        }
        let cold_pages = 20_000;
        assert!(
            cache.misses <= 10 + cold_pages + 2,
            "the hot pages were read about once: {}",
            cache.misses
        );
        assert_eq!(cache.evictions, cache.misses - cache.len() as u64);
    }

    /// Changed pages take their room from clean ones: the pool bounds both together, and
    /// never squeezes clean pages below a quarter of it.
    #[test]
    fn changed_pages_take_room_from_clean_ones() {
        let mut cache = PageCache::new(1000);
        for i in 0..1000 {
            touch(&mut cache, i);
        }
        assert_eq!(cache.len(), 1000);
        cache.set_reserved(400, 0);
        assert_eq!(cache.len(), 600, "1000 pages less 400 changed");
        touch(&mut cache, 5000);
        assert_eq!(cache.len(), 600);
        cache.set_reserved(990, 0);
        assert_eq!(
            cache.len(),
            250,
            "a quarter of the pool stays for clean pages"
        );
        cache.set_reserved(0, 0);
        for i in 6000..7000 {
            touch(&mut cache, i);
        }
        assert_eq!(
            cache.len(),
            1000,
            "the room comes back after the checkpoint"
        );
    }
}
