//! Background work of an open array, in threads it owns:
//!
//! * the maintenance worker: rewrites stale strips, catches up resuming pdisks, rebuilds
//!   strips of missing, dead, draining and replaced pdisks into spare space (the stripes
//!   that lost the most redundancy first), then rebalances strips onto emptier pdisks
//!   (a replacement). Each unit of work is one strip; the metadata (stripe maps) is
//!   written after every [`BATCH_STRIPS`] moves. While foreground I/O is active it is
//!   throttled to leave `rebuild_io_share` percent of the time to it;
//! * the dirty-region cleaner: clears regions idle for a second, after a flush;
//! * the scrubber (on demand): reads and verifies every strip at `scrub_rate_mb_s`.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::core::{DaCore, Loc, VdiskCore};
use crate::da::{enclosure_ids, spare_sectors};
use crate::error::VdiskError;
use crate::meta::PdiskState;
use crate::pdisk::Pdisk;
use crate::placement::{self, Candidate};
use crate::status::ScrubReport;

/// Strips moved between metadata writes.
pub const BATCH_STRIPS: usize = 64;
/// Stripes rebuilt at once: enough to keep every surviving pdisk busy reading while
/// strips are reconstructed and written.
const REBUILD_STRIPES_IN_FLIGHT: usize = 8;
/// Strips moved per rebalance round.
const REBALANCE_ROUND: usize = 32;
/// Longest single throttling pause, so that stop requests are honoured promptly.
const PAUSE_MAX: Duration = Duration::from_millis(500);
/// Foreground I/O this recent counts as "active" for throttling.
const FOREGROUND_WINDOW: Duration = Duration::from_secs(1);

pub fn spawn_workers(core: &Arc<DaCore>) -> Vec<JoinHandle<()>> {
    let m = core.clone();
    let c = core.clone();
    vec![
        std::thread::Builder::new()
            .name(format!("da-{}-maint", core.name))
            .spawn(move || maintenance(&m))
            .expect("spawn maintenance worker"),
        std::thread::Builder::new()
            .name(format!("da-{}-dirty", core.name))
            .spawn(move || cleaner(&c))
            .expect("spawn dirty-region cleaner"),
    ]
}

pub fn spawn_scrub(core: &Arc<DaCore>) -> JoinHandle<()> {
    let c = core.clone();
    std::thread::Builder::new()
        .name(format!("da-{}-scrub", core.name))
        .spawn(move || {
            let rate = u64::from(c.settings.lock().scrub_rate_mb_s) * 1_000_000;
            if let Err(e) = scrub_pass(&c, Some(rate)) {
                c.event(format!("scrub stopped: {e}"));
            }
        })
        .expect("spawn scrubber")
}

fn stopping(core: &DaCore) -> bool {
    core.stop.load(Ordering::Acquire)
}

fn vdisk_list(core: &DaCore) -> Vec<Arc<VdiskCore>> {
    core.vdisks.read().values().cloned().collect()
}

fn maintenance(core: &DaCore) {
    while !stopping(core) {
        let did = match run_once(core) {
            Ok(did) => did,
            Err(e) => {
                core.event(format!("maintenance: {e}"));
                false
            }
        };
        report_failed_moves(core);
        if !did {
            let mut woken = core.wake_lock.lock();
            if !*woken && !stopping(core) {
                core.wake.wait_for(&mut woken, Duration::from_millis(500));
            }
            *woken = false;
        }
    }
}

/// How often a pdisk suspended as unreachable is probed. With the default
/// `pdisk_error_limit` of 8 failed probes, an enclosure has about two minutes to come back
/// before its pdisks are declared dead and rebuilt.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(15);

/// One bounded unit of maintenance; true when something was done.
fn run_once(core: &DaCore) -> Result<bool, VdiskError> {
    if probe_unreachable(core)? {
        return Ok(true);
    }
    if repair_stale(core)? {
        return Ok(true);
    }
    if catch_up(core)? {
        return Ok(true);
    }
    if rebuild(core)? {
        return Ok(true);
    }
    rebalance(core)
}

/// What maintenance work is pending, if any.
pub fn pending_work(core: &DaCore) -> Option<&'static str> {
    let given_up = core.given_up.lock().clone();
    let pdisks = core.pdisks.read().clone();
    if core.stale_list().iter().any(|s| {
        let vd = core
            .vdisks
            .read()
            .values()
            .find(|v| v.id == s.vdisk_id)
            .cloned();
        vd.is_some_and(|vd| {
            let loc = vd.loc(s.stripe, usize::from(s.strip));
            pdisks[usize::from(loc.pdisk)].writable()
                && !given_up.contains(&(s.vdisk_id, s.stripe, s.strip))
        })
    }) {
        return Some("stale strips");
    }
    if pdisks.iter().any(|p| p.catching_up.load(Ordering::Acquire)) {
        return Some("catch-up");
    }
    if !evacuation_plan(core, &given_up).is_empty() {
        return Some("rebuild");
    }
    rebalance_pair(core).map(|_| "rebalance")
}

fn throttle(core: &DaCore, work_started: Instant) {
    let share = u32::from(core.settings.lock().rebuild_io_share);
    let active = core
        .last_foreground
        .lock()
        .is_some_and(|t| t.elapsed() < FOREGROUND_WINDOW);
    if share == 0 || !active {
        return;
    }
    let pause = work_started.elapsed() * share / (100 - share).max(1);
    std::thread::sleep(pause.min(PAUSE_MAX));
}

/// Counts a strip that could not be rebuilt or moved, for [`report_failed_moves`].
fn note_failed_move(core: &DaCore, vd: &VdiskCore, what: &'static str, first: String) {
    let mut failed = core.failed_moves.lock();
    let entry = failed
        .entry((vd.name.clone(), what))
        .or_insert_with(|| (0, first));
    entry.0 += 1;
}

/// One event per vdisk and kind of failure of the step that just ended, with a count.
fn report_failed_moves(core: &DaCore) {
    let failed = std::mem::take(&mut *core.failed_moves.lock());
    for ((vdisk, what), (count, first)) in failed {
        let strips = if count == 1 { "strip" } else { "strips" };
        core.event(format!(
            "vdisk {vdisk}: {what} {count} {strips} (the first: {first})"
        ));
    }
}

/// Records a failed strip move. Data loss is not retried until a pdisk changes state; an
/// I/O error (a failing target, counted against it) is retried on the next pass.
fn give_up(core: &DaCore, vd: &VdiskCore, stripe: u64, strip: usize, e: &VdiskError) {
    let first = format!("stripe {stripe} strip {strip}: {e}");
    if !matches!(e, VdiskError::Unrecoverable { .. }) {
        note_failed_move(core, vd, "move failed, will retry, for", first);
        return;
    }
    if core.given_up.lock().insert((vd.id, stripe, strip as u16)) {
        note_failed_move(
            core,
            vd,
            "cannot rebuild (more strips lost than the code tolerates; reads of them \
             fail)",
            first,
        );
    }
}

fn repair_stale(core: &DaCore) -> Result<bool, VdiskError> {
    let stale = core.stale_list();
    let vdisks = vdisk_list(core);
    let mut done = 0;
    for s in stale.iter().take(BATCH_STRIPS) {
        let Some(vd) = vdisks.iter().find(|v| v.id == s.vdisk_id) else {
            continue;
        };
        let i = usize::from(s.strip);
        let loc = vd.loc(s.stripe, i);
        if !core.pdisk(loc.pdisk).writable()
            || core.given_up.lock().contains(&(vd.id, s.stripe, s.strip))
        {
            continue;
        }
        let started = Instant::now();
        match core.relocate(vd, s.stripe, i, loc, loc) {
            Ok(_) => done += 1,
            Err(e) => give_up(core, vd, s.stripe, i, &e),
        }
        throttle(core, started);
    }
    if done > 0 {
        core.persist_meta()?;
    }
    Ok(done > 0)
}

/// Probes the pdisks suspended because their drive was unreachable: one whose label reads
/// back as this array's and this pdisk's is resumed (its skipped writes are caught up);
/// one that failed `pdisk_error_limit` probes is declared dead, and rebuilt.
fn probe_unreachable(core: &DaCore) -> Result<bool, VdiskError> {
    let limit = core.settings.lock().pdisk_error_limit;
    let pdisks = core.pdisks.read().clone();
    let mut changed = false;
    for pd in &pdisks {
        let mut mark = pd.unreachable.lock();
        let Some(u) = *mark else {
            continue;
        };
        // Read under the mark's guard: the mark and the suspension are made under it.
        if pd.state() != PdiskState::Suspended {
            // An administrator took over (resume, fail, replace).
            *mark = None;
            continue;
        }
        drop(mark);
        if u.last_probe.elapsed() < PROBE_INTERVAL {
            continue;
        }
        let mut sector = tessera_drive::AlignedBuf::zeroed(crate::layout::SECTOR_USIZE);
        let answer = pd
            .read(&mut sector, crate::layout::LABEL_OFFSET)
            .map_err(|e| e.to_string())
            .and_then(|()| crate::layout::Label::decode(&sector))
            .and_then(|label| match label {
                Some(l) if l.da_uuid == core.uuid && l.pdisk_uuid == pd.uuid => Ok(()),
                _ => Err("the drive answers but does not carry this pdisk's label".to_owned()),
            });
        let mut guard = pd.unreachable.lock();
        match answer {
            Ok(()) => {
                *guard = None;
                drop(guard);
                pd.catching_up.store(true, Ordering::Release);
                core.event(format!(
                    "pdisk {}: reachable again after {} s; resuming, catching up skipped writes",
                    pd.name,
                    u.since.elapsed().as_secs()
                ));
                core.kick();
                changed = true;
            }
            Err(why) => {
                let failed = u.failed_probes + 1;
                *guard = Some(crate::pdisk::Unreachable {
                    last_probe: Instant::now(),
                    failed_probes: failed,
                    ..u
                });
                drop(guard);
                if failed >= limit {
                    *pd.unreachable.lock() = None;
                    core.set_pdisk_state(
                        pd,
                        PdiskState::Dead,
                        &format!(
                            "unreachable for {} s ({failed} failed probes; last: {why})",
                            u.since.elapsed().as_secs()
                        ),
                    );
                    core.persist_meta()?;
                    changed = true;
                }
            }
        }
    }
    Ok(changed)
}

fn catch_up(core: &DaCore) -> Result<bool, VdiskError> {
    let Some(pd) = core
        .pdisks
        .read()
        .iter()
        .find(|p| p.catching_up.load(Ordering::Acquire))
        .cloned()
    else {
        return Ok(false);
    };
    let mut progress_total = 0;
    let vdisks = vdisk_list(core);
    for vd in &vdisks {
        progress_total += vd.stripes;
    }
    core.rebuild.lock().begin(progress_total);
    let mut lagging = 0;
    for vd in &vdisks {
        for s in 0..vd.stripes {
            if stopping(core) || !pd.catching_up.load(Ordering::Acquire) {
                return Ok(true);
            }
            for i in (0..vd.n).filter(|&i| vd.loc(s, i).pdisk == pd.index) {
                let started = Instant::now();
                match core.catch_up(vd, s, i) {
                    Ok(b) => core.rebuild.lock().bytes += b.unwrap_or(0),
                    Err(e) => {
                        lagging += 1;
                        give_up(core, vd, s, i, &e);
                        core.add_stale(crate::meta::StaleStrip {
                            vdisk_id: vd.id,
                            stripe: s,
                            strip: i as u16,
                        });
                    }
                }
                throttle(core, started);
            }
            core.rebuild.lock().done += 1;
        }
    }
    pd.catching_up.store(false, Ordering::Release);
    core.set_pdisk_state(
        &pd,
        PdiskState::Ok,
        &format!("resumed; caught up ({lagging} strips could not be)"),
    );
    core.rebuild.lock().finish();
    core.persist_meta()?;
    Ok(true)
}

/// Strips on pdisks being evacuated, most endangered stripes first.
fn evacuation_plan(
    core: &DaCore,
    given_up: &HashSet<(u32, u64, u16)>,
) -> Vec<(Arc<VdiskCore>, u64, usize)> {
    let pdisks = core.pdisks.read().clone();
    let mut plan = Vec::new();
    for vd in vdisk_list(core) {
        for s in 0..vd.stripes {
            let mut down = 0;
            let mut moving = Vec::new();
            for i in 0..vd.n {
                let p = &pdisks[usize::from(vd.loc(s, i).pdisk)];
                if !p.readable() {
                    down += 1;
                }
                if p.state().evacuate() && !given_up.contains(&(vd.id, s, i as u16)) {
                    moving.push(i);
                }
            }
            for i in moving {
                plan.push((down, vd.clone(), s, i));
            }
        }
    }
    plan.sort_by_key(|(down, vd, s, _)| (std::cmp::Reverse(*down), vd.id, *s));
    plan.into_iter().map(|(_, vd, s, i)| (vd, s, i)).collect()
}

/// Candidates for rebuilt or moved strips: Ok pdisks with all their free space (spare
/// included).
fn targets(core: &DaCore, slot_sectors: u64) -> Vec<Candidate> {
    let pdisks = core.pdisks.read().clone();
    let enc = enclosure_ids(&pdisks);
    pdisks
        .iter()
        .zip(enc)
        .filter(|(p, _)| p.state() == PdiskState::Ok && p.readable())
        .map(|(p, e)| {
            let space = p.space.lock();
            Candidate {
                pdisk: p.index,
                enclosure: e,
                capacity: space.slots_free(slot_sectors),
                load: space.used_sectors() / slot_sectors,
            }
        })
        .collect()
}

fn members(core: &DaCore, vd: &VdiskCore, stripe: u64, except: usize) -> Vec<(u16, u32)> {
    let pdisks = core.pdisks.read().clone();
    let enc = enclosure_ids(&pdisks);
    (0..vd.n)
        .filter(|&i| i != except)
        .map(|i| {
            let p = vd.loc(stripe, i).pdisk;
            (p, enc[usize::from(p)])
        })
        .collect()
}

/// Moves strip `i` to `target` (allocating a slot there); the slot is freed again on
/// failure. Returns bytes moved, or `None` when nothing was moved.
fn move_strip(
    core: &DaCore,
    vd: &VdiskCore,
    stripe: u64,
    i: usize,
    target: &Pdisk,
) -> Result<Option<u64>, VdiskError> {
    let from = vd.loc(stripe, i);
    let Some(sector) = target.space.lock().alloc(vd.slot_sectors) else {
        return Ok(None);
    };
    let to = Loc {
        pdisk: target.index,
        sector,
    };
    match core.relocate(vd, stripe, i, from, to) {
        Ok(Some(b)) => Ok(Some(b)),
        Ok(None) => {
            target.space.lock().release(sector, vd.slot_sectors);
            Ok(None)
        }
        Err(e) => {
            target.space.lock().release(sector, vd.slot_sectors);
            Err(e)
        }
    }
}

fn fingerprint(core: &DaCore) -> Vec<(PdiskState, bool)> {
    core.pdisks
        .read()
        .iter()
        .map(|p| (p.state(), p.catching_up.load(Ordering::Acquire)))
        .collect()
}

fn rebuild(core: &DaCore) -> Result<bool, VdiskError> {
    let given_up = core.given_up.lock().clone();
    let plan = evacuation_plan(core, &given_up);
    if plan.is_empty() {
        finish_drains(core)?;
        return Ok(false);
    }
    let states = fingerprint(core);
    core.rebuild.lock().begin(plan.len() as u64);
    // The plan lists a stripe's strips next to each other; one job rebuilds one stripe,
    // so jobs running at once never place two strips of a stripe on the same pdisk.
    let mut jobs: Vec<Vec<(Arc<VdiskCore>, u64, usize)>> = Vec::new();
    for (vd, s, i) in plan {
        match jobs.last_mut() {
            Some(job) if job[0].0.id == vd.id && job[0].1 == s => job.push((vd, s, i)),
            _ => jobs.push(vec![(vd, s, i)]),
        }
    }
    for batch in jobs.chunks(BATCH_STRIPS) {
        if stopping(core) || fingerprint(core) != states {
            break;
        }
        let started = Instant::now();
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..REBUILD_STRIPES_IN_FLIGHT.min(batch.len()) {
                scope.spawn(|| loop {
                    let at = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = batch.get(at) else { break };
                    for (vd, s, i) in job {
                        if vd.deleted.load(Ordering::Acquire) {
                            break;
                        }
                        rebuild_strip(core, vd, *s, *i);
                    }
                });
            }
        });
        core.persist_meta()?;
        throttle(core, started);
    }
    core.persist_meta()?;
    core.rebuild.lock().finish();
    finish_drains(core)?;
    Ok(true)
}

/// Reconstructs strip `i` of `stripe` onto a spare slot of a pdisk the stripe does not
/// use yet, or records why it cannot.
fn rebuild_strip(core: &DaCore, vd: &Arc<VdiskCore>, s: u64, i: usize) {
    let cands = targets(core, vd.slot_sectors);
    let salt = placement::mix(u64::from(vd.id) << 40 ^ s ^ (i as u64) << 56);
    let Some(t) = placement::pick_target(&cands, &members(core, vd, s, i), vd.n, salt) else {
        let why = if cands.len() < vd.n {
            format!(
                "only {} pdisks are in service and {} needs {} distinct pdisks; \
                 replace failed pdisks",
                cands.len(),
                vd.code,
                vd.n
            )
        } else {
            "no spare space left; add or replace pdisks".to_string()
        };
        if core.given_up.lock().insert((vd.id, s, i as u16)) {
            note_failed_move(
                core,
                vd,
                "rebuild cannot move",
                format!("stripe {s} strip {i}: {why}"),
            );
        }
        core.rebuild.lock().done += 1;
        return;
    };
    let target = core.pdisk(t);
    match move_strip(core, vd, s, i, &target) {
        Ok(moved) => core.rebuild.lock().bytes += moved.unwrap_or(0),
        Err(e) => {
            if matches!(e, VdiskError::Unrecoverable { .. }) {
                core.rebuild.lock().unrecoverable += 1;
            }
            give_up(core, vd, s, i, &e);
        }
    }
    core.rebuild.lock().done += 1;
}

/// Draining pdisks that hold no strips any more are done: declared dead (empty).
fn finish_drains(core: &DaCore) -> Result<(), VdiskError> {
    let draining: Vec<Arc<Pdisk>> = core
        .pdisks
        .read()
        .iter()
        .filter(|p| p.state() == PdiskState::Draining)
        .cloned()
        .collect();
    let mut changed = false;
    for p in draining {
        let holds = vdisk_list(core)
            .iter()
            .any(|vd| (0..vd.stripes).any(|s| (0..vd.n).any(|i| vd.loc(s, i).pdisk == p.index)));
        if !holds {
            core.set_pdisk_state(&p, PdiskState::Dead, "drained: holds no strips any more");
            changed = true;
        }
    }
    if changed {
        core.persist_meta()?;
    }
    Ok(())
}

/// The least filled Ok pdisk and the pdisks filled more than two slots above it, fullest
/// first; `None` when balanced (or when the last round found nothing it could move).
fn rebalance_pair(core: &DaCore) -> Option<(Vec<Arc<Pdisk>>, Arc<Pdisk>)> {
    if core.rebalance_stuck.load(Ordering::Acquire) {
        return None;
    }
    let slot = vdisk_list(core).iter().map(|v| v.slot_sectors).max()?;
    let mut ok: Vec<(Arc<Pdisk>, f64, u64, u64)> = core
        .pdisks
        .read()
        .iter()
        .filter(|p| p.state() == PdiskState::Ok && p.readable())
        .map(|p| {
            let s = p.space.lock();
            let total = s.total_sectors().max(1);
            (
                p.clone(),
                s.used_sectors() as f64 / total as f64,
                s.used_sectors(),
                total,
            )
        })
        .collect();
    ok.sort_by(|a, b| b.1.total_cmp(&a.1));
    let light = ok.last()?.clone();
    if light.3 - light.2 <= spare_sectors(core, &light.0) / 2 + slot {
        return None;
    }
    let heavy: Vec<Arc<Pdisk>> = ok
        .iter()
        .filter(|h| (h.1 - light.1) * light.3 as f64 > 2.0 * slot as f64)
        .map(|h| h.0.clone())
        .collect();
    (!heavy.is_empty()).then_some((heavy, light.0))
}

/// Whether moving one more slot from `heavy` to `light` still narrows their fill gap
/// without reversing it.
fn imbalanced(heavy: &Pdisk, light: &Pdisk, slot: u64) -> bool {
    let fill = |p: &Pdisk| {
        let s = p.space.lock();
        (
            s.used_sectors() as f64 / s.total_sectors().max(1) as f64,
            s.total_sectors(),
        )
    };
    let ((h, _), (l, l_total)) = (fill(heavy), fill(light));
    (h - l) * l_total as f64 > 2.0 * slot as f64
}

fn rebalance(core: &DaCore) -> Result<bool, VdiskError> {
    let Some((heavies, light)) = rebalance_pair(core) else {
        return Ok(false);
    };
    let pdisks = core.pdisks.read().clone();
    let enc = enclosure_ids(&pdisks);
    let sizes = {
        let mut v = vec![0usize; enc.iter().map(|&e| e as usize + 1).max().unwrap_or(0)];
        for p in pdisks.iter().filter(|p| p.state() == PdiskState::Ok) {
            v[enc[usize::from(p.index)] as usize] += 1;
        }
        v.retain(|&c| c > 0);
        v
    };
    let light_enc = enc[usize::from(light.index)];
    let mut moved = 0;
    'outer: for heavy in &heavies {
        let same_enclosure = light_enc == enc[usize::from(heavy.index)];
        for vd in vdisk_list(core) {
            let cap = placement::enclosure_cap(vd.n, &sizes).unwrap_or(vd.n);
            for s in 0..vd.stripes {
                if stopping(core) || moved >= REBALANCE_ROUND {
                    break 'outer;
                }
                if !imbalanced(heavy, &light, vd.slot_sectors) {
                    continue 'outer;
                }
                let Some(i) = (0..vd.n).find(|&i| vd.loc(s, i).pdisk == heavy.index) else {
                    continue;
                };
                let others = members(core, &vd, s, i);
                let light_count = others.iter().filter(|&&(_, e)| e == light_enc).count();
                if others.iter().any(|&(p, _)| p == light.index)
                    || (!same_enclosure && light_count >= cap)
                {
                    continue;
                }
                let started = Instant::now();
                match move_strip(core, &vd, s, i, &light) {
                    Ok(Some(_)) => moved += 1,
                    Ok(None) => {}
                    Err(e) => give_up(core, &vd, s, i, &e),
                }
                throttle(core, started);
            }
        }
        if moved > 0 {
            break;
        }
    }
    if moved == 0 {
        core.rebalance_stuck.store(true, Ordering::Release);
        return Ok(false);
    }
    core.persist_meta()?;
    core.event(format!("rebalanced {moved} strips onto {}", light.name));
    Ok(true)
}

fn cleaner(core: &DaCore) {
    while !stopping(core) {
        std::thread::sleep(Duration::from_millis(200));
        let ticket = core.dirty.clean_candidates(false);
        if ticket.is_empty() {
            continue;
        }
        if core.flush_pdisks(usize::MAX).is_err() {
            continue;
        }
        if core.dirty.clear(&ticket) > 0 {
            if let Err(e) = core.persist_dirty(u64::MAX) {
                core.event(format!("dirty-region cleaner: {e}"));
            }
        }
    }
}

/// One scrub pass over every stripe of every vdisk, at `rate` bytes per second (read from
/// all pdisks together) or unthrottled.
pub fn scrub_pass(core: &DaCore, rate: Option<u64>) -> Result<ScrubReport, VdiskError> {
    let vdisks = vdisk_list(core);
    core.scrub
        .lock()
        .begin(vdisks.iter().map(|v| v.stripes).sum());
    let started = Instant::now();
    let mut report = ScrubReport::default();
    'all: for vd in &vdisks {
        for s in 0..vd.stripes {
            if stopping(core) || vd.deleted.load(Ordering::Acquire) {
                break 'all;
            }
            core.scrub_stripe(vd, s, &mut report)?;
            {
                let mut p = core.scrub.lock();
                p.done += 1;
                p.bytes = report.bytes;
                p.repaired = report.repaired_sectors;
                p.parity_mismatches = report.parity_mismatches;
                p.unrecoverable = report.unrecoverable;
            }
            if let Some(rate) = rate.filter(|&r| r > 0) {
                let due = Duration::from_secs_f64(report.bytes as f64 / rate as f64);
                let elapsed = started.elapsed();
                if due > elapsed {
                    std::thread::sleep((due - elapsed).min(PAUSE_MAX));
                }
            }
        }
    }
    core.scrub.lock().finish();
    if report.repaired_sectors + report.parity_mismatches + report.unrecoverable > 0 {
        core.event(format!(
            "scrub: {} stripes, {} sectors repaired, {} parity mismatches, {} unrecoverable",
            report.stripes, report.repaired_sectors, report.parity_mismatches, report.unrecoverable
        ));
    }
    Ok(report)
}
