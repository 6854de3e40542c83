//! One NVMe/TCP connection is one queue (the admin queue or one I/O queue).
//!
//! Many commands are in flight at once. A caller ([`Queue::execute`]) allocates a CID (its
//! slot; blocking while all are taken, so a queue never holds more than SQSIZE commands),
//! sends the CapsuleCmd (combined with other threads' capsules, [`super::sender`]), and
//! sleeps on its slot. A dedicated reader
//! thread demultiplexes what the controller sends by CID: C2HData is read straight into the
//! caller's buffer (no copy, no allocation), CapsuleResp completes the slot (so does a
//! C2HData with SUCCESS: I/O queues disable SQ flow control at Connect, which lets the
//! controller skip the CapsuleResp of a successful read), and R2T is
//! handed to the caller, which sends the H2CData itself. The reader never writes to the
//! socket, so a controller that stops reading while it sends cannot deadlock the host.
//!
//! A slot is completed only by the reader thread (or by its teardown, on the same thread),
//! which is what makes lending the caller's buffer to it sound: when a connection dies, the
//! teardown fails every outstanding slot with a transport error before the reader exits,
//! and a caller whose command times out shuts the socket down and then waits for that
//! teardown instead of returning while the reader might still write into its buffer.

use std::collections::VecDeque;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::completion::{Completed, Completions};
use super::error::HostError;
use super::inbound::Inbound;
use super::path::Path;
use super::policy::{r2t_in_range, r2t_segments, HOST_MAX_TRANSFER_BYTES};
use super::sender::Sender;
use crate::wire::command::{SglDescriptor, FABRICS_OPCODE};
use crate::wire::fabrics::{
    connect_response_cntlid, Connect, ConnectData, CATTR_DISABLE_SQ_FLOW_CONTROL,
};
use crate::wire::pdu_reader::MAX_PDU_BYTES_MIN;
use crate::wire::{
    Cqe, DataHeader, DigestConfig, IcReq, IcResp, InboundPdu, Nqn, PduError, PduHeader, PduReader,
    R2t, Side, Sqe, Status,
};
use tessera_drive::AlignedBuf;

/// In-capsule data the admin queue and every Fabrics command may carry (NVMe/TCP 1.0
/// 3.6.2.5: 8 KiB on the admin queue; Linux uses the same limit for Connect on I/O queues).
pub const ADMIN_IN_CAPSULE_BYTES: usize = 8192;
/// Outstanding R2Ts one command may have queued at the host; MAXR2T asks for one, so more
/// is a protocol error, and the bound keeps a broken controller from growing memory.
const R2T_QUEUED_MAX: usize = 16;
/// Largest PDU accepted from the controller: the largest transfer the host ever asks for,
/// plus room for headers.
const MAX_PDU_BYTES: u32 = HOST_MAX_TRANSFER_BYTES + 4096;
/// H2CData PDUs carry at most this much even when MAXH2CDATA allows more: the drive
/// server can then write each piece to its drive while the next one is on the wire.
const H2C_PDU_MAX_BYTES: u32 = 256 << 10;
/// Buffer of the reader: headers arrive in few system calls; big data bypasses it
/// ([`Inbound`]).
const READ_BUFFER_BYTES: usize = 64 << 10;

/// Everything needed to open one queue.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// Controller address.
    pub addr: SocketAddr,
    /// Queue identifier: 0 for the admin queue.
    pub qid: u16,
    /// Submission queue entries (SQSIZE + 1); at most `entries - 1` commands are in flight.
    pub entries: u16,
    /// Keep Alive Timeout for the admin Connect, in milliseconds (0 on I/O queues).
    pub kato_ms: u32,
    /// Controller ID: [`crate::wire::fabrics::CNTLID_DYNAMIC`] for the admin queue, else
    /// the admin queue's.
    pub cntlid: u16,
    /// Subsystem NQN.
    pub subnqn: Nqn,
    /// Host NQN.
    pub hostnqn: Nqn,
    /// Host identifier.
    pub hostid: [u8; 16],
    /// Request header digests.
    pub header_digest: bool,
    /// Request data digests.
    pub data_digest: bool,
    /// In-capsule data limit of non-Fabrics commands on this queue.
    pub in_capsule_bytes: usize,
    /// Per-command timeout; a command exceeding it kills the queue.
    pub command_timeout: Duration,
    /// TCP connect and ICReq/ICResp timeout.
    pub connect_timeout: Duration,
}

/// The data a command moves.
#[derive(Debug)]
pub enum Xfer<'a> {
    /// No data.
    None,
    /// Host to controller (writes, Connect data, reservation keys).
    ToController(&'a [u8]),
    /// Controller to host (reads, Identify, log pages).
    FromController(&'a mut [u8]),
}

/// The caller's read buffer, lent to the reader thread while the command is outstanding.
#[derive(Clone, Copy)]
struct RawBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer is only dereferenced by the reader thread while the owning caller is
// blocked in `Queue::wait` on the same slot (see the module documentation).
unsafe impl Send for RawBuf {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Free,
    InFlight,
    Done,
}

struct SlotState {
    phase: Phase,
    result: Option<Result<Cqe, HostError>>,
    read_buf: Option<RawBuf>,
    write_len: usize,
    r2ts: VecDeque<R2t>,
    /// A submitted read ([`Queue::submit_read`]): posted when it completes instead of
    /// waking a waiter.
    post: Option<Post>,
}

/// When a submitted read's capsule leaves for the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dispatch {
    /// Sent now (or by the thread already writing on the queue).
    Now,
    /// Left pending with the queue's sender until [`Queue::flush_deferred`]: a batch of
    /// reads goes out in one system call.
    Deferred,
}

/// A submitted read that was not sent: its buffer back, with the queue's error, or with
/// none when every slot of the queue was taken.
pub(crate) struct NotSent {
    pub buf: AlignedBuf,
    pub error: Option<Box<HostError>>,
}

impl NotSent {
    fn dead(buf: AlignedBuf, error: HostError) -> NotSent {
        NotSent {
            buf,
            error: Some(Box::new(error)),
        }
    }
}

/// Where a submitted read goes when it completes, with the buffer it reads into.
struct Post {
    cq: Arc<Completions>,
    tag: u64,
    buf: AlignedBuf,
    queue: Arc<Queue>,
    submitted: Instant,
    path: Option<Arc<Path>>,
}

struct Slot {
    state: Mutex<SlotState>,
    cv: Condvar,
}

/// One connected queue.
pub struct Queue {
    addr: SocketAddr,
    qid: u16,
    sender: Sender,
    control: TcpStream,
    maxh2cdata: u32,
    in_capsule_bytes: usize,
    timeout: Duration,
    slots: Box<[Slot]>,
    free: Mutex<Vec<u16>>,
    free_cv: Condvar,
    dead: AtomicBool,
    death: Mutex<Option<String>>,
    reader: Mutex<Option<JoinHandle<()>>>,
    on_death: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("addr", &self.addr)
            .field("qid", &self.qid)
            .field("dead", &self.is_dead())
            .finish_non_exhaustive()
    }
}

impl Queue {
    /// Opens the TCP connection, exchanges ICReq/ICResp, starts the reader and sends the
    /// Fabrics Connect. Returns the queue and the controller ID from the Connect response.
    ///
    /// # Errors
    /// [`HostError::Transport`] when the controller cannot be reached,
    /// [`HostError::Protocol`] for an unacceptable ICResp, [`HostError::ConnectRefused`]
    /// when the subsystem refuses the host.
    pub fn connect(cfg: &QueueConfig) -> Result<(Arc<Queue>, u16), HostError> {
        assert!(cfg.entries >= 2, "a queue needs at least 2 entries");
        let addr = cfg.addr;
        let stream = TcpStream::connect_timeout(&addr, cfg.connect_timeout)
            .map_err(|e| transport(addr, format!("connecting: {e}")))?;
        stream
            .set_nodelay(true)
            .map_err(|e| transport(addr, format!("setting TCP_NODELAY: {e}")))?;
        let (icreq, icresp) = handshake(&stream, cfg)?;
        let session = DigestConfig::after_handshake(&icreq, &icresp, Side::Host);
        let socket_err = |e: io::Error| transport(addr, format!("configuring socket: {e}"));
        stream.set_read_timeout(None).map_err(socket_err)?;
        stream
            .set_write_timeout(Some(cfg.command_timeout))
            .map_err(socket_err)?;
        let reader_stream = stream.try_clone().map_err(socket_err)?;
        let control = stream.try_clone().map_err(socket_err)?;
        let outstanding = cfg.entries - 1;
        let slots = (0..outstanding)
            .map(|_| Slot {
                state: Mutex::new(SlotState {
                    phase: Phase::Free,
                    result: None,
                    read_buf: None,
                    write_len: 0,
                    r2ts: VecDeque::new(),
                    post: None,
                }),
                cv: Condvar::new(),
            })
            .collect();
        let queue = Arc::new(Queue {
            addr,
            qid: cfg.qid,
            sender: Sender::new(stream, session.send),
            control,
            maxh2cdata: icresp.maxh2cdata,
            in_capsule_bytes: cfg.in_capsule_bytes,
            timeout: cfg.command_timeout,
            slots,
            free: Mutex::new((0..outstanding).rev().collect()),
            free_cv: Condvar::new(),
            dead: AtomicBool::new(false),
            death: Mutex::new(None),
            reader: Mutex::new(None),
            on_death: Mutex::new(None),
        });
        queue.start_reader(reader_stream, session.receive)?;
        match queue.fabrics_connect(cfg) {
            Ok(cntlid) => Ok((queue, cntlid)),
            Err(e) => {
                queue.close();
                Err(e)
            }
        }
    }

    fn start_reader(
        self: &Arc<Self>,
        stream: TcpStream,
        receive: DigestConfig,
    ) -> Result<(), HostError> {
        let queue = Arc::clone(self);
        let name = format!("nvme-rx-q{}", self.qid);
        let handle = std::thread::Builder::new()
            .name(name)
            .spawn(move || queue.reader_loop(stream, receive))
            .map_err(|e| HostError::Io {
                context: "spawning the queue reader thread".into(),
                source: e,
            })?;
        *self.reader.lock() = Some(handle);
        Ok(())
    }

    fn fabrics_connect(&self, cfg: &QueueConfig) -> Result<u16, HostError> {
        let mut connect = Connect::new(cfg.qid, u32::from(cfg.entries), cfg.kato_ms)
            .map_err(|e| HostError::Invalid(format!("queue size {}: {e}", cfg.entries)))?;
        if cfg.qid > 0 {
            // No SQHD flow control on I/O queues (slots already bound what is in flight),
            // which lets the controller complete a read with its C2HData alone.
            connect.cattr |= CATTR_DISABLE_SQ_FLOW_CONTROL;
        }
        let data = ConnectData {
            hostid: cfg.hostid,
            cntlid: cfg.cntlid,
            subnqn: cfg.subnqn.clone(),
            hostnqn: cfg.hostnqn.clone(),
        }
        .encode();
        let cqe = self.execute(connect.to_sqe(0), Xfer::ToController(&data), "Connect")?;
        if !cqe.status.is_success() {
            return Err(HostError::ConnectRefused {
                addr: self.addr,
                subnqn: cfg.subnqn.to_string(),
                hostnqn: cfg.hostnqn.to_string(),
                status: cqe.status,
                hint: connect_hint(cqe.status, cqe.dw0),
            });
        }
        Ok(connect_response_cntlid(cqe.dw0))
    }

    /// The controller address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether the connection is gone; every command fails at once.
    #[must_use]
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    /// Why the connection died, if it did.
    #[must_use]
    pub fn death_reason(&self) -> Option<String> {
        self.death.lock().clone()
    }

    /// Registers a function run once, on the reader thread, when the connection dies. It
    /// must not block on this queue (it may kill other queues).
    pub fn set_on_death(&self, f: Box<dyn FnOnce() + Send>) {
        *self.on_death.lock() = Some(f);
        if self.is_dead() {
            if let Some(f) = self.on_death.lock().take() {
                f();
            }
        }
    }

    /// Tears the connection down: outstanding commands fail with a transport error naming
    /// `reason`. Does not wait.
    pub fn kill(&self, reason: &str) {
        {
            let mut death = self.death.lock();
            if death.is_none() {
                *death = Some(reason.to_owned());
            }
        }
        self.dead.store(true, Ordering::SeqCst);
        // Wakes the reader out of its blocking read; errors mean it is already closed.
        let _ = self.control.shutdown(Shutdown::Both);
    }

    /// Kills the connection and waits for the reader thread to finish.
    pub fn close(&self) {
        self.kill("closed by the host");
        let handle = self.reader.lock().take();
        if let Some(handle) = handle {
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
    }

    /// Runs one command to completion and returns its CQE, whatever its status. The SQE's
    /// CID and data pointer are filled in here.
    ///
    /// # Errors
    /// [`HostError::Transport`] when the connection is or goes down,
    /// [`HostError::Timeout`] when the controller does not answer in time (the connection
    /// is then torn down: a stuck controller is a dead path).
    pub fn execute(&self, sqe: Sqe, xfer: Xfer<'_>, what: &'static str) -> Result<Cqe, HostError> {
        let deadline = Instant::now() + self.timeout;
        let cid = self.alloc_cid(deadline, what)?;
        let result = self.run(cid, sqe, xfer, Some(deadline), what);
        self.release_cid(cid);
        result
    }

    /// As [`Queue::execute`] for a command the controller may hold for as long as it
    /// likes (an Asynchronous Event Request): no timeout; it ends when the controller
    /// completes it or the queue dies.
    ///
    /// # Errors
    /// As [`Queue::execute`], but never a timeout.
    pub fn execute_unbounded(&self, sqe: Sqe, what: &'static str) -> Result<Cqe, HostError> {
        let cid = self.alloc_cid(Instant::now() + self.timeout, what)?;
        let result = self.run(cid, sqe, Xfer::None, None, what);
        self.release_cid(cid);
        result
    }

    fn alloc_cid(&self, deadline: Instant, what: &'static str) -> Result<u16, HostError> {
        let mut free = self.free.lock();
        loop {
            if self.is_dead() {
                return Err(self.dead_error());
            }
            if let Some(cid) = free.pop() {
                return Ok(cid);
            }
            if self.free_cv.wait_until(&mut free, deadline).timed_out() {
                return Err(HostError::Timeout {
                    addr: self.addr,
                    command: what,
                    after: self.timeout,
                });
            }
        }
    }

    fn release_cid(&self, cid: u16) {
        self.free.lock().push(cid);
        self.free_cv.notify_one();
    }

    fn dead_error(&self) -> HostError {
        let reason = self
            .death_reason()
            .unwrap_or_else(|| "connection closed".to_owned());
        transport(self.addr, reason)
    }

    fn run(
        &self,
        cid: u16,
        mut sqe: Sqe,
        xfer: Xfer<'_>,
        deadline: Option<Instant>,
        what: &'static str,
    ) -> Result<Cqe, HostError> {
        sqe.cid = cid;
        let in_capsule_max = if sqe.opcode == FABRICS_OPCODE {
            ADMIN_IN_CAPSULE_BYTES
        } else {
            self.in_capsule_bytes
        };
        let (read_buf, capsule, r2t_source): (Option<RawBuf>, &[u8], &[u8]) = match xfer {
            Xfer::None => (None, &[], &[]),
            Xfer::FromController(buf) => {
                let raw = RawBuf {
                    ptr: buf.as_mut_ptr(),
                    len: buf.len(),
                };
                (Some(raw), &[], &[])
            }
            Xfer::ToController(data) if data.len() <= in_capsule_max => (None, data, &[]),
            Xfer::ToController(data) => (None, &[], data),
        };
        let len = read_buf.map_or(0, |b| b.len) + capsule.len() + r2t_source.len();
        let len = u32::try_from(len)
            .map_err(|_| HostError::Invalid(format!("{what}: transfer of {len} bytes")))?;
        sqe.dptr = if capsule.is_empty() {
            SglDescriptor::transport(len)
        } else {
            SglDescriptor::in_capsule(0, len)
        };
        self.arm(cid, read_buf, r2t_source.len());
        if self.is_dead() {
            self.cancel(cid);
        } else if let Err(e) = self.send_pdu(&PduHeader::CapsuleCmd(sqe), capsule) {
            self.kill(&format!("sending {what}: {e}"));
        }
        self.wait(cid, r2t_source, deadline, what)
    }

    fn arm(&self, cid: u16, read_buf: Option<RawBuf>, write_len: usize) {
        let mut st = self.slots[usize::from(cid)].state.lock();
        assert_eq!(st.phase, Phase::Free, "CID {cid} allocated twice");
        st.phase = Phase::InFlight;
        st.result = None;
        st.read_buf = read_buf;
        st.write_len = write_len;
        st.r2ts.clear();
    }

    /// Fails a command that was armed after the reader's teardown already swept the slots.
    fn cancel(&self, cid: u16) {
        let err = self.dead_error();
        let slot = &self.slots[usize::from(cid)];
        let mut st = slot.state.lock();
        if st.phase == Phase::InFlight {
            st.phase = Phase::Done;
            st.result = Some(Err(err));
            st.read_buf = None;
        }
    }

    /// Waits for the slot to complete, answering R2Ts on the way.
    fn wait(
        &self,
        cid: u16,
        source: &[u8],
        deadline: Option<Instant>,
        what: &'static str,
    ) -> Result<Cqe, HostError> {
        let slot = &self.slots[usize::from(cid)];
        let mut timed_out = false;
        let mut st = slot.state.lock();
        loop {
            if st.phase == Phase::Done {
                st.phase = Phase::Free;
                let result = st.result.take().unwrap_or_else(|| Err(self.dead_error()));
                return match result {
                    Err(HostError::Transport { .. }) if timed_out => Err(HostError::Timeout {
                        addr: self.addr,
                        command: what,
                        after: self.timeout,
                    }),
                    other => other,
                };
            }
            if let Some(r2t) = st.r2ts.pop_front() {
                drop(st);
                if let Err(e) = self.send_r2t_data(cid, r2t, source) {
                    self.kill(&format!("sending H2CData for {what}: {e}"));
                }
                st = slot.state.lock();
                continue;
            }
            let Some(deadline) = deadline else {
                slot.cv.wait(&mut st);
                continue;
            };
            if timed_out {
                // The reader's teardown completes the slot; shutdown made its read return.
                slot.cv.wait_for(&mut st, Duration::from_secs(1));
            } else if slot.cv.wait_until(&mut st, deadline).timed_out()
                && st.phase == Phase::InFlight
            {
                timed_out = true;
                tracing::warn!(addr = %self.addr, qid = self.qid, cid, "{what} timed out after {:?}; resetting the connection", self.timeout);
                drop(st);
                self.kill(&format!("{what} timed out"));
                st = slot.state.lock();
            }
        }
    }

    fn send_r2t_data(&self, cid: u16, r2t: R2t, source: &[u8]) -> io::Result<()> {
        let pdu_max = self.maxh2cdata.min(H2C_PDU_MAX_BYTES);
        for (offset, len, last) in r2t_segments(r2t.r2to, r2t.r2tl, pdu_max) {
            let header = DataHeader::h2c(cid, r2t.ttag, offset, len, last);
            let start = offset as usize;
            self.send_pdu(
                &PduHeader::H2CData(header),
                &source[start..start + len as usize],
            )?;
        }
        Ok(())
    }

    /// Sends one PDU, combined with other threads' capsules (see [`super::sender`]).
    fn send_pdu(&self, header: &PduHeader, data: &[u8]) -> io::Result<()> {
        self.sender.send(header, data)
    }

    fn reader_loop(self: Arc<Self>, stream: TcpStream, receive: DigestConfig) {
        let mut stream = Inbound::new(stream, READ_BUFFER_BYTES);
        let mut reader = PduReader::new(Side::Host, MAX_PDU_BYTES, receive);
        let reason = loop {
            if let Err(reason) = self.read_one(&mut reader, &mut stream) {
                break reason;
            }
        };
        self.teardown(&reason);
    }

    fn read_one(
        &self,
        reader: &mut PduReader,
        stream: &mut Inbound<TcpStream>,
    ) -> Result<(), String> {
        let pdu = reader
            .read_header(stream)
            .map_err(|e| self.read_error(&e))?;
        match pdu.header {
            PduHeader::CapsuleResp(cqe) => {
                stream.pdu_done(0);
                self.complete(cqe.cid, Ok(cqe))
            }
            PduHeader::C2HData(data) => {
                self.receive_data(reader, stream, &pdu, data)?;
                stream.pdu_done(pdu.data_len());
                Ok(())
            }
            PduHeader::R2T(r2t) => {
                stream.pdu_done(0);
                self.queue_r2t(r2t)
            }
            PduHeader::C2HTermReq(term) => {
                let mut quoted = vec![0u8; pdu.data_len()];
                let _ = reader.read_data_into(stream, &pdu, &mut quoted);
                Err(format!(
                    "the controller terminated the connection (C2HTermReq FES {:#x} FEI {:#x})",
                    term.fes, term.fei
                ))
            }
            other => Err(format!("unexpected {} PDU", other.pdu_type())),
        }
    }

    fn read_error(&self, e: &PduError) -> String {
        if let Some(reason) = self.death_reason() {
            return reason;
        }
        match e {
            PduError::Closed => "connection closed by the controller".to_owned(),
            other => other.to_string(),
        }
    }

    fn slot(&self, cid: u16) -> Result<&Slot, String> {
        self.slots.get(usize::from(cid)).ok_or_else(|| {
            format!(
                "controller used CID {cid}, beyond the queue's {} slots",
                self.slots.len()
            )
        })
    }

    fn complete(&self, cid: u16, result: Result<Cqe, HostError>) -> Result<(), String> {
        let slot = self.slot(cid)?;
        let st = slot.state.lock();
        if st.phase != Phase::InFlight {
            return Err(format!(
                "completion for CID {cid}, which is not outstanding"
            ));
        }
        finish_slot(slot, st, cid, result);
        Ok(())
    }

    /// Sends a Read of `len` bytes into `buf` and returns without waiting; the command is
    /// posted to `cq` with `tag` when it completes (also when the queue dies). The
    /// buffer comes back when the command could not be sent: with the error, or with
    /// `None` when every slot of the queue is taken (it never waits for one, since the
    /// slots of submitted reads come free only when their caller reaps them).
    /// `Dispatch::Deferred` leaves the capsule pending until [`Queue::flush_deferred`].
    pub(crate) fn submit_read(
        self: &Arc<Self>,
        mut sqe: Sqe,
        mut buf: AlignedBuf,
        len: usize,
        post: (&Arc<Completions>, u64, Option<Arc<Path>>),
        dispatch: Dispatch,
    ) -> Result<(), NotSent> {
        assert!(
            len <= buf.len(),
            "read of {len} bytes into {} bytes",
            buf.len()
        );
        let (cq, tag, path) = post;
        if self.is_dead() {
            return Err(NotSent::dead(buf, self.dead_error()));
        }
        let Some(cid) = self.free.lock().pop() else {
            return Err(NotSent { buf, error: None });
        };
        // Counted before the slot is armed, so a completion can never come first.
        cq.submitted(self, cid);
        sqe.cid = cid;
        sqe.dptr = SglDescriptor::transport(u32::try_from(len).expect("MDTS bounds a read"));
        let raw = RawBuf {
            ptr: buf.as_mut_ptr(),
            len,
        };
        {
            let mut st = self.slots[usize::from(cid)].state.lock();
            assert_eq!(st.phase, Phase::Free, "CID {cid} allocated twice");
            st.phase = Phase::InFlight;
            st.result = None;
            // The buffer's heap block does not move with the `AlignedBuf` kept in `post`.
            st.read_buf = Some(raw);
            st.write_len = 0;
            st.r2ts.clear();
            st.post = Some(Post {
                cq: Arc::clone(cq),
                tag,
                buf,
                queue: Arc::clone(self),
                submitted: Instant::now(),
                path,
            });
        }
        if self.is_dead() {
            // Armed after the teardown swept the slots, or just before it: whoever takes
            // the slot out of flight answers for it.
            let slot = &self.slots[usize::from(cid)];
            let mut st = slot.state.lock();
            if st.phase == Phase::InFlight {
                let post = st.post.take().expect("armed above");
                st.phase = Phase::Free;
                st.read_buf = None;
                drop(st);
                cq.forget(self, cid);
                self.release_cid(cid);
                return Err(NotSent::dead(post.buf, self.dead_error()));
            }
            return Ok(());
        }
        let capsule = PduHeader::CapsuleCmd(sqe);
        let sent = match dispatch {
            Dispatch::Now => self.send_pdu(&capsule, &[]),
            Dispatch::Deferred => self.sender.defer(&capsule, &[]),
        };
        if let Err(e) = sent {
            self.kill(&format!("sending Read: {e}"));
        }
        Ok(())
    }

    /// Sends the capsules that `Dispatch::Deferred` left pending, in one write.
    pub(crate) fn flush_deferred(&self) {
        if let Err(e) = self.sender.flush() {
            self.kill(&format!("sending Read: {e}"));
        }
    }

    /// Frees the slot of a submitted read once its completion has been seen.
    pub(crate) fn recycle(&self, cid: u16) {
        let mut st = self.slots[usize::from(cid)].state.lock();
        assert_eq!(
            st.phase,
            Phase::Done,
            "recycling CID {cid}, which is not done"
        );
        st.phase = Phase::Free;
        st.result = None;
        drop(st);
        self.release_cid(cid);
    }

    fn receive_data(
        &self,
        reader: &mut PduReader,
        stream: &mut Inbound<TcpStream>,
        pdu: &InboundPdu,
        data: DataHeader,
    ) -> Result<(), String> {
        let cid = data.cccid;
        let buf = {
            let st = self.slot(cid)?.state.lock();
            match (st.phase, st.read_buf) {
                (Phase::InFlight, Some(buf)) => buf,
                _ => return Err(format!("C2HData for CID {cid}, which reads no data")),
            }
        };
        let (start, len) = (data.datao as usize, pdu.data_len());
        if start.checked_add(len).is_none_or(|end| end > buf.len) {
            return Err(format!(
                "C2HData for CID {cid} at offset {start} length {len} outside its {} bytes",
                buf.len
            ));
        }
        // SAFETY: `buf` is the caller's buffer, lent for as long as the slot is in flight;
        // only this thread completes the slot, and the range was checked above.
        let target = unsafe { std::slice::from_raw_parts_mut(buf.ptr.add(start), len) };
        reader
            .read_data_into(stream, pdu, target)
            .map_err(|e| self.read_error(&e))?;
        if data.success {
            self.complete(cid, Ok(Cqe::new(cid, Status::SUCCESS)))?;
        }
        Ok(())
    }

    fn queue_r2t(&self, r2t: R2t) -> Result<(), String> {
        let cid = r2t.cccid;
        let slot = self.slot(cid)?;
        let mut st = slot.state.lock();
        if st.phase != Phase::InFlight || !r2t_in_range(r2t.r2to, r2t.r2tl, st.write_len) {
            return Err(format!(
                "R2T for CID {cid} offset {} length {} outside its {} bytes of write data",
                r2t.r2to, r2t.r2tl, st.write_len
            ));
        }
        if st.r2ts.len() >= R2T_QUEUED_MAX {
            return Err(format!(
                "more than {R2T_QUEUED_MAX} R2Ts outstanding for CID {cid}"
            ));
        }
        st.r2ts.push_back(r2t);
        slot.cv.notify_one();
        Ok(())
    }

    /// Runs on the reader thread as it exits: the queue is dead, every outstanding command
    /// fails with a transport error, and waiters for a CID wake up to see it.
    fn teardown(&self, reason: &str) {
        if !self.is_dead() {
            tracing::warn!(addr = %self.addr, qid = self.qid, "queue lost: {reason}");
        }
        self.kill(reason);
        let err_reason = self.death_reason().unwrap_or_else(|| reason.to_owned());
        for (cid, slot) in self.slots.iter().enumerate() {
            let st = slot.state.lock();
            if st.phase == Phase::InFlight {
                let cid = u16::try_from(cid).expect("CIDs fit u16");
                let err = transport(self.addr, err_reason.clone());
                finish_slot(slot, st, cid, Err(err));
            }
        }
        drop(self.free.lock());
        self.free_cv.notify_all();
        let on_death = self.on_death.lock().take();
        if let Some(f) = on_death {
            f();
        }
    }
}

/// Takes an in-flight slot to Done with `result`: posts a submitted read to its
/// completion queue, or wakes the thread waiting in [`Queue::execute`].
fn finish_slot(
    slot: &Slot,
    mut st: parking_lot::MutexGuard<'_, SlotState>,
    cid: u16,
    result: Result<Cqe, HostError>,
) {
    st.phase = Phase::Done;
    st.read_buf = None;
    match st.post.take() {
        Some(post) => {
            drop(st);
            let Post {
                cq,
                tag,
                buf,
                queue,
                submitted,
                path,
            } = post;
            cq.post(Completed::command(
                tag, buf, result, queue, cid, submitted, path,
            ));
        }
        None => {
            st.result = Some(result);
            slot.cv.notify_one();
        }
    }
}

fn transport(addr: SocketAddr, reason: String) -> HostError {
    HostError::Transport { addr, reason }
}

/// ICReq / ICResp (NVMe/TCP 1.0 3.6.2.2-3.6.2.3): the host asks for no alignment of the
/// data it receives (HPDA 0, which Linux requires too), the digests it wants, and one R2T
/// per command (MAXR2T 0's based); the controller must echo the digests and announce a
/// usable MAXH2CDATA.
fn handshake(stream: &TcpStream, cfg: &QueueConfig) -> Result<(IcReq, IcResp), HostError> {
    let addr = cfg.addr;
    let icreq = IcReq {
        pfv: 0,
        hpda: 0,
        hdgst: cfg.header_digest,
        ddgst: cfg.data_digest,
        maxr2t: 0,
    };
    stream
        .set_read_timeout(Some(cfg.connect_timeout))
        .map_err(|e| transport(addr, format!("configuring socket: {e}")))?;
    let mut writer = stream;
    crate::wire::write_pdu(
        &mut writer,
        &PduHeader::IcReq(icreq),
        &[],
        &DigestConfig::NONE,
    )
    .map_err(|e| transport(addr, format!("sending ICReq: {e}")))?;
    let mut reader = PduReader::new(Side::Host, MAX_PDU_BYTES_MIN, DigestConfig::NONE);
    let mut input = stream;
    let pdu = reader
        .read_header(&mut input)
        .map_err(|e| transport(addr, format!("reading ICResp: {e}")))?;
    let icresp = match pdu.header {
        PduHeader::IcResp(icresp) => icresp,
        other => {
            let reason = format!("expected ICResp, got {}", other.pdu_type());
            return Err(HostError::Protocol { addr, reason });
        }
    };
    check_icresp(addr, &icreq, &icresp)?;
    Ok((icreq, icresp))
}

fn check_icresp(addr: SocketAddr, icreq: &IcReq, icresp: &IcResp) -> Result<(), HostError> {
    let reason = if icresp.pfv != 0 {
        format!("ICResp PDU format version {} (only 0 exists)", icresp.pfv)
    } else if icresp.hdgst != icreq.hdgst {
        format!(
            "header digest requested {}, controller answered {}",
            icreq.hdgst, icresp.hdgst
        )
    } else if icresp.ddgst != icreq.ddgst {
        format!(
            "data digest requested {}, controller answered {}",
            icreq.ddgst, icresp.ddgst
        )
    } else if icresp.maxh2cdata < crate::wire::pdu::MAXH2CDATA_MIN
        || !icresp.maxh2cdata.is_multiple_of(4)
    {
        format!(
            "ICResp MAXH2CDATA {} (must be a multiple of 4, at least 4096)",
            icresp.maxh2cdata
        )
    } else {
        return Ok(());
    };
    Err(HostError::Protocol { addr, reason })
}

/// What to tell the administrator about a refused Connect.
fn connect_hint(status: Status, dw0: u32) -> String {
    let code = status.code();
    if code == Status::CONNECT_INVALID_HOST.code() {
        "; this host NQN is not allowed on the subsystem: add it to the subsystem's allowed \
         hosts on the drive server"
            .to_owned()
    } else if code == Status::CONNECT_INVALID_PARAMETERS.code() {
        let (in_data, offset) = (dw0 >> 16 & 1 != 0, dw0 & 0xffff);
        match (in_data, offset) {
            (true, 256) => "; the subsystem NQN is unknown at this address: check it with \
                            `tessera nvme discover`"
                .to_owned(),
            (true, 512) => "; the controller rejected the host NQN".to_owned(),
            _ => format!("; invalid parameter at offset {offset} (in data: {in_data})"),
        }
    } else if code == Status::CONNECT_CONTROLLER_BUSY.code() {
        "; the controller is busy (its controller limit may be reached): retry later".to_owned()
    } else {
        String::new()
    }
}
