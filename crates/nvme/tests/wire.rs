//! Wire-format tests for `tessera_nvme::wire`: byte-exact PDUs derived by hand from the
//! NVMe/TCP and NVMe-oF specifications (so that a layout error cannot hide behind a symmetric
//! encoder and decoder), round trips of every PDU type under every digest and alignment
//! setting, and decoder robustness against random and mutated input.

mod common;

use std::io::Cursor;

use common::{
    arb_digests, arb_pdu, connect_pdu, digests, hex, one_of_each, receiver, reference_crc32c,
};
use proptest::prelude::*;
use tessera_nvme::fuzz_decode;
use tessera_nvme::wire::command::Cqe;
use tessera_nvme::wire::fabrics::ConnectData;
use tessera_nvme::wire::pdu::{DataHeader, IcReq, IcResp, Pdu, PduHeader, R2t, TermReq};
use tessera_nvme::wire::{
    DigestConfig, Fes, PduError, PduErrorKind, PduReader, PduType, Side, Status,
};

const MAX_PDU: u32 = 1 << 20;

fn read_one(side: Side, cfg: DigestConfig, bytes: &[u8]) -> Result<Pdu, PduError> {
    PduReader::new(side, MAX_PDU, cfg).read_pdu(&mut Cursor::new(bytes))
}

/// Appends the reference CRC32C of `bytes[from..]` in little-endian order.
fn push_crc(bytes: &mut Vec<u8>, from: usize) {
    let crc = reference_crc32c(&bytes[from..]);
    bytes.extend_from_slice(&crc.to_le_bytes());
}

fn check_known_answer(pdu: &Pdu, cfg: DigestConfig, expected: &[u8]) {
    let encoded = pdu.encode(&cfg).expect("encode");
    assert_eq!(encoded, expected, "encoding of {:?}", pdu.header.pdu_type());
    let side = receiver(pdu.header.pdu_type());
    assert_eq!(&read_one(side, cfg, expected).expect("decode"), pdu);
}

#[test]
fn reference_crc_matches_the_check_value() {
    // The CRC-32C check value of "123456789" (RFC 3720, B.4).
    assert_eq!(reference_crc32c(b"123456789"), 0xe306_9283);
    assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
}

#[test]
fn icreq_with_digests_is_byte_exact() {
    let icreq = IcReq {
        pfv: 0,
        hpda: 0,
        hdgst: true,
        ddgst: true,
        maxr2t: 0,
    };
    // type 0, flags 0, hlen 128, pdo 0, plen 128; pfv 0, hpda 0, dgst 3, maxr2t 0.
    let mut expected = hex("00 00 80 00 80 00 00 00  00 00 00 03 00 00 00 00");
    expected.resize(128, 0);
    // ICReq is never digested, even when the reader already has digests on.
    check_known_answer(
        &Pdu::new(PduHeader::IcReq(icreq)),
        DigestConfig::NONE,
        &expected,
    );
}

#[test]
fn icresp_is_byte_exact() {
    let icresp = IcResp {
        pfv: 0,
        cpda: 3,
        hdgst: false,
        ddgst: true,
        maxh2cdata: 0x2_0000,
    };
    let mut expected = hex("01 00 80 00 80 00 00 00  00 00 03 02 00 00 02 00");
    expected.resize(128, 0);
    check_known_answer(
        &Pdu::new(PduHeader::IcResp(icresp)),
        DigestConfig::NONE,
        &expected,
    );
}

/// The Connect data a Linux host would send for `connect_pdu`, laid out by hand.
fn expected_connect_data() -> Vec<u8> {
    let mut data = vec![0x11; 16];
    data.extend_from_slice(&[0xff, 0xff]);
    data.resize(256, 0);
    data.extend_from_slice(b"nqn.2024-01.io.tessera:drive0");
    data.resize(512, 0);
    let hostnqn = "nqn.2014-08.org.nvmexpress:uuid:22222222-2222-2222-2222-222222222222";
    data.extend_from_slice(hostnqn.as_bytes());
    data.resize(1024, 0);
    data
}

#[test]
fn capsule_cmd_with_connect_is_byte_exact() {
    let mut expected = hex("04 03 48 4c 50 04 00 00
         7f 40 00 00 01 00 00 00  00 00 00 00 00 00 00 00
         00 00 00 00 00 00 00 00
         00 00 00 00 00 00 00 00  00 04 00 00 00 00 00 01
         00 00 00 00 1f 00 00 00  c0 d4 01 00 00 00 00 00
         00 00 00 00 00 00 00 00");
    assert_eq!(expected.len(), 72);
    push_crc(&mut expected, 0);
    let data_at = expected.len();
    assert_eq!(data_at, 0x4c, "PDO is HLEN plus the header digest");
    expected.extend_from_slice(&expected_connect_data());
    push_crc(&mut expected, data_at);
    assert_eq!(expected.len(), 0x450, "PLEN");
    let pdu = connect_pdu();
    check_known_answer(&pdu, digests(true, true, 0), &expected);
    let back = ConnectData::decode(&pdu.data).expect("connect data");
    assert_eq!(back.cntlid, 0xffff);
    assert!(back
        .hostnqn
        .as_str()
        .starts_with("nqn.2014-08.org.nvmexpress:uuid:"));
}

#[test]
fn capsule_resp_is_byte_exact() {
    let mut cqe = Cqe::new(7, Status::SUCCESS);
    cqe.dw0 = 1;
    let mut expected = hex("05 01 18 00 1c 00 00 00
         01 00 00 00 00 00 00 00  00 00 00 00 07 00 00 00");
    push_crc(&mut expected, 0);
    check_known_answer(
        &Pdu::new(PduHeader::CapsuleResp(cqe)),
        digests(true, true, 0),
        &expected,
    );

    // A failure: Connect Invalid Parameters with DNR, IATTR=1 (in data) and IPO=512.
    let mut cqe = Cqe::new(0, Status::CONNECT_INVALID_PARAMETERS.with_dnr(true));
    cqe.dw0 = tessera_nvme::wire::fabrics::connect_invalid_parameter_dw0(true, 512);
    let expected = hex("05 00 18 00 18 00 00 00
         00 02 01 00 00 00 00 00  00 00 00 00 00 00 04 83");
    check_known_answer(
        &Pdu::new(PduHeader::CapsuleResp(cqe)),
        DigestConfig::NONE,
        &expected,
    );
}

#[test]
fn h2c_data_with_alignment_padding_is_byte_exact() {
    let header = DataHeader::h2c(3, 1, 4096, 512, true);
    let pdu = Pdu {
        header: PduHeader::H2CData(header),
        data: vec![0xab; 512],
    };
    // HDGSTF | LAST_PDU, PDO 128 (CPDA 31), PLEN 128 + 512.
    let mut expected = hex("06 05 18 80 80 02 00 00
         03 00 01 00 00 10 00 00  00 02 00 00 00 00 00 00");
    push_crc(&mut expected, 0);
    expected.resize(128, 0);
    expected.extend_from_slice(&[0xab; 512]);
    check_known_answer(&pdu, digests(true, false, 31), &expected);
}

#[test]
fn c2h_data_with_success_and_data_digest_is_byte_exact() {
    let header = DataHeader::c2h(3, 0, 100, true, true);
    let data: Vec<u8> = (0..100).collect();
    // DDGSTF | LAST_PDU | SUCCESS, PDO 24, PLEN 24 + 100 + 4.
    let mut expected = hex("07 0e 18 18 80 00 00 00
         03 00 00 00 00 00 00 00  64 00 00 00 00 00 00 00");
    expected.extend_from_slice(&data);
    push_crc(&mut expected, 24);
    check_known_answer(
        &Pdu {
            header: PduHeader::C2HData(header),
            data,
        },
        digests(false, true, 0),
        &expected,
    );
}

#[test]
fn r2t_and_term_req_are_byte_exact() {
    let r2t = R2t {
        cccid: 3,
        ttag: 1,
        r2to: 0,
        r2tl: 0x2000,
    };
    let mut expected = hex("09 01 18 00 1c 00 00 00
         03 00 01 00 00 00 00 00  00 20 00 00 00 00 00 00");
    push_crc(&mut expected, 0);
    check_known_answer(
        &Pdu::new(PduHeader::R2T(r2t)),
        digests(true, true, 0),
        &expected,
    );

    // TermReqs are never digested: the peer's digest state may be what broke.
    let term = TermReq::new(Fes::InvalidHeaderField, 2);
    let pdu = Pdu {
        header: PduHeader::C2HTermReq(term),
        data: vec![9; 8],
    };
    let expected = hex("03 00 18 00 20 00 00 00
         01 00 02 00 00 00 00 00  00 00 00 00 00 00 00 00
         09 09 09 09 09 09 09 09");
    check_known_answer(&pdu, digests(true, true, 0), &expected);
}

#[test]
fn errors_name_the_field_and_map_to_fes() {
    let cfg = DigestConfig::NONE;
    let unknown = read_one(Side::Controller, cfg, &hex("0b 00 18 00 18 00 00 00")).unwrap_err();
    assert_eq!(unknown.to_string(), "PDU type 0x0b unknown");
    assert_eq!(unknown.fes(), Some((Fes::InvalidHeaderField, 0)));

    let small = read_one(Side::Host, cfg, &hex("09 00 18 00 0c 00 00 00")).unwrap_err();
    assert_eq!(
        small.kind(),
        PduErrorKind::Truncated,
        "header shorter than HLEN"
    );
    let mut r2t = hex("09 00 18 00 0c 00 00 00");
    r2t.resize(24, 0);
    let small = read_one(Side::Host, cfg, &r2t).unwrap_err();
    assert_eq!(
        small.to_string(),
        "plen 12 smaller than hlen 24 plus 0 digest bytes"
    );
    assert_eq!(small.fes(), Some((Fes::InvalidHeaderField, 4)));

    let mut bad_hlen = hex("04 00 20 00 48 00 00 00");
    bad_hlen.resize(72, 0);
    let mut reader = PduReader::new(Side::Controller, MAX_PDU, cfg);
    let err = reader.read_pdu(&mut Cursor::new(&bad_hlen)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "hlen 32 invalid for CapsuleCmd (0x04): must be 72"
    );
    let term = reader.termination(&err).expect("a TermReq");
    assert_eq!(
        term.header,
        PduHeader::C2HTermReq(TermReq::new(Fes::InvalidHeaderField, 2))
    );
    assert_eq!(term.data, bad_hlen[..8], "quotes the header bytes received");

    let wrong_way = read_one(Side::Controller, cfg, &r2t).unwrap_err();
    assert_eq!(wrong_way.kind(), PduErrorKind::WrongDirection);
    assert_eq!(
        read_one(Side::Host, cfg, &[]).unwrap_err().kind(),
        PduErrorKind::Closed
    );
}

#[test]
fn icreq_parameters_are_checked() {
    let mut icreq = hex("00 00 80 00 80 00 00 00  01 00 00 00 00 00 00 00");
    icreq.resize(128, 0);
    let err = read_one(Side::Controller, DigestConfig::NONE, &icreq).unwrap_err();
    assert_eq!(err.fes(), Some((Fes::UnsupportedParameter, 8)), "{err}");
    icreq[8] = 0;
    icreq[10] = 32;
    let err = read_one(Side::Controller, DigestConfig::NONE, &icreq).unwrap_err();
    assert_eq!(err.fes(), Some((Fes::UnsupportedParameter, 10)), "{err}");
    let mut icresp = hex("01 00 80 00 80 00 00 00  00 00 00 00 00 08 00 00");
    icresp.resize(128, 0);
    let err = read_one(Side::Host, DigestConfig::NONE, &icresp).unwrap_err();
    assert!(err.to_string().contains("MAXH2CDATA"), "{err}");
    assert_eq!(err.fes(), Some((Fes::InvalidHeaderField, 12)));
}

#[test]
fn plen_above_the_maximum_is_rejected_before_reading_data() {
    let mut huge = hex("04 00 48 48 ff ff ff 7f");
    huge.resize(72, 0);
    let mut reader = PduReader::new(Side::Controller, 4096, DigestConfig::NONE);
    let err = reader.read_header(&mut Cursor::new(&huge)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "plen 2147483647 exceeds the maximum PDU size 4096"
    );
    assert_eq!(err.fes(), Some((Fes::DataTransferLimitExceeded, 0)));
}

#[test]
fn data_digest_error_keeps_the_stream_in_sync() {
    let cfg = digests(true, true, 0);
    let pdus = one_of_each();
    let data_pdu = &pdus[7];
    let mut stream = data_pdu.encode(&cfg).unwrap();
    let len = stream.len();
    stream[len - 10] ^= 0x40;
    stream.extend(data_pdu.encode(&cfg).unwrap());
    let mut reader = PduReader::new(Side::Controller, MAX_PDU, cfg);
    let mut cursor = Cursor::new(&stream);
    let err = reader.read_pdu(&mut cursor).unwrap_err();
    assert_eq!(err.kind(), PduErrorKind::DataDigest);
    assert_eq!(err.status(), Some(Status::TRANSIENT_TRANSPORT_ERROR));
    assert!(err.fes().is_none() && err.stream_in_sync());
    assert_eq!(&reader.read_pdu(&mut cursor).unwrap(), data_pdu);
}

#[test]
fn header_first_reading_fills_the_callers_buffer() {
    let cfg = digests(true, true, 7);
    let pdus = one_of_each();
    let mut stream = Vec::new();
    for pdu in pdus
        .iter()
        .filter(|p| p.header.pdu_type().sender() == Side::Host)
    {
        pdu.write_to(&mut stream, &cfg).unwrap();
    }
    let mut reader = PduReader::new(Side::Controller, MAX_PDU, cfg);
    let mut cursor = Cursor::new(&stream);
    let mut target = vec![0u8; 8192];
    for pdu in pdus
        .iter()
        .filter(|p| p.header.pdu_type().sender() == Side::Host)
    {
        let inbound = reader.read_header(&mut cursor).unwrap();
        assert_eq!(inbound.header, pdu.header);
        let at = match inbound.header {
            PduHeader::H2CData(d) => d.datao as usize,
            _ => 0,
        };
        let buf = &mut target[at..at + inbound.data_len()];
        reader.read_data_into(&mut cursor, &inbound, buf).unwrap();
        assert_eq!(buf, &pdu.data[..]);
    }
    assert_eq!(
        reader.read_pdu(&mut cursor).unwrap_err().kind(),
        PduErrorKind::Closed
    );
}

#[test]
fn every_sample_pdu_survives_fuzz_decode() {
    for selector in 0..=255u8 {
        for pdu in one_of_each() {
            let reader = tessera_nvme::wire::fuzz_reader(selector);
            let Ok(bytes) = pdu.encode(&reader.digests()) else {
                continue;
            };
            let mut input = vec![selector];
            input.extend(bytes);
            fuzz_decode(&input);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn every_pdu_round_trips(pdu in arb_pdu(), cfg in arb_digests()) {
        let encoded = pdu.encode(&cfg).unwrap();
        prop_assert_eq!(
            u32::from_le_bytes(encoded[4..8].try_into().unwrap()) as usize,
            encoded.len(),
            "PLEN is the whole PDU"
        );
        let pdo = usize::from(encoded[3]);
        if pdo != 0 {
            prop_assert_eq!(pdo % cfg.pda_bytes(), 0, "PDO honours the alignment");
        }
        let back = read_one(receiver(pdu.header.pdu_type()), cfg, &encoded).unwrap();
        prop_assert_eq!(back, pdu);
    }

    #[test]
    fn streams_of_pdus_round_trip(
        pdus in proptest::collection::vec(arb_pdu(), 1..8),
        cfg in arb_digests(),
    ) {
        let side = Side::Controller;
        let sent: Vec<Pdu> =
            pdus.into_iter().filter(|p| p.header.pdu_type().sender() == side.peer()).collect();
        let mut stream = Vec::new();
        for pdu in &sent {
            pdu.write_to(&mut stream, &cfg).unwrap();
        }
        let mut reader = PduReader::new(side, MAX_PDU, cfg);
        let mut cursor = Cursor::new(&stream);
        for pdu in &sent {
            prop_assert_eq!(&reader.read_pdu(&mut cursor).unwrap(), pdu);
        }
        prop_assert_eq!(reader.read_pdu(&mut cursor).unwrap_err().kind(), PduErrorKind::Closed);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        fuzz_decode(&bytes);
        for side in [Side::Host, Side::Controller] {
            let mut reader = PduReader::new(side, 4096, digests(true, true, 0));
            if let Err(err) = reader.read_pdu(&mut Cursor::new(&bytes)) {
                prop_assert!(!err.to_string().is_empty());
                if let Some(term) = reader.termination(&err) {
                    prop_assert!(term.data.len() <= 128);
                }
            }
        }
    }

    #[test]
    fn any_flipped_header_byte_is_caught_by_the_header_digest(
        pdu in arb_pdu().prop_filter("digested", |p| p.header.pdu_type().has_header_digest()),
        pda in 0u8..=31,
        index in any::<prop::sample::Index>(),
        flip in 1u8..,
    ) {
        let cfg = digests(true, true, pda);
        let pdu_type = pdu.header.pdu_type();
        let mut bytes = pdu.encode(&cfg).unwrap();
        let at = 1 + index.index(pdu_type.hlen() + 3);
        bytes[at] ^= flip;
        let result = read_one(receiver(pdu_type), cfg, &bytes);
        prop_assert!(result.is_err(), "flip at {} accepted", at);
        let err = result.unwrap_err();
        if at != 2 {
            prop_assert_eq!(err.kind(), PduErrorKind::HeaderDigest, "{}", err);
            prop_assert_eq!(err.fes(), Some((Fes::HeaderDigestError, 0)));
        }
    }

    #[test]
    fn mutated_pdus_never_panic(
        pdu in arb_pdu(),
        cfg in arb_digests(),
        mutations in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = pdu.encode(&cfg).unwrap();
        for (index, value) in mutations {
            let at = index.index(bytes.len());
            bytes[at] = value;
        }
        let keep = cut.index(bytes.len() + 1);
        let side = receiver(pdu.header.pdu_type());
        let result = read_one(side, cfg, &bytes[..keep]);
        if let Err(err) = &result {
            prop_assert!(!err.to_string().is_empty());
        }
        let mut input = vec![u8::from(side == Side::Host)];
        input.extend_from_slice(&bytes[..keep]);
        fuzz_decode(&input);
    }
}

#[test]
fn pdu_type_metadata_matches_the_specification() {
    for (pdu_type, hlen) in [
        (PduType::IcReq, 128),
        (PduType::IcResp, 128),
        (PduType::H2CTermReq, 24),
        (PduType::C2HTermReq, 24),
        (PduType::CapsuleCmd, 72),
        (PduType::CapsuleResp, 24),
        (PduType::H2CData, 24),
        (PduType::C2HData, 24),
        (PduType::R2T, 24),
    ] {
        assert_eq!(pdu_type.hlen(), hlen, "{pdu_type}");
        assert_eq!(PduType::from_u8(pdu_type as u8), Some(pdu_type));
    }
    assert_eq!(PduType::from_u8(0x08), None);
}
