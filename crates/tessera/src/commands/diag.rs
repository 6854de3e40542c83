//! `diag` [mmdiag]: what this node's daemon is doing. `--iohist` lists the last disk I/Os
//! of the mounted file systems (mmdiag's I/O history: start time, read or write, disk and
//! sector, size in 512-byte sectors, duration); `--version` the daemon's version. The other
//! mmdiag sections are refused by name until they exist.

use anyhow::{bail, Result};

use super::{call, unexpected};
use crate::cli::DiagArgs;
use crate::config::Home;
use crate::output::clock_time;
use crate::rpc::{IoHistoryEntry, Reply, Request};

pub fn diag(home: &Home, a: &DiagArgs) -> Result<()> {
    let missing: Vec<&str> = [
        (a.waiters, "--waiters"),
        (a.network, "--network"),
        (a.config, "--config"),
        (a.stats, "--stats"),
        (a.memory, "--memory"),
    ]
    .into_iter()
    .filter(|(asked, _)| *asked)
    .map(|(_, name)| name)
    .collect();
    if !missing.is_empty() {
        bail!(
            "{} not implemented yet; this release has --iohist and --version (and `tessera \
             config ls` for the configuration, `tessera pmon` for I/O counters)",
            missing.join(", ")
        );
    }
    let (iohist, version) = if a.all || !(a.iohist || a.version) {
        (true, true)
    } else {
        (a.iohist, a.version)
    };
    if version {
        println!("=== diag: version ===");
        println!("Current Tessera build: \"{}\".", env!("CARGO_PKG_VERSION"));
        println!();
    }
    if iohist {
        let entries = match call(home, &Request::IoHistory)? {
            Reply::IoHistory(e) => e,
            other => return Err(unexpected(other)),
        };
        print_iohist(&entries);
    }
    Ok(())
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
    println!(
        " I/O start time RW {:<nsd_width$} {:>12} {:>8} {:>9} result",
        "NSD", "sectorNum", "nSec", "time ms"
    );
    println!(
        "--------------- -- {} {} {} {} ------",
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
        println!(
            "{} {rw:>2} {:<nsd_width$} {:>12} {:>8} {:>9.3} {}",
            clock_time(e.start_unix_nanos),
            e.nsd,
            e.offset / 512,
            e.bytes / 512,
            e.latency_ns as f64 / 1e6,
            if e.ok { "ok" } else { "error" }
        );
    }
    if entries.is_empty() {
        println!("(no disk I/O since the daemon started; file systems must be mounted here)");
    }
}
