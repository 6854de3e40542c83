//! The NVMe/TCP host: initiator and native multipath.
//!
//! # Layers
//!
//! * [`queue`]: one TCP connection is one queue. ICReq/ICResp, Fabrics Connect, then many
//!   commands in flight, demultiplexed by CID on a reader thread; read data lands straight
//!   in the caller's buffer, write data goes in-capsule or answers R2Ts.
//! * [`Controller`]: one association (admin queue + I/O queues), brought up and kept
//!   alive as NVMe-oF requires; [`discover`] reads a Discovery log.
//! * [`Host`]: the node's multipath registry (Linux native NVMe multipath with `nvme
//!   connect`, `nvme list-subsys`, `multipath -ll`): paths (controllers) grouped per
//!   subsystem NQN and NSID into [`MultipathNamespace`]s, each a `BlockDevice`.
//!
//! # Names
//!
//! Every subsystem NQN gets an instance number on first connect ("nvme0"); its namespaces
//! are "nvme0n<nsid>" and its paths "nvme0c<k>" (k counts up per subsystem), like Linux
//! with native multipath. The names stay stable while the host runs, but they count
//! subsystems in connection order, so a restart or a reconnect in another order renames
//! them. Each namespace therefore also has a stable name from its identifiers
//! ([`stable_namespace_name`]): "eui.<NGUID>" (Linux's `/dev/disk/by-id/nvme-eui.*`),
//! "eui.<EUI-64>" when only that is reported, else "<subsystem NQN>/<NSID>".
//! [`Host::namespace`] accepts both.
//!
//! # Path life cycle
//!
//! A path is live while its association is. When any queue dies (socket error, a command
//! timeout, Keep Alive failure) the association is torn down, in-flight commands fail with
//! a path error and are retried on another path by the namespace, and the path's monitor
//! reconnects every `reconnect_delay`; after `ctrl_loss_tmo` it removes the path. ANA
//! states are read at connect, after every ANA status, when the controller sends an ANA
//! change notice (one Asynchronous Event Request is kept outstanding on the admin queue of
//! a controller that offers them), and every second by the monitor as a fallback.

pub mod completion;
pub mod controller;
pub mod error;
pub mod identity;
mod inbound;
pub mod namespace;
pub mod path;
pub mod policy;
pub mod queue;
mod sender;
pub mod stats;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

pub use crate::wire::log::DiscoveryEntry;
pub use controller::{
    discover, Controller, ControllerOptions, DiscoverOptions, NamespaceData, QueuePolicy,
};
pub use error::{nvme_status, HostError, NvmeStatusError};
pub use identity::HostIdentity;
pub use namespace::{MultipathNamespace, ReadBatch, PATHS_PER_NAMESPACE_MAX};
pub use policy::AnaPathState;
pub use stats::{PathStats, LATENCY_BUCKETS};

use namespace::NamespaceIdentity;
use path::{connect_controller, Connected, Notifier, Path};

/// What `nvme connect` takes: one path to one subsystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectOptions {
    /// Controller address (traddr and trsvcid).
    pub addr: SocketAddr,
    /// Subsystem NQN (`-n`).
    pub subnqn: String,
    /// Host NQN to present instead of the host's identity (`-q`).
    pub host_nqn: Option<String>,
    /// I/O queue entries (`-Q`), default 128.
    pub queue_size: u16,
    /// How long a lost path is reconnected before it is removed (`-l`), default 600 s.
    pub ctrl_loss_tmo: Duration,
    /// How long I/O waits for a lost path before failing (`-f`, fast_io_fail_tmo), while
    /// the path keeps reconnecting up to `ctrl_loss_tmo`; `None` (Linux's default, off):
    /// I/O waits as long as the path may come back. A vdisk that rides out a lost
    /// enclosure from parity sets it short and keeps `ctrl_loss_tmo` long, so the drives
    /// come back by themselves when the enclosure does.
    #[serde(default)]
    pub fast_io_fail_tmo: Option<Duration>,
    /// Delay between reconnection attempts (`-c`), default 2 s.
    pub reconnect_delay: Duration,
    /// Keep Alive Timeout (`-k`), default 5 s.
    pub keep_alive_tmo: Duration,
    /// I/O queues (`-i`); default min(CPUs, 4).
    pub nr_io_queues: Option<u16>,
    /// Header digests (`-g`).
    pub header_digest: bool,
    /// Data digests (`-G`).
    pub data_digest: bool,
}

impl ConnectOptions {
    /// Options with Linux's defaults for `addr` and `subnqn`.
    #[must_use]
    pub fn new(addr: SocketAddr, subnqn: &str) -> Self {
        ConnectOptions {
            addr,
            subnqn: subnqn.to_owned(),
            host_nqn: None,
            queue_size: 128,
            ctrl_loss_tmo: Duration::from_secs(600),
            fast_io_fail_tmo: None,
            reconnect_delay: Duration::from_secs(2),
            keep_alive_tmo: Duration::from_secs(5),
            nr_io_queues: None,
            header_digest: false,
            data_digest: false,
        }
    }

    /// How long I/O waits for this path once it is lost: `fast_io_fail_tmo` if set, never
    /// longer than `ctrl_loss_tmo`.
    #[must_use]
    pub fn io_fail_tmo(&self) -> Duration {
        self.fast_io_fail_tmo
            .map_or(self.ctrl_loss_tmo, |f| f.min(self.ctrl_loss_tmo))
    }

    /// The association options these connect options imply.
    #[must_use]
    pub fn controller_options(&self) -> ControllerOptions {
        ControllerOptions {
            queue_size: self.queue_size,
            nr_io_queues: self.nr_io_queues,
            keep_alive_tmo: self.keep_alive_tmo,
            header_digest: self.header_digest,
            data_digest: self.data_digest,
            ..ControllerOptions::default()
        }
    }

    fn validate(&self) -> Result<(), HostError> {
        let bad = |what: String| Err(HostError::Invalid(what));
        if self.queue_size < 2 {
            return bad(format!("queue size {} (at least 2)", self.queue_size));
        }
        if self.nr_io_queues == Some(0) {
            return bad("nr_io_queues 0 (at least 1)".to_owned());
        }
        if self.reconnect_delay.is_zero() {
            return bad("reconnect_delay 0 (at least 1 ms)".to_owned());
        }
        if let Some(fast) = self.fast_io_fail_tmo {
            if fast > self.ctrl_loss_tmo {
                return bad(format!(
                    "fast_io_fail_tmo {} s is longer than ctrl_loss_tmo {} s; I/O never waits \
                     longer than the path may come back",
                    fast.as_secs(),
                    self.ctrl_loss_tmo.as_secs()
                ));
            }
        }
        crate::wire::Nqn::new(&self.subnqn)
            .map_err(|e| HostError::Invalid(format!("subsystem NQN {:?}: {e}", self.subnqn)))?;
        Ok(())
    }
}

/// What `connect` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectReport {
    /// Subsystem instance, "nvme0".
    pub subsystem: String,
    /// Path (controller) name, "nvme0c1".
    pub controller: String,
    /// Controller ID.
    pub cntlid: u16,
    /// Namespaces reachable through this path, "nvme0n1".
    pub namespaces: Vec<String>,
    /// I/O queues opened.
    pub io_queues: usize,
    /// Entries per I/O queue.
    pub queue_size: u16,
}

/// Connection state of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PathState {
    /// Connected.
    Live,
    /// Lost; being reconnected.
    Connecting,
    /// Being removed.
    Deleting,
}

impl std::fmt::Display for PathState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PathState::Live => "live",
            PathState::Connecting => "connecting",
            PathState::Deleting => "deleting",
        })
    }
}

/// One path of a namespace, for `list()`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathInfo {
    /// Path name, "nvme0c1".
    pub controller: String,
    /// traddr:trsvcid.
    pub addr: SocketAddr,
    /// Controller ID of the current (or last) association.
    pub cntlid: u16,
    /// ANA state of the namespace through this path.
    pub ana_state: AnaPathState,
    /// Connection state.
    pub state: PathState,
    /// Seconds since the path was lost, while connecting.
    pub down_secs: Option<u64>,
    /// Counters.
    pub stats: PathStats,
}

/// One namespace, for `list()`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceInfo {
    /// Local name, "nvme0n1".
    pub name: String,
    /// Stable name, "eui.<NGUID>" (see [`stable_namespace_name`]).
    #[serde(default)]
    pub stable_name: String,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Namespace ID.
    pub nsid: u32,
    /// Size in bytes (whole 4 KiB sectors).
    pub size_bytes: u64,
    /// Logical block size.
    pub lba_bytes: u32,
    /// NGUID (zero when not reported).
    pub nguid: [u8; 16],
    /// UUID, when reported.
    pub uuid: Option<[u8; 16]>,
    /// Paths.
    pub paths: Vec<PathInfo>,
}

struct Subsystem {
    nqn: String,
    instance: u32,
    next_ctrl: u32,
    paths: Vec<Arc<Path>>,
    namespaces: BTreeMap<u32, Arc<MultipathNamespace>>,
}

#[derive(Default)]
struct Registry {
    subsystems: Vec<Subsystem>,
    next_instance: u32,
}

/// State shared with the path monitors (which remove expired paths).
pub(crate) struct HostShared {
    identity: HostIdentity,
    /// What an I/O error for an unreachable namespace tells the administrator to check.
    unreachable_advice: Arc<str>,
    registry: Mutex<Registry>,
    notifier: Arc<Notifier>,
    next_path_id: AtomicU64,
}

impl HostShared {
    /// Removes a path whose reconnection gave up. Its namespaces stay, with fewer paths,
    /// so a later `connect` of the same subsystem revives the same devices.
    pub(crate) fn remove_expired_path(&self, path_id: u64) {
        let mut registry = self.registry.lock();
        for sub in &mut registry.subsystems {
            sub.paths.retain(|p| p.id != path_id);
            for ns in sub.namespaces.values() {
                ns.detach(path_id);
            }
        }
    }
}

/// The node's NVMe host: connected subsystems, their paths and namespaces.
pub struct Host {
    shared: Arc<HostShared>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("nqn", &self.shared.identity.nqn)
            .finish_non_exhaustive()
    }
}

/// What to check when no path of a namespace answers, for drive servers (JBOFs).
const DRIVE_SERVER_ADVICE: &str = "check the drive server and the network";

impl Host {
    /// This host's namespaces are served by something other than drive servers (NSD
    /// servers): errors for an unreachable namespace give `advice` (what to check) instead
    /// of naming the drive server. Only before the first connect.
    ///
    /// # Panics
    /// If the host is shared already (cloned, or a path connected).
    #[must_use]
    pub fn with_unreachable_advice(mut self, advice: &str) -> Host {
        Arc::get_mut(&mut self.shared)
            .expect("advice set before the host is shared")
            .unreachable_advice = Arc::from(advice);
        self
    }

    /// An empty registry for `identity`.
    #[must_use]
    pub fn new(identity: HostIdentity) -> Host {
        Host {
            shared: Arc::new(HostShared {
                identity,
                unreachable_advice: Arc::from(DRIVE_SERVER_ADVICE),
                registry: Mutex::new(Registry::default()),
                notifier: Arc::new(Notifier::default()),
                next_path_id: AtomicU64::new(1),
            }),
        }
    }

    /// The host identity.
    #[must_use]
    pub fn identity(&self) -> &HostIdentity {
        &self.shared.identity
    }

    /// `nvme connect`: connects one path and adds it to its namespaces.
    ///
    /// # Errors
    /// [`HostError::Invalid`] for bad options, a path already connected, or a namespace
    /// whose identifiers differ from the one already known under the same subsystem NQN and
    /// NSID (the path is refused); otherwise the connection's error, for example
    /// [`HostError::ConnectRefused`] naming the host NQN when the subsystem does not allow
    /// this host.
    pub fn connect(&self, opts: ConnectOptions) -> Result<ConnectReport, HostError> {
        opts.validate()?;
        let hostnqn = opts
            .host_nqn
            .clone()
            .unwrap_or_else(|| self.shared.identity.nqn.clone());
        if self.find_path(&opts.subnqn, Some(opts.addr)).is_some() {
            return Err(HostError::Invalid(format!(
                "already connected to {} at {}",
                opts.subnqn, opts.addr
            )));
        }
        let connected = connect_controller(&opts, &hostnqn, self.shared.identity.id)?;
        let ctrl = Arc::clone(&connected.ctrl);
        let result = self.register(opts, hostnqn, connected);
        match result {
            Ok((path, report)) => {
                if let Err(e) = path.start_monitor(Arc::downgrade(&self.shared)) {
                    self.remove_paths(&path.opts.subnqn.clone(), Some(path.opts.addr));
                    return Err(e);
                }
                tracing::info!(
                    controller = %report.controller, addr = %path.opts.addr,
                    subnqn = %path.opts.subnqn, "connected; namespaces {:?}", report.namespaces
                );
                Ok(report)
            }
            Err(e) => {
                ctrl.disconnect();
                Err(e)
            }
        }
    }

    fn register(
        &self,
        opts: ConnectOptions,
        hostnqn: String,
        connected: Connected,
    ) -> Result<(Arc<Path>, ConnectReport), HostError> {
        let shared = &self.shared;
        let mut registry = shared.registry.lock();
        let index = subsystem_index(&mut registry, &opts.subnqn);
        let sub = &mut registry.subsystems[index];
        check_namespaces(sub, &opts, &connected)?;
        sub.next_ctrl += 1;
        let name = format!("nvme{}c{}", sub.instance, sub.next_ctrl);
        let ctrl = Arc::clone(&connected.ctrl);
        let mut nsids: Vec<(u32, NamespaceData)> = connected
            .namespaces
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        nsids.sort_by_key(|(nsid, _)| *nsid);
        let id = shared.next_path_id.fetch_add(1, Ordering::Relaxed);
        let identity = (hostnqn, shared.identity.id);
        let notifier = Arc::clone(&shared.notifier);
        let path = Arc::new(Path::new(
            id,
            name.clone(),
            opts,
            identity,
            connected,
            notifier,
        ));
        let mut names = Vec::new();
        for (nsid, data) in &nsids {
            let ns = sub.namespaces.entry(*nsid).or_insert_with(|| {
                Arc::new(MultipathNamespace::new(
                    NamespaceIdentity {
                        name: format!("nvme{}n{nsid}", sub.instance),
                        subnqn: sub.nqn.clone(),
                        nsid: *nsid,
                        size_bytes: data.size_bytes,
                        lba_bytes: data.lba_bytes,
                        nguid: data.nguid,
                        eui64: data.eui64,
                        uuid: data.uuid,
                        unreachable_advice: Arc::clone(&shared.unreachable_advice),
                    },
                    Arc::clone(&shared.notifier),
                ))
            });
            let dsm = ctrl.identify().oncs & crate::wire::identify::oncs::DSM != 0;
            ns.attach(
                &path,
                ctrl.max_transfer_bytes(data.lba_bytes),
                dsm,
                data.deallocate_zeroes,
            );
            names.push(ns.local_name().to_owned());
        }
        sub.paths.push(Arc::clone(&path));
        let report = ConnectReport {
            subsystem: format!("nvme{}", sub.instance),
            controller: name,
            cntlid: ctrl.cntlid(),
            namespaces: names,
            io_queues: ctrl.io_queue_count(),
            queue_size: ctrl.io_queue_entries(),
        };
        Ok((path, report))
    }

    fn find_path(&self, subnqn: &str, addr: Option<SocketAddr>) -> Option<Arc<Path>> {
        let registry = self.shared.registry.lock();
        let sub = registry.subsystems.iter().find(|s| s.nqn == subnqn)?;
        sub.paths
            .iter()
            .find(|p| addr.is_none_or(|a| p.opts.addr == a))
            .cloned()
    }

    /// `nvme disconnect`: removes the paths to `subnqn` (only the one at `addr`, if given)
    /// and returns how many. A subsystem left without paths is forgotten, and I/O to its
    /// namespaces fails from then on.
    ///
    /// # Errors
    /// None today; the `Result` leaves room for a clean-shutdown failure report.
    pub fn disconnect(&self, subnqn: &str, addr: Option<SocketAddr>) -> Result<usize, HostError> {
        Ok(self.remove_paths(subnqn, addr))
    }

    fn remove_paths(&self, subnqn: &str, addr: Option<SocketAddr>) -> usize {
        let removed: Vec<Arc<Path>> = {
            let mut registry = self.shared.registry.lock();
            let Some(index) = registry.subsystems.iter().position(|s| s.nqn == subnqn) else {
                return 0;
            };
            let sub = &mut registry.subsystems[index];
            let (gone, kept): (Vec<_>, Vec<_>) = sub
                .paths
                .drain(..)
                .partition(|p| addr.is_none_or(|a| p.opts.addr == a));
            sub.paths = kept;
            for ns in sub.namespaces.values() {
                gone.iter().for_each(|p| ns.detach(p.id));
            }
            if sub.paths.is_empty() {
                let sub = registry.subsystems.remove(index);
                sub.namespaces.values().for_each(|ns| ns.mark_removed());
            }
            gone
        };
        // Outside the registry lock: a monitor being joined may need it.
        for path in &removed {
            path.shutdown();
            tracing::info!(controller = %path.name, addr = %path.opts.addr, "disconnected");
        }
        removed.len()
    }

    /// Disconnects every path of every subsystem; returns how many.
    pub fn disconnect_all(&self) -> usize {
        let nqns: Vec<String> = {
            let registry = self.shared.registry.lock();
            registry.subsystems.iter().map(|s| s.nqn.clone()).collect()
        };
        nqns.iter().map(|nqn| self.remove_paths(nqn, None)).sum()
    }

    /// Every namespace with its paths (`nvme list-subsys` / `multipath -ll`).
    #[must_use]
    pub fn list(&self) -> Vec<NamespaceInfo> {
        let namespaces: Vec<Arc<MultipathNamespace>> = {
            let registry = self.shared.registry.lock();
            registry
                .subsystems
                .iter()
                .flat_map(|s| s.namespaces.values().cloned())
                .collect()
        };
        namespaces.iter().map(|ns| namespace_info(ns)).collect()
    }

    /// The namespace called `name`: its local name ("nvme0n1") or its stable name
    /// ("eui.<NGUID>", see [`stable_namespace_name`]).
    #[must_use]
    pub fn namespace(&self, name: &str) -> Option<Arc<MultipathNamespace>> {
        let registry = self.shared.registry.lock();
        registry
            .subsystems
            .iter()
            .flat_map(|s| s.namespaces.values())
            .find(|ns| ns.local_name() == name || ns.stable_name() == name)
            .cloned()
    }

    /// The namespace with this NGUID.
    #[must_use]
    pub fn namespace_by_nguid(&self, nguid: &[u8; 16]) -> Option<Arc<MultipathNamespace>> {
        if *nguid == [0; 16] {
            return None;
        }
        let registry = self.shared.registry.lock();
        registry
            .subsystems
            .iter()
            .flat_map(|s| s.namespaces.values())
            .find(|ns| ns.nguid() == *nguid)
            .cloned()
    }

    /// The options of every connected path: what a daemon persists and reconnects at
    /// restart.
    #[must_use]
    pub fn connections(&self) -> Vec<ConnectOptions> {
        let registry = self.shared.registry.lock();
        registry
            .subsystems
            .iter()
            .flat_map(|s| s.paths.iter().map(|p| p.opts.clone()))
            .collect()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.disconnect_all();
    }
}

fn subsystem_index(registry: &mut Registry, nqn: &str) -> usize {
    if let Some(i) = registry.subsystems.iter().position(|s| s.nqn == nqn) {
        return i;
    }
    let instance = registry.next_instance;
    registry.next_instance += 1;
    registry.subsystems.push(Subsystem {
        nqn: nqn.to_owned(),
        instance,
        next_ctrl: 0,
        paths: Vec::new(),
        namespaces: BTreeMap::new(),
    });
    registry.subsystems.len() - 1
}

/// Refuses a path whose namespaces contradict the ones already known for the subsystem.
fn check_namespaces(
    sub: &Subsystem,
    opts: &ConnectOptions,
    connected: &Connected,
) -> Result<(), HostError> {
    for (nsid, data) in &connected.namespaces {
        let Some(ns) = sub.namespaces.get(nsid) else {
            continue;
        };
        let known = NamespaceData {
            nguid: ns.nguid(),
            eui64: ns.eui64(),
            uuid: ns.uuid(),
            ..data.clone()
        };
        let refuse = |why: String| {
            Err(HostError::Invalid(format!(
                "refusing path {} to {}: namespace {nsid} {why}; it is not the namespace {} \
                 already reached through the other paths",
                opts.addr,
                opts.subnqn,
                ns.local_name()
            )))
        };
        if !data.same_namespace(&known) {
            return refuse(format!(
                "has NGUID {} but {} has {}",
                hex(&data.nguid),
                ns.local_name(),
                hex(&ns.nguid())
            ));
        }
        if data.lba_bytes != ns.lba_bytes()
            || data.size_bytes != tessera_drive::BlockDevice::size_bytes(&**ns)
        {
            return refuse(format!(
                "has {} bytes in {}-byte blocks",
                data.size_bytes, data.lba_bytes
            ));
        }
        if ns.path_count() >= PATHS_PER_NAMESPACE_MAX {
            return refuse(format!("already has {PATHS_PER_NAMESPACE_MAX} paths"));
        }
    }
    Ok(())
}

/// The name of a namespace that does not depend on connection order: "eui.<NGUID hex>",
/// "eui.<EUI-64 hex>" when the NGUID is zero, else "<subsystem NQN>/<NSID>".
#[must_use]
pub fn stable_namespace_name(nguid: &[u8; 16], eui64: &[u8; 8], subnqn: &str, nsid: u32) -> String {
    if *nguid != [0; 16] {
        format!("eui.{}", hex(nguid))
    } else if *eui64 != [0; 8] {
        format!("eui.{}", hex(eui64))
    } else {
        format!("{subnqn}/{nsid}")
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn namespace_info(ns: &MultipathNamespace) -> NamespaceInfo {
    let paths = ns
        .paths()
        .iter()
        .map(|p| {
            let path = &p.path;
            let (state, since) = path.state();
            PathInfo {
                controller: path.name.clone(),
                addr: path.opts.addr,
                cntlid: path.cntlid(),
                ana_state: path.ana_state(ns.nsid()),
                state,
                down_secs: since.map(|s| s.elapsed().as_secs()),
                stats: path.counters.snapshot(),
            }
        })
        .collect();
    NamespaceInfo {
        name: ns.local_name().to_owned(),
        stable_name: ns.stable_name(),
        subnqn: ns.subnqn().to_owned(),
        nsid: ns.nsid(),
        size_bytes: tessera_drive::BlockDevice::size_bytes(ns),
        lba_bytes: ns.lba_bytes(),
        nguid: ns.nguid(),
        uuid: ns.uuid(),
        paths,
    }
}
