//! Disk leases: the rule that lets a node do I/O, and the cluster manager's side of it.
//!
//! This module is pure logic over explicit times ([`ClockTime`]); the daemon feeds it a
//! monotonic clock and the network, the simulation a virtual clock and a simulated network.
//!
//! The protocol, and why it is safe:
//! 1. A node renews every `renew_every` by sending its epoch to the cluster manager and
//!    noting the time it *sent* the request, `t_send`. A grant makes its lease valid until
//!    `t_send + lease − margin` on its own clock. The node does I/O only while its lease is
//!    valid, and stops by itself when it runs out, whether or not it hears anything.
//! 2. The manager answers a renewal only after a leadership confirmation (a Raft
//!    heartbeat round acknowledged by a majority) that *started after the renewal arrived*.
//!    A successor can only be elected by a majority that has stopped acknowledging the old
//!    manager, so every grant by an old manager answers a request sent before its successor
//!    was elected.
//! 3. A manager expels an incarnation only when it has not heard from it for
//!    `failure_detection` (= `lease`), counted from the last renewal it *received*, or from
//!    when it first saw the incarnation (its own takeover, or the incarnation's join). Both
//!    are later than any `t_send` a grant, by it or a predecessor, was based on, so the
//!    node's lease has run out by then. Leases granted before `failureDetectionTime` was
//!    shortened are longer than the new value: the manager waits out the length it granted
//!    and, for grants a predecessor may have made, the longest lease the cluster ever had
//!    in force ([`ConfigState::longest_lease`]). The expel is a Raft entry: once committed, the
//!    epoch is dead for every fenced layer, and the node must join again with a new epoch.
//!    A manager decides an expel from what *it* heard; the decision commits later, maybe
//!    much later (a leader cut off with the entry in its log, elected again after others
//!    managed). So a manager commits `Takeover` for its term before it grants or expels,
//!    an `Expel` carries the deciding manager's term, and one decided before the latest
//!    takeover is refused; and a manager grants nothing to an incarnation it has decided
//!    to expel.
//! 4. Others may take over the expelled node's work `recovery_wait` after the expel, so
//!    I/O the node had in flight when its lease ran out has drained.
//!
//! The margin (1/64 of the lease, at least 1 ms) covers clocks that run at slightly
//! different rates on the node and the manager.

use std::collections::BTreeMap;
use std::ops::{Add, Sub};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::node::NodeNumber;
use crate::params::LeaseTimings;
use crate::state::ConfigState;

/// A point on a monotonic clock, as the time since an arbitrary origin.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct ClockTime(pub Duration);

impl Add<Duration> for ClockTime {
    type Output = ClockTime;
    fn add(self, d: Duration) -> ClockTime {
        ClockTime(self.0 + d)
    }
}

impl Sub<ClockTime> for ClockTime {
    type Output = Duration;
    /// How long after `earlier` this is; zero if it is not later.
    fn sub(self, earlier: ClockTime) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

/// A lease granted by the cluster manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub node: NodeNumber,
    /// The incarnation the grant is for; later layers hand it to drive and NSD servers.
    pub epoch: u64,
    /// The manager's node and Raft term: at most one manager per term.
    pub manager: NodeNumber,
    pub manager_term: u64,
    /// The lease length in force at the manager.
    pub lease: Duration,
}

/// Why the manager did not renew a lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refusal {
    /// The epoch is not the node's live incarnation (expelled, or never joined): the node
    /// must stop I/O and join again.
    NotLive { epoch: u64 },
    /// The responder is not the cluster manager (or cannot confirm it still is).
    NotManager { leader: Option<NodeNumber> },
}

/// What `tessera state` says of a node that answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeState {
    /// Holds a valid lease: may do I/O.
    Active,
    /// Running, but without a valid lease: trying to reach a quorum or the manager.
    Arbitrating,
}

/// The safety margin taken off each lease for clock-rate differences.
pub fn margin(lease: Duration) -> Duration {
    (lease / 64).max(Duration::from_millis(1))
}

/// A node's own view of its lease.
#[derive(Clone, Debug, Default)]
pub struct LeaseHolder {
    epoch: Option<u64>,
    valid_until: Option<ClockTime>,
    /// The manager of the latest grant.
    granted_by: Option<NodeNumber>,
}

impl LeaseHolder {
    /// The epoch of the current incarnation, once joined.
    pub fn epoch(&self) -> Option<u64> {
        self.epoch
    }

    /// A new incarnation: no lease until the first grant.
    pub fn joined(&mut self, epoch: u64) {
        assert!(self.epoch.is_none_or(|e| e < epoch), "epochs only grow");
        self.epoch = Some(epoch);
        self.valid_until = None;
    }

    /// A grant for a renewal sent at `sent_at`. A grant for another epoch is ignored (it
    /// answers a request of a previous incarnation).
    pub fn granted(&mut self, sent_at: ClockTime, grant: &Grant) {
        if Some(grant.epoch) != self.epoch {
            return;
        }
        let until = sent_at + grant.lease.saturating_sub(margin(grant.lease));
        self.granted_by = Some(grant.manager);
        // Grants can arrive out of order; a lease never shrinks because of an older one.
        self.valid_until = Some(self.valid_until.map_or(until, |v| v.max(until)));
    }

    /// The manager says this incarnation is dead: stop I/O now and join again.
    pub fn expelled(&mut self) {
        self.epoch = None;
        self.valid_until = None;
        self.granted_by = None;
    }

    /// The cluster manager that granted the latest lease.
    pub fn granted_by(&self) -> Option<NodeNumber> {
        self.granted_by
    }

    /// Whether the node may submit I/O at `now`.
    pub fn may_do_io(&self, now: ClockTime) -> bool {
        self.epoch.is_some() && self.valid_until.is_some_and(|v| now < v)
    }

    pub fn valid_until(&self) -> Option<ClockTime> {
        self.valid_until
    }

    pub fn state(&self, now: ClockTime) -> NodeState {
        if self.may_do_io(now) {
            NodeState::Active
        } else {
            NodeState::Arbitrating
        }
    }
}

/// What the manager knows of one live incarnation.
#[derive(Clone, Copy, Debug)]
struct Heard {
    epoch: u64,
    /// When its last renewal (or first sighting) arrived.
    at: ClockTime,
    /// The longest lease the node may hold from that point: the length this manager
    /// granted, or, for a first sighting, the longest lease the cluster ever had in force,
    /// because a predecessor may have granted that.
    holds: Duration,
    /// The manager decided to expel it: it gets no grant from now on, since the expel
    /// commits later and a grant in between would outlive the decision.
    expelling: bool,
}

/// The cluster manager's record of who renewed when. One exists per manager term; a new
/// manager starts from nothing, as if every live incarnation renewed at its takeover.
#[derive(Clone, Debug)]
pub struct LeaseManager {
    node: NodeNumber,
    term: u64,
    timings: LeaseTimings,
    heard: BTreeMap<NodeNumber, Heard>,
}

impl LeaseManager {
    pub fn new(node: NodeNumber, term: u64, timings: LeaseTimings) -> LeaseManager {
        LeaseManager {
            node,
            term,
            timings,
            heard: BTreeMap::new(),
        }
    }

    pub fn term(&self) -> u64 {
        self.term
    }

    pub fn set_timings(&mut self, timings: LeaseTimings) {
        self.timings = timings;
    }

    /// Notes incarnations the manager has not seen yet (at takeover, after a join) as heard
    /// at `now`, and forgets incarnations that are gone.
    pub fn observe(&mut self, state: &ConfigState, now: ClockTime) {
        self.heard
            .retain(|node, h| state.epoch_is_live(*node, h.epoch));
        let holds = state.longest_lease().max(self.timings.lease);
        for (node, epoch) in &state.incarnations {
            self.heard.entry(*node).or_insert(Heard {
                epoch: *epoch,
                at: now,
                holds,
                expelling: false,
            });
        }
    }

    /// Answers a renewal that arrived at `received_at`. The caller guarantees that a
    /// leadership confirmation started after `received_at` has succeeded, and that `state`
    /// is applied up to that confirmation.
    pub fn renew(
        &mut self,
        node: NodeNumber,
        epoch: u64,
        received_at: ClockTime,
        state: &ConfigState,
    ) -> Result<Grant, Refusal> {
        if !state.epoch_is_live(node, epoch) {
            return Err(Refusal::NotLive { epoch });
        }
        let lease = self.timings.lease;
        let heard = self.heard.entry(node).or_insert(Heard {
            epoch,
            at: received_at,
            holds: lease,
            expelling: false,
        });
        if heard.epoch != epoch {
            // A new incarnation this manager has not observed yet (its state moved on
            // since): a first sighting, as in `observe`.
            *heard = Heard {
                epoch,
                at: received_at,
                holds: state.longest_lease().max(lease),
                expelling: false,
            };
        }
        if heard.expelling {
            return Err(Refusal::NotLive { epoch });
        }
        if received_at >= heard.at {
            // The new grant supersedes what the node held: after a shorter
            // failureDetectionTime, the node's lease ends no later than this one.
            let previous_end = heard.at + heard.holds;
            heard.at = received_at;
            heard.holds = if received_at + lease >= previous_end {
                lease
            } else {
                previous_end - received_at
            };
        }
        Ok(Grant {
            node,
            epoch,
            manager: self.node,
            manager_term: self.term,
            lease,
        })
    }

    /// Live incarnations whose every lease has run out, with a failure-detection time to
    /// spare: to be expelled. They get no further grant from this manager.
    pub fn overdue(&mut self, now: ClockTime) -> Vec<(NodeNumber, u64)> {
        let detection = self.timings.failure_detection;
        self.heard
            .iter_mut()
            .filter(|(_, h)| h.expelling || now - h.at > h.holds.max(detection))
            .map(|(node, h)| {
                h.expelling = true;
                (*node, h.epoch)
            })
            .collect()
    }

    /// When an incarnation was last heard from, for `state` listings and logs.
    pub fn last_heard(&self, node: NodeNumber) -> Option<ClockTime> {
        self.heard.get(&node).map(|h| h.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::parse_node_list;
    use crate::state::{ClusterIdentity, Command, Response};

    fn t(ms: u64) -> ClockTime {
        ClockTime(Duration::from_millis(ms))
    }

    fn timings() -> LeaseTimings {
        LeaseTimings::new(Duration::from_millis(2000), Duration::from_millis(1000))
    }

    fn cluster_with_joined(node: NodeNumber) -> (ConfigState, u64) {
        let mut s = ConfigState::default();
        s.apply(&Command::Create {
            identity: ClusterIdentity::default(),
            nodes: parse_node_list("a:quorum-manager:10.0.0.1,b::10.0.0.2").unwrap(),
            params: crate::params::parse_changes("failureDetectionTime=2", false).unwrap(),
        });
        let Response::Joined { epoch } = s.apply(&Command::Join { node, process: 1 }) else {
            panic!()
        };
        (s, epoch)
    }

    #[test]
    fn a_lease_runs_from_the_send_time_minus_the_margin() {
        let (s, epoch) = cluster_with_joined(2);
        let mut manager = LeaseManager::new(1, 7, timings());
        manager.observe(&s, t(0));
        let mut holder = LeaseHolder::default();
        holder.joined(epoch);
        assert!(!holder.may_do_io(t(0)), "no I/O before the first grant");
        let grant = manager.renew(2, epoch, t(150), &s).unwrap();
        assert_eq!(grant.manager_term, 7);
        holder.granted(t(100), &grant);
        assert!(holder.may_do_io(t(1900)));
        assert!(!holder.may_do_io(t(100 + 2000 - 31)), "margin is lease/64");
        assert_eq!(holder.state(t(2100)), NodeState::Arbitrating);
    }

    #[test]
    fn an_older_grant_never_shrinks_the_lease() {
        let (s, epoch) = cluster_with_joined(2);
        let mut manager = LeaseManager::new(1, 1, timings());
        let mut holder = LeaseHolder::default();
        holder.joined(epoch);
        let g = manager.renew(2, epoch, t(600), &s).unwrap();
        holder.granted(t(500), &g);
        holder.granted(t(0), &g);
        assert_eq!(
            holder.valid_until(),
            Some(t(500) + (g.lease - margin(g.lease)))
        );
    }

    #[test]
    fn the_manager_expels_only_after_failure_detection_from_the_last_renewal() {
        let (s, epoch) = cluster_with_joined(2);
        let mut manager = LeaseManager::new(1, 1, timings());
        manager.observe(&s, t(0));
        manager.renew(2, epoch, t(1000), &s).unwrap();
        assert!(manager.overdue(t(2999)).is_empty());
        assert!(manager.overdue(t(3000)).is_empty());
        assert_eq!(manager.overdue(t(3001)), vec![(2, epoch)]);
    }

    #[test]
    fn a_shortened_failure_detection_time_waits_out_longer_grants() {
        let (mut s, epoch) = cluster_with_joined(2);
        let mut manager = LeaseManager::new(1, 1, s.params.lease_timings());
        manager.observe(&s, t(0));
        manager.renew(2, epoch, t(100), &s).unwrap();
        let changes = crate::params::parse_changes("failureDetectionTime=1", false).unwrap();
        s.apply(&Command::SetParams {
            nodes: vec![],
            changes,
        });
        manager.set_timings(s.params.lease_timings());
        // The node still holds the 2 s lease granted at 100 ms.
        assert!(manager.overdue(t(2100)).is_empty());
        assert_eq!(manager.overdue(t(2101)), vec![(2, epoch)]);
        // A successor waits out the longest lease ever in force.
        let mut successor = LeaseManager::new(1, 2, s.params.lease_timings());
        successor.observe(&s, t(5000));
        assert!(successor.overdue(t(7000)).is_empty());
        assert_eq!(s.longest_lease(), Duration::from_secs(2));
    }

    #[test]
    fn no_grant_after_the_decision_to_expel() {
        let (s, epoch) = cluster_with_joined(2);
        let mut manager = LeaseManager::new(1, 1, s.params.lease_timings());
        manager.observe(&s, t(0));
        assert_eq!(manager.overdue(t(2001)), vec![(2, epoch)]);
        // The renewal arrives while the expel is being committed: refused.
        assert_eq!(
            manager.renew(2, epoch, t(2002), &s),
            Err(Refusal::NotLive { epoch })
        );
        assert_eq!(
            manager.overdue(t(2003)),
            vec![(2, epoch)],
            "retried until committed"
        );
    }

    #[test]
    fn a_new_manager_counts_from_its_takeover() {
        let (s, epoch) = cluster_with_joined(2);
        let mut successor = LeaseManager::new(1, 2, timings());
        successor.observe(&s, t(10_000));
        assert!(successor.overdue(t(12_000)).is_empty());
        assert_eq!(successor.overdue(t(12_001)), vec![(2, epoch)]);
    }

    #[test]
    fn a_dead_epoch_is_refused_and_forgotten() {
        let (mut s, epoch) = cluster_with_joined(2);
        let mut manager = LeaseManager::new(1, 1, timings());
        manager.observe(&s, t(0));
        s.apply(&Command::Expel {
            node: 2,
            epoch,
            term: 1,
        });
        manager.observe(&s, t(10));
        assert!(manager.overdue(t(100_000)).is_empty());
        assert_eq!(
            manager.renew(2, epoch, t(20), &s),
            Err(Refusal::NotLive { epoch })
        );
        let mut holder = LeaseHolder::default();
        holder.joined(epoch);
        holder.expelled();
        assert!(!holder.may_do_io(t(0)));
        assert!(holder.epoch().is_none());
    }

    #[test]
    fn grants_for_a_previous_incarnation_are_ignored() {
        let (mut s, e1) = cluster_with_joined(2);
        let Response::Joined { epoch: e2 } = s.apply(&Command::Join {
            node: 2,
            process: 2,
        }) else {
            panic!()
        };
        let mut holder = LeaseHolder::default();
        holder.joined(e2);
        let stale = Grant {
            node: 2,
            epoch: e1,
            manager: 1,
            manager_term: 1,
            lease: Duration::from_secs(2),
        };
        holder.granted(t(0), &stale);
        assert!(!holder.may_do_io(t(1)));
    }
}
