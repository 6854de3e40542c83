//! The shard tree against a model, over a real file-backed drive with a page cache of a few
//! pages, checkpointed and reopened; golden bytes of every record.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use proptest::prelude::*;
use tessera_drive::{AlignedBuf, BlockDevice, FileDrive};
use tessera_meta::{MetaStore, PageAddr, PageFormat, PagePtr, PageReader};

use super::*;

const PAGE: usize = 16384;

struct Reader(Arc<dyn BlockDevice>);
impl PageReader for Reader {
    fn read_page(&self, addr: PageAddr, page: &mut [u8]) -> std::io::Result<()> {
        let mut buf = AlignedBuf::zeroed(PAGE);
        self.0.read_at(&mut buf, addr.0 * PAGE as u64)?;
        page.copy_from_slice(&buf);
        Ok(())
    }
}

struct Disk {
    _dir: tempfile::TempDir,
    drive: Arc<dyn BlockDevice>,
    free: BTreeSet<u64>,
    generation: u64,
}

impl Disk {
    fn new(pages: u64) -> Disk {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.img");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(pages * PAGE as u64)
            .unwrap();
        let drive: Arc<dyn BlockDevice> = Arc::new(FileDrive::open(&path).unwrap());
        Disk {
            _dir: dir,
            drive,
            free: (0..pages).collect(),
            generation: 1,
        }
    }

    fn store(&self, cache_pages: usize) -> MetaStore {
        MetaStore::new(
            PageFormat::new(PAGE, 42).unwrap(),
            Arc::new(Reader(self.drive.clone())),
            cache_pages,
            self.generation,
        )
    }

    fn checkpoint(&mut self, store: &mut MetaStore, t: &mut ShardTree) -> PagePtr {
        let free = &mut self.free;
        let cp = store
            .checkpoint(&mut [&mut t.tree], &mut |n| {
                let v: Vec<u64> = free.iter().take(n).copied().collect();
                for a in &v {
                    free.remove(a);
                }
                Ok(v.into_iter().map(|a| PageAddr(a).into()).collect())
            })
            .unwrap();
        for page in &cp.pages {
            self.drive
                .write_at(
                    &AlignedBuf::from_slice(&page.bytes()),
                    page.addr.0 * PAGE as u64,
                )
                .unwrap();
        }
        self.drive.flush().unwrap();
        store.written(cp.generation);
        self.generation = cp.generation + 1;
        for a in cp.superseded {
            self.free.insert(a.0);
        }
        t.tree.root().unwrap()
    }
}

fn attr(ino: Ino, kind: FileKind, size: u64) -> Attr {
    Attr {
        ino,
        kind,
        perm: 0o644,
        uid: 1000,
        gid: 100,
        nlink: 1,
        size,
        rdev: 0,
        atime: Timestamp { secs: 1, nsecs: 2 },
        mtime: Timestamp { secs: -3, nsecs: 4 },
        ctime: Timestamp {
            secs: 5,
            nsecs: 999_999_999,
        },
        crtime: Timestamp { secs: 7, nsecs: 0 },
        generation: 9,
    }
}

fn block(seed: u64, sectors: usize) -> BlockRef {
    let mut b = BlockRef::new_unwritten(
        Extent {
            addr: DiskAddr {
                disk: (seed % 7) as u16,
                sub_block: seed * 512,
            },
            sub_blocks: 512,
        },
        sectors,
    );
    for s in 0..sectors {
        if !(seed + s as u64).is_multiple_of(3) {
            b.set_written(
                s,
                (seed as u32)
                    .wrapping_mul(2654435761)
                    .wrapping_add(s as u32),
            );
        }
    }
    if seed.is_multiple_of(2) && sectors > 2 {
        b.pending.insert(1, Alternative::Crc(0xdead_beef));
        b.pending.insert(2, Alternative::Unwritten);
    }
    b
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn golden_inode_record() {
    let rec = InodeRecord {
        attr: attr(0x1234, FileKind::Symlink, 3),
        content: RecordContent::Inline(b"abc".to_vec()),
        xattrs: true,
        pool: Some(2),
        copies: 1,
    };
    let bytes = encode_inode(&rec);
    assert_eq!(
        hex(&bytes),
        concat!(
            "01",
            "03",
            "a401",
            "e8030000", // version, symlink, perm 0644, uid 1000
            "64000000",
            "01000000",
            "0300000000000000", // gid, nlink, size
            "00000000",
            "09000000", // rdev, generation
            "0100000000000000",
            "02000000", // atime
            "fdffffffffffffff",
            "04000000", // mtime (negative seconds)
            "0500000000000000",
            "ffc99a3b", // ctime
            "0700000000000000",
            "00000000", // crtime
            "01",
            "00",
            "0300",
            "0000000000000000", // inline content, flags (may have xattrs), pool 2 + 1, word
            "03000000",
            "616263", // inline length and bytes
        )
    );
    assert_eq!(decode_inode(0x1234, &bytes).unwrap(), rec);
    let dir = InodeRecord {
        attr: attr(8, FileKind::Directory, 0),
        content: RecordContent::Dir { parent: 1 },
        xattrs: false,
        pool: None,
        copies: 1,
    };
    let bytes = encode_inode(&dir);
    // Directory content, flag "no extended attributes", the parent.
    assert_eq!(hex(&bytes[80..96]), "03010000010000000000000000000000");
    assert_eq!(decode_inode(8, &bytes).unwrap(), dir);
    // Bits 1-2: the copies of the file's data, minus one.
    let mut two = bytes.clone();
    two[81] = 0x03;
    assert_eq!(decode_inode(8, &two).unwrap().copies, 2);
    let mut four = bytes.clone();
    four[81] = 0x07;
    assert!(decode_inode(8, &four)
        .unwrap_err()
        .to_string()
        .contains("4 copies"));
    let mut unknown = bytes.clone();
    unknown[81] = 0x09;
    assert!(decode_inode(8, &unknown)
        .unwrap_err()
        .to_string()
        .contains("unknown flags"));
}

#[test]
fn golden_block_reference_and_directory_entry() {
    let b = block(2, 3);
    let bytes = encode_block(&b);
    assert_eq!(
        hex(&bytes),
        concat!(
            "0200",
            "000000000000",
            "0004000000000000",
            "00020000", // disk, zero, sub-block, count
            "0300",
            "0200", // sectors, pending
            "62f36e3c",
            "00000000",
            "64f36e3c",         // crcs: sector 1 never written
            "0200000000000000", // unwritten bitmap: sector 1
            "01000000",
            "00",
            "efbeadde", // pending sector 1: older crc
            "02000000",
            "01",
            "00000000", // pending sector 2: unwritten
        )
    );
    assert_eq!(decode_block(5, 0, &bytes).unwrap(), b);
    let e = DirItem {
        cookie: COOKIE_BASE,
        name: b"f.txt".to_vec(),
        ino: 77,
        kind: FileKind::Regular,
    };
    assert_eq!(
        hex(&encode_dirent(&e)),
        "4d00000000000000010566".to_string() + "2e747874"
    );
    assert_eq!(
        decode_dirent(9, COOKIE_BASE, &encode_dirent(&e)).unwrap(),
        e
    );
}

#[test]
fn golden_block_reference_with_copies() {
    let mut b = BlockRef::new_unwritten(
        Extent {
            addr: DiskAddr {
                disk: 1,
                sub_block: 0x20,
            },
            sub_blocks: 2,
        },
        1,
    );
    b.set_written(0, 0x0403_0201);
    b.copies = vec![
        Extent {
            addr: DiskAddr {
                disk: 3,
                sub_block: 0x40,
            },
            sub_blocks: 2,
        },
        Extent {
            addr: DiskAddr {
                disk: 0x105,
                sub_block: 0x60,
            },
            sub_blocks: 2,
        },
    ];
    let bytes = encode_block(&b);
    assert_eq!(
        hex(&bytes),
        concat!(
            "0100",
            "02",
            "0000000000",
            "2000000000000000",
            "02000000", // disk, copies, zero, sub-block, count
            "0100",
            "0000",             // sectors, pending
            "01020304",         // crc of sector 0
            "0000000000000000", // unwritten bitmap: none
            "0300",
            "000000000000",
            "4000000000000000", // second copy: disk 3
            "0501",
            "000000000000",
            "6000000000000000", // third copy: disk 261
        )
    );
    assert_eq!(decode_block(5, 0, &bytes).unwrap(), b);
    // A fourth copy is more than any file system keeps: refused, not read past.
    let mut four = bytes.clone();
    four[2] = 3;
    assert!(decode_block(5, 0, &four)
        .unwrap_err()
        .to_string()
        .contains("more copies"));
    // Copies promised but missing.
    let mut short = bytes.clone();
    short.truncate(bytes.len() - 16);
    assert!(decode_block(5, 0, &short).is_err());
}

#[test]
fn damaged_records_are_refused_by_name_never_a_panic() {
    let rec = encode_inode(&InodeRecord {
        attr: attr(3, FileKind::Regular, 10),
        content: RecordContent::Inline(vec![7; 10]),
        xattrs: false,
        pool: None,
        copies: 1,
    });
    for n in 0..rec.len() {
        let err = decode_inode(3, &rec[..n]).unwrap_err().to_string();
        assert!(err.contains("inode 3"), "{err}");
    }
    let mut bad = rec.clone();
    bad[1] = 99;
    assert!(decode_inode(3, &bad)
        .unwrap_err()
        .to_string()
        .contains("unknown file kind"));
    let blk = encode_block(&block(4, 70));
    for n in 0..blk.len() {
        assert!(decode_block(3, 1, &blk[..n]).is_err());
    }
    let mut extra = blk.clone();
    extra.push(0);
    assert!(decode_block(3, 1, &extra)
        .unwrap_err()
        .to_string()
        .contains("trailing"));
}

proptest! {
    #[test]
    fn records_round_trip(
        ino in 1u64.., size in any::<u64>(), inline in proptest::collection::vec(any::<u8>(), 0..3000),
        seed in any::<u64>(), sectors in 1usize..1025, xattrs in any::<bool>(),
    ) {
        let rec = InodeRecord { attr: attr(ino, FileKind::Regular, size), content: RecordContent::Inline(inline), xattrs, pool: None, copies: 1 };
        prop_assert_eq!(decode_inode(ino, &encode_inode(&rec)).unwrap(), rec);
        let mut b = block(seed % 1_000_000, sectors);
        for c in 0..(seed % 3) {
            let mut e = b.extent;
            e.addr.disk = (c + 8) as u16;
            e.addr.sub_block = seed.rotate_left(c as u32 * 7) >> 4;
            b.copies.push(e);
        }
        prop_assert_eq!(decode_block(ino, 0, &encode_block(&b)).unwrap(), b);
    }

    #[test]
    fn random_bytes_never_panic_the_decoders(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode_inode(1, &bytes);
        let _ = decode_block(1, 0, &bytes);
        let _ = decode_dirent(1, COOKIE_BASE, &bytes);
    }
}

/// What the shard holds, kept by the test.
#[derive(Default, Clone)]
struct Model {
    inodes: BTreeMap<Ino, InodeRecord>,
    dirs: BTreeMap<Ino, BTreeMap<Vec<u8>, (Ino, u64)>>,
    blocks: BTreeMap<(Ino, u64), BlockRef>,
    xattrs: BTreeMap<(Ino, Vec<u8>), Vec<u8>>,
}

#[derive(Clone, Debug)]
enum Op {
    Create(u8),
    Link(u8, u16),
    Unlink(u8, u16),
    Map(u8, u8, u16),
    Unmap(u8, u8),
    Xattr(u8, u8, u16),
    Free(u8),
    Checkpoint,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => any::<u8>().prop_map(Op::Create),
        6 => (any::<u8>(), any::<u16>()).prop_map(|(d, n)| Op::Link(d, n)),
        3 => (any::<u8>(), any::<u16>()).prop_map(|(d, n)| Op::Unlink(d, n)),
        4 => (any::<u8>(), any::<u8>(), 1u16..1025).prop_map(|(i, b, s)| Op::Map(i, b, s)),
        2 => (any::<u8>(), any::<u8>()).prop_map(|(i, b)| Op::Unmap(i, b)),
        2 => (any::<u8>(), any::<u8>(), 0u16..20000).prop_map(|(i, n, l)| Op::Xattr(i, n, l)),
        1 => any::<u8>().prop_map(Op::Free),
        1 => Just(Op::Checkpoint),
        1 => Just(Op::Reopen),
    ]
}

fn check(store: &mut MetaStore, t: &mut ShardTree, m: &Model) {
    for (ino, rec) in &m.inodes {
        assert_eq!(t.inode(store, *ino).unwrap().as_ref(), Some(rec));
    }
    for (dir, entries) in &m.dirs {
        let mut listed = BTreeMap::new();
        let mut from = 0;
        loop {
            let batch = t.dir_list(store, *dir, from, 7).unwrap();
            let Some(last) = batch.last() else { break };
            from = last.cookie + 1;
            for e in batch {
                assert!(
                    listed.insert(e.name.clone(), (e.ino, e.cookie)).is_none(),
                    "listed twice"
                );
            }
        }
        assert_eq!(&listed, entries);
        for (name, (ino, cookie)) in entries {
            let got = t.dir_lookup(store, *dir, name).unwrap().unwrap();
            assert_eq!((got.ino, got.cookie), (*ino, *cookie));
        }
        assert_eq!(t.dir_is_empty(store, *dir).unwrap(), entries.is_empty());
    }
    for ino in m.inodes.keys() {
        let want: Vec<(u64, BlockRef)> = m
            .blocks
            .range((*ino, 0)..=(*ino, u64::MAX))
            .map(|((_, i), b)| (*i, b.clone()))
            .collect();
        assert_eq!(t.blocks(store, *ino, 0, usize::MAX).unwrap(), want);
        if let Some((index, b)) = want.get(want.len() / 2) {
            assert_eq!(t.block(store, *ino, *index).unwrap().as_ref(), Some(b));
            let from = t.blocks(store, *ino, *index, 2).unwrap();
            assert_eq!(from[0], (*index, b.clone()));
        }
        let names: Vec<Vec<u8>> = m
            .xattrs
            .keys()
            .filter(|(i, _)| i == ino)
            .map(|(_, n)| n.clone())
            .collect();
        assert_eq!(t.xattr_names(store, *ino).unwrap(), names);
        for n in &names {
            assert_eq!(
                t.xattr(store, *ino, n).unwrap().as_ref(),
                m.xattrs.get(&(*ino, n.clone()))
            );
        }
    }
}

fn run(ops: &[Op], cache_pages: usize) {
    let mut disk = Disk::new(1 << 12);
    let mut store = disk.store(cache_pages);
    let mut t = ShardTree::create(&mut store, 2).unwrap();
    let mut m = Model::default();
    let mut root = disk.checkpoint(&mut store, &mut t);
    let mut durable = m.clone();
    let inos = |m: &Model| m.inodes.keys().copied().collect::<Vec<_>>();
    for op in ops {
        match *op {
            Op::Create(x) => {
                let ino = 2 + u64::from(x) * 8;
                let dir = x % 2 == 0;
                let rec = InodeRecord {
                    attr: attr(
                        ino,
                        if dir {
                            FileKind::Directory
                        } else {
                            FileKind::Regular
                        },
                        0,
                    ),
                    content: if dir {
                        RecordContent::Dir { parent: 1 }
                    } else {
                        RecordContent::Inline(vec![x; x as usize])
                    },
                    xattrs: x % 3 == 0,
                    pool: None,
                    copies: 1,
                };
                let new = t.put_inode(&mut store, &rec).unwrap();
                assert_eq!(new, !m.inodes.contains_key(&ino));
                if dir {
                    m.dirs.entry(ino).or_default();
                }
                m.inodes.insert(ino, rec);
            }
            Op::Link(d, n) => {
                let dirs: Vec<Ino> = m.dirs.keys().copied().collect();
                if dirs.is_empty() {
                    continue;
                }
                let dir = dirs[d as usize % dirs.len()];
                let name = format!("entry-{n}").into_bytes();
                if m.dirs[&dir].contains_key(&name) {
                    continue;
                }
                let cookie = t.dir_new_cookie(&mut store, dir, &name).unwrap();
                let item = DirItem {
                    cookie,
                    name: name.clone(),
                    ino: u64::from(n),
                    kind: FileKind::Regular,
                };
                t.dir_insert(&mut store, dir, &item).unwrap();
                m.dirs
                    .get_mut(&dir)
                    .unwrap()
                    .insert(name, (u64::from(n), cookie));
            }
            Op::Unlink(d, n) => {
                let dirs: Vec<Ino> = m.dirs.keys().copied().collect();
                if dirs.is_empty() {
                    continue;
                }
                let dir = dirs[d as usize % dirs.len()];
                let name = format!("entry-{n}").into_bytes();
                let got = t
                    .dir_remove(&mut store, dir, &name)
                    .unwrap()
                    .map(|e| (e.ino, e.cookie));
                assert_eq!(got, m.dirs.get_mut(&dir).unwrap().remove(&name));
            }
            Op::Map(i, b, sectors) => {
                let all = inos(&m);
                if all.is_empty() {
                    continue;
                }
                let ino = all[i as usize % all.len()];
                let r = block(u64::from(i) * 1000 + u64::from(b), sectors as usize);
                let old = t.put_block(&mut store, ino, u64::from(b), &r).unwrap();
                assert_eq!(old, m.blocks.insert((ino, u64::from(b)), r));
            }
            Op::Unmap(i, b) => {
                let all = inos(&m);
                if all.is_empty() {
                    continue;
                }
                let ino = all[i as usize % all.len()];
                let old = t.remove_block(&mut store, ino, u64::from(b)).unwrap();
                assert_eq!(old, m.blocks.remove(&(ino, u64::from(b))));
            }
            Op::Xattr(i, n, len) => {
                let all = inos(&m);
                if all.is_empty() {
                    continue;
                }
                let ino = all[i as usize % all.len()];
                let name = format!("user.a{}", n % 5).into_bytes();
                if len % 7 == 0 {
                    let had = t.remove_xattr(&mut store, ino, &name).unwrap();
                    assert_eq!(had, m.xattrs.remove(&(ino, name)).is_some());
                } else {
                    let v: Vec<u8> = (0..len).map(|j| (j as u8) ^ n).collect();
                    t.set_xattr(&mut store, ino, &name, &v).unwrap();
                    m.xattrs.insert((ino, name), v);
                }
            }
            Op::Free(i) => {
                let all = inos(&m);
                if all.is_empty() {
                    continue;
                }
                let ino = all[i as usize % all.len()];
                let mut freed = t.remove_inode(&mut store, ino).unwrap();
                let mut want: Vec<BlockRef> = m
                    .blocks
                    .range((ino, 0)..=(ino, u64::MAX))
                    .map(|(_, b)| b.clone())
                    .collect();
                freed.sort_by_key(|b| b.extent.addr.sub_block);
                want.sort_by_key(|b| b.extent.addr.sub_block);
                assert_eq!(freed, want);
                m.inodes.remove(&ino);
                m.dirs.remove(&ino);
                m.blocks.retain(|(i, _), _| *i != ino);
                m.xattrs.retain(|(i, _), _| *i != ino);
            }
            Op::Checkpoint => {
                root = disk.checkpoint(&mut store, &mut t);
                durable = m.clone();
            }
            Op::Reopen => {
                store = disk.store(cache_pages);
                t = ShardTree::on_disk(root);
                m = durable.clone();
            }
        }
    }
    check(&mut store, &mut t, &m);
    root = disk.checkpoint(&mut store, &mut t);
    let mut store = disk.store(cache_pages);
    let mut t = ShardTree::on_disk(root);
    check(&mut store, &mut t, &m);
    assert_eq!(t.header(&mut store).unwrap().next_ino, 2);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn shard_tree_matches_a_model_with_a_tiny_cache(ops in proptest::collection::vec(op(), 1..600)) {
        run(&ops, 3);
    }
}

/// One directory of 200,000 entries, listed in small batches while entries are added and
/// removed, with a cache of a few dozen pages: no entry that stayed is lost or repeated,
/// and lookups of every name work across evictions.
#[test]
fn a_large_directory_lists_every_stable_entry_once_across_evictions() {
    let mut disk = Disk::new(1 << 14);
    let mut store = disk.store(32);
    let mut t = ShardTree::create(&mut store, 2).unwrap();
    let dir = 10;
    let n = 200_000u64;
    let name = |i: u64| format!("file.{i:07}").into_bytes();
    for i in 0..n {
        let cookie = t.dir_new_cookie(&mut store, dir, &name(i)).unwrap();
        t.dir_insert(
            &mut store,
            dir,
            &DirItem {
                cookie,
                name: name(i),
                ino: i + 100,
                kind: FileKind::Regular,
            },
        )
        .unwrap();
        if i % 50_000 == 49_999 {
            disk.checkpoint(&mut store, &mut t);
        }
    }
    disk.checkpoint(&mut store, &mut t);
    let mut seen = BTreeSet::new();
    let mut from = 0;
    let mut round = 0u64;
    loop {
        let batch = t.dir_list(&mut store, dir, from, 500).unwrap();
        let Some(last) = batch.last() else { break };
        from = last.cookie + 1;
        for e in &batch {
            let i = e.ino - 100;
            assert!(seen.insert(i), "entry {i} listed twice");
        }
        // Churn meanwhile: remove odd entries of a far range, add new ones.
        round += 1;
        let victim = (round * 7919) % n;
        if victim % 2 == 1 {
            t.dir_remove(&mut store, dir, &name(victim)).unwrap();
        }
        let new = n + round;
        let cookie = t.dir_new_cookie(&mut store, dir, &name(new)).unwrap();
        t.dir_insert(
            &mut store,
            dir,
            &DirItem {
                cookie,
                name: name(new),
                ino: new + 100,
                kind: FileKind::Regular,
            },
        )
        .unwrap();
    }
    let removed: BTreeSet<u64> = (1..=round)
        .map(|r| (r * 7919) % n)
        .filter(|v| v % 2 == 1)
        .collect();
    for i in 0..n {
        if !removed.contains(&i) {
            assert!(seen.contains(&i), "entry {i} never listed");
        }
    }
    assert!(store.stats().evictions > 1000, "{:?}", store.stats());
    for i in (0..n).step_by(1009) {
        let got = t.dir_lookup(&mut store, dir, &name(i)).unwrap();
        assert_eq!(got.is_some(), !removed.contains(&i), "lookup of entry {i}");
    }
}

#[test]
fn orphans_and_the_shard_header_survive_a_checkpoint() {
    let mut disk = Disk::new(256);
    let mut store = disk.store(4);
    let mut t = ShardTree::create(&mut store, 3).unwrap();
    for ino in [11u64, 19, 27, 1 << 40] {
        t.set_orphan(&mut store, ino, true).unwrap();
    }
    t.set_orphan(&mut store, 19, false).unwrap();
    t.set_header(
        &mut store,
        ShardHeader {
            next_ino: 35,
            inode_count: 4,
        },
    )
    .unwrap();
    let root = disk.checkpoint(&mut store, &mut t);
    let mut store = disk.store(4);
    let t = ShardTree::on_disk(root);
    assert_eq!(t.orphans(&mut store).unwrap(), vec![11, 27, 1 << 40]);
    assert_eq!(
        t.header(&mut store).unwrap(),
        ShardHeader {
            next_ino: 35,
            inode_count: 4
        }
    );
}
