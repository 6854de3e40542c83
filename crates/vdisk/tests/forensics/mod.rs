//! Forensics for the crash and power-loss loops: what the pdisks held for a stripe before
//! the array was reopened (so before resynchronisation touched it) and after, explained
//! strip by strip when a sector fails its check.
//!
//! The snapshot reads the strip slots straight from the pdisk files (nobody has them open
//! between the kill and the reopen) and keeps, per strip, the decoded header and per data
//! sector its CRC-32C and the write id in its first 8 bytes: small enough to take before
//! every reopen, and enough to tell a lost flush (the sector never reached the drive) from
//! a recovery that overwrote it (the sector was there before the reopen).

use std::collections::HashSet;
use std::fmt::Write as _;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use tessera_vdisk::{StripLocation, Vdisk};

const SECTOR: usize = 4096;
/// Header layout (ARCHITECTURE.md, strip slot): fixed part, then the checksum table.
const FIXED: usize = 64;
const MAGIC: &[u8; 8] = b"TSRSTR01";

/// A strip header as read, checked as the array checks it (magic, identity, CRC).
#[derive(Clone, Debug)]
pub struct Header {
    pub version: u64,
    pub lost_mask: u32,
    /// `strips * sectors` CRCs, strip-major.
    pub table: Vec<u32>,
}

/// One strip slot as found on its pdisk.
#[derive(Clone, Debug)]
pub struct Strip {
    /// `Err` says why the header is not valid.
    pub header: Result<Header, String>,
    /// Per data sector: its CRC-32C and the write id in its first 8 bytes.
    pub sectors: Vec<(u32, u64)>,
}

/// The strips of every stripe of a vdisk, as found at one moment.
pub struct Snapshot {
    pub stripes: Vec<Vec<Strip>>,
}

/// Where every strip of a vdisk lives, taken from an open vdisk (the map only changes by
/// rebuild or rebalance, which the loops do not cause; the report says if it did).
pub fn stripe_map(v: &Vdisk) -> Vec<Vec<StripLocation>> {
    (0..v.stripes())
        .map(|s| v.strip_locations(s).unwrap())
        .collect()
}

fn crc_with_hole(bytes: &[u8]) -> u32 {
    let c = crc32c::crc32c(&bytes[..8]);
    let c = crc32c::crc32c_append(c, &[0; 4]);
    crc32c::crc32c_append(c, &bytes[12..])
}

fn decode(
    bytes: &[u8],
    stripe: u64,
    strip: usize,
    strips: usize,
    sps: usize,
) -> Result<Header, String> {
    if &bytes[..8] != MAGIC {
        let zero = bytes[..FIXED].iter().all(|&b| b == 0);
        return Err(if zero {
            "zeroed".into()
        } else {
            "bad magic".into()
        });
    }
    let u16_at = |o: usize| u16::from_le_bytes(bytes[o..o + 2].try_into().unwrap());
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
    if u64_at(40) != stripe || usize::from(u16_at(36)) != strip {
        return Err(format!(
            "belongs to stripe {} strip {}",
            u64_at(40),
            u16_at(36)
        ));
    }
    if usize::from(bytes[39]) != strips || u32_at(60) as usize != sps {
        return Err("wrong shape".into());
    }
    let end = FIXED + 4 * strips * sps;
    if crc_with_hole(&bytes[..end]) != u32_at(8) {
        return Err(format!("CRC mismatch (version field {:#x})", u64_at(48)));
    }
    Ok(Header {
        version: u64_at(48),
        lost_mask: u32_at(56),
        table: bytes[FIXED..end]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
    })
}

/// Reads every strip of every stripe in `map` from the pdisk files.
pub fn snapshot(map: &[Vec<StripLocation>]) -> Snapshot {
    let mut files = Files::default();
    let stripes = map
        .iter()
        .enumerate()
        .map(|(s, strips)| read_stripe(&mut files, s as u64, strips))
        .collect();
    Snapshot { stripes }
}

type Files = std::collections::HashMap<PathBuf, std::fs::File>;

fn read_stripe(files: &mut Files, stripe: u64, strips: &[StripLocation]) -> Vec<Strip> {
    strips
        .iter()
        .enumerate()
        .map(|(i, loc)| {
            let f = files
                .entry(PathBuf::from(&loc.device))
                .or_insert_with(|| std::fs::File::open(&loc.device).unwrap());
            read_strip(f, loc, stripe, i, strips.len())
        })
        .collect()
}

fn read_strip(f: &std::fs::File, loc: &StripLocation, stripe: u64, i: usize, n: usize) -> Strip {
    let header_bytes = (loc.data_offset - loc.offset) as usize;
    let mut buf = vec![0u8; header_bytes + loc.strip_bytes as usize];
    f.read_exact_at(&mut buf, loc.offset).unwrap();
    let sps = loc.strip_bytes as usize / SECTOR;
    Strip {
        header: decode(&buf[..header_bytes], stripe, i, n, sps),
        sectors: buf[header_bytes..]
            .chunks_exact(SECTOR)
            .map(|s| {
                (
                    crc32c::crc32c(s),
                    u64::from_le_bytes(s[..8].try_into().unwrap()),
                )
            })
            .collect(),
    }
}

/// A write of the ledger: (id, first vdisk sector, sectors).
pub type Write = (u64, u64, u64);

/// Steps a writer may take in one round: ids of different rounds never collide.
const STEPS_MAX: u64 = 1_000_000;

/// The id of write `step` of `writer` (of `writers`) in round `round`: never 0 (0 stands
/// for "never written"), and unique across rounds and writers.
pub fn write_id(round: u64, step: u64, writer: u64, writers: u64) -> u64 {
    assert!(step < STEPS_MAX && writer < writers);
    ((round + 1) * STEPS_MAX + step) * writers + writer
}

/// Where write `id` came from, spelled out: reading the round off the id's leading digits
/// is wrong by the factor `writers`.
pub fn origin(id: u64, writers: u64) -> String {
    if id == 0 {
        return "never written".into();
    }
    let (round_step, writer) = (id / writers, id % writers);
    format!(
        "round {}, writer {writer}, step {}",
        (round_step / STEPS_MAX).saturating_sub(1),
        round_step % STEPS_MAX
    )
}

/// What the loop knows about the failing sector.
pub struct Failure<'a> {
    pub what: String,
    pub seed: u64,
    pub iteration: usize,
    pub sector: u64,
    /// The write id the sector holds (0: zeros) and those it may hold.
    pub found: u64,
    pub expected: &'a [u64],
    pub writes: &'a [Write],
    pub durable: &'a HashSet<u64>,
    pub writers: u64,
}

/// Explains a failing sector: the stripe's strips before the reopen and now, the writes of
/// the last run that touched the stripe, and what recovery reported.
pub fn explain(
    f: &Failure<'_>,
    map_before: &[Vec<StripLocation>],
    before: &Snapshot,
    v: &Vdisk,
    recovery: &str,
    events: &[String],
) -> String {
    let strip_sectors = (v.strip_size() as usize / SECTOR) as u64;
    let stripe_sectors = v.block_size() / SECTOR as u64;
    let stripe = f.sector / stripe_sectors;
    let within = f.sector % stripe_sectors;
    let (strip, t) = (
        (within / strip_sectors) as usize,
        (within % strip_sectors) as usize,
    );
    let map_now = v.strip_locations(stripe).unwrap();
    let after = read_stripe(&mut Files::default(), stripe, &map_now);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}\n  seed {} (TESSERA_POWERLOSS_SEED={} replays the random choices), round {}\n  \
         sector {} = stripe {stripe}, data strip {strip}, sector {t} of the strip\n  \
         found: {}; expected: {}",
        f.what,
        f.seed,
        f.seed,
        f.iteration,
        f.sector,
        origin(f.found, f.writers),
        f.expected
            .iter()
            .map(|&id| format!("{id} ({})", origin(id, f.writers)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(out, "  recovery at reopen: {recovery}");
    if map_before[stripe as usize] != map_now {
        let _ = writeln!(out, "  the stripe map changed at reopen: {map_now:?}");
    }
    describe_writes(&mut out, f, stripe * stripe_sectors, stripe_sectors);
    for (label, strips) in [
        ("before reopen", &before.stripes[stripe as usize]),
        ("now", &after),
    ] {
        let auth = strips
            .iter()
            .filter_map(|s| s.header.as_ref().ok())
            .max_by_key(|h| h.version);
        let _ = writeln!(
            out,
            "  {label}: newest header version {}",
            auth.map_or("none".into(), |h| format!("v{:#x}", h.version))
        );
        for (i, s) in strips.iter().enumerate() {
            describe_strip(
                &mut out,
                i,
                s,
                auth,
                &map_now[i],
                strip,
                t,
                strip_sectors as usize,
            );
        }
    }
    for e in events {
        let _ = writeln!(out, "  event: {e}");
    }
    out
}

fn describe_writes(out: &mut String, f: &Failure<'_>, first: u64, len: u64) {
    let mut last_flush = vec![0u64; f.writers as usize];
    for &id in f.durable {
        let w = (id % f.writers) as usize;
        last_flush[w] = last_flush[w].max(id);
    }
    let touching: Vec<&Write> = f
        .writes
        .iter()
        .filter(|(_, s, n)| *s < first + len && first < s + n)
        .collect();
    let _ = writeln!(
        out,
        "  writes of the last run into this stripe (of {} in all): {}",
        f.writes.len(),
        if touching.is_empty() { "none" } else { "" }
    );
    for &&(id, s, n) in &touching {
        let covered = id <= last_flush[(id % f.writers) as usize];
        let _ = writeln!(
            out,
            "    write {id}: stripe sectors {}..{}{}",
            s.max(first) - first,
            (s + n).min(first + len) - first,
            if covered {
                ", flushed (durable)"
            } else {
                ", not flushed"
            }
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn describe_strip(
    out: &mut String,
    i: usize,
    s: &Strip,
    auth: Option<&Header>,
    loc: &StripLocation,
    bad_strip: usize,
    t: usize,
    sps: usize,
) {
    let verifies = |h: &Header| {
        s.sectors
            .iter()
            .enumerate()
            .filter(|(u, (c, _))| h.table[i * sps + u] != *c)
            .count()
    };
    let head = match &s.header {
        Ok(h) => format!(
            "v{:#x} lost {:#x}, {} sectors fail own table",
            h.version,
            h.lost_mask,
            verifies(h)
        ),
        Err(e) => format!("invalid header ({e})"),
    };
    let vs_auth = auth.map_or("-".into(), |a| format!("{} fail newest", verifies(a)));
    let (crc, id) = s.sectors[t];
    let tables = |h: Option<&Header>| {
        h.map_or("-".into(), |h| {
            format!("{:08x}", h.table[bad_strip * sps + t])
        })
    };
    let _ = writeln!(
        out,
        "    strip {i} on {} @{}: {head}, {vs_auth}; sector {t}: write {id} crc {crc:08x}; \
         table entry for the bad sector: own {} newest {}",
        loc.pdisk,
        loc.offset,
        tables(s.header.as_ref().ok()),
        tables(auth),
    );
}
