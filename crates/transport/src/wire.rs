//! Every byte that crosses the socket: handshake messages and frames, with pure decoders.
//!
//! The layouts are documented in the crate doc. Decoders take a byte slice and return a value
//! or a [`WireError`]; they never panic, never allocate more than the bytes they are given,
//! and are run by the property tests and the saved corpus.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::error::WireError;
use crate::ClusterId;

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// First four bytes of every handshake message.
pub const HANDSHAKE_MAGIC: [u8; 4] = *b"TSHK";
/// First four bytes of every frame.
pub const FRAME_MAGIC: [u8; 4] = *b"TSFR";
/// Envelope of a handshake message: magic, kind (u8), body length (u16 LE).
pub const HANDSHAKE_HEADER_BYTES: usize = 7;
/// Largest handshake body; the largest legal one (a hello with a 255-byte name) is 308 bytes.
pub const HANDSHAKE_BODY_BYTES_MAX: usize = 512;
/// Frame header: magic, version (u16 LE), flags (u16 LE), payload length (u32 LE).
pub const FRAME_HEADER_BYTES: usize = 12;
/// MAC after each frame's payload: HMAC-SHA256 truncated to 128 bits.
pub const FRAME_MAC_BYTES: usize = 16;
/// Largest frame payload. Checked before any buffer is sized from a received length.
pub const FRAME_PAYLOAD_BYTES_MAX: usize = 64 << 20;
/// Longest node or cluster name (a DNS name fits; the length is one byte on the wire).
pub const NAME_BYTES_MAX: usize = 255;
/// Random bytes each side contributes to the handshake transcript.
pub const NONCE_BYTES: usize = 32;

/// Frame flag: the sender closes the connection after this (empty) frame.
pub const FLAG_CLOSE: u16 = 1;
const FLAGS_KNOWN: u16 = FLAG_CLOSE;

const _: () = assert!(FRAME_PAYLOAD_BYTES_MAX <= u32::MAX as usize);
const _: () = assert!(NAME_BYTES_MAX <= u8::MAX as usize);
const _: () = assert!(HELLO_FIXED_BYTES + NAME_BYTES_MAX <= HANDSHAKE_BODY_BYTES_MAX);
const _: () = assert!(HANDSHAKE_BODY_BYTES_MAX <= u16::MAX as usize);

const HELLO_FIXED_BYTES: usize = 4 + 16 + NONCE_BYTES + 1;
const PROOF_BYTES: usize = 32;

/// Why a server refused a handshake; sent to the client so both sides log the same reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalCode {
    WrongCluster = 1,
    VersionMismatch = 2,
    AuthenticationFailed = 3,
    Busy = 4,
    Malformed = 5,
}

impl RefusalCode {
    fn from_u8(value: u8) -> Result<RefusalCode, WireError> {
        Ok(match value {
            1 => RefusalCode::WrongCluster,
            2 => RefusalCode::VersionMismatch,
            3 => RefusalCode::AuthenticationFailed,
            4 => RefusalCode::Busy,
            5 => RefusalCode::Malformed,
            other => {
                return Err(WireError::Unknown {
                    what: "refusal code",
                    value: other.into(),
                })
            }
        })
    }
}

/// One handshake message, in protocol order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandshakeMessage {
    /// Client to server: what the client speaks and who it claims to be.
    ClientHello {
        version_min: u16,
        version_max: u16,
        cluster_id: ClusterId,
        nonce: [u8; NONCE_BYTES],
        node_name: String,
    },
    /// Server to client: the chosen version and who the server claims to be.
    ServerHello {
        version: u16,
        cluster_id: ClusterId,
        nonce: [u8; NONCE_BYTES],
        node_name: String,
    },
    /// Client to server: HMAC proving the client holds the secret.
    ClientProof { mac: [u8; PROOF_BYTES] },
    /// Server to client: HMAC proving the server holds the secret.
    ServerProof { mac: [u8; PROOF_BYTES] },
    /// Server to client: the handshake ends here, with the server's view for the message.
    Refusal {
        code: RefusalCode,
        cluster_id: ClusterId,
        version_min: u16,
        version_max: u16,
    },
}

impl HandshakeMessage {
    fn kind(&self) -> u8 {
        match self {
            HandshakeMessage::ClientHello { .. } => 1,
            HandshakeMessage::ServerHello { .. } => 2,
            HandshakeMessage::ClientProof { .. } => 3,
            HandshakeMessage::ServerProof { .. } => 4,
            HandshakeMessage::Refusal { .. } => 5,
        }
    }

    /// The message with its envelope, ready to write.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(HANDSHAKE_BODY_BYTES_MAX);
        match self {
            HandshakeMessage::ClientHello {
                version_min,
                version_max,
                cluster_id,
                nonce,
                node_name,
            } => {
                body.extend_from_slice(&version_min.to_le_bytes());
                body.extend_from_slice(&version_max.to_le_bytes());
                body.extend_from_slice(&cluster_id.0);
                body.extend_from_slice(nonce);
                put_name(&mut body, node_name);
            }
            HandshakeMessage::ServerHello {
                version,
                cluster_id,
                nonce,
                node_name,
            } => {
                body.extend_from_slice(&version.to_le_bytes());
                body.extend_from_slice(&cluster_id.0);
                body.extend_from_slice(nonce);
                put_name(&mut body, node_name);
            }
            HandshakeMessage::ClientProof { mac } | HandshakeMessage::ServerProof { mac } => {
                body.extend_from_slice(mac);
            }
            HandshakeMessage::Refusal {
                code,
                cluster_id,
                version_min,
                version_max,
            } => {
                body.push(*code as u8);
                body.extend_from_slice(&cluster_id.0);
                body.extend_from_slice(&version_min.to_le_bytes());
                body.extend_from_slice(&version_max.to_le_bytes());
            }
        }
        assert!(body.len() <= HANDSHAKE_BODY_BYTES_MAX);
        let mut out = Vec::with_capacity(HANDSHAKE_HEADER_BYTES + body.len());
        out.extend_from_slice(&HANDSHAKE_MAGIC);
        out.push(self.kind());
        out.extend_from_slice(&(body.len() as u16).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Decodes one whole message (envelope and body, nothing after it).
    pub fn decode(bytes: &[u8]) -> Result<HandshakeMessage, WireError> {
        let (kind, body_len) = decode_handshake_header(bytes)?;
        let body = &bytes[HANDSHAKE_HEADER_BYTES..];
        if body.len() != body_len {
            let what = "handshake body";
            return Err(WireError::LengthMismatch {
                what,
                len: body.len(),
                expected: body_len,
            });
        }
        decode_handshake_body(kind, body)
    }
}

/// Checks a handshake envelope and returns (kind, body length). Only the first
/// [`HANDSHAKE_HEADER_BYTES`] bytes are looked at.
pub fn decode_handshake_header(bytes: &[u8]) -> Result<(u8, usize), WireError> {
    let mut reader = Reader::new(bytes, "handshake header");
    let magic: [u8; 4] = reader.array()?;
    if magic != HANDSHAKE_MAGIC {
        return Err(WireError::BadMagic {
            found: magic,
            expected: HANDSHAKE_MAGIC,
        });
    }
    let kind = reader.u8()?;
    let body_len = usize::from(reader.u16()?);
    if !(1..=5).contains(&kind) {
        return Err(WireError::Unknown {
            what: "handshake message kind",
            value: kind.into(),
        });
    }
    if body_len > HANDSHAKE_BODY_BYTES_MAX {
        let (len, max) = (body_len as u64, HANDSHAKE_BODY_BYTES_MAX as u64);
        return Err(WireError::TooLong {
            what: "handshake body",
            len,
            max,
        });
    }
    Ok((kind, body_len))
}

/// Decodes the body of a handshake message of the given kind; the body must be exact.
pub fn decode_handshake_body(kind: u8, body: &[u8]) -> Result<HandshakeMessage, WireError> {
    let mut reader = Reader::new(body, "handshake body");
    let message = match kind {
        1 => HandshakeMessage::ClientHello {
            version_min: reader.u16()?,
            version_max: reader.u16()?,
            cluster_id: ClusterId(reader.array()?),
            nonce: reader.array()?,
            node_name: reader.name("node name")?,
        },
        2 => HandshakeMessage::ServerHello {
            version: reader.u16()?,
            cluster_id: ClusterId(reader.array()?),
            nonce: reader.array()?,
            node_name: reader.name("node name")?,
        },
        3 => HandshakeMessage::ClientProof {
            mac: reader.array()?,
        },
        4 => HandshakeMessage::ServerProof {
            mac: reader.array()?,
        },
        5 => HandshakeMessage::Refusal {
            code: RefusalCode::from_u8(reader.u8()?)?,
            cluster_id: ClusterId(reader.array()?),
            version_min: reader.u16()?,
            version_max: reader.u16()?,
        },
        other => {
            return Err(WireError::Unknown {
                what: "handshake message kind",
                value: other.into(),
            })
        }
    };
    reader.finish()?;
    if let HandshakeMessage::ClientHello {
        version_min,
        version_max,
        ..
    } = &message
    {
        if version_min > version_max {
            let detail = format!("empty version range {version_min}..={version_max}");
            return Err(WireError::Invalid {
                what: "client hello",
                detail,
            });
        }
    }
    Ok(message)
}

/// Checks a node or cluster name: 1 to [`NAME_BYTES_MAX`] bytes of UTF-8, no control
/// characters and no whitespace (names end up in logs, tables and node files).
pub fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty".to_owned());
    }
    if name.len() > NAME_BYTES_MAX {
        return Err(format!("{} bytes, more than {NAME_BYTES_MAX}", name.len()));
    }
    if let Some(bad) = name.chars().find(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!("contains the character {bad:?}"));
    }
    Ok(())
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    assert!(
        validate_name(name).is_ok(),
        "names are validated before they are sent"
    );
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
}

/// SHA-256 of the two hello messages exactly as sent: nonces, cluster id, names, the
/// offered range and the chosen version all enter every proof and session key.
pub fn transcript_hash(client_hello: &[u8], server_hello: &[u8]) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(b"tessera transcript v1");
    hash.update((client_hello.len() as u64).to_le_bytes());
    hash.update(client_hello);
    hash.update(server_hello);
    hash.finalize().into()
}

/// HMAC-SHA256 under `key` of a domain label and the transcript hash. Distinct labels keep
/// a client proof from serving as a server proof or as a session key.
pub fn keyed_digest(key: &[u8; 32], label: &[u8], transcript: &[u8; 32]) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC accepts any key length");
    mac.update(label);
    mac.update(transcript);
    mac.finalize().into_bytes().into()
}

pub const LABEL_CLIENT_PROOF: &[u8] = b"tessera v1 client proof";
pub const LABEL_SERVER_PROOF: &[u8] = b"tessera v1 server proof";
pub const LABEL_CLIENT_TO_SERVER: &[u8] = b"tessera v1 frames client to server";
pub const LABEL_SERVER_TO_CLIENT: &[u8] = b"tessera v1 frames server to client";

/// The decoded fixed header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub version: u16,
    pub flags: u16,
    pub payload_bytes: usize,
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; FRAME_HEADER_BYTES] {
        assert!(self.payload_bytes <= FRAME_PAYLOAD_BYTES_MAX);
        assert_eq!(self.flags & !FLAGS_KNOWN, 0);
        let mut out = [0u8; FRAME_HEADER_BYTES];
        out[0..4].copy_from_slice(&FRAME_MAGIC);
        out[4..6].copy_from_slice(&self.version.to_le_bytes());
        out[6..8].copy_from_slice(&self.flags.to_le_bytes());
        out[8..12].copy_from_slice(&(self.payload_bytes as u32).to_le_bytes());
        out
    }

    /// Decodes and checks a frame header; the payload length is bounded here, before the
    /// caller sizes any buffer from it.
    pub fn decode(bytes: &[u8], expected_version: u16) -> Result<FrameHeader, WireError> {
        let mut reader = Reader::new(bytes, "frame header");
        let magic: [u8; 4] = reader.array()?;
        if magic != FRAME_MAGIC {
            return Err(WireError::BadMagic {
                found: magic,
                expected: FRAME_MAGIC,
            });
        }
        let version = reader.u16()?;
        let flags = reader.u16()?;
        let payload_bytes = reader.u32()?;
        if version != expected_version {
            return Err(WireError::VersionChanged {
                found: version,
                expected: expected_version,
            });
        }
        if flags & !FLAGS_KNOWN != 0 {
            return Err(WireError::Unknown {
                what: "frame flags",
                value: flags.into(),
            });
        }
        if payload_bytes as usize > FRAME_PAYLOAD_BYTES_MAX {
            let (len, max) = (u64::from(payload_bytes), FRAME_PAYLOAD_BYTES_MAX as u64);
            return Err(WireError::TooLong {
                what: "frame payload",
                len,
                max,
            });
        }
        if flags & FLAG_CLOSE != 0 && payload_bytes != 0 {
            let detail = format!("close frame carries {payload_bytes} payload bytes");
            return Err(WireError::Invalid {
                what: "frame",
                detail,
            });
        }
        Ok(FrameHeader {
            version,
            flags,
            payload_bytes: payload_bytes as usize,
        })
    }
}

/// The keyed MAC state of one direction of a connection and its next sequence number.
/// Keying happens once; each frame clones the keyed state.
#[derive(Clone)]
pub struct FrameMac {
    keyed: HmacSha256,
}

impl FrameMac {
    pub fn new(key: &[u8; 32]) -> FrameMac {
        FrameMac {
            keyed: HmacSha256::new_from_slice(key).expect("HMAC accepts any key length"),
        }
    }

    fn state(&self, sequence: u64, header: &[u8], payload: &[u8]) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        mac.update(&sequence.to_le_bytes());
        mac.update(header);
        mac.update(payload);
        mac
    }

    pub fn tag(&self, sequence: u64, header: &[u8], payload: &[u8]) -> [u8; FRAME_MAC_BYTES] {
        let full = self
            .state(sequence, header, payload)
            .finalize()
            .into_bytes();
        let mut tag = [0u8; FRAME_MAC_BYTES];
        tag.copy_from_slice(&full[..FRAME_MAC_BYTES]);
        tag
    }

    /// Constant-time check of a received tag.
    pub fn verify(&self, sequence: u64, header: &[u8], payload: &[u8], tag: &[u8]) -> bool {
        tag.len() == FRAME_MAC_BYTES
            && self
                .state(sequence, header, payload)
                .verify_truncated_left(tag)
                .is_ok()
    }
}

/// A whole frame (header, payload, MAC) for `payload`.
pub fn seal_frame(
    mac: &FrameMac,
    sequence: u64,
    version: u16,
    flags: u16,
    payload: &[u8],
) -> Vec<u8> {
    let mut frame = Vec::with_capacity(FRAME_HEADER_BYTES + payload.len() + FRAME_MAC_BYTES);
    frame.extend_from_slice(&[0u8; FRAME_HEADER_BYTES]);
    frame.extend_from_slice(payload);
    seal_frame_in_place(mac, sequence, version, flags, &mut frame);
    frame
}

/// Seals a frame built in place: `frame` holds [`FRAME_HEADER_BYTES`] placeholder bytes and
/// then the payload; the header is filled in and the MAC appended, so a large payload is
/// never copied.
pub fn seal_frame_in_place(
    mac: &FrameMac,
    sequence: u64,
    version: u16,
    flags: u16,
    frame: &mut Vec<u8>,
) {
    assert!(
        frame.len() >= FRAME_HEADER_BYTES,
        "frame buffer lacks room for the header"
    );
    let payload_bytes = frame.len() - FRAME_HEADER_BYTES;
    let header = FrameHeader {
        version,
        flags,
        payload_bytes,
    }
    .encode();
    frame[..FRAME_HEADER_BYTES].copy_from_slice(&header);
    let tag = mac.tag(sequence, &header, &frame[FRAME_HEADER_BYTES..]);
    frame.extend_from_slice(&tag);
    assert_eq!(
        frame.len(),
        FRAME_HEADER_BYTES + payload_bytes + FRAME_MAC_BYTES
    );
}

/// Checks one whole frame (exactly its bytes) and returns its header and payload.
pub fn open_frame<'a>(
    mac: &FrameMac,
    sequence: u64,
    expected_version: u16,
    bytes: &'a [u8],
) -> Result<(FrameHeader, &'a [u8]), WireError> {
    let header = FrameHeader::decode(bytes, expected_version)?;
    let need = FRAME_HEADER_BYTES + header.payload_bytes + FRAME_MAC_BYTES;
    if bytes.len() != need {
        return Err(WireError::LengthMismatch {
            what: "frame",
            len: bytes.len(),
            expected: need,
        });
    }
    let (head, rest) = bytes.split_at(FRAME_HEADER_BYTES);
    let (payload, tag) = rest.split_at(header.payload_bytes);
    if !mac.verify(sequence, head, payload, tag) {
        return Err(WireError::BadMac);
    }
    Ok((header, payload))
}

/// A bounds-checked little-endian cursor: every read that would run past the end is a
/// `Truncated` error naming the structure.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8], what: &'static str) -> Reader<'a> {
        Reader { bytes, at: 0, what }
    }

    fn take(&mut self, count: usize) -> Result<&'a [u8], WireError> {
        let need = self.at + count;
        let Some(slice) = self.bytes.get(self.at..need) else {
            return Err(WireError::Truncated {
                what: self.what,
                have: self.bytes.len(),
                need,
            });
        };
        self.at = need;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn name(&mut self, what: &'static str) -> Result<String, WireError> {
        let len = usize::from(self.u8()?);
        let bytes = self.take(len)?;
        let name = std::str::from_utf8(bytes).map_err(|error| WireError::Invalid {
            what,
            detail: error.to_string(),
        })?;
        validate_name(name).map_err(|detail| WireError::Invalid { what, detail })?;
        Ok(name.to_owned())
    }

    fn finish(&self) -> Result<(), WireError> {
        if self.at != self.bytes.len() {
            let (what, len, expected) = (self.what, self.bytes.len(), self.at);
            return Err(WireError::LengthMismatch {
                what,
                len,
                expected,
            });
        }
        Ok(())
    }
}

/// Lower-case hex of `bytes`.
pub fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    out
}

/// Decodes lower-case hex; the error names the first offending character and its position.
pub fn hex_decode(text: &str) -> Result<Vec<u8>, String> {
    let digits = text.as_bytes();
    if let Some((at, ch)) = text.char_indices().find(|(_, c)| hex_value(*c).is_none()) {
        return Err(format!(
            "character {ch:?} at position {} is not a lower-case hex digit",
            at + 1
        ));
    }
    if !digits.len().is_multiple_of(2) {
        return Err(format!("odd number of hex digits ({})", digits.len()));
    }
    let pair = |chunk: &[u8]| {
        let high = hex_value(char::from(chunk[0])).expect("checked above");
        let low = hex_value(char::from(chunk[1])).expect("checked above");
        high << 4 | low
    };
    Ok(digits.chunks_exact(2).map(pair).collect())
}

fn hex_value(ch: char) -> Option<u8> {
    match ch {
        '0'..='9' => Some(ch as u8 - b'0'),
        'a'..='f' => Some(ch as u8 - b'a' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    //! Golden bytes: the layouts in the crate doc, pinned, so an accidental change to the
    //! wire format fails here rather than between two releases in a cluster.

    use super::*;

    #[test]
    fn client_hello_bytes_match_the_documented_layout() {
        let hello = HandshakeMessage::ClientHello {
            version_min: 1,
            version_max: 2,
            cluster_id: ClusterId([0x11; 16]),
            nonce: [0x22; 32],
            node_name: "n1".to_owned(),
        };
        let mut expected = b"TSHK\x01\x37\x00\x01\x00\x02\x00".to_vec();
        expected.extend_from_slice(&[0x11; 16]);
        expected.extend_from_slice(&[0x22; 32]);
        expected.extend_from_slice(b"\x02n1");
        assert_eq!(hello.encode(), expected);
        assert_eq!(HandshakeMessage::decode(&expected).unwrap(), hello);
    }

    #[test]
    fn refusal_bytes_match_the_documented_layout() {
        let refusal = HandshakeMessage::Refusal {
            code: RefusalCode::VersionMismatch,
            cluster_id: ClusterId([0xaa; 16]),
            version_min: 1,
            version_max: 3,
        };
        let mut expected = b"TSHK\x05\x15\x00\x02".to_vec();
        expected.extend_from_slice(&[0xaa; 16]);
        expected.extend_from_slice(b"\x01\x00\x03\x00");
        assert_eq!(refusal.encode(), expected);
    }

    #[test]
    fn frame_bytes_match_the_documented_layout() {
        let mac = FrameMac::new(&[0x42; 32]);
        let frame = seal_frame(&mac, 7, 1, 0, b"abc");
        assert_eq!(&frame[..12], b"TSFR\x01\x00\x00\x00\x03\x00\x00\x00");
        assert_eq!(&frame[12..15], b"abc");
        let mut full = HmacSha256::new_from_slice(&[0x42; 32]).unwrap();
        full.update(&7u64.to_le_bytes());
        full.update(&frame[..15]);
        assert_eq!(&frame[15..], &full.finalize().into_bytes()[..16]);
        let (header, payload) = open_frame(&mac, 7, 1, &frame).unwrap();
        assert_eq!(
            (header.flags, header.payload_bytes, payload),
            (0, 3, &b"abc"[..])
        );
        assert_eq!(
            open_frame(&mac, 8, 1, &frame).unwrap_err(),
            WireError::BadMac
        );
    }

    #[test]
    fn hex_round_trips_and_names_the_bad_character() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(hex_decode(&hex_encode(&bytes)).unwrap(), bytes);
        assert!(hex_decode("0g").unwrap_err().contains("'g' at position 2"));
        assert!(hex_decode("abc").unwrap_err().contains("odd"));
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_name("node-1.example.com").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("a b").is_err());
        assert!(validate_name("a\u{7}").is_err());
        assert!(validate_name(&"x".repeat(256)).is_err());
        assert!(validate_name(&"x".repeat(255)).is_ok());
    }
}
