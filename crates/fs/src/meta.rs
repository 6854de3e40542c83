//! The metadata state machine. Every change to metadata is a [`Change`]; the metanode logs a
//! transaction (a list of changes) to its recovery log, then applies it with [`MetaState::apply`].
//! Mount applies the same records in the same order after loading the checkpoint, so live
//! state and recovered state come from one function and cannot drift apart.

use std::collections::{BTreeMap, HashMap, VecDeque};

use rustc_hash::{FxHashMap, FxHashSet};

use serde::{Deserialize, Serialize};
use tessera_alloc::Extent;
use tessera_meta::{MetaStore, PagePtr, Tree};

use crate::error::{FsError, FsResult};
use crate::inode::{Alternative, Attr, BlockRef, DirEntry, FileKind, Ino};
use crate::shard_tree::{
    DirItem, DirProbe, InodeRecord, Item, RecordContent, ShardHeader, ShardTree,
};

/// One logged metadata change. Changes carry results (inode numbers, cookies, checksums), never
/// decisions, so replay is deterministic.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Change {
    /// Creates the inode if it does not exist, otherwise replaces its attributes.
    PutAttr(Attr),
    DirInsert {
        dir: Ino,
        name: Vec<u8>,
        entry: DirEntry,
    },
    DirRemove {
        dir: Ino,
        name: Vec<u8>,
    },
    /// Sets a directory's parent (after a rename across directories).
    SetParent {
        dir: Ino,
        parent: Ino,
    },
    /// Replaces the content with inline bytes, freeing any blocks.
    Inline {
        ino: Ino,
        data: Vec<u8>,
    },
    /// Maps file block `index`, freeing the extent it replaces. A block with one copy only:
    /// its record keeps the form it had before replication (see [`Change::map_block`]).
    MapBlock {
        ino: Ino,
        index: u64,
        #[serde(with = "single_copy")]
        block: BlockRef,
    },
    /// New checksums for sectors `first..first+crcs.len()` of block `index`. With `in_place`
    /// the previous checksum of each written sector is kept as an alternative until the write
    /// is known to be on disk (see [`BlockRef::pending`]).
    Sectors {
        ino: Ino,
        index: u64,
        first: u32,
        crcs: Vec<u32>,
        in_place: bool,
    },
    /// Forgets the pending alternatives of sectors whose in-place write completed.
    Settle {
        ino: Ino,
        index: u64,
        first: u32,
        count: u32,
    },
    /// Drops every block at or past `size` and marks sectors past `size` in the last block
    /// unwritten.
    Truncate {
        ino: Ino,
        size: u64,
        block_size: u64,
    },
    /// Unmaps one block (hole punching).
    Unmap {
        ino: Ino,
        index: u64,
    },
    SetXattr {
        ino: Ino,
        name: Vec<u8>,
        value: Vec<u8>,
    },
    RemoveXattr {
        ino: Ino,
        name: Vec<u8>,
    },
    /// Removes the inode and frees all its blocks.
    FreeInode {
        ino: Ino,
    },
    /// Puts the file's data in storage pool `pool` from now on (a placement rule's choice
    /// at create). Last of the variants: records are postcard, which numbers them in order.
    SetPool {
        ino: Ino,
        pool: tessera_alloc::PoolId,
    },
    /// An in-place write of sector `sector` of block `index` did not land before a crash:
    /// the disk holds its alternative `to`, which becomes the sector's content again (its
    /// pending alternative is dropped). Logged before another in-place write of the sector,
    /// whose own alternative must be what the disk really holds.
    Revert {
        ino: Ino,
        index: u64,
        sector: u32,
        to: crate::inode::Alternative,
    },
    /// Request `seq` of client `client` (a namespace change from another node's mount,
    /// `MetanodeRequest::Once`) was done, in the same record as its changes: a new owner
    /// that replays this log answers the client's retry of it (its answer died with the
    /// old owner) with its result instead of doing it twice (EEXIST for its own create).
    Answered {
        client: u64,
        seq: u64,
    },
    /// [`Change::MapBlock`] of a block with more than one copy (data replication): every
    /// extent the block had and this one does not is freed.
    MapCopies {
        ino: Ino,
        index: u64,
        block: BlockRef,
    },
    /// The number of copies the file's blocks should have from now on (`-r` at create,
    /// `file attr set --replication`); `restripe -r` brings its existing blocks there.
    SetReplicas {
        ino: Ino,
        copies: u8,
    },
    /// Copies of block `index` that no longer hold its data (their write failed, or their
    /// disk is down) leave the block reference and are freed; when the first copy goes,
    /// the next one takes its place. Only the copy list changes, so it can be logged while
    /// other writers change the block's checksums.
    DropCopies {
        ino: Ino,
        index: u64,
        extents: Vec<Extent>,
    },
    /// Sets a directory's size, the bytes its entries take ([`dirent_bytes`]), which
    /// `DirInsert` and `DirRemove` keep and `PutAttr` leaves alone: fsck's repair of a
    /// directory whose size disagrees with its entries (one made before directories had a
    /// size).
    DirSize {
        dir: Ino,
        size: u64,
    },
}

/// The bytes an entry of a name of `name_len` bytes takes in its directory, as stored (its
/// key and value in the shard tree): a directory's size (`st_size`) is the sum over its
/// entries, so that it grows and shrinks with them as on other file systems.
pub fn dirent_bytes(name_len: usize) -> u64 {
    crate::shard_tree::DIRENT_FIXED_BYTES + name_len as u64
}

impl Change {
    /// The change that maps `block` as block `index` of `ino`, in the record form its
    /// number of copies needs: single-copy blocks keep the form older logs hold.
    pub fn map_block(ino: Ino, index: u64, block: BlockRef) -> Change {
        if block.copies.is_empty() {
            Change::MapBlock { ino, index, block }
        } else {
            Change::MapCopies { ino, index, block }
        }
    }

    /// The block a `MapBlock` or `MapCopies` maps.
    pub fn mapped_block(&self) -> Option<(Ino, u64, &BlockRef)> {
        match self {
            Change::MapBlock { ino, index, block } | Change::MapCopies { ino, index, block } => {
                Some((*ino, *index, block))
            }
            _ => None,
        }
    }
}

/// The log form of a block reference in [`Change::MapBlock`]: the fields it had before
/// blocks had copies (postcard is not self-describing, so a new field would make every
/// older record undecodable). Blocks with copies go in [`Change::MapCopies`].
mod single_copy {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use tessera_alloc::Extent;

    use crate::inode::{Alternative, BlockRef};

    #[derive(Serialize)]
    struct Borrowed<'a> {
        extent: &'a Extent,
        crcs: &'a Vec<u32>,
        unwritten: &'a Vec<u64>,
        pending: &'a BTreeMap<u32, Alternative>,
    }

    #[derive(Deserialize)]
    struct Owned {
        extent: Extent,
        crcs: Vec<u32>,
        unwritten: Vec<u64>,
        pending: BTreeMap<u32, Alternative>,
    }

    pub fn serialize<S: Serializer>(b: &BlockRef, s: S) -> Result<S::Ok, S::Error> {
        assert!(
            b.copies.is_empty(),
            "a block with copies is logged as MapCopies (Change::map_block)"
        );
        Borrowed {
            extent: &b.extent,
            crcs: &b.crcs,
            unwritten: &b.unwritten,
            pending: &b.pending,
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BlockRef, D::Error> {
        let o = Owned::deserialize(d)?;
        Ok(BlockRef {
            extent: o.extent,
            crcs: o.crcs,
            unwritten: o.unwritten,
            pending: o.pending,
            copies: Vec::new(),
        })
    }
}

/// Client requests remembered as answered, at most (see [`Change::Answered`]): far more
/// than the requests in flight at an owner's death.
const ANSWERED_MAX: usize = 65_536;

/// What an inode's content is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentKind {
    Inline,
    Blocks,
    Dir,
    None,
}

/// Metadata of every shard this node owns: one shard tree each over one page store. The
/// shard headers (next inode number, inode count) are kept in memory as well, since every
/// create and statfs reads them.
pub struct MetaState {
    pub(crate) store: MetaStore,
    /// The trees of the shards this owner holds, by shard number; `None` for shards the
    /// owner map gives to another owner slot.
    pub(crate) shards: Vec<Option<ShardTree>>,
    headers: Vec<ShardHeader>,
    /// Each shard's header as its tree holds it: a checkpoint writes only the headers that
    /// differ, so that it changes no page of a shard nothing touched (with hundreds of
    /// shards, writing every header dirtied a leaf of every tree at every checkpoint).
    stored_headers: Vec<ShardHeader>,
    /// Decoded inode records of recently used inodes (GPFS's `maxFilesToCache`): every
    /// operation reads the attributes of the inodes it names, often several times, and a
    /// record read from its page costs a tree descent and a decode. Written through. `None`
    /// remembers that an inode does not exist (freed ones: the kernel still asks about them).
    inodes: FxHashMap<Ino, Option<InodeRecord>>,
    /// The keys of `inodes` in the order they came in, each once: records leave first in,
    /// first out. (Taking the map's first key instead scanned ever more empty buckets at
    /// its front: 8 % of the daemon's CPU in a create of millions of files.)
    inode_order: VecDeque<Ino>,
    inode_cache_max: usize,
    /// Attributes alone of inodes that left `inodes` (GPFS's `maxStatCache`): a compact
    /// entry that keeps `ls -l` and `stat` of a large directory off the pages.
    stats: FxHashMap<Ino, Attr>,
    /// The keys of `stats` in the order they came in; may also hold keys since removed (an
    /// inode whose record came back), skipped when they reach the front.
    stat_order: VecDeque<Ino>,
    stat_cache_max: usize,
    /// Inode numbers handed out and not yet created: their first PutAttr need not look for
    /// an existing record. Cleared at each checkpoint (numbers never used are skipped).
    fresh: FxHashSet<Ino>,
    /// The last directory probe, valid until the next change: an operation looks a name up
    /// in its permission check, again to act, and once more when its change is applied.
    dir_memo: Option<(Ino, Vec<u8>, DirProbe)>,
    /// Pending alternatives of in-place writes (see [`Change::Sectors`]) kept beside the
    /// tree rather than in it, until they settle or a checkpoint moves them into the tree.
    /// Nearly every in-place write settles within milliseconds: stored in the block's
    /// reference, each would grow and then shrink that 4 KiB item, moving its leaf's bytes
    /// twice and writing the reference back twice per write. A block's pending
    /// alternatives are those of its reference and these together, a sector in one of them
    /// at most; [`MetaState::blocks`] hands out the two merged.
    unsettled: HashMap<(Ino, u64), BTreeMap<u32, Alternative>>,
    /// Client requests done since the last checkpoint (see [`Change::Answered`]), oldest
    /// first in `answered_order`. Not checkpointed: a retry comes right after a takeover,
    /// whose replay starts at the dead owner's last checkpoint.
    answered: FxHashSet<(u64, u64)>,
    answered_order: VecDeque<(u64, u64)>,
}

/// Inode records cached by default (`maxFilesToCache`).
pub const DEFAULT_INODE_CACHE: usize = 50_000;
/// Attribute-only entries cached by default (`maxStatCache`).
pub const DEFAULT_STAT_CACHE: usize = 100_000;

fn missing_block(ino: Ino, index: u64) -> FsError {
    corrupt(format!("inode {ino} has no block {index}"))
}

fn corrupt(what: String) -> FsError {
    FsError::Corrupt(what)
}

impl MetaState {
    /// Fresh, empty shards (mkfs).
    pub fn create(mut store: MetaStore, shard_count: u32) -> FsResult<MetaState> {
        assert!(shard_count >= 1);
        let n = u64::from(shard_count);
        let mut shards = Vec::with_capacity(shard_count as usize);
        let mut headers = Vec::with_capacity(shard_count as usize);
        for s in 0..n {
            // Inode 0 is never used; shard s hands out s, s+n, s+2n, ... from 2 on (1 is
            // the root directory).
            let t = ShardTree::create(&mut store, first_ino(s, n))?;
            headers.push(t.header(&mut store)?);
            shards.push(Some(t));
        }
        Ok(MetaState::with(store, shards, headers))
    }

    fn with(
        store: MetaStore,
        shards: Vec<Option<ShardTree>>,
        headers: Vec<ShardHeader>,
    ) -> MetaState {
        MetaState {
            store,
            shards,
            stored_headers: headers.clone(),
            headers,
            inodes: FxHashMap::default(),
            inode_order: VecDeque::new(),
            inode_cache_max: DEFAULT_INODE_CACHE,
            stats: FxHashMap::default(),
            stat_order: VecDeque::new(),
            stat_cache_max: DEFAULT_STAT_CACHE,
            fresh: FxHashSet::default(),
            dir_memo: None,
            unsettled: HashMap::new(),
            answered: FxHashSet::default(),
            answered_order: VecDeque::new(),
        }
    }

    /// Whether request `seq` of client `client` was done (see [`Change::Answered`]).
    pub fn was_answered(&self, client: u64, seq: u64) -> bool {
        self.answered.contains(&(client, seq))
    }

    /// Bounds the cache of inode records.
    pub fn set_inode_cache(&mut self, records: usize) {
        self.inode_cache_max = records.max(1);
        while self.inodes.len() > self.inode_cache_max {
            self.evict_one();
        }
    }

    /// Bounds the cache of attributes of inodes not in the record cache; 0 turns it off.
    pub fn set_stat_cache(&mut self, entries: usize) {
        self.stat_cache_max = entries;
        while self.stats.len() > self.stat_cache_max {
            self.evict_stat();
        }
    }

    /// Drops a record; its attributes stay in the stat cache.
    fn evict_one(&mut self) {
        let Some(ino) = self.inode_order.pop_front() else {
            return;
        };
        let entry = self.inodes.remove(&ino);
        debug_assert!(entry.is_some(), "inode_order names each cached record once");
        if let Some(Some(rec)) = entry {
            if self.stat_cache_max > 0 {
                if self.stats.len() >= self.stat_cache_max {
                    self.evict_stat();
                }
                self.stats.insert(ino, rec.attr);
                self.stat_order.push_back(ino);
            }
        }
    }

    fn evict_stat(&mut self) {
        while let Some(ino) = self.stat_order.pop_front() {
            if self.stats.remove(&ino).is_some() {
                return;
            }
        }
    }

    fn cache_record(&mut self, ino: Ino, rec: Option<&InodeRecord>) {
        let new = !self.inodes.contains_key(&ino);
        if new && self.inodes.len() >= self.inode_cache_max {
            self.evict_one();
        }
        // The record cache holds the newest attributes from here on.
        if self.stats.remove(&ino).is_some() && self.stat_order.len() > 2 * self.stats.len() + 1024
        {
            self.compact_stat_order();
        }
        if new {
            self.inode_order.push_back(ino);
        }
        self.inodes.insert(ino, rec.cloned());
        debug_assert_eq!(self.inode_order.len(), self.inodes.len());
    }

    /// Drops the keys of `stat_order` no longer in `stats`, and repeats of a key (an inode
    /// that left and came back), keeping the last: its place in the queue.
    fn compact_stat_order(&mut self) {
        let mut seen = FxHashSet::default();
        let mut kept: VecDeque<Ino> = self
            .stat_order
            .iter()
            .rev()
            .filter(|ino| self.stats.contains_key(ino) && seen.insert(**ino))
            .copied()
            .collect();
        kept.make_contiguous().reverse();
        self.stat_order = kept;
    }

    /// Entries in the record and stat caches.
    pub fn inode_cache_len(&self) -> (usize, usize) {
        (self.inodes.len(), self.stats.len())
    }

    /// The shards of a checkpoint, from their root pages: `None` for a shard this owner does
    /// not hold (the owner map gives it to another owner slot), which is never read.
    pub fn open(mut store: MetaStore, roots: &[Option<PagePtr>]) -> FsResult<MetaState> {
        let shards: Vec<Option<ShardTree>> =
            roots.iter().map(|r| r.map(ShardTree::on_disk)).collect();
        ShardTree::prefetch_headers(&mut store, &shards.iter().flatten().collect::<Vec<_>>());
        let headers = shards
            .iter()
            .map(|t| match t {
                Some(t) => t.header(&mut store),
                None => Ok(ShardHeader::default()),
            })
            .collect::<FsResult<Vec<_>>>()?;
        Ok(MetaState::with(store, shards, headers))
    }

    /// Inodes in shard `shard` (0 for one this owner does not hold).
    pub fn shard_inode_count(&self, shard: usize) -> u64 {
        self.headers.get(shard).map_or(0, |h| h.inode_count)
    }

    /// Whether this owner holds shard `shard`.
    pub fn holds(&self, shard: usize) -> bool {
        self.shards.get(shard).is_some_and(Option::is_some)
    }

    /// The shards this owner holds, in order.
    pub fn held_shards(&self) -> Vec<usize> {
        (0..self.shards.len()).filter(|s| self.holds(*s)).collect()
    }

    /// The page shard `shard`'s tree was opened from or last checkpointed to (`None`: not
    /// held, or changed since).
    pub(crate) fn shard_root(&self, shard: usize) -> Option<tessera_meta::PageAddr> {
        self.shards
            .get(shard)
            .and_then(Option::as_ref)
            .and_then(|t| t.tree.root())
            .map(|p| p.addr)
    }

    /// Starts holding each shard of `taken` from its root page (the owner map gave them to
    /// this owner's slot since the mount). Their headers are read first, all of them
    /// together: a shard that fails to read leaves every one of them untaken.
    pub(crate) fn take_shards(&mut self, taken: &[(usize, PagePtr)]) -> FsResult<()> {
        let trees: Vec<ShardTree> = taken
            .iter()
            .map(|(shard, root)| {
                assert!(!self.holds(*shard), "shard {shard} is held already");
                ShardTree::on_disk(*root)
            })
            .collect();
        ShardTree::prefetch_headers(&mut self.store, &trees.iter().collect::<Vec<_>>());
        let headers = trees
            .iter()
            .map(|t| t.header(&mut self.store))
            .collect::<FsResult<Vec<_>>>()?;
        for ((tree, header), (shard, _)) in trees.into_iter().zip(headers).zip(taken) {
            self.shards[*shard] = Some(tree);
            self.headers[*shard] = header;
            self.stored_headers[*shard] = header;
        }
        self.dir_memo = None;
        Ok(())
    }

    /// Stops holding shard `shard` (the owner map gave it to another slot): its tree and
    /// everything cached of its inodes are forgotten. The caller has checkpointed it.
    pub(crate) fn release_shard(&mut self, shard: usize) {
        let n = self.shard_count();
        self.shards[shard] = None;
        self.headers[shard] = ShardHeader::default();
        self.stored_headers[shard] = ShardHeader::default();
        let of = |ino: &Ino| ino % n == shard as u64;
        self.inodes.retain(|ino, _| !of(ino));
        self.inode_order.retain(|ino| !of(ino));
        self.stats.retain(|ino, _| !of(ino));
        self.fresh.retain(|ino| !of(ino));
        self.unsettled.retain(|(ino, _), _| !of(ino));
        self.dir_memo = None;
    }

    /// The shard of a new directory: directories spread over the shards this owner holds,
    /// so that the namespace (and the metanodes, once shards move) balance.
    pub fn shard_for_new_directory(&self) -> usize {
        let held = self.held_shards();
        assert!(!held.is_empty(), "an owner holds at least one shard");
        held[(self.inode_count() % held.len() as u64) as usize]
    }

    /// The tree of shard `shard` and the page store, or why this owner cannot reach it.
    fn tree_at(&mut self, shard: usize) -> FsResult<(&mut ShardTree, &mut MetaStore)> {
        match self.shards.get_mut(shard) {
            Some(Some(t)) => Ok((t, &mut self.store)),
            _ => Err(FsError::ShardElsewhere {
                shard: shard as u32,
            }),
        }
    }

    pub fn shard_count(&self) -> u64 {
        self.shards.len() as u64
    }

    pub fn shard_of(&self, ino: Ino) -> usize {
        (ino % self.shard_count()) as usize
    }

    pub fn inode_count(&self) -> u64 {
        self.headers.iter().map(|h| h.inode_count).sum()
    }

    /// Reserves an inode number in `shard` (the caller logs it in a PutAttr; a number never
    /// logged is simply skipped).
    pub fn allocate_ino(&mut self, shard: usize) -> Ino {
        assert!(
            self.holds(shard),
            "inode numbers come from a shard this owner holds"
        );
        let n = self.shard_count();
        let h = &mut self.headers[shard];
        let ino = h.next_ino;
        h.next_ino += n;
        self.fresh.insert(ino);
        ino
    }

    /// Reserves inode number `ino` in `shard`, the number a dead owner gave a `Make` it
    /// answered before its log had it (`early_answer.rs`): numbers are never given twice,
    /// so it is free unless that log had it after all.
    pub fn allocate_ino_as(&mut self, shard: usize, ino: Ino) -> FsResult<Ino> {
        assert!(
            self.holds(shard),
            "inode numbers come from a shard this owner holds"
        );
        if self.shard_of(ino) != shard || self.find_attr(ino)?.is_some() {
            return Err(FsError::Exists);
        }
        let n = self.shard_count();
        let h = &mut self.headers[shard];
        if h.next_ino <= ino {
            h.next_ino = ino + n;
        }
        self.fresh.insert(ino);
        Ok(ino)
    }

    /// Marks changed up to `budget` metadata pages that `moving` names, over every shard's
    /// tree (see `MetaStore::relocate`); the next checkpoint writes them elsewhere.
    pub(crate) fn relocate_pages(
        &mut self,
        moving: &dyn Fn(&tessera_meta::PagePtr) -> bool,
        budget: usize,
    ) -> FsResult<usize> {
        let mut marked = 0;
        for shard in self.shards.iter_mut().flatten() {
            if marked == budget {
                break;
            }
            marked += self
                .store
                .relocate(&mut shard.tree, moving, budget - marked)
                .map_err(crate::shard_tree::meta_err)?;
        }
        Ok(marked)
    }

    /// Every copy of the pages of shard `shard`'s tree that hold keys from `from` on, at
    /// most `leaves` leaves and the branches above them, read and checked; failed copies
    /// rewritten from one that verifies. Returns (copies checked, copies rewritten, where to
    /// go on; `None` at the tree's end).
    pub(crate) fn check_page_copies(
        &mut self,
        shard: usize,
        from: Option<&[u8]>,
        leaves: usize,
    ) -> FsResult<(u64, u64, Option<Vec<u8>>)> {
        let Some(Some(tree)) = self.shards.get(shard) else {
            return Ok((0, 0, None));
        };
        let tree = &tree.tree;
        self.store
            .check_copies_from(tree, from, leaves)
            .map_err(crate::shard_tree::meta_err)
    }

    /// The trees and the store, for a checkpoint.
    pub(crate) fn trees_mut(&mut self) -> (&mut MetaStore, Vec<&mut Tree>) {
        (
            &mut self.store,
            self.shards
                .iter_mut()
                .flatten()
                .map(|s| &mut s.tree)
                .collect(),
        )
    }

    pub(crate) fn store_mut(&mut self) -> &mut MetaStore {
        &mut self.store
    }

    fn record(&mut self, ino: Ino) -> FsResult<Option<InodeRecord>> {
        self.peek(ino, InodeRecord::clone)
    }

    /// `f` of the inode's record, without copying it out of the cache.
    fn peek<R>(&mut self, ino: Ino, f: impl FnOnce(&InodeRecord) -> R) -> FsResult<Option<R>> {
        if let Some(rec) = self.inodes.get(&ino) {
            return Ok(rec.as_ref().map(f));
        }
        let s = self.shard_of(ino);
        let (t, store) = self.tree_at(s)?;
        let rec = t.inode(store, ino)?;
        self.cache_record(ino, rec.as_ref());
        Ok(rec.as_ref().map(f))
    }

    fn must(&mut self, ino: Ino) -> FsResult<InodeRecord> {
        self.record(ino)?
            .ok_or_else(|| corrupt(format!("log names missing inode {ino}")))
    }

    fn put(&mut self, rec: &InodeRecord) -> FsResult<()> {
        let s = self.shard_of(rec.attr.ino);
        let (t, store) = self.tree_at(s)?;
        t.put_inode(store, rec)?;
        self.cache_record(rec.attr.ino, Some(rec));
        Ok(())
    }

    fn shard_for(&mut self, ino: Ino) -> FsResult<(&mut ShardTree, &mut MetaStore)> {
        let s = self.shard_of(ino);
        self.tree_at(s)
    }

    // ---- reads ----
    //
    // Every read of metadata outside this module goes through these methods, which return
    // owned values and take `&mut self`: a read may load pages into the cache.

    /// The attributes of `ino`; `NotFound` when it does not exist.
    pub fn attr(&mut self, ino: Ino) -> FsResult<Attr> {
        self.find_attr(ino)?.ok_or(FsError::NotFound)
    }

    pub fn find_attr(&mut self, ino: Ino) -> FsResult<Option<Attr>> {
        if let Some(attr) = self.stats.get(&ino) {
            return Ok(Some(*attr));
        }
        self.peek(ino, |r| r.attr)
    }

    /// The parent of directory `dir` (`NotFound` if `dir` does not exist, `NotDir` if it is
    /// not a directory).
    pub fn dir_parent(&mut self, dir: Ino) -> FsResult<Ino> {
        let content = self.peek(dir, |r| match r.content {
            RecordContent::Dir { parent } => Some(parent),
            _ => None,
        })?;
        content.ok_or(FsError::NotFound)?.ok_or(FsError::NotDir)
    }

    /// The entry `name` of directory `dir` and the free cookie of its hash, remembered until
    /// the next change.
    fn probe(&mut self, dir: Ino, name: &[u8]) -> FsResult<DirProbe> {
        if let Some((d, n, p)) = &self.dir_memo {
            if *d == dir && n == name {
                return Ok(p.clone());
            }
        }
        let (t, store) = self.shard_for(dir)?;
        let p = t.dir_probe(store, dir, name)?;
        self.dir_memo = Some((dir, name.to_vec(), p.clone()));
        Ok(p)
    }

    /// The entry `name` of directory `dir`.
    pub fn lookup(&mut self, dir: Ino, name: &[u8]) -> FsResult<Option<DirEntry>> {
        self.dir_parent(dir)?;
        Ok(self.probe(dir, name)?.found.map(|e| DirEntry {
            ino: e.ino,
            kind: e.kind,
            cookie: e.cookie,
        }))
    }

    pub fn dir_is_empty(&mut self, dir: Ino) -> FsResult<bool> {
        self.dir_parent(dir)?;
        let (t, store) = self.shard_for(dir)?;
        t.dir_is_empty(store, dir)
    }

    /// Up to `limit` entries of `dir` with cookies greater than `after`, in cookie order.
    pub fn dir_entries(
        &mut self,
        dir: Ino,
        after: u64,
        limit: usize,
    ) -> FsResult<Vec<(Vec<u8>, DirEntry)>> {
        self.dir_parent(dir)?;
        let (t, store) = self.shard_for(dir)?;
        Ok(t.dir_list(store, dir, after.saturating_add(1), limit)?
            .into_iter()
            .map(|e| {
                (
                    e.name,
                    DirEntry {
                        ino: e.ino,
                        kind: e.kind,
                        cookie: e.cookie,
                    },
                )
            })
            .collect())
    }

    /// The readdir cookie a new entry `name` of `dir` gets.
    pub fn new_cookie(&mut self, dir: Ino, name: &[u8]) -> FsResult<u64> {
        self.dir_parent(dir)?;
        self.probe(dir, name)?
            .free
            .ok_or_else(crate::shard_tree::hash_slots_full)
    }

    /// What the inode's content is.
    pub fn content_kind(&mut self, ino: Ino) -> FsResult<ContentKind> {
        Ok(match self.record(ino)?.ok_or(FsError::NotFound)?.content {
            RecordContent::Inline(_) => ContentKind::Inline,
            RecordContent::Blocks { .. } => ContentKind::Blocks,
            RecordContent::Dir { .. } => ContentKind::Dir,
            RecordContent::None => ContentKind::None,
        })
    }

    /// The inode's content kind, its bytes when they are inline, and the pool a placement
    /// rule chose (`None`: the default data pool), from one look at its record.
    #[allow(clippy::type_complexity)]
    pub fn content_of(
        &mut self,
        ino: Ino,
    ) -> FsResult<(
        ContentKind,
        Option<Vec<u8>>,
        Option<tessera_alloc::PoolId>,
        u8,
    )> {
        self.peek(ino, |r| {
            let (kind, inline) = match &r.content {
                RecordContent::Inline(d) => (ContentKind::Inline, Some(d.clone())),
                RecordContent::Blocks { .. } => (ContentKind::Blocks, None),
                RecordContent::Dir { .. } => (ContentKind::Dir, None),
                RecordContent::None => (ContentKind::None, None),
            };
            (kind, inline, r.pool, r.copies)
        })?
        .ok_or(FsError::NotFound)
    }

    /// The storage pool a placement rule chose for the file's data; `None` for the file
    /// system's default data pool.
    pub fn pool_of(&mut self, ino: Ino) -> FsResult<Option<tessera_alloc::PoolId>> {
        self.peek(ino, |r| r.pool)?.ok_or(FsError::NotFound)
    }

    /// The inline bytes of a small file or symlink; `None` when the content is not inline.
    pub fn inline_data(&mut self, ino: Ino) -> FsResult<Option<Vec<u8>>> {
        Ok(match self.record(ino)?.ok_or(FsError::NotFound)?.content {
            RecordContent::Inline(d) => Some(d),
            _ => None,
        })
    }

    /// The mapped blocks of a file with indexes in `range`, in index order.
    pub fn blocks(
        &mut self,
        ino: Ino,
        range: std::ops::Range<u64>,
    ) -> FsResult<Vec<(u64, BlockRef)>> {
        if range.start >= range.end {
            return Ok(Vec::new());
        }
        let limit = usize::try_from(range.end - range.start).unwrap_or(usize::MAX);
        let (t, store) = self.shard_for(ino)?;
        let mut blocks: Vec<(u64, BlockRef)> = t
            .blocks(store, ino, range.start, limit)?
            .into_iter()
            .take_while(|(i, _)| *i < range.end)
            .collect();
        if !self.unsettled.is_empty() {
            for (index, b) in &mut blocks {
                if let Some(u) = self.unsettled.get(&(ino, *index)) {
                    b.pending.extend(u.iter().map(|(s, a)| (*s, *a)));
                }
            }
        }
        Ok(blocks)
    }

    /// Moves the pending alternatives kept beside the tree into their blocks' references,
    /// so that a checkpoint holds them (a crash after it replays no `Sectors` to rebuild
    /// them). Called under the metadata lock as the checkpoint is prepared.
    pub(crate) fn unsettled_into_tree(&mut self) -> FsResult<()> {
        for ((ino, index), alternatives) in std::mem::take(&mut self.unsettled) {
            let s = self.shard_of(ino);
            let (t, store) = self.tree_at(s)?;
            t.modify_block(store, ino, index, |b| {
                b.pending.extend(alternatives);
                Ok(true)
            })?;
        }
        Ok(())
    }

    /// Forgets the pending alternatives kept beside the tree of the sectors of block `index`
    /// of `ino` that `gone` names (settled, reverted or truncated away).
    fn drop_unsettled(&mut self, ino: Ino, index: u64, gone: impl Fn(u32) -> bool) {
        if let Some(u) = self.unsettled.get_mut(&(ino, index)) {
            u.retain(|s, _| !gone(*s));
            if u.is_empty() {
                self.unsettled.remove(&(ino, index));
            }
        }
    }

    /// Forgets the pending alternatives kept beside the tree for blocks of `ino` at or past
    /// `from` (blocks unmapped or replaced).
    fn forget_unsettled(&mut self, ino: Ino, from: u64) {
        if !self.unsettled.is_empty() {
            self.unsettled.retain(|(i, x), _| *i != ino || *x < from);
        }
    }

    /// The sub-blocks of `sub_block_bytes` an inode holds, for `st_blocks`: its block map's,
    /// or for a directory the sub-blocks its entries would fill (they share the shard's
    /// metadata pages with others, so this is what they take, not pages of their own).
    pub fn held_sub_blocks(&mut self, ino: Ino, sub_block_bytes: u64) -> FsResult<u64> {
        let rec = self.record(ino)?.ok_or(FsError::NotFound)?;
        Ok(match rec.content {
            RecordContent::Blocks {
                allocated_sub_blocks,
            } => allocated_sub_blocks,
            RecordContent::Dir { .. } => rec.attr.size.div_ceil(sub_block_bytes.max(1)),
            _ => 0,
        })
    }

    pub fn xattr(&mut self, ino: Ino, name: &[u8]) -> FsResult<Option<Vec<u8>>> {
        if !self.may_have_xattrs(ino)? {
            return Ok(None);
        }
        let (t, store) = self.shard_for(ino)?;
        t.xattr(store, ino, name)
    }

    pub fn xattr_names(&mut self, ino: Ino) -> FsResult<Vec<Vec<u8>>> {
        if !self.may_have_xattrs(ino)? {
            return Ok(Vec::new());
        }
        let (t, store) = self.shard_for(ino)?;
        t.xattr_names(store, ino)
    }

    /// The stored value, whatever the inode's record says (fsck).
    pub(crate) fn stored_xattr(&mut self, ino: Ino, name: &[u8]) -> FsResult<Option<Vec<u8>>> {
        let (t, store) = self.shard_for(ino)?;
        t.xattr(store, ino, name)
    }

    /// False when the inode's record says it has no extended attributes; `NotFound` when
    /// there is no such inode.
    fn may_have_xattrs(&mut self, ino: Ino) -> FsResult<bool> {
        self.peek(ino, |r| r.xattrs)?.ok_or(FsError::NotFound)
    }

    /// Inodes unlinked while open when the previous owner stopped.
    pub fn orphans(&mut self) -> FsResult<Vec<Ino>> {
        let mut out = Vec::new();
        for t in self.shards.iter().flatten() {
            out.extend(t.orphans(&mut self.store)?);
        }
        Ok(out)
    }

    /// A batch of shard `shard`'s items from key `from` on (see `ShardTree::scan_batch`).
    pub(crate) fn scan_batch(
        &mut self,
        shard: usize,
        from: &[u8],
        limit: usize,
    ) -> FsResult<(Vec<Item>, Option<Vec<u8>>)> {
        match self.shards.get(shard) {
            Some(Some(t)) => t.scan_batch(&mut self.store, from, limit),
            // A shard another slot holds has nothing to scan here.
            _ => Ok((Vec::new(), None)),
        }
    }

    /// Calls `f` for every item of every shard, in key order (fsck, the allocation map).
    pub(crate) fn scan(&mut self, f: &mut dyn FnMut(Item) -> FsResult<()>) -> FsResult<()> {
        for t in self.shards.iter().flatten() {
            t.scan(&mut self.store, f)?;
        }
        Ok(())
    }

    // ---- changes ----

    /// Applies one change; returns the extents it stopped referencing.
    pub fn apply(&mut self, change: &Change) -> FsResult<Vec<Extent>> {
        let result = self.apply_change(change);
        // Whatever the change touched (or half-touched, on an error) is no longer what the
        // last probe saw.
        self.dir_memo = None;
        result
    }

    fn apply_change(&mut self, change: &Change) -> FsResult<Vec<Extent>> {
        let mut freed = Vec::new();
        match change {
            Change::PutAttr(attr) => self.put_attr(attr)?,
            Change::DirInsert { dir, name, entry } => {
                // The logger chose the cookie: a free slot of the name's hash (no entry of
                // that name exists), or the slot of the same name (an exchange).
                let mut rec = self.dir_record(*dir)?;
                let item = DirItem {
                    cookie: entry.cookie,
                    name: name.clone(),
                    ino: entry.ino,
                    kind: entry.kind,
                };
                let (t, store) = self.shard_for(*dir)?;
                match t.dir_insert(store, *dir, &item)? {
                    Some(old) if old.name != *name => {
                        return Err(corrupt(format!(
                            "log puts an entry of directory {dir} over another name's cookie {:#x}",
                            entry.cookie
                        )));
                    }
                    // The same name again (an exchange): the same bytes.
                    Some(_) => {}
                    None => {
                        rec.attr.size += dirent_bytes(name.len());
                        self.put(&rec)?;
                    }
                }
            }
            Change::DirRemove { dir, name } => {
                let mut rec = self.dir_record(*dir)?;
                let found = self.probe(*dir, name)?.found;
                let (t, store) = self.shard_for(*dir)?;
                let removed = match found {
                    Some(item) => t.dir_remove_cookie(store, *dir, item.cookie)?,
                    None => false,
                };
                if !removed {
                    return Err(corrupt(format!(
                        "log removes missing entry from directory {dir}"
                    )));
                }
                // Saturating: a directory made before directories had a size says 0 until
                // fsck sets it.
                rec.attr.size = rec.attr.size.saturating_sub(dirent_bytes(name.len()));
                self.put(&rec)?;
            }
            Change::DirSize { dir, size } => {
                let mut rec = self.dir_record(*dir)?;
                rec.attr.size = *size;
                self.put(&rec)?;
            }
            Change::SetParent { dir, parent } => {
                let mut rec = self.dir_record(*dir)?;
                rec.content = RecordContent::Dir { parent: *parent };
                self.put(&rec)?;
            }
            Change::Inline { ino, data } => {
                let mut rec = self.must(*ino)?;
                self.free_blocks_from(*ino, 0, &mut freed)?;
                rec.content = RecordContent::Inline(data.clone());
                self.put(&rec)?;
            }
            Change::MapBlock { ino, index, block } | Change::MapCopies { ino, index, block } => {
                let mut rec = self.must(*ino)?;
                let mut allocated = self.blocks_content(&mut rec)?;
                let (t, store) = self.shard_for(*ino)?;
                let old = t.put_block(store, *ino, *index, block)?;
                self.unsettled.remove(&(*ino, *index));
                allocated += block.allocated_sub_blocks();
                if let Some(old) = old {
                    allocated -= old.allocated_sub_blocks();
                    freed.extend(old.extents().filter(|e| !block.extents().any(|n| n == *e)));
                }
                rec.content = RecordContent::Blocks {
                    allocated_sub_blocks: allocated,
                };
                self.put(&rec)?;
            }
            Change::Sectors {
                ino,
                index,
                first,
                crcs,
                in_place,
            } => {
                let s = self.shard_of(*ino);
                let unsettled = &mut self.unsettled;
                let (Some(Some(t)), store) = (self.shards.get_mut(s), &mut self.store) else {
                    return Err(FsError::ShardElsewhere { shard: s as u32 });
                };
                let found = t.modify_block(store, *ino, *index, |b| {
                    let end = *first as usize + crcs.len();
                    if end > b.sectors() {
                        return Err(corrupt(format!(
                            "log writes past block {index} of inode {ino}"
                        )));
                    }
                    for (i, crc) in crcs.iter().enumerate() {
                        let s = *first as usize + i;
                        if *in_place {
                            let before = if b.is_unwritten(s) {
                                Alternative::Unwritten
                            } else {
                                Alternative::Crc(b.crcs[s])
                            };
                            if before != Alternative::Crc(*crc) {
                                let s = s as u32;
                                if let Some(in_tree) = b.pending.get_mut(&s) {
                                    *in_tree = before;
                                } else {
                                    unsettled
                                        .entry((*ino, *index))
                                        .or_default()
                                        .insert(s, before);
                                }
                            }
                        }
                        b.set_written(s, *crc);
                    }
                    Ok(true)
                })?;
                if found.is_none() {
                    return Err(missing_block(*ino, *index));
                }
            }
            Change::Settle {
                ino,
                index,
                first,
                count,
            } => {
                self.drop_unsettled(*ino, *index, |s| (*first..first + count).contains(&s));
                // A checkpoint may have moved some into the reference (or the mount found
                // them there): changed only if so.
                let (t, store) = self.shard_for(*ino)?;
                t.modify_block(store, *ino, *index, |b| {
                    let before = b.pending.len();
                    for s in *first..first + count {
                        b.pending.remove(&s);
                    }
                    Ok(b.pending.len() != before)
                })?;
            }
            Change::Revert {
                ino,
                index,
                sector,
                to,
            } => {
                self.drop_unsettled(*ino, *index, |s| s == *sector);
                let (t, store) = self.shard_for(*ino)?;
                let found = t.modify_block(store, *ino, *index, |b| {
                    let s = *sector as usize;
                    if s >= b.sectors() {
                        return Err(corrupt(format!(
                            "log reverts sector {s} past block {index} of inode {ino}"
                        )));
                    }
                    match to {
                        crate::inode::Alternative::Crc(crc) => b.set_written(s, *crc),
                        crate::inode::Alternative::Unwritten => b.set_unwritten(s),
                    }
                    b.pending.remove(sector);
                    Ok(true)
                })?;
                if found.is_none() {
                    return Err(missing_block(*ino, *index));
                }
            }
            Change::Truncate {
                ino,
                size,
                block_size,
            } => self.truncate(*ino, *size, *block_size, &mut freed)?,
            Change::Unmap { ino, index } => {
                self.unsettled.remove(&(*ino, *index));
                let mut rec = self.must(*ino)?;
                let mut allocated = self.blocks_content(&mut rec)?;
                let (t, store) = self.shard_for(*ino)?;
                if let Some(old) = t.remove_block(store, *ino, *index)? {
                    allocated -= old.allocated_sub_blocks();
                    freed.extend(old.extents());
                    rec.content = RecordContent::Blocks {
                        allocated_sub_blocks: allocated,
                    };
                    self.put(&rec)?;
                }
            }
            Change::SetXattr { ino, name, value } => {
                let mut rec = self.must(*ino)?;
                let (t, store) = self.shard_for(*ino)?;
                t.set_xattr(store, *ino, name, value)?;
                if !rec.xattrs {
                    rec.xattrs = true;
                    self.put(&rec)?;
                }
            }
            Change::RemoveXattr { ino, name } => {
                let mut rec = self.must(*ino)?;
                let (t, store) = self.shard_for(*ino)?;
                t.remove_xattr(store, *ino, name)?;
                if rec.xattrs && t.xattr_names(store, *ino)?.is_empty() {
                    rec.xattrs = false;
                    self.put(&rec)?;
                }
            }
            Change::Answered { client, seq } => {
                if self.answered.insert((*client, *seq)) {
                    self.answered_order.push_back((*client, *seq));
                }
                while self.answered_order.len() > ANSWERED_MAX {
                    let oldest = self.answered_order.pop_front().expect("not empty");
                    self.answered.remove(&oldest);
                }
            }
            Change::SetPool { ino, pool } => {
                let mut rec = self.must(*ino)?;
                rec.pool = Some(*pool);
                self.put(&rec)?;
            }
            Change::DropCopies {
                ino,
                index,
                extents,
            } => {
                let mut dropped = Vec::new();
                let (t, store) = self.shard_for(*ino)?;
                let found = t.modify_block(store, *ino, *index, |b| {
                    for e in extents {
                        if b.extent == *e {
                            if b.copies.is_empty() {
                                return Err(corrupt(format!(
                                    "log drops the only copy of block {index} of inode {ino}"
                                )));
                            }
                            b.extent = b.copies.remove(0);
                            dropped.push(*e);
                        } else if let Some(p) = b.copies.iter().position(|c| c == e) {
                            b.copies.remove(p);
                            dropped.push(*e);
                        }
                    }
                    Ok(!dropped.is_empty())
                })?;
                if found.is_none() {
                    return Err(missing_block(*ino, *index));
                }
                if !dropped.is_empty() {
                    let mut rec = self.must(*ino)?;
                    let allocated = self.blocks_content(&mut rec)?;
                    let gone: u64 = dropped.iter().map(|e| u64::from(e.sub_blocks)).sum();
                    rec.content = RecordContent::Blocks {
                        allocated_sub_blocks: allocated.saturating_sub(gone),
                    };
                    self.put(&rec)?;
                    freed.extend(dropped);
                }
            }
            Change::SetReplicas { ino, copies } => {
                if !(1..=crate::inode::COPIES_MAX as u8).contains(copies) {
                    return Err(corrupt(format!(
                        "log gives inode {ino} {copies} data copies"
                    )));
                }
                let mut rec = self.must(*ino)?;
                rec.copies = *copies;
                self.put(&rec)?;
            }
            Change::FreeInode { ino } => {
                let rec = self
                    .must(*ino)
                    .map_err(|_| corrupt(format!("log frees missing inode {ino}")))?;
                let s = self.shard_of(*ino);
                self.cache_record(*ino, None);
                self.forget_unsettled(*ino, 0);
                // Only a block map, a directory's entries or extended attributes put items
                // under an inode besides its record.
                let alone = !rec.xattrs
                    && matches!(rec.content, RecordContent::Inline(_) | RecordContent::None);
                let blocks = if alone {
                    let (t, store) = self.tree_at(s)?;
                    t.remove_record(store, *ino)?;
                    Vec::new()
                } else {
                    let (t, store) = self.tree_at(s)?;
                    t.remove_inode(store, *ino)?
                };
                freed.extend(blocks.iter().flat_map(BlockRef::extents));
                if rec.attr.nlink == 0 {
                    let (t, store) = self.tree_at(s)?;
                    t.set_orphan(store, *ino, false)?;
                }
                self.headers[s].inode_count -= 1;
            }
        }
        Ok(freed)
    }

    fn dir_record(&mut self, dir: Ino) -> FsResult<InodeRecord> {
        let rec = self.must(dir)?;
        if !matches!(rec.content, RecordContent::Dir { .. }) {
            return Err(corrupt(format!("inode {dir} is not a directory")));
        }
        Ok(rec)
    }

    /// The sub-blocks a file's block map holds; the first mapped block replaces inline data
    /// (the writer copied the inline bytes into that block before logging the change).
    fn blocks_content(&mut self, rec: &mut InodeRecord) -> FsResult<u64> {
        match &rec.content {
            RecordContent::Blocks {
                allocated_sub_blocks,
            } => Ok(*allocated_sub_blocks),
            RecordContent::Inline(_) => Ok(0),
            _ => Err(corrupt(format!("inode {} has no block map", rec.attr.ino))),
        }
    }

    /// Unmaps every block at or past `from`; returns the sub-blocks they held.
    fn free_blocks_from(&mut self, ino: Ino, from: u64, freed: &mut Vec<Extent>) -> FsResult<u64> {
        self.forget_unsettled(ino, from);
        let (t, store) = self.shard_for(ino)?;
        let mut released = 0;
        loop {
            let batch = t.blocks(store, ino, from, 256)?;
            if batch.is_empty() {
                return Ok(released);
            }
            for (index, b) in batch {
                t.remove_block(store, ino, index)?;
                released += b.allocated_sub_blocks();
                freed.extend(b.extents());
            }
        }
    }

    fn truncate(
        &mut self,
        ino: Ino,
        size: u64,
        block_size: u64,
        freed: &mut Vec<Extent>,
    ) -> FsResult<()> {
        let mut rec = self.must(ino)?;
        match &mut rec.content {
            RecordContent::Inline(data) => data.truncate(size as usize),
            RecordContent::Blocks {
                allocated_sub_blocks,
            } => {
                let keep = size.div_ceil(block_size);
                let mut allocated = *allocated_sub_blocks;
                allocated -= self.free_blocks_from(ino, keep, freed)?;
                if !size.is_multiple_of(block_size) {
                    let (t, store) = self.shard_for(ino)?;
                    if let Some(mut b) = t.block(store, ino, size / block_size)? {
                        let first_gone =
                            (size % block_size).div_ceil(crate::inode::CSUM_SECTOR_BYTES);
                        for s in first_gone as usize..b.sectors() {
                            b.unwritten[s / 64] |= 1 << (s % 64);
                            b.pending.remove(&(s as u32));
                        }
                        t.put_block(store, ino, size / block_size, &b)?;
                        self.drop_unsettled(ino, size / block_size, |s| u64::from(s) >= first_gone);
                    }
                }
                let (t, store) = self.shard_for(ino)?;
                rec.content = if t.blocks(store, ino, 0, 1)?.is_empty() {
                    RecordContent::Inline(Vec::new())
                } else {
                    RecordContent::Blocks {
                        allocated_sub_blocks: allocated,
                    }
                };
            }
            _ => return Err(corrupt(format!("truncate of inode {ino} without data"))),
        }
        self.put(&rec)
    }

    fn put_attr(&mut self, attr: &Attr) -> FsResult<()> {
        let s = self.shard_of(attr.ino);
        let n = self.shard_count();
        let existing = if self.fresh.remove(&attr.ino) {
            None
        } else {
            self.record(attr.ino)?
        };
        let (rec, was_orphan) = match existing {
            Some(mut rec) => {
                let was = rec.attr.nlink == 0;
                // A directory's size is its entries' (`DirInsert`, `DirRemove`): the
                // attributes a change puts were read before its entry changes applied.
                let size = match rec.content {
                    RecordContent::Dir { .. } => rec.attr.size,
                    _ => attr.size,
                };
                rec.attr = *attr;
                rec.attr.size = size;
                (rec, was)
            }
            None => {
                let h = &mut self.headers[s];
                h.inode_count += 1;
                if h.next_ino <= attr.ino {
                    h.next_ino = attr.ino + n;
                }
                let rec = InodeRecord {
                    attr: *attr,
                    content: match attr.kind {
                        FileKind::Directory => RecordContent::Dir { parent: 0 },
                        FileKind::Regular | FileKind::Symlink => RecordContent::Inline(Vec::new()),
                        _ => RecordContent::None,
                    },
                    xattrs: false,
                    pool: None,
                    copies: 1,
                };
                (rec, false)
            }
        };
        self.put(&rec)?;
        // Inodes without links are orphans until freed: mount reclaims them without a scan.
        let orphan = attr.nlink == 0;
        if orphan != was_orphan {
            let (t, store) = self.tree_at(s)?;
            t.set_orphan(store, attr.ino, orphan)?;
        }
        Ok(())
    }

    /// Writes the header item (next inode number, inode count) of every shard whose header
    /// changed since it was last written, kept in memory between checkpoints; a checkpoint
    /// calls it first.
    pub(crate) fn write_headers(&mut self) -> FsResult<()> {
        self.fresh.clear();
        for (s, t) in self.shards.iter_mut().enumerate() {
            let Some(t) = t else { continue };
            let h = self.headers[s];
            if h != self.stored_headers[s] {
                t.set_header(&mut self.store, h)?;
                self.stored_headers[s] = h;
            }
        }
        Ok(())
    }
}

/// The first inode number of a shard, skipping 0 and the root (1).
pub fn first_ino(shard: u64, shard_count: u64) -> Ino {
    let mut ino = shard;
    while ino < 2 {
        ino += shard_count;
    }
    ino
}

#[cfg(test)]
mod record_tags {
    use super::Change;

    /// Log records are postcard, which writes an enum variant as its index: variants are
    /// only ever appended, so records written by older builds decode the same. This pins
    /// the indexes of the variants added after the first release of the format.
    #[test]
    fn variants_keep_their_indexes() {
        let tag = |c: &Change| postcard::to_stdvec(c).unwrap()[0];
        assert_eq!(tag(&Change::FreeInode { ino: 1 }), 12);
        assert_eq!(tag(&Change::SetPool { ino: 1, pool: 2 }), 13);
        let revert = Change::Revert {
            ino: 9,
            index: 1,
            sector: 3,
            to: crate::inode::Alternative::Unwritten,
        };
        assert_eq!(postcard::to_stdvec(&revert).unwrap(), [14, 9, 1, 3, 1]);
        let answered = Change::Answered {
            client: 3,
            seq: 300,
        };
        assert_eq!(postcard::to_stdvec(&answered).unwrap(), [15, 3, 0xac, 2]);
    }
}
