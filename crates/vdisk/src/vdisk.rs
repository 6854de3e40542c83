//! [`Vdisk`]: a vdisk handle, usable as a [`BlockDevice`] (and so as an NSD).

use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use tessera_drive::{check_io, BlockDevice};
use tessera_ec::Code;

use crate::core::{DaCore, VdiskCore};
use crate::error::VdiskError;
use crate::placement::Tolerance;
use crate::status::VdiskStats;

/// A vdisk of a declustered array. Byte `o` lives in stripe `o / block_size`; a write of a
/// whole aligned block is a full-stripe write (no reads), anything smaller is a
/// read-modify-write of its stripe. Reads and writes of one call are split by stripe and
/// done stripe by stripe; the strips of a stripe are read and written in parallel.
pub struct Vdisk {
    /// Weak: a handle kept after its array closed (a mount that moved on to the NSD
    /// servers, say) must not hold the array's pdisks open, since another server opens
    /// them next and a drive is open in one process at a time.
    core: Weak<DaCore>,
    da_name: String,
    vd: Arc<VdiskCore>,
}

/// Where one strip of a stripe is stored (for tools and tests that inspect the layout).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StripLocation {
    pub pdisk: String,
    pub device: String,
    /// Byte offset of the strip's header on the device.
    pub offset: u64,
    /// Byte offset of the strip's data (after the header).
    pub data_offset: u64,
    pub strip_bytes: u64,
}

impl std::fmt::Debug for Vdisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Vdisk({} in {}, {})",
            self.vd.name, self.da_name, self.vd.code
        )
    }
}

pub fn stats_of(vd: &VdiskCore) -> VdiskStats {
    let c = &vd.stats;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    VdiskStats {
        reads: get(&c.reads),
        writes: get(&c.writes),
        bytes_read: get(&c.bytes_read),
        bytes_written: get(&c.bytes_written),
        full_stripe_writes: get(&c.full_stripe_writes),
        rmw_writes: get(&c.rmw_writes),
        degraded_reads: get(&c.degraded_reads),
        checksum_errors_repaired: get(&c.checksum_errors_repaired),
        unrecoverable: get(&c.unrecoverable),
        discarded_stripes: get(&c.discarded_stripes),
        discards_skipped: get(&c.discards_skipped),
    }
}

impl Vdisk {
    pub(crate) fn new(core: &Arc<DaCore>, vd: Arc<VdiskCore>) -> Vdisk {
        Vdisk {
            core: Arc::downgrade(core),
            da_name: core.name.clone(),
            vd,
        }
    }

    pub fn code(&self) -> Code {
        self.vd.code
    }

    /// The I/O unit: one full stripe.
    pub fn block_size(&self) -> u64 {
        self.vd.block_bytes
    }

    pub fn strip_size(&self) -> u64 {
        self.vd.strip_bytes as u64
    }

    pub fn stripes(&self) -> u64 {
        self.vd.stripes
    }

    /// The name of the declustered array holding the vdisk.
    pub fn array_name(&self) -> &str {
        &self.da_name
    }

    pub fn stats(&self) -> VdiskStats {
        stats_of(&self.vd)
    }

    /// What the vdisk's current layout survives (whole pdisks, whole enclosures).
    pub fn tolerance(&self) -> Result<Tolerance, VdiskError> {
        let core = self.open_core()?;
        let pdisks = core.pdisks.read().clone();
        let enc = crate::da::enclosure_ids(&pdisks);
        let mut worst = 1;
        let mut per = std::collections::HashMap::new();
        for s in 0..self.vd.stripes {
            per.clear();
            for i in 0..self.vd.n {
                let p = usize::from(self.vd.loc(s, i).pdisk);
                *per.entry(enc[p]).or_insert(0usize) += 1;
            }
            worst = per.values().copied().max().unwrap_or(1).max(worst);
        }
        Ok(crate::placement::tolerance(self.vd.m, worst))
    }

    /// Where the strips of `stripe` are stored.
    pub fn strip_locations(&self, stripe: u64) -> Result<Vec<StripLocation>, VdiskError> {
        let core = self.open_core()?;
        Ok((0..self.vd.n)
            .map(|i| {
                let loc = self.vd.loc(stripe, i);
                let p = core.pdisk(loc.pdisk);
                StripLocation {
                    pdisk: p.name.clone(),
                    device: p.device_path.clone(),
                    offset: loc.offset(),
                    data_offset: loc.offset() + self.vd.header_bytes as u64,
                    strip_bytes: self.vd.strip_bytes as u64,
                }
            })
            .collect())
    }

    /// The array's state, while the array is open and the vdisk not deleted.
    fn open_core(&self) -> Result<Arc<DaCore>, VdiskError> {
        let closed = || VdiskError::Closed {
            vdisk: self.vd.name.clone(),
        };
        let core = self.core.upgrade().ok_or_else(closed)?;
        if core.closed.load(Ordering::Acquire) || self.vd.deleted.load(Ordering::Acquire) {
            return Err(closed());
        }
        Ok(core)
    }

    /// Calls `f(stripe, offset in stripe, range of buf)` for each stripe of a request.
    fn split(&self, offset: u64, len: usize) -> Vec<(u64, usize, std::ops::Range<usize>)> {
        let b = self.vd.block_bytes;
        let mut out = Vec::new();
        let mut pos = offset;
        let end = offset + len as u64;
        while pos < end {
            let stripe = pos / b;
            let within = pos % b;
            let take = (b - within).min(end - pos);
            let start = (pos - offset) as usize;
            out.push((stripe, within as usize, start..start + take as usize));
            pos += take;
        }
        out
    }
}

impl BlockDevice for Vdisk {
    fn name(&self) -> &str {
        &self.vd.name
    }

    fn size_bytes(&self) -> u64 {
        self.vd.capacity_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_io(self, buf, offset)?;
        let core = self.open_core()?;
        core.note_foreground();
        let c = &self.vd.stats;
        c.reads.fetch_add(1, Ordering::Relaxed);
        c.bytes_read.fetch_add(buf.len() as u64, Ordering::Relaxed);
        for (stripe, within, range) in self.split(offset, buf.len()) {
            core.read_stripe(&self.vd, stripe, within, &mut buf[range])?;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_io(self, buf, offset)?;
        let core = self.open_core()?;
        core.note_foreground();
        let c = &self.vd.stats;
        c.writes.fetch_add(1, Ordering::Relaxed);
        c.bytes_written
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        for (stripe, within, range) in self.split(offset, buf.len()) {
            core.write_stripe(&self.vd, stripe, within, &buf[range])?;
        }
        Ok(())
    }

    /// The stripes' strips and parity written through to their pdisks (FUA): one round
    /// trip per pdisk where a write and a flush take two, and nothing left for a flush.
    fn write_fua(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let _through = crate::pdisk::WriteThrough::set(true);
        self.write_at(buf, offset)
    }

    /// Flushes every pdisk of the array that received writes since its last flush. A
    /// pdisk that fails to flush is declared dead; the flush fails only when more pdisks
    /// failed than the vdisk's code tolerates.
    fn flush(&self) -> io::Result<()> {
        let core = self.open_core()?;
        Ok(core.flush_pdisks(self.vd.m)?)
    }

    /// Deallocates every whole stripe of the range on its pdisks (see
    /// `DaCore::discard_stripe`); partial stripes at the ends stay as they are, which a
    /// discard may do. Afterwards deallocated stripes read as zeros.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        tessera_drive::check_discard(self, offset, len)?;
        let core = self.open_core()?;
        if !self.can_discard() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "vdisk {}: the pdisks of array {} cannot deallocate so that freed strips \
                     read as zeros (file-backed and NVMe pdisks whose DLFEAT says so can)",
                    self.vd.name, self.da_name
                ),
            ));
        }
        core.note_foreground();
        let c = &self.vd.stats;
        for (stripe, within, range) in self.split(offset, len as usize) {
            if within != 0 || range.len() as u64 != self.vd.block_bytes {
                c.discards_skipped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let counter = if core.discard_stripe(&self.vd, stripe)? {
                &c.discarded_stripes
            } else {
                &c.discards_skipped
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// When every pdisk in service deallocates to zeros.
    fn can_discard(&self) -> bool {
        let Some(core) = self.core.upgrade() else {
            return false;
        };
        let pdisks = core.pdisks.read();
        let mut present = pdisks.iter().filter(|p| p.dev.is_some()).peekable();
        present.peek().is_some() && present.all(|p| p.discard_zeroes())
    }

    fn discard_zeroes(&self) -> bool {
        self.can_discard()
    }
}
