//! Bringing a file system's metadata back from disk: match devices to the descriptor's disks,
//! open the checkpoint's shard trees, read the stored allocation map (or rebuild it from the
//! metadata), replay the recovery log. Mount and fsck share this path.

use std::sync::Arc;

use tessera_alloc::{AllocDisk, AllocMap, DiskAddr, Extent};
use tessera_drive::BlockDevice;
use tessera_journal::Journal;
use tessera_nsd::NsdId;

use crate::alloc_map::MapSlots;
use crate::descriptor::FsDescriptor;
use crate::disk_set::DiskSet;
use crate::error::{FsError, FsResult};
use crate::meta::{Change, MetaState};
use crate::shard_tree::Item;

pub(crate) struct Recovered {
    pub state: MetaState,
    pub alloc: AllocMap,
    pub journal: Journal,
    /// The log's two copies, with metadata replicated (`-m 2`).
    pub log_copies: Option<Arc<crate::mirrored_log::MirroredLog>>,
    /// Descriptions of blocks referenced twice (empty on a healthy file system; only a
    /// rebuilt map finds them).
    pub conflicts: Vec<String>,
    pub replayed_records: usize,
    /// Which slots of the stored map's chunks a checkpoint must not overwrite.
    pub map_slots: MapSlots,
    /// Why the map was rebuilt from the metadata rather than read (`None`: it was read).
    pub map_rebuilt: Option<String>,
    /// With [`MapSource::Verify`]: the stored map after replay, or why it could not be read
    /// (`None` when the file system stores no map).
    pub stored_map: Option<Result<AllocMap, String>>,
    /// Shards the owner map gives to other slots: in `state` for counting their blocks and
    /// for fsck; a mount releases them.
    pub foreign_shards: Vec<usize>,
    /// Why shards of other slots could not be opened (their blocks are not counted).
    pub slot_problems: Vec<String>,
    /// With [`MapSource::Verify`] only: committed records of the log lost to a damaged
    /// page, which fsck names (a mount refuses such a log instead; see
    /// `Journal::open_accepting_loss`).
    pub log_loss: Option<String>,
    /// With [`MapSource::Verify`] only: the owner slots whose logs lost committed records
    /// to a damaged page (named in `slot_problems`), which fsck's repair starts afresh.
    pub slot_log_losses: Vec<u32>,
}

/// Where recovery takes the allocation map from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MapSource {
    /// The stored map; a scan of the metadata only when it is unusable (mount).
    Stored,
    /// A scan of the metadata, and the stored map beside it for comparison (fsck).
    Verify,
}

/// Orders `disks` by the descriptor's disk index, checking each NSD id is present.
/// Whether `dev` carries the NSD descriptor of disk `d` of `desc`.
pub(crate) fn check_nsd_device(
    desc: &FsDescriptor,
    d: &crate::descriptor::FsDisk,
    dev: &dyn BlockDevice,
) -> FsResult<()> {
    match tessera_nsd::descriptor::read_descriptor(dev) {
        Ok(Some(nd)) if nd.id == d.nsd_id => Ok(()),
        Ok(_) => Err(FsError::MissingDisk {
            fs: desc.name.clone(),
            nsd: d.nsd_name.clone(),
            reason: format!("{} no longer carries this NSD's descriptor", dev.name()),
        }),
        Err(e) => Err(FsError::MissingDisk {
            fs: desc.name.clone(),
            nsd: d.nsd_name.clone(),
            reason: e.to_string(),
        }),
    }
}

pub(crate) fn match_devices(
    desc: &FsDescriptor,
    disks: &[(NsdId, Arc<dyn BlockDevice>)],
) -> FsResult<Arc<DiskSet>> {
    // Deleted disks leave their index unused: a retired slot keeps the others' places.
    let slots = desc.disks.last().map_or(0, |d| usize::from(d.index) + 1);
    let mut out: Vec<Arc<dyn BlockDevice>> = (0..slots)
        .map(|i| crate::disk_set::Retired::device(i as u16))
        .collect();
    let mut names = vec![String::new(); slots];
    let mut missing = Vec::new();
    for d in &desc.disks {
        let found = disks.iter().find(|(id, _)| *id == d.nsd_id);
        if found.is_none() && may_be_down(desc, d) {
            // Its blocks have copies in other failure groups: mount without it.
            tracing::warn!(
                "{}: NSD {} is missing; mounting with it down (its blocks are read from \
                 their copies in other failure groups); once it is back, `tessera disk \
                 change {} start -d {}` or a remount, then `tessera restripe {} -r`",
                desc.name,
                d.nsd_name,
                desc.name,
                d.nsd_name,
                desc.name
            );
            out[usize::from(d.index)] = crate::disk_set::Retired::missing(&d.nsd_name);
            names[usize::from(d.index)] = d.nsd_name.clone();
            missing.push(d.index);
            continue;
        }
        let Some((_, dev)) = found else {
            return Err(FsError::MissingDisk {
                fs: desc.name.clone(),
                nsd: d.nsd_name.clone(),
                reason: "its device was not found; check that the drive is attached and that \
                         `tessera nsd ls -m` shows its device"
                    .into(),
            });
        };
        check_nsd_device(desc, d, dev.as_ref())?;
        out[usize::from(d.index)] = dev.clone();
        names[usize::from(d.index)] = d.nsd_name.clone();
    }
    // Stopped by an administrator [mmchdisk stop]: down until started, whatever answers.
    let stopped: Vec<u16> = desc
        .stopped
        .iter()
        .flatten()
        .copied()
        .filter(|d| !missing.contains(d) && desc.disks.iter().any(|x| x.index == *d))
        .collect();
    for &d in &stopped {
        tracing::warn!(
            "{}: NSD {} is stopped (`tessera disk change {} start -d {}` starts it); mounting \
             with it down",
            desc.name,
            names[usize::from(d)],
            desc.name,
            names[usize::from(d)]
        );
    }
    missing.extend(stopped);
    if !missing.is_empty() {
        check_descriptor_quorum(desc, &missing)?;
    }
    let set = DiskSet::new(out, names);
    set.set_failure_groups(desc.disks.iter().map(|d| (d.index, d.failure_group)));
    for d in missing {
        set.set_down(d, true);
    }
    Ok(set)
}

/// Whether the file system can be mounted without disk `d`: what it holds has copies in
/// other failure groups: its data (`-r` above 1), its metadata, log copy and descriptor
/// copy (`-m 2`; the descriptor's quorum is checked apart).
fn may_be_down(desc: &FsDescriptor, d: &crate::descriptor::FsDisk) -> bool {
    let data = desc.replication().data > 1;
    let metadata = desc.metadata_copies.is_some();
    if d.usage.holds_data() && !data {
        return false;
    }
    let holds_metadata = d.usage.holds_metadata() || d.holds_descriptor || desc.log.disk == d.index;
    if holds_metadata && !metadata {
        return false;
    }
    data || metadata
}

/// A majority of the descriptor's copies must be on disks that are present: descriptors
/// are written to a majority (`write_descriptor_quorum`), so any two majorities share a
/// disk and this mount reads the newest descriptor, never an older one that an earlier
/// mount without these disks went past [GPFS's file system descriptor quorum].
fn check_descriptor_quorum(desc: &FsDescriptor, missing: &[u16]) -> FsResult<()> {
    let holders: Vec<&crate::descriptor::FsDisk> =
        desc.disks.iter().filter(|d| d.holds_descriptor).collect();
    let gone: Vec<&&crate::descriptor::FsDisk> = holders
        .iter()
        .filter(|d| missing.contains(&d.index))
        .collect();
    let present = holders.len() - gone.len();
    if present * 2 > holders.len() {
        return Ok(());
    }
    Err(FsError::MissingDisk {
        fs: desc.name.clone(),
        nsd: gone
            .iter()
            .map(|d| d.nsd_name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        reason: format!(
            "only {present} of the {} disks holding the file system descriptor are present, \
             not a majority, so this mount could not tell whether it reads the newest \
             descriptor (descriptor quorum); bring back the missing disks. To survive the \
             loss of any one failure group, spread the descriptor copies over three failure \
             groups (add an NSD with usage=descOnly in a third group)",
            holders.len()
        ),
    })
}

pub(crate) fn recover(
    desc: &FsDescriptor,
    disks: &Arc<DiskSet>,
    source: MapSource,
) -> FsResult<Recovered> {
    let devices = &disks.all()[..];
    // First: a mount whose only current log copy is missing is refused for that, before
    // anything else it may miss is read.
    let (log_dev, log_copies) = match &desc.metadata_copies {
        None => (devices[desc.log.disk as usize].clone(), None),
        Some(_) => {
            let log = crate::mirrored_log::MirroredLog::open(desc, disks)?;
            (Arc::clone(&log) as Arc<dyn BlockDevice>, Some(log))
        }
    };
    let started = std::time::Instant::now();
    let (mut state, foreign_shards, mut slot_problems) =
        crate::checkpoint::open_state(desc, disks)?;
    let shards_opened = started.elapsed();
    let mut slot_log_losses = Vec::new();
    if source == MapSource::Verify {
        // fsck checks the namespace as every owner left it: other slots' shards with their
        // own logs replayed over their records.
        slot_log_losses = replay_slot_logs(desc, disks, &mut state, &mut slot_problems);
    }
    // fsck reads a log that lost committed records to a damaged page as far as it goes and
    // names the loss; its repair starts the log afresh there. A mount refuses it.
    let accept_loss = source == MapSource::Verify;
    let whose = LogOf {
        fs: &desc.name,
        slot: 0,
    };
    let (journal, records, log_loss) = match &log_copies {
        Some(log) if log.behind().is_none() => replay_longer(
            whose,
            log,
            (desc.log.region, desc.log.log_id),
            desc.checkpoint.replay_from,
            accept_loss,
        )?,
        _ => open_log(
            log_dev,
            (desc.log.region, desc.log.log_id),
            desc.checkpoint.replay_from,
            accept_loss,
        )
        .map_err(|e| log_error(whose, e))?,
    };
    let log_opened = started.elapsed();
    // The allocation map of the checkpoint comes first: replay frees what the records free
    // and takes what they map, as the live file system did.
    let empty = new_alloc(desc);
    let mut map_slots = MapSlots::none(&empty);
    let mut stale = Vec::new();
    let stored = match desc.alloc_map {
        Some(_) => {
            let loaded = crate::alloc_map::load(desc, devices, empty)?;
            map_slots = loaded.slots;
            stale = loaded.stale;
            Some(loaded.map)
        }
        None => None,
    };
    let (mut alloc, conflicts, map_rebuilt, mut stored_map) = match (source, stored) {
        (MapSource::Stored, Some(Ok(map))) => (map, Vec::new(), None, None),
        (source, stored) => {
            let why = match (source, &stored) {
                (MapSource::Verify, _) => "fsck rebuilds it".to_string(),
                (_, Some(Err(why))) => {
                    tracing::warn!(
                        "{}: {why}; rebuilding the allocation map from the metadata (a scan of \
                         every block reference; the next checkpoint stores it again whole, and \
                         fsck can tell what else is damaged)",
                        desc.name
                    );
                    why.clone()
                }
                _ => "the file system (format version 3) does not store its allocation map"
                    .to_string(),
            };
            let (alloc, conflicts) = rebuild_alloc(desc, &mut state)?;
            let stored = if source == MapSource::Verify {
                stored
            } else {
                None
            };
            (alloc, conflicts, Some(why), stored)
        }
    };
    if map_rebuilt.is_some() {
        alloc.mark_all_chunks_dirty();
    }
    for (disk, chunk) in stale {
        alloc.mark_chunk_dirty(disk, chunk);
    }
    let map_loaded = started.elapsed();
    let replayed_records = records.len();
    replay(records, &mut state, &mut alloc, &mut stored_map)?;
    if replayed_records > 0 {
        tracing::info!("{}: replayed {replayed_records} log records", desc.name);
    }
    // Where a mount's time goes, for an administrator asking why one took long (issue 14:
    // it must not grow with the file count).
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    tracing::info!(
        shards_ms = format!("{:.1}", ms(shards_opened)),
        log_ms = format!("{:.1}", ms(log_opened - shards_opened)),
        map_ms = format!("{:.1}", ms(map_loaded - log_opened)),
        replay_ms = format!("{:.1}", ms(started.elapsed() - map_loaded)),
        "{}: metadata recovered in {:.1} ms",
        desc.name,
        ms(started.elapsed())
    );
    Ok(Recovered {
        state,
        alloc,
        journal,
        log_copies,
        conflicts,
        replayed_records,
        map_slots,
        map_rebuilt,
        stored_map,
        foreign_shards,
        slot_problems,
        log_loss,
        slot_log_losses,
    })
}

/// Applies the log's records to the metadata and the allocation map (and to the stored
/// map beside it, for fsck), as the live file system did: a block a record maps is taken,
/// what a change releases is freed.
fn replay(
    records: Vec<tessera_journal::Record>,
    state: &mut MetaState,
    alloc: &mut AllocMap,
    stored_map: &mut Option<Result<AllocMap, String>>,
) -> FsResult<()> {
    for record in records {
        let changes: Vec<Change> = postcard::from_bytes(&record.payload).map_err(|e| {
            FsError::Corrupt(format!(
                "log record ending at {} is undecodable: {e}",
                record.lsn
            ))
        })?;
        for change in &changes {
            if let Some((_, _, block)) = change.mapped_block() {
                // The block may be mapped already if the record is replayed over a
                // checkpoint that holds it (the same extent mapped again).
                let mark = |alloc: &mut AllocMap| -> FsResult<()> {
                    for extent in block.extents() {
                        if alloc.is_free(extent) {
                            alloc.mark_used(extent).map_err(|e| {
                                FsError::Corrupt(format!(
                                    "log record ending at {}: {e}",
                                    record.lsn
                                ))
                            })?;
                        }
                    }
                    Ok(())
                };
                mark(alloc)?;
                if let Some(Ok(stored)) = stored_map {
                    mark(stored)?;
                }
            }
            for extent in state.apply(change)? {
                let _ = alloc.free(extent);
                if let Some(Ok(stored)) = stored_map {
                    let _ = stored.free(extent);
                }
            }
        }
    }
    Ok(())
}

/// Replays the log of every owner slot other than 0 that holds shards into `state`, which
/// holds those shards from their slots' records (fsck of the unmounted file system);
/// a slot whose record or log does not read is named in `problems` and left as its record
/// has it. A log that lost committed records to a damaged page is replayed as far as it
/// goes and named too; those slots are returned.
fn replay_slot_logs(
    desc: &FsDescriptor,
    disks: &Arc<DiskSet>,
    state: &mut MetaState,
    problems: &mut Vec<String>,
) -> Vec<u32> {
    let mut losses = Vec::new();
    for region in desc.slot_regions() {
        let shards: Vec<usize> = (0..desc.shard_count as usize)
            .filter(|s| desc.shard_owner(*s).slot == region.slot)
            .collect();
        if shards.is_empty() || shards.iter().any(|s| !state.holds(*s)) {
            continue;
        }
        let replayed =
            crate::slot::current_region(desc, disks, region).and_then(|(region, record)| {
                let (log_device, log_region) = slot_log(desc, disks, &region)?;
                let (_, records, lost) = Journal::open_accepting_loss(
                    log_device,
                    log_region,
                    region.log_id,
                    record.replay_from,
                )?;
                let mut scratch = new_alloc(desc);
                replay(records, state, &mut scratch, &mut None)?;
                Ok(lost)
            });
        match replayed {
            Ok(None) => {}
            Ok(Some(lost)) => {
                problems.push(log_loss_problem(&desc.name, region.slot, &lost));
                losses.push(region.slot);
            }
            Err(e) => problems.push(format!(
                "owner slot {}: its log does not replay over its record ({e}); its shards are \
                 checked as its record has them",
                region.slot
            )),
        }
    }
    losses
}

/// What fsck finds wrong with the allocation map of owner slot `slot` (not 0): the slot
/// brought back as its owner's mount would, the blocks and pages its shards reference
/// counted, and the two compared within the slot's allocation regions (no other owner
/// allocates there). Every reference of its shards outside them is a hand-over root.
pub(crate) fn slot_map_problems(
    desc: &FsDescriptor,
    disks: &Arc<DiskSet>,
    slot: u32,
) -> Vec<String> {
    // A log that lost records is named by `replay_slot_logs`; the map is checked as far as
    // it goes.
    let recovered = match recover_slot(desc, disks, slot, true) {
        Ok(r) => r,
        Err(e) => return vec![format!("owner slot {slot} cannot be brought back: {e}")],
    };
    let mine = crate::slot::regions_of(&recovered.desc, slot);
    let mut state = recovered.state;
    let refs = match referenced_extents_by_shard(desc, &mut state) {
        Ok(refs) => refs,
        Err(e) => return vec![format!("owner slot {slot}: {e}")],
    };
    let mut problems = Vec::new();
    let mut referenced = new_alloc(desc);
    let n = u64::from(desc.shard_count);
    for (extent, what, shard) in refs {
        let ours = shard.is_some_and(|s| desc.shard_owner((s % n) as usize).slot == slot);
        if !crate::alloc_map::touches_chunks(&extent, &mine) {
            continue;
        }
        if !ours {
            problems.push(format!(
                "{what} lies in allocation region of owner slot {slot}, which it does not own"
            ));
        }
        if let Err(e) = referenced.mark_used(extent) {
            problems.push(format!("owner slot {slot}: {what}: {e}"));
        }
    }
    if recovered.replayed > 0 {
        // Its log holds changes its owner has not checkpointed (it died, or was killed):
        // pages those changes superseded stay allocated until that checkpoint, and nothing
        // in memory references them, so the map is compared once its owner mounted again.
        return problems;
    }
    for d in recovered.alloc.disks().to_vec() {
        let (mut used_free, mut free_used) = (0u64, 0u64);
        for &r in mine.iter().filter(|r| **r < referenced.chunk_count(d.disk)) {
            let stored = recovered.alloc.chunk_words(d.disk, r);
            let counted = referenced.chunk_words(d.disk, r);
            for (a, b) in stored.iter().zip(counted) {
                used_free += u64::from((a & !b).count_ones());
                free_used += u64::from((b & !a).count_ones());
            }
        }
        if used_free + free_used > 0 {
            problems.push(format!(
                "allocation map of owner slot {slot} on disk {}: {used_free} sub-block(s) \
                 marked used that nothing references, {free_used} referenced but marked free",
                d.disk
            ));
        }
    }
    problems
}

/// The device a slot's log is read through (fsck, a move of its region) and its region on
/// it: its disk, or with two copies (`-m 2`) the pair as one device in the first copy's
/// coordinates, reading the copy the descriptor calls current (both copies' headers name
/// the first copy's region, as the file system manager's mirrored log's do).
pub(crate) fn slot_log(
    desc: &FsDescriptor,
    disks: &Arc<DiskSet>,
    region: &crate::slot::SlotRegion,
) -> FsResult<(Arc<dyn BlockDevice>, tessera_journal::JournalRegion)> {
    Ok(match region.second {
        Some(_) => (
            crate::mirrored_log::MirroredLog::for_slot(desc, disks, region)?
                as Arc<dyn BlockDevice>,
            region.log_region(),
        ),
        None => (disks.get(region.disk), region.log_region()),
    })
}

/// What bringing back an owner slot other than 0 found (see [`recover_slot`]).
pub(crate) struct RecoveredSlot {
    /// The descriptor as the slot sees it (without the regions it gave back).
    pub desc: FsDescriptor,
    pub state: MetaState,
    pub alloc: AllocMap,
    pub journal: Journal,
    pub map_slots: MapSlots,
    pub region: crate::slot::SlotRegion,
    pub record: crate::slot::SlotRecord,
    /// Log records replayed over the record.
    pub replayed: usize,
    /// The disks the slot let go of for a `disk delete` still under way.
    pub dropped: Vec<u16>,
    /// The log's two copies, with metadata replicated (`-m 2`).
    pub log_copies: Option<Arc<crate::mirrored_log::MirroredLog>>,
}

/// Of the disks a slot let go of (`dropped`), those a `disk delete` still empties: named
/// by the descriptor, to be emptied. One gone from the descriptor is forgotten; one back in
/// service is the slot's to take again.
pub(crate) fn still_dropped(desc: &FsDescriptor, dropped: &[u16]) -> Vec<u16> {
    dropped
        .iter()
        .copied()
        .filter(|d| {
            desc.disks
                .iter()
                .any(|x| x.index == *d && x.status == crate::descriptor::DiskStatus::ToBeEmptied)
        })
        .collect()
}

/// Brings back owner slot `slot` (not 0) from its own commit point: the shards the owner
/// map gives it from its record (or their hand-over roots), the chunks of the allocation
/// regions it stores (checked against its record's digest; the regions given to it since
/// start free, the others' are held as used), and its own log replayed from its record's
/// LSN. Nothing of slot 0's log or of other slots is read beyond the descriptor.
pub(crate) fn recover_slot(
    desc: &FsDescriptor,
    disks: &Arc<DiskSet>,
    slot: u32,
    accept_log_loss: bool,
) -> FsResult<RecoveredSlot> {
    assert_ne!(slot, 0, "slot 0 is recovered by `recover`");
    let region = desc
        .slot_regions()
        .iter()
        .find(|r| r.slot == slot)
        .cloned()
        .ok_or_else(|| {
            FsError::Usage(format!(
                "{} has no owner slot {slot} (`tessera fs ls` lists its slots)",
                desc.name
            ))
        })?;
    if desc.alloc_map.is_none() {
        return Err(FsError::NotSupported(format!(
            "owning slot {slot} of {}: the file system does not store its allocation map \
             (format version 3); mount it once on the file system manager to convert it",
            desc.name
        )));
    }
    // Where its records and log are: a move under its owner may have forwarded them.
    let (region, record) = crate::slot::current_region(desc, disks, &region)?;
    // The regions it gave back are not its own, whether or not the manager committed
    // their move yet.
    let desc = &crate::slot::without_given_back(desc, slot, &record.given_back);
    let mut roots: Vec<Option<tessera_meta::PagePtr>> = vec![None; desc.shard_count as usize];
    for (shard, root) in roots.iter_mut().enumerate() {
        let owner = desc.shard_owner(shard);
        if owner.slot == slot {
            let live = crate::slot::live_root(desc, &record, shard, owner.generation)
                .map_err(|why| FsError::Corrupt(format!("owner slot {slot}: {why}")))?;
            *root = Some(live);
        }
    }
    // Pages and chunk copies of this slot's checkpoints are numbered above every
    // generation slot 0 had reached: a region given since was last stored by slot 0.
    let generation = record.page_generation.max(desc.checkpoint.generation) + 1;
    let store = crate::checkpoint::new_store(desc, disks, generation)?;
    let state = MetaState::open(store, &roots)?;
    let mine = crate::slot::regions_of(desc, slot);
    let stored_regions: Vec<usize> = record.regions.iter().map(|r| *r as usize).collect();
    let scope = crate::alloc_map::Scope {
        durable: record.page_generation,
        digest: record.map_digest,
        read: Some(stored_regions.clone()),
        elsewhere: crate::slot::regions_elsewhere(desc, slot),
        disks_covered: record.disks_covered,
        dropped: record.dropped.clone(),
    };
    let loaded = crate::alloc_map::load_scope(desc, &disks.all(), new_alloc(desc), &scope)?;
    let mut alloc = loaded.map.map_err(|why| {
        FsError::Corrupt(format!(
            "owner slot {slot} of {}: its allocation regions' map does not read ({why}); \
             rebuilding a slot's map is not built yet",
            desc.name
        ))
    })?;
    for (disk, chunk) in loaded.stale {
        alloc.mark_chunk_dirty(disk, chunk);
    }
    // Disks the slot let go of for a `disk delete` that is still under way stay out of its
    // allocator; one back in service (the delete given up) is taken as an added disk.
    let mut map_slots = loaded.slots;
    let dropped = still_dropped(desc, &record.dropped);
    let elsewhere = crate::slot::regions_elsewhere(desc, slot);
    for &d in &dropped {
        crate::slot::release_regions_on(&mut alloc, d, &elsewhere);
        alloc.remove_disk(d);
        map_slots.remove_disk(d);
    }
    // Regions given since its last checkpoint, and its regions on disks added since:
    // stored from its next one on.
    let disks_of: Vec<tessera_alloc::DiskIndex> = alloc.disks().iter().map(|d| d.disk).collect();
    for &d in &disks_of {
        let added = u32::from(d) >= record.disks_covered || record.dropped.contains(&d);
        for r in mine.iter().filter(|r| added || !stored_regions.contains(r)) {
            if *r < alloc.chunk_count(d) {
                alloc.mark_chunk_dirty(d, *r);
            }
        }
    }
    // With two copies (`-m 2`), as the manager's log: the copy the descriptor calls behind
    // is not replayed, and of two current ones the one that reaches further is kept.
    let whose = LogOf {
        fs: &desc.name,
        slot: region.slot,
    };
    let (journal, records, log_copies) = match region.second {
        None => {
            let (journal, records, _) = open_log(
                disks.get(region.disk),
                (region.log_region(), region.log_id),
                record.replay_from,
                accept_log_loss,
            )
            .map_err(|e| log_error(whose, e))?;
            (journal, records, None)
        }
        Some(_) => {
            let log = crate::mirrored_log::MirroredLog::for_slot(desc, disks, &region)?;
            let (journal, records, _) = if log.behind().is_none() {
                replay_longer(
                    whose,
                    &log,
                    (region.log_region(), region.log_id),
                    record.replay_from,
                    accept_log_loss,
                )?
            } else {
                open_log(
                    Arc::clone(&log) as Arc<dyn BlockDevice>,
                    (region.log_region(), region.log_id),
                    record.replay_from,
                    accept_log_loss,
                )
                .map_err(|e| log_error(whose, e))?
            };
            (journal, records, Some(log))
        }
    };
    let mut state = state;
    let replayed_records = records.len();
    replay(records, &mut state, &mut alloc, &mut None)?;
    if let Some(log) = &log_copies {
        // Either copy alone replays the same records from here on; the state this leaves
        // (a copy caught up, one found missing) is recorded before the log's next write.
        if log.resync(&journal.replayed_ranges())?.is_some() {
            // A copy whose log was behind has older records too: the newest goes there
            // before the descriptor calls the copy current.
            crate::slot::write_record_to_caught_up(desc, disks, &region, &record, log)?;
        }
    }
    if replayed_records > 0 {
        tracing::info!(
            "{}: owner slot {slot}: replayed {replayed_records} log records",
            desc.name
        );
    }
    Ok(RecoveredSlot {
        desc: desc.clone(),
        state,
        alloc,
        journal,
        map_slots,
        dropped,
        region,
        record,
        replayed: replayed_records,
        log_copies,
    })
}

/// Replays each copy of a mirrored log whose copies are both current and keeps the replay
/// that reaches further: the other copy ends early at a page that is damaged, or torn by a
/// crash in the middle of a commit that never returned (its records may be kept or not;
/// the mount then copies what it replayed onto the other copy).
fn replay_longer(
    whose: LogOf<'_>,
    log: &Arc<crate::mirrored_log::MirroredLog>,
    (region, log_id): (tessera_journal::JournalRegion, [u8; 16]),
    replay_from: tessera_journal::Lsn,
    accept_loss: bool,
) -> FsResult<Opened> {
    type Replay = ((bool, u64, u64), u8, Opened);
    let mut best: Option<Replay> = None;
    let mut failed = None;
    for c in 0..2u8 {
        log.prefer(c);
        let opened = open_log(
            Arc::clone(log) as Arc<dyn BlockDevice>,
            (region, log_id),
            replay_from,
            accept_loss,
        );
        match opened {
            Ok((journal, records, lost)) => {
                // A copy that lost nothing first; then equal records, the further next
                // page: a copy that lacks the replay point's own page would start the next
                // append on it, below that point.
                let end = (lost.is_none(), journal.durable_lsn(), journal.next_page());
                if best.as_ref().is_none_or(|(e, ..)| end > *e) {
                    best = Some((end, c, (journal, records, lost)));
                }
            }
            Err(e) => {
                tracing::warn!("{whose}: copy {} of {}: {e}", c + 1, log.name());
                failed = Some(e);
            }
        }
    }
    match best {
        Some((_, c, opened)) => {
            log.prefer(c);
            Ok(opened)
        }
        None => Err(log_error(whose, failed.expect("a copy failed"))),
    }
}

/// An opened log, its records after the replay point, and what a damaged page lost.
type Opened = (Journal, Vec<tessera_journal::Record>, Option<String>);

/// Opens a log for replay: refusing one that lost committed records to a damaged page, or
/// (`accept_loss`: fsck) reading it as far as it goes and saying what was lost.
fn open_log(
    dev: Arc<dyn BlockDevice>,
    (region, log_id): (tessera_journal::JournalRegion, [u8; 16]),
    replay_from: tessera_journal::Lsn,
    accept_loss: bool,
) -> Result<Opened, tessera_journal::JournalError> {
    if accept_loss {
        Journal::open_accepting_loss(dev, region, log_id, replay_from)
    } else {
        Journal::open(dev, region, log_id, replay_from).map(|(j, r)| (j, r, None))
    }
}

/// Which log of which file system, for errors: the file system manager's (slot 0) or an
/// owner slot's.
#[derive(Clone, Copy)]
struct LogOf<'a> {
    fs: &'a str,
    slot: u32,
}

impl std::fmt::Display for LogOf<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.slot {
            0 => write!(
                f,
                "the recovery log of file system {} (its file system manager's)",
                self.fs
            ),
            s => write!(
                f,
                "the recovery log of owner slot {s} of file system {}",
                self.fs
            ),
        }
    }
}

/// fsck's problem for log `slot` of file system `fs`, which lost committed records to a
/// damaged page (`lost` says which).
pub(crate) fn log_loss_problem(fs: &str, slot: u32, lost: &str) -> String {
    format!(
        "{} lost committed records: {lost}; the records before that page were replayed and \
         checked, the rest is gone (a mount refuses this log; `tessera fsck {fs} -y` starts \
         it afresh at that page)",
        LogOf { fs, slot }
    )
}

/// A log that does not open, named.
fn log_error(log: LogOf<'_>, e: tessera_journal::JournalError) -> FsError {
    match e {
        tessera_journal::JournalError::Corrupt { device, detail } => FsError::Corrupt(format!(
            "{log}, on {device}: {detail}. `tessera fsck {} -y` replays the records before \
             that page, names what is lost, checks the file system and starts the log afresh \
             there (restore the disk from a copy first to keep those records)",
            log.fs
        )),
        e => e.into(),
    }
}

pub(crate) fn new_alloc(desc: &FsDescriptor) -> AllocMap {
    let disks = desc.disks.iter().map(alloc_disk).collect();
    AllocMap::new(desc.sub_blocks_per_block(), desc.placement, disks)
}

/// A disk of the descriptor as the allocator sees it.
pub(crate) fn alloc_disk(d: &crate::descriptor::FsDisk) -> AllocDisk {
    AllocDisk {
        disk: d.index,
        pool: d.pool,
        blocks: d.blocks,
        holds_data: d.usage.holds_data(),
        holds_metadata: d.usage.holds_metadata(),
        available: d.status == crate::descriptor::DiskStatus::Ready,
    }
}

/// The log region as whole-block extents, both copies with metadata replicated.
pub(crate) fn log_extents(desc: &FsDescriptor) -> Vec<Extent> {
    let data_start = tessera_nsd::layout::data_start_bytes(u64::from(desc.block_size));
    let sub = u64::from(desc.sub_block_size);
    let per = desc.sub_blocks_per_block();
    let blocks = desc.log.region.bytes / u64::from(desc.block_size);
    let copies = std::iter::once((desc.log.disk, desc.log.region.offset)).chain(
        desc.metadata_copies
            .as_ref()
            .map(|c| (c.log_disk, c.log_offset)),
    );
    copies
        .flat_map(|(disk, offset)| whole_blocks(data_start, sub, per, disk, offset, blocks))
        .collect()
}

/// The extents of `blocks` whole blocks from byte `offset` of `disk` (a region the
/// descriptor names: a log, an owner slot).
pub(crate) fn whole_blocks(
    data_start: u64,
    sub_block_bytes: u64,
    per_block: u32,
    disk: tessera_alloc::DiskIndex,
    offset: u64,
    blocks: u64,
) -> impl Iterator<Item = Extent> {
    let first = (offset - data_start) / sub_block_bytes;
    (0..blocks).map(move |b| Extent {
        addr: DiskAddr {
            disk,
            sub_block: first + b * u64::from(per_block),
        },
        sub_blocks: per_block,
    })
}

/// Every extent the metadata references, with a label for error messages: the log, the
/// allocation map's regions, the owner slots' regions, the metadata pages the shard trees reach, and every file block.
///
/// Each with the shard (or an inode number of it) whose metadata references it; `None` for
/// what the descriptor itself names.
fn referenced_extents_by_shard(
    desc: &FsDescriptor,
    state: &mut MetaState,
) -> FsResult<Vec<(Extent, String, Option<u64>)>> {
    let mut out: Vec<(Extent, String, Option<u64>)> = log_extents(desc)
        .into_iter()
        .map(|e| (e, "recovery log".to_string(), None))
        .collect();
    out.extend(
        crate::alloc_map::region_extents(desc)
            .into_iter()
            .map(|e| (e, "allocation map region".to_string(), None)),
    );
    for region in desc.slot_regions().iter() {
        out.extend(
            region
                .extents(desc)
                .into_iter()
                .map(|e| (e, format!("owner slot {}", region.slot), None)),
        );
    }
    for region in desc.slot_moves.iter().flatten() {
        out.extend(region.extents(desc).into_iter().map(|e| {
            let what = format!("the region reserved for owner slot {}'s move", region.slot);
            (e, what, None)
        }));
    }
    let held = state.held_shards();
    let (store, trees) = state.trees_mut();
    for (s, tree) in held.into_iter().zip(trees) {
        let mut pages = Vec::new();
        store
            .visit_pages(tree, &mut |addr, _| pages.push(addr))
            .map_err(|e| FsError::Corrupt(e.to_string()))?;
        out.extend(pages.into_iter().map(|a| {
            (
                crate::checkpoint::page_extent(desc, a),
                format!("metadata page {a} of shard {s}"),
                Some(s as u64),
            )
        }));
    }
    // Hand-over roots slot 0 still keeps (its descriptor names them until their taker's
    // records no longer fall back to them), where the shard opened from another root.
    let handed = desc.root_ptrs();
    for (s, p) in handed.iter().enumerate() {
        let opened = state.shard_root(s);
        if desc.shard_owner(s).slot == 0 || p.addr.0 == 0 || opened == Some(p.addr) {
            continue;
        }
        out.extend(std::iter::once(p.addr).chain(p.mirror).map(|a| {
            (
                crate::checkpoint::page_extent(desc, a),
                format!("hand-over root {a} of shard {s}"),
                None,
            )
        }));
    }
    state.scan(&mut |item| {
        if let Item::Block { ino, index, block } = item {
            for (c, e) in block.extents().enumerate() {
                let copy = if c == 0 {
                    String::new()
                } else {
                    format!(" copy {}", c + 1)
                };
                out.push((e, format!("inode {ino} block {index}{copy}"), Some(ino)));
            }
        }
        Ok(())
    })?;
    Ok(out)
}

/// Rebuilds the allocation map from the metadata; returns it and any double references.
pub(crate) fn rebuild_alloc(
    desc: &FsDescriptor,
    state: &mut MetaState,
) -> FsResult<(AllocMap, Vec<String>)> {
    let mut alloc = new_alloc(desc);
    let mut conflicts = Vec::new();
    let n = u64::from(desc.shard_count);
    let region_owner = |e: &Extent| {
        let region = (e.addr.sub_block / 64) as usize / tessera_alloc::MAP_CHUNK_WORDS;
        desc.slots
            .as_ref()
            .and_then(|s| s.region_owners.get(region).copied())
            .map_or((region, 0), |o| (region, o))
    };
    for (extent, owner, shard) in referenced_extents_by_shard(desc, state)? {
        // Slot 0 allocates only in its own regions, and regions are given away only when
        // free, so nothing of slot 0's lies in another slot's region. (Another slot's shards
        // may: a shard handed over keeps the pages and blocks it had, wherever they are.
        // Once regions or shards come back to slot 0, this check goes.)
        let slot = shard.map_or(0, |s| desc.shard_owner((s % n) as usize).slot);
        let (region, holder) = region_owner(&extent);
        if slot == 0 && holder != 0 {
            conflicts.push(format!(
                "{owner} (owner slot {slot}) lies in allocation region {region}, which owner \
                 slot {holder} allocates in"
            ));
        }
        if let Err(e) = alloc.mark_used(extent) {
            conflicts.push(format!("{owner}: {e}"));
        }
    }
    // Other slots' regions are held whole, as a stored map holds them: what is in use in
    // them is theirs to count.
    crate::slot::hold_regions(&mut alloc, &crate::slot::foreign_regions(desc));
    Ok((alloc, conflicts))
}
