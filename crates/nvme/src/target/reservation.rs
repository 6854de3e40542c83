//! Persistent reservations of one namespace (NVMe Base 2.0, 8.19), shared by every
//! controller of the subsystem on every port.
//!
//! Hosts are identified by their 128-bit host identifier (HOSTID of Connect), as the
//! specification requires, so the two paths of one host are one registrant. The state is
//! not persisted (RESCAP.PTPLC is 0): a restart clears it, like a power cycle would.

use crate::wire::reservation::{
    AcquireAction, RegisterAction, Registrant, ReleaseAction, ReservationStatus, ReservationType,
};
use crate::wire::Status;

/// The most registrants per namespace; one per host, so this bounds memory, not clusters.
pub const REGISTRANTS_MAX: usize = 1024;

/// Who is asking: the host identifier and the controller it came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requester {
    /// HOSTID from Connect.
    pub hostid: [u8; 16],
    /// The controller (reported in Reservation Report).
    pub cntlid: u16,
}

#[derive(Debug, Clone, Copy)]
struct Reg {
    hostid: [u8; 16],
    cntlid: u16,
    rkey: u64,
}

/// The reservation state of one namespace.
#[derive(Debug, Default)]
pub struct ReservationState {
    /// Registrants in registration order.
    regs: Vec<Reg>,
    /// The reservation and the host that acquired it. For the all-registrants types every
    /// registrant is a holder and the host recorded here has no special role.
    reservation: Option<(ReservationType, [u8; 16])>,
    generation: u32,
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
        // CPTPL 00b (no change) and 10b (clear) are fine without PTPL support; 11b would
        // ask for persistence this target does not offer.
        if cptpl == 1 || cptpl == 3 {
            return Err(invalid_field());
        }
        let existing = self.find(&who.hostid);
        match (action, existing) {
            (RegisterAction::Register, Some(i)) if self.regs[i].rkey != nrkey => {
                return Err(conflict())
            }
            (RegisterAction::Register, Some(_)) => {}
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
        if holder == who.hostid {
            self.reservation = Some((rtype, who.hostid));
            return Ok(());
        }
        let holder_key = self.find(&holder).map(|i| self.regs[i].rkey);
        if holder_key == Some(prkey) {
            // Take the reservation first so that removing the old holder does not
            // release it.
            self.reservation = Some((rtype, who.hostid));
            self.regs
                .retain(|r| r.rkey != prkey || r.hostid == who.hostid);
            return Ok(());
        }
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
            ptpls: 0,
            registrants,
        }
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
}
