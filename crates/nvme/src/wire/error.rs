//! The error of every structure decoder and command parser outside PDU framing.

use super::status::Status;
use super::text::TextError;

/// Why a command, a data structure (Identify, log page, Connect data) or a field value was
/// rejected.
///
/// Every variant names the structure, the field and its byte offset, because a target must
/// report where a command was wrong (the Connect response's invalid parameter offset, the
/// error log's parameter error location) and a human reading a log must see which field of
/// which page was bad without a packet capture. [`WireError::status`] gives the NVMe status
/// a target returns for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The buffer is shorter than the structure.
    #[error("{structure} needs {needed} bytes, got {len}")]
    Short {
        /// The structure being decoded, for example "Identify Controller".
        structure: &'static str,
        /// Bytes the structure (or the part of it being read) occupies.
        needed: usize,
        /// Bytes that were available.
        len: usize,
    },
    /// A numeric field holds a value the specification does not allow here.
    #[error("{structure} field {field} (byte {offset}) value {value:#x} invalid: {reason}")]
    InvalidField {
        /// The structure or command, for example "Connect command".
        structure: &'static str,
        /// The field's name as the specification spells it, for example "QID".
        field: &'static str,
        /// Byte offset of the field inside the structure (inside the SQE for commands).
        offset: usize,
        /// The offending value.
        value: u64,
        /// What the specification requires instead.
        reason: &'static str,
    },
    /// A text field (serial number, NQN, transport address) is malformed.
    #[error("{structure} field {field} (byte {offset}) invalid: {source}")]
    InvalidText {
        /// The structure, for example "Connect data".
        structure: &'static str,
        /// The field's name, for example "HOSTNQN".
        field: &'static str,
        /// Byte offset of the field inside the structure.
        offset: usize,
        /// What is wrong with the text.
        source: TextError,
    },
    /// The opcode (or Fabrics command type) is not one this crate knows for that queue.
    #[error("{what} {opcode:#04x} is not a supported {queue} command")]
    InvalidOpcode {
        /// "opcode" or "fctype".
        what: &'static str,
        /// The value received.
        opcode: u8,
        /// "admin", "I/O" or "Fabrics".
        queue: &'static str,
    },
}

impl WireError {
    /// The completion status a controller returns for a command rejected with this error.
    ///
    /// Invalid opcodes and Fabrics command types map to Invalid Command Opcode, short data
    /// to Data SGL Length Invalid, everything else to Invalid Field in Command; all with DNR
    /// set, because retrying the same bytes cannot succeed.
    #[must_use]
    pub fn status(&self) -> Status {
        let status = match self {
            WireError::InvalidOpcode { .. } => Status::INVALID_OPCODE,
            WireError::Short { .. } => Status::DATA_SGL_LENGTH_INVALID,
            WireError::InvalidField { .. } | WireError::InvalidText { .. } => Status::INVALID_FIELD,
        };
        status.with_dnr(true)
    }

    /// Byte offset of the offending field, when there is one.
    #[must_use]
    pub fn offset(&self) -> Option<usize> {
        match self {
            WireError::InvalidField { offset, .. } | WireError::InvalidText { offset, .. } => {
                Some(*offset)
            }
            WireError::InvalidOpcode { .. } => Some(0),
            WireError::Short { .. } => None,
        }
    }
}

/// Returns `Err(Short)` unless `buf` holds at least `needed` bytes.
pub(crate) fn need(structure: &'static str, buf: &[u8], needed: usize) -> Result<(), WireError> {
    if buf.len() < needed {
        return Err(WireError::Short {
            structure,
            needed,
            len: buf.len(),
        });
    }
    Ok(())
}

/// Shorthand for an [`WireError::InvalidField`].
pub(crate) fn invalid(
    structure: &'static str,
    field: &'static str,
    offset: usize,
    value: u64,
    reason: &'static str,
) -> WireError {
    WireError::InvalidField {
        structure,
        field,
        offset,
        value,
        reason,
    }
}
