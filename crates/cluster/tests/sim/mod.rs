//! A simulated cluster: real cluster services (openraft, the redb stores, the lease logic)
//! on one single-threaded tokio runtime with a paused clock, talking over a simulated
//! network that delays, drops, partitions and freezes nodes as a seeded schedule says.
//!
//! Every fault and delay comes from one seeded generator, and virtual time only moves when
//! every task waits, so a schedule's faults are reproducible from its seed. (tokio's own
//! `select!` branch order is not seeded on stable Rust, so the interleaving inside openraft
//! can still differ between two runs of one seed.)

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera_cluster::lease::NodeState;
use tessera_cluster::node::{parse_node_list, NodeNumber, NodeSpec};
use tessera_cluster::params::LeaseTimings;
use tessera_cluster::raft::TypeConfig;
use tessera_cluster::rpc::{NetError, NodeNet, PeerReply, PeerRequest};
use tessera_cluster::service::{raft_config, Clock, ClusterNode, StateReader};
use tessera_cluster::state::{ClusterIdentity, Command, ConfigState, Response};

pub type SimNode = ClusterNode<Endpoint>;

/// What the network does to messages, shared by every endpoint.
pub struct Fabric {
    nodes: Mutex<BTreeMap<NodeNumber, Weak<SimNode>>>,
    /// Nodes in different groups cannot talk.
    groups: Mutex<BTreeMap<NodeNumber, u32>>,
    /// Frozen nodes neither send nor receive until thawed (a stalled process or VM).
    frozen: Mutex<BTreeSet<NodeNumber>>,
    rng: Mutex<StdRng>,
    pub max_delay: Duration,
    /// Per mille of messages lost.
    pub loss_per_mille: u32,
    /// Every grant seen on the wire, by manager term: at most one manager per term.
    pub grants_by_term: Mutex<BTreeMap<u64, NodeNumber>>,
    pub violations: Mutex<Vec<String>>,
}

impl Fabric {
    fn reachable(&self, from: NodeNumber, to: NodeNumber) -> bool {
        let groups = self.groups.lock();
        let frozen = self.frozen.lock();
        groups.get(&from) == groups.get(&to) && !frozen.contains(&from) && !frozen.contains(&to)
    }

    fn delay(&self) -> Duration {
        let micros = self.max_delay.as_micros() as u64;
        Duration::from_micros(self.rng.lock().gen_range(0..=micros))
    }

    fn lost(&self) -> bool {
        self.rng.lock().gen_range(0..1000) < self.loss_per_mille
    }

    fn record_grant(&self, reply: &PeerReply) {
        if let PeerReply::Renewed(Ok(grant)) = reply {
            let mut by_term = self.grants_by_term.lock();
            let manager = *by_term.entry(grant.manager_term).or_insert(grant.manager);
            if manager != grant.manager {
                self.violations.lock().push(format!(
                    "two managers granted leases in term {}: nodes {manager} and {}",
                    grant.manager_term, grant.manager
                ));
            }
        }
    }
}

/// One node's connection to the fabric.
pub struct Endpoint {
    me: NodeNumber,
    fabric: Arc<Fabric>,
}

impl NodeNet for Endpoint {
    async fn call(
        &self,
        to: NodeNumber,
        _address: &str,
        request: PeerRequest,
        timeout: Duration,
    ) -> Result<PeerReply, NetError> {
        let fabric = Arc::clone(&self.fabric);
        let me = self.me;
        let exchange = async move {
            tokio::time::sleep(fabric.delay()).await;
            if !fabric.reachable(me, to) || fabric.lost() {
                // A lost message looks like silence until the caller's timeout.
                std::future::pending::<()>().await;
            }
            let target = fabric.nodes.lock().get(&to).and_then(Weak::upgrade);
            let Some(target) = target else {
                return Err(NetError::Unreachable(to, "connection refused".into()));
            };
            let reply = target.handle(request).await;
            drop(target);
            tokio::time::sleep(fabric.delay()).await;
            if !fabric.reachable(me, to) || fabric.lost() {
                std::future::pending::<()>().await;
            }
            fabric.record_grant(&reply);
            Ok(reply)
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(NetError::Timeout(to, timeout)),
        }
    }
}

/// One simulated node: its store file and, while up, its service.
struct Member {
    spec: NodeSpec,
    store: PathBuf,
    clock: Clock,
    election_timeout_ms: u64,
    running: Option<(Arc<SimNode>, tokio::task::JoinHandle<()>)>,
}

/// A simulated cluster.
pub struct Sim {
    pub seed: u64,
    rng: StdRng,
    _dir: tempfile::TempDir,
    pub fabric: Arc<Fabric>,
    members: BTreeMap<NodeNumber, Member>,
    pub timings: LeaseTimings,
    create: Command,
    /// Keys of documents whose write was acknowledged: they must survive everything.
    pub acknowledged: Vec<String>,
    writes: u64,
}

impl Sim {
    /// `quorum` quorum-manager nodes and `clients` client nodes, all down.
    pub fn new(seed: u64, quorum: u32, clients: u32) -> Sim {
        let mut rng = StdRng::seed_from_u64(seed);
        let dir = tempfile::Builder::new()
            .prefix("tessera-sim")
            .tempdir_in(shm_or_tmp())
            .expect("temporary directory");
        let list: Vec<String> = (1..=quorum + clients)
            .map(|n| {
                let designation = if n <= quorum { "quorum-manager" } else { "" };
                format!("node{n}:{designation}:10.77.0.{n}")
            })
            .collect();
        let specs = parse_node_list(&list.join(",")).expect("node list");
        let fabric = Arc::new(Fabric {
            nodes: Mutex::new(BTreeMap::new()),
            groups: Mutex::new(BTreeMap::new()),
            frozen: Mutex::new(BTreeSet::new()),
            rng: Mutex::new(StdRng::seed_from_u64(rng.gen())),
            max_delay: Duration::from_millis(rng.gen_range(1..=40)),
            loss_per_mille: rng.gen_range(0..=20),
            grants_by_term: Mutex::new(BTreeMap::new()),
            violations: Mutex::new(Vec::new()),
        });
        let timings = LeaseTimings::new(Duration::from_secs(2), Duration::from_millis(500));
        let mut members = BTreeMap::new();
        for (number, spec) in (1..).zip(specs.iter()) {
            let offset = Duration::from_millis(rng.gen_range(0..100_000));
            let members_clock = Clock::skewed(offset, rng.gen_range(-1000..=1000));
            members.insert(
                number,
                Member {
                    spec: spec.clone(),
                    store: dir.path().join(format!("node{number}.redb")),
                    clock: members_clock,
                    election_timeout_ms: 0,
                    running: None,
                },
            );
        }
        // Test timings, as `cluster create --config` gives them.
        let text = format!(
            "failureDetectionTime={},leaseRecoveryWait={}",
            timings.failure_detection.as_secs_f64(),
            timings.recovery_wait.as_secs_f64()
        );
        let create = Command::Create {
            identity: ClusterIdentity {
                name: "sim".into(),
                id: format!("{seed:032x}"),
                created_unix: 0,
                remote_shell: "true".into(),
            },
            nodes: specs,
            params: tessera_cluster::params::parse_changes(&text, false).expect("valid"),
        };
        Sim {
            seed,
            rng,
            _dir: dir,
            fabric,
            members,
            timings,
            create,
            acknowledged: Vec::new(),
            writes: 0,
        }
    }

    pub fn numbers(&self) -> Vec<NodeNumber> {
        self.members.keys().copied().collect()
    }

    pub fn quorum_numbers(&self) -> Vec<NodeNumber> {
        self.members
            .iter()
            .filter(|(_, m)| m.spec.designation.quorum)
            .map(|(n, _)| *n)
            .collect()
    }

    pub fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }

    pub fn is_up(&self, node: NodeNumber) -> bool {
        self.members[&node].running.is_some()
    }

    /// Starts a node's service from its store (a fresh store the first time).
    pub async fn start(&mut self, node: NodeNumber) {
        if self.is_up(node) {
            return;
        }
        let timeout_ms = self.rng.gen_range(500..1000);
        let member = self.members.get_mut(&node).expect("known node");
        member.election_timeout_ms = timeout_ms;
        let mut config = raft_config(&self.timings, "sim");
        // openraft draws election timeouts from an unseeded generator: give it a range of
        // one value, drawn here from the seed.
        config.election_timeout_min = timeout_ms;
        config.election_timeout_max = timeout_ms + 1;
        let (log, machine) = open_store(&member.store).await;
        let reader_handle = machine.clone();
        let read_state: StateReader = Arc::new(move || reader_handle.state());
        let endpoint = Arc::new(Endpoint {
            me: node,
            fabric: Arc::clone(&self.fabric),
        });
        let process = self.rng.gen();
        let service = ClusterNode::start(
            node,
            process,
            config,
            endpoint,
            log,
            machine,
            read_state,
            member.clock,
        )
        .await
        .expect("cluster service starts");
        self.fabric
            .nodes
            .lock()
            .insert(node, Arc::downgrade(&service));
        let task = tokio::spawn(Arc::clone(&service).run());
        member.running = Some((service, task));
    }

    /// kill -9: the service stops at once; only what its store made durable remains.
    pub async fn kill(&mut self, node: NodeNumber) {
        let member = self.members.get_mut(&node).expect("known node");
        if let Some((service, task)) = member.running.take() {
            self.fabric.nodes.lock().remove(&node);
            task.abort();
            service.shutdown().await;
            drop(service);
        }
    }

    pub fn node(&self, node: NodeNumber) -> Option<Arc<SimNode>> {
        self.members[&node]
            .running
            .as_ref()
            .map(|(s, _)| Arc::clone(s))
    }

    /// Cuts `side` off from the rest.
    pub fn partition(&self, side: &[NodeNumber]) {
        let mut groups = self.fabric.groups.lock();
        groups.clear();
        for n in side {
            groups.insert(*n, 1);
        }
    }

    pub fn heal(&self) {
        self.fabric.groups.lock().clear();
        self.fabric.frozen.lock().clear();
    }

    pub fn freeze(&self, node: NodeNumber) {
        self.fabric.frozen.lock().insert(node);
    }

    pub fn thaw(&self, node: NodeNumber) {
        self.fabric.frozen.lock().remove(&node);
    }

    /// Creates the cluster from node 1 (which must be up with a majority of quorum nodes).
    pub async fn bootstrap(&mut self) -> Response {
        let service = self.node(1).expect("node 1 is up");
        service
            .bootstrap(&self.create)
            .await
            .expect("bootstrap commits")
    }

    /// Proposes a unique document write from a random running node; remembers it if the
    /// cluster acknowledged it.
    pub async fn write_document(&mut self) {
        let up: Vec<NodeNumber> = self
            .numbers()
            .into_iter()
            .filter(|n| self.is_up(*n))
            .collect();
        if up.is_empty() {
            return;
        }
        let from = up[self.rng.gen_range(0..up.len())];
        let service = self.node(from).expect("up");
        self.writes += 1;
        let key = format!("doc-{}", self.writes);
        let command = Command::PutDocument {
            key: key.clone(),
            expected: 0,
            json: format!("{{\"write\":{}}}", self.writes),
        };
        if let Ok(Response::Changed { .. }) = service.propose(command, Duration::from_secs(3)).await
        {
            self.acknowledged.push(key);
        }
    }

    /// The most advanced applied configuration among running nodes.
    pub fn newest_state(&self) -> Option<ConfigState> {
        self.members
            .values()
            .filter_map(|m| m.running.as_ref())
            .map(|(s, _)| s.state())
            .max_by_key(|s| s.version)
    }

    /// The safety checks that must hold at every instant.
    pub fn check_invariants(&self) {
        let Some(newest) = self.newest_state() else {
            return;
        };
        for (number, member) in &self.members {
            let Some((service, _)) = &member.running else {
                continue;
            };
            let Some(epoch) = service.io_epoch() else {
                continue;
            };
            let replaced = newest.next_epoch > epoch && !newest.epoch_is_live(*number, epoch);
            if replaced {
                self.fabric.violations.lock().push(format!(
                    "node {number} may do I/O with epoch {epoch}, which the committed \
                     configuration (version {}) has expelled; node status {:?}, clock {:?}",
                    newest.version,
                    service.status(),
                    service.clock().now()
                ));
            }
        }
    }

    /// Runs for `span` of virtual time, checking invariants every `step`.
    pub async fn run_for(&self, span: Duration) {
        let step = Duration::from_millis(20);
        let mut elapsed = Duration::ZERO;
        while elapsed < span {
            tokio::time::sleep(step).await;
            elapsed += step;
            self.check_invariants();
        }
    }

    /// Whether every running node is active under one manager.
    pub fn all_active(&self) -> bool {
        let mut managers = BTreeSet::new();
        for member in self.members.values() {
            let Some((service, _)) = &member.running else {
                return false;
            };
            let status = service.status();
            if status.state != NodeState::Active {
                return false;
            }
            managers.insert(status.manager);
        }
        managers.len() == 1 && !managers.contains(&None)
    }

    pub fn violations(&self) -> Vec<String> {
        self.fabric.violations.lock().clone()
    }

    /// Stops every node so the runtime can end.
    pub async fn stop_all(&mut self) {
        for node in self.numbers() {
            self.kill(node).await;
        }
    }
}

/// Opens a node's store, waiting for the previous incarnation to let go of the file.
async fn open_store(
    path: &std::path::Path,
) -> (
    tessera_cluster::store::LogStore<TypeConfig>,
    tessera_cluster::store::StateMachineStore<TypeConfig, ConfigState>,
) {
    for _ in 0..1000 {
        match tessera_cluster::store::open::<TypeConfig, ConfigState>(path) {
            Ok(stores) => return stores,
            Err(tessera_cluster::store::StoreError::InUse { .. }) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("store {}: {e}", path.display()),
        }
    }
    panic!(
        "store {} stayed in use after its service stopped",
        path.display()
    );
}

fn shm_or_tmp() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}
