//! Why a received PDU was rejected, and what to tell the peer.

use std::io;

use super::pdu::{Fes, PduType, Side};
use super::status::Status;

/// Why [`super::pdu_reader::PduReader`] rejected the byte stream.
///
/// The specification gives three outcomes, and [`PduError::fes`] / [`PduError::status`] say
/// which applies:
///
/// * a malformed header or a header digest error is fatal: the receiver sends a TermReq with
///   the FES and FEI from [`PduError::fes`] (build it with
///   [`super::pdu_reader::PduReader::termination`]) and closes the connection;
/// * a data digest error is not: the PDU was read to its end, the stream is still in sync,
///   and the command completes with [`Status::TRANSIENT_TRANSPORT_ERROR`] so the host
///   retries it;
/// * I/O errors and a closed or truncated stream end the connection with nothing to send.
#[derive(Debug, thiserror::Error)]
pub enum PduError {
    /// The peer closed the connection at a PDU boundary.
    #[error("connection closed")]
    Closed,
    /// The stream ended inside a PDU.
    #[error("{what} truncated: got {got} of {needed} bytes")]
    Truncated {
        /// The part being read ("common header", "PDU header", "data").
        what: &'static str,
        /// Bytes needed.
        needed: usize,
        /// Bytes received before the end of the stream.
        got: usize,
    },
    /// Reading failed.
    #[error("reading PDU: {0}")]
    Io(#[from] io::Error),
    /// The PDU-type byte is not a known type.
    #[error("PDU type {pdu_type:#04x} unknown")]
    UnknownType {
        /// The byte received.
        pdu_type: u8,
    },
    /// A known type that this side never receives (for example an R2T sent to a
    /// controller).
    #[error("PDU type {pdu_type} is never sent to the {receiver:?}")]
    WrongDirection {
        /// The type received.
        pdu_type: PduType,
        /// The side that received it.
        receiver: Side,
    },
    /// HLEN is not the fixed header length of the type.
    #[error("hlen {hlen} invalid for {pdu_type}: must be {expected}")]
    HlenMismatch {
        /// The type.
        pdu_type: PduType,
        /// HLEN received.
        hlen: u8,
        /// HLEN of the type.
        expected: usize,
    },
    /// PLEN is smaller than the header (plus header digest) it must contain.
    #[error("plen {plen} smaller than hlen {hlen} plus {digest} digest bytes")]
    PlenTooSmall {
        /// PLEN received.
        plen: u32,
        /// HLEN.
        hlen: usize,
        /// Header digest bytes expected.
        digest: usize,
    },
    /// PLEN is not the exact length a type without data (or with bounded data) must have.
    #[error("plen {plen} invalid for {pdu_type}: must be {expected}")]
    PlenMismatch {
        /// The type.
        pdu_type: PduType,
        /// PLEN received.
        plen: u32,
        /// What PLEN must be (or its maximum, for TermReq).
        expected: usize,
    },
    /// PLEN exceeds the largest PDU this receiver accepts.
    #[error("plen {plen} exceeds the maximum PDU size {max}")]
    PlenTooLarge {
        /// PLEN received.
        plen: u32,
        /// The receiver's maximum.
        max: u32,
    },
    /// PDO does not leave room for the header, is misaligned, or points past the data.
    #[error("pdo {pdo} invalid for {pdu_type}: {reason}")]
    PdoInvalid {
        /// The type.
        pdu_type: PduType,
        /// PDO received.
        pdo: u8,
        /// What is wrong.
        reason: &'static str,
    },
    /// Another header field holds a value the specification forbids.
    #[error("{pdu_type} field {field} (byte {offset}) value {value:#x} invalid: {reason}")]
    InvalidField {
        /// The type.
        pdu_type: PduType,
        /// The field's name ("FLAGS", "DATAL", "MAXH2CDATA").
        field: &'static str,
        /// Byte offset of the field in the PDU.
        offset: u32,
        /// The value received.
        value: u64,
        /// What the specification requires.
        reason: &'static str,
    },
    /// A parameter this implementation does not support (PFV, alignment).
    #[error("{pdu_type} field {field} (byte {offset}) value {value:#x} unsupported")]
    Unsupported {
        /// The type.
        pdu_type: PduType,
        /// The field's name.
        field: &'static str,
        /// Byte offset of the field in the PDU.
        offset: u32,
        /// The value received.
        value: u64,
    },
    /// The header digest does not match the header.
    #[error("{pdu_type} header digest {received:#010x} does not match computed {computed:#010x}")]
    HeaderDigest {
        /// The type.
        pdu_type: PduType,
        /// Digest received.
        received: u32,
        /// Digest of the bytes received.
        computed: u32,
    },
    /// The data digest does not match the data. The PDU was consumed entirely.
    #[error("{pdu_type} data digest {received:#010x} does not match computed {computed:#010x}")]
    DataDigest {
        /// The type.
        pdu_type: PduType,
        /// Digest received.
        received: u32,
        /// Digest of the data received.
        computed: u32,
    },
    /// A well-formed PDU arrived when the connection state does not allow it (raised by the
    /// target or host state machine, not by the reader).
    #[error("{pdu_type} not allowed now: {reason}")]
    Sequence {
        /// The type.
        pdu_type: PduType,
        /// Why.
        reason: &'static str,
    },
    /// Data outside the command's buffer or the R2T's window (raised by the state machine).
    #[error("data at offset {offset} length {len} outside the {limit} bytes allowed")]
    DataOutOfRange {
        /// DATAO.
        offset: u64,
        /// DATAL.
        len: u64,
        /// Bytes allowed.
        limit: u64,
    },
    /// More data than negotiated (MAXH2CDATA) or more R2Ts than MAXR2T (raised by the state
    /// machine).
    #[error("data transfer of {len} exceeds the limit {limit}")]
    DataLimitExceeded {
        /// Amount received.
        len: u64,
        /// Limit.
        limit: u64,
    },
    /// The caller's buffer for [`super::pdu_reader::PduReader::read_data_into`] has the
    /// wrong length (a bug in the caller). Nothing was read: calling again with a buffer of
    /// the right length continues where the stream is.
    #[error("data buffer holds {got} bytes, the PDU carries {expected}")]
    BufferLength {
        /// Data length of the PDU.
        expected: usize,
        /// Buffer length given.
        got: usize,
    },
}

/// The variant of a [`PduError`], without its values: for matching in tests and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum PduErrorKind {
    Closed,
    Truncated,
    Io,
    UnknownType,
    WrongDirection,
    HlenMismatch,
    PlenTooSmall,
    PlenMismatch,
    PlenTooLarge,
    PdoInvalid,
    InvalidField,
    Unsupported,
    HeaderDigest,
    DataDigest,
    Sequence,
    DataOutOfRange,
    DataLimitExceeded,
    BufferLength,
}

impl PduErrorKind {
    /// The kind whose `Debug` name is `name`, for test corpora that name expected outcomes.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        use PduErrorKind as K;
        const ALL: [PduErrorKind; 18] = [
            K::Closed,
            K::Truncated,
            K::Io,
            K::UnknownType,
            K::WrongDirection,
            K::HlenMismatch,
            K::PlenTooSmall,
            K::PlenMismatch,
            K::PlenTooLarge,
            K::PdoInvalid,
            K::InvalidField,
            K::Unsupported,
            K::HeaderDigest,
            K::DataDigest,
            K::Sequence,
            K::DataOutOfRange,
            K::DataLimitExceeded,
            K::BufferLength,
        ];
        ALL.into_iter().find(|k| format!("{k:?}") == name)
    }
}

impl PduError {
    /// The variant, without values.
    #[must_use]
    pub fn kind(&self) -> PduErrorKind {
        use PduErrorKind as K;
        match self {
            PduError::Closed => K::Closed,
            PduError::Truncated { .. } => K::Truncated,
            PduError::Io(_) => K::Io,
            PduError::UnknownType { .. } => K::UnknownType,
            PduError::WrongDirection { .. } => K::WrongDirection,
            PduError::HlenMismatch { .. } => K::HlenMismatch,
            PduError::PlenTooSmall { .. } => K::PlenTooSmall,
            PduError::PlenMismatch { .. } => K::PlenMismatch,
            PduError::PlenTooLarge { .. } => K::PlenTooLarge,
            PduError::PdoInvalid { .. } => K::PdoInvalid,
            PduError::InvalidField { .. } => K::InvalidField,
            PduError::Unsupported { .. } => K::Unsupported,
            PduError::HeaderDigest { .. } => K::HeaderDigest,
            PduError::DataDigest { .. } => K::DataDigest,
            PduError::Sequence { .. } => K::Sequence,
            PduError::DataOutOfRange { .. } => K::DataOutOfRange,
            PduError::DataLimitExceeded { .. } => K::DataLimitExceeded,
            PduError::BufferLength { .. } => K::BufferLength,
        }
    }

    /// The fatal error status and information to put in the TermReq, or `None` when no
    /// TermReq is sent: the connection is already gone (closed, truncated, I/O), the error
    /// is not fatal (data digest), or it is the caller's bug (buffer length).
    ///
    /// FEI is the byte offset of the offending field for FES 0x01 and 0x06, as the
    /// specification requires, and 0 otherwise.
    #[must_use]
    pub fn fes(&self) -> Option<(Fes, u32)> {
        use PduError as E;
        Some(match self {
            E::UnknownType { .. } | E::WrongDirection { .. } => (Fes::InvalidHeaderField, 0),
            E::HlenMismatch { .. } => (Fes::InvalidHeaderField, 2),
            E::PdoInvalid { .. } => (Fes::InvalidHeaderField, 3),
            E::PlenTooSmall { .. } | E::PlenMismatch { .. } => (Fes::InvalidHeaderField, 4),
            E::InvalidField { offset, .. } => (Fes::InvalidHeaderField, *offset),
            E::Unsupported { offset, .. } => (Fes::UnsupportedParameter, *offset),
            E::HeaderDigest { .. } => (Fes::HeaderDigestError, 0),
            E::Sequence { .. } => (Fes::PduSequenceError, 0),
            E::DataOutOfRange { .. } => (Fes::DataTransferOutOfRange, 0),
            E::PlenTooLarge { .. } | E::DataLimitExceeded { .. } => {
                (Fes::DataTransferLimitExceeded, 0)
            }
            E::Closed | E::Truncated { .. } | E::Io(_) | E::DataDigest { .. } => return None,
            E::BufferLength { .. } => return None,
        })
    }

    /// The completion status for the affected command when the error is not fatal: a data
    /// digest error completes the command with Transient Transport Error.
    #[must_use]
    pub fn status(&self) -> Option<Status> {
        match self {
            PduError::DataDigest { .. } => Some(Status::TRANSIENT_TRANSPORT_ERROR),
            _ => None,
        }
    }

    /// True when the stream is still positioned at a PDU boundary, so the connection can
    /// continue: only after a data digest error.
    #[must_use]
    pub fn stream_in_sync(&self) -> bool {
        matches!(self, PduError::DataDigest { .. })
    }
}
