//! The drive server: ports (listeners), the controller registry, the keep-alive watchdog
//! and the operator API ([`DriveServer`]).
//!
//! Threads: one accept thread per enabled port (polling its listener so that it can be
//! stopped), one reader thread per connection plus that connection's drive I/O workers
//! (see [`super::connection`]), and one keep-alive watchdog.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use tessera_drive::{BlockDevice, FileDrive, VolatileCache};

use super::ana::PortAna;
use super::config::{
    ConfigError, Limits, PortConfig, SubsystemConfig, TargetConfig, ANA_GROUP_MAX,
};
use super::controller::Controller;
use super::namespace::Namespace;
use super::reservation_store::Reservations;
use super::subsystem::Subsystem;
use crate::wire::log::AnaState;

/// How often accept threads and the watchdog look at their stop flags.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Why the server could not start or an operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A namespace's device could not be opened.
    #[error("subsystem {subnqn} namespace {nsid}: {path}: {source}")]
    Device {
        /// Subsystem.
        subnqn: String,
        /// Namespace.
        nsid: u32,
        /// Device path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// A namespace's persisted reservation state cannot be read. Starting without it would
    /// lift the reservations that fence hosts, so the server does not start.
    #[error(
        "subsystem {subnqn} namespace {nsid}: reservation state {path}: {why}; \
         the drive server does not start without it, because the reservations in it may \
         fence hosts. Restore the file from a backup, or remove it to start with no \
         registrations (every host must then register again, and fenced hosts are no \
         longer fenced)"
    )]
    ReservationState {
        /// Subsystem.
        subnqn: String,
        /// Namespace.
        nsid: u32,
        /// The state file (or directory).
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A namespace is smaller than one 4096-byte block.
    #[error("subsystem {subnqn} namespace {nsid}: {path} holds no 4096-byte block")]
    DeviceTooSmall {
        /// Subsystem.
        subnqn: String,
        /// Namespace.
        nsid: u32,
        /// Device path.
        path: PathBuf,
    },
    /// A port could not listen.
    #[error("port {portid}: cannot listen on {addr}: {source}")]
    Bind {
        /// Port.
        portid: u16,
        /// Address.
        addr: SocketAddr,
        /// The error.
        source: io::Error,
    },
    /// No port has this identifier.
    #[error("no port with portid {0}")]
    UnknownPort(u16),
    /// The ANA group identifier is out of range.
    #[error("ANA group {0} invalid: 1..={ANA_GROUP_MAX}")]
    InvalidAnaGroup(u32),
}

/// Opens the device of a namespace; [`DriveServer::start_with`] lets tests substitute
/// devices (for example one that fails with EIO).
pub type DeviceOpener<'a> = &'a dyn Fn(&Path) -> io::Result<Arc<dyn BlockDevice>>;

/// Whether the host of a host NQN may write now: the word of whoever decides that a host
/// is dead (a cluster that expelled a node fences it). A host the gate refuses cannot
/// connect, and its controllers' writes are refused with Reservation Conflict, as a
/// preempted registrant's are. Asked at Connect and by [`DriveServer::refence`].
pub type HostGate = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// Counters of one port.
#[derive(Debug, Default)]
pub(crate) struct PortCounters {
    pub connections: AtomicU64,
    pub commands: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub errors: AtomicU64,
}

/// Statistics snapshot ([`DriveServer::stats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// One entry per port.
    pub ports: Vec<PortStats>,
    /// One entry per exported namespace.
    pub namespaces: Vec<NamespaceStats>,
}

/// Counters of one port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Port identifier.
    pub portid: u16,
    /// Listening address (None while disabled before ever listening).
    pub addr: Option<SocketAddr>,
    /// Whether the port listens.
    pub enabled: bool,
    /// Connections (queues) open now.
    pub connections_open: u64,
    /// Connections accepted since start.
    pub connections_total: u64,
    /// Commands received.
    pub commands: u64,
    /// Bytes sent to hosts (C2HData).
    pub read_bytes: u64,
    /// Bytes received from hosts (in-capsule and H2CData).
    pub write_bytes: u64,
    /// Commands completed with an error status.
    pub errors: u64,
}

/// Counters of one namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceStats {
    /// Subsystem NQN.
    pub subnqn: String,
    /// Namespace identifier.
    pub nsid: u32,
    /// Read commands.
    pub reads: u64,
    /// Write commands.
    pub writes: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Other I/O commands (flush, write zeroes, DSM, reservations).
    pub other: u64,
    /// I/O commands completed with an error.
    pub errors: u64,
    /// Flushes that synced what reached the backing store behind the device (the ring's
    /// writes, deallocations) through the server's own descriptor.
    pub syncs_behind: u64,
}

/// Reads a drive server's counters ([`DriveServer::stats_source`]).
#[derive(Clone)]
pub struct StatsSource(Arc<ServerShared>);

impl StatsSource {
    #[must_use]
    pub fn stats(&self) -> ServerStats {
        snapshot(&self.0)
    }
}

fn snapshot(shared: &ServerShared) -> ServerStats {
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let ports = shared
        .ports
        .iter()
        .map(|p| PortStats {
            portid: p.portid(),
            addr: *p.addr.lock(),
            enabled: p.enabled.load(Ordering::SeqCst),
            connections_open: p.conns.lock().len() as u64,
            connections_total: load(&p.counters.connections),
            commands: load(&p.counters.commands),
            read_bytes: load(&p.counters.read_bytes),
            write_bytes: load(&p.counters.write_bytes),
            errors: load(&p.counters.errors),
        })
        .collect();
    let namespaces = shared
        .subsystems
        .read()
        .values()
        .flat_map(|s| s.namespaces.values().cloned().collect::<Vec<_>>())
        .map(|ns| NamespaceStats {
            subnqn: ns.subnqn.clone(),
            nsid: ns.nsid,
            reads: load(&ns.counters.reads),
            writes: load(&ns.counters.writes),
            read_bytes: load(&ns.counters.read_bytes),
            write_bytes: load(&ns.counters.write_bytes),
            other: load(&ns.counters.other),
            errors: load(&ns.counters.errors),
            syncs_behind: load(&ns.counters.syncs_behind),
        })
        .collect();
    ServerStats { ports, namespaces }
}

/// A running listener.
struct Listener {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

/// One port.
pub(crate) struct Port {
    pub cfg: PortConfig,
    /// The bound address (the configured one, with port 0 resolved).
    pub addr: Mutex<Option<SocketAddr>>,
    pub ana: PortAna,
    pub enabled: AtomicBool,
    listener: Mutex<Option<Listener>>,
    /// Subsystems added while the server runs ([`DriveServer::add_subsystem`]): exported
    /// on every port.
    added: RwLock<BTreeSet<String>>,
    /// Open connections by id, to drop them when the port is disabled.
    pub conns: Mutex<HashMap<u64, TcpStream>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    pub counters: PortCounters,
}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Port({})", self.cfg.portid)
    }
}

impl Port {
    pub fn portid(&self) -> u16 {
        self.cfg.portid
    }

    /// True when this port exports the subsystem `nqn`.
    pub fn exports(&self, nqn: &str) -> bool {
        self.cfg.subsystems.iter().any(|s| s.as_str() == nqn) || self.added.read().contains(nqn)
    }

    fn drop_connections(&self) {
        for stream in self.conns.lock().values() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// State shared by every thread of a server.
pub(crate) struct ServerShared {
    pub limits: Limits,
    pub subsystems: RwLock<BTreeMap<String, Arc<Subsystem>>>,
    pub gate: RwLock<Option<HostGate>>,
    pub discovery: Arc<Subsystem>,
    pub ports: Vec<Arc<Port>>,
    pub controllers: Mutex<BTreeMap<u16, Arc<Controller>>>,
    next_cntlid: Mutex<u16>,
    /// Discovery log generation counter.
    pub genctr: AtomicU64,
    pub stopping: AtomicBool,
    next_conn_id: AtomicU64,
}

/// Controller IDs: 1..=0xFFEF (0xFFF0.. are reserved, 0xFFFF means "dynamic").
const CNTLID_MAX: u16 = 0xffef;

impl ServerShared {
    /// Registers a controller under a fresh controller ID, unique across the server so it
    /// is unique within every subsystem (Linux rejects duplicate CNTLIDs in a subsystem).
    pub fn add_controller(&self, make: impl FnOnce(u16) -> Controller) -> Option<Arc<Controller>> {
        let mut controllers = self.controllers.lock();
        if controllers.len() >= usize::from(CNTLID_MAX) {
            return None;
        }
        let mut next = self.next_cntlid.lock();
        while controllers.contains_key(&*next) {
            *next = if *next >= CNTLID_MAX { 1 } else { *next + 1 };
        }
        let cntlid = *next;
        *next = if cntlid >= CNTLID_MAX { 1 } else { cntlid + 1 };
        let ctrl = Arc::new(make(cntlid));
        controllers.insert(cntlid, Arc::clone(&ctrl));
        Some(ctrl)
    }

    pub fn controller(&self, cntlid: u16) -> Option<Arc<Controller>> {
        self.controllers.lock().get(&cntlid).cloned()
    }

    /// Ends an association: unregisters the controller and closes all its queues.
    pub fn remove_controller(&self, ctrl: &Controller, why: &str) {
        let removed = self.controllers.lock().remove(&ctrl.cntlid).is_some();
        if removed {
            tracing::info!(
                cntlid = ctrl.cntlid,
                subnqn = %ctrl.subsys.nqn,
                hostnqn = %ctrl.hostnqn,
                "controller association ended: {why}"
            );
        }
        ctrl.close_queues();
    }

    /// Whether the host gate refuses `hostnqn` now.
    pub fn fenced(&self, hostnqn: &str) -> bool {
        self.gate.read().as_ref().is_some_and(|gate| !gate(hostnqn))
    }

    pub fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        self.subsystems.read().get(nqn).cloned()
    }

    pub fn next_conn_id(&self) -> u64 {
        self.next_conn_id.fetch_add(1, Ordering::Relaxed)
    }

    fn port(&self, portid: u16) -> Result<&Arc<Port>, ServerError> {
        self.ports
            .iter()
            .find(|p| p.portid() == portid)
            .ok_or(ServerError::UnknownPort(portid))
    }
}

/// A running NVMe/TCP drive server.
pub struct DriveServer {
    shared: Arc<ServerShared>,
    watchdog: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for DriveServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriveServer")
            .field("addrs", &self.local_addrs())
            .finish_non_exhaustive()
    }
}

/// A shared claim: the controllers of one subsystem may run as separate drive servers over
/// the same drives, but no daemon or array may open a drive a drive server exports.
fn open_file_drive(path: &Path) -> io::Result<Arc<dyn BlockDevice>> {
    Ok(Arc::new(FileDrive::open_shared(path)?))
}

impl DriveServer {
    /// Opens every namespace's device, binds every port and starts serving.
    ///
    /// # Errors
    /// [`ServerError`] naming the device or address; nothing listens after an error.
    pub fn start(config: TargetConfig) -> Result<DriveServer, ServerError> {
        Self::start_inner(config, &open_file_drive, true)
    }

    /// As [`DriveServer::start`], opening devices with `open` instead of
    /// `FileDrive::open` (deallocation then falls back to what the device supports).
    ///
    /// # Errors
    /// As [`DriveServer::start`].
    pub fn start_with(
        config: TargetConfig,
        open: DeviceOpener<'_>,
    ) -> Result<DriveServer, ServerError> {
        Self::start_inner(config, open, false)
    }

    fn start_inner(
        config: TargetConfig,
        open: DeviceOpener<'_>,
        own_devices: bool,
    ) -> Result<DriveServer, ServerError> {
        let subsystems = open_subsystems(&config, open, own_devices)?;
        let ports = config
            .ports
            .iter()
            .map(|cfg| {
                Arc::new(Port {
                    cfg: cfg.clone(),
                    addr: Mutex::new(None),
                    ana: PortAna::new(&cfg.ana_groups),
                    enabled: AtomicBool::new(false),
                    listener: Mutex::new(None),
                    added: RwLock::new(BTreeSet::new()),
                    conns: Mutex::new(HashMap::new()),
                    threads: Mutex::new(Vec::new()),
                    counters: PortCounters::default(),
                })
            })
            .collect::<Vec<_>>();
        let shared = Arc::new(ServerShared {
            limits: config.tessera,
            subsystems: RwLock::new(subsystems),
            gate: RwLock::new(None),
            discovery: Arc::new(Subsystem::discovery()),
            ports,
            controllers: Mutex::new(BTreeMap::new()),
            next_cntlid: Mutex::new(1),
            genctr: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            next_conn_id: AtomicU64::new(1),
        });
        // Bind everything first so that a bad address leaves nothing listening.
        let mut bound = Vec::new();
        for port in &shared.ports {
            bound.push(bind(port, configured_addr(&port.cfg))?);
        }
        for (port, listener) in shared.ports.iter().zip(bound) {
            start_listener(&shared, port, listener);
        }
        let watchdog_shared = Arc::clone(&shared);
        let watchdog = std::thread::Builder::new()
            .name("nvmet-keepalive".into())
            .spawn(move || keep_alive_watchdog(&watchdog_shared))
            .map_err(|source| ServerError::Bind {
                portid: 0,
                addr: SocketAddr::from(([0, 0, 0, 0], 0)),
                source,
            })?;
        Ok(DriveServer {
            shared,
            watchdog: Some(watchdog),
        })
    }

    /// The bound address of every port, by portid (with port 0 resolved), in
    /// configuration order. A disabled port keeps its last address.
    #[must_use]
    pub fn local_addrs(&self) -> Vec<(u16, SocketAddr)> {
        self.shared
            .ports
            .iter()
            .filter_map(|p| p.addr.lock().map(|a| (p.portid(), a)))
            .collect()
    }

    /// The bound address of port `portid`.
    #[must_use]
    pub fn local_addr(&self, portid: u16) -> Option<SocketAddr> {
        self.shared.port(portid).ok().and_then(|p| *p.addr.lock())
    }

    /// Disables a port (stops listening and drops every connection on it, like a pulled
    /// cable) or enables it again on the same address.
    ///
    /// # Errors
    /// [`ServerError::UnknownPort`], or [`ServerError::Bind`] when the address cannot be
    /// bound again.
    pub fn set_port_enabled(&self, portid: u16, enabled: bool) -> Result<(), ServerError> {
        let port = self.shared.port(portid)?;
        if enabled {
            if port.enabled.load(Ordering::SeqCst) {
                return Ok(());
            }
            let addr = port
                .addr
                .lock()
                .unwrap_or_else(|| configured_addr(&port.cfg));
            let listener = bind(port, addr)?;
            start_listener(&self.shared, port, listener);
        } else {
            stop_listener(port);
            port.drop_connections();
        }
        self.shared.genctr.fetch_add(1, Ordering::SeqCst);
        tracing::info!(portid, enabled, "port state changed");
        Ok(())
    }

    /// Sets the ANA state of group `grpid` on port `portid` and notifies the controllers
    /// on that port that asked for ANA change events.
    ///
    /// # Errors
    /// [`ServerError::UnknownPort`] or [`ServerError::InvalidAnaGroup`].
    pub fn set_ana_state(
        &self,
        portid: u16,
        grpid: u32,
        state: AnaState,
    ) -> Result<(), ServerError> {
        if !(1..=ANA_GROUP_MAX).contains(&grpid) {
            return Err(ServerError::InvalidAnaGroup(grpid));
        }
        let port = self.shared.port(portid)?;
        if !port.ana.set(grpid, state) {
            return Ok(());
        }
        tracing::info!(portid, grpid, ?state, "ANA state changed");
        let controllers: Vec<_> = self.shared.controllers.lock().values().cloned().collect();
        for ctrl in controllers.iter().filter(|c| c.port.portid() == portid) {
            ctrl.notify_ana_change();
        }
        Ok(())
    }

    /// Exports one more subsystem on every port while the server runs (an NSD server
    /// that starts serving a new NSD). Its namespaces are opened with `open`; reservation
    /// state is not persisted for subsystems added this way.
    ///
    /// # Errors
    /// [`ServerError::Config`] when the NQN is exported already, the device errors of
    /// [`DriveServer::start`] otherwise; nothing changes after an error.
    pub fn add_subsystem(
        &self,
        cfg: &SubsystemConfig,
        open: DeviceOpener<'_>,
    ) -> Result<(), ServerError> {
        let nqn = cfg.nqn.to_string();
        if self.shared.subsystem(&nqn).is_some() {
            return Err(ServerError::Config(ConfigError::Invalid {
                path: format!("subsystem {nqn}"),
                message: "is exported already; remove it first".into(),
            }));
        }
        let subsystem = Arc::new(open_subsystem(cfg, None, open, false)?);
        self.shared
            .subsystems
            .write()
            .insert(nqn.clone(), subsystem);
        for port in &self.shared.ports {
            port.added.write().insert(nqn.clone());
        }
        self.shared.genctr.fetch_add(1, Ordering::SeqCst);
        tracing::info!(subnqn = %nqn, "subsystem added");
        Ok(())
    }

    /// Shows every drive read and write the namespaces of subsystem `nqn` do for hosts to
    /// `observer` (the first one given stays). False if the subsystem is not exported.
    pub fn observe_io(&self, nqn: &str, observer: Arc<dyn super::IoObserver>) -> bool {
        let Some(subsystem) = self.shared.subsystem(nqn) else {
            return false;
        };
        for ns in subsystem.namespaces.values() {
            let _ = ns.observer.set(Arc::clone(&observer));
        }
        true
    }

    /// Stops exporting a subsystem: its controllers' associations end (their hosts fail
    /// over to other paths) and its namespaces are flushed. False if it was not exported.
    pub fn remove_subsystem(&self, nqn: &str) -> bool {
        let Some(subsystem) = self.shared.subsystems.write().remove(nqn) else {
            return false;
        };
        for port in &self.shared.ports {
            port.added.write().remove(nqn);
        }
        self.shared.genctr.fetch_add(1, Ordering::SeqCst);
        let controllers: Vec<Arc<Controller>> = self
            .shared
            .controllers
            .lock()
            .values()
            .filter(|c| Arc::ptr_eq(&c.subsys, &subsystem))
            .cloned()
            .collect();
        for ctrl in controllers {
            self.shared
                .remove_controller(&ctrl, "its subsystem is no longer exported");
        }
        for ns in subsystem.namespaces.values() {
            if let Err(e) = ns.flush() {
                tracing::warn!(nsid = ns.nsid, subnqn = %nqn, "flush at removal: {e}");
            }
        }
        tracing::info!(subnqn = %nqn, "subsystem removed");
        true
    }

    /// The NQNs of the subsystems exported now.
    #[must_use]
    pub fn subsystem_nqns(&self) -> Vec<String> {
        self.shared.subsystems.read().keys().cloned().collect()
    }

    /// Puts `gate` in charge of which hosts may connect and write, and applies it to the
    /// controllers that exist (see [`HostGate`]).
    pub fn set_host_gate(&self, gate: HostGate) {
        *self.shared.gate.write() = Some(gate);
        self.refence();
    }

    /// Asks the host gate again about every controller (the gate's answers changed: a
    /// node was expelled or came back as a new incarnation). A controller whose host is
    /// now refused has its writes refused from here on; one that is admitted again is
    /// not (a new incarnation connects with a new host NQN, so that happens only when
    /// the gate itself was wrong).
    pub fn refence(&self) {
        let controllers: Vec<Arc<Controller>> =
            self.shared.controllers.lock().values().cloned().collect();
        for ctrl in controllers {
            let fenced = self.shared.fenced(&ctrl.hostnqn);
            if ctrl.fenced.swap(fenced, Ordering::SeqCst) != fenced {
                tracing::warn!(
                    cntlid = ctrl.cntlid,
                    hostnqn = %ctrl.hostnqn,
                    subnqn = %ctrl.subsys.nqn,
                    "host {}",
                    if fenced { "fenced: its writes are refused from now on" } else { "no longer fenced" }
                );
            }
        }
    }

    /// A snapshot of the per-port and per-namespace counters.
    #[must_use]
    pub fn stats(&self) -> ServerStats {
        snapshot(&self.shared)
    }

    /// A handle that reads the counters for as long as it is kept, also from another
    /// thread (a metrics exporter) and after the server stopped.
    #[must_use]
    pub fn stats_source(&self) -> StatsSource {
        StatsSource(Arc::clone(&self.shared))
    }

    /// Stops listening, closes every connection, waits for every thread and flushes every
    /// namespace.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if self.shared.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        for port in &self.shared.ports {
            stop_listener(port);
            port.drop_connections();
        }
        for port in &self.shared.ports {
            let threads = std::mem::take(&mut *port.threads.lock());
            for t in threads {
                let _ = t.join();
            }
        }
        if let Some(w) = self.watchdog.take() {
            let _ = w.join();
        }
        let namespaces: Vec<Arc<Namespace>> = self
            .shared
            .subsystems
            .read()
            .values()
            .flat_map(|s| s.namespaces.values().cloned())
            .collect();
        for ns in namespaces {
            if let Err(e) = ns.flush() {
                tracing::warn!(nsid = ns.nsid, subnqn = %ns.subnqn, "flush at shutdown: {e}");
            }
        }
    }
}

impl Drop for DriveServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn open_subsystems(
    config: &TargetConfig,
    open: DeviceOpener<'_>,
    own_devices: bool,
) -> Result<BTreeMap<String, Arc<Subsystem>>, ServerError> {
    let mut out = BTreeMap::new();
    for s in &config.subsystems {
        let subsystem = open_subsystem(s, config.state_dir.as_deref(), open, own_devices)?;
        out.insert(s.nqn.to_string(), Arc::new(subsystem));
    }
    if let Some(dir) = &config.state_dir {
        let claimed: Vec<[u8; 16]> = config
            .subsystems
            .iter()
            .flat_map(|s| s.namespaces.iter().filter(|n| n.enable).map(|n| n.nguid))
            .collect();
        for orphan in Reservations::orphans(dir, &claimed) {
            tracing::warn!(
                file = %orphan.display(),
                "reservation state of no configured namespace (was its NSID, subsystem or \
                 NGUID changed?); its registrations are not in force"
            );
        }
    }
    Ok(out)
}

fn open_subsystem(
    s: &SubsystemConfig,
    state_dir: Option<&Path>,
    open: DeviceOpener<'_>,
    own_devices: bool,
) -> Result<Subsystem, ServerError> {
    let mut namespaces = BTreeMap::new();
    for ns in &s.namespaces {
        let err = |source| ServerError::Device {
            subnqn: s.nqn.to_string(),
            nsid: ns.nsid,
            path: ns.path.clone(),
            source,
        };
        if !ns.enable {
            // Disabled namespaces are not opened, but a typo should still be caught.
            std::fs::metadata(&ns.path).map_err(err)?;
            continue;
        }
        let dev = open(&ns.path).map_err(err)?;
        if dev.size_bytes() < super::namespace::LBA_BYTES {
            return Err(ServerError::DeviceTooSmall {
                subnqn: s.nqn.to_string(),
                nsid: ns.nsid,
                path: ns.path.clone(),
            });
        }
        let (dev, aux) = match ns.volatile_write_cache {
            // Every byte must go through the cache: no second descriptor for io_uring
            // or fallocate that would reach the backing store behind its back.
            Some(cache) => {
                let dev: Arc<dyn BlockDevice> = Arc::new(VolatileCache::new(dev, cache));
                (dev, None)
            }
            None => (dev, own_devices.then_some(ns.path.as_path())),
        };
        let reservations = match state_dir {
            Some(dir) => Reservations::persistent(dir, ns.nguid).map_err(|(path, why)| {
                ServerError::ReservationState {
                    subnqn: s.nqn.to_string(),
                    nsid: ns.nsid,
                    path,
                    why,
                }
            })?,
            None => Reservations::volatile(ns.nguid),
        };
        let namespace = Namespace::new(ns, s.nqn.as_str(), dev, aux, reservations);
        namespaces.insert(ns.nsid, Arc::new(namespace));
    }
    Ok(Subsystem::new(s, namespaces))
}

fn configured_addr(cfg: &PortConfig) -> SocketAddr {
    SocketAddr::new(cfg.addr.traddr, cfg.addr.trsvcid)
}

fn bind(port: &Port, addr: SocketAddr) -> Result<TcpListener, ServerError> {
    let err = |source| ServerError::Bind {
        portid: port.portid(),
        addr,
        source,
    };
    let listener = TcpListener::bind(addr).map_err(err)?;
    listener.set_nonblocking(true).map_err(err)?;
    let local = listener.local_addr().map_err(err)?;
    *port.addr.lock() = Some(local);
    Ok(listener)
}

fn start_listener(shared: &Arc<ServerShared>, port: &Arc<Port>, listener: TcpListener) {
    let stop = Arc::new(AtomicBool::new(false));
    let (s, p, st) = (Arc::clone(shared), Arc::clone(port), Arc::clone(&stop));
    let name = format!("nvmet-port-{}", port.portid());
    let thread = std::thread::Builder::new()
        .name(name)
        .spawn(move || accept_loop(&s, &p, &listener, &st));
    match thread {
        Ok(thread) => {
            port.enabled.store(true, Ordering::SeqCst);
            *port.listener.lock() = Some(Listener { stop, thread });
        }
        Err(e) => tracing::error!(portid = port.portid(), "cannot start listener thread: {e}"),
    }
}

fn stop_listener(port: &Port) {
    port.enabled.store(false, Ordering::SeqCst);
    let listener = port.listener.lock().take();
    if let Some(l) = listener {
        l.stop.store(true, Ordering::SeqCst);
        let _ = l.thread.join();
    }
}

/// Waits up to one poll interval for `listener` to become readable.
fn wait_readable(listener: &TcpListener) {
    let mut pfd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout_ms = POLL_INTERVAL.as_millis() as libc::c_int;
    // SAFETY: `pfd` is a valid pollfd for the duration of the call and nfds is 1.
    unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
}

fn accept_loop(
    shared: &Arc<ServerShared>,
    port: &Arc<Port>,
    listener: &TcpListener,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::SeqCst) && !shared.stopping.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, peer)) => admit(shared, port, stream, peer),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_readable(listener),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(portid = port.portid(), "accept: {e}");
                std::thread::sleep(POLL_INTERVAL);
            }
        }
    }
}

/// Starts serving an accepted connection, unless the port is full.
fn admit(shared: &Arc<ServerShared>, port: &Arc<Port>, stream: TcpStream, peer: SocketAddr) {
    let max = shared.limits.max_connections_per_port as usize;
    let open = port.conns.lock().len();
    if open >= max {
        tracing::warn!(portid = port.portid(), %peer, "refusing connection: {open} open, limit {max}");
        return;
    }
    let setup = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_nodelay(true))
        .and_then(|()| stream.try_clone());
    let clone = match setup {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(portid = port.portid(), %peer, "connection setup: {e}");
            return;
        }
    };
    let id = shared.next_conn_id();
    port.conns.lock().insert(id, clone);
    port.counters.connections.fetch_add(1, Ordering::Relaxed);
    let (s, p) = (Arc::clone(shared), Arc::clone(port));
    let spawned = std::thread::Builder::new()
        .name(format!("nvmet-conn-{id}"))
        .spawn(move || {
            super::connection::serve(&s, &p, stream, id, peer);
            p.conns.lock().remove(&id);
        });
    let mut threads = port.threads.lock();
    threads.retain(|t| !t.is_finished());
    match spawned {
        Ok(t) => threads.push(t),
        Err(e) => {
            port.conns.lock().remove(&id);
            tracing::warn!(portid = port.portid(), %peer, "cannot start connection thread: {e}");
        }
    }
}

/// Ends associations whose keep-alive timer expired (NVMe Base 2.0, 3.9.4): no command
/// on any of the controller's queues for KATO.
fn keep_alive_watchdog(shared: &ServerShared) {
    while !shared.stopping.load(Ordering::SeqCst) {
        std::thread::sleep(POLL_INTERVAL);
        let now = Instant::now();
        let expired: Vec<_> = shared
            .controllers
            .lock()
            .values()
            .filter(|c| c.keep_alive_expired(now))
            .cloned()
            .collect();
        for ctrl in expired {
            tracing::warn!(
                cntlid = ctrl.cntlid,
                hostnqn = %ctrl.hostnqn,
                kato_ms = ctrl.kato_ms(),
                "keep-alive timeout expired; tearing down the association"
            );
            shared.remove_controller(&ctrl, "keep-alive timeout");
        }
    }
}
