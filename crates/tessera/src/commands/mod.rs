//! The admin commands, run in the CLI process. Each one checks its arguments, sends one
//! request to the local daemon and renders the reply.

pub mod bench;
pub mod bench_nvme;
pub mod cluster;
pub mod cluster_config;
pub mod da;
pub mod diag;
pub mod drive_server;
pub mod drive_server_metrics;
pub mod fs;
pub mod health;
pub mod io;
pub mod lifecycle;
pub mod node;
pub mod nsd;
pub mod nvme;
pub mod perf;
pub mod pmon;
pub mod policy;
pub mod remote;
pub mod state;
pub mod units;

use std::io::{BufReader, Write};

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use crate::config::Home;
use crate::rpc::{
    read_frame, read_reply, write_frame, Client, Frame, ManagerElsewhere, Reply, Request,
};

/// Sends `request` to the daemon, printing `Info` lines as they come and showing
/// `Progress` frames as a progress bar on stderr (hidden when stderr is not a terminal).
///
/// A request only a file system's manager runs (df, disk add/delete/change, restripe,
/// policy and replication changes), sent on another node, is answered with the manager's
/// name ([`Frame::Elsewhere`]); it is then sent to the manager's daemon through the
/// cluster's remote shell, so that an administrator runs these commands from any node,
/// as GPFS's mm commands run from any node of the cluster.
pub fn call(home: &Home, request: &Request) -> Result<Reply> {
    let mut bar: Option<ProgressBar> = None;
    let mut on_frame = |frame: &Frame| show_frame(frame, &mut bar);
    let result = match Client::connect(home)?.call(request, &mut on_frame) {
        Err(e) => match e.downcast_ref::<ManagerElsewhere>() {
            Some(elsewhere) => call_manager(home, elsewhere, request, &mut on_frame),
            None => Err(e),
        },
        done => done,
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    result
}

fn show_frame(frame: &Frame, bar: &mut Option<ProgressBar>) {
    match frame {
        Frame::Info(line) => match &bar {
            // `println` on a hidden bar (stderr not a terminal) would drop the line.
            Some(b) => b.suspend(|| println!("{line}")),
            None => println!("{line}"),
        },
        Frame::Progress { phase, done, total } => {
            let b = bar.get_or_insert_with(|| {
                let b = ProgressBar::new(*total);
                let style = ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}")
                    .expect("valid template");
                b.set_style(style);
                b
            });
            b.set_length(*total);
            b.set_position(*done);
            b.set_message(phase.clone());
        }
        Frame::Ok(_) | Frame::Err(_) | Frame::Elsewhere { .. } => {}
    }
}

/// Sends `request` to the daemon of the node `elsewhere` names, through the remote shell
/// (`tessera forward-request` there), and reads its answer as from the local daemon. Once:
/// a manager that moved meanwhile answers `Elsewhere` again, which is reported.
fn call_manager(
    home: &Home,
    elsewhere: &ManagerElsewhere,
    request: &Request,
    on_frame: &mut impl FnMut(&Frame),
) -> Result<Reply> {
    let known = cluster::known_nodes(home)?;
    let rsh = remote::RemoteShell::parse(&known.identity.remote_shell)?;
    eprintln!(
        "tessera: node {} is the file system manager of {}; the command runs there",
        elsewhere.node, elsewhere.fs
    );
    let line = remote::tessera_command_line(&["forward-request"])?;
    let mut child = rsh.spawn(&elsewhere.node, &line)?;
    let sent = {
        let mut stdin = child.stdin.take().expect("stdin is piped");
        write_frame(&mut stdin, request)
    };
    let mut answer = BufReader::new(child.stdout.take().expect("stdout is piped"));
    let result = match sent {
        Ok(()) => read_reply(&mut answer, on_frame),
        Err(e) => Err(anyhow!("{e}")),
    };
    drop(answer);
    let status = child.wait().context("cannot wait for the remote shell")?;
    match result {
        Err(e) if e.is::<ManagerElsewhere>() => Err(anyhow!(
            "{e} (the file system manager moved while the command was on its way; run it \
             again)"
        )),
        Err(e) if !status.success() => Err(anyhow!(
            "running the command on node {} through the remote shell `{}` failed ({status}): \
             {e:#}",
            elsewhere.node,
            known.identity.remote_shell
        )),
        done => done,
    }
}

/// `tessera forward-request`: one request from standard input to this node's daemon, and
/// its answer to standard output, frame by frame. A daemon that cannot be reached is
/// answered as an error frame, so the asking node prints why.
pub fn forward_request(home: &Home) -> Result<()> {
    let request: Request = read_frame(&mut std::io::stdin().lock())?
        .ok_or_else(|| anyhow!("no request on standard input"))?;
    let mut out = std::io::stdout().lock();
    match Client::connect(home) {
        Ok(mut client) => client.relay(&request, &mut out)?,
        Err(e) => {
            let node = home
                .cluster()
                .map(|c| c.node_name)
                .unwrap_or_else(|_| "the file system manager".into());
            write_frame(&mut out, &Frame::Err(format!("on {node}: {e:#}")))?;
        }
    }
    out.flush()?;
    Ok(())
}

/// Parses a `yes`/`no` option value.
pub fn yes_no(option: &str, value: &str) -> Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => bail!("{option} {value}: use yes or no"),
    }
}

/// Fails with a protocol error for a reply of the wrong kind.
pub fn unexpected(reply: Reply) -> anyhow::Error {
    anyhow::anyhow!("protocol error: unexpected reply from the daemon: {reply:?}")
}
