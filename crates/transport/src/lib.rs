//! The node transport: how Tessera daemons talk to each other over TCP.
//!
//! Every connection proves, in both directions, that its peer holds the cluster's secret
//! before any message is decoded; every frame is versioned, length-bounded and MAC-protected,
//! so a peer of another cluster, a port scanner or a truncated stream is refused with a
//! logged reason and never reaches the layers above. The transport carries any serde type
//! (postcard-encoded); the cluster layer defines the messages.
//!
//! It authenticates but does not encrypt: a peer on the path can read traffic but cannot
//! forge, alter, replay, reorder or drop a frame unnoticed. Daemons belong on a trusted
//! network, as GPFS's daemon network does.
//!
//! # Handshake
//!
//! Every handshake message has a 7-byte envelope, then its body (integers little-endian):
//!
//! | offset | bytes | field |
//! | --- | --- | --- |
//! | 0 | 4 | magic `TSHK` |
//! | 4 | 1 | kind: 1 client hello, 2 server hello, 3 client proof, 4 server proof, 5 refusal |
//! | 5 | 2 | body length, at most 512 |
//!
//! Bodies:
//! - client hello: version min (2), version max (2), cluster id (16), nonce (32),
//!   node name (1-byte length + UTF-8, 1..=255 bytes);
//! - server hello: chosen version (2), cluster id (16), nonce (32), node name;
//! - client proof, server proof: HMAC-SHA256 (32);
//! - refusal: code (1: wrong cluster, 2: version mismatch, 3: authentication failed,
//!   4: busy, 5: malformed), the server's cluster id (16), version min (2) and max (2),
//!   so the client's error can name both sides.
//!
//! The exchange: client hello → server hello (or refusal) → client proof → server proof
//! (or refusal). The transcript hash `T = SHA-256("tessera transcript v1" ‖ len(C) as u64 ‖
//! C ‖ S)` covers the two hellos byte for byte (C and S), so both nonces, the cluster id,
//! both names, the offered range and the chosen version. Proofs are
//! `HMAC(secret, label ‖ T)` with distinct labels for client and server, so a proof from
//! another connection or of the other role is useless. The server proves only after the
//! client has, so it never serves as an oracle to a peer without the secret; the client
//! checks the server's proof, so a node never talks to an impostor. Each direction's frame
//! key is `HMAC(secret, direction label ‖ T)`: distinct per connection and per direction, so
//! a frame cannot be replayed on another connection or reflected to its sender. The whole
//! handshake runs under one deadline.
//!
//! # Frames
//!
//! | offset | bytes | field |
//! | --- | --- | --- |
//! | 0 | 4 | magic `TSFR` |
//! | 4 | 2 | protocol version (the negotiated one; anything else is refused) |
//! | 6 | 2 | flags: bit 0 close (empty payload, the sender's last frame); others must be 0 |
//! | 8 | 4 | payload length n, at most [`FRAME_PAYLOAD_BYTES_MAX`] (checked before allocation) |
//! | 12 | n | payload: one postcard-encoded message |
//! | 12 + n | 16 | MAC: first 16 bytes of HMAC-SHA256(direction key, seq ‖ bytes 0..12+n) |
//!
//! `seq` is a u64 LE sequence number; it counts the frames of one direction from 0 and is
//! not sent: a replayed, reordered or dropped frame fails the MAC of the frame where it
//! shows. End of stream without a close frame is reported as a lost connection, never as a clean close,
//! so truncation cannot pass as an orderly end.
//!
//! # Versioning
//!
//! Version 1 is the only one. The client offers a range, the server picks the highest
//! common version or refuses with both ranges; frames carry the chosen version. A future
//! version changes what follows the hellos, never the envelope or the refusal.

mod blocking;
mod connection;
mod error;
mod handshake;
mod secret;
mod token;
pub mod wire;

use serde::{Deserialize, Serialize};

pub use blocking::BlockingConnection;
pub use connection::{
    accept, accept_with, connect, connect_with, serve, serve_with, Connection, HandshakeOptions,
    ServeOptions, HANDSHAKES_IN_FLIGHT_MAX_DEFAULT, HANDSHAKE_TIMEOUT_DEFAULT,
};
pub use error::{TransportError, WireError};
pub use secret::{ClusterSecret, SECRET_BYTES, SECRET_FILE_NAME};
pub use token::{validate_address, JoinToken, JOIN_TOKEN_PREFIX};
pub use wire::{validate_name, FRAME_PAYLOAD_BYTES_MAX};

/// A cluster's identity, drawn at random when the cluster is created.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClusterId(pub [u8; 16]);

impl ClusterId {
    pub fn generate() -> ClusterId {
        ClusterId(rand::random())
    }
}

impl From<[u8; 16]> for ClusterId {
    fn from(bytes: [u8; 16]) -> ClusterId {
        ClusterId(bytes)
    }
}

impl std::fmt::Display for ClusterId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&wire::hex_encode(&self.0))
    }
}

impl std::fmt::Debug for ClusterId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterId({self})")
    }
}

/// Who this node is to its peers.
#[derive(Debug, Clone)]
pub struct Identity {
    pub cluster_id: ClusterId,
    pub node_name: String,
    pub secret: ClusterSecret,
}

impl Identity {
    fn validate(&self) -> Result<(), TransportError> {
        validate_name(&self.node_name).map_err(|detail| TransportError::InvalidArgument {
            what: "node name",
            value: self.node_name.clone(),
            detail,
        })
    }
}

/// An inclusive range of protocol versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionRange {
    pub min: u16,
    pub max: u16,
}

impl VersionRange {
    /// The versions this build speaks.
    pub const SUPPORTED: VersionRange = VersionRange { min: 1, max: 1 };

    fn validate(&self) -> Result<(), TransportError> {
        if self.min == 0 || self.min > self.max {
            return Err(TransportError::InvalidArgument {
                what: "protocol version range",
                value: self.to_string(),
                detail: "needs 1 <= min <= max".to_owned(),
            });
        }
        Ok(())
    }
}

impl std::fmt::Display for VersionRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..={}", self.min, self.max)
    }
}
