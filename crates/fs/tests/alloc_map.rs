//! The stored allocation map: mount reads it instead of scanning the metadata, a kill at any
//! point leaves it consistent with the metadata (fsck compares the two), a damaged or
//! out-of-date map is found and rebuilt, and a file system of format version 3 (no stored
//! map) is converted at its first mount. Damage is done by writing the drive files directly
//! while the file system is not mounted.

mod common;

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use common::*;
use tessera_drive::BlockDevice;
use tessera_fs::{FileSystem, FsDescriptor, ROOT_INO};
use tessera_nsd::layout::{FS_DESCRIPTOR_MAGIC, FS_DESCRIPTOR_SLOT_OFFSETS};

const DISKS: usize = 4;
const DISK_BYTES: u64 = 64 << 20;

fn setup() -> TestDisks {
    let t = make_disks(DISKS, DISK_BYTES);
    format_fs(&t, &small_opts());
    t
}

fn descriptor_on_disk(t: &TestDisks) -> FsDescriptor {
    let devs: Vec<Arc<dyn BlockDevice>> = t.reopen().into_iter().map(|(_, d)| d).collect();
    tessera_fs::read_descriptor(&devs).unwrap()
}

fn drive(t: &TestDisks, disk: usize) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(t.dir.path().join(format!("d{disk}")))
        .unwrap()
}

fn assert_fsck_clean(t: &TestDisks) {
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "fsck: {:?}", report.problems);
}

/// Files of a few sizes (fragments, whole blocks, several blocks), some deleted again.
fn churn(fs: &FileSystem, round: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut kept = Vec::new();
    for i in 0..24u32 {
        let name = format!("r{round}-f{i}").into_bytes();
        let len = [100usize, 5000, 70_000, 256 << 10, 700_000][(i % 5) as usize];
        let data = pattern(len, u64::from(round * 100 + i));
        let a = create_file(fs, ROOT_INO, &name);
        assert_eq!(fs.write(a.ino, 0, &data, false).unwrap(), len);
        if i % 3 == 0 {
            fs.remove(ROOT_INO, &name, false).unwrap();
        } else {
            kept.push((name, data));
        }
    }
    kept
}

fn assert_files(fs: &FileSystem, files: &[(Vec<u8>, Vec<u8>)]) {
    for (name, data) in files {
        let a = fs.lookup(ROOT_INO, name).unwrap();
        let got = fs.read(a.ino, 0, u32::try_from(a.size).unwrap()).unwrap();
        assert!(got == *data, "{}", String::from_utf8_lossy(name));
    }
}

#[test]
fn mount_reads_the_stored_map_and_it_matches_the_metadata() {
    let t = setup();
    let fs = mount(&t);
    assert_eq!(
        fs.allocation_map_rebuilt(),
        None,
        "a new file system's map is stored"
    );
    let mut files = churn(&fs, 0);
    fs.checkpoint().unwrap();
    files.extend(churn(&fs, 1));
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t);

    let fs = mount(&t);
    assert_eq!(fs.allocation_map_rebuilt(), None);
    assert_files(&fs, &files);
    // Stopped without a checkpoint, with changes and unlogged allocations in between: the
    // stored map of the last checkpoint plus the log is the metadata's map.
    files.extend(churn(&fs, 2));
    fs.checkpoint().unwrap();
    files.extend(churn(&fs, 3));
    fs.sync().unwrap();
    fs.fence();
    drop(fs);
    assert_fsck_clean(&t);
    let fs = mount(&t);
    assert_eq!(fs.allocation_map_rebuilt(), None);
    assert_files(&fs, &files);
    fs.unmount().unwrap();
}

/// The region and current slot of chunk 0 of the first disk's map, as (drive, offset).
fn first_chunk_slots(t: &TestDisks) -> [(usize, u64); 2] {
    let desc = descriptor_on_disk(t);
    let region = desc
        .alloc_map
        .expect("format version 4 stores the map")
        .regions[0];
    let on = region.on_disk as usize;
    [(on, region.offset), (on, region.offset + 4096)]
}

fn generation_of_slot(t: &TestDisks, (disk, offset): (usize, u64)) -> Option<u64> {
    let mut head = [0u8; 32];
    drive(t, disk).read_exact_at(&mut head, offset).unwrap();
    (&head[0..4] == b"TSAM").then(|| u64::from_le_bytes(head[16..24].try_into().unwrap()))
}

#[test]
fn a_damaged_map_is_rebuilt_at_mount_and_repaired_by_fsck() {
    let t = setup();
    let fs = mount(&t);
    let files = churn(&fs, 0);
    fs.unmount().unwrap();
    drop(fs);
    // Damage the newest copy of the first chunk (the older one is still valid and would
    // hand out blocks that are in use if it were taken).
    let slots = first_chunk_slots(&t);
    let newest = *slots
        .iter()
        .max_by_key(|s| generation_of_slot(&t, **s))
        .unwrap();
    let older = slots.iter().copied().find(|s| *s != newest).unwrap();
    assert!(
        generation_of_slot(&t, older).is_some(),
        "both slots of the chunk have been written"
    );
    drive(&t, newest.0)
        .write_all_at(&[0x5A; 64], newest.1 + 100)
        .unwrap();

    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.contains("allocation map unreadable")),
        "{:?}",
        report.problems
    );
    let fixed = tessera_fs::fsck(t.reopen(), true).unwrap();
    assert!(fixed.repaired >= 1, "{fixed:?}");
    assert_fsck_clean(&t);

    // Damaged again: mount rebuilds the map by a scan, serves every file and stores it again.
    let slots = first_chunk_slots(&t);
    for s in slots {
        drive(&t, s.0).write_all_at(&[0xA5; 64], s.1 + 200).unwrap();
    }
    let fs = mount(&t);
    let why = fs.allocation_map_rebuilt().expect("rebuilt").to_string();
    assert!(why.contains("no usable copy"), "{why}");
    assert_files(&fs, &files);
    let more = churn(&fs, 1);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t);
    let fs = mount(&t);
    assert_eq!(fs.allocation_map_rebuilt(), None, "stored whole again");
    assert_files(&fs, &files);
    assert_files(&fs, &more);
    fs.unmount().unwrap();
}

#[test]
fn a_lost_write_of_the_map_is_caught_by_the_digest() {
    let t = setup();
    let fs = mount(&t);
    let files = churn(&fs, 0);
    fs.unmount().unwrap();
    drop(fs);
    // Keep the map regions as they are now, change the map, then put the old bytes back:
    // every slot is valid, but some chunks are older than the checkpoint says.
    let desc = descriptor_on_disk(&t);
    let regions = desc.alloc_map.unwrap().regions;
    let save = |t: &TestDisks| -> Vec<Vec<u8>> {
        regions
            .iter()
            .map(|r| {
                let mut b = vec![0; r.bytes as usize];
                drive(t, r.on_disk as usize)
                    .read_exact_at(&mut b, r.offset)
                    .unwrap();
                b
            })
            .collect()
    };
    let before = save(&t);
    let fs = mount(&t);
    let more = churn(&fs, 1);
    fs.unmount().unwrap();
    drop(fs);
    assert_ne!(save(&t), before, "the churn changed the stored map");
    for (r, bytes) in regions.iter().zip(&before) {
        drive(&t, r.on_disk as usize)
            .write_all_at(bytes, r.offset)
            .unwrap();
    }
    let fs = mount(&t);
    let why = fs.allocation_map_rebuilt().expect("rebuilt").to_string();
    assert!(why.contains("older than the checkpoint"), "{why}");
    assert_files(&fs, &files);
    assert_files(&fs, &more);
    // Allocating after the rebuild never hands out a block in use.
    let third = churn(&fs, 2);
    assert_files(&fs, &more);
    assert_files(&fs, &third);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t);
}

/// Rewrites the newest descriptor as format version 3 wrote it: no `alloc_map` (and no
/// `policy`, which came later).
fn make_version_3(t: &TestDisks) {
    let mut desc = descriptor_on_disk(t);
    desc.alloc_map = None;
    desc.replication = None;
    rewrite_as(t, desc, 3, 7);
}

/// Rewrites the newest descriptor as format version 4 wrote it: no `policy`.
fn make_version_4(t: &TestDisks) {
    let mut desc = descriptor_on_disk(t);
    desc.replication = None;
    rewrite_as(t, desc, 4, 6);
}

/// Rewrites the newest descriptor as format version 5 wrote it: no `replication`.
fn make_version_5(t: &TestDisks) {
    let mut desc = descriptor_on_disk(t);
    desc.replication = None;
    rewrite_as(t, desc, 5, 5);
}

/// Rewrites the newest descriptor as format version 6 wrote it: no `metadata_copies`.
fn make_version_6(t: &TestDisks) {
    let desc = descriptor_on_disk(t);
    assert!(desc.metadata_copies.is_none(), "one metadata copy");
    rewrite_as(t, desc, 6, 4);
}

/// Rewrites the newest descriptor as format version 7 wrote it: no `slots`.
fn make_version_7(t: &TestDisks) {
    let desc = descriptor_on_disk(t);
    assert!(desc.slots.is_none(), "no owner slot");
    rewrite_as(t, desc, 7, 3);
}

/// Rewrites the newest descriptor as format version 8 wrote it: no `stopped`.
fn make_version_8(t: &TestDisks) {
    let desc = descriptor_on_disk(t);
    assert!(desc.stopped.is_none(), "no disk stopped");
    rewrite_as(t, desc, 8, 2);
}

/// Rewrites the newest descriptor as format version 9 wrote it: no `slot_moves`.
fn make_version_9(t: &TestDisks) {
    let desc = descriptor_on_disk(t);
    assert!(desc.slot_moves.is_none(), "no slot region moving");
    rewrite_as(t, desc, 9, 1);
}

/// Writes `desc` as the next generation in format `version`, without its last `missing`
/// fields (each `None`, one zero byte).
fn rewrite_as(t: &TestDisks, mut desc: FsDescriptor, version: u32, missing: usize) {
    assert!(desc.policy.is_none(), "older formats have no policy");
    desc.generation += 1;
    let mut payload = postcard::to_stdvec(&desc).unwrap();
    for _ in 0..missing {
        assert_eq!(payload.pop(), Some(0), "None is the last byte");
    }
    let mut slot = vec![0u8; 32 + payload.len()];
    slot[0..8].copy_from_slice(&FS_DESCRIPTOR_MAGIC);
    slot[8..12].copy_from_slice(&version.to_le_bytes());
    slot[12..20].copy_from_slice(&desc.generation.to_le_bytes());
    slot[20..24].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    slot[24..28].copy_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
    slot[32..].copy_from_slice(&payload);
    let offset = FS_DESCRIPTOR_SLOT_OFFSETS[(desc.generation % 2) as usize];
    for d in desc.disks.iter().filter(|d| d.holds_descriptor) {
        let f = drive(t, d.index as usize);
        f.write_all_at(&slot, offset).unwrap();
        f.sync_all().unwrap();
    }
}

#[test]
fn a_format_3_file_system_is_converted_at_its_first_mount() {
    let t = setup();
    let fs = mount(&t);
    let files = churn(&fs, 0);
    fs.unmount().unwrap();
    drop(fs);
    make_version_3(&t);
    assert!(descriptor_on_disk(&t).alloc_map.is_none());
    // fsck of a version-3 file system checks what it has and finds nothing wrong.
    assert_fsck_clean(&t);

    // Killed before its first checkpoint: still version 3, converted again next time.
    let fs = mount(&t);
    let why = fs.allocation_map_rebuilt().expect("scanned").to_string();
    assert!(why.contains("format version 3"), "{why}");
    let more = churn(&fs, 1);
    fs.sync().unwrap();
    fs.fence();
    drop(fs);
    assert!(descriptor_on_disk(&t).alloc_map.is_none());
    assert_fsck_clean(&t);

    let fs = mount(&t);
    assert!(fs.allocation_map_rebuilt().is_some());
    assert_files(&fs, &files);
    assert_files(&fs, &more);
    fs.unmount().unwrap();
    drop(fs);
    assert!(descriptor_on_disk(&t).alloc_map.is_some(), "version 4 now");
    assert_fsck_clean(&t);
    let fs = mount(&t);
    assert_eq!(fs.allocation_map_rebuilt(), None);
    assert_files(&fs, &files);
    assert_files(&fs, &more);
    fs.unmount().unwrap();
}

/// The format version in the header of the newest descriptor slot.
fn slot_version(t: &TestDisks) -> u32 {
    let desc = descriptor_on_disk(t);
    let d = desc.disks.iter().find(|d| d.holds_descriptor).unwrap();
    let mut head = [0u8; 12];
    let offset = FS_DESCRIPTOR_SLOT_OFFSETS[(desc.generation % 2) as usize];
    drive(t, d.index as usize)
        .read_exact_at(&mut head, offset)
        .unwrap();
    u32::from_le_bytes(head[8..12].try_into().unwrap())
}

/// The format version the first checkpoint of a file system of any older one writes.
const CURRENT_VERSION: u32 = 10;

/// A file system made now (`before` runs on its first mount) and rewritten as format
/// `version` wrote it (`rewrite`): fsck finds it clean, and it mounts (`at_mount` looks at
/// it once its files are read and more are written); its first checkpoint writes the
/// current version (`upgraded` looks at that descriptor), fsck is clean again, and a
/// second mount reads every file.
fn mounts_as_the_current_format(
    version: u32,
    rewrite: fn(&TestDisks),
    before: impl FnOnce(&FileSystem),
    at_mount: impl FnOnce(&FileSystem),
    upgraded: impl FnOnce(&FsDescriptor),
) {
    let t = setup();
    let fs = mount(&t);
    let files = churn(&fs, 0);
    before(&fs);
    fs.unmount().unwrap();
    drop(fs);
    assert_eq!(slot_version(&t), CURRENT_VERSION);
    rewrite(&t);
    assert_eq!(slot_version(&t), version);
    assert_fsck_clean(&t);
    let fs = mount(&t);
    assert_files(&fs, &files);
    let more = churn(&fs, 1);
    at_mount(&fs);
    fs.unmount().unwrap();
    drop(fs);
    assert_eq!(
        slot_version(&t),
        CURRENT_VERSION,
        "the first checkpoint writes the current version"
    );
    upgraded(&descriptor_on_disk(&t));
    assert_fsck_clean(&t);
    let fs = mount(&t);
    assert_files(&fs, &files);
    assert_files(&fs, &more);
    fs.unmount().unwrap();
}

#[test]
fn a_format_4_file_system_mounts_as_format_10_without_a_policy() {
    mounts_as_the_current_format(
        4,
        make_version_4,
        |_| {},
        |fs| {
            let rebuilt = fs.allocation_map_rebuilt();
            assert_eq!(rebuilt, None, "version 4 stored its map");
        },
        |desc| assert_eq!(desc.policy, None),
    );
}

#[test]
fn a_format_5_file_system_mounts_as_format_10_with_one_copy() {
    mounts_as_the_current_format(
        5,
        make_version_5,
        |_| {},
        |fs| assert_eq!(fs.descriptor().replication().data, 1),
        |_| {},
    );
}

#[test]
fn a_format_6_file_system_mounts_as_format_10_with_one_metadata_copy() {
    mounts_as_the_current_format(
        6,
        make_version_6,
        |_| {},
        |fs| assert_eq!(fs.descriptor().metadata_replicas(), 1),
        |_| {},
    );
}

#[test]
fn a_format_7_file_system_mounts_as_format_10_without_owner_slots() {
    mounts_as_the_current_format(
        7,
        make_version_7,
        |_| {},
        |fs| {
            assert!(fs.slots().unwrap().is_empty());
            // The first slot of a converted file system is made as on a new one.
            assert_eq!(fs.create_slot().unwrap(), 1);
        },
        |desc| assert_eq!(desc.slot_regions().len(), 1),
    );
}

#[test]
fn a_format_9_file_system_mounts_as_format_10_with_no_slot_region_moving() {
    mounts_as_the_current_format(
        9,
        make_version_9,
        |fs| assert_eq!(fs.create_slot().unwrap(), 1),
        |_| {},
        |desc| assert_eq!(desc.slot_moves, None),
    );
}

#[test]
fn a_format_8_file_system_mounts_as_format_10_with_no_disk_stopped() {
    mounts_as_the_current_format(
        8,
        make_version_8,
        |_| {},
        |fs| assert!(fs.disk_availability().iter().all(|(_, up)| *up)),
        |_| {},
    );
}
