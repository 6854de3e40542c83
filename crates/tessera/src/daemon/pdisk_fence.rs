//! Drive-side fencing of a declustered array's pdisks on NVMe/TCP drives (JBOF drive
//! servers). An array is served by one node at a time (any-to-any: any node of its
//! `--servers` list); the lease gate keeps a node that lost its lease from submitting
//! pdisk I/O, but only the drive can refuse a write that a stopped or cut-off server had
//! already queued, or one sent by a server that has not noticed yet that the array was
//! given away. So the serving node holds an NVMe reservation on every pdisk it reaches
//! over NVMe/TCP, as GPFS's persistent-reserve fencing does on SCSI disks:
//!
//! - its reservation key names the node and its incarnation ([`reservation_key`]);
//! - before its first write (at open: before the array's in-flight stripe updates are
//!   recovered) it registers that key and acquires a Write Exclusive reservation,
//!   preempting (with abort) whoever held it: the array's earlier server is fenced, its
//!   later writes fail with Reservation Conflict and never reach the drive;
//! - a write refused with Reservation Conflict is retried once after taking the drive
//!   again, but only while this node may ([`TakeCheck`]: it holds its lease and the array
//!   registry gives it the array). That covers a drive server that restarted with an older
//!   persisted reservation; a server the array was taken from is refused, and stays fenced.
//!
//! Reservations ask for Persist Through Power Loss, so a drive server that restarts keeps
//! the fence. Reads need no reservation (Write Exclusive lets every host read).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tessera_cluster::node::NodeNumber;
use tessera_drive::BlockDevice;
use tessera_nvme::host::{nvme_status, MultipathNamespace};
use tessera_nvme::wire::reservation::{
    AcquireAction, RegisterAction, ReleaseAction, ReservationType,
};
use tessera_nvme::wire::status::Status;

/// Bits of a reservation key that carry the incarnation (epoch); the node number is above.
const EPOCH_BITS: u32 = 40;

/// The reservation key of incarnation `epoch` of node `node`: unique per incarnation, so a
/// restarted node fences its own earlier incarnation like any other, and never zero
/// (epochs start at 1).
#[must_use]
pub fn reservation_key(node: NodeNumber, epoch: u64) -> u64 {
    (u64::from(node) << EPOCH_BITS) | (epoch & ((1 << EPOCH_BITS) - 1))
}

/// The node and incarnation a key of [`reservation_key`] names.
#[must_use]
pub fn key_owner(key: u64) -> (NodeNumber, u64) {
    let node = NodeNumber::try_from(key >> EPOCH_BITS).unwrap_or(NodeNumber::MAX);
    (node, key & ((1 << EPOCH_BITS) - 1))
}

/// Whether this node may take the drive now (hold its lease and be the array's server);
/// if not, why.
pub type TakeCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Who holds a key, for the log ("node2, incarnation 7").
pub type KeyNamer = Arc<dyn Fn(u64) -> String + Send + Sync>;

/// A pdisk's NVMe/TCP namespace written only under this node's reservation.
pub struct ReservedPdisk {
    ns: Arc<MultipathNamespace>,
    key: u64,
    may_take: TakeCheck,
    namer: KeyNamer,
    /// Set once this node holds the reservation; cleared by a Reservation Conflict.
    held: AtomicBool,
    /// One take at a time (the array writes strips of a stripe in parallel).
    taking: Mutex<()>,
}

impl ReservedPdisk {
    /// Wraps `ns` and tries to take it now, so the earlier server is fenced before the
    /// array reads anything to recover; a drive that cannot be reached now is taken at its
    /// first write.
    pub fn open(
        ns: Arc<MultipathNamespace>,
        key: u64,
        may_take: TakeCheck,
        namer: KeyNamer,
    ) -> Arc<ReservedPdisk> {
        let pdisk = Arc::new(ReservedPdisk {
            ns,
            key,
            may_take,
            namer,
            held: AtomicBool::new(false),
            taking: Mutex::new(()),
        });
        if !pdisk.ns.has_live_path() {
            tracing::warn!(
                "{}: no path to the drive now; its reservation is taken before its first \
                 write once it answers",
                pdisk.ns.name()
            );
        } else if let Err(e) = pdisk.take() {
            tracing::warn!("{e}; taken again before its first write");
        }
        pdisk
    }

    /// Registers this node's key and makes it the holder of a Write Exclusive
    /// reservation, preempting (and aborting) the holder before it.
    fn take(&self) -> io::Result<()> {
        let _one = self.taking.lock();
        let name = self.ns.name();
        (self.may_take)().map_err(|why| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{name}: this node does not take the drive's reservation: {why}"),
            )
        })?;
        self.register()?;
        let before = self.ns.reservation_report()?;
        let holder = before
            .registrants
            .iter()
            .find(|r| r.holds_reservation)
            .map(|r| r.rkey);
        let we = ReservationType::WriteExclusive;
        match holder {
            Some(k) if k == self.key && before.rtype == we as u8 => {}
            None => self
                .ns
                .reservation_acquire(AcquireAction::Acquire, we, self.key, 0)
                .or_else(|e| self.unless_held(e))?,
            Some(k) => {
                self.ns
                    .reservation_acquire(AcquireAction::PreemptAndAbort, we, self.key, k)
                    .or_else(|e| self.unless_held(e))?;
                if k != self.key {
                    tracing::warn!(
                        "{name}: reservation taken from {} (key {k:#x}); its writes are \
                         refused by the drive from now on",
                        (self.namer)(k)
                    );
                }
            }
        }
        if !self.holds()? {
            return Err(io::Error::other(format!(
                "{name}: the Write Exclusive reservation was taken but the drive reports \
                 another holder; another server is taking this array's drives at the same \
                 time: check `tessera da ls`"
            )));
        }
        self.held.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Registers this node's key; a host still registered under an earlier incarnation's
    /// key replaces it. Persistence is asked for, and done without when the drive cannot.
    fn register(&self) -> io::Result<()> {
        let register = |persist| {
            self.ns
                .reservation_register(RegisterAction::Register, 0, self.key, false, persist)
                .or_else(|e| {
                    if !MultipathNamespace::is_reservation_conflict(&e) {
                        return Err(e);
                    }
                    self.ns.reservation_register(
                        RegisterAction::Replace,
                        0,
                        self.key,
                        true,
                        persist,
                    )
                })
        };
        match register(Some(true)) {
            Err(e) if nvme_status(&e).is_some_and(|s| s.code() == Status::INVALID_FIELD.code()) => {
                tracing::warn!(
                    "{}: the drive cannot persist reservations through a power loss; the \
                     fence of this array's earlier server lasts until the drive server \
                     restarts",
                    self.ns.name()
                );
                register(None)
            }
            r => r,
        }
    }

    /// A preempt retried on another path may find its work done; what counts is whether
    /// this node holds the reservation now.
    fn unless_held(&self, e: io::Error) -> io::Result<()> {
        if MultipathNamespace::is_reservation_conflict(&e) && self.holds()? {
            return Ok(());
        }
        Err(e)
    }

    fn holds(&self) -> io::Result<bool> {
        let report = self.ns.reservation_report()?;
        Ok(report.rtype == ReservationType::WriteExclusive as u8
            && report
                .registrants
                .iter()
                .any(|r| r.holds_reservation && r.rkey == self.key))
    }

    /// Runs a write-class command under the reservation.
    fn guarded(&self, op: impl Fn() -> io::Result<()>) -> io::Result<()> {
        if !self.held.load(Ordering::SeqCst) {
            self.take()?;
        }
        match op() {
            Err(e) if MultipathNamespace::is_reservation_conflict(&e) => {
                self.held.store(false, Ordering::SeqCst);
                self.take().map_err(|why| {
                    io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!(
                            "{}: fenced: another server holds this drive's reservation \
                             ({e}); {why}",
                            self.ns.name()
                        ),
                    )
                })?;
                op()
            }
            r => r,
        }
    }
}

/// Gives up this node's reservation and registration on `ns` (its array was deleted: the
/// drive is free for any use again). Failures are only logged: a drive that cannot be
/// reached keeps them until the next holder preempts them.
pub fn release(ns: &MultipathNamespace, key: u64) {
    let we = ReservationType::WriteExclusive;
    let released = ns
        .reservation_release(ReleaseAction::Release, we, key)
        .and_then(|()| ns.reservation_register(RegisterAction::Unregister, key, 0, false, None));
    if let Err(e) = released {
        if !MultipathNamespace::is_reservation_conflict(&e) {
            tracing::warn!("{}: reservation not released: {e}", ns.name());
        }
    }
}

impl std::fmt::Debug for ReservedPdisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReservedPdisk")
            .field("ns", &self.ns.name())
            .field("key", &format_args!("{:#x}", self.key))
            .finish_non_exhaustive()
    }
}

impl BlockDevice for ReservedPdisk {
    fn name(&self) -> &str {
        self.ns.name()
    }

    fn size_bytes(&self) -> u64 {
        self.ns.size_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.ns.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.guarded(|| self.ns.write_at(buf, offset))
    }

    fn write_fua(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.guarded(|| self.ns.write_fua(buf, offset))
    }

    fn flush(&self) -> io::Result<()> {
        self.guarded(|| self.ns.flush())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.guarded(|| self.ns.discard(offset, len))
    }

    fn can_discard(&self) -> bool {
        self.ns.can_discard()
    }

    fn discard_zeroes(&self) -> bool {
        self.ns.discard_zeroes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_node_and_incarnation_and_are_never_zero() {
        for (node, epoch) in [(1, 1), (2, 7), (4095, (1 << 40) - 1), (7, 123_456)] {
            let k = reservation_key(node, epoch);
            assert_ne!(k, 0);
            assert_eq!(key_owner(k), (node, epoch));
        }
        assert_ne!(reservation_key(1, 2), reservation_key(2, 1));
        assert_ne!(reservation_key(3, 1), reservation_key(3, 2));
    }

    use std::net::SocketAddr;
    use std::path::Path;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use tessera_drive::AlignedBuf;
    use tessera_nvme::host::{ConnectOptions, Host, HostIdentity};
    use tessera_nvme::target::config::TargetConfig;
    use tessera_nvme::target::DriveServer;

    const NQN: &str = "nqn.2024-01.io.tessera:fence-test";

    /// A drive server with one 16 MiB namespace for any host, reservations persisted in
    /// `dir/state`, listening on `port` (0: any).
    fn drive_server(dir: &Path, port: u16) -> DriveServer {
        let file = dir.join("drive.img");
        if !file.exists() {
            std::fs::File::create(&file)
                .unwrap()
                .set_len(16 << 20)
                .unwrap();
        }
        std::fs::create_dir_all(dir.join("state")).unwrap();
        let json = format!(
            r#"{{"hosts": [], "ports": [{{"portid": 1, "addr": {{"trtype": "tcp",
                "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": "{port}"}},
                "subsystems": ["{NQN}"], "ana_groups": [{{"grpid": 1, "ana": {{"state":
                "optimized"}}}}]}}], "subsystems": [{{"nqn": "{NQN}", "attr":
                {{"allow_any_host": "1"}}, "allowed_hosts": [], "namespaces": [{{"nsid": 1,
                "enable": 1, "ana_grpid": 1, "device": {{"path": "{}"}}}}]}}],
                "tessera": {{"state_dir": "{}"}}}}"#,
            file.display(),
            dir.join("state").display()
        );
        DriveServer::start(TargetConfig::from_json_str(&json).unwrap()).unwrap()
    }

    /// A server node: its own host, its namespace, whether it may take the drive.
    struct Server {
        _host: Host,
        pdisk: Arc<ReservedPdisk>,
        owns: Arc<AtomicBool>,
    }

    fn server(tag: u8, node: NodeNumber, addr: SocketAddr, owns: bool) -> Server {
        let host = Host::new(HostIdentity {
            nqn: format!("nqn.2024-01.io.tessera:server{tag}"),
            id: [tag; 16],
        });
        host.connect(ConnectOptions {
            ctrl_loss_tmo: Duration::from_secs(20),
            reconnect_delay: Duration::from_millis(100),
            ..ConnectOptions::new(addr, NQN)
        })
        .unwrap();
        let ns = host.namespace("nvme0n1").unwrap();
        let owns = Arc::new(AtomicBool::new(owns));
        let flag = Arc::clone(&owns);
        let may_take: TakeCheck = Arc::new(move || {
            if flag.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err("the array is served by another node".into())
            }
        });
        let namer: KeyNamer = Arc::new(|k| format!("{:?}", key_owner(k)));
        let pdisk = ReservedPdisk::open(ns, reservation_key(node, 1), may_take, namer);
        Server {
            _host: host,
            pdisk,
            owns,
        }
    }

    fn block(byte: u8) -> AlignedBuf {
        AlignedBuf::from_slice(&[byte; 4096])
    }

    fn on_drive(s: &Server) -> u8 {
        let mut buf = AlignedBuf::zeroed(4096);
        s.pdisk.read_at(&mut buf, 0).unwrap();
        buf[0]
    }

    /// The array's server writes; another server that is given the array preempts it, and
    /// from then on the drive refuses the first one's writes (nothing of them lands),
    /// also after the drive server restarts; given back, the first takes the drive again.
    #[test]
    fn the_server_given_an_array_fences_the_one_before_on_the_drive() {
        let dir = tempfile::tempdir().unwrap();
        let target = drive_server(dir.path(), 0);
        let addr = target.local_addrs()[0].1;
        let a = server(0xa, 1, addr, true);
        a.pdisk.write_at(&block(1), 0).unwrap();

        a.owns.store(false, Ordering::SeqCst);
        let b = server(0xb, 2, addr, true);
        assert_eq!(on_drive(&b), 1, "reads need no reservation");
        b.pdisk.write_at(&block(2), 0).unwrap();
        let err = a.pdisk.write_at(&block(3), 0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        assert!(err.to_string().contains("fenced"), "{err}");
        assert!(err.to_string().contains("served by another node"), "{err}");
        assert_eq!(on_drive(&b), 2, "a fenced write reached the drive");

        // The reservation is persisted: a restarted drive server still refuses A.
        target.shutdown();
        let target = drive_server(dir.path(), addr.port());
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while let Err(e) = b.pdisk.write_at(&block(4), 0) {
            assert!(
                std::time::Instant::now() < deadline,
                "B cannot write again: {e}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // A's path reconnects by itself; then its write is refused as before.
        loop {
            let err = a.pdisk.write_at(&block(5), 0).unwrap_err();
            if err.kind() == io::ErrorKind::PermissionDenied {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "A not fenced: {err}");
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(on_drive(&b), 4);

        // Given back (`da move`): A takes the drive again and B is the fenced one.
        b.owns.store(false, Ordering::SeqCst);
        a.owns.store(true, Ordering::SeqCst);
        a.pdisk.write_at(&block(6), 0).unwrap();
        let err = b.pdisk.write_at(&block(7), 0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        assert_eq!(on_drive(&a), 6);

        // The array is deleted: the drive is free for any host again.
        release(&a.pdisk.ns, a.pdisk.key);
        let report = a.pdisk.ns.reservation_report().unwrap();
        assert_eq!(report.rtype, 0, "{report:?}");
        target.shutdown();
    }
}
