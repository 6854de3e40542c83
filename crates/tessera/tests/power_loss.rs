//! Power loss through the whole stack: every NSD (or every pdisk of a declustered array) is
//! an NVMe/TCP namespace of a drive server with a volatile write cache, so a write the
//! drive acknowledged is lost when the drive server is killed unless the host flushed it,
//! and a write that was not flushed may survive in part (some sectors destaged, others
//! not). An fsync-heavy workload runs through the FUSE mount (whole-file writes, atomic
//! replaces, in-place overwrites and appends at unaligned offsets, unlinks) while the drive
//! servers and the daemon are killed with SIGKILL at a random moment, in random order.
//! Drive servers and daemon come back; every byte the ledger says was fsynced must read
//! back, files deleted durably must stay deleted, and offline fsck must find nothing wrong.
//!
//! `TESSERA_POWERLOSS_ITERATIONS` sets the number of power losses (default 20 on plain
//! NSDs, half of it on vdisks); `TESSERA_POWERLOSS_SEED` replays a run (the seed is
//! printed).
//!
//! Ledger (on the host file system, fsynced): `BEGIN name` before an operation on a file;
//! then `DONE name seed size` (whole content written), `W name seed offset length` (a range
//! overwritten or appended) or `GONE name`, once the operation is fsynced. A file whose last
//! record is BEGIN must read without error; the check then deletes it so the next round
//! starts from known contents.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use common::*;

const NS_BYTES: u64 = 256 << 20;
/// Cache per namespace: small enough that a run also destages for room.
const CACHE_MIB: u32 = 16;

fn iterations() -> u64 {
    tessera_testkit::iterations("TESSERA_POWERLOSS_ITERATIONS", 20) as u64
}

fn run_seed() -> u64 {
    let seed = std::env::var("TESSERA_POWERLOSS_SEED")
        .ok()
        .map(|v| v.parse().expect("TESSERA_POWERLOSS_SEED: a number"))
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("power-loss run seed {seed} (TESSERA_POWERLOSS_SEED={seed} replays it)");
    seed
}

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A `tessera drive-server` whose namespaces have volatile write caches; SIGKILL is its
/// power loss.
struct DriveServer {
    child: Option<Child>,
}

impl DriveServer {
    fn start(config: &Path) -> DriveServer {
        let child = spawn_drive_server(config);
        DriveServer { child: Some(child) }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for DriveServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An enclosure: `drives` namespace files behind one drive server on `port`.
struct Enclosure {
    nqn: String,
    port: u16,
    drives: Vec<PathBuf>,
    config: PathBuf,
}

impl Enclosure {
    fn new(node: &Node, j: usize, drives: usize) -> Enclosure {
        Enclosure {
            nqn: format!("nqn.2026-11.io.tessera:pl-jbof{j}"),
            port: free_port(),
            drives: (1..=drives)
                .map(|i| node.drive(&format!("pl{j}-slot{i}"), NS_BYTES))
                .collect(),
            config: node.path(&format!("pl-jbof{j}.json")),
        }
    }

    /// Writes the configuration with cache seeds of this power cycle and starts the server.
    fn power_on(&self, hostnqn: &str, cycle_seed: u64) -> DriveServer {
        let namespaces: Vec<String> = self
            .drives
            .iter()
            .enumerate()
            .map(|(i, d)| {
                format!(
                    r#"{{"nsid":{},"device":{{"path":"{}"}},"volatile_write_cache":{{"seed":{},"capacity_mib":{CACHE_MIB}}}}}"#,
                    i + 1,
                    d.display(),
                    cycle_seed.wrapping_add(i as u64)
                )
            })
            .collect();
        let text = format!(
            r#"{{"hosts":[{{"nqn":"{hostnqn}"}}],"ports":[{{"portid":1,"addr":{{"trtype":"tcp","adrfam":"ipv4","traddr":"127.0.0.1","trsvcid":"{}"}},"subsystems":["{}"]}}],"subsystems":[{{"nqn":"{}","allowed_hosts":["{hostnqn}"],"namespaces":[{}]}}]}}"#,
            self.port,
            self.nqn,
            self.nqn,
            namespaces.join(",")
        );
        std::fs::write(&self.config, text).expect("write drive-server config");
        DriveServer::start(&self.config)
    }
}

struct Ledger(std::fs::File);

impl Ledger {
    fn open(path: &Path) -> Ledger {
        Ledger(
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(path)
                .expect("ledger"),
        )
    }
    fn record(&mut self, line: &str) {
        writeln!(self.0, "{line}").unwrap();
        self.0.sync_data().unwrap();
    }
}

/// One fsynced operation on `name`; returns its ledger record.
fn operation(mnt: &Path, name: &str, seed: u64, rng: &mut Rng) -> std::io::Result<String> {
    let path = mnt.join(name);
    let size = match rng.below(3) {
        0 => rng.below(6000),
        1 => rng.below(200_000),
        _ => rng.below(700_000),
    } as usize;
    let exists = path.exists();
    match rng.below(8) {
        0 => {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            std::fs::File::open(mnt)?.sync_all()?;
            Ok(format!("GONE {name}"))
        }
        1 | 2 => {
            let tmp = mnt.join(format!("{name}.tmp"));
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&pattern(size, seed))?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(mnt)?.sync_all()?;
            Ok(format!("DONE {name} {seed} {size}"))
        }
        3..=5 if exists => {
            // In place: overwrite inside the file or append past its end, at any byte.
            let f = std::fs::OpenOptions::new().write(true).open(&path)?;
            let len = f.metadata()?.len();
            let at = rng.below(len + 1 + len / 4);
            let most = if rng.below(2) == 0 { 9000 } else { 300_000 };
            let n = 1 + rng.below(most);
            f.write_all_at(&pattern(n as usize, seed), at)?;
            f.sync_data()?;
            Ok(format!("W {name} {seed} {at} {n}"))
        }
        _ => {
            let mut f = std::fs::File::create(&path)?;
            f.write_all(&pattern(size, seed))?;
            f.sync_all()?;
            Ok(format!("DONE {name} {seed} {size}"))
        }
    }
}

/// Runs until the mount stops answering (the daemon or its drives lost power).
fn workload(mnt: &Path, ledger_path: &Path, seed: u64) {
    let mut ledger = Ledger::open(ledger_path);
    let mut rng = Rng::new(seed);
    for step in 0u64.. {
        let name = format!("f{}", rng.below(24));
        ledger.record(&format!("BEGIN {name}"));
        match operation(
            mnt,
            &name,
            seed.wrapping_mul(1000).wrapping_add(step),
            &mut rng,
        ) {
            Ok(line) => ledger.record(&line),
            Err(_) => return,
        }
    }
}

enum Expect {
    Bytes(Vec<u8>),
    Gone,
    Unknown,
}

fn expected(ledger_path: &Path) -> HashMap<String, Expect> {
    let text = std::fs::read_to_string(ledger_path).unwrap_or_default();
    let mut state: HashMap<String, Expect> = HashMap::new();
    // Content before the pending operation, for a W record that completes it.
    let mut before: HashMap<String, Vec<u8>> = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let num = |i: usize| -> u64 { f[i].parse().expect("ledger number") };
        let name = f[1].to_string();
        match f[0] {
            "BEGIN" => {
                if let Some(Expect::Bytes(b)) = state.insert(name.clone(), Expect::Unknown) {
                    before.insert(name, b);
                } else {
                    before.remove(&name);
                }
            }
            "GONE" => {
                state.insert(name, Expect::Gone);
            }
            "DONE" => {
                let bytes = pattern(num(3) as usize, num(2));
                state.insert(name, Expect::Bytes(bytes));
            }
            "W" => {
                let mut b = before.remove(&name).expect("W on a file of known content");
                let (at, n) = (num(3) as usize, num(4) as usize);
                if b.len() < at + n {
                    b.resize(at + n, 0);
                }
                b[at..at + n].copy_from_slice(&pattern(n, num(2)));
                state.insert(name, Expect::Bytes(b));
            }
            other => panic!("ledger: unknown record {other}"),
        }
    }
    state
}

/// Checks every file against the ledger; returns the bytes verified. Files left in an
/// unknown state are removed (and that recorded) so that later W records apply to known
/// contents.
fn verify(mnt: &Path, ledger_path: &Path, round: u64) -> u64 {
    let mut ledger = Ledger::open(ledger_path);
    let mut bytes = 0;
    for (name, expect) in expected(ledger_path) {
        let path = mnt.join(&name);
        match expect {
            Expect::Bytes(want) => {
                let got = std::fs::read(&path).unwrap_or_else(|e| {
                    panic!("round {round}: {name}: fsynced file unreadable: {e}")
                });
                assert_eq!(got.len(), want.len(), "round {round}: {name}: size");
                if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
                    panic!(
                        "round {round}: {name}: fsynced byte {i} differs after power loss \
                         (sector {}, {} bytes)",
                        i / 4096,
                        got.len()
                    );
                }
                bytes += got.len() as u64;
            }
            Expect::Gone => assert!(
                !path.exists(),
                "round {round}: {name}: durably deleted file came back"
            ),
            Expect::Unknown => {
                if path.exists() {
                    std::fs::read(&path)
                        .unwrap_or_else(|e| panic!("round {round}: {name}: unreadable: {e}"));
                    std::fs::remove_file(&path).expect("remove");
                }
                let _ = std::fs::remove_file(mnt.join(format!("{name}.tmp")));
                std::fs::File::open(mnt).unwrap().sync_all().unwrap();
                ledger.record(&format!("GONE {name}"));
            }
        }
    }
    bytes
}

/// Connects the node to every enclosure: the namespaces of the j-th are `nvme{j}n*`.
fn connect(node: &Node, enclosures: &[Enclosure]) {
    for e in enclosures {
        // Paths keep reconnecting while a drive server is down (-l), so after the power
        // comes back the restarted daemon finds them as they were.
        node.ok(&[
            "nvme",
            "connect",
            "-t",
            "tcp",
            "-n",
            &e.nqn,
            "-a",
            "127.0.0.1",
            "-s",
            &e.port.to_string(),
            "-l",
            "60",
        ]);
    }
}

/// Starts every enclosure's drive server with cache seeds of this power cycle.
fn power_on(enclosures: &[Enclosure], hostnqn: &str, cycle_seed: u64) -> Vec<DriveServer> {
    enclosures
        .iter()
        .enumerate()
        .map(|(j, e)| e.power_on(hostnqn, cycle_seed.wrapping_add(j as u64 * 100)))
        .collect()
}

fn wait_gone(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    // SAFETY: signal 0 only checks that the process exists.
    while unsafe { libc::kill(pid, 0) } == 0 {
        assert!(Instant::now() < deadline, "daemon {pid} did not die");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills the drive servers and the daemon, in random order, a few milliseconds apart.
fn power_loss(node: &Node, servers: &mut [DriveServer], rng: &mut Rng) {
    let pid = node.daemon_pid();
    let kill_daemon = || {
        // SAFETY: kill(2) of the daemon this test started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    };
    let daemon_first = rng.below(2) == 0;
    if daemon_first {
        kill_daemon();
    }
    for server in servers.iter_mut() {
        server.kill();
    }
    if !daemon_first {
        std::thread::sleep(Duration::from_millis(rng.below(50)));
        kill_daemon();
    }
    wait_gone(pid);
}

/// `tessera startup`, allowing a loaded machine more than its 10 s for the array's
/// resynchronisation and the log replay: the daemon must then come up by itself (its log
/// says "daemon active"), which is reported, not failed.
fn start_daemon(node: &Node, round: u64) {
    let log = node.home().join("log/daemon.log");
    let active = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("daemon active")
            .count()
    };
    let before = active();
    let started = Instant::now();
    let out = node.run(&["startup"]);
    if out.status.success() {
        return;
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("did not answer"),
        "round {round}: startup failed: {err}"
    );
    while active() == before {
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "round {round}: the daemon did not come up in 180 s: {err}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "round {round}: the daemon took {:.1?} to start (resync and replay)",
        started.elapsed()
    );
}

/// Creates fs1 on `stanza` and runs `rounds` power losses under the workload.
fn power_loss_loop(
    mut node: Node,
    enclosures: &[Enclosure],
    mut servers: Vec<DriveServer>,
    stanza: &Path,
    rounds: u64,
) {
    let hostnqn = node.ok(&["nvme", "show-hostnqn"]).trim().to_string();
    let mut rng = Rng::new(run_seed());
    node.ok(&["nsd", "create", "-F", s(stanza)]);
    let mnt = node.path("mnt");
    node.mounts.push(mnt.clone());
    node.ok(&[
        "fs",
        "create",
        "fs1",
        "-F",
        s(stanza),
        "-B",
        "256K",
        "-T",
        s(&mnt),
        "-A",
        "yes",
    ]);
    node.ok(&["mount", "fs1"]);
    let ledger = node.path("ledger");
    let (mut verified, started) = (0u64, Instant::now());
    for round in 0..rounds {
        let (m, l, w) = (mnt.clone(), ledger.clone(), rng.next());
        let writer = std::thread::spawn(move || workload(&m, &l, w));
        std::thread::sleep(Duration::from_millis(150 + rng.below(900)));
        power_loss(&node, &mut servers, &mut rng);
        writer.join().expect("workload thread");
        servers = power_on(enclosures, &hostnqn, rng.next());
        start_daemon(&node, round);
        verified += verify(&mnt, &ledger, round);
        node.ok(&["umount", "fs1"]);
        let report = node.ok(&["fsck", "fs1", "-n"]);
        assert!(
            report.contains("is clean"),
            "fsck after power loss {round}: {report}"
        );
        node.ok(&["mount", "fs1"]);
        if (round + 1) % 50 == 0 {
            eprintln!("{} power losses, {:.0?}", round + 1, started.elapsed());
        }
    }
    eprintln!(
        "{rounds} power losses in {:.0?}, {verified} fsynced bytes verified",
        started.elapsed()
    );
    assert!(
        verified > 0,
        "the workload made too little progress to test"
    );
    node.ok(&["shutdown"]);
}

/// A node connected to `count` enclosures of `drives` namespaces each, powered on.
fn node_with_enclosures(count: usize, drives: usize) -> (Node, Vec<Enclosure>, Vec<DriveServer>) {
    let node = Node::new().start();
    let hostnqn = node.ok(&["nvme", "show-hostnqn"]).trim().to_string();
    let enclosures: Vec<Enclosure> = (0..count)
        .map(|j| Enclosure::new(&node, j, drives))
        .collect();
    let servers = power_on(&enclosures, &hostnqn, 1);
    connect(&node, &enclosures);
    (node, enclosures, servers)
}

#[test]
fn power_loss_of_drives_and_daemon_during_fsync_workload() {
    if !fuse_usable() {
        return;
    }
    let (node, enclosures, servers) = node_with_enclosures(2, 2);
    let mut text = String::new();
    for j in 0..2 {
        for i in 1..=2 {
            text += &format!(
                "%nsd: device=nvme:nvme{j}n{i} nsd=pl{j}{i} usage=dataAndMetadata failureGroup={}\n",
                j * 2 + i
            );
        }
    }
    let stanza = node.path("pl.stanza");
    std::fs::write(&stanza, text).unwrap();
    power_loss_loop(node, &enclosures, servers, &stanza, iterations());
}

/// The same with the NSDs on 4+2p vdisks of a declustered array whose twelve pdisks are
/// namespaces of three drive servers: a power loss also interrupts the array's strip
/// writes and its dirty-region records.
#[test]
fn power_loss_of_pdisks_and_daemon_during_fsync_workload_on_vdisks() {
    if !fuse_usable() {
        return;
    }
    let (node, enclosures, servers) = node_with_enclosures(3, 4);
    let mut pdisks = String::new();
    for j in 0..3 {
        for i in 1..=4 {
            pdisks += &format!(
                "%pdisk: pdisk=j{j}s{i} device=nvme:nvme{j}n{i} enclosure=jbof{j} slot={i}\n"
            );
        }
    }
    let pdisk_stanza = node.path("pdisks.stanza");
    std::fs::write(&pdisk_stanza, pdisks).unwrap();
    node.ok(&["da", "create", "da1", "-F", s(&pdisk_stanza)]);
    let mut text = String::new();
    for v in 0..2 {
        node.ok(&[
            "vdisk",
            "create",
            &format!("plvd{v}"),
            "--da",
            "da1",
            "--code",
            "4+2p",
            "--block-size",
            "256K",
            "--size",
            "35%",
        ]);
        text += &format!(
            "%nsd: device=vdisk:plvd{v} nsd=plvd{v} usage=dataAndMetadata failureGroup={}\n",
            v + 1
        );
    }
    let stanza = node.path("plvd.stanza");
    std::fs::write(&stanza, text).unwrap();
    power_loss_loop(
        node,
        &enclosures,
        servers,
        &stanza,
        iterations().div_ceil(2),
    );
}
