//! The `tessera` binary: `tessera daemon` is the node daemon, every other subcommand is the
//! admin CLI and talks to the local daemon over `$TESSERA_HOME/daemon.sock`.

mod cli;
mod commands;
mod config;
mod daemon;
mod http_server;
mod openmetrics;
mod output;
mod rpc;
mod signals;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{
    BenchCommand, Cli, ClusterCommand, Command, ConfigCommand, DaCommand, DiskCommand,
    FileAttrCommand, FileCommand, FsCommand, MountArgs, MountCommand, NodeCommand, NsdCommand,
    NvmeCommand, PdiskCommand, PerfCommand, PerfNetCommand, PolicyCommand, VdiskCommand,
};
use crate::commands::{
    bench, bench_nvme, cluster, cluster_config, da, diag, drive_server, fs, health, io, lifecycle,
    node, nsd, nvme, perf, pmon, policy, state,
};
use crate::config::Home;
use crate::rpc::PdiskAction;

/// The words that prefix an error message, as `mmcrnsd:` prefixes GPFS messages.
fn command_name(c: &Command) -> &'static str {
    match c {
        Command::Daemon => "daemon",
        Command::ForwardRequest => "forward-request",
        Command::Cluster(ClusterCommand::Create { .. }) => "cluster create",
        Command::Cluster(ClusterCommand::Accept) => "cluster accept",
        Command::Cluster(ClusterCommand::Ls { .. }) => "cluster ls",
        Command::Node(NodeCommand::Add { .. }) => "node add",
        Command::Node(NodeCommand::Delete { .. }) => "node delete",
        Command::Node(NodeCommand::Change { .. }) => "node change",
        Command::Config(ConfigCommand::Set { .. }) => "config set",
        Command::Config(ConfigCommand::Ls { .. }) => "config ls",
        Command::Startup(_) => "startup",
        Command::Shutdown(_) => "shutdown",
        Command::State(_) => "state",
        Command::Nsd(NsdCommand::Create { .. }) => "nsd create",
        Command::Nsd(NsdCommand::Ls { .. }) => "nsd ls",
        Command::Nsd(NsdCommand::Delete { .. }) => "nsd delete",
        Command::Nsd(NsdCommand::Discover) => "nsd discover",
        Command::Nsd(NsdCommand::Change { .. }) => "nsd change",
        Command::Fs(FsCommand::Create(_)) => "fs create",
        Command::Fs(FsCommand::Ls(_)) => "fs ls",
        Command::Fs(FsCommand::Delete(_)) => "fs delete",
        Command::Fs(FsCommand::Reclaimspace(_)) => "fs reclaimspace",
        Command::Fs(FsCommand::Change(_)) => "fs change",
        Command::Mount(_) => "mount",
        Command::Umount(_) => "umount",
        Command::Df(_) => "df",
        Command::Disk(DiskCommand::Ls(_)) => "disk ls",
        Command::Disk(DiskCommand::Add(_)) => "disk add",
        Command::Disk(DiskCommand::Change(_)) => "disk change",
        Command::Disk(DiskCommand::Delete(_)) => "disk delete",
        Command::Restripe(_) => "restripe",
        Command::Policy(PolicyCommand::Change(_)) => "policy change",
        Command::Policy(PolicyCommand::Ls(_)) => "policy ls",
        Command::Policy(PolicyCommand::Apply(_)) => "policy apply",
        Command::File(FileCommand::Attr(FileAttrCommand::Ls { .. })) => "file attr ls",
        Command::File(FileCommand::Attr(FileAttrCommand::Set { .. })) => "file attr set",
        Command::Fsck(_) => "fsck",
        Command::Pmon(_) => "pmon",
        Command::Diag(_) => "diag",
        Command::Health(_) => "health",
        Command::Bench(BenchCommand::Ec { .. }) => "bench ec",
        Command::Bench(BenchCommand::Vdisk { .. }) => "bench vdisk",
        Command::Bench(BenchCommand::Nvme { .. }) => "bench nvme",
        Command::Da(DaCommand::Create { .. }) => "da create",
        Command::Da(DaCommand::Ls { .. }) => "da ls",
        Command::Da(DaCommand::Change { .. }) => "da change",
        Command::Da(DaCommand::Delete { .. }) => "da delete",
        Command::Da(DaCommand::Move { .. }) => "da move",
        Command::Da(DaCommand::Scrub { .. }) => "da scrub",
        Command::Vdisk(VdiskCommand::Create { .. }) => "vdisk create",
        Command::Vdisk(VdiskCommand::Ls { .. }) => "vdisk ls",
        Command::Vdisk(VdiskCommand::Delete { .. }) => "vdisk delete",
        Command::Pdisk(PdiskCommand::Ls { .. }) => "pdisk ls",
        Command::Pdisk(PdiskCommand::Fail { .. }) => "pdisk fail",
        Command::Pdisk(PdiskCommand::Suspend { .. }) => "pdisk suspend",
        Command::Pdisk(PdiskCommand::Resume { .. }) => "pdisk resume",
        Command::Pdisk(PdiskCommand::Replace { .. }) => "pdisk replace",
        Command::Nvme(NvmeCommand::Discover { .. }) => "nvme discover",
        Command::Nvme(NvmeCommand::Connect { .. }) => "nvme connect",
        Command::Nvme(NvmeCommand::ConnectAll { .. }) => "nvme connect-all",
        Command::Nvme(NvmeCommand::List { .. }) => "nvme list",
        Command::Nvme(NvmeCommand::Disconnect { .. }) => "nvme disconnect",
        Command::Nvme(NvmeCommand::DisconnectAll) => "nvme disconnect-all",
        Command::Nvme(NvmeCommand::ShowHostnqn) => "nvme show-hostnqn",
        Command::DriveServer(_) => "drive-server",
        Command::Perf(PerfCommand::Nsd { .. }) => "perf nsd",
        Command::Perf(_) => "perf net",
    }
}

fn run(home: &Home, command: Command) -> anyhow::Result<()> {
    match command {
        Command::Daemon => daemon::run(home.clone()),
        Command::ForwardRequest => commands::forward_request(home),
        Command::Cluster(c) => run_cluster(home, c),
        Command::Node(c) => run_node(home, c),
        Command::Config(ConfigCommand::Set { changes, nodes }) => {
            cluster_config::set(home, &changes, nodes.as_deref())
        }
        Command::Config(ConfigCommand::Ls { machine }) => cluster_config::ls(home, machine),
        Command::Startup(a) => lifecycle::startup_nodes(home, &a),
        Command::Shutdown(a) => lifecycle::shutdown_nodes(home, &a),
        Command::State(a) => state::state(home, &a.select, a.summary, a.machine),
        Command::Nsd(NsdCommand::Create {
            stanza_file,
            verify,
        }) => nsd::create(home, &stanza_file, &verify),
        Command::Nsd(NsdCommand::Ls {
            mapping,
            all_nodes,
            extended,
            machine,
        }) => {
            let mapping = if all_nodes {
                nsd::Mapping::Everywhere
            } else if mapping {
                nsd::Mapping::Local
            } else {
                nsd::Mapping::None
            };
            nsd::ls(home, mapping, extended, machine)
        }
        Command::Nsd(NsdCommand::Delete { names }) => nsd::delete(home, &names),
        Command::Nsd(NsdCommand::Discover) => nsd::discover(home),
        Command::Nsd(NsdCommand::Change { name, device, file }) => match (name, device, file) {
            (Some(name), Some(device), None) => nsd::change(home, &name, &device),
            (None, None, Some(file)) => nsd::change_servers(home, &file),
            _ => unreachable!("clap requires NAME --device or -F"),
        },
        Command::Fs(FsCommand::Create(a)) => fs::create(home, &a),
        Command::Fs(FsCommand::Ls(a)) => fs::ls(home, &a.device, a.machine),
        Command::Fs(FsCommand::Delete(a)) => fs::delete(home, &a.device, a.unreadable_ok),
        Command::Fs(FsCommand::Reclaimspace(a)) => fs::reclaimspace(home, &a.device),
        Command::Fs(FsCommand::Change(a)) => fs::change(home, &a),
        Command::Policy(PolicyCommand::Change(a)) => policy::change(home, &a),
        Command::Policy(PolicyCommand::Ls(a)) => policy::ls(home, &a.device),
        Command::Policy(PolicyCommand::Apply(a)) => policy::apply(home, &a),
        Command::File(FileCommand::Attr(FileAttrCommand::Ls { paths })) => {
            policy::file_attr_ls(home, &paths)
        }
        Command::File(FileCommand::Attr(FileAttrCommand::Set { replication, paths })) => {
            policy::file_attr_set(home, replication, &paths)
        }
        Command::Mount(MountArgs {
            list: Some(MountCommand::Ls(a)),
            ..
        }) => io::mount_ls(home, a.device.as_deref(), a.long, a.machine),
        Command::Mount(a) => {
            let device = a
                .device
                .as_deref()
                .expect("clap requires DEVICE without `ls`");
            io::mount_nodes(home, device, a.mount_point.as_deref(), &a.select)
        }
        Command::Umount(a) => io::umount_nodes(home, &a.device, &a.select),
        Command::Df(a) => io::df(home, &a.device, a.machine),
        Command::Disk(DiskCommand::Ls(a)) => fs::disk_ls(home, &a.device, a.long, a.machine),
        Command::Disk(DiskCommand::Add(a)) => fs::disk_add(home, &a),
        Command::Disk(DiskCommand::Change(a)) => fs::disk_change(home, &a),
        Command::Disk(DiskCommand::Delete(a)) => fs::disk_delete(home, &a),
        Command::Restripe(a) => fs::restripe(home, &a),
        Command::Fsck(a) => io::fsck(home, &a.device, a.repair),
        Command::Pmon(a) => match &a.input {
            Some(file) => pmon::pmon_file(
                home,
                a.device.as_deref(),
                a.machine,
                file,
                a.repeat,
                a.delay_ms,
            ),
            None => pmon::pmon(home, a.device.as_deref(), a.machine),
        },
        Command::Diag(a) => diag::diag(home, &a),
        Command::Health(a) => health::health(home, &a),
        Command::Bench(BenchCommand::Ec {
            code,
            strip,
            seconds,
            machine,
        }) => bench::ec(&code, &strip, seconds, machine),
        Command::Bench(BenchCommand::Nvme {
            dir,
            size,
            seconds,
            rounds,
            qd,
            only,
            remote_only,
            huge_buffers,
            machine,
        }) => bench_nvme::nvme(&bench_nvme::NvmeBenchArgs {
            dir: &dir,
            file_bytes: commands::units::parse_size(&size)
                .ok_or_else(|| anyhow::anyhow!("--size {size}: use a size like 1G"))?,
            seconds,
            rounds,
            queue_depth: qd,
            only: only.as_deref(),
            remote_only,
            huge_buffers,
            machine,
        }),
        Command::Bench(BenchCommand::Vdisk {
            stanza_file,
            code,
            block_size,
            size,
            threads,
            rounds,
            rebuild,
        }) => bench::vdisk(&bench::VdiskBenchArgs {
            rounds,
            stanza: &stanza_file,
            code: &code,
            block_size: &block_size,
            size: &size,
            threads,
            rebuild,
        }),
        Command::Da(DaCommand::Create {
            name,
            stanza_file,
            spares,
            settings,
            verify,
            servers,
        }) => da::create(
            home,
            &name,
            &stanza_file,
            spares,
            &settings,
            &verify,
            servers,
        ),
        Command::Da(DaCommand::Change { name, settings }) => da::change(home, &name, &settings),
        Command::Da(DaCommand::Delete { name }) => da::delete(home, &name),
        Command::Da(DaCommand::Move { name, server }) => da::move_to(home, &name, &server),
        Command::Da(DaCommand::Ls { name, machine }) => da::ls(home, name.as_deref(), machine),
        Command::Da(DaCommand::Scrub { name }) => da::scrub(home, &name),
        Command::Vdisk(VdiskCommand::Create {
            name,
            da: array,
            code,
            block_size,
            size,
        }) => da::vdisk_create(home, &name, &array, &code, &block_size, &size),
        Command::Vdisk(VdiskCommand::Ls { machine }) => da::vdisk_ls(home, machine),
        Command::Vdisk(VdiskCommand::Delete { name }) => da::vdisk_delete(home, &name),
        Command::Pdisk(PdiskCommand::Ls {
            not_ok,
            all,
            machine,
        }) => da::pdisk_ls(home, not_ok, all, machine),
        Command::Pdisk(PdiskCommand::Fail { name, force }) => {
            da::pdisk_change(home, &name, PdiskAction::Fail, force)
        }
        Command::Pdisk(PdiskCommand::Suspend { name }) => {
            da::pdisk_change(home, &name, PdiskAction::Suspend, false)
        }
        Command::Pdisk(PdiskCommand::Resume { name }) => {
            da::pdisk_change(home, &name, PdiskAction::Resume, false)
        }
        Command::Pdisk(PdiskCommand::Replace { name, device }) => {
            da::pdisk_replace(home, &name, &device)
        }
        Command::Nvme(c) => run_nvme(home, c),
        Command::DriveServer(a) => drive_server::run(&a.config, a.metrics_address.as_deref()),
        Command::Perf(PerfCommand::Net(PerfNetCommand::Server {
            listen,
            listen_option,
        })) => perf::server(
            listen
                .or(listen_option)
                .as_deref()
                .unwrap_or(perf::LISTEN_DEFAULT),
        ),
        Command::Perf(PerfCommand::Net(PerfNetCommand::Run {
            servers,
            op,
            size,
            threads,
            seconds,
            machine,
        })) => {
            let size = commands::units::parse_size(&size)
                .and_then(|b| u32::try_from(b).ok())
                .ok_or_else(|| anyhow::anyhow!("--size {size}: use a size like 4K or 1M"))?;
            perf::run(&perf::RunArgs {
                servers: &servers,
                op: &op,
                size,
                threads,
                seconds,
                machine,
            })
        }
        Command::Perf(PerfCommand::Nsd {
            nsd,
            op,
            size,
            threads,
            seconds,
            machine,
        }) => {
            let size = commands::units::parse_size(&size)
                .and_then(|b| u32::try_from(b).ok())
                .ok_or_else(|| anyhow::anyhow!("--size {size}: use a size like 4K or 1M"))?;
            nsd::perf(home, &nsd, &op, size, threads, seconds, machine)
        }
    }
}

fn run_cluster(home: &Home, command: ClusterCommand) -> anyhow::Result<()> {
    match command {
        ClusterCommand::Create {
            name,
            nodes,
            remote_shell,
            config,
        } => cluster::create(
            home,
            &cluster::CreateArgs {
                name: &name,
                nodes: nodes.as_deref(),
                remote_shell: &remote_shell,
                config: config.as_deref(),
            },
        ),
        ClusterCommand::Accept => cluster::accept(home),
        ClusterCommand::Ls { machine } => cluster::ls(home, machine),
    }
}

fn run_node(home: &Home, command: NodeCommand) -> anyhow::Result<()> {
    match command {
        NodeCommand::Add { nodes } => node::add(home, &nodes),
        NodeCommand::Delete { nodes } => node::delete(home, &nodes),
        NodeCommand::Change {
            nodes,
            quorum,
            nonquorum,
            manager,
            client,
            address,
        } => node::change(
            home,
            &node::ChangeArgs {
                nodes: &nodes,
                quorum,
                nonquorum,
                manager,
                client,
                address: address.as_deref(),
            },
        ),
    }
}

fn run_nvme(home: &Home, command: NvmeCommand) -> anyhow::Result<()> {
    match command {
        NvmeCommand::Discover { target, machine } => nvme::discover(home, &target, machine),
        NvmeCommand::Connect {
            target,
            nqn,
            tunables,
        } => nvme::connect(home, &target, &nqn, &tunables),
        NvmeCommand::ConnectAll {
            config,
            transport,
            traddr,
            trsvcid,
            hostnqn,
            tunables,
        } => nvme::connect_all(
            home,
            config.as_deref(),
            &transport,
            traddr.as_deref(),
            trsvcid,
            hostnqn.as_deref(),
            &tunables,
        ),
        NvmeCommand::List { machine } => nvme::list(home, machine),
        NvmeCommand::Disconnect {
            nqn,
            traddr,
            trsvcid,
        } => nvme::disconnect(home, Some(&nqn), traddr.as_deref(), trsvcid),
        NvmeCommand::DisconnectAll => nvme::disconnect(home, None, None, None),
        NvmeCommand::ShowHostnqn => nvme::show_hostnqn(home),
    }
}

/// Keeps large I/O buffers (stripes, blocks) in the heap once freed instead of returning
/// them to the kernel: glibc otherwise serves every buffer above 128 KiB with a fresh
/// mmap, and page-faulting in a new stripe buffer per write cost a fifth of the CPU of a
/// vdisk write.
fn keep_io_buffers_in_heap() {
    // SAFETY: mallopt only changes allocator tunables; called before any other thread runs.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

/// `tessera ... | head` must end quietly when `head` has read enough, as `ls` does, not
/// with a panic and a backtrace. SIGPIPE stays ignored (Rust's default): a daemon or a
/// command that writes to a socket whose peer went away gets an error to report, not a
/// silent death. Only a failed print to a closed stdout ends the process, with the status
/// a shell shows for a reader that went away (128 + SIGPIPE).
fn end_quietly_when_stdout_closes() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        let epipe = format!("(os error {})", libc::EPIPE);
        if message.starts_with("failed printing to stdout") && message.contains(&epipe) {
            std::process::exit(128 + libc::SIGPIPE);
        }
        default(info);
    }));
}

fn main() -> ExitCode {
    keep_io_buffers_in_heap();
    end_quietly_when_stdout_closes();
    let cli = Cli::parse();
    let name = command_name(&cli.command);
    let result = Home::from_env().and_then(|home| run(&home, cli.command));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tessera {name}: {e:#}");
            match e.downcast_ref::<output::PartlyDone>() {
                Some(partly) => ExitCode::from(partly.code),
                None => ExitCode::FAILURE,
            }
        }
    }
}
