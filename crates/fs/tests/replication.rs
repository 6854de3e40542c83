//! Data replication across failure groups [mmcrfs -r 2, mmchdisk stop/start, mmrestripefs
//! -r]: every block has a copy in each of two failure groups; losing a whole failure group
//! (its drives missing at mount, or stopped while mounted) loses no byte; writes meanwhile
//! drop the copies they cannot write; `restripe -r` gives them back, after which the other
//! failure group alone holds everything; a damaged copy is read from the other one and
//! repaired.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;

use common::*;
use tessera_fs::restripe::RestripeMode;
use tessera_fs::{DiskSpec, FileSystem, FormatOptions, Replication, StrictReplication, ROOT_INO};
use tessera_nsd::DiskUsage;

/// nsd0: metadata only (failure group 10); nsd1, nsd2: data in failure group 1; nsd3,
/// nsd4: data in failure group 2.
const GROUPS: [(DiskUsage, i32); 5] = [
    (DiskUsage::MetadataOnly, 10),
    (DiskUsage::DataOnly, 1),
    (DiskUsage::DataOnly, 1),
    (DiskUsage::DataOnly, 2),
    (DiskUsage::DataOnly, 2),
];

fn replicated_opts() -> FormatOptions {
    FormatOptions {
        max_data_replicas: 2,
        replication: Replication {
            data: 2,
            strict: StrictReplication::WhenPossible,
        },
        ..small_opts()
    }
}

fn replicated_fs() -> TestDisks {
    let t = make_disks(5, 64 << 20);
    tessera_fs::format(
        specs_in_groups(&t, &GROUPS),
        &replicated_opts(),
        &mut |_| {},
    )
    .unwrap();
    t
}

/// Blocks of each file in failure group 1 and in failure group 2.
fn copies_per_group(fs: &FileSystem, files: &BTreeMap<String, Vec<u8>>) -> Vec<(String, u64, u64)> {
    files
        .keys()
        .map(|name| {
            let a = fs.lookup(ROOT_INO, name.as_bytes()).unwrap();
            let (mut g1, mut g2) = (0, 0);
            for (nsd, n) in fs.file_blocks_per_disk(a.ino).unwrap() {
                match nsd.as_str() {
                    "nsd1" | "nsd2" => g1 += n,
                    "nsd3" | "nsd4" => g2 += n,
                    other => panic!("{name}: data on {other}"),
                }
            }
            (name.clone(), g1, g2)
        })
        .collect()
}

fn assert_fully_replicated(fs: &FileSystem, files: &BTreeMap<String, Vec<u8>>) {
    for (name, g1, g2) in copies_per_group(fs, files) {
        assert_eq!(g1, g2, "{name}: copies per failure group");
        let size = files[&name].len() as u64;
        assert!(size <= 1024 || g1 > 0, "{name}: no blocks");
    }
}

fn restripe_r(fs: &FileSystem) -> tessera_fs::restripe::RestripeReport {
    fs.restripe(
        RestripeMode::Replicate,
        &AtomicBool::new(false),
        &mut |_| {},
    )
    .unwrap()
}

#[test]
fn replication_needs_as_many_failure_groups_as_copies() {
    let t = make_disks(3, 64 << 20);
    let one_group: Vec<DiskSpec> = t
        .disks
        .iter()
        .enumerate()
        .map(|(i, (id, dev))| DiskSpec {
            nsd_name: format!("nsd{i}"),
            nsd_id: *id,
            usage: DiskUsage::DataAndMetadata,
            failure_group: 7,
            pool: "system".into(),
            device: dev.clone(),
        })
        .collect();
    let err = tessera_fs::format(one_group, &replicated_opts(), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("-r 2") && err.contains("1 failure group"),
        "{err}"
    );
    let over = FormatOptions {
        max_data_replicas: 1,
        ..replicated_opts()
    };
    let err = over
        .check(&specs_in_groups(&make_disks(5, 64 << 20), &GROUPS))
        .unwrap_err();
    assert!(err.to_string().contains("-R 1"), "{err}");
}

#[test]
fn losing_a_whole_failure_group_loses_nothing_and_restripe_r_restores_the_copies() {
    let t = replicated_fs();
    let fs = mount(&t);
    let mut files = populate(&fs, "a", 1);
    assert_fully_replicated(&fs, &files);
    // st_blocks counts both copies, as GPFS does.
    let big = fs.lookup(ROOT_INO, b"a4").unwrap();
    assert_eq!(fs.allocated_bytes(big.ino), 2 * 9 * BLOCK);
    fs.unmount().unwrap();
    drop(fs);

    // Failure group 2 is gone: the file system mounts and every byte reads.
    let fs = FileSystem::mount(without(&t, &[3, 4])).unwrap();
    let availability = fs.disk_availability();
    assert!(
        availability.contains(&("nsd3".to_string(), false)),
        "{availability:?}"
    );
    verify(&fs, &files);
    // Writes go on with one copy (whenpossible: no disk of group 2 is up).
    files.extend(populate(&fs, "b", 2));
    let a0 = fs.lookup(ROOT_INO, b"a3").unwrap();
    let patch = pattern(20_000, 9);
    fs.write(a0.ino, 1000, &patch, true).unwrap();
    files.get_mut("a3").unwrap()[1000..21_000].copy_from_slice(&patch);
    verify(&fs, &files);
    for (name, _, g2) in copies_per_group(&fs, &files) {
        if name.starts_with('b') {
            assert_eq!(g2, 0, "{name}: a copy on a missing disk");
        }
    }
    fs.unmount().unwrap();
    drop(fs);

    // fsck counts the blocks with one copy, and finds nothing wrong.
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert!(report.ill_replicated_blocks > 0, "{report:?}");

    // Back with every drive: the copies written meanwhile come back with restripe -r.
    let fs = mount(&t);
    verify(&fs, &files);
    let report = restripe_r(&fs);
    assert!(report.progress.blocks_moved > 0, "{report:?}");
    assert_fully_replicated(&fs, &files);
    // Nothing left to do.
    assert_eq!(restripe_r(&fs).progress.blocks_moved, 0);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after restripe -r");
    assert_eq!(
        tessera_fs::fsck(t.reopen(), false)
            .unwrap()
            .ill_replicated_blocks,
        0
    );

    // Now failure group 1 goes: group 2 alone holds every byte, old and new.
    let fs = FileSystem::mount(without(&t, &[1, 2])).unwrap();
    verify(&fs, &files);
    fs.unmount().unwrap();
}

#[test]
fn a_stopped_failure_group_misses_writes_and_gets_them_back() {
    let t = replicated_fs();
    let fs = mount(&t);
    let mut files = populate(&fs, "a", 3);
    fs.stop_disks(&["nsd1".into(), "nsd2".into()]).unwrap();
    // In-place overwrites, appends and new files while group 1 is stopped.
    for (name, data) in files.iter_mut() {
        let a = fs.lookup(ROOT_INO, name.as_bytes()).unwrap();
        let patch = pattern(5000, data.len() as u64);
        let at = data.len() / 3;
        fs.write(a.ino, at as u64, &patch, false).unwrap();
        let end = (at + patch.len()).max(data.len());
        data.resize(end, 0);
        data[at..at + patch.len()].copy_from_slice(&patch);
    }
    files.extend(populate(&fs, "c", 4));
    verify(&fs, &files);
    // Metadata disks cannot be stopped (one metadata copy).
    let err = fs.stop_disks(&["nsd0".into()]).unwrap_err().to_string();
    assert!(err.contains("metadata"), "{err}");

    fs.start_disks(&["nsd1".into(), "nsd2".into()]).unwrap();
    verify(&fs, &files);
    restripe_r(&fs);
    assert_fully_replicated(&fs, &files);
    // Group 1 alone now has every byte written while it was stopped.
    fs.stop_disks(&["nsd3".into(), "nsd4".into()]).unwrap();
    verify(&fs, &files);
    fs.start_disks(&["nsd3".into(), "nsd4".into()]).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after stop, start and restripe -r");
}

#[test]
fn a_damaged_copy_is_read_from_the_other_and_repaired() {
    use std::io::{Seek, SeekFrom, Write};
    let t = replicated_fs();
    let fs = mount(&t);
    let files = populate(&fs, "a", 5);
    fs.sync().unwrap();
    // Scribble over the whole data regions of failure group 1 (the NSD descriptor at the
    // start of each drive stays), so that both the copies reads try first and those they
    // never read are damaged, wherever the allocator put them.
    let start = tessera_nsd::layout::data_start_bytes(BLOCK);
    for i in [1, 2] {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(t.dir.path().join(format!("d{i}")))
            .unwrap();
        let end = f.metadata().unwrap().len();
        f.seek(SeekFrom::Start(start)).unwrap();
        f.write_all(&vec![0x5a; (end - start) as usize]).unwrap();
        f.sync_all().unwrap();
    }
    // Reads find the damage on the copies they read and repair it; a restripe -c reads
    // every copy and repairs the rest.
    verify(&fs, &files);
    let pmon = fs.pmon();
    assert!(
        pmon.checksum_errors > 0 && pmon.copies_repaired > 0,
        "{pmon:?}"
    );
    let report = fs
        .restripe(RestripeMode::Check, &AtomicBool::new(false), &mut |_| {})
        .unwrap();
    assert!(report.progress.blocks_moved > 0, "{report:?}");
    let again = fs
        .restripe(RestripeMode::Check, &AtomicBool::new(false), &mut |_| {})
        .unwrap();
    assert_eq!(again.progress.blocks_moved, 0, "{again:?}");
    // Nothing wrote meanwhile: sound blocks are not reported as changed under the scan.
    assert_eq!(again.blocks_changed, 0, "{again:?}");
    assert!(again.progress.blocks_scanned > 0, "{again:?}");
    // Without group 2, group 1 answers with what the repairs wrote back.
    fs.stop_disks(&["nsd3".into(), "nsd4".into()]).unwrap();
    verify(&fs, &files);
    fs.unmount().unwrap();
}

#[test]
fn replication_changes_for_new_files_and_per_file_and_restripe_r_follows() {
    let t = make_disks(5, 64 << 20);
    let one = FormatOptions {
        replication: Replication::default(),
        ..replicated_opts()
    };
    tessera_fs::format(specs_in_groups(&t, &GROUPS), &one, &mut |_| {}).unwrap();
    let fs = mount(&t);
    let old = populate(&fs, "old", 7);
    let blocks_of = |fs: &FileSystem, name: &str| {
        let (_, g1, g2) = copies_per_group(fs, &[(name.to_string(), Vec::new())].into())
            .pop()
            .unwrap();
        g1 + g2
    };
    assert_eq!(blocks_of(&fs, "old4"), 9, "one copy of each of 9 blocks");
    // New files get two copies from now on [mmchfs -r]; the old ones keep one.
    fs.set_data_replication(2).unwrap();
    assert_eq!(fs.descriptor().replication().data, 2);
    let new = populate(&fs, "new", 8);
    assert_fully_replicated(&fs, &new);
    let a4 = fs.lookup(ROOT_INO, b"old4").unwrap();
    assert_eq!(fs.file_replication(a4.ino).unwrap(), (1, false));
    // One old file asks for two [mmchattr -r 2]: ill-replicated until restripe -r.
    fs.set_file_replication(a4.ino, 2).unwrap();
    assert_eq!(fs.file_replication(a4.ino).unwrap(), (2, true));
    restripe_r(&fs);
    assert_eq!(fs.file_replication(a4.ino).unwrap(), (2, false));
    let only_a4: BTreeMap<String, Vec<u8>> = [("old4".to_string(), old["old4"].clone())].into();
    assert_fully_replicated(&fs, &only_a4);
    // And back to one: restripe -r drops the second copies.
    let n4 = fs.lookup(ROOT_INO, b"new4").unwrap();
    fs.set_file_replication(n4.ino, 1).unwrap();
    restripe_r(&fs);
    assert_eq!(
        blocks_of(&fs, "new4"),
        9,
        "new4 keeps one copy of each of its 9 blocks"
    );
    // Out of bounds: above -R, or more copies than failure groups.
    let err = fs.set_data_replication(3).unwrap_err().to_string();
    assert!(err.contains("-R 2"), "{err}");
    verify(&fs, &old);
    verify(&fs, &new);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after replication changes");
    let fs = mount(&t);
    assert_eq!(fs.descriptor().replication().data, 2);
    verify(&fs, &old);
    verify(&fs, &new);
    fs.unmount().unwrap();
}

#[test]
fn a_failure_group_that_vanishes_under_writes_is_taken_out_and_nothing_is_lost() {
    use std::sync::atomic::Ordering;
    let t = replicated_fs();
    let (disks, group2) = with_vanishing(&t, &[3, 4]);
    let fs = FileSystem::mount(disks).unwrap();
    let mut files = populate(&fs, "a", 11);
    // The enclosure of group 2 goes away: writes, reads and flushes fail there.
    group2.vanished.store(true, Ordering::SeqCst);
    files.extend(populate(&fs, "b", 12));
    let a3 = fs.lookup(ROOT_INO, b"a3").unwrap();
    let patch = pattern(70_000, 13);
    fs.write(a3.ino, 4096, &patch, true).unwrap();
    files.get_mut("a3").unwrap()[4096..74_096].copy_from_slice(&patch);
    fs.sync().unwrap();
    verify(&fs, &files);
    let down: Vec<String> = fs
        .disk_availability()
        .into_iter()
        .filter(|(_, up)| !up)
        .map(|(n, _)| n)
        .collect();
    assert!(
        !down.is_empty() && down.iter().all(|n| n == "nsd3" || n == "nsd4"),
        "{down:?}"
    );
    fs.unmount().unwrap();
    drop(fs);

    // Back with every drive: the blocks written meanwhile get their second copy.
    let fs = mount(&t);
    verify(&fs, &files);
    restripe_r(&fs);
    assert_fully_replicated(&fs, &files);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after a vanished failure group");
    let fs = FileSystem::mount(without(&t, &[1, 2])).unwrap();
    verify(&fs, &files);
    fs.unmount().unwrap();
}

#[test]
fn deleting_disks_keeps_the_copies_in_distinct_failure_groups() {
    let t = replicated_fs();
    let fs = mount(&t);
    let files = populate(&fs, "a", 21);
    // nsd1 leaves: its copies go to nsd2, the other disk of group 1.
    fs.delete_disks(&["nsd1".into()], &AtomicBool::new(false), &mut |_| {})
        .unwrap();
    verify(&fs, &files);
    for (name, g1, g2) in copies_per_group(&fs, &files) {
        assert_eq!(
            g1, g2,
            "{name}: copies per failure group after deleting nsd1"
        );
    }
    // nsd2, the last disk of group 1, leaves: its copies have nowhere to go that keeps
    // them apart from the others, so they are dropped and group 2 holds every byte.
    fs.delete_disks(&["nsd2".into()], &AtomicBool::new(false), &mut |_| {})
        .unwrap();
    verify(&fs, &files);
    let a4 = fs.lookup(ROOT_INO, b"a4").unwrap();
    assert_eq!(fs.file_replication(a4.ino).unwrap(), (2, true));
    for (name, g1, _) in copies_per_group(&fs, &files) {
        assert_eq!(g1, 0, "{name}: a copy left in group 1");
    }
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after deleting a failure group's disks");
    let fs = FileSystem::mount(without(&t, &[1, 2])).unwrap();
    verify(&fs, &files);
    fs.unmount().unwrap();
}

#[test]
fn a_client_only_mount_writes_every_copy_and_reads_around_a_stopped_group() {
    use tessera_fs::InProcessOwner;
    let t = replicated_fs();
    let owner = mount(&t);
    let client = FileSystem::mount_client(
        t.reopen(),
        Box::new(InProcessOwner(std::sync::Arc::downgrade(&owner))),
    )
    .unwrap();
    // The client asks the owner for both copies of each block over the metanode requests
    // and writes them itself.
    let files = populate(&client, "c", 31);
    client.sync().unwrap();
    assert_fully_replicated(&owner, &files);
    client.stop_disks(&["nsd3".into(), "nsd4".into()]).unwrap();
    verify(&client, &files);
    client.unmount().unwrap();
    owner.unmount().unwrap();
}

/// A drive that takes `delay` for every read and counts them.
#[derive(Debug)]
struct Slow {
    inner: std::sync::Arc<dyn tessera_drive::BlockDevice>,
    delay: std::time::Duration,
    reads: std::sync::atomic::AtomicU64,
}

impl tessera_drive::BlockDevice for Slow {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::thread::sleep(self.delay);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The drives of `t`, each behind a [`Slow`] that delays its reads by `delay(i)`.
fn counted_drives(
    t: &TestDisks,
    delay: impl Fn(usize) -> std::time::Duration,
) -> (common::Disks, Vec<std::sync::Arc<Slow>>) {
    let mut counted = Vec::new();
    let disks = t
        .reopen()
        .into_iter()
        .enumerate()
        .map(|(i, (id, dev))| {
            let s = std::sync::Arc::new(Slow {
                inner: dev,
                delay: delay(i),
                reads: Default::default(),
            });
            counted.push(std::sync::Arc::clone(&s));
            let dev: std::sync::Arc<dyn tessera_drive::BlockDevice> = s;
            (id, dev)
        })
        .collect();
    (disks, counted)
}

#[test]
fn read_replica_policy_fastest_reads_from_the_faster_failure_group() {
    use std::sync::atomic::Ordering;
    use std::time::Duration;
    let t = replicated_fs();
    let fs = mount(&t);
    let files = populate(&fs, "a", 41);
    fs.unmount().unwrap();
    drop(fs);
    // Group 1 (nsd1, nsd2) answers reads 10 ms late (far above what scheduling on a loaded
    // machine adds); group 2 at once.
    let (disks, slow) = counted_drives(&t, |i| {
        Duration::from_millis(if i == 1 || i == 2 { 10 } else { 0 })
    });
    let fs = FileSystem::mount(disks).unwrap();
    fs.set_read_replica_policy(tessera_fs::replication::ReadReplicaPolicy::Fastest);
    let reads = |i: usize| slow[i].reads.load(Ordering::Relaxed);
    // Reads of whole files, again and again (blocks read ahead come from the copies too).
    for _ in 0..6 {
        verify(&fs, &files);
    }
    let (before_slow, before_fast) = (reads(1) + reads(2), reads(3) + reads(4));
    for _ in 0..6 {
        verify(&fs, &files);
    }
    let slow_reads = reads(1) + reads(2) - before_slow;
    let fast_reads = reads(3) + reads(4) - before_fast;
    eprintln!("reads: fast group {fast_reads}, slow group {slow_reads}");
    assert!(
        fast_reads > 3 * slow_reads.max(1),
        "fast group {fast_reads} reads, slow group {slow_reads}"
    );
    fs.unmount().unwrap();
}

#[test]
fn read_replica_policy_local_reads_the_copies_this_node_reaches_itself() {
    use std::sync::atomic::Ordering;
    use tessera_fs::replication::ReadReplicaPolicy;
    let t = replicated_fs();
    let fs = mount(&t);
    let files = populate(&fs, "a", 43);
    fs.unmount().unwrap();
    drop(fs);
    let (disks, counted) = counted_drives(&t, |_| std::time::Duration::ZERO);
    let fs = FileSystem::mount(disks).unwrap();
    // Group 1 as if this node reached it through NSD servers: every read goes to group 2.
    fs.set_remote_disks(&["nsd1".into(), "nsd2".into()]);
    fs.set_read_replica_policy(ReadReplicaPolicy::Local);
    let reads = |i: usize| counted[i].reads.load(Ordering::Relaxed);
    let before = (reads(1) + reads(2), reads(3) + reads(4));
    verify(&fs, &files);
    assert_eq!(reads(1) + reads(2), before.0, "a remote copy was read");
    assert!(reads(3) + reads(4) > before.1, "no local copy was read");
    // With group 2 stopped the remote copies answer.
    fs.stop_disks(&["nsd3".into(), "nsd4".into()]).unwrap();
    let remote = reads(1) + reads(2);
    // (fallocate(2) of length 0 is EINVAL, never a panic.)
    let a0 = fs.lookup(ROOT_INO, b"a0").unwrap();
    assert!(fs.fallocate(a0.ino, 0, 0, 0).is_err());
    verify(&fs, &files);
    assert!(
        reads(1) + reads(2) > remote,
        "the remote copies were not read"
    );
    fs.start_disks(&["nsd3".into(), "nsd4".into()]).unwrap();
    fs.unmount().unwrap();
}

/// `restripe -b` [mmrestripefs -b] balances without giving up a copy: a copy whose only
/// underfull target shares a failure group with the block's other copy stays where it is
/// (before, it was dropped, and the file was left with one copy by a balance).
#[test]
fn balancing_never_drops_a_copy() {
    // nsd1 in group 1, nsd2 and nsd3 in group 2; nsd3 takes nothing until the balance.
    let layout = [
        (DiskUsage::MetadataOnly, 10),
        (DiskUsage::DataOnly, 1),
        (DiskUsage::DataOnly, 2),
        (DiskUsage::DataOnly, 2),
    ];
    let t = make_disks(4, 64 << 20);
    tessera_fs::format(
        specs_in_groups(&t, &layout),
        &replicated_opts(),
        &mut |_| {},
    )
    .unwrap();
    let fs = mount(&t);
    fs.set_disk_status(&["nsd3".into()], tessera_fs::DiskStatus::Suspended)
        .unwrap();
    let files = populate(&fs, "b", 24);
    fs.set_disk_status(&["nsd3".into()], tessera_fs::DiskStatus::Ready)
        .unwrap();
    fs.restripe(RestripeMode::Balance, &AtomicBool::new(false), &mut |_| {})
        .unwrap();
    verify(&fs, &files);
    let mut moved = 0;
    for name in files.keys() {
        let a = fs.lookup(ROOT_INO, name.as_bytes()).unwrap();
        let (mut g1, mut g2) = (0, 0);
        for (nsd, n) in fs.file_blocks_per_disk(a.ino).unwrap() {
            match nsd.as_str() {
                "nsd1" => g1 += n,
                "nsd3" => {
                    g2 += n;
                    moved += n;
                }
                _ => g2 += n,
            }
        }
        assert_eq!(g1, g2, "{name}: a copy per failure group after the balance");
    }
    assert!(moved > 0, "the balance moved copies to nsd3");
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after a balance");
}

/// `disk change stop` [mmchdisk stop] on a file system another node mounts: the daemon
/// sends the stop to that node too (`Fence::disk_availability`), whose mount then writes
/// no copy to the stopped disks either; started again on both, `restripe -r` gives the
/// blocks written meanwhile their second copies.
#[test]
fn a_stop_reaches_a_client_mount_whose_writes_then_skip_the_stopped_disks() {
    let t = replicated_fs();
    let owner = mount(&t);
    owner.set_shared(true);
    let client = FileSystem::mount_client(
        t.reopen(),
        Box::new(tessera_fs::InProcessOwner(std::sync::Arc::downgrade(
            &owner,
        ))),
    )
    .unwrap();
    client.set_shared(true);
    let group2: Vec<String> = vec!["nsd3".into(), "nsd4".into()];
    owner.stop_disks(&group2).unwrap();
    tessera_fs::Fence::check(
        &client
            .serve_metanode_request(&tessera_fs::Fence::disk_availability(group2.clone(), false)),
    )
    .unwrap();
    let down: Vec<String> = client
        .disk_availability()
        .into_iter()
        .filter(|(_, up)| !up)
        .map(|(n, _)| n)
        .collect();
    assert_eq!(down, group2);
    let a = create_file(&client, ROOT_INO, b"while-stopped");
    let data = pattern(3 * BLOCK as usize, 5);
    client.write(a.ino, 0, &data, false).unwrap();
    client.fsync(a.ino).unwrap();
    let files = BTreeMap::from([("while-stopped".to_string(), data.clone())]);
    for (name, g1, g2) in copies_per_group(&owner, &files) {
        assert!(
            g1 > 0 && g2 == 0,
            "{name}: {g1} blocks in group 1, {g2} in group 2"
        );
    }
    owner.start_disks(&group2).unwrap();
    tessera_fs::Fence::check(
        &client.serve_metanode_request(&tessera_fs::Fence::disk_availability(group2, true)),
    )
    .unwrap();
    assert!(client.disk_availability().iter().all(|(_, up)| *up));
    owner
        .restripe(
            RestripeMode::Replicate,
            &AtomicBool::new(false),
            &mut |_| {},
        )
        .unwrap();
    for (name, g1, g2) in copies_per_group(&owner, &files) {
        assert_eq!(g1, g2, "{name}: both copies again");
    }
    assert_eq!(client.read(a.ino, 0, data.len() as u32).unwrap(), data);
    client.unmount().unwrap();
    owner.unmount().unwrap();
}

/// `disk change stop` [mmchdisk stop] is recorded in the descriptor: a mount afterwards (the
/// manager's again, a client's) takes the disks as down though their devices answer, and
/// writes nothing on them; `start` clears the record, and the next mount has them up.
#[test]
fn a_stopped_disk_stays_down_across_mounts_until_started() {
    let t = replicated_fs();
    let fs = mount(&t);
    let before = populate(&fs, "a", 3);
    fs.stop_disks(&["nsd1".into(), "nsd2".into()]).unwrap();
    fs.unmount().unwrap();
    drop(fs);

    let fs = mount(&t);
    let down = |fs: &FileSystem| -> Vec<String> {
        fs.disk_availability()
            .into_iter()
            .filter(|(_, up)| !up)
            .map(|(n, _)| n)
            .collect()
    };
    assert_eq!(
        down(&fs),
        vec!["nsd1", "nsd2"],
        "stopped across the remount"
    );
    let client = FileSystem::mount_client(
        t.reopen(),
        Box::new(tessera_fs::InProcessOwner(std::sync::Arc::downgrade(&fs))),
    )
    .unwrap();
    assert_eq!(
        down(&client),
        vec!["nsd1", "nsd2"],
        "a client mounting later"
    );
    let during = populate(&client, "c", 4);
    for (name, g1, g2) in copies_per_group(&fs, &during) {
        assert_eq!(g1, 0, "{name} was written on a stopped disk");
        assert!(g2 > 0 || during[&name].len() <= 1024, "{name}");
    }
    verify(&client, &before);
    client.unmount().unwrap();

    fs.start_disks(&["nsd1".into(), "nsd2".into()]).unwrap();
    assert!(down(&fs).is_empty());
    restripe_r(&fs);
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&t);
    assert!(down(&fs).is_empty(), "started, and so recorded");
    verify(&fs, &before);
    verify(&fs, &during);
    assert_fully_replicated(&fs, &during);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after a stop kept across mounts");
}
