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

use tessera_alloc::{BlockHint, DiskIndex, Extent, PoolId};
use tessera_journal::Lsn;

use crate::error::FsResult;
use crate::inode::{Attr, BlockRef, Ino};
use crate::meta::Change;

/// What a client knows of a file for one request: its attributes, the pool its data goes
/// to, and its content (the requested part of the block map, or the inline bytes).
#[derive(Clone, Debug)]
pub(crate) struct FileView {
    pub attr: Attr,
    pub pool: PoolId,
    pub content: Content,
}

#[derive(Clone, Debug)]
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

    /// The mapped block `index`, if the view holds it.
    pub fn block(&self, index: u64) -> Option<&BlockRef> {
        match &self.content {
            Content::Blocks(blocks) => blocks.iter().find(|(i, _)| *i == index).map(|(_, r)| r),
            _ => None,
        }
    }
}

/// How an update changes the file's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SizeUpdate {
    Keep,
    /// A write reached this size: the file grows to it, never shrinks (writers of one file
    /// may report in any order).
    AtLeast(u64),
    /// Truncate or extend to exactly this size.
    Exactly(u64),
}

/// Which times an update sets to the metanode's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Times {
    Keep,
    /// Data changed: mtime and ctime.
    Modified,
    /// Only the inode changed (fallocate): ctime.
    Changed,
}

/// One update of one file, logged and applied by its metanode as one journal record.
#[derive(Clone, Debug)]
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
            times: Times::Modified,
        }
    }
}

/// The metanode of a file, as its data path sees it.
pub(crate) trait Metanode: Send + Sync {
    /// The file's attributes, pool and content, with the mapped blocks whose indexes fall
    /// in `blocks` (an empty range asks for none).
    fn view(&self, ino: Ino, blocks: Range<u64>) -> FsResult<FileView>;

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
}
