//! The disks of a live file system: suspending, emptying and resuming allocation on them
//! [mmchdisk suspend|empty|resume]. The status is part of the file-system descriptor, so
//! it holds across mounts, and the allocator gives nothing new out on a disk that is not
//! ready; what the disk already holds stays readable and writable in place until a
//! restripe moves it (`crate::restripe`).

use std::sync::Arc;

use tessera_drive::BlockDevice;

use crate::descriptor::{write_descriptor, DiskStatus, FsDescriptor};
use crate::error::{FsError, FsResult};
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
        let devices: Vec<_> = self.devices.iter().cloned().map(Some).collect();
        write_descriptor(&desc, &devices)?;
        for &disk in &changed {
            m.alloc.set_available(disk, status == DiskStatus::Ready);
        }
        *self.desc.lock() = desc;
        Ok(changed)
    }
}
