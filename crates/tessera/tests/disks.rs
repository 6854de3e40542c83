//! Disks of a live file system through the CLI: `disk change` suspends and resumes
//! allocation on NSDs (shown by `disk ls`), `restripe -m` moves the data off a suspended
//! disk while a writer keeps writing and verifying files, `restripe -b` evens the disks
//! out, modes that need replication or policies are refused with what to use instead, and
//! fsck is clean afterwards. A file system with two data copies (`-r 2`) keeps every byte
//! through a stopped failure group and through a failure group whose drives are gone.

mod common;

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;

const MIB: u64 = 1 << 20;

fn write_file(path: &Path, data: &[u8]) {
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

/// A thread that rewrites three files of its own in `dir` and reads each back, round after
/// round, until stopped (and for at least three rounds).
struct Writer {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl Writer {
    fn start(dir: &Path, bytes: usize, seed: u64) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, dir) = (stop.clone(), dir.to_path_buf());
        let thread = std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !flag.load(Ordering::Relaxed) || rounds < 3 {
                let path = dir.join(format!("w{}", rounds % 3));
                let data = pattern(bytes + rounds as usize * 4096, seed + rounds);
                write_file(&path, &data);
                assert!(std::fs::read(&path).unwrap() == data, "{}", path.display());
                rounds += 1;
            }
            rounds
        });
        Writer { stop, thread }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        assert!(self.thread.join().unwrap() >= 3);
    }
}

/// Column `column` of `disk ls -Y` for `nsd` (13: status, 14: availability).
fn disk_ls_column(node: &Node, fs: &str, nsd: &str, column: usize) -> String {
    let out = node.ok(&["disk", "ls", fs, "-Y"]);
    let line = out
        .lines()
        .find(|l| !l.contains(":HEADER:") && l.contains(&format!(":{nsd}:")))
        .unwrap_or_else(|| panic!("{nsd} not in\n{out}"));
    // disk::0:1:::fileSystem:diskName:driverType:sectorSize:failureGroup:metadata:data:status:
    // availability:...
    line.split(':').nth(column).unwrap().to_string()
}

/// The `status` column of `disk ls -Y` for `nsd`.
fn status_of(node: &Node, fs: &str, nsd: &str) -> String {
    disk_ls_column(node, fs, nsd, 13)
}

/// A stanza file `TAG.stanza` with one 256 MiB drive file (`TAG-drive{i}`) per NSD,
/// given as (name, usage, failure group), all in pool system; returns it and the drives.
fn grouped_stanza(
    node: &Node,
    tag: &str,
    nsds: &[(&str, &str, i32)],
) -> (std::path::PathBuf, Vec<std::path::PathBuf>) {
    let mut text = String::new();
    let mut drives = Vec::new();
    for (i, (name, usage, fg)) in nsds.iter().enumerate() {
        let dev = node.drive(&format!("{tag}-drive{i}"), 256 * MIB);
        text += &format!(
            "%nsd: device={} nsd={name} usage={usage} failureGroup={fg} pool=system\n",
            dev.display()
        );
        drives.push(dev);
    }
    let stanza = node.path(&format!("{tag}.stanza"));
    std::fs::write(&stanza, text).unwrap();
    (stanza, drives)
}

/// The `availability` column of `disk ls -Y` for `nsd`.
fn availability_of(node: &Node, fs: &str, nsd: &str) -> String {
    disk_ls_column(node, fs, nsd, 14)
}

#[test]
fn suspend_migrate_resume_and_balance_a_mounted_file_system() {
    if !fuse_usable() {
        return;
    }
    let mut node = Node::new().start();
    let stanza = node.stanza("dk", 4, 256 * MIB);
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = node.create_fs("dfs", &stanza, "mnt");
    node.ok(&["mount", "dfs"]);
    let mut files = Vec::new();
    for i in 0..12u64 {
        let data = pattern(((i % 4) * 3 + 1) as usize * 700_000, i);
        write_file(&mnt.join(format!("f{i}")), &data);
        files.push((mnt.join(format!("f{i}")), data));
    }

    node.ok(&["disk", "change", "dfs", "suspend", "-d", "dk1"]);
    assert_eq!(status_of(&node, "dfs", "dk1"), "suspended");
    // A writer rewrites and verifies its own files while the data moves.
    let writer = Writer::start(&mnt, 1_500_000, 1000);
    let out = node.ok(&["restripe", "dfs", "-m"]);
    writer.stop();
    assert!(out.contains("data blocks moved"), "{out}");
    assert!(!out.contains(": 0 of"), "nothing moved: {out}");
    let again = node.ok(&["restripe", "dfs", "-m"]);
    assert!(
        again.contains(": 0 of"),
        "data left on the suspended disk: {again}"
    );
    for (path, data) in &files {
        assert!(std::fs::read(path).unwrap() == *data, "{}", path.display());
    }

    node.ok(&["disk", "change", "dfs", "resume", "-d", "dk1"]);
    assert_eq!(status_of(&node, "dfs", "dk1"), "ready");
    let out = node.ok(&["restripe", "dfs", "-b"]);
    assert!(
        !out.contains(": 0 of"),
        "nothing rebalanced onto the emptied disk: {out}"
    );
    node.ok(&["disk", "change", "dfs", "empty", "-d", "dk3;dk2"]);
    assert_eq!(status_of(&node, "dfs", "dk2"), "to be emptied");

    // What is not built is refused with the way forward; a bad disk name or a change that
    // leaves no disk to allocate on is refused too.
    let err = node.fails(&["disk", "change", "dfs", "stop", "-d", "dk0"]);
    assert!(
        err.contains("replication") && err.contains("suspend"),
        "{err}"
    );
    // A file system without data replication has nothing to restore.
    let out = node.ok(&["restripe", "dfs", "-r"]);
    assert!(out.contains(": 0 of"), "{out}");
    let err = node.fails(&["disk", "change", "dfs", "suspend", "-d", "nosuch"]);
    assert!(
        err.contains("nosuch is not a disk of file system dfs"),
        "{err}"
    );
    let err = node.fails(&["disk", "change", "dfs", "suspend", "-d", "dk0,dk1"]);
    assert!(err.contains("no ready disk"), "{err}");

    node.ok(&["umount", "dfs"]);
    // Offline too: the status holds and changes without a mount.
    assert_eq!(status_of(&node, "dfs", "dk3"), "to be emptied");
    node.ok(&["disk", "change", "dfs", "resume", "-d", "dk2;dk3"]);
    assert_eq!(status_of(&node, "dfs", "dk3"), "ready");
    let fsck = node.ok(&["fsck", "dfs"]);
    assert!(fsck.contains("is clean"), "{fsck}");
    node.ok(&["mount", "dfs"]);
    for (path, data) in &files {
        assert!(std::fs::read(path).unwrap() == *data, "{}", path.display());
    }
}

#[test]
fn add_disks_to_a_mounted_file_system_and_to_an_unmounted_one() {
    if !fuse_usable() {
        return;
    }
    let mut node = Node::new().start();
    let stanza = node.stanza("ad", 2, 256 * MIB);
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = node.create_fs("afs", &stanza, "mnt");
    node.ok(&["mount", "afs"]);
    let mut files = Vec::new();
    for i in 0..8u64 {
        let data = pattern((i as usize + 1) * 900_000, 50 + i);
        write_file(&mnt.join(format!("f{i}")), &data);
        files.push((mnt.join(format!("f{i}")), data));
    }
    let more = node.stanza("ax", 2, 256 * MIB);
    node.ok(&["nsd", "create", "-F", s(&more)]);

    // A writer keeps writing and checking files while the disks join and data moves.
    let writer = Writer::start(&mnt, 2_000_000, 2000);
    let out = node.ok(&["disk", "add", "afs", "-F", s(&more), "-r"]);
    writer.stop();
    assert!(out.contains("ax0, ax1 added to afs"), "{out}");
    assert!(
        out.contains("data blocks moved") && !out.contains(": 0 of"),
        "{out}"
    );
    assert_eq!(status_of(&node, "afs", "ax1"), "ready");
    for (path, data) in &files {
        assert!(std::fs::read(path).unwrap() == *data, "{}", path.display());
    }

    // Refused, naming the problem: an NSD that is taken, one that does not exist, a pool.
    let err = node.fails(&["disk", "add", "afs", "-F", s(&more)]);
    assert!(
        err.contains("ax0 already belongs to file system afs"),
        "{err}"
    );
    let ghost = node.path("ghost.stanza");
    std::fs::write(&ghost, "%nsd: nsd=ghost0\n").unwrap();
    let err = node.fails(&["disk", "add", "afs", "-F", s(&ghost)]);
    assert!(err.contains("NSD ghost0 does not exist"), "{err}");
    std::fs::write(&ghost, "%pool: pool=fast\n%nsd: nsd=ghost0\n").unwrap();
    let err = node.fails(&["disk", "add", "afs", "-F", s(&ghost)]);
    assert!(err.contains("not implemented yet"), "{err}");

    // Unmounted, the same command opens the file system for the change.
    node.ok(&["umount", "afs"]);
    let last = node.stanza("ay", 1, 256 * MIB);
    node.ok(&["nsd", "create", "-F", s(&last)]);
    node.ok(&["disk", "add", "afs", "-F", s(&last)]);
    let fsck = node.ok(&["fsck", "afs"]);
    assert!(fsck.contains("is clean"), "{fsck}");
    node.ok(&["mount", "afs"]);
    assert_eq!(status_of(&node, "afs", "ay0"), "ready");
    for (path, data) in &files {
        assert!(std::fs::read(path).unwrap() == *data, "{}", path.display());
    }
    // New files reach the newest disk.
    for i in 0..6u64 {
        write_file(&mnt.join(format!("n{i}")), &pattern(3_000_000, 70 + i));
    }
    let df = node.ok(&["df", "afs"]);
    assert!(df.contains("ay0"), "{df}");
}

/// `disk delete` [mmdeldisk] on a mounted file system while a writer keeps writing: the
/// disk that holds the recovery log and the allocation map is emptied and removed, its NSD
/// is free again (and joins back with `disk add`), refusals name the problem, the delete
/// also works unmounted, and fsck is clean.
#[test]
fn delete_disks_from_a_mounted_file_system_and_from_an_unmounted_one() {
    if !fuse_usable() {
        return;
    }
    let mut node = Node::new().start();
    let stanza = node.stanza("dd", 4, 256 * MIB);
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = node.create_fs("xfs1", &stanza, "mnt");
    node.ok(&["mount", "xfs1"]);
    let mut files = Vec::new();
    for i in 0..10u64 {
        let data = pattern((i as usize + 1) * 700_000, 300 + i);
        write_file(&mnt.join(format!("f{i}")), &data);
        files.push((mnt.join(format!("f{i}")), data));
    }

    let writer = Writer::start(&mnt, 1_500_000, 3000);
    let out = node.ok(&["disk", "delete", "xfs1", "dd0"]);
    writer.stop();
    assert!(out.contains("dd0 deleted from xfs1"), "{out}");
    assert!(out.contains("recovery log moved"), "{out}");
    let disks = node.ok(&["disk", "ls", "xfs1"]);
    assert!(!disks.contains("dd0"), "{disks}");
    let nsds = node.ok(&["nsd", "ls"]);
    let line = nsds.lines().find(|l| l.contains("dd0")).unwrap();
    assert!(line.contains("(free disk)"), "{nsds}");
    for (path, data) in &files {
        assert!(std::fs::read(path).unwrap() == *data, "{}", path.display());
    }

    // Refused, naming the problem.
    let err = node.fails(&["disk", "delete", "xfs1", "dd0"]);
    assert!(
        err.contains("dd0 is not a disk of file system xfs1"),
        "{err}"
    );
    let err = node.fails(&["disk", "delete", "xfs1", "dd1;dd2;dd3"]);
    assert!(err.contains("every disk"), "{err}");

    // Unmounted, the same command opens the file system for the change.
    node.ok(&["umount", "xfs1"]);
    let out = node.ok(&["disk", "delete", "xfs1", "dd3"]);
    assert!(out.contains("dd3 deleted from xfs1"), "{out}");
    let back = node.path("back.stanza");
    std::fs::write(&back, "%nsd: nsd=dd0\n").unwrap();
    node.ok(&["disk", "add", "xfs1", "-F", s(&back)]);
    let fsck = node.ok(&["fsck", "xfs1"]);
    assert!(fsck.contains("is clean"), "{fsck}");
    node.ok(&["mount", "xfs1"]);
    assert_eq!(status_of(&node, "xfs1", "dd0"), "ready");
    for (path, data) in &files {
        assert!(std::fs::read(path).unwrap() == *data, "{}", path.display());
    }
}

/// The line of `fs ls FS` that says `what`.
fn fs_ls_line(node: &Node, fs: &str, what: &str) -> String {
    let shown = node.ok(&["fs", "ls", fs]);
    shown
        .lines()
        .find(|l| l.contains(what))
        .unwrap_or_else(|| panic!("{shown}"))
        .to_owned()
}

#[test]
fn two_data_copies_survive_a_stopped_failure_group_and_a_lost_one() {
    if !fuse_usable() {
        return;
    }
    let mut node = Node::new().start();
    // Metadata on rm0 (failure group 3); data on rd1, rd2 (group 1) and rd3, rd4 (group 2).
    let (stanza, drives) = grouped_stanza(
        &node,
        "r",
        &[
            ("rm0", "metadataOnly", 3),
            ("rd1", "dataOnly", 1),
            ("rd2", "dataOnly", 1),
            ("rd3", "dataOnly", 2),
            ("rd4", "dataOnly", 2),
        ],
    );
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = node.create_fs_with("rfs", &stanza, "rmnt", &["-r", "2"]);
    let line = fs_ls_line(&node, "rfs", "Default number of data replicas");
    assert!(line.starts_with("-r ") && line.contains(" 2 "), "{line}");
    node.ok(&["mount", "rfs"]);
    let mut files = Vec::new();
    for i in 0..8u64 {
        let data = pattern((i as usize + 1) * 600_000, 300 + i);
        write_file(&mnt.join(format!("f{i}")), &data);
        files.push((mnt.join(format!("f{i}")), data));
    }

    // Group 1 stopped: reads come from group 2, writes go on with one copy.
    node.ok(&["disk", "change", "rfs", "stop", "-d", "rd1;rd2"]);
    assert_eq!(availability_of(&node, "rfs", "rd1"), "down");
    assert_eq!(availability_of(&node, "rfs", "rd3"), "up");
    // mmhealth says so, with what to do.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let out = node.run(&["health", "disk", "show", "rd1"]);
        let show = String::from_utf8_lossy(&out.stdout).to_string();
        if show.contains("FAILED") && show.contains("down: no I/O goes to it") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{show}");
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    let log = node.ok(&["health", "node", "eventlog"]);
    assert!(
        log.contains("disk_down") && log.contains("restripe rfs -r"),
        "{log}"
    );
    let writer = Writer::start(&mnt, 1_200_000, 3000);
    for i in 8..12u64 {
        let data = pattern(700_000 + i as usize, 300 + i);
        write_file(&mnt.join(format!("f{i}")), &data);
        files.push((mnt.join(format!("f{i}")), data));
    }
    writer.stop();
    // The stop is recorded in the descriptor: a remount keeps the disks down until they are
    // started [mmchdisk stop].
    node.ok(&["umount", "rfs"]);
    node.ok(&["mount", "rfs"]);
    assert_eq!(availability_of(&node, "rfs", "rd1"), "down");
    assert_eq!(availability_of(&node, "rfs", "rd2"), "down");
    let err = node.fails(&["disk", "change", "rfs", "stop", "-d", "rm0"]);
    assert!(err.contains("metadata"), "{err}");
    node.ok(&["disk", "change", "rfs", "start", "-d", "rd1;rd2"]);
    assert_eq!(availability_of(&node, "rfs", "rd1"), "up");
    let out = node.ok(&["restripe", "rfs", "-r"]);
    assert!(!out.contains(": 0 of"), "nothing re-replicated: {out}");
    let out = node.ok(&["restripe", "rfs", "-c"]);
    assert!(out.contains(": 0 of"), "damaged copies found: {out}");
    node.ok(&["umount", "rfs"]);
    let fsck = node.ok(&["fsck", "rfs"]);
    assert!(fsck.contains("is clean"), "{fsck}");

    // Group 2's drives are gone: the file system mounts with them down and every byte,
    // old or written while group 1 was stopped, reads from group 1.
    for dev in &drives[3..] {
        std::fs::remove_file(dev).unwrap();
    }
    node.ok(&["mount", "rfs"]);
    assert_eq!(availability_of(&node, "rfs", "rd3"), "down");
    for (path, data) in &files {
        assert!(std::fs::read(path).unwrap() == *data, "{}", path.display());
    }

    // Per file and for new files [mmchattr -r, mmchfs -r]: with group 2 gone, f0 is
    // ill-replicated; asking for one copy and restriping drops the lost ones.
    let f0 = s(&files[0].0).to_string();
    let shown = node.ok(&["file", "attr", "ls", &f0]);
    assert!(
        shown.contains("data replication:     2 (ill-replicated"),
        "{shown}"
    );
    node.ok(&["file", "attr", "set", "--replication", "1", &f0]);
    node.ok(&["restripe", "rfs", "-r"]);
    let shown = node.ok(&["file", "attr", "ls", &f0]);
    assert!(shown.contains("data replication:     1\n"), "{shown}");
    let err = node.fails(&["fs", "change", "rfs", "-r", "3"]);
    assert!(err.contains("-R 2"), "{err}");
    // One metadata disk: no second failure group for the metadata's copy.
    let err = node.fails(&["fs", "change", "rfs", "-m", "2"]);
    assert!(err.contains("one failure group"), "{err}");
    node.ok(&["fs", "change", "rfs", "-r", "1"]);
    let single = mnt.join("single");
    write_file(&single, &pattern(3_000_000, 77));
    let shown = node.ok(&["file", "attr", "ls", s(&single)]);
    assert!(shown.contains("data replication:     1\n"), "{shown}");
    let shown = node.ok(&["fs", "ls", "rfs"]);
    let line = shown
        .lines()
        .find(|l| l.contains("Default number of data replicas"))
        .unwrap();
    assert!(line.contains(" 1 "), "{line}");
}

/// `-m 2 -r 2` [mmcrfs]: metadata and data in failure groups 1 and 2, the descriptor's
/// third copy on a descOnly NSD in group 3. The drives of either group may go: the file
/// system mounts without them (`disk ls` shows them down), every file and name reads,
/// new files are written, and `restripe -r` once they are back gives everything its
/// second copy, after which the other group may go.
#[test]
fn metadata_and_data_copies_survive_the_loss_of_either_failure_group() {
    if !fuse_usable() {
        return;
    }
    let mut node = Node::new().start();
    let (stanza, drives) = grouped_stanza(
        &node,
        "m",
        &[
            ("mr0", "dataAndMetadata", 1),
            ("mr1", "dataAndMetadata", 1),
            ("mr2", "dataAndMetadata", 2),
            ("mr3", "dataAndMetadata", 2),
            ("mr4", "descOnly", 3),
        ],
    );
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = node.create_fs_with("mfs", &stanza, "mmnt", &["-m", "2", "-r", "2"]);
    let line = fs_ls_line(&node, "mfs", "Default number of metadata replicas");
    assert!(line.starts_with("-m ") && line.contains(" 2 "), "{line}");
    let err = node.fails(&["fs", "change", "mfs", "-m", "1"]);
    assert!(err.contains("not implemented"), "{err}");
    node.ok(&["mount", "mfs"]);
    let mut files = Vec::new();
    let write_set =
        |dir: &Path, tag: &str, seed: u64, files: &mut Vec<(std::path::PathBuf, Vec<u8>)>| {
            std::fs::create_dir_all(dir).unwrap();
            for i in 0..200u64 {
                let data = pattern(100 + (i as usize * 997) % 40_000, seed + i);
                let path = dir.join(format!("{tag}-{i:04}"));
                write_file(&path, &data);
                files.push((path, data));
            }
            let big = pattern(3_000_000, seed + 999);
            let path = dir.join(format!("{tag}-big"));
            write_file(&path, &big);
            files.push((path, big));
        };
    write_set(&mnt.join("a"), "a", 100, &mut files);
    node.ok(&["umount", "mfs"]);

    // Take a group's drives away (moved aside, so they can come back), and back.
    let aside = node.path("aside");
    std::fs::create_dir_all(&aside).unwrap();
    let away = |group: &[usize]| {
        for &i in group {
            std::fs::rename(&drives[i], aside.join(format!("d{i}"))).unwrap();
        }
    };
    let back = |group: &[usize]| {
        for &i in group {
            std::fs::rename(aside.join(format!("d{i}")), &drives[i]).unwrap();
        }
    };
    let check = |files: &[(std::path::PathBuf, Vec<u8>)]| {
        for (path, data) in files {
            assert!(std::fs::read(path).unwrap() == *data, "{}", path.display());
        }
    };

    away(&[2, 3]);
    node.ok(&["mount", "mfs"]);
    assert_eq!(availability_of(&node, "mfs", "mr2"), "down");
    check(&files);
    write_set(&mnt.join("b"), "b", 200, &mut files);
    node.ok(&["umount", "mfs"]);
    back(&[2, 3]);

    node.ok(&["mount", "mfs"]);
    check(&files);
    let out = node.ok(&["restripe", "mfs", "-r"]);
    assert!(out.contains("metadata"), "{out}");
    node.ok(&["umount", "mfs"]);
    let fsck = node.ok(&["fsck", "mfs"]);
    assert!(fsck.contains("is clean"), "{fsck}");

    away(&[0, 1]);
    node.ok(&["mount", "mfs"]);
    assert_eq!(availability_of(&node, "mfs", "mr0"), "down");
    check(&files);
    write_set(&mnt.join("c"), "c", 300, &mut files);
    check(&files);
    node.ok(&["umount", "mfs"]);
    back(&[0, 1]);
}
