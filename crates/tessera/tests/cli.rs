//! End-to-end tests of the `tessera` binary: a real daemon in a temporary home, file-backed
//! drives, and (where /dev/fuse is usable) a real FUSE mount.

mod common;

use common::*;

/// `tessera ... | head`: when the reader has gone, the command ends with the status of a
/// closed pipe (141), quietly, not with a panic and a backtrace.
#[test]
fn a_listing_piped_into_a_reader_that_went_away_ends_quietly() {
    let node = Node::new().start();
    // The reader closes before the command prints a line: its first print fails.
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = std::process::Command::new(common::BIN)
        .args(["diag", "--iohist"])
        .env("TESSERA_HOME", node.home())
        .stdout(writer)
        .output()
        .expect("run tessera");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // With a reader, the same listing prints.
    assert!(node.ok(&["diag", "--iohist"]).contains("I/O history"));
}

#[test]
fn state_is_down_without_daemon_and_active_with_it() {
    let node = Node::new();
    let err = node.fails(&["state"]);
    assert!(err.contains("tessera cluster create"), "{err}");
    let node = node.start();
    assert!(node.ok(&["state"]).contains("active"));
    let y = node.ok(&["state", "-Y"]);
    assert!(y.starts_with("state::HEADER:version:reserved:reserved:nodeNumber:nodeName:state:"));
    let err = node.fails(&["cluster", "create", "--name", "again"]);
    assert!(err.contains("already defined"), "{err}");
    node.ok(&["shutdown"]);
    assert!(node.ok(&["state"]).contains("down"));
}

#[test]
fn nsd_create_list_delete_figure33() {
    let node = Node::new().start();
    let stanza = node.figure33();
    let out = node.ok(&["nsd", "create", "-F", s(&stanza)]);
    assert_eq!(
        out.matches("tessera nsd create: Processing disk").count(),
        4,
        "{out}"
    );
    let ls = node.ok(&["nsd", "ls"]);
    assert!(
        ls.contains("(free disk)") && ls.contains("de0704a02v2"),
        "{ls}"
    );
    assert!(ls.contains("(directly attached)"));
    let m = node.ok(&["nsd", "ls", "-m"]);
    assert!(
        m.contains("NSD volume ID") && m.contains(s(&node.path("nvme0n1"))),
        "{m}"
    );
    assert!(node.ok(&["nsd", "ls", "-X"]).contains("Devtype"));
    let y = node.ok(&["nsd", "ls", "-Y"]);
    assert!(y
        .lines()
        .next()
        .unwrap()
        .starts_with("nsd::HEADER:version:reserved:reserved:"));
    assert_eq!(y.lines().count(), 5, "{y}");
    node.ok(&["nsd", "delete", "de0704a01v1"]);
    assert!(!node.ok(&["nsd", "ls"]).contains("de0704a01v1"));
    let err = node.fails(&["nsd", "delete", "nosuch"]);
    assert!(err.contains("does not exist"), "{err}");
}

#[test]
fn nsd_create_generates_names_and_rewrites_stanza() {
    let node = Node::new().start();
    node.drive("d0", DRIVE_BYTES);
    node.drive("d1", DRIVE_BYTES);
    let stanza = node.path("gen.stanza");
    std::fs::write(
        &stanza,
        "%nsd: device=./d0\n# a comment\n%nsd: device=./d1 failureGroup=2\n",
    )
    .unwrap();
    node.ok(&["nsd", "create", "-F", "gen.stanza"]);
    let text = std::fs::read_to_string(&stanza).unwrap();
    assert!(
        text.contains("nsd=nsd1") && text.contains("nsd=nsd2"),
        "{text}"
    );
    assert!(text.contains("# %nsd: device=./d0"), "{text}");
    let y = node.ok(&["nsd", "ls", "-Y"]);
    assert!(y.contains(&format!(":{}:", s(&node.path("d1")))), "{y}");
}

#[test]
fn nsd_create_bad_input_leaves_nothing() {
    let node = Node::new().start();
    let d0 = node.drive("d0", DRIVE_BYTES);
    let small = node.drive("small", 1 << 20);
    let bad = node.path("bad.stanza");
    let nsds = |n: &Node| n.ok(&["nsd", "ls", "-Y"]).lines().count() - 1;

    // Malformed: the error names the line and the field.
    std::fs::write(
        &bad,
        format!("%nsd: device={}\n  usage=dataOnlyy\n", s(&d0)),
    )
    .unwrap();
    let err = node.fails(&["nsd", "create", "-F", s(&bad)]);
    assert!(err.contains("line 2") && err.contains("usage"), "{err}");
    assert_eq!(nsds(&node), 0);

    // Too small and missing devices; the good stanza before them is not created either.
    let text = format!(
        "%nsd: device={} nsd=good\n%nsd: device={} nsd=tiny\n%nsd: device={}/nope nsd=gone\n",
        s(&d0),
        s(&small),
        node.dir.path().display()
    );
    std::fs::write(&bad, text).unwrap();
    let err = node.fails(&["nsd", "create", "-F", s(&bad)]);
    assert!(err.contains("too small") && err.contains("nope"), "{err}");
    assert_eq!(nsds(&node), 0);

    // Duplicate NSD name within a file.
    let d1 = node.drive("d1", DRIVE_BYTES);
    std::fs::write(
        &bad,
        format!(
            "%nsd: device={} nsd=a\n%nsd: device={} nsd=a\n",
            s(&d0),
            s(&d1)
        ),
    )
    .unwrap();
    let err = node.fails(&["nsd", "create", "-F", s(&bad)]);
    assert!(
        err.contains("line 2") && err.contains("already used"),
        "{err}"
    );

    // Device already an NSD: refused without -v no, accepted with it.
    let ok = node.path("ok.stanza");
    std::fs::write(&ok, format!("%nsd: device={} nsd=first\n", s(&d0))).unwrap();
    node.ok(&["nsd", "create", "-F", s(&ok)]);
    node.ok(&["nsd", "delete", "first"]);
    // Rewrite the descriptor behind the daemon's back: make d0 an NSD of another cluster.
    let other = Node::new().start();
    std::fs::write(&ok, format!("%nsd: device={} nsd=foreign\n", s(&d0))).unwrap();
    other.ok(&["nsd", "create", "-F", s(&ok)]);
    drop(other);
    std::fs::write(&ok, format!("%nsd: device={} nsd=mine\n", s(&d0))).unwrap();
    let err = node.fails(&["nsd", "create", "-F", s(&ok)]);
    assert!(
        err.contains("already holds NSD foreign") && err.contains("-v no"),
        "{err}"
    );
    node.ok(&["nsd", "create", "-F", s(&ok), "-v", "no"]);

    // Name already registered.
    std::fs::write(&ok, format!("%nsd: device={} nsd=mine\n", s(&d1))).unwrap();
    let err = node.fails(&["nsd", "create", "-F", s(&ok)]);
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(nsds(&node), 1);
}

#[test]
fn fs_create_option_errors() {
    let node = Node::new().start();
    let stanza = node.figure33();
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let f = s(&stanza);
    for (args, want) in [
        (vec!["-B", "3M"], "not a power of two"),
        (vec!["-B", "32K"], "minimum of 64K"),
        (vec!["-m", "3", "-M", "3"], "at most two metadata copies"),
        (vec!["-r", "3"], "above the maximum"),
        (vec!["-i", "2K"], "use 512, 1K or 4K"),
        (vec!["-j", "random"], "scatter, cluster"),
        (vec!["-K", "maybe"], "whenpossible"),
    ] {
        let mut all = vec!["fs", "create", "fs1", "-F", f];
        all.extend(args.iter().copied());
        let err = node.fails(&all);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // `all` and `ls` name every file system in `mount ls`; neither can name one.
    for reserved in ["all", "ls"] {
        let err = node.fails(&["fs", "create", reserved, "-F", f]);
        assert!(err.contains("reserved"), "{err}");
    }
    let err = node.fails(&["fs", "create", "fs1", "-F", f, "--bogus"]);
    assert!(err.contains("--bogus"), "{err}");
    let missing = node.path("missing.stanza");
    std::fs::write(&missing, "%nsd: nsd=nosuch\n").unwrap();
    let err = node.fails(&["fs", "create", "fs1", "-F", s(&missing)]);
    assert!(
        err.contains("NSD nosuch does not exist") && err.contains("nsd create"),
        "{err}"
    );
    // Nothing half-made: every NSD is still free.
    assert_eq!(node.ok(&["nsd", "ls"]).matches("(free disk)").count(), 4);
}

#[test]
fn fs_create_seed000_options_then_ls_disk_df_delete() {
    let node = Node::new().start();
    let stanza = node.figure33();
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = node.path("gpfs/ef600_mlx");
    let out = node.ok(&[
        "fs",
        "create",
        "ef600_mlx",
        "-F",
        s(&stanza),
        "-T",
        s(&mnt),
        "-B",
        "1m",
        "-E",
        "no",
        "-S",
        "relatime",
        "-K",
        "whenpossible",
        "-m",
        "1",
        "-M",
        "2",
        "-r",
        "1",
        "-R",
        "2",
        "-n",
        "137",
        "-A",
        "no",
        "--inode-limit",
        "10000000:5000000",
    ]);
    assert!(
        out.contains("The following disks of ef600_mlx will be formatted"),
        "{out}"
    );
    assert!(
        out.contains("Completed creation of file system ef600_mlx."),
        "{out}"
    );
    let ls = node.ok(&["fs", "ls", "ef600_mlx"]);
    for want in [
        "1048576",
        "relatime",
        "whenpossible",
        "137",
        "10000000",
        s(&mnt),
    ] {
        assert!(ls.contains(want), "{want} missing from\n{ls}");
    }
    let y = node.ok(&["fs", "ls", "ef600_mlx", "-Y"]);
    assert!(y.contains("fs::0:1:::ef600_mlx:blockSize:1048576::"), "{y}");
    assert!(y.contains(":automaticMountOption:no:"), "{y}");
    // No -L: a 64th of the 512 MiB of metadata disks, so that every node's log (each
    // holder of an owner slot has one) leaves room on a small file system.
    assert!(y.contains(":logfileSize:8388608:"), "{y}");
    let disks = node.ok(&["disk", "ls", "ef600_mlx"]);
    assert_eq!(disks.matches("ready").count(), 4, "{disks}");
    assert!(disks.contains("704") && disks.contains(" up "), "{disks}");
    let df = node.ok(&["df", "ef600_mlx"]);
    assert!(
        df.contains("Disks in storage pool: system") && df.contains("(total)"),
        "{df}"
    );
    assert!(
        df.contains("Maximum number of inodes:") && df.contains("10000000"),
        "{df}"
    );
    assert!(node
        .ok(&["df", "ef600_mlx", "-Y"])
        .contains("df:inode:0:1:::ef600_mlx:"));
    assert!(node.ok(&["nsd", "ls"]).contains("ef600_mlx"));
    node.ok(&["fsck", "ef600_mlx", "-n"]);
    let err = node.fails(&["fs", "create", "ef600_mlx", "-F", s(&stanza)]);
    assert!(err.contains("already exists"), "{err}");
    node.ok(&["fs", "delete", "ef600_mlx"]);
    assert_eq!(node.ok(&["nsd", "ls"]).matches("(free disk)").count(), 4);
    // The NSDs are free again and can hold a new file system.
    node.ok(&[
        "fs",
        "create",
        "again",
        "-F",
        s(&stanza),
        "-B",
        "256K",
        "-A",
        "no",
        "-L",
        "2M",
    ]);
    let y = node.ok(&["fs", "ls", "again", "-Y"]);
    assert!(y.contains(":logfileSize:2097152:"), "{y}");
    // `all` [mmlsfs all]: every file system, each under its name.
    let all = node.ok(&["fs", "ls", "all"]);
    assert!(
        all.contains("File system attributes for again:") && all.contains("2097152"),
        "{all}"
    );
    let all = node.ok(&["fs", "ls", "all", "-Y"]);
    assert_eq!(all.matches(":HEADER:").count(), 1, "{all}");
    assert!(all.contains(":again:logfileSize:2097152:"), "{all}");
    node.ok(&["fs", "delete", "again"]);
    let none = node.fails(&["fs", "ls", "all"]);
    assert!(none.contains("no file systems"), "{none}");
}

#[test]
fn fs_create_seed002_form_mount_write_umount() {
    if !fuse_usable() {
        return;
    }
    let mut node = Node::new().start();
    let stanza = node.figure33();
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = node.path("gpfs1");
    node.mounts.push(mnt.clone());
    let list = node.path("disk.lst");
    std::fs::copy(&stanza, &list).unwrap();
    node.ok(&[
        "fs",
        "create",
        s(&mnt),
        "gpfs1",
        "-F",
        s(&list),
        "-A",
        "yes",
        "-B",
        "4m",
        "-v",
        "no",
        "-n",
        "32",
        "-j",
        "scatter",
    ]);
    // GPFS's cache parameters reach the mount.
    node.ok(&[
        "config",
        "set",
        "maxFilesToCache=2k,maxStatCache=0,pagepool=64M",
    ]);
    let ls = node.ok(&["config", "ls"]);
    assert!(
        ls.contains("maxFilesToCache") && ls.contains("2000"),
        "{ls}"
    );
    assert_eq!(
        node.ok(&["mount", "ls", "gpfs1"]).trim(),
        "File system gpfs1 is not mounted."
    );
    let out = node.ok(&["mount", "gpfs1"]);
    assert!(out.contains(s(&mnt)), "{out}");
    // [mmlsmount]: one node, this one, at the mount point.
    let listed = node.ok(&["mount", "ls", "-L"]);
    assert!(
        listed.contains("File system gpfs1 is mounted on 1 node:") && listed.contains(s(&mnt)),
        "{listed}"
    );
    let err = node.fails(&["mount", "ls", "nosuch"]);
    assert!(err.contains("nosuch"), "{err}");
    let log = std::fs::read_to_string(node.home().join("log/daemon.log")).unwrap();
    assert!(
        log.contains("gpfs1: maxFilesToCache=2000 maxStatCache=0 pagepool=64M"),
        "{log}"
    );
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(mnt.join("file.bin"), &data).unwrap();
    assert_eq!(std::fs::read(mnt.join("file.bin")).unwrap(), data);
    let pmon = node.ok(&["pmon"]);
    assert!(pmon.contains("fs_io_s") && pmon.contains("gpfs1"), "{pmon}");
    assert!(node.ok(&["pmon", "-Y"]).contains("_fs_io_s_ _n_"));
    let err = node.fails(&["fs", "delete", "gpfs1"]);
    assert!(err.contains("umount"), "{err}");
    let err = node.fails(&["fsck", "gpfs1"]);
    assert!(err.contains("unmount it on every node first"), "{err}");
    assert!(node.ok(&["df", "gpfs1"]).contains("(pool total)"));
    node.ok(&["umount", "gpfs1"]);
    assert!(!std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .contains(s(&mnt)));
    // Mounted again (at another directory), the data is still there.
    let other = node.path("other");
    node.mounts.push(other.clone());
    node.ok(&["mount", "gpfs1", "-T", s(&other)]);
    assert_eq!(std::fs::read(other.join("file.bin")).unwrap(), data);
    // A restarted daemon mounts it again where it was.
    node.ok(&["shutdown"]);
    node.ok(&["startup"]);
    assert_eq!(std::fs::read(other.join("file.bin")).unwrap(), data);
    node.ok(&["umount", "gpfs1"]);
    node.ok(&["fsck", "gpfs1"]);
}

/// Item 14: `%pool` stanzas are checked, and what is not implemented is refused; every bad
/// option is reported at once; the -m 2 error says what is true; nothing is announced as
/// formatted before the stanza passed every check; `fs delete` warns once.
#[test]
fn fs_create_checks_everything_before_announcing() {
    let node = Node::new().start();
    let stanza = node.figure33();
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let nsds = std::fs::read_to_string(&stanza).unwrap();
    let with_pool = |pool: &str| {
        let p = node.path("pool.stanza");
        std::fs::write(&p, format!("{nsds}{pool}\n")).unwrap();
        p
    };
    for (pool, want) in [
        ("%pool: pool=system blockSize=banana", "blockSize=banana"),
        ("%pool: pool=system layoutMap=", "layoutMap"),
        ("%pool: pool=system blockSize=256K", "not implemented"),
        ("%pool: pool=system layoutMap=cluster", "not implemented"),
    ] {
        let p = with_pool(pool);
        let out = node.run(&["fs", "create", "fs1", "-F", s(&p), "-B", "1M"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{pool}: {err}");
        assert!(
            out.stdout.is_empty(),
            "{pool}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // A %pool stanza that says what the file system does anyway is accepted.
    let p = with_pool("%pool: pool=system blockSize=1M layoutMap=scatter");
    node.ok(&["fs", "create", "fs1", "-F", s(&p), "-B", "1M", "-A", "no"]);
    let out = node.ok(&["fs", "delete", "fs1"]);
    assert_eq!(out.matches("will be destroyed").count(), 1, "{out}");

    // The format checks run before anything is announced.
    let meta_less = node.path("dataonly.stanza");
    std::fs::write(&meta_less, nsds.replace("dataAndMetadata", "dataOnly")).unwrap();
    let out = node.run(&["fs", "create", "fs2", "-F", s(&meta_less)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("metadata"), "{err}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("formatted"), "{stdout}");

    let err = node.fails(&[
        "fs",
        "create",
        "fs3",
        "-F",
        s(&stanza),
        "-B",
        "3M",
        "-i",
        "2K",
    ]);
    assert!(err.contains("-B 3M") && err.contains("-i 2K"), "{err}");
    let err = node.fails(&[
        "fs",
        "create",
        "fs3",
        "-F",
        s(&stanza),
        "-m",
        "3",
        "-M",
        "3",
        "-j",
        "x",
    ]);
    assert!(
        err.contains("at most two metadata copies") && err.contains("-j x"),
        "{err}"
    );
}

/// `servers=` names nodes of the cluster: an unknown node is refused before anything is
/// written; this node as the server is kept, shown, and this node serves the NSD (its own
/// mounts use the device directly).
#[test]
fn nsd_servers_must_be_nodes_of_the_cluster() {
    let node = Node::new().start();
    let d0 = node.drive("d0", DRIVE_BYTES);
    let p = node.path("servers.stanza");
    std::fs::write(&p, format!("%nsd: device={} nsd=a servers=nodeX\n", s(&d0))).unwrap();
    let err = node.fails(&["nsd", "create", "-F", s(&p)]);
    assert!(err.contains("nodeX is not a node of this cluster"), "{err}");
    assert_eq!(node.ok(&["nsd", "ls", "-Y"]).lines().count(), 1);
    let name = node_name(&node);
    std::fs::write(
        &p,
        format!("%nsd: device={} nsd=a servers={name}\n", s(&d0)),
    )
    .unwrap();
    node.ok(&["nsd", "create", "-F", s(&p)]);
    let ls = node.ok(&["nsd", "ls"]);
    assert!(
        ls.contains(&name) && !ls.contains("(directly attached)"),
        "{ls}"
    );
    let m = node.ok(&["nsd", "ls", "-m"]);
    assert!(m.contains("server node"), "{m}");
}

/// This node's name, as `state` shows it.
fn node_name(node: &Node) -> String {
    let out = node.ok(&["state", "-Y"]);
    out.lines()
        .filter(|l| l.starts_with("state::0:"))
        .find_map(|l| l.split(':').nth(7).map(str::to_string))
        .expect("state -Y names this node")
}

/// Item 14: a user who may not use the daemon's socket is told so, not that the daemon is
/// down; `da create` names the option that overrides its check.
#[test]
fn permission_denied_and_option_names() {
    use std::os::unix::process::CommandExt;
    let node = Node::new().start();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let out = std::process::Command::new(BIN)
            .args(["da", "ls"])
            .env("TESSERA_HOME", node.home())
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains("permission denied")
                && err.contains("root")
                && !err.contains("not running"),
            "{err}"
        );
    }
    // A drive that holds an NSD of another cluster: the refusal names -v no.
    let d0 = node.drive("d0", 256 << 20);
    let p = node.path("one.stanza");
    std::fs::write(&p, format!("%nsd: device={} nsd=x\n", s(&d0))).unwrap();
    let other = Node::new().start();
    other.ok(&["nsd", "create", "-F", s(&p)]);
    drop(other);
    let mut text = format!("%pdisk: pdisk=p0 device={} enclosure=e0\n", s(&d0));
    for i in 1..4 {
        let d = node.drive(&format!("p{i}"), 256 << 20);
        text += &format!("%pdisk: pdisk=p{i} device={} enclosure=e{i}\n", s(&d));
    }
    std::fs::write(&p, text).unwrap();
    let err = node.fails(&["da", "create", "small", "-F", s(&p)]);
    assert!(
        err.contains("-v no") && !err.contains("pass force"),
        "{err}"
    );
    node.ok(&["da", "create", "small", "-F", s(&p), "-v", "no"]);
}

/// Item 14: `perf net server ADDR[:PORT]` as its help says.
#[test]
fn perf_net_server_takes_the_address_as_argument() {
    use std::io::BufRead;
    let mut child = std::process::Command::new(BIN)
        .args(["perf", "net", "server", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    assert!(
        line.contains("listening on 127.0.0.1:"),
        "{line}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Item 14: shutdown with a busy mount ends its FUSE connection without logging an error
/// about /sys/fs/fuse/connections.
#[test]
fn shutdown_with_a_busy_mount_logs_no_fusectl_error() {
    if !fuse_usable() {
        return;
    }
    let mut node = Node::new().start();
    let stanza = node.figure33();
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = node.path("busy");
    node.mounts.push(mnt.clone());
    node.ok(&[
        "fs",
        "create",
        "busy",
        "-F",
        s(&stanza),
        "-B",
        "256K",
        "-T",
        s(&mnt),
    ]);
    node.ok(&["mount", "busy"]);
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .current_dir(&mnt)
        .spawn()
        .unwrap();
    node.ok(&["shutdown"]);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let log = std::fs::read_to_string(node.home().join("log/daemon.log")).unwrap();
    assert!(!log.contains("fuse/connections"), "{log}");
    assert!(!log.contains("its threads stay"), "{log}");
}

/// A mount whose client sends every metanode request over the node transport, to its own
/// daemon port (`TESSERA_METANODE_VIA_TRANSPORT=1`), as a client on another node will:
/// files made, written, read, renamed, listed, given attributes and removed through FUSE,
/// so that every request and answer survives the authenticated transport and the check
/// that the sender's incarnation is live.
#[test]
fn a_mount_reaches_its_metanode_over_the_node_transport() {
    if !fuse_usable() {
        return;
    }
    let mut node = Node::new();
    node.ok(&["cluster", "create", "--name", "testcluster"]);
    let started = std::process::Command::new(BIN)
        .arg("startup")
        .env("TESSERA_HOME", node.home())
        .env("TESSERA_METANODE_VIA_TRANSPORT", "1")
        .current_dir(node.dir.path())
        .output()
        .unwrap();
    assert!(started.status.success(), "{started:?}");
    node.started = true;
    let stanza = node.stanza("tr", 4, DRIVE_BYTES);
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = node.path("tr");
    node.mounts.push(mnt.clone());
    node.ok(&["fs", "create", "tr", "-F", s(&stanza), "-T", s(&mnt)]);
    node.ok(&["mount", "tr"]);
    let log = std::fs::read_to_string(node.home().join("log/daemon.log")).unwrap();
    assert!(
        log.contains("tr: metanode requests go over the node transport"),
        "{log}"
    );
    let data: Vec<u8> = (0..5_000_000u32).map(|i| (i * 13 % 251) as u8).collect();
    std::fs::create_dir(mnt.join("d")).unwrap();
    std::fs::write(mnt.join("d/big"), &data).unwrap();
    std::fs::write(mnt.join("d/small"), b"inline").unwrap();
    std::fs::rename(mnt.join("d/small"), mnt.join("renamed")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(mnt.join("renamed"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let names: Vec<String> = std::fs::read_dir(&mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.contains(&"d".into()) && names.contains(&"renamed".into()),
        "{names:?}"
    );
    assert_eq!(
        std::fs::metadata(mnt.join("renamed"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    // Errors come back as errors: EEXIST and ENOENT, not EIO.
    assert_eq!(
        std::fs::create_dir(mnt.join("d")).unwrap_err().kind(),
        std::io::ErrorKind::AlreadyExists
    );
    assert_eq!(
        std::fs::metadata(mnt.join("nosuch")).unwrap_err().kind(),
        std::io::ErrorKind::NotFound
    );
    node.ok(&["umount", "tr"]);
    node.ok(&["mount", "tr"]);
    assert_eq!(std::fs::read(mnt.join("d/big")).unwrap(), data);
    assert_eq!(std::fs::read(mnt.join("renamed")).unwrap(), b"inline");
    std::fs::remove_file(mnt.join("d/big")).unwrap();
    std::fs::remove_dir(mnt.join("d")).unwrap();
    node.ok(&["umount", "tr"]);
    node.ok(&["fsck", "tr"]);
}

/// `tessera forward-request` (what another node's CLI runs through the remote shell to
/// reach the file system manager) relays one request and its answer frame by frame,
/// answers an error frame when the daemon is down, and refuses garbage by name.
#[test]
fn forward_request_relays_one_answer_and_refuses_garbage() {
    use std::io::Write;
    let relay = |node: &Node, input: &[u8]| {
        let mut child = std::process::Command::new(BIN)
            .arg("forward-request")
            .env("TESSERA_HOME", node.home())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().unwrap()
    };
    let mut node = Node::new();
    node.ok(&["cluster", "create", "--name", "fwd"]);
    let down = relay(&node, b"\"Ping\"\n");
    let said = String::from_utf8_lossy(&down.stdout);
    assert!(down.status.success(), "{down:?}");
    assert!(
        said.starts_with("{\"Err\":") && said.contains("not running"),
        "{said}"
    );
    node.ok(&["startup"]);
    node.started = true;
    let up = relay(&node, b"\"Ping\"\n");
    let said = String::from_utf8_lossy(&up.stdout);
    assert!(up.status.success(), "{up:?}");
    assert!(
        said.contains("\"Pong\"") && said.lines().count() == 1,
        "{said}"
    );
    let missing = relay(&node, b"{\"Df\":{\"name\":\"nosuch\"}}\n");
    let said = String::from_utf8_lossy(&missing.stdout);
    assert!(
        said.starts_with("{\"Err\":") && said.contains("nosuch"),
        "{said}"
    );
    for garbage in [&b"not json\n"[..], b"", b"{\"Df\":"] {
        let out = relay(&node, garbage);
        let why = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{garbage:?} relayed");
        assert!(
            why.contains("forward-request")
                && (why.contains("frame") || why.contains("no request")),
            "{why}"
        );
    }
}
