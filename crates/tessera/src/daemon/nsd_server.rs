//! NSD servers: GPFS's NSD client/server model (`servers=` in an `%nsd` stanza) over
//! NVMe/TCP.
//!
//! A node named in an NSD's server list serves that NSD to the nodes that do not reach
//! its device themselves. The wire is NVMe/TCP, which crates/nvme already speaks both
//! ways (fuzzed decoders, multipath, ANA, reservations): each server runs one NVMe/TCP
//! target in its daemon (`nsdServerPort` at its node address) with one subsystem per NSD
//! it serves (`nqn...:nsd:<NSD id>`, one namespace whose NGUID is the NSD id), and a
//! client connects one path per server. The host's multipath does the rest: it prefers
//! the path whose ANA state is optimized (the first server of the list reports its
//! namespaces optimized, the others non-optimized), retries in-flight I/O on another
//! path when one dies, keeps reconnecting a dead path and goes back to it when its
//! server returns. A dedicated NSD protocol would have re-built all of that.
//!
//! Fencing: a client connects with a host NQN that names its node and the epoch of its
//! incarnation (`nqn...:node:<cluster>:<node>:<epoch>`). A server admits a host, and
//! lets it write, only while the replicated configuration says that epoch is the node's
//! live one (`ConfigState::epoch_is_live`); at every configuration change it asks again
//! for every controller, so once the cluster expels a node (or the node comes back as a
//! new incarnation) the old incarnation's writes are refused with Reservation Conflict
//! and said so in the server's log. The client's own lease gate stops its I/O first;
//! this is the second wall, for the node that does not know it is dead.
//!
//! How a node reaches an NSD with servers is `useNSDserver` (per node): a server of the
//! NSD always uses its device; `never` only the device, `always` only the servers,
//! `asfound` the device when it opens at mount and the servers otherwise, `asneeded`
//! (the default) the same, and after a failed I/O on the device, the servers from then
//! on ([`AsNeeded`]).

use std::collections::BTreeMap;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};

use super::da_admin::vdisk_device_name;
use parking_lot::Mutex;
use tessera_cluster::node::NodeNumber;
use tessera_cluster::state::{ConfigState, NodeRecord};
use tessera_drive::BlockDevice;
use tessera_nsd::NsdId;
use tessera_nvme::host::{ConnectOptions, Host, HostIdentity};
use tessera_nvme::target::{
    AnaState, DriveServer, Limits, NamespaceConfig, PortAddr, PortConfig, SubsystemConfig,
    TargetConfig,
};
use tessera_nvme::wire::Nqn;

use super::nsd_admin::Claim;
use super::Daemon;
use crate::config::NsdRecord;
use crate::rpc::Reply;

const NQN_PREFIX: &str = "nqn.2024-01.io.tessera";
/// ANA group of the namespaces a node serves as the NSD's first server (optimized), and
/// of those it serves as a later one (non-optimized).
const PREFERRED_GROUP: u32 = 1;
const OTHER_GROUP: u32 = 2;
/// How often a lost path to a server is tried again.
const RECONNECT_DELAY: Duration = Duration::from_secs(1);
/// How often the servers of an NSD that no server answers for are tried while that lasts.
const STRANDED_RETRY: Duration = Duration::from_millis(250);
/// Rounds tried at `STRANDED_RETRY` before the usual period again: ten seconds.
const STRANDED_ROUNDS: u32 = 40;
/// Keep Alive Timeout of server paths: a server that stops answering without closing
/// its connections (a partition, a hung node) loses its path after this long.
const KEEP_ALIVE: Duration = Duration::from_secs(3);
/// The largest request of `perf nsd`.
const PERF_REQUEST_MAX: u32 = 16 << 20;

/// The subsystem NQN under which servers export NSD `id`.
pub(super) fn nsd_subnqn(id: &NsdId) -> String {
    format!("{NQN_PREFIX}:nsd:{}", id.to_hex())
}

/// The host NQN of incarnation `epoch` of node `node` of cluster `cluster` (hex id).
pub(super) fn node_hostnqn(cluster: &str, node: NodeNumber, epoch: u64) -> String {
    format!("{NQN_PREFIX}:node:{cluster}:{node}:{epoch}")
}

/// The node and epoch a host NQN of [`node_hostnqn`]'s form names, if it is of this
/// cluster.
fn parse_node_hostnqn(nqn: &str, cluster: &str) -> Option<(NodeNumber, u64)> {
    let rest = nqn.strip_prefix(NQN_PREFIX)?.strip_prefix(":node:")?;
    let mut parts = rest.split(':');
    let (c, node, epoch) = (parts.next()?, parts.next()?, parts.next()?);
    if c != cluster || parts.next().is_some() {
        return None;
    }
    Some((node.parse().ok()?, epoch.parse().ok()?))
}

/// Host NQNs whose node names [`ServedIoHistory`] keeps; past this it starts over.
const SERVED_NAMES_MAX: usize = 1024;

/// Notes in the daemon's I/O history (`tessera diag --iohist`) the drive reads and writes
/// this node does as server of one NSD, each with the node it did them for: as on a GPFS
/// NSD server, whether a slow served I/O waited on the drive shows here.
struct ServedIoHistory {
    history: Arc<tessera_drive::stats::IoHistory>,
    nsd: Arc<str>,
    cluster: String,
    state: Box<dyn Fn() -> ConfigState + Send + Sync>,
    /// Node names by host NQN: the node table is not read for every I/O.
    names: parking_lot::Mutex<std::collections::HashMap<String, Arc<str>>>,
}

impl std::fmt::Debug for ServedIoHistory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedIoHistory")
            .field("nsd", &self.nsd)
            .finish()
    }
}

impl ServedIoHistory {
    /// The node a host NQN names, or the NQN itself for a host outside the cluster.
    fn name(&self, hostnqn: &str) -> Arc<str> {
        if let Some(name) = self.names.lock().get(hostnqn) {
            return Arc::clone(name);
        }
        let name: Arc<str> = match parse_node_hostnqn(hostnqn, &self.cluster) {
            Some((node, _)) => match (self.state)().nodes.get(&node) {
                Some(n) => Arc::from(n.name.as_str()),
                None => Arc::from(format!("node number {node}")),
            },
            None => Arc::from(hostnqn),
        };
        let mut names = self.names.lock();
        if names.len() >= SERVED_NAMES_MAX {
            names.clear();
        }
        names.insert(hostnqn.to_string(), Arc::clone(&name));
        name
    }
}

impl tessera_nvme::target::IoObserver for ServedIoHistory {
    fn begin(
        &self,
        write: bool,
        offset: u64,
        bytes: u64,
        hostnqn: &str,
    ) -> Box<dyn tessera_nvme::target::ObservedIo> {
        let kind = if write {
            tessera_drive::stats::IoKind::Write
        } else {
            tessera_drive::stats::IoKind::Read
        };
        let for_node = self.name(hostnqn);
        let ticket = self
            .history
            .begin(kind, Arc::clone(&self.nsd), offset, bytes, Some(for_node));
        Box::new(ServedIo {
            history: Arc::clone(&self.history),
            ticket,
        })
    }
}

/// One served drive I/O in flight in the history.
struct ServedIo {
    history: Arc<tessera_drive::stats::IoHistory>,
    ticket: tessera_drive::stats::HistoryTicket,
}

impl tessera_nvme::target::ObservedIo for ServedIo {
    fn end(self: Box<Self>, ok: bool) {
        self.history.end(self.ticket, ok);
    }
}

/// Where node `node`'s NSD server listens: its node address with `nsdServerPort`.
pub(super) fn nsd_server_addr(state: &ConfigState, node: &NodeRecord) -> Result<SocketAddr> {
    let port = state.params.count("nsdServerPort", Some(node.number));
    let port = u16::try_from(port).map_err(|_| anyhow!("nsdServerPort {port} is not a port"))?;
    let text = &node.address;
    let host = match text.parse::<SocketAddr>() {
        Ok(a) => return Ok(SocketAddr::new(a.ip(), port)),
        Err(_) => text
            .rsplit_once(':')
            .map_or(text.as_str(), |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']'),
    };
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| anyhow!("node {}: address {text} does not resolve", node.name))
}

/// One NSD this node serves.
struct Served {
    id: NsdId,
    dev: Arc<dyn BlockDevice>,
    nqn: String,
    preferred: bool,
}

/// One NSD this node reaches through its servers, for the paths that are tried again.
#[derive(Clone)]
struct Reached {
    subnqn: String,
    hostnqn: String,
    epoch: u64,
    servers: Vec<(String, SocketAddr)>,
}

/// The NSD server and client sides of a daemon.
pub(super) struct NsdService {
    /// The NVMe/TCP target, started with the first NSD this node serves.
    server: Mutex<Option<DriveServer>>,
    served: Mutex<BTreeMap<String, Served>>,
    /// Problems already logged (an NSD that does not open, a port that does not bind),
    /// so that a retry every change does not flood the log.
    logged: Mutex<BTreeMap<String, String>>,
    /// Paths to other nodes' NSD servers. A host of its own: `tessera nvme` commands
    /// manage the admin's remote drives, and an NSD's namespace must never be taken for
    /// a drive on which the NSD was "found" (`Daemon::candidates`).
    pub(super) host: Arc<Host>,
    reached: Mutex<BTreeMap<String, Reached>>,
    started: AtomicBool,
}

impl NsdService {
    pub(super) fn new() -> NsdService {
        NsdService {
            server: Mutex::new(None),
            served: Mutex::new(BTreeMap::new()),
            logged: Mutex::new(BTreeMap::new()),
            host: Arc::new(
                Host::new(HostIdentity {
                    nqn: format!("{NQN_PREFIX}:nsd-client"),
                    id: rand::random(),
                })
                .with_unreachable_advice(
                    "check that the NSD's servers are up and that this node reaches them \
                     (`tessera nsd ls -M` shows each server's path; `tessera state` which \
                     nodes are up)",
                ),
            ),
            reached: Mutex::new(BTreeMap::new()),
            started: AtomicBool::new(false),
        }
    }

    /// The device this node serves NSD `name` (of id `id`) from, if it serves it.
    pub(super) fn served_device(&self, name: &str, id: &NsdId) -> Option<Arc<dyn BlockDevice>> {
        let served = self.served.lock();
        let s = served.get(name).filter(|s| s.id == *id)?;
        Some(Arc::clone(&s.dev))
    }

    /// Logs `what` about `key` unless the same was logged last time.
    fn log_once(&self, key: &str, what: String) {
        let mut logged = self.logged.lock();
        if logged.get(key) != Some(&what) {
            tracing::warn!("{what}");
            logged.insert(key.to_string(), what);
        }
    }

    fn forget(&self, key: &str) {
        self.logged.lock().remove(key);
    }
}

impl Daemon {
    /// Starts the thread that keeps this node's NSD service in step with the replicated
    /// configuration: serves the NSDs that name this node, withdraws the others, fences
    /// hosts whose incarnation ended, and tries lost paths to other servers again.
    pub(super) fn start_nsd_service(self: &Arc<Self>) -> Result<()> {
        if self.nsd_service.started.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let daemon = Arc::downgrade(self);
        let mut applied = self.member.applied();
        std::thread::Builder::new()
            .name("nsd-service".into())
            .spawn(move || {
                let mut stranded_rounds = 0u32;
                loop {
                    let Some(d) = daemon.upgrade() else { return };
                    // Arrays first: an array moved here brings the vdisks its NSDs are.
                    d.open_arrays_given_here();
                    d.sync_nsd_service();
                    // An NSD no server answers for has I/O waiting on it: its new server (an
                    // array taken over, a server back) is looked for often, not every 2 s;
                    // for a failover's few seconds, not for an outage (every attempt is a
                    // line in each server's log).
                    if d.retry_nsd_paths() {
                        stranded_rounds = stranded_rounds.saturating_add(1);
                    } else {
                        stranded_rounds = 0;
                    }
                    let period = if (1..=STRANDED_ROUNDS).contains(&stranded_rounds) {
                        STRANDED_RETRY
                    } else {
                        Duration::from_secs(2)
                    };
                    d.member.wait_for_change(&mut applied, period);
                }
            })?;
        Ok(())
    }

    fn sync_nsd_service(&self) {
        let state = self.member.state();
        let Some(me) = state.nodes.get(&self.member.me()).cloned() else {
            return;
        };
        let Ok(registry) = self.nsds() else { return };
        let wanted: BTreeMap<&str, (&NsdRecord, bool)> = registry
            .nsds
            .iter()
            .filter(|n| n.servers.contains(&me.name) && self.standby_reason(n).is_none())
            .map(|n| (n.name.as_str(), (n, n.servers[0] == me.name)))
            .collect();
        let svc = &self.nsd_service;
        {
            let server = svc.server.lock();
            svc.served.lock().retain(|name, s| {
                let keep = wanted
                    .get(name.as_str())
                    .is_some_and(|(rec, first)| rec.id == s.id && *first == s.preferred);
                if !keep {
                    if let Some(server) = server.as_ref() {
                        server.remove_subsystem(&s.nqn);
                    }
                    tracing::info!("NSD {name}: no longer served by this node");
                }
                keep
            });
        }
        if wanted.is_empty() && svc.server.lock().is_none() {
            return;
        }
        if svc.server.lock().is_none() {
            match self.start_nsd_target(&state, &me) {
                Ok(server) => {
                    svc.forget("target");
                    *svc.server.lock() = Some(server);
                }
                Err(e) => {
                    svc.log_once("target", format!("NSD server not started: {e:#}"));
                    return;
                }
            }
        }
        for (name, (rec, first)) in &wanted {
            if svc.served.lock().contains_key(*name) {
                continue;
            }
            if let Err(e) = self.serve_nsd(rec, *first) {
                svc.log_once(name, format!("NSD {name}: not served by this node: {e:#}"));
                continue;
            }
            svc.forget(name);
        }
        if let Some(server) = svc.server.lock().as_ref() {
            server.refence();
        }
    }

    fn start_nsd_target(&self, state: &ConfigState, me: &NodeRecord) -> Result<DriveServer> {
        let addr = nsd_server_addr(state, me)?;
        let port = PortConfig {
            portid: 1,
            addr: PortAddr {
                ipv6: addr.is_ipv6(),
                traddr: addr.ip(),
                trsvcid: addr.port(),
            },
            inline_data_bytes: tessera_nvme::target::config::INLINE_DATA_DEFAULT_BYTES,
            subsystems: Vec::new(),
            ana_groups: [
                (PREFERRED_GROUP, AnaState::Optimized),
                (OTHER_GROUP, AnaState::NonOptimized),
            ]
            .into_iter()
            .collect(),
            referrals: Vec::new(),
        };
        let config = TargetConfig {
            hosts: Vec::new(),
            ports: vec![port],
            subsystems: Vec::new(),
            tessera: Limits::default(),
            state_dir: None,
        };
        let none = |p: &std::path::Path| -> io::Result<Arc<dyn BlockDevice>> {
            Err(io::Error::other(format!("{}: no device", p.display())))
        };
        let server = DriveServer::start_with(config, &none).map_err(|e| {
            anyhow!(
                "{e} (nsdServerPort; `tessera config set nsdServerPort=N -N {}` moves it)",
                me.name
            )
        })?;
        let cluster = self.cluster.cluster_id.clone();
        let machine = self.member.state_reader();
        server.set_host_gate(Arc::new(move |nqn: &str| {
            parse_node_hostnqn(nqn, &cluster)
                .is_some_and(|(node, epoch)| machine().epoch_is_live(node, epoch))
        }));
        tracing::info!("NSD server listening on {addr}");
        Ok(server)
    }

    fn serve_nsd(&self, rec: &NsdRecord, preferred: bool) -> Result<()> {
        // Not while an admin command runs here: one that holds the device exclusively (an
        // `nsd create` writing its descriptor) would share its exclusive claim with this
        // open (a process holds one claim per device), and the server would keep the
        // device locked against the other servers for good. Tried again at the next pass.
        let Some(_admin) = self.admin.try_lock() else {
            bail!("an admin command is running on this node; trying again shortly");
        };
        let dev = self.open_nsd_local(rec, Claim::Shared)?;
        let nqn = nsd_subnqn(&rec.id);
        let cfg = SubsystemConfig {
            nqn: Nqn::new(&nqn).map_err(|e| anyhow!("{nqn}: {e}"))?,
            allow_any_host: true,
            serial: rec.id.to_hex()[..20].to_string(),
            model: format!("Tessera NSD {}", rec.name)
                .chars()
                .take(40)
                .collect(),
            allowed_hosts: Vec::new(),
            namespaces: vec![NamespaceConfig {
                nsid: 1,
                enable: true,
                path: rec.name.clone().into(),
                nguid: rec.id.0,
                uuid: rec.id.0,
                ana_grpid: if preferred {
                    PREFERRED_GROUP
                } else {
                    OTHER_GROUP
                },
                volatile_write_cache: None,
            }],
        };
        let server = self.nsd_service.server.lock();
        let server = server
            .as_ref()
            .ok_or_else(|| anyhow!("the NSD server is not running"))?;
        let open =
            |_: &std::path::Path| -> io::Result<Arc<dyn BlockDevice>> { Ok(Arc::clone(&dev)) };
        server.add_subsystem(&cfg, &open)?;
        server.observe_io(&nqn, Arc::new(self.served_io_history(&rec.name)));
        self.nsd_service.served.lock().insert(
            rec.name.clone(),
            Served {
                id: rec.id,
                dev: Arc::clone(&dev),
                nqn,
                preferred,
            },
        );
        tracing::info!(
            "NSD {}: served by this node ({})",
            rec.name,
            if preferred {
                "first server"
            } else {
                "backup server"
            }
        );
        Ok(())
    }

    /// What notes the drive I/O this node does for others as server of NSD `nsd` in its
    /// I/O history.
    fn served_io_history(&self, nsd: &str) -> ServedIoHistory {
        ServedIoHistory {
            history: Arc::clone(&self.io_history),
            nsd: Arc::from(nsd),
            cluster: self.cluster.cluster_id.clone(),
            state: Box::new(self.member.state_reader()),
            names: parking_lot::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Opens NSD `rec` the way `useNSDserver` says for this node (see the module
    /// documentation); what mounts, `fs create` and `df` use.
    pub(super) fn open_nsd_as(
        &self,
        rec: &NsdRecord,
        claim: Claim,
    ) -> Result<Arc<dyn BlockDevice>> {
        if rec.servers.is_empty() {
            return self.open_nsd_local(rec, claim);
        }
        let me = self.member.me();
        let state = self.member.state();
        let my_name = state
            .nodes
            .get(&me)
            .map(|n| n.name.clone())
            .unwrap_or_default();
        if rec.servers.contains(&my_name) && self.standby_reason(rec).is_none() {
            let local = self.open_nsd_local(rec, claim)?;
            if vdisk_device_name(&rec.device).is_none() {
                return Ok(local);
            }
            // A vdisk served here is reached through this node's open array only while
            // the array stays here: once it moves (`da move`, a takeover after a lease
            // lapse) the local handle fails and this node goes on through the servers,
            // the array's new one among them, like any client.
            return Ok(self.local_then_servers(
                rec,
                local,
                "its declustered array left this node",
                array_closed,
            ));
        }
        if rec.servers.contains(&my_name) {
            return self.open_nsd_via_servers(rec);
        }
        let mode = state.params.get("useNSDserver", Some(me));
        match mode.as_str() {
            "never" => self.open_nsd_local(rec, claim).map_err(|e| {
                e.context(format!(
                    "useNSDserver=never on this node: NSD {} is not reached through its \
                     servers ({})",
                    rec.name,
                    rec.servers.join(",")
                ))
            }),
            "always" => self.open_nsd_via_servers(rec),
            _ => match self.open_nsd_local(rec, claim) {
                Ok(local) if mode == "asneeded" => {
                    Ok(self.local_then_servers(rec, local, "useNSDserver=asneeded", |_| true))
                }
                Ok(local) => Ok(local),
                Err(local) => self
                    .open_nsd_via_servers(rec)
                    .map_err(|e| e.context(format!("and directly: {local:#}"))),
            },
        }
    }

    /// `local` until an I/O on it fails in a way `leaves` accepts, then `rec`'s NSD
    /// servers (see [`AsNeeded`]); `why` is logged when it moves.
    fn local_then_servers(
        &self,
        rec: &NsdRecord,
        local: Arc<dyn BlockDevice>,
        why: &'static str,
        leaves: fn(&io::Error) -> bool,
    ) -> Arc<dyn BlockDevice> {
        let daemon = self.this.clone();
        let again = rec.clone();
        Arc::new(AsNeeded {
            name: rec.name.clone(),
            why,
            wait: all_servers_down_wait(&self.member.state(), self.member.me()),
            leaves,
            local,
            servers: Mutex::new(None),
            opening: Mutex::new(()),
            open_servers: Box::new(move || {
                let d = daemon
                    .upgrade()
                    .ok_or_else(|| io::Error::other("daemon gone"))?;
                d.open_nsd_via_servers(&again)
                    .map_err(|e| io::Error::other(format!("{e:#}")))
            }),
        })
    }

    /// Why this node, though listed in `rec`'s servers, does not serve it now: a vdisk NSD
    /// is served only by the node its declustered array is open on (any of the array's
    /// servers, one at a time); the others stand by and reach it through the servers like
    /// clients until the array comes to them.
    fn standby_reason(&self, rec: &NsdRecord) -> Option<String> {
        let vdisk = vdisk_device_name(&rec.device)?;
        if self.find_vdisk(vdisk).is_some() {
            return None;
        }
        Some(format!(
            "standby server: the declustered array of vdisk {vdisk} is served by another \
             node (`tessera da ls`)"
        ))
    }

    /// Connects a path to every server of `rec` (those not connected yet) and returns
    /// the multipath namespace, checked to hold the NSD.
    fn open_nsd_via_servers(&self, rec: &NsdRecord) -> Result<Arc<dyn BlockDevice>> {
        let Some(epoch) = self.member.io_epoch() else {
            bail!(
                "NSD {}: this node holds no disk lease, so it does not connect to NSD \
                 servers; `tessera state -a` shows the cluster",
                rec.name
            );
        };
        let state = self.member.state();
        let hostnqn = node_hostnqn(&self.cluster.cluster_id, self.member.me(), epoch);
        let subnqn = nsd_subnqn(&rec.id);
        let host = &self.nsd_service.host;
        // Paths of an earlier incarnation are fenced at the servers: replace them.
        let stale = host
            .connections()
            .iter()
            .any(|c| c.subnqn == subnqn && c.host_nqn.as_deref() != Some(hostnqn.as_str()));
        if stale {
            let _ = host.disconnect(&subnqn, None);
        }
        let mut servers = Vec::new();
        let wait = all_servers_down_wait(&state, self.member.me());
        let mut problems = Vec::new();
        for name in &rec.servers {
            let Some(node) = state.node_by_name(name) else {
                problems.push(format!("{name} is not a node of this cluster"));
                continue;
            };
            let addr = match nsd_server_addr(&state, node) {
                Ok(a) => a,
                Err(e) => {
                    problems.push(format!("{e:#}"));
                    continue;
                }
            };
            servers.push((name.clone(), addr));
            if let Err(e) = connect_path(host, addr, &subnqn, &hostnqn, wait) {
                problems.push(format!("{name} ({addr}): {e}"));
            }
        }
        self.nsd_service.reached.lock().insert(
            rec.name.clone(),
            Reached {
                subnqn,
                hostnqn,
                epoch,
                servers,
            },
        );
        let Some(ns) = host.namespace_by_nguid(&rec.id.0) else {
            bail!(
                "NSD {}: no NSD server answered ({}); start a server's daemon, or check \
                 that it reaches the device (`tessera nsd ls -M` on it)",
                rec.name,
                problems.join("; ")
            );
        };
        if !problems.is_empty() {
            tracing::warn!(
                "NSD {}: reached through fewer servers than listed: {}",
                rec.name,
                problems.join("; ")
            );
        }
        let ns: Arc<dyn BlockDevice> = ns;
        super::nsd_admin::open_checked(rec, ns)
    }

    /// Stops serving the NSDs `names` (their device is about to close here: a vdisk whose
    /// array moves away); clients go on through their other servers.
    pub(super) fn withdraw_served_nsds(&self, names: &[String]) {
        let server = self.nsd_service.server.lock();
        let mut served = self.nsd_service.served.lock();
        for name in names {
            if let Some(s) = served.remove(name) {
                if let Some(server) = server.as_ref() {
                    server.remove_subsystem(&s.nqn);
                }
                tracing::info!("NSD {name}: no longer served by this node (its device closes)");
            }
        }
    }

    /// `nsd change -F` [mmchnsd]: new server lists, all or none. The servers start and
    /// stop serving when they see the change, and clients connect to the new servers and
    /// leave the old ones (`retry_nsd_paths`).
    pub(super) fn nsd_change_servers(&self, changes: &[(String, Vec<String>)]) -> Result<Reply> {
        let _admin = self.admin.lock();
        let registry = self.nsds()?;
        let state = self.member.state();
        let mut problems = Vec::new();
        for (name, servers) in changes {
            if registry.get(name).is_none() {
                problems.push(format!(
                    "NSD {name} does not exist; `tessera nsd ls` lists the NSDs"
                ));
            }
            for server in servers {
                if state.node_by_name(server).is_none() {
                    problems.push(format!(
                        "NSD {name}: servers={}: {server} is not a node of this cluster",
                        servers.join(",")
                    ));
                }
            }
        }
        if !problems.is_empty() {
            bail!("no NSD was changed:\n  {}", problems.join("\n  "));
        }
        // On the table as it is when it saves (another node's command may land meanwhile).
        self.change_nsds_and_file_systems(&mut |registry, _| {
            for (name, servers) in changes {
                let Some(rec) = registry.get_mut(name) else {
                    bail!("NSD {name} was deleted meanwhile; no NSD was changed");
                };
                rec.servers = servers.clone();
            }
            Ok(())
        })?;
        for (name, servers) in changes {
            let before = registry
                .get(name)
                .map(|r| r.servers.join(","))
                .unwrap_or_default();
            tracing::info!(
                "NSD {name}: servers {} -> {}",
                if before.is_empty() {
                    "(none)"
                } else {
                    before.as_str()
                },
                servers.join(",")
            );
        }
        Ok(Reply::Done)
    }

    /// `perf nsd`: `threads` streams of `size`-byte requests to NSD `name` for `seconds`,
    /// each stream sequential over its own part of the NSD (past the first MiB, which holds
    /// the NSD and file-system descriptors), through whatever path this node uses for it.
    pub(super) fn perf_nsd(
        &self,
        name: &str,
        write: bool,
        size: u32,
        threads: u32,
        seconds: u32,
    ) -> Result<crate::rpc::PerfNsdReport> {
        const SKIP: u64 = 1 << 20;
        if size == 0 || size > PERF_REQUEST_MAX || !size.is_multiple_of(4096) {
            bail!("--size {size}: use a multiple of 4K up to 16M");
        }
        if !(1..=64).contains(&threads) || !(1..=600).contains(&seconds) {
            bail!("--threads 1..64 and --seconds 1..600");
        }
        let registry = self.nsds()?;
        let rec = registry
            .get(name)
            .ok_or_else(|| anyhow!("NSD {name} does not exist; `tessera nsd ls` lists the NSDs"))?;
        if write {
            if let Some(fs) = &rec.file_system {
                bail!(
                    "NSD {name} belongs to file system {fs}: a write test would destroy it; \
                     use --op read, or a free NSD"
                );
            }
        }
        let dev = self.open_nsd_as(rec, Claim::Shared)?;
        let path = self
            .nsd_access()?
            .into_iter()
            .find(|a| a.nsd == name)
            .map(|a| a.remarks())
            .unwrap_or_default();
        let size64 = u64::from(size);
        let usable = dev.size_bytes().saturating_sub(SKIP);
        let span = (usable / u64::from(threads)) / size64 * size64;
        if span == 0 {
            bail!("NSD {name} is too small for {threads} streams of {size}-byte requests");
        }
        let stop = AtomicBool::new(false);
        let started = std::time::Instant::now();
        let results: Vec<io::Result<(u64, Vec<u32>)>> = std::thread::scope(|scope| {
            let running: Vec<_> = (0..u64::from(threads))
                .map(|t| {
                    let (dev, stop) = (&dev, &stop);
                    scope.spawn(move || -> io::Result<(u64, Vec<u32>)> {
                        let mut buf = tessera_drive::AlignedBuf::for_io(size as usize);
                        buf.fill(0x5a);
                        let base = SKIP + t * span;
                        let mut at = 0u64;
                        let mut lat = Vec::new();
                        while !stop.load(Ordering::Relaxed) {
                            let t0 = std::time::Instant::now();
                            if write {
                                dev.write_at(&buf, base + at)?;
                            } else {
                                dev.read_at(&mut buf, base + at)?;
                            }
                            lat.push(u32::try_from(t0.elapsed().as_micros()).unwrap_or(u32::MAX));
                            at = (at + size64) % span;
                        }
                        if write {
                            dev.flush()?;
                        }
                        Ok((lat.len() as u64 * size64, lat))
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_secs(u64::from(seconds)));
            stop.store(true, Ordering::Relaxed);
            running
                .into_iter()
                .map(|t| t.join().expect("a perf stream panicked"))
                .collect()
        });
        let secs = started.elapsed().as_secs_f64();
        let mut bytes = 0;
        let mut all = Vec::new();
        for r in results {
            let (b, lat) = r.map_err(|e| anyhow!("NSD {name}: {e}"))?;
            bytes += b;
            all.extend(lat);
        }
        all.sort_unstable();
        let pct = |p: usize| all.get((all.len() * p / 100).min(all.len().saturating_sub(1)));
        Ok(crate::rpc::PerfNsdReport {
            path,
            bytes,
            requests: all.len() as u64,
            seconds: secs,
            latency_us_p50: pct(50).copied().map_or(0, u64::from),
            latency_us_p99: pct(99).copied().map_or(0, u64::from),
            latency_us_max: all.last().copied().map_or(0, u64::from),
        })
    }

    /// How this node reaches each NSD now (`nsd ls -M`).
    pub(super) fn nsd_access(&self) -> Result<Vec<crate::rpc::NsdAccessRow>> {
        let registry = self.nsds()?;
        let me = self.member.me_name();
        let logged = self.nsd_service.logged.lock().clone();
        let served = self.nsd_service.served.lock();
        let reached = self.nsd_service.reached.lock().clone();
        let namespaces = self.nsd_service.host.list();
        let rows = registry
            .nsds
            .iter()
            .map(|rec| {
                let mut row = crate::rpc::NsdAccessRow {
                    nsd: rec.name.clone(),
                    access: "directly attached".into(),
                    device: rec.device.clone(),
                    paths: Vec::new(),
                };
                if rec.servers.is_empty() {
                    return row;
                }
                if served.get(&rec.name).is_some_and(|s| s.id == rec.id) {
                    row.access = "server node".into();
                    return row;
                }
                let standby = self.standby_reason(rec);
                if rec.servers.contains(&me) && standby.is_none() {
                    // Listed as a server, but not serving: say why (the service's last word).
                    let why = logged
                        .get(&rec.name)
                        .or_else(|| logged.get("target"))
                        .cloned()
                        .unwrap_or_else(|| "not started yet".into());
                    row.access = format!("server node, NOT SERVING: {why}");
                    return row;
                }
                let ns = namespaces.iter().find(|ns| ns.nguid == rec.id.0);
                match (reached.get(&rec.name), ns) {
                    (Some(r), Some(ns)) => {
                        row.access = "through servers".into();
                        if standby.is_some() {
                            row.access = "standby server, through servers".into();
                        }
                        row.device = ns.stable_name.clone();
                        row.paths = r
                            .servers
                            .iter()
                            .map(
                                |(server, addr)| match ns.paths.iter().find(|p| p.addr == *addr) {
                                    Some(p) => (
                                        server.clone(),
                                        p.ana_state.to_string(),
                                        p.state.to_string(),
                                    ),
                                    None => (server.clone(), "-".into(), "not connected".into()),
                                },
                            )
                            .collect();
                    }
                    _ => {
                        row.access = match &standby {
                            Some(why) if rec.servers.contains(&me) => format!("{why}; not opened"),
                            _ => "not opened".into(),
                        }
                    }
                }
                row
            })
            .collect();
        Ok(rows)
    }

    /// Connects the paths to NSD servers that were lost for good (ctrl_loss_tmo) or never
    /// came up, for the incarnation that asked for them. Returns whether some NSD this node
    /// reaches through servers has no live path left.
    fn retry_nsd_paths(&self) -> bool {
        let reached: Vec<(String, Reached)> = self
            .nsd_service
            .reached
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let Some(epoch) = self.member.io_epoch() else {
            return false;
        };
        let wait = all_servers_down_wait(&self.member.state(), self.member.me());
        let reached_now: Vec<String> = reached
            .iter()
            .filter(|(_, r)| r.epoch == epoch)
            .map(|(_, r)| r.subnqn.clone())
            .collect();
        let host = &self.nsd_service.host;
        // Paths of an earlier incarnation of this node are fenced at the servers: they
        // would knock (and be refused) forever. The next open connects new ones.
        for (nsd, r) in reached.iter().filter(|(_, r)| r.epoch != epoch) {
            let _ = host.disconnect(&r.subnqn, None);
            self.nsd_service.reached.lock().remove(nsd);
            tracing::info!(
                "NSD {nsd}: paths of this node's earlier incarnation (epoch {}) closed",
                r.epoch
            );
        }
        let live: Vec<(String, SocketAddr)> = host
            .connections()
            .into_iter()
            .map(|c| (c.subnqn, c.addr))
            .collect();
        // Server lists changed by `nsd change -F`: leave the servers no longer listed.
        let registry = self.nsds().ok();
        let state = self.member.state();
        let mut reached = reached;
        // Closed only after the new servers' paths are up: a namespace whose last path
        // goes is gone for good, under the mounts that use it.
        let mut gone = Vec::new();
        for (nsd, r) in reached.iter_mut().filter(|(_, r)| r.epoch == epoch) {
            let Some(rec) = registry.as_ref().and_then(|reg| reg.get(nsd)) else {
                continue;
            };
            let now: Vec<(String, SocketAddr)> = rec
                .servers
                .iter()
                .filter_map(|name| {
                    let node = state.node_by_name(name)?;
                    Some((name.clone(), nsd_server_addr(&state, node).ok()?))
                })
                .collect();
            if now == r.servers {
                continue;
            }
            let left: Vec<(String, SocketAddr)> = r
                .servers
                .iter()
                .filter(|(_, addr)| !now.iter().any(|(_, a)| a == addr))
                .cloned()
                .collect();
            r.servers = now;
            if left.is_empty() {
                if let Some(kept) = self.nsd_service.reached.lock().get_mut(nsd) {
                    kept.servers = r.servers.clone();
                }
            } else {
                gone.push((nsd.clone(), r.subnqn.clone(), r.servers.clone(), left));
            }
        }
        for (nsd, r) in reached.into_iter().filter(|(_, r)| r.epoch == epoch) {
            for (server, addr) in &r.servers {
                if live.iter().any(|(n, a)| *n == r.subnqn && a == addr) {
                    continue;
                }
                match connect_path(host, *addr, &r.subnqn, &r.hostnqn, wait) {
                    Ok(()) => {
                        tracing::info!("NSD {nsd}: path to server {server} ({addr}) connected")
                    }
                    Err(e) => tracing::debug!("NSD {nsd}: server {server} ({addr}): {e}"),
                }
            }
        }
        let connected: Vec<(String, SocketAddr)> = host
            .list()
            .into_iter()
            .flat_map(|ns| {
                let subnqn = ns.subnqn.clone();
                ns.paths
                    .into_iter()
                    .filter(|p| p.state == tessera_nvme::host::PathState::Live)
                    .map(move |p| (subnqn.clone(), p.addr))
            })
            .collect();
        for (nsd, subnqn, now, left) in gone {
            let up = now
                .iter()
                .any(|(_, addr)| connected.iter().any(|(n, a)| *n == subnqn && a == addr));
            if !up {
                // Not yet: the old servers stay until a new one answers.
                continue;
            }
            for (server, addr) in left {
                let _ = host.disconnect(&subnqn, Some(addr));
                tracing::info!("NSD {nsd}: server {server} ({addr}) no longer listed; path closed");
            }
            if let Some(kept) = self.nsd_service.reached.lock().get_mut(&nsd) {
                kept.servers = now;
            }
        }
        reached_now
            .iter()
            .any(|subnqn| !connected.iter().any(|(n, _)| n == subnqn))
    }
}

/// How long I/O waits while no server of an NSD answers before it fails to the
/// application (`nsdServerWaitTime` of node `me`; the error then says which servers).
fn all_servers_down_wait(state: &ConfigState, me: NodeNumber) -> Duration {
    state
        .params
        .seconds("nsdServerWaitTime", Some(me))
        .max(Duration::from_secs(1))
}

fn connect_path(
    host: &Host,
    addr: SocketAddr,
    subnqn: &str,
    hostnqn: &str,
    wait: Duration,
) -> std::result::Result<(), tessera_nvme::host::HostError> {
    let live = host
        .connections()
        .iter()
        .any(|c| c.subnqn == subnqn && c.addr == addr);
    if live {
        return Ok(());
    }
    let opts = ConnectOptions {
        host_nqn: Some(hostnqn.to_string()),
        // A server that is down keeps being tried: the path comes back with it.
        ctrl_loss_tmo: Duration::from_secs(365 * 24 * 3600),
        fast_io_fail_tmo: Some(wait),
        reconnect_delay: RECONNECT_DELAY,
        keep_alive_tmo: KEEP_ALIVE,
        ..ConnectOptions::new(addr, subnqn)
    };
    host.connect(opts).map(|_| ())
}

/// Whether a vdisk I/O failed because its declustered array closed here (it moved to
/// another server); a data error of the array is the same through any server.
fn array_closed(e: &io::Error) -> bool {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<tessera_vdisk::VdiskError>())
        .is_some_and(|v| matches!(v, tessera_vdisk::VdiskError::Closed { .. }))
}

/// `useNSDserver=asneeded`, and a vdisk on the server its array is open on: the node's
/// own path to the device while it works; after an I/O on it fails, the NSD servers for
/// that I/O and every later one.
struct AsNeeded {
    name: String,
    /// Why the local path is used first, for the log line when it is left.
    why: &'static str,
    /// How long the servers are tried when the local path fails (`nsdServerWaitTime`):
    /// a vdisk's array that leaves this node opens on its next server a moment later.
    wait: Duration,
    /// Which local failures move it to the servers; the others are returned as they are.
    leaves: fn(&io::Error) -> bool,
    local: Arc<dyn BlockDevice>,
    servers: Mutex<Option<Arc<dyn BlockDevice>>>,
    /// Held by the one thread trying `open_servers`.
    opening: Mutex<()>,
    open_servers: Box<dyn Fn() -> io::Result<Arc<dyn BlockDevice>> + Send + Sync>,
}

impl std::fmt::Debug for AsNeeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsNeeded")
            .field("nsd", &self.name)
            .field("through_servers", &self.servers.lock().is_some())
            .finish()
    }
}

impl AsNeeded {
    fn current(&self) -> Option<Arc<dyn BlockDevice>> {
        self.servers.lock().clone()
    }

    /// The servers' device after the local path failed with `e`; `e` if they cannot be
    /// reached either within `wait`. One thread at a time tries to open them and none holds
    /// `servers` meanwhile: every I/O that fails at once waits at most `wait` of its own,
    /// not one `wait` after another.
    fn fail_over(&self, e: io::Error) -> io::Result<Arc<dyn BlockDevice>> {
        if e.kind() == io::ErrorKind::InvalidInput || !(self.leaves)(&e) {
            return Err(e);
        }
        let deadline = Instant::now() + self.wait;
        let mut last: Option<io::Error> = None;
        loop {
            if let Some(s) = self.current() {
                return Ok(s);
            }
            if let Some(_opening) = self.opening.try_lock() {
                if let Some(s) = self.current() {
                    return Ok(s);
                }
                match (self.open_servers)() {
                    Ok(s) => {
                        tracing::warn!(
                            "NSD {}: the local path failed ({e}); using its NSD servers from \
                             now on ({})",
                            self.name,
                            self.why
                        );
                        *self.servers.lock() = Some(Arc::clone(&s));
                        return Ok(s);
                    }
                    Err(s) => last = Some(s),
                }
            }
            if Instant::now() >= deadline {
                let servers = match last {
                    Some(s) => s.to_string(),
                    None => format!(
                        "another I/O was still trying them after nsdServerWaitTime ({:?})",
                        self.wait
                    ),
                };
                return Err(io::Error::new(
                    e.kind(),
                    format!("{e}; and its NSD servers: {servers}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(200).min(self.wait));
        }
    }
}

impl BlockDevice for AsNeeded {
    fn name(&self) -> &str {
        self.local.name()
    }

    fn size_bytes(&self) -> u64 {
        self.local.size_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if let Some(s) = self.current() {
            return s.read_at(buf, offset);
        }
        match self.local.read_at(buf, offset) {
            Ok(()) => Ok(()),
            Err(e) => self.fail_over(e)?.read_at(buf, offset),
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if let Some(s) = self.current() {
            return s.write_at(buf, offset);
        }
        match self.local.write_at(buf, offset) {
            Ok(()) => Ok(()),
            Err(e) => self.fail_over(e)?.write_at(buf, offset),
        }
    }

    fn write_fua(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if let Some(s) = self.current() {
            return s.write_fua(buf, offset);
        }
        match self.local.write_fua(buf, offset) {
            Ok(()) => Ok(()),
            Err(e) => self.fail_over(e)?.write_fua(buf, offset),
        }
    }

    fn flush(&self) -> io::Result<()> {
        if let Some(s) = self.current() {
            return s.flush();
        }
        match self.local.flush() {
            Ok(()) => Ok(()),
            // Writes the local path acknowledged reached the device; its cache is
            // flushed through the server.
            Err(e) => self.fail_over(e)?.flush(),
        }
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if let Some(s) = self.current() {
            return s.discard(offset, len);
        }
        match self.local.discard(offset, len) {
            Ok(()) => Ok(()),
            Err(e) => self.fail_over(e)?.discard(offset, len),
        }
    }

    fn can_discard(&self) -> bool {
        self.local.can_discard()
    }

    fn discard_zeroes(&self) -> bool {
        self.local.discard_zeroes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_drive::{AlignedBuf, FileDrive};
    use tessera_testkit::{Faults, SimDrive};

    /// A 1 MiB drive file in `dir`.
    fn drive_file(dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("d.img");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        path
    }

    /// The drive file at `path` as a local path whose every read fails.
    fn unreadable(path: &std::path::Path) -> Arc<dyn BlockDevice> {
        let bad = Arc::new(Faults::default());
        bad.fail_reads.store(true, Ordering::SeqCst);
        Arc::new(SimDrive::new(
            Arc::new(FileDrive::open_shared(path).unwrap()),
            bad,
        ))
    }

    /// `asneeded`: the local path serves until an I/O on it fails; that I/O and every
    /// later one go through the servers (here a second open of the same drive file, as a
    /// server reaches the same device), and a failure of both says both.
    #[test]
    fn as_needed_moves_to_the_servers_after_a_local_failure_and_stays() {
        let dir = tempfile::tempdir().unwrap();
        let path = drive_file(dir.path());
        let faults = Arc::new(Faults::default());
        let local = Arc::new(SimDrive::new(
            Arc::new(FileDrive::open_shared(&path).unwrap()),
            Arc::clone(&faults),
        ));
        let opened = Arc::new(AtomicBool::new(false));
        let (p, o) = (path.clone(), Arc::clone(&opened));
        let dev = AsNeeded {
            name: "n1".into(),
            why: "useNSDserver=asneeded",
            wait: Duration::ZERO,
            leaves: |_| true,
            local,
            servers: Mutex::new(None),
            opening: Mutex::new(()),
            open_servers: Box::new(move || {
                o.store(true, Ordering::SeqCst);
                Ok(Arc::new(FileDrive::open_shared(&p)?) as Arc<dyn BlockDevice>)
            }),
        };
        let mut data = AlignedBuf::zeroed(4096);
        data.fill(7);
        dev.write_at(&data, 0).unwrap();
        assert!(
            !opened.load(Ordering::SeqCst),
            "servers opened while the local path works"
        );
        faults.fail_writes.store(true, Ordering::SeqCst);
        data.fill(9);
        dev.write_at(&data, 4096).unwrap();
        assert!(opened.load(Ordering::SeqCst));
        dev.flush().unwrap();
        // Reads now go through the servers too, though the local path could still read.
        faults.fail_writes.store(false, Ordering::SeqCst);
        faults.fail_reads.store(true, Ordering::SeqCst);
        let mut back = AlignedBuf::zeroed(8192);
        dev.read_at(&mut back, 0).unwrap();
        assert!(back[..4096].iter().all(|b| *b == 7) && back[4096..].iter().all(|b| *b == 9));

        let failing = AsNeeded {
            name: "n2".into(),
            why: "useNSDserver=asneeded",
            wait: Duration::ZERO,
            leaves: |_| true,
            local: unreadable(&path),
            servers: Mutex::new(None),
            opening: Mutex::new(()),
            open_servers: Box::new(|| Err(io::Error::other("no NSD server answered"))),
        };
        let err = failing.read_at(&mut back, 0).unwrap_err();
        assert!(err.to_string().contains("no NSD server answered"), "{err}");
    }

    /// Every I/O that fails on the local path at once, with the servers down, fails after
    /// about one `nsdServerWaitTime`, not one after another; one thread at a time tries
    /// the servers.
    #[test]
    fn as_needed_ios_failing_at_once_each_wait_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = drive_file(dir.path());
        let trying = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let t = Arc::clone(&trying);
        let wait = Duration::from_secs(1);
        let dev = Arc::new(AsNeeded {
            name: "n3".into(),
            why: "useNSDserver=asneeded",
            wait,
            leaves: |_| true,
            local: unreadable(&path),
            servers: Mutex::new(None),
            opening: Mutex::new(()),
            open_servers: Box::new(move || {
                assert_eq!(t.fetch_add(1, Ordering::SeqCst), 0, "two opens at once");
                std::thread::sleep(Duration::from_millis(50));
                t.fetch_sub(1, Ordering::SeqCst);
                Err(io::Error::other("no NSD server answered"))
            }),
        });
        let ios: Vec<_> = (0..4)
            .map(|_| {
                let dev = Arc::clone(&dev);
                std::thread::spawn(move || {
                    let mut buf = AlignedBuf::zeroed(4096);
                    let started = Instant::now();
                    let err = dev.read_at(&mut buf, 0).unwrap_err();
                    (started.elapsed(), err.to_string())
                })
            })
            .collect();
        for io in ios {
            let (took, err) = io.join().unwrap();
            assert!(took >= wait, "failed after {took:?}, before the wait");
            // The last of four waits one after another would take 4 s.
            assert!(
                took < wait * 5 / 2,
                "failed after {took:?}: the waits queued"
            );
            assert!(err.contains("its NSD servers"), "{err}");
        }
    }

    #[test]
    fn host_nqns_name_node_and_epoch_of_this_cluster_only() {
        let nqn = node_hostnqn("ab12", 3, 17);
        assert_eq!(parse_node_hostnqn(&nqn, "ab12"), Some((3, 17)));
        assert_eq!(parse_node_hostnqn(&nqn, "cd34"), None);
        assert_eq!(parse_node_hostnqn(&format!("{nqn}:9"), "ab12"), None);
        assert_eq!(
            parse_node_hostnqn("nqn.2014-08.org.nvmexpress:uuid:1", "ab12"),
            None
        );
        assert_eq!(
            parse_node_hostnqn(&node_hostnqn("ab12", 3, 0).replace(":0", ":x"), "ab12"),
            None
        );
    }
}
