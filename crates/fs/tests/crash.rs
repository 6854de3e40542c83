//! Crash consistency: a child process runs a mixed workload that fsyncs and records in a
//! ledger what it knows to be durable; the parent kills it with SIGKILL at a random moment,
//! mounts (replaying the log), checks every file the ledger says is durable, and runs fsck.
//!
//! `crash_loop` kills the process only: every write it issued reaches the files. In
//! `power_loss_loop` the child's drives have volatile write caches (`SimDrive`), so the kill
//! is also a power loss: writes not flushed are lost or kept at random, sector by sector
//! (`TESSERA_POWERLOSS_ITERATIONS`, default 20).
//!
//! The workload also suspends a disk now and then, restripes (moving blocks off it, or
//! evening out the others) and resumes it, so kills land in block moves too.
//!
//! `replicated_crash_loop` runs it on a file system with two data copies (`-r 2`, data
//! disks in three failure groups), whose workload also stops a data disk now and then
//! (writes meanwhile drop its copies), starts it again and restores the copies with
//! `restripe -r`; after each kill every durable file must read back from each failure
//! group alone once `restripe -r` has run. `metadata_replicated_crash_loop` does the same
//! with two copies of the metadata too (`-m 2 -r 2`, every disk holding data and metadata
//! in its own failure group): any disk may be stopped, and after each kill the file
//! system is mounted without each disk in turn and every durable file read back. Both run
//! with power losses too (`replicated_power_loss_loop`, `metadata_replicated_power_loss_loop`).
//!
//! The ledger protocol: before touching a file the child durably records `BEGIN name`; after
//! the change and its fsync it records `DONE name seed size` or `GONE name`. A file whose last
//! record is DONE must read back exactly; GONE must not exist; BEGIN may hold either version
//! but must read without error.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use tessera_drive::VolatileCacheConfig;
use tessera_fs::{FileSystem, ROOT_INO};
use tessera_testkit::SimDrive;

const ITERATIONS: usize = 20;

struct Ledger(std::fs::File);

impl Ledger {
    fn record(&mut self, line: &str) {
        writeln!(self.0, "{line}").unwrap();
        self.0.sync_data().unwrap();
    }
}

/// The workload run by the child; it never returns normally (it is killed).
#[test]
#[ignore = "entry point of the crash child; run by crash_loop"]
fn crash_child() {
    let Ok(dir) = std::env::var("TESSERA_CRASH_DIR") else {
        return;
    };
    let t = TestDisks::adopt(std::path::Path::new(&dir));
    let iteration: u64 = std::env::var("TESSERA_CRASH_ITER")
        .unwrap()
        .parse()
        .unwrap();
    let mut disks = t.reopen();
    if std::env::var_os("TESSERA_CRASH_VOLATILE").is_some() {
        for (i, (_, dev)) in disks.iter_mut().enumerate() {
            let cache = VolatileCacheConfig {
                seed: iteration * 16 + i as u64,
                capacity_bytes: 16 << 20,
                ..VolatileCacheConfig::default()
            };
            *dev = Arc::new(SimDrive::with_cache(dev.clone(), Arc::default(), cache));
        }
    }
    let disk_count = disks.len();
    let replicated = std::env::var_os("TESSERA_CRASH_REPLICATED").is_some();
    let metadata_copies = std::env::var_os("TESSERA_CRASH_METADATA_COPIES").is_some();
    let gather = std::env::var_os("TESSERA_CRASH_GATHER").is_some();
    let fs = FileSystem::mount(disks).unwrap();
    // Small writes gathered in memory, as a one-node mount gathers them: written in pieces
    // of up to 9,000 bytes, so that kills land among gathered runs, whole blocks written
    // from them, and the fsyncs that write the rest.
    fs.set_write_behind(gather);
    // A tiny metadata cache: the crash lands among evictions and re-reads of pages.
    fs.set_metadata_cache_pages(4);
    fs.set_inode_cache(8);
    fs.set_stat_cache(4);
    // Every other iteration gives freed blocks back to the drives (TRIM): the crash also
    // lands between a durable delete, the discard and the blocks' reuse.
    if iteration.is_multiple_of(2) {
        for disk in 0..disk_count {
            fs.set_discard(u16::try_from(disk).unwrap(), true).unwrap();
        }
    }
    // A kill between a suspension and its resume leaves the disk suspended (the status is
    // durable): every run starts with all disks ready.
    let all: Vec<String> = (0..disk_count).map(|d| format!("nsd{d}")).collect();
    fs.set_disk_status(&all, tessera_fs::DiskStatus::Ready)
        .unwrap();
    let mut ledger = Ledger(
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(format!("{dir}/ledger"))
            .unwrap(),
    );
    let mut rng = iteration.wrapping_mul(6_364_136_223_846_793_005) | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // Whether every block has all its copies: not known after a kill.
    let mut whole = false;
    for step in 0u64.. {
        if next() % 8 == 0 {
            // Checkpoints mid-run, so kills land in them too: pages, allocation-map chunks
            // and the descriptor half written.
            fs.checkpoint().unwrap();
        }
        if next() % 12 == 0 {
            // A disk suspended and its data moved off (or all disks rebalanced), resumed
            // after: kills land in block moves and descriptor writes of status changes.
            // nsd0 is the only metadata disk with one metadata copy and data copies.
            let first = u64::from(replicated && !metadata_copies);
            let disk = vec![format!(
                "nsd{}",
                first + next() % (disk_count as u64 - first)
            )];
            if replicated && !fs.disk_availability().iter().all(|(_, up)| *up) {
                continue;
            }
            let stop = std::sync::atomic::AtomicBool::new(false);
            let mode = if next() % 2 == 0 {
                tessera_fs::restripe::RestripeMode::Migrate
            } else {
                tessera_fs::restripe::RestripeMode::Balance
            };
            fs.set_disk_status(&disk, tessera_fs::DiskStatus::Suspended)
                .unwrap();
            if let Err(e) = fs.restripe(mode, &stop, &mut |_| {}) {
                panic!(
                    "restripe {mode:?} with {disk:?} suspended: {e}; disks: {:#?}",
                    fs.df().unwrap().disks
                );
            }
            fs.set_disk_status(&disk, tessera_fs::DiskStatus::Ready)
                .unwrap();
            // Emptying a disk drops a copy that has no other failure group to move to
            // (ill-replicated until `restripe -r`).
            whole = false;
        }
        if replicated && next() % 10 == 0 {
            // A data disk (1 to 3; disk 0 holds the metadata, unless it has two copies too)
            // stopped for a while, then started with its copies restored: kills land in
            // writes that drop copies, in checkpoints and commits with a metadata disk
            // down, and in the restripe's copies.
            let first = u64::from(!metadata_copies);
            let disk = format!("nsd{}", first + next() % (disk_count as u64 - first));
            if fs.disk_availability().iter().all(|(_, up)| *up) {
                // A block written while a disk was down has one copy until `restripe -r`
                // (which a kill may have cut short); stopping the disk that holds it makes
                // the block unavailable (EIO), as in GPFS. An administrator restripes
                // first; so does this loop.
                if !whole {
                    let stop = std::sync::atomic::AtomicBool::new(false);
                    let mode = tessera_fs::restripe::RestripeMode::Replicate;
                    fs.restripe(mode, &stop, &mut |_| {}).unwrap();
                }
                fs.stop_disks(&[disk]).unwrap();
                whole = false;
            } else {
                let all: Vec<String> = (first as usize..disk_count)
                    .map(|d| format!("nsd{d}"))
                    .collect();
                fs.start_disks(&all).unwrap();
                let stop = std::sync::atomic::AtomicBool::new(false);
                let mode = tessera_fs::restripe::RestripeMode::Replicate;
                fs.restripe(mode, &stop, &mut |_| {}).unwrap();
                whole = true;
            }
        }
        let name = format!("f{}", next() % 40);
        let seed = iteration * 1_000_000 + step;
        let size = match next() % 4 {
            0 => (next() % 3000) as usize,
            1 => (next() % 100_000) as usize,
            2 => (next() % 700_000) as usize,
            _ => (next() % 2_000_000) as usize,
        };
        // Synchronous writes (O_DIRECT, O_SYNC) instead of writes and fsync for some files:
        // their data and log records go to the drives written through (FUA), with no
        // flush, and the file counts as durable when the last write returns.
        let sync = next() % 3 == 0;
        ledger.record(&format!("BEGIN {name}"));
        let existing = fs.lookup(ROOT_INO, name.as_bytes()).ok();
        match (next() % 5, existing) {
            (0, Some(_)) => {
                fs.remove(ROOT_INO, name.as_bytes(), false).unwrap();
                fs.sync().unwrap();
                ledger.record(&format!("GONE {name}"));
                continue;
            }
            (1, Some(a)) if a.size > 0 => {
                // Same-size rewrite in place: exercises overwrite intents.
                let data = pattern(a.size as usize, seed);
                let piece = if gather {
                    1 + next() as usize % 9000
                } else {
                    data.len()
                };
                write_file(&fs, a.ino, &data, sync, piece);
                if !sync {
                    fs.fsync(a.ino).unwrap();
                }
                ledger.record(&format!("DONE {name} {seed} {}", a.size));
                continue;
            }
            (_, Some(a)) => {
                fs.truncate(a.ino, 0).unwrap();
                let piece = if gather {
                    1 + next() as usize % 9000
                } else {
                    200_000
                };
                write_file(&fs, a.ino, &pattern(size, seed), sync, piece);
            }
            (_, None) => {
                let a = create_file(&fs, ROOT_INO, name.as_bytes());
                let piece = if gather {
                    1 + next() as usize % 9000
                } else {
                    200_000
                };
                write_file(&fs, a.ino, &pattern(size, seed), sync, piece);
            }
        }
        let ino = fs.lookup(ROOT_INO, name.as_bytes()).unwrap().ino;
        if !sync || size == 0 {
            fs.fsync(ino).unwrap();
        }
        ledger.record(&format!("DONE {name} {seed} {size}"));
    }
}

fn write_file(fs: &FileSystem, ino: u64, data: &[u8], sync: bool, piece: usize) {
    for (i, chunk) in data.chunks(piece.max(1)).enumerate() {
        fs.write(ino, (i * piece) as u64, chunk, sync).unwrap();
    }
}

#[derive(Debug)]
enum Expect {
    Done(u64, usize),
    Gone,
    Unknown,
}

fn read_ledger(dir: &std::path::Path) -> HashMap<String, Expect> {
    let text = std::fs::read_to_string(dir.join("ledger")).unwrap_or_default();
    let mut state = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        match f.as_slice() {
            ["BEGIN", name] => state.insert(name.to_string(), Expect::Unknown),
            ["DONE", name, seed, size] => state.insert(
                name.to_string(),
                Expect::Done(seed.parse().unwrap(), size.parse().unwrap()),
            ),
            ["GONE", name] => state.insert(name.to_string(), Expect::Gone),
            _ => None, // A torn last line: the child died while writing it.
        };
    }
    state
}

fn verify(t: &TestDisks, copies: Copies) -> usize {
    // Straight after the kill: the stored allocation map with the log replayed over it must
    // be the map the metadata references.
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(
        report.is_clean(),
        "fsck after the kill: {:?}",
        report.problems
    );
    let fs = FileSystem::mount(t.reopen()).unwrap();
    assert_eq!(
        fs.allocation_map_rebuilt(),
        None,
        "mount reads the stored allocation map"
    );
    // A disk the workload stopped stays stopped across the kill (the descriptor says so):
    // started, as an administrator would, before the checks that stop disks themselves.
    let stopped: Vec<String> = fs
        .disk_availability()
        .into_iter()
        .filter(|(_, up)| !up)
        .map(|(name, _)| name)
        .collect();
    if !stopped.is_empty() {
        fs.start_disks(&stopped).unwrap();
    }
    fs.set_metadata_cache_pages(4);
    fs.set_inode_cache(8);
    fs.set_stat_cache(4);
    let mut checked = 0;
    for (name, expect) in read_ledger(t.dir.path()) {
        let found = fs.lookup(ROOT_INO, name.as_bytes());
        match expect {
            Expect::Done(seed, size) => {
                let a = found.unwrap_or_else(|e| panic!("{name}: durable file missing: {e}"));
                let data = fs.read(a.ino, 0, (size + 1) as u32).unwrap();
                assert_eq!(data.len(), size, "{name}: size");
                assert!(data == pattern(size, seed), "{name}: content differs");
                checked += 1;
            }
            Expect::Gone => assert!(found.is_err(), "{name}: deleted file is back"),
            Expect::Unknown => {
                if let Ok(a) = found {
                    fs.read(a.ino, 0, a.size as u32).unwrap();
                }
            }
        }
    }
    if copies == Copies::Data {
        // Every durable file has both copies once restripe -r has run: each failure group
        // of data alone reads it back.
        let stop = std::sync::atomic::AtomicBool::new(false);
        let mode = tessera_fs::restripe::RestripeMode::Replicate;
        fs.restripe(mode, &stop, &mut |_| {}).unwrap();
        for disk in 1..4 {
            let name = vec![format!("nsd{disk}")];
            fs.stop_disks(&name).unwrap();
            for (file, expect) in read_ledger(t.dir.path()) {
                if let Expect::Done(seed, size) = expect {
                    let a = fs.lookup(ROOT_INO, file.as_bytes()).unwrap();
                    let data = fs
                        .read(a.ino, 0, (size + 1) as u32)
                        .unwrap_or_else(|e| panic!("{file} with nsd{disk} stopped: {e}"));
                    assert!(data == pattern(size, seed), "{file} without nsd{disk}");
                }
            }
            fs.start_disks(&name).unwrap();
        }
    }
    if copies == Copies::All {
        // After restripe -r every piece of data and metadata has its two copies: the file
        // system mounts without any one disk and reads every durable file.
        let stop = std::sync::atomic::AtomicBool::new(false);
        let mode = tessera_fs::restripe::RestripeMode::Replicate;
        fs.restripe(mode, &stop, &mut |_| {}).unwrap();
        fs.unmount().unwrap();
        drop(fs);
        for gone in 0..4 {
            let disks: Vec<_> = t
                .reopen()
                .into_iter()
                .enumerate()
                .filter(|(i, _)| *i != gone)
                .map(|(_, d)| d)
                .collect();
            let fs =
                FileSystem::mount(disks).unwrap_or_else(|e| panic!("mount without nsd{gone}: {e}"));
            fs.set_metadata_cache_pages(4);
            for (file, expect) in read_ledger(t.dir.path()) {
                if let Expect::Done(seed, size) = expect {
                    let a = fs
                        .lookup(ROOT_INO, file.as_bytes())
                        .unwrap_or_else(|e| panic!("{file} without nsd{gone}: {e}"));
                    let data = fs
                        .read(a.ino, 0, (size + 1) as u32)
                        .unwrap_or_else(|e| panic!("{file} without nsd{gone}: {e}"));
                    assert!(data == pattern(size, seed), "{file} without nsd{gone}");
                }
            }
            fs.unmount().unwrap();
            drop(fs);
            // Back whole: the log copy that missed this mount's records is made current
            // (without it, the next mount without the other copy's disk is refused).
            FileSystem::mount(t.reopen()).unwrap().unmount().unwrap();
        }
    } else {
        fs.unmount().unwrap();
    }
    let report = tessera_fs::fsck(t.reopen(), false).unwrap();
    assert!(report.is_clean(), "fsck: {:?}", report.problems);
    checked
}

#[test]
fn crash_loop() {
    let iterations = tessera_testkit::iterations("TESSERA_CRASH_ITERATIONS", ITERATIONS);
    kill_loop(iterations, false);
}

#[test]
fn power_loss_loop() {
    let iterations = tessera_testkit::iterations("TESSERA_POWERLOSS_ITERATIONS", ITERATIONS);
    kill_loop(iterations, true);
}

#[test]
fn replicated_crash_loop() {
    let iterations = tessera_testkit::iterations("TESSERA_CRASH_ITERATIONS", ITERATIONS);
    kill_loop_on(iterations, false, Copies::Data);
}

#[test]
fn metadata_replicated_crash_loop() {
    let iterations = tessera_testkit::iterations("TESSERA_CRASH_ITERATIONS", ITERATIONS);
    kill_loop_on(iterations, false, Copies::All);
}

/// Power losses under two data copies: a copy written before `disk change stop` must be
/// flushed by the stop, since commits skip a disk that is down (before the fix, a durable
/// file's copy on a stopped disk could be stale after the power loss).
#[test]
fn replicated_power_loss_loop() {
    let iterations = tessera_testkit::iterations("TESSERA_POWERLOSS_ITERATIONS", ITERATIONS);
    kill_loop_on(iterations, true, Copies::Data);
}

#[test]
fn metadata_replicated_power_loss_loop() {
    let iterations = tessera_testkit::iterations("TESSERA_POWERLOSS_ITERATIONS", ITERATIONS);
    kill_loop_on(iterations, true, Copies::All);
}

/// Kills with small writes gathered in memory (write-behind): every file the ledger calls
/// durable was fsynced (or written synchronously) after its gathered pieces.
#[test]
fn gathered_crash_loop() {
    let iterations = tessera_testkit::iterations("TESSERA_CRASH_ITERATIONS", ITERATIONS);
    kill_loop_with(iterations, false, Copies::Nothing, true);
}

#[test]
fn gathered_power_loss_loop() {
    let iterations = tessera_testkit::iterations("TESSERA_POWERLOSS_ITERATIONS", ITERATIONS);
    kill_loop_with(iterations, true, Copies::Nothing, true);
}

/// What has two copies in the file system a loop runs on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Copies {
    Nothing,
    /// `-r 2`: nsd0 holds the metadata, nsd1 to nsd3 the data in three failure groups.
    Data,
    /// `-m 2 -r 2`: nsd0 to nsd3 hold data and metadata, each in its own failure group.
    All,
}

/// Runs the child `iterations` times, killing it at a random moment; with `volatile`, its
/// drives have volatile write caches and the kill is a power loss.
fn kill_loop(iterations: usize, volatile: bool) {
    kill_loop_on(iterations, volatile, Copies::Nothing);
}

/// [`kill_loop`] on a file system with `copies`.
fn kill_loop_on(iterations: usize, volatile: bool, copies: Copies) {
    kill_loop_with(iterations, volatile, copies, false);
}

/// [`kill_loop_on`], the child gathering small writes if `gather`.
fn kill_loop_with(iterations: usize, volatile: bool, copies: Copies, gather: bool) {
    let mut t = make_disks(4, 128 << 20);
    let replicated_opts = tessera_fs::FormatOptions {
        max_data_replicas: 2,
        replication: tessera_fs::Replication {
            data: 2,
            strict: tessera_fs::StrictReplication::WhenPossible,
        },
        ..small_opts()
    };
    match copies {
        Copies::Nothing => format_fs(&t, &small_opts()),
        Copies::Data => format_fs_with(&t, &replicated_opts, |i| {
            if i == 0 {
                (tessera_nsd::DiskUsage::MetadataOnly, "system")
            } else {
                (tessera_nsd::DiskUsage::DataOnly, "system")
            }
        }),
        // Each disk in its own failure group (`format_fs_with`).
        Copies::All => format_fs(
            &t,
            &tessera_fs::FormatOptions {
                metadata_replicas: 2,
                ..replicated_opts
            },
        ),
    }
    let replicated = copies != Copies::Nothing;
    t.close_drives();
    let exe = std::env::current_exe().unwrap();
    let mut total_checked = 0;
    for iteration in 0..iterations {
        let mut child = Command::new(&exe);
        child
            .args(["--exact", "crash_child", "--ignored", "--nocapture"])
            .env("TESSERA_CRASH_DIR", t.dir.path())
            .env("TESSERA_CRASH_ITER", iteration.to_string())
            .stdout(std::process::Stdio::null());
        if volatile {
            child.env("TESSERA_CRASH_VOLATILE", "1");
        }
        if replicated {
            child.env("TESSERA_CRASH_REPLICATED", "1");
        }
        if copies == Copies::All {
            child.env("TESSERA_CRASH_METADATA_COPIES", "1");
        }
        if gather {
            child.env("TESSERA_CRASH_GATHER", "1");
        }
        let mut child = child.spawn().unwrap();
        let delay_ms = 150 + (iteration as u64 * 7919) % 450;
        std::thread::sleep(Duration::from_millis(delay_ms));
        if let Ok(Some(status)) = child.try_wait() {
            panic!("crash child exited on its own: {status}");
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        total_checked += verify(&t, copies);
    }
    let what = if volatile { "power losses" } else { "crashes" };
    eprintln!("{iterations} {what}, {total_checked} durable files verified");
    assert!(
        total_checked > iterations,
        "the workload made too little progress to test"
    );
}
