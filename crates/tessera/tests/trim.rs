//! TRIM (`thinDiskType`): data blocks freed by a delete go back to thin-provisioned NSDs
//! once the delete is durable, as holes in file-backed drives and in the pdisks of a vdisk;
//! `thinDiskType=no` gives nothing back; `nvme` on a device that cannot deallocate stops
//! the mount with an error naming the NSD and what to change.

mod common;

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use common::*;

const MIB: u64 = 1 << 20;

/// The drives a stanza names, and the same stanza with `extra` added to every line.
fn drives_with(stanza: &Path, extra: &str) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(stanza).unwrap();
    let mut out = String::new();
    let mut drives = Vec::new();
    for line in text.lines() {
        let dev = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("device="))
            .unwrap();
        drives.push(PathBuf::from(dev));
        out += &format!("{line} {extra}\n");
    }
    std::fs::write(stanza, out).unwrap();
    drives
}

/// Bytes the host file system holds for the drive files.
fn allocated(drives: &[PathBuf]) -> u64 {
    drives
        .iter()
        .map(|d| std::fs::metadata(d).unwrap().blocks() * 512)
        .sum()
}

fn write_file(path: &Path, bytes: u64) {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk: Vec<u8> = (0..MIB).map(|i| (i * 31 % 251) as u8 + 1).collect();
    for _ in 0..bytes / MIB {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
}

/// Deletes `big` and returns the bytes its drives gave back once the delete is durable:
/// an fsync of another file commits it (a group commit covers every change logged before
/// it). The kernel closes a FUSE file asynchronously, so the blocks may be released a
/// moment after the unlink: it tries `tries` times while less than `enough` came back.
fn freed_by_delete(big: &Path, drives: &[PathBuf], enough: u64, tries: usize) -> u64 {
    let before = allocated(drives);
    std::fs::remove_file(big).unwrap();
    let dir = big.parent().unwrap();
    let mut freed = 0;
    for i in 0..tries {
        write_file(&dir.join(format!("marker{i}")), MIB);
        freed = before.saturating_sub(allocated(drives));
        if freed >= enough {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    freed
}

#[test]
fn freed_blocks_go_back_to_thin_drives_only() {
    if !fuse_usable() {
        return;
    }
    let mut node = Node::new().start();
    let mut mounts = Vec::new();
    let mut drives = Vec::new();
    for (fs, thin) in [("thin", "auto"), ("thick", "no")] {
        let stanza = node.stanza(fs, 2, 256 * MIB);
        drives.push(drives_with(&stanza, &format!("thinDiskType={thin}")));
        node.ok(&["nsd", "create", "-F", s(&stanza)]);
        let mnt = node.create_fs(fs, &stanza, &format!("{fs}-mnt"));
        node.ok(&["mount", fs]);
        mounts.push(mnt);
    }
    let want = 64 * MIB;
    let enough = want - 8 * MIB;
    let mut freed = Vec::new();
    for (mnt, drives) in mounts.iter().zip(&drives) {
        let big = mnt.join("big");
        write_file(&big, want);
        let tries = if freed.is_empty() { 30 } else { 3 };
        freed.push(freed_by_delete(&big, drives, enough, tries));
    }
    // The thin file system's drives gave back the file's blocks (the marker file and the
    // metadata written since take a little); the thick one's kept them.
    assert!(
        freed[0] >= enough,
        "thinDiskType=auto: {} MiB given back after deleting {} MiB",
        freed[0] / MIB,
        want / MIB
    );
    assert!(
        freed[1] < 4 * MIB,
        "thinDiskType=no: {} MiB given back",
        freed[1] / MIB
    );
    // The space is free for the file system again and what is written there reads back.
    let again = mounts[0].join("again");
    write_file(&again, want);
    let data = std::fs::read(&again).unwrap();
    assert_eq!(data.len() as u64, want);
    assert!(data.chunks(MIB as usize).all(|c| c
        .iter()
        .enumerate()
        .all(|(i, b)| *b == (i as u64 * 31 % 251) as u8 + 1)));
    let stats = node.ok(&["diag", "--stats"]);
    assert!(
        stats.contains("given back to thin-provisioned disks"),
        "{stats}"
    );
}

/// A file system on a vdisk with `thinDiskType=nvme`: the stripes of deleted files go back
/// to the array's pdisks (holes in their files), and the vdisk counts them.
#[test]
fn thin_vdisk_gives_freed_stripes_back_to_its_pdisks() {
    if !fuse_usable() {
        return;
    }
    let mut node = Node::new().start();
    let stanza = node.vdisk_stanza("v", 1, "512M", "1M");
    drives_with(&stanza, "thinDiskType=nvme");
    let pdisks: Vec<PathBuf> = std::fs::read_dir(node.dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("jbof"))
        .collect();
    assert_eq!(pdisks.len(), 12);
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = node.create_fs("gfs", &stanza, "mnt");
    node.ok(&["mount", "gfs"]);
    let want = 48 * MIB;
    let big = mnt.join("big");
    write_file(&big, want);
    // 8+2p: the pdisks hold the file's bytes and a quarter more in parity.
    let enough = want - 8 * MIB;
    let freed = freed_by_delete(&big, &pdisks, enough, 30);
    assert!(
        freed >= enough,
        "{} MiB of the pdisk files given back after deleting {} MiB",
        freed / MIB,
        want / MIB
    );
    let again = mnt.join("again");
    write_file(&again, want);
    assert_eq!(std::fs::read(&again).unwrap().len() as u64, want);
}

/// `thinDiskType=nvme` promises a device that deallocates: a vdisk whose pdisks are block
/// devices (whose discards need not read back as zeros, so the array keeps their strips)
/// cannot, and the mount stops with an error naming the NSD and what to change.
#[test]
fn nvme_thin_type_on_a_device_that_cannot_deallocate_stops_the_mount() {
    if !loop_usable() {
        return;
    }
    let mut node = Node::new().start();
    let loops: Vec<LoopDevice> = (0..4)
        .map(|i| LoopDevice::attach(&node.drive(&format!("lp{i}"), 128 * MIB)))
        .collect();
    let pdisks = node.path("pdisks.stanza");
    let text: String = loops
        .iter()
        .enumerate()
        .map(|(i, l)| {
            format!(
                "%pdisk: pdisk=p{i} device={} enclosure=e{i} slot=1\n",
                l.dev
            )
        })
        .collect();
    std::fs::write(&pdisks, text).unwrap();
    node.ok(&["da", "create", "da1", "-F", s(&pdisks)]);
    node.ok(&[
        "vdisk",
        "create",
        "v0",
        "--da",
        "da1",
        "--code",
        "3WayReplication",
        "--block-size",
        "1M",
        "--size",
        "64M",
    ]);
    let stanza = node.path("v.stanza");
    std::fs::write(
        &stanza,
        "%nsd: device=vdisk:v0 nsd=v0 usage=dataAndMetadata thinDiskType=nvme\n",
    )
    .unwrap();
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    node.create_fs("gfs", &stanza, "mnt");
    let err = node.fails(&["mount", "gfs"]);
    assert!(
        err.contains("v0") && err.contains("thinDiskType=nvme") && err.contains("auto or no"),
        "{err}"
    );
    // The daemon lets the loop devices go before they are detached.
    node.ok(&["shutdown"]);
    node.started = false;
}

/// `tessera fs reclaimspace` gives every free block of thin disks back, offline and
/// mounted, and leaves what files hold intact; a file system without thin disks says there
/// is nothing to reclaim.
#[test]
fn reclaimspace_gives_free_blocks_back() {
    if !fuse_usable() {
        return;
    }
    let mut node = Node::new().start();
    let stanza = node.stanza("r", 2, 256 * MIB);
    let drives = drives_with(&stanza, "thinDiskType=auto");
    // Every byte of the drives allocated on the host, as on a thin device that was written
    // all over before.
    for d in &drives {
        let status = std::process::Command::new("fallocate")
            .args(["-l", "256MiB", s(d)])
            .status()
            .unwrap();
        assert!(status.success());
    }
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = node.create_fs("r", &stanza, "r-mnt");
    let before = allocated(&drives);
    let out = node.ok(&["fs", "reclaimspace", "r"]);
    let after = allocated(&drives);
    assert!(
        before - after >= 400 * MIB,
        "{} MiB given back of {} MiB:\n{out}",
        (before - after) / MIB,
        before / MIB
    );
    assert!(
        out.contains("r0") && out.contains("r1") && out.contains("Gave"),
        "{out}"
    );

    // Mounted, under a file: its blocks stay, and it reads back.
    node.ok(&["mount", "r"]);
    let file = mnt.join("kept");
    write_file(&file, 32 * MIB);
    node.ok(&["fs", "reclaimspace", "r"]);
    let data = std::fs::read(&file).unwrap();
    assert_eq!(data.len() as u64, 32 * MIB);
    assert!(data.chunks(MIB as usize).all(|c| c
        .iter()
        .enumerate()
        .all(|(i, b)| *b == (i as u64 * 31 % 251) as u8 + 1)));
    assert!(allocated(&drives) >= 32 * MIB);

    let thick = node.stanza("k", 1, 256 * MIB);
    node.ok(&["nsd", "create", "-F", s(&thick)]);
    node.ok(&["fs", "create", "k", "-F", s(&thick), "-B", "1M", "-A", "no"]);
    let err = node.fails(&["fs", "reclaimspace", "k"]);
    assert!(err.contains("nothing to reclaim"), "{err}");
}
