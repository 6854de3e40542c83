//! One directory of a million entries through the file-system core, with a metadata cache of
//! a few dozen pages: created, listed with readdir while entries come and go (no entry that
//! stayed is lost or repeated, cookies stable), renamed into, emptied, and checked by fsck.
//! `TESSERA_BIG_DIR_ENTRIES` changes the count.

mod common;

use std::collections::HashMap;

use common::*;
use tessera_fs::{Caller, FileKind, FormatOptions, ROOT_INO};

const ROOT: Caller = Caller { uid: 0, gid: 0 };

fn name(i: u64) -> Vec<u8> {
    format!("entry.{i:08}").into_bytes()
}

#[test]
fn a_million_entries_in_one_directory() {
    let n = tessera_testkit::iterations("TESSERA_BIG_DIR_ENTRIES", 1_000_000) as u64;
    let t = make_disks(4, 512 << 20);
    format_fs(
        &t,
        &FormatOptions {
            max_inodes: n + 10_000,
            ..small_opts()
        },
    );
    let fs = mount(&t);
    fs.set_metadata_cache_pages(32);
    fs.set_inode_cache(1000);
    fs.set_stat_cache(1000);
    let dir = fs
        .create_node(ROOT_INO, b"big", FileKind::Directory, 0o755, 0, ROOT, None)
        .unwrap()
        .ino;
    let mut inos = HashMap::with_capacity(n as usize);
    for i in 0..n {
        let a = create_file(&fs, dir, &name(i));
        inos.insert(a.ino, i);
    }
    // What the background flusher would do: every changed page written, so the listing
    // below runs through the clean-page cache.
    fs.checkpoint().unwrap();

    // List in batches while entries are removed ahead of the cursor and added anywhere.
    let mut seen = vec![false; n as usize];
    let mut removed = vec![false; n as usize];
    let mut after = 0;
    let mut added = 0u64;
    let mut cookies = HashMap::new();
    loop {
        let batch = fs.readdir(dir, after).unwrap();
        let Some(last) = batch.entries.last() else {
            break;
        };
        after = last.0;
        for (cookie, ino, _, entry) in &batch.entries {
            if entry == b"." || entry == b".." {
                continue;
            }
            if let Some(i) = inos.get(ino) {
                assert!(!seen[*i as usize], "entry {i} listed twice");
                seen[*i as usize] = true;
                assert!(cookies.insert(*ino, *cookie).is_none());
            }
        }
        let victim = (after.wrapping_mul(0x9e37_79b9) >> 7) % n;
        if !removed[victim as usize] && !seen[victim as usize] {
            fs.remove(dir, &name(victim), false).unwrap();
            removed[victim as usize] = true;
        }
        create_file(&fs, dir, &name(n + added));
        added += 1;
    }
    for i in 0..n as usize {
        assert!(seen[i] || removed[i], "entry {i} was never listed");
    }
    let stats = fs.metadata_cache_stats();
    assert!(stats.evictions > n / 1000, "{stats:?}");

    // Cookies are stable: a second listing gives every entry the cookie it had.
    let mut after = 0;
    let mut listed = 0u64;
    loop {
        let batch = fs.readdir(dir, after).unwrap();
        let Some(last) = batch.entries.last() else {
            break;
        };
        after = last.0;
        for (cookie, ino, _, _) in &batch.entries {
            if let Some(c) = cookies.get(ino) {
                assert_eq!(c, cookie, "inode {ino} changed cookie");
            }
            listed += 1;
        }
    }
    let gone = removed.iter().filter(|r| **r).count() as u64;
    assert_eq!(listed, 2 + n - gone + added);

    // Renamed into: files of another directory move in under new names.
    let other = make_dir(&fs, ROOT_INO, b"other").ino;
    for i in 0..1000u64 {
        create_file(&fs, other, &name(i));
        let to = format!("moved.{i}").into_bytes();
        fs.rename(other, &name(i), dir, &to, false, false).unwrap();
        assert_eq!(fs.lookup(dir, &to).unwrap().kind, FileKind::Regular);
    }
    fs.unmount().unwrap();
    drop(fs);

    // Emptied after a remount (a cold cache), then removed.
    let fs = mount(&t);
    fs.set_metadata_cache_pages(32);
    fs.set_inode_cache(1000);
    fs.set_stat_cache(1000);
    loop {
        let batch = fs.readdir(dir, 2).unwrap();
        if batch.entries.is_empty() {
            break;
        }
        for (_, _, _, entry) in &batch.entries {
            fs.remove(dir, entry, false).unwrap();
        }
    }
    fs.remove(ROOT_INO, b"big", true).unwrap();
    assert!(fs.lookup(ROOT_INO, b"big").is_err());
    fs.unmount().unwrap();
    drop(fs);
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_eq!(report.inodes, 2, "root and `other` are left");
}

/// `pagepool` bounds the changed pages too: with 16 MiB (1,024 pages of 16 KiB) no more
/// than that wait for a checkpoint however many files are created, and the flusher's check
/// starts a checkpoint once a quarter of it has changed.
#[test]
fn the_pagepool_bounds_changed_pages() {
    const POOL_PAGES: usize = 2048;
    let t = make_disks(4, 512 << 20);
    format_fs(
        &t,
        &FormatOptions {
            // A log big enough that it does not fill (and checkpoint) first.
            log_bytes: 64 << 20,
            max_inodes: 300_000,
            ..small_opts()
        },
    );
    let fs = mount(&t);
    fs.set_metadata_cache_bytes((POOL_PAGES as u64) * 16 * 1024);
    let dir = fs
        .create_node(ROOT_INO, b"d", FileKind::Directory, 0o755, 0, ROOT, None)
        .unwrap()
        .ino;
    // The pool is memory: a changed page counts at 1.25 times its size, a clean one at
    // what its node takes.
    let dirty_pages_in_pool = POOL_PAGES * 4 / 5;
    let mut most = 0;
    let mut most_in_memory = 0;
    for i in 0..200_000 {
        create_file(&fs, dir, &name(i));
        let stats = fs.metadata_cache_stats();
        most = most.max(stats.dirty_pages);
        most_in_memory =
            most_in_memory.max(stats.cached_bytes + stats.dirty_pages * 16 * 1024 * 5 / 4);
    }
    // One change dirties a leaf, an inode page and the branches above them; a change
    // waits for a checkpoint at half the pool.
    assert!(
        most > dirty_pages_in_pool / 4 && most <= dirty_pages_in_pool / 2 + 16,
        "at most {most} changed pages"
    );
    // Clean pages give way to changed ones: the pool bounds both together.
    assert!(
        most_in_memory <= POOL_PAGES * 16 * 1024 + 256 * 1024,
        "at most {most_in_memory} bytes in memory, clean and changed"
    );

    // The flusher's check: nothing below a quarter of the pool, a checkpoint above it.
    fs.checkpoint().unwrap();
    let mut i = 200_000;
    while fs.metadata_cache_stats().dirty_pages <= dirty_pages_in_pool / 4 {
        fs.maybe_checkpoint().unwrap();
        assert!(fs.metadata_cache_stats().dirty_pages > 0 || i == 200_000);
        create_file(&fs, dir, &name(i));
        i += 1;
    }
    fs.maybe_checkpoint().unwrap();
    assert_eq!(fs.metadata_cache_stats().dirty_pages, 0);
    fs.unmount().unwrap();
    drop(fs);
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}
