//! `tessera bench nvme`: one file measured twice in the same run, locally with O_DIRECT
//! and through NVMe/TCP over loopback (a `tessera drive-server` child process exporting the
//! file, this process as the host), so the ratio says what the transport costs whatever
//! the machine's disk does that minute. Rounds alternate local and remote; medians are
//! reported.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tessera_drive::{AlignedBuf, BlockDevice, FileDrive};
use tessera_nvme::host::{ConnectOptions, Host, HostIdentity};

use crate::output::{Table, YRecord};

const SUBNQN: &str = "nqn.2026-11.io.tessera:bench";

pub struct NvmeBenchArgs<'a> {
    pub dir: &'a Path,
    pub file_bytes: u64,
    pub seconds: u64,
    pub rounds: usize,
    pub queue_depth: usize,
    /// Only the workloads whose name contains this text.
    pub only: Option<&'a str>,
    /// Skip the local O_DIRECT runs (for profiling the transport alone).
    pub remote_only: bool,
    /// The benchmark's own buffers (local and remote) on huge pages; by default they are
    /// on base pages, as fio's are.
    pub huge_buffers: bool,
    pub machine: bool,
}

/// One workload: how many threads, how large each I/O, read or write, sequential or not.
#[derive(Clone, Copy)]
struct Workload {
    name: &'static str,
    io_bytes: usize,
    threads: usize,
    write: bool,
    random: bool,
}

/// The result of one workload on one device: bytes/s, IOPS and latency percentiles.
#[derive(Clone, Copy, Default)]
struct Sample {
    mb_s: f64,
    iops: f64,
    p50_us: u64,
    p99_us: u64,
}

/// The drive-server child; killed on drop so a failed run leaves no process behind.
struct ServerChild(Child);

impl Drop for ServerChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn nvme(a: &NvmeBenchArgs) -> Result<()> {
    if a.file_bytes < (64 << 20) || !a.file_bytes.is_multiple_of(1 << 20) {
        bail!("--size: use a whole number of MiB, at least 64M");
    }
    if a.queue_depth == 0 || a.queue_depth > 256 {
        bail!("--qd {}: use 1 to 256", a.queue_depth);
    }
    std::fs::create_dir_all(a.dir).with_context(|| format!("cannot create {}", a.dir.display()))?;
    let file = a.dir.join("tessera-bench-nvme.dat");
    prepare_file(&file, a.file_bytes)?;
    let (_server, port) = start_server(a.dir, &file)?;
    let host = Host::new(HostIdentity::generate()?);
    let addr = format!("127.0.0.1:{port}").parse()?;
    let mut opts = ConnectOptions::new(addr, SUBNQN);
    opts.queue_size = 128;
    host.connect(opts)
        .map_err(|e| anyhow!("connecting to the drive server: {e}"))?;
    let remote: Arc<dyn BlockDevice> = host
        .namespace("nvme0n1")
        .ok_or_else(|| anyhow!("the drive server exported no namespace"))?;
    let local: Arc<dyn BlockDevice> = Arc::new(FileDrive::open(&file)?);
    let qd = a.queue_depth;
    let workloads = [
        Workload {
            name: "seq write 1 MiB, QD1",
            io_bytes: 1 << 20,
            threads: 1,
            write: true,
            random: false,
        },
        Workload {
            name: "seq read 1 MiB, QD1",
            io_bytes: 1 << 20,
            threads: 1,
            write: false,
            random: false,
        },
        Workload {
            name: "seq write 1 MiB, QD4",
            io_bytes: 1 << 20,
            threads: 4,
            write: true,
            random: false,
        },
        Workload {
            name: "seq read 1 MiB, QD4",
            io_bytes: 1 << 20,
            threads: 4,
            write: false,
            random: false,
        },
        Workload {
            name: "rand read 4 KiB",
            io_bytes: 4096,
            threads: qd,
            write: false,
            random: true,
        },
        Workload {
            name: "rand write 4 KiB",
            io_bytes: 4096,
            threads: qd,
            write: true,
            random: true,
        },
    ];
    let run = Duration::from_secs(a.seconds.max(1));
    let mut rows = Vec::new();
    for w in workloads
        .iter()
        .filter(|w| a.only.is_none_or(|o| w.name.contains(o)))
    {
        let (mut l, mut r) = (Vec::new(), Vec::new());
        for _ in 0..a.rounds.max(1) {
            if !a.remote_only {
                l.push(measure(
                    local.as_ref(),
                    w,
                    a.file_bytes,
                    run,
                    a.huge_buffers,
                ));
            } else {
                l.push(Sample::default());
            }
            r.push(measure(
                remote.as_ref(),
                w,
                a.file_bytes,
                run,
                a.huge_buffers,
            ));
        }
        rows.push((w.name, w.threads, median(&mut l), median(&mut r)));
    }
    drop(remote);
    host.disconnect_all();
    report(&rows, a.machine);
    let _ = std::fs::remove_file(&file);
    Ok(())
}

/// Writes the whole file once so reads hit allocated blocks on both paths.
fn prepare_file(path: &Path, bytes: u64) -> Result<()> {
    let f =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    f.set_len(bytes)?;
    drop(f);
    let d = FileDrive::open(path)?;
    let mut buf = AlignedBuf::zeroed(1 << 20);
    buf.fill(0x5a);
    let mut off = 0;
    while off < bytes {
        d.write_at(&buf, off)?;
        off += 1 << 20;
    }
    d.flush()?;
    Ok(())
}

fn start_server(dir: &Path, file: &Path) -> Result<(ServerChild, u16)> {
    let config: PathBuf = dir.join("tessera-bench-nvme.json");
    let text = format!(
        r#"{{"hosts":[],"ports":[{{"portid":1,"addr":{{"trtype":"tcp","adrfam":"ipv4","traddr":"127.0.0.1","trsvcid":"0"}},"subsystems":["{SUBNQN}"],"ana_groups":[{{"grpid":1,"ana":{{"state":"optimized"}}}}],"referrals":[]}}],"subsystems":[{{"nqn":"{SUBNQN}","attr":{{"allow_any_host":"1"}},"allowed_hosts":[],"namespaces":[{{"nsid":1,"enable":1,"device":{{"path":"{}"}},"ana_grpid":1}}]}}]}}"#,
        file.display()
    );
    std::fs::write(&config, text)?;
    let exe = std::env::current_exe().context("cannot find the tessera binary")?;
    let mut child = Command::new(exe)
        .args(["drive-server", "-c"])
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start the drive server")?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let child = ServerChild(child);
    let mut port = None;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        // The port table: "   1  127.0.0.1:PORT".
        if let Some(p) = line
            .rsplit(':')
            .next()
            .and_then(|p| p.trim().parse::<u16>().ok())
        {
            port = Some(p);
        }
        if line.contains("drive server running") {
            break;
        }
    }
    let port = port.ok_or_else(|| anyhow!("the drive server did not report its port"))?;
    Ok((child, port))
}

fn measure(
    dev: &dyn BlockDevice,
    w: &Workload,
    file_bytes: u64,
    run: Duration,
    huge: bool,
) -> Sample {
    let stop = AtomicBool::new(false);
    let bytes = AtomicU64::new(0);
    let start = Instant::now();
    let mut latencies: Vec<u32> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..w.threads)
            .map(|t| {
                let (stop, bytes) = (&stop, &bytes);
                s.spawn(move || worker(dev, w, t, file_bytes, stop, bytes, huge))
            })
            .collect();
        std::thread::sleep(run);
        stop.store(true, Ordering::Relaxed);
        workers
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let secs = start.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let pct = |p: f64| -> u64 {
        if latencies.is_empty() {
            return 0;
        }
        let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
        u64::from(latencies[i])
    };
    Sample {
        mb_s: bytes.load(Ordering::Relaxed) as f64 / secs / 1e6,
        iops: latencies.len() as f64 / secs,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
    }
}

/// One thread of a workload; returns each I/O's latency in µs. An I/O error ends the
/// thread (the error shows as a low rate; a benchmark is not a test).
fn worker(
    dev: &dyn BlockDevice,
    w: &Workload,
    t: usize,
    file_bytes: u64,
    stop: &AtomicBool,
    bytes: &AtomicU64,
    huge: bool,
) -> Vec<u32> {
    // Base pages by default, like fio's buffers: a local 1 MiB O_DIRECT request then
    // leaves the guest as two (254 segments each at most). With huge pages it is one,
    // which on a virtual disk served from the host's cache roughly doubles local speed.
    let mut buf = if huge {
        AlignedBuf::for_io(w.io_bytes)
    } else {
        AlignedBuf::zeroed(w.io_bytes)
    };
    buf.fill(t as u8 + 1);
    let io = w.io_bytes as u64;
    let slots = file_bytes / io;
    let span = slots / w.threads as u64;
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t as u64 + 1);
    let mut i = 0u64;
    let mut lat = Vec::with_capacity(1 << 16);
    while !stop.load(Ordering::Relaxed) {
        let slot = if w.random {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % slots
        } else {
            t as u64 * span + i % span.max(1)
        };
        i += 1;
        let t0 = Instant::now();
        let r = if w.write {
            dev.write_at(&buf, slot * io)
        } else {
            dev.read_at(&mut buf, slot * io)
        };
        if r.is_err() {
            break;
        }
        lat.push(t0.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
        bytes.fetch_add(io, Ordering::Relaxed);
    }
    lat
}

fn median(v: &mut [Sample]) -> Sample {
    v.sort_by(|a, b| a.mb_s.total_cmp(&b.mb_s));
    v[v.len() / 2]
}

/// Remote over local; "-" when there was no local run (`--remote-only`).
fn ratio(local: &Sample, remote: &Sample) -> String {
    if local.mb_s > 0.0 {
        format!("{:.2}", remote.mb_s / local.mb_s)
    } else {
        "-".to_string()
    }
}

fn report(rows: &[(&str, usize, Sample, Sample)], machine: bool) {
    if machine {
        let y = YRecord::new("bench", "nvme");
        println!(
            "{}",
            y.header(&[
                "workload",
                "queueDepth",
                "localMBps",
                "remoteMBps",
                "localIops",
                "remoteIops",
                "ratio",
                "localP50Us",
                "localP99Us",
                "remoteP50Us",
                "remoteP99Us"
            ])
        );
        for (name, qd, l, r) in rows {
            println!(
                "{}",
                y.data(&[
                    name.to_string(),
                    qd.to_string(),
                    format!("{:.1}", l.mb_s),
                    format!("{:.1}", r.mb_s),
                    format!("{:.0}", l.iops),
                    format!("{:.0}", r.iops),
                    ratio(l, r),
                    l.p50_us.to_string(),
                    l.p99_us.to_string(),
                    r.p50_us.to_string(),
                    r.p99_us.to_string(),
                ])
            );
        }
        return;
    }
    let mut t = Table::new(&[
        "workload",
        "QD",
        "local MB/s",
        "NVMe/TCP MB/s",
        "local IOPS",
        "NVMe/TCP IOPS",
        "ratio",
        "local p50/p99 us",
        "NVMe/TCP p50/p99 us",
    ])
    .right(&[1, 2, 3, 4, 5, 6]);
    for (name, qd, l, r) in rows {
        t.row(vec![
            name.to_string(),
            qd.to_string(),
            format!("{:.1}", l.mb_s),
            format!("{:.1}", r.mb_s),
            format!("{:.0}", l.iops),
            format!("{:.0}", r.iops),
            ratio(l, r),
            format!("{}/{}", l.p50_us, l.p99_us),
            format!("{}/{}", r.p50_us, r.p99_us),
        ]);
    }
    print!("{}", t.render());
}
