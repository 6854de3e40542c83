//! Moving file data between the disks of a mounted file system [mmrestripefs -m, -b].
//!
//! A restripe walks every shard's tree in key order, a batch at a time under the metadata
//! lock, and collects the data blocks that sit where they should not: on a disk that is
//! suspended or to be emptied (`-m`), or on a disk fuller than the pool's average (`-b`).
//! Each is then moved on its own (a few files at a time, each file's blocks in order by one
//! mover), journaled like a copy-on-write: under the file's inode
//! lock held exclusively (no writer, truncate or reader of the file meanwhile), a new
//! extent is allocated on an acceptable disk, the block's written sectors are read and
//! verified against their checksums and written there, and one logged `MapBlock` points the
//! block at the copy. The old extent is released by that change like any other and
//! returns to the allocator only when the change is durable, so until then (and after a
//! crash before it) the old copy is the valid one: a restripe killed at any point loses
//! nothing and can simply be run again.
//!
//! After the data, `-m` moves the metadata pages off those disks: a budget of pages at a
//! time is marked changed (`MetaStore::relocate`, with the branches above them) and a
//! checkpoint writes them where the allocator puts pages now, which is never on a disk
//! that is not ready; the old pages are freed once that checkpoint's descriptor is durable,
//! so a crash in between leaves the previous checkpoint whole. The recovery log, the stored
//! allocation map and descriptor copies stay where they are (`disk delete` deals with them).
//!
//! The shards the file system manager gave to other owner slots are restriped by their
//! owners, a batch per `RestripeBatch` request that the manager's restripe sends and counts
//! (`FileSystem::restripe_shard_batch` runs there, with that owner's allocator and log); a
//! slot whose owner does not answer is named in the report (`unreached_slots`). With `-m`
//! each such owner then moves its own metadata pages off, a budget per `MovePagesOff`
//! request, each ending with a checkpoint of its own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use tessera_alloc::{AllocKind, BlockHint, DiskIndex, Extent, PoolId};

use crate::data::sector_infos;
use crate::descriptor::DiskStatus;
use crate::error::{FsError, FsResult};
use crate::fs::FileSystem;
use crate::inode::{BlockRef, Ino};
use crate::meta::Change;
use crate::metanode::{BlockAllocator, FileUpdate, Metanode};
use crate::prefetch::SectorState;
use crate::shard_tree::Item;

/// Tree items read per batch under the metadata lock.
const SCAN_BATCH_ITEMS: usize = 1024;
/// Tree items per batch another slot's owner restripes for the file system manager, one
/// request each: few enough that moving their blocks stays well within a request's wait
/// (64 blocks of 16 MiB are 1 GiB).
pub(crate) const REMOTE_BATCH_ITEMS: usize = 64;
/// Metadata pages another slot's owner moves off the disks being emptied per request of
/// the file system manager's `restripe -m`: one checkpoint each, well within a request's
/// wait.
const PAGES_PER_REQUEST: u32 = 512;
/// Metadata leaves whose copies a scrub (`restripe -c|-r` with `-m 2`) checks per hold of
/// the metadata lock: two reads of a 16 KiB page each, some tens of milliseconds.
const SCRUB_LEAVES: usize = 256;
/// Files whose blocks a restripe moves at once while applications are idle. One block at a
/// time left the drives idle between a block's read, its write and its log record (0.72 of
/// a plain copy's rate); four files at once keep requests queued on every disk (0.94).
const MOVES_IN_FLIGHT: usize = 4;
/// While applications read or write through the file system (within this window), only
/// one mover runs: with four, a sequential reader kept 0.43 of its rate, with two 0.51,
/// with one 0.89 (bench/RESULTS.md, "Restripe with several movers"), and the foreground
/// comes first, as GPFS's QoS puts maintenance below normal I/O.
const FOREGROUND_WINDOW: std::time::Duration = std::time::Duration::from_millis(250);

/// What a restripe does [mmrestripefs].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RestripeMode {
    /// `-m`: move every data block off disks that are suspended or to be emptied.
    Migrate,
    /// `-b`: move data blocks from disks fuller than their pool's average to emptier ones.
    Balance,
    /// `-p`: move data blocks that are not in their file's storage pool into it (files a
    /// policy migrated with `-I defer`, or whose migration was interrupted).
    Placement,
    /// `-r`: give every data block the copies its file asks for, each in its own failure
    /// group: blocks written while a failure group was down, or with a copy on a disk
    /// that is down (that copy is replaced).
    Replicate,
    /// `-c`: read every copy of every replicated block and write those that fail their
    /// checksums again from one that verifies (a scrub; reads repair only the copies they
    /// happen to read).
    Check,
}

/// A block's move: which copy (its position in `BlockRef::extents`), or all missing
/// copies of an ill-replicated block ([`REPLICATE`]).
type Move = (Ino, u64, BlockRef, usize);
const REPLICATE: usize = usize::MAX;
/// Every copy of a replicated block read and checked ([`RestripeMode::Check`]).
const CHECK: usize = usize::MAX - 1;

/// Where a restripe is, for progress lines.
#[derive(Clone, Debug, Default)]
pub struct RestripeProgress {
    pub shards: u64,
    pub shards_done: u64,
    /// Data blocks looked at so far.
    pub blocks_scanned: u64,
    pub blocks_moved: u64,
    pub bytes_moved: u64,
    /// Metadata pages written elsewhere to leave the disks being emptied (`-m`), or to get
    /// their second copy (`-r`).
    pub metadata_pages_moved: u64,
    /// Copies of metadata pages read and checked (`-c`, `-r` with two metadata copies), and
    /// those rewritten from the other copy.
    pub metadata_copies_checked: u64,
    pub metadata_copies_repaired: u64,
    /// Stored allocation-map regions moved off the disks being emptied (`-m`).
    pub map_regions_moved: u64,
    /// The recovery log moved off a disk being emptied (`-m`).
    pub log_moved: bool,
    /// Owner slot regions (records and log) moved off the disks being emptied (`-m`).
    pub slot_regions_moved: u64,
}

/// What a finished (or stopped) restripe did.
#[derive(Clone, Debug, Default)]
pub struct RestripeReport {
    pub progress: RestripeProgress,
    /// Blocks that changed between the scan and their move (written, truncated, deleted):
    /// wherever they went, the allocator chose an acceptable disk.
    pub blocks_changed: u64,
    /// Stopped before the end on request: running it again continues the work.
    pub stopped: bool,
    /// Owner slots whose shards were left as they are (their owner could not be reached,
    /// or failed), with why: their files' blocks were not looked at.
    pub unreached_slots: Vec<(u32, String)>,
}

/// Where a shard's restripe goes on: the tree key to scan from, and the file whose record
/// the scan saw last with the copies it asks for (its blocks may follow in the next batch).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RestripeCursor {
    pub from: Vec<u8>,
    pub file: Ino,
    pub copies: u8,
}

/// What one batch of a shard's restripe did (`FileSystem::restripe_batch`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RestripeBatch {
    pub scanned: u64,
    pub moved: u64,
    pub bytes: u64,
    pub changed: u64,
    pub stopped: bool,
    /// Where the next batch starts; `None` once the shard is done.
    pub next: Option<RestripeCursor>,
}

/// Records that the shards of owner slot `slot` were not restriped, and why.
fn note_unreached(report: &mut RestripeReport, slot: u32, why: &str) {
    tracing::warn!("restripe: the shards of owner slot {slot} are left as they are: {why}");
    if !report.unreached_slots.iter().any(|(s, _)| *s == slot) {
        report.unreached_slots.push((slot, why.to_string()));
    }
}

/// What the moves of one batch did.
#[derive(Default)]
struct BatchMoves {
    moved: u64,
    bytes: u64,
    changed: u64,
    stopped: bool,
}

enum Moved {
    /// Where the block went, and the bytes copied.
    To(Extent, u64),
    /// The block is no longer the one seen in the scan.
    Changed,
    /// The block stays as it is: nothing to do (every copy `restripe -c` could read
    /// matched its checksums, the block has the copies it should), or nothing that can be
    /// done this time (no room apart from the other copies for a balance, no copy up).
    Unchanged,
}

impl FileSystem {
    /// Runs a restripe; `stop` ends it early (between blocks), `progress` is called after
    /// every batch. Everything moved before an error or a stop stays moved and consistent.
    pub fn restripe(
        &self,
        mode: RestripeMode,
        stop: &AtomicBool,
        progress: &mut dyn FnMut(&RestripeProgress),
    ) -> FsResult<RestripeReport> {
        self.owner_here("a restripe")?;
        self.manager_here("a restripe")?;
        self.check_writable()?;
        let shards = self.owner().meta.lock().state.shard_count();
        let mut report = RestripeReport::default();
        report.progress.shards = shards;
        let desc = self.owner().desc.lock().clone();
        let me = self.owner_slot();
        for shard in 0..shards as usize {
            // The copies the file whose record the scan saw last asks for.
            let mut cursor = RestripeCursor::default();
            let slot = desc.shard_owner(shard).slot;
            // Another slot's shard: its owner moves its files' blocks (in its own regions,
            // logged in its own log), a batch per request, this restripe driving it.
            let remote = if slot == me {
                None
            } else {
                match self.slot_namespace(slot) {
                    Some(ns) => Some(ns),
                    None => {
                        note_unreached(&mut report, slot, "no way to its owner is known");
                        report.progress.shards_done += 1;
                        continue;
                    }
                }
            };
            loop {
                let batch = match remote {
                    None => self.restripe_shard_batch(mode, shard, &cursor, SCAN_BATCH_ITEMS, stop),
                    Some(ns) => ns.restripe_batch(mode, shard as u32, &cursor),
                };
                let batch = match (batch, remote) {
                    (Ok(batch), _) => batch,
                    (Err(e), Some(_)) => {
                        note_unreached(&mut report, slot, &e.to_string());
                        break;
                    }
                    (Err(e), None) => return Err(e),
                };
                report.progress.blocks_scanned += batch.scanned;
                report.progress.blocks_moved += batch.moved;
                report.progress.bytes_moved += batch.bytes;
                report.blocks_changed += batch.changed;
                if batch.stopped || (remote.is_some() && stop.load(Ordering::Relaxed)) {
                    report.stopped = true;
                    return Ok(report);
                }
                progress(&report.progress);
                match batch.next {
                    Some(next) => cursor = next,
                    None => break,
                }
            }
            report.progress.shards_done += 1;
            progress(&report.progress);
        }
        if mode == RestripeMode::Migrate {
            let leaving = self.not_ready_disks();
            let moving = |p: &tessera_meta::PagePtr| {
                p.copies()
                    .any(|a| leaving.contains(&crate::checkpoint::disk_addr(a).disk))
            };
            self.move_metadata_off(&moving, stop, &mut report, progress)?;
            if !report.stopped {
                self.move_slots_pages_off(&desc, stop, &mut report, progress);
                self.release_hand_over_roots_on(&leaving, &mut report)?;
                self.sync_own()?;
            }
            if !report.stopped {
                report.progress.map_regions_moved +=
                    self.move_map_regions_off(&leaving, false)? as u64;
                report.progress.log_moved |= self.move_log_off(&leaving, false)?;
                report.progress.slot_regions_moved +=
                    self.move_slot_regions_off(&leaving, false, &mut Vec::new())? as u64;
                progress(&report.progress);
            }
        }
        let metadata_replicated = self.owner().desc.lock().metadata_copies.is_some();
        if metadata_replicated && matches!(mode, RestripeMode::Replicate | RestripeMode::Check) {
            self.replicate_metadata(mode, stop, &mut report, progress)?;
        }
        Ok(report)
    }

    /// The owner slots other than this one that hold shards, in order.
    fn other_slots_holding_shards(&self, desc: &crate::descriptor::FsDescriptor) -> Vec<u32> {
        let me = self.owner_slot();
        let mut slots: Vec<u32> = (0..desc.shard_count as usize)
            .map(|s| desc.shard_owner(s).slot)
            .filter(|s| *s != me)
            .collect();
        slots.sort_unstable();
        slots.dedup();
        slots
    }

    /// The metadata pages of the other owner slots that hold shards, moved off the disks
    /// that are not ready by each slot's owner, a budget of pages per request (each a
    /// checkpoint of its own); a slot whose owner cannot be reached is named in the report.
    fn move_slots_pages_off(
        &self,
        desc: &crate::descriptor::FsDescriptor,
        stop: &AtomicBool,
        report: &mut RestripeReport,
        progress: &mut dyn FnMut(&RestripeProgress),
    ) {
        for slot in self.other_slots_holding_shards(desc) {
            let Some(ns) = self.slot_namespace(slot) else {
                note_unreached(report, slot, "no way to its owner is known");
                continue;
            };
            loop {
                if stop.load(Ordering::Relaxed) {
                    report.stopped = true;
                    return;
                }
                match ns.move_pages_off(PAGES_PER_REQUEST) {
                    Ok(0) => break,
                    Ok(n) => {
                        report.progress.metadata_pages_moved += n;
                        progress(&report.progress);
                    }
                    Err(e) => {
                        note_unreached(report, slot, &e.to_string());
                        break;
                    }
                }
            }
        }
    }

    /// Frees the hand-over roots on `leaving`: the root pages this manager wrote for shards
    /// it gave to other slots, kept (in its own regions, named by its descriptor) until
    /// every record of the taking slot names a root of its own, since a record may fall
    /// back to them. Each such slot moved its pages off `leaving` already (its root among
    /// them) by a checkpoint; one more writes its other record half, then this manager's
    /// checkpoint frees them. Without it a disk holding one stayed in use after the
    /// restripe, and `disk delete` failed until a remount.
    fn release_hand_over_roots_on(
        &self,
        leaving: &[DiskIndex],
        report: &mut RestripeReport,
    ) -> FsResult<()> {
        let desc = self.owner().desc.lock().clone();
        let roots = desc.root_ptrs();
        let mut slots: Vec<u32> = (0..desc.shard_count as usize)
            .filter(|&s| desc.shard_owner(s).slot != self.owner_slot())
            .filter(|&s| roots.get(s).is_some_and(|r| r.addr.0 != 0))
            .filter(|&s| {
                roots[s]
                    .copies()
                    .any(|a| leaving.contains(&crate::checkpoint::disk_addr(a).disk))
            })
            .map(|s| desc.shard_owner(s).slot)
            .collect();
        slots.sort_unstable();
        slots.dedup();
        if slots.is_empty() {
            return Ok(());
        }
        for slot in slots {
            let Some(ns) = self.slot_namespace(slot) else {
                note_unreached(report, slot, "no way to its owner is known");
                continue;
            };
            if let Err(e) = ns.move_pages_off(PAGES_PER_REQUEST) {
                note_unreached(report, slot, &e.to_string());
            }
        }
        self.checkpoint()
    }

    /// One batch of `restripe -m` on this owner's own shards (what another slot's owner
    /// runs for the manager's restripe): up to `budget` metadata pages with a copy on a disk
    /// that is not ready are written elsewhere by one checkpoint. Returns how many.
    pub(crate) fn move_pages_off_batch(&self, budget: usize) -> FsResult<u64> {
        let leaving = self.not_ready_disks();
        // With two metadata copies and every disk up (`restripe -r` after a failure group
        // came back), also the pages that have one copy (written meanwhile).
        let restoring = self.owner().desc.lock().metadata_copies.is_some()
            && self.devices.down_disks().is_empty();
        if leaving.is_empty() && !restoring {
            return Ok(0);
        }
        let moving = |p: &tessera_meta::PagePtr| {
            p.copies()
                .any(|a| leaving.contains(&crate::checkpoint::disk_addr(a).disk))
                || (restoring && p.mirror.is_none())
        };
        let marked = self
            .owner()
            .meta
            .lock()
            .state
            .relocate_pages(&moving, budget.max(1))?;
        // Also when nothing was marked: a page changed since the last checkpoint (by the
        // restripe's own block moves, say) is not counted, but its durable copy, the one a
        // crash would come back to, may still be on those disks until a checkpoint. The
        // space the moves left comes back once durable, so that df shows the disks empty.
        self.checkpoint()?;
        self.sync_own()?;
        Ok(marked as u64)
    }

    /// The part of `restripe -c` and `-r` (`rewrite`) on a `-m 2` file system that an owner
    /// slot runs on what it owns, for the file system manager
    /// (`MetanodeRequest::RestoreCopies`): every copy of its pages checked and a failed one
    /// rewritten from the other (a copy placed on a disk that was down when its page was
    /// written was never written); with `rewrite`, a copy of its log that missed writes is
    /// copied whole and recorded current, and every chunk of its allocation regions is
    /// stored again (one map copy may have missed writes), by a checkpoint. Returns the
    /// page copies checked and repaired.
    pub(crate) fn restore_own_copies(&self, rewrite: bool) -> FsResult<(u64, u64)> {
        if self.owner().desc.lock().metadata_copies.is_none() {
            return Ok((0, 0));
        }
        let (mut checked, mut repaired) = (0, 0);
        let shards = self.owner().meta.lock().state.shard_count() as usize;
        for shard in 0..shards {
            let mut from: Option<Vec<u8>> = None;
            loop {
                let (c, r, next) = self.owner().meta.lock().state.check_page_copies(
                    shard,
                    from.as_deref(),
                    SCRUB_LEAVES,
                )?;
                checked += c;
                repaired += r;
                match next {
                    Some(k) => from = Some(k),
                    None => break,
                }
            }
        }
        if rewrite && self.devices.down_disks().is_empty() {
            self.catch_up_log()?;
            self.owner().meta.lock().alloc.mark_all_chunks_dirty();
            self.checkpoint()?;
            self.sync_own()?;
        }
        Ok((checked, repaired))
    }

    /// One batch of a restripe of `shard` (which this owner holds): up to `items` tree
    /// items from `cursor` scanned under the metadata lock, and the data blocks among them
    /// that sit where `mode` says they should not moved. The answer carries the cursor of
    /// the next batch (`None`: the shard is done). Also what another slot's owner runs for
    /// the file system manager's restripe (`MetanodeRequest::RestripeBatch`), with its own
    /// plan: its allocator, its regions.
    pub(crate) fn restripe_shard_batch(
        &self,
        mode: RestripeMode,
        shard: usize,
        cursor: &RestripeCursor,
        items: usize,
        stop: &AtomicBool,
    ) -> FsResult<RestripeBatch> {
        let (scanned, next) = {
            let mut m = self.owner().meta.lock();
            m.state.scan_batch(shard, &cursor.from, items)?
        };
        let plan = Mutex::new(self.plan(mode)?);
        let file_pools = match &*plan.lock() {
            Plan::Placement { .. } => self.file_pools_of(&scanned)?,
            _ => HashMap::new(),
        };
        let mut file_copies = (cursor.file, usize::from(cursor.copies.max(1)));
        let mut out = RestripeBatch::default();
        let mut moves: Vec<Vec<Move>> = Vec::new();
        for item in scanned {
            let (ino, index, block) = match item {
                Item::Block { ino, index, block } => (ino, index, block),
                // A file's record comes before its blocks (key order).
                Item::Inode(rec) => {
                    file_copies = (rec.attr.ino, usize::from(rec.copies));
                    continue;
                }
                _ => continue,
            };
            out.scanned += 1;
            let n = u64::from(block.extent.sub_blocks);
            let wanted: Vec<usize> = match &*plan.lock() {
                Plan::Placement { pool_of_disk } => block
                    .extents()
                    .enumerate()
                    .filter(|(_, e)| pool_of_disk.get(&e.addr.disk) != file_pools.get(&ino))
                    .map(|(c, _)| c)
                    .collect(),
                Plan::Check if block.copy_count() > 1 => vec![CHECK],
                Plan::Check => Vec::new(),
                Plan::Replicate => {
                    let asks = if file_copies.0 == ino {
                        file_copies.1
                    } else {
                        1
                    };
                    let down = block.extents().any(|e| self.devices.is_down(e.addr.disk));
                    if block.copy_count() != asks || down {
                        vec![REPLICATE]
                    } else {
                        Vec::new()
                    }
                }
                other => block
                    .extents()
                    .enumerate()
                    .filter(|(_, e)| other.moves(e.addr.disk, n))
                    .map(|(c, _)| c)
                    .collect(),
            };
            // Items come in key order, so a file's blocks are neighbours: one group
            // per file, moved in order by one worker.
            for c in wanted {
                let m = (ino, index, block.clone(), c);
                match moves.last_mut() {
                    Some(group) if group[0].0 == ino => group.push(m),
                    _ => moves.push(vec![m]),
                }
            }
        }
        let batch = self.move_blocks(moves, &plan, stop)?;
        out.moved = batch.moved;
        out.bytes = batch.bytes;
        out.changed = batch.changed;
        out.stopped = batch.stopped;
        out.next = next.map(|from| RestripeCursor {
            from,
            file: file_copies.0,
            copies: u8::try_from(file_copies.1).unwrap_or(u8::MAX),
        });
        Ok(out)
    }

    /// Disks whose status is not ready (suspended, to be emptied).
    fn not_ready_disks(&self) -> Vec<DiskIndex> {
        self.owner()
            .desc
            .lock()
            .disks
            .iter()
            .filter(|d| d.status != DiskStatus::Ready)
            .map(|d| d.index)
            .collect()
    }

    /// The metadata part of `restripe -r` and `-c` with two metadata copies: every copy of
    /// every metadata page read and checked, failed ones rewritten from the other (`-c`
    /// and `-r`); then (`-r`) pages with one copy, or a copy on a disk that is down, written
    /// again with both copies on disks that are up, the map regions and the log moved off
    /// disks that are down, and every chunk of the allocation map stored again, so that
    /// both of its copies are current.
    fn replicate_metadata(
        &self,
        mode: RestripeMode,
        stop: &AtomicBool,
        report: &mut RestripeReport,
        progress: &mut dyn FnMut(&RestripeProgress),
    ) -> FsResult<()> {
        let shards = self.owner().meta.lock().state.shard_count() as usize;
        for shard in 0..shards {
            // A few hundred leaves per hold of the metadata lock: reading every copy of a
            // large shard's pages at once would stall every metadata operation meanwhile.
            let mut from: Option<Vec<u8>> = None;
            loop {
                if stop.load(Ordering::Relaxed) {
                    report.stopped = true;
                    return Ok(());
                }
                let (checked, repaired, next) = self.owner().meta.lock().state.check_page_copies(
                    shard,
                    from.as_deref(),
                    SCRUB_LEAVES,
                )?;
                report.progress.metadata_copies_checked += checked;
                report.progress.metadata_copies_repaired += repaired;
                progress(&report.progress);
                match next {
                    Some(k) => from = Some(k),
                    None => break,
                }
            }
        }
        // Each other owner slot's pages (and with -r its log copy and map chunks), by its
        // owner.
        let desc = self.owner().desc.lock().clone();
        for slot in self.other_slots_holding_shards(&desc) {
            let Some(ns) = self.slot_namespace(slot) else {
                note_unreached(report, slot, "no way to its owner is known");
                continue;
            };
            match ns.restore_copies(mode == RestripeMode::Replicate) {
                Ok((checked, repaired)) => {
                    report.progress.metadata_copies_checked += checked;
                    report.progress.metadata_copies_repaired += repaired;
                    progress(&report.progress);
                }
                Err(e) => note_unreached(report, slot, &e.to_string()),
            }
        }
        if mode != RestripeMode::Replicate {
            return Ok(());
        }
        self.catch_up_log()?;
        let down = self.devices.down_disks();
        // A page of one copy gets its second only where a second failure group has a
        // metadata disk up: with one group left, a rewrite gives it one copy again, and
        // the restripe would rewrite it for ever.
        let groups_up: std::collections::BTreeSet<i32> = desc
            .disks
            .iter()
            .filter(|d| {
                d.usage.holds_metadata()
                    && d.status == DiskStatus::Ready
                    && !self.devices.is_down(d.index)
            })
            .map(|d| d.failure_group)
            .collect();
        let second_copies = groups_up.len() >= 2;
        let ill = |p: &tessera_meta::PagePtr| {
            second_copies && p.mirror.is_none()
                || p.copies()
                    .any(|a| down.contains(&crate::checkpoint::disk_addr(a).disk))
        };
        self.move_metadata_off(&ill, stop, report, progress)?;
        if report.stopped {
            return Ok(());
        }
        // Each other owner slot's pages that have one copy, by its owner.
        self.move_slots_pages_off(&desc, stop, report, progress);
        if report.stopped {
            return Ok(());
        }
        report.progress.map_regions_moved += self.move_map_regions_off(&down, true)? as u64;
        report.progress.log_moved |= self.move_log_off(&down, true)?;
        let mut unreached = Vec::new();
        report.progress.slot_regions_moved +=
            self.move_slot_regions_off(&down, true, &mut unreached)? as u64;
        for (slot, why) in unreached {
            note_unreached(
                report,
                slot,
                &format!("its region stays where it is: {why}"),
            );
        }
        progress(&report.progress);
        Ok(())
    }

    /// Moves every metadata page off the disks that are not ready, a checkpoint at a time.
    fn move_metadata_off(
        &self,
        moving: &dyn Fn(&tessera_meta::PagePtr) -> bool,
        stop: &AtomicBool,
        report: &mut RestripeReport,
        progress: &mut dyn FnMut(&RestripeProgress),
    ) -> FsResult<()> {
        // Half of what makes the flusher start a checkpoint: the relocation adds the
        // branches above each page, and the file system's own changes go on meanwhile.
        let budget = (self.owner().dirty_pages_soft.load(Ordering::Relaxed) / 2).max(16);
        loop {
            if stop.load(Ordering::Relaxed) {
                report.stopped = true;
                return Ok(());
            }
            let marked = self
                .owner()
                .meta
                .lock()
                .state
                .relocate_pages(moving, budget)?;
            if marked == 0 {
                return Ok(());
            }
            self.checkpoint()?;
            report.progress.metadata_pages_moved += marked as u64;
            progress(&report.progress);
        }
    }

    /// Moves the stored allocation-map regions that live on disks that are not ready to
    /// ready metadata disks, in one checkpoint: new regions are allocated, every chunk of
    /// the maps they hold is marked changed and has no current copy (as for an added disk),
    /// and the checkpoint writes them all into the new regions and a descriptor naming them.
    /// Until that descriptor is durable the old regions, never written meanwhile, are the
    /// valid ones; the map that checkpoint stores has them free already, and the allocator
    /// reuses them only after it. Where owner slots write chunks of their own regions, the
    /// regions are copied byte for byte instead while the slots hold their chunk writes
    /// (`map_hold.rs`). Returns how many regions moved.
    fn move_map_regions_off(&self, leaving: &[DiskIndex], store_all: bool) -> FsResult<usize> {
        let may_move = {
            let desc = self.owner().desc.lock();
            let on_leaving = desc.map_regions().any(|r| leaving.contains(&r.on_disk));
            if desc.alloc_map.is_none() || !(store_all || on_leaving) {
                return Ok(0);
            }
            crate::alloc_map::regions_may_move(&desc, &self.devices, leaving, store_all)
        };
        // The slots hold their chunk writes only while regions may move: storing this
        // owner's own chunks again needs nobody else (and a slot whose node is down would
        // otherwise fail the whole `restripe -r`).
        let held = if may_move {
            self.hold_slots_map_writes()?
        } else {
            None
        };
        let moved = self.move_map_regions(leaving, store_all, held.as_ref());
        if let Some((id, slots)) = &held {
            self.release_slots_map_writes(*id, slots);
        }
        moved
    }

    /// [`Self::move_map_regions_off`] once the slots' chunk writes are `held` (their move's
    /// id and the slots held), or with none to hold.
    fn move_map_regions(
        &self,
        leaving: &[DiskIndex],
        store_all: bool,
        held: Option<&(u64, Vec<u32>)>,
    ) -> FsResult<usize> {
        let mut m = self.owner().meta.lock();
        let _one = self.owner().checkpoint_lock.lock();
        let mut desc = self.owner().desc.lock().clone();
        let before: Vec<crate::alloc_map::MapRegion> = desc.map_regions().copied().collect();
        let (old, new, moving) = crate::alloc_map::replace_regions_on(
            &mut desc,
            &self.devices,
            &mut m.alloc,
            leaving,
            store_all,
        )?;
        if old.is_empty() {
            if store_all {
                // Both copies of every chunk current again (a region whose disk was down
                // kept the chunks written before).
                m.alloc.mark_all_chunks_dirty();
                self.checkpoint_under_lock(&mut m)?;
            }
            return Ok(0);
        }
        let superseded = crate::alloc_map::region_extents_of(&desc, &old);
        let undo = |m: &mut crate::fs::Meta| {
            for e in crate::alloc_map::region_extents_of(&desc, &new) {
                if let Err(e) = m.alloc.free(e) {
                    tracing::error!("giving back a map region not used after all: {e}");
                }
            }
        };
        match held {
            // The slots' chunks are known only on disk: every region is copied whole, both
            // copies of each chunk, so that each owner's record and digest hold as they are.
            Some((id, slots)) => {
                let copied = self
                    .copy_map_regions(&old, &new, &before)
                    .and_then(|()| self.confirm_slots_map_writes_held(*id, slots));
                if let Err(e) = copied {
                    undo(&mut m);
                    return Err(e);
                }
            }
            None if !crate::slot::foreign_regions(&desc).is_empty() => {
                undo(&mut m);
                return Err(FsError::Usage(
                    "map regions would move while the owner slots do not hold their chunk \
                     writes; run the command again"
                        .into(),
                ));
            }
            None => {
                let mut slots = self.owner().map_slots.lock();
                for &disk in &moving {
                    let chunks = m.alloc.chunk_count(disk);
                    slots.add_disk(disk, chunks);
                    for chunk in 0..chunks {
                        m.alloc.mark_chunk_dirty(disk, chunk);
                    }
                }
            }
        }
        // Released as of LSN 0: the checkpoint stores them free (it excludes pending frees
        // from the map it writes), while the allocator gives them out only after a later
        // commit, when this checkpoint's descriptor is durable.
        m.pending_free.extend(superseded.iter().map(|e| (0, *e)));
        if store_all {
            m.alloc.mark_all_chunks_dirty();
        }
        *self.owner().desc.lock() = desc;
        if let Err(e) = self.commit_descriptor_change(
            &mut m,
            false,
            "moving allocation-map regions",
            "unmount and mount the file system again, then rerun the restripe",
        ) {
            // The old regions stay allocated until a mount tells which descriptor landed.
            m.pending_free
                .retain(|(lsn, e)| !(*lsn == 0 && superseded.contains(e)));
            return Err(e);
        }
        Ok(old.len())
    }

    /// Moves the recovery log off a disk that is not ready. Under the metadata lock (no
    /// change is logged meanwhile): a checkpoint makes everything the log holds durable
    /// elsewhere and moves the replay point to its end; a new region of the same size on a
    /// ready metadata disk is formatted as a new log (its own id) that starts at the next
    /// page boundary after that LSN, so LSNs go on growing for everyone waiting on one; the file system switches to it;
    /// and a second checkpoint writes the allocation map (new region used, old one free) and
    /// the descriptor naming the new log, which is the commit. A crash before that
    /// descriptor mounts with the old log (nothing to replay past the first checkpoint) and
    /// the new region free; after it, with the new log. If that checkpoint fails, changes
    /// already logged to the new log may have no durable descriptor naming it, so the file
    /// system is fenced: later commits fail (EIO) instead of being lost, and a remount
    /// recovers from whichever descriptor is durable.
    ///
    /// With two metadata copies the log's second copy goes to another failure group than
    /// the first where one has room, else beside it (ill-replicated until `restripe -r`);
    /// with `apart`, a log whose copies share a failure group moves too, if another group
    /// can take its second copy now.
    fn move_log_off(&self, leaving: &[DiskIndex], apart: bool) -> FsResult<bool> {
        let mut m = self.owner().meta.lock();
        let _one = self.owner().checkpoint_lock.lock();
        let desc = self.owner().desc.lock().clone();
        let stays = |disk: DiskIndex| !leaving.contains(&disk);
        let second = desc.metadata_copies.as_ref().map(|c| c.log_disk);
        let group = |d: DiskIndex| self.devices.failure_group(d);
        let shares = second.is_some_and(|s| group(s) == group(desc.log.disk));
        let moves = !stays(desc.log.disk) || !second.is_none_or(stays);
        if !(moves || apart && shares) {
            return Ok(false);
        }
        if !moves {
            let parted = |d: DiskIndex| {
                !self.devices.is_down(d)
                    && group(d) != group(desc.log.disk)
                    && desc.disks.iter().any(|x| {
                        x.index == d && x.usage.holds_metadata() && x.status == DiskStatus::Ready
                    })
            };
            if !(0..self.devices.len() as DiskIndex).any(parted) {
                return Ok(false);
            }
        }
        let lsn = self.checkpoint_for_a_new_log(&mut m)?;
        // As that checkpoint left it.
        let desc = self.owner().desc.lock().clone();
        let mut next = desc.clone();
        let (journal, mirrored) = self.create_log(&mut m, &mut next, &stays, lsn)?;
        let old_extents = crate::recovery::log_extents(&desc);
        m.pending_free.extend(old_extents.iter().map(|e| (0, *e)));
        *self.owner().desc.lock() = next;
        *self.owner().log_copies.write() = mirrored;
        self.replace_journal(journal);
        self.commit_descriptor_change(
            &mut m,
            true,
            "moving the recovery log",
            "the file system takes no more changes: unmount and mount it again, then rerun \
             the restripe",
        )?;
        Ok(true)
    }

    /// Checkpoints under the caller's metadata and checkpoint locks, so that the log holds
    /// nothing the checkpoint does not cover, and returns the LSN a log formatted to take its
    /// place starts at (LSNs only grow across logs).
    pub(crate) fn checkpoint_for_a_new_log(
        &self,
        m: &mut crate::fs::Meta,
    ) -> FsResult<tessera_journal::Lsn> {
        self.checkpoint_under_lock(m)?;
        let end = self.journal().appended_lsn();
        assert!(
            self.journal().durable_lsn() >= end,
            "a checkpoint commits the log"
        );
        Ok(tessera_journal::page_start_at_or_after(end))
    }

    /// A new recovery log for `next` (its `log`, and with metadata replicated its second
    /// copy, replaced): regions as large as the current log's on metadata disks that are up
    /// and that `stays` accepts (the second copy in another failure group than the first
    /// where one has room, else beside it), formatted as a new log (its own id) whose LSNs
    /// start at `lsn`. The caller holds the metadata and checkpoint locks, has made the old
    /// log durable up to `lsn`, and commits `next`; on failure nothing is allocated.
    pub(crate) fn create_log(
        &self,
        m: &mut crate::fs::Meta,
        next: &mut crate::descriptor::FsDescriptor,
        stays: &dyn Fn(DiskIndex) -> bool,
        lsn: tessera_journal::Lsn,
    ) -> FsResult<(
        tessera_journal::Journal,
        Option<Arc<crate::mirrored_log::MirroredLog>>,
    )> {
        let bs = u64::from(next.block_size);
        let bytes = next.log.region.bytes;
        let group = |d: DiskIndex| self.devices.failure_group(d);
        let up = |d: DiskIndex| !self.devices.is_down(d) && stays(d);
        let no_room = |_| FsError::NoSpace {
            pool: "system".into(),
            what: "the recovery log (contiguous blocks of a ready metadata disk)",
        };
        let (start, blocks) = m
            .alloc
            .alloc_contiguous_blocks_on(0, AllocKind::Metadata, bytes / bs, &up)
            .map_err(no_room)?;
        let new = crate::descriptor::LogInfo {
            disk: start.disk,
            region: tessera_journal::JournalRegion {
                offset: next.sub_block_offset(start.sub_block),
                bytes: blocks * bs,
            },
            log_id: rand::random(),
        };
        let one_copy = {
            let mut d = next.clone();
            d.log = new;
            d.metadata_copies = None;
            crate::recovery::log_extents(&d)
        };
        next.log = new;
        let geometry = next.clone();
        let offset_of = |sub_block: u64| geometry.sub_block_offset(sub_block);
        if let Some(copies) = &mut next.metadata_copies {
            let placed = crate::alloc_map::alloc_apart(
                &geometry,
                &self.devices,
                &mut m.alloc,
                blocks,
                Some(group(start.disk)),
                &up,
                &|| "the recovery log".to_string(),
            );
            match placed {
                Ok((second, _)) => {
                    copies.log_disk = second.disk;
                    copies.log_offset = offset_of(second.sub_block);
                    copies.log_behind = None;
                }
                Err(e) => {
                    for x in one_copy {
                        m.alloc.free(x).expect("just allocated");
                    }
                    return Err(no_room(e));
                }
            }
        }
        let new_extents = crate::recovery::log_extents(next);
        let give_back = |m: &mut crate::fs::Meta| {
            for x in &new_extents {
                m.alloc.free(*x).expect("just allocated");
            }
        };
        let mirrored = match &next.metadata_copies {
            Some(_) => match crate::mirrored_log::MirroredLog::open(next, &self.devices) {
                Ok(log) => {
                    if let Some(hook) = self.owner().log_hook.get() {
                        log.set_on_behind(Arc::clone(hook));
                    }
                    Some(log)
                }
                Err(e) => {
                    give_back(m);
                    return Err(e);
                }
            },
            None => None,
        };
        let dev: Arc<dyn tessera_drive::BlockDevice> = match &mirrored {
            Some(log) => Arc::clone(log) as Arc<dyn tessera_drive::BlockDevice>,
            None => self.devices.get(new.disk),
        };
        let opened = tessera_journal::format(dev.as_ref(), new.region, new.log_id)
            .and_then(|()| tessera_journal::Journal::open(dev, new.region, new.log_id, lsn));
        match opened {
            Ok((journal, records)) => {
                assert!(records.is_empty(), "a freshly formatted log has no records");
                Ok((journal, mirrored))
            }
            Err(e) => {
                give_back(m);
                Err(e.into())
            }
        }
    }

    /// Metadata pages on each disk (by disk index, 0 for a deleted one) as of the newest
    /// checkpoint: every page of every shard's tree is visited, so this reads the whole
    /// metadata.
    pub fn metadata_pages_per_disk(&self) -> FsResult<Vec<u64>> {
        self.owner_here("counting metadata pages")?;
        // By disk index; deleted disks' indexes stay unused.
        let slots = self.devices.len();
        let mut pages = vec![0u64; slots];
        let mut m = self.owner().meta.lock();
        let (store, trees) = m.state.trees_mut();
        for tree in trees {
            store
                .visit_pages(tree, &mut |a, _| {
                    pages[usize::from(crate::checkpoint::disk_addr(a).disk)] += 1;
                })
                .map_err(crate::shard_tree::meta_err)?;
        }
        Ok(pages)
    }

    pub(crate) fn check_writable(&self) -> FsResult<()> {
        self.check_fenced()?;
        if self.unmounted.load(Ordering::SeqCst) {
            return Err(FsError::Invalid(
                "the file system is being unmounted; mount it and run the restripe again".into(),
            ));
        }
        Ok(())
    }

    /// Which disks lose blocks and which may receive them, as of now.
    fn plan(&self, mode: RestripeMode) -> FsResult<Plan> {
        let desc = self.owner().desc.lock().clone();
        let m = self.owner().meta.lock();
        let per = u64::from(self.geo.sub_blocks_per_block);
        // Every pool's ready data disks: a block moves within its file's pool (the
        // allocator is asked for that pool), so each pool is emptied or balanced on its own.
        let ready_data: Vec<(DiskIndex, PoolId)> = desc
            .disks
            .iter()
            .filter(|d| d.usage.holds_data() && d.status == DiskStatus::Ready)
            .map(|d| (d.index, d.pool))
            .collect();
        let space: std::collections::HashMap<DiskIndex, DiskUse> = ready_data
            .iter()
            .map(|&(d, pool)| {
                let s = m.alloc.disk_space(d);
                let total = s.blocks_total * per;
                let used = total - s.blocks_free * per - s.sub_blocks_free_in_fragments;
                (d, DiskUse { used, total, pool })
            })
            .collect();
        Ok(match mode {
            RestripeMode::Replicate => Plan::Replicate,
            RestripeMode::Check => Plan::Check,
            RestripeMode::Placement => Plan::Placement {
                pool_of_disk: desc.disks.iter().map(|d| (d.index, d.pool)).collect(),
            },
            RestripeMode::Migrate => Plan::Migrate {
                sources: desc
                    .disks
                    .iter()
                    .filter(|d| d.status != DiskStatus::Ready)
                    .map(|d| d.index)
                    .collect(),
                targets: ready_data.iter().map(|(d, _)| *d).collect(),
            },
            RestripeMode::Balance => {
                let mut sums: std::collections::HashMap<PoolId, (u64, u64)> =
                    std::collections::HashMap::new();
                for s in space.values() {
                    let e = sums.entry(s.pool).or_default();
                    e.0 += s.used;
                    e.1 += s.total;
                }
                Plan::Balance {
                    mean: sums
                        .into_iter()
                        .map(|(pool, (used, total))| (pool, used as f64 / total.max(1) as f64))
                        .collect(),
                    space,
                }
            }
        })
    }

    /// The storage pool of every file whose blocks are among `items`.
    fn file_pools_of(&self, items: &[Item]) -> FsResult<HashMap<Ino, PoolId>> {
        let mut m = self.owner().meta.lock();
        let mut pools = HashMap::new();
        for item in items {
            if let Item::Block { ino, .. } = item {
                if !pools.contains_key(ino) {
                    pools.insert(*ino, self.file_pool(&mut m, *ino)?);
                }
            }
        }
        Ok(pools)
    }

    /// Moves every block of `ino` that is outside the file's storage pool into it (a
    /// policy migration). Returns the bytes copied.
    pub(crate) fn place_blocks_of(&self, ino: Ino) -> FsResult<u64> {
        let pool_of_disk: HashMap<DiskIndex, PoolId> = self
            .owner()
            .desc
            .lock()
            .disks
            .iter()
            .map(|d| (d.index, d.pool))
            .collect();
        let (pool, blocks) = {
            let mut m = self.owner().meta.lock();
            let pool = self.file_pool(&mut m, ino)?;
            let blocks = match m.state.content_kind(ino)? {
                crate::meta::ContentKind::Blocks => m.state.blocks(ino, 0..u64::MAX)?,
                _ => Vec::new(),
            };
            (pool, blocks)
        };
        let mut bytes = 0;
        for (index, block) in blocks {
            for (c, e) in block.extents().enumerate() {
                if pool_of_disk.get(&e.addr.disk) == Some(&pool) {
                    continue;
                }
                // The allocator gives out blocks of the file's pool on disks that take new
                // allocations, which is every acceptable target.
                if let Moved::To(_, n) = self.move_block(ino, index, &block, c, &|_| true)? {
                    bytes += n;
                }
            }
        }
        Ok(bytes)
    }

    /// Moves the blocks of a batch, grouped by file, with up to [`MOVES_IN_FLIGHT`] files at
    /// once while applications are idle and one while they are not: each move holds its
    /// file's inode lock, so files are the unit of parallelism
    /// and one file's blocks move in order. The plan is asked again before each move (a
    /// balance may have reached the average meanwhile). The first error stops the others
    /// after their current block and is returned; a stop request ends the batch the same
    /// way.
    fn move_blocks(
        &self,
        groups: Vec<Vec<Move>>,
        plan: &Mutex<Plan>,
        stop: &AtomicBool,
    ) -> FsResult<BatchMoves> {
        if groups.is_empty() {
            return Ok(BatchMoves::default());
        }
        let next = AtomicUsize::new(0);
        let quit = AtomicBool::new(false);
        let totals = Mutex::new(BatchMoves::default());
        let failed: Mutex<Option<FsError>> = Mutex::new(None);
        let seen = Mutex::new((
            self.pmon.data_ops(),
            std::time::Instant::now() - FOREGROUND_WINDOW,
        ));
        // Whether applications did I/O within the window (the restripe's own I/O does not
        // count: it goes to the disks directly).
        let foreground = || {
            let ops = self.pmon.data_ops();
            let mut s = seen.lock();
            if ops != s.0 {
                *s = (ops, std::time::Instant::now());
            }
            s.1.elapsed() < FOREGROUND_WINDOW
        };
        let worker = |extra: bool| {
            loop {
                // An extra mover steps aside while applications are busy.
                while extra && foreground() {
                    let drained = next.load(Ordering::Relaxed) >= groups.len();
                    if drained || quit.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(FOREGROUND_WINDOW / 5);
                }
                let Some(group) = groups.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    return;
                };
                for (ino, index, block, c) in group {
                    if quit.load(Ordering::Relaxed) {
                        return;
                    }
                    if stop.load(Ordering::Relaxed) {
                        totals.lock().stopped = true;
                        quit.store(true, Ordering::Relaxed);
                        return;
                    }
                    let n = u64::from(block.extent.sub_blocks);
                    let result = if *c == REPLICATE {
                        self.replicate_block(*ino, *index, block)
                    } else if *c == CHECK {
                        self.check_block(*ino, *index, block)
                    } else {
                        let from = block.extents().nth(*c).expect("a copy of the block");
                        if !plan.lock().moves(from.addr.disk, n) {
                            continue;
                        }
                        self.move_block(*ino, *index, block, *c, &|d| plan.lock().accepts(d, n))
                    };
                    match result {
                        Ok(Moved::To(to, bytes)) => {
                            if *c < CHECK {
                                let from = block.extents().nth(*c).expect("a copy");
                                plan.lock().moved(from, to);
                            }
                            let mut t = totals.lock();
                            t.moved += 1;
                            t.bytes += bytes;
                        }
                        Ok(Moved::Changed) => totals.lock().changed += 1,
                        Ok(Moved::Unchanged) => {}
                        // A balance is best effort and its movers run side by side: a
                        // disk that accepted when this block was planned may have taken
                        // another mover's block since and now sit at the average. The
                        // block stays where it is; nothing is wrong.
                        Err(FsError::NoSpace { .. }) if plan.lock().is_balance() => {}
                        Err(e) => {
                            failed.lock().get_or_insert(e);
                            quit.store(true, Ordering::Relaxed);
                            return;
                        }
                    }
                }
            }
        };
        let workers = MOVES_IN_FLIGHT.min(groups.len());
        std::thread::scope(|scope| {
            for _ in 1..workers {
                scope.spawn(|| worker(true));
            }
            worker(false);
        });
        match failed.into_inner() {
            Some(e) => Err(e),
            None => Ok(totals.into_inner()),
        }
    }

    /// The file's view and block `index` as they are now, if that is still the block the
    /// scan saw (the same copies); `None` when the file or the block changed since.
    fn still_seen(
        &self,
        ino: Ino,
        index: u64,
        seen: &BlockRef,
    ) -> FsResult<Option<(crate::metanode::FileView, BlockRef)>> {
        let view = match Metanode::view(self, ino, index..index + 1) {
            Ok(v) => v,
            Err(FsError::NotFound) => return Ok(None),
            Err(e) => return Err(e),
        };
        let current = match view.block(index) {
            Some(b) if b.extents().eq(seen.extents()) => b.clone(),
            _ => return Ok(None),
        };
        Ok(Some((view, current)))
    }

    /// Moves copy `c` of block `index` of `ino` (as `seen` by the scan) to a disk `accepts`
    /// allows, in a failure group the block's other copies do not use. When no such disk
    /// has room and the block has other copies, the copy is dropped instead (the file is
    /// then ill-replicated, as after GPFS's mmdeldisk of a failure group's last disk).
    fn move_block(
        &self,
        ino: Ino,
        index: u64,
        seen: &BlockRef,
        c: usize,
        accepts: &dyn Fn(DiskIndex) -> bool,
    ) -> FsResult<Moved> {
        // The block moves like a write by the data path: under the file's lock, through
        // the metanode interface (a view, an extent, an update mapping the copy).
        let _file = self.inode_lock(ino).write();
        let _stale = self.prefetch.invalidate_after(ino);
        let Some((view, current)) = self.still_seen(ino, index, seen)? else {
            return Ok(Moved::Changed);
        };
        let hint = BlockHint {
            file_key: ino,
            block_index: index,
            prev: None,
        };
        let extents: Vec<Extent> = current.extents().collect();
        let from = extents[c];
        let other_groups: Vec<i32> = extents
            .iter()
            .filter(|e| **e != from)
            .map(|e| self.devices.failure_group(e.addr.disk))
            .collect();
        let allowed = |d: DiskIndex| {
            accepts(d)
                && !self.devices.is_down(d)
                && !other_groups.contains(&self.devices.failure_group(d))
        };
        // A restripe runs where the metadata is owned: it allocates from, and reports to,
        // this node's own owner (a disk filter does not cross the wire).
        let allocate = || {
            BlockAllocator::allocate_on(
                self,
                view.pool,
                current.extent.sub_blocks,
                hint,
                &allowed,
                "moved file data",
            )
        };
        let must_leave = || {
            self.devices.is_down(from.addr.disk) || self.not_ready_disks().contains(&from.addr.disk)
        };
        let to = match allocate() {
            // A block that must leave its disk goes where this owner can get room: space
            // freed by changes not yet durable, or (a slot's owner whose regions are full)
            // another region from the manager, as a write would. Balancing never takes a
            // region for itself.
            Err(full @ FsError::NoSpace { .. }) if must_leave() => {
                let again = if self.has_pending_frees() {
                    self.sync_own()?;
                    allocate()
                } else {
                    Err(full)
                };
                match again {
                    Err(full @ FsError::NoSpace { .. }) => {
                        self.allocate_in_another_region(full, &allocate)
                    }
                    other => other,
                }
            }
            other => other,
        };
        let to = match to {
            Ok(to) => to,
            // Balancing a disk that stays in service: a copy with nowhere to go apart from
            // the others stays where it is; dropping it would trade replication for balance.
            Err(FsError::NoSpace { .. })
                if extents.len() > 1
                    && !self.devices.is_down(from.addr.disk)
                    && !self.not_ready_disks().contains(&from.addr.disk) =>
            {
                return Ok(Moved::Unchanged);
            }
            Err(FsError::NoSpace { .. }) if extents.len() > 1 => {
                tracing::warn!(
                    "inode {ino} block {index}: no disk of another failure group takes the copy \
                     on NSD {}; dropping it (the file is ill-replicated until `restripe -r`)",
                    self.devices.name(from.addr.disk)
                );
                let drop = Change::DropCopies {
                    ino,
                    index,
                    extents: vec![from],
                };
                Metanode::update(self, ino, FileUpdate::content(vec![drop]))?;
                return Ok(Moved::Changed);
            }
            Err(e) => return Err(e),
        };
        let moved = self
            .copy_block(ino, &current, to)
            .and_then(|(mut copy, bytes)| {
                // The copy takes the moved one's place; the others stay.
                let mut all: Vec<Extent> = extents.clone();
                all[c] = to;
                copy.extent = all[0];
                copy.copies = all[1..].to_vec();
                let map = Change::map_block(ino, index, copy);
                Metanode::update(self, ino, FileUpdate::content(vec![map]))?;
                Ok(bytes)
            });
        match moved {
            Ok(bytes) => Ok(Moved::To(to, bytes)),
            Err(e) => {
                BlockAllocator::abandon(self, to);
                Err(e)
            }
        }
    }

    /// Gives block `index` of `ino` (as `seen` by the scan) the copies its file asks for:
    /// copies on disks that are down are replaced, missing ones added, each on a disk that
    /// is up in a failure group no other copy uses. Fewer when no such disk has room.
    fn replicate_block(&self, ino: Ino, index: u64, seen: &BlockRef) -> FsResult<Moved> {
        let _file = self.inode_lock(ino).write();
        let _stale = self.prefetch.invalidate_after(ino);
        let Some((view, current)) = self.still_seen(ino, index, seen)? else {
            return Ok(Moved::Changed);
        };
        let good: Vec<Extent> = current
            .extents()
            .filter(|e| !self.devices.is_down(e.addr.disk))
            .collect();
        let wanted = usize::from(view.copies).max(1);
        if good.is_empty() || (good.len() == wanted && good.len() == current.copy_count()) {
            return Ok(Moved::Unchanged);
        }
        if good.len() >= wanted {
            // More copies than the file asks for now (`file attr set --replication`), or
            // copies on disks that are down beside enough good ones: drop the rest.
            let extra: Vec<Extent> = current
                .extents()
                .filter(|e| !good[..wanted].contains(e))
                .collect();
            let drop = Change::DropCopies {
                ino,
                index,
                extents: extra,
            };
            Metanode::update(self, ino, FileUpdate::content(vec![drop]))?;
            return Ok(Moved::To(good[0], 0));
        }
        let mut groups: Vec<i32> = good
            .iter()
            .map(|e| self.devices.failure_group(e.addr.disk))
            .collect();
        let hint = BlockHint {
            file_key: ino,
            block_index: index,
            prev: None,
        };
        let mut added = Vec::new();
        while good.len() + added.len() < wanted {
            let allowed = |d: DiskIndex| {
                !self.devices.is_down(d) && !groups.contains(&self.devices.failure_group(d))
            };
            match BlockAllocator::allocate_on(
                self,
                view.pool,
                current.extent.sub_blocks,
                hint,
                &allowed,
                "replicated file data",
            ) {
                Ok(e) => {
                    groups.push(self.devices.failure_group(e.addr.disk));
                    added.push(e);
                }
                Err(FsError::NoSpace { .. }) => break,
                Err(e) => {
                    for a in added {
                        BlockAllocator::abandon(self, a);
                    }
                    return Err(e);
                }
            }
        }
        // Read once from the good copies (verified, falling back between them), write to
        // every new one, then one logged change names the new set of copies.
        let copied = (|| -> FsResult<(BlockRef, u64)> {
            let mut bytes = 0;
            let mut block = current.clone();
            if let Some(first) = added.first() {
                let mut source = current.clone();
                source.extent = good[0];
                source.copies = good[1..].to_vec();
                let (copy, n) = self.copy_block(ino, &source, *first)?;
                bytes += n;
                for more in &added[1..] {
                    let (_, n) = self.copy_block(ino, &source, *more)?;
                    bytes += n;
                }
                block.crcs = copy.crcs;
                block.unwritten = copy.unwritten;
                block.pending.clear();
            }
            let mut all = good.clone();
            all.extend(&added);
            block.extent = all[0];
            block.copies = all[1..].to_vec();
            Ok((block, bytes))
        })();
        let result = copied.and_then(|(block, bytes)| {
            let to = block.extent;
            let map = Change::map_block(ino, index, block);
            Metanode::update(self, ino, FileUpdate::content(vec![map]))?;
            Ok((to, bytes))
        });
        match result {
            Ok((to, bytes)) if !added.is_empty() => Ok(Moved::To(to, bytes)),
            Ok(_) => Ok(Moved::Changed),
            Err(e) => {
                for a in added {
                    BlockAllocator::abandon(self, a);
                }
                Err(e)
            }
        }
    }

    /// Reads every copy of block `index` of `ino` and repairs those that fail their
    /// checksums from one that verifies (see `FileSystem::repair_copies`). `Moved::To`
    /// (the first repaired copy) when something was repaired.
    fn check_block(&self, ino: Ino, index: u64, seen: &BlockRef) -> FsResult<Moved> {
        let _file = self.inode_lock(ino).read();
        let Some((_, current)) = self.still_seen(ino, index, seen)? else {
            return Ok(Moved::Changed);
        };
        let Some(last) = (0..current.sectors())
            .rev()
            .find(|s| !current.is_unwritten(*s))
        else {
            return Ok(Moved::Unchanged);
        };
        let bytes = (last as u64 + 1) * tessera_drive::SECTOR_BYTES;
        let (copies, infos) = sector_infos(&current, 0, bytes);
        let mut good: Option<(Extent, tessera_drive::AlignedBuf)> = None;
        let mut damaged = Vec::new();
        for extent in &copies {
            if self.devices.is_down(extent.addr.disk) {
                continue;
            }
            let mut buf = tessera_drive::AlignedBuf::zeroed(bytes as usize);
            // Each copy on its own: a copy list of one never falls back.
            match self.read_verified(ino, &[*extent], 0, &mut buf, &infos, true, None) {
                Ok(_) if good.is_none() => good = Some((*extent, buf)),
                Ok(_) => {}
                Err(FsError::Checksum { .. }) => damaged.push(*extent),
                Err(e) => tracing::warn!(
                    "restripe -c: inode {ino} block {index} on NSD {}: {e}",
                    self.devices.name(extent.addr.disk)
                ),
            }
        }
        match good {
            Some((from, buf)) if !damaged.is_empty() => {
                self.repair_copies(ino, index, &damaged, &from, 0, &buf, &infos);
                Ok(Moved::To(damaged[0], bytes * damaged.len() as u64))
            }
            Some(_) => Ok(Moved::Unchanged),
            // No copy could be read (their disks are down or failed the read, which the
            // log says): nothing to repair from.
            None if damaged.is_empty() => Ok(Moved::Unchanged),
            None => Err(FsError::Checksum {
                nsd: self.devices.name(damaged[0].addr.disk),
                offset: self.extent_offset(&damaged[0]),
                ino,
            }),
        }
    }

    /// Copies the written sectors of `from` into extent `to`, verified on the way; returns
    /// the block as it is at `to` and the bytes copied.
    fn copy_block(&self, ino: Ino, from: &BlockRef, to: Extent) -> FsResult<(BlockRef, u64)> {
        let sectors = from.sectors();
        let mut copy = BlockRef::new_unwritten(to, sectors);
        let Some(last) = (0..sectors).rev().find(|s| !from.is_unwritten(*s)) else {
            return Ok((copy, 0));
        };
        let bytes = (last as u64 + 1) * tessera_drive::SECTOR_BYTES;
        let (_, infos) = sector_infos(from, 0, bytes);
        let mut buf = tessera_drive::AlignedBuf::zeroed(bytes as usize);
        let copies: Vec<Extent> = from.extents().collect();
        let states = self.read_verified(ino, &copies, 0, &mut buf, &infos, true, None)?;
        self.devices
            .get(to.addr.disk)
            .write_at(&buf, self.extent_offset(&to))?;
        for (s, state) in states.iter().enumerate() {
            if let SectorState::Crc(crc) = state {
                copy.set_written(s, *crc);
            }
        }
        Ok((copy, bytes))
    }
}

/// Sub-blocks in use and in all on a disk, and its pool.
#[derive(Clone, Copy, Debug)]
struct DiskUse {
    used: u64,
    total: u64,
    pool: PoolId,
}

/// The disks a restripe empties and those it fills.
enum Plan {
    Migrate {
        sources: Vec<DiskIndex>,
        targets: Vec<DiskIndex>,
    },
    /// A disk gives an extent while it stays at or above its pool's used fraction without
    /// it; the emptiest disks of the pool take it, as long as they stay at or below that
    /// fraction with it. Kept up to date as blocks move, so no disk is drained or filled
    /// past the average. What cannot move (the log, metadata pages) counts as used: the aim
    /// is disks that fill up at the same pace.
    Balance {
        mean: std::collections::HashMap<PoolId, f64>,
        space: std::collections::HashMap<DiskIndex, DiskUse>,
    },
    /// Blocks move when their disk is not in their file's pool (decided in the scan);
    /// the allocator, asked for the file's pool, picks the target.
    Placement {
        pool_of_disk: HashMap<DiskIndex, PoolId>,
    },
    /// Ill-replicated blocks get their missing copies (decided in the scan).
    Replicate,
    /// Every copy of replicated blocks is read and checked (decided in the scan).
    Check,
}

impl Plan {
    fn is_balance(&self) -> bool {
        matches!(self, Plan::Balance { .. })
    }

    /// Whether an extent of `n` sub-blocks on `disk` should move, and some disk takes it.
    fn moves(&self, disk: DiskIndex, n: u64) -> bool {
        match self {
            Plan::Placement { .. } | Plan::Replicate | Plan::Check => true,
            Plan::Migrate { sources, targets } => sources.contains(&disk) && !targets.is_empty(),
            Plan::Balance { mean, space, .. } => space.get(&disk).is_some_and(|s| {
                (s.used.saturating_sub(n)) as f64 / s.total.max(1) as f64 >= mean[&s.pool]
                    && space
                        .iter()
                        .any(|(&d, o)| o.pool == s.pool && self.accepts(d, n))
            }),
        }
    }

    /// Whether `disk` takes an extent of `n` sub-blocks.
    fn accepts(&self, disk: DiskIndex, n: u64) -> bool {
        match self {
            Plan::Placement { .. } | Plan::Replicate | Plan::Check => true,
            Plan::Migrate { targets, .. } => targets.contains(&disk),
            // The emptiest disks first (water filling), and none past the average.
            Plan::Balance { mean, space, .. } => {
                let frac = |s: &DiskUse| s.used as f64 / s.total.max(1) as f64;
                space.get(&disk).is_some_and(|s| {
                    let least = space
                        .values()
                        .filter(|o| o.pool == s.pool)
                        .map(frac)
                        .fold(f64::INFINITY, f64::min);
                    let step = n as f64 / s.total.max(1) as f64;
                    frac(s) + step <= mean[&s.pool] && frac(s) <= least + step
                })
            }
        }
    }

    fn moved(&mut self, from: Extent, to: Extent) {
        if let Plan::Balance { space, .. } = self {
            let n = u64::from(from.sub_blocks);
            if let Some(s) = space.get_mut(&from.addr.disk) {
                s.used = s.used.saturating_sub(n);
            }
            if let Some(s) = space.get_mut(&to.addr.disk) {
                s.used += n;
            }
        }
    }
}
