//! Persistent reservations of one namespace (NVMe Base 2.0, 8.19), shared by every
//! controller of the subsystem on every port.
//!
//! Hosts are identified by their 128-bit host identifier (HOSTID of Connect), as the
//! specification requires, so the two paths of one host are one registrant.
//!
//! Persist Through Power Loss (PTPL). A drive keeps reservations across a power cycle
//! when a host asked for it (Register with CPTPL 11b, or Set Features Reservation
//! Persistence); fencing depends on it, since a restart that forgot the reservation would
//! let a fenced host write again. Here a restart of the drive server is the power cycle.
//! When the server has a state directory (RESCAP.PTPLC 1), the namespace's
//! [`super::reservation_store::ReservationStore`] writes the state below to a file before
//! a command that changed it completes, and the server loads it at start. Without a state
//! directory PTPL is refused with Invalid Field and a restart clears everything.
//!
//! The persisted state (little-endian), 52 + 24 × N bytes:
//!
//! | offset | bytes | field |
//! | ---: | ---: | --- |
//! | 0 | 8 | magic `TSRRESV1` |
//! | 8 | 16 | NGUID of the namespace the state belongs to |
//! | 24 | 4 | generation (Reservation Report GEN) |
//! | 28 | 1 | reservation type (RTYPE; 0 when none) |
//! | 29 | 1 | flags: bit 0 PTPL (always set: without PTPL there is no file) |
//! | 30 | 2 | N, registrants (at most [`REGISTRANTS_MAX`]) |
//! | 32 | 16 | holder host identifier (zero when there is no reservation) |
//! | 48 | 24 × N | registrants in registration order: host identifier (16), key (8) |
//! | 48 + 24N | 4 | CRC32C of every byte before it |
//!
//! Registrants loaded from the file report controller ID FFFFh until they register
//! again: their controllers went away with the restart.

use crate::wire::reservation::{
    AcquireAction, RegisterAction, Registrant, ReleaseAction, ReservationStatus, ReservationType,
};
use crate::wire::Status;

/// The most registrants per namespace; one per host, so this bounds memory, not clusters.
pub const REGISTRANTS_MAX: usize = 1024;

/// Controller ID of a registrant with no controller (loaded after a restart).
const NO_CONTROLLER: u16 = 0xffff;
const MAGIC: &[u8; 8] = b"TSRRESV1";
const HEADER_BYTES: usize = 48;
const REGISTRANT_BYTES: usize = 24;
const FLAG_PTPL: u8 = 1;

/// Who is asking: the host identifier and the controller it came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requester {
    /// HOSTID from Connect.
    pub hostid: [u8; 16],
    /// The controller (reported in Reservation Report).
    pub cntlid: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reg {
    hostid: [u8; 16],
    cntlid: u16,
    rkey: u64,
}

/// The reservation state of one namespace.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReservationState {
    /// Registrants in registration order.
    regs: Vec<Reg>,
    /// The reservation and the host that acquired it. For the all-registrants types every
    /// registrant is a holder and the host recorded here has no special role.
    reservation: Option<(ReservationType, [u8; 16])>,
    generation: u32,
    /// Persist through power loss: the state survives a restart of the drive server.
    ptpl: bool,
    /// The namespace can persist its state (RESCAP.PTPLC): the server has a state
    /// directory.
    ptpl_capable: bool,
}

fn conflict() -> Status {
    Status::RESERVATION_CONFLICT.with_dnr(true)
}

fn invalid_field() -> Status {
    Status::INVALID_FIELD.with_dnr(true)
}

fn all_registrants(t: ReservationType) -> bool {
    matches!(
        t,
        ReservationType::WriteExclusiveAllRegistrants
            | ReservationType::ExclusiveAccessAllRegistrants
    )
}

impl ReservationState {
    /// An empty state for a namespace that can persist it (PTPL off until a host asks).
    #[must_use]
    pub fn persistable() -> ReservationState {
        ReservationState {
            ptpl_capable: true,
            ..ReservationState::default()
        }
    }

    /// PTPL: the state survives a restart.
    #[must_use]
    pub fn ptpl(&self) -> bool {
        self.ptpl
    }

    /// RESCAP.PTPLC.
    #[must_use]
    pub fn ptpl_capable(&self) -> bool {
        self.ptpl_capable
    }

    /// Set Features Reservation Persistence.
    ///
    /// # Errors
    /// Invalid Field when asked to persist without the capability.
    pub fn set_ptpl(&mut self, on: bool) -> Result<(), Status> {
        if on && !self.ptpl_capable {
            return Err(invalid_field());
        }
        self.ptpl = on;
        Ok(())
    }

    fn find(&self, hostid: &[u8; 16]) -> Option<usize> {
        self.regs.iter().position(|r| &r.hostid == hostid)
    }

    /// True when `hostid` holds the reservation.
    fn is_holder(&self, hostid: &[u8; 16]) -> bool {
        match self.reservation {
            Some((t, _)) if all_registrants(t) => self.find(hostid).is_some(),
            Some((_, holder)) => &holder == hostid,
            None => false,
        }
    }

    /// Removes registrant `index`, releasing the reservation if it held it (for the
    /// all-registrants types only when no registrant is left).
    fn unregister_at(&mut self, index: usize) {
        let reg = self.regs.remove(index);
        let release = match self.reservation {
            Some((t, _)) if all_registrants(t) => self.regs.is_empty(),
            Some((_, holder)) => holder == reg.hostid,
            None => false,
        };
        if release {
            self.reservation = None;
        }
    }

    /// Checks the registrant and its current key.
    fn registered_with(&self, hostid: &[u8; 16], crkey: u64) -> Result<usize, Status> {
        match self.find(hostid) {
            Some(i) if self.regs[i].rkey == crkey => Ok(i),
            _ => Err(conflict()),
        }
    }

    /// Reservation Register.
    ///
    /// # Errors
    /// The completion status: Reservation Conflict for a wrong key or a missing
    /// registration, Invalid Field for an unsupported CPTPL.
    #[allow(clippy::too_many_arguments)]
    pub fn register(
        &mut self,
        who: Requester,
        action: RegisterAction,
        iekey: bool,
        cptpl: u8,
        crkey: u64,
        nrkey: u64,
    ) -> Result<(), Status> {
        // CPTPL: 00b no change, 10b clear PTPL, 11b set it (only with the capability);
        // 01b is reserved. Applied only when the registration succeeds.
        let ptpl = match cptpl {
            0 => None,
            2 => Some(false),
            3 if self.ptpl_capable => Some(true),
            _ => return Err(invalid_field()),
        };
        let existing = self.find(&who.hostid);
        match (action, existing) {
            (RegisterAction::Register, Some(i)) if self.regs[i].rkey != nrkey => {
                return Err(conflict())
            }
            (RegisterAction::Register, Some(i)) => {
                // The same key again: the host's current controller, e.g. after a restart.
                self.regs[i].cntlid = who.cntlid;
            }
            (RegisterAction::Register, None) => {
                if self.regs.len() >= REGISTRANTS_MAX {
                    return Err(Status::INTERNAL_ERROR);
                }
                self.regs.push(Reg {
                    hostid: who.hostid,
                    cntlid: who.cntlid,
                    rkey: nrkey,
                });
            }
            (_, None) => return Err(conflict()),
            (_, Some(i)) if !iekey && self.regs[i].rkey != crkey => return Err(conflict()),
            (RegisterAction::Unregister, Some(i)) => self.unregister_at(i),
            (RegisterAction::Replace, Some(i)) => self.regs[i].rkey = nrkey,
        }
        if let Some(on) = ptpl {
            self.ptpl = on;
        }
        self.generation = self.generation.wrapping_add(1);
        Ok(())
    }

    /// Reservation Acquire (acquire, preempt, preempt and abort). Preempt-and-abort does
    /// not abort commands in flight: they are already being executed by the drive and
    /// complete on their own; new commands from the preempted host are refused.
    ///
    /// # Errors
    /// The completion status.
    pub fn acquire(
        &mut self,
        who: Requester,
        action: AcquireAction,
        iekey: bool,
        rtype: ReservationType,
        crkey: u64,
        prkey: u64,
    ) -> Result<(), Status> {
        // IEKEY is not defined for Acquire since NVMe 1.3 (RESCAP.IEKEY13 is set).
        if iekey {
            return Err(invalid_field());
        }
        self.registered_with(&who.hostid, crkey)?;
        if action == AcquireAction::Acquire {
            return match self.reservation {
                None => {
                    self.reservation = Some((rtype, who.hostid));
                    Ok(())
                }
                Some((t, _)) if t == rtype && self.is_holder(&who.hostid) => Ok(()),
                Some(_) => Err(conflict()),
            };
        }
        self.preempt(who, rtype, prkey)?;
        self.generation = self.generation.wrapping_add(1);
        Ok(())
    }

    fn preempt(
        &mut self,
        who: Requester,
        rtype: ReservationType,
        prkey: u64,
    ) -> Result<(), Status> {
        let Some((current, holder)) = self.reservation else {
            return self.unregister_by_key(prkey);
        };
        if all_registrants(current) {
            if prkey == 0 {
                self.regs.retain(|r| r.hostid == who.hostid);
                self.reservation = Some((rtype, who.hostid));
                return Ok(());
            }
            return self.unregister_by_key(prkey);
        }
        let holder_key = self.find(&holder).map(|i| self.regs[i].rkey);
        if holder_key == Some(prkey) {
            // The holder's key: the reservation passes to the requester (a holder naming
            // its own key changes the type). Take it first so that removing the old holder
            // does not release it.
            self.reservation = Some((rtype, who.hostid));
            self.regs
                .retain(|r| r.rkey != prkey || r.hostid == who.hostid);
            return Ok(());
        }
        // Another key, also when the requester holds the reservation (a holder fencing a
        // registrant): its registrants go, the reservation stays as it is.
        if prkey == 0 {
            return Err(invalid_field());
        }
        self.unregister_by_key(prkey)
    }

    /// Unregisters every registrant whose key is `prkey`; a conflict if there is none.
    fn unregister_by_key(&mut self, prkey: u64) -> Result<(), Status> {
        let mut removed = false;
        while let Some(i) = self.regs.iter().position(|r| r.rkey == prkey) {
            self.unregister_at(i);
            removed = true;
        }
        if removed {
            Ok(())
        } else {
            Err(conflict())
        }
    }

    /// Reservation Release (release or clear).
    ///
    /// # Errors
    /// The completion status.
    pub fn release(
        &mut self,
        who: Requester,
        action: ReleaseAction,
        iekey: bool,
        rtype: Option<ReservationType>,
        crkey: u64,
    ) -> Result<(), Status> {
        if iekey {
            return Err(invalid_field());
        }
        self.registered_with(&who.hostid, crkey)?;
        match action {
            ReleaseAction::Clear => {
                self.regs.clear();
                self.reservation = None;
                self.generation = self.generation.wrapping_add(1);
                Ok(())
            }
            ReleaseAction::Release => match self.reservation {
                Some((t, _)) if self.is_holder(&who.hostid) => {
                    if Some(t) != rtype {
                        return Err(invalid_field());
                    }
                    self.reservation = None;
                    Ok(())
                }
                // Releasing when not the holder, or with no reservation, succeeds and
                // changes nothing (8.19.8).
                _ => Ok(()),
            },
        }
    }

    /// The Reservation Status data structure.
    #[must_use]
    pub fn report(&self) -> ReservationStatus {
        let registrants = self
            .regs
            .iter()
            .map(|r| Registrant {
                cntlid: r.cntlid,
                holds_reservation: self.is_holder(&r.hostid),
                hostid: r.hostid,
                rkey: r.rkey,
            })
            .collect::<Vec<_>>();
        ReservationStatus {
            generation: self.generation,
            rtype: self.reservation.map_or(0, |(t, _)| t as u8),
            regctl: registrants.len() as u16,
            ptpls: u8::from(self.ptpl),
            registrants,
        }
    }

    /// The persisted form of the state (module documentation), for the namespace `nguid`.
    #[must_use]
    pub fn encode_persistent(&self, nguid: &[u8; 16]) -> Vec<u8> {
        assert!(self.regs.len() <= REGISTRANTS_MAX);
        let mut b = Vec::with_capacity(HEADER_BYTES + REGISTRANT_BYTES * self.regs.len() + 4);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(nguid);
        b.extend_from_slice(&self.generation.to_le_bytes());
        let (rtype, holder) = self.reservation.map_or((0, [0; 16]), |(t, h)| (t as u8, h));
        b.push(rtype);
        b.push(if self.ptpl { FLAG_PTPL } else { 0 });
        b.extend_from_slice(&(self.regs.len() as u16).to_le_bytes());
        b.extend_from_slice(&holder);
        for r in &self.regs {
            b.extend_from_slice(&r.hostid);
            b.extend_from_slice(&r.rkey.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Reads a persisted state written for the namespace `nguid`; registrants have no
    /// controller until they register again.
    ///
    /// # Errors
    /// What is wrong with the bytes: truncated, not a state file, checksum, another
    /// namespace's NGUID, or contents no target could have written.
    pub fn decode_persistent(bytes: &[u8], nguid: &[u8; 16]) -> Result<ReservationState, String> {
        if bytes.len() < HEADER_BYTES + 4 {
            return Err(format!("{} bytes, shorter than a header", bytes.len()));
        }
        if &bytes[..8] != MAGIC {
            return Err("not a reservation state file (bad magic)".to_owned());
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        let stored = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
        if crc32c::crc32c(body) != stored {
            return Err("checksum mismatch (the file is damaged)".to_owned());
        }
        if &body[8..24] != nguid {
            return Err("written for another namespace (NGUID differs)".to_owned());
        }
        let generation = u32::from_le_bytes(body[24..28].try_into().expect("4 bytes"));
        let rtype = body[28];
        let flags = body[29];
        let count = usize::from(u16::from_le_bytes([body[30], body[31]]));
        let holder: [u8; 16] = body[32..48].try_into().expect("16 bytes");
        if flags != FLAG_PTPL {
            return Err(format!("flags {flags:#04x}, expected PTPL only"));
        }
        if count > REGISTRANTS_MAX {
            return Err(format!("{count} registrants, more than {REGISTRANTS_MAX}"));
        }
        if body.len() != HEADER_BYTES + REGISTRANT_BYTES * count {
            return Err(format!("{} bytes for {count} registrants", bytes.len()));
        }
        let mut state = ReservationState::persistable();
        state.ptpl = true;
        state.generation = generation;
        for chunk in body[HEADER_BYTES..].chunks_exact(REGISTRANT_BYTES) {
            let hostid: [u8; 16] = chunk[..16].try_into().expect("16 bytes");
            if state.find(&hostid).is_some() {
                return Err("a host is registered twice".to_owned());
            }
            state.regs.push(Reg {
                hostid,
                cntlid: NO_CONTROLLER,
                rkey: u64::from_le_bytes(chunk[16..].try_into().expect("8 bytes")),
            });
        }
        if rtype != 0 {
            let t = ReservationType::from_u8(rtype)
                .ok_or_else(|| format!("reservation type {rtype} is not defined"))?;
            let held = if all_registrants(t) {
                !state.regs.is_empty()
            } else {
                state.find(&holder).is_some()
            };
            if !held {
                return Err("the reservation holder is not a registrant".to_owned());
            }
            state.reservation = Some((t, holder));
        }
        Ok(state)
    }

    /// Checks a read (`write == false`) or write-class command of `hostid` against the
    /// reservation (NVM Command Set 1.0, Figure "Command Behavior in the Presence of a
    /// Reservation").
    ///
    /// # Errors
    /// Reservation Conflict.
    pub fn check_access(&self, hostid: &[u8; 16], write: bool) -> Result<(), Status> {
        let Some((t, _)) = self.reservation else {
            return Ok(());
        };
        if self.is_holder(hostid) {
            return Ok(());
        }
        let registered = self.find(hostid).is_some();
        let allowed = match t {
            ReservationType::WriteExclusive => !write,
            ReservationType::ExclusiveAccess => false,
            ReservationType::WriteExclusiveRegistrantsOnly
            | ReservationType::WriteExclusiveAllRegistrants => !write || registered,
            ReservationType::ExclusiveAccessRegistrantsOnly
            | ReservationType::ExclusiveAccessAllRegistrants => registered,
        };
        if allowed {
            Ok(())
        } else {
            Err(conflict())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ReservationType as T;

    const A: Requester = Requester {
        hostid: [1; 16],
        cntlid: 1,
    };
    const B: Requester = Requester {
        hostid: [2; 16],
        cntlid: 2,
    };
    const C: Requester = Requester {
        hostid: [3; 16],
        cntlid: 3,
    };

    fn reg(s: &mut ReservationState, who: Requester, key: u64) {
        s.register(who, RegisterAction::Register, false, 0, 0, key)
            .unwrap();
    }

    #[test]
    fn write_exclusive_and_preempt() {
        let mut s = ReservationState::default();
        reg(&mut s, A, 0xa);
        reg(&mut s, B, 0xb);
        let acq = AcquireAction::Acquire;
        s.acquire(A, acq, false, T::WriteExclusive, 0xa, 0).unwrap();
        assert_eq!(
            s.acquire(B, acq, false, T::WriteExclusive, 0xb, 0),
            Err(conflict())
        );
        assert_eq!(s.check_access(&B.hostid, true), Err(conflict()));
        assert_eq!(s.check_access(&B.hostid, false), Ok(()));
        assert_eq!(s.check_access(&A.hostid, true), Ok(()));
        s.acquire(
            B,
            AcquireAction::Preempt,
            false,
            T::WriteExclusive,
            0xb,
            0xa,
        )
        .unwrap();
        let report = s.report();
        assert_eq!(report.registrants.len(), 1);
        assert!(report.registrants[0].holds_reservation);
        assert_eq!(s.check_access(&A.hostid, true), Err(conflict()));
    }

    #[test]
    fn registrants_only_and_all_registrants() {
        let mut s = ReservationState::default();
        reg(&mut s, A, 1);
        reg(&mut s, B, 2);
        let acq = AcquireAction::Acquire;
        s.acquire(A, acq, false, T::WriteExclusiveRegistrantsOnly, 1, 0)
            .unwrap();
        assert_eq!(s.check_access(&B.hostid, true), Ok(()));
        assert_eq!(s.check_access(&C.hostid, true), Err(conflict()));
        assert_eq!(s.check_access(&C.hostid, false), Ok(()));
        s.release(
            A,
            ReleaseAction::Release,
            false,
            Some(T::WriteExclusiveRegistrantsOnly),
            1,
        )
        .unwrap();
        s.acquire(B, acq, false, T::ExclusiveAccessAllRegistrants, 2, 0)
            .unwrap();
        assert!(s.report().registrants.iter().all(|r| r.holds_reservation));
        assert_eq!(s.check_access(&C.hostid, false), Err(conflict()));
        // The last registrant leaving releases an all-registrants reservation.
        s.register(A, RegisterAction::Unregister, false, 0, 1, 0)
            .unwrap();
        assert_eq!(s.report().rtype, 6);
        s.register(B, RegisterAction::Unregister, true, 0, 0, 0)
            .unwrap();
        assert_eq!(s.report().rtype, 0);
    }

    #[test]
    fn keys_replace_clear() {
        let mut s = ReservationState::default();
        reg(&mut s, A, 1);
        assert_eq!(
            s.register(A, RegisterAction::Register, false, 0, 0, 9),
            Err(conflict())
        );
        assert_eq!(
            s.register(A, RegisterAction::Replace, false, 0, 7, 9),
            Err(conflict())
        );
        s.register(A, RegisterAction::Replace, true, 0, 7, 9)
            .unwrap();
        assert_eq!(s.report().registrants[0].rkey, 9);
        reg(&mut s, B, 2);
        s.acquire(A, AcquireAction::Acquire, false, T::ExclusiveAccess, 9, 0)
            .unwrap();
        assert_eq!(
            s.release(A, ReleaseAction::Release, false, Some(T::WriteExclusive), 9),
            Err(invalid_field())
        );
        let before = s.report().generation;
        s.release(B, ReleaseAction::Clear, false, None, 2).unwrap();
        let after = s.report();
        assert_eq!((after.regctl, after.rtype), (0, 0));
        assert!(after.generation > before);
    }

    /// The fencing case: the holder preempts another registrant's key. The registrant is
    /// removed and the reservation stays the holder's (it used to be treated as the holder
    /// preempting itself, which left the fenced host registered).
    #[test]
    fn holder_preempting_another_key_unregisters_it() {
        let mut s = ReservationState::default();
        reg(&mut s, A, 0xa);
        reg(&mut s, B, 0xb);
        let t = T::WriteExclusiveRegistrantsOnly;
        s.acquire(A, AcquireAction::Acquire, false, t, 0xa, 0)
            .unwrap();
        assert_eq!(s.check_access(&B.hostid, true), Ok(()));
        s.acquire(A, AcquireAction::Preempt, false, t, 0xa, 0xb)
            .unwrap();
        let r = s.report();
        assert_eq!((r.regctl, r.rtype), (1, t as u8));
        assert_eq!(s.check_access(&B.hostid, true), Err(conflict()));
        // Its own key changes the type; PRKEY 0 is invalid with a single holder.
        s.acquire(
            A,
            AcquireAction::Preempt,
            false,
            T::WriteExclusive,
            0xa,
            0xa,
        )
        .unwrap();
        assert_eq!(s.report().rtype, T::WriteExclusive as u8);
        assert_eq!(
            s.acquire(A, AcquireAction::Preempt, false, T::WriteExclusive, 0xa, 0),
            Err(invalid_field())
        );
    }

    #[test]
    fn cptpl_needs_the_capability_and_follows_register() {
        let mut s = ReservationState::default();
        let register = RegisterAction::Register;
        assert_eq!(
            s.register(A, register, false, 3, 0, 1),
            Err(invalid_field())
        );
        assert_eq!(
            s.register(A, register, false, 1, 0, 1),
            Err(invalid_field())
        );
        assert_eq!(s.set_ptpl(true), Err(invalid_field()));
        s.register(A, register, false, 2, 0, 1).unwrap();
        assert!(!s.ptpl());

        let mut s = ReservationState::persistable();
        // A failed registration changes nothing, PTPL included.
        reg(&mut s, A, 1);
        assert_eq!(s.register(A, register, false, 3, 0, 2), Err(conflict()));
        assert!(!s.ptpl());
        s.register(B, register, false, 3, 0, 2).unwrap();
        assert!(s.ptpl());
        assert_eq!(s.report().ptpls, 1);
        s.register(B, RegisterAction::Replace, false, 2, 2, 3)
            .unwrap();
        assert!(!s.ptpl());
        s.set_ptpl(true).unwrap();
        assert_eq!(s.report().ptpls, 1);
    }

    fn persisted_sample() -> ReservationState {
        let mut s = ReservationState::persistable();
        s.set_ptpl(true).unwrap();
        reg(&mut s, A, 0xa);
        reg(&mut s, B, 0xb);
        reg(&mut s, C, 0xc);
        s.acquire(
            B,
            AcquireAction::Acquire,
            false,
            T::WriteExclusiveRegistrantsOnly,
            0xb,
            0,
        )
        .unwrap();
        s
    }

    #[test]
    fn persisted_state_round_trips_without_controllers() {
        let nguid = [7; 16];
        let s = persisted_sample();
        let bytes = s.encode_persistent(&nguid);
        assert_eq!(bytes.len(), HEADER_BYTES + 3 * REGISTRANT_BYTES + 4);
        let back = ReservationState::decode_persistent(&bytes, &nguid).unwrap();
        let (want, got) = (s.report(), back.report());
        assert_eq!(
            (got.generation, got.rtype, got.regctl, got.ptpls),
            (want.generation, want.rtype, want.regctl, 1)
        );
        for (w, g) in want.registrants.iter().zip(&got.registrants) {
            assert_eq!(
                (g.hostid, g.rkey, g.holds_reservation),
                (w.hostid, w.rkey, w.holds_reservation)
            );
            assert_eq!(g.cntlid, NO_CONTROLLER);
        }
        assert!(back.ptpl_capable());
        assert_eq!(back.check_access(&C.hostid, true), Ok(()));
        assert_eq!(back.check_access(&[9; 16], true), Err(conflict()));
        // The same key again gives the registrant its controller back.
        let mut back = back;
        back.register(A, RegisterAction::Register, false, 0, 0, 0xa)
            .unwrap();
        assert_eq!(back.report().registrants[0].cntlid, A.cntlid);
        // An empty state with no reservation round-trips too.
        let mut empty = ReservationState::persistable();
        empty.set_ptpl(true).unwrap();
        let bytes = empty.encode_persistent(&nguid);
        assert_eq!(
            ReservationState::decode_persistent(&bytes, &nguid).unwrap(),
            empty
        );
    }

    #[test]
    fn damaged_or_foreign_state_is_refused() {
        let nguid = [7; 16];
        let bytes = persisted_sample().encode_persistent(&nguid);
        // Every single-bit flip and every truncation is caught, never a panic.
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut bad = bytes.clone();
                bad[i] ^= 1 << bit;
                assert!(
                    ReservationState::decode_persistent(&bad, &nguid).is_err(),
                    "byte {i} bit {bit}"
                );
            }
        }
        for len in 0..bytes.len() {
            assert!(
                ReservationState::decode_persistent(&bytes[..len], &nguid).is_err(),
                "{len} bytes"
            );
        }
        let err = ReservationState::decode_persistent(&bytes, &[8; 16]).unwrap_err();
        assert!(err.contains("another namespace"), "{err}");
        // Contents no target writes, with a valid checksum: a holder that is not
        // registered, a host registered twice.
        let reseal = |mut b: Vec<u8>| {
            let n = b.len() - 4;
            let crc = crc32c::crc32c(&b[..n]);
            b[n..].copy_from_slice(&crc.to_le_bytes());
            b
        };
        let mut orphan = bytes.clone();
        orphan[32..48].copy_from_slice(&[9; 16]);
        let err = ReservationState::decode_persistent(&reseal(orphan), &nguid).unwrap_err();
        assert!(err.contains("holder"), "{err}");
        let mut twice = bytes.clone();
        twice.copy_within(
            HEADER_BYTES..HEADER_BYTES + 16,
            HEADER_BYTES + REGISTRANT_BYTES,
        );
        let err = ReservationState::decode_persistent(&reseal(twice), &nguid).unwrap_err();
        assert!(err.contains("twice"), "{err}");
        // Random bytes of every length up to a few registrants.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..200 {
            let junk: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            assert!(ReservationState::decode_persistent(&junk, &nguid).is_err());
        }
    }
}
