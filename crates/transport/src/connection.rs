//! Authenticated connections: connect, accept, serve, and framed messages on them.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::blocking::BlockingConnection;
use crate::error::WireError;
use crate::handshake::{self, read_full, HandshakeIo, Session};
use crate::wire::{self, FrameHeader, FrameMac, HandshakeMessage, RefusalCode};
use crate::wire::{FLAG_CLOSE, FRAME_HEADER_BYTES, FRAME_MAC_BYTES, FRAME_PAYLOAD_BYTES_MAX};
use crate::{Identity, TransportError, VersionRange};

/// Default bound on a whole handshake (TCP connect included on the client side).
pub const HANDSHAKE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Default bound on connections a server holds in handshake at once; beyond it new
/// connections are refused as busy, so a flood of silent peers costs bounded memory.
pub const HANDSHAKES_IN_FLIGHT_MAX_DEFAULT: usize = 64;
/// Read buffer per connection; frames larger than it are read straight into their buffer.
const READ_BUFFER_BYTES: usize = 64 << 10;
/// A send or receive buffer grown beyond this by one large frame is shrunk back afterwards.
const BUFFER_KEEP_BYTES: usize = 8 << 20;
/// Wait after a failed `accept` (out of file descriptors, say) before the next.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(100);

/// How a handshake runs: its time bound and the protocol versions offered.
#[derive(Debug, Clone, Copy)]
pub struct HandshakeOptions {
    pub timeout: Duration,
    pub versions: VersionRange,
}

impl Default for HandshakeOptions {
    fn default() -> Self {
        HandshakeOptions {
            timeout: HANDSHAKE_TIMEOUT_DEFAULT,
            versions: VersionRange::SUPPORTED,
        }
    }
}

/// How [`serve_with`] treats connections before they are authenticated.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    pub handshake: HandshakeOptions,
    pub handshakes_in_flight_max: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            handshake: HandshakeOptions::default(),
            handshakes_in_flight_max: HANDSHAKES_IN_FLIGHT_MAX_DEFAULT,
        }
    }
}

/// Connects to `addr` (`host:port`) and authenticates both ways within `timeout`.
pub async fn connect(
    addr: &str,
    identity: &Identity,
    timeout: Duration,
) -> Result<Connection, TransportError> {
    connect_with(
        addr,
        identity,
        HandshakeOptions {
            timeout,
            ..HandshakeOptions::default()
        },
    )
    .await
}

/// [`connect`] with explicit options.
pub async fn connect_with(
    addr: &str,
    identity: &Identity,
    options: HandshakeOptions,
) -> Result<Connection, TransportError> {
    identity.validate()?;
    options.versions.validate()?;
    let deadline = Instant::now() + options.timeout;
    let connect_error = |source| TransportError::Connect {
        addr: addr.to_owned(),
        source,
    };
    let stream = match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
        Ok(result) => result.map_err(connect_error)?,
        Err(_) => {
            let detail = format!("no TCP connection within {:?}", options.timeout);
            return Err(connect_error(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                detail,
            )));
        }
    };
    let peer = stream.peer_addr().map_err(connect_error)?;
    let mut stream = stream;
    let mut io = HandshakeIo {
        stream: &mut stream,
        peer,
        deadline,
        timeout: options.timeout,
    };
    let session = handshake::client(&mut io, identity, options.versions).await?;
    tracing::debug!(%peer, peer_name = %session.peer_name, "connected");
    Connection::new(stream, peer, session)
}

/// Authenticates an accepted TCP connection within `timeout`. A refusal is sent to the
/// peer when the protocol allows, and logged with the peer's address.
pub async fn accept(
    stream: TcpStream,
    identity: &Identity,
    timeout: Duration,
) -> Result<Connection, TransportError> {
    accept_with(
        stream,
        identity,
        HandshakeOptions {
            timeout,
            ..HandshakeOptions::default()
        },
    )
    .await
}

/// [`accept`] with explicit options.
pub async fn accept_with(
    mut stream: TcpStream,
    identity: &Identity,
    options: HandshakeOptions,
) -> Result<Connection, TransportError> {
    identity.validate()?;
    options.versions.validate()?;
    let peer = stream
        .peer_addr()
        .map_err(|source| TransportError::AcceptedVanished { source })?;
    let deadline = Instant::now() + options.timeout;
    let mut io = HandshakeIo {
        stream: &mut stream,
        peer,
        deadline,
        timeout: options.timeout,
    };
    match handshake::server(&mut io, identity, options.versions).await {
        Ok(session) => {
            tracing::debug!(%peer, peer_name = %session.peer_name, "accepted");
            Connection::new(stream, peer, session)
        }
        Err(error) => {
            tracing::warn!(%peer, "refused a connection: {error}");
            Err(error)
        }
    }
}

/// Accepts connections forever with default options; see [`serve_with`].
pub async fn serve<F, Fut>(listener: TcpListener, identity: Arc<Identity>, handler: F)
where
    F: Fn(Connection) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    serve_with(listener, identity, ServeOptions::default(), handler).await
}

/// Accepts connections until the task running it is aborted. Each handshake runs in its own
/// task under the handshake timeout, at most `handshakes_in_flight_max` at once (more are
/// refused as busy); each authenticated connection goes to `handler` in that task.
/// Refusals are logged by [`accept_with`]; garbage, resets and slow peers only cost their
/// own task.
pub async fn serve_with<F, Fut>(
    listener: TcpListener,
    identity: Arc<Identity>,
    options: ServeOptions,
    handler: F,
) where
    F: Fn(Connection) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    assert!(
        options.handshakes_in_flight_max > 0,
        "a server must admit some handshakes"
    );
    let handler = Arc::new(handler);
    let in_flight = Arc::new(Semaphore::new(options.handshakes_in_flight_max));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!("accepting a connection failed: {error}; retrying");
                tokio::time::sleep(ACCEPT_RETRY_DELAY).await;
                continue;
            }
        };
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            tracing::warn!(
                %peer,
                "refused a connection: {} handshakes already in progress",
                options.handshakes_in_flight_max
            );
            refuse_busy(&stream, &identity, options.handshake.versions);
            continue;
        };
        let (identity, handler) = (identity.clone(), handler.clone());
        tokio::spawn(async move {
            let accepted = accept_with(stream, &identity, options.handshake).await;
            drop(permit);
            if let Ok(connection) = accepted {
                handler(connection).await;
            }
        });
    }
}

pub(crate) fn check_open(state: State, peer: SocketAddr) -> Result<(), TransportError> {
    match state {
        State::Open | State::PeerClosed => Ok(()),
        State::Broken | State::Closed => Err(TransportError::Broken { peer }),
    }
}

/// Tells a peer the server is busy without waiting for it: a full socket buffer just means
/// the peer sees a closed connection instead.
fn refuse_busy(stream: &TcpStream, identity: &Identity, versions: VersionRange) {
    let refusal = HandshakeMessage::Refusal {
        code: RefusalCode::Busy,
        cluster_id: identity.cluster_id,
        version_min: versions.min,
        version_max: versions.max,
    };
    let _ = stream.try_write(&refusal.encode());
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Open,
    /// An error, or a send or receive cancelled half-way, left the stream out of step.
    Broken,
    /// The peer sent its close frame; nothing more will arrive.
    PeerClosed,
    /// This side sent its close frame.
    Closed,
}

/// An authenticated connection to one peer. Messages are postcard-encoded serde values in
/// MAC-protected frames; see the crate doc for the layout.
pub struct Connection {
    stream: BufReader<TcpStream>,
    framing: Framing,
    send_buffer: Vec<u8>,
    recv_buffer: Vec<u8>,
    state: State,
}

/// What both kinds of connection (this async one and [`BlockingConnection`]) need to frame
/// messages: the peer, the negotiated version, and each direction's key and sequence.
#[derive(Clone)]
pub(crate) struct Framing {
    pub(crate) peer_addr: SocketAddr,
    pub(crate) peer_name: String,
    pub(crate) version: u16,
    send_mac: FrameMac,
    recv_mac: FrameMac,
    send_sequence: u64,
    recv_sequence: u64,
}

impl Framing {
    /// `message` encoded into `buffer` (cleared) after room for the frame header.
    pub(crate) fn encode<T: Serialize>(
        &self,
        message: &T,
        mut buffer: Vec<u8>,
    ) -> Result<Vec<u8>, TransportError> {
        let peer = self.peer_addr;
        buffer.clear();
        buffer.resize(FRAME_HEADER_BYTES, 0);
        let buffer =
            postcard::to_extend(message, buffer).map_err(|error| TransportError::Encode {
                peer,
                detail: error.to_string(),
            })?;
        let payload_bytes = buffer.len() - FRAME_HEADER_BYTES;
        if payload_bytes > FRAME_PAYLOAD_BYTES_MAX {
            let max = FRAME_PAYLOAD_BYTES_MAX;
            return Err(TransportError::MessageTooLarge {
                peer,
                len: payload_bytes,
                max,
            });
        }
        Ok(buffer)
    }

    /// Fills in the header of `frame` and appends its MAC, as the next frame sent.
    pub(crate) fn seal(&self, flags: u16, frame: &mut Vec<u8>) {
        wire::seal_frame_in_place(
            &self.send_mac,
            self.send_sequence,
            self.version,
            flags,
            frame,
        );
    }

    /// Counts a sealed frame as sent (once all of it was written).
    pub(crate) fn sent(&mut self) {
        self.send_sequence += 1;
    }

    /// The whole length of the frame whose header is `header` (checked and bounded).
    pub(crate) fn frame_bytes(
        &self,
        header: &[u8],
    ) -> Result<(FrameHeader, usize), TransportError> {
        let decoded = FrameHeader::decode(header, self.version).map_err(|source| {
            TransportError::Protocol {
                peer: self.peer_addr,
                doing: "receiving a frame",
                source,
            }
        })?;
        Ok((
            decoded,
            FRAME_HEADER_BYTES + decoded.payload_bytes + FRAME_MAC_BYTES,
        ))
    }

    /// Authenticates the next received frame, `frame` (exactly its bytes); its flags.
    pub(crate) fn open(
        &mut self,
        decoded: FrameHeader,
        frame: &[u8],
    ) -> Result<u16, TransportError> {
        let peer = self.peer_addr;
        match wire::open_frame(&self.recv_mac, self.recv_sequence, self.version, frame) {
            Ok((frame_header, _)) => {
                assert_eq!(frame_header, decoded);
                self.recv_sequence += 1;
                Ok(frame_header.flags)
            }
            Err(WireError::BadMac) => Err(TransportError::FrameAuthentication { peer }),
            Err(source) => Err(TransportError::Protocol {
                peer,
                doing: "receiving a frame",
                source,
            }),
        }
    }

    /// The message in the payload of an opened frame.
    pub(crate) fn decode<T: DeserializeOwned>(&self, frame: &[u8]) -> Result<T, TransportError> {
        let peer = self.peer_addr;
        let payload = &frame[FRAME_HEADER_BYTES..frame.len() - FRAME_MAC_BYTES];
        match postcard::take_from_bytes::<T>(payload) {
            Ok((message, [])) => Ok(message),
            Ok((_, rest)) => {
                let detail = format!("{} bytes left over after the message", rest.len());
                Err(TransportError::Decode { peer, detail })
            }
            Err(error) => Err(TransportError::Decode {
                peer,
                detail: error.to_string(),
            }),
        }
    }

    /// A close frame, sealed as the next frame sent.
    pub(crate) fn close_frame(&self) -> Vec<u8> {
        wire::seal_frame(
            &self.send_mac,
            self.send_sequence,
            self.version,
            FLAG_CLOSE,
            &[],
        )
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("peer_name", &self.framing.peer_name)
            .field("peer_addr", &self.framing.peer_addr)
            .field("version", &self.framing.version)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl Connection {
    fn new(
        stream: TcpStream,
        peer_addr: SocketAddr,
        session: Session,
    ) -> Result<Connection, TransportError> {
        assert_ne!(
            session.send_key, session.recv_key,
            "each direction has its own key"
        );
        // Small request/response messages must not wait for Nagle's timer.
        stream
            .set_nodelay(true)
            .map_err(|source| TransportError::Io {
                peer: peer_addr,
                doing: "setting TCP_NODELAY",
                source,
            })?;
        Ok(Connection {
            stream: BufReader::with_capacity(READ_BUFFER_BYTES, stream),
            framing: Framing {
                peer_addr,
                peer_name: session.peer_name,
                version: session.version,
                send_mac: FrameMac::new(&session.send_key),
                recv_mac: FrameMac::new(&session.recv_key),
                send_sequence: 0,
                recv_sequence: 0,
            },
            send_buffer: Vec::new(),
            recv_buffer: Vec::new(),
            state: State::Open,
        })
    }

    /// The node name the peer proved (it holds the secret; the name itself is its claim).
    pub fn peer_name(&self) -> &str {
        &self.framing.peer_name
    }

    pub fn peer_addr(&self) -> SocketAddr {
        self.framing.peer_addr
    }

    /// The protocol version both sides agreed on.
    pub fn protocol_version(&self) -> u16 {
        self.framing.version
    }

    fn check_open(&self) -> Result<(), TransportError> {
        check_open(self.state, self.framing.peer_addr)
    }

    /// The same connection for a thread that blocks on it (see [`BlockingConnection`]),
    /// between two messages: whatever the peer sent since is carried over.
    pub fn into_blocking(mut self) -> Result<BlockingConnection, TransportError> {
        use std::os::fd::AsFd;
        self.check_open()?;
        let peer = self.framing.peer_addr;
        let io_error = |source| TransportError::Io {
            peer,
            doing: "making the connection blocking",
            source,
        };
        // A second descriptor of the same socket: the runtime's is closed when `self`
        // goes, after it was told to say no goodbye.
        let descriptor = self
            .stream
            .get_ref()
            .as_fd()
            .try_clone_to_owned()
            .map_err(io_error)?;
        let stream = std::net::TcpStream::from(descriptor);
        stream.set_nonblocking(false).map_err(io_error)?;
        let pending = self.stream.buffer().to_vec();
        let state = self.state;
        self.state = State::Closed;
        Ok(BlockingConnection::new(
            stream,
            self.framing.clone(),
            state,
            pending,
        ))
    }

    /// Sends one message. Cancelling the future half-way leaves the connection broken.
    pub async fn send<T: Serialize>(&mut self, message: &T) -> Result<(), TransportError> {
        self.check_open()?;
        let buffer = self
            .framing
            .encode(message, std::mem::take(&mut self.send_buffer))?;
        self.write_frame(0, buffer).await
    }

    /// Says goodbye: the peer's `recv` then returns `None`. Without it the peer sees
    /// [`TransportError::ConnectionLost`], which is how it tells a crash from a clean close.
    pub async fn close(mut self) -> Result<(), TransportError> {
        self.check_open()?;
        let mut buffer = std::mem::take(&mut self.send_buffer);
        buffer.clear();
        buffer.resize(FRAME_HEADER_BYTES, 0);
        self.write_frame(FLAG_CLOSE, buffer).await?;
        self.state = State::Closed;
        let peer = self.framing.peer_addr;
        let shutdown = self.stream.get_mut().shutdown().await;
        shutdown.map_err(|source| TransportError::Io {
            peer,
            doing: "closing",
            source,
        })
    }

    async fn write_frame(&mut self, flags: u16, mut frame: Vec<u8>) -> Result<(), TransportError> {
        self.framing.seal(flags, &mut frame);
        self.state = State::Broken;
        let written = self.stream.get_mut().write_all(&frame).await;
        if frame.capacity() > BUFFER_KEEP_BYTES {
            frame = Vec::new();
        }
        self.send_buffer = frame;
        let peer = self.framing.peer_addr;
        written.map_err(|source| TransportError::Io {
            peer,
            doing: "sending a frame",
            source,
        })?;
        self.framing.sent();
        self.state = State::Open;
        Ok(())
    }

    /// Receives one message; `None` once the peer has closed cleanly. Cancelling the future
    /// half-way leaves the connection broken.
    pub async fn recv<T: DeserializeOwned>(&mut self) -> Result<Option<T>, TransportError> {
        self.check_open()?;
        if self.state == State::PeerClosed {
            return Ok(None);
        }
        self.state = State::Broken;
        let flags = self.read_frame().await?;
        if flags & FLAG_CLOSE != 0 {
            self.state = State::PeerClosed;
            return Ok(None);
        }
        // The frame was authentic and is consumed, so the stream stays in step even if the
        // payload is not a `T`: the caller may answer "unsupported" and carry on.
        self.state = State::Open;
        let decoded = self.framing.decode::<T>(&self.recv_buffer);
        if self.recv_buffer.capacity() > BUFFER_KEEP_BYTES {
            self.recv_buffer = Vec::new();
        }
        decoded.map(Some)
    }

    /// Reads and authenticates one frame into `recv_buffer`; returns its flags.
    async fn read_frame(&mut self) -> Result<u16, TransportError> {
        let peer = self.framing.peer_addr;
        let io_error = |source| TransportError::Io {
            peer,
            doing: "receiving a frame",
            source,
        };
        let mut header = [0u8; FRAME_HEADER_BYTES];
        let have = read_full(&mut self.stream, &mut header)
            .await
            .map_err(io_error)?;
        if have == 0 {
            return Err(TransportError::ConnectionLost { peer });
        }
        if have < FRAME_HEADER_BYTES {
            return Err(TransportError::TruncatedFrame {
                peer,
                have,
                need: FRAME_HEADER_BYTES,
            });
        }
        // The length is bounded here, before the buffer is sized from it.
        let (decoded, need) = self.framing.frame_bytes(&header)?;
        self.recv_buffer.clear();
        self.recv_buffer.resize(need, 0);
        self.recv_buffer[..FRAME_HEADER_BYTES].copy_from_slice(&header);
        let rest = &mut self.recv_buffer[FRAME_HEADER_BYTES..];
        let got = read_full(&mut self.stream, rest).await.map_err(io_error)?;
        if got < need - FRAME_HEADER_BYTES {
            let have = FRAME_HEADER_BYTES + got;
            return Err(TransportError::TruncatedFrame { peer, have, need });
        }
        self.framing.open(decoded, &self.recv_buffer)
    }

    /// Sends `request` and waits for one response, both within `timeout`. On a timeout the
    /// connection is broken (a late response would answer the next call), so reconnect.
    pub async fn call<Req, Resp>(
        &mut self,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, TransportError>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        let peer = self.framing.peer_addr;
        let exchange = async {
            self.send(request).await?;
            self.recv::<Resp>().await
        };
        match tokio::time::timeout(timeout, exchange).await {
            Err(_) => {
                self.state = State::Broken;
                Err(TransportError::CallTimeout { peer, timeout })
            }
            Ok(Err(error)) => Err(error),
            Ok(Ok(None)) => Err(TransportError::ClosedBeforeResponse { peer }),
            Ok(Ok(Some(response))) => Ok(response),
        }
    }
}

impl Drop for Connection {
    /// Best-effort goodbye so the peer sees a clean close rather than a lost connection;
    /// a full socket buffer (the write would block) just skips it.
    fn drop(&mut self) {
        if self.state != State::Open {
            return;
        }
        let frame = self.framing.close_frame();
        let _ = self.stream.get_ref().try_write(&frame);
    }
}
