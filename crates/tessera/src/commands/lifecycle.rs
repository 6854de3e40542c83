//! `startup`, `shutdown` and `state` [mmstartup, mmshutdown, mmgetstate]: on this node
//! through its daemon's socket, and with `-a`/`-N` on other nodes through the cluster's
//! remote shell (see [`super::remote`]).

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use tessera_cluster::state::NodeRecord;

use super::cluster::known_nodes;
use super::remote::{for_each_parallel, parse_node_names, tessera_command_line, RemoteShell};
use crate::cli::NodeSelectArgs;
use crate::config::{now_unix, Home};
use crate::output::local_time;
use crate::rpc::{Client, Reply, Request};

/// How long `startup` waits for a daemon that is alive but not answering yet. Opening
/// arrays after a power loss resynchronises their dirty regions and replays logs before the
/// daemon answers, which takes seconds to minutes; a daemon that exits is reported at once.
const STARTUP_WAIT: Duration = Duration::from_secs(600);
/// How often `startup` shows what a daemon that is still starting is doing.
const STARTUP_PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// How long `shutdown` waits for the daemon to go away after it acknowledged.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(60);
/// What a remote `startup` or `shutdown` may take beyond the command's own wait: the
/// remote shell's connection setup.
const REMOTE_MARGIN: Duration = Duration::from_secs(60);
pub const PING_TIMEOUT: Duration = Duration::from_secs(5);

pub fn stamp(command: &str, message: &str) {
    println!(
        "{}: tessera {command}: {message}",
        local_time(now_unix(), true)
    );
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
    // The daemon's pid, so that shutdown returns only once the process is gone and its
    // devices are closed: a loop device detached or a drive pulled right after `shutdown`
    // must not find it still open.
    let pid = match Client::ping(home, PING_TIMEOUT) {
        Some(Reply::Pong { pid, .. }) => Some(pid),
        _ => None,
    };
    stamp("shutdown", "Starting force unmount of Tessera file systems");
    client.call(&Request::Shutdown, |_| {})?;
    let deadline = Instant::now() + SHUTDOWN_WAIT;
    while Instant::now() < deadline {
        if Client::connect(home).is_err() && pid.is_none_or(process_gone) {
            stamp("shutdown", "Shutting down Tessera daemons");
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!(
        "the daemon acknowledged shutdown but still answers; see {}",
        home.log_path().display()
    )
}

/// Whether process `pid` has exited: no longer listed, or a zombie (its files are closed;
/// only its parent's wait is missing).
fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command name in parentheses, which may itself hold spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

/// `startup`: this node, or with -a/-N every node selected (this one directly, the others
/// through the remote shell, all at once).
pub fn startup_nodes(home: &Home, select: &NodeSelectArgs) -> Result<()> {
    if !select.all && select.nodes.is_none() {
        return startup(home);
    }
    let plan = Plan::new(home, select)?;
    let (remote, local) = std::thread::scope(|scope| {
        let remote = scope.spawn(|| plan.run_remote("startup", STARTUP_WAIT + REMOTE_MARGIN));
        let local = plan.local.as_ref().map(|node| (node, startup(home)));
        (
            remote.join().expect("the remote startups do not panic"),
            local,
        )
    });
    plan.report("startup", remote, local)
}

/// `shutdown`: this node, or with -a/-N every node selected; the other nodes first, this
/// node last, so this node can still answer about the others while they stop.
pub fn shutdown_nodes(home: &Home, select: &NodeSelectArgs) -> Result<()> {
    if !select.all && select.nodes.is_none() {
        return shutdown(home);
    }
    let plan = Plan::new(home, select)?;
    if plan.total > 1 {
        unmount_before_stopping(home, select);
    }
    let remote = plan.run_remote("shutdown", SHUTDOWN_WAIT + REMOTE_MARGIN)?;
    let local = plan.local.as_ref().map(|node| (node, shutdown(home)));
    plan.report("shutdown", Ok(remote), local)
}

/// The file systems mounted on the nodes selected, unmounted on them before any daemon
/// stops, as mmshutdown -a does: each unmount hands what its node served (owner slots it
/// holds) to the others through the cluster configuration, which needs a majority of the
/// quorum nodes, and the last daemons to stop would no longer have one and would wait for
/// it in vain. Best effort: a failure is reported, the daemons stop anyway (their next
/// mount replays the logs).
fn unmount_before_stopping(home: &Home, select: &NodeSelectArgs) {
    let Ok(Reply::Mounts(rows)) = super::call(home, &Request::MountList { name: None }) else {
        return;
    };
    for row in rows.iter().filter(|r| !r.nodes.is_empty()) {
        if let Err(e) = super::io::umount_nodes(home, &row.file_system, select) {
            println!(
                "tessera shutdown: {}: {e:#}; the daemons stop anyway",
                row.file_system
            );
        }
    }
}

/// The nodes a `startup`/`shutdown`/`mount`/`umount -a|-N` acts on.
pub(super) struct Plan {
    rsh: RemoteShell,
    pub(super) local: Option<NodeRecord>,
    pub(super) remote: Vec<NodeRecord>,
    total: usize,
}

impl Plan {
    pub(super) fn new(home: &Home, select: &NodeSelectArgs) -> Result<Plan> {
        let me = home.cluster()?.node_name;
        let known = known_nodes(home)?;
        let nodes = select_nodes(&known.nodes, select)?;
        let rsh = RemoteShell::parse(&known.identity.remote_shell)?;
        let total = nodes.len();
        let (local, remote): (Vec<NodeRecord>, Vec<NodeRecord>) =
            nodes.into_iter().partition(|n| n.name == me);
        Ok(Plan {
            rsh,
            local: local.into_iter().next(),
            remote,
            total,
        })
    }

    /// Runs `tessera COMMAND` on every remote node; one line per node as it finishes.
    fn run_remote(&self, command: &str, timeout: Duration) -> Result<Vec<Result<(), String>>> {
        self.run_on(&self.remote, &[command], timeout)
    }

    /// Runs `tessera ARGS` on each of `nodes` (remote ones) at once; one line per node as
    /// it finishes, in the words of the node's own last line.
    pub(super) fn run_on(
        &self,
        nodes: &[NodeRecord],
        args: &[&str],
        timeout: Duration,
    ) -> Result<Vec<Result<(), String>>> {
        let command = args[0];
        let line = tessera_command_line(args)?;
        Ok(for_each_parallel(nodes, |node| {
            let outcome = self.rsh.run(&node.name, &line, None, timeout);
            match &outcome {
                Ok(out) => {
                    let said = super::remote::last_line(&out.stdout).unwrap_or("done");
                    // The node's own line already says which command it was.
                    let prefix = format!("tessera {command}: ");
                    let said = said.split_once(&prefix).map_or(said, |(_, rest)| rest);
                    println!("tessera {command}: {}: {}", node.name, said.trim());
                }
                Err(why) => println!("tessera {command}: {}: failed: {why}", node.name),
            }
            outcome.map(|_| ())
        }))
    }

    fn report(
        &self,
        command: &str,
        remote: Result<Vec<Result<(), String>>>,
        local: Option<(&NodeRecord, Result<()>)>,
    ) -> Result<()> {
        self.report_on(&self.remote, command, remote, local)
    }

    /// Fails naming every node of `nodes` (or the local one) whose part failed.
    pub(super) fn report_on(
        &self,
        nodes: &[NodeRecord],
        command: &str,
        remote: Result<Vec<Result<(), String>>>,
        local: Option<(&NodeRecord, Result<()>)>,
    ) -> Result<()> {
        let remote = remote?;
        let mut failed: Vec<&str> = nodes
            .iter()
            .zip(&remote)
            .filter(|(_, r)| r.is_err())
            .map(|(n, _)| n.name.as_str())
            .collect();
        if let Some((node, Err(e))) = &local {
            println!("tessera {command}: {}: failed: {e:#}", node.name);
            failed.insert(0, node.name.as_str());
        }
        if failed.is_empty() {
            return Ok(());
        }
        bail!(
            "{} of {} nodes failed: {}",
            failed.len(),
            self.total,
            failed.join(", ")
        )
    }
}

/// The nodes of -a (all) or -N (those named, each of which must exist), in table order.
pub fn select_nodes(nodes: &[NodeRecord], select: &NodeSelectArgs) -> Result<Vec<NodeRecord>> {
    let Some(text) = &select.nodes else {
        return Ok(nodes.to_vec());
    };
    let names = parse_node_names(text)?;
    for name in &names {
        if !nodes.iter().any(|n| &n.name == name) {
            let known: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
            bail!(
                "node {name} is not in the cluster; its nodes are {}",
                known.join(", ")
            );
        }
    }
    Ok(nodes
        .iter()
        .filter(|n| names.contains(&n.name))
        .cloned()
        .collect())
}
