//! Deterministic write-hole cases, made by editing strip files while a region is dirty
//! (the array dropped without `close`, as in a crash): a torn parity write is recomputed,
//! a torn data sector is accepted as it is (it was never acknowledged), a torn write into
//! an already degraded stripe loses exactly the unrecoverable strip (EIO, never wrong
//! data), and idle regions are cleaned so a crash then costs nothing. Also the progress
//! reports of rebuild and scrub.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tessera_drive::BlockDevice;
use tessera_vdisk::{Code, DaOptions, DeclusteredArray, Vdisk, VdiskSize};

const BLOCK: u64 = 256 << 10;

fn setup() -> (
    TestPdisks,
    std::sync::Arc<DeclusteredArray>,
    std::sync::Arc<Vdisk>,
    Vec<u8>,
) {
    let t = make_pdisks(12, 6, 64 * MIB);
    let da = create(&t, DaOptions::default());
    let v = da
        .create_vdisk(
            "v",
            Code::parse("8+2p").unwrap(),
            BLOCK,
            VdiskSize::Bytes(8 * MIB),
        )
        .unwrap();
    let buf = pattern(4 << 20, 5);
    v.write_at(&buf, 0).unwrap();
    let data = buf.to_vec();
    v.flush().unwrap();
    (t, da, v, data)
}

fn overwrite(path: &str, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
    f.sync_all().unwrap();
}

fn crash_and_reopen(
    t: &TestPdisks,
    da: std::sync::Arc<DeclusteredArray>,
    v: std::sync::Arc<Vdisk>,
) -> std::sync::Arc<DeclusteredArray> {
    drop(v);
    drop(da); // no close: the dirty bitmap stays as it is
    DeclusteredArray::open("da1", &t.paths()).unwrap()
}

#[test]
fn torn_parity_is_recomputed() {
    let (t, da, v, data) = setup();
    let locs = v.strip_locations(1).unwrap();
    overwrite(&locs[8].device, locs[8].data_offset, &pattern(8192, 99));
    let da = crash_and_reopen(&t, da, v);
    let r = da.recovery_report();
    assert!(r.dirty_regions >= 1 && r.stripes_resynced >= 1, "{r:?}");
    assert_eq!((r.torn_sectors, r.lost_strips), (0, 0), "{r:?}");
    let v = da.vdisk("v").unwrap();
    assert!(read(v.as_ref(), 0, data.len()).unwrap()[..] == data[..]);
    let s = da.scrub_now().unwrap();
    assert_eq!(
        s.repaired_sectors + s.parity_mismatches + s.unrecoverable,
        0,
        "{s:?}"
    );
    da.close().unwrap();
}

#[test]
fn torn_data_sector_is_taken_as_it_is() {
    let (t, da, v, mut data) = setup();
    let locs = v.strip_locations(2).unwrap();
    let torn = pattern(4096, 77);
    overwrite(&locs[3].device, locs[3].data_offset + 4096, &torn);
    let at = (2 * BLOCK + 3 * (32 << 10) + 4096) as usize;
    data[at..at + 4096].copy_from_slice(&torn);
    let da = crash_and_reopen(&t, da, v);
    let r = da.recovery_report();
    assert!(r.torn_sectors >= 1 && r.stripes_resynced >= 1, "{r:?}");
    let v = da.vdisk("v").unwrap();
    assert!(read(v.as_ref(), 0, data.len()).unwrap()[..] == data[..]);
    let s = da.scrub_now().unwrap();
    assert_eq!(
        s.repaired_sectors + s.parity_mismatches + s.unrecoverable,
        0,
        "{s:?}"
    );
    da.close().unwrap();
}

#[test]
fn torn_write_into_a_degraded_stripe_loses_only_that_strip() {
    let (t, da, v, data) = setup();
    let locs = v.strip_locations(0).unwrap();
    // Data strip 5 of stripe 0 is on a suspended pdisk; both parity writes were torn.
    da.pdisk_suspend(&locs[5].pdisk).unwrap();
    overwrite(&locs[8].device, locs[8].data_offset, &pattern(4096, 1));
    overwrite(&locs[9].device, locs[9].data_offset, &pattern(4096, 2));
    let da = crash_and_reopen(&t, da, v);
    let r = da.recovery_report();
    assert_eq!(r.lost_strips, 1, "{r:?}");
    let v = da.vdisk("v").unwrap();
    let strip = 32 << 10;
    let e = read(v.as_ref(), 5 * strip, strip as usize)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("vdisk `v` stripe 0") && e.contains("lost"),
        "{e}"
    );
    // The other strips of the stripe and the other stripes read back.
    assert!(read(v.as_ref(), 0, 5 * strip as usize).unwrap()[..] == data[..5 * strip as usize]);
    let rest = 6 * strip as usize;
    assert!(read(v.as_ref(), rest as u64, data.len() - rest).unwrap()[..] == data[rest..]);
    // Rewriting the whole block makes it whole again, even after resuming.
    let fresh = pattern(BLOCK as usize, 3);
    v.write_at(&fresh, 0).unwrap();
    da.pdisk_resume(&locs[5].pdisk).unwrap();
    assert!(da.wait_idle(Duration::from_secs(30)));
    assert!(read(v.as_ref(), 0, BLOCK as usize).unwrap()[..] == fresh[..]);
    da.close().unwrap();
}

#[test]
fn idle_regions_are_cleaned() {
    let (t, da, v, data) = setup();
    std::thread::sleep(Duration::from_millis(1800));
    assert_eq!(da.status().dirty_regions, 0);
    let da = crash_and_reopen(&t, da, v);
    assert_eq!(da.recovery_report().dirty_regions, 0);
    let v = da.vdisk("v").unwrap();
    assert!(read(v.as_ref(), 0, data.len()).unwrap()[..] == data[..]);
    da.close().unwrap();
}

#[test]
fn rebuild_and_scrub_report_progress() {
    let (t, da, v, data) = setup();
    da.set_options(50, 8, 8).unwrap();
    da.pdisk_fail(&t.specs[0].name).unwrap();
    assert!(da.wait_idle(Duration::from_secs(60)));
    let rb = da.status().rebuild;
    assert!(
        rb.passes >= 1 && rb.total > 0 && rb.done == rb.total && rb.bytes > 0,
        "{rb:?}"
    );
    assert!(read(v.as_ref(), 0, data.len()).unwrap()[..] == data[..]);
    // 8 MB/s over ~10 MiB of strips: about a second, long enough to watch.
    da.start_scrub();
    let started = Instant::now();
    let mut seen_midway = false;
    loop {
        let sc = da.status().scrub;
        if sc.active && sc.done > 0 && sc.done < sc.total {
            assert!(sc.eta_s.is_some() && sc.rate_bytes_s > 0, "{sc:?}");
            seen_midway = true;
        }
        if !sc.active && sc.passes == 1 {
            assert_eq!(sc.done, sc.total);
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "scrub did not finish: {sc:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(seen_midway);
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "scrub was not rate limited"
    );
    da.close().unwrap();
}

/// A first write into a never-written stripe that a crash rolled back (none of its headers
/// survived) may leave some of its data sectors on the pdisks; the stripe still reads as
/// zeros. Those sectors must not come back when a later write to the stripe is torn too
/// (resync takes data strips as they are). Found by `crash.rs::power_loss_loop`: a sector
/// never written durably took the content of a write rolled back 116 rounds earlier.
#[test]
fn a_rolled_back_first_write_never_resurfaces() {
    const STRIPE: u64 = 20; // past the 4 MiB that setup() writes: never written
    let (t, da, v, _) = setup();
    let locs = v.strip_locations(STRIPE).unwrap();
    let ghost = pattern(4096, 77);
    overwrite(&locs[2].device, locs[2].data_offset + 4096, &ghost);
    v.write_at(&pattern(BLOCK as usize, 1), 0).unwrap(); // region 0 dirty at the crash
    let da = crash_and_reopen(&t, da, v);
    assert!(da.recovery_report().dirty_regions >= 1);
    let v = da.vdisk("v").unwrap();
    let at = STRIPE * BLOCK;
    assert!(read(v.as_ref(), at, BLOCK as usize)
        .unwrap()
        .iter()
        .all(|&b| b == 0));

    // A full-stripe write to it, torn: only strips 4 and 6 reach the pdisks.
    let slot_bytes = (locs[0].data_offset - locs[0].offset + locs[0].strip_bytes) as usize;
    let before: Vec<Vec<u8>> = locs
        .iter()
        .map(|l| {
            use std::os::unix::fs::FileExt;
            let mut b = vec![0u8; slot_bytes];
            let f = std::fs::File::open(&l.device).unwrap();
            f.read_exact_at(&mut b, l.offset).unwrap();
            b
        })
        .collect();
    let new = pattern(BLOCK as usize, 78);
    v.write_at(&new, at).unwrap();
    for (i, l) in locs.iter().enumerate().filter(|(i, _)| ![4, 6].contains(i)) {
        overwrite(&l.device, l.offset, &before[i]);
    }
    let da = crash_and_reopen(&t, da, v);
    let r = da.recovery_report();
    assert!(r.stripes_resynced >= 1, "{r:?}");
    let v = da.vdisk("v").unwrap();
    let got = read(v.as_ref(), at, BLOCK as usize).unwrap();
    for (s, sector) in got.chunks(4096).enumerate() {
        assert!(
            sector.iter().all(|&b| b == 0) || sector == &new[s * 4096..(s + 1) * 4096],
            "sector {s} of the stripe holds neither zeros (never written) nor the torn \
             write: {}",
            if sector == &ghost[..] {
                "the rolled-back first write came back"
            } else {
                "something else"
            }
        );
    }
    da.close().unwrap();
}
