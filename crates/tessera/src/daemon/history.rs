//! Throughput over time: once a second the monitor reads each mounted file system's pmon
//! counters and keeps the rates of the interval (bytes and operations per second, read and
//! write latency percentiles), the last hour of them, for the dashboard's charts and
//! `/api/v1/filesystems/NAME/throughput`.
//!
//! A page loaded in the middle of a test shows what happened before it was opened, as the
//! ESS GUI's "throughput over time" chart does, and a browser left open costs the daemon
//! nothing more than one that polls once.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::Serialize;
use tessera_fs::{FileSystem, LATENCY_BUCKETS_NS};

/// One hour at one sample a second: about 300 KiB per mounted file system.
pub const SAMPLES_KEPT: usize = 3600;

/// The rates of one interval.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ThroughputSample {
    /// The end of the interval.
    pub unix_ms: u64,
    pub read_bytes_per_s: f64,
    pub write_bytes_per_s: f64,
    pub read_ops_per_s: f64,
    pub write_ops_per_s: f64,
    /// Latency percentiles of the requests that completed in the interval, estimated
    /// from the histogram buckets; `None` when none did.
    pub read_p50_ms: Option<f64>,
    pub read_p99_ms: Option<f64>,
    pub write_p50_ms: Option<f64>,
    pub write_p99_ms: Option<f64>,
}

/// Cumulative counters as read at one instant.
struct Reading {
    at: Instant,
    bytes_read: u64,
    bytes_written: u64,
    reads: u64,
    writes: u64,
    /// Latency bucket counts, all request sizes together.
    read_buckets: Vec<u64>,
    write_buckets: Vec<u64>,
}

impl Reading {
    fn of(fs: &FileSystem) -> Reading {
        let p = fs.pmon();
        let h = fs.latency_histograms();
        let sum = |ranges: &[tessera_fs::SizeHistogram]| {
            let mut out = vec![0u64; LATENCY_BUCKETS_NS.len() + 1];
            for r in ranges {
                for (o, c) in out.iter_mut().zip(&r.buckets) {
                    *o += c;
                }
            }
            out
        };
        Reading {
            at: Instant::now(),
            bytes_read: p.bytes_read,
            bytes_written: p.bytes_written,
            reads: p.reads,
            writes: p.writes,
            read_buckets: sum(&h.read),
            write_buckets: sum(&h.write),
        }
    }
}

#[derive(Default)]
struct Series {
    last: Option<Reading>,
    samples: VecDeque<ThroughputSample>,
}

/// The throughput history of every file system mounted on this node.
#[derive(Default)]
pub struct ThroughputHistory {
    series: Mutex<BTreeMap<String, Series>>,
}

impl ThroughputHistory {
    /// Takes one sample of each mounted file system. A file system that is no longer
    /// mounted loses its history (a new mount starts counting from zero).
    pub fn sample(&self, mounted: &[(String, Arc<FileSystem>)]) {
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut series = self.series.lock();
        series.retain(|name, _| mounted.iter().any(|(n, _)| n == name));
        for (name, fs) in mounted {
            let now = Reading::of(fs);
            let s = series.entry(name.clone()).or_default();
            if let Some(before) = s.last.take() {
                s.samples.push_back(rates(&before, &now, unix_ms));
                if s.samples.len() > SAMPLES_KEPT {
                    s.samples.pop_front();
                }
            }
            s.last = Some(now);
        }
    }

    /// The samples of `fs` that ended after `since_unix_ms`, oldest first; `None` when
    /// it is not mounted here.
    pub fn series(&self, fs: &str, since_unix_ms: u64) -> Option<Vec<ThroughputSample>> {
        let series = self.series.lock();
        let s = series.get(fs)?;
        Some(
            s.samples
                .iter()
                .filter(|x| x.unix_ms > since_unix_ms)
                .cloned()
                .collect(),
        )
    }
}

fn rates(before: &Reading, now: &Reading, unix_ms: u64) -> ThroughputSample {
    let seconds = now.at.duration_since(before.at).as_secs_f64().max(1e-3);
    let per_s = |a: u64, b: u64| b.saturating_sub(a) as f64 / seconds;
    let delta = |a: &[u64], b: &[u64]| -> Vec<u64> {
        a.iter().zip(b).map(|(x, y)| y.saturating_sub(*x)).collect()
    };
    let reads = delta(&before.read_buckets, &now.read_buckets);
    let writes = delta(&before.write_buckets, &now.write_buckets);
    ThroughputSample {
        unix_ms,
        read_bytes_per_s: per_s(before.bytes_read, now.bytes_read),
        write_bytes_per_s: per_s(before.bytes_written, now.bytes_written),
        read_ops_per_s: per_s(before.reads, now.reads),
        write_ops_per_s: per_s(before.writes, now.writes),
        read_p50_ms: percentile_ms(&reads, 0.50),
        read_p99_ms: percentile_ms(&reads, 0.99),
        write_p50_ms: percentile_ms(&writes, 0.50),
        write_p99_ms: percentile_ms(&writes, 0.99),
    }
}

/// The `q` quantile of latencies counted in `LATENCY_BUCKETS_NS` buckets, interpolated
/// linearly inside its bucket (as Prometheus' `histogram_quantile` does). Above the last
/// bound the bound itself is the answer: the histogram knows nothing finer.
pub fn percentile_ms(counts: &[u64], q: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut below = 0u64;
    for (i, c) in counts.iter().enumerate() {
        if *c == 0 {
            continue;
        }
        if (below + c) as f64 >= rank {
            let lo = if i == 0 { 0 } else { LATENCY_BUCKETS_NS[i - 1] };
            let Some(&hi) = LATENCY_BUCKETS_NS.get(i) else {
                return Some(lo as f64 / 1e6);
            };
            let within = ((rank - below as f64) / *c as f64).clamp(0.0, 1.0);
            return Some((lo as f64 + within * (hi - lo) as f64) / 1e6);
        }
        below += c;
    }
    LATENCY_BUCKETS_NS.last().map(|ns| *ns as f64 / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_inside_their_bucket() {
        let mut counts = vec![0u64; LATENCY_BUCKETS_NS.len() + 1];
        assert_eq!(percentile_ms(&counts, 0.5), None);
        // 100 requests in the second bucket: the median lies half way through it.
        counts[1] = 100;
        let lo = LATENCY_BUCKETS_NS[0] as f64 / 1e6;
        let hi = LATENCY_BUCKETS_NS[1] as f64 / 1e6;
        let p50 = percentile_ms(&counts, 0.5).unwrap();
        assert!((p50 - (lo + hi) / 2.0).abs() < 1e-9, "{p50}");
        // One slow request above every bound: p99 of 101 stays in the bucket, p100 is
        // the last bound.
        *counts.last_mut().unwrap() = 1;
        assert!(percentile_ms(&counts, 0.99).unwrap() <= hi);
        let last = *LATENCY_BUCKETS_NS.last().unwrap() as f64 / 1e6;
        assert_eq!(percentile_ms(&counts, 1.0), Some(last));
    }
}
