//! NVM I/O commands against a namespace, run on a connection's drive I/O workers.
//!
//! Order of checks for a command naming a namespace: the namespace exists, its ANA group
//! is accessible through this port, the reservation allows this host, then the command's
//! own fields (range, transfer length). Drive errors map to media status: Unrecovered Read
//! Error for reads, Write Fault for everything that writes.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tessera_drive::AlignedBuf;

use super::ana::path_status;
use super::controller::{Controller, MDTS_BYTES};
use super::namespace::{IoWatch, Namespace, LBA_BYTES};
use super::reservation::Requester;
use crate::wire::command::{DatasetManagement, DsmRange, IoCommand, ReadWrite, WriteZeroes};
use crate::wire::reservation::{decode_release_data, KeyPair, ReservationReport};
use crate::wire::Status;

/// The outcome of an I/O command.
pub(crate) struct IoDone {
    pub status: Status,
    /// Data for the host (reads, Reservation Report): buffer and valid length.
    pub data: Option<(AlignedBuf, usize)>,
}

impl IoDone {
    fn status(status: Status) -> IoDone {
        IoDone { status, data: None }
    }

    fn ok() -> IoDone {
        IoDone::status(Status::SUCCESS)
    }
}

fn dnr(status: Status) -> IoDone {
    IoDone::status(status.with_dnr(true))
}

/// Host-to-controller data received with the command.
pub(crate) struct HostData {
    pub buf: AlignedBuf,
    pub len: usize,
}

impl HostData {
    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Executes `cmd`; `c2h_len` is the host's buffer for data it reads (the SGL length).
pub(crate) fn execute(
    ctrl: &Controller,
    cmd: &IoCommand,
    data: Option<&HostData>,
    c2h_len: usize,
) -> IoDone {
    if let IoCommand::Flush { nsid: 0xffff_ffff } = cmd {
        return flush_all(ctrl);
    }
    let nsid = command_nsid(cmd);
    let Some(ns) = ctrl.subsys.namespaces.get(&nsid) else {
        return dnr(Status::INVALID_NAMESPACE);
    };
    if let Some(status) = path_status(ctrl.port.ana.state(ns.ana_grpid)) {
        return IoDone::status(status);
    }
    let done = dispatch(ctrl, ns, cmd, data, c2h_len);
    if !done.status.is_success() {
        ns.count(&ns.counters.errors, 1);
    }
    done
}

fn dispatch(
    ctrl: &Controller,
    ns: &Arc<Namespace>,
    cmd: &IoCommand,
    data: Option<&HostData>,
    c2h_len: usize,
) -> IoDone {
    let write_class = matches!(
        cmd,
        IoCommand::Write(_)
            | IoCommand::WriteZeroes(_)
            | IoCommand::DatasetManagement(_)
            | IoCommand::Flush { .. }
    );
    if write_class {
        if let Err(status) = check_fence(ctrl) {
            return IoDone::status(status);
        }
    }
    if write_class || matches!(cmd, IoCommand::Read(_)) {
        if let Err(status) = ns
            .reservation
            .lock()
            .check_access(&ctrl.hostid, write_class)
        {
            return IoDone::status(status);
        }
    }
    let who = Requester {
        hostid: ctrl.hostid,
        cntlid: ctrl.cntlid,
    };
    match cmd {
        IoCommand::Read(rw) => {
            let watch = watch_rw(ctrl, ns, rw, false, c2h_len);
            let done = read(ns, rw, c2h_len);
            watch.end(done.status.is_success());
            done
        }
        IoCommand::Write(rw) => {
            let watch = watch_rw(ctrl, ns, rw, true, data.map_or(0, |d| d.len));
            let done = write(ctrl, ns, rw, data);
            watch.end(done.status.is_success());
            done
        }
        IoCommand::Flush { .. } => flush(ns),
        IoCommand::WriteZeroes(wz) => write_zeroes(ctrl, ns, wz),
        IoCommand::DatasetManagement(dsm) => deallocate(ns, dsm, data),
        IoCommand::ReservationRegister(r) => with_keys(ns, data, |s, k| {
            s.register(who, r.action, r.iekey, r.cptpl, k.crkey, k.second)
        }),
        IoCommand::ReservationAcquire(a) => with_keys(ns, data, |s, k| {
            s.acquire(who, a.action, a.iekey, a.rtype, k.crkey, k.second)
        }),
        IoCommand::ReservationRelease(r) => release(ns, who, r, data),
        IoCommand::ReservationReport(r) => report(ns, r, c2h_len),
    }
}

/// The observed drive I/O of a Read or Write run here; nothing is observed of one outside
/// the namespace, which is refused before it reaches the drive (its LBA may not even make
/// an offset).
fn watch_rw(ctrl: &Controller, ns: &Namespace, rw: &ReadWrite, write: bool, len: usize) -> IoWatch {
    match rw.slba.checked_mul(LBA_BYTES) {
        Some(offset) if ns.in_range(rw.slba, u64::from(rw.blocks())) => {
            IoWatch::start(ns, write, offset, len, &ctrl.hostnqn)
        }
        _ => IoWatch::default(),
    }
}

fn command_nsid(cmd: &IoCommand) -> u32 {
    match cmd {
        IoCommand::Flush { nsid } => *nsid,
        IoCommand::Read(rw) | IoCommand::Write(rw) => rw.nsid,
        IoCommand::WriteZeroes(wz) => wz.nsid,
        IoCommand::DatasetManagement(d) => d.nsid,
        IoCommand::ReservationRegister(r) => r.nsid,
        IoCommand::ReservationAcquire(a) => a.nsid,
        IoCommand::ReservationRelease(r) => r.nsid,
        IoCommand::ReservationReport(r) => r.nsid,
    }
}

/// Checks range and MDTS; returns the transfer length in bytes.
fn transfer(ns: &Namespace, rw: &ReadWrite) -> Result<usize, IoDone> {
    let blocks = u64::from(rw.blocks());
    let bytes = blocks * LBA_BYTES;
    if bytes > u64::from(MDTS_BYTES) {
        return Err(dnr(Status::INVALID_FIELD));
    }
    if !ns.in_range(rw.slba, blocks) {
        return Err(dnr(Status::LBA_OUT_OF_RANGE));
    }
    Ok(bytes as usize)
}

/// A Read that passed every check and may go to the drive asynchronously.
pub(crate) struct ReadPlan {
    pub ns: Arc<Namespace>,
    pub offset: u64,
    pub len: usize,
    pub watch: IoWatch,
}

/// Runs the checks [`execute`] runs for a Read, in the same order and with the same
/// counting, without touching the drive: either the read to issue or its failure.
pub(crate) fn plan_read(
    ctrl: &Controller,
    rw: &ReadWrite,
    c2h_len: usize,
) -> Result<ReadPlan, IoDone> {
    let (ns, len) = check_transfer(ctrl, rw, false, c2h_len)?;
    let offset = rw.slba * LBA_BYTES;
    Ok(ReadPlan {
        watch: IoWatch::start(&ns, false, offset, len, &ctrl.hostnqn),
        ns,
        offset,
        len,
    })
}

/// A Write that passed every check and may go to the drive asynchronously: piece by
/// piece as its data arrives (`connection.rs`, `WriteStream`), or through the
/// connection's ring (`uring.rs`).
pub(crate) struct WritePlan {
    pub ns: Arc<Namespace>,
    pub offset: u64,
    pub len: usize,
    /// FUA, or the volatile write cache is off: flush once every piece is written.
    pub flush: bool,
    pub watch: IoWatch,
}

/// Runs the checks [`execute`] runs for a Write of `data_len` bytes, in the same order,
/// without touching the drive.
pub(crate) fn plan_write(
    ctrl: &Controller,
    rw: &ReadWrite,
    data_len: usize,
) -> Result<WritePlan, IoDone> {
    let (ns, len) = check_transfer(ctrl, rw, true, data_len)?;
    let offset = rw.slba * LBA_BYTES;
    Ok(WritePlan {
        watch: IoWatch::start(&ns, true, offset, len, &ctrl.hostnqn),
        ns,
        offset,
        len,
        flush: rw.fua || !ctrl.vwc_enabled.load(Ordering::Relaxed),
    })
}

/// The checks of a Read or Write that goes to the drive asynchronously, in the order
/// [`execute`] applies them: namespace, the path's ANA state, reservation, range and
/// MDTS, and the transfer length the host gave. A failure is counted on the namespace.
fn check_transfer(
    ctrl: &Controller,
    rw: &ReadWrite,
    write: bool,
    data_len: usize,
) -> Result<(Arc<Namespace>, usize), IoDone> {
    let Some(ns) = ctrl.subsys.namespaces.get(&rw.nsid) else {
        return Err(dnr(Status::INVALID_NAMESPACE));
    };
    if let Some(status) = path_status(ctrl.port.ana.state(ns.ana_grpid)) {
        return Err(IoDone::status(status));
    }
    let fence = if write { check_fence(ctrl) } else { Ok(()) };
    let checked = fence
        .and_then(|()| ns.reservation.lock().check_access(&ctrl.hostid, write))
        .map_err(IoDone::status)
        .and_then(|()| transfer(ns, rw))
        .and_then(|len| {
            if data_len == len {
                Ok(len)
            } else {
                Err(dnr(Status::DATA_SGL_LENGTH_INVALID))
            }
        });
    match checked {
        Ok(len) => Ok((Arc::clone(ns), len)),
        Err(done) => {
            ns.count(&ns.counters.errors, 1);
            Err(done)
        }
    }
}

/// A fenced host's write: Reservation Conflict, which a host's multipath does not retry
/// on another path (the host itself, not the path, is refused). Logged once per controller.
fn check_fence(ctrl: &Controller) -> Result<(), Status> {
    if !ctrl.fenced.load(Ordering::Relaxed) {
        return Ok(());
    }
    if !ctrl.fence_logged.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            cntlid = ctrl.cntlid,
            hostnqn = %ctrl.hostnqn,
            subnqn = %ctrl.subsys.nqn,
            "write from a fenced host refused (its cluster gave up on it); later ones are \
             refused without a log line"
        );
    }
    Err(Status::RESERVATION_CONFLICT)
}

/// Finishes a planned write whose pieces all reached the drive (`failed` is `None`) or
/// did not: flushes when the plan asks for it and counts, failures included (planned
/// writes do not pass through [`execute`], which counts the others).
pub(crate) fn write_done(plan: &WritePlan, failed: Option<Status>) -> Status {
    let status = finish_write(&plan.ns, plan.len, plan.flush, failed);
    plan.watch.end(status.is_success());
    if !status.is_success() {
        plan.ns.count(&plan.ns.counters.errors, 1);
    }
    status
}

/// A drive write that failed: logged, and a Write Fault for the host.
pub(crate) fn write_fault(ns: &Namespace, offset: u64, e: &std::io::Error) -> Status {
    let slba = offset / LBA_BYTES;
    if out_of_space(e) {
        // A sparse file (or thin volume) whose file system filled up: the namespace is
        // thin provisioned and out of capacity, which the host can tell from a bad drive.
        tracing::warn!(
            nsid = ns.nsid,
            slba,
            "write failed: {e}: the backing store of {} is full; free space on it or \
             deallocate (trim) unused blocks",
            ns.dev.name()
        );
        return Status::CAPACITY_EXCEEDED.with_dnr(true);
    }
    tracing::warn!(nsid = ns.nsid, slba, "write failed: {e}");
    Status::WRITE_FAULT.with_dnr(true)
}

/// ENOSPC or EDQUOT, also when a device wrapped the OS error with its name.
fn out_of_space(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
        || matches!(
            e.kind(),
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
        )
}

/// Completes a write whose data reached the drive (`failed` is `None`) or did not:
/// flushes when `flush` (FUA, or the volatile write cache off) and counts the success.
fn finish_write(ns: &Namespace, len: usize, flush: bool, failed: Option<Status>) -> Status {
    let status = match failed {
        Some(status) => status,
        None if flush => match ns.flush() {
            Ok(()) => Status::SUCCESS,
            Err(e) => {
                tracing::warn!(nsid = ns.nsid, "flush after FUA write failed: {e}");
                Status::WRITE_FAULT.with_dnr(true)
            }
        },
        None => Status::SUCCESS,
    };
    if status.is_success() {
        ns.count(&ns.counters.writes, 1);
        ns.count(&ns.counters.write_bytes, len as u64);
    }
    status
}

/// Accounts for a planned read the drive finished: `Ok` when all of it was read.
pub(crate) fn read_done(plan: &ReadPlan, result: std::io::Result<()>) -> Status {
    let ns = &plan.ns;
    plan.watch.end(result.is_ok());
    if let Err(e) = result {
        let slba = plan.offset / LBA_BYTES;
        tracing::warn!(nsid = ns.nsid, slba, "read failed: {e}");
        ns.count(&ns.counters.errors, 1);
        return Status::UNRECOVERED_READ_ERROR.with_dnr(true);
    }
    ns.count(&ns.counters.reads, 1);
    ns.count(&ns.counters.read_bytes, plan.len as u64);
    Status::SUCCESS
}

fn read(ns: &Namespace, rw: &ReadWrite, c2h_len: usize) -> IoDone {
    let len = match transfer(ns, rw) {
        Ok(len) => len,
        Err(done) => return done,
    };
    if c2h_len != len {
        return dnr(Status::DATA_SGL_LENGTH_INVALID);
    }
    let mut buf = super::buffers::take(len);
    if let Err(e) = ns.dev.read_at(&mut buf[..len], rw.slba * LBA_BYTES) {
        tracing::warn!(nsid = ns.nsid, slba = rw.slba, "read failed: {e}");
        super::buffers::give(buf);
        return dnr(Status::UNRECOVERED_READ_ERROR);
    }
    ns.count(&ns.counters.reads, 1);
    ns.count(&ns.counters.read_bytes, len as u64);
    IoDone {
        status: Status::SUCCESS,
        data: Some((buf, len)),
    }
}

fn write(ctrl: &Controller, ns: &Namespace, rw: &ReadWrite, data: Option<&HostData>) -> IoDone {
    let len = match transfer(ns, rw) {
        Ok(len) => len,
        Err(done) => return done,
    };
    let Some(data) = data.filter(|d| d.len == len) else {
        return dnr(Status::DATA_SGL_LENGTH_INVALID);
    };
    let offset = rw.slba * LBA_BYTES;
    // FUA (or no volatile cache): the drive writes these bytes through, which costs it one
    // sync of this range and makes a flush of everything else unnecessary.
    let through = rw.fua || !ctrl.vwc_enabled.load(Ordering::Relaxed);
    let written = if through {
        ns.dev.write_fua(data.bytes(), offset)
    } else {
        ns.dev.write_at(data.bytes(), offset)
    };
    let failed = written.err().map(|e| write_fault(ns, offset, &e));
    IoDone::status(finish_write(ns, len, false, failed))
}

fn flush(ns: &Namespace) -> IoDone {
    ns.count(&ns.counters.other, 1);
    match ns.flush() {
        Ok(()) => IoDone::ok(),
        Err(e) => {
            tracing::warn!(nsid = ns.nsid, "flush failed: {e}");
            dnr(Status::WRITE_FAULT)
        }
    }
}

fn flush_all(ctrl: &Controller) -> IoDone {
    for ns in ctrl.subsys.namespaces.values() {
        if path_status(ctrl.port.ana.state(ns.ana_grpid)).is_some() {
            continue;
        }
        let done = flush(ns);
        if !done.status.is_success() {
            return done;
        }
    }
    IoDone::ok()
}

fn write_zeroes(ctrl: &Controller, ns: &Namespace, wz: &WriteZeroes) -> IoDone {
    let blocks = u64::from(wz.blocks());
    if !ns.in_range(wz.slba, blocks) {
        return dnr(Status::LBA_OUT_OF_RANGE);
    }
    ns.count(&ns.counters.other, 1);
    if let Err(e) = ns.write_zeroes(wz.slba, blocks, wz.deallocate) {
        return IoDone::status(write_fault(ns, wz.slba * LBA_BYTES, &e));
    }
    if wz.fua || !ctrl.vwc_enabled.load(Ordering::Relaxed) {
        return flush(ns);
    }
    IoDone::ok()
}

fn deallocate(ns: &Namespace, dsm: &DatasetManagement, data: Option<&HostData>) -> IoDone {
    ns.count(&ns.counters.other, 1);
    let bytes = data.map_or(&[][..], HostData::bytes);
    let ranges = match DsmRange::decode_list(bytes, dsm.range_count()) {
        Ok(r) => r,
        Err(e) => return IoDone::status(e.status()),
    };
    if ranges
        .iter()
        .any(|r| !ns.in_range(r.slba, u64::from(r.nlb)))
    {
        return dnr(Status::LBA_OUT_OF_RANGE);
    }
    if !dsm.deallocate {
        // Only attribute hints (IDR/IDW): nothing to do.
        return IoDone::ok();
    }
    for r in ranges.iter().filter(|r| r.nlb > 0) {
        if let Err(e) = ns.deallocate(r.slba, u64::from(r.nlb)) {
            tracing::warn!(nsid = ns.nsid, slba = r.slba, "deallocate failed: {e}");
            return dnr(Status::WRITE_FAULT);
        }
    }
    IoDone::ok()
}

fn with_keys(
    ns: &Namespace,
    data: Option<&HostData>,
    op: impl FnOnce(&mut super::reservation::ReservationState, KeyPair) -> Result<(), Status>,
) -> IoDone {
    ns.count(&ns.counters.other, 1);
    let keys = match KeyPair::decode(data.map_or(&[][..], HostData::bytes)) {
        Ok(k) => k,
        Err(e) => return IoDone::status(e.status()),
    };
    match ns.reservation.update(|s| op(s, keys)) {
        Ok(()) => IoDone::ok(),
        Err(status) => IoDone::status(status),
    }
}

fn release(
    ns: &Namespace,
    who: Requester,
    r: &crate::wire::reservation::ReservationRelease,
    data: Option<&HostData>,
) -> IoDone {
    ns.count(&ns.counters.other, 1);
    let crkey = match decode_release_data(data.map_or(&[][..], HostData::bytes)) {
        Ok(k) => k,
        Err(e) => return IoDone::status(e.status()),
    };
    match ns
        .reservation
        .update(|s| s.release(who, r.action, r.iekey, r.rtype, crkey))
    {
        Ok(()) => IoDone::ok(),
        Err(status) => IoDone::status(status),
    }
}

/// Reservation Report. Over Fabrics every host identifier is 128 bits (Connect carries 16
/// bytes), and only the extended layout (EDS) holds one whole. A report without EDS is
/// therefore refused with Host Identifier Inconsistent Format, as the base specification
/// requires of a controller whose hosts use 128-bit identifiers; Linux's host and nvme-cli
/// ask with EDS first.
fn report(ns: &Namespace, r: &ReservationReport, c2h_len: usize) -> IoDone {
    ns.count(&ns.counters.other, 1);
    if !r.eds {
        return IoDone::status(Status::HOST_ID_INCONSISTENT_FORMAT.with_dnr(true));
    }
    let encoded = ns.reservation.lock().report().encode(r.eds);
    let len = (r.len_bytes().min(MDTS_BYTES.into()) as usize).min(c2h_len);
    let mut buf = AlignedBuf::zeroed(len);
    let n = encoded.len().min(len);
    buf[..n].copy_from_slice(&encoded[..n]);
    IoDone {
        status: Status::SUCCESS,
        data: Some((buf, len)),
    }
}
