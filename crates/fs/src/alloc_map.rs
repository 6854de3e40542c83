//! The allocation map on disk, so that mount reads a fixed amount (proportional to the disks'
//! size, not to the number of files) instead of rebuilding the map from every block
//! reference.
//!
//! # Regions and chunks
//!
//! Each disk of the file system has a *map region*: whole blocks of a system-pool metadata
//! disk, allocated from the map itself at format (or at the first mount of a file system made
//! before the map was stored), named in the descriptor ([`MapRegion`]). The region holds the
//! disk's sub-block bitmap (a set bit is a used sub-block) in *chunks* of
//! [`MAP_CHUNK_WORDS`] words, each chunk in two 4 KiB *slots*, chunk `c` at slots `2c` and
//! `2c + 1`. A region is never allocated from while it is being written: its blocks are
//! marked used like the log's, so writing the map allocates nothing.
//!
//! One slot (little endian):
//!
//! ```text
//! 0      4      6      8        16           24      28       32                      4096
//! +------+------+------+--------+------------+-------+--------+-----------------------+
//! | TSAM | disk | vers | owner  | generation | chunk | crc32c | bitmap words (u64 LE) |
//! |      | u16  | u16=1| u64    | u64        | u32   | u32    | up to 508, zero after |
//! +------+------+------+--------+------------+-------+--------+-----------------------+
//! ```
//!
//! `disk` is the disk the bits describe, `owner` the first eight bytes of the file system's
//! UUID, `generation` the checkpoint that wrote the slot; the CRC-32C covers bytes 0..28 and
//! 32..4096. A slot of another file system, disk or chunk, or a torn one, is refused.
//!
//! # Writing: what a chunk holds
//!
//! A checkpoint writes the chunks that changed since the previous one, each into the slot
//! that does *not* hold its current copy, stamped with the checkpoint's generation, before it
//! writes the descriptor naming that generation. What a chunk holds is the map as of the
//! checkpoint's log position, which is the live map minus the extents the live map still
//! holds for reasons the checkpoint does not record: data extents allocated but not yet
//! logged, extents released by logged changes whose release is not durable yet, and the
//! metadata pages this checkpoint supersedes. Replay then marks and frees as it always did,
//! so a crash at any instant leaks nothing and never hands out a used extent.
//!
//! # Reading: which slot
//!
//! Mount takes, per chunk, the valid slot with the greatest generation not above the durable
//! checkpoint's. A slot of a later generation was written by a checkpoint that never
//! committed; its chunk is marked changed, so the next checkpoint that commits overwrites that
//! slot before any later generation could make it look valid. A chunk with no usable slot
//! makes the mount rebuild the whole map from the metadata (the scan of old) and write it
//! whole at the next checkpoint; fsck compares the stored map with the rebuilt one.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tessera_alloc::{AllocKind, AllocMap, DiskIndex, Extent, MAP_CHUNK_WORDS};
use tessera_drive::{AlignedBuf, BlockDevice};

use crate::descriptor::FsDescriptor;
use crate::disk_set::DiskSet;
use crate::error::{FsError, FsResult};

/// Bytes of one chunk slot.
pub(crate) const SLOT_BYTES: usize = 4096;
const HEADER_BYTES: usize = 32;
const MAGIC: [u8; 4] = *b"TSAM";
const VERSION: u16 = 1;
/// Slots read at once at mount.
const READ_BATCH_BYTES: usize = 4 << 20;
/// `MapSlots` value of a chunk with no usable slot.
const NO_SLOT: u8 = 2;

/// The stored allocation map, as the descriptor records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredMap {
    /// One region per disk of the file system.
    pub regions: Vec<MapRegion>,
    /// A digest of the generation of every chunk's current copy ([`MapSlots::digest`]): a
    /// chunk whose newest copy was lost or damaged would otherwise be read from its older
    /// slot, valid but out of date, and hand out used blocks.
    pub digest: u64,
}

/// Where one disk's allocation map lives, as the descriptor records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapRegion {
    /// The disk whose sub-blocks the region describes.
    pub disk: u16,
    /// The disk that holds the region.
    pub on_disk: u16,
    /// Byte offset of the region on `on_disk`.
    pub offset: u64,
    pub bytes: u64,
}

/// One chunk of a disk's bitmap as a checkpoint writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ChunkImage {
    pub disk: DiskIndex,
    pub chunk: usize,
    pub words: Vec<u64>,
}

/// For every chunk of every region, the slot a checkpoint must not overwrite: the one holding
/// its current copy, or, when it has none, the one that is not stale (so that a slot left by
/// a checkpoint that never committed is the first to be overwritten).
#[derive(Clone, Debug, Default)]
pub(crate) struct MapSlots {
    keep: HashMap<DiskIndex, Vec<Kept>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Kept {
    /// The slot not to overwrite: 0, 1, or `NO_SLOT`.
    slot: u8,
    /// Generation of the current copy, which is in `slot`; `None` when there is none.
    generation: Option<u64>,
}

const NOTHING_KEPT: Kept = Kept {
    slot: NO_SLOT,
    generation: None,
};

/// A chunk copy's share of [`MapSlots::digest`].
fn digest_term(disk: DiskIndex, chunk: usize, generation: u64) -> u64 {
    mix64(mix64((u64::from(disk) << 40) ^ chunk as u64) ^ generation)
}

/// The `SplitMix64` finalizer.
fn mix64(value: u64) -> u64 {
    let mut z = value;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl MapSlots {
    /// No chunk has a usable copy (a new or converted map).
    pub fn none(alloc: &AllocMap) -> MapSlots {
        let keep = alloc
            .disks()
            .iter()
            .map(|d| (d.disk, vec![NOTHING_KEPT; alloc.chunk_count(d.disk)]))
            .collect();
        MapSlots { keep }
    }

    /// A disk added to the file system: none of its chunks has a copy yet.
    pub fn add_disk(&mut self, disk: DiskIndex, chunks: usize) {
        self.keep.insert(disk, vec![NOTHING_KEPT; chunks]);
    }

    /// A disk deleted from the file system: its chunks no longer count.
    pub fn remove_disk(&mut self, disk: DiskIndex) {
        self.keep.remove(&disk);
    }

    /// The digest of the current copies' generations once the copies `written` (of
    /// `generation`) are current: a wrapping sum of one term per chunk with a copy.
    pub fn digest_with(&self, written: &[(DiskIndex, usize, u8)], generation: u64) -> u64 {
        let replaced: std::collections::HashSet<(DiskIndex, usize)> =
            written.iter().map(|&(d, c, _)| (d, c)).collect();
        let mut sum = 0u64;
        for (&disk, chunks) in &self.keep {
            for (chunk, kept) in chunks.iter().enumerate() {
                if let Some(g) = kept
                    .generation
                    .filter(|_| !replaced.contains(&(disk, chunk)))
                {
                    sum = sum.wrapping_add(digest_term(disk, chunk, g));
                }
            }
        }
        for &(disk, chunk, _) in written {
            sum = sum.wrapping_add(digest_term(disk, chunk, generation));
        }
        sum
    }

    /// Forgets chunk `chunk` of every disk (its allocation region went to another owner
    /// slot, whose record keeps its digest): it no longer counts in this owner's digest.
    pub fn forget_region(&mut self, chunk: usize) {
        for chunks in self.keep.values_mut() {
            if let Some(c) = chunks.get_mut(chunk) {
                *c = NOTHING_KEPT;
            }
        }
    }

    /// The slot a checkpoint writes chunk `chunk` of `disk` into: never the kept one.
    fn target(&self, disk: DiskIndex, chunk: usize) -> u8 {
        match self.keep.get(&disk).and_then(|c| c.get(chunk)) {
            Some(Kept { slot: 0, .. }) => 1,
            _ => 0,
        }
    }

    /// Records slots written by a checkpoint of `generation` that is now durable.
    pub fn commit(&mut self, written: &[(DiskIndex, usize, u8)], generation: u64) {
        for &(disk, chunk, slot) in written {
            if let Some(c) = self.keep.get_mut(&disk).and_then(|c| c.get_mut(chunk)) {
                *c = Kept {
                    slot,
                    generation: Some(generation),
                };
            }
        }
    }
}

/// Bytes of the region of a disk whose bitmap has `chunks` chunks.
fn region_bytes(chunks: usize) -> u64 {
    (chunks * 2 * SLOT_BYTES) as u64
}

fn owner(desc: &FsDescriptor) -> u64 {
    u64::from_le_bytes(desc.fs_uuid[..8].try_into().expect("8 bytes"))
}

/// Encodes one slot.
pub(crate) fn encode_slot(
    owner: u64,
    disk: DiskIndex,
    chunk: usize,
    generation: u64,
    words: &[u64],
) -> Vec<u8> {
    assert!(
        words.len() <= MAP_CHUNK_WORDS,
        "chunk of {} words",
        words.len()
    );
    let mut out = vec![0u8; SLOT_BYTES];
    out[0..4].copy_from_slice(&MAGIC);
    out[4..6].copy_from_slice(&disk.to_le_bytes());
    out[6..8].copy_from_slice(&VERSION.to_le_bytes());
    out[8..16].copy_from_slice(&owner.to_le_bytes());
    out[16..24].copy_from_slice(&generation.to_le_bytes());
    let chunk = u32::try_from(chunk).expect("chunk index fits u32");
    out[24..28].copy_from_slice(&chunk.to_le_bytes());
    for (i, w) in words.iter().enumerate() {
        let at = HEADER_BYTES + i * 8;
        out[at..at + 8].copy_from_slice(&w.to_le_bytes());
    }
    let crc = slot_crc(&out);
    out[28..32].copy_from_slice(&crc.to_le_bytes());
    out
}

fn slot_crc(slot: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&slot[..28]), &slot[HEADER_BYTES..])
}

/// Decodes one slot, checking that it is chunk `chunk` of `disk` of this file system;
/// returns its generation and its `words` words.
pub(crate) fn decode_slot(
    slot: &[u8],
    owner: u64,
    disk: DiskIndex,
    chunk: usize,
    words: usize,
) -> Result<(u64, Vec<u64>), String> {
    assert_eq!(slot.len(), SLOT_BYTES);
    assert!(words <= MAP_CHUNK_WORDS);
    let u16_at = |at: usize| u16::from_le_bytes(slot[at..at + 2].try_into().expect("2"));
    let u32_at = |at: usize| u32::from_le_bytes(slot[at..at + 4].try_into().expect("4"));
    let u64_at = |at: usize| u64::from_le_bytes(slot[at..at + 8].try_into().expect("8"));
    if slot[0..4] != MAGIC {
        return Err("no map chunk here (never written)".into());
    }
    if u32_at(28) != slot_crc(slot) {
        return Err("checksum mismatch (torn or damaged)".into());
    }
    if u16_at(6) != VERSION {
        return Err(format!("unknown chunk version {}", u16_at(6)));
    }
    if u64_at(8) != owner {
        return Err("belongs to another file system".into());
    }
    if u16_at(4) != disk || u32_at(24) as usize != chunk {
        return Err(format!(
            "holds chunk {} of disk {}, not chunk {chunk} of disk {disk} (misdirected write)",
            u32_at(24),
            u16_at(4)
        ));
    }
    let body = |i: usize| u64_at(HEADER_BYTES + i * 8);
    if (words..MAP_CHUNK_WORDS).any(|i| body(i) != 0) {
        return Err("bits set beyond the end of the disk".into());
    }
    Ok((u64_at(16), (0..words).map(body).collect()))
}

/// Allocates a map region for every disk of `desc` from `alloc` (whole blocks of the system
/// pool's metadata disks, each region contiguous).
pub(crate) fn allocate_regions(
    desc: &FsDescriptor,
    alloc: &mut AllocMap,
) -> FsResult<Vec<MapRegion>> {
    let disks: Vec<DiskIndex> = desc.disks.iter().map(|d| d.index).collect();
    allocate_regions_for(desc, alloc, &disks)
}

/// Allocates a map region for each of `disks` (disks being added to a file system).
pub(crate) fn allocate_regions_for(
    desc: &FsDescriptor,
    alloc: &mut AllocMap,
    disks: &[DiskIndex],
) -> FsResult<Vec<MapRegion>> {
    let bs = u64::from(desc.block_size);
    let mut regions = Vec::with_capacity(disks.len());
    for &index in disks {
        let bytes = region_bytes(alloc.chunk_count(index));
        if bytes == 0 {
            // A disk without blocks (descOnly) has no bitmap to store.
            regions.push(MapRegion {
                disk: index,
                on_disk: index,
                offset: 0,
                bytes: 0,
            });
            continue;
        }
        let Ok((start, blocks)) =
            alloc.alloc_contiguous_blocks(0, AllocKind::Metadata, bytes.div_ceil(bs))
        else {
            // Give back what the earlier disks took: the caller may go on without a stored map.
            for e in region_extents_of(desc, &regions) {
                alloc.free(e).expect("a region just allocated");
            }
            return Err(FsError::NoSpace {
                pool: "system".into(),
                what: "allocation map regions (contiguous blocks of a metadata disk)",
            });
        };
        regions.push(MapRegion {
            disk: index,
            on_disk: start.disk,
            offset: desc.sub_block_offset(start.sub_block),
            bytes: blocks * bs,
        });
    }
    Ok(regions)
}

/// Whole metadata blocks for the second copy of a region (a map region, the log) whose
/// other copy is in failure group `avoid`: on a disk `usable` accepts in another failure
/// group where one has room, else (with a warning naming `what`) beside the other copy,
/// ill-replicated until `restripe -r` parts them.
pub(crate) fn alloc_apart(
    desc: &FsDescriptor,
    disks: &DiskSet,
    alloc: &mut AllocMap,
    blocks: u64,
    avoid: Option<i32>,
    usable: &dyn Fn(DiskIndex) -> bool,
    what: &dyn Fn() -> String,
) -> Result<(tessera_alloc::DiskAddr, u64), tessera_alloc::AllocError> {
    let apart = |d: DiskIndex| usable(d) && avoid.is_none_or(|g| disks.failure_group(d) != g);
    alloc
        .alloc_contiguous_blocks_on(0, AllocKind::Metadata, blocks, &apart)
        .or_else(|_| {
            let placed =
                alloc.alloc_contiguous_blocks_on(0, AllocKind::Metadata, blocks, usable)?;
            if let Some(g) = avoid {
                tracing::warn!(
                    "{}: both copies of {} are in failure group {g} (no other group has room); \
                     `tessera restripe {} -r` parts them once one has",
                    desc.name,
                    what(),
                    desc.name
                );
            }
            Ok(placed)
        })
}

/// Allocates the second copy of each of `first` (metadata replicated), each on a metadata
/// disk of a failure group other than the one holding its first copy where one has room.
pub(crate) fn allocate_second_regions(
    desc: &FsDescriptor,
    disks: &DiskSet,
    alloc: &mut AllocMap,
    first: &[MapRegion],
) -> FsResult<Vec<MapRegion>> {
    let bs = u64::from(desc.block_size);
    let mut regions = Vec::with_capacity(first.len());
    for r in first {
        if r.bytes == 0 {
            regions.push(*r);
            continue;
        }
        // Beside the first copy when no other group has room (disks being added are not
        // allocatable yet).
        let placed = alloc_apart(
            desc,
            disks,
            alloc,
            r.bytes.div_ceil(bs),
            Some(disks.failure_group(r.on_disk)),
            &|d| !disks.is_down(d),
            &|| format!("the allocation map of {}", disks.name(r.disk)),
        );
        let Ok((start, blocks)) = placed else {
            for e in region_extents_of(desc, &regions) {
                alloc.free(e).expect("a region just allocated");
            }
            return Err(FsError::NoSpace {
                pool: "system".into(),
                what: "second copies of the allocation map regions (contiguous blocks of a \
                       metadata disk in another failure group)",
            });
        };
        regions.push(MapRegion {
            disk: r.disk,
            on_disk: start.disk,
            offset: desc.sub_block_offset(start.sub_block),
            bytes: blocks * bs,
        });
    }
    Ok(regions)
}

/// Gives every map region (first or, with metadata replicated, second copy) that lies on
/// one of `leaving` a new place on a ready metadata disk that is up, in a failure group
/// other than its other copy's where one has room (else beside it: the map is then
/// ill-replicated until `restripe -r`); with `apart`, also moves second copies that share
/// a failure group with their first copy, where another group has room. Returns the
/// regions replaced, their new places in the same order, and the disks whose maps moved;
/// the caller fills the new places (marks those maps' chunks changed, or copies the old
/// regions). On failure nothing is changed.
pub(crate) fn replace_regions_on(
    desc: &mut FsDescriptor,
    disks: &DiskSet,
    alloc: &mut AllocMap,
    leaving: &[DiskIndex],
    apart: bool,
) -> FsResult<(Vec<MapRegion>, Vec<MapRegion>, Vec<DiskIndex>)> {
    let bs = u64::from(desc.block_size);
    let mut lists: [Vec<MapRegion>; 2] = [
        desc.alloc_map
            .as_ref()
            .map(|m| m.regions.clone())
            .unwrap_or_default(),
        desc.metadata_copies
            .as_ref()
            .map(|c| c.map_regions.clone())
            .unwrap_or_default(),
    ];
    let mut old = Vec::new();
    let mut taken: Vec<MapRegion> = Vec::new();
    let mut moved = Vec::new();
    for copy in 0..2 {
        for i in 0..lists[copy].len() {
            let r = lists[copy][i];
            let partner = lists[1 - copy].iter().find(|p| p.disk == r.disk).copied();
            let avoid = partner.map(|p| disks.failure_group(p.on_disk));
            let shares = avoid == Some(disks.failure_group(r.on_disk));
            let leaves = leaving.contains(&r.on_disk);
            if r.bytes == 0 || !(leaves || (apart && copy == 1 && shares)) {
                continue;
            }
            let usable = |d: DiskIndex| !leaving.contains(&d) && !disks.is_down(d);
            let blocks = r.bytes.div_ceil(bs);
            let what = || format!("the allocation map of {}", disks.name(r.disk));
            let placed = if leaves {
                alloc_apart(desc, disks, alloc, blocks, avoid, &usable, &what)
            } else {
                // Only to part it from its first copy: elsewhere in the same group is no gain.
                let apart =
                    |d: DiskIndex| usable(d) && avoid.is_none_or(|g| disks.failure_group(d) != g);
                alloc.alloc_contiguous_blocks_on(0, AllocKind::Metadata, blocks, &apart)
            };
            let (start, blocks) = match placed {
                Ok(p) => p,
                Err(_) if !leaves => continue,
                Err(_) => {
                    for e in region_extents_of(desc, &taken) {
                        alloc.free(e).expect("a region just allocated");
                    }
                    return Err(FsError::NoSpace {
                        pool: "system".into(),
                        what: "allocation map regions (contiguous blocks of a ready metadata \
                               disk that is up)",
                    });
                }
            };
            let new = MapRegion {
                disk: r.disk,
                on_disk: start.disk,
                offset: desc.sub_block_offset(start.sub_block),
                bytes: blocks * bs,
            };
            old.push(r);
            lists[copy][i] = new;
            taken.push(new);
            if !moved.contains(&r.disk) {
                moved.push(r.disk);
            }
        }
    }
    let [firsts, seconds] = lists;
    if let Some(stored) = &mut desc.alloc_map {
        stored.regions = firsts;
    }
    if let Some(copies) = &mut desc.metadata_copies {
        copies.map_regions = seconds;
    }
    Ok((old, taken, moved))
}

/// Whether [`replace_regions_on`] with these `leaving` and `apart` would try to move a
/// region (it may still find no room for one that is only to be parted).
pub(crate) fn regions_may_move(
    desc: &FsDescriptor,
    disks: &DiskSet,
    leaving: &[DiskIndex],
    apart: bool,
) -> bool {
    let firsts: &[MapRegion] = desc.alloc_map.as_ref().map_or(&[], |m| &m.regions);
    let seconds: &[MapRegion] = desc
        .metadata_copies
        .as_ref()
        .map_or(&[], |c| &c.map_regions);
    let leaves = |r: &MapRegion| r.bytes > 0 && leaving.contains(&r.on_disk);
    let shares = |r: &MapRegion| {
        firsts.iter().any(|p| {
            p.disk == r.disk && disks.failure_group(p.on_disk) == disks.failure_group(r.on_disk)
        })
    };
    firsts.iter().chain(seconds).any(leaves)
        || apart && seconds.iter().any(|r| r.bytes > 0 && shares(r))
}

/// The block extents of the map regions, both copies (for fsck's reference count).
pub(crate) fn region_extents(desc: &FsDescriptor) -> Vec<Extent> {
    let mut out = match &desc.alloc_map {
        Some(stored) => region_extents_of(desc, &stored.regions),
        None => Vec::new(),
    };
    if let Some(copies) = &desc.metadata_copies {
        out.extend(region_extents_of(desc, &copies.map_regions));
    }
    out
}

pub(crate) fn region_extents_of(desc: &FsDescriptor, regions: &[MapRegion]) -> Vec<Extent> {
    let data_start = tessera_nsd::layout::data_start_bytes(u64::from(desc.block_size));
    let sub = u64::from(desc.sub_block_size);
    let per = desc.sub_blocks_per_block();
    let mut out = Vec::new();
    for r in regions.iter().filter(|r| r.bytes > 0) {
        let first = (r.offset - data_start) / sub;
        for b in 0..r.bytes / u64::from(desc.block_size) {
            out.push(Extent {
                addr: tessera_alloc::DiskAddr {
                    disk: r.on_disk,
                    sub_block: first + b * u64::from(per),
                },
                sub_blocks: per,
            });
        }
    }
    out
}

/// What mount found of the stored map.
pub(crate) struct Loaded {
    /// The map, when every chunk had a usable copy.
    pub map: Result<AllocMap, String>,
    /// The slot of every chunk to keep (known even when the map is unusable, so that the next
    /// checkpoint never overwrites a chunk's only good copy).
    pub slots: MapSlots,
    /// Chunks with a slot of a generation above the durable checkpoint's.
    pub stale: Vec<(DiskIndex, usize)>,
}

/// Which chunks of the stored map one owner slot reads, and what its commit point says of
/// them.
pub(crate) struct Scope {
    /// Copies of a generation above this one were written by a checkpoint that never
    /// committed.
    pub durable: u64,
    /// The digest of the current copies of the chunks read, as the commit point recorded it.
    pub digest: u64,
    /// The chunks (allocation regions) read; `None`: every chunk not `elsewhere`. A chunk
    /// neither read nor elsewhere starts free (a region given to the slot wholly free, not
    /// yet stored by it).
    pub read: Option<Vec<usize>>,
    /// Chunks of regions other slots own: held as used, never read (theirs to store).
    pub elsewhere: Vec<usize>,
    /// Disks whose index is at or above this were added after the commit point was
    /// written: none of their chunks is read (those `read` would take start free, as a
    /// region given since does; see `SlotRecord::disks_covered`).
    pub disks_covered: u32,
    /// Disks the slot let go of for a `disk delete` (`SlotRecord::dropped`): none of their
    /// chunks is read or counted, as for a disk not covered.
    pub dropped: Vec<DiskIndex>,
}

impl Scope {
    /// The file system manager's (slot 0's): its commit point is the descriptor.
    pub fn manager(desc: &FsDescriptor) -> Scope {
        Scope {
            durable: desc.checkpoint.generation,
            digest: desc.alloc_map.as_ref().map_or(0, |m| m.digest),
            read: None,
            elsewhere: crate::slot::foreign_regions(desc),
            disks_covered: u32::MAX,
            dropped: Vec::new(),
        }
    }
}

/// Reads the stored map of `desc` (which names its regions).
pub(crate) fn load(
    desc: &FsDescriptor,
    devices: &[Arc<dyn BlockDevice>],
    empty: AllocMap,
) -> FsResult<Loaded> {
    load_scope(desc, devices, empty, &Scope::manager(desc))
}

/// Reads the chunks of the stored map that `scope` names.
pub(crate) fn load_scope(
    desc: &FsDescriptor,
    devices: &[Arc<dyn BlockDevice>],
    empty: AllocMap,
    scope: &Scope,
) -> FsResult<Loaded> {
    let foreign = &scope.elsewhere;
    let reads = |c: usize| match &scope.read {
        None => !foreign.contains(&c),
        Some(read) => read.contains(&c),
    };
    let stored = desc
        .alloc_map
        .as_ref()
        .expect("load is called for descriptors that name map regions");
    let regions = &stored.regions;
    let owner = owner(desc);
    let durable = scope.durable;
    let mut slots = MapSlots::none(&empty);
    let mut stale = Vec::new();
    let mut bitmaps = Vec::with_capacity(desc.disks.len());
    let mut problem: Option<String> = None;
    let disks: BTreeMap<DiskIndex, &crate::descriptor::FsDisk> =
        desc.disks.iter().map(|d| (d.index, d)).collect();
    if regions.len() != disks.len() || regions.iter().any(|r| !disks.contains_key(&r.disk)) {
        return Ok(Loaded {
            map: Err(format!(
                "the descriptor names {} map regions for {} disks",
                regions.len(),
                disks.len()
            )),
            slots,
            stale,
        });
    }
    let mirrors: Vec<&MapRegion> = desc
        .metadata_copies
        .as_ref()
        .map(|c| c.map_regions.iter().collect())
        .unwrap_or_default();
    let mut by_disk: Vec<&MapRegion> = regions.iter().collect();
    by_disk.sort_by_key(|r| r.disk);
    for region in by_disk {
        let disk = region.disk;
        let chunks = empty.chunk_count(disk);
        let total_words = empty.bitmap(disk).len();
        let name = &disks[&disk].nsd_name;
        let covered = u32::from(disk) < scope.disks_covered && !scope.dropped.contains(&disk);
        // The disk's regions: the first, and its second copy with metadata replicated.
        let copies: Vec<&MapRegion> = std::iter::once(region)
            .chain(mirrors.iter().copied().filter(|m| m.disk == disk))
            .collect();
        let mut devs = Vec::with_capacity(copies.len());
        for r in &copies {
            let Some(dev) = devices.get(r.on_disk as usize) else {
                return Err(FsError::Corrupt(format!(
                    "the allocation map of {name} is on disk {}, which the file system lacks",
                    r.on_disk
                )));
            };
            devs.push(dev);
        }
        if let Some(small) = copies.iter().find(|r| r.bytes < region_bytes(chunks)) {
            problem.get_or_insert(format!(
                "the map region of {name} holds {} bytes, {} are needed",
                small.bytes,
                region_bytes(chunks)
            ));
            bitmaps.push(Vec::new());
            continue;
        }
        let mut words = Vec::with_capacity(total_words);
        let per_batch = READ_BATCH_BYTES / (2 * SLOT_BYTES);
        let mut chunk = 0;
        while chunk < chunks {
            let n = per_batch.min(chunks - chunk);
            let mut bufs = Vec::with_capacity(copies.len());
            let mut unreadable = Vec::new();
            for (r, dev) in copies.iter().zip(&devs) {
                let mut buf = AlignedBuf::zeroed(n * 2 * SLOT_BYTES);
                match dev.read_at(&mut buf, r.offset + (chunk * 2 * SLOT_BYTES) as u64) {
                    Ok(()) => bufs.push(buf),
                    Err(e) => unreadable.push(format!("reading the allocation map of {name}: {e}")),
                }
            }
            if bufs.is_empty() {
                // Unreadable is as good as damaged: the map is rebuilt, the mount goes on.
                problem.get_or_insert(unreadable.join("; "));
            }
            for i in 0..n {
                let c = chunk + i;
                let want = MAP_CHUNK_WORDS.min(total_words - c * MAP_CHUNK_WORDS);
                if !covered || !reads(c) {
                    words.extend(std::iter::repeat_n(0, want));
                    continue;
                }
                let mut best: Option<(u64, u8, Vec<u64>)> = None;
                let mut stale_slot = None;
                let mut tie = false;
                let mut why = Vec::new();
                // Both regions of a replicated map hold a chunk in the same slot, with the
                // same generation when both took the write: equal generations in one slot
                // are copies, in the two slots a contradiction.
                for buf in &bufs {
                    for s in 0..2u8 {
                        let at = (2 * i + s as usize) * SLOT_BYTES;
                        match decode_slot(&buf[at..at + SLOT_BYTES], owner, disk, c, want) {
                            Ok((g, _)) if g > durable => {
                                stale_slot = Some(s);
                                why.push(format!("slot {s}: generation {g} never committed"));
                            }
                            Ok((g, w)) => match &best {
                                Some(b) if b.0 == g && b.1 == s => {}
                                Some(b) if b.0 == g => tie = true,
                                Some(b) if b.0 > g => {}
                                _ => {
                                    tie = false;
                                    best = Some((g, s, w));
                                }
                            },
                            Err(e) => why.push(format!("slot {s}: {e}")),
                        }
                    }
                }
                let keep = &mut slots.keep.get_mut(&disk).expect("every disk")[c];
                if let Some(t) = stale_slot {
                    stale.push((disk, c));
                    // The next checkpoint writes over the stale slot first.
                    keep.slot = 1 - t;
                }
                match best {
                    Some((g, s, w)) if !tie => {
                        *keep = Kept {
                            slot: s,
                            generation: Some(g),
                        };
                        words.extend(w);
                    }
                    _ => {
                        if tie {
                            why.push("both slots claim the same generation".into());
                        }
                        problem.get_or_insert(format!(
                            "chunk {c} of the allocation map of {name} has no usable copy ({})",
                            why.join("; ")
                        ));
                        words.extend(std::iter::repeat_n(0, want));
                    }
                }
            }
            chunk += n;
        }
        bitmaps.push(words);
    }
    if problem.is_none() && slots.digest_with(&[], 0) != scope.digest {
        problem = Some(
            "a chunk of the allocation map is older than the checkpoint recorded (its newer \
             copy was lost or damaged)"
                .into(),
        );
    }
    let map = match problem {
        Some(p) => Err(p),
        None => AllocMap::from_bitmaps(
            desc.sub_blocks_per_block(),
            desc.placement,
            empty.disks().to_vec(),
            bitmaps,
        )
        .map(|mut map| {
            crate::slot::hold_regions(&mut map, foreign);
            // Holding marked them changed; they are never this owner's to store.
            map.take_dirty_chunks();
            map
        }),
    };
    Ok(Loaded { map, slots, stale })
}

/// With metadata replicated (`-m 2`): how many chunks of the stored map (the manager's and
/// every slot's) do not hold the same newest copy in both of their disk's map regions (a
/// checkpoint wrote one region copy while the other's disk was down, or the write failed),
/// or cannot be read from one of them. `geometry` gives each disk's chunk count. Such a
/// chunk reads from one failure group alone only as an older copy, which the digest
/// refuses (the manager then rebuilds its map by a scan; a slot does not mount): fsck counts
/// it ill-replicated, and `restripe -r` stores every chunk again.
pub(crate) fn chunks_with_unequal_copies(
    desc: &FsDescriptor,
    devices: &[Arc<dyn BlockDevice>],
    geometry: &AllocMap,
) -> u64 {
    let (Some(stored), Some(copies)) = (&desc.alloc_map, &desc.metadata_copies) else {
        return 0;
    };
    let owner = owner(desc);
    let mut unequal = 0u64;
    for region in &stored.regions {
        // A disk whose map has one region is counted by where its regions are.
        let Some(mirror) = copies.map_regions.iter().find(|m| m.disk == region.disk) else {
            continue;
        };
        let disk = region.disk;
        if !geometry.knows(disk) {
            continue;
        }
        let chunks = geometry.chunk_count(disk);
        let total_words = geometry.bitmap(disk).len();
        let per_batch = READ_BATCH_BYTES / (2 * SLOT_BYTES);
        let mut chunk = 0;
        while chunk < chunks {
            let n = per_batch.min(chunks - chunk);
            let newest = |r: &MapRegion| {
                newest_in_batch(
                    devices.get(r.on_disk as usize)?,
                    r,
                    (owner, disk),
                    chunk,
                    n,
                    total_words,
                )
            };
            let newest = [newest(region), newest(mirror)];
            match (&newest[0], &newest[1]) {
                (Some(a), Some(b)) => {
                    unequal += a.iter().zip(b).filter(|(a, b)| a != b).count() as u64
                }
                _ => unequal += n as u64,
            }
            chunk += n;
        }
    }
    unequal
}

/// The newest copy (generation, slot) that map region `r` of `disk` holds of each of the
/// `n` chunks from `first` (`None` for a chunk with no valid slot); `None` when the region
/// does not read.
fn newest_in_batch(
    dev: &Arc<dyn BlockDevice>,
    r: &MapRegion,
    (owner, disk): (u64, DiskIndex),
    first: usize,
    n: usize,
    total_words: usize,
) -> Option<Vec<Option<(u64, u8)>>> {
    let mut buf = AlignedBuf::zeroed(n * 2 * SLOT_BYTES);
    dev.read_at(&mut buf, r.offset + (first * 2 * SLOT_BYTES) as u64)
        .ok()?;
    let newest = |i: usize| {
        let c = first + i;
        let want = MAP_CHUNK_WORDS.min(total_words - c * MAP_CHUNK_WORDS);
        (0..2u8)
            .filter_map(|s| {
                let at = (2 * i + s as usize) * SLOT_BYTES;
                let decoded = decode_slot(&buf[at..at + SLOT_BYTES], owner, disk, c, want);
                decoded.ok().map(|(g, _)| (g, s))
            })
            .max()
    };
    Some((0..n).map(newest).collect())
}

/// The chunks (allocation regions) extent `e` lies in.
fn chunks_of(e: &Extent) -> std::ops::RangeInclusive<usize> {
    let first = e.addr.sub_block / 64;
    let last = (e.addr.sub_block + u64::from(e.sub_blocks) - 1) / 64;
    (first as usize / MAP_CHUNK_WORDS)..=(last as usize / MAP_CHUNK_WORDS)
}

/// Whether extent `e` lies (in part) in one of `chunks`.
pub(crate) fn touches_chunks(e: &Extent, chunks: &[usize]) -> bool {
    chunks_of(e).any(|c| chunks.contains(&c))
}

/// The chunks a checkpoint writes: every chunk changed since the last one, as the map is at
/// the checkpoint, which is the live map without `excluded` (extents the live map holds that
/// the checkpoint's metadata does not reference). Their chunks stay marked changed, since
/// their stored copy now differs from the live one.
pub(crate) fn snapshot(
    alloc: &mut AllocMap,
    excluded: &[Extent],
    foreign: &[usize],
) -> Vec<ChunkImage> {
    // Chunks of other slots' regions are theirs to store.
    let mut wanted: BTreeMap<(DiskIndex, usize), ()> = alloc
        .take_dirty_chunks()
        .into_iter()
        .filter(|(_, c)| !foreign.contains(c))
        .map(|k| (k, ()))
        .collect();
    // An excluded extent in another slot's region (none should be: this owner allocates
    // and frees only in its own) must not make this owner store that chunk.
    debug_assert!(
        excluded.iter().all(|e| !touches_chunks(e, foreign)),
        "an extent this owner excludes lies in another slot's region"
    );
    let excluded: Vec<Extent> = excluded
        .iter()
        .filter(|e| !touches_chunks(e, foreign))
        .copied()
        .collect();
    for e in &excluded {
        for c in chunks_of(e) {
            wanted.insert((e.addr.disk, c), ());
        }
    }
    let mut images: BTreeMap<(DiskIndex, usize), ChunkImage> = wanted
        .into_keys()
        .map(|(disk, chunk)| {
            let image = ChunkImage {
                disk,
                chunk,
                words: alloc.chunk_words(disk, chunk).to_vec(),
            };
            ((disk, chunk), image)
        })
        .collect();
    for e in &excluded {
        for s in e.addr.sub_block..e.addr.sub_block + u64::from(e.sub_blocks) {
            let word = (s / 64) as usize;
            let image = images
                .get_mut(&(e.addr.disk, word / MAP_CHUNK_WORDS))
                .expect("chunk of an excluded extent is in the snapshot");
            image.words[word % MAP_CHUNK_WORDS] &= !(1u64 << (s % 64));
        }
        alloc
            .mark_chunks_dirty(*e)
            .expect("excluded extents are valid extents of the map");
    }
    images.into_values().collect()
}

/// Writes a checkpoint's chunks, each into the slot that does not hold its current copy,
/// flushes the disks written, and sets `desc`'s digest to what it is once they are current
/// (the caller then writes `desc`); returns the slots written, for [`MapSlots::commit`] once
/// that descriptor is durable.
///
/// With metadata replicated each chunk goes to the same slot of both of its disk's regions
/// (`MetadataCopies::map_regions` holds the second ones); a region whose disk is down, or
/// fails the write or the flush (it is then marked down), is skipped, and mount takes each
/// chunk's newest copy from either region. The checkpoint fails only when a chunk reached
/// no region.
pub(crate) fn write_chunks(
    desc: &mut FsDescriptor,
    disks: &DiskSet,
    slots: &MapSlots,
    generation: u64,
    images: &[ChunkImage],
) -> FsResult<Vec<(DiskIndex, usize, u8)>> {
    let Some(stored) = &desc.alloc_map else {
        return Ok(Vec::new());
    };
    let mut regions_of: HashMap<DiskIndex, Vec<&MapRegion>> = HashMap::new();
    let mirrors = desc.metadata_copies.as_ref().map(|c| &c.map_regions[..]);
    for r in stored.regions.iter().chain(mirrors.unwrap_or(&[])) {
        regions_of.entry(r.disk).or_default().push(r);
    }
    let mirrored = mirrors.is_some();
    let owner = owner(desc);
    let mut touched = vec![false; disks.len()];
    let mut failed: Vec<(DiskIndex, std::io::Error)> = Vec::new();
    let mut written = Vec::with_capacity(images.len());
    for image in images {
        let slot = slots.target(image.disk, image.chunk);
        let bytes = encode_slot(owner, image.disk, image.chunk, generation, &image.words);
        for region in &regions_of[&image.disk] {
            let on = region.on_disk;
            if disks.is_down(on) || failed.iter().any(|(d, _)| *d == on) {
                continue;
            }
            let at = region.offset + ((image.chunk * 2 + slot as usize) * SLOT_BYTES) as u64;
            assert!(at + SLOT_BYTES as u64 <= region.offset + region.bytes);
            match disks.get(on).write_at(&AlignedBuf::from_slice(&bytes), at) {
                Ok(()) => touched[on as usize] = true,
                Err(e) if mirrored => failed.push((on, e)),
                Err(e) => return Err(e.into()),
            }
        }
        written.push((image.disk, image.chunk, slot));
    }
    for (disk, t) in touched.into_iter().enumerate() {
        let disk = disk as DiskIndex;
        if t && !failed.iter().any(|(d, _)| *d == disk) {
            match disks.get(disk).flush() {
                Ok(()) => {}
                Err(e) if mirrored => failed.push((disk, e)),
                Err(e) => return Err(e.into()),
            }
        }
    }
    for (disk, e) in &failed {
        if disks.set_down(*disk, true) {
            tracing::error!(
                "{}: NSD {} is down: a write of the allocation map failed: {e}; the map's \
                 copies on other failure groups are used",
                desc.name,
                disks.name(*disk)
            );
        }
    }
    if let Some(image) = images
        .iter()
        .find(|i| regions_of[&i.disk].iter().all(|r| disks.is_down(r.on_disk)))
    {
        return Err(FsError::Io(std::io::Error::other(format!(
            "no copy of chunk {} of the allocation map of {} could be written: every disk \
             holding its region is down",
            image.chunk,
            disks.name(image.disk)
        ))));
    }
    if let Some(stored) = &mut desc.alloc_map {
        stored.digest = slots.digest_with(&written, generation);
    }
    Ok(written)
}

/// Differences between a stored map and the map rebuilt from the metadata, for fsck: one
/// line per disk that differs.
pub(crate) fn compare(desc: &FsDescriptor, stored: &AllocMap, rebuilt: &AllocMap) -> Vec<String> {
    let mut out = Vec::new();
    for d in &desc.disks {
        let (s, r) = (stored.bitmap(d.index), rebuilt.bitmap(d.index));
        let leaked: u64 = s
            .iter()
            .zip(r)
            .map(|(s, r)| u64::from((s & !r).count_ones()))
            .sum();
        let missing: u64 = s
            .iter()
            .zip(r)
            .map(|(s, r)| u64::from((!s & r).count_ones()))
            .sum();
        if leaked + missing > 0 {
            out.push(format!(
                "allocation map of {}: {leaked} sub-block(s) marked used that nothing \
                 references, {missing} referenced but marked free",
                d.nsd_name
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_alloc::{AllocDisk, DiskAddr, Placement};

    #[test]
    fn slot_golden_bytes() {
        let words = [0x0102_0304_0506_0708u64, u64::MAX];
        let slot = encode_slot(0x1122_3344_5566_7788, 3, 7, 42, &words);
        assert_eq!(slot.len(), SLOT_BYTES);
        assert_eq!(&slot[0..4], b"TSAM");
        assert_eq!(&slot[4..6], &[3, 0], "disk");
        assert_eq!(&slot[6..8], &[1, 0], "version");
        assert_eq!(
            &slot[8..16],
            &[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11],
            "owner"
        );
        assert_eq!(&slot[16..24], &[42, 0, 0, 0, 0, 0, 0, 0], "generation");
        assert_eq!(&slot[24..28], &[7, 0, 0, 0], "chunk");
        let crc = crc32c::crc32c_append(crc32c::crc32c(&slot[..28]), &slot[32..]);
        assert_eq!(&slot[28..32], &crc.to_le_bytes(), "crc32c");
        assert_eq!(&slot[32..40], &[8, 7, 6, 5, 4, 3, 2, 1], "first word");
        assert_eq!(&slot[40..48], &[0xFF; 8], "second word");
        assert!(slot[48..].iter().all(|b| *b == 0), "zero after the words");
        assert_eq!(
            decode_slot(&slot, 0x1122_3344_5566_7788, 3, 7, 2).unwrap(),
            (42, words.to_vec())
        );
    }

    #[test]
    fn slots_of_elsewhere_or_damaged_are_refused_by_name() {
        let owner = 9;
        let slot = encode_slot(owner, 1, 2, 5, &[1, 2, 3]);
        let refuse = |bytes: &[u8], owner, disk, chunk, words| {
            decode_slot(bytes, owner, disk, chunk, words).unwrap_err()
        };
        assert!(refuse(&slot, 8, 1, 2, 3).contains("another file system"));
        assert!(refuse(&slot, owner, 0, 2, 3).contains("misdirected"));
        assert!(refuse(&slot, owner, 1, 3, 3).contains("misdirected"));
        assert!(refuse(&slot, owner, 1, 2, 2).contains("beyond the end"));
        assert!(refuse(&vec![0; SLOT_BYTES], owner, 1, 2, 3).contains("never written"));
        // Every single bit flip is caught.
        for bit in (0..SLOT_BYTES * 8).step_by(7) {
            let mut bad = slot.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_slot(&bad, owner, 1, 2, 3).is_err(), "bit {bit}");
        }
    }

    fn map() -> AllocMap {
        let disks = (0..2)
            .map(|d| AllocDisk {
                disk: d,
                pool: 0,
                blocks: 2000,
                holds_data: true,
                holds_metadata: true,
                available: true,
            })
            .collect();
        AllocMap::new(32, Placement::Scatter, disks)
    }

    #[test]
    fn snapshot_leaves_out_what_the_checkpoint_does_not_reference() {
        let mut alloc = map();
        assert_eq!(alloc.chunk_count(0), 2);
        let _ = alloc.take_dirty_chunks();
        let e = |disk, sub_block, sub_blocks| Extent {
            addr: DiskAddr { disk, sub_block },
            sub_blocks,
        };
        let kept = e(0, 32, 32);
        let unlogged = e(1, 600 * 64, 32);
        alloc.mark_used(kept).unwrap();
        alloc.mark_used(unlogged).unwrap();
        let images = snapshot(&mut alloc, &[unlogged], &[]);
        let chunks: Vec<(DiskIndex, usize)> = images.iter().map(|i| (i.disk, i.chunk)).collect();
        assert_eq!(chunks, vec![(0, 0), (1, 1)]);
        assert_eq!(
            images[0].words[0], 0xFFFF_FFFF_0000_0000,
            "used, stored used"
        );
        assert!(
            images[1].words.iter().all(|w| *w == 0),
            "unlogged, stored free"
        );
        assert!(!alloc.is_free(unlogged), "the live map keeps it");
        // Its chunk differs from what was stored, so the next checkpoint takes it again.
        assert_eq!(alloc.take_dirty_chunks(), vec![(1, 1)]);
    }

    #[test]
    fn slots_alternate_and_the_digest_follows_the_generations() {
        let alloc = map();
        let mut slots = MapSlots::none(&alloc);
        assert_eq!(slots.digest_with(&[], 0), 0);
        assert_eq!(slots.target(0, 1), 0);
        slots.commit(&[(0, 1, 0)], 4);
        let d4 = slots.digest_with(&[], 0);
        assert_eq!(d4, digest_term(0, 1, 4));
        assert_eq!(slots.target(0, 1), 1, "never over the current copy");
        assert_eq!(slots.digest_with(&[(0, 1, 1)], 5), digest_term(0, 1, 5));
        slots.commit(&[(0, 1, 1)], 5);
        assert_eq!(slots.target(0, 1), 0);
        assert_ne!(slots.digest_with(&[], 0), d4);
    }
}
