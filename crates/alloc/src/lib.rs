//! The block allocation map of a Tessera file system: which sub-blocks of which disks are in
//! use, and where new blocks and fragments go.
//!
//! The map lives in memory; persisting it is the file system's business. For that the map
//! splits each disk's sub-block bitmap into chunks of [`MAP_CHUNK_WORDS`] words, remembers
//! which chunks changed ([`AllocMap::take_dirty_chunks`]), hands out their words
//! ([`AllocMap::chunk_words`]) and is rebuilt from stored bitmaps ([`AllocMap::from_bitmaps`]).
//! fsck rebuilds it from the metadata instead (every block pointer, via
//! [`AllocMap::mark_used`]) to find double allocations and leaks.
//!
//! # Units
//!
//! Each disk's data region is an array of *blocks* (the file-system block size, 64 KiB to
//! 16 MiB). A block is split into `sub_blocks_per_block` *sub-blocks* (a power of two,
//! 1..=1024), the allocation unit for small files and file tails, as in GPFS. Addresses
//! ([`DiskAddr`]) count sub-blocks from the start of the disk's data region. An [`Extent`] is a
//! run of sub-blocks inside one block; a full block is an aligned extent of
//! `sub_blocks_per_block` sub-blocks.
//!
//! # Structures, per disk, and why
//!
//! Disks hold millions of blocks and the file system allocates on every write that extends a
//! file, so every operation must cost O(log n) or O(1), never a scan of the disk.
//!
//! - **Sub-block bitmap** (`Vec<u64>`, one bit per sub-block). The ground truth. One bit per
//!   sub-block is the least memory that can answer "is this extent free" exactly, and checking
//!   or flipping an extent touches at most `1024 / 64 = 16` words.
//! - **Used count per block** (`u16`). Tells in O(1) whether a block is free, partially used
//!   or full, so the indexes below can be kept in sync without re-reading the bitmap.
//! - **Free-block summary bitset** (`summary::SummaryBitset`): a bit per completely free block
//!   plus summary levels (a bit per non-empty word of the level below). Finding the next free
//!   block at or after any position costs O(log64 n) words, about eight for a million blocks,
//!   however fragmented the disk is. That serves both placements: Scatter searches from a
//!   pseudo-random position, Cluster from the end of the previous run.
//! - **Partial-block buckets**: partially used blocks bucketed by the length of their longest
//!   free run, with a 1024-bit map of non-empty buckets. The best-fit block for an `n`
//!   sub-block fragment is any block of the first non-empty bucket `>= n`, found with at most
//!   16 word tests. Keying on the longest *run* rather than the free count guarantees the
//!   chosen block really has room for the fragment. Buckets are unordered vectors with a
//!   per-block position (`u32`), so moving a block between buckets is O(1).
//! - **Counters** of free blocks and of free sub-blocks inside partial blocks, so
//!   [`AllocMap::disk_space`] is O(1) and exact.
//!
//! Memory is one bit per sub-block plus about 6.1 bytes per block (used count, bucket
//! position, summary bits). Block indexes in the buckets are `u32`, which limits a disk to
//! 2^32 - 1 blocks (256 TiB at the smallest block size); `AllocMap::new` asserts it.
//!
//! # Placement
//!
//! Data goes only to disks with `holds_data`, metadata only to disks with `holds_metadata`,
//! always within the requested pool and only to `available` disks.
//!
//! - [`Placement::Scatter`] (balanced pseudo-random). Each file gets its own rotation over the
//!   eligible disks, a start disk and a stride coprime to the disk count, both derived from a
//!   hash of `file_key`; block `i` goes to position `start + i * stride`. Any `d` consecutive
//!   blocks of a file therefore land on `d` distinct disks and every file stripes evenly,
//!   without any shared cursor that would serialize allocation. Inside the disk the block is
//!   the first free block at or after the file's own pseudo-random starting place on that
//!   disk plus the number of times the rotation has come round to it (`i / d`), so a file
//!   written in order is one sequential run per disk. Starting places lie in a window above
//!   the disk's lowest free block (an eighth of its free blocks, at least a map chunk's),
//!   so the map fills from the bottom and its upper chunks stay wholly free for owner
//!   slots to be given. If the preferred disk is full the
//!   block goes to the disk with the most free blocks (other than the previous block's disk
//!   when possible), which pulls the pool back towards balance.
//! - [`Placement::Cluster`] (sequential runs). A block continues right after `hint.prev` on
//!   the same disk when that block is free; otherwise it is the next free block (from a
//!   per-disk cursor) on the next disk in round-robin order.
//! - Fragments ([`AllocMap::alloc_fragment`]) pack into partially used blocks first, best fit,
//!   preferring the disk of `near`; only when no partial block has a long enough free run is a
//!   free block split (on `near`'s disk if it has free blocks, else the disk with most).
//!
//! The pseudo-random choices are hashes of the file key, so a given sequence of calls
//! always produces the same layout (useful for simulation and for replaying failures).
//!
//! # Errors and assertions
//!
//! Running out of space is [`AllocError::NoSpace`], never a panic. Extents passed to
//! [`AllocMap::mark_used`] and [`AllocMap::free`] come from on-disk metadata that may be
//! corrupt, so out-of-range extents are [`AllocError::OutOfRange`]. Programmer errors (an
//! unknown disk in a query, a fragment size outside `1..sub_blocks_per_block`, an invalid
//! extent given to [`AllocMap::is_free`]) and broken internal invariants panic.

mod disk;
mod summary;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::disk::{DiskState, SUB_BLOCKS_PER_BLOCK_MAX};

/// Words (64 sub-blocks each) of a disk's bitmap in one persisted chunk: with a 32-byte
/// header a chunk fills one 4 KiB sector.
pub const MAP_CHUNK_WORDS: usize = 508;
/// Sub-blocks of one disk in a map chunk: an allocation region's share of each disk.
const REGION_SUB_BLOCKS: u64 = (MAP_CHUNK_WORDS * 64) as u64;

/// Index of a disk in the file system's disk table.
pub type DiskIndex = u16;
/// Identifier of a storage pool.
pub type PoolId = u16;

/// The address of a sub-block: a disk and a sub-block offset into its data region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DiskAddr {
    pub disk: DiskIndex,
    pub sub_block: u64,
}

/// A run of sub-blocks inside ONE block (never crosses a block boundary). A full block has
/// `sub_blocks == sub_blocks_per_block` and an aligned start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Extent {
    pub addr: DiskAddr,
    pub sub_blocks: u32,
}

/// What an allocation will hold; decides which disks may receive it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocKind {
    Data,
    Metadata,
}

/// Block placement policy of a file system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Placement {
    /// Balanced pseudo-random striping over all disks of the pool.
    Scatter,
    /// Sequential runs on one disk, moving to the next disk round-robin.
    Cluster,
}

/// A disk as the allocator sees it.
#[derive(Clone, Debug)]
pub struct AllocDisk {
    pub disk: DiskIndex,
    pub pool: PoolId,
    /// Number of blocks in the disk's data region.
    pub blocks: u64,
    pub holds_data: bool,
    pub holds_metadata: bool,
    /// Unavailable disks get no new allocations (their extents can still be freed or marked).
    pub available: bool,
}

/// Where a block is wanted: which file, which block of the file, and the block before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockHint {
    pub file_key: u64,
    pub block_index: u64,
    pub prev: Option<DiskAddr>,
}

/// Space accounting of a disk or a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DiskSpace {
    pub blocks_total: u64,
    /// Completely free blocks.
    pub blocks_free: u64,
    /// Free sub-blocks inside partially used blocks.
    pub sub_blocks_free_in_fragments: u64,
}

/// Errors of the allocation map.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    #[error("no space left for {kind:?} in pool {pool}")]
    NoSpace { pool: PoolId, kind: AllocKind },
    #[error("extent {extent:?} overlaps sub-blocks that are already used")]
    AlreadyUsed { extent: Extent },
    #[error("extent {extent:?} overlaps sub-blocks that are not allocated")]
    NotAllocated { extent: Extent },
    #[error(
        "extent {extent:?} is invalid: unknown disk, empty, beyond the disk, or crossing a block"
    )]
    OutOfRange { extent: Extent },
}

/// The in-memory block allocation map of one file system. See the crate documentation.
#[derive(Clone, Debug)]
pub struct AllocMap {
    sub_blocks_per_block: u32,
    placement: Placement,
    /// Disks sorted by disk index; `states[i]` belongs to `disks[i]`.
    disks: Vec<AllocDisk>,
    states: Vec<DiskState>,
    slot_of_disk: HashMap<DiskIndex, usize>,
    /// Round-robin cursor over eligible disks for Cluster runs that have no previous block.
    round_robin: usize,
}

impl AllocMap {
    /// A map with every block of every disk free.
    ///
    /// # Panics
    ///
    /// If `sub_blocks_per_block` is not a power of two in 1..=1024, a disk index is listed
    /// twice, or a disk has 2^32 - 1 blocks or more.
    #[must_use]
    pub fn new(sub_blocks_per_block: u32, placement: Placement, disks: Vec<AllocDisk>) -> AllocMap {
        assert!(
            sub_blocks_per_block.is_power_of_two(),
            "sub-blocks per block not a power of 2"
        );
        assert!(
            sub_blocks_per_block <= SUB_BLOCKS_PER_BLOCK_MAX,
            "too many sub-blocks per block"
        );
        let mut disks = disks;
        disks.sort_by_key(|d| d.disk);
        let mut slot_of_disk = HashMap::with_capacity(disks.len());
        for (slot, d) in disks.iter().enumerate() {
            let duplicate = slot_of_disk.insert(d.disk, slot);
            assert!(duplicate.is_none(), "disk {} listed twice", d.disk);
        }
        let states = disks
            .iter()
            .map(|d| DiskState::new(sub_blocks_per_block, d.blocks))
            .collect();
        AllocMap {
            sub_blocks_per_block,
            placement,
            disks,
            states,
            slot_of_disk,
            round_robin: 0,
        }
    }

    /// A map whose used sub-blocks are the set bits of `bitmaps[i]` for the `i`-th disk in
    /// disk-index order (as [`AllocMap::chunk_words`] gave them out). Every chunk starts clean.
    ///
    /// # Errors
    ///
    /// A description of the first bitmap that does not fit its disk (wrong length, bits
    /// beyond the end).
    ///
    /// # Panics
    ///
    /// As [`AllocMap::new`].
    pub fn from_bitmaps(
        sub_blocks_per_block: u32,
        placement: Placement,
        disks: Vec<AllocDisk>,
        bitmaps: Vec<Vec<u64>>,
    ) -> Result<AllocMap, String> {
        let mut map = AllocMap::new(sub_blocks_per_block, placement, disks);
        if bitmaps.len() != map.disks.len() {
            return Err(format!(
                "{} bitmaps for {} disks",
                bitmaps.len(),
                map.disks.len()
            ));
        }
        for (slot, words) in bitmaps.into_iter().enumerate() {
            let blocks = map.disks[slot].blocks;
            map.states[slot] = DiskState::from_words(sub_blocks_per_block, blocks, words)
                .map_err(|e| format!("disk {}: {e}", map.disks[slot].disk))?;
        }
        Ok(map)
    }

    /// Number of persisted chunks of a disk's bitmap.
    ///
    /// # Panics
    ///
    /// If the disk is unknown.
    #[must_use]
    pub fn chunk_count(&self, disk: DiskIndex) -> usize {
        self.states[self.slot(disk)].chunks()
    }

    /// The words of chunk `chunk` of a disk's bitmap: [`MAP_CHUNK_WORDS`] of them, fewer in
    /// the last chunk.
    ///
    /// # Panics
    ///
    /// If the disk is unknown or the chunk beyond its bitmap.
    #[must_use]
    pub fn chunk_words(&self, disk: DiskIndex, chunk: usize) -> &[u64] {
        let words = self.states[self.slot(disk)].words();
        let start = chunk * MAP_CHUNK_WORDS;
        assert!(start < words.len(), "chunk {chunk} beyond disk {disk}");
        &words[start..words.len().min(start + MAP_CHUNK_WORDS)]
    }

    /// Replaces chunk `chunk` of a disk's bitmap with `words` (as many as
    /// [`AllocMap::chunk_words`] gives for it) and marks it changed: a chunk read from where
    /// another owner stored it, or one held all used while another owner allocates in it
    /// (an allocation region given to another node).
    ///
    /// # Errors
    ///
    /// The disk is unknown, the chunk is beyond its bitmap, `words` has the wrong length, or
    /// it marks sub-blocks beyond the disk's end used; nothing changes then.
    pub fn set_chunk_words(
        &mut self,
        disk: DiskIndex,
        chunk: usize,
        words: &[u64],
    ) -> Result<(), String> {
        let slot = *self
            .slot_of_disk
            .get(&disk)
            .ok_or_else(|| format!("disk {disk} is not in the map"))?;
        self.states[slot]
            .set_chunk(chunk, words)
            .map_err(|e| format!("disk {disk}: {e}"))
    }

    /// A disk's whole bitmap (a set bit is a used sub-block).
    ///
    /// # Panics
    ///
    /// If the disk is unknown.
    #[must_use]
    pub fn bitmap(&self, disk: DiskIndex) -> &[u64] {
        self.states[self.slot(disk)].words()
    }

    /// The chunks changed since the last call, as (disk, chunk) in disk and chunk order.
    pub fn take_dirty_chunks(&mut self) -> Vec<(DiskIndex, usize)> {
        let mut out = Vec::new();
        for (slot, state) in self.states.iter_mut().enumerate() {
            let disk = self.disks[slot].disk;
            out.extend(state.take_dirty().into_iter().map(|chunk| (disk, chunk)));
        }
        out
    }

    /// Marks the chunks holding `e` changed, so the next [`AllocMap::take_dirty_chunks`]
    /// returns them (for extents whose persisted state differs from the live one).
    ///
    /// # Errors
    ///
    /// `OutOfRange` as for [`AllocMap::mark_used`].
    pub fn mark_chunks_dirty(&mut self, e: Extent) -> Result<(), AllocError> {
        let (slot, _) = self.validate(e)?;
        self.states[slot].mark_dirty(e.addr.sub_block, u64::from(e.sub_blocks));
        Ok(())
    }

    /// Marks chunk `chunk` of `disk` changed.
    ///
    /// # Panics
    ///
    /// If the disk is unknown or the chunk beyond its bitmap.
    pub fn mark_chunk_dirty(&mut self, disk: DiskIndex, chunk: usize) {
        let slot = self.slot(disk);
        self.states[slot].mark_chunk(chunk);
    }

    /// Adds a disk with every block free and every chunk of its bitmap changed, so that the
    /// next checkpoint stores its map whole (`disk add`).
    ///
    /// # Panics
    ///
    /// If the disk index is already known, or as [`AllocMap::new`] for its size.
    pub fn add_disk(&mut self, disk: AllocDisk) {
        assert!(
            !self.slot_of_disk.contains_key(&disk.disk),
            "disk {} added twice",
            disk.disk
        );
        let mut state = DiskState::new(self.sub_blocks_per_block, disk.blocks);
        state.mark_all_dirty();
        let at = self.disks.partition_point(|d| d.disk < disk.disk);
        self.disks.insert(at, disk);
        self.states.insert(at, state);
        self.index_slots();
    }

    /// Forgets a disk added by [`AllocMap::add_disk`] before anything was allocated on it
    /// (a `disk add` that did not become durable).
    ///
    /// # Panics
    ///
    /// If the disk is unknown or has a used sub-block.
    pub fn remove_disk(&mut self, disk: DiskIndex) {
        let slot = self.slot(disk);
        let state = &self.states[slot];
        assert_eq!(
            state.free_block_count(),
            state.blocks(),
            "disk {disk} removed while in use"
        );
        self.disks.remove(slot);
        self.states.remove(slot);
        self.index_slots();
    }

    /// Rebuilds the disk-to-slot index after disks were added or removed.
    fn index_slots(&mut self) {
        self.slot_of_disk = self
            .disks
            .iter()
            .enumerate()
            .map(|(slot, d)| (d.disk, slot))
            .collect();
    }

    /// Marks every chunk of every disk changed.
    pub fn mark_all_chunks_dirty(&mut self) {
        for state in &mut self.states {
            state.mark_all_dirty();
        }
    }

    /// Sub-blocks per block, as given to [`AllocMap::new`].
    #[must_use]
    pub fn sub_blocks_per_block(&self) -> u32 {
        self.sub_blocks_per_block
    }

    /// Allocates one full block for block `hint.block_index` of file `hint.file_key`.
    ///
    /// # Errors
    ///
    /// `NoSpace` if no available disk of `pool` holding `kind` has a completely free block.
    ///
    /// # Panics
    ///
    /// Only if an internal invariant of the map is broken (a bug, not an operating error).
    pub fn alloc_block(
        &mut self,
        pool: PoolId,
        kind: AllocKind,
        hint: BlockHint,
    ) -> Result<Extent, AllocError> {
        self.alloc_block_on(pool, kind, hint, &|_| true)
    }

    /// [`AllocMap::alloc_block`] restricted to the disks `allowed` accepts (a restripe
    /// moving blocks to the emptier disks).
    ///
    /// # Errors
    ///
    /// `NoSpace` if no allowed available disk of `pool` holding `kind` has a free block.
    pub fn alloc_block_on(
        &mut self,
        pool: PoolId,
        kind: AllocKind,
        hint: BlockHint,
        allowed: &dyn Fn(DiskIndex) -> bool,
    ) -> Result<Extent, AllocError> {
        let mut eligible = self.eligible_slots(pool, kind);
        eligible.retain(|&slot| allowed(self.disks[slot].disk));
        let placed = match self.placement {
            Placement::Scatter => self.place_scatter(&eligible, hint),
            Placement::Cluster => self.place_cluster(&eligible, hint),
        };
        let (slot, block) = placed.ok_or(AllocError::NoSpace { pool, kind })?;
        let start = block * u64::from(self.sub_blocks_per_block);
        self.states[slot].change(block, start, self.sub_blocks_per_block, true);
        let extent = self.extent(slot, start, self.sub_blocks_per_block);
        assert_eq!(
            extent.addr.sub_block % u64::from(self.sub_blocks_per_block),
            0
        );
        assert!(!self.is_free_slot(slot, block));
        Ok(extent)
    }

    /// Allocates `sub_blocks` contiguous sub-blocks inside one block, for a small file or a
    /// file tail. Packs into partially used blocks first (best fit, preferring the disk of
    /// `near`), else splits a free block.
    ///
    /// # Errors
    ///
    /// `NoSpace` if no available disk of `pool` holding `kind` has `sub_blocks` contiguous
    /// free sub-blocks inside one block.
    ///
    /// # Panics
    ///
    /// If `sub_blocks` is not in `1..sub_blocks_per_block`.
    pub fn alloc_fragment(
        &mut self,
        pool: PoolId,
        kind: AllocKind,
        sub_blocks: u32,
        near: Option<DiskAddr>,
    ) -> Result<Extent, AllocError> {
        self.alloc_fragment_on(pool, kind, sub_blocks, near, &|_| true)
    }

    /// [`AllocMap::alloc_fragment`] restricted to the disks `allowed` accepts.
    ///
    /// # Errors
    ///
    /// As [`AllocMap::alloc_fragment`], counting only allowed disks.
    ///
    /// # Panics
    ///
    /// As [`AllocMap::alloc_fragment`].
    pub fn alloc_fragment_on(
        &mut self,
        pool: PoolId,
        kind: AllocKind,
        sub_blocks: u32,
        near: Option<DiskAddr>,
        allowed: &dyn Fn(DiskIndex) -> bool,
    ) -> Result<Extent, AllocError> {
        assert!(sub_blocks >= 1, "empty fragment");
        assert!(
            sub_blocks < self.sub_blocks_per_block,
            "fragment must be smaller than a block"
        );
        let mut eligible = self.eligible_slots(pool, kind);
        eligible.retain(|&slot| allowed(self.disks[slot].disk));
        let near_slot = near
            .and_then(|addr| self.slot_of_disk.get(&addr.disk).copied())
            .filter(|slot| eligible.contains(slot));
        let (slot, block) = self
            .fragment_block(&eligible, near_slot, near, sub_blocks)
            .ok_or(AllocError::NoSpace { pool, kind })?;
        let state = &mut self.states[slot];
        let start = state
            .best_run_in_block(block, sub_blocks)
            .expect("chosen block has room");
        state.change(block, start, sub_blocks, true);
        let extent = self.extent(slot, start, sub_blocks);
        assert_eq!(
            start / u64::from(self.sub_blocks_per_block),
            block,
            "fragment left its block"
        );
        Ok(extent)
    }

    /// Allocates `blocks` consecutive whole blocks on one disk (used once, at format, for the
    /// journal). Returns the address of the first block and the number of blocks.
    ///
    /// # Errors
    ///
    /// `NoSpace` if no eligible disk has a run of `blocks` completely free blocks.
    ///
    /// # Panics
    ///
    /// If `blocks` is zero.
    pub fn alloc_contiguous_blocks(
        &mut self,
        pool: PoolId,
        kind: AllocKind,
        blocks: u64,
    ) -> Result<(DiskAddr, u64), AllocError> {
        self.alloc_contiguous_blocks_on(pool, kind, blocks, &|_| true)
    }

    /// [`AllocMap::alloc_contiguous_blocks`] restricted to the disks `allowed` accepts (the
    /// second copy of a region goes to a disk of another failure group).
    ///
    /// # Errors
    ///
    /// As [`AllocMap::alloc_contiguous_blocks`], counting only allowed disks.
    ///
    /// # Panics
    ///
    /// If `blocks` is zero.
    pub fn alloc_contiguous_blocks_on(
        &mut self,
        pool: PoolId,
        kind: AllocKind,
        blocks: u64,
        allowed: &dyn Fn(DiskIndex) -> bool,
    ) -> Result<(DiskAddr, u64), AllocError> {
        assert!(blocks >= 1, "empty block run");
        let mut eligible = self.eligible_slots(pool, kind);
        eligible.retain(|&slot| allowed(self.disks[slot].disk));
        // Try the emptiest disks first: they are the most likely to hold a long free run.
        eligible.sort_by_key(|&slot| std::cmp::Reverse(self.states[slot].free_block_count()));
        let found = eligible.iter().find_map(|&slot| {
            let state = &self.states[slot];
            if state.free_block_count() < blocks {
                return None;
            }
            state.find_free_block_run(blocks).map(|first| (slot, first))
        });
        let (slot, first) = found.ok_or(AllocError::NoSpace { pool, kind })?;
        let per_block = self.sub_blocks_per_block;
        for block in first..first + blocks {
            self.states[slot].change(block, block * u64::from(per_block), per_block, true);
        }
        let addr = self
            .extent(slot, first * u64::from(per_block), per_block)
            .addr;
        assert!(!self.is_free_slot(slot, first + blocks - 1));
        Ok((addr, blocks))
    }

    /// Marks an extent used, as found in metadata at mount or by fsck. Fails with
    /// `AlreadyUsed` (changing nothing) if any of its sub-blocks is already used.
    ///
    /// # Errors
    ///
    /// `OutOfRange` if `e` is empty, crosses a block, or lies outside a known disk;
    /// `AlreadyUsed` as above.
    ///
    /// # Panics
    ///
    /// Only if an internal invariant of the map is broken (a bug, not an operating error).
    pub fn mark_used(&mut self, e: Extent) -> Result<(), AllocError> {
        let (slot, block) = self.validate(e)?;
        if !self.states[slot].range_is(e.addr.sub_block, e.sub_blocks, false) {
            return Err(AllocError::AlreadyUsed { extent: e });
        }
        self.states[slot].change(block, e.addr.sub_block, e.sub_blocks, true);
        assert!(self.states[slot].range_is(e.addr.sub_block, e.sub_blocks, true));
        Ok(())
    }

    /// Frees an extent. Fails with `NotAllocated` (changing nothing) if any of its
    /// sub-blocks is free.
    ///
    /// # Errors
    ///
    /// `OutOfRange` if `e` is empty, crosses a block, or lies outside a known disk;
    /// `NotAllocated` as above.
    ///
    /// # Panics
    ///
    /// Only if an internal invariant of the map is broken (a bug, not an operating error).
    pub fn free(&mut self, e: Extent) -> Result<(), AllocError> {
        let (slot, block) = self.validate(e)?;
        if !self.states[slot].range_is(e.addr.sub_block, e.sub_blocks, true) {
            return Err(AllocError::NotAllocated { extent: e });
        }
        self.states[slot].change(block, e.addr.sub_block, e.sub_blocks, false);
        assert!(self.states[slot].range_is(e.addr.sub_block, e.sub_blocks, false));
        Ok(())
    }

    /// Whether every sub-block of `e` is free.
    ///
    /// # Panics
    ///
    /// If `e` is not a valid extent (see [`AllocError::OutOfRange`]).
    #[must_use]
    pub fn is_free(&self, e: Extent) -> bool {
        let validated = self.validate(e);
        let (slot, _) = validated.unwrap_or_else(|error| panic!("is_free: {error}"));
        self.states[slot].range_is(e.addr.sub_block, e.sub_blocks, false)
    }

    /// Space of one disk.
    ///
    /// # Panics
    ///
    /// If the disk is unknown.
    #[must_use]
    pub fn disk_space(&self, disk: DiskIndex) -> DiskSpace {
        let state = &self.states[self.slot(disk)];
        DiskSpace {
            blocks_total: state.blocks(),
            blocks_free: state.free_block_count(),
            sub_blocks_free_in_fragments: state.fragment_free(),
        }
    }

    /// Space summed over the disks of `pool` that hold `kind`, available or not.
    #[must_use]
    pub fn pool_space(&self, pool: PoolId, kind: AllocKind) -> DiskSpace {
        self.space_of(pool, kind, false)
    }

    /// Like [`AllocMap::pool_space`], over the disks that take new allocations only: what
    /// can still be allocated, which is less than what is free while a disk is suspended.
    #[must_use]
    pub fn allocatable_space(&self, pool: PoolId, kind: AllocKind) -> DiskSpace {
        self.space_of(pool, kind, true)
    }

    fn space_of(&self, pool: PoolId, kind: AllocKind, available_only: bool) -> DiskSpace {
        let mut total = DiskSpace::default();
        for d in self
            .disks
            .iter()
            .filter(|d| d.pool == pool && holds(d, kind) && (d.available || !available_only))
        {
            let space = self.disk_space(d.disk);
            total.blocks_total += space.blocks_total;
            total.blocks_free += space.blocks_free;
            total.sub_blocks_free_in_fragments += space.sub_blocks_free_in_fragments;
        }
        total
    }

    /// Marks a disk available or not; unavailable disks get no new allocations.
    ///
    /// # Panics
    ///
    /// If the disk is unknown.
    pub fn set_available(&mut self, disk: DiskIndex, available: bool) {
        let slot = self.slot(disk);
        self.disks[slot].available = available;
    }

    /// The disks, sorted by disk index.
    #[must_use]
    pub fn disks(&self) -> &[AllocDisk] {
        &self.disks
    }

    /// Whether the map has disk `disk` (an owner slot lets go of a disk being deleted
    /// before the descriptor drops it).
    #[must_use]
    pub fn knows(&self, disk: DiskIndex) -> bool {
        self.slot_of_disk.contains_key(&disk)
    }

    fn slot(&self, disk: DiskIndex) -> usize {
        *self
            .slot_of_disk
            .get(&disk)
            .unwrap_or_else(|| panic!("unknown disk {disk}"))
    }

    /// Slots (in disk-index order) of the available disks of `pool` that hold `kind`.
    fn eligible_slots(&self, pool: PoolId, kind: AllocKind) -> Vec<usize> {
        let eligible = |d: &AllocDisk| d.available && d.pool == pool && holds(d, kind);
        (0..self.disks.len())
            .filter(|&slot| eligible(&self.disks[slot]))
            .collect()
    }

    /// Checks that `e` names sub-blocks of one block of a known disk; returns (slot, block).
    fn validate(&self, e: Extent) -> Result<(usize, u64), AllocError> {
        let out_of_range = AllocError::OutOfRange { extent: e };
        let Some(&slot) = self.slot_of_disk.get(&e.addr.disk) else {
            return Err(out_of_range);
        };
        let per_block = u64::from(self.sub_blocks_per_block);
        let block = e.addr.sub_block / per_block;
        let offset = e.addr.sub_block % per_block;
        if e.sub_blocks == 0 || offset + u64::from(e.sub_blocks) > per_block {
            return Err(out_of_range);
        }
        if block >= self.states[slot].blocks() {
            return Err(out_of_range);
        }
        Ok((slot, block))
    }

    fn extent(&self, slot: usize, sub_block: u64, sub_blocks: u32) -> Extent {
        let extent = Extent {
            addr: DiskAddr {
                disk: self.disks[slot].disk,
                sub_block,
            },
            sub_blocks,
        };
        let per_block = u64::from(self.sub_blocks_per_block);
        assert!(
            sub_block % per_block + u64::from(sub_blocks) <= per_block,
            "extent crosses block"
        );
        assert!(
            sub_block / per_block < self.states[slot].blocks(),
            "extent beyond disk"
        );
        extent
    }

    fn is_free_slot(&self, slot: usize, block: u64) -> bool {
        self.states[slot].is_block_free(block)
    }

    /// Scatter: the file's rotation picks the disk, the file's place on that disk the block.
    fn place_scatter(&mut self, eligible: &[usize], hint: BlockHint) -> Option<(usize, u64)> {
        if eligible.is_empty() {
            return None;
        }
        let prev_slot = hint
            .prev
            .and_then(|addr| self.slot_of_disk.get(&addr.disk).copied());
        let count = eligible.len() as u64;
        let (start, stride) = file_rotation(hint.file_key, count);
        let mut position = (start + (hint.block_index % count) * stride) % count;
        // Consecutive block indexes never repeat a disk; a non-consecutive caller or an
        // earlier fallback might, so step past the previous block's disk.
        let at = |position: u64| eligible[usize::try_from(position).expect("below len")];
        if count >= 2 && Some(at(position)) == prev_slot {
            position = (position + stride) % count;
        }
        let mut slot = at(position);
        if self.states[slot].free_block_count() == 0 {
            slot = self.fallback_slot(eligible, prev_slot)?;
        }
        // Each file starts at its own pseudo-random place on each disk, and its block `i`
        // goes to the first free block at or after that place plus `i / count` (how many
        // times the rotation has come round to this disk). Files spread over the whole disk
        // as before, but a file written in order lies in one sequential run per disk, so a
        // sequential reader streams from every drive instead of seeking on each.
        let state = &self.states[slot];
        let blocks = state.blocks();
        let (low, window) = self.scatter_window(slot);
        let base = low + mix64(hint.file_key ^ mix64(slot as u64 + 1)) % window;
        let target = (base + hint.block_index / count) % blocks;
        let block = state.next_free_block(target).expect("disk has free blocks");
        Some((slot, block))
    }

    /// Where on disk `slot` files start: `(low, len)`, the blocks `low..low + len` above the
    /// disk's lowest free block, an eighth of its free blocks but at least one map region's
    /// worth. Files spread there, not over the whole disk, so the map fills from the bottom
    /// up and the regions above stay wholly free: an owner slot can only be given a region
    /// nothing is allocated in, and files started anywhere on the disk left none after a few
    /// dozen, so a node writing in its own directories got ENOSPC on a file system mostly
    /// free.
    fn scatter_window(&self, slot: usize) -> (u64, u64) {
        let state = &self.states[slot];
        let blocks = state.blocks();
        let low = state.next_free_block(0).unwrap_or(0);
        let region_blocks =
            (REGION_SUB_BLOCKS / u64::from(self.sub_blocks_per_block.max(1))).max(1);
        let len = region_blocks
            .max(state.free_block_count() / 8)
            .min(blocks - low)
            .max(1);
        (low, len)
    }

    /// The eligible disk with the most free blocks, avoiding `avoid` when another has room.
    fn fallback_slot(&self, eligible: &[usize], avoid: Option<usize>) -> Option<usize> {
        let free = |slot: usize| self.states[slot].free_block_count();
        let best = |skip: Option<usize>| {
            let candidates = eligible.iter().copied().filter(|&slot| Some(slot) != skip);
            // Ties go to the lowest disk index: max_by_key keeps the last maximum, so reverse.
            candidates
                .rev()
                .max_by_key(|&slot| free(slot))
                .filter(|&slot| free(slot) > 0)
        };
        best(avoid).or_else(|| best(None))
    }

    /// Cluster: continue after `hint.prev`, else the next free block on the next disk.
    fn place_cluster(&mut self, eligible: &[usize], hint: BlockHint) -> Option<(usize, u64)> {
        if eligible.is_empty() {
            return None;
        }
        let per_block = u64::from(self.sub_blocks_per_block);
        let prev = hint.prev.and_then(|addr| {
            let slot = *self.slot_of_disk.get(&addr.disk)?;
            Some((slot, addr.sub_block / per_block))
        });
        if let Some((slot, block)) = prev {
            let next = block + 1;
            let state = &self.states[slot];
            if eligible.contains(&slot) && next < state.blocks() && state.is_block_free(next) {
                self.states[slot].cursor = next + 1;
                return Some((slot, next));
            }
        }
        // The first eligible disk after the previous block's disk, in disk-index order, or
        // the next disk of the round-robin for a run with no previous block.
        let first = if let Some((prev_slot, _)) = prev {
            eligible.iter().position(|&s| s > prev_slot).unwrap_or(0)
        } else {
            self.round_robin = self.round_robin.wrapping_add(1);
            self.round_robin % eligible.len()
        };
        for step in 0..eligible.len() {
            let slot = eligible[(first + step) % eligible.len()];
            let state = &mut self.states[slot];
            if let Some(block) = state.next_free_block(state.cursor) {
                state.cursor = block + 1;
                return Some((slot, block));
            }
        }
        None
    }

    /// Chooses the block for a fragment: best-fit partial block (near's disk first), else a
    /// free block (near's disk if it has one, else the disk with the most free blocks).
    fn fragment_block(
        &self,
        eligible: &[usize],
        near_slot: Option<usize>,
        near: Option<DiskAddr>,
        sub_blocks: u32,
    ) -> Option<(usize, u64)> {
        let best_fit = |slot: usize| self.states[slot].best_fit_partial(sub_blocks);
        if let Some(slot) = near_slot {
            if let Some((_, block)) = best_fit(slot) {
                return Some((slot, block));
            }
        }
        // A block whose longest free run is shorter fits better; ties go to the lowest disk.
        let best_partial = eligible
            .iter()
            .filter_map(|&slot| best_fit(slot).map(|(run_len, block)| (run_len, slot, block)))
            .min_by_key(|&(run_len, _, _)| run_len);
        if let Some((_, slot, block)) = best_partial {
            return Some((slot, block));
        }
        let per_block = u64::from(self.sub_blocks_per_block);
        if let (Some(slot), Some(addr)) = (near_slot, near) {
            let state = &self.states[slot];
            let from = (addr.sub_block / per_block).min(state.blocks().saturating_sub(1));
            if let Some(block) = state.next_free_block(from) {
                return Some((slot, block));
            }
        }
        let slot = self.fallback_slot(eligible, None)?;
        let state = &self.states[slot];
        let block = state
            .next_free_block(state.cursor)
            .expect("disk has free blocks");
        Some((slot, block))
    }
}

fn holds(d: &AllocDisk, kind: AllocKind) -> bool {
    match kind {
        AllocKind::Data => d.holds_data,
        AllocKind::Metadata => d.holds_metadata,
    }
}

/// A file's rotation over `count` disks: a start position and a stride coprime to `count`,
/// so that positions `start + i * stride (mod count)` visit every disk once per `count` blocks.
fn file_rotation(file_key: u64, count: u64) -> (u64, u64) {
    assert!(count >= 1);
    let hash = mix64(file_key ^ 0xA076_1D64_78BD_642F);
    let start = hash % count;
    if count == 1 {
        return (0, 1);
    }
    let mut stride = mix64(hash) % (count - 1) + 1;
    // At most `count` steps; stride 1 is always coprime, so the loop ends.
    while gcd(stride, count) != 1 {
        stride = stride % (count - 1) + 1;
    }
    assert!(stride >= 1 && stride < count);
    (start, stride)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The `SplitMix64` finalizer: a bijective 64-bit mix.
fn mix64(value: u64) -> u64 {
    let mut z = value;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests;
