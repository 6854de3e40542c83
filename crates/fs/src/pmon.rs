//! Performance counters in the manner of mmpmon `fs_io_s` and `rhist`: byte and operation
//! counts per file system, and latency histograms by request size.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Upper bounds (exclusive) of the request-size ranges, as `rhist nr 4k;64k;256k;1m;4m`.
pub const SIZE_BOUNDS_BYTES: [u64; 5] = [4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];
/// Upper bounds (inclusive) of the latency ranges in milliseconds, as `rhist nr ...; 1;10;30;100`.
pub const LATENCY_BOUNDS_MS: [f64; 4] = [1.0, 10.0, 30.0, 100.0];

/// The latency buckets kept for each size range (the drives' buckets, 50 µs to 1 s): fine
/// enough for the Prometheus histograms, and holding every `rhist` bound above, so that
/// pmon's ranges are sums of these.
pub use tessera_drive::stats::LATENCY_BUCKETS_NS;

const SIZE_RANGES: usize = SIZE_BOUNDS_BYTES.len() + 1;
const LATENCY_RANGES: usize = LATENCY_BOUNDS_MS.len() + 1;
const BUCKETS: usize = LATENCY_BUCKETS_NS.len() + 1;

#[derive(Default)]
struct Histogram {
    counts: [[AtomicU64; BUCKETS]; SIZE_RANGES],
    sum_ns: [AtomicU64; SIZE_RANGES],
}

impl Histogram {
    fn record(&self, bytes: u64, latency: Duration) {
        let size = SIZE_BOUNDS_BYTES
            .iter()
            .position(|b| bytes < *b)
            .unwrap_or(SIZE_RANGES - 1);
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        let bucket = tessera_drive::stats::latency_bucket(ns);
        self.counts[size][bucket].fetch_add(1, Relaxed);
        self.sum_ns[size].fetch_add(ns, Relaxed);
    }

    /// `[size range][rhist latency range]` counts, summed from the fine buckets.
    fn rhist(&self) -> Vec<Vec<u64>> {
        self.counts
            .iter()
            .map(|row| {
                let mut out = vec![0; LATENCY_RANGES];
                for (bucket, c) in row.iter().enumerate() {
                    out[rhist_range(bucket)] += c.load(Relaxed);
                }
                out
            })
            .collect()
    }

    fn by_size(&self) -> Vec<SizeHistogram> {
        self.counts
            .iter()
            .zip(&self.sum_ns)
            .map(|(row, sum)| SizeHistogram {
                buckets: row.iter().map(|c| c.load(Relaxed)).collect(),
                sum_seconds: sum.load(Relaxed) as f64 / 1e9,
            })
            .collect()
    }
}

/// The rhist range a fine bucket falls in (every rhist bound is a bucket bound).
fn rhist_range(bucket: usize) -> usize {
    match LATENCY_BUCKETS_NS.get(bucket) {
        Some(&ns) => LATENCY_BOUNDS_MS
            .iter()
            .position(|ms| ns <= (*ms * 1e6) as u64)
            .unwrap_or(LATENCY_RANGES - 1),
        None => LATENCY_RANGES - 1,
    }
}

/// Latencies of one request-size range: counts per bucket of `LATENCY_BUCKETS_NS` (not
/// cumulative; the last bucket is above the last bound) and their sum.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SizeHistogram {
    pub buckets: Vec<u64>,
    pub sum_seconds: f64,
}

/// Read and write latencies by request size, for the Prometheus histograms: one
/// `SizeHistogram` per range of `SIZE_BOUNDS_BYTES` (the last is open ended).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LatencyHistograms {
    pub read: Vec<SizeHistogram>,
    pub write: Vec<SizeHistogram>,
}

/// Live counters of one mounted file system.
#[derive(Default)]
pub struct Pmon {
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    opens: AtomicU64,
    closes: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    readdirs: AtomicU64,
    inode_updates: AtomicU64,
    checksum_errors: AtomicU64,
    /// Copies of data blocks written again from a good copy after a checksum mismatch.
    copies_repaired: AtomicU64,
    read_hist: Histogram,
    write_hist: Histogram,
}

impl Pmon {
    pub fn read(&self, bytes: u64, latency: Duration) {
        self.reads.fetch_add(1, Relaxed);
        self.bytes_read.fetch_add(bytes, Relaxed);
        self.read_hist.record(bytes, latency);
    }

    pub fn write(&self, bytes: u64, latency: Duration) {
        self.writes.fetch_add(1, Relaxed);
        self.bytes_written.fetch_add(bytes, Relaxed);
        self.write_hist.record(bytes, latency);
    }

    /// Reads and writes applications made so far: a count that moves while they do I/O.
    pub fn data_ops(&self) -> u64 {
        self.reads.load(Relaxed) + self.writes.load(Relaxed)
    }

    pub fn open(&self) {
        self.opens.fetch_add(1, Relaxed);
    }

    pub fn close(&self) {
        self.closes.fetch_add(1, Relaxed);
    }

    pub fn readdir(&self) {
        self.readdirs.fetch_add(1, Relaxed);
    }

    pub fn inode_update(&self) {
        self.inode_updates.fetch_add(1, Relaxed);
    }

    pub fn checksum_error(&self) {
        self.checksum_errors.fetch_add(1, Relaxed);
    }

    pub fn repaired_copy(&self) {
        self.copies_repaired.fetch_add(1, Relaxed);
    }

    pub fn snapshot(&self) -> PmonSnapshot {
        PmonSnapshot {
            bytes_read: self.bytes_read.load(Relaxed),
            bytes_written: self.bytes_written.load(Relaxed),
            opens: self.opens.load(Relaxed),
            closes: self.closes.load(Relaxed),
            reads: self.reads.load(Relaxed),
            writes: self.writes.load(Relaxed),
            readdirs: self.readdirs.load(Relaxed),
            inode_updates: self.inode_updates.load(Relaxed),
            checksum_errors: self.checksum_errors.load(Relaxed),
            copies_repaired: self.copies_repaired.load(Relaxed),
            size_bounds_bytes: SIZE_BOUNDS_BYTES.to_vec(),
            latency_bounds_ms: LATENCY_BOUNDS_MS.to_vec(),
            read_histogram: self.read_hist.rhist(),
            write_histogram: self.write_hist.rhist(),
        }
    }

    pub fn latency_histograms(&self) -> LatencyHistograms {
        LatencyHistograms {
            read: self.read_hist.by_size(),
            write: self.write_hist.by_size(),
        }
    }
}

/// A copy of the counters, for `tessera pmon`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PmonSnapshot {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub opens: u64,
    pub closes: u64,
    pub reads: u64,
    pub writes: u64,
    pub readdirs: u64,
    pub inode_updates: u64,
    pub checksum_errors: u64,
    pub copies_repaired: u64,
    /// Exclusive upper bounds of the size ranges; the last range is open ended.
    pub size_bounds_bytes: Vec<u64>,
    /// Inclusive upper bounds of the latency ranges; the last range is open ended.
    pub latency_bounds_ms: Vec<f64>,
    /// `[size range][latency range]` operation counts.
    pub read_histogram: Vec<Vec<u64>>,
    pub write_histogram: Vec<Vec<u64>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rhist_ranges_are_sums_of_the_fine_buckets() {
        let p = Pmon::default();
        for us in [
            10, 60, 900, 1_000, 1_001, 9_000, 30_000, 31_000, 100_000, 2_000_000,
        ] {
            p.read(4096, Duration::from_micros(us));
        }
        p.write(100, Duration::from_micros(70));
        let s = p.snapshot();
        // 4 KiB is in the second size range (4 KiB up to 64 KiB).
        assert_eq!(s.read_histogram[1], vec![4, 2, 1, 2, 1]);
        assert_eq!(s.write_histogram[0], vec![1, 0, 0, 0, 0]);
        let h = p.latency_histograms();
        assert_eq!(h.read[1].buckets.iter().sum::<u64>(), 10);
        assert_eq!(h.read[1].buckets[0], 1, "10 us is at most 50 us");
        assert_eq!(
            h.read[1].buckets[BUCKETS - 1],
            1,
            "2 s is above the last bound"
        );
        let sum: u64 = [
            10, 60, 900, 1_000, 1_001, 9_000, 30_000, 31_000, 100_000, 2_000_000,
        ]
        .iter()
        .sum();
        assert!((h.read[1].sum_seconds - sum as f64 / 1e6).abs() < 1e-9);
        assert_eq!(h.write[0].buckets[1], 1);
    }
}
