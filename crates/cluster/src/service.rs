//! One node's cluster service: its Raft member, its disk lease, and — on the node that is
//! the Raft leader — the cluster manager's duties (granting leases, expelling nodes that
//! stop renewing, keeping Raft's voters equal to the quorum nodes).
//!
//! The service is async (openraft is) and reaches other nodes only through [`NodeNet`] and
//! reads time only through [`Clock`], so the daemon runs it over the node transport and a
//! simulation over a simulated network and clock.
//!
//! The cluster manager is the Raft leader. Only manager candidates
//! ([`ConfigState::manager_candidates`]) start elections; other quorum nodes vote but never
//! stand, which is how "the cluster manager is elected among the quorum-manager nodes".

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, Config, ServerState};
use parking_lot::Mutex;

use crate::lease::{ClockTime, Grant, LeaseHolder, LeaseManager, Refusal};
use crate::node::NodeNumber;
use crate::params::LeaseTimings;
use crate::raft::{ConfigRaft, PeerLinks, TypeConfig};
use crate::rpc::{
    FileSystemService, NetError, NodeNet, NodeStatus, PeerReply, PeerRequest, ProposeError,
};
use crate::state::{Command, ConfigState, Response};

/// A node's monotonic clock. `offset` and `rate` let a simulation give each node a clock
/// that started elsewhere and runs a little fast or slow.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: tokio::time::Instant,
    offset: Duration,
    /// Parts per million faster (positive) or slower than the reference.
    rate_ppm: i32,
}

impl Clock {
    pub fn new() -> Clock {
        Clock::skewed(Duration::ZERO, 0)
    }

    pub fn skewed(offset: Duration, rate_ppm: i32) -> Clock {
        Clock {
            origin: tokio::time::Instant::now(),
            offset,
            rate_ppm,
        }
    }

    pub fn now(&self) -> ClockTime {
        let elapsed = self.origin.elapsed();
        let scaled = elapsed.as_nanos() as i128 * (1_000_000 + self.rate_ppm as i128) / 1_000_000;
        ClockTime(self.offset + Duration::from_nanos(scaled.max(0) as u64))
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::new()
    }
}

/// Reads this node's applied copy of the configuration.
pub type StateReader = Arc<dyn Fn() -> ConfigState + Send + Sync>;

/// Raft timings derived from `failureDetectionTime` (F), so one parameter tunes detection:
/// heartbeats every F/32, election timeouts F/8 to F/4. openraft lets a follower stand
/// only once its leader's lease (the longest election timeout) has also run out since
/// the last heartbeat, so a new cluster manager is elected 3F/8 to F/2 after the old one
/// died: before the disk leases it granted (F from a renewal sent every F/4, so at least
/// 3F/4 after its death) run out, and survivors keep doing I/O through a failover.
pub fn raft_config(timings: &LeaseTimings, cluster_name: &str) -> Config {
    let f = timings.failure_detection.as_millis().max(64) as u64;
    Config {
        cluster_name: cluster_name.to_string(),
        heartbeat_interval: f / 32,
        election_timeout_min: f / 8,
        election_timeout_max: f / 4,
        // The configuration is small: snapshot often so a new node catches up from one.
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(1000),
        max_in_snapshot_log_to_keep: 100,
        ..Config::default()
    }
}

/// The cluster service of one node.
pub struct ClusterNode<N: NodeNet> {
    me: NodeNumber,
    /// Drawn once per start: identifies this process's Join (see `Command::Join`).
    process: u64,
    raft: ConfigRaft,
    net: Arc<N>,
    read_state: StateReader,
    clock: Clock,
    holder: Mutex<LeaseHolder>,
    manager: Mutex<Option<LeaseManager>>,
    /// When the last leadership confirmation that succeeded had started.
    confirmed_from: tokio::sync::Mutex<Option<ClockTime>>,
    /// A membership change (`reconcile_membership`) is running.
    membership_busy: AtomicBool,
    /// Who answers other nodes' file-system requests (set by the daemon).
    file_systems: std::sync::OnceLock<Arc<dyn FileSystemService>>,
}

/// How often a node without a lease asks for one, and a quorum node that does not manage
/// checks whether it leads.
pub const UNLEASED_POLL: Duration = Duration::from_millis(200);

/// How long a forwarded or local proposal may take before the admin is told.
pub const PROPOSE_TIMEOUT: Duration = Duration::from_secs(30);

impl<N: NodeNet> ClusterNode<N> {
    /// Starts the Raft member over the given stores. `process` is a random number drawn
    /// for this start; `read_state` reads the state machine store's applied copy.
    #[allow(clippy::too_many_arguments)]
    pub async fn start<LS, SM>(
        me: NodeNumber,
        process: u64,
        config: Config,
        net: Arc<N>,
        log_store: LS,
        state_machine: SM,
        read_state: StateReader,
        clock: Clock,
    ) -> anyhow::Result<Arc<ClusterNode<N>>>
    where
        LS: openraft::storage::RaftLogStorage<TypeConfig>,
        SM: openraft::storage::RaftStateMachine<TypeConfig>,
    {
        let config = Arc::new(config.validate()?);
        let links = PeerLinks::new(Arc::clone(&net));
        let raft = ConfigRaft::new(u64::from(me), config, links, log_store, state_machine).await?;
        let node = Arc::new(ClusterNode {
            me,
            process,
            raft,
            net,
            read_state,
            clock,
            holder: Mutex::new(LeaseHolder::default()),
            manager: Mutex::new(None),
            confirmed_from: tokio::sync::Mutex::new(None),
            membership_busy: AtomicBool::new(false),
            file_systems: std::sync::OnceLock::new(),
        });
        node.update_electability();
        Ok(node)
    }

    pub fn me(&self) -> NodeNumber {
        self.me
    }

    pub fn raft(&self) -> &ConfigRaft {
        &self.raft
    }

    pub fn state(&self) -> ConfigState {
        (self.read_state)()
    }

    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// Makes the first configuration of a new cluster: the quorum nodes become the voters,
    /// and `create` is proposed until a majority of them commit it. Safe to repeat.
    pub async fn bootstrap(&self, create: &Command) -> Result<Response, ProposeError> {
        let Command::Create { nodes, .. } = create else {
            panic!("bootstrap takes a Create command");
        };
        if self.state().identity.is_some() {
            return Ok(Response::Nothing);
        }
        let mut voters = BTreeMap::new();
        for (number, spec) in (1..).zip(nodes) {
            if spec.designation.quorum {
                voters.insert(number, BasicNode::new(&spec.address));
            }
        }
        // Refused once initialized (by us earlier, or by a leader's first message): fine.
        if let Err(e) = self.raft.initialize(voters).await {
            tracing::debug!("raft initialize: {e}");
        }
        self.propose(create.clone(), PROPOSE_TIMEOUT).await
    }

    /// Commits `command` through the cluster manager, from any node.
    pub async fn propose(
        &self,
        command: Command,
        timeout: Duration,
    ) -> Result<Response, ProposeError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let leader = self.raft.metrics().borrow().current_leader;
            let outcome = match leader {
                Some(l) if l == u64::from(self.me) => {
                    // A leader cut off from its majority never commits: bound the wait.
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    tokio::time::timeout(left, self.propose_here(&command))
                        .await
                        .unwrap_or(Err(ProposeError::NoQuorum))
                }
                Some(l) => self.propose_at(l, &command, deadline).await,
                None => Err(ProposeError::NoQuorum),
            };
            match outcome {
                Err(ProposeError::NotManager { .. } | ProposeError::NoQuorum)
                    if tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(ProposeError::NotManager { .. }) => return Err(ProposeError::NoQuorum),
                other => return other,
            }
        }
    }

    async fn propose_here(&self, command: &Command) -> Result<Response, ProposeError> {
        match self.raft.client_write(command.clone()).await {
            Ok(written) => Ok(written.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(ProposeError::NotManager {
                    asked: self.me,
                    leader: f.leader_id.map(|l| l as NodeNumber),
                })
            }
            Err(e) => Err(ProposeError::Stopping(e.to_string())),
        }
    }

    async fn propose_at(
        &self,
        leader: u64,
        command: &Command,
        deadline: tokio::time::Instant,
    ) -> Result<Response, ProposeError> {
        let Some(address) = self.address_of(leader) else {
            return Err(ProposeError::NoQuorum);
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let request = PeerRequest::Propose(command.clone());
        match self
            .net
            .call(leader as NodeNumber, &address, request, left)
            .await
        {
            Ok(PeerReply::Proposed(result)) => result,
            Ok(_) => Err(ProposeError::Stopping(format!(
                "node {leader} answered a proposal with another message"
            ))),
            // The proposal may or may not have been committed; the retry of an admin
            // command is refused or harmless (duplicate names, compare-and-set versions).
            Err(_) => Err(ProposeError::NoQuorum),
        }
    }

    /// The daemon address of a Raft member, from the node table (which `node change
    /// --address` changes) or, before the first configuration is committed, the membership.
    fn address_of(&self, node: u64) -> Option<String> {
        if let Some(n) = self.state().nodes.get(&(node as NodeNumber)) {
            return Some(n.address.clone());
        }
        let metrics = self.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        membership.get_node(&node).map(|n| n.addr.clone())
    }

    /// Answers a request from another node.
    pub async fn handle(&self, request: PeerRequest) -> PeerReply {
        match request {
            PeerRequest::Append(rpc) => PeerReply::Append(self.raft.append_entries(rpc).await),
            PeerRequest::Vote(rpc) => PeerReply::Vote(self.raft.vote(rpc).await),
            PeerRequest::Snapshot(rpc) => {
                PeerReply::Snapshot(self.raft.install_snapshot(rpc).await)
            }
            PeerRequest::Propose(command) => PeerReply::Proposed(self.propose_here(&command).await),
            PeerRequest::Renew { node, epoch } => {
                let received_at = self.clock.now();
                PeerReply::Renewed(self.renew(node, epoch, received_at).await)
            }
            PeerRequest::Status => PeerReply::Status(self.status()),
            PeerRequest::FileSystem {
                from,
                epoch,
                fs,
                slot,
                request,
            } => PeerReply::FileSystem(
                self.file_system_request(from, epoch, (fs, slot), request)
                    .await,
            ),
        }
    }

    /// Lets `service` answer other nodes' file-system requests; the first one set stays.
    pub fn serve_file_systems(&self, service: Arc<dyn FileSystemService>) {
        let _ = self.file_systems.set(service);
    }

    async fn file_system_request(
        &self,
        from: NodeNumber,
        epoch: u64,
        (fs, slot): (String, u32),
        request: Vec<u8>,
    ) -> Result<Vec<u8>, String> {
        let service = self.file_system_service(from, epoch)?;
        tokio::task::spawn_blocking(move || service.call((from, epoch), (&fs, slot), request))
            .await
            .unwrap_or_else(|e| Err(format!("the file-system request failed: {e}")))
    }

    /// [`PeerRequest::FileSystem`] answered on the calling thread, which may block: a
    /// thread that serves one connection (`net::serve_connection`), never the runtime's.
    pub fn file_system_request_blocking(
        &self,
        from: NodeNumber,
        epoch: u64,
        (fs, slot): (&str, u32),
        request: Vec<u8>,
    ) -> Result<Vec<u8>, String> {
        self.file_system_service(from, epoch)?
            .call((from, epoch), (fs, slot), request)
    }

    /// Who answers file-system requests of `from` in `epoch`, if it is a live member.
    fn file_system_service(
        &self,
        from: NodeNumber,
        epoch: u64,
    ) -> Result<Arc<dyn FileSystemService>, String> {
        if !self.state().epoch_is_live(from, epoch) {
            return Err(format!(
                "node {from} in epoch {epoch} is not a live member of the cluster (expelled, \
                 or restarted since); its file-system requests are refused until it joins \
                 again"
            ));
        }
        self.file_systems
            .get()
            .cloned()
            .ok_or_else(|| format!("node {} serves no file system yet", self.me))
    }

    /// The manager's answer to a renewal (see [`crate::lease`] for why it is safe).
    async fn renew(
        &self,
        node: NodeNumber,
        epoch: u64,
        received_at: ClockTime,
    ) -> Result<Grant, Refusal> {
        let term = self.manager.lock().as_ref().map(|m| m.term());
        let not_manager = || Refusal::NotManager {
            leader: self
                .raft
                .metrics()
                .borrow()
                .current_leader
                .map(|l| l as NodeNumber),
        };
        let Some(term) = term else {
            return Err(not_manager());
        };
        if !self.confirm_leadership_after(received_at).await {
            return Err(not_manager());
        }
        let state = self.state();
        let mut manager = self.manager.lock();
        match manager.as_mut() {
            Some(m) if m.term() == term => {
                m.set_timings(state.params.lease_timings());
                m.renew(node, epoch, received_at, &state)
            }
            _ => Err(not_manager()),
        }
    }

    /// Whether a leadership confirmation that started at or after `since` has succeeded.
    /// Concurrent renewals share one confirmation round.
    async fn confirm_leadership_after(&self, since: ClockTime) -> bool {
        let mut confirmed_from = self.confirmed_from.lock().await;
        if confirmed_from.is_some_and(|c| c >= since) {
            return true;
        }
        let started = self.clock.now();
        // Also waits until the state machine has applied everything committed before the
        // confirmation, so the grant uses the parameters in force.
        let round = self.raft.ensure_linearizable();
        match tokio::time::timeout(self.timings().renew_every, round).await {
            Ok(Ok(_)) => {
                *confirmed_from = Some(started);
                true
            }
            Ok(Err(_)) | Err(_) => false,
        }
    }

    /// This node's report of itself.
    pub fn status(&self) -> NodeStatus {
        let metrics = self.raft.metrics().borrow().clone();
        let holder = self.holder.lock();
        NodeStatus {
            node: self.me,
            state: holder.state(self.clock.now()),
            epoch: holder.epoch(),
            manager: metrics.current_leader.map(|l| l as NodeNumber),
            term: metrics.current_term,
            config_version: self.state().version,
        }
    }

    /// Whether this node may submit I/O now: it holds a valid disk lease.
    pub fn may_do_io(&self) -> bool {
        self.holder.lock().may_do_io(self.clock.now())
    }

    /// The epoch of this node's incarnation, while it holds a lease.
    pub fn io_epoch(&self) -> Option<u64> {
        let holder = self.holder.lock();
        holder
            .may_do_io(self.clock.now())
            .then(|| holder.epoch())
            .flatten()
    }

    /// Runs the lease holder and, while leader, the cluster manager, until the Raft member
    /// stops.
    pub async fn run(self: Arc<Self>) {
        let holder = tokio::spawn(Arc::clone(&self).run_holder());
        let manager = tokio::spawn(Arc::clone(&self).run_manager());
        let _ = tokio::join!(holder, manager);
    }

    fn timings(&self) -> LeaseTimings {
        self.state().params.lease_timings()
    }

    fn running(&self) -> bool {
        self.raft.metrics().borrow().running_state.is_ok()
    }

    /// Joins (gets an epoch) and renews the lease every `renew_every`.
    async fn run_holder(self: Arc<Self>) {
        while self.running() {
            let timings = self.timings();
            self.update_electability();
            if self.state().nodes.contains_key(&self.me) {
                let joined_before = self.holder.lock().epoch().is_some();
                self.renew_once(&timings).await;
                // A new incarnation asks for its first lease at once rather than a renewal
                // period later: a starting daemon waits for it before it mounts.
                if !joined_before && self.holder.lock().epoch().is_some() {
                    continue;
                }
            }
            // A node without a lease, or whose lease comes from a manager that is no longer
            // the leader, asks often, so it holds a lease from the new manager soon after
            // that one takes over; otherwise it renews every renewal period, or at once
            // when the leader changes.
            let leader = self.raft.metrics().borrow().current_leader;
            let current = {
                let holder = self.holder.lock();
                holder.granted_by().map(u64::from) == leader
            };
            let period = if self.may_do_io() && current {
                timings.renew_every
            } else {
                timings.renew_every.min(UNLEASED_POLL)
            };
            self.sleep_or_leader_change(period).await;
        }
    }

    /// Sleeps `period`, or less if the Raft leader changes meanwhile.
    async fn sleep_or_leader_change(&self, period: Duration) {
        let mut metrics = self.raft.metrics();
        let leader = metrics.borrow_and_update().current_leader;
        let wake = tokio::time::Instant::now() + period;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(wake) => return,
                changed = metrics.changed() => {
                    if changed.is_err() || metrics.borrow_and_update().current_leader != leader {
                        return;
                    }
                }
            }
        }
    }

    async fn renew_once(&self, timings: &LeaseTimings) {
        let epoch = self.holder.lock().epoch();
        let Some(epoch) = epoch else {
            match self
                .propose(
                    Command::Join {
                        node: self.me,
                        process: self.process,
                    },
                    timings.renew_every,
                )
                .await
            {
                Ok(Response::Joined { epoch }) => {
                    tracing::info!(epoch, "joined the cluster");
                    self.holder.lock().joined(epoch);
                }
                Ok(other) => tracing::warn!("join refused: {other:?}"),
                Err(e) => tracing::debug!("cannot join yet: {e}"),
            }
            return;
        };
        let leader = self.raft.metrics().borrow().current_leader;
        let Some(leader) = leader else { return };
        let sent_at = self.clock.now();
        let answer = if leader == u64::from(self.me) {
            self.renew(self.me, epoch, sent_at).await
        } else {
            let Some(address) = self.address_of(leader) else {
                return;
            };
            let request = PeerRequest::Renew {
                node: self.me,
                epoch,
            };
            match self
                .net
                .call(leader as NodeNumber, &address, request, timings.renew_every)
                .await
            {
                Ok(PeerReply::Renewed(answer)) => answer,
                Ok(_) => return,
                Err(e) => {
                    tracing::debug!("lease renewal: {e}");
                    return;
                }
            }
        };
        match answer {
            Ok(grant) => self.holder.lock().granted(sent_at, &grant),
            Err(Refusal::NotLive { epoch }) => {
                tracing::warn!(
                    epoch,
                    "the cluster manager expelled this node; joining again"
                );
                self.holder.lock().expelled();
            }
            Err(Refusal::NotManager { .. }) => {}
        }
    }

    /// While this node is the Raft leader: keeps a lease manager for its term, expels
    /// overdue incarnations, and keeps Raft's membership equal to the node table.
    async fn run_manager(self: Arc<Self>) {
        while self.running() {
            let timings = self.timings();
            self.manage_once(&timings).await;
            // Checking leadership is cheap; taking over soon after an election shortens
            // failover, so a node that does not manage looks often.
            let period = (timings.renew_every / 2).max(Duration::from_millis(10));
            if self.manager.lock().is_some() {
                tokio::time::sleep(period).await;
            } else {
                self.sleep_or_leader_change(period.min(UNLEASED_POLL)).await;
            }
        }
    }

    async fn manage_once(self: &Arc<Self>, timings: &LeaseTimings) {
        let metrics = self.raft.metrics().borrow().clone();
        let leading = metrics.state == ServerState::Leader
            && metrics.current_leader == Some(u64::from(self.me));
        if !leading {
            *self.manager.lock() = None;
            self.raft.runtime_config().heartbeat(true);
            return;
        }
        if !self.is_manager_candidate() {
            // Demoted (`node change --nonquorum` or `--client`) while leading: stop managing
            // and stop the heartbeats, so the followers elect a candidate (openraft 0.9 has
            // no leadership transfer); the new leader then takes this node off the voters.
            if self.manager.lock().take().is_some() {
                tracing::info!("no longer a manager candidate: letting another node manage");
            }
            self.raft.runtime_config().heartbeat(false);
            return;
        }
        self.raft.runtime_config().heartbeat(true);
        let term = metrics.current_term;
        let managing = self.manager.lock().as_ref().map(|m| m.term()) == Some(term);
        if !managing && !self.take_over(term, timings).await {
            return;
        }
        let state = self.state();
        let now = self.clock.now();
        let overdue = {
            let mut manager = self.manager.lock();
            let Some(m) = manager.as_mut().filter(|m| m.term() == term) else {
                return;
            };
            m.set_timings(*timings);
            m.observe(&state, now);
            m.overdue(now)
        };
        for (node, epoch) in overdue {
            tracing::warn!(
                node,
                epoch,
                "node missed failureDetectionTime; expelling it"
            );
            let expel = Command::Expel { node, epoch, term };
            let bounded =
                tokio::time::timeout(timings.failure_detection, self.propose_here(&expel));
            match bounded.await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(node, "expel not committed: {e}"),
                Err(_) => tracing::warn!(node, "expel not committed: no majority answers"),
            }
        }
        // A membership change runs to its end in its own task: cut short between its two
        // steps, it would leave Raft in a joint configuration. One at a time.
        if !self.membership_busy.swap(true, Ordering::AcqRel) {
            let node = Arc::clone(self);
            tokio::spawn(async move {
                node.reconcile_membership(&state, &metrics).await;
                node.membership_busy.store(false, Ordering::Release);
            });
        }
    }

    /// Commits `Takeover` for this term before managing: until then this node grants and
    /// expels nothing (see `Command::Takeover`). Returns whether it now manages.
    async fn take_over(&self, term: u64, timings: &LeaseTimings) -> bool {
        *self.manager.lock() = None;
        if self.state().identity.is_none() {
            return false;
        }
        let takeover = Command::Takeover {
            node: self.me,
            term,
        };
        let bounded = tokio::time::timeout(timings.failure_detection, self.propose_here(&takeover));
        match bounded.await {
            Ok(Ok(Response::Changed { .. })) => {}
            Ok(other) => {
                tracing::debug!("takeover of term {term} not committed: {other:?}");
                return false;
            }
            Err(_) => return false,
        }
        tracing::info!(term, "this node is the cluster manager");
        let mut manager = LeaseManager::new(self.me, term, *timings);
        manager.observe(&self.state(), self.clock.now());
        *self.manager.lock() = Some(manager);
        true
    }

    /// Makes Raft's members the node table: quorum nodes vote, the rest learn.
    async fn reconcile_membership(
        &self,
        state: &ConfigState,
        metrics: &openraft::RaftMetrics<u64, BasicNode>,
    ) {
        if state.identity.is_none() {
            return;
        }
        let membership = metrics.membership_config.membership();
        // A joint configuration left by a change cut short (its leader lost leadership
        // between the two steps) is finished by the next change below.
        let joint = membership.get_joint_config().len() > 1;
        let members: BTreeSet<u64> = membership.nodes().map(|(id, _)| *id).collect();
        for node in state.nodes.values() {
            if !members.contains(&u64::from(node.number)) {
                let basic = BasicNode::new(&node.address);
                if let Err(e) = self
                    .raft
                    .add_learner(node.number.into(), basic, false)
                    .await
                {
                    tracing::warn!(node = node.number, "cannot add as learner: {e}");
                    return;
                }
            }
        }
        let voters: BTreeSet<u64> = state.quorum_nodes().map(|n| n.number.into()).collect();
        let current: BTreeSet<u64> = membership.voter_ids().collect();
        if voters != current || joint {
            tracing::info!(?voters, "changing the Raft voters to the quorum nodes");
            if let Err(e) = self.raft.change_membership(voters, true).await {
                tracing::warn!("voter change not committed: {e}");
                return;
            }
        }
        // `node change --address`: the Raft links follow the node table.
        let moved: BTreeMap<u64, BasicNode> = state
            .nodes
            .values()
            .filter(|n| {
                membership
                    .get_node(&u64::from(n.number))
                    .is_some_and(|b| b.addr != n.address)
            })
            .map(|n| (u64::from(n.number), BasicNode::new(&n.address)))
            .collect();
        if !moved.is_empty() {
            tracing::info!(?moved, "nodes have new daemon addresses");
            if let Err(e) = self
                .raft
                .change_membership(ChangeMembers::SetNodes(moved), false)
                .await
            {
                tracing::warn!("address change not committed: {e}");
                return;
            }
        }
        let gone: BTreeSet<u64> = members
            .iter()
            .filter(|id| !state.nodes.contains_key(&(**id as NodeNumber)))
            .copied()
            .collect();
        if !gone.is_empty() {
            let change = ChangeMembers::RemoveNodes(gone);
            if let Err(e) = self.raft.change_membership(change, false).await {
                tracing::warn!("removing deleted nodes from Raft: {e}");
            }
        }
    }

    /// Only manager candidates stand for election.
    pub fn update_electability(&self) {
        self.raft
            .runtime_config()
            .elect(self.is_manager_candidate());
    }

    fn is_manager_candidate(&self) -> bool {
        let state = self.state();
        state.identity.is_none() || state.manager_candidates().contains(&self.me)
    }

    /// Stops the Raft member; `run` returns.
    pub async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
    }
}

/// Maps a transport failure for callers that only need "no answer".
pub fn unreachable(node: NodeNumber, why: impl std::fmt::Display) -> NetError {
    NetError::Unreachable(node, why.to_string())
}
