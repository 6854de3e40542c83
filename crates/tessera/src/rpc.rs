//! The admin protocol between the CLI and the local daemon: one JSON request per line on
//! the Unix socket `$TESSERA_HOME/daemon.sock`, answered by any number of `Info` and
//! `Progress` frames and then exactly one `Ok` or `Err` frame. Streaming frames let a long
//! operation (formatting) show progress while it runs.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use tessera_fs::{FsDescriptor, PmonSnapshot};
use tessera_nsd::{DiskUsage, ThinDiskType};

use tessera_cluster::node::{Designation, NodeNumber, NodeSpec};
use tessera_cluster::params::{ParamChange, Params};
use tessera_cluster::state::{ClusterIdentity, NodeRecord};

use crate::config::{FsRecord, Home, NsdRecord};

/// The longest frame accepted, so a confused peer cannot make the other side buffer
/// without bound.
pub const FRAME_BYTES_MAX: usize = 16 << 20;

/// One NSD to create, from a `%nsd` stanza with the device path made absolute.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NsdSpec {
    /// The device as written in the stanza, for messages.
    pub device_text: String,
    pub device_path: String,
    pub nsd: Option<String>,
    pub usage: DiskUsage,
    pub failure_group: i32,
    pub pool: String,
    pub thin_disk_type: ThinDiskType,
    pub servers: Vec<String>,
}

/// One NSD of `fs create`; attributes left out of the stanza come from the registry.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FsDiskSpec {
    pub nsd: String,
    pub usage: Option<DiskUsage>,
    pub failure_group: Option<i32>,
    pub pool: Option<String>,
}

/// `fs create` after the CLI has checked every option.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FsCreateSpec {
    pub name: String,
    pub disks: Vec<FsDiskSpec>,
    pub block_size: u32,
    pub inode_size: u32,
    pub cluster_placement: bool,
    pub estimated_nodes: u32,
    pub mount_point: String,
    pub automount: bool,
    /// -S: "no", "yes" or "relatime".
    pub suppress_atime: String,
    pub exact_mtime: bool,
    pub strict_replicas: String,
    /// `-L`; `None`: sized from the metadata capacity (`fs create -L`).
    pub log_bytes: Option<u64>,
    /// `None`: sized from the metadata capacity.
    pub max_inodes: Option<u64>,
    pub prealloc_inodes: u64,
    pub max_metadata_replicas: u32,
    pub max_data_replicas: u32,
    /// `-r`: copies of each data block of new files.
    #[serde(default = "one")]
    pub data_replicas: u32,
    /// `-m`: copies of the metadata (1 or 2).
    #[serde(default = "one")]
    pub metadata_replicas: u32,
    pub verify: bool,
    pub shard_count: u32,
}

fn one() -> u32 {
    1
}

/// One pdisk of `da create`, from a `%pdisk` stanza with the device path made absolute.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PdiskSpecWire {
    pub name: String,
    pub device_text: String,
    pub device_path: String,
    pub enclosure: String,
    pub slot: u32,
}

/// Tunables of a declustered array; `None` keeps the current value (or the default).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct DaSettings {
    /// Percent of I/O time kept for foreground I/O while a rebuild runs.
    pub foreground_io_share: Option<u8>,
    /// Background scrub rate, MB/s over all pdisks together.
    pub scrub_rate_mb_s: Option<u32>,
    /// I/O errors after which a pdisk is declared dead.
    pub pdisk_error_limit: Option<u32>,
}

/// What an administrator may do to a pdisk [mmvdisk pdisk change/replace].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PdiskAction {
    /// Declare it dead: its strips are rebuilt elsewhere.
    Fail,
    /// Take it out of service for a while (firmware update, reseat); no rebuild.
    Suspend,
    /// Bring a suspended pdisk back.
    Resume,
}

/// A background task of a declustered array (rebuild, scrub) and how far it got.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TaskRow {
    pub task: String,
    pub done: u64,
    pub total: u64,
    pub bytes: u64,
    pub rate_bytes_s: f64,
    pub eta_seconds: Option<u64>,
    pub finished: bool,
    pub remark: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DaRow {
    pub name: String,
    pub pdisks: u32,
    pub enclosures: u32,
    pub state: String,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub spare_bytes: u64,
    pub vdisks: u32,
    /// Percent of I/O time kept for foreground I/O while a rebuild runs.
    pub foreground_io_share: u8,
    pub scrub_rate_mb_s: u32,
    pub pdisk_error_limit: u32,
    pub tasks: Vec<TaskRow>,
    /// The node that serves the array now, and the nodes that may (`da create --servers`).
    #[serde(default)]
    pub server: String,
    #[serde(default)]
    pub servers: Vec<String>,
    /// False for an array another node serves: only the registry's facts are known here.
    #[serde(default)]
    pub open_here: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PdiskRow {
    pub name: String,
    pub da: String,
    pub device: String,
    pub enclosure: String,
    pub slot: u32,
    pub state: String,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub checksum_errors: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VdiskRow {
    pub name: String,
    pub da: String,
    pub code: String,
    pub block_size: u64,
    pub strip_size: u64,
    pub capacity_bytes: u64,
    pub state: String,
    /// What the placement survives, such as "2 pdisks or 1 enclosure".
    pub tolerance: String,
    /// The NSD built on it, if any.
    pub nsd: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Request {
    Ping,
    Shutdown,
    /// `cluster ls`, `config ls`: the replicated configuration as this node has applied it.
    ClusterShow,
    /// `node add`: numbers are assigned by the cluster; the CLI then hands each new node
    /// its accept package.
    NodeAdd {
        nodes: Vec<NodeSpec>,
    },
    /// `node delete`: refused for a node whose daemon is active or that has a file system
    /// mounted, for the node that runs the command, and for the last quorum nodes.
    NodeDelete {
        names: Vec<String>,
    },
    /// `node change`; `None` keeps that part. `address` takes exactly one node and takes
    /// effect at that node's next daemon start.
    NodeChange {
        names: Vec<String>,
        quorum: Option<bool>,
        manager: Option<bool>,
        address: Option<String>,
    },
    /// `config set`; empty `nodes` sets the cluster-wide value.
    ConfigSet {
        nodes: Vec<String>,
        changes: Vec<ParamChange>,
    },
    /// `state`: empty `names` is every node of the cluster.
    ClusterState {
        names: Vec<String>,
    },
    NsdCreate {
        nsds: Vec<NsdSpec>,
        verify: bool,
    },
    NsdList,
    /// `nsd ls -M`: how this node reaches each NSD now.
    NsdAccess,
    NsdDelete {
        names: Vec<String>,
    },
    /// `nsd discover`: find every NSD by the id in its descriptor.
    NsdDiscover,
    /// `nsd change NSD --device PATH`.
    NsdChange {
        name: String,
        device: String,
    },
    /// `da move NAME --server NODE`: the array is closed here and opened on NODE.
    DaMove {
        name: String,
        server: String,
    },
    /// `perf nsd`: requests of `size` bytes to one NSD, `threads` at once, for `seconds`.
    PerfNsd {
        nsd: String,
        write: bool,
        size: u32,
        threads: u32,
        seconds: u32,
    },
    /// `nsd change -F FILE`: each NSD's new server list.
    NsdChangeServers {
        changes: Vec<(String, Vec<String>)>,
    },
    FsCreate(Box<FsCreateSpec>),
    FsShow {
        name: String,
    },
    FsDelete {
        name: String,
        /// `fs delete -p`: go on when disks cannot be erased.
        #[serde(default)]
        unreadable_ok: bool,
    },
    Mount {
        name: String,
        mount_point: Option<String>,
    },
    Umount {
        name: String,
    },
    Df {
        name: String,
    },
    Fsck {
        name: String,
        repair: bool,
    },
    /// Give the free space of the thin-provisioned disks back to them [mmreclaimspace].
    ReclaimSpace {
        name: String,
    },
    /// Install (`Some`) or remove (`None`) a file system's policy [mmchpolicy]; `test` only
    /// checks it (-I test).
    PolicyChange {
        name: String,
        text: Option<String>,
        test: bool,
    },
    /// The installed policy's text [mmlspolicy -L].
    PolicyLs {
        name: String,
    },
    /// What `stat` does not show of one file of a mounted file system [mmlsattr -L].
    FileAttr {
        name: String,
        ino: u64,
    },
    /// The data copies of one file of a mounted file system [mmchattr -r].
    FileReplicationSet {
        name: String,
        ino: u64,
        copies: u8,
    },
    /// The data copies of new files [mmchfs -r].
    FsReplicationSet {
        name: String,
        copies: u8,
    },
    /// The metadata copies [mmchfs -m]: 2 turns metadata replication on.
    FsMetadataReplicationSet {
        name: String,
        copies: u8,
    },
    /// Add NSDs to a file system [mmadddisk]; `rebalance` (-r) restripes afterwards.
    DiskAdd {
        name: String,
        disks: Vec<FsDiskSpec>,
        verify: bool,
        rebalance: bool,
    },
    /// Empty disks and remove them from a file system [mmdeldisk].
    DiskDelete {
        name: String,
        nsds: Vec<String>,
    },
    /// Suspend, empty or resume disks of a file system [mmchdisk].
    DiskChange {
        name: String,
        nsds: Vec<String>,
        status: tessera_fs::DiskStatus,
    },
    /// Stop or start I/O to disks of a mounted, replicated file system [mmchdisk
    /// stop|start].
    DiskAvailability {
        name: String,
        nsds: Vec<String>,
        up: bool,
    },
    /// Move data between disks [mmrestripefs -m|-b].
    Restripe {
        name: String,
        balance: bool,
        /// `-p`: move blocks into their files' pools.
        #[serde(default)]
        placement: bool,
        /// `-r`: give ill-replicated blocks their missing copies.
        #[serde(default)]
        replication: bool,
        /// `-c`: read every copy of replicated blocks and repair damaged ones.
        #[serde(default)]
        check: bool,
    },
    /// Run a policy's MIGRATE, DELETE and LIST rules over every file [mmapplypolicy].
    PolicyApply {
        name: String,
        text: String,
        mode: tessera_fs::policy_run::ApplyMode,
    },
    Pmon {
        name: Option<String>,
    },
    /// The last disk I/Os of this node (`tessera diag --iohist`).
    IoHistory,
    /// `health`: component states and events.
    Health,
    /// `diag`: every section of the report.
    Diag,
    DaCreate {
        name: String,
        pdisks: Vec<PdiskSpecWire>,
        spare_pdisks: Option<u32>,
        settings: DaSettings,
        verify: bool,
        /// Server nodes that may serve it (empty: this node alone).
        #[serde(default)]
        servers: Vec<String>,
    },
    DaChange {
        name: String,
        settings: DaSettings,
    },
    DaList,
    DaDelete {
        name: String,
    },
    DaScrub {
        name: String,
    },
    VdiskCreate {
        name: String,
        da: String,
        code: String,
        block_size: u64,
        /// Bytes, or a percentage of the array's free capacity (`80%`).
        size_bytes: Option<u64>,
        size_percent: Option<u8>,
    },
    VdiskList,
    VdiskDelete {
        name: String,
    },
    PdiskList,
    PdiskChange {
        name: String,
        action: PdiskAction,
        /// Fail even though vdisks lose data.
        #[serde(default)]
        force: bool,
    },
    PdiskReplace {
        name: String,
        device_path: String,
    },
    /// Connect to these subsystems (one for `nvme connect`, several for `connect-all`).
    NvmeConnect(Vec<NvmeConnectSpec>),
    /// Disconnect the paths to `subnqn` (only the one at `traddr` if given); every
    /// controller when `subnqn` is `None`.
    NvmeDisconnect {
        subnqn: Option<String>,
        traddr: Option<String>,
    },
    NvmeList,
    /// `mount ls`: where file systems are mounted (all of them when `name` is `None`).
    MountList {
        name: Option<String>,
    },
}

/// One NVMe/TCP I/O controller to connect to, as `nvme connect` names it; `nvme.json`
/// keeps these so the daemon reconnects at restart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmeConnectSpec {
    /// `address:port`, resolved by the CLI.
    pub traddr: String,
    pub subnqn: String,
    /// Host NQN to present instead of the node's.
    pub hostnqn: Option<String>,
    pub queue_size: u16,
    pub ctrl_loss_tmo_s: u32,
    /// Absent in files written before the option existed: off.
    #[serde(default)]
    pub fast_io_fail_tmo_s: Option<u32>,
    pub reconnect_delay_s: u32,
    pub keep_alive_tmo_s: u32,
    pub nr_io_queues: Option<u16>,
    pub hdr_digest: bool,
    pub data_digest: bool,
}

/// A remote namespace and its paths, as `nvme list` shows them.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NvmeNamespaceRow {
    /// The local name (`nvme0n1`); a stanza names it as `device=nvme:nvme0n1`.
    pub name: String,
    /// The stable name (`eui.<NGUID>`), which survives reconnects in another order.
    #[serde(default)]
    pub id: String,
    pub subnqn: String,
    pub nsid: u32,
    pub size_bytes: u64,
    pub lba_bytes: u32,
    pub nguid: String,
    pub paths: Vec<NvmePathRow>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NvmePathRow {
    pub controller: String,
    pub traddr: String,
    pub cntlid: u16,
    pub ana_state: String,
    pub state: String,
    pub commands: u64,
    pub bytes: u64,
    pub errors: u64,
    pub retries: u64,
    pub latency_us_p50: u64,
    pub latency_us_p99: u64,
}

/// What `perf nsd` measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PerfNsdReport {
    /// How this node reached the NSD ("directly attached", "server node", "through
    /// servers: ...").
    pub path: String,
    pub bytes: u64,
    pub requests: u64,
    pub seconds: f64,
    pub latency_us_p50: u64,
    pub latency_us_p99: u64,
    pub latency_us_max: u64,
}

/// How one node reaches one NSD (`nsd ls -M`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NsdAccessRow {
    pub nsd: String,
    /// "directly attached", "server node" (this node serves it), "through servers" or
    /// "not opened" (nothing on this node uses it now).
    pub access: String,
    /// The device this node opens, or the NSD servers' namespace.
    pub device: String,
    /// For an NSD reached through servers: each server's path, as (server, ANA state,
    /// path state), in the list's order.
    pub paths: Vec<(String, String, String)>,
}

impl NsdAccessRow {
    /// The access and, for one through servers, each server's path: what `nsd ls -m`
    /// prints as remarks and `perf nsd` as the path it measured.
    pub fn remarks(&self) -> String {
        if self.paths.is_empty() {
            return self.access.clone();
        }
        let paths: Vec<String> = self
            .paths
            .iter()
            .map(|(server, ana, state)| format!("{server} {ana} {state}"))
            .collect();
        format!("{}: {}", self.access, paths.join("; "))
    }
}

/// One NSD as `nsd discover` found it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NsdDiscoverRow {
    pub nsd: String,
    pub device_before: String,
    /// Where the descriptor was found; `None` when no candidate device holds it.
    pub device_now: Option<String>,
    /// "found", "moved", "not found", or why the device could not be checked.
    pub status: String,
}

/// A file system as `fs ls` and `disk ls` show it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FsShow {
    pub record: FsRecord,
    pub descriptor: FsDescriptor,
    /// Per disk of the descriptor: whether its device answers with the right NSD.
    pub disks_up: Vec<bool>,
    /// Per disk of the descriptor: why part of it cannot be read although the device
    /// answers (a vdisk that lost data).
    #[serde(default)]
    pub disks_lost: Vec<Option<String>>,
    pub mounted_at: Option<String>,
}

/// One disk I/O of this node, as `tessera diag --iohist` lists it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct IoHistoryEntry {
    pub start_unix_nanos: u64,
    /// `read`, `write` or `flush`.
    pub op: String,
    pub nsd: String,
    pub offset: u64,
    pub bytes: u64,
    pub latency_ns: u64,
    pub ok: bool,
    /// The node it was done for, as its NSD server; `None` for this node's own I/O.
    #[serde(default)]
    pub served_for: Option<String>,
}

/// The state of a component in `tessera health` [mmhealth].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    Healthy,
    Degraded,
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Healthy => "HEALTHY",
            Status::Degraded => "DEGRADED",
            Status::Failed => "FAILED",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

/// One component of this node and its state.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ComponentHealth {
    /// `node`, `filesystem`, `disk` (an NSD this node uses), `da` or `pdisk`.
    pub component: String,
    pub entity: String,
    pub status: Status,
    /// When the status last changed.
    pub since_unix: u64,
    /// Why it is not healthy (empty when it is).
    pub reasons: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Event {
    pub unix: u64,
    pub component: String,
    pub entity: String,
    /// A short name for the kind of event, such as `pdisk_failed`.
    pub event: String,
    pub severity: Severity,
    pub message: String,
}

/// `tessera health`: this node's components and the events that set their states.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HealthReport {
    pub node: String,
    pub components: Vec<ComponentHealth>,
    pub events: Vec<Event>,
}

/// `tessera diag` [mmdiag]: what this node's daemon is doing, every section at once.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DiagReport {
    pub node: String,
    pub pid: u32,
    pub uptime_seconds: u64,
    /// Disk requests in flight and admin requests being served, the longest first.
    pub waiters: Vec<WaiterRow>,
    pub memory: MemoryReport,
    pub stats: Vec<FsStatsRow>,
    pub network: NetworkReport,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WaiterRow {
    pub waiting_seconds: f64,
    /// `disk I/O` or `admin request`.
    pub kind: String,
    /// What it waits for, in words.
    pub waiting_for: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemoryReport {
    /// From /proc/self/status.
    pub rss_bytes: u64,
    pub peak_rss_bytes: u64,
    pub virtual_bytes: u64,
    pub threads: u64,
    pub filesystems: Vec<FsMemoryRow>,
}

/// The caches of one mounted file system and their bounds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FsMemoryRow {
    pub fs: String,
    pub metadata_pages_clean: u64,
    pub metadata_pages_dirty: u64,
    /// Memory of the pages, clean and changed, as `pagepool` counts it.
    pub metadata_memory_bytes: u64,
    pub page_bytes: u64,
    pub pagepool_bytes: u64,
    pub inodes_cached: u64,
    pub stats_cached: u64,
    pub max_files_to_cache: u64,
    pub max_stat_cache: u64,
}

/// Internal counters of one mounted file system.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FsStatsRow {
    pub fs: String,
    pub pmon: PmonSnapshot,
    /// FUSE requests the kernel holds for the mount (queued or being served); `None`
    /// where fusectl cannot be read.
    pub fuse_waiting: Option<u64>,
    /// FUSE requests the daemon's threads are serving, and those answered since the mount.
    pub fuse_active: u64,
    pub fuse_served: u64,
    /// Bytes of freed blocks given back to thin-provisioned disks (TRIM) since the mount,
    /// and deallocations that failed.
    pub discarded_bytes: u64,
    pub discard_errors: u64,
    pub metadata_pages_clean: u64,
    pub metadata_pages_dirty: u64,
    pub metadata_page_hits: u64,
    pub metadata_page_misses: u64,
    pub metadata_page_evictions: u64,
    /// Requests, bytes and errors per NSD and kind (`read`, `write`, `flush`).
    pub nsds: Vec<NsdStatsRow>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NsdStatsRow {
    pub nsd: String,
    pub op: String,
    pub requests: u64,
    pub bytes: u64,
    pub errors: u64,
    pub seconds: f64,
}

/// This node's connections: the cluster's nodes as it reaches them, and NVMe/TCP paths.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NetworkReport {
    pub manager: Option<String>,
    pub nodes: Vec<NetworkNodeRow>,
    pub nvme: Vec<NvmeNamespaceRow>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NetworkNodeRow {
    pub name: String,
    pub address: String,
    /// As `tessera state` says: active, arbitrating, down or unknown.
    pub state: String,
    pub epoch: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PmonEntry {
    pub fs_name: String,
    pub disks: usize,
    pub snapshot: PmonSnapshot,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Reply {
    Done,
    Pong {
        pid: u32,
        node_name: String,
        node_number: u32,
    },
    /// Names of the created NSDs, in stanza order.
    NsdsCreated(Vec<String>),
    Nsds(Vec<NsdRecord>),
    NsdDiscovery(Vec<NsdDiscoverRow>),
    NsdAccess(Vec<NsdAccessRow>),
    PerfNsd(PerfNsdReport),
    Fs(Box<FsShow>),
    Mounted {
        mount_point: String,
    },
    /// The file system is unmounted; `checkpoint_error` says why its final checkpoint
    /// could not be written, if it could not.
    Unmounted {
        checkpoint_error: Option<String>,
    },
    /// The file system was not mounted yet: its mount at start was still being tried, and
    /// is not tried any more.
    MountCancelled,
    Df(tessera_fs::DfReport),
    Fsck(tessera_fs::FsckReport),
    /// Bytes given back, per NSD with a `thinDiskType` other than `no`.
    ReclaimSpace(Vec<(String, u64)>),
    /// A policy installed or checked: how many rules of each kind it has.
    PolicyChanged(tessera_fs::PolicySummary),
    /// The installed policy's text, if any.
    Policy(Option<String>),
    PolicyApplied(tessera_fs::policy_run::ApplyReport),
    FileAttr(FileAttrReply),
    /// What a restripe did.
    Restripe(RestripeDone),
    Pmon(Vec<PmonEntry>),
    IoHistory(Vec<IoHistoryEntry>),
    Health(HealthReport),
    Diag(Box<DiagReport>),
    Das(Vec<DaRow>),
    Pdisks(Vec<PdiskRow>),
    Vdisks(Vec<VdiskRow>),
    NvmeNamespaces(Vec<NvmeNamespaceRow>),
    /// Paths removed by a disconnect.
    NvmeDisconnected(usize),
    Cluster(Box<ClusterView>),
    /// The nodes `node add` added, with their numbers.
    NodesAdded(Vec<NodeRecord>),
    States(ClusterStates),
    Mounts(Vec<MountRow>),
}

/// One file system in `mount ls`, with the nodes that have it mounted.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MountRow {
    pub file_system: String,
    /// The owner first (its metanode and file system manager), then its clients; empty
    /// when unmounted.
    pub nodes: Vec<MountedNode>,
    /// Nodes whose client mount is being made now: not listed as mounted, but reached by
    /// `umount -a|-N` (whose unmount there waits for the mount).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounting: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MountedNode {
    pub node: String,
    /// Its daemon address.
    pub address: String,
    pub mount_point: String,
    /// `manager` (owns the metadata) or `client`.
    pub role: String,
}

/// The replicated configuration as one node has applied it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClusterView {
    pub identity: ClusterIdentity,
    pub nodes: Vec<NodeRecord>,
    /// The node that answered.
    pub me: NodeNumber,
    /// The cluster manager the answering node follows, if it knows one.
    pub manager: Option<NodeNumber>,
    pub config_version: u64,
    pub params: Params,
}

/// `state`: one row per node asked about, and the quorum summary (`-s`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClusterStates {
    pub rows: Vec<NodeStateRow>,
    pub manager: Option<NodeNumber>,
    pub quorum_nodes_defined: usize,
    pub quorum_nodes_up: usize,
    /// A majority of the quorum nodes.
    pub quorum_needed: usize,
    /// The file systems each node manages (owns the metadata of, as their file system
    /// manager and metanode), by node name.
    #[serde(default)]
    pub fs_managers: std::collections::BTreeMap<String, Vec<String>>,
}

/// One node's state as `mmgetstate` prints it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeStateRow {
    pub number: NodeNumber,
    pub name: String,
    pub designation: Designation,
    /// `active`, `arbitrating`, `down` (its daemon does not answer: nothing listens) or
    /// `unknown` (no answer: unreachable or too slow).
    pub state: String,
    /// The epoch of its incarnation: what the node says, or for a node that does not
    /// answer, its live incarnation in the configuration (none once it is expelled).
    pub epoch: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Frame {
    /// A line for the user, printed as it comes.
    Info(String),
    Progress {
        phase: String,
        done: u64,
        total: u64,
    },
    Ok(Reply),
    Err(String),
    /// The request is one only the file system manager runs, and node `node` is the
    /// manager of file system `fs`: the CLI sends the same request there
    /// (`commands::call`).
    Elsewhere {
        fs: String,
        node: String,
    },
}

/// Writes one frame as a JSON line.
pub fn write_frame<T: Serialize>(w: &mut impl Write, value: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(value).expect("frames serialize");
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()
}

/// Reads one JSON line; `None` at end of stream.
pub fn read_frame<T: for<'de> Deserialize<'de>>(r: &mut impl BufRead) -> Result<Option<T>> {
    let mut line = Vec::new();
    let mut limited = std::io::Read::take(&mut *r, FRAME_BYTES_MAX as u64);
    let n = limited.read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        bail!("protocol error: frame longer than {FRAME_BYTES_MAX} bytes or cut short");
    }
    Ok(Some(
        serde_json::from_slice(&line).context("protocol error: malformed frame")?,
    ))
}

/// A request only the manager of file system `fs` runs, refused by a node that is not
/// its manager ([`Frame::Elsewhere`]).
#[derive(Debug)]
pub struct ManagerElsewhere {
    pub fs: String,
    pub node: String,
}

impl std::fmt::Display for ManagerElsewhere {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "node {} is the file system manager of {}, which runs this command; run it \
             there",
            self.node, self.fs
        )
    }
}

impl std::error::Error for ManagerElsewhere {}

/// Reads frames from a daemon's answer (the local socket, or a remote shell relaying
/// another node's), hands every streaming frame to `on_frame`, and returns the reply.
pub fn read_reply(reader: &mut impl BufRead, mut on_frame: impl FnMut(&Frame)) -> Result<Reply> {
    loop {
        let frame: Frame = read_frame(reader)?.ok_or_else(|| {
            anyhow!("the daemon closed the connection without an answer; see its log")
        })?;
        match frame {
            Frame::Ok(reply) => return Ok(reply),
            Frame::Err(message) => return Err(anyhow!(message)),
            Frame::Elsewhere { fs, node } => {
                return Err(anyhow::Error::new(ManagerElsewhere { fs, node }))
            }
            other => on_frame(&other),
        }
    }
}

/// The caller may not connect to the daemon's socket (not root).
#[derive(Debug)]
pub struct SocketDenied(String);

impl std::fmt::Display for SocketDenied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SocketDenied {}

/// A connection to the local daemon.
pub struct Client {
    stream: BufReader<UnixStream>,
}

impl Client {
    /// Connects, or says that the daemon is not running and how to start it.
    pub fn connect(home: &Home) -> Result<Client> {
        let path = home.socket_path();
        let stream = UnixStream::connect(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                return anyhow::Error::new(SocketDenied(format!(
                    "permission denied on the daemon's socket {} ({e}); the admin commands \
                     need root: run them as root (sudo tessera ...)",
                    path.display()
                )));
            }
            anyhow!(
                "the Tessera daemon is not running ({}: {e}); start it with `tessera startup`",
                path.display()
            )
        })?;
        Ok(Client {
            stream: BufReader::new(stream),
        })
    }

    /// Whether connecting failed because the caller may not use the socket (the daemon
    /// may well be running).
    pub fn denied(error: &anyhow::Error) -> bool {
        error.downcast_ref::<SocketDenied>().is_some()
    }

    /// True when a daemon answers on the socket within `timeout`.
    pub fn ping(home: &Home, timeout: Duration) -> Option<Reply> {
        let mut client = Client::connect(home).ok()?;
        client
            .stream
            .get_ref()
            .set_read_timeout(Some(timeout))
            .ok()?;
        client.call(&Request::Ping, |_| {}).ok()
    }

    /// Sends `request`, hands every streaming frame to `on_frame`, and returns the reply.
    pub fn call(&mut self, request: &Request, on_frame: impl FnMut(&Frame)) -> Result<Reply> {
        write_frame(self.stream.get_mut(), request).context("cannot send to the daemon")?;
        read_reply(&mut self.stream, on_frame)
    }

    /// Sends `request` and copies every frame of the answer to `out` as it comes, as the
    /// daemon wrote it: what `tessera forward-request` relays to the node that asked.
    pub fn relay(&mut self, request: &Request, out: &mut impl Write) -> Result<()> {
        write_frame(self.stream.get_mut(), request).context("cannot send to the daemon")?;
        loop {
            let frame: Frame = read_frame(&mut self.stream)?.ok_or_else(|| {
                anyhow!("the daemon closed the connection without an answer; see its log")
            })?;
            let last = matches!(
                frame,
                Frame::Ok(_) | Frame::Err(_) | Frame::Elsewhere { .. }
            );
            write_frame(out, &frame).context("cannot relay the daemon's answer")?;
            if last {
                return Ok(());
            }
        }
    }
}

/// The outcome of `tessera restripe`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RestripeDone {
    pub blocks_scanned: u64,
    pub blocks_moved: u64,
    pub bytes_moved: u64,
    /// Metadata pages written elsewhere to leave disks being emptied (`-m`).
    pub metadata_pages_moved: u64,
    /// Stored allocation-map regions moved off disks being emptied (`-m`).
    pub map_regions_moved: u64,
    /// The recovery log moved off a disk being emptied (`-m`).
    pub log_moved: bool,
    /// Owner slot regions moved off disks being emptied (`-m`).
    #[serde(default)]
    pub slot_regions_moved: u64,
    /// Copies of metadata pages read and checked, and rewritten from the other copy (`-c`
    /// and `-r` with two metadata copies).
    #[serde(default)]
    pub metadata_copies_checked: u64,
    #[serde(default)]
    pub metadata_copies_repaired: u64,
    /// Blocks rewritten, truncated or deleted between the scan and their move.
    pub blocks_changed: u64,
    /// Stopped early because the client went away (Ctrl-C): run it again to continue.
    pub stopped: bool,
}

/// `file attr ls` [mmlsattr -L]: a file's storage pool and where its blocks are.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FileAttrReply {
    pub pool: String,
    /// Copies its data blocks should have, and whether some block has fewer.
    #[serde(default)]
    pub replication: u8,
    #[serde(default)]
    pub ill_replicated: bool,
    /// Data blocks (whole or fragments) per NSD, by NSD name.
    pub blocks_per_disk: Vec<(String, u64)>,
}
