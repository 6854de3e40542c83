//! A shard's metadata on disk: every inode, directory entry, block reference and extended
//! attribute of the shard as an *item* of one copy-on-write B+tree (`tessera-meta`), read
//! on demand through the bounded page cache.
//!
//! # Items
//!
//! Keys start with the inode number, so everything about one inode is adjacent (one or two
//! leaves for a small file) and removing an inode is one key range. All numbers in keys
//! are big-endian, so key order is number order.
//!
//! ```text
//! key                                         value
//! ------------------------------------------  -------------------------------------------
//! [0 u64][01]                                 shard header: next inode number, inode count
//! [0 u64][05][ino u64]                        orphan: inode unlinked while open (no value)
//! [ino u64][01]                               inode record (attributes, inline data)
//! [ino u64][02][name][00][chunk u8]           extended attribute, in chunks of 4 KiB
//! [ino u64][03][cookie u64]                   directory entry: ino, kind, name
//! [ino u64][04][block index u64]              block reference: extent and sector checksums
//! ```
//!
//! # Directories
//!
//! An entry's key is its readdir cookie, derived from a hash of its name:
//! `cookie = 2^62 | (hash54(name) << 8) | n`, where `n` (0..=255) is the first index free
//! among names with the same 54-bit hash. Lookup by name visits the few keys of one hash
//! (one leaf); insert and remove are one B+tree update; readdir resumes at any cookie in
//! O(log n). An entry keeps its cookie for as long as it exists, so a readdir that resumes
//! after changes sees every entry that stayed exactly once (POSIX leaves entries added
//! meanwhile unspecified). Cookies are at least 2^62, clear of the kernel's 0..=2, and
//! below 2^63, as `loff_t` needs. A directory with tens of millions of entries costs what
//! any B+tree does: about four page visits per lookup, most of them cached.
//!
//! # Record layouts
//!
//! ```text
//! inode record (little-endian)
//!  0  1 version = 1      1  1 kind           2  2 perm         4  4 uid
//!  8  4 gid             12  4 nlink         16  8 size        24  4 rdev
//! 28  4 generation      32 12 atime (i64 s, u32 ns)           44 12 mtime
//! 56 12 ctime           68 12 crtime        80  1 content: 0 none, 1 inline, 2 blocks, 3 dir
//! 81  1 flags: bit 0 no extended attributes, bits 1-2 data copies - 1
//! 82  2 storage pool + 1 (0: default)
//! 84  8 dir: parent ino; blocks: allocated sub-blocks; else 0
//! 92  4 inline bytes    96  … inline data (file tail or symlink target)
//!
//! directory entry       0  8 ino   8  1 kind   9  1 name length   10  … name
//!
//! block reference
//!  0  2 disk           2  1 other copies (c, 0..=2)          3  5 zero
//!  8  8 sub-block     16  4 sub-blocks     20  2 sectors (s)  22  2 pending (p)
//! 24  4·s crc32c per sector
//!  …  8·⌈s/64⌉ unwritten bitmap            …  9·p pending: sector u32, tag u8 (0 crc,
//!                                              1 unwritten), crc u32
//!  … 16·c other copies: disk u16, 6 zero, sub-block u64 (same sub-blocks as the first)
//!
//! shard header          0  8 next inode number   8  8 inode count
//! ```

use std::collections::HashMap;
use tessera_alloc::{DiskAddr, Extent};
use tessera_meta::{MetaError, MetaStore, PagePtr, Tree};

use crate::error::{FsError, FsResult};
use crate::inode::{Alternative, Attr, BlockRef, FileKind, Ino, Timestamp};
use tessera_alloc::PoolId;

const TAG_HEADER: u8 = 0x01;
const TAG_INODE: u8 = 0x01;
const TAG_XATTR: u8 = 0x02;
const TAG_DIRENT: u8 = 0x03;
const TAG_BLOCK: u8 = 0x04;
const TAG_ORPHAN: u8 = 0x05;

const RECORD_VERSION: u8 = 1;
/// Inode record flag: the inode has no extended attributes. A flag of absence, so that the
/// zero byte of records written before it existed keeps meaning "look".
const FLAG_NO_XATTRS: u8 = 0x01;
/// Inode record flags: the copies the file's data blocks should have, minus one (so zero,
/// the value before replication existed, is one copy).
const FLAGS_COPIES_SHIFT: u8 = 1;
const FLAGS_COPIES_MASK: u8 = 0x06;
const INODE_FIXED_BYTES: usize = 96;
/// Extended attribute values are stored in chunks of this size (Linux allows 64 KiB).
const XATTR_CHUNK_BYTES: usize = 4096;
/// Most chunks of one value: 64 KiB.
const XATTR_CHUNKS_MAX: usize = 16;
const COOKIE_BASE: u64 = 1 << 62;
const COOKIE_HASH_BITS: u32 = 54;
const COOKIE_SLOTS: u64 = 256;

/// What an inode holds besides its attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RecordContent {
    None,
    Inline(Vec<u8>),
    /// A block map (items under the inode's key); the count of sub-blocks it holds.
    Blocks {
        allocated_sub_blocks: u64,
    },
    /// A directory (entries under the inode's key) and its parent.
    Dir {
        parent: Ino,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct InodeRecord {
    pub attr: Attr,
    pub content: RecordContent,
    /// The inode may have extended attributes (ACLs among them). Clear means it has none,
    /// so the permission checks of every operation skip the look for an ACL.
    pub xattrs: bool,
    /// The storage pool a placement rule chose for the file's data; `None` for the file
    /// system's default data pool (and every inode made before placement rules existed).
    pub pool: Option<PoolId>,
    /// Copies each data block of the file should have (1 to 3): `-r` of the file system at
    /// create, `file attr set --replication` after. Blocks with fewer copies (written while
    /// a failure group was down) are what `restripe -r` restores.
    pub copies: u8,
}

/// What one look at a name's hash slots in a directory finds: the entry of that name, and
/// the cookie a new entry of that name would get (`None` when all 256 slots are taken).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DirProbe {
    pub found: Option<DirItem>,
    pub free: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DirItem {
    pub cookie: u64,
    pub name: Vec<u8>,
    pub ino: Ino,
    pub kind: FileKind,
}

/// One item of a shard tree, decoded (for scans: fsck, the allocation map).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Item {
    Header(ShardHeader),
    Orphan(Ino),
    Inode(InodeRecord),
    Xattr {
        ino: Ino,
        name: Vec<u8>,
        chunk: u8,
    },
    Dirent {
        dir: Ino,
        item: DirItem,
    },
    Block {
        ino: Ino,
        index: u64,
        block: BlockRef,
    },
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ShardHeader {
    pub next_ino: Ino,
    pub inode_count: u64,
}

pub(crate) fn hash_slots_full() -> FsError {
    FsError::NoSpace {
        pool: "system".into(),
        what: "a directory entry (256 names of this directory share one hash)",
    }
}

pub(crate) fn meta_err(e: MetaError) -> FsError {
    match e {
        MetaError::Io { source, .. } => FsError::Io(source),
        other => FsError::Corrupt(other.to_string()),
    }
}

fn corrupt(what: String) -> FsError {
    FsError::Corrupt(what)
}

// ---- keys ----

fn key(ino: Ino, tag: u8) -> Vec<u8> {
    let mut k = Vec::with_capacity(17);
    k.extend_from_slice(&ino.to_be_bytes());
    k.push(tag);
    k
}

fn key_u64(ino: Ino, tag: u8, n: u64) -> Vec<u8> {
    let mut k = key(ino, tag);
    k.extend_from_slice(&n.to_be_bytes());
    k
}

fn xattr_key(ino: Ino, name: &[u8], chunk: u8) -> Vec<u8> {
    let mut k = key(ino, TAG_XATTR);
    k.extend_from_slice(name);
    k.push(0);
    k.push(chunk);
    k
}

fn tail_u64(k: &[u8]) -> u64 {
    u64::from_be_bytes(k[k.len() - 8..].try_into().expect("8 bytes"))
}

/// The 54-bit name hash of directory cookies: two CRC-32C passes with different seeds.
/// It is part of the on-disk format: changing it moves every entry.
pub(crate) fn name_hash(name: &[u8]) -> u64 {
    let lo = crc32c::crc32c(name);
    let hi = crc32c::crc32c_append(0x9e37_79b9, name);
    ((u64::from(hi) << 32) | u64::from(lo)) & ((1 << COOKIE_HASH_BITS) - 1)
}

/// The cookie a name gets in a directory where no other name shares its hash.
pub(crate) fn first_cookie(name: &[u8]) -> u64 {
    cookie_range(name).0
}

fn cookie_range(name: &[u8]) -> (u64, u64) {
    let first = COOKIE_BASE | (name_hash(name) << 8);
    (first, first + COOKIE_SLOTS)
}

// ---- record encodings ----

fn kind_code(k: FileKind) -> u8 {
    match k {
        FileKind::Regular => 1,
        FileKind::Directory => 2,
        FileKind::Symlink => 3,
        FileKind::Fifo => 4,
        FileKind::Socket => 5,
        FileKind::CharDevice => 6,
        FileKind::BlockDevice => 7,
    }
}

fn kind_from(code: u8) -> Option<FileKind> {
    Some(match code {
        1 => FileKind::Regular,
        2 => FileKind::Directory,
        3 => FileKind::Symlink,
        4 => FileKind::Fifo,
        5 => FileKind::Socket,
        6 => FileKind::CharDevice,
        7 => FileKind::BlockDevice,
        _ => return None,
    })
}

fn put_time(out: &mut Vec<u8>, t: Timestamp) {
    out.extend_from_slice(&t.secs.to_le_bytes());
    out.extend_from_slice(&t.nsecs.to_le_bytes());
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2)
            .map(|b| u16::from_le_bytes(b.try_into().expect("2")))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4")))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8")))
    }
    fn time(&mut self) -> Option<Timestamp> {
        let secs = i64::from_le_bytes(self.take(8)?.try_into().expect("8"));
        let nsecs = self.u32()?;
        (nsecs < 1_000_000_000).then_some(Timestamp { secs, nsecs })
    }
    fn done(&self) -> bool {
        self.at == self.b.len()
    }
}

pub(crate) fn encode_inode(rec: &InodeRecord) -> Vec<u8> {
    let a = &rec.attr;
    let inline = match &rec.content {
        RecordContent::Inline(d) => d.as_slice(),
        _ => &[],
    };
    let mut out = Vec::with_capacity(INODE_FIXED_BYTES + inline.len());
    out.push(RECORD_VERSION);
    out.push(kind_code(a.kind));
    out.extend_from_slice(&a.perm.to_le_bytes());
    out.extend_from_slice(&a.uid.to_le_bytes());
    out.extend_from_slice(&a.gid.to_le_bytes());
    out.extend_from_slice(&a.nlink.to_le_bytes());
    out.extend_from_slice(&a.size.to_le_bytes());
    out.extend_from_slice(&a.rdev.to_le_bytes());
    out.extend_from_slice(&a.generation.to_le_bytes());
    for t in [a.atime, a.mtime, a.ctime, a.crtime] {
        put_time(&mut out, t);
    }
    let (code, word) = match &rec.content {
        RecordContent::None => (0u8, 0u64),
        RecordContent::Inline(_) => (1, 0),
        RecordContent::Blocks {
            allocated_sub_blocks,
        } => (2, *allocated_sub_blocks),
        RecordContent::Dir { parent } => (3, *parent),
    };
    out.push(code);
    debug_assert!((1..=crate::inode::COPIES_MAX as u8).contains(&rec.copies));
    let copies_bits =
        (rec.copies.clamp(1, crate::inode::COPIES_MAX as u8) - 1) << FLAGS_COPIES_SHIFT;
    out.push(if rec.xattrs { 0 } else { FLAG_NO_XATTRS } | copies_bits);
    // The pool, plus one: 0 (the bytes' value before pools were recorded) is the default.
    let pool = rec.pool.map_or(0, |p| {
        p.checked_add(1).expect("pool ids stay below u16::MAX")
    });
    out.extend_from_slice(&pool.to_le_bytes());
    out.extend_from_slice(&word.to_le_bytes());
    out.extend_from_slice(&(inline.len() as u32).to_le_bytes());
    debug_assert_eq!(out.len(), INODE_FIXED_BYTES);
    out.extend_from_slice(inline);
    out
}

pub(crate) fn decode_inode(ino: Ino, b: &[u8]) -> FsResult<InodeRecord> {
    let bad = |why: &str| corrupt(format!("inode {ino}: record {why}"));
    let mut r = Reader { b, at: 0 };
    let version = r.u8().ok_or_else(|| bad("is empty"))?;
    if version != RECORD_VERSION {
        return Err(bad(&format!(
            "has version {version} (this build reads {RECORD_VERSION})"
        )));
    }
    let short = || bad("is truncated");
    let kind =
        kind_from(r.u8().ok_or_else(short)?).ok_or_else(|| bad("has an unknown file kind"))?;
    let perm = r.u16().ok_or_else(short)?;
    let uid = r.u32().ok_or_else(short)?;
    let gid = r.u32().ok_or_else(short)?;
    let nlink = r.u32().ok_or_else(short)?;
    let size = r.u64().ok_or_else(short)?;
    let rdev = r.u32().ok_or_else(short)?;
    let generation = r.u32().ok_or_else(short)?;
    let mut times = [Timestamp::default(); 4];
    for t in &mut times {
        *t = r.time().ok_or_else(|| bad("has a bad timestamp"))?;
    }
    let code = r.u8().ok_or_else(short)?;
    let flags = r.u8().ok_or_else(short)?;
    if flags & !(FLAG_NO_XATTRS | FLAGS_COPIES_MASK) != 0 {
        return Err(bad(&format!("has unknown flags {flags:#04x}")));
    }
    let copies = ((flags & FLAGS_COPIES_MASK) >> FLAGS_COPIES_SHIFT) + 1;
    if usize::from(copies) > crate::inode::COPIES_MAX {
        return Err(bad(&format!("asks for {copies} copies of its data")));
    }
    let pool = r.u16().ok_or_else(short)?.checked_sub(1);
    let word = r.u64().ok_or_else(short)?;
    let inline_len = r.u32().ok_or_else(short)? as usize;
    let inline = r.take(inline_len).ok_or_else(short)?;
    if !r.done() {
        return Err(bad("has trailing bytes"));
    }
    let content = match code {
        0 => RecordContent::None,
        1 => RecordContent::Inline(inline.to_vec()),
        2 => RecordContent::Blocks {
            allocated_sub_blocks: word,
        },
        3 => RecordContent::Dir { parent: word },
        _ => return Err(bad("has an unknown content type")),
    };
    if code != 1 && inline_len != 0 {
        return Err(bad("has inline bytes without inline content"));
    }
    Ok(InodeRecord {
        attr: Attr {
            ino,
            kind,
            perm,
            uid,
            gid,
            nlink,
            size,
            rdev,
            atime: times[0],
            mtime: times[1],
            ctime: times[2],
            crtime: times[3],
            generation,
        },
        content,
        xattrs: flags & FLAG_NO_XATTRS == 0,
        pool,
        copies,
    })
}

/// The bytes of a directory entry's item besides its name: the key (17: directory, tag,
/// cookie) and the value's inode number, kind and name length (10).
pub(crate) const DIRENT_FIXED_BYTES: u64 = 17 + 10;

fn encode_dirent(item: &DirItem) -> Vec<u8> {
    let mut out = Vec::with_capacity(10 + item.name.len());
    out.extend_from_slice(&item.ino.to_le_bytes());
    out.push(kind_code(item.kind));
    out.push(item.name.len() as u8);
    out.extend_from_slice(&item.name);
    out
}

fn decode_dirent(dir: Ino, cookie: u64, b: &[u8]) -> FsResult<DirItem> {
    let bad = || {
        corrupt(format!(
            "directory {dir}: entry at cookie {cookie:#x} is malformed"
        ))
    };
    let mut r = Reader { b, at: 0 };
    let ino = r.u64().ok_or_else(bad)?;
    let kind = kind_from(r.u8().ok_or_else(bad)?).ok_or_else(bad)?;
    let len = r.u8().ok_or_else(bad)? as usize;
    let name = r.take(len).ok_or_else(bad)?.to_vec();
    if !r.done() || name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(bad());
    }
    Ok(DirItem {
        cookie,
        name,
        ino,
        kind,
    })
}

#[cfg(test)]
pub(crate) fn encode_block(b: &BlockRef) -> Vec<u8> {
    let mut out = Vec::new();
    encode_block_into(b, &mut out);
    out
}

/// [`encode_block`] into `out`, emptied first (a buffer kept for the next one).
pub(crate) fn encode_block_into(b: &BlockRef, out: &mut Vec<u8>) {
    let s = b.sectors();
    out.clear();
    out.reserve(24 + 4 * s + 8 * s.div_ceil(64) + 9 * b.pending.len() + 16 * b.copies.len());
    debug_assert!(b.copies.len() < crate::inode::COPIES_MAX);
    out.extend_from_slice(&b.extent.addr.disk.to_le_bytes());
    out.push(b.copies.len() as u8);
    out.extend_from_slice(&[0; 5]);
    out.extend_from_slice(&b.extent.addr.sub_block.to_le_bytes());
    out.extend_from_slice(&b.extent.sub_blocks.to_le_bytes());
    out.extend_from_slice(&(s as u16).to_le_bytes());
    out.extend_from_slice(&(b.pending.len() as u16).to_le_bytes());
    out.extend(b.crcs.iter().flat_map(|c| c.to_le_bytes()));
    for w in 0..s.div_ceil(64) {
        out.extend_from_slice(&b.unwritten.get(w).copied().unwrap_or(0).to_le_bytes());
    }
    for (sector, alt) in &b.pending {
        out.extend_from_slice(&sector.to_le_bytes());
        match alt {
            Alternative::Crc(c) => {
                out.push(0);
                out.extend_from_slice(&c.to_le_bytes());
            }
            Alternative::Unwritten => {
                out.push(1);
                out.extend_from_slice(&[0; 4]);
            }
        }
    }
    for c in &b.copies {
        out.extend_from_slice(&c.addr.disk.to_le_bytes());
        out.extend_from_slice(&[0; 6]);
        out.extend_from_slice(&c.addr.sub_block.to_le_bytes());
    }
}

pub(crate) fn decode_block(ino: Ino, index: u64, b: &[u8]) -> FsResult<BlockRef> {
    let bad = |why: &str| corrupt(format!("inode {ino}: block {index} reference {why}"));
    let short = || bad("is truncated");
    let mut r = Reader { b, at: 0 };
    let disk = r.u16().ok_or_else(short)?;
    let copy_count = r.u8().ok_or_else(short)? as usize;
    if copy_count >= crate::inode::COPIES_MAX {
        return Err(bad("has more copies than a file system keeps"));
    }
    if r.take(5).ok_or_else(short)?.iter().any(|x| *x != 0) {
        return Err(bad("has non-zero reserved bytes"));
    }
    let sub_block = r.u64().ok_or_else(short)?;
    let sub_blocks = r.u32().ok_or_else(short)?;
    let sectors = r.u16().ok_or_else(short)? as usize;
    let pending_count = r.u16().ok_or_else(short)? as usize;
    if sectors == 0 || sub_blocks == 0 {
        return Err(bad("is empty"));
    }
    // Read whole arrays at once: a 4 MiB block has 1,024 checksums, and every read and
    // write of the block decodes them (per-element reads were a fifth of a 4 KiB random
    // read's CPU).
    let crcs: Vec<u32> = r
        .take(sectors * 4)
        .ok_or_else(short)?
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4")))
        .collect();
    let unwritten: Vec<u64> = r
        .take(sectors.div_ceil(64) * 8)
        .ok_or_else(short)?
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8")))
        .collect();
    let mut pending = std::collections::BTreeMap::new();
    for _ in 0..pending_count {
        let sector = r.u32().ok_or_else(short)?;
        let tag = r.u8().ok_or_else(short)?;
        let crc = r.u32().ok_or_else(short)?;
        if sector as usize >= sectors {
            return Err(bad("names a pending sector past its end"));
        }
        let alt = match tag {
            0 => Alternative::Crc(crc),
            1 if crc == 0 => Alternative::Unwritten,
            _ => return Err(bad("has an unknown pending tag")),
        };
        if pending.insert(sector, alt).is_some() {
            return Err(bad("names a pending sector twice"));
        }
    }
    let mut copies = Vec::with_capacity(copy_count);
    for _ in 0..copy_count {
        let disk = r.u16().ok_or_else(short)?;
        if r.take(6).ok_or_else(short)?.iter().any(|x| *x != 0) {
            return Err(bad("has non-zero reserved bytes in a copy"));
        }
        let sub_block = r.u64().ok_or_else(short)?;
        copies.push(Extent {
            addr: DiskAddr { disk, sub_block },
            sub_blocks,
        });
    }
    if !r.done() {
        return Err(bad("has trailing bytes"));
    }
    Ok(BlockRef {
        extent: Extent {
            addr: DiskAddr { disk, sub_block },
            sub_blocks,
        },
        crcs,
        unwritten,
        pending,
        copies,
    })
}

// ---- the shard tree ----

/// The items of one shard. Operations take the store that caches every shard's pages.
#[derive(Debug)]
pub(crate) struct ShardTree {
    pub tree: Tree,
    /// Decoded references of the blocks written or read last. An in-place write reads its
    /// block's reference three times (the data path's view, the sector change, the settle)
    /// and a 4 MiB block's reference is 1,024 checksums: decoding it each time was a tenth
    /// of a random 4 KiB write's CPU. Written through by every change of a block in this
    /// tree, so it never differs from the tree.
    recent_blocks: HashMap<(Ino, u64), BlockRef>,
    /// Where block references are encoded before they go into their leaf.
    encoded: Vec<u8>,
}

/// Bound of [`ShardTree::recent_blocks`] per shard (about 4 KiB each for 4 MiB blocks: 1 MiB
/// a shard, 8 MiB with the default eight shards).
const RECENT_BLOCKS_MAX: usize = 256;

impl ShardTree {
    /// A shard whose items are in the tree rooted at `root`.
    pub fn on_disk(root: PagePtr) -> ShardTree {
        ShardTree::over(Tree::on_disk(root))
    }

    fn over(tree: Tree) -> ShardTree {
        ShardTree {
            tree,
            recent_blocks: HashMap::new(),
            encoded: Vec::new(),
        }
    }

    pub fn create(store: &mut MetaStore, first_ino: Ino) -> FsResult<ShardTree> {
        let mut t = ShardTree::over(store.create_tree());
        t.set_header(
            store,
            ShardHeader {
                next_ino: first_ino,
                inode_count: 0,
            },
        )?;
        Ok(t)
    }

    pub fn header(&self, store: &mut MetaStore) -> FsResult<ShardHeader> {
        let v = store
            .get(&self.tree, &key(0, TAG_HEADER))
            .map_err(meta_err)?
            .ok_or_else(|| corrupt("shard tree has no header".into()))?;
        decode_header(&v)
    }

    /// Reads the pages on the way to the headers of `trees` into the cache, each level of
    /// all the trees at once (`MetaStore::prefetch_paths`), so that opening many shards
    /// does not wait for their pages one after another.
    pub fn prefetch_headers(store: &mut MetaStore, trees: &[&ShardTree]) {
        let trees: Vec<&Tree> = trees.iter().map(|t| &t.tree).collect();
        store.prefetch_paths(&trees, &key(0, TAG_HEADER));
    }

    /// Up to `limit` items with keys from `from` on, in key order, and the key to continue
    /// from (`None` at the end), so a long walk can let go of the metadata lock between
    /// batches.
    pub fn scan_batch(
        &self,
        store: &mut MetaStore,
        from: &[u8],
        limit: usize,
    ) -> FsResult<(Vec<Item>, Option<Vec<u8>>)> {
        let batch = store
            .range(&self.tree, from, None, limit)
            .map_err(meta_err)?;
        let next = (batch.len() == limit).then(|| {
            let mut k = batch.last().expect("a full batch").0.clone();
            k.push(0);
            k
        });
        let items = batch
            .iter()
            .map(|(k, v)| decode_item(k, v))
            .collect::<FsResult<Vec<Item>>>()?;
        Ok((items, next))
    }

    /// Calls `f` for every item in key order, reading the tree in batches.
    pub fn scan(
        &self,
        store: &mut MetaStore,
        f: &mut dyn FnMut(Item) -> FsResult<()>,
    ) -> FsResult<()> {
        let mut from = Vec::new();
        loop {
            let batch = store
                .range(&self.tree, &from, None, 1024)
                .map_err(meta_err)?;
            let Some((last, _)) = batch.last() else {
                return Ok(());
            };
            from = last.clone();
            from.push(0);
            for (k, v) in &batch {
                f(decode_item(k, v)?)?;
            }
        }
    }
}

fn decode_header(v: &[u8]) -> FsResult<ShardHeader> {
    {
        let mut r = Reader { b: v, at: 0 };
        match (r.u64(), r.u64(), r.done()) {
            (Some(next_ino), Some(inode_count), true) => Ok(ShardHeader {
                next_ino,
                inode_count,
            }),
            _ => Err(corrupt("shard header is malformed".into())),
        }
    }
}

/// Decodes any item from its key and value.
fn decode_item(k: &[u8], v: &[u8]) -> FsResult<Item> {
    let bad = || corrupt(format!("shard tree item with key {k:02x?} is malformed"));
    if k.len() < 9 {
        return Err(bad());
    }
    let ino = u64::from_be_bytes(k[..8].try_into().expect("8 bytes"));
    let tag = k[8];
    Ok(match (ino, tag, k.len()) {
        (0, TAG_HEADER, 9) => Item::Header(decode_header(v)?),
        (0, TAG_ORPHAN, 17) => Item::Orphan(tail_u64(k)),
        (0, _, _) => return Err(bad()),
        (_, TAG_INODE, 9) => Item::Inode(decode_inode(ino, v)?),
        (_, TAG_XATTR, n) if n >= 12 && k[n - 2] == 0 => Item::Xattr {
            ino,
            name: k[9..n - 2].to_vec(),
            chunk: k[n - 1],
        },
        (_, TAG_DIRENT, 17) => Item::Dirent {
            dir: ino,
            item: decode_dirent(ino, tail_u64(k), v)?,
        },
        (_, TAG_BLOCK, 17) => Item::Block {
            ino,
            index: tail_u64(k),
            block: decode_block(ino, tail_u64(k), v)?,
        },
        _ => return Err(bad()),
    })
}

impl ShardTree {
    pub fn set_header(&mut self, store: &mut MetaStore, h: ShardHeader) -> FsResult<()> {
        let mut v = h.next_ino.to_le_bytes().to_vec();
        v.extend_from_slice(&h.inode_count.to_le_bytes());
        store
            .insert(&mut self.tree, &key(0, TAG_HEADER), &v)
            .map_err(meta_err)?;
        Ok(())
    }

    pub fn inode(&self, store: &mut MetaStore, ino: Ino) -> FsResult<Option<InodeRecord>> {
        store
            .get(&self.tree, &key(ino, TAG_INODE))
            .map_err(meta_err)?
            .map(|v| decode_inode(ino, &v))
            .transpose()
    }

    /// Writes the inode record; returns whether the inode is new.
    pub fn put_inode(&mut self, store: &mut MetaStore, rec: &InodeRecord) -> FsResult<bool> {
        let old = store
            .insert(
                &mut self.tree,
                &key(rec.attr.ino, TAG_INODE),
                &encode_inode(rec),
            )
            .map_err(meta_err)?;
        Ok(old.is_none())
    }

    /// Removes just the inode's record (an inode with nothing else under its key).
    pub fn remove_record(&mut self, store: &mut MetaStore, ino: Ino) -> FsResult<()> {
        store
            .remove(&mut self.tree, &key(ino, TAG_INODE))
            .map_err(meta_err)?;
        Ok(())
    }

    /// Removes the inode and every item under it; returns the block references it held.
    pub fn remove_inode(&mut self, store: &mut MetaStore, ino: Ino) -> FsResult<Vec<BlockRef>> {
        self.forget_inode(ino);
        let mut blocks = Vec::new();
        let start = key(ino, 0);
        let end = key(ino + 1, 0);
        loop {
            let batch = store
                .range(&self.tree, &start, Some(&end), 256)
                .map_err(meta_err)?;
            if batch.is_empty() {
                break;
            }
            for (k, v) in batch {
                if k.len() == 17 && k[8] == TAG_BLOCK {
                    blocks.push(decode_block(ino, tail_u64(&k), &v)?);
                }
                store.remove(&mut self.tree, &k).map_err(meta_err)?;
            }
        }
        Ok(blocks)
    }

    pub fn set_orphan(&mut self, store: &mut MetaStore, ino: Ino, orphan: bool) -> FsResult<()> {
        let k = key_u64(0, TAG_ORPHAN, ino);
        if orphan {
            store.insert(&mut self.tree, &k, &[]).map_err(meta_err)?;
        } else {
            store.remove(&mut self.tree, &k).map_err(meta_err)?;
        }
        Ok(())
    }

    pub fn orphans(&self, store: &mut MetaStore) -> FsResult<Vec<Ino>> {
        let items = store
            .range(
                &self.tree,
                &key(0, TAG_ORPHAN),
                Some(&key(0, TAG_ORPHAN + 1)),
                usize::MAX,
            )
            .map_err(meta_err)?;
        Ok(items.iter().map(|(k, _)| tail_u64(k)).collect())
    }

    // ---- directories ----

    /// The entry `name` of `dir` and the cookie a new entry of that name would get, from
    /// one look at the keys of the name's hash (one leaf; almost always none or one key).
    pub fn dir_probe(&self, store: &mut MetaStore, dir: Ino, name: &[u8]) -> FsResult<DirProbe> {
        let (first, end) = cookie_range(name);
        let items = store
            .range(
                &self.tree,
                &key_u64(dir, TAG_DIRENT, first),
                Some(&key_u64(dir, TAG_DIRENT, end)),
                COOKIE_SLOTS as usize,
            )
            .map_err(meta_err)?;
        let mut found = None;
        let mut free = first;
        for (k, v) in items {
            let cookie = tail_u64(&k);
            if cookie == free {
                free += 1;
            }
            if found.is_none() {
                let item = decode_dirent(dir, cookie, &v)?;
                if item.name == name {
                    found = Some(item);
                }
            }
        }
        Ok(DirProbe {
            found,
            free: (free < end).then_some(free),
        })
    }

    #[cfg(test)]
    pub fn dir_lookup(
        &self,
        store: &mut MetaStore,
        dir: Ino,
        name: &[u8],
    ) -> FsResult<Option<DirItem>> {
        Ok(self.dir_probe(store, dir, name)?.found)
    }

    /// The cookie a new entry `name` gets: the first free index among its hash's slots.
    #[cfg(test)]
    pub fn dir_new_cookie(&self, store: &mut MetaStore, dir: Ino, name: &[u8]) -> FsResult<u64> {
        self.dir_probe(store, dir, name)?
            .free
            .ok_or_else(hash_slots_full)
    }

    /// Inserts (or replaces) the entry at `item.cookie`; returns the entry replaced.
    pub fn dir_insert(
        &mut self,
        store: &mut MetaStore,
        dir: Ino,
        item: &DirItem,
    ) -> FsResult<Option<DirItem>> {
        let (first, end) = cookie_range(&item.name);
        if !(first..end).contains(&item.cookie) {
            return Err(corrupt(format!(
                "directory {dir}: cookie {:#x} does not belong to its name",
                item.cookie
            )));
        }
        store
            .insert(
                &mut self.tree,
                &key_u64(dir, TAG_DIRENT, item.cookie),
                &encode_dirent(item),
            )
            .map_err(meta_err)?
            .map(|old| decode_dirent(dir, item.cookie, &old))
            .transpose()
    }

    #[cfg(test)]
    pub fn dir_remove(
        &mut self,
        store: &mut MetaStore,
        dir: Ino,
        name: &[u8],
    ) -> FsResult<Option<DirItem>> {
        let Some(item) = self.dir_lookup(store, dir, name)? else {
            return Ok(None);
        };
        self.dir_remove_cookie(store, dir, item.cookie)?;
        Ok(Some(item))
    }

    /// Removes the entry at `cookie` (found by a probe); false when there is none.
    pub fn dir_remove_cookie(
        &mut self,
        store: &mut MetaStore,
        dir: Ino,
        cookie: u64,
    ) -> FsResult<bool> {
        Ok(store
            .remove(&mut self.tree, &key_u64(dir, TAG_DIRENT, cookie))
            .map_err(meta_err)?
            .is_some())
    }

    /// Up to `limit` entries with cookies at or after `from`, in cookie order.
    pub fn dir_list(
        &self,
        store: &mut MetaStore,
        dir: Ino,
        from: u64,
        limit: usize,
    ) -> FsResult<Vec<DirItem>> {
        let items = store
            .range(
                &self.tree,
                &key_u64(dir, TAG_DIRENT, from.max(COOKIE_BASE)),
                Some(&key(dir, TAG_DIRENT + 1)),
                limit,
            )
            .map_err(meta_err)?;
        items
            .iter()
            .map(|(k, v)| decode_dirent(dir, tail_u64(k), v))
            .collect()
    }

    pub fn dir_is_empty(&self, store: &mut MetaStore, dir: Ino) -> FsResult<bool> {
        Ok(self.dir_list(store, dir, 0, 1)?.is_empty())
    }

    // ---- block maps ----

    fn remember(&mut self, ino: Ino, index: u64, block: BlockRef) {
        if self.recent_blocks.len() >= RECENT_BLOCKS_MAX
            && !self.recent_blocks.contains_key(&(ino, index))
        {
            // Any entry will do: the set is small and only saves decoding.
            let victim = *self.recent_blocks.keys().next().expect("full");
            self.recent_blocks.remove(&victim);
        }
        self.recent_blocks.insert((ino, index), block);
    }

    fn forget_inode(&mut self, ino: Ino) {
        self.recent_blocks.retain(|(i, _), _| *i != ino);
    }

    pub fn block(
        &mut self,
        store: &mut MetaStore,
        ino: Ino,
        index: u64,
    ) -> FsResult<Option<BlockRef>> {
        Ok(self.cached(store, ino, index)?.cloned())
    }

    /// The decoded reference of block `index` in `recent_blocks`, read from the tree first
    /// when it is not there; `None` when the block is not mapped.
    fn cached(
        &mut self,
        store: &mut MetaStore,
        ino: Ino,
        index: u64,
    ) -> FsResult<Option<&mut BlockRef>> {
        if !self.recent_blocks.contains_key(&(ino, index)) {
            let read = store
                .get_with(&self.tree, &key_u64(ino, TAG_BLOCK, index), |v| {
                    decode_block(ino, index, v)
                })
                .map_err(meta_err)?;
            let Some(b) = read.transpose()? else {
                return Ok(None);
            };
            self.remember(ino, index, b);
        }
        Ok(self.recent_blocks.get_mut(&(ino, index)))
    }

    /// Changes the reference of block `index` in place with `f`, which says whether it
    /// changed anything; `None` when the block is not mapped. The reference is encoded and
    /// stored only when it changed.
    pub fn modify_block(
        &mut self,
        store: &mut MetaStore,
        ino: Ino,
        index: u64,
        f: impl FnOnce(&mut BlockRef) -> FsResult<bool>,
    ) -> FsResult<Option<bool>> {
        if self.cached(store, ino, index)?.is_none() {
            return Ok(None);
        }
        let b = self
            .recent_blocks
            .get_mut(&(ino, index))
            .expect("cached just now");
        let changed = match f(b) {
            Ok(changed) => changed,
            Err(e) => {
                // `f` may have changed part of it: the tree has the reference as it was.
                self.recent_blocks.remove(&(ino, index));
                return Err(e);
            }
        };
        if changed {
            encode_block_into(b, &mut self.encoded);
            let stored = store.put(
                &mut self.tree,
                &key_u64(ino, TAG_BLOCK, index),
                &self.encoded,
            );
            if let Err(e) = stored {
                self.recent_blocks.remove(&(ino, index));
                return Err(meta_err(e));
            }
        }
        Ok(Some(changed))
    }

    /// Maps block `index`; returns the reference it replaces.
    pub fn put_block(
        &mut self,
        store: &mut MetaStore,
        ino: Ino,
        index: u64,
        block: &BlockRef,
    ) -> FsResult<Option<BlockRef>> {
        encode_block_into(block, &mut self.encoded);
        let old = store
            .insert(
                &mut self.tree,
                &key_u64(ino, TAG_BLOCK, index),
                &self.encoded,
            )
            .map_err(meta_err)?;
        let old = match self.recent_blocks.remove(&(ino, index)) {
            Some(cached) => Some(cached),
            None => old.map(|v| decode_block(ino, index, &v)).transpose()?,
        };
        self.remember(ino, index, block.clone());
        Ok(old)
    }

    pub fn remove_block(
        &mut self,
        store: &mut MetaStore,
        ino: Ino,
        index: u64,
    ) -> FsResult<Option<BlockRef>> {
        let cached = self.recent_blocks.remove(&(ino, index));
        let old = store
            .remove(&mut self.tree, &key_u64(ino, TAG_BLOCK, index))
            .map_err(meta_err)?;
        match (cached, old) {
            (Some(b), Some(_)) => Ok(Some(b)),
            (_, old) => old.map(|v| decode_block(ino, index, &v)).transpose(),
        }
    }

    /// Up to `limit` mapped blocks with index >= `from`, in index order.
    pub fn blocks(
        &mut self,
        store: &mut MetaStore,
        ino: Ino,
        from: u64,
        limit: usize,
    ) -> FsResult<Vec<(u64, BlockRef)>> {
        if limit == 1 {
            // One block, as the data path asks for: the first mapped at or past `from` is
            // `from` itself when it is mapped (a point lookup, decoded in place).
            if let Some(b) = self.block(store, ino, from)? {
                return Ok(vec![(from, b)]);
            }
        }
        let items = store
            .range(
                &self.tree,
                &key_u64(ino, TAG_BLOCK, from),
                Some(&key(ino, TAG_BLOCK + 1)),
                limit,
            )
            .map_err(meta_err)?;
        items
            .iter()
            .map(|(k, v)| {
                let index = tail_u64(k);
                Ok((index, decode_block(ino, index, v)?))
            })
            .collect()
    }

    // ---- extended attributes ----

    pub fn xattr(&self, store: &mut MetaStore, ino: Ino, name: &[u8]) -> FsResult<Option<Vec<u8>>> {
        let mut value: Option<Vec<u8>> = None;
        for chunk in 0..XATTR_CHUNKS_MAX as u8 {
            match store
                .get(&self.tree, &xattr_key(ino, name, chunk))
                .map_err(meta_err)?
            {
                Some(part) => value.get_or_insert_with(Vec::new).extend_from_slice(&part),
                None => break,
            }
        }
        Ok(value)
    }

    pub fn set_xattr(
        &mut self,
        store: &mut MetaStore,
        ino: Ino,
        name: &[u8],
        value: &[u8],
    ) -> FsResult<()> {
        if name.is_empty()
            || name.contains(&0)
            || value.len() > XATTR_CHUNK_BYTES * XATTR_CHUNKS_MAX
        {
            return Err(FsError::Invalid(format!(
                "extended attribute of {} name bytes and {} value bytes",
                name.len(),
                value.len()
            )));
        }
        self.remove_xattr(store, ino, name)?;
        let chunks: Vec<&[u8]> = if value.is_empty() {
            vec![&[][..]]
        } else {
            value.chunks(XATTR_CHUNK_BYTES).collect()
        };
        for (i, part) in chunks.iter().enumerate() {
            store
                .insert(&mut self.tree, &xattr_key(ino, name, i as u8), part)
                .map_err(meta_err)?;
        }
        Ok(())
    }

    pub fn remove_xattr(&mut self, store: &mut MetaStore, ino: Ino, name: &[u8]) -> FsResult<bool> {
        let mut any = false;
        for chunk in 0..XATTR_CHUNKS_MAX as u8 {
            if store
                .remove(&mut self.tree, &xattr_key(ino, name, chunk))
                .map_err(meta_err)?
                .is_none()
            {
                break;
            }
            any = true;
        }
        Ok(any)
    }

    pub fn xattr_names(&self, store: &mut MetaStore, ino: Ino) -> FsResult<Vec<Vec<u8>>> {
        let items = store
            .range(
                &self.tree,
                &key(ino, TAG_XATTR),
                Some(&key(ino, TAG_XATTR + 1)),
                usize::MAX,
            )
            .map_err(meta_err)?;
        Ok(items
            .iter()
            .filter(|(k, _)| k[k.len() - 1] == 0)
            .map(|(k, _)| k[9..k.len() - 2].to_vec())
            .collect())
    }
}

#[cfg(test)]
#[path = "shard_tree_tests.rs"]
mod tests;
