//! A one-node home from before the cluster layer: `cluster.json` without an address or a
//! format, and the NSD and file-system tables in `nsd.json` and `fs.json`. Its daemon must
//! start, make it a one-node cluster with the same name and id (the NSD descriptors carry
//! the id), move the tables into the replicated configuration and mount the file system
//! that was mounted, and keep doing so on later starts.
//!
//! The old home is made the way the old daemon left it: a file system is created and
//! mounted with today's binary, then the home is rewritten to the old layout, with the
//! tables in the old files' exact shape (the records are unchanged but for the fields
//! the cluster layer added, which the old files lack).

mod common;

use common::*;
use serde_json::{json, Value};

/// The NSD table as the old `nsd.json` held it, rebuilt from `nsd ls -Y`.
fn old_nsd_table(listing: &str) -> Value {
    let mut names: Vec<&str> = Vec::new();
    let mut nsds = Vec::new();
    for line in listing.lines() {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.get(2) == Some(&"HEADER") {
            names = fields;
            continue;
        }
        let get = |name: &str| {
            let at = names.iter().position(|n| *n == name).expect(name);
            fields[at].to_string()
        };
        let hex = get("volumeId");
        let id: Vec<u8> = (0..16)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        let file_system = get("fileSystem");
        nsds.push(json!({
            "name": get("diskName"),
            "id": id,
            "device": get("device"),
            "size_bytes": get("sizeBytes").parse::<u64>().unwrap(),
            "usage": "DataAndMetadata",
            "failure_group": get("failureGroup").parse::<i32>().unwrap(),
            "pool": get("storagePool"),
            "thin_disk_type": "No",
            "servers": [],
            "file_system": if file_system.is_empty() { Value::Null } else { json!(file_system) },
        }));
    }
    json!({ "nsds": nsds })
}

#[test]
fn a_one_node_home_from_before_the_cluster_layer_starts_and_mounts() {
    let mut node = Node::new().start();
    let stanza = node.stanza("old", 2, DRIVE_BYTES);
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = node.path("mnt/oldfs");
    node.ok(&["fs", "create", "oldfs", "-F", s(&stanza), "-T", s(&mnt)]);
    node.ok(&["mount", "oldfs"]);
    node.mounts.push(mnt.clone());
    std::fs::write(mnt.join("kept"), b"written before the upgrade").unwrap();
    let listing = node.ok(&["nsd", "ls", "-Y"]);
    let cluster_id = node
        .ok(&["cluster", "ls", "-Y"])
        .lines()
        .filter(|l| l.starts_with("cluster:clusterSummary:") && !l.contains(":HEADER:"))
        .map(|l| l.split(':').nth(7).unwrap().to_string())
        .next()
        .expect("cluster id in cluster ls -Y");
    assert_eq!(cluster_id.len(), 32, "{cluster_id}");
    node.ok(&["shutdown"]);

    // The home as the daemon before the cluster layer left it.
    let home = node.home();
    std::fs::remove_dir_all(home.join("cluster")).unwrap();
    std::fs::remove_file(home.join("cluster.secret")).unwrap();
    let old_cluster = json!({
        "name": "testcluster",
        "cluster_id": cluster_id,
        "node_name": "oldnode",
        "node_number": 1,
        "created_unix": 1_700_000_000u64,
    });
    let old_fs = json!({ "file_systems": [{
        "name": "oldfs",
        "nsds": ["old0", "old1"],
        "default_mount_point": s(&mnt),
        "automount": false,
        "mounted": true,
        "mount_point": s(&mnt),
        "strict_replicas": "whenpossible",
        "log_bytes": 0,
    }]});
    let write = |name: &str, value: &Value| {
        std::fs::write(home.join(name), serde_json::to_vec_pretty(value).unwrap()).unwrap()
    };
    write("cluster.json", &old_cluster);
    write("nsd.json", &old_nsd_table(&listing));
    write("fs.json", &old_fs);

    // It starts, is a one-node cluster of the same id, and mounts what was mounted.
    node.ok(&["startup"]);
    assert_eq!(
        std::fs::read(mnt.join("kept")).unwrap(),
        b"written before the upgrade"
    );
    let ls = node.ok(&["cluster", "ls"]);
    assert!(ls.contains(&cluster_id) && ls.contains("oldnode"), "{ls}");
    assert!(node.ok(&["state"]).contains("active"));
    assert!(node.ok(&["nsd", "ls"]).contains("old1"));
    for old in ["nsd.json", "fs.json"] {
        assert!(!home.join(old).exists(), "{old} is imported");
        assert!(
            home.join(format!("{old}.imported")).exists(),
            "{old} is kept aside"
        );
    }
    let upgraded: Value =
        serde_json::from_slice(&std::fs::read(home.join("cluster.json")).unwrap()).unwrap();
    assert_eq!(upgraded["format"], 1, "{upgraded}");

    // Later starts find everything in the replicated configuration.
    node.ok(&["shutdown"]);
    node.ok(&["startup"]);
    assert_eq!(
        std::fs::read(mnt.join("kept")).unwrap(),
        b"written before the upgrade"
    );
    node.ok(&["umount", "oldfs"]);
    node.ok(&["mount", "oldfs"]);
    assert!(mnt.join("kept").exists());
}
