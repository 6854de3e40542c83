//! A connection served by a thread that blocks on it.
//!
//! Why: a request and its answer through the async runtime cost three or four thread
//! wake-ups besides the two the network needs (the runtime's I/O thread is woken by the
//! packet and wakes the task; a blocking call is handed to another thread and its result
//! handed back). On a small machine or a VM, where a wake-up of an idle CPU is an
//! inter-processor interrupt and a halt exit, those dominate a metadata request to
//! another node. A thread that owns the connection sends, and sleeps in `read` until the
//! answer's packet wakes it: one wake-up per direction. The frames are the same as
//! [`Connection`]'s (same keys, sequence numbers and checks); a connection is made and
//! authenticated async and turned into this one with [`Connection::into_blocking`],
//! between two messages, on either side.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::connection::{check_open, Framing, State};
use crate::wire::{FLAG_CLOSE, FRAME_HEADER_BYTES};
use crate::TransportError;

/// A send or receive buffer grown beyond this by one large frame is shrunk back afterwards.
const BUFFER_KEEP_BYTES: usize = 8 << 20;

/// An authenticated connection used by blocking calls; see the module doc. Like
/// [`Connection`], one message at a time, and broken (refusing further use) by an error
/// or a wait given up half-way.
///
/// [`Connection`]: crate::Connection
pub struct BlockingConnection {
    stream: TcpStream,
    framing: Framing,
    /// Bytes the peer sent that the async side had read ahead, read before the socket.
    pending: Vec<u8>,
    pending_at: usize,
    send_buffer: Vec<u8>,
    recv_buffer: Vec<u8>,
    state: State,
    /// The socket's receive timeout as last set (set again only when it changes).
    read_timeout: Option<Duration>,
}

impl std::fmt::Debug for BlockingConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockingConnection")
            .field("peer_name", &self.framing.peer_name)
            .field("peer_addr", &self.framing.peer_addr)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// What a receive does when the peer has been silent for a while.
enum Silence<'a> {
    /// Wait for ever (a server waiting for the next request).
    Forever,
    /// Ask `keep_waiting` every `tick`; give up (the connection is then broken) when it
    /// says no or `deadline` passed.
    Ask {
        tick: Duration,
        timeout: Duration,
        deadline: Instant,
        keep_waiting: &'a mut dyn FnMut() -> bool,
    },
}

impl BlockingConnection {
    pub(crate) fn new(
        stream: TcpStream,
        framing: Framing,
        state: State,
        pending: Vec<u8>,
    ) -> BlockingConnection {
        BlockingConnection {
            stream,
            framing,
            pending,
            pending_at: 0,
            send_buffer: Vec::new(),
            recv_buffer: Vec::new(),
            state,
            read_timeout: None,
        }
    }

    /// The node name the peer proved.
    pub fn peer_name(&self) -> &str {
        &self.framing.peer_name
    }

    pub fn peer_addr(&self) -> SocketAddr {
        self.framing.peer_addr
    }

    /// Sends one message.
    pub fn send<T: Serialize>(&mut self, message: &T) -> Result<(), TransportError> {
        check_open(self.state, self.framing.peer_addr)?;
        let mut frame = self
            .framing
            .encode(message, std::mem::take(&mut self.send_buffer))?;
        self.framing.seal(0, &mut frame);
        self.state = State::Broken;
        let written = self.stream.write_all(&frame);
        if frame.capacity() > BUFFER_KEEP_BYTES {
            frame = Vec::new();
        }
        self.send_buffer = frame;
        written.map_err(|source| TransportError::Io {
            peer: self.framing.peer_addr,
            doing: "sending a frame",
            source,
        })?;
        self.framing.sent();
        self.state = State::Open;
        Ok(())
    }

    /// Receives one message, waiting as long as it takes; `None` once the peer closed
    /// cleanly.
    pub fn recv<T: DeserializeOwned>(&mut self) -> Result<Option<T>, TransportError> {
        self.recv_with(Silence::Forever)
    }

    /// Sends `request` and waits for its answer until `timeout`, asking `keep_waiting`
    /// every `tick` whether the answer is still worth waiting for (its server may have
    /// been declared dead meanwhile). A wait given up breaks the connection (a late
    /// answer would answer the next call): drop it.
    pub fn call_while<Req, Resp>(
        &mut self,
        request: &Req,
        timeout: Duration,
        tick: Duration,
        keep_waiting: &mut dyn FnMut() -> bool,
    ) -> Result<Resp, TransportError>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        assert!(!tick.is_zero(), "a zero tick would never block");
        let deadline = Instant::now() + timeout;
        self.send(request)?;
        let silence = Silence::Ask {
            tick,
            timeout,
            deadline,
            keep_waiting,
        };
        match self.recv_with(silence)? {
            Some(response) => Ok(response),
            None => Err(TransportError::ClosedBeforeResponse {
                peer: self.framing.peer_addr,
            }),
        }
    }

    fn recv_with<T: DeserializeOwned>(
        &mut self,
        mut silence: Silence<'_>,
    ) -> Result<Option<T>, TransportError> {
        check_open(self.state, self.framing.peer_addr)?;
        if self.state == State::PeerClosed {
            return Ok(None);
        }
        self.state = State::Broken;
        let peer = self.framing.peer_addr;
        let mut header = [0u8; FRAME_HEADER_BYTES];
        let have = self.read_full(&mut header, &mut silence)?;
        if have == 0 {
            return Err(TransportError::ConnectionLost { peer });
        }
        if have < FRAME_HEADER_BYTES {
            let need = FRAME_HEADER_BYTES;
            return Err(TransportError::TruncatedFrame { peer, have, need });
        }
        // The length is bounded here, before the buffer is sized from it.
        let (decoded, need) = self.framing.frame_bytes(&header)?;
        let mut frame = std::mem::take(&mut self.recv_buffer);
        frame.clear();
        frame.resize(need, 0);
        frame[..FRAME_HEADER_BYTES].copy_from_slice(&header);
        let got = self.read_full(&mut frame[FRAME_HEADER_BYTES..], &mut silence);
        let got = match got {
            Ok(got) => got,
            Err(e) => {
                self.recv_buffer = frame;
                return Err(e);
            }
        };
        if got < need - FRAME_HEADER_BYTES {
            let have = FRAME_HEADER_BYTES + got;
            return Err(TransportError::TruncatedFrame { peer, have, need });
        }
        let flags = self.framing.open(decoded, &frame)?;
        if flags & FLAG_CLOSE != 0 {
            self.state = State::PeerClosed;
            return Ok(None);
        }
        // Authentic and consumed: the stream stays in step whatever the payload is.
        self.state = State::Open;
        let message = self.framing.decode::<T>(&frame);
        if frame.capacity() <= BUFFER_KEEP_BYTES {
            self.recv_buffer = frame;
        }
        message.map(Some)
    }

    /// Fills `buf` (first from what the async side read ahead); fewer bytes only at the
    /// end of the stream.
    fn read_full(
        &mut self,
        buf: &mut [u8],
        silence: &mut Silence<'_>,
    ) -> Result<usize, TransportError> {
        let peer = self.framing.peer_addr;
        let io_error = |source| TransportError::Io {
            peer,
            doing: "receiving a frame",
            source,
        };
        let mut have = 0;
        if self.pending_at < self.pending.len() {
            let left = &self.pending[self.pending_at..];
            let n = left.len().min(buf.len());
            buf[..n].copy_from_slice(&left[..n]);
            self.pending_at += n;
            have = n;
            if self.pending_at == self.pending.len() {
                self.pending = Vec::new();
                self.pending_at = 0;
            }
        }
        while have < buf.len() {
            let timeout = match silence {
                Silence::Forever => None,
                Silence::Ask { tick, deadline, .. } => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    // A zero timeout means none to the socket.
                    Some((*tick).min(left).max(Duration::from_millis(1)))
                }
            };
            if timeout != self.read_timeout {
                self.stream.set_read_timeout(timeout).map_err(io_error)?;
                self.read_timeout = timeout;
            }
            match self.stream.read(&mut buf[have..]) {
                Ok(0) => break,
                Ok(n) => have += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    let Silence::Ask {
                        deadline,
                        timeout,
                        keep_waiting,
                        ..
                    } = silence
                    else {
                        return Err(io_error(e));
                    };
                    if Instant::now() >= *deadline {
                        let timeout = *timeout;
                        return Err(TransportError::CallTimeout { peer, timeout });
                    }
                    if !keep_waiting() {
                        return Err(TransportError::Io {
                            peer,
                            doing: "waiting for an answer its caller gave up on",
                            source: e,
                        });
                    }
                }
                Err(e) => return Err(io_error(e)),
            }
        }
        Ok(have)
    }
}

impl Drop for BlockingConnection {
    /// Best-effort goodbye, as [`Connection`]'s: never blocks on a full socket buffer.
    ///
    /// [`Connection`]: crate::Connection
    fn drop(&mut self) {
        if self.state != State::Open {
            return;
        }
        let frame = self.framing.close_frame();
        if self.stream.set_nonblocking(true).is_ok() {
            let _ = self.stream.write(&frame);
        }
    }
}
