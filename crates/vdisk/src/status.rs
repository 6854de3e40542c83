//! What `status` reports: the array, its pdisks and vdisks, and background work.

use std::time::Instant;

use serde::Serialize;

use crate::meta::PdiskState;
use crate::placement::Tolerance;

/// Progress of a background job (rebuild, scrub).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Progress {
    /// Running now.
    pub active: bool,
    /// Units done and planned in the current pass (stripes for scrub, strips for rebuild).
    pub done: u64,
    pub total: u64,
    /// Bytes read and written by the job in the current pass.
    pub bytes: u64,
    /// Sectors found bad and rewritten from redundancy.
    pub repaired: u64,
    /// Parity found disagreeing with checksummed data, and rewritten.
    pub parity_mismatches: u64,
    /// Units whose data could not be recovered (more strips lost than the code tolerates).
    pub unrecoverable: u64,
    /// Passes completed since the array was opened.
    pub passes: u64,
    /// Seconds since 1970 when the current or last pass started and finished (0 = never).
    pub started_unix: u64,
    pub finished_unix: u64,
    /// Bytes per second over the current pass; 0 when idle.
    pub rate_bytes_s: u64,
    /// Seconds to the end of the current pass at the current rate.
    pub eta_s: Option<u64>,
    #[serde(skip)]
    pub started: Option<Instant>,
}

impl Progress {
    pub fn begin(&mut self, total: u64) {
        let passes = self.passes;
        *self = Progress {
            active: true,
            total,
            passes,
            started_unix: crate::core::now_unix(),
            started: Some(Instant::now()),
            ..Progress::default()
        };
    }

    pub fn finish(&mut self) {
        self.active = false;
        self.passes += 1;
        self.finished_unix = crate::core::now_unix();
        self.done = self.done.max(self.total);
    }

    /// A copy with the rate and ETA filled in.
    pub fn snapshot(&self) -> Progress {
        let mut p = self.clone();
        if let (true, Some(started)) = (p.active, p.started) {
            let secs = started.elapsed().as_secs_f64().max(1e-3);
            p.rate_bytes_s = (p.bytes as f64 / secs) as u64;
            if p.done > 0 && p.total >= p.done {
                let per_unit = secs / p.done as f64;
                p.eta_s = Some((per_unit * (p.total - p.done) as f64).ceil() as u64);
            }
        }
        p
    }
}

/// How healthy the array is as a whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum DaState {
    /// Every strip of every stripe is where it should be.
    Ok,
    /// Some strips are unavailable (pdisk down, stale strip); data is served degraded and
    /// rebuild is restoring redundancy.
    Degraded,
    /// Some stripes have lost more strips than their code tolerates: part of the data is
    /// unreadable.
    DataLoss,
}

/// One row per pdisk.
#[derive(Clone, Debug, Serialize)]
pub struct PdiskStatus {
    pub name: String,
    pub device: String,
    pub enclosure: String,
    pub slot: u32,
    pub state: PdiskState,
    /// Resuming after a suspension: being caught up, not yet read.
    pub catching_up: bool,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub strips: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub checksum_errors: u64,
    /// Every request to the drive (application I/O, rebuild, scrub, the array's own
    /// metadata) by kind (`IoKind::ALL` order): requests, bytes, errors, latencies.
    #[serde(skip)]
    pub io: Vec<tessera_drive::stats::IoKindSnapshot>,
}

/// One row per vdisk.
#[derive(Clone, Debug, Serialize)]
pub struct VdiskStatus {
    pub name: String,
    pub code: String,
    pub block_bytes: u64,
    pub strip_bytes: u64,
    pub capacity_bytes: u64,
    /// What the vdisk's current layout survives.
    pub tolerance: Tolerance,
    /// Stripes with at least one strip unavailable, and with more than `m`.
    pub degraded_stripes: u64,
    pub critical_stripes: u64,
    pub stats: VdiskStats,
}

/// I/O counters of a vdisk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VdiskStats {
    pub reads: u64,
    pub writes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub full_stripe_writes: u64,
    pub rmw_writes: u64,
    /// Reads that needed reconstruction because a strip was unavailable or bad.
    pub degraded_reads: u64,
    /// Sectors that failed their checksum (or could not be read), were rebuilt from
    /// redundancy and rewritten.
    pub checksum_errors_repaired: u64,
    /// Operations that failed because data could not be recovered.
    pub unrecoverable: u64,
    /// Whole stripes deallocated on their pdisks (TRIM).
    pub discarded_stripes: u64,
    /// Stripes a discard left allocated: partial, degraded, or on pdisks that cannot
    /// deallocate to zeros.
    pub discards_skipped: u64,
}

/// The whole array.
#[derive(Clone, Debug, Serialize)]
pub struct DaStatus {
    pub name: String,
    pub uuid: String,
    pub state: DaState,
    /// Data area of the pdisks in service.
    pub capacity_bytes: u64,
    /// Free outside the spare reserve (what new vdisks can use).
    pub free_bytes: u64,
    /// The spare reserve, spread over all pdisks.
    pub spare_bytes: u64,
    pub spare_pdisks: u32,
    pub rebuild_io_share: u8,
    pub scrub_rate_mb_s: u32,
    pub pdisk_error_limit: u32,
    pub pdisks: Vec<PdiskStatus>,
    pub vdisks: Vec<VdiskStatus>,
    /// Strips waiting to be rewritten after a failed write.
    pub stale_strips: usize,
    pub dirty_regions: usize,
    pub rebuild: Progress,
    pub scrub: Progress,
    /// Recent events (state changes, repairs), oldest first, prefixed with a Unix time.
    pub events: Vec<String>,
}

/// What a scrub pass or a crash recovery found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ScrubReport {
    pub stripes: u64,
    pub bytes: u64,
    /// Sectors whose checksum failed and that were rewritten from redundancy.
    pub repaired_sectors: u64,
    /// Stripes whose parity disagreed with checksummed data (rewritten).
    pub parity_mismatches: u64,
    /// Stripes with data that could not be recovered.
    pub unrecoverable: u64,
}

/// What opening after an unclean shutdown did to the dirty regions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RecoveryReport {
    pub dirty_regions: u64,
    pub stripes_checked: u64,
    /// Stripes whose parity and checksums were recomputed from their data.
    pub stripes_resynced: u64,
    /// Data sectors that did not match their checksum in a dirty stripe: torn writes that
    /// were never acknowledged, accepted as they are.
    pub torn_sectors: u64,
    /// Strips whose content could not be recovered (a torn write into an already degraded
    /// stripe); reads of them fail with EIO.
    pub lost_strips: u64,
    /// Strips of never-written stripes (no valid header anywhere) that held data of a first
    /// write the crash rolled back; zeroed, so that a later torn write cannot bring it back.
    pub rolled_back_strips: u64,
}
