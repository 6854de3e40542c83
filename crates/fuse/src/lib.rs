//! Layer 5 of Tessera: the FUSE adapter.
//!
//! This layer only translates: kernel requests become `tessera_fs::FileSystem` calls and
//! `FsError`s become errnos. Permission checks are left to the kernel (`default_permissions`),
//! exactly as for a local file system, so every user of the machine can use the mount.

mod adapter;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fuser::{BackgroundSession, Config, MountOption, SessionACL};
use tessera_fs::FileSystem;

/// Request threads per mount unless `TESSERA_FUSE_THREADS` says otherwise.
pub const FUSE_THREADS_DEFAULT: usize = 4;

/// How a file system is exposed to the kernel.
#[derive(Clone, Debug)]
pub struct FuseOptions {
    /// Shown as the source in /proc/mounts.
    pub fs_name: String,
    /// Let every user of the machine use the mount (`allow_other`).
    pub allow_other: bool,
    /// Threads reading requests from the kernel; requests on different threads run in
    /// parallel.
    pub threads: usize,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            fs_name: "tessera".into(),
            allow_other: true,
            threads: 4,
        }
    }
}

/// A live kernel mount. Dropping it without [`FuseMount::unmount`] also unmounts.
pub struct FuseMount {
    session: Option<BackgroundSession>,
    mountpoint: PathBuf,
}

impl std::fmt::Debug for FuseMount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FuseMount({})", self.mountpoint.display())
    }
}

impl FuseMount {
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Unmounts and waits for the request threads to finish.
    pub fn unmount(mut self) -> io::Result<()> {
        match self.session.take() {
            Some(s) => s.umount_and_join(),
            None => Ok(()),
        }
    }
}

/// Mounts `fs` at `mountpoint`.
pub fn mount(fs: Arc<FileSystem>, mountpoint: &Path, opts: &FuseOptions) -> io::Result<FuseMount> {
    cleanup_stale_mount(mountpoint)?;
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(opts.fs_name.clone()),
        MountOption::Subtype("tessera".into()),
        MountOption::DefaultPermissions,
        MountOption::RW,
        MountOption::Dev,
        MountOption::Suid,
    ];
    if opts.allow_other {
        config.acl = SessionACL::All;
    }
    config.n_threads = Some(opts.threads.max(1));
    let block_kib = u64::from(fs.descriptor().block_size) >> 10;
    config.clone_fd = true;
    let session =
        fuser::spawn_mount(adapter::TesseraFuse::new(fs), mountpoint, &config).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "mounting at {}: {e}; check that /dev/fuse exists",
                    mountpoint.display()
                ),
            )
        })?;
    set_read_ahead(
        mountpoint,
        (2 * block_kib).clamp(READ_AHEAD_KIB_MIN, READ_AHEAD_KIB_MAX),
    );
    Ok(FuseMount {
        session: Some(session),
        mountpoint: mountpoint.to_path_buf(),
    })
}

const READ_AHEAD_KIB_MIN: u64 = 1024;
const READ_AHEAD_KIB_MAX: u64 = 16 * 1024;

/// The kernel gives a FUSE mount 128 KiB of readahead, far less than one file-system block;
/// sequential reads need a few blocks in flight to keep every NSD busy (GPFS prefetches
/// for the same reason).
fn set_read_ahead(mountpoint: &Path, kib: u64) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(mountpoint) else {
        return;
    };
    let dev = meta.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let knob = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    if let Err(e) = std::fs::write(&knob, kib.to_string()) {
        tracing::warn!("cannot raise readahead through {knob}: {e}");
    }
}

/// Detaches a FUSE mount left at `mountpoint` by a daemon that died ("Transport endpoint is
/// not connected"). Returns whether one was found.
pub fn cleanup_stale_mount(mountpoint: &Path) -> io::Result<bool> {
    let Ok(canonical) = mountpoint
        .canonicalize()
        .or_else(|_| Ok::<_, io::Error>(mountpoint.into()))
    else {
        return Ok(false);
    };
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let target = canonical.to_string_lossy().to_string();
    let mounted = mountinfo.lines().any(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let fstype = line
            .split(" - ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .unwrap_or("");
        fields.get(4).is_some_and(|m| unescape(m) == target) && fstype.starts_with("fuse")
    });
    if !mounted {
        return Ok(false);
    }
    let path = std::ffi::CString::new(target.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "mount point contains NUL"))?;
    // SAFETY: path is a valid NUL-terminated string.
    let rc = unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("detaching stale mount {target}: {e}; try `fusermount3 -uz {target}`"),
        ));
    }
    tracing::warn!("detached stale FUSE mount at {target}");
    Ok(true)
}

/// /proc/self/mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}
