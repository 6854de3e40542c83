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
