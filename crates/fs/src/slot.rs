//! Owner slots (format version 8): where a node other than the file system manager keeps the
//! shards it owns, so that several nodes own shards of one file system at once, each with
//! its own recovery log and its own checkpoint commit point (ARCHITECTURE.md, "Shards owned
//! where they are used").
//!
//! Slot 0 is the file system manager's and is the descriptor itself: its checkpoint, log and
//! shard roots stay where they were before slots existed, so a one-node file system does not
//! change on disk. Slots 1 and up are made when a node first takes one, each a *slot region*
//! of whole blocks on a metadata disk (a second copy on another failure group with `-m 2`)
//! that the descriptor lists ([`SlotRegion`]):
//!
//! ```text
//! offset        +R              +2R                                          +bytes
//! +-------------+---------------+--------------------------------------------+
//! | record A    | record B      | the slot's recovery log (tessera-journal)  |
//! | even gens   | odd gens      | its own log id, LSNs of its own            |
//! +-------------+---------------+--------------------------------------------+
//! R = record_bytes: room for every shard and at least 1024 allocation regions, whole sectors
//! ```
//!
//! A record ([`SlotRecord`]) is the slot's checkpoint commit point, written through (FUA) to
//! the half of its generation's parity, so that a torn record write leaves the other half,
//! one generation older, to read. Little endian:
//!
//! ```text
//! 0        8         12       16          24       28       32              48
//! +--------+---------+--------+-----------+--------+--------+---------------+
//! | magic  | version | slot   | generation| length | crc32c | fs uuid       |
//! |TSRSLOT1| u32 = 3 | u32    | u64       | u32    | u32    | 16 bytes      |
//! +--------+---------+--------+-----------+--------+--------+---------------+
//! 48            56                 64            72           76           80       84      88
//! +-------------+------------------+-------------+------------+------------+--------+-------+
//! | replay from | page generation  | map digest  | shard count| region     | disks  |dropped|
//! | u64 (LSN)   | u64              | u64         | u32 = S    | count u32=N| covered|u32 = D|
//! +-------------+------------------+-------------+------------+------------+--------+-------+
//! 88: S shard entries of 32 bytes, in shard order, then N region entries of 4 bytes: the
//!     allocation regions the slot owns, in order, then those it gave back to the file
//!     system manager that the owner map still gives it, in order, with bit 31 set (the
//!     slot never allocates there again; the manager completes the move); then D disk
//!     indexes (u32 each, in order) the slot let go of for a `disk delete`
//! shard entry: 0 shard u32 | 4 root crc32c u32 | 8 shard generation u64 | 16 root address
//!              u64 | 24 root's second address u64 (u64::MAX: one copy)
//! ```
//!
//! Version 2 records end the fixed part at byte 84 (no dropped disks), version 1 at 80 (no
//! disks covered either); both are still read.
//!
//! The map digest is that of the generations of the stored chunks of the slot's regions
//! (`alloc_map::MapSlots::digest` over them), as the descriptor's is for slot 0's.
//!
//! `length` counts the bytes from 48 on; the crc covers bytes 0 to 48 + length with its own
//! four bytes taken as zero, so a record of another file system, another slot or a torn
//! write is refused by name. The remainder of the record's sectors is zero.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tessera_alloc::{DiskIndex, Extent};
use tessera_drive::{AlignedBuf, SECTOR_BYTES};
use tessera_journal::{JournalRegion, Lsn};

use crate::descriptor::{FsDescriptor, ShardRoot, NO_SECOND_COPY};
use crate::disk_set::DiskSet;
use crate::error::{FsError, FsResult};

pub const RECORD_MAGIC: [u8; 8] = *b"TSRSLOT1";
/// Version 2 added the disks the map digest covers (`SlotRecord::disks_covered`); version 1
/// records are read as covering every disk. Version 3 added the disks the slot let go of
/// for a `disk delete` (`SlotRecord::dropped`); earlier records are read as dropping none.
pub const RECORD_VERSION: u32 = 3;
const HEADER_BYTES: usize = 48;
const BODY_FIXED_BYTES: usize = 40;
/// Version 1's fixed body: no `disks_covered`.
const BODY_FIXED_BYTES_V1: usize = 32;
/// Version 2's fixed body: no count of dropped disks.
const BODY_FIXED_BYTES_V2: usize = 36;
const DROPPED_ENTRY_BYTES: usize = 4;
const SHARD_ENTRY_BYTES: usize = 32;
const REGION_ENTRY_BYTES: usize = 4;
/// How long the manager, having found no slot with a region to give back, answers a full
/// allocation without asking them again.
const ASK_FOR_REGIONS_AGAIN: std::time::Duration = std::time::Duration::from_secs(1);
/// The bit of a region entry that marks a region given back to the file system manager.
const GIVEN_BACK: u32 = 1 << 31;
/// Allocation regions a record has room for at least: a slot holds a few regions (4 GiB of
/// every disk each with 4 MiB blocks), and a record sized for this many never runs out
/// before the file system's disks do.
pub const RECORD_REGIONS_MIN: u32 = 1024;
/// Owner slots a file system has at most (slot 0 among them): one per node that owns
/// metadata, and a mount keeps a way to each.
pub const SLOTS_MAX: usize = 1024;

/// The owner slots beyond slot 0 and the owner map, as the descriptor records them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slots {
    /// By slot number.
    pub regions: Vec<SlotRegion>,
    /// By shard: who owns it. Shards past the end belong to slot 0 at generation 0.
    pub shard_owners: Vec<ShardOwner>,
    /// By allocation region (chunk `r` of every disk's map): the slot that allocates in
    /// it. Regions past the end belong to slot 0.
    pub region_owners: Vec<u32>,
}

/// Which slot owns a shard. The generation counts the shard's hand-overs: a slot record's
/// entry for the shard counts only while it names the owner map's generation, so a record
/// written for a hand-over the map never committed is ignored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardOwner {
    pub slot: u32,
    pub generation: u64,
}

/// A slot's region as the descriptor lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRegion {
    /// 1 and up (slot 0 is the descriptor's own).
    pub slot: u32,
    pub disk: u16,
    /// Byte offset of record A on `disk`, at a block boundary of the data region.
    pub offset: u64,
    /// The whole region: both records and the log, whole blocks.
    pub bytes: u64,
    /// Bytes of each of the two records.
    pub record_bytes: u32,
    /// The id the slot's log was formatted with.
    pub log_id: [u8; 16],
    /// The region's second copy with `-m 2`, as large, on a disk of another failure group
    /// where one had room.
    pub second: Option<SlotSecondCopy>,
}

/// Where a slot region's second copy lives, and which copy of its log lacks records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotSecondCopy {
    pub disk: u16,
    pub offset: u64,
    /// As `MetadataCopies::log_behind` for the descriptor's log: 0 the first copy, 1 this one.
    pub log_behind: Option<u8>,
}

impl SlotRegion {
    /// The slot's recovery log, in the first copy's coordinates.
    pub fn log_region(&self) -> JournalRegion {
        let records = 2 * u64::from(self.record_bytes);
        JournalRegion {
            offset: self.offset + records,
            bytes: self.bytes - records,
        }
    }

    /// (disk, offset of record A) of each copy, the first copy first.
    pub fn copies(&self) -> Vec<(DiskIndex, u64)> {
        std::iter::once((self.disk, self.offset))
            .chain(self.second.map(|s| (s.disk, s.offset)))
            .collect()
    }

    /// Whether `other` is this region, whatever either says of its log copies' state (which
    /// the file system manager records apart, `Namespace::record_slot_log`).
    pub fn same_place(&self, other: &SlotRegion) -> bool {
        let place = |r: &SlotRegion| (r.slot, r.bytes, r.record_bytes, r.log_id, r.copies());
        place(self) == place(other)
    }

    /// The blocks of every copy, as the allocation map holds them.
    pub fn extents(&self, desc: &FsDescriptor) -> Vec<Extent> {
        let data_start = tessera_nsd::layout::data_start_bytes(u64::from(desc.block_size));
        let sub = u64::from(desc.sub_block_size);
        let per = desc.sub_blocks_per_block();
        let blocks = self.bytes / u64::from(desc.block_size);
        self.copies()
            .into_iter()
            .flat_map(|(disk, offset)| {
                crate::recovery::whole_blocks(data_start, sub, per, disk, offset, blocks)
            })
            .collect()
    }
}

/// The bytes of one record able to name every one of `shard_count` shards and
/// `region_count` allocation regions (at least [`RECORD_REGIONS_MIN`]), in whole sectors.
pub fn record_bytes(shard_count: u32, region_count: u32) -> u32 {
    let bytes = HEADER_BYTES
        + BODY_FIXED_BYTES
        + SHARD_ENTRY_BYTES * shard_count as usize
        + REGION_ENTRY_BYTES * region_count.max(RECORD_REGIONS_MIN) as usize;
    bytes.div_ceil(SECTOR_BYTES as usize) as u32 * SECTOR_BYTES as u32
}

/// How many allocation regions the file system's map has: chunk `r` of every disk's
/// bitmap is region `r`, so as many as the largest disk has chunks.
pub fn region_count(desc: &FsDescriptor) -> u32 {
    let per_chunk = (tessera_alloc::MAP_CHUNK_WORDS * 64) as u64;
    let spb = u64::from(desc.sub_blocks_per_block());
    let most = desc.disks.iter().map(|d| d.blocks * spb).max().unwrap_or(0);
    u32::try_from(most.div_ceil(per_chunk)).expect("regions fit u32")
}

/// One shard as a slot's checkpoint left it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotShard {
    pub shard: u32,
    /// The shard's generation in the owner map when this slot checkpointed it: replay
    /// applies the slot's records of a shard only while the map still gives it this one.
    pub generation: u64,
    pub root: ShardRoot,
    /// The root page's second address (`-m 2`).
    pub second: Option<u64>,
}

/// A slot's checkpoint commit point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotRecord {
    pub slot: u32,
    /// The record's own generation: even ones in record A, odd ones in record B.
    pub generation: u64,
    /// Records of the slot's log with an end LSN above this are replayed.
    pub replay_from: Lsn,
    /// The metadata page generation this slot's last checkpoint wrote.
    pub page_generation: u64,
    /// The shards this slot's checkpoint holds, by shard number.
    pub shards: Vec<SlotShard>,
    /// The allocation regions the slot owns (chunk `r` of every disk's map), in order.
    pub regions: Vec<u32>,
    /// Regions the owner map still gives the slot that it gave back to the file system
    /// manager (`FileSystem::give_region_back`), in order: the slot never allocates in
    /// them again, and the manager completes the move when it commits the owner map.
    pub given_back: Vec<u32>,
    /// The digest of the generations of those regions' stored chunks, on the disks whose
    /// index is below `disks_covered`.
    pub map_digest: u64,
    /// One past the highest disk index the slot's allocation map knew at this checkpoint:
    /// every disk below it had its chunks of the slot's regions stored and counted in the
    /// digest. A disk added to the file system since (indexes only grow) has none stored:
    /// its chunks of the slot's regions start free at the slot's mount, since only this
    /// slot allocates there and it logs what it allocates (`u32::MAX` in a version-1
    /// record, written before disks could be added beside slots: every disk).
    pub disks_covered: u32,
    /// Disks the slot let go of for a `disk delete` (`FileSystem::drop_disks`), in order:
    /// nothing of the slot's is on them, its allocator no longer has them, and the digest
    /// leaves their chunks out, so that the manager can remove them from the descriptor.
    /// Kept while the descriptor still names them; a disk that comes back to service (the
    /// delete given up) is taken again as an added one, its chunks of the slot's regions
    /// free.
    pub dropped: Vec<u16>,
}

impl SlotRecord {
    /// The record a slot starts with: nothing owned, nothing to replay.
    pub fn empty(slot: u32) -> SlotRecord {
        SlotRecord {
            slot,
            generation: 0,
            replay_from: 0,
            page_generation: 0,
            shards: Vec::new(),
            regions: Vec::new(),
            given_back: Vec::new(),
            map_digest: 0,
            disks_covered: 0,
            dropped: Vec::new(),
        }
    }

    /// Bytes the record takes stored, before the padding to `record_bytes`.
    pub fn encoded_len(&self) -> usize {
        HEADER_BYTES
            + BODY_FIXED_BYTES
            + SHARD_ENTRY_BYTES * self.shards.len()
            + REGION_ENTRY_BYTES * (self.regions.len() + self.given_back.len())
            + DROPPED_ENTRY_BYTES * self.dropped.len()
    }

    /// The record as it is stored, `record_bytes` long.
    pub fn encode(&self, fs_uuid: &[u8; 16], record_bytes: u32) -> AlignedBuf {
        let shards_end = BODY_FIXED_BYTES + SHARD_ENTRY_BYTES * self.shards.len();
        let entries: Vec<u32> = self
            .regions
            .iter()
            .copied()
            .chain(self.given_back.iter().map(|r| r | GIVEN_BACK))
            .collect();
        let regions_end = shards_end + REGION_ENTRY_BYTES * entries.len();
        let body_len = regions_end + DROPPED_ENTRY_BYTES * self.dropped.len();
        assert!(
            HEADER_BYTES + body_len <= record_bytes as usize,
            "a slot record of {} shards, {} regions and {} dropped disks does not fit \
             {record_bytes} bytes",
            self.shards.len(),
            self.regions.len(),
            self.dropped.len()
        );
        assert!(
            self.dropped.windows(2).all(|w| w[0] < w[1]),
            "a slot record's dropped disks are in order, each once"
        );
        assert!(
            self.shards.windows(2).all(|w| w[0].shard < w[1].shard)
                && self.regions.windows(2).all(|w| w[0] < w[1])
                && self.given_back.windows(2).all(|w| w[0] < w[1])
                && self
                    .regions
                    .iter()
                    .chain(&self.given_back)
                    .all(|r| *r < GIVEN_BACK),
            "a slot record's shards and regions are in order, each once"
        );
        let mut buf = AlignedBuf::zeroed(record_bytes as usize);
        buf[0..8].copy_from_slice(&RECORD_MAGIC);
        buf[8..12].copy_from_slice(&RECORD_VERSION.to_le_bytes());
        buf[12..16].copy_from_slice(&self.slot.to_le_bytes());
        buf[16..24].copy_from_slice(&self.generation.to_le_bytes());
        buf[24..28].copy_from_slice(&(body_len as u32).to_le_bytes());
        buf[32..48].copy_from_slice(fs_uuid);
        let body = &mut buf[HEADER_BYTES..HEADER_BYTES + body_len];
        body[0..8].copy_from_slice(&self.replay_from.to_le_bytes());
        body[8..16].copy_from_slice(&self.page_generation.to_le_bytes());
        body[16..24].copy_from_slice(&self.map_digest.to_le_bytes());
        body[24..28].copy_from_slice(&(self.shards.len() as u32).to_le_bytes());
        body[28..32].copy_from_slice(&(entries.len() as u32).to_le_bytes());
        body[32..36].copy_from_slice(&self.disks_covered.to_le_bytes());
        body[36..40].copy_from_slice(&(self.dropped.len() as u32).to_le_bytes());
        for (i, d) in self.dropped.iter().enumerate() {
            body[regions_end + i * DROPPED_ENTRY_BYTES..][..DROPPED_ENTRY_BYTES]
                .copy_from_slice(&u32::from(*d).to_le_bytes());
        }
        for (i, r) in entries.iter().enumerate() {
            body[shards_end + i * REGION_ENTRY_BYTES..][..REGION_ENTRY_BYTES]
                .copy_from_slice(&r.to_le_bytes());
        }
        for (i, s) in self.shards.iter().enumerate() {
            let e = &mut body[BODY_FIXED_BYTES + i * SHARD_ENTRY_BYTES..][..SHARD_ENTRY_BYTES];
            e[0..4].copy_from_slice(&s.shard.to_le_bytes());
            e[4..8].copy_from_slice(&s.root.crc32c.to_le_bytes());
            e[8..16].copy_from_slice(&s.generation.to_le_bytes());
            e[16..24].copy_from_slice(&s.root.addr.to_le_bytes());
            e[24..32].copy_from_slice(&s.second.unwrap_or(NO_SECOND_COPY).to_le_bytes());
        }
        let crc = crc32c::crc32c(&buf[..HEADER_BYTES + body_len]);
        buf[28..32].copy_from_slice(&crc.to_le_bytes());
        buf
    }

    /// Reads a record of `slot` of the file system `fs_uuid` from its stored bytes: `None`
    /// when the bytes hold no record at all (never written), an error saying what is wrong
    /// with one that is damaged or belongs elsewhere.
    pub fn decode(
        bytes: &[u8],
        fs_uuid: &[u8; 16],
        slot: u32,
    ) -> Result<Option<SlotRecord>, String> {
        if bytes.len() < HEADER_BYTES {
            return Err(format!(
                "{} bytes, shorter than a record header",
                bytes.len()
            ));
        }
        if bytes[0..8] != RECORD_MAGIC {
            return if bytes[0..8].iter().all(|b| *b == 0) {
                Ok(None)
            } else {
                Err("no slot record magic".into())
            };
        }
        let version = le_u32(&bytes[8..]);
        let fixed = match version {
            1 => BODY_FIXED_BYTES_V1,
            2 => BODY_FIXED_BYTES_V2,
            RECORD_VERSION => BODY_FIXED_BYTES,
            _ => {
                return Err(format!(
                    "record format version {version}, this Tessera reads versions 1 to \
                     {RECORD_VERSION}"
                ))
            }
        };
        let body_len = le_u32(&bytes[24..]) as usize;
        if body_len < fixed || HEADER_BYTES + body_len > bytes.len() {
            return Err(format!("body length {body_len} out of range"));
        }
        verify_header(bytes, body_len, fs_uuid, slot, "record")?;
        let body = &bytes[HEADER_BYTES..HEADER_BYTES + body_len];
        let count = le_u32(&body[24..]) as usize;
        let region_count = le_u32(&body[28..]) as usize;
        let dropped_count = if version >= 3 {
            le_u32(&body[36..]) as usize
        } else {
            0
        };
        let shards_end = fixed + count.saturating_mul(SHARD_ENTRY_BYTES);
        let regions_end =
            shards_end.saturating_add(region_count.saturating_mul(REGION_ENTRY_BYTES));
        if regions_end.saturating_add(dropped_count.saturating_mul(DROPPED_ENTRY_BYTES)) != body_len
        {
            return Err(format!(
                "{count} shard, {region_count} region and {dropped_count} dropped disk entries \
                 do not fill a body of {body_len} bytes"
            ));
        }
        let mut dropped = Vec::with_capacity(dropped_count);
        for i in 0..dropped_count {
            let d = le_u32(&body[regions_end + i * DROPPED_ENTRY_BYTES..]);
            let d = u16::try_from(d).map_err(|_| format!("dropped disk {d} out of range"))?;
            if dropped.last().is_some_and(|p| *p >= d) {
                return Err(format!("dropped disk {d} out of order"));
            }
            dropped.push(d);
        }
        let entries: Vec<u32> = (0..region_count)
            .map(|i| le_u32(&body[shards_end + i * REGION_ENTRY_BYTES..]))
            .collect();
        let (given_back, regions): (Vec<u32>, Vec<u32>) =
            entries.iter().partition(|r| *r & GIVEN_BACK != 0);
        let given_back: Vec<u32> = given_back.into_iter().map(|r| r & !GIVEN_BACK).collect();
        if entries.len() != regions.len() + given_back.len()
            || entries[..regions.len()] != regions[..]
            || regions.windows(2).any(|w| w[0] >= w[1])
            || given_back.windows(2).any(|w| w[0] >= w[1])
        {
            return Err("allocation regions out of order".into());
        }
        let mut shards: Vec<SlotShard> = Vec::with_capacity(count);
        for i in 0..count {
            let e = &body[fixed + i * SHARD_ENTRY_BYTES..][..SHARD_ENTRY_BYTES];
            let second = le_u64(&e[24..]);
            let entry = SlotShard {
                shard: le_u32(e),
                root: ShardRoot {
                    crc32c: le_u32(&e[4..]),
                    addr: le_u64(&e[16..]),
                },
                generation: le_u64(&e[8..]),
                second: (second != NO_SECOND_COPY).then_some(second),
            };
            if shards.last().is_some_and(|p| p.shard >= entry.shard) {
                return Err(format!("shard {} out of order", entry.shard));
            }
            shards.push(entry);
        }
        Ok(Some(SlotRecord {
            slot,
            generation: le_u64(&bytes[16..]),
            replay_from: le_u64(body),
            page_generation: le_u64(&body[8..]),
            shards,
            regions,
            given_back,
            map_digest: le_u64(&body[16..]),
            disks_covered: match version {
                1 => u32::MAX,
                _ => le_u32(&body[32..]),
            },
            dropped,
        }))
    }
}

/// Checks what every stored slot record (`what`: a record, or a forward record) carries in
/// its 48-byte header: the crc over the header and `body_len` bytes of body with the crc's
/// own four bytes taken as zero, the file system's uuid and the slot's number.
pub(crate) fn verify_header(
    bytes: &[u8],
    body_len: usize,
    fs_uuid: &[u8; 16],
    slot: u32,
    what: &str,
) -> Result<(), String> {
    let mut covered = bytes[..HEADER_BYTES + body_len].to_vec();
    covered[28..32].fill(0);
    if crc32c::crc32c(&covered) != le_u32(&bytes[28..]) {
        return Err(format!("checksum mismatch (a torn or damaged {what})"));
    }
    if bytes[32..48] != fs_uuid[..] {
        return Err(format!("the {what} belongs to another file system"));
    }
    let stored_slot = le_u32(&bytes[12..]);
    if stored_slot != slot {
        return Err(format!("the {what} is slot {stored_slot}'s"));
    }
    Ok(())
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().unwrap())
}

fn le_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().unwrap())
}

/// Writes `record` through (FUA) into the half of its generation's parity on every copy of
/// the region whose disk is up. Succeeds when at least one copy took it; the caller decides
/// what a missing copy means.
pub(crate) fn write_record(
    desc: &FsDescriptor,
    disks: &DiskSet,
    region: &SlotRegion,
    record: &SlotRecord,
) -> FsResult<usize> {
    let missed = write_record_copies(desc, disks, region, record)?;
    Ok(region.copies().len() - missed.len())
}

/// As [`write_record`], and says which copies did not take it and why (a `-m 2` slot's
/// owner then calls that copy behind: its record is older than the other's).
pub(crate) fn write_record_copies(
    desc: &FsDescriptor,
    disks: &DiskSet,
    region: &SlotRegion,
    record: &SlotRecord,
) -> FsResult<Vec<(u8, String)>> {
    assert_eq!(record.slot, region.slot);
    let buf = record.encode(&desc.fs_uuid, region.record_bytes);
    let half = (record.generation % 2) * u64::from(region.record_bytes);
    let mut written = 0;
    let mut last_err = None;
    let mut missed = Vec::new();
    for (c, (disk, offset)) in region.copies().into_iter().enumerate() {
        if disks.is_down(disk) {
            missed.push((c as u8, format!("{} is down", disks.name(disk))));
            continue;
        }
        match disks.get(disk).write_fua(&buf, offset + half) {
            Ok(()) => written += 1,
            Err(e) => {
                missed.push((c as u8, format!("writing its record failed: {e}")));
                tracing::error!(
                    "{}: writing the record of owner slot {} to {}: {e}",
                    desc.name,
                    region.slot,
                    disks.name(disk)
                );
                last_err = Some(e);
            }
        }
    }
    if written == 0 {
        return Err(match last_err {
            Some(e) => FsError::Io(e),
            None => FsError::Usage(format!(
                "no disk holding owner slot {} of {} is up; start it (tessera disk change {} \
                 --start)",
                region.slot, desc.name, desc.name
            )),
        });
    }
    Ok(missed)
}

/// After the log copy that was behind caught up (`MirroredLog::resync`), before the
/// descriptor calls it current: `record`, the slot's newest, written to every copy, so that
/// either copy alone reads it. A copy that misses it is behind again.
pub(crate) fn write_record_to_caught_up(
    desc: &FsDescriptor,
    disks: &DiskSet,
    region: &SlotRegion,
    record: &SlotRecord,
    log: &crate::mirrored_log::MirroredLog,
) -> FsResult<()> {
    for (c, why) in write_record_copies(desc, disks, region, record)? {
        log.missed(c, &why)?;
    }
    Ok(())
}

/// The newest record of the slot, from the region it is in: its descriptor region, or the
/// region that one forwards to (a move under its owner, `slot_move.rs`).
pub(crate) fn read_record(
    desc: &FsDescriptor,
    disks: &DiskSet,
    region: &SlotRegion,
) -> FsResult<SlotRecord> {
    current_region(desc, disks, region).map(|(_, record)| record)
}

/// Where the slot's records and log are, with its newest record: `region` (as the
/// descriptor names it), or the region its newest record forwards to. A forward that
/// disagrees with the move the descriptor reserves, or leads to another forward, is
/// damage.
pub(crate) fn current_region(
    desc: &FsDescriptor,
    disks: &DiskSet,
    region: &SlotRegion,
) -> FsResult<(SlotRegion, SlotRecord)> {
    let forward = match read_newest(desc, disks, region)? {
        Stored::Record(r) => return Ok((region.clone(), r)),
        Stored::Forward(f) => f,
    };
    // The reservation, when it is this one, says more than the forward: which of its log
    // copies lacks records, if one does.
    let to = match desc.slot_move(region.slot) {
        Some(m) if m.same_place(&forward.target(region)) => m.clone(),
        _ => forward.target(region),
    };
    let damaged = |why: String| {
        FsError::Corrupt(format!(
            "owner slot {} of {}: its region on {} forwards to {} at byte {}, {why}; run \
             tessera fsck {}",
            region.slot,
            desc.name,
            disks.name(region.disk),
            disks.name(to.disk),
            to.offset,
            desc.name
        ))
    };
    if desc
        .slot_move(region.slot)
        .is_some_and(|m| !m.same_place(&to))
    {
        return Err(damaged(
            "which is not the move the descriptor reserves".into(),
        ));
    }
    match read_newest(desc, disks, &to)? {
        Stored::Record(r) => Ok((to, r)),
        Stored::Forward(_) => Err(damaged("which forwards again".into())),
    }
}

/// What a record half holds.
enum Stored {
    Record(SlotRecord),
    Forward(crate::slot_move::SlotForward),
}

impl Stored {
    fn generation(&self) -> u64 {
        match self {
            Stored::Record(r) => r.generation,
            Stored::Forward(f) => f.generation,
        }
    }
}

/// The newest of what `region`'s halves hold: both halves of every copy whose disk is up
/// are read and the highest generation that verifies wins. A copy the descriptor calls
/// behind is not read: its records, as its log, may lack what the other copy holds. An
/// error names every damaged half when none verifies.
fn read_newest(desc: &FsDescriptor, disks: &DiskSet, region: &SlotRegion) -> FsResult<Stored> {
    let mut best: Option<Stored> = None;
    let mut problems = Vec::new();
    let behind = region.second.and_then(|s| s.log_behind);
    let copies = region.copies();
    if let Some(b) = behind {
        if disks.is_down(copies[1 - b as usize].0) {
            let pair = [copies[0], copies[1]];
            return Err(crate::mirrored_log::no_current_copy(
                &format!("log of owner slot {} of {}", region.slot, desc.name),
                &desc.name,
                disks,
                &pair,
                behind,
            ));
        }
    }
    for (c, (disk, offset)) in copies.into_iter().enumerate() {
        if disks.is_down(disk) {
            problems.push(format!("{} is down", disks.name(disk)));
            continue;
        }
        if behind == Some(c as u8) {
            problems.push(format!(
                "the copy on {} lacks records the other holds",
                disks.name(disk)
            ));
            continue;
        }
        let dev = disks.get(disk);
        for half in 0..2u64 {
            let mut buf = AlignedBuf::zeroed(region.record_bytes as usize);
            let at = offset + half * u64::from(region.record_bytes);
            let name = || format!("{} record {}", dev.name(), b"AB"[half as usize] as char);
            if let Err(e) = dev.read_at(&mut buf, at) {
                problems.push(format!("{}: {e}", name()));
                continue;
            }
            let decoded = if buf[0..8] == crate::slot_move::FORWARD_MAGIC {
                crate::slot_move::SlotForward::decode(&buf, &desc.fs_uuid, region.slot)
                    .map(|f| Some(Stored::Forward(f)))
            } else {
                SlotRecord::decode(&buf, &desc.fs_uuid, region.slot).map(|r| r.map(Stored::Record))
            };
            match decoded {
                Ok(Some(r)) if r.generation() % 2 != half => problems.push(format!(
                    "{}: generation {} in the wrong half",
                    name(),
                    r.generation()
                )),
                Ok(Some(r)) => {
                    if best
                        .as_ref()
                        .is_none_or(|b| r.generation() > b.generation())
                    {
                        best = Some(r);
                    }
                }
                Ok(None) => {}
                Err(why) => problems.push(format!("{}: {why}", name())),
            }
        }
    }
    best.ok_or_else(|| {
        FsError::Corrupt(format!(
            "owner slot {} of {} has no readable record ({}); run tessera fsck {}",
            region.slot,
            desc.name,
            if problems.is_empty() {
                "both halves are empty".to_string()
            } else {
                problems.join("; ")
            },
            desc.name
        ))
    })
}

/// Formats the region's log (every copy) and writes its first record, so that the region is
/// complete before any descriptor names it.
pub(crate) fn initialise(
    desc: &FsDescriptor,
    disks: &Arc<DiskSet>,
    region: &SlotRegion,
) -> FsResult<()> {
    // With two copies, through the pair as one device: both headers name the first copy's
    // region, as the log's owner opens it (`MirroredLog::for_slot`).
    match region.second {
        Some(_) => {
            let log = crate::mirrored_log::MirroredLog::for_slot(desc, disks, region)?;
            tessera_journal::format(log.as_ref(), region.log_region(), region.log_id)?;
        }
        None => tessera_journal::format(
            disks.get(region.disk).as_ref(),
            region.log_region(),
            region.log_id,
        )?,
    }
    // Both halves: a stale record of an earlier use of these blocks must never verify. It
    // cannot (another uuid or slot is refused by the crc'd fields), but zeroes make a torn
    // first record read as "never written", not as damage.
    let zero = AlignedBuf::zeroed(region.record_bytes as usize);
    for (disk, offset) in region.copies() {
        disks
            .get(disk)
            .write_at(&zero, offset + u64::from(region.record_bytes))?;
    }
    // Every copy, or no slot: a copy without its first record would be behind before the
    // descriptor names the region.
    let missed = write_record_copies(desc, disks, region, &SlotRecord::empty(region.slot))?;
    if let Some((c, why)) = missed.first() {
        return Err(FsError::Io(std::io::Error::other(format!(
            "owner slot {} of {}: copy {} of its region: {why}",
            region.slot,
            desc.name,
            c + 1
        ))));
    }
    Ok(())
}

impl crate::fs::FileSystem {
    /// Makes the next owner slot: places its region (a second copy apart with `-m 2`),
    /// formats its log, writes its empty record and commits the descriptor that lists it,
    /// in one checkpoint. Returns the slot's number. A crash before that checkpoint leaves
    /// the blocks free (the allocation map that holds them is stored by the same checkpoint)
    /// and no slot.
    pub fn create_slot(&self) -> FsResult<u32> {
        self.owner_here("making an owner slot")?;
        self.manager_here("making an owner slot")?;
        let mut m = self.owner().meta.lock();
        let _one = self.owner().checkpoint_lock.lock();
        let desc = self.owner().desc.lock().clone();
        let slot = desc
            .slot_regions()
            .iter()
            .map(|s| s.slot)
            .max()
            .unwrap_or(0)
            + 1;
        let record = record_bytes(desc.shard_count, region_count(&desc));
        let bytes = 2 * u64::from(record) + desc.log.region.bytes;
        let region = self.place_slot_region(&mut m, &desc, slot, bytes, record, &|_| true)?;
        let extents = region.extents(&desc);
        if let Err(e) = initialise(&desc, &self.devices, &region) {
            for x in extents {
                m.alloc.free(x).expect("just allocated");
            }
            return Err(e);
        }
        let mut next = desc;
        next.slots
            .get_or_insert_with(Slots::default)
            .regions
            .push(region);
        self.commit_next_descriptor(
            &mut m,
            next,
            &format!("making owner slot {slot}"),
            "unmount and mount the file system again; the slot exists if the mount lists it",
        )
        .map(|()| slot)
    }

    /// Gives shards that hold no inode to owner slot `slot` (the file system manager's side
    /// of a hand-over, for empty shards: nothing of them is cached or open anywhere, so no
    /// token needs taking back). In one critical section under the metadata lock: the
    /// descriptor with the owner map giving them to the slot at the next generation is
    /// committed by a checkpoint, whose roots of those shards are their *hand-over roots*;
    /// then this owner forgets them. The slot's record is the slot owner's alone to write:
    /// until it names a shard at the map's generation, the shard's live root is the
    /// hand-over root ([`foreign_roots`]), so a live owner of the slot takes it from the
    /// descriptor, and a crash before the descriptor leaves the shards slot 0's.
    pub fn give_empty_shards(&self, slot: u32, shards: &[usize]) -> FsResult<()> {
        self.owner_here("giving shards to an owner slot")?;
        self.manager_here("giving shards to an owner slot")?;
        let mut m = self.owner().meta.lock();
        let _one = self.owner().checkpoint_lock.lock();
        self.give_shards_locked(&mut m, slot, shards, &[])
    }

    /// [`Self::give_empty_shards`] under the metadata and checkpoint locks; the shards may
    /// hold the inodes `made`, which the caller made in this critical section (nobody has
    /// seen them, so no token is to be taken back).
    fn give_shards_locked(
        &self,
        m: &mut crate::fs::Meta,
        slot: u32,
        shards: &[usize],
        made: &[crate::inode::Ino],
    ) -> FsResult<()> {
        let desc = self.owner().desc.lock().clone();
        slot_region(&desc, slot)?;
        let n = u64::from(desc.shard_count);
        for &s in shards {
            if s >= desc.shard_count as usize || !m.state.holds(s) {
                return Err(FsError::Usage(format!(
                    "shard {s} of {} is not held by the file system manager",
                    desc.name
                )));
            }
            let new_here = made.iter().filter(|i| *i % n == s as u64).count() as u64;
            if m.state.shard_inode_count(s) != new_here {
                return Err(FsError::Usage(format!(
                    "shard {s} of {} holds {} inode(s); only empty shards are handed over yet",
                    desc.name,
                    m.state.shard_inode_count(s) - new_here
                )));
            }
        }
        if m.state.held_shards().len() <= shards.len() {
            return Err(FsError::Usage(
                "the file system manager keeps at least one shard".into(),
            ));
        }
        let mut next = desc.clone();
        let map = next.slots.get_or_insert_with(Slots::default);
        let count = desc.shard_count as usize;
        if map.shard_owners.len() < count {
            map.shard_owners.resize(count, ShardOwner::default());
        }
        for &s in shards {
            let owner = &mut map.shard_owners[s];
            *owner = ShardOwner {
                slot,
                generation: owner.generation + 1,
            };
        }
        self.commit_next_descriptor(
            m,
            next,
            &format!("giving shards {shards:?} to owner slot {slot}"),
            "unmount and mount the file system again; the owner map says who holds them",
        )?;
        for &s in shards {
            m.state.release_shard(s);
        }
        self.learn_owner_map(&self.owner().desc.lock());
        tracing::info!(
            "{}: shards {shards:?} given to owner slot {slot}",
            desc.name
        );
        Ok(())
    }

    /// A slot for a node that mounts beside the file system manager and owns what it makes
    /// (`metadataSlots=yes`): a new owner slot given the highest-numbered allocation region
    /// in which nothing is allocated, so that it can allocate its pages and blocks; its
    /// shards come with the directories made for it. Refused, with nothing made, when no
    /// region is wholly free (or only the manager's last one is).
    pub fn provide_slot(&self) -> FsResult<u32> {
        self.owner_here("making an owner slot")?;
        self.manager_here("making an owner slot")?;
        let _one = self.owner().providing.lock();
        let name = &self.geo.fs_name;
        let region = match self.region_to_give() {
            Ok((region, true)) => region,
            // A slot whose only region is a disk's last sliver would get ENOSPC after a few
            // megabytes on a file system with no other region to give; as a client of the
            // manager the node allocates from the manager's space.
            Ok((region, false)) => {
                return Err(FsError::Usage(format!(
                    "{name}: the only wholly free allocation region ({region}) is the end of \
                     the disks, less than a quarter of a region; this node mounts it as a \
                     client of the manager instead"
                )))
            }
            Err(count) => {
                return Err(FsError::Usage(format!(
                    "{name} has no wholly free allocation region to give an owner slot (of \
                     its {count} regions, each 32,512 sub-blocks of every disk, the manager \
                     keeps one and data is spread over the others); this node mounts it as a \
                     client of the manager instead"
                )))
            }
        };
        let slot = self.create_slot()?;
        self.give_free_regions(slot, &[region])?;
        Ok(slot)
    }

    /// Another allocation region for owner slot `slot`, whose regions are full (the
    /// manager's side of `allocate_in_another_region`): the largest the manager holds wholly
    /// free, given as `provide_slot` gives a new slot its first. Refused by name when
    /// none is wholly free (the slot's writers then get ENOSPC).
    pub fn provide_region(&self, slot: u32) -> FsResult<usize> {
        self.owner_here("giving an allocation region to an owner slot")?;
        self.manager_here("giving an allocation region to an owner slot")?;
        let _one = self.owner().providing.lock();
        let given = match self.region_to_give() {
            Ok(given) => Ok(given),
            // Another slot may have emptied regions it no longer needs.
            Err(_) => {
                self.take_region_back(Some(slot))?;
                self.region_to_give()
            }
        };
        let (region, _) = given.map_err(|count| {
            tracing::warn!(
                "{}: owner slot {slot} asked for another allocation region; none of the \
                 manager's {count} is wholly free and no other slot gave one back",
                self.geo.fs_name
            );
            FsError::NoSpace {
                pool: "system".into(),
                what: "another allocation region for an owner slot (every region the file \
                       system manager holds has data in it, and no other slot holds a second \
                       region with nothing in it)",
            }
        })?;
        self.give_free_regions(slot, &[region])?;
        tracing::info!(
            "{}: allocation region {region} given to owner slot {slot}, whose regions were \
             full",
            self.geo.fs_name
        );
        Ok(region)
    }

    /// The allocation region the manager gives next: the largest in which nothing is
    /// allocated (a disk's last region may be a sliver), the highest of those, never
    /// region 0; with whether it holds at least a quarter of a whole region. `Err` is the
    /// region count when there is none.
    fn region_to_give(&self) -> Result<(usize, bool), usize> {
        let m = self.owner().meta.lock();
        let desc = self.owner().desc.lock().clone();
        let foreign = foreign_regions(&desc);
        let count = region_count(&desc) as usize;
        let disks: Vec<DiskIndex> = m.alloc.disks().iter().map(|d| d.disk).collect();
        let free = |r: usize| {
            !foreign.contains(&r)
                && disks.iter().all(|&d| {
                    r >= m.alloc.chunk_count(d) || m.alloc.chunk_words(d, r).iter().all(|w| *w == 0)
                })
        };
        let size = |r: usize| -> u64 {
            let per = (tessera_alloc::MAP_CHUNK_WORDS * 64) as u64;
            let spb = u64::from(desc.sub_blocks_per_block());
            desc.disks
                .iter()
                .map(|d| (d.blocks * spb).saturating_sub(r as u64 * per).min(per))
                .sum()
        };
        (1..count)
            .filter(|r| free(*r))
            .max_by_key(|r| (size(*r), *r))
            .map(|r| (r, size(r) * 4 >= size(0)))
            .ok_or(count)
    }

    /// On the owner of a slot other than 0 whose regions are full (`allocate` failed with
    /// `full`): asks the file system manager for another region, takes it
    /// (`take_from_owner_map`) and allocates there, so that a node writing more than its
    /// regions hold goes on, as a GPFS node asks the allocation manager for another
    /// region. Writers that found the regions full together ask once: each allocates
    /// again under `providing` first, and one that waited while another asked finds the
    /// new region's space. `full` is the answer on the manager's mount, on a slot with no
    /// way to the manager, and when the manager has no region to give (which it logs).
    pub(crate) fn allocate_in_another_region(
        &self,
        full: FsError,
        allocate: &dyn Fn() -> FsResult<Extent>,
    ) -> FsResult<Extent> {
        let slot = self.owner_slot();
        if slot == 0 {
            // The manager's own regions are full: a slot may hold regions it emptied.
            let _one = self.owner().providing.lock();
            match allocate() {
                Err(FsError::NoSpace { .. }) => {}
                done => return done,
            }
            return match self.take_region_back(None)? {
                Some(_) => allocate(),
                None => Err(full),
            };
        }
        let Some(remote) = self.remote.get() else {
            return Err(full);
        };
        let _one = self.owner().providing.lock();
        match allocate() {
            Err(FsError::NoSpace { .. }) => {}
            done => return done,
        }
        match remote.ask_for_region(slot) {
            Ok(region) => {
                // The manager gives only regions it holds: one this slot gave back came
                // to it, and is given here anew.
                self.slot_state()
                    .given_back
                    .lock()
                    .retain(|r| *r as usize != region);
                let (_, taken) = self.take_from_owner_map()?;
                if !taken.contains(&region) {
                    return Err(FsError::Corrupt(format!(
                        "the file system manager gave owner slot {slot} allocation region \
                         {region}, which its committed owner map does not give it"
                    )));
                }
                allocate()
            }
            Err(e @ FsError::NoSpace { .. }) => {
                tracing::warn!(
                    "{}: owner slot {slot}: its allocation regions are full and the manager \
                     gives no other: {e}",
                    self.geo.fs_name
                );
                Err(full)
            }
            Err(e) => Err(e),
        }
    }

    /// On the file system manager, whose own regions are full or which has no wholly free
    /// region for a full slot: asks the owners of the other slots that hold more than one
    /// region (not `except`, the slot asking for one), most regions first, for a region
    /// they no longer use ([`Self::give_region_back`] there), and takes the first given
    /// back. `None` when no slot gives one (each slot's regions have data in them, or no
    /// way to a slot's owner answers). Regions come back only wholly free, so no block of
    /// a slot's files ever lies in a region another owner allocates in.
    pub fn take_region_back(&self, except: Option<u32>) -> FsResult<Option<usize>> {
        self.manager_here("taking an allocation region back from an owner slot")?;
        let recently = self
            .owner()
            .found_no_region
            .lock()
            .is_some_and(|at| at.elapsed() < ASK_FOR_REGIONS_AGAIN);
        if recently {
            return Ok(None);
        }
        let desc = self.owner().desc.lock().clone();
        let mut held: std::collections::BTreeMap<u32, usize> = Default::default();
        for r in 0..region_count(&desc) as usize {
            *held.entry(region_owner(&desc, r)).or_default() += 1;
        }
        let mut asked: Vec<(u32, usize)> = held
            .into_iter()
            .filter(|&(s, n)| s != 0 && Some(s) != except && n >= 2)
            .collect();
        asked.sort_by_key(|&(s, n)| (std::cmp::Reverse(n), s));
        // A region a slot gave back whose move was never committed (this manager, or the
        // one before it, died in between): completed first, with nothing to ask.
        for region in desc.slot_regions() {
            let given = read_record(&desc, &self.devices, region).map(|r| r.given_back);
            let Some(&r) = given
                .iter()
                .flatten()
                .find(|&&r| region_owner(&desc, r as usize) == region.slot)
            else {
                continue;
            };
            self.region_given_back(region.slot, r as usize)?;
            return Ok(Some(r as usize));
        }
        for (slot, _) in asked {
            let Some(remote) = self.slot_route(slot) else {
                continue;
            };
            match remote.ask_to_give_region_back() {
                Ok(region) => match self.region_given_back(slot, region) {
                    Ok(()) => return Ok(Some(region)),
                    Err(e @ FsError::Invalid(_)) => tracing::error!("{}: {e}", self.geo.fs_name),
                    Err(e) => return Err(e),
                },
                Err(FsError::NoSpace { .. }) => {}
                Err(e) => tracing::warn!(
                    "{}: owner slot {slot} was asked for an allocation region back and did \
                     not answer: {e}",
                    self.geo.fs_name
                ),
            }
        }
        *self.owner().found_no_region.lock() = Some(std::time::Instant::now());
        Ok(None)
    }

    /// The manager's side of a region owner slot `slot` gave back: checks that the slot's
    /// committed record names it given back (the slot answers only after that checkpoint),
    /// holds it free and commits the owner map giving it to slot 0 by a checkpoint that
    /// stores its chunks, numbered above every copy the slot wrote (a copy of the same
    /// generation in the other chunk slot would make the map unreadable).
    fn region_given_back(&self, slot: u32, region: usize) -> FsResult<()> {
        let mut m = self.owner().meta.lock();
        let _one = self.owner().checkpoint_lock.lock();
        let desc = self.owner().desc.lock().clone();
        let name = &desc.name;
        let holder = region_owner(&desc, region);
        if holder != slot || region >= region_count(&desc) as usize {
            return Err(FsError::Invalid(format!(
                "owner slot {slot} gave back allocation region {region} of {name}, which the \
                 owner map gives to slot {holder}"
            )));
        }
        let record = read_record(&desc, &self.devices, &slot_region(&desc, slot)?)?;
        if !record.given_back.contains(&(region as u32)) {
            return Err(FsError::Invalid(format!(
                "owner slot {slot} gave back allocation region {region} of {name}, which its \
                 committed record does not name as given back; the region stays the slot's"
            )));
        }
        m.state
            .store_mut()
            .advance_generation(record.page_generation + 1);
        free_regions(&mut m.alloc, &[region]);
        self.owner().map_slots.lock().forget_region(region);
        let mut next = desc.clone();
        let map = next.slots.get_or_insert_with(Slots::default);
        map.region_owners[region] = 0;
        let committed = self.commit_next_descriptor(
            &mut m,
            next,
            &format!("taking allocation region {region} back from owner slot {slot}"),
            "nothing to do: the slot's record names the region given back, and the manager \
             completes the move the next time it needs a region",
        );
        if let Err(e) = committed {
            hold_regions(&mut m.alloc, &[region]);
            return Err(e);
        }
        tracing::info!(
            "{name}: allocation region {region} taken back from owner slot {slot}, which had \
             nothing in it"
        );
        Ok(())
    }

    /// On the owner of a slot other than 0, asked by the file system manager
    /// (`MetanodeRequest::GiveRegionBack`): gives back the largest of this slot's
    /// allocation regions in which nothing is allocated, given out ahead or waiting for a
    /// free to commit (all of these hold space in the map in memory), keeping at least
    /// one other region with room. The largest, since the manager asks because it needs
    /// space; the slot asks again when it does. The region leaves this slot's view of the
    /// owner map at once, so nothing is allocated in it from then on, and a checkpoint
    /// commits a record that names it given back (and no longer stores it) before the
    /// answer: the manager writes the region's chunks from then on, over copies no
    /// record of this slot counts. Until the manager commits the owner map, the slot
    /// keeps the region out of its view across remounts (taking it again could race that
    /// commit); a manager that died in between completes the move the next time it needs
    /// a region (`take_region_back`).
    pub fn give_region_back(&self) -> FsResult<usize> {
        self.owner_here("giving an allocation region back")?;
        let me = self.owner_slot();
        if me == 0 {
            return Err(FsError::Usage(
                "the file system manager (slot 0) takes allocation regions back; it gives none"
                    .into(),
            ));
        }
        let mut m = self.owner().meta.lock();
        let _one = self.owner().checkpoint_lock.lock();
        // Pages the last checkpoint superseded hold space until the next one begins.
        self.apply_deferred_frees(&mut m);
        let desc = self.owner().desc.lock().clone();
        let space: Vec<(usize, u64, u64)> = regions_of(&desc, me)
            .into_iter()
            .map(|r| {
                let (total, used) = region_space(&m.alloc, r);
                (r, total, used)
            })
            .collect();
        let region = space
            .iter()
            .filter(|&&(r, total, used)| {
                total > 0
                    && used == 0
                    && space.iter().any(|&(o, total, used)| o != r && used < total)
            })
            .max_by_key(|&&(r, total, _)| (total, r))
            .map(|&(r, ..)| r)
            .ok_or(FsError::NoSpace {
                pool: "system".into(),
                what: "an allocation region to give back (every region of this owner slot \
                       has data in it, or is its only one with room)",
            })?;
        hold_regions(&mut m.alloc, &[region]);
        self.owner().map_slots.lock().forget_region(region);
        let given_back = {
            let mut given_back = self.slot_state().given_back.lock();
            given_back.push(region as u32);
            given_back.sort_unstable();
            given_back.clone()
        };
        let seen = without_given_back(&desc, me, &given_back);
        *self.owner().desc.lock() = seen;
        self.checkpoint_under_lock(&mut m)?;
        tracing::info!(
            "{}: owner slot {me} gave allocation region {region} back to the file system \
             manager",
            self.geo.fs_name
        );
        Ok(region)
    }

    /// Makes directory `name` in `parent` for owner slot `slot`, so that it and everything
    /// made in it later are the slot's (mdtest's easy pattern: each process's directory is
    /// one node's work): its inode goes to a shard slot 0 holds that has no inode, given to
    /// the slot in the same critical section, under the metadata lock, so nobody sees the
    /// directory before it is the slot's. Committed by the checkpoint that gives the shard:
    /// a crash before it leaves the directory slot 0's (the log holds it) or absent.
    pub fn make_directory_for_slot(
        &self,
        parent: crate::inode::Ino,
        name: &[u8],
        mode: u32,
        caller: crate::namespace::Caller,
        slot: u32,
    ) -> FsResult<crate::inode::Attr> {
        let node = crate::metanode::NewNode {
            open: false,
            kind: crate::inode::FileKind::Directory,
            mode,
            umask: 0,
            rdev: 0,
            caller,
            symlink_target: None,
            for_slot: Some(slot),
            keep_data: None,
        };
        self.make_directory_for_slot_node(parent, name, node, slot)
    }

    /// [`Self::make_directory_for_slot`] for a create request (mode, umask and caller as
    /// the client sent them).
    pub(crate) fn make_directory_for_slot_node(
        &self,
        parent: crate::inode::Ino,
        name: &[u8],
        node: crate::metanode::NewNode,
        slot: u32,
    ) -> FsResult<crate::inode::Attr> {
        self.owner_here("making a directory for an owner slot")?;
        self.manager_here("making a directory for an owner slot")?;
        let mut m = self.owner().meta.lock();
        slot_region(&self.owner().desc.lock(), slot)?;
        let shard = m
            .state
            .held_shards()
            .into_iter()
            .rev()
            .find(|s| m.state.shard_inode_count(*s) == 0)
            .ok_or_else(|| FsError::NoSpace {
                pool: "system".into(),
                what: "an empty inode shard to give an owner slot (every shard the file \
                           system manager holds has inodes)",
            })?;
        let attr = self.make_locked(&mut m, parent, name, node, Some(shard))?;
        // After the make: a full log checkpoints from inside it, under the checkpoint lock.
        let _one = self.owner().checkpoint_lock.lock();
        self.give_shards_locked(&mut m, slot, &[shard], &[attr.ino])?;
        Ok(attr)
    }

    /// Takes what the owner map gives this mount's slot since it last looked (the owner
    /// of a slot other than 0): reads the newest descriptor, opens every shard given to the
    /// slot at a newer generation from its hand-over root, takes every allocation
    /// region given to it as free (stored from its next checkpoint on, numbered above the
    /// descriptor's generation), and gives its allocator the disks added since, with the
    /// slot's chunks of them free (`crate::disks`), every disk's status, the placement
    /// policy and the replication of new files. Returns the shards and regions taken.
    pub fn take_from_owner_map(&self) -> FsResult<(Vec<usize>, Vec<usize>)> {
        self.owner_here("taking shards from the owner map")?;
        let me = self.owner_slot();
        if me == 0 {
            return Err(FsError::Usage(
                "the file system manager (slot 0) gives shards; it does not take them".into(),
            ));
        }
        // Devices first, holding no lock: opening one may take a while.
        let (_, newest) = self.learn_added_devices()?;
        self.take_from_descriptor(newest)
    }

    /// [`FileSystem::take_from_owner_map`] from `newest`, the descriptor just read, once
    /// the devices of the disks it names are open.
    pub(crate) fn take_from_descriptor(
        &self,
        newest: FsDescriptor,
    ) -> FsResult<(Vec<usize>, Vec<usize>)> {
        let me = self.owner_slot();
        let mut m = self.owner().meta.lock();
        let _one = self.owner().checkpoint_lock.lock();
        let old = self.owner().desc.lock().clone();
        if newest.generation <= old.generation {
            return Ok((Vec::new(), Vec::new()));
        }
        let slot = self.slot_state();
        let record = slot.record.lock().clone();
        let mut taken = Vec::new();
        for s in 0..newest.shard_count as usize {
            let owner = newest.shard_owner(s);
            if owner.slot == me && !m.state.holds(s) {
                let root = live_root(&newest, &record, s, owner.generation)
                    .map_err(|why| FsError::Corrupt(format!("owner slot {me}: {why}")))?;
                taken.push((s, root));
            } else if owner.slot != me && m.state.holds(s) {
                return Err(FsError::NotSupported(format!(
                    "the owner map gives shard {s}, held by owner slot {me}, to slot {}: \
                     taking shards back from a live slot is not built yet",
                    owner.slot
                )));
            }
        }
        // All of them at once: a takeover waits for their pages together, not one shard
        // after another.
        m.state.take_shards(&taken)?;
        let shards: Vec<usize> = taken.iter().map(|(s, _)| *s).collect();
        // A region given back stays given back until the owner map no longer gives it
        // here (the manager committed its move): taking it again could race that commit.
        let newest = {
            let mut given_back = slot.given_back.lock();
            given_back.retain(|r| region_owner(&newest, *r as usize) == me);
            without_given_back(&newest, me, &given_back)
        };
        let had = regions_of(&old, me);
        let regions: Vec<usize> = regions_of(&newest, me)
            .into_iter()
            .filter(|r| !had.contains(r))
            .collect();
        free_regions(&mut m.alloc, &regions);
        self.take_disk_changes(&mut m, &newest)?;
        // What the manager's `policy change` and `fs change -r` committed: files this slot
        // creates from now on are placed and replicated as on the manager.
        if newest.policy != old.policy {
            *self.owner().policy.write() = crate::placement::load(&newest);
        }
        if newest.replication() != old.replication() {
            *self.owner().replication.write() = newest.replication();
        }
        // What the manager's `fs change -m 2` committed: the pages this slot writes from
        // now on have two copies, and its map chunks are stored again to both region
        // copies (the second ones are new); its region gets its second copy when `restripe
        // -r` moves it (`move_slot_regions_off`).
        if newest.metadata_copies.is_some() && old.metadata_copies.is_none() {
            m.state.store_mut().mirror_from_now_on();
            m.alloc.mark_all_chunks_dirty();
        }
        m.state
            .store_mut()
            .advance_generation(newest.checkpoint.generation + 1);
        self.learn_owner_map(&newest);
        *self.owner().written_desc.lock() = newest.clone();
        *self.owner().desc.lock() = newest;
        tracing::info!(
            "{}: owner slot {me} took shards {shards:?} and allocation regions {regions:?}",
            self.geo.fs_name
        );
        Ok((shards, regions))
    }

    /// The owner of a slot other than 0, under the metadata and checkpoint locks: gives its
    /// allocator the disks `newest` (as this slot sees it) names that it lacks, with the
    /// slot's chunks of them free and the rest held as used (those chunks are stored from
    /// the next checkpoint on, whose record then counts the disks as covered), and the
    /// status of every disk (`disk change suspend|resume|empty` on the manager): only a
    /// ready disk this mount has not marked down takes new blocks.
    fn take_disk_changes(&self, m: &mut crate::fs::Meta, newest: &FsDescriptor) -> FsResult<()> {
        let me = self.owner_slot();
        // A disk let go of for a delete stays out while the delete goes on; one back in
        // service comes back as an added disk; one deleted needs no mention any more.
        let mut dropped = self.slot_state().dropped.lock();
        let still = crate::recovery::still_dropped(newest, &dropped);
        dropped.retain(|d| still.contains(d));
        drop(dropped);
        let added: Vec<&crate::descriptor::FsDisk> = newest
            .disks
            .iter()
            .filter(|d| !m.alloc.disks().iter().any(|a| a.disk == d.index))
            .filter(|d| !still.contains(&d.index))
            .collect();
        if let Some(d) = added
            .iter()
            .find(|d| usize::from(d.index) >= self.devices.len())
        {
            return Err(FsError::MissingDisk {
                fs: newest.name.clone(),
                nsd: d.nsd_name.clone(),
                reason: "added to the file system, but this node could not open it".into(),
            });
        }
        let elsewhere = regions_elsewhere(newest, me);
        let mut map_slots = self.owner().map_slots.lock();
        let mine = regions_of(newest, me);
        for d in &added {
            m.alloc.add_disk(crate::recovery::alloc_disk(d));
            hold_regions_on(&mut m.alloc, d.index, &elsewhere);
            map_slots.add_disk(d.index, m.alloc.chunk_count(d.index));
            // Stored by the next checkpoint, whose digest then counts them (a disk taken
            // again after a drop has older copies that must not be the current ones).
            let chunks = m.alloc.chunk_count(d.index);
            for &r in mine.iter().filter(|r| **r < chunks) {
                m.alloc.mark_chunk_dirty(d.index, r);
            }
        }
        if !added.is_empty() {
            let names: Vec<&str> = added.iter().map(|d| d.nsd_name.as_str()).collect();
            tracing::info!(
                "{}: owner slot {me} allocates on disks {} from now on",
                newest.name,
                names.join(", ")
            );
        }
        for d in &newest.disks {
            let takes =
                d.status == crate::descriptor::DiskStatus::Ready && !self.devices.is_down(d.index);
            let took = m
                .alloc
                .disks()
                .iter()
                .any(|a| a.disk == d.index && a.available);
            if takes != took {
                m.alloc.set_available(d.index, takes);
                tracing::info!(
                    "{}: owner slot {me}: disk {} is {}, new blocks {} on it",
                    newest.name,
                    d.nsd_name,
                    d.status.as_str(),
                    if takes { "go" } else { "no longer go" }
                );
            }
        }
        Ok(())
    }

    /// The owner of a slot other than 0, asked by the file system manager's `disk delete`
    /// once its restripe emptied `disks` ([`crate::metanode::Namespace::drop_disks`]):
    /// checks that they are to be emptied as this owner sees the descriptor, and that none
    /// of its metadata pages and nothing in its regions' chunks of them is left (once what
    /// the moves freed is durable); then takes them out of its allocator and its map's
    /// digest and writes a checkpoint whose record names them dropped, so that a descriptor
    /// without them leaves the record's digest whole. Asked again, a disk already let go of
    /// is skipped.
    pub fn let_go_of_disks(&self, disks: &[DiskIndex]) -> FsResult<()> {
        let me = self.owner_slot();
        if me == 0 {
            return Err(FsError::Usage(
                "the file system manager deletes disks itself; only other slots let go of them"
                    .into(),
            ));
        }
        self.follow_descriptor()?;
        {
            let desc = self.owner().desc.lock();
            for d in disks {
                let named = desc.disks.iter().find(|x| x.index == *d);
                if !named.is_some_and(|x| x.status == crate::descriptor::DiskStatus::ToBeEmptied) {
                    return Err(FsError::Invalid(format!(
                        "owner slot {me} does not see disk {d} of {} marked to be emptied; run \
                         the delete again",
                        desc.name
                    )));
                }
            }
        }
        // Superseded pages and moved blocks come back once a checkpoint and the log say so.
        self.checkpoint()?;
        self.sync_own()?;
        let pages = self.metadata_pages_per_disk()?;
        let mut m = self.owner().meta.lock();
        let _one = self.owner().checkpoint_lock.lock();
        let desc = self.owner().desc.lock().clone();
        let mine = regions_of(&desc, me);
        let mut left = Vec::new();
        for &d in disks {
            if !m.alloc.knows(d) {
                continue;
            }
            let n = pages.get(usize::from(d)).copied().unwrap_or(0);
            let chunks = m.alloc.chunk_count(d);
            let busy: Vec<usize> = mine
                .iter()
                .copied()
                .filter(|r| *r < chunks && m.alloc.chunk_words(d, *r).iter().any(|w| *w != 0))
                .collect();
            if n > 0 || !busy.is_empty() {
                return Err(FsError::Invalid(format!(
                    "owner slot {me} still has {n} metadata page(s) and blocks in allocation \
                     regions {busy:?} on {}; run `tessera disk delete` again",
                    self.devices.name(d)
                )));
            }
            left.push(d);
        }
        if left.is_empty() {
            return Ok(());
        }
        let slot = self.slot_state();
        let mut dropped = slot.dropped.lock().clone();
        dropped.extend(&left);
        dropped.sort_unstable();
        dropped.dedup();
        let needs = SlotRecord {
            dropped: dropped.clone(),
            ..slot.record.lock().clone()
        }
        .encoded_len();
        if needs > slot.region.lock().record_bytes as usize {
            return Err(FsError::NotSupported(format!(
                "owner slot {me}'s record has no room to name {} more dropped disk(s); delete \
                 fewer disks at once",
                left.len()
            )));
        }
        {
            let mut map_slots = self.owner().map_slots.lock();
            let elsewhere = regions_elsewhere(&desc, me);
            for &d in &left {
                release_regions_on(&mut m.alloc, d, &elsewhere);
                m.alloc.remove_disk(d);
                map_slots.remove_disk(d);
            }
        }
        *slot.dropped.lock() = dropped;
        drop(_one);
        drop(m);
        self.checkpoint()?;
        tracing::info!(
            "{}: owner slot {me} let go of disks {:?} for their deletion",
            desc.name,
            left
        );
        Ok(())
    }

    /// Gives allocation regions in which nothing is allocated to owner slot `slot` (the
    /// manager's side of step 4 for free regions, so that no block of slot 0's is ever
    /// freed in another slot's region). The descriptor with the owner map giving them is
    /// committed by a checkpoint that no longer counts their chunks in its digest; this
    /// owner holds them as used from then on and never writes them. The slot's owner takes
    /// a region the map gives it and its record does not name as wholly free (it was when
    /// given, and only that owner allocates there since), and stores its chunks from its
    /// next checkpoint on, with a page generation above the descriptor's.
    pub fn give_free_regions(&self, slot: u32, regions: &[usize]) -> FsResult<()> {
        self.owner_here("giving allocation regions to an owner slot")?;
        self.manager_here("giving allocation regions to an owner slot")?;
        let mut m = self.owner().meta.lock();
        let _one = self.owner().checkpoint_lock.lock();
        let desc = self.owner().desc.lock().clone();
        slot_region(&desc, slot)?;
        if desc.alloc_map.is_none() {
            return Err(FsError::Usage(format!(
                "{} does not store its allocation map yet (format version 3); mount it once \
                 so that it is converted",
                desc.name
            )));
        }
        let count = region_count(&desc) as usize;
        let foreign = foreign_regions(&desc);
        for &r in regions {
            if r >= count || foreign.contains(&r) {
                return Err(FsError::Usage(format!(
                    "allocation region {r} of {} is not the file system manager's (it has \
                     {count} regions)",
                    desc.name
                )));
            }
            let disks: Vec<DiskIndex> = m.alloc.disks().iter().map(|d| d.disk).collect();
            for d in disks {
                if r < m.alloc.chunk_count(d) && m.alloc.chunk_words(d, r).iter().any(|w| *w != 0) {
                    return Err(FsError::Usage(format!(
                        "allocation region {r} of {} holds blocks in use on {}; only free \
                         regions are given yet",
                        desc.name,
                        self.devices.name(d)
                    )));
                }
            }
        }
        if foreign.len() + regions.len() >= count {
            return Err(FsError::Usage(
                "the file system manager keeps at least one allocation region".into(),
            ));
        }
        let mut next = desc.clone();
        let map = next.slots.get_or_insert_with(Slots::default);
        if map.region_owners.len() < count {
            map.region_owners.resize(count, 0);
        }
        for &r in regions {
            map.region_owners[r] = slot;
        }
        {
            let mut slots = self.owner().map_slots.lock();
            for &r in regions {
                slots.forget_region(r);
            }
        }
        hold_regions(&mut m.alloc, regions);
        self.commit_next_descriptor(
            &mut m,
            next,
            &format!("giving allocation regions {regions:?} to owner slot {slot}"),
            "unmount and mount the file system again; the owner map says who holds them",
        )?;
        tracing::info!(
            "{}: allocation regions {regions:?} given to owner slot {slot}",
            desc.name
        );
        Ok(())
    }

    /// The owner slots the descriptor lists, each with its newest record (or why none reads).
    pub fn slots(&self) -> FsResult<Vec<(SlotRegion, FsResult<SlotRecord>)>> {
        self.owner_here("listing owner slots")?;
        let desc = self.owner().desc.lock().clone();
        Ok(desc
            .slot_regions()
            .iter()
            .map(|r| (r.clone(), read_record(&desc, &self.devices, r)))
            .collect())
    }

    /// Blocks for a region of `slot` of at least `bytes` (records of `record` bytes), on
    /// metadata disks that are up and that `stays` accepts; the second copy apart with
    /// `-m 2`. Nothing stays allocated on failure.
    pub(crate) fn place_slot_region(
        &self,
        m: &mut crate::fs::Meta,
        desc: &FsDescriptor,
        slot: u32,
        bytes: u64,
        record: u32,
        stays: &dyn Fn(DiskIndex) -> bool,
    ) -> FsResult<SlotRegion> {
        let bs = u64::from(desc.block_size);
        let bytes = bytes.div_ceil(bs) * bs;
        let up = |d: DiskIndex| !self.devices.is_down(d) && stays(d);
        let no_room = |_| FsError::NoSpace {
            pool: "system".into(),
            what: "an owner slot (contiguous blocks of a ready metadata disk)",
        };
        let (start, blocks) = m
            .alloc
            .alloc_contiguous_blocks_on(0, tessera_alloc::AllocKind::Metadata, bytes / bs, &up)
            .map_err(no_room)?;
        let mut region = SlotRegion {
            slot,
            disk: start.disk,
            offset: desc.sub_block_offset(start.sub_block),
            bytes: blocks * bs,
            record_bytes: record,
            log_id: rand::random(),
            second: None,
        };
        if desc.metadata_copies.is_some() {
            let placed = crate::alloc_map::alloc_apart(
                desc,
                &self.devices,
                &mut m.alloc,
                blocks,
                Some(self.devices.failure_group(start.disk)),
                &up,
                &|| format!("owner slot {slot}"),
            );
            match placed {
                Ok((second, _)) => {
                    region.second = Some(SlotSecondCopy {
                        disk: second.disk,
                        offset: desc.sub_block_offset(second.sub_block),
                        log_behind: None,
                    });
                }
                Err(e) => {
                    for x in region.extents(desc) {
                        m.alloc.free(x).expect("just allocated");
                    }
                    return Err(no_room(e));
                }
            }
        }
        Ok(region)
    }
}

/// The live root of `shard`, which the owner map gives to a slot other than 0 at
/// `generation`: the slot's record entry when it names the shard at that generation (the
/// slot's owner checkpointed it since taking it), else its hand-over root, the root slot 0's
/// descriptor kept for it when giving it (see
/// [`give_empty_shards`](crate::fs::FileSystem::give_empty_shards)). `None`
/// when neither exists, with why.
pub(crate) fn live_root(
    desc: &FsDescriptor,
    record: &SlotRecord,
    shard: usize,
    generation: u64,
) -> Result<tessera_meta::PagePtr, String> {
    if let Some(e) = record
        .shards
        .iter()
        .find(|e| e.shard as usize == shard && e.generation == generation)
    {
        let mut ptr = e.root.ptr();
        ptr.mirror = e.second.map(tessera_meta::PageAddr);
        return Ok(ptr);
    }
    match desc.root_ptrs().get(shard) {
        Some(ptr) if ptr.addr.0 != 0 => Ok(*ptr),
        _ => Err(format!(
            "shard {shard}: owner slot {}'s record does not hold it at the owner map's \
             generation {generation}, and its hand-over root is gone",
            record.slot
        )),
    }
}

/// Every record of the slot that verifies: both halves of every copy whose disk is up.
fn readable_records(desc: &FsDescriptor, disks: &DiskSet, region: &SlotRegion) -> Vec<SlotRecord> {
    let mut out = Vec::new();
    for (disk, offset) in region.copies() {
        if disks.is_down(disk) {
            continue;
        }
        for half in 0..2u64 {
            let mut buf = AlignedBuf::zeroed(region.record_bytes as usize);
            let at = offset + half * u64::from(region.record_bytes);
            if disks.get(disk).read_at(&mut buf, at).is_err() {
                continue;
            }
            if let Ok(Some(r)) = SlotRecord::decode(&buf, &desc.fs_uuid, region.slot) {
                if r.generation % 2 == half {
                    out.push(r);
                }
            }
        }
    }
    out
}

/// The shards given to other slots whose hand-over roots (kept in slot 0's descriptor, in
/// slot 0's allocation regions) no reader can fall back to any more: every record of the
/// owning slot that verifies, in both halves and every copy, names the shard at the owner
/// map's generation with a root of its own. Their pages are slot 0's to free, which its
/// next checkpoint does (the descriptor then keeps no root for them).
pub(crate) fn released_hand_over_roots(desc: &FsDescriptor, disks: &DiskSet) -> Vec<usize> {
    let roots = desc.root_ptrs();
    let mut records: std::collections::HashMap<u32, Vec<SlotRecord>> =
        std::collections::HashMap::new();
    let mut out = Vec::new();
    for shard in 0..desc.shard_count as usize {
        let owner = desc.shard_owner(shard);
        let Some(handed) = roots.get(shard).filter(|r| r.addr.0 != 0) else {
            continue;
        };
        if owner.slot == 0 {
            continue;
        }
        let found = records.entry(owner.slot).or_insert_with(|| {
            desc.slot_regions()
                .iter()
                .find(|r| r.slot == owner.slot)
                .map(|region| readable_records(desc, disks, region))
                .unwrap_or_default()
        });
        let own_root = |r: &SlotRecord| {
            r.shards.iter().any(|e| {
                e.shard as usize == shard
                    && e.generation == owner.generation
                    && e.root.addr != handed.addr.0
            })
        };
        if !found.is_empty() && found.iter().all(own_root) {
            out.push(shard);
        }
    }
    out
}

/// The shards the owner map gives to slots other than 0, each with its live root
/// ([`live_root`]; `None` when the slot's record does not read or the root is lost), and
/// why each of those `None`s is.
pub(crate) fn foreign_roots(
    desc: &FsDescriptor,
    disks: &DiskSet,
) -> (Vec<(usize, Option<tessera_meta::PagePtr>)>, Vec<String>) {
    let mut records: std::collections::HashMap<u32, Result<SlotRecord, String>> =
        std::collections::HashMap::new();
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for shard in 0..desc.shard_count as usize {
        let owner = desc.shard_owner(shard);
        if owner.slot == 0 {
            continue;
        }
        let record = records.entry(owner.slot).or_insert_with(|| {
            match desc.slot_regions().iter().find(|r| r.slot == owner.slot) {
                Some(region) => read_record(desc, disks, region).map_err(|e| e.to_string()),
                None => Err(format!(
                    "the owner map names owner slot {}, which the descriptor does not list",
                    owner.slot
                )),
            }
        });
        let root = match record {
            Ok(r) => live_root(desc, r, shard, owner.generation)
                .map_err(|why| problems.push(why))
                .ok(),
            Err(why) => {
                problems.push(format!("shard {shard}: {why}"));
                None
            }
        };
        out.push((shard, root));
    }
    (out, problems)
}

/// The region of owner slot `slot`, or an error saying the file system has none such.
fn slot_region(desc: &FsDescriptor, slot: u32) -> FsResult<SlotRegion> {
    desc.slot_regions()
        .iter()
        .find(|r| r.slot == slot)
        .cloned()
        .ok_or_else(|| FsError::Usage(format!("{} has no owner slot {slot}", desc.name)))
}

/// The allocation regions the owner map gives to slots other than 0.
pub(crate) fn foreign_regions(desc: &FsDescriptor) -> Vec<usize> {
    regions_elsewhere(desc, 0)
}

/// Whether the owner map gives slot `slot` any shard or allocation region: its owner (or
/// whoever takes it over) then writes its region.
pub(crate) fn slot_in_use(desc: &FsDescriptor, slot: u32) -> bool {
    (0..desc.shard_count as usize).any(|s| desc.shard_owner(s).slot == slot)
        || desc
            .slots
            .as_ref()
            .is_some_and(|s| s.region_owners.contains(&slot))
}

/// The owner slot the owner map gives allocation region `r` to (slot 0 by default).
pub(crate) fn region_owner(desc: &FsDescriptor, r: usize) -> u32 {
    desc.slots
        .as_ref()
        .and_then(|s| s.region_owners.get(r).copied())
        .unwrap_or(0)
}

/// The allocation regions the owner map gives to slots other than `slot`: that slot's owner
/// holds them as used and never reads or writes their chunks.
pub(crate) fn regions_elsewhere(desc: &FsDescriptor, slot: u32) -> Vec<usize> {
    let count = if slot == 0 {
        // Slot 0 owns every region the map does not name, however far the disks reach.
        desc.slots.as_ref().map_or(0, |s| s.region_owners.len())
    } else {
        region_count(desc) as usize
    };
    (0..count)
        .filter(|r| region_owner(desc, *r) != slot)
        .collect()
}

/// The allocation regions the owner map gives to `slot`.
pub(crate) fn regions_of(desc: &FsDescriptor, slot: u32) -> Vec<usize> {
    (0..region_count(desc) as usize)
        .filter(|r| region_owner(desc, *r) == slot)
        .collect()
}

/// `desc` as owner slot `slot` sees it: the regions it gave back (`given_back`) are not
/// its own, whatever the owner map says until the manager commits their move.
pub(crate) fn without_given_back(
    desc: &FsDescriptor,
    slot: u32,
    given_back: &[u32],
) -> FsDescriptor {
    let mut seen = desc.clone();
    if let Some(map) = seen.slots.as_mut() {
        for &r in given_back {
            if let Some(owner) = map.region_owners.get_mut(r as usize) {
                if *owner == slot {
                    *owner = 0;
                }
            }
        }
    }
    seen
}

/// Sub-blocks of allocation region `r` over every disk of `alloc`, and how many are used.
fn region_space(alloc: &tessera_alloc::AllocMap, r: usize) -> (u64, u64) {
    let per = (tessera_alloc::MAP_CHUNK_WORDS * 64) as u64;
    let spb = u64::from(alloc.sub_blocks_per_block());
    let (mut total, mut used) = (0, 0);
    for d in alloc.disks() {
        if r < alloc.chunk_count(d.disk) {
            total += (d.blocks * spb).saturating_sub(r as u64 * per).min(per);
            used += alloc
                .chunk_words(d.disk, r)
                .iter()
                .map(|w| u64::from(w.count_ones()))
                .sum::<u64>();
        }
    }
    (total, used)
}

/// Frees every chunk of `regions` in `alloc` (regions that came to this owner wholly free).
fn free_regions(alloc: &mut tessera_alloc::AllocMap, regions: &[usize]) {
    let disks: Vec<DiskIndex> = alloc.disks().iter().map(|d| d.disk).collect();
    for disk in disks {
        release_regions_on(alloc, disk, regions);
    }
}

/// Holds every chunk of `regions` as used in `alloc` (another slot allocates there; its
/// stored copies are that slot's), on every disk whose bitmap reaches that far.
pub(crate) fn hold_regions(alloc: &mut tessera_alloc::AllocMap, regions: &[usize]) {
    let disks: Vec<DiskIndex> = alloc.disks().iter().map(|d| d.disk).collect();
    for disk in disks {
        hold_regions_on(alloc, disk, regions);
    }
}

/// [`hold_regions`] on disk `disk` alone.
/// Clears the chunks of `regions` on `disk`: regions that came to this owner wholly free,
/// or (the other half of [`hold_regions_on`]) other owners' regions held here as used, on a
/// disk about to leave this owner's allocator (`disk delete`), so that what is left is this
/// owner's own use of it.
pub(crate) fn release_regions_on(
    alloc: &mut tessera_alloc::AllocMap,
    disk: DiskIndex,
    regions: &[usize],
) {
    let chunks = alloc.chunk_count(disk);
    for &r in regions.iter().filter(|r| **r < chunks) {
        let words = alloc.chunk_words(disk, r).len();
        alloc
            .set_chunk_words(disk, r, &vec![0; words])
            .expect("a chunk of the disk's own size");
    }
}

pub(crate) fn hold_regions_on(
    alloc: &mut tessera_alloc::AllocMap,
    disk: DiskIndex,
    regions: &[usize],
) {
    let chunks = alloc.chunk_count(disk);
    let bits = alloc
        .disks()
        .iter()
        .find(|d| d.disk == disk)
        .map_or(0, |d| d.blocks * u64::from(alloc.sub_blocks_per_block()));
    for &r in regions.iter().filter(|r| **r < chunks) {
        let words = alloc.chunk_words(disk, r).len();
        let mut held = vec![u64::MAX; words];
        // The last word of the disk has bits past its end, which stay clear.
        let end = (r * tessera_alloc::MAP_CHUNK_WORDS + words) as u64 * 64;
        if end > bits {
            let spare = end - bits;
            held[words - 1] = u64::MAX >> spare;
        }
        alloc
            .set_chunk_words(disk, r, &held)
            .expect("a chunk of the disk's own size");
    }
}

/// What the owner of a slot other than 0 keeps beside the owner's state.
pub(crate) struct SlotOwner {
    /// The slot's number (1 and up).
    pub number: u32,
    /// Where its records and log are: the descriptor's region, or the one it moved to
    /// (`slot_move.rs`) before the descriptor names it.
    pub region: parking_lot::Mutex<SlotRegion>,
    /// Moves of its region the file system manager gave up (by the new region's log id):
    /// a late request for one is refused.
    pub moves_given_up: parking_lot::Mutex<Vec<[u8; 16]>>,
    /// A forward record's write failed: whether the slot moved only a mount can tell, so no
    /// move is given up or made before one.
    pub forward_in_doubt: std::sync::atomic::AtomicBool,
    /// The record the last checkpoint wrote (the next one is of the next generation).
    pub record: parking_lot::Mutex<SlotRecord>,
    /// The regions the next record names as given back ([`SlotRecord::given_back`]).
    pub given_back: parking_lot::Mutex<Vec<u32>>,
    /// The disks the slot let go of for a `disk delete` ([`SlotRecord::dropped`]), in
    /// order; out of its allocator while the descriptor names them to be emptied.
    pub dropped: parking_lot::Mutex<Vec<u16>>,
    /// Held while the file system manager moves map regions (`map_hold.rs`).
    pub map_hold: crate::map_hold::MapWriteHold,
}

impl crate::fs::FileSystem {
    /// What the owner of a slot other than 0 keeps beside the owner's state.
    pub(crate) fn slot_state(&self) -> &SlotOwner {
        self.owner()
            .slot
            .as_ref()
            .expect("a slot other than 0 has its slot state")
    }

    /// Moves every owner slot region with a copy on one of `leaving` (disks being emptied or
    /// deleted, or down) to metadata disks that stay, and with `apart` (`restripe -r`) also
    /// a region of a `-m 2` file system whose copies share a failure group, when another
    /// group has room: the region is copied whole (records and log, whose pages do not name
    /// where they are), the descriptor naming the new place is committed, and the old
    /// blocks are freed after it. Returns how many moved.
    ///
    /// A slot that owns shards or allocation regions has its owner move it
    /// (`slot_move.rs`); one that owns nothing is copied here, and its owner must not be
    /// mounted meanwhile. A slot in use whose owner does not move its region when the move
    /// is only to part its copies is left as it is and named in `unreached` (the region
    /// works where it is); a move off a disk that leaves fails the call instead.
    pub(crate) fn move_slot_regions_off(
        &self,
        leaving: &[DiskIndex],
        apart: bool,
        unreached: &mut Vec<(u32, String)>,
    ) -> FsResult<usize> {
        // A move an earlier run left reserved ends first, one way or the other.
        self.settle_reserved_slot_moves()?;
        let mut moved = 0;
        let group = |d: DiskIndex| self.devices.failure_group(d);
        // With two metadata copies, a region of one copy (made before `fs change -m 2`)
        // is not apart either.
        let parted = |r: &SlotRegion| r.second.is_some_and(|s| group(s.disk) != group(r.disk));
        // Regions that stay together because no other group has room this time.
        let mut together = Vec::new();
        loop {
            let mut m = self.owner().meta.lock();
            let _one = self.owner().checkpoint_lock.lock();
            let desc = self.owner().desc.lock().clone();
            let needs_move = |r: &SlotRegion| {
                r.copies().iter().any(|(d, _)| leaving.contains(d))
                    || apart
                        && desc.metadata_copies.is_some()
                        && !parted(r)
                        && !together.contains(&r.slot)
            };
            let Some(old) = desc.slot_regions().iter().find(|r| needs_move(r)).cloned() else {
                return Ok(moved);
            };
            let stays = |d: DiskIndex| !leaving.contains(&d);
            let live = slot_in_use(&desc, old.slot);
            let reserved = live && desc.slot_move(old.slot).is_some();
            let on_leaving = old.copies().iter().any(|(d, _)| leaving.contains(d));
            let mut new = if reserved {
                None
            } else {
                let placed = self.place_slot_region(
                    &mut m,
                    &desc,
                    old.slot,
                    old.bytes,
                    old.record_bytes,
                    &stays,
                )?;
                // Moved only to be apart, and no other group has room now: it stays.
                if !on_leaving && !parted(&placed) {
                    for x in placed.extents(&desc) {
                        m.alloc.free(x).expect("just allocated");
                    }
                    together.push(old.slot);
                    continue;
                }
                Some(placed)
            };
            if live {
                // Its owner writes there: it moves itself (`slot_move.rs`), to a region it
                // places again, without these.
                for x in new.take().iter().flat_map(|n| n.extents(&desc)) {
                    m.alloc.free(x).expect("just allocated");
                }
                drop(_one);
                drop(m);
                match self.move_live_slot_region(&old, &stays) {
                    Ok(()) => moved += 1,
                    Err(e) if !on_leaving => {
                        together.push(old.slot);
                        unreached.push((old.slot, e.to_string()));
                    }
                    Err(e) => return Err(e),
                }
                continue;
            }
            let mut new = new.expect("placed for a slot not in use");
            new.log_id = old.log_id;
            // Both new copies are written from the current one.
            if let Some(n) = &mut new.second {
                n.log_behind = None;
            }
            if let Err(e) = self.copy_slot_region(&old, &new) {
                for x in new.extents(&desc) {
                    m.alloc.free(x).expect("just allocated");
                }
                return Err(e);
            }
            let mut next = desc.clone();
            for r in next.slots.iter_mut().flat_map(|s| s.regions.iter_mut()) {
                if r.slot == old.slot {
                    *r = new.clone();
                }
            }
            *self.owner().desc.lock() = next;
            m.pending_free
                .extend(old.extents(&desc).into_iter().map(|e| (0, e)));
            self.commit_descriptor_change(
                &mut m,
                false,
                &format!("moving owner slot {}", old.slot),
                "unmount and mount the file system again, then rerun the restripe",
            )?;
            tracing::info!(
                "{}: owner slot {} moved from {} to {}",
                desc.name,
                old.slot,
                self.devices.name(old.disk),
                self.devices.name(new.disk)
            );
            moved += 1;
        }
    }

    /// Puts owner slot `from` in place at `to` (as large): a fresh log at the new place
    /// that continues the old one's LSNs (a log's header names where it lies, so its bytes
    /// cannot be copied), and the newest record, of the next generation, replaying from
    /// there. Refused, with nothing changed, while the old log holds records its slot's
    /// checkpoint does not cover (the slot's owner stopped without a clean unmount: mount
    /// and unmount it first).
    fn copy_slot_region(&self, from: &SlotRegion, to: &SlotRegion) -> FsResult<()> {
        assert_eq!(from.bytes, to.bytes);
        let desc = self.owner().desc.lock().clone();
        let mut record = read_record(&desc, &self.devices, from)?;
        // The copy the descriptor calls current (refused by name when none is up).
        let (device, log) = crate::recovery::slot_log(&desc, &self.devices, from)?;
        let (journal, records) =
            tessera_journal::Journal::open(device, log, from.log_id, record.replay_from)?;
        if !records.is_empty() {
            return Err(FsError::Usage(format!(
                "owner slot {} of {} has {} log record(s) its checkpoint does not cover (its \
                 owner stopped without unmounting); mount the slot and unmount it cleanly, \
                 then run this again",
                from.slot,
                desc.name,
                records.len()
            )));
        }
        initialise(&desc, &self.devices, to)?;
        record.generation += 1;
        record.replay_from = tessera_journal::page_start_at_or_after(journal.appended_lsn());
        write_record(&desc, &self.devices, to, &record)?;
        Ok(())
    }
}

/// Reads every slot's record (mount and fsck): why each slot whose record does not read is
/// unusable. Its shards, once slots own any, are what it makes unavailable; the rest of the
/// file system is not affected.
pub(crate) fn check_records(desc: &FsDescriptor, disks: &Arc<DiskSet>) -> Vec<String> {
    let mut problems = Vec::new();
    for region in desc.slot_regions().iter() {
        if let Err(e) = read_record(desc, disks, region) {
            problems.push(e.to_string());
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: [u8; 16] = [0x11; 16];

    fn sample() -> SlotRecord {
        SlotRecord {
            slot: 3,
            generation: 5,
            replay_from: 0x1_0000,
            page_generation: 42,
            shards: vec![
                SlotShard {
                    shard: 7,
                    generation: 2,
                    root: ShardRoot {
                        addr: 0x2000,
                        crc32c: 0xAABB_CCDD,
                    },
                    second: None,
                },
                SlotShard {
                    shard: 200,
                    generation: 9,
                    root: ShardRoot {
                        addr: 0x3000,
                        crc32c: 1,
                    },
                    second: Some(0x4000),
                },
            ],
            regions: vec![3, 17],
            given_back: vec![9],
            map_digest: 0x0123_4567_89AB_CDEF,
            disks_covered: 6,
            dropped: vec![2, 4],
        }
    }

    #[test]
    fn a_record_has_the_documented_bytes() {
        let buf = sample().encode(&UUID, record_bytes(256, 10));
        assert_eq!(
            buf.len(),
            16384,
            "48 + 40 + 256 * 32 + 1024 * 4 bytes in whole sectors"
        );
        let mut want = Vec::new();
        want.extend_from_slice(b"TSRSLOT1");
        want.extend_from_slice(&3u32.to_le_bytes());
        want.extend_from_slice(&3u32.to_le_bytes());
        want.extend_from_slice(&5u64.to_le_bytes());
        want.extend_from_slice(&(40u32 + 64 + 12 + 8).to_le_bytes());
        want.extend_from_slice(&[0; 4]); // crc, checked below
        want.extend_from_slice(&UUID);
        want.extend_from_slice(&0x1_0000u64.to_le_bytes());
        want.extend_from_slice(&42u64.to_le_bytes());
        want.extend_from_slice(&0x0123_4567_89AB_CDEFu64.to_le_bytes());
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(&3u32.to_le_bytes());
        want.extend_from_slice(&6u32.to_le_bytes()); // disks covered
        want.extend_from_slice(&2u32.to_le_bytes()); // dropped disks
        for (shard, crc, generation, addr, second) in [
            (7u32, 0xAABB_CCDDu32, 2u64, 0x2000u64, u64::MAX),
            (200, 1, 9, 0x3000, 0x4000),
        ] {
            want.extend_from_slice(&shard.to_le_bytes());
            want.extend_from_slice(&crc.to_le_bytes());
            want.extend_from_slice(&generation.to_le_bytes());
            want.extend_from_slice(&addr.to_le_bytes());
            want.extend_from_slice(&second.to_le_bytes());
        }
        want.extend_from_slice(&3u32.to_le_bytes());
        want.extend_from_slice(&17u32.to_le_bytes());
        // Given back: bit 31 set.
        want.extend_from_slice(&0x8000_0009u32.to_le_bytes());
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(&4u32.to_le_bytes());
        assert_eq!(want.len(), sample().encoded_len());
        let crc = crc32c::crc32c(&want);
        want[28..32].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(&buf[..want.len()], &want[..]);
        assert!(buf[want.len()..].iter().all(|b| *b == 0));
        assert_eq!(
            SlotRecord::decode(&buf, &UUID, 3).unwrap(),
            Some(sample()),
            "decodes to what was encoded"
        );
    }

    /// A record of an earlier version (`fixed` bytes of fixed body, no dropped disks), made
    /// from a version-3 record of `sample()` without dropped disks.
    fn earlier(version: u32, fixed: usize) -> AlignedBuf {
        let v3 = SlotRecord {
            dropped: Vec::new(),
            ..sample()
        }
        .encode(&UUID, record_bytes(256, 10));
        let entries = 64 + 12;
        let mut old = v3[..HEADER_BYTES + fixed].to_vec();
        old.extend_from_slice(&v3[HEADER_BYTES + 40..HEADER_BYTES + 40 + entries]);
        let mut buf = AlignedBuf::zeroed(v3.len());
        buf[..old.len()].copy_from_slice(&old);
        buf[8..12].copy_from_slice(&version.to_le_bytes());
        buf[24..28].copy_from_slice(&((fixed + entries) as u32).to_le_bytes());
        buf[28..32].fill(0);
        let crc = crc32c::crc32c(&buf[..HEADER_BYTES + fixed + entries]);
        buf[28..32].copy_from_slice(&crc.to_le_bytes());
        buf
    }

    /// A version-1 record (no disks-covered field) still reads, as covering every disk.
    #[test]
    fn a_version_1_record_reads_as_covering_every_disk() {
        let read = SlotRecord::decode(&earlier(1, 32), &UUID, 3)
            .unwrap()
            .unwrap();
        assert_eq!(
            read,
            SlotRecord {
                disks_covered: u32::MAX,
                dropped: Vec::new(),
                ..sample()
            }
        );
    }

    /// A version-2 record (no dropped disks) still reads, as dropping none.
    #[test]
    fn a_version_2_record_reads_as_dropping_no_disk() {
        let read = SlotRecord::decode(&earlier(2, 36), &UUID, 3)
            .unwrap()
            .unwrap();
        assert_eq!(
            read,
            SlotRecord {
                dropped: Vec::new(),
                ..sample()
            }
        );
    }

    #[test]
    fn damaged_or_foreign_records_are_refused_by_name() {
        let good = sample().encode(&UUID, record_bytes(8, 0));
        let check = |bytes: &[u8], uuid: &[u8; 16], slot: u32, why: &str| {
            let err = SlotRecord::decode(bytes, uuid, slot).unwrap_err();
            assert!(err.contains(why), "{err} should say {why}");
        };
        let mut torn = good.to_vec();
        torn[80] ^= 1;
        check(&torn, &UUID, 3, "checksum");
        check(&good, &[0x22; 16], 3, "another file system");
        check(&good, &UUID, 4, "slot 3's");
        let mut version = good.to_vec();
        version[8] = 9;
        check(&version, &UUID, 3, "version 9");
        let mut long = good.to_vec();
        long[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
        check(&long, &UUID, 3, "out of range");
        check(&good[..20], &UUID, 3, "shorter");
        // A region given back listed before one the slot stores.
        let mut mixed = sample();
        mixed.regions = vec![3, 9];
        mixed.given_back = vec![17];
        let mut swapped = mixed.encode(&UUID, record_bytes(8, 0)).to_vec();
        let entries = HEADER_BYTES + BODY_FIXED_BYTES + 2 * SHARD_ENTRY_BYTES;
        let (a, b) = (entries + 4, entries + 8);
        let (x, y) = (swapped[a..a + 4].to_vec(), swapped[b..b + 4].to_vec());
        swapped[a..a + 4].copy_from_slice(&y);
        swapped[b..b + 4].copy_from_slice(&x);
        swapped[28..32].fill(0);
        let crc = crc32c::crc32c(&swapped[..mixed.encoded_len()]);
        swapped[28..32].copy_from_slice(&crc.to_le_bytes());
        check(&swapped, &UUID, 3, "out of order");
        // Dropped disks listed twice.
        let mut twice = sample().encode(&UUID, record_bytes(8, 0)).to_vec();
        let last = sample().encoded_len() - 4;
        twice.copy_within(last - 4..last, last);
        twice[28..32].fill(0);
        let crc = crc32c::crc32c(&twice[..sample().encoded_len()]);
        twice[28..32].copy_from_slice(&crc.to_le_bytes());
        check(&twice, &UUID, 3, "dropped disk 2 out of order");
        assert_eq!(
            SlotRecord::decode(&vec![0u8; 4096], &UUID, 3).unwrap(),
            None,
            "zeroes are a half never written"
        );
    }

    #[test]
    fn the_record_size_holds_every_shard() {
        for (shards, regions) in [
            (1, 0),
            (8, 2000),
            (126, 5),
            (127, 1024),
            (256, 1),
            (1024, 4000),
        ] {
            let bytes = record_bytes(shards, regions);
            assert_eq!(bytes % 4096, 0);
            let least = HEADER_BYTES + BODY_FIXED_BYTES + 32 * shards as usize;
            assert!(bytes as usize >= least + 4 * regions.max(RECORD_REGIONS_MIN) as usize);
            let mut r = SlotRecord::empty(1);
            r.shards = (0..shards)
                .map(|s| SlotShard {
                    shard: s,
                    generation: 1,
                    root: ShardRoot { addr: 1, crc32c: 2 },
                    second: None,
                })
                .collect();
            r.regions = (0..regions.max(RECORD_REGIONS_MIN)).collect();
            let buf = r.encode(&UUID, bytes);
            assert_eq!(SlotRecord::decode(&buf, &UUID, 1).unwrap(), Some(r));
        }
    }

    proptest::proptest! {
        #[test]
        fn garbage_never_panics_the_decoder(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
            let _ = SlotRecord::decode(&bytes, &UUID, 3);
        }

        #[test]
        fn a_flipped_bit_is_refused(bit in 0usize..(80 + 64 + 8) * 8) {
            let mut buf = sample().encode(&UUID, record_bytes(8, 0)).to_vec();
            buf[bit / 8] ^= 1 << (bit % 8);
            let decoded = SlotRecord::decode(&buf, &UUID, 3);
            // Bits of the magic turn it into something that is not a record; every other
            // bit is caught by the version or length check or the crc.
            proptest::prop_assert!(decoded.is_err(), "bit {} accepted: {:?}", bit, decoded);
        }
    }
}
