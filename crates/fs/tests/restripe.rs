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

/// The stored allocation map's regions, as the descriptor has them.
fn regions(fs: &FileSystem) -> Vec<tessera_fs::alloc_map::MapRegion> {
    fs.descriptor().alloc_map.unwrap().regions
}

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
    // Few shards: the empty trees' root pages of the default count, spread over all four
    // disks at format, would blur the skew this test makes on 64 MiB disks.
    format_fs(
        &t,
        &tessera_fs::FormatOptions {
            shard_count: 8,
            ..small_opts()
        },
    );
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
    // Emptied: the disk with the most pages (checkpoints fill one disk at a time) and the
    // one holding the stored allocation map's regions (format puts them together).
    let (disk, _) = pages.iter().enumerate().max_by_key(|(_, n)| **n).unwrap();
    let map_disk = usize::from(regions(&fs)[0].on_disk);
    let log_disk = usize::from(fs.descriptor().log.disk);
    let names: Vec<String> = [disk, map_disk, log_disk]
        .iter()
        .map(|&d| fs.descriptor().disks[d].nsd_name.clone())
        .collect();
    fs.set_disk_status(&names, DiskStatus::ToBeEmptied).unwrap();
    let before = fs.metadata_pages_per_disk().unwrap()[disk];
    assert!(before > 200, "{pages:?}");
    let off = |fs: &FileSystem| {
        regions(fs)
            .iter()
            .all(|r| usize::from(r.on_disk) != disk && usize::from(r.on_disk) != map_disk)
    };

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
    assert_eq!(
        after[map_disk], 0,
        "pages left on the emptied disk: {after:?}"
    );
    assert!(report.progress.map_regions_moved > 0, "{report:?}");
    assert!(off(&fs), "{:?}", regions(&fs));
    assert!(report.progress.log_moved, "{report:?}");
    let log_on = usize::from(fs.descriptor().log.disk);
    assert!(
        ![disk, map_disk, log_disk].contains(&log_on),
        "log still on {log_on}"
    );
    // The new log takes changes, and a remount replays them.
    for i in 0..300 {
        create_file(&fs, ROOT_INO, format!("after-log-move{i:03}").as_bytes());
    }
    fs.sync().unwrap();
    verify(&fs, &files);
    for i in (0..NAMES).step_by(7) {
        fs.lookup(ROOT_INO, format!("m{i:05}").as_bytes()).unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&t);
    assert_eq!(fs.metadata_pages_per_disk().unwrap()[disk], 0);
    // The map was read from its new regions, not rebuilt by a scan.
    assert_eq!(fs.allocation_map_rebuilt(), None);
    assert!(off(&fs), "{:?}", regions(&fs));
    verify(&fs, &files);
    assert_eq!(usize::from(fs.descriptor().log.disk), log_on);
    assert_eq!(entries(&fs, ROOT_INO), NAMES + 500 + 300 + files.len());
    fs.unmount().unwrap();
    drop(fs);
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// A crash at every write of `restripe -m` emptying a disk of data, metadata pages and the
/// allocation map's regions: each mounts, every file verifies, the restripe runs again to
/// the end and leaves nothing on the disk, and fsck is clean.
#[test]
fn a_crash_at_any_write_of_a_migrating_restripe_loses_nothing() {
    use std::sync::atomic::Ordering;

    let mut crash_at = 1;
    let mut points = 0;
    loop {
        let t = make_disks(4, 64 << 20);
        format_fs(&t, &small_opts());
        let (sim, faults) = with_faults(&t);
        let fs = FileSystem::mount(sim).unwrap();
        fs.set_metadata_cache_bytes(1 << 20);
        let files = populate(&fs, "kept-", 3);
        for i in 0..1500 {
            create_file(&fs, ROOT_INO, format!("m{i:05}").as_bytes());
        }
        fs.sync().unwrap();
        // The disk with the most pages, and the one with the map's regions.
        let pages = fs.metadata_pages_per_disk().unwrap();
        let (disk, _) = pages.iter().enumerate().max_by_key(|(_, n)| **n).unwrap();
        let map_disk = usize::from(regions(&fs)[0].on_disk);
        let log_disk = usize::from(fs.descriptor().log.disk);
        let emptied = [disk, map_disk, log_disk];
        let names: Vec<String> = emptied
            .iter()
            .map(|&d| fs.descriptor().disks[d].nsd_name.clone())
            .collect();
        fs.set_disk_status(&names, DiskStatus::ToBeEmptied).unwrap();
        faults
            .writes_until_failure
            .store(crash_at, Ordering::SeqCst);
        let result = fs.restripe(RestripeMode::Migrate, &AtomicBool::new(false), &mut |_| {});
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
        let report = restripe(&fs, RestripeMode::Migrate);
        assert!(!report.stopped);
        let pages = fs.metadata_pages_per_disk().unwrap();
        assert!(
            emptied.iter().all(|&d| pages[d] == 0),
            "crash at write {crash_at}: {pages:?}"
        );
        assert!(
            regions(&fs)
                .iter()
                .all(|r| !emptied.contains(&usize::from(r.on_disk))),
            "crash at write {crash_at}: {:?}",
            regions(&fs)
        );
        let log_on = usize::from(fs.descriptor().log.disk);
        assert!(
            !emptied.contains(&log_on),
            "crash at write {crash_at}: log on {log_on}"
        );
        create_file(&fs, ROOT_INO, b"after-the-restripe");
        fs.sync().unwrap();
        for i in (0..1500).step_by(11) {
            fs.lookup(ROOT_INO, format!("m{i:05}").as_bytes())
                .unwrap_or_else(|e| panic!("crash at write {crash_at}: m{i:05}: {e}"));
        }
        verify(&fs, &files);
        fs.unmount().unwrap();
        drop(fs);
        assert_fsck_clean(&t, &format!("crash at write {crash_at}"));
        points += 1;
        if !crashed {
            break;
        }
        // Every write early on (block moves, the first pages), then every third.
        crash_at += if crash_at < 40 { 1 } else { 3 };
        assert!(crash_at < 3000, "the restripe never completed");
    }
    eprintln!("{points} crash points, the restripe took about {crash_at} writes");
    assert!(points > 10, "only {points} crash points");
}

/// With a disk suspended, data fills the ready disks only up to the metadata reserve: the
/// suspended disk's free space is no room for pages, so checkpoints (and the final one at
/// unmount) still find pages when writers have hit ENOSPC.
#[test]
fn a_full_pool_with_a_suspended_disk_still_checkpoints() {
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    fs.set_disk_status(&["nsd0".to_string()], DiskStatus::Suspended)
        .unwrap();
    let chunk = pattern(1 << 20, 7);
    let mut files = std::collections::BTreeMap::new();
    'fill: for i in 0.. {
        let name = format!("fill{i}");
        let a = create_file(&fs, ROOT_INO, name.as_bytes());
        let mut data = Vec::new();
        for j in 0..8u64 {
            match fs.write(a.ino, j << 20, &chunk, false) {
                Ok(_) => data.extend_from_slice(&chunk),
                Err(tessera_fs::FsError::NoSpace { .. }) => {
                    fs.truncate(a.ino, data.len() as u64).unwrap();
                    files.insert(name, data);
                    break 'fill;
                }
                Err(e) => panic!("{name}: {e}"),
            }
        }
        files.insert(name, data);
        assert!(i < 1000, "the pool never filled");
    }
    // The namespace still changes and checkpoints still find pages.
    for i in 0..10_000 {
        create_file(&fs, ROOT_INO, format!("small{i:05}").as_bytes());
    }
    fs.checkpoint().unwrap();
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
