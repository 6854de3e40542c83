//! Storage pools and placement policies through the CLI: `policy change -P` [mmchpolicy]
//! installs rules checked against the pools (a bad one is refused with its line and
//! column), files created through the mount land in the pools the rules name (`file attr
//! ls` [mmlsattr -L] and `df` per pool say so), `policy ls` [mmlspolicy -L] shows the text,
//! and all of it survives a restart.

mod common;

use common::*;

const MIB: u64 = 1 << 20;

#[test]
fn placement_policy_through_the_cli() {
    if !fuse_usable() {
        return;
    }
    let mut node = Node::new().start();
    let mut stanza = String::new();
    for i in 0..4 {
        let dev = node.drive(&format!("pl-drive{i}"), 256 * MIB);
        let (pool, usage) = if i < 2 {
            ("system", "dataAndMetadata")
        } else {
            ("slow", "dataOnly")
        };
        stanza += &format!(
            "%nsd: device={} nsd=pl{i} usage={usage} failureGroup={} pool={pool}\n",
            dev.display(),
            i + 1
        );
    }
    stanza += "%pool: pool=slow\n";
    let stanza_path = node.path("pl.stanza");
    std::fs::write(&stanza_path, &stanza).unwrap();
    node.ok(&["nsd", "create", "-F", s(&stanza_path)]);
    let mnt = node.create_fs("pfs", &stanza_path, "mnt");
    node.ok(&["mount", "pfs"]);

    let out = node.ok(&["policy", "ls", "pfs"]);
    assert!(out.contains("No policy is installed for pfs"), "{out}");

    // Refused: a pool that does not exist, with where it is.
    let bad = node.path("bad.pol");
    std::fs::write(
        &bad,
        "RULE 'a' SET POOL 'slow'\nRULE 'b' SET POOL 'nvme' WHERE USER_ID = 0\n",
    )
    .unwrap();
    let err = node.fails(&["policy", "change", "pfs", "-P", s(&bad)]);
    assert!(
        err.contains("line 2, column 19") && err.contains("storage pool 'nvme' does not exist"),
        "{err}"
    );
    let bad2 = node.path("bad2.pol");
    std::fs::write(&bad2, "RULE 'a' SET POOL 'slow' WHERE SIZE > 1\n").unwrap();
    let err = node.fails(&["policy", "change", "pfs", "-P", s(&bad2)]);
    assert!(
        err.contains("line 1, column 32") && err.contains("unknown file attribute SIZE"),
        "{err}"
    );

    let policy = "RULE 'scratch' SET POOL 'slow' WHERE NAME LIKE '%.tmp'\nRULE 'default' SET POOL 'system'\n";
    let good = node.path("good.pol");
    std::fs::write(&good, policy).unwrap();
    let out = node.ok(&["policy", "change", "pfs", "-P", s(&good), "-I", "test"]);
    assert!(
        out.contains("is valid") && out.contains("not installed"),
        "{out}"
    );
    assert!(node.ok(&["policy", "ls", "pfs"]).contains("No policy"));
    let out = node.ok(&["policy", "change", "pfs", "-P", s(&good)]);
    assert!(
        out.contains("installed for pfs (2 rules: 2 placement"),
        "{out}"
    );
    assert_eq!(node.ok(&["policy", "ls", "pfs"]), policy);

    let tmp = pattern(5 * MIB as usize, 1);
    let dat = pattern(5 * MIB as usize, 2);
    std::fs::write(mnt.join("a.tmp"), &tmp).unwrap();
    std::fs::write(mnt.join("b.dat"), &dat).unwrap();
    let out = node.ok(&[
        "file",
        "attr",
        "ls",
        s(&mnt.join("a.tmp")),
        s(&mnt.join("b.dat")),
    ]);
    let sections: Vec<&str> = out.split("\n\n").collect();
    assert_eq!(sections.len(), 2, "{out}");
    assert!(sections[0].contains("storage pool name:    slow"), "{out}");
    assert!(sections[0].contains("fileset name:         root"), "{out}");
    assert!(
        !sections[0].contains("pl0") && !sections[0].contains("pl1"),
        "{out}"
    );
    assert!(
        sections[1].contains("storage pool name:    system"),
        "{out}"
    );
    assert!(
        !sections[1].contains("pl2") && !sections[1].contains("pl3"),
        "{out}"
    );
    let err = node.fails(&["file", "attr", "ls", "/etc/hostname"]);
    assert!(
        err.contains("not on a mounted Tessera file system"),
        "{err}"
    );

    // `df` per pool: the slow pool holds a.tmp's 5 MiB.
    let df = node.ok(&["df", "pfs", "-Y"]);
    let slow: Vec<u64> = df
        .lines()
        .find(|l| l.contains(":poolTotal:") && !l.contains(":HEADER:") && l.contains(":slow:"))
        .unwrap_or_else(|| panic!("no slow pool in\n{df}"))
        .split(':')
        .skip(8)
        .take(3)
        .map(|x| x.parse().unwrap())
        .collect();
    let used_kb = slow[0] - slow[1] - slow[2];
    assert!(used_kb >= 5 * 1024, "slow pool uses {used_kb} KiB:\n{df}");

    // Restart: the policy and the files' pools stay.
    node.ok(&["shutdown"]);
    // The daemon mounts again what was mounted when it stopped.
    node.ok(&["startup"]);
    assert_eq!(node.ok(&["policy", "ls", "pfs"]), policy);
    assert_eq!(std::fs::read(mnt.join("a.tmp")).unwrap(), tmp);
    assert_eq!(std::fs::read(mnt.join("b.dat")).unwrap(), dat);
    std::fs::write(mnt.join("c.tmp"), &tmp).unwrap();
    let out = node.ok(&["file", "attr", "ls", s(&mnt.join("c.tmp"))]);
    assert!(out.contains("storage pool name:    slow"), "{out}");

    let out = node.ok(&["policy", "change", "pfs", "-P", "DEFAULT"]);
    assert!(out.contains("removed"), "{out}");
    std::fs::write(mnt.join("d.tmp"), &tmp).unwrap();
    let out = node.ok(&["file", "attr", "ls", s(&mnt.join("d.tmp"))]);
    assert!(out.contains("storage pool name:    system"), "{out}");
    // policy apply [mmapplypolicy]: -I test reports, -I yes migrates, -I defer leaves the
    // data for restripe -p.
    let manage = node.path("manage.pol");
    std::fs::write(
        &manage,
        "RULE EXTERNAL LIST 'tmps' EXEC ''\n\
         RULE 'back' MIGRATE FROM POOL 'slow' TO POOL 'system' WHERE NAME = 'c.tmp'\n\
         RULE 'l' LIST 'tmps' WHERE NAME LIKE '%.tmp'\n",
    )
    .unwrap();
    let out = node.ok(&["policy", "apply", "pfs", "-P", s(&manage), "-I", "test"]);
    assert!(
        out.contains("files scanned (-I test: nothing changed)"),
        "{out}"
    );
    assert!(
        out.contains("LIST 'tmps': 2 files") && out.contains("  /a.tmp"),
        "{out}"
    );
    let attr = node.ok(&["file", "attr", "ls", s(&mnt.join("c.tmp"))]);
    assert!(attr.contains("storage pool name:    slow"), "{attr}");
    let out = node.ok(&["policy", "apply", "pfs", "-P", s(&manage)]);
    assert!(out.contains("1 files migrated"), "{out}");
    let attr = node.ok(&["file", "attr", "ls", s(&mnt.join("c.tmp"))]);
    assert!(
        attr.contains("storage pool name:    system")
            && !attr.contains("pl2")
            && !attr.contains("pl3"),
        "{attr}"
    );
    assert_eq!(std::fs::read(mnt.join("c.tmp")).unwrap(), tmp);

    let defer = node.path("defer.pol");
    std::fs::write(
        &defer,
        "RULE 'back' MIGRATE FROM POOL 'slow' TO POOL 'system' WHERE NAME = 'a.tmp'\n",
    )
    .unwrap();
    let out = node.ok(&["policy", "apply", "pfs", "-P", s(&defer), "-I", "defer"]);
    assert!(out.contains("1 files migrated (0.0 MiB"), "{out}");
    let attr = node.ok(&["file", "attr", "ls", s(&mnt.join("a.tmp"))]);
    assert!(
        attr.contains("storage pool name:    system") && attr.contains("pl2"),
        "{attr}"
    );
    let out = node.ok(&["restripe", "pfs", "-p"]);
    assert!(out.contains("data blocks moved"), "{out}");
    let attr = node.ok(&["file", "attr", "ls", s(&mnt.join("a.tmp"))]);
    assert!(!attr.contains("pl2") && !attr.contains("pl3"), "{attr}");
    assert_eq!(std::fs::read(mnt.join("a.tmp")).unwrap(), tmp);
    let err = node.fails(&["policy", "apply", "pfs", "-P", s(&bad)]);
    assert!(err.contains("line 2, column 19"), "{err}");

    node.ok(&["umount", "pfs"]);
    let report = node.ok(&["fsck", "pfs", "-n"]);
    assert!(report.contains("is clean"), "{report}");
}
