//! Stripe I/O: verified reads, degraded reads with reconstruction and repair, full-stripe
//! writes, read-modify-write, strip relocation, catch-up, scrub and crash resync.
//!
//! Every operation on a stripe holds the stripe's lock: shared for the fast read path,
//! exclusive for everything that may write. A stripe's strips are read and written in
//! parallel. Verification always uses the *authoritative* checksum table: the one in the
//! valid header with the highest version among the stripe's readable strips (every update
//! rewrites the headers of all strips it writes, always including every parity strip, with
//! the full new table). The fast read path verifies a data strip against its own header
//! instead, which is equivalent because a readable strip is never stale: strips that missed
//! a write are on a pdisk that is not readable (suspended, dead, missing, catching up), or
//! in the persistent stale list, or in a dirty region resynchronised at open.

use std::io;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tessera_drive::AlignedBuf;

use crate::core::{run_all, sectors_buf, DaCore, Loc, StripSlot, VdiskCore};
use crate::error::VdiskError;
use crate::layout::{StripHeader, StripId, SECTOR_USIZE};
use crate::meta::{PdiskState, StaleStrip};
use crate::status::{RecoveryReport, ScrubReport};

/// A piece of a request that falls into one data strip.
#[derive(Clone, Debug)]
pub struct Piece {
    pub strip: usize,
    pub sectors: Range<usize>,
    /// The bytes of the caller's buffer that map to it.
    pub bytes: Range<usize>,
}

/// Splits `len` bytes at byte `off` of a stripe into per-strip pieces.
pub fn pieces(vd: &VdiskCore, off: usize, len: usize) -> Vec<Piece> {
    let mut out = Vec::new();
    let (mut pos, end) = (off, off + len);
    while pos < end {
        let strip = pos / vd.strip_bytes;
        let within = pos % vd.strip_bytes;
        let take = (vd.strip_bytes - within).min(end - pos);
        out.push(Piece {
            strip,
            sectors: within / SECTOR_USIZE..(within + take) / SECTOR_USIZE,
            bytes: pos - off..pos - off + take,
        });
        pos += take;
    }
    out
}

fn crc(sector: &[u8]) -> u32 {
    crc32c::crc32c(sector)
}

/// The stripe as gathered by the careful path.
pub struct Gathered {
    /// `None`: the stripe was never written (reads as zeros).
    pub auth: Option<Arc<StripHeader>>,
    pub range: Range<usize>,
    /// One buffer per strip over `range`, verified or reconstructed where `ok`.
    pub bufs: Vec<AlignedBuf>,
    pub ok: Vec<Vec<bool>>,
    /// Strips that could not be read, for error messages.
    pub missing: Vec<String>,
    /// Sectors rewritten from redundancy.
    pub repaired: u64,
    /// Whether any sector had to be reconstructed.
    pub reconstructed: bool,
}

impl Gathered {
    pub fn strip_ok(&self, i: usize) -> bool {
        self.ok[i].iter().all(|&b| b)
    }

    pub fn lost(&self, i: usize) -> bool {
        self.auth
            .as_ref()
            .is_some_and(|a| a.lost_mask & (1 << i) != 0)
    }
}

/// What the careful path may do.
#[derive(Clone, Copy)]
pub struct GatherOpts {
    /// Read headers from the drives even if cached (scrub).
    pub fresh: bool,
    /// Rewrite bad sectors and headers of readable strips.
    pub repair: bool,
}

type HeaderRead = io::Result<Option<Arc<StripHeader>>>;

/// Data that starts this close to a strip's header is read with the header in one I/O
/// when the header is not cached; farther away, two I/Os cost less than reading the gap.
const JOINED_READ_GAP_BYTES: usize = 128 << 10;

/// A strip write run by the I/O pool: (strip index, outcome).
type WriteJob<'a> = crate::pool::Job<'a, (usize, io::Result<()>)>;

impl DaCore {
    fn strip_id(vd: &VdiskCore, stripe: u64, i: usize) -> StripId {
        StripId {
            vdisk_id: vd.id,
            stripe,
            strip_index: i as u16,
        }
    }

    fn cache_key(vd: &VdiskCore, stripe: u64, i: usize) -> (u32, u64, u16) {
        (vd.id, stripe, i as u16)
    }

    fn cache_loc(loc: Loc) -> u64 {
        u64::from(loc.pdisk) << 48 | loc.sector
    }

    /// The header of strip `i`, from the cache unless `fresh`.
    pub fn read_header(
        &self,
        vd: &VdiskCore,
        stripe: u64,
        i: usize,
        slot: &StripSlot,
        fresh: bool,
    ) -> HeaderRead {
        let key = Self::cache_key(vd, stripe, i);
        let cloc = Self::cache_loc(slot.loc);
        if !fresh {
            if let Some(h) = self.headers.get(key, cloc) {
                return Ok(Some(h));
            }
        }
        let mut buf = AlignedBuf::zeroed(vd.header_bytes);
        slot.pd.read(&mut buf, slot.loc.offset())?;
        let h = StripHeader::decode(&buf, self.uuid, Self::strip_id(vd, stripe, i), vd.n, vd.sps)
            .map(Arc::new);
        match &h {
            Some(h) => self.headers.insert(key, cloc, h.clone()),
            None => self.headers.remove(key),
        }
        Ok(h)
    }

    fn data_offset(vd: &VdiskCore, loc: Loc, sector: usize) -> u64 {
        loc.offset() + vd.header_bytes as u64 + (sector * SECTOR_USIZE) as u64
    }

    fn encode_header(&self, vd: &VdiskCore, stripe: u64, i: usize, h: &StripHeader) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(vd.header_bytes);
        h.encode_into(self.uuid, Self::strip_id(vd, stripe, i), &mut buf);
        buf
    }

    /// Writes a strip's header and a sector range of its data: one I/O when the range
    /// starts at the first sector, two otherwise.
    fn write_strip(
        &self,
        vd: &VdiskCore,
        id: StripId,
        slot: &StripSlot,
        h: &StripHeader,
        first_sector: usize,
        data: &[u8],
    ) -> io::Result<()> {
        let header = self.encode_header(vd, id.stripe, usize::from(id.strip_index), h);
        if first_sector == 0 {
            let mut buf = AlignedBuf::zeroed(vd.header_bytes + data.len());
            buf[..vd.header_bytes].copy_from_slice(&header);
            buf[vd.header_bytes..].copy_from_slice(data);
            return slot.pd.write(&buf, slot.loc.offset());
        }
        slot.pd.write(&header, slot.loc.offset())?;
        slot.pd
            .write(data, Self::data_offset(vd, slot.loc, first_sector))
    }

    fn unrecoverable(
        &self,
        vd: &VdiskCore,
        stripe: u64,
        missing: &[String],
        reason: &str,
    ) -> VdiskError {
        vd.stats.unrecoverable.fetch_add(1, Ordering::Relaxed);
        VdiskError::Unrecoverable {
            vdisk: vd.name.clone(),
            stripe,
            pdisks: if missing.is_empty() {
                "none unavailable".to_string()
            } else {
                missing.join(", ")
            },
            reason: reason.to_string(),
        }
    }

    // -----------------------------------------------------------------------------------
    // Reads
    // -----------------------------------------------------------------------------------

    /// Reads `out.len()` bytes at byte `off` of stripe `stripe`.
    pub fn read_stripe(
        &self,
        vd: &VdiskCore,
        stripe: u64,
        off: usize,
        out: &mut [u8],
    ) -> Result<(), VdiskError> {
        let lock = self.stripe_lock(vd.id, stripe);
        {
            let _shared = lock.read();
            if self.read_fast(vd, stripe, off, out) {
                return Ok(());
            }
        }
        let _exclusive = lock.write();
        let ps = pieces(vd, off, out.len());
        let range = if vd.k == 1 {
            ps[0].sectors.clone()
        } else {
            let lo = ps.iter().map(|p| p.sectors.start).min().expect("non-empty");
            let hi = ps.iter().map(|p| p.sectors.end).max().expect("non-empty");
            lo..hi
        };
        let g = self.gather(
            vd,
            stripe,
            range.clone(),
            GatherOpts {
                fresh: false,
                repair: true,
            },
        )?;
        if g.auth.is_some() {
            vd.stats.degraded_reads.fetch_add(1, Ordering::Relaxed);
        }
        for p in &ps {
            if g.lost(p.strip) {
                return Err(self.unrecoverable(
                    vd,
                    stripe,
                    &g.missing,
                    &format!("data strip {} was lost in an earlier failure", p.strip),
                ));
            }
            let rel = p.sectors.start - range.start..p.sectors.end - range.start;
            if !g.ok[p.strip][rel.clone()].iter().all(|&b| b) {
                return Err(self.unrecoverable(
                    vd,
                    stripe,
                    &g.missing,
                    &format!(
                        "data strip {} cannot be read or reconstructed: more strips are \
                         unavailable or corrupt than {} tolerates",
                        p.strip, vd.code
                    ),
                ));
            }
            let src = &g.bufs[p.strip][rel.start * SECTOR_USIZE..rel.end * SECTOR_USIZE];
            out[p.bytes.clone()].copy_from_slice(src);
        }
        Ok(())
    }

    /// The common case: every piece's strip readable, its header valid (usually cached)
    /// and every sector verifying. False sends the caller to the careful path.
    fn read_fast(&self, vd: &VdiskCore, stripe: u64, off: usize, out: &mut [u8]) -> bool {
        let slots = self.view(vd, stripe);
        let mut ps = pieces(vd, off, out.len());
        if vd.k == 1 {
            // Replicas are identical: spread reads over the copies.
            let first = (stripe % vd.n as u64) as usize;
            match (0..vd.n)
                .map(|d| (first + d) % vd.n)
                .find(|&i| slots[i].readable)
            {
                Some(i) => ps[0].strip = i,
                None => return false,
            }
        }
        if ps.iter().any(|p| !slots[p.strip].readable) {
            return false;
        }
        let mut outs: Vec<(&Piece, &mut [u8])> = Vec::with_capacity(ps.len());
        let mut rest = &mut *out;
        let mut consumed = 0;
        for p in &ps {
            let (head, tail) = rest.split_at_mut(p.bytes.end - consumed);
            outs.push((p, &mut head[p.bytes.start - consumed..]));
            consumed = p.bytes.end;
            rest = tail;
        }
        let jobs: Vec<Box<dyn FnOnce() -> bool + Send + '_>> = outs
            .into_iter()
            .map(|(p, buf)| {
                let slot = &slots[p.strip];
                Box::new(move || self.read_piece(vd, stripe, p, slot, buf))
                    as Box<dyn FnOnce() -> bool + Send>
            })
            .collect();
        run_all(jobs).into_iter().all(|ok| ok)
    }

    fn read_piece(
        &self,
        vd: &VdiskCore,
        stripe: u64,
        p: &Piece,
        slot: &StripSlot,
        buf: &mut [u8],
    ) -> bool {
        let key = Self::cache_key(vd, stripe, p.strip);
        let h = match self.headers.get(key, Self::cache_loc(slot.loc)) {
            Some(h) => {
                if let Err(e) = slot
                    .pd
                    .read(buf, Self::data_offset(vd, slot.loc, p.sectors.start))
                {
                    self.note_io_error(&slot.pd, "reading strip data", &e);
                    return false;
                }
                h
            }
            None if p.sectors.start * SECTOR_USIZE <= JOINED_READ_GAP_BYTES => {
                match self.read_header_and_data(vd, stripe, p, slot, buf) {
                    Some(h) => h,
                    None => return false,
                }
            }
            None => {
                let h = match self.read_header(vd, stripe, p.strip, slot, true) {
                    Ok(Some(h)) => h,
                    Ok(None) => return false,
                    Err(e) => {
                        self.note_io_error(&slot.pd, "reading a strip header", &e);
                        return false;
                    }
                };
                if let Err(e) = slot
                    .pd
                    .read(buf, Self::data_offset(vd, slot.loc, p.sectors.start))
                {
                    self.note_io_error(&slot.pd, "reading strip data", &e);
                    return false;
                }
                h
            }
        };
        if h.lost_mask & (1 << p.strip) != 0 {
            return false;
        }
        buf.chunks_exact(SECTOR_USIZE)
            .zip(p.sectors.clone())
            .all(|(s, t)| crc(s) == h.crc(p.strip, t))
    }

    /// A header that is not cached and the data near the start of the strip, read as one
    /// I/O: a sequential reader of strips missing the cache then pays one I/O per strip,
    /// not two in a row.
    fn read_header_and_data(
        &self,
        vd: &VdiskCore,
        stripe: u64,
        p: &Piece,
        slot: &StripSlot,
        buf: &mut [u8],
    ) -> Option<Arc<StripHeader>> {
        let data_at = vd.header_bytes + p.sectors.start * SECTOR_USIZE;
        let mut joined = AlignedBuf::zeroed(data_at + buf.len());
        if let Err(e) = slot.pd.read(&mut joined, slot.loc.offset()) {
            self.note_io_error(&slot.pd, "reading a strip", &e);
            return None;
        }
        let id = Self::strip_id(vd, stripe, p.strip);
        let key = Self::cache_key(vd, stripe, p.strip);
        let h = StripHeader::decode(&joined[..vd.header_bytes], self.uuid, id, vd.n, vd.sps);
        let Some(h) = h.map(Arc::new) else {
            self.headers.remove(key);
            return None;
        };
        self.headers
            .insert(key, Self::cache_loc(slot.loc), h.clone());
        buf.copy_from_slice(&joined[data_at..]);
        Some(h)
    }

    /// The careful path: reads every readable strip over `range`, verifies every sector
    /// against the authoritative table, reconstructs what is missing or bad, and (with
    /// `repair`) rewrites bad sectors and headers of readable strips.
    pub fn gather(
        &self,
        vd: &VdiskCore,
        stripe: u64,
        range: Range<usize>,
        opts: GatherOpts,
    ) -> Result<Gathered, VdiskError> {
        let slots = self.view(vd, stripe);
        let len = range.len();
        let mut bufs: Vec<AlignedBuf> = (0..vd.n).map(|_| sectors_buf(len)).collect();
        let reads = self.read_all(vd, stripe, &slots, range.start, &mut bufs, opts.fresh);
        let mut own: Vec<Option<Arc<StripHeader>>> = vec![None; vd.n];
        let mut read_ok = vec![false; vd.n];
        let mut missing = Vec::new();
        for (i, r) in reads.into_iter().enumerate() {
            let pd = &slots[i].pd;
            match r {
                None => missing.push(format!(
                    "strip {i} on {} ({})",
                    pd.name,
                    if pd.readable() {
                        "stale"
                    } else {
                        pd.state().as_str()
                    }
                )),
                Some((h, d)) => {
                    match h {
                        Ok(h) => own[i] = h,
                        Err(e) => {
                            self.note_io_error(pd, "reading a strip header", &e);
                        }
                    }
                    match d {
                        Ok(()) => read_ok[i] = true,
                        Err(e) => {
                            self.note_io_error(pd, "reading strip data", &e);
                            missing.push(format!("strip {i} on {} (read error: {e})", pd.name));
                        }
                    }
                }
            }
        }
        let auth = own.iter().flatten().max_by_key(|h| h.version).cloned();
        let Some(auth) = auth else {
            return self.unwritten(vd, stripe, range, bufs, &read_ok, missing);
        };
        let mut ok: Vec<Vec<bool>> = (0..vd.n)
            .map(|i| {
                (0..len)
                    .map(|t| {
                        read_ok[i]
                            && crc(&bufs[i][t * SECTOR_USIZE..(t + 1) * SECTOR_USIZE])
                                == auth.crc(i, range.start + t)
                    })
                    .collect()
            })
            .collect();
        let bad_before: Vec<Vec<bool>> = ok
            .iter()
            .enumerate()
            .map(|(i, v)| v.iter().map(|&o| read_ok[i] && !o).collect())
            .collect();
        for (i, bad) in bad_before.iter().enumerate() {
            let count = bad.iter().filter(|&&b| b).count() as u64;
            if count > 0 {
                slots[i]
                    .pd
                    .checksum_errors
                    .fetch_add(count, Ordering::Relaxed);
                missing.push(format!(
                    "strip {i} on {} ({count} sectors fail their checksum)",
                    slots[i].pd.name
                ));
            }
        }
        let mut reconstructed = false;
        let tables = [auth.as_ref()];
        for t in 0..len {
            if ok.iter().all(|o| o[t]) {
                continue;
            }
            reconstructed = true;
            self.reconstruct_sector(vd, &mut bufs, &mut ok, t, range.start, &tables);
        }
        let mut g = Gathered {
            auth: Some(auth),
            range,
            bufs,
            ok,
            missing,
            repaired: 0,
            reconstructed,
        };
        if opts.repair {
            g.repaired = self.repair(vd, stripe, &slots, &g, &own, &read_ok, &bad_before);
            vd.stats
                .checksum_errors_repaired
                .fetch_add(g.repaired, Ordering::Relaxed);
        }
        Ok(g)
    }

    /// Reads header and data of every readable strip in parallel; `None` for the others.
    fn read_all(
        &self,
        vd: &VdiskCore,
        stripe: u64,
        slots: &[StripSlot],
        first_sector: usize,
        bufs: &mut [AlignedBuf],
        fresh: bool,
    ) -> Vec<Option<(HeaderRead, io::Result<()>)>> {
        type Job<'a> = Box<dyn FnOnce() -> Option<(HeaderRead, io::Result<()>)> + Send + 'a>;
        let jobs: Vec<Job<'_>> = bufs
            .iter_mut()
            .zip(slots)
            .enumerate()
            .map(|(i, (buf, slot))| {
                Box::new(move || {
                    if !slot.readable {
                        return None;
                    }
                    let h = self.read_header(vd, stripe, i, slot, fresh);
                    let d = slot
                        .pd
                        .read(buf, Self::data_offset(vd, slot.loc, first_sector));
                    Some((h, d))
                }) as Job<'_>
            })
            .collect();
        run_all(jobs)
    }

    /// A stripe without any valid header: never written, so it reads as zeros, provided
    /// enough strips were read to be sure.
    fn unwritten(
        &self,
        vd: &VdiskCore,
        stripe: u64,
        range: Range<usize>,
        mut bufs: Vec<AlignedBuf>,
        read_ok: &[bool],
        missing: Vec<String>,
    ) -> Result<Gathered, VdiskError> {
        let seen = read_ok.iter().filter(|&&b| b).count();
        if seen < vd.k {
            return Err(self.unrecoverable(
                vd,
                stripe,
                &missing,
                &format!(
                    "only {seen} of {} strips are readable and none has a valid header",
                    vd.n
                ),
            ));
        }
        bufs.iter_mut().for_each(|b| b.fill(0));
        let len = range.len();
        Ok(Gathered {
            auth: None,
            range,
            bufs,
            ok: vec![vec![true; len]; vd.n],
            missing,
            repaired: 0,
            reconstructed: false,
        })
    }

    /// Reconstructs the strips not `ok` at sector `t` and keeps what verifies against any
    /// of `tables`. Tries all good strips first, then each subset leaving one out (a strip
    /// whose checksum matches but that belongs to another write, after a crash).
    fn reconstruct_sector(
        &self,
        vd: &VdiskCore,
        bufs: &mut [AlignedBuf],
        ok: &mut [Vec<bool>],
        t: usize,
        first: usize,
        tables: &[&StripHeader],
    ) {
        let present: Vec<bool> = ok.iter().map(|o| o[t]).collect();
        let count = present.iter().filter(|&&p| p).count();
        if count < vd.k {
            return;
        }
        let range = t * SECTOR_USIZE..(t + 1) * SECTOR_USIZE;
        let mut scratch = vec![0u8; vd.n * SECTOR_USIZE];
        let mut attempt = |use_mask: &[bool], ok: &mut [Vec<bool>], bufs: &mut [AlignedBuf]| {
            for (i, chunk) in scratch.chunks_exact_mut(SECTOR_USIZE).enumerate() {
                if use_mask[i] {
                    chunk.copy_from_slice(&bufs[i][range.clone()]);
                } else {
                    chunk.fill(0);
                }
            }
            let mut slices: Vec<&mut [u8]> = scratch.chunks_exact_mut(SECTOR_USIZE).collect();
            if vd.codec.reconstruct(&mut slices, use_mask).is_err() {
                return false;
            }
            let mut all = true;
            let missing: Vec<usize> = (0..vd.n).filter(|&i| !ok[i][t]).collect();
            for i in missing {
                let c = crc(slices[i]);
                if tables.iter().any(|h| h.crc(i, first + t) == c) {
                    bufs[i][range.clone()].copy_from_slice(slices[i]);
                    ok[i][t] = true;
                } else {
                    all = false;
                }
            }
            all
        };
        if attempt(&present, ok, bufs) || count == vd.k {
            return;
        }
        for leave_out in (0..vd.n).filter(|&i| present[i]) {
            let mut mask = present.clone();
            mask[leave_out] = false;
            if attempt(&mask, ok, bufs) {
                return;
            }
        }
    }

    /// Rewrites sectors that failed their checksum (now reconstructed) and invalid headers
    /// of readable strips. The content written is what the authoritative table already
    /// says, so a torn repair leaves the strip no worse. Returns the sectors repaired.
    #[allow(clippy::too_many_arguments)]
    fn repair(
        &self,
        vd: &VdiskCore,
        stripe: u64,
        slots: &[StripSlot],
        g: &Gathered,
        own: &[Option<Arc<StripHeader>>],
        read_ok: &[bool],
        bad_before: &[Vec<bool>],
    ) -> u64 {
        let auth = g.auth.as_ref().expect("written stripe");
        let mut repaired = 0;
        for i in 0..vd.n {
            if !slots[i].readable || !slots[i].writable || !read_ok[i] {
                continue;
            }
            let slot = &slots[i];
            let mut failed = None;
            if own[i].is_none() {
                let h = self.encode_header(vd, stripe, i, auth);
                match slot.pd.write(&h, slot.loc.offset()) {
                    Ok(()) => self.headers.insert(
                        Self::cache_key(vd, stripe, i),
                        Self::cache_loc(slot.loc),
                        auth.clone(),
                    ),
                    Err(e) => failed = Some(e),
                }
            }
            let mut t = 0;
            while t < g.range.len() && failed.is_none() {
                if !(bad_before[i][t] && g.ok[i][t]) {
                    t += 1;
                    continue;
                }
                let start = t;
                while t < g.range.len() && bad_before[i][t] && g.ok[i][t] {
                    t += 1;
                }
                let data = &g.bufs[i][start * SECTOR_USIZE..t * SECTOR_USIZE];
                let at = Self::data_offset(vd, slot.loc, g.range.start + start);
                match slot.pd.write(data, at) {
                    Ok(()) => repaired += (t - start) as u64,
                    Err(e) => failed = Some(e),
                }
            }
            if let Some(e) = failed {
                if self.note_io_error(&slot.pd, "rewriting a repaired strip", &e) {
                    let _ = self.persist_meta();
                }
            }
        }
        if repaired > 0 {
            self.event(format!(
                "vdisk {} stripe {stripe}: {repaired} bad sectors rewritten from redundancy",
                vd.name
            ));
        }
        repaired
    }

    // -----------------------------------------------------------------------------------
    // Writes
    // -----------------------------------------------------------------------------------

    /// Writes `data` at byte `off` of stripe `stripe`, with the dirty region marked first.
    pub fn write_stripe(
        &self,
        vd: &VdiskCore,
        stripe: u64,
        off: usize,
        data: &[u8],
    ) -> Result<(), VdiskError> {
        let _dirty = self.begin_dirty(vd, stripe)?;
        let _exclusive = self.stripe_lock(vd.id, stripe).write();
        if off == 0 && data.len() as u64 == vd.block_bytes {
            vd.stats.full_stripe_writes.fetch_add(1, Ordering::Relaxed);
            return self.write_full(vd, stripe, data, 0);
        }
        vd.stats.rmw_writes.fetch_add(1, Ordering::Relaxed);
        if self.write_rmw(vd, stripe, off, data)? {
            return Ok(());
        }
        self.write_reconstruct(vd, stripe, off, data)
    }

    /// Marks the stripe's region dirty (durably) for the lifetime of the guard.
    pub fn begin_dirty<'a>(
        &'a self,
        vd: &'a VdiskCore,
        stripe: u64,
    ) -> Result<DirtyGuard<'a>, VdiskError> {
        let region = (stripe / vd.region_stripes) as usize;
        let need = self.dirty.begin_write(vd.id, region);
        let guard = DirtyGuard {
            core: self,
            vdisk_id: vd.id,
            region,
        };
        if need > 0 {
            self.persist_dirty(need)?;
        }
        Ok(guard)
    }

    /// Writes a whole stripe: parity computed from `block`, every writable strip written as
    /// one I/O (header and data), all in parallel. No reads.
    pub fn write_full(
        &self,
        vd: &VdiskCore,
        stripe: u64,
        block: &[u8],
        lost_mask: u32,
    ) -> Result<(), VdiskError> {
        assert_eq!(block.len() as u64, vd.block_bytes);
        let slots = self.view(vd, stripe);
        let writable = slots.iter().filter(|s| s.writable).count();
        if writable < vd.k {
            let missing = self.unwritable(&slots);
            return Err(self.unrecoverable(
                vd,
                stripe,
                &missing,
                &format!("only {writable} of {} strips can be written", vd.n),
            ));
        }
        let slot_bytes = vd.slot_bytes();
        let (hb, sb) = (vd.header_bytes, vd.strip_bytes);
        let mut big = AlignedBuf::zeroed(vd.n * slot_bytes);
        let data: Vec<&[u8]> = block.chunks_exact(sb).collect();
        {
            let mut parity: Vec<&mut [u8]> = big[vd.k * slot_bytes..]
                .chunks_exact_mut(slot_bytes)
                .map(|s| &mut s[hb..])
                .collect();
            vd.codec.encode(&data, &mut parity)?;
        }
        let mut table = vec![0u32; vd.n * vd.sps];
        for (i, chunk) in table.chunks_exact_mut(vd.sps).enumerate() {
            let content: &[u8] = if i < vd.k {
                data[i]
            } else {
                &big[i * slot_bytes + hb..(i + 1) * slot_bytes]
            };
            crate::layout::sector_crcs(content, chunk);
        }
        let header = Arc::new(StripHeader {
            version: self.next_version(),
            codec_id: vd.codec.id(),
            lost_mask,
            sectors_per_strip: vd.sps as u32,
            table,
        });
        for (i, s) in big.chunks_exact_mut(slot_bytes).enumerate() {
            header.encode_into(self.uuid, Self::strip_id(vd, stripe, i), &mut s[..hb]);
            if i < vd.k {
                s[hb..].copy_from_slice(data[i]);
            }
        }
        let jobs: Vec<WriteJob<'_>> = big
            .chunks_exact(slot_bytes)
            .enumerate()
            .filter(|(i, _)| slots[*i].writable)
            .map(|(i, buf)| {
                let slot = &slots[i];
                Box::new(move || (i, slot.pd.write(buf, slot.loc.offset())))
                    as Box<dyn FnOnce() -> _ + Send>
            })
            .collect();
        let results = run_all(jobs);
        self.settle_whole_stripe(vd, stripe, &slots, results, &header, "written")
    }

    /// Settles the writes of every strip of a stripe; fewer than `k` written loses it.
    fn settle_whole_stripe(
        &self,
        vd: &VdiskCore,
        stripe: u64,
        slots: &[StripSlot],
        results: Vec<(usize, io::Result<()>)>,
        header: &Arc<StripHeader>,
        done: &str,
    ) -> Result<(), VdiskError> {
        let written = self.settle(vd, stripe, slots, results, header, true)?;
        if written < vd.k {
            let missing = self.unwritable(slots);
            return Err(self.unrecoverable(
                vd,
                stripe,
                &missing,
                &format!("only {written} of {} strips were {done}", vd.n),
            ));
        }
        Ok(())
    }

    /// Deallocates a whole stripe on its pdisks (TRIM): each strip's data is deallocated,
    /// so that it reads as zeros, then its header is rewritten with a new version and the
    /// checksums of zero sectors, so the stripe reads as zeros everywhere, fast path and
    /// careful path alike. The dirty region is marked first, as for a write: a crash
    /// between the deallocations and the headers leaves strips of zeros under older
    /// headers, which resync takes as torn writes and rewrites consistently (the content of
    /// a discarded range is anything). Skipped (false) when a strip is not writable or its
    /// pdisk cannot deallocate to zeros: a discard may leave a range as it is.
    pub fn discard_stripe(&self, vd: &VdiskCore, stripe: u64) -> Result<bool, VdiskError> {
        let _dirty = self.begin_dirty(vd, stripe)?;
        let _exclusive = self.stripe_lock(vd.id, stripe).write();
        let slots = self.view(vd, stripe);
        if slots.iter().any(|s| !s.writable || !s.pd.discard_zeroes()) {
            return Ok(false);
        }
        let zero_crc = crc(&[0u8; SECTOR_USIZE]);
        let header = Arc::new(StripHeader {
            version: self.next_version(),
            codec_id: vd.codec.id(),
            lost_mask: 0,
            sectors_per_strip: vd.sps as u32,
            table: vec![zero_crc; vd.n * vd.sps],
        });
        let jobs: Vec<WriteJob<'_>> = slots
            .iter()
            .enumerate()
            .map(|(i, slot)| {
                let header = &header;
                Box::new(move || {
                    let data_at = Self::data_offset(vd, slot.loc, 0);
                    let r = slot
                        .pd
                        .discard(data_at, vd.strip_bytes as u64)
                        .or_else(|_| {
                            // The pdisk refused after all: zeros written make the same strip.
                            slot.pd.write(&sectors_buf(vd.sps), data_at)
                        })
                        .and_then(|()| {
                            let head = self.encode_header(vd, stripe, i, header);
                            slot.pd.write(&head, slot.loc.offset())
                        });
                    (i, r)
                }) as Box<dyn FnOnce() -> _ + Send>
            })
            .collect();
        let results = run_all(jobs);
        self.settle_whole_stripe(vd, stripe, &slots, results, &header, "deallocated")?;
        Ok(true)
    }

    fn unwritable(&self, slots: &[StripSlot]) -> Vec<String> {
        slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.writable)
            .map(|(i, s)| format!("strip {i} on {} ({})", s.pd.name, s.pd.state()))
            .collect()
    }

    /// Updates the header cache and the stale list after writes; a failed strip becomes
    /// stale (or its pdisk dead), and that is made durable before the write returns.
    /// Returns how many strips were written.
    fn settle(
        &self,
        vd: &VdiskCore,
        stripe: u64,
        slots: &[StripSlot],
        results: Vec<(usize, io::Result<()>)>,
        header: &Arc<StripHeader>,
        full: bool,
    ) -> Result<usize, VdiskError> {
        let mut written = 0;
        let mut changed = slots.iter().any(|s| !s.writable);
        for (i, r) in results {
            let key = Self::cache_key(vd, stripe, i);
            let stale = StaleStrip {
                vdisk_id: vd.id,
                stripe,
                strip: i as u16,
            };
            match r {
                Ok(()) => {
                    written += 1;
                    self.headers
                        .insert(key, Self::cache_loc(slots[i].loc), header.clone());
                    if full {
                        self.clear_stale(&stale);
                    }
                }
                Err(e) => {
                    changed = true;
                    self.headers.remove(key);
                    let pd = &slots[i].pd;
                    self.note_io_error(pd, "writing a strip", &e);
                    if !self.add_stale(stale) && pd.state() != PdiskState::Dead {
                        self.set_pdisk_state(pd, PdiskState::Dead, "too many stale strips");
                    }
                    self.kick();
                }
            }
        }
        if changed {
            self.ensure_meta_persisted()?;
        }
        Ok(written)
    }

    /// Read-modify-write of a partial stripe: reads the old data of the written range and
    /// the parity, folds the difference into the parity, writes data and parity with the
    /// new checksum table. False (nothing written) when the stripe is degraded, unwritten
    /// or anything fails to verify; the caller then reconstructs and rewrites it.
    fn write_rmw(
        &self,
        vd: &VdiskCore,
        stripe: u64,
        off: usize,
        data: &[u8],
    ) -> Result<bool, VdiskError> {
        let slots = self.view(vd, stripe);
        let ps = pieces(vd, off, data.len());
        let involved: Vec<usize> = ps.iter().map(|p| p.strip).chain(vd.k..vd.n).collect();
        if involved
            .iter()
            .any(|&i| !slots[i].readable || !slots[i].writable)
        {
            return Ok(false);
        }
        let auth = match self.read_header(vd, stripe, vd.k, &slots[vd.k], false) {
            Ok(Some(h)) if h.lost_mask == 0 => h,
            Ok(_) => return Ok(false),
            Err(e) => {
                self.note_io_error(&slots[vd.k].pd, "reading a strip header", &e);
                return Ok(false);
            }
        };
        let lo = ps.iter().map(|p| p.sectors.start).min().expect("non-empty");
        let hi = ps.iter().map(|p| p.sectors.end).max().expect("non-empty");
        let Some((old, mut parity)) = self.rmw_read(vd, &slots, &ps, lo..hi, &auth) else {
            return Ok(false);
        };
        let mut table = auth.table.clone();
        for (p, o) in ps.iter().zip(&old) {
            let new = &data[p.bytes.clone()];
            let sub = (p.sectors.start - lo) * SECTOR_USIZE..(p.sectors.end - lo) * SECTOR_USIZE;
            let mut par: Vec<&mut [u8]> = parity.iter_mut().map(|b| &mut b[sub.clone()]).collect();
            vd.codec.update_parity(p.strip, o, new, &mut par)?;
            let at = p.strip * vd.sps + p.sectors.start;
            crate::layout::sector_crcs(new, &mut table[at..at + p.sectors.len()]);
        }
        for (j, b) in parity.iter().enumerate() {
            let at = (vd.k + j) * vd.sps + lo;
            crate::layout::sector_crcs(b, &mut table[at..at + (hi - lo)]);
        }
        let header = Arc::new(StripHeader {
            version: self.next_version(),
            codec_id: vd.codec.id(),
            lost_mask: 0,
            sectors_per_strip: vd.sps as u32,
            table,
        });
        let writes: Vec<(usize, usize, &[u8])> = ps
            .iter()
            .map(|p| (p.strip, p.sectors.start, &data[p.bytes.clone()]))
            .chain(
                parity
                    .iter()
                    .enumerate()
                    .map(|(j, b)| (vd.k + j, lo, &b[..])),
            )
            .collect();
        let header_ref = &header;
        let jobs: Vec<WriteJob<'_>> = writes
            .into_iter()
            .map(|(i, first, bytes)| {
                let slot = &slots[i];
                Box::new(move || {
                    (
                        i,
                        self.write_strip(
                            vd,
                            Self::strip_id(vd, stripe, i),
                            slot,
                            header_ref,
                            first,
                            bytes,
                        ),
                    )
                }) as Box<dyn FnOnce() -> _ + Send>
            })
            .collect();
        let results = run_all(jobs);
        let failed = results.iter().filter(|(_, r)| r.is_err()).count();
        self.settle(vd, stripe, &slots, results, &header, false)?;
        if failed > vd.m {
            return Err(self.unrecoverable(
                vd,
                stripe,
                &[],
                &format!("{failed} strips failed to write during read-modify-write"),
            ));
        }
        Ok(true)
    }

    /// The read half of a read-modify-write: the old data of every piece and the parity
    /// over `range`, all verified against `auth`; `None` on any error or mismatch.
    fn rmw_read(
        &self,
        vd: &VdiskCore,
        slots: &[StripSlot],
        ps: &[Piece],
        range: Range<usize>,
        auth: &StripHeader,
    ) -> Option<(Vec<AlignedBuf>, Vec<AlignedBuf>)> {
        let mut old: Vec<AlignedBuf> = ps.iter().map(|p| sectors_buf(p.sectors.len())).collect();
        let mut parity: Vec<AlignedBuf> = (vd.k..vd.n).map(|_| sectors_buf(range.len())).collect();
        let targets: Vec<(usize, usize)> = ps
            .iter()
            .map(|p| (p.strip, p.sectors.start))
            .chain((vd.k..vd.n).map(|i| (i, range.start)))
            .collect();
        let jobs: Vec<crate::pool::Job<'_, io::Result<()>>> = old
            .iter_mut()
            .chain(parity.iter_mut())
            .zip(&targets)
            .map(|(buf, &(i, first))| {
                let slot = &slots[i];
                Box::new(move || slot.pd.read(buf, Self::data_offset(vd, slot.loc, first)))
                    as Box<dyn FnOnce() -> _ + Send>
            })
            .collect();
        for (r, &(i, _)) in run_all(jobs).into_iter().zip(&targets) {
            if let Err(e) = r {
                self.note_io_error(&slots[i].pd, "reading for read-modify-write", &e);
                return None;
            }
        }
        let verify = |buf: &[u8], i: usize, first: usize| {
            buf.chunks_exact(SECTOR_USIZE)
                .enumerate()
                .all(|(t, s)| crc(s) == auth.crc(i, first + t))
        };
        let old_ok = ps
            .iter()
            .zip(&old)
            .all(|(p, b)| verify(b, p.strip, p.sectors.start));
        let parity_ok = parity
            .iter()
            .enumerate()
            .all(|(j, b)| verify(b, vd.k + j, range.start));
        (old_ok && parity_ok).then_some((old, parity))
    }

    /// Partial write of a degraded or never-written stripe: gather (reconstructing what is
    /// missing), merge, and write the whole stripe.
    fn write_reconstruct(
        &self,
        vd: &VdiskCore,
        stripe: u64,
        off: usize,
        data: &[u8],
    ) -> Result<(), VdiskError> {
        let g = self.gather(
            vd,
            stripe,
            0..vd.sps,
            GatherOpts {
                fresh: false,
                repair: true,
            },
        )?;
        let mut block = AlignedBuf::zeroed(vd.block_bytes as usize);
        for j in 0..vd.k {
            block[j * vd.strip_bytes..(j + 1) * vd.strip_bytes].copy_from_slice(&g.bufs[j]);
        }
        let (w_lo, w_hi) = (off / SECTOR_USIZE, (off + data.len()) / SECTOR_USIZE);
        for j in 0..vd.k {
            for t in 0..vd.sps {
                let s = j * vd.sps + t;
                if !g.ok[j][t] && !(w_lo..w_hi).contains(&s) {
                    return Err(self.unrecoverable(
                        vd,
                        stripe,
                        &g.missing,
                        &format!(
                            "data strip {j} cannot be reconstructed, so the rest of the \
                             stripe cannot be rewritten"
                        ),
                    ));
                }
            }
        }
        block[off..off + data.len()].copy_from_slice(data);
        let mut lost = g.auth.as_ref().map_or(0, |a| a.lost_mask);
        for j in 0..vd.k {
            if w_lo <= j * vd.sps && (j + 1) * vd.sps <= w_hi {
                lost &= !(1 << j);
            }
        }
        self.write_full(vd, stripe, &block, lost)
    }

    // -----------------------------------------------------------------------------------
    // Maintenance: relocation (rebuild, drain, rebalance, stale repair), catch-up, scrub
    // -----------------------------------------------------------------------------------

    /// Moves strip `i` of a stripe from `from` to `to` (or rewrites it in place when they
    /// are equal), writing content read or reconstructed and verified. Returns bytes
    /// written, or `None` when the strip is no longer at `from` (the caller then frees
    /// `to`, as on error).
    pub fn relocate(
        &self,
        vd: &VdiskCore,
        stripe: u64,
        i: usize,
        from: Loc,
        to: Loc,
    ) -> Result<Option<u64>, VdiskError> {
        let _exclusive = self.stripe_lock(vd.id, stripe).write();
        // A vdisk deleted meanwhile has had its slots freed under this lock: moving a
        // strip now would free its old slot a second time.
        if vd.deleted.load(Ordering::Acquire) || vd.loc(stripe, i) != from {
            return Ok(None);
        }
        let g = self.gather(
            vd,
            stripe,
            0..vd.sps,
            GatherOpts {
                fresh: false,
                repair: true,
            },
        )?;
        let stale = StaleStrip {
            vdisk_id: vd.id,
            stripe,
            strip: i as u16,
        };
        let Some(auth) = g.auth.clone() else {
            // Never written: nothing to copy, only the map changes.
            if to != from {
                vd.set_loc(stripe, i, to);
                self.free_after_persist(from, vd.slot_sectors);
            }
            self.clear_stale(&stale);
            return Ok(Some(0));
        };
        if !g.strip_ok(i) {
            return Err(self.unrecoverable(
                vd,
                stripe,
                &g.missing,
                &format!("strip {i} cannot be reconstructed"),
            ));
        }
        let target = self.pdisk(to.pdisk);
        let slot = StripSlot {
            pd: target.clone(),
            loc: to,
            readable: false,
            writable: true,
        };
        if let Err(e) = self.write_strip(
            vd,
            Self::strip_id(vd, stripe, i),
            &slot,
            &auth,
            0,
            &g.bufs[i],
        ) {
            if self.note_io_error(&target, "writing a rebuilt strip", &e) {
                self.persist_meta()?;
            }
            return Err(VdiskError::io(
                &format!("pdisk {}", target.name),
                format!("writing strip {i} of vdisk {} stripe {stripe}", vd.name),
                e,
            ));
        }
        self.headers.insert(
            Self::cache_key(vd, stripe, i),
            Self::cache_loc(to),
            auth.clone(),
        );
        if to != from {
            vd.set_loc(stripe, i, to);
            let old = self.pdisk(from.pdisk);
            if old.writable() {
                // Invalidate the old copy's header, so that if a crash brings back the
                // previous map before the new one is durable, the old copy (which later
                // writes no longer reach) fails verification instead of being read.
                let _ = old.write(&AlignedBuf::zeroed(SECTOR_USIZE), from.offset());
            }
            self.free_after_persist(from, vd.slot_sectors);
        }
        self.clear_stale(&stale);
        Ok(Some(vd.strip_bytes as u64))
    }

    /// Brings strip `i` (on a pdisk resuming after a suspension) up to date if a write
    /// skipped it. Returns bytes written.
    pub fn catch_up(
        &self,
        vd: &VdiskCore,
        stripe: u64,
        i: usize,
    ) -> Result<Option<u64>, VdiskError> {
        let loc = vd.loc(stripe, i);
        {
            let _exclusive = self.stripe_lock(vd.id, stripe).write();
            let slots = self.view(vd, stripe);
            let max_other = (0..vd.n)
                .filter(|&j| j != i && slots[j].readable)
                .filter_map(|j| {
                    self.read_header(vd, stripe, j, &slots[j], false)
                        .ok()
                        .flatten()
                })
                .map(|h| h.version)
                .max();
            let Some(max_other) = max_other else {
                return Ok(Some(0));
            };
            let own = self
                .read_header(vd, stripe, i, &slots[i], true)
                .ok()
                .flatten();
            if own.is_some_and(|h| h.version >= max_other) {
                return Ok(Some(0));
            }
        }
        self.relocate(vd, stripe, i, loc, loc)
    }

    /// Verifies a stripe completely (headers from the drives, every sector, parity against
    /// data) and repairs what it can. A parity rewrite marks the region dirty first, like
    /// any other stripe update.
    pub fn scrub_stripe(
        &self,
        vd: &VdiskCore,
        stripe: u64,
        report: &mut ScrubReport,
    ) -> Result<(), VdiskError> {
        report.stripes += 1;
        report.bytes += vd.n as u64 * vd.strip_bytes as u64;
        let lock = self.stripe_lock(vd.id, stripe);
        let mismatch = {
            let _exclusive = lock.write();
            self.scrub_locked(vd, stripe, Some(report), false)?
        };
        if mismatch {
            report.parity_mismatches += 1;
            self.event(format!(
                "vdisk {} stripe {stripe}: parity disagreed with checksummed data; rewritten",
                vd.name
            ));
            let _dirty = self.begin_dirty(vd, stripe)?;
            let _exclusive = lock.write();
            self.scrub_locked(vd, stripe, None, true)?;
        }
        Ok(())
    }

    /// The scrub of one stripe under its lock: true when parity disagrees with data (and,
    /// with `fix`, was rewritten).
    fn scrub_locked(
        &self,
        vd: &VdiskCore,
        stripe: u64,
        mut report: Option<&mut ScrubReport>,
        fix: bool,
    ) -> Result<bool, VdiskError> {
        let opts = GatherOpts {
            fresh: true,
            repair: true,
        };
        let g = match self.gather(vd, stripe, 0..vd.sps, opts) {
            Ok(g) => g,
            Err(VdiskError::Unrecoverable { .. }) => {
                if let Some(r) = report.as_deref_mut() {
                    r.unrecoverable += 1;
                }
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        if let Some(r) = report.as_deref_mut() {
            r.repaired_sectors += g.repaired;
        }
        let Some(auth) = g.auth.clone() else {
            return Ok(false);
        };
        if (0..vd.n).any(|i| !g.strip_ok(i)) {
            if let Some(r) = report {
                r.unrecoverable += 1;
            }
            return Ok(false);
        }
        if g.reconstructed {
            // Unreadable strips were rebuilt in memory from the others: comparing parity
            // would only compare reconstructed parity with itself.
            return Ok(false);
        }
        let data: Vec<&[u8]> = g.bufs[..vd.k].iter().map(|b| &b[..]).collect();
        let mut parity: Vec<Vec<u8>> = vec![vec![0; vd.strip_bytes]; vd.m];
        {
            let mut p: Vec<&mut [u8]> = parity.iter_mut().map(|b| &mut b[..]).collect();
            vd.codec.encode(&data, &mut p)?;
        }
        if parity
            .iter()
            .zip(&g.bufs[vd.k..])
            .all(|(a, b)| a[..] == b[..])
        {
            return Ok(false);
        }
        if fix {
            let mut block = AlignedBuf::zeroed(vd.block_bytes as usize);
            for (j, d) in data.iter().enumerate() {
                block[j * vd.strip_bytes..(j + 1) * vd.strip_bytes].copy_from_slice(d);
            }
            self.write_full(vd, stripe, &block, auth.lost_mask)?;
        }
        Ok(true)
    }

    /// Resynchronises a stripe of a dirty region after an unclean shutdown: data strips are
    /// taken as they are (a sector that fails its checksum is a torn write that was never
    /// acknowledged), unavailable data strips are reconstructed where that verifies, and
    /// parity and checksums are recomputed. Stripes found consistent are left alone.
    pub fn resync_stripe(
        &self,
        vd: &VdiskCore,
        stripe: u64,
        report: &mut RecoveryReport,
    ) -> Result<(), VdiskError> {
        let _exclusive = self.stripe_lock(vd.id, stripe).write();
        report.stripes_checked += 1;
        let slots = self.view(vd, stripe);
        let mut bufs: Vec<AlignedBuf> = (0..vd.n).map(|_| sectors_buf(vd.sps)).collect();
        let reads = self.read_all(vd, stripe, &slots, 0, &mut bufs, true);
        let mut heads: Vec<Option<Arc<StripHeader>>> = vec![None; vd.n];
        let mut present = vec![false; vd.n];
        for (i, r) in reads.into_iter().enumerate() {
            if let Some((h, d)) = r {
                heads[i] = h.ok().flatten();
                present[i] = d.is_ok();
            }
        }
        let Some(auth) = heads.iter().flatten().max_by_key(|h| h.version).cloned() else {
            self.zero_rolled_back(vd, &slots, &bufs, &present, report);
            return Ok(());
        };
        if self.stripe_consistent(vd, &bufs, &heads, &present, &auth)? {
            return Ok(());
        }
        let available = present.iter().filter(|&&p| p).count();
        if available < vd.k {
            return Ok(());
        }
        let mut tables: Vec<&StripHeader> = heads.iter().flatten().map(|h| h.as_ref()).collect();
        tables.sort_by_key(|h| std::cmp::Reverse(h.version));
        tables.dedup_by_key(|h| h.version);
        let mut ok: Vec<Vec<bool>> = present.iter().map(|&p| vec![p; vd.sps]).collect();
        for (j, buf) in bufs
            .iter()
            .enumerate()
            .take(vd.k)
            .filter(|(j, _)| present[*j])
        {
            report.torn_sectors += buf
                .chunks_exact(SECTOR_USIZE)
                .enumerate()
                .filter(|(t, s)| !tables.iter().any(|h| h.crc(j, *t) == crc(s)))
                .count() as u64;
        }
        for t in 0..vd.sps {
            if (0..vd.k).any(|j| !ok[j][t]) {
                self.reconstruct_sector(vd, &mut bufs, &mut ok, t, 0, &tables);
            }
        }
        let mut lost = auth.lost_mask;
        let mut block = AlignedBuf::zeroed(vd.block_bytes as usize);
        for j in 0..vd.k {
            if ok[j].iter().all(|&b| b) && lost & (1 << j) == 0 {
                block[j * vd.strip_bytes..(j + 1) * vd.strip_bytes].copy_from_slice(&bufs[j]);
            } else {
                if lost & (1 << j) == 0 {
                    report.lost_strips += 1;
                    self.event(format!(
                        "vdisk {} stripe {stripe}: data strip {j} lost (torn write into a \
                         degraded stripe); reads of it fail until it is rewritten",
                        vd.name
                    ));
                }
                lost |= 1 << j;
            }
        }
        report.stripes_resynced += 1;
        self.write_full(vd, stripe, &block, lost)
    }

    /// Zeroes the strips of a never-written stripe that hold data. It reads as zeros (no
    /// valid header anywhere), but a first write that the crash rolled back (none of its
    /// headers survived) may have left some of its sectors behind. Resync takes data strips
    /// as they are, so if a later write to the stripe were torn in turn, those sectors would
    /// come back as data that was never written durably. Made durable by the flush that
    /// ends the resync, before the bitmap is cleared.
    fn zero_rolled_back(
        &self,
        vd: &VdiskCore,
        slots: &[StripSlot],
        bufs: &[AlignedBuf],
        present: &[bool],
        report: &mut RecoveryReport,
    ) {
        // As for reads: with fewer than k strips readable, "no header" proves nothing.
        if present.iter().filter(|&&p| p).count() < vd.k {
            return;
        }
        let zeros = sectors_buf(vd.sps);
        for (i, slot) in slots.iter().enumerate() {
            if !present[i] || !slot.writable || bufs[i].iter().all(|&b| b == 0) {
                continue;
            }
            match slot.pd.write(&zeros, Self::data_offset(vd, slot.loc, 0)) {
                Ok(()) => report.rolled_back_strips += 1,
                Err(e) => {
                    if self.note_io_error(&slot.pd, "zeroing a rolled-back strip", &e) {
                        let _ = self.persist_meta();
                    }
                }
            }
        }
    }

    /// Every readable strip has a valid header, every sector verifies against the newest
    /// table, and (when all strips are there) parity matches data.
    fn stripe_consistent(
        &self,
        vd: &VdiskCore,
        bufs: &[AlignedBuf],
        heads: &[Option<Arc<StripHeader>>],
        present: &[bool],
        auth: &StripHeader,
    ) -> Result<bool, VdiskError> {
        for i in 0..vd.n {
            if !present[i] {
                continue;
            }
            // Strips not touched by the last update keep an older header: only a missing
            // or torn header matters, the content is checked against the newest table.
            if heads[i].is_none() {
                return Ok(false);
            }
            let verified = bufs[i]
                .chunks_exact(SECTOR_USIZE)
                .enumerate()
                .all(|(t, s)| crc(s) == auth.crc(i, t));
            if !verified {
                return Ok(false);
            }
        }
        if present.iter().all(|&p| p) {
            let data: Vec<&[u8]> = bufs[..vd.k].iter().map(|b| &b[..]).collect();
            let mut parity: Vec<Vec<u8>> = vec![vec![0; vd.strip_bytes]; vd.m];
            let mut p: Vec<&mut [u8]> = parity.iter_mut().map(|b| &mut b[..]).collect();
            vd.codec.encode(&data, &mut p)?;
            return Ok(parity
                .iter()
                .zip(&bufs[vd.k..])
                .all(|(a, b)| a[..] == b[..]));
        }
        Ok(true)
    }
}

/// Ends a write in a dirty region when dropped.
pub struct DirtyGuard<'a> {
    core: &'a DaCore,
    vdisk_id: u32,
    region: usize,
}

impl Drop for DirtyGuard<'_> {
    fn drop(&mut self) {
        self.core.dirty.end_write(self.vdisk_id, self.region);
    }
}
