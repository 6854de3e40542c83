//! The drive server under live fuzzing: connections that complete a proper handshake and
//! then send mutated PDUs (bit flips, wrong lengths, cut short, random tails, out of order)
//! on admin and I/O queues. The server may answer with any status or drop the connection,
//! but no server thread panics, a well-behaved host is still served, and a namespace of a
//! subsystem the fuzzing host may not reach keeps its bytes.

mod target_util;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use target_util::*;
use tessera_nvme::target::{DriveServer, IoObserver, ObservedIo, TargetConfig};
use tessera_nvme::wire::command::{io_opcode, DsmRange, ReadWrite};
use tessera_nvme::wire::pdu::{encode_pdu, PduHeader};
use tessera_nvme::wire::{DataHeader, DigestConfig, SglDescriptor, Sqe};

const SENTINEL_NQN: &str = "nqn.2024-01.io.tessera:sentinel";
/// Connections per run in CI (about 2 s).
const ROUNDS: usize = 400;

fn config(dir: &std::path::Path) -> String {
    for name in ["fuzzed", "sentinel"] {
        std::fs::File::create(dir.join(name))
            .and_then(|f| f.set_len(NS_BYTES))
            .unwrap();
    }
    format!(
        r#"{{
      "hosts": [{{"nqn": "{HOST1}"}}, {{"nqn": "{HOST2}"}}],
      "ports": [{{"portid": 1,
                  "addr": {{"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": "0"}},
                  "param": {{"inline_data_size": "16384"}},
                  "subsystems": ["{SUBNQN}", "{SENTINEL_NQN}"]}}],
      "subsystems": [
        {{"nqn": "{SUBNQN}", "attr": {{"allow_any_host": "0"}}, "allowed_hosts": ["{HOST1}"],
          "namespaces": [{{"nsid": 1, "device": {{"path": "{}/fuzzed"}}}}]}},
        {{"nqn": "{SENTINEL_NQN}", "attr": {{"allow_any_host": "0"}}, "allowed_hosts": ["{HOST2}"],
          "namespaces": [{{"nsid": 1, "device": {{"path": "{}/sentinel"}}}}]}}
      ]
    }}"#,
        dir.display(),
        dir.display()
    )
}

/// Well-formed PDUs a host sends on an I/O queue, encoded; the fuzzer mutates them.
fn templates(rng: &mut StdRng) -> Vec<Vec<u8>> {
    let none = DigestConfig::NONE;
    let capsule = |sqe: Sqe, data: &[u8]| {
        encode_pdu(&PduHeader::CapsuleCmd(sqe), data, &none).expect("encodes")
    };
    let rw = |opcode, slba: u64, blocks: u32, dptr| {
        let mut sqe = ReadWrite::new(1, slba, blocks, false)
            .expect("valid")
            .to_sqe(opcode, rng_cid(slba));
        sqe.flags = 0x40;
        sqe.dptr = dptr;
        sqe
    };
    let slba = rng.gen_range(0..(NS_BYTES / 4096 - 64));
    let block: Vec<u8> = (0..4096).map(|_| rng.gen()).collect();
    let mut dsm = Sqe::new(0x09, 7);
    dsm.nsid = 1;
    dsm.cdw11 = 1 << 2;
    dsm.flags = 0x40;
    dsm.dptr = SglDescriptor::in_capsule(0, 16);
    let ranges = DsmRange::encode_list(&[DsmRange {
        context_attributes: 0,
        nlb: 8,
        slba,
    }]);
    let mut flush = Sqe::new(0x00, 9);
    flush.nsid = 1;
    vec![
        capsule(
            rw(io_opcode::READ, slba, 4, SglDescriptor::transport(16384)),
            &[],
        ),
        capsule(
            rw(
                io_opcode::WRITE,
                slba,
                1,
                SglDescriptor::in_capsule(0, 4096),
            ),
            &block,
        ),
        capsule(
            rw(io_opcode::WRITE, slba, 16, SglDescriptor::transport(65536)),
            &[],
        ),
        encode_pdu(
            &PduHeader::H2CData(DataHeader::h2c(rng_cid(slba), 0, 0, 4096, true)),
            &block,
            &none,
        )
        .expect("encodes"),
        capsule(dsm, &ranges),
        capsule(flush, &[]),
        capsule(Sqe::new(0x18, 3), &[]),
    ]
}

fn rng_cid(slba: u64) -> u16 {
    (slba % 60_000) as u16
}

/// One of: bit flips, a cut, a random tail, a corrupted length field, or random bytes.
fn mutate(rng: &mut StdRng, mut pdu: Vec<u8>) -> Vec<u8> {
    match rng.gen_range(0..6) {
        0 | 1 => {
            for _ in 0..rng.gen_range(1..8) {
                let i = rng.gen_range(0..pdu.len());
                pdu[i] ^= 1 << rng.gen_range(0..8);
            }
        }
        2 => pdu.truncate(rng.gen_range(0..pdu.len())),
        3 => pdu.extend((0..rng.gen_range(1..200)).map(|_| rng.gen::<u8>())),
        4 => {
            // PLEN (bytes 4..8) or HLEN/PDO: the framing fields.
            let i = rng.gen_range(2..8);
            pdu[i] = rng.gen();
        }
        _ => pdu = (0..rng.gen_range(1..300)).map(|_| rng.gen()).collect(),
    }
    pdu
}

/// Counts the drive I/Os the server shows an observer: begun, and ended.
#[derive(Debug, Default)]
struct Tally {
    begun: AtomicU64,
    ended: Arc<AtomicU64>,
}

struct Counted(Arc<AtomicU64>);

impl ObservedIo for Counted {
    fn end(self: Box<Self>, _ok: bool) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl IoObserver for Tally {
    fn begin(&self, _write: bool, _offset: u64, _bytes: u64, hostnqn: &str) -> Box<dyn ObservedIo> {
        assert_eq!(hostnqn, HOST1);
        self.begun.fetch_add(1, Ordering::SeqCst);
        Box::new(Counted(Arc::clone(&self.ended)))
    }
}

#[test]
fn mutated_pdus_on_live_connections_never_hurt_the_server() {
    let panics = tessera_testkit::count_panics();
    let dir = tempfile::tempdir().unwrap();
    let server =
        DriveServer::start(TargetConfig::from_json_str(&config(dir.path())).unwrap()).unwrap();
    let addr = server.local_addr(1).unwrap();
    // Every drive I/O the fuzzed namespace begins for a host also ends, whatever became
    // of its command or its connection.
    let tally = Arc::new(Tally::default());
    assert!(server.observe_io(SUBNQN, Arc::clone(&tally) as Arc<dyn IoObserver>));

    // The sentinel: HOST2's namespace in another subsystem, which HOST1 may not reach.
    let sentinel_admin = Client::admin(addr, SENTINEL_NQN, HOST2, HOSTID2, 0, false);
    let mut sentinel = Client::io_in(
        addr,
        SENTINEL_NQN,
        &sentinel_admin,
        1,
        (HOST2, HOSTID2),
        false,
    );
    let guard = pattern(64 << 10, 42);
    assert!(sentinel.write(1, 100, &guard, false).status().is_success());

    // TESSERA_FUZZ_SEED replays a failure; TESSERA_FUZZ_ROUNDS runs longer by hand.
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let seed = env("TESSERA_FUZZ_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let rounds = env("TESSERA_FUZZ_ROUNDS").map_or(ROUNDS, |r| r as usize);
    println!("fuzz seed {seed}, {rounds} rounds");
    let mut rng = StdRng::seed_from_u64(seed);
    for round in 0..rounds {
        let admin = Client::admin(addr, SUBNQN, HOST1, HOSTID1, 0, false);
        let mut io = if rng.gen_bool(0.8) {
            Client::io(addr, &admin, 1, HOST1, HOSTID1, false)
        } else {
            // Garbage on the admin queue itself.
            admin
        };
        let templates = templates(&mut rng);
        let mut bytes = Vec::new();
        for _ in 0..rng.gen_range(1..6) {
            let t = templates[rng.gen_range(0..templates.len())].clone();
            bytes.extend(if rng.gen_bool(0.7) {
                mutate(&mut rng, t)
            } else {
                t
            });
        }
        let stream = &mut io.stream;
        // The server may close the connection while this is being sent.
        let _ = stream.write_all(&bytes);
        let _ = stream.set_read_timeout(Some(Duration::from_millis(20)));
        let mut sink = [0u8; 65536];
        while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
        drop(io);
        if round % 50 == 49 {
            let admin = Client::admin(addr, SUBNQN, HOST1, HOSTID1, 0, false);
            let mut good = Client::io(addr, &admin, 1, HOST1, HOSTID1, false);
            let data = pattern(8192, round as u64);
            assert!(
                good.write(1, 2000, &data, true).status().is_success(),
                "round {round}"
            );
            assert_eq!(good.read(1, 2000, 2).data, data, "round {round}");
        }
    }
    let port = &server.stats().ports[0];
    println!(
        "{} connections, {} commands, {} error completions",
        port.connections_total, port.commands, port.errors
    );
    assert!(port.connections_total as usize > rounds);
    assert_eq!(
        sentinel.read(1, 100, 16).data,
        guard,
        "the sentinel namespace changed"
    );
    assert_eq!(
        panics.load(Ordering::SeqCst),
        0,
        "a thread panicked (seed {seed})"
    );
    let settled = Instant::now() + Duration::from_secs(10);
    while tally.ended.load(Ordering::SeqCst) != tally.begun.load(Ordering::SeqCst)
        && Instant::now() < settled
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let (begun, ended) = (
        tally.begun.load(Ordering::SeqCst),
        tally.ended.load(Ordering::SeqCst),
    );
    assert!(begun > 0, "no drive I/O observed (seed {seed})");
    assert_eq!(begun, ended, "observed I/Os left unended (seed {seed})");
    drop((sentinel, sentinel_admin));
    server.shutdown();
}
