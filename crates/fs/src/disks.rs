//! The disks of a live file system: adding disks [mmadddisk], and suspending, emptying and
//! resuming allocation on them [mmchdisk suspend|empty|resume]. The status is part of the
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

use std::sync::Arc;

use tessera_alloc::PoolId;
use tessera_drive::BlockDevice;
use tessera_nsd::DiskUsage;

use crate::descriptor::{write_descriptor, DiskStatus, FsDescriptor, DESCRIPTOR_REPLICAS_MAX};
use crate::disk_set::DISKS_MAX;
use crate::error::{FsError, FsResult};
use crate::format::DiskSpec;
use crate::fs::FileSystem;

/// Sets the status of the disks named `nsds` in `desc`, after checking that every name is a
/// disk of the file system and that every pool keeps a ready disk for what it holds.
/// Returns the disk indexes changed. The caller writes the descriptor.
pub fn set_disk_status(
    desc: &mut FsDescriptor,
    nsds: &[String],
    status: DiskStatus,
) -> FsResult<Vec<u16>> {
    let mut indexes = Vec::with_capacity(nsds.len());
    for name in nsds {
        let disk = desc
            .disks
            .iter()
            .find(|d| d.nsd_name == *name)
            .ok_or_else(|| {
                FsError::Invalid(format!(
                    "{name} is not a disk of file system {}; `tessera disk ls {}` lists them",
                    desc.name, desc.name
                ))
            })?;
        indexes.push(disk.index);
    }
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
        let mut m = self.meta.lock();
        let _one = self.checkpoint_lock.lock();
        let mut desc = self.desc.lock().clone();
        let changed = set_disk_status(&mut desc, nsds, status)?;
        desc.generation += 1;
        let devices: Vec<_> = self.devices.all().into_iter().map(Some).collect();
        write_descriptor(&desc, &devices)?;
        for &disk in &changed {
            m.alloc.set_available(disk, status == DiskStatus::Ready);
        }
        *self.desc.lock() = desc;
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
    if desc.disks.len() + disks.len() > DISKS_MAX {
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

/// Gives new disks a descriptor copy while fewer than three disks hold one, preferring a
/// failure group that has none; the disks that hold one keep it.
fn add_descriptor_holders(desc: &mut FsDescriptor, first_new: usize) {
    let held = |desc: &FsDescriptor| desc.disks.iter().filter(|d| d.holds_descriptor).count();
    for prefer_new_group in [true, false] {
        for i in first_new..desc.disks.len() {
            if held(desc) >= DESCRIPTOR_REPLICAS_MAX {
                return;
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
}

impl FileSystem {
    /// Adds disks to the file system [mmadddisk], mounted and under I/O or opened for
    /// administration; new allocations use them as soon as this returns (existing data
    /// stays where it is until `restripe -b`). Returns the new disks' indexes. See the module
    /// documentation for why a crash at any point loses nothing.
    pub fn add_disks(&self, disks: Vec<DiskSpec>) -> FsResult<Vec<u16>> {
        self.check_fenced()?;
        check_new_disks(&self.descriptor(), &disks)?;
        // A disk that held another file system keeps that one's descriptor slots; a later
        // mount must never take them (of any generation) for this file system's.
        let devices: Vec<Arc<dyn BlockDevice>> = disks.iter().map(|d| d.device.clone()).collect();
        crate::descriptor::erase_descriptors(&devices)?;

        // Lock order: metadata, then checkpoint. Holding the checkpoint lock, no checkpoint
        // that read the descriptor before this change can write it back over it.
        let mut m = self.meta.lock();
        let _one = self.checkpoint_lock.lock();
        let mut desc = self.desc.lock().clone();
        check_new_disks(&desc, &disks)?;
        let first = desc.disks.len();
        assert_eq!(first, self.devices.len(), "one device per descriptor disk");
        let first_index = u16::try_from(first).expect("bounded by DISKS_MAX");
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
            match crate::alloc_map::allocate_regions_for(&desc, &mut m.alloc, &added) {
                Ok(regions) => desc
                    .alloc_map
                    .as_mut()
                    .expect("checked")
                    .regions
                    .extend(regions),
                Err(e) => {
                    undo(&mut *m);
                    return Err(e);
                }
            }
            let mut slots = self.map_slots.lock();
            for &index in &added {
                slots.add_disk(index, m.alloc.chunk_count(index));
            }
        }
        *self.desc.lock() = desc;
        if let Err(e) = self.checkpoint_under_lock(&mut m) {
            // Whether the descriptor naming the disks landed is unknown here; only a mount
            // (replaying the log over whichever descriptor is durable) knows, so this mount
            // takes no further checkpoint.
            self.stop_checkpoints();
            return Err(FsError::Corrupt(format!(
                "adding the disks failed while writing the checkpoint that names them: {e}; \
                 unmount and mount the file system again: it comes back with the disks if \
                 their descriptor was written, without them otherwise (`tessera disk ls` \
                 tells)"
            )));
        }
        for &index in &added {
            m.alloc.set_available(index, true);
        }
        let desc = self.desc.lock().clone();
        let reserve = crate::fs::metadata_reserve(&desc, self.geo.data_pool);
        self.metadata_reserve_sub_blocks
            .store(reserve, std::sync::atomic::Ordering::Relaxed);
        Ok(added)
    }
}
