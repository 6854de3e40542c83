//! What an inode is made of: attributes, block references with per-sector checksums, and
//! directory entries. Their on-disk form is in `shard_tree.rs`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tessera_alloc::Extent;

/// Inode number. The shard that owns an inode is `ino % shard_count`.
pub type Ino = u64;

/// The root directory's inode number (FUSE's FUSE_ROOT_ID).
pub const ROOT_INO: Ino = 1;

/// Checksum granularity: one crc32c per 4 KiB sector. A sector is the atomic write unit of
/// the drives, so a torn write never mixes old and new bytes inside one checksum.
pub const CSUM_SECTOR_BYTES: u64 = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    Regular,
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub struct Timestamp {
    pub secs: i64,
    pub nsecs: u32,
}

impl Timestamp {
    pub fn now() -> Timestamp {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp {
            secs: d.as_secs() as i64,
            nsecs: d.subsec_nanos(),
        }
    }
}

/// The fixed-size part of an inode; journaled whole on every change because it is small.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileKind,
    /// Permission bits including setuid, setgid and sticky (mode & 0o7777).
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub rdev: u32,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub crtime: Timestamp,
    /// Bumped when the inode number is reused, so stale handles can be told apart.
    pub generation: u32,
}

impl FileKind {
    /// The `S_IF*` bits of `st_mode` for this kind.
    pub fn type_bits(self) -> u32 {
        match self {
            FileKind::Regular => libc::S_IFREG,
            FileKind::Directory => libc::S_IFDIR,
            FileKind::Symlink => libc::S_IFLNK,
            FileKind::Fifo => libc::S_IFIFO,
            FileKind::Socket => libc::S_IFSOCK,
            FileKind::CharDevice => libc::S_IFCHR,
            FileKind::BlockDevice => libc::S_IFBLK,
        }
    }
}

impl Attr {
    /// `st_mode`: the file type bits and the permission bits.
    pub fn mode(&self) -> u32 {
        self.kind.type_bits() | u32::from(self.perm)
    }
}

/// A file block: where it lives and the checksum of every sector in it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockRef {
    pub extent: Extent,
    /// crc32c of each 4 KiB sector; meaningful only for written sectors.
    pub crcs: Vec<u32>,
    /// One bit per sector: set while the sector was allocated but never written, so it
    /// reads as zeros (fallocate, partial writes of a fresh block).
    pub unwritten: Vec<u64>,
    /// Sectors written in place whose write may not have reached the disk before a crash:
    /// the sector holds either the data of `crcs` or what the alternative describes.
    pub pending: BTreeMap<u32, Alternative>,
    /// The other copies of the block (data replication, `-r 2|3`): extents of the same
    /// length on disks of other failure groups, holding the same bytes, so `crcs`,
    /// `unwritten` and `pending` describe every copy. Only current copies are listed: a copy
    /// whose write failed is dropped from the reference (the file is then ill-replicated
    /// until `restripe -r` adds one again), never kept stale.
    pub copies: Vec<Extent>,
}

/// Copies of a block at most: GPFS's limit of three replicas.
pub const COPIES_MAX: usize = 3;

/// What an in-place sector held before a write that may not have landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Alternative {
    /// The older data, with this checksum.
    Crc(u32),
    /// Nothing: the sector was never written and reads as zeros.
    Unwritten,
}

impl BlockRef {
    pub fn new_unwritten(extent: Extent, sectors: usize) -> BlockRef {
        let mut unwritten = vec![0u64; sectors.div_ceil(64)];
        for s in 0..sectors {
            unwritten[s / 64] |= 1 << (s % 64);
        }
        BlockRef {
            extent,
            crcs: vec![0; sectors],
            unwritten,
            pending: BTreeMap::new(),
            copies: Vec::new(),
        }
    }

    /// Every copy of the block: the first, then the others.
    pub fn extents(&self) -> impl Iterator<Item = Extent> + '_ {
        std::iter::once(self.extent).chain(self.copies.iter().copied())
    }

    /// Copies of the block there are (1 without replication).
    pub fn copy_count(&self) -> usize {
        1 + self.copies.len()
    }

    /// Sub-blocks every copy together holds (what `st_blocks` counts, as in GPFS).
    pub fn allocated_sub_blocks(&self) -> u64 {
        u64::from(self.extent.sub_blocks) * self.copy_count() as u64
    }

    /// Whether any copy is on `disk`.
    pub fn on_disk(&self, disk: tessera_alloc::DiskIndex) -> bool {
        self.extents().any(|e| e.addr.disk == disk)
    }

    pub fn sectors(&self) -> usize {
        self.crcs.len()
    }

    pub fn is_unwritten(&self, sector: usize) -> bool {
        self.unwritten
            .get(sector / 64)
            .is_some_and(|w| w & (1 << (sector % 64)) != 0)
    }

    pub fn set_written(&mut self, sector: usize, crc: u32) {
        self.crcs[sector] = crc;
        if let Some(w) = self.unwritten.get_mut(sector / 64) {
            *w &= !(1 << (sector % 64));
        }
    }

    /// Marks a sector never written again: it reads as zeros.
    pub fn set_unwritten(&mut self, sector: usize) {
        self.crcs[sector] = 0;
        if let Some(w) = self.unwritten.get_mut(sector / 64) {
            *w |= 1 << (sector % 64);
        }
    }

    pub fn any_written(&self) -> bool {
        (0..self.sectors()).any(|s| !self.is_unwritten(s))
    }
}

/// A directory entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub ino: Ino,
    pub kind: FileKind,
    /// Position of the entry for readdir; stable while the directory changes.
    pub cookie: u64,
}
