//! Drives are found by what they hold, not by their path, and are never shared between
//! two processes: loop devices that come back under other numbers, file-backed drives
//! moved to another directory (found through `nsddevices` or recorded by `nsd change`),
//! and two daemons with different homes reaching for the same file and loop device.

mod common;

use std::path::{Path, PathBuf};

use common::*;

const BYTES: u64 = 256 << 20;

fn nsd_stanza(node: &Node, name: &str, devices: &[(&str, &str)]) -> PathBuf {
    let text: String = devices
        .iter()
        .enumerate()
        .map(|(i, (dev, nsd))| {
            format!(
                "%nsd: device={dev} nsd={nsd} usage=dataAndMetadata failureGroup={} pool=system\n",
                i + 1
            )
        })
        .collect();
    let path = node.path(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn fs_create(node: &Node, fs: &str, stanza: &Path, mnt: &Path) {
    node.ok(&[
        "fs",
        "create",
        fs,
        "-F",
        s(stanza),
        "-B",
        "1M",
        "-T",
        s(mnt),
        "-A",
        "no",
    ]);
}

/// `nsd ls -m` rows as (NSD, device).
fn nsd_devices(node: &Node) -> Vec<(String, String)> {
    let out = node.ok(&["nsd", "ls", "-Y"]);
    let header: Vec<String> = out
        .lines()
        .find(|l| l.contains(":HEADER:"))
        .expect("header")
        .split(':')
        .map(str::to_string)
        .collect();
    let col = |name: &str| header.iter().position(|h| h == name).expect(name);
    let (nsd, dev) = (col("diskName"), col("device"));
    out.lines()
        .filter(|l| !l.contains(":HEADER:"))
        .map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f[nsd].to_string(), f[dev].replace("%3A", ":"))
        })
        .collect()
}

#[test]
fn nsds_on_loop_devices_are_found_after_the_loop_numbers_change() {
    if !loop_usable() {
        return;
    }
    let node = Node::new().start();
    let files: Vec<PathBuf> = (1..=2)
        .map(|i| node.drive(&format!("lo{i}.img"), BYTES))
        .collect();
    let mut loops: Vec<LoopDevice> = files.iter().map(|f| LoopDevice::attach(f)).collect();
    let before: Vec<String> = loops.iter().map(|l| l.dev.clone()).collect();
    let stanza = nsd_stanza(
        &node,
        "loop.stanza",
        &[(&before[0], "lo1"), (&before[1], "lo2")],
    );
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = node.path("mnt");
    fs_create(&node, "lfs", &stanza, &mnt);
    node.ok(&["mount", "lfs"]);
    let data = pattern(6 << 20, 7);
    std::fs::write(mnt.join("f"), &data).unwrap();
    node.ok(&["umount", "lfs"]);
    node.ok(&["shutdown"]);

    // The files come back under other numbers: a filler takes the lowest free one, and
    // the drives are attached in the other order.
    loops.clear();
    let filler_file = node.drive("filler.img", 1 << 20);
    let _filler = LoopDevice::attach(&filler_file);
    let again: Vec<LoopDevice> = files.iter().rev().map(|f| LoopDevice::attach(f)).collect();
    let after = [again[1].dev.clone(), again[0].dev.clone()];
    assert_ne!(after.to_vec(), before, "the loop numbers did not change");

    node.ok(&["startup"]);
    node.ok(&["mount", "lfs"]);
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), data);
    node.ok(&["umount", "lfs"]);
    let devices = nsd_devices(&node);
    assert!(
        devices.contains(&("lo1".into(), after[0].clone())),
        "{devices:?}"
    );
    assert!(
        devices.contains(&("lo2".into(), after[1].clone())),
        "{devices:?}"
    );
    let table = node.ok(&["nsd", "discover"]);
    assert!(
        table.contains("device before") && table.contains("found"),
        "{table}"
    );
    let fsck = node.ok(&["fsck", "lfs", "-n"]);
    assert!(fsck.to_lowercase().contains("clean"), "{fsck}");
}

#[test]
fn moved_drive_files_are_found_through_nsddevices_or_recorded_by_nsd_change() {
    if !fuse_usable() {
        return;
    }
    let node = Node::new().start();
    let old_dir = node.path("old");
    let new_dir = node.path("new");
    std::fs::create_dir_all(&old_dir).unwrap();
    std::fs::create_dir_all(&new_dir).unwrap();
    let files: Vec<PathBuf> = (1..=2)
        .map(|i| node.drive(&format!("old/d{i}.img"), BYTES))
        .collect();
    let stanza = nsd_stanza(
        &node,
        "files.stanza",
        &[(s(&files[0]), "fd1"), (s(&files[1]), "fd2")],
    );
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = node.path("mnt");
    fs_create(&node, "ffs", &stanza, &mnt);
    node.ok(&["mount", "ffs"]);
    let data = pattern(3 << 20, 9);
    std::fs::write(mnt.join("f"), &data).unwrap();
    node.ok(&["umount", "ffs"]);
    node.ok(&["shutdown"]);
    for i in 1..=2 {
        std::fs::rename(
            old_dir.join(format!("d{i}.img")),
            new_dir.join(format!("d{i}.img")),
        )
        .unwrap();
    }
    node.ok(&["startup"]);

    // Nothing says where they went: discover names both as not found and says what to do.
    let e = node.fails(&["nsd", "discover"]);
    assert!(
        e.contains("2 NSD(s) not found") && e.contains("nsd change"),
        "{e}"
    );
    let e = node.fails(&["mount", "ffs"]);
    assert!(e.contains("ffs"), "{e}");

    // nsd change checks the descriptor before it records anything.
    let e = node.fails(&[
        "nsd",
        "change",
        "fd1",
        "--device",
        s(&new_dir.join("d2.img")),
    ]);
    assert!(
        e.contains("holds NSD fd2") && e.contains("not NSD fd1"),
        "{e}"
    );
    let blank = node.drive("blank.img", BYTES);
    let e = node.fails(&["nsd", "change", "fd1", "--device", s(&blank)]);
    assert!(e.contains("no NSD descriptor"), "{e}");
    let e = node.fails(&["nsd", "change", "nope", "--device", s(&blank)]);
    assert!(e.contains("NSD nope does not exist"), "{e}");
    node.ok(&[
        "nsd",
        "change",
        "fd1",
        "--device",
        s(&new_dir.join("d1.img")),
    ]);

    // The search list finds the other one.
    std::fs::write(
        node.home().join("nsddevices"),
        format!("# file-backed drives\n{}/*.img\n", new_dir.display()),
    )
    .unwrap();
    let table = node.ok(&["nsd", "discover"]);
    let fd2 = table.lines().find(|l| l.contains("fd2")).expect("fd2 row");
    assert!(
        fd2.contains("moved") && fd2.contains("new/d2.img"),
        "{table}"
    );
    let fd1 = table.lines().find(|l| l.contains("fd1")).expect("fd1 row");
    assert!(fd1.contains("found"), "{table}");
    node.ok(&["mount", "ffs"]);
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), data);
    node.ok(&["umount", "ffs"]);
}

#[test]
fn a_second_daemon_cannot_take_a_file_or_loop_device_the_first_one_uses() {
    if !loop_usable() {
        return;
    }
    let first = Node::new().start();
    let second = Node::new().start();
    let file = first.drive("shared.img", BYTES);
    let loop_file = first.drive("shared-loop.img", BYTES);
    let lo = LoopDevice::attach(&loop_file);
    let stanza = nsd_stanza(
        &first,
        "a.stanza",
        &[(s(&file), "mine1"), (&lo.dev, "mine2")],
    );
    first.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = first.path("mnt");
    fs_create(&first, "afs", &stanza, &mnt);
    first.ok(&["mount", "afs"]);
    let data = pattern(5 << 20, 3);
    std::fs::write(mnt.join("f"), &data).unwrap();
    let pid = first.daemon_pid();

    // `-v no` overrides "held an NSD once", never "open right now".
    for (dev, nsd) in [(s(&file).to_string(), "mine1"), (lo.dev.clone(), "mine2")] {
        let theirs = nsd_stanza(&second, "b.stanza", &[(&dev, "theirs")]);
        let e = second.fails(&["nsd", "create", "-F", s(&theirs), "-v", "no"]);
        assert!(e.contains("in use"), "{e}");
        assert!(e.contains(&format!("pid {pid}")), "{e}");
        assert!(e.contains(&format!("NSD {nsd}")), "{e}");
        assert!(e.contains("file system afs"), "{e}");
        assert!(e.contains(&dev), "{e}");
    }
    assert!(nsd_devices(&second).is_empty());

    // The first daemon's data is untouched.
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), data);
    first.ok(&["umount", "afs"]);
    let fsck = first.ok(&["fsck", "afs", "-n"]);
    assert!(fsck.to_lowercase().contains("clean"), "{fsck}");

    // Once the first daemon is gone the device is free for `-v no`.
    first.ok(&["shutdown"]);
    let theirs = nsd_stanza(&second, "c.stanza", &[(s(&file), "theirs")]);
    second.ok(&["nsd", "create", "-F", s(&theirs), "-v", "no"]);
}

#[test]
fn pdisks_are_found_by_label_after_their_files_move_and_a_second_daemon_is_refused() {
    if !fuse_usable() {
        return;
    }
    let node = Node::new().start();
    let stanza = node.vdisk_stanza("vd", 1, "512M", "1M");
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = node.path("mnt");
    fs_create(&node, "vfs", &stanza, &mnt);
    node.ok(&["mount", "vfs"]);
    let data = pattern(8 << 20, 11);
    std::fs::write(mnt.join("f"), &data).unwrap();

    // A second daemon may not take the pdisks of an array the first one serves.
    let second = Node::new().start();
    let e = second.fails(&[
        "da",
        "create",
        "dax",
        "-F",
        s(&node.path("pdisks.stanza")),
        "-v",
        "no",
    ]);
    assert!(e.contains("in use"), "{e}");
    assert!(e.contains(&format!("pid {}", node.daemon_pid())), "{e}");
    assert!(e.contains("of declustered array da1"), "{e}");
    drop(second);

    node.ok(&["umount", "vfs"]);
    node.ok(&["shutdown"]);
    let moved = node.path("moved");
    std::fs::create_dir_all(&moved).unwrap();
    for e in 1..=6 {
        for slot in 1..=2 {
            let name = format!("jbof{e}-slot{slot}");
            std::fs::rename(node.path(&name), moved.join(&name)).unwrap();
        }
    }
    std::fs::write(
        node.home().join("nsddevices"),
        format!("{}/jbof*\n", moved.display()),
    )
    .unwrap();
    node.ok(&["startup"]);
    let pdisks = node.ok(&["pdisk", "ls"]);
    let rows: Vec<&str> = pdisks.lines().filter(|l| l.contains("jbof")).collect();
    assert_eq!(rows.len(), 12, "{pdisks}");
    for row in rows {
        assert!(row.contains("/moved/") && row.contains(" ok"), "{pdisks}");
    }
    let table = node.ok(&["nsd", "discover"]);
    let row = table
        .lines()
        .find(|l| l.contains("vdisk:vd0"))
        .expect("vd0 row");
    assert!(row.contains("found"), "{table}");
    node.ok(&["mount", "vfs"]);
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), data);
    node.ok(&["umount", "vfs"]);
}
