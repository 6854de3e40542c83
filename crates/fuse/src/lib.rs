//! Layer 5 of Tessera: the FUSE adapter.
//!
//! This layer only translates: kernel requests become `tessera_fs::FileSystem` calls and
//! `FsError`s become errnos. Every user of the machine can use the mount (`allow_other`).
//! POSIX permissions and POSIX ACLs are checked by the kernel (`default_permissions`,
//! FUSE_POSIX_ACL), which alone sees the opens of FIFOs and device nodes and the walks
//! through cached names, and again by the file system (`tessera_fs::access`) before each
//! operation with the caller's uid, gid and groups, with the same answers as a local file
//! system (see `adapter`).
//!
//! It speaks the kernel's FUSE protocol itself (`kernel`): over the classic /dev/fuse
//! read/write loop by default, or over FUSE-over-io_uring (one ring queue per CPU, served by
//! threads pinned to that CPU, so a request never wakes another CPU) when
//! [`FuseOptions::uring`] asks for it (`TESSERA_FUSE_URING=1`) and the kernel offers it.
//! Rings are not the default because they tie a request to the CPU that issued it: a
//! single-stream reader's readahead then runs on one CPU only (measured: 477–500 MB/s
//! against 580–619 MB/s with the classic loop), while metadata rates are the same on an
//! idle machine and better with rings only on a busy one (bench/RESULTS.md).

mod adapter;
mod kernel;

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use kernel::session::{Session, SessionOptions, Transport};
use tessera_fs::FileSystem;

/// How long another node's metadata request waits for this node's kernel to drop the
/// cached copies it changed.
const REMOTE_CHANGE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long another node's metadata request waits for this node's kernel to drop the names
/// it changed before it makes every cached name invalid instead (`FUSE_NOTIFY_INC_EPOCH`,
/// which takes no lock). Dropping one name takes its directory's lock, which a request of
/// this node on that directory holds while it waits for the daemon, and that request may
/// wait for the very node whose change waits here (a rename into the directory waiting for
/// the cluster's rename lock, held by a node moving a directory through this owner): a
/// cycle only the bound broke, two seconds per turn, with the old name visible here
/// meanwhile.
const REMOTE_NAME_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// Request threads per mount unless `TESSERA_FUSE_THREADS` says otherwise.
pub const FUSE_THREADS_DEFAULT: usize = 8;

/// How a file system is exposed to the kernel.
#[derive(Clone, Debug)]
pub struct FuseOptions {
    /// Shown as the source in /proc/mounts.
    pub fs_name: String,
    /// Let every user of the machine use the mount (`allow_other`).
    pub allow_other: bool,
    /// Threads reading requests from the kernel over /dev/fuse; requests on different
    /// threads run in parallel. With io_uring, the rings have their own threads
    /// (`RING_THREADS_PER_QUEUE` per CPU) and one /dev/fuse thread remains.
    pub threads: usize,
    /// Serve the mount over FUSE-over-io_uring when the kernel offers it (default: the
    /// `TESSERA_FUSE_URING=1` environment setting; otherwise the classic loop).
    pub uring: bool,
    /// What the kernel may cache.
    pub cache: KernelCache,
}

/// What the kernel may cache of a mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelCache {
    /// Names and attributes for a minute, file pages, and small writes gathered: by the
    /// daemon (`tessera_fs` write-behind; writable opens pass writes straight to it), or on
    /// a kernel without `DIRECT_IO_ALLOW_MMAP` in the page cache (`FUSE_WRITEBACK_CACHE`).
    /// For the only node that mounts the file system: gathered writes are seen by this
    /// node alone, and with a writeback cache the kernel trusts its own size and times of
    /// a regular file over the file system's for as long as it caches the inode.
    Private,
    /// For a mount in a cluster where other nodes mount the file system too: writes go
    /// through to the file system as they are made, so that the kernel takes sizes and
    /// times from it. The kernel keeps names, attributes and pages of the inodes this
    /// node's own metanode serves (it drops from this kernel's caches what other nodes
    /// change), and names and attributes (not pages) of others' inodes while this mount
    /// holds them under their owners' read tokens (a revocation drops them from the kernel
    /// before the change it is for returns).
    Shared,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            fs_name: "tessera".into(),
            allow_other: true,
            threads: std::env::var("TESSERA_FUSE_THREADS")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .filter(|&n: &usize| (1..=256).contains(&n))
                .unwrap_or(FUSE_THREADS_DEFAULT),
            uring: std::env::var("TESSERA_FUSE_URING").is_ok_and(|v| v.trim() == "1"),
            cache: KernelCache::Private,
        }
    }
}

/// A live kernel mount. Dropping it without [`FuseMount::unmount`] also unmounts.
pub struct FuseMount {
    session: Option<Session>,
    /// As the caller named it.
    mountpoint: PathBuf,
    /// Canonical, as the kernel knows it; what umount2 is given.
    target: PathBuf,
    /// The mount's device number: names its connection under /sys/fs/fuse/connections.
    dev: u64,
    /// Where the file system sends what other nodes changed; emptied before the session's
    /// threads are joined, so that the notifier thread sees its last sender gone.
    invalidations: Arc<Mutex<Option<Notifiers>>>,
}

/// The ways to this mount's kernel for what other nodes changed: inodes (and every name at
/// once), and single names, each written by a thread of its own.
#[derive(Clone)]
struct Notifiers {
    notifier: kernel::notify::Notifier,
    names: kernel::notify::Notifier,
}

impl std::fmt::Debug for FuseMount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FuseMount({})", self.mountpoint.display())
    }
}

/// How busy a mount's FUSE connection is: its queue depth, for metrics and `diag`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FuseQueue {
    /// Requests the kernel holds for this mount, queued for the daemon or being served
    /// (fusectl's `waiting`); `None` where fusectl cannot be mounted.
    pub waiting: Option<u64>,
    /// Requests the daemon's threads are serving now.
    pub active: u64,
    /// Requests answered since the mount.
    pub served: u64,
}

impl FuseMount {
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The connection's queue now; reads one fusectl file.
    pub fn queue(&self) -> FuseQueue {
        let Some(session) = &self.session else {
            return FuseQueue::default();
        };
        FuseQueue {
            waiting: kernel::mount::waiting_requests(self.dev),
            active: session.counters.active.load(Ordering::Relaxed),
            served: session.counters.served.load(Ordering::Relaxed),
        }
    }

    /// Unmounts and waits for the request threads to finish.
    pub fn unmount(mut self) -> io::Result<()> {
        self.shut_down()
    }

    fn shut_down(&mut self) -> io::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        drop(
            self.invalidations
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        match kernel::mount::unmount(&self.target, 0) {
            // EINVAL: no longer mounted (someone else unmounted it); the threads have seen
            // the connection end.
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => {
                // Busy: detach it and end the connection, so no thread is left waiting
                // on a mount nobody can reach.
                let _ = kernel::mount::unmount(&self.target, libc::MNT_DETACH);
                if let Err(abort) = kernel::mount::abort_connection(self.dev) {
                    tracing::error!(
                        "{}: cannot abort the FUSE connection ({abort}); its threads stay",
                        self.mountpoint.display()
                    );
                    std::mem::forget(session);
                    return Err(e);
                }
                session.join();
                return Err(e);
            }
        }
        session.join();
        Ok(())
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if let Err(e) = self.shut_down() {
            tracing::error!("unmounting {}: {e}", self.mountpoint.display());
        }
    }
}

/// Whether to try FUSE-over-io_uring: only when asked. When the kernel supports it but its
/// `enable_uring` switch is off and we are root, it is turned on (it only lets FUSE
/// servers that ask for rings use them).
fn want_uring(asked: bool) -> bool {
    if !asked {
        return false;
    }
    const KNOB: &str = "/sys/module/fuse/parameters/enable_uring";
    match std::fs::read_to_string(KNOB) {
        Ok(v) if v.trim() == "Y" => true,
        Ok(_) => {
            // SAFETY: geteuid cannot fail.
            if unsafe { libc::geteuid() } != 0 {
                return false;
            }
            match std::fs::write(KNOB, b"Y") {
                Ok(()) => {
                    tracing::info!("FUSE: enabled FUSE-over-io_uring ({KNOB} = Y)");
                    true
                }
                Err(e) => {
                    tracing::info!("FUSE: cannot enable io_uring through {KNOB}: {e}");
                    false
                }
            }
        }
        // Kernel without CONFIG_FUSE_IO_URING.
        Err(_) => false,
    }
}

/// Lets one request carry `max_write` bytes from a buffer that is not page-aligned (which
/// spans one page more): most programs read into malloc'd buffers, 16 bytes past a page
/// boundary, and the kernel split each of their 1 MiB reads into a 1 MiB-less-a-page and a
/// one-page request. The kernel caps every mount's pages per request at
/// `fs.fuse.max_pages_limit` (256 by default); as root we raise it just enough, and log
/// it. It only allows larger requests; other FUSE mounts keep what they negotiated.
fn allow_unaligned_full_requests() {
    const KNOB: &str = "/proc/sys/fs/fuse/max_pages_limit";
    let need = kernel::session::max_pages(adapter::MAX_REQUEST_BYTES);
    let Ok(current) = std::fs::read_to_string(KNOB) else {
        return; // Older kernel: the limit is fixed at 256.
    };
    let Ok(current) = current.trim().parse::<u32>() else {
        return;
    };
    // SAFETY: geteuid cannot fail.
    if current >= need || unsafe { libc::geteuid() } != 0 {
        return;
    }
    match std::fs::write(KNOB, need.to_string()) {
        Ok(()) => tracing::info!("FUSE: raised {KNOB} from {current} to {need}"),
        Err(e) => tracing::info!("FUSE: cannot raise {KNOB} to {need}: {e}"),
    }
}

/// Mounts `fs` at `mountpoint`.
pub fn mount(fs: Arc<FileSystem>, mountpoint: &Path, opts: &FuseOptions) -> io::Result<FuseMount> {
    cleanup_stale_mount(mountpoint)?;
    let target = mountpoint.canonicalize()?;
    let uring = want_uring(opts.uring);
    allow_unaligned_full_requests();
    let dev = kernel::mount::open_dev().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "mounting at {}: {e}; check that /dev/fuse exists",
                target.display()
            ),
        )
    })?;
    let cfg = kernel::mount::MountConfig {
        fs_name: &opts.fs_name,
        subtype: "tessera",
        allow_other: opts.allow_other,
        max_read: adapter::MAX_REQUEST_BYTES,
    };
    kernel::mount::mount(std::os::fd::AsRawFd::as_raw_fd(&dev), &target, &cfg)?;
    let block_kib = u64::from(fs.descriptor().block_size) >> 10;
    let session_opts = SessionOptions {
        classic_threads: opts.threads.max(1),
        uring,
    };
    // What other nodes change through this node's metanode leaves the kernel's caches
    // (`KernelCache::Kept`). The kernel checks permissions on cached names itself
    // (`default_permissions`), so this node's own changes need no notification.
    // Names go on a queue and thread of their own (see `REMOTE_NAME_WAIT`): one waiting
    // for a directory's lock holds up no inode's invalidation.
    let (notifier, inode_queue) = kernel::notify::channel();
    let (names, name_queue) = kernel::notify::channel();
    let invalidations = Arc::new(Mutex::new(Some(Notifiers { notifier, names })));
    let sender = Arc::clone(&invalidations);
    let handler = Arc::new(adapter::TesseraFuse::new(Arc::clone(&fs), opts.cache));
    let kernel = Arc::downgrade(&handler);
    fs.on_remote_change(Box::new(move |changes| {
        let Some(Notifiers { notifier, names }) =
            sender.lock().unwrap_or_else(|e| e.into_inner()).clone()
        else {
            return;
        };
        let mut named = false;
        for change in changes {
            match change {
                tessera_fs::CacheChange::Inode(ino) => notifier.inval_inode(ino),
                tessera_fs::CacheChange::Entry { parent, name } => {
                    named = true;
                    names.inval_entries(parent, vec![name])
                }
                tessera_fs::CacheChange::AllNames => notifier.inc_epoch(),
            }
        }
        // The other node's operation returns only once this kernel dropped its copies. A
        // bound, not a hang: the kernel may hold a page a local request is reading.
        let epochs = kernel.upgrade().is_some_and(|k| k.knows_epochs());
        let names_written = !named
            || names.wait_written(if epochs {
                REMOTE_NAME_WAIT
            } else {
                REMOTE_CHANGE_WAIT
            });
        if !names_written && epochs {
            // A name's directory is locked by a request here: every name is made invalid
            // instead, which the kernel does at once (the name's own invalidation lands
            // later, harmlessly).
            notifier.inc_epoch();
        }
        if !notifier.wait_written(REMOTE_CHANGE_WAIT) || (!names_written && !epochs) {
            tracing::warn!(
                "FUSE: the kernel took more than {REMOTE_CHANGE_WAIT:?} to drop what another \
                 node changed; a read here may see the old copy for a moment"
            );
        }
    }));
    let queues = vec![inode_queue, name_queue];
    let session = match Session::start(dev, handler, &session_opts, queues) {
        Ok(s) => s,
        Err(e) => {
            let _ = kernel::mount::unmount(&target, libc::MNT_DETACH);
            return Err(e);
        }
    };
    tracing::info!(
        "FUSE: {} served over {}",
        target.display(),
        match session.transport {
            Transport::Uring => "io_uring",
            Transport::Classic => "/dev/fuse",
        }
    );
    let dev = std::fs::metadata(&target).map(|m| m.dev()).unwrap_or(0);
    set_read_ahead(
        dev,
        (2 * block_kib).clamp(READ_AHEAD_KIB_MIN, READ_AHEAD_KIB_MAX),
    );
    Ok(FuseMount {
        session: Some(session),
        mountpoint: mountpoint.to_path_buf(),
        target,
        dev,
        invalidations,
    })
}

const READ_AHEAD_KIB_MIN: u64 = 1024;
const READ_AHEAD_KIB_MAX: u64 = 16 * 1024;

/// The kernel gives a FUSE mount 128 KiB of readahead, far less than one file-system block;
/// sequential reads need a few blocks in flight to keep every NSD busy (GPFS prefetches
/// for the same reason).
fn set_read_ahead(dev: u64, kib: u64) {
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
