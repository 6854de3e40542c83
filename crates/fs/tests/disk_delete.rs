//! Deleting disks from a mounted file system [mmdeldisk]: the disk holding the recovery
//! log, the allocation map's regions, a descriptor copy, metadata pages and data is emptied
//! while files keep changing, removed, and the file system mounts without it (given the
//! device or not), fsck clean, and takes the device back as a new disk. Deletions that
//! cannot work are refused before anything moves. A crash at every write of a deletion
//! leaves the disk either in the file system (to be emptied; the delete reruns) or gone,
//! with every synced byte intact.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};

use common::*;
use tessera_fs::{DiskSpec, DiskStatus, FileSystem, ROOT_INO};
use tessera_nsd::DiskUsage;

fn delete(fs: &FileSystem, nsd: &str) -> tessera_fs::disks::DiskDeleteReport {
    fs.delete_disks(&[nsd.to_string()], &AtomicBool::new(false), &mut |_| {})
        .unwrap()
}

/// The disk with the most on it: the log, the map regions and a descriptor copy start on
/// the first disk.
fn busiest(fs: &FileSystem) -> (u16, String) {
    let desc = fs.descriptor();
    let d = desc
        .disks
        .iter()
        .find(|d| d.index == desc.log.disk)
        .unwrap();
    (d.index, d.nsd_name.clone())
}

#[test]
fn a_deleted_disk_leaves_nothing_behind_and_comes_back_as_a_new_disk() {
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let mut files = populate(&fs, "a", 1);
    for i in 0..3000 {
        create_file(&fs, ROOT_INO, format!("m{i:05}").as_bytes());
    }
    fs.sync().unwrap();
    let (index, name) = busiest(&fs);
    assert!(fs.descriptor().disks[usize::from(index)].holds_descriptor);
    assert!(fs.metadata_pages_per_disk().unwrap()[usize::from(index)] > 0 || index == 0);

    let report = delete(&fs, &name);
    assert_eq!(report.deleted, vec![index]);
    assert!(report.restripe.progress.log_moved, "{report:?}");
    let desc = fs.descriptor();
    assert_eq!(desc.disks.len(), 3);
    assert!(desc.disks.iter().all(|d| d.index != index));
    assert_eq!(desc.disks.iter().filter(|d| d.holds_descriptor).count(), 3);
    // The file system carries on without it.
    files.extend(populate(&fs, "b", 2));
    verify(&fs, &files);
    fs.unmount().unwrap();
    drop(fs);

    // Mounts given every device (the deleted one is ignored) and without the deleted one.
    let fs = mount(&t);
    assert_eq!(fs.descriptor().disks.len(), 3);
    verify(&fs, &files);
    fs.unmount().unwrap();
    drop(fs);
    let without: Vec<_> = t
        .reopen()
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != usize::from(index))
        .map(|(_, d)| d)
        .collect();
    let fs = FileSystem::mount(without).unwrap();
    verify(&fs, &files);
    for i in (0..3000).step_by(13) {
        fs.lookup(ROOT_INO, format!("m{i:05}").as_bytes()).unwrap();
    }
    // The device comes back as a new disk, under a new index.
    let (id, dev) = t.reopen()[usize::from(index)].clone();
    let added = fs
        .add_disks(vec![DiskSpec {
            nsd_name: name.clone(),
            nsd_id: id,
            usage: DiskUsage::DataAndMetadata,
            failure_group: 9,
            pool: "system".into(),
            device: dev,
        }])
        .unwrap();
    assert_eq!(added, vec![4]);
    files.extend(populate(&fs, "c", 3));
    verify(&fs, &files);
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&t);
    assert_eq!(fs.descriptor().disks.len(), 4);
    verify(&fs, &files);
    fs.unmount().unwrap();
    drop(fs);
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[test]
fn a_delete_that_cannot_work_is_refused_before_anything_moves() {
    let t = make_disks(2, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let before = fs.descriptor();
    for (names, want) in [
        (vec!["nope".to_string()], "not a disk"),
        (vec!["nsd0".into(), "nsd1".into()], "every disk"),
        (vec!["nsd0".into(), "nsd0".into()], "listed twice"),
        (vec![], "no disks"),
    ] {
        let e = fs
            .delete_disks(&names, &AtomicBool::new(false), &mut |_| {})
            .unwrap_err();
        assert!(e.to_string().contains(want), "{names:?}: {e}");
    }
    // More than the other disk can take.
    let mut files = std::collections::BTreeMap::new();
    for i in 0..3 {
        let a = create_file(&fs, ROOT_INO, format!("big{i}").as_bytes());
        let data = pattern(25 << 20, i);
        for (j, chunk) in data.chunks(1 << 20).enumerate() {
            fs.write(a.ino, (j << 20) as u64, chunk, false).unwrap();
        }
        files.insert(format!("big{i}"), data);
    }
    fs.sync().unwrap();
    let e = fs
        .delete_disks(&["nsd0".to_string()], &AtomicBool::new(false), &mut |_| {})
        .unwrap_err();
    assert!(e.to_string().contains("MiB free"), "{e}");
    assert_eq!(
        fs.descriptor().disks,
        before.disks,
        "a refused delete changed the disks"
    );
    verify(&fs, &files);
    fs.unmount().unwrap();
}

#[test]
fn a_crash_at_any_write_of_a_disk_delete_loses_nothing() {
    let mut crash_at = 1;
    let (mut gone, mut stayed) = (0, 0);
    loop {
        let t = make_disks(4, 64 << 20);
        format_fs(&t, &small_opts());
        let (sim, faults) = with_faults(&t);
        let fs = FileSystem::mount(sim).unwrap();
        let files = populate(&fs, "kept-", 5);
        for i in 0..1000 {
            create_file(&fs, ROOT_INO, format!("m{i:05}").as_bytes());
        }
        fs.sync().unwrap();
        let (index, name) = busiest(&fs);
        faults
            .writes_until_failure
            .store(crash_at, Ordering::SeqCst);
        let result = fs.delete_disks(
            std::slice::from_ref(&name),
            &AtomicBool::new(false),
            &mut |_| {},
        );
        let crashed = crash(fs, &faults);
        if let Err(e) = &result {
            assert!(
                crashed,
                "crash at write {crash_at}: failed without a crash: {e}"
            );
        }

        let fs = FileSystem::mount(t.reopen())
            .unwrap_or_else(|e| panic!("crash at write {crash_at}: mount failed: {e}"));
        verify(&fs, &files);
        let present = fs.descriptor().disks.iter().any(|d| d.index == index);
        if result.is_ok() {
            assert!(
                !present,
                "crash at write {crash_at}: a delete that returned is durable"
            );
        }
        if present {
            stayed += 1;
            let d = fs.descriptor().disks[usize::from(index)].clone();
            assert!(
                d.status == DiskStatus::Ready || d.status == DiskStatus::ToBeEmptied,
                "{d:?}"
            );
            delete(&fs, &name);
        } else {
            gone += 1;
        }
        assert!(fs.descriptor().disks.iter().all(|d| d.index != index));
        for i in (0..1000).step_by(17) {
            fs.lookup(ROOT_INO, format!("m{i:05}").as_bytes())
                .unwrap_or_else(|e| panic!("crash at write {crash_at}: m{i:05}: {e}"));
        }
        create_file(&fs, ROOT_INO, b"after");
        verify(&fs, &files);
        fs.unmount().unwrap();
        drop(fs);
        assert_fsck_clean(&t, &format!("crash at write {crash_at}"));
        if !crashed {
            break;
        }
        crash_at += if crash_at < 60 { 1 } else { 4 };
        assert!(crash_at < 3000, "the delete never completed");
    }
    eprintln!("crash points: {stayed} with the disk still there, {gone} with it gone");
    assert!(
        stayed > 10 && gone > 0,
        "{stayed} before the commit, {gone} after"
    );
}
