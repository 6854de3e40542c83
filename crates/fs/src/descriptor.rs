//! The file system descriptor: the one record that says what a file system is (geometry,
//! disks, pools, where its log is) and where its last checkpoint lives.
//!
//! It is written to two alternating slots (A for even generations, B for odd) on up to
//! three disks, chosen in distinct failure groups when possible, so that losing one disk or
//! tearing one write never loses the descriptor. Mount reads every slot it can and takes the
//! highest generation whose checksum verifies.
//!
//! Slot layout (little endian), padded to whole sectors:
//!
//! ```text
//! 0        8          12           20        24       28       32
//! +--------+----------+------------+---------+--------+--------+----------------------+
//! | magic  | version  | generation | length  | crc32c | zero   | payload (postcard)   |
//! | TSRFSD01 | u32 = 8 | u64        | u32     | u32    | u32    | `length` bytes       |
//! +--------+----------+------------+---------+--------+--------+----------------------+
//! ```
//! The crc covers the payload; the generation is repeated inside the payload and must match.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tessera_alloc::{Placement, PoolId};
use tessera_drive::{AlignedBuf, BlockDevice, SECTOR_BYTES};
use tessera_journal::{JournalRegion, Lsn};
use tessera_nsd::layout::{
    FS_DESCRIPTOR_MAGIC, FS_DESCRIPTOR_SLOT_BYTES, FS_DESCRIPTOR_SLOT_OFFSETS,
};
use tessera_nsd::{DiskUsage, NsdId};

use crate::error::{FsError, FsResult};

/// Format version of the descriptor and of everything it points to (metadata pages, log
/// records). Bumped on any incompatible change; version 2 stopped storing directory cookie
/// indexes and allocation counts, which are derived at load; version 3 replaced whole
/// checkpoint images by copy-on-write shard trees of metadata pages; version 4 added the
/// stored allocation map (`alloc_map`, the last field, so a version-3 payload decodes as a
/// version-4 one without it: mount then rebuilds the map by a scan and stores it); version 5
/// added the policy (`policy`, after it) and the storage pool in inode records, whose bytes
/// were zero before and still mean "the default data pool" when zero, so versions 3 and 4
/// read as version 5 without a policy; version 6 added data replication (`replication`,
/// last; block references with copies, inode records with a copy count, log records
/// `MapCopies` and `SetReplicas`), so versions 3 to 5 read as version 6 with one copy;
/// version 7 added metadata replication (`metadata_copies`, last; metadata pages of
/// version 2, whose branch pointers carry a second address), so versions 3 to 6 read as
/// version 7 with one metadata copy; version 8 added owner slots (`slots`, last; see
/// `slot.rs`), so versions 3 to 7 read as version 8 with none; version 9 added the disks
/// stopped by an administrator (`stopped`, last), so versions 3 to 8 read as version 9 with
/// none stopped; version 10 added the owner slot regions being moved under their owners
/// (`slot_moves`, last; slot records may then be forwards, `slot_move.rs`), so versions 3
/// to 9 read as version 10 with none moving.
const SLOT_VERSION: u32 = 10;
/// The format whose descriptor lacks only the slot region moves.
const SLOT_VERSION_NO_SLOT_MOVES: u32 = 9;
/// The format whose descriptor lacks only the stopped disks.
const SLOT_VERSION_NO_STOPPED: u32 = 8;
/// The format whose descriptor lacks only the owner slots.
const SLOT_VERSION_NO_SLOTS: u32 = 7;
/// The format whose descriptor lacks only the metadata copies.
const SLOT_VERSION_NO_METADATA_COPIES: u32 = 6;
/// The format whose descriptor lacks only the replication settings.
const SLOT_VERSION_NO_REPLICATION: u32 = 5;
/// The format whose descriptor lacks the allocation map regions and the policy.
const SLOT_VERSION_NO_MAP: u32 = 3;
/// The format whose descriptor lacks only the policy.
const SLOT_VERSION_NO_POLICY: u32 = 4;
const SLOT_HEADER_BYTES: usize = 32;
/// How many disks keep a copy of the descriptor (GPFS keeps three on distinct failure groups).
pub const DESCRIPTOR_REPLICAS_MAX: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AtimeMode {
    /// Update atime on every read (`-S no`).
    Update,
    /// Never update atime on reads (`-S yes`).
    Suppress,
    /// Update atime when it is older than mtime/ctime or a day old (`-S relatime`).
    Relatime,
}

impl AtimeMode {
    pub fn as_flag(&self) -> &'static str {
        match self {
            AtimeMode::Update => "no",
            AtimeMode::Suppress => "yes",
            AtimeMode::Relatime => "relatime",
        }
    }
}

/// Whether new space is allocated on a disk [mmlsdisk "status"]. Variants are only ever
/// added at the end: the descriptor stores the index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DiskStatus {
    Ready,
    /// No new allocations (`disk change -d NSD suspend`); what it holds stays in use.
    Suspended,
    /// No new allocations, and a restripe (`-m`) or `disk delete` moves everything off it
    /// (`disk change -d NSD empty`).
    ToBeEmptied,
}

impl DiskStatus {
    /// As mmlsdisk prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            DiskStatus::Ready => "ready",
            DiskStatus::Suspended => "suspended",
            DiskStatus::ToBeEmptied => "to be emptied",
        }
    }
}

/// One NSD as a member of the file system.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FsDisk {
    pub index: u16,
    pub nsd_name: String,
    pub nsd_id: NsdId,
    pub usage: DiskUsage,
    pub failure_group: i32,
    pub pool: PoolId,
    pub size_bytes: u64,
    /// Whole file-system blocks in the disk's data region.
    pub blocks: u64,
    pub holds_descriptor: bool,
    pub status: DiskStatus,
}

/// Where the recovery log lives.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogInfo {
    pub disk: u16,
    pub region: JournalRegion,
    pub log_id: [u8; 16],
}

/// The root page of one shard's tree, as the descriptor records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRoot {
    pub addr: u64,
    pub crc32c: u32,
}

impl ShardRoot {
    pub fn ptr(self) -> tessera_meta::PagePtr {
        tessera_meta::PagePtr {
            addr: tessera_meta::PageAddr(self.addr),
            crc: self.crc32c,
            mirror: None,
        }
    }
}

impl From<tessera_meta::PagePtr> for ShardRoot {
    fn from(p: tessera_meta::PagePtr) -> ShardRoot {
        ShardRoot {
            addr: p.addr.0,
            crc32c: p.crc,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Journal records with an end LSN above this are replayed at mount.
    pub replay_from: Lsn,
    /// Size of a metadata page (a whole number of sub-blocks).
    pub page_bytes: u32,
    /// The page generation this checkpoint wrote; the next one writes generation + 1.
    pub generation: u64,
    /// The root page of every shard's tree.
    pub roots: Vec<ShardRoot>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FsDescriptor {
    pub fs_uuid: [u8; 16],
    pub name: String,
    pub created_unix: u64,
    pub block_size: u32,
    pub sub_block_size: u32,
    pub inode_size: u32,
    pub placement: Placement,
    pub max_inodes: u64,
    pub prealloc_inodes: u64,
    pub shard_count: u32,
    pub default_mount_point: String,
    pub automount: bool,
    pub atime: AtimeMode,
    pub exact_mtime: bool,
    pub estimated_nodes: u32,
    pub max_metadata_replicas: u32,
    pub max_data_replicas: u32,
    pub disks: Vec<FsDisk>,
    pub pools: Vec<String>,
    pub log: LogInfo,
    pub generation: u64,
    pub checkpoint: Checkpoint,
    /// Where each disk's allocation map is stored (`crate::alloc_map`); `None` on a file
    /// system of format version 3, whose map mount rebuilds by a scan and then stores.
    /// Last but one: see `SLOT_VERSION`.
    pub alloc_map: Option<crate::alloc_map::StoredMap>,
    /// The installed policy's text (`tessera policy change`, mmchpolicy), checked against
    /// the pools when installed and parsed again at mount. Last but one.
    pub policy: Option<String>,
    /// Data replication (`-r`, `-K`); `None` on file systems made before it (one copy).
    /// Last but one.
    pub replication: Option<Replication>,
    /// Where the second copies of the metadata live (`-m 2`); `None` with one copy.
    /// Last but one.
    pub metadata_copies: Option<MetadataCopies>,
    /// The owner slots beyond slot 0 (the descriptor's own) and the owner map; `None` until
    /// the first slot is made. Last but one.
    pub slots: Option<crate::slot::Slots>,
    /// Disks stopped by `disk change stop` [mmchdisk stop], by index, in order: every mount
    /// takes them as down (no I/O; their copies are read from the other failure groups)
    /// until `disk change start`. `None` when none is. Last but one.
    pub stopped: Option<Vec<u16>>,
    /// Owner slot regions being moved while their owners write them (`slot_move.rs`): the
    /// region each slot moves to, allocated and reserved here until the move completes (the
    /// slot's `slots.regions` entry then names it) or is given up. `None` when none moves.
    /// Always the last field.
    pub slot_moves: Option<Vec<crate::slot::SlotRegion>>,
}

/// The second copy of everything the metadata consists of, each on a metadata disk of a
/// failure group other than its first copy's [mmcrfs -m 2]. The metadata pages carry their
/// second addresses themselves (branch pointers); what the descriptor names directly has
/// its second copy named here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataCopies {
    /// The second address of each shard's root page, by shard as `checkpoint.roots`
    /// (`NO_SECOND_COPY` for a root written while no second failure group took it).
    pub root_mirrors: Vec<u64>,
    /// The recovery log's second copy: a region as large as the first, on `disk`.
    pub log_disk: u16,
    pub log_offset: u64,
    /// The copy of the log that lacks records the other holds, since its disk was missing
    /// at a mount or failed a write: 0 the first copy, 1 the second. Mount replays only
    /// the other one and copies it over this one before the flag is cleared.
    pub log_behind: Option<u8>,
    /// The allocation map's second copy: a region per disk, as `alloc_map.regions`.
    pub map_regions: Vec<crate::alloc_map::MapRegion>,
}

/// `MetadataCopies::root_mirrors` of a root with one copy.
pub const NO_SECOND_COPY: u64 = u64::MAX;

/// How a file system replicates data across failure groups [mmcrfs -r, -K].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replication {
    /// Copies of each data block of a new file (`-r`, 1 to `max_data_replicas`).
    pub data: u8,
    pub strict: StrictReplication,
}

/// What a write does when a block cannot get all its copies in distinct failure groups
/// [mmcrfs -K]. Variants are only ever added at the end: the descriptor stores the index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StrictReplication {
    /// Fewer copies whenever more cannot be placed (the file is ill-replicated, and
    /// `restripe -r` adds the missing copies later).
    No,
    /// All copies when enough failure groups have disks that take new data, fewer only
    /// while failure groups are down or suspended; a full failure group is ENOSPC.
    WhenPossible,
    /// Every copy or the write fails with ENOSPC.
    Always,
}

impl StrictReplication {
    pub fn as_str(self) -> &'static str {
        match self {
            StrictReplication::No => "no",
            StrictReplication::WhenPossible => "whenpossible",
            StrictReplication::Always => "always",
        }
    }

    pub fn parse(text: &str) -> Option<StrictReplication> {
        match text.to_ascii_lowercase().as_str() {
            "no" => Some(StrictReplication::No),
            "whenpossible" => Some(StrictReplication::WhenPossible),
            "always" => Some(StrictReplication::Always),
            _ => None,
        }
    }
}

impl Default for Replication {
    fn default() -> Replication {
        Replication {
            data: 1,
            strict: StrictReplication::WhenPossible,
        }
    }
}

impl FsDescriptor {
    /// Copies of each piece of metadata (`-m`): 2 when the descriptor names second copies.
    pub fn metadata_replicas(&self) -> u8 {
        if self.metadata_copies.is_some() {
            2
        } else {
            1
        }
    }

    /// The root pointers of the checkpoint, with their second addresses.
    pub fn root_ptrs(&self) -> Vec<tessera_meta::PagePtr> {
        let mirrors = self.metadata_copies.as_ref().map(|m| &m.root_mirrors);
        self.checkpoint
            .roots
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut ptr = r.ptr();
                ptr.mirror = mirrors
                    .and_then(|m| m.get(i))
                    .filter(|a| **a != NO_SECOND_COPY)
                    .map(|a| tessera_meta::PageAddr(*a));
                ptr
            })
            .collect()
    }

    /// Every stored allocation-map region: each disk's, then their second copies (`-m 2`).
    pub fn map_regions(&self) -> impl Iterator<Item = &crate::alloc_map::MapRegion> {
        self.alloc_map.iter().flat_map(|m| m.regions.iter()).chain(
            self.metadata_copies
                .iter()
                .flat_map(|c| c.map_regions.iter()),
        )
    }

    /// The regions of the owner slots beyond slot 0.
    pub fn slot_regions(&self) -> &[crate::slot::SlotRegion] {
        self.slots.as_ref().map_or(&[], |s| &s.regions)
    }

    /// The region owner slot `slot` is moving to under its owner, if a move is under way.
    pub fn slot_move(&self, slot: u32) -> Option<&crate::slot::SlotRegion> {
        self.slot_moves.as_ref()?.iter().find(|r| r.slot == slot)
    }

    /// Which slot owns shard `shard`, and since which generation of the owner map.
    pub fn shard_owner(&self, shard: usize) -> crate::slot::ShardOwner {
        self.slots
            .as_ref()
            .and_then(|s| s.shard_owners.get(shard).copied())
            .unwrap_or_default()
    }

    /// Data replication, one copy for file systems made before it existed.
    pub fn replication(&self) -> Replication {
        self.replication.unwrap_or_default()
    }

    pub fn sub_blocks_per_block(&self) -> u32 {
        self.block_size / self.sub_block_size
    }

    pub fn pool_name(&self, pool: PoolId) -> &str {
        self.pools
            .get(pool as usize)
            .map(String::as_str)
            .unwrap_or("?")
    }

    pub fn uuid_hex(&self) -> String {
        self.fs_uuid.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Byte offset on the disk of a sub-block address.
    pub fn sub_block_offset(&self, sub_block: u64) -> u64 {
        tessera_nsd::layout::data_start_bytes(u64::from(self.block_size))
            + sub_block * u64::from(self.sub_block_size)
    }

    /// The pool that receives file data: `system` when it holds data disks, otherwise the
    /// first pool that does (there is no placement policy engine yet).
    pub fn data_pool(&self) -> PoolId {
        let holds = |p: PoolId| {
            self.disks
                .iter()
                .any(|d| d.pool == p && d.usage.holds_data())
        };
        if holds(0) {
            return 0;
        }
        (0..self.pools.len() as PoolId)
            .find(|p| holds(*p))
            .unwrap_or(0)
    }

    fn encode_slot(&self) -> AlignedBuf {
        let payload = postcard::to_stdvec(self).expect("descriptor serializes");
        assert!(payload.len() + SLOT_HEADER_BYTES <= FS_DESCRIPTOR_SLOT_BYTES as usize);
        let mut buf = AlignedBuf::zeroed(SLOT_HEADER_BYTES + payload.len());
        buf[0..8].copy_from_slice(&FS_DESCRIPTOR_MAGIC);
        buf[8..12].copy_from_slice(&SLOT_VERSION.to_le_bytes());
        buf[12..20].copy_from_slice(&self.generation.to_le_bytes());
        buf[20..24].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        buf[24..28].copy_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
        buf[SLOT_HEADER_BYTES..SLOT_HEADER_BYTES + payload.len()].copy_from_slice(&payload);
        buf
    }
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().unwrap())
}

fn le_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().unwrap())
}

/// Reads one slot. `Ok(None)` when the slot holds no descriptor at all; `Err` with the reason
/// when it holds a damaged one.
fn read_slot(dev: &dyn BlockDevice, slot: usize) -> FsResult<Option<FsDescriptor>> {
    let offset = FS_DESCRIPTOR_SLOT_OFFSETS[slot];
    let mut head = AlignedBuf::zeroed(SECTOR_BYTES as usize);
    dev.read_at(&mut head, offset)?;
    if head[0..8] != FS_DESCRIPTOR_MAGIC {
        return Ok(None);
    }
    let damaged =
        |why: &str| FsError::Corrupt(format!("{} descriptor slot {slot}: {why}", dev.name()));
    let version = le_u32(&head[8..]);
    if version == 2 {
        return Err(FsError::Usage(format!(
            "{} holds a file system of format version 2, which kept each shard's inodes in \
             one checkpoint image that mount loads whole; this Tessera (format version \
             {SLOT_VERSION}) keeps metadata in on-disk trees and does not read version 2. \
             Copy the data out with the Tessera release that created it, then recreate the \
             file system (tessera fs delete, tessera fs create)",
            dev.name()
        )));
    }
    if ![
        SLOT_VERSION,
        SLOT_VERSION_NO_SLOT_MOVES,
        SLOT_VERSION_NO_STOPPED,
        SLOT_VERSION_NO_SLOTS,
        SLOT_VERSION_NO_METADATA_COPIES,
        SLOT_VERSION_NO_REPLICATION,
        SLOT_VERSION_NO_POLICY,
        SLOT_VERSION_NO_MAP,
    ]
    .contains(&version)
    {
        return Err(FsError::Usage(format!(
            "{} holds a file system of format version {version}, but this Tessera reads \
             version {SLOT_VERSION}; use the Tessera release that created it, or recreate the \
             file system (tessera fs delete, tessera fs create)",
            dev.name()
        )));
    }
    let generation = le_u64(&head[12..]);
    let len = le_u32(&head[20..]) as usize;
    if len + SLOT_HEADER_BYTES > FS_DESCRIPTOR_SLOT_BYTES as usize {
        return Err(damaged("length out of range"));
    }
    let mut buf = AlignedBuf::zeroed(SLOT_HEADER_BYTES + len);
    dev.read_at(&mut buf, offset)?;
    let payload = &buf[SLOT_HEADER_BYTES..SLOT_HEADER_BYTES + len];
    if crc32c::crc32c(payload) != le_u32(&buf[24..]) {
        return Err(damaged("checksum mismatch"));
    }
    // Older versions lack trailing optional fields; postcard writes `None` as one zero byte.
    let missing = match version {
        SLOT_VERSION_NO_MAP => 7,
        SLOT_VERSION_NO_POLICY => 6,
        SLOT_VERSION_NO_REPLICATION => 5,
        SLOT_VERSION_NO_METADATA_COPIES => 4,
        SLOT_VERSION_NO_SLOTS => 3,
        SLOT_VERSION_NO_STOPPED => 2,
        SLOT_VERSION_NO_SLOT_MOVES => 1,
        _ => 0,
    };
    let desc: FsDescriptor = if missing > 0 {
        let mut upgraded = payload.to_vec();
        upgraded.resize(payload.len() + missing, 0);
        postcard::from_bytes(&upgraded)
    } else {
        postcard::from_bytes(payload)
    }
    .map_err(|e| damaged(&format!("undecodable: {e}")))?;
    if desc.generation != generation {
        return Err(damaged("generation mismatch"));
    }
    // A log has copies 0 and 1: any other copy called behind would index past the pair.
    let behind = desc.metadata_copies.iter().map(|c| c.log_behind).chain(
        desc.slot_regions()
            .iter()
            .chain(desc.slot_moves.iter().flatten())
            .map(|r| r.second.and_then(|s| s.log_behind)),
    );
    if let Some(c) = behind.flatten().find(|c| *c > 1) {
        return Err(damaged(&format!(
            "it calls copy {c} of a log behind, and a log has copies 0 and 1"
        )));
    }
    Ok(Some(desc))
}

/// Writes `desc` into the slot of its generation on every descriptor disk, then flushes.
/// Succeeds when at least one copy is durable; the caller decides whether fewer copies than
/// planned is acceptable.
pub fn write_descriptor(
    desc: &FsDescriptor,
    devices: &[Option<Arc<dyn BlockDevice>>],
) -> FsResult<usize> {
    let buf = desc.encode_slot();
    let slot = (desc.generation % 2) as usize;
    let mut written = 0;
    let mut last_err = None;
    for disk in desc.disks.iter().filter(|d| d.holds_descriptor) {
        let Some(dev) = devices.get(disk.index as usize).and_then(|d| d.as_ref()) else {
            continue;
        };
        match dev
            .write_at(&buf, FS_DESCRIPTOR_SLOT_OFFSETS[slot])
            .and_then(|()| dev.flush())
        {
            Ok(()) => written += 1,
            Err(e) => {
                tracing::error!("writing descriptor to {}: {e}", dev.name());
                last_err = Some(e);
            }
        }
    }
    if written == 0 {
        return Err(match last_err {
            Some(e) => FsError::Io(e),
            None => FsError::NoDescriptor("no descriptor disk is available".into()),
        });
    }
    Ok(written)
}

/// [`write_descriptor`] that, with metadata replicated, succeeds only when a majority of
/// the descriptor disks took it: mounts need a majority too (`recovery::match_devices`),
/// so any mount reads at least one disk that holds the newest descriptor. With one
/// metadata copy every descriptor disk must be present at mount, and one copy suffices.
pub fn write_descriptor_quorum(
    desc: &FsDescriptor,
    devices: &[Option<Arc<dyn BlockDevice>>],
) -> FsResult<()> {
    let written = write_descriptor(desc, devices)?;
    let copies = desc.disks.iter().filter(|d| d.holds_descriptor).count();
    if desc.metadata_copies.is_some() && written * 2 <= copies {
        return Err(FsError::NoDescriptor(format!(
            "the descriptor of {} reached {written} of its {copies} disks, not a majority; \
             bring back the failed disks (tessera disk ls {} shows them)",
            desc.name, desc.name
        )));
    }
    Ok(())
}

/// Finds the newest valid descriptor on any of `devices`.
pub fn read_descriptor(devices: &[Arc<dyn BlockDevice>]) -> FsResult<FsDescriptor> {
    let mut best: Option<FsDescriptor> = None;
    let mut problems = Vec::new();
    for dev in devices {
        for slot in 0..2 {
            match read_slot(dev.as_ref(), slot) {
                Ok(Some(d)) => {
                    if let Some(b) = &best {
                        if b.fs_uuid != d.fs_uuid {
                            return Err(FsError::Corrupt(format!(
                                "{} belongs to file system {} but {} was expected",
                                dev.name(),
                                d.name,
                                b.name
                            )));
                        }
                    }
                    if best.as_ref().is_none_or(|b| d.generation > b.generation) {
                        best = Some(d);
                    }
                }
                Ok(None) => {}
                Err(e) => problems.push(e.to_string()),
            }
        }
    }
    for p in &problems {
        tracing::warn!("{p}");
    }
    best.ok_or_else(|| {
        let why = if problems.is_empty() {
            "none of the disks holds a Tessera file system descriptor".to_string()
        } else {
            problems.join("; ")
        };
        FsError::NoDescriptor(why)
    })
}

/// Destroys the descriptor slots so the disks no longer belong to a file system.
pub fn erase_descriptors(devices: &[Arc<dyn BlockDevice>]) -> FsResult<()> {
    let zero = AlignedBuf::zeroed(SECTOR_BYTES as usize);
    for dev in devices {
        for offset in FS_DESCRIPTOR_SLOT_OFFSETS {
            dev.write_at(&zero, offset)?;
        }
        dev.flush()?;
    }
    Ok(())
}
