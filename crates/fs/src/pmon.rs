//! Performance counters in the manner of mmpmon `fs_io_s` and `rhist`: byte and operation
//! counts per file system, and latency histograms by request size.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Upper bounds (exclusive) of the request-size ranges, as `rhist nr 4k;64k;256k;1m;4m`.
pub const SIZE_BOUNDS_BYTES: [u64; 5] = [4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];
/// Upper bounds (inclusive) of the latency ranges in milliseconds, as `rhist nr ...; 1;10;30;100`.
pub const LATENCY_BOUNDS_MS: [f64; 4] = [1.0, 10.0, 30.0, 100.0];

const SIZE_RANGES: usize = SIZE_BOUNDS_BYTES.len() + 1;
const LATENCY_RANGES: usize = LATENCY_BOUNDS_MS.len() + 1;

#[derive(Default)]
struct Histogram {
    counts: [[AtomicU64; LATENCY_RANGES]; SIZE_RANGES],
}

impl Histogram {
    fn record(&self, bytes: u64, latency: Duration) {
        let size = SIZE_BOUNDS_BYTES
            .iter()
            .position(|b| bytes < *b)
            .unwrap_or(SIZE_RANGES - 1);
        let ms = latency.as_secs_f64() * 1000.0;
        let lat = LATENCY_BOUNDS_MS
            .iter()
            .position(|b| ms <= *b)
            .unwrap_or(LATENCY_RANGES - 1);
        self.counts[size][lat].fetch_add(1, Relaxed);
    }

    fn snapshot(&self) -> Vec<Vec<u64>> {
        self.counts
            .iter()
            .map(|row| row.iter().map(|c| c.load(Relaxed)).collect())
            .collect()
    }
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
            size_bounds_bytes: SIZE_BOUNDS_BYTES.to_vec(),
            latency_bounds_ms: LATENCY_BOUNDS_MS.to_vec(),
            read_histogram: self.read_hist.snapshot(),
            write_histogram: self.write_hist.snapshot(),
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
    /// Exclusive upper bounds of the size ranges; the last range is open ended.
    pub size_bounds_bytes: Vec<u64>,
    /// Inclusive upper bounds of the latency ranges; the last range is open ended.
    pub latency_bounds_ms: Vec<f64>,
    /// `[size range][latency range]` operation counts.
    pub read_histogram: Vec<Vec<u64>>,
    pub write_histogram: Vec<Vec<u64>>,
}
