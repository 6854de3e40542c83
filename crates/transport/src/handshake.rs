//! The mutual-authentication handshake, client and server side, under one deadline.

use std::net::SocketAddr;
use std::time::Duration;

use hmac::Mac;
use rand::RngCore;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::error::WireError;
use crate::wire::{self, HandshakeMessage, RefusalCode, HANDSHAKE_HEADER_BYTES, NONCE_BYTES};
use crate::{ClusterId, Identity, TransportError, VersionRange};

/// What a successful handshake leaves: who the peer is and the per-direction frame keys.
pub(crate) struct Session {
    pub peer_name: String,
    pub version: u16,
    pub send_key: [u8; 32],
    pub recv_key: [u8; 32],
}

/// The socket, the peer's address and the deadline every read and write of the handshake
/// runs under, so a slow or silent peer costs at most the timeout.
pub(crate) struct HandshakeIo<'a> {
    pub stream: &'a mut TcpStream,
    pub peer: SocketAddr,
    pub deadline: Instant,
    pub timeout: Duration,
}

impl HandshakeIo<'_> {
    async fn write(
        &mut self,
        message: &HandshakeMessage,
        stage: &'static str,
    ) -> Result<(), TransportError> {
        let bytes = message.encode();
        let peer = self.peer;
        match tokio::time::timeout_at(self.deadline, self.stream.write_all(&bytes)).await {
            Err(_) => Err(TransportError::HandshakeTimeout {
                peer,
                timeout: self.timeout,
                stage,
            }),
            Ok(Err(source)) => Err(TransportError::Io {
                peer,
                doing: stage,
                source,
            }),
            Ok(Ok(())) => Ok(()),
        }
    }

    /// Reads one message; returns it and its exact bytes (for the transcript).
    async fn read(
        &mut self,
        stage: &'static str,
    ) -> Result<(HandshakeMessage, Vec<u8>), TransportError> {
        let peer = self.peer;
        let timeout = self.timeout;
        let read = read_message(self.stream, peer, stage);
        match tokio::time::timeout_at(self.deadline, read).await {
            Err(_) => Err(TransportError::HandshakeTimeout {
                peer,
                timeout,
                stage,
            }),
            Ok(result) => result,
        }
    }
}

async fn read_message(
    stream: &mut TcpStream,
    peer: SocketAddr,
    stage: &'static str,
) -> Result<(HandshakeMessage, Vec<u8>), TransportError> {
    let protocol = |source| TransportError::Protocol {
        peer,
        doing: stage,
        source,
    };
    let mut bytes = vec![0u8; HANDSHAKE_HEADER_BYTES];
    let have = read_full(stream, &mut bytes)
        .await
        .map_err(|source| TransportError::Io {
            peer,
            doing: stage,
            source,
        })?;
    if have == 0 {
        return Err(TransportError::ClosedDuringHandshake { peer, stage });
    }
    if have >= 4 && bytes[..4] != wire::HANDSHAKE_MAGIC {
        let found = bytes[..4].try_into().expect("four bytes");
        let expected = wire::HANDSHAKE_MAGIC;
        return Err(TransportError::NotTesseraPeer {
            peer,
            found,
            expected,
        });
    }
    if have < HANDSHAKE_HEADER_BYTES {
        let what = "handshake header";
        return Err(protocol(WireError::Truncated {
            what,
            have,
            need: HANDSHAKE_HEADER_BYTES,
        }));
    }
    let (kind, body_len) = wire::decode_handshake_header(&bytes).map_err(protocol)?;
    bytes.resize(HANDSHAKE_HEADER_BYTES + body_len, 0);
    let have = read_full(stream, &mut bytes[HANDSHAKE_HEADER_BYTES..])
        .await
        .map_err(|source| TransportError::Io {
            peer,
            doing: stage,
            source,
        })?;
    if have < body_len {
        return Err(protocol(WireError::Truncated {
            what: "handshake body",
            have,
            need: body_len,
        }));
    }
    let message =
        wire::decode_handshake_body(kind, &bytes[HANDSHAKE_HEADER_BYTES..]).map_err(protocol)?;
    Ok((message, bytes))
}

/// Reads until `buf` is full or the peer closes; returns how many bytes arrived.
pub(crate) async fn read_full<R: AsyncRead + Unpin>(
    stream: &mut R,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    let mut have = 0;
    while have < buf.len() {
        let count = stream.read(&mut buf[have..]).await?;
        if count == 0 {
            break;
        }
        have += count;
    }
    Ok(have)
}

fn random_nonce() -> [u8; NONCE_BYTES] {
    let mut nonce = [0u8; NONCE_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut nonce);
    nonce
}

/// Constant-time check of a proof the peer sent.
fn proof_matches(secret: &[u8; 32], label: &[u8], transcript: &[u8; 32], mac: &[u8]) -> bool {
    let mut expected = wire::HmacSha256::new_from_slice(secret).expect("any key length");
    expected.update(label);
    expected.update(transcript);
    expected.verify_slice(mac).is_ok()
}

fn unexpected(peer: SocketAddr, stage: &'static str, message: &HandshakeMessage) -> TransportError {
    let detail = format!("unexpected message {message:?}");
    let source = WireError::Invalid {
        what: "handshake order",
        detail,
    };
    TransportError::Protocol {
        peer,
        doing: stage,
        source,
    }
}

/// The client side: hello, check the server's hello, prove, check the server's proof.
pub(crate) async fn client(
    io: &mut HandshakeIo<'_>,
    identity: &Identity,
    versions: VersionRange,
) -> Result<Session, TransportError> {
    let hello = HandshakeMessage::ClientHello {
        version_min: versions.min,
        version_max: versions.max,
        cluster_id: identity.cluster_id,
        nonce: random_nonce(),
        node_name: identity.node_name.clone(),
    };
    let hello_bytes = hello.encode();
    io.write(&hello, "sending the client hello").await?;
    let stage = "waiting for the server hello";
    let (reply, reply_bytes) = io.read(stage).await?;
    let (version, peer_name) = match reply {
        HandshakeMessage::ServerHello {
            version,
            cluster_id,
            node_name,
            ..
        } => {
            check_server_hello(io.peer, identity.cluster_id, cluster_id, version, versions)?;
            (version, node_name)
        }
        HandshakeMessage::Refusal { .. } => {
            return Err(refused(io.peer, identity, versions, &reply))
        }
        other => return Err(unexpected(io.peer, stage, &other)),
    };
    let transcript = wire::transcript_hash(&hello_bytes, &reply_bytes);
    let secret = identity.secret.as_bytes();
    let mac = wire::keyed_digest(secret, wire::LABEL_CLIENT_PROOF, &transcript);
    io.write(
        &HandshakeMessage::ClientProof { mac },
        "sending the client proof",
    )
    .await?;
    let stage = "waiting for the server proof";
    match io.read(stage).await?.0 {
        HandshakeMessage::ServerProof { mac } => {
            if !proof_matches(secret, wire::LABEL_SERVER_PROOF, &transcript, &mac) {
                return Err(TransportError::AuthenticationFailed { peer: io.peer });
            }
        }
        reply @ HandshakeMessage::Refusal { .. } => {
            return Err(refused(io.peer, identity, versions, &reply))
        }
        other => return Err(unexpected(io.peer, stage, &other)),
    }
    Ok(Session {
        peer_name,
        version,
        send_key: wire::keyed_digest(secret, wire::LABEL_CLIENT_TO_SERVER, &transcript),
        recv_key: wire::keyed_digest(secret, wire::LABEL_SERVER_TO_CLIENT, &transcript),
    })
}

fn check_server_hello(
    peer: SocketAddr,
    ours: ClusterId,
    theirs: ClusterId,
    version: u16,
    versions: VersionRange,
) -> Result<(), TransportError> {
    if theirs != ours {
        return Err(TransportError::WrongCluster { peer, ours, theirs });
    }
    if !(versions.min..=versions.max).contains(&version) {
        let detail = format!("version {version} outside the offered {versions}");
        let source = WireError::Invalid {
            what: "server hello",
            detail,
        };
        return Err(TransportError::Protocol {
            peer,
            doing: "checking the server hello",
            source,
        });
    }
    Ok(())
}

/// Turns a server's refusal into the client's error, naming both sides' view.
fn refused(
    peer: SocketAddr,
    identity: &Identity,
    versions: VersionRange,
    refusal: &HandshakeMessage,
) -> TransportError {
    let HandshakeMessage::Refusal {
        code,
        cluster_id,
        version_min,
        version_max,
    } = *refusal
    else {
        unreachable!("called with a refusal only");
    };
    match code {
        RefusalCode::WrongCluster => TransportError::WrongCluster {
            peer,
            ours: identity.cluster_id,
            theirs: cluster_id,
        },
        RefusalCode::VersionMismatch => TransportError::VersionMismatch {
            peer,
            ours_min: versions.min,
            ours_max: versions.max,
            theirs_min: version_min,
            theirs_max: version_max,
        },
        RefusalCode::AuthenticationFailed => TransportError::AuthenticationFailed { peer },
        RefusalCode::Busy => TransportError::PeerBusy { peer },
        RefusalCode::Malformed => TransportError::RefusedAsMalformed { peer },
    }
}

/// The server side: check the hello, answer, check the client's proof, prove.
/// A refusal is sent to the client before the error is returned.
pub(crate) async fn server(
    io: &mut HandshakeIo<'_>,
    identity: &Identity,
    versions: VersionRange,
) -> Result<Session, TransportError> {
    let result = server_steps(io, identity, versions).await;
    if let Err(error) = &result {
        if let Some(code) = refusal_code(error) {
            let refusal = HandshakeMessage::Refusal {
                code,
                cluster_id: identity.cluster_id,
                version_min: versions.min,
                version_max: versions.max,
            };
            // Best effort: the peer may be gone already, and the error to report is the
            // refusal's reason, not a failure to deliver it.
            let _ = io.write(&refusal, "sending a refusal").await;
            let _ = io.stream.shutdown().await;
        }
    }
    result
}

fn refusal_code(error: &TransportError) -> Option<RefusalCode> {
    match error {
        TransportError::WrongCluster { .. } => Some(RefusalCode::WrongCluster),
        TransportError::VersionMismatch { .. } => Some(RefusalCode::VersionMismatch),
        TransportError::AuthenticationFailed { .. } => Some(RefusalCode::AuthenticationFailed),
        TransportError::Protocol { .. } => Some(RefusalCode::Malformed),
        _ => None,
    }
}

async fn server_steps(
    io: &mut HandshakeIo<'_>,
    identity: &Identity,
    versions: VersionRange,
) -> Result<Session, TransportError> {
    let peer = io.peer;
    let stage = "waiting for the client hello";
    let (hello, hello_bytes) = io.read(stage).await?;
    let HandshakeMessage::ClientHello {
        version_min,
        version_max,
        cluster_id,
        node_name,
        ..
    } = hello
    else {
        return Err(unexpected(peer, stage, &hello));
    };
    if cluster_id != identity.cluster_id {
        return Err(TransportError::WrongCluster {
            peer,
            ours: identity.cluster_id,
            theirs: cluster_id,
        });
    }
    let version = versions.max.min(version_max);
    if version < versions.min.max(version_min) {
        return Err(TransportError::VersionMismatch {
            peer,
            ours_min: versions.min,
            ours_max: versions.max,
            theirs_min: version_min,
            theirs_max: version_max,
        });
    }
    let reply = HandshakeMessage::ServerHello {
        version,
        cluster_id: identity.cluster_id,
        nonce: random_nonce(),
        node_name: identity.node_name.clone(),
    };
    let reply_bytes = reply.encode();
    io.write(&reply, "sending the server hello").await?;
    let transcript = wire::transcript_hash(&hello_bytes, &reply_bytes);
    let secret = identity.secret.as_bytes();
    let stage = "waiting for the client proof";
    let proof = io.read(stage).await?.0;
    let HandshakeMessage::ClientProof { mac } = proof else {
        return Err(unexpected(peer, stage, &proof));
    };
    if !proof_matches(secret, wire::LABEL_CLIENT_PROOF, &transcript, &mac) {
        return Err(TransportError::AuthenticationFailed { peer });
    }
    let mac = wire::keyed_digest(secret, wire::LABEL_SERVER_PROOF, &transcript);
    io.write(
        &HandshakeMessage::ServerProof { mac },
        "sending the server proof",
    )
    .await?;
    Ok(Session {
        peer_name: node_name,
        version,
        send_key: wire::keyed_digest(secret, wire::LABEL_SERVER_TO_CLIENT, &transcript),
        recv_key: wire::keyed_digest(secret, wire::LABEL_CLIENT_TO_SERVER, &transcript),
    })
}
