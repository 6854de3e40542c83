//! Recovery: reads the pages that follow the replay point and reassembles the records.

use std::sync::Arc;

use tessera_drive::{AlignedBuf, BlockDevice};

use crate::format::{
    frame_crc_ok, lsn_at, page_of, parse_frame_header, Geometry, LogHeader, PageHeader,
    FRAME_HEADER_BYTES, NO_RECORD_START, PAGE_BYTES, PAGE_HEADER_BYTES, PAGE_PAYLOAD_BYTES,
};
use crate::{io_context, JournalError, Lsn, Record};

/// Pages read per device call while scanning (1 MiB): large enough to stream a big log,
/// small enough that scanning a nearly empty one costs little.
const SCAN_CHUNK_PAGES: u64 = 256;

/// Unreadable pages the look past the end of the log steps over before it looks for later
/// commits ([`committed_beyond`]): damage is rarely one 4 KiB page, a lost sector run or a
/// zeroed stripe unit spans several.
const LOOK_PAST_BAD_PAGES: u64 = 16;

/// What recovery found.
pub(crate) struct Scan {
    /// Intact records with end LSN above the replay point, in log order.
    pub records: Vec<Record>,
    /// Sequence of the first page that is not part of the log: appending resumes there.
    pub next_seq: u64,
    /// Committed records lost to a damaged page (see [`committed_beyond`]), said in words,
    /// when the caller accepted the loss; `records` then ends before that page.
    pub lost: Option<String>,
}

/// What the scan does when the page it stopped at held committed records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnDamage {
    /// Refuse: `JournalError::Corrupt`, nothing replayed.
    Refuse,
    /// Replay what precedes the damaged page and say what was lost (fsck's repair).
    AcceptLoss,
}

/// Reads pages of the log one lap at most, in chunks.
struct PageReader<'a> {
    dev: &'a Arc<dyn BlockDevice>,
    geometry: Geometry,
    buf: AlignedBuf,
    /// Sequence of the first page in `buf`, and how many pages of `buf` are loaded.
    buf_seq: u64,
    buf_pages: u64,
}

impl PageReader<'_> {
    fn page(&mut self, seq: u64) -> Result<&[u8], JournalError> {
        if seq < self.buf_seq || seq >= self.buf_seq + self.buf_pages {
            let pages = SCAN_CHUNK_PAGES.min(self.geometry.pages_until_wrap(seq));
            let bytes = (pages as usize) * PAGE_BYTES;
            let offset = self.geometry.page_offset(seq);
            self.dev
                .read_at(&mut self.buf[..bytes], offset)
                .map_err(|e| io_context(&**self.dev, "journal read", offset, e))?;
            self.buf_seq = seq;
            self.buf_pages = pages;
        }
        let at = ((seq - self.buf_seq) as usize) * PAGE_BYTES;
        Ok(&self.buf[at..at + PAGE_BYTES])
    }
}

/// Reassembles record frames from the byte stream of consecutive pages.
struct Assembler {
    max_record_bytes: usize,
    header: [u8; FRAME_HEADER_BYTES],
    header_len: usize,
    /// Payload length of the frame being read, once its header is complete.
    payload_len: Option<usize>,
    crc: u32,
    payload: Vec<u8>,
}

/// Why a page cannot be part of the log although its own checksum is fine.
type Inconsistent = &'static str;

impl Assembler {
    fn idle(&self) -> bool {
        self.header_len == 0
    }

    fn reset(&mut self) {
        self.header_len = 0;
        self.payload_len = None;
        self.payload = Vec::new();
    }

    /// Consumes the payload bytes `data[start..]` of page `seq`; complete records go to
    /// `out`. Returns the payload offset at which the first frame starting here began.
    fn feed_page(
        &mut self,
        seq: u64,
        data: &[u8],
        start: usize,
        out: &mut Vec<Record>,
    ) -> Result<Option<usize>, Inconsistent> {
        let mut pos = start;
        let mut first_start = None;
        while pos < data.len() {
            if self.idle() && first_start.is_none() {
                first_start = Some(pos);
            }
            if self.payload_len.is_none() {
                let take = (FRAME_HEADER_BYTES - self.header_len).min(data.len() - pos);
                self.header[self.header_len..self.header_len + take]
                    .copy_from_slice(&data[pos..pos + take]);
                self.header_len += take;
                pos += take;
                if self.header_len < FRAME_HEADER_BYTES {
                    continue;
                }
                let (len, crc) = parse_frame_header(&self.header);
                let len = len as usize;
                if len > self.max_record_bytes {
                    return Err("record length above the maximum");
                }
                self.payload_len = Some(len);
                self.crc = crc;
                self.payload = Vec::with_capacity(len);
            }
            let len = self.payload_len.expect("header complete");
            let take = (len - self.payload.len()).min(data.len() - pos);
            self.payload.extend_from_slice(&data[pos..pos + take]);
            pos += take;
            if self.payload.len() == len {
                if !frame_crc_ok(&self.payload, self.crc) {
                    return Err("record checksum mismatch");
                }
                let payload = std::mem::take(&mut self.payload);
                out.push(Record {
                    lsn: lsn_at(seq, pos),
                    payload,
                });
                self.reset();
            }
        }
        Ok(first_start)
    }
}

/// Checks everything about a page that does not depend on its record bytes: identity,
/// sequence, and that it may follow `prev` (the page before it in this scan).
fn page_continues(
    header: &PageHeader,
    log: &LogHeader,
    seq: u64,
    prev: Option<&PageHeader>,
) -> Result<(), Inconsistent> {
    if header.log_id != log.log_id || header.format_epoch != log.format_epoch {
        return Err("page of another log or an earlier format");
    }
    if header.seq != seq {
        return Err("page sequence does not continue the log (earlier lap)");
    }
    // A session only writes pages after the end of the log it found at open. A page from a
    // different session than its predecessor is therefore valid only as that session's
    // first page; otherwise it is a stale page beyond an end that a later session rewrote.
    if let Some(prev) = prev {
        if prev.session_nonce != header.session_nonce && header.session_first_seq != seq {
            return Err("stale page of an earlier session");
        }
    }
    Ok(())
}

/// Scans the log from the page holding `replay_from`.
pub(crate) fn scan(
    dev: &Arc<dyn BlockDevice>,
    log: &LogHeader,
    geometry: Geometry,
    replay_from: Lsn,
    on_damage: OnDamage,
) -> Result<Scan, JournalError> {
    let mut reader = PageReader {
        dev,
        geometry,
        buf: AlignedBuf::zeroed(SCAN_CHUNK_PAGES as usize * PAGE_BYTES),
        buf_seq: 0,
        buf_pages: 0,
    };
    let mut assembler = Assembler {
        max_record_bytes: geometry.max_record_bytes(),
        header: [0; FRAME_HEADER_BYTES],
        header_len: 0,
        payload_len: None,
        crc: 0,
        payload: Vec::new(),
    };
    let first_seq = page_of(replay_from);
    // Payload offset in the first page where the record after `replay_from` starts.
    let in_page = (replay_from % PAGE_BYTES as u64) as usize;
    let start_pos = in_page.saturating_sub(PAGE_HEADER_BYTES);
    let mut records = Vec::new();
    let mut prev: Option<PageHeader> = None;
    let mut seq = first_seq;
    let mut stopped: Option<&'static str> = None;
    // One lap at most: the slot after a full lap holds the first page again.
    while seq < first_seq + geometry.data_pages {
        let page = reader.page(seq)?;
        let Some(header) = PageHeader::decode(page) else {
            tracing::debug!(
                seq,
                "journal replay stops: page missing, torn or not a log page"
            );
            stopped = Some("it is missing, torn or fails its checksum");
            break;
        };
        if let Err(why) = page_continues(&header, log, seq, prev.as_ref()) {
            tracing::debug!(seq, why, "journal replay stops");
            stopped = Some(why);
            break;
        }
        if prev.is_some_and(|p| p.session_nonce != header.session_nonce) {
            // The new session started on a fresh page; a frame left unfinished by the
            // previous one was never committed.
            assembler.reset();
        }
        let used = header.used_bytes as usize;
        let data = &page[PAGE_HEADER_BYTES..PAGE_HEADER_BYTES + used];
        let start = if seq == first_seq { start_pos } else { 0 };
        if seq == first_seq && start > used {
            let detail = format!(
                "replay point {replay_from} lies beyond the {used} record bytes of its page \
                 (page {first_seq})"
            );
            return replay_point_lost(dev, detail, first_seq, on_damage);
        }
        let mut page_records = Vec::new();
        let checked = assembler
            .feed_page(seq, data, start, &mut page_records)
            .and_then(|first| check_page_structure(&header, first, &assembler, start, used));
        if let Err(why) = checked {
            tracing::warn!(seq, why, "journal replay stops at an inconsistent page");
            stopped = Some(why);
            break;
        }
        records.append(&mut page_records);
        prev = Some(header);
        seq += 1;
    }
    if prev.is_none() && start_pos > 0 {
        let detail = format!(
            "the page holding replay point {replay_from} (page {first_seq}) is not intact, \
             although the checkpoint says records up to there were durable"
        );
        return replay_point_lost(dev, detail, first_seq, on_damage);
    }
    let mut lost = None;
    if let Some(why) = stopped {
        let session = prev.map(|p| p.session_nonce);
        let end = first_seq + geometry.data_pages;
        if let Some(commit_end) = committed_beyond(&mut reader, log, (seq, session), end)? {
            let detail = format!(
                "page {seq} (byte {} of the device) does not read back as written ({why}), yet \
                 it held committed records: page {commit_end} after it ends a commit, and page \
                 {} follows it, written by a later commit of the session that wrote page \
                 {seq}, which the journal starts only once the commit before it is on stable \
                 storage",
                geometry.page_offset(seq),
                commit_end + 1
            );
            match on_damage {
                OnDamage::Refuse => {
                    return Err(JournalError::Corrupt {
                        device: dev.name().to_string(),
                        detail: format!(
                            "{detail}. Replaying only the records before page {seq} would drop \
                             what it and the pages after it hold, which was acknowledged to \
                             applications, without a word, so nothing is replayed"
                        ),
                    });
                }
                OnDamage::AcceptLoss => {
                    tracing::error!(
                        device = dev.name(),
                        "journal replay stops at a damaged page and the records after it are \
                         lost: {detail}"
                    );
                    lost = Some(detail);
                }
            }
        }
    }
    assert!(records.windows(2).all(|w| w[0].lsn < w[1].lsn));
    assert!(records.first().is_none_or(|r| r.lsn > replay_from));
    Ok(Scan {
        records,
        next_seq: seq,
        lost,
    })
}

/// The page holding the replay point (`page`) does not hold what the checkpoint says was
/// durable there: refused, or (accepting the loss) nothing replayed and the next page
/// made the first one to append to, since LSNs must stay above the replay point.
fn replay_point_lost(
    dev: &Arc<dyn BlockDevice>,
    detail: String,
    page: u64,
    on_damage: OnDamage,
) -> Result<Scan, JournalError> {
    match on_damage {
        OnDamage::Refuse => Err(JournalError::Corrupt {
            device: dev.name().to_string(),
            detail: format!("{detail}; nothing is replayed"),
        }),
        OnDamage::AcceptLoss => {
            tracing::error!(
                device = dev.name(),
                "journal replay finds its first page damaged; every record after the replay \
                 point is lost: {detail}"
            );
            Ok(Scan {
                records: Vec::new(),
                next_seq: page + 1,
                lost: Some(detail),
            })
        }
    }
}

/// Whether the page the scan stopped at, `stop`, held committed records: the end of a
/// commit (a page sealed short, which only a commit's last page is) followed by a page of
/// the same session lies beyond it, written by a later commit, which the journal starts
/// only once the commit before it is on stable storage. The session must be the one that
/// wrote the page before `stop` (`session`): it wrote its pages in one run, so it wrote
/// `stop` too, in a commit that completed. A torn tail never shows this: a crash tears
/// only the pages of the last commit, whose last page is the only one sealed short, and a
/// later session starts writing at the torn page. Pages of an older session left beyond
/// a newer one's end show it too, but never in the session that wrote the page before
/// `stop`. Without a page before `stop` (the scan's first page), any session that started
/// at or before `stop` counts. Returns the sequence of that commit's last page.
fn committed_beyond(
    reader: &mut PageReader<'_>,
    log: &LogHeader,
    (stop, session): (u64, Option<u64>),
    end: u64,
) -> Result<Option<u64>, JournalError> {
    let mut prev: Option<PageHeader> = None;
    let mut seq = stop + 1;
    while seq < end {
        let page = reader.page(seq)?;
        let header = PageHeader::decode(page)
            .filter(|h| h.log_id == log.log_id && h.format_epoch == log.format_epoch)
            .filter(|h| h.seq == seq);
        let Some(header) = header else {
            if prev.is_some() || seq - stop > LOOK_PAST_BAD_PAGES {
                return Ok(None);
            }
            seq += 1;
            continue;
        };
        if let Some(p) = prev {
            let same = p.session_nonce == header.session_nonce;
            let sealed = (p.used_bytes as usize) < PAGE_PAYLOAD_BYTES;
            let wrote_stop = match session {
                Some(s) => s == p.session_nonce,
                None => p.session_first_seq <= stop,
            };
            if same && sealed && wrote_stop {
                return Ok(Some(p.seq));
            }
        }
        prev = Some(header);
        seq += 1;
    }
    Ok(None)
}

/// Checks the page's own description of its records against what parsing found.
fn check_page_structure(
    header: &PageHeader,
    first_start: Option<usize>,
    assembler: &Assembler,
    start: usize,
    used: usize,
) -> Result<(), Inconsistent> {
    // Only a commit seals a page early, and it does so between records.
    if used < PAGE_PAYLOAD_BYTES && !assembler.idle() {
        return Err("sealed page ends inside a record");
    }
    // When replay begins in the middle of the first page, earlier frames were skipped.
    if start == 0 {
        let recorded =
            (header.first_record != NO_RECORD_START).then_some(header.first_record as usize);
        if recorded != first_start {
            return Err("first-record offset disagrees with the record stream");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Structured fuzzing: pages with valid checksums but arbitrary header fields and
    //! record streams. Opening must never panic, and whatever prefix it accepts must stay
    //! stable when a new session appends behind it.

    use std::sync::Arc;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use tessera_drive::{AlignedBuf, BlockDevice, FileDrive};

    use crate::format::{
        frame_header, LogHeader, PageHeader, NO_RECORD_START, PAGE_BYTES, PAGE_PAYLOAD_BYTES,
    };
    use crate::{format, Journal, JournalError, JournalRegion};

    const LOG_ID: [u8; 16] = [0x42; 16];

    /// A stream of mostly valid record frames, and the offsets where frames start.
    fn frame_stream(rng: &mut StdRng, bytes: usize) -> (Vec<u8>, Vec<usize>) {
        let mut out = Vec::with_capacity(bytes + 20_000);
        let mut starts = Vec::new();
        while out.len() < bytes {
            let len = if rng.gen_bool(0.7) {
                rng.gen_range(0..300)
            } else {
                rng.gen_range(0..9000)
            };
            let payload: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            let mut header = frame_header(&payload);
            if rng.gen_bool(0.01) {
                header[rng.gen_range(0..8)] ^= 0x40;
            }
            starts.push(out.len());
            out.extend_from_slice(&header);
            out.extend_from_slice(&payload);
        }
        (out, starts)
    }

    /// Builds page `seq` from the stream at `*at`: usually exactly as the journal would
    /// (sometimes sealed early at a frame boundary), sometimes with arbitrary fields.
    fn fuzz_page(
        rng: &mut StdRng,
        log: &LogHeader,
        seq: u64,
        (stream, starts): &(Vec<u8>, Vec<usize>),
        at: &mut usize,
    ) -> Vec<u8> {
        let good = rng.gen_bool(0.97);
        let next_start = starts
            .iter()
            .copied()
            .find(|&s| s > *at && s < *at + PAGE_PAYLOAD_BYTES);
        let used = match next_start {
            Some(s) if good && rng.gen_bool(0.1) => s - *at,
            _ if good || rng.gen_bool(0.5) => PAGE_PAYLOAD_BYTES,
            _ => rng.gen_range(0..=PAGE_PAYLOAD_BYTES),
        };
        let page_start = *at;
        let payload = stream[*at..*at + used].to_vec();
        let first = starts.iter().copied().find(|&s| s >= *at && s < *at + used);
        *at = if used < PAGE_PAYLOAD_BYTES && good {
            *at + used
        } else {
            *at + PAGE_PAYLOAD_BYTES
        };
        let first_record = match (good, rng.gen_range(0..3)) {
            (true, _) | (false, 0) => first.map_or(NO_RECORD_START, |s| (s - page_start) as u16),
            (false, 1) => NO_RECORD_START,
            _ if used > 0 => rng.gen_range(0..used) as u16,
            _ => NO_RECORD_START,
        };
        let first_record = if first_record != NO_RECORD_START && first_record as usize >= used {
            NO_RECORD_START
        } else {
            first_record
        };
        let header = PageHeader {
            log_id: if good || rng.gen_bool(0.5) {
                log.log_id
            } else {
                [1; 16]
            },
            format_epoch: if good || rng.gen_bool(0.5) {
                log.format_epoch
            } else {
                rng.gen()
            },
            seq: if good {
                seq
            } else {
                seq.wrapping_add(rng.gen_range(0..3))
            },
            session_nonce: if good { 7 } else { rng.gen_range(6..9) },
            session_first_seq: if good { 0 } else { rng.gen_range(0..=seq) },
            used_bytes: used as u16,
            first_record,
        };
        let mut page = vec![0; PAGE_BYTES];
        header.encode(&payload, &mut page);
        page
    }

    #[test]
    fn crc_valid_random_pages_never_panic_and_prefix_is_stable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d");
        let region = JournalRegion {
            offset: 0,
            bytes: 1 << 20,
        };
        std::fs::File::create(&path)
            .unwrap()
            .set_len(region.bytes)
            .unwrap();
        let dev: Arc<dyn BlockDevice> = Arc::new(FileDrive::open(&path).unwrap());
        let mut rng = StdRng::seed_from_u64(77);
        let (mut opened, mut appended, mut replayed, mut refused) = (0, 0, 0, 0);
        for round in 0..150u64 {
            format(&*dev, region, LOG_ID).unwrap();
            let mut header_page = AlignedBuf::zeroed(PAGE_BYTES);
            dev.read_at(&mut header_page, 0).unwrap();
            let log = LogHeader::decode(&header_page).unwrap();
            let data_pages = region.bytes / PAGE_BYTES as u64 - 1;
            let lap = rng.gen_range(0..3u64);
            let stream = frame_stream(&mut rng, (data_pages as usize + 1) * PAGE_PAYLOAD_BYTES);
            let mut at = 0;
            let mut image = AlignedBuf::zeroed((data_pages as usize) * PAGE_BYTES);
            let valid_pages = rng.gen_range(0..=data_pages);
            for slot in 0..valid_pages {
                let page = fuzz_page(&mut rng, &log, lap * data_pages + slot, &stream, &mut at);
                let off = slot as usize * PAGE_BYTES;
                image[off..off + PAGE_BYTES].copy_from_slice(&page);
            }
            dev.write_at(&image, PAGE_BYTES as u64).unwrap();
            let replay_from = match round % 4 {
                0 => 0,
                1 => lap * data_pages * PAGE_BYTES as u64,
                2 => rng.gen_range(0..(lap + 1) * data_pages * PAGE_BYTES as u64),
                _ => rng.gen(),
            };
            // A page that held committed records and does not read back is refused; the
            // repair's open accepts the loss, and after its first commit the log must open
            // normally again (the second open below), from the replay point a repair's
            // checkpoint names: past the replay point's own page when nothing after it in
            // that page survived.
            let mut replay_again = replay_from;
            let opened_now = match Journal::open(dev.clone(), region, LOG_ID, replay_from) {
                Ok(opened) => Ok(opened),
                Err(JournalError::Corrupt { .. }) => {
                    refused += 1;
                    Journal::open_accepting_loss(dev.clone(), region, LOG_ID, replay_from).map(
                        |(journal, records, lost)| {
                            assert!(lost.is_some(), "round {round}: refused, yet nothing lost");
                            if records.is_empty() {
                                replay_again = crate::page_start_at_or_after(replay_from);
                            }
                            (journal, records)
                        },
                    )
                }
                Err(e) => Err(e),
            };
            let Ok((journal, first)) = opened_now else {
                continue;
            };
            opened += 1;
            replayed += first.len();
            assert!(first.iter().all(|r| r.lsn > replay_from));
            let lsn = match journal.append(b"after fuzz") {
                Ok(lsn) => lsn,
                Err(JournalError::Full { .. }) => continue,
                Err(e) => panic!("{e}"),
            };
            assert!(first.last().is_none_or(|r| r.lsn < lsn));
            journal.commit(lsn).unwrap();
            drop(journal);
            appended += 1;
            let (_, second) = Journal::open(dev.clone(), region, LOG_ID, replay_again).unwrap();
            assert_eq!(second.len(), first.len() + 1, "round {round}");
            assert!(
                second[..first.len()] == first[..],
                "round {round}: prefix changed"
            );
            assert_eq!(second.last().unwrap().payload, b"after fuzz");
        }
        assert!(
            opened > 50 && appended > 40 && refused > 0,
            "opened {opened}, appended {appended}, refused as damaged {refused}"
        );
        assert!(
            replayed > 100,
            "the fuzzer must produce parsable logs: {replayed} records"
        );
    }
}
