//! NVMe/TCP PDUs (NVMe TCP Transport Specification 1.0, chapter 3): types, headers, digests,
//! alignment, and the encoder. The decoder is [`super::pdu_reader::PduReader`].
//!
//! Every PDU starts with the 8-byte common header:
//!
//! ```text
//! byte 0 PDU-type | 1 FLAGS | 2 HLEN | 3 PDO | 4..8 PLEN (u32, LE)
//! ```
//!
//! followed by the PDU-specific header (HLEN covers both), the header digest (4 bytes, if
//! negotiated and the type has one), padding up to PDO (the data offset, aligned as the
//! receiver asked in ICReq HPDA / ICResp CPDA), the data, and the data digest (4 bytes, if
//! negotiated and there is data). PLEN is the length of all of it. Both digests are CRC32C,
//! stored little endian.

use std::io::{self, IoSlice, Write};

use super::bytes::{get_u16, get_u32, put_u16, put_u32};
use super::command::{Cqe, Sqe, CQE_BYTES, SQE_BYTES};

/// Size of the common header.
pub const COMMON_HEADER_BYTES: usize = 8;
/// Size of a header or data digest.
pub const DIGEST_BYTES: usize = 4;
/// Size (HLEN and PLEN) of ICReq and ICResp.
pub const IC_PDU_BYTES: usize = 128;
/// HLEN of CapsuleCmd: common header plus one SQE.
pub const CAPSULE_CMD_HLEN: usize = COMMON_HEADER_BYTES + SQE_BYTES;
/// HLEN of CapsuleResp: common header plus one CQE.
pub const CAPSULE_RESP_HLEN: usize = COMMON_HEADER_BYTES + CQE_BYTES;
/// HLEN of H2CData, C2HData, R2T, H2CTermReq and C2HTermReq.
pub const SHORT_HLEN: usize = 24;
/// Most data a TermReq carries (the offending PDU header, cut to this length).
pub const TERM_REQ_DATA_MAX_BYTES: usize = 128;
/// Largest TermReq PDU (HLEN 24 plus 128 bytes of data).
pub const TERM_REQ_PDU_MAX_BYTES: usize = SHORT_HLEN + TERM_REQ_DATA_MAX_BYTES;
/// Smallest MAXH2CDATA a controller may announce in ICResp.
pub const MAXH2CDATA_MIN: u32 = 4096;
/// Largest HPDA / CPDA value (0's based dwords: 31 means 128-byte alignment).
pub const PDA_MAX: u8 = 31;
/// Room for the largest header region: common and specific header, digest and padding
/// (PDO is one byte, so nothing before the data can exceed 255 bytes).
pub const HEADER_REGION_MAX_BYTES: usize = 256;

// Layout relationships the encoder and reader rely on: the fixed header lengths of the
// specification, and room in the header buffer for the largest header, digest and padding
// (PDO is one byte).
const _: () = assert!(CAPSULE_CMD_HLEN == 72 && CAPSULE_RESP_HLEN == 24);
const _: () = assert!(TERM_REQ_PDU_MAX_BYTES == 152);
const _: () = assert!(HEADER_REGION_MAX_BYTES > u8::MAX as usize);
const _: () = assert!(CAPSULE_CMD_HLEN + DIGEST_BYTES <= (PDA_MAX as usize + 1) * 4);

/// Common header FLAGS bits.
pub mod flags {
    /// A header digest follows the header.
    pub const HDGSTF: u8 = 1 << 0;
    /// A data digest follows the data.
    pub const DDGSTF: u8 = 1 << 1;
    /// H2CData / C2HData: last PDU of the transfer (for H2CData, of the R2T).
    pub const LAST_PDU: u8 = 1 << 2;
    /// C2HData: the command succeeded and no CapsuleResp will follow (needs LAST_PDU).
    pub const SUCCESS: u8 = 1 << 3;
}

/// ICReq / ICResp DGST bits.
pub mod dgst {
    /// Header digests enabled.
    pub const HDGST_ENABLE: u8 = 1 << 0;
    /// Data digests enabled.
    pub const DDGST_ENABLE: u8 = 1 << 1;
}

/// The side of a connection: the host (initiator) or the controller (target).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The host sends ICReq, H2C PDUs and commands.
    Host,
    /// The controller sends ICResp, C2H PDUs, responses and R2Ts.
    Controller,
}

impl Side {
    /// The other side.
    #[must_use]
    pub fn peer(self) -> Side {
        match self {
            Side::Host => Side::Controller,
            Side::Controller => Side::Host,
        }
    }
}

/// PDU types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PduType {
    /// Initialize Connection Request (host to controller).
    IcReq = 0x00,
    /// Initialize Connection Response.
    IcResp = 0x01,
    /// Host to Controller Terminate Connection Request.
    H2CTermReq = 0x02,
    /// Controller to Host Terminate Connection Request.
    C2HTermReq = 0x03,
    /// Command capsule.
    CapsuleCmd = 0x04,
    /// Response capsule.
    CapsuleResp = 0x05,
    /// Host to Controller data (write data, after R2T).
    H2CData = 0x06,
    /// Controller to Host data (read data).
    C2HData = 0x07,
    /// Ready to Transfer: the controller asks for write data.
    R2T = 0x09,
}

impl PduType {
    /// The type for a PDU-type byte, or `None` if unknown.
    #[must_use]
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x00 => PduType::IcReq,
            0x01 => PduType::IcResp,
            0x02 => PduType::H2CTermReq,
            0x03 => PduType::C2HTermReq,
            0x04 => PduType::CapsuleCmd,
            0x05 => PduType::CapsuleResp,
            0x06 => PduType::H2CData,
            0x07 => PduType::C2HData,
            0x09 => PduType::R2T,
            _ => return None,
        })
    }

    /// The fixed HLEN of this type.
    #[must_use]
    pub const fn hlen(self) -> usize {
        match self {
            PduType::IcReq | PduType::IcResp => IC_PDU_BYTES,
            PduType::CapsuleCmd => CAPSULE_CMD_HLEN,
            PduType::CapsuleResp => CAPSULE_RESP_HLEN,
            PduType::H2CTermReq
            | PduType::C2HTermReq
            | PduType::H2CData
            | PduType::C2HData
            | PduType::R2T => SHORT_HLEN,
        }
    }

    /// Which side sends this type.
    #[must_use]
    pub const fn sender(self) -> Side {
        match self {
            PduType::IcReq | PduType::H2CTermReq | PduType::CapsuleCmd | PduType::H2CData => {
                Side::Host
            }
            PduType::IcResp
            | PduType::C2HTermReq
            | PduType::CapsuleResp
            | PduType::C2HData
            | PduType::R2T => Side::Controller,
        }
    }

    /// Whether a negotiated header digest applies to this type. ICReq/ICResp precede
    /// negotiation and TermReqs must be readable by a peer whose state is broken, so they
    /// never carry one.
    #[must_use]
    pub const fn has_header_digest(self) -> bool {
        matches!(
            self,
            PduType::CapsuleCmd
                | PduType::CapsuleResp
                | PduType::H2CData
                | PduType::C2HData
                | PduType::R2T
        )
    }

    /// Whether a negotiated data digest applies to this type's data.
    #[must_use]
    pub const fn has_data_digest(self) -> bool {
        matches!(
            self,
            PduType::CapsuleCmd | PduType::H2CData | PduType::C2HData
        )
    }

    /// Whether PDUs of this type may carry data at all.
    #[must_use]
    pub const fn may_carry_data(self) -> bool {
        matches!(
            self,
            PduType::CapsuleCmd
                | PduType::H2CData
                | PduType::C2HData
                | PduType::H2CTermReq
                | PduType::C2HTermReq
        )
    }

    /// The specification's name ("CapsuleCmd").
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            PduType::IcReq => "ICReq",
            PduType::IcResp => "ICResp",
            PduType::H2CTermReq => "H2CTermReq",
            PduType::C2HTermReq => "C2HTermReq",
            PduType::CapsuleCmd => "CapsuleCmd",
            PduType::CapsuleResp => "CapsuleResp",
            PduType::H2CData => "H2CData",
            PduType::C2HData => "C2HData",
            PduType::R2T => "R2T",
        }
    }
}

impl std::fmt::Display for PduType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({:#04x})", self.name(), *self as u8)
    }
}

/// Digest and alignment settings of one direction of a connection.
///
/// Before the ICReq/ICResp exchange both digests are off and there is no alignment
/// ([`DigestConfig::NONE`]). Afterwards use [`DigestConfig::after_handshake`]: digests are
/// what the controller enabled in ICResp, and the alignment of data a side sends is the one
/// its peer asked for (the controller's CPDA for host-to-controller PDUs, the host's HPDA for
/// controller-to-host PDUs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DigestConfig {
    /// Header digests enabled.
    pub header: bool,
    /// Data digests enabled.
    pub data: bool,
    pda: u8,
}

/// Send and receive settings of one side after the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionDigests {
    /// For PDUs this side sends.
    pub send: DigestConfig,
    /// For PDUs this side receives (give it to the [`super::pdu_reader::PduReader`]).
    pub receive: DigestConfig,
}

impl DigestConfig {
    /// No digests, no alignment: the state before ICReq/ICResp.
    pub const NONE: DigestConfig = DigestConfig {
        header: false,
        data: false,
        pda: 0,
    };

    /// Digest settings with PDU data alignment `pda` (0's based dwords, 0..=31).
    ///
    /// # Errors
    /// [`EncodeError::InvalidPda`] above 31.
    pub fn new(header: bool, data: bool, pda: u8) -> Result<Self, EncodeError> {
        if pda > PDA_MAX {
            return Err(EncodeError::InvalidPda { pda });
        }
        Ok(DigestConfig { header, data, pda })
    }

    /// The alignment value as on the wire (0's based dwords).
    #[must_use]
    pub fn pda(&self) -> u8 {
        self.pda
    }

    /// The alignment in bytes, `(pda + 1) * 4`: 4..=128.
    #[must_use]
    pub fn pda_bytes(&self) -> usize {
        (usize::from(self.pda) + 1) * 4
    }

    /// The settings of `side` once ICReq and ICResp have been exchanged.
    #[must_use]
    pub fn after_handshake(icreq: &IcReq, icresp: &IcResp, side: Side) -> SessionDigests {
        let (header, data) = (icresp.hdgst, icresp.ddgst);
        // `IcReq`/`IcResp` values come from the decoder or from callers; clamp rather than
        // fail, since the decoder already rejected values above 31.
        let h2c = DigestConfig {
            header,
            data,
            pda: icresp.cpda.min(PDA_MAX),
        };
        let c2h = DigestConfig {
            header,
            data,
            pda: icreq.hpda.min(PDA_MAX),
        };
        match side {
            Side::Host => SessionDigests {
                send: h2c,
                receive: c2h,
            },
            Side::Controller => SessionDigests {
                send: c2h,
                receive: h2c,
            },
        }
    }

    /// Whether `pdu_type` carries a header digest under these settings.
    #[must_use]
    pub fn header_digest_for(&self, pdu_type: PduType) -> bool {
        self.header && pdu_type.has_header_digest()
    }

    /// PDO for a PDU of `pdu_type` that carries data: the header and its digest rounded up to
    /// the alignment.
    ///
    /// SPDK pads to `max(header, alignment)` instead of rounding up to a multiple; the two
    /// agree whenever the alignment is 0 (what Linux requires) or at least the header size,
    /// and the reader accepts both.
    #[must_use]
    pub fn data_offset(&self, pdu_type: PduType) -> usize {
        let header = pdu_type.hlen() + self.digest_len(pdu_type);
        header.div_ceil(self.pda_bytes()) * self.pda_bytes()
    }

    fn digest_len(&self, pdu_type: PduType) -> usize {
        if self.header_digest_for(pdu_type) {
            DIGEST_BYTES
        } else {
            0
        }
    }
}

/// ICReq: the host's first PDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcReq {
    /// PDU format version (bytes 9:8); 0 is the only one defined.
    pub pfv: u16,
    /// Host PDU data alignment (byte 10), 0's based dwords.
    pub hpda: u8,
    /// Header digest requested (byte 11 bit 0).
    pub hdgst: bool,
    /// Data digest requested (byte 11 bit 1).
    pub ddgst: bool,
    /// Maximum outstanding R2Ts per command, 0's based (bytes 15:12).
    pub maxr2t: u32,
}

/// ICResp: the controller's answer to ICReq.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcResp {
    /// PDU format version (bytes 9:8); 0.
    pub pfv: u16,
    /// Controller PDU data alignment (byte 10), 0's based dwords.
    pub cpda: u8,
    /// Header digest enabled (byte 11 bit 0).
    pub hdgst: bool,
    /// Data digest enabled (byte 11 bit 1).
    pub ddgst: bool,
    /// Largest H2CData data the controller accepts, in bytes (bytes 15:12); at least 4096
    /// and a multiple of 4.
    pub maxh2cdata: u32,
}

/// Fatal error status of a TermReq.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Fes {
    /// Invalid PDU Header Field; FEI is the byte offset of the field.
    InvalidHeaderField = 0x01,
    /// PDU Sequence Error: a valid PDU arrived when it is not allowed.
    PduSequenceError = 0x02,
    /// Header Digest Error.
    HeaderDigestError = 0x03,
    /// Data Transfer Out of Range: data outside the command's buffer or the R2T's window.
    DataTransferOutOfRange = 0x04,
    /// Data Transfer Limit Exceeded (also R2T Limit Exceeded).
    DataTransferLimitExceeded = 0x05,
    /// Unsupported Parameter; FEI is the byte offset of the parameter.
    UnsupportedParameter = 0x06,
}

impl Fes {
    /// The FES for a raw value, or `None` if reserved.
    #[must_use]
    pub fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            0x01 => Fes::InvalidHeaderField,
            0x02 => Fes::PduSequenceError,
            0x03 => Fes::HeaderDigestError,
            0x04 => Fes::DataTransferOutOfRange,
            0x05 => Fes::DataTransferLimitExceeded,
            0x06 => Fes::UnsupportedParameter,
            _ => return None,
        })
    }
}

/// H2CTermReq / C2HTermReq header. The data is the header of the PDU that caused the error
/// (at most 128 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermReq {
    /// Fatal error status (bytes 9:8), raw so that reserved values from a peer survive.
    pub fes: u16,
    /// Fatal error information (bytes 13:10): a byte offset for FES 0x01 and 0x06, else 0.
    pub fei: u32,
}

impl TermReq {
    /// A TermReq for `fes` with information `fei`.
    #[must_use]
    pub fn new(fes: Fes, fei: u32) -> Self {
        TermReq {
            fes: fes as u16,
            fei,
        }
    }
}

/// H2CData / C2HData header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHeader {
    /// Command capsule CID (bytes 9:8) of the command this data belongs to.
    pub cccid: u16,
    /// Transfer tag (bytes 11:10): for H2CData, the TTAG of the R2T; reserved (0) in C2HData.
    pub ttag: u16,
    /// Offset of this data within the command's data (bytes 15:12).
    pub datao: u32,
    /// Length of this PDU's data (bytes 19:16); must equal the data carried.
    pub datal: u32,
    /// LAST_PDU flag.
    pub last: bool,
    /// SUCCESS flag (C2HData only; requires `last`).
    pub success: bool,
}

impl DataHeader {
    /// A C2HData header for `datal` bytes at `datao` of command `cccid`.
    #[must_use]
    pub fn c2h(cccid: u16, datao: u32, datal: u32, last: bool, success: bool) -> Self {
        DataHeader {
            cccid,
            ttag: 0,
            datao,
            datal,
            last,
            success,
        }
    }

    /// An H2CData header answering R2T `ttag`.
    #[must_use]
    pub fn h2c(cccid: u16, ttag: u16, datao: u32, datal: u32, last: bool) -> Self {
        DataHeader {
            cccid,
            ttag,
            datao,
            datal,
            last,
            success: false,
        }
    }
}

/// R2T header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R2t {
    /// Command capsule CID (bytes 9:8).
    pub cccid: u16,
    /// Transfer tag (bytes 11:10) the host echoes in its H2CData PDUs.
    pub ttag: u16,
    /// Offset of the requested data within the command's data (bytes 15:12).
    pub r2to: u32,
    /// Length requested (bytes 19:16).
    pub r2tl: u32,
}

/// The header of any PDU, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PduHeader {
    /// ICReq.
    IcReq(IcReq),
    /// ICResp.
    IcResp(IcResp),
    /// H2CTermReq.
    H2CTermReq(TermReq),
    /// C2HTermReq.
    C2HTermReq(TermReq),
    /// CapsuleCmd: the SQE (data, if any, is in-capsule data).
    CapsuleCmd(Sqe),
    /// CapsuleResp: the CQE.
    CapsuleResp(Cqe),
    /// H2CData.
    H2CData(DataHeader),
    /// C2HData.
    C2HData(DataHeader),
    /// R2T.
    R2T(R2t),
}

impl PduHeader {
    /// The PDU type.
    #[must_use]
    pub fn pdu_type(&self) -> PduType {
        match self {
            PduHeader::IcReq(_) => PduType::IcReq,
            PduHeader::IcResp(_) => PduType::IcResp,
            PduHeader::H2CTermReq(_) => PduType::H2CTermReq,
            PduHeader::C2HTermReq(_) => PduType::C2HTermReq,
            PduHeader::CapsuleCmd(_) => PduType::CapsuleCmd,
            PduHeader::CapsuleResp(_) => PduType::CapsuleResp,
            PduHeader::H2CData(_) => PduType::H2CData,
            PduHeader::C2HData(_) => PduType::C2HData,
            PduHeader::R2T(_) => PduType::R2T,
        }
    }

    /// Writes the PDU-specific part (bytes 8..HLEN) into `b`.
    fn write_specific(&self, b: &mut [u8]) {
        match self {
            PduHeader::IcReq(ic) => write_ic(b, ic.pfv, ic.hpda, ic.hdgst, ic.ddgst, ic.maxr2t),
            PduHeader::IcResp(ic) => {
                write_ic(b, ic.pfv, ic.cpda, ic.hdgst, ic.ddgst, ic.maxh2cdata);
            }
            PduHeader::H2CTermReq(t) | PduHeader::C2HTermReq(t) => {
                put_u16(b, 8, t.fes);
                put_u32(b, 10, t.fei);
            }
            PduHeader::CapsuleCmd(sqe) => b[8..72].copy_from_slice(&sqe.to_bytes()),
            PduHeader::CapsuleResp(cqe) => b[8..24].copy_from_slice(&cqe.to_bytes()),
            PduHeader::H2CData(d) | PduHeader::C2HData(d) => {
                write_short(b, d.cccid, d.ttag, d.datao, d.datal);
            }
            PduHeader::R2T(r) => write_short(b, r.cccid, r.ttag, r.r2to, r.r2tl),
        }
    }

    fn flags(&self) -> u8 {
        match self {
            PduHeader::H2CData(d) | PduHeader::C2HData(d) => {
                let last = if d.last { flags::LAST_PDU } else { 0 };
                last | if d.success { flags::SUCCESS } else { 0 }
            }
            _ => 0,
        }
    }

    /// Checks that `data_len` bytes of data may accompany this header.
    fn check_data(&self, data_len: usize) -> Result<(), EncodeError> {
        let pdu_type = self.pdu_type();
        match self {
            PduHeader::H2CTermReq(_) | PduHeader::C2HTermReq(_)
                if data_len > TERM_REQ_DATA_MAX_BYTES =>
            {
                let max = TERM_REQ_DATA_MAX_BYTES;
                Err(EncodeError::DataTooLong {
                    pdu_type,
                    len: data_len,
                    max,
                })
            }
            PduHeader::H2CData(d) | PduHeader::C2HData(d) => {
                check_data_header(pdu_type, d, data_len)
            }
            _ if data_len > 0 && !pdu_type.may_carry_data() => Err(EncodeError::DataNotAllowed {
                pdu_type,
                len: data_len,
            }),
            _ => Ok(()),
        }
    }
}

fn check_data_header(
    pdu_type: PduType,
    d: &DataHeader,
    data_len: usize,
) -> Result<(), EncodeError> {
    if data_len == 0 {
        return Err(EncodeError::InvalidHeader {
            pdu_type,
            reason: "data PDUs carry data",
        });
    }
    if u64::from(d.datal) != data_len as u64 {
        return Err(EncodeError::DataLengthMismatch {
            pdu_type,
            datal: d.datal,
            len: data_len,
        });
    }
    if d.success && (pdu_type == PduType::H2CData || !d.last) {
        let reason = "SUCCESS is only valid on a C2HData PDU with LAST_PDU";
        return Err(EncodeError::InvalidHeader { pdu_type, reason });
    }
    Ok(())
}

fn write_ic(b: &mut [u8], pfv: u16, pda: u8, hdgst: bool, ddgst: bool, dword: u32) {
    put_u16(b, 8, pfv);
    b[10] = pda;
    b[11] = (u8::from(hdgst) * dgst::HDGST_ENABLE) | (u8::from(ddgst) * dgst::DDGST_ENABLE);
    put_u32(b, 12, dword);
}

fn write_short(b: &mut [u8], cccid: u16, ttag: u16, offset: u32, length: u32) {
    put_u16(b, 8, cccid);
    put_u16(b, 10, ttag);
    put_u32(b, 12, offset);
    put_u32(b, 16, length);
}

/// Reads the IC fields common to ICReq and ICResp: (PFV, xPDA, HDGST, DDGST, dword 12).
pub(crate) fn read_ic(b: &[u8]) -> (u16, u8, bool, bool, u32) {
    let digest = b[11];
    let (h, d) = (
        digest & dgst::HDGST_ENABLE != 0,
        digest & dgst::DDGST_ENABLE != 0,
    );
    (get_u16(b, 8), b[10], h, d, get_u32(b, 12))
}

/// Reads (CCCID, TTAG, offset, length) of data and R2T headers.
pub(crate) fn read_short(b: &[u8]) -> (u16, u16, u32, u32) {
    (
        get_u16(b, 8),
        get_u16(b, 10),
        get_u32(b, 12),
        get_u32(b, 16),
    )
}

/// A PDU: header plus data (in-capsule data, transfer data, or a TermReq's offending header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pdu {
    /// The header.
    pub header: PduHeader,
    /// The data; empty for types without data.
    pub data: Vec<u8>,
}

impl Pdu {
    /// A PDU without data.
    #[must_use]
    pub fn new(header: PduHeader) -> Self {
        Pdu {
            header,
            data: Vec::new(),
        }
    }

    /// Encodes the whole PDU.
    ///
    /// # Errors
    /// See [`encode_header`].
    pub fn encode(&self, cfg: &DigestConfig) -> Result<Vec<u8>, EncodeError> {
        encode_pdu(&self.header, &self.data, cfg)
    }

    /// Writes the whole PDU to `w`.
    ///
    /// # Errors
    /// See [`write_pdu`].
    pub fn write_to<W: Write>(&self, w: &mut W, cfg: &DigestConfig) -> Result<(), EncodeError> {
        write_pdu(w, &self.header, &self.data, cfg)
    }
}

/// Why a PDU could not be encoded. Every variant is a mistake of the caller (the transport
/// built an impossible PDU), except [`EncodeError::Io`].
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// This type never carries data.
    #[error("{pdu_type} carries no data, got {len} bytes")]
    DataNotAllowed {
        /// The PDU type.
        pdu_type: PduType,
        /// Data length given.
        len: usize,
    },
    /// The data is too long for this type (TermReq) or for PLEN.
    #[error("{pdu_type} data of {len} bytes exceeds {max}")]
    DataTooLong {
        /// The PDU type.
        pdu_type: PduType,
        /// Data length given.
        len: usize,
        /// Largest allowed.
        max: usize,
    },
    /// DATAL in the header differs from the data given.
    #[error("{pdu_type} DATAL {datal} does not match {len} bytes of data")]
    DataLengthMismatch {
        /// The PDU type.
        pdu_type: PduType,
        /// DATAL.
        datal: u32,
        /// Data length given.
        len: usize,
    },
    /// A header field combination the specification forbids.
    #[error("{pdu_type}: {reason}")]
    InvalidHeader {
        /// The PDU type.
        pdu_type: PduType,
        /// What is wrong.
        reason: &'static str,
    },
    /// PDU data alignment above 31.
    #[error("PDU data alignment {pda} invalid: 0..=31 (0's based dwords)")]
    InvalidPda {
        /// The value given.
        pda: u8,
    },
    /// Writing to the stream failed.
    #[error("writing PDU: {0}")]
    Io(#[from] io::Error),
}

/// An encoded header region: common and specific header, header digest and padding, up to
/// PDO (or to the end of the PDU when there is no data).
#[derive(Clone)]
pub struct EncodedHeader {
    bytes: [u8; HEADER_REGION_MAX_BYTES],
    len: usize,
    data_digest: bool,
}

impl EncodedHeader {
    /// The bytes to send before the data.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// Whether a data digest must follow the data.
    #[must_use]
    pub fn has_data_digest(&self) -> bool {
        self.data_digest
    }
}

/// Encodes the header region of a PDU that will carry `data_len` bytes of data. Lets a
/// transport send large data straight from its buffer (see [`write_pdu`]).
///
/// # Errors
/// [`EncodeError`] when the header and data length are inconsistent.
pub fn encode_header(
    header: &PduHeader,
    data_len: usize,
    cfg: &DigestConfig,
) -> Result<EncodedHeader, EncodeError> {
    let pdu_type = header.pdu_type();
    header.check_data(data_len)?;
    let hlen = pdu_type.hlen();
    let hdgst = cfg.header_digest_for(pdu_type);
    let ddgst = cfg.data && pdu_type.has_data_digest() && data_len > 0;
    let is_term = matches!(pdu_type, PduType::H2CTermReq | PduType::C2HTermReq);
    // TermReq data follows the header directly with PDO reserved; other data sits at PDO.
    let (pdo, region) = match (data_len, is_term) {
        (0, _) => (0, hlen + cfg.digest_len(pdu_type)),
        (_, true) => (0, hlen),
        (_, false) => (cfg.data_offset(pdu_type), cfg.data_offset(pdu_type)),
    };
    let trailer = if ddgst { DIGEST_BYTES } else { 0 };
    let plen = u32::try_from(region as u64 + data_len as u64 + trailer as u64).map_err(|_| {
        let max = u32::MAX as usize - region - trailer;
        EncodeError::DataTooLong {
            pdu_type,
            len: data_len,
            max,
        }
    })?;
    let mut bytes = [0u8; HEADER_REGION_MAX_BYTES];
    bytes[0] = pdu_type as u8;
    bytes[1] = header.flags()
        | if hdgst { flags::HDGSTF } else { 0 }
        | if ddgst { flags::DDGSTF } else { 0 };
    bytes[2] = hlen as u8;
    bytes[3] = pdo as u8;
    put_u32(&mut bytes, 4, plen);
    header.write_specific(&mut bytes[..hlen]);
    if hdgst {
        let digest = crc32c::crc32c(&bytes[..hlen]);
        put_u32(&mut bytes, hlen, digest);
    }
    Ok(EncodedHeader {
        bytes,
        len: region,
        data_digest: ddgst,
    })
}

/// Encodes a whole PDU into a new buffer.
///
/// # Errors
/// [`EncodeError`] when the header and data are inconsistent.
pub fn encode_pdu(
    header: &PduHeader,
    data: &[u8],
    cfg: &DigestConfig,
) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::new();
    write_pdu(&mut out, header, data, cfg)?;
    Ok(out)
}

/// Writes a whole PDU to `w` without copying `data`: header region, data and data digest go
/// out as one vectored write where the writer supports it.
///
/// # Errors
/// [`EncodeError`] when the header and data are inconsistent, [`EncodeError::Io`] when
/// writing fails (the stream is then unusable: part of a PDU may have been sent).
pub fn write_pdu<W: Write>(
    w: &mut W,
    header: &PduHeader,
    data: &[u8],
    cfg: &DigestConfig,
) -> Result<(), EncodeError> {
    let head = encode_header(header, data.len(), cfg)?;
    // The digest costs a pass over the data (~90 µs per MiB): only when negotiated.
    let digest = if head.has_data_digest() {
        crc32c::crc32c(data).to_le_bytes()
    } else {
        [0; 4]
    };
    let trailer: &[u8] = if head.has_data_digest() { &digest } else { &[] };
    let mut slices = [
        IoSlice::new(head.as_bytes()),
        IoSlice::new(data),
        IoSlice::new(trailer),
    ];
    write_all_vectored(w, &mut slices)?;
    Ok(())
}

/// `Write::write_all_vectored` is unstable; this is the same loop. Shared by the host and
/// the drive server, which send header, data and digest slices in one system call.
pub fn write_all_vectored<W: Write>(w: &mut W, mut slices: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        match w.write_vectored(slices) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "wrote 0 bytes")),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
