//! Handshakes on real loopback TCP: the good path and every refusal, each seen from both
//! sides, and a server that keeps serving good clients after garbage, resets and slow peers.

mod common;

use std::time::Duration;

use common::{
    accept_one, cluster_pair, identity, refused_connect, start_server, Request, Response, TIMEOUT,
};
use tessera_transport::wire::{self, HandshakeMessage};
use tessera_transport::{
    connect, connect_with, ClusterId, ClusterSecret, HandshakeOptions, ServeOptions,
    TransportError, VersionRange,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn ping_ok(addr: std::net::SocketAddr, client: &tessera_transport::Identity) {
    let mut connection = connect(&addr.to_string(), client, TIMEOUT)
        .await
        .expect("connect");
    let response: Response = connection
        .call(&Request::Ping { nonce: 7 }, TIMEOUT)
        .await
        .expect("ping");
    assert_eq!(
        response,
        Response::Pong {
            nonce: 7,
            from: "node1".to_owned()
        }
    );
}

#[tokio::test]
async fn handshake_and_round_trips_of_several_message_types() {
    let (server_identity, client_identity) = cluster_pair();
    let server = start_server(server_identity, ServeOptions::default()).await;
    let mut connection = connect(&server.addr.to_string(), &client_identity, TIMEOUT)
        .await
        .expect("connect");
    assert_eq!(connection.peer_name(), "node1");
    assert_eq!(connection.peer_addr(), server.addr);
    assert_eq!(connection.protocol_version(), 1);
    for nonce in 0..100u64 {
        let response: Response = connection
            .call(&Request::Ping { nonce }, TIMEOUT)
            .await
            .unwrap();
        assert_eq!(
            response,
            Response::Pong {
                nonce,
                from: "node1".to_owned()
            }
        );
    }
    let renew = Request::RenewLease {
        node: "node2".to_owned(),
        epoch: 41,
    };
    let granted: Response = connection.call(&renew, TIMEOUT).await.unwrap();
    assert_eq!(
        granted,
        Response::LeaseGranted {
            epoch: 42,
            duration_ms: 35_000
        }
    );
    let blob: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let sum = blob.iter().map(|b| u64::from(*b)).sum();
    let digest: Response = connection
        .call(&Request::Blob(blob), TIMEOUT)
        .await
        .unwrap();
    assert_eq!(
        digest,
        Response::BlobDigest {
            bytes: 100_000,
            sum
        }
    );
    connection.close().await.expect("clean close");
}

#[tokio::test]
async fn clean_close_is_none_and_a_vanished_peer_is_connection_lost() {
    let (server_identity, client_identity) = cluster_pair();
    let (addr, accepted) = accept_one(server_identity.clone(), TIMEOUT).await;
    let client = connect(&addr.to_string(), &client_identity, TIMEOUT)
        .await
        .unwrap();
    let mut server_side = accepted.await.unwrap().expect("accepted");
    assert_eq!(server_side.peer_name(), "node2");
    client.close().await.unwrap();
    assert_eq!(server_side.recv::<Request>().await.unwrap(), None);
    assert_eq!(
        server_side.recv::<Request>().await.unwrap(),
        None,
        "stays closed"
    );

    let (addr, accepted) = accept_one(server_identity, TIMEOUT).await;
    let raw = common::RawPeer::connect(addr, &client_identity).await;
    let mut server_side = accepted.await.unwrap().expect("accepted");
    drop(raw); // a TCP close with no close frame: a crash, not an orderly end
    let error = server_side.recv::<Request>().await.unwrap_err();
    assert!(
        matches!(error, TransportError::ConnectionLost { .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("without saying goodbye"),
        "{error}"
    );
}

#[tokio::test]
async fn dropping_a_connection_says_goodbye() {
    let (server_identity, client_identity) = cluster_pair();
    let (addr, accepted) = accept_one(server_identity, TIMEOUT).await;
    let mut client = connect(&addr.to_string(), &client_identity, TIMEOUT)
        .await
        .unwrap();
    let mut server_side = accepted.await.unwrap().expect("accepted");
    client.send(&Request::Ping { nonce: 1 }).await.unwrap();
    drop(client);
    assert_eq!(
        server_side.recv::<Request>().await.unwrap(),
        Some(Request::Ping { nonce: 1 })
    );
    assert_eq!(server_side.recv::<Request>().await.unwrap(), None);
}

#[tokio::test]
async fn wrong_secret_on_the_client_is_refused_by_both_sides() {
    let (server_identity, mut client_identity) = cluster_pair();
    client_identity.secret = ClusterSecret::generate();
    let (addr, accepted) = accept_one(server_identity, TIMEOUT).await;
    let error = refused_connect(addr, &client_identity).await;
    assert!(
        matches!(error, TransportError::AuthenticationFailed { .. }),
        "{error}"
    );
    let text = error.to_string();
    assert!(
        text.contains("does not hold this cluster's secret"),
        "{text}"
    );
    assert!(text.contains("$TESSERA_HOME/cluster.secret"), "{text}");
    assert!(text.contains("join token"), "{text}");
    let server_error = accepted.await.unwrap().unwrap_err();
    assert!(
        matches!(server_error, TransportError::AuthenticationFailed { .. }),
        "{server_error}"
    );
}

/// An impostor server that does not hold the secret but answers the protocol must not get
/// a node to talk to it: the client checks the server's proof.
#[tokio::test]
async fn client_refuses_a_server_without_the_secret() {
    let (mut server_identity, client_identity) = cluster_pair();
    server_identity.secret = ClusterSecret::generate();
    let (addr, accepted) = accept_one(server_identity, TIMEOUT).await;
    let error = refused_connect(addr, &client_identity).await;
    assert!(
        matches!(error, TransportError::AuthenticationFailed { .. }),
        "{error}"
    );
    assert!(accepted.await.unwrap().is_err());

    // A hand-made impostor that skips the check and sends a made-up proof.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cluster_id = client_identity.cluster_id;
    let impostor = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 1024];
        let _ = stream.read(&mut buf).await.unwrap();
        let hello = HandshakeMessage::ServerHello {
            version: 1,
            cluster_id,
            nonce: [9; 32],
            node_name: "impostor".to_owned(),
        };
        stream.write_all(&hello.encode()).await.unwrap();
        let _ = stream.read(&mut buf).await.unwrap();
        let proof = HandshakeMessage::ServerProof { mac: [0x5a; 32] };
        stream.write_all(&proof.encode()).await.unwrap();
        let _ = stream.read(&mut buf).await;
    });
    let error = refused_connect(addr, &client_identity).await;
    assert!(
        matches!(error, TransportError::AuthenticationFailed { .. }),
        "{error}"
    );
    impostor.abort();
}

#[tokio::test]
async fn wrong_cluster_id_names_both_ids() {
    let (server_identity, _) = cluster_pair();
    let other = ClusterId::generate();
    let client_identity = identity("stranger", other, &server_identity.secret);
    let (addr, accepted) = accept_one(server_identity.clone(), TIMEOUT).await;
    let error = refused_connect(addr, &client_identity).await;
    let text = error.to_string();
    assert!(
        matches!(error, TransportError::WrongCluster { .. }),
        "{text}"
    );
    assert!(text.contains(&other.to_string()), "{text}");
    assert!(
        text.contains(&server_identity.cluster_id.to_string()),
        "{text}"
    );
    let server_text = accepted.await.unwrap().unwrap_err().to_string();
    assert!(server_text.contains(&other.to_string()), "{server_text}");
    assert!(
        server_text.contains(&server_identity.cluster_id.to_string()),
        "{server_text}"
    );
}

#[tokio::test]
async fn version_mismatch_names_both_ranges_and_overlap_picks_the_highest() {
    let (server_identity, client_identity) = cluster_pair();
    let (addr, accepted) = accept_one(server_identity.clone(), TIMEOUT).await;
    let future = HandshakeOptions {
        timeout: TIMEOUT,
        versions: VersionRange { min: 3, max: 5 },
    };
    let error = connect_with(&addr.to_string(), &client_identity, future)
        .await
        .unwrap_err();
    assert!(
        matches!(error, TransportError::VersionMismatch { .. }),
        "{error}"
    );
    let text = error.to_string();
    assert!(text.contains("3..=5") && text.contains("1..=1"), "{text}");
    let server_text = accepted.await.unwrap().unwrap_err().to_string();
    assert!(
        server_text.contains("3..=5") && server_text.contains("1..=1"),
        "{server_text}"
    );

    let server = start_server(server_identity, ServeOptions::default()).await;
    let wider = HandshakeOptions {
        timeout: TIMEOUT,
        versions: VersionRange { min: 1, max: 4 },
    };
    let connection = connect_with(&server.addr.to_string(), &client_identity, wider).await;
    assert_eq!(
        connection.expect("overlapping ranges").protocol_version(),
        1
    );
}

#[tokio::test]
async fn client_reports_a_peer_that_is_not_tessera() {
    let (_, client_identity) = cluster_pair();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        stream.write_all(b"SSH-2.0-OpenSSH_9.6\r\n").await.unwrap();
        let mut buf = [0u8; 512];
        let _ = stream.read(&mut buf).await;
    });
    let error = refused_connect(addr, &client_identity).await;
    assert!(
        matches!(error, TransportError::NotTesseraPeer { .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains("not a Tessera daemon"),
        "{error}"
    );
    fake.abort();

    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let error = connect(&closed.to_string(), &client_identity, TIMEOUT)
        .await
        .unwrap_err();
    assert!(matches!(error, TransportError::Connect { .. }), "{error}");
}

#[tokio::test]
async fn server_refuses_garbage_and_keeps_serving_good_clients() {
    let (server_identity, client_identity) = cluster_pair();
    let server = start_server(server_identity, ServeOptions::default()).await;
    let garbage: [&[u8]; 5] = [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"TSHK\x09\x00\x00",             // unknown kind
        b"TSHK\x01\xff\xff",             // body length over the bound
        b"TSHK\x01\x05\x00abcde",        // a hello that is far too short
        b"TSFR\x01\x00\x00\x00\x00\x00", // a frame before any handshake
    ];
    for bytes in garbage {
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        stream.write_all(bytes).await.unwrap();
        let mut reply = Vec::new();
        let read = tokio::time::timeout(TIMEOUT, stream.read_to_end(&mut reply)).await;
        assert!(read.is_ok(), "server closes the connection after {bytes:?}");
        ping_ok(server.addr, &client_identity).await;
    }
    for seed in 0..20u64 {
        let noise: Vec<u8> = (0..(seed * 97 % 2000 + 1))
            .map(|i| (i * 31 + seed * 7) as u8)
            .collect();
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        let _ = stream.write_all(&noise).await;
        drop(stream);
    }
    // A connection reset (RST) by the peer in the middle of a handshake.
    let stream = TcpStream::connect(server.addr).await.unwrap();
    // A zero linger makes close send RST and never blocks, which is the point here.
    #[allow(deprecated)]
    stream.set_linger(Some(Duration::ZERO)).unwrap();
    drop(stream);
    ping_ok(server.addr, &client_identity).await;
}

#[tokio::test]
async fn malformed_hello_gets_a_refusal_the_client_can_read() {
    let (server_identity, _) = cluster_pair();
    let server = start_server(server_identity, ServeOptions::default()).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream.write_all(b"TSHK\x01\x05\x00abcde").await.unwrap();
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).await.unwrap();
    let message = HandshakeMessage::decode(&reply).expect("a refusal");
    assert!(matches!(
        message,
        HandshakeMessage::Refusal {
            code: wire::RefusalCode::Malformed,
            ..
        }
    ));
}

#[tokio::test]
async fn truncated_handshakes_are_refused_both_ways() {
    let (server_identity, client_identity) = cluster_pair();
    let (addr, accepted) = accept_one(server_identity.clone(), TIMEOUT).await;
    let hello = HandshakeMessage::ClientHello {
        version_min: 1,
        version_max: 1,
        cluster_id: client_identity.cluster_id,
        nonce: [1; 32],
        node_name: "node2".to_owned(),
    }
    .encode();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(&hello[..hello.len() - 3]).await.unwrap();
    stream.shutdown().await.unwrap();
    let error = accepted.await.unwrap().unwrap_err();
    assert!(
        error.to_string().contains("truncated handshake body"),
        "{error}"
    );

    // A server that answers half a hello, then closes.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let half = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 1024];
        let _ = stream.read(&mut buf).await.unwrap();
        stream.write_all(b"TSHK\x02\x33\x00\x01\x00").await.unwrap();
    });
    let error = refused_connect(addr, &client_identity).await;
    assert!(matches!(error, TransportError::Protocol { .. }), "{error}");
    assert!(error.to_string().contains("truncated"), "{error}");
    half.await.unwrap();

    // A server that accepts and closes at once.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let closer = tokio::spawn(async move { drop(listener.accept().await.unwrap()) });
    let error = refused_connect(addr, &client_identity).await;
    assert!(
        matches!(
            error,
            TransportError::ClosedDuringHandshake { .. } | TransportError::Io { .. }
        ),
        "{error}"
    );
    closer.await.unwrap();
}

#[tokio::test]
async fn slow_peers_hit_the_timeout_on_both_sides() {
    let (server_identity, client_identity) = cluster_pair();
    let short = Duration::from_millis(300);
    let (addr, accepted) = accept_one(server_identity, short).await;
    let silent = TcpStream::connect(addr).await.unwrap();
    let started = std::time::Instant::now();
    let error = accepted.await.unwrap().unwrap_err();
    assert!(
        matches!(error, TransportError::HandshakeTimeout { .. }),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    drop(silent);

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mute = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(10)).await;
        drop(stream);
    });
    let error = connect(&addr.to_string(), &client_identity, short)
        .await
        .unwrap_err();
    assert!(
        matches!(error, TransportError::HandshakeTimeout { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("server hello"), "{error}");
    mute.abort();
}

/// Silent peers that hold every handshake slot get later connections refused as busy,
/// and once they time out the server serves again.
#[tokio::test]
async fn slow_peers_cannot_exhaust_the_server() {
    let (server_identity, client_identity) = cluster_pair();
    let options = ServeOptions {
        handshake: HandshakeOptions {
            timeout: Duration::from_millis(500),
            ..HandshakeOptions::default()
        },
        handshakes_in_flight_max: 4,
    };
    let server = start_server(server_identity, options).await;
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(TcpStream::connect(server.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let error = connect(&server.addr.to_string(), &client_identity, TIMEOUT)
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            TransportError::PeerBusy { .. }
                | TransportError::ClosedDuringHandshake { .. }
                | TransportError::Io { .. }
        ),
        "{error}"
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    ping_ok(server.addr, &client_identity).await;
    drop(silent);
}

#[tokio::test]
async fn invalid_node_names_are_refused_before_connecting() {
    let (_, mut client_identity) = cluster_pair();
    client_identity.node_name = "two words".to_owned();
    let error = connect("127.0.0.1:9", &client_identity, TIMEOUT)
        .await
        .unwrap_err();
    assert!(
        matches!(error, TransportError::InvalidArgument { .. }),
        "{error}"
    );
}
