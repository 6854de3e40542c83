//! Creating a file system on a set of NSDs (mmcrfs).

use std::sync::Arc;

use tessera_alloc::{AllocKind, Placement, PoolId};
use tessera_drive::BlockDevice;
use tessera_journal::JournalRegion;
use tessera_nsd::{DiskUsage, NsdId};

use crate::descriptor::{
    write_descriptor, AtimeMode, Checkpoint, DiskStatus, FsDescriptor, FsDisk, LogInfo,
    DESCRIPTOR_REPLICAS_MAX,
};
use crate::error::{FsError, FsResult};
use crate::inode::{Attr, FileKind, Timestamp, ROOT_INO};
use crate::meta::Change;

pub const BLOCK_BYTES_MIN: u32 = 64 << 10;
pub const BLOCK_BYTES_MAX: u32 = 16 << 20;
pub const INODE_SIZES: [u32; 3] = [512, 1024, 4096];
/// Sub-blocks per block at most, as in GPFS 5 (a 4 MiB block has 8 KiB sub-blocks).
const SUB_BLOCKS_PER_BLOCK_MAX: u32 = 512;
const SHARDS_MAX: u32 = 1024;
/// Inode shards of a new file system [--shards]: fine enough that the file system manager
/// can hand shards to the nodes that work in them (a directory per process in mdtest's
/// easy pattern is a shard of its own), few enough that mount opens every tree's root in
/// milliseconds. A checkpoint writes only the shards that changed.
pub const SHARDS_DEFAULT: u32 = 256;

#[derive(Clone, Debug)]
pub struct FormatOptions {
    pub name: String,
    pub block_size: u32,
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
    /// Copies of the metadata (`-m`): 1, or 2 for a second copy of every metadata page,
    /// the log and the allocation map in another failure group.
    pub metadata_replicas: u8,
    /// Copies of each data block of new files (`-r`) and what to do when they cannot all
    /// be placed (`-K`).
    pub replication: crate::descriptor::Replication,
    /// Recovery log size (`-L`).
    pub log_bytes: u64,
}

impl FormatOptions {
    /// Every check `format` makes before it writes anything, so that a caller can refuse
    /// bad input before announcing what it will format.
    pub fn check(&self, disks: &[DiskSpec]) -> FsResult<()> {
        validate(disks, self)
    }
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            name: "fs1".into(),
            block_size: 4 << 20,
            inode_size: 4096,
            placement: Placement::Scatter,
            max_inodes: 1_000_000,
            prealloc_inodes: 0,
            shard_count: SHARDS_DEFAULT,
            default_mount_point: "/gpfs/fs1".into(),
            automount: true,
            atime: AtimeMode::Relatime,
            exact_mtime: true,
            estimated_nodes: 32,
            max_metadata_replicas: 2,
            max_data_replicas: 2,
            metadata_replicas: 1,
            replication: crate::descriptor::Replication::default(),
            log_bytes: 64 << 20,
        }
    }
}

pub struct DiskSpec {
    pub nsd_name: String,
    pub nsd_id: NsdId,
    pub usage: DiskUsage,
    pub failure_group: i32,
    pub pool: String,
    pub device: Arc<dyn BlockDevice>,
}

/// A step of formatting, for a progress display.
#[derive(Clone, Debug)]
pub struct Progress {
    pub phase: String,
    pub done: u64,
    pub total: u64,
}

fn usage_err(msg: String) -> FsError {
    FsError::Usage(msg)
}

fn validate(disks: &[DiskSpec], opts: &FormatOptions) -> FsResult<()> {
    let bs = opts.block_size;
    if !bs.is_power_of_two() || !(BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&bs) {
        return Err(usage_err(format!(
            "block size {bs} is not supported; use a power of two from 64K to 16M (e.g. -B 1M or -B 4M)"
        )));
    }
    if !INODE_SIZES.contains(&opts.inode_size) {
        return Err(usage_err(format!(
            "inode size {} is not supported; use 512, 1K or 4K",
            opts.inode_size
        )));
    }
    if !(1..=SHARDS_MAX).contains(&opts.shard_count) {
        return Err(usage_err(format!("shard count must be 1..={SHARDS_MAX}")));
    }
    if disks.is_empty() {
        return Err(usage_err(
            "no disks given; list the NSDs in the stanza file".into(),
        ));
    }
    if !disks
        .iter()
        .any(|d| d.pool == "system" && d.usage.holds_metadata())
    {
        return Err(usage_err(
            "the system pool has no disk that holds metadata; give at least one NSD \
             usage=dataAndMetadata or usage=metadataOnly in pool=system"
                .into(),
        ));
    }
    if !disks.iter().any(|d| d.usage.holds_data()) {
        return Err(usage_err(
            "no disk holds data; give at least one NSD usage=dataAndMetadata or usage=dataOnly"
                .into(),
        ));
    }
    check_data_replication(disks, opts)?;
    check_metadata_replication(disks, opts)?;
    for d in disks {
        if d.usage.holds_metadata() && d.pool != "system" {
            return Err(usage_err(format!(
                "NSD {}: metadata can only be stored in the system pool; use usage=dataOnly \
                 for pool {}",
                d.nsd_name, d.pool
            )));
        }
        let min = tessera_nsd::layout::data_start_bytes(u64::from(bs)) + 2 * u64::from(bs);
        if d.device.size_bytes() < min {
            return Err(usage_err(format!(
                "NSD {} ({}) has {} bytes, too small for block size {bs}; it needs at least {min}",
                d.nsd_name,
                d.device.name(),
                d.device.size_bytes()
            )));
        }
    }
    Ok(())
}

/// `-r` within `-R` and within what the disks allow: every pool that holds data needs
/// data disks in as many failure groups as a block has copies, or no block of it could
/// ever be fully replicated.
fn check_data_replication(disks: &[DiskSpec], opts: &FormatOptions) -> FsResult<()> {
    let r = u32::from(opts.replication.data);
    let max = opts.max_data_replicas;
    if !(1..=crate::inode::COPIES_MAX as u32).contains(&max) {
        return Err(usage_err(format!(
            "-R {max}: the maximum number of data replicas must be 1, 2 or 3"
        )));
    }
    if r == 0 || r > max {
        return Err(usage_err(format!(
            "-r {r}: the number of data replicas must be 1 to the maximum (-R {max})"
        )));
    }
    if r == 1 {
        return Ok(());
    }
    let data_disks = disks.iter().filter(|d| d.usage.holds_data());
    let fewest =
        crate::replication::fewest_groups(data_disks.map(|d| (d.pool.as_str(), d.failure_group)));
    match fewest {
        Some((pool, groups)) if (groups.len() as u32) < r => Err(usage_err(format!(
            "-r {r}: pool {pool} has data disks in {} failure group(s) ({}), and each copy \
             of a block goes to a different failure group; give its NSDs failureGroup= \
             values in at least {r} groups, or use -r {}",
            groups.len(),
            groups
                .iter()
                .map(i32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            groups.len().max(1)
        ))),
        _ => Ok(()),
    }
}

/// `-m` within `-M`, and metadata disks of the system pool in two failure groups for `-m 2`.
fn check_metadata_replication(disks: &[DiskSpec], opts: &FormatOptions) -> FsResult<()> {
    let m = u32::from(opts.metadata_replicas);
    let max = opts.max_metadata_replicas;
    if !(1..=3).contains(&max) {
        return Err(usage_err(format!(
            "-M {max}: the maximum number of metadata replicas must be 1, 2 or 3"
        )));
    }
    if m == 0 || m > max {
        return Err(usage_err(format!(
            "-m {m}: the number of metadata replicas must be 1 to the maximum (-M {max})"
        )));
    }
    if m > 2 {
        return Err(usage_err(format!(
            "-m {m}: at most two metadata copies are supported; use -m 2"
        )));
    }
    if m == 1 {
        return Ok(());
    }
    let mut groups: Vec<i32> = disks
        .iter()
        .filter(|d| d.pool == "system" && d.usage.holds_metadata())
        .map(|d| d.failure_group)
        .collect();
    groups.sort_unstable();
    groups.dedup();
    if groups.len() < 2 {
        return Err(usage_err(format!(
            "-m 2: the metadata disks of the system pool are all in failure group {}, and \
             the two copies of the metadata go to different failure groups; give metadata \
             NSDs failureGroup= values in at least two groups (and, to survive the loss of \
             either, put the descriptor's third copy in a third group, e.g. a descOnly NSD)",
            groups.first().copied().unwrap_or(0)
        )));
    }
    Ok(())
}

/// The descriptor's entry of disk `index`, ready, holding no descriptor copy yet.
pub(crate) fn fs_disk(block_size: u32, pool: PoolId, index: u16, d: &DiskSpec) -> FsDisk {
    let bs = u64::from(block_size);
    let blocks = if d.usage == DiskUsage::DescOnly {
        0
    } else {
        (d.device.size_bytes() - tessera_nsd::layout::data_start_bytes(bs)) / bs
    };
    FsDisk {
        index,
        nsd_name: d.nsd_name.clone(),
        nsd_id: d.nsd_id,
        usage: d.usage,
        failure_group: d.failure_group,
        pool,
        size_bytes: d.device.size_bytes(),
        blocks,
        holds_descriptor: false,
        status: DiskStatus::Ready,
    }
}

/// Picks up to three descriptor disks, preferring distinct failure groups.
pub(crate) fn descriptor_disks(disks: &[FsDisk]) -> Vec<u16> {
    let mut chosen: Vec<u16> = Vec::new();
    let mut groups = Vec::new();
    let candidates = disks.iter().filter(|d| d.usage != DiskUsage::DataOnly);
    for d in candidates.clone() {
        if chosen.len() < DESCRIPTOR_REPLICAS_MAX && !groups.contains(&d.failure_group) {
            chosen.push(d.index);
            groups.push(d.failure_group);
        }
    }
    for d in candidates {
        if chosen.len() < DESCRIPTOR_REPLICAS_MAX && !chosen.contains(&d.index) {
            chosen.push(d.index);
        }
    }
    chosen
}

/// Formats a new file system on `disks`. On failure the disks' descriptor slots are erased so
/// nothing half-made is left behind.
pub fn format(
    disks: Vec<DiskSpec>,
    opts: &FormatOptions,
    progress: &mut dyn FnMut(Progress),
) -> FsResult<FsDescriptor> {
    validate(&disks, opts)?;
    let devices: Vec<Arc<dyn BlockDevice>> = disks.iter().map(|d| d.device.clone()).collect();
    let result = format_inner(disks, opts, progress);
    if result.is_err() {
        let _ = erase(&devices);
    }
    result
}

fn format_inner(
    disks: Vec<DiskSpec>,
    opts: &FormatOptions,
    progress: &mut dyn FnMut(Progress),
) -> FsResult<FsDescriptor> {
    let bs = u64::from(opts.block_size);
    let sub_block_size = (opts.block_size / SUB_BLOCKS_PER_BLOCK_MAX).max(4096);
    let mut pools: Vec<String> = vec!["system".into()];
    let mut fs_disks = Vec::with_capacity(disks.len());
    for (i, d) in disks.iter().enumerate() {
        if !pools.contains(&d.pool) {
            pools.push(d.pool.clone());
        }
        let pool = pools.iter().position(|p| *p == d.pool).expect("added") as PoolId;
        fs_disks.push(fs_disk(opts.block_size, pool, i as u16, d));
    }
    for i in descriptor_disks(&fs_disks) {
        fs_disks[i as usize].holds_descriptor = true;
    }
    let mut desc = FsDescriptor {
        fs_uuid: rand::random(),
        name: opts.name.clone(),
        created_unix: Timestamp::now().secs as u64,
        block_size: opts.block_size,
        sub_block_size,
        inode_size: opts.inode_size,
        placement: opts.placement,
        max_inodes: opts.max_inodes,
        prealloc_inodes: opts.prealloc_inodes,
        shard_count: opts.shard_count,
        default_mount_point: opts.default_mount_point.clone(),
        automount: opts.automount,
        atime: opts.atime,
        exact_mtime: opts.exact_mtime,
        estimated_nodes: opts.estimated_nodes,
        max_metadata_replicas: opts.max_metadata_replicas,
        max_data_replicas: opts.max_data_replicas,
        replication: Some(opts.replication),
        disks: fs_disks,
        pools,
        log: LogInfo {
            disk: 0,
            region: JournalRegion {
                offset: 0,
                bytes: 0,
            },
            log_id: [0; 16],
        },
        generation: 0,
        checkpoint: Checkpoint {
            replay_from: 0,
            page_bytes: crate::checkpoint::page_bytes(opts.block_size, sub_block_size),
            generation: 0,
            roots: Vec::new(),
        },
        alloc_map: None,
        policy: None,
        metadata_copies: None,
        slots: None,
        stopped: None,
        slot_moves: None,
    };
    let devices: Vec<Arc<dyn BlockDevice>> = disks.iter().map(|d| d.device.clone()).collect();
    let total = devices.len() as u64 + 3;
    let mut step = 0;
    let mut report = |phase: &str, step: &mut u64| {
        *step += 1;
        progress(Progress {
            phase: phase.to_string(),
            done: *step,
            total,
        });
    };
    let names = desc.disks.iter().map(|d| d.nsd_name.clone()).collect();
    let disk_set = crate::disk_set::DiskSet::new(devices.clone(), names);
    disk_set.set_failure_groups(desc.disks.iter().map(|d| (d.index, d.failure_group)));
    for dev in &devices {
        // Old descriptors from an earlier file system must not be found later.
        crate::descriptor::erase_descriptors(std::slice::from_ref(dev))?;
        report(
            &format!("Clearing descriptor area of {}", dev.name()),
            &mut step,
        );
    }
    let mut alloc = crate::recovery::new_alloc(&desc);
    let log_blocks = opts.log_bytes.div_ceil(bs).max((1 << 20) / bs).max(1);
    let (start, count) = alloc
        .alloc_contiguous_blocks(0, AllocKind::Metadata, log_blocks)
        .map_err(|_| {
            usage_err(format!(
                "no metadata disk has {} contiguous bytes for the recovery log; use a smaller -L",
                log_blocks * bs
            ))
        })?;
    desc.log = LogInfo {
        disk: start.disk,
        region: JournalRegion {
            offset: desc.sub_block_offset(start.sub_block),
            bytes: count * bs,
        },
        log_id: rand::random(),
    };
    let regions = crate::alloc_map::allocate_regions(&desc, &mut alloc)?;
    if opts.metadata_replicas == 2 {
        // The second copies, each on a metadata disk of another failure group than its
        // first copy's.
        let group = disk_set.failure_group(start.disk);
        let (second, _) = alloc
            .alloc_contiguous_blocks_on(0, AllocKind::Metadata, count, &|d| {
                disk_set.failure_group(d) != group
            })
            .map_err(|_| {
                usage_err(format!(
                    "no metadata disk outside failure group {group} has {} contiguous bytes for \
                     the second copy of the recovery log; use a smaller -L",
                    count * bs
                ))
            })?;
        desc.metadata_copies = Some(crate::descriptor::MetadataCopies {
            root_mirrors: Vec::new(),
            log_disk: second.disk,
            log_offset: desc.sub_block_offset(second.sub_block),
            log_behind: None,
            map_regions: crate::alloc_map::allocate_second_regions(
                &desc, &disk_set, &mut alloc, &regions,
            )?,
        });
        let log = crate::mirrored_log::MirroredLog::open(&desc, &disk_set)?;
        tessera_journal::format(log.as_ref(), desc.log.region, desc.log.log_id)?;
    } else {
        tessera_journal::format(
            devices[start.disk as usize].as_ref(),
            desc.log.region,
            desc.log.log_id,
        )?;
    }
    report("Creating the recovery log", &mut step);
    desc.alloc_map = Some(crate::alloc_map::StoredMap { regions, digest: 0 });
    // The first checkpoint stores the whole map, free chunks too.
    alloc.mark_all_chunks_dirty();
    let store = crate::checkpoint::new_store(&desc, &disk_set, 1)?;
    let mut state = root_state(store, opts)?;
    let prepared =
        crate::checkpoint::prepare(&desc, 0, &disk_set, &mut alloc, &mut state, &[], &[])?;
    crate::checkpoint::write_pages(&desc, &disk_set, &prepared)?;
    let slots = crate::alloc_map::MapSlots::none(&alloc);
    crate::alloc_map::write_chunks(
        &mut desc,
        &disk_set,
        &slots,
        prepared.generation,
        &prepared.map,
    )?;
    prepared.name_in(&mut desc);
    report("Creating the inode file", &mut step);
    desc.generation = 1;
    let slots: Vec<_> = devices.iter().cloned().map(Some).collect();
    write_descriptor(&desc, &slots)?;
    report("Writing file system descriptors", &mut step);
    Ok(desc)
}

fn root_state(
    store: tessera_meta::MetaStore,
    opts: &FormatOptions,
) -> FsResult<crate::meta::MetaState> {
    let mut state = crate::meta::MetaState::create(store, opts.shard_count)?;
    let now = Timestamp::now();
    let root = Attr {
        ino: ROOT_INO,
        kind: FileKind::Directory,
        perm: 0o755,
        uid: 0,
        gid: 0,
        nlink: 2,
        size: 0,
        rdev: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        generation: 0,
    };
    state.apply(&Change::PutAttr(root))?;
    state.apply(&Change::SetParent {
        dir: ROOT_INO,
        parent: ROOT_INO,
    })?;
    Ok(state)
}

/// Erases the file system descriptors on `devices` (mmdelfs); the NSDs stay.
pub fn erase(devices: &[Arc<dyn BlockDevice>]) -> FsResult<()> {
    crate::descriptor::erase_descriptors(devices)
}
