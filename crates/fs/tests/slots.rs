//! Owner slots on disk (format version 8): a slot region (two records and a log) is made,
//! committed by the descriptor and read back after a remount; its blocks are the file
//! system's (allocated, counted by fsck, never handed out again); a crash at every write of
//! making one leaves it whole or absent; a torn record falls back to the other half, a slot
//! with no readable record is named by mount and fsck; emptying or deleting the disk that
//! holds a region moves it with its record and a fresh log that continues its LSNs; with
//! `-m 2` the region has a second copy in another failure group; the manager gives empty
//! shards, free allocation regions and new directories to a slot by the descriptor alone
//! (crash at every write of each).

mod common;

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};

use common::*;
use tessera_fs::descriptor::ShardRoot;
use tessera_fs::slot::{SlotRecord, SlotRegion, SlotShard};
use tessera_fs::{FileSystem, FormatOptions};

fn drive(t: &TestDisks, disk: u16) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(t.dir.path().join(format!("d{disk}")))
        .unwrap()
}

/// Writes `record` into its half of every copy of `region` behind the file system's back,
/// as the slot's owner will.
fn put_record(t: &TestDisks, uuid: &[u8; 16], region: &SlotRegion, record: &SlotRecord) {
    let buf = record.encode(uuid, region.record_bytes);
    let half = (record.generation % 2) * u64::from(region.record_bytes);
    for (disk, offset) in region.copies() {
        let f = drive(t, disk);
        f.write_all_at(&buf, offset + half).unwrap();
        f.sync_all().unwrap();
    }
}

/// A record with a shard in it, so that moving the region has something to keep.
fn record_with_a_shard(slot: u32, generation: u64) -> SlotRecord {
    SlotRecord {
        slot,
        generation,
        replay_from: 4096 * generation,
        page_generation: 10 + generation,
        shards: vec![SlotShard {
            shard: 5,
            generation: 3,
            root: ShardRoot {
                addr: 0x1234,
                crc32c: 0x5678,
            },
            second: None,
        }],
        // No region: fsck brings the slot back, and a region's chunks would have to be
        // there with this digest.
        regions: vec![],
        given_back: vec![],
        map_digest: 0,
        disks_covered: 2,
        dropped: vec![],
    }
}

fn records(fs: &FileSystem) -> Vec<SlotRecord> {
    fs.slots()
        .unwrap()
        .into_iter()
        .map(|(_, r)| r.unwrap())
        .collect()
}

#[test]
fn slots_are_made_committed_and_read_back() {
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    assert!(fs.slots().unwrap().is_empty(), "a new file system has none");
    let files = populate(&fs, "a", 1);
    let before: u64 = used(&fs).iter().sum();
    assert_eq!(fs.create_slot().unwrap(), 1);
    assert_eq!(fs.create_slot().unwrap(), 2);
    let slots = fs.slots().unwrap();
    let regions: Vec<SlotRegion> = slots.iter().map(|(r, _)| r.clone()).collect();
    let desc = fs.descriptor();
    for (region, record) in &slots {
        let record = record.as_ref().unwrap();
        assert_eq!(record, &SlotRecord::empty(region.slot));
        assert!(
            region.bytes >= desc.log.region.bytes + 2 * u64::from(region.record_bytes),
            "a slot's log is as large as the descriptor's"
        );
        assert!(region.second.is_none(), "one metadata copy");
    }
    let after: u64 = used(&fs).iter().sum();
    assert_eq!(
        after - before,
        regions.iter().map(|r| r.bytes).sum::<u64>(),
        "the regions' blocks are in use"
    );
    // Data written afterwards never lands in a region.
    let more = populate(&fs, "b", 2);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after making two slots");

    let fs = mount(&t);
    let listed: Vec<SlotRegion> = fs.slots().unwrap().into_iter().map(|(r, _)| r).collect();
    assert_eq!(listed, regions, "the descriptor lists them after a remount");
    for region in &regions {
        let log = region.log_region();
        let mut head = vec![0u8; 4096];
        drive(&t, region.disk)
            .read_exact_at(&mut head, log.offset)
            .unwrap();
        assert!(
            head.iter().any(|b| *b != 0),
            "slot {}'s log is formatted",
            region.slot
        );
    }
    verify(&fs, &files);
    verify(&fs, &more);
    fs.unmount().unwrap();
}

/// Runs `act` on a mount whose drives fail from their `k`-th write on (the process dies
/// there), for k = 1, 2, ...; after each crash the file system mounts again, `there` says
/// whether the change survived (checking that it is whole), `files` verify and fsck is
/// clean. Stops at the first crash after which the change is there, or that `act` finished
/// before; returns how many crashes left it out and asserts that some did.
fn crash_at_every_write(
    t: &TestDisks,
    files: &std::collections::BTreeMap<String, Vec<u8>>,
    what: &str,
    act: impl Fn(&FileSystem) -> tessera_fs::FsResult<()>,
    there: impl Fn(&FileSystem, u32) -> bool,
) {
    let mut absent = 0;
    for k in 1.. {
        assert!(k < 500, "{what} never finished");
        let (disks, faults) = with_faults(t);
        let fs = FileSystem::mount(disks).unwrap();
        faults
            .writes_until_failure
            .store(i64::from(k), Ordering::SeqCst);
        let result = act(&fs);
        let crashed = crash(fs, &faults);
        let fs = mount(t);
        let present = there(&fs, k);
        if !present {
            assert!(
                result.is_err() || crashed,
                "write {k}: {what} done and lost"
            );
            absent += 1;
        }
        verify(&fs, files);
        fs.unmount().unwrap();
        drop(fs);
        assert_fsck_clean(t, &format!("crash at write {k} of {what}"));
        if !crashed {
            assert!(result.is_ok(), "{what}: {result:?}");
        }
        if present || !crashed {
            assert!(present, "{what} finished and is not there");
            eprintln!("{what}: {absent} crashes left it out, then one left it whole");
            break;
        }
    }
    assert!(absent > 0, "{what}: no crash left it out");
}

#[test]
fn a_crash_at_every_write_of_making_a_slot_leaves_it_whole_or_absent() {
    let t = make_disks(3, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let files = populate(&fs, "a", 3);
    fs.unmount().unwrap();
    drop(fs);
    crash_at_every_write(
        &t,
        &files,
        "making a slot",
        |fs| fs.create_slot().map(|_| ()),
        |fs, k| {
            let slots = fs.slots().unwrap();
            for (region, record) in &slots {
                assert!(
                    record.is_ok(),
                    "crash at write {k}: slot {} lists without a readable record: {record:?}",
                    region.slot
                );
            }
            assert!(slots.len() <= 1, "write {k}: {} slots", slots.len());
            slots.len() == 1
        },
    );
}

#[test]
fn a_torn_record_falls_back_to_the_other_half_and_a_slot_without_one_is_named() {
    let t = make_disks(3, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    fs.create_slot().unwrap();
    let region = fs.slots().unwrap()[0].0.clone();
    let uuid = fs.descriptor().fs_uuid;
    fs.unmount().unwrap();
    drop(fs);

    put_record(&t, &uuid, &region, &record_with_a_shard(1, 1));
    let fs = mount(&t);
    assert_eq!(records(&fs), vec![record_with_a_shard(1, 1)], "B is newer");
    fs.unmount().unwrap();
    drop(fs);

    // A torn write of generation 2 into A: B's generation 1 is the newest that verifies.
    let mut torn = record_with_a_shard(1, 2).encode(&uuid, region.record_bytes);
    torn[60] ^= 0xFF;
    let f = drive(&t, region.disk);
    f.write_all_at(&torn, region.offset).unwrap();
    let fs = mount(&t);
    assert_eq!(records(&fs), vec![record_with_a_shard(1, 1)]);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "one half torn");

    // Both halves damaged: the slot is named, the rest of the file system mounts.
    let half = u64::from(region.record_bytes);
    f.write_all_at(&[0xEE; 512], region.offset + half).unwrap();
    let fs = mount(&t);
    let slots = fs.slots().unwrap();
    let why = slots[0].1.as_ref().unwrap_err().to_string();
    assert!(
        why.contains("owner slot 1") && why.contains("checksum") && why.contains("fsck"),
        "{why}"
    );
    fs.unmount().unwrap();
    drop(fs);
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(
        report.problems.iter().any(|p| p.contains("owner slot 1")),
        "{:?}",
        report.problems
    );
}

#[test]
fn deleting_the_disk_of_a_slot_moves_the_region_with_its_record_and_log() {
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let files = populate(&fs, "a", 4);
    fs.create_slot().unwrap();
    let region = fs.slots().unwrap()[0].0.clone();
    let uuid = fs.descriptor().fs_uuid;
    fs.unmount().unwrap();
    drop(fs);
    put_record(&t, &uuid, &region, &record_with_a_shard(1, 1));

    let fs = mount(&t);
    let name = fs
        .descriptor()
        .disks
        .iter()
        .find(|d| d.index == region.disk)
        .unwrap()
        .nsd_name
        .clone();
    let report = fs
        .delete_disks(&[name], &AtomicBool::new(false), &mut |_| {})
        .unwrap();
    assert_eq!(report.restripe.progress.slot_regions_moved, 1, "{report:?}");
    let moved = fs.slots().unwrap()[0].0.clone();
    assert_ne!(moved.disk, region.disk);
    assert_eq!(moved.log_id, region.log_id);
    // The record moves, one generation on, replaying from the start of a fresh log that
    // continues the old one's LSNs (a log's header names where it lies).
    let before = record_with_a_shard(1, 1);
    let after = records(&fs).remove(0);
    assert_eq!(after.generation, before.generation + 1);
    assert!(after.replay_from >= before.replay_from, "{after:?}");
    assert_eq!(
        (after.shards.clone(), after.page_generation),
        (before.shards.clone(), before.page_generation)
    );
    verify(&fs, &files);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after the delete");
    // The slot's owner opens the log at its new place and checkpoints there.
    let s1 = FileSystem::mount_slot(t.reopen(), 1).unwrap();
    s1.unmount().unwrap();
    drop(s1);
    let fs = mount(&t);
    let last = records(&fs).remove(0);
    assert_eq!(last.generation, after.generation + 1);
    assert!(last.replay_from >= after.replay_from, "{last:?}");
    fs.unmount().unwrap();
}

#[test]
fn with_two_metadata_copies_a_region_has_a_copy_in_another_failure_group() {
    let t = make_disks(4, 64 << 20);
    format_fs(
        &t,
        &FormatOptions {
            metadata_replicas: 2,
            max_metadata_replicas: 2,
            ..small_opts()
        },
    );
    let fs = mount(&t);
    fs.create_slot().unwrap();
    let (region, record) = fs.slots().unwrap().remove(0);
    assert_eq!(record.unwrap(), SlotRecord::empty(1));
    let second = region.second.expect("a second copy");
    assert_ne!(second.disk, region.disk, "failure groups are one disk each");
    // The record reads from the second copy alone.
    let f = drive(&t, region.disk);
    f.write_all_at(&vec![0xEE; region.record_bytes as usize], region.offset)
        .unwrap();
    assert_eq!(records(&fs), vec![SlotRecord::empty(1)]);
    fs.unmount().unwrap();
    drop(fs);
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.ill_replicated_metadata, 0);
}

/// The shards given in these tests: high numbers, which no directory of a small file system
/// has reached (directories go to shard `inode count % shards held`).
const GIVEN: [usize; 3] = [250, 251, 255];

#[test]
fn empty_shards_given_to_a_slot_are_no_longer_slot_0s() {
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let files = populate(&fs, "a", 6);
    assert_eq!(fs.create_slot().unwrap(), 1);
    let refused = fs.give_empty_shards(1, &[1]).unwrap_err().to_string();
    assert!(
        refused.contains("inode"),
        "the root's shard is not empty: {refused}"
    );
    let refused = fs.give_empty_shards(2, &[200]).unwrap_err().to_string();
    assert!(refused.contains("no owner slot 2"), "{refused}");
    fs.give_empty_shards(1, &GIVEN).unwrap();
    let desc = fs.descriptor();
    for s in GIVEN {
        assert_eq!(desc.shard_owner(s).slot, 1);
        assert_eq!(desc.shard_owner(s).generation, 1);
    }
    assert_eq!(desc.shard_owner(0).slot, 0);
    // The slot's record is its owner's to write: until that owner checkpoints them, the
    // shards' live roots are the hand-over roots the descriptor keeps.
    assert_eq!(records(&fs), vec![SlotRecord::empty(1)]);
    let roots = desc.root_ptrs();
    assert!(
        GIVEN.iter().all(|s| roots[*s].addr.0 != 0),
        "hand-over roots"
    );
    // New directories go to the shards slot 0 still holds.
    let n = u64::from(desc.shard_count);
    for i in 0..300 {
        let d = fs
            .create_node(
                tessera_fs::ROOT_INO,
                format!("d{i}").as_bytes(),
                tessera_fs::FileKind::Directory,
                0o755,
                0,
                tessera_fs::Caller { uid: 0, gid: 0 },
                None,
            )
            .unwrap();
        assert!(!GIVEN.contains(&((d.ino % n) as usize)), "{d:?}");
    }
    verify(&fs, &files);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after giving shards");

    let fs = mount(&t);
    assert_eq!(fs.descriptor().shard_owner(250).slot, 1);
    assert!(
        fs.give_empty_shards(1, &[250]).is_err(),
        "slot 0 no longer holds it after a remount"
    );
    // An inode number of a given shard is not slot 0's to answer.
    let err = fs.getattr(250 + n * 3).unwrap_err();
    assert!(
        matches!(err, tessera_fs::FsError::ShardElsewhere { shard: 250 }),
        "{err}"
    );
    verify(&fs, &files);
    fs.unmount().unwrap();
}

#[test]
fn a_crash_at_every_write_of_giving_shards_leaves_them_given_or_not() {
    let t = make_disks(3, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let files = populate(&fs, "a", 7);
    fs.create_slot().unwrap();
    fs.unmount().unwrap();
    drop(fs);
    crash_at_every_write(
        &t,
        &files,
        "giving shards",
        |fs| fs.give_empty_shards(1, &GIVEN),
        |fs, k| {
            let desc = fs.descriptor();
            let owners: Vec<u32> = GIVEN.iter().map(|s| desc.shard_owner(*s).slot).collect();
            assert!(
                owners.iter().all(|o| *o == owners[0]),
                "write {k}: given in part: {owners:?}"
            );
            assert_eq!(records(fs), vec![SlotRecord::empty(1)], "write {k}");
            owners[0] == 1
        },
    );
}

#[test]
fn a_slot_whose_record_is_lost_makes_its_shards_unavailable_and_fsck_names_them() {
    let t = make_disks(3, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let files = populate(&fs, "a", 8);
    fs.create_slot().unwrap();
    fs.give_empty_shards(1, &GIVEN).unwrap();
    let region = fs.slots().unwrap()[0].0.clone();
    fs.unmount().unwrap();
    drop(fs);
    let f = drive(&t, region.disk);
    f.write_all_at(&vec![0xEE; 2 * region.record_bytes as usize], region.offset)
        .unwrap();
    // The rest of the file system mounts and works.
    let fs = mount(&t);
    verify(&fs, &files);
    create_file(&fs, tessera_fs::ROOT_INO, b"still-writable");
    fs.unmount().unwrap();
    drop(fs);
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    for s in GIVEN {
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.contains(&format!("shard {s}:")) && p.contains("owner slot 1")),
            "{:?}",
            report.problems
        );
    }
}

/// One disk whose allocation region 0 is the first 127 MiB, region 1 the remaining 33 MiB.
fn two_region_fs() -> TestDisks {
    two_region_disks(1)
}

/// Byte offset of allocation region `r` on a disk of `two_region_fs`.
fn region_offset(r: u64) -> u64 {
    tessera_nsd::layout::data_start_bytes(64 << 10) + r * 32_512 * 4096
}

#[test]
fn a_free_region_given_to_a_slot_takes_nothing_of_slot_0s() {
    let t = two_region_fs();
    let fs = mount(&t);
    fs.create_slot().unwrap();
    let err = fs.give_free_regions(1, &[0]).unwrap_err().to_string();
    assert!(err.contains("in use"), "{err}");
    let err = fs.give_free_regions(1, &[2]).unwrap_err().to_string();
    assert!(err.contains("2 regions"), "{err}");
    fs.give_free_regions(1, &[1]).unwrap();
    assert_eq!(
        records(&fs),
        vec![SlotRecord::empty(1)],
        "the slot's owner records its regions"
    );
    assert_eq!(
        fs.descriptor().slots.unwrap().region_owners,
        vec![0, 1],
        "the owner map"
    );
    let err = fs.give_free_regions(1, &[0]).unwrap_err().to_string();
    assert!(err.contains("in use") || err.contains("keeps"), "{err}");
    // Fill the file system: nothing lands in region 1.
    let data = vec![0xA5u8; 1 << 20];
    let mut written = 0u64;
    for i in 0.. {
        let a = create_file(&fs, tessera_fs::ROOT_INO, format!("f{i}").as_bytes());
        match fs.write(a.ino, 0, &data, false) {
            Ok(n) if n == data.len() => written += n as u64,
            _ => break,
        }
    }
    assert!(written > 64 << 20 && written < 127 << 20, "{written}");
    fs.sync().unwrap();
    let f = drive(&t, 0);
    let mut region = vec![0u8; (f.metadata().unwrap().len() - region_offset(1)) as usize];
    assert!(region.len() > 30 << 20);
    f.read_exact_at(&mut region, region_offset(1)).unwrap();
    assert!(
        region.iter().all(|b| *b == 0),
        "something was written in region 1"
    );
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "a full file system with a region given away");
    let fs = mount(&t);
    assert_eq!(
        fs.allocation_map_rebuilt(),
        None,
        "the stored map reads: the digest leaves the region out"
    );
    assert_eq!(fs.descriptor().slots.unwrap().region_owners, vec![0, 1]);
    fs.unmount().unwrap();
}

#[test]
fn a_crash_at_every_write_of_giving_a_region_leaves_it_given_or_not() {
    let t = two_region_fs();
    let fs = mount(&t);
    let files = populate(&fs, "a", 9);
    fs.create_slot().unwrap();
    fs.unmount().unwrap();
    drop(fs);
    crash_at_every_write(
        &t,
        &files,
        "giving a region",
        |fs| fs.give_free_regions(1, &[1]),
        |fs, k| {
            assert_eq!(
                fs.allocation_map_rebuilt(),
                None,
                "write {k}: the stored map reads"
            );
            let owner = fs
                .descriptor()
                .slots
                .and_then(|s| s.region_owners.get(1).copied())
                .unwrap_or(0);
            owner == 1
        },
    );
}

#[test]
fn disks_are_not_deleted_under_regions_given_to_a_slot() {
    let t = two_region_disks(2);
    let fs = mount(&t);
    fs.create_slot().unwrap();
    fs.give_free_regions(1, &[1]).unwrap();
    let err = fs
        .delete_disks(&["nsd1".into()], &AtomicBool::new(false), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("owner slot 1 does not answer for its part of the disks"),
        "{err}"
    );
    assert_eq!(fs.descriptor().disks.len(), 2, "nothing changed");
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after a refused delete");
}

#[test]
fn with_two_metadata_copies_shards_and_regions_are_given_with_their_second_copies() {
    let t = make_disks(4, 160 << 20);
    format_fs(
        &t,
        &FormatOptions {
            block_size: 64 << 10,
            log_bytes: 4 << 20,
            placement: tessera_fs::Placement::Cluster,
            metadata_replicas: 2,
            max_metadata_replicas: 2,
            ..small_opts()
        },
    );
    let fs = mount(&t);
    let files = populate(&fs, "a", 10);
    fs.create_slot().unwrap();
    fs.give_empty_shards(1, &GIVEN).unwrap();
    fs.give_free_regions(1, &[1]).unwrap();
    let roots = fs.descriptor().root_ptrs();
    assert!(
        GIVEN.iter().all(|s| roots[*s].mirror.is_some()),
        "each hand-over root has its second address: {roots:?}"
    );
    fs.unmount().unwrap();
    drop(fs);
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.ill_replicated_metadata, 0);
    let fs = mount(&t);
    assert_eq!(fs.allocation_map_rebuilt(), None, "both map copies read");
    verify(&fs, &files);
    fs.unmount().unwrap();
}

/// `restripe -m` with shards given to a slot whose owner this mount cannot reach: the
/// slot's part is left and named (its owner moves its own blocks and pages when reached,
/// `slot_owner.rs`); `disk delete` is refused, naming the slot that must answer for its part.
#[test]
fn disks_are_not_deleted_under_shards_given_to_a_slot() {
    let t = make_disks(3, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    fs.create_slot().unwrap();
    fs.give_empty_shards(1, &GIVEN).unwrap();
    fs.set_disk_status(&["nsd2".into()], tessera_fs::DiskStatus::Suspended)
        .unwrap();
    let report = fs
        .restripe(
            tessera_fs::restripe::RestripeMode::Migrate,
            &AtomicBool::new(false),
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
    let err = fs
        .delete_disks(&["nsd2".into()], &AtomicBool::new(false), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("owner slot 1 does not answer"), "{err}");
    assert_eq!(fs.descriptor().disks.len(), 3);
    fs.unmount().unwrap();
}

#[test]
fn a_crash_at_every_write_of_making_a_directory_for_a_slot_leaves_it_given_or_slot_0s() {
    let t = make_disks(3, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let files = populate(&fs, "a", 11);
    fs.create_slot().unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let root = tessera_fs::Caller { uid: 0, gid: 0 };
    crash_at_every_write(
        &t,
        &files,
        "making a directory for a slot",
        |fs| {
            fs.make_directory_for_slot(tessera_fs::ROOT_INO, b"node1", 0o755, root, 1)
                .map(|_| ())
        },
        |fs, k| {
            let listing = fs.readdir(tessera_fs::ROOT_INO, 0).unwrap();
            let Some(&(_, ino, _, _)) = listing.entries.iter().find(|e| e.3 == b"node1") else {
                return false;
            };
            let desc = fs.descriptor();
            let shard = (ino % u64::from(desc.shard_count)) as usize;
            match desc.shard_owner(shard).slot {
                1 => {
                    assert!(
                        matches!(
                            fs.getattr(ino),
                            Err(tessera_fs::FsError::ShardElsewhere { .. })
                        ),
                        "write {k}: a given directory is the slot's to answer"
                    );
                    true
                }
                slot => {
                    // Logged before the give committed: the directory is slot 0's, whole.
                    assert_eq!(slot, 0, "write {k}");
                    assert!(fs.getattr(ino).unwrap().kind == tessera_fs::FileKind::Directory);
                    fs.remove(tessera_fs::ROOT_INO, b"node1", true).unwrap();
                    false
                }
            }
        },
    );
}
