//! Throughput sanity check of the drive server over loopback against local `FileDrive`
//! I/O on the same file (ignored by default; run with
//! `cargo test --release -p tessera-nvme --test target_perf -- --ignored --nocapture`).

mod target_util;

use std::sync::Arc;
use std::time::{Duration, Instant};

use target_util::*;
use tessera_drive::{AlignedBuf, BlockDevice, FileDrive};
use tessera_nvme::wire::command::{io_opcode, ReadWrite};
use tessera_nvme::wire::PduHeader;

const RUN: Duration = Duration::from_secs(3);

fn remote(io: &mut Client, blocks: u32, qd: usize, random: bool) -> f64 {
    let total_blocks = NS_BYTES / 4096;
    let mut x = 0x1234_5678u64;
    let mut next = move |i: u64| {
        if random {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % (total_blocks / u64::from(blocks))) * u64::from(blocks)
        } else {
            (i * u64::from(blocks)) % total_blocks
        }
    };
    let start = Instant::now();
    let (mut sent, mut done) = (0u64, 0u64);
    let mut submit = |io: &mut Client, sent: &mut u64| {
        let rw = ReadWrite::new(1, next(*sent), blocks, false).unwrap();
        io.send_capsule(
            rw.to_sqe(io_opcode::READ, 0),
            None,
            false,
            blocks as usize * 4096,
        );
        *sent += 1;
    };
    for _ in 0..qd {
        submit(io, &mut sent);
    }
    while start.elapsed() < RUN {
        if let PduHeader::CapsuleResp(cqe) = io.next_pdu().unwrap().header {
            assert!(cqe.status.is_success());
            done += 1;
            submit(io, &mut sent);
        }
    }
    while done < sent {
        if let PduHeader::CapsuleResp(_) = io.next_pdu().unwrap().header {
            done += 1;
        }
    }
    done as f64 * f64::from(blocks) * 4096.0 / start.elapsed().as_secs_f64()
}

fn local(dev: &Arc<FileDrive>, blocks: u32, qd: usize, random: bool) -> f64 {
    let total_blocks = NS_BYTES / 4096;
    let start = Instant::now();
    let threads: Vec<_> = (0..qd)
        .map(|t| {
            let dev = Arc::clone(dev);
            std::thread::spawn(move || {
                let mut buf = AlignedBuf::zeroed(blocks as usize * 4096);
                let mut x = 0x9e37_79b9u64 + t as u64;
                let mut n = 0u64;
                while start.elapsed() < RUN {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let lba = if random {
                        (x % (total_blocks / u64::from(blocks))) * u64::from(blocks)
                    } else {
                        ((n * qd as u64 + t as u64) * u64::from(blocks)) % total_blocks
                    };
                    dev.read_at(&mut buf, lba * 4096).unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    let n: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    n as f64 * f64::from(blocks) * 4096.0 / start.elapsed().as_secs_f64()
}

#[test]
#[ignore = "benchmark"]
fn loopback_throughput_against_local() {
    let f = Fixture::new();
    let dev = Arc::new(FileDrive::open(&f.dir.path().join("d1")).unwrap());
    let data = AlignedBuf::from_slice(&pattern(1 << 20, 5));
    for off in (0..NS_BYTES).step_by(1 << 20) {
        dev.write_at(&data, off).unwrap();
    }
    let mut admin = f.admin();
    let t = Instant::now();
    for _ in 0..1000 {
        admin.command(tessera_nvme::wire::Sqe::new(0x18, 0), None, false, 0);
    }
    println!("keep-alive round trip: {:?}", t.elapsed() / 1000);
    let mut io = Client::io(f.addr(1), &admin, 1, HOST1, HOSTID1, false);
    let cases = [
        ("4 KiB rand QD1", 1, 1, true),
        ("4 KiB rand QD32", 1, 32, true),
        ("1 MiB seq QD32", 256, 32, false),
    ];
    for (name, blocks, qd, random) in cases {
        let l = local(&dev, blocks, qd, random);
        let r = remote(&mut io, blocks, qd, random);
        println!(
            "{name}: local {:.0} MB/s, remote {:.0} MB/s ({:.0}%)",
            l / 1e6,
            r / 1e6,
            100.0 * r / l
        );
    }
}
