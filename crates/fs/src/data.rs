//! The data path: reads and writes of file blocks on the NSDs, with a crc32c per 4 KiB
//! sector verified on every read.
//!
//! Write ordering is what keeps checksums honest across a crash:
//! - Data going to a block that no durable metadata references yet (a fresh allocation, a
//!   copy-on-write of a whole block, sectors never written) is written first and logged after;
//!   a crash in between leaves an unreferenced block, which the next mount finds free.
//! - Data overwriting sectors that hold acknowledged data is preceded by a durable log record
//!   with the new checksums, which keeps the old checksum as an alternative, so after a crash
//!   the sector verifies whether or not the new data reached the disk.

use std::sync::Arc;
use std::time::Instant;

use tessera_alloc::{BlockHint, DiskAddr, Extent};
use tessera_drive::AlignedBuf;
use tessera_journal::Lsn;

use crate::error::{FsError, FsResult};
use crate::fs::FileSystem;
use crate::inode::{Alternative, Attr, BlockRef, FileKind, Ino, CSUM_SECTOR_BYTES};
use crate::meta::Change;
use crate::metanode::{Content, FileUpdate, SizeUpdate, Times};

/// How often a write into one block is started again because the owner of the metadata
/// changed under it: each move is a takeover after an owner's death, so more than a few
/// in one write means something else is wrong.
const OWNER_MOVES_MAX: u32 = 3;

/// Attempts of a read whose data fails its checksum. A read races a write to the same
/// sectors from another node (or another thread): its block-map view, taken before the
/// write logged the new checksums, meets data the write put down after. The next view
/// carries the new checksum (and the old one as its alternative), so a read that fails
/// again with a fresh view each time is corruption, reported then.
const READ_RACE_ATTEMPTS: u32 = 4;
use crate::prefetch::{BlockData, SectorState};

/// Largest file size: 1 PiB.
pub const FILE_BYTES_MAX: u64 = 1 << 50;
const SECTOR: u64 = CSUM_SECTOR_BYTES;

/// fallocate(2) modes this file system implements.
pub const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
pub const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;

/// What a read needs to know about one sector, copied out under the metadata lock.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct SectorInfo {
    unwritten: bool,
    crc: u32,
    alternative: Option<Alternative>,
}

/// What a write did: the log record that makes it reachable, and the drives it wrote (a
/// synchronous write whose record is already durable needs only those drives flushed).
#[derive(Default)]
struct Written {
    lsn: Lsn,
    disks: Vec<u16>,
}

impl Written {
    fn on(lsn: Lsn, disks: Vec<u16>) -> Written {
        Written { lsn, disks }
    }

    fn merge(&mut self, other: Written) {
        self.lsn = self.lsn.max(other.lsn);
        for d in other.disks {
            if !self.disks.contains(&d) {
                self.disks.push(d);
            }
        }
    }
}

/// How a block write proceeds, decided under the metadata lock.
enum BlockPlan {
    /// Write into a newly allocated extent, copying the old extent's sectors if given.
    Fresh {
        extents: Vec<Extent>,
        copy: Option<BlockRef>,
    },
    /// Map a newly allocated whole block with every sector unwritten, then write in place.
    NewBlock { extents: Vec<Extent> },
    /// Overwrite sectors of the current extent.
    InPlace { current: BlockRef },
    /// The extent must change, which needs the block's exclusive lock.
    NeedsExclusive,
}

impl FileSystem {
    pub(crate) fn extent_offset(&self, e: &Extent) -> u64 {
        self.geo.data_start_bytes + e.addr.sub_block * self.geo.sub_block_bytes
    }

    pub(crate) fn extent_sectors(&self, e: &Extent) -> usize {
        (u64::from(e.sub_blocks) * self.geo.sub_block_bytes / SECTOR) as usize
    }

    fn regular_attr(&self, ino: Ino) -> FsResult<Attr> {
        let attr = self.metanode_of(ino).view(ino, 0..0)?.attr;
        match attr.kind {
            FileKind::Regular => Ok(attr),
            FileKind::Directory => Err(FsError::IsDir),
            _ => Err(FsError::Invalid("not a regular file".into())),
        }
    }

    /// Reads up to `size` bytes at `offset`; short at end of file.
    pub fn read(&self, ino: Ino, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        Ok(self.read_data(ino, offset, size)?.into_vec())
    }

    /// [`FileSystem::read`] without the final copy: blocks read ahead are handed out as
    /// shared pieces, which the FUSE layer writes to the kernel straight from the slot.
    pub fn read_data(&self, ino: Ino, offset: u64, size: u32) -> FsResult<FileData> {
        self.settle_gathered(ino);
        let started = Instant::now();
        let mut attempt = 0;
        let (out, attr) = loop {
            let last = attempt + 1 == READ_RACE_ATTEMPTS;
            match self.read_data_once(ino, offset, size, last) {
                Err(FsError::Checksum { .. }) if !last => {
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_millis(2 * u64::from(attempt)));
                }
                result => break result?,
            }
        };
        // Decided on the attributes the read's view brought along: on a client, asking
        // the owner about the access time would double the round trips of every read.
        if self.atime_due(&attr, self.now()) {
            self.metanode_of(ino).accessed(ino);
        }
        self.pmon.read(out.len() as u64, started.elapsed());
        Ok(out)
    }

    /// One attempt of [`FileSystem::read_data`]; a checksum mismatch is reported (logged
    /// and counted) only when `report`.
    fn read_data_once(
        &self,
        ino: Ino,
        offset: u64,
        size: u32,
        report: bool,
    ) -> FsResult<(FileData, crate::inode::Attr)> {
        let _data = self.inode_lock(ino).read();
        let bs = self.geo.block_bytes;
        let seen_attr;
        let (len, inline, blocks, file_blocks) = {
            // The blocks the request could reach; the file's size, known with the view,
            // cuts it short at the end of file.
            let asked_end = offset.saturating_add(u64::from(size));
            let view = self
                .metanode_of(ino)
                .view_to_read(ino, offset / bs..asked_end.div_ceil(bs))?;
            let attr = view.attr;
            if attr.kind == FileKind::Directory {
                return Err(FsError::IsDir);
            }
            let len = attr.size.saturating_sub(offset).min(u64::from(size)) as usize;
            if len == 0 {
                return Ok((FileData::default(), attr));
            }
            let end = offset + len as u64;
            let file_blocks = attr.size.div_ceil(bs);
            seen_attr = attr;
            match view.content {
                Content::Inline(d) => (len, Some(d), Vec::new(), file_blocks),
                Content::Blocks(mapped) => {
                    let (first, last) = (offset / bs, end.div_ceil(bs));
                    let mut mapped = mapped.into_iter().peekable();
                    let mut parts = Vec::new();
                    for b in first..last {
                        let lo = offset.max(b * bs) - b * bs;
                        let hi = end.min((b + 1) * bs) - b * bs;
                        let r = mapped.next_if(|(i, _)| *i == b).map(|(_, r)| r);
                        parts.push((b, lo, hi, r.map(|r| sector_infos(&r, lo, hi))));
                    }
                    (len, None, parts, file_blocks)
                }
                Content::None => return Err(FsError::Invalid("not a regular file".into())),
            }
        };
        let slots = match (blocks.first(), blocks.last()) {
            (Some(first), Some(last)) => self.prefetch.on_read(
                ino,
                offset..offset + len as u64,
                (first.0, last.0),
                file_blocks,
            ),
            _ => None,
        };
        let out = match slots {
            Some(slots) => self.read_ahead_parts(ino, len, blocks, &slots, report)?,
            None => {
                let mut out = vec![0u8; len];
                if let Some(d) = inline {
                    let start = (offset as usize).min(d.len());
                    let n = d.len().saturating_sub(start).min(len);
                    out[..n].copy_from_slice(&d[start..start + n]);
                }
                for (b, lo, hi, info) in blocks {
                    let Some((copies, sectors)) = info else {
                        continue;
                    };
                    let dst = (b * bs + lo - offset) as usize;
                    let out = &mut out[dst..dst + (hi - lo) as usize];
                    self.read_sectors(ino, &copies, &sectors, lo, out, report, Some(b))?;
                }
                FileData::from(out)
            }
        };
        Ok((out, seen_attr))
    }

    /// A sequential read: its blocks come from read-ahead slots when those still hold what
    /// the block map says (handed out shared, not copied), else straight from the drives.
    #[allow(clippy::type_complexity)]
    fn read_ahead_parts(
        &self,
        ino: Ino,
        len: usize,
        parts: Vec<(u64, u64, u64, Option<(Vec<Extent>, Vec<SectorInfo>)>)>,
        slots: &[std::sync::Arc<crate::prefetch::Slot>],
        report: bool,
    ) -> FsResult<FileData> {
        let mut out = FileData::default();
        for ((b, lo, hi, info), slot) in parts.into_iter().zip(slots) {
            let n = (hi - lo) as usize;
            let Some((copies, sectors)) = info else {
                out.push(Piece::Zeros(n));
                continue;
            };
            let data = slot.get(self, ino, b);
            if let Some(d) = data.filter(|d| is_current(d, &copies[0], &sectors, lo)) {
                let start = (lo as usize).min(d.bytes().len());
                let m = (d.bytes().len() - start).min(n);
                out.push(Piece::Block {
                    data: d,
                    start,
                    len: m,
                });
                // Past the end of a short fragment: zeros.
                out.push(Piece::Zeros(n - m));
                continue;
            }
            let mut bytes = vec![0u8; n];
            self.read_sectors(ino, &copies, &sectors, lo, &mut bytes, report, Some(b))?;
            out.push(Piece::Bytes(bytes));
        }
        debug_assert_eq!(out.len(), len);
        Ok(out)
    }

    /// Reads bytes `lo..lo+out.len()` of a block, verifying every written sector; from the
    /// first copy that verifies (see [`FileSystem::read_verified`]).
    #[allow(clippy::too_many_arguments)]
    fn read_sectors(
        &self,
        ino: Ino,
        copies: &[Extent],
        sectors: &[SectorInfo],
        lo: u64,
        out: &mut [u8],
        report: bool,
        repair: Option<u64>,
    ) -> FsResult<()> {
        let first = lo / SECTOR;
        let present = self.extent_sectors(&copies[0]) as u64;
        let last = (lo + out.len() as u64).div_ceil(SECTOR).min(present);
        if first >= last || sectors.iter().all(|s| s.unwritten) {
            return Ok(()); // Beyond a short fragment or never written: zeros.
        }
        let mut buf = AlignedBuf::zeroed(((last - first) * SECTOR) as usize);
        self.read_verified(
            ino,
            copies,
            first * SECTOR,
            &mut buf,
            sectors,
            report,
            repair,
        )?;
        let skip = (lo - first * SECTOR) as usize;
        let n = out.len().min(buf.len() - skip);
        out[..n].copy_from_slice(&buf[skip..skip + n]);
        Ok(())
    }

    /// Reads `buf.len()` bytes at byte `rel` of a block whose copies are `copies` and checks
    /// them against `sectors` (one per sector of `buf`): unwritten sectors become zeros.
    /// Copies on disks that are down are skipped; a copy that fails to read or to verify
    /// gives way to the next, and the first that verifies is the answer. With `repair`
    /// (the block's index, given by readers that hold no lock of the block) copies that
    /// failed their checksums are then written over with the good bytes. A mismatch on
    /// every copy is EIO and, when `report`, a log line naming the NSD and the byte.
    /// Returns what each sector verified as.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn read_verified(
        &self,
        ino: Ino,
        copies: &[Extent],
        rel: u64,
        buf: &mut [u8],
        sectors: &[SectorInfo],
        report: bool,
        repair: Option<u64>,
    ) -> FsResult<Vec<SectorState>> {
        let several = copies.len() > 1;
        let mut failed: Option<FsError> = None;
        let mut damaged = Vec::new();
        let order = self.read_order(copies);
        for (i, extent) in order.iter().enumerate() {
            if several && self.devices.is_down(extent.addr.disk) {
                continue;
            }
            let at = self.extent_offset(extent) + rel;
            let last = i + 1 == order.len();
            // Only `fastest` uses the latencies: no clock or table on other reads.
            let timed = several
                && self.read_replica_policy() == crate::replication::ReadReplicaPolicy::Fastest;
            let started = timed.then(Instant::now);
            let result = self.read_copy(ino, extent, at, buf, sectors, report, !last);
            if let Some(t) = started {
                let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
                self.devices.note_read(extent.addr.disk, ns);
            }
            match result {
                Ok(states) => {
                    if !report {
                        // Another copy verified, so these mismatches were no race with a
                        // writer: count them, as a reporting read does.
                        for _ in &damaged {
                            self.pmon.checksum_error();
                        }
                    }
                    if let (Some(b), false) = (repair, damaged.is_empty()) {
                        self.repair_copies(ino, b, &damaged, extent, rel, buf, sectors);
                    }
                    return Ok(states);
                }
                Err(e @ FsError::Checksum { .. }) => {
                    damaged.push(*extent);
                    failed = Some(e);
                }
                Err(e) if several => {
                    tracing::warn!(
                        "reading inode {ino} from NSD {}: {e}; trying the next copy",
                        self.devices.name(extent.addr.disk)
                    );
                    failed.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(failed.unwrap_or_else(|| {
            FsError::Io(std::io::Error::other(format!(
                "inode {ino}: every copy of the block is on a disk that is down; start the \
                 disks (tessera disk change DEVICE start -d NSD)"
            )))
        }))
    }

    /// [`FileSystem::read_verified`] of one copy at byte `at` of its disk. With `more`
    /// another copy is tried after a mismatch, which the log line says.
    #[allow(clippy::too_many_arguments)]
    fn read_copy(
        &self,
        ino: Ino,
        extent: &Extent,
        at: u64,
        buf: &mut [u8],
        sectors: &[SectorInfo],
        report: bool,
        more: bool,
    ) -> FsResult<Vec<SectorState>> {
        let dev = self.devices.get(extent.addr.disk);
        dev.read_at(buf, at)?;
        let count = buf.len() / SECTOR as usize;
        let mut states = Vec::with_capacity(count);
        for (i, info) in sectors.iter().enumerate().take(count) {
            let bytes = &mut buf[i * SECTOR as usize..(i + 1) * SECTOR as usize];
            if info.unwritten {
                bytes.fill(0);
                states.push(SectorState::Unwritten);
                continue;
            }
            let crc = crc32c::crc32c(bytes);
            if crc == info.crc || info.alternative == Some(Alternative::Crc(crc)) {
                states.push(SectorState::Crc(crc));
                continue;
            }
            if info.alternative == Some(Alternative::Unwritten) {
                // A write into a never-written sector did not land before a crash.
                bytes.fill(0);
                states.push(SectorState::Unwritten);
                continue;
            }
            let offset = at + i as u64 * SECTOR;
            let nsd = self.devices.name(extent.addr.disk);
            if !report {
                return Err(FsError::Checksum { nsd, offset, ino });
            }
            self.pmon.checksum_error();
            tracing::error!(
                "checksum mismatch: NSD {nsd} ({}) byte {offset} (inode {ino}): expected {:08x}, \
                 found {crc:08x}{}",
                dev.name(),
                info.crc,
                if more { "; reading the next copy" } else { "" }
            );
            return Err(FsError::Checksum { nsd, offset, ino });
        }
        Ok(states)
    }

    /// Reads block `block` of a file whole and verified, for read-ahead. `None` when the
    /// block is unmapped or never written (readers produce its zeros themselves).
    pub(crate) fn load_block(&self, ino: Ino, block: u64) -> FsResult<Option<BlockData>> {
        let found = match self.metanode_of(ino).view_to_read(ino, block..block + 1) {
            Ok(view) => view
                .block(block)
                .map(|r| sector_infos(r, 0, r.sectors() as u64 * SECTOR)),
            Err(_) => None,
        };
        let Some((copies, sectors)) = found else {
            return Ok(None);
        };
        let extent = copies[0];
        let present = self.extent_sectors(&extent).min(sectors.len());
        if present == 0 || sectors.iter().all(|s| s.unwritten) {
            return Ok(None);
        }
        let bytes = present * SECTOR as usize;
        let mut buf = self.prefetch.buffer(bytes);
        // Quiet: a read-ahead that fails is read again by the reader, which reports.
        let states = self.read_verified(
            ino,
            &copies,
            0,
            &mut buf[..bytes],
            &sectors,
            false,
            Some(block),
        )?;
        Ok(Some(self.prefetch.block_data(extent, buf, bytes, states)))
    }

    /// Writes `data` at `offset`. With `sync` (O_SYNC, O_DSYNC, O_DIRECT) the data and the
    /// metadata that reaches it are durable on return.
    pub fn write(&self, ino: Ino, offset: u64, data: &[u8], sync: bool) -> FsResult<usize> {
        // Nothing to write changes nothing (POSIX), and must not start a gathered run: an
        // empty run past the end made `stat` report a size no read returned.
        if data.is_empty() {
            return self.write_direct(ino, offset, data, sync);
        }
        if let Some(n) = self.write_behind(ino, offset, data, sync)? {
            return Ok(n);
        }
        self.write_direct(ino, offset, data, sync)
    }

    /// [`FileSystem::write`] to the disks now, past anything gathered.
    pub(crate) fn write_direct(
        &self,
        ino: Ino,
        offset: u64,
        data: &[u8],
        sync: bool,
    ) -> FsResult<usize> {
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or(FsError::FileTooLarge)?;
        if end > FILE_BYTES_MAX {
            return Err(FsError::FileTooLarge);
        }
        if data.is_empty() {
            return Ok(0);
        }
        let _stale = self.prefetch.invalidate_after(ino);
        let started = Instant::now();
        let _through = sync.then(WriteThrough::begin);
        let shared = self.inode_lock(ino).read();
        // The view of the first block written tells whether the file is inline (its bytes
        // in the inode: the same answer for every range), and is the one that block's plan
        // reads next: one request to a remote owner, not two.
        let first = offset / self.geo.block_bytes;
        let written = if self
            .metanode_of(ino)
            .view(ino, first..first + 1)?
            .is_inline()
        {
            // Inline data is rewritten whole and may move into a block: one writer at a
            // time, on this node and on every other (the token of the whole file).
            drop(shared);
            let _exclusive = self.inode_lock(ino).write();
            let _token = self.data_token(ino, 0, crate::locks::TO_END)?;
            // A takeover of the metadata in the middle: the update was not done (the new
            // owner has what this mount did before, from its fence); written again there.
            let mut moves = 0;
            loop {
                match self.write_locked(ino, offset, data) {
                    Err(FsError::OwnerMoved) if moves < OWNER_MOVES_MAX => {
                        tracing::info!(
                            "inode {ino}: the metadata owner changed under a write of inline \
                             data; writing it again"
                        );
                        moves += 1;
                    }
                    written => break written?,
                }
            }
        } else {
            self.write_range(ino, offset, data)?
        };
        if sync {
            self.metanode_of(ino)
                .commit_data(written.lsn, &written.disks)?;
        }
        self.pmon.write(data.len() as u64, started.elapsed());
        Ok(data.len())
    }

    /// The body of a write; the caller holds the inode lock exclusively.
    fn write_locked(&self, ino: Ino, offset: u64, data: &[u8]) -> FsResult<Written> {
        let end = offset + data.len() as u64;
        let inline = {
            let view = self.metanode_of(ino).view(ino, 0..0)?;
            if view.attr.kind != FileKind::Regular {
                return Err(if view.attr.kind == FileKind::Directory {
                    FsError::IsDir
                } else {
                    FsError::Invalid("not a regular file".into())
                });
            }
            match view.content {
                Content::Inline(cur) if end as usize <= self.geo.inline_max_bytes => {
                    let mut bytes = cur;
                    bytes.resize(bytes.len().max(end as usize), 0);
                    bytes[offset as usize..end as usize].copy_from_slice(data);
                    let change = Change::Inline { ino, data: bytes };
                    let lsn = self
                        .metanode_of(ino)
                        .update(ino, FileUpdate::written(vec![change], end))?;
                    return Ok(Written {
                        lsn,
                        disks: Vec::new(),
                    });
                }
                Content::Inline(cur) => Some(cur),
                _ => None,
            }
        };
        let mut written = Written::default();
        if let Some(bytes) = inline.filter(|b| !b.is_empty()) {
            // Inline data moves into block 0 before the file grows past the inode.
            written.merge(self.write_range(ino, 0, &bytes)?);
        }
        written.merge(self.write_range(ino, offset, data)?);
        Ok(written)
    }

    fn write_range(&self, ino: Ino, offset: u64, data: &[u8]) -> FsResult<Written> {
        let bs = self.geo.block_bytes;
        let end = offset + data.len() as u64;
        let mut written = Written::default();
        for b in offset / bs..end.div_ceil(bs) {
            let lo = offset.max(b * bs);
            let hi = end.min((b + 1) * bs);
            let chunk = &data[(lo - offset) as usize..(hi - offset) as usize];
            written.merge(self.write_block(ino, b, lo - b * bs, chunk)?);
        }
        Ok(written)
    }

    /// Writes into one block. Writes that stay inside the block's current extent run under
    /// the block's shared lock and the locks of the segments they touch, so writers of
    /// different parts of one block proceed in parallel; changing the extent (a new block, a
    /// growing fragment, copy-on-write) takes the block's lock exclusively.
    fn write_block(&self, ino: Ino, b: u64, off: u64, data: &[u8]) -> FsResult<Written> {
        let bs = self.geo.block_bytes;
        // The sectors it touches; widened to the whole block if the extent must change.
        let first = off / SECTOR * SECTOR;
        let last = (off + data.len() as u64).div_ceil(SECTOR) * SECTOR - 1;
        let mut token = self.data_token(ino, b * bs + first, b * bs + last.min(bs - 1))?;
        // A takeover of the metadata in the middle voids what the old owner showed or gave
        // (nothing of it reached the new owner or the disk): plan and write again.
        let mut moves = 0;
        loop {
            let seen = self.metanode_of(ino).generation();
            match self.write_block_seen(ino, b, off, data, seen, &mut token) {
                Err(FsError::OwnerMoved) if moves < OWNER_MOVES_MAX => {
                    tracing::info!(
                        "inode {ino} block {b}: the metadata owner changed under a write; \
                         writing it again"
                    );
                    moves += 1;
                }
                result => return result,
            }
        }
    }

    /// [`Self::write_block`] on what the owner of generation `seen` shows and gives.
    fn write_block_seen(
        &self,
        ino: Ino,
        b: u64,
        off: u64,
        data: &[u8],
        seen: u64,
        token: &mut Option<crate::locks::DataToken<'_>>,
    ) -> FsResult<Written> {
        let len = data.len() as u64;
        let block = self.block_lock(ino, b);
        // A new whole block is first mapped unwritten, then written in place: at most twice.
        for _ in 0..2 {
            {
                let _shared = block.read();
                let _segments = self.segment_locks(ino, b, off, len);
                if let BlockPlan::InPlace { current } = self.plan_block(ino, b, off, len, false)? {
                    return self.write_in_place(ino, b, off, data, current, seen);
                }
            }
            if let Some(token) = token.as_mut() {
                let bs = self.geo.block_bytes;
                token.widen(b * bs, (b + 1) * bs - 1)?;
            }
            let _exclusive = block.write();
            let plan = self.plan_block(ino, b, off, len, true)?;
            match plan {
                BlockPlan::InPlace { current } => {
                    return self.write_in_place(ino, b, off, data, current, seen)
                }
                BlockPlan::NewBlock { extents } => {
                    // Unwritten sectors read as zeros, so mapping before writing exposes
                    // nothing, and later writers of this block need no exclusive lock.
                    if let Err(e) = self.map_unwritten(ino, b, &extents, seen) {
                        self.abandon_all(ino, &extents);
                        return Err(e);
                    }
                }
                BlockPlan::Fresh { extents, copy } => {
                    let result = self.write_fresh(ino, b, off, data, (&extents, copy), seen);
                    if result.is_err() {
                        self.abandon_all(ino, &extents);
                    }
                    return result;
                }
                BlockPlan::NeedsExclusive => unreachable!("planned with the exclusive lock"),
            }
        }
        Err(FsError::Corrupt(format!(
            "block {b} of inode {ino} keeps changing under a write"
        )))
    }

    /// Gives back extents no update mapped.
    fn abandon_all(&self, ino: Ino, extents: &[Extent]) {
        for e in extents {
            self.allocator_of(ino).abandon(*e);
        }
    }

    /// A new block of the file: one extent, or one per copy the file asks for. `grown` says
    /// the block has an extent already that this one replaces (a fragment grown by a
    /// write past its end).
    fn allocate_block(
        &self,
        view: &crate::metanode::FileView,
        sub_blocks: u32,
        hint: BlockHint,
        grown: bool,
        what: &'static str,
    ) -> FsResult<Vec<Extent>> {
        let allocator = self.allocator_of(view.attr.ino);
        // Only a new small file's first fragment comes from a client's reserve: a fragment
        // grown one append at a time needs a new size at every step, and asking ahead for
        // each size held many times the file's size out of everyone's reach.
        if view.copies <= 1
            && hint.prev.is_none()
            && !grown
            && sub_blocks < self.geo.sub_blocks_per_block
        {
            return Ok(vec![
                allocator.allocate_first_fragment(view.pool, sub_blocks, hint, what)?
            ]);
        }
        if view.copies <= 1 {
            return Ok(vec![allocator.allocate(view.pool, sub_blocks, hint, what)?]);
        }
        allocator.allocate_copies(view.pool, sub_blocks, hint, view.copies, what)
    }

    /// Maps `extents` (the block's copies) as block `b` with every sector unwritten (reads
    /// as zeros).
    fn map_unwritten(&self, ino: Ino, b: u64, extents: &[Extent], seen: u64) -> FsResult<Lsn> {
        let mut block = BlockRef::new_unwritten(extents[0], self.extent_sectors(&extents[0]));
        block.copies = extents[1..].to_vec();
        let map = Change::map_block(ino, b, block);
        self.metanode_of(ino)
            .update_seen(ino, FileUpdate::content(vec![map]), seen)
    }

    /// Decides how a write into block `b` proceeds. Without `exclusive` it only recognises
    /// in-place writes and allocates nothing.
    fn plan_block(
        &self,
        ino: Ino,
        b: u64,
        off: u64,
        len: u64,
        exclusive: bool,
    ) -> FsResult<BlockPlan> {
        let bs = self.geo.block_bytes;
        let per = self.geo.sub_blocks_per_block;
        // Just this block: an in-place write (the common random write) needs nothing else,
        // and each block reference handed out is a 4 KiB copy.
        let view = self.metanode_of(ino).view(ino, b..b + 1)?;
        let attr = &view.attr;
        let current = view.block(b).cloned();
        let size_after = attr.size.max(b * bs + off + len);
        // Only a file that fits in one block gets a fragment (GPFS keeps the last block of
        // small files in sub-blocks); everything else uses whole blocks.
        let needed = if b == 0 && size_after <= bs {
            let have = current.as_ref().map_or(0, |c| c.extent.sub_blocks);
            ((off + len).div_ceil(self.geo.sub_block_bytes) as u32)
                .max(have)
                .min(per)
        } else {
            per
        };
        let whole_block = off == 0 && len == bs;
        let fresh = match &current {
            None => true,
            Some(c) => c.extent.sub_blocks < needed || (whole_block && c.any_written()),
        };
        if !fresh {
            return Ok(BlockPlan::InPlace {
                current: current.expect("not fresh"),
            });
        }
        if !exclusive {
            return Ok(BlockPlan::NeedsExclusive);
        }
        // A new extent goes after the previous block's, where it can: where this mount
        // placed it, if it did (a sequential writer's previous block, a hint only), or
        // where the owner's view says.
        let prev = match b.checked_sub(1) {
            Some(p) => match self.placed.get(ino, p) {
                Some(addr) => Some(addr),
                None => self
                    .metanode_of(ino)
                    .view(ino, p..b)?
                    .block(p)
                    .map(|r| r.extent.addr),
            },
            None => None,
        };
        let hint = BlockHint {
            file_key: ino,
            block_index: b,
            prev,
        };
        let extents = self.allocate_block(&view, needed, hint, current.is_some(), "file data")?;
        // A new block written in part is mapped unwritten first, so that other writers of
        // its other sectors need no exclusive lock; one written whole (a sequential
        // writer's) is written, then mapped with its checksums: one map update, not two.
        if current.is_none() && needed == per && !whole_block {
            return Ok(BlockPlan::NewBlock { extents });
        }
        let copy = current.filter(|c| !(whole_block || c.extent.sub_blocks >= needed));
        Ok(BlockPlan::Fresh { extents, copy })
    }

    fn write_fresh(
        &self,
        ino: Ino,
        b: u64,
        off: u64,
        data: &[u8],
        (extents, copy): (&[Extent], Option<BlockRef>),
        seen: u64,
    ) -> FsResult<Written> {
        let sectors = self.extent_sectors(&extents[0]);
        let mut block = BlockRef::new_unwritten(extents[0], sectors);
        block.copies = extents[1..].to_vec();
        let touched_lo = (off / SECTOR) as usize;
        let touched_hi = (off + data.len() as u64).div_ceil(SECTOR) as usize;
        let copy_hi = copy.as_ref().map_or(0, |c| {
            (0..c.sectors())
                .rev()
                .find(|s| !c.is_unwritten(*s))
                .map_or(0, |s| s + 1)
        });
        let lo = if copy_hi > 0 { 0 } else { touched_lo };
        let hi = touched_hi.max(copy_hi);
        assert!(hi <= sectors, "write past the extent: {hi} > {sectors}");
        if let (None, Some(data)) = (&copy, whole_sectors(off, data)) {
            Scratch::reserve(data.len());
            for (i, sector) in data.chunks(SECTOR as usize).enumerate() {
                block.set_written(touched_lo + i, crc32c::crc32c(sector));
            }
            return self.write_fresh_block(ino, b, off, data, block, touched_lo, data, seen);
        }
        let mut buf = Scratch::take((hi - lo) * SECTOR as usize);
        let at = off as usize - lo * SECTOR as usize;
        buf.zero_outside(at, data.len());
        if let Some(old) = &copy {
            let infos = sector_infos(old, 0, copy_hi as u64 * SECTOR).1;
            self.read_sectors(
                ino,
                &old.extents().collect::<Vec<_>>(),
                &infos,
                0,
                &mut buf[..copy_hi * SECTOR as usize],
                true,
                None,
            )?;
            for s in 0..copy_hi {
                if !old.is_unwritten(s) {
                    let bytes = &buf[s * SECTOR as usize..(s + 1) * SECTOR as usize];
                    block.set_written(s, crc32c::crc32c(bytes));
                }
            }
        }
        buf[at..at + data.len()].copy_from_slice(data);
        for s in touched_lo..touched_hi {
            let i = s - lo;
            block.set_written(
                s,
                crc32c::crc32c(&buf[i * SECTOR as usize..(i + 1) * SECTOR as usize]),
            );
        }
        self.write_fresh_block(ino, b, off, data, block, lo, &buf, seen)
    }

    /// Writes `buf` (sectors from `lo` of fresh extents, one per copy of `block`) and maps
    /// the block to them; a copy whose write failed is left out of the map.
    #[allow(clippy::too_many_arguments)]
    fn write_fresh_block(
        &self,
        ino: Ino,
        b: u64,
        off: u64,
        data: &[u8],
        mut block: BlockRef,
        lo: usize,
        buf: &[u8],
        seen: u64,
    ) -> FsResult<Written> {
        let copies: Vec<Extent> = block.extents().collect();
        let (disks, failed) = self.write_copies(ino, &copies, (lo as u64) * SECTOR, buf, seen)?;
        if !failed.is_empty() {
            block.copies.clear();
            let mut kept = copies.iter().filter(|e| !failed.contains(e));
            block.extent = *kept.next().expect("a copy landed");
            block.copies = kept.copied().collect();
            self.abandon_all(ino, &failed);
        }
        let end = b * self.geo.block_bytes + off + data.len() as u64;
        let addr = block.extent.addr;
        let map = Change::map_block(ino, b, block);
        let lsn =
            self.metanode_of(ino)
                .update_seen(ino, FileUpdate::written(vec![map], end), seen)?;
        self.placed.note(ino, b, addr);
        Ok(Written::on(lsn, disks))
    }

    /// Writes `buf` at byte `rel` of every copy (in the order given; the first is the one
    /// reads prefer). Returns the disks written and the copies that failed: a copy on a
    /// disk that is down is not written, and one whose write fails marks its disk down,
    /// both only while another copy lands; when none does, the error.
    fn write_copies(
        &self,
        ino: Ino,
        copies: &[Extent],
        rel: u64,
        buf: &[u8],
        seen: u64,
    ) -> FsResult<(Vec<u16>, Vec<Extent>)> {
        let metanode = self.metanode_of(ino);
        let through = WriteThrough::on();
        let write = |dev: &dyn tessera_drive::BlockDevice, at: u64| {
            if through {
                dev.write_fua(buf, at)
            } else {
                dev.write_at(buf, at)
            }
        };
        if let [extent] = copies {
            // A block's only copy on a disk that is down (left so by an interrupted
            // `restripe -r`, then the disk stopped): commits skip the disk, so a write
            // there would be acknowledged and never flushed.
            if self.devices.is_down(extent.addr.disk) {
                return Err(every_copy_down());
            }
            let dev = self.devices.get(extent.addr.disk);
            let at = self.extent_offset(extent) + rel;
            metanode.write_seen(seen, &mut || write(&*dev, at))?;
            return Ok((vec![extent.addr.disk], Vec::new()));
        }
        let mut disks = Vec::with_capacity(copies.len());
        let mut failed = Vec::new();
        let mut error = None;
        for extent in copies {
            let disk = extent.addr.disk;
            if self.devices.is_down(disk) {
                failed.push(*extent);
                continue;
            }
            let dev = self.devices.get(disk);
            let at = self.extent_offset(extent) + rel;
            match metanode.write_seen(seen, &mut || write(&*dev, at)) {
                // Stopped while this write ran: its bytes may not be flushed by the stop
                // (commits skip a disk that is down), so the copy goes as if it failed.
                Ok(()) if self.devices.is_down(disk) => failed.push(*extent),
                Ok(()) => disks.push(disk),
                Err(FsError::Io(e)) => {
                    self.mark_down(disk, &format!("a write failed: {e}"));
                    failed.push(*extent);
                    error.get_or_insert(FsError::Io(e));
                }
                Err(e) => return Err(e),
            }
        }
        if disks.is_empty() {
            return Err(error.unwrap_or_else(every_copy_down));
        }
        Ok((disks, failed))
    }

    /// Drops the copies in `gone` from block `b` (logged, so the map never names a copy
    /// that missed a write). Returns the block as it is after.
    fn drop_copies(&self, ino: Ino, b: u64, gone: Vec<Extent>, seen: u64) -> FsResult<BlockRef> {
        let change = Change::DropCopies {
            ino,
            index: b,
            extents: gone,
        };
        self.metanode_of(ino)
            .update_seen(ino, FileUpdate::content(vec![change]), seen)?;
        let view = self.metanode_of(ino).view(ino, b..b + 1)?;
        view.block(b).cloned().ok_or_else(|| {
            FsError::Corrupt(format!("block {b} of inode {ino} vanished under a write"))
        })
    }

    fn write_in_place(
        &self,
        ino: Ino,
        b: u64,
        off: u64,
        data: &[u8],
        current: BlockRef,
        seen: u64,
    ) -> FsResult<Written> {
        let lo = (off / SECTOR) as usize;
        let hi = (off + data.len() as u64).div_ceil(SECTOR) as usize;
        // Copies on disks that are down leave the map before the write, which they miss.
        let down: Vec<Extent> = match current.copy_count() {
            1 => Vec::new(),
            _ => current
                .extents()
                .filter(|e| self.devices.is_down(e.addr.disk))
                .collect(),
        };
        let current = if down.is_empty() || down.len() == current.copy_count() {
            current
        } else {
            self.drop_copies(ino, b, down, seen)?
        };
        let current = self.resolve_pending(ino, b, current, lo, hi, seen)?;
        let copies: Vec<Extent> = current.extents().collect();
        let scratch;
        let buf: &[u8] = match whole_sectors(off, data) {
            Some(data) => {
                Scratch::reserve(data.len());
                data
            }
            None => {
                let mut buf = Scratch::take((hi - lo) * SECTOR as usize);
                buf.zero_outside(off as usize - lo * SECTOR as usize, data.len());
                // Partial head and tail sectors keep their other bytes: read and verify them.
                for s in [lo, hi - 1] {
                    let partial = (s == lo && !off.is_multiple_of(SECTOR))
                        || (s == hi - 1 && !(off + data.len() as u64).is_multiple_of(SECTOR));
                    if partial && !current.is_unwritten(s) {
                        let infos =
                            sector_infos(&current, s as u64 * SECTOR, (s as u64 + 1) * SECTOR).1;
                        let i = s - lo;
                        let dst = &mut buf[i * SECTOR as usize..(i + 1) * SECTOR as usize];
                        self.read_sectors(
                            ino,
                            &copies,
                            &infos,
                            s as u64 * SECTOR,
                            dst,
                            true,
                            None,
                        )?;
                    }
                }
                let at = off as usize - lo * SECTOR as usize;
                buf[at..at + data.len()].copy_from_slice(data);
                scratch = buf;
                &scratch
            }
        };
        let crcs: Vec<u32> = buf.chunks(SECTOR as usize).map(crc32c::crc32c).collect();
        let overwrite = (lo..hi).any(|s| !current.is_unwritten(s));
        let size_after = b * self.geo.block_bytes + off + data.len() as u64;
        let sectors = Change::Sectors {
            ino,
            index: b,
            first: lo as u32,
            crcs,
            in_place: overwrite,
        };
        let rel = (lo as u64) * SECTOR;
        let update = FileUpdate::written(vec![sectors], size_after);
        let metanode = self.metanode_of(ino);
        if !overwrite {
            let (disks, failed) = self.write_copies(ino, &copies, rel, buf, seen)?;
            if !failed.is_empty() {
                self.drop_copies(ino, b, failed, seen)?;
            }
            return Ok(Written::on(metanode.update_seen(ino, update, seen)?, disks));
        }
        let lsn = metanode.update_seen(ino, update, seen)?;
        metanode.commit(lsn)?;
        let (disks, failed) = self.write_copies(ino, &copies, rel, buf, seen)?;
        if !failed.is_empty() {
            self.drop_copies(ino, b, failed, seen)?;
        }
        let settle = Change::Settle {
            ino,
            index: b,
            first: lo as u32,
            count: (hi - lo) as u32,
        };
        metanode.update_seen(ino, FileUpdate::content(vec![settle]), seen)?;
        // The checksums went to disk with the intent; a sync writer needs only the data.
        Ok(Written::on(lsn, disks))
    }

    /// Sectors `lo..hi` of block `b` that still have a pending alternative (an in-place
    /// write in flight at a crash, whose settle never came) hold one of two contents, and
    /// only the disk can tell which. An in-place write over such a sector would record the
    /// newer checksum as its own alternative even when that write never landed, and after
    /// another crash the sector would match neither. So they are read first, and what they
    /// hold is logged: the write landed (settle) or it did not (revert to the alternative).
    /// A sector that matches neither is left for the reads to report. Returns the block as
    /// it is after that.
    fn resolve_pending(
        &self,
        ino: Ino,
        b: u64,
        current: BlockRef,
        lo: usize,
        hi: usize,
        seen: u64,
    ) -> FsResult<BlockRef> {
        let ambiguous: Vec<usize> = (lo..hi)
            .filter(|s| current.pending.contains_key(&(*s as u32)))
            .collect();
        if ambiguous.is_empty() {
            return Ok(current);
        }
        let dev = self.devices.get(current.extent.addr.disk);
        let mut changes = Vec::new();
        let mut sector = tessera_drive::AlignedBuf::zeroed(SECTOR as usize);
        for s in ambiguous {
            dev.read_at(
                &mut sector,
                self.extent_offset(&current.extent) + s as u64 * SECTOR,
            )?;
            let crc = crc32c::crc32c(&sector);
            let alternative = current.pending[&(s as u32)];
            let first = s as u32;
            if !current.is_unwritten(s) && crc == current.crcs[s] {
                changes.push(Change::Settle {
                    ino,
                    index: b,
                    first,
                    count: 1,
                });
            } else if alternative == Alternative::Crc(crc) || alternative == Alternative::Unwritten
            {
                changes.push(Change::Revert {
                    ino,
                    index: b,
                    sector: first,
                    to: alternative,
                });
            }
        }
        if !changes.is_empty() {
            self.metanode_of(ino)
                .update_seen(ino, FileUpdate::content(changes), seen)?;
        }
        let view = self.metanode_of(ino).view(ino, b..b + 1)?;
        Ok(view.block(b).cloned().unwrap_or(current))
    }

    /// Sets the file size (truncate and extend).
    pub fn truncate(&self, ino: Ino, size: u64) -> FsResult<()> {
        self.flush_gathered(ino)?;
        let _stale = self.prefetch.invalidate_after(ino);
        if size > FILE_BYTES_MAX {
            return Err(FsError::FileTooLarge);
        }
        let _data = self.inode_lock(ino).write();
        let attr = self.regular_attr(ino)?;
        let bs = self.geo.block_bytes;
        // No other node writes into what this cuts (or the block it cuts into) meanwhile.
        let _token = self.data_token(ino, size / bs * bs, crate::locks::TO_END)?;
        let boundary_written = {
            let boundary = size / bs;
            let view = self.metanode_of(ino).view(ino, boundary..boundary + 1)?;
            view.block(boundary).is_some_and(|r| {
                let s = ((size % bs) / SECTOR) as usize;
                s < r.sectors() && !r.is_unwritten(s)
            })
        };
        if size < attr.size && !size.is_multiple_of(SECTOR) && boundary_written {
            // Bytes past the new end of file must read as zeros if the file grows again.
            let zeros = (SECTOR - size % SECTOR).min(attr.size - size);
            self.write_range(ino, size, &vec![0; zeros as usize])?;
        }
        let view = self.metanode_of(ino).view(ino, 0..0)?;
        let mut changes = Vec::new();
        match view.content {
            Content::Inline(d) if (size as usize) < d.len() => {
                changes.push(Change::Inline {
                    ino,
                    data: d[..size as usize].to_vec(),
                });
            }
            Content::Blocks(_) if size < view.attr.size => {
                changes.push(Change::Truncate {
                    ino,
                    size,
                    block_size: bs,
                });
            }
            _ => {}
        }
        let shrink = size < view.attr.size;
        let update = FileUpdate {
            changes,
            size: SizeUpdate::Exactly(size),
            times: Times::Modified,
        };
        let lsn = self.metanode_of(ino).update(ino, update)?;
        if shrink {
            // Sectors marked unwritten may be rewritten without a log record first, which is
            // only safe once the truncate itself is durable.
            self.metanode_of(ino).commit(lsn)?;
        }
        Ok(())
    }

    /// fallocate(2): preallocate (optionally keeping the size) or punch a hole.
    pub fn fallocate(&self, ino: Ino, offset: u64, len: u64, mode: i32) -> FsResult<()> {
        if len == 0 {
            // As fallocate(2) says (the kernel refuses it before the file system sees it).
            return Err(FsError::Invalid("fallocate of length 0".into()));
        }
        self.flush_gathered(ino)?;
        let _stale = self.prefetch.invalidate_after(ino);
        let end = offset.checked_add(len).filter(|e| *e <= FILE_BYTES_MAX);
        let end = end.ok_or(FsError::FileTooLarge)?;
        if mode == FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE {
            return self.punch_hole(ino, offset, end);
        }
        if mode & !FALLOC_FL_KEEP_SIZE != 0 {
            return Err(FsError::NotSupported(format!("fallocate mode {mode:#x}")));
        }
        let _data = self.inode_lock(ino).write();
        let attr = self.regular_attr(ino)?;
        let bs = self.geo.block_bytes;
        // No other node maps (or writes into) these blocks meanwhile; an inline file's data
        // moves into block 0 under the whole file's token.
        let _token = if self.metanode_of(ino).view(ino, 0..0)?.is_inline() {
            self.data_token(ino, 0, crate::locks::TO_END)?
        } else {
            self.data_token(ino, offset / bs * bs, end.div_ceil(bs) * bs - 1)?
        };
        if let Content::Inline(bytes) = self.metanode_of(ino).view(ino, 0..0)?.content {
            if !bytes.is_empty() {
                self.write_range(ino, 0, &bytes)?;
            }
        }
        for b in offset / bs..end.div_ceil(bs) {
            let view = self.metanode_of(ino).view(ino, b..b + 1)?;
            if view.block(b).is_some() {
                continue;
            }
            let hint = BlockHint {
                file_key: ino,
                block_index: b,
                prev: None,
            };
            let per = self.geo.sub_blocks_per_block;
            let seen = self.metanode_of(ino).generation();
            let extents = self.allocate_block(&view, per, hint, false, "fallocate")?;
            if let Err(e) = self.map_unwritten(ino, b, &extents, seen) {
                self.abandon_all(ino, &extents);
                return Err(e);
            }
        }
        let size = if mode & FALLOC_FL_KEEP_SIZE == 0 && end > attr.size {
            SizeUpdate::AtLeast(end)
        } else {
            SizeUpdate::Keep
        };
        let update = FileUpdate {
            changes: Vec::new(),
            size,
            times: Times::Changed,
        };
        self.metanode_of(ino).update(ino, update)?;
        Ok(())
    }

    fn punch_hole(&self, ino: Ino, offset: u64, end: u64) -> FsResult<()> {
        let _data = self.inode_lock(ino).write();
        let attr = self.regular_attr(ino)?;
        let end = end.min(attr.size);
        if offset >= end {
            return Ok(());
        }
        let bs = self.geo.block_bytes;
        // No other node writes into what this unmaps or zeroes meanwhile; the zeroing
        // writes below run under this token (an inline file's under the whole file's).
        let (first, last) = (offset / bs * bs, end.div_ceil(bs) * bs - 1);
        let inline = self.metanode_of(ino).view(ino, 0..0)?.is_inline();
        let _token = if inline {
            self.data_token(ino, 0, crate::locks::TO_END)?
        } else {
            self.data_token(ino, first, last)?
        };
        let inline = self.metanode_of(ino).view(ino, 0..0)?.is_inline();
        let mut lsn = 0;
        for b in offset / bs..end.div_ceil(bs) {
            let lo = offset.max(b * bs);
            let hi = end.min((b + 1) * bs);
            let whole = lo == b * bs && hi == (b + 1) * bs;
            let mapped = self
                .metanode_of(ino)
                .view(ino, b..b + 1)?
                .block(b)
                .is_some();
            if whole && mapped {
                let unmap = Change::Unmap { ino, index: b };
                lsn = self
                    .metanode_of(ino)
                    .update(ino, FileUpdate::content(vec![unmap]))?;
            } else if mapped || inline {
                lsn = self
                    .write_locked(ino, lo, &vec![0; (hi - lo) as usize])?
                    .lsn;
            }
        }
        // Unmapped blocks return to the allocator only once durable.
        self.metanode_of(ino).commit(lsn)
    }

    pub fn fsync(&self, ino: Ino) -> FsResult<()> {
        self.flush_gathered(ino)?;
        self.commit_all()
    }
}

/// Whether a block read ahead still holds what the block map (as the reader copied it)
/// says the block holds from byte `lo` on: the same extent and, for every sector, the same
/// checksum or the same unwritten state.
fn is_current(data: &BlockData, extent: &Extent, sectors: &[SectorInfo], lo: u64) -> bool {
    if data.extent != *extent {
        return false;
    }
    let first = (lo / SECTOR) as usize;
    sectors
        .iter()
        .enumerate()
        .all(|(i, info)| match data.sectors.get(first + i) {
            None => false,
            Some(SectorState::Unwritten) => {
                info.unwritten || info.alternative == Some(Alternative::Unwritten)
            }
            Some(&SectorState::Crc(c)) => {
                !info.unwritten && (c == info.crc || info.alternative == Some(Alternative::Crc(c)))
            }
        })
}

/// Zeros for holes, shared by every read.
static ZEROS: [u8; 1 << 16] = [0; 1 << 16];

/// One piece of the bytes a read returns.
enum Piece {
    Bytes(Vec<u8>),
    /// Bytes `start..start+len` of a block read ahead.
    Block {
        data: Arc<BlockData>,
        start: usize,
        len: usize,
    },
    Zeros(usize),
}

/// The bytes a read returns, in pieces: owned bytes, shared pieces of blocks read ahead,
/// and runs of zeros. [`FileData::slices`] gives them in order without copying.
#[derive(Default)]
pub struct FileData {
    pieces: Vec<Piece>,
    len: usize,
}

impl std::fmt::Debug for FileData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "FileData({} bytes in {} pieces)",
            self.len,
            self.pieces.len()
        )
    }
}

/// Equal bytes, however they are split into pieces.
impl PartialEq for FileData {
    fn eq(&self, other: &FileData) -> bool {
        self.len == other.len
            && self
                .slices()
                .flatten()
                .copied()
                .eq(other.slices().flatten().copied())
    }
}

impl Eq for FileData {}

impl From<Vec<u8>> for FileData {
    fn from(bytes: Vec<u8>) -> FileData {
        let mut d = FileData::default();
        d.push(Piece::Bytes(bytes));
        d
    }
}

impl FileData {
    fn push(&mut self, piece: Piece) {
        let n = match &piece {
            Piece::Bytes(b) => b.len(),
            Piece::Block { len, .. } | Piece::Zeros(len) => *len,
        };
        if n > 0 {
            self.len += n;
            self.pieces.push(piece);
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes in order, as borrowed slices (runs of zeros as slices of a shared zero
    /// buffer).
    pub fn slices(&self) -> impl Iterator<Item = &[u8]> {
        self.pieces.iter().flat_map(|p| {
            let (one, zeros): (Option<&[u8]>, usize) = match p {
                Piece::Bytes(b) => (Some(b), 0),
                Piece::Block { data, start, len } => (Some(&data.bytes()[*start..start + len]), 0),
                Piece::Zeros(n) => (None, *n),
            };
            let runs = (0..zeros.div_ceil(ZEROS.len()))
                .map(move |i| &ZEROS[..(zeros - i * ZEROS.len()).min(ZEROS.len())]);
            one.into_iter().chain(runs)
        })
    }

    /// The bytes as one vector (one copy; a single owned piece moves without copying).
    pub fn into_vec(mut self) -> Vec<u8> {
        if let [Piece::Bytes(b)] = self.pieces.as_mut_slice() {
            return std::mem::take(b);
        }
        let mut out = Vec::with_capacity(self.len);
        for s in self.slices() {
            out.extend_from_slice(s);
        }
        out
    }
}

/// The copies of `r` (the first one first) and the sector infos covering bytes `lo..hi`
/// of its block.
pub(crate) fn sector_infos(r: &BlockRef, lo: u64, hi: u64) -> (Vec<Extent>, Vec<SectorInfo>) {
    let first = (lo / SECTOR) as usize;
    let last = (hi.div_ceil(SECTOR) as usize).min(r.sectors());
    let infos = (first..last.max(first))
        .map(|s| SectorInfo {
            unwritten: r.is_unwritten(s),
            crc: r.crcs[s],
            alternative: r.pending.get(&(s as u32)).copied(),
        })
        .collect();
    (r.extents().collect(), infos)
}

/// `data`, to be written at `off` in its block, as it can go to a drive without a copy:
/// whole sectors, and in memory on a sector boundary (the FUSE layer reads write requests
/// so that their data lands there). `None` when it must be copied into aligned scratch
/// space first.
fn whole_sectors(off: u64, data: &[u8]) -> Option<&[u8]> {
    let aligned = off.is_multiple_of(SECTOR)
        && !data.is_empty()
        && (data.len() as u64).is_multiple_of(SECTOR)
        && (data.as_ptr() as usize).is_multiple_of(SECTOR as usize);
    aligned.then_some(data)
}

fn every_copy_down() -> FsError {
    FsError::Io(std::io::Error::other(
        "every copy of the block is on a disk that is down; start the disks (tessera disk \
         change DEVICE start -d NSD)",
    ))
}

/// Set while a synchronous write (O_SYNC, O_DSYNC, O_DIRECT) runs on this thread: its data
/// goes to the drives written through (FUA), so the commit that follows finds them with
/// nothing to flush. Through NSD servers or NVMe/TCP drives that saves a round trip per
/// drive written, and the commit's own log write saves another (`Journal::commit`).
/// Where this mount last placed a block of each of the files it writes: the hint for
/// the next block's placement (after the previous one), which a sequential writer would
/// otherwise ask its file's owner for at every block. A hint only: a stale one places a
/// block elsewhere, never wrongly.
#[derive(Default)]
pub(crate) struct LastPlaced(parking_lot::Mutex<std::collections::HashMap<Ino, (u64, DiskAddr)>>);

/// Files [`LastPlaced`] remembers, at most; it starts over past that.
const PLACED_FILES_MAX: usize = 4096;

impl LastPlaced {
    fn note(&self, ino: Ino, block: u64, addr: DiskAddr) {
        let mut placed = self.0.lock();
        if placed.len() >= PLACED_FILES_MAX && !placed.contains_key(&ino) {
            placed.clear();
        }
        placed.insert(ino, (block, addr));
    }

    fn get(&self, ino: Ino, block: u64) -> Option<DiskAddr> {
        match self.0.lock().get(&ino) {
            Some((b, addr)) if *b == block => Some(*addr),
            _ => None,
        }
    }
}

struct WriteThrough;

thread_local! {
    static WRITE_THROUGH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl WriteThrough {
    fn begin() -> WriteThrough {
        WRITE_THROUGH.with(|w| w.set(true));
        WriteThrough
    }

    fn on() -> bool {
        WRITE_THROUGH.with(std::cell::Cell::get)
    }
}

impl Drop for WriteThrough {
    fn drop(&mut self) {
        WRITE_THROUGH.with(|w| w.set(false));
    }
}

/// Sector-aligned scratch space for one write, reused per thread: a fresh megabyte per
/// request would cost page faults and zeroing for bytes that are overwritten at once.
struct Scratch {
    buf: Option<AlignedBuf>,
    len: usize,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
}

impl Scratch {
    /// `len` bytes whose contents are left over from earlier use: callers initialise them.
    fn take(len: usize) -> Scratch {
        let cached = SCRATCH
            .with(|c| c.borrow_mut().take())
            .filter(|b| b.len() >= len);
        let buf = cached.unwrap_or_else(|| AlignedBuf::huge(len.max(1 << 20)));
        Scratch {
            buf: Some(buf),
            len,
        }
    }

    /// Makes sure this thread has scratch space for `len` bytes, even when this write
    /// needs none: it is mapped at the thread's first write, as when every write copied
    /// through it, not at some later unaligned one. Mapping memory takes the address
    /// space's lock; in a process that also faults on files mapped from its own mount (the
    /// in-process FUSE tests), a serving thread that maps while a fault waits for it
    /// deadlocks (seen in `posix_vdisk`'s mapped-file test once writes stopped copying).
    fn reserve(len: usize) {
        drop(Scratch::take(len));
    }

    /// Zeroes everything but `len` bytes at `at`, which the caller fills.
    fn zero_outside(&mut self, at: usize, len: usize) {
        let all = self.len;
        self[..at].fill(0);
        self[at + len..all].fill(0);
    }
}

impl std::ops::Deref for Scratch {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf.as_ref().expect("present until drop")[..self.len]
    }
}

impl std::ops::DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.buf.as_mut().expect("present until drop")[..len]
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let buf = self.buf.take();
        SCRATCH.with(|c| *c.borrow_mut() = buf);
    }
}

#[cfg(test)]
mod file_data_tests {
    use super::*;

    #[test]
    fn pieces_read_back_in_order_with_zero_runs_of_any_length() {
        let mut d = FileData::default();
        d.push(Piece::Bytes(vec![1; 10]));
        d.push(Piece::Zeros(ZEROS.len() * 2 + 7));
        d.push(Piece::Zeros(0));
        d.push(Piece::Bytes(vec![2; 3]));
        let total = 10 + ZEROS.len() * 2 + 7 + 3;
        assert_eq!(d.len(), total);
        let lens: Vec<usize> = d.slices().map(<[u8]>::len).collect();
        assert_eq!(lens, vec![10, ZEROS.len(), ZEROS.len(), 7, 3]);
        let mut expect = vec![1u8; 10];
        expect.resize(total - 3, 0);
        expect.extend([2, 2, 2]);
        assert_eq!(d, FileData::from(expect.clone()));
        assert_eq!(d.into_vec(), expect);
        assert!(FileData::default().is_empty());
    }
}
