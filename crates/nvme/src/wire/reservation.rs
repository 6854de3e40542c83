//! Reservation commands and the Reservation Report data structure (NVMe Base 2.0, 8.19 and
//! 7.5-7.8 of the NVM Command Set): persistent reservations, the fencing mechanism a
//! cluster file system uses to keep a failed node off shared drives.

use super::bytes::{get_u16, get_u64, put_u16, put_u64};
use super::command::{io_opcode, Sqe};
use super::error::{invalid, need, WireError};

/// Reservation types (RTYPE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReservationType {
    /// Write Exclusive.
    WriteExclusive = 1,
    /// Exclusive Access.
    ExclusiveAccess = 2,
    /// Write Exclusive - Registrants Only.
    WriteExclusiveRegistrantsOnly = 3,
    /// Exclusive Access - Registrants Only.
    ExclusiveAccessRegistrantsOnly = 4,
    /// Write Exclusive - All Registrants.
    WriteExclusiveAllRegistrants = 5,
    /// Exclusive Access - All Registrants.
    ExclusiveAccessAllRegistrants = 6,
}

impl ReservationType {
    /// The type for an RTYPE value; `None` for 0 (no reservation) and reserved values.
    #[must_use]
    pub fn from_u8(v: u8) -> Option<Self> {
        use ReservationType as T;
        Some(match v {
            1 => T::WriteExclusive,
            2 => T::ExclusiveAccess,
            3 => T::WriteExclusiveRegistrantsOnly,
            4 => T::ExclusiveAccessRegistrantsOnly,
            5 => T::WriteExclusiveAllRegistrants,
            6 => T::ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }
}

/// Reservation Register action (RREGA, CDW10 bits 2:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterAction {
    /// Register the new key NRKEY.
    Register = 0,
    /// Unregister (CRKEY must match).
    Unregister = 1,
    /// Replace CRKEY by NRKEY.
    Replace = 2,
}

/// Reservation Register command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReservationRegister {
    /// Namespace.
    pub nsid: u32,
    /// Action.
    pub action: RegisterAction,
    /// Ignore Existing Key (CDW10 bit 3).
    pub iekey: bool,
    /// Change Persist Through Power Loss state (CDW10 bits 31:30).
    pub cptpl: u8,
}

fn cdw10_action(sqe: &Sqe, structure: &'static str, field: &'static str) -> Result<u8, WireError> {
    let action = (sqe.cdw10 & 0x7) as u8;
    if action > 2 {
        return Err(invalid(structure, field, 40, u64::from(action), "0..=2"));
    }
    Ok(action)
}

fn cdw10_rtype(sqe: &Sqe, structure: &'static str) -> Result<Option<ReservationType>, WireError> {
    let raw = ((sqe.cdw10 >> 8) & 0xff) as u8;
    match (raw, ReservationType::from_u8(raw)) {
        (0, _) => Ok(None),
        (_, Some(t)) => Ok(Some(t)),
        (_, None) => Err(invalid(structure, "RTYPE", 41, u64::from(raw), "0..=6")),
    }
}

impl ReservationRegister {
    pub(crate) fn parse(sqe: &Sqe) -> Result<Self, WireError> {
        let action = match cdw10_action(sqe, "Reservation Register", "RREGA")? {
            0 => RegisterAction::Register,
            1 => RegisterAction::Unregister,
            _ => RegisterAction::Replace,
        };
        Ok(ReservationRegister {
            nsid: sqe.nsid,
            action,
            iekey: sqe.cdw10 & (1 << 3) != 0,
            cptpl: (sqe.cdw10 >> 30) as u8,
        })
    }

    /// Builds the SQE; the data is [`RegisterData`].
    #[must_use]
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let cdw10 =
            self.action as u32 | u32::from(self.iekey) << 3 | u32::from(self.cptpl & 3) << 30;
        Sqe {
            nsid: self.nsid,
            cdw10,
            ..Sqe::new(io_opcode::RESERVATION_REGISTER, cid)
        }
    }
}

/// Two reservation keys as 16 bytes of command data: Register sends (CRKEY, NRKEY), Acquire
/// sends (CRKEY, PRKEY).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyPair {
    /// Current reservation key (bytes 7:0).
    pub crkey: u64,
    /// New key (Register) or preempt key (Acquire) (bytes 15:8).
    pub second: u64,
}

/// Register data: CRKEY and NRKEY.
pub type RegisterData = KeyPair;
/// Acquire data: CRKEY and PRKEY.
pub type AcquireData = KeyPair;

impl KeyPair {
    /// Encodes to 16 bytes.
    #[must_use]
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        put_u64(&mut b, 0, self.crkey);
        put_u64(&mut b, 8, self.second);
        b
    }

    /// Decodes the first 16 bytes of `data`.
    ///
    /// # Errors
    /// [`WireError::Short`] below 16 bytes.
    pub fn decode(data: &[u8]) -> Result<Self, WireError> {
        need("reservation key data", data, 16)?;
        Ok(KeyPair {
            crkey: get_u64(data, 0),
            second: get_u64(data, 8),
        })
    }
}

/// Release data: CRKEY, 8 bytes.
#[must_use]
pub fn encode_release_data(crkey: u64) -> [u8; 8] {
    crkey.to_le_bytes()
}

/// Decodes Release data (CRKEY).
///
/// # Errors
/// [`WireError::Short`] below 8 bytes.
pub fn decode_release_data(data: &[u8]) -> Result<u64, WireError> {
    need("Reservation Release data", data, 8)?;
    Ok(get_u64(data, 0))
}

/// Reservation Acquire action (RACQA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireAction {
    /// Acquire.
    Acquire = 0,
    /// Preempt the holder registered with PRKEY.
    Preempt = 1,
    /// Preempt and abort its outstanding commands.
    PreemptAndAbort = 2,
}

/// Reservation Acquire command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReservationAcquire {
    /// Namespace.
    pub nsid: u32,
    /// Action.
    pub action: AcquireAction,
    /// Ignore Existing Key (CDW10 bit 3).
    pub iekey: bool,
    /// Reservation type (CDW10 bits 15:8).
    pub rtype: ReservationType,
}

impl ReservationAcquire {
    pub(crate) fn parse(sqe: &Sqe) -> Result<Self, WireError> {
        const WHAT: &str = "Reservation Acquire";
        let action = match cdw10_action(sqe, WHAT, "RACQA")? {
            0 => AcquireAction::Acquire,
            1 => AcquireAction::Preempt,
            _ => AcquireAction::PreemptAndAbort,
        };
        let rtype =
            cdw10_rtype(sqe, WHAT)?.ok_or_else(|| invalid(WHAT, "RTYPE", 41, 0, "1..=6"))?;
        Ok(ReservationAcquire {
            nsid: sqe.nsid,
            action,
            iekey: sqe.cdw10 & (1 << 3) != 0,
            rtype,
        })
    }

    /// Builds the SQE; the data is [`AcquireData`].
    #[must_use]
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let cdw10 = self.action as u32 | u32::from(self.iekey) << 3 | (self.rtype as u32) << 8;
        Sqe {
            nsid: self.nsid,
            cdw10,
            ..Sqe::new(io_opcode::RESERVATION_ACQUIRE, cid)
        }
    }
}

/// Reservation Release action (RRELA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseAction {
    /// Release the reservation held.
    Release = 0,
    /// Clear: release and unregister every registrant.
    Clear = 1,
}

/// Reservation Release command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReservationRelease {
    /// Namespace.
    pub nsid: u32,
    /// Action.
    pub action: ReleaseAction,
    /// Ignore Existing Key (CDW10 bit 3).
    pub iekey: bool,
    /// Reservation type being released (CDW10 bits 15:8); `None` for 0, which Clear may
    /// carry.
    pub rtype: Option<ReservationType>,
}

impl ReservationRelease {
    pub(crate) fn parse(sqe: &Sqe) -> Result<Self, WireError> {
        const WHAT: &str = "Reservation Release";
        let action = match (sqe.cdw10 & 0x7) as u8 {
            0 => ReleaseAction::Release,
            1 => ReleaseAction::Clear,
            other => return Err(invalid(WHAT, "RRELA", 40, u64::from(other), "0 or 1")),
        };
        let rtype = cdw10_rtype(sqe, WHAT)?;
        Ok(ReservationRelease {
            nsid: sqe.nsid,
            action,
            iekey: sqe.cdw10 & (1 << 3) != 0,
            rtype,
        })
    }

    /// Builds the SQE; the data is CRKEY ([`encode_release_data`]).
    #[must_use]
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let rtype = self.rtype.map_or(0, |t| t as u32);
        let cdw10 = self.action as u32 | u32::from(self.iekey) << 3 | rtype << 8;
        Sqe {
            nsid: self.nsid,
            cdw10,
            ..Sqe::new(io_opcode::RESERVATION_RELEASE, cid)
        }
    }
}

/// Reservation Report command: returns [`ReservationStatus`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReservationReport {
    /// Namespace.
    pub nsid: u32,
    /// Number of dwords to return, 0's based (CDW10).
    pub numd: u32,
    /// Extended Data Structure (CDW11 bit 0): 128-bit host identifiers.
    pub eds: bool,
}

impl ReservationReport {
    pub(crate) fn parse(sqe: &Sqe) -> Self {
        ReservationReport {
            nsid: sqe.nsid,
            numd: sqe.cdw10,
            eds: sqe.cdw11 & 1 != 0,
        }
    }

    /// Bytes requested.
    #[must_use]
    pub fn len_bytes(&self) -> u64 {
        (u64::from(self.numd) + 1) * 4
    }

    /// Builds the SQE.
    #[must_use]
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        Sqe {
            nsid: self.nsid,
            cdw10: self.numd,
            cdw11: u32::from(self.eds),
            ..Sqe::new(io_opcode::RESERVATION_REPORT, cid)
        }
    }
}

/// One registered controller in a Reservation Report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Registrant {
    /// Controller ID (0xFFFF when the registrant has no controller).
    pub cntlid: u16,
    /// RCSTS bit 0: this registrant holds the reservation.
    pub holds_reservation: bool,
    /// Host identifier. The regular format carries only 8 bytes (stored in `hostid[..8]`,
    /// the rest zero); the extended format carries all 16.
    pub hostid: [u8; 16],
    /// Reservation key.
    pub rkey: u64,
}

/// Reservation Report data (Reservation Status data structure).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReservationStatus {
    /// Generation (bytes 3:0): incremented on every registration change and preemption.
    pub generation: u32,
    /// Reservation type held (byte 4); 0 when there is no reservation.
    pub rtype: u8,
    /// Number of registered controllers (REGCTL, bytes 6:5). It can exceed
    /// `registrants.len()` when the host's buffer was too small for all of them.
    pub regctl: u16,
    /// Persist Through Power Loss State (byte 9).
    pub ptpls: u8,
    /// The registrant entries present in the data.
    pub registrants: Vec<Registrant>,
}

/// Header size of the regular Reservation Status structure.
pub const RESERVATION_HEADER_BYTES: usize = 24;
/// Header size of the extended structure.
pub const RESERVATION_EXT_HEADER_BYTES: usize = 64;
/// Regular registrant entry size (64-bit host identifier).
pub const REGISTRANT_BYTES: usize = 24;
/// Extended registrant entry size (128-bit host identifier).
pub const REGISTRANT_EXT_BYTES: usize = 64;

impl ReservationStatus {
    /// Encodes in the regular (`extended == false`) or extended format. REGCTL is
    /// `registrants.len()` (at most 65535 entries are encoded). A target truncates the
    /// result to the host's requested length.
    #[must_use]
    pub fn encode(&self, extended: bool) -> Vec<u8> {
        let (header, entry) = layout(extended);
        let count = self.registrants.len().min(usize::from(u16::MAX));
        let mut b = vec![0u8; header + count * entry];
        b[..4].copy_from_slice(&self.generation.to_le_bytes());
        b[4] = self.rtype;
        put_u16(&mut b, 5, count as u16);
        b[9] = self.ptpls;
        for (r, chunk) in self
            .registrants
            .iter()
            .zip(b[header..].chunks_exact_mut(entry))
        {
            put_u16(chunk, 0, r.cntlid);
            chunk[2] = u8::from(r.holds_reservation);
            if extended {
                put_u64(chunk, 8, r.rkey);
                chunk[16..32].copy_from_slice(&r.hostid);
            } else {
                chunk[8..16].copy_from_slice(&r.hostid[..8]);
                put_u64(chunk, 16, r.rkey);
            }
        }
        b
    }

    /// Decodes the regular or extended format. Only whole registrant entries present in
    /// `data` are returned (at most REGCTL of them), because the host chooses how much to
    /// read and REGCTL tells it whether it got everything.
    ///
    /// # Errors
    /// [`WireError::Short`] when even the header is missing.
    pub fn decode(data: &[u8], extended: bool) -> Result<Self, WireError> {
        let (header, entry) = layout(extended);
        need("Reservation Status", data, header)?;
        let regctl = get_u16(data, 5);
        let registrants = data[header..]
            .chunks_exact(entry)
            .take(usize::from(regctl))
            .map(|c| decode_registrant(c, extended))
            .collect();
        Ok(ReservationStatus {
            generation: u32::from_le_bytes([data[0], data[1], data[2], data[3]]),
            rtype: data[4],
            regctl,
            ptpls: data[9],
            registrants,
        })
    }
}

fn layout(extended: bool) -> (usize, usize) {
    if extended {
        (RESERVATION_EXT_HEADER_BYTES, REGISTRANT_EXT_BYTES)
    } else {
        (RESERVATION_HEADER_BYTES, REGISTRANT_BYTES)
    }
}

fn decode_registrant(c: &[u8], extended: bool) -> Registrant {
    let mut hostid = [0u8; 16];
    let rkey = if extended {
        hostid.copy_from_slice(&c[16..32]);
        get_u64(c, 8)
    } else {
        hostid[..8].copy_from_slice(&c[8..16]);
        get_u64(c, 16)
    };
    Registrant {
        cntlid: get_u16(c, 0),
        holds_reservation: c[2] & 1 != 0,
        hostid,
        rkey,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_layouts() {
        let r = Registrant {
            cntlid: 2,
            holds_reservation: true,
            hostid: [7; 16],
            rkey: 0xabcd,
        };
        let st = ReservationStatus {
            generation: 5,
            rtype: 3,
            regctl: 1,
            ptpls: 0,
            registrants: vec![r],
        };
        let regular = st.encode(false);
        assert_eq!(regular.len(), 48);
        assert_eq!(&regular[24..27], &[2, 0, 1]);
        assert_eq!(&regular[32..40], &[7; 8]);
        assert_eq!(&regular[40..42], &[0xcd, 0xab]);
        let back = ReservationStatus::decode(&regular, false).unwrap();
        assert_eq!(back.registrants[0].hostid[..8], [7; 8]);
        assert_eq!(back.registrants[0].hostid[8..], [0; 8]);
        let ext = st.encode(true);
        assert_eq!(ext.len(), 128);
        assert_eq!(&ext[64 + 8..64 + 10], &[0xcd, 0xab]);
        assert_eq!(ReservationStatus::decode(&ext, true).unwrap(), st);
        // A buffer cut mid-entry keeps REGCTL and drops the partial entry.
        let cut = ReservationStatus::decode(&ext[..100], true).unwrap();
        assert_eq!((cut.regctl, cut.registrants.len()), (1, 0));
    }

    #[test]
    fn acquire_rejects_bad_rtype() {
        let a = ReservationAcquire {
            nsid: 1,
            action: AcquireAction::Preempt,
            iekey: false,
            rtype: ReservationType::WriteExclusiveRegistrantsOnly,
        };
        let mut sqe = a.to_sqe(1);
        assert_eq!(sqe.cdw10, 0x301);
        assert_eq!(ReservationAcquire::parse(&sqe), Ok(a));
        sqe.cdw10 = 0x701;
        assert!(ReservationAcquire::parse(&sqe).is_err());
        sqe.cdw10 = 0x303;
        assert!(ReservationAcquire::parse(&sqe).is_err());
    }
}
