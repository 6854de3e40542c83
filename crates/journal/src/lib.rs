//! The write-ahead metadata journal (recovery log) of Tessera.
//!
//! The file system appends opaque records (serialized metadata transactions), commits them
//! durably (fsync, or periodic group commit), and after a crash replays every durable record
//! after its last checkpoint. The log lives in a fixed region of a drive.
//!
//! # On-disk format (version 1)
//!
//! All integers are little-endian. The region is one header page followed by a circular
//! array of `N = region.bytes / 4096 - 1` data pages. Page `seq` (counted from 0 over the
//! whole life of the log) lives in data slot `seq % N`.
//!
//! ```text
//! region: | header page | slot 0 | slot 1 | ... | slot N-1 |     (4096 bytes each)
//!
//! header page
//!   0      4      8       12      16             32        40        48      56    4096
//!   +------+------+-------+-------+--------------+---------+---------+-------+-- ~ --+
//!   |magic |crc32c|version|page   | log_id       | region  | region  |format | zero  |
//!   |"TJLH"|      |u32 = 1|bytes  | [u8; 16]     | offset  | bytes   |epoch  |       |
//!   |u32   |u32   |       |u32    |              | u64     | u64     |u64    |       |
//!   +------+------+-------+-------+--------------+---------+---------+-------+-- ~ --+
//!
//! data page
//!   0      4      8              24      32      40      48      56   58   60   64    4096
//!   +------+------+--------------+-------+-------+-------+-------+----+----+----+-- ~ --+
//!   |magic |crc32c| log_id       |format |page   |session|session|used|1st |zero|payload|
//!   |"TJLP"|      | [u8; 16]     |epoch  |seq    |nonce  |first  |u16 |rec |u32 |4032 B |
//!   |u32   |u32   |              |u64    |u64    |u64    |seq u64|    |u16 |    |       |
//!   +------+------+--------------+-------+-------+-------+-------+----+----+----+-- ~ --+
//!
//! payload: a byte stream of record frames, which may span pages:
//!   +---------+-----------------------+-------------------+
//!   | len u32 | crc32c(len ++ payload)| payload (len B)   |  ...next frame...
//!   +---------+-----------------------+-------------------+
//! ```
//!
//! * `crc32c` covers the whole 4096-byte page with the crc field taken as zero, so a torn
//!   page write (only some sectors reach the disk) fails it.
//! * `used` is the number of payload bytes holding frames; the rest of the page is zero.
//!   A page with `used < 4032` was sealed by a commit; the next record starts on the next page.
//! * `1st rec` is the payload offset of the first frame that starts in the page, or
//!   `0xFFFF` when the page only continues a record from earlier pages.
//! * `format epoch` changes on every [`format`]: pages of an earlier format of the same
//!   region, even under the same `log_id`, are never taken for pages of the current one.
//! * `session nonce` is random per [`Journal::open`], `session first seq` is the first page
//!   that open wrote. Replay accepts a page from a different session than its predecessor
//!   only if it is that session's first page. This rejects a stale page that an earlier,
//!   crashed session wrote beyond a torn page, after a later session rewrote the torn one.
//!
//! **LSNs** are byte positions in the unwrapped page stream: `lsn = seq * 4096 + offset in
//! page`. A record's LSN is the position just after its last byte. LSN 0 is the start of a
//! freshly formatted log.
//!
//! **Durability rule.** A page is written once per lap and never rewritten: a commit writes
//! every pending page, sealing (zero-padding) the last one, and the next append starts a
//! fresh page. So a torn write can only destroy records that were never reported durable.
//! Recovery reads forward from the page of the replay point and stops at the first page
//! that is missing, torn, of another log or format, of an earlier lap (sequence does not
//! continue), or stale (see above). A record whose frame runs into that page is dropped.
//!
//! **Damage is not an end.** A page inside the log that no longer reads back (a flipped bit
//! on the drive, a stray write, a lost sector run) would end the replay as a torn tail does,
//! and every committed record from it on would be dropped without a word. So before it
//! takes the stop for the log's end, recovery looks past it: commits are written one after
//! the other (the next starts once the last is on stable storage), and only a commit's last
//! page is sealed short. A page sealed short beyond the stop, followed by a page of the same
//! session, written by a later commit, proves that the session's commit holding the
//! stopping page completed, provided that session wrote it: the session of the page before
//! the stop (sessions write their pages in one run), or, when the stop is the first page
//! read, a session that started at or before it. A crash tears only its last commit, whose
//! last page is the only one sealed short; pages an older session left beyond a newer
//! one's end never belong to the session before the stop. Such a stop is refused
//! ([`JournalError::Corrupt`], naming the page); fsck's repair opens the log accepting the
//! loss ([`Journal::open_accepting_loss`]) and commits over the damaged page as the first
//! page of a new session, after which the log opens normally.

mod format;
mod replay;

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use tessera_drive::{AlignedBuf, BlockDevice, SECTOR_BYTES};

use format::{
    frame_header, page_of, Geometry, LogHeader, PageHeader, FRAME_HEADER_BYTES, NO_RECORD_START,
    PAGE_BYTES, PAGE_PAYLOAD_BYTES,
};

/// Log sequence number: byte position in the endless logical log stream; 0 is the start of
/// a freshly formatted log.
pub type Lsn = u64;

/// Where the journal lives on its device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JournalRegion {
    /// Byte offset on the device, a multiple of 4096.
    pub offset: u64,
    /// Size in bytes, a multiple of 4096 and at least [`MIN_REGION_BYTES`].
    pub bytes: u64,
}

/// The smallest journal region accepted.
pub const MIN_REGION_BYTES: u64 = 1 << 20;

/// One record returned by replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// LSN of the end of the record; `commit(lsn)` makes it durable.
    pub lsn: Lsn,
    pub payload: Vec<u8>,
}

impl From<io::Error> for JournalError {
    fn from(e: io::Error) -> JournalError {
        JournalError::Io(e)
    }
}

/// Errors of the journal.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// A device error; the message names the device. After a failed commit the journal
    /// refuses further appends and commits: the file system must fail over and replay.
    // In the message and deliberately not a `source()`: see `FsError`.
    #[error("{0}")]
    Io(io::Error),
    /// The record would overwrite records not yet covered by a checkpoint.
    #[error("journal full: {needed} bytes needed, {free} free; checkpoint and retry")]
    Full { needed: u64, free: u64 },
    #[error("journal record of {bytes} bytes exceeds the maximum of {max} bytes")]
    RecordTooLarge { bytes: usize, max: usize },
    /// Damage that is not a normal torn tail, such as a bad header page.
    #[error("{device}: journal corrupt: {detail}")]
    Corrupt { device: String, detail: String },
    /// The region is formatted for another log.
    #[error("{device}: journal belongs to log {found:02x?}, expected {expected:02x?}")]
    WrongLog {
        device: String,
        expected: [u8; 16],
        found: [u8; 16],
    },
    /// The region description itself is unusable.
    #[error("{device}: invalid journal region {region:?}: {reason}")]
    InvalidRegion {
        device: String,
        region: JournalRegion,
        reason: String,
    },
}

/// Adds the operation, offset and device name to an I/O error.
pub(crate) fn io_context(
    dev: &dyn BlockDevice,
    what: &str,
    offset: u64,
    e: io::Error,
) -> io::Error {
    let message = e.to_string();
    if message.contains(dev.name()) {
        io::Error::new(e.kind(), format!("{what} at offset {offset}: {message}"))
    } else {
        io::Error::new(
            e.kind(),
            format!("{}: {what} at offset {offset}: {message}", dev.name()),
        )
    }
}

// `is_multiple_of` needs Rust 1.87; the workspace supports 1.80.
#[allow(clippy::manual_is_multiple_of)]
fn check_region(dev: &dyn BlockDevice, region: JournalRegion) -> Result<(), JournalError> {
    let reason = if region.offset % SECTOR_BYTES != 0 || region.bytes % SECTOR_BYTES != 0 {
        "offset and size must be multiples of 4096".to_string()
    } else if region.bytes < MIN_REGION_BYTES {
        format!("size must be at least {MIN_REGION_BYTES} bytes")
    } else if region
        .offset
        .checked_add(region.bytes)
        .is_none_or(|end| end > dev.size_bytes())
    {
        format!(
            "runs past the end of the device ({} bytes)",
            dev.size_bytes()
        )
    } else {
        return Ok(());
    };
    Err(JournalError::InvalidRegion {
        device: dev.name().to_string(),
        region,
        reason,
    })
}

/// A value that differs between calls and processes with overwhelming probability.
fn nonce() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let local = &count as *const u64 as u64;
    let mut x = nanos ^ (u64::from(std::process::id()) << 32) ^ local.rotate_left(17);
    x = x.wrapping_add(count.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    // splitmix64 finalizer.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Writes an empty log: a header page (magic, version, log_id, region, format epoch, crc).
///
/// Old data pages are not erased: every page carries the log_id and format epoch, and the
/// epoch changes on every format (the previous one plus one when the old header is readable,
/// a random value otherwise), so no page of an earlier log or format can pass as a page of
/// the new one. The first data slot is also zeroed, as a belt and braces.
pub fn format(
    dev: &dyn BlockDevice,
    region: JournalRegion,
    log_id: [u8; 16],
) -> Result<(), JournalError> {
    check_region(dev, region)?;
    let mut page = AlignedBuf::zeroed(PAGE_BYTES);
    dev.read_at(&mut page, region.offset)
        .map_err(|e| io_context(dev, "journal header read", region.offset, e))?;
    let format_epoch = match LogHeader::decode(&page) {
        Ok(old) => old.format_epoch.wrapping_add(1),
        Err(_) => nonce(),
    };
    let header = LogHeader {
        log_id,
        region,
        format_epoch,
    };
    header.encode(&mut page);
    let geometry = Geometry::new(region);
    let zero = AlignedBuf::zeroed(PAGE_BYTES);
    dev.write_at(&zero, geometry.page_offset(0))
        .map_err(|e| io_context(dev, "journal format", geometry.page_offset(0), e))?;
    dev.write_at(&page, region.offset)
        .map_err(|e| io_context(dev, "journal format", region.offset, e))?;
    dev.flush()
        .map_err(|e| io_context(dev, "journal flush", region.offset, e))?;
    Ok(())
}

/// The first LSN at or after `lsn` that starts a page's payload: where a new log (see
/// [`format`]) that continues another one's LSNs can be opened (`Journal::open` with this
/// as the replay point finds nothing to replay and appends from there), since a replay
/// point inside a page needs that page intact.
pub fn page_start_at_or_after(lsn: Lsn) -> Lsn {
    let seq = format::page_of(lsn);
    if lsn <= format::lsn_at(seq, 0) {
        format::lsn_at(seq, 0)
    } else {
        format::lsn_at(seq + 1, 0)
    }
}

/// LSNs stay below this bound (2^62 bytes: a century of writing at 1 GB/s), so LSN
/// arithmetic never overflows even with a nonsensical replay point.
const MAX_LSN: Lsn = 1 << 62;

/// Largest single write_at the committer issues (8 MiB); longer batches take several.
const WRITE_CHUNK_PAGES: u64 = 2048;

/// A data page being filled, or filled and waiting to be written.
struct PendingPage {
    seq: u64,
    used: usize,
    first_record: Option<usize>,
    payload: Box<[u8]>,
}

impl PendingPage {
    fn new(seq: u64) -> PendingPage {
        PendingPage {
            seq,
            used: 0,
            first_record: None,
            payload: vec![0; PAGE_PAYLOAD_BYTES].into(),
        }
    }
}

struct State {
    /// The page records are appended to; always has free space when present.
    open: Option<PendingPage>,
    /// Full pages, in sequence order, not yet handed to a committer.
    sealed: Vec<PendingPage>,
    /// Sequence the next page opened gets.
    next_seq: u64,
    appended_lsn: Lsn,
    durable_lsn: Lsn,
    tail_lsn: Lsn,
    /// A committer is writing; others wait on the condvar.
    writer_active: bool,
    /// Set by the first failed commit; the journal is unusable from then on.
    failure: Option<(io::ErrorKind, String)>,
}

impl State {
    /// Sequence one past the last page holding appended bytes.
    fn end_seq(&self) -> u64 {
        self.open.as_ref().map_or(self.next_seq, |p| p.seq + 1)
    }

    fn failed(&self) -> Option<JournalError> {
        self.failure.as_ref().map(|(kind, msg)| {
            JournalError::Io(io::Error::new(
                *kind,
                format!("journal failed earlier: {msg}"),
            ))
        })
    }

    /// Appends bytes to the page stream, opening pages as needed. Returns the LSN just
    /// after the last byte.
    fn put(&mut self, mut bytes: &[u8], record_start: bool) -> Lsn {
        let mut start = record_start;
        let mut end = 0;
        while !bytes.is_empty() {
            let page = match &mut self.open {
                Some(page) => page,
                None => {
                    self.next_seq += 1;
                    self.open.insert(PendingPage::new(self.next_seq - 1))
                }
            };
            if start && page.first_record.is_none() {
                page.first_record = Some(page.used);
            }
            start = false;
            let take = (PAGE_PAYLOAD_BYTES - page.used).min(bytes.len());
            page.payload[page.used..page.used + take].copy_from_slice(&bytes[..take]);
            page.used += take;
            bytes = &bytes[take..];
            end = format::lsn_at(page.seq, page.used);
            if page.used == PAGE_PAYLOAD_BYTES {
                let full = self.open.take().expect("open page");
                self.sealed.push(full);
            }
        }
        end
    }
}

/// The journal of one log. `Send + Sync`; appends and commits come from many threads.
pub struct Journal {
    dev: Arc<dyn BlockDevice>,
    geometry: Geometry,
    /// Identity fields stamped on every page this open writes.
    stamp: PageHeader,
    state: Mutex<State>,
    /// Signalled when a committer finishes.
    committed: Condvar,
    /// Mirrors of the state fields for lock-free reads.
    durable: AtomicU64,
    appended: AtomicU64,
    /// Records appended and group commits (write and flush) done since the open.
    records: AtomicU64,
    commits: AtomicU64,
    /// The pages the open's replay read: from the replay point's page to the first page
    /// that is not part of the log (appending starts there).
    replayed: (u64, u64),
    /// The end LSN of the last record found at open (`Journal::opened_end`).
    opened_end: Lsn,
}

/// Counters of a journal since it was opened (`Journal::stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalStats {
    pub records: u64,
    /// Group commits: each writes the pending pages of every waiting committer and
    /// flushes the device once.
    pub commits: u64,
    pub appended_lsn: Lsn,
    pub durable_lsn: Lsn,
}

const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Journal>();
};

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("device", &self.dev.name())
            .field("region_offset", &self.geometry.region_offset)
            .field("data_pages", &self.geometry.data_pages)
            .field("appended_lsn", &self.appended_lsn())
            .field("durable_lsn", &self.durable_lsn())
            .finish()
    }
}

impl Journal {
    /// Opens the log and returns every intact record whose end LSN is > `replay_from` (the
    /// LSN recorded by the last completed checkpoint, a record end or 0), in order.
    ///
    /// Reading stops at the first page that is missing, torn, has a bad crc, the wrong
    /// log_id, or a sequence number that does not continue the log. The append point is
    /// placed after the last intact page, on a fresh page. The replayed records are flushed
    /// before returning, so they are durable even if they were only in a drive cache.
    ///
    /// A stop at a page that held committed records (damage inside the log rather than a
    /// torn tail: a later commit of the session that wrote it follows) is refused with
    /// [`JournalError::Corrupt`], which names the page: replaying only what precedes it
    /// would drop acknowledged changes without a word. See [`Journal::open_accepting_loss`].
    pub fn open(
        dev: Arc<dyn BlockDevice>,
        region: JournalRegion,
        log_id: [u8; 16],
        replay_from: Lsn,
    ) -> Result<(Journal, Vec<Record>), JournalError> {
        let (journal, records, lost) =
            Self::open_with(dev, region, log_id, replay_from, replay::OnDamage::Refuse)?;
        assert!(lost.is_none(), "a refusing open loses nothing");
        Ok((journal, records))
    }

    /// [`Journal::open`], but a page that held committed records and no longer reads back
    /// ends the replay as a torn tail would, and the third value says what was lost (fsck's
    /// repair, run by an administrator who chose to go on without those records). The next
    /// commit writes over the damaged page as the first page of a new session, after which
    /// the log opens normally again.
    pub fn open_accepting_loss(
        dev: Arc<dyn BlockDevice>,
        region: JournalRegion,
        log_id: [u8; 16],
        replay_from: Lsn,
    ) -> Result<(Journal, Vec<Record>, Option<String>), JournalError> {
        Self::open_with(
            dev,
            region,
            log_id,
            replay_from,
            replay::OnDamage::AcceptLoss,
        )
    }

    fn open_with(
        dev: Arc<dyn BlockDevice>,
        region: JournalRegion,
        log_id: [u8; 16],
        replay_from: Lsn,
        on_damage: replay::OnDamage,
    ) -> Result<(Journal, Vec<Record>, Option<String>), JournalError> {
        check_region(&*dev, region)?;
        let mut page = AlignedBuf::zeroed(PAGE_BYTES);
        dev.read_at(&mut page, region.offset)
            .map_err(|e| io_context(&*dev, "journal header read", region.offset, e))?;
        let header = LogHeader::decode(&page).map_err(|detail| JournalError::Corrupt {
            device: dev.name().to_string(),
            detail,
        })?;
        if header.log_id != log_id {
            let device = dev.name().to_string();
            return Err(JournalError::WrongLog {
                device,
                expected: log_id,
                found: header.log_id,
            });
        }
        if header.region != region {
            return Err(JournalError::Corrupt {
                device: dev.name().to_string(),
                detail: format!(
                    "header describes region {:?}, opened as {region:?}",
                    header.region
                ),
            });
        }
        if replay_from > MAX_LSN {
            return Err(JournalError::Corrupt {
                device: dev.name().to_string(),
                detail: format!("replay point {replay_from} is beyond any possible log position"),
            });
        }
        let geometry = Geometry::new(region);
        let scan = replay::scan(&dev, &header, geometry, replay_from, on_damage)?;
        dev.flush()
            .map_err(|e| io_context(&*dev, "journal flush", region.offset, e))?;
        let end_lsn = scan.records.last().map_or(replay_from, |r| r.lsn);
        tracing::info!(
            device = dev.name(),
            records = scan.records.len(),
            replay_from,
            end_lsn,
            next_page = scan.next_seq,
            "journal opened"
        );
        let stamp = PageHeader {
            log_id,
            format_epoch: header.format_epoch,
            seq: 0,
            session_nonce: nonce(),
            session_first_seq: scan.next_seq,
            used_bytes: 0,
            first_record: NO_RECORD_START,
        };
        let state = State {
            open: None,
            sealed: Vec::new(),
            next_seq: scan.next_seq,
            appended_lsn: end_lsn,
            durable_lsn: end_lsn,
            tail_lsn: replay_from,
            writer_active: false,
            failure: None,
        };
        let journal = Journal {
            dev,
            geometry,
            stamp,
            state: Mutex::new(state),
            committed: Condvar::new(),
            durable: AtomicU64::new(end_lsn),
            appended: AtomicU64::new(end_lsn),
            records: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            replayed: (page_of(replay_from), scan.next_seq),
            opened_end: end_lsn,
        };
        Ok((journal, scan.records, scan.lost))
    }

    /// The device ranges (offset, bytes) whose contents decided what the open replayed: the
    /// header page and every page from the replay point's to the first page that ended the
    /// log, that one included. A copy of the log that holds these bytes replays the same
    /// records (a mirrored log copies them from the copy replayed onto the other).
    pub fn replayed_ranges(&self) -> Vec<(u64, u64)> {
        let g = self.geometry;
        let page = PAGE_BYTES as u64;
        let mut out = vec![(g.region_offset, page)];
        let (first, next) = self.replayed;
        let mut seq = first;
        let mut left = (next - first + 1).min(g.data_pages);
        while left > 0 {
            let run = left.min(g.pages_until_wrap(seq));
            out.push((g.page_offset(seq), run * page));
            seq += run;
            left -= run;
        }
        out
    }

    /// The page the first append of this open goes to (the first page the replay found
    /// not part of the log).
    pub fn next_page(&self) -> u64 {
        self.replayed.1
    }

    /// Buffers a record in memory and returns its end LSN.
    ///
    /// `Err(Full)` if it would overwrite records not yet covered by a checkpoint (see
    /// [`Journal::set_tail`]): the caller checkpoints and retries. `Err(RecordTooLarge)`
    /// above [`Journal::max_record_bytes`].
    pub fn append(&self, payload: &[u8]) -> Result<Lsn, JournalError> {
        let max = self.max_record_bytes();
        if payload.len() > max {
            return Err(JournalError::RecordTooLarge {
                bytes: payload.len(),
                max,
            });
        }
        let frame_bytes = FRAME_HEADER_BYTES + payload.len();
        let mut state = self.state.lock();
        if let Some(err) = state.failed() {
            return Err(err);
        }
        // Pages the frame needs beyond the free space of the open page.
        let (first_new_seq, free_in_open) = state.open.as_ref().map_or((state.next_seq, 0), |p| {
            (p.seq + 1, PAGE_PAYLOAD_BYTES - p.used)
        });
        let new_pages =
            (frame_bytes.saturating_sub(free_in_open)).div_ceil(PAGE_PAYLOAD_BYTES) as u64;
        let tail_seq = page_of(state.tail_lsn);
        let limit_seq = tail_seq + self.geometry.data_pages;
        if first_new_seq + new_pages > limit_seq {
            let used_pages = state.end_seq() - tail_seq;
            return Err(JournalError::Full {
                needed: new_pages * PAGE_BYTES as u64,
                free: (self.geometry.data_pages - used_pages) * PAGE_BYTES as u64,
            });
        }
        let header_end = state.put(&frame_header(payload), true);
        let lsn = if payload.is_empty() {
            header_end
        } else {
            state.put(payload, false)
        };
        assert!(lsn > state.appended_lsn, "LSNs increase");
        assert!(state.end_seq() <= limit_seq);
        state.appended_lsn = lsn;
        self.appended.store(lsn, Ordering::Release);
        self.records.fetch_add(1, Ordering::Relaxed);
        Ok(lsn)
    }

    /// Returns once every record with end LSN <= `upto` is on stable storage.
    ///
    /// Group commit: one caller writes every pending page and flushes while concurrent
    /// callers wait and share that flush; appends continue meanwhile. A caller whose LSN is
    /// already durable returns at once without I/O. `upto` beyond the appended LSN means
    /// everything appended so far.
    pub fn commit(&self, upto: Lsn) -> Result<(), JournalError> {
        if upto <= self.durable.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut state = self.state.lock();
        let upto = upto.min(state.appended_lsn);
        loop {
            if upto <= state.durable_lsn {
                return Ok(());
            }
            if let Some(err) = state.failed() {
                return Err(err);
            }
            if state.writer_active {
                self.committed.wait(&mut state);
                continue;
            }
            // Become the committer for everything appended so far.
            state.writer_active = true;
            let mut batch = std::mem::take(&mut state.sealed);
            batch.extend(state.open.take());
            let target = state.appended_lsn;
            assert!(
                !batch.is_empty(),
                "records above the durable LSN are pending"
            );
            drop(state);
            let result = self.write_pages(&batch);
            state = self.state.lock();
            state.writer_active = false;
            match result {
                Ok(()) => {
                    assert!(target >= state.durable_lsn);
                    state.durable_lsn = target;
                    self.durable.store(target, Ordering::Release);
                    self.commits.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::error!(error = %e, "journal commit failed; journal unusable");
                    state.failure = Some((e.kind(), e.to_string()));
                    self.committed.notify_all();
                    return Err(JournalError::Io(e));
                }
            }
            self.committed.notify_all();
        }
    }

    /// Commits everything appended so far and returns that LSN.
    pub fn commit_all(&self) -> Result<Lsn, JournalError> {
        let upto = self.appended_lsn();
        self.commit(upto)?;
        Ok(upto)
    }

    /// Writes `pages` (consecutive sequences) in as few device calls as the wrap allows,
    /// then flushes; a batch of one call is written through (FUA) instead, one round trip
    /// to the drive where a write and a flush take two.
    fn write_pages(&self, pages: &[PendingPage]) -> io::Result<()> {
        assert!(
            pages.windows(2).all(|w| w[1].seq == w[0].seq + 1),
            "batch is consecutive"
        );
        let mut done = 0;
        while done < pages.len() {
            let first = pages[done].seq;
            let run = (pages.len() - done) as u64;
            let run = run
                .min(self.geometry.pages_until_wrap(first))
                .min(WRITE_CHUNK_PAGES);
            let run = run as usize;
            let mut buf = AlignedBuf::zeroed(run * PAGE_BYTES);
            for (page, out) in pages[done..done + run]
                .iter()
                .zip(buf.chunks_mut(PAGE_BYTES))
            {
                self.encode_page(page, out);
            }
            let offset = self.geometry.page_offset(first);
            if done == 0 && run == pages.len() {
                return self
                    .dev
                    .write_fua(&buf, offset)
                    .map_err(|e| io_context(&*self.dev, "journal write", offset, e));
            }
            self.dev
                .write_at(&buf, offset)
                .map_err(|e| io_context(&*self.dev, "journal write", offset, e))?;
            done += run;
        }
        let offset = self.geometry.region_offset;
        self.dev
            .flush()
            .map_err(|e| io_context(&*self.dev, "journal flush", offset, e))
    }

    fn encode_page(&self, page: &PendingPage, out: &mut [u8]) {
        assert!(page.used > 0, "only pages with records are written");
        let header = PageHeader {
            seq: page.seq,
            used_bytes: page.used as u16,
            first_record: page.first_record.map_or(NO_RECORD_START, |at| at as u16),
            ..self.stamp
        };
        header.encode(&page.payload[..page.used], out);
        debug_assert_eq!(PageHeader::decode(out), Some(header));
    }

    /// Records, commits and LSNs since the open, for the metrics.
    pub fn stats(&self) -> JournalStats {
        JournalStats {
            records: self.records.load(Ordering::Relaxed),
            commits: self.commits.load(Ordering::Relaxed),
            appended_lsn: self.appended_lsn(),
            durable_lsn: self.durable_lsn(),
        }
    }

    /// The end LSN of the last record the open found: every record a writer before this
    /// open appended with an end LSN above it was lost (the log's durable records are a
    /// prefix), so a record's end LSN tells whether it survived that writer.
    pub fn opened_end(&self) -> Lsn {
        self.opened_end
    }

    /// The highest LSN known to be on stable storage.
    pub fn durable_lsn(&self) -> Lsn {
        self.durable.load(Ordering::Acquire)
    }

    /// The end LSN of the last record appended.
    pub fn appended_lsn(&self) -> Lsn {
        self.appended.load(Ordering::Acquire)
    }

    /// A checkpoint made every record with end LSN <= `lsn` unnecessary: their space may be
    /// reused. The tail never moves back, nor beyond the appended records. `lsn` should be
    /// durable and is what the checkpoint records as the next `replay_from`.
    pub fn set_tail(&self, lsn: Lsn) {
        let mut state = self.state.lock();
        let lsn = lsn.min(state.appended_lsn);
        state.tail_lsn = state.tail_lsn.max(lsn);
    }

    /// Bytes from the tail to the append point, counting whole pages (headers, padding).
    pub fn used_bytes(&self) -> u64 {
        let state = self.state.lock();
        let pages = state.end_seq().saturating_sub(page_of(state.tail_lsn));
        pages * PAGE_BYTES as u64
    }

    /// Bytes of the circular page array.
    pub fn capacity_bytes(&self) -> u64 {
        self.geometry.capacity_bytes()
    }

    /// The largest record payload: a quarter of the log's record capacity.
    pub fn max_record_bytes(&self) -> usize {
        self.geometry.max_record_bytes()
    }
}
