//! Failures of a 12-pdisk array in 6 enclosures: degraded reads with any two pdisks down,
//! a whole enclosure lost, flipped bits, rebuild into spare space, a third loss in the
//! same stripes (errors, never wrong data), replication, suspend/resume, replace.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use tessera_drive::BlockDevice;
use tessera_vdisk::{Code, DaState, DeclusteredArray, PdiskState, Vdisk, VdiskSize};

const BLOCK: u64 = 256 << 10;
const DATA: usize = 8 << 20;

fn setup(
    code: &str,
    block: u64,
) -> (
    TestPdisks,
    FaultBox,
    std::sync::Arc<DeclusteredArray>,
    std::sync::Arc<Vdisk>,
    Vec<u8>,
) {
    let t = make_pdisks(12, 6, 64 * MIB);
    let faults = FaultBox::default();
    let da = create(&t, faults.options());
    let v = da
        .create_vdisk(
            "v",
            Code::parse(code).unwrap(),
            block,
            VdiskSize::Bytes(16 * MIB),
        )
        .unwrap();
    let data = pattern(DATA, 42).to_vec();
    v.write_at(&pattern(DATA, 42), 0).unwrap();
    v.flush().unwrap();
    (t, faults, da, v, data)
}

fn check_all(v: &Vdisk, data: &[u8]) {
    let back = read(v, 0, data.len()).unwrap();
    assert!(back[..] == data[..], "data differs");
}

/// Reads every block: each must be either exact or a clear error naming the vdisk and a
/// stripe. Returns how many blocks failed.
fn check_exact_or_error(v: &Vdisk, data: &[u8]) -> usize {
    let b = v.block_size() as usize;
    let mut failed = 0;
    for (i, expect) in data.chunks(b).enumerate() {
        match read(v, (i * b) as u64, b) {
            Ok(got) => assert!(got[..] == expect[..], "block {i}: wrong data returned"),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("vdisk `v`") && msg.contains("stripe"), "{msg}");
                failed += 1;
            }
        }
    }
    failed
}

fn wait_idle(da: &DeclusteredArray) {
    assert!(
        da.wait_idle(Duration::from_secs(60)),
        "background work did not finish: {:?} {:?} {:#?}",
        da.pending_work(),
        da.status().rebuild,
        da.status().events
    );
}

#[test]
/// Every one of the 66 pairs of pdisks.
fn any_two_pdisks_down_reads_identical() {
    let (t, _f, da, v, data) = setup("8+2p", BLOCK);
    let names: Vec<String> = t.specs.iter().map(|s| s.name.clone()).collect();
    for a in 0..names.len() {
        for b in a + 1..names.len() {
            da.pdisk_suspend(&names[a]).unwrap();
            da.pdisk_suspend(&names[b]).unwrap();
            check_all(&v, &data);
            da.pdisk_resume(&names[a]).unwrap();
            da.pdisk_resume(&names[b]).unwrap();
            wait_idle(&da);
        }
    }
    assert!(v.stats().degraded_reads > 0);
    assert_eq!(da.status().state, DaState::Ok);
    da.close().unwrap();
}

#[test]
fn writes_while_suspended_are_caught_up_on_resume() {
    let (t, _f, da, v, mut data) = setup("8+2p", BLOCK);
    let names: Vec<String> = t.specs.iter().map(|s| s.name.clone()).collect();
    da.pdisk_suspend(&names[3]).unwrap();
    let new = pattern(3 << 20, 7);
    v.write_at(&new, 1 << 20).unwrap();
    data[1 << 20..4 << 20].copy_from_slice(&new);
    let small = pattern(8192, 8);
    v.write_at(&small, 5 * BLOCK + 4096).unwrap();
    let at = (5 * BLOCK + 4096) as usize;
    data[at..at + 8192].copy_from_slice(&small);
    check_all(&v, &data);
    da.pdisk_resume(&names[3]).unwrap();
    wait_idle(&da);
    // Now the caught-up pdisk must carry current strips: take two others away.
    da.pdisk_suspend(&names[5]).unwrap();
    da.pdisk_suspend(&names[8]).unwrap();
    check_all(&v, &data);
    da.close().unwrap();
}

/// Drives that cannot be reached (remote drives without a path) are suspended and written
/// around, not declared dead; one that answers again at a probe is resumed and caught up,
/// one that fails `pdisk_error_limit` probes is declared dead and rebuilt. Takes one probe
/// interval (15 s).
#[test]
fn unreachable_pdisks_are_written_around_then_resumed_or_rebuilt() {
    let (t, faults, da, v, mut data) = setup("8+2p", BLOCK);
    let (back, gone) = (&t.specs[2], &t.specs[7]);
    for s in [back, gone] {
        faults
            .faults(&s.device)
            .unreachable
            .store(true, Ordering::Relaxed);
    }
    // One failed probe is enough to give up on a drive.
    da.set_options(50, 200, 1).unwrap();
    check_all(&v, &data);
    let new = pattern(4 << 20, 9);
    v.write_at(&new, 2 << 20).unwrap();
    v.flush().unwrap();
    data[2 << 20..6 << 20].copy_from_slice(&new);
    check_all(&v, &data);
    let state = |name: &str| {
        da.status()
            .pdisks
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.state)
            .unwrap()
    };
    assert_eq!(state(&back.name), PdiskState::Suspended);
    assert_eq!(state(&gone.name), PdiskState::Suspended);
    faults
        .faults(&back.device)
        .unreachable
        .store(false, Ordering::Relaxed);
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    while state(&back.name) != PdiskState::Ok || state(&gone.name) != PdiskState::Dead {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?} {:?}: {:#?}",
            state(&back.name),
            state(&gone.name),
            da.status().events
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    wait_idle(&da);
    // The resumed pdisk carries the writes it missed: lose two others with it in place.
    da.pdisk_suspend(&t.specs[0].name).unwrap();
    da.pdisk_suspend(&t.specs[5].name).unwrap();
    check_all(&v, &data);
    da.close().unwrap();
}

/// An array opened (by the server it failed over to) while an enclosure is down: the
/// drives that open but do not answer are suspended as unreachable, not marked missing
/// and rebuilt, and when the enclosure comes back they are resumed and caught up with the
/// writes they missed. Takes one probe interval (15 s).
#[test]
fn an_array_opened_while_an_enclosure_is_down_catches_it_up_when_it_returns() {
    let (t, faults, da, v, mut data) = setup("8+2p", BLOCK);
    drop(v);
    da.close().unwrap();
    let e1: Vec<_> = t
        .specs
        .iter()
        .filter(|s| s.enclosure == "e1")
        .cloned()
        .collect();
    assert_eq!(e1.len(), 2);
    for s in &e1 {
        faults
            .faults(&s.device)
            .unreachable
            .store(true, Ordering::Relaxed);
    }
    let da = DeclusteredArray::open_with("da1", &t.paths(), &faults.options()).unwrap();
    let state = |name: &str| {
        da.status()
            .pdisks
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.state)
            .unwrap()
    };
    for s in &e1 {
        assert_eq!(
            state(&s.name),
            PdiskState::Suspended,
            "{:#?}",
            da.status().events
        );
    }
    let v = da.vdisk("v").unwrap();
    check_all(&v, &data);
    let new = pattern(4 << 20, 11);
    v.write_at(&new, 1 << 20).unwrap();
    v.flush().unwrap();
    data[1 << 20..5 << 20].copy_from_slice(&new);
    for s in &e1 {
        faults
            .faults(&s.device)
            .unreachable
            .store(false, Ordering::Relaxed);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    while e1.iter().any(|s| state(&s.name) != PdiskState::Ok) {
        assert!(
            std::time::Instant::now() < deadline,
            "not resumed: {:#?}",
            da.status().events
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    wait_idle(&da);
    // The enclosure carries what it missed: lose two pdisks of another one.
    for s in t.specs.iter().filter(|s| s.enclosure == "e2") {
        da.pdisk_suspend(&s.name).unwrap();
    }
    check_all(&v, &data);
    da.close().unwrap();
}

#[test]
fn enclosure_loss_rebuild_then_two_more_then_a_third() {
    let (t, faults, da, v, data) = setup("8+2p", BLOCK);
    assert_eq!(v.tolerance().unwrap().enclosures, 1);
    // Enclosure e0 goes away: both its pdisks vanish.
    let e0: Vec<_> = t
        .specs
        .iter()
        .filter(|s| s.enclosure == "e0")
        .cloned()
        .collect();
    for s in &e0 {
        faults
            .faults(&s.device)
            .vanished
            .store(true, Ordering::Relaxed);
    }
    check_all(&v, &data);
    // Enough errors declare them dead (or reads keep them degraded): fail them for sure.
    for s in &e0 {
        if da
            .status()
            .pdisks
            .iter()
            .any(|p| p.name == s.name && p.state == PdiskState::Ok)
        {
            da.pdisk_fail(&s.name).unwrap();
        }
    }
    check_all(&v, &data);
    wait_idle(&da);
    let st = da.status();
    assert_eq!(st.state, DaState::Ok, "{:?}", st.vdisks);
    for p in st.pdisks.iter().filter(|p| p.enclosure == "e0") {
        assert_eq!(p.strips, 0, "{p:?}");
    }
    check_all(&v, &data);
    // Full redundancy is back: two more pdisks down still read.
    let others: Vec<String> = t
        .specs
        .iter()
        .filter(|s| s.enclosure != "e0")
        .map(|s| s.name.clone())
        .collect();
    da.pdisk_suspend(&others[0]).unwrap();
    da.pdisk_suspend(&others[1]).unwrap();
    check_all(&v, &data);
    // A third concurrent loss in the same stripes: errors, never wrong data.
    da.pdisk_suspend(&others[2]).unwrap();
    let failed = check_exact_or_error(&v, &data);
    assert!(failed > 0, "no stripe lost three strips?");
    assert!(v.stats().unrecoverable > 0);
    da.pdisk_resume(&others[2]).unwrap();
    da.pdisk_resume(&others[0]).unwrap();
    da.pdisk_resume(&others[1]).unwrap();
    wait_idle(&da);
    check_all(&v, &data);
    da.close().unwrap();
}

#[test]
fn flipped_bits_are_repaired_and_counted() {
    let (_t, _f, da, v, data) = setup("8+2p", BLOCK);
    let mut flipped = 0;
    for stripe in [0u64, 3, 7, 20] {
        for (i, loc) in v.strip_locations(stripe).unwrap().iter().enumerate() {
            if i % 3 == stripe as usize % 3 {
                // A different sector in each strip: at most one bad copy of any sector
                // position, which one parity strip can repair.
                let sector = (i as u64 + stripe) % (loc.strip_bytes / 4096);
                let at = loc.data_offset + sector * 4096 + (stripe * 7919 + i as u64 * 131) % 4096;
                flip_bit(std::path::Path::new(&loc.device), at, (i % 8) as u8);
                flipped += 1;
            }
        }
    }
    assert!(flipped > 0);
    check_all(&v, &data);
    let repaired = v.stats().checksum_errors_repaired;
    assert!(repaired > 0, "{:?}", v.stats());
    // Parity strips were not read by the data path; scrub finds and fixes those.
    let report = da.scrub_now().unwrap();
    assert_eq!(report.unrecoverable, 0, "{report:?}");
    let again = da.scrub_now().unwrap();
    assert_eq!(
        again.repaired_sectors + again.parity_mismatches,
        0,
        "{again:?}"
    );
    check_all(&v, &data);
    da.close().unwrap();
}

#[test]
fn missing_at_open_rebuilds_by_itself() {
    let (t, _f, da, v, data) = setup("8+2p", BLOCK);
    drop(v);
    da.close().unwrap();
    drop(da);
    let gone = t.specs[4].device.clone();
    let paths: Vec<_> = t.paths().into_iter().filter(|p| *p != gone).collect();
    let da = DeclusteredArray::open("da1", &paths).unwrap();
    let st = da.status();
    let p4 = st
        .pdisks
        .iter()
        .find(|p| p.name == t.specs[4].name)
        .unwrap();
    assert_eq!(p4.state, PdiskState::Missing);
    let v = da.vdisk("v").unwrap();
    check_all(&v, &data);
    wait_idle(&da);
    assert_eq!(da.status().state, DaState::Ok);
    da.pdisk_suspend(&t.specs[0].name).unwrap();
    da.pdisk_suspend(&t.specs[1].name).unwrap();
    check_all(&v, &data);
    da.close().unwrap();
}

#[test]
fn replace_rebalances_onto_the_new_pdisk() {
    let (t, _f, da, v, data) = setup("8+2p", BLOCK);
    let victim = t.specs[2].name.clone();
    da.pdisk_fail(&victim).unwrap();
    wait_idle(&da);
    let fresh = t.new_file("pd-new", 64 * MIB);
    da.pdisk_replace(&victim, &fresh).unwrap();
    wait_idle(&da);
    let st = da.status();
    let new = st
        .pdisks
        .iter()
        .find(|p| p.name == victim && p.state == PdiskState::Ok)
        .unwrap();
    let ok: Vec<u64> = st
        .pdisks
        .iter()
        .filter(|p| p.state == PdiskState::Ok)
        .map(|p| p.strips)
        .collect();
    let max = *ok.iter().max().unwrap();
    assert!(
        new.strips > 0 && new.strips + 4 >= max,
        "new pdisk holds {} strips, max {max}: {ok:?}",
        new.strips
    );
    check_all(&v, &data);
    // The array reopens with the replacement in place.
    drop(v);
    da.close().unwrap();
    drop(da);
    let mut paths = t.paths();
    paths.push(fresh);
    let da = DeclusteredArray::open("da1", &paths).unwrap();
    let v = da.vdisk("v").unwrap();
    check_all(&v, &data);
    da.close().unwrap();
}

#[test]
fn replication_survives_two_losses_and_rebuilds() {
    let (t, _f, da, v, data) = setup("3WayReplication", 128 << 10);
    da.pdisk_fail(&t.specs[0].name).unwrap();
    da.pdisk_suspend(&t.specs[1].name).unwrap();
    check_all(&v, &data);
    da.pdisk_resume(&t.specs[1].name).unwrap();
    wait_idle(&da);
    assert_eq!(da.status().state, DaState::Ok);
    da.pdisk_suspend(&t.specs[5].name).unwrap();
    da.pdisk_suspend(&t.specs[6].name).unwrap();
    check_all(&v, &data);
    da.close().unwrap();
}

#[test]
fn eio_mid_write_degrades_and_rebuilds() {
    let (t, faults, da, v, mut data) = setup("8+2p", BLOCK);
    faults
        .faults(&t.specs[7].device)
        .writes_until_failure
        .store(3, Ordering::Relaxed);
    for i in 0..16u64 {
        let d = pattern(BLOCK as usize, 100 + i);
        v.write_at(&d, i * BLOCK).unwrap();
        data[(i * BLOCK) as usize..((i + 1) * BLOCK) as usize].copy_from_slice(&d);
        let s = pattern(4096, 200 + i);
        v.write_at(&s, i * BLOCK + 8192).unwrap();
        data[(i * BLOCK + 8192) as usize..(i * BLOCK + 12288) as usize].copy_from_slice(&s);
    }
    v.flush().unwrap();
    check_all(&v, &data);
    wait_idle(&da);
    let st = da.status();
    let p = st
        .pdisks
        .iter()
        .find(|p| p.name == t.specs[7].name)
        .unwrap();
    assert_eq!(p.state, PdiskState::Dead, "{p:?}");
    assert_eq!(
        st.state,
        DaState::Ok,
        "{:#?} {:#?} {}",
        st.events,
        st.vdisks,
        st.stale_strips
    );
    check_all(&v, &data);
    da.close().unwrap();
    // Reopen: the dead pdisk stays out, the data is intact.
    drop(v);
    drop(da);
    let da = DeclusteredArray::open_with("da1", &t.paths(), &faults.options()).unwrap();
    check_all(&da.vdisk("v").unwrap(), &data);
    da.close().unwrap();
}

#[test]
fn drain_moves_everything_off_a_readable_pdisk() {
    let (t, _f, da, v, data) = setup("8+2p", BLOCK);
    da.pdisk_drain(&t.specs[9].name).unwrap();
    wait_idle(&da);
    let st = da.status();
    let p = st
        .pdisks
        .iter()
        .find(|p| p.name == t.specs[9].name)
        .unwrap();
    assert_eq!((p.strips, p.state), (0, PdiskState::Dead), "{p:?}");
    check_all(&v, &data);
    da.close().unwrap();
}

/// `loss_if_failed` counts the pdisks already down: with two suspended, failing a third
/// that shares stripes with both would lose data; the prediction matches what the array
/// reports once it is failed. Each pdisk lost without replacement uses up one pdisk's
/// worth of the spare reserve, not of the space left for vdisks.
#[test]
fn loss_is_predicted_and_spare_shrinks_per_lost_pdisk() {
    let (t, _faults, da, _v, _data) = setup("8+2p", BLOCK);
    let name = |i: usize| t.specs[i].name.clone();
    assert!(da.loss_if_failed(&name(0)).unwrap().is_empty());
    let before = da.status();
    da.pdisk_fail(&name(0)).unwrap();
    wait_idle(&da);
    let after = da.status();
    assert!(
        after.spare_bytes < before.spare_bytes,
        "spare {} -> {}",
        before.spare_bytes,
        after.spare_bytes
    );
    assert_eq!(after.state, DaState::Ok);
    da.pdisk_suspend(&name(1)).unwrap();
    da.pdisk_suspend(&name(2)).unwrap();
    let third = (3..12)
        .map(name)
        .find(|p| !da.loss_if_failed(p).unwrap().is_empty())
        .expect("some pdisk shares stripes with p1 and p2");
    let lost = da.loss_if_failed(&third).unwrap();
    assert_eq!(lost[0].0, "v");
    da.pdisk_fail(&third).unwrap();
    let st = da.status();
    assert_eq!(st.state, DaState::DataLoss);
    assert_eq!(st.vdisks[0].critical_stripes, lost[0].1);
    assert!(da.loss_if_failed("no-such").is_err());
}

/// `destroy` is refused while vdisks remain; afterwards the drives carry no label, so a
/// new array takes them without force.
#[test]
fn destroy_frees_the_drives() {
    let (t, _faults, da, _v, _data) = setup("8+2p", BLOCK);
    let err = da.destroy().unwrap_err().to_string();
    assert!(err.contains("still holds vdisks v"), "{err}");
    da.pdisk_fail(&t.specs[3].name).unwrap();
    da.delete_vdisk("v").unwrap();
    assert!(da.destroy().unwrap().is_empty());
    drop(da);
    create(&t, tessera_vdisk::DaOptions::default());
}

/// A vdisk deleted while the rebuild is moving its strips frees every slot once: the
/// deletion reads each stripe's slots under the stripe lock, and a move that comes after
/// it moves nothing. (Before, a slot moved between the two was freed twice, a panic.)
#[test]
fn a_vdisk_deleted_during_its_rebuild_frees_each_slot_once() {
    for round in 0..4 {
        let (t, _faults, da, _v, _data) = setup("8+2p", BLOCK);
        let free_before = da.status().free_bytes;
        da.pdisk_fail(&t.specs[round].name).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while da.status().rebuild.done == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        da.delete_vdisk("v").unwrap();
        wait_idle(&da);
        let status = da.status();
        assert!(
            status.free_bytes > free_before,
            "round {round}: {status:#?}"
        );
        assert!(da.destroy().unwrap().is_empty());
    }
}
