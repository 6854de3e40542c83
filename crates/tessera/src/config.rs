//! The node's home directory (`$TESSERA_HOME`) and the configuration files in it.
//!
//! Every file is JSON and is replaced atomically (temporary file, fsync, rename, fsync of
//! the directory), so a crash leaves the old or the new version and never a torn one.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use tessera_cluster::state::{ClusterIdentity, Command, NodeRecord};
use tessera_nsd::{DiskUsage, NsdId, ThinDiskType};
use tessera_transport::ClusterSecret;

/// Where a node keeps everything when `$TESSERA_HOME` is not set.
pub const DEFAULT_HOME: &str = "/var/lib/tessera";

/// The home directory of this node.
#[derive(Clone, Debug)]
pub struct Home {
    root: PathBuf,
}

/// `cluster.json`: the cluster this node belongs to and who this node is in it. Written
/// last when a node is set up (`cluster create`, `cluster accept`), so its presence means
/// the secret and the bootstrap entry are in place.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClusterConfig {
    pub name: String,
    /// Lower-case hex of 16 random bytes; written into every NSD descriptor.
    pub cluster_id: String,
    pub node_name: String,
    pub node_number: u32,
    pub created_unix: u64,
    /// Where this node's daemon listens for other nodes (`host:port`; port 0: loopback,
    /// any free port, for a cluster of this one node). The node table in the replicated
    /// configuration has the last word; this is what the daemon uses before it has one.
    #[serde(default)]
    pub address: String,
    /// 0: a one-node home from before the cluster layer, upgraded at the next daemon
    /// start (its registries move into the replicated configuration); 1: current.
    #[serde(default)]
    pub format: u32,
}

/// The current `cluster.json` format.
pub const CLUSTER_FORMAT: u32 = 1;

/// What a node needs to become a member: written by `cluster create` (for every node) and
/// `node add` (for the new nodes), handed over on the standard input of `tessera cluster
/// accept` through the remote shell, or as a file the admin copies (it holds the secret:
/// keep it like a private key).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AcceptPackage {
    pub identity: ClusterIdentity,
    /// The cluster secret in its file format (`ClusterSecret::to_file_text`).
    pub secret: String,
    /// The receiving node.
    pub node: NodeRecord,
    /// The node table as the sender knew it, so `startup -a` works before the daemon ran.
    pub nodes: Vec<NodeRecord>,
    /// The first configuration entry, for the quorum nodes of a new cluster.
    pub bootstrap: Option<Command>,
}

/// `cluster/nodes.json`: the node table as the daemon last applied it, for the commands
/// that must reach other nodes while the local daemon is down (`startup -a`, `state -a`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodesCache {
    pub identity: ClusterIdentity,
    pub nodes: Vec<NodeRecord>,
}

impl ClusterConfig {
    pub fn cluster_id_bytes(&self) -> [u8; 16] {
        let mut id = [0u8; 16];
        for (i, byte) in id.iter_mut().enumerate() {
            let hex = self.cluster_id.get(2 * i..2 * i + 2).unwrap_or("00");
            *byte = u8::from_str_radix(hex, 16).unwrap_or(0);
        }
        id
    }
}

/// One NSD of the cluster, as registered by `nsd create`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NsdRecord {
    pub name: String,
    pub id: NsdId,
    /// Absolute device path at creation; the descriptor, not the path, identifies the NSD.
    pub device: String,
    pub size_bytes: u64,
    pub usage: DiskUsage,
    pub failure_group: i32,
    pub pool: String,
    pub thin_disk_type: ThinDiskType,
    pub servers: Vec<String>,
    /// The file system the NSD belongs to; `None` for a free disk.
    pub file_system: Option<String>,
}

/// `nsd.json`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NsdRegistry {
    pub nsds: Vec<NsdRecord>,
    /// The version of the replicated document this copy was read from (compare-and-set).
    #[serde(skip)]
    pub version: u64,
}

impl NsdRegistry {
    pub fn get(&self, name: &str) -> Option<&NsdRecord> {
        self.nsds.iter().find(|n| n.name == name)
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut NsdRecord> {
        self.nsds.iter_mut().find(|n| n.name == name)
    }
}

/// One file system of the cluster.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FsRecord {
    pub name: String,
    pub nsds: Vec<String>,
    pub default_mount_point: String,
    pub automount: bool,
    /// When `fs create` made it (seconds since the epoch, by the clock of the node that
    /// made it; 0 in records from before it was kept): a daemon mounts at its start only
    /// the `-A yes` file systems that existed when it started, not one created while it
    /// was catching up with the cluster.
    #[serde(default)]
    pub created_unix: u64,
    /// The same in milliseconds (0 in records from before it was kept): a daemon restarted
    /// in the second a file system was created must still tell which came first.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub created_unix_ms: u64,
    /// True while mounted, so a restarted daemon mounts it again.
    pub mounted: bool,
    /// The node that mounted it first and owns its metadata (its metanode and file system
    /// manager); `None` in a home from before the cluster layer means this node.
    #[serde(default)]
    pub mounted_on: Option<String>,
    /// The other nodes that mount it, as clients of `mounted_on`: they read and write the
    /// disks themselves and send every metadata request there.
    #[serde(default)]
    pub clients: Vec<ClientMount>,
    /// The owner's mount gathers writes in its kernel's writeback cache, where no other
    /// node's change of a file's size or times could show: only in a one-node cluster
    /// (see `KernelCache`), and other nodes cannot mount it beside that owner.
    #[serde(default)]
    pub private_cache: bool,
    /// Which node holds which owner slot (`metadataSlots=yes`): kept when the node
    /// unmounts, so that it takes the same slot, its log and its shards, when it mounts
    /// again.
    #[serde(default)]
    pub slot_holders: Vec<SlotHolder>,
    /// Where it was last mounted (`mount -T` may differ from the default).
    pub mount_point: String,
    /// `-K` as given. With one replica of everything it has no effect: there is never a
    /// second replica whose placement could be strict or not.
    pub strict_replicas: String,
    pub log_bytes: u64,
}

/// A node's owner slot of a file system.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotHolder {
    pub node: String,
    pub slot: u32,
    /// The incarnation of `node` that claimed the slot: it serves the slot while that
    /// incarnation is live. `None` once it unmounted: the slot is free for the first node
    /// that needs it (`daemon/slots.rs`), this one first when it mounts again.
    #[serde(default)]
    pub incarnation: Option<u64>,
    /// The node the slot was made for (its directories are that node's work): a node that
    /// took the slot over gives it back when that node mounts again. `None` for slots
    /// recorded before this was kept.
    #[serde(default)]
    pub home: Option<String>,
}

/// A node that mounts a file system as a client of the node that owns its metadata.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientMount {
    pub node: String,
    pub mount_point: String,
    /// The incarnation of `node` whose mount this is: after a restart the entry of the
    /// incarnation before stays (so that the node mounts it again at its start) but is not
    /// listed as mounted until the new incarnation's mount is made. `None` in entries from
    /// before this was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<u64>,
    /// Recorded before the mount is made (the owner must know the node before it asks for
    /// anything) and cleared once it is; also set for a dead owner kept to mount again at
    /// its next start. A pending entry is not listed as mounted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
}

/// `fs.json`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FsRegistry {
    pub file_systems: Vec<FsRecord>,
    /// The version of the replicated document this copy was read from (compare-and-set).
    #[serde(skip)]
    pub version: u64,
}

impl FsRegistry {
    pub fn get(&self, name: &str) -> Option<&FsRecord> {
        self.file_systems.iter().find(|f| f.name == name)
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut FsRecord> {
        self.file_systems.iter_mut().find(|f| f.name == name)
    }

    /// The record of `name`, or an error that lists the file systems that do exist.
    pub fn require(&self, name: &str) -> Result<&FsRecord> {
        if let Some(fs) = self.get(name) {
            return Ok(fs);
        }
        let known: Vec<&str> = self.file_systems.iter().map(|f| f.name.as_str()).collect();
        if known.is_empty() {
            bail!(
                "file system {name} does not exist; there are no file systems yet \
                 (create one with `tessera fs create`)"
            );
        }
        bail!(
            "file system {name} does not exist; known file systems: {}",
            known.join(", ")
        )
    }

    /// Like [`FsRegistry::require`], for changing the record.
    pub fn require_mut(&mut self, name: &str) -> Result<&mut FsRecord> {
        self.require(name)?;
        Ok(self.get_mut(name).expect("required above"))
    }
}

/// One pdisk of a declustered array as this node last saw it. The pdisk label on the
/// drive, not this path, says which pdisk a drive is: the path only says where to look.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PdiskRecord {
    pub name: String,
    pub device: String,
}

/// One declustered array and the node that serves it (opens it at startup).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DaRecord {
    pub name: String,
    pub pdisks: Vec<PdiskRecord>,
    /// The node that opens the array; `None` in a home from before the cluster layer
    /// means this node.
    #[serde(default)]
    pub server: Option<String>,
    /// The nodes that may serve it (they reach every pdisk), in order of preference; the
    /// cluster manager gives an expelled server's array to the live one serving the
    /// fewest arrays. Empty: `server` alone.
    #[serde(default)]
    pub servers: Vec<String>,
}

/// `da.json`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DaRegistry {
    pub arrays: Vec<DaRecord>,
    /// The version of the replicated document this copy was read from (compare-and-set).
    #[serde(skip)]
    pub version: u64,
}

/// `nvme.json`: the NVMe/TCP controllers this node connected to, in connection order, so
/// that a restart gives every namespace the same local name (`nvme0n1`) again.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NvmeRegistry {
    pub connections: Vec<crate::rpc::NvmeConnectSpec>,
}

impl DaRegistry {
    pub fn get(&self, name: &str) -> Option<&DaRecord> {
        self.arrays.iter().find(|a| a.name == name)
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut DaRecord> {
        self.arrays.iter_mut().find(|a| a.name == name)
    }
}

impl Home {
    /// `$TESSERA_HOME` or the default, made absolute so a daemon started from another
    /// directory finds the same home.
    pub fn from_env() -> Result<Home> {
        let root = std::env::var_os("TESSERA_HOME")
            .filter(|v| !v.is_empty())
            .map_or_else(|| PathBuf::from(DEFAULT_HOME), PathBuf::from);
        let root = if root.is_absolute() {
            root
        } else {
            std::env::current_dir()
                .context("cannot read the current directory")?
                .join(root)
        };
        Ok(Home { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn cluster_path(&self) -> PathBuf {
        self.root.join("cluster.json")
    }
    pub fn nsd_path(&self) -> PathBuf {
        self.root.join("nsd.json")
    }
    pub fn fs_path(&self) -> PathBuf {
        self.root.join("fs.json")
    }
    pub fn da_path(&self) -> PathBuf {
        self.root.join("da.json")
    }
    /// NVMe/TCP connections the daemon restores at startup.
    pub fn nvme_path(&self) -> PathBuf {
        self.root.join("nvme.json")
    }
    /// The node's host NQN and host identifier (`/etc/nvme/hostnqn` and `hostid` of a
    /// Linux host).
    pub fn hostnqn_path(&self) -> PathBuf {
        self.root.join("hostnqn")
    }
    /// The default list of discovery controllers for `nvme connect-all`.
    pub fn discovery_conf_path(&self) -> PathBuf {
        self.root.join("discovery.conf")
    }
    /// The cluster secret every daemon connection is authenticated with (mode 0600).
    pub fn secret_path(&self) -> PathBuf {
        self.root.join("cluster.secret")
    }
    /// The cluster layer's local state.
    pub fn cluster_dir(&self) -> PathBuf {
        self.root.join("cluster")
    }
    /// The Raft log and the applied configuration (redb).
    pub fn raft_path(&self) -> PathBuf {
        self.cluster_dir().join("raft.redb")
    }
    /// The first configuration entry of a new cluster, until it is committed.
    pub fn bootstrap_path(&self) -> PathBuf {
        self.cluster_dir().join("bootstrap.json")
    }
    pub fn nodes_cache_path(&self) -> PathBuf {
        self.cluster_dir().join("nodes.json")
    }
    pub fn socket_path(&self) -> PathBuf {
        self.root.join("daemon.sock")
    }
    pub fn pid_path(&self) -> PathBuf {
        self.root.join("daemon.pid")
    }
    pub fn log_dir(&self) -> PathBuf {
        self.root.join("log")
    }
    pub fn log_path(&self) -> PathBuf {
        self.log_dir().join("daemon.log")
    }

    /// The cluster configuration, or an error saying how to create one.
    pub fn cluster(&self) -> Result<ClusterConfig> {
        match read_json::<ClusterConfig>(&self.cluster_path())? {
            Some(c) => Ok(c),
            None => bail!(
                "no cluster is defined under {}; create one with \
                 `tessera cluster create --name NAME` \
                 (or set TESSERA_HOME to the home of an existing node)",
                self.root.display()
            ),
        }
    }

    pub fn cluster_exists(&self) -> bool {
        self.cluster_path().exists()
    }

    pub fn save_cluster(&self, c: &ClusterConfig) -> Result<()> {
        write_json(&self.cluster_path(), c)
    }

    /// Makes this home a member as `package` says. Repeating it with the same package is
    /// harmless (a retried `cluster create`); a home of another cluster or node is refused.
    pub fn accept(&self, package: &AcceptPackage) -> Result<()> {
        let me = &package.node;
        if let Some(existing) = read_json::<ClusterConfig>(&self.cluster_path())? {
            let same = existing.cluster_id == package.identity.id
                && existing.node_name == me.name
                && existing.node_number == me.number;
            if !same {
                bail!(
                    "{} already belongs to cluster {} (id {}) as node {} ({}); to make it \
                     node {} of cluster {}, stop its daemon and remove {} first (this forgets \
                     everything the node knew), or use another TESSERA_HOME",
                    self.root.display(),
                    existing.name,
                    existing.cluster_id,
                    existing.node_number,
                    existing.node_name,
                    me.name,
                    package.identity.name,
                    self.root.display()
                );
            }
        }
        fs::create_dir_all(self.cluster_dir())
            .with_context(|| format!("cannot create {}", self.cluster_dir().display()))?;
        fs::create_dir_all(self.log_dir())
            .with_context(|| format!("cannot create {}", self.log_dir().display()))?;
        let secret_path = self.secret_path();
        let secret = ClusterSecret::parse_file_text(&secret_path, package.secret.as_bytes())
            .map_err(|e| anyhow::anyhow!("the accept package's secret: {e}"))?;
        secret
            .save(&secret_path)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if let Some(create) = &package.bootstrap {
            write_json(&self.bootstrap_path(), create)?;
        }
        self.save_nodes_cache(&NodesCache {
            identity: package.identity.clone(),
            nodes: package.nodes.clone(),
        })?;
        self.save_cluster(&ClusterConfig {
            name: package.identity.name.clone(),
            cluster_id: package.identity.id.clone(),
            node_name: me.name.clone(),
            node_number: me.number,
            created_unix: package.identity.created_unix,
            address: me.address.clone(),
            format: CLUSTER_FORMAT,
        })
    }

    /// The first configuration entry waiting to be committed, if any.
    pub fn bootstrap(&self) -> Result<Option<Command>> {
        read_json(&self.bootstrap_path())
    }

    pub fn nodes_cache(&self) -> Result<Option<NodesCache>> {
        read_json(&self.nodes_cache_path())
    }

    pub fn save_nodes_cache(&self, cache: &NodesCache) -> Result<()> {
        write_json(&self.nodes_cache_path(), cache)
    }

    pub fn nvme(&self) -> Result<NvmeRegistry> {
        Ok(read_json(&self.nvme_path())?.unwrap_or_default())
    }

    pub fn save_nvme(&self, r: &NvmeRegistry) -> Result<()> {
        write_json(&self.nvme_path(), r)
    }
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let value = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not valid; restore it from a backup or fix the JSON by hand",
            path.display()
        )
    })?;
    Ok(Some(value))
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let mut text = serde_json::to_vec_pretty(value).expect("configuration serializes");
    text.push(b'\n');
    write_atomic(path, &text)
}

/// Replaces `path` with `bytes` so that a crash leaves either the old or the new content.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name()
            .expect("config paths have a file name")
            .to_string_lossy()
    ));
    let write = || -> std::io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        fs::File::open(dir)?.sync_all()
    };
    write().with_context(|| format!("cannot write {}", path.display()))
}

/// Seconds since the Unix epoch.
/// Milliseconds since the epoch, by this node's clock.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// This machine's host name.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".to_string();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
