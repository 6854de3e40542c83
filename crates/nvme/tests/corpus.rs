//! The saved decoder corpus under `tests/corpus/`: valid PDUs of every type, truncated
//! ones, bad digests, huge lengths, unknown types. Each file is a fuzz input for
//! [`tessera_nvme::fuzz_decode`]: its first byte selects the reader configuration (see
//! [`tessera_nvme::wire::fuzz_reader`]: bit 0 set = the host receives, bit 1 header
//! digests, bit 2 data digests, bits 7:3 the PDU data alignment) and the rest is the byte
//! stream.
//!
//! The file name states the expected outcome of reading the first PDU:
//! `ok-<PduType>-<description>.bin` (for example `ok-CapsuleCmd-connect.bin`) or
//! `err-<PduErrorKind>-<description>.bin` (for example `err-HeaderDigest-bit_flip.bin`).
//! `corpus_outcomes` checks every file in the directory, so to add a case (say, an input a
//! fuzzer found) drop it there under such a name. The generated cases below are rewritten by
//! `cargo test -p tessera-nvme --test corpus -- --ignored write_corpus`; `corpus_is_current`
//! fails when the generator and the saved files disagree, so a change to the encoder shows
//! up as a corpus change in review.

mod common;

use std::io::Cursor;
use std::path::PathBuf;

use common::{connect_pdu, one_of_each};
use tessera_nvme::fuzz_decode;
use tessera_nvme::wire::command::{Cqe, DsmRange, Sqe};
use tessera_nvme::wire::identify::IdentifyController;
use tessera_nvme::wire::log::{AnaGroup, AnaLog, AnaState, DiscoveryEntry, DiscoveryLog};
use tessera_nvme::wire::pdu::{DataHeader, IcResp, Pdu, PduHeader};
use tessera_nvme::wire::text::FixedAscii;
use tessera_nvme::wire::{fuzz_reader, Nqn, PduErrorKind, PduType, SglDescriptor, Status};

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

/// Reader selector byte for the receiving `host` side, digests and alignment.
fn selector(host: bool, hdgst: bool, ddgst: bool, pda: u8) -> u8 {
    u8::from(host) | u8::from(hdgst) << 1 | u8::from(ddgst) << 2 | pda << 3
}

/// Encodes `pdu` with the configuration `sel` selects, prefixed with `sel`.
fn input(sel: u8, pdu: &Pdu) -> Vec<u8> {
    let mut bytes = vec![sel];
    bytes.extend(pdu.encode(&fuzz_reader(sel).digests()).expect("encode"));
    bytes
}

fn c2h(data: Vec<u8>) -> Pdu {
    let header = DataHeader::c2h(1, 0, data.len() as u32, true, true);
    Pdu {
        header: PduHeader::C2HData(header),
        data,
    }
}

fn discovery_log() -> Vec<u8> {
    let entry = DiscoveryEntry {
        trtype: 3,
        adrfam: 1,
        subtype: 2,
        treq: 2,
        portid: 1,
        cntlid: 0xffff,
        asqsz: 32,
        eflags: 0,
        trsvcid: FixedAscii::new("4420").unwrap(),
        subnqn: Nqn::new("nqn.2024-01.io.tessera:drive0").unwrap(),
        traddr: FixedAscii::new("192.0.2.7").unwrap(),
        tsas: [0; 256],
    };
    DiscoveryLog {
        genctr: 1,
        recfmt: 0,
        entries: vec![entry],
    }
    .encode()
}

/// Selectors: the controller or the host receives, without or with both digests.
const CTRL: u8 = 0b000;
const CTRL_DIGESTS: u8 = 0b110;
const HOST: u8 = 0b001;
const HOST_DIGESTS: u8 = 0b111;

fn case(name: &str, sel: u8, pdu: &Pdu) -> (String, Vec<u8>) {
    (name.to_owned(), input(sel, pdu))
}

fn command(opcode: u8, cid: u16, cdw10: u32, cdw11: u32, dptr: SglDescriptor) -> Sqe {
    Sqe {
        nsid: 1,
        cdw10,
        cdw11,
        dptr,
        ..Sqe::new(opcode, cid)
    }
}

/// Valid PDUs a controller receives.
fn controller_bound_cases() -> Vec<(String, Vec<u8>)> {
    let all = one_of_each();
    let cap = |sqe: Sqe, data: Vec<u8>| Pdu {
        header: PduHeader::CapsuleCmd(sqe),
        data,
    };
    let write = command(0x01, 5, 0, 0, SglDescriptor::in_capsule(0, 4096));
    let range = DsmRange {
        context_attributes: 0,
        nlb: 8,
        slba: 0,
    };
    let dsm = command(0x09, 6, 1, 4, SglDescriptor::in_capsule(0, 32));
    vec![
        case("ok-ICReq-digests_requested", CTRL, &all[0]),
        case("ok-H2CTermReq-header_digest_error", CTRL_DIGESTS, &all[2]),
        case(
            "ok-CapsuleCmd-connect_digests",
            CTRL_DIGESTS,
            &connect_pdu(),
        ),
        case("ok-CapsuleCmd-keep_alive", CTRL, &all[5]),
        case(
            "ok-CapsuleCmd-write_in_capsule_pda31",
            CTRL_DIGESTS | 31 << 3,
            &cap(write, vec![0x5a; 4096]),
        ),
        case(
            "ok-CapsuleCmd-dsm_ranges",
            CTRL,
            &cap(dsm, DsmRange::encode_list(&[range; 2])),
        ),
        case("ok-H2CData-last_digests", CTRL_DIGESTS, &all[7]),
        case(
            "ok-H2CData-pda31_padding",
            selector(false, true, false, 31),
            &all[7],
        ),
    ]
}

/// Valid PDUs a host receives.
fn host_bound_cases() -> Vec<(String, Vec<u8>)> {
    let all = one_of_each();
    let ctrl = IdentifyController {
        mn: FixedAscii::new("Tessera NVMe/TCP drive").unwrap(),
        subnqn: Some(Nqn::new("nqn.2024-01.io.tessera:drive0").unwrap()),
        ..IdentifyController::default()
    };
    let group = AnaGroup {
        anagrpid: 1,
        chgcnt: 1,
        state: AnaState::Optimized,
        nsids: vec![1],
    };
    let ana = AnaLog {
        chgcnt: 1,
        groups: vec![group],
    };
    let fail = Pdu::new(PduHeader::CapsuleResp(Cqe::new(
        2,
        Status::LBA_OUT_OF_RANGE,
    )));
    let icresp = IcResp {
        pfv: 0,
        cpda: 3,
        hdgst: false,
        ddgst: false,
        maxh2cdata: 65536,
    };
    vec![
        case(
            "ok-ICResp-cpda3",
            HOST,
            &Pdu::new(PduHeader::IcResp(icresp)),
        ),
        case("ok-C2HTermReq-empty", HOST, &all[3]),
        case("ok-CapsuleResp-connect_success", HOST_DIGESTS, &all[6]),
        case("ok-CapsuleResp-lba_out_of_range", HOST, &fail),
        case(
            "ok-C2HData-success_data_digest",
            selector(true, false, true, 0),
            &all[8],
        ),
        case("ok-C2HData-identify_controller", HOST, &c2h(ctrl.encode())),
        case(
            "ok-C2HData-discovery_log",
            HOST_DIGESTS,
            &c2h(discovery_log()),
        ),
        case("ok-C2HData-ana_log", HOST | 1 << 3, &c2h(ana.encode())),
        case("ok-R2T-header_digest", HOST_DIGESTS, &all[9]),
    ]
}

fn with<F: FnOnce(&mut Vec<u8>)>(mut bytes: Vec<u8>, edit: F) -> Vec<u8> {
    edit(&mut bytes);
    bytes
}

/// Streams cut short, unknown or misdirected types, and bad lengths.
fn framing_error_cases() -> Vec<(String, Vec<u8>)> {
    let all = one_of_each();
    let connect = input(CTRL_DIGESTS, &connect_pdu());
    let icreq = input(CTRL, &all[0]);
    let r2t = input(HOST, &all[9]);
    let h2c = input(CTRL, &all[7]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("err-Closed-empty_stream", vec![CTRL]),
        ("err-Truncated-common_header", connect[..6].to_vec()),
        ("err-Truncated-capsule_cmd_half", connect[..40].to_vec()),
        ("err-Truncated-data_cut", connect[..300].to_vec()),
        (
            "err-Truncated-data_digest_missing",
            connect[..connect.len() - 2].to_vec(),
        ),
        (
            "err-UnknownType-type_0b",
            with(icreq.clone(), |b| b[1] = 0x0b),
        ),
        (
            "err-UnknownType-type_08",
            with(icreq.clone(), |b| b[1] = 0x08),
        ),
        (
            "err-WrongDirection-r2t_sent_to_controller",
            with(r2t.clone(), |b| b[0] = CTRL),
        ),
        (
            "err-WrongDirection-capsule_cmd_sent_to_host",
            with(connect.clone(), |b| b[0] = HOST_DIGESTS),
        ),
        (
            "err-HlenMismatch-capsule_hlen_32",
            with(connect, |b| b[3] = 32),
        ),
        ("err-PlenTooSmall-r2t_plen_12", with(r2t, |b| b[5] = 12)),
        (
            "err-PlenMismatch-icreq_plen_129",
            with(icreq, |b| b[5] = 129),
        ),
        (
            "err-PlenMismatch-term_req_plen_153",
            with(input(CTRL, &all[2]), |b| b[5] = 153),
        ),
        (
            "err-PlenMismatch-capsule_resp_with_data",
            with(input(HOST, &all[6]), |b| b[5] += 4),
        ),
        (
            "err-PlenTooLarge-plen_4g",
            with(h2c.clone(), |b| b[5..9].fill(0xff)),
        ),
        ("err-PdoInvalid-pdo_inside_header", with(h2c, |b| b[4] = 8)),
        (
            "err-PdoInvalid-pdo_past_the_data",
            with(input(HOST, &all[8]), |b| b[4] = 200),
        ),
    ];
    cases
        .into_iter()
        .map(|(name, bytes)| (name.to_owned(), bytes))
        .collect()
}

/// Digest mismatches and invalid or unsupported field values.
fn field_error_cases() -> Vec<(String, Vec<u8>)> {
    let all = one_of_each();
    let connect = input(CTRL_DIGESTS, &connect_pdu());
    let h2c = input(CTRL_DIGESTS, &all[7]);
    let h2c_plain = input(CTRL, &all[7]);
    let icreq = input(CTRL, &all[0]);
    let icresp = input(HOST, &all[1]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "err-HeaderDigest-capsule_cmd_bit_flip",
            with(connect.clone(), |b| b[50] ^= 1),
        ),
        (
            "err-HeaderDigest-digest_zeroed",
            with(connect.clone(), |b| b[73..77].fill(0)),
        ),
        (
            "err-HeaderDigest-flags_flipped",
            with(h2c.clone(), |b| b[2] ^= 0x04),
        ),
        (
            "err-DataDigest-h2c_data_bit_flip",
            with(h2c.clone(), |b| b[100] ^= 0x80),
        ),
        (
            "err-DataDigest-connect_data_bit_flip",
            with(connect, |b| b[600] ^= 0x01),
        ),
        (
            "err-InvalidField-hdgstf_clear",
            with(h2c, |b| clear_hdgstf(b, 24)),
        ),
        (
            "err-InvalidField-datal_mismatch",
            with(h2c_plain.clone(), |b| b[17] ^= 1),
        ),
        (
            "err-InvalidField-ddgstf_without_data_digests",
            with(h2c_plain, |b| b[2] |= 2),
        ),
        (
            "err-InvalidField-success_without_last",
            with(input(HOST, &all[8]), |b| b[2] = 0x08),
        ),
        (
            "err-InvalidField-maxh2cdata_below_4096",
            with(icresp.clone(), |b| {
                b[13..17].copy_from_slice(&2048u32.to_le_bytes())
            }),
        ),
        ("err-Unsupported-pfv_1", with(icreq.clone(), |b| b[9] = 1)),
        ("err-Unsupported-hpda_32", with(icreq, |b| b[11] = 32)),
        ("err-Unsupported-cpda_40", with(icresp, |b| b[11] = 40)),
    ];
    cases
        .into_iter()
        .map(|(name, bytes)| (name.to_owned(), bytes))
        .collect()
}

/// Clears HDGSTF of the PDU in `bytes[1..]` and recomputes its header digest, so the
/// inconsistency reaches the flag check instead of the digest check.
fn clear_hdgstf(bytes: &mut [u8], hlen: usize) {
    bytes[2] &= !1;
    let crc = crc32c::crc32c(&bytes[1..1 + hlen]);
    bytes[1 + hlen..1 + hlen + 4].copy_from_slice(&crc.to_le_bytes());
}

fn cases() -> Vec<(String, Vec<u8>)> {
    let mut all = controller_bound_cases();
    all.extend(host_bound_cases());
    all.extend(framing_error_cases());
    all.extend(field_error_cases());
    all
}

/// Rewrites the generated corpus files.
#[test]
#[ignore = "rewrites tests/corpus; run on purpose after changing the generator"]
fn write_corpus() {
    std::fs::create_dir_all(corpus_dir()).unwrap();
    for (name, bytes) in cases() {
        std::fs::write(corpus_dir().join(format!("{name}.bin")), bytes).unwrap();
    }
}

#[test]
fn corpus_is_current() {
    for (name, bytes) in cases() {
        let path = corpus_dir().join(format!("{name}.bin"));
        let saved = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            saved, bytes,
            "{name} differs from the generator; rerun write_corpus"
        );
    }
}

/// The expected outcome named by a corpus file name.
enum Expected {
    Ok(PduType),
    Err(PduErrorKind),
}

fn expected(name: &str) -> Expected {
    let mut parts = name.splitn(3, '-');
    let (outcome, what) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    match outcome {
        "ok" => {
            let t = (0..=255u8)
                .filter_map(PduType::from_u8)
                .find(|t| t.name() == what);
            Expected::Ok(t.unwrap_or_else(|| panic!("{name}: unknown PDU type {what}")))
        }
        "err" => Expected::Err(
            PduErrorKind::from_name(what).unwrap_or_else(|| panic!("{name}: unknown kind {what}")),
        ),
        _ => panic!("{name}: name must start with ok- or err-"),
    }
}

#[test]
fn corpus_outcomes() {
    let mut entries: Vec<_> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "bin"))
        .collect();
    entries.sort();
    assert!(
        entries.len() >= 40,
        "corpus has only {} files",
        entries.len()
    );
    for path in entries {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(&path).unwrap();
        fuzz_decode(&bytes);
        let (sel, stream) = bytes.split_first().expect("selector byte");
        let mut reader = fuzz_reader(*sel);
        let result = reader.read_pdu(&mut Cursor::new(stream));
        match (expected(&name), result) {
            (Expected::Ok(t), Ok(pdu)) => assert_eq!(pdu.header.pdu_type(), t, "{name}"),
            (Expected::Err(kind), Err(err)) => assert_eq!(err.kind(), kind, "{name}: {err}"),
            (Expected::Ok(_), Err(err)) => panic!("{name}: unexpected error {err}"),
            (Expected::Err(kind), Ok(pdu)) => panic!("{name}: expected {kind:?}, got {pdu:?}"),
        }
    }
}
