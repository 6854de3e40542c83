//! Throughput of a namespace through the host and the drive server over loopback, against
//! the same file opened locally with O_DIRECT. Ignored by default (it measures, it does not
//! check much); run with
//! `cargo test --release -p tessera-nvme --test host_perf -- --ignored --nocapture`.
//! `TESSERA_PERF_DIR` chooses the directory of the test file (default: the temp dir).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_drive::{AlignedBuf, BlockDevice, FileDrive};
use tessera_nvme::host::{ConnectOptions, Host, HostIdentity};
use tessera_nvme::target::config::TargetConfig;
use tessera_nvme::target::DriveServer;

const SUBNQN: &str = "nqn.2024-01.io.tessera:perf";
const FILE_BYTES: u64 = 1 << 30;
const RUN: Duration = Duration::from_secs(3);

fn sequential(dev: &dyn BlockDevice, write: bool, threads: u64) -> f64 {
    let done = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let done = &done;
            s.spawn(move || {
                let mut buf = AlignedBuf::zeroed(1 << 20);
                buf.fill(t as u8 + 1);
                let span = FILE_BYTES / threads;
                let mut offset = t * span;
                while start.elapsed() < RUN {
                    if write {
                        dev.write_at(&buf, offset).unwrap();
                    } else {
                        dev.read_at(&mut buf, offset).unwrap();
                    }
                    offset += 1 << 20;
                    if offset + (1 << 20) > (t + 1) * span {
                        offset = t * span;
                    }
                    done.fetch_add(1 << 20, Ordering::Relaxed);
                }
            });
        }
    });
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64() / f64::from(1 << 20)
}

fn random_reads(dev: &dyn BlockDevice, qd: u64) -> f64 {
    let done = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..qd {
            let done = &done;
            s.spawn(move || {
                let mut buf = AlignedBuf::zeroed(4096);
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1);
                let blocks = FILE_BYTES / 4096;
                while start.elapsed() < RUN {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    dev.read_at(&mut buf, (x % blocks) * 4096).unwrap();
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

#[test]
#[ignore = "performance measurement"]
fn loopback_versus_local_o_direct() {
    let base = std::env::var_os("TESSERA_PERF_DIR").map_or_else(std::env::temp_dir, Into::into);
    let dir = tempfile::tempdir_in(base).unwrap();
    let file = dir.path().join("perf.img");
    std::fs::File::create(&file)
        .unwrap()
        .set_len(FILE_BYTES)
        .unwrap();
    let local = FileDrive::open(&file).unwrap();
    // Fill once so reads hit allocated blocks on both sides.
    sequential(&local, true, 1);
    let config = format!(
        r#"{{"ports": [{{"portid": 1, "addr": {{"trtype": "tcp", "adrfam": "ipv4",
               "traddr": "127.0.0.1", "trsvcid": "0"}}, "subsystems": ["{SUBNQN}"]}}],
             "subsystems": [{{"nqn": "{SUBNQN}", "attr": {{"allow_any_host": "1"}},
               "namespaces": [{{"nsid": 1, "device": {{"path": "{}"}}}}]}}]}}"#,
        file.display()
    );
    let server = DriveServer::start(TargetConfig::from_json_str(&config).unwrap()).unwrap();
    let addr = server.local_addrs()[0].1;
    let host = Host::new(HostIdentity {
        nqn: "nqn.2024-01.io.tessera:perf-host".into(),
        id: [7; 16],
    });
    host.connect(ConnectOptions::new(addr, SUBNQN)).unwrap();
    let remote: Arc<dyn BlockDevice> = host.namespace("nvme0n1").unwrap();
    let rows = [
        (
            "1 MiB seq write, 1 thread (MiB/s)",
            sequential(&local, true, 1),
            sequential(&*remote, true, 1),
        ),
        (
            "1 MiB seq read, 1 thread (MiB/s)",
            sequential(&local, false, 1),
            sequential(&*remote, false, 1),
        ),
        (
            "1 MiB seq write, 4 threads (MiB/s)",
            sequential(&local, true, 4),
            sequential(&*remote, true, 4),
        ),
        (
            "1 MiB seq read, 4 threads (MiB/s)",
            sequential(&local, false, 4),
            sequential(&*remote, false, 4),
        ),
        (
            "4 KiB random read QD32 (IOPS)",
            random_reads(&local, 32),
            random_reads(&*remote, 32),
        ),
    ];
    for (what, l, r) in rows {
        println!(
            "{what:40} local {l:10.0}  nvme/tcp {r:10.0}  {:5.1}%",
            100.0 * r / l
        );
    }
    drop(remote);
    host.disconnect_all();
    server.shutdown();
}
