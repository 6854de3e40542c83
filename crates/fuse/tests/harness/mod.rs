//! A real kernel mount of a Tessera file system on file-backed drives, unmounted on drop.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tessera_drive::{BlockDevice, FileDrive};
use tessera_fs::{DiskSpec, FileSystem, FormatOptions};
use tessera_nsd::descriptor::{write_descriptor, NsdDescriptor};
use tessera_nsd::{DiskUsage, NsdId};

pub struct Mounted {
    pub dir: tempfile::TempDir,
    pub fs: Option<Arc<FileSystem>>,
    mount: Option<tessera_fuse::FuseMount>,
    disks: Vec<NsdId>,
}

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
        let dir = tempfile::Builder::new()
            .prefix("tessera-fuse")
            .tempdir()
            .unwrap();
        // The scratch area must be reachable by the unprivileged user of permission tests.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let mut ids = Vec::new();
        let mut specs = Vec::new();
        for i in 0..disk_count {
            let path = dir.path().join(format!("d{i}"));
            std::fs::File::create(&path)
                .unwrap()
                .set_len(disk_bytes)
                .unwrap();
            let dev: Arc<dyn BlockDevice> = Arc::new(FileDrive::open(&path).unwrap());
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
            mount: None,
            disks: ids,
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
                let dev: Arc<dyn BlockDevice> =
                    Arc::new(FileDrive::open(&self.dir.path().join(format!("d{i}"))).unwrap());
                (*id, dev)
            })
            .collect()
    }

    pub fn mount(&mut self) {
        std::fs::create_dir_all(self.mnt()).unwrap();
        let fs = FileSystem::mount(self.devices()).unwrap();
        let m = tessera_fuse::mount(fs.clone(), &self.mnt(), &Default::default()).unwrap();
        self.fs = Some(fs);
        self.mount = Some(m);
    }

    pub fn unmount(&mut self) {
        if let Some(m) = self.mount.take() {
            m.unmount().unwrap();
        }
        if let Some(fs) = self.fs.take() {
            fs.unmount().unwrap();
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
        let _ = tessera_fuse::cleanup_stale_mount(&self.mnt());
    }
}

pub fn small_fs() -> FormatOptions {
    FormatOptions {
        block_size: 256 << 10,
        log_bytes: 16 << 20,
        ..Default::default()
    }
}
