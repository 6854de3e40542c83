//! One TCP connection = one queue: the ICReq/ICResp handshake, then the command loop.
//!
//! The connection's thread reads every PDU. Fabrics and admin commands run right there
//! (they are short). I/O commands go to the connection's worker pool, so the drive sees
//! as many commands at once as the host queues (up to `io_threads_per_queue`), which is
//! what lets a QD32 stream on one queue keep 32 drive I/Os in flight. Write data not sent
//! in the capsule is pulled with R2T (one R2T at a time per command, at most MAXH2CDATA
//! each, which every host accepts whatever its MAXR2T) and gathered by this thread into an
//! aligned buffer before the command is queued. Responses are written by whichever thread
//! completes the command, serialised by [`ConnWriter`]; read data and its CapsuleResp go
//! out in one vectored write.
//!
//! Reads of namespaces whose device the server opened itself skip the pool: this thread
//! queues them on the connection's io_uring and completes them while it waits for the
//! socket (`super::uring`), answering all reads that finished together in one write. When
//! the host disabled SQ flow control at Connect, a successful read's C2HData carries the
//! SUCCESS flag and no CapsuleResp follows it.
//!
//! Fatal transport errors (malformed PDUs, header digest errors, data outside the R2T)
//! answer with a C2HTermReq and close the connection; a data digest error completes the
//! command with Transient Transport Error and the connection continues.

use std::collections::{HashMap, VecDeque};
use std::io::{BufReader, IoSlice};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tessera_drive::AlignedBuf;

use super::controller::{Controller, NewController, Reply, ADMIN_INLINE_BYTES, MDTS_BYTES};
use super::io::{self, HostData};
use super::namespace::LBA_BYTES;
use super::server::{Port, ServerShared};
use super::uring::Socket;
use crate::wire::command::{IoCommand, SglKind};
use crate::wire::fabrics::{
    connect_invalid_parameter_dw0, Connect, ConnectData, FabricsCommand,
    CATTR_DISABLE_SQ_FLOW_CONTROL, CNTLID_DYNAMIC,
};
use crate::wire::pdu::{encode_header, write_all_vectored, IC_PDU_BYTES};
use crate::wire::{
    Command, Cqe, DataHeader, DigestConfig, IcResp, InboundPdu, Pdu, PduError, PduHeader,
    PduReader, PduType, QueueKind, R2t, Side, Sqe, Status,
};

/// How long a new connection may take to send ICReq and Connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Socket read buffer: PDU headers arrive in small reads; large data bypasses it.
const READ_BUFFER_BYTES: usize = 64 * 1024;
const LBA_BYTES_U32: u32 = LBA_BYTES as u32;
/// Room for a PDU's header, digests and padding on top of its data.
const PDU_OVERHEAD_BYTES: u32 = 256;

/// Serialises PDUs onto the socket for the reader thread and the workers.
#[derive(Debug)]
pub(crate) struct ConnWriter {
    inner: Mutex<WriterInner>,
    sqid: AtomicU16,
    sq_head: AtomicU16,
    /// The host disabled SQ flow control at Connect, so a read's C2HData may carry
    /// SUCCESS and stand for its completion (NVMe/TCP 3.6.2.8): one PDU less per read.
    data_success: AtomicBool,
    port: Arc<Port>,
}

#[derive(Debug)]
struct WriterInner {
    stream: TcpStream,
    digests: DigestConfig,
    broken: bool,
}

impl ConnWriter {
    fn cqe(&self, cid: u16, status: Status, dw0: u32, dw1: u32) -> Cqe {
        Cqe {
            dw0,
            dw1,
            sqhd: self.sq_head.load(Ordering::Relaxed),
            sqid: self.sqid.load(Ordering::Relaxed),
            cid,
            phase: false,
            status,
        }
    }

    /// Completes command `cid` without data.
    pub fn respond(&self, cid: u16, status: Status, dw0: u32, dw1: u32) {
        self.respond_data(cid, &[], status, dw0, dw1);
    }

    /// Sends `data` (if any) as one C2HData PDU and then the completion, in one write.
    pub fn respond_data(&self, cid: u16, data: &[u8], status: Status, dw0: u32, dw1: u32) {
        let counters = &self.port.counters;
        if !status.is_success() {
            counters.errors.fetch_add(1, Ordering::Relaxed);
        }
        let resp = PduHeader::CapsuleResp(self.cqe(cid, status, dw0, dw1));
        if data.is_empty() {
            self.send(&[(&resp, &[])]);
            return;
        }
        counters
            .read_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        if self.implied_completion(status, dw0, dw1) {
            let c2h = PduHeader::C2HData(DataHeader::c2h(cid, 0, len, true, true));
            self.send(&[(&c2h, data)]);
            return;
        }
        let c2h = PduHeader::C2HData(DataHeader::c2h(cid, 0, len, true, false));
        self.send(&[(&c2h, data), (&resp, &[])]);
    }

    /// Whether a C2HData with SUCCESS can replace this completion: only a plain success
    /// (nothing in DW0/DW1) when the host disabled SQ flow control.
    fn implied_completion(&self, status: Status, dw0: u32, dw1: u32) -> bool {
        status == Status::SUCCESS
            && dw0 == 0
            && dw1 == 0
            && self.data_success.load(Ordering::Relaxed)
    }

    fn send_pdu(&self, header: &PduHeader, data: &[u8]) {
        self.send(&[(header, data)]);
    }

    /// Sends read data in one write: `(cid, offset, data, completion)` per piece, in order;
    /// `completion` is the command's status on its final piece (whose data is empty when
    /// the read failed): that piece carries LAST (and SUCCESS when the host allows it),
    /// else the completion follows as a response capsule.
    pub fn respond_read_pieces(&self, pieces: &[(u16, u32, &[u8], Option<Status>)]) {
        let counters = &self.port.counters;
        let mut headers = Vec::with_capacity(pieces.len() + 1);
        for &(cid, offset, data, completion) in pieces {
            let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
            let Some(status) = completion else {
                counters
                    .read_bytes
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                let c2h = DataHeader::c2h(cid, offset, len, false, false);
                headers.push((PduHeader::C2HData(c2h), data));
                continue;
            };
            if status.is_success() && !data.is_empty() {
                counters
                    .read_bytes
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                let success = self.implied_completion(status, 0, 0);
                let c2h = DataHeader::c2h(cid, offset, len, true, success);
                headers.push((PduHeader::C2HData(c2h), data));
                if success {
                    continue;
                }
            }
            if !status.is_success() {
                counters.errors.fetch_add(1, Ordering::Relaxed);
            }
            let resp = PduHeader::CapsuleResp(self.cqe(cid, status, 0, 0));
            headers.push((resp, &[][..]));
        }
        let pdus: Vec<(&PduHeader, &[u8])> = headers.iter().map(|(h, d)| (h, *d)).collect();
        self.send(&pdus);
    }

    /// Writes PDUs back to back; a failed write marks the connection broken and shuts
    /// the socket so the reader thread ends it.
    fn send(&self, pdus: &[(&PduHeader, &[u8])]) {
        let mut inner = self.inner.lock();
        if inner.broken {
            return;
        }
        let cfg = inner.digests;
        let mut heads = Vec::with_capacity(pdus.len());
        let mut digests = Vec::with_capacity(pdus.len());
        for (header, data) in pdus {
            match encode_header(header, data.len(), &cfg) {
                Ok(h) => {
                    digests.push(
                        h.has_data_digest()
                            .then(|| crc32c::crc32c(data).to_le_bytes()),
                    );
                    heads.push(h);
                }
                Err(e) => {
                    tracing::error!("cannot encode {}: {e}", header.pdu_type());
                    return;
                }
            }
        }
        let mut slices = Vec::with_capacity(pdus.len() * 3);
        for ((head, (_, data)), digest) in heads.iter().zip(pdus).zip(&digests) {
            slices.push(IoSlice::new(head.as_bytes()));
            slices.push(IoSlice::new(data));
            if let Some(d) = digest {
                slices.push(IoSlice::new(d));
            }
        }
        if let Err(e) = write_all_vectored(&mut inner.stream, &mut slices) {
            tracing::debug!("connection write failed: {e}");
            inner.broken = true;
            let _ = inner.stream.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Marks the connection broken and shuts its socket: the reader thread then ends it.
    pub(crate) fn shutdown(&self) {
        let mut inner = self.inner.lock();
        inner.broken = true;
        let _ = inner.stream.shutdown(std::net::Shutdown::Both);
    }
}

type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct PoolQueue {
    jobs: VecDeque<Job>,
    idle: usize,
    closed: bool,
}

#[derive(Default)]
struct PoolShared {
    queue: Mutex<PoolQueue>,
    ready: Condvar,
}

/// The drive I/O workers of one queue: started on demand up to `max`, ended with the
/// connection.
struct Pool {
    shared: Arc<PoolShared>,
    threads: Vec<JoinHandle<()>>,
    max: usize,
}

impl Pool {
    fn new(max: usize) -> Pool {
        Pool {
            shared: Arc::default(),
            threads: Vec::new(),
            max: max.max(1),
        }
    }

    fn submit(&mut self, job: Job) {
        let spawn = {
            let mut q = self.shared.queue.lock();
            q.jobs.push_back(job);
            q.idle == 0 && self.threads.len() < self.max
        };
        if spawn {
            let shared = Arc::clone(&self.shared);
            let t = std::thread::Builder::new()
                .name("nvmet-io".into())
                .spawn(move || worker(&shared));
            match t {
                Ok(t) => self.threads.push(t),
                Err(e) => tracing::warn!("cannot start I/O worker: {e}"),
            }
        }
        self.shared.ready.notify_one();
        if self.threads.is_empty() {
            // Could not start any worker: run the job here rather than never.
            let job = self.shared.queue.lock().jobs.pop_front();
            if let Some(job) = job {
                job();
            }
        }
    }

    fn close(self) {
        self.shared.queue.lock().closed = true;
        self.shared.ready.notify_all();
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn worker(shared: &PoolShared) {
    loop {
        let job = {
            let mut q = shared.queue.lock();
            loop {
                if let Some(job) = q.jobs.pop_front() {
                    break Some(job);
                }
                if q.closed {
                    break None;
                }
                q.idle += 1;
                shared.ready.wait(&mut q);
                q.idle -= 1;
            }
        };
        match job {
            Some(job) => job(),
            None => return,
        }
    }
}

/// How a connection ends.
enum End {
    /// The peer closed it (or it was shut down locally).
    Closed,
    /// A transport error: send a C2HTermReq, then close.
    Fatal(PduError),
    /// Close without a TermReq, for the given reason.
    Quiet(&'static str),
}

impl From<PduError> for End {
    fn from(e: PduError) -> End {
        match e {
            PduError::Closed | PduError::Truncated { .. } | PduError::Io(_) => End::Closed,
            e => End::Fatal(e),
        }
    }
}

/// The queue this connection carries, after Connect.
struct Queue {
    qid: u16,
    entries: u32,
    ctrl: Arc<Controller>,
}

/// A write whose data is being pulled with R2T.
struct PendingWrite {
    sqe: Sqe,
    cmd: Command,
    buf: AlignedBuf,
    total: u32,
    received: u32,
    r2t_end: u32,
    failed: Option<Status>,
    /// Set when the data goes to the drive piece by piece as it arrives; `buf` is then
    /// empty and the data lives in the stream.
    stream: Option<Arc<WriteStream>>,
    /// Bytes of the stream handed to the drive so far.
    dispatched: u32,
}

/// Data of a Write arriving in several H2CData PDUs is written to the drive as it comes,
/// in pieces of at least [`STREAM_PIECE_BYTES`], while the next PDUs are still on the wire:
/// at queue depth 1 the transfer then overlaps the drive write instead of preceding it.
/// The command completes when the last piece is written (and flushed, for FUA).
///
/// The buffer is shared between the connection thread, which receives into the part not
/// yet handed out, and the workers, which write the parts handed to them: the parts never
/// overlap, and a part is handed to a worker (through the pool's lock) only after the
/// connection thread has finished receiving into it.
struct WriteStream {
    plan: io::WritePlan,
    cid: u16,
    /// Owns the memory; only ever reached through `base`, after creation.
    _buf: AlignedBuf,
    base: *mut u8,
    /// Bytes not yet written to the drive or given up on, plus one for the end of
    /// reception; whoever takes it to zero completes the command.
    remaining: AtomicUsize,
    failed: Mutex<Option<Status>>,
}

impl Drop for WriteStream {
    fn drop(&mut self) {
        super::buffers::give(std::mem::replace(&mut self._buf, AlignedBuf::zeroed(0)));
    }
}

// SAFETY: the buffer is only reached through `base`, in disjoint ranges, as explained
// above; every other field is Send and Sync.
unsafe impl Send for WriteStream {}
unsafe impl Sync for WriteStream {}

/// Smallest part of a streamed write handed to the drive at once.
const STREAM_PIECE_BYTES: u32 = 256 << 10;

impl WriteStream {
    /// The part `range` of the buffer for receiving into.
    ///
    /// # Safety
    /// Only the connection thread calls this, for bytes not yet handed to a worker.
    #[allow(clippy::mut_from_ref)]
    unsafe fn receive_part(&self, range: std::ops::Range<usize>) -> &mut [u8] {
        assert!(range.start <= range.end && range.end <= self.plan.len);
        std::slice::from_raw_parts_mut(self.base.add(range.start), range.len())
    }

    /// The part `range` of the buffer for writing to the drive.
    ///
    /// # Safety
    /// Only for bytes handed to the caller, which the connection thread no longer touches.
    unsafe fn handed_part(&self, range: std::ops::Range<usize>) -> &[u8] {
        assert!(range.start <= range.end && range.end <= self.plan.len);
        std::slice::from_raw_parts(self.base.add(range.start), range.len())
    }

    /// Accounts for `bytes` written (or given up on with `failure`); the call that
    /// accounts for the last byte completes the command.
    fn settle(
        &self,
        bytes: usize,
        failure: Option<Status>,
        writer: &ConnWriter,
        inflight: &AtomicUsize,
    ) {
        if let Some(status) = failure {
            self.failed.lock().get_or_insert(status);
        }
        if self.remaining.fetch_sub(bytes, Ordering::AcqRel) != bytes {
            return;
        }
        let failed = *self.failed.lock();
        let status = io::write_done(&self.plan, failed);
        inflight.fetch_sub(1, Ordering::SeqCst);
        writer.respond(self.cid, status, 0, 0);
    }
}

struct Conn {
    shared: Arc<ServerShared>,
    port: Arc<Port>,
    peer: SocketAddr,
    stream: TcpStream,
    rd: BufReader<Socket>,
    reader: PduReader,
    writer: Arc<ConnWriter>,
    maxh2cdata: u32,
    queue: Option<Queue>,
    pending: HashMap<u16, PendingWrite>,
    next_ttag: u16,
    pool: Option<Pool>,
    inflight: Arc<AtomicUsize>,
    sq_head: u32,
}

/// Serves one accepted connection until it ends.
pub(crate) fn serve(
    shared: &Arc<ServerShared>,
    port: &Arc<Port>,
    stream: TcpStream,
    _id: u64,
    peer: SocketAddr,
) {
    let mut conn = match Conn::handshake(shared, port, stream, peer) {
        Ok(conn) => conn,
        Err(why) => {
            tracing::info!(portid = port.portid(), %peer, "connection refused at ICReq: {why}");
            return;
        }
    };
    let end = conn.run();
    conn.finish(end);
}

/// Sends the TermReq for `err` (if it calls for one).
fn terminate(stream: &mut TcpStream, reader: &PduReader, err: &PduError, cfg: &DigestConfig) {
    if let Some(term) = reader.termination(err) {
        let _ = term.write_to(stream, cfg);
    }
}

impl Conn {
    fn handshake(
        shared: &Arc<ServerShared>,
        port: &Arc<Port>,
        mut stream: TcpStream,
        peer: SocketAddr,
    ) -> Result<Conn, String> {
        let clone = |s: &TcpStream| s.try_clone().map_err(|e| e.to_string());
        stream
            .set_read_timeout(Some(CONNECT_TIMEOUT))
            .map_err(|e| e.to_string())?;
        let mut rd = BufReader::with_capacity(READ_BUFFER_BYTES, Socket::new(clone(&stream)?));
        let mut reader = PduReader::new(Side::Controller, IC_PDU_BYTES as u32, DigestConfig::NONE);
        let none = DigestConfig::NONE;
        let ic = match reader.read_header(&mut rd).map(|p| p.header) {
            Ok(PduHeader::IcReq(ic)) => ic,
            Ok(other) => {
                let pdu_type = other.pdu_type();
                let err = PduError::Sequence {
                    pdu_type,
                    reason: "the first PDU must be ICReq",
                };
                terminate(&mut stream, &reader, &err, &none);
                return Err(err.to_string());
            }
            Err(err) => {
                terminate(&mut stream, &reader, &err, &none);
                return Err(err.to_string());
            }
        };
        let maxh2cdata = shared.limits.maxh2cdata_bytes;
        let resp = IcResp {
            pfv: 0,
            cpda: 0,
            hdgst: ic.hdgst,
            ddgst: ic.ddgst,
            maxh2cdata,
        };
        Pdu::new(PduHeader::IcResp(resp))
            .write_to(&mut stream, &none)
            .map_err(|e| e.to_string())?;
        let digests = DigestConfig::after_handshake(&ic, &resp, Side::Controller);
        let inline_max = port.cfg.inline_data_bytes.max(ADMIN_INLINE_BYTES);
        let max_pdu = maxh2cdata.max(inline_max) + PDU_OVERHEAD_BYTES;
        let reader = PduReader::new(Side::Controller, max_pdu, digests.receive);
        let writer = Arc::new(ConnWriter {
            inner: Mutex::new(WriterInner {
                stream: clone(&stream)?,
                digests: digests.send,
                broken: false,
            }),
            sqid: AtomicU16::new(0),
            sq_head: AtomicU16::new(0),
            data_success: AtomicBool::new(false),
            port: Arc::clone(port),
        });
        Ok(Conn {
            shared: Arc::clone(shared),
            port: Arc::clone(port),
            peer,
            stream,
            rd,
            reader,
            writer,
            maxh2cdata,
            queue: None,
            pending: HashMap::new(),
            next_ttag: 0,
            pool: None,
            inflight: Arc::new(AtomicUsize::new(0)),
            sq_head: 0,
        })
    }

    fn run(&mut self) -> End {
        loop {
            let pdu = match self.reader.read_header(&mut self.rd) {
                Ok(pdu) => pdu,
                Err(e) => return e.into(),
            };
            let result = match pdu.header {
                PduHeader::CapsuleCmd(sqe) => self.on_capsule(sqe, &pdu),
                PduHeader::H2CData(h) => self.on_h2c(h, &pdu),
                PduHeader::H2CTermReq(t) => {
                    tracing::warn!(peer = %self.peer, fes = t.fes, fei = t.fei, "host terminated the connection");
                    Err(End::Quiet("H2CTermReq"))
                }
                other => Err(End::Fatal(PduError::Sequence {
                    pdu_type: other.pdu_type(),
                    reason: "not allowed after the handshake",
                })),
            };
            if let Err(end) = result {
                return end;
            }
        }
    }

    fn finish(mut self, end: End) {
        match &end {
            End::Fatal(e) => {
                tracing::warn!(peer = %self.peer, portid = self.port.portid(), "transport error, closing connection: {e}");
                let cfg = self.writer.inner.lock().digests;
                terminate(&mut self.stream, &self.reader, e, &cfg);
            }
            End::Quiet(why) => tracing::debug!(peer = %self.peer, "closing connection: {why}"),
            End::Closed => tracing::debug!(peer = %self.peer, "connection closed"),
        }
        // Shut the socket first: a worker blocked writing to a host that stopped reading
        // must fail rather than keep the join below waiting.
        self.writer.shutdown();
        if let Some(pool) = self.pool.take() {
            pool.close();
        }
        if let Some(q) = self.queue.take() {
            if q.qid == 0 {
                self.shared.remove_controller(&q.ctrl, "admin queue closed");
            } else {
                q.ctrl.queues.lock().remove(&q.qid);
            }
        }
    }

    fn respond(&self, cid: u16, status: Status) -> Result<(), End> {
        self.writer.respond(cid, status, 0, 0);
        Ok(())
    }

    fn on_capsule(&mut self, sqe: Sqe, pdu: &InboundPdu) -> Result<(), End> {
        self.port.counters.commands.fetch_add(1, Ordering::Relaxed);
        if let Some(q) = &self.queue {
            if q.ctrl.dead.load(Ordering::SeqCst) {
                return Err(End::Quiet("association ended"));
            }
            q.ctrl.touch();
            if self.inflight.load(Ordering::SeqCst) + self.pending.len() >= q.entries as usize {
                return Err(End::Fatal(PduError::Sequence {
                    pdu_type: PduType::CapsuleCmd,
                    reason: "more commands outstanding than the queue has entries",
                }));
            }
            self.sq_head = (self.sq_head + 1) % q.entries;
            self.writer
                .sq_head
                .store(self.sq_head as u16, Ordering::Relaxed);
        }
        let data = match self.read_capsule_data(pdu)? {
            Ok(data) => data,
            Err(status) => return self.respond(sqe.cid, status),
        };
        let kind = match &self.queue {
            Some(q) if q.qid > 0 => QueueKind::Io,
            _ => QueueKind::Admin,
        };
        let cmd = match Command::parse(&sqe, kind) {
            Ok(cmd) => cmd,
            Err(e) => return self.respond(sqe.cid, e.status()),
        };
        if sqe.flags & 0x3 != 0 {
            // Fused commands are not supported (ONCS.Compare and Write is clear).
            return self.respond(sqe.cid, Status::INVALID_FIELD.with_dnr(true));
        }
        let sgl = match sqe.dptr.kind() {
            Ok(sgl) => sgl,
            Err(_) => {
                return self.respond(sqe.cid, Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr(true))
            }
        };
        self.route(sqe, cmd, sgl, data)
    }

    /// Reads in-capsule data into an aligned buffer (so O_DIRECT can write it directly).
    /// The outer error ends the connection; the inner one completes the command.
    fn read_capsule_data(
        &mut self,
        pdu: &InboundPdu,
    ) -> Result<Result<Option<HostData>, Status>, End> {
        let len = pdu.data_len();
        if len == 0 {
            return Ok(Ok(None));
        }
        let limit = match &self.queue {
            Some(q) if q.qid > 0 => self.port.cfg.inline_data_bytes,
            _ => ADMIN_INLINE_BYTES,
        };
        if len > limit as usize {
            return Err(End::Fatal(PduError::DataLimitExceeded {
                len: len as u64,
                limit: u64::from(limit),
            }));
        }
        let mut buf = AlignedBuf::zeroed(len);
        match self
            .reader
            .read_data_into(&mut self.rd, pdu, &mut buf[..len])
        {
            Ok(()) => {}
            Err(e) if e.stream_in_sync() => {
                tracing::warn!(peer = %self.peer, "capsule data digest error: {e}");
                return Ok(Err(e.status().unwrap_or(Status::TRANSIENT_TRANSPORT_ERROR)));
            }
            Err(e) => return Err(e.into()),
        }
        self.port
            .counters
            .write_bytes
            .fetch_add(len as u64, Ordering::Relaxed);
        Ok(Ok(Some(HostData { buf, len })))
    }

    /// Sends the command where its data comes from: the capsule, R2T, or none.
    fn route(
        &mut self,
        sqe: Sqe,
        cmd: Command,
        sgl: SglKind,
        data: Option<HostData>,
    ) -> Result<(), End> {
        let host_to_controller = direction(&sqe) == 0b01;
        match sgl {
            SglKind::None => self.execute(sqe, cmd, None, 0),
            SglKind::InCapsule { offset, length } => {
                if !host_to_controller {
                    return self
                        .respond(sqe.cid, Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr(true));
                }
                let have = data.as_ref().map_or(0, |d| d.len) as u64;
                if offset > have {
                    return self.respond(sqe.cid, Status::SGL_OFFSET_INVALID.with_dnr(true));
                }
                if offset + u64::from(length) > have {
                    return self.respond(sqe.cid, Status::DATA_SGL_LENGTH_INVALID.with_dnr(true));
                }
                let data = data.map(|d| slice_host_data(d, offset as usize, length as usize));
                self.execute(sqe, cmd, data, 0)
            }
            SglKind::Transport { length } if length > MDTS_BYTES => {
                self.respond(sqe.cid, Status::INVALID_FIELD.with_dnr(true))
            }
            SglKind::Transport { length } if host_to_controller => {
                if !matches!(&self.queue, Some(q) if q.qid > 0) {
                    // Connect and admin data always travel in the capsule.
                    return self
                        .respond(sqe.cid, Status::SGL_DESCRIPTOR_TYPE_INVALID.with_dnr(true));
                }
                self.start_r2t(sqe, cmd, length)
            }
            SglKind::Transport { length } => self.execute(sqe, cmd, None, length as usize),
        }
    }

    fn execute(
        &mut self,
        sqe: Sqe,
        cmd: Command,
        data: Option<HostData>,
        c2h_len: usize,
    ) -> Result<(), End> {
        let ctrl = match (&cmd, &self.queue) {
            (Command::Fabrics(f), _) => return self.fabrics(&sqe, *f, data.as_ref()),
            (_, None) => {
                return self.respond(sqe.cid, Status::COMMAND_SEQUENCE_ERROR.with_dnr(true))
            }
            (_, Some(q)) => Arc::clone(&q.ctrl),
        };
        match cmd {
            Command::Admin(a) => {
                let reply = ctrl.admin(&self.shared, sqe.cid, &a);
                self.send_reply(sqe.cid, reply, c2h_len)
            }
            Command::Io(io_cmd) => {
                if !ctrl.ready() {
                    return self.respond(sqe.cid, Status::COMMAND_SEQUENCE_ERROR.with_dnr(true));
                }
                if self.read_on_ring(&ctrl, sqe.cid, &io_cmd, c2h_len) {
                    return Ok(());
                }
                let data = match self.write_on_ring(&ctrl, sqe.cid, &io_cmd, data) {
                    Ok(()) => return Ok(()),
                    Err(data) => data,
                };
                let writer = Arc::clone(&self.writer);
                let inflight = Arc::clone(&self.inflight);
                inflight.fetch_add(1, Ordering::SeqCst);
                let cid = sqe.cid;
                let job = Box::new(move || {
                    let done = io::execute(&ctrl, &io_cmd, data.as_ref(), c2h_len);
                    // Free the slot before the host can see the completion and reuse it.
                    inflight.fetch_sub(1, Ordering::SeqCst);
                    match &done.data {
                        Some((buf, len)) if done.status.is_success() => {
                            writer.respond_data(cid, &buf[..*len], done.status, 0, 0);
                        }
                        _ => writer.respond(cid, done.status, 0, 0),
                    }
                    if let Some((buf, _)) = done.data {
                        super::buffers::give(buf);
                    }
                });
                match self.pool.as_mut() {
                    Some(pool) => pool.submit(job),
                    None => job(),
                }
                Ok(())
            }
            Command::Fabrics(_) => Ok(()),
        }
    }

    /// Issues a Read through the connection's ring when it has one and the namespace a
    /// direct descriptor; false leaves the command to the worker pool.
    fn read_on_ring(
        &mut self,
        ctrl: &Controller,
        cid: u16,
        cmd: &IoCommand,
        c2h_len: usize,
    ) -> bool {
        let IoCommand::Read(rw) = cmd else {
            return false;
        };
        let direct = ctrl
            .subsys
            .namespaces
            .get(&rw.nsid)
            .is_some_and(|ns| ns.direct.is_some());
        let Some(engine) = self.rd.get_mut().engine().filter(|_| direct) else {
            return false;
        };
        match io::plan_read(ctrl, rw, c2h_len) {
            Ok(plan) => {
                self.inflight.fetch_add(1, Ordering::SeqCst);
                engine.submit_read(cid, plan);
            }
            Err(done) => self.writer.respond(cid, done.status, 0, 0),
        }
        true
    }

    /// Issues a Write of at most one ring piece, its data all received, through the
    /// connection's ring, when it needs no flush (no FUA, volatile write cache on), the
    /// namespace has a direct descriptor and the data buffer suits O_DIRECT; otherwise
    /// gives the data back for the worker pool. A Write that fails its checks is answered
    /// here.
    fn write_on_ring(
        &mut self,
        ctrl: &Controller,
        cid: u16,
        cmd: &IoCommand,
        data: Option<HostData>,
    ) -> Result<(), Option<HostData>> {
        let (IoCommand::Write(rw), Some(d)) = (cmd, data.as_ref()) else {
            return Err(data);
        };
        let lba = LBA_BYTES as usize;
        let suitable = d.len <= super::uring::PIECE_BYTES
            && d.len.is_multiple_of(lba)
            && (d.buf.as_ptr() as usize).is_multiple_of(lba)
            && ctrl
                .subsys
                .namespaces
                .get(&rw.nsid)
                .is_some_and(|ns| ns.direct.is_some());
        if !suitable || rw.fua || !ctrl.vwc_enabled.load(Ordering::Relaxed) {
            return Err(data);
        }
        if self.rd.get_mut().engine().is_none() {
            return Err(data);
        }
        match io::plan_write(ctrl, rw, d.len) {
            Ok(plan) => {
                let d = data.expect("checked above");
                self.inflight.fetch_add(1, Ordering::SeqCst);
                let engine = self.rd.get_mut().engine().expect("checked above");
                engine.submit_write(cid, plan, d.buf);
            }
            Err(done) => self.writer.respond(cid, done.status, 0, 0),
        }
        Ok(())
    }

    fn send_reply(&self, cid: u16, reply: Reply, c2h_len: usize) -> Result<(), End> {
        if let Reply::Done {
            status,
            dw0,
            dw1,
            data,
        } = reply
        {
            let n = data.len().min(c2h_len);
            if status.is_success() && n > 0 {
                self.writer.respond_data(cid, &data[..n], status, dw0, dw1);
            } else {
                self.writer.respond(cid, status, dw0, dw1);
            }
        }
        Ok(())
    }

    fn fabrics(
        &mut self,
        sqe: &Sqe,
        f: FabricsCommand,
        data: Option<&HostData>,
    ) -> Result<(), End> {
        let admin = match &self.queue {
            Some(q) if q.qid == 0 => Some(Arc::clone(&q.ctrl)),
            _ => None,
        };
        match f {
            FabricsCommand::Connect(c) => self.connect(sqe, c, data),
            FabricsCommand::PropertyGet(_) | FabricsCommand::PropertySet(_)
                if self.queue.is_none() =>
            {
                self.respond(sqe.cid, Status::COMMAND_SEQUENCE_ERROR.with_dnr(true))
            }
            FabricsCommand::PropertyGet(p) => match admin {
                Some(ctrl) => self.send_reply(sqe.cid, ctrl.property_get(p), 0),
                None => self.respond(sqe.cid, Status::INVALID_OPCODE.with_dnr(true)),
            },
            FabricsCommand::PropertySet(p) => match admin {
                Some(ctrl) => self.send_reply(sqe.cid, ctrl.property_set(p), 0),
                None => self.respond(sqe.cid, Status::INVALID_OPCODE.with_dnr(true)),
            },
            FabricsCommand::Disconnect { .. } => {
                self.respond(sqe.cid, Status::SUCCESS)?;
                Err(End::Quiet("Disconnect"))
            }
        }
    }

    /// Refuses a Connect: the completion says why, then the connection closes.
    fn refuse(&self, cid: u16, status: Status, dw0: u32, why: &'static str) -> Result<(), End> {
        tracing::info!(peer = %self.peer, portid = self.port.portid(), "Connect refused: {why}");
        self.writer.respond(cid, status.with_dnr(true), dw0, 0);
        Err(End::Quiet(why))
    }

    fn connect(&mut self, sqe: &Sqe, c: Connect, data: Option<&HostData>) -> Result<(), End> {
        let bad = Status::CONNECT_INVALID_PARAMETERS;
        if self.queue.is_some() {
            return self.respond(sqe.cid, Status::COMMAND_SEQUENCE_ERROR.with_dnr(true));
        }
        let cd = match ConnectData::decode(data.map_or(&[][..], |d| &d.buf[..d.len])) {
            Ok(cd) => cd,
            Err(e) => {
                let dw0 = connect_invalid_parameter_dw0(true, e.offset().unwrap_or(0) as u16);
                return self.refuse(sqe.cid, bad, dw0, "malformed Connect data");
            }
        };
        if c.recfmt != 0 {
            return self.refuse(sqe.cid, Status::CONNECT_INCOMPATIBLE_FORMAT, 0, "RECFMT");
        }
        if c.sqsize == 0 || c.queue_entries() > self.shared.limits.queue_entries_max {
            let dw0 = connect_invalid_parameter_dw0(false, 44);
            return self.refuse(sqe.cid, bad, dw0, "SQSIZE out of range");
        }
        let subsys = if cd.subnqn.is_discovery() {
            Some(Arc::clone(&self.shared.discovery))
        } else {
            let nqn = cd.subnqn.as_str();
            self.shared
                .subsystem(nqn)
                .filter(|_| self.port.exports(nqn))
        };
        let Some(subsys) = subsys else {
            let dw0 = connect_invalid_parameter_dw0(true, 256);
            return self.refuse(sqe.cid, bad, dw0, "unknown subsystem NQN on this port");
        };
        if !subsys.allows(cd.hostnqn.as_str()) {
            tracing::warn!(hostnqn = %cd.hostnqn, subnqn = %subsys.nqn, "host not allowed");
            let dw0 = connect_invalid_parameter_dw0(true, 512);
            return self.refuse(
                sqe.cid,
                Status::CONNECT_INVALID_HOST,
                dw0,
                "host not allowed",
            );
        }
        let fenced = self.shared.fenced(cd.hostnqn.as_str());
        if fenced && c.qid == 0 {
            tracing::warn!(hostnqn = %cd.hostnqn, subnqn = %subsys.nqn, "fenced host refused");
            let dw0 = connect_invalid_parameter_dw0(true, 512);
            return self.refuse(sqe.cid, Status::CONNECT_INVALID_HOST, dw0, "host fenced");
        }
        let ctrl = if c.qid == 0 {
            self.connect_admin(sqe, &c, &cd, subsys)?
        } else {
            self.connect_io(sqe, &c, &cd, &subsys)?
        };
        ctrl.touch();
        self.writer.sqid.store(c.qid, Ordering::Relaxed);
        let sq_flow_off = c.cattr & CATTR_DISABLE_SQ_FLOW_CONTROL != 0;
        self.writer
            .data_success
            .store(sq_flow_off, Ordering::Relaxed);
        self.writer
            .respond(sqe.cid, Status::SUCCESS, u32::from(ctrl.cntlid), 0);
        let _ = self.stream.set_read_timeout(None);
        if c.qid > 0 {
            self.pool = Some(Pool::new(self.shared.limits.io_threads_per_queue as usize));
            let (writer, inflight) = (Arc::clone(&self.writer), Arc::clone(&self.inflight));
            self.rd.get_mut().start_engine(writer, inflight);
        }
        self.queue = Some(Queue {
            qid: c.qid,
            entries: c.queue_entries(),
            ctrl,
        });
        Ok(())
    }

    fn connect_admin(
        &mut self,
        sqe: &Sqe,
        c: &Connect,
        cd: &ConnectData,
        subsys: Arc<super::subsystem::Subsystem>,
    ) -> Result<Arc<Controller>, End> {
        if cd.cntlid != CNTLID_DYNAMIC {
            let dw0 = connect_invalid_parameter_dw0(true, 16);
            let bad = Status::CONNECT_INVALID_PARAMETERS;
            return Err(self
                .refuse(sqe.cid, bad, dw0, "static controller ID")
                .unwrap_err());
        }
        let admin_stream = self
            .stream
            .try_clone()
            .map_err(|_| End::Quiet("socket clone"))?;
        let new = NewController {
            subsys,
            port: Arc::clone(&self.port),
            hostnqn: cd.hostnqn.as_str().to_owned(),
            hostid: cd.hostid,
            kato_ms: c.kato_ms,
            admin_writer: Arc::clone(&self.writer),
            admin_stream,
            fenced: self.shared.fenced(cd.hostnqn.as_str()),
        };
        let shared = Arc::clone(&self.shared);
        match shared.add_controller(|cntlid| Controller::new(cntlid, new, &shared)) {
            Some(ctrl) => {
                tracing::info!(
                    cntlid = ctrl.cntlid,
                    hostnqn = %ctrl.hostnqn,
                    subnqn = %ctrl.subsys.nqn,
                    portid = self.port.portid(),
                    kato_ms = ctrl.kato_ms(),
                    "controller created"
                );
                Ok(ctrl)
            }
            None => {
                let busy = Status::CONNECT_CONTROLLER_BUSY;
                Err(self
                    .refuse(sqe.cid, busy, 0, "no controller ID free")
                    .unwrap_err())
            }
        }
    }

    fn connect_io(
        &mut self,
        sqe: &Sqe,
        c: &Connect,
        cd: &ConnectData,
        subsys: &Arc<super::subsystem::Subsystem>,
    ) -> Result<Arc<Controller>, End> {
        let bad = Status::CONNECT_INVALID_PARAMETERS;
        let refuse = |this: &Self, status, dw0, why| {
            Err(this.refuse(sqe.cid, status, dw0, why).unwrap_err())
        };
        let Some(ctrl) = self
            .shared
            .controller(cd.cntlid)
            .filter(|k| Arc::ptr_eq(&k.subsys, subsys) && Arc::ptr_eq(&k.port, &self.port))
        else {
            return refuse(
                self,
                bad,
                connect_invalid_parameter_dw0(true, 16),
                "unknown CNTLID",
            );
        };
        if ctrl.hostnqn != cd.hostnqn.as_str() {
            return refuse(
                self,
                bad,
                connect_invalid_parameter_dw0(true, 512),
                "HOSTNQN differs",
            );
        }
        if ctrl.hostid != cd.hostid {
            return refuse(
                self,
                bad,
                connect_invalid_parameter_dw0(true, 0),
                "HOSTID differs",
            );
        }
        if ctrl.subsys.is_discovery || c.qid > ctrl.io_queues_allowed() {
            return refuse(
                self,
                bad,
                connect_invalid_parameter_dw0(false, 42),
                "QID out of range",
            );
        }
        if !ctrl.ready() {
            return refuse(
                self,
                Status::COMMAND_SEQUENCE_ERROR,
                0,
                "controller not enabled",
            );
        }
        let stream = self
            .stream
            .try_clone()
            .map_err(|_| End::Quiet("socket clone"))?;
        {
            let mut queues = ctrl.queues.lock();
            if queues.contains_key(&c.qid) {
                drop(queues);
                return refuse(
                    self,
                    bad,
                    connect_invalid_parameter_dw0(false, 42),
                    "QID in use",
                );
            }
            queues.insert(c.qid, super::controller::QueueRef { stream });
        }
        Ok(ctrl)
    }

    fn alloc_ttag(&mut self) -> u16 {
        loop {
            let ttag = self.next_ttag;
            self.next_ttag = self.next_ttag.wrapping_add(1);
            if !self.pending.contains_key(&ttag) {
                return ttag;
            }
        }
    }

    fn start_r2t(&mut self, sqe: Sqe, cmd: Command, length: u32) -> Result<(), End> {
        let ttag = self.alloc_ttag();
        let stream = self.plan_stream(sqe.cid, &cmd, length);
        let buf = if stream.is_some() {
            AlignedBuf::zeroed(0)
        } else {
            AlignedBuf::for_io(length as usize)
        };
        let mut p = PendingWrite {
            sqe,
            cmd,
            buf,
            total: length,
            received: 0,
            r2t_end: 0,
            failed: None,
            stream,
            dispatched: 0,
        };
        self.send_r2t(ttag, &mut p);
        self.pending.insert(ttag, p);
        Ok(())
    }

    /// A Write larger than one piece, on a ready controller, whose checks pass now, is
    /// streamed; anything else (including a Write that fails its checks, which then fails
    /// as before once its data is in) is executed whole.
    fn plan_stream(&mut self, cid: u16, cmd: &Command, length: u32) -> Option<Arc<WriteStream>> {
        let Command::Io(IoCommand::Write(rw)) = cmd else {
            return None;
        };
        let ctrl = &self.queue.as_ref()?.ctrl;
        if length <= STREAM_PIECE_BYTES || !ctrl.ready() || self.pool.is_none() {
            return None;
        }
        let plan = io::plan_write(ctrl, rw, length as usize).ok()?;
        let mut buf = super::buffers::take(length as usize);
        let base = buf.as_mut_ptr();
        Some(Arc::new(WriteStream {
            plan,
            cid,
            _buf: buf,
            base,
            // One more than the bytes: the end of reception, which the connection thread
            // settles, so the command cannot complete while it still counts as pending.
            remaining: AtomicUsize::new(length as usize + 1),
            failed: Mutex::new(None),
        }))
    }

    /// Hands the received, LBA-aligned data of a streamed write not yet handed out to a
    /// worker, once there is at least a piece of it or all of it is in.
    fn dispatch_stream(&mut self, p: &mut PendingWrite) {
        let Some(stream) = p.stream.as_ref() else {
            return;
        };
        let ready = if p.received == p.total {
            p.total
        } else {
            p.received & !(LBA_BYTES_U32 - 1)
        };
        let len = ready - p.dispatched;
        if len == 0 || (len < STREAM_PIECE_BYTES && ready < p.total) {
            return;
        }
        let (start, end) = (p.dispatched as usize, ready as usize);
        p.dispatched = ready;
        let stream = Arc::clone(stream);
        let writer = Arc::clone(&self.writer);
        let inflight = Arc::clone(&self.inflight);
        let job = Box::new(move || {
            // SAFETY: `start..end` was received completely before this job was submitted,
            // and the connection thread never touches it again.
            let data = unsafe { stream.handed_part(start..end) };
            let plan = &stream.plan;
            let offset = plan.offset + start as u64;
            let failure = plan
                .ns
                .dev
                .write_at(data, offset)
                .err()
                .map(|e| io::write_fault(&plan.ns, offset, &e));
            stream.settle(end - start, failure, &writer, &inflight);
        });
        if let Some(pool) = self.pool.as_mut() {
            pool.submit(job);
        }
    }

    fn send_r2t(&self, ttag: u16, p: &mut PendingWrite) {
        let r2tl = (p.total - p.received).min(self.maxh2cdata);
        p.r2t_end = p.received + r2tl;
        let r2t = R2t {
            cccid: p.sqe.cid,
            ttag,
            r2to: p.received,
            r2tl,
        };
        self.writer.send_pdu(&PduHeader::R2T(r2t), &[]);
    }

    fn on_h2c(&mut self, h: DataHeader, pdu: &InboundPdu) -> Result<(), End> {
        let field = |field, offset, value: u16| {
            End::Fatal(PduError::InvalidField {
                pdu_type: PduType::H2CData,
                field,
                offset,
                value: u64::from(value),
                reason: "does not match an outstanding R2T",
            })
        };
        let Some(p) = self.pending.get_mut(&h.ttag) else {
            return Err(field("TTAG", 10, h.ttag));
        };
        if h.cccid != p.sqe.cid {
            return Err(field("CCCID", 8, h.cccid));
        }
        if h.datal > self.maxh2cdata {
            let (len, limit) = (u64::from(h.datal), u64::from(self.maxh2cdata));
            return Err(End::Fatal(PduError::DataLimitExceeded { len, limit }));
        }
        let end = u64::from(h.datao) + u64::from(h.datal);
        if h.datao != p.received || end > u64::from(p.r2t_end) {
            let (offset, len, limit) =
                (u64::from(h.datao), u64::from(h.datal), u64::from(p.r2t_end));
            return Err(End::Fatal(PduError::DataOutOfRange { offset, len, limit }));
        }
        let range = h.datao as usize..end as usize;
        let into = match p.stream.as_ref() {
            // SAFETY: bytes from `received` on have not been handed to a worker.
            Some(stream) => unsafe { stream.receive_part(range) },
            None => &mut p.buf[range],
        };
        match self.reader.read_data_into(&mut self.rd, pdu, into) {
            Ok(()) => {}
            Err(e) if e.stream_in_sync() => {
                tracing::warn!(peer = %self.peer, "H2CData digest error: {e}");
                p.failed = Some(e.status().unwrap_or(Status::TRANSIENT_TRANSPORT_ERROR));
            }
            Err(e) => return Err(e.into()),
        }
        self.port
            .counters
            .write_bytes
            .fetch_add(u64::from(h.datal), Ordering::Relaxed);
        p.received += h.datal;
        if p.failed.is_none() {
            let mut taken = self
                .pending
                .remove(&h.ttag)
                .ok_or(End::Quiet("lost transfer"))?;
            self.dispatch_stream(&mut taken);
            self.pending.insert(h.ttag, taken);
        }
        let Some(p) = self.pending.get_mut(&h.ttag) else {
            return Err(End::Quiet("lost transfer"));
        };
        if p.received < p.r2t_end {
            return Ok(());
        }
        if p.failed.is_none() && p.received < p.total {
            let mut p = self
                .pending
                .remove(&h.ttag)
                .ok_or(End::Quiet("lost transfer"))?;
            self.send_r2t(h.ttag, &mut p);
            self.pending.insert(h.ttag, p);
            return Ok(());
        }
        let p = self
            .pending
            .remove(&h.ttag)
            .ok_or(End::Quiet("lost transfer"))?;
        if let Some(stream) = p.stream {
            // No longer pending, so in flight until its completion; the bytes never
            // handed out are settled with the end of reception.
            self.inflight.fetch_add(1, Ordering::SeqCst);
            let never = (p.total - p.dispatched) as usize;
            stream.settle(never + 1, p.failed, &self.writer, &self.inflight);
            return Ok(());
        }
        if let Some(status) = p.failed {
            // A write that failed in transit failed on its namespace, as a streamed one does.
            if let (Command::Io(IoCommand::Write(rw)), Some(q)) = (&p.cmd, &self.queue) {
                if let Some(ns) = q.ctrl.subsys.namespaces.get(&rw.nsid) {
                    ns.count(&ns.counters.errors, 1);
                }
            }
            return self.respond(p.sqe.cid, status);
        }
        let data = HostData {
            buf: p.buf,
            len: p.total as usize,
        };
        self.execute(p.sqe, p.cmd, Some(data), 0)
    }
}

/// Data direction of a command: opcode bits 1:0 (FCTYPE bits 1:0 for Fabrics).
fn direction(sqe: &Sqe) -> u8 {
    if sqe.opcode == crate::wire::command::FABRICS_OPCODE {
        (sqe.nsid & 0x3) as u8
    } else {
        sqe.opcode & 0x3
    }
}

/// In-capsule data at `offset`: the buffer itself when it starts at 0 (always, from Linux
/// and SPDK), else a copy so that the data stays 4096-byte aligned for O_DIRECT.
fn slice_host_data(d: HostData, offset: usize, length: usize) -> HostData {
    if offset == 0 {
        return HostData {
            buf: d.buf,
            len: length,
        };
    }
    HostData {
        buf: AlignedBuf::from_slice(&d.buf[offset..offset + length]),
        len: length,
    }
}
