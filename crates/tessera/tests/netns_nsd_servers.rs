//! NSD servers in network namespaces: a node that does not reach the drives mounts a file
//! system whose NSDs two other nodes serve, keeps working through the death of the server
//! it uses, goes back to it when it returns, and an incarnation the cluster gave up on is
//! refused by the servers.
//!
//! Every namespace sees the drive files (they are files of this machine), so the client
//! is made one without drive access the way an administrator would: `useNSDserver=always`
//! on that node.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::netns::{
    manager, netns_usable, states, tessera_ok, up_with_drives, wait_for, y_rows, Cluster, SETTLE,
};

/// `nsd ls -m -Y` on node `k`: NSD name -> (access, paths as `server=ana/state;...`).
fn access(c: &Cluster, k: u32) -> BTreeMap<String, (String, String)> {
    let out = tessera_ok(c, k, &["nsd", "ls", "-m", "-Y"]);
    y_rows(&out, "nsd:access:")
        .into_iter()
        .map(|r| {
            (
                r["diskName"].clone(),
                (
                    r["access"].clone(),
                    r.get("paths").cloned().unwrap_or_default(),
                ),
            )
        })
        .collect()
}

/// The content of workload file `i` at generation `g`: 64 KiB naming both.
fn content(i: u32, g: u32) -> Vec<u8> {
    (0..65_536u32)
        .map(|b| (b.wrapping_mul(2_654_435_761) ^ i.wrapping_mul(97) ^ g.wrapping_mul(13)) as u8)
        .collect()
}

struct Workload {
    stop: Arc<AtomicBool>,
    /// Rounds completed so far.
    completed: Arc<AtomicUsize>,
    /// Completed rounds: (file, generation) fsynced and read back.
    done: Arc<Mutex<BTreeMap<u32, u32>>>,
    errors: Arc<Mutex<Vec<String>>>,
    /// Longest time between two completed rounds.
    longest: Arc<Mutex<Duration>>,
    thread: std::thread::JoinHandle<()>,
}

/// Writes, fsyncs and reads back 64 KiB files under `dir` in a loop until stopped.
fn start_workload(dir: PathBuf) -> Workload {
    let stop = Arc::new(AtomicBool::new(false));
    let completed = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&completed);
    let done: Arc<Mutex<BTreeMap<u32, u32>>> = Arc::default();
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let longest: Arc<Mutex<Duration>> = Arc::default();
    let (s, d, e, l) = (
        Arc::clone(&stop),
        Arc::clone(&done),
        Arc::clone(&errors),
        Arc::clone(&longest),
    );
    let thread = std::thread::spawn(move || {
        let mut last = Instant::now();
        let mut round = 0u32;
        while !s.load(Ordering::Relaxed) {
            let (i, g) = (round % 64, round / 64);
            let path = dir.join(format!("w{i:02}"));
            let data = content(i, g);
            let result = (|| -> std::io::Result<()> {
                let mut f = std::fs::File::create(&path)?;
                f.write_all(&data)?;
                f.sync_all()?;
                let mut back = Vec::new();
                std::fs::File::open(&path)?.read_to_end(&mut back)?;
                if back != data {
                    return Err(std::io::Error::other(format!(
                        "{} reads back wrong",
                        path.display()
                    )));
                }
                Ok(())
            })();
            match result {
                Ok(()) => {
                    d.lock().unwrap().insert(i, g);
                    count.fetch_add(1, Ordering::Relaxed);
                }
                Err(err) => e.lock().unwrap().push(format!("round {round}: {err}")),
            }
            let now = Instant::now();
            let mut longest = l.lock().unwrap();
            *longest = (*longest).max(now - last);
            last = now;
            round += 1;
        }
    });
    Workload {
        stop,
        completed,
        done,
        errors,
        longest,
        thread,
    }
}

impl Workload {
    fn rounds(&self) -> usize {
        self.completed.load(Ordering::Relaxed)
    }

    /// Stops it; returns the files with their last generation and the longest pause.
    fn finish(self) -> (BTreeMap<u32, u32>, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        let errors = self.errors.lock().unwrap();
        assert!(errors.is_empty(), "the workload saw errors: {errors:?}");
        let done = self.done.lock().unwrap().clone();
        let longest = *self.longest.lock().unwrap();
        (done, longest)
    }
}

fn verify(dir: &Path, files: &BTreeMap<u32, u32>) {
    for (i, g) in files {
        let back = std::fs::read(dir.join(format!("w{i:02}"))).unwrap();
        assert!(
            back == content(*i, *g),
            "w{i:02} generation {g} does not verify"
        );
    }
}

fn log_of(c: &Cluster, k: u32) -> String {
    std::fs::read_to_string(c.base.join(format!("node{k}/home/log/daemon.log"))).unwrap_or_default()
}

/// Two NSD servers and a client without drive access: the client creates, mounts and
/// uses a file system through them; the server it uses for one NSD is killed under a
/// fsyncing, verifying workload, which goes on through the other server after a pause
/// under 10 s with no error; the killed server comes back and the client's path to it is
/// live and preferred again; a client incarnation the cluster gave up on (its daemon
/// stopped past the lease) is refused by the servers, and its next incarnation mounts
/// and reads every byte back; `nsd change -F` moves an NSD to one server under load.
#[test]
fn a_client_without_drives_works_through_two_nsd_servers_and_their_failures() {
    if !netns_usable() {
        return;
    }
    let c = up_with_drives(3);
    // The server killed below should not also be the cluster manager, so that what is
    // measured is the NSD path failover and not a new manager's election.
    let m = manager(&c, 1).expect("a cluster manager");
    let (a, b) = if m == 1 { (2, 1) } else { (1, 2) };
    let (na, nb) = (format!("node{a}"), format!("node{b}"));
    tessera_ok(
        &c,
        1,
        &["config", "set", "useNSDserver=always", "-N", "node3"],
    );
    let stanza = c.base.join("servers.stanza");
    let drive = |k: u32| c.base.join(format!("drives/node{k}-d1.img"));
    std::fs::write(
        &stanza,
        format!(
            "%nsd: device={} nsd=sa usage=dataAndMetadata failureGroup=1 servers={na},{nb}\n\
             %nsd: device={} nsd=sb usage=dataAndMetadata failureGroup=2 servers={nb},{na}\n",
            drive(a).display(),
            drive(b).display()
        ),
    )
    .unwrap();
    let stanza = stanza.to_str().unwrap();
    // A server list naming no node of the cluster is refused before anything is written.
    let bad = c.base.join("bad.stanza");
    std::fs::write(
        &bad,
        format!("%nsd: device={} nsd=sx servers=node9\n", drive(3).display()),
    )
    .unwrap();
    let out = common::netns::tessera(&c, 1, &["nsd", "create", "-F", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("node9 is not a node of this cluster"),
        "{err}"
    );

    let created = tessera_ok(&c, a, &["nsd", "create", "-F", stanza]);
    assert!(!created.contains("warning"), "{created}");
    // Both servers serve both NSDs (each asks the configuration by itself).
    let serving = || {
        [a, b].iter().all(|&k| {
            let seen = access(&c, k);
            ["sa", "sb"]
                .iter()
                .all(|n| seen.get(*n).is_some_and(|(how, _)| how == "server node"))
        })
    };
    let started = Instant::now();
    while !serving() {
        if started.elapsed() > SETTLE {
            let logs: Vec<String> = [a, b]
                .iter()
                .flat_map(|&k| {
                    log_of(&c, k)
                        .lines()
                        .filter(|l| l.contains("NSD") || l.contains("nsd"))
                        .map(|l| format!("node{k}: {l}"))
                        .collect::<Vec<_>>()
                })
                .collect();
            panic!(
                "both servers serving both NSDs: not within {SETTLE:?}\n{}",
                logs.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let mnt = c.base.join("node3/mnt/ns1");
    tessera_ok(
        &c,
        3,
        &[
            "fs",
            "create",
            "ns1",
            "-F",
            stanza,
            "-T",
            mnt.to_str().unwrap(),
        ],
    );
    tessera_ok(&c, 3, &["mount", "ns1"]);
    let seen = access(&c, 3);
    assert_eq!(seen["sa"].0, "through servers", "{seen:?}");
    assert!(
        seen["sa"].1.contains(&format!("{na}=optimized/live"))
            && seen["sa"].1.contains(&format!("{nb}=non-optimized/live")),
        "{seen:?}"
    );
    let all = tessera_ok(&c, 3, &["nsd", "ls", "-M"]);
    assert_eq!(
        all.lines().filter(|l| l.contains("server node")).count(),
        4,
        "{all}"
    );

    // Kill the first server of `sa` under the workload.
    let work = start_workload(mnt.clone());
    wait_for("the workload running", SETTLE, || work.rounds() >= 10);
    // The server's I/O history shows the drive I/O it does for the client, naming it.
    let iohist = tessera_ok(&c, a, &["diag", "--iohist"]);
    for rw in ["R", "W"] {
        assert!(
            iohist.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() == 8 && f[1] == rw && f[2] == "sa" && f[6] == "ok" && f[7] == "node3"
            }),
            "no {rw} of sa served for node3 in\n{iohist}"
        );
    }
    c.ok(&["kill", &a.to_string()]);
    let killed = Instant::now();
    let before = work.rounds();
    std::thread::sleep(Duration::from_secs(6));
    wait_for("rounds after the kill", SETTLE, || work.rounds() > before);
    let (files, longest) = work.finish();
    eprintln!(
        "longest pause of the workload around the kill of {na}: {longest:?} ({:?} after it)",
        killed.elapsed()
    );
    assert!(longest < Duration::from_secs(10), "paused {longest:?}");
    verify(&mnt, &files);
    let seen = access(&c, 3);
    assert!(
        seen["sa"].1.contains(&format!("{nb}=non-optimized/live")),
        "{seen:?}"
    );
    // `nsd ls -M` keeps its table for the dead server's rows and says why below it.
    let all = tessera_ok(&c, 3, &["nsd", "ls", "-M"]);
    assert!(
        all.lines()
            .any(|l| l.contains(&format!(" {na} ")) && l.ends_with("node not asked (see below)")),
        "{all}"
    );
    assert!(
        all.contains(&format!(
            "{na} was not asked: the Tessera daemon is not running"
        )),
        "{all}"
    );

    // It comes back: the client's path to it is live again, and preferred.
    c.ok(&["start", &a.to_string()]);
    wait_for("the path to the restarted server", SETTLE, || {
        access(&c, 3)["sa"]
            .1
            .contains(&format!("{na}=optimized/live"))
    });
    let work = start_workload(mnt.clone());
    wait_for("the workload running again", SETTLE, || work.rounds() >= 64);
    let (files, _) = work.finish();
    verify(&mnt, &files);

    // A client incarnation the cluster gives up on: node 3's daemon stopped past its
    // lease. A controller it holds on a server is fenced at the expel (its writes are
    // refused from then on), and its host NQN is refused when it connects again. The
    // daemon's own paths close when it rejoins, so an admin connection of node 3 under
    // the NQN its NSD paths use (its node and epoch) stands for the late writer.
    let epoch = states(&c, 1)["node3"].1.clone();
    let server_log = log_of(&c, a);
    let nqn_of_3 = server_log
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("hostnqn="))
        .find(|n| n.ends_with(&format!(":3:{epoch}")))
        .expect("node 3's host NQN in the server's log")
        .to_string();
    let id = access(&c, 3)["sa"].0.clone();
    assert_eq!(id, "through servers");
    let nguid = tessera_ok(&c, 3, &["nsd", "ls", "-m", "-Y"])
        .lines()
        .find(|l| l.starts_with("nsd:access:") && l.contains(":sa:"))
        .and_then(|l| {
            l.split(':')
                .find(|f| f.starts_with("eui."))
                .map(|f| f[4..].to_string())
        })
        .expect("sa's namespace on node 3");
    let subnqn = format!("nqn.2024-01.io.tessera:nsd:{nguid}");
    let server = c.address(a);
    let connect = |nqn: &str| {
        common::netns::tessera(
            &c,
            3,
            &[
                "nvme", "connect", "-a", &server, "-s", "1192", "-n", &subnqn, "-q", nqn, "-k",
                "60",
            ],
        )
    };
    let out = connect(&nqn_of_3);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pid = std::fs::read_to_string(c.base.join("node3/home/daemon.pid")).unwrap();
    let pid = pid.trim().to_string();
    let signal = |s: &str| {
        assert!(std::process::Command::new("kill")
            .args([s, &pid])
            .status()
            .unwrap()
            .success());
    };
    signal("-STOP");
    wait_for("node 3 expelled", SETTLE, || {
        states(&c, 1)
            .get("node3")
            .is_some_and(|(state, _)| state != "active")
    });
    wait_for("the server fencing node 3's controller", SETTLE, || {
        log_of(&c, a)
            .lines()
            .any(|l| l.contains("host fenced: its writes are refused") && l.contains(&nqn_of_3))
    });
    signal("-CONT");
    wait_for("node 3 active again", SETTLE, || {
        states(&c, 1)
            .get("node3")
            .is_some_and(|(state, e)| state == "active" && *e != epoch)
    });
    let _ = common::netns::tessera(&c, 3, &["nvme", "disconnect", "-n", &subnqn]);
    let out = connect(&nqn_of_3);
    assert!(!out.status.success(), "the old incarnation connected again");
    assert!(
        log_of(&c, a)
            .lines()
            .any(|l| l.contains("fenced host refused") && l.contains(&nqn_of_3)),
        "the server's log does not say it refused {nqn_of_3}"
    );
    // The new incarnation mounts again (the old mount is stale) and reads every byte.
    let _ = std::process::Command::new("umount")
        .args(["-l", mnt.to_str().unwrap()])
        .status();
    // The killed server, started again, mounted ns1 too (`-A yes`), as node 3's client:
    // unmounted everywhere, then mounted on node 3 alone.
    let _ = common::netns::tessera(&c, 3, &["umount", "ns1", "-a"]);
    tessera_ok(&c, 3, &["mount", "ns1"]);
    verify(&mnt, &files);

    // `nsd change -F` [mmchnsd] under load: `sa` is served by the other server alone from
    // now on; the client follows, and the old server stops serving it.
    let change = c.base.join("change.stanza");
    std::fs::write(&change, format!("%nsd: nsd=sa servers={nb}\n")).unwrap();
    let work = start_workload(mnt.clone());
    wait_for("the workload running", SETTLE, || work.rounds() >= 10);
    tessera_ok(&c, 3, &["nsd", "change", "-F", change.to_str().unwrap()]);
    wait_for("the client on the new server list", SETTLE, || {
        access(&c, 3)["sa"].1 == format!("{nb}=optimized/live")
    });
    let before = work.rounds();
    wait_for("rounds after the change", SETTLE, || {
        work.rounds() > before + 10
    });
    let (files, _) = work.finish();
    verify(&mnt, &files);
    assert_eq!(access(&c, a)["sa"].0, "not opened", "{na} still serves sa");
    let listed = tessera_ok(&c, 3, &["nsd", "ls"]);
    assert!(
        listed
            .lines()
            .any(|l| l.contains("sa") && l.trim_end().ends_with(&nb)),
        "{listed}"
    );
    tessera_ok(&c, 3, &["umount", "ns1"]);
    let fsck = tessera_ok(&c, 3, &["fsck", "ns1", "-n"]);
    assert!(fsck.contains(" 0 problems found"), "{fsck}");
}

/// Any-to-any declustered arrays: an array whose pdisks two server nodes reach
/// (`da create --servers`) is served by one of them at a time, with the NSD on its vdisk
/// listing both as NSD servers; a client without drives uses a file system on it, and so
/// does the array's server, through the array open there. `da move` hands it to the other
/// server under a fsyncing, verifying workload on both: the old server's mount goes on
/// through the NSD servers, with no error and its drives free for the new server; a kill -9 of
/// that server then has the cluster manager give it back to the survivor once the dead
/// one is expelled, which resynchronises it and serves it, and the workload goes on with a
/// pause under 10 s and no error; the killed server, restarted, leaves the array alone.
#[test]
fn a_declustered_array_moves_between_servers_and_fails_over_when_its_server_dies() {
    if !netns_usable() {
        return;
    }
    let c = common::netns::up(3, &["--drives", "4", "--size", "1G"]);
    tessera_ok(
        &c,
        1,
        &["config", "set", "useNSDserver=always", "-N", "node3"],
    );
    let pdisks = c.base.join("pd.stanza");
    std::fs::write(&pdisks, c.ok(&["stanza", "pdisk"])).unwrap();
    let pdisks = pdisks.to_str().unwrap();
    let refused = common::netns::tessera(
        &c,
        1,
        &[
            "da",
            "create",
            "dx",
            "-F",
            pdisks,
            "--servers",
            "node2,node3",
        ],
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("must be one of the servers"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    tessera_ok(
        &c,
        1,
        &[
            "da",
            "create",
            "da1",
            "-F",
            pdisks,
            "--servers",
            "node1,node2",
        ],
    );
    tessera_ok(
        &c,
        1,
        &[
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
            "2G",
        ],
    );
    let stanza = c.base.join("v.stanza");
    std::fs::write(
        &stanza,
        "%nsd: device=vdisk:vd1 nsd=v1 usage=dataAndMetadata failureGroup=1 servers=node1,node2\n",
    )
    .unwrap();
    let stanza = stanza.to_str().unwrap();
    // node2 stands by while node1 has the array open, and `nsd create` knows it.
    let created = tessera_ok(&c, 1, &["nsd", "create", "-F", stanza]);
    assert!(!created.contains("warning"), "{created}");
    wait_for("node2 standing by for v1", SETTLE, || {
        access(&c, 2)
            .get("v1")
            .is_some_and(|(how, _)| how.starts_with("standby server"))
    });
    wait_for("node1 serving v1", SETTLE, || {
        access(&c, 1)
            .get("v1")
            .is_some_and(|(how, _)| how == "server node")
    });
    let mnt = c.base.join("node3/mnt/v1fs");
    tessera_ok(
        &c,
        3,
        &[
            "fs",
            "create",
            "v1fs",
            "-F",
            stanza,
            "-B",
            "1M",
            "-T",
            mnt.to_str().unwrap(),
        ],
    );
    tessera_ok(&c, 3, &["mount", "v1fs"]);
    // The array's server mounts it too: it reaches vd1 through the array open here, and
    // through the NSD servers once the array moves away.
    tessera_ok(&c, 1, &["mount", "v1fs"]);
    let on1 = c.base.join("node1/mnt/v1fs/on1");
    std::fs::create_dir(&on1).unwrap();
    let served_by = |k: u32| {
        access(&c, k)
            .get("v1")
            .is_some_and(|(how, _)| how == "server node")
    };

    // A planned move, under load on the client and on the array's server: run on the
    // array's server.
    let work = start_workload(mnt.clone());
    let work1 = start_workload(on1.clone());
    wait_for("the workloads running", SETTLE, || {
        work.rounds() >= 10 && work1.rounds() >= 10
    });
    let elsewhere = common::netns::tessera(&c, 3, &["da", "move", "da1", "--server", "node2"]);
    assert!(
        String::from_utf8_lossy(&elsewhere.stderr).contains("run `tessera da move da1"),
        "{}",
        String::from_utf8_lossy(&elsewhere.stderr)
    );
    tessera_ok(&c, 1, &["da", "move", "da1", "--server", "node2"]);
    wait_for("node2 serving v1", SETTLE, || served_by(2));
    let (before, before1) = (work.rounds(), work1.rounds());
    wait_for("rounds after the move", SETTLE, || {
        work.rounds() > before + 10 && work1.rounds() > before1 + 10
    });
    let (files, longest) = work.finish();
    let (files1, longest1) = work1.finish();
    eprintln!("longest pause around `da move`: {longest:?} on node 3, {longest1:?} on node 1");
    verify(&mnt, &files);
    verify(&on1, &files1);
    assert!(!served_by(1), "node1 still serves v1 after the move");
    assert!(
        log_of(&c, 1).contains("NSD v1: the local path failed")
            && log_of(&c, 1).contains("its declustered array left this node"),
        "node 1's mount did not move to the NSD servers:\n{}",
        log_of(&c, 1)
    );

    // Its server dies: the array fails over to the other one.
    let work = start_workload(mnt.clone());
    wait_for("the workload running", SETTLE, || work.rounds() >= 10);
    c.ok(&["kill", "2"]);
    wait_for("node1 serving v1 again", SETTLE, || served_by(1));
    let before = work.rounds();
    wait_for("rounds after the failover", SETTLE, || {
        work.rounds() > before + 10
    });
    let (files, longest) = work.finish();
    eprintln!("longest pause around the kill of the array's server: {longest:?}");
    assert!(longest < Duration::from_secs(10), "paused {longest:?}");
    verify(&mnt, &files);
    assert!(
        log_of(&c, 1)
            .lines()
            .chain(log_of(&c, 3).lines())
            .any(|l| l
                .contains("declustered array da1: its server node2 was expelled; given to node1")),
        "no failover in the logs"
    );

    // The dead server comes back and leaves the array to node1.
    c.ok(&["start", "2"]);
    wait_for("node2 active", SETTLE, || {
        states(&c, 1)
            .get("node2")
            .is_some_and(|(s, _)| s == "active")
    });
    std::thread::sleep(Duration::from_secs(3));
    assert!(!served_by(2) && served_by(1));
    let listed = tessera_ok(&c, 1, &["da", "ls"]);
    assert!(
        listed.contains("da1") && listed.contains(" ok "),
        "{listed}"
    );
    let listed = tessera_ok(&c, 3, &["da", "ls"]);
    assert!(
        listed.contains("served by node1") && listed.contains("node1,node2"),
        "{listed}"
    );
    // Node 1's mount, through the servers since the move (node 1 itself among them now),
    // still reads what it wrote before.
    verify(&on1, &files1);
    tessera_ok(&c, 3, &["umount", "v1fs", "-a"]);
    let fsck = tessera_ok(&c, 3, &["fsck", "v1fs", "-n"]);
    assert!(fsck.contains(" 0 problems found"), "{fsck}");
}

/// Three drive servers (JBOFs) and three server nodes serving two declustered arrays, each
/// with two pdisks in every JBOF, and a file system on both used on the third node (and
/// mounted on every node, the servers too, as a `-A yes` file system is at startup). The
/// server of one array is killed under a fsyncing, verifying workload: the cluster manager
/// gives the array to a survivor, which takes the reservation of every pdisk from the dead
/// server (fencing it on the drives) and serves it; the workload goes on after a pause
/// under 10 s with no error. Then the other array's server dies together with an
/// enclosure: the array opens on a survivor with that enclosure's pdisks suspended, the
/// workload goes on, and when the enclosure returns its pdisks (still reserved by the dead
/// server) are taken over, caught up, and carry the data when another enclosure goes.
#[test]
fn arrays_over_three_jbofs_fail_over_and_fence_the_dead_server_also_with_an_enclosure_lost() {
    if !netns_usable() {
        return;
    }
    let c = common::netns::up(3, &["--drives", "4", "--size", "1G", "--jbofs", "3"]);
    let pdisks = c.ok(&["stanza", "pdisk"]);
    let stanza = |name: &str, text: String| {
        let path = c.base.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let slots = |a: u32, b: u32| -> String {
        pdisks
            .lines()
            .filter(|l| l.ends_with(&format!(" slot={a}")) || l.ends_with(&format!(" slot={b}")))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    let (pd1, pd2) = (stanza("pd1", slots(1, 2)), stanza("pd2", slots(3, 4)));
    assert_eq!(std::fs::read_to_string(&pd1).unwrap().lines().count(), 6);
    tessera_ok(
        &c,
        1,
        &[
            "da",
            "create",
            "da1",
            "-F",
            &pd1,
            "--servers",
            "node1,node2,node3",
        ],
    );
    tessera_ok(
        &c,
        2,
        &[
            "da",
            "create",
            "da2",
            "-F",
            &pd2,
            "--servers",
            "node2,node3,node1",
        ],
    );
    for (k, vd, da) in [(1, "vd1", "da1"), (2, "vd2", "da2")] {
        tessera_ok(
            &c,
            k,
            &[
                "vdisk",
                "create",
                vd,
                "--da",
                da,
                "--code",
                "4+2p",
                "--block-size",
                "1M",
                "--size",
                "2G",
            ],
        );
    }
    let v1 = "%nsd: device=vdisk:vd1 nsd=v1 usage=dataAndMetadata failureGroup=1 \
              servers=node1,node2,node3\n";
    let v2 = "%nsd: device=vdisk:vd2 nsd=v2 usage=dataAndMetadata failureGroup=2 \
              servers=node2,node3,node1\n";
    tessera_ok(&c, 1, &["nsd", "create", "-F", &stanza("v1", v1.into())]);
    tessera_ok(&c, 2, &["nsd", "create", "-F", &stanza("v2", v2.into())]);
    let served_by = |k: u32, nsd: &str| {
        access(&c, k)
            .get(nsd)
            .is_some_and(|(how, _)| how == "server node")
    };
    wait_for("node1 serving v1 and node2 v2", SETTLE, || {
        served_by(1, "v1") && served_by(2, "v2")
    });
    let mnt = c.base.join("node3/mnt/jfs");
    let both = stanza("v", format!("{v1}{v2}"));
    tessera_ok(
        &c,
        3,
        &[
            "fs",
            "create",
            "jfs",
            "-F",
            &both,
            "-B",
            "1M",
            "-T",
            mnt.to_str().unwrap(),
        ],
    );
    tessera_ok(&c, 3, &["mount", "jfs"]);
    let logs = || {
        (1..=3)
            .map(|k| log_of(&c, k))
            .collect::<Vec<_>>()
            .join("\n")
    };

    // The server of da1 dies under load.
    let work = start_workload(mnt.clone());
    wait_for("the workload running", SETTLE, || work.rounds() >= 10);
    c.ok(&["kill", "1"]);
    wait_for("a survivor serving v1", SETTLE, || {
        served_by(2, "v1") || served_by(3, "v1")
    });
    let before = work.rounds();
    wait_for("rounds after the failover", SETTLE, || {
        work.rounds() > before + 10
    });
    let (files, longest) = work.finish();
    eprintln!("longest pause around the kill of da1's server: {longest:?}");
    assert!(longest < Duration::from_secs(10), "paused {longest:?}");
    verify(&mnt, &files);
    let taken = logs()
        .lines()
        .filter(|l| l.contains("reservation taken from node1, incarnation"))
        .count();
    assert_eq!(taken, 6, "every pdisk of da1 fenced once:\n{}", logs());

    // The dead server comes back and leaves da1 where it is.
    c.ok(&["start", "1"]);
    wait_for("node1 active", SETTLE, || {
        states(&c, 2)
            .get("node1")
            .is_some_and(|(s, _)| s == "active")
    });
    // At its start it mounts jfs (-A yes), reaching both NSDs through their servers.
    wait_for("node1 mounting jfs at its start", SETTLE, || {
        log_of(&c, 1).contains("jfs: mounted at")
    });
    std::thread::sleep(Duration::from_secs(3));
    assert!(!served_by(1, "v1"));

    // da2's server dies and an enclosure is lost at the same time.
    let work = start_workload(mnt.clone());
    // Under load the first rounds after node 1's restart sometimes take over 30 s (seen on
    // a slow host; not understood yet): bounded at twice that, and said.
    let warm = wait_for(
        "the workload running after node 1's restart",
        2 * SETTLE,
        || work.rounds() >= 10,
    );
    eprintln!("ten rounds after node 1's restart took {warm:?}");
    c.ok(&["jbof", "kill", "1"]);
    c.ok(&["kill", "2"]);
    wait_for("a survivor serving v2", SETTLE, || {
        served_by(1, "v2") || served_by(3, "v2")
    });
    let before = work.rounds();
    wait_for("rounds after the failover", SETTLE, || {
        work.rounds() > before + 10
    });
    let (files, longest) = work.finish();
    eprintln!("longest pause around the kill of da2's server with an enclosure: {longest:?}");
    // 2.7-3.3 s here: the expel (failureDetectionTime), and the enclosure's pdisks fail
    // at once, their paths down longer than fast_io_fail_tmo already.
    assert!(longest < Duration::from_secs(10), "paused {longest:?}");
    verify(&mnt, &files);
    let owner = if served_by(1, "v2") { 1 } else { 3 };
    let not_ok = tessera_ok(&c, owner, &["pdisk", "ls", "--not-ok"]);
    assert!(not_ok.contains("jbof1d3"), "{not_ok}");

    // The enclosure returns: its pdisks, still reserved by da2's dead server, are taken
    // over and caught up.
    c.ok(&["jbof", "start", "1"]);
    wait_for(
        "jbof1's pdisks back in service",
        Duration::from_secs(90),
        || {
            [1, 3]
                .iter()
                .all(|k| !tessera_ok(&c, *k, &["pdisk", "ls", "--not-ok"]).contains("jbof1d"))
        },
    );
    assert!(
        log_of(&c, owner)
            .lines()
            .any(|l| l.contains("reservation taken from node2, incarnation")),
        "da2's new server did not fence the old one:\n{}",
        log_of(&c, owner)
    );
    // What was written while jbof1 was away is on it now: lose another enclosure.
    c.ok(&["jbof", "kill", "2"]);
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    verify(&mnt, &files);
    c.ok(&["jbof", "start", "2"]);
    tessera_ok(&c, 3, &["umount", "jfs", "-a"]);
    let fsck = tessera_ok(&c, 3, &["fsck", "jfs", "-n"]);
    assert!(fsck.contains(" 0 problems found"), "{fsck}");
}

/// Writes `name` (1 MiB naming itself) under `dir` with O_DIRECT and fsync; how long it
/// took, or the error.
fn write_direct(dir: &Path, name: &str) -> (Duration, std::io::Result<()>) {
    use std::os::unix::fs::OpenOptionsExt;
    let start = Instant::now();
    let data = tessera_drive::AlignedBuf::from_slice(
        &name.repeat((1 << 20) / name.len() + 1).as_bytes()[..1 << 20],
    );
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(dir.join(name))?;
        f.write_all(&data)?;
        f.sync_all()
    })();
    (start.elapsed(), result)
}

/// Both NSD servers of a client's NSD die (non-quorum nodes, so the cluster lives on):
/// the client's next fsynced write fails with EIO after `nsdServerWaitTime` (3 s here),
/// the daemon log names the servers' paths, and when one server returns, writes work
/// again and what was written before reads back. Then the client's daemon restarts while
/// the servers are down: its mount at start waits for them and is made when one returns.
#[test]
fn all_servers_down_fail_io_after_the_configured_wait_and_io_resumes_when_one_returns() {
    if !netns_usable() {
        return;
    }
    let c = common::netns::up(4, &["--drives", "1", "--size", "256M", "--quorum", "1"]);
    tessera_ok(
        &c,
        1,
        &[
            "config",
            "set",
            "useNSDserver=always,nsdServerWaitTime=3",
            "-N",
            "node4",
        ],
    );
    let stanza = c.base.join("s.stanza");
    std::fs::write(
        &stanza,
        format!(
            "%nsd: device={} nsd=s1 usage=dataAndMetadata failureGroup=1 servers=node2,node3\n",
            c.base.join("drives/node2-d1.img").display()
        ),
    )
    .unwrap();
    let stanza = stanza.to_str().unwrap();
    tessera_ok(&c, 2, &["nsd", "create", "-F", stanza]);
    let mnt = c.base.join("node4/mnt/afs");
    tessera_ok(
        &c,
        4,
        &[
            "fs",
            "create",
            "afs",
            "-F",
            stanza,
            "-T",
            mnt.to_str().unwrap(),
        ],
    );
    tessera_ok(&c, 4, &["mount", "afs"]);
    let (_, before) = write_direct(&mnt, "before");
    before.unwrap();
    let how = access(&c, 4);
    assert_eq!(how["s1"].0, "through servers", "{how:?}");
    let disks = tessera_ok(&c, 4, &["disk", "ls", "afs", "-L"]);
    assert!(
        disks.contains("path in use") && disks.contains("through servers: node2 optimized live"),
        "{disks}"
    );
    let everywhere = tessera_ok(&c, 4, &["nsd", "ls", "-M", "-X"]);
    assert!(
        everywhere.contains("Devtype")
            && everywhere.lines().filter(|l| l.starts_with("s1 ")).count() == 4,
        "{everywhere}"
    );

    c.ok(&["kill", "2"]);
    c.ok(&["kill", "3"]);
    let (took, during) = write_direct(&mnt, "during");
    eprintln!("a write with every server down failed after {took:?}");
    let err = during.expect_err("a write with every NSD server down succeeded");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(
        took >= Duration::from_millis(2500) && took < Duration::from_secs(20),
        "failed after {took:?}, nsdServerWaitTime is 3 s"
    );
    assert!(
        log_of(&c, 4).contains("no usable path to")
            && log_of(&c, 4).contains("check that the NSD's servers are up"),
        "the client's log does not say why:\n{}",
        log_of(&c, 4)
    );

    c.ok(&["start", "2"]);
    wait_for("writes through node2 again", SETTLE, || {
        write_direct(&mnt, "after").1.is_ok()
    });
    let read_back = || {
        for name in ["before", "after"] {
            let back = std::fs::read(mnt.join(name)).unwrap();
            assert!(
                back.len() == 1 << 20 && back.starts_with(name.as_bytes()),
                "{name}"
            );
        }
    };
    read_back();

    // The client's daemon restarts while its servers are down (a cluster starting with
    // clients before servers): its mount at start waits for them
    // (nsdServerWaitTimeForMount) and is made when one comes up.
    // Server node 2 dies, then client node 4 restarts: its mount at start waits for its
    // servers (the `waits`-th such wait in its log).
    let restart_client_without_servers = |waits: usize| {
        c.ok(&["kill", "2"]);
        wait_for("node2 no longer active", SETTLE, || {
            states(&c, 1)
                .get("node2")
                .is_some_and(|(s, _)| s != "active")
        });
        c.ok(&["kill", "4"]);
        c.ok(&["start", "4"]);
        wait_for("the client waiting for its NSD servers", SETTLE, || {
            log_of(&c, 4).matches("tried again as they come up").count() == waits
        });
    };
    restart_client_without_servers(1);
    c.ok(&["start", "2"]);
    wait_for("afs mounted again on the client", SETTLE, || {
        log_of(&c, 4).contains("afs: mounted once its NSD servers came up")
    });
    read_back();
    // Node 2 may have mounted it at its own start (`-A yes`, while node 4's try had left it
    // mounted nowhere), and node 4 then joined it: unmounted everywhere.
    tessera_ok(&c, 4, &["umount", "afs", "-a"]);

    // The same wait cancelled by the admin: an `umount` while the mount at start is still
    // being tried ends the tries, and the file system stays unmounted there when its
    // servers come back.
    restart_client_without_servers(2);
    let cancelled = tessera_ok(&c, 4, &["umount", "afs"]);
    assert!(cancelled.contains("was not mounted yet"), "{cancelled}");
    c.ok(&["start", "2"]);
    wait_for("node2 active again", SETTLE, || {
        states(&c, 1)
            .get("node2")
            .is_some_and(|(s, _)| s == "active")
    });
    // Longer than the tries' longest pause (10 s).
    std::thread::sleep(Duration::from_secs(12));
    let log4 = log_of(&c, 4);
    let after = log4
        .split("afs: mount at start cancelled by umount")
        .nth(1)
        .unwrap_or_else(|| panic!("node 4 does not log the cancel:\n{log4}"));
    assert!(
        !after.contains("afs: mounted"),
        "node 4 mounted afs after its umount:\n{log4}"
    );
    let on = tessera_ok(&c, 1, &["mount", "ls", "afs", "-L"]);
    assert!(!on.contains("node4"), "{on}");
    tessera_ok(&c, 1, &["umount", "afs", "-a"]);
    let fsck = tessera_ok(&c, 4, &["fsck", "afs", "-n"]);
    assert!(fsck.contains(" 0 problems found"), "{fsck}");
}
