//! Shared helpers: file-backed drives with NSD descriptors, a formatted file system.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use tessera_drive::{BlockDevice, FileDrive};
use tessera_fs::{DiskSpec, FileSystem, FormatOptions, ROOT_INO};
use tessera_nsd::descriptor::{write_descriptor, NsdDescriptor};
use tessera_nsd::{DiskUsage, NsdId};

pub struct TestDisks {
    pub dir: tempfile::TempDir,
    pub disks: Vec<(NsdId, Arc<dyn BlockDevice>)>,
    /// The NSD ids of the drives `d0`, `d1`, ... in `dir`, kept when the handles are closed.
    pub ids: Vec<NsdId>,
}

fn open_drive(path: &Path) -> FileDrive {
    tessera_testkit::open_drive_waiting(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

impl TestDisks {
    /// Uses drives that another process (the crash test's parent) created in `dir`; the NSD
    /// ids are read back from the drives' descriptors.
    pub fn adopt(dir: &Path) -> AdoptedDisks {
        let mut disks = Vec::new();
        for i in 0.. {
            let path = dir.join(format!("d{i}"));
            if !path.exists() {
                break;
            }
            let dev: Arc<dyn BlockDevice> = Arc::new(open_drive(&path));
            let nd = tessera_nsd::descriptor::read_descriptor(dev.as_ref())
                .unwrap()
                .unwrap();
            disks.push((nd.id, dev));
        }
        AdoptedDisks { disks }
    }

    /// Opens the drives again, as a restarted daemon would.
    pub fn reopen(&self) -> Vec<(NsdId, Arc<dyn BlockDevice>)> {
        self.ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let path = self.dir.path().join(format!("d{i}"));
                let dev: Arc<dyn BlockDevice> = Arc::new(open_drive(&path));
                (*id, dev)
            })
            .collect()
    }

    /// Closes this process's handles on the drives, so that a child process can open them:
    /// a drive is claimed by one process at a time, as a daemon claims its devices.
    pub fn close_drives(&mut self) {
        self.disks.clear();
    }
}

pub fn make_disks(count: usize, bytes: u64) -> TestDisks {
    let dir = tempfile::tempdir().unwrap();
    let disks: Vec<(NsdId, Arc<dyn BlockDevice>)> = (0..count)
        .map(|i| {
            let path = dir.path().join(format!("d{i}"));
            std::fs::File::create(&path)
                .unwrap()
                .set_len(bytes)
                .unwrap();
            let dev: Arc<dyn BlockDevice> = Arc::new(FileDrive::open(Path::new(&path)).unwrap());
            let id = NsdId::random();
            let nd = NsdDescriptor {
                id,
                name: format!("nsd{i}"),
                device_bytes: bytes,
                created_unix: 0,
                cluster_id: [0; 16],
            };
            write_descriptor(dev.as_ref(), &nd).unwrap();
            (id, dev)
        })
        .collect();
    let ids = disks.iter().map(|(id, _)| *id).collect();
    TestDisks { dir, disks, ids }
}

pub fn format_fs(t: &TestDisks, opts: &FormatOptions) {
    format_fs_with(t, opts, |_| (DiskUsage::DataAndMetadata, "system"));
}

/// Formats with `layout(i)` giving disk `i`'s usage and storage pool.
pub fn format_fs_with(
    t: &TestDisks,
    opts: &FormatOptions,
    layout: impl Fn(usize) -> (DiskUsage, &'static str),
) {
    let specs = t
        .disks
        .iter()
        .enumerate()
        .map(|(i, (id, dev))| {
            let (usage, pool) = layout(i);
            DiskSpec {
                nsd_name: format!("nsd{i}"),
                nsd_id: *id,
                usage,
                failure_group: i as i32 + 1,
                pool: pool.into(),
                device: dev.clone(),
            }
        })
        .collect();
    tessera_fs::format(specs, opts, &mut |_| {}).unwrap();
}

pub fn small_opts() -> FormatOptions {
    FormatOptions {
        block_size: 256 << 10,
        log_bytes: 8 << 20,
        max_inodes: 200_000,
        ..Default::default()
    }
}

/// `count` disks of 160 MiB, formatted as by [`region_disks`]: allocation region 0 is the
/// first 32,512 sub-blocks (127 MiB) of each disk, region 1 the rest.
#[allow(dead_code)]
pub fn two_region_disks(count: usize) -> TestDisks {
    region_disks(count, 160 << 20)
}

/// `count` disks of `bytes`, formatted with 64 KiB blocks (4 KiB sub-blocks, so an
/// allocation region is 127 MiB of each disk), a 4 MiB log and clustered placement.
#[allow(dead_code)]
pub fn region_disks(count: usize, bytes: u64) -> TestDisks {
    let t = make_disks(count, bytes);
    format_fs(
        &t,
        &FormatOptions {
            block_size: 64 << 10,
            log_bytes: 4 << 20,
            placement: tessera_fs::Placement::Cluster,
            ..small_opts()
        },
    );
    t
}

pub fn mount(t: &TestDisks) -> Arc<FileSystem> {
    FileSystem::mount(t.reopen()).unwrap()
}

pub struct AdoptedDisks {
    pub disks: Vec<(NsdId, Arc<dyn BlockDevice>)>,
}

impl AdoptedDisks {
    pub fn reopen(&self) -> Vec<(NsdId, Arc<dyn BlockDevice>)> {
        self.disks.clone()
    }
}

/// Deterministic pseudo-random test bytes (not every test binary of this crate uses them).
#[allow(unused_imports)]
pub use tessera_testkit::pattern;

/// Creates a node of `kind` and `mode`, owned by root, named `name` in directory `parent`.
fn create_as_root(
    fs: &FileSystem,
    parent: tessera_fs::Ino,
    name: &[u8],
    kind: tessera_fs::FileKind,
    mode: u32,
) -> tessera_fs::Attr {
    let root = tessera_fs::Caller { uid: 0, gid: 0 };
    fs.create_node(parent, name, kind, mode, 0, root, None)
        .unwrap()
}

/// Creates a regular file `name` (mode 0644, owned by root) in directory `parent`.
pub fn create_file(fs: &FileSystem, parent: tessera_fs::Ino, name: &[u8]) -> tessera_fs::Attr {
    create_as_root(fs, parent, name, tessera_fs::FileKind::Regular, 0o644)
}

/// Creates a directory `name` (mode 0755, owned by root) in directory `parent`.
#[allow(dead_code)]
pub fn make_dir(fs: &FileSystem, parent: tessera_fs::Ino, name: &[u8]) -> tessera_fs::Attr {
    create_as_root(fs, parent, name, tessera_fs::FileKind::Directory, 0o755)
}

pub const BLOCK: u64 = 256 << 10;

/// Writes files of several shapes (whole blocks, fragments, a sparse file) in the root
/// directory, for tests that move blocks (256 KiB blocks, `small_opts`); returns name ->
/// content.
pub fn populate(fs: &FileSystem, prefix: &str, seed: u64) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for (i, size) in [
        100usize,
        9_000,
        70_000,
        3 * BLOCK as usize + 5_000,
        9 * BLOCK as usize,
    ]
    .iter()
    .enumerate()
    {
        let name = format!("{prefix}{i}");
        let a = create_file(fs, ROOT_INO, name.as_bytes());
        let data = pattern(*size, seed + i as u64);
        for (j, chunk) in data.chunks(100_000).enumerate() {
            fs.write(a.ino, (j * 100_000) as u64, chunk, false).unwrap();
        }
        files.insert(name, data);
    }
    // Sparse: a hole, then a few sectors in the middle of a block (unwritten around them).
    let name = format!("{prefix}sparse");
    let a = create_file(fs, ROOT_INO, name.as_bytes());
    let piece = pattern(8192, seed + 50);
    let at = 2 * BLOCK + 40_960;
    fs.write(a.ino, at, &piece, false).unwrap();
    let mut data = vec![0u8; at as usize];
    data.extend_from_slice(&piece);
    files.insert(name, data);
    fs.sync().unwrap();
    files
}

pub fn verify(fs: &FileSystem, files: &BTreeMap<String, Vec<u8>>) {
    for (name, data) in files {
        let a = fs.lookup(ROOT_INO, name.as_bytes()).unwrap();
        assert_eq!(a.size, data.len() as u64, "{name}");
        let got = fs.read(a.ino, 0, data.len() as u32 + 10).unwrap();
        assert!(got == *data, "{name}: content differs");
    }
}

/// Used bytes of each disk (everything but free whole blocks and free fragments).
pub fn used(fs: &FileSystem) -> Vec<u64> {
    fs.df()
        .unwrap()
        .disks
        .iter()
        .map(|d| d.size_bytes - d.free_full_block_bytes - d.free_fragment_bytes)
        .collect()
}

/// A file system's drives, by NSD id, as `FileSystem::mount` takes them.
pub type Disks = Vec<(NsdId, Arc<dyn BlockDevice>)>;

/// The drives of `t` behind one set of injectable faults (see `tessera_testkit::SimDrive`):
/// a crash test mounts them, sets `writes_until_failure` and then calls [`crash`].
pub fn with_faults(t: &TestDisks) -> (Disks, Arc<tessera_testkit::Faults>) {
    let faults = Arc::new(tessera_testkit::Faults::default());
    let sim = t
        .reopen()
        .into_iter()
        .map(|(id, dev)| {
            let dev: Arc<dyn BlockDevice> =
                Arc::new(tessera_testkit::SimDrive::new(dev, Arc::clone(&faults)));
            (id, dev)
        })
        .collect();
    (sim, faults)
}

/// The process dies here: no later write (a final checkpoint, the flusher) lands. Returns
/// whether the injected failure was reached.
pub fn crash(fs: Arc<FileSystem>, faults: &tessera_testkit::Faults) -> bool {
    use std::sync::atomic::Ordering;
    let crashed = faults.writes_until_failure.load(Ordering::SeqCst) <= 0;
    faults.dead.store(true, Ordering::SeqCst);
    fs.fence();
    crashed
}

/// fsck of the unmounted file system on `t` finds nothing; `context` names the case.
pub fn assert_fsck_clean(t: &TestDisks, context: &str) {
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "{context}: {:?}", report.problems);
}

/// Disk specs of `t` named nsd0, nsd1, ... in pool `system`, disk `i` with the usage and
/// failure group `groups[i]`.
#[allow(dead_code)]
pub fn specs_in_groups(t: &TestDisks, groups: &[(DiskUsage, i32)]) -> Vec<DiskSpec> {
    t.disks
        .iter()
        .enumerate()
        .map(|(i, (id, dev))| DiskSpec {
            nsd_name: format!("nsd{i}"),
            nsd_id: *id,
            usage: groups[i].0,
            failure_group: groups[i].1,
            pool: "system".into(),
            device: dev.clone(),
        })
        .collect()
}

/// The drives of `t` without those named (a failure group lost).
#[allow(dead_code)]
pub fn without(t: &TestDisks, gone: &[usize]) -> Disks {
    t.reopen()
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !gone.contains(i))
        .map(|(_, d)| d)
        .collect()
}

/// The drives of `t`, those of `group` behind one switch that makes them vanish (every
/// read, write and flush fails).
#[allow(dead_code)]
pub fn with_vanishing(t: &TestDisks, group: &[usize]) -> (Disks, Arc<tessera_testkit::Faults>) {
    let faults = Arc::new(tessera_testkit::Faults::default());
    let disks = t
        .reopen()
        .into_iter()
        .enumerate()
        .map(|(i, (id, dev))| {
            let dev: Arc<dyn BlockDevice> = if group.contains(&i) {
                Arc::new(tessera_testkit::SimDrive::new(dev, Arc::clone(&faults)))
            } else {
                dev
            };
            (id, dev)
        })
        .collect();
    (disks, faults)
}

/// One round of a crash loop's work on `fs` in `dir` (round `k`): two files of about
/// `size` bytes made, written and fsynced with a checkpoint between them, then the first
/// file of `synced` removed and synced. What returned before a failure is applied to
/// `synced` (a file whose fsync returned added, a removal whose sync returned taken out),
/// so that after a crash `synced` is what must come back.
#[allow(dead_code)]
pub fn fsynced_round(
    fs: &FileSystem,
    dir: tessera_fs::Ino,
    k: i64,
    size: usize,
    synced: &mut BTreeMap<String, Vec<u8>>,
) -> tessera_fs::FsResult<()> {
    let root = tessera_fs::Caller { uid: 0, gid: 0 };
    let oldest = synced.keys().next().cloned();
    for j in 0..2u64 {
        let name = format!("k{k}-{j}");
        let a = fs.create_node(
            dir,
            name.as_bytes(),
            tessera_fs::FileKind::Regular,
            0o644,
            0,
            root,
            None,
        )?;
        let data = pattern(size, k as u64 * 10 + j);
        fs.write(a.ino, 0, &data, false)?;
        fs.fsync(a.ino)?;
        synced.insert(name, data);
        if j == 0 {
            fs.checkpoint()?;
        }
    }
    if let Some(old) = oldest {
        fs.remove(dir, old.as_bytes(), false)?;
        fs.sync()?;
        synced.remove(&old);
    }
    Ok(())
}

/// `count` files `{prefix}0`, `{prefix}1`, ... in `dir`, each written and fsynced on its
/// own (a log commit each); name -> content.
#[allow(dead_code)]
pub fn fsynced_one_by_one(
    fs: &FileSystem,
    (dir, prefix): (tessera_fs::Ino, &str),
    count: u64,
) -> Vec<(String, Vec<u8>)> {
    (0..count)
        .map(|i| {
            let name = format!("{prefix}{i}");
            let a = create_file(fs, dir, name.as_bytes());
            let data = tessera_testkit::pattern(2_000 + i as usize, i);
            fs.write(a.ino, 0, &data, false).unwrap();
            fs.fsync(a.ino).unwrap();
            (name, data)
        })
        .collect()
}

/// How many of `files` are in `dir`, each checked whole; a file that is not there at all
/// is allowed (its records were lost), one there but different is not.
#[allow(dead_code)]
pub fn count_whole(fs: &FileSystem, dir: tessera_fs::Ino, files: &[(String, Vec<u8>)]) -> usize {
    let mut whole = 0;
    for (name, data) in files {
        match fs.lookup(dir, name.as_bytes()) {
            Ok(a) => {
                assert_eq!(&fs.read(a.ino, 0, 1 << 20).unwrap(), data, "{name}");
                whole += 1;
            }
            Err(tessera_fs::FsError::NotFound) => {}
            Err(e) => panic!("{name}: {e}"),
        }
    }
    whole
}

/// The device of disk `index` of the file system on `t`.
#[allow(dead_code)]
pub fn disk_device(
    t: &TestDisks,
    desc: &tessera_fs::FsDescriptor,
    index: u16,
) -> Arc<dyn BlockDevice> {
    let nsd = desc.disks.iter().find(|d| d.index == index).unwrap().nsd_id;
    t.reopen().into_iter().find(|(id, _)| *id == nsd).unwrap().1
}

/// The descriptor of the file system on `t`, as its disks hold it now.
#[allow(dead_code)]
pub fn descriptor(t: &TestDisks) -> tessera_fs::FsDescriptor {
    let devices: Vec<_> = t.reopen().into_iter().map(|(_, d)| d).collect();
    tessera_fs::read_descriptor(&devices).unwrap()
}

/// The device offset of page `seq` of a recovery log of `log_bytes` bytes at `log_start`:
/// its header page first, then the data pages, page `seq` in slot `seq` modulo their count
/// (tessera-journal's format).
#[allow(dead_code)]
pub fn log_page_offset(log_start: u64, log_bytes: u64, seq: u64) -> u64 {
    log_start + 4096 * (1 + seq % (log_bytes / 4096 - 1))
}

/// Flips a bit of the page at `offset` of `dev`.
#[allow(dead_code)]
pub fn flip_bit(dev: &dyn BlockDevice, offset: u64, byte: usize) {
    let mut page = tessera_drive::AlignedBuf::zeroed(4096);
    dev.read_at(&mut page, offset).unwrap();
    page[byte] ^= 0x10;
    dev.write_at(&page, offset).unwrap();
}
