//! The command line, in clap derive form. Option letters follow the GPFS commands each
//! subcommand mirrors (mmcrnsd, mmcrfs, mmlsfs, ...), so stanza files and habits carry over.
//! Values are kept as text here and checked in the commands, where the error can say what
//! the accepted values are in the words of the option.

use std::path::PathBuf;

use clap::{ArgGroup, Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "tessera",
    version,
    about = "Tessera parallel cluster file system: node daemon and admin CLI",
    after_help = "Everything a node keeps lives under $TESSERA_HOME (default /var/lib/tessera)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the node daemon in the foreground (`tessera startup` runs it in the background).
    Daemon,
    /// Relay one request (JSON, on standard input) to this node's daemon and its answer,
    /// frame by frame, to standard output: how another node's admin command reaches the
    /// file system manager through the remote shell.
    #[command(hide = true)]
    ForwardRequest,
    /// Create a cluster and list it [mmcrcluster, mmlscluster].
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Add, delete and change nodes of the cluster [mmaddnode, mmdelnode, mmchnode].
    #[command(subcommand)]
    Node(NodeCommand),
    /// Configuration parameters of the cluster [mmchconfig, mmlsconfig].
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Start daemons in the background [mmstartup].
    ///
    /// This node's, or with -a/-N those nodes' (other nodes through the cluster's remote
    /// shell, all at once). Exits non-zero naming the nodes that failed.
    Startup(NodeSelectArgs),
    /// Unmount every file system and stop daemons [mmshutdown].
    ///
    /// This node's, or with -a/-N those nodes' (other nodes through the cluster's remote
    /// shell): the other nodes first, this node last. Exits non-zero naming the nodes that
    /// failed.
    Shutdown(NodeSelectArgs),
    /// The state of the daemons [mmgetstate].
    ///
    /// active, arbitrating (no quorum), down (nothing listens) or unknown (no answer); this
    /// node alone unless -a or -N. With the local daemon down, this node is down and the
    /// others (from the node table this node keeps) unknown.
    State(StateArgs),
    /// Network shared disks [mmcrnsd, mmlsnsd, mmdelnsd].
    #[command(subcommand)]
    Nsd(NsdCommand),
    /// File systems [mmcrfs, mmlsfs, mmdelfs].
    #[command(subcommand)]
    Fs(FsCommand),
    /// Mount a file system [mmmount]; `mount ls` lists where file systems are mounted
    /// [mmlsmount].
    Mount(MountArgs),
    /// Unmount a file system [mmumount].
    #[command(
        after_help = "Exit status: 0 unmounted; 2 unmounted, but the final checkpoint \
                            could not be written (the next mount replays the recovery log); \
                            1 not unmounted."
    )]
    Umount(UmountArgs),
    /// Free space per disk and per storage pool [mmdf].
    Df(DeviceListArgs),
    /// Disks of a file system [mmlsdisk].
    #[command(subcommand)]
    Disk(DiskCommand),
    /// Check an unmounted file system [mmfsck].
    Fsck(FsckArgs),
    /// Policies of a file system: placement of new files in storage pools, and migration,
    /// deletion and list rules [mmchpolicy, mmlspolicy].
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Attributes of files that `stat` does not show [mmlsattr].
    #[command(subcommand)]
    File(FileCommand),
    /// Move file data between the disks of a file system, mounted or not, with progress:
    /// off suspended disks, metadata pages too (-m), or evenly over all (-b) [mmrestripefs]. Interrupting it
    /// (Ctrl-C) stops it cleanly; running it again continues.
    Restripe(RestripeArgs),
    /// I/O counters and latency histograms of mounted file systems [mmpmon fs_io_s, rhist].
    Pmon(PmonArgs),
    /// What this node's daemon is doing [mmdiag].
    Diag(DiagArgs),
    /// Health of this node's components and the events that set it [mmhealth]:
    /// `tessera health [node|fs|disk|pdisk|da] [show|eventlog] [NAME]`.
    Health(HealthArgs),
    /// Declustered arrays of pdisks [mmvdisk recoverygroup/declustered array].
    #[command(subcommand)]
    Da(DaCommand),
    /// Erasure-coded virtual disks carved from declustered arrays [mmvdisk vdiskset].
    #[command(subcommand)]
    Vdisk(VdiskCommand),
    /// Physical disks of declustered arrays [mmvdisk pdisk].
    #[command(subcommand)]
    Pdisk(PdiskCommand),
    /// Measure this machine [ceph_erasure_code_benchmark].
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Remote drives over NVMe/TCP: discover, connect, list paths, disconnect [nvme-cli,
    /// multipath -ll].
    #[command(subcommand)]
    Nvme(NvmeCommand),
    /// Export local drives over NVMe/TCP as a drive server (a JBOF or the controllers of
    /// an array), in the foreground until SIGTERM or SIGINT [nvmet].
    DriveServer(DriveServerArgs),
    /// Network tests between nodes [nsdperf].
    #[command(subcommand)]
    Perf(PerfCommand),
}

#[derive(Subcommand, Debug)]
pub enum PerfCommand {
    /// Network throughput and latency between nodes, to tell a network problem from a
    /// storage problem.
    #[command(subcommand)]
    Net(PerfNetCommand),
    /// Throughput and latency of one NSD as this node reaches it (its device, or through
    /// its NSD servers): node-to-NSD-server streams without the file system [nsdperf].
    /// Writes only to a free NSD (one no file system uses).
    Nsd {
        /// The NSD.
        nsd: String,
        /// `read` or `write`.
        #[arg(long = "op", default_value = "read")]
        op: String,
        /// Request size (K, M suffixes), at most 16M.
        #[arg(long = "size", default_value = "1M")]
        size: String,
        /// Requests in flight (one thread each).
        #[arg(short = 't', long = "threads", default_value_t = 4)]
        threads: u32,
        #[arg(long = "seconds", default_value_t = 5)]
        seconds: u32,
        #[arg(short = 'Y')]
        machine: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum PerfNetCommand {
    /// Answer perf clients on ADDR[:PORT] (default 0.0.0.0, port 6669) until stopped.
    Server {
        /// ADDR[:PORT] to listen on.
        #[arg(value_name = "ADDR[:PORT]", conflicts_with = "listen_option")]
        listen: Option<String>,
        /// The same, as an option.
        #[arg(short = 'l', long = "listen", value_name = "ADDR[:PORT]")]
        listen_option: Option<String>,
    },
    /// Stream requests to every server at once and report MB/s and latency per server.
    Run {
        /// Servers, ADDR[:PORT], comma separated.
        #[arg(short = 's', long = "servers", value_delimiter = ',', required = true)]
        servers: Vec<String>,
        /// `write` (this node sends) or `read` (the servers send).
        #[arg(long = "op", default_value = "write")]
        op: String,
        /// Request size (K, M suffixes), at most 16M.
        #[arg(long = "size", default_value = "1M")]
        size: String,
        /// Connections per server.
        #[arg(short = 't', long = "threads", default_value_t = 4)]
        threads: usize,
        #[arg(long = "seconds", default_value_t = 5)]
        seconds: u64,
        #[arg(short = 'Y')]
        machine: bool,
    },
}

/// Where a discovery or I/O controller listens; the option letters are nvme-cli's.
#[derive(Args, Debug, Clone)]
pub struct NvmeTargetArgs {
    /// Transport type; only `tcp`.
    #[arg(short = 't', long = "transport", default_value = "tcp")]
    pub transport: String,
    /// Transport address (an IPv4 or IPv6 address, or a host name).
    #[arg(short = 'a', long = "traddr")]
    pub traddr: String,
    /// Transport service id: the TCP port (default 8009 for discovery, 4420 for I/O).
    #[arg(short = 's', long = "trsvcid")]
    pub trsvcid: Option<u16>,
    /// Host NQN to present instead of the node's ($TESSERA_HOME/hostnqn).
    #[arg(short = 'q', long = "hostnqn")]
    pub hostnqn: Option<String>,
}

/// Connection tunables, as nvme-cli names them.
#[derive(Args, Debug, Clone)]
pub struct NvmeConnectTunables {
    /// I/O queue depth (entries per I/O queue).
    #[arg(short = 'Q', long = "queue-size", default_value_t = 128)]
    pub queue_size: u16,
    /// Seconds to keep retrying a lost controller (and queueing I/O while no path is
    /// usable) before giving up on it.
    #[arg(short = 'l', long = "ctrl-loss-tmo", default_value_t = 600)]
    pub ctrl_loss_tmo: u32,
    /// Seconds I/O waits for a lost controller before failing, while reconnecting goes on
    /// until ctrl-loss-tmo (default: off, I/O waits ctrl-loss-tmo). Set it short under a
    /// declustered array, which then serves from parity and gets the drives back when
    /// their enclosure returns.
    #[arg(short = 'f', long = "fast-io-fail-tmo", alias = "fast_io_fail_tmo")]
    pub fast_io_fail_tmo: Option<u32>,
    /// Seconds between reconnect attempts.
    #[arg(short = 'c', long = "reconnect-delay", default_value_t = 2)]
    pub reconnect_delay: u32,
    /// Keep-alive timeout in seconds.
    #[arg(short = 'k', long = "keep-alive-tmo", default_value_t = 5)]
    pub keep_alive_tmo: u32,
    /// Number of I/O queues (default: one per CPU, at most 4).
    #[arg(short = 'i', long = "nr-io-queues")]
    pub nr_io_queues: Option<u16>,
    /// Header digests (CRC32C).
    #[arg(short = 'g', long = "hdr-digest")]
    pub hdr_digest: bool,
    /// Data digests (CRC32C).
    #[arg(short = 'G', long = "data-digest")]
    pub data_digest: bool,
}

#[derive(Subcommand, Debug)]
pub enum NvmeCommand {
    /// Print the discovery log page of a discovery controller [nvme discover].
    Discover {
        #[command(flatten)]
        target: NvmeTargetArgs,
        #[arg(short = 'Y')]
        machine: bool,
    },
    /// Connect to an NVM subsystem; the daemon keeps the connection and restores it at
    /// restart [nvme connect].
    Connect {
        #[command(flatten)]
        target: NvmeTargetArgs,
        /// Subsystem NQN.
        #[arg(short = 'n', long = "nqn")]
        nqn: String,
        #[command(flatten)]
        tunables: NvmeConnectTunables,
    },
    /// Discover and connect to every subsystem of the discovery controllers listed in a
    /// discovery.conf-style file (one `--transport=tcp --traddr=A --trsvcid=P` line per
    /// controller), or of the one given with -a [nvme connect-all].
    ConnectAll {
        /// The file; default $TESSERA_HOME/discovery.conf.
        #[arg(short = 'J', long = "config")]
        config: Option<PathBuf>,
        #[arg(short = 't', long = "transport", default_value = "tcp")]
        transport: String,
        #[arg(short = 'a', long = "traddr")]
        traddr: Option<String>,
        #[arg(short = 's', long = "trsvcid")]
        trsvcid: Option<u16>,
        #[arg(short = 'q', long = "hostnqn")]
        hostnqn: Option<String>,
        #[command(flatten)]
        tunables: NvmeConnectTunables,
    },
    /// Namespaces with every path, its ANA state and counters [nvme list, multipath -ll].
    List {
        #[arg(short = 'Y')]
        machine: bool,
    },
    /// Disconnect every path to a subsystem, or one path with -a/-s [nvme disconnect].
    Disconnect {
        #[arg(short = 'n', long = "nqn")]
        nqn: String,
        #[arg(short = 'a', long = "traddr")]
        traddr: Option<String>,
        #[arg(short = 's', long = "trsvcid")]
        trsvcid: Option<u16>,
    },
    /// Disconnect every NVMe/TCP controller of this node [nvme disconnect-all].
    DisconnectAll,
    /// Print this node's host NQN [nvme show-hostnqn].
    ShowHostnqn,
}

#[derive(Args, Debug)]
pub struct DriveServerArgs {
    /// The drive-server configuration (JSON in nvmetcli's saveconfig layout: hosts,
    /// ports, subsystems with namespaces and allowed hosts, ANA groups).
    #[arg(short = 'c', long = "config")]
    pub config: PathBuf,
    /// Serve Prometheus metrics (per port and per namespace) on IP:PORT at /metrics; off
    /// when left out. `127.0.0.1:PORT` keeps them on the host.
    #[arg(long, value_name = "IP:PORT")]
    pub metrics_address: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum DaCommand {
    /// Create a declustered array from %pdisk stanzas.
    Create {
        /// The array name.
        name: String,
        /// The %pdisk stanza file (pdisk= device= enclosure= slot=).
        #[arg(short = 'F')]
        stanza_file: PathBuf,
        /// Spare space, in pdisks' worth of capacity spread over every pdisk
        /// (default: 1 per 12 pdisks, at least 1).
        #[arg(long = "spares")]
        spares: Option<u32>,
        #[command(flatten)]
        settings: DaSettingsArgs,
        /// `yes` refuses devices that already hold a pdisk, an NSD or a file system.
        #[arg(short = 'v', default_value = "yes")]
        verify: String,
        /// Server nodes that reach every pdisk, this node among them: the array is served
        /// by one of them at a time, and when that one is expelled the cluster manager
        /// gives it to another (any-to-any; default: this node alone).
        #[arg(long = "servers", value_delimiter = ',', value_name = "NODE[,NODE...]")]
        servers: Vec<String>,
    },
    /// Delete a declustered array that holds no vdisks; its drives are free again.
    Delete { name: String },
    /// Move an array to another server node that reaches its pdisks [mmvdisk recoverygroup
    /// change --active]: run on the array's server, which closes it; NODE then opens it and
    /// serves the NSDs of its vdisks that list NODE in servers=.
    Move {
        name: String,
        #[arg(long = "server", value_name = "NODE")]
        server: String,
    },
    /// Change the foreground I/O share, scrub rate or error limit of an array.
    Change {
        name: String,
        #[command(flatten)]
        settings: DaSettingsArgs,
    },
    /// List declustered arrays with capacity, state, rebuild and scrub progress.
    Ls {
        /// Only this array.
        name: Option<String>,
        #[arg(short = 'Y')]
        machine: bool,
    },
    /// Start a media scan that reads and verifies every strip, and repairs what it can.
    Scrub { name: String },
}

/// Tunables of a declustered array.
#[derive(Args, Debug)]
pub struct DaSettingsArgs {
    /// Percent of I/O time kept for foreground I/O while a rebuild runs (0-95; default
    /// 50); the rest goes to the rebuild. An idle array rebuilds at full speed.
    #[arg(
        long = "foreground-io-share",
        alias = "rebuild-io-share",
        value_name = "PCT"
    )]
    pub foreground_io_share: Option<u8>,
    /// Background scrub rate in MB/s over all pdisks together (default 200).
    #[arg(long = "scrub-rate")]
    pub scrub_rate: Option<u32>,
    /// I/O errors after which a pdisk is declared dead and rebuilt (default 8).
    #[arg(long = "pdisk-error-limit")]
    pub pdisk_error_limit: Option<u32>,
}

#[derive(Subcommand, Debug)]
pub enum VdiskCommand {
    /// Create a vdisk; use it as an NSD with `device=vdisk:NAME` in a %nsd stanza.
    Create {
        /// The vdisk name.
        name: String,
        /// The declustered array to carve it from.
        #[arg(long = "da")]
        da: String,
        /// 8+2p, 8+3p, 4+2p, 4+3p (any k+mp with k <= 16, m <= 4), 3WayReplication,
        /// 4WayReplication.
        #[arg(long = "code", default_value = "8+2p")]
        code: String,
        /// The block size of the file system that will use it: one block is one full
        /// stripe of k strips.
        #[arg(long = "block-size", default_value = "4M")]
        block_size: String,
        /// Capacity: a size such as 500G, or a percentage of the array's free space (80%).
        #[arg(long = "size", default_value = "100%")]
        size: String,
    },
    /// List vdisks.
    Ls {
        #[arg(short = 'Y')]
        machine: bool,
    },
    /// Delete a vdisk that no NSD uses, also one that lost data.
    Delete { name: String },
}

#[derive(Subcommand, Debug)]
pub enum PdiskCommand {
    /// List pdisks (without the records of replaced drives; --all shows them).
    Ls {
        /// Only pdisks whose state is not ok.
        #[arg(long = "not-ok")]
        not_ok: bool,
        /// Also the records of drives that were replaced.
        #[arg(long = "all")]
        all: bool,
        #[arg(short = 'Y')]
        machine: bool,
    },
    /// Declare a pdisk dead; its data is rebuilt into spare space at once. Refused when
    /// a vdisk would lose data (the pdisks already down count), unless --force.
    Fail {
        name: String,
        /// Fail it even though vdisks lose data: their NSDs and file systems become
        /// partly unreadable.
        #[arg(long = "force")]
        force: bool,
    },
    /// Take a pdisk out of service for maintenance, without rebuilding it.
    Suspend { name: String },
    /// Return a suspended pdisk to service.
    Resume { name: String },
    /// Replace a pdisk with a new drive; data is rebalanced onto it.
    Replace {
        name: String,
        /// The new drive.
        #[arg(long = "device")]
        device: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Raw drives against a vdisk built on them: sequential write and read, and rebuild.
    /// DESTROYS the data on the drives of the stanza file.
    Vdisk {
        /// %pdisk stanza file naming scratch drives.
        #[arg(short = 'F')]
        stanza_file: PathBuf,
        #[arg(long = "code", default_value = "8+2p")]
        code: String,
        /// Vdisk block size (one full stripe); every I/O is one block.
        #[arg(long = "block-size", default_value = "1M")]
        block_size: String,
        /// Data written to the vdisk (and, times (k+m)/k, to the raw drives).
        #[arg(long = "size", default_value = "2G")]
        size: String,
        /// Writer and reader threads on the vdisk.
        #[arg(long = "threads", default_value_t = 4)]
        threads: usize,
        /// Rounds of raw write, vdisk write, raw read, vdisk read; the median ratio counts.
        #[arg(long = "rounds", default_value_t = 3)]
        rounds: usize,
        /// Also fail one pdisk and measure the rebuild and a foreground read meanwhile.
        #[arg(long = "rebuild")]
        rebuild: bool,
    },
    /// One file through NVMe/TCP over loopback (a drive-server child process) against
    /// the same file with local O_DIRECT, in the same run: sequential 1 MiB and random
    /// 4 KiB, throughput, IOPS, latency and ratios.
    Nvme {
        /// Directory for the test file (on the backing store to measure).
        #[arg(long = "dir", default_value = "/var/tmp")]
        dir: PathBuf,
        #[arg(long = "size", default_value = "1G")]
        size: String,
        /// Seconds per workload per round.
        #[arg(long = "seconds", default_value_t = 5)]
        seconds: u64,
        /// Rounds of local then remote; the median counts.
        #[arg(long = "rounds", default_value_t = 3)]
        rounds: usize,
        /// Queue depth of the random workloads (threads with one I/O each).
        #[arg(long = "qd", default_value_t = 32)]
        qd: usize,
        /// Only the workloads whose name contains this text (`rand read`, `seq`).
        #[arg(long = "only")]
        only: Option<String>,
        /// Skip the local runs, to profile the transport alone.
        #[arg(long = "remote-only")]
        remote_only: bool,
        /// Put the benchmark's own I/O buffers (local and remote) on huge pages; by default
        /// they are on base pages, like fio's.
        #[arg(long = "huge-buffers")]
        huge_buffers: bool,
        #[arg(short = 'Y')]
        machine: bool,
    },
    /// Erasure-code encode and decode speed on one core.
    Ec {
        /// The code: 8+2p, 4+3p, ..., 3WayReplication, 4WayReplication.
        #[arg(long = "code", default_value = "8+2p")]
        code: String,
        /// Strip size (one file-system block is k strips), such as 128K or 1M.
        #[arg(long = "strip", default_value = "128K")]
        strip: String,
        /// How long to run encode, and then decode.
        #[arg(long = "seconds", default_value_t = 3.0)]
        seconds: f64,
        #[arg(short = 'Y')]
        machine: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Create a cluster of the nodes of -N (without -N: of this node alone) [mmcrcluster].
    #[command(after_help = CLUSTER_CREATE_HELP)]
    Create {
        /// The cluster name.
        #[arg(long = "name", short = 'C')]
        name: String,
        /// The nodes: a node file, or `name[:designation[:address]]` entries separated by
        /// commas. This node must be one of them.
        #[arg(short = 'N', value_name = "NODEFILE|NODE[,NODE...]")]
        nodes: Option<String>,
        /// The command that reaches another node, called as ssh is:
        /// `RSH NODE "COMMAND LINE"`. Kept for `startup -a` and `node add`.
        #[arg(short = 'r', long = "remote-shell", default_value = "ssh")]
        remote_shell: String,
        /// Parameters different from the defaults, NAME=VALUE[,NAME=VALUE...] as for
        /// `tessera config set`.
        #[arg(long = "config", value_name = "NAME=VALUE[,...]")]
        config: Option<String>,
    },
    /// Make this node a member: reads the accept package that `cluster create` or
    /// `node add` wrote (JSON, on standard input) and sets up $TESSERA_HOME from it.
    #[command(hide = true)]
    Accept,
    /// The cluster's name, id, remote shell, manager and node table [mmlscluster].
    ///
    /// With the local daemon down: the node table as this node last knew it.
    Ls {
        /// Colon-separated machine-readable output.
        #[arg(short = 'Y')]
        machine: bool,
    },
}

/// How `cluster create` reaches the other nodes.
const CLUSTER_CREATE_HELP: &str = "\
Node entries, one per line in a node file (# starts a comment) or comma separated:
  name[:designation[:address]]
designation: quorum or nonquorum and manager or client, joined by `-` (quorum-manager,
quorum, manager, client; empty: client). address: host, host:port, [ipv6]:port; default
the node name, port 1191. Several nodes on one machine differ by address or port.

This node is $TESSERA_NODE if set, else the one named like this host (full or short name).
It is set up directly; every other node gets its accept package (cluster identity, node
table, secret) on the standard input of `RSH NODE \"tessera cluster accept\"`. A node
the remote shell cannot reach gets nothing: its package is left in
$TESSERA_HOME/cluster/accept-NODE.json (it holds the cluster secret: mode 0600); copy it to
the node and run `tessera cluster accept < accept-NODE.json` there. Then start the
cluster with `tessera startup -a`.

Exit status: 0 every node set up; 2 the cluster is created but some nodes still need their
package; 1 nothing was created.";

#[derive(Subcommand, Debug)]
pub enum NodeCommand {
    /// Add nodes to the cluster; each gets its accept package through the remote shell
    /// [mmaddnode]. Start them with `tessera startup -N NODES`.
    Add {
        /// A node file or `name[:designation[:address]]` entries separated by commas (see
        /// `tessera cluster create --help`).
        #[arg(short = 'N', value_name = "NODEFILE|NODE[,NODE...]")]
        nodes: String,
    },
    /// Delete nodes whose daemon is down and that have nothing mounted [mmdelnode].
    Delete {
        /// Node names separated by commas, or a node file.
        #[arg(short = 'N', value_name = "NODE[,NODE...]")]
        nodes: String,
    },
    /// Change the designation of nodes, or the daemon address of one node (in effect at
    /// its next daemon start) [mmchnode].
    #[command(group(ArgGroup::new("change").required(true).multiple(true)
        .args(["quorum", "nonquorum", "manager", "client", "address"])))]
    Change {
        /// Node names separated by commas, or a node file.
        #[arg(short = 'N', value_name = "NODE[,NODE...]")]
        nodes: String,
        /// Make them quorum nodes (they vote and keep a copy of the configuration).
        #[arg(long = "quorum", conflicts_with = "nonquorum")]
        quorum: bool,
        /// Make them non-quorum nodes.
        #[arg(long = "nonquorum")]
        nonquorum: bool,
        /// Make them manager nodes (may become cluster manager if also quorum).
        #[arg(long = "manager", conflicts_with = "client")]
        manager: bool,
        /// Make them client nodes (never manager).
        #[arg(long = "client")]
        client: bool,
        /// The daemon address HOST:PORT of the one node named.
        #[arg(long = "address", value_name = "HOST:PORT")]
        address: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Set configuration parameters [mmchconfig].
    ///
    /// For the whole cluster, or with -N for those nodes (only parameters that may differ
    /// between nodes); VALUE `DEFAULT` removes a setting. Unknown parameters are refused
    /// with the list of known ones.
    Set {
        /// NAME=VALUE[,NAME=VALUE...]
        #[arg(value_name = "NAME=VALUE[,...]")]
        changes: String,
        /// Node names separated by commas, or a node file.
        #[arg(short = 'N', value_name = "NODE[,NODE...]")]
        nodes: Option<String>,
    },
    /// List the configuration parameters [mmlsconfig].
    ///
    /// Every parameter with the value in force, `(default)` after values nobody set, then
    /// per-node values in `[node,...]` sections. -Y: one row per parameter and node (empty
    /// node: the cluster-wide value).
    Ls {
        /// Colon-separated machine-readable output.
        #[arg(short = 'Y')]
        machine: bool,
    },
}

/// `-a` or `-N`: which nodes a command acts on.
#[derive(Args, Debug, Clone)]
pub struct NodeSelectArgs {
    /// Every node of the cluster.
    #[arg(short = 'a', conflicts_with = "nodes")]
    pub all: bool,
    /// These nodes (names separated by commas, or a node file).
    #[arg(short = 'N', value_name = "NODE[,NODE...]")]
    pub nodes: Option<String>,
}

#[derive(Args, Debug)]
pub struct StateArgs {
    #[command(flatten)]
    pub select: NodeSelectArgs,
    /// Add the quorum summary: quorum nodes defined and active, and the quorum needed.
    #[arg(short = 's')]
    pub summary: bool,
    /// Colon-separated machine-readable output.
    #[arg(short = 'Y')]
    pub machine: bool,
}

#[derive(Subcommand, Debug)]
pub enum NsdCommand {
    /// Create NSDs from a stanza file [mmcrnsd].
    Create {
        /// The %nsd stanza file; rewritten with the NSD names filled in.
        #[arg(short = 'F')]
        stanza_file: PathBuf,
        /// `yes` refuses devices that already hold an NSD or a file system.
        #[arg(short = 'v', default_value = "yes")]
        verify: String,
    },
    /// List NSDs [mmlsnsd].
    Ls {
        /// Show NSD volume ids, and how this node reaches each NSD: its device, or the
        /// NSD servers' paths.
        #[arg(short = 'm', conflicts_with_all = ["extended", "all_nodes"])]
        mapping: bool,
        /// Like -m, for every node of the cluster (asked through the remote shell); with
        /// -X, also the device type.
        #[arg(short = 'M')]
        all_nodes: bool,
        /// Like -m, with the device type.
        #[arg(short = 'X')]
        extended: bool,
        #[arg(short = 'Y')]
        machine: bool,
    },
    /// Delete NSDs that belong to no file system [mmdelnsd].
    Delete {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Find every NSD by the id in its descriptor and record where it is now
    /// [mmnsddiscover]. Searches the block devices of this node, the connected NVMe/TCP
    /// namespaces, the recorded paths and the paths and globs listed one per line in
    /// $TESSERA_HOME/nsddevices.
    Discover,
    /// Change NSDs [mmchnsd]: their NSD servers (`-F` with `%nsd: nsd=NAME
    /// servers=NODE[,NODE...]` stanzas; the nodes start and stop serving by themselves and
    /// clients follow), or the device path of one NSD that scanning cannot find (`NAME
    /// --device PATH`; the device must carry the NSD's descriptor).
    #[command(group(ArgGroup::new("what").required(true).args(["file", "device"])))]
    Change {
        /// The NSD whose device changes.
        #[arg(requires = "device")]
        name: Option<String>,
        /// Its device now: a path, a block device name, or nvme:NAME.
        #[arg(
            long = "device",
            short = 'd',
            requires = "name",
            conflicts_with = "file"
        )]
        device: Option<String>,
        /// Stanza file with the new server lists.
        #[arg(short = 'F', value_name = "STANZA_FILE")]
        file: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
pub enum FsCommand {
    /// Create a file system [mmcrfs].
    Create(Box<FsCreateArgs>),
    /// List the attributes of a file system, or of every one with `all` [mmlsfs].
    Ls(FsLsArgs),
    /// Delete an unmounted file system; its NSDs become free [mmdelfs].
    Delete(FsDeleteArgs),
    /// Give the free space of the disks with thinDiskType other than no back to the
    /// devices, with progress [mmreclaimspace].
    Reclaimspace(DeviceArgs),
    /// Change attributes of a file system, mounted or not [mmchfs]: `-r`, the data copies
    /// of new files.
    Change(FsChangeArgs),
}

#[derive(Args, Debug)]
pub struct FsChangeArgs {
    /// The file system device name.
    pub device: String,
    /// Copies of each data block of files created from now on, each in its own failure
    /// group (1 to the -R given at create); existing files keep theirs (see `file attr
    /// set --replication` and `restripe -r`).
    #[arg(short = 'r')]
    pub data_replicas: Option<u32>,
    /// Copies of the metadata: 2 gives every metadata page, the recovery log and the
    /// allocation map a second copy in another failure group (pages already on disk get
    /// theirs from `restripe -r`); lowering it is not implemented.
    #[arg(short = 'm')]
    pub metadata_replicas: Option<u32>,
}

#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// Install a policy file, checked against the file system's pools first [mmchpolicy];
    /// files created afterwards are placed by its SET POOL rules.
    Change(PolicyChangeArgs),
    /// Show the installed policy as it was given [mmlspolicy -L].
    Ls(DeviceArgs),
    /// Run the MIGRATE, DELETE and LIST rules of a policy file over every file, with
    /// progress [mmapplypolicy]: a THRESHOLD(high,low) rule runs when its pool is at
    /// least high % full and moves the heaviest files (WEIGHT) until it is at low %.
    Apply(PolicyApplyArgs),
}

#[derive(Args, Debug)]
pub struct PolicyApplyArgs {
    /// The file system device name.
    pub device: String,
    /// The policy file (it is not installed).
    #[arg(short = 'P', value_name = "FILE")]
    pub policy_file: std::path::PathBuf,
    /// `yes` acts; `test` only reports what would be done; `defer` changes the pools of
    /// migrated files and leaves their data for `tessera restripe -p`.
    #[arg(short = 'I', default_value = "yes")]
    pub action: String,
}

#[derive(Args, Debug)]
pub struct PolicyChangeArgs {
    /// The file system device name.
    pub device: String,
    /// The policy file (RULE statements); `DEFAULT` removes the installed policy, so new
    /// files go to the default data pool again.
    #[arg(short = 'P', value_name = "FILE")]
    pub policy_file: std::path::PathBuf,
    /// `test` only checks the policy; `yes` (the default) installs it.
    #[arg(short = 'I', default_value = "yes")]
    pub install: String,
}

#[derive(Subcommand, Debug)]
pub enum FileCommand {
    /// Per-file attributes.
    #[command(subcommand)]
    Attr(FileAttrCommand),
}

#[derive(Subcommand, Debug)]
pub enum FileAttrCommand {
    /// Storage pool, fileset, replication and where the data blocks are, of files of a
    /// mounted file system [mmlsattr -L].
    Ls {
        /// Paths of files on a mounted Tessera file system.
        #[arg(required = true)]
        paths: Vec<std::path::PathBuf>,
    },
    /// Change attributes of files of a mounted file system [mmchattr]: the copies their
    /// data blocks should have; `tessera restripe DEVICE -r` then adds or drops copies.
    Set {
        /// Copies of each data block (1 to the file system's -R).
        #[arg(long = "replication", short = 'r')]
        replication: u32,
        /// Paths of regular files on a mounted Tessera file system.
        #[arg(required = true)]
        paths: Vec<std::path::PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
pub enum DiskCommand {
    /// List the disks of a file system [mmlsdisk].
    Ls(DiskLsArgs),
    /// Add NSDs to a file system, mounted or not [mmadddisk]; new data goes to them at once,
    /// `-r` also moves existing data onto them.
    Add(DiskAddArgs),
    /// Delete disks from a file system, mounted or not [mmdeldisk]: what they hold moves to
    /// the other disks first (with progress; Ctrl-C stops it, running it again continues),
    /// then they leave the file system and their NSDs are free.
    Delete(DiskDeleteArgs),
    /// Stop or resume new allocations on disks of a file system, mounted or not
    /// [mmchdisk suspend|empty|resume]. `empty` marks the disk to be emptied by
    /// `tessera restripe -m`.
    Change(DiskChangeArgs),
}

#[derive(Args, Debug)]
pub struct DiskLsArgs {
    /// The file system device name.
    pub device: String,
    /// Also how this node reaches each disk: its device, or the NSD servers' paths in use
    /// [mmlsdisk -L / -M].
    #[arg(short = 'L', visible_short_alias = 'M')]
    pub long: bool,
    #[arg(short = 'Y')]
    pub machine: bool,
}

#[derive(Args, Debug)]
pub struct DiskAddArgs {
    /// The file system device name.
    pub device: String,
    /// Stanza file of the NSDs to add (`%nsd: nsd=NAME`, with optional usage=,
    /// failureGroup= and pool= overriding what the NSD was created with).
    #[arg(short = 'F')]
    pub stanza_file: std::path::PathBuf,
    /// Rebalance afterwards: move existing data so that all disks fill evenly
    /// (`tessera restripe -b`).
    #[arg(short = 'r')]
    pub rebalance: bool,
    /// Refuse NSDs that hold (or held) a file system; `-v no` overwrites them.
    #[arg(short = 'v', default_value = "yes")]
    pub verify: String,
}

#[derive(Args, Debug)]
pub struct DiskDeleteArgs {
    /// The file system device name.
    pub device: String,
    /// The disks, as NSD names separated by ';' or ',' [mmdeldisk DEVICE "nsd1;nsd2"].
    pub disks: String,
}

/// What `disk change` does to the disks [mmchdisk].
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskAction {
    /// No new allocations on the disks; what they hold stays in use.
    Suspend,
    /// Like suspend, and `restripe -m` moves everything off them.
    Empty,
    /// Allocate on the disks again.
    Resume,
    /// Stop I/O to the disks of a mounted file system with data replication (-r 2 or 3):
    /// their copies are read from the other failure groups.
    Stop,
    /// Start I/O to stopped disks again (then `restripe -r`).
    Start,
}

#[derive(Args, Debug)]
pub struct DiskChangeArgs {
    /// The file system device name.
    pub device: String,
    pub action: DiskAction,
    /// The disks, as NSD names separated by ';' or ',' [mmchdisk -d "nsd1;nsd2"].
    #[arg(short = 'd', required = true)]
    pub disks: String,
}

/// Move file data between the disks of a file system [mmrestripefs]; exactly one mode.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("mode").required(true).args(["migrate", "balance", "replication", "placement", "check"])))]
pub struct RestripeArgs {
    /// The file system device name.
    pub device: String,
    /// Move all data off disks that are suspended or to be emptied.
    #[arg(short = 'm')]
    pub migrate: bool,
    /// Rebalance: move data from fuller disks to emptier ones, so disks fill evenly.
    #[arg(short = 'b')]
    pub balance: bool,
    /// Restore replication: give blocks written while a failure group was down (or with a
    /// copy on a disk that is down) the copies their files ask for.
    #[arg(short = 'r')]
    pub replication: bool,
    /// Check replicas: read every copy of every replicated block and write damaged ones
    /// again from a good copy.
    #[arg(short = 'c')]
    pub check: bool,
    /// Repair placement: move blocks that are not in their file's storage pool into it
    /// (after `policy apply -I defer`, or an interrupted migration).
    #[arg(short = 'p')]
    pub placement: bool,
}

#[derive(Args, Debug)]
pub struct DeviceArgs {
    /// The file system device name.
    pub device: String,
}

#[derive(Args, Debug)]
pub struct FsDeleteArgs {
    /// The file system device name.
    pub device: String,
    /// Delete it even if disks cannot be opened, read or written (lost data, a dead
    /// drive): what cannot be erased stays on the disk, and the NSDs are free in the
    /// cluster. Without -p such a file system is not deleted.
    #[arg(short = 'p')]
    pub unreadable_ok: bool,
}

#[derive(Args, Debug)]
pub struct DeviceListArgs {
    /// The file system device name.
    pub device: String,
    #[arg(short = 'Y')]
    pub machine: bool,
}

#[derive(Args, Debug)]
pub struct FsLsArgs {
    /// The file system device name, or `all` for every file system of the cluster.
    pub device: String,
    #[arg(short = 'Y')]
    pub machine: bool,
}

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct MountArgs {
    #[command(subcommand)]
    pub list: Option<MountCommand>,
    /// The file system to mount.
    #[arg(required = true)]
    pub device: Option<String>,
    /// Mount here instead of at the default mount point.
    #[arg(short = 'T')]
    pub mount_point: Option<PathBuf>,
    /// Mount on every node (-a) or on these (-N) instead of this one: the node that owns
    /// the metadata first, when none does yet, then the others at once.
    #[command(flatten)]
    pub select: NodeSelectArgs,
}

#[derive(Args, Debug)]
pub struct UmountArgs {
    /// The file system device name.
    pub device: String,
    /// Unmount on every node (-a) or on these (-N): the clients first, the node that owns
    /// the metadata last.
    #[command(flatten)]
    pub select: NodeSelectArgs,
}

#[derive(Subcommand, Debug)]
pub enum MountCommand {
    /// Which node has each file system mounted [mmlsmount].
    Ls(MountLsArgs),
}

#[derive(Args, Debug)]
pub struct MountLsArgs {
    /// The file system, or `all` (the default).
    pub device: Option<String>,
    /// Name the node and its address [mmlsmount -L].
    #[arg(short = 'L')]
    pub long: bool,
    #[arg(short = 'Y')]
    pub machine: bool,
}

#[derive(Args, Debug)]
pub struct FsckArgs {
    pub device: String,
    /// Report problems only (the default).
    #[arg(short = 'n', conflicts_with = "repair")]
    pub no_repair: bool,
    /// Repair what can be repaired.
    #[arg(short = 'y')]
    pub repair: bool,
}

/// `tessera diag` [mmdiag]: one section per option, several at once allowed.
#[derive(Args, Debug)]
pub struct DiagArgs {
    /// The last disk I/Os of this node (up to 512): start time, read/write/flush, NSD,
    /// sector, size, duration.
    #[arg(long)]
    pub iohist: bool,
    /// The daemon's version.
    #[arg(long)]
    pub version: bool,
    /// What is waiting now: disk I/Os in flight and admin requests being served, the
    /// longest first.
    #[arg(long)]
    pub waiters: bool,
    /// The cluster's nodes as this node reaches them, and NVMe/TCP paths.
    #[arg(long)]
    pub network: bool,
    /// The parameters in force on this node; `!` marks those the admin set.
    #[arg(long)]
    pub config: bool,
    /// Counters of the mounted file systems: operations, metadata cache, per-NSD I/O.
    #[arg(long)]
    pub stats: bool,
    /// The daemon's memory and each file system's caches against their bounds.
    #[arg(long)]
    pub memory: bool,
    /// Every section.
    #[arg(long)]
    pub all: bool,
}

/// Which components `tessera health` reports on.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthComponent {
    /// Every component of this node.
    Node,
    /// Mounted file systems.
    Fs,
    /// NSDs the mounted file systems use.
    Disk,
    /// Pdisks of the declustered arrays served here.
    Pdisk,
    /// Declustered arrays served here.
    Da,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthAction {
    /// Component states, why and since when.
    Show,
    /// The events that changed them, oldest first.
    Eventlog,
}

#[derive(Args, Debug)]
pub struct HealthArgs {
    #[arg(value_enum, default_value = "node")]
    pub component: HealthComponent,
    #[arg(value_enum, default_value = "show")]
    pub action: HealthAction,
    /// Only this file system, NSD, pdisk or array.
    pub name: Option<String>,
    #[arg(short = 'Y')]
    pub machine: bool,
}

#[derive(Args, Debug)]
pub struct PmonArgs {
    /// Only this file system (default: every mounted one).
    pub device: Option<String>,
    #[arg(short = 'Y')]
    pub machine: bool,
    /// An mmpmon command file: fs_io_s, io_s, ver, reset, rhist on|off|s|reset, one per
    /// line.
    #[arg(short = 'i', value_name = "FILE")]
    pub input: Option<std::path::PathBuf>,
    /// With -i: passes over the file (0: until interrupted).
    #[arg(short = 'r', default_value_t = 1, requires = "input")]
    pub repeat: u64,
    /// With -i: milliseconds between passes.
    #[arg(short = 'd', default_value_t = 1000, requires = "input")]
    pub delay_ms: u64,
}

/// `tessera fs create`, with the mmcrfs option letters.
#[derive(Args, Debug)]
pub struct FsCreateArgs {
    /// DEVICE, or the old form MOUNTPOINT DEVICE (`/gpfs1 gpfs1`).
    #[arg(required = true, num_args = 1..=2, value_name = "DEVICE")]
    pub positional: Vec<String>,
    /// The %nsd stanza file naming the NSDs (created with `tessera nsd create`). A %pool
    /// stanza may only repeat what the file system does: blockSize= as -B, layoutMap= as
    /// -j (pools with their own block size or layout are not implemented yet).
    #[arg(short = 'F')]
    pub stanza_file: PathBuf,
    /// Block size: 64K to 16M, a power of two.
    #[arg(short = 'B', default_value = "4M")]
    pub block_size: String,
    /// Inode size: 512, 1K or 4K.
    #[arg(short = 'i', default_value = "4K")]
    pub inode_size: String,
    /// Block allocation type: scatter or cluster.
    #[arg(short = 'j', default_value = "scatter")]
    pub placement: String,
    /// Estimated number of nodes that will mount the file system.
    #[arg(short = 'n', default_value_t = 32)]
    pub nodes: u32,
    /// Default mount point (default /gpfs/DEVICE).
    #[arg(short = 'T')]
    pub mount_point: Option<PathBuf>,
    /// Mount automatically when the daemon starts: yes or no.
    #[arg(short = 'A', default_value = "yes")]
    pub automount: String,
    /// Suppress atime: yes, no or relatime (the default, as in GPFS since 5.0: atime moves
    /// when it is older than mtime or ctime, or a day old).
    #[arg(short = 'S', default_value = "relatime")]
    pub suppress_atime: String,
    /// Exact mtime: yes or no.
    #[arg(short = 'E', default_value = "yes")]
    pub exact_mtime: String,
    /// Strict replica allocation: no, whenpossible or always.
    #[arg(short = 'K', default_value = "whenpossible")]
    pub strict_replicas: String,
    /// Recovery log size, e.g. 64M. Every node that holds an owner slot gets a log of this
    /// size too. Default: 1/64 of the metadata disks' capacity, at least 4M and at most 64M.
    #[arg(short = 'L')]
    pub log_size: Option<String>,
    /// MAX[:PREALLOC] inodes.
    #[arg(long = "inode-limit")]
    pub inode_limit: Option<String>,
    /// Default number of metadata replicas: 1, or 2 for a second copy of all metadata
    /// (pages, recovery log, allocation map) in another failure group.
    #[arg(short = 'm', default_value_t = 1)]
    pub metadata_replicas: u32,
    /// Maximum number of metadata replicas (1 to 3).
    #[arg(short = 'M', default_value_t = 2)]
    pub max_metadata_replicas: u32,
    /// Default number of data replicas: copies of each data block of new files, each in
    /// its own failure group (1 to -R).
    #[arg(short = 'r', default_value_t = 1)]
    pub data_replicas: u32,
    /// Maximum number of data replicas (1 to 3).
    #[arg(short = 'R', default_value_t = 2)]
    pub max_data_replicas: u32,
    /// `yes` refuses disks that already hold a file system.
    #[arg(short = 'v', default_value = "yes")]
    pub verify: String,
    /// Number of inode shards (see `tessera_fs::SHARDS_DEFAULT`).
    #[arg(long = "shards", default_value_t = tessera_fs::SHARDS_DEFAULT)]
    pub shards: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    /// Every subcommand's options are consistent (no two options share a letter or a
    /// name), which clap checks only when a command is built.
    #[test]
    fn command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn nvme_connect_takes_nvme_cli_fast_io_fail_tmo() {
        for spelling in ["-f", "--fast-io-fail-tmo", "--fast_io_fail_tmo"] {
            let cli = Cli::try_parse_from([
                "tessera",
                "nvme",
                "connect",
                "-a",
                "10.0.0.1",
                "-n",
                "nqn.2024-01.io.x:y",
                "-l",
                "60",
                spelling,
                "5",
            ])
            .unwrap();
            let Command::Nvme(NvmeCommand::Connect { tunables, .. }) = cli.command else {
                panic!("{:?}", cli.command)
            };
            assert_eq!(
                (tunables.ctrl_loss_tmo, tunables.fast_io_fail_tmo),
                (60, Some(5))
            );
        }
    }
}
