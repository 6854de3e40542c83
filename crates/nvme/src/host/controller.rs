//! One association with a controller: the admin queue plus N I/O queues, brought up the
//! way NVMe-oF 1.1 (3.5, 7.3) and Linux `nvme_tcp_setup_ctrl` do it: Connect the admin queue,
//! read CAP and VS, set CC.EN and wait for CSTS.RDY, Identify the controller, negotiate the
//! Number of Queues, Connect each I/O queue with the admin's controller ID, and keep the
//! association alive with Keep Alive every KATO/2.
//!
//! Any queue that dies kills the whole association (Linux does the same: error recovery
//! resets the controller); the multipath layer then reconnects it from scratch.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::error::HostError;
use super::policy::max_transfer_bytes;
use super::queue::{Queue, QueueConfig, Xfer, ADMIN_IN_CAPSULE_BYTES};
use crate::wire::command::{
    cns, fid, AdminCommand, Feature, GetLogPage, Identify, IoCommand, SetFeatures,
};
use crate::wire::fabrics::{
    property, Cap, Cc, Csts, FabricsCommand, PropertyGet, PropertySet, PropertySize, CNTLID_DYNAMIC,
};
use crate::wire::identify::{
    cmic, decode_nsid_list, IdentifyController, IdentifyNamespace, NsIdDescriptor, IDENTIFY_BYTES,
    NSID_LIST_MAX,
};
use crate::wire::log::{lid, AnaLog, DiscoveryEntry, DiscoveryLog, DISCOVERY_RECORD_BYTES};
use crate::wire::{Cqe, Nqn, Sqe};

/// Admin queue entries (Linux `NVME_AQ_DEPTH`).
const ADMIN_QUEUE_ENTRIES: u16 = 32;
/// Default number of I/O queues: one per CPU, at most this many.
const DEFAULT_IO_QUEUES_MAX: usize = 4;
/// How long a normal shutdown (CC.SHN) may take before the host closes anyway.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);
/// Largest ANA log the host reads (bounds what NN and NANAGRPID can make it allocate).
const ANA_LOG_MAX_BYTES: u64 = 1 << 20;
/// Most Discovery log entries read; more would be a misbehaving discovery controller.
const DISCOVERY_ENTRIES_MAX: u64 = 1024;
/// Attempts at a consistent Discovery log before giving up (GENCTR kept changing).
const DISCOVERY_READ_ATTEMPTS: usize = 8;

/// How a controller picks the I/O queue for a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QueuePolicy {
    /// Rotate over the I/O queues.
    #[default]
    RoundRobin,
    /// The queue of the current CPU (`sched_getcpu() % queues`), as Linux maps blk-mq
    /// hardware contexts.
    Cpu,
}

/// Options of one association.
#[derive(Debug, Clone)]
pub struct ControllerOptions {
    /// I/O queue entries (nvme-cli `-Q`); capped by CAP.MQES.
    pub queue_size: u16,
    /// I/O queues wanted; default min(CPUs, 4). The controller may grant fewer.
    pub nr_io_queues: Option<u16>,
    /// Keep Alive Timeout; Keep Alive is sent every half of it. Zero disables.
    pub keep_alive_tmo: Duration,
    /// Request header digests.
    pub header_digest: bool,
    /// Request data digests.
    pub data_digest: bool,
    /// Per-command timeout (Linux `io_timeout`, 30 s).
    pub command_timeout: Duration,
    /// TCP connect and handshake timeout.
    pub connect_timeout: Duration,
    /// I/O queue selection.
    pub queue_policy: QueuePolicy,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            queue_size: 128,
            nr_io_queues: None,
            keep_alive_tmo: Duration::from_secs(5),
            header_digest: false,
            data_digest: false,
            command_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            queue_policy: QueuePolicy::RoundRobin,
        }
    }
}

/// What the host learned about one namespace through one controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceData {
    /// Namespace ID.
    pub nsid: u32,
    /// Size in logical blocks (NSZE).
    pub nsze: u64,
    /// Logical block size in bytes (512 or 4096).
    pub lba_bytes: u32,
    /// Usable size in bytes: NSZE blocks rounded down to whole 4 KiB sectors.
    pub size_bytes: u64,
    /// NGUID (zero when the controller reports none).
    pub nguid: [u8; 16],
    /// EUI-64 (zero when none).
    pub eui64: [u8; 8],
    /// UUID from the Namespace Identification Descriptors, when reported.
    pub uuid: Option<[u8; 16]>,
    /// ANA group (0 when ANA is not reported).
    pub anagrpid: u32,
    /// Reservation capabilities (RESCAP).
    pub rescap: u8,
    /// Deallocated blocks read back as zeros (DLFEAT bits 2:0 = 001b).
    pub deallocate_zeroes: bool,
}

impl NamespaceData {
    /// Whether two controllers report the same namespace: equal non-zero identifiers
    /// (NGUID, else EUI-64, else UUID); with no identifier at all, nothing contradicts.
    #[must_use]
    pub fn same_namespace(&self, other: &NamespaceData) -> bool {
        if self.nguid != [0; 16] || other.nguid != [0; 16] {
            return self.nguid == other.nguid;
        }
        if self.eui64 != [0; 8] || other.eui64 != [0; 8] {
            return self.eui64 == other.eui64;
        }
        match (self.uuid, other.uuid) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        }
    }
}

/// Shared between the queues of one association: the first queue to die kills the rest.
struct Health {
    dead: AtomicBool,
    queues: Mutex<Vec<Weak<Queue>>>,
}

impl Health {
    fn fail(&self, reason: &str) {
        self.dead.store(true, Ordering::SeqCst);
        let queues = self.queues.lock().clone();
        for q in queues.iter().filter_map(Weak::upgrade) {
            q.kill(reason);
        }
    }

    fn watch(self: &Arc<Self>, queue: &Arc<Queue>) {
        self.queues.lock().push(Arc::downgrade(queue));
        let health = Arc::downgrade(self);
        let weak_queue = Arc::downgrade(queue);
        queue.set_on_death(Box::new(move || {
            let reason = weak_queue
                .upgrade()
                .and_then(|q| q.death_reason())
                .unwrap_or_else(|| "queue lost".to_owned());
            if let Some(h) = health.upgrade() {
                h.fail(&format!(
                    "another queue of the association failed: {reason}"
                ));
            }
        }));
    }
}

struct Stop {
    stopped: Mutex<bool>,
    cv: Condvar,
}

/// One connected controller (association).
pub struct Controller {
    addr: SocketAddr,
    subnqn: Nqn,
    cntlid: u16,
    cap: Cap,
    vs: u32,
    id: IdentifyController,
    admin: Arc<Queue>,
    io: Vec<Arc<Queue>>,
    io_queue_entries: u16,
    policy: QueuePolicy,
    next: AtomicUsize,
    health: Arc<Health>,
    stop: Arc<Stop>,
    keepalive: Mutex<Option<JoinHandle<()>>>,
    /// Set when the controller sent an ANA change notice; the path re-reads the ANA log.
    ana_event: Arc<AtomicBool>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("addr", &self.addr)
            .field("subnqn", &self.subnqn)
            .field("cntlid", &self.cntlid)
            .field("io_queues", &self.io.len())
            .finish_non_exhaustive()
    }
}

impl Controller {
    /// Connects, enables and identifies a controller of `subnqn` at `addr`, and opens its
    /// I/O queues (none for a discovery controller).
    ///
    /// # Errors
    /// Any [`HostError`]; nothing stays connected on error.
    pub fn connect(
        addr: SocketAddr,
        subnqn: &str,
        hostnqn: &str,
        hostid: [u8; 16],
        opts: &ControllerOptions,
    ) -> Result<Controller, HostError> {
        let subnqn = parse_nqn(subnqn, "subsystem NQN")?;
        let hostnqn = parse_nqn(hostnqn, "host NQN")?;
        let discovery = subnqn.is_discovery();
        let kato_ms = if discovery {
            0
        } else {
            u32::try_from(opts.keep_alive_tmo.as_millis()).unwrap_or(u32::MAX)
        };
        let admin_cfg = QueueConfig {
            addr,
            qid: 0,
            entries: ADMIN_QUEUE_ENTRIES,
            kato_ms,
            cntlid: CNTLID_DYNAMIC,
            subnqn,
            hostnqn,
            hostid,
            header_digest: opts.header_digest,
            data_digest: opts.data_digest,
            in_capsule_bytes: ADMIN_IN_CAPSULE_BYTES,
            command_timeout: opts.command_timeout,
            connect_timeout: opts.connect_timeout,
        };
        let (admin, cntlid) = Queue::connect(&admin_cfg)?;
        let health = Arc::new(Health {
            dead: AtomicBool::new(false),
            queues: Mutex::new(Vec::new()),
        });
        health.watch(&admin);
        let result = bring_up(&admin, &admin_cfg, cntlid, discovery, opts, &health);
        let (cap, vs, id, io) = match result {
            Ok(parts) => parts,
            Err(e) => {
                health.fail("association setup failed");
                admin.close();
                return Err(e);
            }
        };
        let io_queue_entries = io_entries(opts.queue_size, &cap);
        let ctrl = Controller {
            addr,
            subnqn: admin_cfg.subnqn,
            cntlid,
            cap,
            vs,
            id,
            admin,
            io,
            io_queue_entries,
            policy: opts.queue_policy,
            next: AtomicUsize::new(0),
            health,
            stop: Arc::new(Stop {
                stopped: Mutex::new(false),
                cv: Condvar::new(),
            }),
            keepalive: Mutex::new(None),
            ana_event: Arc::new(AtomicBool::new(false)),
        };
        if kato_ms > 0 {
            ctrl.start_keepalive(Duration::from_millis(u64::from(kato_ms)))?;
        }
        if !discovery {
            ctrl.start_ana_events();
        }
        Ok(ctrl)
    }

    /// Controller address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Subsystem NQN the host connected to.
    #[must_use]
    pub fn subnqn(&self) -> &str {
        self.subnqn.as_str()
    }

    /// Controller ID assigned by the subsystem.
    #[must_use]
    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }

    /// Identify Controller data.
    #[must_use]
    pub fn identify(&self) -> &IdentifyController {
        &self.id
    }

    /// CAP property.
    #[must_use]
    pub fn cap(&self) -> Cap {
        self.cap
    }

    /// VS property.
    #[must_use]
    pub fn version(&self) -> u32 {
        self.vs
    }

    /// Number of I/O queues.
    #[must_use]
    pub fn io_queue_count(&self) -> usize {
        self.io.len()
    }

    /// Entries of each I/O queue.
    #[must_use]
    pub fn io_queue_entries(&self) -> u16 {
        self.io_queue_entries
    }

    /// True once after the controller sent an ANA change notice (an asynchronous event):
    /// the caller re-reads the ANA log, which also lets the controller send the next one.
    pub(crate) fn take_ana_event(&self) -> bool {
        self.ana_event.swap(false, Ordering::AcqRel)
    }

    /// Asks a controller that reports ANA and sends ANA change notices (OAES bit 11) for
    /// them, and keeps one Asynchronous Event Request outstanding on the admin queue for
    /// as long as the queue lives. Without it (or when the controller refuses) the paths
    /// still poll the ANA log every second.
    fn start_ana_events(&self) {
        if !self.ana_reporting() || self.id.oaes & OAES_ANA_CHANGE == 0 {
            return;
        }
        let cmd = SetFeatures {
            nsid: 0,
            save: false,
            feature: Feature::AsyncEventConfig(OAES_ANA_CHANGE),
        };
        let sqe = AdminCommand::SetFeatures(cmd).to_sqe(0);
        if let Err(e) = checked(&self.admin, sqe, Xfer::None, "Set Features (async events)") {
            tracing::info!(addr = %self.addr, "ANA change events not enabled ({e}); polling the ANA log");
            return;
        }
        let admin = Arc::clone(&self.admin);
        let flag = Arc::clone(&self.ana_event);
        let addr = self.addr;
        let spawned = std::thread::Builder::new()
            .name(format!("nvme-aer-{}", self.cntlid))
            .spawn(move || async_event_loop(&admin, &flag, addr));
        if let Err(e) = spawned {
            tracing::warn!(%addr, "cannot start the async event thread ({e}); polling the ANA log");
        }
    }

    /// Whether the controller reports ANA states.
    #[must_use]
    pub fn ana_reporting(&self) -> bool {
        self.id.cmic & cmic::ANA_REPORTING != 0
    }

    /// Largest transfer of one command for a namespace with `lba_bytes` blocks.
    #[must_use]
    pub fn max_transfer_bytes(&self, lba_bytes: u32) -> u32 {
        max_transfer_bytes(self.id.mdts, self.cap.mpsmin, lba_bytes)
    }

    /// Whether any queue of the association died (it must be reconnected).
    #[must_use]
    pub fn is_dead(&self) -> bool {
        self.health.dead.load(Ordering::SeqCst)
    }

    /// Why the association died, if it did.
    #[must_use]
    pub fn death_reason(&self) -> Option<String> {
        std::iter::once(&self.admin)
            .chain(&self.io)
            .find_map(|q| q.death_reason())
    }

    /// Tears the association down without the shutdown handshake (the path is broken).
    pub fn kill(&self, reason: &str) {
        self.health.fail(reason);
    }

    /// Runs an admin command; a non-success status is an error.
    ///
    /// # Errors
    /// [`HostError::Status`] for a failed completion, or the transport's error.
    pub fn admin_command(
        &self,
        sqe: Sqe,
        xfer: Xfer<'_>,
        what: &'static str,
    ) -> Result<Cqe, HostError> {
        checked(&self.admin, sqe, xfer, what)
    }

    /// Runs an I/O command on the queue the policy picks; a non-success status is an error.
    ///
    /// # Errors
    /// As [`Controller::admin_command`]; a discovery controller has no I/O queues.
    pub fn io_command(
        &self,
        sqe: Sqe,
        xfer: Xfer<'_>,
        what: &'static str,
    ) -> Result<Cqe, HostError> {
        checked(self.io_queue()?, sqe, xfer, what)
    }

    /// The I/O queue the next command goes to, by the queue policy.
    pub(crate) fn io_queue(&self) -> Result<&Arc<Queue>, HostError> {
        let count = self.io.len();
        if count == 0 {
            return Err(HostError::Invalid(format!("{}: no I/O queues", self.addr)));
        }
        let index = match self.policy {
            QueuePolicy::RoundRobin => self.next.fetch_add(1, Ordering::Relaxed) % count,
            QueuePolicy::Cpu => current_cpu() % count,
        };
        Ok(&self.io[index])
    }

    /// The active namespace IDs, in order.
    ///
    /// # Errors
    /// As [`Controller::admin_command`], or a malformed list.
    pub fn active_namespaces(&self) -> Result<Vec<u32>, HostError> {
        let mut all = Vec::new();
        let mut after = 0u32;
        // Each page holds up to 1024 IDs greater than `after`; NN bounds the pages.
        let pages = (self.id.nn as usize / NSID_LIST_MAX) + 1;
        for _ in 0..pages {
            let page = self.identify_page(cns::ACTIVE_NAMESPACES, after)?;
            let ids = decode_nsid_list(&page).map_err(|e| self.protocol(&e))?;
            let full = ids.len() == NSID_LIST_MAX;
            all.extend(ids.iter().copied().filter(|&id| id > after));
            match all.last() {
                Some(&last) if full && last > after => after = last,
                _ => break,
            }
        }
        Ok(all)
    }

    /// Identify Namespace plus the Namespace Identification Descriptors.
    ///
    /// # Errors
    /// As [`Controller::admin_command`]; [`HostError::Invalid`] for a block size other than
    /// 512 or 4096, or metadata, which a `BlockDevice` cannot carry.
    pub fn identify_namespace(&self, nsid: u32) -> Result<NamespaceData, HostError> {
        let page = self.identify_page(cns::NAMESPACE, nsid)?;
        let ns = IdentifyNamespace::decode(&page).map_err(|e| self.protocol(&e))?;
        let lba_bytes = ns.block_bytes().map_err(|e| self.protocol(&e))?;
        let metadata = ns.lbaf.get(ns.format_index()).map_or(0, |f| f.ms);
        if !matches!(lba_bytes, 512 | 4096) || metadata != 0 {
            return Err(HostError::Invalid(format!(
                "{} namespace {nsid}: LBA format {lba_bytes} + {metadata} bytes; \
                 Tessera needs 512 or 4096-byte blocks without metadata",
                self.addr
            )));
        }
        let size_bytes = ns.nsze.saturating_mul(u64::from(lba_bytes)) / 4096 * 4096;
        let mut data = NamespaceData {
            nsid,
            nsze: ns.nsze,
            lba_bytes,
            size_bytes,
            nguid: ns.nguid,
            eui64: ns.eui64,
            uuid: None,
            anagrpid: ns.anagrpid,
            rescap: ns.rescap,
            deallocate_zeroes: ns.dlfeat & 0x7 == 1,
        };
        // The descriptor list is optional before NVMe 1.3; a controller without it keeps
        // the identifiers of Identify Namespace.
        if let Ok(list) = self.identify_page(cns::NS_ID_DESCRIPTORS, nsid) {
            for d in NsIdDescriptor::decode_list(&list).unwrap_or_default() {
                match d {
                    NsIdDescriptor::Nguid(v) if data.nguid == [0; 16] => data.nguid = v,
                    NsIdDescriptor::Eui64(v) if data.eui64 == [0; 8] => data.eui64 = v,
                    NsIdDescriptor::Uuid(v) => data.uuid = Some(v),
                    _ => {}
                }
            }
        }
        Ok(data)
    }

    fn identify_page(&self, cns: u8, nsid: u32) -> Result<Vec<u8>, HostError> {
        let cmd = Identify {
            nsid,
            cns,
            cntid: 0,
            csi: 0,
        };
        let mut page = vec![0u8; IDENTIFY_BYTES];
        let sqe = AdminCommand::Identify(cmd).to_sqe(0);
        self.admin_command(sqe, Xfer::FromController(&mut page), "Identify")?;
        Ok(page)
    }

    /// Reads `buf.len()` bytes of log page `lid` at `offset`.
    ///
    /// # Errors
    /// As [`Controller::admin_command`].
    pub fn get_log_page(
        &self,
        lid: u8,
        nsid: u32,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), HostError> {
        let cmd = GetLogPage::new(nsid, lid, offset, buf.len() as u64)
            .map_err(|e| HostError::Invalid(e.to_string()))?;
        let sqe = AdminCommand::GetLogPage(cmd).to_sqe(0);
        self.admin_command(sqe, Xfer::FromController(buf), "Get Log Page")?;
        Ok(())
    }

    /// The ANA log page (sized as Linux sizes it: header, one descriptor per group, one
    /// NSID per namespace).
    ///
    /// # Errors
    /// As [`Controller::admin_command`], or a malformed page.
    pub fn ana_log(&self) -> Result<AnaLog, HostError> {
        let len = 16 + 32 * u64::from(self.id.nanagrpid.max(1)) + 4 * u64::from(self.id.nn);
        let len = len.min(ANA_LOG_MAX_BYTES).div_ceil(4) * 4;
        let mut buf = vec![0u8; len as usize];
        self.get_log_page(lid::ANA, 0xffff_ffff, 0, &mut buf)?;
        AnaLog::decode(&buf).map_err(|e| self.protocol(&e))
    }

    /// Sends one Keep Alive.
    ///
    /// # Errors
    /// As [`Controller::admin_command`].
    pub fn keep_alive(&self) -> Result<(), HostError> {
        let sqe = AdminCommand::KeepAlive.to_sqe(0);
        self.admin_command(sqe, Xfer::None, "Keep Alive")
            .map(|_| ())
    }

    /// Flushes namespace `nsid` through this controller.
    ///
    /// # Errors
    /// As [`Controller::io_command`].
    pub fn flush(&self, nsid: u32) -> Result<(), HostError> {
        let sqe = IoCommand::Flush { nsid }.to_sqe(0);
        self.io_command(sqe, Xfer::None, "Flush").map(|_| ())
    }

    /// Ends the association cleanly: normal shutdown (CC.SHN), wait for CSTS.SHST complete
    /// (bounded), close every queue. Failures are ignored: the host is leaving anyway.
    pub fn disconnect(&self) {
        self.stop_keepalive();
        if !self.is_dead() && !self.subnqn.is_discovery() {
            let cc = Cc {
                en: true,
                shn: 1,
                iosqes: 6,
                iocqes: 4,
                ..Cc::default()
            };
            if property_set(&self.admin, property::CC, u64::from(cc.to_u32())).is_ok() {
                let deadline = Instant::now() + SHUTDOWN_WAIT;
                while Instant::now() < deadline {
                    match property_get(&self.admin, property::CSTS, PropertySize::Four) {
                        Ok(v) if Csts::from_u32(v as u32).shst == 2 => break,
                        Ok(_) => std::thread::sleep(Duration::from_millis(10)),
                        Err(_) => break,
                    }
                }
            }
        }
        self.close();
    }

    fn close(&self) {
        self.stop_keepalive();
        self.health.fail("disconnected by the host");
        for q in &self.io {
            q.close();
        }
        self.admin.close();
    }

    fn start_keepalive(&self, kato: Duration) -> Result<(), HostError> {
        let admin = Arc::downgrade(&self.admin);
        let health = Arc::downgrade(&self.health);
        let stop = Arc::clone(&self.stop);
        let addr = self.addr;
        let handle = std::thread::Builder::new()
            .name(format!("nvme-ka-{}", self.cntlid))
            .spawn(move || keepalive_loop(&admin, &health, &stop, kato / 2, addr))
            .map_err(|e| HostError::Io {
                context: "spawning the keep-alive thread".into(),
                source: e,
            })?;
        *self.keepalive.lock() = Some(handle);
        Ok(())
    }

    fn stop_keepalive(&self) {
        *self.stop.stopped.lock() = true;
        self.stop.cv.notify_all();
        if let Some(handle) = self.keepalive.lock().take() {
            let _ = handle.join();
        }
    }

    fn protocol(&self, e: &dyn std::fmt::Display) -> HostError {
        HostError::Protocol {
            addr: self.addr,
            reason: e.to_string(),
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.close();
    }
}

/// OAES and Asynchronous Event Configuration bit 11: ANA change notices.
const OAES_ANA_CHANGE: u32 = 1 << 11;
/// Asynchronous event type "notice" (completion DW0 bits 2:0).
const AEN_TYPE_NOTICE: u32 = 0x2;
/// Notice "ANA change" (completion DW0 bits 15:8).
const AEN_NOTICE_ANA_CHANGE: u32 = 0x03;

/// Keeps one Asynchronous Event Request outstanding and flags each ANA change notice. It
/// ends when the admin queue dies (its teardown completes the request with an error) or
/// when the controller refuses the request.
fn async_event_loop(admin: &Queue, flag: &AtomicBool, addr: SocketAddr) {
    loop {
        let sqe = AdminCommand::AsyncEventRequest.to_sqe(0);
        match admin.execute_unbounded(sqe, "Asynchronous Event Request") {
            Ok(cqe) if cqe.status.is_success() => {
                let kind = cqe.dw0 & 0x7;
                let info = (cqe.dw0 >> 8) & 0xff;
                if kind == AEN_TYPE_NOTICE && info == AEN_NOTICE_ANA_CHANGE {
                    tracing::debug!(%addr, "ANA change notice");
                    flag.store(true, Ordering::Release);
                } else {
                    tracing::debug!(%addr, dw0 = cqe.dw0, "asynchronous event ignored");
                }
            }
            Ok(cqe) => {
                tracing::info!(%addr, status = %cqe.status, "Asynchronous Event Request refused; polling the ANA log");
                return;
            }
            Err(_) => return,
        }
    }
}

/// Sends Keep Alive every `interval` until stopped; a failure kills the association, which
/// is how a silent controller becomes a dead path before any I/O times out.
fn keepalive_loop(
    admin: &Weak<Queue>,
    health: &Weak<Health>,
    stop: &Stop,
    interval: Duration,
    addr: SocketAddr,
) {
    loop {
        {
            let mut stopped = stop.stopped.lock();
            if !*stopped {
                stop.cv.wait_for(&mut stopped, interval);
            }
            if *stopped {
                return;
            }
        }
        let Some(queue) = admin.upgrade() else { return };
        if queue.is_dead() {
            return;
        }
        let sqe = AdminCommand::KeepAlive.to_sqe(0);
        if let Err(e) = checked(&queue, sqe, Xfer::None, "Keep Alive") {
            tracing::warn!(%addr, "keep alive failed: {e}");
            if let Some(h) = health.upgrade() {
                h.fail(&format!("keep alive failed: {e}"));
            }
            return;
        }
    }
}

type BringUp = (Cap, u32, IdentifyController, Vec<Arc<Queue>>);

fn bring_up(
    admin: &Arc<Queue>,
    admin_cfg: &QueueConfig,
    cntlid: u16,
    discovery: bool,
    opts: &ControllerOptions,
    health: &Arc<Health>,
) -> Result<BringUp, HostError> {
    let cap = Cap::from_u64(property_get(admin, property::CAP, PropertySize::Eight)?);
    let vs = property_get(admin, property::VS, PropertySize::Four)? as u32;
    enable(admin, &cap)?;
    let mut page = vec![0u8; IDENTIFY_BYTES];
    let ident = Identify {
        nsid: 0,
        cns: cns::CONTROLLER,
        cntid: 0,
        csi: 0,
    };
    let sqe = AdminCommand::Identify(ident).to_sqe(0);
    checked(
        admin,
        sqe,
        Xfer::FromController(&mut page),
        "Identify Controller",
    )?;
    let id = IdentifyController::decode(&page).map_err(|e| HostError::Protocol {
        addr: admin.addr(),
        reason: e.to_string(),
    })?;
    if discovery {
        return Ok((cap, vs, id, Vec::new()));
    }
    let wanted = opts
        .nr_io_queues
        .map_or_else(default_io_queues, usize::from)
        .max(1);
    let granted = set_queue_count(admin, wanted)?;
    let in_capsule = usize::try_from(id.in_capsule_data_bytes()).unwrap_or(0);
    let entries = io_entries(opts.queue_size, &cap);
    let mut io = Vec::with_capacity(granted);
    for qid in 1..=granted {
        let cfg = QueueConfig {
            qid: qid as u16,
            entries,
            kato_ms: 0,
            cntlid,
            in_capsule_bytes: in_capsule,
            ..admin_cfg.clone()
        };
        let (queue, _) = Queue::connect(&cfg).inspect_err(|_| {
            io.iter().for_each(|q: &Arc<Queue>| q.close());
        })?;
        health.watch(&queue);
        io.push(queue);
    }
    Ok((cap, vs, id, io))
}

/// CC.EN = 1 with the NVM command set and 64/16-byte entries, then wait for CSTS.RDY for
/// at most CAP.TO (at least one second).
fn enable(admin: &Queue, cap: &Cap) -> Result<(), HostError> {
    let cc = Cc {
        en: true,
        iosqes: 6,
        iocqes: 4,
        ..Cc::default()
    };
    property_set(admin, property::CC, u64::from(cc.to_u32()))?;
    let timeout = Duration::from_millis(500 * u64::from(cap.to_500ms)).max(Duration::from_secs(1));
    let deadline = Instant::now() + timeout;
    loop {
        let csts = Csts::from_u32(property_get(admin, property::CSTS, PropertySize::Four)? as u32);
        if csts.cfs {
            let reason = "controller fatal status (CSTS.CFS) while enabling".to_owned();
            return Err(HostError::Protocol {
                addr: admin.addr(),
                reason,
            });
        }
        if csts.rdy {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let reason = format!("CSTS.RDY not set {} ms after CC.EN", timeout.as_millis());
            return Err(HostError::Protocol {
                addr: admin.addr(),
                reason,
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn set_queue_count(admin: &Queue, wanted: usize) -> Result<usize, HostError> {
    let n = (wanted.min(65_535) - 1) as u16;
    let cmd = SetFeatures {
        nsid: 0,
        save: false,
        feature: Feature::NumberOfQueues { nsqr: n, ncqr: n },
    };
    let cqe = checked(
        admin,
        AdminCommand::SetFeatures(cmd).to_sqe(0),
        Xfer::None,
        "Set Features",
    )?;
    let granted = match Feature::from_dword(fid::NUMBER_OF_QUEUES, cqe.dw0) {
        Feature::NumberOfQueues { nsqr, ncqr } => usize::from(nsqr.min(ncqr)) + 1,
        _ => 1,
    };
    Ok(granted.min(wanted))
}

fn io_entries(queue_size: u16, cap: &Cap) -> u16 {
    let mqes = u32::from(cap.mqes) + 1;
    u32::from(queue_size).min(mqes).clamp(2, 65_535) as u16
}

fn default_io_queues() -> usize {
    std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .min(DEFAULT_IO_QUEUES_MAX)
}

fn current_cpu() -> usize {
    // SAFETY: sched_getcpu has no preconditions; it returns -1 on error.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).unwrap_or(0)
}

fn parse_nqn(nqn: &str, what: &str) -> Result<Nqn, HostError> {
    Nqn::new(nqn).map_err(|e| HostError::Invalid(format!("{what} {nqn:?}: {e}")))
}

/// Runs a command and turns a non-success status into [`HostError::Status`].
fn checked(queue: &Queue, sqe: Sqe, xfer: Xfer<'_>, what: &'static str) -> Result<Cqe, HostError> {
    let cqe = queue.execute(sqe, xfer, what)?;
    if cqe.status.is_success() {
        Ok(cqe)
    } else {
        Err(HostError::Status {
            addr: queue.addr(),
            command: what,
            status: cqe.status,
        })
    }
}

fn property_get(admin: &Queue, offset: u32, size: PropertySize) -> Result<u64, HostError> {
    let sqe = FabricsCommand::PropertyGet(PropertyGet { size, offset }).to_sqe(0);
    let cqe = checked(admin, sqe, Xfer::None, "Property Get")?;
    Ok(u64::from(cqe.dw0) | u64::from(cqe.dw1) << 32)
}

fn property_set(admin: &Queue, offset: u32, value: u64) -> Result<(), HostError> {
    let size = PropertySize::Four;
    let sqe = FabricsCommand::PropertySet(PropertySet {
        size,
        offset,
        value,
    })
    .to_sqe(0);
    checked(admin, sqe, Xfer::None, "Property Set").map(|_| ())
}

/// Options of [`discover`].
#[derive(Debug, Clone)]
pub struct DiscoverOptions {
    /// Host NQN to present instead of the identity's.
    pub host_nqn: Option<String>,
    /// Request header digests.
    pub header_digest: bool,
    /// Request data digests.
    pub data_digest: bool,
    /// Per-command timeout.
    pub command_timeout: Duration,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
}

impl Default for DiscoverOptions {
    fn default() -> Self {
        DiscoverOptions {
            host_nqn: None,
            header_digest: false,
            data_digest: false,
            command_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// `nvme discover`: connects to the discovery controller at `addr`, reads the whole
/// Discovery log page consistently and disconnects.
///
/// # Errors
/// Any [`HostError`] of the connection, or a log whose GENCTR never settles.
pub fn discover(
    addr: SocketAddr,
    host: &super::HostIdentity,
    opts: &DiscoverOptions,
) -> Result<Vec<DiscoveryEntry>, HostError> {
    let ctrl_opts = ControllerOptions {
        header_digest: opts.header_digest,
        data_digest: opts.data_digest,
        command_timeout: opts.command_timeout,
        connect_timeout: opts.connect_timeout,
        keep_alive_tmo: Duration::ZERO,
        ..ControllerOptions::default()
    };
    let hostnqn = opts.host_nqn.as_deref().unwrap_or(&host.nqn);
    let discovery = Nqn::discovery();
    let ctrl = Controller::connect(addr, discovery.as_str(), hostnqn, host.id, &ctrl_opts)?;
    let log = read_discovery_log(&ctrl);
    ctrl.disconnect();
    Ok(log?.entries)
}

/// Reads the header, then header and all entries, then the header again, and retries
/// while GENCTR moved (NVMe-oF 1.1 5.3: the host must see one generation).
fn read_discovery_log(ctrl: &Controller) -> Result<DiscoveryLog, HostError> {
    let mut header = vec![0u8; DISCOVERY_RECORD_BYTES];
    for _ in 0..DISCOVERY_READ_ATTEMPTS {
        ctrl.get_log_page(lid::DISCOVERY, 0, 0, &mut header)?;
        let (genctr, numrec, _) =
            DiscoveryLog::decode_header(&header).map_err(|e| ctrl.protocol(&e))?;
        let numrec = numrec.min(DISCOVERY_ENTRIES_MAX);
        let mut page = vec![0u8; DISCOVERY_RECORD_BYTES * (numrec as usize + 1)];
        ctrl.get_log_page(lid::DISCOVERY, 0, 0, &mut page)?;
        ctrl.get_log_page(lid::DISCOVERY, 0, 0, &mut header)?;
        let (again, _, _) = DiscoveryLog::decode_header(&header).map_err(|e| ctrl.protocol(&e))?;
        if again != genctr {
            continue;
        }
        // NUMREC in the page may exceed what was read if capped; decode what was read.
        page[8..16].copy_from_slice(&numrec.to_le_bytes());
        return DiscoveryLog::decode(&page).map_err(|e| ctrl.protocol(&e));
    }
    Err(HostError::Protocol {
        addr: ctrl.addr(),
        reason: format!(
            "Discovery log generation kept changing over {DISCOVERY_READ_ATTEMPTS} reads"
        ),
    })
}
