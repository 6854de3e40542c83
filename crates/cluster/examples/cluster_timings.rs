//! Cluster timings with real processes and real TCP on loopback: failover after kill -9 of
//! the cluster manager, the expel of a killed node, configuration-change latency, and lease
//! traffic (extrapolated to large clusters). `bench/cluster.sh` builds and runs it; the
//! results are in `bench/RESULTS.md`.
//!
//! ```text
//! cluster_timings [driver] [--quorum 3,5] [--rounds N] [--failure-detection SECS]
//!                 [--lease-recovery-wait SECS] [--changes N] [--flood SECS]
//! cluster_timings node --number N --name NAME --store FILE --cluster-id HEX --secret HEX
//!                 --failure-detection SECS --lease-recovery-wait SECS
//! ```
//!
//! The driver starts one `node` process per cluster member (quorum-manager nodes plus one
//! client), bootstraps the cluster through the first, measures, and kills members with
//! SIGKILL. It talks to each node over the node's stdin and stdout, one line per message:
//!
//! - driver to node: `bootstrap FDT LRW NODELIST`, `propose NAME=VALUE`, `counters`,
//!   `reset`, `flood SECONDS CONCURRENCY`. End of input stops the node.
//! - node to driver: `EVENT NANOS key=value ...`, where NANOS is `CLOCK_MONOTONIC` in
//!   nanoseconds, the clock the driver reads too, so times compare across processes.
//!   Events: `ready port=`, `bootstrapped result=`, `leader leader= term=`, `version
//!   version=`, `takeover manager= term=`, `joined node= epoch=`, `expelled node= epoch=`,
//!   `lease state=`, `grant manager= term=` (first grant of a new manager term received over
//!   the network), `proposed start= version=|error=`, `traffic kind= calls= call_bytes=
//!   served= served_bytes=` (ended by `traffic-end`), `flooded grants= refusals= errors=`.
//!
//! Traffic counts every cluster message this node sent (`calls`, bytes of request and
//! reply) and every one it answered (`served`), by kind, as they are on the wire: the
//! postcard payload plus the transport's frame header and MAC (TCP/IP headers not counted).

// A crate root looks for modules beside itself; these live in the example's own folder.
#[path = "cluster_timings/driver.rs"]
mod driver;
#[path = "cluster_timings/node.rs"]
mod node;
#[path = "cluster_timings/stats.rs"]
mod stats;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let outcome = match args.first().map(String::as_str) {
        Some("node") => node::run(&args[1..]),
        Some("driver") => driver::run(&args[1..]),
        _ => driver::run(&args),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cluster_timings: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: the one clock every process on the machine shares,
/// so a node's event time and the driver's kill time can be subtracted.
pub fn monotonic_nanos() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) cannot fail");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Value of `--name VALUE` in `args`, if given.
pub fn option<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1).map(String::as_str)
}

/// Refuses options this program does not know, so a typo is never silently ignored.
pub fn check_options(args: &[String], known: &[&str]) -> anyhow::Result<()> {
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if !known.contains(&arg.as_str()) {
            anyhow::bail!("unknown option `{arg}`; known options: {}", known.join(" "));
        }
        if rest.next().is_none() {
            anyhow::bail!("option {arg} needs a value");
        }
    }
    Ok(())
}
