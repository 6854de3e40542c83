//! Crash consistency of vdisk writes: a child process writes full stripes and partial
//! stripes and discards (TRIMs) whole stripes, flushing now and then, and records in a
//! ledger each write or discard before it starts and each flush after it returned (a
//! discarded sector must read as zeros once durable). The parent kills it with SIGKILL at a random moment,
//! reopens the array (which resynchronises the dirty regions), and checks every sector:
//! it must hold the last write that a flush made durable, or one of the writes issued
//! after that flush (each sector is atomic). Then a scrub must find every stripe
//! consistent: no checksum failure, no parity mismatch.
//!
//! `power_loss_loop` runs the same with the child's pdisks behind volatile write caches
//! (`SimDrive`): the kill is then also a power loss of every pdisk, which keeps a random
//! subset of the unflushed sectors (`TESSERA_POWERLOSS_ITERATIONS`, default 10;
//! `TESSERA_POWERLOSS_SEED` replays the random choices of a run, printed at its start).
//!
//! Before every reopen the loop takes a snapshot of every strip (headers and per-sector
//! checksums, read from the files); a sector that fails its check is explained from it
//! (`forensics`): the stripe's strips before and after recovery, the writes that touched
//! it, and what recovery reported.

mod common;
mod forensics;

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use tessera_drive::{AlignedBuf, BlockDevice, VolatileCacheConfig};
use tessera_vdisk::{Code, DaOptions, DeclusteredArray, VdiskSize};

const ITERATIONS: usize = 10;
const BLOCK: u64 = 256 << 10;
const VDISK_BYTES: u64 = 72 << 20;
const SECTOR: u64 = 4096;

/// The content of sector `sector` as written by write `id`: the id and sector number
/// first (to identify it), then pseudo-random bytes.
fn sector_content(id: u64, sector: u64, out: &mut [u8]) {
    let p = pattern(SECTOR as usize, id.wrapping_mul(1_000_003) ^ sector);
    out.copy_from_slice(&p);
    out[..8].copy_from_slice(&id.to_le_bytes());
    out[8..16].copy_from_slice(&sector.to_le_bytes());
}

fn write_content(id: u64, first_sector: u64, sectors: u64) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed((sectors * SECTOR) as usize);
    for (i, chunk) in buf.chunks_mut(SECTOR as usize).enumerate() {
        sector_content(id, first_sector + i as u64, chunk);
    }
    buf
}

struct Ledger(std::fs::File);

impl Ledger {
    fn record(&mut self, line: &str) {
        writeln!(self.0, "{line}").unwrap();
        self.0.sync_data().unwrap();
    }
}

/// Writer threads in the child: more writes in flight when the kill lands.
const WRITERS: u64 = 3;

#[test]
#[ignore = "entry point of the crash child; run by crash_loop"]
fn crash_child() {
    let Ok(dir) = std::env::var("TESSERA_VDISK_CRASH_DIR") else {
        return;
    };
    let iteration: u64 = std::env::var("TESSERA_VDISK_CRASH_ITER")
        .unwrap()
        .parse()
        .unwrap();
    let seed: u64 = std::env::var("TESSERA_VDISK_CRASH_SEED")
        .unwrap()
        .parse()
        .unwrap();
    let round = mix(seed, iteration);
    let paths: Vec<_> = (0..12)
        .map(|i| Path::new(&dir).join(format!("pd{i:02}")))
        .collect();
    let da = if std::env::var_os("TESSERA_VDISK_VOLATILE").is_some() {
        DeclusteredArray::open_with("da1", &paths, &volatile_pdisks(round)).unwrap()
    } else {
        DeclusteredArray::open("da1", &paths).unwrap()
    };
    let v = da.vdisk("v").unwrap();
    let ledger = Mutex::new(Ledger(
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(format!("{dir}/ledger-{iteration}"))
            .unwrap(),
    ));
    std::thread::scope(|s| {
        for writer in 0..WRITERS {
            let (v, ledger) = (&v, &ledger);
            s.spawn(move || write_loop(v.as_ref(), ledger, iteration, round, writer));
        }
    });
}

/// A seed for round `iteration` of a run seeded with `seed`.
fn mix(seed: u64, iteration: u64) -> u64 {
    (seed ^ iteration.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_mul(0xbf58_476d_1ce4_e5b9)
}

/// The run's seed: `TESSERA_POWERLOSS_SEED`, else the clock (printed, so a run replays).
fn run_seed() -> u64 {
    let seed = std::env::var("TESSERA_POWERLOSS_SEED")
        .ok()
        .map(|v| v.parse().expect("TESSERA_POWERLOSS_SEED: a number"))
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("crash loop seed {seed} (TESSERA_POWERLOSS_SEED={seed} replays it)");
    seed
}

/// Pdisks behind volatile write caches, seeded per round and per pdisk.
fn volatile_pdisks(round: u64) -> DaOptions {
    let opened = Arc::new(AtomicU64::new(0));
    let opener: tessera_vdisk::DeviceOpener = Arc::new(move |path: &Path| {
        let cache = VolatileCacheConfig {
            seed: round.wrapping_add(opened.fetch_add(1, Ordering::Relaxed)),
            capacity_bytes: 8 << 20,
            ..VolatileCacheConfig::default()
        };
        let inner = Arc::new(tessera_testkit::open_drive_waiting(path)?);
        let d: Arc<dyn BlockDevice> = Arc::new(SimDrive::with_cache(inner, Arc::default(), cache));
        Ok(d)
    });
    DaOptions {
        opener: Some(opener),
        ..DaOptions::default()
    }
}

/// One writer: whole blocks and partial blocks, only in blocks `b % WRITERS == writer` so
/// that no two writers touch the same sector (their order is then the ledger's order).
fn write_loop(
    v: &dyn BlockDevice,
    ledger: &Mutex<Ledger>,
    iteration: u64,
    round: u64,
    writer: u64,
) {
    let mut rng = (round ^ writer).wrapping_mul(6_364_136_223_846_793_005) | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let block_sectors = BLOCK / SECTOR;
    let blocks = VDISK_BYTES / BLOCK;
    for step in 0u64.. {
        let id = forensics::write_id(iteration, step, writer, WRITERS);
        // Mostly the first 64 MiB (one dirty region), sometimes the tail.
        let span = if next() % 10 == 0 {
            blocks
        } else {
            blocks * 2 / 3
        };
        let block = (next() % (span / WRITERS)) * WRITERS + writer;
        let whole = next() % 3 == 0;
        if whole && next() % 4 == 0 {
            // A discard (TRIM) of the whole block: it reads as zeros once durable.
            let first = block * block_sectors;
            ledger
                .lock()
                .unwrap()
                .record(&format!("T {id} {first} {block_sectors}"));
            v.discard(first * SECTOR, BLOCK).unwrap();
            if next() % 4 == 0 {
                v.flush().unwrap();
                ledger.lock().unwrap().record(&format!("D {id}"));
            }
            continue;
        }
        let (first, sectors) = if whole {
            (block * block_sectors, block_sectors)
        } else {
            let sectors = 1 + next() % block_sectors;
            let at = next() % (block_sectors - sectors + 1);
            (block * block_sectors + at, sectors)
        };
        ledger
            .lock()
            .unwrap()
            .record(&format!("W {id} {first} {sectors}"));
        if next() % 5 == 0 {
            // A synchronous write: its strips and parity go to the pdisks written through
            // (FUA), durable on return without a flush.
            v.write_fua(&write_content(id, first, sectors), first * SECTOR)
                .unwrap();
            ledger.lock().unwrap().record(&format!("D {id}"));
            continue;
        }
        v.write_at(&write_content(id, first, sectors), first * SECTOR)
            .unwrap();
        if next() % 4 == 0 {
            v.flush().unwrap();
            ledger.lock().unwrap().record(&format!("D {id}"));
        }
    }
}

/// What one child run did.
struct Ledgered {
    /// Writes and discards, in the order they started.
    writes: Vec<(u64, u64, u64)>,
    /// Those a flush made durable.
    durable: HashSet<u64>,
    /// Those that were discards: their sectors read as zeros.
    discards: HashSet<u64>,
}

fn read_ledger(path: &Path) -> Ledgered {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut writes = Vec::new();
    let mut durable = HashSet::new();
    let mut discards = HashSet::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        match f.as_slice() {
            [kind @ ("W" | "T"), id, first, n] => {
                let id: u64 = id.parse().unwrap();
                if *kind == "T" {
                    discards.insert(id);
                }
                writes.push((id, first.parse().unwrap(), n.parse().unwrap()));
            }
            ["D", id] => {
                durable.insert(id.parse().unwrap());
            }
            _ => {} // a torn last line
        }
    }
    Ledgered {
        writes,
        durable,
        discards,
    }
}

/// A sector that holds neither its last durable write nor a later one.
struct BadSector {
    sector: u64,
    found: u64,
    expected: Vec<u64>,
}

/// Checks every sector against the ledger and updates `baseline` (the write id each sector
/// holds, 0 = never written) to what was found. Returns the sectors checked against a
/// durable write, or the first sector that is wrong.
fn verify(
    v: &dyn BlockDevice,
    baseline: &mut [u64],
    writes: &[(u64, u64, u64)],
    durable: &HashSet<u64>,
    discards: &HashSet<u64>,
) -> Result<u64, BadSector> {
    let total = baseline.len() as u64;
    let mut cands: Vec<Vec<u64>> = baseline.iter().map(|&b| vec![b]).collect();
    for &(id, first, n) in writes {
        for s in first..first + n {
            let c = &mut cands[s as usize];
            // A flush after a write covers every earlier write of the same writer, and
            // only one writer touches a sector.
            if durable.contains(&id) {
                c.clear();
            }
            c.push(if discards.contains(&id) { 0 } else { id });
        }
    }
    let chunk = 4 << 20;
    let mut checked = 0;
    let mut expect = vec![0u8; SECTOR as usize];
    for start in (0..total * SECTOR).step_by(chunk) {
        let got = read(v, start, chunk).unwrap();
        for (i, sector) in got.chunks(SECTOR as usize).enumerate() {
            let s = start / SECTOR + i as u64;
            let id = u64::from_le_bytes(sector[..8].try_into().unwrap());
            let ok = if sector.iter().all(|&b| b == 0) {
                cands[s as usize].contains(&0)
            } else if cands[s as usize].contains(&id) {
                sector_content(id, s, &mut expect);
                sector[..] == expect[..]
            } else {
                false
            };
            if !ok {
                return Err(BadSector {
                    sector: s,
                    found: id,
                    expected: cands[s as usize].clone(),
                });
            }
            baseline[s as usize] = if sector.iter().all(|&b| b == 0) {
                0
            } else {
                id
            };
            if cands[s as usize].len() == 1 && cands[s as usize][0] != 0 {
                checked += 1;
            }
        }
    }
    Ok(checked)
}

#[test]
fn crash_loop() {
    let iterations = tessera_testkit::iterations("TESSERA_CRASH_ITERATIONS", ITERATIONS);
    kill_loop(iterations, false);
}

#[test]
fn power_loss_loop() {
    let iterations = tessera_testkit::iterations("TESSERA_POWERLOSS_ITERATIONS", ITERATIONS);
    kill_loop(iterations, true);
}

/// Runs the child `iterations` times and kills it; with `volatile` its pdisks have
/// volatile write caches, so the kill is a power loss.
fn kill_loop(iterations: usize, volatile: bool) {
    let seed = run_seed();
    let t = make_pdisks(12, 6, 64 * MIB);
    let da = create(&t, DaOptions::default());
    let v = da
        .create_vdisk(
            "v",
            Code::parse("8+2p").unwrap(),
            BLOCK,
            VdiskSize::Bytes(VDISK_BYTES),
        )
        .unwrap();
    let mut map = forensics::stripe_map(&v);
    da.close().unwrap();
    drop((v, da));
    let exe = std::env::current_exe().unwrap();
    let mut baseline = vec![0u64; (VDISK_BYTES / SECTOR) as usize];
    let (mut resynced, mut durable_sectors, mut writes_total) = (0, 0, 0);
    let (mut dirty_regions, mut rolled_back) = (0, 0);
    let started = std::time::Instant::now();
    let mut snapshot_time = Duration::ZERO;
    for iteration in 0..iterations {
        let mut child = Command::new(&exe);
        child
            .args(["--exact", "crash_child", "--ignored", "--nocapture"])
            .env("TESSERA_VDISK_CRASH_DIR", t.dir.path())
            .env("TESSERA_VDISK_CRASH_ITER", iteration.to_string())
            .env("TESSERA_VDISK_CRASH_SEED", seed.to_string())
            .stdout(std::process::Stdio::null());
        if volatile {
            child.env("TESSERA_VDISK_VOLATILE", "1");
        }
        let mut child = child.spawn().unwrap();
        let delay_ms = 250 + mix(seed, iteration as u64) % 500;
        std::thread::sleep(Duration::from_millis(delay_ms));
        if let Ok(Some(status)) = child.try_wait() {
            panic!("crash child exited on its own: {status}");
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();

        let snap_started = std::time::Instant::now();
        let before = forensics::snapshot(&map);
        snapshot_time += snap_started.elapsed();
        let da = DeclusteredArray::open("da1", &t.paths()).unwrap();
        let r = da.recovery_report();
        resynced += r.stripes_resynced;
        rolled_back += r.rolled_back_strips;
        dirty_regions += r.dirty_regions;
        let v = da.vdisk("v").unwrap();
        let Ledgered {
            writes,
            durable,
            discards,
        } = read_ledger(&t.dir.path().join(format!("ledger-{iteration}")));
        writes_total += writes.len();
        match verify(v.as_ref(), &mut baseline, &writes, &durable, &discards) {
            Ok(checked) => durable_sectors += checked,
            Err(bad) => {
                let failure = forensics::Failure {
                    what: format!(
                        "sector {}: holds write {}, expected one of {:?}",
                        bad.sector, bad.found, bad.expected
                    ),
                    seed,
                    iteration,
                    sector: bad.sector,
                    found: bad.found,
                    expected: &bad.expected,
                    writes: &writes,
                    durable: &durable,
                    writers: WRITERS,
                };
                let events = da.status().events;
                let report =
                    forensics::explain(&failure, &map, &before, &v, &format!("{r:?}"), &events);
                panic!("{report}");
            }
        }
        assert_eq!(
            r.lost_strips, 0,
            "iteration {iteration} (seed {seed}): {r:?}"
        );
        let scrub = da.scrub_now().unwrap();
        assert_eq!(
            (
                scrub.repaired_sectors,
                scrub.parity_mismatches,
                scrub.unrecoverable
            ),
            (0, 0, 0),
            "iteration {iteration} (seed {seed}): stripes inconsistent after recovery: \
             {scrub:?}, recovery {r:?}"
        );
        map = forensics::stripe_map(&v);
        da.close().unwrap();
        if (iteration + 1) % 50 == 0 {
            eprintln!(
                "{} rounds in {:.0} s, {writes_total} writes",
                iteration + 1,
                started.elapsed().as_secs_f64()
            );
        }
    }
    let what = if volatile { "power losses" } else { "crashes" };
    eprintln!(
        "{iterations} {what} in {:.0} s (seed {seed}), {writes_total} writes, {resynced} \
         stripes resynchronised, {rolled_back} rolled-back strips zeroed, {durable_sectors} \
         sectors checked against durable writes (forensic snapshots took {:.1} s)",
        started.elapsed().as_secs_f64(),
        snapshot_time.as_secs_f64()
    );
    assert!(
        writes_total > iterations * 5,
        "the workload made too little progress to test"
    );
    // Whether a kill lands between a data write and its parity write is luck (a few
    // stripes per run); that every kill mid-workload leaves dirty regions to check is not.
    assert!(
        dirty_regions >= iterations as u64 / 2,
        "crashes left only {dirty_regions} dirty regions: recovery was not exercised"
    );
}
