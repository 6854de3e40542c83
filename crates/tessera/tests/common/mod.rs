//! Shared by the end-to-end tests: a node is a real daemon in a temporary home with
//! file-backed drives. Every test that starts a daemon holds a [`Node`] whose Drop shuts the
//! daemon down and detaches any mount, so a failing test leaves no stale mount or process.
#![allow(dead_code)]

pub mod crash_loop;
pub mod netns;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_tessera");
pub const DRIVE_BYTES: u64 = 128 << 20;

pub struct Node {
    pub dir: tempfile::TempDir,
    pub mounts: Vec<PathBuf>,
    pub started: bool,
}

impl Node {
    pub fn new() -> Node {
        let dir = tempfile::tempdir().expect("temp dir");
        Node {
            dir,
            mounts: Vec::new(),
            started: false,
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn home(&self) -> PathBuf {
        self.path("home")
    }

    pub fn run(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .args(args)
            .env("TESSERA_HOME", self.home())
            .current_dir(self.dir.path())
            .output()
            .expect("run tessera")
    }

    /// Runs and requires success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "tessera {args:?} failed:\n{stdout}\n{stderr}"
        );
        stdout
    }

    /// Runs and requires failure; returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !out.status.success(),
            "tessera {args:?} should fail:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        stderr
    }

    /// Creates the cluster and starts the daemon.
    pub fn start(mut self) -> Node {
        self.ok(&["cluster", "create", "--name", "testcluster"]);
        self.ok(&["startup"]);
        self.started = true;
        self
    }

    /// The pid of the running daemon, from its pid file.
    pub fn daemon_pid(&self) -> i32 {
        let text = std::fs::read_to_string(self.home().join("daemon.pid")).expect("daemon.pid");
        text.trim().parse().expect("pid")
    }

    /// Creates `count` drives and a stanza file naming them `{prefix}0..`; returns its path.
    pub fn stanza(&self, prefix: &str, count: usize, bytes: u64) -> PathBuf {
        let mut text = String::new();
        for i in 0..count {
            let dev = self.drive(&format!("{prefix}-drive{i}"), bytes);
            text += &format!(
                "%nsd: device={} nsd={prefix}{i} usage=dataAndMetadata failureGroup={} pool=system\n",
                dev.display(),
                i + 1
            );
        }
        let path = self.path(&format!("{prefix}.stanza"));
        std::fs::write(&path, text).expect("write stanza");
        path
    }

    /// Creates declustered array `da1` of 12 pdisk files of `pdisk_bytes` in 6 enclosures
    /// (two slots each) and returns the %pdisk stanza file.
    pub fn pdisk_stanza(&self, pdisk_bytes: u64) -> PathBuf {
        let mut text = String::from("# twelve drives in six JBOFs\n");
        for e in 1..=6 {
            for slot in 1..=2 {
                let dev = self.drive(&format!("jbof{e}-slot{slot}"), pdisk_bytes);
                text += &format!(
                    "%pdisk: pdisk=e{e}s{slot} device={} enclosure=jbof{e} slot={slot}\n",
                    dev.display()
                );
            }
        }
        let path = self.path("pdisks.stanza");
        std::fs::write(&path, text).expect("write stanza");
        path
    }

    /// Array `da1` (see [`Node::pdisk_stanza`], pdisks of 256 MiB), 8+2p vdisk `vd0` of
    /// `size` with 1 MiB blocks as NSD `vd0`, and file system `gfs` on it (`-A no`, not
    /// mounted) with mount point `mnt`, which is returned.
    pub fn file_system_on_vdisk(&mut self, size: &str) -> PathBuf {
        let pdisks = self.pdisk_stanza(256 << 20);
        self.ok(&["da", "create", "da1", "-F", s(&pdisks)]);
        self.ok(&[
            "vdisk",
            "create",
            "vd0",
            "--da",
            "da1",
            "--block-size",
            "1M",
            "--size",
            size,
        ]);
        let stanza = self.path("vd.stanza");
        std::fs::write(
            &stanza,
            "%nsd: device=vdisk:vd0 nsd=vd0 usage=dataAndMetadata\n",
        )
        .unwrap();
        self.ok(&["nsd", "create", "-F", s(&stanza)]);
        self.create_fs("gfs", &stanza, "mnt")
    }

    /// Array `da1` (see [`Node::pdisk_stanza`]) with `count` 8+2p vdisks `{prefix}0..` of
    /// `vdisk_size` and block size `block`, and a %nsd stanza file naming them as NSDs.
    pub fn vdisk_stanza(
        &self,
        prefix: &str,
        count: usize,
        vdisk_size: &str,
        block: &str,
    ) -> PathBuf {
        let pdisks = self.pdisk_stanza(512 << 20);
        self.ok(&["da", "create", "da1", "-F", s(&pdisks)]);
        let mut text = String::new();
        for i in 0..count {
            let name = format!("{prefix}{i}");
            self.ok(&[
                "vdisk",
                "create",
                &name,
                "--da",
                "da1",
                "--code",
                "8+2p",
                "--block-size",
                block,
                "--size",
                vdisk_size,
            ]);
            text += &format!(
                "%nsd: device=vdisk:{name} nsd={name} usage=dataAndMetadata failureGroup={} pool=system\n",
                i + 1
            );
        }
        let path = self.path(&format!("{prefix}.stanza"));
        std::fs::write(&path, text).expect("write stanza");
        path
    }

    /// Creates file system `name` (1 MiB blocks, not mounted at startup) on the NSDs of
    /// `stanza`, with mount point `mount_dir` under the node's directory, which it
    /// returns (and unmounts when the node goes away).
    pub fn create_fs(&mut self, name: &str, stanza: &Path, mount_dir: &str) -> PathBuf {
        self.create_fs_with(name, stanza, mount_dir, &[])
    }

    /// [`Node::create_fs`] with `more` options of `fs create` (`-r 2`, `-m 2`, ...).
    pub fn create_fs_with(
        &mut self,
        name: &str,
        stanza: &Path,
        mount_dir: &str,
        more: &[&str],
    ) -> PathBuf {
        let mnt = self.path(mount_dir);
        self.mounts.push(mnt.clone());
        let mut args = vec![
            "fs",
            "create",
            name,
            "-F",
            s(stanza),
            "-B",
            "1M",
            "-T",
            s(&mnt),
            "-A",
            "no",
        ];
        args.extend_from_slice(more);
        self.ok(&args);
        mnt
    }

    pub fn drive(&self, name: &str, bytes: u64) -> PathBuf {
        let path = self.path(name);
        let f = std::fs::File::create(&path).expect("create drive");
        f.set_len(bytes).expect("size drive");
        path
    }

    /// The Figure 33 stanzas of seed 000, devices replaced by drive files.
    pub fn figure33(&self) -> PathBuf {
        let mut text = String::from("# ./ef600-nsdstanza-rhel8.sh | tee ef600_mlx.stanza\n");
        for (i, nsd) in ["de0704a01v1", "de0704a01v2", "de0704a02v1", "de0704a02v2"]
            .iter()
            .enumerate()
        {
            let dev = self.drive(&format!("nvme0n{}", i + 1), DRIVE_BYTES);
            text += &format!(
                "%nsd: device={} nsd={nsd} usage=dataAndMetadata\n",
                dev.display()
            );
            text += "failureGroup=704 pool=system thinDiskType=no\n";
        }
        let path = self.path("ef600_mlx.stanza");
        std::fs::write(&path, text).expect("write stanza");
        path
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.started {
            let _ = self.run(&["shutdown"]);
        }
        for m in &self.mounts {
            let _ = Command::new("fusermount3").arg("-uz").arg(m).output();
        }
    }
}

/// Deterministic pseudo-random test bytes (not every test binary of this crate uses them).
#[allow(unused_imports)]
pub use tessera_testkit::pattern;

pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// FUSE needs root and /dev/fuse; say why a test is skipped instead of failing.
pub fn fuse_usable() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let usable = root && Path::new("/dev/fuse").exists();
    if !usable {
        eprintln!("skipping: FUSE tests need root and /dev/fuse");
    }
    usable
}

/// Starts `tessera drive-server -c CONFIG` and returns once it says it is running. Its log
/// goes next to the configuration, for a failing test to read; its stdout keeps being
/// drained so that the server never blocks on a full pipe.
pub fn spawn_drive_server(config: &Path) -> Child {
    spawn_drive_server_with(config, &[])
}

/// [`spawn_drive_server`] with more arguments (`--metrics-address`).
pub fn spawn_drive_server_with(config: &Path, extra: &[&str]) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(config.with_extension("log"))
        .expect("drive-server log");
    let mut child = Command::new(BIN)
        .args(["drive-server", "-c", s(config)])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("spawn drive-server");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(Instant::now() < deadline, "drive-server did not come up");
        match lines.next() {
            Some(Ok(line)) if line.contains("drive server running") => break,
            Some(Ok(_)) => continue,
            _ => panic!("drive-server {} exited before it was running", s(config)),
        }
    }
    std::thread::spawn(move || for _ in lines.by_ref() {});
    child
}

/// A TCP port on the loopback that nothing listens on (now).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A plain HTTP/1.1 GET of `path` from `addr`: the status code, the head and the body.
pub fn http_get(addr: &str, path: &str) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the HTTP port");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status code");
    (status, head.to_string(), body.to_string())
}

/// Reads deploy/monitoring/grafana-dashboard.json, checks it against Grafana's dashboard
/// JSON model (what an import needs: a uid, a title, a schema version, panels of known
/// types with unique ids and grid positions inside 24 columns that do not overlap,
/// queries with refIds, every `$variable` defined), and returns the Tessera metric
/// families its queries use (`tessera_fs_io_bytes` for `tessera_fs_io_bytes_total`).
pub fn grafana_dashboard_metrics() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/monitoring/grafana-dashboard.json");
    let text = std::fs::read_to_string(&path).expect("the Grafana dashboard");
    let d: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let uid = d["uid"].as_str().expect("uid");
    assert!(!uid.is_empty() && uid.len() <= 40, "uid {uid}");
    assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(d["schemaVersion"].as_u64().expect("schemaVersion") >= 36);
    assert!(d["time"]["from"].is_string() && d["time"]["to"].is_string());
    let variables: Vec<&str> = d["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .map(|v| v["name"].as_str().expect("variable name"))
        .collect();
    let panels = d["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    let mut ids = std::collections::HashSet::new();
    let mut cells = std::collections::HashSet::new();
    let mut families = std::collections::BTreeSet::new();
    for p in panels {
        let id = p["id"].as_u64().expect("panel id");
        assert!(ids.insert(id), "panel id {id} twice");
        let kind = p["type"].as_str().expect("panel type");
        assert!(
            ["row", "timeseries", "stat", "gauge", "table", "bargauge"].contains(&kind),
            "panel {id}: type {kind}"
        );
        let g = &p["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_u64().expect("x"),
            g["y"].as_u64().expect("y"),
            g["w"].as_u64().expect("w"),
            g["h"].as_u64().expect("h"),
        );
        assert!(w >= 1 && h >= 1 && x + w <= 24, "panel {id}: gridPos {g}");
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(
                    cells.insert((cx, cy)),
                    "panel {id} overlaps another at {cx},{cy}"
                );
            }
        }
        if kind == "row" {
            continue;
        }
        assert!(
            p["title"].as_str().is_some_and(|t| !t.is_empty()),
            "panel {id}"
        );
        assert!(p["datasource"]["uid"].is_string(), "panel {id}: datasource");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {id}: no query");
        for t in targets {
            assert!(t["refId"].is_string(), "panel {id}: refId");
            let expr = t["expr"].as_str().expect("expr");
            for word in expr.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$')) {
                if let Some(var) = word.strip_prefix('$') {
                    assert!(
                        var.starts_with("__") || variables.contains(&var),
                        "panel {id}: ${var} is not a dashboard variable"
                    );
                } else if word.starts_with("tessera_") {
                    let family = ["_total", "_bucket", "_count", "_sum"]
                        .iter()
                        .find_map(|s| word.strip_suffix(s))
                        .unwrap_or(word);
                    families.insert(family.to_string());
                }
            }
        }
    }
    families.into_iter().collect()
}

/// The metric families described (`# TYPE name kind`) in a scrape's text.
pub fn described_families(scrape: &str) -> Vec<String> {
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// A loop device over a file, detached when dropped (lazily, if something still holds it),
/// so a failing test leaves no device behind.
pub struct LoopDevice {
    pub dev: String,
}

impl LoopDevice {
    pub fn attach(file: &Path) -> LoopDevice {
        let out = Command::new("losetup")
            .args(["-f", "--show", s(file)])
            .output()
            .expect("losetup");
        assert!(
            out.status.success(),
            "losetup -f {}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        LoopDevice {
            dev: String::from_utf8_lossy(&out.stdout).trim().to_string(),
        }
    }
}

impl Drop for LoopDevice {
    /// Detaches and waits until the kernel has let the device go: `losetup -d` on a device
    /// someone still holds open (udev probing it, a process that is exiting) only marks it
    /// to be cleared at the last close, and the next `losetup -f` would then hand out
    /// another number while the old one still shows the old file.
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).output();
        let name = self.dev.trim_start_matches("/dev/");
        let backing = format!("/sys/block/{name}/loop/backing_file");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while Path::new(&backing).exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

pub fn loop_usable() -> bool {
    let ok = fuse_usable()
        && Command::new("losetup")
            .arg("-f")
            .output()
            .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipping: needs root, FUSE and a free loop device");
    }
    ok
}
