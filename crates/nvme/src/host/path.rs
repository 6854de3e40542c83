//! One path: a controller of a subsystem reached at one address, with its life cycle.
//!
//! A path is live while its association is; when the association dies (any queue lost,
//! keep alive failed, a command timed out) the path's monitor thread marks it connecting,
//! reconnects every `reconnect_delay` and, after `ctrl_loss_tmo` without success, removes
//! the path from the host (Linux `nvme_tcp_reconnect_or_remove`). While live, the monitor
//! re-reads the ANA log when the controller sends an ANA change notice (an Asynchronous
//! Event, within a monitor tick) and, for controllers that send none, once a second.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

use super::controller::{Controller, NamespaceData};
use super::error::HostError;
use super::policy::{reconnect_expired, AnaPathState};
use super::stats::PathCounters;
use super::{ConnectOptions, HostShared, PathState};

/// How often the monitor checks its association.
const MONITOR_TICK: Duration = Duration::from_millis(20);
/// How often a live path re-reads its ANA log.
const ANA_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Wakes every thread waiting for a path to change (queued I/O).
#[derive(Debug, Default)]
pub(crate) struct Notifier {
    generation: Mutex<u64>,
    cv: Condvar,
}

impl Notifier {
    pub(crate) fn notify(&self) {
        *self.generation.lock() += 1;
        self.cv.notify_all();
    }

    /// Waits for a notification or `timeout`.
    pub(crate) fn wait(&self, timeout: Duration) {
        let mut generation = self.generation.lock();
        let seen = *generation;
        let deadline = Instant::now() + timeout;
        while *generation == seen {
            if self.cv.wait_until(&mut generation, deadline).timed_out() {
                return;
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Life {
    Live,
    Connecting { since: Instant },
    Deleting,
}

/// One controller association used as a path.
pub(crate) struct Path {
    pub(crate) id: u64,
    pub(crate) name: String,
    pub(crate) opts: ConnectOptions,
    pub(crate) hostnqn: String,
    pub(crate) hostid: [u8; 16],
    pub(crate) counters: PathCounters,
    cntlid: AtomicU32,
    ctrl: RwLock<Option<Arc<Controller>>>,
    life: Mutex<Life>,
    namespaces: RwLock<HashMap<u32, NamespaceData>>,
    ana: RwLock<Option<HashMap<u32, AnaPathState>>>,
    notifier: Arc<Notifier>,
    stop: Mutex<bool>,
    stop_cv: Condvar,
    monitor: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Path")
            .field("name", &self.name)
            .field("addr", &self.opts.addr)
            .finish_non_exhaustive()
    }
}

/// What a path brings when it connects: its controller and namespaces.
pub(crate) struct Connected {
    pub(crate) ctrl: Arc<Controller>,
    pub(crate) namespaces: HashMap<u32, NamespaceData>,
    pub(crate) ana: Option<HashMap<u32, AnaPathState>>,
}

/// Connects a controller and reads what multipath needs from it.
pub(crate) fn connect_controller(
    opts: &ConnectOptions,
    hostnqn: &str,
    hostid: [u8; 16],
) -> Result<Connected, HostError> {
    let ctrl = Arc::new(Controller::connect(
        opts.addr,
        &opts.subnqn,
        hostnqn,
        hostid,
        &opts.controller_options(),
    )?);
    let mut namespaces = HashMap::new();
    for nsid in ctrl.active_namespaces()? {
        let data = ctrl.identify_namespace(nsid)?;
        if data.nsze > 0 {
            namespaces.insert(nsid, data);
        }
    }
    let ana = read_ana(&ctrl)?;
    Ok(Connected {
        ctrl,
        namespaces,
        ana,
    })
}

fn read_ana(ctrl: &Controller) -> Result<Option<HashMap<u32, AnaPathState>>, HostError> {
    if !ctrl.ana_reporting() {
        return Ok(None);
    }
    let log = ctrl.ana_log()?;
    let states = log
        .groups
        .iter()
        .map(|g| (g.anagrpid, AnaPathState::from_wire(g.state)))
        .collect();
    Ok(Some(states))
}

impl Path {
    pub(crate) fn new(
        id: u64,
        name: String,
        opts: ConnectOptions,
        identity: (String, [u8; 16]),
        connected: Connected,
        notifier: Arc<Notifier>,
    ) -> Path {
        Path {
            id,
            name,
            opts,
            hostnqn: identity.0,
            hostid: identity.1,
            counters: PathCounters::default(),
            cntlid: AtomicU32::new(u32::from(connected.ctrl.cntlid())),
            ctrl: RwLock::new(Some(connected.ctrl)),
            life: Mutex::new(Life::Live),
            namespaces: RwLock::new(connected.namespaces),
            ana: RwLock::new(connected.ana),
            notifier,
            stop: Mutex::new(false),
            stop_cv: Condvar::new(),
            monitor: Mutex::new(None),
        }
    }

    /// The controller, when the path is live.
    pub(crate) fn controller(&self) -> Option<Arc<Controller>> {
        let ctrl = self.ctrl.read();
        match ctrl.as_ref() {
            Some(c) if !c.is_dead() => Some(Arc::clone(c)),
            _ => None,
        }
    }

    pub(crate) fn cntlid(&self) -> u16 {
        self.cntlid.load(Ordering::Relaxed) as u16
    }

    /// The ANA state of namespace `nsid` through this path; a controller that does not
    /// report ANA is optimized for every namespace.
    pub(crate) fn ana_state(&self, nsid: u32) -> AnaPathState {
        let ana = self.ana.read();
        let Some(states) = ana.as_ref() else {
            return AnaPathState::Optimized;
        };
        let group = self.namespaces.read().get(&nsid).map_or(0, |d| d.anagrpid);
        states
            .get(&group)
            .copied()
            .unwrap_or(AnaPathState::Inaccessible)
    }

    pub(crate) fn state(&self) -> (PathState, Option<Instant>) {
        match *self.life.lock() {
            Life::Live if self.controller().is_some() => (PathState::Live, None),
            Life::Live => (PathState::Connecting, Some(Instant::now())),
            Life::Connecting { since } => (PathState::Connecting, Some(since)),
            Life::Deleting => (PathState::Deleting, None),
        }
    }

    /// Re-reads the ANA log (after an ANA status, or periodically).
    pub(crate) fn refresh_ana(&self, ctrl: &Controller) {
        match read_ana(ctrl) {
            Ok(states) => {
                let changed = *self.ana.read() != states;
                if changed {
                    tracing::info!(path = %self.name, addr = %self.opts.addr, "ANA states now {states:?}");
                    *self.ana.write() = states;
                    self.notifier.notify();
                }
            }
            Err(e) => tracing::warn!(path = %self.name, "reading the ANA log failed: {e}"),
        }
    }

    pub(crate) fn start_monitor(self: &Arc<Self>, host: Weak<HostShared>) -> Result<(), HostError> {
        let path = Arc::clone(self);
        let handle = std::thread::Builder::new()
            .name(format!("nvme-mon-{}", self.name))
            .spawn(move || path.monitor_loop(&host))
            .map_err(|e| HostError::Io {
                context: "spawning the path monitor thread".into(),
                source: e,
            })?;
        *self.monitor.lock() = Some(handle);
        Ok(())
    }

    /// Stops the monitor and disconnects the controller cleanly (explicit disconnect).
    pub(crate) fn shutdown(&self) {
        *self.life.lock() = Life::Deleting;
        *self.stop.lock() = true;
        self.stop_cv.notify_all();
        if let Some(handle) = self.monitor.lock().take() {
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
        let ctrl = self.ctrl.write().take();
        if let Some(ctrl) = ctrl {
            ctrl.disconnect();
        }
        self.notifier.notify();
    }

    /// Sleeps `timeout` unless stopped; true when stopped.
    fn wait_stop(&self, timeout: Duration) -> bool {
        let mut stopped = self.stop.lock();
        if !*stopped {
            self.stop_cv.wait_for(&mut stopped, timeout);
        }
        *stopped
    }

    fn monitor_loop(self: Arc<Self>, host: &Weak<HostShared>) {
        let mut last_ana = Instant::now();
        while !self.wait_stop(MONITOR_TICK) {
            if let Some(ctrl) = self.controller() {
                let event = ctrl.take_ana_event();
                if (event || last_ana.elapsed() >= ANA_POLL_INTERVAL) && ctrl.ana_reporting() {
                    self.refresh_ana(&ctrl);
                    last_ana = Instant::now();
                }
                continue;
            }
            let lost_since = Instant::now();
            let old = self.ctrl.write().take();
            let reason = old.as_ref().and_then(|c| c.death_reason());
            drop(old);
            *self.life.lock() = Life::Connecting { since: lost_since };
            self.notifier.notify();
            tracing::warn!(
                path = %self.name, addr = %self.opts.addr, subnqn = %self.opts.subnqn,
                "path lost ({}); reconnecting every {:?} for up to ctrl_loss_tmo {:?}",
                reason.as_deref().unwrap_or("controller gone"),
                self.opts.reconnect_delay, self.opts.ctrl_loss_tmo
            );
            if !self.reconnect_loop(lost_since) {
                if !*self.stop.lock() {
                    tracing::error!(
                        path = %self.name, addr = %self.opts.addr, subnqn = %self.opts.subnqn,
                        "no reconnection within ctrl_loss_tmo {:?}; removing the path",
                        self.opts.ctrl_loss_tmo
                    );
                    *self.life.lock() = Life::Deleting;
                    if let Some(host) = host.upgrade() {
                        host.remove_expired_path(self.id);
                    }
                    self.notifier.notify();
                }
                return;
            }
            last_ana = Instant::now();
        }
    }

    /// Reconnects until success (true), expiry or stop (false).
    fn reconnect_loop(&self, lost_since: Instant) -> bool {
        loop {
            match self.reconnect() {
                Ok(()) => {
                    tracing::info!(path = %self.name, addr = %self.opts.addr,
                        "path reconnected after {:?}", lost_since.elapsed());
                    return true;
                }
                Err(e) => tracing::debug!(path = %self.name, "reconnect failed: {e}"),
            }
            if reconnect_expired(lost_since, self.opts.ctrl_loss_tmo, Instant::now()) {
                return false;
            }
            let remaining = self.opts.ctrl_loss_tmo.saturating_sub(lost_since.elapsed());
            if self.wait_stop(self.opts.reconnect_delay.min(remaining)) {
                return false;
            }
        }
    }

    /// One reconnection attempt: a new association whose namespaces must be the ones this
    /// path served (same identifiers), so a different drive behind the same address is
    /// never written to.
    fn reconnect(&self) -> Result<(), HostError> {
        let connected = connect_controller(&self.opts, &self.hostnqn, self.hostid)?;
        for (nsid, old) in self.namespaces.read().iter() {
            let same = connected
                .namespaces
                .get(nsid)
                .is_some_and(|new| new.same_namespace(old) && new.lba_bytes == old.lba_bytes);
            if !same {
                connected.ctrl.disconnect();
                return Err(HostError::Invalid(format!(
                    "{}: namespace {nsid} changed identity or disappeared; not reusing the path",
                    self.opts.addr
                )));
            }
        }
        if *self.stop.lock() {
            connected.ctrl.disconnect();
            return Err(HostError::Invalid("path is being deleted".into()));
        }
        {
            let mut namespaces = self.namespaces.write();
            for (nsid, data) in connected.namespaces {
                if let Some(slot) = namespaces.get_mut(&nsid) {
                    *slot = data;
                }
            }
        }
        *self.ana.write() = connected.ana;
        self.cntlid
            .store(u32::from(connected.ctrl.cntlid()), Ordering::Relaxed);
        *self.ctrl.write() = Some(connected.ctrl);
        *self.life.lock() = Life::Live;
        self.notifier.notify();
        Ok(())
    }
}
