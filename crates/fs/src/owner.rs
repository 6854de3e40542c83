//! The shard owner's side of [`Metanode`] and [`BlockAllocator`], in this process: the node
//! that owns every shard (the single-node file system) serves its own data path.
//!
//! Every update a client sends is checked before it is logged: it may change only the
//! content of the one file it names, and only with the changes a data path makes. What the
//! owner decides itself (the new size as the largest any writer reached, the times from its
//! own clock) it decides here, under the metadata lock, so that writers of one file may
//! report in any order.

use std::ops::Range;

use tessera_alloc::{AllocKind, BlockHint, DiskIndex, Extent, PoolId};
use tessera_journal::Lsn;

use crate::descriptor::AtimeMode;
use crate::error::{FsError, FsResult};
use crate::fs::{FileSystem, Meta};
use crate::inode::{FileKind, Ino};
use crate::meta::{Change, ContentKind};
use crate::metanode::{BlockAllocator, Content, FileUpdate, FileView, Metanode, SizeUpdate, Times};

impl FileSystem {
    /// The manager's metanode as this node reaches it: itself on the file system manager,
    /// else the way to the manager (through the wire form on an owner that asked for it).
    #[cfg(test)]
    pub(crate) fn metanode(&self) -> &dyn Metanode {
        match self.remote.get() {
            Some(remote) => &**remote,
            None => self,
        }
    }

    /// The metanode of `ino`, as this node's data path reaches it: this mount's own
    /// state when its slot serves `ino`'s shard, else that slot's owner (the file system
    /// manager for slot 0) over its channel (see [`FileSystem::route`]).
    pub(crate) fn metanode_of(&self, ino: Ino) -> &dyn Metanode {
        match self.route(ino) {
            crate::fs::Route::Here => self,
            crate::fs::Route::There(remote) => remote,
        }
    }

    /// Where this node's data path allocates blocks of `ino`: in the allocation regions of
    /// the slot that serves its shard, so that a shard's blocks lie in its slot's regions
    /// and whoever frees them frees them in its own map.
    pub(crate) fn allocator_of(&self, ino: Ino) -> &dyn BlockAllocator {
        match self.route(ino) {
            crate::fs::Route::Here => self,
            crate::fs::Route::There(remote) => remote,
        }
    }

    /// Refuses a data allocation that would eat into the space kept for metadata pages
    /// on disks that hold both: a checkpoint (at unmount, too) needs fresh pages, and a data
    /// pool filled to the last sub-block must not stop it.
    fn keep_metadata_reserve(
        &self,
        m: &Meta,
        pool: PoolId,
        sub_blocks: u32,
        what: &'static str,
    ) -> FsResult<()> {
        let reserve = self
            .owner()
            .metadata_reserve_sub_blocks
            .load(std::sync::atomic::Ordering::Relaxed);
        // Only the system pool holds metadata pages.
        if reserve == 0 || pool != 0 {
            return Ok(());
        }
        // Only disks that take new pages count: with a disk suspended or being emptied (a
        // restripe moving its data to the others), its free space is no room for pages, and
        // counting it let data fill the ready disks to the last block, so that the next
        // checkpoint found no page at all.
        let space = m.alloc.allocatable_space(0, AllocKind::Metadata);
        let free = space.blocks_free * u64::from(self.geo.sub_blocks_per_block)
            + space.sub_blocks_free_in_fragments;
        if free < reserve + u64::from(sub_blocks) {
            return Err(FsError::NoSpace {
                pool: self.pool_name(pool),
                what,
            });
        }
        Ok(())
    }

    fn try_allocate(
        &self,
        pool: PoolId,
        sub_blocks: u32,
        hint: BlockHint,
        what: &'static str,
    ) -> FsResult<Extent> {
        let mut m = self.owner().meta.lock();
        self.keep_metadata_reserve(&m, pool, sub_blocks, what)?;
        self.take_extent(&mut m, pool, sub_blocks, hint, &|_| true, what)
    }

    /// A block (or a fragment of `sub_blocks`) of data space on a disk `allowed` accepts,
    /// held as the caller's alone until an update maps it (see `Meta::unlogged`).
    pub(crate) fn take_extent(
        &self,
        m: &mut Meta,
        pool: PoolId,
        sub_blocks: u32,
        hint: BlockHint,
        allowed: &dyn Fn(DiskIndex) -> bool,
        what: &'static str,
    ) -> FsResult<Extent> {
        // Disks that went down during this mount (a failed write or flush, `disk change
        // stop`) take nothing new; the allocator learns of it only here, since marking a
        // disk down must not wait for the metadata lock.
        let up = |d: DiskIndex| allowed(d) && !self.devices.is_down(d);
        let extent = if sub_blocks == self.geo.sub_blocks_per_block {
            m.alloc.alloc_block_on(pool, AllocKind::Data, hint, &up)
        } else {
            m.alloc
                .alloc_fragment_on(pool, AllocKind::Data, sub_blocks, hint.prev, &up)
        }
        .map_err(|e| FsError::from_alloc(e, &self.pool_name(pool), what))?;
        m.unlogged.insert(extent);
        Ok(extent)
    }

    pub(crate) fn has_pending_frees(&self) -> bool {
        !self.owner().meta.lock().pending_free.is_empty()
    }

    /// Whether unlinked files are kept for other nodes' lookups (`Meta::lingering`).
    fn has_lingering(&self) -> bool {
        !self.owner().meta.lock().lingering.is_empty()
    }
}

/// Whether `change` is one a data path may send for `ino`.
fn content_change_of(change: &Change, ino: Ino) -> bool {
    let of = match change {
        Change::MapBlock { ino, .. }
        | Change::MapCopies { ino, .. }
        | Change::DropCopies { ino, .. }
        | Change::Sectors { ino, .. }
        | Change::Settle { ino, .. }
        | Change::Revert { ino, .. }
        | Change::Unmap { ino, .. }
        | Change::Inline { ino, .. }
        | Change::Truncate { ino, .. } => *ino,
        _ => return false,
    };
    of == ino
}

impl Metanode for FileSystem {
    fn view(&self, ino: Ino, blocks: Range<u64>) -> FsResult<FileView> {
        let mut m = self.owner().meta.lock();
        let attr = m.state.attr(ino)?;
        let (kind, inline, pool, copies) = m.state.content_of(ino)?;
        let content = match kind {
            ContentKind::Inline => Content::Inline(inline.unwrap_or_default()),
            ContentKind::Blocks => Content::Blocks(m.state.blocks(ino, blocks)?),
            ContentKind::Dir | ContentKind::None => Content::None,
        };
        Ok(FileView {
            attr,
            pool: pool.unwrap_or(self.geo.data_pool),
            copies,
            content,
        })
    }

    fn update(&self, ino: Ino, update: FileUpdate) -> FsResult<Lsn> {
        if let Some(c) = update.changes.iter().find(|c| !content_change_of(c, ino)) {
            return Err(FsError::Invalid(format!(
                "a data path may change only the content of inode {ino}, not send {c:?}"
            )));
        }
        let mut changes = update.changes;
        let mut m = self.owner().meta.lock();
        refuse_space_not_given(&mut m, ino, &changes)?;
        let mut attr = m.state.attr(ino)?;
        if attr.kind != FileKind::Regular {
            return Err(if attr.kind == FileKind::Directory {
                FsError::IsDir
            } else {
                FsError::Invalid(format!("inode {ino} is not a regular file"))
            });
        }
        if update.size != SizeUpdate::Keep || update.times != Times::Keep {
            match update.size {
                SizeUpdate::Keep => {}
                SizeUpdate::AtLeast(end) => attr.size = attr.size.max(end),
                SizeUpdate::Exactly(size) => attr.size = size,
            }
            match update.times {
                Times::Keep => {}
                Times::Modified => {
                    attr.mtime = self.now();
                    attr.ctime = attr.mtime;
                }
                Times::ModifiedAt(at) => {
                    attr.mtime = at;
                    attr.ctime = at;
                }
                Times::Changed => attr.ctime = self.now(),
            }
            changes.push(Change::PutAttr(attr));
        }
        if changes.is_empty() {
            return Ok(0);
        }
        self.log(&mut m, changes)
    }

    fn commit(&self, lsn: Lsn) -> FsResult<()> {
        FileSystem::commit(self, lsn)
    }

    fn commit_data(&self, lsn: Lsn, disks: &[u16]) -> FsResult<()> {
        FileSystem::commit_data(self, lsn, disks)
    }

    fn accessed(&self, ino: Ino) {
        if self.geo.atime == AtimeMode::Suppress {
            return;
        }
        let mut m = self.owner().meta.lock();
        let Ok(Some(mut attr)) = m.state.find_attr(ino) else {
            return;
        };
        let now = self.now();
        if !self.atime_due(&attr, now) {
            return;
        }
        attr.atime = now;
        if let Err(e) = self.log(&mut m, vec![Change::PutAttr(attr)]) {
            tracing::warn!("atime update of inode {ino}: {e}");
        }
    }
}

impl FileSystem {
    /// Whether a read at `now` of a file with `attr` changes its access time under the
    /// mount's atime mode (relatime: only an atime older than the last change or a day).
    pub(crate) fn atime_due(
        &self,
        attr: &crate::inode::Attr,
        now: crate::inode::Timestamp,
    ) -> bool {
        match self.geo.atime {
            AtimeMode::Suppress => false,
            AtimeMode::Relatime => {
                attr.atime <= attr.mtime
                    || attr.atime <= attr.ctime
                    || now.secs - attr.atime.secs >= 24 * 3600
            }
            AtimeMode::Update => true,
        }
    }

    /// Applies what a fenced client handed over (its answer to `Fence::request`, see
    /// `RemoteMetanode::fence`): the updates a dead owner acknowledged to it and may not
    /// have made durable, in order, then commits them. Runs before this owner serves
    /// anyone, so the space they map is either free here (the dead owner gave it out and
    /// its log lost that) or already mapped where they say (it was durable); space mapped
    /// anywhere else refuses that update. Returns how many updates were applied; an
    /// update that cannot be applied (its file was removed meanwhile, or a conflict) is
    /// logged and makes the result an error, so that the client's next fsync says so.
    pub fn replay_fenced(
        &self,
        reply: &[u8],
        origin: Option<crate::locks::Origin>,
    ) -> FsResult<usize> {
        use crate::metanode_wire::{decode, HandedChange, MetanodeReply};
        self.owner_here("applying a fenced client's updates")?;
        let updates = |updates: Vec<(Ino, FileUpdate)>| {
            updates
                .into_iter()
                .map(|(ino, update)| HandedChange::Update { ino, update })
                .collect::<Vec<_>>()
        };
        let (changes, locks, open) = match decode::<MetanodeReply>(reply, "fence answer")? {
            MetanodeReply::Done => return Ok(0),
            MetanodeReply::Replay(u) => (updates(u), Vec::new(), Vec::new()),
            MetanodeReply::ReplayChanges(changes) => (changes, Vec::new(), Vec::new()),
            MetanodeReply::Handover {
                updates: u,
                locks,
                open,
            } => (updates(u), locks, open),
            MetanodeReply::HandoverChanges {
                changes,
                locks,
                open,
            } => (changes, locks, open),
            MetanodeReply::Failed(e) => return Err(e.into()),
            other => {
                return Err(FsError::Invalid(format!(
                    "a fenced client answered {other:?}"
                )))
            }
        };
        self.hold_handed_over_locks(locks, origin);
        let mut m = self.owner().meta.lock();
        for (ino, count) in open {
            *m.open.entry(ino).or_insert(0) += count;
        }
        drop(m);
        let mut failed = 0usize;
        let count = changes.len();
        for change in changes {
            match change {
                HandedChange::Update { ino, update } => {
                    if matches!(self.owner().meta.lock().state.find_attr(ino), Ok(None)) {
                        // Removed by a change that is durable (one the dead owner lost
                        // would have left it): nothing left to update.
                        tracing::debug!("inode {ino}: a handed-over update of a removed file");
                        continue;
                    }
                    if let Err(e) = self.replay_update(ino, update) {
                        tracing::error!(
                            "inode {ino}: a fenced client's update cannot be applied: {e}"
                        );
                        failed += 1;
                    }
                }
                HandedChange::Namespace { request, lsn, made } => {
                    if let Err(e) = self.replay_namespace(request, lsn, made) {
                        tracing::error!(
                            "a namespace change a fenced client handed over cannot be done \
                             again: {e}"
                        );
                        failed += 1;
                    }
                }
            }
        }
        self.sync_own()?;
        if failed > 0 {
            return Err(FsError::Io(std::io::Error::other(format!(
                "{failed} of {count} updates a client handed over after a takeover could not \
                 be applied"
            ))));
        }
        Ok(count)
    }

    /// Holds the locks a fenced client's processes had from the dead owner, before this
    /// owner serves anyone: none can conflict (the old owner granted them all), so a
    /// takeover never lets two processes into one locked range.
    fn hold_handed_over_locks(
        &self,
        locks: Vec<(Ino, crate::locks::Lock)>,
        origin: Option<crate::locks::Origin>,
    ) {
        let mut table = self.owner().locks.lock();
        let count = locks.len();
        for (ino, mut lock) in locks {
            // A data token its holder gathered writes under stays marked (`write_behind.rs`).
            if table.restore_gathering(ino, &mut lock) {
                if let Some(node) = origin {
                    let others = self.owner().meta.holders.start_gathering(ino, node);
                    debug_assert!(others.is_empty(), "a new owner has no read holders yet");
                }
            }
            if let Err(e) = table.set(ino, lock, origin) {
                tracing::error!("inode {ino}: a lock a client handed over is not held: {e:?}");
            }
        }
        tracing::info!("{count} locks of a fenced client held from now on");
    }

    /// Does again a namespace change a dead owner answered before it was durable
    /// (`early_answer.rs`), unless its log record (ending at `lsn`) survived: this owner's
    /// open of the log found it, and checkpoints may have taken it since. With the same
    /// client and number, so a retry is answered as done, and a `Make` under the inode
    /// number the client was told. The opens and locks it made come with the client's
    /// handover instead, so it neither opens nor keeps a data token here.
    fn replay_namespace(
        &self,
        request: crate::metanode_wire::MetanodeRequest,
        lsn: Lsn,
        made: Option<Ino>,
    ) -> FsResult<()> {
        use crate::metanode_wire::{MetanodeReply, MetanodeRequest as Q};
        let (
            true,
            Q::Once {
                client,
                seq,
                request: mut inner,
            },
        ) = (crate::early_answer::answered_early(&request), request)
        else {
            return Err(FsError::Invalid(
                "a fenced client handed over a request no owner answers before its commit".into(),
            ));
        };
        if lsn <= self.journal().opened_end()
            || self.owner().meta.lock().state.was_answered(client, seq)
        {
            return Ok(());
        }
        if let Q::Make { node, .. } = &mut *inner {
            node.open = false;
            node.keep_data = None;
        }
        crate::early_answer::MAKE_AS.set(made);
        crate::fs::ANSWERING.set(Some((client, seq)));
        let reply = crate::metanode_wire::serve(self, *inner);
        crate::fs::ANSWERING.set(None);
        crate::early_answer::MAKE_AS.set(None);
        match reply {
            MetanodeReply::Failed(e) => Err(e.into()),
            MetanodeReply::Attr(a) if made.is_some_and(|m| m != a.ino) => Err(FsError::Corrupt(
                format!("made again as inode {}, not {made:?}", a.ino),
            )),
            _ => Ok(()),
        }
    }

    fn replay_update(&self, ino: Ino, update: FileUpdate) -> FsResult<()> {
        let mut claimed = Vec::new();
        {
            let mut m = self.owner().meta.lock();
            let mapping = update.changes.iter().filter_map(Change::mapped_block);
            for (of, index, extent) in
                mapping.flat_map(|(of, index, b)| b.extents().map(move |e| (of, index, e)))
            {
                match m.alloc.mark_used(extent) {
                    Ok(()) => {
                        m.unlogged.insert(extent);
                        claimed.push(extent);
                    }
                    Err(tessera_alloc::AllocError::AlreadyUsed { .. }) => {
                        let mapped = m.state.blocks(of, index..index + 1)?;
                        if !mapped.iter().any(|(_, r)| r.extents().any(|e| e == extent)) {
                            for e in claimed.drain(..) {
                                m.unlogged.remove(&e);
                                let _ = m.alloc.free(e);
                            }
                            return Err(FsError::Corrupt(format!(
                                "the update maps {extent:?} as block {index} of inode {of}, \
                                 but that space is in use elsewhere"
                            )));
                        }
                    }
                    Err(e) => return Err(FsError::Corrupt(format!("{extent:?}: {e}"))),
                }
            }
        }
        Metanode::update(self, ino, update)
            .map(|_| ())
            .inspect_err(|_| {
                for e in claimed {
                    BlockAllocator::abandon(self, e);
                }
            })
    }
}

/// Refuses an update that maps space this owner has not given out and that the block does
/// not map already: the writer holds it from an owner since replaced, or a grant it gave
/// back, and this owner may have given it to another file meanwhile (it held it free), so
/// logging the map would leave two files on the same space. Checked under the metadata
/// lock that gives space out, and answered as a moved owner: the data path plans and
/// writes the block again with space from here (`data.rs`, `OWNER_MOVES_MAX`).
fn refuse_space_not_given(m: &mut crate::fs::Meta, ino: Ino, changes: &[Change]) -> FsResult<()> {
    for (of, index, block) in changes.iter().filter_map(Change::mapped_block) {
        let mut now = None;
        for e in block.extents() {
            if m.unlogged.contains(&e) {
                continue;
            }
            let mapped = match &now {
                Some(mapped) => mapped,
                None => now.insert(m.state.blocks(of, index..index + 1)?),
            };
            if !mapped.iter().any(|(_, r)| r.extents().any(|x| x == e)) {
                tracing::error!(
                    "inode {ino}: an update maps {e:?} as block {index} of inode {of}, space \
                     this owner did not give out; refused (the writer starts the block again)"
                );
                return Err(FsError::OwnerMoved);
            }
        }
    }
    Ok(())
}

impl BlockAllocator for FileSystem {
    fn allocate(
        &self,
        pool: PoolId,
        sub_blocks: u32,
        hint: BlockHint,
        what: &'static str,
    ) -> FsResult<Extent> {
        let tried = match self.try_allocate(pool, sub_blocks, hint, what) {
            Err(FsError::NoSpace { .. }) if self.has_pending_frees() || self.has_lingering() => {
                // Files kept a moment for other nodes' lookups give their space to a writer
                // that needs it; space freed by changes not yet durable comes back after a
                // commit.
                self.free_lingering(true)?;
                self.sync_own()?;
                self.try_allocate(pool, sub_blocks, hint, what)
            }
            other => other,
        };
        match tried {
            // A slot's regions are full: the manager may have another to give.
            Err(full @ FsError::NoSpace { .. }) => self.allocate_in_another_region(full, &|| {
                self.try_allocate(pool, sub_blocks, hint, what)
            }),
            other => other,
        }
    }

    fn allocate_copies(
        &self,
        pool: PoolId,
        sub_blocks: u32,
        hint: BlockHint,
        copies: u8,
        what: &'static str,
    ) -> FsResult<Vec<Extent>> {
        let first = BlockAllocator::allocate(self, pool, sub_blocks, hint, what)?;
        if copies <= 1 {
            return Ok(vec![first]);
        }
        let others = {
            let mut m = self.owner().meta.lock();
            self.take_copies(&mut m, pool, first, usize::from(copies), hint, what)
        };
        match others {
            Ok(others) => Ok(std::iter::once(first).chain(others).collect()),
            Err(e) => {
                BlockAllocator::abandon(self, first);
                Err(e)
            }
        }
    }

    fn allocate_on(
        &self,
        pool: PoolId,
        sub_blocks: u32,
        hint: BlockHint,
        allowed: &dyn Fn(DiskIndex) -> bool,
        what: &'static str,
    ) -> FsResult<Extent> {
        let mut m = self.owner().meta.lock();
        self.take_extent(&mut m, pool, sub_blocks, hint, allowed, what)
    }

    fn abandon(&self, extent: Extent) {
        let mut m = self.owner().meta.lock();
        if m.unlogged.remove(&extent) {
            let _ = m.alloc.free(extent);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use tessera_drive::{BlockDevice, FileDrive};
    use tessera_nsd::descriptor::{write_descriptor, NsdDescriptor};
    use tessera_nsd::{DiskUsage, NsdId};

    use super::*;
    use crate::format::{format, DiskSpec, FormatOptions};
    use crate::inode::{Alternative, ROOT_INO};
    use crate::namespace::Caller;

    const DISK_BYTES: u64 = 64 << 20;

    /// A small fresh file system on four file-backed disks in `dir`.
    pub(crate) fn mounted(dir: &Path) -> Arc<FileSystem> {
        let mut disks: Vec<(NsdId, Arc<dyn BlockDevice>)> = Vec::new();
        let mut specs = Vec::new();
        for i in 0..2 {
            let path = dir.join(format!("d{i}"));
            std::fs::File::create(&path)
                .unwrap()
                .set_len(DISK_BYTES)
                .unwrap();
            let dev: Arc<dyn BlockDevice> = Arc::new(FileDrive::open(&path).unwrap());
            let id = NsdId::random();
            let nd = NsdDescriptor {
                id,
                name: format!("nsd{i}"),
                device_bytes: DISK_BYTES,
                created_unix: 0,
                cluster_id: [0; 16],
            };
            write_descriptor(dev.as_ref(), &nd).unwrap();
            specs.push(DiskSpec {
                nsd_name: format!("nsd{i}"),
                nsd_id: id,
                usage: DiskUsage::DataAndMetadata,
                failure_group: i + 1,
                pool: "system".into(),
                device: dev.clone(),
            });
            disks.push((id, dev));
        }
        let opts = FormatOptions {
            block_size: 256 << 10,
            log_bytes: 4 << 20,
            max_inodes: 1000,
            ..Default::default()
        };
        format(specs, &opts, &mut |_| {}).unwrap();
        FileSystem::mount(disks).unwrap()
    }

    fn create(fs: &FileSystem, name: &[u8]) -> crate::inode::Attr {
        let root = Caller { uid: 0, gid: 0 };
        fs.create_node(ROOT_INO, name, FileKind::Regular, 0o644, 0, root, None)
            .unwrap()
    }

    #[test]
    fn an_update_may_change_only_the_content_of_the_file_it_names() {
        let dir = tempfile::tempdir().unwrap();
        let fs = mounted(dir.path());
        let (a, b) = (create(&fs, b"a"), create(&fs, b"b"));
        let before = fs.getattr(a.ino).unwrap();

        // A change of another file's content, sent as an update of `a`.
        let other = Change::Inline {
            ino: b.ino,
            data: b"x".to_vec(),
        };
        let e = fs
            .metanode()
            .update(a.ino, FileUpdate::written(vec![other], 1))
            .unwrap_err();
        assert!(e.to_string().contains(&format!("inode {}", a.ino)), "{e}");
        // A namespace change, which only the owner's own operations make.
        let mut attr = before;
        attr.uid = 1000;
        let e = fs
            .metanode()
            .update(a.ino, FileUpdate::content(vec![Change::PutAttr(attr)]))
            .unwrap_err();
        assert!(matches!(e, FsError::Invalid(_)), "{e}");
        // Content changes of a directory.
        let e = fs
            .metanode()
            .update(ROOT_INO, FileUpdate::written(Vec::new(), 10))
            .unwrap_err();
        assert!(matches!(e, FsError::IsDir), "{e}");
        // Nothing of the refused updates took effect.
        assert_eq!(fs.getattr(a.ino).unwrap(), before);
        assert_eq!(fs.getattr(b.ino).unwrap().size, 0);
        fs.unmount().unwrap();
    }

    #[test]
    fn sizes_merge_to_the_largest_a_writer_reached_and_truncate_sets_it() {
        let dir = tempfile::tempdir().unwrap();
        let fs = mounted(dir.path());
        let f = create(&fs, b"f");
        let m = fs.metanode();
        // Two writers report out of order: the file ends where the farther one wrote.
        m.update(f.ino, FileUpdate::written(Vec::new(), 300))
            .unwrap();
        m.update(f.ino, FileUpdate::written(Vec::new(), 100))
            .unwrap();
        assert_eq!(m.view(f.ino, 0..0).unwrap().attr.size, 300);
        let shrink = FileUpdate {
            changes: Vec::new(),
            size: SizeUpdate::Exactly(50),
            times: Times::Modified,
        };
        let lsn = m.update(f.ino, shrink).unwrap();
        m.commit(lsn).unwrap();
        assert_eq!(fs.getattr(f.ino).unwrap().size, 50);
        // An update with nothing to change logs nothing.
        assert_eq!(m.update(f.ino, FileUpdate::content(Vec::new())).unwrap(), 0);
        fs.unmount().unwrap();
    }

    /// An in-place write's pending alternative stays beside the block's reference until it
    /// settles, is handed out with the reference all the while, and goes into the reference
    /// when a checkpoint comes first (a crash after that checkpoint replays no `Sectors`).
    #[test]
    fn pending_alternatives_reach_the_tree_only_through_a_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let fs = mounted(dir.path());
        let f = create(&fs, b"f");
        fs.write(f.ino, 0, &vec![7u8; 64 << 10], false).unwrap();
        fs.sync().unwrap();
        let in_tree = |fs: &FileSystem| {
            let mut m = fs.owner().meta.lock();
            let s = m.state.shard_of(f.ino);
            let state = &mut m.state;
            let tree = state.shards[s]
                .as_mut()
                .expect("the owner holds every shard");
            let block = tree.block(&mut state.store, f.ino, 0).unwrap();
            block.unwrap().pending
        };
        let handed_out = |fs: &FileSystem| {
            fs.metanode()
                .view(f.ino, 0..1)
                .unwrap()
                .block(0)
                .unwrap()
                .pending
                .clone()
        };
        let before = handed_out(&fs);
        assert!(before.is_empty());
        let old_crc = fs
            .metanode()
            .view(f.ino, 0..1)
            .unwrap()
            .block(0)
            .unwrap()
            .crcs[2];
        let sectors = |first: u32| Change::Sectors {
            ino: f.ino,
            index: 0,
            first,
            crcs: vec![0xdead_beef],
            in_place: true,
        };
        let settle = |first: u32| Change::Settle {
            ino: f.ino,
            index: 0,
            first,
            count: 1,
        };
        let m = fs.metanode();

        // Logged and settled before any checkpoint: the tree never sees it.
        m.update(f.ino, FileUpdate::content(vec![sectors(2)]))
            .unwrap();
        let want = std::collections::BTreeMap::from([(2, Alternative::Crc(old_crc))]);
        assert_eq!(handed_out(&fs), want);
        assert!(in_tree(&fs).is_empty());
        m.update(f.ino, FileUpdate::content(vec![settle(2)]))
            .unwrap();
        assert!(handed_out(&fs).is_empty());
        assert!(in_tree(&fs).is_empty());

        // A checkpoint between the two moves it into the reference; the settle takes it
        // out of there.
        let old_crc = fs
            .metanode()
            .view(f.ino, 0..1)
            .unwrap()
            .block(0)
            .unwrap()
            .crcs[5];
        m.update(f.ino, FileUpdate::content(vec![sectors(5)]))
            .unwrap();
        fs.checkpoint().unwrap();
        let want = std::collections::BTreeMap::from([(5, Alternative::Crc(old_crc))]);
        assert_eq!(in_tree(&fs), want);
        assert_eq!(handed_out(&fs), want);
        m.update(f.ino, FileUpdate::content(vec![settle(5)]))
            .unwrap();
        assert!(in_tree(&fs).is_empty());
        assert!(handed_out(&fs).is_empty());

        // Truncating the file away drops what never settled.
        m.update(f.ino, FileUpdate::content(vec![sectors(9)]))
            .unwrap();
        fs.truncate(f.ino, 0).unwrap();
        fs.write(f.ino, 0, &vec![1u8; 64 << 10], false).unwrap();
        assert!(handed_out(&fs).is_empty());
        fs.unmount().unwrap();
    }
}
