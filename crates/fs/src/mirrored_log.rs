//! The recovery log of a file system with two metadata copies (`-m 2`): one log region on
//! a metadata disk and a second one, as large, on a metadata disk of another failure
//! group, written as one device.
//!
//! The journal (`tessera-journal`) sees one device in the first region's coordinates; this
//! device writes every page to both regions and reads from the first copy that answers.
//! What keeps the two from ever being trusted when they differ:
//!
//! - **A copy that misses a write is behind, durably, before the write returns.** A copy
//!   whose disk is down, or whose write or flush fails, stops taking I/O, and the
//!   descriptor records `log_behind` (written through `on_behind`, under the descriptor's
//!   quorum) before the journal may report any record durable that only the other copy
//!   holds. Mount replays only the copy that is not behind, so a later mount from the
//!   behind copy alone (the other failure group lost meanwhile) can never happen without
//!   the descriptor saying so: it is refused by name instead of losing records.
//! - **Mount replays the copy that holds more, and makes the other the same.** A crash in
//!   the middle of a commit can leave a page written on one copy and not on the other
//!   (that commit never returned), and a damaged page ends a copy's replay early. Mount
//!   replays both copies and keeps the one whose records reach further (`recovery.rs`);
//!   the pages that replay read, up to and including the first page that ended it, are
//!   then copied onto the other ([`MirroredLog::resync`]), so that either copy alone
//!   replays the same records.
//! - **A copy that was behind is copied whole** before it counts again (the next
//!   descriptor then records both current).
//!
//! The same device serves an owner slot's log (`-m 2`: the slot region's two copies,
//! [`MirroredLog::for_slot`]). A slot's owner does not write the descriptor: its hook asks
//! the file system manager to record the state in the descriptor's entry for the slot
//! (`Namespace::record_slot_log`), and a state the descriptor does not say yet (a copy
//! found missing at mount, a copy made current again by the mount's resync) is recorded
//! before the next write, so that no record lands on one copy alone while the descriptor
//! calls both current.

use std::io;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use tessera_alloc::DiskIndex;
use tessera_drive::{AlignedBuf, BlockDevice};

use crate::descriptor::FsDescriptor;
use crate::disk_set::DiskSet;
use crate::error::{FsError, FsResult};

/// `behind` when both copies are current.
const BOTH_CURRENT: u8 = u8::MAX;
/// Bytes copied at a time by a resync.
const RESYNC_CHUNK_BYTES: u64 = 1 << 20;

/// Makes the copies' state durable (writes the descriptor, or asks the file system manager
/// to): `Some(c)` copy `c` is behind, `None` both are current. Set once the file system is
/// assembled.
pub(crate) type OnBehind = Arc<dyn Fn(Option<u8>) -> io::Result<()> + Send + Sync>;

pub(crate) struct MirroredLog {
    name: String,
    disks: Arc<DiskSet>,
    /// (disk, byte offset of the region) of each copy.
    copies: [(DiskIndex, u64); 2],
    region_bytes: u64,
    size_bytes: u64,
    behind: AtomicU8,
    /// What the descriptor on disk says of the copies (`behind`'s encoding); a write first
    /// records `behind` where the two differ.
    recorded: AtomicU8,
    /// Held while the state is recorded, so that two writers do not record it twice and a
    /// newer state is never overwritten by an older one.
    recording: parking_lot::Mutex<()>,
    /// The copy reads go to first (the one the mount replayed).
    prefer: AtomicU8,
    /// Writes and flushes hold it shared; a resync holds it exclusively, so that no page
    /// lands on the current copy behind the copying.
    io: parking_lot::RwLock<()>,
    on_behind: OnceLock<OnBehind>,
}

impl MirroredLog {
    /// The log of `desc` over `disks`, with the copy the descriptor or the missing disks
    /// say is behind. Refused when no current copy is on a disk that is up. The file
    /// system manager writes the descriptor that names this state itself (the mount, or the
    /// change that opens a new log), so it counts as recorded.
    pub(crate) fn open(desc: &FsDescriptor, disks: &Arc<DiskSet>) -> FsResult<Arc<MirroredLog>> {
        let copies = desc
            .metadata_copies
            .as_ref()
            .expect("a mirrored log belongs to a file system with two metadata copies");
        let log = MirroredLog::over(
            format!("recovery log of {}", desc.name),
            &desc.name,
            disks,
            [
                (desc.log.disk, desc.log.region.offset),
                (copies.log_disk, copies.log_offset),
            ],
            desc.log.region,
            copies.log_behind,
        )?;
        log.set_recorded(log.behind());
        Ok(log)
    }

    /// The log of owner slot `region` (a region with a second copy), as [`MirroredLog::open`].
    pub(crate) fn for_slot(
        desc: &FsDescriptor,
        disks: &Arc<DiskSet>,
        region: &crate::slot::SlotRegion,
    ) -> FsResult<Arc<MirroredLog>> {
        let second = region
            .second
            .expect("a mirrored slot log belongs to a region with two copies");
        let log = region.log_region();
        let records = log.offset - region.offset;
        MirroredLog::over(
            format!("log of owner slot {} of {}", region.slot, desc.name),
            &desc.name,
            disks,
            [
                (region.disk, log.offset),
                (second.disk, second.offset + records),
            ],
            log,
            second.log_behind,
        )
    }

    /// Copies at `pair` (disk, byte offset of each copy's region), `region` in the first
    /// copy's coordinates, `recorded` the descriptor's word on which one is behind.
    fn over(
        what: String,
        fs_name: &str,
        disks: &Arc<DiskSet>,
        pair: [(DiskIndex, u64); 2],
        region: tessera_journal::JournalRegion,
        recorded: Option<u8>,
    ) -> FsResult<Arc<MirroredLog>> {
        let mut behind = recorded;
        for (c, (disk, _)) in pair.iter().enumerate() {
            if disks.is_down(*disk) && behind != Some(c as u8) {
                if behind.is_some() {
                    return Err(no_current_copy(&what, fs_name, disks, &pair, behind));
                }
                behind = Some(c as u8);
            }
        }
        if let Some(b) = behind {
            let current = pair[1 - b as usize].0;
            if disks.is_down(current) {
                return Err(no_current_copy(&what, fs_name, disks, &pair, behind));
            }
        }
        let encode = |b: Option<u8>| b.unwrap_or(BOTH_CURRENT);
        Ok(Arc::new(MirroredLog {
            name: format!(
                "{what} ({} and {})",
                disks.name(pair[0].0),
                disks.name(pair[1].0)
            ),
            disks: Arc::clone(disks),
            copies: pair,
            region_bytes: region.bytes,
            // In the first copy's coordinates, whether or not its disk is there.
            size_bytes: region.offset + region.bytes,
            behind: AtomicU8::new(encode(behind)),
            recorded: AtomicU8::new(encode(recorded)),
            recording: parking_lot::Mutex::new(()),
            prefer: AtomicU8::new(if behind == Some(0) { 1 } else { 0 }),
            io: parking_lot::RwLock::new(()),
            on_behind: OnceLock::new(),
        }))
    }

    /// Which copy lacks records the other holds, if one does.
    pub(crate) fn behind(&self) -> Option<u8> {
        match self.behind.load(Ordering::SeqCst) {
            BOTH_CURRENT => None,
            c => Some(c),
        }
    }

    /// Sends reads to copy `c` first.
    pub(crate) fn prefer(&self, c: u8) {
        self.prefer.store(c, Ordering::SeqCst);
    }

    pub(crate) fn set_on_behind(&self, f: OnBehind) {
        let _ = self.on_behind.set(f);
    }

    /// The descriptor on disk now says `behind` of the copies (its writer recorded it).
    pub(crate) fn set_recorded(&self, behind: Option<u8>) {
        self.recorded
            .store(behind.unwrap_or(BOTH_CURRENT), Ordering::SeqCst);
    }

    /// Whether the descriptor on disk says what this log knows of its copies.
    pub(crate) fn state_recorded(&self) -> bool {
        self.recorded.load(Ordering::SeqCst) == self.behind.load(Ordering::SeqCst)
    }

    /// Records the copies' state now where the descriptor says otherwise (after a
    /// [`MirroredLog::catch_up`], say), rather than before the next write.
    pub(crate) fn record_state(&self) -> io::Result<()> {
        self.ensure_recorded()
    }

    /// Records the copies' state through the hook where the descriptor says otherwise;
    /// before the hook is set (at mount) the caller records it.
    fn ensure_recorded(&self) -> io::Result<()> {
        if self.state_recorded() {
            return Ok(());
        }
        let Some(record) = self.on_behind.get() else {
            return Ok(());
        };
        let _one = self.recording.lock();
        let now = self.behind();
        if self.recorded.load(Ordering::SeqCst) == now.unwrap_or(BOTH_CURRENT) {
            return Ok(());
        }
        record(now)?;
        self.set_recorded(now);
        Ok(())
    }

    /// Copy `c` missed a write that is not a log page (an owner slot's record, written
    /// beside its log): it is behind from now on, recorded before this returns.
    pub(crate) fn missed(&self, c: u8, why: &str) -> io::Result<()> {
        self.fall_behind(c as usize, why)
    }

    /// Offset on copy `c`'s disk of `offset` in the first copy's coordinates.
    fn at(&self, c: usize, offset: u64) -> u64 {
        offset - self.copies[0].1 + self.copies[c].1
    }

    fn usable(&self, c: usize) -> bool {
        self.behind() != Some(c as u8) && !self.disks.is_down(self.copies[c].0)
    }

    /// Copy `c` missed a write: record it durably, unless it is recorded already.
    fn fall_behind(&self, c: usize, why: &str) -> io::Result<()> {
        let c8 = c as u8;
        match self.behind() {
            Some(b) if b == c8 => return self.ensure_recorded(),
            Some(_) => {
                return Err(io::Error::other(format!(
                    "{}: both copies missed writes (NSD {}: {why})",
                    self.name,
                    self.disks.name(self.copies[c].0)
                )))
            }
            None => {}
        }
        self.behind.store(c8, Ordering::SeqCst);
        tracing::error!(
            "{}: the copy on NSD {} stops taking writes ({why}); the log goes on with its \
             other copy, and the next mount with that disk back copies the log onto it",
            self.name,
            self.disks.name(self.copies[c].0)
        );
        self.ensure_recorded()
    }

    /// Runs `op` on every usable copy; copies that fail fall behind. Fails only when no
    /// copy succeeded, or when recording one behind failed.
    fn on_each(
        &self,
        what: &str,
        op: &dyn Fn(&dyn BlockDevice, usize) -> io::Result<()>,
    ) -> io::Result<()> {
        self.ensure_recorded()?;
        let mut done = 0;
        let mut failed = Vec::new();
        for c in 0..2 {
            if self.behind() == Some(c as u8) {
                continue;
            }
            let disk = self.copies[c].0;
            if self.disks.is_down(disk) {
                failed.push((c, format!("NSD {} is down", self.disks.name(disk))));
                continue;
            }
            match op(self.disks.get(disk).as_ref(), c) {
                Ok(()) => done += 1,
                Err(e) => failed.push((c, format!("{what} failed: {e}"))),
            }
        }
        if done == 0 {
            return Err(io::Error::other(format!(
                "{}: no copy took the {what}: {}",
                self.name,
                failed
                    .iter()
                    .map(|(_, why)| why.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            )));
        }
        for (c, why) in failed {
            self.fall_behind(c, &why)?;
        }
        Ok(())
    }

    /// A copy that was behind and whose disk is up again is copied whole from the current
    /// one while the log takes no writes (commits wait for the copy: a region of 64 MiB is
    /// a fraction of a second), and counts as current after. Returns whether it did.
    pub(crate) fn catch_up(&self) -> FsResult<bool> {
        Ok(self.resync(&[])?.is_some())
    }

    /// Makes the copies hold the same log: after a replay, the pages it read (`ranges`, in
    /// the first copy's coordinates, from [`tessera_journal::Journal::replayed_ranges`]) are
    /// copied from what this device reads onto every usable copy; a copy that was behind
    /// gets the whole region. Returns the copy that was behind and is current now.
    pub(crate) fn resync(&self, ranges: &[(u64, u64)]) -> FsResult<Option<u8>> {
        let _quiet = self.io.write();
        let whole = [(self.copies[0].1, self.region_bytes)];
        let was_behind = self.behind();
        let (ranges, target) = match was_behind {
            Some(b) if !self.disks.is_down(self.copies[b as usize].0) => {
                self.prefer.store(1 - b, Ordering::SeqCst);
                (&whole[..], b as usize)
            }
            Some(_) => return Ok(None),
            None if self.usable(0) && self.usable(1) => {
                (ranges, 1 - self.prefer.load(Ordering::SeqCst) as usize)
            }
            None => return Ok(None),
        };
        let target_dev = self.disks.get(self.copies[target].0);
        let copied = (|| -> io::Result<()> {
            for &(start, bytes) in ranges {
                let mut at = start;
                while at < start + bytes {
                    let n = RESYNC_CHUNK_BYTES.min(start + bytes - at);
                    let mut buf = AlignedBuf::zeroed(n as usize);
                    self.read_at(&mut buf, at)?;
                    target_dev.write_at(&buf, self.at(target, at))?;
                    at += n;
                }
            }
            target_dev.flush()
        })();
        if let Err(e) = copied {
            // The copy stays (or becomes) behind: the log goes on with the other one.
            let why = format!("copying the log onto it failed: {e}");
            tracing::warn!("{}: {why}", self.name);
            if was_behind.is_none() {
                self.fall_behind(target, &why)?;
            }
            return Ok(None);
        }
        if was_behind.is_some() {
            self.behind.store(BOTH_CURRENT, Ordering::SeqCst);
            tracing::info!(
                "{}: the copy on NSD {} is current again ({} bytes copied)",
                self.name,
                self.disks.name(self.copies[target].0),
                self.region_bytes
            );
        }
        Ok(was_behind)
    }
}

/// The error of a log (or a slot's records) whose only current copy is on a disk that is
/// down.
pub(crate) fn no_current_copy(
    what: &str,
    fs_name: &str,
    disks: &DiskSet,
    pair: &[(DiskIndex, u64); 2],
    behind: Option<u8>,
) -> FsError {
    let describe = |c: usize| {
        let disk = pair[c].0;
        let state = if disks.is_down(disk) {
            "missing"
        } else {
            "present"
        };
        let current = if behind == Some(c as u8) {
            "lacks records the other copy holds"
        } else {
            "current"
        };
        format!("NSD {} ({state}, {current})", disks.name(disk))
    };
    FsError::MissingDisk {
        fs: fs_name.to_string(),
        nsd: disks.name(pair[if behind == Some(0) { 1 } else { 0 }].0),
        reason: format!(
            "no current copy of the {what} is on a disk that is up: {} and {}; bring \
             back the disk that holds the current copy",
            describe(0),
            describe(1)
        ),
    }
}

impl std::fmt::Debug for MirroredLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MirroredLog")
            .field("name", &self.name)
            .field("behind", &self.behind())
            .finish()
    }
}

impl BlockDevice for MirroredLog {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut last = None;
        let first = self.prefer.load(Ordering::SeqCst) as usize;
        for c in [first, 1 - first] {
            if !self.usable(c) {
                continue;
            }
            match self
                .disks
                .get(self.copies[c].0)
                .read_at(buf, self.at(c, offset))
            {
                Ok(()) => return Ok(()),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            io::Error::other(format!(
                "{}: no current copy is on a disk that is up",
                self.name
            ))
        }))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let _io = self.io.read();
        self.on_each("write", &|dev, c| dev.write_at(buf, self.at(c, offset)))
    }

    /// Both copies written through: a copy that misses it is behind, as for a write.
    fn write_fua(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let _io = self.io.read();
        self.on_each("write", &|dev, c| dev.write_fua(buf, self.at(c, offset)))
    }

    fn flush(&self) -> io::Result<()> {
        let _io = self.io.read();
        self.on_each("flush", &|dev, _| dev.flush())
    }
}
