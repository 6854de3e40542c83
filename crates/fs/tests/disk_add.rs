//! Adding disks to a mounted file system [mmadddisk]: writers carry on during the add, new
//! data lands on the new disks at once, a balancing restripe moves old data onto them, and
//! all of it holds across a remount with fsck clean. A crash at every write the add makes
//! leaves a file system that mounts with either none or all of the new disks, every synced
//! byte intact and fsck clean.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use tessera_drive::BlockDevice;
use tessera_fs::restripe::RestripeMode;
use tessera_fs::{DiskSpec, FileSystem, FsError, ROOT_INO};
use tessera_nsd::{DiskUsage, NsdId};

const DISK_BYTES: u64 = 64 << 20;

/// Four drives with NSD descriptors; the file system is made on the first two.
fn two_of_four() -> TestDisks {
    let t = make_disks(4, DISK_BYTES);
    let specs = t.disks[..2]
        .iter()
        .enumerate()
        .map(|(i, (id, dev))| spec(i, *id, dev.clone(), "system"))
        .collect();
    tessera_fs::format(specs, &small_opts(), &mut |_| {}).unwrap();
    t
}

fn spec(i: usize, id: NsdId, device: Arc<dyn BlockDevice>, pool: &str) -> DiskSpec {
    DiskSpec {
        nsd_name: format!("nsd{i}"),
        nsd_id: id,
        usage: DiskUsage::DataAndMetadata,
        failure_group: i as i32 + 1,
        pool: pool.into(),
        device,
    }
}

/// The specs of drives 2 and 3 as `disks` has them open.
fn new_disks(disks: &[(NsdId, Arc<dyn BlockDevice>)]) -> Vec<DiskSpec> {
    (2..4)
        .map(|i| spec(i, disks[i].0, disks[i].1.clone(), "system"))
        .collect()
}

#[test]
fn added_disks_take_new_data_at_once_and_survive_a_remount() {
    let t = two_of_four();
    // Mount is given all four NSDs, as the daemon gives every NSD its registry lists for the
    // file system: those the descriptor does not name are ignored.
    let disks = t.reopen();
    let fs = FileSystem::mount(disks.clone()).unwrap();
    assert_eq!(fs.descriptor().disks.len(), 2);
    let mut files = populate(&fs, "before-", 1);

    // A writer keeps creating and checking files while the disks are added.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let fs = Arc::clone(&fs);
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut written = BTreeMap::new();
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) || round < 2 {
                let batch = populate(&fs, &format!("during-{round}-"), 100 + round);
                verify(&fs, &batch);
                written.extend(batch);
                round += 1;
            }
            written
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    let added = fs.add_disks(new_disks(&disks)).unwrap();
    stop.store(true, Ordering::Relaxed);
    files.extend(writer.join().unwrap());
    assert_eq!(added, vec![2, 3]);
    let desc = fs.descriptor();
    assert_eq!(desc.disks.len(), 4);
    assert_eq!(desc.disks[3].nsd_name, "nsd3");
    // Two disks held the descriptor; with four failure groups a third copy goes to a new one.
    assert_eq!(desc.disks.iter().filter(|d| d.holds_descriptor).count(), 3);
    assert_eq!(fs.disk_names(), ["nsd0", "nsd1", "nsd2", "nsd3"]);
    verify(&fs, &files);

    // New data is spread over the new disks from now on.
    let before = used(&fs);
    files.extend(populate(&fs, "after-", 2));
    let after = used(&fs);
    assert!(
        after[2] > before[2] && after[3] > before[3],
        "new data did not reach the new disks: {before:?} -> {after:?}"
    );

    // A balancing restripe moves old data onto them.
    let skewed = used(&fs);
    let report = fs
        .restripe(RestripeMode::Balance, &AtomicBool::new(false), &mut |_| {})
        .unwrap();
    assert!(report.progress.blocks_moved > 0, "{report:?}");
    fs.sync().unwrap();
    let even = used(&fs);
    assert!(
        even[2] > skewed[2] && even[3] > skewed[3],
        "{skewed:?} -> {even:?}"
    );
    verify(&fs, &files);

    fs.unmount().unwrap();
    drop(fs);
    let fs = FileSystem::mount(t.reopen()).unwrap();
    assert_eq!(fs.descriptor().disks.len(), 4);
    verify(&fs, &files);
    // The added disks hold metadata too: enough creates to need new metadata pages.
    for i in 0..2000 {
        create_file(&fs, ROOT_INO, format!("m{i}").as_bytes());
    }
    fs.unmount().unwrap();
    drop(fs);
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[test]
fn a_disk_add_that_cannot_work_is_refused_and_changes_nothing() {
    let t = two_of_four();
    let disks = t.reopen();
    let fs = FileSystem::mount(disks.clone()).unwrap();
    let refused = |specs: Vec<DiskSpec>, why: &str| {
        let err = fs.add_disks(specs).unwrap_err();
        assert!(err.to_string().contains(why), "{err}");
        assert_eq!(fs.descriptor().disks.len(), 2);
        assert_eq!(fs.disk_names().len(), 2);
    };
    refused(
        vec![spec(0, disks[0].0, disks[0].1.clone(), "system")],
        "already a disk",
    );
    refused(Vec::new(), "no disks given");
    let mut twice = new_disks(&disks);
    twice[1] = spec(2, disks[2].0, disks[2].1.clone(), "system");
    refused(twice, "listed twice");
    refused(
        vec![spec(2, disks[2].0, disks[2].1.clone(), "fast")],
        "metadata can only be stored in the system pool",
    );
    let mut data_only = spec(2, disks[2].0, disks[2].1.clone(), "fast");
    data_only.usage = DiskUsage::DataOnly;
    refused(vec![data_only], "has no storage pool fast");
    // A drive too small for one block past the reserved area.
    let tiny = tempfile::NamedTempFile::new().unwrap();
    tiny.as_file().set_len(1 << 20).unwrap();
    let dev: Arc<dyn BlockDevice> = Arc::new(tessera_drive::FileDrive::open(tiny.path()).unwrap());
    refused(vec![spec(7, NsdId::random(), dev, "system")], "too small");
    // After all that, an add that works.
    assert_eq!(fs.add_disks(new_disks(&disks)).unwrap(), vec![2, 3]);
    fs.unmount().unwrap();
}

/// Crash at every write of `disk add`: each drive is a simulated one whose writes start
/// failing after a countdown (the daemon dies there: nothing it does afterwards reaches
/// the drives). The next mount finds the disks added or not, never half: every file
/// written and synced before reads back, fsck is clean, and when the disks are not there
/// the add can simply be run again.
#[test]
fn a_crash_at_any_write_of_a_disk_add_loses_nothing() {
    let mut crash_at = 1;
    // Crash points after which the mount found the disks, and before which it did not.
    let (mut with, mut without) = (0, 0);
    loop {
        let t = two_of_four();
        let (sim, faults) = with_faults(&t);
        let fs = FileSystem::mount(sim.clone()).unwrap();
        let files = populate(&fs, "kept-", 7);
        faults
            .writes_until_failure
            .store(crash_at, Ordering::SeqCst);
        let result = fs.add_disks(new_disks(&sim));
        let crashed = crash(fs, &faults);
        match &result {
            // A descriptor write that failed on some copies but landed on one still commits.
            Ok(_) => {}
            Err(FsError::Corrupt(_)) | Err(FsError::Io(_)) => {}
            Err(e) => panic!("crash at write {crash_at}: unexpected error {e}"),
        }

        let fs = FileSystem::mount(t.reopen())
            .unwrap_or_else(|e| panic!("crash at write {crash_at}: mount failed: {e}"));
        let count = fs.descriptor().disks.len();
        assert!(
            count == 2 || count == 4,
            "crash at write {crash_at}: {count} disks"
        );
        if result.is_ok() {
            assert_eq!(count, 4, "an add that returned is durable");
        }
        verify(&fs, &files);
        if count == 4 {
            with += 1;
        } else {
            without += 1;
        }
        if count == 2 {
            // Not added: adding again works.
            let disks = t.reopen();
            let fs2 = {
                fs.unmount().unwrap();
                drop(fs);
                FileSystem::mount(disks.clone()).unwrap()
            };
            fs2.add_disks(new_disks(&disks)).unwrap();
            fs2.unmount().unwrap();
        } else {
            fs.unmount().unwrap();
        }
        assert_fsck_clean(&t, &format!("crash at write {crash_at}"));
        if !crashed {
            break;
        }
        crash_at += 1;
        assert!(crash_at < 500, "the add never completed");
    }
    eprintln!("{crash_at} crash points: {without} before the add committed, {with} after");
    assert!(
        without > 3 && with > 0,
        "{without} crash points before the commit, {with} after"
    );
}
