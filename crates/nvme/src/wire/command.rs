//! The 64-byte submission queue entry (SQE), the 16-byte completion queue entry (CQE), SGL
//! data pointers, opcodes, and typed admin and I/O commands.
//!
//! Over NVMe/TCP a command capsule is exactly one SQE (plus in-capsule data) and a response
//! capsule exactly one CQE. [`Sqe`] and [`Cqe`] are raw field-for-field views: every bit
//! pattern decodes, so a target can always answer a command with its CID. Meaning is added
//! by [`Command::parse`], which turns an SQE into a typed command or a [`WireError`] whose
//! [`WireError::status`] is the completion status to return. Fabrics commands live in
//! [`super::fabrics`] and reservation commands in [`super::reservation`].

use super::bytes::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};
use super::error::{invalid, need, WireError};
use super::fabrics::FabricsCommand;
use super::reservation::{
    ReservationAcquire, ReservationRegister, ReservationRelease, ReservationReport,
};
use super::status::Status;

/// Size of a submission queue entry.
pub const SQE_BYTES: usize = 64;
/// Size of a completion queue entry.
pub const CQE_BYTES: usize = 16;

/// Admin command opcodes (NVMe Base 2.0, Figure 138).
pub mod admin_opcode {
    /// Delete I/O Submission Queue (not used over Fabrics: Connect creates queues).
    pub const DELETE_IO_SQ: u8 = 0x00;
    /// Create I/O Submission Queue (not used over Fabrics).
    pub const CREATE_IO_SQ: u8 = 0x01;
    /// Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Delete I/O Completion Queue (not used over Fabrics).
    pub const DELETE_IO_CQ: u8 = 0x04;
    /// Create I/O Completion Queue (not used over Fabrics).
    pub const CREATE_IO_CQ: u8 = 0x05;
    /// Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Abort.
    pub const ABORT: u8 = 0x08;
    /// Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Get Features.
    pub const GET_FEATURES: u8 = 0x0a;
    /// Asynchronous Event Request.
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0c;
    /// Keep Alive.
    pub const KEEP_ALIVE: u8 = 0x18;
}

/// NVM command set I/O opcodes (NVM Command Set 1.0, Figure 16).
pub mod io_opcode {
    /// Flush.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// Dataset Management (deallocate, i.e. trim).
    pub const DATASET_MANAGEMENT: u8 = 0x09;
    /// Reservation Register.
    pub const RESERVATION_REGISTER: u8 = 0x0d;
    /// Reservation Report.
    pub const RESERVATION_REPORT: u8 = 0x0e;
    /// Reservation Acquire.
    pub const RESERVATION_ACQUIRE: u8 = 0x11;
    /// Reservation Release.
    pub const RESERVATION_RELEASE: u8 = 0x15;
}

/// The Fabrics command opcode, valid on admin and I/O queues; the command type is FCTYPE.
pub const FABRICS_OPCODE: u8 = 0x7f;

/// PSDT value 01b in SQE byte 1 bits 7:6: SGLs are used, MPTR is a contiguous buffer. Fabrics
/// requires SGLs; this is the value Linux and SPDK hosts send.
pub const PSDT_SGL_MPTR_CONTIGUOUS: u8 = 0x40;
/// PSDT value 10b: SGLs are used, MPTR addresses an SGL segment.
pub const PSDT_SGL_MPTR_SGL: u8 = 0x80;

/// SGL descriptor type byte for a Data Block with an Offset address: NVMe/TCP in-capsule
/// data, where the address is the offset of the data inside the capsule.
pub const SGL_DATA_BLOCK_OFFSET: u8 = 0x01;
/// SGL descriptor type byte for a Transport SGL Data Block (type 0x5, subtype 0xA, transport
/// specific): data moved by H2CData after R2T, or by C2HData.
pub const SGL_TRANSPORT_DATA_BLOCK: u8 = 0x5a;

/// A 16-byte SGL descriptor as it sits in the SQE's DPTR field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct SglDescriptor {
    /// Address (bytes 7:0): for in-capsule data the offset into the capsule data.
    pub address: u64,
    /// Length in bytes (bytes 11:8).
    pub length: u32,
    /// Type byte (byte 15): descriptor type in bits 7:4, subtype in bits 3:0.
    pub sgl_type: u8,
}

/// What an SGL descriptor asks the transport to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SglKind {
    /// No data transfer (length 0; type byte ignored).
    None,
    /// In-capsule data: `length` bytes at `offset` in the capsule's data.
    InCapsule {
        /// Offset into the in-capsule data.
        offset: u64,
        /// Length in bytes.
        length: u32,
    },
    /// Data moved by the transport (R2T/H2CData for writes, C2HData for reads).
    Transport {
        /// Length in bytes.
        length: u32,
    },
}

impl SglDescriptor {
    /// The descriptor for `length` bytes of in-capsule data at `offset`.
    #[must_use]
    pub const fn in_capsule(offset: u64, length: u32) -> Self {
        SglDescriptor {
            address: offset,
            length,
            sgl_type: SGL_DATA_BLOCK_OFFSET,
        }
    }

    /// The descriptor for `length` bytes moved by the transport. This is also what Linux
    /// sends for commands without data (with length 0).
    #[must_use]
    pub const fn transport(length: u32) -> Self {
        SglDescriptor {
            address: 0,
            length,
            sgl_type: SGL_TRANSPORT_DATA_BLOCK,
        }
    }

    /// Decodes the 16 bytes at `b[0..16]`; the three reserved bytes are ignored.
    pub(crate) fn read(b: &[u8]) -> Self {
        SglDescriptor {
            address: get_u64(b, 0),
            length: get_u32(b, 8),
            sgl_type: b[15],
        }
    }

    /// Encodes into `b[0..16]`, zeroing the reserved bytes.
    pub(crate) fn write(&self, b: &mut [u8]) {
        put_u64(b, 0, self.address);
        put_u32(b, 8, self.length);
        b[12..15].fill(0);
        b[15] = self.sgl_type;
    }

    /// Classifies the descriptor for an NVMe/TCP controller.
    ///
    /// # Errors
    /// An SGL type other than Data Block/Offset (0x01) or Transport Data Block (0x5A), for
    /// example a keyed RDMA descriptor: [`WireError::InvalidField`] on SGL byte 15
    /// (SQE byte 39). Its [`WireError::status`] is Invalid Field in Command; a target that
    /// prefers the more specific [`Status::SGL_DESCRIPTOR_TYPE_INVALID`] can return that.
    pub fn kind(&self) -> Result<SglKind, WireError> {
        if self.length == 0 {
            return Ok(SglKind::None);
        }
        match self.sgl_type {
            SGL_DATA_BLOCK_OFFSET => Ok(SglKind::InCapsule {
                offset: self.address,
                length: self.length,
            }),
            SGL_TRANSPORT_DATA_BLOCK => Ok(SglKind::Transport {
                length: self.length,
            }),
            other => Err(invalid(
                "SQE",
                "SGL descriptor type",
                39,
                u64::from(other),
                "NVMe/TCP uses 0x01 (in-capsule) or 0x5a (transport data block)",
            )),
        }
    }
}

/// A submission queue entry, field for field (NVMe Base 2.0, Figure 88).
///
/// Fabrics commands overlay bytes 4..64 differently (FCTYPE in byte 4, parameters from byte
/// 40); [`super::fabrics`] reads them out of `nsid` and `cdw10..` so that one raw type serves
/// every command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Sqe {
    /// Opcode (byte 0).
    pub opcode: u8,
    /// Byte 1: FUSE in bits 1:0, PSDT in bits 7:6.
    pub flags: u8,
    /// Command identifier (bytes 3:2), echoed in the CQE.
    pub cid: u16,
    /// Namespace identifier (bytes 7:4).
    pub nsid: u32,
    /// Command Dword 2 (bytes 11:8).
    pub cdw2: u32,
    /// Command Dword 3 (bytes 15:12).
    pub cdw3: u32,
    /// Metadata pointer (bytes 23:16).
    pub mptr: u64,
    /// Data pointer: one SGL descriptor (bytes 39:24).
    pub dptr: SglDescriptor,
    /// Command Dword 10 (bytes 43:40).
    pub cdw10: u32,
    /// Command Dword 11 (bytes 47:44).
    pub cdw11: u32,
    /// Command Dword 12 (bytes 51:48).
    pub cdw12: u32,
    /// Command Dword 13 (bytes 55:52).
    pub cdw13: u32,
    /// Command Dword 14 (bytes 59:56).
    pub cdw14: u32,
    /// Command Dword 15 (bytes 63:60).
    pub cdw15: u32,
}

impl Sqe {
    /// An SQE with the given opcode and CID, PSDT set to SGL (as Fabrics requires) and every
    /// other field zero.
    #[must_use]
    pub fn new(opcode: u8, cid: u16) -> Self {
        Sqe {
            opcode,
            flags: PSDT_SGL_MPTR_CONTIGUOUS,
            cid,
            ..Sqe::default()
        }
    }

    /// Decodes 64 bytes. Infallible: every bit pattern is a raw SQE.
    #[must_use]
    pub fn from_bytes(b: &[u8; SQE_BYTES]) -> Self {
        Sqe {
            opcode: b[0],
            flags: b[1],
            cid: get_u16(b, 2),
            nsid: get_u32(b, 4),
            cdw2: get_u32(b, 8),
            cdw3: get_u32(b, 12),
            mptr: get_u64(b, 16),
            dptr: SglDescriptor::read(&b[24..40]),
            cdw10: get_u32(b, 40),
            cdw11: get_u32(b, 44),
            cdw12: get_u32(b, 48),
            cdw13: get_u32(b, 52),
            cdw14: get_u32(b, 56),
            cdw15: get_u32(b, 60),
        }
    }

    /// Encodes to 64 bytes.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; SQE_BYTES] {
        let mut b = [0u8; SQE_BYTES];
        b[0] = self.opcode;
        b[1] = self.flags;
        put_u16(&mut b, 2, self.cid);
        put_u32(&mut b, 4, self.nsid);
        put_u32(&mut b, 8, self.cdw2);
        put_u32(&mut b, 12, self.cdw3);
        put_u64(&mut b, 16, self.mptr);
        self.dptr.write(&mut b[24..40]);
        let dwords = [
            self.cdw10, self.cdw11, self.cdw12, self.cdw13, self.cdw14, self.cdw15,
        ];
        for (i, dw) in dwords.iter().enumerate() {
            put_u32(&mut b, 40 + 4 * i, *dw);
        }
        b
    }

    /// PSDT (byte 1 bits 7:6).
    #[must_use]
    pub fn psdt(&self) -> u8 {
        self.flags >> 6
    }

    /// Checks what every Fabrics controller must check first: PSDT says SGL (01b or 10b)
    /// and the command is not fused (FUSE, byte 1 bits 1:0, is 00b).
    ///
    /// # Errors
    /// [`WireError::InvalidField`] on byte 1.
    pub fn check_fabrics_flags(&self) -> Result<(), WireError> {
        if !matches!(self.psdt(), 0b01 | 0b10) {
            return Err(invalid(
                "SQE",
                "PSDT",
                1,
                u64::from(self.psdt()),
                "must be SGL",
            ));
        }
        if self.flags & 0x3 != 0 {
            return Err(invalid(
                "SQE",
                "FUSE",
                1,
                u64::from(self.flags & 3),
                "not supported",
            ));
        }
        Ok(())
    }
}

/// A completion queue entry (NVMe Base 2.0, Figure 89).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cqe {
    /// Dword 0: command-specific result (for example the Connect controller ID).
    pub dw0: u32,
    /// Dword 1: command-specific.
    pub dw1: u32,
    /// SQ head pointer (bytes 9:8); over Fabrics it still reports SQ progress unless SQ flow
    /// control is disabled.
    pub sqhd: u16,
    /// SQ identifier (bytes 11:10).
    pub sqid: u16,
    /// The CID of the command this completes (bytes 13:12).
    pub cid: u16,
    /// Phase tag (byte 14 bit 0): meaningless over Fabrics, kept for round trips.
    pub phase: bool,
    /// Completion status.
    pub status: Status,
}

impl Cqe {
    /// A CQE for `cid` with the given status and every other field zero.
    #[must_use]
    pub fn new(cid: u16, status: Status) -> Self {
        Cqe {
            dw0: 0,
            dw1: 0,
            sqhd: 0,
            sqid: 0,
            cid,
            phase: false,
            status,
        }
    }

    /// Decodes 16 bytes. Infallible: every bit pattern is a CQE.
    #[must_use]
    pub fn from_bytes(b: &[u8; CQE_BYTES]) -> Self {
        let word = get_u16(b, 14);
        Cqe {
            dw0: get_u32(b, 0),
            dw1: get_u32(b, 4),
            sqhd: get_u16(b, 8),
            sqid: get_u16(b, 10),
            cid: get_u16(b, 12),
            phase: word & 1 != 0,
            status: Status::from_cqe_word(word),
        }
    }

    /// Encodes to 16 bytes.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; CQE_BYTES] {
        let mut b = [0u8; CQE_BYTES];
        put_u32(&mut b, 0, self.dw0);
        put_u32(&mut b, 4, self.dw1);
        put_u16(&mut b, 8, self.sqhd);
        put_u16(&mut b, 10, self.sqid);
        put_u16(&mut b, 12, self.cid);
        put_u16(&mut b, 14, self.status.to_cqe_word(self.phase));
        b
    }
}

/// Which queue a command arrived on; opcodes mean different things on each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueKind {
    /// The admin queue (QID 0).
    Admin,
    /// An I/O queue (QID 1 and up).
    Io,
}

/// A typed command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// An admin command.
    Admin(AdminCommand),
    /// An NVM I/O command.
    Io(IoCommand),
    /// A Fabrics command (opcode 0x7F), valid on both queue kinds.
    Fabrics(FabricsCommand),
}

impl Command {
    /// Parses an SQE that arrived on a queue of kind `queue`.
    ///
    /// Only the command's own fields are checked here; whether it is allowed in the current
    /// controller state (for example anything before Connect) is the target's business.
    ///
    /// # Errors
    /// [`WireError`] naming the field; its [`WireError::status`] is the status to return.
    pub fn parse(sqe: &Sqe, queue: QueueKind) -> Result<Command, WireError> {
        if sqe.opcode == FABRICS_OPCODE {
            return FabricsCommand::parse(sqe).map(Command::Fabrics);
        }
        match queue {
            QueueKind::Admin => AdminCommand::parse(sqe).map(Command::Admin),
            QueueKind::Io => IoCommand::parse(sqe).map(Command::Io),
        }
    }

    /// Builds the SQE for this command with the given CID. The data pointer is left zero:
    /// the transport fills it in, because only it knows whether data goes in-capsule.
    #[must_use]
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        match self {
            Command::Admin(c) => c.to_sqe(cid),
            Command::Io(c) => c.to_sqe(cid),
            Command::Fabrics(c) => c.to_sqe(cid),
        }
    }
}

/// Admin commands a Fabrics controller implements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminCommand {
    /// Get Log Page.
    GetLogPage(GetLogPage),
    /// Identify.
    Identify(Identify),
    /// Abort.
    Abort(Abort),
    /// Set Features.
    SetFeatures(SetFeatures),
    /// Get Features.
    GetFeatures(GetFeatures),
    /// Asynchronous Event Request (completes only when an event happens).
    AsyncEventRequest,
    /// Keep Alive.
    KeepAlive,
}

impl AdminCommand {
    /// Parses an admin SQE (opcode other than 0x7F).
    ///
    /// # Errors
    /// [`WireError::InvalidOpcode`] for opcodes this crate does not implement, including the
    /// queue create/delete commands that do not exist over Fabrics.
    pub fn parse(sqe: &Sqe) -> Result<Self, WireError> {
        use admin_opcode as op;
        Ok(match sqe.opcode {
            op::GET_LOG_PAGE => AdminCommand::GetLogPage(GetLogPage::parse(sqe)),
            op::IDENTIFY => AdminCommand::Identify(Identify::parse(sqe)),
            op::ABORT => AdminCommand::Abort(Abort::parse(sqe)),
            op::SET_FEATURES => AdminCommand::SetFeatures(SetFeatures::parse(sqe)),
            op::GET_FEATURES => AdminCommand::GetFeatures(GetFeatures::parse(sqe)?),
            op::ASYNC_EVENT_REQUEST => AdminCommand::AsyncEventRequest,
            op::KEEP_ALIVE => AdminCommand::KeepAlive,
            opcode => {
                return Err(WireError::InvalidOpcode {
                    what: "opcode",
                    opcode,
                    queue: "admin",
                })
            }
        })
    }

    /// Builds the SQE with the given CID (data pointer zero).
    #[must_use]
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        match self {
            AdminCommand::GetLogPage(c) => c.to_sqe(cid),
            AdminCommand::Identify(c) => c.to_sqe(cid),
            AdminCommand::Abort(c) => c.to_sqe(cid),
            AdminCommand::SetFeatures(c) => c.to_sqe(cid),
            AdminCommand::GetFeatures(c) => c.to_sqe(cid),
            AdminCommand::AsyncEventRequest => Sqe::new(admin_opcode::ASYNC_EVENT_REQUEST, cid),
            AdminCommand::KeepAlive => Sqe::new(admin_opcode::KEEP_ALIVE, cid),
        }
    }
}

/// NVM I/O commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IoCommand {
    /// Flush the volatile write cache of namespace `nsid` (0xFFFFFFFF: all namespaces).
    Flush {
        /// Namespace.
        nsid: u32,
    },
    /// Write.
    Write(ReadWrite),
    /// Read.
    Read(ReadWrite),
    /// Write Zeroes.
    WriteZeroes(WriteZeroes),
    /// Dataset Management.
    DatasetManagement(DatasetManagement),
    /// Reservation Register.
    ReservationRegister(ReservationRegister),
    /// Reservation Report.
    ReservationReport(ReservationReport),
    /// Reservation Acquire.
    ReservationAcquire(ReservationAcquire),
    /// Reservation Release.
    ReservationRelease(ReservationRelease),
}

impl IoCommand {
    /// Parses an I/O SQE (opcode other than 0x7F).
    ///
    /// # Errors
    /// [`WireError`] for unknown opcodes and invalid fields.
    pub fn parse(sqe: &Sqe) -> Result<Self, WireError> {
        use io_opcode as op;
        Ok(match sqe.opcode {
            op::FLUSH => IoCommand::Flush { nsid: sqe.nsid },
            op::WRITE => IoCommand::Write(ReadWrite::parse(sqe)),
            op::READ => IoCommand::Read(ReadWrite::parse(sqe)),
            op::WRITE_ZEROES => IoCommand::WriteZeroes(WriteZeroes::parse(sqe)),
            op::DATASET_MANAGEMENT => IoCommand::DatasetManagement(DatasetManagement::parse(sqe)),
            op::RESERVATION_REGISTER => {
                IoCommand::ReservationRegister(ReservationRegister::parse(sqe)?)
            }
            op::RESERVATION_REPORT => IoCommand::ReservationReport(ReservationReport::parse(sqe)),
            op::RESERVATION_ACQUIRE => {
                IoCommand::ReservationAcquire(ReservationAcquire::parse(sqe)?)
            }
            op::RESERVATION_RELEASE => {
                IoCommand::ReservationRelease(ReservationRelease::parse(sqe)?)
            }
            opcode => {
                return Err(WireError::InvalidOpcode {
                    what: "opcode",
                    opcode,
                    queue: "I/O",
                })
            }
        })
    }

    /// Builds the SQE with the given CID (data pointer zero).
    #[must_use]
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        match self {
            IoCommand::Flush { nsid } => Sqe {
                nsid: *nsid,
                ..Sqe::new(io_opcode::FLUSH, cid)
            },
            IoCommand::Write(c) => c.to_sqe(io_opcode::WRITE, cid),
            IoCommand::Read(c) => c.to_sqe(io_opcode::READ, cid),
            IoCommand::WriteZeroes(c) => c.to_sqe(cid),
            IoCommand::DatasetManagement(c) => c.to_sqe(cid),
            IoCommand::ReservationRegister(c) => c.to_sqe(cid),
            IoCommand::ReservationReport(c) => c.to_sqe(cid),
            IoCommand::ReservationAcquire(c) => c.to_sqe(cid),
            IoCommand::ReservationRelease(c) => c.to_sqe(cid),
        }
    }
}

/// CDW12 bit 30: Force Unit Access (the data is on stable media before completion).
const CDW12_FUA: u32 = 1 << 30;
/// CDW12 bit 25 of Write Zeroes: Deallocate.
const CDW12_DEAC: u32 = 1 << 25;

/// Read or Write: `nlb + 1` logical blocks starting at `slba`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadWrite {
    /// Namespace.
    pub nsid: u32,
    /// Starting LBA (CDW10-11).
    pub slba: u64,
    /// Number of logical blocks, 0's based (CDW12 bits 15:0): 0 means one block.
    pub nlb: u16,
    /// Force Unit Access (CDW12 bit 30).
    pub fua: bool,
}

impl ReadWrite {
    /// A command for `blocks` blocks (1..=65536) at `slba`.
    ///
    /// # Errors
    /// [`WireError::InvalidField`] when `blocks` is 0 or above 65536.
    pub fn new(nsid: u32, slba: u64, blocks: u32, fua: bool) -> Result<Self, WireError> {
        let nlb = zero_based_u16("Read/Write", "NLB", 48, blocks)?;
        Ok(ReadWrite {
            nsid,
            slba,
            nlb,
            fua,
        })
    }

    /// Number of blocks (1..=65536).
    #[must_use]
    pub fn blocks(&self) -> u32 {
        u32::from(self.nlb) + 1
    }

    fn parse(sqe: &Sqe) -> Self {
        ReadWrite {
            nsid: sqe.nsid,
            slba: u64::from(sqe.cdw10) | (u64::from(sqe.cdw11) << 32),
            nlb: (sqe.cdw12 & 0xffff) as u16,
            fua: sqe.cdw12 & CDW12_FUA != 0,
        }
    }

    /// Builds the SQE for `opcode` ([`io_opcode::READ`] or [`io_opcode::WRITE`]).
    #[must_use]
    pub fn to_sqe(&self, opcode: u8, cid: u16) -> Sqe {
        Sqe {
            nsid: self.nsid,
            cdw10: self.slba as u32,
            cdw11: (self.slba >> 32) as u32,
            cdw12: u32::from(self.nlb) | if self.fua { CDW12_FUA } else { 0 },
            ..Sqe::new(opcode, cid)
        }
    }
}

/// Write Zeroes: `nlb + 1` blocks at `slba` read back as zero afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteZeroes {
    /// Namespace.
    pub nsid: u32,
    /// Starting LBA.
    pub slba: u64,
    /// Number of logical blocks, 0's based.
    pub nlb: u16,
    /// Force Unit Access.
    pub fua: bool,
    /// Deallocate (CDW12 bit 25): the blocks may also be unmapped.
    pub deallocate: bool,
}

impl WriteZeroes {
    /// Number of blocks (1..=65536).
    #[must_use]
    pub fn blocks(&self) -> u32 {
        u32::from(self.nlb) + 1
    }

    fn parse(sqe: &Sqe) -> Self {
        let rw = ReadWrite::parse(sqe);
        WriteZeroes {
            nsid: rw.nsid,
            slba: rw.slba,
            nlb: rw.nlb,
            fua: rw.fua,
            deallocate: sqe.cdw12 & CDW12_DEAC != 0,
        }
    }

    /// Builds the SQE.
    #[must_use]
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let rw = ReadWrite {
            nsid: self.nsid,
            slba: self.slba,
            nlb: self.nlb,
            fua: self.fua,
        };
        let mut sqe = rw.to_sqe(io_opcode::WRITE_ZEROES, cid);
        if self.deallocate {
            sqe.cdw12 |= CDW12_DEAC;
        }
        sqe
    }
}

/// Dataset Management: attributes for a list of LBA ranges sent as data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatasetManagement {
    /// Namespace.
    pub nsid: u32,
    /// Number of ranges, 0's based (CDW10 bits 7:0): the data holds `nr + 1` ranges.
    pub nr: u8,
    /// Integral Dataset for Read (CDW11 bit 0).
    pub idr: bool,
    /// Integral Dataset for Write (CDW11 bit 1).
    pub idw: bool,
    /// Deallocate (CDW11 bit 2): unmap the ranges.
    pub deallocate: bool,
}

impl DatasetManagement {
    /// Number of ranges in the data (1..=256).
    #[must_use]
    pub fn range_count(&self) -> usize {
        usize::from(self.nr) + 1
    }

    /// Bytes of range data the command carries.
    #[must_use]
    pub fn data_len(&self) -> usize {
        self.range_count() * DSM_RANGE_BYTES
    }

    fn parse(sqe: &Sqe) -> Self {
        DatasetManagement {
            nsid: sqe.nsid,
            nr: (sqe.cdw10 & 0xff) as u8,
            idr: sqe.cdw11 & 1 != 0,
            idw: sqe.cdw11 & 2 != 0,
            deallocate: sqe.cdw11 & 4 != 0,
        }
    }

    /// Builds the SQE.
    #[must_use]
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let cdw11 =
            u32::from(self.idr) | u32::from(self.idw) << 1 | u32::from(self.deallocate) << 2;
        Sqe {
            nsid: self.nsid,
            cdw10: u32::from(self.nr),
            cdw11,
            ..Sqe::new(io_opcode::DATASET_MANAGEMENT, cid)
        }
    }
}

/// Size of one Dataset Management range.
pub const DSM_RANGE_BYTES: usize = 16;
/// Most ranges one Dataset Management command carries.
pub const DSM_RANGES_MAX: usize = 256;

/// One Dataset Management range (NVM Command Set 1.0, Figure 39).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DsmRange {
    /// Context attributes (bytes 3:0).
    pub context_attributes: u32,
    /// Length in logical blocks (bytes 7:4); not 0's based.
    pub nlb: u32,
    /// Starting LBA (bytes 15:8).
    pub slba: u64,
}

impl DsmRange {
    /// Encodes ranges as command data. At most [`DSM_RANGES_MAX`] are encoded.
    #[must_use]
    pub fn encode_list(ranges: &[DsmRange]) -> Vec<u8> {
        let ranges = &ranges[..ranges.len().min(DSM_RANGES_MAX)];
        let mut out = vec![0u8; ranges.len() * DSM_RANGE_BYTES];
        for (r, chunk) in ranges.iter().zip(out.chunks_exact_mut(DSM_RANGE_BYTES)) {
            put_u32(chunk, 0, r.context_attributes);
            put_u32(chunk, 4, r.nlb);
            put_u64(chunk, 8, r.slba);
        }
        out
    }

    /// Decodes `count` ranges (1..=256) from command data.
    ///
    /// # Errors
    /// [`WireError::Short`] when `data` holds fewer than `count` ranges, and
    /// [`WireError::InvalidField`] when `count` is out of range.
    pub fn decode_list(data: &[u8], count: usize) -> Result<Vec<DsmRange>, WireError> {
        if count == 0 || count > DSM_RANGES_MAX {
            let value = count as u64;
            return Err(invalid(
                "Dataset Management",
                "NR",
                40,
                value,
                "1..=256 ranges",
            ));
        }
        need("Dataset Management ranges", data, count * DSM_RANGE_BYTES)?;
        let ranges = data.chunks_exact(DSM_RANGE_BYTES).take(count);
        Ok(ranges
            .map(|c| DsmRange {
                context_attributes: get_u32(c, 0),
                nlb: get_u32(c, 4),
                slba: get_u64(c, 8),
            })
            .collect())
    }
}

/// Identify CNS values (NVMe Base 2.0, Figure 274).
pub mod cns {
    /// Identify Namespace for NSID.
    pub const NAMESPACE: u8 = 0x00;
    /// Identify Controller.
    pub const CONTROLLER: u8 = 0x01;
    /// Active Namespace ID list (NSIDs greater than the command's NSID).
    pub const ACTIVE_NAMESPACES: u8 = 0x02;
    /// Namespace Identification Descriptor list for NSID.
    pub const NS_ID_DESCRIPTORS: u8 = 0x03;
}

/// Identify: returns a 4096-byte data structure selected by CNS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identify {
    /// Namespace (meaning depends on CNS).
    pub nsid: u32,
    /// Controller or Namespace Structure (CDW10 bits 7:0), see [`cns`].
    pub cns: u8,
    /// Controller identifier (CDW10 bits 31:16), used by some CNS values.
    pub cntid: u16,
    /// Command Set Identifier (CDW11 bits 31:24).
    pub csi: u8,
}

impl Identify {
    fn parse(sqe: &Sqe) -> Self {
        Identify {
            nsid: sqe.nsid,
            cns: (sqe.cdw10 & 0xff) as u8,
            cntid: (sqe.cdw10 >> 16) as u16,
            csi: (sqe.cdw11 >> 24) as u8,
        }
    }

    /// Builds the SQE.
    #[must_use]
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        Sqe {
            nsid: self.nsid,
            cdw10: u32::from(self.cns) | u32::from(self.cntid) << 16,
            cdw11: u32::from(self.csi) << 24,
            ..Sqe::new(admin_opcode::IDENTIFY, cid)
        }
    }
}

/// Get Log Page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetLogPage {
    /// Namespace (0xFFFFFFFF: controller-wide).
    pub nsid: u32,
    /// Log page identifier (CDW10 bits 7:0), see [`super::log::lid`].
    pub lid: u8,
    /// Log specific field (CDW10 bits 14:8).
    pub lsp: u8,
    /// Retain Asynchronous Event (CDW10 bit 15).
    pub rae: bool,
    /// Number of dwords to return, 0's based (NUMDL in CDW10 bits 31:16, NUMDU in CDW11
    /// bits 15:0).
    pub numd: u32,
    /// Log specific identifier (CDW11 bits 31:16).
    pub lsi: u16,
    /// Byte offset into the log page (CDW12-13), a multiple of 4.
    pub offset: u64,
}

impl GetLogPage {
    /// A request for `len_bytes` bytes (a non-zero multiple of 4) of log `lid` at `offset`.
    ///
    /// # Errors
    /// [`WireError::InvalidField`] for a length that is 0, not a multiple of 4, or above
    /// 16 GiB.
    pub fn new(nsid: u32, lid: u8, offset: u64, len_bytes: u64) -> Result<Self, WireError> {
        let dwords = len_bytes / 4;
        if !len_bytes.is_multiple_of(4) || dwords == 0 || dwords > 1 << 32 {
            return Err(invalid(
                "Get Log Page",
                "NUMD",
                42,
                len_bytes,
                "1..=2^32 dwords",
            ));
        }
        let numd = (dwords - 1) as u32;
        Ok(GetLogPage {
            nsid,
            lid,
            lsp: 0,
            rae: false,
            numd,
            lsi: 0,
            offset,
        })
    }

    /// Number of bytes requested.
    #[must_use]
    pub fn len_bytes(&self) -> u64 {
        (u64::from(self.numd) + 1) * 4
    }

    fn parse(sqe: &Sqe) -> Self {
        GetLogPage {
            nsid: sqe.nsid,
            lid: (sqe.cdw10 & 0xff) as u8,
            lsp: ((sqe.cdw10 >> 8) & 0x7f) as u8,
            rae: sqe.cdw10 & (1 << 15) != 0,
            numd: (sqe.cdw10 >> 16) | ((sqe.cdw11 & 0xffff) << 16),
            lsi: (sqe.cdw11 >> 16) as u16,
            offset: u64::from(sqe.cdw12) | (u64::from(sqe.cdw13) << 32),
        }
    }

    /// Builds the SQE.
    #[must_use]
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let cdw10 = u32::from(self.lid)
            | u32::from(self.lsp & 0x7f) << 8
            | u32::from(self.rae) << 15
            | (self.numd & 0xffff) << 16;
        Sqe {
            nsid: self.nsid,
            cdw10,
            cdw11: (self.numd >> 16) | u32::from(self.lsi) << 16,
            cdw12: self.offset as u32,
            cdw13: (self.offset >> 32) as u32,
            ..Sqe::new(admin_opcode::GET_LOG_PAGE, cid)
        }
    }
}

/// Feature identifiers (NVMe Base 2.0, Figure 317).
pub mod fid {
    /// Volatile Write Cache: CDW11 bit 0 WCE.
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    /// Number of Queues: CDW11 NSQR bits 15:0, NCQR bits 31:16, both 0's based.
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    /// Asynchronous Event Configuration: CDW11 is a bit mask of events to report.
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0b;
    /// Keep Alive Timer: CDW11 is KATO in milliseconds.
    pub const KEEP_ALIVE_TIMER: u8 = 0x0f;
    /// Reservation Persistence (namespace specific): CDW11 bit 0 PTPL.
    pub const RESERVATION_PERSISTENCE: u8 = 0x83;
}

/// A feature value, typed for the features a Fabrics target needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// Volatile Write Cache enabled.
    VolatileWriteCache {
        /// WCE.
        enable: bool,
    },
    /// Number of I/O queues, 0's based (the value 0xFFFF is invalid).
    NumberOfQueues {
        /// Number of I/O submission queues requested or allocated, 0's based.
        nsqr: u16,
        /// Number of I/O completion queues requested or allocated, 0's based.
        ncqr: u16,
    },
    /// Asynchronous Event Configuration bit mask.
    AsyncEventConfig(u32),
    /// Keep Alive Timeout in milliseconds.
    KeepAliveTimer {
        /// KATO in milliseconds.
        kato_ms: u32,
    },
    /// Reservation Persistence: reservations persist through power loss.
    ReservationPersistence {
        /// PTPL.
        ptpl: bool,
    },
    /// Any other feature, raw.
    Other {
        /// Feature identifier.
        fid: u8,
        /// CDW11.
        cdw11: u32,
    },
}

impl Feature {
    /// Interprets CDW11 (Set Features) or Dword 0 of a completion (Get/Set Features) for
    /// feature `fid`; the two share a layout for every feature typed here.
    #[must_use]
    pub fn from_dword(fid: u8, dw: u32) -> Self {
        match fid {
            fid::VOLATILE_WRITE_CACHE => Feature::VolatileWriteCache {
                enable: dw & 1 != 0,
            },
            fid::NUMBER_OF_QUEUES => Feature::NumberOfQueues {
                nsqr: (dw & 0xffff) as u16,
                ncqr: (dw >> 16) as u16,
            },
            fid::ASYNC_EVENT_CONFIG => Feature::AsyncEventConfig(dw),
            fid::KEEP_ALIVE_TIMER => Feature::KeepAliveTimer { kato_ms: dw },
            fid::RESERVATION_PERSISTENCE => Feature::ReservationPersistence { ptpl: dw & 1 != 0 },
            fid => Feature::Other { fid, cdw11: dw },
        }
    }

    /// The feature identifier.
    #[must_use]
    pub fn fid(&self) -> u8 {
        match self {
            Feature::VolatileWriteCache { .. } => fid::VOLATILE_WRITE_CACHE,
            Feature::NumberOfQueues { .. } => fid::NUMBER_OF_QUEUES,
            Feature::AsyncEventConfig(_) => fid::ASYNC_EVENT_CONFIG,
            Feature::KeepAliveTimer { .. } => fid::KEEP_ALIVE_TIMER,
            Feature::ReservationPersistence { .. } => fid::RESERVATION_PERSISTENCE,
            Feature::Other { fid, .. } => *fid,
        }
    }

    /// The CDW11 / completion Dword 0 encoding.
    #[must_use]
    pub fn to_dword(&self) -> u32 {
        match *self {
            Feature::VolatileWriteCache { enable } => u32::from(enable),
            Feature::NumberOfQueues { nsqr, ncqr } => u32::from(nsqr) | u32::from(ncqr) << 16,
            Feature::AsyncEventConfig(mask) => mask,
            Feature::KeepAliveTimer { kato_ms } => kato_ms,
            Feature::ReservationPersistence { ptpl } => u32::from(ptpl),
            Feature::Other { cdw11, .. } => cdw11,
        }
    }
}

/// Set Features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetFeatures {
    /// Namespace, for namespace-specific features.
    pub nsid: u32,
    /// Save across resets (CDW10 bit 31).
    pub save: bool,
    /// The feature and its new value.
    pub feature: Feature,
}

impl SetFeatures {
    fn parse(sqe: &Sqe) -> Self {
        let fid = (sqe.cdw10 & 0xff) as u8;
        SetFeatures {
            nsid: sqe.nsid,
            save: sqe.cdw10 & (1 << 31) != 0,
            feature: Feature::from_dword(fid, sqe.cdw11),
        }
    }

    /// Builds the SQE.
    #[must_use]
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        Sqe {
            nsid: self.nsid,
            cdw10: u32::from(self.feature.fid()) | u32::from(self.save) << 31,
            cdw11: self.feature.to_dword(),
            ..Sqe::new(admin_opcode::SET_FEATURES, cid)
        }
    }
}

/// Get Features' Select field (CDW10 bits 10:8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeatureSelect {
    /// The value in use.
    Current,
    /// The default value.
    Default,
    /// The saved value.
    Saved,
    /// Whether the feature is saveable, namespace specific, changeable.
    SupportedCapabilities,
}

/// Get Features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetFeatures {
    /// Namespace, for namespace-specific features.
    pub nsid: u32,
    /// Feature identifier (CDW10 bits 7:0).
    pub fid: u8,
    /// Which value to return.
    pub select: FeatureSelect,
    /// CDW11, feature specific.
    pub cdw11: u32,
}

impl GetFeatures {
    fn parse(sqe: &Sqe) -> Result<Self, WireError> {
        let select = match (sqe.cdw10 >> 8) & 0x7 {
            0 => FeatureSelect::Current,
            1 => FeatureSelect::Default,
            2 => FeatureSelect::Saved,
            3 => FeatureSelect::SupportedCapabilities,
            sel => {
                return Err(invalid("Get Features", "SEL", 41, u64::from(sel), "0..=3"));
            }
        };
        Ok(GetFeatures {
            nsid: sqe.nsid,
            fid: (sqe.cdw10 & 0xff) as u8,
            select,
            cdw11: sqe.cdw11,
        })
    }

    /// Builds the SQE.
    #[must_use]
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let sel = self.select as u32;
        Sqe {
            nsid: self.nsid,
            cdw10: u32::from(self.fid) | sel << 8,
            cdw11: self.cdw11,
            ..Sqe::new(admin_opcode::GET_FEATURES, cid)
        }
    }
}

/// Abort: asks the controller to abort command `cid` of submission queue `sqid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Abort {
    /// Submission queue of the command to abort (CDW10 bits 15:0).
    pub sqid: u16,
    /// CID of the command to abort (CDW10 bits 31:16).
    pub cid: u16,
}

impl Abort {
    fn parse(sqe: &Sqe) -> Self {
        Abort {
            sqid: (sqe.cdw10 & 0xffff) as u16,
            cid: (sqe.cdw10 >> 16) as u16,
        }
    }

    /// Builds the SQE (with `cid` the Abort command's own CID).
    #[must_use]
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let cdw10 = u32::from(self.sqid) | u32::from(self.cid) << 16;
        Sqe {
            cdw10,
            ..Sqe::new(admin_opcode::ABORT, cid)
        }
    }
}

/// Converts a 1-based count to the 0's based u16 NVMe fields use, naming the field on error.
pub(crate) fn zero_based_u16(
    structure: &'static str,
    field: &'static str,
    offset: usize,
    count: u32,
) -> Result<u16, WireError> {
    if count == 0 || count > 1 << 16 {
        return Err(invalid(
            structure,
            field,
            offset,
            u64::from(count),
            "1..=65536",
        ));
    }
    Ok((count - 1) as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqe_layout_is_field_for_field() {
        let sqe = Sqe {
            opcode: 0x02,
            flags: 0x40,
            cid: 0x1234,
            nsid: 1,
            cdw2: 0,
            cdw3: 0,
            mptr: 0,
            dptr: SglDescriptor::transport(4096),
            cdw10: 0x89ab_cdef,
            cdw11: 0x0123_4567,
            cdw12: 7 | CDW12_FUA,
            cdw13: 0,
            cdw14: 0,
            cdw15: 0xdead_beef,
        };
        let b = sqe.to_bytes();
        assert_eq!(&b[0..8], &[0x02, 0x40, 0x34, 0x12, 1, 0, 0, 0]);
        assert_eq!(
            &b[24..40],
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0x5a]
        );
        assert_eq!(
            &b[40..52],
            &[0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01, 7, 0, 0, 0x40]
        );
        assert_eq!(&b[60..64], &[0xef, 0xbe, 0xad, 0xde]);
        assert_eq!(Sqe::from_bytes(&b), sqe);
        let Ok(Command::Io(IoCommand::Read(rw))) = Command::parse(&sqe, QueueKind::Io) else {
            panic!("not a read");
        };
        assert_eq!(
            (rw.slba, rw.blocks(), rw.fua),
            (0x0123_4567_89ab_cdef, 8, true)
        );
    }

    #[test]
    fn cqe_layout() {
        let mut cqe = Cqe::new(0xbeef, Status::LBA_OUT_OF_RANGE.with_dnr(true));
        cqe.sqid = 3;
        cqe.sqhd = 9;
        cqe.dw0 = 0x11;
        let b = cqe.to_bytes();
        assert_eq!(
            b,
            [0x11, 0, 0, 0, 0, 0, 0, 0, 9, 0, 3, 0, 0xef, 0xbe, 0x00, 0x81]
        );
        assert_eq!(Cqe::from_bytes(&b), cqe);
    }

    #[test]
    fn get_log_page_numd_split() {
        let glp = GetLogPage::new(0xffff_ffff, 0x70, 0, 4 << 18).unwrap();
        let sqe = glp.to_sqe(1);
        let numd = (4u32 << 18) / 4 - 1;
        assert_eq!(sqe.cdw10, 0x70 | (numd & 0xffff) << 16);
        assert_eq!(sqe.cdw11, numd >> 16);
        let Ok(AdminCommand::GetLogPage(back)) = AdminCommand::parse(&sqe) else {
            panic!()
        };
        assert_eq!(back, glp);
        assert!(GetLogPage::new(1, 2, 0, 6).is_err());
    }

    #[test]
    fn sgl_kinds() {
        assert_eq!(
            SglDescriptor::in_capsule(0, 512).kind(),
            Ok(SglKind::InCapsule {
                offset: 0,
                length: 512
            })
        );
        assert_eq!(SglDescriptor::transport(0).kind(), Ok(SglKind::None));
        let keyed = SglDescriptor {
            address: 1,
            length: 8,
            sgl_type: 0x40,
        };
        assert_eq!(
            keyed.kind().unwrap_err().status(),
            Status::INVALID_FIELD.with_dnr(true)
        );
    }
}
