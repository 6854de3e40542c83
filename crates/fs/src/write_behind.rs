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
//! both: large writes go to the disks as they come, small ones are gathered.
//!
//! What is gathered: runs of contiguous bytes per file (up to [`RUNS_MAX`]), each started
//! by a write smaller than [`GATHER_BELOW`] and grown by the writes that continue or
//! overlap it (sequential writers, appends (O_APPEND on a cluster's node too: the end an
//! append is written at includes what this node gathered and, on the file's owner, what
//! another node gathered, taken back first: `FileSystem::append`), mmap
//! writeback, a database's page rewrites).
//! A write over gathered bytes replaces them in memory, so they reach the disks once, in
//! their last version. Whole blocks are written as soon as a run covers them. A large write
//! that touches no run goes to the disks at once; one that touches a run joins it, so that
//! nothing gathered can later land over it.
//!
//! When gathered bytes reach the disks: when a run covers a block; before a synchronous
//! write of the file, any read of it, a truncate, a `setattr` and a `fallocate`; at `fsync` (then they are durable), at close (`FUSE_FLUSH`: a failure is that
//! close's error) and at the file's last release; every [`COMMIT_INTERVAL`] by the
//! background flusher (so nothing stays in memory longer than a few seconds); at unmount;
//! and when all files together hold [`GATHERED_MAX`] (then writes go straight through).
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

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

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
    /// Bytes held by all files' runs.
    bytes: AtomicU64,
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
}

impl Gathered {
    /// Where the last run ends: the size the file has at least.
    fn end(&self) -> Option<u64> {
        let (start, data) = self.runs.last_key_value()?;
        Some(start + data.len() as u64)
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
            .is_some_and(|f| !f.lock().runs.is_empty())
    }

    /// Bytes gathered and not yet written, of all files.
    pub fn gathered_bytes(&self) -> u64 {
        self.write_behind.bytes.load(Ordering::Relaxed)
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
            let file = match wb.gathered(ino) {
                Some(file) => file,
                None => {
                    if !small || !wb.has_room(data.len()) {
                        return Ok(None);
                    }
                    // Entered empty and decided on under its lock, as every later write.
                    let mut files = wb.files.lock();
                    Arc::clone(files.entry(ino).or_insert_with(|| {
                        Arc::new(Mutex::new(Gathered {
                            runs: BTreeMap::new(),
                            at: self.now(),
                            gone: false,
                            failed: None,
                        }))
                    }))
                }
            };
            let mut file = file.lock();
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
            let touches = file.touches(offset, end);
            if (!small && !touches) || !self.may_gather(ino) {
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
            self.write_whole_blocks(ino, &mut file, start)?;
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
        file.try_lock().is_some_and(|f| f.runs.is_empty())
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
    fn write_whole_blocks(&self, ino: Ino, file: &mut Gathered, start: u64) -> FsResult<()> {
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
        self.write_behind
            .bytes
            .fetch_sub(head.len() as u64, Ordering::Relaxed);
        self.write_gathered(ino, start, &head, file.at)
    }

    /// Writes every run of the file; they are gone afterwards, whatever the outcome. The
    /// first failure is returned, after the other runs were written. Many runs (scattered
    /// rewrites) are written by several threads at once: a rewrite in place waits for its
    /// checksum intent's log commit, and concurrent ones share one (group commit), where
    /// one after another each paid its own.
    fn write_runs(&self, ino: Ino, file: &mut Gathered) -> FsResult<()> {
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
        if let Some(e) = file.failed.take() {
            return Err(e);
        }
        self.write_runs(ino, &mut file)
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
            let idle = file.runs.is_empty() && file.failed.is_none();
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
        let r = match file.failed.take() {
            Some(e) => Err(e),
            None => self.write_runs(ino, &mut file),
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
        Gathered {
            runs: BTreeMap::new(),
            at: Timestamp::now(),
            gone: false,
            failed: None,
        }
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
