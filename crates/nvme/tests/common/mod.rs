//! Shared builders for the NVMe wire tests: one valid PDU of every type, proptest
//! strategies, and a reference CRC32C that does not share code with the crate.
#![allow(dead_code)]

use proptest::prelude::*;
use tessera_nvme::wire::command::{Cqe, Sqe};
use tessera_nvme::wire::fabrics::{Connect, ConnectData, FabricsCommand, CNTLID_DYNAMIC};
use tessera_nvme::wire::pdu::{
    DataHeader, DigestConfig, IcReq, IcResp, Pdu, PduHeader, PduType, R2t, TermReq,
};
use tessera_nvme::wire::{Fes, Nqn, SglDescriptor, Status};

/// Bitwise CRC32C (Castagnoli, reflected polynomial 0x82F63B78), written from the
/// definition so that a wrong digest in the crate cannot be mirrored here.
pub fn reference_crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Parses "0a 0b ..." (whitespace ignored) into bytes.
pub fn hex(s: &str) -> Vec<u8> {
    let digits: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    assert!(digits.len().is_multiple_of(2), "odd hex string");
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).expect("hex digit"))
        .collect()
}

pub fn digests(header: bool, data: bool, pda: u8) -> DigestConfig {
    DigestConfig::new(header, data, pda).expect("pda in range")
}

/// The Connect command and data a Linux host sends on the admin queue.
pub fn connect_pdu() -> Pdu {
    let connect = Connect {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato_ms: 120_000,
    };
    let mut sqe = FabricsCommand::Connect(connect).to_sqe(0);
    sqe.dptr = SglDescriptor::in_capsule(0, 1024);
    let data = ConnectData {
        hostid: [0x11; 16],
        cntlid: CNTLID_DYNAMIC,
        subnqn: Nqn::new("nqn.2024-01.io.tessera:drive0").expect("nqn"),
        hostnqn: Nqn::from_uuid(&[0x22; 16]),
    };
    Pdu {
        header: PduHeader::CapsuleCmd(sqe),
        data: data.encode(),
    }
}

/// One valid PDU of every type, each with data where the type allows it.
pub fn one_of_each() -> Vec<Pdu> {
    let icreq = IcReq {
        pfv: 0,
        hpda: 0,
        hdgst: true,
        ddgst: true,
        maxr2t: 0,
    };
    let icresp = IcResp {
        pfv: 0,
        cpda: 0,
        hdgst: true,
        ddgst: true,
        maxh2cdata: 131_072,
    };
    let mut cqe = Cqe::new(7, Status::SUCCESS);
    cqe.dw0 = 1;
    vec![
        Pdu::new(PduHeader::IcReq(icreq)),
        Pdu::new(PduHeader::IcResp(icresp)),
        Pdu {
            header: PduHeader::H2CTermReq(TermReq::new(Fes::HeaderDigestError, 0)),
            data: vec![4; 24],
        },
        Pdu {
            header: PduHeader::C2HTermReq(TermReq::new(Fes::InvalidHeaderField, 2)),
            data: vec![],
        },
        connect_pdu(),
        Pdu::new(PduHeader::CapsuleCmd(Sqe::new(0x18, 9))),
        Pdu::new(PduHeader::CapsuleResp(cqe)),
        Pdu {
            header: PduHeader::H2CData(DataHeader::h2c(3, 1, 4096, 512, true)),
            data: vec![0xab; 512],
        },
        Pdu {
            header: PduHeader::C2HData(DataHeader::c2h(3, 0, 100, true, true)),
            data: (0..100u8).collect(),
        },
        Pdu::new(PduHeader::R2T(R2t {
            cccid: 3,
            ttag: 1,
            r2to: 0,
            r2tl: 8192,
        })),
    ]
}

pub fn arb_digests() -> impl Strategy<Value = DigestConfig> {
    (any::<bool>(), any::<bool>(), 0u8..=31).prop_map(|(h, d, p)| digests(h, d, p))
}

fn arb_sqe() -> impl Strategy<Value = Sqe> {
    (any::<[u8; 32]>(), any::<[u8; 32]>()).prop_map(|(a, b)| {
        let mut raw = [0u8; 64];
        raw[..32].copy_from_slice(&a);
        raw[32..].copy_from_slice(&b);
        // Reserved SGL bytes are not carried by `SglDescriptor`; zero them so that
        // re-encoding gives the same bytes.
        raw[36..39].fill(0);
        Sqe::from_bytes(&raw)
    })
}

fn arb_cqe() -> impl Strategy<Value = Cqe> {
    any::<[u8; 16]>().prop_map(|raw| Cqe::from_bytes(&raw))
}

fn arb_data_header(c2h: bool) -> impl Strategy<Value = (DataHeader, Vec<u8>)> {
    (
        any::<u16>(),
        any::<u16>(),
        any::<u32>(),
        proptest::collection::vec(any::<u8>(), 1..600),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(move |(cccid, ttag, datao, data, last, success)| {
            let datal = data.len() as u32;
            let header = if c2h {
                DataHeader::c2h(cccid, datao, datal, last || success, success)
            } else {
                DataHeader::h2c(cccid, ttag, datao, datal, last)
            };
            (header, data)
        })
}

/// Any valid PDU.
pub fn arb_pdu() -> impl Strategy<Value = Pdu> {
    let term = (
        any::<u16>(),
        any::<u32>(),
        proptest::collection::vec(any::<u8>(), 0..=128),
    );
    prop_oneof![
        (any::<u8>(), any::<bool>(), any::<bool>(), any::<u32>()).prop_map(|(p, h, d, m)| {
            Pdu::new(PduHeader::IcReq(IcReq {
                pfv: 0,
                hpda: p % 32,
                hdgst: h,
                ddgst: d,
                maxr2t: m,
            }))
        }),
        (
            any::<u8>(),
            any::<bool>(),
            any::<bool>(),
            1024u32..=u32::MAX / 4
        )
            .prop_map(|(p, h, d, m)| {
                let ic = IcResp {
                    pfv: 0,
                    cpda: p % 32,
                    hdgst: h,
                    ddgst: d,
                    maxh2cdata: m * 4,
                };
                Pdu::new(PduHeader::IcResp(ic))
            }),
        term.clone().prop_map(|(fes, fei, data)| {
            Pdu {
                header: PduHeader::H2CTermReq(TermReq { fes, fei }),
                data,
            }
        }),
        term.prop_map(|(fes, fei, data)| {
            Pdu {
                header: PduHeader::C2HTermReq(TermReq { fes, fei }),
                data,
            }
        }),
        (arb_sqe(), proptest::collection::vec(any::<u8>(), 0..600)).prop_map(|(sqe, data)| Pdu {
            header: PduHeader::CapsuleCmd(sqe),
            data
        }),
        arb_cqe().prop_map(|cqe| Pdu::new(PduHeader::CapsuleResp(cqe))),
        arb_data_header(false).prop_map(|(h, data)| Pdu {
            header: PduHeader::H2CData(h),
            data
        }),
        arb_data_header(true).prop_map(|(h, data)| Pdu {
            header: PduHeader::C2HData(h),
            data
        }),
        (any::<u16>(), any::<u16>(), any::<u32>(), any::<u32>()).prop_map(|(c, t, o, l)| {
            Pdu::new(PduHeader::R2T(R2t {
                cccid: c,
                ttag: t,
                r2to: o,
                r2tl: l,
            }))
        }),
    ]
}

/// The side that receives PDUs of this type.
pub fn receiver(pdu_type: PduType) -> tessera_nvme::wire::Side {
    pdu_type.sender().peer()
}
