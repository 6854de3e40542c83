//! The metadata state machine. Every change to metadata is a [`Change`]; the metanode logs a
//! transaction (a list of changes) to its recovery log, then applies it with [`MetaState::apply`].
//! Mount applies the same records in the same order after loading the checkpoint, so live
//! state and recovered state come from one function and cannot drift apart.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use tessera_alloc::Extent;

use crate::error::{FsError, FsResult};
use crate::inode::{
    Alternative, Attr, BlockRef, Content, DirEntry, Directory, FileKind, Ino, Inode,
};

/// One logged metadata change. Changes carry results (inode numbers, cookies, checksums), never
/// decisions, so replay is deterministic.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Change {
    /// Creates the inode if it does not exist, otherwise replaces its attributes.
    PutAttr(Attr),
    DirInsert {
        dir: Ino,
        name: Vec<u8>,
        entry: DirEntry,
    },
    DirRemove {
        dir: Ino,
        name: Vec<u8>,
    },
    /// Sets a directory's parent (after a rename across directories).
    SetParent {
        dir: Ino,
        parent: Ino,
    },
    /// Replaces the content with inline bytes, freeing any blocks.
    Inline {
        ino: Ino,
        data: Vec<u8>,
    },
    /// Maps file block `index`, freeing the extent it replaces.
    MapBlock {
        ino: Ino,
        index: u64,
        block: BlockRef,
    },
    /// New checksums for sectors `first..first+crcs.len()` of block `index`. With `in_place`
    /// the previous checksum of each written sector is kept as an alternative until the write
    /// is known to be on disk (see [`BlockRef::pending`]).
    Sectors {
        ino: Ino,
        index: u64,
        first: u32,
        crcs: Vec<u32>,
        in_place: bool,
    },
    /// Forgets the pending alternatives of sectors whose in-place write completed.
    Settle {
        ino: Ino,
        index: u64,
        first: u32,
        count: u32,
    },
    /// Drops every block at or past `size` and marks sectors past `size` in the last block
    /// unwritten.
    Truncate {
        ino: Ino,
        size: u64,
        block_size: u64,
    },
    /// Unmaps one block (hole punching).
    Unmap {
        ino: Ino,
        index: u64,
    },
    SetXattr {
        ino: Ino,
        name: Vec<u8>,
        value: Vec<u8>,
    },
    RemoveXattr {
        ino: Ino,
        name: Vec<u8>,
    },
    /// Removes the inode and frees all its blocks.
    FreeInode {
        ino: Ino,
    },
}

/// What an inode's content is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentKind {
    Inline,
    Blocks,
    Dir,
    None,
}

/// One shard of the inode space.
#[derive(Default)]
pub struct Shard {
    pub inodes: HashMap<Ino, Inode>,
    /// The next inode number this shard hands out.
    pub next_ino: Ino,
}

pub struct MetaState {
    pub shards: Vec<Shard>,
}

fn corrupt(what: String) -> FsError {
    FsError::Corrupt(what)
}

impl MetaState {
    pub fn new(shard_count: u32) -> MetaState {
        assert!(shard_count >= 1);
        let shards = (0..shard_count)
            .map(|s| Shard {
                inodes: HashMap::new(),
                // Inode 0 is never used; shard s hands out s, s+n, s+2n, ... from 2 on
                // (1 is the root directory).
                next_ino: first_ino(u64::from(s), u64::from(shard_count)),
            })
            .collect();
        MetaState { shards }
    }

    pub fn shard_count(&self) -> u64 {
        self.shards.len() as u64
    }

    pub fn shard_of(&self, ino: Ino) -> usize {
        (ino % self.shard_count()) as usize
    }

    pub fn get(&self, ino: Ino) -> Option<&Inode> {
        self.shards[self.shard_of(ino)].inodes.get(&ino)
    }

    pub fn get_mut(&mut self, ino: Ino) -> Option<&mut Inode> {
        let s = self.shard_of(ino);
        self.shards[s].inodes.get_mut(&ino)
    }

    fn must(&mut self, ino: Ino) -> FsResult<&mut Inode> {
        self.get_mut(ino)
            .ok_or_else(|| corrupt(format!("log names missing inode {ino}")))
    }

    pub fn inode_count(&self) -> u64 {
        self.shards.iter().map(|s| s.inodes.len() as u64).sum()
    }

    /// Reserves an inode number in `shard` (the caller logs it in a PutAttr).
    pub fn allocate_ino(&mut self, shard: usize) -> Ino {
        let n = self.shard_count();
        let ino = self.shards[shard].next_ino;
        self.shards[shard].next_ino += n;
        ino
    }

    // ---- reads ----
    //
    // Every read of metadata outside this module goes through these methods, which return
    // owned values and take `&mut self`: the state they read is a cache over on-disk
    // metadata (a read may load a page), not a structure callers may borrow.

    /// The attributes of `ino`; `NotFound` when it does not exist.
    pub fn attr(&mut self, ino: Ino) -> FsResult<Attr> {
        self.find_attr(ino)?.ok_or(FsError::NotFound)
    }

    pub fn find_attr(&mut self, ino: Ino) -> FsResult<Option<Attr>> {
        Ok(self.get(ino).map(|i| i.attr))
    }

    fn directory(&self, dir: Ino) -> FsResult<&Directory> {
        self.get(dir)
            .ok_or(FsError::NotFound)?
            .dir()
            .ok_or(FsError::NotDir)
    }

    /// The entry `name` of directory `dir` (`NotFound` if `dir` does not exist, `NotDir` if
    /// it is not a directory).
    pub fn lookup(&mut self, dir: Ino, name: &[u8]) -> FsResult<Option<DirEntry>> {
        Ok(self.directory(dir)?.entries.get(name).copied())
    }

    /// The parent (`..`) of directory `dir`.
    pub fn dir_parent(&mut self, dir: Ino) -> FsResult<Ino> {
        Ok(self.directory(dir)?.parent)
    }

    pub fn dir_is_empty(&mut self, dir: Ino) -> FsResult<bool> {
        Ok(self.directory(dir)?.entries.is_empty())
    }

    /// Up to `limit` entries of `dir` with cookies greater than `after`, in cookie order.
    pub fn dir_entries(
        &mut self,
        dir: Ino,
        after: u64,
        limit: usize,
    ) -> FsResult<Vec<(Vec<u8>, DirEntry)>> {
        let d = self.directory(dir)?;
        Ok(d.by_cookie
            .range(after.saturating_add(1)..)
            .take(limit)
            .map(|(_, name)| (name.clone(), d.entries[name]))
            .collect())
    }

    /// The readdir cookie a new entry `name` of `dir` gets.
    pub fn new_cookie(&mut self, dir: Ino, _name: &[u8]) -> FsResult<u64> {
        Ok(self.directory(dir)?.next_cookie)
    }

    /// What the inode's content is, without loading it.
    pub fn content_kind(&mut self, ino: Ino) -> FsResult<ContentKind> {
        Ok(match &self.get(ino).ok_or(FsError::NotFound)?.content {
            Content::Inline(_) => ContentKind::Inline,
            Content::Blocks(_) => ContentKind::Blocks,
            Content::Dir(_) => ContentKind::Dir,
            Content::None => ContentKind::None,
        })
    }

    /// The inline bytes of a small file or symlink; `None` when the content is not inline.
    pub fn inline_data(&mut self, ino: Ino) -> FsResult<Option<Vec<u8>>> {
        Ok(match &self.get(ino).ok_or(FsError::NotFound)?.content {
            Content::Inline(d) => Some(d.clone()),
            _ => None,
        })
    }

    /// Block `index` of a file's block map.
    pub fn block(&mut self, ino: Ino, index: u64) -> FsResult<Option<BlockRef>> {
        Ok(match &self.get(ino).ok_or(FsError::NotFound)?.content {
            Content::Blocks(map) => map.get(&index).cloned(),
            _ => None,
        })
    }

    /// The mapped blocks of a file with indexes in `range`, in index order.
    pub fn blocks(
        &mut self,
        ino: Ino,
        range: std::ops::Range<u64>,
    ) -> FsResult<Vec<(u64, BlockRef)>> {
        Ok(match &self.get(ino).ok_or(FsError::NotFound)?.content {
            Content::Blocks(map) if range.start < range.end => {
                map.range(range).map(|(i, b)| (*i, b.clone())).collect()
            }
            _ => Vec::new(),
        })
    }

    /// Sub-blocks held by a file's block map (st_blocks).
    pub fn allocated_sub_blocks(&mut self, ino: Ino) -> FsResult<u64> {
        Ok(self.get(ino).ok_or(FsError::NotFound)?.allocated_sub_blocks)
    }

    pub fn xattr(&mut self, ino: Ino, name: &[u8]) -> FsResult<Option<Vec<u8>>> {
        Ok(self
            .get(ino)
            .ok_or(FsError::NotFound)?
            .xattrs
            .get(name)
            .cloned())
    }

    pub fn xattr_names(&mut self, ino: Ino) -> FsResult<Vec<Vec<u8>>> {
        Ok(self
            .get(ino)
            .ok_or(FsError::NotFound)?
            .xattrs
            .keys()
            .cloned()
            .collect())
    }

    /// Applies one change; returns the extents it stopped referencing.
    pub fn apply(&mut self, change: &Change) -> FsResult<Vec<Extent>> {
        let mut freed = Vec::new();
        match change {
            Change::PutAttr(attr) => self.put_attr(attr),
            Change::DirInsert { dir, name, entry } => {
                let d = dir_mut(self.must(*dir)?)?;
                if let Some(old) = d.entries.insert(name.clone(), *entry) {
                    d.by_cookie.remove(&old.cookie);
                }
                d.by_cookie.insert(entry.cookie, name.clone());
                d.next_cookie = d.next_cookie.max(entry.cookie + 1);
            }
            Change::DirRemove { dir, name } => {
                let d = dir_mut(self.must(*dir)?)?;
                let old = d.entries.remove(name).ok_or_else(|| {
                    corrupt(format!("log removes missing entry from directory {dir}"))
                })?;
                d.by_cookie.remove(&old.cookie);
            }
            Change::SetParent { dir, parent } => dir_mut(self.must(*dir)?)?.parent = *parent,
            Change::Inline { ino, data } => {
                let inode = self.must(*ino)?;
                free_content(&inode.content, &mut freed);
                inode.content = Content::Inline(data.clone());
                inode.allocated_sub_blocks = 0;
            }
            Change::MapBlock { ino, index, block } => {
                let inode = self.must(*ino)?;
                let old = blocks_mut(inode)?.insert(*index, block.clone());
                inode.allocated_sub_blocks += u64::from(block.extent.sub_blocks);
                if let Some(old) = old {
                    inode.allocated_sub_blocks -= u64::from(old.extent.sub_blocks);
                    if old.extent != block.extent {
                        freed.push(old.extent);
                    }
                }
            }
            Change::Sectors {
                ino,
                index,
                first,
                crcs,
                in_place,
            } => {
                let b = block_mut(self.must(*ino)?, *index)?;
                let end = *first as usize + crcs.len();
                if end > b.sectors() {
                    return Err(corrupt(format!(
                        "log writes past block {index} of inode {ino}"
                    )));
                }
                for (i, crc) in crcs.iter().enumerate() {
                    let s = *first as usize + i;
                    if *in_place {
                        let before = if b.is_unwritten(s) {
                            Alternative::Unwritten
                        } else {
                            Alternative::Crc(b.crcs[s])
                        };
                        if before != Alternative::Crc(*crc) {
                            b.pending.insert(s as u32, before);
                        }
                    }
                    b.set_written(s, *crc);
                }
            }
            Change::Settle {
                ino,
                index,
                first,
                count,
            } => {
                if let Ok(b) = block_mut(self.must(*ino)?, *index) {
                    for s in *first..first + count {
                        b.pending.remove(&s);
                    }
                }
            }
            Change::Truncate {
                ino,
                size,
                block_size,
            } => {
                let inode = self.must(*ino)?;
                truncate(inode, *size, *block_size, &mut freed)?;
                inode.count_allocated();
            }
            Change::Unmap { ino, index } => {
                let inode = self.must(*ino)?;
                if let Some(old) = blocks_mut(inode)?.remove(index) {
                    inode.allocated_sub_blocks -= u64::from(old.extent.sub_blocks);
                    freed.push(old.extent);
                }
            }
            Change::SetXattr { ino, name, value } => {
                self.must(*ino)?.xattrs.insert(name.clone(), value.clone());
            }
            Change::RemoveXattr { ino, name } => {
                self.must(*ino)?.xattrs.remove(name);
            }
            Change::FreeInode { ino } => {
                let s = self.shard_of(*ino);
                let inode = self.shards[s]
                    .inodes
                    .remove(ino)
                    .ok_or_else(|| corrupt(format!("log frees missing inode {ino}")))?;
                free_content(&inode.content, &mut freed);
            }
        }
        Ok(freed)
    }

    fn put_attr(&mut self, attr: &Attr) {
        let s = self.shard_of(attr.ino);
        let n = self.shard_count();
        let shard = &mut self.shards[s];
        if shard.next_ino <= attr.ino {
            shard.next_ino = attr.ino + n;
        }
        match shard.inodes.get_mut(&attr.ino) {
            Some(inode) => inode.attr = *attr,
            None => {
                let content = match attr.kind {
                    FileKind::Directory => Content::Dir(Directory::new()),
                    FileKind::Regular | FileKind::Symlink => Content::Inline(Vec::new()),
                    _ => Content::None,
                };
                let inode = Inode {
                    attr: *attr,
                    xattrs: Default::default(),
                    content,
                    allocated_sub_blocks: 0,
                };
                shard.inodes.insert(attr.ino, inode);
            }
        }
    }
}

/// The first inode number of a shard, skipping 0 and the root (1).
pub fn first_ino(shard: u64, shard_count: u64) -> Ino {
    let mut ino = shard;
    while ino < 2 {
        ino += shard_count;
    }
    ino
}

fn dir_mut(inode: &mut Inode) -> FsResult<&mut Directory> {
    match &mut inode.content {
        Content::Dir(d) => Ok(d),
        _ => Err(corrupt(format!(
            "inode {} is not a directory",
            inode.attr.ino
        ))),
    }
}

fn blocks_mut(inode: &mut Inode) -> FsResult<&mut std::collections::BTreeMap<u64, BlockRef>> {
    // The first mapped block replaces inline data: the writer copied the inline bytes into
    // that block before logging the change.
    if let Content::Inline(_) = &inode.content {
        inode.content = Content::Blocks(Default::default());
    }
    match &mut inode.content {
        Content::Blocks(b) => Ok(b),
        _ => Err(corrupt(format!(
            "inode {} has no block map",
            inode.attr.ino
        ))),
    }
}

fn block_mut(inode: &mut Inode, index: u64) -> FsResult<&mut BlockRef> {
    let ino = inode.attr.ino;
    blocks_mut(inode)?
        .get_mut(&index)
        .ok_or_else(|| corrupt(format!("inode {ino} has no block {index}")))
}

fn free_content(content: &Content, freed: &mut Vec<Extent>) {
    if let Content::Blocks(blocks) = content {
        freed.extend(blocks.values().map(|b| b.extent));
    }
}

fn truncate(
    inode: &mut Inode,
    size: u64,
    block_size: u64,
    freed: &mut Vec<Extent>,
) -> FsResult<()> {
    match &mut inode.content {
        Content::Inline(data) => data.truncate(size as usize),
        Content::Blocks(blocks) => {
            let keep = size.div_ceil(block_size);
            let gone: Vec<u64> = blocks.range(keep..).map(|(i, _)| *i).collect();
            for i in gone {
                freed.push(blocks.remove(&i).expect("present").extent);
            }
            if !size.is_multiple_of(block_size) {
                if let Some(b) = blocks.get_mut(&(size / block_size)) {
                    let first_gone = (size % block_size).div_ceil(crate::inode::CSUM_SECTOR_BYTES);
                    for s in first_gone as usize..b.sectors() {
                        b.unwritten[s / 64] |= 1 << (s % 64);
                        b.pending.remove(&(s as u32));
                    }
                }
            }
            if blocks.is_empty() {
                inode.content = Content::Inline(Vec::new());
            }
        }
        _ => {
            return Err(corrupt(format!(
                "truncate of inode {} without data",
                inode.attr.ino
            )))
        }
    }
    Ok(())
}
