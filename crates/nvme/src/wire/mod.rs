//! The NVMe/TCP and NVMe over Fabrics wire format: everything that crosses the socket,
//! byte for byte, and nothing about connection state.
//!
//! # Layout of a connection
//!
//! A TCP connection carries one queue (the admin queue or one I/O queue) as a stream of
//! PDUs ([`pdu`]). The host opens with ICReq, the controller answers ICResp; from then on the
//! negotiated digests and alignment apply ([`DigestConfig::after_handshake`]). Commands
//! travel as CapsuleCmd PDUs holding a 64-byte SQE ([`Sqe`]) and possibly in-capsule data;
//! results come back as CapsuleResp PDUs holding a 16-byte CQE ([`Cqe`]). Read data comes as
//! C2HData; write data not sent in the capsule is pulled by the controller with R2T and
//! sent as H2CData. A fatal error ends the connection with a TermReq.
//!
//! # Where each specification structure lives
//!
//! * [`pdu`]: common header, ICReq, ICResp, TermReq, CapsuleCmd, CapsuleResp, H2CData,
//!   C2HData, R2T, digests, data alignment, and the encoder (NVMe TCP Transport 1.0, ch. 3).
//! * [`pdu_reader`]: the validating PDU decoder (same chapter).
//! * [`pdu_error`]: decode errors and the FES / FEI of the TermReq each one calls for.
//! * [`command`]: SQE, CQE, SGL descriptors, opcodes, admin and NVM I/O commands, Dataset
//!   Management ranges (NVMe Base 2.0 ch. 3-5; NVM Command Set 1.0 ch. 3).
//! * [`status`]: completion status: SCT, SC, CRD, More, DNR (NVMe Base 2.0 4.6.1).
//! * [`fabrics`]: Connect, Connect data, Disconnect, Property Get/Set, and the CAP, VS, CC,
//!   CSTS properties (NVMe-oF 1.1 ch. 3; NVMe Base 2.0 3.1).
//! * [`reservation`]: Reservation Register, Acquire, Release, Report and the Reservation
//!   Status data (NVMe Base 2.0 8.19; NVM Command Set 1.0 3.2).
//! * [`identify`]: Identify Controller, Identify Namespace, the active NSID list and the
//!   Namespace Identification Descriptor list (NVMe Base 2.0 5.17.2; NVM Command Set 1.0
//!   4.1.5).
//! * [`log`]: the Discovery, ANA and SMART / Health log pages (NVMe-oF 1.1 5.3; NVMe Base
//!   2.0 5.16.1).
//! * [`text`]: space-padded ASCII fields and NQNs (NVMe Base 2.0 4.5).
//! * [`error`]: [`WireError`], the error of every decoder outside PDU framing.
//!
//! # Conventions
//!
//! All multi-byte fields are little endian. Raw types ([`Sqe`], [`Cqe`], [`PduHeader`])
//! decode any bit pattern so that a target can always name the command it rejects; typed
//! views ([`Command`], the data structures) validate and return [`WireError`] (or
//! [`PduError`] for PDU framing) naming the structure, field, byte offset and value. Every
//! length read from the wire is checked against the bytes present or the configured maximum
//! before anything is allocated. Decoders never panic on any input; [`fuzz_decode`] drives
//! all of them from arbitrary bytes.

pub mod command;
pub mod error;
pub mod fabrics;
pub mod identify;
pub mod log;
pub mod pdu;
pub mod pdu_error;
pub mod pdu_reader;
pub mod reservation;
pub mod status;
pub mod text;

mod bytes;
mod fuzz;

pub use command::{Command, Cqe, QueueKind, SglDescriptor, Sqe};
pub use error::WireError;
pub use fuzz::{fuzz_decode, fuzz_reader, FUZZ_MAX_PDU_BYTES};
pub use pdu::{
    encode_header, encode_pdu, write_pdu, DataHeader, DigestConfig, EncodeError, Fes, IcReq,
    IcResp, Pdu, PduHeader, PduType, R2t, SessionDigests, Side, TermReq,
};
pub use pdu_error::{PduError, PduErrorKind};
pub use pdu_reader::{InboundPdu, PduReader};
pub use status::Status;
pub use text::{FixedAscii, Nqn, TextError};
