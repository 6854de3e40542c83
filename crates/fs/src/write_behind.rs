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
//! What is gathered: one run of contiguous bytes per file, started by a write smaller than
//! [`GATHER_BELOW`] and grown by the writes that continue it (sequential writers, appends,
//! mmap writeback). Whole blocks are written as soon as the run covers them; a write that
//! does not continue the run first writes what was gathered, so writes land in the order
//! they were made, and every write of the file waits for that.
//!
//! When gathered bytes reach the disks: when the run covers a block; before any write that
//! does not continue it, any read of the file, a truncate, a `setattr`, a `fallocate` and a
//! `link`; at `fsync` (then they are durable), at close (`FUSE_FLUSH`: a failure is that
//! close's error) and at the file's last release; every [`COMMIT_INTERVAL`] by the
//! background flusher (so nothing stays in memory longer than a few seconds); at unmount;
//! and when all files together hold [`GATHERED_MAX`] (then writes go straight through).
//! A failure outside a write, fsync or close (the background flusher, a read) is kept and
//! returned by the file's next write, fsync or close, and logged with the file's inode, as
//! the kernel reports a failed writeback. What was not yet written is lost by a crash, as
//! the page cache's dirty pages are; `fsync`, `O_SYNC`, `O_DSYNC` and `O_DIRECT` writes keep
//! their guarantees (they write what was gathered first).
//!
//! Sizes and times: `stat` and lookups on this node report the size the gathered bytes
//! reach and the time of the last write gathered (`FileSystem::with_gathered`), and the
//! write that finally carries them stamps the file's mtime and ctime with that time, not
//! its own (`WRITE_TIME`).
//!
//! Only a mount no other node mounts beside gathers ([`FileSystem::set_write_behind`]):
//! other nodes would read the disks, or ask the metanode for the size, without this
//! node's gathered bytes. Gathering under a kept data token on a cluster's nodes, with the
//! token's revocation as the flush, is the next step.
//!
//! [`COMMIT_INTERVAL`]: crate::fs::COMMIT_INTERVAL

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{FsError, FsResult};
use crate::fs::FileSystem;
use crate::inode::{Attr, Ino, Timestamp};

/// Writes smaller than this start a run of gathered bytes; larger ones go to the disks as
/// they come (gathering them would only add a copy).
pub(crate) const GATHER_BELOW: usize = 256 << 10;

/// Gathered bytes of all files together, at most: past it writes go straight through.
pub(crate) const GATHERED_MAX: u64 = 256 << 20;

std::thread_local! {
    /// The time a flush of gathered bytes stamps as the file's mtime and ctime: when the
    /// last of those writes was made, not when they reached the disks. Read by the
    /// metanode's update (`Times::Modified`) on this thread; only a mount that serves its
    /// own metadata gathers, so the update runs here.
    pub(crate) static WRITE_TIME: std::cell::Cell<Option<Timestamp>> =
        const { std::cell::Cell::new(None) };
}

/// The gathered bytes of every file of one mount.
#[derive(Default)]
pub(crate) struct WriteBehind {
    on: AtomicBool,
    files: Mutex<HashMap<Ino, Arc<Mutex<Run>>>>,
    /// Bytes held by all runs.
    bytes: AtomicU64,
}

/// One file's gathered bytes: `data` belongs at byte `start` of the file.
struct Run {
    start: u64,
    data: Vec<u8>,
    /// When the last write gathered here was made.
    at: Timestamp,
    /// Taken out of the table: whoever waited for it looks the file up again.
    gone: bool,
    /// A write of these bytes that failed where no caller could be told.
    failed: Option<FsError>,
}

impl Run {
    fn end(&self) -> u64 {
        self.start + self.data.len() as u64
    }
}

impl WriteBehind {
    fn run(&self, ino: Ino) -> Option<Arc<Mutex<Run>>> {
        if !self.on.load(Ordering::Relaxed) {
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

    /// Whether this mount gathers small writes.
    pub fn writes_behind(&self) -> bool {
        self.write_behind.on.load(Ordering::Relaxed)
    }

    /// Bytes gathered and not yet written, of all files.
    pub fn gathered_bytes(&self) -> u64 {
        self.write_behind.bytes.load(Ordering::Relaxed)
    }

    /// Takes a write into the file's gathered run, or writes what was gathered and then
    /// this write: `None` when the file has nothing gathered and the write goes straight
    /// through (the caller writes it).
    pub(crate) fn write_behind(
        &self,
        ino: Ino,
        offset: u64,
        data: &[u8],
        sync: bool,
    ) -> FsResult<Option<usize>> {
        let wb = &self.write_behind;
        if !wb.on.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let gathers = !sync && data.len() < GATHER_BELOW && wb.has_room(data.len());
        loop {
            let Some(run) = wb.run(ino) else {
                if !gathers {
                    return Ok(None);
                }
                let mut files = wb.files.lock();
                if files.contains_key(&ino) {
                    continue;
                }
                files.insert(
                    ino,
                    Arc::new(Mutex::new(Run {
                        start: offset,
                        data: data.to_vec(),
                        at: self.now(),
                        gone: false,
                        failed: None,
                    })),
                );
                wb.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                return Ok(Some(data.len()));
            };
            let mut run = run.lock();
            if run.gone {
                continue;
            }
            if let Some(e) = run.failed.take() {
                return Err(e);
            }
            let continues = !run.data.is_empty() && offset == run.end();
            if continues && !sync && wb.has_room(data.len()) {
                run.data.extend_from_slice(data);
                run.at = self.now();
                wb.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                self.write_whole_blocks(ino, &mut run)?;
                return Ok(Some(data.len()));
            }
            // Whatever else this write is, what was gathered lands first.
            self.write_run(ino, &mut run)?;
            if gathers {
                run.start = offset;
                run.data.extend_from_slice(data);
                run.at = self.now();
                wb.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                return Ok(Some(data.len()));
            }
            // Written while the run is held, so that no write gathered meanwhile lands
            // before it.
            return self.write_direct(ino, offset, data, sync).map(Some);
        }
    }

    /// Writes the whole blocks the run covers (from its start to the last block boundary
    /// inside it) and keeps the rest.
    fn write_whole_blocks(&self, ino: Ino, run: &mut Run) -> FsResult<()> {
        let bs = self.geo.block_bytes;
        let cut = run.end() / bs * bs;
        if cut <= run.start || run.data.len() < bs as usize {
            return Ok(());
        }
        let n = (cut - run.start) as usize;
        let rest = run.data.split_off(n);
        let head = std::mem::replace(&mut run.data, rest);
        let start = run.start;
        run.start = cut;
        self.write_behind
            .bytes
            .fetch_sub(n as u64, Ordering::Relaxed);
        self.write_gathered(ino, start, &head, run.at)
    }

    /// Writes everything the run holds; it is empty afterwards, whatever the outcome.
    fn write_run(&self, ino: Ino, run: &mut Run) -> FsResult<()> {
        if run.data.is_empty() {
            return Ok(());
        }
        let data = std::mem::take(&mut run.data);
        self.write_behind
            .bytes
            .fetch_sub(data.len() as u64, Ordering::Relaxed);
        self.write_gathered(ino, run.start, &data, run.at)
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
        let Some(run) = self.write_behind.run(ino) else {
            return Ok(());
        };
        let mut run = run.lock();
        if let Some(e) = run.failed.take() {
            return Err(e);
        }
        self.write_run(ino, &mut run)
    }

    /// [`Self::flush_gathered`] for a caller that cannot report the failure (a read, a
    /// lookup): kept for the file's next write, fsync or close.
    pub(crate) fn flush_gathered_quietly(&self, ino: Ino) {
        let Some(run) = self.write_behind.run(ino) else {
            return;
        };
        let mut run = run.lock();
        if let Err(e) = self.write_run(ino, &mut run) {
            run.failed.get_or_insert(e);
        }
    }

    /// Writes what every file has gathered (the background flusher, sync, unmount), and
    /// forgets the files that hold nothing and kept no failure.
    pub(crate) fn flush_all_gathered(&self) {
        let runs: Vec<(Ino, Arc<Mutex<Run>>)> = {
            let files = self.write_behind.files.lock();
            if files.is_empty() {
                return;
            }
            files.iter().map(|(i, r)| (*i, Arc::clone(r))).collect()
        };
        for (ino, run) in runs {
            let mut run = run.lock();
            if let Err(e) = self.write_run(ino, &mut run) {
                run.failed.get_or_insert(e);
            }
        }
        self.write_behind.files.lock().retain(|_, run| {
            let Some(mut run) = run.try_lock() else {
                return true;
            };
            let idle = run.data.is_empty() && run.failed.is_none();
            run.gone |= idle;
            !idle
        });
    }

    /// The file's last close on this node: what it gathered is written and the file
    /// forgotten here. A failure kept for it is returned (nobody else will hear of it).
    pub(crate) fn release_gathered(&self, ino: Ino) -> FsResult<()> {
        let Some(arc) = self.write_behind.run(ino) else {
            return Ok(());
        };
        let mut run = arc.lock();
        let r = match run.failed.take() {
            Some(e) => Err(e),
            None => self.write_run(ino, &mut run),
        };
        run.gone = true;
        // Locked after the run (nobody waits for a run holding the table), and only this
        // run is taken out: another may have replaced it meanwhile.
        let mut files = self.write_behind.files.lock();
        if files.get(&ino).is_some_and(|r| Arc::ptr_eq(r, &arc)) {
            files.remove(&ino);
        }
        r
    }

    /// `attr` as this node's writes left it: the size its gathered bytes reach and the
    /// time of the last of them.
    pub(crate) fn with_gathered(&self, mut attr: Attr) -> Attr {
        let Some(run) = self.write_behind.run(attr.ino) else {
            return attr;
        };
        let run = run.lock();
        if !run.data.is_empty() {
            attr.size = attr.size.max(run.end());
            attr.mtime = run.at;
            attr.ctime = run.at;
        }
        attr
    }
}
