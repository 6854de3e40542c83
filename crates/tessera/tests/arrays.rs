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

/// Two pdisks suspended (no rebuild), so every stripe on both is at its tolerance: failing
/// a third loses data, which `pdisk fail` refuses without --force. After the loss every
/// listing says so, umount says the file system is unmounted although the last checkpoint
/// was not written, and the objects can be deleted top down (fs delete -p, nsd delete,
/// vdisk delete, da delete), each refusing while the one above still uses it.
#[test]
fn data_loss_is_refused_then_shown_and_cleaned_up() {
    let mut node = Node::new().start();
    let mnt = node.file_system_on_vdisk("512M");
    let fuse = fuse_usable();
    if fuse {
        node.ok(&["mount", "gfs"]);
        std::fs::write(mnt.join("before"), pattern(3 << 20, 7)).unwrap();
        assert!(std::process::Command::new("sync")
            .status()
            .unwrap()
            .success());
    }
    node.ok(&["pdisk", "suspend", "e1s1"]);
    node.ok(&["pdisk", "suspend", "e2s1"]);
    let err = node.fails(&["pdisk", "fail", "e3s1"]);
    for want in ["vd0", "NSD vd0", "file system gfs", "--force"] {
        assert!(err.contains(want), "{want} missing from: {err}");
    }
    let state = node.ok(&["pdisk", "ls", "-Y"]);
    assert!(
        state.contains(":e3s1:da1:") && !state.contains("dead"),
        "{state}"
    );
    // Five of twelve pdisks: every 10-strip stripe has at least three strips on them, so
    // every stripe is lost (the descriptor's too) whatever the placement.
    for pdisk in ["e3s1", "e4s1", "e5s1", "e1s1", "e2s1"] {
        node.ok(&["pdisk", "fail", pdisk, "--force"]);
    }

    // Item 11: the array, the vdisk and the disk of the file system agree.
    assert!(node.ok(&["da", "ls"]).contains("data loss"));
    assert!(node.ok(&["vdisk", "ls"]).contains("critical"));
    let disk_ls = |node: &Node| {
        let out = node.run(&["disk", "ls", "gfs"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(!text.contains(" up "), "{text}");
        assert!(
            text.contains("down") && text.contains("lost data"),
            "{text}"
        );
    };
    disk_ls(&node);
    if fuse {
        let y = node.ok(&["disk", "ls", "gfs", "-Y"]);
        assert!(y.contains(":ready:down:"), "{y}");
    }

    // Item 12: the unmount happens even when the final checkpoint cannot be written.
    if fuse {
        for i in 0..50 {
            let _ = std::fs::create_dir(mnt.join(format!("after{i}")));
        }
        let out = node.run(&["umount", "gfs"]);
        let text = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
        assert!(!mounts.contains(s(&mnt)), "{text}");
        assert_eq!(out.status.code(), Some(2), "{text}");
        assert!(
            text.contains("is unmounted") && text.contains("replays the recovery log"),
            "{text}"
        );
        let err = node.fails(&["umount", "gfs"]);
        assert!(err.contains("not mounted"), "{err}");
    }

    // Item 14: a restart with the lost vdisk logs the strips it cannot rebuild once per
    // vdisk and pass, with a count, not once per strip.
    node.ok(&["shutdown"]);
    node.ok(&["startup"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while node
        .ok(&["da", "ls", "da1", "-Y"])
        .lines()
        .any(|l| l.starts_with("da:task:0:") && l.trim_end_matches(':').ends_with("false"))
    {
        assert!(Instant::now() < deadline, "rebuild pass did not end");
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = std::fs::read_to_string(node.home().join("log/daemon.log")).unwrap();
    let per_strip = log
        .lines()
        .filter(|l| l.contains("cannot rebuild") || l.contains("cannot move"))
        .count();
    assert!(per_strip > 0 && per_strip < 20, "{per_strip} lines:\n{log}");
    disk_ls(&node);

    // Item 10: delete top down, each step refused while the one above uses the object.
    let err = node.fails(&["da", "delete", "da1"]);
    assert!(err.contains("vd0") && err.contains("vdisk delete"), "{err}");
    let err = node.fails(&["vdisk", "delete", "vd0"]);
    assert!(err.contains("nsd delete vd0"), "{err}");
    let err = node.fails(&["nsd", "delete", "vd0"]);
    assert!(err.contains("fs delete gfs"), "{err}");
    let err = node.fails(&["fs", "delete", "gfs"]);
    assert!(err.contains("-p"), "{err}");
    let out = node.ok(&["fs", "delete", "gfs", "-p"]);
    assert_eq!(out.matches("will be destroyed").count(), 1, "{out}");
    node.ok(&["nsd", "delete", "vd0"]);
    node.ok(&["vdisk", "delete", "vd0"]);
    node.ok(&["da", "delete", "da1"]);
    assert!(node.ok(&["da", "ls"]).contains("no declustered arrays"));
    assert!(node.ok(&["pdisk", "ls"]).contains("no pdisks"));
    let err = node.fails(&["da", "delete", "da1"]);
    assert!(err.contains("does not exist"), "{err}");
    // The drives are free again.
    let pdisks = node.path("pdisks.stanza");
    node.ok(&["da", "create", "da2", "-F", s(&pdisks)]);
}

/// Item 13: the spare column shrinks when a rebuild used spare space, a replaced pdisk
/// leaves the default listing (`--all` shows it), and the foreground share is named so.
#[test]
fn rebuild_uses_spare_and_replaced_pdisks_leave_the_listing() {
    let mut node = Node::new().start();
    node.file_system_on_vdisk("256M");
    let spare = |node: &Node| -> u64 {
        let y = node.ok(&["da", "ls", "da1", "-Y"]);
        let header = y.lines().find(|l| l.starts_with("da::HEADER:")).unwrap();
        let row = y.lines().find(|l| l.starts_with("da::0:")).unwrap();
        let col = header.split(':').position(|c| c == "spareBytes").unwrap();
        row.split(':').nth(col).unwrap().parse().unwrap()
    };
    let before = spare(&node);
    assert!(before > 0);
    node.ok(&["pdisk", "fail", "e4s2"]);
    wait_rebuilt(&node);
    let after = spare(&node);
    assert!(after < before, "spare {before} -> {after}");

    let new = node.drive("new-e4s2", 256 << 20);
    node.ok(&["pdisk", "replace", "e4s2", "--device", s(&new)]);
    wait_rebuilt(&node);
    let listing = node.ok(&["pdisk", "ls"]);
    assert!(!listing.contains("replaced"), "{listing}");
    let rows = listing.lines().filter(|l| l.starts_with("e4s2 ")).count();
    assert_eq!(rows, 1, "{listing}");
    assert!(node
        .ok(&["pdisk", "ls", "--not-ok"])
        .contains("every pdisk is ok"));
    let all = node.ok(&["pdisk", "ls", "--all"]);
    assert!(all.contains("replaced"), "{all}");
    assert!(
        spare(&node) >= before,
        "spare after replacement: {}",
        spare(&node)
    );

    node.ok(&["da", "change", "da1", "--foreground-io-share", "70"]);
    node.ok(&["da", "change", "da1", "--rebuild-io-share", "60"]);
    let listing = node.ok(&["da", "ls", "da1"]);
    assert!(
        listing.contains("foreground share") && listing.contains("60%"),
        "{listing}"
    );
    let y = node.ok(&["da", "ls", "da1", "-Y"]);
    assert!(y.contains(":foregroundIoShare:"), "{y}");
    let help = node.ok(&["da", "change", "--help"]);
    assert!(help.contains("--foreground-io-share"), "{help}");
}
