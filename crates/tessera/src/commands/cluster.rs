//! `cluster create`, `startup`, `shutdown` and `state`.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tessera_nsd::{check_name, NsdId, NAME_RULE};

use crate::config::{host_name, now_unix, ClusterConfig, Home};
use crate::output::{local_time, Table, YRecord};
use crate::rpc::{Client, Reply, Request};

/// How long `startup` waits for a daemon that is alive but not answering yet. Opening
/// arrays after a power loss resynchronises their dirty regions and replays logs before the
/// daemon answers, which takes seconds to minutes; a daemon that exits is reported at once.
const STARTUP_WAIT: Duration = Duration::from_secs(600);
/// How often `startup` shows what a daemon that is still starting is doing.
const STARTUP_PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// How long `shutdown` waits for the daemon to go away after it acknowledged.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(60);
const PING_TIMEOUT: Duration = Duration::from_secs(5);

fn stamp(command: &str, message: &str) {
    println!(
        "{}: tessera {command}: {message}",
        local_time(now_unix(), true)
    );
}

pub fn create(home: &Home, name: &str) -> Result<()> {
    check_name(name).map_err(|p| anyhow!("--name {name}: {p}; {NAME_RULE}"))?;
    if home.cluster_exists() {
        let existing = home
            .cluster()
            .map(|c| c.name)
            .unwrap_or_else(|_| "?".into());
        bail!(
            "cluster {existing} is already defined in {}; to start over, stop the daemon with \
             `tessera shutdown` and remove {} (this forgets every NSD and file system), or set \
             TESSERA_HOME to another directory",
            home.cluster_path().display(),
            home.root().display()
        );
    }
    std::fs::create_dir_all(home.log_dir())
        .with_context(|| format!("cannot create {}", home.log_dir().display()))?;
    let node_name = host_name();
    stamp("cluster create", &format!("Processing node {node_name}"));
    let config = ClusterConfig {
        name: name.to_string(),
        cluster_id: NsdId::random().to_hex(),
        node_name,
        node_number: 1,
        created_unix: now_unix(),
        address: String::new(),
        format: 0,
    };
    home.save_cluster(&config)?;
    println!("tessera cluster create: Command successfully completed");
    println!(
        "Cluster {name} (id {}) has one node; start it with `tessera startup`",
        config.cluster_id
    );
    Ok(())
}

/// The last `lines` lines of `path`, for error messages.
fn tail(path: &std::path::Path, lines: usize) -> String {
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(16 << 10)));
    let mut text = String::new();
    let _ = f.read_to_string(&mut text);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The last complete line written to `path` after byte `start` (what this daemon logged,
/// not an earlier run), or nothing.
fn last_line_since(path: &std::path::Path, start: u64) -> String {
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let _ = f.seek(SeekFrom::Start(start.max(len.saturating_sub(16 << 10))));
    let mut text = String::new();
    let _ = f.read_to_string(&mut text);
    text.lines().last().unwrap_or_default().to_string()
}

pub fn startup(home: &Home) -> Result<()> {
    let cluster = home.cluster()?;
    if let Err(e) = Client::connect(home) {
        if Client::denied(&e) {
            return Err(e);
        }
    }
    if let Some(Reply::Pong { pid, .. }) = Client::ping(home, PING_TIMEOUT) {
        println!("tessera startup: the daemon is already running (pid {pid})");
        return Ok(());
    }
    stamp("startup", "Starting Tessera ...");
    std::fs::create_dir_all(home.log_dir())?;
    let out_path = home.log_dir().join("daemon.out");
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&out_path)?;
    let exe = std::env::current_exe().context("cannot find the tessera binary")?;
    let mut command = Command::new(exe);
    command
        .arg("daemon")
        .env("TESSERA_HOME", home.root())
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from our session so a
    // closing terminal does not signal it.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let log_start = std::fs::metadata(home.log_path()).map_or(0, |m| m.len());
    let mut child = command.spawn().context("cannot start the daemon")?;
    let started = Instant::now();
    let deadline = started + STARTUP_WAIT;
    let mut next_progress = started + STARTUP_PROGRESS_EVERY;
    let mut last_shown = String::new();
    while Instant::now() < deadline {
        if Instant::now() >= next_progress {
            next_progress += STARTUP_PROGRESS_EVERY;
            let last = last_line_since(&home.log_path(), log_start);
            if !last.trim().is_empty() && last != last_shown {
                println!("tessera startup: the daemon is starting: {}", last.trim());
                last_shown = last;
            }
        }
        if Client::ping(home, PING_TIMEOUT).is_some() {
            println!(
                "tessera startup: node {} of cluster {} is active",
                cluster.node_name, cluster.name
            );
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            bail!(
                "the daemon exited ({status}) during startup; last lines of its output:\n{}\n{}",
                tail(&out_path, 10),
                tail(&home.log_path(), 10)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "the daemon did not answer within {}s; see {}; last lines:\n{}",
        STARTUP_WAIT.as_secs(),
        home.log_path().display(),
        tail(&home.log_path(), 20)
    )
}

pub fn shutdown(home: &Home) -> Result<()> {
    let mut client = match Client::connect(home) {
        Ok(c) => c,
        Err(e) if Client::denied(&e) => return Err(e),
        Err(_) => {
            println!("tessera shutdown: the daemon is not running");
            return Ok(());
        }
    };
    stamp("shutdown", "Starting force unmount of Tessera file systems");
    client.call(&Request::Shutdown, |_| {})?;
    let deadline = Instant::now() + SHUTDOWN_WAIT;
    while Instant::now() < deadline {
        if Client::connect(home).is_err() {
            stamp("shutdown", "Shutting down Tessera daemons");
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "the daemon acknowledged shutdown but still answers; see {}",
        home.log_path().display()
    )
}

pub fn state(home: &Home, machine: bool) -> Result<()> {
    let cluster = home.cluster()?;
    if let Err(e) = Client::connect(home) {
        if Client::denied(&e) {
            return Err(e);
        }
    }
    let state = match Client::ping(home, PING_TIMEOUT) {
        Some(_) => "active",
        None => "down",
    };
    let number = cluster.node_number.to_string();
    if machine {
        let y = YRecord::new("state", "");
        println!("{}", y.header(&["nodeNumber", "nodeName", "state"]));
        println!("{}", y.data(&[number, cluster.node_name, state.into()]));
        return Ok(());
    }
    let mut t = Table::new(&["Node number", "Node name", "State"]).right(&[0]);
    t.row(vec![number, cluster.node_name, state.into()]);
    print!("{}", t.render());
    Ok(())
}
