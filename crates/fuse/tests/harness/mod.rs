//! A real kernel mount of a Tessera file system on file-backed drives or on vdisks,
//! unmounted on drop. The including test file picks the backend with `BACKEND`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tessera_drive::BlockDevice;
use tessera_fs::{DiskSpec, FileSystem, FormatOptions};
use tessera_nsd::descriptor::{write_descriptor, NsdDescriptor};
use tessera_nsd::{DiskUsage, NsdId};
use tessera_testkit::open_drive_waiting;
use tessera_vdisk::{Code, DaOptions, DeclusteredArray, PdiskSpec, VdiskSize};

/// What the NSDs of the test file system are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// One sparse file per NSD.
    Drives,
    /// One 8+2p vdisk per NSD, carved from one declustered array of 12 file-backed pdisks
    /// in 6 enclosures, with the file-system block size as the vdisk block size.
    Vdisks,
    /// File-backed drives, mounted through a client-only `FileSystem` whose every
    /// metadata request goes, encoded, to an owner mounted beside it (not through FUSE):
    /// what a node that does not own the file system runs, with a kernel that caches
    /// nothing.
    Client,
    /// File-backed drives, mounted by the owner as in a cluster where other nodes mount
    /// the file system too (`KernelCache::Shared`): writes take data tokens and bypass the
    /// page cache, locks and appends go through the owner's lock table, reads keep the
    /// page cache.
    Shared,
}

const PDISKS: usize = 12;
const ENCLOSURES: usize = 6;

pub struct Mounted {
    pub dir: tempfile::TempDir,
    pub fs: Option<Arc<FileSystem>>,
    /// With `Backend::Client`: the mount that owns the metadata `fs` is a client of.
    owner: Option<Arc<FileSystem>>,
    mount: Option<tessera_fuse::FuseMount>,
    disks: Vec<NsdId>,
    array: Option<Arc<DeclusteredArray>>,
}

/// These tests serve the mount from the process that uses it. A test thread that faults
/// on a file mapped from the mount holds its address space's lock (for reading) until the
/// file system answers; a serving thread that maps, unmaps or re-protects memory meanwhile
/// needs that lock for writing, and the two wait for each other for ever (seen once in
/// `posix_vdisk`: a FUSE ring thread in `mprotect` growing its malloc arena). A separate
/// daemon, as in production, never meets this. So every mapping of a file on the mount is
/// made and touched by a child process (`in_child`); and, should a test ever fault on one
/// here again, malloc is told to grow in large steps, to keep large blocks in its arenas
/// instead of mapping each, and never to give memory back, so serving threads almost never
/// change the address space after their first requests.
fn keep_the_heap_still() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: mallopt only changes glibc's allocation parameters.
        unsafe {
            libc::mallopt(libc::M_TOP_PAD, 64 << 20);
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        }
    });
}

/// Every access to a file mapped from the mount goes through a child process: a page
/// fault on such a mapping holds the faulting process's address-space lock until the file
/// system answers, and these tests serve the file system from their own process (see
/// `keep_the_heap_still`), so no test thread may take such a fault itself.
pub use tessera_testkit::in_child;

/// True when this process can mount FUSE file systems (root and /dev/fuse).
pub fn can_mount() -> bool {
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !Path::new("/dev/fuse").exists() {
        eprintln!("skipping: FUSE tests need root and /dev/fuse");
        return false;
    }
    true
}

impl Mounted {
    pub fn new(disk_count: usize, disk_bytes: u64, opts: FormatOptions) -> Mounted {
        keep_the_heap_still();
        let dir = tessera_testkit::scratch_dir("tessera-fuse");
        let array = match crate::BACKEND {
            Backend::Drives | Backend::Client | Backend::Shared => None,
            Backend::Vdisks => Some(create_array(dir.path(), disk_count, disk_bytes, &opts)),
        };
        let mut ids = Vec::new();
        let mut specs = Vec::new();
        for i in 0..disk_count {
            let dev: Arc<dyn BlockDevice> = match &array {
                None => {
                    let path = dir.path().join(format!("d{i}"));
                    std::fs::File::create(&path)
                        .unwrap()
                        .set_len(disk_bytes)
                        .unwrap();
                    Arc::new(open_drive_waiting(&path).unwrap())
                }
                Some(da) => da.vdisk(&format!("vd{i}")).unwrap(),
            };
            let disk_bytes = dev.size_bytes();
            let id = NsdId::random();
            let nd = NsdDescriptor {
                id,
                name: format!("n{i}"),
                device_bytes: disk_bytes,
                created_unix: 0,
                cluster_id: [0; 16],
            };
            write_descriptor(dev.as_ref(), &nd).unwrap();
            ids.push(id);
            specs.push(DiskSpec {
                nsd_name: format!("n{i}"),
                nsd_id: id,
                usage: DiskUsage::DataAndMetadata,
                failure_group: i as i32,
                pool: "system".into(),
                device: dev,
            });
        }
        tessera_fs::format(specs, &opts, &mut |_| {}).unwrap();
        let mut m = Mounted {
            dir,
            fs: None,
            owner: None,
            mount: None,
            disks: ids,
            array,
        };
        m.mount();
        m
    }

    pub fn mnt(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt().join(rel)
    }

    fn devices(&self) -> Vec<(NsdId, Arc<dyn BlockDevice>)> {
        self.disks
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let dev: Arc<dyn BlockDevice> = match &self.array {
                    None => Arc::new(
                        open_drive_waiting(&self.dir.path().join(format!("d{i}"))).unwrap(),
                    ),
                    Some(da) => da.vdisk(&format!("vd{i}")).unwrap(),
                };
                (*id, dev)
            })
            .collect()
    }

    pub fn mount(&mut self) {
        std::fs::create_dir_all(self.mnt()).unwrap();
        let mut fs = FileSystem::mount(self.devices()).unwrap();
        let mut cache = tessera_fuse::KernelCache::Private;
        if crate::BACKEND == Backend::Client {
            // As another node: the owner lets it keep block-map views and revokes them.
            let channel = tessera_fs::InProcessNode {
                owner: Arc::downgrade(&fs),
                origin: tessera_fs::locks::Origin {
                    node: 2,
                    incarnation: 1,
                },
            };
            let client = FileSystem::mount_client(self.devices(), Box::new(channel)).unwrap();
            let held_by = Arc::downgrade(&client);
            fs.on_read_revoke(Box::new(move |_, inos| {
                if let Some(client) = held_by.upgrade() {
                    client.serve_metanode_request(&tessera_fs::Fence::drop_held(inos));
                }
            }));
            self.owner = Some(std::mem::replace(&mut fs, client));
            cache = tessera_fuse::KernelCache::Shared;
        }
        if crate::BACKEND == Backend::Shared {
            cache = tessera_fuse::KernelCache::Shared;
        }
        // The vdisk run of the POSIX set also covers the io_uring transport, the drive run
        // the classic loop.
        let opts = tessera_fuse::FuseOptions {
            uring: crate::BACKEND == Backend::Vdisks,
            cache,
            ..Default::default()
        };
        let m = tessera_fuse::mount(fs.clone(), &self.mnt(), &opts).unwrap();
        self.fs = Some(fs);
        self.mount = Some(m);
    }

    pub fn unmount(&mut self) {
        if let Some(m) = self.mount.take() {
            // Other tests of this binary spawn processes (setpriv); between fork and exec
            // such a child briefly holds copies of every open descriptor, this test's too,
            // and the kernel then calls the mount busy. Wait that window out.
            let target = std::ffi::CString::new(self.mnt().as_os_str().as_encoded_bytes())
                .expect("no NUL in path");
            for _ in 0..200 {
                // SAFETY: target is a valid NUL-terminated path.
                if unsafe { libc::umount2(target.as_ptr(), 0) } == 0
                    || std::io::Error::last_os_error().raw_os_error() != Some(libc::EBUSY)
                {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            m.unmount().unwrap();
        }
        if let Some(fs) = self.fs.take() {
            fs.unmount().unwrap();
        }
        if let Some(owner) = self.owner.take() {
            owner.unmount().unwrap();
        }
    }

    pub fn remount(&mut self) {
        self.unmount();
        self.mount();
    }

    /// Offline fsck; the file system must be unmounted.
    pub fn fsck(&self) -> tessera_fs::FsckReport {
        tessera_fs::fsck(self.devices(), false).unwrap()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(m) = self.mount.take() {
            let _ = m.unmount();
        }
        if let Some(fs) = self.fs.take() {
            let _ = fs.unmount();
        }
        if let Some(owner) = self.owner.take() {
            let _ = owner.unmount();
        }
        let _ = tessera_fuse::cleanup_stale_mount(&self.mnt());
        if let Some(da) = self.array.take() {
            let _ = da.close();
        }
    }
}

/// A declustered array with one 8+2p vdisk `vd{i}` of `disk_bytes` per NSD.
fn create_array(
    dir: &Path,
    disk_count: usize,
    disk_bytes: u64,
    opts: &FormatOptions,
) -> Arc<DeclusteredArray> {
    // Room for the data, the parity (10/8), one pdisk's worth of spare, strip headers and
    // the array's metadata.
    let pdisk_bytes =
        (disk_count as u64 * disk_bytes * 10 / 8 / (PDISKS as u64 - 1)) * 5 / 4 + (64 << 20);
    let pdisks: Vec<PdiskSpec> = (0..PDISKS)
        .map(|i| {
            let device = dir.join(format!("pdisk{i}"));
            std::fs::File::create(&device)
                .unwrap()
                .set_len(pdisk_bytes / 4096 * 4096)
                .unwrap();
            PdiskSpec {
                name: format!("p{i}"),
                device,
                enclosure: format!("e{}", i % ENCLOSURES),
                slot: (i / ENCLOSURES) as u32 + 1,
            }
        })
        .collect();
    let da = DeclusteredArray::create("da1", &pdisks, DaOptions::default()).unwrap();
    let code = Code::ReedSolomon { k: 8, m: 2 };
    for i in 0..disk_count {
        da.create_vdisk(
            &format!("vd{i}"),
            code,
            u64::from(opts.block_size),
            VdiskSize::Bytes(disk_bytes),
        )
        .unwrap();
    }
    da
}

pub fn small_fs() -> FormatOptions {
    FormatOptions {
        block_size: 256 << 10,
        log_bytes: 16 << 20,
        ..Default::default()
    }
}
