//! Write-behind (`write_behind.rs`): small writes gathered in memory and written as whole
//! blocks, on a mount that gathers (a one-node mount whose kernel passes writes straight
//! through). What it must keep: every read, `stat` and lookup on the node sees every write
//! that returned; writes land in the order they were made; fsync makes them durable; a
//! failure to write them reaches the application at its next write, fsync or close; and
//! the file's times are those of the writes, not of the flush.

mod common;

use std::sync::Arc;

use common::*;
use tessera_fs::{FileSystem, FsError, SetAttr, Timestamp, ROOT_INO};

fn gathering(t: &TestDisks) -> Arc<FileSystem> {
    let fs = mount(t);
    fs.set_write_behind(true);
    fs
}

fn small_fs() -> TestDisks {
    let t = make_disks(2, 64 << 20);
    format_fs(&t, &small_opts());
    t
}

#[test]
fn small_appends_are_gathered_and_every_read_and_stat_sees_them() {
    let t = small_fs();
    let fs = gathering(&t);
    let a = create_file(&fs, ROOT_INO, b"log");
    let mut want = Vec::new();
    for i in 0..25_000u64 {
        let line = format!("line {i:06} {}\n", "x".repeat((i % 37) as usize));
        fs.write(a.ino, want.len() as u64, line.as_bytes(), false)
            .unwrap();
        want.extend_from_slice(line.as_bytes());
        if i == 10 {
            assert!(fs.gathered_bytes() > 0, "small appends are gathered");
            // `stat` and a lookup report the size the gathered bytes reach, without
            // writing them.
            assert_eq!(fs.getattr(a.ino).unwrap().size, want.len() as u64);
            assert_eq!(fs.lookup(ROOT_INO, b"log").unwrap().size, want.len() as u64);
            assert!(fs.gathered_bytes() > 0);
        }
    }
    // Whole blocks were handed off as the run covered them, and land by themselves: less
    // than a block waits.
    let handed = std::time::Instant::now();
    while fs.gathered_bytes() >= BLOCK && handed.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        fs.gathered_bytes() < BLOCK,
        "{} bytes gathered",
        fs.gathered_bytes()
    );
    assert!(want.len() as u64 > 2 * BLOCK);
    // A read writes what is gathered first.
    assert_eq!(fs.read(a.ino, 0, want.len() as u32 + 1).unwrap(), want);
    assert_eq!(fs.gathered_bytes(), 0);
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&t);
    assert_eq!(fs.read(a.ino, 0, want.len() as u32 + 1).unwrap(), want);
    fs.unmount().unwrap();
    assert_fsck_clean(&t, "after gathered appends");
}

/// Writes `data` at `off` of the file and of its expected content.
fn put(fs: &FileSystem, ino: u64, want: &mut Vec<u8>, off: usize, data: &[u8], sync: bool) {
    fs.write(ino, off as u64, data, sync).unwrap();
    if want.len() < off + data.len() {
        want.resize(off + data.len(), 0);
    }
    want[off..off + data.len()].copy_from_slice(data);
}

#[test]
fn writes_land_in_the_order_they_were_made() {
    let t = small_fs();
    let fs = gathering(&t);
    let a = create_file(&fs, ROOT_INO, b"f");
    let mut want = Vec::new();
    let w = &mut want;
    // Gathered, then a large write over it (goes straight through after it).
    put(&fs, a.ino, w, 100, &[1; 5000], false);
    put(&fs, a.ino, w, 0, &pattern(600 << 10, 7), false);
    // Gathered, then a small write elsewhere (starts a new run after writing it).
    put(&fs, a.ino, w, 4000, &[2; 3000], false);
    put(&fs, a.ino, w, 3000, &[3; 2000], false);
    // Gathered, then a synchronous write over part of it.
    put(&fs, a.ino, w, 20_000, &[4; 8000], false);
    put(&fs, a.ino, w, 22_000, &[5; 100], true);
    // Gathered past the end, then a truncate below it, then a hole and more.
    put(&fs, a.ino, w, 700 << 10, &[6; 3000], false);
    fs.truncate(a.ino, 650 << 10).unwrap();
    w.truncate(650 << 10);
    put(&fs, a.ino, w, 900 << 10, &[7; 10], false);
    assert_eq!(fs.getattr(a.ino).unwrap().size, want.len() as u64);
    assert_eq!(fs.read(a.ino, 0, (1 << 20) as u32).unwrap(), want);
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&t);
    assert_eq!(fs.read(a.ino, 0, (1 << 20) as u32).unwrap(), want);
    fs.unmount().unwrap();
    assert_fsck_clean(&t, "after mixed writes");
}

#[test]
fn writers_of_many_files_at_once_lose_nothing() {
    let t = small_fs();
    let fs = gathering(&t);
    let files: Vec<u64> = (0..6)
        .map(|i| create_file(&fs, ROOT_INO, format!("f{i}").as_bytes()).ino)
        .collect();
    std::thread::scope(|s| {
        for (k, &ino) in files.iter().enumerate() {
            let fs = &fs;
            s.spawn(move || {
                let data = pattern(700_000, k as u64);
                let mut off = 0;
                let mut step = 1 + k * 997;
                while off < data.len() {
                    let n = step.min(data.len() - off);
                    fs.write(ino, off as u64, &data[off..off + n], false)
                        .unwrap();
                    off += n;
                    step = 1 + (step * 7919) % 9000;
                    if off % 5 == 0 {
                        // Another thread's reads and stats in between.
                        assert_eq!(fs.getattr(ino).unwrap().size, off as u64);
                    }
                }
                if k % 2 == 0 {
                    fs.fsync(ino).unwrap();
                }
            });
        }
    });
    for (k, &ino) in files.iter().enumerate() {
        assert_eq!(
            fs.read(ino, 0, 800_000).unwrap(),
            pattern(700_000, k as u64),
            "file {k}"
        );
    }
    fs.unmount().unwrap();
    assert_fsck_clean(&t, "after parallel writers");
}

#[test]
fn the_times_are_those_of_the_writes_and_explicit_times_stay() {
    let t = small_fs();
    let fs = gathering(&t);
    let a = create_file(&fs, ROOT_INO, b"f");
    fs.write(a.ino, 0, b"hello", false).unwrap();
    let written = fs.getattr(a.ino).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(30));
    fs.fsync(a.ino).unwrap();
    let flushed = fs.getattr(a.ino).unwrap();
    assert_eq!(flushed.size, 5);
    assert_eq!(
        (flushed.mtime, flushed.ctime),
        (written.mtime, written.ctime),
        "the flush stamps the time of the write"
    );
    // A gathered write and then explicit times (touch -d, cp -p, tar): the times stay.
    fs.write(a.ino, 5, b" world", false).unwrap();
    let when = Timestamp {
        secs: 1_000_000_000,
        nsecs: 5,
    };
    let set = SetAttr {
        mtime: Some(when),
        ..Default::default()
    };
    fs.setattr(a.ino, set).unwrap();
    fs.fsync(a.ino).unwrap();
    let after = fs.getattr(a.ino).unwrap();
    assert_eq!(after.mtime, when);
    assert_eq!(fs.read(a.ino, 0, 100).unwrap(), b"hello world");
    fs.unmount().unwrap();
}

/// A gathering mount of a small disk filled by file `big`, written straight through.
fn full_fs() -> (TestDisks, Arc<FileSystem>, tessera_fs::Attr) {
    let t = make_disks(1, 24 << 20);
    format_fs(&t, &small_opts());
    let fs = gathering(&t);
    let big = create_file(&fs, ROOT_INO, b"big");
    let mut off = 0u64;
    loop {
        match fs.write(big.ino, off, &vec![9; BLOCK as usize], false) {
            Ok(_) => off += BLOCK,
            Err(FsError::NoSpace { .. }) => break,
            Err(e) => panic!("filling: {e}"),
        }
    }
    (t, fs, big)
}

#[test]
fn a_failure_to_write_gathered_bytes_reaches_the_writer() {
    let (t, fs, big) = full_fs();
    // Small writes of another file are gathered (nothing is allocated yet) ...
    let a = create_file(&fs, ROOT_INO, b"late");
    let mut failed = None;
    for i in 0..(2 * BLOCK / 4096) {
        if let Err(e) = fs.write(a.ino, i * 4096, &[1; 4096], false) {
            failed = Some(e);
            break;
        }
    }
    // ... and the failure of their write comes back at a write (when a whole block is
    // written) or at the close at the latest, as ENOSPC.
    let err = match failed {
        Some(e) => e,
        None => fs.flush_gathered(a.ino).unwrap_err(),
    };
    assert!(matches!(err, FsError::NoSpace { .. }), "{err:?}");
    // Freed space: the file system works on; nothing of the file system was lost.
    fs.truncate(big.ino, 0).unwrap();
    fs.sync().unwrap();
    fs.write(a.ino, 0, b"again", false).unwrap();
    fs.fsync(a.ino).unwrap();
    assert_eq!(&fs.read(a.ino, 0, 5).unwrap()[..], b"again");
    fs.unmount().unwrap();
    assert_fsck_clean(&t, "after ENOSPC at a gathered write");
}

#[test]
fn a_failure_found_by_the_background_flush_is_reported_at_close() {
    let (t, fs, _) = full_fs();
    let a = create_file(&fs, ROOT_INO, b"late");
    fs.open(a.ino).unwrap();
    // Scattered pieces, each needing a block of its own: written by several threads.
    for i in 0..20 {
        fs.write(a.ino, i * BLOCK, &[1; 8192], false).unwrap();
    }
    // What `sync` (and the background flusher) writes and fails at is kept for the file.
    fs.sync().unwrap();
    let err = fs.release(a.ino).unwrap_err();
    assert!(matches!(err, FsError::NoSpace { .. }), "{err:?}");
    fs.unmount().unwrap();
    assert_fsck_clean(&t, "after a failed background flush");
}

#[test]
fn unmount_writes_what_is_gathered() {
    let t = small_fs();
    let fs = gathering(&t);
    let a = create_file(&fs, ROOT_INO, b"f");
    fs.write(a.ino, 0, b"written just before the unmount", false)
        .unwrap();
    assert!(fs.gathered_bytes() > 0);
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&t);
    assert_eq!(
        &fs.read(a.ino, 0, 100).unwrap()[..],
        b"written just before the unmount"
    );
    fs.unmount().unwrap();
    assert_fsck_clean(&t, "after an unmount with gathered writes");
}

/// A database's pattern: small rewrites of pages here and there, read back in between.
/// Each is gathered (a rewrite of gathered bytes replaces them in memory) and every read
/// sees the newest bytes.
#[test]
fn scattered_rewrites_are_gathered_and_read_back_newest() {
    let t = small_fs();
    let fs = gathering(&t);
    let a = create_file(&fs, ROOT_INO, b"db");
    let mut want = pattern(3 * BLOCK as usize, 3);
    fs.write(a.ino, 0, &want, false).unwrap();
    fs.fsync(a.ino).unwrap();
    let mut rng = 99u64;
    for i in 0..4000usize {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let len = 1 + (rng % 6000) as usize;
        let off = (rng >> 20) as usize % (want.len() + 1000);
        let piece = pattern(len, i as u64);
        put(&fs, a.ino, &mut want, off, &piece, false);
        if i == 200 {
            assert!(
                fs.gathered_bytes() > 0,
                "scattered small writes are gathered"
            );
        }
        if i % 500 == 499 {
            let size = fs.getattr(a.ino).unwrap().size;
            assert_eq!(size, want.len() as u64, "write {i}");
            assert!(
                fs.read(a.ino, 0, size as u32 + 1).unwrap() == want,
                "write {i}"
            );
        }
    }
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&t);
    assert!(fs.read(a.ino, 0, want.len() as u32 + 1).unwrap() == want);
    fs.unmount().unwrap();
    assert_fsck_clean(&t, "after scattered rewrites");
}

/// `stat` while gathered writes are being written (the background flusher, `sync`): the
/// size never falls below what writes that returned reached. The runs leave memory before
/// their update reaches the metadata; attributes read in between showed neither, and the
/// kernel kept that size (a client without drives read back empty files after fsync).
#[test]
fn stat_never_shows_less_than_the_writes_that_returned_while_they_are_written() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let t = small_fs();
    let fs = gathering(&t);
    let a = create_file(&fs, ROOT_INO, b"f").ino;
    let written = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..20_000u64 {
                fs.write(a, i * 100, &[7; 100], false).unwrap();
                written.store((i + 1) * 100, Ordering::SeqCst);
            }
            stop.store(true, Ordering::SeqCst);
        });
        s.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                fs.sync().unwrap();
            }
        });
        s.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                let before = written.load(Ordering::SeqCst);
                let size = fs.getattr(a).unwrap().size;
                assert!(
                    size >= before,
                    "stat shows {size} bytes after {before} were written"
                );
                let looked = fs.lookup(ROOT_INO, b"f").unwrap().size;
                assert!(looked >= before, "lookup shows {looked} after {before}");
            }
        });
    });
    fs.unmount().unwrap();
}

/// One process writing large pieces (`dd bs=1M`, a checkpoint): each is handed off and the
/// writer goes on while it lands. Every `stat` sees the size the writes reached, a read in
/// between sees every write that returned (it waits for what is in flight), and fsync and
/// the unmount leave it all on the disks.
#[test]
fn large_writes_are_handed_off_and_every_read_and_stat_sees_them() {
    let t = make_disks(2, 256 << 20);
    format_fs(&t, &small_opts());
    let fs = gathering(&t);
    let a = create_file(&fs, ROOT_INO, b"checkpoint");
    let piece = 1usize << 20;
    let mut want = Vec::new();
    for i in 0..48u64 {
        let data = pattern(piece, i);
        fs.write(a.ino, want.len() as u64, &data, false).unwrap();
        want.extend_from_slice(&data);
        assert_eq!(
            fs.getattr(a.ino).unwrap().size,
            want.len() as u64,
            "write {i}"
        );
        if i % 16 == 15 {
            let back = fs.read(a.ino, 0, want.len() as u32).unwrap();
            assert!(back == want, "read after write {i}");
        }
    }
    assert!(
        fs.handed_off_bytes() >= 40 << 20,
        "{} bytes handed off",
        fs.handed_off_bytes()
    );
    fs.fsync(a.ino).unwrap();
    assert_eq!(
        fs.gathered_bytes(),
        0,
        "fsync waits for every write handed off"
    );
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&t);
    assert!(fs.read(a.ino, 0, want.len() as u32 + 1).unwrap() == want);
    fs.unmount().unwrap();
    assert_fsck_clean(&t, "after large writes handed off");
}

/// Large writes over bytes still in flight, from several threads: the newest bytes win,
/// whatever order the landing threads write in.
#[test]
fn a_large_write_over_bytes_in_flight_lands_after_them() {
    let t = make_disks(2, 128 << 20);
    format_fs(&t, &small_opts());
    let fs = gathering(&t);
    let a = create_file(&fs, ROOT_INO, b"f");
    let mut want = Vec::new();
    let w = &mut want;
    for round in 0..20u64 {
        // Overlapping large writes, each shifted by a sector and a half-block.
        let off = (round % 5) as usize * (BLOCK as usize / 2 + 4096);
        put(
            &fs,
            a.ino,
            w,
            off,
            &pattern(3 * BLOCK as usize, round),
            false,
        );
        // A small write into what was just handed off.
        put(&fs, a.ino, w, off + 1000, &[round as u8; 300], false);
    }
    assert_eq!(fs.getattr(a.ino).unwrap().size, want.len() as u64);
    assert!(fs.read(a.ino, 0, want.len() as u32 + 1).unwrap() == want);
    // Several writers of disjoint large pieces of one file at once.
    let base = want.len();
    std::thread::scope(|s| {
        for k in 0..4u64 {
            let fs = &fs;
            s.spawn(move || {
                for j in 0..8u64 {
                    let off = base as u64 + (j * 4 + k) * BLOCK;
                    fs.write(a.ino, off, &pattern(BLOCK as usize, 100 + j * 4 + k), false)
                        .unwrap();
                }
            });
        }
    });
    for n in 0..32u64 {
        want.extend_from_slice(&pattern(BLOCK as usize, 100 + n));
    }
    fs.fsync(a.ino).unwrap();
    assert!(fs.read(a.ino, 0, want.len() as u32 + 1).unwrap() == want);
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&t);
    assert!(fs.read(a.ino, 0, want.len() as u32 + 1).unwrap() == want);
    fs.unmount().unwrap();
    assert_fsck_clean(&t, "after large writes over bytes in flight");
}

/// Near full, large writes are not handed off: ENOSPC reaches the write that met it, as
/// on a local file system, not the next write or fsync.
#[test]
fn near_full_a_large_write_meets_enospc_itself() {
    let (t, fs, big) = full_fs();
    let a = create_file(&fs, ROOT_INO, b"late");
    let handed = fs.handed_off_bytes();
    let err = fs
        .write(a.ino, 0, &vec![1; BLOCK as usize], false)
        .unwrap_err();
    assert!(matches!(err, FsError::NoSpace { .. }), "{err:?}");
    assert_eq!(
        fs.handed_off_bytes(),
        handed,
        "nothing is handed off near full"
    );
    fs.fsync(a.ino).unwrap();
    fs.truncate(big.ino, 0).unwrap();
    fs.sync().unwrap();
    fs.write(a.ino, 0, &pattern(BLOCK as usize, 5), false)
        .unwrap();
    fs.fsync(a.ino).unwrap();
    assert!(fs.read(a.ino, 0, BLOCK as u32).unwrap() == pattern(BLOCK as usize, 5));
    fs.unmount().unwrap();
    assert_fsck_clean(&t, "after ENOSPC at a large write handed off");
}

/// An fsync beside a writer that keeps handing off writes waits for what was handed off
/// before it, not for the writer to stop (nor do the background flusher and other nodes'
/// requests, which wait the same way).
#[test]
fn fsync_beside_a_writer_that_keeps_writing_returns() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::{Duration, Instant};
    let t = make_disks(2, 256 << 20);
    format_fs(&t, &small_opts());
    let fs = gathering(&t);
    let a = create_file(&fs, ROOT_INO, b"stream").ino;
    let window = 64u64 << 20;
    let piece = pattern(1 << 20, 1);
    let stop = AtomicBool::new(false);
    let written = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut off = 0u64;
            while !stop.load(Ordering::SeqCst) {
                fs.write(a, off % window, &piece, false).unwrap();
                off += piece.len() as u64;
                written.store(off, Ordering::SeqCst);
            }
        });
        for i in 0..20 {
            let started = Instant::now();
            fs.fsync(a).unwrap();
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "fsync {i} took {:?} beside a writer",
                started.elapsed()
            );
        }
        stop.store(true, Ordering::SeqCst);
    });
    assert!(fs.handed_off_bytes() > 0);
    fs.fsync(a).unwrap();
    let size = written.load(Ordering::SeqCst).min(window);
    assert_eq!(fs.getattr(a).unwrap().size, size);
    fs.unmount().unwrap();
    assert_fsck_clean(&t, "after fsync beside a writer");
}
