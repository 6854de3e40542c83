//! The dirty-region bitmap that closes the write hole.
//!
//! A region is a run of `region_stripes` consecutive stripes of one vdisk. Before the first
//! write into a clean region, its bit is set and the bitmap is made durable; the write may
//! then leave data and parity of any stripe in the region disagreeing until it completes.
//! A background cleaner clears bits of regions that saw no write for a while, after
//! flushing the pdisks, so after a crash only recently written regions are resynchronised.
//!
//! The bitmap of the whole array is one postcard payload (`Vec<(vdisk id, region count,
//! bits)>`), framed like the metadata and written to slot `generation mod 2` of every
//! writable pdisk. Opening takes the copy with the newest generation: a bit set by
//! generation `g` is relied on (a write enters its region) only once `g` is durable on
//! every writable pdisk, so a crash while `g` is written leaves either `g` or `g - 1`
//! newest, and both are correct (without the bit, nothing was written into the region
//! yet); a clearing generation only removes bits of regions that were flushed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Most regions per vdisk: bounds the bitmap (4096 bits = 512 bytes per vdisk).
pub const REGIONS_MAX: u64 = 4096;
/// Regions cover at least this much vdisk capacity, so that a stream of writes sets a bit
/// (a synchronous bitmap write on several pdisks) only every 64 MiB.
pub const REGION_BYTES_MIN: u64 = 64 << 20;
/// A region is cleaned once it saw no write for this long.
pub const CLEAN_AFTER: Duration = Duration::from_secs(1);

/// Decoded bitmap contents: (vdisk id, region count, bits).
pub type Bits = Vec<(u32, u32, Vec<u8>)>;

/// Stripes per region for a vdisk of `stripes` stripes of `block_bytes`.
pub fn region_stripes(stripes: u64, block_bytes: u64) -> u64 {
    let by_bytes = REGION_BYTES_MIN.div_ceil(block_bytes).max(1);
    let by_count = stripes.div_ceil(REGIONS_MAX).max(1);
    by_bytes.max(by_count)
}

#[derive(Debug, Clone)]
struct Region {
    dirty: bool,
    /// The state version at which the bit was last set; durable once `persisted >= since`.
    since: u64,
    inflight: u32,
    writes: u64,
    last_write: Option<Instant>,
}

#[derive(Debug, Default)]
struct State {
    regions: BTreeMap<u32, Vec<Region>>,
    /// Bumped by every change of a bit.
    version: u64,
    /// The newest version known durable.
    persisted: u64,
}

/// In-memory dirty-region state of an array; `core.rs` does the I/O.
#[derive(Debug, Default)]
pub struct DirtyMap {
    state: Mutex<State>,
    /// Serialises bitmap writes so a later snapshot is never overtaken by an earlier one.
    pub persist_lock: Mutex<u64>,
}

/// A candidate for cleaning: (vdisk id, region, write count when chosen).
pub type CleanTicket = Vec<(u32, usize, u64)>;

fn blank(count: u64) -> Vec<Region> {
    vec![
        Region {
            dirty: false,
            since: 0,
            inflight: 0,
            writes: 0,
            last_write: None,
        };
        usize::try_from(count).expect("bounded region count")
    ]
}

impl DirtyMap {
    pub fn add_vdisk(&self, vdisk_id: u32, regions: u64) {
        assert!(regions <= REGIONS_MAX);
        self.state.lock().regions.insert(vdisk_id, blank(regions));
    }

    pub fn remove_vdisk(&self, vdisk_id: u32) {
        let mut s = self.state.lock();
        s.regions.remove(&vdisk_id);
        s.version += 1;
    }

    /// Registers a write into `region`: returns the version that must be durable before
    /// the write may touch the pdisks (0 when it already is).
    pub fn begin_write(&self, vdisk_id: u32, region: usize) -> u64 {
        let mut s = self.state.lock();
        let next = s.version + 1;
        let persisted = s.persisted;
        let r = &mut s.regions.get_mut(&vdisk_id).expect("registered vdisk")[region];
        r.inflight += 1;
        r.writes += 1;
        let need = if r.dirty {
            r.since
        } else {
            r.dirty = true;
            r.since = next;
            s.version = next;
            next
        };
        if need > persisted {
            need
        } else {
            0
        }
    }

    pub fn end_write(&self, vdisk_id: u32, region: usize) {
        let mut s = self.state.lock();
        let r = &mut s.regions.get_mut(&vdisk_id).expect("registered vdisk")[region];
        assert!(r.inflight > 0);
        r.inflight -= 1;
        r.last_write = Some(Instant::now());
    }

    /// Whether `version` is already durable.
    pub fn persisted(&self, version: u64) -> bool {
        self.state.lock().persisted >= version
    }

    /// The current bits and their version, to be written.
    pub fn snapshot(&self) -> (u64, Bits) {
        let s = self.state.lock();
        let bits = s
            .regions
            .iter()
            .filter(|(_, rs)| rs.iter().any(|r| r.dirty))
            .map(|(&id, rs)| {
                let mut b = vec![0u8; rs.len().div_ceil(8)];
                for (i, r) in rs.iter().enumerate() {
                    if r.dirty {
                        b[i / 8] |= 1 << (i % 8);
                    }
                }
                (id, rs.len() as u32, b)
            })
            .collect();
        (s.version, bits)
    }

    pub fn mark_persisted(&self, version: u64) {
        let mut s = self.state.lock();
        s.persisted = s.persisted.max(version);
    }

    /// Regions idle for [`CLEAN_AFTER`] (or all idle regions when `all`).
    pub fn clean_candidates(&self, all: bool) -> CleanTicket {
        let s = self.state.lock();
        let now = Instant::now();
        let mut out = Vec::new();
        for (&id, rs) in &s.regions {
            for (i, r) in rs.iter().enumerate() {
                let idle = r
                    .last_write
                    .is_none_or(|t| all || now.duration_since(t) >= CLEAN_AFTER);
                if r.dirty && r.inflight == 0 && idle {
                    out.push((id, i, r.writes));
                }
            }
        }
        out
    }

    /// Clears the candidates that saw no write since they were chosen (the pdisks having
    /// been flushed in between); returns how many were cleared.
    pub fn clear(&self, ticket: &CleanTicket) -> usize {
        let mut s = self.state.lock();
        let mut cleared = 0;
        for &(id, i, writes) in ticket {
            let Some(r) = s.regions.get_mut(&id).and_then(|rs| rs.get_mut(i)) else {
                continue;
            };
            if r.dirty && r.inflight == 0 && r.writes == writes {
                r.dirty = false;
                cleared += 1;
            }
        }
        if cleared > 0 {
            s.version += 1;
        }
        cleared
    }

    pub fn dirty_regions(&self) -> usize {
        let s = self.state.lock();
        s.regions
            .values()
            .map(|rs| rs.iter().filter(|r| r.dirty).count())
            .sum()
    }
}

/// Encodes bitmap contents for a slot.
pub fn encode(bits: &[(u32, u32, Vec<u8>)]) -> Vec<u8> {
    postcard::to_allocvec(bits).expect("bitmap encodes")
}

/// Decodes a slot payload; `None` if it does not decode.
pub fn decode(payload: &[u8]) -> Option<Bits> {
    postcard::from_bytes(payload).ok()
}

/// Dirty region numbers of `vdisk_id` in decoded bitmap contents.
pub fn regions_of(bits: &[(u32, u32, Vec<u8>)], vdisk_id: u32) -> Vec<u64> {
    let mut out = Vec::new();
    for (id, count, b) in bits {
        if *id != vdisk_id {
            continue;
        }
        for i in 0..*count as usize {
            if b.get(i / 8).is_some_and(|byte| byte & (1 << (i % 8)) != 0) {
                out.push(i as u64);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_persist_clean_cycle() {
        let d = DirtyMap::default();
        d.add_vdisk(1, 10);
        let need = d.begin_write(1, 3);
        assert!(need > 0);
        // A second writer of the same region must wait for the same version.
        assert_eq!(d.begin_write(1, 3), need);
        let (v, bits) = d.snapshot();
        assert_eq!(regions_of(&bits, 1), vec![3]);
        d.mark_persisted(v);
        assert_eq!(d.begin_write(1, 3), 0);
        for _ in 0..3 {
            d.end_write(1, 3);
        }
        let ticket = d.clean_candidates(true);
        assert_eq!(ticket.len(), 1);
        assert_eq!(d.clear(&ticket), 1);
        assert_eq!(d.dirty_regions(), 0);
        let bits = decode(&encode(&d.snapshot().1)).unwrap();
        assert!(regions_of(&bits, 1).is_empty());
    }

    #[test]
    fn a_write_after_choosing_blocks_the_clear() {
        let d = DirtyMap::default();
        d.add_vdisk(1, 2);
        d.begin_write(1, 0);
        d.end_write(1, 0);
        let ticket = d.clean_candidates(true);
        d.begin_write(1, 0);
        d.end_write(1, 0);
        assert_eq!(d.clear(&ticket), 0);
        assert_eq!(d.dirty_regions(), 1);
    }
}
