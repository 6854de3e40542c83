//! NVMe/TCP end to end through the CLI: drive servers as separate processes on loopback,
//! a node that discovers and connects to them, lists paths with their ANA states, builds
//! NSDs and a declustered array on remote namespaces, and keeps serving I/O when a path or
//! a whole drive server dies.

mod common;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use common::*;

const NS_BYTES: u64 = 256 << 20;

/// A `tessera drive-server` process; killed (SIGKILL, like a power loss of the enclosure)
/// when dropped.
struct DriveServer {
    child: Child,
    config: PathBuf,
}

impl DriveServer {
    fn start(config: &Path) -> DriveServer {
        DriveServer::start_with(config, &[])
    }

    fn start_with(config: &Path, extra: &[&str]) -> DriveServer {
        let child = spawn_drive_server_with(config, extra);
        DriveServer {
            child,
            config: config.to_path_buf(),
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for DriveServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One port in nvmetcli's saveconfig layout with the given ANA group states.
fn port_json(portid: u16, port: u16, subnqns: &[&str], ana: &[(u32, &str)]) -> String {
    let groups: Vec<String> = ana
        .iter()
        .map(|(g, st)| format!(r#"{{"grpid":{g},"ana":{{"state":"{st}"}}}}"#))
        .collect();
    let subs: Vec<String> = subnqns.iter().map(|n| format!("\"{n}\"")).collect();
    format!(
        r#"{{"portid":{portid},"addr":{{"trtype":"tcp","adrfam":"ipv4","traddr":"127.0.0.1","trsvcid":"{port}"}},"subsystems":[{}],"ana_groups":[{}],"referrals":[]}}"#,
        subs.join(","),
        groups.join(",")
    )
}

/// A subsystem whose namespace `i` (nsid i+1) is `devices[i]` in ANA group `groups[i]`.
fn subsystem_json(nqn: &str, devices: &[PathBuf], groups: &[u32], allowed: &[&str]) -> String {
    let namespaces: Vec<String> = devices
        .iter()
        .zip(groups)
        .enumerate()
        .map(|(i, (d, g))| {
            format!(
                r#"{{"nsid":{},"enable":1,"device":{{"path":"{}"}},"ana_grpid":{g}}}"#,
                i + 1,
                d.display()
            )
        })
        .collect();
    let hosts: Vec<String> = allowed.iter().map(|h| format!("\"{h}\"")).collect();
    format!(
        r#"{{"nqn":"{nqn}","attr":{{"allow_any_host":"0","serial":"T{}"}},"allowed_hosts":[{}],"namespaces":[{}]}}"#,
        nqn.len(),
        hosts.join(","),
        namespaces.join(",")
    )
}

fn write_config(path: &Path, hosts: &[&str], ports: &[String], subsystems: &[String]) {
    let hosts: Vec<String> = hosts
        .iter()
        .map(|h| format!(r#"{{"nqn":"{h}"}}"#))
        .collect();
    let text = format!(
        r#"{{"hosts":[{}],"ports":[{}],"subsystems":[{}]}}"#,
        hosts.join(","),
        ports.join(","),
        subsystems.join(",")
    );
    std::fs::write(path, text).expect("write config");
}

/// The `nvme list -Y` rows of one namespace: (path address, ANA state, state).
fn paths_of(node: &Node, namespace: &str) -> Vec<(String, String, String)> {
    let listing = node.ok(&["nvme", "list", "-Y"]);
    listing
        .lines()
        .filter(|l| !l.contains(":HEADER:"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            // nvme::0:1:::namespace:sizeBytes:nsid:subnqn:nguid:controller:traddr:...
            (f.get(6) == Some(&namespace)).then(|| {
                (
                    f[12].replace("%3A", ":"),
                    f[14].to_string(),
                    f[15].to_string(),
                )
            })
        })
        .collect()
}

fn wait_for(what: &str, secs: u64, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn two_controllers_multipath_nsds_and_path_loss() {
    if !fuse_usable() {
        return;
    }
    let mut node = Node::new().start();
    let hostnqn = node.ok(&["nvme", "show-hostnqn"]).trim().to_string();
    assert!(
        hostnqn.starts_with("nqn.2014-08.org.nvmexpress:uuid:"),
        "{hostnqn}"
    );
    let nqn = "nqn.2026-11.io.tessera:array1";
    let devices: Vec<PathBuf> = (1..=2)
        .map(|i| node.drive(&format!("vol{i}"), NS_BYTES))
        .collect();
    let subsystem = subsystem_json(nqn, &devices, &[1, 2], &[&hostnqn]);
    // Two controllers of one array as two processes: A owns ANA group 1, B group 2.
    let (pa, pb) = (free_port(), free_port());
    let conf_a = node.path("ctrl-a.json");
    let conf_b = node.path("ctrl-b.json");
    let ana_a = [(1, "optimized"), (2, "non-optimized")];
    let ana_b = [(1, "non-optimized"), (2, "optimized")];
    write_config(
        &conf_a,
        &[&hostnqn],
        &[port_json(1, pa, &[nqn], &ana_a)],
        std::slice::from_ref(&subsystem),
    );
    write_config(
        &conf_b,
        &[&hostnqn],
        &[port_json(2, pb, &[nqn], &ana_b)],
        &[subsystem],
    );
    let mut ctrl_a = DriveServer::start(&conf_a);
    let _ctrl_b = DriveServer::start(&conf_b);

    let log = node.ok(&[
        "nvme",
        "discover",
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-s",
        &pa.to_string(),
    ]);
    assert!(log.contains(nqn), "{log}");
    assert!(log.contains(&format!("trsvcid: {pa}")), "{log}");

    // Bad input first: a subsystem that does not exist, a host that is not allowed.
    let e = node.fails(&[
        "nvme",
        "connect",
        "-t",
        "tcp",
        "-n",
        "nqn.2026-11.io.tessera:nope",
        "-a",
        "127.0.0.1",
        "-s",
        &pa.to_string(),
    ]);
    assert!(e.contains("nqn.2026-11.io.tessera:nope"), "{e}");
    let e = node.fails(&[
        "nvme",
        "connect",
        "-t",
        "tcp",
        "-n",
        nqn,
        "-a",
        "127.0.0.1",
        "-s",
        &pa.to_string(),
        "-q",
        "nqn.2026-11.io.tessera:intruder",
    ]);
    assert!(e.contains("intruder"), "{e}");

    for port in [pa, pb] {
        node.ok(&[
            "nvme",
            "connect",
            "-t",
            "tcp",
            "-n",
            nqn,
            "-a",
            "127.0.0.1",
            "-s",
            &port.to_string(),
            "-l",
            "30",
            "-c",
            "1",
        ]);
    }
    let table = node.ok(&["nvme", "list"]);
    assert!(
        table.contains("nvme0n1") && table.contains("nvme0n2"),
        "{table}"
    );
    let paths = paths_of(&node, "nvme0n1");
    assert_eq!(paths.len(), 2, "{paths:?}");
    let state_at = |paths: &[(String, String, String)], port: u16| {
        paths
            .iter()
            .find(|p| p.0.ends_with(&format!(":{port}")))
            .map(|p| p.1.clone())
            .unwrap_or_default()
    };
    assert_eq!(state_at(&paths, pa), "optimized", "{paths:?}");
    assert_eq!(state_at(&paths, pb), "non-optimized", "{paths:?}");

    // Two NSDs on the remote namespaces, a file system, data through the mount.
    let stanza = node.path("remote.stanza");
    std::fs::write(
        &stanza,
        "%nsd: device=nvme:nvme0n1 nsd=rem1 usage=dataAndMetadata failureGroup=1 pool=system\n\
         %nsd: device=nvme:nvme0n2 nsd=rem2 usage=dataAndMetadata failureGroup=2 pool=system\n",
    )
    .unwrap();
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = create_and_mount(&mut node, "rfs", &stanza);
    let before = pattern(24 << 20, 1);
    std::fs::write(mnt.join("before"), &before).unwrap();

    // Kill controller A (the optimized path of nvme0n1) in the middle of a write stream.
    let writer_mnt = mnt.clone();
    let writer = std::thread::spawn(move || {
        for i in 0..24u64 {
            let data = pattern(1 << 20, 100 + i);
            let f = writer_mnt.join(format!("during{i}"));
            std::fs::write(&f, &data).expect("write during path loss");
            let file = std::fs::File::open(&f).unwrap();
            file.sync_all().expect("fsync during path loss");
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    ctrl_a.kill();
    writer.join().expect("no I/O error while a path is down");
    for i in 0..24u64 {
        assert_eq!(
            std::fs::read(mnt.join(format!("during{i}"))).unwrap(),
            pattern(1 << 20, 100 + i)
        );
    }
    let down = paths_of(&node, "nvme0n1");
    assert_ne!(
        down.iter()
            .find(|p| p.0.ends_with(&format!(":{pa}")))
            .map(|p| p.2.as_str()),
        Some("live"),
        "{down:?}"
    );

    // Controller A comes back: the path reconnects by itself and is optimized again.
    let _ctrl_a = DriveServer::start(&ctrl_a.config.clone());
    wait_for("path A to reconnect", 30, || {
        paths_of(&node, "nvme0n1")
            .iter()
            .any(|p| p.0.ends_with(&format!(":{pa}")) && p.2 == "live" && p.1 == "optimized")
    });

    // Restart of the node daemon: connections come back from nvme.json, data is intact.
    node.ok(&["umount", "rfs"]);
    node.ok(&["shutdown"]);
    node.ok(&["startup"]);
    assert_eq!(paths_of(&node, "nvme0n1").len(), 2);
    node.ok(&["mount", "rfs"]);
    assert_eq!(std::fs::read(mnt.join("before")).unwrap(), before);
    node.ok(&["umount", "rfs"]);
    let fsck = node.ok(&["fsck", "rfs", "-n"]);
    assert!(fsck.to_lowercase().contains("clean"), "{fsck}");

    // A namespace in use by an NSD is still listed after disconnect of one path only.
    node.ok(&[
        "nvme",
        "disconnect",
        "-n",
        nqn,
        "-a",
        "127.0.0.1",
        "-s",
        &pb.to_string(),
    ]);
    assert_eq!(paths_of(&node, "nvme0n1").len(), 1);
}

#[test]
fn declustered_array_over_three_drive_servers_survives_one_server_loss() {
    if !fuse_usable() {
        return;
    }
    let mut node = Node::new().start();
    let hostnqn = node.ok(&["nvme", "show-hostnqn"]).trim().to_string();
    let mut servers = Vec::new();
    let mut ports = Vec::new();
    for j in 1..=3 {
        let nqn = format!("nqn.2026-11.io.tessera:jbof{j}");
        let devices: Vec<PathBuf> = (1..=4)
            .map(|i| node.drive(&format!("jbof{j}-slot{i}"), NS_BYTES))
            .collect();
        let port = free_port();
        let conf = node.path(&format!("jbof{j}.json"));
        write_config(
            &conf,
            &[&hostnqn],
            &[port_json(1, port, &[&nqn], &[(1, "optimized")])],
            &[subsystem_json(&nqn, &devices, &[1, 1, 1, 1], &[&hostnqn])],
        );
        servers.push(DriveServer::start(&conf));
        ports.push(port);
    }
    // I/O fails fast (-f) so the array, not the host, rides out a dead enclosure, while the
    // paths keep reconnecting (-l) and come back by themselves with the enclosure.
    for port in &ports {
        node.ok(&[
            "nvme",
            "connect-all",
            "-t",
            "tcp",
            "-a",
            "127.0.0.1",
            "-s",
            &port.to_string(),
            "-l",
            "120",
            "-f",
            "2",
            "-c",
            "1",
        ]);
    }
    let mut stanza = String::new();
    for j in 0..3 {
        for i in 1..=4 {
            stanza += &format!(
                "%pdisk: pdisk=j{j}s{i} device=nvme:nvme{j}n{i} enclosure=jbof{j} slot={i}\n"
            );
        }
    }
    let pdisks = node.path("pdisks.stanza");
    std::fs::write(&pdisks, stanza).unwrap();
    node.ok(&["da", "create", "da1", "-F", s(&pdisks)]);
    node.ok(&[
        "vdisk",
        "create",
        "vd1",
        "--da",
        "da1",
        "--code",
        "4+2p",
        "--block-size",
        "1M",
        "--size",
        "70%",
    ]);
    let nsd = node.path("vd.stanza");
    std::fs::write(
        &nsd,
        "%nsd: device=vdisk:vd1 nsd=vd1 usage=dataAndMetadata\n",
    )
    .unwrap();
    node.ok(&["nsd", "create", "-F", s(&nsd)]);
    let mnt = create_and_mount(&mut node, "gfs", &nsd);
    let data = pattern(16 << 20, 7);
    std::fs::write(mnt.join("f"), &data).unwrap();
    std::fs::File::open(mnt.join("f"))
        .unwrap()
        .sync_all()
        .unwrap();

    servers[1].kill();
    // Reads and new writes go on with one enclosure gone.
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), data);
    let more = pattern(8 << 20, 8);
    std::fs::write(mnt.join("g"), &more).unwrap();
    std::fs::File::open(mnt.join("g"))
        .unwrap()
        .sync_all()
        .unwrap();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    assert_eq!(std::fs::read(mnt.join("g")).unwrap(), more);
    let pd = node.ok(&["pdisk", "ls", "--not-ok"]);
    assert!(
        pd.contains("j1s1"),
        "the lost enclosure's pdisks are not ok:\n{pd}"
    );
    // The enclosure comes back: its paths reconnect without a new `nvme connect`, the
    // array finds its pdisks reachable again and catches up the writes they missed.
    let conf = servers[1].config.clone();
    servers[1] = DriveServer::start(&conf);
    wait_for("the enclosure's paths to reconnect", 30, || {
        (1..=4).all(|i| {
            paths_of(&node, &format!("nvme1n{i}"))
                .iter()
                .any(|(_, _, state)| state == "live")
        })
    });
    println!("{}", node.ok(&["pdisk", "ls"]));
    let deadline = Instant::now() + Duration::from_secs(90);
    while node.ok(&["pdisk", "ls", "--not-ok"]).contains("j1s") {
        assert!(
            Instant::now() < deadline,
            "the enclosure's pdisks did not come back into service:\n{}\n{}\npdisk events:\n{}",
            node.ok(&["pdisk", "ls"]),
            node.ok(&["da", "ls"]),
            pdisk_events(&node)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Now another enclosure goes: what was written during the first outage must be on the
    // pdisks that came back.
    servers[2].kill();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    assert_eq!(std::fs::read(mnt.join("g")).unwrap(), more);
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), data);
}

/// Reservations with Persist Through Power Loss are on stable storage when their command
/// completes: a drive server killed with SIGKILL at random moments, while a host keeps
/// replacing its key, comes back with the last acknowledged key (or the one in flight when
/// it died), still holding the reservation that fences the other host.
#[test]
fn ptpl_reservations_survive_kill_9_of_the_drive_server() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use tessera_drive::BlockDevice;
    use tessera_nvme::host::{ConnectOptions, Host, HostIdentity, MultipathNamespace};
    use tessera_nvme::wire::reservation::{AcquireAction, RegisterAction, ReservationType};

    const SUBNQN: &str = "nqn.2024-01.io.tessera:ptpl-jbof";
    let dir = tempfile::tempdir().expect("tempdir");
    let drive = dir.path().join("d1.img");
    std::fs::File::create(&drive)
        .and_then(|f| f.set_len(NS_BYTES))
        .expect("drive file");
    let hosts = [
        "nqn.2024-01.io.tessera:ptpl-a",
        "nqn.2024-01.io.tessera:ptpl-b",
    ];
    let port = free_port();
    let config = dir.path().join("jbof.json");
    write_config(
        &config,
        &hosts,
        &[port_json(1, port, &[SUBNQN], &[(1, "optimized")])],
        &[subsystem_json(SUBNQN, &[drive], &[1], &hosts)],
    );
    // The layout of write_config, with the state directory added.
    let text = std::fs::read_to_string(&config).expect("read config");
    let state = dir.path().join("state");
    let text = format!(
        r#"{},"tessera":{{"state_dir":"{}"}}}}"#,
        text.trim_end().trim_end_matches('}'),
        state.display()
    );
    std::fs::write(&config, text).expect("write config");
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let connect = |tag: u8| -> (Host, Arc<MultipathNamespace>) {
        let host = Host::new(HostIdentity {
            nqn: hosts[usize::from(tag)].to_string(),
            id: [tag + 1; 16],
        });
        host.connect(ConnectOptions {
            ctrl_loss_tmo: Duration::from_secs(1),
            reconnect_delay: Duration::from_millis(100),
            ..ConnectOptions::new(addr, SUBNQN)
        })
        .expect("connect");
        let ns = host.namespace("nvme0n1").expect("namespace");
        (host, ns)
    };
    let fenced = |ns: &MultipathNamespace| {
        let block = tessera_drive::AlignedBuf::zeroed(4096);
        let err = ns
            .write_at(&block, 0)
            .expect_err("the fenced host cannot write");
        assert!(MultipathNamespace::is_reservation_conflict(&err), "{err}");
    };
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    println!("kill points from seed {seed}");
    let mut x = seed;
    let mut acked = 1u64;
    for round in 0..5 {
        let mut server = DriveServer::start(&config);
        let (a, ns_a) = connect(0);
        let (b, ns_b) = connect(1);
        if round == 0 {
            ns_a.reservation_register(RegisterAction::Register, 0, acked, false, Some(true))
                .expect("register with PTPL");
            ns_a.reservation_acquire(
                AcquireAction::Acquire,
                ReservationType::WriteExclusive,
                acked,
                0,
            )
            .expect("acquire");
            ns_b.reservation_register(RegisterAction::Register, 0, 0xb, false, None)
                .expect("register b");
            ns_a.reservation_acquire(
                AcquireAction::Preempt,
                ReservationType::WriteExclusive,
                acked,
                0xb,
            )
            .expect("fence b");
        } else {
            let report = ns_a.reservation_report().expect("report");
            assert_eq!(
                (report.regctl, report.ptpls),
                (1, 1),
                "round {round}: {report:?}"
            );
            assert_eq!(report.rtype, ReservationType::WriteExclusive as u8);
            let key = report.registrants[0].rkey;
            assert!(
                key == acked || key == acked + 1,
                "round {round}: key {key} after the kill, last acknowledged {acked}"
            );
            assert!(report.registrants[0].holds_reservation);
            println!(
                "round {round}: key {key} after the restart, {acked} acknowledged before the kill"
            );
            acked = key;
        }
        fenced(&ns_b);
        // Replace the key again and again until the server dies under the host.
        let last = Arc::new(AtomicU64::new(acked));
        let replacer = {
            let (ns, last) = (Arc::clone(&ns_a), Arc::clone(&last));
            std::thread::spawn(move || loop {
                let k = last.load(Ordering::SeqCst);
                if ns
                    .reservation_register(RegisterAction::Replace, k, k + 1, false, None)
                    .is_err()
                {
                    break;
                }
                last.store(k + 1, Ordering::SeqCst);
            })
        };
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        std::thread::sleep(Duration::from_millis(20 + x % 180));
        server.kill();
        replacer.join().expect("replacer");
        acked = last.load(Ordering::SeqCst);
        assert!(
            acked > 1,
            "round {round}: no key change completed before the kill"
        );
        a.disconnect_all();
        b.disconnect_all();
    }
}

/// Both streams of a command that must succeed.
fn ok_all(node: &Node, args: &[&str]) -> String {
    let out = node.run(args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "tessera {args:?} failed:\n{text}");
    text
}

/// `nvme list -Y` as (local name, stable id, subsystem NQN, path states).
fn namespaces(node: &Node) -> Vec<(String, String, String, Vec<String>)> {
    let mut rows: Vec<(String, String, String, Vec<String>)> = Vec::new();
    for l in node.ok(&["nvme", "list", "-Y"]).lines() {
        if l.contains(":HEADER:") {
            continue;
        }
        let f: Vec<&str> = l.split(':').collect();
        let (name, nqn, id) = (f[6], f[9].replace("%3A", ":"), f[f.len() - 2]);
        match rows.iter_mut().find(|r| r.0 == name) {
            Some(r) => r.3.push(f[15].to_string()),
            None => rows.push((name.into(), id.into(), nqn, vec![f[15].to_string()])),
        }
    }
    rows
}

fn connect(node: &Node, nqn: &str, port: u16) -> String {
    ok_all(
        node,
        &[
            "nvme",
            "connect",
            "-t",
            "tcp",
            "-n",
            nqn,
            "-a",
            "127.0.0.1",
            "-s",
            &port.to_string(),
            "-l",
            "3",
            "-c",
            "1",
        ],
    )
}

#[test]
fn stable_namespace_names_survive_reconnects_and_connect_works_after_ctrl_loss_tmo() {
    if !fuse_usable() {
        return;
    }
    let mut node = Node::new().start();
    let hostnqn = node.ok(&["nvme", "show-hostnqn"]).trim().to_string();
    let (nqn1, nqn2) = (
        "nqn.2026-11.io.tessera:first",
        "nqn.2026-11.io.tessera:second",
    );
    let d1 = node.drive("first", NS_BYTES);
    let d2 = node.drive("second", NS_BYTES);
    let port = free_port();
    let conf = node.path("server.json");
    write_config(
        &conf,
        &[&hostnqn],
        &[port_json(1, port, &[nqn1, nqn2], &[(1, "optimized")])],
        &[
            subsystem_json(nqn1, &[d1], &[1], &[&hostnqn]),
            subsystem_json(nqn2, &[d2], &[1], &[&hostnqn]),
        ],
    );
    let mut server = DriveServer::start(&conf);
    connect(&node, nqn1, port);
    connect(&node, nqn2, port);
    let listed = namespaces(&node);
    let first = listed.iter().find(|r| r.2 == nqn1).expect("first").clone();
    assert_eq!(first.0, "nvme0n1", "{listed:?}");
    assert!(first.1.starts_with("eui."), "{listed:?}");
    let table = node.ok(&["nvme", "list"]);
    assert!(table.contains(&first.1), "{table}");

    // NSDs named by the counter names are recorded by their stable names.
    let stanza = node.path("nvme.stanza");
    std::fs::write(
        &stanza,
        "%nsd: device=nvme:nvme0n1 nsd=n1 usage=dataAndMetadata failureGroup=1 pool=system\n\
         %nsd: device=nvme:nvme1n1 nsd=n2 usage=dataAndMetadata failureGroup=2 pool=system\n",
    )
    .unwrap();
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let nsds = node.ok(&["nsd", "ls", "-m"]);
    assert!(nsds.contains(&format!("nvme:{}", first.1)), "{nsds}");
    let mnt = create_and_mount(&mut node, "nfs", &stanza);
    let data = pattern(4 << 20, 5);
    std::fs::write(mnt.join("f"), &data).unwrap();
    node.ok(&["umount", "nfs"]);

    // Reconnect in the other order and restart: the counters now point elsewhere.
    node.ok(&["nvme", "disconnect-all"]);
    connect(&node, nqn2, port);
    connect(&node, nqn1, port);
    node.ok(&["shutdown"]);
    node.ok(&["startup"]);
    let listed = namespaces(&node);
    let now = listed.iter().find(|r| r.2 == nqn1).expect("first").clone();
    assert_ne!(now.0, first.0, "the local name did not change: {listed:?}");
    assert_eq!(now.1, first.1, "{listed:?}");
    node.ok(&["mount", "nfs"]);
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), data);
    node.ok(&["umount", "nfs"]);

    // The drive server goes away for longer than ctrl_loss_tmo: the paths give up.
    server.kill();
    wait_for("the paths to give up", 30, || {
        namespaces(&node)
            .iter()
            .all(|r| r.3.is_empty() || r.3 == [""])
    });
    let table = node.ok(&["nvme", "list"]);
    assert!(table.contains("no path"), "{table}");
    let e = node.fails(&[
        "nvme",
        "discover",
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-s",
        &port.to_string(),
    ]);
    let addr = format!("127.0.0.1:{port}");
    assert_eq!(e.matches(&addr).count(), 1, "the address once: {e}");
    // Still down: connect tries (and says why it fails), it does not claim to be connected.
    let e = node.fails(&[
        "nvme",
        "connect",
        "-t",
        "tcp",
        "-n",
        nqn1,
        "-a",
        "127.0.0.1",
        "-s",
        &port.to_string(),
    ]);
    assert!(!e.contains("already connected"), "{e}");
    assert_eq!(e.matches(&addr).count(), 1, "the address once: {e}");
    let _server = DriveServer::start(&conf);
    let out = connect(&node, nqn1, port);
    assert!(
        !out.contains("already connected") && out.contains("connected as"),
        "{out}"
    );
    connect(&node, nqn2, port);
    let listed = namespaces(&node);
    let back = listed.iter().find(|r| r.2 == nqn1).expect("first");
    assert_eq!((&back.0, &back.1), (&now.0, &now.1), "{listed:?}");
    assert_eq!(back.3, ["live"], "{listed:?}");
    node.ok(&["mount", "nfs"]);
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), data);
    node.ok(&["umount", "nfs"]);
}

/// Creates file system `name` (1 MiB blocks) on the NSDs of `stanza` and mounts it at the
/// node's `mnt`, which it returns.
fn create_and_mount(node: &mut Node, name: &str, stanza: &Path) -> PathBuf {
    let mnt = node.create_fs(name, stanza, "mnt");
    node.ok(&["mount", name]);
    mnt
}

/// The value of sample `name` with all of `labels` in a Prometheus scrape of `addr`.
fn scraped(addr: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let (status, _, text) = http_get(addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("parses as Prometheus text");
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .find(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            ref other => panic!("{name}: {other:?}"),
        })
}

/// The drive server's `/metrics` (per port and namespace) and the node's NVMe/TCP path
/// metrics move with a file system's writes over NVMe/TCP; the drive server refuses a
/// metrics port already in use, naming the option.
#[test]
fn drive_server_and_host_paths_serve_metrics() {
    if !fuse_usable() {
        return;
    }
    let mut node = Node::new().start();
    let node_metrics = format!("127.0.0.1:{}", free_port());
    node.ok(&["config", "set", &format!("metricsAddress={node_metrics}")]);
    node.ok(&["shutdown"]);
    node.ok(&["startup"]);
    let hostnqn = node.ok(&["nvme", "show-hostnqn"]).trim().to_string();
    let nqn = "nqn.2026-11.io.tessera:metrics";
    let port = free_port();
    let conf = node.path("server.json");
    write_config(
        &conf,
        &[&hostnqn],
        &[port_json(1, port, &[nqn], &[(1, "optimized")])],
        &[subsystem_json(
            nqn,
            &[node.drive("m", NS_BYTES)],
            &[1],
            &[&hostnqn],
        )],
    );
    let server_metrics = format!("127.0.0.1:{}", free_port());
    let _server = DriveServer::start_with(&conf, &["--metrics-address", &server_metrics]);
    let (status, _, body) = http_get(&server_metrics, "/api/v1");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("/metrics"), "{body}");
    let before = scraped(
        &server_metrics,
        "tessera_drive_server_namespace_io_bytes_total",
        &[("subsystem", nqn), ("nsid", "1"), ("op", "write")],
    )
    .expect("a sample per namespace before any I/O");
    assert_eq!(before, 0.0);

    connect(&node, nqn, port);
    let stanza = node.path("nvme.stanza");
    std::fs::write(
        &stanza,
        "%nsd: device=nvme:nvme0n1 nsd=n1 usage=dataAndMetadata\n",
    )
    .unwrap();
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = create_and_mount(&mut node, "mfs", &stanza);
    let data = pattern(4 << 20, 9);
    {
        use std::io::Write;
        let mut f = std::fs::File::create(mnt.join("f")).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
    }
    let written = scraped(
        &server_metrics,
        "tessera_drive_server_namespace_io_bytes_total",
        &[("subsystem", nqn), ("nsid", "1"), ("op", "write")],
    )
    .unwrap();
    assert!(
        written >= data.len() as f64,
        "{written} bytes written to the namespace"
    );
    let port_label = [("port", "1")];
    let open = scraped(
        &server_metrics,
        "tessera_drive_server_connections",
        &port_label,
    )
    .unwrap();
    assert!(open >= 2.0, "admin and I/O queues: {open}");
    let received = scraped(
        &server_metrics,
        "tessera_drive_server_io_bytes_total",
        &[("port", "1"), ("op", "write")],
    )
    .unwrap();
    assert!(received >= written, "port {received}, namespace {written}");

    // The host's side of the same path.
    let path_bytes = scraped(
        &node_metrics,
        "tessera_nvme_path_io_bytes_total",
        &[("namespace", "nvme0n1"), ("subsystem", nqn)],
    )
    .unwrap();
    assert!(path_bytes >= data.len() as f64, "{path_bytes}");
    let state = scraped(
        &node_metrics,
        "tessera_nvme_path_state",
        &[("namespace", "nvme0n1"), ("ana", "optimized")],
    );
    assert_eq!(state, Some(1.0));
    // The Grafana dashboard's drive-server and path queries use what is exported.
    let node_text = http_get(&node_metrics, "/metrics").2;
    let server_text = http_get(&server_metrics, "/metrics").2;
    for family in grafana_dashboard_metrics() {
        let text = if family.starts_with("tessera_drive_server_") {
            &server_text
        } else if family.starts_with("tessera_nvme_") {
            &node_text
        } else {
            continue;
        };
        assert!(
            described_families(text).contains(&family),
            "{family} is not exported"
        );
    }

    // A second server whose metrics port is taken stops at once, naming the option.
    let port2 = free_port();
    let conf2 = node.path("server2.json");
    write_config(
        &conf2,
        &[&hostnqn],
        &[port_json(1, port2, &[nqn], &[(1, "optimized")])],
        &[subsystem_json(
            nqn,
            &[node.drive("m2", NS_BYTES)],
            &[1],
            &[&hostnqn],
        )],
    );
    let out = std::process::Command::new(BIN)
        .args([
            "drive-server",
            "-c",
            s(&conf2),
            "--metrics-address",
            &server_metrics,
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--metrics-address") && err.contains(&server_metrics),
        "{err}"
    );
    node.ok(&["umount", "mfs"]);
}

/// `thinDiskType=nvme` on a namespace reached over NVMe/TCP: blocks freed by a delete go
/// back to the drive as Dataset Management deallocates, which the drive server turns into
/// holes in its backing file; what is written afterwards reads back.
#[test]
fn thin_nvme_nsd_deallocates_freed_blocks_on_the_drive_server() {
    if !fuse_usable() {
        return;
    }
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    const MIB: u64 = 1 << 20;
    let mut node = Node::new().start();
    let hostnqn = node.ok(&["nvme", "show-hostnqn"]).trim().to_string();
    let nqn = "nqn.2026-11.io.tessera:thin";
    let port = free_port();
    let conf = node.path("server.json");
    let backing = node.drive("thin", NS_BYTES);
    write_config(
        &conf,
        &[&hostnqn],
        &[port_json(1, port, &[nqn], &[(1, "optimized")])],
        &[subsystem_json(
            nqn,
            std::slice::from_ref(&backing),
            &[1],
            &[&hostnqn],
        )],
    );
    let _server = DriveServer::start(&conf);
    connect(&node, nqn, port);
    let stanza = node.path("nvme.stanza");
    std::fs::write(
        &stanza,
        "%nsd: device=nvme:nvme0n1 nsd=thin1 usage=dataAndMetadata thinDiskType=nvme\n",
    )
    .unwrap();
    node.ok(&["nsd", "create", "-F", s(&stanza)]);
    let mnt = create_and_mount(&mut node, "tfs", &stanza);
    let allocated = || std::fs::metadata(&backing).unwrap().blocks() * 512;
    let write = |name: &str, bytes: u64, seed: u64| {
        let mut f = std::fs::File::create(mnt.join(name)).unwrap();
        f.write_all(&pattern(bytes as usize, seed)).unwrap();
        f.sync_all().unwrap();
    };
    let want = 48 * MIB;
    write("big", want, 3);
    let before = allocated();
    std::fs::remove_file(mnt.join("big")).unwrap();
    // The release reaches the drive once the delete is durable: an fsync of another file
    // commits it; the kernel may close the deleted file a moment after the unlink.
    let mut freed = 0;
    for i in 0..30 {
        write(&format!("marker{i}"), MIB, i);
        freed = before.saturating_sub(allocated());
        if freed >= want - 8 * MIB {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(
        freed >= want - 8 * MIB,
        "{} MiB of the drive server's file given back after deleting {} MiB",
        freed / MIB,
        want / MIB
    );
    let stats = node.ok(&["diag", "--stats"]);
    assert!(
        stats.contains("given back to thin-provisioned disks"),
        "{stats}"
    );
    // The freed blocks are the file system's again and hold what is written next.
    write("again", want, 5);
    assert!(std::fs::read(mnt.join("again")).unwrap() == pattern(want as usize, 5));
}

/// The state changes of pdisks in the daemon's log, for failure messages: why a pdisk went
/// where it went.
fn pdisk_events(node: &Node) -> String {
    let log = std::fs::read_to_string(node.home().join("log/daemon.log")).unwrap_or_default();
    log.lines()
        .filter(|l| l.contains("pdisk ") && l.contains(" -> "))
        .collect::<Vec<_>>()
        .join("\n")
}
