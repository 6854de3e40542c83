//! Data replication across failure groups [mmcrfs -r/-R/-K, mmrestripefs -r].
//!
//! A block of a file whose record asks for `n` copies (`-r n` at create, `file attr set
//! --replication`) is allocated `n` times, each copy on a disk of a different failure group
//! (`BlockRef::copies` lists the others). Every copy holds the same bytes, so one set of
//! sector checksums describes them all. The rules:
//!
//! - **Only current copies are listed.** A write goes to every copy; a copy whose write
//!   fails (or whose disk is down, `DiskSet::is_down`) is dropped from the block reference
//!   in the same update (or, for an in-place write, in an update before the write), so the
//!   block map never names a copy that holds older data than the checksums say. A file with
//!   a block that has fewer copies than it asks for is *ill-replicated* (GPFS's word) until
//!   `restripe -r` copies it again. A disk that failed therefore needs no "stale" state
//!   that must survive a remount: whatever of it the map still names is current.
//! - **Reads fall back.** A read takes the first copy whose disk is up; a copy that fails
//!   to read or whose sectors fail their checksums is skipped for the next, and when one
//!   verifies, the copies that failed their checksums are written over with its bytes
//!   (*repaired*, under the block's exclusive lock, and only if the block map still says
//!   what the read verified against).
//! - **Placement.** The first copy goes where the allocator puts any block; each further
//!   copy goes to a disk of the same pool in a failure group no earlier copy uses.
//!   When no such disk takes new data, `-K` decides ([`StrictReplication`]): `no` writes
//!   fewer copies, `whenpossible` (the default) writes fewer only while the missing
//!   failure groups have no ready disk that is up (ENOSPC when they are merely full),
//!   `always` fails with ENOSPC.
//! - **Disks down.** A data disk whose device is missing at mount, or that fails a write
//!   or a flush, is down for the rest of the mount: no I/O goes to it and the allocator
//!   gives out nothing on it. `disk change stop|start` sets it by hand. With one metadata
//!   copy (`-m 1`) only disks without metadata may be down; with `-m 2` any disk may (see
//!   ARCHITECTURE.md, "Metadata replication": pages carry second addresses, the log and
//!   the allocation map have second regions, `mirrored_log.rs`).

use tessera_alloc::{BlockHint, DiskIndex, Extent, PoolId};

/// Which copy of a replicated block a read tries first [mmchconfig readReplicaPolicy].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ReadReplicaPolicy {
    /// The copies in the order the block lists them (the first one that is up).
    Default,
    /// Copies on disks this node reaches itself before those reached through NSD servers.
    Local,
    /// The copy whose disk answered reads fastest lately.
    Fastest,
}

impl ReadReplicaPolicy {
    pub fn parse(text: &str) -> Option<ReadReplicaPolicy> {
        match text {
            "default" => Some(ReadReplicaPolicy::Default),
            "local" => Some(ReadReplicaPolicy::Local),
            "fastest" => Some(ReadReplicaPolicy::Fastest),
            _ => None,
        }
    }
}

use crate::data::SectorInfo;
use crate::descriptor::StrictReplication;
use crate::error::{FsError, FsResult};
use crate::fs::{FileSystem, Meta};
use crate::inode::Ino;

impl FileSystem {
    /// Allocates the copies after `first` (`copies - 1` of them) for a block of `pool`,
    /// each in a failure group no other copy of the block uses. Returns fewer when `-K`
    /// allows it (see the module documentation). The caller holds the metadata lock.
    pub(crate) fn take_copies(
        &self,
        m: &mut Meta,
        pool: PoolId,
        first: Extent,
        copies: usize,
        hint: BlockHint,
        what: &'static str,
    ) -> FsResult<Vec<Extent>> {
        let strict = self.owner().replication.read().strict;
        let mut groups = vec![self.devices.failure_group(first.addr.disk)];
        let mut taken = Vec::new();
        for _ in 1..copies {
            let allowed = |d: DiskIndex| {
                !self.devices.is_down(d) && !groups.contains(&self.devices.failure_group(d))
            };
            match self.take_extent(m, pool, first.sub_blocks, hint, &allowed, what) {
                Ok(e) => {
                    groups.push(self.devices.failure_group(e.addr.disk));
                    taken.push(e);
                }
                Err(e @ FsError::NoSpace { .. }) => {
                    let other_group_up =
                        m.alloc.disks().iter().any(|d| {
                            d.pool == pool && d.holds_data && d.available && allowed(d.disk)
                        });
                    let fewer = match strict {
                        StrictReplication::No => true,
                        StrictReplication::WhenPossible => !other_group_up,
                        StrictReplication::Always => false,
                    };
                    if !fewer {
                        for t in taken {
                            m.unlogged.remove(&t);
                            let _ = m.alloc.free(t);
                        }
                        return Err(e);
                    }
                    self.warn_ill_replicated(pool, copies, 1 + taken.len());
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(taken)
    }

    /// Says (at most once a minute) that new blocks get fewer copies than asked.
    fn warn_ill_replicated(&self, pool: PoolId, wanted: usize, got: usize) {
        static LAST: parking_lot::Mutex<Option<std::time::Instant>> = parking_lot::Mutex::new(None);
        let mut last = LAST.lock();
        if last.is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(60)) {
            return;
        }
        *last = Some(std::time::Instant::now());
        tracing::warn!(
            "{}: new blocks in pool {} get {got} of {wanted} copies: no disk that is up and \
             takes new data is left in another failure group; the files are ill-replicated \
             until `tessera restripe {} -r` runs with the failure groups back",
            self.geo.fs_name,
            self.pool_name(pool),
            self.geo.fs_name,
        );
    }

    /// A disk stops taking I/O for the rest of the mount (its device is missing, failed a
    /// write or a flush, or an administrator stopped it).
    pub(crate) fn mark_down(&self, disk: DiskIndex, why: &str) {
        if self.devices.set_down(disk, true) {
            tracing::error!(
                "{}: NSD {} is down: {why}; its copies are read from the other failure \
                 groups and new blocks go elsewhere; after fixing it run `tessera disk change \
                 {} start -d {}` and `tessera restripe {} -r`",
                self.geo.fs_name,
                self.devices.name(disk),
                self.geo.fs_name,
                self.devices.name(disk),
                self.geo.fs_name,
            );
            // No allocator change here: the caller may hold the metadata lock (a flush
            // inside a checkpoint), and `take_extent` skips disks that are down anyway.
        }
    }

    /// Writes `good` (bytes at `rel` of block `b` of `ino`, verified on copy `from`
    /// against `sectors`) over the copies in `damaged`, which failed their checksums.
    /// Under the block's exclusive lock, and only while the block map still names those
    /// copies with the checksums the read verified against: a write that changed the
    /// sectors meanwhile put its own bytes on every copy. Failures are logged: the copy
    /// stays damaged and the next read tries again.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn repair_copies(
        &self,
        ino: Ino,
        b: u64,
        damaged: &[Extent],
        from: &Extent,
        rel: u64,
        good: &[u8],
        sectors: &[SectorInfo],
    ) {
        let _block = self.block_lock(ino, b).write();
        let now = match self.metanode_of(ino).view(ino, b..b + 1) {
            Ok(view) => view.block(b).cloned(),
            Err(_) => None,
        };
        let Some(now) = now else {
            return;
        };
        let end = rel + good.len() as u64;
        if crate::data::sector_infos(&now, rel, end).1 != sectors {
            return;
        }
        for extent in damaged {
            if !now.extents().any(|e| e == *extent) || self.devices.is_down(extent.addr.disk) {
                continue;
            }
            let dev = self.devices.get(extent.addr.disk);
            let at = self.extent_offset(extent) + rel;
            match dev.write_at(good, at) {
                Ok(()) => {
                    self.pmon.repaired_copy();
                    tracing::warn!(
                        "repaired inode {ino} block {b}: bytes {at}..{} of NSD {} written again \
                         from the copy on NSD {}",
                        at + good.len() as u64,
                        self.devices.name(extent.addr.disk),
                        self.devices.name(from.addr.disk),
                    )
                }
                Err(e) => tracing::error!(
                    "repairing inode {ino} block {b} on NSD {}: {e}",
                    self.devices.name(extent.addr.disk)
                ),
            }
        }
    }

    /// `readReplicaPolicy` [mmchconfig]: which copy of a replicated block reads try first.
    pub fn set_read_replica_policy(&self, policy: ReadReplicaPolicy) {
        self.read_policy
            .store(policy as u8, std::sync::atomic::Ordering::Relaxed);
    }

    /// The `readReplicaPolicy` in force (read on every read of a replicated block, hence
    /// an atomic rather than a lock).
    pub(crate) fn read_replica_policy(&self) -> ReadReplicaPolicy {
        match self.read_policy.load(std::sync::atomic::Ordering::Relaxed) {
            p if p == ReadReplicaPolicy::Local as u8 => ReadReplicaPolicy::Local,
            p if p == ReadReplicaPolicy::Fastest as u8 => ReadReplicaPolicy::Fastest,
            _ => ReadReplicaPolicy::Default,
        }
    }

    /// Which disks this node reaches through NSD servers, by NSD name (for
    /// `readReplicaPolicy=local`); the daemon says so after a mount.
    pub fn set_remote_disks(&self, nsds: &[String]) {
        self.devices.set_remote(nsds);
    }

    /// The order in which a read tries the copies of a block: as listed (`default`); the
    /// copies on disks this node reaches itself before those it reaches through NSD
    /// servers (`local`); or by their disks' recent read latency (`fastest`: a disk never
    /// measured first, so it gets measured, and every sixteenth read rotated so that the
    /// others keep being measured too).
    pub(crate) fn read_order(&self, copies: &[Extent]) -> Vec<Extent> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut order = copies.to_vec();
        if copies.len() < 2 {
            return order;
        }
        match self.read_replica_policy() {
            ReadReplicaPolicy::Default => {}
            ReadReplicaPolicy::Local => order.sort_by_key(|e| self.devices.is_remote(e.addr.disk)),
            ReadReplicaPolicy::Fastest => {
                order.sort_by_key(|e| self.devices.read_ns(e.addr.disk));
                let n = self.replica_reads.fetch_add(1, Relaxed);
                if n % 16 == 15 {
                    let turn = (n / 16) as usize % order.len();
                    order.rotate_left(turn);
                }
            }
        }
        order
    }

    /// Whether `disk` holds metadata of which it has the only copy (pages, the log, the
    /// allocation map, a descriptor, with one metadata copy): such a disk can never be
    /// down. With `-m 2` every piece of metadata has a copy in another failure group.
    pub(crate) fn holds_metadata(&self, disk: DiskIndex) -> bool {
        let desc = self.descriptor();
        if desc.metadata_copies.is_some() {
            return false;
        }
        desc.log.disk == disk
            || desc
                .disks
                .iter()
                .any(|d| d.index == disk && (d.usage.holds_metadata() || d.holds_descriptor))
    }

    /// Stops I/O to data disks [mmchdisk stop]: their copies are no longer read or
    /// written (writes drop them from the blocks they change) until [`Self::start_disks`];
    /// on the file system manager the stop is recorded in the descriptor, so that mounts
    /// from then on take the disks as down too. Refused for disks that hold metadata (with
    /// one metadata copy), and on file systems without replication.
    pub fn stop_disks(&self, nsds: &[String]) -> FsResult<Vec<DiskIndex>> {
        let disks = crate::disks::disk_indexes(&self.descriptor(), nsds)?;
        if !self.replicated() {
            return Err(FsError::Usage(format!(
                "{}: stopping a disk needs replication (-r 2 or -m 2 at fs create); use \
                 `disk change ... suspend` and `restripe -m` to move data off a disk",
                self.geo.fs_name
            )));
        }
        let data_copies = self
            .geo
            .data_copies
            .max(self.owner.as_ref().map_or(1, |o| o.replication.read().data));
        let desc = self.descriptor();
        for &d in &disks {
            let holds_data = desc
                .disks
                .iter()
                .any(|x| x.index == d && x.usage.holds_data());
            if holds_data && data_copies < 2 {
                return Err(FsError::Usage(format!(
                    "NSD {} holds data, which has one copy (-r 1): it cannot be stopped; \
                     suspend it and run restripe -m to move its contents off",
                    self.devices.name(d)
                )));
            }
            if self.holds_metadata(d) {
                return Err(FsError::Usage(format!(
                    "NSD {} holds metadata, which has one copy (-m 1): it cannot be stopped; \
                     suspend it and run restripe -m to move its contents off",
                    self.devices.name(d)
                )));
            }
        }
        // Writes that reached the disks before the stop sit in their caches, and the block
        // map names their copies; commits skip a disk that is down, so without this flush a
        // commit after the stop would make those names durable while a power loss could
        // still take the bytes (found by the crash loops with volatile caches). Under the
        // commit lock, so that no commit runs between the stop and the flush.
        let _commits = self.owner.as_ref().map(|o| o.commit_lock.lock());
        for &d in &disks {
            self.mark_down(d, "stopped by an administrator");
        }
        for &d in &disks {
            if let Err(e) = self.devices.get(d).flush() {
                tracing::warn!(
                    "{}: NSD {} failed the flush of its stop: {e}",
                    self.geo.fs_name,
                    self.devices.name(d)
                );
            }
        }
        drop(_commits);
        self.record_stopped(&disks, true)?;
        Ok(disks)
    }

    /// On the file system manager: records `disks` as stopped in the descriptor (or no
    /// longer), so that a mount from now on, on any node, takes them as down until they are
    /// started, as GPFS keeps a stopped disk's availability in its descriptor. Elsewhere
    /// (a node told by the manager) nothing: the manager wrote it.
    fn record_stopped(&self, disks: &[DiskIndex], stopped: bool) -> FsResult<()> {
        if self.owner.is_none() || self.owner_slot() != 0 {
            return Ok(());
        }
        let _m = self.owner().meta.lock();
        let _one = self.owner().checkpoint_lock.lock();
        let mut desc = self.owner().desc.lock().clone();
        let mut list = desc.stopped.take().unwrap_or_default();
        if stopped {
            list.extend(disks);
        } else {
            list.retain(|d| !disks.contains(d));
        }
        list.sort_unstable();
        list.dedup();
        desc.stopped = (!list.is_empty()).then_some(list);
        if desc.stopped == self.owner().desc.lock().stopped {
            return Ok(());
        }
        // Written to the disks that are up: a stopped one keeps its older copy, which a
        // mount never prefers to the newer generations on the others.
        self.write_descriptor(desc)
    }

    /// Starts disks again [mmchdisk start]: their copies are read and written again (every
    /// copy the block map still names is current; blocks written meanwhile have dropped
    /// theirs), and they take new data if their status is ready. `restripe -r` then
    /// gives the blocks written meanwhile their copies back.
    pub fn start_disks(&self, nsds: &[String]) -> FsResult<Vec<DiskIndex>> {
        let desc = self.descriptor();
        let disks = crate::disks::disk_indexes(&desc, nsds)?;
        for &d in &disks {
            // Read something: a device that is still gone stays down.
            let dev = self.devices.get(d);
            let mut probe = tessera_drive::AlignedBuf::zeroed(4096);
            if let Err(e) = dev.read_at(&mut probe, 0) {
                return Err(FsError::Io(std::io::Error::other(format!(
                    "NSD {} does not answer ({e}); it stays down",
                    self.devices.name(d)
                ))));
            }
        }
        for &d in &disks {
            if self.devices.set_down(d, false) {
                let ready = desc
                    .disks
                    .iter()
                    .any(|x| x.index == d && x.status == crate::descriptor::DiskStatus::Ready);
                if let Some(owner) = &self.owner {
                    let mut m = owner.meta.lock();
                    // A slot that let go of the disk for a delete has nothing to set.
                    if m.alloc.knows(d) {
                        m.alloc.set_available(d, ready);
                    }
                }
                tracing::info!(
                    "{}: NSD {} is up again; `tessera restripe {} -r` restores the copies \
                     written while it was down",
                    self.geo.fs_name,
                    self.devices.name(d),
                    self.geo.fs_name
                );
            }
        }
        if self.owner.is_some() {
            self.catch_up_log()?;
        }
        self.record_stopped(&disks, false)?;
        Ok(disks)
    }

    /// Whether each disk is up, by NSD name [mmlsdisk "availability"].
    pub fn disk_availability(&self) -> Vec<(String, bool)> {
        let down = self.devices.down_disks();
        self.devices
            .names()
            .into_iter()
            .enumerate()
            .filter(|(_, n)| !n.is_empty())
            .map(|(i, n)| (n, !down.contains(&(i as DiskIndex))))
            .collect()
    }

    /// Whether data or metadata on this file system can have more than one copy, so a disk
    /// that fails may be marked down instead of failing the I/O (when it holds nothing of
    /// which it has the only copy, see [`Self::holds_metadata`]).
    pub(crate) fn replicated(&self) -> bool {
        self.geo.data_copies > 1
            || self
                .owner
                .as_ref()
                .is_some_and(|o| o.desc.lock().metadata_copies.is_some())
            || self
                .owner
                .as_ref()
                .is_some_and(|o| o.replication.read().data > 1)
    }

    /// Copies of each data block new files get from now on [mmchfs -r]. Existing files
    /// keep the copy count they were made with (as in GPFS) until `file attr set
    /// --replication` changes it. Checked against `-R` and the failure groups of every
    /// pool's data disks, and committed in the descriptor.
    pub fn set_data_replication(&self, copies: u8) -> FsResult<()> {
        self.owner_here("changing the data replication")?;
        self.manager_here("changing the data replication")?;
        self.check_fenced()?;
        let desc = self.descriptor();
        check_copies(&desc, copies)?;
        self.change_descriptor(
            "changing the data replication",
            "unmount and mount the file system again, then change it again",
            |next| {
                let mut replication = next.replication();
                replication.data = copies;
                next.replication = Some(replication);
            },
        )?;
        self.owner().replication.write().data = copies;
        Ok(())
    }

    /// Turns metadata replication on for a live file system [mmchfs -m 2]: every metadata
    /// page, the recovery log and the allocation map get a second copy in another failure
    /// group. Under the metadata and checkpoint locks: a checkpoint makes the log's content
    /// durable; the allocation map gets its second regions and a new log is made with both
    /// copies (as when `restripe -m` moves the log); pages are written in the version with
    /// second addresses from then on; and a checkpoint commits the descriptor naming all of
    /// it. A crash before that descriptor is durable mounts with one copy as before (the new
    /// regions unreferenced and free). Pages already on disk keep one copy until `restripe
    /// -r` writes them again with two. Lowering it again is not implemented.
    pub fn set_metadata_replication(&self, copies: u8) -> FsResult<()> {
        self.owner_here("changing the metadata replication")?;
        self.manager_here("changing the metadata replication")?;
        self.check_writable()?;
        let desc = self.descriptor();
        let now = desc.metadata_replicas();
        if copies == now {
            return Ok(());
        }
        if copies < now {
            return Err(FsError::Usage(format!(
                "-m {copies}: lowering the metadata replication of a file system is not \
                 implemented; {} keeps {now} metadata copies",
                desc.name
            )));
        }
        if copies > 2 || u32::from(copies) > desc.max_metadata_replicas {
            return Err(FsError::Usage(format!(
                "-m {copies}: at most two metadata copies, and no more than the maximum set \
                 at create (-M {})",
                desc.max_metadata_replicas
            )));
        }
        let mut groups: Vec<i32> = desc
            .disks
            .iter()
            .filter(|d| {
                d.pool == 0
                    && d.usage.holds_metadata()
                    && d.status == crate::descriptor::DiskStatus::Ready
                    && !self.devices.is_down(d.index)
            })
            .map(|d| d.failure_group)
            .collect();
        groups.sort_unstable();
        groups.dedup();
        if groups.len() < 2 {
            return Err(FsError::Usage(format!(
                "-m 2: the ready metadata disks of {} are all in one failure group, and the two \
                 copies of the metadata go to different groups; add metadata disks in \
                 another failure group first (tessera disk add)",
                desc.name
            )));
        }
        let Some(stored) = desc.alloc_map.as_ref() else {
            return Err(FsError::Usage(format!(
                "{} does not store its allocation map yet (format version 3): mount it once, \
                 which converts it, then change the metadata replication",
                desc.name
            )));
        };
        let regions = stored.regions.clone();
        let mut m = self.owner().meta.lock();
        let _one = self.owner().checkpoint_lock.lock();
        self.checkpoint_under_lock(&mut m)?;
        let lsn = tessera_journal::page_start_at_or_after(self.journal().appended_lsn());
        let old = self.owner().desc.lock().clone();
        let mut next = old.clone();
        next.metadata_copies = Some(crate::descriptor::MetadataCopies {
            root_mirrors: Vec::new(),
            log_disk: old.log.disk,
            log_offset: old.log.region.offset,
            log_behind: None,
            map_regions: Vec::new(),
        });
        let second = crate::alloc_map::allocate_second_regions(
            &next,
            &self.devices,
            &mut m.alloc,
            &regions,
        )?;
        let second_extents = crate::alloc_map::region_extents_of(&next, &second);
        if let Some(c) = &mut next.metadata_copies {
            c.map_regions = second;
        }
        let (journal, log) = match self.create_log(&mut m, &mut next, &|_| true, lsn) {
            Ok(made) => made,
            Err(e) => {
                for x in second_extents {
                    m.alloc.free(x).expect("just allocated");
                }
                return Err(e);
            }
        };
        let old_log = crate::recovery::log_extents(&old);
        m.pending_free.extend(old_log.iter().map(|e| (0, *e)));
        // Both regions of every chunk current from the committing checkpoint on.
        m.alloc.mark_all_chunks_dirty();
        m.state.store_mut().mirror_from_now_on();
        *self.owner().desc.lock() = next;
        *self.owner().log_copies.write() = log;
        self.replace_journal(journal);
        self.commit_descriptor_change(
            &mut m,
            true,
            "turning metadata replication on",
            "the file system takes no more changes: unmount and mount it again (it comes back \
             with the metadata replication the durable descriptor names), then change it again",
        )?;
        tracing::info!(
            "{}: metadata replication on (-m 2); `tessera restripe {} -r` gives the metadata \
             already on disk its second copy",
            old.name,
            old.name
        );
        Ok(())
    }

    /// The copies a file's data blocks should have from now on [mmchattr -r]; logged.
    /// `restripe -r` then adds or drops copies of its existing blocks.
    pub fn set_file_replication(&self, ino: Ino, copies: u8) -> FsResult<()> {
        self.owner_here("changing a file's replication")?;
        self.check_writable()?;
        check_copies(&self.descriptor(), copies)?;
        let mut m = self.owner().meta.lock();
        let attr = m.state.attr(ino)?;
        if attr.kind != crate::inode::FileKind::Regular {
            return Err(FsError::Invalid(format!(
                "inode {ino} is not a regular file: only file data is replicated"
            )));
        }
        self.log(
            &mut m,
            vec![crate::meta::Change::SetReplicas { ino, copies }],
        )?;
        Ok(())
    }

    /// The copies a file asks for, and whether some block has fewer (or a copy on a disk
    /// that is down) [mmlsattr: "illreplicated"].
    pub fn file_replication(&self, ino: Ino) -> FsResult<(u8, bool)> {
        self.owner_here("reading a file's replication")?;
        let mut m = self.owner().meta.lock();
        let (kind, _, _, copies) = m.state.content_of(ino)?;
        if kind != crate::meta::ContentKind::Blocks {
            return Ok((copies, false));
        }
        let ill = m.state.blocks(ino, 0..u64::MAX)?.iter().any(|(_, b)| {
            b.copy_count() < usize::from(copies)
                || b.extents().any(|e| self.devices.is_down(e.addr.disk))
        });
        Ok((copies, ill))
    }
}

/// `copies` within `-R` and within the failure groups of every pool's data disks.
fn check_copies(desc: &crate::descriptor::FsDescriptor, copies: u8) -> FsResult<()> {
    let max = desc.max_data_replicas;
    if copies == 0 || u32::from(copies) > max {
        return Err(FsError::Usage(format!(
            "{copies} data copies: the number must be 1 to the file system's maximum (-R {max}, \
             set at fs create)"
        )));
    }
    let data_disks = desc.disks.iter().filter(|d| d.usage.holds_data());
    let fewest = fewest_groups(data_disks.map(|d| (desc.pool_name(d.pool), d.failure_group)));
    match fewest {
        Some((pool, groups)) if groups.len() < usize::from(copies) => Err(FsError::Usage(format!(
            "{copies} data copies: pool {pool} has data disks in {} failure group(s), \
                 and each copy of a block goes to a different one; add disks in other \
                 failure groups first (tessera disk add)",
            groups.len()
        ))),
        _ => Ok(()),
    }
}

/// Of `(pool, failure group)` for every data disk: the pool whose data disks span the
/// fewest failure groups, with those groups in order (`None` without data disks). A pool
/// can give its blocks at most that many copies.
pub(crate) fn fewest_groups<'a>(
    data_disks: impl Iterator<Item = (&'a str, i32)>,
) -> Option<(&'a str, Vec<i32>)> {
    let mut groups: std::collections::BTreeMap<&str, Vec<i32>> = Default::default();
    for (pool, group) in data_disks {
        let g = groups.entry(pool).or_default();
        if !g.contains(&group) {
            g.push(group);
        }
    }
    let (pool, mut fewest) = groups.into_iter().min_by_key(|(_, g)| g.len())?;
    fewest.sort_unstable();
    Some((pool, fewest))
}
