//! End-to-end checks of what an administrator relies on: bulk data and many small files
//! survive unmount and mount, and broken setups (a missing disk, destroyed descriptors, an
//! exhausted inode limit) fail with errors that say what is wrong and leave data alone.

mod common;

use std::io::{Read, Write};

use common::*;

fn pattern_chunk(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A node with file system fs1 of four `drive_bytes` NSDs mounted at `mnt`.
fn node_with_fs(drive_bytes: u64, extra: &[&str]) -> (Node, std::path::PathBuf) {
    let mut node = Node::new().start();
    let stanza = node.stanza("d", 4, drive_bytes);
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = node.path("mnt");
    node.mounts.push(mnt.clone());
    let mut args = vec!["fs", "create", "fs1", "-F", s(&stanza), "-T", s(&mnt)];
    args.extend_from_slice(extra);
    node.ok(&args);
    node.ok(&["mount", "fs1"]);
    (node, mnt)
}

#[test]
fn one_gib_and_ten_thousand_small_files_survive_remount() {
    if !fuse_usable() {
        return;
    }
    let (node, mnt) = node_with_fs(1 << 30, &["-B", "1M"]);
    const CHUNK: usize = 8 << 20;
    const CHUNKS: u64 = 128; // 1 GiB
    let mut f = std::fs::File::create(mnt.join("big")).unwrap();
    for c in 0..CHUNKS {
        f.write_all(&pattern_chunk(c, CHUNK)).unwrap();
    }
    drop(f);
    std::fs::create_dir(mnt.join("small")).unwrap();
    for i in 0..10_000u64 {
        let len = (i * 7919 % 20_000) as usize;
        std::fs::write(
            mnt.join(format!("small/{i}")),
            pattern_chunk(1_000_000 + i, len),
        )
        .unwrap();
    }
    node.ok(&["umount", "fs1"]);
    node.ok(&["mount", "fs1"]);
    let mut f = std::fs::File::open(mnt.join("big")).unwrap();
    let mut buf = vec![0u8; CHUNK];
    for c in 0..CHUNKS {
        f.read_exact(&mut buf).unwrap();
        assert!(
            buf == pattern_chunk(c, CHUNK),
            "big file differs in chunk {c}"
        );
    }
    assert_eq!(
        f.read(&mut buf).unwrap(),
        0,
        "big file is longer than written"
    );
    drop(f);
    for i in 0..10_000u64 {
        let len = (i * 7919 % 20_000) as usize;
        let data = std::fs::read(mnt.join(format!("small/{i}"))).unwrap();
        assert!(
            data == pattern_chunk(1_000_000 + i, len),
            "small/{i} differs"
        );
    }
    node.ok(&["umount", "fs1"]);
    assert!(node.ok(&["fsck", "fs1", "-n"]).contains("is clean"));
}

#[test]
fn missing_disk_and_destroyed_descriptors_refuse_to_mount() {
    if !fuse_usable() {
        return;
    }
    let (node, mnt) = node_with_fs(128 << 20, &["-B", "256K"]);
    std::fs::write(mnt.join("keep"), b"precious").unwrap();
    node.ok(&["umount", "fs1"]);
    // A drive that vanished: the error names the NSD and what to check.
    let drive = node.path("d-drive2");
    let hidden = node.path("d-drive2.away");
    std::fs::rename(&drive, &hidden).unwrap();
    let err = node.fails(&["mount", "fs1"]);
    assert!(err.contains("d2"), "{err}");
    std::fs::rename(&hidden, &drive).unwrap();
    node.ok(&["mount", "fs1"]);
    assert_eq!(std::fs::read(mnt.join("keep")).unwrap(), b"precious");
    node.ok(&["umount", "fs1"]);
    // Every descriptor copy destroyed: mount refuses and says so.
    let saved: Vec<Vec<u8>> = (0..4)
        .map(|i| read_slots(&node.path(&format!("d-drive{i}"))))
        .collect();
    for (i, bytes) in saved.iter().enumerate() {
        write_slots(&node.path(&format!("d-drive{i}")), &vec![0x5a; bytes.len()]);
    }
    let err = node.fails(&["mount", "fs1"]);
    assert!(err.to_lowercase().contains("descriptor"), "{err}");
    for (i, bytes) in saved.iter().enumerate() {
        write_slots(&node.path(&format!("d-drive{i}")), bytes);
    }
    node.ok(&["mount", "fs1"]);
    assert_eq!(std::fs::read(mnt.join("keep")).unwrap(), b"precious");
}

/// The two file-system descriptor slots: 256 KiB..768 KiB of every NSD.
fn read_slots(path: &std::path::Path) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; 512 << 10];
    f.read_exact_at(&mut buf, 256 << 10).unwrap();
    buf
}

fn write_slots(path: &std::path::Path, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, 256 << 10).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn inode_limit_gives_enospc_and_keeps_the_file_system_usable() {
    if !fuse_usable() {
        return;
    }
    let (node, mnt) = node_with_fs(128 << 20, &["-B", "256K", "--inode-limit", "200"]);
    let mut created = 0;
    let err = loop {
        match std::fs::write(mnt.join(format!("f{created}")), b"x") {
            Ok(()) => created += 1,
            Err(e) => break e,
        }
        assert!(created <= 200, "the inode limit was not enforced");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    assert!(created >= 190, "only {created} files before ENOSPC");
    std::fs::remove_file(mnt.join("f0")).unwrap();
    std::fs::write(mnt.join("again"), b"y").unwrap();
    let df = node.ok(&["df", "fs1"]);
    assert!(df.contains("200"), "{df}");
    node.ok(&["umount", "fs1"]);
    assert!(node.ok(&["fsck", "fs1", "-n"]).contains("is clean"));
}
