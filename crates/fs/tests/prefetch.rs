//! Sequential read-ahead never serves stale bytes: every read after a write, truncate,
//! fallocate or unlink-and-reuse returns what the file holds now, whether or not the blocks
//! were read ahead before the change.

mod common;

use std::sync::Arc;

use common::*;
use tessera_fs::{FileSystem, Ino, ROOT_INO};

const BLOCK: usize = 256 << 10;
const CHUNK: u32 = 128 << 10;

/// Reads the whole file front to back in `CHUNK` pieces, as the kernel's read-ahead does.
fn read_sequential(fs: &FileSystem, ino: Ino, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let piece = fs.read(ino, out.len() as u64, CHUNK).unwrap();
        assert!(!piece.is_empty(), "short read at {}", out.len());
        out.extend_from_slice(&piece);
    }
    out
}

/// Reads blocks `from..to` one block at a time, continuing a sequential stream.
fn read_blocks(fs: &FileSystem, ino: Ino, from: usize, to: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in from..to {
        out.extend(fs.read(ino, (i * BLOCK) as u64, BLOCK as u32).unwrap());
    }
    out
}

fn write_all(fs: &FileSystem, ino: Ino, at: u64, data: &[u8]) {
    for (i, chunk) in data.chunks(CHUNK as usize).enumerate() {
        fs.write(ino, at + (i * CHUNK as usize) as u64, chunk, false)
            .unwrap();
    }
}

#[test]
fn reads_after_changes_see_the_changes() {
    let t = make_disks(4, 96 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let len = 40 * BLOCK;
    let f = create_file(&fs, ROOT_INO, b"f");
    let mut expect = pattern(len, 1);
    write_all(&fs, f.ino, 0, &expect);
    assert_eq!(read_sequential(&fs, f.ino, len), expect);

    // Read the first half, so the second half is read ahead; then change it.
    for i in 0..20 {
        let at = (i * BLOCK) as u64;
        let got = fs.read(f.ino, at, BLOCK as u32).unwrap();
        assert_eq!(got, &expect[i * BLOCK..(i + 1) * BLOCK]);
    }
    // In place, unaligned, across a block boundary.
    let patch = pattern(BLOCK + 777, 2);
    let at = 22 * BLOCK + 13;
    fs.write(f.ino, at as u64, &patch, false).unwrap();
    expect[at..at + patch.len()].copy_from_slice(&patch);
    assert_eq!(read_blocks(&fs, f.ino, 20, 40), &expect[20 * BLOCK..]);
    assert_eq!(read_sequential(&fs, f.ino, len), expect);

    // Punch a hole in blocks that were read ahead.
    for i in 0..30 {
        fs.read(f.ino, (i * BLOCK) as u64, BLOCK as u32).unwrap();
    }
    fs.fallocate(
        f.ino,
        (31 * BLOCK) as u64,
        (2 * BLOCK) as u64,
        tessera_fs::FALLOC_FL_PUNCH_HOLE | tessera_fs::FALLOC_FL_KEEP_SIZE,
    )
    .unwrap();
    expect[31 * BLOCK..33 * BLOCK].fill(0);
    assert_eq!(read_blocks(&fs, f.ino, 30, 40), &expect[30 * BLOCK..]);
    assert_eq!(read_sequential(&fs, f.ino, len), expect);

    // Shrink, then grow with other bytes.
    for i in 0..10 {
        fs.read(f.ino, (i * BLOCK) as u64, BLOCK as u32).unwrap();
    }
    fs.truncate(f.ino, (10 * BLOCK) as u64).unwrap();
    let tail = pattern(30 * BLOCK, 3);
    write_all(&fs, f.ino, (10 * BLOCK) as u64, &tail);
    expect[10 * BLOCK..].copy_from_slice(&tail);
    assert_eq!(read_blocks(&fs, f.ino, 10, 40), &expect[10 * BLOCK..]);
    assert_eq!(read_sequential(&fs, f.ino, len), expect);

    // Remove it while read ahead and create another file (inode numbers are reused).
    for i in 0..5 {
        fs.read(f.ino, (i * BLOCK) as u64, BLOCK as u32).unwrap();
    }
    fs.remove(ROOT_INO, b"f", false).unwrap();
    let g = create_file(&fs, ROOT_INO, b"g");
    let other = pattern(len, 4);
    write_all(&fs, g.ino, 0, &other);
    assert_eq!(read_blocks(&fs, g.ino, 5, 40), &other[5 * BLOCK..]);
    assert_eq!(read_sequential(&fs, g.ino, len), other);
    fs.unmount().unwrap();
}

#[test]
fn parallel_sequential_readers_of_many_files_get_their_own_bytes() {
    let t = make_disks(4, 128 << 20);
    format_fs(&t, &small_opts());
    let fs = mount(&t);
    let len = 24 * BLOCK + 4321;
    let files: Vec<(Ino, u64)> = (0..6u64)
        .map(|i| {
            let f = create_file(&fs, ROOT_INO, format!("f{i}").as_bytes());
            write_all(&fs, f.ino, 0, &pattern(len, 10 + i));
            (f.ino, 10 + i)
        })
        .collect();
    let threads: Vec<_> = files
        .into_iter()
        .flat_map(|(ino, seed)| {
            // Two readers per file, like a reader and the kernel's read-ahead.
            (0..2).map(move |_| (ino, seed))
        })
        .map(|(ino, seed)| {
            let fs = Arc::clone(&fs);
            std::thread::spawn(move || {
                for _ in 0..3 {
                    assert_eq!(read_sequential(&fs, ino, len), pattern(len, seed));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    fs.unmount().unwrap();
}
