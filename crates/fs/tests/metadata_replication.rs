//! Metadata replication across failure groups [mmcrfs -m 2 -r 2]: every metadata page,
//! the recovery log and the allocation map have a copy in each of two failure groups, and
//! the descriptor's three copies are in three groups; losing either whole failure group
//! loses nothing, a mount without one goes on with one copy, `restripe -r` gives
//! everything its second copy back, a damaged copy is read from the other and repaired,
//! and a mount that could miss records (its only log copy behind, or no descriptor quorum)
//! is refused by name.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use common::*;
use tessera_fs::restripe::{RestripeMode, RestripeReport};
use tessera_fs::{DiskSpec, FileSystem, FormatOptions, Replication, StrictReplication, ROOT_INO};
use tessera_nsd::DiskUsage;

/// nsd0, nsd1: failure group 1; nsd2, nsd3: failure group 2 (data and metadata); nsd4: a
/// descriptor-only disk in failure group 3, the descriptor quorum's tiebreaker.
const GROUPS: [(DiskUsage, i32); 5] = [
    (DiskUsage::DataAndMetadata, 1),
    (DiskUsage::DataAndMetadata, 1),
    (DiskUsage::DataAndMetadata, 2),
    (DiskUsage::DataAndMetadata, 2),
    (DiskUsage::DescOnly, 3),
];
const GROUP_1: [usize; 2] = [0, 1];
const GROUP_2: [usize; 2] = [2, 3];

fn opts() -> FormatOptions {
    FormatOptions {
        metadata_replicas: 2,
        replication: Replication {
            data: 2,
            strict: StrictReplication::WhenPossible,
        },
        ..small_opts()
    }
}

fn replicated_fs() -> TestDisks {
    let t = make_disks(5, 64 << 20);
    tessera_fs::format(specs_in_groups(&t, &GROUPS), &opts(), &mut |_| {}).unwrap();
    t
}

/// Files of every shape in the root, and a directory of many small files, so that the
/// shard trees span many metadata pages.
fn write_files(fs: &FileSystem, prefix: &str, seed: u64) -> BTreeMap<String, Vec<u8>> {
    let mut files = populate(fs, prefix, seed);
    let root = tessera_fs::Caller { uid: 0, gid: 0 };
    let dir = fs
        .create_node(
            ROOT_INO,
            format!("{prefix}dir").as_bytes(),
            tessera_fs::FileKind::Directory,
            0o755,
            0,
            root,
            None,
        )
        .unwrap();
    for i in 0..600u64 {
        let name = format!("{prefix}dir-entry-with-a-long-name-{i:05}");
        let a = create_file(fs, dir.ino, name.as_bytes());
        let data = pattern(40 + (i as usize % 200), seed * 1000 + i);
        fs.write(a.ino, 0, &data, false).unwrap();
        files.insert(format!("{prefix}dir/{name}"), data);
    }
    fs.sync().unwrap();
    fs.checkpoint().unwrap();
    files
}

/// Every file reads back whole (names with a slash are in the directory they name).
fn verify_all(fs: &FileSystem, files: &BTreeMap<String, Vec<u8>>) {
    for (name, data) in files {
        let (dir, leaf) = match name.split_once('/') {
            Some((d, l)) => (fs.lookup(ROOT_INO, d.as_bytes()).unwrap().ino, l),
            None => (ROOT_INO, name.as_str()),
        };
        let a = fs.lookup(dir, leaf.as_bytes()).unwrap();
        assert_eq!(a.size, data.len() as u64, "{name}");
        let got = fs.read(a.ino, 0, data.len() as u32 + 10).unwrap();
        assert!(got == *data, "{name}: content differs");
    }
}

fn restripe(fs: &FileSystem, mode: RestripeMode) -> RestripeReport {
    fs.restripe(mode, &AtomicBool::new(false), &mut |_| {})
        .unwrap()
}

fn metadata_pages_on(fs: &FileSystem, disks: &[usize]) -> u64 {
    let pages = fs.metadata_pages_per_disk().unwrap();
    disks.iter().map(|&i| pages[i]).sum()
}

#[test]
fn metadata_replication_needs_two_failure_groups_of_metadata_disks() {
    let t = make_disks(3, 64 << 20);
    let one_group = [(DiskUsage::DataAndMetadata, 1); 3];
    let metadata_only = FormatOptions {
        replication: Replication::default(),
        ..opts()
    };
    let err = tessera_fs::format(specs_in_groups(&t, &one_group), &metadata_only, &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("-m 2") && err.contains("failure group"),
        "{err}"
    );
    let three = FormatOptions {
        metadata_replicas: 3,
        max_metadata_replicas: 3,
        ..opts()
    };
    let err = three
        .check(&specs_in_groups(&make_disks(5, 64 << 20), &GROUPS))
        .unwrap_err();
    assert!(err.to_string().contains("at most two"), "{err}");
}

#[test]
fn losing_either_whole_failure_group_loses_nothing() {
    let t = replicated_fs();
    let fs = mount(&t);
    let mut files = write_files(&fs, "a", 1);
    // Both groups hold the same number of metadata pages: every page has two copies.
    let (g1, g2) = (
        metadata_pages_on(&fs, &GROUP_1),
        metadata_pages_on(&fs, &GROUP_2),
    );
    assert!(
        g1 > 20 && g1 == g2,
        "metadata pages per group: {g1} and {g2}"
    );
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after create");

    // Failure group 2 is gone: the file system mounts, every byte and name reads, and it
    // takes new files, whose metadata and data have one copy meanwhile.
    let fs = FileSystem::mount(without(&t, &GROUP_2)).unwrap();
    let availability = fs.disk_availability();
    assert!(
        availability.contains(&("nsd2".to_string(), false)),
        "{availability:?}"
    );
    verify_all(&fs, &files);
    files.extend(write_files(&fs, "b", 2));
    verify_all(&fs, &files);
    fs.unmount().unwrap();
    drop(fs);
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert!(report.ill_replicated_blocks > 0, "{report:?}");
    assert!(report.ill_replicated_metadata > 0, "{report:?}");

    // Back whole: restripe -r gives data and metadata their second copies again.
    let fs = mount(&t);
    verify_all(&fs, &files);
    let report = restripe(&fs, RestripeMode::Replicate);
    assert!(report.progress.metadata_pages_moved > 0, "{report:?}");
    assert_eq!(
        metadata_pages_on(&fs, &GROUP_1),
        metadata_pages_on(&fs, &GROUP_2)
    );
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after restripe -r");
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert_eq!(
        (report.ill_replicated_blocks, report.ill_replicated_metadata),
        (0, 0),
        "{report:?}"
    );

    // Now failure group 1 goes: group 2 alone holds everything, old and new.
    let fs = FileSystem::mount(without(&t, &GROUP_1)).unwrap();
    verify_all(&fs, &files);
    files.extend(write_files(&fs, "c", 3));
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&t);
    verify_all(&fs, &files);
    restripe(&fs, RestripeMode::Replicate);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after the second restripe -r");
    let fs = FileSystem::mount(without(&t, &GROUP_2)).unwrap();
    verify_all(&fs, &files);
    fs.unmount().unwrap();
}

#[test]
fn a_log_copy_that_missed_writes_is_never_replayed_alone() {
    let t = replicated_fs();
    let fs = mount(&t);
    let mut files = write_files(&fs, "a", 4);
    // Group 2 stops while mounted: commits and checkpoints go on with one copy, and the
    // descriptor records that group 2's log copy (if it holds one) misses them.
    fs.stop_disks(&["nsd2".into(), "nsd3".into()]).unwrap();
    files.extend(write_files(&fs, "b", 5));
    let tail = create_file(&fs, ROOT_INO, b"after-the-last-checkpoint");
    fs.write(tail.ino, 0, b"only in the log", true).unwrap();
    files.insert(
        "after-the-last-checkpoint".into(),
        b"only in the log".to_vec(),
    );
    // A crash: nothing more is written.
    fs.fence();
    drop(fs);

    // Group 1 gone now: group 2's log copy lacks what was logged after it stopped (the
    // two copies are in the two groups), so the mount is refused by name rather than
    // replaying it and losing those records. (Group 2 is also recorded as stopped, which
    // the refusal may name first: with group 1 gone no disk is left to read.)
    let err = FileSystem::mount(without(&t, &GROUP_1))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no current copy of the recovery log") || err.contains("not available"),
        "{err}"
    );

    // Everything back: the mount replays the current copy; group 2, still stopped, is
    // started, which copies the log onto it, and restripe -r restores the rest; then group
    // 1 may go.
    let fs = mount(&t);
    verify_all(&fs, &files);
    fs.start_disks(&["nsd2".into(), "nsd3".into()]).unwrap();
    restripe(&fs, RestripeMode::Replicate);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after the stopped group came back");
    let fs = FileSystem::mount(without(&t, &GROUP_1)).unwrap();
    verify_all(&fs, &files);
    fs.unmount().unwrap();
}

/// With two copies of the log, a page damaged inside one of them (it held committed
/// records) costs nothing: that copy is refused, the other replays every record, and the
/// replay's pages are copied back over the damaged copy, so that damage to the other copy
/// afterwards costs nothing either.
#[test]
fn a_log_copy_damaged_inside_is_replayed_from_the_other_and_repaired() {
    let t = replicated_fs();
    let fs = mount(&t);
    let files = fsynced_one_by_one(&fs, (ROOT_INO, "f"), 30);
    fs.fence();
    drop(fs);
    let desc = descriptor(&t);
    let copies = desc.metadata_copies.clone().unwrap();
    let region = desc.log.region;
    let damaged = desc.checkpoint.replay_from / 4096 + 10;
    let page_at = |log_start: u64| log_page_offset(log_start, region.bytes, damaged);
    let first = disk_device(&t, &desc, desc.log.disk);
    flip_bit(&*first, page_at(region.offset), 1000);
    drop(first);

    let fs = mount(&t);
    assert_eq!(count_whole(&fs, ROOT_INO, &files), files.len());
    // Killed again before any checkpoint: the same records are replayed next time.
    fs.fence();
    drop(fs);
    let again = descriptor(&t);
    assert_eq!(again.checkpoint.replay_from, desc.checkpoint.replay_from);
    let second = disk_device(&t, &desc, copies.log_disk);
    flip_bit(&*second, page_at(copies.log_offset), 1000);
    drop(second);
    let fs = mount(&t);
    assert_eq!(count_whole(&fs, ROOT_INO, &files), files.len());
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after both log copies were damaged in turn");
}

#[test]
fn damaged_metadata_copies_are_read_from_the_other_and_repaired() {
    use std::io::{Seek, SeekFrom, Write};
    let t = replicated_fs();
    let fs = mount(&t);
    let files = write_files(&fs, "a", 6);
    fs.unmount().unwrap();
    drop(fs);
    // Scribble over the start of failure group 1's data regions, where the metadata
    // pages, the log and the map regions were placed (the NSD descriptor stays).
    let start = tessera_nsd::layout::data_start_bytes(BLOCK);
    for i in GROUP_1 {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(t.dir.path().join(format!("d{i}")))
            .unwrap();
        f.seek(SeekFrom::Start(start)).unwrap();
        f.write_all(&vec![0x5a; (24 << 20) as usize]).unwrap();
        f.sync_all().unwrap();
    }
    let fs = mount(&t);
    verify_all(&fs, &files);
    let report = restripe(&fs, RestripeMode::Check);
    assert!(report.progress.metadata_copies_checked > 0, "{report:?}");
    fs.unmount().unwrap();
    drop(fs);
    // After the scrub and the data repairs, group 1 alone holds everything again.
    let fs = mount(&t);
    restripe(&fs, RestripeMode::Replicate);
    let report = restripe(&fs, RestripeMode::Check);
    assert_eq!(report.progress.metadata_copies_repaired, 0, "{report:?}");
    fs.unmount().unwrap();
    drop(fs);
    let fs = FileSystem::mount(without(&t, &GROUP_2)).unwrap();
    verify_all(&fs, &files);
    fs.unmount().unwrap();
}

#[test]
fn without_a_third_failure_group_the_group_holding_two_descriptors_cannot_be_lost() {
    // Two failure groups only: the descriptor's three copies are two in one group and one
    // in the other, and losing the first leaves no majority.
    let groups = [
        (DiskUsage::DataAndMetadata, 1),
        (DiskUsage::DataAndMetadata, 1),
        (DiskUsage::DataAndMetadata, 2),
        (DiskUsage::DataAndMetadata, 2),
    ];
    let t = make_disks(4, 64 << 20);
    let desc = tessera_fs::format(specs_in_groups(&t, &groups), &opts(), &mut |_| {}).unwrap();
    let holders: Vec<usize> = desc
        .disks
        .iter()
        .filter(|d| d.holds_descriptor)
        .map(|d| d.index as usize)
        .collect();
    assert_eq!(holders.len(), 3, "{holders:?}");
    let fs = mount(&t);
    let files = write_files(&fs, "a", 7);
    fs.unmount().unwrap();
    drop(fs);
    let (two, one) = if holders.iter().filter(|i| **i < 2).count() == 2 {
        ([0, 1], [2, 3])
    } else {
        ([2, 3], [0, 1])
    };
    let err = FileSystem::mount(without(&t, &two))
        .unwrap_err()
        .to_string();
    assert!(err.contains("descriptor quorum"), "{err}");
    let fs = FileSystem::mount(without(&t, &one)).unwrap();
    verify_all(&fs, &files);
    fs.unmount().unwrap();
}

#[test]
fn a_failure_group_that_vanishes_under_load_is_taken_out_and_nothing_is_lost() {
    use std::sync::atomic::Ordering;
    for (gone, stays) in [(GROUP_1, GROUP_2), (GROUP_2, GROUP_1)] {
        let t = replicated_fs();
        let (disks, faults) = with_vanishing(&t, &gone);
        let fs = FileSystem::mount(disks).unwrap();
        let mut files = write_files(&fs, "a", 21);
        // The enclosure goes away under a mounted, busy file system: checkpoints, log
        // commits, map writes and data writes fail there, and it is taken out of service.
        faults.vanished.store(true, Ordering::SeqCst);
        files.extend(write_files(&fs, "b", 22));
        let tail = create_file(&fs, ROOT_INO, b"fsynced-after");
        fs.write(tail.ino, 0, b"durable", true).unwrap();
        fs.fsync(tail.ino).unwrap();
        files.insert("fsynced-after".into(), b"durable".to_vec());
        verify_all(&fs, &files);
        let down: Vec<String> = fs
            .disk_availability()
            .into_iter()
            .filter(|(_, up)| !up)
            .map(|(n, _)| n)
            .collect();
        assert!(!down.is_empty(), "nothing marked down");
        // A crash: what the log and the checkpoints hold on the surviving group is all.
        fs.fence();
        drop(fs);
        let fs = FileSystem::mount(without(&t, &gone)).unwrap();
        verify_all(&fs, &files);
        fs.unmount().unwrap();
        drop(fs);
        // Back whole, restored, and then the other group may go.
        let fs = mount(&t);
        verify_all(&fs, &files);
        restripe(&fs, RestripeMode::Replicate);
        fs.unmount().unwrap();
        drop(fs);
        assert_fsck_clean(&t, "after a vanished failure group came back");
        let fs = FileSystem::mount(without(&t, &stays)).unwrap();
        verify_all(&fs, &files);
        fs.unmount().unwrap();
    }
}

/// A failure group lost for good is replaced [mmdeldisk, mmadddisk, mmrestripefs -r]: its
/// disks are deleted while missing (what they held is copied from the other group), new
/// disks are added in a new group, `restripe -r` gives everything its second copy there,
/// and then the old surviving group may go.
#[test]
fn a_lost_failure_group_is_replaced_by_new_disks() {
    let t = make_disks(7, 64 << 20);
    let first: Vec<DiskSpec> =
        specs_in_groups(&t, &[GROUPS.as_slice(), &[GROUPS[0], GROUPS[0]]].concat())
            .into_iter()
            .take(5)
            .collect();
    tessera_fs::format(first, &opts(), &mut |_| {}).unwrap();
    let all: Vec<_> = t.reopen();
    let fs = FileSystem::mount(all[..5].to_vec()).unwrap();
    let mut files = write_files(&fs, "a", 31);
    fs.unmount().unwrap();
    drop(fs);

    // Group 2 (nsd2, nsd3) is lost for good.
    let fs = FileSystem::mount(without(&t, &[2, 3, 5, 6])).unwrap();
    verify_all(&fs, &files);
    let report = fs
        .delete_disks(
            &["nsd2".into(), "nsd3".into()],
            &AtomicBool::new(false),
            &mut |_| {},
        )
        .unwrap();
    assert!(report.deleted.len() == 2, "{report:?}");
    verify_all(&fs, &files);
    let new: Vec<DiskSpec> = specs_in_groups(&t, &[(DiskUsage::DataAndMetadata, 4); 7])
        .into_iter()
        .skip(5)
        .enumerate()
        .map(|(i, mut d)| {
            d.nsd_name = format!("new{i}");
            d
        })
        .collect();
    fs.add_disks(new).unwrap();
    restripe(&fs, RestripeMode::Replicate);
    files.extend(write_files(&fs, "b", 32));
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after replacing a failure group");
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert_eq!(report.ill_replicated_metadata, 0, "{report:?}");

    // Group 1 may go now: group 4 and the descriptor tiebreaker hold everything.
    let fs = FileSystem::mount(without(&t, &[0, 1, 2, 3])).unwrap();
    verify_all(&fs, &files);
    fs.unmount().unwrap();
}

/// `fs change -m 2` [mmchfs -m] on a mounted file system: from then on the metadata is
/// written twice, `restripe -r` gives what was on disk before its second copy, and then
/// either failure group may go. Lowering it again is refused.
#[test]
fn metadata_replication_is_turned_on_for_a_live_file_system() {
    let t = make_disks(5, 64 << 20);
    let one_copy = FormatOptions {
        metadata_replicas: 1,
        ..opts()
    };
    tessera_fs::format(specs_in_groups(&t, &GROUPS), &one_copy, &mut |_| {}).unwrap();
    let fs = mount(&t);
    let mut files = write_files(&fs, "a", 41);
    fs.set_metadata_replication(2).unwrap();
    assert_eq!(fs.descriptor().metadata_replicas(), 2);
    files.extend(write_files(&fs, "b", 42));
    verify_all(&fs, &files);
    let err = fs.set_metadata_replication(1).unwrap_err().to_string();
    assert!(err.contains("not implemented"), "{err}");
    let report = restripe(&fs, RestripeMode::Replicate);
    assert!(report.progress.metadata_pages_moved > 0, "{report:?}");
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after fs change -m 2 and restripe -r");
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert_eq!(report.ill_replicated_metadata, 0, "{report:?}");
    for gone in [GROUP_1, GROUP_2] {
        let fs = FileSystem::mount(without(&t, &gone)).unwrap();
        verify_all(&fs, &files);
        fs.unmount().unwrap();
        drop(fs);
        mount(&t).unmount().unwrap();
    }
}

/// A crash at any write of `fs change -m 2` leaves a file system that mounts, with one
/// metadata copy or two, and holds every file.
#[test]
fn a_crash_at_any_write_of_turning_metadata_replication_on_loses_nothing() {
    use std::sync::atomic::Ordering;
    let mut writes = 0;
    let mut both_outcomes = (false, false);
    loop {
        let t = make_disks(5, 64 << 20);
        let one_copy = FormatOptions {
            metadata_replicas: 1,
            ..opts()
        };
        tessera_fs::format(specs_in_groups(&t, &GROUPS), &one_copy, &mut |_| {}).unwrap();
        let fs = mount(&t);
        let files = write_files(&fs, "a", 51);
        fs.unmount().unwrap();
        drop(fs);
        let (disks, faults) = with_faults(&t);
        let fs = FileSystem::mount(disks).unwrap();
        faults.writes_until_failure.store(writes, Ordering::SeqCst);
        let done = fs.set_metadata_replication(2).is_ok();
        let crashed = crash(fs, &faults);
        let fs = mount(&t);
        verify_all(&fs, &files);
        let copies = fs.descriptor().metadata_replicas();
        if copies == 2 {
            both_outcomes.1 = true;
        } else {
            both_outcomes.0 = true;
        }
        fs.unmount().unwrap();
        drop(fs);
        assert_fsck_clean(&t, &format!("crash after {writes} writes"));
        if done && !crashed {
            break;
        }
        writes += 1;
        assert!(writes < 2000, "the change never completes");
    }
    assert!(both_outcomes.0 && both_outcomes.1, "{both_outcomes:?}");
}

/// 160 MiB disks in the groups of [`GROUPS`], 64 KiB blocks (allocation region 1 is the
/// last 33 MiB of each disk), `-m 2 -r 2`; the manager mounted with owner slot 1 made,
/// region 1 given to it and directory `node1` made for it.
fn replicated_fs_with_a_slot() -> (TestDisks, Arc<FileSystem>, tessera_fs::Ino) {
    fs_with_a_slot(2)
}

/// [`replicated_fs_with_a_slot`] with `metadata_replicas` metadata copies.
fn fs_with_a_slot(metadata_replicas: u8) -> (TestDisks, Arc<FileSystem>, tessera_fs::Ino) {
    let t = make_disks(5, 160 << 20);
    let opts = FormatOptions {
        block_size: 64 << 10,
        log_bytes: 4 << 20,
        placement: tessera_fs::Placement::Cluster,
        metadata_replicas,
        ..opts()
    };
    tessera_fs::format(specs_in_groups(&t, &GROUPS), &opts, &mut |_| {}).unwrap();
    let fs = mount(&t);
    assert_eq!(fs.create_slot().unwrap(), 1);
    fs.give_free_regions(1, &[1]).unwrap();
    let root = tessera_fs::Caller { uid: 0, gid: 0 };
    let d = fs
        .make_directory_for_slot(ROOT_INO, b"node1", 0o755, root, 1)
        .unwrap();
    (t, fs, d.ino)
}

/// Slot 1's region as the manager's descriptor lists it: (failure group of the first
/// copy's disk, the second copy's state).
fn slot_log_copies(fs: &FileSystem) -> (Vec<usize>, tessera_fs::slot::SlotSecondCopy) {
    let desc = fs.descriptor();
    let region = desc.slot_regions()[0].clone();
    assert_eq!(region.slot, 1);
    let second = region.second.expect("a -m 2 slot region has two copies");
    let first_group = if GROUP_1.contains(&(region.disk as usize)) {
        GROUP_1.to_vec()
    } else {
        GROUP_2.to_vec()
    };
    assert!(
        !first_group.contains(&(second.disk as usize)),
        "the copies of slot 1's region share a failure group: {region:?}"
    );
    (first_group, second)
}

/// The failure group that is not `group`.
fn other_group(group: &[usize]) -> Vec<usize> {
    if group == GROUP_1 {
        GROUP_2.to_vec()
    } else {
        GROUP_1.to_vec()
    }
}

/// Owner slot 1 does not mount without `group`, which holds its only current log copy.
fn assert_slot_refused_without(fs: &Arc<FileSystem>, t: &TestDisks, group: &[usize]) {
    let err = slot_owner(fs, without(t, group)).unwrap_err().to_string();
    assert!(
        err.contains("no current copy of the log of owner slot 1"),
        "{err}"
    );
}

/// Owner slot 1 mounted on `disks`, reaching the manager `fs` in this process.
fn slot_owner(fs: &Arc<FileSystem>, disks: Disks) -> tessera_fs::FsResult<Arc<FileSystem>> {
    let s1 = FileSystem::mount_slot(disks, 1)?;
    s1.route_metadata_through(Box::new(tessera_fs::InProcessOwner(Arc::downgrade(fs))));
    Ok(s1)
}

/// Small files written in `dir` through `fs`, the last one fsynced; name -> content.
fn slot_files(fs: &FileSystem, dir: tessera_fs::Ino, prefix: &str) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for i in 0..40u64 {
        let name = format!("{prefix}{i}");
        let a = create_file(fs, dir, name.as_bytes());
        let data = pattern(
            100 + (i as usize * 997) % 20_000,
            i + prefix.len() as u64 * 100,
        );
        fs.write(a.ino, 0, &data, false).unwrap();
        files.insert(name, data);
    }
    let last = fs.lookup(dir, format!("{prefix}39").as_bytes()).unwrap();
    fs.fsync(last.ino).unwrap();
    fs.sync().unwrap();
    files
}

fn verify_in(fs: &FileSystem, dir: tessera_fs::Ino, files: &BTreeMap<String, Vec<u8>>) {
    for (name, data) in files {
        let a = fs.lookup(dir, name.as_bytes()).unwrap();
        assert_eq!(a.size, data.len() as u64, "{name}");
        let got = fs.read(a.ino, 0, data.len() as u32 + 10).unwrap();
        assert!(got == *data, "{name}: content differs");
    }
}

/// A crash of a slot's owner: nothing more of it reaches the disks.
fn crash_slot(s1: Arc<FileSystem>) {
    s1.fence();
    drop(s1);
}

#[test]
fn a_slot_owner_writes_both_copies_of_its_log_and_either_group_brings_it_back() {
    let (t, fs, dir) = replicated_fs_with_a_slot();
    let (first, second) = slot_log_copies(&fs);
    assert_eq!(second.log_behind, None);
    let other = other_group(&first);
    let s1 = slot_owner(&fs, t.reopen()).unwrap();
    let mut files = slot_files(&s1, dir, "a");
    // Only in the log: a crash before any checkpoint of the slot.
    crash_slot(s1);

    // Either copy alone replays it: first the second copy, with the first copy's group
    // gone (and nothing written, so nothing is recorded)...
    let s1 = slot_owner(&fs, without(&t, &first)).unwrap();
    verify_in(&s1, dir, &files);
    crash_slot(s1);
    assert_eq!(slot_log_copies(&fs).1.log_behind, None);
    // ...then the first copy, with the other group gone; the slot, writing one copy from
    // then on, has the manager record the second behind before its first record lands.
    let s1 = slot_owner(&fs, without(&t, &other)).unwrap();
    verify_in(&s1, dir, &files);
    files.extend(slot_files(&s1, dir, "b"));
    assert_eq!(slot_log_copies(&fs).1.log_behind, Some(1));
    crash_slot(s1);
    // The copy that lacks records is never replayed alone.
    assert_slot_refused_without(&fs, &t, &first);

    // Both groups back: the mount replays the current copy and copies it onto the other;
    // its next write records both current.
    let s1 = slot_owner(&fs, t.reopen()).unwrap();
    verify_in(&s1, dir, &files);
    files.extend(slot_files(&s1, dir, "c"));
    assert_eq!(slot_log_copies(&fs).1.log_behind, None);
    crash_slot(s1);
    let s1 = slot_owner(&fs, t.reopen()).unwrap();
    verify_in(&s1, dir, &files);
    s1.unmount().unwrap();
    fs.unmount().unwrap();
    drop((s1, fs));
    assert_fsck_clean(&t, "after a slot's log copies were lost in turn");
}

#[test]
fn a_slot_log_copy_that_vanishes_under_its_owner_is_recorded_behind_before_anything_lands_on_one_copy(
) {
    use std::sync::atomic::Ordering;
    let (t, fs, dir) = replicated_fs_with_a_slot();
    let (first, _) = slot_log_copies(&fs);
    let other = other_group(&first);
    // The slot's owner reaches the second copy's group through a switch; the manager
    // reaches every disk.
    let (disks, faults) = with_vanishing(&t, &other);
    let s1 = slot_owner(&fs, disks).unwrap();
    let mut files = slot_files(&s1, dir, "a");
    // What is written while the group is gone goes to a directory of its own, whose pages
    // nothing after touches: they keep one copy until `restripe -r`.
    let root = tessera_fs::Caller { uid: 0, gid: 0 };
    let vb = s1
        .create_node(
            dir,
            b"vb",
            tessera_fs::FileKind::Directory,
            0o755,
            0,
            root,
            None,
        )
        .unwrap()
        .ino;
    s1.checkpoint().unwrap();
    faults.vanished.store(true, Ordering::SeqCst);
    let mut vfiles = slot_files(&s1, vb, "b");
    for i in 0..8 {
        vfiles.extend(slot_files(&s1, vb, &format!("b{i}-")));
    }
    assert_eq!(slot_log_copies(&fs).1.log_behind, Some(1));
    // A checkpoint with one copy: its record and pages land on the first group alone.
    s1.checkpoint().unwrap();
    crash_slot(s1);

    // The first copy's group gone: refused by name, nothing replayed.
    assert_slot_refused_without(&fs, &t, &first);
    // Everything back: the slot mounts; what was written while the group was gone is in
    // the first group alone until `restripe -r` (nothing is read here: a read's access
    // time would rewrite the pages it passes at the next checkpoint, with both copies).
    let s1 = slot_owner(&fs, t.reopen()).unwrap();
    s1.unmount().unwrap();
    fs.unmount().unwrap();
    drop((s1, fs));
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert!(report.ill_replicated_metadata > 0, "{report:?}");

    // restripe -r on the manager, the slot's owner live: what the slot wrote with one
    // copy (its pages, map chunks, log and data) gets its second, so that the first
    // copy's group may go now.
    let fs = mount(&t);
    let s1 = slot_owner_reached(&fs, t.reopen());
    let report = restripe(&fs, RestripeMode::Replicate);
    assert!(report.unreached_slots.is_empty(), "{report:?}");
    assert!(report.progress.blocks_moved > 0, "{report:?}");
    assert!(report.progress.metadata_pages_moved > 0, "{report:?}");
    assert_eq!(slot_log_copies(&fs).1.log_behind, None);
    s1.unmount().unwrap();
    fs.unmount().unwrap();
    drop((s1, fs));
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(
        (report.ill_replicated_blocks, report.ill_replicated_metadata),
        (0, 0),
        "{report:?}"
    );
    let fs = mount(&t);
    let s1 = slot_owner(&fs, without(&t, &first)).unwrap();
    verify_in(&s1, dir, &files);
    verify_in(&s1, vb, &vfiles);
    files.extend(slot_files(&s1, dir, "e"));
    crash_slot(s1);
    let s1 = slot_owner(&fs, t.reopen()).unwrap();
    verify_in(&s1, dir, &files);
    verify_in(&s1, vb, &vfiles);
    s1.unmount().unwrap();
    fs.unmount().unwrap();
    drop((s1, fs));
    assert_fsck_clean(&t, "after a slot's log copy vanished under it");
}

#[test]
fn a_slot_owner_with_two_log_copies_killed_at_every_write_loses_no_fsynced_byte() {
    use std::sync::atomic::Ordering;
    let (t, fs, dir) = replicated_fs_with_a_slot();
    let (first, _) = slot_log_copies(&fs);
    let mut synced: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut crashes = 0;
    let mut refused = 0;
    for k in 1..600i64 {
        let (disks, faults) = with_faults(&t);
        let s1 = slot_owner(&fs, disks).unwrap();
        faults.writes_until_failure.store(k, Ordering::SeqCst);
        // Files made, written and fsynced, a checkpoint between them, an older file
        // removed: every fsync that returned holds after the crash, on either copy alone.
        let size = 9_000 + k as usize * 997 % 30_000;
        let result = fsynced_round(&s1, dir, k, size, &mut synced);
        let crashed = crash(s1, &faults);
        // The second copy alone, unless the descriptor says it missed a write (the cut
        // fell on it, and the slot had it recorded before going on with one copy).
        match slot_owner(&fs, without(&t, &first)) {
            Ok(s1) => {
                verify_in(&s1, dir, &synced);
                crash_slot(s1);
            }
            Err(e) => {
                assert_eq!(slot_log_copies(&fs).1.log_behind, Some(1), "{e}");
                refused += 1;
            }
        }
        // Both: the longer copy replayed and copied onto the other.
        let s1 = slot_owner(&fs, t.reopen()).unwrap();
        verify_in(&s1, dir, &synced);
        s1.unmount().unwrap();
        drop(s1);
        assert_eq!(slot_log_copies(&fs).1.log_behind, None, "cut at write {k}");
        if !crashed {
            result.unwrap();
            break;
        }
        crashes += 1;
    }
    assert!(crashes > 5, "the work crossed only {crashes} writes");
    eprintln!("{crashes} cuts; the second copy was refused after {refused} of them");
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(
        &t,
        "after a slot with two log copies was cut at every write",
    );
}

/// Owner slot 1 mounted on `disks` beside the manager `fs`, each reaching the other in this
/// process (the manager asks the slot to move its region, the slot asks the manager to
/// record its log copies' state).
fn slot_owner_reached(fs: &Arc<FileSystem>, disks: Disks) -> Arc<FileSystem> {
    let s1 = slot_owner(fs, disks).unwrap();
    route_slot_1_to(fs, &s1);
    s1
}

/// The manager `fs` reaches slot 1's owner `s1` in this process.
fn route_slot_1_to(fs: &FileSystem, s1: &Arc<FileSystem>) {
    let weak = Arc::downgrade(s1);
    fs.route_slots_through(Box::new(move |slot| {
        (slot == 1).then(|| {
            Box::new(tessera_fs::InProcessOwner(weak.clone()))
                as Box<dyn tessera_fs::MetanodeChannel>
        })
    }));
}

/// Owner slot 1 mounted from each failure group alone beside the manager `fs`, `files`
/// verified in `dir` and the slot crashed (nothing written: nothing recorded); a mount may
/// be refused only because the descriptor calls that group's copy of the slot's region (or
/// of the region a move reserves) behind. Returns how many were refused.
fn each_group_alone_reads(
    fs: &Arc<FileSystem>,
    t: &TestDisks,
    dir: tessera_fs::Ino,
    files: &BTreeMap<String, Vec<u8>>,
    when: &str,
) -> usize {
    let mut refused = 0;
    for gone in [GROUP_1, GROUP_2] {
        match slot_owner(fs, without(t, &gone)) {
            Ok(s1) => {
                verify_in(&s1, dir, files);
                crash_slot(s1);
            }
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains("no current copy"), "{when}: {e}");
                let desc = fs.descriptor();
                let behind = desc
                    .slot_regions()
                    .iter()
                    .chain(desc.slot_moves.iter().flatten())
                    .any(|r| r.second.is_some_and(|s| s.log_behind.is_some()));
                assert!(behind, "{when}: refused without a copy called behind: {e}");
                refused += 1;
            }
        }
    }
    refused
}

/// fsck of the file system on `t` (unmounted) finds no problem and no metadata with fewer
/// copies than the file system keeps.
fn assert_fsck_clean_and_replicated(t: &TestDisks) {
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.ill_replicated_metadata, 0, "{report:?}");
}

/// Owner slot 1 mounted with every disk beside the manager `fs`: `files` verify in `dir`;
/// then both unmount and fsck is clean.
fn slot_reads_then_fsck(
    t: &TestDisks,
    fs: Arc<FileSystem>,
    dir: tessera_fs::Ino,
    files: &BTreeMap<String, Vec<u8>>,
    when: &str,
) {
    let s1 = slot_owner(&fs, t.reopen()).unwrap();
    verify_in(&s1, dir, files);
    s1.unmount().unwrap();
    fs.unmount().unwrap();
    drop((s1, fs));
    assert_fsck_clean(t, when);
}

/// Slot 1's region as the manager `fs`'s descriptor names it.
fn slot_region(fs: &FileSystem) -> tessera_fs::slot::SlotRegion {
    let desc = fs.descriptor();
    let region = desc.slot_regions().iter().find(|r| r.slot == 1);
    region.expect("slot 1 has a region").clone()
}

fn nsd_name(fs: &FileSystem, index: u16) -> String {
    let desc = fs.descriptor();
    let disk = desc.disks.iter().find(|d| d.index == index).unwrap();
    disk.nsd_name.clone()
}

/// `disk delete` of the disk holding the first copy of a live `-m 2` slot's region (its
/// records and log), with changes in the slot's log that no checkpoint covers: the slot
/// moves itself to a new region with two copies in two failure groups (a checkpoint, a new
/// mirrored log continuing its LSNs, a record on both copies there, a forward on both
/// copies of the old region), and the manager commits the new place (refused before, with
/// "not built yet"). Files written after the move come back from either new copy alone,
/// and fsck is clean.
#[test]
fn a_disk_holding_a_copy_of_a_live_slots_region_is_deleted_beside_its_owner() {
    let (t, fs, dir) = replicated_fs_with_a_slot();
    let s1 = slot_owner_reached(&fs, t.reopen());
    let mut files = slot_files(&s1, dir, "a");
    s1.checkpoint().unwrap();
    files.extend(slot_files(&s1, dir, "b"));
    let old = slot_region(&fs);
    let victim = [nsd_name(&fs, old.disk)];
    fs.mark_disks_for_delete(&victim).unwrap();
    s1.follow_descriptor().unwrap();
    let report = fs
        .delete_disks(&victim, &AtomicBool::new(false), &mut |_| {})
        .unwrap();
    assert_eq!(report.deleted, vec![old.disk], "{report:?}");
    assert!(
        report.restripe.progress.slot_regions_moved > 0,
        "{report:?}"
    );
    let new = slot_region(&fs);
    assert_eq!(fs.descriptor().slot_moves, None, "the reservation ended");
    assert_ne!(new.log_id, old.log_id, "a new log at the new place");
    let (_, second) = slot_log_copies(&fs);
    assert_eq!(second.log_behind, None);
    assert!(new.copies().iter().all(|(d, _)| *d != old.disk), "{new:?}");
    verify_in(&s1, dir, &files);
    files.extend(slot_files(&s1, dir, "c"));
    crash_slot(s1);

    // Either new copy alone holds everything (nothing written, so nothing recorded).
    let when = "after a -m 2 slot's region moved under its owner";
    assert_eq!(each_group_alone_reads(&fs, &t, dir, &files, when), 0);
    assert_eq!(slot_log_copies(&fs).1.log_behind, None);
    slot_reads_then_fsck(&t, fs, dir, &files, when);
}

/// The same move with the slot's owner cut by a crash at every write (its checkpoint, the
/// new mirrored log's format on both copies, its record there, the forward on each copy of
/// the old region, the files it writes and fsyncs after): after every cut, the slot mounts
/// from each failure group alone unless the descriptor calls that group's copy behind, and
/// from both, with every fsynced file, in one region, old or new; fsck is clean.
#[test]
fn a_live_slot_region_move_with_two_copies_cut_by_a_crash_of_the_slot_at_every_write() {
    use std::sync::atomic::Ordering;
    let (t, fs, dir) = replicated_fs_with_a_slot();
    let s1 = slot_owner_reached(&fs, t.reopen());
    let mut synced = slot_files(&s1, dir, "s");
    let victim = slot_region(&fs).disk;
    fs.mark_disks_for_delete(&[nsd_name(&fs, victim)]).unwrap();
    s1.follow_descriptor().unwrap();
    s1.unmount().unwrap();
    fs.unmount().unwrap();
    drop((s1, fs));
    let mut crashes = 0;
    let mut refused = 0;
    for k in 1..400i64 {
        let fs = mount(&t);
        let (disks, faults) = with_faults(&t);
        let s1 = slot_owner_reached(&fs, disks);
        faults.writes_until_failure.store(k, Ordering::SeqCst);
        let result = fs.restripe(RestripeMode::Migrate, &AtomicBool::new(false), &mut |_| {});
        // What the slot writes after the move, at the new place, fsynced (a failure ends
        // the round: the cut fell before).
        let size = 5_000 + k as usize * 131 % 9_000;
        let _ = fsynced_round(&s1, dir, k, size, &mut synced);
        let crashed = crash(s1, &faults);
        let when = format!("slot owner killed at write {k}");
        refused += each_group_alone_reads(&fs, &t, dir, &synced, &when);
        let s1 = slot_owner(&fs, t.reopen()).unwrap();
        verify_in(&s1, dir, &synced);
        let region = slot_region(&fs);
        let moved = region.copies().iter().all(|(d, _)| *d != victim)
            && fs.descriptor().slot_moves.is_none();
        s1.unmount().unwrap();
        fs.unmount().unwrap();
        drop((s1, fs));
        assert_fsck_clean(&t, &when);
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
    eprintln!("{crashes} cuts; a one-group mount was refused after {refused} of them");
    assert!(
        crashes > 5,
        "the move took only {crashes} writes of the slot"
    );
}

/// `restripe -r` with the disk of the second copy of a live `-m 2` slot's region stopped
/// [mmchdisk stop]: the slot, writing its log's first copy alone (the second recorded
/// behind), moves to a region on disks that are up; the forward lands on the old region's
/// current copy only, which is all a reader of that region would read. Everything written
/// before and after the move comes back without the stopped disk; fsck is clean once it
/// is started again.
#[test]
fn a_live_slots_region_moves_off_a_stopped_disk_under_its_owner() {
    let (t, fs, dir) = replicated_fs_with_a_slot();
    let s1 = slot_owner_reached(&fs, t.reopen());
    let mut files = slot_files(&s1, dir, "a");
    s1.checkpoint().unwrap();
    let old = slot_region(&fs);
    let stopped = old.second.unwrap().disk;
    let name = [nsd_name(&fs, stopped)];
    fs.stop_disks(&name).unwrap();
    s1.stop_disks(&name).unwrap();
    files.extend(slot_files(&s1, dir, "b"));
    assert_eq!(slot_log_copies(&fs).1.log_behind, Some(1));

    let report = restripe(&fs, RestripeMode::Replicate);
    assert!(report.unreached_slots.is_empty(), "{report:?}");
    assert!(report.progress.slot_regions_moved > 0, "{report:?}");
    let new = slot_region(&fs);
    assert!(new.copies().iter().all(|(d, _)| *d != stopped), "{new:?}");
    assert_ne!(new.log_id, old.log_id);
    assert_eq!(fs.descriptor().slot_moves, None);
    verify_in(&s1, dir, &files);
    files.extend(slot_files(&s1, dir, "c"));
    crash_slot(s1);

    let s1 = slot_owner(&fs, without(&t, &[stopped as usize])).unwrap();
    verify_in(&s1, dir, &files);
    s1.unmount().unwrap();
    drop(s1);
    fs.start_disks(&name).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after a slot's region moved off a stopped disk");
}

/// The way from a slot's owner to whichever manager is mounted now, as a node's transport
/// leads to the node the cluster names file system manager.
#[derive(Clone, Default)]
struct CurrentManager(Arc<std::sync::Mutex<std::sync::Weak<FileSystem>>>);

impl tessera_fs::MetanodeChannel for CurrentManager {
    fn call(&self, request: Vec<u8>) -> tessera_fs::FsResult<Vec<u8>> {
        let manager = self.0.lock().unwrap().upgrade();
        let manager = manager.ok_or_else(|| {
            tessera_fs::FsError::Io(std::io::Error::other("no file system manager mounted"))
        })?;
        Ok(manager.serve_metanode_request(&request))
    }
}

/// The manager `fs` and slot 1's live owner `s1` (whose way to the manager is `route`)
/// reaching each other again, a manager mounted anew.
fn reconnect(fs: &Arc<FileSystem>, s1: &Arc<FileSystem>, route: &CurrentManager) {
    *route.0.lock().unwrap() = Arc::downgrade(fs);
    s1.take_from_owner_map().unwrap();
    route_slot_1_to(fs, s1);
}

/// `restripe -m` moving a live `-m 2` slot's region off a disk marked to be emptied, the
/// manager cut by a crash at every write (the reservation, the settling, the commit that
/// names the new region, the descriptor writes in between): the slot's owner, live
/// throughout, reaches each manager mounted after a cut, writes, fsyncs and checkpoints
/// there, in whichever region it is; the run that is not cut ends the move. Then the slot
/// killed: every fsynced file comes back from either group alone (unless the descriptor
/// calls that copy behind) and from both, and fsck is clean.
#[test]
fn a_live_slot_region_move_with_two_copies_cut_by_a_crash_of_the_manager_at_every_write() {
    use std::sync::atomic::Ordering;
    let (t, fs, dir) = replicated_fs_with_a_slot();
    let route = CurrentManager::default();
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    s1.route_metadata_through(Box::new(route.clone()));
    reconnect(&fs, &s1, &route);
    let mut synced = slot_files(&s1, dir, "s");
    let victim = slot_region(&fs).disk;
    fs.mark_disks_for_delete(&[nsd_name(&fs, victim)]).unwrap();
    s1.follow_descriptor().unwrap();
    fs.unmount().unwrap();
    drop(fs);
    // A first run by a manager that cannot reach the slot moves everything else off the
    // disk and leaves the slot's move reserved: the cuts below fall on settling it.
    let fs = mount(&t);
    *route.0.lock().unwrap() = Arc::downgrade(&fs);
    let unreached = fs.restripe(RestripeMode::Migrate, &AtomicBool::new(false), &mut |_| {});
    assert!(unreached.is_err(), "{unreached:?}");
    assert!(
        fs.descriptor().slot_moves.is_some(),
        "the move stays reserved"
    );
    fs.unmount().unwrap();
    drop(fs);
    let mut left_reserved = 0;
    for k in 1..600i64 {
        let (disks, faults) = with_faults(&t);
        let fs = FileSystem::mount(disks).unwrap();
        reconnect(&fs, &s1, &route);
        faults.writes_until_failure.store(k, Ordering::SeqCst);
        let result = fs.restripe(RestripeMode::Migrate, &AtomicBool::new(false), &mut |_| {});
        let crashed = crash(fs, &faults);
        let fs = mount(&t);
        reconnect(&fs, &s1, &route);
        left_reserved += usize::from(fs.descriptor().slot_moves.is_some());
        s1.follow_descriptor().unwrap();
        fsynced_round(&s1, dir, k, 3_000 + k as usize * 97 % 7_000, &mut synced).unwrap();
        verify_in(&s1, dir, &synced);
        let moved = slot_region(&fs).copies().iter().all(|(d, _)| *d != victim)
            && fs.descriptor().slot_moves.is_none();
        fs.unmount().unwrap();
        drop(fs);
        if !crashed {
            result.unwrap();
            assert!(
                moved,
                "write {k}: the restripe ended with the slot on the disk"
            );
            eprintln!("{} manager crashes before the move ended", k - 1);
            assert!(k > 3, "the move took only {k} writes of the manager");
            break;
        }
    }
    eprintln!("a cut left the move reserved {left_reserved} times");
    crash_slot(s1);
    let fs = mount(&t);
    let when = "after a -m 2 slot's region moved through manager crashes";
    each_group_alone_reads(&fs, &t, dir, &synced, when);
    slot_reads_then_fsck(&t, fs, dir, &synced, when);
}

/// A chunk of the stored allocation map whose two copies differ (here the second region
/// copy of disk 0's map lost chunk 0: a write that missed it looks the same to a reader)
/// is not a problem for fsck while the other copy reads, but counts as ill-replicated
/// metadata: a mount from the group holding the differing copy alone must rebuild the map
/// by a scan (and a slot, whose map cannot be rebuilt, would not mount). `restripe -r`
/// stores every chunk again, after which the count is 0 and that group alone reads the map.
#[test]
fn a_map_chunk_whose_copies_differ_counts_ill_replicated_until_restripe_r() {
    use std::io::{Seek, SeekFrom, Write};
    let t = replicated_fs();
    let fs = mount(&t);
    let files = write_files(&fs, "a", 6);
    let desc = fs.descriptor();
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean_and_replicated(&t);
    let copies = desc.metadata_copies.as_ref().unwrap();
    let second = copies.map_regions.iter().find(|m| m.disk == 0).unwrap();
    let first = desc
        .alloc_map
        .as_ref()
        .unwrap()
        .regions
        .iter()
        .find(|r| r.disk == 0);
    let first = first.unwrap();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(t.dir.path().join(format!("d{}", second.on_disk)))
        .unwrap();
    f.seek(SeekFrom::Start(second.offset)).unwrap();
    f.write_all(&[0u8; 8192]).unwrap();
    f.sync_all().unwrap();
    drop(f);

    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.ill_replicated_metadata, 1, "{report:?}");
    let group_of = |disk: u16| {
        if GROUP_1.contains(&(disk as usize)) {
            GROUP_1
        } else {
            GROUP_2
        }
    };
    assert_ne!(group_of(first.on_disk), group_of(second.on_disk));
    let alone = || FileSystem::mount(without(&t, &group_of(first.on_disk))).unwrap();
    let fs = alone();
    assert!(
        fs.allocation_map_rebuilt().is_some(),
        "the damaged copy read"
    );
    fs.unmount().unwrap();
    drop(fs);

    let fs = mount(&t);
    restripe(&fs, RestripeMode::Replicate);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean_and_replicated(&t);
    let fs = alone();
    assert!(fs.allocation_map_rebuilt().is_none());
    verify_all(&fs, &files);
    fs.unmount().unwrap();
}

/// `fs change -m 2` [mmchfs -m 2] of a file system with a live owner slot, then `restripe
/// -r`: the slot's region, made with one copy, moves under its owner to a region with two
/// copies in two failure groups (before, `restripe -r` left it with one copy for good and
/// fsck counted it ill-replicated after every run), the slot's pages get their second
/// copies, fsck counts nothing ill-replicated, and either group alone brings back every
/// file of the slot.
#[test]
fn a_live_slots_region_gets_its_second_copy_when_metadata_replication_is_turned_on() {
    let (t, fs, dir) = fs_with_a_slot(1);
    let s1 = slot_owner_reached(&fs, t.reopen());
    let mut files = slot_files(&s1, dir, "a");
    s1.checkpoint().unwrap();
    assert_eq!(slot_region(&fs).second, None);

    fs.set_metadata_replication(2).unwrap();
    s1.follow_descriptor().unwrap();
    files.extend(slot_files(&s1, dir, "b"));
    let report = restripe(&fs, RestripeMode::Replicate);
    assert!(report.unreached_slots.is_empty(), "{report:?}");
    assert!(report.progress.slot_regions_moved > 0, "{report:?}");
    let (_, second) = slot_log_copies(&fs);
    assert_eq!(second.log_behind, None);
    files.extend(slot_files(&s1, dir, "c"));
    verify_in(&s1, dir, &files);
    s1.unmount().unwrap();
    fs.unmount().unwrap();
    drop((s1, fs));
    assert_fsck_clean_and_replicated(&t);

    let fs = mount(&t);
    let when = "after -m 2 was turned on beside a live slot";
    assert_eq!(each_group_alone_reads(&fs, &t, dir, &files, when), 0);
    slot_reads_then_fsck(&t, fs, dir, &files, when);
}

/// `restripe -r` with the whole failure group of a live slot's second region copy stopped:
/// the region moves off the stopped disk to two copies in the one group left (nothing
/// else has room) and the restripe ends; with the group started again, the next `restripe
/// -r` parts the copies, and fsck counts nothing ill-replicated.
#[test]
fn a_live_slots_region_stays_in_one_group_until_another_has_room() {
    let (t, fs, dir) = replicated_fs_with_a_slot();
    let s1 = slot_owner_reached(&fs, t.reopen());
    let mut files = slot_files(&s1, dir, "a");
    let (first, second) = slot_log_copies(&fs);
    let stopped: Vec<String> = other_group(&first)
        .iter()
        .map(|&d| nsd_name(&fs, d as u16))
        .collect();
    assert!(other_group(&first).contains(&(second.disk as usize)));
    fs.stop_disks(&stopped).unwrap();
    s1.stop_disks(&stopped).unwrap();
    files.extend(slot_files(&s1, dir, "b"));

    let report = restripe(&fs, RestripeMode::Replicate);
    assert!(report.unreached_slots.is_empty(), "{report:?}");
    let region = slot_region(&fs);
    assert!(
        region
            .copies()
            .iter()
            .all(|(d, _)| first.contains(&(*d as usize))),
        "{region:?}"
    );
    files.extend(slot_files(&s1, dir, "c"));

    fs.start_disks(&stopped).unwrap();
    s1.start_disks(&stopped).unwrap();
    let report = restripe(&fs, RestripeMode::Replicate);
    assert!(report.unreached_slots.is_empty(), "{report:?}");
    slot_log_copies(&fs);
    verify_in(&s1, dir, &files);
    s1.unmount().unwrap();
    fs.unmount().unwrap();
    drop((s1, fs));
    assert_fsck_clean_and_replicated(&t);
}

/// `restripe -r` after `fs change -m 2` on a manager that reaches no owner of slot 1 (its
/// node down): the manager's own metadata gets its second copies, the slot's pages and
/// one-copy region stay as they are and the report names the slot (before, the whole
/// restripe failed at its first step that asked the slot); the next `restripe -r` with the
/// slot's owner back finishes (settling the move of the region the first run reserved),
/// and fsck counts nothing ill-replicated.
#[test]
fn restripe_r_leaves_an_unreached_slot_as_it_is_and_names_it() {
    let (t, fs, dir) = fs_with_a_slot(1);
    let s1 = slot_owner(&fs, t.reopen()).unwrap();
    let files = slot_files(&s1, dir, "a");
    s1.unmount().unwrap();
    drop(s1);
    let mine = write_files(&fs, "m", 3);
    fs.set_metadata_replication(2).unwrap();
    fs.unmount().unwrap();
    drop(fs);

    let fs = mount(&t);
    let report = restripe(&fs, RestripeMode::Replicate);
    assert!(
        report.unreached_slots.iter().any(|(s, _)| *s == 1),
        "{report:?}"
    );
    assert!(report.progress.metadata_pages_moved > 0, "{report:?}");
    assert_eq!(slot_region(&fs).second, None);
    verify_all(&fs, &mine);

    let s1 = slot_owner_reached(&fs, t.reopen());
    let report = restripe(&fs, RestripeMode::Replicate);
    assert!(report.unreached_slots.is_empty(), "{report:?}");
    slot_log_copies(&fs);
    assert_eq!(fs.descriptor().slot_moves, None);
    verify_in(&s1, dir, &files);
    s1.unmount().unwrap();
    fs.unmount().unwrap();
    drop((s1, fs));
    assert_fsck_clean_and_replicated(&t);
}
