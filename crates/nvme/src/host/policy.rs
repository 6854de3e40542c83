//! Pure decisions of the host, kept free of sockets and threads so they can be tested
//! exhaustively: path selection, request splitting, R2T segmentation, the MDTS limit and
//! the ctrl_loss_tmo deadline.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::wire::log::AnaState;

/// Largest data transfer of one command the host issues, whatever MDTS allows: big enough
/// that a 1 MiB file-system block is one command, small enough to bound the time one command
/// holds a queue's socket.
pub const HOST_MAX_TRANSFER_BYTES: u32 = 4 << 20;

/// The ANA state of a path to a namespace, as shown by `list()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnaPathState {
    /// Preferred path.
    Optimized,
    /// Usable, but another path is better.
    NonOptimized,
    /// Not usable for now.
    Inaccessible,
    /// Will not come back.
    PersistentLoss,
    /// In transition.
    Change,
}

impl AnaPathState {
    /// The host-side view of a wire ANA state.
    #[must_use]
    pub fn from_wire(state: AnaState) -> Self {
        match state {
            AnaState::Optimized => AnaPathState::Optimized,
            AnaState::NonOptimized => AnaPathState::NonOptimized,
            AnaState::Inaccessible => AnaPathState::Inaccessible,
            AnaState::PersistentLoss => AnaPathState::PersistentLoss,
            AnaState::Change => AnaPathState::Change,
        }
    }

    /// The name `nvme list-subsys` prints.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            AnaPathState::Optimized => "optimized",
            AnaPathState::NonOptimized => "non-optimized",
            AnaPathState::Inaccessible => "inaccessible",
            AnaPathState::PersistentLoss => "persistent-loss",
            AnaPathState::Change => "change",
        }
    }
}

impl std::fmt::Display for AnaPathState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What path selection needs to know about one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// The controller is connected and its queues are alive.
    pub live: bool,
    /// ANA state of the namespace's group through this controller.
    pub ana: AnaPathState,
    /// This request already failed on this path; try the others first.
    pub excluded: bool,
}

/// Picks the path for the next command: round robin (`rr` is a running counter) over the
/// live, not excluded, OPTIMIZED paths; failing those over the NON-OPTIMIZED ones (as Linux
/// native multipath does); never an inaccessible, persistent-loss or changing one.
#[must_use]
pub fn select_path(candidates: &[Candidate], rr: usize) -> Option<usize> {
    for wanted in [AnaPathState::Optimized, AnaPathState::NonOptimized] {
        let usable = |c: &&Candidate| c.live && !c.excluded && c.ana == wanted;
        let count = candidates.iter().filter(usable).count();
        if count == 0 {
            continue;
        }
        let pick = rr % count;
        let mut seen = 0;
        for (i, c) in candidates.iter().enumerate() {
            if usable(&c) {
                if seen == pick {
                    return Some(i);
                }
                seen += 1;
            }
        }
    }
    None
}

/// The largest transfer of one command in bytes: MDTS (a power of two in units of the
/// minimum memory page size, 0 = no limit) capped by the 16-bit NLB field and by
/// [`HOST_MAX_TRANSFER_BYTES`], rounded down to whole 4 KiB sectors.
#[must_use]
pub fn max_transfer_bytes(mdts: u8, mpsmin: u8, lba_bytes: u32) -> u32 {
    // 2^(12 + MPSMIN + MDTS) bytes; a shift that would overflow means "no limit".
    let shift = 12 + u32::from(mpsmin.min(15)) + u32::from(mdts);
    let mdts_bytes = if mdts == 0 || shift >= 63 {
        u64::MAX
    } else {
        1u64 << shift
    };
    let nlb_bytes = 65_536 * u64::from(lba_bytes.max(512));
    let max = mdts_bytes
        .min(nlb_bytes)
        .min(u64::from(HOST_MAX_TRANSFER_BYTES));
    let max = max - max % 4096;
    // One sector always fits: MDTS counts pages of at least 4 KiB.
    max.max(4096) as u32
}

/// Splits `len` bytes at `offset` into pieces of at most `max_bytes`: (offset, start in the
/// buffer, length).
pub fn split_request(
    offset: u64,
    len: usize,
    max_bytes: u32,
) -> impl Iterator<Item = (u64, usize, usize)> {
    let max = (max_bytes as usize).max(1);
    (0..len.div_ceil(max)).map(move |i| {
        let start = i * max;
        (offset + start as u64, start, max.min(len - start))
    })
}

/// Splits the window an R2T asks for into H2CData PDUs of at most `maxh2cdata` bytes:
/// (offset within the command's data, length, LAST_PDU).
pub fn r2t_segments(
    r2to: u32,
    r2tl: u32,
    maxh2cdata: u32,
) -> impl Iterator<Item = (u32, u32, bool)> {
    let max = maxh2cdata.max(1);
    let count = r2tl.div_ceil(max);
    (0..count).map(move |i| {
        let at = i * max;
        let len = max.min(r2tl - at);
        (r2to + at, len, i + 1 == count)
    })
}

/// Checks an R2T against the command's data length: the window must be non-empty and
/// inside the data.
#[must_use]
pub fn r2t_in_range(r2to: u32, r2tl: u32, data_len: usize) -> bool {
    r2tl > 0 && (u64::from(r2to) + u64::from(r2tl)) <= data_len as u64
}

/// When queued I/O gives up: `ctrl_loss_tmo` after the namespace lost its last usable path.
#[must_use]
pub fn io_deadline(unusable_since: Instant, ctrl_loss_tmo: Duration) -> Instant {
    unusable_since + ctrl_loss_tmo
}

/// Whether a path lost at `lost_since` has outlived `ctrl_loss_tmo` at `now`, so its
/// controller is removed instead of reconnected (Linux `nvmf_should_reconnect`).
#[must_use]
pub fn reconnect_expired(lost_since: Instant, ctrl_loss_tmo: Duration, now: Instant) -> bool {
    now.saturating_duration_since(lost_since) >= ctrl_loss_tmo
}

/// The bucket of a power-of-two latency histogram (bucket `i` holds latencies in
/// `[2^i, 2^(i+1))` µs, bucket 0 everything below 2 µs).
#[must_use]
pub fn latency_bucket(latency: Duration, buckets: usize) -> usize {
    let us = u64::try_from(latency.as_micros())
        .unwrap_or(u64::MAX)
        .max(1);
    (63 - us.leading_zeros() as usize).min(buckets - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(live: bool, ana: AnaPathState) -> Candidate {
        Candidate {
            live,
            ana,
            excluded: false,
        }
    }

    #[test]
    fn optimized_paths_are_spread_round_robin() {
        use AnaPathState::*;
        let paths = [
            c(true, Optimized),
            c(true, NonOptimized),
            c(true, Optimized),
        ];
        let picks: Vec<_> = (0..4).map(|rr| select_path(&paths, rr)).collect();
        assert_eq!(picks, [Some(0), Some(2), Some(0), Some(2)]);
    }

    #[test]
    fn non_optimized_only_without_live_optimized() {
        use AnaPathState::*;
        let paths = [
            c(false, Optimized),
            c(true, NonOptimized),
            c(true, Inaccessible),
        ];
        assert_eq!(select_path(&paths, 7), Some(1));
        let mut excluded = paths;
        excluded[1].excluded = true;
        assert_eq!(select_path(&excluded, 0), None);
    }

    #[test]
    fn unusable_states_are_never_picked() {
        use AnaPathState::*;
        let paths = [
            c(true, Inaccessible),
            c(true, PersistentLoss),
            c(true, Change),
        ];
        for rr in 0..5 {
            assert_eq!(select_path(&paths, rr), None);
        }
        assert_eq!(select_path(&[], 0), None);
    }

    #[test]
    fn mdts_limits() {
        // MDTS 0: only the host's own cap.
        assert_eq!(max_transfer_bytes(0, 0, 4096), HOST_MAX_TRANSFER_BYTES);
        // MDTS 5 with 4 KiB pages: 128 KiB.
        assert_eq!(max_transfer_bytes(5, 0, 4096), 128 << 10);
        // 512-byte LBAs: 65536 blocks are 32 MiB, above the host cap.
        assert_eq!(max_transfer_bytes(0, 0, 512), HOST_MAX_TRANSFER_BYTES);
        // Huge MDTS does not overflow.
        assert_eq!(max_transfer_bytes(63, 15, 4096), HOST_MAX_TRANSFER_BYTES);
    }

    #[test]
    fn requests_split_on_the_limit() {
        let pieces: Vec<_> = split_request(8192, 3 << 20, 1 << 20).collect();
        assert_eq!(
            pieces,
            [
                (8192, 0, 1 << 20),
                (8192 + (1 << 20), 1 << 20, 1 << 20),
                (8192 + (2 << 20), 2 << 20, 1 << 20)
            ]
        );
        let uneven: Vec<_> = split_request(0, 12288, 8192).collect();
        assert_eq!(uneven, [(0, 0, 8192), (8192, 8192, 4096)]);
        assert_eq!(split_request(0, 0, 4096).count(), 0);
    }

    #[test]
    fn r2t_segmentation() {
        let segs: Vec<_> = r2t_segments(4096, 300_000, 131_072).collect();
        assert_eq!(
            segs,
            [
                (4096, 131_072, false),
                (4096 + 131_072, 131_072, false),
                (4096 + 262_144, 300_000 - 262_144, true)
            ]
        );
        assert_eq!(
            r2t_segments(0, 4096, 4096).collect::<Vec<_>>(),
            [(0, 4096, true)]
        );
        assert!(r2t_in_range(0, 4096, 4096));
        assert!(!r2t_in_range(4096, 1, 4096));
        assert!(!r2t_in_range(0, 0, 4096));
        assert!(!r2t_in_range(u32::MAX, u32::MAX, 1 << 20));
    }

    #[test]
    fn ctrl_loss_timing() {
        let t0 = Instant::now();
        let tmo = Duration::from_secs(10);
        assert!(!reconnect_expired(t0, tmo, t0 + Duration::from_secs(9)));
        assert!(reconnect_expired(t0, tmo, t0 + tmo));
        assert!(!reconnect_expired(t0 + tmo, tmo, t0));
        assert_eq!(io_deadline(t0, tmo), t0 + tmo);
    }

    #[test]
    fn latency_buckets() {
        assert_eq!(latency_bucket(Duration::ZERO, 32), 0);
        assert_eq!(latency_bucket(Duration::from_micros(3), 32), 1);
        assert_eq!(latency_bucket(Duration::from_micros(1024), 32), 10);
        assert_eq!(latency_bucket(Duration::from_secs(1 << 40), 32), 31);
    }
}
