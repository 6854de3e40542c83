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
    /// One thread keeps `threads` reads in flight: io_uring locally, submitted reads
    /// (`MultipathNamespace::submit_read`, restarted in batches) remotely.
    submitted: bool,
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
    let remote_ns = host
        .namespace("nvme0n1")
        .ok_or_else(|| anyhow!("the drive server exported no namespace"))?;
    let remote: Arc<dyn BlockDevice> = remote_ns.clone();
    let local: Arc<dyn BlockDevice> = Arc::new(FileDrive::open(&file)?);
    let qd = a.queue_depth;
    let workloads = [
        Workload {
            name: "seq write 1 MiB, QD1",
            io_bytes: 1 << 20,
            threads: 1,
            write: true,
            random: false,
            submitted: false,
        },
        Workload {
            name: "seq read 1 MiB, QD1",
            io_bytes: 1 << 20,
            threads: 1,
            write: false,
            random: false,
            submitted: false,
        },
        Workload {
            name: "seq write 1 MiB, QD4",
            io_bytes: 1 << 20,
            threads: 4,
            write: true,
            random: false,
            submitted: false,
        },
        Workload {
            name: "seq read 1 MiB, QD4",
            io_bytes: 1 << 20,
            threads: 4,
            write: false,
            random: false,
            submitted: false,
        },
        Workload {
            name: "rand read 4 KiB",
            io_bytes: 4096,
            threads: qd,
            write: false,
            random: true,
            submitted: false,
        },
        Workload {
            name: "rand read 4 KiB, 1 thread",
            io_bytes: 4096,
            threads: qd,
            write: false,
            random: true,
            submitted: true,
        },
        Workload {
            name: "rand write 4 KiB",
            io_bytes: 4096,
            threads: qd,
            write: true,
            random: true,
            submitted: false,
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
            if w.submitted {
                if !a.remote_only {
                    l.push(local_uring_reads(&file, w.threads, a.file_bytes, run)?);
                } else {
                    l.push(Sample::default());
                }
                r.push(remote_submitted_reads(
                    &remote_ns,
                    w.threads,
                    a.file_bytes,
                    run,
                )?);
                continue;
            }
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
    drop(remote_ns);
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
    debug_assert_eq!(
        bytes.load(Ordering::Relaxed),
        (latencies.len() * w.io_bytes) as u64
    );
    sample(&mut latencies, secs, w.io_bytes)
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

/// A 4 KiB-aligned random offset in a file of `file_bytes` (xorshift).
fn random_offset(x: &mut u64, file_bytes: u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    (*x % (file_bytes / 4096)) * 4096
}

fn sample(latencies: &mut [u32], secs: f64, io_bytes: usize) -> Sample {
    latencies.sort_unstable();
    let pct = |p: f64| -> u64 {
        if latencies.is_empty() {
            return 0;
        }
        let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
        u64::from(latencies[i])
    };
    Sample {
        mb_s: (latencies.len() * io_bytes) as f64 / secs / 1e6,
        iops: latencies.len() as f64 / secs,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
    }
}

fn micros(since: Instant) -> u32 {
    since.elapsed().as_micros().min(u128::from(u32::MAX)) as u32
}

/// One thread keeping `qd` random 4 KiB O_DIRECT reads in flight on io_uring, as fio
/// does with `--ioengine=io_uring --iodepth=QD`.
fn local_uring_reads(file: &Path, qd: usize, file_bytes: u64, run: Duration) -> Result<Sample> {
    use io_uring::{opcode, types, IoUring};
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(file)
        .with_context(|| format!("cannot open {} with O_DIRECT", file.display()))?;
    let mut ring = IoUring::new(u32::try_from(qd * 2)?).context("io_uring setup")?;
    let mut bufs: Vec<AlignedBuf> = (0..qd).map(|_| AlignedBuf::zeroed(4096)).collect();
    let mut started = vec![Instant::now(); qd];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut latencies = Vec::with_capacity(1 << 18);
    let submit = |ring: &mut IoUring, buf: &mut AlignedBuf, i: usize, offset: u64| {
        let sqe = opcode::Read::new(types::Fd(f.as_raw_fd()), buf.as_mut_ptr(), 4096)
            .offset(offset)
            .build()
            .user_data(i as u64);
        // SAFETY: the buffer stays in `bufs`, untouched, until its completion is reaped
        // (every read is reaped before this function returns).
        unsafe { ring.submission().push(&sqe) }.expect("the ring holds qd entries");
    };
    let start = Instant::now();
    for (i, buf) in bufs.iter_mut().enumerate() {
        submit(&mut ring, buf, i, random_offset(&mut x, file_bytes));
        started[i] = Instant::now();
    }
    let mut in_flight = qd;
    let mut failed = None;
    while in_flight > 0 {
        ring.submit_and_wait(1).context("io_uring_enter")?;
        let done: Vec<(usize, i32)> = ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        for (i, res) in done {
            in_flight -= 1;
            if res != 4096 {
                failed.get_or_insert(res);
                continue;
            }
            latencies.push(micros(started[i]));
            if start.elapsed() < run && failed.is_none() {
                submit(
                    &mut ring,
                    &mut bufs[i],
                    i,
                    random_offset(&mut x, file_bytes),
                );
                started[i] = Instant::now();
                in_flight += 1;
            }
        }
    }
    if let Some(res) = failed {
        bail!(
            "local io_uring read failed: {}",
            std::io::Error::from_raw_os_error(-res)
        );
    }
    Ok(sample(&mut latencies, start.elapsed().as_secs_f64(), 4096))
}

/// One thread keeping `qd` random 4 KiB reads in flight through the host
/// (`MultipathNamespace::submit_read`; the reads restarted per wake-up go as one batch).
fn remote_submitted_reads(
    ns: &tessera_nvme::host::MultipathNamespace,
    qd: usize,
    file_bytes: u64,
    run: Duration,
) -> Result<Sample> {
    use tessera_nvme::host::completion::Completions;
    let cq = Completions::new(Duration::from_secs(30));
    let mut offsets = vec![0u64; qd];
    let mut started = vec![Instant::now(); qd];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut latencies = Vec::with_capacity(1 << 18);
    let start = Instant::now();
    for i in 0..qd {
        offsets[i] = random_offset(&mut x, file_bytes);
        started[i] = Instant::now();
        ns.submit_read(AlignedBuf::zeroed(4096), offsets[i], i as u64, &cq)?;
    }
    let mut in_flight = qd;
    while in_flight > 0 {
        // The reads started again for the completions of one wake-up leave together, as
        // fio's io_uring engine submits them in one io_uring_enter.
        let mut batch = ns.read_batch(&cq);
        for c in cq.wait(Duration::from_secs(30)) {
            in_flight -= 1;
            let i = c.tag as usize;
            let buf = ns.finish_read(c, offsets[i])?;
            latencies.push(micros(started[i]));
            if start.elapsed() < run {
                offsets[i] = random_offset(&mut x, file_bytes);
                started[i] = Instant::now();
                batch.read(buf, offsets[i], i as u64)?;
                in_flight += 1;
            }
        }
        batch.submit();
    }
    Ok(sample(&mut latencies, start.elapsed().as_secs_f64(), 4096))
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
