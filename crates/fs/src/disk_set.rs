//! The devices of a file system's disks, by disk index, as the I/O paths reach them.
//!
//! `disk add` [mmadddisk] appends disks to a mounted file system, so the table grows while
//! reads and writes run; `disk delete` [mmdeldisk] retires a disk's slot (a device that
//! refuses every read and write) rather than renumbering the others, since block
//! references and page addresses carry disk indexes. Readers take one device under a read lock
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
    /// The disk's failure group: copies of a block go to distinct ones.
    failure_group: i32,
    /// Availability down: its device is missing or failed a write, so no copy is read from
    /// or written to it (replicated file systems only; see `replication.rs`).
    down: bool,
    /// Recent read latency, a moving average in nanoseconds per request (0: none yet), for
    /// `readReplicaPolicy=fastest`.
    read_ns: std::sync::atomic::AtomicU64,
    /// This node reaches the disk through NSD servers (`readReplicaPolicy=local` reads
    /// the copies on the other disks first).
    remote: bool,
}

/// The slot of a deleted disk: nothing references it any more, so any I/O to it is a bug
/// reported as an error, never a write to a device that may belong to someone else now.
#[derive(Debug)]
pub(crate) struct Retired {
    name: String,
}

impl Retired {
    pub(crate) fn device(disk: DiskIndex) -> Arc<dyn BlockDevice> {
        Arc::new(Retired {
            name: format!("deleted disk {disk}"),
        })
    }

    /// The slot of a disk whose device was not found at mount (it is down).
    pub(crate) fn missing(nsd: &str) -> Arc<dyn BlockDevice> {
        Arc::new(Retired {
            name: format!("missing NSD {nsd}"),
        })
    }

    fn refuse(&self) -> std::io::Error {
        std::io::Error::other(format!(
            "{}: I/O to a disk that is deleted from the file system or missing",
            self.name
        ))
    }
}

impl BlockDevice for Retired {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        0
    }

    fn read_at(&self, _buf: &mut [u8], _offset: u64) -> std::io::Result<()> {
        Err(self.refuse())
    }

    fn write_at(&self, _buf: &[u8], _offset: u64) -> std::io::Result<()> {
        Err(self.refuse())
    }

    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
}

#[derive(Default)]
pub(crate) struct DiskSet {
    disks: RwLock<Vec<Disk>>,
    /// Called with no lock held when a disk index beyond the table is asked for: on a node
    /// other than the file system manager, a disk `disk add` added there since this mount
    /// read the descriptor (`FileSystem::learn_added_devices`).
    unknown: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
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
                failure_group: 0,
                down: false,
                read_ns: Default::default(),
                remote: false,
            })
            .collect();
        Arc::new(DiskSet {
            unknown: std::sync::OnceLock::new(),
            disks: RwLock::new(disks),
        })
    }

    /// The device of disk `disk`. Every disk address comes from the allocator or from
    /// checked metadata, which only name disks the file system has; one this mount does
    /// not know yet was added on the file system manager since (it is learned here), and
    /// one it cannot learn answers every I/O with an error naming it.
    pub fn get(&self, disk: DiskIndex) -> Arc<dyn BlockDevice> {
        self.try_get(disk).unwrap_or_else(|| {
            Arc::new(Retired {
                name: format!("disk {disk}, which this mount does not know"),
            })
        })
    }

    pub fn try_get(&self, disk: DiskIndex) -> Option<Arc<dyn BlockDevice>> {
        let known = |disks: &Vec<Disk>| disks.get(usize::from(disk)).map(|d| Arc::clone(&d.device));
        if let Some(dev) = known(&self.disks.read()) {
            return Some(dev);
        }
        self.unknown.get()?();
        known(&self.disks.read())
    }

    /// Sets what [`DiskSet::try_get`] calls for a disk beyond the table (once).
    pub fn on_unknown_disk(&self, learn: Box<dyn Fn() + Send + Sync>) {
        let _ = self.unknown.set(learn);
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

    pub fn failure_group(&self, disk: DiskIndex) -> i32 {
        self.disks
            .read()
            .get(usize::from(disk))
            .map_or(0, |d| d.failure_group)
    }

    /// Sets each disk's failure group from the descriptor.
    pub fn set_failure_groups(&self, groups: impl IntoIterator<Item = (DiskIndex, i32)>) {
        let mut disks = self.disks.write();
        for (disk, fg) in groups {
            if let Some(d) = disks.get_mut(usize::from(disk)) {
                d.failure_group = fg;
            }
        }
    }

    pub fn is_down(&self, disk: DiskIndex) -> bool {
        self.disks
            .read()
            .get(usize::from(disk))
            .is_some_and(|d| d.down)
    }

    /// Marks a disk down or up; returns whether that changed anything.
    pub fn set_down(&self, disk: DiskIndex, down: bool) -> bool {
        let mut disks = self.disks.write();
        match disks.get_mut(usize::from(disk)) {
            Some(d) if d.down != down => {
                d.down = down;
                true
            }
            _ => false,
        }
    }

    /// Counts a read of `disk` that took `ns` into its moving average (weight 1/8).
    pub fn note_read(&self, disk: DiskIndex, ns: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        if let Some(d) = self.disks.read().get(usize::from(disk)) {
            let old = d.read_ns.load(Relaxed);
            let new = if old == 0 {
                ns.max(1)
            } else {
                (old * 7 + ns) / 8
            };
            d.read_ns.store(new.max(1), Relaxed);
        }
    }

    /// The moving average of `disk`'s read latency in nanoseconds (0: not measured yet).
    pub fn read_ns(&self, disk: DiskIndex) -> u64 {
        self.disks
            .read()
            .get(usize::from(disk))
            .map_or(0, |d| d.read_ns.load(std::sync::atomic::Ordering::Relaxed))
    }

    pub fn is_remote(&self, disk: DiskIndex) -> bool {
        self.disks
            .read()
            .get(usize::from(disk))
            .is_some_and(|d| d.remote)
    }

    /// Says which disks this node reaches through NSD servers, by NSD name.
    pub fn set_remote(&self, names: &[String]) {
        for d in self.disks.write().iter_mut() {
            d.remote = names.contains(&d.name);
        }
    }

    /// Every disk's device by index, `None` for those that are down (descriptor writes).
    pub fn up(&self) -> Vec<Option<Arc<dyn BlockDevice>>> {
        self.disks
            .read()
            .iter()
            .map(|d| (!d.down).then(|| Arc::clone(&d.device)))
            .collect()
    }

    /// Disks that are down, by index.
    pub fn down_disks(&self) -> Vec<DiskIndex> {
        self.disks
            .read()
            .iter()
            .enumerate()
            .filter(|(_, d)| d.down)
            .map(|(i, _)| i as DiskIndex)
            .collect()
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
            failure_group: 0,
            down: false,
            read_ns: Default::default(),
            remote: false,
        }));
        DiskIndex::try_from(first).expect("bounded by DISKS_MAX")
    }

    /// Retires the slot of a deleted disk: its device is let go (and the NSD may be reused
    /// elsewhere), and any later I/O through the slot fails.
    pub fn retire(&self, disk: DiskIndex) {
        let mut disks = self.disks.write();
        let d = &mut disks[usize::from(disk)];
        d.device = Retired::device(disk);
        d.name = String::new();
        d.discard = false;
    }

    /// Forgets the disks from `first` on: a `disk add` whose descriptor never became
    /// durable.
    pub fn truncate(&self, first: DiskIndex) {
        self.disks.write().truncate(usize::from(first));
    }
}
