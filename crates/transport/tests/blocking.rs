//! Connections turned blocking (`Connection::into_blocking`) on real loopback TCP: frames
//! stay in step across the switch on both sides, bytes the async side read ahead are kept,
//! a caller that stops waiting gets an error and a broken connection, and tampering is
//! caught as on async connections.

mod common;

use std::time::{Duration, Instant};

use common::{accept_one, cluster_pair, RawPeer, Request, Response, TIMEOUT};
use tessera_transport::{connect, BlockingConnection, Connection, TransportError};

async fn pair() -> (Connection, Connection) {
    let (server_identity, client_identity) = cluster_pair();
    let (addr, accepted) = accept_one(server_identity, TIMEOUT).await;
    let client = connect(&addr.to_string(), &client_identity, TIMEOUT)
        .await
        .unwrap();
    let server = accepted.await.unwrap().expect("accepted");
    (client, server)
}

/// A hand-driven client and the server's side of its connection, turned blocking.
async fn raw_peer_and_lane() -> (RawPeer, BlockingConnection) {
    let (server_identity, client_identity) = cluster_pair();
    let (addr, accepted) = accept_one(server_identity, TIMEOUT).await;
    let raw = RawPeer::connect(addr, &client_identity).await;
    let server = accepted.await.unwrap().expect("accepted");
    let lane = tokio::task::spawn_blocking(move || server.into_blocking().unwrap())
        .await
        .unwrap();
    (raw, lane)
}

/// The error of the next receive on `lane`.
async fn recv_error(mut lane: BlockingConnection) -> TransportError {
    tokio::task::spawn_blocking(move || lane.recv::<Request>().unwrap_err())
        .await
        .unwrap()
}

/// Answers every request on `lane` until the peer closes it; returns how many it answered.
fn serve(mut lane: BlockingConnection) -> usize {
    let mut answered = 0;
    while let Some(request) = lane.recv::<Request>().expect("a request or a goodbye") {
        let response = common::answer(&request, "node1").expect("answerable");
        lane.send(&response).unwrap();
        answered += 1;
    }
    answered
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_turned_blocking_on_both_sides_keeps_its_frames_in_step() {
    let (mut client, mut server) = pair().await;
    // First a call the async way, so that both directions' sequence numbers moved.
    client.send(&Request::Ping { nonce: 1 }).await.unwrap();
    let first: Request = server.recv().await.unwrap().unwrap();
    server
        .send(&common::answer(&first, "node1").unwrap())
        .await
        .unwrap();
    let _: Response = client.recv().await.unwrap().unwrap();

    let server = tokio::task::spawn_blocking(move || serve(server.into_blocking().unwrap()));
    let client = client.into_blocking().unwrap();
    let calls = tokio::task::spawn_blocking(move || {
        let mut client = client;
        for nonce in 2..50 {
            let pong: Response = client
                .call_while(
                    &Request::Ping { nonce },
                    TIMEOUT,
                    Duration::from_millis(50),
                    &mut || true,
                )
                .unwrap();
            assert_eq!(
                pong,
                Response::Pong {
                    nonce,
                    from: "node1".into()
                }
            );
        }
        // A message larger than a socket buffer arrives in many reads.
        let blob = vec![7u8; 3 << 20];
        let digest: Response = client
            .call_while(
                &Request::Blob(blob),
                TIMEOUT,
                Duration::from_millis(50),
                &mut || true,
            )
            .unwrap();
        assert_eq!(
            digest,
            Response::BlobDigest {
                bytes: 3 << 20,
                sum: 7 * (3 << 20)
            }
        );
        // Dropped: says goodbye, so the server's loop ends cleanly.
    });
    calls.await.unwrap();
    assert_eq!(
        server.await.unwrap(),
        49,
        "every blocking call was answered"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bytes_the_async_side_read_ahead_are_read_first_after_the_switch() {
    let (server_identity, client_identity) = cluster_pair();
    let (addr, accepted) = accept_one(server_identity, TIMEOUT).await;
    let mut raw = RawPeer::connect(addr, &client_identity).await;
    let mut server = accepted.await.unwrap().expect("accepted");
    // Three frames in one write: the async side's read buffer takes all of them with the
    // first, so the other two are in it when the connection turns blocking.
    let mut bytes = Vec::new();
    for nonce in 0..3 {
        bytes.extend(raw.seal(&Request::Ping { nonce }));
    }
    raw.write(&bytes).await;
    let first: Request = server.recv().await.unwrap().unwrap();
    assert_eq!(first, Request::Ping { nonce: 0 });
    let later = tokio::task::spawn_blocking(move || {
        let mut lane = server.into_blocking().unwrap();
        let second: Request = lane.recv().unwrap().unwrap();
        let third: Request = lane.recv().unwrap().unwrap();
        lane.send(&common::answer(&third, "node1").unwrap())
            .unwrap();
        (second, third, lane)
    });
    let (second, third, _lane) = later.await.unwrap();
    assert_eq!(second, Request::Ping { nonce: 1 });
    assert_eq!(third, Request::Ping { nonce: 2 });
    assert_eq!(
        raw.read_response(0).await,
        Response::Pong {
            nonce: 2,
            from: "node1".into()
        }
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_caller_that_stops_waiting_gets_an_error_and_a_broken_connection() {
    let (client, _server) = pair().await;
    let outcome = tokio::task::spawn_blocking(move || {
        let mut client = client.into_blocking().unwrap();
        // Nobody answers: the caller is asked every tick and says no at the third.
        let mut asked = 0;
        let started = Instant::now();
        let error = client
            .call_while::<_, Response>(
                &Request::Ping { nonce: 9 },
                TIMEOUT,
                Duration::from_millis(20),
                &mut || {
                    asked += 1;
                    asked < 3
                },
            )
            .unwrap_err();
        let waited = started.elapsed();
        let next = client.send(&Request::Ping { nonce: 10 }).unwrap_err();
        // And a deadline passes the same way when the caller would wait for ever.
        (asked, waited, error, next)
    });
    let (asked, waited, error, next) = outcome.await.unwrap();
    assert_eq!(asked, 3, "asked once per tick until it said no");
    assert!(
        waited < Duration::from_secs(2),
        "gave up at once: {waited:?}"
    );
    assert!(
        error.to_string().contains("gave up"),
        "the error says the caller gave up: {error}"
    );
    assert!(
        matches!(next, TransportError::Broken { .. }),
        "a connection whose answer may still come is not used again: {next}"
    );

    let (client, _server) = pair().await;
    let timed_out = tokio::task::spawn_blocking(move || {
        let mut client = client.into_blocking().unwrap();
        client
            .call_while::<_, Response>(
                &Request::Ping { nonce: 1 },
                Duration::from_millis(150),
                Duration::from_millis(40),
                &mut || true,
            )
            .unwrap_err()
    });
    let error = timed_out.await.unwrap();
    assert!(
        matches!(error, TransportError::CallTimeout { timeout, .. } if timeout == Duration::from_millis(150)),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tampered_frame_on_a_blocking_connection_is_refused() {
    let (mut raw, lane) = raw_peer_and_lane().await;
    let mut frame = raw.seal(&Request::Ping { nonce: 5 });
    // A bit of the payload (the header's length would make the reader wait for more).
    let payload = tessera_transport::wire::FRAME_HEADER_BYTES;
    frame[payload] ^= 0x10;
    raw.write(&frame).await;
    let error = recv_error(lane).await;
    assert!(
        matches!(error, TransportError::FrameAuthentication { .. }),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_peer_that_vanishes_is_a_lost_connection_not_a_clean_close() {
    let (raw, lane) = raw_peer_and_lane().await;
    // Gone without its goodbye frame, as a killed daemon.
    drop(raw);
    let error = recv_error(lane).await;
    assert!(
        matches!(error, TransportError::ConnectionLost { .. }),
        "{error}"
    );
}
