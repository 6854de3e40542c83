//! Errors of the transport: what is wrong, and what the operator should do about it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::{ClusterId, SECRET_FILE_NAME};

/// A defect in bytes received from a peer, found by a pure decoder (no peer context yet).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("bad magic {found:02x?} (expected {expected:02x?})")]
    BadMagic { found: [u8; 4], expected: [u8; 4] },
    #[error("truncated {what}: {have} of {need} bytes")]
    Truncated {
        what: &'static str,
        have: usize,
        need: usize,
    },
    #[error("{what} of {len} bytes exceeds the limit of {max} bytes")]
    TooLong {
        what: &'static str,
        len: u64,
        max: u64,
    },
    #[error("{what} is {len} bytes but its message holds {expected}")]
    LengthMismatch {
        what: &'static str,
        len: usize,
        expected: usize,
    },
    #[error("unknown {what} {value:#x}")]
    Unknown { what: &'static str, value: u32 },
    #[error("invalid {what}: {detail}")]
    Invalid { what: &'static str, detail: String },
    #[error("frame protocol version {found} but the connection negotiated {expected}")]
    VersionChanged { found: u16, expected: u16 },
    #[error(
        "frame MAC mismatch: the frame was corrupted, replayed or reordered, or one before it \
         was dropped"
    )]
    BadMac,
}

/// Every failure of the transport. Display says what is wrong and what to do.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("invalid {what} {value:?}: {detail}")]
    InvalidArgument {
        what: &'static str,
        value: String,
        detail: String,
    },
    #[error(
        "cannot connect to {addr}: {source}; check that the Tessera daemon runs there and that \
             the address and port are right"
    )]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("an accepted connection was gone before its handshake began: {source}")]
    AcceptedVanished { source: std::io::Error },
    #[error("I/O error with peer {peer} while {doing}: {source}")]
    Io {
        peer: SocketAddr,
        doing: &'static str,
        source: std::io::Error,
    },
    #[error(
        "peer {peer} is not a Tessera daemon (it sent {found:02x?} where a Tessera peer \
             sends {expected:02x?}); check the address and port"
    )]
    NotTesseraPeer {
        peer: SocketAddr,
        found: [u8; 4],
        expected: [u8; 4],
    },
    #[error(
        "peer {peer} belongs to cluster {theirs} but this node belongs to cluster {ours}; \
             check the address, or join this node to that cluster with its join token"
    )]
    WrongCluster {
        peer: SocketAddr,
        ours: ClusterId,
        theirs: ClusterId,
    },
    #[error("authentication failed with peer {peer}: the peer does not hold this cluster's \
             secret; copy $TESSERA_HOME/{file} from a cluster node (mode 0600) or use a join token",
             file = SECRET_FILE_NAME)]
    AuthenticationFailed { peer: SocketAddr },
    #[error(
        "protocol version mismatch with peer {peer}: this node speaks versions \
             {ours_min}..={ours_max}, the peer {theirs_min}..={theirs_max}; upgrade the older node"
    )]
    VersionMismatch {
        peer: SocketAddr,
        ours_min: u16,
        ours_max: u16,
        theirs_min: u16,
        theirs_max: u16,
    },
    #[error(
        "handshake with {peer} timed out after {timeout:?} while {stage}; the peer is \
             overloaded, hung, or not a Tessera daemon"
    )]
    HandshakeTimeout {
        peer: SocketAddr,
        timeout: Duration,
        stage: &'static str,
    },
    #[error("peer {peer} closed the connection while {stage}; see its log for the reason")]
    ClosedDuringHandshake {
        peer: SocketAddr,
        stage: &'static str,
    },
    #[error("peer {peer} is busy (too many connections in handshake); retry shortly")]
    PeerBusy { peer: SocketAddr },
    #[error(
        "peer {peer} refused our handshake as malformed; the two nodes run incompatible \
             software"
    )]
    RefusedAsMalformed { peer: SocketAddr },
    #[error(
        "protocol error from peer {peer} while {doing}: {source}; the connection was closed \
             (faulty or incompatible software, or a tampered connection)"
    )]
    Protocol {
        peer: SocketAddr,
        doing: &'static str,
        source: WireError,
    },
    #[error(
        "frame from peer {peer} failed authentication: it was corrupted, replayed or \
             reordered, or a frame was dropped; the connection was closed, reconnect"
    )]
    FrameAuthentication { peer: SocketAddr },
    #[error("peer {peer} closed the connection in the middle of a frame ({have} of {need} bytes)")]
    TruncatedFrame {
        peer: SocketAddr,
        have: usize,
        need: usize,
    },
    #[error(
        "peer {peer} closed the connection without saying goodbye (crashed, killed, or the \
             network cut it)"
    )]
    ConnectionLost { peer: SocketAddr },
    #[error(
        "message of {len} bytes for peer {peer} exceeds the frame limit of {max} bytes; \
             split it"
    )]
    MessageTooLarge {
        peer: SocketAddr,
        len: usize,
        max: usize,
    },
    #[error("cannot encode a message for peer {peer}: {detail}")]
    Encode { peer: SocketAddr, detail: String },
    #[error(
        "cannot decode a message from peer {peer}: {detail}; the nodes disagree on the \
             message type (a bug, or different software versions)"
    )]
    Decode { peer: SocketAddr, detail: String },
    #[error(
        "call to peer {peer} got no response within {timeout:?}; the connection was closed, \
             reconnect"
    )]
    CallTimeout { peer: SocketAddr, timeout: Duration },
    #[error("peer {peer} closed the connection before answering the call")]
    ClosedBeforeResponse { peer: SocketAddr },
    #[error(
        "connection to {peer} is unusable after an earlier error or a cancelled send/receive; \
             reconnect"
    )]
    Broken { peer: SocketAddr },
    #[error("cluster secret file {path}: {problem}")]
    SecretFile { path: PathBuf, problem: String },
    #[error(
        "join token damaged ({detail}); copy the whole token again from the node \
             that printed it"
    )]
    TokenDamaged { detail: String },
    #[error("not a join token: {detail}")]
    NotAToken { detail: String },
}
