//! `pmon` [mmpmon fs_io_s and rhist s]: I/O counters and latency histograms by request
//! size of the mounted file systems. `-Y` prints the mmpmon `-p` keyword form.
//!
//! `-i FILE` reads mmpmon requests from a command file, one per line (`#` starts a
//! comment): `fs_io_s`, `io_s` (the node's totals), `ver`, `reset`, `rhist on`, `rhist off`,
//! `rhist s`, `rhist reset`; `-r COUNT` repeats the file (0: until interrupted) with `-d MS`
//! between passes. As in an mmpmon session, histograms are shown only after `rhist on`,
//! and `reset` starts the session's counters from zero: Tessera keeps its counters
//! running for the metrics and everyone else, and subtracts what the session saw at its
//! `reset` (mmpmon resets the node's counters). `rhist nr` is refused: Tessera's ranges are
//! fixed (sizes 4K, 64K, 256K, 1M, 4M; latencies 1, 10, 30, 100 ms).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, bail, Result};
use tessera_fs::PmonSnapshot;

use super::{call, unexpected};
use crate::config::{now_unix, Home};
use crate::rpc::{PmonEntry, Reply, Request};

/// `(low, high)` of size range `i`; bounds are exclusive upper limits, 0 = open ended.
fn size_range(bounds: &[u64], i: usize) -> (u64, u64) {
    let low = if i == 0 { 0 } else { bounds[i - 1] };
    let high = bounds.get(i).map_or(0, |b| b - 1);
    (low, high)
}

/// `(low, high)` of latency range `i` in ms; bounds are inclusive, 0.0 = open ended.
fn latency_range(bounds: &[f64], i: usize) -> (f64, f64) {
    let low = if i == 0 { 0.0 } else { bounds[i - 1] + 0.1 };
    let high = bounds.get(i).copied().unwrap_or(0.0);
    (low, high)
}

fn rhist_text(node: &str, kind: &str, s: &PmonSnapshot, hist: &[Vec<u64>], t: u64) {
    println!("tessera pmon node {node} rhist s OK {kind} timestamp {t}/0");
    for (i, row) in hist.iter().enumerate() {
        let count: u64 = row.iter().sum();
        if count == 0 {
            continue;
        }
        let (lo, hi) = size_range(&s.size_bounds_bytes, i);
        println!("size range {lo:>15} to {hi:>12} count {count:>13}");
        for (j, n) in row.iter().enumerate().filter(|(_, n)| **n > 0) {
            let (lo, hi) = latency_range(&s.latency_bounds_ms, j);
            println!("  latency range {lo:>8.1} to {hi:>11.1} count {n:>13}");
        }
    }
}

fn rhist_machine(node: &str, fs: &str, kind: &str, s: &PmonSnapshot, hist: &[Vec<u64>]) {
    for (i, row) in hist.iter().enumerate() {
        let count: u64 = row.iter().sum();
        if count == 0 {
            continue;
        }
        let (lo, hi) = size_range(&s.size_bounds_bytes, i);
        let mut line =
            format!("_rhist_ _n_ {node} _fs_ {fs} _k_ {kind} _R_ {lo} {hi} _NR_ {count}");
        for (j, n) in row.iter().enumerate().filter(|(_, n)| **n > 0) {
            let (lo, hi) = latency_range(&s.latency_bounds_ms, j);
            line += &format!(" _L_ {lo:.1} {hi:.1} _NL_ {n}");
        }
        println!("{line}");
    }
}

/// The operation counters of `fs_io_s` and `io_s`, labelled as mmpmon prints them.
fn counter_rows(s: &PmonSnapshot) -> [(&'static str, String); 8] {
    [
        ("bytes read:", s.bytes_read.to_string()),
        ("bytes written:", s.bytes_written.to_string()),
        ("opens:", s.opens.to_string()),
        ("closes:", s.closes.to_string()),
        ("reads:", s.reads.to_string()),
        ("writes:", s.writes.to_string()),
        ("readdir:", s.readdirs.to_string()),
        ("inode updates:", s.inode_updates.to_string()),
    ]
}

fn show(node: &str, cluster: &str, e: &PmonEntry, machine: bool, t: u64) {
    show_fs_io_s(node, cluster, e, machine, t);
    show_rhist(node, e, machine, t);
}

fn show_rhist(node: &str, e: &PmonEntry, machine: bool, t: u64) {
    let s = &e.snapshot;
    if machine {
        rhist_machine(node, &e.fs_name, "r", s, &s.read_histogram);
        rhist_machine(node, &e.fs_name, "w", s, &s.write_histogram);
    } else {
        rhist_text(node, "read", s, &s.read_histogram, t);
        rhist_text(node, "write", s, &s.write_histogram, t);
    }
}

fn show_fs_io_s(node: &str, cluster: &str, e: &PmonEntry, machine: bool, t: u64) {
    let s = &e.snapshot;
    if machine {
        println!(
            "_fs_io_s_ _n_ {node} _rc_ 0 _t_ {t} _tu_ 0 _cl_ {cluster} _fs_ {} _d_ {} _br_ {} \
             _bw_ {} _oc_ {} _cc_ {} _rdc_ {} _wc_ {} _dir_ {} _iu_ {} _cke_ {}",
            e.fs_name,
            e.disks,
            s.bytes_read,
            s.bytes_written,
            s.opens,
            s.closes,
            s.reads,
            s.writes,
            s.readdirs,
            s.inode_updates,
            s.checksum_errors
        );
        return;
    }
    println!("tessera pmon node {node} fs_io_s OK");
    let rows = [
        ("cluster:", cluster.to_string()),
        ("filesystem:", e.fs_name.clone()),
        ("disks:", e.disks.to_string()),
        ("timestamp:", format!("{t}/0")),
    ];
    let rows = rows.into_iter().chain(counter_rows(s));
    for (label, value) in rows.chain([("checksum errors:", s.checksum_errors.to_string())]) {
        println!("{label:<16} {value:>20}");
    }
}

pub fn pmon(home: &Home, name: Option<&str>, machine: bool) -> Result<()> {
    let cluster = home.cluster()?;
    let entries = match call(
        home,
        &Request::Pmon {
            name: name.map(str::to_string),
        },
    )? {
        Reply::Pmon(e) => e,
        other => return Err(unexpected(other)),
    };
    if entries.is_empty() && !machine {
        println!(
            "tessera pmon: no file system is mounted on node {}",
            cluster.node_name
        );
    }
    let t = now_unix();
    for e in &entries {
        show(&cluster.node_name, &cluster.name, e, machine, t);
    }
    Ok(())
}

/// One request of an mmpmon command file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PmonRequest {
    FsIoS,
    IoS,
    Ver,
    Reset,
    RhistOn,
    RhistOff,
    RhistShow,
    RhistReset,
}

impl PmonRequest {
    fn keyword(self) -> &'static str {
        match self {
            PmonRequest::FsIoS => "fs_io_s",
            PmonRequest::IoS => "io_s",
            PmonRequest::Ver => "ver",
            PmonRequest::Reset => "reset",
            PmonRequest::RhistOn => "on",
            PmonRequest::RhistOff => "off",
            PmonRequest::RhistShow => "s",
            PmonRequest::RhistReset => "reset",
        }
    }
}

/// The requests of a command file, in order; an unknown one is an error naming its line.
fn parse_requests(text: &str, file: &str) -> Result<Vec<PmonRequest>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        let words: Vec<&str> = line.split_whitespace().collect();
        let request = match words.as_slice() {
            [] => continue,
            ["fs_io_s"] => PmonRequest::FsIoS,
            ["io_s"] => PmonRequest::IoS,
            ["ver"] => PmonRequest::Ver,
            ["reset"] => PmonRequest::Reset,
            ["rhist", "on"] => PmonRequest::RhistOn,
            ["rhist", "off"] => PmonRequest::RhistOff,
            ["rhist", "s"] => PmonRequest::RhistShow,
            ["rhist", "reset"] => PmonRequest::RhistReset,
            ["rhist", "nr", ..] => bail!(
                "{file} line {}: `rhist nr` is not implemented: Tessera's ranges are fixed \
                 (sizes 4k;64k;256k;1m;4m, latencies 1.0;10.0;30.0;100.0 ms); remove the \
                 line and `rhist s` shows those",
                i + 1
            ),
            _ => bail!(
                "{file} line {}: `{line}` is not a request tessera pmon knows; it reads \
                 fs_io_s, io_s, ver, reset, rhist on, rhist off, rhist s, rhist reset",
                i + 1
            ),
        };
        out.push(request);
    }
    if out.is_empty() {
        bail!("{file}: no requests (one per line: fs_io_s, io_s, rhist on, rhist s, ...)");
    }
    Ok(out)
}

/// `now` less `base`, counter by counter (what a session saw since its `reset`).
fn since(
    now: &PmonSnapshot,
    base: &PmonSnapshot,
    counters: bool,
    histograms: bool,
) -> PmonSnapshot {
    let mut d = now.clone();
    if counters {
        d.bytes_read -= base.bytes_read.min(d.bytes_read);
        d.bytes_written -= base.bytes_written.min(d.bytes_written);
        d.opens -= base.opens.min(d.opens);
        d.closes -= base.closes.min(d.closes);
        d.reads -= base.reads.min(d.reads);
        d.writes -= base.writes.min(d.writes);
        d.readdirs -= base.readdirs.min(d.readdirs);
        d.inode_updates -= base.inode_updates.min(d.inode_updates);
        d.checksum_errors -= base.checksum_errors.min(d.checksum_errors);
    }
    if histograms {
        for (rows, base_rows) in [
            (&mut d.read_histogram, &base.read_histogram),
            (&mut d.write_histogram, &base.write_histogram),
        ] {
            for (row, base_row) in rows.iter_mut().zip(base_rows) {
                for (c, b) in row.iter_mut().zip(base_row) {
                    *c -= (*b).min(*c);
                }
            }
        }
    }
    d
}

/// What one `-i` session remembers between requests.
#[derive(Default)]
struct Session {
    rhist_on: bool,
    /// Per file system: the snapshot at the last `reset` and at the last `rhist reset`.
    counters_base: HashMap<String, PmonSnapshot>,
    rhist_base: HashMap<String, PmonSnapshot>,
}

impl Session {
    fn view(&self, e: &PmonEntry) -> PmonEntry {
        let mut s = e.snapshot.clone();
        if let Some(b) = self.counters_base.get(&e.fs_name) {
            s = since(&s, b, true, true);
        }
        if let Some(b) = self.rhist_base.get(&e.fs_name) {
            s = since(&s, b, false, true);
        }
        PmonEntry {
            fs_name: e.fs_name.clone(),
            disks: e.disks,
            snapshot: s,
        }
    }
}

fn request_ok(node: &str, word: &str, request: PmonRequest, machine: bool, rc: u32, why: &str) {
    if machine {
        println!("_{word}_ _n_ {node} _req_ {} _rc_ {rc}", request.keyword());
    } else if rc == 0 {
        println!("tessera pmon node {node} {word} {} OK", request.keyword());
    } else {
        println!(
            "tessera pmon node {node} {word} {} status {rc}: {why}",
            request.keyword()
        );
    }
}

/// `pmon -i FILE [-r COUNT] [-d MS]`.
pub fn pmon_file(
    home: &Home,
    name: Option<&str>,
    machine: bool,
    file: &Path,
    repeat: u64,
    delay_ms: u64,
) -> Result<()> {
    let label = file.display().to_string();
    let text = std::fs::read_to_string(file).map_err(|e| anyhow!("cannot read {label}: {e}"))?;
    let requests = parse_requests(&text, &label)?;
    let cluster = home.cluster()?;
    let node = cluster.node_name.as_str();
    let mut session = Session::default();
    let mut pass = 0u64;
    loop {
        for &request in &requests {
            let entries = match call(
                home,
                &Request::Pmon {
                    name: name.map(str::to_string),
                },
            )? {
                Reply::Pmon(e) => e,
                other => return Err(unexpected(other)),
            };
            let t = now_unix();
            match request {
                PmonRequest::FsIoS => {
                    for e in &entries {
                        show_fs_io_s(node, &cluster.name, &session.view(e), machine, t);
                    }
                }
                PmonRequest::IoS => show_io_s(node, &entries, &session, machine, t),
                PmonRequest::Ver => {
                    if machine {
                        println!("_ver_ _n_ {node} _v_ {} _rc_ 0", env!("CARGO_PKG_VERSION"));
                    } else {
                        println!(
                            "tessera pmon node {node} version {}",
                            env!("CARGO_PKG_VERSION")
                        );
                    }
                }
                PmonRequest::Reset => {
                    for e in &entries {
                        session
                            .counters_base
                            .insert(e.fs_name.clone(), e.snapshot.clone());
                        session.rhist_base.remove(&e.fs_name);
                    }
                    if machine {
                        println!("_reset_ _n_ {node} _rc_ 0 _t_ {t} _tu_ 0");
                    } else {
                        println!("tessera pmon node {node} reset OK");
                    }
                }
                PmonRequest::RhistOn | PmonRequest::RhistOff => {
                    session.rhist_on = request == PmonRequest::RhistOn;
                    request_ok(node, "rhist", request, machine, 0, "");
                }
                PmonRequest::RhistReset => {
                    for e in &entries {
                        session
                            .rhist_base
                            .insert(e.fs_name.clone(), e.snapshot.clone());
                    }
                    request_ok(node, "rhist", request, machine, 0, "");
                }
                PmonRequest::RhistShow if !session.rhist_on => request_ok(
                    node,
                    "rhist",
                    request,
                    machine,
                    16,
                    "histograms are off in this session; `rhist on` first",
                ),
                PmonRequest::RhistShow => {
                    for e in &entries {
                        show_rhist(node, &session.view(e), machine, t);
                    }
                }
            }
        }
        pass += 1;
        if repeat != 0 && pass >= repeat {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
    }
}

/// `io_s`: the node's totals over every mounted file system.
fn show_io_s(node: &str, entries: &[PmonEntry], session: &Session, machine: bool, t: u64) {
    let mut total = PmonSnapshot::default();
    for e in entries {
        let s = session.view(e).snapshot;
        total.bytes_read += s.bytes_read;
        total.bytes_written += s.bytes_written;
        total.opens += s.opens;
        total.closes += s.closes;
        total.reads += s.reads;
        total.writes += s.writes;
        total.readdirs += s.readdirs;
        total.inode_updates += s.inode_updates;
    }
    let s = &total;
    if machine {
        println!(
            "_io_s_ _n_ {node} _rc_ 0 _t_ {t} _tu_ 0 _br_ {} _bw_ {} _oc_ {} _cc_ {} _rdc_ {} \
             _wc_ {} _dir_ {} _iu_ {}",
            s.bytes_read,
            s.bytes_written,
            s.opens,
            s.closes,
            s.reads,
            s.writes,
            s.readdirs,
            s.inode_updates
        );
        return;
    }
    println!("tessera pmon node {node} io_s OK");
    for (label, value) in [("timestamp:", format!("{t}/0"))]
        .into_iter()
        .chain(counter_rows(s))
    {
        println!("{label:<16} {value:>20}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_files_parse_and_refuse_what_they_cannot_do() {
        let text =
            "# a session\nrhist on\n\nfs_io_s\nrhist s   # the histograms\nreset\nio_s\nver\n";
        assert_eq!(
            parse_requests(text, "f").unwrap(),
            [
                PmonRequest::RhistOn,
                PmonRequest::FsIoS,
                PmonRequest::RhistShow,
                PmonRequest::Reset,
                PmonRequest::IoS,
                PmonRequest::Ver,
            ]
        );
        let err = parse_requests("fs_io_s\nrhist nr 512;1m 1.0\n", "f").unwrap_err();
        assert!(err.to_string().contains("line 2") && err.to_string().contains("rhist nr"));
        let err = parse_requests("fs_io_s\nnlist add x\n", "f").unwrap_err();
        assert!(err.to_string().contains("line 2") && err.to_string().contains("nlist add x"));
        assert!(parse_requests("# nothing\n", "f").is_err());
    }

    #[test]
    fn a_session_counts_from_its_reset() {
        let mut before = PmonSnapshot {
            bytes_read: 100,
            reads: 2,
            read_histogram: vec![vec![1, 1]],
            write_histogram: vec![vec![0, 0]],
            ..PmonSnapshot::default()
        };
        let now = PmonSnapshot {
            bytes_read: 150,
            reads: 3,
            read_histogram: vec![vec![2, 1]],
            write_histogram: vec![vec![0, 0]],
            ..PmonSnapshot::default()
        };
        let d = since(&now, &before, true, true);
        assert_eq!((d.bytes_read, d.reads), (50, 1));
        assert_eq!(d.read_histogram, [[1, 0]]);
        // Histograms only: the counters keep running.
        let h = since(&now, &before, false, true);
        assert_eq!(
            (h.bytes_read, h.read_histogram.clone()),
            (150, vec![vec![1, 0]])
        );
        // A base above the value (counters of a new mount) gives zero, not a wrap.
        before.bytes_read = 1000;
        assert_eq!(since(&now, &before, true, false).bytes_read, 0);
    }

    #[test]
    fn ranges() {
        let sizes = [4096, 65536];
        assert_eq!(size_range(&sizes, 0), (0, 4095));
        assert_eq!(size_range(&sizes, 1), (4096, 65535));
        assert_eq!(size_range(&sizes, 2), (65536, 0));
        let lat = [1.0, 10.0];
        assert_eq!(latency_range(&lat, 1), (1.1, 10.0));
        assert_eq!(latency_range(&lat, 2), (10.1, 0.0));
    }
}
