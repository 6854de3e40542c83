//! The disks of a live file system: adding disks [mmadddisk], deleting them [mmdeldisk],
//! and suspending, emptying and resuming allocation on them [mmchdisk
//! suspend|empty|resume]. The status is part of the
//! file-system descriptor, so it holds across mounts, and the allocator gives nothing new
//! out on a disk that is not ready; what the disk already holds stays readable and writable
//! in place until a restripe moves it (`crate::restripe`).
//!
//! # Adding a disk, crash-safe
//!
//! The descriptor is the commit point. Under the metadata lock (no change, allocation or
//! checkpoint runs beside it) the disk gets the next index, its device joins the disk table,
//! the allocator learns it as *unavailable*, and its allocation-map region is allocated on a
//! metadata disk; then a checkpoint writes the map (the new disk's chunks whole) and a
//! descriptor naming the disk and its region. Only once that descriptor is durable does the
//! allocator give out space on the disk. A crash before it leaves the previous descriptor,
//! whose map chunks never held the region: nothing leaks and the disk is simply not part of
//! the file system; a crash after it finds the disk at mount with an empty map.
//!
//! # Adding a disk to a file system mounted on several nodes
//!
//! The file system manager adds it as above; the allocation regions it has given to
//! owner slots (chunk `r` of *every* disk's map) grow by the new disk's chunk `r`, which the
//! manager holds as used and never stores, as it does the slots' chunks of the other disks.
//! Every other mount learns the disk from the descriptor (`follow_descriptor`: the daemon
//! asks each node that mounts the file system after the add, and a mount that meets a disk
//! index it does not know learns it then, before the I/O): it opens the disk's device (by
//! NSD name, the way it opened the others at mount) and, on the owner of a slot, gives its
//! allocator the disk with the slot's chunks free and everyone else's held. The slot stores
//! those chunks from its next checkpoint on, and its record says which disks its map digest
//! covers (`SlotRecord::disks_covered`), so a slot that was down during the add, or crashed
//! before that checkpoint, takes its chunks of the new disk as free at mount: only it
//! allocates there, and what it allocated before a crash is in its log. A change of a
//! disk's status (`disk change suspend|resume|empty`) reaches the slots' allocators the
//! same way.
//!
//! # Deleting a disk, crash-safe
//!
//! The disk is emptied first by a migrating restripe (data, metadata pages, map regions, the
//! log), each move crash-safe on its own; then one checkpoint writes the map and a
//! descriptor without the disk. Before that descriptor is durable the disk is still part of
//! the file system (empty, to be emptied); after it nothing references it, and its index is
//! retired rather than reused by the other disks.

use std::sync::Arc;

use tessera_alloc::PoolId;
use tessera_drive::BlockDevice;
use tessera_nsd::DiskUsage;

use crate::descriptor::{write_descriptor, DiskStatus, FsDescriptor, DESCRIPTOR_REPLICAS_MAX};
use crate::disk_set::DISKS_MAX;
use crate::error::{FsError, FsResult};
use crate::format::DiskSpec;
use crate::fs::FileSystem;

/// How long `disk delete` asks an owner slot that failed to answer for its space before
/// it refuses: long enough to ride out a busy node, short enough for an admin at a prompt.
const SLOT_ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Opens the device of a disk added to the file system after this mount started, from the
/// descriptor's entry for it (NSD name and id): the daemon opens it as it opened the others
/// at mount.
pub type DiskOpener =
    Box<dyn Fn(&crate::descriptor::FsDisk) -> FsResult<Arc<dyn BlockDevice>> + Send + Sync>;

/// Sets the status of the disks named `nsds` in `desc`, after checking that every name is a
/// disk of the file system and that every pool keeps a ready disk for what it holds.
/// Returns the disk indexes changed. The caller writes the descriptor.
pub fn set_disk_status(
    desc: &mut FsDescriptor,
    nsds: &[String],
    status: DiskStatus,
) -> FsResult<Vec<u16>> {
    let indexes = disk_indexes(desc, nsds)?;
    let mut next = desc.clone();
    for d in next.disks.iter_mut().filter(|d| indexes.contains(&d.index)) {
        d.status = status;
    }
    if status != DiskStatus::Ready {
        check_pools_keep_a_ready_disk(&next)?;
    }
    *desc = next;
    Ok(indexes)
}

/// The disk indexes of the NSDs named, refusing a name that is not a disk of the file
/// system.
pub(crate) fn disk_indexes(desc: &FsDescriptor, nsds: &[String]) -> FsResult<Vec<u16>> {
    nsds.iter()
        .map(|name| {
            let disk = desc.disks.iter().find(|d| d.nsd_name == *name);
            disk.map(|d| d.index).ok_or_else(|| {
                FsError::Invalid(format!(
                    "{name} is not a disk of file system {}; `tessera disk ls {}` lists them",
                    desc.name, desc.name
                ))
            })
        })
        .collect()
}

/// Refuses a change that leaves a pool with data disks, or the system pool's metadata,
/// without any ready disk to allocate on: every new file or change there would fail.
fn check_pools_keep_a_ready_disk(desc: &FsDescriptor) -> FsResult<()> {
    for (pool, name) in desc.pools.iter().enumerate() {
        let pool = pool as tessera_alloc::PoolId;
        for (what, holds) in [
            (
                "file data",
                &(|d: &crate::descriptor::FsDisk| d.usage.holds_data()) as &dyn Fn(_) -> bool,
            ),
            ("metadata", &|d: &crate::descriptor::FsDisk| {
                d.usage.holds_metadata()
            }),
        ] {
            let members: Vec<_> = desc
                .disks
                .iter()
                .filter(|d| d.pool == pool && holds(d))
                .collect();
            if !members.is_empty() && members.iter().all(|d| d.status != DiskStatus::Ready) {
                return Err(FsError::Invalid(format!(
                    "that would leave storage pool {name} of file system {} no ready disk for \
                     {what}; add a disk (`tessera disk add`) or resume one first",
                    desc.name
                )));
            }
        }
    }
    Ok(())
}

/// Changes the status of disks of a file system that is not mounted: reads the
/// descriptor from `devices` (by disk index, `None` where a disk cannot be opened),
/// changes it and writes it back. Returns the new descriptor.
pub fn set_disk_status_offline(
    devices: &[Option<Arc<dyn BlockDevice>>],
    nsds: &[String],
    status: DiskStatus,
) -> FsResult<FsDescriptor> {
    let available: Vec<Arc<dyn BlockDevice>> = devices.iter().flatten().cloned().collect();
    let mut desc = crate::descriptor::read_descriptor(&available)?;
    set_disk_status(&mut desc, nsds, status)?;
    desc.generation += 1;
    write_descriptor(&desc, devices)?;
    Ok(desc)
}

impl FileSystem {
    /// Changes the status of disks of the mounted file system: the descriptor is written
    /// first, then the allocator stops (or resumes) giving out space on them. Runs under
    /// the metadata and checkpoint locks, so no allocation or checkpoint sees half of it.
    pub fn set_disk_status(&self, nsds: &[String], status: DiskStatus) -> FsResult<Vec<u16>> {
        self.owner_here("changing a disk's status")?;
        self.manager_here("changing a disk's status")?;
        let mut m = self.owner().meta.lock();
        let _one = self.owner().checkpoint_lock.lock();
        let mut desc = self.owner().desc.lock().clone();
        let changed = set_disk_status(&mut desc, nsds, status)?;
        // Through the one writer of a mounted file system's descriptors, which numbers
        // them: a generation written twice with different contents would let a mount
        // take an older checkpoint's roots after their pages were freed.
        self.write_descriptor(desc)?;
        for &disk in &changed {
            m.alloc.set_available(disk, status == DiskStatus::Ready);
        }
        Ok(changed)
    }
}

/// Checks disks to add against the file system `desc` describes: new NSDs, big enough for
/// its block size, metadata only in the system pool, pools that exist.
fn check_new_disks(desc: &FsDescriptor, disks: &[DiskSpec]) -> FsResult<()> {
    if disks.is_empty() {
        return Err(FsError::Invalid(
            "no disks given; list the NSDs to add in the stanza file".into(),
        ));
    }
    if usize::from(next_disk_index(desc)) + disks.len() > DISKS_MAX {
        return Err(FsError::Invalid(format!(
            "file system {} has {} disks; with {} more it would pass the limit of {DISKS_MAX}",
            desc.name,
            desc.disks.len(),
            disks.len()
        )));
    }
    let bs = u64::from(desc.block_size);
    let min = tessera_nsd::layout::data_start_bytes(bs) + 2 * bs;
    for (i, d) in disks.iter().enumerate() {
        if desc
            .disks
            .iter()
            .any(|f| f.nsd_id == d.nsd_id || f.nsd_name == d.nsd_name)
        {
            return Err(FsError::Invalid(format!(
                "NSD {} is already a disk of file system {}",
                d.nsd_name, desc.name
            )));
        }
        if disks[..i].iter().any(|o| o.nsd_id == d.nsd_id) {
            return Err(FsError::Invalid(format!(
                "NSD {} is listed twice",
                d.nsd_name
            )));
        }
        if d.usage.holds_metadata() && d.pool != "system" {
            return Err(FsError::Invalid(format!(
                "NSD {}: metadata can only be stored in the system pool; use usage=dataOnly \
                 for pool {}",
                d.nsd_name, d.pool
            )));
        }
        if !desc.pools.contains(&d.pool) {
            return Err(FsError::Invalid(format!(
                "NSD {}: file system {} has no storage pool {} (its pools: {}); a new pool \
                 would receive no data until placement policies exist, so add the disk to \
                 one of its pools",
                d.nsd_name,
                desc.name,
                d.pool,
                desc.pools.join(", ")
            )));
        }
        if d.usage != DiskUsage::DescOnly && d.device.size_bytes() < min {
            return Err(FsError::Invalid(format!(
                "NSD {} ({}) has {} bytes, too small for block size {bs}; it needs at least {min}",
                d.nsd_name,
                d.device.name(),
                d.device.size_bytes()
            )));
        }
    }
    Ok(())
}

/// The index the next added disk gets: one past the highest (a deleted disk's index is
/// reused only when it was the highest, and then nothing references it any more).
fn next_disk_index(desc: &FsDescriptor) -> u16 {
    desc.disks.last().map_or(0, |d| d.index + 1)
}

/// Gives new disks a descriptor copy while fewer than three disks hold one, preferring a
/// failure group that has none; then, where two copies share a failure group and a new
/// disk is in a group without one, one of those copies moves to it (as GPFS keeps its
/// descriptor replicas in distinct failure groups when it can: with three groups, the
/// loss of any one leaves a majority).
fn add_descriptor_holders(desc: &mut FsDescriptor, first_new: usize) {
    let held = |desc: &FsDescriptor| desc.disks.iter().filter(|d| d.holds_descriptor).count();
    'fill: for prefer_new_group in [true, false] {
        for i in first_new..desc.disks.len() {
            if held(desc) >= DESCRIPTOR_REPLICAS_MAX {
                break 'fill;
            }
            let d = &desc.disks[i];
            if d.holds_descriptor || d.usage == DiskUsage::DataOnly {
                continue;
            }
            let group_has_one = desc
                .disks
                .iter()
                .any(|o| o.holds_descriptor && o.failure_group == d.failure_group);
            if prefer_new_group && group_has_one {
                continue;
            }
            desc.disks[i].holds_descriptor = true;
        }
    }
    let holders_in = |desc: &FsDescriptor, group: i32| {
        desc.disks
            .iter()
            .filter(|d| d.holds_descriptor && d.failure_group == group)
            .count()
    };
    for i in first_new..desc.disks.len() {
        let d = &desc.disks[i];
        if d.holds_descriptor
            || d.usage == DiskUsage::DataOnly
            || holders_in(desc, d.failure_group) > 0
        {
            continue;
        }
        let shared = desc
            .disks
            .iter()
            .rposition(|o| o.holds_descriptor && holders_in(desc, o.failure_group) > 1);
        if let Some(j) = shared {
            desc.disks[j].holds_descriptor = false;
            desc.disks[i].holds_descriptor = true;
        }
    }
}

impl FileSystem {
    /// Adds disks to the file system [mmadddisk], mounted and under I/O or opened for
    /// administration; new allocations use them as soon as this returns (existing data
    /// stays where it is until `restripe -b`). Returns the new disks' indexes. See the module
    /// documentation for why a crash at any point loses nothing.
    pub fn add_disks(&self, disks: Vec<DiskSpec>) -> FsResult<Vec<u16>> {
        self.owner_here("adding disks")?;
        self.manager_here("adding disks")?;
        self.check_fenced()?;
        check_new_disks(&self.descriptor(), &disks)?;
        // A disk that held another file system keeps that one's descriptor slots; a later
        // mount must never take them (of any generation) for this file system's.
        let devices: Vec<Arc<dyn BlockDevice>> = disks.iter().map(|d| d.device.clone()).collect();
        crate::descriptor::erase_descriptors(&devices)?;

        // Lock order: metadata, then checkpoint. Holding the checkpoint lock, no checkpoint
        // that read the descriptor before this change can write it back over it.
        let mut m = self.owner().meta.lock();
        let _one = self.owner().checkpoint_lock.lock();
        let mut desc = self.owner().desc.lock().clone();
        check_new_disks(&desc, &disks)?;
        let first = desc.disks.len();
        let first_index = next_disk_index(&desc);
        assert_eq!(
            usize::from(first_index),
            self.devices.len(),
            "one device slot per disk index"
        );
        for (i, d) in disks.iter().enumerate() {
            let index = first_index + u16::try_from(i).expect("bounded by DISKS_MAX");
            let pool = desc
                .pools
                .iter()
                .position(|p| *p == d.pool)
                .expect("pool checked") as PoolId;
            desc.disks
                .push(crate::format::fs_disk(desc.block_size, pool, index, d));
        }
        add_descriptor_holders(&mut desc, first);
        let added: Vec<u16> = desc.disks[first..].iter().map(|d| d.index).collect();
        let pushed = self.devices.push(
            disks
                .iter()
                .map(|d| (d.device.clone(), d.nsd_name.clone()))
                .collect(),
        );
        assert_eq!(pushed, first_index);
        self.devices.set_failure_groups(
            desc.disks[first..]
                .iter()
                .map(|d| (d.index, d.failure_group)),
        );
        for d in &desc.disks[first..] {
            let mut disk = crate::recovery::alloc_disk(d);
            // Nothing is allocated on the disk before a durable descriptor names it.
            disk.available = false;
            m.alloc.add_disk(disk);
        }
        let undo = |m: &mut crate::fs::Meta| {
            for &index in &added {
                m.alloc.remove_disk(index);
            }
            self.devices.truncate(first_index);
        };
        if desc.alloc_map.is_some() {
            let regions = match crate::alloc_map::allocate_regions_for(&desc, &mut m.alloc, &added)
            {
                Ok(regions) => regions,
                Err(e) => {
                    undo(&mut m);
                    return Err(e);
                }
            };
            if desc.metadata_copies.is_some() {
                let second = crate::alloc_map::allocate_second_regions(
                    &desc,
                    &self.devices,
                    &mut m.alloc,
                    &regions,
                );
                match second {
                    Ok(second) => {
                        if let Some(copies) = desc.metadata_copies.as_mut() {
                            copies.map_regions.extend(second);
                        }
                    }
                    Err(e) => {
                        for x in crate::alloc_map::region_extents_of(&desc, &regions) {
                            m.alloc.free(x).expect("a region just allocated");
                        }
                        undo(&mut m);
                        return Err(e);
                    }
                }
            }
            if let Some(map) = desc.alloc_map.as_mut() {
                map.regions.extend(regions);
            }
            let mut slots = self.owner().map_slots.lock();
            for &index in &added {
                slots.add_disk(index, m.alloc.chunk_count(index));
            }
            // The slots' regions reach onto the new disks: their chunks there are the
            // slots' to allocate in and store, held here as on every other disk.
            let foreign = crate::slot::foreign_regions(&desc);
            for &index in &added {
                crate::slot::hold_regions_on(&mut m.alloc, index, &foreign);
            }
        }
        *self.owner().desc.lock() = desc;
        self.commit_descriptor_change(
            &mut m,
            false,
            "adding the disks",
            "unmount and mount the file system again: it comes back with the disks if their \
             descriptor was written, without them otherwise (`tessera disk ls` tells)",
        )?;
        for &index in &added {
            m.alloc.set_available(index, true);
        }
        let desc = self.owner().desc.lock().clone();
        let reserve = crate::fs::metadata_reserve(&desc);
        self.owner()
            .metadata_reserve_sub_blocks
            .store(reserve, std::sync::atomic::Ordering::Relaxed);
        Ok(added)
    }
}

/// What `disk delete` did.
#[derive(Clone, Debug, Default)]
pub struct DiskDeleteReport {
    /// The restripe that emptied the disks.
    pub restripe: crate::restripe::RestripeReport,
    /// The indexes of the disks deleted; empty when the restripe was stopped (the disks stay,
    /// to be emptied, and running the delete again continues).
    pub deleted: Vec<u16>,
}

impl FileSystem {
    /// Deletes disks from the file system [mmdeldisk], mounted and under I/O or opened for
    /// administration: refused up front when the other ready disks of their pools cannot
    /// hold what they have; otherwise they are marked to be emptied, a migrating restripe
    /// moves their data, metadata pages, allocation-map regions and the recovery log to the
    /// other disks, and one checkpoint writes the allocation map and the descriptor without
    /// them, which commits the deletion. A crash before that descriptor is durable leaves the
    /// disks in the file system, to be emptied (running the delete again finishes it); after
    /// it, they are gone and nothing references them. Their indexes are retired, not reused
    /// by the others. `stop` ends it early between blocks.
    pub fn delete_disks(
        &self,
        nsds: &[String],
        stop: &std::sync::atomic::AtomicBool,
        progress: &mut dyn FnMut(&crate::restripe::RestripeProgress),
    ) -> FsResult<DiskDeleteReport> {
        let indexes = self.mark_disks_for_delete(nsds)?;
        let restripe = self.restripe(crate::restripe::RestripeMode::Migrate, stop, progress)?;
        if restripe.stopped {
            return Ok(DiskDeleteReport {
                restripe,
                deleted: Vec::new(),
            });
        }
        if let Some((slot, why)) = restripe.unreached_slots.first() {
            return Err(FsError::Usage(format!(
                "owner slot {slot} did not move its part off the disks ({why})"
            )));
        }
        // Space the moves released comes back once their changes are durable.
        self.sync_own()?;
        self.drop_on_slots(&indexes)?;
        self.commit_delete(&indexes)?;
        Ok(DiskDeleteReport {
            restripe,
            deleted: indexes,
        })
    }

    /// The first step of [`FileSystem::delete_disks`], on its own for a caller that must
    /// tell the other nodes before the moves (the daemon: the owner slots move only off
    /// disks they know to be emptied): the checks, then the disks marked to be emptied.
    /// Returns their indexes.
    pub fn mark_disks_for_delete(&self, nsds: &[String]) -> FsResult<Vec<u16>> {
        self.owner_here("deleting disks")?;
        self.manager_here("deleting disks")?;
        self.check_fenced()?;
        let indexes = self.check_delete(nsds)?;
        if indexes
            .iter()
            .any(|&i| self.desc_disk(i).status != DiskStatus::ToBeEmptied)
        {
            self.set_disk_status(nsds, DiskStatus::ToBeEmptied)?;
        }
        Ok(indexes)
    }

    /// Has every owner slot in use let go of `indexes` (`Namespace::drop_disks`) before the
    /// descriptor drops them: each checks that nothing of its own is left there and writes
    /// a record whose digest leaves them out.
    fn drop_on_slots(&self, indexes: &[u16]) -> FsResult<()> {
        let desc = self.descriptor();
        for slot in self.slots_beside_the_manager(&desc) {
            if !crate::slot::slot_in_use(&desc, slot) {
                continue;
            }
            let Some(ns) = self.slot_namespace(slot) else {
                return Err(FsError::Usage(format!(
                    "owner slot {slot} has no owner this node can reach to let go of the disks; \
                     mount the file system on its node and run the delete again"
                )));
            };
            ns.drop_disks(indexes).map_err(|e| {
                FsError::Usage(format!(
                    "owner slot {slot} could not let go of the disks: {e}"
                ))
            })?;
        }
        Ok(())
    }

    fn desc_disk(&self, index: u16) -> crate::descriptor::FsDisk {
        self.owner()
            .desc
            .lock()
            .disks
            .iter()
            .find(|d| d.index == index)
            .expect("a disk of the file system")
            .clone()
    }

    /// The indexes of the disks `nsds` names, once it is known that deleting them leaves
    /// every pool a ready disk and room for what they hold.
    fn check_delete(&self, nsds: &[String]) -> FsResult<Vec<u16>> {
        let desc = self.descriptor();
        if nsds.is_empty() {
            return Err(FsError::Invalid("no disks given to delete".into()));
        }
        for (i, name) in nsds.iter().enumerate() {
            if nsds[..i].contains(name) {
                return Err(FsError::Invalid(format!("{name} is listed twice")));
            }
        }
        if desc.disks.iter().all(|d| nsds.contains(&d.nsd_name)) {
            return Err(FsError::Invalid(format!(
                "that would delete every disk of file system {}; delete the file system \
                 instead (`tessera fs delete`)",
                desc.name
            )));
        }
        let mut next = desc.clone();
        let indexes = set_disk_status(&mut next, nsds, DiskStatus::ToBeEmptied)?;
        // The slots' regions are held as used here: their free space is theirs to say. An
        // owner busy writing (or a node under load) may miss one question: ask again for a
        // while before refusing, as an administrator would.
        let asked_from = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(200);
        let slots = loop {
            let slots = self.slots_space(&desc);
            let in_use = slots
                .unanswered
                .iter()
                .zip(&slots.why)
                .find(|(s, _)| crate::slot::slot_in_use(&desc, **s));
            let Some((slot, why)) = in_use else {
                break slots;
            };
            let hopeless = matches!(why, crate::report::SlotSilence::NoOwner);
            if hopeless || asked_from.elapsed() >= SLOT_ANSWER_WAIT {
                return Err(FsError::Usage(format!(
                    "owner slot {slot} does not answer for its part of the disks ({why}); mount \
                     the file system on its node and run the delete again"
                )));
            }
            tracing::info!("disk delete: owner slot {slot} did not answer ({why}); asking again");
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_secs(2));
        };
        let m = self.owner().meta.lock();
        let per = u64::from(desc.sub_blocks_per_block());
        let sub = u64::from(desc.sub_block_size);
        for (pool, pool_name) in desc.pools.iter().enumerate() {
            let pool = pool as PoolId;
            let (mut moving, mut room) = (0u64, 0u64);
            for d in desc.disks.iter().filter(|d| d.pool == pool) {
                let s = m.alloc.disk_space(d.index);
                let (slot_blocks, slot_fragments) = slots
                    .free
                    .get(&u32::from(d.index))
                    .copied()
                    .unwrap_or_default();
                let free = (s.blocks_free + slot_blocks) * per
                    + s.sub_blocks_free_in_fragments
                    + slot_fragments;
                if indexes.contains(&d.index) {
                    moving += s.blocks_total * per - free;
                } else if d.status == DiskStatus::Ready {
                    room += free;
                }
            }
            // Keep the metadata reserve's worth of slack: moves that just fit would leave
            // the pool full.
            if moving > 0 && moving + moving / 16 > room {
                return Err(FsError::Invalid(format!(
                    "the disks to delete hold {:.1} MiB of storage pool {pool_name}, and the \
                     other ready disks of that pool have {:.1} MiB free; add a disk first \
                     (`tessera disk add`) or delete fewer",
                    (moving * sub) as f64 / 1048576.0,
                    (room * sub) as f64 / 1048576.0
                )));
            }
        }
        Ok(indexes)
    }

    /// Removes the emptied disks `indexes` from the descriptor, the allocator and the stored
    /// map, in one checkpoint.
    fn commit_delete(&self, indexes: &[u16]) -> FsResult<()> {
        // Counted first (it takes the metadata lock): no page can land on the disks
        // meanwhile, since the allocator gives out nothing on a disk that is not ready.
        let pages = self.metadata_pages_per_disk()?;
        let mut m = self.owner().meta.lock();
        let _one = self.owner().checkpoint_lock.lock();
        let mut desc = self.owner().desc.lock().clone();
        let foreign = crate::slot::foreign_regions(&desc);
        for &i in indexes {
            let d = desc
                .disks
                .iter()
                .find(|d| d.index == i)
                .expect("checked")
                .clone();
            let s = m.alloc.disk_space(i);
            let per = u64::from(desc.sub_blocks_per_block());
            let used = (s.blocks_total - s.blocks_free) * per - s.sub_blocks_free_in_fragments;
            let region_on_it = desc
                .alloc_map
                .as_ref()
                .is_some_and(|map| map.regions.iter().any(|r| r.on_disk == i))
                || desc.metadata_copies.as_ref().is_some_and(|c| {
                    c.log_disk == i || c.map_regions.iter().any(|r| r.on_disk == i)
                })
                || desc
                    .slot_regions()
                    .iter()
                    .chain(desc.slot_moves.iter().flatten())
                    .any(|r| r.copies().iter().any(|(d, _)| *d == i));
            // Every block free, not only every sub-block: the allocator lets a disk go
            // only whole. The chunks of regions given to owner slots are held here as used;
            // the slots said they hold nothing there (`drop_on_slots`).
            let busy = if foreign.is_empty() {
                s.blocks_free != s.blocks_total
            } else {
                (0..m.alloc.chunk_count(i))
                    .filter(|c| !foreign.contains(c))
                    .any(|c| m.alloc.chunk_words(i, c).iter().any(|w| *w != 0))
            };
            if busy || pages[usize::from(i)] > 0 || desc.log.disk == i || region_on_it {
                return Err(FsError::Invalid(format!(
                    "NSD {} still holds {used} sub-block(s) in use ({} metadata page(s)) after \
                     the restripe, while other changes ran; run `tessera disk delete` again",
                    d.nsd_name,
                    pages[usize::from(i)]
                )));
            }
        }
        let removed_holder = desc
            .disks
            .iter()
            .any(|d| indexes.contains(&d.index) && d.holds_descriptor);
        desc.disks.retain(|d| !indexes.contains(&d.index));
        if removed_holder {
            add_descriptor_holders(&mut desc, 0);
        }
        // The map regions that described the deleted disks: stored free by this checkpoint,
        // reused once it is durable (pending frees as of LSN 0).
        let mut superseded = Vec::new();
        if let Some(map) = &mut desc.alloc_map {
            let (gone, kept): (Vec<_>, Vec<_>) =
                map.regions.iter().partition(|r| indexes.contains(&r.disk));
            map.regions = kept;
            superseded = crate::alloc_map::region_extents_of(&desc, &gone);
        }
        if let Some(copies) = &mut desc.metadata_copies {
            let (gone, kept): (Vec<_>, Vec<_>) = copies
                .map_regions
                .iter()
                .partition(|r| indexes.contains(&r.disk));
            copies.map_regions = kept;
            superseded.extend(crate::alloc_map::region_extents_of(&desc, &gone));
        }
        m.pending_free.extend(superseded.iter().map(|e| (0, *e)));
        {
            let mut slots = self.owner().map_slots.lock();
            for &i in indexes {
                slots.remove_disk(i);
                crate::slot::release_regions_on(&mut m.alloc, i, &foreign);
                m.alloc.remove_disk(i);
            }
        }
        let removed: Vec<Arc<dyn BlockDevice>> =
            indexes.iter().map(|&i| self.devices.get(i)).collect();
        *self.owner().desc.lock() = desc;
        // The allocator no longer knows the disks: no further change until a remount.
        self.commit_descriptor_change(
            &mut m,
            true,
            "deleting the disks",
            "unmount and mount the file system again (`tessera disk ls` tells whether they are \
             gone) and rerun the delete if they are not",
        )?;
        for &i in indexes {
            self.devices.retire(i);
        }
        let reserve = crate::fs::metadata_reserve(&self.descriptor());
        self.owner()
            .metadata_reserve_sub_blocks
            .store(reserve, std::sync::atomic::Ordering::Relaxed);
        drop(m);
        // The file system's descriptor copies on the deleted disks must never be found
        // again: a later mount given the device would take them for this file system.
        if let Err(e) = crate::descriptor::erase_descriptors(&removed) {
            tracing::warn!("erasing the descriptor copies of deleted disks: {e}");
        }
        Ok(())
    }
}

impl FileSystem {
    /// Tells this mount how to open disks that `disk add` adds on the file system manager
    /// after it mounted ([`FileSystem::follow_descriptor`]). Only the first opener set is used.
    pub fn set_disk_opener(&self, open: DiskOpener) {
        let _ = self.disk_opener.set(open);
    }

    /// Follows what the file system manager changed in the descriptor since this mount read
    /// it (`disk add`, `disk change`, `policy change`, `fs change -r`, on another node): new
    /// disks' devices are opened, so blocks placed on them read and write here, and the
    /// owner of a slot other than 0 takes its chunks of them, each disk's status, the policy
    /// and the replication of new files (`take_from_owner_map`). Returns the disk indexes
    /// added; none on the manager, which made the changes itself.
    pub fn follow_descriptor(&self) -> FsResult<Vec<u16>> {
        let (learned, newest) = self.learn_added_devices()?;
        // Disks deleted since: their NSDs are free for other uses, so this node lets go of
        // them too (a slot's owner let go of them in its allocator before the delete).
        let gone: Vec<u16> = (0..self.devices.len() as u16)
            .filter(|i| !newest.disks.iter().any(|d| d.index == *i))
            .filter(|i| !self.devices.name(*i).is_empty())
            .collect();
        if self.is_owner() && self.owner_slot() != 0 {
            self.take_from_descriptor(newest)?;
        }
        for i in gone {
            tracing::info!(
                "disk {} was deleted from the file system",
                self.devices.name(i)
            );
            self.devices.retire(i);
        }
        Ok(learned)
    }

    /// The device half of [`FileSystem::follow_descriptor`]: opens and appends the devices of
    /// disks the newest descriptor names beyond this mount's table. Takes no metadata lock
    /// (an I/O that meets an unknown disk calls it, whatever it holds). Returns the disk
    /// indexes added and the descriptor read.
    pub(crate) fn learn_added_devices(&self) -> FsResult<(Vec<u16>, FsDescriptor)> {
        let _one = self.learning_disks.lock();
        let known = self.devices.len();
        let newest = crate::descriptor::read_descriptor(&self.devices.all())?;
        let added: Vec<&crate::descriptor::FsDisk> = newest
            .disks
            .iter()
            .filter(|d| usize::from(d.index) >= known)
            .collect();
        // A client-only mount's descriptor follows too (disk status, policy): `disk ls`
        // and the data path read it.
        if let Some(desc) = &self.client_desc {
            let mut desc = desc.lock();
            if newest.generation > desc.generation {
                *desc = newest.clone();
            }
        }
        if added.is_empty() {
            return Ok((Vec::new(), newest));
        }
        let names: Vec<&str> = added.iter().map(|d| d.nsd_name.as_str()).collect();
        let Some(open) = self.disk_opener.get() else {
            return Err(FsError::NotSupported(format!(
                "{}: disks {} were added since this node mounted it, and this mount cannot \
                 open disks by itself; unmount and mount it again here",
                newest.name,
                names.join(", ")
            )));
        };
        let mut opened = Vec::with_capacity(added.len());
        for d in &added {
            let dev = open(d)?;
            crate::recovery::check_nsd_device(&newest, d, dev.as_ref())?;
            opened.push((d.index, dev, d.nsd_name.clone()));
        }
        for (index, dev, name) in opened {
            // Disks added and deleted meanwhile keep their indexes, retired.
            while self.devices.len() < usize::from(index) {
                let gap = u16::try_from(self.devices.len()).expect("bounded by DISKS_MAX");
                self.devices
                    .push(vec![(crate::disk_set::Retired::device(gap), String::new())]);
            }
            self.devices.push(vec![(dev, name)]);
        }
        self.devices
            .set_failure_groups(newest.disks.iter().map(|d| (d.index, d.failure_group)));
        tracing::info!(
            "{}: disks {} added on the file system manager are in use here too",
            newest.name,
            names.join(", ")
        );
        let added = added.iter().map(|d| d.index).collect();
        Ok((added, newest))
    }
}
