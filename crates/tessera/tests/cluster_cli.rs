//! The cluster admin CLI without daemons: `cluster create -N` setting up several homes on
//! this machine through a real remote-shell script (the ssh contract: `RSH NODE "CMD"`),
//! the accept package of a node it cannot reach, `cluster accept`, and the refusals of bad
//! input before anything is written. Every node is a home under one temporary directory;
//! the remote shell maps a node name to its home.

mod common;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::BIN;

/// A set of node homes and the remote shell that reaches them.
struct Site {
    dir: tempfile::TempDir,
}

impl Site {
    /// Nodes named in `reachable` can be reached; any other name fails the way ssh fails
    /// for a host that does not answer (exit 255).
    fn new(reachable: &[&str]) -> Site {
        let dir = tempfile::tempdir().expect("temp dir");
        let script = format!(
            "#!/bin/bash\n\
             while [[ $1 == -o ]]; do shift 2; done\n\
             node=$1; shift\n\
             echo \"$node $*\" >>'{log}'\n\
             case \" {reachable} \" in *\" $node \"*) ;; *)\n\
                 echo \"ssh: connect to host $node port 22: No route to host\" >&2; exit 255;;\n\
             esac\n\
             export TESSERA_HOME='{root}'/$node TESSERA_NODE=$node\n\
             exec bash -c \"$*\"\n",
            log = dir.path().join("rsh.log").display(),
            root = dir.path().display(),
            reachable = reachable.join(" "),
        );
        let rsh = dir.path().join("rsh");
        std::fs::write(&rsh, script).expect("write rsh");
        std::fs::set_permissions(&rsh, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        Site { dir }
    }

    fn home(&self, node: &str) -> PathBuf {
        self.dir.path().join(node)
    }

    fn rsh(&self) -> String {
        self.dir.path().join("rsh").display().to_string()
    }

    /// Remote shell calls made so far, one line each.
    fn rsh_calls(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("rsh.log")).unwrap_or_default()
    }

    /// Runs tessera as node `node` (its home and TESSERA_NODE), with `stdin` if given.
    fn run(&self, node: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
        self.run_in(node, node, args, stdin)
    }

    /// Runs tessera in the home named `home` as node `node`.
    fn run_in(&self, home: &str, node: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut child = Command::new(BIN)
            .args(args)
            .env("TESSERA_HOME", self.home(home))
            .env("TESSERA_NODE", node)
            .current_dir(self.dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run tessera");
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(stdin.unwrap_or_default())
            .expect("write stdin");
        drop(pipe);
        child.wait_with_output().expect("wait for tessera")
    }

    fn ok(&self, node: &str, args: &[&str]) -> String {
        let out = self.run(node, args, None);
        assert!(
            out.status.success(),
            "tessera {args:?} failed:\n{}",
            text(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs, requires failure, returns stderr.
    fn fails(&self, node: &str, args: &[&str]) -> String {
        let out = self.run(node, args, None);
        assert!(
            !out.status.success(),
            "tessera {args:?} should fail:\n{}",
            text(&out)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("valid JSON")
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
}

const THREE_NODES: &str = "# two quorum managers and a client, one port each\n\
    node1:quorum-manager:127.0.0.1:7101\n\
    node2:manager-quorum:127.0.0.1:7102\n\
    node3::127.0.0.1:7103\n";

#[test]
fn create_sets_up_three_homes_through_the_remote_shell() {
    let site = Site::new(&["node2", "node3"]);
    let node_file = site.dir.path().join("nodes");
    std::fs::write(&node_file, THREE_NODES).unwrap();
    let out = site.ok(
        "node1",
        &[
            "cluster",
            "create",
            "--name",
            "tri",
            "-N",
            node_file.to_str().unwrap(),
            "-r",
            &site.rsh(),
            "--config",
            "failureDetectionTime=2.50",
        ],
    );
    for node in ["node1", "node2", "node3"] {
        assert!(out.contains(&format!("Processing node {node}")), "{out}");
    }
    assert!(
        out.contains("tessera cluster create: Command successfully completed"),
        "{out}"
    );
    assert!(
        out.contains("has 3 nodes; start them with `tessera startup -a`"),
        "{out}"
    );

    let secret = std::fs::read(site.home("node1").join("cluster.secret")).unwrap();
    assert_eq!(secret.len(), 65, "64 hex digits and a newline");
    let id = json(&site.home("node1").join("cluster.json"))["cluster_id"].clone();
    assert_eq!(id.as_str().unwrap().len(), 32);
    for (number, node) in ["node1", "node2", "node3"].iter().enumerate() {
        let home = site.home(node);
        let config = json(&home.join("cluster.json"));
        assert_eq!(config["name"], "tri");
        assert_eq!(config["cluster_id"], id);
        assert_eq!(config["node_name"], *node);
        assert_eq!(config["node_number"], number + 1);
        assert_eq!(config["address"], format!("127.0.0.1:710{}", number + 1));
        assert_eq!(config["format"], 1);
        let secret_path = home.join("cluster.secret");
        assert_eq!(std::fs::read(&secret_path).unwrap(), secret, "{node}");
        assert_eq!(mode(&secret_path), 0o600, "{node}");
        let cache = json(&home.join("cluster/nodes.json"));
        assert_eq!(cache["nodes"].as_array().unwrap().len(), 3, "{node}");
        assert_eq!(cache["identity"]["remote_shell"], site.rsh());
        assert_eq!(cache["nodes"][2]["name"], "node3");
        assert_eq!(
            home.join("cluster/bootstrap.json").exists(),
            *node != "node3",
            "bootstrap.json belongs on the quorum nodes only ({node})"
        );
    }
    let bootstrap =
        std::fs::read_to_string(site.home("node2").join("cluster/bootstrap.json")).unwrap();
    assert!(bootstrap.contains("\"failureDetectionTime\"") && bootstrap.contains("\"2.5\""));
    assert!(site.home("node2").join("log").is_dir());

    // With no daemon running, ls and state answer from the node table this node keeps.
    let ls = site.ok("node2", &["cluster", "ls"]);
    assert!(ls.contains("last known node table"), "{ls}");
    assert!(ls.contains("Repository type:           Raft"), "{ls}");
    let rows: Vec<Vec<&str>> = ls.lines().map(|l| l.split_whitespace().collect()).collect();
    for row in [
        &["1", "node1", "127.0.0.1:7101", "quorum-manager"][..],
        &["3", "node3", "127.0.0.1:7103"],
    ] {
        assert!(rows.iter().any(|r| r == row), "{row:?} in {ls}");
    }
    let y = site.ok("node2", &["cluster", "ls", "-Y"]);
    assert!(y.contains("cluster:clusterNode:0:1:::2:node2:127.0.0.1%3A7102:quorum-manager:"));
    let state = site.ok("node2", &["state", "-a", "-Y"]);
    let lines: Vec<&str> = state.lines().collect();
    assert_eq!(lines.len(), 4, "{state}");
    let header: Vec<&str> = lines[0].split(':').collect();
    for column in ["nodeNumber", "nodeName", "state"] {
        assert!(header.contains(&column), "{state}");
    }
    // Asked directly: nothing listens on node1's daemon port.
    assert!(lines[1].contains(":1:node1:down:"), "{state}");
    assert!(lines[2].contains(":2:node2:down:"), "{state}");
    let summary = site.ok("node2", &["state", "-N", "node3,node1", "-s"]);
    assert!(summary.contains("Number of quorum nodes defined in the cluster:  2"));
    assert!(summary.contains("Quorum = 2"), "{summary}");
    assert!(!summary.contains("node2"), "{summary}");
    let y = site.ok("node2", &["state", "-a", "-s", "-Y"]);
    assert!(
        y.contains("state:summary:HEADER:version:reserved:reserved:quorumNodesDefined:")
            && y.contains(":managerNumber:")
            && y.contains("state:summary:0:1:::2:0:2::"),
        "{y}"
    );

    // Shutdown -a reaches every node through the remote shell: none runs a daemon.
    let down = site.ok("node1", &["shutdown", "-a"]);
    for node in ["node2", "node3"] {
        assert!(
            down.contains(&format!(
                "tessera shutdown: {node}: the daemon is not running"
            )),
            "{down}"
        );
    }
    assert!(site.rsh_calls().contains("node3 "), "{}", site.rsh_calls());

    let again = site.fails(
        "node1",
        &[
            "cluster",
            "create",
            "--name",
            "tri",
            "-N",
            node_file.to_str().unwrap(),
        ],
    );
    assert!(again.contains("already defined"), "{again}");
}

#[test]
fn an_unreachable_node_gets_its_package_as_a_file_and_accepts_it_later() {
    let site = Site::new(&["node2"]);
    let out = site.run(
        "node1",
        &[
            "cluster",
            "create",
            "--name",
            "pair",
            "-N",
            "node1:quorum-manager:127.0.0.1:7201,node2:quorum:127.0.0.1:7202,\
             node4::127.0.0.1:7204",
            "-r",
            &format!("{} -o BatchMode=yes", site.rsh()),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.contains("node node4 was not reached: ssh: connect to host node4"),
        "{stdout}"
    );
    assert!(
        stderr.contains("1 of 3 nodes did not get their accept package (node4)"),
        "{stderr}"
    );
    assert!(
        !stdout.contains("Command successfully completed"),
        "{stdout}"
    );
    assert!(site.home("node2").join("cluster.json").exists());
    assert!(!site.home("node4").exists());
    let package = site.home("node1").join("cluster/accept-node4.json");
    assert_eq!(mode(&package), 0o600);
    assert!(stdout.contains(&format!("its accept package is {}", package.display())));
    let bytes = std::fs::read(&package).unwrap();

    // The admin copies the file to node4 and accepts it there, twice (a retry is harmless).
    for _ in 0..2 {
        let out = site.run("node4", &["cluster", "accept"], Some(&bytes));
        assert!(out.status.success(), "{}", text(&out));
        assert!(String::from_utf8_lossy(&out.stdout).contains("node node4 (number 3)"));
    }
    let config = json(&site.home("node4").join("cluster.json"));
    assert_eq!(
        (config["node_number"].clone(), config["name"].clone()),
        (3.into(), "pair".into())
    );
    assert!(!site.home("node4").join("cluster/bootstrap.json").exists());
    assert_eq!(
        std::fs::read(site.home("node4").join("cluster.secret")).unwrap(),
        std::fs::read(site.home("node1").join("cluster.secret")).unwrap()
    );

    // shutdown -a reports the node it cannot reach and fails naming it.
    let down = site.run("node1", &["shutdown", "-a"], None);
    assert!(!down.status.success(), "{}", text(&down));
    let err = String::from_utf8_lossy(&down.stderr);
    assert!(err.contains("1 of 3 nodes failed: node4"), "{err}");
    assert!(String::from_utf8_lossy(&down.stdout).contains("node4: failed: ssh: connect"));
}

#[test]
fn accept_refuses_another_cluster_another_node_and_garbage() {
    let site = Site::new(&[]);
    let out = site.run(
        "node1",
        &[
            "cluster",
            "create",
            "--name",
            "c1",
            "-N",
            "node1:quorum-manager:127.0.0.1:7301,node2::127.0.0.1:7302",
            "-r",
            &site.rsh(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let package = std::fs::read(site.home("node1").join("cluster/accept-node2.json")).unwrap();

    // node2's home already belongs to a cluster of its own.
    site.ok("node2", &["cluster", "create", "--name", "other"]);
    let before = std::fs::read(site.home("node2").join("cluster.json")).unwrap();
    let out = site.run("node2", &["cluster", "accept"], Some(&package));
    assert!(!out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already belongs to cluster other"), "{err}");
    assert_eq!(
        std::fs::read(site.home("node2").join("cluster.json")).unwrap(),
        before
    );

    // A package for another node.
    let out = site.run("node3", &["cluster", "accept"], Some(&package));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("this accept package is for node node2"),
        "{err}"
    );
    assert!(!site.home("node3").exists());

    let oversized = vec![b' '; (16 << 20) + 1];
    let cases: [(&[u8], &str); 4] = [
        (b"", "no accept package on standard input"),
        (b"garbage\n", "is not an accept package"),
        (&package[..package.len() / 2], "is not an accept package"),
        (&oversized, "larger than"),
    ];
    for (input, expected) in cases {
        let out = site.run("node5", &["cluster", "accept"], Some(input));
        assert!(!out.status.success(), "{}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expected), "{expected}: {err}");
        assert!(!site.home("node5").exists());
    }
    // A package whose secret was tampered with.
    let tampered = String::from_utf8(package.clone()).unwrap();
    let start = tampered.find("\"secret\": \"").unwrap() + 11;
    let tampered = format!("{}zz{}", &tampered[..start], &tampered[start + 2..]);
    let out = site.run_in(
        "fresh",
        "node2",
        &["cluster", "accept"],
        Some(tampered.as_bytes()),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("secret"),
        "{}",
        text(&out)
    );
    assert!(!site.home("fresh").join("cluster.json").exists());
}

#[test]
fn bad_node_lists_and_parameters_change_nothing() {
    let site = Site::new(&["node2"]);
    let bad_file = site.dir.path().join("bad-nodes");
    std::fs::write(
        &bad_file,
        "node1:quorum-manager:127.0.0.1:1\nnode2:quorom\n",
    )
    .unwrap();
    let rsh = site.rsh();
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "node1",
            &["-N", "node1:quorum-manager:127.0.0.1:1,node1::127.0.0.1:2"],
            "node node1 is named twice",
        ),
        (
            "node1",
            &["-N", "node1:quorom"],
            "unknown designation `quorom`",
        ),
        (
            "node1",
            &["-N", bad_file.to_str().unwrap()],
            "line 2: unknown designation",
        ),
        (
            "node1",
            &["-N", "node1::127.0.0.1:1,node2::127.0.0.1:2"],
            "no quorum node",
        ),
        (
            "node1",
            &["-N", "node1:quorum:127.0.0.1:1,node2:quorum:127.0.0.1:1"],
            "both have the daemon address",
        ),
        (
            "node9",
            &["-N", "node1:quorum-manager:127.0.0.1:1,node2::127.0.0.1:2"],
            "TESSERA_NODE=node9 names no node of the list (node1, node2)",
        ),
        (
            "node1",
            &[
                "-N",
                "node1:quorum-manager",
                "--config",
                "failureDetectionTime=abc",
            ],
            "not a number of seconds",
        ),
        (
            "node1",
            &["-N", "node1:quorum-manager", "--config", "maxMBpS=4000"],
            "unknown configuration parameter `maxMBpS`; Tessera implements: failureDetectionTime",
        ),
        (
            "node1",
            &["-N", "node1:quorum-manager", "-r", " "],
            "remote shell command is empty",
        ),
        (
            "node1",
            &["-N", "node1:quorum-manager:127.0.0.1:0"],
            "port `0`",
        ),
        (
            "node1",
            &[
                "-N",
                "node1:quorum-manager:127.0.0.1:1,node2::127.0.0.1:2",
                "-r",
                "/no/rsh -x",
            ],
            "the remote shell `/no/rsh` is not an executable file",
        ),
    ];
    for (node, extra, expected) in cases {
        let mut args = vec!["cluster", "create", "--name", "bad"];
        args.extend_from_slice(extra);
        if !extra.contains(&"-r") {
            args.extend(["-r", rsh.as_str()]);
        }
        let err = site.fails(node, &args);
        assert!(
            err.contains(expected),
            "{extra:?}: expected `{expected}` in:\n{err}"
        );
        assert!(
            !site.home(node).exists(),
            "{extra:?} wrote {}",
            site.home(node).display()
        );
    }
    assert!(!site.home("node2").exists());
    assert_eq!(site.rsh_calls(), "", "the remote shell must not run");

    // Without TESSERA_NODE the host's own name decides, and this host is in no list.
    let out = Command::new(BIN)
        .args([
            "cluster",
            "create",
            "--name",
            "bad",
            "-N",
            "zz-no-such-host-1:quorum",
        ])
        .env("TESSERA_HOME", site.home("nameless"))
        .env_remove("TESSERA_NODE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("is not in the node list"),
        "{err}"
    );
    assert!(!site.home("nameless").exists());
}

#[test]
fn one_node_cluster_and_commands_that_need_the_daemon() {
    let site = Site::new(&[]);
    let out = site.ok("solo", &["cluster", "create", "--name", "single"]);
    assert!(
        out.contains("tessera cluster create: Processing node solo"),
        "{out}"
    );
    assert!(out.contains("tessera cluster create: Command successfully completed"));
    assert!(
        out.contains("has one node; start it with `tessera startup`"),
        "{out}"
    );
    let home = site.home("solo");
    let config = json(&home.join("cluster.json"));
    assert_eq!(config["address"], "127.0.0.1:0");
    assert_eq!(config["node_number"], 1);
    assert!(home.join("cluster/bootstrap.json").exists());
    assert_eq!(
        json(&home.join("cluster/nodes.json"))["identity"]["remote_shell"],
        "ssh"
    );

    let state = site.ok("solo", &["state"]);
    assert!(state.contains("solo") && state.contains("down"), "{state}");
    let y = site.ok("solo", &["state", "-Y"]);
    assert!(y.starts_with("state::HEADER:version:reserved:reserved:nodeNumber:nodeName:state:"));
    let ls = site.ok("solo", &["cluster", "ls"]);
    assert!(
        ls.lines().any(|l| l
            .split_whitespace()
            .eq(["1", "solo", "127.0.0.1:0", "quorum-manager"])),
        "{ls}"
    );

    let needs_daemon: &[&[&str]] = &[
        &["config", "ls"],
        &["config", "set", "failureDetectionTime=5"],
        &["node", "add", "-N", "node2::127.0.0.1:7402"],
        &["node", "delete", "-N", "node2"],
        &["node", "change", "-N", "solo", "--client"],
    ];
    for args in needs_daemon {
        let err = site.fails("solo", args);
        assert!(err.contains("`tessera startup`"), "{args:?}: {err}");
    }
    let refused: &[(&[&str], &str)] = &[
        (
            &["config", "set", "maxMBpS=4000"],
            "unknown configuration parameter",
        ),
        (
            &["config", "set", "failureDetectionTime=5", "-N", "solo"],
            "one value for the whole cluster",
        ),
        (&["node", "change", "-N", "solo"], "required"),
        (
            &["node", "change", "-N", "solo", "--quorum", "--nonquorum"],
            "cannot be used with",
        ),
        (
            &["node", "change", "-N", "a,b", "--address", "h:1"],
            "one node at a time",
        ),
        (&["node", "delete", "-N", "a,a"], "named twice"),
        (
            &["startup", "-N", "nosuch"],
            "node nosuch is not in the cluster; its nodes are solo",
        ),
        (&["startup", "-a", "-N", "solo"], "cannot be used with"),
        (&["state", "-N", "nosuch"], "not in the cluster"),
    ];
    for (args, expected) in refused {
        let err = site.fails("solo", args);
        assert!(
            err.contains(expected),
            "{args:?}: expected `{expected}` in {err}"
        );
    }
    let help = site.ok("solo", &["cluster", "create", "--help"]);
    assert!(help.contains("-N <NODEFILE|NODE[,NODE...]>"), "{help}");
    assert!(
        help.contains("tessera cluster accept < accept-NODE.json"),
        "{help}"
    );
}
