//! An exported namespace: a `BlockDevice` with 4096-byte LBAs, its identity, its
//! reservation state and its counters.
//!
//! Deallocation: on a regular file, Dataset Management deallocate and Write Zeroes with
//! DEAC punch holes (`fallocate(PUNCH_HOLE | KEEP_SIZE)`), and plain Write Zeroes uses
//! `fallocate(ZERO_RANGE | KEEP_SIZE)`, so deallocated blocks read back as zeroes (DLFEAT
//! reports this). On a block device, deallocate issues `BLKDISCARD` (a hint: DLFEAT then
//! promises nothing about what such blocks read back) and Write Zeroes `BLKZEROOUT`. When
//! the kernel refuses either (no `fallocate` support, or the device was supplied by the
//! caller of `DriveServer::start_with`), Write Zeroes falls back to writing zero buffers
//! and deallocate to doing nothing, which the specification allows for a hint.
//!
//! Writes behind the device: the ring's writes (through `direct`) and the `fallocate`s and
//! ioctls (through `aux`) reach the backing store without passing through `dev`, whose own
//! flush may then believe nothing changed since it last synced (`FileDrive` skips the sync
//! when no write went through it). Every such change marks the namespace, and
//! [`Namespace::flush`] syncs the namespace's own descriptor before flushing the device, so
//! a Flush (or FUA) covers every write the host saw completed, whichever way it went.

use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tessera_drive::{AlignedBuf, BlockDevice};

use super::reservation_store::Reservations;

/// Bytes per logical block (LBADS 12).
pub const LBA_BYTES: u64 = 4096;
/// The zero buffer used when Write Zeroes has to write.
const ZERO_CHUNK_BYTES: usize = 1 << 20;

/// Per-namespace counters.
#[derive(Debug, Default)]
pub(crate) struct NsCounters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub other: AtomicU64,
    pub errors: AtomicU64,
    /// Flushes that synced writes made behind the device.
    pub syncs_behind: AtomicU64,
}

/// An exported namespace.
#[derive(Debug)]
pub(crate) struct Namespace {
    pub nsid: u32,
    pub subnqn: String,
    pub dev: Arc<dyn BlockDevice>,
    /// A second, buffered descriptor used only for `fallocate` and ioctls.
    aux: Option<File>,
    /// A descriptor (O_DIRECT where the file system allows it) that the connection
    /// threads hand to io_uring for reads and small writes: one the server opened itself,
    /// or the device's own ([`BlockDevice::direct_file`]) when a caller supplied a device
    /// that offers it. A device that does not (a vdisk, a volatile cache, a fault-injecting
    /// wrapper) sees every I/O.
    pub direct: Option<File>,
    /// Something reached the backing store through `direct` or `aux` since the last
    /// flush (module documentation).
    written_behind: AtomicBool,
    is_block_device: bool,
    pub blocks: u64,
    pub nguid: [u8; 16],
    pub uuid: [u8; 16],
    pub ana_grpid: u32,
    pub reservation: Reservations,
    pub counters: NsCounters,
    /// Sees the drive I/O done for hosts, once someone asked ([`IoObserver`]).
    pub observer: std::sync::OnceLock<Arc<dyn IoObserver>>,
}

/// Sees every read and write a namespace does on its drive for a host: an NSD server
/// shows them in its I/O history (`tessera diag --iohist`), naming the node it did them
/// for, as GPFS's does.
pub trait IoObserver: Send + Sync + std::fmt::Debug {
    /// A drive read or write for `hostnqn` begins.
    fn begin(&self, write: bool, offset: u64, bytes: u64, hostnqn: &str) -> Box<dyn ObservedIo>;
}

/// A drive I/O an [`IoObserver`] saw begin.
pub trait ObservedIo: Send {
    /// It ended, successfully or not.
    fn end(self: Box<Self>, ok: bool);
}

/// The observed I/O of one command: ended by [`IoWatch::end`] with its outcome, or, should
/// the command be dropped unanswered (its connection died), as failed.
#[derive(Default)]
pub(crate) struct IoWatch(parking_lot::Mutex<Option<Box<dyn ObservedIo>>>);

impl IoWatch {
    pub fn start(ns: &Namespace, write: bool, offset: u64, bytes: usize, hostnqn: &str) -> IoWatch {
        IoWatch(parking_lot::Mutex::new(
            ns.observer
                .get()
                .map(|o| o.begin(write, offset, bytes as u64, hostnqn)),
        ))
    }

    pub fn end(&self, ok: bool) {
        if let Some(io) = self.0.lock().take() {
            io.end(ok);
        }
    }
}

impl Drop for IoWatch {
    fn drop(&mut self) {
        self.end(false);
    }
}

impl std::fmt::Debug for IoWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IoWatch")
    }
}

impl Namespace {
    pub fn new(
        cfg: &super::config::NamespaceConfig,
        subnqn: &str,
        dev: Arc<dyn BlockDevice>,
        aux_path: Option<&Path>,
        reservation: Reservations,
    ) -> Namespace {
        let aux = aux_path.and_then(|p| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .ok()
        });
        let is_block_device = aux
            .as_ref()
            .and_then(|f| f.metadata().ok())
            .is_some_and(|m| {
                use std::os::unix::fs::FileTypeExt;
                m.file_type().is_block_device()
            });
        let direct = aux_path.and_then(open_direct).or_else(|| {
            // A duplicate of the device's descriptor: the same open file (O_DIRECT and the
            // device's claim included), closed with the namespace.
            dev.direct_file().and_then(|f| f.try_clone().ok())
        });
        Namespace {
            nsid: cfg.nsid,
            subnqn: subnqn.to_owned(),
            blocks: dev.size_bytes() / LBA_BYTES,
            dev,
            aux,
            direct,
            written_behind: AtomicBool::new(false),
            is_block_device,
            nguid: cfg.nguid,
            uuid: cfg.uuid,
            ana_grpid: cfg.ana_grpid,
            reservation,
            counters: NsCounters::default(),
            observer: std::sync::OnceLock::new(),
        }
    }

    /// True when deallocated blocks read back as zeroes (DLFEAT bits 2:0 = 001b).
    pub fn deallocate_reads_zeroes(&self) -> bool {
        self.aux.is_some() && !self.is_block_device
    }

    /// Checks `slba .. slba + blocks` against the namespace size.
    pub fn in_range(&self, slba: u64, blocks: u64) -> bool {
        slba.checked_add(blocks)
            .is_some_and(|end| end <= self.blocks)
    }

    /// Deallocates a range (a hint; see the module documentation).
    pub fn deallocate(&self, slba: u64, blocks: u64) -> io::Result<()> {
        let (offset, len) = (slba * LBA_BYTES, blocks * LBA_BYTES);
        let Some(aux) = &self.aux else {
            return Ok(());
        };
        let result = if self.is_block_device {
            block_ioctl(aux, BLKDISCARD, offset, len)
        } else {
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            fallocate(aux, mode, offset, len)
        };
        // Even a failed call may have changed part of the range.
        self.wrote_behind();
        match result {
            Err(e) if unsupported(&e) => Ok(()),
            other => other,
        }
    }

    /// Makes a range read back as zeroes.
    pub fn write_zeroes(&self, slba: u64, blocks: u64, deallocate: bool) -> io::Result<()> {
        let (offset, len) = (slba * LBA_BYTES, blocks * LBA_BYTES);
        if let Some(aux) = &self.aux {
            let result = if self.is_block_device {
                block_ioctl(aux, BLKZEROOUT, offset, len)
            } else {
                let mode = if deallocate {
                    libc::FALLOC_FL_PUNCH_HOLE
                } else {
                    libc::FALLOC_FL_ZERO_RANGE
                };
                fallocate(aux, mode | libc::FALLOC_FL_KEEP_SIZE, offset, len)
            };
            // Even a failed call may have changed part of the range.
            self.wrote_behind();
            match result {
                Err(e) if unsupported(&e) => {}
                other => return other,
            }
        }
        self.write_zero_buffers(offset, len)
    }

    /// Notes a change that reached the backing store through `direct` or `aux`, once it
    /// returned or failed (before it, a flush racing with it could clear the mark and sync
    /// before the change, and the next flush skip it): the next flush syncs it.
    pub fn wrote_behind(&self) {
        debug_assert!(self.direct.is_some() || self.aux.is_some());
        self.written_behind.store(true, Ordering::Release);
    }

    /// Returns when every write that completed before the call is on stable storage,
    /// whether it went through the device or behind it (module documentation).
    pub fn flush(&self) -> io::Result<()> {
        if self.written_behind.swap(false, Ordering::AcqRel) {
            let own =
                self.direct.as_ref().or(self.aux.as_ref()).expect(
                    "only a namespace with a descriptor of its own writes behind its device",
                );
            if let Err(e) = own.sync_data() {
                // Not durable: the next flush must try again.
                self.written_behind.store(true, Ordering::Release);
                return Err(io::Error::new(
                    e.kind(),
                    format!("{}: flush: {e}", self.dev.name()),
                ));
            }
            self.count(&self.counters.syncs_behind, 1);
        }
        self.dev.flush()
    }

    fn write_zero_buffers(&self, mut offset: u64, len: u64) -> io::Result<()> {
        let end = offset + len;
        let zeroes = AlignedBuf::zeroed(ZERO_CHUNK_BYTES.min(len as usize));
        while offset < end {
            let n = (end - offset).min(zeroes.len() as u64) as usize;
            self.dev.write_at(&zeroes[..n], offset)?;
            offset += n as u64;
        }
        Ok(())
    }

    pub fn count(&self, counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Opens `path` for reading and writing with O_DIRECT, or buffered where O_DIRECT is
/// refused (tmpfs), as `FileDrive::open` does for the device itself.
fn open_direct(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |flags| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(flags)
            .open(path)
    };
    match open(libc::O_DIRECT) {
        Ok(f) => Some(f),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open(0).ok(),
        Err(_) => None,
    }
}

fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::ENOSYS | libc::EINVAL)
    )
}

fn fallocate(file: &File, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    let (Ok(off), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    // SAFETY: fallocate only reads its scalar arguments; the descriptor is owned by `file`.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, off, len) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `_IO(0x12, 119)` and `_IO(0x12, 127)` from `<linux/fs.h>`.
const BLKDISCARD: libc::c_ulong = 0x1277;
const BLKZEROOUT: libc::c_ulong = 0x127f;

fn block_ioctl(file: &File, request: libc::c_ulong, offset: u64, len: u64) -> io::Result<()> {
    let range: [u64; 2] = [offset, len];
    // SAFETY: both ioctls read a `u64[2]` {start, length} that lives across the call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), request as _, range.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
