//! The metadata store: copy-on-write B+trees over metadata pages, a bounded cache of clean
//! pages, the changed pages waiting for the next checkpoint, and the checkpoint itself.
//!
//! Keys and values are byte strings compared bytewise (callers encode numbers big-endian).
//! A tree is reached through a [`Tree`] handle that its owner keeps (in an inode slot, in a
//! descriptor); the handle names the root page, or the changed root waiting in memory.
//! Every operation is O(height) page visits, the height being about log_fanout(n) with a
//! fanout of tens to hundreds.

use std::cmp::Ordering;
use std::sync::Arc;

use crate::cache::PageCache;
use crate::leaf::Leaf;
use crate::page::{self, Decoded, PageFormat, PagePlace, PagePtr};
use crate::{MetaError, MetaResult, PageAddr};

/// Reads pages for the store (a file system reads them from its metadata disks).
pub trait PageReader: Send + Sync {
    /// Fills `page` (one page) from `addr`.
    fn read_page(&self, addr: PageAddr, page: &mut [u8]) -> std::io::Result<()>;

    /// The copy of a replicated page at `addr` failed to read or to verify, and `page` is
    /// the verified content of another copy: write it there (or leave it to a later
    /// restripe when that disk takes no writes now). Returns whether the copy was
    /// rewritten; the default does nothing.
    fn repair_page(&self, _addr: PageAddr, _page: &[u8], _why: &str) -> bool {
        false
    }
}

/// A child of a branch, or a tree's root: a page on disk, or a changed node in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Child {
    Disk(PagePtr),
    Dirty(usize),
}

/// A B+tree node in memory. Clean nodes (in the cache) have only `Disk` children.
#[derive(Clone, Debug)]
pub(crate) enum Node {
    Leaf(Leaf),
    Branch {
        level: u8,
        /// `keys[i]` is the smallest key of `children[i + 1]`.
        keys: Vec<Key>,
        children: Vec<Child>,
    },
}

/// A key in a node, with its first sixteen bytes beside it as one big-endian integer. A
/// binary search over a node compares those integers, which lie in the node's own array,
/// and follows the pointer to a key's bytes only on a tie: with a pointer chase per
/// comparison, searches missed the processor cache at every step and dominated profiles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Key {
    prefix: u128,
    bytes: Vec<u8>,
}

impl Key {
    fn new(bytes: Vec<u8>) -> Key {
        Key {
            prefix: prefix_of(&bytes),
            bytes,
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Order against a searched-for key.
    #[inline]
    fn cmp_to(&self, probe: &Probe) -> Ordering {
        match self.prefix.cmp(&probe.prefix) {
            Ordering::Equal => key_cmp(&self.bytes, probe.bytes),
            other => other,
        }
    }
}

/// A searched-for key and its prefix, computed once per search.
pub(crate) struct Probe<'a> {
    pub(crate) prefix: u128,
    pub(crate) bytes: &'a [u8],
}

impl<'a> Probe<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Probe<'a> {
        Probe {
            prefix: prefix_of(bytes),
            bytes,
        }
    }
}

/// The first sixteen bytes, zero-padded, as a big-endian integer. Unequal prefixes order
/// two keys as their bytes do (where a shorter key is padded, it is a prefix of the other
/// up to there and so sorts first, or the padding ties); equal ones need the bytes.
#[inline]
pub(crate) fn prefix_of(bytes: &[u8]) -> u128 {
    let mut b = [0u8; 16];
    let n = bytes.len().min(16);
    b[..n].copy_from_slice(&bytes[..n]);
    u128::from_be_bytes(b)
}

impl Node {
    fn level(&self) -> u8 {
        match self {
            Node::Leaf(_) => 0,
            Node::Branch { level, .. } => *level,
        }
    }

    /// Memory this node takes in the cache: its heap buffers, the node itself and its
    /// cache entry (map slot, reference counts, CLOCK slot).
    pub(crate) fn memory_bytes(&self) -> usize {
        const ENTRY: usize = 64;
        let heap = match self {
            Node::Leaf(leaf) => leaf.heap_bytes(),
            Node::Branch { keys, children, .. } => {
                keys.capacity() * std::mem::size_of::<Key>()
                    + keys.iter().map(|k| k.bytes.capacity()).sum::<usize>()
                    + children.capacity() * std::mem::size_of::<Child>()
            }
        };
        heap + std::mem::size_of::<Node>() + ENTRY
    }

    fn bytes(&self, format: &PageFormat) -> usize {
        match self {
            Node::Leaf(leaf) => page::HEADER_BYTES + leaf.payload_bytes(),
            Node::Branch { keys, .. } => page::branch_bytes(format, keys.iter().map(|k| k.bytes())),
        }
    }

    fn from_decoded(d: Decoded) -> Node {
        match d {
            Decoded::Leaf(leaf) => Node::Leaf(leaf),
            Decoded::Branch { level, first, seps } => {
                let mut keys = Vec::with_capacity(seps.len());
                let mut children = Vec::with_capacity(seps.len() + 1);
                children.push(Child::Disk(first));
                for (k, c) in seps {
                    keys.push(Key::new(k));
                    children.push(Child::Disk(c));
                }
                Node::Branch {
                    level,
                    keys,
                    children,
                }
            }
        }
    }

    /// The on-disk form; every child must already be on disk.
    fn to_decoded(&self) -> Decoded {
        match self {
            Node::Leaf(leaf) => Decoded::Leaf(leaf.clone()),
            Node::Branch {
                level,
                keys,
                children,
            } => {
                let ptr = |c: &Child| match c {
                    Child::Disk(p) => *p,
                    Child::Dirty(_) => panic!("encoding a branch with a child in memory"),
                };
                Decoded::Branch {
                    level: *level,
                    first: ptr(&children[0]),
                    seps: keys
                        .iter()
                        .map(|k| k.bytes.clone())
                        .zip(children[1..].iter().map(ptr))
                        .collect(),
                }
            }
        }
    }
}

/// Index of the child of a branch that holds `key`: the number of separators <= key.
fn child_index(keys: &[Key], key: &Probe) -> usize {
    keys.partition_point(|k| k.cmp_to(key) != Ordering::Greater)
}

/// Bytewise key order. Keys are mostly big-endian numbers (an inode number, a tag, a
/// directory cookie or block index), so comparing eight bytes at a time as integers settles
/// most comparisons without a call to `memcmp`, which dominated lookups in profiles. Keys
/// of one directory share their first nine bytes, so one word is not enough.
#[inline]
pub(crate) fn key_cmp(a: &[u8], b: &[u8]) -> Ordering {
    let (mut a, mut b) = (a, b);
    while a.len() >= 8 && b.len() >= 8 {
        let x = u64::from_be_bytes(a[..8].try_into().expect("8 bytes"));
        let y = u64::from_be_bytes(b[..8].try_into().expect("8 bytes"));
        if x != y {
            return x.cmp(&y);
        }
        a = &a[8..];
        b = &b[8..];
    }
    a.cmp(b)
}

/// A handle on one B+tree. Not `Clone`: two handles on one changed tree would diverge.
#[derive(Debug, PartialEq, Eq)]
pub struct Tree {
    root: Child,
}

impl Tree {
    /// A tree whose root page is on disk (from a checkpoint's record).
    pub fn on_disk(root: PagePtr) -> Tree {
        Tree {
            root: Child::Disk(root),
        }
    }

    /// The root page when the tree has no change waiting for a checkpoint.
    pub fn root(&self) -> Option<PagePtr> {
        match self.root {
            Child::Disk(p) => Some(p),
            Child::Dirty(_) => None,
        }
    }

    pub fn is_dirty(&self) -> bool {
        matches!(self.root, Child::Dirty(_))
    }
}

/// What a checkpoint writes and what it frees.
#[derive(Debug)]
pub struct Checkpoint {
    pub generation: u64,
    /// Every changed page, children before parents, with its new address.
    pub pages: Vec<CheckpointPage>,
    /// Pages of earlier checkpoints that no tree reaches once this one is durable: free
    /// them only after the roots of this checkpoint are durable.
    pub superseded: Vec<PageAddr>,
}

/// One page of a checkpoint, encoded when it is written: the node itself (shared with the
/// cache, which keeps it pinned until the checkpoint is written), not its bytes. Encoded
/// copies of every changed page, held while the checkpoint writes outside the metadata
/// lock, were up to half the page pool again (16,384 pages of 16 KiB at the flusher's
/// threshold); encoding again per write batch costs a copy of the page and a checksum.
pub struct CheckpointPage {
    pub addr: PageAddr,
    /// Where the same bytes go a second time, when pages are replicated.
    pub mirror: Option<PageAddr>,
    node: Arc<Node>,
    generation: u64,
    format: PageFormat,
    /// The pointer the parent got when the checkpoint placed the page: the bytes written
    /// later must be the ones it describes.
    ptr: PagePtr,
}

impl std::fmt::Debug for CheckpointPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointPage")
            .field("addr", &self.addr)
            .field("generation", &self.generation)
            .field("ptr", &self.ptr)
            .finish_non_exhaustive()
    }
}

impl CheckpointPage {
    /// The page's bytes into `page` (one page long).
    pub fn encode(&self, page: &mut [u8]) {
        let mut ptr = encode_node(&self.format, &self.node, self.generation, self.addr, page);
        ptr.mirror = self.mirror;
        assert_eq!(
            ptr, self.ptr,
            "page {} encodes differently than when its checkpoint placed it",
            self.addr
        );
    }

    /// [`CheckpointPage::encode`] into a new buffer.
    pub fn bytes(&self) -> Vec<u8> {
        let mut page = vec![0u8; self.format.page_bytes];
        self.encode(&mut page);
        page
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub cached_pages: usize,
    /// Memory of the cached pages' nodes.
    pub cached_bytes: usize,
    /// Memory the changed pages are counted at in the pool.
    pub dirty_bytes: usize,
    pub dirty_pages: usize,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Pages read from their second copy because the first failed to read or verify.
    pub second_copy_reads: u64,
}

pub struct MetaStore {
    format: PageFormat,
    reader: Arc<dyn PageReader>,
    cache: PageCache,
    /// Changed nodes, waiting for the next checkpoint; `None` slots are free.
    dirty: Vec<Option<Arc<Node>>>,
    free_slots: Vec<usize>,
    dirty_count: usize,
    superseded: Vec<PageAddr>,
    /// Pages read from their second copy because the first failed.
    second_copy_reads: u64,
    /// Generation of the next checkpoint.
    generation: u64,
    poisoned: bool,
}

impl std::fmt::Debug for MetaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaStore")
            .field("format", &self.format)
            .field("stats", &self.stats())
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl MetaStore {
    /// A store whose next checkpoint is `generation` (one past the newest on disk, so that
    /// page generations only grow), caching up to `cache_pages` clean pages.
    pub fn new(
        format: PageFormat,
        reader: Arc<dyn PageReader>,
        cache_pages: usize,
        generation: u64,
    ) -> MetaStore {
        MetaStore {
            format,
            reader,
            cache: PageCache::new(cache_pages),
            dirty: Vec::new(),
            free_slots: Vec::new(),
            dirty_count: 0,
            superseded: Vec::new(),
            second_copy_reads: 0,
            generation,
            poisoned: false,
        }
    }

    pub fn format(&self) -> &PageFormat {
        &self.format
    }

    /// Pages written from the next checkpoint on carry second addresses in their branch
    /// pointers (version 2): metadata replication turned on for a live file system. Pages
    /// already on disk stay as they are (readable, one copy) until they are rewritten.
    pub fn mirror_from_now_on(&mut self) {
        self.format = self.format.with_mirrors();
    }

    pub fn set_cache_pages(&mut self, pages: usize) {
        self.cache.set_capacity(pages);
    }

    /// Bounds the memory of clean and changed pages together (`pagepool`); changed pages
    /// are counted at `dirty_page_memory` each.
    pub fn set_cache_bytes(&mut self, bytes: usize) {
        self.cache.set_capacity_bytes(bytes);
    }

    /// The memory a changed page is counted at: a leaf in memory takes its payload plus 4
    /// bytes an entry and grows by an eighth at a time while it changes.
    pub fn dirty_page_memory(&self) -> usize {
        self.format.page_bytes * 5 / 4
    }

    fn reserve_for_dirty(&mut self) {
        let bytes = self.dirty_count * self.dirty_page_memory();
        self.cache.set_reserved(self.dirty_count, bytes);
    }

    /// Changed pages in memory, waiting for a checkpoint.
    pub fn dirty_pages(&self) -> usize {
        self.dirty_count
    }

    pub fn stats(&self) -> StoreStats {
        StoreStats {
            cached_pages: self.cache.len(),
            cached_bytes: self.cache.bytes(),
            dirty_bytes: self.dirty_count * self.dirty_page_memory(),
            dirty_pages: self.dirty_count,
            hits: self.cache.hits,
            misses: self.cache.misses,
            evictions: self.cache.evictions,
            second_copy_reads: self.second_copy_reads,
        }
    }

    /// A new, empty tree (an empty leaf, written by the next checkpoint).
    pub fn create_tree(&mut self) -> Tree {
        Tree {
            root: Child::Dirty(self.add_dirty(Node::Leaf(Leaf::default()))),
        }
    }

    pub fn get(&mut self, tree: &Tree, key: &[u8]) -> MetaResult<Option<Vec<u8>>> {
        self.get_with(tree, key, <[u8]>::to_vec)
    }

    /// `f` of the value of `key`, read in place (a decoder need not copy the bytes first).
    pub fn get_with<R>(
        &mut self,
        tree: &Tree,
        key: &[u8],
        f: impl FnOnce(&[u8]) -> R,
    ) -> MetaResult<Option<R>> {
        let key = &Probe::new(key);
        let mut child = tree.root;
        let mut level = None;
        loop {
            let node = self.node(child, level)?;
            match &*node {
                Node::Leaf(leaf) => return Ok(leaf.search(key).ok().map(|i| f(leaf.value(i)))),
                Node::Branch {
                    level: l,
                    keys,
                    children,
                } => {
                    child = children[child_index(keys, key)];
                    level = Some(l - 1);
                }
            }
        }
    }

    /// Reads into the cache the pages on the path to `key` in each of `trees`, a level at a
    /// time, the pages of a level that are not cached read in parallel. A mount opens every
    /// shard's tree at its header: read one tree after another, that was a few dependent
    /// page reads per shard, hundreds in a row at 256 shards, each waiting on the disk
    /// (issue 14: mount time grew with the tree heights). Best effort: a page that fails
    /// to read or to verify here is left to the ordinary read, which tries its other copy,
    /// repairs or reports; a cache too small to keep the pages costs the reads again.
    pub fn prefetch_paths(&mut self, trees: &[&Tree], key: &[u8]) {
        let probe = Probe::new(key);
        let mut level_of_tree: Vec<(Child, Option<u8>)> =
            trees.iter().map(|t| (t.root, None)).collect();
        while !level_of_tree.is_empty() {
            let mut missing: Vec<(PagePtr, Option<u8>)> = Vec::new();
            let mut seen = std::collections::HashSet::new();
            for (child, level) in &level_of_tree {
                if let Child::Disk(ptr) = child {
                    if !self.cache.contains(ptr.addr) && seen.insert(ptr.addr) {
                        missing.push((*ptr, *level));
                    }
                }
            }
            let read: std::collections::HashMap<PageAddr, Arc<Node>> =
                self.read_first_copies(&missing).into_iter().collect();
            self.reserve_for_dirty();
            for (addr, node) in &read {
                self.cache.insert(*addr, node.clone(), None);
            }
            let mut next = Vec::with_capacity(level_of_tree.len());
            for (child, _) in level_of_tree {
                let node = match child {
                    Child::Dirty(id) => self.dirty[id].clone().expect("dirty slot in use"),
                    Child::Disk(ptr) => match read.get(&ptr.addr) {
                        Some(node) => node.clone(),
                        None => match self.cache.get(ptr.addr) {
                            Some(node) => node,
                            // Failed here: the ordinary read deals with it.
                            None => continue,
                        },
                    },
                };
                if let Node::Branch {
                    level,
                    keys,
                    children,
                } = &*node
                {
                    next.push((children[child_index(keys, &probe)], Some(level - 1)));
                }
            }
            level_of_tree = next;
        }
    }

    /// The nodes of the first copies of `pages` that read and verify, read and decoded by
    /// up to `PREFETCH_READERS` threads at once (the reader blocks on each read, and
    /// decoding a full branch page allocates each of its hundreds of keys).
    fn read_first_copies(&self, pages: &[(PagePtr, Option<u8>)]) -> Vec<(PageAddr, Arc<Node>)> {
        const PREFETCH_READERS: usize = 16;
        if pages.is_empty() {
            return Vec::new();
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let readers = PREFETCH_READERS.min(pages.len());
        let (format, reader) = (&self.format, &self.reader);
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..readers)
                .map(|_| {
                    s.spawn(|| {
                        let mut out = Vec::new();
                        let mut buf = vec![0u8; format.page_bytes];
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(&(ptr, level)) = pages.get(i) else {
                                return out;
                            };
                            if let Ok(decoded) =
                                read_copy(format, &**reader, ptr, ptr.addr, level, &mut buf)
                            {
                                out.push((ptr.addr, Arc::new(Node::from_decoded(decoded))));
                            }
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().expect("a prefetch reader panicked"))
                .collect()
        })
    }

    /// Inserts or replaces; returns the value replaced.
    pub fn insert(
        &mut self,
        tree: &mut Tree,
        key: &[u8],
        value: &[u8],
    ) -> MetaResult<Option<Vec<u8>>> {
        self.insert_keeping(tree, key, value, true)
    }

    /// [`MetaStore::insert`] without copying out the value replaced (a large value rewritten
    /// often, such as a block reference at every write into its block).
    pub fn put(&mut self, tree: &mut Tree, key: &[u8], value: &[u8]) -> MetaResult<()> {
        self.insert_keeping(tree, key, value, false).map(|_| ())
    }

    fn insert_keeping(
        &mut self,
        tree: &mut Tree,
        key: &[u8],
        value: &[u8],
        keep_old: bool,
    ) -> MetaResult<Option<Vec<u8>>> {
        let max = self.format.max_entry_bytes();
        if key.len() > page::MAX_KEY_BYTES || key.len() + value.len() > max {
            return Err(MetaError::EntryTooLarge {
                key: key.len(),
                value: value.len(),
                max,
            });
        }
        let root = self.make_dirty(tree.root, None)?;
        tree.root = Child::Dirty(root);
        let (old, split) = self.insert_at(root, &Probe::new(key), value, keep_old)?;
        if let Some((sep, right)) = split {
            let level = self.dirty_node(root).level() + 1;
            let new_root = self.add_dirty(Node::Branch {
                level,
                keys: vec![sep],
                children: vec![Child::Dirty(root), Child::Dirty(right)],
            });
            tree.root = Child::Dirty(new_root);
        }
        Ok(old)
    }

    /// Removes `key`; returns its value. A missing key changes nothing (no page is copied).
    pub fn remove(&mut self, tree: &mut Tree, key: &[u8]) -> MetaResult<Option<Vec<u8>>> {
        // One read-only descent finds the key and the child taken at each level; the change
        // then follows that path without searching again.
        let probe = Probe::new(key);
        let mut path = Vec::with_capacity(8);
        let mut child = tree.root;
        let mut level = None;
        loop {
            let node = self.node(child, level)?;
            match &*node {
                Node::Leaf(leaf) => match leaf.search(&probe) {
                    Ok(i) => {
                        path.push(i);
                        break;
                    }
                    Err(_) => return Ok(None),
                },
                Node::Branch {
                    level: l,
                    keys,
                    children,
                } => {
                    let i = child_index(keys, &probe);
                    path.push(i);
                    child = children[i];
                    level = Some(l - 1);
                }
            }
        }
        let root = self.make_dirty(tree.root, None)?;
        tree.root = Child::Dirty(root);
        let old = Some(self.remove_on_path(root, &path)?);
        // A root branch left with one child gives way to it.
        let mut root = Child::Dirty(root);
        loop {
            let only = match &*self.node(root, None)? {
                Node::Branch { children, .. } if children.len() == 1 => children[0],
                _ => break,
            };
            match root {
                Child::Dirty(id) => {
                    self.take_dirty(id);
                }
                Child::Disk(ptr) => self.supersede(ptr),
            }
            root = only;
        }
        tree.root = root;
        Ok(old)
    }

    /// Up to `limit` entries with `start <= key < end` (no end when `end` is None), in key
    /// order. Resuming a scan at the key after the last one returned sees every entry that
    /// was not removed meanwhile exactly once.
    pub fn range(
        &mut self,
        tree: &Tree,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> MetaResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        if limit > 0 {
            let end = end.map(Probe::new);
            self.collect(
                tree.root,
                None,
                &Probe::new(start),
                end.as_ref(),
                limit,
                &mut out,
            )?;
        }
        Ok(out)
    }

    /// The entry with the greatest key below `end` (or the greatest of all), if any.
    pub fn last_before(
        &mut self,
        tree: &Tree,
        end: Option<&[u8]>,
    ) -> MetaResult<Option<(Vec<u8>, Vec<u8>)>> {
        let end = end.map(Probe::new);
        self.last_rec(tree.root, None, end.as_ref())
    }

    /// Removes the whole tree; its pages on disk are superseded.
    pub fn drop_tree(&mut self, tree: Tree) -> MetaResult<()> {
        self.drop_rec(tree.root, None)
    }

    /// Every page on disk that the tree reaches, with its level (for fsck and for counting
    /// what a file system uses); both copies of a replicated page. Reads pages through the cache; changed nodes are walked
    /// but not reported (they have no address yet).
    pub fn visit_pages(&mut self, tree: &Tree, f: &mut dyn FnMut(PageAddr, u8)) -> MetaResult<()> {
        self.visit_rec(tree.root, None, f)
    }

    /// Reads every copy of every page on disk that `tree` reaches and checks it against its
    /// parent's pointer; a copy that fails is rewritten from one that verifies (through
    /// [`PageReader::repair_page`]). Returns (copies checked, copies repaired); a page none
    /// of whose copies verifies is an error naming it. Changed nodes are walked, not
    /// checked (they have no page yet).
    pub fn check_copies(&mut self, tree: &Tree) -> MetaResult<(u64, u64)> {
        let mut counts = (0, 0);
        let mut from: Option<Vec<u8>> = None;
        loop {
            let (c, r, next) = self.check_copies_from(tree, from.as_deref(), usize::MAX)?;
            counts = (counts.0 + c, counts.1 + r);
            match next {
                Some(k) => from = Some(k),
                None => return Ok(counts),
            }
        }
    }

    /// [`MetaStore::check_copies`] a part at a time, so that a caller can let go of its
    /// locks between parts: the leaves holding keys from `from` on (all with `None`), at
    /// most `leaves` of them, and the branches above them. Returns (copies checked, copies
    /// repaired, the key to go on from; `None` when the tree's end was reached). A tree
    /// changed between parts is checked as it is then: pages written meanwhile are new,
    /// with both copies just written.
    pub fn check_copies_from(
        &mut self,
        tree: &Tree,
        from: Option<&[u8]>,
        leaves: usize,
    ) -> MetaResult<(u64, u64, Option<Vec<u8>>)> {
        let mut counts = (0, 0);
        let mut budget = leaves.max(1);
        let from = Probe::new(from.unwrap_or(&[]));
        let next = self.check_rec(tree.root, None, &from, &mut budget, &mut counts)?;
        Ok((counts.0, counts.1, next))
    }

    fn check_rec(
        &mut self,
        child: Child,
        level: Option<u8>,
        from: &Probe,
        budget: &mut usize,
        counts: &mut (u64, u64),
    ) -> MetaResult<Option<Vec<u8>>> {
        if let Child::Disk(ptr) = child {
            self.check_page(ptr, level, counts)?;
        }
        let node = self.node(child, level)?;
        match &*node {
            Node::Leaf(_) => {
                *budget = budget.saturating_sub(1);
                Ok(None)
            }
            Node::Branch {
                level,
                keys,
                children,
            } => {
                let first = child_index(keys, from);
                for j in first..children.len() {
                    if *budget == 0 && j > first {
                        // Child j holds the keys from separator j - 1 on.
                        return Ok(Some(keys[j - 1].bytes.clone()));
                    }
                    if let Some(k) =
                        self.check_rec(children[j], Some(level - 1), from, budget, counts)?
                    {
                        return Ok(Some(k));
                    }
                }
                Ok(None)
            }
        }
    }

    /// Reads and checks every copy of the page `ptr` names, rewriting those that fail from
    /// one that verifies.
    fn check_page(
        &mut self,
        ptr: PagePtr,
        level: Option<u8>,
        counts: &mut (u64, u64),
    ) -> MetaResult<()> {
        let mut good: Option<Vec<u8>> = None;
        let mut bad = Vec::new();
        for addr in ptr.copies() {
            let mut buf = vec![0u8; self.format.page_bytes];
            counts.0 += 1;
            let checked = self
                .reader
                .read_page(addr, &mut buf)
                .map_err(|e| e.to_string())
                .and_then(|()| {
                    page::decode(&self.format, ptr, level, &buf).map_err(|e| e.to_string())
                });
            match checked {
                Ok(_) => good = Some(buf),
                Err(why) => bad.push((addr, why)),
            }
        }
        let Some(good) = good else {
            return Err(MetaError::Corrupt {
                addr: ptr.addr,
                reason: format!(
                    "no copy verifies: {}",
                    bad.iter()
                        .map(|(a, why)| format!("{a}: {why}"))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            });
        };
        for (addr, why) in bad {
            if self.reader.repair_page(addr, &good, &why) {
                counts.1 += 1;
            }
        }
        Ok(())
    }

    /// The pointer of every page on disk that the tree reaches, with the page's level
    /// (both addresses of a replicated page at once, unlike [`MetaStore::visit_pages`]).
    pub fn visit_pointers(
        &mut self,
        tree: &Tree,
        f: &mut dyn FnMut(&PagePtr, u8),
    ) -> MetaResult<()> {
        self.visit_pointers_rec(tree.root, None, f)
    }

    fn visit_pointers_rec(
        &mut self,
        child: Child,
        level: Option<u8>,
        f: &mut dyn FnMut(&PagePtr, u8),
    ) -> MetaResult<()> {
        let node = self.node(child, level)?;
        if let Child::Disk(ptr) = child {
            f(&ptr, node.level());
        }
        if let Node::Branch {
            level, children, ..
        } = &*node
        {
            for c in children {
                self.visit_pointers_rec(*c, Some(level - 1), f)?;
            }
        }
        Ok(())
    }

    /// Marks changed up to `budget` pages of `tree` whose address `moving` names, with the
    /// branches above them (which must point at the new copies), so that the next checkpoint
    /// writes them wherever the allocator now puts pages and supersedes the old ones: how a
    /// disk is emptied of metadata. Returns how many of those pages it marked; 0 means none
    /// of the tree's pages is where `moving` says. Leaves that stay are not read (their
    /// address is in their parent); branches are, through the cache.
    pub fn relocate(
        &mut self,
        tree: &mut Tree,
        moving: &dyn Fn(&PagePtr) -> bool,
        budget: usize,
    ) -> MetaResult<usize> {
        if self.poisoned {
            return Err(MetaError::Poisoned);
        }
        let mut left = budget;
        if let Some(id) = self.relocate_rec(tree.root, None, moving, &mut left)? {
            tree.root = Child::Dirty(id);
        }
        Ok(budget - left)
    }

    /// Gives every changed node of `trees` its address and page image, children before
    /// parents, and turns the trees' roots into pages. `allocate(n)` returns places for n
    /// pages (with a second address each when the format is mirrored and a second failure
    /// group has room)
    /// addresses (or fails, and then nothing has changed). Every changed node must belong
    /// to one of `trees`. The pages stay pinned in the cache until [`MetaStore::written`].
    pub fn checkpoint(
        &mut self,
        trees: &mut [&mut Tree],
        allocate: &mut dyn FnMut(usize) -> MetaResult<Vec<PagePlace>>,
    ) -> MetaResult<Checkpoint> {
        if self.poisoned {
            return Err(MetaError::Poisoned);
        }
        let generation = self.generation;
        let mut addrs = allocate(self.dirty_count)?;
        assert_eq!(
            addrs.len(),
            self.dirty_count,
            "allocator returned a wrong count"
        );
        assert!(
            self.format.mirrored || addrs.iter().all(|p| p.mirror.is_none()),
            "second copies for a store of one copy"
        );
        addrs.reverse();
        let mut pages = Vec::with_capacity(self.dirty_count);
        let mut scratch = vec![0u8; self.format.page_bytes];
        for tree in trees.iter_mut() {
            if let Child::Dirty(id) = tree.root {
                tree.root = Child::Disk(self.write_rec(
                    id,
                    generation,
                    &mut addrs,
                    &mut pages,
                    &mut scratch,
                ));
            }
        }
        assert_eq!(
            self.dirty_count, 0,
            "changed metadata pages that belong to no tree given to the checkpoint"
        );
        assert!(addrs.is_empty());
        self.dirty.clear();
        self.free_slots.clear();
        self.generation += 1;
        Ok(Checkpoint {
            generation,
            pages,
            superseded: std::mem::take(&mut self.superseded),
        })
    }

    /// Numbers the next checkpoint at least `generation` (an owner slot that took an
    /// allocation region whose chunks another owner last stored under its own numbering):
    /// generations only grow, so this never goes back.
    pub fn advance_generation(&mut self, generation: u64) {
        self.generation = self.generation.max(generation);
    }

    /// The pages of checkpoint `generation` are on disk: they may be evicted now.
    pub fn written(&mut self, generation: u64) {
        self.cache.unpin(generation);
    }

    /// A checkpoint's pages could not be written: the cache now names pages that are not on
    /// disk, so the store refuses further checkpoints (recovery is from the log).
    pub fn poison(&mut self) {
        self.poisoned = true;
    }

    // ---- internals ----

    fn add_dirty(&mut self, node: Node) -> usize {
        self.dirty_count += 1;
        // Changed pages take their room in `pagepool` from clean ones.
        self.reserve_for_dirty();
        let node = Some(Arc::new(node));
        match self.free_slots.pop() {
            Some(id) => {
                self.dirty[id] = node;
                id
            }
            None => {
                self.dirty.push(node);
                self.dirty.len() - 1
            }
        }
    }

    fn take_dirty(&mut self, id: usize) -> Arc<Node> {
        let node = self.dirty[id].take().expect("dirty slot in use");
        self.dirty_count -= 1;
        self.free_slots.push(id);
        node
    }

    fn dirty_node(&self, id: usize) -> &Node {
        self.dirty[id].as_deref().expect("dirty slot in use")
    }

    fn dirty_mut(&mut self, id: usize) -> &mut Node {
        Arc::make_mut(self.dirty[id].as_mut().expect("dirty slot in use"))
    }

    /// The node a child names, reading and checking its page on a cache miss.
    fn node(&mut self, child: Child, level: Option<u8>) -> MetaResult<Arc<Node>> {
        match child {
            Child::Dirty(id) => Ok(self.dirty[id].clone().expect("dirty slot in use")),
            Child::Disk(ptr) => {
                if let Some(node) = self.cache.get(ptr.addr) {
                    if let Some(want) = level {
                        assert_eq!(
                            node.level(),
                            want,
                            "cached page at {} changed level",
                            ptr.addr
                        );
                    }
                    return Ok(node);
                }
                let node = Arc::new(Node::from_decoded(self.read_copies(ptr, level)?));
                self.reserve_for_dirty();
                self.cache.insert(ptr.addr, node.clone(), None);
                Ok(node)
            }
        }
    }

    /// A page on disk that the next checkpoint no longer reaches: out of the cache, and all
    /// its copies freed once that checkpoint is durable.
    fn supersede(&mut self, ptr: PagePtr) {
        self.cache.remove(ptr.addr);
        self.superseded.extend(ptr.copies());
    }

    /// Reads and checks the page `ptr` names: its first copy, then its second when the
    /// first fails to read or to verify (the failed copy is then handed to the reader to
    /// repair). The error of the first copy is the one returned when both fail.
    fn read_copies(&mut self, ptr: PagePtr, level: Option<u8>) -> MetaResult<Decoded> {
        let mut buf = vec![0u8; self.format.page_bytes];
        let first = read_copy(&self.format, &*self.reader, ptr, ptr.addr, level, &mut buf);
        let (err, mirror) = match (first, ptr.mirror) {
            (Ok(node), _) => return Ok(node),
            (Err(e), None) => return Err(e),
            (Err(e), Some(mirror)) => (e, mirror),
        };
        let second = read_copy(&self.format, &*self.reader, ptr, mirror, level, &mut buf);
        match second {
            Ok(node) => {
                self.second_copy_reads += 1;
                self.reader.repair_page(ptr.addr, &buf, &err.to_string());
                Ok(node)
            }
            Err(e2) => Err(MetaError::Corrupt {
                addr: ptr.addr,
                reason: format!("both copies are unreadable: {err}; second copy: {e2}"),
            }),
        }
    }

    /// Copies a node on disk into memory to change it (its page is superseded); a node
    /// already in memory is changed where it is.
    fn make_dirty(&mut self, child: Child, level: Option<u8>) -> MetaResult<usize> {
        match child {
            Child::Dirty(id) => Ok(id),
            Child::Disk(ptr) => {
                let node = self.node(child, level)?;
                self.supersede(ptr);
                Ok(self.add_dirty(Arc::unwrap_or_clone(node)))
            }
        }
    }

    /// The child of changed branch `id` that holds `key`, made changeable and put back in
    /// its slot: its index and its node.
    fn dirty_child(&mut self, id: usize, key: &Probe) -> MetaResult<(usize, usize)> {
        let i = match self.dirty_node(id) {
            Node::Branch { keys, .. } => child_index(keys, key),
            Node::Leaf(_) => unreachable!("a leaf has no children"),
        };
        Ok((i, self.dirty_child_at(id, i)?))
    }

    /// Child `i` of changed branch `id`, made changeable and put back in its slot.
    fn dirty_child_at(&mut self, id: usize, i: usize) -> MetaResult<usize> {
        let (child, level) = match self.dirty_node(id) {
            Node::Branch {
                level, children, ..
            } => (children[i], *level),
            Node::Leaf(_) => unreachable!("a leaf has no children"),
        };
        let cid = self.make_dirty(child, Some(level - 1))?;
        if let Node::Branch { children, .. } = self.dirty_mut(id) {
            children[i] = Child::Dirty(cid);
        }
        Ok(cid)
    }

    /// Inserts into the changed node `id`; returns the old value and, when the node split,
    /// the separator and the new right sibling.
    #[allow(clippy::type_complexity)]
    fn insert_at(
        &mut self,
        id: usize,
        key: &Probe,
        value: &[u8],
        keep_old: bool,
    ) -> MetaResult<(Option<Vec<u8>>, Option<(Key, usize)>)> {
        let (i, cid) = match self.dirty_mut(id) {
            Node::Leaf(leaf) => {
                let (old, appended) = match leaf.search(key) {
                    Ok(i) if keep_old => (Some(leaf.set_value(i, value)), false),
                    Ok(i) => {
                        leaf.replace_value(i, value);
                        (None, false)
                    }
                    Err(i) => {
                        let appended = i == leaf.len();
                        leaf.insert(i, key.bytes, value);
                        (None, appended)
                    }
                };
                let split = if appended {
                    self.split_appended(id)
                } else {
                    self.split_if_full(id)
                };
                return Ok((old, split));
            }
            Node::Branch { .. } => self.dirty_child(id, key)?,
        };
        let (old, split) = self.insert_at(cid, key, value, keep_old)?;
        let Node::Branch { keys, children, .. } = self.dirty_mut(id) else {
            unreachable!()
        };
        if let Some((sep, right)) = split {
            keys.insert(i, sep);
            children.insert(i + 1, Child::Dirty(right));
        }
        Ok((old, self.split_if_full(id)))
    }

    /// Splits a changed leaf that overflowed because a key was added after all of its
    /// entries: the old entries stay (they fitted before), the new one starts the right
    /// page. Keys that only grow (a shard's inode records, numbered in creation order) thus
    /// fill their pages; splitting those in the middle left every page half empty forever,
    /// twice the pages to cache, read and write. A random insert lands last in its leaf
    /// rarely, and the page it starts fills like any other.
    fn split_appended(&mut self, id: usize) -> Option<(Key, usize)> {
        let page_bytes = self.format.page_bytes;
        if self.dirty_node(id).bytes(&self.format) <= page_bytes {
            return None;
        }
        let Node::Leaf(leaf) = self.dirty_mut(id) else {
            unreachable!("only leaves take appends")
        };
        assert!(
            leaf.len() >= 2,
            "an overflowing leaf holds two entries at least"
        );
        let right = leaf.split_off(leaf.len() - 1);
        let sep = Key::new(right.key(0).to_vec());
        assert!(
            self.dirty_node(id).bytes(&self.format) <= page_bytes,
            "the entries before an append fitted their page"
        );
        let right = Node::Leaf(right);
        assert!(
            right.bytes(&self.format) <= page_bytes,
            "one entry fits a page"
        );
        Some((sep, self.add_dirty(right)))
    }

    /// Splits a changed node that no longer fits its page into two that do, choosing the
    /// split point that leaves the larger half smallest.
    fn split_if_full(&mut self, id: usize) -> Option<(Key, usize)> {
        let page_bytes = self.format.page_bytes;
        if self.dirty_node(id).bytes(&self.format) <= page_bytes {
            return None;
        }
        let entry_overhead = page::branch_entry_overhead(&self.format);
        let (sep, right) = match self.dirty_mut(id) {
            Node::Leaf(leaf) => {
                let sizes: Vec<usize> = (0..leaf.len()).map(|i| leaf.entry_bytes(i)).collect();
                let m = best_split(&sizes, 1, |_| 0);
                let right = leaf.split_off(m);
                (Key::new(right.key(0).to_vec()), Node::Leaf(right))
            }
            Node::Branch {
                level,
                keys,
                children,
            } => {
                let sizes: Vec<usize> = keys
                    .iter()
                    .map(|k| entry_overhead + k.bytes.len())
                    .collect();
                // Separator m moves up: left keeps keys[..m], right gets keys[m + 1..].
                let m = best_split(&sizes, 0, |m| sizes[m]);
                let right_keys = keys.split_off(m + 1);
                let sep = keys.pop().expect("separator");
                let right_children = children.split_off(m + 1);
                (
                    sep,
                    Node::Branch {
                        level: *level,
                        keys: right_keys,
                        children: right_children,
                    },
                )
            }
        };
        assert!(
            self.dirty_node(id).bytes(&self.format) <= page_bytes,
            "left half of a split overflows"
        );
        assert!(
            right.bytes(&self.format) <= page_bytes,
            "right half of a split overflows"
        );
        Some((sep, self.add_dirty(right)))
    }

    /// Removes the entry at the end of `path` (the child index at each level, then the
    /// entry's index in its leaf) under changed node `id`; returns its value.
    fn remove_on_path(&mut self, id: usize, path: &[usize]) -> MetaResult<Vec<u8>> {
        let i = path[0];
        let cid = match self.dirty_mut(id) {
            Node::Leaf(leaf) => return Ok(leaf.remove(i)),
            Node::Branch { .. } => self.dirty_child_at(id, i)?,
        };
        let old = self.remove_on_path(cid, &path[1..])?;
        if self.dirty_node(cid).bytes(&self.format) < self.format.page_bytes / 4 {
            let child_level = self.dirty_node(cid).level();
            self.merge_child(id, i, child_level)?;
        }
        Ok(old)
    }

    /// Merges child `i` of branch `id` with a neighbour when both fit one page.
    fn merge_child(&mut self, id: usize, i: usize, child_level: u8) -> MetaResult<()> {
        let (l, r, lchild, rchild, sep) = match self.dirty_node(id) {
            Node::Branch { keys, children, .. } => {
                if children.len() < 2 {
                    return Ok(());
                }
                let l = if i + 1 < children.len() { i } else { i - 1 };
                (l, l + 1, children[l], children[l + 1], keys[l].clone())
            }
            Node::Leaf(_) => unreachable!("merge under a leaf"),
        };
        let lnode = self.node(lchild, Some(child_level))?;
        let rnode = self.node(rchild, Some(child_level))?;
        // Size first: building the merged node copies every entry of both.
        let merged_bytes = match (&*lnode, &*rnode) {
            (Node::Leaf(a), Node::Leaf(b)) => {
                page::HEADER_BYTES + a.payload_bytes() + b.payload_bytes()
            }
            (Node::Branch { keys: ak, .. }, Node::Branch { keys: bk, .. }) => page::branch_bytes(
                &self.format,
                ak.iter()
                    .chain(std::iter::once(&sep))
                    .chain(bk)
                    .map(|k| k.bytes()),
            ),
            _ => unreachable!("siblings at different levels"),
        };
        if merged_bytes > self.format.page_bytes {
            return Ok(());
        }
        let merged = match (&*lnode, &*rnode) {
            (Node::Leaf(a), Node::Leaf(b)) => Node::Leaf(a.concat(b)),
            (
                Node::Branch {
                    level,
                    keys: ak,
                    children: ac,
                },
                Node::Branch {
                    keys: bk,
                    children: bc,
                    ..
                },
            ) => Node::Branch {
                level: *level,
                keys: ak
                    .iter()
                    .cloned()
                    .chain(std::iter::once(sep))
                    .chain(bk.iter().cloned())
                    .collect(),
                children: ac.iter().chain(bc).copied().collect(),
            },
            _ => unreachable!("siblings at different levels"),
        };
        debug_assert_eq!(merged.bytes(&self.format), merged_bytes);
        // The merged node replaces both: what they were is superseded (on disk) or dropped
        // (in memory), and their children now belong to it.
        for c in [lchild, rchild] {
            match c {
                Child::Dirty(cid) => {
                    self.take_dirty(cid);
                }
                Child::Disk(ptr) => self.supersede(ptr),
            }
        }
        let mid = self.add_dirty(merged);
        if let Node::Branch { keys, children, .. } = self.dirty_mut(id) {
            keys.remove(l);
            children.remove(r);
            children[l] = Child::Dirty(mid);
        }
        Ok(())
    }

    fn collect(
        &mut self,
        child: Child,
        level: Option<u8>,
        start: &Probe,
        end: Option<&Probe>,
        limit: usize,
        out: &mut Vec<(Vec<u8>, Vec<u8>)>,
    ) -> MetaResult<()> {
        let node = self.node(child, level)?;
        match &*node {
            Node::Leaf(leaf) => {
                for i in leaf.below(start)..leaf.len() {
                    if out.len() >= limit
                        || end.is_some_and(|e| leaf.cmp_key(i, e) != Ordering::Less)
                    {
                        break;
                    }
                    out.push((leaf.key(i).to_vec(), leaf.value(i).to_vec()));
                }
            }
            Node::Branch {
                level,
                keys,
                children,
            } => {
                for j in child_index(keys, start)..children.len() {
                    if out.len() >= limit
                        || (j > 0 && end.is_some_and(|e| keys[j - 1].cmp_to(e) != Ordering::Less))
                    {
                        break;
                    }
                    self.collect(children[j], Some(level - 1), start, end, limit, out)?;
                }
            }
        }
        Ok(())
    }

    #[allow(clippy::type_complexity)]
    fn last_rec(
        &mut self,
        child: Child,
        level: Option<u8>,
        end: Option<&Probe>,
    ) -> MetaResult<Option<(Vec<u8>, Vec<u8>)>> {
        let node = self.node(child, level)?;
        match &*node {
            Node::Leaf(leaf) => {
                let upto = match end {
                    Some(e) => leaf.below(e),
                    None => leaf.len(),
                };
                Ok(upto
                    .checked_sub(1)
                    .map(|i| (leaf.key(i).to_vec(), leaf.value(i).to_vec())))
            }
            Node::Branch {
                level,
                keys,
                children,
            } => {
                // The child that holds `end` may have nothing below it; then look left.
                let top = match end {
                    Some(e) => keys.partition_point(|k| k.cmp_to(e) == Ordering::Less),
                    None => keys.len(),
                };
                for j in (0..=top).rev() {
                    if let Some(found) = self.last_rec(children[j], Some(level - 1), end)? {
                        return Ok(Some(found));
                    }
                }
                Ok(None)
            }
        }
    }

    fn drop_rec(&mut self, child: Child, level: Option<u8>) -> MetaResult<()> {
        let node = match child {
            Child::Dirty(id) => self.take_dirty(id),
            Child::Disk(ptr) => {
                self.superseded.extend(ptr.copies());
                if level == Some(0) {
                    // A leaf on disk has no children: no need to read it.
                    self.cache.remove(ptr.addr);
                    return Ok(());
                }
                let node = self.node(child, level)?;
                self.cache.remove(ptr.addr);
                node
            }
        };
        if let Node::Branch {
            level, children, ..
        } = &*node
        {
            for c in children {
                self.drop_rec(*c, Some(level - 1))?;
            }
        }
        Ok(())
    }

    /// `relocate` below `child`: the id of `child`'s changed copy when this call made it
    /// changed (its parent must then point at it), `None` when it stays as it was.
    fn relocate_rec(
        &mut self,
        child: Child,
        level: Option<u8>,
        moving: &dyn Fn(&PagePtr) -> bool,
        left: &mut usize,
    ) -> MetaResult<Option<usize>> {
        if *left == 0 {
            return Ok(None);
        }
        if let Child::Disk(ptr) = child {
            if level == Some(0) && !moving(&ptr) {
                return Ok(None);
            }
        }
        let node = self.node(child, level)?;
        let mut made = None;
        let mut id = match child {
            Child::Dirty(id) => Some(id),
            Child::Disk(ptr) if moving(&ptr) => {
                *left -= 1;
                let id = self.make_dirty(child, level)?;
                made = Some(id);
                Some(id)
            }
            Child::Disk(_) => None,
        };
        if let Node::Branch {
            level: l, children, ..
        } = &*node
        {
            for (i, c) in children.iter().enumerate() {
                if *left == 0 {
                    break;
                }
                let Some(cid) = self.relocate_rec(*c, Some(l - 1), moving, left)? else {
                    continue;
                };
                let pid = match id {
                    Some(pid) => pid,
                    None => {
                        let pid = self.make_dirty(child, level)?;
                        made = Some(pid);
                        id = Some(pid);
                        pid
                    }
                };
                if let Node::Branch { children, .. } = self.dirty_mut(pid) {
                    children[i] = Child::Dirty(cid);
                }
            }
        }
        Ok(made)
    }

    fn visit_rec(
        &mut self,
        child: Child,
        level: Option<u8>,
        f: &mut dyn FnMut(PageAddr, u8),
    ) -> MetaResult<()> {
        let node = self.node(child, level)?;
        if let Child::Disk(ptr) = child {
            for addr in ptr.copies() {
                f(addr, node.level());
            }
        }
        if let Node::Branch {
            level, children, ..
        } = &*node
        {
            for c in children {
                self.visit_rec(*c, Some(level - 1), f)?;
            }
        }
        Ok(())
    }

    fn write_rec(
        &mut self,
        id: usize,
        generation: u64,
        addrs: &mut Vec<PagePlace>,
        pages: &mut Vec<CheckpointPage>,
        scratch: &mut [u8],
    ) -> PagePtr {
        let mut node = self.take_dirty(id);
        match Arc::make_mut(&mut node) {
            Node::Branch { children, .. } => {
                for c in children.iter_mut() {
                    if let Child::Dirty(cid) = *c {
                        *c = Child::Disk(self.write_rec(cid, generation, addrs, pages, scratch));
                    }
                }
            }
            // It stays cached as a clean page: without the room it grew for changes.
            Node::Leaf(leaf) => leaf.shrink_to_fit(),
        }
        let PagePlace { addr, mirror } = addrs.pop().expect("an address for every changed page");
        // Encoded here for the pointer the parent keeps (it carries the page's checksum),
        // and again when the page is written.
        let mut ptr = encode_node(&self.format, &node, generation, addr, scratch);
        ptr.mirror = mirror;
        pages.push(CheckpointPage {
            addr,
            mirror,
            node: Arc::clone(&node),
            generation,
            format: self.format,
            ptr,
        });
        self.reserve_for_dirty();
        self.cache.insert(addr, node, Some(generation));
        ptr
    }
}

/// A node's page; a leaf is encoded where it is (it is its page's payload already).
/// The copy of the page `ptr` names that is at `addr` (its first or its second), read
/// and checked.
fn read_copy(
    format: &PageFormat,
    reader: &dyn PageReader,
    ptr: PagePtr,
    addr: PageAddr,
    level: Option<u8>,
    buf: &mut [u8],
) -> MetaResult<Decoded> {
    reader
        .read_page(addr, buf)
        .map_err(|source| MetaError::Io { addr, source })?;
    page::decode(format, ptr, level, buf)
}

fn encode_node(
    format: &PageFormat,
    node: &Node,
    generation: u64,
    addr: PageAddr,
    page: &mut [u8],
) -> PagePtr {
    match node {
        Node::Leaf(leaf) => page::encode_leaf(format, leaf, generation, addr, page),
        Node::Branch { .. } => page::encode(format, &node.to_decoded(), generation, addr, page),
    }
}

/// The split point that minimises the larger half. Entry `m` goes right for leaves
/// (`min_left` = 1 keeps the left non-empty); for branches entry `m` moves up and is
/// counted in neither half (`moved(m)` is its size).
fn best_split(sizes: &[usize], min_left: usize, moved: impl Fn(usize) -> usize) -> usize {
    let total: usize = sizes.iter().sum();
    let mut left = 0;
    let mut best = (usize::MAX, min_left);
    for (m, size) in sizes.iter().enumerate() {
        if m >= min_left && m < sizes.len() {
            let right = total - left - moved(m);
            let worst = left.max(right);
            if worst < best.0 {
                best = (worst, m);
            }
        }
        left += size;
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::{key_cmp, Key, Probe};
    use proptest::prelude::*;

    proptest! {
        /// The word-at-a-time comparison is exactly bytewise order, for keys that share
        /// long prefixes (as a directory's do) and keys of any length.
        #[test]
        fn key_order_is_bytewise(
            prefix in proptest::collection::vec(any::<u8>(), 0..20),
            a in proptest::collection::vec(0u8..3, 0..20),
            b in proptest::collection::vec(0u8..3, 0..20),
        ) {
            let a: Vec<u8> = prefix.iter().chain(&a).copied().collect();
            let b: Vec<u8> = prefix.iter().chain(&b).copied().collect();
            prop_assert_eq!(key_cmp(&a, &b), a.cmp(&b));
            prop_assert_eq!(Key::new(a.clone()).cmp_to(&Probe::new(&b)), a.cmp(&b));
        }
    }
}
