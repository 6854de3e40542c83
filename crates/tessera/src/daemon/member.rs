//! The daemon's membership in the cluster: the cluster layer (`tessera-cluster`) on its
//! own tokio runtime, serving other nodes on the daemon port, with blocking calls for the
//! admin threads.
//!
//! Start-up order: the secret and this node's number come from the home
//! (`cluster.secret`, `cluster.json`); the Raft log and the applied configuration from
//! `cluster/raft.redb`. A quorum node of a new cluster finds the first configuration entry
//! in `cluster/bootstrap.json` and commits it once a majority of the quorum nodes runs.
//! A one-node home from before the cluster layer (`cluster.json` format 0) becomes a
//! one-node cluster with the same name and id, so its NSDs still match their descriptors.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use tessera_cluster::net::{ask_statuses, nothing_listens, serve, TransportNet};
use tessera_cluster::node::{Designation, NodeNumber, NodeSpec};
use tessera_cluster::params::LeaseTimings;
use tessera_cluster::raft::TypeConfig;
use tessera_cluster::rpc::NodeStatus;
use tessera_cluster::service::{raft_config, Clock, ClusterNode, StateReader};
use tessera_cluster::state::{ClusterIdentity, Command, ConfigState, NodeRecord, Response};
use tessera_transport::{ClusterId, ClusterSecret, Identity};
use tokio::runtime::Runtime;

use crate::config::{ClusterConfig, Home, NodesCache};

/// The address of a node of a one-node cluster that nobody else reaches: loopback, any
/// free port at each start.
pub const LOOPBACK_ANY_PORT: &str = "127.0.0.1:0";

/// How long a `state` query waits for another node's answer before calling it `unknown`.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// How long an admin command waits for its change to be committed and applied here.
const PROPOSE_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Member {
    runtime: Runtime,
    node: Arc<ClusterNode<TransportNet>>,
    net: Arc<TransportNet>,
    machine: tessera_cluster::store::StateMachineStore<TypeConfig, ConfigState>,
    /// Where the daemon port listens (the node table may say port 0: any free one).
    bound: SocketAddr,
}

/// Why a node without a lease does no disk I/O.
const NO_LEASE: &str = "no disk lease: this node lost contact with the cluster manager (or a \
     quorum), so it does no disk I/O; `tessera state -a` shows the cluster, and I/O resumes \
     once this node is active again";

impl Member {
    /// Opens the store, binds the daemon port, starts the Raft member, the lease holder
    /// and (when elected) the cluster manager. A pending bootstrap runs in the background.
    pub fn start(home: &Home, cluster: &ClusterConfig) -> Result<Member> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cluster")
            .enable_all()
            .build()
            .context("cannot start the cluster runtime")?;
        let secret = load_secret(home, cluster)?;
        let identity = Arc::new(Identity {
            cluster_id: ClusterId(cluster.cluster_id_bytes()),
            node_name: cluster.node_name.clone(),
            secret,
        });
        std::fs::create_dir_all(home.cluster_dir())
            .with_context(|| format!("cannot create {}", home.cluster_dir().display()))?;
        let (log, machine) = open_store(home)?;
        let bootstrap = bootstrap_entry(home, cluster)?;
        let address = own_address(&machine.state(), cluster, bootstrap.as_ref());
        let net = Arc::new(TransportNet::new(Arc::clone(&identity)));
        let reader = machine.clone();
        let read_state: StateReader = Arc::new(move || reader.state());
        let timings = raft_timings(&machine.state(), bootstrap.as_ref());
        let (node, bound) = runtime.block_on(async {
            let listener = bind(&address).await?;
            let bound = listener.local_addr()?;
            let node = ClusterNode::start(
                cluster.node_number,
                rand::random(),
                raft_config(&timings, &cluster.name),
                Arc::clone(&net),
                log,
                machine.clone(),
                read_state,
                Clock::new(),
            )
            .await?;
            tokio::spawn(serve(listener, Arc::clone(&identity), Arc::clone(&node)));
            tokio::spawn(Arc::clone(&node).run());
            anyhow::Ok((node, bound))
        })?;
        tracing::info!(%bound, node = cluster.node_number, "cluster member started");
        let member = Member {
            runtime,
            node,
            net,
            machine,
            bound,
        };
        member.elect_if_alone();
        if let Some(create) = bootstrap {
            member.spawn_bootstrap(home.clone(), create);
        }
        member.spawn_nodes_cache(home.clone());
        Ok(member)
    }

    /// A lone voter need not wait an election timeout (up to half of
    /// `failureDetectionTime`) to lead itself. Its membership may only appear when a
    /// pending bootstrap initializes Raft, so this watches for a while.
    fn elect_if_alone(&self) {
        let me = u64::from(self.node.me());
        let raft = self.node.raft().clone();
        self.runtime.spawn(async move {
            let mut metrics = raft.metrics();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                let (alone, leader) = {
                    let m = metrics.borrow_and_update();
                    let voters: Vec<u64> = m.membership_config.membership().voter_ids().collect();
                    (voters == [me], m.current_leader)
                };
                if alone && leader.is_none() {
                    if let Err(e) = raft.trigger().elect().await {
                        tracing::debug!("election of a lone voter: {e}");
                    }
                    return;
                }
                if leader.is_some() {
                    return;
                }
                if tokio::time::timeout_at(deadline, metrics.changed())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    }

    fn spawn_bootstrap(&self, home: Home, create: Command) {
        let node = Arc::clone(&self.node);
        self.runtime.spawn(async move {
            loop {
                match node.bootstrap(&create).await {
                    Ok(Response::Refused { reason }) if node.state().identity.is_none() => {
                        tracing::error!("the first configuration entry was refused: {reason}");
                        return;
                    }
                    Ok(_) => break,
                    Err(e) => tracing::info!("cluster not created yet: {e}; retrying"),
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            tracing::info!("the cluster configuration is committed");
            let _ = std::fs::remove_file(home.bootstrap_path());
        });
    }

    /// Keeps `cluster/nodes.json` equal to the applied node table, for the commands that
    /// must reach other nodes while this daemon is down.
    fn spawn_nodes_cache(&self, home: Home) {
        let mut applied = self.machine.subscribe();
        let machine = self.machine.clone();
        self.runtime.spawn(async move {
            let mut written: Option<(ClusterIdentity, Vec<NodeRecord>)> = None;
            loop {
                let state = machine.state();
                if let Some(identity) = state.identity.clone() {
                    let nodes: Vec<NodeRecord> = state.nodes.values().cloned().collect();
                    let now = Some((identity.clone(), nodes.clone()));
                    if now != written {
                        let cache = NodesCache { identity, nodes };
                        match home.save_nodes_cache(&cache) {
                            Ok(()) => written = now,
                            Err(e) => tracing::warn!("{e:#}"),
                        }
                    }
                }
                if applied.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    pub fn me(&self) -> NodeNumber {
        self.node.me()
    }

    /// This node's applied copy of the configuration.
    pub fn state(&self) -> ConfigState {
        self.machine.state()
    }

    /// A reader of the applied configuration that outlives borrows of this member (a
    /// host gate of the NSD server asks it from the target's threads).
    pub fn state_reader(&self) -> impl Fn() -> ConfigState + Send + Sync + 'static {
        let machine = self.machine.clone();
        move || machine.state()
    }

    /// This node's name in the node table (empty before the cluster is created).
    pub fn me_name(&self) -> String {
        let me = self.me();
        self.state()
            .nodes
            .get(&me)
            .map(|n| n.name.clone())
            .unwrap_or_default()
    }

    /// The epoch of this incarnation while it holds a lease (what it writes under).
    pub fn io_epoch(&self) -> Option<u64> {
        self.node.io_epoch()
    }

    /// Waits until the applied configuration changes or `timeout` passes; for threads
    /// outside the runtime that act on every change (fencing hosts at an expel).
    pub fn wait_for_change(
        &self,
        applied: &mut tessera_cluster::store::AppliedWatch,
        timeout: Duration,
    ) {
        let _ = self
            .runtime
            .block_on(async { tokio::time::timeout(timeout, applied.changed()).await });
    }

    /// A receiver of applied-configuration changes, for [`Member::wait_for_change`].
    pub fn applied(&self) -> tessera_cluster::store::AppliedWatch {
        self.machine.subscribe()
    }

    pub fn status(&self) -> NodeStatus {
        self.node.status()
    }

    /// Where this node's daemon port listens.
    pub fn bound_address(&self) -> SocketAddr {
        self.bound
    }

    /// Lets `service` answer other nodes' file-system requests.
    pub fn serve_file_systems(&self, service: Arc<dyn tessera_cluster::rpc::FileSystemService>) {
        self.node.serve_file_systems(service);
    }

    /// The way to metanode `slot` of file system `fs` (0: its file system manager) on node
    /// `to` (daemon `address`); owners' messages to a client node carry 0.
    pub(super) fn metanode_channel(
        &self,
        to: NodeNumber,
        address: String,
        fs: String,
        slot: u32,
    ) -> super::metanode_service::TransportChannel {
        super::metanode_service::TransportChannel {
            runtime: self.runtime.handle().clone(),
            net: Arc::clone(&self.net),
            node: Arc::clone(&self.node),
            to,
            address,
            fs,
            slot,
        }
    }

    /// Whether the node a lock holder's requests came from is gone: expelled, or restarted
    /// as another incarnation since (its processes, and so their locks, died with it).
    pub fn lock_holder_check(
        &self,
    ) -> Box<dyn Fn(tessera_fs::locks::Origin) -> bool + Send + Sync> {
        let node = Arc::clone(&self.node);
        Box::new(move |o| !node.state().epoch_is_live(o.node, o.incarnation))
    }

    /// Whether this node holds a valid disk lease now.
    pub fn holds_lease(&self) -> bool {
        self.node.may_do_io()
    }

    /// Whether this node may do disk I/O now (it holds a lease), bound to this node's
    /// incarnation now: a file system
    /// mounted (or taken over) by this incarnation does no I/O through a later one. An
    /// expelled node's owners were taken over by others meanwhile, and its in-memory
    /// metadata and unsynced changes belong to the incarnation that died; such a mount is
    /// stale and must be mounted again, as GPFS unmounts a file system on an expelled node.
    pub fn incarnation_check(&self) -> super::lease_gate::LeaseCheck {
        use std::sync::atomic::{AtomicU64, Ordering};
        let node = Arc::clone(&self.node);
        // Epochs start at 1, so 0 means "not bound yet": a mount made while the lease
        // happened to lapse binds to the first incarnation it does I/O under.
        let bound = AtomicU64::new(node.io_epoch().unwrap_or(0));
        Arc::new(move || {
            let Some(now) = node.io_epoch() else {
                return Err(NO_LEASE.to_string());
            };
            let then = match bound.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => now,
                Err(then) => then,
            };
            if now == then {
                return Ok(());
            }
            Err(format!(
                "this node was expelled from the cluster since the file system was mounted \
                 (incarnation {then}, now {now}), and other nodes may have taken it over: \
                 this mount is stale and does no disk I/O; unmount it and mount it again"
            ))
        })
    }

    /// Whether this node may answer its kernel from the metadata a mount made now owns
    /// (`FileSystem::on_serve_check`): as [`Member::incarnation_check`], with a lapsed lease
    /// told apart from an expel.
    pub fn serve_check(&self) -> tessera_fs::ServeCheck {
        let check = self.incarnation_check();
        Box::new(move || match check() {
            Ok(()) => Ok(()),
            Err(why) if why == NO_LEASE => Err(tessera_fs::ServeRefusal::Lapsed(why)),
            Err(why) => Err(tessera_fs::ServeRefusal::Stale(why)),
        })
    }

    /// Commits `command` and waits until this node has applied it, so the admin's next
    /// command here sees it. A refusal is an error carrying the reason.
    pub fn propose(&self, command: Command) -> Result<Response> {
        let node = Arc::clone(&self.node);
        let mut applied = self.machine.subscribe();
        let machine = self.machine.clone();
        self.runtime.block_on(async move {
            let response = node
                .propose(command, PROPOSE_TIMEOUT)
                .await
                .map_err(|e| anyhow!("{e}"))?;
            let version = match &response {
                Response::Refused { reason } => bail!("{reason}"),
                Response::Changed { version } => Some(*version),
                _ => None,
            };
            // Other responses carry no version; the command's own entry is applied once the
            // version moved past what it was before, which `Changed` makes exact.
            let deadline = tokio::time::Instant::now() + PROPOSE_TIMEOUT;
            while let Some(v) = version {
                if machine.state().version >= v {
                    break;
                }
                if tokio::time::timeout_at(deadline, applied.changed())
                    .await
                    .is_err()
                {
                    bail!(
                        "the change is committed but this node has not applied it within \
                         {PROPOSE_TIMEOUT:?}; check `tessera state -a`"
                    );
                }
            }
            Ok(response)
        })
    }

    /// Waits until this node holds a lease (it joined a cluster with a manager), at most
    /// `limit`.
    pub fn wait_active(&self, limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            if self.node.may_do_io() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// What each node says of itself, asked in parallel; `down` when nothing listens on
    /// its daemon port, `unknown` when it does not answer in time.
    pub fn node_states(&self, nodes: &[NodeRecord]) -> Vec<(String, Option<u64>)> {
        let me = self.node.me();
        let own = self.node.status();
        let others: Vec<(NodeNumber, String)> = nodes
            .iter()
            .filter(|n| n.number != me)
            .map(|n| (n.number, n.address.clone()))
            .collect();
        let net = Arc::clone(&self.net);
        let mut answers = self
            .runtime
            .block_on(ask_statuses(net, &others, STATUS_TIMEOUT))
            .into_iter();
        nodes
            .iter()
            .map(|n| {
                if n.number == me {
                    return (state_word(&own), own.epoch);
                }
                match answers.next().expect("one answer per node asked") {
                    Ok(status) => (state_word(&status), status.epoch),
                    Err(e) if nothing_listens(&e) => ("down".to_string(), None),
                    Err(_) => ("unknown".to_string(), None),
                }
            })
            .collect()
    }

    /// Waits, at most `limit`, until this node has applied the configuration the cluster
    /// manager has applied: a node restarted a moment ago is active before it has caught
    /// up with the log, and would answer from an older table (a file system just created
    /// "does not exist"). True once caught up (or when this node manages).
    pub fn catch_up(&self, limit: Duration) -> bool {
        let state = self.machine.state();
        let Some(manager) = self.node.raft().metrics().borrow().current_leader else {
            return false;
        };
        let manager = manager as NodeNumber;
        if manager == self.node.me() {
            return true;
        }
        let Some(address) = state.nodes.get(&manager).map(|n| n.address.clone()) else {
            return false;
        };
        let net = Arc::clone(&self.net);
        let asked = self
            .runtime
            .block_on(ask_statuses(net, &[(manager, address)], STATUS_TIMEOUT));
        let Some(Ok(status)) = asked.into_iter().next() else {
            return false;
        };
        let deadline = std::time::Instant::now() + limit;
        while self.machine.state().version < status.config_version {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// Stops the Raft member; other nodes see this node go away.
    pub fn shutdown(&self) {
        let node = Arc::clone(&self.node);
        self.runtime.block_on(async move { node.shutdown().await });
    }
}

/// `tessera state`'s word for a node that answered.
pub fn state_word(status: &NodeStatus) -> String {
    match status.state {
        tessera_cluster::lease::NodeState::Active => "active".into(),
        tessera_cluster::lease::NodeState::Arbitrating => "arbitrating".into(),
    }
}

/// The timings Raft's heartbeats and elections follow (fixed for the life of the daemon:
/// a changed `failureDetectionTime` reaches them at each node's next start): those of the
/// applied configuration, or of the first entry still to commit.
fn raft_timings(state: &ConfigState, create: Option<&Command>) -> LeaseTimings {
    if state.identity.is_none() {
        if let Some(create) = create {
            let mut first = ConfigState::default();
            first.apply(create);
            return first.params.lease_timings();
        }
    }
    state.params.lease_timings()
}

/// Opens the Raft store. A daemon that was just told to stop may still hold it for a
/// moment while it exits, so a locked store is retried for a few seconds.
fn open_store(
    home: &Home,
) -> Result<(
    tessera_cluster::store::LogStore<TypeConfig>,
    tessera_cluster::store::StateMachineStore<TypeConfig, ConfigState>,
)> {
    let path = home.raft_path();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tessera_cluster::store::open::<TypeConfig, ConfigState>(&path) {
            Ok(opened) => return Ok(opened),
            Err(tessera_cluster::store::StoreError::InUse { .. })
                if std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e @ tessera_cluster::store::StoreError::InUse { .. }) => return Err(e.into()),
            Err(e) => bail!(
                "{e}; if the other quorum nodes are healthy, move {} aside and start the daemon \
                 again: it copies the configuration from them",
                path.display()
            ),
        }
    }
}

/// The cluster secret; a home from before the cluster layer gets one.
fn load_secret(home: &Home, cluster: &ClusterConfig) -> Result<ClusterSecret> {
    let path = home.secret_path();
    if cluster.format == 0 && !path.exists() {
        let secret = ClusterSecret::generate();
        secret.save(&path).map_err(|e| anyhow!("{e}"))?;
        tracing::info!("created the cluster secret {}", path.display());
        return Ok(secret);
    }
    ClusterSecret::load(&path).map_err(|e| {
        anyhow!(
            "{e}; every node needs the cluster's secret: copy {} from another node of \
             cluster {} (mode 0600), or add this node again with `tessera node add`",
            path.display(),
            cluster.name
        )
    })
}

/// The first configuration entry still to commit: `cluster/bootstrap.json`, or for a home
/// from before the cluster layer, a one-node cluster with its name and id.
fn bootstrap_entry(home: &Home, cluster: &ClusterConfig) -> Result<Option<Command>> {
    if let Some(create) = home.bootstrap()? {
        return Ok(Some(create));
    }
    if cluster.format != 0 {
        return Ok(None);
    }
    Ok(Some(Command::Create {
        identity: ClusterIdentity {
            name: cluster.name.clone(),
            id: cluster.cluster_id.clone(),
            created_unix: cluster.created_unix,
            remote_shell: "ssh".into(),
        },
        nodes: vec![NodeSpec {
            name: cluster.node_name.clone(),
            designation: Designation::QUORUM_MANAGER,
            address: LOOPBACK_ANY_PORT.into(),
        }],
        params: Vec::new(),
    }))
}

/// Where this node listens: the applied node table, else the bootstrap entry, else what
/// `cluster.json` says.
fn own_address(state: &ConfigState, cluster: &ClusterConfig, create: Option<&Command>) -> String {
    if let Some(record) = state.nodes.get(&cluster.node_number) {
        return record.address.clone();
    }
    if let Some(Command::Create { nodes, .. }) = create {
        if let Some(spec) = nodes.get(cluster.node_number as usize - 1) {
            return spec.address.clone();
        }
    }
    if cluster.address.is_empty() {
        LOOPBACK_ANY_PORT.into()
    } else {
        cluster.address.clone()
    }
}

/// Binds the daemon port. An IP address is bound as given; a host name is bound on every
/// local address (its resolution on this host may be a loopback alias).
async fn bind(address: &str) -> Result<tokio::net::TcpListener> {
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| anyhow!("daemon address {address} has no port"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| anyhow!("daemon address {address}: bad port {port}"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ip = host
        .parse::<IpAddr>()
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let at = SocketAddr::new(ip, port);
    // A daemon that was just told to stop may hold the port while it exits.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut bound = tokio::net::TcpListener::bind(at).await;
    while matches!(&bound, Err(e) if e.kind() == std::io::ErrorKind::AddrInUse)
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
        bound = tokio::net::TcpListener::bind(at).await;
    }
    bound.with_context(|| {
        format!(
            "cannot listen on {at} (the daemon address {address} of this node): is another \
             daemon using the port, or is the address not on this host? Change it with \
             `tessera node change --address`"
        )
    })
}
