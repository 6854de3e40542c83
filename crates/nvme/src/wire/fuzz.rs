//! A fuzzing entry point over every decoder in [`super`].

use std::io::Cursor;

use super::command::{Command, DsmRange, QueueKind, Sqe};
use super::fabrics::ConnectData;
use super::identify::{decode_nsid_list, IdentifyController, IdentifyNamespace, NsIdDescriptor};
use super::log::{AnaLog, DiscoveryLog, SmartLog};
use super::pdu::{DigestConfig, Pdu, PduHeader, Side};
use super::pdu_reader::PduReader;
use super::reservation::{KeyPair, ReservationStatus};

/// Largest PDU the fuzz reader accepts: small, so that the fuzzer spends its time on
/// headers rather than on filling buffers.
pub const FUZZ_MAX_PDU_BYTES: u32 = 64 * 1024;

/// Most PDUs decoded from one input.
const FUZZ_PDUS_MAX: usize = 64;

/// The reader configuration selected by the first byte of a fuzz input: bit 0 the receiving
/// side (0 controller, 1 host), bit 1 header digests, bit 2 data digests, bits 7:3 the
/// alignment (PDA, 0..=31).
#[must_use]
pub fn fuzz_reader(selector: u8) -> PduReader {
    let side = if selector & 1 == 0 {
        Side::Controller
    } else {
        Side::Host
    };
    let (header, data, pda) = (selector & 2 != 0, selector & 4 != 0, selector >> 3);
    // `pda` is at most 31 (five bits), so `DigestConfig::new` cannot fail; fall back to no
    // digests rather than panic if that ever changes.
    let digests = DigestConfig::new(header, data, pda).unwrap_or(DigestConfig::NONE);
    PduReader::new(side, FUZZ_MAX_PDU_BYTES, digests)
}

/// Decodes `bytes` as a fuzz input: the first byte selects the reader configuration
/// ([`fuzz_reader`]), the rest is a byte stream of PDUs. Every PDU read is re-encoded and
/// read back (which must give the same PDU), its command or data is fed to the structure
/// decoders, and every error is mapped to its TermReq. Must never panic; any panic is a bug.
///
/// A `cargo fuzz` target is one line: `fuzz_target!(|data: &[u8]| fuzz_decode(data));`.
///
/// # Panics
/// Only on a bug in this crate: a decoded PDU that does not re-encode to itself, a parsed
/// command that does not rebuild to itself, or a TermReq that cannot be encoded.
pub fn fuzz_decode(bytes: &[u8]) {
    let Some((&selector, stream)) = bytes.split_first() else {
        return;
    };
    let mut reader = fuzz_reader(selector);
    let mut cursor = Cursor::new(stream);
    for _ in 0..FUZZ_PDUS_MAX {
        match reader.read_pdu(&mut cursor) {
            Ok(pdu) => {
                check_round_trip(&reader, &pdu);
                exercise_payload(&pdu);
            }
            Err(err) => {
                let _ = (err.to_string(), err.kind(), err.status());
                if let Some(term) = reader.termination(&err) {
                    let encoded = term.encode(&DigestConfig::NONE);
                    assert!(encoded.is_ok(), "TermReq for {err} does not encode");
                }
                if !err.stream_in_sync() {
                    return;
                }
            }
        }
    }
}

/// Re-encodes `pdu` with the settings it was read with and reads it back.
fn check_round_trip(reader: &PduReader, pdu: &Pdu) {
    let digests = reader.digests();
    let encoded = pdu.encode(&digests);
    let Ok(encoded) = encoded else {
        panic!("decoded PDU {pdu:?} does not re-encode: {encoded:?}");
    };
    let receiver = pdu.header.pdu_type().sender().peer();
    let mut again = PduReader::new(receiver, reader.max_pdu_bytes(), digests);
    let back = again.read_pdu(&mut Cursor::new(&encoded));
    assert!(
        back.as_ref().is_ok_and(|b| b == pdu),
        "round trip changed {pdu:?} into {back:?}"
    );
}

/// Feeds a PDU's command and data to the structure decoders; results are ignored, only
/// panics matter.
fn exercise_payload(pdu: &Pdu) {
    let data = pdu.data.as_slice();
    match &pdu.header {
        PduHeader::CapsuleCmd(sqe) => exercise_command(sqe, data),
        PduHeader::C2HData(_) | PduHeader::H2CData(_) => {
            let _ = IdentifyController::decode(data);
            let _ = IdentifyNamespace::decode(data).map(|ns| ns.block_bytes());
            let _ = decode_nsid_list(data);
            let _ = NsIdDescriptor::decode_list(data);
            let _ = DiscoveryLog::decode(data);
            let _ = AnaLog::decode(data);
            let _ = SmartLog::decode(data);
            let _ = ReservationStatus::decode(data, false);
            let _ = ReservationStatus::decode(data, true);
        }
        _ => {}
    }
}

fn exercise_command(sqe: &Sqe, data: &[u8]) {
    let _ = sqe.check_fabrics_flags();
    let _ = sqe.dptr.kind();
    for queue in [QueueKind::Admin, QueueKind::Io] {
        if let Ok(command) = Command::parse(sqe, queue) {
            let rebuilt = command.to_sqe(sqe.cid);
            let reparsed = Command::parse(&rebuilt, queue);
            assert!(
                reparsed.as_ref() == Ok(&command),
                "{command:?} reparsed as {reparsed:?}"
            );
        }
    }
    let _ = ConnectData::decode(data);
    let _ = KeyPair::decode(data);
    let _ = DsmRange::decode_list(data, data.len() / 16);
}
