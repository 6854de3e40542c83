//! Per-path counters: cheap atomics on the I/O path, a snapshot for `list()`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::policy::latency_bucket;

/// Buckets of the latency histogram: bucket `i` counts commands that took
/// `[2^i, 2^(i+1))` µs (bucket 0: below 2 µs; the last bucket: everything longer).
pub const LATENCY_BUCKETS: usize = 32;

/// Live counters of one path.
#[derive(Debug, Default)]
pub struct PathCounters {
    commands: AtomicU64,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    errors: AtomicU64,
    retries: AtomicU64,
    latency: [AtomicU64; LATENCY_BUCKETS],
}

impl PathCounters {
    /// Records a completed command.
    pub fn record(&self, read_bytes: u64, write_bytes: u64, latency: Duration) {
        self.commands.fetch_add(1, Ordering::Relaxed);
        if read_bytes > 0 {
            self.read_bytes.fetch_add(read_bytes, Ordering::Relaxed);
        }
        if write_bytes > 0 {
            self.write_bytes.fetch_add(write_bytes, Ordering::Relaxed);
        }
        self.latency[latency_bucket(latency, LATENCY_BUCKETS)].fetch_add(1, Ordering::Relaxed);
    }

    /// Records a failed command; `retried` when it goes to another path.
    pub fn record_error(&self, retried: bool) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if retried {
            self.retries.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A consistent-enough copy (each counter is read once).
    #[must_use]
    pub fn snapshot(&self) -> PathStats {
        PathStats {
            commands: self.commands.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            latency_us_log2: self
                .latency
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
        }
    }
}

/// Counters of one path at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathStats {
    /// Commands completed successfully.
    pub commands: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Commands that failed on this path (path errors and NVMe errors).
    pub errors: u64,
    /// Commands that failed with a path error here and were retried elsewhere.
    pub retries: u64,
    /// Latency histogram, [`LATENCY_BUCKETS`] power-of-two microsecond buckets.
    pub latency_us_log2: Vec<u64>,
}

impl PathStats {
    /// The upper bound in µs of the bucket that holds the `pct` percentile (0 without
    /// samples): what `nvme list` shows as p50/p99.
    pub fn latency_us_percentile(&self, pct: u64) -> u64 {
        let buckets = &self.latency_us_log2;
        let total: u64 = buckets.iter().sum();
        if total == 0 {
            return 0;
        }
        let want = (total * pct).div_ceil(100).max(1);
        let mut seen = 0;
        for (b, n) in buckets.iter().enumerate() {
            seen += n;
            if seen >= want {
                return 1u64 << b.min(63);
            }
        }
        1u64 << (buckets.len().min(64) - 1)
    }
}
