//! Reference-model tests of the file-system core (STYLE lesson 4).
//!
//! Proptest generates a sequence of namespace and data operations. Each one is applied to the
//! mounted [`FileSystem`] and to a plain in-memory model (inodes in a `BTreeMap`, directories
//! as name maps, file contents as byte vectors), and the two must agree: the same success or
//! the same errno. After every operation the whole tree is walked through `readdir` and
//! compared with the model (names, kinds, inode numbers, link counts, sizes, extended
//! attributes, and file contents for every file touched, all of them every few operations).
//!
//! Remounts check that the checkpoint written at unmount holds everything. Crashes check the
//! "written versus durable" split (STYLE lesson 5): the disks are `tessera_testkit::SimDrive`s
//! with volatile write caches, and a crash is their power cut: unflushed writes survive at
//! random (torn at sector boundaries), and nothing the crashed instance still holds in
//! memory can reach the disks afterwards; the recovered tree must equal the model as
//! it was after some operation at or after the last point known to be durable (a sync, an
//! fsync'ed write, a checkpoint, a remount). Operations may become durable earlier than that,
//! because some operations commit the log themselves and a background flusher commits every
//! few seconds; a write interrupted between its per-block log records may be partly durable.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use proptest::test_runner::Config;
use tessera_drive::{BlockDevice, VolatileCacheConfig};
use tessera_fs::{
    Caller, FileKind, FileSystem, FormatOptions, FsError, FALLOC_FL_KEEP_SIZE,
    FALLOC_FL_PUNCH_HOLE, ROOT_INO,
};
use tessera_nsd::NsdId;
use tessera_testkit::SimDrive;

type Ino = u64;

const ROOT: Caller = Caller { uid: 0, gid: 0 };
const NAMES: [&[u8]; 6] = [b"a", b"b", b"c", b"d", b"e", b"f"];
const XATTR_NAMES: [&[u8]; 3] = [b"user.a", b"user.b", b"trusted.c"];
/// Files never grow past this, so that whole-tree comparisons stay cheap in a debug build.
const FILE_BYTES_CAP: u64 = 3 << 20;
/// One write at most (the brief: 0..600 KiB).
const WRITE_BYTES_MAX: u32 = 600 << 10;
/// Every this many operations all file contents are compared, not only the touched ones.
const FULL_CHECK_EVERY: usize = 6;
/// Whether fallocate(FALLOC_FL_KEEP_SIZE) may reach past the end of file (fsck once reported
/// such preallocation as corruption; keep the switch to narrow down a regression).
const KEEP_SIZE_PAST_EOF: bool = true;
/// Operations per generated case.
const OPS: std::ops::Range<usize> = 5..80;

// ---------------------------------------------------------------------------------------------
// Crashable drives: the storage boundary where a power loss is injected.
// ---------------------------------------------------------------------------------------------

/// Mounts through fresh simulated drives with volatile write caches; returns the file
/// system and its drives, whose power cut is the crash.
///
/// A "crashed" [`FileSystem`] is dropped without unmount, but its background flusher may still
/// hold a reference and commit the log seconds later, while the next mount already uses the
/// same drives: the cut drives refuse it, as a dead process writes nothing.
/// How the model's operations reach the metadata.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Route {
    /// The one-node file system: the client calls its own owner.
    Direct,
    /// Every metanode request through its wire encoding to this mount's own owner.
    Wire,
    /// A client-only mount ([`FileSystem::mount_client`]) on the same drives, reaching a
    /// second mount that owns the metadata through encoded requests, as a node that does
    /// not own the file system reaches the node that does.
    Client,
    /// The one-node file system with small writes gathered in memory (write-behind), as a
    /// one-node mount runs: reads, stats, truncates, fsyncs and unmounts write them first.
    Gathered,
}

/// The mount the model's operations go to and, for [`Route::Client`], the owner behind it.
type Mounted = (Arc<FileSystem>, Option<Arc<FileSystem>>, Vec<Arc<SimDrive>>);

fn mount_routed(t: &TestDisks, route: Route) -> Mounted {
    let (fs, drives) = mount_crashable(t, route == Route::Wire);
    if route == Route::Gathered {
        fs.set_write_behind(true);
    }
    if route != Route::Client {
        return (fs, None, drives);
    }
    // The same drive handles: a flush by either mount reaches what both wrote, as the
    // drives' own flush does for every host.
    let disks: Vec<(NsdId, Arc<dyn BlockDevice>)> = t
        .reopen()
        .into_iter()
        .zip(&drives)
        .map(|((id, _), d)| (id, d.clone() as Arc<dyn BlockDevice>))
        .collect();
    // As another node: the owner lets the client keep block-map views (and would revoke
    // them), so every read after the client's own changes checks that it dropped its own.
    let client = FileSystem::mount_client(
        disks,
        Box::new(tessera_fs::InProcessNode {
            owner: Arc::downgrade(&fs),
            origin: tessera_fs::locks::Origin {
                node: 2,
                incarnation: 1,
            },
        }),
    )
    .expect("client mount");
    let held_by = Arc::downgrade(&client);
    fs.on_read_revoke(Box::new(move |_, inos| {
        if let Some(client) = held_by.upgrade() {
            client.serve_metanode_request(&tessera_fs::Fence::drop_held(inos));
        }
    }));
    let held_by = Arc::downgrade(&client);
    fs.on_data_revoke(Box::new(move |_, inos| {
        if let Some(client) = held_by.upgrade() {
            client.serve_metanode_request(&tessera_fs::Fence::give_back_data(inos));
        }
    }));
    assert!(!client.is_owner() && fs.is_owner());
    (client, Some(fs), drives)
}

fn mount_crashable(t: &TestDisks, wire: bool) -> (Arc<FileSystem>, Vec<Arc<SimDrive>>) {
    static MOUNTS: AtomicU64 = AtomicU64::new(0);
    let mount = MOUNTS.fetch_add(1, Ordering::Relaxed);
    let mut drives = Vec::new();
    let disks: Vec<(NsdId, Arc<dyn BlockDevice>)> = t
        .reopen()
        .into_iter()
        .enumerate()
        .map(|(i, (id, inner))| {
            let cache = VolatileCacheConfig {
                seed: mount * 64 + i as u64,
                ..VolatileCacheConfig::default()
            };
            let d = Arc::new(SimDrive::with_cache(inner, Arc::default(), cache));
            drives.push(d.clone());
            let d: Arc<dyn BlockDevice> = d;
            (id, d)
        })
        .collect();
    let fs = FileSystem::mount(disks).expect("mount");
    if wire {
        fs.route_metadata_through_wire();
    }
    // A cache of a few pages (a few hundred inodes): nearly every operation evicts and
    // reads metadata pages again.
    fs.set_metadata_cache_pages(TINY_CACHE_PAGES);
    fs.set_inode_cache(TINY_INODE_CACHE);
    fs.set_stat_cache(TINY_STAT_CACHE);
    (fs, drives)
}

const TINY_CACHE_PAGES: usize = 4;
const TINY_INODE_CACHE: usize = 8;
const TINY_STAT_CACHE: usize = 8;

// ---------------------------------------------------------------------------------------------
// The model.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Body {
    /// File contents; shared between history snapshots until changed.
    File(Arc<Vec<u8>>),
    Dir {
        entries: BTreeMap<Vec<u8>, Ino>,
        parent: Ino,
    },
    Symlink(Vec<u8>),
}

#[derive(Clone, Debug)]
struct Node {
    body: Body,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

#[derive(Clone, Debug)]
struct Model {
    nodes: BTreeMap<Ino, Node>,
    /// Open handles per inode (only regular files are opened).
    open: BTreeMap<Ino, u32>,
}

type Expect<T> = Result<T, i32>;

impl Model {
    fn new() -> Model {
        let root = Node {
            body: Body::Dir {
                entries: BTreeMap::new(),
                parent: ROOT_INO,
            },
            xattrs: BTreeMap::new(),
        };
        Model {
            nodes: BTreeMap::from([(ROOT_INO, root)]),
            open: BTreeMap::new(),
        }
    }

    fn entries(&self, dir: Ino) -> Option<&BTreeMap<Vec<u8>, Ino>> {
        match &self.nodes.get(&dir)?.body {
            Body::Dir { entries, .. } => Some(entries),
            _ => None,
        }
    }

    fn entries_mut(&mut self, dir: Ino) -> &mut BTreeMap<Vec<u8>, Ino> {
        match &mut self.nodes.get_mut(&dir).expect("dir exists").body {
            Body::Dir { entries, .. } => entries,
            _ => panic!("inode {dir} is not a directory"),
        }
    }

    fn is_dir(&self, ino: Ino) -> bool {
        matches!(
            self.nodes.get(&ino).map(|n| &n.body),
            Some(Body::Dir { .. })
        )
    }

    fn is_file(&self, ino: Ino) -> bool {
        matches!(self.nodes.get(&ino).map(|n| &n.body), Some(Body::File(_)))
    }

    fn parent(&self, dir: Ino) -> Ino {
        match &self.nodes[&dir].body {
            Body::Dir { parent, .. } => *parent,
            _ => panic!("inode {dir} is not a directory"),
        }
    }

    fn set_parent(&mut self, dir: Ino, new: Ino) {
        if let Body::Dir { parent, .. } = &mut self.nodes.get_mut(&dir).expect("exists").body {
            *parent = new;
        }
    }

    fn content(&self, ino: Ino) -> &Arc<Vec<u8>> {
        match &self.nodes[&ino].body {
            Body::File(c) => c,
            _ => panic!("inode {ino} is not a file"),
        }
    }

    fn content_mut(&mut self, ino: Ino) -> &mut Vec<u8> {
        match &mut self.nodes.get_mut(&ino).expect("exists").body {
            Body::File(c) => Arc::make_mut(c),
            _ => panic!("inode {ino} is not a file"),
        }
    }

    /// Every `(path, parent, name, ino)` below the root, depth first in name order.
    fn walk(&self) -> Vec<(Vec<u8>, Ino, Vec<u8>, Ino)> {
        let mut out = Vec::new();
        let mut stack = vec![(Vec::new(), ROOT_INO)];
        while let Some((path, dir)) = stack.pop() {
            let entries = self.entries(dir).expect("walked dirs are dirs");
            for (name, ino) in entries.iter().rev() {
                let mut p = path.clone();
                p.push(b'/');
                p.extend_from_slice(name);
                if self.is_dir(*ino) {
                    stack.push((p.clone(), *ino));
                }
                out.push((p, dir, name.clone(), *ino));
            }
        }
        out.sort();
        out
    }

    fn dirs(&self) -> Vec<Ino> {
        let mut v = vec![ROOT_INO];
        v.extend(
            self.walk()
                .into_iter()
                .map(|w| w.3)
                .filter(|i| self.is_dir(*i)),
        );
        v
    }

    fn linked_nodes(&self) -> Vec<Ino> {
        let mut seen = BTreeSet::from([ROOT_INO]);
        let mut v = vec![ROOT_INO];
        for (_, _, _, ino) in self.walk() {
            if seen.insert(ino) {
                v.push(ino);
            }
        }
        v
    }

    fn linked_files(&self) -> Vec<Ino> {
        self.linked_nodes()
            .into_iter()
            .filter(|i| self.is_file(*i))
            .collect()
    }

    /// Linked files, then files unlinked while open.
    fn files(&self) -> Vec<Ino> {
        let mut v = self.linked_files();
        v.extend(
            self.open
                .keys()
                .filter(|i| self.links(**i) == 0 && self.is_file(**i)),
        );
        v
    }

    fn links(&self, ino: Ino) -> u32 {
        self.nodes
            .values()
            .filter_map(|n| match &n.body {
                Body::Dir { entries, .. } => Some(entries.values().filter(|i| **i == ino).count()),
                _ => None,
            })
            .sum::<usize>() as u32
    }

    fn nlink(&self, ino: Ino) -> u32 {
        match &self.nodes[&ino].body {
            Body::Dir { entries, .. } => {
                2 + entries.values().filter(|i| self.is_dir(**i)).count() as u32
            }
            _ => self.links(ino),
        }
    }

    /// Frees a non-directory inode once no name and no handle refers to it.
    fn collect(&mut self, ino: Ino) {
        if ino != ROOT_INO
            && !self.is_dir(ino)
            && self.links(ino) == 0
            && self.open.get(&ino).copied().unwrap_or(0) == 0
        {
            self.nodes.remove(&ino);
        }
    }

    /// What a remount or crash leaves: no handles, no orphans.
    fn drop_handles(&mut self) {
        self.open.clear();
        let all: Vec<Ino> = self.nodes.keys().copied().collect();
        for ino in all {
            self.collect(ino);
        }
    }

    fn is_ancestor(&self, anc: Ino, mut dir: Ino) -> bool {
        for _ in 0..10_000 {
            if dir == anc {
                return true;
            }
            if dir == ROOT_INO {
                return false;
            }
            dir = self.parent(dir);
        }
        panic!("model parent chain loops");
    }

    fn dir_check(&self, dir: Ino) -> Expect<()> {
        if self.is_dir(dir) {
            Ok(())
        } else {
            Err(libc::ENOTDIR)
        }
    }

    fn create_check(&self, dir: Ino, name: &[u8]) -> Expect<()> {
        self.dir_check(dir)?;
        if self.entries(dir).unwrap().contains_key(name) {
            return Err(libc::EEXIST);
        }
        Ok(())
    }

    fn insert(&mut self, dir: Ino, name: &[u8], ino: Ino, body: Body) {
        assert!(
            !self.nodes.contains_key(&ino),
            "file system reused live inode {ino}"
        );
        if let Body::Dir { .. } = body {
            assert_eq!(self.parent_of_body(&body), dir);
        }
        self.nodes.insert(
            ino,
            Node {
                body,
                xattrs: BTreeMap::new(),
            },
        );
        self.entries_mut(dir).insert(name.to_vec(), ino);
    }

    fn parent_of_body(&self, body: &Body) -> Ino {
        match body {
            Body::Dir { parent, .. } => *parent,
            _ => 0,
        }
    }

    fn remove(&mut self, dir: Ino, name: &[u8], rmdir: bool) -> Expect<()> {
        self.dir_check(dir)?;
        let ino = *self.entries(dir).unwrap().get(name).ok_or(libc::ENOENT)?;
        let is_dir = self.is_dir(ino);
        if rmdir && !is_dir {
            return Err(libc::ENOTDIR);
        }
        if !rmdir && is_dir {
            return Err(libc::EISDIR);
        }
        if is_dir && !self.entries(ino).unwrap().is_empty() {
            return Err(libc::ENOTEMPTY);
        }
        self.entries_mut(dir).remove(name);
        if is_dir {
            self.nodes.remove(&ino);
        } else {
            self.collect(ino);
        }
        Ok(())
    }

    fn link(&mut self, ino: Ino, dir: Ino, name: &[u8]) -> Expect<()> {
        self.create_check(dir, name)?;
        self.entries_mut(dir).insert(name.to_vec(), ino);
        Ok(())
    }

    /// rename(2), in the order the file system checks (the kernel VFS checks some of these
    /// before a FUSE file system is asked at all).
    fn rename(
        &mut self,
        op: (Ino, &[u8], Ino, &[u8]),
        noreplace: bool,
        exchange: bool,
    ) -> Expect<()> {
        let (sdir, sname, ddir, dname) = op;
        self.dir_check(sdir)?;
        self.dir_check(ddir)?;
        let src = *self.entries(sdir).unwrap().get(sname).ok_or(libc::ENOENT)?;
        let dst = self.entries(ddir).unwrap().get(dname).copied();
        if noreplace && dst.is_some() {
            return Err(libc::EEXIST);
        }
        if exchange {
            let dst = dst.ok_or(libc::ENOENT)?;
            if self.is_dir(src) && self.is_ancestor(src, ddir) {
                return Err(libc::EINVAL);
            }
            if self.is_dir(dst) && self.is_ancestor(dst, sdir) {
                return Err(libc::EINVAL);
            }
            self.entries_mut(sdir).insert(sname.to_vec(), dst);
            self.entries_mut(ddir).insert(dname.to_vec(), src);
            if self.is_dir(src) {
                self.set_parent(src, ddir);
            }
            if self.is_dir(dst) {
                self.set_parent(dst, sdir);
            }
            return Ok(());
        }
        if dst == Some(src) {
            return Ok(());
        }
        let src_dir = self.is_dir(src);
        if src_dir && self.is_ancestor(src, ddir) {
            return Err(libc::EINVAL);
        }
        if let Some(d) = dst {
            let d_dir = self.is_dir(d);
            if src_dir && !d_dir {
                return Err(libc::ENOTDIR);
            }
            if !src_dir && d_dir {
                return Err(libc::EISDIR);
            }
            if d_dir && !self.entries(d).unwrap().is_empty() {
                return Err(libc::ENOTEMPTY);
            }
        }
        self.entries_mut(sdir).remove(sname);
        self.entries_mut(ddir).insert(dname.to_vec(), src);
        if src_dir {
            self.set_parent(src, ddir);
        }
        if let Some(d) = dst {
            if self.is_dir(d) {
                self.nodes.remove(&d);
            } else {
                self.collect(d);
            }
        }
        Ok(())
    }

    fn write(&mut self, ino: Ino, off: u64, data: &[u8]) {
        // POSIX: a write of zero bytes to a regular file has no other results (no extension).
        if data.is_empty() {
            return;
        }
        let c = self.content_mut(ino);
        let end = off as usize + data.len();
        if c.len() < end {
            c.resize(end, 0);
        }
        c[off as usize..end].copy_from_slice(data);
    }

    fn fallocate(&mut self, ino: Ino, off: u64, len: u64, mode: i32) {
        let c = self.content_mut(ino);
        let end = (off + len) as usize;
        if mode == 0 && c.len() < end {
            c.resize(end, 0);
        } else if mode == FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE {
            let hi = end.min(c.len());
            if (off as usize) < hi {
                c[off as usize..hi].fill(0);
            }
        }
    }

    fn setxattr(&mut self, ino: Ino, name: &[u8], value: &[u8], flag: u8) -> Expect<()> {
        let x = &mut self.nodes.get_mut(&ino).unwrap().xattrs;
        let exists = x.contains_key(name);
        if flag == 1 && exists {
            return Err(libc::EEXIST);
        }
        if flag == 2 && !exists {
            return Err(libc::ENODATA);
        }
        x.insert(name.to_vec(), value.to_vec());
        Ok(())
    }

    fn removexattr(&mut self, ino: Ino, name: &[u8]) -> Expect<()> {
        let x = &mut self.nodes.get_mut(&ino).unwrap().xattrs;
        x.remove(name).map(|_| ()).ok_or(libc::ENODATA)
    }
}

// ---------------------------------------------------------------------------------------------
// Tree views: what the file system shows and what the model says it should show.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq)]
struct View {
    ino: Ino,
    kind: FileKind,
    nlink: u32,
    size: u64,
    /// File or symlink bytes; `None` when not compared this time.
    content: Option<Vec<u8>>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

type Tree = BTreeMap<Vec<u8>, View>;

fn model_tree(m: &Model, with_content: &dyn Fn(Ino) -> bool) -> Tree {
    let mut tree = Tree::new();
    let mut paths = vec![(b"/".to_vec(), ROOT_INO)];
    paths.extend(m.walk().into_iter().map(|(p, _, _, ino)| (p, ino)));
    for (path, ino) in paths {
        let node = &m.nodes[&ino];
        let (kind, size, content) = match &node.body {
            Body::File(c) => (FileKind::Regular, c.len() as u64, Some(c.to_vec())),
            Body::Dir { .. } => (FileKind::Directory, 0, None),
            Body::Symlink(t) => (FileKind::Symlink, t.len() as u64, Some(t.clone())),
        };
        let content = content.filter(|_| with_content(ino));
        let view = View {
            ino,
            kind,
            nlink: m.nlink(ino),
            size,
            content,
            xattrs: node.xattrs.clone(),
        };
        tree.insert(path, view);
    }
    tree
}

fn read_all(fs: &FileSystem, ino: Ino, size: u64) -> Vec<u8> {
    let data = fs
        .read(ino, 0, u32::try_from(size + 10).unwrap())
        .unwrap_or_else(|e| {
            panic!("read of inode {ino} ({size} bytes) failed: {e}");
        });
    assert_eq!(
        data.len() as u64,
        size,
        "read of inode {ino} returned a wrong length"
    );
    data
}

fn fs_xattrs(fs: &FileSystem, ino: Ino) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let list = fs.listxattr(ino).unwrap();
    assert!(
        list.is_empty() || list.ends_with(&[0]),
        "listxattr not NUL-terminated"
    );
    let mut out = BTreeMap::new();
    for name in list.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let v = fs.getxattr(ino, name).unwrap();
        assert!(
            out.insert(name.to_vec(), v).is_none(),
            "listxattr repeats a name"
        );
    }
    out
}

/// Lists a directory through readdir in batches; checks ".", "..", unique names, increasing
/// cookies, lookups, and that resuming at a middle cookie yields exactly the rest.
fn list_dir(fs: &FileSystem, dir: Ino, parent: Ino) -> Vec<(Vec<u8>, Ino, FileKind)> {
    let mut all = Vec::new();
    let mut after = 0;
    for _ in 0..1000 {
        let batch = fs.readdir(dir, after).unwrap().entries;
        let Some(last) = batch.last() else { break };
        after = last.0;
        all.extend(batch);
    }
    assert!(all.len() >= 2, "readdir of {dir} lacks . and ..");
    assert_eq!(
        (all[0].1, &all[0].3[..]),
        (dir, &b"."[..]),
        "first entry of {dir}"
    );
    assert_eq!(
        (all[1].1, &all[1].3[..]),
        (parent, &b".."[..]),
        "second entry of {dir}"
    );
    for w in all.windows(2) {
        assert!(
            w[0].0 < w[1].0,
            "readdir cookies of {dir} not increasing: {all:?}"
        );
    }
    let names: BTreeSet<&Vec<u8>> = all.iter().map(|e| &e.3).collect();
    assert_eq!(
        names.len(),
        all.len(),
        "readdir of {dir} repeats a name: {all:?}"
    );
    if all.len() > 3 {
        let mid = all.len() / 2;
        let rest = fs.readdir(dir, all[mid].0).unwrap().entries;
        assert_eq!(
            rest,
            all[mid + 1..].to_vec(),
            "readdir of {dir} resumed at a cookie"
        );
    }
    let mut out = Vec::new();
    for (_, ino, kind, name) in all.into_iter().skip(2) {
        let attr = fs.lookup(dir, &name).unwrap();
        assert_eq!(
            (attr.ino, attr.kind),
            (ino, kind),
            "lookup disagrees with readdir"
        );
        out.push((name, ino, kind));
    }
    assert_eq!(
        fs.lookup(dir, b"..").unwrap().ino,
        parent,
        "lookup(..) of {dir}"
    );
    out
}

fn fs_tree(fs: &FileSystem, with_content: &dyn Fn(Ino) -> bool) -> Tree {
    let mut tree = Tree::new();
    let mut stack = vec![(b"/".to_vec(), ROOT_INO, ROOT_INO)];
    let mut contents: BTreeMap<Ino, Vec<u8>> = BTreeMap::new();
    while let Some((path, ino, parent)) = stack.pop() {
        assert!(tree.len() < 100_000, "tree walk does not end");
        let attr = fs.getattr(ino).unwrap();
        let content = match attr.kind {
            FileKind::Regular if with_content(ino) => Some(
                contents
                    .entry(ino)
                    .or_insert_with(|| read_all(fs, ino, attr.size))
                    .clone(),
            ),
            FileKind::Symlink if with_content(ino) => Some(fs.readlink(ino).unwrap()),
            _ => None,
        };
        let size = if attr.kind == FileKind::Directory {
            0
        } else {
            attr.size
        };
        let view = View {
            ino,
            kind: attr.kind,
            nlink: attr.nlink,
            size,
            content,
            xattrs: fs_xattrs(fs, ino),
        };
        if attr.kind == FileKind::Directory {
            for (name, child, _) in list_dir(fs, ino, parent) {
                let mut p = if path == b"/" {
                    Vec::new()
                } else {
                    path.clone()
                };
                p.push(b'/');
                p.extend_from_slice(&name);
                stack.push((p, child, ino));
            }
        }
        assert!(
            tree.insert(path.clone(), view).is_none(),
            "path {path:?} seen twice"
        );
    }
    tree
}

fn show(p: &[u8]) -> String {
    String::from_utf8_lossy(p).into_owned()
}

/// The first difference between two trees, or `None`. Contents are compared only where
/// both sides have them; `skip` names an inode whose size and contents are not compared.
fn diff(got: &Tree, want: &Tree, skip: Option<Ino>) -> Option<String> {
    let gk: BTreeSet<_> = got.keys().collect();
    let wk: BTreeSet<_> = want.keys().collect();
    if gk != wk {
        let extra: Vec<String> = gk.difference(&wk).map(|p| show(p)).collect();
        let missing: Vec<String> = wk.difference(&gk).map(|p| show(p)).collect();
        return Some(format!(
            "paths differ: unexpected {extra:?}, missing {missing:?}"
        ));
    }
    for (path, w) in want {
        let g = &got[path];
        let p = show(path);
        let skipped = skip == Some(w.ino);
        if (g.ino, g.kind, g.nlink) != (w.ino, w.kind, w.nlink) {
            return Some(format!(
                "{p}: (ino, kind, nlink) is {:?}, expected {:?}",
                (g.ino, g.kind, g.nlink),
                (w.ino, w.kind, w.nlink)
            ));
        }
        if g.xattrs != w.xattrs {
            return Some(format!(
                "{p}: xattrs {:?}, expected {:?}",
                g.xattrs, w.xattrs
            ));
        }
        if skipped {
            continue;
        }
        if g.size != w.size {
            return Some(format!("{p}: size {}, expected {}", g.size, w.size));
        }
        if let (Some(gc), Some(wc)) = (&g.content, &w.content) {
            if gc != wc {
                let at = gc.iter().zip(wc.iter()).position(|(a, b)| a != b);
                return Some(format!(
                    "{p}: content differs (first at byte {at:?}, lengths {} and {})",
                    gc.len(),
                    wc.len()
                ));
            }
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------
// Operations.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Create {
        dir: u16,
        name: u8,
        kind: u8,
        target: u16,
    },
    Write {
        file: u16,
        off_kind: u8,
        off: u32,
        len_kind: u8,
        len: u32,
        seed: u64,
        sync: bool,
    },
    Read {
        file: u16,
        off: u32,
        len: u32,
    },
    Truncate {
        file: u16,
        kind: u8,
        raw: u32,
    },
    Fallocate {
        file: u16,
        off: u32,
        len: u32,
        mode: u8,
    },
    Rename {
        sdir: u16,
        sname: u8,
        ddir: u16,
        dname: u8,
        flag: u8,
    },
    Link {
        node: u16,
        dir: u16,
        name: u8,
    },
    Unlink {
        dir: u16,
        name: u8,
    },
    Rmdir {
        dir: u16,
        name: u8,
    },
    SetXattr {
        node: u16,
        name: u8,
        len: u16,
        flag: u8,
    },
    RemoveXattr {
        node: u16,
        name: u8,
    },
    OpenUnlinkRead {
        file: u16,
    },
    Open {
        file: u16,
    },
    ReleaseAll,
    Sync,
    Checkpoint,
    Remount,
    CrashRemount {
        sync_first: bool,
    },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let n = || 0..NAMES.len() as u8;
    prop_oneof![
        14 => (any::<u16>(), n(), any::<u8>(), any::<u16>())
            .prop_map(|(dir, name, kind, target)| Op::Create { dir, name, kind, target }),
        8 => (any::<u16>(), 0..5u8, any::<u32>(), 0..4u8, any::<u32>(), any::<u64>(), any::<bool>())
            .prop_map(|(file, off_kind, off, len_kind, len, seed, sync)| Op::Write {
                file, off_kind, off, len_kind, len, seed, sync: sync && seed % 4 == 0,
            }),
        2 => (any::<u16>(), any::<u32>(), any::<u32>())
            .prop_map(|(file, off, len)| Op::Read { file, off, len }),
        3 => (any::<u16>(), 0..5u8, any::<u32>())
            .prop_map(|(file, kind, raw)| Op::Truncate { file, kind, raw }),
        2 => (any::<u16>(), any::<u32>(), any::<u32>(), 0..3u8)
            .prop_map(|(file, off, len, mode)| Op::Fallocate { file, off, len, mode }),
        5 => (any::<u16>(), n(), any::<u16>(), n(), any::<u8>())
            .prop_map(|(sdir, sname, ddir, dname, flag)| Op::Rename { sdir, sname, ddir, dname, flag }),
        2 => (any::<u16>(), any::<u16>(), n())
            .prop_map(|(node, dir, name)| Op::Link { node, dir, name }),
        2 => (any::<u16>(), n()).prop_map(|(dir, name)| Op::Unlink { dir, name }),
        1 => (any::<u16>(), n()).prop_map(|(dir, name)| Op::Rmdir { dir, name }),
        2 => (any::<u16>(), 0..XATTR_NAMES.len() as u8, any::<u16>(), 0..3u8)
            .prop_map(|(node, name, len, flag)| Op::SetXattr { node, name, len, flag }),
        1 => (any::<u16>(), 0..XATTR_NAMES.len() as u8)
            .prop_map(|(node, name)| Op::RemoveXattr { node, name }),
        1 => any::<u16>().prop_map(|file| Op::OpenUnlinkRead { file }),
        1 => any::<u16>().prop_map(|file| Op::Open { file }),
        1 => Just(Op::ReleaseAll),
        1 => Just(Op::Sync),
        1 => Just(Op::Checkpoint),
        1 => Just(Op::Remount),
        2 => any::<bool>().prop_map(|sync_first| Op::CrashRemount { sync_first }),
    ]
}

fn pick<T: Copy>(v: &[T], sel: u16) -> Option<T> {
    (!v.is_empty()).then(|| v[sel as usize % v.len()])
}

/// Mostly a directory; one selector in 16 picks any node, to provoke ENOTDIR.
fn pick_dir(m: &Model, sel: u16) -> Ino {
    if sel % 16 == 15 {
        pick(&m.linked_nodes(), sel / 16).unwrap()
    } else {
        pick(&m.dirs(), sel / 16).unwrap()
    }
}

fn errno<T>(r: Result<T, FsError>) -> Expect<T> {
    r.map_err(|e| e.errno())
}

fn agree<A: std::fmt::Debug, B: std::fmt::Debug>(what: &str, got: &Expect<A>, want: &Expect<B>) {
    assert_eq!(
        got.as_ref().err(),
        want.as_ref().err(),
        "{what}: file system returned {got:?}, model expects {want:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The runner.
// ---------------------------------------------------------------------------------------------

struct Run {
    t: TestDisks,
    fs: Option<Arc<FileSystem>>,
    drives: Vec<Arc<SimDrive>>,
    block_bytes: u64,
    model: Model,
    handles: Vec<Ino>,
    /// Model snapshots from the last point known durable (index 0) to now.
    history: Vec<Model>,
    /// For `history[i] -> history[i + 1]`: the file a write changed, if the step was a write.
    history_writes: Vec<Option<Ino>>,
    touched: BTreeSet<Ino>,
    route: Route,
    /// The mount that owns the metadata when `fs` is a client-only mount.
    owner: Option<Arc<FileSystem>>,
}

impl Run {
    fn new(opts: &FormatOptions, route: Route) -> Run {
        let t = make_disks(4, 64 << 20);
        format_fs(&t, opts);
        let (fs, owner, drives) = mount_routed(&t, route);
        let model = Model::new();
        Run {
            t,
            fs: Some(fs),
            drives,
            block_bytes: u64::from(opts.block_size),
            history: vec![model.clone()],
            history_writes: Vec::new(),
            model,
            handles: Vec::new(),
            touched: BTreeSet::new(),
            route,
            owner,
        }
    }

    fn fs(&self) -> &FileSystem {
        self.fs.as_ref().expect("mounted")
    }

    fn durable_point(&mut self) {
        self.history = vec![self.model.clone()];
        self.history_writes.clear();
    }

    fn write_off_len(&self, size: u64, op: (u8, u32, u8, u32)) -> (u64, usize) {
        let (off_kind, off, len_kind, len) = op;
        let bs = self.block_bytes;
        let len = match len_kind {
            0 => len % 4000,
            1 => len % 70_000,
            2 => len % WRITE_BYTES_MAX,
            _ => bs as u32,
        } as u64;
        let off = u64::from(off);
        let off = match off_kind {
            0 => off % 8192,
            1 => (off % 12) * bs,
            2 => size.saturating_sub(off % 5000),
            3 => size + off % (2 << 20),
            _ => off % size.max(1),
        };
        let off = off.min(FILE_BYTES_CAP - len);
        (off, len as usize)
    }

    fn apply(&mut self, i: usize, op: &Op) {
        let mut wrote = None;
        match *op {
            Op::Create {
                dir,
                name,
                kind,
                target,
            } => self.create(dir, name, kind, target),
            Op::Write {
                file,
                off_kind,
                off,
                len_kind,
                len,
                seed,
                sync,
            } => {
                let Some(ino) = pick(&self.model.files(), file) else {
                    return;
                };
                let size = self.model.content(ino).len() as u64;
                let (off, len) = self.write_off_len(size, (off_kind, off, len_kind, len));
                let data = pattern(len, seed);
                let got = self.fs().write(ino, off, &data, sync).unwrap_or_else(|e| {
                    panic!("op {i}: write of {len} bytes at {off} to {ino} failed: {e}")
                });
                assert_eq!(got, len, "op {i}: short write");
                self.model.write(ino, off, &data);
                self.touched.insert(ino);
                wrote = Some(ino);
                if sync {
                    self.durable_point();
                    return;
                }
            }
            Op::Read { file, off, len } => {
                let Some(ino) = pick(&self.model.files(), file) else {
                    return;
                };
                let c = self.model.content(ino).clone();
                let off = u64::from(off) % (c.len() as u64 + 5000);
                let len = len % (700 << 10);
                let got = self.fs().read(ino, off, len).unwrap();
                let lo = (off as usize).min(c.len());
                let hi = (off as usize + len as usize).min(c.len());
                assert!(
                    got == c[lo..hi],
                    "op {i}: read of {len} at {off} from {ino} differs"
                );
            }
            Op::Truncate { file, kind, raw } => {
                let Some(ino) = pick(&self.model.files(), file) else {
                    return;
                };
                let size = self.model.content(ino).len() as u64;
                let new = match kind {
                    0 => u64::from(raw % 5000),
                    1 => size / 2,
                    2 => size + u64::from(raw % (1 << 20)),
                    3 => (u64::from(raw % 8) * self.block_bytes + u64::from(raw >> 20) % 9000)
                        .saturating_sub(4500),
                    _ => 0,
                }
                .min(FILE_BYTES_CAP);
                self.fs().truncate(ino, new).unwrap();
                self.model.content_mut(ino).resize(new as usize, 0);
                self.touched.insert(ino);
                wrote = Some(ino);
            }
            Op::Fallocate {
                file,
                off,
                len,
                mode,
            } => {
                let Some(ino) = pick(&self.model.files(), file) else {
                    return;
                };
                let size = self.model.content(ino).len() as u64;
                let off = (u64::from(off) % (size + self.block_bytes)).min(FILE_BYTES_CAP - 1);
                let len = (1 + u64::from(len) % (2 * self.block_bytes)).min(FILE_BYTES_CAP - off);
                let mode = [
                    0,
                    FALLOC_FL_KEEP_SIZE,
                    FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                ][mode as usize];
                // fsck calls blocks preallocated past EOF corrupt (see the ignored test
                // `fsck_accepts_keep_size_preallocation`); stay inside the file until fixed.
                let len = if mode == FALLOC_FL_KEEP_SIZE && !KEEP_SIZE_PAST_EOF {
                    len.min(size.saturating_sub(off))
                } else {
                    len
                };
                if len == 0 {
                    return;
                }
                self.fs()
                    .fallocate(ino, off, len, mode)
                    .unwrap_or_else(|e| {
                        panic!("op {i}: fallocate({ino}, {off}, {len}, {mode}) failed: {e}")
                    });
                self.model.fallocate(ino, off, len, mode);
                self.touched.insert(ino);
                wrote = Some(ino);
            }
            Op::Rename {
                sdir,
                sname,
                ddir,
                dname,
                flag,
            } => {
                let (s, d) = (pick_dir(&self.model, sdir), pick_dir(&self.model, ddir));
                let (sn, dn) = (NAMES[sname as usize], NAMES[dname as usize]);
                let (noreplace, exchange) = (flag % 8 == 1, flag % 8 == 2);
                let got = errno(self.fs().rename(s, sn, d, dn, noreplace, exchange));
                let want = self.model.rename((s, sn, d, dn), noreplace, exchange);
                agree(&format!("op {i}: {op:?} ({s} -> {d})"), &got, &want);
            }
            Op::Link { node, dir, name } => {
                let nodes: Vec<Ino> = self
                    .model
                    .linked_nodes()
                    .into_iter()
                    .filter(|n| !self.model.is_dir(*n))
                    .collect();
                let Some(ino) = pick(&nodes, node) else {
                    return;
                };
                let d = pick_dir(&self.model, dir);
                let got = errno(self.fs().link(ino, d, NAMES[name as usize]));
                let want = self.model.link(ino, d, NAMES[name as usize]);
                agree(&format!("op {i}: {op:?}"), &got, &want);
                if let Ok(a) = got {
                    assert_eq!(
                        a.nlink,
                        self.model.nlink(ino),
                        "op {i}: link count returned"
                    );
                }
            }
            Op::Unlink { dir, name } | Op::Rmdir { dir, name } => {
                let rmdir = matches!(op, Op::Rmdir { .. });
                let d = pick_dir(&self.model, dir);
                let got = errno(self.fs().remove(d, NAMES[name as usize], rmdir));
                let want = self.model.remove(d, NAMES[name as usize], rmdir);
                agree(&format!("op {i}: {op:?} in {d}"), &got, &want);
            }
            Op::SetXattr {
                node,
                name,
                len,
                flag,
            } => {
                let ino = pick(&self.model.linked_nodes(), node).unwrap();
                let value = pattern(len as usize % 300, u64::from(len));
                let n = XATTR_NAMES[name as usize];
                let got = errno(self.fs().setxattr(ino, n, &value, flag == 1, flag == 2));
                let want = self.model.setxattr(ino, n, &value, flag);
                agree(&format!("op {i}: {op:?}"), &got, &want);
            }
            Op::RemoveXattr { node, name } => {
                let ino = pick(&self.model.linked_nodes(), node).unwrap();
                let n = XATTR_NAMES[name as usize];
                let got = errno(self.fs().removexattr(ino, n));
                let want = self.model.removexattr(ino, n);
                agree(&format!("op {i}: {op:?}"), &got, &want);
            }
            Op::OpenUnlinkRead { file } => self.open_unlink_read(i, file),
            Op::Open { file } => {
                let Some(ino) = pick(&self.model.files(), file) else {
                    return;
                };
                self.fs().open(ino).unwrap();
                *self.model.open.entry(ino).or_default() += 1;
                self.handles.push(ino);
            }
            Op::ReleaseAll => self.release_all(i),
            Op::Sync => {
                self.fs().sync().unwrap();
                self.durable_point();
                return;
            }
            Op::Checkpoint => {
                self.owner_fs().checkpoint().unwrap();
                self.durable_point();
                return;
            }
            Op::Remount => {
                self.unmount();
                self.remount();
                self.durable_point();
                return;
            }
            Op::CrashRemount { sync_first } => {
                if sync_first {
                    self.fs().sync().unwrap();
                    self.durable_point();
                }
                self.crash(i);
                return;
            }
        }
        self.history.push(self.model.clone());
        self.history_writes.push(wrote);
    }

    fn create(&mut self, dir: u16, name: u8, kind: u8, target: u16) {
        let d = pick_dir(&self.model, dir);
        let name = NAMES[name as usize];
        let (kind, mode) = match kind % 5 {
            0 | 1 => (FileKind::Regular, 0o644),
            2 | 3 => (FileKind::Directory, 0o755),
            _ => (FileKind::Symlink, 0o777),
        };
        let tlen = if target.is_multiple_of(17) {
            4095
        } else {
            1 + target as usize % 300
        };
        let tgt = pattern(tlen, u64::from(target))
            .iter()
            .map(|b| b'a' + b % 26)
            .collect::<Vec<_>>();
        let symlink = (kind == FileKind::Symlink).then_some(&tgt[..]);
        let got = errno(self.fs().create_node(d, name, kind, mode, 0, ROOT, symlink));
        let want = self.model.create_check(d, name);
        agree(
            &format!("create {kind:?} {} in {d}", show(name)),
            &got,
            &want,
        );
        let Ok(attr) = got else { return };
        assert_eq!(attr.kind, kind);
        let body = match kind {
            FileKind::Regular => Body::File(Arc::new(Vec::new())),
            FileKind::Directory => Body::Dir {
                entries: BTreeMap::new(),
                parent: d,
            },
            _ => Body::Symlink(tgt.clone()),
        };
        self.model.insert(d, name, attr.ino, body);
        self.touched.insert(attr.ino);
    }

    fn open_unlink_read(&mut self, i: usize, file: u16) {
        let Some(ino) = pick(&self.model.linked_files(), file) else {
            return;
        };
        let (_, dir, name, _) = self
            .model
            .walk()
            .into_iter()
            .find(|w| w.3 == ino)
            .expect("linked file has a path");
        let fs = self.fs.clone().unwrap();
        fs.open(ino).unwrap();
        *self.model.open.entry(ino).or_default() += 1;
        fs.remove(dir, &name, false).unwrap();
        self.model.remove(dir, &name, false).unwrap();
        let want = self.model.content(ino).clone();
        let attr = fs.getattr(ino).unwrap();
        assert_eq!(
            attr.nlink,
            self.model.links(ino),
            "op {i}: nlink of an open unlinked file"
        );
        assert!(
            read_all(&fs, ino, attr.size) == *want,
            "op {i}: read through the handle"
        );
        fs.release(ino).unwrap();
        *self.model.open.get_mut(&ino).unwrap() -= 1;
        if self.model.open[&ino] == 0 {
            self.model.open.remove(&ino);
        }
        self.model.collect(ino);
        if !self.model.nodes.contains_key(&ino) {
            let got = errno(fs.getattr(ino));
            assert_eq!(
                got.err(),
                Some(libc::ENOENT),
                "op {i}: inode {ino} outlived its last close"
            );
        }
    }

    fn release_all(&mut self, i: usize) {
        for ino in std::mem::take(&mut self.handles) {
            self.fs().release(ino).unwrap();
            let n = self.model.open.get_mut(&ino).unwrap();
            *n -= 1;
            if *n == 0 {
                self.model.open.remove(&ino);
            }
            self.model.collect(ino);
            if !self.model.nodes.contains_key(&ino) {
                let got = errno(self.fs().getattr(ino));
                assert_eq!(
                    got.err(),
                    Some(libc::ENOENT),
                    "op {i}: orphan {ino} not freed"
                );
            }
        }
    }

    /// The mount that owns the metadata: the one the operations go to, or the owner behind
    /// a client-only one.
    fn owner_fs(&self) -> &FileSystem {
        self.owner.as_deref().unwrap_or_else(|| self.fs())
    }

    /// Unmounts the client first (its data and updates reach the owner's log), then the
    /// owner.
    fn unmount(&mut self) {
        let fs = self.fs.take().unwrap();
        fs.unmount().unwrap();
        drop(fs);
        if let Some(owner) = self.owner.take() {
            owner.unmount().unwrap();
        }
    }

    fn remount(&mut self) {
        let (fs, owner, drives) = mount_routed(&self.t, self.route);
        self.fs = Some(fs);
        self.owner = owner;
        self.drives = drives;
        self.handles.clear();
        self.model.drop_handles();
    }

    /// Kills the instance at the storage boundary, checks the crash image with fsck, mounts
    /// it and finds which model state since the last durable point it holds.
    fn crash(&mut self, i: usize) {
        for d in &self.drives {
            d.power_cut();
        }
        drop(self.fs.take());
        drop(self.owner.take());
        let report = tessera_fs::fsck(self.t.reopen(), false).unwrap();
        assert!(
            report.is_clean(),
            "op {i}: fsck of the crash image: {:?}",
            report.problems
        );
        self.remount();
        let got = fs_tree(self.fs(), &|_| true);
        let mut candidates: Vec<Model> = self.history.clone();
        for m in &mut candidates {
            m.drop_handles();
        }
        for m in candidates.iter().rev() {
            if diff(&got, &model_tree(m, &|_| true), None).is_none() {
                self.model = m.clone();
                self.durable_point();
                return;
            }
        }
        // A write, truncate or fallocate whose log records were only partly committed.
        for (k, w) in self.history_writes.iter().enumerate().rev() {
            let Some(ino) = *w else { continue };
            let before = &candidates[k];
            let after = &candidates[k + 1];
            let want = model_tree(before, &|_| true);
            // Every name of the file (hard links) shows the same inode.
            let Some((path, _)) = want.iter().find(|(_, v)| v.ino == ino) else {
                continue;
            };
            if diff(&got, &want, Some(ino)).is_some() {
                continue;
            }
            let (old, new) = (before.content(ino), after.content(ino));
            let g = got[path].content.clone().unwrap();
            let at = |c: &Vec<u8>, j: usize| c.get(j).copied().unwrap_or(0);
            let sizes = old.len().min(new.len())..=old.len().max(new.len());
            if sizes.contains(&g.len())
                && g.iter()
                    .enumerate()
                    .all(|(j, b)| *b == at(old, j) || *b == at(new, j))
            {
                self.model = before.clone();
                *self.model.content_mut(ino) = g;
                self.durable_point();
                return;
            }
        }
        let newest = model_tree(candidates.last().unwrap(), &|_| true);
        let oldest = model_tree(&candidates[0], &|_| true);
        panic!(
            "op {i}: recovered tree matches no state since the last durable point \
             ({} candidates); against the newest: {:?}; against the durable one: {:?}",
            candidates.len(),
            diff(&got, &newest, None),
            diff(&got, &oldest, None)
        );
    }

    fn check(&mut self, i: usize, op: &Op, full: bool) {
        let touched = std::mem::take(&mut self.touched);
        let with = |ino: Ino| full || touched.contains(&ino);
        let got = fs_tree(self.fs(), &with);
        let want = model_tree(&self.model, &with);
        if let Some(d) = diff(&got, &want, None) {
            panic!("after op {i} ({op:?}): {d}");
        }
        // Files unlinked while open live on, unreachable, until their last close.
        for (&ino, _) in self
            .model
            .open
            .iter()
            .filter(|(i, _)| self.model.links(**i) == 0)
        {
            let attr = self.fs().getattr(ino).unwrap();
            assert_eq!(attr.nlink, 0, "after op {i}: orphan {ino}");
            let c = self.model.content(ino);
            assert!(
                read_all(self.fs(), ino, attr.size) == **c,
                "after op {i}: orphan {ino} data"
            );
        }
    }

    fn finish(mut self) {
        self.release_all(usize::MAX);
        self.unmount();
        let report = tessera_fs::fsck(self.t.reopen(), false).unwrap();
        assert!(
            report.is_clean(),
            "fsck after the run: {:?}",
            report.problems
        );
        self.remount();
        self.check(usize::MAX, &Op::Remount, true);
        // The check read every shard through a cache of fewer pages than there are shards.
        let stats = self.owner_fs().metadata_cache_stats();
        assert!(
            stats.evictions > 0,
            "the tiny metadata cache never evicted: {stats:?}"
        );
        let (records, attrs) = self.owner_fs().inode_cache_len();
        assert!(
            records <= TINY_INODE_CACHE && attrs <= TINY_STAT_CACHE,
            "inode caches over their bounds: {records} records, {attrs} attributes"
        );
        self.unmount();
    }
}

fn run(opts: &FormatOptions, ops: &[Op]) {
    run_with(opts, ops, Route::Direct);
}

fn run_with(opts: &FormatOptions, ops: &[Op], route: Route) {
    let mut r = Run::new(opts, route);
    for (i, op) in ops.iter().enumerate() {
        r.apply(i, op);
        let full = i % FULL_CHECK_EVERY == FULL_CHECK_EVERY - 1
            || matches!(op, Op::Remount | Op::CrashRemount { .. } | Op::Checkpoint);
        r.check(i, op, full);
    }
    r.finish();
}

fn config(cases: u32) -> Config {
    Config {
        cases,
        // Regression files would land beside the crate; a failing case prints its ops.
        failure_persistence: None,
        max_shrink_iters: 200,
        ..Config::default()
    }
}

fn opts_256k() -> FormatOptions {
    small_opts()
}

fn opts_64k() -> FormatOptions {
    FormatOptions {
        block_size: 64 << 10,
        inode_size: 512,
        ..small_opts()
    }
}

proptest! {
    #![proptest_config(config(96))]

    /// 256 KiB blocks, 4 KiB inodes: inline files up to 3840 bytes, fragments, multi-block.
    #[test]
    fn model_256k_blocks(ops in proptest::collection::vec(op_strategy(), OPS)) {
        run(&opts_256k(), &ops);
    }
}

proptest! {
    #![proptest_config(config(48))]

    /// 64 KiB blocks, 512-byte inodes: inline files up to 256 bytes, many blocks per file.
    #[test]
    fn model_64k_blocks(ops in proptest::collection::vec(op_strategy(), OPS)) {
        run(&opts_64k(), &ops);
    }
}

fn opts_two_copies() -> FormatOptions {
    FormatOptions {
        max_data_replicas: 2,
        replication: tessera_fs::Replication {
            data: 2,
            strict: tessera_fs::StrictReplication::WhenPossible,
        },
        ..small_opts()
    }
}

proptest! {
    #![proptest_config(config(32))]

    /// Two copies of every data block (`-r 2`, four failure groups): every write, fallocate,
    /// truncate and crash goes through the copies' paths, and reads verify either copy.
    #[test]
    fn model_two_data_copies(ops in proptest::collection::vec(op_strategy(), OPS)) {
        run(&opts_two_copies(), &ops);
    }
}

proptest! {
    #![proptest_config(config(24))]

    /// Two copies of the metadata as well (`-m 2 -r 2`): every checkpoint writes each page,
    /// map chunk and log page twice, reads take the first copy, and crashes cut the power
    /// under both copies' writes.
    #[test]
    fn model_two_metadata_copies(ops in proptest::collection::vec(op_strategy(), OPS)) {
        run(&FormatOptions { metadata_replicas: 2, ..opts_two_copies() }, &ops);
    }
}

proptest! {
    #![proptest_config(config(24))]

    /// The client reaches its metanode only through the encoded requests and replies a
    /// remote owner will get: every operation, answer and error survives the wire form.
    #[test]
    fn model_through_the_metanode_wire(ops in proptest::collection::vec(op_strategy(), OPS)) {
        run_with(&opts_256k(), &ops, Route::Wire);
    }
}

proptest! {
    #![proptest_config(config(24))]

    /// The operations go to a client-only mount of the same drives, whose every metadata
    /// request an owner mounted beside it answers: the client's data path writes and reads
    /// the drives itself, the owner logs; crashes cut the power under both.
    #[test]
    fn model_through_a_client_only_mount(ops in proptest::collection::vec(op_strategy(), OPS)) {
        run_with(&opts_256k(), &ops, Route::Client);
    }
}

proptest! {
    #![proptest_config(config(32))]

    /// Small writes gathered in memory and written when a read, stat, truncate, fsync,
    /// close or unmount needs them: the model sees every write at once all the same.
    #[test]
    fn model_with_small_writes_gathered(ops in proptest::collection::vec(op_strategy(), OPS)) {
        run_with(&opts_256k(), &ops, Route::Gathered);
    }
}

/// fallocate(2) with FALLOC_FL_KEEP_SIZE past the end of file is how applications preallocate
/// (databases, downloaders): the blocks belong to the file while its size stays. fsck reports
/// each such block as "maps block N beyond its size" and a repair would unmap it, so an
/// unmounted healthy file system fails fsck.
#[test]
fn fsck_accepts_keep_size_preallocation() {
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let f = create_file(&fs, ROOT_INO, b"f");
    fs.write(f.ino, 0, b"hello", false).unwrap();
    fs.fallocate(f.ino, 0, 1 << 20, FALLOC_FL_KEEP_SIZE)
        .unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().size, 5);
    fs.unmount().unwrap();
    drop(fs);
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// Found by `model_256k_blocks` (2026-11-27): an in-place write whose data was lost in a
/// crash left its sectors with a pending alternative; the next in-place write over them
/// recorded the lost write's checksum as its alternative, and after a second crash the
/// sectors (still holding the first data) matched neither. Such sectors are now read and
/// settled or reverted before they are overwritten in place.
#[test]
fn regression_checksum_mismatch_after_two_crashes() {
    let ops = vec![
        Op::Create {
            dir: 0,
            name: 0,
            kind: 159,
            target: 1,
        },
        Op::Create {
            dir: 7215,
            name: 2,
            kind: 170,
            target: 31971,
        },
        Op::Write {
            file: 0,
            off_kind: 0,
            off: 9493,
            len_kind: 3,
            len: 6212186,
            seed: 14461829083072551214,
            sync: false,
        },
        Op::Sync,
        Op::Create {
            dir: 896,
            name: 1,
            kind: 240,
            target: 48066,
        },
        Op::Write {
            file: 62329,
            off_kind: 4,
            off: 2338776186,
            len_kind: 3,
            len: 871055673,
            seed: 9940394800191886144,
            sync: false,
        },
        Op::CrashRemount { sync_first: false },
        Op::OpenUnlinkRead { file: 52734 },
        Op::Write {
            file: 31028,
            off_kind: 4,
            off: 520033996,
            len_kind: 3,
            len: 3095759622,
            seed: 17880400717091443943,
            sync: false,
        },
        Op::CrashRemount { sync_first: false },
    ];
    for _ in 0..8 {
        run(&opts_256k(), &ops);
    }
}

/// A write of no bytes past the end of a file whose writes are gathered started an empty
/// run there: `stat` then reported the run's end as the size, and reads returned nothing
/// (found by `model_with_small_writes_gathered` in CI: a zero-length write at offset 1).
#[test]
fn regression_an_empty_write_past_the_end_changes_nothing() {
    let ops = vec![
        Op::Create {
            dir: 0,
            name: 0,
            kind: 85,
            target: 0,
        },
        Op::Write {
            file: 0,
            off_kind: 0,
            off: 1,
            len_kind: 0,
            len: 4141204000,
            seed: 437106251636423,
            sync: false,
        },
        Op::Write {
            file: 52507,
            off_kind: 4,
            off: 3090072239,
            len_kind: 2,
            len: 433853720,
            seed: 16480270788627173334,
            sync: false,
        },
        Op::SetXattr {
            node: 54425,
            name: 0,
            len: 15046,
            flag: 2,
        },
        Op::Unlink {
            dir: 34750,
            name: 5,
        },
    ];
    run_with(&opts_256k(), &ops, Route::Gathered);
}
