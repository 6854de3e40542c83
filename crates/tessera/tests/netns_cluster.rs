//! Clusters of real daemons in network namespaces, built and driven with
//! `scripts/cluster-netns.sh` as a user would: elections, disk leases, expels, partitions,
//! restarts, a node with the wrong secret and garbage on the daemon port. Test timings
//! (`failureDetectionTime=3`) keep each scenario within a minute or two.
//!
//! The tests need root and `ip netns`; without them they say why and pass, except under
//! CI=true, where they fail, so CI never silently checks nothing.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::crash_loop::{crash_loop_bytes, owner_of, write_synced};
use common::netns::{
    all_in_state, manager, netns_usable, states, tessera, tessera_ok, up, up_with_drives, wait_for,
    y_rows, Cluster, NEW_MANAGER_WITHIN, SETTLE, TEST_TIMINGS,
};

/// Kills the manager and waits for a new one that every live node follows; returns it.
fn kill_manager_and_wait(c: &Cluster, nodes: &[u32]) -> (u32, u32, Duration) {
    let old = manager(c, nodes[0]).expect("a cluster manager");
    let survivors: Vec<u32> = nodes.iter().copied().filter(|n| *n != old).collect();
    c.ok(&["kill", &old.to_string()]);
    let killed_at = Instant::now();
    let mut new = 0;
    wait_for(
        "a new cluster manager",
        NEW_MANAGER_WITHIN,
        || match manager(c, survivors[0]) {
            Some(m) if m != old => {
                new = m;
                all_in_state(c, survivors[0], &survivors, "active")
            }
            _ => false,
        },
    );
    (old, new, killed_at.elapsed())
}

#[test]
fn three_quorum_nodes_and_a_client_fail_over_expel_partition_and_restart() {
    if !netns_usable() {
        return;
    }
    let c = up_with_drives(4);
    let all = [1, 2, 3, 4];
    assert!(all_in_state(&c, 4, &all, "active"), "{:?}", states(&c, 4));

    // A change made on one node is seen on every other, the client too.
    tessera_ok(&c, 2, &["config", "set", "leaseRecoveryWait=2"]);
    wait_for("the change on the client", SETTLE, || {
        tessera_ok(&c, 4, &["config", "ls"]).contains("leaseRecoveryWait 2")
    });

    // kill -9 of the cluster manager: another quorum node takes over quickly.
    let (old, new, took) = kill_manager_and_wait(&c, &all);
    eprintln!("manager {old} killed; node {new} manages after {took:?}");
    // The killed node is expelled (its incarnation is no longer live)...
    wait_for("the expel of the killed manager", SETTLE, || {
        states(&c, new)
            .get(&format!("node{old}"))
            .is_some_and(|(s, epoch)| s == "down" && epoch.is_empty())
    });
    // ...and comes back by itself once restarted, with a new epoch.
    c.ok(&["start", &old.to_string()]);
    wait_for("all active after the restart", SETTLE, || {
        all_in_state(&c, new, &all, "active")
    });

    // kill -9 of a client: expelled after failureDetectionTime, back after a restart.
    let before = states(&c, 1)["node4"].1.clone();
    c.ok(&["kill", "4"]);
    // Its own `state -a` still answers, asking the others directly.
    let seen = states(&c, 4);
    assert_eq!(seen["node4"].0, "down", "{seen:?}");
    assert_eq!(seen["node1"].0, "active", "{seen:?}");
    wait_for("the expel of the client", SETTLE, || {
        states(&c, 1)
            .get("node4")
            .is_some_and(|(s, epoch)| s == "down" && epoch.is_empty())
    });
    c.ok(&["start", "4"]);
    wait_for("the client active again", SETTLE, || {
        all_in_state(&c, 1, &all, "active")
    });
    let after = states(&c, 1)["node4"].1.clone();
    let (before, after): (u64, u64) = (before.parse().unwrap(), after.parse().unwrap());
    assert!(
        after > before,
        "a new incarnation gets a larger epoch: {before} -> {after}"
    );

    // A quorum node cut off alone goes arbitrating; the majority stays active.
    let lonely = if manager(&c, 1) == Some(3) { 2 } else { 3 };
    let majority: Vec<u32> = all.iter().copied().filter(|n| *n != lonely).collect();
    // It has a file system mounted: its disk I/O must stop while it has no lease.
    let stanza = c.base.join("nsd.stanza");
    let drive = format!(
        "%nsd: device={} nsd=n1 usage=dataAndMetadata failureGroup=1 pool=system\n",
        c.base.join("drives/node1-d1.img").display()
    );
    std::fs::write(&stanza, drive).unwrap();
    let stanza = stanza.to_str().unwrap();
    let mnt = c.base.join(format!("node{lonely}/mnt/g1"));
    tessera_ok(&c, lonely, &["nsd", "create", "-F", stanza]);
    tessera_ok(
        &c,
        lonely,
        &[
            "fs",
            "create",
            "g1",
            "-F",
            stanza,
            "-T",
            mnt.to_str().unwrap(),
        ],
    );
    tessera_ok(&c, lonely, &["mount", "g1"]);
    std::fs::write(mnt.join("before"), b"with a lease").unwrap();
    // Another node mounts it beside the owner, as its client, and reads what it wrote.
    let beside = c.base.join(format!("node{}/mnt/g1", majority[0]));
    tessera_ok(
        &c,
        majority[0],
        &["mount", "g1", "-T", beside.to_str().unwrap()],
    );
    assert_eq!(
        std::fs::read(beside.join("before")).unwrap(),
        b"with a lease"
    );
    tessera_ok(&c, majority[0], &["umount", "g1"]);
    c.ok(&["partition", &lonely.to_string()]);
    wait_for("the cut-off node arbitrating", SETTLE, || {
        let own = tessera(&c, lonely, &["state", "-Y"]);
        String::from_utf8_lossy(&own.stdout).contains(":arbitrating:")
    });
    assert!(
        all_in_state(&c, majority[0], &majority, "active"),
        "the majority must stay active: {:?}",
        states(&c, majority[0])
    );
    // The minority cannot change the configuration, nor write to its disks.
    let refused = tessera(&c, lonely, &["config", "set", "leaseRecoveryWait=3"]);
    assert!(!refused.status.success(), "a minority committed a change");
    let write_and_sync = |name: &str| -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(mnt.join(name))?;
        f.write_all(&[7u8; 65536])?;
        f.sync_all()
    };
    let cut_off = write_and_sync("during");
    assert!(
        cut_off.is_err(),
        "a node without a lease wrote to its disks"
    );
    c.ok(&["heal"]);
    wait_for("all active after heal", SETTLE, || {
        all_in_state(&c, 1, &all, "active")
    });
    // Still the same incarnation (the partition was shorter than its lease and the
    // expel), its I/O resumes; expelled meanwhile, its mount is stale (another node could
    // have taken the file system over) until it is mounted again.
    if let Err(e) = write_and_sync("after") {
        eprintln!("after the heal: {e}; mounting again");
        // Its final checkpoint cannot be written by a stale mount: exit status 2.
        let _ = tessera(&c, lonely, &["umount", "g1"]);
        tessera_ok(&c, lonely, &["mount", "g1"]);
        write_and_sync("after").expect("I/O after mounting again");
    }
    assert_eq!(std::fs::read(mnt.join("before")).unwrap(), b"with a lease");
    tessera_ok(&c, lonely, &["umount", "g1"]);

    // Every daemon killed at once, then all started: the configuration is intact.
    for k in all {
        c.ok(&["kill", &k.to_string()]);
    }
    tessera_ok(&c, 1, &["startup", "-a"]);
    wait_for("all active after a restart of all", SETTLE, || {
        all_in_state(&c, 1, &all, "active")
    });
    let config = tessera_ok(&c, 3, &["config", "ls"]);
    assert!(config.contains("leaseRecoveryWait 2"), "{config}");
    assert!(config.contains("failureDetectionTime 3"), "{config}");
    let listing = tessera_ok(&c, 4, &["cluster", "ls"]);
    for k in all {
        assert!(listing.contains(&format!("node{k}")), "{listing}");
    }
    // g1 (`-A yes`, the default) is mounted on every node whose daemon started, as GPFS
    // does at mmstartup, though it was mounted nowhere when they died: the first node up
    // owns it, the others join it (some after a retry, while the owner still mounts it).
    // `mount ls` lists a client from the moment its mount starts (its entry goes into the
    // table first, so that the owner fences it if it dies), so the files are waited for too.
    wait_for("g1 mounted on every node at start", SETTLE, || {
        let listed = tessera_ok(&c, 1, &["mount", "ls", "g1", "-Y"]);
        all.iter().all(|k| {
            listed.contains(&format!(":g1:node{k}:"))
                && c.base.join(format!("node{k}/mnt/g1/before")).exists()
        })
    });
    for k in all {
        let at = c.base.join(format!("node{k}/mnt/g1/before"));
        assert_eq!(std::fs::read(&at).unwrap(), b"with a lease", "node {k}");
    }

    // shutdown -a from any node stops every daemon.
    tessera_ok(&c, 2, &["shutdown", "-a"]);
    let status = c.ok(&["status"]);
    assert_eq!(status.matches(" down ").count(), 4, "{status}");
}

#[test]
fn five_quorum_nodes_survive_a_manager_kill_and_a_two_node_partition() {
    if !netns_usable() {
        return;
    }
    let c = Cluster::new();
    c.ok(&["up", "6", "--quorum", "5", "--config", TEST_TIMINGS]);
    let all = [1, 2, 3, 4, 5, 6];
    let summary = tessera_ok(&c, 6, &["state", "-a", "-s"]);
    assert!(summary.contains('5'), "{summary}");

    let (old, new, took) = kill_manager_and_wait(&c, &all);
    eprintln!("manager {old} killed; node {new} manages after {took:?}");
    c.ok(&["start", &old.to_string()]);
    wait_for("all active after the restart", SETTLE, || {
        all_in_state(&c, new, &all, "active")
    });

    // Two of five quorum nodes cut off: they lose their leases, the three keep theirs.
    let cut: Vec<u32> = [4, 5, 1, 2]
        .into_iter()
        .filter(|n| Some(*n) != manager(&c, 6))
        .take(2)
        .collect();
    let rest: Vec<u32> = all.iter().copied().filter(|n| !cut.contains(n)).collect();
    c.ok(&["partition", &cut[0].to_string(), &cut[1].to_string()]);
    wait_for("the minority arbitrating", SETTLE, || {
        cut.iter().all(|k| {
            let own = tessera(&c, *k, &["state", "-Y"]);
            String::from_utf8_lossy(&own.stdout).contains(":arbitrating:")
        })
    });
    assert!(
        all_in_state(&c, rest[0], &rest, "active"),
        "{:?}",
        states(&c, rest[0])
    );
    c.ok(&["heal"]);
    wait_for("all active after heal", SETTLE, || {
        all_in_state(&c, 6, &all, "active")
    });
}

#[test]
fn a_wrong_secret_and_garbage_on_the_daemon_port_are_refused() {
    if !netns_usable() {
        return;
    }
    let c = Cluster::new();
    c.ok(&["up", "3", "--config", TEST_TIMINGS]);
    let all = [1, 2, 3];

    // Garbage, a truncated handshake and an absurd length prefix on node 1's daemon port.
    let target = format!("{}.1", c.subnet);
    let garbage = format!(
        "import os, socket\n\
         for payload in [os.urandom(4096), b'TSR', b'\\xff' * 64, b'\\x00\\x00\\x00\\x10']:\n\
         \x20   s = socket.create_connection(('{target}', 1191), timeout=5)\n\
         \x20   s.sendall(payload)\n\
         \x20   s.close()\n"
    );
    let out = c.sh(&["run", "2", "--", "python3", "-c", &garbage]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        all_in_state(&c, 1, &all, "active"),
        "garbage must not disturb the cluster: {:?}",
        states(&c, 1)
    );

    // Node 3 restarted with another cluster's secret: refused, never active.
    tessera_ok(&c, 3, &["shutdown"]);
    let secret = c.base.join("node3/home/cluster.secret");
    let good = std::fs::read(&secret).expect("node 3's secret");
    let other = tempfile::tempdir().unwrap();
    let created = std::process::Command::new(common::BIN)
        .args(["cluster", "create", "--name", "other"])
        .env("TESSERA_HOME", other.path())
        .output()
        .unwrap();
    assert!(created.status.success(), "{created:?}");
    std::fs::copy(other.path().join("cluster.secret"), &secret).unwrap();
    c.ok(&["start", "3"]);
    std::thread::sleep(Duration::from_secs(8));
    let seen = states(&c, 1);
    assert_ne!(
        seen["node3"].0, "active",
        "a node with the wrong secret: {seen:?}"
    );
    let own = tessera(&c, 3, &["state", "-Y"]);
    assert!(
        String::from_utf8_lossy(&own.stdout).contains(":arbitrating:"),
        "{}",
        String::from_utf8_lossy(&own.stdout)
    );
    let log = std::fs::read_to_string(c.base.join("node1/home/log/daemon.log")).unwrap();
    assert!(
        log.contains("secret") || log.contains("authenticat"),
        "node 1 logs the refused handshake"
    );

    // With the right secret back, it rejoins.
    tessera_ok(&c, 3, &["shutdown"]);
    std::fs::write(&secret, good).unwrap();
    c.ok(&["start", "3"]);
    wait_for("node 3 active with the right secret", SETTLE, || {
        all_in_state(&c, 1, &all, "active")
    });
}

#[test]
fn nodes_are_deleted_added_and_changed_while_the_cluster_runs() {
    if !netns_usable() {
        return;
    }
    let c = Cluster::new();
    c.ok(&["up", "4", "--config", TEST_TIMINGS]);

    // A running node cannot be deleted; a stopped one can, and is gone from every table.
    let refused = tessera(&c, 1, &["node", "delete", "-N", "node4"]);
    assert!(!refused.status.success(), "deleted a running node");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("shutdown"));
    tessera_ok(&c, 1, &["shutdown", "-N", "node4"]);
    tessera_ok(&c, 1, &["node", "delete", "-N", "node4"]);
    wait_for("node4 gone on node 3", SETTLE, || {
        !tessera_ok(&c, 3, &["cluster", "ls"]).contains("node4")
    });

    // Added again (its old home cleared, as after a reinstall): a new number, active.
    let home = c.base.join("node4/home");
    std::fs::remove_dir_all(&home).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    let entry = format!("node4::{}.4", c.subnet);
    tessera_ok(&c, 2, &["node", "add", "-N", &entry]);
    tessera_ok(&c, 2, &["startup", "-N", "node4"]);
    wait_for("the added node active", SETTLE, || {
        all_in_state(&c, 1, &[1, 2, 3, 4], "active")
    });
    let listing = tessera_ok(&c, 4, &["cluster", "ls", "-Y"]);
    assert!(
        listing.lines().any(|l| l.contains(":5:node4:")),
        "node4 comes back as node number 5:\n{listing}"
    );

    // The cluster manager itself becomes a client: another quorum node takes over, and two
    // quorum nodes are left, so two are needed.
    let demoted = manager(&c, 1).expect("a cluster manager");
    let name = format!("node{demoted}");
    tessera_ok(&c, 1, &["node", "change", "-N", &name, "--nonquorum"]);
    wait_for("another manager, two quorum nodes", SETTLE, || {
        let out = tessera(&c, 4, &["state", "-a", "-s", "-Y"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let summary = y_rows(&text, "state:summary:");
        summary.first().is_some_and(|r| {
            r["quorumNodesDefined"] == "2"
                && r["managerNumber"]
                    .parse::<u32>()
                    .is_ok_and(|m| m != demoted)
        }) && all_in_state(&c, 4, &[1, 2, 3, 4], "active")
    });
    // The last quorum nodes cannot all go.
    let quorum: Vec<String> = [1, 2, 3]
        .into_iter()
        .filter(|n| *n != demoted)
        .map(|n| format!("node{n}"))
        .collect();
    let refused = tessera(
        &c,
        4,
        &["node", "change", "-N", &quorum.join(","), "--nonquorum"],
    );
    assert!(!refused.status.success(), "a cluster without quorum nodes");
    tessera_ok(&c, 1, &["node", "change", "-N", &name, "--quorum"]);
    wait_for("all active with three quorum nodes", SETTLE, || {
        all_in_state(&c, 1, &[1, 2, 3, 4], "active")
    });
}

/// A node that mounts a file system dies: once the cluster has expelled it another node
/// mounts the file system, which replays the dead node's recovery log, and finds every
/// fsynced byte. The dead node, back, does not take it over again behind the new owner's
/// back: its mount joins the new owner as a client.
#[test]
fn a_dead_nodes_file_system_is_taken_over_after_its_expel() {
    if !netns_usable() {
        return;
    }
    let c = up_with_drives(3);
    let all = [1, 2, 3];
    assert!(all_in_state(&c, 1, &all, "active"), "{:?}", states(&c, 1));
    let stanza = c.nsd_stanza("t1", "node1-d1.img", 1);
    let stanza = stanza.as_str();
    let mnt1 = c.base.join("node1/mnt/t1");
    let mnt2 = c.base.join("node2/mnt/t1");
    tessera_ok(&c, 1, &["nsd", "create", "-F", stanza]);
    tessera_ok(
        &c,
        1,
        &[
            "fs",
            "create",
            "t1",
            "-F",
            stanza,
            "-T",
            mnt1.to_str().unwrap(),
        ],
    );
    tessera_ok(&c, 1, &["mount", "t1"]);
    // Every node can say where it is mounted [mmlsmount -L].
    let listed = tessera_ok(&c, 3, &["mount", "ls", "t1", "-L"]);
    assert!(
        listed.contains("File system t1 is mounted on 1 node:") && listed.contains("node1"),
        "{listed}"
    );
    // Fsynced data and a directory made on node 1.
    let acked: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    {
        use std::io::Write;
        std::fs::create_dir(mnt1.join("dir")).unwrap();
        let mut f = std::fs::File::create(mnt1.join("dir/acked")).unwrap();
        f.write_all(&acked).unwrap();
        f.sync_all().unwrap();
        std::fs::File::open(mnt1.join("dir"))
            .unwrap()
            .sync_all()
            .unwrap();
    }
    let mnt2_arg = mnt2.to_str().unwrap();

    c.ok(&["kill", "1"]);
    // The dead daemon's FUSE mount is left behind, as after any crash: detach it.
    let _ = std::process::Command::new("umount")
        .args(["-l", mnt1.to_str().unwrap()])
        .status();
    let waited = wait_for("the expel of node 1", SETTLE, || {
        states(&c, 2)
            .get("node1")
            .is_some_and(|(s, epoch)| s == "down" && epoch.is_empty())
    });
    eprintln!("node 1 expelled {waited:?} after its kill");
    tessera_ok(&c, 2, &["mount", "t1", "-T", mnt2_arg]);
    assert_eq!(std::fs::read(mnt2.join("dir/acked")).unwrap(), acked);
    std::fs::write(mnt2.join("dir/after"), b"written on node 2").unwrap();
    let listed = tessera_ok(&c, 3, &["mount", "ls", "-L", "-Y"]);
    assert!(
        listed.contains(":t1:node2:") && listed.contains(&c.address(2)),
        "{listed}"
    );

    // Node 1 comes back and leaves t1 to node 2: its daemon mounts t1 again by itself, as
    // it was mounted there when it died, now as node 2's client. (Its copy of the
    // configuration may still lag just after the restart: the claim's compare-and-set
    // then fails, and the mount reads the newer table and joins node 2.)
    c.ok(&["start", "1"]);
    wait_for("all active after the restart", SETTLE, || {
        all_in_state(&c, 2, &all, "active")
    });
    wait_for("node 1's mount at its start", SETTLE, || {
        std::fs::read(mnt1.join("dir/after")).ok().as_deref() == Some(&b"written on node 2"[..])
    });
    let again = tessera(&c, 1, &["mount", "t1"]);
    assert!(
        !again.status.success()
            && String::from_utf8_lossy(&again.stderr).contains("already mounted"),
        "{again:?}"
    );
    let listed = tessera_ok(&c, 3, &["mount", "ls", "t1", "-Y"]);
    assert!(
        listed.contains(":t1:node2:") && listed.contains(":manager:"),
        "{listed}"
    );
    assert!(
        listed.contains(":t1:node1:") && listed.contains(":client:"),
        "{listed}"
    );
    assert_eq!(
        std::fs::read(mnt1.join("dir/after")).unwrap(),
        b"written on node 2"
    );
    tessera_ok(&c, 1, &["umount", "t1"]);
    tessera_ok(&c, 2, &["umount", "t1"]);
    // Unmounted there, it mounts on node 1 again with everything written on both.
    tessera_ok(&c, 1, &["mount", "t1"]);
    assert_eq!(std::fs::read(mnt1.join("dir/acked")).unwrap(), acked);
    assert_eq!(
        std::fs::read(mnt1.join("dir/after")).unwrap(),
        b"written on node 2"
    );
    tessera_ok(&c, 1, &["umount", "t1"]);
    let listed = tessera_ok(&c, 2, &["mount", "ls", "all"]);
    assert!(
        listed.contains("File system t1 is not mounted."),
        "{listed}"
    );
    tessera_ok(&c, 1, &["shutdown", "-a"]);
}

/// File system `fs` on node `drive_node`'s drive, created on node 1 and mounted on every
/// node of `nodes` (node 1 first, which owns it), each at `node{k}/mnt/{fs}`; returns where
/// node `k` mounts it.
fn shared_fs(c: &Cluster, fs: &str, drive_node: u32, nodes: &[u32]) -> impl Fn(u32) -> PathBuf {
    // Blocks small enough that the 256 MiB drive has free allocation regions, so that
    // nodes mounting beside the manager take owner slots (the default).
    shared_fs_with_blocks(c, fs, drive_node, nodes, "256K")
}

/// [`shared_fs`] with blocks of `block` (`fs create -B`).
fn shared_fs_with_blocks(
    c: &Cluster,
    fs: &str,
    drive_node: u32,
    nodes: &[u32],
    block: &str,
) -> impl Fn(u32) -> PathBuf {
    let stanza = c.base.join(format!("{fs}.stanza"));
    std::fs::write(
        &stanza,
        format!(
            "%nsd: device={} nsd={fs} usage=dataAndMetadata failureGroup=1 pool=system\n",
            c.base
                .join(format!("drives/node{drive_node}-d1.img"))
                .display()
        ),
    )
    .unwrap();
    let stanza = stanza.to_str().unwrap();
    let base = c.base.clone();
    let fs_name = fs.to_string();
    let mnt = move |k: u32| base.join(format!("node{k}/mnt/{fs_name}"));
    tessera_ok(c, 1, &["nsd", "create", "-F", stanza]);
    tessera_ok(
        c,
        1,
        &[
            "fs",
            "create",
            fs,
            "-F",
            stanza,
            "-B",
            block,
            "-T",
            mnt(1).to_str().unwrap(),
        ],
    );
    // One command mounts it everywhere [mmmount -N]: node 1 first (it owns the metadata),
    // the others at once, each at its node's own directory (TESSERA_MOUNT_ROOT).
    let names: Vec<String> = nodes.iter().map(|k| format!("node{k}")).collect();
    let out = tessera_ok(c, 1, &["mount", fs, "-N", &names.join(",")]);
    for &k in nodes {
        assert!(
            out.contains(&format!(
                "File system {fs} is mounted at {}",
                mnt(k).display()
            )),
            "node {k}: {out}"
        );
    }
    mnt
}

/// One file system mounted on three nodes: the first mount owns the metadata (its
/// metanode), the others mount as its clients and read and write the shared drive
/// themselves. What one node writes, creates, renames or removes, the others see at once
/// (the owner's kernel caches are invalidated by its metanode, the clients' by the
/// revocations of their read tokens); the owner unmounting under its clients hands the file
/// system manager's role to one of them; every node unmounts and fsck finds the file system
/// clean.
#[test]
fn one_file_system_is_mounted_on_three_nodes() {
    if !netns_usable() {
        return;
    }
    let c = up_with_drives(3);
    let all = [1, 2, 3];
    assert!(all_in_state(&c, 1, &all, "active"), "{:?}", states(&c, 1));
    let mnt = shared_fs(&c, "s1", 1, &all);
    // Every node names the file system manager [mmlsmgr], a client too.
    let attrs = tessera_ok(&c, 3, &["fs", "ls", "s1", "-Y"]);
    assert!(attrs.contains(":fileSystemManager:node1:"), "{attrs}");
    let state = tessera_ok(&c, 2, &["state", "-a"]);
    let row = state
        .lines()
        .find(|l| l.contains("node1"))
        .unwrap_or_default();
    assert!(row.contains("file system manager of s1"), "{state}");
    let listed = tessera_ok(&c, 2, &["mount", "ls", "s1", "-L"]);
    assert!(
        listed.contains("File system s1 is mounted on 3 nodes:")
            && listed.contains("manager")
            && listed.matches("client").count() == 2,
        "{listed}"
    );

    // Data written and fsynced on a client is read by the owner and the other client.
    let data: Vec<u8> = (0..700_000u32).map(|i| (i % 253) as u8).collect();
    {
        use std::io::Write;
        let mut f = std::fs::File::create(mnt(2).join("from2")).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
    }
    for k in [1, 3] {
        assert!(
            std::fs::read(mnt(k).join("from2")).unwrap() == data,
            "node {k} reads what node 2 wrote"
        );
    }
    // The owner has the file in its page cache now; a client rewrites part of it and
    // grows it: the owner reads the new bytes and `stat` there gives the new size.
    let patch = vec![0xA5u8; 10_000];
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(mnt(3).join("from2"))
            .unwrap();
        f.seek(SeekFrom::Start(4096 * 30)).unwrap();
        f.write_all(&patch).unwrap();
        f.seek(SeekFrom::Start(data.len() as u64)).unwrap();
        f.write_all(b"tail").unwrap();
    }
    let mut want = data.clone();
    want[4096 * 30..4096 * 30 + patch.len()].copy_from_slice(&patch);
    want.extend_from_slice(b"tail");
    for k in [1, 2] {
        assert_eq!(
            std::fs::metadata(mnt(k).join("from2")).unwrap().len(),
            want.len() as u64,
            "node {k} sees the size node 3 wrote"
        );
        assert!(
            std::fs::read(mnt(k).join("from2")).unwrap() == want,
            "node {k} reads what node 3 rewrote"
        );
    }

    // Names: the owner has looked `name` up (its kernel caches the entry for a minute);
    // a client renames it away and removes the other file; the owner sees both at once.
    std::fs::write(mnt(1).join("name"), b"made on the owner").unwrap();
    assert!((1..=3).all(|k| mnt(k).join("name").exists()));
    std::fs::create_dir(mnt(2).join("dir")).unwrap();
    std::fs::rename(mnt(2).join("name"), mnt(2).join("dir/renamed")).unwrap();
    assert!(
        !mnt(1).join("name").exists(),
        "the owner still sees the old name"
    );
    assert_eq!(
        std::fs::read(mnt(1).join("dir/renamed")).unwrap(),
        b"made on the owner"
    );
    assert!(!mnt(3).join("name").exists());
    std::fs::remove_file(mnt(3).join("dir/renamed")).unwrap();
    assert!(!mnt(1).join("dir/renamed").exists());
    let listing = |k: u32| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(mnt(k))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(listing(1), listing(2));
    assert_eq!(listing(2), listing(3));

    locks_and_appends_across_nodes(&mnt);
    reads_see_every_completed_write_across_nodes(&mnt, 2);
    // Written on the node that serves the file's metadata, which gathers small writes of
    // the files it serves while no other node holds anything of them.
    reads_see_every_completed_write_across_nodes(&mnt, 1);
    for (writer, append) in [(1, false), (2, false), (1, true), (2, true)] {
        small_writes_are_seen_by_stat_and_reads_elsewhere(&mnt, writer, append);
    }
    stat_and_names_follow_other_nodes_at_once(&mnt);
    creates_in_one_directory_from_every_node(&c, &mnt);

    // Administration that only the file system manager runs is sent to it from any node,
    // through the cluster's remote shell, and answered as there.
    let df = tessera(&c, 2, &["df", "s1"]);
    let said = String::from_utf8_lossy(&df.stderr).into_owned();
    let table = String::from_utf8_lossy(&df.stdout).into_owned();
    assert!(df.status.success(), "{said}");
    assert!(
        said.contains("node node1 is the file system manager of s1"),
        "{said}"
    );
    assert!(
        table.contains("(pool total)") && table.contains("Number of used inodes"),
        "{table}"
    );

    // The owner unmounts under its clients: one of them takes the file system manager's
    // role over (the log is clean: nothing to replay), the others follow it, nothing
    // written is lost, and the old owner mounts again as a client.
    let before = std::fs::read(mnt(2).join("from2")).unwrap();
    tessera_ok(&c, 1, &["umount", "s1"]);
    let attrs = tessera_ok(&c, 3, &["fs", "ls", "s1", "-Y"]);
    let new_manager = if attrs.contains(":fileSystemManager:node2:") {
        2
    } else {
        assert!(attrs.contains(":fileSystemManager:node3:"), "{attrs}");
        3
    };
    let other = 5 - new_manager;
    std::fs::write(mnt(other).join("after-handover"), b"written on a client").unwrap();
    assert_eq!(
        std::fs::read(mnt(new_manager).join("after-handover")).unwrap(),
        b"written on a client"
    );
    assert_eq!(std::fs::read(mnt(other).join("from2")).unwrap(), before);
    let df = tessera(&c, other, &["df", "s1"]);
    assert!(
        df.status.success()
            && String::from_utf8_lossy(&df.stderr).contains(&format!(
                "node node{new_manager} is the file system manager of s1"
            )),
        "{df:?}"
    );
    tessera_ok(&c, 1, &["mount", "s1"]);
    assert_eq!(
        std::fs::read(mnt(1).join("after-handover")).unwrap(),
        b"written on a client"
    );
    let listed = tessera_ok(&c, 2, &["mount", "ls", "s1", "-L"]);
    assert!(
        listed.contains("File system s1 is mounted on 3 nodes:")
            && listed.matches("client").count() == 2,
        "{listed}"
    );

    // The new manager (it took the file system over, so it serves it besides mounting it)
    // stops its daemon [mmshutdown]: it hands the role to another node before it goes, so
    // the table names that one as soon as the shutdown returns, with no expel to wait
    // for; started again, it mounts s1 (-A yes) as a client.
    let k = new_manager.to_string();
    tessera_ok(&c, new_manager, &["shutdown"]);
    let attrs = tessera_ok(&c, other, &["fs", "ls", "s1", "-Y"]);
    let successor = [1, other]
        .into_iter()
        .find(|n| attrs.contains(&format!(":fileSystemManager:node{n}:")))
        .unwrap_or_else(|| panic!("no manager named right after the shutdown:\n{attrs}"));
    let bystander = 1 + other - successor;
    std::fs::write(mnt(bystander).join("after-shutdown"), b"written meanwhile").unwrap();
    assert_eq!(
        std::fs::read(mnt(successor).join("after-shutdown")).unwrap(),
        b"written meanwhile"
    );
    assert_eq!(std::fs::read(mnt(bystander).join("from2")).unwrap(), before);
    c.ok(&["start", &k]);
    wait_for("the restarted node mounting s1", SETTLE, || {
        std::fs::read(mnt(new_manager).join("after-shutdown")).is_ok()
    });

    // One command unmounts it everywhere [mmumount -a]: the clients first, the owner last.
    tessera_ok(&c, 3, &["umount", "s1", "-a"]);
    let listed = tessera_ok(&c, 3, &["mount", "ls", "s1"]);
    assert!(
        listed.contains("File system s1 is not mounted."),
        "{listed}"
    );
    let fsck = tessera_ok(&c, 1, &["fsck", "s1", "-n"]);
    assert!(fsck.contains(" 0 problems found"), "{fsck}");
    tessera_ok(&c, 1, &["shutdown", "-a"]);
}

/// Free KiB in full blocks of NSD `nsd` of file system `fs`, as `df` on node `k` says.
fn free_kb(c: &Cluster, k: u32, fs: &str, nsd: &str) -> u64 {
    let df = tessera_ok(c, k, &["df", fs]);
    let row = df
        .lines()
        .find(|l| l.split_whitespace().next() == Some(nsd))
        .unwrap_or_else(|| panic!("no row for {nsd}:\n{df}"));
    row.split_whitespace()
        .nth(5)
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("free KiB of {nsd}:\n{df}"))
}

/// Writes `mib` MiB of bytes seeded by `seed` to `path`, fsynced; returns them.
fn write_mib(path: &std::path::Path, mib: usize, seed: u32) -> Vec<u8> {
    use std::io::Write;
    let data: Vec<u8> = (0..(mib << 20) as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 24) as u8)
        .collect();
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    data
}

/// `disk add` on a file system mounted on three nodes whose two non-manager nodes own
/// slots with allocation regions (refused before: the slots' regions reach onto every
/// disk), typed on a node that is not the manager: the manager adds the disk and tells
/// the other nodes, whose slot owners then write their own files onto it (df shows its
/// free space fall while only they write) and stop when it is suspended; a balancing
/// restripe, `policy apply`, emptying the disk (`restripe -m`) and deleting it cover their
/// files and pages too; every node reads every file, and after an unmount everywhere fsck
/// is clean.
#[test]
fn a_disk_added_under_three_mounts_is_used_by_every_node() {
    if !netns_usable() {
        return;
    }
    let c = up(3, &["--drives", "1", "--size", "512M"]);
    let all = [1, 2, 3];
    assert!(all_in_state(&c, 1, &all, "active"), "{:?}", states(&c, 1));
    // 64 KiB blocks: allocation regions of 127 MiB, so that the manager and both other
    // nodes have one each on the 512 MiB drive.
    let mnt = shared_fs_with_blocks(&c, "g1", 1, &all, "64K");
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for k in [2, 3] {
        let dir = format!("d{k}");
        std::fs::create_dir(mnt(k).join(&dir)).unwrap();
        let name = format!("{dir}/before");
        files.push((name.clone(), write_mib(&mnt(k).join(&name), 40, k)));
    }
    let stanza = c.nsd_stanza("g1b", "node2-d1.img", 2);
    let stanza = stanza.as_str();
    tessera_ok(&c, 1, &["nsd", "create", "-F", stanza]);
    let added = tessera(&c, 3, &["disk", "add", "g1", "-F", stanza]);
    let said = String::from_utf8_lossy(&added.stderr).into_owned();
    assert!(added.status.success(), "{said}");
    assert!(!said.contains("cannot use the new disks"), "{said}");
    let free_before = free_kb(&c, 2, "g1", "g1b");
    // Only the slot owners write: what the new disk loses is theirs.
    for round in 0..3 {
        for k in [2, 3] {
            let name = format!("d{k}/after{round}");
            files.push((
                name.clone(),
                write_mib(&mnt(k).join(&name), 24, 10 * round + k),
            ));
        }
    }
    let free_after = free_kb(&c, 2, "g1", "g1b");
    assert!(
        free_after + 40 * 1024 < free_before,
        "the slot owners wrote {} MiB, {} KiB of it on the added disk",
        6 * 24,
        free_before - free_after.min(free_before)
    );
    // Suspended [mmchdisk suspend], typed on a client node: the slot owners stop
    // allocating on it too.
    tessera_ok(&c, 2, &["disk", "change", "g1", "suspend", "-d", "g1b"]);
    for k in [2, 3] {
        let name = format!("d{k}/suspended");
        files.push((name.clone(), write_mib(&mnt(k).join(&name), 24, 100 + k)));
    }
    // 48 MiB written; a metadata page or two moving is not data.
    let free_suspended = free_kb(&c, 3, "g1", "g1b");
    assert!(
        free_suspended + 2048 >= free_after,
        "{} KiB allocated on the suspended disk",
        free_after - free_suspended
    );
    tessera_ok(&c, 3, &["disk", "change", "g1", "resume", "-d", "g1b"]);
    // A balancing restripe [mmrestripefs -b] from a client node looks at the slot owners'
    // files too (their owners move them): every block written is scanned.
    let said = tessera_ok(&c, 2, &["restripe", "g1", "-b"]);
    let scanned: u64 = said
        .split(" data blocks")
        .next()
        .and_then(|head| head.rsplit(" of ").next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no block count in: {said}"));
    let written_blocks = files.iter().map(|(_, d)| d.len() as u64).sum::<u64>() / (64 << 10);
    assert!(scanned >= written_blocks, "{said}");
    // policy apply [mmapplypolicy] from the other client node lists the slot owners'
    // files (each asked of its owner).
    let rules = c.base.join("g1-list.policy");
    std::fs::write(
        &rules,
        "RULE EXTERNAL LIST 'ours' EXEC ''\nRULE 'l' LIST 'ours' WHERE NAME LIKE 'after%'\n",
    )
    .unwrap();
    let listed = tessera_ok(
        &c,
        3,
        &["policy", "apply", "g1", "-P", rules.to_str().unwrap()],
    );
    assert!(listed.contains("LIST 'ours': 6 files"), "{listed}");
    // Emptied [mmchdisk empty, mmrestripefs -m] from a client node: the slot owners move
    // their own blocks and metadata pages off it too; it is as free as when it was added.
    // Room first: each slot owner's files must fit its allocation region on the other
    // disk (127 MiB) or a wholly free one the manager gives it.
    files.retain(|(name, _)| {
        let gone = name.ends_with("/suspended") || name.ends_with("/after2");
        if gone {
            std::fs::remove_file(mnt(2).join(name)).unwrap();
        }
        !gone
    });
    tessera_ok(&c, 3, &["disk", "change", "g1", "empty", "-d", "g1b"]);
    tessera_ok(&c, 3, &["restripe", "g1", "-m"]);
    let free_emptied = free_kb(&c, 2, "g1", "g1b");
    assert!(
        free_emptied >= free_before,
        "{} KiB left on the emptied disk:\n{}\n{}",
        free_before - free_emptied,
        tessera_ok(&c, 2, &["df", "g1"]),
        tessera_ok(&c, 1, &["mount", "ls", "g1", "-L"])
    );
    // Deleted [mmdeldisk], typed on the other client node: every slot owner lets go of it,
    // the descriptor drops it, its NSD is free again.
    tessera_ok(&c, 2, &["disk", "delete", "g1", "g1b"]);
    let df = tessera_ok(&c, 3, &["df", "g1"]);
    assert!(!df.contains("g1b"), "{df}");
    let nsds = tessera_ok(&c, 1, &["nsd", "ls"]);
    let row = nsds.lines().find(|l| l.contains("g1b")).unwrap_or_default();
    assert!(row.contains("(free disk)"), "{nsds}");
    for (name, data) in &files {
        for k in all {
            assert!(
                std::fs::read(mnt(k).join(name)).unwrap() == *data,
                "node {k} reads {name}"
            );
        }
    }
    tessera_ok(&c, 2, &["umount", "g1", "-a"]);
    let fsck = tessera_ok(&c, 1, &["fsck", "g1", "-n"]);
    assert!(fsck.contains(" 0 problems found"), "{fsck}");
    tessera_ok(&c, 1, &["shutdown", "-a"]);
}

/// Strict coherence under concurrency: a writer on node 2 overwrites random ranges of a
/// file that spans several blocks (random offsets and sizes, across block boundaries),
/// each 8-byte word stamped with the write's number and its own index; readers on node 1
/// (the owner, whose kernel caches pages) and node 3 (a client) read random ranges at the
/// same time. Every word a reader gets must be whole (its own index), no older than the
/// last write covering it that had returned before the read started, and no newer than
/// the last write started before the read ended.
fn reads_see_every_completed_write_across_nodes(mnt: &impl Fn(u32) -> PathBuf, writer: u32) {
    use rand::{Rng, SeedableRng};
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const WORDS: usize = (9 << 20) / 8;
    let word = |version: u64, index: usize| (version << 40 | index as u64).to_le_bytes();
    let initial: Vec<u8> = (0..WORDS).flat_map(|i| word(0, i)).collect();
    let name = format!("coherent{writer}");
    std::fs::write(mnt(1).join(&name), &initial).unwrap();
    // Per word, the number of the last write covering it that has returned.
    let done = parking_lot::Mutex::new(vec![0u32; WORDS]);
    let started = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for k in (1..=3u32).filter(|k| *k != writer) {
            let (done, started, stop, reads) = (&done, &started, &stop, &reads);
            let path = mnt(k).join(&name);
            scope.spawn(move || {
                let f = std::fs::File::open(path).unwrap();
                let mut rng = rand::rngs::StdRng::seed_from_u64(u64::from(k));
                while !stop.load(Ordering::Acquire) {
                    let first = rng.gen_range(0..WORDS);
                    let count = rng.gen_range(1..=(WORDS - first).min(80_000));
                    let floor: Vec<u32> = done.lock()[first..first + count].to_vec();
                    let mut buf = vec![0u8; count * 8];
                    f.read_exact_at(&mut buf, first as u64 * 8).unwrap();
                    let ceiling = started.load(Ordering::Acquire);
                    for (i, w) in buf.chunks(8).enumerate() {
                        let v = u64::from_le_bytes(w.try_into().unwrap());
                        let (version, index) = (v >> 40, (v & ((1 << 40) - 1)) as usize);
                        assert_eq!(index, first + i, "node {k}: a torn or misplaced word");
                        assert!(
                            version >= u64::from(floor[i]) && version <= ceiling,
                            "node {k}: word {} has write {version}; writes {} to {ceiling} \
                             could be there",
                            first + i,
                            floor[i]
                        );
                    }
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        // The readers stop when the writer does, also when it fails (else the scope
        // waited for them for ever).
        struct StopReaders<'a>(&'a AtomicBool);
        impl Drop for StopReaders<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        let _stop_readers = StopReaders(&stop);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(mnt(writer).join(&name))
            .unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(u64::from(writer));
        let until = Instant::now() + Duration::from_secs(6);
        let mut version = 0u32;
        while Instant::now() < until {
            version += 1;
            let first = rng.gen_range(0..WORDS);
            let count = rng.gen_range(1..=(WORDS - first).min(40_000));
            let bytes: Vec<u8> = (first..first + count)
                .flat_map(|i| word(u64::from(version), i))
                .collect();
            started.store(u64::from(version), Ordering::Release);
            f.write_all_at(&bytes, first as u64 * 8).unwrap();
            done.lock()[first..first + count].fill(version);
        }
        stop.store(true, Ordering::Release);
        eprintln!(
            "coherence: {version} writes, {} reads checked",
            reads.load(Ordering::Relaxed)
        );
        assert!(version > 20 && reads.load(Ordering::Relaxed) > 20);
    });
}

/// A log written in small pieces on node `writer` (with `append`, opened O_APPEND), in the
/// root directory node 1 serves: node 1 gathers them as the file's owner, another node
/// under the file's kept data token. After each 40 pieces, `stat` and a read on the two
/// other nodes show all of it (their first look takes the writer's gathered bytes to the
/// disks).
fn small_writes_are_seen_by_stat_and_reads_elsewhere(
    mnt: &impl Fn(u32) -> PathBuf,
    writer: u32,
    append: bool,
) {
    use std::io::Write;
    let name = format!("small{writer}-{append}.log");
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .open(mnt(writer).join(&name))
        .unwrap();
    let mut want = Vec::new();
    for i in 0..200usize {
        let line = format!("entry {i:04} {}\n", "w".repeat(i % 90));
        log.write_all(line.as_bytes()).unwrap();
        want.extend_from_slice(line.as_bytes());
        if i % 40 == 39 {
            for k in (1..=3u32).filter(|k| *k != writer) {
                let path = mnt(k).join(&name);
                let len = std::fs::metadata(&path).unwrap().len();
                assert_eq!(len, want.len() as u64, "node {k}: size after piece {i}");
                assert!(
                    std::fs::read(&path).unwrap() == want,
                    "node {k}: after piece {i}"
                );
            }
            // Nobody else asked for a while: the writer gathers again.
            std::thread::sleep(Duration::from_millis(1100));
        }
    }
    log.sync_all().unwrap();
    drop(log);
    std::fs::remove_file(mnt(3).join(&name)).unwrap();
}

/// What each node's kernel keeps under read tokens (names, attributes) follows the other
/// nodes' changes at once: after a change returned on one node, `stat`, lookups and
/// listings on every other node show it, though each of them looked at the old state
/// just before (so their kernels held it).
fn stat_and_names_follow_other_nodes_at_once(mnt: &impl Fn(u32) -> PathBuf) {
    use std::os::unix::fs::MetadataExt;
    std::fs::create_dir(mnt(1).join("follow")).unwrap();
    let file = |k: u32| mnt(k).join("follow/f");
    std::fs::write(file(2), b"").unwrap();
    for step in 1..=15u32 {
        let (writer, others) = match step % 3 {
            0 => (1, [2, 3]),
            1 => (2, [1, 3]),
            _ => (3, [1, 2]),
        };
        // Quiet for longer than an owner withholds a just-changed inode's token, then
        // looked at: the kernels hold the entries and the attributes.
        std::thread::sleep(Duration::from_millis(300));
        for k in others {
            assert!(file(k).exists() && mnt(k).join("follow").exists());
            assert!(
                mnt(k)
                    .join("follow")
                    .join(format!("n{}", step - 1))
                    .exists()
                    || step == 1
            );
        }
        let size = u64::from(step) * 1000;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(file(writer))
            .unwrap();
        f.set_len(size).unwrap();
        drop(f);
        std::fs::set_permissions(
            file(writer),
            std::os::unix::fs::PermissionsExt::from_mode(0o600 + step % 64),
        )
        .unwrap();
        // One file whose name moves: a name a kernel kept would still lead to it.
        let name = format!("n{step}");
        match step {
            1 => std::fs::write(mnt(writer).join("follow").join(&name), b"x").unwrap(),
            _ => std::fs::rename(
                mnt(writer).join(format!("follow/n{}", step - 1)),
                mnt(writer).join("follow").join(&name),
            )
            .unwrap(),
        }
        for k in others {
            let m = std::fs::metadata(file(k)).unwrap();
            assert_eq!(m.len(), size, "node {k}: size after node {writer} set it");
            assert_eq!(m.mode() & 0o777, 0o600 + step % 64, "node {k}: mode");
            assert!(
                mnt(k).join("follow").join(&name).exists(),
                "node {k}: {name} made on node {writer}"
            );
            if step > 1 {
                assert!(
                    !mnt(k).join(format!("follow/n{}", step - 1)).exists(),
                    "node {k}: n{} renamed on node {writer}",
                    step - 1
                );
            }
        }
    }
    for k in 1..=3 {
        let mut names: Vec<String> = std::fs::read_dir(mnt(k).join("follow"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["f", "n15"], "node {k}");
    }
    std::fs::remove_file(mnt(3).join("follow/f")).unwrap();
    std::fs::remove_file(mnt(1).join("follow/n15")).unwrap();
    std::fs::remove_dir(mnt(2).join("follow")).unwrap();
    assert!((1..=3).all(|k| !mnt(k).join("follow").exists()));
}

/// mdtest's hard pattern: every node creates, lists and removes files in one directory at
/// once, after each has looked into it (so each holds its names and its kernel keeps
/// them). Each create revokes the directory from the others while their own creates in it
/// hold the directory's lock in their kernels: a revocation that waited for that lock
/// would wait for a create that waits for the revocation. Nothing is lost, and no node
/// logs that its kernel was slow to drop what another node changed.
fn creates_in_one_directory_from_every_node(c: &Cluster, mnt: &(impl Fn(u32) -> PathBuf + Sync)) {
    const FILES: u32 = 150;
    std::fs::create_dir(mnt(1).join("shared")).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    for k in 1..=3u32 {
        assert_eq!(std::fs::read_dir(mnt(k).join("shared")).unwrap().count(), 0);
    }
    std::thread::scope(|scope| {
        for k in 1..=3u32 {
            scope.spawn(move || {
                for i in 0..FILES {
                    let path = mnt(k).join(format!("shared/f.{k}.{i}"));
                    std::fs::write(&path, format!("{k}.{i}")).unwrap();
                    assert!(path.exists());
                }
            });
        }
    });
    for k in 1..=3u32 {
        let count = std::fs::read_dir(mnt(k).join("shared")).unwrap().count();
        assert_eq!(count, 3 * FILES as usize, "node {k} lists every file");
    }
    std::thread::scope(|scope| {
        for k in 1..=3u32 {
            scope.spawn(move || {
                // Each node removes another node's files.
                let of = k % 3 + 1;
                for i in 0..FILES {
                    let path = mnt(k).join(format!("shared/f.{of}.{i}"));
                    assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("{of}.{i}"));
                    std::fs::remove_file(&path).unwrap();
                }
            });
        }
    });
    for k in 1..=3u32 {
        assert_eq!(std::fs::read_dir(mnt(k).join("shared")).unwrap().count(), 0);
        let log = std::fs::read_to_string(c.base.join(format!("node{k}/home/log/daemon.log")))
            .unwrap_or_default();
        assert!(
            !log.contains("the kernel took more than"),
            "node {k} waited for its kernel to drop names: {}",
            log.lines()
                .filter(|l| l.contains("the kernel took more than"))
                .count()
        );
    }
    std::fs::remove_dir(mnt(2).join("shared")).unwrap();
}

/// A process holding `lock` ("lockf" or "flock", exclusive) on `path`, until its stdin
/// closes; returns once it holds the lock.
fn lock_holder(path: &std::path::Path, lock: &str) -> std::process::Child {
    use std::io::BufRead;
    let script = format!(
        "import fcntl, sys\nf = open(sys.argv[1], 'r+')\nfcntl.{lock}(f, fcntl.LOCK_EX)\n\
         print('locked', flush=True)\nsys.stdin.read()\n"
    );
    let mut child = Command::new("python3")
        .args(["-c", &script, path.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(
        line.trim(),
        "locked",
        "the lock holder on {path:?} did not lock"
    );
    child
}

/// Whether `lock` ("lockf" or "flock") of `path` is granted at once to a new process.
fn lock_free(path: &std::path::Path, lock: &str) -> bool {
    let script = format!(
        "import fcntl, sys\nf = open(sys.argv[1], 'r+')\n\
         try:\n    fcntl.{lock}(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n\
         except BlockingIOError:\n    sys.exit(3)\n"
    );
    let status = Command::new("python3")
        .args(["-c", &script, path.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(matches!(status.code(), Some(0 | 3)), "{status}");
    status.code() == Some(0)
}

/// `fcntl` and `flock` locks exclude each other's holders across nodes (a lock of one
/// node's process keeps another node's from it, a waiter gets it when the holder dies, and
/// a waiter killed while waiting goes away rather than hanging); O_APPEND writes from
/// every node at once all land, whole, none over another.
fn locks_and_appends_across_nodes(mnt: &impl Fn(u32) -> PathBuf) {
    std::fs::write(mnt(1).join("locked"), b"x").unwrap();
    for lock in ["lockf", "flock"] {
        let mut holder = lock_holder(&mnt(2).join("locked"), lock);
        for k in [1, 3] {
            assert!(
                !lock_free(&mnt(k).join("locked"), lock),
                "{lock}: node {k} got a lock node 2 holds"
            );
        }
        // A waiter on node 3, and one on node 1 that is killed while it waits.
        let wait = format!(
            "import fcntl, sys\nf = open(sys.argv[1], 'r+')\nfcntl.{lock}(f, fcntl.LOCK_EX)\n"
        );
        let waiter = |k: u32| {
            Command::new("python3")
                .args(["-c", &wait, mnt(k).join("locked").to_str().unwrap()])
                .spawn()
                .unwrap()
        };
        let mut patient = waiter(3);
        let mut killed = waiter(1);
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            patient.try_wait().unwrap().is_none(),
            "{lock}: granted while held"
        );
        killed.kill().unwrap();
        let started = Instant::now();
        killed.wait().unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{lock}: a killed waiter took {:?} to go",
            started.elapsed()
        );
        // The holder exits (its close drops the lock); the waiter on node 3 gets it.
        drop(holder.stdin.take());
        holder.wait().unwrap();
        let started = Instant::now();
        let status = patient.wait().unwrap();
        assert!(status.success(), "{lock}: the waiter failed: {status}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{lock}: {:?}",
            started.elapsed()
        );
        assert!(
            lock_free(&mnt(2).join("locked"), lock),
            "{lock}: left locked"
        );
    }

    // Appends: 3 nodes x 100 lines of 64 bytes, each one write(2) of an O_APPEND open.
    let log = mnt(1).join("appended");
    std::fs::write(&log, b"").unwrap();
    let appenders: Vec<_> = [1u32, 2, 3]
        .into_iter()
        .map(|k| {
            let path = mnt(k).join("appended");
            std::thread::spawn(move || {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
                for i in 0..100 {
                    let line = format!("{:<63}\n", format!("node{k} line {i}"));
                    f.write_all(line.as_bytes()).unwrap();
                }
            })
        })
        .collect();
    for a in appenders {
        a.join().unwrap();
    }
    for k in [1, 2, 3] {
        let text = std::fs::read_to_string(mnt(k).join("appended")).unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 300, "node {k}: appends lost or torn:\n{text}");
        assert!(
            lines.iter().all(|l| l.len() == 63 && l.starts_with("node")),
            "{text}"
        );
        lines.sort();
        lines.dedup();
        assert_eq!(lines.len(), 300, "node {k}: an append landed twice");
    }
}

/// The owner of a file system mounted on three nodes dies: once the cluster has expelled
/// it, a client takes the file system over by itself (replaying the dead owner's log) and
/// both clients carry on: a read that was waiting returns, what was fsynced before the
/// kill is there, and new writes on either client are seen by the other.
#[test]
fn the_clients_of_a_dead_owner_carry_on_after_a_takeover() {
    if !netns_usable() {
        return;
    }
    let c = up_with_drives(3);
    let all = [1, 2, 3];
    assert!(all_in_state(&c, 1, &all, "active"), "{:?}", states(&c, 1));
    let mnt = shared_fs(&c, "o1", 1, &all);
    let synced: Vec<u8> = (0..500_000u32).map(|i| (i % 249) as u8).collect();
    {
        use std::io::Write;
        let mut f = std::fs::File::create(mnt(2).join("synced")).unwrap();
        f.write_all(&synced).unwrap();
        f.sync_all().unwrap();
    }
    c.ok(&["kill", "1"]);
    let _ = std::process::Command::new("umount")
        .args(["-l", mnt(1).to_str().unwrap()])
        .status();
    // Node 3 reads at once: its request waits for the expel and the takeover, then
    // returns the fsynced bytes.
    let started = Instant::now();
    let read = std::fs::read(mnt(3).join("synced")).unwrap();
    let paused = started.elapsed();
    eprintln!("a read on node 3 waited {paused:?} for the takeover");
    assert!(read == synced, "the fsynced file after the takeover");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(mnt(3).join("after")).unwrap();
        f.write_all(b"written after the takeover").unwrap();
        f.sync_all().unwrap();
    }
    assert_eq!(
        std::fs::read(mnt(2).join("after")).unwrap(),
        b"written after the takeover"
    );
    let listed = tessera_ok(&c, 2, &["mount", "ls", "o1", "-Y"]);
    assert!(
        !listed.contains(":o1:node1:") && listed.contains(":manager"),
        "{listed}"
    );
    // Unmounted by the node that did not take over first, then by the one that did,
    // which then lets the file system go.
    let owner = if listed.contains(":o1:node2:") && listed.contains(":manager:") {
        let manager_line = listed.lines().find(|l| l.contains(":manager:")).unwrap();
        if manager_line.contains(":node2:") {
            2
        } else {
            3
        }
    } else {
        3
    };
    let other = if owner == 2 { 3 } else { 2 };
    // What only the file system manager runs reaches the node that took over, from any
    // node, and runs on the manager it took over (that node's own mount is a client).
    let df = tessera_ok(&c, other, &["df", "o1"]);
    assert!(df.contains("(total)"), "{df}");
    let check = tessera_ok(&c, other, &["restripe", "o1", "-c"]);
    assert!(
        check.contains(" data blocks with a damaged copy repaired") && !check.contains("changed"),
        "a restripe -c of a sound file system with nothing writing: {check}"
    );
    let stanza = c.nsd_stanza("o1b", "node2-d1.img", 2);
    let stanza = stanza.as_str();
    tessera_ok(&c, other, &["nsd", "create", "-F", stanza]);
    let added = tessera_ok(&c, other, &["disk", "add", "o1", "-F", stanza]);
    assert!(added.contains("o1b added to o1"), "{added}");
    let disks = tessera_ok(&c, owner, &["disk", "ls", "o1"]);
    assert!(disks.contains("o1b"), "{disks}");
    // The dead owner, started again, mounts the file system again by itself, as a client
    // of the node that took it over, and reads what was written meanwhile. (Its entry
    // among the clients is there from the takeover on, so the mount is awaited by
    // reading through it.)
    c.ok(&["start", "1"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read(mnt(1).join("after")).ok().as_deref()
        != Some(&b"written after the takeover"[..])
    {
        assert!(Instant::now() < deadline, "node 1 did not mount o1 again");
        std::thread::sleep(Duration::from_millis(500));
    }
    let listed = tessera_ok(&c, 2, &["mount", "ls", "o1", "-Y"]);
    assert!(
        listed
            .lines()
            .any(|l| l.contains(":o1:node1:") && l.contains(":client")),
        "{listed}"
    );
    tessera_ok(&c, 1, &["umount", "o1"]);
    tessera_ok(&c, other, &["umount", "o1"]);
    tessera_ok(&c, owner, &["umount", "o1"]);
    let listed = tessera_ok(&c, 2, &["mount", "ls", "o1"]);
    assert!(
        listed.contains("File system o1 is not mounted."),
        "{listed}"
    );
    let fsck = tessera_ok(&c, owner, &["fsck", "o1", "-n"]);
    assert!(fsck.contains(" 0 problems found"), "{fsck}");
    tessera_ok(&c, 2, &["shutdown", "-a"]);
}

/// Content of crash-loop file `name`: deterministic, and different per file.
/// Kill -9 of a node, again and again, under a workload that fsyncs on the other nodes:
/// sometimes a client dies, sometimes the owner of the file system (and a client takes it
/// over). See `common::crash_loop`.
#[test]
fn a_crash_loop_of_node_kills_under_fsyncing_writers_loses_nothing() {
    if !netns_usable() {
        return;
    }
    // 1 GiB, as the slots test's: on 256 MiB the recovery logs (64 MiB each, the
    // manager's and every owner slot's) take 192 MiB, and twenty rounds of files came
    // within a few megabytes of ENOSPC.
    let c = up(3, &["--drives", "1", "--size", "1G"]);
    let all = [1u32, 2, 3];
    assert!(all_in_state(&c, 1, &all, "active"), "{:?}", states(&c, 1));
    let mnt = shared_fs(&c, "l1", 1, &all);
    common::crash_loop::run(&c, "l1", &mnt, &|_, name| name.to_string());
}

/// The owner of a shared file system is cut off: the majority expels it and a client
/// takes the file system over. When the partition heals, the old owner's mount is stale
/// (a new incarnation, and another node owns the metadata): its writes are refused, so
/// there are never two owners, and mounting again makes it a client that sees what the
/// others wrote meanwhile.
#[test]
fn a_cut_off_owner_is_taken_over_and_its_mount_is_stale_after_the_heal() {
    if !netns_usable() {
        return;
    }
    let c = up_with_drives(3);
    let all = [1u32, 2, 3];
    assert!(all_in_state(&c, 1, &all, "active"), "{:?}", states(&c, 1));
    let mnt = shared_fs(&c, "c1", 2, &all);
    write_synced(&mnt(1), "before", 100_000).unwrap();
    c.ok(&["partition", "1"]);
    // Expelled: the majority no longer lists an incarnation for it.
    wait_for("the expel of the cut-off owner", SETTLE, || {
        states(&c, 2)
            .get("node1")
            .is_some_and(|(_, epoch)| epoch.is_empty())
    });
    // A client writes: its request finds the owner gone and takes the file system over.
    write_synced(&mnt(2), "during", 200_000).unwrap();
    let owner = owner_of(&c, 3, "c1").expect("an owner");
    assert_ne!(owner, 1, "the cut-off node still owns c1");
    // The cut-off node answers nothing from the metadata it owned (another node owns it
    // now): a clear EIO, not the absence of a file the others made.
    let looked = std::fs::metadata(mnt(1).join("during")).map(|_| ());
    assert_eq!(looked.unwrap_err().raw_os_error(), Some(libc::EIO));
    assert!(
        std::fs::read_dir(mnt(1)).is_err(),
        "the cut-off node listed c1"
    );
    c.ok(&["heal"]);
    wait_for("all active after the heal", SETTLE, || {
        all_in_state(&c, 2, &all, "active")
    });
    // The old owner's mount belongs to the incarnation that was expelled.
    assert!(
        write_synced(&mnt(1), "stale", 1000).is_err(),
        "the old owner wrote beside the new one"
    );
    let _ = tessera(&c, 1, &["umount", "c1"]);
    assert_eq!(
        owner_of(&c, 1, "c1"),
        Some(owner),
        "the stale umount changed the owner"
    );
    tessera_ok(&c, 1, &["mount", "c1", "-T", mnt(1).to_str().unwrap()]);
    for (name, len) in [("before", 100_000), ("during", 200_000)] {
        assert!(
            std::fs::read(mnt(1).join(name)).unwrap() == crash_loop_bytes(name, len),
            "{name} on the old owner, mounted again"
        );
    }
    for k in all.iter().copied().filter(|k| *k != owner) {
        tessera_ok(&c, k, &["umount", "c1"]);
    }
    tessera_ok(&c, owner, &["umount", "c1"]);
    let fsck = tessera_ok(&c, owner, &["fsck", "c1", "-n"]);
    assert!(fsck.contains(" 0 problems found"), "{fsck}");
    tessera_ok(&c, 2, &["shutdown", "-a"]);
}

/// A client cut off from the cluster keeps nothing the owner granted it: once its lease
/// has run out the owner changes what it held without it (after its expel), so neither its
/// daemon nor its kernel may answer from the old copies. Node 3 looks at a file and a name
/// (its kernel and daemon keep them), is cut off and expelled, the owner truncates the file
/// and renames the name; a `stat` on node 3 then fails or waits, and never shows the old
/// size or the old name; after the heal it shows the new ones or fails.
#[test]
fn a_cut_off_client_keeps_nothing_it_was_granted() {
    if !netns_usable() {
        return;
    }
    let c = up_with_drives(3);
    let all = [1u32, 2, 3];
    assert!(all_in_state(&c, 1, &all, "active"), "{:?}", states(&c, 1));
    let mnt = shared_fs(&c, "g1", 1, &all);
    std::fs::write(mnt(1).join("f"), vec![7u8; 5000]).unwrap();
    std::fs::write(mnt(1).join("g"), b"g").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..2 {
        assert_eq!(std::fs::metadata(mnt(3).join("f")).unwrap().len(), 5000);
        assert!(mnt(3).join("g").exists());
    }
    c.ok(&["partition", "3"]);
    wait_for("the expel of the cut-off client", SETTLE, || {
        states(&c, 1)
            .get("node3")
            .is_some_and(|(_, epoch)| epoch.is_empty())
    });
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(mnt(1).join("f"))
        .unwrap();
    f.set_len(10).unwrap();
    drop(f);
    std::fs::rename(mnt(1).join("g"), mnt(1).join("h")).unwrap();
    // Asked on node 3 while it is cut off: an answer can only come from what it kept.
    let (tx, rx) = std::sync::mpsc::channel();
    let (f3, g3) = (mnt(3).join("f"), mnt(3).join("g"));
    std::thread::spawn(move || {
        let _ = tx.send((std::fs::metadata(&f3).map(|m| m.len()), g3.exists()));
    });
    let during = rx.recv_timeout(Duration::from_secs(5));
    if let Ok((size, g_there)) = &during {
        assert!(
            !matches!(size, Ok(5000)) && !g_there,
            "node 3, cut off, answered from what it kept: size {size:?}, g there: {g_there}"
        );
    }
    c.ok(&["heal"]);
    wait_for("all active after the heal", SETTLE, || {
        all_in_state(&c, 1, &all, "active")
    });
    let (size, g_there) = match during {
        Ok(answer) => answer,
        Err(_) => rx
            .recv_timeout(Duration::from_secs(90))
            .expect("node 3's stat ends after the heal"),
    };
    assert!(
        !matches!(size, Ok(5000)) && !g_there,
        "node 3 after the heal: size {size:?}, g there: {g_there}"
    );
    let _ = tessera(&c, 3, &["umount", "g1"]);
    for k in [2u32, 1] {
        tessera_ok(&c, k, &["umount", "g1"]);
    }
    let fsck = tessera_ok(&c, 1, &["fsck", "g1", "-n"]);
    assert!(fsck.contains(" 0 problems found"), "{fsck}");
    tessera_ok(&c, 1, &["shutdown", "-a"]);
}

/// Restarts node `k`'s daemon with `env` (`NAME=value`, one of the daemon's test switches)
/// and waits until every node of `all` is active again.
fn restart_with(c: &Cluster, k: u32, env: &str, all: &[u32]) {
    tessera_ok(c, k, &["shutdown"]);
    let node = k.to_string();
    c.ok(&["run", &node, "--", "env", env, "tessera", "startup"]);
    wait_for("the node active again", SETTLE, || {
        all_in_state(c, 1, all, "active")
    });
}

/// A node that is alive (it renews its lease) but never answers a revocation must not hang
/// the cluster: the owner waits twice the lease for it, has the cluster manager expel it,
/// waits until its lease has run out, and the change that needed the revocation returns.
/// Node 2 runs a daemon that leaves revocations unanswered
/// (`TESSERA_TEST_STALL_REVOCATIONS=1`) and holds the attributes of a file; node 1 changes
/// them.
#[test]
fn a_node_that_never_answers_a_revocation_is_expelled_not_waited_for() {
    if !netns_usable() {
        return;
    }
    // Node 2 as a plain client, holding nothing before it looks at the file: as the owner
    // of a slot its mount holds the root's names at once, and the first write in the root
    // would be the revocation it leaves unanswered.
    let c = Cluster::new();
    let config = format!("{TEST_TIMINGS},metadataSlots=no");
    c.ok(&[
        "up", "3", "--drives", "1", "--size", "256M", "--config", &config,
    ]);
    let all = [1, 2, 3];
    assert!(all_in_state(&c, 1, &all, "active"), "{:?}", states(&c, 1));
    restart_with(&c, 2, "TESSERA_TEST_STALL_REVOCATIONS=1", &all);
    // A node restarted a moment ago applies the configuration log a little after it is
    // active again: its mount of a file system created just now catches up first.
    let mnt = shared_fs(&c, "h1", 1, &[1, 2]);
    std::fs::write(mnt(1).join("f"), b"held by node 2").unwrap();
    // Node 2 looks the file up and reads its attributes: it holds them now.
    for _ in 0..2 {
        assert_eq!(std::fs::metadata(mnt(2).join("f")).unwrap().len(), 14);
    }
    let epoch_before = states(&c, 1)["node2"].1.clone();

    use std::os::unix::fs::PermissionsExt;
    let started = Instant::now();
    std::fs::set_permissions(mnt(1).join("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let took = started.elapsed();
    eprintln!("chmod on the owner returned after {took:?}");
    // Twice the lease (3 s) of waiting, the expel, the lease running out (3 s) and
    // leaseRecoveryWait (1 s).
    assert!(
        took >= Duration::from_secs(5),
        "the change did not wait for the revocation ({took:?}): nothing was held?"
    );
    assert!(took < SETTLE, "the owner waited {took:?} for a hung node");
    let log = std::fs::read_to_string(c.base.join("node1/home/log/daemon.log")).unwrap_or_default();
    assert!(
        log.contains("asking the cluster manager to expel it"),
        "node 1's log does not say it had node 2 expelled"
    );
    // The owner serves on, and node 2 comes back as a new incarnation.
    std::fs::write(mnt(1).join("after"), b"the owner carries on").unwrap();
    assert_eq!(
        std::fs::read(mnt(1).join("after")).unwrap(),
        b"the owner carries on"
    );
    wait_for("node 2 rejoins as a new incarnation", SETTLE, || {
        states(&c, 1)
            .get("node2")
            .is_some_and(|(s, epoch)| s == "active" && *epoch != epoch_before)
    });
    let _ = tessera(&c, 2, &["umount", "h1"]);
    tessera_ok(&c, 1, &["umount", "h1"]);
    tessera_ok(&c, 1, &["shutdown", "-a"]);
}

/// `umount -a` reaches a node whose client mount is still being made when it runs (a node
/// mounting at its start, or under `mount -N` from elsewhere): that mount is not listed by
/// `mount ls`, and `umount -a` used to skip it, leaving it mounted once it was made. Node 2
/// runs a daemon that holds each client mount in that state for 4 s
/// (`TESSERA_TEST_SLOW_CLIENT_MOUNT_MS`).
#[test]
fn umount_all_reaches_a_node_whose_mount_is_still_being_made() {
    if !netns_usable() {
        return;
    }
    let c = Cluster::new();
    c.ok(&[
        "up",
        "2",
        "--drives",
        "1",
        "--size",
        "256M",
        "--config",
        TEST_TIMINGS,
    ]);
    let all = [1, 2];
    assert!(all_in_state(&c, 1, &all, "active"), "{:?}", states(&c, 1));
    restart_with(&c, 2, "TESSERA_TEST_SLOW_CLIENT_MOUNT_MS=4000", &all);
    let mnt = shared_fs(&c, "u1", 1, &[1]);
    std::fs::write(mnt(1).join("f"), b"written before the unmount").unwrap();
    let mounting = c
        .command(&["run", "2", "--", "tessera", "mount", "u1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log2 = c.base.join("node2/home/log/daemon.log");
    wait_for("node 2's mount recorded as being made", SETTLE, || {
        std::fs::read_to_string(&log2)
            .unwrap_or_default()
            .contains("client mount recorded as being made")
    });
    let listed = tessera_ok(&c, 1, &["mount", "ls", "u1"]);
    assert!(listed.contains("mounted on 1 node"), "{listed}");
    let started = Instant::now();
    let out = tessera_ok(&c, 1, &["umount", "u1", "-a"]);
    eprintln!("umount -a took {:?}: {out}", started.elapsed());
    let mounted = mounting.wait_with_output().unwrap();
    assert!(
        mounted.status.success(),
        "node 2's mount: {}",
        String::from_utf8_lossy(&mounted.stderr)
    );
    let listed = tessera_ok(&c, 1, &["mount", "ls", "u1"]);
    assert!(listed.contains("is not mounted"), "{listed}");
    let proc_mounts = c.ok(&["run", "2", "--", "cat", "/proc/self/mounts"]);
    assert!(
        !proc_mounts.contains(mnt(2).to_str().unwrap()),
        "u1 is still mounted on node 2 after umount -a: {proc_mounts}"
    );
    let fsck = tessera_ok(&c, 1, &["fsck", "u1", "-n"]);
    assert!(fsck.contains(" 0 problems found"), "{fsck}");
    tessera_ok(&c, 1, &["shutdown", "-a"]);
}
