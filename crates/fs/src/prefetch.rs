//! Sequential read-ahead of whole blocks, like GPFS prefetching into its pagepool.
//!
//! A file's blocks are striped over every NSD of its pool, so a sequential reader can keep
//! every drive busy only if the blocks after the one it is reading are already being read.
//! The kernel's own read-ahead asks for 1 MiB pieces of the next few megabytes, which with
//! 4 MiB blocks lands on one or two drives at a time, and each piece is a separate small
//! drive read (measured: 0.8–1.0 GB/s against 1.6–3.7 GB/s for XFS on the same disk).
//!
//! When a file is read sequentially (its last `SEQUENTIAL_HITS` reads each continued where
//! the previous one ended), the reader's block and the `depth` blocks after it get a
//! [`Slot`]; worker threads read ahead blocks whole, verifying every sector's checksum,
//! and the reader copies its range out of the slot. A reader whose block nobody has started
//! yet reads it itself rather than wait in the queue.
//!
//! A slot is only a hint: before its bytes are used they are compared, sector by sector,
//! with the block map the reader copied under the metadata lock (same extent, same
//! checksum or the same unwritten state), so a block rewritten, truncated or freed since it
//! was read ahead is never served; the reader then reads the block itself. Writes also drop
//! the file's slots so that memory is not held for stale data.
//!
//! Bounds: at most `STREAMS_MAX` files are tracked, and slots (read or in flight) never hold
//! more than `BUDGET_BYTES` in total; past the budget no new read-ahead starts.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use tessera_alloc::Extent;
use tessera_drive::AlignedBuf;

use crate::error::FsResult;
use crate::fs::FileSystem;
use crate::inode::Ino;

/// Worker threads reading ahead; each has one drive read in flight.
const WORKERS: usize = 8;
/// Files whose sequential position is remembered; the least recently read is forgotten.
const STREAMS_MAX: usize = 256;
/// Bytes that slots may hold at once, read or being read.
const BUDGET_BYTES: u64 = 256 << 20;
/// Bytes being read ahead of a sequential reader at once: 4 blocks of 4 MiB, 16 of 1 MiB.
/// Blocks read and not yet used do not count, up to `AHEAD_READY_FACTOR` times as many
/// ahead in all: the window moves on as each block arrives ([`Prefetcher::block_done`]).
const AHEAD_BYTES: u64 = 16 << 20;
/// How far ahead of a reader, in windows of `AHEAD_BYTES`, read-ahead goes at most.
const AHEAD_READY_FACTOR: u64 = 2;
const DEPTH_MIN: u64 = 2;
/// Reads in a row that must follow each other before reading ahead starts: a random reader
/// lands next to its previous read now and then (1 in 64 for 4 KiB reads of a 1 GiB file of
/// 4 MiB blocks), and must not pay for whole blocks it will not read.
const SEQUENTIAL_HITS: u32 = 2;
const DEPTH_MAX: u64 = 16;
/// Free block buffers kept for reuse.
const POOL_BYTES: u64 = 64 << 20;

/// One sector of a block as it was when read: unwritten (zeros), or the checksum its bytes
/// verified against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SectorState {
    Unwritten,
    Crc(u32),
}

/// A block read whole and verified.
pub(crate) struct BlockData {
    pub extent: Extent,
    /// Holds the block's bytes in its first `len` bytes; goes back to the pool when done.
    buf: Option<AlignedBuf>,
    len: usize,
    pub sectors: Vec<SectorState>,
    pool: Arc<BufferPool>,
}

impl BlockData {
    /// Bytes of every sector the extent holds; unwritten sectors are zeros.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf.as_ref().expect("held until drop")[..self.len]
    }
}

impl Drop for BlockData {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.pool.put(buf);
        }
    }
}

/// Whole-block buffers kept for reuse: a fresh one would be zeroed by the kernel only to be
/// overwritten by the drive read at once. They sit on huge pages, so one block is one drive
/// request (see `AlignedBuf::huge`).
struct BufferPool {
    block_bytes: usize,
    free: Mutex<Vec<AlignedBuf>>,
}

impl BufferPool {
    fn get(&self, len: usize) -> AlignedBuf {
        if len <= self.block_bytes {
            if let Some(b) = self.free.lock().pop() {
                return b;
            }
            return AlignedBuf::huge(self.block_bytes);
        }
        AlignedBuf::huge(len)
    }

    fn put(&self, buf: AlignedBuf) {
        let mut free = self.free.lock();
        if buf.len() == self.block_bytes
            && (free.len() as u64) * (self.block_bytes as u64) < POOL_BYTES
        {
            free.push(buf);
        }
    }
}

enum SlotState {
    /// Waiting for a worker; a reader that needs it now takes it over.
    Queued,
    Reading,
    Ready(Arc<BlockData>),
    /// Unmapped, or the read failed: whoever needs the block reads it directly (and gets
    /// the precise error for its own range).
    Failed,
}

pub(crate) struct Slot {
    state: Mutex<SlotState>,
    done: Condvar,
    /// Charged against the budget while the slot exists.
    charge: u64,
    budget: Arc<AtomicU64>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.budget.fetch_sub(self.charge, Ordering::Relaxed);
    }
}

impl Slot {
    /// Queued or being read: not yet ready or failed.
    fn is_pending(&self) -> bool {
        matches!(*self.state.lock(), SlotState::Queued | SlotState::Reading)
    }

    /// Takes the slot over if nobody has started it.
    fn claim(&self) -> bool {
        let mut s = self.state.lock();
        if matches!(*s, SlotState::Queued) {
            *s = SlotState::Reading;
            true
        } else {
            false
        }
    }

    fn finish(&self, r: FsResult<Option<BlockData>>) {
        let state = match r {
            Ok(Some(d)) => SlotState::Ready(Arc::new(d)),
            Ok(None) => SlotState::Failed,
            Err(e) => {
                tracing::debug!("read-ahead failed: {e}");
                SlotState::Failed
            }
        };
        *self.state.lock() = state;
        self.done.notify_all();
    }

    /// The block's data once read; reads it here if no worker has started it.
    pub(crate) fn get(&self, fs: &FileSystem, ino: Ino, block: u64) -> Option<Arc<BlockData>> {
        if self.claim() {
            self.finish(fs.load_block(ino, block));
        }
        let mut s = self.state.lock();
        loop {
            match &*s {
                SlotState::Ready(d) => return Some(Arc::clone(d)),
                SlotState::Failed => return None,
                SlotState::Queued | SlotState::Reading => self.done.wait(&mut s),
            }
        }
    }
}

struct Stream {
    /// Where each sequential reader of the file is, least recently read first dropped.
    cursors: Vec<Cursor>,
    slots: BTreeMap<u64, Arc<Slot>>,
    last_read: Instant,
    /// The file's length in blocks at its last read: read-ahead stops there.
    file_blocks: u64,
}

/// One reader's position in a file. Several processes reading one file each in their own
/// pieces (IOR's shared file: every third 47008-byte piece each) move through the same
/// blocks, but one falls behind the others now and then; with a single position per file
/// its next read looked like a jump, which dropped every slot and started read-ahead over
/// (three such readers on one node read at 46 MiB/s, one reader at 1,300 MiB/s).
#[derive(Clone, Copy)]
struct Cursor {
    /// One past the highest block this reader read.
    next_block: u64,
    /// One past the highest byte this reader read.
    next_byte: u64,
    /// Reads in a row that continued where the previous one ended.
    hits: u32,
    last_read: Instant,
}

impl Cursor {
    /// Whether a read starting at byte `start` continues this reader. The kernel's
    /// read-ahead requests run on several threads and may arrive slightly out of order,
    /// and readers of one file in turn skip each other's pieces, hence the window around
    /// the expected byte; it is bytes, not blocks, so that random small reads, with eight
    /// positions to land near, almost never look like a run (a window of blocks made 4 KiB
    /// random reads start read-ahead of whole blocks often enough to halve their rate).
    fn continued_by(&self, start: u64) -> bool {
        start + CONTINUE_SLACK >= self.next_byte && start <= self.next_byte + CONTINUE_SLACK
    }
}

/// A reader's run counts at most this many reads, so that a few jumps end it.
const HITS_MAX: u32 = 8;
/// How far from where a reader stopped its next read may start and still continue it.
const CONTINUE_SLACK: u64 = 2 << 20;
/// Readers of one file tracked apart.
const CURSORS_PER_FILE: usize = 8;
/// A reader not heard from for this long is forgotten (it no longer holds slots back).
const CURSOR_IDLE: std::time::Duration = std::time::Duration::from_secs(2);

struct Job {
    slot: Arc<Slot>,
    ino: Ino,
    block: u64,
}

struct Queue {
    jobs: Mutex<(VecDeque<Job>, bool)>,
    ready: Condvar,
}

pub(crate) struct Prefetcher {
    streams: Mutex<HashMap<Ino, Stream>>,
    queue: Arc<Queue>,
    budget: Arc<AtomicU64>,
    pool: Arc<BufferPool>,
    block_bytes: u64,
    depth: u64,
    workers: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Prefetcher {
    pub(crate) fn new(block_bytes: u64) -> Prefetcher {
        Prefetcher {
            streams: Mutex::new(HashMap::new()),
            queue: Arc::new(Queue {
                jobs: Mutex::new((VecDeque::new(), false)),
                ready: Condvar::new(),
            }),
            budget: Arc::new(AtomicU64::new(0)),
            pool: Arc::new(BufferPool {
                block_bytes: block_bytes as usize,
                free: Mutex::new(Vec::new()),
            }),
            block_bytes,
            depth: (AHEAD_BYTES / block_bytes).clamp(DEPTH_MIN, DEPTH_MAX),
            workers: Mutex::new(Vec::new()),
        }
    }

    /// Starts the workers; they hold the file system only while reading a block.
    pub(crate) fn start(&self, fs: Weak<FileSystem>) {
        let mut workers = self.workers.lock();
        for i in 0..WORKERS {
            let fs = fs.clone();
            let queue = Arc::clone(&self.queue);
            let h = std::thread::Builder::new()
                .name(format!("tessera-prefetch-{i}"))
                .spawn(move || worker(fs, queue))
                .expect("spawn read-ahead worker");
            workers.push(h);
        }
    }

    /// Stops the workers and waits for them (unmount, fence).
    pub(crate) fn stop(&self) {
        self.signal_stop();
        let me = std::thread::current().id();
        for h in self.workers.lock().drain(..) {
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
        self.streams.lock().clear();
    }

    fn signal_stop(&self) {
        {
            let mut q = self.queue.jobs.lock();
            q.1 = true;
            q.0.clear();
        }
        self.queue.ready.notify_all();
    }

    /// Records a read of blocks `first..=last` of a file of `file_blocks` blocks. For a
    /// sequential reader, returns a slot for each of those blocks and starts reading ahead;
    /// otherwise returns nothing and the reader reads directly.
    pub(crate) fn on_read(
        &self,
        ino: Ino,
        bytes: std::ops::Range<u64>,
        (first, last): (u64, u64),
        file_blocks: u64,
    ) -> Option<Vec<Arc<Slot>>> {
        let mut streams = self.streams.lock();
        if !streams.contains_key(&ino) && streams.len() >= STREAMS_MAX {
            let oldest = streams
                .iter()
                .min_by_key(|(_, s)| s.last_read)
                .map(|(i, _)| *i)
                .expect("not empty");
            streams.remove(&oldest);
        }
        let now = Instant::now();
        let stream = streams.entry(ino).or_insert(Stream {
            cursors: Vec::new(),
            slots: BTreeMap::new(),
            last_read: now,
            file_blocks,
        });
        stream.last_read = now;
        stream.file_blocks = file_blocks;
        stream
            .cursors
            .retain(|c| now.duration_since(c.last_read) < CURSOR_IDLE);
        let Some(i) = stream
            .cursors
            .iter()
            .position(|c| c.continued_by(bytes.start))
        else {
            // A jump: a reader continuing from here may turn out sequential. It counts
            // against every reader's run, so that random reads, which land in some
            // reader's window now and then, never add up to a run of their own.
            for c in &mut stream.cursors {
                c.hits = c.hits.saturating_sub(1);
            }
            if stream.cursors.len() >= CURSORS_PER_FILE {
                stream.cursors.remove(0);
            }
            stream.cursors.push(Cursor {
                next_block: last + 1,
                next_byte: bytes.end,
                hits: 0,
                last_read: now,
            });
            if !stream.cursors.iter().any(|c| c.hits >= SEQUENTIAL_HITS) {
                stream.slots.clear();
            }
            return None;
        };
        let mut cursor = stream.cursors.remove(i);
        cursor.hits = (cursor.hits + 1).min(HITS_MAX);
        cursor.next_block = cursor.next_block.max(last + 1);
        cursor.next_byte = cursor.next_byte.max(bytes.end);
        cursor.last_read = now;
        // Two positions that met are one reader from now on (or readers close enough
        // that one window serves them).
        stream
            .cursors
            .retain(|c| c.next_block.abs_diff(cursor.next_block) > 2);
        stream.cursors.push(cursor);
        if cursor.hits < SEQUENTIAL_HITS {
            return None;
        }
        // Blocks behind every sequential reader are done with (a reader still copying
        // holds its slot).
        let keep_from = stream
            .cursors
            .iter()
            .filter(|c| c.hits >= SEQUENTIAL_HITS)
            .map(|c| c.next_block.saturating_sub(3))
            .fold(first.saturating_sub(1), u64::min);
        stream.slots = stream.slots.split_off(&keep_from);
        let mut mine = Vec::with_capacity((last - first + 1) as usize);
        let mut jobs = Vec::new();
        for block in first..=last {
            let slot = match stream.slots.get(&block) {
                Some(slot) => Arc::clone(slot),
                None => {
                    let slot = self.new_slot();
                    stream.slots.insert(block, Arc::clone(&slot));
                    slot
                }
            };
            mine.push(slot);
        }
        self.extend_window(stream, ino, last, &mut jobs);
        drop(streams);
        self.queue_jobs(jobs);
        Some(mine)
    }

    /// A block read ahead of `ino` finished: each sequential reader's window moves on by
    /// it, at once, not when the reader next reads. Through a server a burst of blocks
    /// read together arrives together, and a reader that sent the next ones only as it
    /// went through them kept the drive idle while they crossed the network and the
    /// network idle while the drive read the next burst (bench/RESULTS.md).
    fn block_done(&self, ino: Ino) {
        let mut jobs = Vec::new();
        {
            let mut streams = self.streams.lock();
            let Some(stream) = streams.get_mut(&ino) else {
                return;
            };
            let readers: Vec<u64> = stream
                .cursors
                .iter()
                .filter(|c| c.hits >= SEQUENTIAL_HITS)
                .map(|c| c.next_block.saturating_sub(1))
                .collect();
            for last in readers {
                self.extend_window(stream, ino, last, &mut jobs);
            }
        }
        self.queue_jobs(jobs);
    }

    /// Slots for the blocks after `last` until `depth` of them are being read (queued or
    /// in flight), and no more than `AHEAD_READY_FACTOR` times that ahead in all.
    fn extend_window(&self, stream: &mut Stream, ino: Ino, last: u64, jobs: &mut Vec<Job>) {
        let end = (last + 1 + AHEAD_READY_FACTOR * self.depth).min(stream.file_blocks);
        let mut reading = 0;
        for block in last + 1..end {
            if reading >= self.depth {
                break;
            }
            if let Some(slot) = stream.slots.get(&block) {
                if slot.is_pending() {
                    reading += 1;
                }
                continue;
            }
            if self.budget.load(Ordering::Relaxed) + self.block_bytes > BUDGET_BYTES {
                break;
            }
            let slot = self.new_slot();
            stream.slots.insert(block, Arc::clone(&slot));
            jobs.push(Job { slot, ino, block });
            reading += 1;
        }
    }

    /// A slot charged against the budget, waiting for a worker or its reader.
    fn new_slot(&self) -> Arc<Slot> {
        self.budget.fetch_add(self.block_bytes, Ordering::Relaxed);
        Arc::new(Slot {
            state: Mutex::new(SlotState::Queued),
            done: Condvar::new(),
            charge: self.block_bytes,
            budget: Arc::clone(&self.budget),
        })
    }

    fn queue_jobs(&self, jobs: Vec<Job>) {
        if !jobs.is_empty() {
            self.queue.jobs.lock().0.extend(jobs);
            self.queue.ready.notify_all();
        }
    }

    /// A buffer of at least `len` bytes whose contents are left over from earlier use.
    pub(crate) fn buffer(&self, len: usize) -> AlignedBuf {
        self.pool.get(len)
    }

    /// Wraps a verified block read into `buf` (its first `len` bytes).
    pub(crate) fn block_data(
        &self,
        extent: Extent,
        buf: AlignedBuf,
        len: usize,
        sectors: Vec<SectorState>,
    ) -> BlockData {
        BlockData {
            extent,
            buf: Some(buf),
            len,
            sectors,
            pool: Arc::clone(&self.pool),
        }
    }

    /// Forgets what was read ahead of `ino` when the returned guard drops: at the end of a
    /// write, truncate or fallocate, whichever way it returns.
    pub(crate) fn invalidate_after(&self, ino: Ino) -> InvalidateAfter<'_> {
        InvalidateAfter {
            prefetch: self,
            ino,
        }
    }

    /// Forgets what was read ahead of a file whose contents or shape changed.
    pub(crate) fn invalidate(&self, ino: Ino) {
        let mut streams = self.streams.lock();
        if let Some(s) = streams.get_mut(&ino) {
            s.slots.clear();
            s.cursors.clear();
        }
    }
}

pub(crate) struct InvalidateAfter<'a> {
    prefetch: &'a Prefetcher,
    ino: Ino,
}

impl Drop for InvalidateAfter<'_> {
    fn drop(&mut self) {
        self.prefetch.invalidate(self.ino);
    }
}

impl Drop for Prefetcher {
    /// A file system dropped without unmount (a test, a failed mount) still ends its
    /// workers; they may hold the last reference, so they are not joined here.
    fn drop(&mut self) {
        self.signal_stop();
    }
}

fn worker(fs: Weak<FileSystem>, queue: Arc<Queue>) {
    loop {
        let job = {
            let mut q = queue.jobs.lock();
            loop {
                if q.1 {
                    return;
                }
                if let Some(j) = q.0.pop_front() {
                    break j;
                }
                queue.ready.wait(&mut q);
            }
        };
        if !job.slot.claim() {
            continue;
        }
        let Some(fs) = fs.upgrade() else {
            job.slot.finish(Ok(None));
            return;
        };
        job.slot.finish(fs.load_block(job.ino, job.block));
        fs.prefetch.block_done(job.ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: u64 = 4 << 20;

    /// How many of `reads` (offset, length) were served from read-ahead slots.
    fn served(p: &Prefetcher, reads: &[(u64, u64)], file_blocks: u64) -> usize {
        reads
            .iter()
            .filter(|(at, len)| {
                let blocks = (at / BLOCK, (at + len - 1) / BLOCK);
                p.on_read(7, *at..at + len, blocks, file_blocks).is_some()
            })
            .count()
    }

    #[test]
    fn readers_of_one_file_in_turn_keep_their_read_ahead_when_one_falls_behind() {
        // Three readers of every third 47008-byte piece, one of them four blocks behind
        // the others for a while: each read still continues some reader's run.
        let p = Prefetcher::new(BLOCK);
        let piece = 47_008u64;
        let mut reads = Vec::new();
        for i in 0..3_000u64 {
            for r in 0..3u64 {
                let lag = if r == 2 && (600..1_200).contains(&i) {
                    350
                } else {
                    0
                };
                let at = ((i - lag.min(i)) * 3 + r) * piece;
                reads.push((at, piece));
            }
        }
        let hits = served(&p, &reads, 200);
        assert!(
            hits * 100 >= reads.len() * 95,
            "only {hits} of {} reads served from read-ahead",
            reads.len()
        );
    }

    /// The blocks queued for the workers, taken off the queue.
    fn take_jobs(p: &Prefetcher) -> Vec<Job> {
        p.queue.jobs.lock().0.drain(..).collect()
    }

    #[test]
    fn finished_blocks_move_the_window_on_before_the_reader_does() {
        let p = Prefetcher::new(BLOCK);
        assert_eq!(p.depth, 4);
        let mib = 1u64 << 20;
        // A sequential reader in block 0: blocks 1-4 are read ahead.
        assert_eq!(served(&p, &[(0, mib), (mib, mib), (2 * mib, mib)], 100), 1);
        let first: Vec<u64> = take_jobs(&p).iter().map(|j| j.block).collect();
        assert_eq!(first, [1, 2, 3, 4]);
        // Two of them arrive while the reader is still in block 0: two more go out at once.
        let finish = |jobs: &[Job]| {
            for j in jobs {
                assert!(j.slot.claim());
                j.slot.finish(Ok(None));
            }
        };
        let mut jobs = take_jobs(&p);
        assert!(jobs.is_empty());
        let ahead: Vec<Arc<Slot>> = (1..=4)
            .map(|b| Arc::clone(&p.streams.lock()[&7].slots[&b]))
            .collect();
        for slot in &ahead[..2] {
            assert!(slot.claim());
            slot.finish(Ok(None));
        }
        p.block_done(7);
        jobs.extend(take_jobs(&p));
        assert_eq!(jobs.iter().map(|j| j.block).collect::<Vec<_>>(), [5, 6]);
        // Every one of them arrives: the window stops at twice its depth ahead (block 8).
        for slot in &ahead[2..] {
            assert!(slot.claim());
            slot.finish(Ok(None));
        }
        finish(&jobs);
        p.block_done(7);
        let more = take_jobs(&p);
        assert_eq!(more.iter().map(|j| j.block).collect::<Vec<_>>(), [7, 8]);
        finish(&more);
        p.block_done(7);
        assert!(take_jobs(&p).is_empty());
        // The reader moves into block 1: one block further.
        assert_eq!(served(&p, &[(3 * mib, mib), (4 * mib, mib)], 100), 2);
        assert_eq!(
            take_jobs(&p).iter().map(|j| j.block).collect::<Vec<_>>(),
            [9]
        );
    }

    #[test]
    fn random_reads_start_no_read_ahead() {
        let p = Prefetcher::new(BLOCK);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let reads: Vec<(u64, u64)> = (0..5_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // 4 KiB reads anywhere in a 1 GiB file.
                ((x % (256 * BLOCK)) & !4095, 4096)
            })
            .collect();
        let hits = served(&p, &reads, 256);
        assert!(
            hits * 1000 <= reads.len(),
            "{hits} of {} random reads started read-ahead",
            reads.len()
        );
    }
}
