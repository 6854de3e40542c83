//! The host against a hostile network: a proxy between it and a drive server corrupts,
//! cuts and pads the byte stream from the controller while the host reads and writes with
//! header and data digests on. Every read that succeeds returns the right bytes, nothing
//! panics or hangs, and once the proxy passes bytes through again the host is back to
//! normal on its own, with every write in place.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera_drive::{AlignedBuf, BlockDevice};
use tessera_nvme::host::{ConnectOptions, Host, HostIdentity, PathState};
use tessera_nvme::target::{DriveServer, TargetConfig};

const SUBNQN: &str = "nqn.2024-01.io.tessera:fuzz-jbof";
const DRIVE_BYTES: u64 = 16 << 20;
/// The bytes the workload touches, all written with `expected` before the storm.
const AREA_BYTES: u64 = 4 << 20;

/// What the proxy does to the controller-to-host stream.
struct Storm {
    /// Corrupt one chunk in this many (0: pass everything through).
    one_in: AtomicU64,
    seed: AtomicU64,
    mutations: AtomicU64,
    connections: AtomicUsize,
}

/// Forwards connections on a local port to `target`, passing host-to-controller bytes
/// through and damaging controller-to-host bytes as `storm` says.
fn proxy(target: SocketAddr, storm: Arc<Storm>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for host in listener.incoming() {
            let Ok(host) = host else { return };
            let Ok(ctrl) = TcpStream::connect(target) else {
                continue;
            };
            let n = storm.connections.fetch_add(1, Ordering::SeqCst) as u64;
            let (h2, c2) = (host.try_clone().unwrap(), ctrl.try_clone().unwrap());
            std::thread::spawn(move || pipe(host, ctrl, None));
            let storm = Arc::clone(&storm);
            std::thread::spawn(move || pipe(c2, h2, Some((storm, n))));
        }
    });
    addr
}

fn pipe(mut from: TcpStream, mut to: TcpStream, storm: Option<(Arc<Storm>, u64)>) {
    let mut rng = storm
        .as_ref()
        .map(|(s, n)| StdRng::seed_from_u64(s.seed.load(Ordering::SeqCst) ^ n));
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut chunk = buf[..n].to_vec();
        if let (Some((storm, _)), Some(rng)) = (&storm, rng.as_mut()) {
            let one_in = storm.one_in.load(Ordering::SeqCst);
            if one_in > 0 && rng.gen_range(0..one_in) == 0 {
                storm.mutations.fetch_add(1, Ordering::SeqCst);
                match rng.gen_range(0..4) {
                    0 | 1 => {
                        let i = rng.gen_range(0..chunk.len());
                        chunk[i] ^= 1 << rng.gen_range(0..8);
                    }
                    2 => chunk.truncate(rng.gen_range(0..chunk.len())),
                    _ => chunk.extend((0..rng.gen_range(1..100)).map(|_| rng.gen::<u8>())),
                }
                if rng.gen_bool(0.2) {
                    // A connection that dies mid-stream.
                    break;
                }
            }
        }
        if to.write_all(&chunk).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

fn expected(offset: u64, len: usize) -> AlignedBuf {
    let mut b = AlignedBuf::zeroed(len);
    for (i, chunk) in b.chunks_mut(8).enumerate() {
        let v = (offset / 8 + i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        chunk.copy_from_slice(&v.to_le_bytes()[..chunk.len()]);
    }
    b
}

#[test]
fn corrupted_and_cut_streams_never_return_wrong_data() {
    let panics = tessera_testkit::count_panics();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("drive.img");
    std::fs::File::create(&file)
        .and_then(|f| f.set_len(DRIVE_BYTES))
        .unwrap();
    let config = format!(
        r#"{{"hosts": [], "ports": [{{"portid": 1, "addr": {{"trtype": "tcp", "adrfam": "ipv4",
              "traddr": "127.0.0.1", "trsvcid": "0"}}, "subsystems": ["{SUBNQN}"]}}],
            "subsystems": [{{"nqn": "{SUBNQN}", "attr": {{"allow_any_host": "1"}},
              "namespaces": [{{"nsid": 1, "device": {{"path": "{}"}}}}]}}]}}"#,
        file.display()
    );
    let server = DriveServer::start(TargetConfig::from_json_str(&config).unwrap()).unwrap();
    let seed = std::env::var("TESSERA_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    println!("fuzz seed {seed}");
    let storm = Arc::new(Storm {
        one_in: AtomicU64::new(0),
        seed: AtomicU64::new(seed),
        mutations: AtomicU64::new(0),
        connections: AtomicUsize::new(0),
    });
    let via = proxy(server.local_addr(1).unwrap(), Arc::clone(&storm));

    let host = Host::new(HostIdentity {
        nqn: "nqn.2024-01.io.tessera:fuzzed-host".to_owned(),
        id: [0x5a; 16],
    });
    host.connect(ConnectOptions {
        ctrl_loss_tmo: Duration::from_secs(60),
        reconnect_delay: Duration::from_millis(50),
        keep_alive_tmo: Duration::from_secs(2),
        header_digest: true,
        data_digest: true,
        nr_io_queues: Some(2),
        ..ConnectOptions::new(via, SUBNQN)
    })
    .unwrap();
    let ns = host.namespace("nvme0n1").unwrap();
    ns.write_at(&expected(0, AREA_BYTES as usize), 0).unwrap();

    // The storm: one chunk in 40 from the controller is damaged, while four threads read
    // (and rewrite the same bytes, so the expected content never changes).
    // TESSERA_FUZZ_ONE_IN and TESSERA_FUZZ_SECONDS make it harsher or longer by hand.
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    storm.one_in.store(
        env("TESSERA_FUZZ_ONE_IN").unwrap_or(40).max(1),
        Ordering::SeqCst,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = mpsc::channel();
    for t in 0..4u64 {
        let (ns, stop, done_tx) = (Arc::clone(&ns), Arc::clone(&stop), done_tx.clone());
        std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(seed ^ (t + 1));
            let (mut ok, mut failed) = (0u64, 0u64);
            while !stop.load(Ordering::SeqCst) {
                let len = 4096 * rng.gen_range(1..17usize);
                let offset = 4096 * rng.gen_range(0..(AREA_BYTES - len as u64) / 4096);
                if rng.gen_bool(0.2) {
                    match ns.write_at(&expected(offset, len), offset) {
                        Ok(()) => ok += 1,
                        Err(_) => failed += 1,
                    }
                    continue;
                }
                let mut buf = AlignedBuf::zeroed(len);
                match ns.read_at(&mut buf, offset) {
                    Ok(()) => {
                        assert!(
                            buf[..] == expected(offset, len)[..],
                            "wrong data at {offset} (+{len}) returned as success (seed {seed})"
                        );
                        ok += 1;
                    }
                    Err(_) => failed += 1,
                }
            }
            done_tx.send((ok, failed)).unwrap();
        });
    }
    std::thread::sleep(Duration::from_secs(
        env("TESSERA_FUZZ_SECONDS").unwrap_or(4),
    ));
    stop.store(true, Ordering::SeqCst);
    let (mut ok, mut failed) = (0, 0);
    for _ in 0..4 {
        let (o, f) = done_rx
            .recv_timeout(Duration::from_secs(90))
            .expect("an I/O thread hangs");
        ok += o;
        failed += f;
    }
    let mutations = storm.mutations.load(Ordering::SeqCst);
    let connections = storm.connections.load(Ordering::SeqCst);
    println!("{ok} I/Os completed, {failed} failed, {mutations} chunks damaged, {connections} connections");
    assert!(mutations > 0 && connections > 3, "the storm did nothing");
    assert!(ok > 0, "no I/O got through the storm");

    // Calm again: the host recovers by itself and every byte is in place.
    storm.one_in.store(0, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !host.list()[0]
        .paths
        .iter()
        .any(|p| p.state == PathState::Live)
    {
        assert!(Instant::now() < deadline, "the path did not come back");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut back = AlignedBuf::zeroed(AREA_BYTES as usize);
    ns.read_at(&mut back, 0).unwrap();
    assert!(
        back[..] == expected(0, AREA_BYTES as usize)[..],
        "content differs"
    );
    assert_eq!(
        panics.load(Ordering::SeqCst),
        0,
        "a thread panicked (seed {seed})"
    );
    host.disconnect_all();
    server.shutdown();
}
