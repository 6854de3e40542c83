//! A pdisk at run time: its device (absent when missing), state, error counters and free
//! space.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tessera_drive::stats::{Counted, IoStats};
use tessera_drive::{BlockDevice, FileDrive};

use crate::layout::PdiskLayout;
use crate::meta::{PdiskRecord, PdiskState};
use crate::space::Extents;

/// Opens a device path as a drive. The default opens a [`FileDrive`] (O_DIRECT); tests pass
/// a wrapper that injects faults.
pub type DeviceOpener = Arc<dyn Fn(&Path) -> io::Result<Arc<dyn BlockDevice>> + Send + Sync>;

/// The default [`DeviceOpener`].
pub fn file_opener() -> DeviceOpener {
    Arc::new(|path: &Path| {
        let drive: Arc<dyn BlockDevice> = Arc::new(FileDrive::open(path)?);
        Ok(drive)
    })
}

/// Whose pdisk a drive is, as its label says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PdiskLabelInfo {
    pub da_uuid: [u8; 16],
    pub da_name: String,
    pub pdisk_uuid: [u8; 16],
    pub pdisk_name: String,
}

/// Reads the pdisk label of `dev`, if it has a valid one: how a scan of candidate devices
/// finds the pdisks of an array whose device paths changed (the label's pdisk uuid, not
/// the path, says which pdisk a drive is).
pub fn read_pdisk_label(dev: &dyn BlockDevice) -> Option<PdiskLabelInfo> {
    if dev.size_bytes() < crate::layout::LABEL_OFFSET + crate::layout::SECTOR {
        return None;
    }
    let mut sector = tessera_drive::AlignedBuf::zeroed(crate::layout::SECTOR as usize);
    dev.read_at(&mut sector, crate::layout::LABEL_OFFSET).ok()?;
    let label = crate::layout::Label::decode(&sector).ok()??;
    Some(PdiskLabelInfo {
        da_uuid: label.da_uuid,
        da_name: label.da_name,
        pdisk_uuid: label.pdisk_uuid,
        pdisk_name: label.pdisk_name,
    })
}

const STATES: [PdiskState; 6] = [
    PdiskState::Ok,
    PdiskState::Suspended,
    PdiskState::Missing,
    PdiskState::Dead,
    PdiskState::Draining,
    PdiskState::Replaced,
];

fn state_code(s: PdiskState) -> u8 {
    STATES.iter().position(|&x| x == s).expect("listed") as u8
}

/// An automatic suspension for an unreachable drive.
#[derive(Debug, Clone, Copy)]
pub struct Unreachable {
    pub since: std::time::Instant,
    pub last_probe: std::time::Instant,
    pub failed_probes: u32,
}

#[derive(Debug)]
pub struct Pdisk {
    pub index: u16,
    pub uuid: [u8; 16],
    pub name: String,
    pub enclosure: String,
    pub slot: u32,
    pub device_bytes: u64,
    pub layout: PdiskLayout,
    /// The path the device was found at (or last known, when missing).
    pub device_path: String,
    /// `None` when the device was not found.
    pub dev: Option<Arc<dyn BlockDevice>>,
    state: AtomicU8,
    /// Resuming after a suspension: written, but not read until caught up.
    pub catching_up: AtomicBool,
    pub read_errors: AtomicU64,
    pub write_errors: AtomicU64,
    pub checksum_errors: AtomicU64,
    /// Requests, bytes, errors and latencies of every I/O to the drive: `dev` counts them.
    pub io: Arc<IoStats>,
    /// Writes completed so far, counted after each returns.
    writes_done: AtomicU64,
    /// The `writes_done` a successful flush started from: every write counted up to it is
    /// durable. A flush is skipped only when this covers every completed write, never
    /// because another flush is merely under way (it may not have finished when the
    /// skipper reports its writes durable).
    writes_flushed: AtomicU64,
    /// Suspended because its drive could not be reached (not by the administrator): when,
    /// the last probe, and the probes that failed. The maintenance worker probes it and
    /// resumes it when it answers (see `worker::probe_unreachable`).
    pub unreachable: Mutex<Option<Unreachable>>,
    pub space: Mutex<Extents>,
}

impl Pdisk {
    pub fn new(
        index: u16,
        record: &PdiskRecord,
        layout: PdiskLayout,
        dev: Option<Arc<dyn BlockDevice>>,
    ) -> Pdisk {
        let start = layout.data_start / crate::layout::SECTOR;
        let io = Arc::new(IoStats::default());
        let dev = dev.map(|d| Counted::wrap(d, Arc::clone(&io)));
        Pdisk {
            index,
            uuid: record.uuid,
            name: record.name.clone(),
            enclosure: record.enclosure.clone(),
            slot: record.slot,
            device_bytes: record.device_bytes,
            layout,
            device_path: record.device.clone(),
            dev,
            state: AtomicU8::new(state_code(record.state)),
            catching_up: AtomicBool::new(false),
            read_errors: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            checksum_errors: AtomicU64::new(0),
            io,
            writes_done: AtomicU64::new(0),
            writes_flushed: AtomicU64::new(0),
            unreachable: Mutex::new(None),
            space: Mutex::new(Extents::new(start, layout.data_sectors())),
        }
    }

    pub fn state(&self) -> PdiskState {
        STATES[usize::from(self.state.load(Ordering::Acquire))]
    }

    pub fn set_state(&self, s: PdiskState) {
        self.state.store(state_code(s), Ordering::Release);
    }

    /// Strips on it can be read and are current.
    pub fn readable(&self) -> bool {
        self.dev.is_some() && self.state().readable() && !self.catching_up.load(Ordering::Acquire)
    }

    /// Writes must reach it.
    pub fn writable(&self) -> bool {
        self.dev.is_some()
            && (self.state().readable()
                || (self.state() == PdiskState::Suspended
                    && self.catching_up.load(Ordering::Acquire)))
    }

    /// Suspended because its drive could not be reached.
    pub fn is_unreachable(&self) -> bool {
        self.unreachable.lock().is_some()
    }

    pub fn io_errors(&self) -> u64 {
        self.read_errors.load(Ordering::Relaxed) + self.write_errors.load(Ordering::Relaxed)
    }

    fn device(&self) -> io::Result<&Arc<dyn BlockDevice>> {
        self.dev.as_ref().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "pdisk {}: device {} is missing",
                    self.name, self.device_path
                ),
            )
        })
    }

    /// Reads and counts a failure.
    pub fn read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let r = self.device()?.read_at(buf, offset);
        if r.is_err() {
            self.read_errors.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Writes, marks the pdisk for the next flush, and counts a failure. Inside a write
    /// through ([`WriteThrough`]) the drive writes it through (FUA) and no flush is owed.
    pub fn write(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let through = WriteThrough::on();
        let dev = self.device()?;
        let r = if through {
            dev.write_fua(buf, offset)
        } else {
            dev.write_at(buf, offset)
        };
        // Counted after the write completed: a flush that began earlier may have missed it,
        // so the next flush must not be skipped. A failed write through may have left part
        // of it in the drive's cache.
        if !through || r.is_err() {
            self.writes_done.fetch_add(1, Ordering::AcqRel);
        }
        if r.is_err() {
            self.write_errors.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Deallocates a range of the drive; counted like a write (the flush that makes the
    /// header written after it durable must not be skipped).
    pub fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let r = self.device()?.discard(offset, len);
        self.writes_done.fetch_add(1, Ordering::AcqRel);
        r
    }

    /// Whether the drive deallocates ranges that then read as zeros.
    pub fn discard_zeroes(&self) -> bool {
        self.dev.as_ref().is_some_and(|d| d.discard_zeroes())
    }

    /// Whether a write completed that no finished flush covers.
    pub fn has_unflushed_writes(&self) -> bool {
        self.writes_flushed.load(Ordering::Acquire) < self.writes_done.load(Ordering::Acquire)
    }

    /// Flushes unless every write completed before this call is already covered by a
    /// flush that finished: returns only once those writes are durable.
    pub fn flush_if_needed(&self) -> io::Result<()> {
        let covers = self.writes_done.load(Ordering::Acquire);
        if self.writes_flushed.load(Ordering::Acquire) >= covers {
            return Ok(());
        }
        let r = self.device()?.flush();
        match &r {
            Ok(()) => {
                self.writes_flushed.fetch_max(covers, Ordering::AcqRel);
            }
            Err(_) => {
                self.write_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        r
    }

    pub fn record(&self) -> PdiskRecord {
        PdiskRecord {
            uuid: self.uuid,
            name: self.name.clone(),
            device: self.device_path.clone(),
            enclosure: self.enclosure.clone(),
            slot: self.slot,
            device_bytes: self.device_bytes,
            state: self.state(),
        }
    }
}

/// Set while a synchronous write of a vdisk (`BlockDevice::write_fua`) runs on this thread
/// and on the pool threads writing its strips (`pool::run_all` carries it): every strip,
/// parity included, goes to its pdisk written through, so the stripe is durable when the
/// write returns and no pdisk owes a flush for it.
pub(crate) struct WriteThrough {
    before: bool,
}

thread_local! {
    static WRITE_THROUGH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl WriteThrough {
    /// Writes on this thread go through (`on`) or not until the guard drops.
    pub(crate) fn set(on: bool) -> WriteThrough {
        WriteThrough {
            before: WRITE_THROUGH.with(|w| w.replace(on)),
        }
    }

    pub(crate) fn on() -> bool {
        WRITE_THROUGH.with(std::cell::Cell::get)
    }
}

impl Drop for WriteThrough {
    fn drop(&mut self) {
        WRITE_THROUGH.with(|w| w.set(self.before));
    }
}
