//! One controller (one association of a host with a subsystem through a port): its
//! properties (CAP, VS, CC, CSTS), features, keep-alive timer, queues, asynchronous
//! events, and the admin commands.

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::connection::ConnWriter;
use super::namespace::{Namespace, LBA_BYTES};
use super::server::{Port, ServerShared};
use super::subsystem::Subsystem;
use crate::wire::command::{
    cns, fid, AdminCommand, Feature, FeatureSelect, GetFeatures, GetLogPage, Identify, SetFeatures,
};
use crate::wire::fabrics::{property, version, Cap, Cc, Csts, PropertyGet, PropertySet};
use crate::wire::identify::{
    cmic, cntrltype, encode_nsid_list, oncs, sgls, IdentifyController, IdentifyNamespace,
    LbaFormat, NsIdDescriptor, IDENTIFY_BYTES, NMIC_SHARED,
};
use crate::wire::log::{lid, SmartLog};
use crate::wire::{FixedAscii, Status};

/// The broadcast NSID: a namespace-specific feature set for every namespace.
const NSID_ALL: u32 = 0xffff_ffff;

/// Largest data transfer: MDTS 10 = 2^10 pages of 4 KiB (CAP.MPSMIN 0). A file system
/// block (4 MiB by default) is then one command, which the drive server reads as one drive
/// request; at 1 MiB the host sent a block's four commands one after the other, and the
/// server's drive saw far fewer bytes in flight than the same readers keep in flight on
/// local access (four readers through an NSD server: 1 MiB requests at queue depth 5,
/// against 4 MiB ones at 7.7 locally).
pub const MDTS_BYTES: u32 = 4 << 20;
const MDTS: u8 = 10;
/// In-capsule data accepted on the admin queue (Linux hosts assume 8 KiB).
pub const ADMIN_INLINE_BYTES: u32 = 8192;
/// Async Event Request commands held at once (AERL + 1).
const AER_MAX: usize = 4;
/// Asynchronous event: notice (type 2), ANA change (info 3), log page 0x0C.
const AEN_ANA_CHANGE: u32 = 0x2 | 0x03 << 8 | (lid::ANA as u32) << 16;
/// OAES / Async Event Configuration bit for ANA change notices.
const AEC_ANA_CHANGE: u32 = 1 << 11;
/// The NVMe version this target implements.
const NVME_VERSION: u32 = version(2, 0, 0);

/// The result of a command that the caller turns into a completion.
#[derive(Debug)]
pub(crate) enum Reply {
    /// Complete now with status, dword 0 and data for the host (C2H).
    Done {
        status: Status,
        dw0: u32,
        dw1: u32,
        data: Vec<u8>,
    },
    /// Held (an Asynchronous Event Request); completed later or never.
    Held,
}

impl Reply {
    pub fn status(status: Status) -> Reply {
        Reply::Done {
            status,
            dw0: 0,
            dw1: 0,
            data: Vec::new(),
        }
    }

    pub fn ok(dw0: u32) -> Reply {
        Reply::Done {
            status: Status::SUCCESS,
            dw0,
            dw1: 0,
            data: Vec::new(),
        }
    }

    pub fn data(data: Vec<u8>) -> Reply {
        Reply::Done {
            status: Status::SUCCESS,
            dw0: 0,
            dw1: 0,
            data,
        }
    }
}

fn invalid_field() -> Reply {
    Reply::status(Status::INVALID_FIELD.with_dnr(true))
}

#[derive(Debug, Default)]
struct Regs {
    cc: Cc,
    csts: Csts,
    aec: u32,
    io_queues_granted: Option<u16>,
    /// CIDs of held Asynchronous Event Requests.
    aer_cids: Vec<u16>,
    /// An ANA change happened while no AER was held.
    ana_event_pending: bool,
    /// ANA events are masked until the host reads the ANA log (RAE clear).
    ana_event_masked: bool,
}

/// A queue of the controller, to close it when the association ends.
#[derive(Debug)]
pub(crate) struct QueueRef {
    pub stream: TcpStream,
}

/// One controller.
#[derive(Debug)]
pub(crate) struct Controller {
    pub cntlid: u16,
    pub subsys: Arc<Subsystem>,
    pub port: Arc<Port>,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    kato_ms: AtomicU32,
    last_activity: Mutex<Instant>,
    regs: Mutex<Regs>,
    /// Volatile write cache enabled (feature 0x06); when off, writes are flushed.
    pub vwc_enabled: AtomicBool,
    pub queues: Mutex<BTreeMap<u16, QueueRef>>,
    admin_writer: Mutex<Option<Arc<ConnWriter>>>,
    pub dead: AtomicBool,
    /// The host's cluster has given up on it (see [`super::server::HostGate`]): its
    /// writes are refused with Reservation Conflict, as a preempted registrant's are.
    pub fenced: AtomicBool,
    /// The first refused write is logged; later ones only counted.
    pub fence_logged: AtomicBool,
    /// Entries of the admin queue, for CAP and MAXCMD bounds.
    queue_entries_max: u32,
    io_queues_max: u16,
    keep_alive_max_ms: u32,
}

/// What a controller is created from (the admin Connect).
pub(crate) struct NewController {
    pub subsys: Arc<Subsystem>,
    pub port: Arc<Port>,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    pub kato_ms: u32,
    pub admin_writer: Arc<ConnWriter>,
    pub admin_stream: TcpStream,
    /// The host gate's answer at Connect.
    pub fenced: bool,
}

impl Controller {
    pub fn new(cntlid: u16, n: NewController, shared: &ServerShared) -> Controller {
        let limits = shared.limits;
        let kato_ms = n.kato_ms.min(limits.keep_alive_max_ms);
        let mut queues = BTreeMap::new();
        queues.insert(
            0,
            QueueRef {
                stream: n.admin_stream,
            },
        );
        Controller {
            cntlid,
            subsys: n.subsys,
            port: n.port,
            hostnqn: n.hostnqn,
            hostid: n.hostid,
            kato_ms: AtomicU32::new(kato_ms),
            last_activity: Mutex::new(Instant::now()),
            regs: Mutex::new(Regs::default()),
            vwc_enabled: AtomicBool::new(true),
            queues: Mutex::new(queues),
            admin_writer: Mutex::new(Some(n.admin_writer)),
            dead: AtomicBool::new(false),
            fenced: AtomicBool::new(n.fenced),
            fence_logged: AtomicBool::new(false),
            queue_entries_max: limits.queue_entries_max,
            io_queues_max: limits.io_queues_max.min(0xfffe) as u16,
            keep_alive_max_ms: limits.keep_alive_max_ms,
        }
    }

    pub fn kato_ms(&self) -> u32 {
        self.kato_ms.load(Ordering::Relaxed)
    }

    /// Restarts the keep-alive timer. Every command counts (traffic-based keep-alive,
    /// CTRATT.TBKAS), so a busy host never needs a Keep Alive command.
    pub fn touch(&self) {
        *self.last_activity.lock() = Instant::now();
    }

    pub fn keep_alive_expired(&self, now: Instant) -> bool {
        let kato = self.kato_ms();
        kato != 0
            && now.saturating_duration_since(*self.last_activity.lock())
                > Duration::from_millis(u64::from(kato))
    }

    pub fn ready(&self) -> bool {
        self.regs.lock().csts.rdy
    }

    /// I/O queues the host may connect: granted by Number of Queues, or all.
    pub fn io_queues_allowed(&self) -> u16 {
        self.regs
            .lock()
            .io_queues_granted
            .unwrap_or(self.io_queues_max)
    }

    /// Closes every queue: the association is over.
    pub fn close_queues(&self) {
        self.dead.store(true, Ordering::SeqCst);
        *self.admin_writer.lock() = None;
        for q in self.queues.lock().values() {
            let _ = q.stream.shutdown(std::net::Shutdown::Both);
        }
    }

    fn cap(&self) -> u64 {
        Cap {
            mqes: (self.queue_entries_max - 1) as u16,
            cqr: true,
            to_500ms: 15,
            dstrd: 0,
            css_nvm: true,
            mpsmin: 0,
            mpsmax: 0,
        }
        .to_u64()
    }

    /// Property Get (NVMe-oF 1.1, 3.5).
    pub fn property_get(&self, p: PropertyGet) -> Reply {
        let regs = self.regs.lock();
        let value = match p.offset {
            property::CAP => self.cap(),
            property::VS => u64::from(NVME_VERSION),
            property::CC => u64::from(regs.cc.to_u32()),
            property::CSTS => u64::from(regs.csts.to_u32()),
            _ => return invalid_field(),
        };
        Reply::Done {
            status: Status::SUCCESS,
            dw0: value as u32,
            dw1: (value >> 32) as u32,
            data: Vec::new(),
        }
    }

    /// Property Set: only CC is writable. Enabling sets CSTS.RDY at once; a shutdown
    /// request flushes every namespace and reports shutdown complete.
    pub fn property_set(&self, p: PropertySet) -> Reply {
        if p.offset != property::CC {
            return invalid_field();
        }
        let new = Cc::from_u32(p.value as u32);
        let mut regs = self.regs.lock();
        let old = regs.cc;
        regs.cc = new;
        if new.en && !old.en {
            regs.csts.rdy = true;
        } else if !new.en && old.en {
            // A controller reset: the host reconnects its I/O queues afterwards.
            regs.csts.rdy = false;
            regs.csts.shst = 0;
        }
        if new.shn != 0 && old.shn == 0 {
            drop(regs);
            self.flush_all();
            self.regs.lock().csts.shst = 2;
        }
        Reply::ok(0)
    }

    fn flush_all(&self) {
        for ns in self.subsys.namespaces.values() {
            if let Err(e) = ns.flush() {
                tracing::warn!(nsid = ns.nsid, "flush at controller shutdown: {e}");
            }
        }
    }

    /// Executes an admin command (after Connect, with CSTS.RDY set).
    pub fn admin(&self, shared: &ServerShared, cid: u16, cmd: &AdminCommand) -> Reply {
        if !self.ready() {
            return Reply::status(Status::COMMAND_SEQUENCE_ERROR.with_dnr(true));
        }
        let discovery = self.subsys.is_discovery;
        match cmd {
            AdminCommand::Identify(id) => self.identify(id),
            AdminCommand::GetLogPage(glp) => self.log_page(shared, glp),
            AdminCommand::SetFeatures(sf) => self.set_features(sf),
            AdminCommand::GetFeatures(gf) => self.get_features(gf),
            AdminCommand::KeepAlive => Reply::ok(0),
            AdminCommand::AsyncEventRequest => self.hold_aer(cid),
            // Commands finish quickly and are never aborted: bit 0 set = not aborted.
            AdminCommand::Abort(_) if !discovery => Reply::ok(1),
            AdminCommand::Abort(_) => Reply::status(Status::INVALID_OPCODE.with_dnr(true)),
        }
    }

    fn identify(&self, id: &Identify) -> Reply {
        let discovery = self.subsys.is_discovery;
        match id.cns {
            cns::CONTROLLER => Reply::data(self.identify_controller().encode()),
            _ if discovery => invalid_field(),
            cns::NAMESPACE => self.identify_namespace(id.nsid),
            cns::ACTIVE_NAMESPACES => {
                if id.nsid >= 0xffff_fffe {
                    return Reply::status(Status::INVALID_NAMESPACE.with_dnr(true));
                }
                let nsids: Vec<u32> = self
                    .subsys
                    .namespaces
                    .range(id.nsid + 1..)
                    .map(|(&n, _)| n)
                    .collect();
                Reply::data(encode_nsid_list(&nsids))
            }
            cns::NS_ID_DESCRIPTORS => match self.subsys.namespaces.get(&id.nsid) {
                Some(ns) => Reply::data(NsIdDescriptor::encode_list(&[
                    NsIdDescriptor::Nguid(ns.nguid),
                    NsIdDescriptor::Uuid(ns.uuid),
                    NsIdDescriptor::Csi(0),
                ])),
                None => Reply::status(Status::INVALID_NAMESPACE.with_dnr(true)),
            },
            _ => invalid_field(),
        }
    }

    fn identify_controller(&self) -> IdentifyController {
        let discovery = self.subsys.is_discovery;
        let inline = if discovery {
            0
        } else {
            self.port.cfg.inline_data_bytes
        };
        let mut id = IdentifyController {
            sn: FixedAscii::new(&self.subsys.serial).unwrap_or_default(),
            mn: FixedAscii::new(&self.subsys.model).unwrap_or_default(),
            fr: FixedAscii::new(firmware_revision()).unwrap_or_default(),
            rab: 6,
            mdts: MDTS,
            cntlid: self.cntlid,
            ver: NVME_VERSION,
            // 128-bit host identifiers; traffic-based keep-alive.
            ctratt: 1 | 1 << 6,
            cntrltype: if discovery {
                cntrltype::DISCOVERY
            } else {
                cntrltype::IO
            },
            aerl: (AER_MAX - 1) as u8,
            // Get Log Page extended data (offsets, NUMDU).
            lpa: 1 << 2,
            kas: 1,
            sqes: 0x66,
            cqes: 0x44,
            maxcmd: self.queue_entries_max as u16,
            sgls: sgls::SUPPORTED | sgls::OFFSET,
            subnqn: Some(self.subsys.nqn.clone()),
            ioccsz: (64 + inline) / 16,
            iorcsz: 1,
            msdbd: 1,
            ..IdentifyController::default()
        };
        if !discovery {
            id.cmic = cmic::MULTI_PORT | cmic::MULTI_CONTROLLER | cmic::ANA_REPORTING;
            id.oaes = AEC_ANA_CHANGE;
            id.acl = 3;
            id.frmw = 0x3;
            id.anatt = 10;
            id.anacap = 0x1f;
            id.anagrpmax = super::config::ANA_GROUP_MAX;
            id.nanagrpid = super::config::ANA_GROUP_MAX;
            id.nn = super::config::NSID_MAX;
            id.mnan = super::config::NSID_MAX;
            id.oncs = oncs::DSM | oncs::WRITE_ZEROES | oncs::RESERVATIONS;
            // Present, and Flush with NSID FFFFFFFFh supported.
            id.vwc = 0x7;
        }
        id
    }

    fn identify_namespace(&self, nsid: u32) -> Reply {
        if nsid == 0 || nsid > super::config::NSID_MAX {
            return Reply::status(Status::INVALID_NAMESPACE.with_dnr(true));
        }
        let Some(ns) = self.subsys.namespaces.get(&nsid) else {
            // An allocated-but-inactive NSID reads as zeroes (NVMe Base 2.0, 5.17.2.1).
            return Reply::data(vec![0; IDENTIFY_BYTES]);
        };
        let dlfeat = if ns.deallocate_reads_zeroes() {
            0x09
        } else {
            0x08
        };
        let id = IdentifyNamespace {
            nsze: ns.blocks,
            ncap: ns.blocks,
            nuse: ns.blocks,
            // NGUID and EUI64 are never reused.
            nsfeat: 1 << 3,
            flbas: 0,
            nmic: NMIC_SHARED,
            // Types 1-6 and IEKEY per NVMe 1.3; PTPL where the server has a state
            // directory.
            rescap: 0xfe | u8::from(ns.reservation.lock().ptpl_capable()),
            dlfeat,
            anagrpid: ns.ana_grpid,
            nsattr: 0,
            nguid: ns.nguid,
            eui64: [0; 8],
            lbaf: vec![LbaFormat {
                ms: 0,
                lbads: LBA_BYTES.trailing_zeros() as u8,
                rp: 0,
            }],
        };
        Reply::data(id.encode())
    }

    fn log_page(&self, shared: &ServerShared, glp: &GetLogPage) -> Reply {
        let len = glp.len_bytes();
        if len > u64::from(MDTS_BYTES) {
            return invalid_field();
        }
        let full = match (glp.lid, self.subsys.is_discovery) {
            (lid::DISCOVERY, true) => {
                super::discovery::log(shared, &self.port, &self.hostnqn).encode()
            }
            (_, true) => return Reply::status(Status::INVALID_LOG_PAGE.with_dnr(true)),
            (lid::ERROR, false) => vec![0; 64],
            (lid::SMART, false) => self.smart_log(),
            (lid::FIRMWARE_SLOT, false) => self.firmware_log(),
            (lid::ANA, false) => {
                if !glp.rae {
                    self.regs.lock().ana_event_masked = false;
                }
                self.port.ana.log(&self.subsys, glp.lsp & 1 != 0).encode()
            }
            (lid::RESERVATION_NOTIFICATION, false) => vec![0; 64],
            _ => return Reply::status(Status::INVALID_LOG_PAGE.with_dnr(true)),
        };
        let Ok(offset) = usize::try_from(glp.offset) else {
            return invalid_field();
        };
        if offset % 4 != 0 || offset > full.len() {
            return invalid_field();
        }
        let mut data = vec![0u8; len as usize];
        let n = (full.len() - offset).min(data.len());
        data[..n].copy_from_slice(&full[offset..offset + n]);
        Reply::data(data)
    }

    fn smart_log(&self) -> Vec<u8> {
        let (mut read, mut written, mut reads, mut writes) = (0u128, 0u128, 0u128, 0u128);
        for ns in self.subsys.namespaces.values() {
            let c = &ns.counters;
            read += u128::from(c.read_bytes.load(Ordering::Relaxed));
            written += u128::from(c.write_bytes.load(Ordering::Relaxed));
            reads += u128::from(c.reads.load(Ordering::Relaxed));
            writes += u128::from(c.writes.load(Ordering::Relaxed));
        }
        // Data units are thousands of 512-byte units, rounded up.
        let units = |bytes: u128| (bytes / 512).div_ceil(1000);
        SmartLog {
            temperature_kelvin: 300,
            available_spare: 100,
            available_spare_threshold: 10,
            data_units_read: units(read),
            data_units_written: units(written),
            host_read_commands: reads,
            host_write_commands: writes,
            power_cycles: 1,
            ..SmartLog::default()
        }
        .encode()
    }

    fn firmware_log(&self) -> Vec<u8> {
        let mut b = vec![0u8; 512];
        b[0] = 1;
        let fr = firmware_revision().as_bytes();
        let n = fr.len().min(8);
        b[8..16].fill(b' ');
        b[8..8 + n].copy_from_slice(&fr[..n]);
        b
    }

    fn set_features(&self, sf: &SetFeatures) -> Reply {
        let discovery = self.subsys.is_discovery;
        if let Feature::ReservationPersistence { ptpl } = sf.feature {
            if discovery {
                return invalid_field();
            }
            // The setting is kept with the state it governs, so saving is what it always
            // does; SV is accepted.
            return self.set_reservation_persistence(sf.nsid, ptpl);
        }
        if sf.save {
            return Reply::status(Status::FEATURE_NOT_SAVEABLE.with_dnr(true));
        }
        match sf.feature {
            Feature::NumberOfQueues { nsqr, ncqr } if !discovery => {
                self.set_queue_count(nsqr, ncqr)
            }
            Feature::KeepAliveTimer { kato_ms } => {
                self.kato_ms
                    .store(kato_ms.min(self.keep_alive_max_ms), Ordering::Relaxed);
                Reply::ok(0)
            }
            Feature::AsyncEventConfig(mask) => {
                self.regs.lock().aec = mask;
                Reply::ok(0)
            }
            Feature::VolatileWriteCache { enable } if !discovery => {
                self.vwc_enabled.store(enable, Ordering::Relaxed);
                Reply::ok(0)
            }
            _ => invalid_field(),
        }
    }

    /// Reservation Persistence for one namespace, or every namespace (NSID FFFFFFFFh).
    fn set_reservation_persistence(&self, nsid: u32, ptpl: bool) -> Reply {
        let targets: Vec<&Arc<Namespace>> = if nsid == NSID_ALL {
            self.subsys.namespaces.values().collect()
        } else {
            match self.subsys.namespaces.get(&nsid) {
                Some(ns) => vec![ns],
                None => return Reply::status(Status::INVALID_NAMESPACE.with_dnr(true)),
            }
        };
        for ns in targets {
            if let Err(status) = ns.reservation.update(|s| s.set_ptpl(ptpl)) {
                return Reply::status(status);
            }
        }
        Reply::ok(0)
    }

    /// Number of Queues: grants up to the configured maximum; the answer is 0's based.
    fn set_queue_count(&self, nsqr: u16, ncqr: u16) -> Reply {
        if nsqr == 0xffff || ncqr == 0xffff {
            return invalid_field();
        }
        let mut regs = self.regs.lock();
        if self.queues.lock().len() > 1 {
            return Reply::status(Status::COMMAND_SEQUENCE_ERROR.with_dnr(true));
        }
        let granted = (nsqr.max(ncqr).saturating_add(1)).min(self.io_queues_max);
        regs.io_queues_granted = Some(granted);
        let zero_based = u32::from(granted - 1);
        Reply::ok(zero_based | zero_based << 16)
    }

    fn get_features(&self, gf: &GetFeatures) -> Reply {
        let default = gf.select == FeatureSelect::Default;
        let value = match gf.fid {
            fid::NUMBER_OF_QUEUES if !self.subsys.is_discovery => {
                let n = if default {
                    self.io_queues_max
                } else {
                    self.io_queues_allowed()
                };
                u32::from(n - 1) | u32::from(n - 1) << 16
            }
            fid::KEEP_ALIVE_TIMER => self.kato_ms(),
            fid::ASYNC_EVENT_CONFIG => self.regs.lock().aec,
            fid::VOLATILE_WRITE_CACHE if !self.subsys.is_discovery => {
                u32::from(default || self.vwc_enabled.load(Ordering::Relaxed))
            }
            fid::RESERVATION_PERSISTENCE if !self.subsys.is_discovery => {
                let Some(ns) = self.subsys.namespaces.get(&gf.nsid) else {
                    return Reply::status(Status::INVALID_NAMESPACE.with_dnr(true));
                };
                let state = ns.reservation.lock();
                if gf.select == FeatureSelect::SupportedCapabilities {
                    // Namespace specific and changeable; saveable where it can persist.
                    return Reply::ok(0b110 | u32::from(state.ptpl_capable()));
                }
                u32::from(!default && state.ptpl())
            }
            // Arbitration, power management, error recovery, interrupt coalescing: zero.
            0x01 | 0x02 | 0x05 | 0x08 if !self.subsys.is_discovery => 0,
            _ => return invalid_field(),
        };
        if gf.select == FeatureSelect::SupportedCapabilities {
            // Changeable, not saveable, not namespace specific.
            return Reply::ok(1 << 2);
        }
        Reply::ok(value)
    }

    fn hold_aer(&self, cid: u16) -> Reply {
        let mut regs = self.regs.lock();
        if regs.aer_cids.len() >= AER_MAX {
            return Reply::status(Status::ASYNC_EVENT_LIMIT_EXCEEDED);
        }
        if regs.ana_event_pending && !regs.ana_event_masked {
            regs.ana_event_pending = false;
            regs.ana_event_masked = true;
            return Reply::ok(AEN_ANA_CHANGE);
        }
        regs.aer_cids.push(cid);
        Reply::Held
    }

    /// Reports an ANA change through a held Asynchronous Event Request, if the host
    /// enabled ANA change notices; otherwise remembers it for the next request.
    pub fn notify_ana_change(&self) {
        let mut regs = self.regs.lock();
        if regs.aec & AEC_ANA_CHANGE == 0 || regs.ana_event_masked {
            return;
        }
        let Some(cid) = regs.aer_cids.pop() else {
            regs.ana_event_pending = true;
            return;
        };
        regs.ana_event_masked = true;
        drop(regs);
        let writer = self.admin_writer.lock().clone();
        if let Some(w) = writer {
            w.respond(cid, Status::SUCCESS, AEN_ANA_CHANGE, 0);
        }
    }
}

/// FR: the crate version, cut to the field's 8 characters.
fn firmware_revision() -> &'static str {
    let v = env!("CARGO_PKG_VERSION");
    &v[..v.len().min(8)]
}
