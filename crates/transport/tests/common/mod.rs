//! Shared helpers: identities, a running `serve` on a loopback port, and a hand-driven
//! client that completes the handshake from the documented layout and then writes raw
//! frames (for the tamper, replay and truncation tests).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tessera_transport::wire::{self, FrameMac, HandshakeMessage};
use tessera_transport::{ClusterId, ClusterSecret, Connection, Identity, ServeOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub const TIMEOUT: Duration = Duration::from_secs(5);

pub fn identity(name: &str, cluster_id: ClusterId, secret: &ClusterSecret) -> Identity {
    Identity {
        cluster_id,
        node_name: name.to_owned(),
        secret: secret.clone(),
    }
}

/// Two nodes of one cluster.
pub fn cluster_pair() -> (Identity, Identity) {
    let (id, secret) = (ClusterId::generate(), ClusterSecret::generate());
    (
        identity("node1", id, &secret),
        identity("node2", id, &secret),
    )
}

/// Messages of the kind the cluster layer will send.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    Ping { nonce: u64 },
    RenewLease { node: String, epoch: u64 },
    Blob(Vec<u8>),
    Fail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Response {
    Pong { nonce: u64, from: String },
    LeaseGranted { epoch: u64, duration_ms: u32 },
    BlobDigest { bytes: usize, sum: u64 },
}

pub fn answer(request: &Request, me: &str) -> Option<Response> {
    Some(match request {
        Request::Ping { nonce } => Response::Pong {
            nonce: *nonce,
            from: me.to_owned(),
        },
        Request::RenewLease { epoch, .. } => Response::LeaseGranted {
            epoch: epoch + 1,
            duration_ms: 35_000,
        },
        Request::Blob(bytes) => Response::BlobDigest {
            bytes: bytes.len(),
            sum: bytes.iter().map(|b| u64::from(*b)).sum(),
        },
        Request::Fail => return None,
    })
}

/// A `serve` task answering `Request`s; aborted when dropped.
pub struct Server {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn start_server(identity: Identity, options: ServeOptions) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local address");
    let me = identity.node_name.clone();
    let task = tokio::spawn(tessera_transport::serve_with(
        listener,
        Arc::new(identity),
        options,
        move |connection| serve_requests(connection, me.clone()),
    ));
    Server { addr, task }
}

async fn serve_requests(mut connection: Connection, me: String) {
    while let Ok(Some(request)) = connection.recv::<Request>().await {
        let Some(response) = answer(&request, &me) else {
            return;
        };
        if connection.send(&response).await.is_err() {
            return;
        }
    }
}

/// A client that does the handshake by hand, then writes frames byte by byte.
pub struct RawPeer {
    pub stream: TcpStream,
    pub send: FrameMac,
    pub recv: FrameMac,
    pub send_sequence: u64,
    pub version: u16,
}

async fn read_message(stream: &mut TcpStream) -> (HandshakeMessage, Vec<u8>) {
    let mut bytes = vec![0u8; wire::HANDSHAKE_HEADER_BYTES];
    stream
        .read_exact(&mut bytes)
        .await
        .expect("handshake header");
    let (_, body_len) = wire::decode_handshake_header(&bytes).expect("valid header");
    bytes.resize(wire::HANDSHAKE_HEADER_BYTES + body_len, 0);
    stream
        .read_exact(&mut bytes[wire::HANDSHAKE_HEADER_BYTES..])
        .await
        .expect("body");
    (
        HandshakeMessage::decode(&bytes).expect("valid message"),
        bytes,
    )
}

impl RawPeer {
    pub async fn connect(addr: SocketAddr, identity: &Identity) -> RawPeer {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let hello = HandshakeMessage::ClientHello {
            version_min: 1,
            version_max: 1,
            cluster_id: identity.cluster_id,
            nonce: rand::random(),
            node_name: identity.node_name.clone(),
        }
        .encode();
        stream.write_all(&hello).await.expect("send hello");
        let (reply, reply_bytes) = read_message(&mut stream).await;
        let HandshakeMessage::ServerHello { version, .. } = reply else {
            panic!("expected a server hello, got {reply:?}");
        };
        let transcript = wire::transcript_hash(&hello, &reply_bytes);
        let secret = identity.secret.as_bytes();
        let mac = wire::keyed_digest(secret, wire::LABEL_CLIENT_PROOF, &transcript);
        stream
            .write_all(&HandshakeMessage::ClientProof { mac }.encode())
            .await
            .expect("proof");
        let (proof, _) = read_message(&mut stream).await;
        let expected = wire::keyed_digest(secret, wire::LABEL_SERVER_PROOF, &transcript);
        assert_eq!(proof, HandshakeMessage::ServerProof { mac: expected });
        let send_key = wire::keyed_digest(secret, wire::LABEL_CLIENT_TO_SERVER, &transcript);
        let recv_key = wire::keyed_digest(secret, wire::LABEL_SERVER_TO_CLIENT, &transcript);
        RawPeer {
            stream,
            send: FrameMac::new(&send_key),
            recv: FrameMac::new(&recv_key),
            send_sequence: 0,
            version,
        }
    }

    /// The next frame this peer would send for `message`, without sending it.
    pub fn seal<T: Serialize>(&mut self, message: &T) -> Vec<u8> {
        let payload = postcard::to_stdvec(message).expect("encode");
        let frame = wire::seal_frame(&self.send, self.send_sequence, self.version, 0, &payload);
        self.send_sequence += 1;
        frame
    }

    pub async fn write(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("raw write");
    }

    /// Reads one frame the server sent and decodes it under the expected sequence number.
    pub async fn read_response(&mut self, sequence: u64) -> Response {
        let mut header = [0u8; wire::FRAME_HEADER_BYTES];
        self.stream
            .read_exact(&mut header)
            .await
            .expect("frame header");
        let decoded = wire::FrameHeader::decode(&header, self.version).expect("valid header");
        let mut frame = header.to_vec();
        frame.resize(
            wire::FRAME_HEADER_BYTES + decoded.payload_bytes + wire::FRAME_MAC_BYTES,
            0,
        );
        self.stream
            .read_exact(&mut frame[wire::FRAME_HEADER_BYTES..])
            .await
            .expect("frame");
        let (_, payload) =
            wire::open_frame(&self.recv, sequence, self.version, &frame).expect("authentic frame");
        postcard::from_bytes(payload).expect("decodes")
    }
}

/// Connects to `addr` as `identity`, expecting the connection to be refused.
pub async fn refused_connect(
    addr: SocketAddr,
    identity: &Identity,
) -> tessera_transport::TransportError {
    tessera_transport::connect(&addr.to_string(), identity, TIMEOUT)
        .await
        .expect_err("the connection is refused")
}

/// A listener whose accepted connections go to `tessera_transport::accept` one at a time;
/// the results come back on a channel.
pub async fn accept_one(
    identity: Identity,
    timeout: Duration,
) -> (
    SocketAddr,
    tokio::task::JoinHandle<Result<Connection, tessera_transport::TransportError>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local address");
    let task = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.expect("accept");
        tessera_transport::accept(stream, &identity, timeout).await
    });
    (addr, task)
}
