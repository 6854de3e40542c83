//! `metadataSlots=yes` (experimental) on three nodes in network namespaces: a node that
//! mounts beside the file system manager takes an owner slot of its own, the directories it
//! makes in the manager's directories are made for its slot, and everything made in them is
//! served by that node; every node sees one namespace (names, attributes, data) and
//! removes what any other made; fsck is clean at the end.
//!
//! Needs root and `ip netns`; without them the test says why and passes, except under
//! CI=true, where it fails.

mod common;

use common::netns::{netns_usable, tessera_ok, Cluster, TEST_TIMINGS};

#[test]
fn nodes_own_the_directories_they_make_and_all_see_one_namespace() {
    if !netns_usable() {
        return;
    }
    let c = Cluster::new();
    let config = format!("{TEST_TIMINGS},metadataSlots=yes");
    c.ok(&[
        "up", "3", "--drives", "1", "--size", "1G", "--config", &config,
    ]);
    let stanza = c.base.join("m1.stanza");
    std::fs::write(
        &stanza,
        format!(
            "%nsd: device={} nsd=m1 usage=dataAndMetadata failureGroup=1 pool=system\n",
            c.base.join("drives/node1-d1.img").display()
        ),
    )
    .unwrap();
    let base = c.base.clone();
    let mnt = move |k: u32| base.join(format!("node{k}/mnt/m1"));
    tessera_ok(&c, 1, &["nsd", "create", "-F", stanza.to_str().unwrap()]);
    // 256 KiB blocks: allocation regions of 254 MiB, so that the 1 GiB drive has free
    // ones to give to the other nodes' slots.
    tessera_ok(
        &c,
        1,
        &[
            "fs",
            "create",
            "m1",
            "-F",
            stanza.to_str().unwrap(),
            "-B",
            "256K",
            "-T",
            mnt(1).to_str().unwrap(),
        ],
    );
    tessera_ok(&c, 1, &["mount", "m1", "-N", "node1,node2,node3"]);

    // Each node makes its directory in the root (the manager's) and files in it.
    let content = |k: u32, i: u32| format!("node {k} file {i}").repeat(50 + i as usize);
    for k in 1..=3u32 {
        let dir = mnt(k).join(format!("dir{k}"));
        std::fs::create_dir(&dir).unwrap();
        for i in 0..20 {
            std::fs::write(dir.join(format!("f{i}")), content(k, i)).unwrap();
        }
        std::fs::create_dir(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/deep"), content(k, 99)).unwrap();
    }
    // The other nodes hold owner slots (`mount ls -L` says so).
    let listed = tessera_ok(&c, 1, &["mount", "ls", "m1", "-L"]);
    assert!(
        listed.contains("client, owner slot 1") && listed.contains("client, owner slot 2"),
        "{listed}"
    );
    // Every node sees every node's files, and a node writes into another's.
    let listing = |k: u32, d: &str| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(mnt(k).join(d))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    for owner in 1..=3u32 {
        let d = format!("dir{owner}");
        for k in 1..=3u32 {
            assert_eq!(listing(k, &d).len(), 21, "node {k} lists {d}");
            for i in [0u32, 7, 19] {
                let got = std::fs::read_to_string(mnt(k).join(&d).join(format!("f{i}"))).unwrap();
                assert_eq!(got, content(owner, i), "node {k} reads {d}/f{i}");
            }
            assert_eq!(
                std::fs::read_to_string(mnt(k).join(&d).join("sub/deep")).unwrap(),
                content(owner, 99)
            );
        }
    }
    std::fs::write(mnt(1).join("dir2/f0"), b"rewritten by node 1").unwrap();
    assert_eq!(
        std::fs::read(mnt(2).join("dir2/f0")).unwrap(),
        b"rewritten by node 1"
    );
    assert_eq!(
        std::fs::metadata(mnt(3).join("dir2/f0")).unwrap().len(),
        19,
        "node 3 sees the size node 1 wrote into node 2's file"
    );
    // A name removed on one node is gone on the others at once.
    std::fs::remove_file(mnt(3).join("dir2/f1")).unwrap();
    for k in 1..=3u32 {
        assert!(
            !mnt(k).join("dir2/f1").exists(),
            "node {k} still sees dir2/f1"
        );
    }
    // mdtest's hard pattern across owners: every node creates and removes files at once
    // in one directory node 2's slot serves, which each looked into first (so each kernel
    // keeps names of it). No node waits on its kernel to drop names (see
    // `netns_cluster.rs`, `creates_in_one_directory_from_every_node`).
    std::fs::create_dir(mnt(2).join("dir2/shared")).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    for k in 1..=3u32 {
        assert!(listing(k, "dir2/shared").is_empty());
    }
    let mnt_ref = &mnt;
    std::thread::scope(|scope| {
        for k in 1..=3u32 {
            let path = move |i: u32| mnt_ref(k).join(format!("dir2/shared/f.{k}.{i}"));
            scope.spawn(move || {
                for i in 0..100 {
                    std::fs::write(path(i), b"x").unwrap();
                }
                for i in 0..100 {
                    std::fs::remove_file(path(i)).unwrap();
                }
            });
        }
    });
    for k in 1..=3u32 {
        assert!(listing(k, "dir2/shared").is_empty(), "node {k}");
        let log = std::fs::read_to_string(c.base.join(format!("node{k}/home/log/daemon.log")))
            .unwrap_or_default();
        assert!(
            !log.contains("the kernel took more than"),
            "node {k} waited for its kernel to drop names\n{}",
            log_tails(&c)
        );
    }
    // Every node removes another node's directory tree.
    for (k, owner) in [(1u32, 2u32), (2, 3), (3, 1)] {
        if let Err(e) = std::fs::remove_dir_all(mnt(k).join(format!("dir{owner}"))) {
            panic!("node {k} removing dir{owner}: {e}\n{}", log_tails(&c));
        }
    }
    for k in 1..=3u32 {
        assert!(
            listing(k, ".").is_empty(),
            "node {k}: {:?}",
            listing(k, ".")
        );
    }
    tessera_ok(&c, 3, &["umount", "m1", "-a"]);
    let fsck = tessera_ok(&c, 1, &["fsck", "m1", "-n"]);
    assert!(fsck.contains(" 0 problems found"), "{fsck}");
    tessera_ok(&c, 1, &["shutdown", "-a"]);
}

/// The end of every node's daemon log, for a failure's message.
fn log_tails(c: &Cluster) -> String {
    (1..=3)
        .map(|k| {
            let log = std::fs::read_to_string(c.base.join(format!("node{k}/home/log/daemon.log")))
                .unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(25)..].join("\n");
            format!("--- node{k}\n{tail}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}
