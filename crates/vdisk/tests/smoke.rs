//! Basic behaviour: create, write full and partial stripes, read back, reopen.

mod common;

use common::*;
use tessera_drive::BlockDevice;
use tessera_vdisk::{Code, DaOptions, DeclusteredArray, VdiskSize};

#[test]
fn full_and_partial_writes_survive_reopen() {
    let t = make_pdisks(12, 6, 64 * MIB);
    let da = create(&t, DaOptions::default());
    let v = da
        .create_vdisk(
            "v1",
            Code::parse("8+2p").unwrap(),
            256 << 10,
            VdiskSize::Bytes(64 * MIB),
        )
        .unwrap();
    assert_eq!(v.size_bytes(), 64 * MIB);
    assert_eq!(v.strip_size(), 32 << 10);
    // Unwritten space reads as zeros.
    assert!(read(v.as_ref(), 0, 8192).unwrap().iter().all(|&b| b == 0));
    let full = pattern(1 << 20, 1);
    write_read(v.as_ref(), 0, &full);
    let small = pattern(12288, 2);
    write_read(v.as_ref(), 4096 * 7, &small);
    let odd = pattern(300 << 10, 3);
    write_read(v.as_ref(), (2 << 20) + 8192, &odd);
    v.flush().unwrap();
    let stats = v.stats();
    assert!(stats.full_stripe_writes >= 4, "{stats:?}");
    assert!(stats.rmw_writes >= 2, "{stats:?}");
    da.close().unwrap();
    drop(da);

    let da = DeclusteredArray::open("da1", &t.paths()).unwrap();
    assert_eq!(da.recovery_report().dirty_regions, 0);
    let v = da.vdisk("v1").unwrap();
    let mut expect = full.to_vec();
    expect[4096 * 7..4096 * 7 + 12288].copy_from_slice(&small);
    assert!(read(v.as_ref(), 0, 1 << 20).unwrap()[..] == expect[..]);
    assert!(read(v.as_ref(), (2 << 20) + 8192, 300 << 10).unwrap()[..] == odd[..]);
    let report = da.scrub_now().unwrap();
    assert_eq!(
        report.repaired_sectors + report.parity_mismatches + report.unrecoverable,
        0,
        "{report:?}"
    );
    da.close().unwrap();
}

#[test]
fn replication_roundtrip() {
    let t = make_pdisks(6, 3, 64 * MIB);
    let da = create(&t, DaOptions::default());
    let v = da
        .create_vdisk(
            "r",
            Code::parse("3WayReplication").unwrap(),
            64 << 10,
            VdiskSize::Percent(50),
        )
        .unwrap();
    let d = pattern(200 << 10, 9);
    write_read(v.as_ref(), 64 << 10, &d);
    write_read(v.as_ref(), 4096, &pattern(4096, 10));
    da.close().unwrap();
}

/// Bytes the host file system holds for the pdisk files.
fn allocated(t: &TestPdisks) -> u64 {
    use std::os::unix::fs::MetadataExt;
    t.paths()
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().blocks() * 512)
        .sum()
}

/// TRIM through a vdisk: whole stripes in a discarded range are deallocated on their
/// pdisks (holes in the files) and read as zeros, partial stripes stay as they were; a
/// scrub finds every stripe consistent; discarded stripes take partial and full writes
/// again; all of it survives a reopen.
#[test]
fn discarded_stripes_go_back_to_the_pdisks_and_read_as_zeros() {
    let t = make_pdisks(12, 6, 64 * MIB);
    let da = create(&t, DaOptions::default());
    let v = da
        .create_vdisk(
            "v1",
            Code::parse("8+2p").unwrap(),
            256 << 10,
            VdiskSize::Bytes(32 * MIB),
        )
        .unwrap();
    assert!(v.can_discard() && v.discard_zeroes());
    let data = pattern(8 << 20, 4);
    write_read(v.as_ref(), 0, &data);
    v.flush().unwrap();
    let before = allocated(&t);
    // 1 MiB + 100 KiB .. 7 MiB + 100 KiB: stripes 5..28 whole, 4 and 28 partial.
    let (at, len) = ((1 << 20) + (100 << 10), 6 << 20);
    v.discard(at, len).unwrap();
    v.flush().unwrap();
    let stats = v.stats();
    assert_eq!(stats.discarded_stripes, 23, "{stats:?}");
    assert_eq!(stats.discards_skipped, 2, "{stats:?}");
    // 23 stripes of 10 strips of 32 KiB each went back; headers stay.
    let freed = before.saturating_sub(allocated(&t));
    assert!(freed >= 23 * 10 * (32 << 10), "{freed} bytes freed");
    let mut expect = data.to_vec();
    expect[5 << 18..28 << 18].fill(0);
    assert!(read(v.as_ref(), 0, 8 << 20).unwrap()[..] == expect[..]);
    let report = da.scrub_now().unwrap();
    assert_eq!(
        report.repaired_sectors + report.parity_mismatches + report.unrecoverable,
        0,
        "{report:?}"
    );
    // A partial write into a discarded stripe (read-modify-write over zeros) and a full
    // one.
    let small = pattern(8192, 5);
    write_read(v.as_ref(), (6 << 18) + 4096, &small);
    expect[(6 << 18) + 4096..(6 << 18) + 4096 + 8192].copy_from_slice(&small);
    let full = pattern(256 << 10, 6);
    write_read(v.as_ref(), 7 << 18, &full);
    expect[7 << 18..8 << 18].copy_from_slice(&full);
    v.flush().unwrap();
    da.close().unwrap();
    drop(da);

    let da = DeclusteredArray::open("da1", &t.paths()).unwrap();
    assert_eq!(da.recovery_report().dirty_regions, 0);
    let v = da.vdisk("v1").unwrap();
    assert!(read(v.as_ref(), 0, 8 << 20).unwrap()[..] == expect[..]);
    let report = da.scrub_now().unwrap();
    assert_eq!(
        report.repaired_sectors + report.parity_mismatches + report.unrecoverable,
        0,
        "{report:?}"
    );
    da.close().unwrap();
}

/// A vdisk handle that outlives its array (a mount that moved on to the NSD servers when
/// the array moved to another server) fails with "closed" and does not keep the array's
/// pdisks open: the next server opens those drives, and a drive is open in one process at
/// a time.
#[test]
fn a_handle_kept_after_close_holds_no_pdisk_open() {
    use std::sync::{Arc, Mutex, Weak};
    let t = make_pdisks(8, 4, 64 * MIB);
    let opened: Arc<Mutex<Vec<Weak<dyn BlockDevice>>>> = Arc::default();
    let seen = Arc::clone(&opened);
    let inner = tessera_vdisk::file_opener();
    let opts = DaOptions {
        opener: Some(Arc::new(move |path: &std::path::Path| {
            let dev = inner(path)?;
            seen.lock().unwrap().push(Arc::downgrade(&dev));
            Ok(dev)
        })),
        ..DaOptions::default()
    };
    let da = create(&t, opts);
    let v = da
        .create_vdisk(
            "v1",
            Code::parse("4+2p").unwrap(),
            256 << 10,
            VdiskSize::Bytes(16 * MIB),
        )
        .unwrap();
    write_read(v.as_ref(), 0, &pattern(256 << 10, 7));
    assert!(!opened.lock().unwrap().is_empty());
    da.close().unwrap();
    drop(da);
    let still_open = opened
        .lock()
        .unwrap()
        .iter()
        .filter(|w| w.upgrade().is_some())
        .count();
    assert_eq!(
        still_open, 0,
        "pdisk devices held by a closed array's vdisk handle"
    );
    let e = read(v.as_ref(), 0, 4096).unwrap_err();
    assert!(e.to_string().contains("closed"), "{e}");
    assert!(v.strip_locations(0).is_err());
}
