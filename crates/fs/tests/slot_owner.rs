//! The owner of an owner slot other than 0 (`FileSystem::mount_slot`), beside the file
//! system manager's mount on the same disks, each with its own device handles as two nodes
//! would have: a directory made for the slot is served by the slot's owner alone, from its
//! own log and record; its data and metadata pages land in the allocation regions given to
//! it; a remount and a crash bring it back from its record and log; fsck of the whole file
//! system is clean.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use tessera_fs::{Caller, FileKind, FileSystem, FsError, Ino, ROOT_INO};

const ROOT: Caller = Caller { uid: 0, gid: 0 };

/// Two disks whose allocation region 0 is the first 127 MiB of each, region 1 the rest.
fn two_region_fs() -> TestDisks {
    two_region_disks(2)
}

/// Whether every block of `ino` lies in allocation region `region` (32,512 sub-blocks of 4
/// KiB per region with these disks).
fn blocks_in_region(fs: &FileSystem, ino: Ino, region: u64) -> bool {
    let addresses = fs.file_block_addresses(ino).unwrap();
    assert!(!addresses.is_empty(), "inode {ino} holds blocks");
    addresses
        .iter()
        .all(|(_, sub_block)| sub_block / 32_512 == region)
}

/// Unmounts the slot's owner, then the manager, and checks the whole file system.
fn unmount_both_and_check(t: &TestDisks, fs: Arc<FileSystem>, s1: Arc<FileSystem>, when: &str) {
    s1.unmount().unwrap();
    fs.unmount().unwrap();
    drop((s1, fs));
    assert_fsck_clean(t, when);
}

/// Directory `name` in `parent`, made through `fs` (mode 0755, by root).
fn mkdir(fs: &FileSystem, parent: Ino, name: &[u8]) -> tessera_fs::Attr {
    fs.create_node(parent, name, FileKind::Directory, 0o755, 0, ROOT, None)
        .unwrap()
}

/// Files of several sizes in `dir`, written through `fs`; name -> content.
fn write_files(fs: &FileSystem, dir: Ino, prefix: &str, seed: u64) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for (i, size) in [100usize, 9_000, 70_000, 300_000].iter().enumerate() {
        let name = format!("{prefix}{i}");
        let a = create_file(fs, dir, name.as_bytes());
        let data = pattern(*size, seed + i as u64);
        fs.write(a.ino, 0, &data, false).unwrap();
        files.insert(name, data);
    }
    files
}

fn verify_in(fs: &FileSystem, dir: Ino, files: &BTreeMap<String, Vec<u8>>) {
    for (name, data) in files {
        let a = fs.lookup(dir, name.as_bytes()).unwrap();
        assert_eq!(a.size, data.len() as u64, "{name}");
        let got = fs.read(a.ino, 0, data.len() as u32 + 10).unwrap();
        assert!(got == *data, "{name}: content differs");
    }
}

/// The manager with slot 1 made, region 1 given to it and directory `node1` made for it.
fn manager_with_a_slot_directory(t: &TestDisks) -> (Arc<FileSystem>, Ino) {
    let fs = mount(t);
    assert_eq!(fs.create_slot().unwrap(), 1);
    fs.give_free_regions(1, &[1]).unwrap();
    let d = fs
        .make_directory_for_slot(ROOT_INO, b"node1", 0o755, ROOT, 1)
        .unwrap();
    assert_eq!(d.kind, FileKind::Directory);
    (fs, d.ino)
}

#[test]
fn a_slot_owner_serves_its_directory_beside_the_manager() {
    let t = two_region_fs();
    let (fs, dir) = manager_with_a_slot_directory(&t);
    let mine = populate(&fs, "a", 1);
    let shard = (dir % u64::from(fs.descriptor().shard_count)) as usize;
    assert_eq!(fs.descriptor().shard_owner(shard).slot, 1);
    // The manager lists the name; the directory's inode is slot 1's to answer.
    let names: Vec<Vec<u8>> = fs
        .readdir(ROOT_INO, 0)
        .unwrap()
        .entries
        .into_iter()
        .map(|e| e.3)
        .collect();
    assert!(names.contains(&b"node1".to_vec()));
    assert!(matches!(
        fs.getattr(dir),
        Err(FsError::ShardElsewhere { .. })
    ));

    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    assert_eq!(s1.owner_slot(), 1);
    assert_eq!(s1.getattr(dir).unwrap().kind, FileKind::Directory);
    let theirs = write_files(&s1, dir, "b", 10);
    let sub = s1
        .create_node(dir, b"sub", FileKind::Directory, 0o755, 0, ROOT, None)
        .unwrap();
    assert_eq!(
        sub.ino % u64::from(fs.descriptor().shard_count),
        shard as u64,
        "a directory made in the slot goes to a shard the slot holds"
    );
    let deeper = write_files(&s1, sub.ino, "c", 20);
    for name in theirs.keys() {
        let a = s1.lookup(dir, name.as_bytes()).unwrap();
        if a.size > 4096 {
            assert!(blocks_in_region(&s1, a.ino, 1), "{name} outside region 1");
        }
    }
    // Administrative changes are the manager's.
    let err = s1.create_slot().unwrap_err().to_string();
    assert!(err.contains("file system manager"), "{err}");
    s1.checkpoint().unwrap();
    let record = fs.slots().unwrap().remove(0).1.unwrap();
    assert_eq!(record.generation, 1);
    assert_eq!(
        record.shards.iter().map(|e| e.shard).collect::<Vec<_>>(),
        vec![shard as u32]
    );
    assert_eq!(record.regions, vec![1]);
    // The manager goes on beside it.
    let more = populate(&fs, "m", 2);
    verify(&fs, &mine);
    verify(&fs, &more);
    unmount_both_and_check(&t, fs, s1, "after a slot owner's unmount");
    // Two checkpoints of the slot named the shard with roots of its own, in both halves of
    // its record, so the manager's checkpoint freed the hand-over root.
    let devices: Vec<_> = t.reopen().into_iter().map(|(_, d)| d).collect();
    let desc = tessera_fs::descriptor::read_descriptor(&devices).unwrap();
    assert_eq!(
        desc.root_ptrs()[shard].addr.0,
        0,
        "the hand-over root is released"
    );

    // Both come back from their own commit points.
    let fs = mount(&t);
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    verify_in(&s1, dir, &theirs);
    verify_in(&s1, sub.ino, &deeper);
    verify(&fs, &mine);
    s1.unmount().unwrap();
    fs.unmount().unwrap();
}

#[test]
fn a_slot_owner_that_dies_is_brought_back_by_replaying_its_log() {
    let t = two_region_fs();
    let (fs, dir) = manager_with_a_slot_directory(&t);
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    let before = write_files(&s1, dir, "b", 30);
    s1.checkpoint().unwrap();
    let after = write_files(&s1, dir, "c", 40);
    s1.remove(dir, b"b0", false).unwrap();
    s1.sync().unwrap();
    // Killed: nothing more lands, no checkpoint.
    s1.fence();
    drop(s1);
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    let mut before = before;
    before.remove("b0");
    verify_in(&s1, dir, &before);
    verify_in(&s1, dir, &after);
    assert!(matches!(s1.lookup(dir, b"b0"), Err(FsError::NotFound)));
    unmount_both_and_check(&t, fs, s1, "after a slot owner's crash and remount");
}

/// A page of an owner slot's log that held committed records and no longer reads back:
/// the slot's mount (its owner's, or a takeover) refuses the log by name rather than
/// replay it short; fsck names the loss and its repair starts the slot's log afresh at the
/// damaged page, after which the slot mounts with every file whose records precede it.
#[test]
fn a_damaged_page_inside_a_slots_log_is_refused_and_fsck_repair_accepts_the_loss() {
    let t = two_region_fs();
    let (fs, dir) = manager_with_a_slot_directory(&t);
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    s1.checkpoint().unwrap();
    let files = fsynced_one_by_one(&s1, (dir, "f"), 24);
    s1.fence();
    drop(s1);

    // The slot's log pages: the highest sequence is the log's end; a page some commits
    // before it lies after the checkpoint's replay point.
    let desc = descriptor(&t);
    let region = desc
        .slot_regions()
        .iter()
        .find(|r| r.slot == 1)
        .cloned()
        .unwrap();
    let dev = disk_device(&t, &desc, region.disk);
    let log = region.log_region();
    let pages = log.bytes / 4096 - 1;
    let mut page = tessera_drive::AlignedBuf::zeroed(4096);
    let mut end = 0;
    for seq in 0..pages.min(4096) {
        dev.read_at(&mut page, log_page_offset(log.offset, log.bytes, seq))
            .unwrap();
        if page[..4] == *b"TJLP" {
            end = end.max(u64::from_le_bytes(page[32..40].try_into().unwrap()));
        }
    }
    let damaged = end - 6;
    flip_bit(&*dev, log_page_offset(log.offset, log.bytes, damaged), 3000);
    drop(dev);

    let Err(refused) = FileSystem::mount_slot(t.reopen(), 1) else {
        panic!("the slot's mount replayed a log damaged inside as if it ended there");
    };
    let said = refused.to_string();
    assert!(
        said.contains("owner slot 1") && said.contains(&format!("page {damaged} ")),
        "{said}"
    );
    fs.unmount().unwrap();
    drop(fs);
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(
        report.problems.iter().any(|p| p.contains("owner slot 1")
            && p.contains("lost committed records")
            && p.contains(&format!("page {damaged} "))),
        "{:?}",
        report.problems
    );
    let repaired = tessera_fs::fsck(t.reopen(), true).unwrap();
    assert!(repaired.repaired >= 1, "{repaired:?}");
    assert_fsck_clean(&t, "after the repair of slot 1's log");

    let fs = mount(&t);
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    let kept = count_whole(&s1, dir, &files);
    assert!(kept >= 10 && kept < files.len(), "{kept} files kept");
    let a = create_file(&s1, dir, b"after");
    s1.write(a.ino, 0, b"new", false).unwrap();
    s1.fsync(a.ino).unwrap();
    unmount_both_and_check(&t, fs, s1, "after the slot's log was started afresh");
}

#[test]
fn a_live_slot_owner_takes_what_the_manager_gives_it() {
    let t = two_region_fs();
    let fs = mount(&t);
    fs.create_slot().unwrap();
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    // Nothing given yet: no shard to make anything in, no region to allocate in.
    assert_eq!(s1.take_from_owner_map().unwrap(), (vec![], vec![]));
    fs.give_free_regions(1, &[1]).unwrap();
    let d = fs
        .make_directory_for_slot(ROOT_INO, b"node1", 0o755, ROOT, 1)
        .unwrap();
    let shard = (d.ino % u64::from(fs.descriptor().shard_count)) as usize;
    assert_eq!(s1.take_from_owner_map().unwrap(), (vec![shard], vec![1]));
    let files = write_files(&s1, d.ino, "b", 50);
    unmount_both_and_check(&t, fs, s1, "after a live take");
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    verify_in(&s1, d.ino, &files);
    s1.unmount().unwrap();
}

#[test]
fn slot_mounts_that_cannot_be_are_refused_by_name() {
    let t = two_region_fs();
    let fs = mount(&t);
    let err = FileSystem::mount_slot(t.reopen(), 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no owner slot 1"), "{err}");
    let err = FileSystem::mount_slot(t.reopen(), 0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("file system manager"), "{err}");
    fs.unmount().unwrap();
}

#[test]
fn a_slot_owner_killed_at_every_write_loses_no_fsynced_byte() {
    let t = two_region_fs();
    let (fs, dir) = manager_with_a_slot_directory(&t);
    fs.unmount().unwrap();
    drop(fs);
    let mut synced: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut crashes = 0;
    for k in 1..400i64 {
        let (disks, faults) = with_faults(&t);
        let s1 = FileSystem::mount_slot(disks, 1).unwrap();
        faults.writes_until_failure.store(k, Ordering::SeqCst);
        // Files made, written and fsynced, a checkpoint between them, an older file
        // removed: every fsync that returned holds after the crash.
        let result = fsynced_round(&s1, dir, k, 20_000 + k as usize * 997, &mut synced);
        let crashed = crash(s1, &faults);
        let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
        verify_in(&s1, dir, &synced);
        s1.unmount().unwrap();
        drop(s1);
        assert_fsck_clean(&t, &format!("slot owner killed at write {k}"));
        if !crashed {
            result.unwrap();
            break;
        }
        crashes += 1;
    }
    assert!(crashes > 5, "the work crossed only {crashes} writes");
    let fs = mount(&t);
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    verify_in(&s1, dir, &synced);
    s1.unmount().unwrap();
    fs.unmount().unwrap();
}

/// The manager and the owner of slot 1 in one process, each reaching the other as two
/// nodes would (`InProcessOwner`: a request's whole answer, encoded): the slot's owner
/// sends what slot 0 serves to the manager, the manager what slot 1 serves to the slot's
/// owner.
fn two_owners(t: &TestDisks) -> (Arc<FileSystem>, Arc<FileSystem>) {
    two_owners_through(t, |fs| {
        Box::new(tessera_fs::InProcessOwner(Arc::downgrade(fs)))
    })
}

/// [`two_owners`], the slot's owner reaching the manager through the channel `to_manager`
/// makes.
fn two_owners_through(
    t: &TestDisks,
    to_manager: impl FnOnce(&Arc<FileSystem>) -> Box<dyn tessera_fs::MetanodeChannel>,
) -> (Arc<FileSystem>, Arc<FileSystem>) {
    let fs = mount(t);
    assert_eq!(fs.create_slot().unwrap(), 1);
    fs.give_free_regions(1, &[1]).unwrap();
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    connect_owners(&fs, &s1, to_manager(&fs));
    (fs, s1)
}

/// The manager and slot 1's owner of [`two_owners`] mounted again (slot and region made).
fn two_owners_again(t: &TestDisks) -> (Arc<FileSystem>, Arc<FileSystem>) {
    let fs = mount(t);
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    connect_owners(
        &fs,
        &s1,
        Box::new(tessera_fs::InProcessOwner(Arc::downgrade(&fs))),
    );
    (fs, s1)
}

fn connect_owners(
    fs: &Arc<FileSystem>,
    s1: &Arc<FileSystem>,
    to_manager: Box<dyn tessera_fs::MetanodeChannel>,
) {
    s1.route_metadata_through(to_manager);
    s1.take_from_owner_map().unwrap();
    let weak = Arc::downgrade(s1);
    fs.route_slots_through(Box::new(move |slot| {
        (slot == 1).then(|| {
            Box::new(tessera_fs::InProcessOwner(weak.clone()))
                as Box<dyn tessera_fs::MetanodeChannel>
        })
    }));
}

#[test]
fn one_namespace_is_served_by_two_owners() {
    let t = two_region_fs();
    let (fs, s1) = two_owners(&t);
    // The slot's owner makes its directory in the root, which the manager serves: it is
    // made for slot 1, and taken by it.
    let d = mkdir(&s1, ROOT_INO, b"node1");
    let n = u64::from(fs.descriptor().shard_count);
    assert_eq!(fs.descriptor().shard_owner((d.ino % n) as usize).slot, 1);
    assert_eq!(s1.getattr(d.ino).unwrap().kind, FileKind::Directory);
    let theirs = write_files(&s1, d.ino, "b", 60);
    for name in theirs.keys() {
        let a = s1.lookup(d.ino, name.as_bytes()).unwrap();
        if a.size > 4096 {
            assert!(blocks_in_region(&s1, a.ino, 1), "{name} outside region 1");
        }
    }
    // The manager finds the name in the root and asks slot 1's owner for the rest: the
    // directory's attributes, its names, its files' attributes and block maps.
    assert_eq!(fs.lookup(ROOT_INO, b"node1").unwrap().ino, d.ino);
    verify_in(&fs, d.ino, &theirs);
    let listed: Vec<String> = fs
        .readdir(d.ino, 0)
        .unwrap()
        .entries
        .into_iter()
        .map(|e| String::from_utf8(e.3).unwrap())
        .filter(|n| n != "." && n != "..")
        .collect();
    assert_eq!(listed.len(), theirs.len(), "{listed:?}");
    // The slot's owner sees the manager's files in the root, and writes one there, whose
    // blocks come from the manager's regions.
    let mine = populate(&fs, "a", 3);
    verify(&s1, &mine);
    let a = create_file(&s1, ROOT_INO, b"from-slot-1");
    let data = pattern(200_000, 77);
    s1.write(a.ino, 0, &data, false).unwrap();
    s1.fsync(a.ino).unwrap();
    assert!(blocks_in_region(&fs, a.ino, 0));
    assert!(fs.read(a.ino, 0, 300_000).unwrap() == data);
    // And the manager writes into a file of the slot's directory, through its owner.
    let b0 = fs.lookup(d.ino, b"b0").unwrap();
    fs.write(b0.ino, 0, b"manager was here", false).unwrap();
    fs.sync().unwrap();
    assert_eq!(&s1.read(b0.ino, 0, 16).unwrap()[..], b"manager was here");
    unmount_both_and_check(&t, fs, s1, "after two owners served one namespace");
}

/// What a lookup in the window saw.
type Seen = Arc<std::sync::Mutex<Option<Result<tessera_fs::Attr, String>>>>;

/// The slot's way to the manager, which, once the manager has made `name` in the root,
/// has the manager look it up before the slot's owner reads the answer (another node
/// asking about a directory made for a slot before the slot took its shard), and then the
/// slot's owner itself ask for its attributes (another request of the making node).
struct LookedUpBeforeTheAnswer {
    manager: std::sync::Weak<FileSystem>,
    name: &'static [u8],
    seen: Seen,
    maker: Arc<std::sync::OnceLock<std::sync::Weak<FileSystem>>>,
    seen_by_maker: Seen,
    looked: std::sync::atomic::AtomicBool,
}

impl tessera_fs::MetanodeChannel for LookedUpBeforeTheAnswer {
    fn call(&self, request: Vec<u8>) -> tessera_fs::FsResult<Vec<u8>> {
        let fs = self.manager.upgrade().expect("the manager is mounted");
        let reply = fs.serve_metanode_request(&request);
        if self.looked.load(Ordering::SeqCst) {
            return Ok(reply);
        }
        let listed = fs.readdir(ROOT_INO, 0).expect("the root lists");
        let Some(made) = listed.entries.iter().find(|e| e.3 == self.name) else {
            return Ok(reply);
        };
        if self.looked.swap(true, Ordering::SeqCst) {
            return Ok(reply);
        }
        // The maker first (its request comes back through this way, so no lock of ours
        // is held): the manager's lookup reaches the slot's owner, which then takes the
        // shard.
        if let Some(maker) = self.maker.get() {
            let maker = maker.upgrade().expect("the slot is mounted");
            let got = maker.getattr(made.1).map_err(|e| e.to_string());
            *self.seen_by_maker.lock().unwrap() = Some(got);
        }
        let found = fs.lookup(ROOT_INO, self.name).map_err(|e| e.to_string());
        *self.seen.lock().unwrap() = Some(found);
        Ok(reply)
    }
}

#[test]
fn a_directory_made_for_a_slot_is_served_to_others_before_its_maker_has_the_answer() {
    let t = two_region_fs();
    let seen = Arc::new(std::sync::Mutex::new(None));
    let seen_by_maker = Arc::new(std::sync::Mutex::new(None));
    let maker = Arc::new(std::sync::OnceLock::new());
    let (kept, kept_by_maker, way_to_maker) = (seen.clone(), seen_by_maker.clone(), maker.clone());
    let (fs, s1) = two_owners_through(&t, move |fs| {
        Box::new(LookedUpBeforeTheAnswer {
            manager: Arc::downgrade(fs),
            name: b"raced",
            seen: kept,
            maker: way_to_maker,
            seen_by_maker: kept_by_maker,
            looked: std::sync::atomic::AtomicBool::new(false),
        })
    });
    assert!(maker.set(Arc::downgrade(&s1)).is_ok());
    // Three nodes making one directory at once (mdtest's shared directory): the maker's
    // manager gives slot 1 a shard with it, and another node's lookup reaches slot 1's
    // owner before the maker took that shard. It used to fail with EIO ("inode shard N is
    // owned by another node's owner slot").
    let d = mkdir(&s1, ROOT_INO, b"raced");
    let seen = seen.lock().unwrap().take();
    match seen {
        Some(Ok(a)) => {
            assert_eq!(a.ino, d.ino);
            assert_eq!(a.kind, FileKind::Directory);
        }
        other => panic!("the manager's lookup in the window: {other:?}"),
    }
    match seen_by_maker.lock().unwrap().take() {
        Some(Ok(a)) => assert_eq!(a.ino, d.ino),
        other => panic!("the maker's own request in the window: {other:?}"),
    }
    let n = u64::from(fs.descriptor().shard_count);
    assert_eq!(fs.descriptor().shard_owner((d.ino % n) as usize).slot, 1);
    // The other makers get EEXIST, and the directory works from both sides.
    assert!(matches!(
        fs.create_node(
            ROOT_INO,
            b"raced",
            FileKind::Directory,
            0o755,
            0,
            ROOT,
            None
        ),
        Err(FsError::Exists)
    ));
    let theirs = write_files(&s1, d.ino, "r", 5);
    verify_in(&fs, d.ino, &theirs);
    unmount_both_and_check(
        &t,
        fs,
        s1,
        "after a directory was looked up before its maker took it",
    );
}

/// rename(2) of a directory over another directory in the same directory, where the one
/// in the way is another owner's: it replaces an empty one and refuses a full one, as
/// POSIX says, from either owner's side (it answered EXDEV).
#[test]
fn a_directory_is_renamed_over_another_owners_directory_within_one_directory() {
    let t = two_region_fs();
    let (fs, s1) = two_owners(&t);
    let n = u64::from(fs.descriptor().shard_count);
    let slot_of = |ino: Ino| fs.descriptor().shard_owner((ino % n) as usize).slot;
    // Slot 1's empty directory replaced by the manager's, which keeps its files.
    let theirs = mkdir(&s1, ROOT_INO, b"theirs");
    assert_eq!(slot_of(theirs.ino), 1);
    let mine = mkdir(&fs, ROOT_INO, b"mine");
    let files = write_files(&fs, mine.ino, "m", 3);
    let links = fs.getattr(ROOT_INO).unwrap().nlink;
    fs.rename(ROOT_INO, b"mine", ROOT_INO, b"theirs", false, false)
        .unwrap();
    for side in [&fs, &s1] {
        assert_eq!(side.lookup(ROOT_INO, b"theirs").unwrap().ino, mine.ino);
        assert!(matches!(
            side.lookup(ROOT_INO, b"mine"),
            Err(FsError::NotFound)
        ));
    }
    verify_in(&s1, mine.ino, &files);
    assert!(matches!(fs.getattr(theirs.ino), Err(FsError::NotFound)));
    assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, links - 1);
    // The other way, from the slot's side: the manager's directory in the way, slot 1's
    // moved over it; a full one in the way is refused and left as it was.
    let full = mkdir(&s1, ROOT_INO, b"full");
    let kept = write_files(&s1, full.ino, "f", 4);
    assert!(matches!(
        s1.rename(ROOT_INO, b"theirs", ROOT_INO, b"full", false, false),
        Err(FsError::NotEmpty)
    ));
    assert!(matches!(
        fs.rename(ROOT_INO, b"theirs", ROOT_INO, b"full", true, false),
        Err(FsError::Exists)
    ));
    let empty = mkdir(&s1, ROOT_INO, b"empty");
    for from in [&b"full"[..], b"empty"] {
        assert!(matches!(
            s1.rename(ROOT_INO, from, ROOT_INO, b"theirs", false, false),
            Err(FsError::NotEmpty)
        ));
    }
    verify_in(&fs, full.ino, &kept);
    verify_in(&fs, mine.ino, &files);
    assert_eq!(fs.lookup(ROOT_INO, b"empty").unwrap().ino, empty.ino);
    for name in files.keys() {
        fs.remove(mine.ino, name.as_bytes(), false).unwrap();
    }
    s1.rename(ROOT_INO, b"empty", ROOT_INO, b"theirs", false, false)
        .unwrap();
    assert_eq!(fs.lookup(ROOT_INO, b"theirs").unwrap().ino, empty.ino);
    assert!(matches!(fs.getattr(mine.ino), Err(FsError::NotFound)));
    unmount_both_and_check(&t, fs, s1, "after directories replaced across owners");
}

#[test]
fn names_across_owners_are_removed_and_renamed_within_one_directory() {
    let t = two_region_fs();
    let (fs, s1) = two_owners(&t);
    let d = mkdir(&s1, ROOT_INO, b"node1");
    let theirs = write_files(&s1, d.ino, "b", 70);
    let root_links = fs.getattr(ROOT_INO).unwrap().nlink;
    // rmdir of a directory another slot serves: refused while it holds names, from
    // either side.
    assert!(matches!(
        fs.remove(ROOT_INO, b"node1", true),
        Err(FsError::NotEmpty)
    ));
    assert!(matches!(
        fs.remove(ROOT_INO, b"node1", false),
        Err(FsError::IsDir)
    ));
    // Within one directory a directory's name moves wherever its inode is.
    fs.rename(ROOT_INO, b"node1", ROOT_INO, b"renamed", false, false)
        .unwrap();
    assert_eq!(s1.lookup(ROOT_INO, b"renamed").unwrap().ino, d.ino);
    s1.rename(ROOT_INO, b"renamed", ROOT_INO, b"node1", false, false)
        .unwrap();
    assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, root_links);
    // Renames within one owner work as ever.
    s1.rename(d.ino, b"b0", d.ino, b"b0-renamed", false, false)
        .unwrap();
    for name in theirs.keys() {
        let name = if name == "b0" {
            "b0-renamed"
        } else {
            name.as_str()
        };
        s1.remove(d.ino, name.as_bytes(), false).unwrap();
    }
    // Empty now: removed by the manager, across owners.
    fs.remove(ROOT_INO, b"node1", true).unwrap();
    assert!(matches!(
        fs.lookup(ROOT_INO, b"node1"),
        Err(FsError::NotFound)
    ));
    assert!(matches!(s1.getattr(d.ino), Err(FsError::NotFound)));
    assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, root_links - 1);
    // And a second one by the slot's owner itself.
    let e = mkdir(&s1, ROOT_INO, b"node1b");
    create_file(&s1, e.ino, b"x");
    s1.remove(e.ino, b"x", false).unwrap();
    s1.remove(ROOT_INO, b"node1b", true).unwrap();
    assert!(matches!(
        fs.lookup(ROOT_INO, b"node1b"),
        Err(FsError::NotFound)
    ));
    unmount_both_and_check(&t, fs, s1, "after removals across owners");
}

#[test]
fn directories_move_between_owners_under_the_rename_lock() {
    let t = two_region_fs();
    let (fs, s1) = two_owners(&t);
    let d = mkdir(&s1, ROOT_INO, b"node1").ino;
    let root_links = fs.getattr(ROOT_INO).unwrap().nlink;
    let sub = mkdir(&s1, d, b"sub").ino;
    let inner = mkdir(&fs, sub, b"inner").ino;
    let x = create_file(&s1, sub, b"x").ino;
    s1.write(x, 0, b"in sub", false).unwrap();
    let links = |m: &FileSystem, dir: Ino| m.getattr(dir).unwrap().nlink;
    let parent_of = |m: &FileSystem, dir: Ino| m.lookup(dir, b"..").unwrap().ino;
    // From slot 1's directory into the manager's root, by slot 1's owner: the name, the
    // parent pointer and both parents' link counts move; what it holds comes along.
    s1.rename(d, b"sub", ROOT_INO, b"sub-moved", false, false)
        .unwrap();
    for m in [&fs, &s1] {
        assert_eq!(m.lookup(ROOT_INO, b"sub-moved").unwrap().ino, sub);
        assert!(gone(m, d, b"sub"));
        assert_eq!(parent_of(m, sub), ROOT_INO);
        assert_eq!(links(m, ROOT_INO), root_links + 1);
        assert_eq!(links(m, d), 2);
        assert_eq!(m.lookup(sub, b"inner").unwrap().ino, inner);
        assert_eq!(&m.read(x, 0, 10).unwrap()[..], b"in sub");
    }
    // Never below itself, however many owners its parents have.
    for target in [inner, sub] {
        let err = fs
            .rename(ROOT_INO, b"sub-moved", target, b"loop", false, false)
            .unwrap_err();
        assert!(matches!(err, FsError::Invalid(_)), "{err}");
    }
    // Over a directory that is not empty: refused; over an empty one: it goes.
    mkdir(&s1, d, b"full");
    create_file(&s1, fs.lookup(d, b"full").unwrap().ino, b"y");
    assert!(matches!(
        fs.rename(ROOT_INO, b"sub-moved", d, b"full", false, false),
        Err(FsError::NotEmpty)
    ));
    let empty = mkdir(&s1, d, b"empty").ino;
    assert!(matches!(
        fs.rename(ROOT_INO, b"sub-moved", d, b"empty", true, false),
        Err(FsError::Exists)
    ));
    fs.rename(ROOT_INO, b"sub-moved", d, b"empty", false, false)
        .unwrap();
    for m in [&fs, &s1] {
        assert_eq!(m.lookup(d, b"empty").unwrap().ino, sub);
        assert!(matches!(m.getattr(empty), Err(FsError::NotFound)));
        assert_eq!(parent_of(m, sub), d);
        assert_eq!(links(m, ROOT_INO), root_links);
        assert_eq!(links(m, d), 4, "full and the moved directory");
    }
    // Moves racing from both mounts, each directory between the two parents: the rename
    // lock orders them, none is lost, no loop forms.
    let a = mkdir(&fs, ROOT_INO, b"a").ino;
    let b = mkdir(&s1, d, b"b").ino;
    // Each goes on past its 20 tries until both moved once. A move is refused while the
    // other directory is inside the one it moves into, which a side can hit on every try
    // while the other is still in its first 20 (refusals are quick, moves are not: on a
    // loaded machine one side ran through 5,000 refusals while the other made its 20
    // moves), so a side that has moved leaves its directory home and waits while the other
    // has not, and the bound is a time, not a count of tries.
    let done = [AtomicUsize::new(0), AtomicUsize::new(0)];
    let started = std::time::Instant::now();
    let race = |me: usize, there: &dyn Fn() -> bool, back: &dyn Fn() -> bool| {
        let mut tries = 0;
        let waiting = || {
            started.elapsed() < std::time::Duration::from_secs(120)
                && done.iter().any(|d| d.load(Ordering::SeqCst) == 0)
        };
        while tries < 20 || waiting() {
            tries += 1;
            if tries > 20 && done[me].load(Ordering::SeqCst) > 0 {
                back();
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
            if there() && back() {
                done[me].fetch_add(1, Ordering::SeqCst);
            }
        }
    };
    std::thread::scope(|scope| {
        scope.spawn(|| {
            race(
                0,
                &|| fs.rename(ROOT_INO, b"a", b, b"a", false, false).is_ok(),
                &|| fs.rename(b, b"a", ROOT_INO, b"a", false, false).is_ok(),
            )
        });
        scope.spawn(|| {
            race(
                1,
                &|| s1.rename(d, b"b", a, b"b", false, false).is_ok(),
                &|| s1.rename(a, b"b", d, b"b", false, false).is_ok(),
            )
        });
    });
    let [moved_a, moved_b] = done.map(|d| d.into_inner());
    assert!(moved_a > 0 && moved_b > 0, "{moved_a} {moved_b}");
    for m in [&fs, &s1] {
        let (pa, pb) = (parent_of(m, a), parent_of(m, b));
        assert!(!(pa == b && pb == a), "a loop formed");
    }
    unmount_both_and_check(&t, fs, s1, "after directories moved across owners");
}

/// What `name` in `dir` holds as both owners see it: its inode, link count and content.
fn seen_alike(fs: &FileSystem, s1: &FileSystem, dir: Ino, name: &[u8], data: &[u8]) -> Ino {
    let a = fs.lookup(dir, name).unwrap();
    let b = s1.lookup(dir, name).unwrap();
    assert_eq!((a.ino, a.nlink, a.size), (b.ino, b.nlink, b.size));
    assert_eq!(a.size, data.len() as u64);
    for m in [fs, s1] {
        assert!(m.read(a.ino, 0, data.len() as u32 + 1).unwrap() == data);
    }
    a.ino
}

fn gone(fs: &FileSystem, dir: Ino, name: &[u8]) -> bool {
    matches!(fs.lookup(dir, name), Err(FsError::NotFound))
}

#[test]
fn files_are_renamed_linked_and_unlinked_across_owners() {
    let t = two_region_fs();
    let (fs, s1) = two_owners(&t);
    let d = mkdir(&s1, ROOT_INO, b"node1").ino;
    let theirs = write_files(&s1, d, "b", 80);
    let mine = write_files(&fs, ROOT_INO, "a", 90);
    // A file of slot 1's directory moves into the manager's root; its inode stays slot 1's.
    let b0 = s1.lookup(d, b"b0").unwrap().ino;
    s1.rename(d, b"b0", ROOT_INO, b"b0-moved", false, false)
        .unwrap();
    assert_eq!(
        seen_alike(&fs, &s1, ROOT_INO, b"b0-moved", &theirs["b0"]),
        b0
    );
    assert_eq!(fs.lookup(ROOT_INO, b"b0-moved").unwrap().nlink, 1);
    assert!(gone(&fs, d, b"b0") && gone(&s1, d, b"b0"));
    // Back by the manager, over another file of slot 1's: the replaced file goes.
    let b1 = s1.lookup(d, b"b1").unwrap().ino;
    fs.rename(ROOT_INO, b"b0-moved", d, b"b1", false, false)
        .unwrap();
    assert_eq!(seen_alike(&fs, &s1, d, b"b1", &theirs["b0"]), b0);
    assert!(matches!(s1.getattr(b1), Err(FsError::NotFound)));
    assert!(gone(&s1, ROOT_INO, b"b0-moved"));
    // A hard link across owners, from either side: one more link, seen by both.
    let a0 = fs.lookup(ROOT_INO, b"a0").unwrap().ino;
    s1.link(a0, d, b"a0-link").unwrap();
    assert_eq!(seen_alike(&fs, &s1, d, b"a0-link", &mine["a0"]), a0);
    assert_eq!(s1.getattr(a0).unwrap().nlink, 2);
    let b2 = s1.lookup(d, b"b2").unwrap().ino;
    fs.link(b2, ROOT_INO, b"b2-link").unwrap();
    assert_eq!(fs.getattr(b2).unwrap().nlink, 2);
    // A rename over a name that links another owner's inode: that inode loses the link.
    fs.rename(ROOT_INO, b"a1", d, b"a0-link", false, false)
        .unwrap();
    let a1 = seen_alike(&fs, &s1, d, b"a0-link", &mine["a1"]);
    assert_eq!(fs.getattr(a0).unwrap().nlink, 1);
    // RENAME_NOREPLACE is refused over a name, an exchange across owners is EXDEV.
    assert!(matches!(
        fs.rename(ROOT_INO, b"a2", d, b"b3", true, false),
        Err(FsError::Exists)
    ));
    let err = fs
        .rename(ROOT_INO, b"a2", d, b"b3", false, true)
        .unwrap_err();
    assert_eq!(err.errno(), libc::EXDEV, "{err}");
    // Within one directory an exchange changes nothing of either inode: the directory's
    // owner swaps the names whoever serves the inodes, asked from either side.
    let b3 = s1.lookup(d, b"b3").unwrap().ino;
    fs.rename(d, b"a0-link", d, b"b3", false, true).unwrap();
    assert_eq!(seen_alike(&fs, &s1, d, b"a0-link", &theirs["b3"]), b3);
    assert_eq!(seen_alike(&fs, &s1, d, b"b3", &mine["a1"]), a1);
    s1.rename(d, b"b3", d, b"a0-link", false, true).unwrap();
    assert_eq!(seen_alike(&fs, &s1, d, b"a0-link", &mine["a1"]), a1);
    assert_eq!(seen_alike(&fs, &s1, d, b"b3", &theirs["b3"]), b3);
    // Unlinks of names whose inode the other owner serves: the name, then the link.
    s1.remove(d, b"a0-link", false).unwrap();
    assert!(matches!(fs.getattr(a1), Err(FsError::NotFound)));
    s1.remove(d, b"b2", false).unwrap();
    assert_eq!(
        seen_alike(&fs, &s1, ROOT_INO, b"b2-link", &theirs["b2"]),
        b2
    );
    assert_eq!(s1.getattr(b2).unwrap().nlink, 1);
    // An inode unlinked across owners while open stays until its last close.
    s1.open(b2).unwrap();
    fs.remove(ROOT_INO, b"b2-link", false).unwrap();
    assert!(s1.read(b2, 0, 10).unwrap() == theirs["b2"][..10]);
    s1.release(b2).unwrap();
    assert!(matches!(s1.getattr(b2), Err(FsError::NotFound)));
    // What is left, after both remount.
    s1.unmount().unwrap();
    fs.unmount().unwrap();
    drop((s1, fs));
    assert_fsck_clean(&t, "after renames, links and unlinks across owners");
    let (fs, s1) = two_owners_again(&t);
    assert_eq!(seen_alike(&fs, &s1, d, b"b1", &theirs["b0"]), b0);
    seen_alike(&fs, &s1, ROOT_INO, b"a0", &mine["a0"]);
    seen_alike(&fs, &s1, d, b"b3", &theirs["b3"]);
    seen_alike(&fs, &s1, ROOT_INO, b"a2", &mine["a2"]);
    for (dir, name) in [
        (d, "b0"),
        (d, "b2"),
        (ROOT_INO, "a1"),
        (ROOT_INO, "b2-link"),
    ] {
        assert!(gone(&fs, dir, name.as_bytes()), "{name}");
    }
    unmount_both_and_check(&t, fs, s1, "after a remount");
}

#[test]
fn a_node_asks_the_manager_for_a_slot_with_a_free_region() {
    let t = two_region_fs();
    let fs = mount(&t);
    let channel = tessera_fs::InProcessOwner(Arc::downgrade(&fs));
    assert_eq!(tessera_fs::ask_for_slot(&channel).unwrap(), 1);
    assert_eq!(fs.descriptor().slots.unwrap().region_owners, vec![0, 1]);
    // No second free region: refused by name, nothing made.
    let err = tessera_fs::ask_for_slot(&channel).unwrap_err().to_string();
    assert!(err.contains("wholly free allocation region"), "{err}");
    assert_eq!(fs.slots().unwrap().len(), 1);
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    unmount_both_and_check(&t, fs, s1, "after a slot was asked for");
}

#[test]
fn a_slot_owner_creates_opens_and_writes_in_its_directory() {
    let t = two_region_fs();
    let (fs, s1) = two_owners(&t);
    let d = mkdir(&s1, ROOT_INO, b"node1");
    // The slot's owner finds its own directory by name (the name is the manager's).
    assert_eq!(s1.lookup(ROOT_INO, b"node1").unwrap().ino, d.ino);
    let a = s1.create_open(d.ino, b"a", (0o644, 0o022), ROOT).unwrap();
    s1.write(a.ino, 0, b"hi\n", false).unwrap();
    s1.release(a.ino).unwrap();
    assert_eq!(&fs.read(a.ino, 0, 10).unwrap()[..], b"hi\n");
    s1.unmount().unwrap();
    fs.unmount().unwrap();
}

#[test]
fn nodes_asking_for_slots_at_once_get_distinct_regions() {
    let t = region_disks(1, 400 << 20);
    let fs = mount(&t);
    let asks: Vec<_> = (0..2)
        .map(|_| {
            let channel = tessera_fs::InProcessOwner(Arc::downgrade(&fs));
            std::thread::spawn(move || tessera_fs::ask_for_slot(&channel))
        })
        .collect();
    let mut slots: Vec<u32> = asks
        .into_iter()
        .map(|a| a.join().unwrap().unwrap())
        .collect();
    slots.sort_unstable();
    assert_eq!(slots, vec![1, 2]);
    let owners = fs.descriptor().slots.unwrap().region_owners;
    assert!(owners.contains(&1) && owners.contains(&2), "{owners:?}");
    fs.unmount().unwrap();
}

/// A channel to an owner in this process that takes the requests as node `origin`'s (so
/// it grants what the caller may keep) and counts them.
struct CountingNode {
    owner: std::sync::Weak<FileSystem>,
    origin: tessera_fs::locks::Origin,
    calls: Arc<std::sync::atomic::AtomicUsize>,
}

impl tessera_fs::MetanodeChannel for CountingNode {
    fn call(&self, request: Vec<u8>) -> tessera_fs::FsResult<Vec<u8>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let owner = self.owner.upgrade().expect("manager mounted");
        Ok(owner.serve_metanode_request_from(Some(self.origin), &request))
    }
}

/// mdtest's path walk on a slot owner: the name of its directory lies in a directory the
/// manager serves. Once the name is held, looking it up again asks the manager nothing
/// (not even to hear that the inode is another slot's); a change of that directory by the
/// manager revokes the name and the next lookup asks again.
#[test]
fn a_slot_owner_keeps_the_name_of_its_directory_in_the_managers() {
    let t = two_region_fs();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let origin = tessera_fs::locks::Origin {
        node: 2,
        incarnation: 1,
    };
    let (fs, s1) = two_owners_through(&t, |fs| {
        Box::new(CountingNode {
            owner: Arc::downgrade(fs),
            origin,
            calls: Arc::clone(&calls),
        })
    });
    let weak = Arc::downgrade(&s1);
    fs.on_read_revoke(Box::new(move |node, inos| {
        assert_eq!(node, origin);
        if let Some(s1) = weak.upgrade() {
            s1.serve_metanode_request(&tessera_fs::Fence::drop_held(inos));
        }
    }));
    fs.set_shared(true);
    s1.set_shared(true);
    let d = mkdir(&s1, ROOT_INO, b"node1");
    assert_eq!(s1.lookup(ROOT_INO, b"node1").unwrap().ino, d.ino);
    // Past the window in which a just-changed directory is not granted.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(s1.lookup(ROOT_INO, b"node1").unwrap().ino, d.ino);
    let before = calls.load(Ordering::Relaxed);
    for i in 0..20 {
        assert_eq!(s1.lookup(ROOT_INO, b"node1").unwrap().ino, d.ino);
        create_file(&s1, d.ino, format!("f{i}").as_bytes());
    }
    assert_eq!(
        calls.load(Ordering::Relaxed),
        before,
        "lookups of the slot's directory and creates in it asked the manager"
    );
    // The manager changes the root: the name is asked for again, and still found.
    create_file(&fs, ROOT_INO, b"other");
    assert_eq!(s1.lookup(ROOT_INO, b"node1").unwrap().ino, d.ino);
    assert!(calls.load(Ordering::Relaxed) > before);
    assert!(matches!(
        s1.lookup(ROOT_INO, b"nothing"),
        Err(FsError::NotFound)
    ));
    unmount_both_and_check(&t, fs, s1, "after lookups across owners");
}

/// A way to whichever mount serves slot 1 now, moved when the new owner's fence announces
/// itself, as a node's channel follows a slot's holder.
#[derive(Default)]
struct SlotWay {
    to: parking_lot::Mutex<std::sync::Weak<FileSystem>>,
    next: parking_lot::Mutex<Option<std::sync::Weak<FileSystem>>>,
    moves: std::sync::atomic::AtomicU64,
}

struct SlotWayHandle(Arc<SlotWay>);

impl tessera_fs::MetanodeChannel for SlotWayHandle {
    fn call(&self, request: Vec<u8>) -> tessera_fs::FsResult<Vec<u8>> {
        let to = self.0.to.lock().clone();
        tessera_fs::InProcessOwner(to).call(request)
    }

    fn call_seen(&self, request: Vec<u8>, seen: u64) -> tessera_fs::FsResult<Vec<u8>> {
        let to = {
            let to = self.0.to.lock();
            if self.generation() != seen {
                return Err(FsError::OwnerMoved);
            }
            to.clone()
        };
        tessera_fs::InProcessOwner(to).call(request)
    }

    fn generation(&self) -> u64 {
        self.0.moves.load(Ordering::SeqCst)
    }

    fn owner_announced(&self, _owner: u32, _incarnation: u64) {
        let mut to = self.0.to.lock();
        if let Some(next) = self.0.next.lock().take() {
            *to = next;
            self.0.moves.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The holder of slot 1 dies while a client (a third node: a client of the manager, and
/// of slot 1 for the directory slot 1 serves) has written files there, some fsynced and
/// some only acknowledged; another mount takes the slot over by replaying its log, and
/// fences the slot's clients (that client and the manager), who hand over what the dead
/// holder acknowledged and they do not know durable. Every file reads back from every
/// mount, the client's fsync succeeds, a second crash of the new holder loses nothing,
/// and fsck is clean. The client's fence by slot 1 leaves what it holds of the manager
/// alone.
#[test]
fn a_dead_slot_holders_slot_is_taken_over_and_its_clients_lose_nothing() {
    let t = two_region_fs();
    let fs = mount(&t);
    assert_eq!(fs.create_slot().unwrap(), 1);
    fs.give_free_regions(1, &[1]).unwrap();
    let (disks, faults) = with_faults(&t);
    let s1 = FileSystem::mount_slot(disks, 1).unwrap();
    s1.route_metadata_through(Box::new(tessera_fs::InProcessOwner(Arc::downgrade(&fs))));
    s1.take_from_owner_map().unwrap();
    let d = mkdir(&s1, ROOT_INO, b"node1");
    // The manager and the client each reach slot 1 through a way the fence moves.
    let routed = |mount: &FileSystem| {
        let way = Arc::new(SlotWay::default());
        *way.to.lock() = Arc::downgrade(&s1);
        let handle = Arc::clone(&way);
        mount.route_slots_through(Box::new(move |slot| {
            (slot == 1).then(|| {
                Box::new(SlotWayHandle(Arc::clone(&handle))) as Box<dyn tessera_fs::MetanodeChannel>
            })
        }));
        way
    };
    let manager_way = routed(&fs);
    let client = FileSystem::mount_client(
        t.reopen(),
        Box::new(tessera_fs::InProcessOwner(Arc::downgrade(&fs))),
    )
    .unwrap();
    let client_way = routed(&client);
    let synced = write_files(&client, d.ino, "s", 10);
    client.sync().unwrap();
    let unsynced = write_files(&client, d.ino, "u", 20);
    // And the client's own file in the manager's root, unsynced too.
    let mine = create_file(&client, ROOT_INO, b"in-root");
    client
        .write(mine.ino, 0, &pattern(9_000, 3), false)
        .unwrap();
    assert!(crash(s1, &faults));
    let (disks, faults) = with_faults(&t);
    let s1b = FileSystem::mount_slot(disks, 1).unwrap();
    s1b.route_metadata_through(Box::new(tessera_fs::InProcessOwner(Arc::downgrade(&fs))));
    let mut handed = 0;
    for (mount, way) in [(&client, &client_way), (&fs, &manager_way)] {
        *way.next.lock() = Some(Arc::downgrade(&s1b));
        let answer = mount.serve_metanode_request(&tessera_fs::Fence::request(1, 3, 1));
        handed += s1b.replay_fenced(&answer, None).unwrap();
        let settled = mount.serve_metanode_request(&tessera_fs::Fence::settled(1, true));
        tessera_fs::Fence::check(&settled).unwrap();
        // A mount that never reached slot 1 was not moved by the fence: its way, made on
        // first use, goes to the holder the table names by then.
        if let Some(next) = way.next.lock().take() {
            *way.to.lock() = next;
        }
    }
    assert!(
        handed > 0,
        "the client handed over what the dead holder acknowledged"
    );
    s1b.reclaim_orphans().unwrap();
    let mut all = synced;
    all.extend(unsynced);
    verify_in(&client, d.ino, &all);
    verify_in(&fs, d.ino, &all);
    verify_in(&s1b, d.ino, &all);
    client.sync().unwrap();
    // The manager was not fenced: the client's unsynced file in the root is intact and
    // its fsync goes to the manager as before.
    client.fsync(mine.ino).unwrap();
    assert!(fs.read(mine.ino, 0, 10_000).unwrap() == pattern(9_000, 3));
    // Everything is durable at the new holder: its crash loses nothing.
    crash(s1b, &faults);
    let s1c = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    verify_in(&s1c, d.ino, &all);
    client.unmount().unwrap();
    drop(client);
    unmount_both_and_check(&t, fs, s1c, "after a slot's takeover");
}

/// Mounts the manager and slot 1's owner, whose drives fail from write `k` on, runs
/// `work` on the slot's owner, kills it and unmounts the manager: whether the drives
/// failed, and what `work` returned.
fn slot_owner_cut_at_write(
    t: &TestDisks,
    k: i64,
    work: impl FnOnce(&FileSystem) -> tessera_fs::FsResult<()>,
) -> (bool, tessera_fs::FsResult<()>) {
    let fs = mount(t);
    let (disks, faults) = with_faults(t);
    let s1 = FileSystem::mount_slot(disks, 1).unwrap();
    let manager = Box::new(tessera_fs::InProcessOwner(Arc::downgrade(&fs)));
    connect_owners(&fs, &s1, manager);
    faults.writes_until_failure.store(k, Ordering::SeqCst);
    let result = work(&s1);
    let crashed = crash(s1, &faults);
    fs.unmount().unwrap();
    (crashed, result)
}

/// Problems fsck may find after a crash in the middle of an operation across owners: a
/// link count one too high (repaired by fsck), nothing else.
fn only_link_counts_too_high(t: &TestDisks, when: &str) {
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    for p in &report.problems {
        let counts: Vec<u32> = p.split(' ').filter_map(|w| w.parse().ok()).collect();
        assert!(
            p.contains("has link count") && counts.len() == 3 && counts[1] > counts[2],
            "{when}: {p}"
        );
    }
    if !report.is_clean() {
        let repaired = tessera_fs::fsck(t.reopen(), true).unwrap();
        assert!(repaired.repaired > 0, "{when}");
        assert_fsck_clean(t, &format!("{when}, after the repair"));
    }
}

#[test]
fn renames_across_owners_cut_by_a_crash_at_every_write_leave_no_name_of_a_freed_inode() {
    let t = two_region_fs();
    let (fs, s1) = two_owners(&t);
    let d = mkdir(&s1, ROOT_INO, b"node1").ino;
    let data = pattern(50_000, 5);
    let f = create_file(&s1, d, b"f").ino;
    s1.write(f, 0, &data, false).unwrap();
    s1.fsync(f).unwrap();
    s1.unmount().unwrap();
    fs.unmount().unwrap();
    drop((s1, fs));
    // Every rename crosses owners (those within one owner are durable only once synced).
    let places = [(d, &b"f"[..]), (ROOT_INO, &b"g"[..])];
    let mut at = 0;
    let mut crashes = 0;
    for k in 1..300i64 {
        let (crashed, result) = slot_owner_cut_at_write(&t, k, |s1| {
            for _ in 0..3 {
                let ((from, name), (to, new_name)) = (places[at], places[(at + 1) % 2]);
                s1.rename(from, name, to, new_name, false, false)?;
                at = (at + 1) % 2;
            }
            Ok(())
        });
        let when = format!("slot owner killed at write {k}");
        let (fs, s1) = two_owners_again(&t);
        // The file is where the last rename that returned put it, or (cut in the middle
        // of the next) also where that one was taking it; never gone, never another.
        let (next_dir, next_name) = places[(at + 1) % 2];
        let here = s1.lookup(places[at].0, places[at].1);
        let there = s1.lookup(next_dir, next_name);
        match (&here, &there) {
            (Ok(a), _) | (Err(FsError::NotFound), Ok(a)) => {
                assert_eq!(a.ino, f, "{when}");
                assert!(fs.read(f, 0, 60_000).unwrap() == data, "{when}");
            }
            _ => panic!("{when}: the file is at neither place: {here:?} {there:?}"),
        }
        if here.is_err() {
            at = (at + 1) % 2;
        } else if there.is_ok() {
            // Both names, each counted: the new one goes, as an unlink would take it.
            s1.remove(next_dir, next_name, false).unwrap();
        }
        let (other_dir, other_name) = places[(at + 1) % 2];
        assert!(gone(&fs, other_dir, other_name), "{when}: both names left");
        s1.unmount().unwrap();
        fs.unmount().unwrap();
        drop((s1, fs));
        only_link_counts_too_high(&t, &when);
        if !crashed {
            result.unwrap();
            break;
        }
        crashes += 1;
    }
    assert!(crashes > 5, "the renames crossed only {crashes} writes");
}

#[test]
fn directory_moves_across_owners_cut_by_a_crash_at_every_write_leave_one_tree() {
    let t = two_region_fs();
    let (fs, s1) = two_owners(&t);
    let d = mkdir(&s1, ROOT_INO, b"node1").ino;
    let x = mkdir(&s1, d, b"x").ino;
    let f = create_file(&s1, x, b"f").ino;
    s1.write(f, 0, b"inside x", false).unwrap();
    s1.sync().unwrap();
    s1.unmount().unwrap();
    fs.unmount().unwrap();
    drop((s1, fs));
    let places = [(d, &b"x"[..]), (ROOT_INO, &b"y"[..])];
    let mut crashes = 0;
    for k in 1..300i64 {
        let (crashed, result) = slot_owner_cut_at_write(&t, k, |s1| {
            let at = places
                .iter()
                .position(|(dir, name)| s1.lookup(*dir, name).is_ok())
                .unwrap();
            for i in 0..3 {
                let (from, to) = (places[(at + i) % 2], places[(at + i + 1) % 2]);
                s1.rename(from.0, from.1, to.0, to.1, false, false)?;
            }
            Ok(())
        });
        let when = format!("slot owner killed at write {k}");
        // What a cut move leaves: the directory's parent pointer naming the new parent
        // before the new name went in, or the directory named in both parents, link
        // counts one off; fsck sets the pointer to the one name, or keeps the name its
        // parent pointer names, and sets the counts.
        let report = tessera_fs::fsck(t.reopen(), false).unwrap();
        for p in &report.problems {
            assert!(
                p.contains("is named in two directories")
                    || p.contains("has a wrong parent pointer")
                    || p.contains("has link count"),
                "{when}: {p}"
            );
        }
        if !report.is_clean() {
            tessera_fs::fsck(t.reopen(), true).unwrap();
            assert_fsck_clean(&t, &format!("{when}, after the repair"));
        }
        let (fs, s1) = two_owners_again(&t);
        let named: Vec<_> = places
            .iter()
            .filter(|(dir, name)| fs.lookup(*dir, name).is_ok())
            .collect();
        assert_eq!(named.len(), 1, "{when}: named {named:?}");
        let (parent, name) = named[0];
        assert_eq!(s1.lookup(*parent, name).unwrap().ino, x, "{when}");
        assert_eq!(s1.lookup(x, b"..").unwrap().ino, *parent, "{when}");
        assert_eq!(&fs.read(f, 0, 20).unwrap()[..], b"inside x", "{when}");
        unmount_both_and_check(&t, fs, s1, &when);
        if !crashed {
            result.unwrap();
            break;
        }
        crashes += 1;
    }
    assert!(crashes > 5, "the moves crossed only {crashes} writes");
}

/// Threads of one mount renaming directories (each takes the cluster's rename lock) give
/// the lock back every time: a grant that reached the mount's mirror of its locks while
/// another thread's give-back was still leaving it was refused there, and its own
/// give-back was then never sent (every later rename waited 120 s for it and failed).
#[test]
fn directory_renames_from_threads_of_one_mount_give_the_rename_lock_back() {
    use tessera_fs::locks::LockClass;
    let t = two_region_fs();
    // Answers come back after 0-3 ms, as over a network, so that one thread's grant can
    // arrive before another's give-back answered.
    let (fs, s1) = two_owners_through(&t, |fs| {
        Box::new(SlowAnswers {
            owner: tessera_fs::InProcessOwner(Arc::downgrade(fs)),
            calls: std::sync::atomic::AtomicU64::new(0),
        })
    });
    for i in 0..4 {
        mkdir(&s1, ROOT_INO, format!("a{i}").as_bytes());
    }
    let want = whole_write(fs.lock_holder(1, LockClass::Rename));
    // Rounds in which the threads stop one after the other, each while others still
    // rename: a give-back lost at a thread's last rename stays lost.
    for round in 0..6 {
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let s1 = Arc::clone(&s1);
                std::thread::spawn(move || {
                    let (a, b) = (format!("a{i}"), format!("b{i}"));
                    for _ in 0..6 + 4 * i {
                        s1.rename(ROOT_INO, a.as_bytes(), ROOT_INO, b.as_bytes(), false, false)
                            .unwrap();
                        s1.rename(ROOT_INO, b.as_bytes(), ROOT_INO, a.as_bytes(), false, false)
                            .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(fs.lock_test(ROOT_INO, want).unwrap(), None, "round {round}");
    }
    unmount_both_and_check(&t, fs, s1, "after the renames");
}

/// A directory rename whose lock messages to the manager are lost (a request that never
/// arrives, or a grant or give-back whose answer never comes back) still leaves the
/// cluster's rename lock free: the lock's holder is alive, so no expel would ever free a
/// lost give-back, and every other node's directory renames would wait 120 s for it and
/// fail with EIO.
#[test]
fn a_directory_rename_whose_lock_messages_are_lost_gives_the_rename_lock_back() {
    use tessera_fs::locks::LockClass;
    let t = two_region_fs();
    let (fs, s1) = two_owners_losing_locks(&t);
    mkdir(&s1, ROOT_INO, b"a");
    let want = whole_write(fs.lock_holder(1, LockClass::Rename));
    let (mut done, mut failed) = (0, 0);
    let mut at = "a";
    for round in 0..40 {
        let to = if at == "a" { "b" } else { "a" };
        match s1.rename(
            ROOT_INO,
            at.as_bytes(),
            ROOT_INO,
            to.as_bytes(),
            false,
            false,
        ) {
            Ok(()) => {
                done += 1;
                at = to;
            }
            // Only a lost take fails the rename; its grant, if it was made, goes back too.
            Err(e) => {
                failed += 1;
                assert!(
                    e.to_string().contains("lost on the way"),
                    "round {round}: {e}"
                );
            }
        }
        assert_eq!(
            fs.lock_test(ROOT_INO, want).unwrap(),
            None,
            "round {round}: the rename lock stayed taken"
        );
    }
    eprintln!("{done} renames done, {failed} failed");
    assert!(
        done >= 10 && failed >= 4,
        "{done} renames done, {failed} failed"
    );
    assert_eq!(
        s1.lookup(ROOT_INO, at.as_bytes()).unwrap().kind,
        FileKind::Directory
    );
    unmount_both_and_check(&t, fs, s1, "after the renames");
}

/// `fcntl` and append locks whose give-back to the file's owner is lost (never arriving,
/// or done there with the answer lost) are still given back: the holder is alive, so no
/// expel would free them, and every other node's lock of the file (an O_APPEND write, an
/// F_SETLKW) would wait for them in vain.
#[test]
fn file_locks_whose_give_back_is_lost_are_given_back() {
    use tessera_fs::locks::LockClass;
    let t = two_region_fs();
    let (fs, s1) = two_owners_losing_locks(&t);
    // The manager's file, whose locks its table keeps; slot 1's owner reaches it through
    // the losing channel.
    let f = create_file(&fs, ROOT_INO, b"f").ino;
    let other = whole_write(fs.lock_holder(1, LockClass::Posix));
    let mut lost_takes = 0;
    for round in 0..30u64 {
        let mine = s1.lock_holder(round, LockClass::Posix);
        // A lost take fails the call (perhaps granted all the same): the process asks again.
        while let Err(e) = s1.lock_set(f, whole_write(mine), None) {
            assert!(
                e.to_string().contains("lost on the way"),
                "round {round}: {e}"
            );
            lost_takes += 1;
        }
        assert!(fs.lock_test(f, other).unwrap().is_some(), "round {round}");
        s1.unlock_all(f, mine).unwrap();
        assert_eq!(
            fs.lock_test(f, other).unwrap(),
            None,
            "round {round}: the lock stayed taken after its close"
        );
    }
    assert!(lost_takes >= 3, "only {lost_takes} takes were lost");
    // Appends from slot 1's owner take and give back the append lock each time, also
    // when the take's answer was lost (the append fails and the application writes again).
    let append = whole_write(fs.lock_holder(1, LockClass::Append));
    let mut lost_appends = 0;
    for i in 0..20u8 {
        while let Err(e) = s1.append(f, &[i], false) {
            assert!(e.to_string().contains("lost on the way"), "append {i}: {e}");
            lost_appends += 1;
            assert_eq!(
                fs.lock_test(f, append).unwrap(),
                None,
                "append {i} failed, locked"
            );
        }
        assert_eq!(
            fs.lock_test(f, append).unwrap(),
            None,
            "append {i} left it locked"
        );
    }
    assert!(
        lost_appends >= 2,
        "only {lost_appends} appends lost their lock"
    );
    assert_eq!(
        &fs.read(f, 0, 100).unwrap()[..],
        &(0..20u8).collect::<Vec<_>>()[..]
    );
    unmount_both_and_check(&t, fs, s1, "after the locks");
}

/// A rename that found a file under its name, and so took no rename lock, where another
/// node put a directory under that name before the owner moved it: the owner moves no
/// directory for a rename without the lock, and the rename moves it under the lock (a
/// directory moved without it can race another node's move across owners and be left
/// named twice).
#[test]
fn a_directory_put_under_a_name_a_rename_found_a_file_under_moves_under_the_rename_lock() {
    let t = two_region_fs();
    let seen: Arc<std::sync::Mutex<Vec<&'static str>>> = Arc::default();
    let sent = Arc::clone(&seen);
    let (fs, s1) = two_owners_through(&t, move |fs| {
        Box::new(SwapsBeforeMove {
            owner: tessera_fs::InProcessOwner(Arc::downgrade(fs)),
            seen: sent,
            swapped: std::sync::atomic::AtomicBool::new(false),
        })
    });
    create_file(&s1, ROOT_INO, b"f");
    let d = mkdir(&fs, ROOT_INO, b"d").ino;
    seen.lock().unwrap().clear();
    s1.rename(ROOT_INO, b"f", ROOT_INO, b"g", false, false)
        .unwrap();
    assert_eq!(s1.lookup(ROOT_INO, b"g").unwrap().ino, d);
    assert!(matches!(fs.lookup(ROOT_INO, b"f"), Err(FsError::NotFound)));
    let seen = seen.lock().unwrap().clone();
    let at = |kind: &str| seen.iter().position(|k| *k == kind);
    let moves: Vec<usize> = (0..seen.len()).filter(|&i| seen[i] == "MoveName").collect();
    assert_eq!(moves.len(), 2, "{seen:?}");
    let lock = at("Lock").unwrap_or_else(|| panic!("no rename lock taken: {seen:?}"));
    assert!(moves[0] < lock && lock < moves[1], "{seen:?}");
    unmount_both_and_check(&t, fs, s1, "after the rename");
}

/// A way to the manager in this process that, before the first `MoveName` it carries,
/// has the manager remove file `f` of the root and rename directory `d` to `f` (another
/// node acting between a rename's look and its move); it notes the kind of every request.
struct SwapsBeforeMove {
    owner: tessera_fs::InProcessOwner,
    seen: Arc<std::sync::Mutex<Vec<&'static str>>>,
    swapped: std::sync::atomic::AtomicBool,
}

impl tessera_fs::MetanodeChannel for SwapsBeforeMove {
    fn call(&self, request: Vec<u8>) -> tessera_fs::FsResult<Vec<u8>> {
        let kind = tessera_fs::request_kind(&request).unwrap_or("?");
        self.seen.lock().unwrap().push(kind);
        if kind == "MoveName" && !self.swapped.swap(true, Ordering::SeqCst) {
            let manager = self.owner.0.upgrade().expect("the manager is mounted");
            manager.remove(ROOT_INO, b"f", false).unwrap();
            manager
                .rename(ROOT_INO, b"d", ROOT_INO, b"f", false, false)
                .unwrap();
        }
        self.owner.call(request)
    }
}

/// [`two_owners`] with slot 1's owner reaching the manager through [`LosingLocks`].
fn two_owners_losing_locks(t: &TestDisks) -> (Arc<FileSystem>, Arc<FileSystem>) {
    two_owners_through(t, |fs| {
        Box::new(LosingLocks {
            owner: tessera_fs::InProcessOwner(Arc::downgrade(fs)),
            locks: std::sync::atomic::AtomicU64::new(0),
        })
    })
}

/// A write lock of the whole file held by `holder`.
fn whole_write(holder: tessera_fs::locks::Holder) -> tessera_fs::locks::Lock {
    tessera_fs::locks::Lock {
        holder,
        start: 0,
        end: tessera_fs::locks::TO_END,
        kind: tessera_fs::locks::LockKind::Write,
        pid: 0,
    }
}

/// A way to the manager in this process that loses about one lock request in three (by a
/// hash of its count), half of them before they reach the manager, half after they were
/// done there (the answer lost). Other requests pass.
struct LosingLocks {
    owner: tessera_fs::InProcessOwner,
    locks: std::sync::atomic::AtomicU64,
}

impl tessera_fs::MetanodeChannel for LosingLocks {
    fn call(&self, request: Vec<u8>) -> tessera_fs::FsResult<Vec<u8>> {
        if tessera_fs::request_kind(&request) != Some("Lock") {
            return self.owner.call(request);
        }
        let n = self
            .locks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let lost = || {
            Err(tessera_fs::FsError::Io(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "lost on the way (test channel)",
            )))
        };
        let hash = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56;
        match (hash % 3, hash / 3 % 2) {
            (0, 0) => lost(),
            (0, _) => {
                let _ = self.owner.call(request);
                lost()
            }
            _ => self.owner.call(request),
        }
    }
}

/// A way to the manager in this process whose answers take 0-3 ms (by a hash of the
/// call's number).
struct SlowAnswers {
    owner: tessera_fs::InProcessOwner,
    calls: std::sync::atomic::AtomicU64,
}

impl tessera_fs::MetanodeChannel for SlowAnswers {
    fn call(&self, request: Vec<u8>) -> tessera_fs::FsResult<Vec<u8>> {
        let n = self
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let answer = self.owner.call(request);
        let micros = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40 & 0xfff;
        std::thread::sleep(std::time::Duration::from_micros(micros.min(3000)));
        answer
    }
}

#[test]
fn statfs_counts_the_inodes_and_free_space_of_every_owner() {
    let t = two_region_fs();
    let (fs, s1) = two_owners(&t);
    let used = |s: &tessera_fs::StatFs| s.inodes_total - s.inodes_free;
    let before = fs.statfs();
    let d = mkdir(&s1, ROOT_INO, b"node1").ino;
    write_files(&s1, d, "b", 100);
    write_files(&fs, ROOT_INO, "a", 110);
    let (a, b) = (fs.statfs(), s1.statfs());
    // Slot 1's directory and files are counted beside the manager's, seen alike from both.
    assert_eq!(used(&a), used(&before) + 9);
    assert_eq!((used(&a), a.fragments_free), (used(&b), b.fragments_free));
    // Both owners' writes took space; 2 x 379,100 bytes in 4 KiB sub-blocks at least.
    assert!(before.fragments_free - a.fragments_free >= 2 * 379_100 / 4096);
    // The manager's df asks the slot for its regions' free space and its inodes.
    let df = fs.df().unwrap();
    assert!(df.unanswered_slots.is_empty());
    assert_eq!(df.inodes.used, used(&a));
    let free: u64 = df
        .disks
        .iter()
        .map(|d| d.free_full_block_bytes + d.free_fragment_bytes)
        .sum();
    assert_eq!(free / a.fragment_bytes, a.fragments_free);
    // Only the manager answers for every region and shard.
    let err = s1.df().unwrap_err();
    assert!(err.to_string().contains("run it on that node"), "{err}");
    unmount_both_and_check(&t, fs, s1, "after statfs");
}

/// A slot owner and the manager over one disk of `bytes` (64 KiB blocks: allocation
/// regions of 127 MiB), the slot given region `region` and a directory of its own;
/// each reaches the other as two nodes would.
fn a_slot_in_region(
    bytes: u64,
    region: usize,
) -> (TestDisks, Arc<FileSystem>, Arc<FileSystem>, Ino) {
    a_slot_on(region_disks(1, bytes), region)
}

/// [`a_slot_in_region`] on the formatted disks `t`.
fn a_slot_on(t: TestDisks, region: usize) -> (TestDisks, Arc<FileSystem>, Arc<FileSystem>, Ino) {
    let fs = mount(&t);
    assert_eq!(fs.create_slot().unwrap(), 1);
    fs.give_free_regions(1, &[region]).unwrap();
    let d = fs
        .make_directory_for_slot(ROOT_INO, b"node1", 0o755, ROOT, 1)
        .unwrap();
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    connect_owners(
        &fs,
        &s1,
        Box::new(tessera_fs::InProcessOwner(Arc::downgrade(&fs))),
    );
    (t, fs, s1, d.ino)
}

/// Slot 1's owner `s1` synced, killed and mounted again beside the manager `fs`.
fn killed_and_mounted_again(
    t: &TestDisks,
    fs: &Arc<FileSystem>,
    s1: Arc<FileSystem>,
) -> Arc<FileSystem> {
    s1.sync().unwrap();
    s1.fence();
    drop(s1);
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    connect_owners(
        fs,
        &s1,
        Box::new(tessera_fs::InProcessOwner(Arc::downgrade(fs))),
    );
    s1
}

/// Files of 1 MiB named `{prefix}{i}` in `dir`, `count` of them, written through `fs`
/// until the first error; name -> content of those written.
fn write_mib_files(
    fs: &FileSystem,
    dir: Ino,
    prefix: &str,
    count: usize,
) -> (BTreeMap<String, Vec<u8>>, Option<FsError>) {
    let mut files = BTreeMap::new();
    for i in 0..count {
        let name = format!("{prefix}{i}");
        let data = pattern(1 << 20, 700 + i as u64);
        let a = create_file(fs, dir, name.as_bytes());
        if let Err(e) = fs.write(a.ino, 0, &data, false) {
            return (files, Some(e));
        }
        files.insert(name, data);
    }
    (files, None)
}

/// A slot's owner that filled its regions asks the manager for another and goes on: a
/// node writing more than its region holds is not refused while the file system has a
/// free region (GPFS's nodes ask the allocation manager the same way). The region given
/// is stored by the slot from its next checkpoint; a crash before that brings it back
/// from the owner map and the slot's log.
#[test]
fn a_slot_owner_whose_regions_are_full_is_given_another() {
    // Region 0 (the manager's) and 1 of 127 MiB, region 2 a sliver of about 8 MiB, which
    // the slot is given first.
    let (t, fs, s1, dir) = a_slot_in_region((2 * 127 + 8) << 20, 2);
    let (files, failed) = write_mib_files(&s1, dir, "f", 24);
    assert!(failed.is_none(), "{failed:?}");
    assert_eq!(
        fs.descriptor().slots.unwrap().region_owners,
        vec![0, 1, 1],
        "region 1 given to slot 1"
    );
    let regions: std::collections::BTreeSet<u64> = files
        .keys()
        .flat_map(|name| {
            let ino = s1.lookup(dir, name.as_bytes()).unwrap().ino;
            s1.file_block_addresses(ino).unwrap()
        })
        .map(|(_, sub_block)| sub_block / 32_512)
        .collect();
    assert_eq!(
        regions,
        [1, 2].into(),
        "the slot's files lie in its regions"
    );
    verify_in(&fs, dir, &files);
    // Killed before any checkpoint stored the new region: the owner map gives it, the log
    // says what is allocated in it.
    let s1 = killed_and_mounted_again(&t, &fs, s1);
    verify_in(&s1, dir, &files);
    let (more, failed) = write_mib_files(&s1, dir, "g", 4);
    assert!(failed.is_none(), "{failed:?}");
    unmount_both_and_check(&t, fs, s1, "after a region was given to a full slot");
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    verify_in(&s1, dir, &files);
    verify_in(&s1, dir, &more);
    s1.unmount().unwrap();
}

/// With scattered placement (the default), the manager's files fill the map from the
/// bottom, so the regions above stay wholly free and a full slot is given one: files
/// started anywhere on the disk had left no region free after a few dozen, and a node
/// writing more than its first region in its own directory got ENOSPC on a disk mostly
/// free.
#[test]
fn a_full_slot_is_given_a_region_after_the_manager_scattered_files() {
    // Regions 0 to 3 of 127 MiB and a sliver; the slot is given region 3.
    let t = make_disks(1, (4 * 127 + 8) << 20);
    format_fs(
        &t,
        &tessera_fs::FormatOptions {
            block_size: 64 << 10,
            log_bytes: 4 << 20,
            placement: tessera_fs::Placement::Scatter,
            ..small_opts()
        },
    );
    let (t, fs, s1, dir) = a_slot_on(t, 3);
    let (mine, failed) = write_mib_files(&fs, ROOT_INO, "m", 40);
    assert!(failed.is_none(), "{failed:?}");
    let (files, failed) = write_mib_files(&s1, dir, "f", 160);
    assert!(
        failed.is_none(),
        "{failed:?} after {} files of the slot",
        files.len()
    );
    let owners = fs.descriptor().slots.unwrap().region_owners;
    assert_eq!(
        owners.iter().filter(|s| **s == 1).count(),
        2,
        "a second region given to slot 1: {owners:?}"
    );
    verify_in(&fs, ROOT_INO, &mine);
    verify_in(&fs, dir, &files);
    unmount_both_and_check(&t, fs, s1, "after a region given past scattered files");
}

/// With no wholly free region left to give (the manager keeps its own), a full slot's
/// writer gets ENOSPC, and what was written before stays.
#[test]
fn a_full_slot_gets_enospc_when_the_manager_has_no_region_to_give() {
    let (t, fs, s1, dir) = a_slot_in_region((127 + 8) << 20, 1);
    let (files, failed) = write_mib_files(&s1, dir, "f", 24);
    assert!(
        matches!(failed, Some(FsError::NoSpace { .. })),
        "{failed:?}"
    );
    assert!(files.len() >= 4, "{} files before ENOSPC", files.len());
    assert_eq!(fs.descriptor().slots.unwrap().region_owners, vec![0, 1]);
    verify_in(&fs, dir, &files);
    // The manager still writes in its own region.
    write_files(&fs, ROOT_INO, "m", 120);
    unmount_both_and_check(&t, fs, s1, "after a full slot's ENOSPC");
}

/// A node is not given a slot whose only region would be the sliver at the end of the
/// disks (it would get ENOSPC after a few megabytes): it mounts as the manager's client.
#[test]
fn no_slot_is_made_on_a_sliver_of_a_region() {
    let t = region_disks(1, (127 + 8) << 20);
    let fs = mount(&t);
    let channel = tessera_fs::InProcessOwner(Arc::downgrade(&fs));
    let err = tessera_fs::ask_for_slot(&channel).unwrap_err().to_string();
    assert!(err.contains("less than a quarter of a region"), "{err}");
    assert!(fs.slots().unwrap().is_empty());
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after a refused slot");
}

/// A region a slot emptied goes back to the manager when the manager's own are full: the
/// slot, which wrote more than its first region holds and then deleted it all, keeps one
/// region and gives the other back (committed by its record first), and the manager
/// writes there, so a file system whose writers moved on is not full of regions nobody
/// uses. Both mount again from what they committed; fsck is clean.
#[test]
fn a_region_a_slot_emptied_goes_back_to_the_manager_when_its_own_are_full() {
    // Region 0 (the manager's) and 1 of 127 MiB, region 2 a sliver of about 8 MiB, which
    // the slot is given first; it is given region 1 when the sliver is full.
    let (t, fs, s1, dir) = a_slot_in_region((2 * 127 + 8) << 20, 2);
    let (files, failed) = write_mib_files(&s1, dir, "f", 24);
    assert!(failed.is_none(), "{failed:?}");
    let owners = || fs.descriptor().slots.unwrap().region_owners;
    assert_eq!(owners(), vec![0, 1, 1], "region 1 given to slot 1");
    for name in files.keys() {
        s1.remove(dir, name.as_bytes(), false).unwrap();
    }
    s1.sync().unwrap();
    // More than region 0 holds, less than regions 0 and 1 together.
    let (mine, failed) = write_mib_files(&fs, ROOT_INO, "m", 160);
    assert!(failed.is_none(), "{failed:?} after {} files", mine.len());
    assert_eq!(owners(), vec![0, 0, 1], "region 1 came back to the manager");
    let in_region_1 = mine.keys().any(|name| {
        let ino = fs.lookup(ROOT_INO, name.as_bytes()).unwrap().ino;
        blocks_in_region(&fs, ino, 1)
    });
    assert!(in_region_1, "the manager writes in the region it took back");
    // The slot goes on in the region it kept, and sees the manager's files.
    let (more, failed) = write_mib_files(&s1, dir, "g", 2);
    assert!(failed.is_none(), "{failed:?}");
    verify_in(&s1, ROOT_INO, &mine);
    // Killed: the slot comes back from its record, which no longer stores region 1.
    let s1 = killed_and_mounted_again(&t, &fs, s1);
    verify_in(&s1, dir, &more);
    unmount_both_and_check(&t, fs, s1, "after a region went back to the manager");
    let fs = mount(&t);
    verify_in(&fs, ROOT_INO, &mine);
    fs.unmount().unwrap();
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    verify_in(&s1, dir, &more);
    s1.unmount().unwrap();
}

/// A slot that gave a region back to a manager that died before taking it (the owner map
/// still gives the region to the slot; the slot's record names it given back) keeps it out
/// of its allocation when it mounts again, and the manager completes the move when it next
/// needs a region: here for the same slot, which filled the region it kept.
#[test]
fn a_region_given_back_but_never_taken_is_taken_by_the_next_manager_that_needs_one() {
    let (t, fs, s1, dir) = a_slot_in_region((2 * 127 + 8) << 20, 2);
    let (files, failed) = write_mib_files(&s1, dir, "f", 24);
    assert!(failed.is_none(), "{failed:?}");
    for name in files.keys() {
        s1.remove(dir, name.as_bytes(), false).unwrap();
    }
    s1.sync().unwrap();
    assert_eq!(s1.give_region_back().unwrap(), 1);
    let err = s1.give_region_back().unwrap_err();
    assert!(
        matches!(err, FsError::NoSpace { .. }),
        "the slot keeps its last region: {err}"
    );
    let owners = || fs.descriptor().slots.unwrap().region_owners;
    assert_eq!(owners(), vec![0, 1, 1]);
    s1.fence();
    drop(s1);
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    connect_owners(
        &fs,
        &s1,
        Box::new(tessera_fs::InProcessOwner(Arc::downgrade(&fs))),
    );
    let seen = || s1.descriptor().slots.unwrap().region_owners;
    assert_eq!(
        seen(),
        vec![0, 0, 1],
        "the slot's view leaves out what it gave back"
    );
    // The region it kept is the sliver: it fills, the slot asks, and the manager takes the
    // region given back and gives it to the slot again.
    let (again, failed) = write_mib_files(&s1, dir, "g", 24);
    assert!(failed.is_none(), "{failed:?}");
    assert_eq!(owners(), vec![0, 1, 1]);
    assert_eq!(seen(), vec![0, 1, 1]);
    let in_region_1 = again.keys().any(|name| {
        let ino = s1.lookup(dir, name.as_bytes()).unwrap().ino;
        blocks_in_region(&s1, ino, 1)
    });
    assert!(
        in_region_1,
        "the slot writes in the region given to it again"
    );
    unmount_both_and_check(&t, fs, s1, "after a region given back was taken late");
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    verify_in(&s1, dir, &again);
    s1.unmount().unwrap();
}

/// A full slot is given a region another slot does not use when the manager has none
/// wholly free: the manager takes it back from that slot first (which keeps one), then
/// gives it on.
#[test]
fn a_full_slot_is_given_a_region_another_slot_gave_back() {
    // Regions 0, 1 and 2 of 127 MiB, region 3 a sliver of about 8 MiB.
    let t = region_disks(1, (3 * 127 + 8) << 20);
    let fs = mount(&t);
    assert_eq!(fs.create_slot().unwrap(), 1);
    assert_eq!(fs.create_slot().unwrap(), 2);
    fs.give_free_regions(1, &[3]).unwrap();
    fs.give_free_regions(2, &[1, 2]).unwrap();
    let dir = fs
        .make_directory_for_slot(ROOT_INO, b"node1", 0o755, ROOT, 1)
        .unwrap()
        .ino;
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    let s2 = FileSystem::mount_slot(t.reopen(), 2).unwrap();
    for s in [&s1, &s2] {
        s.route_metadata_through(Box::new(tessera_fs::InProcessOwner(Arc::downgrade(&fs))));
        s.take_from_owner_map().unwrap();
    }
    let (w1, w2) = (Arc::downgrade(&s1), Arc::downgrade(&s2));
    fs.route_slots_through(Box::new(move |slot| {
        let to = match slot {
            1 => w1.clone(),
            2 => w2.clone(),
            _ => return None,
        };
        Some(Box::new(tessera_fs::InProcessOwner(to)) as Box<dyn tessera_fs::MetanodeChannel>)
    }));
    let (files, failed) = write_mib_files(&s1, dir, "f", 24);
    assert!(failed.is_none(), "{failed:?}");
    assert_eq!(
        fs.descriptor().slots.unwrap().region_owners,
        vec![0, 2, 1, 1],
        "slot 2 gave region 2 back, and the manager gave it to slot 1"
    );
    verify_in(&fs, dir, &files);
    s2.unmount().unwrap();
    unmount_both_and_check(&t, fs, s1, "after a region moved from one slot to another");
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    verify_in(&s1, dir, &files);
    s1.unmount().unwrap();
}

/// Slot 1 beside the manager on regions 1 and 2 (of 0, 1 of 127 MiB and a sliver 2), both
/// empty again after the slot filled and emptied them; both unmounted. The slot's
/// directory.
fn a_slot_with_two_empty_regions() -> (TestDisks, Ino) {
    let (t, fs, s1, dir) = a_slot_in_region((2 * 127 + 8) << 20, 2);
    let (files, failed) = write_mib_files(&s1, dir, "f", 24);
    assert!(failed.is_none(), "{failed:?}");
    for name in files.keys() {
        s1.remove(dir, name.as_bytes(), false).unwrap();
    }
    s1.unmount().unwrap();
    fs.unmount().unwrap();
    (t, dir)
}

fn region_owners(fs: &FileSystem) -> Vec<u32> {
    fs.descriptor().slots.unwrap().region_owners
}

/// Which of the slot's regions 1 and 2 the owner map `owners` gives back to slot 0: `None`
/// when both are still the slot's. Never both.
fn moved_back(owners: &[u32]) -> Option<usize> {
    assert_eq!(owners.len(), 3, "{owners:?}");
    assert_eq!(owners[0], 0, "{owners:?}");
    match (owners[1], owners[2]) {
        (1, 1) => None,
        (0, 1) => Some(1),
        (1, 0) => Some(2),
        _ => panic!("the slot keeps one region: {owners:?}"),
    }
}

/// The slot's owner killed at every write of giving a region back: after each crash the
/// region is the slot's (its record was not written) or given back (the record names it),
/// never both owners'; the manager completes a move given back, and the file system checks
/// clean.
#[test]
fn a_region_given_back_cut_by_a_crash_of_the_slot_at_every_write_is_in_one_owner() {
    let (t, _dir) = a_slot_with_two_empty_regions();
    for k in 1.. {
        assert!(k < 200, "giving a region back never finished");
        let (crashed, result) =
            slot_owner_cut_at_write(&t, k, |s1| s1.give_region_back().map(|_| ()));
        let (fs, s1) = two_owners_again(&t);
        let given_back = moved_back(&region_owners(&s1));
        assert_eq!(
            moved_back(&region_owners(&fs)),
            None,
            "write {k}: not moved yet"
        );
        if given_back.is_none() {
            assert!(
                crashed && result.is_err(),
                "write {k}: {result:?} and not given back"
            );
        }
        // The manager takes a region: the one given back, or one the slot gives now.
        let taken = fs.take_region_back(None).unwrap();
        assert!(taken.is_some(), "write {k}");
        if given_back.is_some() {
            assert_eq!(
                taken, given_back,
                "write {k}: the move given back is completed"
            );
        }
        assert_eq!(moved_back(&region_owners(&fs)), taken, "write {k}");
        assert_eq!(region_owners(&s1), region_owners(&fs), "write {k}");
        unmount_both_and_check(&t, fs, s1, &format!("crash at write {k} of a give-back"));
        if given_back.is_some() || !crashed {
            eprintln!("giving a region back: {} crashes left it the slot's", k - 1);
            assert!(k > 1, "no crash left it the slot's");
            break;
        }
        // Back as it was for the next round: the region goes to the slot again.
        let fs = mount(&t);
        fs.give_free_regions(1, &[taken.unwrap()]).unwrap();
        fs.unmount().unwrap();
    }
}

/// The manager killed at every write of taking a region back: after each crash the owner
/// map gives it to the slot, whose record names it given back (and the next manager
/// completes the move without asking), or to the manager; the slot never allocates there
/// again in either case, and the file system checks clean.
#[test]
fn a_region_taken_back_cut_by_a_crash_of_the_manager_at_every_write_is_in_one_owner() {
    let (t, dir) = a_slot_with_two_empty_regions();
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    let mut given_back = None;
    for k in 1.. {
        assert!(k < 200, "taking a region back never finished");
        let (fs, faults) = manager_failing_at_write(&t, &s1, k);
        let result = fs.take_region_back(None);
        let crashed = crash(fs, &faults);
        let fs = mount(&t);
        let seen = moved_back(&region_owners(&s1));
        assert!(seen.is_some(), "write {k}: the slot gave one back");
        assert!(
            given_back.is_none() || given_back == seen,
            "write {k}: asked once"
        );
        given_back = seen;
        let moved = moved_back(&region_owners(&fs));
        if moved.is_none() {
            assert!(
                crashed && result.is_err(),
                "write {k}: {result:?} and not moved"
            );
        } else {
            assert_eq!(moved, given_back, "write {k}");
        }
        // The slot goes on in the region it kept.
        let (files, failed) = write_mib_files(&s1, dir, &format!("k{k}-"), 1);
        assert!(failed.is_none(), "write {k}: {failed:?}");
        verify_in(&s1, dir, &files);
        fs.unmount().unwrap();
        drop(fs);
        if moved.is_some() || !crashed {
            eprintln!("taking a region back: {} crashes left it given back", k - 1);
            assert!(k > 1, "no crash left it given back only");
            break;
        }
    }
    // Its way to the manager is the first one's, which is gone: killed, and mounted again
    // beside the last manager.
    s1.fence();
    drop(s1);
    let (fs, s1) = two_owners_again(&t);
    assert_eq!(region_owners(&s1), region_owners(&fs));
    unmount_both_and_check(&t, fs, s1, "after a region was taken back through crashes");
}

/// The manager mounted on `t` beside slot 1's owner `s1`, connected to it, its writes
/// failing from the `k`th on (a crash there).
fn manager_failing_at_write(
    t: &TestDisks,
    s1: &Arc<FileSystem>,
    k: i64,
) -> (Arc<FileSystem>, Arc<tessera_testkit::Faults>) {
    let (disks, faults) = with_faults(t);
    let fs = FileSystem::mount(disks).unwrap();
    connect_owners(
        &fs,
        s1,
        Box::new(tessera_fs::InProcessOwner(Arc::downgrade(&fs))),
    );
    faults.writes_until_failure.store(k, Ordering::SeqCst);
    (fs, faults)
}

/// [`manager_with_a_slot_directory`] with slot 1's owner mounted beside it and the two
/// connected.
fn manager_and_slot_owner(t: &TestDisks) -> (Arc<FileSystem>, Arc<FileSystem>, Ino) {
    let (fs, dir) = manager_with_a_slot_directory(t);
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    connect_owners(
        &fs,
        &s1,
        Box::new(tessera_fs::InProcessOwner(Arc::downgrade(&fs))),
    );
    (fs, s1, dir)
}

/// Three drives of 160 MiB, the file system (allocation regions as [`two_region_fs`]) made
/// on the first two; the third is for `disk add`.
fn two_region_fs_and_a_spare() -> TestDisks {
    let t = make_disks(3, 160 << 20);
    let specs = t.disks[..2]
        .iter()
        .enumerate()
        .map(|(i, (id, dev))| tessera_fs::DiskSpec {
            nsd_name: format!("nsd{i}"),
            nsd_id: *id,
            usage: tessera_nsd::DiskUsage::DataAndMetadata,
            failure_group: i as i32 + 1,
            pool: "system".into(),
            device: dev.clone(),
        })
        .collect();
    let opts = tessera_fs::FormatOptions {
        block_size: 64 << 10,
        log_bytes: 4 << 20,
        placement: tessera_fs::Placement::Cluster,
        ..small_opts()
    };
    tessera_fs::format(specs, &opts, &mut |_| {}).unwrap();
    t
}

/// Adds the spare drive of [`two_region_fs_and_a_spare`] through the manager `fs`.
fn add_the_spare(t: &TestDisks, fs: &FileSystem) {
    let (id, dev) = t.disks[2].clone();
    let added = fs
        .add_disks(vec![tessera_fs::DiskSpec {
            nsd_name: "nsd2".into(),
            nsd_id: id,
            usage: tessera_nsd::DiskUsage::DataAndMetadata,
            failure_group: 3,
            pool: "system".into(),
            device: dev,
        }])
        .unwrap();
    assert_eq!(added, vec![2]);
}

/// Opens added disks from `t`'s drives by NSD id, as the daemon opens them by NSD name.
fn opener(t: &TestDisks) -> tessera_fs::DiskOpener {
    let drives = t.reopen();
    Box::new(move |d| {
        drives
            .iter()
            .find(|(id, _)| *id == d.nsd_id)
            .map(|(_, dev)| Arc::clone(dev))
            .ok_or_else(|| FsError::Invalid(format!("no drive for {}", d.nsd_name)))
    })
}

/// Files of 1 MiB written through slot 1's owner `s1` in `dir`, four at a time, until one
/// has a block on disk `disk` (every block in the slot's region 1); name -> content.
fn files_until_one_is_on(s1: &FileSystem, dir: Ino, disk: u16) -> BTreeMap<String, Vec<u8>> {
    let mut written = BTreeMap::new();
    for round in 0..40u64 {
        let (files, failed) = write_mib_files(s1, dir, &format!("r{round}-"), 4);
        assert!(failed.is_none(), "{failed:?}");
        let mut on_disk = false;
        for name in files.keys() {
            let ino = s1.lookup(dir, name.as_bytes()).unwrap().ino;
            on_disk |= has_blocks_on(s1, ino, disk);
            assert!(blocks_in_region(s1, ino, 1), "{name} outside region 1");
        }
        written.extend(files);
        if on_disk {
            return written;
        }
    }
    panic!("the slot never allocated on disk {disk}");
}

/// Whether some block of `ino` (on the mount that serves it) lies on disk `disk`.
fn has_blocks_on(fs: &FileSystem, ino: Ino, disk: u16) -> bool {
    fs.file_block_addresses(ino)
        .unwrap()
        .iter()
        .any(|(d, _)| *d == disk)
}

/// `disk add` on a file system whose manager gave an allocation region to a live slot
/// owner (refused before: the slots' regions reach onto every disk): the slot learns the
/// disk when told, allocates its region's part of it, stores those chunks itself and
/// says so in its record, so a remount reads them; the manager holds them and a remount
/// of its own leaves them held; a client mount that never heard of the disk reads a file
/// on it (it learns the disk at the first block address on it); fsck is clean.
#[test]
fn a_disk_added_beside_a_live_slot_owner_is_used_by_both_owners() {
    let t = two_region_fs_and_a_spare();
    let (fs, s1, dir) = manager_and_slot_owner(&t);
    s1.set_disk_opener(opener(&t));
    let client = FileSystem::mount_client(
        t.reopen(),
        Box::new(tessera_fs::InProcessOwner(Arc::downgrade(&fs))),
    )
    .unwrap();
    client.set_disk_opener(opener(&t));
    let before = write_files(&s1, dir, "before", 10);

    add_the_spare(&t, &fs);
    let free_on_new = |fs: &FileSystem| {
        let df = fs.df().unwrap();
        let d = df
            .disks
            .iter()
            .find(|d| d.nsd_name == "nsd2")
            .unwrap()
            .clone();
        assert!(d.free_full_block_bytes <= d.size_bytes, "{d:?}");
        d.free_full_block_bytes
    };
    // The slot's region on the new disk is not the manager's to count or give out.
    assert!(free_on_new(&fs) < 128 << 20, "{}", free_on_new(&fs));
    // The manager's own new files land on the new disk too (clustered placement fills
    // one disk at a time; enough files reach it).
    let mut on_new = None;
    for i in 0..64u64 {
        let a = create_file(&fs, ROOT_INO, format!("m{i}").as_bytes());
        fs.write(a.ino, 0, &pattern(1 << 20, 900 + i), false)
            .unwrap();
        if has_blocks_on(&fs, a.ino, 2) {
            on_new = Some((a.ino, i));
            break;
        }
    }
    let (m_ino, m_seed) = on_new.expect("the manager allocates on the added disk");
    // A client that was never told reads it.
    assert_eq!(
        client.read(m_ino, 0, 1 << 20).unwrap(),
        pattern(1 << 20, 900 + m_seed)
    );

    assert_eq!(s1.follow_descriptor().unwrap(), vec![2]);
    assert_eq!(s1.follow_descriptor().unwrap(), Vec::<u16>::new(), "once");
    assert!(
        free_on_new(&fs) > 150 << 20,
        "the slot counts its part of the disk"
    );
    let during = files_until_one_is_on(&s1, dir, 2);
    s1.checkpoint().unwrap();
    let record = fs.slots().unwrap()[0].1.as_ref().unwrap().clone();
    assert_eq!(record.disks_covered, 3, "the record covers the added disk");
    client.unmount().unwrap();
    unmount_both_and_check(&t, fs, s1, "after a disk added beside a slot");

    let (fs, s1) = two_owners_again(&t);
    verify_in(&s1, dir, &before);
    verify_in(&s1, dir, &during);
    assert_eq!(
        fs.read(m_ino, 0, 1 << 20).unwrap(),
        pattern(1 << 20, 900 + m_seed)
    );
    assert!(fs.allocation_map_rebuilt().is_none());
    assert!(s1.allocation_map_rebuilt().is_none());
    unmount_both_and_check(&t, fs, s1, "after both remounted");
}

/// A slot owner that was down while a disk was added takes its region's part of the disk
/// as free at mount (its record does not cover the disk) and allocates there; killed
/// before its next checkpoint, it comes back from its log with the same blocks marked,
/// and fsck (which brings the slot back the same way) is clean.
#[test]
fn a_slot_owner_down_during_a_disk_add_takes_its_part_of_the_disk_at_mount() {
    let t = two_region_fs_and_a_spare();
    let (fs, dir) = manager_with_a_slot_directory(&t);
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    let before = write_files(&s1, dir, "before", 20);
    s1.unmount().unwrap();
    drop(s1);

    add_the_spare(&t, &fs);
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    connect_owners(
        &fs,
        &s1,
        Box::new(tessera_fs::InProcessOwner(Arc::downgrade(&fs))),
    );
    let during = files_until_one_is_on(&s1, dir, 2);
    // Killed before any checkpoint of the slot covered the disk.
    let s1 = killed_and_mounted_again(&t, &fs, s1);
    verify_in(&s1, dir, &before);
    verify_in(&s1, dir, &during);
    // What it allocated before the kill is marked again: new files do not land on it.
    let after = write_files(&s1, dir, "after", 40);
    verify_in(&s1, dir, &during);
    s1.sync().unwrap();
    s1.fence();
    drop(s1);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after a slot killed before covering the added disk");
    let (fs, s1) = two_owners_again(&t);
    verify_in(&s1, dir, &during);
    verify_in(&s1, dir, &after);
    unmount_both_and_check(&t, fs, s1, "after both remounted");
}

/// A disk suspended on the file system manager [mmchdisk suspend] takes no new blocks from
/// a live slot owner either once it is told (before, the slots went on filling it); resumed,
/// it takes them again.
#[test]
fn a_live_slot_owner_follows_a_disks_status() {
    let t = two_region_fs();
    let (fs, s1, dir) = manager_and_slot_owner(&t);
    fs.set_disk_status(&["nsd1".into()], tessera_fs::DiskStatus::Suspended)
        .unwrap();
    s1.follow_descriptor().unwrap();
    let (files, failed) = write_mib_files(&s1, dir, "suspended", 24);
    assert!(failed.is_none(), "{failed:?}");
    for name in files.keys() {
        let ino = s1.lookup(dir, name.as_bytes()).unwrap().ino;
        assert!(
            !has_blocks_on(&s1, ino, 1),
            "{name} has blocks on the suspended disk"
        );
    }
    fs.set_disk_status(&["nsd1".into()], tessera_fs::DiskStatus::Ready)
        .unwrap();
    s1.follow_descriptor().unwrap();
    let resumed = files_until_one_is_on(&s1, dir, 1);
    verify_in(&s1, dir, &files);
    verify_in(&s1, dir, &resumed);
    unmount_both_and_check(&t, fs, s1, "after a suspend and resume beside a slot");
}

/// `fs change -r 2` on the file system manager [mmchfs -r]: a live slot owner, once told,
/// gives the files it creates two copies too (before, only the manager's new files got
/// them until the slot's next mount).
#[test]
fn a_live_slot_owner_follows_the_replication_of_new_files() {
    let t = two_region_fs();
    let (fs, s1, dir) = manager_and_slot_owner(&t);
    let one = write_files(&s1, dir, "one", 60);
    fs.set_data_replication(2).unwrap();
    s1.follow_descriptor().unwrap();
    let two = write_files(&s1, dir, "two", 70);
    for (files, copies) in [(&one, 1), (&two, 2)] {
        for name in files.keys() {
            let ino = s1.lookup(dir, name.as_bytes()).unwrap().ino;
            assert_eq!(s1.file_replication(ino).unwrap(), (copies, false), "{name}");
        }
    }
    verify_in(&s1, dir, &one);
    verify_in(&s1, dir, &two);
    unmount_both_and_check(&t, fs, s1, "after new files replicated beside a slot");
}

/// nsd0 and nsd1 in pool `system`, nsd2 (data only) in pool `slow`, 160 MiB each with the
/// allocation regions of [`two_region_fs`]; the manager and slot 1's owner mounted, region 1
/// and directory `node1` given to the slot.
fn two_pools_and_a_slot() -> (TestDisks, Arc<FileSystem>, Arc<FileSystem>, Ino) {
    let t = make_disks(3, 160 << 20);
    let opts = tessera_fs::FormatOptions {
        block_size: 64 << 10,
        log_bytes: 4 << 20,
        placement: tessera_fs::Placement::Cluster,
        ..small_opts()
    };
    format_fs_with(&t, &opts, |i| match i {
        0 | 1 => (tessera_nsd::DiskUsage::DataAndMetadata, "system"),
        _ => (tessera_nsd::DiskUsage::DataOnly, "slow"),
    });
    let (fs, s1, dir) = manager_and_slot_owner(&t);
    (t, fs, s1, dir)
}

/// `policy change` on the file system manager [mmchpolicy]: a live slot owner, once told,
/// places the files it creates by the new rules too.
#[test]
fn a_live_slot_owner_follows_the_placement_policy() {
    let (t, fs, s1, dir) = two_pools_and_a_slot();
    fs.set_policy(Some(
        "RULE 'tmp' SET POOL 'slow' WHERE NAME LIKE '%.tmp';\nRULE 'default' SET POOL 'system';",
    ))
    .unwrap();
    s1.follow_descriptor().unwrap();
    let files = write_files(&s1, dir, "scratch.tmp", 80);
    for name in files.keys() {
        let ino = s1.lookup(dir, name.as_bytes()).unwrap().ino;
        assert_eq!(s1.file_pool_name(ino).unwrap(), "system", "{name}");
    }
    let a = create_file(&s1, dir, b"x.tmp");
    s1.write(a.ino, 0, &pattern(300_000, 81), false).unwrap();
    assert_eq!(s1.file_pool_name(a.ino).unwrap(), "slow");
    unmount_both_and_check(&t, fs, s1, "after a policy followed beside a slot");
}

/// `restripe -b` on the file system manager after a disk was added [mmrestripefs -b]:
/// the slot owner moves its own files' blocks too (a batch per request, in its own regions
/// and log), where the manager's restripe used to skip the shards it had given away and
/// report success. With the slot's owner gone, the restripe says so by slot.
#[test]
fn a_restripe_on_the_manager_moves_the_slots_files_too() {
    let t = two_region_fs_and_a_spare();
    let (fs, s1, dir) = manager_and_slot_owner(&t);
    s1.set_disk_opener(opener(&t));
    let (slot_files, failed) = write_mib_files(&s1, dir, "s", 24);
    assert!(failed.is_none(), "{failed:?}");
    let mine = write_files(&fs, ROOT_INO, "m", 11);
    add_the_spare(&t, &fs);
    s1.follow_descriptor().unwrap();
    let no_stop = std::sync::atomic::AtomicBool::new(false);
    let report = fs
        .restripe(
            tessera_fs::restripe::RestripeMode::Balance,
            &no_stop,
            &mut |_| {},
        )
        .unwrap();
    assert!(report.unreached_slots.is_empty(), "{report:?}");
    let slot_blocks = 24 * 16;
    assert!(
        report.progress.blocks_scanned >= slot_blocks,
        "the slot's {slot_blocks} blocks were scanned: {report:?}"
    );
    let moved_to_new = slot_files.keys().any(|name| {
        let ino = s1.lookup(dir, name.as_bytes()).unwrap().ino;
        assert!(blocks_in_region(&s1, ino, 1), "{name} left region 1");
        has_blocks_on(&s1, ino, 2)
    });
    assert!(
        moved_to_new,
        "no block of the slot's files went to the new disk"
    );
    verify_in(&s1, dir, &slot_files);
    verify_in(&fs, ROOT_INO, &mine);

    // Its owner gone: named, the manager's part done.
    s1.unmount().unwrap();
    drop(s1);
    let report = fs
        .restripe(
            tessera_fs::restripe::RestripeMode::Balance,
            &no_stop,
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(
        report
            .unreached_slots
            .iter()
            .map(|(s, _)| *s)
            .collect::<Vec<_>>(),
        vec![1],
        "{report:?}"
    );
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after restripes beside a slot");
    let (fs, s1) = two_owners_again(&t);
    verify_in(&s1, dir, &slot_files);
    unmount_both_and_check(&t, fs, s1, "after both remounted");
}

/// `policy apply` [mmapplypolicy] on the file system manager with another slot's files in
/// the namespace: the scan asks each file's owner for its pool, MIGRATE has the owner move
/// it, DELETE and LIST reach it by name (before, the scan failed on the first file of a
/// shard given away).
#[test]
fn policy_apply_reaches_the_files_of_a_slot() {
    let (t, fs, s1, dir) = two_pools_and_a_slot();
    let kept = write_files(&s1, dir, "keep", 90);
    let cold = create_file(&s1, dir, b"cold.dat");
    let cold_data = pattern(600_000, 91);
    s1.write(cold.ino, 0, &cold_data, false).unwrap();
    create_file(&s1, dir, b"junk.tmp");
    let mine = write_files(&fs, ROOT_INO, "m", 92);
    let policy = "RULE EXTERNAL LIST 'all' EXEC ''\n\
                  RULE 'purge' DELETE WHERE NAME LIKE '%.tmp'\n\
                  RULE 'cold' MIGRATE TO POOL 'slow' WHERE NAME LIKE '%.dat'\n\
                  RULE 'everything' LIST 'all'";
    let report = fs
        .apply_policy(
            policy,
            tessera_fs::policy_run::ApplyMode::Yes,
            &std::sync::atomic::AtomicBool::new(false),
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(
        report.files_scanned,
        (kept.len() + 2 + mine.len()) as u64,
        "{report:?}"
    );
    assert_eq!((report.deleted, report.migrated), (1, 1), "{report:?}");
    assert!(matches!(
        s1.lookup(dir, b"junk.tmp"),
        Err(FsError::NotFound)
    ));
    assert_eq!(s1.file_pool_name(cold.ino).unwrap(), "slow");
    assert!(
        s1.file_block_addresses(cold.ino)
            .unwrap()
            .iter()
            .all(|(disk, _)| *disk == 2),
        "cold.dat's blocks moved to the slow pool's disk"
    );
    assert_eq!(s1.read(cold.ino, 0, 700_000).unwrap(), cold_data);
    verify_in(&s1, dir, &kept);
    unmount_both_and_check(&t, fs, s1, "after a policy applied beside a slot");
}

/// `disk change suspend` and `restripe -m` on the file system manager [mmrestripefs -m]
/// with a live slot owner: the slot's owner moves its files' blocks and its own metadata
/// pages off the disk (each page move a checkpoint of its own, a batch per request), where
/// the restripe was refused while any shard was given away. Nothing of either owner is
/// left on the disk; both remount and verify, fsck is clean.
#[test]
fn a_restripe_m_on_the_manager_empties_a_disk_of_the_slots_blocks_and_pages() {
    let t = two_region_fs_and_a_spare();
    let (fs, s1, dir) = a_slot_beside_the_added_spare(&t);
    let mut slot_files = files_until_one_is_on(&s1, dir, 2);
    // Directories and small files until the slot's checkpoint puts pages on the new disk.
    let mut round = 0;
    while s1.metadata_pages_per_disk().unwrap()[2] < 3 {
        assert!(round < 200, "the slot put too few pages on the new disk");
        let sub = mkdir(&s1, dir, format!("d{round}").as_bytes());
        slot_files.extend(
            write_files(&s1, sub.ino, &format!("small{round}-"), round)
                .into_iter()
                .map(|(name, data)| (format!("d{round}/{name}"), data)),
        );
        s1.checkpoint().unwrap();
        round += 1;
    }
    let mine = write_files(&fs, ROOT_INO, "m", 12);

    fs.set_disk_status(&["nsd2".into()], tessera_fs::DiskStatus::Suspended)
        .unwrap();
    s1.follow_descriptor().unwrap();
    let report = restripe_m(&fs);
    assert!(report.unreached_slots.is_empty(), "{report:?}");
    // What a crash of the slot's owner now comes back to: its last checkpoint's pages.
    let s1 = killed_and_mounted_again(&t, &fs, s1);
    assert_eq!(
        s1.metadata_pages_per_disk().unwrap()[2],
        0,
        "slot pages left"
    );
    let in_slot = |name: &str| ino_at(&s1, dir, name);
    for name in slot_files.keys() {
        assert!(
            !has_blocks_on(&s1, in_slot(name), 2),
            "{name} is still on nsd2"
        );
    }
    for name in mine.keys() {
        let ino = fs.lookup(ROOT_INO, name.as_bytes()).unwrap().ino;
        assert!(!has_blocks_on(&fs, ino, 2), "{name} is still on nsd2");
    }
    assert_eq!(
        fs.metadata_pages_per_disk().unwrap()[2],
        0,
        "manager pages left"
    );
    for (name, data) in &slot_files {
        let ino = in_slot(name);
        assert_eq!(&s1.read(ino, 0, data.len() as u32).unwrap(), data, "{name}");
    }
    verify_in(&fs, ROOT_INO, &mine);
    unmount_both_and_check(&t, fs, s1, "after restripe -m beside a slot");

    let (fs, s1) = two_owners_again(&t);
    for (name, data) in &slot_files {
        let ino = ino_at(&s1, dir, name);
        assert_eq!(&s1.read(ino, 0, data.len() as u32).unwrap(), data, "{name}");
    }
    assert_eq!(s1.metadata_pages_per_disk().unwrap()[2], 0);
    unmount_both_and_check(&t, fs, s1, "after both remounted");
}

/// The inode of `path` ("a/b/c") under `dir` on the mount that serves it.
fn ino_at(fs: &FileSystem, dir: Ino, path: &str) -> Ino {
    path.split('/')
        .fold(dir, |at, name| fs.lookup(at, name.as_bytes()).unwrap().ino)
}

/// The page part of [`a_restripe_m_on_the_manager_empties_a_disk_of_the_slots_blocks_and_pages`]
/// alone: the slot's files lie on the first disks and only its metadata pages on the one
/// suspended, so no block move changes them and the slot's owner moves them itself, asked by
/// the manager's restripe; a crash of the slot's owner right after comes back to pages on
/// the other disks only.
#[test]
fn a_restripe_m_on_the_manager_has_the_slot_move_its_pages() {
    let t = two_region_fs_and_a_spare();
    let (fs, s1, dir) = manager_and_slot_owner(&t);
    s1.set_disk_opener(opener(&t));
    let (files, failed) = write_mib_files(&s1, dir, "s", 8);
    assert!(failed.is_none(), "{failed:?}");
    add_the_spare(&t, &fs);
    s1.follow_descriptor().unwrap();
    let mut round = 0;
    while s1.metadata_pages_per_disk().unwrap()[2] == 0 {
        assert!(round < 200, "no page of the slot went to the new disk");
        mkdir(&s1, dir, format!("d{round}").as_bytes());
        s1.checkpoint().unwrap();
        round += 1;
    }
    fs.set_disk_status(&["nsd2".into()], tessera_fs::DiskStatus::ToBeEmptied)
        .unwrap();
    s1.follow_descriptor().unwrap();
    let report = restripe_m(&fs);
    assert!(report.unreached_slots.is_empty(), "{report:?}");
    assert!(report.progress.metadata_pages_moved > 0, "{report:?}");
    let s1 = killed_and_mounted_again(&t, &fs, s1);
    assert_eq!(s1.metadata_pages_per_disk().unwrap()[2], 0);
    verify_in(&s1, dir, &files);
    for r in 0..round {
        s1.lookup(dir, format!("d{r}").as_bytes()).unwrap();
    }
    unmount_both_and_check(&t, fs, s1, "after the slot moved its pages");
}

/// `disk delete` [mmdeldisk] on the file system manager of a disk a live slot owner
/// allocates on (refused before while any region or shard was given away): the manager
/// marks it, the slot's owner follows, the restripe has the slot move its blocks and pages
/// off, the slot lets go of the disk (out of its allocator and digest, named in its
/// record), and the descriptor drops it. The slot goes on writing without it, comes back
/// from a crash and from a remount with a digest that reads, and fsck is clean.
#[test]
fn a_disk_added_beside_a_live_slot_owner_is_deleted_again() {
    let t = two_region_fs_and_a_spare();
    let (fs, s1, dir) = a_slot_beside_the_added_spare(&t);
    let slot_files = files_until_one_is_on(&s1, dir, 2);
    let mine = write_files(&fs, ROOT_INO, "m", 13);
    s1.checkpoint().unwrap();

    let report = delete_beside_the_slot(&fs, &s1, "nsd2");
    assert_eq!(report.deleted, vec![2], "{report:?}");
    assert!(report.restripe.unreached_slots.is_empty(), "{report:?}");
    assert!(fs.descriptor().disks.iter().all(|d| d.index != 2));
    let record = fs.slots().unwrap()[0].1.as_ref().unwrap().clone();
    assert_eq!(
        record.dropped,
        vec![2],
        "the slot's record names the disk dropped"
    );
    s1.follow_descriptor().unwrap();
    verify_in(&s1, dir, &slot_files);
    verify_in(&fs, ROOT_INO, &mine);
    let after = write_files(&s1, dir, "after", 31);
    s1.checkpoint().unwrap();
    let record = fs.slots().unwrap()[0].1.as_ref().unwrap().clone();
    assert!(
        record.dropped.is_empty(),
        "a deleted disk needs no mention: {record:?}"
    );

    let s1 = killed_and_mounted_again(&t, &fs, s1);
    verify_in(&s1, dir, &slot_files);
    verify_in(&s1, dir, &after);
    assert!(s1.allocation_map_rebuilt().is_none());
    unmount_both_and_check(&t, fs, s1, "after a disk deleted beside a slot");
    let (fs, s1) = two_owners_again(&t);
    verify_in(&s1, dir, &slot_files);
    verify_in(&fs, ROOT_INO, &mine);
    assert!(fs.allocation_map_rebuilt().is_none());
    assert!(s1.allocation_map_rebuilt().is_none());
    unmount_both_and_check(&t, fs, s1, "after both remounted");
}

/// The first half of a `disk delete` of the spare of [`two_region_fs_and_a_spare`] beside a
/// live slot owner: the spare added, slot files written until one is on it, the spare
/// marked to be emptied and the slot told, and the manager's restripe run (the slot moved
/// its part off). Returns both owners, the slot's directory and its files.
#[allow(clippy::type_complexity)]
fn slot_files_moved_off_the_spare(
    t: &TestDisks,
) -> (
    Arc<FileSystem>,
    Arc<FileSystem>,
    Ino,
    BTreeMap<String, Vec<u8>>,
) {
    let (fs, s1, dir) = a_slot_beside_the_added_spare(t);
    let files = files_until_one_is_on(&s1, dir, 2);
    fs.mark_disks_for_delete(&["nsd2".to_string()]).unwrap();
    s1.follow_descriptor().unwrap();
    let report = restripe_m(&fs);
    assert!(report.unreached_slots.is_empty(), "{report:?}");
    (fs, s1, dir, files)
}

/// A slot's owner that let go of a disk for a delete the manager never committed (the
/// manager stopped, or the administrator gave the delete up): killed, it comes back with
/// the disk still out of its allocator (its record names it dropped, and its digest
/// reads); once the disk is back in service it takes the disk again as an added one,
/// allocates there, and comes back from another crash with those blocks; fsck is clean.
#[test]
fn a_slot_that_let_go_of_a_disk_whose_delete_was_given_up_takes_it_again() {
    let t = two_region_fs_and_a_spare();
    let (fs, s1, dir, before) = slot_files_moved_off_the_spare(&t);
    s1.let_go_of_disks(&[2]).unwrap();
    s1.let_go_of_disks(&[2]).unwrap();

    let s1 = killed_and_mounted_again(&t, &fs, s1);
    s1.set_disk_opener(opener(&t));
    verify_in(&s1, dir, &before);
    let record = fs.slots().unwrap()[0].1.as_ref().unwrap().clone();
    assert_eq!(record.dropped, vec![2], "{record:?}");

    fs.set_disk_status(&["nsd2".into()], tessera_fs::DiskStatus::Ready)
        .unwrap();
    s1.follow_descriptor().unwrap();
    let sub = mkdir(&s1, dir, b"again").ino;
    let again = files_until_one_is_on(&s1, sub, 2);
    let s1 = killed_and_mounted_again(&t, &fs, s1);
    verify_in(&s1, dir, &before);
    verify_in(&s1, sub, &again);
    assert!(s1.allocation_map_rebuilt().is_none());
    unmount_both_and_check(&t, fs, s1, "after a delete given up beside a slot");
}

/// A slot's owner killed at every write of letting go of a disk for a delete (the
/// checkpoints before and after it, the record naming the disk dropped): it always mounts
/// again (its record's digest reads, whichever record survived), its files verify, fsck is
/// clean; the delete then completes and both owners remount.
#[test]
fn a_slot_letting_go_of_a_disk_cut_by_a_crash_at_every_write_mounts_again() {
    let t = two_region_fs_and_a_spare();
    let (fs, s1, dir, files) = slot_files_moved_off_the_spare(&t);
    unmount_both_and_check(&t, fs, s1, "before the cuts");
    let no_stop = std::sync::atomic::AtomicBool::new(false);
    let mut crashes = 0;
    for k in 1..200i64 {
        // Directories made first: the checkpoints of the drop then have pages to write.
        let (crashed, result) = slot_owner_cut_at_write(&t, k, |s1| {
            for i in 0..20 {
                let name = format!("w{k}-{i}");
                s1.create_node(
                    dir,
                    name.as_bytes(),
                    FileKind::Directory,
                    0o755,
                    0,
                    ROOT,
                    None,
                )?;
            }
            s1.let_go_of_disks(&[2])
        });
        let when = format!("slot owner killed at write {k}");
        let (fs, s1) = two_owners_again(&t);
        verify_in(&s1, dir, &files);
        unmount_both_and_check(&t, fs, s1, &when);
        if !crashed {
            result.unwrap();
            break;
        }
        crashes += 1;
    }
    assert!(crashes > 5, "letting go took only {crashes} writes");
    let (fs, s1) = two_owners_again(&t);
    let report = fs
        .delete_disks(&["nsd2".to_string()], &no_stop, &mut |_| {})
        .unwrap();
    assert_eq!(report.deleted, vec![2]);
    s1.follow_descriptor().unwrap();
    verify_in(&s1, dir, &files);
    unmount_both_and_check(&t, fs, s1, "after the delete");
    let (fs, s1) = two_owners_again(&t);
    verify_in(&s1, dir, &files);
    unmount_both_and_check(&t, fs, s1, "after both remounted");
}

/// Slot 1's owner beside the manager, the spare of [`two_region_fs_and_a_spare`] added and
/// followed by the slot.
fn a_slot_beside_the_added_spare(t: &TestDisks) -> (Arc<FileSystem>, Arc<FileSystem>, Ino) {
    let (fs, s1, dir) = manager_and_slot_owner(t);
    s1.set_disk_opener(opener(t));
    add_the_spare(t, &fs);
    s1.follow_descriptor().unwrap();
    (fs, s1, dir)
}

/// `restripe -m` on the manager `fs`, run to its end.
fn restripe_m(fs: &FileSystem) -> tessera_fs::restripe::RestripeReport {
    fs.restripe(
        tessera_fs::restripe::RestripeMode::Migrate,
        &std::sync::atomic::AtomicBool::new(false),
        &mut |_| {},
    )
    .unwrap()
}

/// The disk among the file system's disks that stores the allocation map of another disk
/// and holds no owner slot's region (records and log): the one a `disk delete` refused
/// beside live slots before map regions could move under them.
fn disk_storing_another_disks_map(fs: &FileSystem) -> u16 {
    let desc = fs.descriptor();
    let slot_disks: Vec<u16> = desc
        .slot_regions()
        .iter()
        .flat_map(|r| r.copies().iter().map(|(d, _)| *d).collect::<Vec<_>>())
        .collect();
    let found = desc
        .map_regions()
        .find(|r| r.on_disk != r.disk && !slot_disks.contains(&r.on_disk))
        .map(|r| r.on_disk);
    found.expect("a disk stores another's map apart from the slot regions")
}

/// `disk delete` of NSD `name` on the manager `fs`, slot 1's owner `s1` told of the mark
/// (as the daemon tells every node) before the delete moves anything.
fn delete_beside_the_slot(
    fs: &FileSystem,
    s1: &FileSystem,
    name: &str,
) -> tessera_fs::disks::DiskDeleteReport {
    let deleting = [name.to_string()];
    fs.mark_disks_for_delete(&deleting).unwrap();
    s1.follow_descriptor().unwrap();
    fs.delete_disks(
        &deleting,
        &std::sync::atomic::AtomicBool::new(false),
        &mut |_| {},
    )
    .unwrap()
}

/// The NSD name of disk `index` of the file system `fs` mounts.
fn nsd_name(fs: &FileSystem, index: u16) -> String {
    let desc = fs.descriptor();
    let disk = desc.disks.iter().find(|d| d.index == index).unwrap();
    disk.nsd_name.clone()
}

/// Both owners mounted again on `t`: the files of `slot_sets` verify in the slot's
/// directory `dir`, those of `root_sets` in the manager's root, neither owner rebuilds its
/// map; then both unmount and fsck is clean.
fn both_remounted_read(
    t: &TestDisks,
    dir: Ino,
    slot_sets: &[&BTreeMap<String, Vec<u8>>],
    root_sets: &[&BTreeMap<String, Vec<u8>>],
    when: &str,
) {
    let (fs, s1) = two_owners_again(t);
    for files in slot_sets {
        verify_in(&s1, dir, files);
    }
    for files in root_sets {
        verify_in(&fs, ROOT_INO, files);
    }
    assert!(fs.allocation_map_rebuilt().is_none(), "{when}");
    assert!(s1.allocation_map_rebuilt().is_none(), "{when}");
    unmount_both_and_check(t, fs, s1, when);
}

/// Slot 1's owner `s1` killed and mounted again beside the manager `fs`: every file of
/// `sets` in `dir` verifies, its map is read without a rebuild; then both unmount and
/// fsck is clean.
fn slot_killed_reads_its_files_and_map(
    t: &TestDisks,
    fs: Arc<FileSystem>,
    s1: Arc<FileSystem>,
    dir: Ino,
    sets: &[&BTreeMap<String, Vec<u8>>],
    when: &str,
) {
    let s1 = killed_and_mounted_again(t, &fs, s1);
    for files in sets {
        verify_in(&s1, dir, files);
    }
    assert!(s1.allocation_map_rebuilt().is_none(), "{when}");
    unmount_both_and_check(t, fs, s1, when);
}

/// `disk delete` of a disk that stores the allocation maps of other disks, beside a live
/// slot owner that writes its regions' chunks of those maps: the manager holds the slot's
/// chunk writes, copies the regions, commits the descriptor naming the new ones and lets
/// the slot go on there (refused before). The slot's next checkpoints store its chunks in
/// the new regions: killed and mounted again it reads them without rebuilding its map (its
/// digest matches), both owners' files verify, and fsck is clean after both remount.
#[test]
fn a_disk_storing_the_map_regions_is_deleted_beside_a_live_slot_owner() {
    let t = two_region_fs_and_a_spare();
    let (fs, s1, dir) = a_slot_beside_the_added_spare(&t);
    let slot_files = write_files(&s1, dir, "s", 7);
    let mine = write_files(&fs, ROOT_INO, "m", 13);
    s1.checkpoint().unwrap();
    let victim = disk_storing_another_disks_map(&fs);
    let name = nsd_name(&fs, victim);

    let report = delete_beside_the_slot(&fs, &s1, &name);
    assert_eq!(report.deleted, vec![victim], "{report:?}");
    assert!(report.restripe.progress.map_regions_moved > 0, "{report:?}");
    let desc = fs.descriptor();
    assert!(desc
        .map_regions()
        .all(|r| r.on_disk != victim && r.disk != victim));
    s1.follow_descriptor().unwrap();
    verify_in(&s1, dir, &slot_files);
    verify_in(&fs, ROOT_INO, &mine);
    let after = write_files(&s1, dir, "after", 31);
    s1.checkpoint().unwrap();

    let both = [&slot_files, &after];
    slot_killed_reads_its_files_and_map(&t, fs, s1, dir, &both, "after the delete");
    both_remounted_read(&t, dir, &both, &[&mine], "after both remounted");
}

/// A slot whose chunk writes a manager held for a move of map regions and never released
/// (the manager died): its checkpoint waits at the gate, a second move is refused while
/// the hold stands, and the fence of the next manager releases it: the checkpoint
/// completes, in the regions of the descriptor on disk, and the slot comes back from a
/// crash with its map read, not rebuilt.
#[test]
fn a_slots_map_writes_held_by_a_manager_that_died_go_on_at_the_next_managers_fence() {
    let t = two_region_fs();
    let (fs, s1, dir) = manager_and_slot_owner(&t);
    let before = write_files(&s1, dir, "b", 3);
    s1.hold_own_map_writes(true, 42).unwrap();
    s1.hold_own_map_writes(true, 42).unwrap();
    assert!(matches!(
        s1.hold_own_map_writes(true, 43),
        Err(FsError::Usage(_))
    ));
    let (done, waiting) = std::sync::mpsc::channel();
    let checkpointing = {
        let s1 = Arc::clone(&s1);
        std::thread::spawn(move || {
            let files = write_files(&s1, dir, "held", 5);
            let result = s1.checkpoint();
            done.send(()).unwrap();
            result.map(|()| files)
        })
    };
    assert!(
        waiting
            .recv_timeout(std::time::Duration::from_millis(500))
            .is_err(),
        "a checkpoint wrote chunks while the map writes were held"
    );
    // A release under another move's id changes nothing.
    s1.hold_own_map_writes(false, 7).unwrap();
    assert!(waiting
        .recv_timeout(std::time::Duration::from_millis(200))
        .is_err());
    let fenced = s1.serve_metanode_request(&tessera_fs::Fence::request(0, 2, 1));
    tessera_fs::Fence::check(&fenced).unwrap();
    let settled = s1.serve_metanode_request(&tessera_fs::Fence::settled(0, true));
    tessera_fs::Fence::check(&settled).unwrap();
    waiting
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the fence released the hold");
    let held = checkpointing.join().unwrap().unwrap();

    slot_killed_reads_its_files_and_map(
        &t,
        fs,
        s1,
        dir,
        &[&before, &held],
        "after a hold released by a fence",
    );
}

/// `restripe -m` moving map regions that hold a live slot's chunks off a disk marked to be
/// emptied, the manager cut by a crash at every write: the slot is released each time
/// and writes its chunks where the descriptor that landed puts them, so it goes on writing
/// files; once a run completes the regions are off the disk, and the slot, killed and
/// mounted again, reads its map without a rebuild; fsck is clean.
#[test]
fn a_map_region_move_beside_a_slot_cut_by_a_crash_of_the_manager_at_every_write() {
    let t = two_region_fs_and_a_spare();
    let (fs, s1, dir) = a_slot_beside_the_added_spare(&t);
    let mut slot_files = write_files(&s1, dir, "s", 7);
    let mine = write_files(&fs, ROOT_INO, "m", 13);
    s1.checkpoint().unwrap();
    let victim = disk_storing_another_disks_map(&fs);
    let name = nsd_name(&fs, victim);
    fs.mark_disks_for_delete(&[name]).unwrap();
    s1.follow_descriptor().unwrap();
    fs.unmount().unwrap();
    drop(fs);
    for k in 1.. {
        assert!(k < 400, "the move never finished");
        let (fs, faults) = manager_failing_at_write(&t, &s1, k);
        let result = fs.restripe(
            tessera_fs::restripe::RestripeMode::Migrate,
            &std::sync::atomic::AtomicBool::new(false),
            &mut |_| {},
        );
        let crashed = crash(fs, &faults);
        let fs = mount(&t);
        connect_owners(
            &fs,
            &s1,
            Box::new(tessera_fs::InProcessOwner(Arc::downgrade(&fs))),
        );
        s1.follow_descriptor().unwrap();
        let files = write_files(&s1, dir, &format!("k{k}-"), k as u64);
        s1.checkpoint().unwrap();
        slot_files.extend(files);
        verify_in(&s1, dir, &slot_files);
        verify_in(&fs, ROOT_INO, &mine);
        let moved = fs.descriptor().map_regions().all(|r| r.on_disk != victim);
        fs.unmount().unwrap();
        drop(fs);
        if !crashed {
            result.unwrap();
            assert!(
                moved,
                "write {k}: the restripe ended with a map region on the disk"
            );
            eprintln!(
                "moving map regions beside a slot: {} crashes before it ended",
                k - 1
            );
            assert!(k > 1);
            break;
        }
    }
    s1.fence();
    drop(s1);
    both_remounted_read(
        &t,
        dir,
        &[&slot_files],
        &[&mine],
        "after map regions moved through crashes",
    );
}

/// `disk delete` of the disk holding the hand-over root of the shard the manager gave a
/// live slot (kept, in the manager's region, until every record of the slot names a root
/// of its own) before the slot's first checkpoint: the restripe has the slot write its
/// other record half and the manager then frees the root, so the delete completes
/// (it failed with the disk "still in use" until a remount). The slot's files verify after
/// a crash, and fsck is clean.
#[test]
fn a_disk_holding_a_hand_over_root_is_deleted_beside_the_slot_that_took_the_shard() {
    let t = two_region_fs();
    let (fs, s1, dir) = manager_and_slot_owner(&t);
    // No checkpoint of the slot's before the delete: the restripe's is its first.
    let slot_files = write_files(&s1, dir, "s", 5);
    let desc = fs.descriptor();
    let shard = (dir % u64::from(desc.shard_count)) as usize;
    let handed = desc.root_ptrs()[shard];
    assert_ne!(handed.addr.0, 0, "the hand-over root is still kept");
    let victim = (handed.addr.0 >> 48) as u16;
    assert!(
        desc.slot_regions().iter().all(|r| r.disk != victim),
        "the slot's region is elsewhere: {:?}",
        desc.slot_regions()
    );
    let d1 = mkdir(&fs, ROOT_INO, b"d1");
    let mine = write_files(&fs, d1.ino, "m", 6);
    let report = delete_beside_the_slot(&fs, &s1, &nsd_name(&fs, victim));
    assert_eq!(report.deleted, vec![victim], "{report:?}");
    assert!(fs.descriptor().root_ptrs()[shard].addr.0 == 0);
    verify_in(&fs, d1.ino, &mine);
    slot_killed_reads_its_files_and_map(&t, fs, s1, dir, &[&slot_files], "after the delete");
}

/// Slot 1's region (records and log) as the manager `fs`'s descriptor names it.
fn slot_region(fs: &FileSystem) -> tessera_fs::slot::SlotRegion {
    let desc = fs.descriptor();
    let region = desc.slot_regions().iter().find(|r| r.slot == 1);
    region.expect("slot 1 has a region").clone()
}

/// `disk delete` of the disk holding a live slot's region (its records and log), with
/// changes in the slot's log that no checkpoint covers: the slot moves itself (a checkpoint,
/// a new log continuing its LSNs, a record there and a forward in the old region) and the
/// manager commits the new place (refused before). Files written after the move, left in
/// the new log only, come back when the slot is killed and mounted again; fsck is clean.
#[test]
fn a_disk_holding_a_live_slots_region_is_deleted_beside_its_owner() {
    let t = two_region_fs_and_a_spare();
    let (fs, s1, dir) = a_slot_beside_the_added_spare(&t);
    let slot_files = write_files(&s1, dir, "s", 7);
    s1.checkpoint().unwrap();
    let mine = write_files(&fs, ROOT_INO, "m", 13);
    let unsynced = write_files(&s1, dir, "u", 9);
    let old = slot_region(&fs);

    let report = delete_beside_the_slot(&fs, &s1, &nsd_name(&fs, old.disk));
    assert_eq!(report.deleted, vec![old.disk], "{report:?}");
    assert!(
        report.restripe.progress.slot_regions_moved > 0,
        "{report:?}"
    );
    let new = slot_region(&fs);
    assert_ne!(new.disk, old.disk);
    assert_ne!(
        new.log_id, old.log_id,
        "a new log, formatted at the new place"
    );
    assert_eq!(fs.descriptor().slot_moves, None, "the reservation ended");
    s1.follow_descriptor().unwrap();
    for files in [&slot_files, &unsynced] {
        verify_in(&s1, dir, files);
    }
    verify_in(&fs, ROOT_INO, &mine);
    let after = write_files(&s1, dir, "after", 31);

    let all = [&slot_files, &unsynced, &after];
    slot_killed_reads_its_files_and_map(&t, fs, s1, dir, &all, "after the delete");
    both_remounted_read(&t, dir, &all, &[&mine], "after both remounted");
}

/// `restripe -m` moving a live slot's region off a disk marked to be emptied, the manager
/// cut by a crash at every write, first from the start of the restripe, then from the start
/// of settling a move that a run whose slot did not answer left reserved: the slot, moved
/// already or not, ends in the reserved region, goes on writing and checkpointing after
/// every cut, and fsck is clean at the end.
#[test]
fn a_live_slot_region_move_cut_by_a_crash_of_the_manager_at_every_write() {
    let t = two_region_fs_and_a_spare();
    let (fs, s1, dir) = a_slot_beside_the_added_spare(&t);
    let mut slot_files = write_files(&s1, dir, "s", 7);
    let mine = write_files(&fs, ROOT_INO, "m", 13);
    let victim = slot_region(&fs).disk;
    fs.mark_disks_for_delete(&[nsd_name(&fs, victim)]).unwrap();
    s1.follow_descriptor().unwrap();
    fs.unmount().unwrap();
    drop(fs);
    move_cut_by_the_manager(&t, &s1, dir, "a", &mut slot_files, &mine, victim);
    s1.fence();
    drop(s1);
    let (fs, s1) = two_owners_again(&t);
    let report = delete_beside_the_slot(&fs, &s1, &nsd_name(&fs, victim));
    assert_eq!(report.deleted, vec![victim], "{report:?}");
    // A move left reserved by a manager that could not reach the slot.
    let victim = slot_region(&fs).disk;
    fs.mark_disks_for_delete(&[nsd_name(&fs, victim)]).unwrap();
    s1.follow_descriptor().unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&t);
    let unreached = fs.restripe(
        tessera_fs::restripe::RestripeMode::Migrate,
        &std::sync::atomic::AtomicBool::new(false),
        &mut |_| {},
    );
    assert!(unreached.is_err(), "{unreached:?}");
    assert!(
        fs.descriptor().slot_moves.is_some(),
        "the move stays reserved"
    );
    fs.unmount().unwrap();
    drop(fs);
    s1.follow_descriptor().unwrap();
    let left = move_cut_by_the_manager(&t, &s1, dir, "b", &mut slot_files, &mine, victim);
    assert!(
        left > 0,
        "no cut fell between the slot's move and its commit"
    );
    s1.fence();
    drop(s1);
    both_remounted_read(
        &t,
        dir,
        &[&slot_files],
        &[&mine],
        "after a slot region moved through crashes",
    );
}

/// `restripe -m` on a manager cut by a crash at write 1, 2, ... (beside slot 1's owner
/// `s1`, which writes files named from `phase` into `dir` after each cut) until a run ends with the slot's
/// region off `victim`. Returns after how many cuts the move was left reserved.
fn move_cut_by_the_manager(
    t: &TestDisks,
    s1: &Arc<FileSystem>,
    dir: Ino,
    phase: &str,
    slot_files: &mut BTreeMap<String, Vec<u8>>,
    mine: &BTreeMap<String, Vec<u8>>,
    victim: u16,
) -> usize {
    let mut left_reserved = 0;
    for k in 1.. {
        assert!(k < 600, "the move never finished");
        let (fs, faults) = manager_failing_at_write(t, s1, k);
        let result = fs.restripe(
            tessera_fs::restripe::RestripeMode::Migrate,
            &std::sync::atomic::AtomicBool::new(false),
            &mut |_| {},
        );
        let crashed = crash(fs, &faults);
        let fs = mount(t);
        connect_owners(
            &fs,
            s1,
            Box::new(tessera_fs::InProcessOwner(Arc::downgrade(&fs))),
        );
        left_reserved += usize::from(fs.descriptor().slot_moves.is_some());
        s1.follow_descriptor().unwrap();
        let files = write_files(s1, dir, &format!("{phase}{k}-"), k as u64);
        s1.checkpoint().unwrap();
        slot_files.extend(files);
        verify_in(s1, dir, slot_files);
        verify_in(&fs, ROOT_INO, mine);
        let moved = slot_region(&fs).disk != victim && fs.descriptor().slot_moves.is_none();
        fs.unmount().unwrap();
        drop(fs);
        if !crashed {
            result.unwrap();
            assert!(
                moved,
                "write {k}: the restripe ended with the slot on the disk"
            );
            eprintln!(
                "moving a live slot's region: {} crashes before it ended",
                k - 1
            );
            break;
        }
    }
    left_reserved
}

/// The same move with the slot's owner cut by a crash at every write (its checkpoint,
/// the new log's format, its record there, the forward): mounted again, the slot is in
/// one region, old or new, with every file; a later run completes the move; fsck is clean
/// after every cut.
#[test]
fn a_live_slot_region_move_cut_by_a_crash_of_the_slot_at_every_write() {
    let t = two_region_fs_and_a_spare();
    let (fs, s1, dir) = a_slot_beside_the_added_spare(&t);
    let files = write_files(&s1, dir, "s", 7);
    let victim = slot_region(&fs).disk;
    fs.mark_disks_for_delete(&[nsd_name(&fs, victim)]).unwrap();
    s1.follow_descriptor().unwrap();
    unmount_both_and_check(&t, fs, s1, "before the cuts");
    let mut crashes = 0;
    for k in 1..400i64 {
        let fs = mount(&t);
        let (disks, faults) = with_faults(&t);
        let s1 = FileSystem::mount_slot(disks, 1).unwrap();
        connect_owners(
            &fs,
            &s1,
            Box::new(tessera_fs::InProcessOwner(Arc::downgrade(&fs))),
        );
        faults.writes_until_failure.store(k, Ordering::SeqCst);
        let result = fs.restripe(
            tessera_fs::restripe::RestripeMode::Migrate,
            &std::sync::atomic::AtomicBool::new(false),
            &mut |_| {},
        );
        let crashed = crash(s1, &faults);
        fs.unmount().unwrap();
        drop(fs);
        let when = format!("slot owner killed at write {k}");
        let (fs, s1) = two_owners_again(&t);
        verify_in(&s1, dir, &files);
        let moved = slot_region(&fs).disk != victim && fs.descriptor().slot_moves.is_none();
        unmount_both_and_check(&t, fs, s1, &when);
        if !crashed {
            result.unwrap();
            assert!(
                moved,
                "{when}: the restripe ended with the slot on the disk"
            );
            break;
        }
        crashes += 1;
    }
    assert!(
        crashes > 3,
        "the move took only {crashes} writes of the slot"
    );
}

/// `disk delete` of the disk holding a live slot's region while the slot's owner and the
/// manager write files all along (each writer checkpointing now and then): the move waits
/// for the slot's metadata and checkpoint locks like any change, no writer sees an error,
/// every file verifies before and after the slot is killed and mounted again, and fsck is
/// clean.
#[test]
fn a_live_slots_region_moves_while_both_owners_write() {
    let t = two_region_fs_and_a_spare();
    let (fs, s1, dir) = a_slot_beside_the_added_spare(&t);
    let old = slot_region(&fs);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let writer = |owner: &FileSystem, dir: Ino, tag: &str| {
        let mut all = BTreeMap::new();
        let mut round = 0u64;
        // At most 100 rounds (about 38 MiB a writer): on a loaded host the move takes
        // long enough for the writers to fill the slot's region otherwise.
        while (!stop.load(Ordering::SeqCst) || round < 3) && round < 100 {
            all.extend(write_files(owner, dir, &format!("{tag}{round}-"), round));
            if round % 4 == 3 {
                owner.checkpoint().unwrap();
            }
            round += 1;
        }
        all
    };
    let (report, slot_files, mine) = std::thread::scope(|scope| {
        let slot_writer = scope.spawn(|| writer(&s1, dir, "s"));
        let manager_writer = scope.spawn(|| writer(&fs, ROOT_INO, "m"));
        std::thread::sleep(std::time::Duration::from_millis(100));
        let report = delete_beside_the_slot(&fs, &s1, &nsd_name(&fs, old.disk));
        stop.store(true, Ordering::SeqCst);
        (
            report,
            slot_writer.join().unwrap(),
            manager_writer.join().unwrap(),
        )
    });
    assert_eq!(report.deleted, vec![old.disk], "{report:?}");
    assert_ne!(slot_region(&fs).disk, old.disk);
    s1.follow_descriptor().unwrap();
    verify_in(&s1, dir, &slot_files);
    verify_in(&fs, ROOT_INO, &mine);
    slot_killed_reads_its_files_and_map(&t, fs, s1, dir, &[&slot_files], "after the delete");
    let (fs, s1) = two_owners_again(&t);
    verify_in(&fs, ROOT_INO, &mine);
    unmount_both_and_check(&t, fs, s1, "after both remounted");
}
