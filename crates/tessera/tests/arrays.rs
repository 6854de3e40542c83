//! Declustered arrays end to end through the CLI and the daemon: pdisks in enclosures, an
//! 8+2p vdisk as the NSD of a mounted file system, pdisk failures, automatic rebuild,
//! restart, and the errors for input that does not fit.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// Waits until `da ls -Y` shows no unfinished task and every pdisk left in service is ok.
fn wait_rebuilt(node: &Node) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let listing = node.ok(&["da", "ls", "da1", "-Y"]);
        let busy = listing
            .lines()
            .filter(|l| l.starts_with("da:task:0:"))
            .any(|l| l.trim_end_matches(':').ends_with("false"));
        let state_ok = listing
            .lines()
            .any(|l| l.starts_with("da::0:") && l.contains(":ok:"));
        if !busy && state_ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "rebuild did not finish:\n{listing}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn drop_caches() {
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

#[test]
fn vdisk_nsd_survives_two_pdisk_losses_rebuild_and_restart() {
    if !fuse_usable() {
        return;
    }
    let mut node = Node::new().start();
    let pdisks = node.pdisk_stanza(512 << 20);
    let created = node.ok(&["da", "create", "da1", "-F", s(&pdisks)]);
    assert!(created.contains("da1"), "{created}");
    let listing = node.ok(&["da", "ls"]);
    let row = listing.lines().nth(2).expect("da row");
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cells[..4], ["da1", "12", "6", "ok"], "{listing}");
    let out = node.ok(&[
        "vdisk",
        "create",
        "vd0",
        "--da",
        "da1",
        "--code",
        "8+2p",
        "--block-size",
        "1M",
        "--size",
        "1G",
    ]);
    assert!(out.contains("device=vdisk:vd0"), "{out}");
    let vdisks = node.ok(&["vdisk", "ls"]);
    assert!(vdisks.contains("2 pdisks or 1 enclosure"), "{vdisks}");

    let stanza = node.path("vd.stanza");
    std::fs::write(
        &stanza,
        "%nsd: device=vdisk:vd0 nsd=vd0 usage=dataAndMetadata failureGroup=1 pool=system\n",
    )
    .unwrap();
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    assert!(node.ok(&["nsd", "ls", "-X"]).contains("vdisk"));
    let mnt = node.path("mnt");
    node.mounts.push(mnt.clone());
    let err = node.fails(&[
        "fs",
        "create",
        "gfs",
        "-F",
        s(&stanza),
        "-B",
        "4M",
        "-T",
        s(&mnt),
    ]);
    assert!(err.contains("one full stripe"), "{err}");
    node.ok(&[
        "fs",
        "create",
        "gfs",
        "-F",
        s(&stanza),
        "-B",
        "1M",
        "-T",
        s(&mnt),
    ]);
    node.ok(&["mount", "gfs"]);

    let big = pattern(48 << 20, 1);
    std::fs::write(mnt.join("big"), &big).unwrap();
    std::fs::create_dir(mnt.join("small")).unwrap();
    for i in 0..200u64 {
        std::fs::write(
            mnt.join(format!("small/f{i}")),
            pattern(100 + i as usize * 37, i),
        )
        .unwrap();
    }
    let sync = std::process::Command::new("sync").status().unwrap();
    assert!(sync.success());

    let check = |what: &str| {
        drop_caches();
        assert!(
            std::fs::read(mnt.join("big")).unwrap() == big,
            "big file differs {what}"
        );
        for i in 0..200u64 {
            let got = std::fs::read(mnt.join(format!("small/f{i}"))).unwrap();
            assert_eq!(got, pattern(100 + i as usize * 37, i), "small/f{i} {what}");
        }
    };
    // Two pdisks in different enclosures: every stripe keeps at least k strips.
    node.ok(&["pdisk", "fail", "e3s1"]);
    node.ok(&["pdisk", "fail", "e5s2"]);
    let not_ok = node.ok(&["pdisk", "ls", "--not-ok"]);
    assert!(
        not_ok.contains("e3s1") && not_ok.contains("e5s2"),
        "{not_ok}"
    );
    check("with two pdisks dead");
    wait_rebuilt(&node);
    check("after rebuild");
    // Full redundancy again: a whole enclosure can go now. The eight pdisks left are
    // fewer than a stripe's ten strips, so the array stays degraded from here on.
    node.ok(&["pdisk", "fail", "e2s1"]);
    node.ok(&["pdisk", "fail", "e2s2"]);
    check("with enclosure jbof2 gone after the rebuild");

    node.ok(&["shutdown"]);
    node.ok(&["startup"]);
    check("after restart");
    node.ok(&["umount", "gfs"]);
    let report = node.ok(&["fsck", "gfs", "-n"]);
    assert!(report.contains("is clean"), "{report}");
    let err = node.fails(&["vdisk", "delete", "vd0"]);
    assert!(err.contains("delete the NSD first"), "{err}");
}

#[test]
fn array_input_that_does_not_fit_is_refused() {
    let node = Node::new().start();
    let pdisks = node.pdisk_stanza(256 << 20);
    node.ok(&["da", "create", "da1", "-F", s(&pdisks)]);
    let vd = |args: &[&str]| {
        let mut all = vec!["vdisk", "create", "v", "--da", "da1"];
        all.extend_from_slice(args);
        node.fails(&all)
    };
    let err = vd(&["--code", "16+4p"]);
    assert!(err.contains("16+4p"), "{err}");
    let err = vd(&["--code", "8+5p"]);
    assert!(err.contains("parity"), "{err}");
    let err = vd(&["--code", "3+2p", "--block-size", "64K"]);
    assert!(err.contains("4 KiB") || err.contains("4096"), "{err}");
    let err = vd(&["--size", "0"]);
    assert!(err.contains("--size 0"), "{err}");
    let err = vd(&["--size", "100T"]);
    assert!(!err.is_empty());
    let err = node.fails(&["vdisk", "create", "v", "--da", "nope"]);
    assert!(err.contains("does not exist"), "{err}");
    // The same drives again: already pdisks of da1.
    let err = node.fails(&["da", "create", "da2", "-F", s(&pdisks)]);
    assert!(err.contains("already pdisk"), "{err}");
    let err = node.fails(&["da", "create", "da1", "-F", s(&pdisks)]);
    assert!(err.contains("already exists"), "{err}");
    // Tunables: changed and listed; out of range refused; nothing to change refused.
    node.ok(&[
        "da",
        "change",
        "da1",
        "--rebuild-io-share",
        "80",
        "--scrub-rate",
        "50",
    ]);
    let listing = node.ok(&["da", "ls", "da1", "-Y"]);
    assert!(listing.contains(":80:50:8:"), "{listing}");
    let err = node.fails(&["da", "change", "da1", "--rebuild-io-share", "99"]);
    assert!(err.contains("99"), "{err}");
    let err = node.fails(&["da", "change", "da1"]);
    assert!(err.contains("nothing to change"), "{err}");
    let err = node.fails(&["pdisk", "fail", "nosuch"]);
    assert!(err.contains("does not exist"), "{err}");
    // A device listed twice is a stanza error naming both lines.
    let dup = node.path("dup.stanza");
    std::fs::write(
        &dup,
        "%pdisk: device=/tmp/x enclosure=a\n%pdisk: device=/tmp/x enclosure=b\n",
    )
    .unwrap();
    let err = node.fails(&["da", "create", "da3", "-F", s(&dup)]);
    assert!(
        err.contains("line 2") && err.contains("already used on line 1"),
        "{err}"
    );
    // Too few pdisks for any 8+2p stripe.
    let few = node.path("few.stanza");
    let mut text = String::new();
    for i in 0..4 {
        let d = node.drive(&format!("few{i}"), 128 << 20);
        text += &format!("%pdisk: device={} enclosure=x{i}\n", d.display());
    }
    std::fs::write(&few, text).unwrap();
    node.ok(&["da", "create", "small", "-F", s(&few)]);
    let err = node.fails(&["vdisk", "create", "w", "--da", "small", "--code", "8+2p"]);
    assert!(err.contains("10") || err.contains("pdisks"), "{err}");
}
