//! Write-behind: small writes of a file gathered in the daemon's memory and written to the
//! disks as whole blocks (GPFS's pagepool), for a mount whose kernel passes every write
//! straight to the daemon.
//!
//! Why: a write that ends inside a 4 KiB sector another write filled part of rewrites that
//! sector in place, and an in-place rewrite commits the sector's checksum intent before
//! its data (see `data.rs`): 1 KiB appends written one by one cost a log commit each
//! (3 MiB/s), 4 KiB writes a block-map update and a drive write each (60 MiB/s). The
//! kernel's writeback cache hides that, but copies every byte twice (into the page cache,
//! then to the daemon), which held four 1 MiB writers on one node to 0.5 of XFS; writes
//! passed straight to the daemon reach 1.4 times that. Gathering small writes here keeps
//! both: small writes are gathered, large ones are copied once and handed off.
//!
//! Large writes (and the whole blocks runs come to cover) are handed to the mount's
//! landing threads, which write them while the writer goes on. Before, one process writing
//! 1 MiB pieces kept one write at the disks at a time, each waiting for the one before:
//! 1653-2020 MB/s on one node, 3059-3172 handed off (four writers: 3020-3224 and
//! 2402-3458; bench/RESULTS.md). Bytes handed off stay in the file's `in_flight`
//! until they land; nothing gathered or handed off overlaps them (a write over them waits
//! for them), so the landing threads may write a file's ranges in any order. Everything
//! below that writes what is gathered first waits for what was handed off before it to
//! land, and a failure of a write handed off is kept as a gathered write's is.
//!
//! What is gathered: runs of contiguous bytes per file (up to [`RUNS_MAX`]), each started
//! by a write smaller than [`GATHER_BELOW`] and grown by the writes that continue or
//! overlap it (sequential writers, appends (O_APPEND on a cluster's node too: the end an
//! append is written at includes what this node gathered and, on the file's owner, what
//! another node gathered, taken back first: `FileSystem::append`), mmap
//! writeback, a database's page rewrites).
//! A write over gathered bytes replaces them in memory, so they reach the disks once, in
//! their last version. Whole blocks are handed off as soon as a run covers them. A large
//! write that touches no run is handed off (written at once where the file may not be
//! gathered); one that touches a run joins it, so that nothing gathered can later land
//! over it.
//!
//! When gathered bytes reach the disks: when a run covers a block; before a synchronous
//! write of the file, any read of it, a truncate, a `setattr` and a `fallocate`; at `fsync` (then they are durable), at close (`FUSE_FLUSH`: a failure is that
//! close's error) and at the file's last release; every [`COMMIT_INTERVAL`] by the
//! background flusher (so nothing stays in memory longer than a few seconds); at unmount;
//! and when all files together hold [`GATHERED_MAX`] (then writes go straight through, or a
//! large write waits for one of its file's writes to land).
//! A failure outside a write, fsync or close (the background flusher, a read) is kept and
//! returned by the file's next write, fsync or close, and logged with the file's inode, as
//! the kernel reports a failed writeback. What was not yet written is lost by a crash, as
//! the page cache's dirty pages are; `fsync`, `O_SYNC`, `O_DSYNC` and `O_DIRECT` writes keep
//! their guarantees (they write what was gathered first).
//!
//! Sizes and times: `stat`, lookups and `link` on this node report the size the gathered bytes
//! reach and the time of the last write gathered (`FileSystem::with_gathered`), and the
//! write that finally carries them stamps the file's mtime and ctime with that time, not
//! its own (`WRITE_TIME`).
//!
//! Where: a mount no other node mounts beside gathers the writes of every file
//! ([`FileSystem::set_write_behind`]). On a cluster's nodes a mount gathers the writes of
//! the files its own metanode serves, while no other node holds anything of them: no
//! views or attributes under read tokens, no data token, and no request about the file
//! from another node in the last [`REMOTE_QUIET`] ([`FileSystem::set_write_behind_owned`]).
//! Before the owner answers another node's request about such a file (a view, its
//! attributes, a data token, an update, a lookup that leads to it), it writes what it
//! gathered (`FileSystem::before_remote_request`), so the answer includes every write
//! that returned; that request's read token or data token then keeps further writes
//! going straight through until it is revoked.
//!
//! A node that writes a file another node serves gathers under the file's kept data token
//! (`locks.rs`, `KeptToken`), once the owner let it (`MetanodeRequest::Gather`, asked at
//! the second small write under the token; a file written once and closed, as mdtest's,
//! never asks). The owner marks the file as gathered by that node, takes back what other
//! nodes held of it under read tokens, drops what its own kernel cached of it, and grants
//! nobody else a read token of it while the mark stands. Before the owner answers anyone
//! else about the file (the requests above, and its own node's reads, `stat`s and
//! lookups) it takes the data token back (`GiveBackData`); the gathering node stops
//! gathering, writes what it gathered while the token is still its own, and only then gives
//! it back. So every read anywhere that starts after a gathered write returned finds it.
//! The mark travels with the token to a new owner at a takeover (`GATHERING_PID`).
//!
//! [`COMMIT_INTERVAL`]: crate::fs::COMMIT_INTERVAL

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Condvar, Mutex, MutexGuard};
use tessera_drive::AlignedBuf;

use crate::error::{FsError, FsResult};
use crate::fs::FileSystem;
use crate::inode::{Attr, Ino, Timestamp};

/// Writes smaller than this start a run of gathered bytes; larger ones go to the disks as
/// they come (gathering them would only add a copy).
pub(crate) const GATHER_BELOW: usize = 256 << 10;

/// Gathered bytes of all files together, at most: past it a file's runs are written before
/// its next write is gathered.
pub(crate) const GATHERED_MAX: u64 = 256 << 20;

/// Runs one file may hold, at most: past it they are written before the next is started
/// (each run costs a write and a block-map update of its own when it is written). 1,024
/// made random 4 KiB rewrites slower than 256 (12.6-12.8k against 13.9-14.1k IOPS: longer
/// stalls, no fewer commits).
pub(crate) const RUNS_MAX: usize = 256;

/// How long after another node asked about a file this mount serves its writes go
/// straight through: that node is reading or writing it too.
const REMOTE_QUIET: std::time::Duration = std::time::Duration::from_secs(1);

/// Files remembered as asked about by other nodes, at most (older ones are forgotten).
const ASKED_REMOTELY_MAX: usize = 65_536;

/// Threads that write what writers handed off ([`Landing`]): large writes and the whole
/// blocks runs come to cover. Four keep a block of each of several files, or four blocks
/// of one file, on their way to the disks while the writers go on.
const LANDING_THREADS: usize = 4;
/// How often an idle landing thread looks whether its file system is gone (dropped without
/// an unmount, as tests do).
const LANDING_IDLE_CHECK: std::time::Duration = std::time::Duration::from_secs(1);
/// Bytes handed off and not yet landed, at most, over all files of the mount: enough to
/// keep every landing thread busy with one write and one queued behind it. Their copy
/// buffers are kept for the next writes, so a steady writer allocates nothing: with
/// everything gathered (256 MiB) in flight, each write allocated and zeroed a fresh
/// buffer, and four 1 MiB writers ran at 0.57 of writing themselves.
const LANDING_BYTES_MAX: u64 = 32 << 20;
/// How often the free space that decides whether large writes are handed off is asked for
/// again (`statfs`: a request to the manager on a client's mount).
const SPACE_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// Free space kept beyond twice what is gathered and handed off: nearer to full, large
/// writes are written by their writers, so that ENOSPC reaches the write that met it
/// rather than the next one or fsync.
const SPACE_MARGIN: u64 = 64 << 20;

/// A file's runs are written by several threads from this many on ([`FLUSH_THREADS`]).
const FLUSH_THREADS_FROM: usize = 8;
const FLUSH_THREADS: usize = 8;

std::thread_local! {
    /// The time a flush of gathered bytes stamps as the file's mtime and ctime: when the
    /// last of those writes was made, not when they reached the disks. Read by the
    /// file's update (`FileUpdate::written`) on this thread, which carries it to the
    /// owner.
    pub(crate) static WRITE_TIME: std::cell::Cell<Option<Timestamp>> =
        const { std::cell::Cell::new(None) };
}

/// The gathered bytes of every file of one mount.
#[derive(Default)]
pub(crate) struct WriteBehind {
    /// Every file's small writes are gathered (a mount no other node mounts beside).
    on: AtomicBool,
    /// The small writes of the files this mount's metanode serves are gathered while no
    /// other node holds anything of them (a mount of a cluster's node).
    owned: AtomicBool,
    /// When another node last asked about each file this mount serves: such a file is
    /// not gathered for [`REMOTE_QUIET`] after (see [`FileSystem::before_remote_request`]).
    asked_remotely: Mutex<HashMap<Ino, std::time::Instant>>,
    files: Mutex<HashMap<Ino, Arc<Mutex<Gathered>>>>,
    /// Bytes held by all files' runs and by the writes handed off and not yet landed.
    bytes: AtomicU64,
    /// The threads that write what writers handed off; none until the mount starts them.
    landing: Landing,
    /// Bytes handed off since the mount (large writes and whole blocks of runs).
    handed_total: AtomicU64,
    /// The file system's free bytes when last asked, when, and `handed_total` then.
    space: Mutex<Option<(std::time::Instant, u64, u64)>>,
}

/// Writes handed off to the landing threads, oldest first, and the threads themselves.
#[derive(Default)]
struct Landing {
    queue: Arc<LandingQueue>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    running: AtomicBool,
    /// Buffers of writes that landed, for the next copies: no allocation and no zeroing
    /// per write.
    free: Mutex<Vec<AlignedBuf>>,
    /// Bytes handed off and not yet landed ([`LANDING_BYTES_MAX`]).
    bytes: AtomicU64,
}

impl Landing {
    /// A buffer holding a copy of `data` (the caller's buffer is the kernel's request).
    fn copy(&self, data: &[u8]) -> AlignedBuf {
        let kept = {
            let mut free = self.free.lock();
            free.iter()
                .position(|b| b.len() >= data.len())
                .map(|i| free.swap_remove(i))
        };
        let mut buf = kept.unwrap_or_else(|| AlignedBuf::for_io(data.len()));
        buf[..data.len()].copy_from_slice(data);
        buf
    }

    fn recycle(&self, data: HandedData) {
        let HandedData::Copy(buf) = data else {
            return;
        };
        let mut free = self.free.lock();
        let kept: usize = free.iter().map(|b| b.len()).sum();
        if (kept + buf.len()) as u64 <= LANDING_BYTES_MAX {
            free.push(buf);
        }
    }

    /// Whether `len` more bytes may be handed off now.
    fn has_room(&self, len: usize) -> bool {
        self.bytes.load(Ordering::Relaxed) + len as u64 <= LANDING_BYTES_MAX
    }
}

#[derive(Default)]
struct LandingQueue {
    /// The writes waiting for a thread, and whether the threads are to stop.
    jobs: Mutex<(VecDeque<Handed>, bool)>,
    ready: Condvar,
}

/// The bytes handed off: a copy of a large write (the caller's buffer is the kernel's
/// request), or a run's whole blocks, which the run gave up.
enum HandedData {
    Copy(AlignedBuf),
    Run(Vec<u8>),
}

impl HandedData {
    fn bytes(&self) -> &[u8] {
        match self {
            HandedData::Copy(buf) => buf,
            HandedData::Run(run) => run,
        }
    }
}

/// Bytes of a file a writer handed off: they are written by a landing thread, which then
/// takes their range out of the file's `in_flight`.
struct Handed {
    ino: Ino,
    offset: u64,
    data: HandedData,
    len: usize,
    /// When the write that made them was made (the file's mtime when they land).
    at: Timestamp,
    file: Arc<Mutex<Gathered>>,
    /// Its number in the file's `in_flight`.
    seq: u64,
}

/// One file's gathered bytes: runs by the file offset they start at, none overlapping or
/// touching another.
struct Gathered {
    runs: BTreeMap<u64, Vec<u8>>,
    /// When the last write gathered here was made.
    at: Timestamp,
    /// Taken out of the table: whoever waited for it looks the file up again.
    gone: bool,
    /// A write of gathered bytes that failed where no caller could be told.
    failed: Option<FsError>,
    /// Byte ranges handed to the landing threads and not yet on the disks (their block
    /// maps not yet updated).
    /// Byte ranges handed to the landing threads and not yet on the disks, with the number
    /// each was handed off under.
    in_flight: Vec<(u64, u64, u64)>,
    /// The number the next hand-off gets.
    next_seq: u64,
    /// Signalled each time a range of `in_flight` lands.
    landed: Arc<Condvar>,
}

impl Gathered {
    fn new(at: Timestamp) -> Gathered {
        Gathered {
            runs: BTreeMap::new(),
            at,
            gone: false,
            failed: None,
            in_flight: Vec::new(),
            next_seq: 0,
            landed: Arc::new(Condvar::new()),
        }
    }

    /// Where the last run or write in flight ends: the size the file has at least.
    fn end(&self) -> Option<u64> {
        let runs = self
            .runs
            .last_key_value()
            .map(|(start, data)| start + data.len() as u64);
        let flying = self.in_flight.iter().map(|r| r.1).max();
        runs.max(flying)
    }

    /// Whether `offset..end` overlaps a range in flight.
    fn overlaps_in_flight(&self, offset: u64, end: u64) -> bool {
        self.in_flight.iter().any(|r| r.0 < end && offset < r.1)
    }

    /// Notes `start..end` as handed off; returns its number.
    fn hand_off(&mut self, start: u64, end: u64) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.in_flight.push((start, end, seq));
        seq
    }

    /// Takes hand-off `seq` out of the writes in flight.
    fn land(&mut self, seq: u64) {
        if let Some(i) = self.in_flight.iter().position(|r| r.2 == seq) {
            self.in_flight.swap_remove(i);
        }
    }

    /// Whether nothing is gathered or in flight.
    fn is_idle(&self) -> bool {
        self.runs.is_empty() && self.in_flight.is_empty()
    }

    /// Whether `offset..end` overlaps or touches a run.
    fn touches(&self, offset: u64, end: u64) -> bool {
        self.runs
            .range(..=end)
            .next_back()
            .is_some_and(|(start, data)| start + data.len() as u64 >= offset)
    }

    /// Puts `data` at `offset` into the runs: it extends the run it continues in place, or
    /// joins every run it overlaps or touches into one. Returns the start of its run and the
    /// bytes added to the gathered total.
    fn put(&mut self, offset: u64, data: &[u8]) -> (u64, u64) {
        let end = offset + data.len() as u64;
        // The common case, a write that continues a run and reaches no other.
        if let Some((&start, run)) = self.runs.range_mut(..=offset).next_back() {
            let run_end = start + run.len() as u64;
            let next_clear = self
                .runs
                .range(offset + 1..)
                .next()
                .is_none_or(|(next, _)| *next > end);
            if run_end == offset && next_clear {
                let run = self.runs.get_mut(&start).expect("run just found");
                run.extend_from_slice(data);
                return (start, data.len() as u64);
            }
        }
        let joined: Vec<u64> = self
            .runs
            .range(..=end)
            .rev()
            .take_while(|(start, run)| **start + run.len() as u64 >= offset)
            .map(|(start, _)| *start)
            .collect();
        let mut first = offset;
        let mut last = end;
        for start in &joined {
            let len = self.runs[start].len() as u64;
            first = first.min(*start);
            last = last.max(start + len);
        }
        let mut merged = vec![0u8; (last - first) as usize];
        let mut before = 0u64;
        for start in joined {
            let run = self.runs.remove(&start).expect("run just found");
            before += run.len() as u64;
            let at = (start - first) as usize;
            merged[at..at + run.len()].copy_from_slice(&run);
        }
        let at = (offset - first) as usize;
        merged[at..at + data.len()].copy_from_slice(data);
        let added = merged.len() as u64 - before;
        self.runs.insert(first, merged);
        (first, added)
    }
}

/// Waits until every range of the file handed to the landing threads before this call has
/// landed; the file's lock is let go meanwhile (a landing thread takes it to say so).
/// Ranges handed off meanwhile are not waited for: a writer that keeps writing would keep
/// an fsync, the background flusher or another node's request waiting for as long.
fn wait_landed(file: &mut MutexGuard<'_, Gathered>) {
    let before = file.next_seq;
    while file.in_flight.iter().any(|r| r.2 < before) {
        wait_a_landing(file);
    }
}

/// Waits until a range of the file in flight lands (or the file changes otherwise); the
/// file's lock is let go meanwhile.
fn wait_a_landing(file: &mut MutexGuard<'_, Gathered>) {
    let landed = Arc::clone(&file.landed);
    landed.wait(file);
}

impl WriteBehind {
    fn active(&self) -> bool {
        self.on.load(Ordering::Relaxed) || self.owned.load(Ordering::Relaxed)
    }

    fn gathered(&self, ino: Ino) -> Option<Arc<Mutex<Gathered>>> {
        if !self.active() {
            return None;
        }
        self.files.lock().get(&ino).cloned()
    }

    fn has_room(&self, len: usize) -> bool {
        self.bytes.load(Ordering::Relaxed) + len as u64 <= GATHERED_MAX
    }

    /// Starts the landing threads; they hold the file system only while writing.
    pub(crate) fn start_landing(&self, fs: Weak<FileSystem>) {
        let mut threads = self.landing.threads.lock();
        for i in 0..LANDING_THREADS {
            let fs = fs.clone();
            let queue = Arc::clone(&self.landing.queue);
            let h = std::thread::Builder::new()
                .name(format!("tessera-land-{i}"))
                .spawn(move || land(fs, queue))
                .expect("spawn write-behind landing thread");
            threads.push(h);
        }
        self.landing.running.store(true, Ordering::Release);
    }

    /// Stops the landing threads once they have written what is queued (unmount, after
    /// every file's gathered bytes were written), or at once, failing what is still queued
    /// (a fence: this node may no longer write).
    pub(crate) fn stop_landing(&self, now: bool) {
        self.landing.running.store(false, Ordering::Release);
        let dropped: Vec<Handed> = {
            let mut jobs = self.landing.queue.jobs.lock();
            jobs.1 = true;
            if now {
                jobs.0.drain(..).collect()
            } else {
                Vec::new()
            }
        };
        self.landing.queue.ready.notify_all();
        for handed in dropped {
            self.bytes.fetch_sub(handed.len as u64, Ordering::Relaxed);
            self.landing
                .bytes
                .fetch_sub(handed.len as u64, Ordering::Relaxed);
            let (file, seq, _) = handed.land_parts();
            Handed::landed(&file, seq, Err(FsError::Fenced));
        }
        let me = std::thread::current().id();
        for h in self.landing.threads.lock().drain(..) {
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
    }

    /// Hands `handed` to a landing thread; gives it back when none runs (the caller then
    /// writes it itself).
    fn hand_off(&self, handed: Handed) -> Result<(), Handed> {
        if !self.landing.running.load(Ordering::Acquire) {
            return Err(handed);
        }
        let queue = &self.landing.queue;
        let mut jobs = queue.jobs.lock();
        if jobs.1 {
            return Err(handed);
        }
        self.handed_total
            .fetch_add(handed.len as u64, Ordering::Relaxed);
        self.landing
            .bytes
            .fetch_add(handed.len as u64, Ordering::Relaxed);
        jobs.0.push_back(handed);
        drop(jobs);
        queue.ready.notify_one();
        Ok(())
    }

    /// Whether `len` more bytes may be handed off: the free space (asked for at most every
    /// [`SPACE_CHECK_EVERY`], less what was handed off since) leaves room for twice what is
    /// gathered and in flight with them, and [`SPACE_MARGIN`] more.
    fn roomy(&self, len: usize, free_now: impl FnOnce() -> u64) -> bool {
        if !self.has_room(len) || !self.landing.has_room(len) {
            return false;
        }
        let handed = self.handed_total.load(Ordering::Relaxed);
        let mut space = self.space.lock();
        let (_, free, handed_then) = match *space {
            Some(s) if s.0.elapsed() < SPACE_CHECK_EVERY => s,
            _ => {
                let s = (std::time::Instant::now(), free_now(), handed);
                *space = Some(s);
                s
            }
        };
        let free = free.saturating_sub(handed.saturating_sub(handed_then));
        let pending = self.bytes.load(Ordering::Relaxed) + len as u64;
        free > pending.saturating_mul(2) + SPACE_MARGIN
    }
}

/// A landing thread: writes what writers handed off until the mount stops it. It holds the
/// file system only while writing.
fn land(fs: Weak<FileSystem>, queue: Arc<LandingQueue>) {
    loop {
        let handed = {
            let mut jobs = queue.jobs.lock();
            loop {
                if let Some(h) = jobs.0.pop_front() {
                    break h;
                }
                if jobs.1 || fs.strong_count() == 0 {
                    return;
                }
                queue.ready.wait_for(&mut jobs, LANDING_IDLE_CHECK);
            }
        };
        let mounted = fs.upgrade();
        let result = match &mounted {
            Some(fs) => {
                let data = &handed.data.bytes()[..handed.len];
                let r = fs.write_gathered(handed.ino, handed.offset, data, handed.at);
                let wb = &fs.write_behind;
                wb.bytes.fetch_sub(handed.len as u64, Ordering::Relaxed);
                wb.landing
                    .bytes
                    .fetch_sub(handed.len as u64, Ordering::Relaxed);
                r
            }
            None => Err(FsError::Io(std::io::Error::other(
                "the file system was unmounted before these bytes were written",
            ))),
        };
        let (file, seq, data) = handed.land_parts();
        Handed::landed(&file, seq, result);
        if let Some(fs) = mounted {
            fs.write_behind.landing.recycle(data);
        }
    }
}

impl Handed {
    fn land_parts(self) -> (Arc<Mutex<Gathered>>, u64, HandedData) {
        (self.file, self.seq, self.data)
    }

    /// Takes hand-off `seq` out of the file's writes in flight, keeps a failure for the
    /// file's next write, fsync or close, and wakes whoever waits for the file.
    fn landed(file: &Mutex<Gathered>, seq: u64, result: FsResult<()>) {
        let mut file = file.lock();
        file.land(seq);
        if let Err(e) = result {
            file.failed.get_or_insert(e);
        }
        file.landed.notify_all();
    }
}

impl FileSystem {
    /// Lets this mount gather small writes ([`crate::write_behind`]): for a mount no other
    /// node mounts beside, whose kernel passes writes straight to the daemon.
    pub fn set_write_behind(&self, on: bool) {
        self.write_behind.on.store(on, Ordering::SeqCst);
    }

    /// Lets this mount of a cluster's node gather the small writes of the files its own
    /// metanode serves, while no other node holds anything of them ([`crate::write_behind`]).
    pub fn set_write_behind_owned(&self, on: bool) {
        self.write_behind.owned.store(on, Ordering::SeqCst);
    }

    /// Whether this mount gathers small writes (of every file, or of those it serves).
    pub fn writes_behind(&self) -> bool {
        self.write_behind.active()
    }

    /// Whether a write of `ino` may be gathered now; asked under the file's lock, so that
    /// another node's request, which marks the file before it writes what is gathered
    /// (under that lock), finds every write gathered before it.
    fn may_gather(&self, ino: Ino) -> bool {
        let wb = &self.write_behind;
        if wb.on.load(Ordering::Relaxed) {
            return true;
        }
        if !wb.owned.load(Ordering::Relaxed) {
            return false;
        }
        if !self.serves(ino) {
            // Another node serves it: under a kept data token the owner lets this mount
            // gather under.
            return self.kept_token(ino).is_some_and(|t| t.gathers());
        }
        let owner = self.owner();
        // Another node holds views or attributes of it (they would go stale), or a data
        // token (it writes the file itself: its bytes must land in order with ours).
        if owner.meta.holders.held_by_any(ino)
            || owner
                .locks
                .lock()
                .data_held_by_others(ino, self.lock_client)
        {
            return false;
        }
        wb.asked_remotely
            .lock()
            .get(&ino)
            .is_none_or(|at| at.elapsed() >= REMOTE_QUIET)
    }

    /// Before this owner answers another node's request about a file (its data, size,
    /// attributes, a data token, a name that leads to it): the file is marked as asked
    /// about, and what this mount gathered of it is written, so the answer includes it and
    /// no write is gathered while that node may be reading or writing it.
    /// Another node gathering writes of the file gives them and its data token back
    /// first, unless it is the node asking ([`FileSystem::take_back_gathered`]).
    pub(crate) fn before_remote_request(
        &self,
        request: &crate::metanode_wire::MetanodeRequest,
        origin: crate::locks::Origin,
    ) {
        use crate::metanode_wire::MetanodeRequest as Q;
        let wb = &self.write_behind;
        let owned = wb.owned.load(Ordering::Relaxed);
        let others_gather = self.owner().meta.holders.any_gathering();
        if !owned && !others_gather {
            return;
        }
        let ino = match request {
            Q::Once { request, .. } => return self.before_remote_request(request, origin),
            Q::View { ino, .. }
            | Q::Update { ino, .. }
            | Q::Attr { ino }
            | Q::HeldBytes { ino }
            | Q::AttrBytes { ino }
            | Q::AddName { ino, .. }
            | Q::ChangeAttr { ino, .. }
            | Q::Opened { ino }
            | Q::Gather { ino }
            | Q::Lock { ino, .. } => *ino,
            // The name's lookup is paid only when something is gathered.
            Q::Find { .. } if !others_gather && wb.files.lock().is_empty() => return,
            Q::Find { parent, name } => {
                match crate::metanode::Namespace::find(self, *parent, name) {
                    Ok(attr) => attr.ino,
                    Err(_) => return,
                }
            }
            _ => return,
        };
        if others_gather {
            self.take_back_gathered(ino, Some(origin));
        }
        if !owned {
            return;
        }
        {
            let mut asked = wb.asked_remotely.lock();
            if asked.len() >= ASKED_REMOTELY_MAX {
                asked.retain(|_, at| at.elapsed() < REMOTE_QUIET);
            }
            asked.insert(ino, std::time::Instant::now());
        }
        self.flush_gathered_quietly(ino);
    }

    /// Whether writes of `ino` are gathered and not yet written.
    pub fn has_gathered(&self, ino: Ino) -> bool {
        self.write_behind
            .gathered(ino)
            .is_some_and(|f| !f.lock().is_idle())
    }

    /// Bytes gathered and not yet written, of all files (in memory, or handed off and not
    /// yet landed).
    pub fn gathered_bytes(&self) -> u64 {
        self.write_behind.bytes.load(Ordering::Relaxed)
    }

    /// Whether `len` bytes may be handed to the landing threads: far enough from full
    /// (`WriteBehind::roomy`).
    fn may_hand_off(&self, len: usize) -> bool {
        self.write_behind.roomy(len, || {
            let space = self.statfs();
            space.fragments_free * space.fragment_bytes
        })
    }

    /// Bytes handed to the landing threads since the mount.
    pub fn handed_off_bytes(&self) -> u64 {
        self.write_behind.handed_total.load(Ordering::Relaxed)
    }

    /// Takes a write into the file's gathered runs, or writes it (after what it must
    /// follow): `None` when the file has nothing gathered and the write goes straight
    /// through (the caller writes it).
    pub(crate) fn write_behind(
        &self,
        ino: Ino,
        offset: u64,
        data: &[u8],
        sync: bool,
    ) -> FsResult<Option<usize>> {
        let wb = &self.write_behind;
        if !wb.active() {
            return Ok(None);
        }
        let small = !sync && data.len() < GATHER_BELOW;
        let end = offset + data.len() as u64;
        if !wb.on.load(Ordering::Relaxed) && !self.gathers_elsewhere(ino, small) {
            return Ok(None);
        }
        loop {
            let arc = match wb.gathered(ino) {
                Some(file) => file,
                None => {
                    let lands = !sync && wb.landing.running.load(Ordering::Relaxed);
                    if !(small || lands) || !wb.has_room(data.len()) {
                        return Ok(None);
                    }
                    // Entered empty and decided on under its lock, as every later write.
                    let mut files = wb.files.lock();
                    Arc::clone(
                        files
                            .entry(ino)
                            .or_insert_with(|| Arc::new(Mutex::new(Gathered::new(self.now())))),
                    )
                }
            };
            let mut file = arc.lock();
            if file.gone {
                continue;
            }
            if let Some(e) = file.failed.take() {
                return Err(e);
            }
            // A write that goes straight through writes what was gathered first, then lets
            // the file's lock go before its own write: that write may wait for another
            // node's data token, and that node's next request waits for the lock here
            // (`before_remote_request`). A write gathered meanwhile by another thread
            // runs concurrently with it, and may land before or after, as on any disk.
            if sync {
                self.write_runs(ino, &mut file)?;
                drop(file);
                return self.write_direct(ino, offset, data, true).map(Some);
            }
            // Nothing gathered or handed off overlaps what is in flight, so the landing
            // threads may write in any order: a write over bytes in flight waits for them.
            if file.overlaps_in_flight(offset, end) {
                wait_landed(&mut file);
                continue;
            }
            let touches = file.touches(offset, end);
            let apart = !small && !touches;
            let full = !wb.has_room(data.len()) || !wb.landing.has_room(data.len());
            if apart && full && !file.in_flight.is_empty() {
                // The writer is ahead of the disks: it waits for one of its writes to land.
                wait_a_landing(&mut file);
                continue;
            }
            let may_gather = self.may_gather(ino);
            if apart && may_gather && self.may_hand_off(data.len()) {
                // A large write that touches nothing gathered: copied and handed to a landing
                // thread, and the writer goes on (GPFS's write-behind).
                file.at = self.now();
                let handed = Handed {
                    ino,
                    offset,
                    data: HandedData::Copy(wb.landing.copy(data)),
                    len: data.len(),
                    at: file.at,
                    file: Arc::clone(&arc),
                    seq: file.hand_off(offset, end),
                };
                wb.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                match wb.hand_off(handed) {
                    Ok(()) => return Ok(Some(data.len())),
                    Err(handed) => {
                        // The landing threads stopped (unmount, fence): written here.
                        file.land(handed.seq);
                        wb.bytes.fetch_sub(data.len() as u64, Ordering::Relaxed);
                        wb.landing.recycle(handed.data);
                    }
                }
            }
            if apart || !may_gather {
                self.write_runs(ino, &mut file)?;
                drop(file);
                return self.write_direct(ino, offset, data, false).map(Some);
            }
            let room = wb.has_room(data.len());
            if !room || (!touches && file.runs.len() >= RUNS_MAX) {
                self.write_runs(ino, &mut file)?;
                if !room && !wb.has_room(data.len()) {
                    drop(file);
                    return self.write_direct(ino, offset, data, false).map(Some);
                }
            }
            let (start, added) = file.put(offset, data);
            file.at = self.now();
            wb.bytes.fetch_add(added, Ordering::Relaxed);
            self.write_whole_blocks(ino, &arc, &mut file, start)?;
            return Ok(Some(data.len()));
        }
    }

    /// For a file another node serves: whether its write may be gathered, or must go the
    /// way of one (something of the file is gathered already). Under a kept data token,
    /// the second small write asks the owner to let this mount gather (one round trip,
    /// the cost of one write sent on): a file written by one small write and closed
    /// (mdtest's) never asks.
    fn gathers_elsewhere(&self, ino: Ino, small: bool) -> bool {
        if self.serves(ino) {
            return true;
        }
        if let Some(token) = self.kept_token(ino) {
            if token.gathers() {
                return true;
            }
            if small && token.should_ask_to_gather() {
                match self.routed(ino, |ns| ns.gather(ino, None)) {
                    Ok(true) => {
                        if token.start_gathering() {
                            return true;
                        }
                    }
                    Ok(false) => {}
                    Err(e) => tracing::debug!("inode {ino}: asking to gather writes: {e}"),
                }
            }
        }
        self.write_behind.gathered(ino).is_some()
    }

    /// Whether nothing of `ino` is gathered now, as far as can be told without waiting
    /// (a kept token's eviction asks, holding locks a gathering write takes after the
    /// file's runs): a file whose runs are busy counts as not idle.
    pub(crate) fn gathered_idle(&self, ino: Ino) -> bool {
        let Some(files) = self.write_behind.files.try_lock() else {
            return false;
        };
        let Some(file) = files.get(&ino) else {
            return true;
        };
        file.try_lock().is_some_and(|f| f.is_idle())
    }

    /// Owner: lets the node of `origin`, which keeps the data token of `ino`, gather small
    /// writes of it in its memory (see the module comment). The file is marked, the other
    /// nodes holding it under read tokens drop it, and this node's kernel drops what it
    /// cached of it, before the answer goes back. False when the node keeps no data token of
    /// the file (taken back meanwhile), or this owner cannot take tokens back.
    pub(crate) fn grant_gather(
        &self,
        ino: Ino,
        origin: Option<crate::locks::Origin>,
    ) -> FsResult<bool> {
        let Some(node) = origin else {
            return Ok(false);
        };
        let owner = self.owner();
        let (Some(revoke), Some(_)) = (owner.meta.holders.revoke.get(), owner.data_revoke.get())
        else {
            return Ok(false);
        };
        if !owner.locks.lock().mark_gathering(ino, node) {
            return Ok(false);
        }
        let others = owner.meta.holders.start_gathering(ino, node);
        for other in others {
            revoke(other, vec![ino]);
        }
        if let Some(notify) = self.remote_change.get() {
            notify(vec![crate::CacheChange::Inode(ino)]);
        }
        Ok(true)
    }

    /// Owner: if a node other than `except` may have gathered writes of `ino`, takes its
    /// data token back (`GiveBackData`: it writes what it gathered first), so that what
    /// is read of the file next includes them. Called holding no lock.
    pub(crate) fn take_back_gathered(&self, ino: Ino, except: Option<crate::locks::Origin>) {
        if !self.is_owner() {
            return;
        }
        let owner = self.owner();
        if !owner.meta.holders.any_gathering() {
            return;
        }
        let Some(revoke) = owner.data_revoke.get() else {
            return;
        };
        let mut table = owner.locks.lock();
        loop {
            let Some((lock, from)) = table.gatherer(ino) else {
                drop(table);
                owner.meta.holders.stop_gathering(ino);
                return;
            };
            if Some(from) == except {
                return;
            }
            if table.start_revoking(ino) {
                parking_lot::MutexGuard::unlocked(&mut table, || revoke(from, vec![ino]));
                table.end_revoking(ino, lock.holder);
                owner.lock_released.notify_all();
                continue;
            }
            // Another request is taking it back: that one's end wakes this.
            owner
                .lock_released
                .wait_for(&mut table, crate::locks::OWNER_WAIT);
        }
    }

    /// Owner: whether `node` is marked as gathering writes of `ino` now.
    pub(crate) fn gathered_by(&self, ino: Ino, node: crate::locks::Origin) -> bool {
        let owner = self.owner();
        owner.meta.holders.any_gathering()
            && owner
                .locks
                .lock()
                .gatherer(ino)
                .is_some_and(|(_, from)| from == node)
    }

    /// Before this node reads `ino` for its own kernel or processes: another node's gathered
    /// writes of it come back first ([`Self::take_back_gathered`]), then this mount's own.
    pub(crate) fn settle_gathered(&self, ino: Ino) {
        self.take_back_gathered(ino, None);
        self.flush_gathered_quietly(ino);
    }

    /// Whether attributes of `ino` just read may be behind writes gathered here or on
    /// another node (then they are read again through [`FileSystem::getattr`]).
    pub(crate) fn attrs_may_lag(&self, ino: Ino) -> bool {
        self.write_behind.gathered(ino).is_some()
            || (self.is_owner() && self.owner().meta.holders.any_gathering())
    }

    /// Writes the whole blocks the run at `start` covers (from its start to the last block
    /// boundary inside it) and keeps the rest as a run.
    fn write_whole_blocks(
        &self,
        ino: Ino,
        arc: &Arc<Mutex<Gathered>>,
        file: &mut Gathered,
        start: u64,
    ) -> FsResult<()> {
        let bs = self.geo.block_bytes;
        let len = file.runs[&start].len() as u64;
        let cut = (start + len) / bs * bs;
        if cut <= start || len < bs {
            return Ok(());
        }
        let mut head = file.runs.remove(&start).expect("run just put");
        let rest = head.split_off((cut - start) as usize);
        if !rest.is_empty() {
            file.runs.insert(cut, rest);
        }
        // Near full, written here, so that ENOSPC reaches this write.
        let wb = &self.write_behind;
        if !self.may_hand_off(0) {
            wb.bytes.fetch_sub(head.len() as u64, Ordering::Relaxed);
            return self.write_gathered(ino, start, &head, file.at);
        }
        // Runs never overlap bytes in flight (`write_behind` waits first), so the blocks
        // can land beside the file's other writes in flight.
        // The run's bytes go as they are: no copy.
        let len = head.len();
        let handed = Handed {
            ino,
            offset: start,
            data: HandedData::Run(head),
            len,
            at: file.at,
            file: Arc::clone(arc),
            seq: file.hand_off(start, cut),
        };
        match wb.hand_off(handed) {
            Ok(()) => Ok(()),
            Err(handed) => {
                file.land(handed.seq);
                wb.bytes.fetch_sub(len as u64, Ordering::Relaxed);
                self.write_gathered(ino, start, handed.data.bytes(), file.at)
            }
        }
    }

    /// Writes every run of the file; they are gone afterwards, whatever the outcome. The
    /// first failure is returned, after the other runs were written. Many runs (scattered
    /// rewrites) are written by several threads at once: a rewrite in place waits for its
    /// checksum intent's log commit, and concurrent ones share one (group commit), where
    /// one after another each paid its own.
    fn write_runs(&self, ino: Ino, file: &mut MutexGuard<'_, Gathered>) -> FsResult<()> {
        // What was handed off lands first: everything gathered is then on the disks.
        wait_landed(file);
        let runs: Vec<(u64, Vec<u8>)> = std::mem::take(&mut file.runs).into_iter().collect();
        let bytes: u64 = runs.iter().map(|(_, d)| d.len() as u64).sum();
        self.write_behind.bytes.fetch_sub(bytes, Ordering::Relaxed);
        let at = file.at;
        if runs.len() < FLUSH_THREADS_FROM {
            let mut result = Ok(());
            for (start, data) in &runs {
                let r = self.write_gathered(ino, *start, data, at);
                if result.is_ok() {
                    result = r;
                }
            }
            return result;
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failed: Mutex<Option<FsError>> = Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..FLUSH_THREADS.min(runs.len()) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((start, data)) = runs.get(i) else {
                        return;
                    };
                    if let Err(e) = self.write_gathered(ino, *start, data, at) {
                        failed.lock().get_or_insert(e);
                    }
                });
            }
        });
        match failed.into_inner() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn write_gathered(&self, ino: Ino, start: u64, data: &[u8], at: Timestamp) -> FsResult<()> {
        let before = WRITE_TIME.replace(Some(at));
        let r = self.write_direct(ino, start, data, false);
        WRITE_TIME.set(before);
        if let Err(e) = &r {
            tracing::error!(
                "{}: inode {ino}: writing {} gathered bytes at offset {start} failed: {e}; \
                 they are lost, and the file's next write, fsync or close reports it",
                self.geo.fs_name,
                data.len()
            );
        }
        r.map(|_| ())
    }

    /// Writes what is gathered of `ino`, if anything; the caller hears of a failure (and
    /// of one kept from a write nobody could be told of).
    pub fn flush_gathered(&self, ino: Ino) -> FsResult<()> {
        let Some(file) = self.write_behind.gathered(ino) else {
            return Ok(());
        };
        let mut file = file.lock();
        // Written (and what was handed off landed) first, so that a failure of a write
        // handed off before this call is this call's.
        let written = self.write_runs(ino, &mut file);
        match file.failed.take() {
            Some(e) => Err(e),
            None => written,
        }
    }

    /// [`Self::flush_gathered`] for a caller that cannot report the failure (a read):
    /// kept for the file's next write, fsync or close.
    pub(crate) fn flush_gathered_quietly(&self, ino: Ino) {
        let Some(file) = self.write_behind.gathered(ino) else {
            return;
        };
        let mut file = file.lock();
        if let Err(e) = self.write_runs(ino, &mut file) {
            file.failed.get_or_insert(e);
        }
    }

    /// Writes what every file has gathered (the background flusher, sync, unmount), and
    /// forgets the files that hold nothing and kept no failure.
    pub(crate) fn flush_all_gathered(&self) {
        let files: Vec<(Ino, Arc<Mutex<Gathered>>)> = {
            let files = self.write_behind.files.lock();
            if files.is_empty() {
                return;
            }
            files.iter().map(|(i, f)| (*i, Arc::clone(f))).collect()
        };
        for (ino, file) in files {
            let mut file = file.lock();
            if let Err(e) = self.write_runs(ino, &mut file) {
                file.failed.get_or_insert(e);
            }
        }
        self.write_behind.files.lock().retain(|_, file| {
            let Some(mut file) = file.try_lock() else {
                return true;
            };
            let idle = file.is_idle() && file.failed.is_none();
            file.gone |= idle;
            !idle
        });
    }

    /// The file's last close on this node: what it gathered is written and the file
    /// forgotten here. A failure kept for it is returned (nobody else will hear of it).
    pub(crate) fn release_gathered(&self, ino: Ino) -> FsResult<()> {
        let Some(arc) = self.write_behind.gathered(ino) else {
            return Ok(());
        };
        let mut file = arc.lock();
        let written = self.write_runs(ino, &mut file);
        // Forgotten below: nothing of it may still be in flight, whenever it was handed off.
        while !file.in_flight.is_empty() {
            wait_a_landing(&mut file);
        }
        let r = match file.failed.take() {
            Some(e) => Err(e),
            None => written,
        };
        file.gone = true;
        // Locked after the file (nobody waits for a file holding the table), and only this
        // file's entry is taken out: another may have replaced it meanwhile.
        let mut files = self.write_behind.files.lock();
        if files.get(&ino).is_some_and(|f| Arc::ptr_eq(f, &arc)) {
            files.remove(&ino);
        }
        r
    }

    /// The attributes `read` gives, as this node's writes left them: the size the
    /// gathered bytes reach and the time of the last of them. Read while the file's runs
    /// are held: a write of them takes them out of the runs before its update reaches the
    /// metadata, and attributes read in between would show neither (a size the kernel
    /// would then keep, and reads would stop at).
    pub(crate) fn with_gathered<T>(
        &self,
        ino: Ino,
        read: impl FnOnce() -> FsResult<T>,
        attr: impl FnOnce(&mut T) -> &mut Attr,
    ) -> FsResult<T> {
        let Some(file) = self.write_behind.gathered(ino) else {
            return read();
        };
        let file = file.lock();
        let mut value = read()?;
        if let Some(end) = file.end() {
            let a = attr(&mut value);
            a.size = a.size.max(end);
            a.mtime = file.at;
            a.ctime = file.at;
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn empty() -> Gathered {
        Gathered::new(Timestamp::now())
    }

    proptest! {
        /// Runs hold exactly the newest byte of every offset written, never overlap or
        /// touch, and the total counted is what they hold.
        #[test]
        fn runs_hold_the_newest_bytes(writes in proptest::collection::vec((0u64..4000, 1usize..300), 1..60)) {
            let mut g = empty();
            let mut model: BTreeMap<u64, u8> = BTreeMap::new();
            let mut total = 0u64;
            for (i, (off, len)) in writes.into_iter().enumerate() {
                let data: Vec<u8> = (0..len).map(|k| (i * 31 + k) as u8).collect();
                let (start, added) = g.put(off, &data);
                total += added;
                prop_assert!(g.runs.contains_key(&start));
                for (k, b) in data.iter().enumerate() {
                    model.insert(off + k as u64, *b);
                }
            }
            let mut held = BTreeMap::new();
            let mut last_end = None;
            for (start, run) in &g.runs {
                if let Some(end) = last_end {
                    prop_assert!(*start > end, "runs touch or overlap");
                }
                last_end = Some(start + run.len() as u64);
                for (k, b) in run.iter().enumerate() {
                    held.insert(start + k as u64, *b);
                }
            }
            prop_assert_eq!(held, model);
            prop_assert_eq!(total, g.runs.values().map(|r| r.len() as u64).sum::<u64>());
        }
    }
}
