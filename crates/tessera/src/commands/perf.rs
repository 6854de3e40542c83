//! `tessera perf net`: a network test between nodes in the manner of nsdperf, to tell a
//! network problem from a storage problem. One or more nodes run `perf net server`; a
//! node runs `perf net run -s A,B,...` which opens `--threads` connections to every server
//! and streams read or write requests of `--size` bytes for `--seconds`, then prints MB/s
//! and latency percentiles per server and in total. Running `run` on several nodes at
//! once against the same servers gives the many-to-many pattern.
//!
//! The protocol is deliberately trivial and bounded: a 16-byte request header (magic
//! `TPRF`, op 1 = write / 2 = read, size u32 ≤ 16 MiB, 4 reserved bytes, little endian);
//! a write sends `size` bytes after the header and gets a 4-byte ack; a read gets `size`
//! bytes back. Anything else closes the connection.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use super::nvme::resolve;
use crate::output::{Table, YRecord};

const MAGIC: &[u8; 4] = b"TPRF";
const OP_WRITE: u32 = 1;
const OP_READ: u32 = 2;
/// The largest request: bounds the server's buffer whatever a peer sends.
pub const REQUEST_BYTES_MAX: u32 = 16 << 20;
/// Connections one server serves at once.
const CONNECTIONS_MAX: usize = 256;
/// The default TCP port, next to nsdperf's 6668.
pub const PERF_PORT: u16 = 6669;
/// Where `perf net server` listens without an address.
pub const LISTEN_DEFAULT: &str = "0.0.0.0:6669";

fn header(op: u32, size: u32) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(MAGIC);
    h[4..8].copy_from_slice(&op.to_le_bytes());
    h[8..12].copy_from_slice(&size.to_le_bytes());
    h
}

/// Decodes a request header: (op, size), or what is wrong with it.
fn parse_header(h: &[u8; 16]) -> Result<(u32, u32)> {
    if &h[..4] != MAGIC {
        bail!("bad magic {:02x?}: not a perf client", &h[..4]);
    }
    let op = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    let size = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if op != OP_WRITE && op != OP_READ {
        bail!("unknown op {op}");
    }
    if size == 0 || size > REQUEST_BYTES_MAX {
        bail!("request size {size} outside 1..={REQUEST_BYTES_MAX}");
    }
    Ok((op, size))
}

/// Serves perf clients until the process is stopped.
pub fn server(listen: &str) -> Result<()> {
    let addr = parse_listen(listen)?;
    let listener = TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
    println!("perf net server listening on {}", listener.local_addr()?);
    let active = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        if active.load(Ordering::Relaxed) >= CONNECTIONS_MAX {
            continue;
        }
        active.fetch_add(1, Ordering::Relaxed);
        let active = Arc::clone(&active);
        std::thread::spawn(move || {
            let peer = stream.peer_addr().ok();
            if let Err(e) = serve(stream) {
                eprintln!("perf net server: client {peer:?}: {e}; connection closed");
            }
            active.fetch_sub(1, Ordering::Relaxed);
        });
    }
    Ok(())
}

fn parse_listen(listen: &str) -> Result<SocketAddr> {
    if let Ok(a) = listen.parse::<SocketAddr>() {
        return Ok(a);
    }
    resolve(listen, PERF_PORT)
}

fn serve(mut stream: TcpStream) -> Result<()> {
    stream.set_nodelay(true)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let mut h = [0u8; 16];
        match stream.read_exact(&mut h) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let (op, size) = parse_header(&h)?;
        let size = size as usize;
        if buf.len() < size {
            buf.resize(size, 0);
        }
        if op == OP_WRITE {
            stream.read_exact(&mut buf[..size])?;
            stream.write_all(&0u32.to_le_bytes())?;
        } else {
            stream.write_all(&buf[..size])?;
        }
    }
}

/// Request latencies in power-of-two microsecond buckets: enough to see a tail, bounded.
#[derive(Clone, Default)]
struct Histogram {
    buckets: [u64; 32],
    count: u64,
    max_us: u64,
}

impl Histogram {
    fn record(&mut self, d: Duration) {
        let us = d.as_micros().min(u128::from(u64::MAX)) as u64;
        let b = (64 - us.leading_zeros()).min(31) as usize;
        self.buckets[b] += 1;
        self.count += 1;
        self.max_us = self.max_us.max(us);
    }

    fn merge(&mut self, o: &Histogram) {
        for (a, b) in self.buckets.iter_mut().zip(o.buckets) {
            *a += b;
        }
        self.count += o.count;
        self.max_us = self.max_us.max(o.max_us);
    }

    /// The upper bound of the bucket holding the `pct` percentile.
    fn percentile_us(&self, pct: f64) -> u64 {
        let want = ((self.count as f64) * pct / 100.0).ceil() as u64;
        let mut seen = 0;
        for (b, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= want.max(1) {
                return if b == 0 {
                    1
                } else {
                    (1u64 << b).min(self.max_us.max(1))
                };
            }
        }
        self.max_us
    }
}

pub struct RunArgs<'a> {
    pub servers: &'a [String],
    pub op: &'a str,
    pub size: u32,
    pub threads: usize,
    pub seconds: u64,
    pub machine: bool,
}

/// Measures every server with `threads` connections each, all at once.
pub fn run(a: &RunArgs) -> Result<()> {
    let op = match a.op {
        "read" => OP_READ,
        "write" => OP_WRITE,
        other => bail!("--op {other}: use read or write"),
    };
    if a.size == 0 || a.size > REQUEST_BYTES_MAX {
        bail!("--size: use 1 byte to 16 MiB");
    }
    if a.threads == 0 || a.threads > 64 {
        bail!("--threads {}: use 1 to 64", a.threads);
    }
    if a.servers.is_empty() {
        bail!("-s: name at least one server (ADDR[:PORT])");
    }
    let addrs: Vec<SocketAddr> = a
        .servers
        .iter()
        .map(|s| parse_listen(s).or_else(|_| resolve(s, PERF_PORT)))
        .collect::<Result<_>>()?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for (si, addr) in addrs.iter().enumerate() {
        for _ in 0..a.threads {
            let stream = TcpStream::connect_timeout(addr, Duration::from_secs(5))
                .map_err(|e| anyhow!("{addr}: {e}; is `tessera perf net server` running there?"))?;
            let stop = Arc::clone(&stop);
            let size = a.size;
            workers.push((
                si,
                std::thread::spawn(move || client(stream, op, size, &stop)),
            ));
        }
    }
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(a.seconds.max(1)));
    stop.store(true, Ordering::Relaxed);
    let mut per_server = vec![(0u64, Histogram::default()); addrs.len()];
    let mut errors = Vec::new();
    for (si, w) in workers {
        match w.join().map_err(|_| anyhow!("perf thread panicked"))? {
            Ok((bytes, h)) => {
                per_server[si].0 += bytes;
                per_server[si].1.merge(&h);
            }
            Err(e) => errors.push(format!("{}: {e}", addrs[si])),
        }
    }
    let secs = started.elapsed().as_secs_f64();
    report(a, &addrs, &per_server, secs);
    if !errors.is_empty() {
        bail!(
            "{} connection(s) failed: {}",
            errors.len(),
            errors.join("; ")
        );
    }
    Ok(())
}

fn client(mut s: TcpStream, op: u32, size: u32, stop: &AtomicBool) -> Result<(u64, Histogram)> {
    s.set_nodelay(true)?;
    let mut buf = vec![0xa5u8; size as usize];
    let mut h = Histogram::default();
    let mut bytes = 0u64;
    let hdr = header(op, size);
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        s.write_all(&hdr)?;
        if op == OP_WRITE {
            s.write_all(&buf)?;
            let mut ack = [0u8; 4];
            s.read_exact(&mut ack)?;
        } else {
            s.read_exact(&mut buf)?;
        }
        h.record(t.elapsed());
        bytes += u64::from(size);
    }
    Ok((bytes, h))
}

fn report(a: &RunArgs, addrs: &[SocketAddr], per: &[(u64, Histogram)], secs: f64) {
    let mut total = (0u64, Histogram::default());
    for (b, h) in per {
        total.0 += b;
        total.1.merge(h);
    }
    let rows: Vec<(String, &(u64, Histogram))> = addrs
        .iter()
        .map(|a| a.to_string())
        .zip(per.iter())
        .chain(std::iter::once(("total".to_string(), &total)))
        .collect();
    if a.machine {
        let y = YRecord::new("perfNet", "");
        println!(
            "{}",
            y.header(&[
                "server",
                "op",
                "sizeBytes",
                "threads",
                "MBps",
                "opsPerSec",
                "latencyUsP50",
                "latencyUsP99",
                "latencyUsMax"
            ])
        );
        for (name, (b, h)) in &rows {
            println!(
                "{}",
                y.data(&[
                    name.clone(),
                    a.op.to_string(),
                    a.size.to_string(),
                    a.threads.to_string(),
                    format!("{:.1}", *b as f64 / secs / 1e6),
                    format!("{:.0}", h.count as f64 / secs),
                    h.percentile_us(50.0).to_string(),
                    h.percentile_us(99.0).to_string(),
                    h.max_us.to_string(),
                ])
            );
        }
        return;
    }
    let mut t = Table::new(&["server", "MB/s", "ops/s", "p50 us", "p99 us", "max us"])
        .right(&[1, 2, 3, 4, 5]);
    for (name, (b, h)) in &rows {
        t.row(vec![
            name.clone(),
            format!("{:.1}", *b as f64 / secs / 1e6),
            format!("{:.0}", h.count as f64 / secs),
            h.percentile_us(50.0).to_string(),
            h.percentile_us(99.0).to_string(),
            h.max_us.to_string(),
        ]);
    }
    println!(
        "{} of {} bytes, {} connection(s) per server, {:.1} s",
        a.op, a.size, a.threads, secs
    );
    print!("{}", t.render());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_garbage_is_refused() {
        assert_eq!(
            parse_header(&header(OP_READ, 4096)).unwrap(),
            (OP_READ, 4096)
        );
        let mut bad = header(OP_WRITE, 1);
        bad[0] = b'X';
        assert!(parse_header(&bad)
            .unwrap_err()
            .to_string()
            .contains("magic"));
        assert!(parse_header(&header(7, 1))
            .unwrap_err()
            .to_string()
            .contains("op 7"));
        let e = parse_header(&header(OP_WRITE, REQUEST_BYTES_MAX + 1)).unwrap_err();
        assert!(e.to_string().contains("outside"), "{e}");
    }

    #[test]
    fn percentiles_come_from_the_buckets() {
        let mut h = Histogram::default();
        for us in 1..=100u64 {
            h.record(Duration::from_micros(us));
        }
        assert!(h.percentile_us(50.0) >= 50 && h.percentile_us(50.0) <= 64);
        assert_eq!(h.percentile_us(100.0), 100);
    }

    #[test]
    fn loopback_read_and_write_move_bytes() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in listener.incoming().flatten() {
                std::thread::spawn(move || serve(s));
            }
        });
        for op in [OP_READ, OP_WRITE] {
            let stop = Arc::new(AtomicBool::new(false));
            let s = TcpStream::connect(addr).unwrap();
            let stop2 = Arc::clone(&stop);
            let w = std::thread::spawn(move || client(s, op, 65536, &stop2));
            std::thread::sleep(Duration::from_millis(100));
            stop.store(true, Ordering::Relaxed);
            let (bytes, h) = w.join().unwrap().unwrap();
            assert!(
                bytes >= 65536 && h.count == bytes / 65536,
                "{bytes} {}",
                h.count
            );
        }
    }

    #[test]
    fn listen_address_without_port_takes_the_perf_port() {
        assert_eq!(
            parse_listen("127.0.0.1").unwrap(),
            "127.0.0.1:6669".parse().unwrap()
        );
        assert_eq!(parse_listen(LISTEN_DEFAULT).unwrap().port(), PERF_PORT);
    }
}
