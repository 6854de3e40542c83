//! Basic operations through the file-system core, and that they survive a remount.

mod common;

use common::*;
use tessera_fs::{Caller, FileKind, ROOT_INO};

const ROOT: Caller = Caller { uid: 0, gid: 0 };

#[test]
fn create_write_read_remount() {
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let dir = fs
        .create_node(ROOT_INO, b"dir", FileKind::Directory, 0o755, 0, ROOT, None)
        .unwrap();
    let small = create_file(&fs, dir.ino, b"small");
    fs.write(small.ino, 0, b"hello", false).unwrap();
    let big = create_file(&fs, dir.ino, b"big");
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i * 7 + i / 1000) as u8)
        .collect();
    for (i, chunk) in data.chunks(128 << 10).enumerate() {
        fs.write(big.ino, (i * (128 << 10)) as u64, chunk, false)
            .unwrap();
    }
    // Unaligned overwrite in the middle (read-modify-write, in place).
    fs.write(big.ino, 1_000_001, b"XYZ", false).unwrap();
    let mut expect = data.clone();
    expect[1_000_001..1_000_004].copy_from_slice(b"XYZ");
    assert_eq!(fs.read(big.ino, 0, 4 << 20).unwrap(), expect);
    fs.create_node(
        dir.ino,
        b"link",
        FileKind::Symlink,
        0o777,
        0,
        ROOT,
        Some(b"big"),
    )
    .unwrap();
    fs.rename(dir.ino, b"small", ROOT_INO, b"moved", false, false)
        .unwrap();
    fs.unmount().unwrap();
    drop(fs);

    let fs = mount(&t);
    let moved = fs.lookup(ROOT_INO, b"moved").unwrap();
    assert_eq!(fs.read(moved.ino, 0, 100).unwrap(), b"hello");
    let dir = fs.lookup(ROOT_INO, b"dir").unwrap();
    let big = fs.lookup(dir.ino, b"big").unwrap();
    assert_eq!(big.size, expect.len() as u64);
    assert_eq!(fs.read(big.ino, 0, 4 << 20).unwrap(), expect);
    let link = fs.lookup(dir.ino, b"link").unwrap();
    assert_eq!(fs.readlink(link.ino).unwrap(), b"big");
    assert!(fs.lookup(dir.ino, b"small").is_err());
    fs.unmount().unwrap();
}

#[test]
fn log_replay_without_clean_unmount() {
    let t = make_disks(2, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let f = create_file(&fs, ROOT_INO, b"f");
    let data = vec![0x5a; 700_000];
    fs.write(f.ino, 0, &data, true).unwrap();
    let g = create_file(&fs, ROOT_INO, b"g");
    fs.write(g.ino, 0, b"inline", false).unwrap();
    fs.fsync(g.ino).unwrap();
    // Simulate a crash: no unmount, no checkpoint, no further writes.
    fs.fence();
    drop(fs);
    let fs = mount(&t);
    let f = fs.lookup(ROOT_INO, b"f").unwrap();
    assert_eq!(fs.read(f.ino, 0, 1 << 20).unwrap(), data);
    let g = fs.lookup(ROOT_INO, b"g").unwrap();
    assert_eq!(fs.read(g.ino, 0, 100).unwrap(), b"inline");
    fs.unmount().unwrap();
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// Writers of one file proceed in parallel on different blocks and segments; overlapping
/// writers must never leave a sector whose checksum disagrees with its data.
#[test]
fn concurrent_writers_of_one_file() {
    let t = make_disks(4, 128 << 20);
    format_fs(
        &t,
        &tessera_fs::FormatOptions {
            block_size: 4 << 20,
            ..small_opts()
        },
    );
    let fs = mount(&t);
    let f = create_file(&fs, ROOT_INO, b"shared");
    const PIECE: u64 = 300_001; // unaligned, so pieces share sectors at their edges
    std::thread::scope(|s| {
        for w in 0..4u64 {
            let fs = &fs;
            s.spawn(move || {
                for i in (w..64).step_by(4) {
                    let data = vec![(i % 251) as u8 + 1; PIECE as usize];
                    fs.write(f.ino, i * PIECE, &data, false).unwrap();
                }
            });
        }
        for w in 0..4u8 {
            let fs = &fs;
            s.spawn(move || {
                for _ in 0..20 {
                    fs.write(f.ino, 40 << 20, &vec![w + 1; 65536], false)
                        .unwrap();
                }
            });
        }
    });
    let check = |fs: &tessera_fs::FileSystem| {
        let data = fs.read(f.ino, 0, (64 * PIECE) as u32).unwrap();
        for i in 0..64u64 {
            let piece = &data[(i * PIECE) as usize..((i + 1) * PIECE) as usize];
            assert!(piece.iter().all(|b| *b == (i % 251) as u8 + 1), "piece {i}");
        }
        let hot = fs.read(f.ino, 40 << 20, 65536).unwrap();
        assert!(hot.iter().all(|b| *b == hot[0]) && (1..=4).contains(&hot[0]));
    };
    check(&fs);
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&t);
    check(&fs);
    fs.unmount().unwrap();
}

/// Checkpoints taken while other threads create, write and delete files: after a remount
/// (and after a crash, replaying the log over the last checkpoint) every file is intact and
/// fsck finds the allocation consistent.
#[test]
fn checkpoints_concurrent_with_changes() {
    let t = make_disks(4, 128 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let (fs2, stop2) = (&fs, &stop);
        s.spawn(move || {
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                fs2.checkpoint().unwrap();
            }
        });
        let mut writers = Vec::new();
        for w in 0..3u8 {
            let fs = &fs;
            writers.push(s.spawn(move || {
                for i in 0..150u32 {
                    let name = format!("w{w}-{}", i % 40);
                    let _ = fs.remove(ROOT_INO, name.as_bytes(), false);
                    let a = create_file(fs, ROOT_INO, name.as_bytes());
                    let len = (i as usize * 7919) % 400_000;
                    fs.write(a.ino, 0, &vec![w ^ i as u8; len], false).unwrap();
                }
            }));
        }
        for h in writers {
            h.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    fs.sync().unwrap();
    let expect = |fs: &tessera_fs::FileSystem| {
        for w in 0..3u8 {
            for i in 110..150u32 {
                let name = format!("w{w}-{}", i % 40);
                let a = fs.lookup(ROOT_INO, name.as_bytes()).unwrap();
                let len = (i as usize * 7919) % 400_000;
                assert_eq!(
                    fs.read(a.ino, 0, 1 << 20).unwrap(),
                    vec![w ^ i as u8; len],
                    "{name}"
                );
            }
        }
    };
    expect(&fs);
    fs.fence(); // crash: no final checkpoint, no more writes
    drop(fs);
    let fs = mount(&t);
    expect(&fs);
    fs.unmount().unwrap();
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// A file unlinked while open and never closed (the kernel's release lost with the
/// daemon): the next mount reclaims it, and its space is free as soon as mount returns.
#[test]
fn orphan_space_is_free_when_mount_returns() {
    let t = make_disks(2, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    fs.sync().unwrap();
    let before = fs.statfs().fragments_free;
    let f = create_file(&fs, ROOT_INO, b"open-then-unlinked");
    fs.open(f.ino).unwrap();
    fs.write(f.ino, 0, &pattern(4 << 20, 7), true).unwrap();
    fs.remove(ROOT_INO, b"open-then-unlinked", false).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&t);
    let st = fs.statfs();
    let orphan_fragments = (4 << 20) / st.fragment_bytes;
    // The directory may keep a fragment it grew into; the 4 MiB must all be back.
    assert!(
        st.fragments_free + 2 >= before,
        "space of the orphan not free after mount: {before} -> {} free fragments \
         (the orphan held {orphan_fragments})",
        st.fragments_free
    );
    fs.unmount().unwrap();
}

/// On a thin-provisioned disk, the metadata pages a checkpoint supersedes go back to the
/// device too (after the checkpoint is durable), not only the blocks of deleted files; and
/// the file system still mounts and reads back after many such rounds.
#[test]
fn superseded_metadata_pages_are_deallocated_on_thin_disks() {
    let t = make_disks(2, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    for disk in 0..2 {
        fs.set_discard(disk, true).unwrap();
    }
    let dir = fs
        .create_node(ROOT_INO, b"d", FileKind::Directory, 0o755, 0, ROOT, None)
        .unwrap();
    // Only creates and small (inline) writes: no data block is ever freed, so everything
    // given back is metadata.
    for round in 0..6u32 {
        for i in 0..200u32 {
            let a = create_file(&fs, dir.ino, format!("r{round}-{i}").as_bytes());
            fs.write(a.ino, 0, &round.to_le_bytes(), false).unwrap();
        }
        fs.checkpoint().unwrap();
        fs.sync().unwrap();
    }
    let (given_back, errors) = fs.discard_stats();
    assert_eq!(errors, 0);
    assert!(
        given_back > 0,
        "no superseded metadata page was deallocated"
    );
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&t);
    for round in 0..6u32 {
        let a = fs
            .lookup(dir.ino, format!("r{round}-199").as_bytes())
            .unwrap();
        assert_eq!(fs.read(a.ino, 0, 4).unwrap(), round.to_le_bytes());
    }
    fs.unmount().unwrap();
}

#[test]
fn writes_from_sector_aligned_buffers_go_to_the_drives_as_they_are() {
    // The FUSE layer reads write requests so that their data starts on a 4 KiB boundary,
    // and the data path writes such data to the drives without copying it (fresh blocks
    // and in place). What it wrote, with its checksums, reads back after a remount, beside
    // unaligned writes into the same blocks.
    let t = make_disks(4, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let f = create_file(&fs, ROOT_INO, b"aligned");
    let len = 3 << 20;
    let mut expect = tessera_testkit::pattern(len, 41);
    let mut aligned = tessera_drive::AlignedBuf::zeroed(len);
    aligned.copy_from_slice(&expect);
    // Fresh blocks, then overwrites in place, in whole sectors at aligned addresses.
    for (at, n) in [(0usize, 256 << 10), (256 << 10, len - (256 << 10))] {
        fs.write(f.ino, at as u64, &aligned[at..at + n], false)
            .unwrap();
    }
    let patch = tessera_testkit::pattern(64 << 10, 42);
    aligned[8192..8192 + patch.len()].copy_from_slice(&patch);
    fs.write(f.ino, 8192, &aligned[8192..8192 + patch.len()], false)
        .unwrap();
    expect[8192..8192 + patch.len()].copy_from_slice(&patch);
    // An unaligned write between the aligned ones.
    fs.write(f.ino, 100_001, b"between", false).unwrap();
    expect[100_001..100_008].copy_from_slice(b"between");
    // A whole written block rewritten (a fresh extent, nothing copied over).
    let block = 256 << 10;
    let whole = tessera_testkit::pattern(block, 43);
    aligned[block..2 * block].copy_from_slice(&whole);
    fs.write(f.ino, block as u64, &aligned[block..2 * block], false)
        .unwrap();
    expect[block..2 * block].copy_from_slice(&whole);
    // A small file's first write: a fragment of a block.
    let small = create_file(&fs, ROOT_INO, b"small");
    let mut small_data = tessera_drive::AlignedBuf::zeroed(8192);
    small_data.copy_from_slice(&tessera_testkit::pattern(8192, 44));
    fs.write(small.ino, 0, &small_data, false).unwrap();
    assert!(fs.read(f.ino, 0, len as u32).unwrap() == expect);
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&t);
    assert!(fs.read(f.ino, 0, len as u32).unwrap() == expect);
    assert!(fs.read(small.ino, 0, 1 << 20).unwrap() == small_data[..]);
    fs.unmount().unwrap();
    drop(fs);
    assert_fsck_clean(&t, "after writes from aligned buffers");
}

/// A directory's size is the bytes its entries take (27 besides the name each), kept by
/// every change of its names, after a log replay and a remount; its blocks follow it.
#[test]
fn a_directory_s_size_is_the_bytes_of_its_entries() {
    let t = make_disks(2, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let bytes = |names: &[&str]| names.iter().map(|n| 27 + n.len() as u64).sum::<u64>();
    let dir = make_dir(&fs, ROOT_INO, b"d");
    assert_eq!(fs.getattr(dir.ino).unwrap().size, 0, "an empty directory");
    let other = make_dir(&fs, ROOT_INO, b"other");
    let a = create_file(&fs, dir.ino, b"a");
    create_file(&fs, dir.ino, b"bb");
    make_dir(&fs, dir.ino, b"sub");
    fs.create_node(
        dir.ino,
        b"ln",
        FileKind::Symlink,
        0o777,
        0,
        ROOT,
        Some(b"a"),
    )
    .unwrap();
    fs.link(a.ino, dir.ino, b"hard-link").unwrap();
    let expect = bytes(&["a", "bb", "sub", "ln", "hard-link"]);
    assert_eq!(fs.getattr(dir.ino).unwrap().size, expect);
    // Renamed within the directory, out of it, over an existing name, and removed.
    fs.rename(dir.ino, b"bb", dir.ino, b"longer-name", false, false)
        .unwrap();
    fs.rename(dir.ino, b"ln", other.ino, b"ln", false, false)
        .unwrap();
    // Two links of one file: rename does nothing (POSIX), both names stay.
    fs.rename(dir.ino, b"hard-link", dir.ino, b"a", false, false)
        .unwrap();
    create_file(&fs, dir.ino, b"c");
    fs.rename(dir.ino, b"c", dir.ino, b"longer-name", false, false)
        .unwrap();
    fs.remove(dir.ino, b"sub", true).unwrap();
    let expect = bytes(&["a", "hard-link", "longer-name"]);
    let (attr, held) = fs.getattr_allocated(dir.ino).unwrap();
    assert_eq!(attr.size, expect);
    assert!(held >= expect, "{held} bytes held for {expect} of entries");
    assert_eq!(fs.getattr(other.ino).unwrap().size, bytes(&["ln"]));
    assert_eq!(
        fs.getattr(ROOT_INO).unwrap().size,
        bytes(&["d", "other"]),
        "the root"
    );
    // The sizes come from the log after a crash, and from the shard trees after it.
    fs.sync().unwrap();
    fs.fence();
    drop(fs);
    let fs = mount(&t);
    assert_eq!(fs.getattr(dir.ino).unwrap().size, expect, "after replay");
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&t);
    assert_eq!(fs.getattr(dir.ino).unwrap().size, expect, "after remount");
    assert_eq!(fs.getattr(other.ino).unwrap().size, bytes(&["ln"]));
    fs.unmount().unwrap();
    assert_fsck_clean(&t, "directory sizes");
}

/// A page of the recovery log that held committed records and no longer reads back (a bit
/// flip on the drive, a stray write) is not taken for the log's end: mount refuses the log
/// and names the page, where replaying only what precedes it would lose every file created
/// and fsynced after it without a word. fsck names the loss; its repair (`fsck -y`)
/// replays what precedes the page, starts the log afresh there, and the file system mounts
/// again with the files whose records came before the damage.
#[test]
fn a_damaged_page_inside_the_log_is_refused_and_fsck_repair_accepts_the_loss() {
    let t = make_disks(2, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let files = fsynced_one_by_one(&fs, (ROOT_INO, "f"), 40);
    // A crash: no checkpoint, everything above is in the log alone.
    fs.fence();
    drop(fs);

    let desc = descriptor(&t);
    let region = desc.log.region;
    let damaged = desc.checkpoint.replay_from / 4096 + 12;
    let dev = disk_device(&t, &desc, desc.log.disk);
    flip_bit(
        &*dev,
        log_page_offset(region.offset, region.bytes, damaged),
        2000,
    );
    drop(dev);

    let Err(refused) = tessera_fs::FileSystem::mount(t.reopen()) else {
        panic!("the mount replayed a log damaged inside as if it ended there");
    };
    let said = refused.to_string();
    assert!(
        said.contains("recovery log of file system") && said.contains(&format!("page {damaged} ")),
        "{said}"
    );
    assert!(said.contains("fsck"), "{said}");

    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(
        report.problems.iter().any(
            |p| p.contains("lost committed records") && p.contains(&format!("page {damaged} "))
        ),
        "{:?}",
        report.problems
    );
    let repaired = tessera_fs::fsck(t.reopen(), true).unwrap();
    assert!(repaired.repaired >= 1, "{repaired:?}");
    assert_fsck_clean(&t, "after the repair");

    // The files whose records precede the damaged page are whole; none of the rest is
    // half there.
    let fs = mount(&t);
    let kept = count_whole(&fs, ROOT_INO, &files);
    assert!(kept >= 5 && kept < files.len(), "{kept} files kept");
    fsynced_files_survive_a_crash(&t, fs, 1);
}

/// The page holding the checkpoint's replay point is damaged: mount refuses (the
/// checkpoint says records up to inside it were durable); fsck's repair keeps what the
/// checkpoint holds, loses what was logged after it, and the log goes on past that page.
#[test]
fn a_damaged_replay_point_page_is_refused_and_fsck_repair_keeps_the_checkpoint() {
    let t = make_disks(2, 64 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let checkpointed = fsynced_one_by_one(&fs, (ROOT_INO, "c"), 5);
    fs.checkpoint().unwrap();
    let logged = fsynced_one_by_one(&fs, (ROOT_INO, "l"), 5);
    fs.fence();
    drop(fs);

    let desc = descriptor(&t);
    let replay_from = desc.checkpoint.replay_from;
    assert!(
        replay_from % 4096 > 64,
        "a replay point inside a page: {replay_from}"
    );
    let region = desc.log.region;
    let dev = disk_device(&t, &desc, desc.log.disk);
    flip_bit(
        &*dev,
        log_page_offset(region.offset, region.bytes, replay_from / 4096),
        100,
    );
    drop(dev);

    let Err(refused) = tessera_fs::FileSystem::mount(t.reopen()) else {
        panic!("the mount replayed a log whose replay point's page is damaged");
    };
    assert!(refused.to_string().contains("replay point"), "{refused}");
    let repaired = tessera_fs::fsck(t.reopen(), true).unwrap();
    assert!(repaired.repaired >= 1, "{repaired:?}");
    assert_fsck_clean(&t, "after the repair of the replay point's page");
    let fs = mount(&t);
    assert_eq!(
        count_whole(&fs, ROOT_INO, &checkpointed),
        checkpointed.len()
    );
    assert_eq!(count_whole(&fs, ROOT_INO, &logged), 0);
    fsynced_files_survive_a_crash(&t, fs, 2);
}

/// After a repair of the log: `count` new files fsynced on `fs`, a crash, and a mount
/// that holds them whole; fsck clean after.
fn fsynced_files_survive_a_crash(
    t: &TestDisks,
    fs: std::sync::Arc<tessera_fs::FileSystem>,
    count: u64,
) {
    let after = fsynced_one_by_one(&fs, (ROOT_INO, "after"), count);
    fs.fence();
    drop(fs);
    let fs = mount(t);
    assert_eq!(count_whole(&fs, ROOT_INO, &after), after.len());
    fs.unmount().unwrap();
    assert_fsck_clean(t, "after a crash past the repair");
}
