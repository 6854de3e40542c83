//! On-disk encoding: the file-system descriptor's two slots and replicas, checkpoint images,
//! per-sector data checksums, missing disks, and the limits that must fail cleanly (inode
//! limit, data ENOSPC). Damage is done the way a bad drive would: by writing the drive files
//! directly with `std::fs` while the file system is not mounted.

mod common;

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use common::*;
use tessera_drive::BlockDevice;
use tessera_fs::{Caller, FileKind, FileSystem, FormatOptions, FsDescriptor, FsError, ROOT_INO};
use tessera_nsd::layout::{FS_DESCRIPTOR_MAGIC, FS_DESCRIPTOR_SLOT_OFFSETS};
use tessera_nsd::NsdId;

const ROOT: Caller = Caller { uid: 0, gid: 0 };
const DISKS: usize = 4;
const DISK_BYTES: u64 = 64 << 20;
/// Where a slot's payload starts (after the 32-byte header, see descriptor.rs).
const SLOT_PAYLOAD_OFFSET: u64 = 32;

fn disk_path(t: &TestDisks, i: usize) -> PathBuf {
    t.dir.path().join(format!("d{i}"))
}

fn read_bytes(t: &TestDisks, disk: usize, offset: u64, len: usize) -> Vec<u8> {
    let f = std::fs::File::open(disk_path(t, disk)).unwrap();
    let mut buf = vec![0; len];
    f.read_exact_at(&mut buf, offset).unwrap();
    buf
}

/// A file system made and cleanly unmounted.
fn made_and_unmounted() -> TestDisks {
    let t = setup(&small_opts());
    let fs = mount(&t);
    fs.unmount().unwrap();
    drop(fs);
    t
}

/// Calls `f(disk, slot offset)` for both descriptor slots of every descriptor disk.
fn for_each_descriptor_slot(t: &TestDisks, f: &mut dyn FnMut(usize, u64)) {
    for d in descriptor_disks(t) {
        for slot_offset in FS_DESCRIPTOR_SLOT_OFFSETS {
            f(d, slot_offset);
        }
    }
}

/// Inverts `len` bytes at `offset` of drive file `disk`.
fn flip(t: &TestDisks, disk: usize, offset: u64, len: usize) {
    let before = read_bytes(t, disk, offset, len);
    let after: Vec<u8> = before.iter().map(|b| !b).collect();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(disk_path(t, disk))
        .unwrap();
    f.write_all_at(&after, offset).unwrap();
    f.sync_all().unwrap();
    assert_ne!(
        read_bytes(t, disk, offset, len),
        before,
        "the flip must change the drive"
    );
}

/// `(generation)` of the descriptor in `slot` of `disk`, or `None` when the slot is empty.
fn slot_generation(t: &TestDisks, disk: usize, slot: usize) -> Option<u64> {
    let head = read_bytes(t, disk, FS_DESCRIPTOR_SLOT_OFFSETS[slot], 32);
    (head[0..8] == FS_DESCRIPTOR_MAGIC)
        .then(|| u64::from_le_bytes(head[12..20].try_into().unwrap()))
}

fn setup(opts: &FormatOptions) -> TestDisks {
    let t = make_disks(DISKS, DISK_BYTES);
    format_fs(&t, opts);
    t
}

fn descriptor_on_disk(t: &TestDisks) -> FsDescriptor {
    let devs: Vec<Arc<dyn BlockDevice>> = t.reopen().into_iter().map(|(_, d)| d).collect();
    tessera_fs::read_descriptor(&devs).unwrap()
}

fn write_new_file(fs: &FileSystem, name: &[u8], data: &[u8]) -> u64 {
    let a = create_file(fs, ROOT_INO, name);
    assert_eq!(fs.write(a.ino, 0, data, false).unwrap(), data.len());
    a.ino
}

fn read_file(fs: &FileSystem, name: &[u8]) -> Result<Vec<u8>, FsError> {
    let a = fs.lookup(ROOT_INO, name)?;
    fs.read(a.ino, 0, u32::try_from(a.size).unwrap())
}

fn assert_fsck_clean(t: &TestDisks) {
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "fsck: {:?}", report.problems);
}

/// Indices of the disks whose slots hold a descriptor.
fn descriptor_disks(t: &TestDisks) -> Vec<usize> {
    (0..DISKS)
        .filter(|d| slot_generation(t, *d, 0).is_some() || slot_generation(t, *d, 1).is_some())
        .collect()
}

#[test]
fn descriptor_survives_remount_and_highest_generation_wins() {
    let t = setup(&small_opts());
    let fs = mount(&t);
    let g0 = fs.descriptor().generation;
    write_new_file(&fs, b"f", b"before checkpoints");
    for k in 1..=3 {
        fs.checkpoint().unwrap();
        assert_eq!(
            fs.descriptor().generation,
            g0 + k,
            "each checkpoint bumps the generation"
        );
    }
    fs.unmount().unwrap();
    let last = fs.descriptor().generation;
    assert_eq!(last, g0 + 4, "unmount writes one more checkpoint");
    drop(fs);

    // Three replicas, on distinct failure groups; each holds the last two generations, each
    // in the slot of its parity.
    let holders = descriptor_disks(&t);
    assert_eq!(holders.len(), 3, "descriptor replicas: {holders:?}");
    for d in &holders {
        assert_eq!(
            slot_generation(&t, *d, (last % 2) as usize),
            Some(last),
            "disk {d}"
        );
        assert_eq!(
            slot_generation(&t, *d, ((last + 1) % 2) as usize),
            Some(last - 1),
            "disk {d}"
        );
    }
    let desc = descriptor_on_disk(&t);
    assert_eq!(desc.generation, last);

    let fs = mount(&t);
    assert_eq!(fs.descriptor().generation, last);
    assert_eq!(fs.descriptor(), desc);
    assert_eq!(read_file(&fs, b"f").unwrap(), b"before checkpoints");
    fs.unmount().unwrap();
}

#[test]
fn damaged_newest_slot_on_one_replica_is_skipped() {
    let t = setup(&small_opts());
    let fs = mount(&t);
    write_new_file(&fs, b"f", b"payload");
    fs.unmount().unwrap();
    let last = fs.descriptor().generation;
    drop(fs);
    let d = descriptor_disks(&t)[0];
    let slot = (last % 2) as usize;
    flip(
        &t,
        d,
        FS_DESCRIPTOR_SLOT_OFFSETS[slot] + SLOT_PAYLOAD_OFFSET + 7,
        16,
    );

    let fs = mount(&t);
    assert_eq!(
        fs.descriptor().generation,
        last,
        "the other replicas still hold the newest"
    );
    assert_eq!(read_file(&fs, b"f").unwrap(), b"payload");
    // The next checkpoints rewrite both slots, which repairs the damaged copy.
    fs.checkpoint().unwrap();
    fs.unmount().unwrap();
    let now = fs.descriptor().generation;
    drop(fs);
    assert_eq!(slot_generation(&t, d, (now % 2) as usize), Some(now));
    assert_eq!(
        slot_generation(&t, d, ((now + 1) % 2) as usize),
        Some(now - 1)
    );
}

#[test]
fn damaged_newest_slot_everywhere_falls_back_to_the_other_slot() {
    let t = setup(&small_opts());
    let fs = mount(&t);
    write_new_file(&fs, b"f", b"checkpointed");
    // Two checkpoints with nothing in between: the older slot then describes the same state,
    // and its image blocks were not reused.
    fs.checkpoint().unwrap();
    fs.unmount().unwrap();
    let last = fs.descriptor().generation;
    drop(fs);
    let slot = (last % 2) as usize;
    for d in descriptor_disks(&t) {
        // A torn header (length field) on one disk, a bad payload on the others.
        let at = if d == 0 {
            20
        } else {
            SLOT_PAYLOAD_OFFSET + 100
        };
        flip(&t, d, FS_DESCRIPTOR_SLOT_OFFSETS[slot] + at, 4);
    }
    assert_eq!(descriptor_on_disk(&t).generation, last - 1);
    let fs = mount(&t);
    assert_eq!(fs.descriptor().generation, last - 1);
    assert_eq!(read_file(&fs, b"f").unwrap(), b"checkpointed");
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t);
}

#[test]
fn damaged_older_slot_everywhere_is_ignored() {
    let t = setup(&small_opts());
    let fs = mount(&t);
    write_new_file(&fs, b"f", b"x");
    fs.unmount().unwrap();
    let last = fs.descriptor().generation;
    drop(fs);
    for d in descriptor_disks(&t) {
        flip(
            &t,
            d,
            FS_DESCRIPTOR_SLOT_OFFSETS[((last + 1) % 2) as usize] + SLOT_PAYLOAD_OFFSET,
            8,
        );
    }
    let fs = mount(&t);
    assert_eq!(fs.descriptor().generation, last);
    assert_eq!(read_file(&fs, b"f").unwrap(), b"x");
    fs.unmount().unwrap();
}

#[test]
fn all_descriptor_copies_damaged_fails_mount_naming_the_descriptor() {
    let t = made_and_unmounted();
    for_each_descriptor_slot(&t, &mut |d, slot_offset| {
        flip(&t, d, slot_offset + SLOT_PAYLOAD_OFFSET + 3, 8);
    });
    let err = FileSystem::mount(t.reopen()).unwrap_err();
    assert!(matches!(err, FsError::NoDescriptor(_)), "{err:?}");
    assert_eq!(err.errno(), libc::EIO);
    let msg = err.to_string();
    assert!(msg.contains("descriptor"), "{msg}");
    assert!(
        msg.contains("checksum mismatch"),
        "the reason is given: {msg}"
    );
    // fsck refuses in the same words rather than inventing a file system.
    let err = tessera_fs::fsck(t.reopen(), false).unwrap_err();
    assert!(err.to_string().contains("descriptor"), "{err}");
}

/// A file system of format version 2 (whole checkpoint images, before the on-disk shard
/// trees) is refused at mount and by fsck, saying what to do, and nothing is written.
#[test]
fn a_format_2_file_system_is_refused_with_what_to_do() {
    let t = setup(&small_opts());
    let fs = mount(&t);
    fs.unmount().unwrap();
    drop(fs);
    // The format version is the slot header's bytes 8..12, outside the payload checksum.
    for d in descriptor_disks(&t) {
        for slot_offset in FS_DESCRIPTOR_SLOT_OFFSETS {
            if read_bytes(&t, d, slot_offset, 8) != b"TSRFSD01" {
                continue;
            }
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(disk_path(&t, d))
                .unwrap();
            f.write_all_at(&2u32.to_le_bytes(), slot_offset + 8)
                .unwrap();
        }
    }
    let before: Vec<Vec<u8>> = (0..DISKS).map(|d| read_bytes(&t, d, 0, 1 << 20)).collect();
    for err in [
        FileSystem::mount(t.reopen()).unwrap_err(),
        tessera_fs::fsck(t.reopen(), true).unwrap_err(),
    ] {
        let msg = err.to_string();
        assert!(msg.contains("format version 2"), "{msg}");
        assert!(msg.contains("recreate the file system"), "{msg}");
    }
    let after: Vec<Vec<u8>> = (0..DISKS).map(|d| read_bytes(&t, d, 0, 1 << 20)).collect();
    assert!(before == after, "a refused file system is not written to");
}

#[test]
fn damaged_shard_root_page_fails_mount_naming_the_page() {
    let t = setup(&small_opts());
    let fs = mount(&t);
    write_new_file(&fs, b"f", &pattern(1000, 1));
    fs.unmount().unwrap();
    drop(fs);
    let desc = descriptor_on_disk(&t);
    // A page address is the disk index (top 16 bits) and the sub-block number.
    let root = desc.checkpoint.roots[1];
    let (disk, sub_block) = ((root.addr >> 48) as usize, root.addr & ((1 << 48) - 1));
    flip(&t, disk, desc.sub_block_offset(sub_block) + 100, 1);
    let err = FileSystem::mount(t.reopen()).unwrap_err();
    assert_eq!(err.errno(), libc::EIO, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("metadata page {:#x}", root.addr)),
        "{msg}"
    );
    assert!(msg.contains("checksum"), "{msg}");
    assert!(msg.contains("fsck"), "the message says what to do: {msg}");
}

/// Finds `needle` at a sector boundary in one of the drive files: `(disk, offset)`.
fn find_on_drives(t: &TestDisks, needle: &[u8]) -> (usize, u64) {
    const CHUNK: u64 = 1 << 20;
    let mut hits = Vec::new();
    for d in 0..DISKS {
        for chunk in 0..DISK_BYTES / CHUNK {
            let buf = read_bytes(t, d, chunk * CHUNK, CHUNK as usize);
            for s in (0..buf.len()).step_by(4096) {
                if buf[s..].starts_with(needle) {
                    hits.push((d, chunk * CHUNK + s as u64));
                }
            }
        }
    }
    assert_eq!(
        hits.len(),
        1,
        "the pattern must be on the drives exactly once: {hits:?}"
    );
    hits[0]
}

#[test]
fn flipped_data_byte_gives_checksum_error_naming_the_drive() {
    let t = setup(&small_opts());
    let fs = mount(&t);
    let block = 256 << 10;
    let data = pattern(3 * block, 42);
    let ino = write_new_file(&fs, b"victim", &data);
    write_new_file(&fs, b"bystander", &pattern(100_000, 7));
    fs.unmount().unwrap();
    drop(fs);

    // Damage one byte in the middle block, 5 sectors and 17 bytes in.
    let at = block + 5 * 4096;
    let (disk, offset) = find_on_drives(&t, &data[at..at + 64]);
    flip(&t, disk, offset + 17, 1);

    let fs = mount(&t);
    let err = fs.read(ino, 0, data.len() as u32).unwrap_err();
    let FsError::Checksum {
        nsd,
        offset: bad,
        ino: bad_ino,
    } = &err
    else {
        panic!("expected a checksum error, got {err:?}");
    };
    assert_eq!(err.errno(), libc::EIO);
    assert_eq!(*bad_ino, ino);
    assert_eq!(
        *bad, offset,
        "the error gives the byte offset of the damaged sector"
    );
    let drive = disk_path(&t, disk).display().to_string();
    assert!(
        nsd.contains(&drive) || *nsd == format!("nsd{disk}"),
        "{err}"
    );
    assert!(err.to_string().contains(nsd.as_str()), "{err}");
    // Only the damaged sector fails: the rest of the file, and other files, read.
    assert_eq!(
        fs.read(ino, 0, (at - 4096) as u32).unwrap(),
        data[..at - 4096]
    );
    let tail = (at + 4096) as u64;
    assert_eq!(
        fs.read(ino, tail, block as u32).unwrap(),
        data[tail as usize..][..block]
    );
    assert_eq!(fs.read(ino, at as u64, 1).unwrap_err().errno(), libc::EIO);
    assert_eq!(read_file(&fs, b"bystander").unwrap(), pattern(100_000, 7));
    // An unaligned write into the damaged sector must not launder the damage.
    let err = fs.write(ino, at as u64 + 100, b"zz", false).unwrap_err();
    assert_eq!(err.errno(), libc::EIO, "{err}");
    // Overwriting the whole sector replaces the bad data.
    fs.write(ino, at as u64, &data[at..at + 4096], false)
        .unwrap();
    assert_eq!(fs.read(ino, 0, data.len() as u32).unwrap(), data);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t);
}

/// The checksum error says "checksum mismatch on NSD {nsd}", but `nsd` is the device's path
/// (`BlockDevice::name`), not the NSD name an administrator looks up with `tessera nsd ls`;
/// `MissingDisk` in the same crate does name the NSD.
#[test]
fn checksum_error_names_the_nsd() {
    let t = setup(&small_opts());
    let fs = mount(&t);
    let data = pattern(64 << 10, 99);
    let ino = write_new_file(&fs, b"victim", &data);
    fs.unmount().unwrap();
    drop(fs);
    let (disk, offset) = find_on_drives(&t, &data[..64]);
    flip(&t, disk, offset, 1);
    let fs = mount(&t);
    let err = fs.read(ino, 0, data.len() as u32).unwrap_err();
    let FsError::Checksum { nsd, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(*nsd, format!("nsd{disk}"), "{err}");
}

#[test]
fn missing_disk_fails_mount_naming_the_nsd() {
    let t = setup(&small_opts());
    let fs = mount(&t);
    fs.unmount().unwrap();
    drop(fs);
    // The last disk holds no descriptor; the first holds one and the recovery log.
    for gone in [DISKS - 1, 0] {
        let disks: Vec<(NsdId, Arc<dyn BlockDevice>)> = t
            .reopen()
            .into_iter()
            .enumerate()
            .filter(|(i, _)| *i != gone)
            .map(|(_, d)| d)
            .collect();
        assert_eq!(disks.len(), DISKS - 1);
        let err = FileSystem::mount(disks.clone()).unwrap_err();
        let FsError::MissingDisk { nsd, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(*nsd, format!("nsd{gone}"));
        assert!(err.to_string().contains(&format!("nsd{gone}")), "{err}");
        assert_eq!(err.errno(), libc::EIO);
        let err = tessera_fs::fsck(disks, false).unwrap_err();
        assert!(err.to_string().contains(&format!("nsd{gone}")), "{err}");
    }
    // With all disks back, it mounts.
    mount(&t).unmount().unwrap();
}

#[test]
fn inode_limit_gives_enospc_mentioning_the_option() {
    let opts = FormatOptions {
        max_inodes: 50,
        ..small_opts()
    };
    let t = setup(&opts);
    let fs = mount(&t);
    let mut made = Vec::new();
    let err = loop {
        let name = format!("f{}", made.len());
        let kind = if made.len() % 5 == 0 {
            FileKind::Directory
        } else {
            FileKind::Regular
        };
        match fs.create_node(ROOT_INO, name.as_bytes(), kind, 0o644, 0, ROOT, None) {
            Ok(_) => made.push(name),
            Err(e) => break e,
        }
        assert!(made.len() <= 50, "the inode limit is not enforced");
    };
    assert_eq!(made.len(), 49, "the root uses one of the 50 inodes");
    assert!(matches!(err, FsError::NoInodes { max: 50 }), "{err:?}");
    assert_eq!(err.errno(), libc::ENOSPC);
    assert!(err.to_string().contains("--inode-limit"), "{err}");
    assert_eq!(fs.statfs().inodes_free, 0);
    // Every kind of creation is refused, and a refused one leaves no trace.
    let sym = fs.create_node(
        ROOT_INO,
        b"s",
        FileKind::Symlink,
        0o777,
        0,
        ROOT,
        Some(b"t"),
    );
    assert_eq!(sym.unwrap_err().errno(), libc::ENOSPC);
    assert_eq!(fs.lookup(ROOT_INO, b"s").unwrap_err().errno(), libc::ENOENT);
    // Hard links need no inode.
    let f1 = fs.lookup(ROOT_INO, b"f1").unwrap();
    fs.link(f1.ino, ROOT_INO, b"f1-link").unwrap();
    // Freeing one makes room for one.
    fs.remove(ROOT_INO, b"f2", false).unwrap();
    create_file(&fs, ROOT_INO, b"again");
    let err = fs.create_node(ROOT_INO, b"more", FileKind::Regular, 0o644, 0, ROOT, None);
    assert_eq!(err.unwrap_err().errno(), libc::ENOSPC);
    fs.unmount().unwrap();
    drop(fs);
    // The limit is part of the descriptor and holds after a remount.
    let fs = mount(&t);
    let err = fs.create_node(ROOT_INO, b"more", FileKind::Regular, 0o644, 0, ROOT, None);
    assert!(matches!(err, Err(FsError::NoInodes { max: 50 })), "{err:?}");
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t);
}

#[test]
fn data_enospc_never_corrupts() {
    // 2 disks of 24 MiB with 256 KiB blocks: about 40 MiB for data after the log.
    let t = make_disks(2, 24 << 20);
    let opts = FormatOptions {
        log_bytes: 2 << 20,
        ..small_opts()
    };
    format_fs(&t, &opts);
    let fs = mount(&t);
    let mut kept: Vec<(String, Vec<u8>)> = Vec::new();
    let mut failure = None;
    for i in 0..200u64 {
        let name = format!("f{i}");
        let data = pattern(((i % 7) as usize + 1) * 300_000 + i as usize * 37, i);
        let a = fs.create_node(
            ROOT_INO,
            name.as_bytes(),
            FileKind::Regular,
            0o644,
            0,
            ROOT,
            None,
        );
        let a = a.unwrap();
        match fs.write(a.ino, 0, &data, false) {
            Ok(n) => {
                assert_eq!(n, data.len());
                kept.push((name, data));
            }
            Err(e) => {
                failure = Some((name, data, e));
                break;
            }
        }
    }
    let (name, data, err) = failure.expect("the disks must fill up");
    assert!(matches!(err, FsError::NoSpace { .. }), "{err:?}");
    assert_eq!(err.errno(), libc::ENOSPC);
    assert!(err.to_string().contains("system"), "names the pool: {err}");
    // The file whose write failed holds a prefix of its data, readable without error.
    let got = read_file(&fs, name.as_bytes()).unwrap();
    assert!(got.len() < data.len());
    assert!(
        got == data[..got.len()],
        "the partial file holds a prefix of what was written"
    );
    // Small writes that fit in the inode still work, and so do metadata operations.
    let tiny = create_file(&fs, ROOT_INO, b"tiny");
    fs.write(tiny.ino, 0, b"fits inline", false).unwrap();
    fs.sync().unwrap();
    for (n, d) in &kept {
        assert!(
            read_file(&fs, n.as_bytes()).unwrap() == *d,
            "{n} after ENOSPC"
        );
    }
    // The final checkpoint needs metadata blocks; a full data pool must not prevent it.
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t);

    let fs = mount(&t);
    for (n, d) in &kept {
        assert!(
            read_file(&fs, n.as_bytes()).unwrap() == *d,
            "{n} after remount"
        );
    }
    assert_eq!(read_file(&fs, b"tiny").unwrap(), b"fits inline");
    // Deleting files gives the space back.
    for (n, _) in kept.iter().take(4) {
        fs.remove(ROOT_INO, n.as_bytes(), false).unwrap();
    }
    fs.sync().unwrap();
    let a = fs.lookup(ROOT_INO, name.as_bytes()).unwrap();
    fs.write(a.ino, 0, &data, false).unwrap();
    assert!(read_file(&fs, name.as_bytes()).unwrap() == data);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t);
}

/// A descriptor whose checksum holds but that calls a log copy other than 0 or 1 behind (a
/// writer's bug, not a drive's) is refused as damaged, by name, and the mount takes the
/// previous generation from the other slot instead of indexing past the log's two copies.
#[test]
fn a_descriptor_calling_a_third_log_copy_behind_is_refused_as_damaged() {
    let t = made_and_unmounted();
    let good = descriptor_on_disk(&t);
    let mut bad = good.clone();
    bad.generation += 1;
    bad.metadata_copies = Some(tessera_fs::descriptor::MetadataCopies {
        root_mirrors: Vec::new(),
        log_disk: bad.log.disk,
        log_offset: bad.log.region.offset,
        log_behind: Some(2),
        map_regions: Vec::new(),
    });
    let devs: Vec<Option<Arc<dyn BlockDevice>>> =
        t.reopen().into_iter().map(|(_, d)| Some(d)).collect();
    assert!(tessera_fs::descriptor::write_descriptor(&bad, &devs).unwrap() > 0);
    let all: Vec<Arc<dyn BlockDevice>> = devs.into_iter().flatten().collect();
    let read = tessera_fs::read_descriptor(&all).unwrap();
    assert_eq!(read.generation, good.generation);
    assert_eq!(read.metadata_copies, None);
    let fs = mount(&t);
    assert_eq!(fs.descriptor().metadata_copies, None);
    fs.unmount().unwrap();
}
