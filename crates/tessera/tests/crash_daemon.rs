//! Crash loop through the whole stack: a workload writes (in large and in small pieces, which
//! the daemon gathers) and fsyncs files through the FUSE mount while the daemon is killed
//! with SIGKILL at a random moment; `tessera startup` must detach the dead mount and mount
//! again, every file the workload's ledger says is durable must read back identical, and an
//! offline fsck must find nothing wrong. 20 iterations.
//!
//! Ledger protocol (kept on the host file system, fsynced): `BEGIN name` before a file is
//! touched, `DONE name seed size` after its data and metadata are fsynced, `GONE name` after
//! an unlink and a directory fsync. A file whose last record is BEGIN may hold either version
//! but must read without an I/O error.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use common::*;

const ITERATIONS: u64 = 20;

struct Ledger(std::fs::File);

impl Ledger {
    fn record(&mut self, line: &str) {
        writeln!(self.0, "{line}").unwrap();
        self.0.sync_data().unwrap();
    }
}

/// Runs until the mount stops answering (the daemon was killed); never panics on I/O errors.
fn workload(mnt: &Path, ledger_path: &Path, iteration: u64) {
    let mut ledger = Ledger(
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(ledger_path)
            .unwrap(),
    );
    let mut rng = (iteration + 1).wrapping_mul(6_364_136_223_846_793_005) | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for step in 0u64.. {
        let name = format!("f{}", next() % 30);
        let path = mnt.join(&name);
        let seed = iteration * 1_000_000 + step;
        let size = match next() % 3 {
            0 => (next() % 4000) as usize,
            1 => (next() % 300_000) as usize,
            _ => (next() % 1_500_000) as usize,
        };
        ledger.record(&format!("BEGIN {name}"));
        let result = if next() % 6 == 0 {
            std::fs::remove_file(&path)
                .or_else(|e| {
                    if e.kind() == std::io::ErrorKind::NotFound {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })
                .and_then(|()| std::fs::File::open(mnt)?.sync_all())
                .map(|()| format!("GONE {name}"))
        } else if next() % 2 == 0 {
            // Atomic replace: write a temporary file, fsync it, rename over the target.
            let tmp = mnt.join(format!("{name}.tmp"));
            std::fs::File::create(&tmp)
                .and_then(|mut f| {
                    f.write_all(&pattern(size, seed))?;
                    f.sync_all()
                })
                .and_then(|()| std::fs::rename(&tmp, &path))
                .and_then(|()| std::fs::File::open(mnt)?.sync_all())
                .map(|()| format!("DONE {name} {seed} {size}"))
        } else {
            // Half the files in small pieces (up to 9,000 bytes), which the daemon gathers
            // in memory until the fsync: kills land among gathered writes too.
            let piece = if next() % 2 == 0 {
                1 + (next() % 9000) as usize
            } else {
                size.max(1)
            };
            std::fs::File::create(&path)
                .and_then(|mut f| {
                    for chunk in pattern(size, seed).chunks(piece) {
                        f.write_all(chunk)?;
                    }
                    f.sync_all()
                })
                .map(|()| format!("DONE {name} {seed} {size}"))
        };
        match result {
            Ok(line) => ledger.record(&line),
            Err(_) => return, // The daemon is gone.
        }
    }
}

enum Expect {
    Done(u64, usize),
    Gone,
    Unknown,
}

fn verify(mnt: &Path, ledger_path: &Path) -> usize {
    let text = std::fs::read_to_string(ledger_path).unwrap_or_default();
    let mut state = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        match f.as_slice() {
            ["BEGIN", n] => state.insert(n.to_string(), Expect::Unknown),
            ["GONE", n] => state.insert(n.to_string(), Expect::Gone),
            ["DONE", n, seed, size] => state.insert(
                n.to_string(),
                Expect::Done(seed.parse().unwrap(), size.parse().unwrap()),
            ),
            _ => None,
        };
    }
    let mut checked = 0;
    for (name, expect) in state {
        let path = mnt.join(&name);
        match expect {
            Expect::Done(seed, size) => {
                let data = std::fs::read(&path)
                    .unwrap_or_else(|e| panic!("{name}: fsynced file unreadable: {e}"));
                assert_eq!(data.len(), size, "{name}: size after crash");
                assert!(
                    data == pattern(size, seed),
                    "{name}: content differs after crash"
                );
                checked += 1;
            }
            Expect::Gone => assert!(!path.exists(), "{name}: deleted file came back"),
            Expect::Unknown => {
                if path.exists() {
                    std::fs::read(&path).unwrap_or_else(|e| panic!("{name}: unreadable: {e}"));
                }
            }
        }
    }
    checked
}

#[test]
fn kill_daemon_during_fsync_workload() {
    if !fuse_usable() {
        return;
    }
    let node = Node::new().start();
    let stanza = node.stanza("crash", 4, 256 << 20);
    crash_loop(node, &stanza, ITERATIONS);
}

/// The same loop with every NSD an 8+2p vdisk: each kill also leaves the declustered
/// array unclean, so every restart resynchronises its dirty regions before the file
/// system replays its log.
#[test]
fn kill_daemon_during_fsync_workload_on_vdisks() {
    if !fuse_usable() {
        return;
    }
    let node = Node::new().start();
    let stanza = node.vdisk_stanza("crashvd", 2, "1G", "256K");
    crash_loop(node, &stanza, ITERATIONS / 2);
}

fn crash_loop(mut node: Node, stanza: &Path, iterations: u64) {
    let stanza = stanza.to_path_buf();
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = node.path("mnt");
    node.mounts.push(mnt.clone());
    node.ok(&[
        "fs",
        "create",
        "fs1",
        "-F",
        s(&stanza),
        "-B",
        "256K",
        "-T",
        s(&mnt),
        "-A",
        "yes",
    ]);
    node.ok(&["mount", "fs1"]);
    let ledger = node.dir.path().join("ledger");
    let mut checked = 0;
    for iteration in 0..iterations {
        let (m, l) = (mnt.clone(), ledger.clone());
        let writer = std::thread::spawn(move || workload(&m, &l, iteration));
        std::thread::sleep(Duration::from_millis(200 + (iteration * 7919) % 600));
        let pid = node.daemon_pid();
        // SAFETY: plain kill(2) of the daemon we started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
        writer.join().expect("workload thread");
        node.ok(&["startup"]);
        checked += verify(&mnt, &ledger);
        node.ok(&["umount", "fs1"]);
        let report = node.ok(&["fsck", "fs1", "-n"]);
        assert!(
            report.contains("is clean"),
            "fsck after crash {iteration}: {report}"
        );
        node.ok(&["mount", "fs1"]);
    }
    eprintln!("{iterations} daemon kills, {checked} durable files verified");
    assert!(
        checked >= iterations as usize,
        "the workload made too little progress to test"
    );
    node.ok(&["shutdown"]);
}
