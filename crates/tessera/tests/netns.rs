//! `scripts/cluster-netns.sh`, the multi-node-on-one-machine script users try, driven as
//! users drive it: namespaces and addresses, TCP between nodes, partitions made and healed,
//! the remote shell, drive stanzas, a node daemon killed and restarted, FUSE mounts seen
//! from every node, and a `down` that leaves nothing behind, twice.
//!
//! Every test uses its own name prefix, state directory and subnet, so tests (and a user's
//! own cluster) run side by side; a guard runs `down` even when a test fails. The tests
//! need root and `ip netns`; without them they say why and pass, except under CI=true,
//! where they fail, so CI never silently checks nothing.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::netns::{alive, netns_usable, Cluster};
use common::{fuse_usable, BIN};

/// The net namespace identity of `/run/netns/NAME`, as `readlink /proc/self/ns/net` shows it.
fn netns_id(name: &str) -> String {
    let meta = std::fs::metadata(Path::new("/run/netns").join(name)).expect("netns file");
    format!("net:[{}]", meta.ino())
}

#[test]
fn three_namespaces_talk_partition_and_heal() {
    if !netns_usable() {
        return;
    }
    let mut c = Cluster::new();
    c.ok(&["up", "3", "--drives", "2", "--size", "16M", "--no-cluster"]);
    let status = c.ok(&["status"]);
    for k in 1..=3 {
        let row = format!("node{k}  {}node{k}", c.prefix);
        assert!(status.contains(&row), "{row:?} missing:\n{status}");
        assert!(status.contains(&format!("{}/24", c.address(k))), "{status}");
    }
    // The nodes run the kernel's own congestion control, whatever the host's default is
    // (a host on BBR paced every NVMe/TCP transfer between them).
    let available = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .unwrap_or_default();
    if available.split_whitespace().any(|a| a == "cubic") {
        for k in 1..=3 {
            let out = Command::new("ip")
                .args(["netns", "exec", &format!("{}node{k}", c.prefix)])
                .args(["cat", "/proc/sys/net/ipv4/tcp_congestion_control"])
                .output()
                .expect("ip netns exec");
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                "cubic",
                "node{k}"
            );
        }
    }

    c.listen(1);
    c.listen(2);
    c.listen(3);
    assert!(c.connects_soon(1, 2) && c.connects_soon(1, 3) && c.connects_soon(3, 1));

    c.ok(&["partition", "3"]);
    assert!(c.ok(&["status"]).contains("(partitioned)"));
    assert!(
        c.connects_soon(1, 2) && c.connects_soon(2, 1),
        "the majority must still talk"
    );
    assert!(
        !c.connects(1, 3),
        "node 3 is partitioned but node 1 reaches it"
    );
    assert!(
        !c.connects(3, 2),
        "node 3 is partitioned but reaches node 2"
    );

    // A second partition replaces the first rather than adding to it.
    c.ok(&["partition", "2"]);
    let status = c.ok(&["status"]);
    assert_eq!(status.matches("(partitioned)").count(), 1, "{status}");
    assert!(status
        .lines()
        .any(|l| l.starts_with("node2 ") && l.ends_with("(partitioned)")));

    c.ok(&["heal"]);
    assert!(!c.ok(&["status"]).contains("(partitioned)"));
    assert!(
        c.connects_soon(1, 3) && c.connects_soon(3, 2),
        "heal did not restore node 3"
    );
}

#[test]
fn remote_shell_and_stanzas_name_the_right_node() {
    if !netns_usable() {
        return;
    }
    let c = Cluster::new();
    c.ok(&["up", "3", "--drives", "2", "--size", "16M", "--no-cluster"]);

    // The ssh shape: the words after the node are one command line for the node's shell.
    let out = c.ok(&[
        "rsh",
        "node2",
        "echo",
        "$TESSERA_NODE",
        "$TESSERA_HOME;",
        "readlink",
        "/proc/self/ns/net",
    ]);
    let home = c.base.join("node2/home");
    let expected = format!(
        "node2 {}\n{}\n",
        home.display(),
        netns_id(&format!("{}node2", c.prefix))
    );
    assert_eq!(out, expected);
    let by_address = c.ok(&["rsh", "-n", &c.address(3), "echo $TESSERA_NODE"]);
    assert_eq!(by_address, "node3\n");
    assert!(c.fails(&["rsh", "node9", "true"]).contains("node9"));

    let nsd = c.ok(&["stanza", "nsd"]);
    let lines: Vec<&str> = nsd.lines().collect();
    assert_eq!(lines.len(), 6, "one stanza per drive:\n{nsd}");
    for line in lines {
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("no {name}= in {line}"))
                .to_string()
        };
        assert!(line.starts_with("%nsd: "), "{line}");
        let device = PathBuf::from(field("device"));
        assert!(device.starts_with(c.base.join("drives")), "{line}");
        assert_eq!(std::fs::metadata(&device).expect("drive").len(), 16 << 20);
        let name = device.file_name().unwrap().to_str().unwrap().to_string();
        let node = name
            .strip_prefix("node")
            .unwrap()
            .split('-')
            .next()
            .unwrap();
        assert_eq!(field("failureGroup"), node, "{line}");
        assert_eq!(field("nsd"), name.trim_end_matches(".img").replace('-', ""));
    }
    let pdisk = c.ok(&["stanza", "pdisk"]);
    assert_eq!(pdisk.lines().count(), 6, "{pdisk}");
    assert!(pdisk.contains("enclosure=node3 slot=2"), "{pdisk}");

    c.ok(&["down"]);
    assert_eq!(
        c.leftovers(),
        Vec::<String>::new(),
        "down left these behind"
    );
    assert!(!c.base.exists(), "down left {}", c.base.display());
    c.ok(&["down"]);
}

#[test]
fn bad_requests_are_refused_and_change_nothing() {
    if !netns_usable() {
        return;
    }
    let c = Cluster::new();
    c.ok(&["down"]);
    assert!(c.fails(&["up", "0"]).contains("N must be"));
    assert!(c.fails(&["up", "2", "--drives", "2"]).contains("--size"));
    assert!(c
        .fails(&["up", "2", "--bogus"])
        .contains("unknown option '--bogus'"));
    assert!(c
        .fails(&["run", "1", "--", "true"])
        .contains("is the cluster up"));
    assert!(c.fails(&["stanza", "json"]).contains("stanza nsd|pdisk"));
    assert!(c.fails(&["frobnicate"]).contains("unknown command"));
    let multi_node = String::from_utf8_lossy(
        &Command::new(BIN)
            .args(["cluster", "create", "--help"])
            .output()
            .unwrap()
            .stdout,
    )
    .contains("-N");
    if !multi_node {
        let err = c.fails(&["up", "2"]);
        assert!(
            err.contains("does not support multi-node clusters yet"),
            "{err}"
        );
    }
    assert_eq!(c.leftovers(), Vec::<String>::new());
    assert!(!c.base.exists());

    c.ok(&["up", "2", "--no-cluster"]);
    assert!(c.fails(&["up", "2", "--no-cluster"]).contains("already up"));
    assert!(c.fails(&["kill", "1"]).contains("no running daemon"));
    assert!(c
        .fails(&["mountpoint", "1", "fs1"])
        .contains("no file system fs1"));

    // An `up` that fails half way (node 2's port name is taken) leaves node 1 built;
    // `down` removes it and the squatter of our name.
    c.ok(&["down"]);
    let squatter = format!("{}h2", c.prefix);
    let added = Command::new("ip")
        .args(["link", "add", &squatter, "type", "bridge"])
        .status();
    assert!(added.expect("ip link add").success());
    let err = c.fails(&["up", "3", "--no-cluster"]);
    assert!(err.contains("up failed"), "{err}");
    assert!(c.leftovers().contains(&format!("{}node1", c.prefix)));
    c.ok(&["down"]);
    assert_eq!(c.leftovers(), Vec::<String>::new());
    assert!(!c.base.exists());

    // A directory the script did not make is never deleted, whatever TSR_BASE says.
    std::fs::create_dir_all(c.base.join("precious")).unwrap();
    assert!(c.fails(&["down"]).contains("not made by this script"));
    assert!(c.base.join("precious").exists());
    std::fs::remove_dir_all(&c.base).unwrap();
}

#[test]
fn a_node_daemon_is_killed_restarted_and_its_mount_seen_everywhere() {
    if !netns_usable() || !fuse_usable() {
        return;
    }
    let c = Cluster::new();
    c.ok(&["up", "2", "--drives", "2", "--size", "64M", "--no-cluster"]);
    // A one-node cluster in node 1, until `up` creates the multi-node one.
    c.ok(&[
        "run", "1", "--", "tessera", "cluster", "create", "--name", "netns",
    ]);
    c.ok(&["start", "1"]);
    let pid_file = c.base.join("node1/home/daemon.pid");
    let pid = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .to_string();
    assert!(c
        .ok(&["status"])
        .contains(&format!("node1  {}node1", c.prefix)));
    assert!(
        c.ok(&["status"]).contains(&pid),
        "status does not show daemon {pid}"
    );

    let stanza = c.base.join("node1.stanza");
    let nsd = c.ok(&["stanza", "nsd"]);
    let mine: String = nsd
        .lines()
        .filter(|l| l.contains("nsd=node1"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&stanza, mine).unwrap();
    let stanza = stanza.to_str().unwrap();
    c.ok(&["run", "1", "--", "tessera", "nsd", "create", "-F", stanza]);
    c.ok(&[
        "run", "1", "--", "tessera", "fs", "create", "-F", stanza, "fs1", "-A", "no",
    ]);
    let mnt = c.base.join("node1/mnt/fs1");
    c.ok(&[
        "run",
        "1",
        "--",
        "tessera",
        "mount",
        "fs1",
        "-T",
        mnt.to_str().unwrap(),
    ]);
    assert_eq!(
        c.ok(&["mountpoint", "1", "fs1"]).trim(),
        mnt.to_str().unwrap()
    );
    // The mount is in the host mount namespace: node 2 and the host see what node 1 wrote.
    std::fs::write(mnt.join("hello"), "from the host\n").unwrap();
    let path = mnt.join("hello");
    let seen = c.ok(&["run", "2", "--", "cat", path.to_str().unwrap()]);
    assert_eq!(seen, "from the host\n");

    let killed = c.ok(&["kill", "1"]);
    assert!(killed.contains(&format!("pid {pid}")), "{killed}");
    assert!(!alive(&pid), "daemon {pid} survived kill");
    assert!(c.fails(&["kill", "1"]).contains("no running daemon"));
    c.ok(&["start", "1"]);
    let again = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .to_string();
    assert_ne!(again, pid);

    // The restarted daemon mounts again what it had mounted; `down` then meets a live
    // daemon and a live mount, and both must go.
    assert_eq!(
        c.ok(&["mountpoint", "1", "fs1"]).trim(),
        mnt.to_str().unwrap()
    );
    c.ok(&["run", "2", "--", "ls", mnt.to_str().unwrap()]);
    c.ok(&["down"]);
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(
        !mounts.contains(c.base.to_str().unwrap()),
        "a mount survived down"
    );
    assert!(!alive(&again), "daemon {again} survived down");
    assert_eq!(c.leftovers(), Vec::<String>::new());
    assert!(!c.base.exists());
}
