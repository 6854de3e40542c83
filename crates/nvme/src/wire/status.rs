//! NVMe completion status: Status Code Type (SCT), Status Code (SC) and the retry bits.

use std::fmt;

/// Status Code Type values (NVMe Base 2.0, Figure 95).
pub mod sct {
    /// Generic Command Status: valid for every command.
    pub const GENERIC: u8 = 0;
    /// Command Specific Status: the meaning of SC depends on the opcode.
    pub const COMMAND_SPECIFIC: u8 = 1;
    /// Media and Data Integrity Errors.
    pub const MEDIA: u8 = 2;
    /// Path Related Status: the command failed on this path; another path may work.
    pub const PATH: u8 = 3;
    /// Vendor specific.
    pub const VENDOR: u8 = 7;
}

/// The 15-bit status of a completion queue entry (CQE Dword 3 bits 31:17), without the phase
/// tag, which has no meaning over Fabrics (it is always 0 there).
///
/// Layout of the field as it sits in the CQE's 16-bit status word: bit 0 phase, bits 8:1 SC,
/// bits 11:9 SCT, bits 13:12 CRD (command retry delay index), bit 14 More (more status in the
/// error log), bit 15 DNR (do not retry). The constants below carry DNR clear; a target sets
/// it with [`Status::with_dnr`] when retrying cannot help.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(u16);

impl Status {
    /// A status from its type and code, with CRD, More and DNR clear.
    #[must_use]
    pub const fn new(sct: u8, sc: u8) -> Self {
        Status(((sct as u16 & 0x7) << 8) | sc as u16)
    }

    /// Decodes the CQE status word (bits 15:0 of the upper half of Dword 3), ignoring the
    /// phase bit.
    #[must_use]
    pub const fn from_cqe_word(word: u16) -> Self {
        Status(word >> 1)
    }

    /// Encodes the CQE status word with the given phase tag.
    #[must_use]
    pub const fn to_cqe_word(self, phase: bool) -> u16 {
        (self.0 << 1) | phase as u16
    }

    /// Status Code Type (3 bits).
    #[must_use]
    pub const fn sct(self) -> u8 {
        ((self.0 >> 8) & 0x7) as u8
    }

    /// Status Code.
    #[must_use]
    pub const fn sc(self) -> u8 {
        (self.0 & 0xff) as u8
    }

    /// Command Retry Delay index (0 = retry at once, 1..=3 select CRDT1..3 of Identify).
    #[must_use]
    pub const fn crd(self) -> u8 {
        ((self.0 >> 11) & 0x3) as u8
    }

    /// More: the Error Information log holds more about this failure.
    #[must_use]
    pub const fn more(self) -> bool {
        self.0 & (1 << 13) != 0
    }

    /// Do Not Retry: the same command would fail again.
    #[must_use]
    pub const fn dnr(self) -> bool {
        self.0 & (1 << 14) != 0
    }

    /// The same status with DNR set or cleared.
    #[must_use]
    pub const fn with_dnr(self, dnr: bool) -> Self {
        Status((self.0 & !(1 << 14)) | ((dnr as u16) << 14))
    }

    /// The same status with More set or cleared.
    #[must_use]
    pub const fn with_more(self, more: bool) -> Self {
        Status((self.0 & !(1 << 13)) | ((more as u16) << 13))
    }

    /// The same status with the given CRD (only the low two bits are used).
    #[must_use]
    pub const fn with_crd(self, crd: u8) -> Self {
        Status((self.0 & !(0x3 << 11)) | (((crd & 0x3) as u16) << 11))
    }

    /// SCT and SC alone, for comparing statuses regardless of the retry bits.
    #[must_use]
    pub const fn code(self) -> (u8, u8) {
        (self.sct(), self.sc())
    }

    /// True for Successful Completion (SCT 0, SC 0), whatever the retry bits say.
    #[must_use]
    pub const fn is_success(self) -> bool {
        self.0 & 0x7ff == 0
    }

    /// The raw 15-bit value (status word without phase, shifted down by one).
    #[must_use]
    pub const fn raw(self) -> u16 {
        self.0
    }

    /// The specification's name for this status, or `None` if this crate does not know it.
    ///
    /// Command-specific codes 0x80..=0x85 are named for the Fabrics Connect command, the only
    /// command this crate defines that returns them; for Dataset Management the same codes
    /// mean Conflicting Attributes, Invalid Protection Information and so on.
    #[must_use]
    pub fn name(self) -> Option<&'static str> {
        match self.sct() {
            sct::GENERIC => generic_name(self.sc()),
            sct::COMMAND_SPECIFIC => command_specific_name(self.sc()),
            sct::MEDIA => media_name(self.sc()),
            sct::PATH => path_name(self.sc()),
            _ => None,
        }
    }
}

/// Named statuses (SCT, SC) used by targets and hosts.
impl Status {
    /// Successful Completion.
    pub const SUCCESS: Status = Status::new(sct::GENERIC, 0x00);
    /// Invalid Command Opcode.
    pub const INVALID_OPCODE: Status = Status::new(sct::GENERIC, 0x01);
    /// Invalid Field in Command.
    pub const INVALID_FIELD: Status = Status::new(sct::GENERIC, 0x02);
    /// Command ID Conflict.
    pub const COMMAND_ID_CONFLICT: Status = Status::new(sct::GENERIC, 0x03);
    /// Data Transfer Error.
    pub const DATA_TRANSFER_ERROR: Status = Status::new(sct::GENERIC, 0x04);
    /// Commands Aborted due to Power Loss Notification.
    pub const ABORTED_POWER_LOSS: Status = Status::new(sct::GENERIC, 0x05);
    /// Internal Error.
    pub const INTERNAL_ERROR: Status = Status::new(sct::GENERIC, 0x06);
    /// Command Abort Requested.
    pub const ABORTED_BY_REQUEST: Status = Status::new(sct::GENERIC, 0x07);
    /// Command Aborted due to SQ Deletion.
    pub const ABORTED_SQ_DELETION: Status = Status::new(sct::GENERIC, 0x08);
    /// Invalid Namespace or Format.
    pub const INVALID_NAMESPACE: Status = Status::new(sct::GENERIC, 0x0b);
    /// Command Sequence Error.
    pub const COMMAND_SEQUENCE_ERROR: Status = Status::new(sct::GENERIC, 0x0c);
    /// Invalid SGL Segment Descriptor.
    pub const INVALID_SGL_SEGMENT_DESCRIPTOR: Status = Status::new(sct::GENERIC, 0x0d);
    /// Invalid Number of SGL Descriptors.
    pub const INVALID_SGL_DESCRIPTOR_COUNT: Status = Status::new(sct::GENERIC, 0x0e);
    /// Data SGL Length Invalid.
    pub const DATA_SGL_LENGTH_INVALID: Status = Status::new(sct::GENERIC, 0x0f);
    /// SGL Descriptor Type Invalid.
    pub const SGL_DESCRIPTOR_TYPE_INVALID: Status = Status::new(sct::GENERIC, 0x11);
    /// SGL Offset Invalid.
    pub const SGL_OFFSET_INVALID: Status = Status::new(sct::GENERIC, 0x16);
    /// Host Identifier Inconsistent Format.
    pub const HOST_ID_INCONSISTENT_FORMAT: Status = Status::new(sct::GENERIC, 0x18);
    /// Keep Alive Timer Expired.
    pub const KEEP_ALIVE_EXPIRED: Status = Status::new(sct::GENERIC, 0x19);
    /// Keep Alive Timeout Invalid.
    pub const KEEP_ALIVE_INVALID: Status = Status::new(sct::GENERIC, 0x1a);
    /// Command Aborted due to Preempt and Abort.
    pub const ABORTED_PREEMPT: Status = Status::new(sct::GENERIC, 0x1b);
    /// Namespace is Write Protected.
    pub const NAMESPACE_WRITE_PROTECTED: Status = Status::new(sct::GENERIC, 0x20);
    /// Command Interrupted (retry later).
    pub const COMMAND_INTERRUPTED: Status = Status::new(sct::GENERIC, 0x21);
    /// Transient Transport Error: returned for a data digest error, so the host retries.
    pub const TRANSIENT_TRANSPORT_ERROR: Status = Status::new(sct::GENERIC, 0x22);
    /// LBA Out of Range.
    pub const LBA_OUT_OF_RANGE: Status = Status::new(sct::GENERIC, 0x80);
    /// Capacity Exceeded.
    pub const CAPACITY_EXCEEDED: Status = Status::new(sct::GENERIC, 0x81);
    /// Namespace Not Ready.
    pub const NAMESPACE_NOT_READY: Status = Status::new(sct::GENERIC, 0x82);
    /// Reservation Conflict.
    pub const RESERVATION_CONFLICT: Status = Status::new(sct::GENERIC, 0x83);
    /// Format In Progress.
    pub const FORMAT_IN_PROGRESS: Status = Status::new(sct::GENERIC, 0x84);

    /// Completion Queue Invalid.
    pub const COMPLETION_QUEUE_INVALID: Status = Status::new(sct::COMMAND_SPECIFIC, 0x00);
    /// Invalid Queue Identifier.
    pub const INVALID_QUEUE_IDENTIFIER: Status = Status::new(sct::COMMAND_SPECIFIC, 0x01);
    /// Invalid Queue Size.
    pub const INVALID_QUEUE_SIZE: Status = Status::new(sct::COMMAND_SPECIFIC, 0x02);
    /// Abort Command Limit Exceeded.
    pub const ABORT_LIMIT_EXCEEDED: Status = Status::new(sct::COMMAND_SPECIFIC, 0x03);
    /// Asynchronous Event Request Limit Exceeded.
    pub const ASYNC_EVENT_LIMIT_EXCEEDED: Status = Status::new(sct::COMMAND_SPECIFIC, 0x05);
    /// Invalid Log Page.
    pub const INVALID_LOG_PAGE: Status = Status::new(sct::COMMAND_SPECIFIC, 0x09);
    /// Invalid Format.
    pub const INVALID_FORMAT: Status = Status::new(sct::COMMAND_SPECIFIC, 0x0a);
    /// Feature Identifier Not Saveable.
    pub const FEATURE_NOT_SAVEABLE: Status = Status::new(sct::COMMAND_SPECIFIC, 0x0d);
    /// Feature Not Changeable.
    pub const FEATURE_NOT_CHANGEABLE: Status = Status::new(sct::COMMAND_SPECIFIC, 0x0e);
    /// Feature Not Namespace Specific.
    pub const FEATURE_NOT_NAMESPACE_SPECIFIC: Status = Status::new(sct::COMMAND_SPECIFIC, 0x0f);
    /// Connect: Incompatible Format (RECFMT not supported).
    pub const CONNECT_INCOMPATIBLE_FORMAT: Status = Status::new(sct::COMMAND_SPECIFIC, 0x80);
    /// Connect: Controller Busy (the controller ID is in use or no controller is free).
    pub const CONNECT_CONTROLLER_BUSY: Status = Status::new(sct::COMMAND_SPECIFIC, 0x81);
    /// Connect: Invalid Parameters (Dword 0 of the response says which one).
    pub const CONNECT_INVALID_PARAMETERS: Status = Status::new(sct::COMMAND_SPECIFIC, 0x82);
    /// Connect: Restart Discovery.
    pub const CONNECT_RESTART_DISCOVERY: Status = Status::new(sct::COMMAND_SPECIFIC, 0x83);
    /// Connect: Invalid Host (the host may not access the subsystem).
    pub const CONNECT_INVALID_HOST: Status = Status::new(sct::COMMAND_SPECIFIC, 0x84);
    /// Connect: Invalid Queue Type.
    pub const CONNECT_INVALID_QUEUE_TYPE: Status = Status::new(sct::COMMAND_SPECIFIC, 0x85);

    /// Write Fault.
    pub const WRITE_FAULT: Status = Status::new(sct::MEDIA, 0x80);
    /// Unrecovered Read Error.
    pub const UNRECOVERED_READ_ERROR: Status = Status::new(sct::MEDIA, 0x81);
    /// Access Denied.
    pub const ACCESS_DENIED: Status = Status::new(sct::MEDIA, 0x86);
    /// Deallocated or Unwritten Logical Block.
    pub const DEALLOCATED_OR_UNWRITTEN: Status = Status::new(sct::MEDIA, 0x87);

    /// Internal Path Error.
    pub const INTERNAL_PATH_ERROR: Status = Status::new(sct::PATH, 0x00);
    /// Asymmetric Access Persistent Loss.
    pub const ANA_PERSISTENT_LOSS: Status = Status::new(sct::PATH, 0x01);
    /// Asymmetric Access Inaccessible.
    pub const ANA_INACCESSIBLE: Status = Status::new(sct::PATH, 0x02);
    /// Asymmetric Access Transition.
    pub const ANA_TRANSITION: Status = Status::new(sct::PATH, 0x03);
    /// Controller Pathing Error.
    pub const CONTROLLER_PATHING_ERROR: Status = Status::new(sct::PATH, 0x60);
    /// Host Pathing Error.
    pub const HOST_PATHING_ERROR: Status = Status::new(sct::PATH, 0x70);
    /// Command Aborted By Host.
    pub const ABORTED_BY_HOST: Status = Status::new(sct::PATH, 0x71);
}

fn generic_name(sc: u8) -> Option<&'static str> {
    Some(match sc {
        0x00 => "Successful Completion",
        0x01 => "Invalid Command Opcode",
        0x02 => "Invalid Field in Command",
        0x03 => "Command ID Conflict",
        0x04 => "Data Transfer Error",
        0x05 => "Commands Aborted due to Power Loss Notification",
        0x06 => "Internal Error",
        0x07 => "Command Abort Requested",
        0x08 => "Command Aborted due to SQ Deletion",
        0x09 => "Command Aborted due to Failed Fused Command",
        0x0a => "Command Aborted due to Missing Fused Command",
        0x0b => "Invalid Namespace or Format",
        0x0c => "Command Sequence Error",
        0x0d => "Invalid SGL Segment Descriptor",
        0x0e => "Invalid Number of SGL Descriptors",
        0x0f => "Data SGL Length Invalid",
        0x10 => "Metadata SGL Length Invalid",
        0x11 => "SGL Descriptor Type Invalid",
        0x16 => "SGL Offset Invalid",
        0x18 => "Host Identifier Inconsistent Format",
        0x19 => "Keep Alive Timer Expired",
        0x1a => "Keep Alive Timeout Invalid",
        0x1b => "Command Aborted due to Preempt and Abort",
        0x20 => "Namespace is Write Protected",
        0x21 => "Command Interrupted",
        0x22 => "Transient Transport Error",
        0x80 => "LBA Out of Range",
        0x81 => "Capacity Exceeded",
        0x82 => "Namespace Not Ready",
        0x83 => "Reservation Conflict",
        0x84 => "Format In Progress",
        _ => return None,
    })
}

fn command_specific_name(sc: u8) -> Option<&'static str> {
    Some(match sc {
        0x00 => "Completion Queue Invalid",
        0x01 => "Invalid Queue Identifier",
        0x02 => "Invalid Queue Size",
        0x03 => "Abort Command Limit Exceeded",
        0x05 => "Asynchronous Event Request Limit Exceeded",
        0x06 => "Invalid Firmware Slot",
        0x07 => "Invalid Firmware Image",
        0x08 => "Invalid Interrupt Vector",
        0x09 => "Invalid Log Page",
        0x0a => "Invalid Format",
        0x0c => "Invalid Queue Deletion",
        0x0d => "Feature Identifier Not Saveable",
        0x0e => "Feature Not Changeable",
        0x0f => "Feature Not Namespace Specific",
        0x80 => "Connect Incompatible Format",
        0x81 => "Connect Controller Busy",
        0x82 => "Connect Invalid Parameters",
        0x83 => "Connect Restart Discovery",
        0x84 => "Connect Invalid Host",
        0x85 => "Connect Invalid Queue Type",
        _ => return None,
    })
}

fn media_name(sc: u8) -> Option<&'static str> {
    Some(match sc {
        0x80 => "Write Fault",
        0x81 => "Unrecovered Read Error",
        0x82 => "End-to-end Guard Check Error",
        0x83 => "End-to-end Application Tag Check Error",
        0x84 => "End-to-end Reference Tag Check Error",
        0x85 => "Compare Failure",
        0x86 => "Access Denied",
        0x87 => "Deallocated or Unwritten Logical Block",
        _ => return None,
    })
}

fn path_name(sc: u8) -> Option<&'static str> {
    Some(match sc {
        0x00 => "Internal Path Error",
        0x01 => "Asymmetric Access Persistent Loss",
        0x02 => "Asymmetric Access Inaccessible",
        0x03 => "Asymmetric Access Transition",
        0x60 => "Controller Pathing Error",
        0x70 => "Host Pathing Error",
        0x71 => "Command Aborted By Host",
        _ => return None,
    })
}

impl fmt::Display for Status {
    /// "Invalid Field in Command (SCT 0x0 SC 0x02, DNR)".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name().unwrap_or("Unknown Status"))?;
        write!(f, " (SCT {:#x} SC {:#04x}", self.sct(), self.sc())?;
        if self.crd() != 0 {
            write!(f, ", CRD {}", self.crd())?;
        }
        if self.more() {
            f.write_str(", More")?;
        }
        if self.dnr() {
            f.write_str(", DNR")?;
        }
        f.write_str(")")
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_word_layout() {
        // SCT 1 SC 0x82 DNR, phase 1: DNR bit 15, SCT bits 11:9, SC bits 8:1, phase bit 0.
        let s = Status::CONNECT_INVALID_PARAMETERS.with_dnr(true);
        assert_eq!(s.to_cqe_word(true), 0x8000 | (1 << 9) | (0x82 << 1) | 1);
        assert_eq!(Status::from_cqe_word(s.to_cqe_word(true)), s);
        assert_eq!(
            s.to_string(),
            "Connect Invalid Parameters (SCT 0x1 SC 0x82, DNR)"
        );
        let crd = Status::NAMESPACE_NOT_READY.with_crd(2).with_more(true);
        assert_eq!(crd.to_cqe_word(false), (2 << 12) | (1 << 14) | (0x82 << 1));
        assert!(Status::SUCCESS.with_dnr(true).is_success());
        assert!(!Status::INVALID_FIELD.is_success());
    }
}
