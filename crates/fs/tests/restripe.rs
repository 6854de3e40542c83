//! Disks of a mounted file system: suspending a disk stops new allocations on it, a
//! migrating restripe (`-m`) moves every data block off it, a balancing restripe (`-b`)
//! evens out the disks, and every byte of every file (whole blocks, fragments, sparse
//! blocks, inline data) reads back the same, also after a remount, with fsck clean.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;

use common::*;
use tessera_fs::restripe::{RestripeMode, RestripeReport};
use tessera_fs::{DiskStatus, FileSystem, ROOT_INO};

/// Entries of directory `ino` other than `.` and `..`, read through readdir.
fn entries(fs: &FileSystem, ino: tessera_fs::Ino) -> usize {
    let mut n = 0;
    let mut after = 0;
    loop {
        let batch = fs.readdir(ino, after).unwrap();
        let Some(last) = batch.entries.last() else {
            return n;
        };
        after = last.0;
        n += batch
            .entries
            .iter()
            .filter(|e| e.3 != b"." && e.3 != b"..")
            .count();
    }
}

fn restripe(fs: &FileSystem, mode: RestripeMode) -> RestripeReport {
    let mut calls = 0;
    let report = fs
        .restripe(mode, &AtomicBool::new(false), &mut |_| calls += 1)
        .unwrap();
    assert!(calls > 0, "no progress reported");
    assert!(!report.stopped);
    report
}

#[test]
fn suspended_disks_get_nothing_new_and_migrate_empties_them() {
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let mut files = populate(&fs, "a", 1);
    let names: Vec<String> = vec!["nsd1".into()];
    fs.set_disk_status(&names, DiskStatus::Suspended).unwrap();
    assert_eq!(fs.descriptor().disks[1].status, DiskStatus::Suspended);
    let before = used(&fs)[1];
    files.extend(populate(&fs, "b", 2));
    assert_eq!(used(&fs)[1], before, "a suspended disk received new blocks");

    let report = restripe(&fs, RestripeMode::Migrate);
    assert!(report.progress.blocks_moved > 0, "{report:?}");
    assert!(report.progress.bytes_moved > 0, "{report:?}");
    verify(&fs, &files);
    fs.sync().unwrap();
    // Nothing is left to move: every data block of the disk went elsewhere.
    let again = restripe(&fs, RestripeMode::Migrate);
    assert_eq!(again.progress.blocks_moved, 0, "{again:?}");
    assert!(
        used(&fs)[1] < before,
        "the migrated disk holds as much as before"
    );

    // The status is part of the descriptor: it holds after a remount.
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&t);
    assert_eq!(fs.descriptor().disks[1].status, DiskStatus::Suspended);
    verify(&fs, &files);
    fs.set_disk_status(&names, DiskStatus::Ready).unwrap();
    files.extend(populate(&fs, "c", 3));
    verify(&fs, &files);
    fs.unmount().unwrap();
    drop(fs);
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[test]
fn balance_evens_out_the_disks() {
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    // Data lands on two disks only, then all four are ready again.
    let late: Vec<String> = vec!["nsd2".into(), "nsd3".into()];
    fs.set_disk_status(&late, DiskStatus::Suspended).unwrap();
    let mut files = BTreeMap::new();
    for round in 0..4 {
        files.extend(populate(&fs, &format!("r{round}-"), 10 + round));
    }
    fs.set_disk_status(&late, DiskStatus::Ready).unwrap();
    let skewed = used(&fs);
    assert!(skewed[1] > 4 * skewed[2], "{skewed:?}");

    let report = restripe(&fs, RestripeMode::Balance);
    assert!(report.progress.blocks_moved > 0, "{report:?}");
    fs.sync().unwrap();
    let even = used(&fs);
    let spread = |u: &[u64]| u.iter().max().unwrap() - u.iter().min().unwrap();
    let mean = even.iter().sum::<u64>() / even.len() as u64;
    // The log and metadata stay where they are, so the disks cannot be exactly even: the
    // spread shrinks to a fraction and the emptiest disk comes close to the average.
    assert!(
        spread(&even) < spread(&skewed) / 3 && *even.iter().min().unwrap() > mean * 3 / 4,
        "still uneven: {even:?} (was {skewed:?})"
    );
    verify(&fs, &files);
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&t);
    verify(&fs, &files);
    fs.unmount().unwrap();
    drop(fs);
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[test]
fn a_change_that_leaves_no_ready_disk_or_names_no_disk_is_refused() {
    let t = make_disks(2, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let all: Vec<String> = vec!["nsd0".into(), "nsd1".into()];
    let err = fs.set_disk_status(&all, DiskStatus::Suspended).unwrap_err();
    assert!(err.to_string().contains("no ready disk"), "{err}");
    let err = fs
        .set_disk_status(&["nsd9".to_string()], DiskStatus::Suspended)
        .unwrap_err();
    assert!(err.to_string().contains("nsd9 is not a disk"), "{err}");
    // Nothing changed.
    assert!(fs
        .descriptor()
        .disks
        .iter()
        .all(|d| d.status == DiskStatus::Ready));
    fs.unmount().unwrap();
}

/// `-m` also moves the metadata pages off a disk to be emptied, a checkpoint at a time,
/// while the namespace keeps changing; stopped half-way it continues where it was, and the
/// moved pages hold after a remount, with fsck clean.
#[test]
fn migrate_moves_metadata_pages_off_the_emptied_disk() {
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let files = populate(&fs, "a", 1);
    const NAMES: usize = 20_000;
    for i in 0..NAMES {
        create_file(&fs, ROOT_INO, format!("m{i:05}").as_bytes());
    }
    fs.checkpoint().unwrap();
    // A small pool: the relocation goes in rounds of 128 pages, a checkpoint each.
    fs.set_metadata_cache_bytes(1 << 20);
    let pages = fs.metadata_pages_per_disk().unwrap();
    let (disk, _) = pages.iter().enumerate().max_by_key(|(_, n)| **n).unwrap();
    let name = fs.descriptor().disks[disk].nsd_name.clone();
    fs.set_disk_status(&[name], DiskStatus::ToBeEmptied)
        .unwrap();
    let before = fs.metadata_pages_per_disk().unwrap()[disk];
    assert!(before > 200, "{pages:?}");

    // Stopped after its first round of metadata pages: some moved, the rest stay.
    let stop = AtomicBool::new(false);
    let first = fs
        .restripe(RestripeMode::Migrate, &stop, &mut |p| {
            if p.metadata_pages_moved > 0 {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        })
        .unwrap();
    assert!(first.stopped, "{first:?}");
    assert!(first.progress.metadata_pages_moved > 0, "{first:?}");
    let halfway = fs.metadata_pages_per_disk().unwrap()[disk];
    assert!(halfway > 0 && halfway < before, "{before} -> {halfway}");
    for i in 0..500 {
        create_file(&fs, ROOT_INO, format!("n{i:05}").as_bytes());
    }
    let report = restripe(&fs, RestripeMode::Migrate);
    assert!(report.progress.metadata_pages_moved > 0, "{report:?}");
    let after = fs.metadata_pages_per_disk().unwrap();
    assert_eq!(after[disk], 0, "pages left on the emptied disk: {after:?}");
    verify(&fs, &files);
    for i in (0..NAMES).step_by(7) {
        fs.lookup(ROOT_INO, format!("m{i:05}").as_bytes()).unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&t);
    assert_eq!(fs.metadata_pages_per_disk().unwrap()[disk], 0);
    verify(&fs, &files);
    assert_eq!(entries(&fs, ROOT_INO), NAMES + 500 + files.len());
    fs.unmount().unwrap();
    drop(fs);
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}
