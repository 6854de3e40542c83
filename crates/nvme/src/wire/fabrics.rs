//! NVMe over Fabrics commands (NVMe-oF 1.1 chapter 3): Connect, Disconnect, Property Get and
//! Property Set, the 1024-byte Connect data, and the controller properties (CAP, VS, CC,
//! CSTS) that replace PCIe registers over Fabrics.
//!
//! A Fabrics command is an SQE with opcode 0x7F and the command type (FCTYPE) in byte 4, which
//! [`Sqe`] holds as the low byte of `nsid`; its parameters start at byte 40, i.e. in
//! `cdw10..`.

use super::bytes::{get_u16, put_u16};
use super::command::{zero_based_u16, Sqe, FABRICS_OPCODE};
use super::error::{invalid, need, WireError};
use super::text::Nqn;

/// Fabrics command types (FCTYPE, SQE byte 4).
pub mod fctype {
    /// Property Set.
    pub const PROPERTY_SET: u8 = 0x00;
    /// Connect.
    pub const CONNECT: u8 = 0x01;
    /// Property Get.
    pub const PROPERTY_GET: u8 = 0x04;
    /// Authentication Send (not implemented here).
    pub const AUTHENTICATION_SEND: u8 = 0x05;
    /// Authentication Receive (not implemented here).
    pub const AUTHENTICATION_RECEIVE: u8 = 0x06;
    /// Disconnect (I/O queues only).
    pub const DISCONNECT: u8 = 0x08;
}

/// A Fabrics command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FabricsCommand {
    /// Property Set.
    PropertySet(PropertySet),
    /// Connect: creates the admin queue (QID 0) or an I/O queue.
    Connect(Connect),
    /// Property Get.
    PropertyGet(PropertyGet),
    /// Disconnect: deletes the I/O queue it arrives on.
    Disconnect {
        /// Record format, 0.
        recfmt: u16,
    },
}

impl FabricsCommand {
    /// Parses an SQE with opcode 0x7F.
    ///
    /// # Errors
    /// [`WireError::InvalidOpcode`] for an unknown FCTYPE (targets return Invalid Command
    /// Opcode, as Linux does), [`WireError::InvalidField`] for bad parameters.
    pub fn parse(sqe: &Sqe) -> Result<Self, WireError> {
        if sqe.opcode != FABRICS_OPCODE {
            let opcode = sqe.opcode;
            return Err(WireError::InvalidOpcode {
                what: "opcode",
                opcode,
                queue: "Fabrics",
            });
        }
        let fctype = (sqe.nsid & 0xff) as u8;
        Ok(match fctype {
            fctype::PROPERTY_SET => FabricsCommand::PropertySet(PropertySet::parse(sqe)?),
            fctype::CONNECT => FabricsCommand::Connect(Connect::parse(sqe)),
            fctype::PROPERTY_GET => FabricsCommand::PropertyGet(PropertyGet::parse(sqe)?),
            fctype::DISCONNECT => FabricsCommand::Disconnect {
                recfmt: (sqe.cdw10 & 0xffff) as u16,
            },
            opcode => {
                return Err(WireError::InvalidOpcode {
                    what: "fctype",
                    opcode,
                    queue: "Fabrics",
                })
            }
        })
    }

    /// Builds the SQE with the given CID (data pointer zero; Connect's data pointer is set by
    /// the transport).
    #[must_use]
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        match self {
            FabricsCommand::PropertySet(c) => c.to_sqe(cid),
            FabricsCommand::Connect(c) => c.to_sqe(cid),
            FabricsCommand::PropertyGet(c) => c.to_sqe(cid),
            FabricsCommand::Disconnect { recfmt } => Sqe {
                cdw10: u32::from(*recfmt),
                ..fabrics_sqe(fctype::DISCONNECT, cid)
            },
        }
    }
}

fn fabrics_sqe(fctype: u8, cid: u16) -> Sqe {
    Sqe {
        nsid: u32::from(fctype),
        ..Sqe::new(FABRICS_OPCODE, cid)
    }
}

/// Connect (NVMe-oF 1.1, Figure 20): carries [`ConnectData`] as 1024 bytes of data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connect {
    /// Record format (byte 40), 0.
    pub recfmt: u16,
    /// Queue to create (byte 42): 0 for the admin queue.
    pub qid: u16,
    /// Submission queue size, 0's based (byte 44).
    pub sqsize: u16,
    /// Connect attributes (byte 46): bits 1:0 priority class, bit 2 disables SQ flow
    /// control.
    pub cattr: u8,
    /// Keep Alive Timeout in milliseconds (byte 48); admin queue only, 0 disables.
    pub kato_ms: u32,
}

/// CATTR bit 2: the host asks for SQ flow control to be disabled (SQHD not reported).
pub const CATTR_DISABLE_SQ_FLOW_CONTROL: u8 = 1 << 2;

impl Connect {
    /// A Connect for queue `qid` with `entries` submission queue entries (2..=65536).
    ///
    /// # Errors
    /// [`WireError::InvalidField`] for a queue size of 0 or 1 or above 65536.
    pub fn new(qid: u16, entries: u32, kato_ms: u32) -> Result<Self, WireError> {
        if entries < 2 {
            let value = u64::from(entries);
            return Err(invalid(
                "Connect",
                "SQSIZE",
                44,
                value,
                "at least 2 entries",
            ));
        }
        let sqsize = zero_based_u16("Connect", "SQSIZE", 44, entries)?;
        Ok(Connect {
            recfmt: 0,
            qid,
            sqsize,
            cattr: 0,
            kato_ms,
        })
    }

    /// Number of submission queue entries (`sqsize + 1`).
    #[must_use]
    pub fn queue_entries(&self) -> u32 {
        u32::from(self.sqsize) + 1
    }

    fn parse(sqe: &Sqe) -> Self {
        Connect {
            recfmt: (sqe.cdw10 & 0xffff) as u16,
            qid: (sqe.cdw10 >> 16) as u16,
            sqsize: (sqe.cdw11 & 0xffff) as u16,
            cattr: ((sqe.cdw11 >> 16) & 0xff) as u8,
            kato_ms: sqe.cdw12,
        }
    }

    /// Builds the SQE.
    #[must_use]
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        Sqe {
            cdw10: u32::from(self.recfmt) | u32::from(self.qid) << 16,
            cdw11: u32::from(self.sqsize) | u32::from(self.cattr) << 16,
            cdw12: self.kato_ms,
            ..fabrics_sqe(fctype::CONNECT, cid)
        }
    }
}

/// Size of the Connect command's data.
pub const CONNECT_DATA_BYTES: usize = 1024;
/// CNTLID value in Connect data asking the subsystem to allocate any controller (dynamic
/// controller model).
pub const CNTLID_DYNAMIC: u16 = 0xffff;

/// The Connect command's data (NVMe-oF 1.1, Figure 21).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectData {
    /// Host identifier (bytes 15:0), the same on every association of one host.
    pub hostid: [u8; 16],
    /// Controller ID (bytes 17:16): [`CNTLID_DYNAMIC`] on the admin queue of a dynamic
    /// subsystem; on an I/O queue, the controller the admin Connect returned.
    pub cntlid: u16,
    /// Subsystem NQN (bytes 511:256).
    pub subnqn: Nqn,
    /// Host NQN (bytes 767:512).
    pub hostnqn: Nqn,
}

/// Byte offsets in Connect data, also reported in the Connect Invalid Parameters response.
pub mod connect_data_offset {
    /// HOSTID.
    pub const HOSTID: u16 = 0;
    /// CNTLID.
    pub const CNTLID: u16 = 16;
    /// SUBNQN.
    pub const SUBNQN: u16 = 256;
    /// HOSTNQN.
    pub const HOSTNQN: u16 = 512;
}

impl ConnectData {
    /// Encodes to 1024 bytes.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; CONNECT_DATA_BYTES];
        b[..16].copy_from_slice(&self.hostid);
        put_u16(&mut b, 16, self.cntlid);
        self.subnqn.write(&mut b[256..]);
        self.hostnqn.write(&mut b[512..]);
        b
    }

    /// Decodes the first 1024 bytes of `data`.
    ///
    /// # Errors
    /// [`WireError::Short`] below 1024 bytes, [`WireError::InvalidText`] for a malformed
    /// NQN; its offset is what [`connect_invalid_parameter_dw0`] reports.
    pub fn decode(data: &[u8]) -> Result<Self, WireError> {
        const WHAT: &str = "Connect data";
        need(WHAT, data, CONNECT_DATA_BYTES)?;
        let mut hostid = [0u8; 16];
        hostid.copy_from_slice(&data[..16]);
        Ok(ConnectData {
            hostid,
            cntlid: get_u16(data, 16),
            subnqn: Nqn::decode_at(data, 256, WHAT, "SUBNQN")?,
            hostnqn: Nqn::decode_at(data, 512, WHAT, "HOSTNQN")?,
        })
    }
}

/// Dword 0 of a successful Connect response: the controller ID in bits 15:0.
#[must_use]
pub fn connect_success_dw0(cntlid: u16) -> u32 {
    u32::from(cntlid)
}

/// The controller ID from Dword 0 of a successful Connect response.
#[must_use]
pub fn connect_response_cntlid(dw0: u32) -> u16 {
    (dw0 & 0xffff) as u16
}

/// Dword 0 of a Connect Invalid Parameters response: IPO (bits 15:0) is the byte offset of
/// the bad parameter and IATTR bit 0 (bit 16) says whether it is in the Connect data (true)
/// or in the SQE (false).
#[must_use]
pub fn connect_invalid_parameter_dw0(in_data: bool, offset: u16) -> u32 {
    u32::from(in_data) << 16 | u32::from(offset)
}

/// Size of a property access (ATTRIB bits 2:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PropertySize {
    /// 4 bytes (ATTRIB 0).
    Four,
    /// 8 bytes (ATTRIB 1).
    Eight,
}

impl PropertySize {
    fn parse(attrib: u8) -> Result<Self, WireError> {
        match attrib & 0x7 {
            0 => Ok(PropertySize::Four),
            1 => Ok(PropertySize::Eight),
            other => Err(invalid(
                "Property",
                "ATTRIB",
                40,
                u64::from(other),
                "0 or 1",
            )),
        }
    }

    fn attrib(self) -> u32 {
        match self {
            PropertySize::Four => 0,
            PropertySize::Eight => 1,
        }
    }
}

/// Property Get (NVMe-oF 1.1, Figure 26).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PropertyGet {
    /// Access size (byte 40).
    pub size: PropertySize,
    /// Property offset (byte 44), see [`property`].
    pub offset: u32,
}

impl PropertyGet {
    fn parse(sqe: &Sqe) -> Result<Self, WireError> {
        Ok(PropertyGet {
            size: PropertySize::parse(sqe.cdw10 as u8)?,
            offset: sqe.cdw11,
        })
    }

    /// Builds the SQE. The value comes back in Dwords 0 (and 1 for 8 bytes) of the CQE.
    #[must_use]
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        Sqe {
            cdw10: self.size.attrib(),
            cdw11: self.offset,
            ..fabrics_sqe(fctype::PROPERTY_GET, cid)
        }
    }
}

/// Property Set (NVMe-oF 1.1, Figure 28).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PropertySet {
    /// Access size (byte 40).
    pub size: PropertySize,
    /// Property offset (byte 44).
    pub offset: u32,
    /// Value (bytes 55:48); only the low 4 bytes count for 4-byte properties.
    pub value: u64,
}

impl PropertySet {
    fn parse(sqe: &Sqe) -> Result<Self, WireError> {
        Ok(PropertySet {
            size: PropertySize::parse(sqe.cdw10 as u8)?,
            offset: sqe.cdw11,
            value: u64::from(sqe.cdw12) | u64::from(sqe.cdw13) << 32,
        })
    }

    /// Builds the SQE.
    #[must_use]
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        Sqe {
            cdw10: self.size.attrib(),
            cdw11: self.offset,
            cdw12: self.value as u32,
            cdw13: (self.value >> 32) as u32,
            ..fabrics_sqe(fctype::PROPERTY_SET, cid)
        }
    }
}

/// Controller property offsets (NVMe Base 2.0, Figure 33).
pub mod property {
    /// Controller Capabilities, 8 bytes, read-only.
    pub const CAP: u32 = 0x00;
    /// Version, 4 bytes, read-only.
    pub const VS: u32 = 0x08;
    /// Controller Configuration, 4 bytes.
    pub const CC: u32 = 0x14;
    /// Controller Status, 4 bytes, read-only.
    pub const CSTS: u32 = 0x1c;
    /// NVM Subsystem Reset, 4 bytes.
    pub const NSSR: u32 = 0x20;
}

/// The size of property `offset`, or `None` for an offset this crate does not define.
#[must_use]
pub fn property_size(offset: u32) -> Option<PropertySize> {
    match offset {
        property::CAP => Some(PropertySize::Eight),
        property::VS | property::CC | property::CSTS | property::NSSR => Some(PropertySize::Four),
        _ => None,
    }
}

/// The VS property / Identify VER value for version `major.minor.tertiary`.
#[must_use]
pub const fn version(major: u16, minor: u8, tertiary: u8) -> u32 {
    (major as u32) << 16 | (minor as u32) << 8 | tertiary as u32
}

/// Controller Capabilities (CAP), the fields a Fabrics controller reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cap {
    /// Maximum Queue Entries Supported, 0's based (bits 15:0).
    pub mqes: u16,
    /// Contiguous Queues Required (bit 16); always 1 over Fabrics.
    pub cqr: bool,
    /// Timeout (bits 31:24), in 500 ms units: the longest CSTS.RDY may take to follow CC.EN.
    pub to_500ms: u8,
    /// Doorbell stride (bits 35:32), 0 over Fabrics.
    pub dstrd: u8,
    /// NVM command set supported (CSS bit 37).
    pub css_nvm: bool,
    /// Memory page size minimum (bits 51:48), 2^(12 + MPSMIN).
    pub mpsmin: u8,
    /// Memory page size maximum (bits 55:52).
    pub mpsmax: u8,
}

impl Cap {
    /// Decodes the 8-byte CAP value.
    #[must_use]
    pub fn from_u64(v: u64) -> Self {
        Cap {
            mqes: (v & 0xffff) as u16,
            cqr: v & (1 << 16) != 0,
            to_500ms: ((v >> 24) & 0xff) as u8,
            dstrd: ((v >> 32) & 0xf) as u8,
            css_nvm: v & (1 << 37) != 0,
            mpsmin: ((v >> 48) & 0xf) as u8,
            mpsmax: ((v >> 52) & 0xf) as u8,
        }
    }

    /// Encodes the 8-byte CAP value.
    #[must_use]
    pub fn to_u64(&self) -> u64 {
        u64::from(self.mqes)
            | u64::from(self.cqr) << 16
            | u64::from(self.to_500ms) << 24
            | u64::from(self.dstrd & 0xf) << 32
            | u64::from(self.css_nvm) << 37
            | u64::from(self.mpsmin & 0xf) << 48
            | u64::from(self.mpsmax & 0xf) << 52
    }
}

/// Controller Configuration (CC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cc {
    /// Enable (bit 0): the host sets it to start the controller, clears it to reset.
    pub en: bool,
    /// I/O Command Set Selected (bits 6:4); 0 = NVM.
    pub css: u8,
    /// Memory Page Size (bits 10:7), 2^(12 + MPS).
    pub mps: u8,
    /// Arbitration Mechanism Selected (bits 13:11).
    pub ams: u8,
    /// Shutdown Notification (bits 15:14): 0 none, 1 normal, 2 abrupt.
    pub shn: u8,
    /// I/O SQ entry size (bits 19:16), log2 bytes; 6 = 64.
    pub iosqes: u8,
    /// I/O CQ entry size (bits 23:20), log2 bytes; 4 = 16.
    pub iocqes: u8,
}

impl Cc {
    /// Decodes CC.
    #[must_use]
    pub fn from_u32(v: u32) -> Self {
        Cc {
            en: v & 1 != 0,
            css: ((v >> 4) & 0x7) as u8,
            mps: ((v >> 7) & 0xf) as u8,
            ams: ((v >> 11) & 0x7) as u8,
            shn: ((v >> 14) & 0x3) as u8,
            iosqes: ((v >> 16) & 0xf) as u8,
            iocqes: ((v >> 20) & 0xf) as u8,
        }
    }

    /// Encodes CC.
    #[must_use]
    pub fn to_u32(&self) -> u32 {
        u32::from(self.en)
            | u32::from(self.css & 0x7) << 4
            | u32::from(self.mps & 0xf) << 7
            | u32::from(self.ams & 0x7) << 11
            | u32::from(self.shn & 0x3) << 14
            | u32::from(self.iosqes & 0xf) << 16
            | u32::from(self.iocqes & 0xf) << 20
    }
}

/// Controller Status (CSTS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Csts {
    /// Ready (bit 0).
    pub rdy: bool,
    /// Controller Fatal Status (bit 1).
    pub cfs: bool,
    /// Shutdown Status (bits 3:2): 0 normal operation, 1 occurring, 2 complete.
    pub shst: u8,
    /// NVM Subsystem Reset Occurred (bit 4).
    pub nssro: bool,
    /// Processing Paused (bit 5).
    pub pp: bool,
}

impl Csts {
    /// Decodes CSTS.
    #[must_use]
    pub fn from_u32(v: u32) -> Self {
        Csts {
            rdy: v & 1 != 0,
            cfs: v & 2 != 0,
            shst: ((v >> 2) & 0x3) as u8,
            nssro: v & (1 << 4) != 0,
            pp: v & (1 << 5) != 0,
        }
    }

    /// Encodes CSTS.
    #[must_use]
    pub fn to_u32(&self) -> u32 {
        u32::from(self.rdy)
            | u32::from(self.cfs) << 1
            | u32::from(self.shst & 0x3) << 2
            | u32::from(self.nssro) << 4
            | u32::from(self.pp) << 5
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_sqe_layout() {
        let c = Connect {
            recfmt: 0,
            qid: 3,
            sqsize: 127,
            cattr: 0,
            kato_ms: 0,
        };
        let b = c.to_sqe(7).to_bytes();
        assert_eq!(&b[..5], &[0x7f, 0x40, 7, 0, fctype::CONNECT]);
        assert_eq!(&b[40..52], &[0, 0, 3, 0, 127, 0, 0, 0, 0, 0, 0, 0]);
        let back = FabricsCommand::parse(&Sqe::from_bytes(&b)).unwrap();
        assert_eq!(back, FabricsCommand::Connect(c));
    }

    #[test]
    fn property_set_layout() {
        let p = PropertySet {
            size: PropertySize::Four,
            offset: property::CC,
            value: 0x46_0001,
        };
        let b = p.to_sqe(1).to_bytes();
        assert_eq!(b[4], 0x00);
        assert_eq!(b[40], 0);
        assert_eq!(&b[44..48], &[0x14, 0, 0, 0]);
        assert_eq!(&b[48..56], &[1, 0, 0x46, 0, 0, 0, 0, 0]);
        let cc = Cc::from_u32(0x46_0001);
        assert!(cc.en);
        assert_eq!((cc.iosqes, cc.iocqes), (6, 4));
        assert_eq!(cc.to_u32(), 0x46_0001);
    }

    #[test]
    fn cap_bits() {
        let cap = Cap {
            mqes: 127,
            cqr: true,
            to_500ms: 20,
            css_nvm: true,
            ..Cap::default()
        };
        assert_eq!(cap.to_u64(), 127 | 1 << 16 | 20 << 24 | 1 << 37);
        assert_eq!(Cap::from_u64(cap.to_u64()), cap);
    }

    #[test]
    fn invalid_attrib_is_an_error() {
        let mut sqe = PropertyGet {
            size: PropertySize::Eight,
            offset: 0,
        }
        .to_sqe(1);
        sqe.cdw10 = 5;
        assert!(FabricsCommand::parse(&sqe).is_err());
        sqe.nsid = 0x42;
        assert!(matches!(
            FabricsCommand::parse(&sqe),
            Err(WireError::InvalidOpcode { .. })
        ));
    }
}
