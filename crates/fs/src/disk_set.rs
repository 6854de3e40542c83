//! The devices of a file system's disks, by disk index, as the I/O paths reach them.
//!
//! `disk add` [mmadddisk] appends disks to a mounted file system, so the table grows while
//! reads and writes run; a disk is never removed or replaced in it while mounted (`disk
//! delete` will retire an index, not reuse it). Readers take one device under a read lock
//! held for a clone of an `Arc`, so the table costs an I/O nothing measurable, and the
//! metadata page reader shares the same table, so pages placed on a new metadata disk are
//! readable the moment the allocator can give them out.

use std::sync::Arc;

use parking_lot::RwLock;
use tessera_alloc::DiskIndex;
use tessera_drive::BlockDevice;

/// Disks a file system can have. The descriptor (one 256 KiB slot holding every disk's
/// entry and map region) and the per-disk tables stay bounded by it.
pub const DISKS_MAX: usize = 1024;

struct Disk {
    device: Arc<dyn BlockDevice>,
    /// The NSD name, for messages.
    name: String,
    /// Give freed blocks back to the device (`thinDiskType`).
    discard: bool,
}

#[derive(Default)]
pub(crate) struct DiskSet {
    disks: RwLock<Vec<Disk>>,
}

impl std::fmt::Debug for DiskSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DiskSet({:?})", self.names())
    }
}

impl DiskSet {
    /// `devices[i]` is disk `i`, named `names[i]`.
    pub fn new(devices: Vec<Arc<dyn BlockDevice>>, names: Vec<String>) -> Arc<DiskSet> {
        assert_eq!(devices.len(), names.len(), "one name per device");
        assert!(devices.len() <= DISKS_MAX, "{} disks", devices.len());
        let disks = devices
            .into_iter()
            .zip(names)
            .map(|(device, name)| Disk {
                device,
                name,
                discard: false,
            })
            .collect();
        Arc::new(DiskSet {
            disks: RwLock::new(disks),
        })
    }

    /// The device of disk `disk`.
    ///
    /// # Panics
    ///
    /// If the file system has no such disk: every disk address comes from the allocator or
    /// from checked metadata, which only name disks the file system has.
    pub fn get(&self, disk: DiskIndex) -> Arc<dyn BlockDevice> {
        self.try_get(disk)
            .unwrap_or_else(|| panic!("disk {disk} is not a disk of the file system"))
    }

    pub fn try_get(&self, disk: DiskIndex) -> Option<Arc<dyn BlockDevice>> {
        self.disks
            .read()
            .get(usize::from(disk))
            .map(|d| Arc::clone(&d.device))
    }

    pub fn len(&self) -> usize {
        self.disks.read().len()
    }

    /// Every device, by disk index.
    pub fn all(&self) -> Vec<Arc<dyn BlockDevice>> {
        self.disks
            .read()
            .iter()
            .map(|d| Arc::clone(&d.device))
            .collect()
    }

    /// NSD names by disk index.
    pub fn names(&self) -> Vec<String> {
        self.disks.read().iter().map(|d| d.name.clone()).collect()
    }

    /// The NSD name of disk `disk`, or its index when it has none.
    pub fn name(&self, disk: DiskIndex) -> String {
        self.disks
            .read()
            .get(usize::from(disk))
            .map_or_else(|| format!("disk {disk}"), |d| d.name.clone())
    }

    pub fn discard(&self, disk: DiskIndex) -> bool {
        self.disks
            .read()
            .get(usize::from(disk))
            .is_some_and(|d| d.discard)
    }

    pub fn set_discard(&self, disk: DiskIndex, on: bool) {
        if let Some(d) = self.disks.write().get_mut(usize::from(disk)) {
            d.discard = on;
        }
    }

    /// Appends disks; returns the index of the first. Disks are appended only under the
    /// metadata lock, before the allocator knows them.
    pub fn push(&self, added: Vec<(Arc<dyn BlockDevice>, String)>) -> DiskIndex {
        let mut disks = self.disks.write();
        let first = disks.len();
        assert!(
            first + added.len() <= DISKS_MAX,
            "{} disks",
            first + added.len()
        );
        disks.extend(added.into_iter().map(|(device, name)| Disk {
            device,
            name,
            discard: false,
        }));
        DiskIndex::try_from(first).expect("bounded by DISKS_MAX")
    }

    /// Forgets the disks from `first` on: a `disk add` whose descriptor never became
    /// durable.
    pub fn truncate(&self, first: DiskIndex) {
        self.disks.write().truncate(usize::from(first));
    }
}
