//! Every pure decoder on arbitrary bytes: never a panic, always an error or a value that
//! encodes back to the same bytes. The saved corpus (tests/corpus/) runs as a normal test:
//! files named `<decoder>-<what>.bin` must be refused by that decoder.

use std::path::Path;

use proptest::prelude::*;
use tessera_transport::wire::{self, FrameHeader, FrameMac, HandshakeMessage};
use tessera_transport::{ClusterSecret, JoinToken};

fn handshake_round_trip(bytes: &[u8]) {
    if let Ok(message) = HandshakeMessage::decode(bytes) {
        assert_eq!(
            message.encode(),
            bytes,
            "a decoded message encodes to the same bytes"
        );
    }
    let _ = wire::decode_handshake_header(bytes);
    for kind in 0..=6 {
        if let Ok(message) = wire::decode_handshake_body(kind, bytes) {
            assert_eq!(&message.encode()[wire::HANDSHAKE_HEADER_BYTES..], bytes);
        }
    }
}

fn frame_round_trip(bytes: &[u8]) {
    if let Ok(header) = FrameHeader::decode(bytes, 1) {
        assert!(header.payload_bytes <= wire::FRAME_PAYLOAD_BYTES_MAX);
        assert_eq!(&header.encode()[..], &bytes[..wire::FRAME_HEADER_BYTES]);
    }
    let mac = FrameMac::new(&[7; 32]);
    if let Ok((header, payload)) = wire::open_frame(&mac, 0, 1, bytes) {
        assert_eq!(wire::seal_frame(&mac, 0, 1, header.flags, payload), bytes);
    }
}

fn token_round_trip(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    if let Ok(token) = JoinToken::parse(&text) {
        assert_eq!(JoinToken::parse(&token.encode().unwrap()).unwrap(), token);
    }
    let prefixed = format!(
        "{}{}",
        tessera_transport::JOIN_TOKEN_PREFIX,
        wire::hex_encode(bytes)
    );
    if let Ok(token) = JoinToken::parse(&prefixed) {
        assert_eq!(token.encode().unwrap(), prefixed);
    }
}

fn secret_round_trip(bytes: &[u8]) {
    if let Ok(secret) = ClusterSecret::parse_file_text(Path::new("fuzz"), bytes) {
        let text = secret.to_file_text();
        assert!(text.as_bytes() == bytes || &text.as_bytes()[..64] == bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn handshake_decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        handshake_round_trip(&bytes);
    }

    #[test]
    fn handshake_decoders_survive_magic_prefixed_input(
        kind in 0u8..8,
        body in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let mut bytes = wire::HANDSHAKE_MAGIC.to_vec();
        bytes.push(kind);
        bytes.extend_from_slice(&(body.len() as u16).to_le_bytes());
        bytes.extend_from_slice(&body);
        handshake_round_trip(&bytes);
    }

    #[test]
    fn frame_decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        frame_round_trip(&bytes);
    }

    #[test]
    fn frame_decoders_survive_magic_prefixed_input(
        flags in any::<u16>(),
        length in prop_oneof![0u32..64, any::<u32>()],
        rest in proptest::collection::vec(any::<u8>(), 0..100),
    ) {
        let mut bytes = wire::FRAME_MAGIC.to_vec();
        bytes.extend_from_slice(&1u16.to_le_bytes());
        bytes.extend_from_slice(&flags.to_le_bytes());
        bytes.extend_from_slice(&length.to_le_bytes());
        bytes.extend_from_slice(&rest);
        frame_round_trip(&bytes);
    }

    #[test]
    fn join_token_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        token_round_trip(&bytes);
    }

    #[test]
    fn secret_file_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        secret_round_trip(&bytes);
    }

    #[test]
    fn handshake_messages_round_trip(
        name in "[a-z0-9.-]{1,255}",
        nonce in any::<[u8; 32]>(),
        id in any::<[u8; 16]>(),
        low in 1u16..10,
        span in 0u16..10,
    ) {
        let message = HandshakeMessage::ClientHello {
            version_min: low,
            version_max: low + span,
            cluster_id: tessera_transport::ClusterId(id),
            nonce,
            node_name: name,
        };
        prop_assert_eq!(HandshakeMessage::decode(&message.encode()).unwrap(), message);
    }
}

#[test]
fn saved_corpus_is_refused_without_panics() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("corpus directory") {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(&path).unwrap();
        let refused = match name.split('-').next().unwrap() {
            "handshake" => HandshakeMessage::decode(&bytes).is_err(),
            "frame" => wire::open_frame(&FrameMac::new(&[7; 32]), 0, 1, &bytes).is_err(),
            "token" => JoinToken::parse(&String::from_utf8_lossy(&bytes)).is_err(),
            "secret" => ClusterSecret::parse_file_text(&path, &bytes).is_err(),
            other => panic!("corpus file {name}: unknown decoder {other:?}"),
        };
        assert!(refused, "corpus file {name} was accepted");
        handshake_round_trip(&bytes);
        frame_round_trip(&bytes);
        token_round_trip(&bytes);
        secret_round_trip(&bytes);
        seen += 1;
    }
    assert!(seen >= 12, "corpus has {seen} files");
}
