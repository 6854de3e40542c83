//! The interface between a client's data path and the metanode of a file, and the one
//! between the data path and the block allocator.
//!
//! GPFS splits a node's work on a file in two: the metanode of the file (here: the owner of
//! the file's inode shard) alone changes its inode and block map and logs those changes in
//! its shard's journal; every node that reads or writes the file moves the data between
//! the application and the disks itself. The data path (`data.rs`) reaches the metadata
//! only through [`Metanode`] and allocates only through [`BlockAllocator`], so that the same
//! data path works whether the owner is this node (the in-process implementation in
//! `owner.rs`, the single-node file system) or another node (the cluster transport, later):
//! a single-node file system is the one-node case of the cluster, not a second code path.
//!
//! The rules the data path keeps, which make every request safe to send over a network:
//! - it never decides anything from metadata it does not hold a lock for: what a
//!   [`FileView`] says about a block stays true while the caller holds that block's lock
//!   (exclusive to change the extent), and about the inline content while it holds the
//!   inode lock exclusively;
//! - it sends results, not intentions: the checksums of sectors it wrote, the extent it
//!   filled, the size the file reaches; the metanode merges sizes (the largest wins) and
//!   sets the times, as GPFS's metanode merges the updates of several writers;
//! - data that no durable metadata references yet is written before its update is sent;
//!   data overwriting acknowledged sectors is written only after the update carrying its
//!   new checksums is durable ([`Metanode::commit`]).

use std::ops::Range;

use serde::{Deserialize, Serialize};

use tessera_alloc::{BlockHint, DiskIndex, Extent, PoolId};
use tessera_journal::Lsn;

use crate::error::FsResult;
use crate::inode::{Attr, BlockRef, FileKind, Ino};
use crate::meta::Change;

/// What a client knows of a file for one request: its attributes, the pool its data goes
/// to, and its content (the requested part of the block map, or the inline bytes).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct FileView {
    pub attr: Attr,
    pub pool: PoolId,
    /// Copies each new block of the file gets (data replication; 1 without).
    pub copies: u8,
    pub content: Content,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Content {
    /// A small file's bytes, kept in its inode.
    Inline(Vec<u8>),
    /// The mapped blocks asked for, in index order (holes are absent).
    Blocks(Vec<(u64, BlockRef)>),
    /// A directory, symlink without inline target, or special file: no data.
    None,
}

impl FileView {
    pub fn is_inline(&self) -> bool {
        matches!(self.content, Content::Inline(_))
    }

    /// The same view with only the mapped blocks whose indexes fall in `blocks` (the
    /// view of a wider range, cut to what a caller asked).
    pub fn within(&self, blocks: &Range<u64>) -> FileView {
        let content = match &self.content {
            Content::Blocks(all) => Content::Blocks(
                all.iter()
                    .filter(|(i, _)| blocks.contains(i))
                    .cloned()
                    .collect(),
            ),
            other => other.clone(),
        };
        FileView {
            attr: self.attr,
            pool: self.pool,
            copies: self.copies,
            content,
        }
    }

    /// The mapped block `index`, if the view holds it.
    pub fn block(&self, index: u64) -> Option<&BlockRef> {
        match &self.content {
            Content::Blocks(blocks) => blocks.iter().find(|(i, _)| *i == index).map(|(_, r)| r),
            _ => None,
        }
    }
}

/// How an update changes the file's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum SizeUpdate {
    Keep,
    /// A write reached this size: the file grows to it, never shrinks (writers of one file
    /// may report in any order).
    AtLeast(u64),
    /// Truncate or extend to exactly this size.
    Exactly(u64),
}

/// Which times an update sets to the metanode's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Times {
    Keep,
    /// Data changed: mtime and ctime.
    Modified,
    /// Only the inode changed (fallocate): ctime.
    Changed,
    /// Data changed at this time: written back from memory (`write_behind.rs`), it
    /// stamps mtime and ctime with when the write was made, not when it landed.
    ModifiedAt(crate::inode::Timestamp),
}

/// One update of one file, logged and applied by its metanode as one journal record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct FileUpdate {
    /// Changes of the file's content only: `MapBlock`, `Sectors`, `Settle`, `Revert`,
    /// `Unmap`, `Inline`, `Truncate`, each naming this file.
    pub changes: Vec<Change>,
    pub size: SizeUpdate,
    pub times: Times,
}

impl FileUpdate {
    pub fn content(changes: Vec<Change>) -> FileUpdate {
        FileUpdate {
            changes,
            size: SizeUpdate::Keep,
            times: Times::Keep,
        }
    }

    /// Data written up to byte `end` of the file.
    pub fn written(changes: Vec<Change>, end: u64) -> FileUpdate {
        FileUpdate {
            changes,
            size: SizeUpdate::AtLeast(end),
            times: match crate::write_behind::WRITE_TIME.get() {
                Some(at) => Times::ModifiedAt(at),
                None => Times::Modified,
            },
        }
    }
}

/// The metanode of a file, as its data path sees it.
pub(crate) trait Metanode: Send + Sync {
    /// The file's attributes, pool and content, with the mapped blocks whose indexes fall
    /// in `blocks` (an empty range asks for none).
    fn view(&self, ino: Ino, blocks: Range<u64>) -> FsResult<FileView>;

    /// [`Metanode::view`] for a read: a metanode on another node may answer it from a
    /// view of more blocks that it asked for a sequential reader.
    fn view_to_read(&self, ino: Ino, blocks: Range<u64>) -> FsResult<FileView> {
        self.view(ino, blocks)
    }

    /// Logs and applies `update`; returns the log position that makes it durable.
    fn update(&self, ino: Ino, update: FileUpdate) -> FsResult<Lsn>;

    /// Makes every update up to `lsn` durable (the data written before them first).
    fn commit(&self, lsn: Lsn) -> FsResult<()>;

    /// Makes the updates up to `lsn` and the data on `disks` durable: a synchronous write
    /// whose update is already durable needs only its data flushed.
    fn commit_data(&self, lsn: Lsn, disks: &[u16]) -> FsResult<()>;

    /// A read of the file happened: its access time moves as the file system's atime mode
    /// (`-S`) says. Failures are logged, never returned to the reader.
    fn accessed(&self, ino: Ino);

    /// Which owner the metanode is (see `MetanodeChannel::generation`): it changes when
    /// the owner dies and another node takes over. Always 0 on the owner itself.
    fn generation(&self) -> u64 {
        0
    }

    /// [`Metanode::update`], built on what the owner of generation `seen` showed or gave:
    /// [`crate::FsError::OwnerMoved`] without sending if the owner changed since (the new
    /// one may have given the same space to another file).
    fn update_seen(&self, ino: Ino, update: FileUpdate, _seen: u64) -> FsResult<Lsn> {
        self.update(ino, update)
    }

    /// Runs `write`, a data write into space the owner of generation `seen` gave out or
    /// showed mapped, unless the owner changed since ([`crate::FsError::OwnerMoved`]); a
    /// new owner's fence waits for the writes in flight (`RemoteMetanode::fence`).
    fn write_seen(
        &self,
        _seen: u64,
        write: &mut dyn FnMut() -> std::io::Result<()>,
    ) -> FsResult<()> {
        write()?;
        Ok(())
    }
}

/// Where the data path gets its blocks. An extent given out is the caller's alone until an
/// update maps it ([`Metanode::update`] with `MapBlock`) or it is given back with
/// [`BlockAllocator::abandon`]; a crash before either leaks nothing (the next mount finds
/// the extent unreferenced, hence free).
pub(crate) trait BlockAllocator: Send + Sync {
    /// `sub_blocks` of data space in `pool` (a whole block when it equals the sub-blocks
    /// per block, else a fragment), near `hint`. `what` names the request in errors
    /// ("file data", "fallocate").
    fn allocate(
        &self,
        pool: PoolId,
        sub_blocks: u32,
        hint: BlockHint,
        what: &'static str,
    ) -> FsResult<Extent>;

    /// [`BlockAllocator::allocate`] of a block with `copies` copies (data replication):
    /// the first extent, then the others, each in a failure group no other one uses;
    /// fewer than `copies` only when `-K` allows (see `replication.rs`).
    fn allocate_copies(
        &self,
        pool: PoolId,
        sub_blocks: u32,
        hint: BlockHint,
        copies: u8,
        what: &'static str,
    ) -> FsResult<Vec<Extent>>;

    /// Like [`BlockAllocator::allocate`], on the disks `allowed` accepts only, for data a
    /// restripe moves. The metadata reserve is not checked: the move gives back the extent
    /// it replaces.
    fn allocate_on(
        &self,
        pool: PoolId,
        sub_blocks: u32,
        hint: BlockHint,
        allowed: &dyn Fn(DiskIndex) -> bool,
        what: &'static str,
    ) -> FsResult<Extent>;

    /// Gives back an extent no update mapped (its write failed).
    fn abandon(&self, extent: Extent);

    /// Up to `count` fragments of `sub_blocks` each (at least one, or the error of the
    /// first), each the caller's alone as from [`BlockAllocator::allocate`].
    fn allocate_fragments(
        &self,
        pool: PoolId,
        sub_blocks: u32,
        count: u32,
        what: &'static str,
    ) -> FsResult<Vec<Extent>> {
        // A fragment goes where there is room, whatever file it is for (only a block has a
        // place by file and index): no hint.
        let anywhere = BlockHint {
            file_key: 0,
            block_index: 0,
            prev: None,
        };
        let mut given = Vec::new();
        for _ in 0..count.max(1) {
            match self.allocate(pool, sub_blocks, anywhere, what) {
                Ok(e) => given.push(e),
                Err(e) if given.is_empty() => return Err(e),
                Err(_) => break,
            }
        }
        Ok(given)
    }

    /// A fragment of `sub_blocks` for the first block of a small file (no neighbour to be
    /// near, one copy): what [`BlockAllocator::allocate`] would give, from a client's
    /// reserve when it has one (`RemoteMetanode`).
    fn allocate_first_fragment(
        &self,
        pool: PoolId,
        sub_blocks: u32,
        hint: BlockHint,
        what: &'static str,
    ) -> FsResult<Extent> {
        self.allocate(pool, sub_blocks, hint, what)
    }
}

/// The namespace half of the metanode interface: what a client asks the metanode of the
/// inode an operation names first (the directory for operations on names, the inode itself
/// for attributes). Every call is one request and one answer, with owned or plain
/// arguments, so that it can cross the cluster transport unchanged; the owner checks what
/// it is sent (names, sizes, kinds), logs the operation as one transaction and answers
/// with results. Permission checks stay with the client (`access.rs`), which asks for the
/// protection of the objects it checks, as the kernel checks before it calls: a change
/// between the check and the operation orders the operation first.
///
/// The names differ from the client API of [`crate::FileSystem`] (`lookup`, `remove`,
/// ...) on purpose: the one-node file system implements both on one type, and an owner's
/// method must never be mistaken for the client call that sends it.
pub(crate) trait Namespace: Send + Sync {
    /// The attributes of `ino`.
    fn attr(&self, ino: Ino) -> FsResult<Attr>;

    /// Bytes of storage the file's block map holds (whole sub-blocks).
    fn held_bytes(&self, ino: Ino) -> FsResult<u64>;
    /// `attr` and `held_bytes` at once (a `stat`): one request to a remote owner.
    fn attr_and_bytes(&self, ino: Ino) -> FsResult<(Attr, u64)> {
        Ok((self.attr(ino)?, self.held_bytes(ino)?))
    }

    /// The attributes of what `name` in `parent` names (also `.` and `..`).
    fn find(&self, parent: Ino, name: &[u8]) -> FsResult<Attr>;

    /// Creates a node in `parent`; see [`crate::FileSystem::create_node_umask`].
    fn make(&self, parent: Ino, name: &[u8], node: NewNode) -> FsResult<Attr>;

    /// A symbolic link's target.
    fn link_target(&self, ino: Ino) -> FsResult<Vec<u8>>;

    /// unlink (`dir` false) or rmdir (`dir` true) of `name` in `parent`.
    fn drop_name(&self, parent: Ino, name: &[u8], dir: bool) -> FsResult<()>;

    /// The first step of an rmdir whose directory `ino` this owner serves and whose entry
    /// directory `named_in` (another owner's) holds: refuses unless `ino` is an empty
    /// directory whose parent is `named_in` (NotFound: a move across owners set its parent
    /// to the new one first, and the old name is going), then lets no name into it and no
    /// move take it for a bounded time. `named_in` None lifts the seal again.
    fn seal_dir(&self, ino: Ino, named_in: Option<Ino>) -> FsResult<()>;

    /// The second step: removes `name` from `parent` if it still names directory `ino`
    /// (sealed by the owner that serves it), durably before answering.
    fn drop_entry_of(&self, parent: Ino, name: &[u8], ino: Ino) -> FsResult<()>;

    /// The last step: the sealed directory `ino`, whose entry is gone, goes too.
    fn drop_sealed_dir(&self, ino: Ino) -> FsResult<()>;

    /// A step of a rename or link across owners (`across_owners.rs`): puts `name` in `dir`
    /// naming `ino` (of `kind`), replacing the name only if it names `replace` now (a
    /// file: its link count is the caller's next step), durably before answering. Touches
    /// no link count: `ino` may be another owner's.
    fn put_entry(
        &self,
        dir: Ino,
        name: &[u8],
        node: (Ino, FileKind),
        replace: Option<Ino>,
    ) -> FsResult<()>;

    /// A step of a rename or unlink across owners: removes `name` from `dir` if it names
    /// `ino`, durably before answering; no link count changes.
    fn take_entry(&self, dir: Ino, name: &[u8], ino: Ino) -> FsResult<()>;

    /// A step of an operation across owners: one more (`up`) or one fewer link to
    /// non-directory `ino`, which this owner serves, durably before answering; at none
    /// the inode goes once no node has it open.
    fn count_link(&self, ino: Ino, up: bool) -> FsResult<()>;

    /// A step of a directory's move across owners: directory `dir`, which this owner
    /// serves, has `to` for its parent from now on if `from` is its parent now (else
    /// NotFound, as when an rmdir sealed it first), durably before answering.
    fn reparent(&self, dir: Ino, from: Ino, to: Ino) -> FsResult<()>;

    /// A new name `name` in `parent` for `ino` (link).
    fn add_name(&self, ino: Ino, parent: Ino, name: &[u8]) -> FsResult<Attr>;

    /// rename(2) with RENAME_NOREPLACE and RENAME_EXCHANGE.
    fn move_name(&self, from: (Ino, &[u8]), to: (Ino, &[u8]), how: RenameHow) -> FsResult<()>;

    /// Changes attributes other than the size (which the client's data path truncates).
    fn change_attr(&self, ino: Ino, set: crate::SetAttr) -> FsResult<Attr>;

    /// A client opened `ino`: an unlinked file lives until its last handle closes.
    fn opened(&self, ino: Ino) -> FsResult<Attr>;

    /// A client closed a handle of `ino`; frees it if it was the last reference.
    fn closed(&self, ino: Ino) -> FsResult<()>;

    /// Entries of directory `ino` after cookie `after`, a batch at a time.
    fn entries(&self, ino: Ino, after: u64) -> FsResult<crate::DirListing>;

    /// Space and inodes of the file system.
    fn space(&self) -> crate::StatFs;

    /// Per disk (index, whole blocks free, sub-blocks free inside partly used blocks) of
    /// the allocation regions this owner allocates in: another owner's regions count as
    /// used here, so the file system's free space is the sum over its owners.
    fn disk_free(&self) -> FsResult<Vec<(u32, u64, u64)>>;

    /// The storage pool file `ino` is placed in, by index (`policy apply`'s scan).
    fn file_pool(&self, ino: Ino) -> FsResult<u16>;

    /// Moves file `ino` to pool `pool` (`policy apply`'s MIGRATE): its recorded pool, then
    /// with `move_data` every block outside it, in this owner's regions and log. Returns
    /// the bytes copied.
    fn migrate_file(&self, ino: Ino, pool: u16, move_data: bool) -> FsResult<u64>;

    /// One batch of the file system manager's restripe of `shard`, which this owner holds:
    /// its files' blocks that sit where `mode` says they should not are moved, in its own
    /// regions and log (`FileSystem::restripe_shard_batch`).
    fn restripe_batch(
        &self,
        mode: crate::restripe::RestripeMode,
        shard: u32,
        cursor: &crate::restripe::RestripeCursor,
    ) -> FsResult<crate::restripe::RestripeBatch>;

    /// One batch of the file system manager's `restripe -m` on this owner: up to `budget`
    /// of its metadata pages on disks that are not ready are written elsewhere by a
    /// checkpoint of its own. Returns how many moved (0: none is left on such disks).
    fn move_pages_off(&self, budget: u32) -> FsResult<u64>;

    /// `disk delete` on the file system manager, once its restripe emptied `disks`: this
    /// owner (of a slot other than 0) checks that none of its blocks and metadata pages is
    /// left on them, then lets go of them: out of its allocator and its map's digest, named
    /// in its record by a checkpoint, so that the manager can remove them.
    fn drop_disks(&self, disks: &[u16]) -> FsResult<()>;

    /// A move of allocation-map regions on the file system manager (`map_hold.rs`): with
    /// `hold`, this owner slot's checkpoints write no map chunk until the release of move
    /// `id` (asked again under the same id, it confirms the hold still stands); without,
    /// the slot takes the map regions of the descriptor on disk and writes there again.
    fn hold_map_writes(&self, hold: bool, id: u64) -> FsResult<()>;

    /// A move of this owner slot's region (records and log) by the file system manager
    /// (`slot_move.rs`): the slot moves to `to`, which the descriptor on disk reserves, and
    /// answers `true` once it is there; with `give_up`, it gives the move up unless it is
    /// there already (`false`), and refuses it from then on.
    fn move_slot_region(&self, to: &crate::slot::SlotRegion, give_up: bool) -> FsResult<bool>;

    /// On the file system manager, from the owner of `slot` (`-m 2`): the descriptor says
    /// from now on that copy `behind` of the slot's log `log_id` lacks records (`None`: both
    /// are current), written before this returns (`mirrored_log.rs`). The log is named
    /// because a slot moving its region (`slot_move.rs`) writes the region the descriptor
    /// only reserves for it until the manager commits the move.
    fn record_slot_log(&self, slot: u32, log_id: [u8; 16], behind: Option<u8>) -> FsResult<()>;

    /// On the owner of a slot other than 0, for the file system manager's `restripe -c` or
    /// `-r` (`rewrite`) of a `-m 2` file system: the copies of its pages checked and
    /// repaired, and with `rewrite` its log copy and map chunks restored; returns the copies
    /// checked and repaired.
    fn restore_copies(&self, rewrite: bool) -> FsResult<(u64, u64)>;

    /// setxattr; the POSIX ACL names go to [`Namespace::put_acl`].
    fn put_xattr(&self, ino: Ino, name: &[u8], value: &[u8], how: XattrHow) -> FsResult<()>;

    fn xattr(&self, ino: Ino, name: &[u8]) -> FsResult<Vec<u8>>;

    /// The extended attribute names of `ino`, each followed by a NUL.
    fn xattr_names(&self, ino: Ino) -> FsResult<Vec<u8>>;

    fn drop_xattr(&self, ino: Ino, name: &[u8]) -> FsResult<()>;

    /// Sets an access or default ACL from its extended attribute value; see
    /// [`crate::FileSystem::set_acl`].
    fn put_acl(
        &self,
        ino: Ino,
        kind: crate::acl::AclKind,
        value: &[u8],
        how: XattrHow,
        drop_setgid: bool,
    ) -> FsResult<()>;

    /// What a permission check of `ino` needs: its attributes and access ACL.
    fn protection(&self, ino: Ino) -> FsResult<crate::access::Protection>;

    /// Takes, changes or drops a lock, or with `call.test` only looks (see `locks.rs`):
    /// the conflicting lock when it cannot be granted. `origin` is the node the request
    /// came from (`None`: this node's own mount).
    fn lock(
        &self,
        ino: Ino,
        call: crate::locks::LockCall,
        origin: Option<crate::locks::Origin>,
    ) -> FsResult<Option<crate::locks::Lock>>;

    /// Drops the whole-file data tokens `holder` keeps for `inos` (a client's batch of
    /// kept tokens it no longer wants, `locks.rs`): as an unlock of each, in one request.
    /// Every one is tried; the first failure is returned.
    fn drop_kept(
        &self,
        holder: crate::locks::Holder,
        inos: &[Ino],
        origin: Option<crate::locks::Origin>,
    ) -> FsResult<()> {
        let mut first_error = Ok(());
        for &ino in inos {
            let call = crate::locks::LockCall {
                lock: crate::locks::Lock {
                    holder,
                    start: 0,
                    end: crate::locks::TO_END,
                    kind: crate::locks::LockKind::Unlock,
                    pid: 0,
                },
                test: false,
                wait: false,
            };
            if let Err(e) = self.lock(ino, call, origin) {
                if first_error.is_ok() {
                    first_error = Err(e);
                }
            }
        }
        first_error
    }

    /// Lets the mount of `origin` gather small writes of `ino` under the data token it
    /// keeps (`write_behind.rs`): true if granted. This node's own mount is never granted
    /// (it reaches its own metadata at no cost, and gathers as its owner).
    fn gather(&self, ino: Ino, origin: Option<crate::locks::Origin>) -> FsResult<bool>;
}

/// What a create asks for besides its name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct NewNode {
    pub kind: crate::FileKind,
    /// The creator's mode and umask (the umask yields to a default ACL of the parent).
    pub mode: u32,
    pub umask: u32,
    pub rdev: u32,
    pub caller: crate::Caller,
    pub symlink_target: Option<Vec<u8>>,
    /// Open the new file too (FUSE's create): counted open in the same step, so that no
    /// other node's unlink can free it between the two, and in one round trip.
    pub open: bool,
    /// A directory made by the owner of this owner slot in a directory another slot
    /// serves: made for the asking slot (`make_directory_for_slot`), so that it and what
    /// is made in it are that node's work.
    pub for_slot: Option<u32>,
    /// With `open`, the whole-file data token the creating client mount keeps (`locks.rs`,
    /// `KeptToken`), granted with the create: nobody else can hold one of a file that did
    /// not exist, and its first write then asks the owner for none.
    #[serde(default)]
    pub keep_data: Option<crate::locks::Lock>,
}

/// RENAME_NOREPLACE and RENAME_EXCHANGE, and whether a directory may move.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct RenameHow {
    pub noreplace: bool,
    pub exchange: bool,
    /// The caller holds the cluster's rename lock, or needs none (a file system no other
    /// owner serves). Without it the owner moves no directory (`AcrossOwners`, and the
    /// client takes the lock and asks again): the client chose not to lock because the
    /// name named a file when it looked, and another node may have put a directory under
    /// the name since.
    pub dirs_may_move: bool,
}

/// XATTR_CREATE and XATTR_REPLACE.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct XattrHow {
    pub create: bool,
    pub replace: bool,
}
