//! A cluster of `scripts/cluster-netns.sh` for tests: its own name prefix, state
//! directory and subnet, so tests (and a user's own cluster) run side by side; Drop runs
//! `down` even when a test fails.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::BIN;

/// The port test listeners use; every node has its own network, so one port serves all.
pub const PORT: u16 = 7000;

/// Waits for connections and says when it listens, so a probe never races its bind.
const LISTENER: &str = "import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', int(sys.argv[1])))
s.listen(64)
print('listening', flush=True)
while True:
    s.accept()[0].close()
";

/// Exit 0 if a TCP connection to argv[1]:argv[2] is accepted within 2 s, else 1.
const PROBE: &str = "import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()
except OSError as e:
    print(e, file=sys.stderr)
    sys.exit(1)
";

pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/cluster-netns.sh")
}

/// Whether the machine can run these tests; under CI it must.
pub fn netns_usable() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let ip_netns = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .is_ok_and(|o| o.status.success());
    if root && ip_netns {
        return true;
    }
    let why = if root {
        "`ip netns` does not work"
    } else {
        "not root"
    };
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true but the network namespace tests cannot run: {why}"
    );
    eprintln!("skipping: network namespace tests need root and `ip netns` ({why})");
    false
}

/// One cluster of the script, with names no other test uses; Drop runs `down`.
pub struct Cluster {
    pub prefix: String,
    pub subnet: String,
    pub base: PathBuf,
    _parent: tempfile::TempDir,
    listeners: Vec<Child>,
}

impl Cluster {
    pub fn new() -> Cluster {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < 50, "more clusters than subnets set aside for them");
        let pid = std::process::id();
        let parent = tempfile::tempdir().expect("temp dir");
        Cluster {
            prefix: format!("t{:x}{n}-", pid & 0xfffff),
            subnet: format!("10.{}.{}", 200 + n, pid % 250),
            base: parent.path().join("cluster"),
            _parent: parent,
            listeners: Vec::new(),
        }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(script());
        c.args(args)
            .env("TSR_PREFIX", &self.prefix)
            .env("TSR_BASE", &self.base)
            .env("TSR_SUBNET", &self.subnet)
            .env("TESSERA_BIN", BIN);
        c
    }

    pub fn sh(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run cluster-netns.sh")
    }

    /// Writes a one-line `%nsd` stanza for drive file `drive` (under `drives/`) as NSD
    /// `nsd` in failure group `group` (data and metadata, pool system) to `NSD.stanza`
    /// under the cluster's directory; returns that file's path.
    pub fn nsd_stanza(&self, nsd: &str, drive: &str, group: u32) -> String {
        let path = self.base.join(format!("{nsd}.stanza"));
        let device = self.base.join("drives").join(drive);
        std::fs::write(
            &path,
            format!(
                "%nsd: device={} nsd={nsd} usage=dataAndMetadata failureGroup={group} \
                 pool=system\n",
                device.display()
            ),
        )
        .unwrap();
        path.to_str().unwrap().to_string()
    }

    /// Runs and requires success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.sh(args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "cluster-netns.sh {args:?} failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// Runs and requires failure; returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.sh(args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !out.status.success(),
            "cluster-netns.sh {args:?} should fail:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        stderr
    }

    pub fn address(&self, node: u32) -> String {
        format!("{}.{node}", self.subnet)
    }

    /// A TCP listener in `node`, returned once it listens; `down` ends it.
    pub fn listen(&mut self, node: u32) {
        let port = PORT.to_string();
        let mut child = self
            .command(&[
                "run",
                &node.to_string(),
                "--",
                "python3",
                "-c",
                LISTENER,
                &port,
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn listener");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("listener output");
        assert_eq!(
            line.trim(),
            "listening",
            "listener in node {node} did not start"
        );
        self.listeners.push(child);
    }

    /// Whether `from` gets a TCP connection to `to`'s listener.
    /// Whether `from` reaches `to` within a few tries: a loaded machine can take a moment to
    /// forward again after a bridge change.
    pub fn connects_soon(&self, from: u32, to: u32) -> bool {
        (0..5).any(|_| self.connects(from, to))
    }

    pub fn connects(&self, from: u32, to: u32) -> bool {
        let (addr, port) = (self.address(to), PORT.to_string());
        let from = from.to_string();
        let out = self.sh(&["run", &from, "--", "python3", "-c", PROBE, &addr, &port]);
        out.status.success()
    }

    /// The names in `ip` listings that carry our prefix: namespaces, veths, bridges.
    pub fn leftovers(&self) -> Vec<String> {
        let mut found = Vec::new();
        for args in [&["netns", "list"][..], &["-o", "link", "show"][..]] {
            let out = Command::new("ip").args(args).output().expect("ip");
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let names = line.split([' ', ':', '@']).filter(|w| !w.is_empty());
                found.extend(
                    names
                        .filter(|w| w.starts_with(&self.prefix))
                        .map(String::from),
                );
            }
        }
        found
    }
}

impl Cluster {
    /// A failed test's evidence, before `down` removes it: each node's daemon log is
    /// copied under `$TMPDIR/tessera-failed-tests/<prefix>-<pid>/` and its last lines are
    /// printed, so a failure seen once (or only in CI) can be read afterwards. With
    /// `TESSERA_TEST_KEEP_LOGS=1` a passing test's logs are kept too (for a slow run).
    fn keep_logs(&self) {
        let kept = std::env::temp_dir()
            .join("tessera-failed-tests")
            .join(format!("{}-{}", self.prefix, std::process::id()));
        let _ = std::fs::create_dir_all(&kept);
        let mut nodes: Vec<_> = std::fs::read_dir(&self.base)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("node"))
            .collect();
        nodes.sort();
        for node in nodes {
            let log = self.base.join(&node).join("home/log/daemon.log");
            let Ok(text) = std::fs::read_to_string(&log) else {
                continue;
            };
            let _ = std::fs::write(kept.join(format!("{node}.log")), &text);
            let lines: Vec<&str> = text.lines().collect();
            let tail: Vec<String> = lines[lines.len().saturating_sub(15)..]
                .iter()
                .map(|l| l.chars().take(300).collect())
                .collect();
            eprintln!(
                "--- last lines of {node}'s daemon log ---\n{}",
                tail.join("\n")
            );
        }
        eprintln!("the nodes' daemon logs are kept in {}", kept.display());
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var("TESSERA_TEST_KEEP_LOGS").as_deref() == Ok("1")
        {
            self.keep_logs();
        }
        let out = self.sh(&["down"]);
        if !out.status.success() {
            eprintln!("down failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        for mut child in self.listeners.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Whether process `pid` still runs (a zombie holds nothing and counts as gone).
pub fn alive(pid: &str) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit(") ")
        .next()
        .and_then(|rest| rest.chars().next());
    !matches!(state, None | Some('Z'))
}

/// Failure detection in 3 s: leases renew every 0.75 s, elections after 0.75-1.5 s.
pub const TEST_TIMINGS: &str = "failureDetectionTime=3,leaseRecoveryWait=1";
/// What the issue allows for a new cluster manager after a kill, with test timings.
pub const NEW_MANAGER_WITHIN: Duration = Duration::from_secs(10);
/// Generous bounds for the rest; the machine may be loaded.
pub const SETTLE: Duration = Duration::from_secs(30);

/// `nodes` nodes with test timings and one 256 MiB drive file each.
pub fn up_with_drives(nodes: u32) -> Cluster {
    up(nodes, &["--drives", "1", "--size", "256M"])
}

/// `nodes` nodes with test timings and the other options `args` of the script's `up`.
pub fn up(nodes: u32, args: &[&str]) -> Cluster {
    let c = Cluster::new();
    let nodes = nodes.to_string();
    let mut all = vec!["up", nodes.as_str()];
    all.extend_from_slice(args);
    all.extend(["--config", TEST_TIMINGS]);
    c.ok(&all);
    c
}

/// Runs `tessera ARGS` in node `k`.
pub fn tessera(c: &Cluster, k: u32, args: &[&str]) -> Output {
    let k = k.to_string();
    let mut all = vec!["run", k.as_str(), "--", "tessera"];
    all.extend_from_slice(args);
    c.sh(&all)
}

/// Runs `tessera ARGS` in node `k`, requires success, returns stdout.
pub fn tessera_ok(c: &Cluster, k: u32, args: &[&str]) -> String {
    let out = tessera(c, k, args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "node {k}: tessera {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The data rows of `-Y` output for records starting with `prefix` (`state:`), each as
/// column name -> value, read by the HEADER line's names.
pub fn y_rows(text: &str, prefix: &str) -> Vec<BTreeMap<String, String>> {
    let mut names: Vec<String> = Vec::new();
    let mut rows = Vec::new();
    for line in text.lines().filter(|l| l.starts_with(prefix)) {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.get(2) == Some(&"HEADER") {
            names = fields.iter().map(|f| f.to_string()).collect();
            continue;
        }
        let row = names
            .iter()
            .zip(&fields)
            .map(|(n, v)| (n.clone(), v.to_string()))
            .collect();
        rows.push(row);
    }
    rows
}

/// `tessera state -a -Y` as seen from node `k`: node name -> (state, epoch); empty when
/// the command fails (node `k` is down).
pub fn states(c: &Cluster, k: u32) -> BTreeMap<String, (String, String)> {
    let out = tessera(c, k, &["state", "-a", "-Y"]);
    let text = String::from_utf8_lossy(&out.stdout);
    y_rows(&text, "state:")
        .into_iter()
        .map(|r| {
            let epoch = r.get("epoch").cloned().unwrap_or_default();
            (r["nodeName"].clone(), (r["state"].clone(), epoch))
        })
        .collect()
}

/// The cluster manager's node number as node `k` knows it.
pub fn manager(c: &Cluster, k: u32) -> Option<u32> {
    let out = tessera(c, k, &["state", "-a", "-s", "-Y"]);
    let text = String::from_utf8_lossy(&out.stdout);
    y_rows(&text, "state:summary:")
        .first()
        .and_then(|r| r.get("managerNumber"))
        .and_then(|m| m.parse().ok())
}

pub fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    started.elapsed()
}

pub fn all_in_state(c: &Cluster, from: u32, nodes: &[u32], state: &str) -> bool {
    let seen = states(c, from);
    nodes.iter().all(|n| {
        seen.get(&format!("node{n}"))
            .is_some_and(|(s, _)| s == state)
    })
}
