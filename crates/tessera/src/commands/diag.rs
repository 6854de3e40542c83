//! `diag` [mmdiag]: what this node's daemon is doing, one section per option:
//! `--waiters` (disk I/Os in flight and admin requests being served, the longest waiting
//! first), `--iohist` (the last disk I/Os: start time, read or write, NSD and sector, size
//! in 512-byte sectors, duration, and the node it was for when this node served it as NSD
//! server), `--network` (the cluster's nodes as this one reaches
//! them, NVMe/TCP paths), `--config` (the parameters in force here, `!` before those set
//! by the admin), `--stats` (pmon's counters, metadata cache and per-NSD counters),
//! `--memory` (the daemon's memory and each file system's caches against their bounds),
//! `--version`; `--all`, or no option, prints every section.

use anyhow::{anyhow, Result};
use tessera_cluster::params::PARAMS;

use super::cluster::cluster_view;
use super::{call, unexpected};
use crate::cli::DiagArgs;
use crate::config::Home;
use crate::output::{clock_time, Table};
use crate::rpc::{DiagReport, IoHistoryEntry, Reply, Request};

pub fn diag(home: &Home, a: &DiagArgs) -> Result<()> {
    let any = a.waiters || a.iohist || a.network || a.config || a.stats || a.memory || a.version;
    let all = a.all || !any;
    let want = |asked: bool| all || asked;
    let report = if want(a.waiters || a.network || a.stats || a.memory) {
        match call(home, &Request::Diag)? {
            Reply::Diag(r) => Some(*r),
            other => return Err(unexpected(other)),
        }
    } else {
        None
    };
    let report = || report.as_ref().ok_or_else(|| anyhow!("no diag report"));
    if want(a.version) {
        println!("=== diag: version ===");
        println!("Current Tessera build: \"{}\".", env!("CARGO_PKG_VERSION"));
        println!();
    }
    if want(a.waiters) {
        print_waiters(report()?);
    }
    if want(a.iohist) {
        let entries = match call(home, &Request::IoHistory)? {
            Reply::IoHistory(e) => e,
            other => return Err(unexpected(other)),
        };
        print_iohist(&entries);
        println!();
    }
    if want(a.network) {
        print_network(report()?);
    }
    if want(a.config) {
        print_config(home)?;
    }
    if want(a.stats) {
        print_stats(report()?);
    }
    if want(a.memory) {
        print_memory(report()?);
    }
    Ok(())
}

fn print_waiters(r: &DiagReport) {
    println!("=== diag: waiters ===");
    if r.waiters.is_empty() {
        println!("(nothing waiting: no disk I/O in flight, no admin request being served)");
    }
    for w in &r.waiters {
        println!(
            "Waiting {:.4} sec, {}: {}",
            w.waiting_seconds, w.kind, w.waiting_for
        );
    }
    println!();
}

fn print_network(r: &DiagReport) {
    println!("=== diag: network ===");
    println!();
    println!(
        "Cluster manager: {}",
        r.network.manager.as_deref().unwrap_or("(none known)")
    );
    println!();
    let mut t = Table::new(&["node", "address", "state", "epoch"]);
    for n in &r.network.nodes {
        t.row(vec![
            n.name.clone(),
            n.address.clone(),
            n.state.clone(),
            n.epoch.map_or_else(|| "-".into(), |e| e.to_string()),
        ]);
    }
    print!("{}", t.render());
    if !r.network.nvme.is_empty() {
        println!();
        println!("NVMe/TCP paths:");
        let mut t = Table::new(&[
            "namespace",
            "subsystem",
            "nsid",
            "path",
            "ANA",
            "state",
            "errors",
            "retries",
        ])
        .right(&[2, 6, 7]);
        for ns in &r.network.nvme {
            for p in &ns.paths {
                t.row(vec![
                    ns.name.clone(),
                    ns.subnqn.clone(),
                    ns.nsid.to_string(),
                    p.traddr.clone(),
                    p.ana_state.clone(),
                    p.state.clone(),
                    p.errors.to_string(),
                    p.retries.to_string(),
                ]);
            }
        }
        print!("{}", t.render());
    }
    println!();
}

fn print_config(home: &Home) -> Result<()> {
    println!("=== diag: config ===");
    let Some(view) = cluster_view(home)? else {
        return Err(anyhow!(
            "the local daemon is not running; start it with `tessera startup`"
        ));
    };
    let me = view.me;
    let mine = view.params.per_node.get(&me);
    for spec in PARAMS {
        let set = view.params.cluster.contains_key(spec.name)
            || mine.is_some_and(|m| m.contains_key(spec.name));
        let mark = if set { "!" } else { " " };
        println!(
            "{mark} {} {}",
            spec.name,
            view.params.get(spec.name, Some(me))
        );
    }
    println!();
    Ok(())
}

fn print_stats(r: &DiagReport) {
    println!("=== diag: stats ===");
    for f in &r.stats {
        println!();
        println!("File system {}:", f.fs);
        let p = &f.pmon;
        println!(
            "  bytes read {}  bytes written {}  reads {}  writes {}  opens {}  closes {}  \
             readdirs {}  inode updates {}  checksum errors {}",
            p.bytes_read,
            p.bytes_written,
            p.reads,
            p.writes,
            p.opens,
            p.closes,
            p.readdirs,
            p.inode_updates,
            p.checksum_errors
        );
        println!(
            "  metadata page cache: {} hits, {} misses, {} evictions",
            f.metadata_page_hits, f.metadata_page_misses, f.metadata_page_evictions
        );
        println!(
            "  FUSE requests: {} in the kernel's queue or being served, {} being served by \
             the daemon, {} answered since the mount",
            f.fuse_waiting
                .map_or_else(|| "(fusectl unreadable)".to_string(), |w| w.to_string()),
            f.fuse_active,
            f.fuse_served
        );
        println!(
            "  TRIM: {} bytes given back to thin-provisioned disks, {} deallocations failed",
            f.discarded_bytes, f.discard_errors
        );
        let mut t = Table::new(&["NSD", "op", "requests", "bytes", "errors", "avg ms"])
            .right(&[2, 3, 4, 5]);
        for n in &f.nsds {
            let avg = if n.requests == 0 {
                0.0
            } else {
                n.seconds * 1e3 / n.requests as f64
            };
            t.row(vec![
                n.nsd.clone(),
                n.op.clone(),
                n.requests.to_string(),
                n.bytes.to_string(),
                n.errors.to_string(),
                format!("{avg:.3}"),
            ]);
        }
        print!("{}", t.render());
    }
    if r.stats.is_empty() {
        println!("(no file system mounted on this node)");
    }
    println!();
}

fn print_memory(r: &DiagReport) {
    let m = &r.memory;
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1 << 20) as f64);
    println!("=== diag: memory ===");
    println!(
        "daemon pid {}, up {} s: resident {} (peak {}), virtual {}, {} threads",
        r.pid,
        r.uptime_seconds,
        mib(m.rss_bytes),
        mib(m.peak_rss_bytes),
        mib(m.virtual_bytes),
        m.threads
    );
    let mut t = Table::new(&[
        "file system",
        "metadata pages clean",
        "dirty",
        "in use",
        "pagepool",
        "inodes cached",
        "maxFilesToCache",
        "stats cached",
        "maxStatCache",
    ])
    .right(&[1, 2, 3, 4, 5, 6, 7, 8]);
    for f in &m.filesystems {
        t.row(vec![
            f.fs.clone(),
            f.metadata_pages_clean.to_string(),
            f.metadata_pages_dirty.to_string(),
            mib(f.metadata_memory_bytes),
            mib(f.pagepool_bytes),
            f.inodes_cached.to_string(),
            f.max_files_to_cache.to_string(),
            f.stats_cached.to_string(),
            f.max_stat_cache.to_string(),
        ]);
    }
    if !m.filesystems.is_empty() {
        println!();
        print!("{}", t.render());
    }
    println!();
}

fn print_iohist(entries: &[IoHistoryEntry]) {
    println!("=== diag: iohist ===");
    println!();
    println!("I/O history:");
    println!();
    let nsd_width = entries
        .iter()
        .map(|e| e.nsd.len())
        .max()
        .unwrap_or(0)
        .max("NSD".len());
    // The last column names the node an I/O was done for as its NSD server, and is empty
    // for this node's own I/O (whether it reached the disk itself or through servers).
    println!(
        " I/O start time RW {:<nsd_width$} {:>12} {:>8} {:>9} result served for",
        "NSD", "sectorNum", "nSec", "time ms"
    );
    println!(
        "--------------- -- {} {} {} {} ------ ----------",
        "-".repeat(nsd_width),
        "-".repeat(12),
        "-".repeat(8),
        "-".repeat(9)
    );
    for e in entries {
        let rw = match e.op.as_str() {
            "read" => "R",
            "write" => "W",
            _ => "F",
        };
        let line = format!(
            "{} {rw:>2} {:<nsd_width$} {:>12} {:>8} {:>9.3} {:<6} {}",
            clock_time(e.start_unix_nanos),
            e.nsd,
            e.offset / 512,
            e.bytes / 512,
            e.latency_ns as f64 / 1e6,
            if e.ok { "ok" } else { "error" },
            e.served_for.as_deref().unwrap_or_default()
        );
        println!("{}", line.trim_end());
    }
    if entries.is_empty() {
        println!("(no disk I/O since the daemon started; file systems must be mounted here)");
    }
}
