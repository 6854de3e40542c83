use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::mem::ManuallyDrop;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::{check_io, BlockDevice, SECTOR_BYTES};

/// What identifies a device whatever path reaches it: the device number of a block device,
/// or the file system and inode of a regular file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum DeviceKey {
    Block(u64),
    File(u64, u64),
}

impl DeviceKey {
    fn of(meta: &std::fs::Metadata) -> DeviceKey {
        if meta.file_type().is_block_device() {
            DeviceKey::Block(meta.rdev())
        } else {
            DeviceKey::File(meta.dev(), meta.ino())
        }
    }
}

/// A device file this process holds exclusively (O_EXCL for a block device, an advisory
/// `flock` for a regular file). Every [`FileDrive`] of the process that opens the same
/// device shares it: a second exclusive open from the same process would be refused by the
/// kernel just like one from another process, and one daemon legitimately opens a device
/// more than once (a mounted NSD that `nsd discover` reads again, a pdisk that an array
/// reopens).
#[derive(Debug)]
struct Claim {
    key: DeviceKey,
    file: ManuallyDrop<File>,
    /// Something was written or deallocated through this process's descriptor since its
    /// last flush began. Shared by every handle of the device in the process, because a
    /// flush must cover what any of them wrote (an NVMe/TCP flush through one controller
    /// covers writes through the others).
    unflushed: std::sync::atomic::AtomicBool,
}

fn claims() -> &'static Mutex<HashMap<DeviceKey, Weak<Claim>>> {
    static CLAIMS: OnceLock<Mutex<HashMap<DeviceKey, Weak<Claim>>>> = OnceLock::new();
    CLAIMS.get_or_init(Mutex::default)
}

impl Drop for Claim {
    fn drop(&mut self) {
        // Closing under the registry lock: an open racing with this drop must not find the
        // entry gone while the old descriptor (and its lock) still exists.
        let mut map = claims().lock().unwrap_or_else(|p| p.into_inner());
        if map.get(&self.key).is_some_and(|w| w.strong_count() == 0) {
            map.remove(&self.key);
        }
        // SAFETY: dropped exactly once, here; `file` is not used after.
        unsafe { ManuallyDrop::drop(&mut self.file) };
    }
}

/// The processes other than this one that have `path`'s device open, as (pid, command),
/// found through `/proc/*/fd`. Processes this one may not inspect are left out.
pub fn device_holders(path: &Path) -> Vec<(u32, String)> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Vec::new();
    };
    let key = DeviceKey::of(&meta);
    let me = std::process::id();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut holders = Vec::new();
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me || !holds(&entry.path().join("fd"), key) {
            continue;
        }
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        holders.push((pid, comm.trim().to_string()));
    }
    holders
}

fn holds(fd_dir: &Path, key: DeviceKey) -> bool {
    let Ok(fds) = std::fs::read_dir(fd_dir) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::metadata(fd.path()).is_ok_and(|m| {
            (m.file_type().is_block_device() || m.is_file()) && DeviceKey::of(&m) == key
        })
    })
}

fn busy_error(path: &Path) -> io::Error {
    let holders = device_holders(path);
    let by = if holders.is_empty() {
        String::from("another process")
    } else {
        holders
            .iter()
            .map(|(pid, comm)| format!("pid {pid} ({comm})"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    io::Error::new(
        io::ErrorKind::ResourceBusy,
        format!(
            "{}: device is in use, held by {by}; a drive is open in one Tessera daemon, \
             drive server or array at a time",
            path.display()
        ),
    )
}

fn open_error(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("{}: cannot open drive: {e}", path.display()),
    )
}

/// Opens `path` with O_DIRECT, falling back to buffered I/O for a regular file on a file
/// system without O_DIRECT (tmpfs on older kernels).
fn open_file(path: &Path, write: bool, extra_flags: i32, is_block: bool) -> io::Result<File> {
    let open = |direct: bool| {
        let mut options = OpenOptions::new();
        options.read(true).write(write);
        options.custom_flags(extra_flags | if direct { libc::O_DIRECT } else { 0 });
        options.open(path)
    };
    match open(true) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) && !is_block => open(false),
        other => other,
    }
}

/// Opens and claims the device, or shares this process's existing claim on it.
///
/// An exclusive claim is an advisory `flock(LOCK_EX)` on the device node or file, and for a
/// block device also O_EXCL, which the kernel enforces against every other exclusive
/// opener (a mounted kernel file system, md, LVM). A shared claim is `flock(LOCK_SH)`: the
/// controllers of one subsystem served by separate processes share their drives as the
/// controllers of a dual-controller array do, while any exclusive claim excludes them.
fn claim(path: &Path, meta: &std::fs::Metadata, exclusive: bool) -> io::Result<Arc<Claim>> {
    let key = DeviceKey::of(meta);
    let is_block = matches!(key, DeviceKey::Block(_));
    let mut map = claims().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(held) = map.get(&key).and_then(Weak::upgrade) {
        return Ok(held);
    }
    let excl = if is_block && exclusive {
        libc::O_EXCL
    } else {
        0
    };
    let file = match open_file(path, true, excl, is_block) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Err(busy_error(path)),
        Err(e) => return Err(open_error(path, e)),
    };
    let mode = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), mode | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(busy_error(path));
        }
        return Err(open_error(path, e));
    }
    let claim = Arc::new(Claim {
        key,
        file: ManuallyDrop::new(file),
        unflushed: std::sync::atomic::AtomicBool::new(true),
    });
    map.insert(key, Arc::downgrade(&claim));
    Ok(claim)
}

/// The open descriptor of a drive: claimed (shared within the process), or a read-only
/// probe that claims nothing.
#[derive(Debug)]
enum Handle {
    Claimed(Arc<Claim>),
    Probe(File),
}

impl Handle {
    fn file(&self) -> &File {
        match self {
            Handle::Claimed(c) => &c.file,
            Handle::Probe(f) => f,
        }
    }

    /// Notes a write or deallocation, once it returned (set before it, a flush racing with
    /// it could clear the mark and sync before the data arrived, and a later flush skip it).
    fn wrote(&self) {
        if let Handle::Claimed(c) = self {
            c.unflushed
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// Whether a flush has anything to make durable; clears the mark (a write after this
    /// sets it again for the next flush). A probe never writes.
    fn take_unflushed(&self) -> bool {
        match self {
            Handle::Claimed(c) => c.unflushed.swap(false, std::sync::atomic::Ordering::AcqRel),
            Handle::Probe(_) => false,
        }
    }
}

/// A drive backed by a local block device or a regular file, opened with O_DIRECT so that
/// the host page cache neither hides device errors nor double-buffers data.
///
/// [`FileDrive::open`] claims the device for this process (see [`Claim`]): another process
/// that opens it is refused with [`io::ErrorKind::ResourceBusy`] and an error naming the
/// holder's pid, so two daemons never write one drive.
#[derive(Debug)]
pub struct FileDrive {
    handle: Handle,
    path: PathBuf,
    name: String,
    size_bytes: u64,
    is_block_device: bool,
}

impl FileDrive {
    /// Opens `path` for reading and writing and claims it exclusively.
    ///
    /// Regular files on file systems without O_DIRECT support (tmpfs on older kernels) are
    /// opened buffered instead; [`BlockDevice::flush`] still makes them durable with fdatasync.
    pub fn open(path: &Path) -> io::Result<FileDrive> {
        let meta = drive_metadata(path)?;
        let handle = Handle::Claimed(claim(path, &meta, true)?);
        FileDrive::new(path, &meta, handle)
    }

    /// Opens `path` for reading and writing with a shared claim: other shared claimants
    /// (the other controllers of a multi-controller subsystem) may open it too, a process
    /// holding it exclusively (a daemon, an array) may not, and vice versa.
    pub fn open_shared(path: &Path) -> io::Result<FileDrive> {
        let meta = drive_metadata(path)?;
        let handle = Handle::Claimed(claim(path, &meta, false)?);
        FileDrive::new(path, &meta, handle)
    }

    /// Opens `path` read-only without claiming it, to read a label or descriptor of a
    /// device that may be in use elsewhere (device scans, naming the holder of a busy
    /// device). Writes fail.
    pub fn open_for_probe(path: &Path) -> io::Result<FileDrive> {
        let meta = drive_metadata(path)?;
        let file = open_file(path, false, 0, meta.file_type().is_block_device())
            .map_err(|e| open_error(path, e))?;
        FileDrive::new(path, &meta, Handle::Probe(file))
    }

    fn new(path: &Path, meta: &std::fs::Metadata, handle: Handle) -> io::Result<FileDrive> {
        let is_block_device = meta.file_type().is_block_device();
        let size_bytes = if is_block_device {
            block_device_bytes(handle.file())?
        } else {
            meta.len()
        };
        Ok(FileDrive {
            handle,
            path: path.to_path_buf(),
            name: path.display().to_string(),
            size_bytes: size_bytes - size_bytes % SECTOR_BYTES,
            is_block_device,
        })
    }

    /// The path the drive was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True when the drive is a block device rather than a regular file.
    pub fn is_block_device(&self) -> bool {
        self.is_block_device
    }

    fn file(&self) -> &File {
        self.handle.file()
    }
}

fn drive_metadata(path: &Path) -> io::Result<std::fs::Metadata> {
    let meta = std::fs::metadata(path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "{}: cannot open drive: {e}; check the device path",
                path.display()
            ),
        )
    })?;
    if !meta.file_type().is_block_device() && !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a block device or regular file", path.display()),
        ));
    }
    Ok(meta)
}

fn block_device_bytes(file: &File) -> io::Result<u64> {
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    let mut bytes: u64 = 0;
    // SAFETY: the ioctl writes one u64 into `bytes`.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut bytes) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(bytes)
}
/// `pwritev2(RWF_DSYNC)` until every byte is written.
fn write_all_dsync(file: &File, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
    while !buf.is_empty() {
        let iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: one iovec naming `buf`, which outlives the call; the kernel only reads it.
        let n = unsafe {
            libc::pwritev2(
                file.as_raw_fd(),
                &iov,
                1,
                offset as libc::off_t,
                libc::RWF_DSYNC,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "the device took no bytes",
            ));
        }
        buf = &buf[n as usize..];
        offset += n as u64;
    }
    Ok(())
}

impl BlockDevice for FileDrive {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_io(self, buf, offset)?;
        self.file()
            .read_exact_at(buf, offset)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: read at {offset}: {e}", self.name)))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_io(self, buf, offset)?;
        let r = self.file().write_all_at(buf, offset);
        // Even a failed write may have changed part of the range.
        self.handle.wrote();
        r.map_err(|e| io::Error::new(e.kind(), format!("{}: write at {offset}: {e}", self.name)))
    }

    /// One `pwritev2` with `RWF_DSYNC`: the kernel syncs the range (a FUA write to the
    /// device where the file system allows it), so these bytes need no flush and do not
    /// make the next flush sync.
    fn write_fua(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_io(self, buf, offset)?;
        let r = write_all_dsync(self.file(), buf, offset);
        if r.is_err() {
            // Part of the range may have changed without being durable.
            self.handle.wrote();
        }
        match r {
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                self.write_at(buf, offset)?;
                self.flush()
            }
            r => r.map_err(|e| {
                io::Error::new(e.kind(), format!("{}: write at {offset}: {e}", self.name))
            }),
        }
    }

    fn flush(&self) -> io::Result<()> {
        // Nothing written since the last flush began: nothing to make durable. A commit of
        // metadata only (a create, a rename) then costs the log's flush, not one per drive.
        if !self.handle.take_unflushed() {
            return Ok(());
        }
        // O_DIRECT bypasses the page cache but not the drive's volatile cache nor, for a
        // regular file, the host file system's block mapping; fdatasync covers both.
        self.file().sync_data().map_err(|e| {
            // Not durable: the next flush must try again.
            self.handle.wrote();
            io::Error::new(e.kind(), format!("{}: flush: {e}", self.name))
        })
    }

    fn direct_file(&self) -> Option<&File> {
        Some(self.file())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        crate::check_discard(self, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let fd = self.file().as_raw_fd();
        let rc = if self.is_block_device {
            // BLKDISCARD = _IO(0x12, 119): the range as two u64.
            const BLKDISCARD: libc::c_ulong = 0x1277;
            let range: [u64; 2] = [offset, len];
            // SAFETY: the ioctl reads two u64 from `range`, which outlives the call.
            unsafe { libc::ioctl(fd, BLKDISCARD, range.as_ptr()) }
        } else {
            // A hole in the backing file: its blocks go back to the host file system and the
            // range reads as zeros; the file keeps its size.
            let (Ok(off), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: discard range too large", self.name),
                ));
            };
            // SAFETY: plain syscall on a file descriptor we own.
            unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    off,
                    n,
                )
            }
        };
        let failed = (rc != 0).then(io::Error::last_os_error);
        self.handle.wrote();
        if let Some(e) = failed {
            return Err(io::Error::new(
                e.kind(),
                format!("{}: discard of {len} bytes at {offset}: {e}", self.name),
            ));
        }
        Ok(())
    }

    fn can_discard(&self) -> bool {
        true
    }

    // A hole reads as zeros; BLKDISCARD promises nothing about what the range reads.
    fn discard_zeroes(&self) -> bool {
        !self.is_block_device
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AlignedBuf;

    /// A flush syncs only after a write or deallocation through any handle of the device
    /// in this process (a write through one handle, a flush through another: synced).
    #[test]
    fn a_flush_has_work_only_after_a_write_through_any_handle() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let a = FileDrive::open(&path).unwrap();
        let b = FileDrive::open_shared(&path).unwrap_or_else(|_| FileDrive::open(&path).unwrap());
        a.flush().unwrap();
        assert!(!b.handle.take_unflushed(), "clean after a flush");
        a.write_at(&AlignedBuf::from_slice(&[7; 4096]), 0).unwrap();
        assert!(b.handle.take_unflushed(), "a's write is b's to flush");
        a.write_at(&AlignedBuf::from_slice(&[8; 4096]), 4096)
            .unwrap();
        b.flush().unwrap();
        assert!(!a.handle.take_unflushed());
        a.discard(0, 4096).unwrap();
        assert!(
            a.handle.take_unflushed(),
            "a hole punched is a change to flush"
        );
    }

    /// A write through (RWF_DSYNC) reads back, leaves the next flush nothing to sync, and
    /// is refused with the same alignment rules as a plain write.
    #[test]
    fn a_write_through_needs_no_flush() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let d = FileDrive::open(&path).unwrap();
        d.flush().unwrap();
        let data = AlignedBuf::from_slice(&[9; 3 * 4096]);
        d.write_fua(&data, 8192).unwrap();
        assert!(
            !d.handle.take_unflushed(),
            "durable already: nothing to sync"
        );
        let mut back = AlignedBuf::zeroed(3 * 4096);
        d.read_at(&mut back, 8192).unwrap();
        assert!(back[..] == data[..]);
        assert_eq!(
            std::fs::read(&path).unwrap()[8192..8192 + 3 * 4096],
            data[..]
        );
        assert!(d.write_fua(&data[..100], 0).is_err(), "unaligned length");
        assert!(d.write_fua(&data, 1 << 20).is_err(), "past the end");
    }

    #[test]
    fn write_read_roundtrip_and_alignment_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d0");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let drive = FileDrive::open(&path).unwrap();
        assert_eq!(drive.size_bytes(), 1 << 20);
        let data = AlignedBuf::from_slice(&[0xab; 8192]);
        drive.write_at(&data, 4096).unwrap();
        drive.flush().unwrap();
        let mut back = AlignedBuf::zeroed(8192);
        drive.read_at(&mut back, 4096).unwrap();
        assert_eq!(&back[..], &data[..]);
        let err = drive.read_at(&mut back, 100).unwrap_err();
        assert!(err.to_string().contains("unaligned"), "{err}");
        let err = drive.write_at(&data, (1 << 20) - 4096).unwrap_err();
        assert!(err.to_string().contains("past the end"), "{err}");
    }

    /// Starts a shell that holds `path` locked with `flock FLAG` and waits until opening
    /// the drive is refused with the holder named; returns the holder and that refusal.
    fn lock_in_other_process(path: &Path, flag: &str) -> (std::process::Child, io::Error) {
        let script = format!("exec 9<>\"$0\"; flock {flag} 9; exec sleep 30");
        let holder = std::process::Command::new("sh")
            .args(["-c", &script, path.to_str().unwrap()])
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        // The shell takes the lock through flock(1) and then execs sleep; while it execs,
        // its descriptors cannot be read from /proc, so wait until the holder is settled.
        loop {
            match FileDrive::open(path) {
                Ok(d) => drop(d),
                Err(e) if e.to_string().contains("pid ") => return (holder, e),
                Err(_) => {}
            }
            assert!(
                std::time::Instant::now() < deadline,
                "flock never took the lock"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    #[test]
    fn one_process_shares_its_claim_and_another_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d0");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let first = FileDrive::open(&path).unwrap();
        // A hard link is the same drive: shared, not a second claim.
        let link = dir.path().join("d0-link");
        std::fs::hard_link(&path, &link).unwrap();
        let second = FileDrive::open(&link).unwrap();
        second
            .write_at(&AlignedBuf::from_slice(&[7; 4096]), 0)
            .unwrap();
        let mut back = AlignedBuf::zeroed(4096);
        first.read_at(&mut back, 0).unwrap();
        assert_eq!(back[0], 7);
        drop((first, second));

        // Another process holds the lock: refused, and the holder is named.
        let (mut holder, err) = lock_in_other_process(&path, "-x");
        assert_eq!(err.kind(), io::ErrorKind::ResourceBusy, "{err}");
        assert!(err.to_string().contains("in use"), "{err}");
        assert!(err.to_string().contains("pid "), "{err}");
        // Reading a label without claiming still works.
        let probe = FileDrive::open_for_probe(&path).unwrap();
        probe.read_at(&mut back, 0).unwrap();
        assert!(probe.write_at(&back, 0).is_err());
        assert_eq!(
            FileDrive::open_shared(&path).unwrap_err().kind(),
            io::ErrorKind::ResourceBusy
        );
        holder.kill().unwrap();
        holder.wait().unwrap();
        FileDrive::open(&path).expect("free again once the holder is gone");
    }

    #[test]
    fn shared_claims_coexist_and_exclude_an_exclusive_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d0");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        // Another process shares the drive, as a second controller of a subsystem does.
        let (mut other, err) = lock_in_other_process(&path, "-s");
        assert_eq!(err.kind(), io::ErrorKind::ResourceBusy, "{err}");
        FileDrive::open_shared(&path).expect("shared with the other controller");
        other.kill().unwrap();
        other.wait().unwrap();
    }

    #[test]
    fn missing_device_is_named() {
        let err = FileDrive::open(Path::new("/nonexistent/tessera-drive")).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/tessera-drive"),
            "{err}"
        );
    }
}
