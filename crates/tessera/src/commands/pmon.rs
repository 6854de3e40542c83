//! `pmon` [mmpmon fs_io_s and rhist s]: I/O counters and latency histograms by request
//! size of the mounted file systems. `-Y` prints the mmpmon `-p` keyword form.

use anyhow::Result;
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

fn show(node: &str, cluster: &str, e: &PmonEntry, machine: bool, t: u64) {
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
        rhist_machine(node, &e.fs_name, "r", s, &s.read_histogram);
        rhist_machine(node, &e.fs_name, "w", s, &s.write_histogram);
        return;
    }
    println!("tessera pmon node {node} fs_io_s OK");
    let rows = [
        ("cluster:", cluster.to_string()),
        ("filesystem:", e.fs_name.clone()),
        ("disks:", e.disks.to_string()),
        ("timestamp:", format!("{t}/0")),
        ("bytes read:", s.bytes_read.to_string()),
        ("bytes written:", s.bytes_written.to_string()),
        ("opens:", s.opens.to_string()),
        ("closes:", s.closes.to_string()),
        ("reads:", s.reads.to_string()),
        ("writes:", s.writes.to_string()),
        ("readdir:", s.readdirs.to_string()),
        ("inode updates:", s.inode_updates.to_string()),
        ("checksum errors:", s.checksum_errors.to_string()),
    ];
    for (label, value) in rows {
        println!("{label:<16} {value:>20}");
    }
    rhist_text(node, "read", s, &s.read_histogram, t);
    rhist_text(node, "write", s, &s.write_histogram, t);
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

#[cfg(test)]
mod tests {
    use super::*;

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
