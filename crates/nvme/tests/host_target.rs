//! The host (initiator and native multipath) against Tessera's own drive server: data
//! through several paths, path loss under load, ctrl_loss_tmo, ANA selection,
//! reservations between two hosts, access control and discovery.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_drive::{AlignedBuf, BlockDevice};
use tessera_nvme::host::completion::Completions;
use tessera_nvme::host::{
    discover, nvme_status, AnaPathState, ConnectOptions, DiscoverOptions, Host, HostIdentity,
    MultipathNamespace, PathState,
};
use tessera_nvme::target::config::TargetConfig;
use tessera_nvme::target::DriveServer;
use tessera_nvme::wire::log::AnaState;
use tessera_nvme::wire::reservation::{AcquireAction, RegisterAction, ReservationType};
use tessera_nvme::wire::Status;

const SUBNQN: &str = "nqn.2024-01.io.tessera:test-jbof";
const DRIVE_BYTES: u64 = 64 << 20;

fn host_identity(tag: u8) -> HostIdentity {
    HostIdentity {
        nqn: format!("nqn.2024-01.io.tessera:host{tag}"),
        id: [tag; 16],
    }
}

struct Setup {
    server: Option<DriveServer>,
    addrs: Vec<SocketAddr>,
    _dir: tempfile::TempDir,
}

impl Setup {
    fn server(&self) -> &DriveServer {
        self.server.as_ref().unwrap()
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }
}

/// A drive server with one 64 MiB namespace exported on two ports of 127.0.0.1; port 2's
/// ANA group 1 is in `port2_ana`. `allowed`: None allows any host.
fn start(port2_ana: &str, allowed: Option<&[&str]>) -> Setup {
    let (dir, file) = drive_file();
    let config = config_json(&file, port2_ana, allowed);
    let config = TargetConfig::from_json_str(&config).unwrap();
    let server = DriveServer::start(config).unwrap();
    let mut addrs: Vec<(u16, SocketAddr)> = server.local_addrs();
    addrs.sort();
    Setup {
        addrs: addrs.into_iter().map(|(_, a)| a).collect(),
        server: Some(server),
        _dir: dir,
    }
}

/// A fresh drive file of `DRIVE_BYTES` in a temporary directory.
fn drive_file() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("drive.img");
    std::fs::File::create(&file)
        .unwrap()
        .set_len(DRIVE_BYTES)
        .unwrap();
    (dir, file)
}

fn config_json(file: &Path, port2_ana: &str, allowed: Option<&[&str]>) -> String {
    let hosts: Vec<String> = allowed
        .unwrap_or(&[])
        .iter()
        .map(|h| format!("{{\"nqn\": \"{h}\"}}"))
        .collect();
    let allowed_list: Vec<String> = allowed
        .unwrap_or(&[])
        .iter()
        .map(|h| format!("\"{h}\""))
        .collect();
    let allow_any = if allowed.is_none() { "1" } else { "0" };
    let port = |id: u16, ana: &str| {
        format!(
            r#"{{"portid": {id}, "addr": {{"trtype": "tcp", "adrfam": "ipv4",
                "traddr": "127.0.0.1", "trsvcid": "0"}},
               "subsystems": ["{SUBNQN}"],
               "ana_groups": [{{"grpid": 1, "ana": {{"state": "{ana}"}}}}]}}"#
        )
    };
    format!(
        r#"{{"hosts": [{}],
            "ports": [{}, {}],
            "subsystems": [{{"nqn": "{SUBNQN}",
                "attr": {{"allow_any_host": "{allow_any}"}},
                "allowed_hosts": [{}],
                "namespaces": [{{"nsid": 1, "enable": 1, "ana_grpid": 1,
                                 "device": {{"path": "{}"}}}}]}}]}}"#,
        hosts.join(","),
        port(1, "optimized"),
        port(2, port2_ana),
        allowed_list.join(","),
        file.display()
    )
}

fn opts(addr: SocketAddr) -> ConnectOptions {
    ConnectOptions {
        ctrl_loss_tmo: Duration::from_secs(20),
        reconnect_delay: Duration::from_millis(100),
        keep_alive_tmo: Duration::from_secs(2),
        nr_io_queues: Some(2),
        ..ConnectOptions::new(addr, SUBNQN)
    }
}

fn connect_all(
    host: &Host,
    setup: &Setup,
    tweak: impl Fn(&mut ConnectOptions),
) -> Arc<MultipathNamespace> {
    for addr in &setup.addrs {
        let mut o = opts(*addr);
        tweak(&mut o);
        host.connect(o).unwrap();
    }
    host.namespace("nvme0n1").expect("nvme0n1 exists")
}

/// A block whose content names its offset and a generation, so misplaced or lost writes
/// show up.
fn pattern(offset: u64, generation: u64, len: usize) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(len);
    for (i, chunk) in buf.chunks_exact_mut(8).enumerate() {
        let v = offset.wrapping_mul(31) ^ generation.rotate_left(17) ^ (i as u64);
        chunk.copy_from_slice(&v.to_le_bytes());
    }
    buf
}

fn path_commands(host: &Host) -> Vec<(String, u64)> {
    let info = host.list();
    info[0]
        .paths
        .iter()
        .map(|p| (p.addr.to_string(), p.stats.commands))
        .collect()
}

#[test]
fn data_written_through_one_path_reads_back_through_another() {
    let setup = start("optimized", None);
    let writer = Host::new(host_identity(1));
    writer.connect(opts(setup.addrs[0])).unwrap();
    let ns_a = writer.namespace("nvme0n1").unwrap();
    let reader = Host::new(host_identity(2));
    reader.connect(opts(setup.addrs[1])).unwrap();
    let ns_b = reader.namespace("nvme0n1").unwrap();
    assert_eq!(ns_a.size_bytes(), DRIVE_BYTES);
    assert_eq!(ns_a.nguid(), ns_b.nguid());
    let data = pattern(1 << 20, 7, 1 << 20);
    ns_a.write_at(&data, 1 << 20).unwrap();
    ns_a.flush().unwrap();
    let mut back = AlignedBuf::zeroed(1 << 20);
    ns_b.read_at(&mut back, 1 << 20).unwrap();
    assert!(back[..] == data[..], "data read through path 2 differs");
    // One host with both paths sees one namespace with two live paths.
    writer.connect(opts(setup.addrs[1])).unwrap();
    let list = writer.list();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].paths.len(), 2);
    assert!(list[0].paths.iter().all(|p| p.state == PathState::Live));
    assert_eq!(list[0].paths[0].controller, "nvme0c1");
    assert_eq!(writer.connections().len(), 2);
    assert!(writer.namespace_by_nguid(&ns_a.nguid()).is_some());
    assert!(
        writer.connect(opts(setup.addrs[1])).is_err(),
        "duplicate path refused"
    );
    assert_eq!(writer.disconnect(SUBNQN, Some(setup.addrs[0])).unwrap(), 1);
    assert_eq!(writer.disconnect_all(), 1);
}

#[test]
fn small_and_large_io_with_and_without_digests() {
    let setup = start("optimized", None);
    for (header, data) in [(false, false), (true, true), (true, false)] {
        let host = Host::new(host_identity(3));
        let ns = connect_all(&host, &setup, |o| {
            o.header_digest = header;
            o.data_digest = data;
        });
        for (i, len) in [4096usize, 1 << 20, 8192, 3 << 20, 16384 + 4096]
            .into_iter()
            .enumerate()
        {
            let offset = (i as u64) * (4 << 20) + 4096;
            let buf = pattern(offset, u64::from(header) + 2 * u64::from(data), len);
            ns.write_at(&buf, offset).unwrap();
            let mut back = AlignedBuf::zeroed(len);
            ns.read_at(&mut back, offset).unwrap();
            assert!(
                back[..] == buf[..],
                "mismatch len {len} digests {header}/{data}"
            );
        }
        ns.flush().unwrap();
        ns.write_zeroes(4096, 8192, false).unwrap();
        let mut back = AlignedBuf::zeroed(8192);
        ns.read_at(&mut back, 4096).unwrap();
        assert!(back.iter().all(|b| *b == 0));
        ns.deallocate(1 << 20, 1 << 20).unwrap();
        // Out of range is refused before anything is sent.
        let mut past = AlignedBuf::zeroed(4096);
        assert!(ns.read_at(&mut past, DRIVE_BYTES).is_err());
        host.disconnect_all();
    }
}

/// Many threads on the same queues at once, with and without digests: 4 KiB writes (in
/// the capsule, combined with other threads' capsules into shared sends), 256 KiB writes
/// (R2T and H2CData sent straight from the caller's buffer) and reads of both, each thread
/// in its own region. Every byte must land where its command said.
#[test]
fn many_threads_mixing_small_and_large_commands_on_shared_queues() {
    let setup = start("optimized", None);
    for digests in [false, true] {
        let host = Host::new(host_identity(9));
        let ns = connect_all(&host, &setup, |o| {
            o.header_digest = digests;
            o.data_digest = digests;
        });
        std::thread::scope(|s| {
            for t in 0..16u64 {
                let ns = ns.clone();
                s.spawn(move || {
                    let base = t * (2 << 20);
                    for round in 0..12u64 {
                        let (offset, len) = if round % 3 == 2 {
                            (base + (1 << 20), 256 << 10)
                        } else {
                            (base + (round % 64) * 4096, 4096)
                        };
                        let generation = round + 100 * u64::from(digests);
                        let buf = pattern(offset, generation, len);
                        ns.write_at(&buf, offset).unwrap();
                        let mut back = AlignedBuf::zeroed(len);
                        ns.read_at(&mut back, offset).unwrap();
                        assert!(
                            back[..] == buf[..],
                            "thread {t} round {round}: {len} bytes at {offset} differ"
                        );
                    }
                });
            }
        });
        host.disconnect_all();
    }
}

/// A 4 MiB read (a file system block) is one command (MDTS 4 MiB), and its data, which the
/// server writes from a sender thread while the connection's own thread goes on reading
/// commands, arrives whole and in place beside 4 KiB reads answered by that thread.
#[test]
fn block_sized_reads_are_one_command_and_arrive_whole_beside_small_ones() {
    let setup = start("optimized", None);
    let host = Host::new(host_identity(11));
    let ns = connect_all(&host, &setup, |_| {});
    const BLOCK: usize = 4 << 20;
    for t in 0..8u64 {
        let offset = t * BLOCK as u64;
        ns.write_at(&pattern(offset, 5, BLOCK), offset).unwrap();
    }
    let small_base = 8 * BLOCK as u64;
    ns.write_at(&pattern(small_base, 6, 1 << 20), small_base)
        .unwrap();
    let commands = |host: &Host| path_commands(host).iter().map(|(_, n)| n).sum::<u64>();
    let before = commands(&host);
    let mut back = AlignedBuf::zeroed(BLOCK);
    ns.read_at(&mut back, 0).unwrap();
    assert_eq!(commands(&host) - before, 1, "a 4 MiB read is one command");
    assert!(back[..] == pattern(0, 5, BLOCK)[..], "block 0 differs");
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let ns = ns.clone();
            s.spawn(move || {
                let offset = t * BLOCK as u64;
                let want = pattern(offset, 5, BLOCK);
                for round in 0..6 {
                    let mut back = AlignedBuf::zeroed(BLOCK);
                    ns.read_at(&mut back, offset).unwrap();
                    assert!(back[..] == want[..], "block {t} round {round} differs");
                }
            });
        }
        for t in 0..4u64 {
            let ns = ns.clone();
            s.spawn(move || {
                let want = pattern(small_base, 6, 1 << 20);
                for i in 0..200u64 {
                    let at = ((i * 7 + t * 61) % 256) as usize * 4096;
                    let mut back = AlignedBuf::zeroed(4096);
                    ns.read_at(&mut back, small_base + at as u64).unwrap();
                    assert!(
                        back[..] == want[at..at + 4096],
                        "4 KiB read at {at} differs"
                    );
                }
            });
        }
    });
    host.disconnect_all();
}

/// Keeps `depth` reads of 4 KiB in flight from this one thread until `total` have
/// completed, checking each against the pattern written at its offset; `midway` runs once
/// half of them are done. `batched` starts the reads of one wake-up as a `ReadBatch`.
fn submitted_reads(
    ns: &MultipathNamespace,
    depth: usize,
    total: u64,
    batched: bool,
    mut midway: impl FnMut(),
) {
    let cq = Completions::new(Duration::from_secs(10));
    let offset_of = |n: u64| (n * 7919 % 1024) * 4096;
    let mut next = 0u64;
    let mut done = 0u64;
    while next < depth as u64 {
        ns.submit_read(AlignedBuf::zeroed(4096), offset_of(next), next, &cq)
            .unwrap();
        next += 1;
    }
    while done < total {
        let completed = cq.wait(Duration::from_secs(30));
        assert!(!completed.is_empty(), "no completion within 30 s");
        let mut batch = batched.then(|| ns.read_batch(&cq));
        for c in completed {
            let n = c.tag;
            let buf = ns.finish_read(c, offset_of(n)).expect("read must not fail");
            let offset = offset_of(n);
            let want = pattern(offset & !0xffff, 1, 65536);
            let at = (offset & 0xffff) as usize;
            assert!(
                buf[..] == want[at..at + 4096],
                "read {n} at {offset} differs"
            );
            done += 1;
            if done == total / 2 {
                midway();
            }
            if next < total {
                let buf = AlignedBuf::zeroed(4096);
                match &mut batch {
                    Some(batch) => batch.read(buf, offset_of(next), next).unwrap(),
                    None => ns.submit_read(buf, offset_of(next), next, &cq).unwrap(),
                }
                next += 1;
            }
        }
        if let Some(batch) = batch {
            batch.submit();
        }
    }
    assert_eq!(cq.in_flight(), 0);
}

/// One thread keeps 32 reads in flight (as fio does with io_uring) over both paths, one
/// by one and in batches; then again while port 1 is pulled, where the reads on the lost
/// path are retried on the other and none fails.
#[test]
fn reads_submitted_from_one_thread_complete_and_survive_a_path_loss() {
    let setup = start("optimized", None);
    let host = Host::new(host_identity(10));
    let ns = connect_all(&host, &setup, |_| {});
    for chunk in 0..64u64 {
        let offset = chunk * 65536;
        ns.write_at(&pattern(offset, 1, 65536), offset).unwrap();
    }
    submitted_reads(&ns, 32, 4000, false, || {});
    submitted_reads(&ns, 32, 4000, true, || {});
    let before = path_commands(&host);
    assert!(
        before.iter().all(|(_, n)| *n > 0),
        "both paths used: {before:?}"
    );

    for batched in [false, true] {
        submitted_reads(&ns, 32, 4000, batched, || {
            setup.server().set_port_enabled(1, false).unwrap();
        });
        setup.server().set_port_enabled(1, true).unwrap();
        wait_until(Duration::from_secs(10), || {
            host.list()[0]
                .paths
                .iter()
                .all(|p| p.state == PathState::Live)
        });
    }
    // Out of range is refused at once, before anything is sent.
    let cq = Completions::new(Duration::from_secs(10));
    assert!(ns
        .submit_read(AlignedBuf::zeroed(4096), DRIVE_BYTES, 0, &cq)
        .is_err());
    host.disconnect_all();
}

/// Writers and readers run while port 1 is pulled and plugged back: no I/O fails, every
/// write is there afterwards, and the path is used again once it reconnects.
#[test]
fn losing_a_path_under_load_loses_nothing() {
    let setup = start("optimized", None);
    let host = Host::new(host_identity(4));
    let ns = connect_all(&host, &setup, |_| {});
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let ns = Arc::clone(&ns);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut generation = 0u64;
                let mut written = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    generation += 1;
                    let offset = (t * 256 + generation % 256) * 65536;
                    let buf = pattern(offset, generation, 65536);
                    ns.write_at(&buf, offset).expect("write must not fail");
                    let mut back = AlignedBuf::zeroed(65536);
                    ns.read_at(&mut back, offset).expect("read must not fail");
                    assert!(back[..] == buf[..]);
                    written.retain(|(o, _)| *o != offset);
                    written.push((offset, generation));
                }
                written
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    setup.server().set_port_enabled(1, false).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let during = host.list()[0].paths[0].state;
    setup.server().set_port_enabled(1, true).unwrap();
    wait_until(Duration::from_secs(10), || {
        host.list()[0].paths[0].state == PathState::Live
    });
    let before = path_commands(&host)[0].1;
    std::thread::sleep(Duration::from_millis(700));
    stop.store(true, Ordering::Relaxed);
    let written: Vec<_> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    assert_eq!(during, PathState::Connecting);
    ns.flush().unwrap();
    for (offset, generation) in written {
        let mut back = AlignedBuf::zeroed(65536);
        ns.read_at(&mut back, offset).unwrap();
        assert!(
            back[..] == pattern(offset, generation, 65536)[..],
            "lost write at {offset}"
        );
    }
    let after = path_commands(&host)[0].1;
    assert!(after > before, "path 1 is used again after reconnecting");
    let retries: u64 = host.list()[0].paths.iter().map(|p| p.stats.retries).sum();
    println!("retries during the outage: {retries}");
}

/// fast_io_fail_tmo: with every path down, I/O fails after it (not after the long
/// ctrl_loss_tmo), new I/O fails at once while the paths are still down, the paths stay
/// and keep reconnecting, and I/O works again when they are back, with no new connect.
#[test]
fn fast_io_fail_tmo_fails_io_early_and_paths_come_back() {
    let setup = start("optimized", None);
    let host = Host::new(host_identity(11));
    let ns = connect_all(&host, &setup, |o| {
        o.ctrl_loss_tmo = Duration::from_secs(60);
        o.fast_io_fail_tmo = Some(Duration::from_secs(1));
    });
    let data = pattern(0, 3, 4096);
    let (msg, waited) = read_with_every_port_down(&setup, &ns, &data);
    let mut buf = AlignedBuf::zeroed(4096);
    assert!(
        waited >= Duration::from_millis(800),
        "failed after only {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(10),
        "took {waited:?}, not fast_io_fail_tmo"
    );
    assert!(
        msg.contains("fast_io_fail_tmo 1 s") && msg.contains("ctrl_loss_tmo 60 s"),
        "{msg}"
    );
    // Still no path: the next command fails at once, and the paths are not removed.
    let again = Instant::now();
    assert!(ns.write_at(&data, 4096).is_err());
    assert!(
        again.elapsed() < Duration::from_millis(500),
        "{:?}",
        again.elapsed()
    );
    assert_eq!(host.list()[0].paths.len(), 2);
    setup.server().set_port_enabled(1, true).unwrap();
    setup.server().set_port_enabled(2, true).unwrap();
    wait_until(Duration::from_secs(10), || live_paths(&host) > 0);
    ns.read_at(&mut buf, 0).unwrap();
    assert!(buf[..] == data[..]);
    // Longer than ctrl_loss_tmo is refused when connecting.
    let mut o = opts(setup.addrs[0]);
    o.ctrl_loss_tmo = Duration::from_secs(5);
    o.fast_io_fail_tmo = Some(Duration::from_secs(6));
    let err = Host::new(host_identity(12))
        .connect(o)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("fast_io_fail_tmo 6 s is longer than ctrl_loss_tmo 5 s"),
        "{err}"
    );
    host.disconnect_all();
}

/// Writes `data` at 0, takes both ports down and reads it back: the read's error message
/// and how long it took to fail.
fn read_with_every_port_down(
    setup: &Setup,
    ns: &MultipathNamespace,
    data: &[u8],
) -> (String, Duration) {
    ns.write_at(data, 0).unwrap();
    setup.server().set_port_enabled(1, false).unwrap();
    setup.server().set_port_enabled(2, false).unwrap();
    let start = Instant::now();
    let mut buf = AlignedBuf::zeroed(data.len());
    let err = ns.read_at(&mut buf, 0).unwrap_err();
    let waited = start.elapsed();
    let msg = err.to_string();
    println!("{msg}");
    (msg, waited)
}

/// Live paths of the host's first namespace.
fn live_paths(host: &Host) -> usize {
    host.list()[0]
        .paths
        .iter()
        .filter(|p| p.state == PathState::Live)
        .count()
}

fn wait_until(limit: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(
            Instant::now() < deadline,
            "condition not met within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// With every path down longer than ctrl_loss_tmo, queued I/O fails with a message naming
/// the namespace, subsystem and paths; connecting again revives the same namespace.
#[test]
fn all_paths_down_fails_after_ctrl_loss_tmo_then_recovers() {
    let setup = start("optimized", None);
    let host = Host::new(host_identity(5));
    let tmo = Duration::from_secs(2);
    let ns = connect_all(&host, &setup, |o| o.ctrl_loss_tmo = tmo);
    let data = pattern(0, 1, 4096);
    let (msg, waited) = read_with_every_port_down(&setup, &ns, &data);
    let mut buf = AlignedBuf::zeroed(4096);
    assert!(
        waited >= Duration::from_millis(1500),
        "failed after only {waited:?}"
    );
    assert!(waited < Duration::from_secs(10), "took {waited:?}");
    assert!(msg.contains("nvme0n1") && msg.contains(SUBNQN), "{msg}");
    assert!(
        msg.contains("ctrl_loss_tmo") && msg.contains("tessera nvme connect"),
        "{msg}"
    );
    wait_until(Duration::from_secs(5), || host.list()[0].paths.is_empty());
    setup.server().set_port_enabled(1, true).unwrap();
    setup.server().set_port_enabled(2, true).unwrap();
    host.connect(opts(setup.addrs[1])).unwrap();
    ns.read_at(&mut buf, 0).unwrap();
    assert!(buf[..] == data[..]);
}

/// A brief outage of every path shorter than ctrl_loss_tmo is invisible: I/O waits.
#[test]
fn io_queues_while_all_paths_are_briefly_down() {
    let setup = start("optimized", None);
    let host = Host::new(host_identity(6));
    let ns = connect_all(&host, &setup, |_| {});
    setup.server().set_port_enabled(1, false).unwrap();
    setup.server().set_port_enabled(2, false).unwrap();
    let server_ports = std::thread::scope(|s| {
        let io = s.spawn(|| {
            let data = pattern(8192, 3, 8192);
            ns.write_at(&data, 8192).unwrap();
            let mut back = AlignedBuf::zeroed(8192);
            ns.read_at(&mut back, 8192).unwrap();
            assert!(back[..] == data[..]);
        });
        std::thread::sleep(Duration::from_millis(800));
        setup.server().set_port_enabled(2, true).unwrap();
        io.join().unwrap();
        "ok"
    });
    assert_eq!(server_ports, "ok");
}

#[test]
fn optimized_paths_are_preferred_and_ana_changes_are_followed() {
    let setup = start("non-optimized", None);
    let host = Host::new(host_identity(7));
    let ns = connect_all(&host, &setup, |_| {});
    let states: Vec<_> = host.list()[0].paths.iter().map(|p| p.ana_state).collect();
    assert_eq!(
        states,
        [AnaPathState::Optimized, AnaPathState::NonOptimized]
    );
    let mut buf = AlignedBuf::zeroed(4096);
    let base = path_commands(&host);
    for _ in 0..50 {
        ns.read_at(&mut buf, 0).unwrap();
    }
    let now = path_commands(&host);
    assert_eq!(
        now[0].1 - base[0].1,
        50,
        "all I/O on the optimized path: {now:?}"
    );
    assert_eq!(now[1].1, base[1].1);
    // Port 1 becomes inaccessible: I/O moves to the non-optimized path.
    setup
        .server()
        .set_ana_state(1, 1, AnaState::Inaccessible)
        .unwrap();
    for _ in 0..50 {
        ns.read_at(&mut buf, 0).unwrap();
    }
    wait_until(Duration::from_secs(3), || {
        host.list()[0].paths[0].ana_state == AnaPathState::Inaccessible
    });
    let moved = path_commands(&host);
    for _ in 0..20 {
        ns.read_at(&mut buf, 0).unwrap();
    }
    let last = path_commands(&host);
    assert_eq!(last[0].1, moved[0].1, "no I/O on the inaccessible path");
    assert_eq!(last[1].1 - moved[1].1, 20);
}

/// ANA changes reach the host as asynchronous events, without I/O to provoke an ANA
/// error: each flip of port 2's state shows within half a second (the fallback poll runs
/// once a second, so four flips in a row would rarely all be that quick without events).
#[test]
fn ana_change_events_update_paths_without_io() {
    let setup = start("non-optimized", None);
    let host = Host::new(host_identity(11));
    let _ns = connect_all(&host, &setup, |_| {});
    for (i, state) in [
        AnaState::Optimized,
        AnaState::NonOptimized,
        AnaState::Inaccessible,
        AnaState::NonOptimized,
    ]
    .into_iter()
    .enumerate()
    {
        let want = AnaPathState::from_wire(state);
        let t0 = Instant::now();
        setup.server().set_ana_state(2, 1, state).unwrap();
        wait_until(Duration::from_secs(3), || {
            host.list()[0].paths[1].ana_state == want
        });
        let took = t0.elapsed();
        assert!(
            took < Duration::from_millis(500),
            "flip {i} to {state:?} took {took:?}"
        );
    }
    host.disconnect_all();
}

#[test]
fn reservations_fence_another_host() {
    let setup = start("optimized", None);
    let a = Host::new(host_identity(0xa));
    let b = Host::new(host_identity(0xb));
    let ns_a = connect_all(&a, &setup, |_| {});
    let ns_b = connect_all(&b, &setup, |_| {});
    let we = ReservationType::WriteExclusive;
    ns_a.reservation_register(RegisterAction::Register, 0, 0xa, false, None)
        .unwrap();
    ns_a.reservation_acquire(AcquireAction::Acquire, we, 0xa, 0)
        .unwrap();
    let data = pattern(0, 9, 4096);
    ns_a.write_at(&data, 0).unwrap();
    let err = ns_b.write_at(&data, 0).unwrap_err();
    assert_eq!(
        nvme_status(&err).map(|s| s.code()),
        Some(Status::RESERVATION_CONFLICT.code()),
        "{err}"
    );
    assert!(MultipathNamespace::is_reservation_conflict(&err));
    assert!(err.to_string().contains("Reservation Conflict"), "{err}");
    // B reads fine under Write Exclusive, registers and preempts A.
    let mut buf = AlignedBuf::zeroed(4096);
    ns_b.read_at(&mut buf, 0).unwrap();
    ns_b.reservation_register(RegisterAction::Register, 0, 0xb, false, None)
        .unwrap();
    ns_b.reservation_acquire(AcquireAction::Preempt, we, 0xb, 0xa)
        .unwrap();
    let report = ns_b.reservation_report().unwrap();
    assert_eq!(report.rtype, we as u8);
    let holder: Vec<_> = report
        .registrants
        .iter()
        .filter(|r| r.holds_reservation)
        .collect();
    assert_eq!(holder.len(), 1);
    assert_eq!(holder[0].hostid, [0xb; 16]);
    ns_b.write_at(&data, 0).unwrap();
    let err = ns_a.write_at(&data, 0).unwrap_err();
    assert!(MultipathNamespace::is_reservation_conflict(&err), "{err}");
}

#[test]
fn a_host_not_allowed_gets_a_clear_error() {
    let allowed = "nqn.2024-01.io.tessera:host1";
    let setup = start("optimized", Some(&[allowed]));
    let stranger = Host::new(host_identity(9));
    let err = stranger
        .connect(opts(setup.addrs[0]))
        .unwrap_err()
        .to_string();
    println!("{err}");
    assert!(
        err.contains("nqn.2024-01.io.tessera:host9") && err.contains(SUBNQN),
        "{err}"
    );
    assert!(err.contains("allowed"), "{err}");
    let friend = Host::new(host_identity(1));
    friend.connect(opts(setup.addrs[0])).unwrap();
    // An unknown subsystem is named as such.
    let mut wrong = opts(setup.addrs[0]);
    wrong.subnqn = "nqn.2024-01.io.tessera:nope".into();
    let err = friend.connect(wrong).unwrap_err().to_string();
    assert!(err.contains("nqn.2024-01.io.tessera:nope"), "{err}");
}

#[test]
fn discovery_lists_the_subsystem_on_every_port() {
    let setup = start("optimized", None);
    let entries = discover(
        setup.addrs[0],
        &host_identity(1),
        &DiscoverOptions::default(),
    )
    .unwrap();
    let nvm: Vec<_> = entries
        .iter()
        .filter(|e| e.subnqn.as_str() == SUBNQN)
        .collect();
    assert_eq!(nvm.len(), 2, "{entries:?}");
    let ports: Vec<String> = nvm.iter().map(|e| e.trsvcid.as_str().to_owned()).collect();
    for addr in &setup.addrs {
        assert!(ports.contains(&addr.port().to_string()), "{ports:?}");
    }
}

/// What an NSD server does with the drive server: subsystems exported and withdrawn while
/// hosts are connected, and a host gate (the cluster's word on who is alive) that fences
/// a host: its writes are refused with Reservation Conflict on the controllers it has,
/// it cannot connect again, its reads still work, and other hosts are not touched.
#[test]
fn a_gated_host_is_fenced_and_subsystems_come_and_go_while_serving() {
    use std::collections::HashSet;

    let setup = start("optimized", None);
    let refused: Arc<parking_lot::Mutex<HashSet<String>>> = Arc::default();
    let gate_refused = Arc::clone(&refused);
    setup.server().set_host_gate(Arc::new(move |nqn: &str| {
        !gate_refused.lock().contains(nqn)
    }));

    // A second subsystem, added live, reachable on every port.
    const SUB2: &str = "nqn.2024-01.io.tessera:added-live";
    let file2 = setup._dir.path().join("drive2.img");
    std::fs::File::create(&file2)
        .unwrap()
        .set_len(DRIVE_BYTES)
        .unwrap();
    let sub2 = TargetConfig::from_json_str(&format!(
        r#"{{"ports": [], "subsystems": [{{"nqn": "{SUB2}", "attr": {{"allow_any_host": "1"}},
            "namespaces": [{{"nsid": 1, "enable": 1, "device": {{"path": "{}"}}}}]}}]}}"#,
        file2.display()
    ))
    .unwrap()
    .subsystems
    .remove(0);
    let open = |p: &Path| -> std::io::Result<Arc<dyn BlockDevice>> {
        Ok(Arc::new(tessera_drive::FileDrive::open_shared(p)?))
    };
    setup.server().add_subsystem(&sub2, &open).unwrap();
    let again = setup.server().add_subsystem(&sub2, &open).unwrap_err();
    assert!(again.to_string().contains("exported already"), "{again}");
    assert!(setup.server().subsystem_nqns().contains(&SUB2.to_string()));

    let a = Host::new(host_identity(0x21));
    let b = Host::new(host_identity(0x22));
    let ns_a = connect_all(&a, &setup, |_| {});
    let ns_b = connect_all(&b, &setup, |_| {});
    for addr in &setup.addrs {
        b.connect(ConnectOptions {
            subnqn: SUB2.into(),
            ctrl_loss_tmo: Duration::from_secs(1),
            ..opts(*addr)
        })
        .unwrap();
    }
    let ns_b2 = b
        .namespace("nvme1n1")
        .expect("the added subsystem's namespace");
    let data = pattern(0, 3, 4096);
    ns_a.write_at(&data, 0).unwrap();
    ns_b2.write_at(&data, 8192).unwrap();
    let mut back = AlignedBuf::zeroed(4096);
    ns_b2.read_at(&mut back, 8192).unwrap();
    assert_eq!(&back[..], &data[..]);

    // The cluster gives up on host A.
    refused.lock().insert(host_identity(0x21).nqn);
    setup.server().refence();
    let err = ns_a.write_at(&data, 4096).unwrap_err();
    assert!(MultipathNamespace::is_reservation_conflict(&err), "{err}");
    ns_a.read_at(&mut back, 0).unwrap();
    assert_eq!(&back[..], &data[..], "a fenced host still reads");
    ns_b.write_at(&data, 4096).unwrap();
    let late = Host::new(host_identity(0x21));
    assert!(
        late.connect(opts(setup.addrs[0])).is_err(),
        "a fenced host cannot connect again"
    );

    // Withdrawn: its controllers end, the host's I/O to it fails after ctrl_loss_tmo.
    assert!(setup.server().remove_subsystem(SUB2));
    assert!(!setup.server().remove_subsystem(SUB2));
    let deadline = Instant::now() + Duration::from_secs(20);
    while ns_b2.write_at(&data, 0).is_ok() {
        assert!(
            Instant::now() < deadline,
            "writes to a withdrawn subsystem kept working"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    ns_b.write_at(&data, 0).unwrap();
}

/// A write with FUA is on the drive's stable storage when it completes (the drive server's
/// volatile cache writes it through), and a flush after nothing but such writes sends no
/// Flush command: a synchronous write costs one round trip, not two. A plain write still
/// leaves the next flush something to send.
#[test]
fn fua_writes_are_durable_at_completion_and_leave_no_flush_to_send() {
    let (_dir, file) = drive_file();
    let text = config_json(&file, "optimized", None).replacen(
        r#""enable": 1,"#,
        r#""enable": 1, "volatile_write_cache": {"early_destage_one_in": 0},"#,
        1,
    );
    let server = DriveServer::start(TargetConfig::from_json_str(&text).unwrap()).unwrap();
    let mut addrs = server.local_addrs();
    addrs.sort();
    let host = Host::new(host_identity(1));
    host.connect(opts(addrs[0].1)).unwrap();
    let ns = host.namespace("nvme0n1").unwrap();
    let on_file = |offset: u64, len: usize| {
        use std::os::unix::fs::FileExt;
        let mut b = vec![0u8; len];
        std::fs::File::open(&file)
            .unwrap()
            .read_exact_at(&mut b, offset)
            .unwrap();
        b
    };
    // Larger than one command's transfer too, so every piece carries the bit.
    let forced = pattern(4 << 20, 1, 2 << 20);
    ns.write_fua(&forced, 4 << 20).unwrap();
    assert!(
        on_file(4 << 20, 2 << 20) == forced[..],
        "a FUA write is in the backing file when it completes"
    );
    let before = path_commands(&host);
    ns.flush().unwrap();
    assert_eq!(
        path_commands(&host),
        before,
        "nothing but FUA writes since the last flush: no Flush sent"
    );
    let cached = pattern(8 << 20, 2, 8192);
    ns.write_at(&cached, 8 << 20).unwrap();
    assert_eq!(
        on_file(8 << 20, 8192),
        vec![0; 8192],
        "a plain write stays in the volatile cache"
    );
    let before = path_commands(&host)[0].1;
    ns.flush().unwrap();
    assert_eq!(path_commands(&host)[0].1, before + 1, "one Flush sent");
    assert!(on_file(8 << 20, 8192) == cached[..], "flushed");
    host.disconnect_all();
    server.shutdown();
}

/// A device that counts the reads that reach it and passes everything on: a wrapper, as a
/// caller of `DriveServer::start_with` may supply.
#[derive(Debug)]
struct CountingReads {
    inner: Arc<dyn BlockDevice>,
    reads: Arc<std::sync::atomic::AtomicU64>,
}

impl BlockDevice for CountingReads {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// What the drive server writes on its own descriptor, behind the device (a small write
/// on a connection's io_uring), is synced by the next Flush: the device's own flush does
/// not know of it and skips its sync when nothing went through it. A caller-supplied plain
/// drive lends its descriptor to that path (as an NSD server's drive does); a wrapper does
/// not, and sees every I/O.
#[test]
fn a_flush_syncs_writes_made_behind_the_device_and_wrappers_see_every_io() {
    for wrapped in [false, true] {
        let (_dir, file) = drive_file();
        let config = TargetConfig::from_json_str(&config_json(&file, "optimized", None)).unwrap();
        let reads = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = Arc::clone(&reads);
        let open = move |p: &Path| -> std::io::Result<Arc<dyn BlockDevice>> {
            let drive: Arc<dyn BlockDevice> = Arc::new(tessera_drive::FileDrive::open_shared(p)?);
            Ok(if wrapped {
                Arc::new(CountingReads {
                    inner: drive,
                    reads: Arc::clone(&counter),
                })
            } else {
                drive
            })
        };
        let server = DriveServer::start_with(config, &open).unwrap();
        let mut addrs = server.local_addrs();
        addrs.sort();
        let host = Host::new(host_identity(1));
        host.connect(opts(addrs[0].1)).unwrap();
        let ns = host.namespace("nvme0n1").unwrap();
        let behind = || server.stats().namespaces[0].syncs_behind;

        let small = pattern(1 << 20, 1, 8192);
        ns.write_at(&small, 1 << 20).unwrap();
        ns.flush().unwrap();
        let expected = u64::from(!wrapped);
        assert_eq!(
            behind(),
            expected,
            "wrapped {wrapped}: the small write's flush"
        );
        // Larger than a ring write: through the device, whose own flush syncs it.
        let large = pattern(4 << 20, 2, 1 << 20);
        ns.write_at(&large, 4 << 20).unwrap();
        ns.flush().unwrap();
        assert_eq!(
            behind(),
            expected,
            "wrapped {wrapped}: the large write's flush"
        );
        ns.flush().unwrap();
        assert_eq!(behind(), expected, "wrapped {wrapped}: nothing new to sync");

        let mut back = AlignedBuf::zeroed(8192);
        ns.read_at(&mut back, 1 << 20).unwrap();
        assert!(
            back[..] == small[..],
            "wrapped {wrapped}: small write read back"
        );
        let mut back = AlignedBuf::zeroed(1 << 20);
        ns.read_at(&mut back, 4 << 20).unwrap();
        assert!(
            back[..] == large[..],
            "wrapped {wrapped}: large write read back"
        );
        let counted = reads.load(Ordering::Relaxed);
        if wrapped {
            assert!(counted >= 2, "the wrapper saw {counted} reads of 2");
        } else {
            assert_eq!(counted, 0);
        }
        host.disconnect_all();
        server.shutdown();
    }
}

/// fast_io_fail_tmo counts from when the last path went down, not from the namespace's
/// first command after that: a namespace nobody used while its drive server was away
/// longer than that fails its first command at once (an array opened on a survivor must
/// not wait again for each pdisk of a lost enclosure).
#[test]
fn fast_io_fail_tmo_counts_from_the_loss_of_the_last_path() {
    let setup = start("optimized", None);
    let host = Host::new(host_identity(12));
    let ns = connect_all(&host, &setup, |o| {
        o.ctrl_loss_tmo = Duration::from_secs(60);
        o.fast_io_fail_tmo = Some(Duration::from_secs(1));
    });
    setup.server().set_port_enabled(1, false).unwrap();
    setup.server().set_port_enabled(2, false).unwrap();
    wait_until(Duration::from_secs(10), || live_paths(&host) == 0);
    std::thread::sleep(Duration::from_millis(1300));
    let start = Instant::now();
    let mut buf = AlignedBuf::zeroed(4096);
    let err = ns.read_at(&mut buf, 0).unwrap_err().to_string();
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "the first command after the loss waited {:?}: {err}",
        start.elapsed()
    );
    assert!(err.contains("fast_io_fail_tmo 1 s"), "{err}");
    setup.server().set_port_enabled(1, true).unwrap();
    wait_until(Duration::from_secs(10), || live_paths(&host) > 0);
    ns.read_at(&mut buf, 0).unwrap();
}
