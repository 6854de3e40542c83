//! Frames after the handshake on real loopback TCP: size bounds, tampering, replay,
//! reordering, truncation and call timeouts. A hand-driven client (tests/common) writes the
//! raw bytes the documented layout describes.

mod common;

use std::time::Duration;

use common::{accept_one, cluster_pair, RawPeer, Request, Response, TIMEOUT};
use tessera_transport::wire::{self, FrameHeader};
use tessera_transport::{connect, TransportError, FRAME_PAYLOAD_BYTES_MAX};
use tokio::io::AsyncWriteExt;

async fn raw_pair() -> (RawPeer, tessera_transport::Connection) {
    let (server_identity, client_identity) = cluster_pair();
    let (addr, accepted) = accept_one(server_identity, TIMEOUT).await;
    let raw = RawPeer::connect(addr, &client_identity).await;
    let server_side = accepted.await.unwrap().expect("accepted");
    (raw, server_side)
}

#[tokio::test]
async fn raw_frames_from_the_documented_layout_are_accepted_and_answered() {
    let (mut raw, mut server_side) = raw_pair().await;
    for nonce in 0..3 {
        let frame = raw.seal(&Request::Ping { nonce });
        raw.write(&frame).await;
        let request: Request = server_side.recv().await.unwrap().unwrap();
        assert_eq!(request, Request::Ping { nonce });
        let response = Response::Pong {
            nonce,
            from: "node1".to_owned(),
        };
        server_side.send(&response).await.unwrap();
        assert_eq!(raw.read_response(nonce).await, response);
    }
}

#[tokio::test]
async fn payload_near_the_bound_round_trips_and_one_past_it_is_refused_by_the_sender() {
    let (server_identity, client_identity) = cluster_pair();
    let (addr, accepted) = accept_one(server_identity, TIMEOUT).await;
    let mut client = connect(&addr.to_string(), &client_identity, TIMEOUT)
        .await
        .unwrap();
    let mut server_side = accepted.await.unwrap().unwrap();
    // postcard frames a Vec<u8> with a varint length (4 bytes at this size).
    let near = vec![0xa5u8; FRAME_PAYLOAD_BYTES_MAX - 4];
    let receiver = tokio::spawn(async move {
        let got: Vec<u8> = server_side.recv().await.unwrap().unwrap();
        (got.len(), got.iter().all(|b| *b == 0xa5), server_side)
    });
    client.send(&near).await.expect("largest message");
    let (len, intact, _server_side) = receiver.await.unwrap();
    assert_eq!(len, FRAME_PAYLOAD_BYTES_MAX - 4);
    assert!(intact);
    let over = vec![0u8; FRAME_PAYLOAD_BYTES_MAX - 3];
    let error = client.send(&over).await.unwrap_err();
    assert!(
        matches!(error, TransportError::MessageTooLarge { .. }),
        "{error}"
    );
    client
        .send(&Request::Ping { nonce: 1 })
        .await
        .expect("still usable: nothing was sent");
}

/// The receiver refuses an oversize length from the header alone: the test sends only the
/// header and keeps the socket open, so a receiver that tried to read (or allocate) the
/// payload first would hang instead of answering.
#[tokio::test]
async fn oversize_length_is_refused_from_the_header_before_allocation() {
    for length in [FRAME_PAYLOAD_BYTES_MAX as u32 + 1, u32::MAX] {
        let (mut raw, mut server_side) = raw_pair().await;
        let mut header = FrameHeader {
            version: 1,
            flags: 0,
            payload_bytes: 0,
        }
        .encode();
        header[8..12].copy_from_slice(&length.to_le_bytes());
        raw.write(&header).await;
        let result = tokio::time::timeout(TIMEOUT, server_side.recv::<Request>()).await;
        let error = result.expect("answered from the header").unwrap_err();
        assert!(matches!(error, TransportError::Protocol { .. }), "{error}");
        assert!(error.to_string().contains("exceeds the limit"), "{error}");
        let again = server_side.recv::<Request>().await.unwrap_err();
        assert!(matches!(again, TransportError::Broken { .. }), "{again}");
    }
}

#[tokio::test]
async fn a_flipped_bit_anywhere_in_a_frame_is_caught() {
    let probe = {
        let (mut raw, _) = raw_pair().await;
        raw.seal(&Request::RenewLease {
            node: "node2".to_owned(),
            epoch: 9,
        })
    };
    for bit in 0..probe.len() * 8 {
        let (mut raw, mut server_side) = raw_pair().await;
        let mut frame = raw.seal(&Request::RenewLease {
            node: "node2".to_owned(),
            epoch: 9,
        });
        frame[bit / 8] ^= 1 << (bit % 8);
        raw.write(&frame).await;
        raw.stream.shutdown().await.unwrap();
        let result = tokio::time::timeout(TIMEOUT, server_side.recv::<Request>()).await;
        let error = result
            .expect("no hang")
            .expect_err("tampered frame refused");
        let expected = match bit / 8 {
            // Magic, version and flags are checked before the MAC.
            0..=7 => matches!(error, TransportError::Protocol { .. }),
            // A flipped length bit makes the frame shorter (MAC fails) or longer
            // (the stream ends first).
            8..=11 => matches!(
                error,
                TransportError::FrameAuthentication { .. }
                    | TransportError::TruncatedFrame { .. }
                    | TransportError::Protocol { .. }
            ),
            _ => matches!(error, TransportError::FrameAuthentication { .. }),
        };
        assert!(expected, "bit {bit}: {error}");
    }
}

#[tokio::test]
async fn replayed_reordered_and_dropped_frames_are_refused() {
    let (mut raw, mut server_side) = raw_pair().await;
    let first = raw.seal(&Request::Ping { nonce: 1 });
    raw.write(&first).await;
    assert_eq!(
        server_side.recv::<Request>().await.unwrap(),
        Some(Request::Ping { nonce: 1 })
    );
    raw.write(&first).await;
    let error = server_side.recv::<Request>().await.unwrap_err();
    assert!(
        matches!(error, TransportError::FrameAuthentication { .. }),
        "replay: {error}"
    );

    let (mut raw, mut server_side) = raw_pair().await;
    let zero = raw.seal(&Request::Ping { nonce: 0 });
    let one = raw.seal(&Request::Ping { nonce: 1 });
    raw.write(&one).await;
    raw.write(&zero).await;
    let error = server_side.recv::<Request>().await.unwrap_err();
    assert!(
        matches!(error, TransportError::FrameAuthentication { .. }),
        "reorder: {error}"
    );

    let (mut raw, mut server_side) = raw_pair().await;
    let _dropped = raw.seal(&Request::Ping { nonce: 0 });
    let after = raw.seal(&Request::Ping { nonce: 1 });
    raw.write(&after).await;
    let error = server_side.recv::<Request>().await.unwrap_err();
    assert!(
        matches!(error, TransportError::FrameAuthentication { .. }),
        "drop: {error}"
    );
}

/// A frame from one connection is useless on another (different session keys), and a
/// frame reflected back to its sender fails too (different key per direction).
#[tokio::test]
async fn frames_do_not_transfer_between_connections_or_directions() {
    let (mut raw_a, _server_a) = raw_pair().await;
    let (mut raw_b, mut server_b) = raw_pair().await;
    let from_a = raw_a.seal(&Request::Ping { nonce: 5 });
    let _ = raw_b.seal(&Request::Ping { nonce: 5 });
    raw_b.write(&from_a).await;
    let error = server_b.recv::<Request>().await.unwrap_err();
    assert!(
        matches!(error, TransportError::FrameAuthentication { .. }),
        "{error}"
    );

    let (mut raw, _) = raw_pair().await;
    let mine = raw.seal(&Request::Ping { nonce: 5 });
    let reflected = wire::open_frame(&raw.recv, 0, 1, &mine);
    assert_eq!(reflected.unwrap_err(), tessera_transport::WireError::BadMac);
}

#[tokio::test]
async fn truncated_frame_is_reported_with_its_size() {
    let (mut raw, mut server_side) = raw_pair().await;
    let frame = raw.seal(&Request::Blob(vec![7; 1000]));
    raw.write(&frame[..500]).await;
    raw.stream.shutdown().await.unwrap();
    let error = server_side.recv::<Request>().await.unwrap_err();
    assert!(
        matches!(error, TransportError::TruncatedFrame { have: 500, .. }),
        "{error}"
    );

    let (mut raw, mut server_side) = raw_pair().await;
    let frame = raw.seal(&Request::Ping { nonce: 0 });
    raw.write(&frame[..5]).await;
    raw.stream.shutdown().await.unwrap();
    let error = server_side.recv::<Request>().await.unwrap_err();
    assert!(
        matches!(
            error,
            TransportError::TruncatedFrame {
                have: 5,
                need: 12,
                ..
            }
        ),
        "{error}"
    );
}

#[tokio::test]
async fn a_message_of_the_wrong_type_is_a_decode_error() {
    let (mut raw, mut server_side) = raw_pair().await;
    let frame = raw.seal(&"not a request, a string".to_owned());
    raw.write(&frame).await;
    let error = server_side.recv::<Request>().await.unwrap_err();
    assert!(matches!(error, TransportError::Decode { .. }), "{error}");
    // The frame was authentic and consumed: the connection carries on.
    let frame = raw.seal(&Request::Ping { nonce: 3 });
    raw.write(&frame).await;
    assert_eq!(
        server_side.recv::<Request>().await.unwrap(),
        Some(Request::Ping { nonce: 3 })
    );
}

#[tokio::test]
async fn a_call_without_answer_times_out_and_breaks_the_connection() {
    let (server_identity, client_identity) = cluster_pair();
    let (addr, accepted) = accept_one(server_identity, TIMEOUT).await;
    let mut client = connect(&addr.to_string(), &client_identity, TIMEOUT)
        .await
        .unwrap();
    let mut server_side = accepted.await.unwrap().unwrap();
    let short = Duration::from_millis(200);
    let error = client
        .call::<_, Response>(&Request::Ping { nonce: 1 }, short)
        .await
        .unwrap_err();
    assert!(
        matches!(error, TransportError::CallTimeout { .. }),
        "{error}"
    );
    assert_eq!(
        server_side.recv::<Request>().await.unwrap(),
        Some(Request::Ping { nonce: 1 })
    );
    let error = client
        .call::<_, Response>(&Request::Ping { nonce: 2 }, TIMEOUT)
        .await
        .unwrap_err();
    assert!(matches!(error, TransportError::Broken { .. }), "{error}");

    // A server that closes instead of answering.
    let (server_identity, client_identity) = cluster_pair();
    let (addr, accepted) = accept_one(server_identity, TIMEOUT).await;
    let mut client = connect(&addr.to_string(), &client_identity, TIMEOUT)
        .await
        .unwrap();
    let mut server_side = accepted.await.unwrap().unwrap();
    let closer = tokio::spawn(async move {
        let _: Option<Request> = server_side.recv().await.unwrap();
        server_side.close().await.unwrap();
    });
    let error = client
        .call::<_, Response>(&Request::Fail, TIMEOUT)
        .await
        .unwrap_err();
    assert!(
        matches!(error, TransportError::ClosedBeforeResponse { .. }),
        "{error}"
    );
    closer.await.unwrap();
}
