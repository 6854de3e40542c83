//! Asymmetric Namespace Access: the state of each ANA group as seen through one port.
//!
//! Two ports of one server model the two controllers of an array: the same namespace is
//! optimized through one and non-optimized (or inaccessible) through the other, and an
//! operator or test fails over with `DriveServer::set_ana_state`.

use std::collections::{BTreeMap, BTreeSet};

use parking_lot::Mutex;

use super::subsystem::Subsystem;
use crate::wire::log::{AnaGroup, AnaLog, AnaState};
use crate::wire::Status;

#[derive(Debug)]
struct Groups {
    /// Configured groups: state and the change count at its last change.
    states: BTreeMap<u32, (AnaState, u64)>,
    /// Incremented on every change; reported as CHGCNT.
    chgcnt: u64,
}

/// ANA group states of one port. Groups never configured are optimized.
#[derive(Debug)]
pub(crate) struct PortAna {
    groups: Mutex<Groups>,
}

impl PortAna {
    pub fn new(configured: &BTreeMap<u32, AnaState>) -> PortAna {
        let states = configured.iter().map(|(&g, &s)| (g, (s, 0))).collect();
        PortAna {
            groups: Mutex::new(Groups { states, chgcnt: 0 }),
        }
    }

    /// The state of group `grpid` on this port.
    pub fn state(&self, grpid: u32) -> AnaState {
        let groups = self.groups.lock();
        groups
            .states
            .get(&grpid)
            .map_or(AnaState::Optimized, |&(s, _)| s)
    }

    /// Sets a group's state; returns true when it changed.
    pub fn set(&self, grpid: u32, state: AnaState) -> bool {
        let mut groups = self.groups.lock();
        let old = groups.states.get(&grpid).map(|&(s, _)| s);
        if old == Some(state) || (old.is_none() && state == AnaState::Optimized) {
            return false;
        }
        groups.chgcnt += 1;
        let chgcnt = groups.chgcnt;
        groups.states.insert(grpid, (state, chgcnt));
        true
    }

    /// The ANA log page for `subsys` on this port: every group configured on the port or
    /// used by one of the subsystem's namespaces, with its NSIDs unless `groups_only`
    /// (the RGO bit).
    pub fn log(&self, subsys: &Subsystem, groups_only: bool) -> AnaLog {
        let groups = self.groups.lock();
        let mut ids: BTreeSet<u32> = groups.states.keys().copied().collect();
        ids.extend(subsys.namespaces.values().map(|ns| ns.ana_grpid));
        let entries = ids
            .into_iter()
            .map(|grpid| {
                let (state, chgcnt) = groups
                    .states
                    .get(&grpid)
                    .copied()
                    .unwrap_or((AnaState::Optimized, 0));
                let nsids = if groups_only {
                    Vec::new()
                } else {
                    subsys
                        .namespaces
                        .values()
                        .filter(|ns| ns.ana_grpid == grpid)
                        .map(|ns| ns.nsid)
                        .collect()
                };
                AnaGroup {
                    anagrpid: grpid,
                    chgcnt,
                    state,
                    nsids,
                }
            })
            .collect();
        AnaLog {
            chgcnt: groups.chgcnt,
            groups: entries,
        }
    }
}

/// The path status for a command to a namespace in `state`, or `None` when it may run.
/// Path errors carry no DNR: the host retries them on another path.
pub(crate) fn path_status(state: AnaState) -> Option<Status> {
    match state {
        AnaState::Optimized | AnaState::NonOptimized => None,
        AnaState::Inaccessible => Some(Status::ANA_INACCESSIBLE),
        AnaState::PersistentLoss => Some(Status::ANA_PERSISTENT_LOSS),
        AnaState::Change => Some(Status::ANA_TRANSITION),
    }
}
