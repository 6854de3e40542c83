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

use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressStyle};

use crate::config::Home;
use crate::rpc::{Client, Frame, Reply, Request};

/// Sends `request` to the daemon, printing `Info` lines as they come and showing
/// `Progress` frames as a progress bar on stderr (hidden when stderr is not a terminal).
pub fn call(home: &Home, request: &Request) -> Result<Reply> {
    let mut client = Client::connect(home)?;
    let mut bar: Option<ProgressBar> = None;
    let result = client.call(request, |frame| match frame {
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
        Frame::Ok(_) | Frame::Err(_) => {}
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    result
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
