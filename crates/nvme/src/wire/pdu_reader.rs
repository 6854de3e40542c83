//! Reading PDUs from a byte stream, validating every header field before trusting it.
//!
//! [`PduReader::read_header`] reads and checks one PDU header (type, HLEN, header digest,
//! flags, PLEN, PDO and the type's own fields) and returns an [`InboundPdu`] that says how
//! much data follows. The caller then hands a buffer of exactly that size to
//! [`PduReader::read_data_into`], so write data lands where it belongs without a copy; or it
//! calls [`PduReader::read_pdu`] for an owned PDU. Nothing is allocated from a length read
//! off the wire beyond the configured maximum PDU size.

use std::io::{self, Read};

use super::bytes::get_u32;
use super::command::{Cqe, Sqe};
use super::pdu::{
    flags, read_ic, read_short, DataHeader, DigestConfig, IcReq, IcResp, Pdu, PduHeader, PduType,
    R2t, Side, TermReq, COMMON_HEADER_BYTES, DIGEST_BYTES, HEADER_REGION_MAX_BYTES, IC_PDU_BYTES,
    MAXH2CDATA_MIN, PDA_MAX, SHORT_HLEN, TERM_REQ_DATA_MAX_BYTES, TERM_REQ_PDU_MAX_BYTES,
};
use super::pdu_error::PduError;

/// The smallest maximum PDU size a reader accepts: enough for every PDU without data
/// (ICReq is 128 bytes, a TermReq up to 152) and a CapsuleCmd with its largest padding.
pub const MAX_PDU_BYTES_MIN: u32 = 256;

/// Reads PDUs sent by the peer of `side`.
#[derive(Debug, Clone)]
pub struct PduReader {
    side: Side,
    max_pdu_bytes: u32,
    digests: DigestConfig,
    header: [u8; HEADER_REGION_MAX_BYTES],
    header_len: usize,
}

/// A validated PDU header whose data (if any) has not been read yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboundPdu {
    /// The decoded header.
    pub header: PduHeader,
    data_len: usize,
    data_digest: bool,
}

impl InboundPdu {
    /// Bytes of data that follow; pass a buffer of exactly this length to
    /// [`PduReader::read_data_into`]. Always at most the reader's maximum PDU size.
    #[must_use]
    pub fn data_len(&self) -> usize {
        self.data_len
    }

    /// The PDU type.
    #[must_use]
    pub fn pdu_type(&self) -> PduType {
        self.header.pdu_type()
    }
}

/// Where the data sits inside a PDU, derived from a validated header.
struct Layout {
    pdo: usize,
    data_len: usize,
    data_digest: bool,
}

impl PduReader {
    /// A reader for PDUs arriving at `side`, accepting PDUs of at most `max_pdu_bytes` (raised
    /// to [`MAX_PDU_BYTES_MIN`] if smaller) with `digests` settings; start with
    /// [`DigestConfig::NONE`] and switch with [`PduReader::set_digests`] after the handshake.
    #[must_use]
    pub fn new(side: Side, max_pdu_bytes: u32, digests: DigestConfig) -> Self {
        PduReader {
            side,
            max_pdu_bytes: max_pdu_bytes.max(MAX_PDU_BYTES_MIN),
            digests,
            header: [0; HEADER_REGION_MAX_BYTES],
            header_len: 0,
        }
    }

    /// Switches digest and alignment settings, after ICReq/ICResp.
    pub fn set_digests(&mut self, digests: DigestConfig) {
        self.digests = digests;
    }

    /// The current settings.
    #[must_use]
    pub fn digests(&self) -> DigestConfig {
        self.digests
    }

    /// The largest PDU accepted.
    #[must_use]
    pub fn max_pdu_bytes(&self) -> u32 {
        self.max_pdu_bytes
    }

    /// The raw header bytes of the last PDU read (as far as they were received), which a
    /// TermReq quotes back to the sender.
    #[must_use]
    pub fn last_header(&self) -> &[u8] {
        &self.header[..self.header_len]
    }

    /// Reads one PDU header, its header digest and any padding, and validates them.
    ///
    /// # Errors
    /// [`PduError`] naming the field; see [`PduError::fes`] for what to tell the peer.
    pub fn read_header<R: Read>(&mut self, r: &mut R) -> Result<InboundPdu, PduError> {
        self.header_len = 0;
        let got = self.fill(r, 0, COMMON_HEADER_BYTES)?;
        if got == 0 {
            return Err(PduError::Closed);
        }
        if got < COMMON_HEADER_BYTES {
            return Err(truncated("common header", COMMON_HEADER_BYTES, got));
        }
        let pdu_type = self.check_type_and_hlen()?;
        let hlen = pdu_type.hlen();
        let hdgst = self.digests.header_digest_for(pdu_type);
        let header_end = hlen + if hdgst { DIGEST_BYTES } else { 0 };
        self.fill_exact(r, COMMON_HEADER_BYTES, header_end, "PDU header")?;
        if hdgst {
            self.check_header_digest(pdu_type, hlen)?;
        }
        let layout = self.check_layout(pdu_type, hdgst)?;
        let header = self.decode_specific(pdu_type, layout.data_len)?;
        if layout.pdo > header_end {
            self.fill_exact(r, header_end, layout.pdo, "PDU padding")?;
        }
        let (data_len, data_digest) = (layout.data_len, layout.data_digest);
        Ok(InboundPdu {
            header,
            data_len,
            data_digest,
        })
    }

    /// Reads the data of `pdu` into `buf` (exactly [`InboundPdu::data_len`] bytes) and
    /// checks its digest.
    ///
    /// # Errors
    /// [`PduError::DataDigest`] after the whole PDU was consumed (the data is in `buf` but
    /// must not be used), [`PduError::Truncated`] or [`PduError::Io`] when the stream fails,
    /// [`PduError::BufferLength`] for a wrong buffer.
    pub fn read_data_into<R: Read>(
        &mut self,
        r: &mut R,
        pdu: &InboundPdu,
        buf: &mut [u8],
    ) -> Result<(), PduError> {
        if buf.len() != pdu.data_len {
            return Err(PduError::BufferLength {
                expected: pdu.data_len,
                got: buf.len(),
            });
        }
        let got = read_full(r, buf)?;
        if got < buf.len() {
            return Err(truncated("PDU data", buf.len(), got));
        }
        if !pdu.data_digest {
            return Ok(());
        }
        let mut digest = [0u8; DIGEST_BYTES];
        let got = read_full(r, &mut digest)?;
        if got < DIGEST_BYTES {
            return Err(truncated("data digest", DIGEST_BYTES, got));
        }
        let (received, computed) = (u32::from_le_bytes(digest), crc32c::crc32c(buf));
        if received != computed {
            let pdu_type = pdu.pdu_type();
            return Err(PduError::DataDigest {
                pdu_type,
                received,
                computed,
            });
        }
        Ok(())
    }

    /// Reads one whole PDU into an owned [`Pdu`]. The data buffer is at most the maximum PDU
    /// size.
    ///
    /// # Errors
    /// As [`PduReader::read_header`] and [`PduReader::read_data_into`].
    pub fn read_pdu<R: Read>(&mut self, r: &mut R) -> Result<Pdu, PduError> {
        let inbound = self.read_header(r)?;
        let mut data = vec![0u8; inbound.data_len];
        self.read_data_into(r, &inbound, &mut data)?;
        Ok(Pdu {
            header: inbound.header,
            data,
        })
    }

    /// The TermReq PDU to send for `err` (H2CTermReq from a host, C2HTermReq from a
    /// controller), quoting the offending header; `None` when the error calls for no TermReq.
    #[must_use]
    pub fn termination(&self, err: &PduError) -> Option<Pdu> {
        let (fes, fei) = err.fes()?;
        let term = TermReq::new(fes, fei);
        let header = match self.side {
            Side::Host => PduHeader::H2CTermReq(term),
            Side::Controller => PduHeader::C2HTermReq(term),
        };
        let quoted = self.header_len.min(TERM_REQ_DATA_MAX_BYTES);
        Some(Pdu {
            header,
            data: self.header[..quoted].to_vec(),
        })
    }

    /// Reads `start..end` of the header buffer; returns how many bytes arrived before EOF.
    fn fill<R: Read>(&mut self, r: &mut R, start: usize, end: usize) -> Result<usize, PduError> {
        let got = read_full(r, &mut self.header[start..end])?;
        self.header_len = start + got;
        Ok(got)
    }

    fn fill_exact<R: Read>(
        &mut self,
        r: &mut R,
        start: usize,
        end: usize,
        what: &'static str,
    ) -> Result<(), PduError> {
        let got = self.fill(r, start, end)?;
        if got < end - start {
            return Err(truncated(what, end, start + got));
        }
        Ok(())
    }

    fn check_type_and_hlen(&self) -> Result<PduType, PduError> {
        let raw = self.header[0];
        let pdu_type = PduType::from_u8(raw).ok_or(PduError::UnknownType { pdu_type: raw })?;
        if pdu_type.sender() == self.side {
            return Err(PduError::WrongDirection {
                pdu_type,
                receiver: self.side,
            });
        }
        let hlen = self.header[2];
        if usize::from(hlen) != pdu_type.hlen() {
            return Err(PduError::HlenMismatch {
                pdu_type,
                hlen,
                expected: pdu_type.hlen(),
            });
        }
        Ok(pdu_type)
    }

    fn check_header_digest(&self, pdu_type: PduType, hlen: usize) -> Result<(), PduError> {
        let received = get_u32(&self.header, hlen);
        let computed = crc32c::crc32c(&self.header[..hlen]);
        if received != computed {
            return Err(PduError::HeaderDigest {
                pdu_type,
                received,
                computed,
            });
        }
        Ok(())
    }

    fn plen(&self) -> u32 {
        get_u32(&self.header, 4)
    }

    /// Checks FLAGS, PLEN and PDO against the type and the negotiated digests, and derives
    /// where the data is.
    fn check_layout(&self, pdu_type: PduType, hdgst: bool) -> Result<Layout, PduError> {
        let plen = self.plen();
        match pdu_type {
            PduType::IcReq | PduType::IcResp => {
                if plen as usize != IC_PDU_BYTES {
                    return Err(PduError::PlenMismatch {
                        pdu_type,
                        plen,
                        expected: IC_PDU_BYTES,
                    });
                }
                Ok(Layout {
                    pdo: IC_PDU_BYTES,
                    data_len: 0,
                    data_digest: false,
                })
            }
            PduType::H2CTermReq | PduType::C2HTermReq => {
                let expected = TERM_REQ_PDU_MAX_BYTES;
                if !(SHORT_HLEN..=expected).contains(&(plen as usize)) {
                    return Err(PduError::PlenMismatch {
                        pdu_type,
                        plen,
                        expected,
                    });
                }
                Ok(Layout {
                    pdo: SHORT_HLEN,
                    data_len: plen as usize - SHORT_HLEN,
                    data_digest: false,
                })
            }
            _ => self.check_digested_layout(pdu_type, hdgst),
        }
    }

    fn check_digested_layout(&self, pdu_type: PduType, hdgst: bool) -> Result<Layout, PduError> {
        let (plen, pdu_flags) = (self.plen(), self.header[1]);
        if (pdu_flags & flags::HDGSTF != 0) != hdgst {
            let reason = "HDGSTF must match the negotiated header digest";
            return Err(flag_error(pdu_type, pdu_flags, reason));
        }
        let hlen = pdu_type.hlen();
        let header_end = hlen + if hdgst { DIGEST_BYTES } else { 0 };
        if (plen as usize) < header_end {
            let digest = header_end - hlen;
            return Err(PduError::PlenTooSmall { plen, hlen, digest });
        }
        let has_data = plen as usize > header_end;
        let wants_ddgst = self.digests.data && pdu_type.has_data_digest() && has_data;
        if (pdu_flags & flags::DDGSTF != 0) != wants_ddgst {
            let reason = "DDGSTF must be set exactly when data digests are on and data follows";
            return Err(flag_error(pdu_type, pdu_flags, reason));
        }
        if !has_data {
            if matches!(pdu_type, PduType::H2CData | PduType::C2HData) {
                return Err(PduError::InvalidField {
                    pdu_type,
                    field: "PLEN",
                    offset: 4,
                    value: u64::from(plen),
                    reason: "data PDUs must carry data",
                });
            }
            return Ok(Layout {
                pdo: header_end,
                data_len: 0,
                data_digest: false,
            });
        }
        if !pdu_type.may_carry_data() {
            return Err(PduError::PlenMismatch {
                pdu_type,
                plen,
                expected: header_end,
            });
        }
        if plen > self.max_pdu_bytes {
            return Err(PduError::PlenTooLarge {
                plen,
                max: self.max_pdu_bytes,
            });
        }
        self.check_pdo(pdu_type, header_end, wants_ddgst)
    }

    fn check_pdo(
        &self,
        pdu_type: PduType,
        header_end: usize,
        ddgst: bool,
    ) -> Result<Layout, PduError> {
        let pdo_raw = self.header[3];
        let pdo = usize::from(pdo_raw);
        let invalid = |reason| PduError::PdoInvalid {
            pdu_type,
            pdo: pdo_raw,
            reason,
        };
        if pdo < header_end {
            return Err(invalid("data would overlap the header and its digest"));
        }
        // Both padding conventions in use (round up to a multiple, or pad to the alignment)
        // leave less than one alignment unit of padding; more is not a valid PDU.
        if pdo - header_end >= self.digests.pda_bytes() {
            return Err(invalid("padding exceeds the negotiated data alignment"));
        }
        let data_end = self.plen() as usize - if ddgst { DIGEST_BYTES } else { 0 };
        if pdo >= data_end {
            return Err(invalid("no data between PDO and the end of the PDU"));
        }
        Ok(Layout {
            pdo,
            data_len: data_end - pdo,
            data_digest: ddgst,
        })
    }

    fn decode_specific(&self, pdu_type: PduType, data_len: usize) -> Result<PduHeader, PduError> {
        let b = &self.header[..pdu_type.hlen()];
        Ok(match pdu_type {
            PduType::IcReq => PduHeader::IcReq(decode_icreq(b)?),
            PduType::IcResp => PduHeader::IcResp(decode_icresp(b)?),
            PduType::H2CTermReq => PduHeader::H2CTermReq(decode_term(b)),
            PduType::C2HTermReq => PduHeader::C2HTermReq(decode_term(b)),
            PduType::CapsuleCmd => {
                let mut sqe = [0u8; 64];
                sqe.copy_from_slice(&b[8..72]);
                PduHeader::CapsuleCmd(Sqe::from_bytes(&sqe))
            }
            PduType::CapsuleResp => {
                let mut cqe = [0u8; 16];
                cqe.copy_from_slice(&b[8..24]);
                PduHeader::CapsuleResp(Cqe::from_bytes(&cqe))
            }
            PduType::H2CData => PduHeader::H2CData(decode_data(pdu_type, b, data_len)?),
            PduType::C2HData => PduHeader::C2HData(decode_data(pdu_type, b, data_len)?),
            PduType::R2T => {
                let (cccid, ttag, r2to, r2tl) = read_short(b);
                PduHeader::R2T(R2t {
                    cccid,
                    ttag,
                    r2to,
                    r2tl,
                })
            }
        })
    }
}

fn decode_icreq(b: &[u8]) -> Result<IcReq, PduError> {
    let (pfv, hpda, hdgst, ddgst, maxr2t) = read_ic(b);
    check_ic_common(PduType::IcReq, pfv, "HPDA", hpda)?;
    Ok(IcReq {
        pfv,
        hpda,
        hdgst,
        ddgst,
        maxr2t,
    })
}

fn decode_icresp(b: &[u8]) -> Result<IcResp, PduError> {
    let pdu_type = PduType::IcResp;
    let (pfv, cpda, hdgst, ddgst, maxh2cdata) = read_ic(b);
    check_ic_common(pdu_type, pfv, "CPDA", cpda)?;
    if maxh2cdata < MAXH2CDATA_MIN || !maxh2cdata.is_multiple_of(4) {
        return Err(PduError::InvalidField {
            pdu_type,
            field: "MAXH2CDATA",
            offset: 12,
            value: u64::from(maxh2cdata),
            reason: "at least 4096 and a multiple of 4",
        });
    }
    Ok(IcResp {
        pfv,
        cpda,
        hdgst,
        ddgst,
        maxh2cdata,
    })
}

fn check_ic_common(
    pdu_type: PduType,
    pfv: u16,
    pda_name: &'static str,
    pda: u8,
) -> Result<(), PduError> {
    if pfv != 0 {
        let value = u64::from(pfv);
        return Err(PduError::Unsupported {
            pdu_type,
            field: "PFV",
            offset: 8,
            value,
        });
    }
    if pda > PDA_MAX {
        let value = u64::from(pda);
        return Err(PduError::Unsupported {
            pdu_type,
            field: pda_name,
            offset: 10,
            value,
        });
    }
    Ok(())
}

fn decode_term(b: &[u8]) -> TermReq {
    TermReq {
        fes: u16::from_le_bytes([b[8], b[9]]),
        fei: get_u32(b, 10),
    }
}

fn decode_data(pdu_type: PduType, b: &[u8], data_len: usize) -> Result<DataHeader, PduError> {
    let (cccid, ttag, datao, datal) = read_short(b);
    if datal as usize != data_len {
        return Err(PduError::InvalidField {
            pdu_type,
            field: "DATAL",
            offset: 16,
            value: u64::from(datal),
            reason: "must equal the data length PLEN and PDO leave",
        });
    }
    let pdu_flags = b[1];
    let last = pdu_flags & flags::LAST_PDU != 0;
    // SUCCESS is reserved in H2CData; a receiver ignores reserved bits.
    let success = pdu_type == PduType::C2HData && pdu_flags & flags::SUCCESS != 0;
    if success && !last {
        return Err(flag_error(pdu_type, pdu_flags, "SUCCESS requires LAST_PDU"));
    }
    Ok(DataHeader {
        cccid,
        ttag,
        datao,
        datal,
        last,
        success,
    })
}

fn flag_error(pdu_type: PduType, value: u8, reason: &'static str) -> PduError {
    let value = u64::from(value);
    PduError::InvalidField {
        pdu_type,
        field: "FLAGS",
        offset: 1,
        value,
        reason,
    }
}

fn truncated(what: &'static str, needed: usize, got: usize) -> PduError {
    PduError::Truncated { what, needed, got }
}

/// Reads until `buf` is full or the stream ends; returns the bytes read.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> Result<usize, PduError> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(PduError::Io(e)),
        }
    }
    Ok(done)
}
