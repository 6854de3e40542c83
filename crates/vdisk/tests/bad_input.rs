//! Bad input gets a clear error that names the culprit, never a crash or a silent
//! misconfiguration: codes that do not fit, bad block sizes, duplicate or foreign devices,
//! devices in use, too small, not pdisks, oversized vdisks and stripe maps, bad names and
//! impossible pdisk state changes.

mod common;

use std::sync::atomic::Ordering;

use common::*;
use tessera_drive::BlockDevice;
use tessera_vdisk::{Code, DaOptions, DeclusteredArray, PdiskSpec, VdiskError, VdiskSize};

fn err_text<T>(r: Result<T, VdiskError>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn code_that_does_not_fit_the_array() {
    let t = make_pdisks(8, 4, 64 * MIB);
    let da = create(&t, DaOptions::default());
    let e = err_text(da.create_vdisk(
        "v",
        Code::parse("8+2p").unwrap(),
        256 << 10,
        VdiskSize::Percent(10),
    ));
    assert!(e.contains("needs 10 pdisks") && e.contains("has 8"), "{e}");
    // 4+2p fits.
    da.create_vdisk(
        "v",
        Code::parse("4+2p").unwrap(),
        128 << 10,
        VdiskSize::Percent(10),
    )
    .unwrap();
    da.close().unwrap();
}

#[test]
fn block_sizes_that_do_not_fit_the_code() {
    let t = make_pdisks(12, 6, 64 * MIB);
    let da = create(&t, DaOptions::default());
    let rs = Code::parse("8+2p").unwrap();
    for bad in [0, 100 << 10, 8 * 4096 + 8, 4096] {
        let e = err_text(da.create_vdisk("v", rs, bad, VdiskSize::Percent(10)));
        assert!(e.contains("multiple of 32768"), "{bad}: {e}");
    }
    let e = err_text(da.create_vdisk("v", rs, 8 * (32 << 20), VdiskSize::Percent(10)));
    assert!(e.contains("exceed the maximum"), "{e}");
    let rep = Code::parse("3WayReplication").unwrap();
    let e = err_text(da.create_vdisk("r", rep, 6 << 10, VdiskSize::Percent(10)));
    assert!(e.contains("multiple of 4096"), "{e}");
    da.create_vdisk("v", rs, 32 << 10, VdiskSize::Bytes(MIB))
        .unwrap();
    let e = err_text(da.create_vdisk("v", rs, 256 << 10, VdiskSize::Bytes(MIB)));
    assert!(e.contains("already exists"), "{e}");
    let e = err_text(da.create_vdisk("w", rs, 256 << 10, VdiskSize::Bytes(100 << 10)));
    assert!(e.contains("not enough free space"), "{e}");
    let e = err_text(da.create_vdisk("w", rs, 256 << 10, VdiskSize::Bytes(10 << 30)));
    assert!(e.contains("not enough free space"), "{e}");
    let e = err_text(da.create_vdisk("bad name", rs, 256 << 10, VdiskSize::Bytes(MIB)));
    assert!(e.contains("invalid vdisk name"), "{e}");
    let e = err_text(da.delete_vdisk("nope"));
    assert!(e.contains("no vdisk named `nope`"), "{e}");
    da.close().unwrap();
}

#[test]
fn stripe_map_larger_than_the_metadata_area() {
    // 4 KiB strips on 256 MiB pdisks: more strips than a 1 MiB metadata slot can map.
    let t = make_pdisks(12, 6, 256 * MIB);
    let da = create(&t, DaOptions::default());
    let e = err_text(da.create_vdisk(
        "v",
        Code::parse("8+2p").unwrap(),
        32 << 10,
        VdiskSize::Percent(100),
    ));
    assert!(
        e.contains("metadata") && e.contains("larger block size"),
        "{e}"
    );
    // Nothing was left allocated: a reasonable vdisk still fits all the space.
    da.create_vdisk(
        "v",
        Code::parse("8+2p").unwrap(),
        1 << 20,
        VdiskSize::Percent(90),
    )
    .unwrap();
    da.close().unwrap();
}

#[test]
fn duplicate_devices_and_names() {
    let t = make_pdisks(4, 4, 64 * MIB);
    let mut specs = t.specs.clone();
    specs[3].device = specs[0].device.clone();
    let e = err_text(DeclusteredArray::create(
        "da1",
        &specs,
        DaOptions::default(),
    ));
    assert!(e.contains("listed twice"), "{e}");
    // The same file under another name (a symlink) is the same drive.
    let link = t.dir.path().join("alias");
    std::os::unix::fs::symlink(&t.specs[1].device, &link).unwrap();
    let mut specs = t.specs.clone();
    specs[3].device = link;
    let e = err_text(DeclusteredArray::create(
        "da1",
        &specs,
        DaOptions::default(),
    ));
    assert!(e.contains("listed twice"), "{e}");
    let mut specs = t.specs.clone();
    specs[2].name = specs[1].name.clone();
    let e = err_text(DeclusteredArray::create(
        "da1",
        &specs,
        DaOptions::default(),
    ));
    assert!(e.contains("used twice"), "{e}");
    let mut specs = t.specs.clone();
    specs[2].enclosure = "bad/enc".into();
    let e = err_text(DeclusteredArray::create(
        "da1",
        &specs,
        DaOptions::default(),
    ));
    assert!(e.contains("invalid enclosure name"), "{e}");
    let e = err_text(DeclusteredArray::create(
        "da1",
        &t.specs,
        DaOptions {
            spare_pdisks: Some(4),
            ..DaOptions::default()
        },
    ));
    assert!(e.contains("spare"), "{e}");
    let e = err_text(DeclusteredArray::create(
        "da1",
        &t.specs,
        DaOptions {
            rebuild_io_share: 100,
            ..DaOptions::default()
        },
    ));
    assert!(e.contains("rebuild I/O share"), "{e}");
}

#[test]
fn small_missing_and_used_devices() {
    let t = make_pdisks(4, 4, 64 * MIB);
    let small = t.new_file("small", 8 * MIB);
    let mut specs = t.specs.clone();
    specs[0].device = small;
    let e = err_text(DeclusteredArray::create(
        "da1",
        &specs,
        DaOptions::default(),
    ));
    assert!(e.contains("too small") && e.contains("small"), "{e}");
    let mut specs = t.specs.clone();
    specs[0].device = t.dir.path().join("nonexistent");
    let e = err_text(DeclusteredArray::create(
        "da1",
        &specs,
        DaOptions::default(),
    ));
    assert!(e.contains("nonexistent"), "{e}");
    // In use by an array: refused, then accepted with force.
    let da = create(&t, DaOptions::default());
    da.close().unwrap();
    drop(da);
    let e = err_text(DeclusteredArray::create(
        "da2",
        &t.specs,
        DaOptions::default(),
    ));
    assert!(
        e.contains("pdisk label of declustered array `da1`") && e.contains("force"),
        "{e}"
    );
    let da = DeclusteredArray::create(
        "da2",
        &t.specs,
        DaOptions {
            force: true,
            ..DaOptions::default()
        },
    )
    .unwrap();
    da.close().unwrap();
    // An NSD descriptor is recognised too.
    let nsd = t.new_file("nsd", 64 * MIB);
    let mut head = vec![0u8; 4096];
    head[..8].copy_from_slice(b"TSRNSD01");
    std::fs::write(&nsd, &head).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&nsd)
        .unwrap()
        .set_len(64 * MIB)
        .unwrap();
    let specs = vec![PdiskSpec {
        name: "p".into(),
        device: nsd,
        enclosure: "e".into(),
        slot: 0,
    }];
    let e = err_text(DeclusteredArray::create(
        "da3",
        &specs,
        DaOptions::default(),
    ));
    assert!(e.contains("NSD descriptor"), "{e}");
}

#[test]
fn foreign_and_unlabelled_devices_at_open() {
    let a = make_pdisks(6, 3, 64 * MIB);
    let b = make_pdisks(6, 3, 64 * MIB);
    let da = DeclusteredArray::create("alpha", &a.specs, DaOptions::default()).unwrap();
    da.close().unwrap();
    let db = DeclusteredArray::create("beta", &b.specs, DaOptions::default()).unwrap();
    db.close().unwrap();
    let mut paths = a.paths();
    paths.push(b.specs[2].device.clone());
    let e = err_text(DeclusteredArray::open("alpha", &paths));
    assert!(
        e.contains(&b.specs[2].device.display().to_string()) && e.contains("`beta`"),
        "{e}"
    );
    let e = err_text(DeclusteredArray::open("gamma", &a.paths()));
    assert!(e.contains("`alpha`"), "{e}");
    let blank = a.new_file("blank", 64 * MIB);
    let mut paths = a.paths();
    paths.push(blank.clone());
    let e = err_text(DeclusteredArray::open("alpha", &paths));
    assert!(e.contains("no pdisk label") && e.contains("blank"), "{e}");
    let e = err_text(DeclusteredArray::open("alpha", &[]));
    assert!(
        e.contains("no valid metadata") || e.contains("no devices"),
        "{e}"
    );
    // The same device twice is caught by its pdisk identity.
    let mut paths = a.paths();
    paths.push(a.specs[0].device.clone());
    let e = err_text(DeclusteredArray::open("alpha", &paths));
    assert!(e.contains("listed twice"), "{e}");
    // Plugging the foreign drive in as a replacement is refused without force.
    let da = DeclusteredArray::open("alpha", &a.paths()).unwrap();
    da.pdisk_fail(&a.specs[1].name).unwrap();
    let e = err_text(da.pdisk_replace(&a.specs[1].name, &b.specs[0].device));
    assert!(e.contains("`beta`") && e.contains("force"), "{e}");
    let e = err_text(da.pdisk_replace(&a.specs[1].name, &a.specs[2].device));
    assert!(e.contains("listed twice"), "{e}");
    da.close().unwrap();
}

#[test]
fn impossible_pdisk_state_changes() {
    let t = make_pdisks(6, 3, 64 * MIB);
    let da = create(&t, DaOptions::default());
    let n = &t.specs[0].name;
    let e = err_text(da.pdisk_resume(n));
    assert!(e.contains("is ok") && e.contains("resume"), "{e}");
    da.pdisk_fail(n).unwrap();
    let e = err_text(da.pdisk_suspend(n));
    assert!(e.contains("is dead"), "{e}");
    let e = err_text(da.pdisk_fail("nope"));
    assert!(e.contains("no pdisk named `nope`"), "{e}");
    da.close().unwrap();
}

#[test]
fn device_vanishing_mid_write_degrades_without_errors() {
    let t = make_pdisks(12, 6, 64 * MIB);
    let faults = FaultBox::default();
    let da = create(&t, faults.options());
    let v = da
        .create_vdisk(
            "v",
            Code::parse("8+2p").unwrap(),
            256 << 10,
            VdiskSize::Bytes(16 * MIB),
        )
        .unwrap();
    let mut model = vec![0u8; 16 << 20];
    for i in 0..64u64 {
        if i == 20 {
            faults
                .faults(&t.specs[3].device)
                .vanished
                .store(true, Ordering::Relaxed);
        }
        let off = (i * 7 % 60) << 18;
        let len = if i % 2 == 0 { 256 << 10 } else { 12 << 10 };
        let d = pattern(len, i);
        v.write_at(&d, off).unwrap();
        model[off as usize..off as usize + len].copy_from_slice(&d);
    }
    v.flush().unwrap();
    assert!(read(v.as_ref(), 0, 16 << 20).unwrap()[..] == model[..]);
    assert!(da.wait_idle(std::time::Duration::from_secs(60)));
    let st = da.status();
    let p = st
        .pdisks
        .iter()
        .find(|p| p.name == t.specs[3].name)
        .unwrap();
    assert_eq!(p.state, tessera_vdisk::PdiskState::Dead, "{p:?}");
    assert!(read(v.as_ref(), 0, 16 << 20).unwrap()[..] == model[..]);
    da.close().unwrap();
}

/// The second process of [`a_second_process_cannot_open_an_array_one_serves`]: opens the
/// array at the paths in `TESSERA_TEST_DA_PATHS` and prints the outcome.
#[test]
#[ignore = "run by a_second_process_cannot_open_an_array_one_serves in a child process"]
fn second_process_opens_the_array() {
    let Ok(paths) = std::env::var("TESSERA_TEST_DA_PATHS") else {
        return;
    };
    let devices: Vec<std::path::PathBuf> = paths.split(',').map(Into::into).collect();
    match DeclusteredArray::open("", &devices) {
        Ok(da) => {
            println!("OUTCOME: opened");
            da.close().unwrap();
        }
        Err(e) => println!("OUTCOME: refused: {e}"),
    }
}

#[test]
fn a_second_process_cannot_open_an_array_one_serves() {
    let t = make_pdisks(6, 3, 64 * MIB);
    let da = create(&t, DaOptions::default());
    let paths: Vec<String> = t.paths().iter().map(|p| p.display().to_string()).collect();
    let second = || {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "second_process_opens_the_array",
                "--ignored",
                "--nocapture",
            ])
            .env("TESSERA_TEST_DA_PATHS", paths.join(","))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.starts_with("OUTCOME: "))
            .expect("the child reports")
            .to_string()
    };
    let outcome = second();
    assert!(
        outcome.contains("refused") && outcome.contains("in use"),
        "{outcome}"
    );
    assert!(
        outcome.contains(&format!("pid {}", std::process::id())),
        "{outcome}"
    );
    da.close().unwrap();
    drop(da);
    assert_eq!(second(), "OUTCOME: opened");
}
