//! Reaching other nodes the way GPFS does: through the remote shell command given at
//! `cluster create -r` (default `ssh`), called as ssh is called,
//! `RSH NODE "COMMAND LINE"`, where RSH is split on whitespace into a program and its
//! leading arguments, NODE is the node's name, and the command line is one string that the
//! node's shell runs. Many nodes are reached in parallel, a bounded number at a time, and
//! every call has a deadline, so one hung node cannot stall an admin command.
//!
//! Also: which node of a list this host is, and the `-N` arguments shared by the commands.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tessera_cluster::node::{
    check_node_name, parse_node_file, parse_node_list, NodeSpec, MAX_NODES_PER_REQUEST,
};

use crate::config::host_name;

/// Remote calls in flight at once, like GPFS's default fan-out: enough to set up hundreds
/// of nodes quickly without one process per node of a thousand-node cluster.
pub const FANOUT: usize = 32;

/// A node file larger than this is refused before it is read whole: at
/// `MAX_NODES_PER_REQUEST` lines of a few hundred bytes it is far more than any real one.
const NODE_FILE_BYTES_MAX: u64 = 8 << 20;

/// How long the reader of a killed call's output waits for the pipe to close: a grandchild
/// of the remote shell may keep it open after the shell itself is gone.
const OUTPUT_DRAIN_WAIT: Duration = Duration::from_secs(2);

/// The remote shell command, split into program and leading arguments.
#[derive(Clone, Debug)]
pub struct RemoteShell {
    program: String,
    args: Vec<String>,
}

/// What a remote call printed, when it succeeded.
#[derive(Debug)]
pub struct RemoteOutput {
    pub stdout: String,
}

impl RemoteShell {
    pub fn parse(text: &str) -> Result<RemoteShell> {
        let mut words = text.split_whitespace().map(str::to_string);
        let program = words.next().ok_or_else(|| {
            anyhow!("the remote shell command is empty; give one with -r (default ssh)")
        })?;
        Ok(RemoteShell {
            program,
            args: words.collect(),
        })
    }

    /// Refuses a remote shell that cannot be started here, before a command changes
    /// anything it would then be unable to hand to the other nodes.
    pub fn check_runnable(&self) -> Result<()> {
        let executable = |path: &Path| {
            std::fs::metadata(path)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        };
        let found = if self.program.contains('/') {
            executable(Path::new(&self.program))
        } else {
            std::env::var_os("PATH").is_some_and(|paths| {
                std::env::split_paths(&paths).any(|dir| executable(&dir.join(&self.program)))
            })
        };
        if !found {
            bail!(
                "the remote shell `{}` is not an executable file{}; give the command that \
                 reaches the other nodes with -r (it is called as ssh is: RSH NODE \"CMD\")",
                self.program,
                if self.program.contains('/') {
                    ""
                } else {
                    " in PATH"
                }
            );
        }
        Ok(())
    }

    /// Starts `command_line` on `node` with its standard input and output piped to this
    /// process and its errors going to ours, for a call that streams (no deadline: the
    /// caller reads until the remote side is done).
    pub fn spawn(&self, node: &str, command_line: &str) -> Result<std::process::Child> {
        Command::new(&self.program)
            .args(&self.args)
            .arg(node)
            .arg(command_line)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("cannot run the remote shell `{}`", self.program))
    }

    /// Runs `command_line` on `node`, feeding `stdin` (or nothing), and waits at most
    /// `timeout`. The error is one line saying why, for the per-node report.
    pub fn run(
        &self,
        node: &str,
        command_line: &str,
        stdin: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<RemoteOutput, String> {
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .arg(node)
            .arg(command_line)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run the remote shell `{}`: {e}", self.program))?;
        if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // A writer thread, so a shell that does not read its input cannot block us
            // past the deadline; a broken pipe shows in the exit status.
            std::thread::spawn(move || {
                let _ = pipe.write_all(&bytes);
            });
        }
        let stdout = drain(child.stdout.take().expect("stdout is piped"));
        let stderr = drain(child.stderr.take().expect("stderr is piped"));
        let deadline = Instant::now() + timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "no answer within {}s (the remote shell was stopped)",
                        timeout.as_secs()
                    ));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(format!("cannot wait for the remote shell: {e}")),
            }
        };
        let stdout = stdout.recv_timeout(OUTPUT_DRAIN_WAIT).unwrap_or_default();
        let stderr = stderr.recv_timeout(OUTPUT_DRAIN_WAIT).unwrap_or_default();
        if status.success() {
            return Ok(RemoteOutput { stdout });
        }
        let why = last_line(&stderr)
            .or_else(|| last_line(&stdout))
            .unwrap_or("no message");
        Err(format!("{} ({status})", why.trim()))
    }
}

/// Reads a pipe to its end in a thread; the text arrives on the channel.
fn drain(mut pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        let _ = tx.send(String::from_utf8_lossy(&bytes).into_owned());
    });
    rx
}

pub fn last_line(text: &str) -> Option<&str> {
    text.lines().rev().find(|l| !l.trim().is_empty())
}

/// Quotes `word` for a POSIX shell: the remote side runs the command line through one.
pub fn shell_quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+=:,@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        return word.to_string();
    }
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The command line that runs this same tessera binary with `args` on another node: the
/// nodes of a cluster run one installation, at the same path.
pub fn tessera_command_line(args: &[&str]) -> Result<String> {
    let exe = std::env::current_exe().context("cannot find the tessera binary")?;
    let exe = exe
        .to_str()
        .ok_or_else(|| anyhow!("the tessera binary's path {} is not UTF-8", exe.display()))?;
    let mut words = vec![shell_quote(exe)];
    words.extend(args.iter().map(|a| shell_quote(a)));
    Ok(words.join(" "))
}

/// Runs `work` for every item, at most [`FANOUT`] at once, and returns the results in the
/// order of `items`.
pub fn for_each_parallel<T: Sync, R: Send>(items: &[T], work: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let results: Vec<parking_lot::Mutex<Option<R>>> = items
        .iter()
        .map(|_| parking_lot::Mutex::new(None))
        .collect();
    std::thread::scope(|scope| {
        for _ in 0..FANOUT.min(items.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                *results[i].lock() = Some(work(item));
            });
        }
    });
    results
        .into_iter()
        .map(|r| r.into_inner().expect("every item was worked on"))
        .collect()
}

/// The name this host has among `names`: `$TESSERA_NODE` if set, else this host's name,
/// else its short name (before the first dot).
pub fn local_node_among(names: &[&str]) -> Result<String> {
    let listed = names.join(", ");
    if let Some(node) = env_node() {
        if names.contains(&node.as_str()) {
            return Ok(node);
        }
        bail!(
            "TESSERA_NODE={node} names no node of the list ({listed}); set it to the name \
             this node has in the list, or run the command on one of the listed nodes"
        );
    }
    let host = host_name();
    let short = host.split('.').next().unwrap_or_default().to_string();
    for candidate in [&host, &short] {
        if names.contains(&candidate.as_str()) {
            return Ok(candidate.clone());
        }
    }
    bail!(
        "this host ({host}) is not in the node list ({listed}); the node that runs the \
         command must be one of the cluster's nodes: add it to the list, run the command on \
         a listed node, or set TESSERA_NODE to the name this host has in the list"
    )
}

/// `$TESSERA_NODE`, if set and not empty.
pub fn env_node() -> Option<String> {
    std::env::var("TESSERA_NODE").ok().filter(|v| !v.is_empty())
}

/// Node entries of `-N`: a node file if a file of that name exists, else a list.
pub fn parse_node_entries(text: &str) -> Result<Vec<NodeSpec>> {
    let path = Path::new(text);
    if path.is_file() {
        let content = read_node_file(path)?;
        return parse_node_file(&content).map_err(|e| anyhow!("node file {text}: {e}"));
    }
    parse_node_list(text).map_err(|e| anyhow!("-N {text}: {e}"))
}

/// Node names of `-N` (`node1,node2`, or a node file whose first fields are used).
pub fn parse_node_names(text: &str) -> Result<Vec<String>> {
    let path = Path::new(text);
    if path.is_file() {
        let content = read_node_file(path)?;
        let nodes = parse_node_file(&content).map_err(|e| anyhow!("node file {text}: {e}"))?;
        return Ok(nodes.into_iter().map(|n| n.name).collect());
    }
    let mut names: Vec<String> = Vec::new();
    for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        check_node_name(name).map_err(|e| anyhow!("-N {text}: {e}"))?;
        if names.iter().any(|n| n == name) {
            bail!("-N {text}: node {name} is named twice");
        }
        names.push(name.to_string());
    }
    if names.is_empty() {
        bail!("-N names no node; give node names separated by commas, or a node file");
    }
    if names.len() > MAX_NODES_PER_REQUEST {
        bail!("-N names more than {MAX_NODES_PER_REQUEST} nodes");
    }
    Ok(names)
}

fn read_node_file(path: &Path) -> Result<String> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("cannot open node file {}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(NODE_FILE_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read node file {}", path.display()))?;
    if bytes.len() as u64 > NODE_FILE_BYTES_MAX {
        bail!(
            "node file {} is larger than {NODE_FILE_BYTES_MAX} bytes; is it really a node file?",
            path.display()
        );
    }
    String::from_utf8(bytes).map_err(|_| anyhow!("node file {} is not UTF-8 text", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_a_shell() {
        for word in ["plain", "with space", "it's", "", "$HOME;rm", "a\"b"] {
            let out = Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", shell_quote(word)))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), word);
        }
    }

    #[test]
    fn remote_calls_report_failures_and_deadlines() {
        // `sh -c CMD NODE`: the node name lands in $0, the command runs locally.
        let rsh = RemoteShell {
            program: "sh".into(),
            args: vec!["-c".into(), "eval \"$1\"".into()],
        };
        let ok = rsh
            .run(
                "n1",
                "cat",
                Some(b"package".to_vec()),
                Duration::from_secs(10),
            )
            .unwrap();
        assert_eq!(ok.stdout, "package");
        let e = rsh
            .run(
                "n1",
                "echo unreachable >&2; exit 255",
                None,
                Duration::from_secs(10),
            )
            .unwrap_err();
        assert!(e.starts_with("unreachable ("), "{e}");
        let e = rsh
            .run("n1", "sleep 30", None, Duration::from_millis(200))
            .unwrap_err();
        assert!(e.contains("no answer within"), "{e}");
        let missing = RemoteShell::parse("/nonexistent/rsh -x").unwrap();
        assert!(missing.check_runnable().is_err());
        assert!(RemoteShell::parse("sh -c")
            .unwrap()
            .check_runnable()
            .is_ok());
        let e = RemoteShell::parse("no-such-rsh-9")
            .unwrap()
            .check_runnable()
            .unwrap_err();
        assert!(e.to_string().contains("in PATH"), "{e}");
        let e = missing
            .run("n1", "true", None, Duration::from_secs(1))
            .unwrap_err();
        assert!(e.contains("cannot run the remote shell"), "{e}");
        assert!(RemoteShell::parse("  ").is_err());
    }

    #[test]
    fn parallel_results_keep_their_order() {
        let items: Vec<usize> = (0..100).collect();
        let out = for_each_parallel(&items, |i| i * 2);
        assert_eq!(out, items.iter().map(|i| i * 2).collect::<Vec<_>>());
    }

    #[test]
    fn node_names_are_checked() {
        assert_eq!(parse_node_names("a, b").unwrap(), vec!["a", "b"]);
        assert!(parse_node_names("a,a")
            .unwrap_err()
            .to_string()
            .contains("twice"));
        assert!(parse_node_names(" , ").is_err());
        assert!(parse_node_names("bad_name").is_err());
    }
}
