//! The `tessera` binary: `tessera daemon` is the node daemon, every other subcommand is the
//! admin CLI and talks to the local daemon over `$TESSERA_HOME/daemon.sock`.

mod cli;
mod commands;
mod config;
mod daemon;
mod output;
mod rpc;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, ClusterCommand, Command, DiskCommand, FsCommand, NsdCommand};
use crate::commands::{cluster, fs, io, nsd, pmon};
use crate::config::Home;

/// The words that prefix an error message, as `mmcrnsd:` prefixes GPFS messages.
fn command_name(c: &Command) -> &'static str {
    match c {
        Command::Daemon => "daemon",
        Command::Cluster(_) => "cluster create",
        Command::Startup => "startup",
        Command::Shutdown => "shutdown",
        Command::State(_) => "state",
        Command::Nsd(NsdCommand::Create { .. }) => "nsd create",
        Command::Nsd(NsdCommand::Ls { .. }) => "nsd ls",
        Command::Nsd(NsdCommand::Delete { .. }) => "nsd delete",
        Command::Fs(FsCommand::Create(_)) => "fs create",
        Command::Fs(FsCommand::Ls(_)) => "fs ls",
        Command::Fs(FsCommand::Delete(_)) => "fs delete",
        Command::Mount(_) => "mount",
        Command::Umount(_) => "umount",
        Command::Df(_) => "df",
        Command::Disk(_) => "disk ls",
        Command::Fsck(_) => "fsck",
        Command::Pmon(_) => "pmon",
    }
}

fn run(home: &Home, command: Command) -> anyhow::Result<()> {
    match command {
        Command::Daemon => daemon::run(home.clone()),
        Command::Cluster(ClusterCommand::Create { name }) => cluster::create(home, &name),
        Command::Startup => cluster::startup(home),
        Command::Shutdown => cluster::shutdown(home),
        Command::State(a) => cluster::state(home, a.machine),
        Command::Nsd(NsdCommand::Create {
            stanza_file,
            verify,
        }) => nsd::create(home, &stanza_file, &verify),
        Command::Nsd(NsdCommand::Ls {
            mapping,
            extended,
            machine,
        }) => nsd::ls(home, mapping, extended, machine),
        Command::Nsd(NsdCommand::Delete { names }) => nsd::delete(home, &names),
        Command::Fs(FsCommand::Create(a)) => fs::create(home, &a),
        Command::Fs(FsCommand::Ls(a)) => fs::ls(home, &a.device, a.machine),
        Command::Fs(FsCommand::Delete(a)) => fs::delete(home, &a.device),
        Command::Mount(a) => io::mount(home, &a.device, a.mount_point.as_deref()),
        Command::Umount(a) => io::umount(home, &a.device),
        Command::Df(a) => io::df(home, &a.device, a.machine),
        Command::Disk(DiskCommand::Ls(a)) => fs::disk_ls(home, &a.device, a.machine),
        Command::Fsck(a) => io::fsck(home, &a.device, a.repair),
        Command::Pmon(a) => pmon::pmon(home, a.device.as_deref(), a.machine),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let name = command_name(&cli.command);
    let result = Home::from_env().and_then(|home| run(&home, cli.command));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tessera {name}: {e:#}");
            ExitCode::FAILURE
        }
    }
}
