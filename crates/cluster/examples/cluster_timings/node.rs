//! The `node` role: one cluster member in its own process, with a redb store, the node
//! transport on a loopback port, and a line protocol on stdin/stdout for the driver.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use parking_lot::Mutex;
use tessera_cluster::lease::NodeState;
use tessera_cluster::net::{Addressed, TransportNet};
use tessera_cluster::node::{parse_node_list, NodeNumber};
use tessera_cluster::params::{parse_changes, LeaseTimings};
use tessera_cluster::raft::TypeConfig;
use tessera_cluster::rpc::{NetError, NodeNet, PeerReply, PeerRequest};
use tessera_cluster::service::{raft_config, Clock, ClusterNode, StateReader, PROPOSE_TIMEOUT};
use tessera_cluster::state::{ClusterIdentity, Command, ConfigState, Response};
use tessera_transport::wire::{hex_decode, FRAME_HEADER_BYTES, FRAME_MAC_BYTES};
use tessera_transport::{ClusterId, ClusterSecret, Connection, Identity, SECRET_BYTES};
use tokio::net::TcpListener;

use crate::{check_options, monotonic_nanos, option};

/// How often the node looks at its own lease state, which changes without a Raft event.
const LEASE_POLL: Duration = Duration::from_millis(20);

type Member = ClusterNode<CountingNet>;

/// Prints one event for the driver: `EVENT NANOS fields`.
fn emit(event: &str, fields: std::fmt::Arguments) {
    println!("{event} {} {fields}", monotonic_nanos());
}

/// A message as one word of the line protocol, which splits fields at white space.
fn one_word(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join("_")
}

struct NodeOptions {
    number: NodeNumber,
    name: String,
    store: PathBuf,
    cluster_id: ClusterId,
    secret: ClusterSecret,
    timings: LeaseTimings,
}

impl NodeOptions {
    fn parse(args: &[String]) -> anyhow::Result<NodeOptions> {
        let known = [
            "--number",
            "--name",
            "--store",
            "--cluster-id",
            "--secret",
            "--failure-detection",
            "--lease-recovery-wait",
        ];
        check_options(args, &known)?;
        let need =
            |name: &str| option(args, name).with_context(|| format!("the node role needs {name}"));
        let id: [u8; 16] = hex_decode(need("--cluster-id")?)
            .map_err(anyhow::Error::msg)?
            .try_into()
            .map_err(|_| anyhow::anyhow!("--cluster-id: expected 16 bytes in hex"))?;
        let secret: [u8; SECRET_BYTES] = hex_decode(need("--secret")?)
            .map_err(anyhow::Error::msg)?
            .try_into()
            .map_err(|_| anyhow::anyhow!("--secret: expected {SECRET_BYTES} bytes in hex"))?;
        let seconds = |name: &str| -> anyhow::Result<Duration> {
            let text = need(name)?;
            let value: f64 = text.parse().with_context(|| format!("{name} {text}"))?;
            anyhow::ensure!(value > 0.0 && value.is_finite(), "{name} must be positive");
            Ok(Duration::from_secs_f64(value))
        };
        Ok(NodeOptions {
            number: need("--number")?.parse().context("--number")?,
            name: need("--name")?.to_string(),
            store: PathBuf::from(need("--store")?),
            cluster_id: ClusterId(id),
            secret: ClusterSecret::from_bytes(secret),
            timings: LeaseTimings::new(
                seconds("--failure-detection")?,
                seconds("--lease-recovery-wait")?,
            ),
        })
    }
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let options = NodeOptions::parse(args)?;
    // Warnings (expels, refused joins) go to the node's log file for a failed run's report.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(serve_member(options))
}

async fn serve_member(options: NodeOptions) -> anyhow::Result<()> {
    let identity = Arc::new(Identity {
        cluster_id: options.cluster_id,
        node_name: options.name.clone(),
        secret: options.secret.clone(),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let (log, machine) = tessera_cluster::store::open::<TypeConfig, ConfigState>(&options.store)?;
    let reader = machine.clone();
    let read_state: StateReader = Arc::new(move || reader.state());
    let traffic = Arc::new(Traffic::default());
    let net = Arc::new(CountingNet {
        inner: TransportNet::new(Arc::clone(&identity)),
        traffic: Arc::clone(&traffic),
        newest_grant_term: AtomicU64::new(0),
    });
    let node = ClusterNode::start(
        options.number,
        rand::random(),
        raft_config(&options.timings, "timings"),
        Arc::clone(&net),
        log,
        machine,
        read_state,
        Clock::new(),
    )
    .await?;
    tokio::spawn(serve_counted(
        listener,
        identity,
        Arc::clone(&node),
        Arc::clone(&traffic),
    ));
    tokio::spawn(Arc::clone(&node).run());
    tokio::spawn(watch(Arc::clone(&node)));
    emit("ready", format_args!("port={port}"));

    // A thread reads stdin (blocking); its end means the driver is gone.
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    while let Some(line) = lines.recv().await {
        obey(&node, &net, &options, &line).await;
    }
    node.shutdown().await;
    Ok(())
}

/// Carries out one driver command.
async fn obey(node: &Arc<Member>, net: &Arc<CountingNet>, options: &NodeOptions, line: &str) {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["bootstrap", fdt, lrw, nodes] => {
            let result = bootstrap(node, options, fdt, lrw, nodes).await;
            let text = result.map_or_else(|e| format!("error:{e}"), |()| "ok".into());
            emit("bootstrapped", format_args!("result={}", one_word(&text)));
        }
        ["propose", change] => propose(node, change).await,
        ["counters"] => net.traffic.print(),
        ["reset"] => net.traffic.reset(),
        ["flood", seconds, concurrency] => match (seconds.parse(), concurrency.parse()) {
            (Ok(s), Ok(c)) => flood(node, net, Duration::from_secs_f64(s), c).await,
            _ => emit("error", format_args!("flood takes SECONDS CONCURRENCY")),
        },
        _ => emit("error", format_args!("unknown command `{line}`")),
    }
}

async fn bootstrap(
    node: &Member,
    options: &NodeOptions,
    fdt: &str,
    lrw: &str,
    nodes: &str,
) -> Result<(), String> {
    let params = format!("failureDetectionTime={fdt},leaseRecoveryWait={lrw}");
    let create = Command::Create {
        identity: ClusterIdentity {
            name: "timings".into(),
            id: options.cluster_id.to_string(),
            created_unix: 0,
            remote_shell: "ssh".into(),
        },
        nodes: parse_node_list(nodes)?,
        params: parse_changes(&params, false)?,
    };
    match node.bootstrap(&create).await {
        Ok(Response::Refused { reason }) => Err(reason),
        Ok(_) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// Proposes one `config set` and reports when `propose` returned: the change is committed
/// and applied on the manager.
async fn propose(node: &Member, change: &str) {
    let start = monotonic_nanos();
    let changes = match parse_changes(change, false) {
        Ok(changes) => changes,
        Err(e) => {
            return emit(
                "proposed",
                format_args!("start={start} error={}", one_word(&e)),
            )
        }
    };
    let command = Command::SetParams {
        nodes: vec![],
        changes,
    };
    match node.propose(command, PROPOSE_TIMEOUT).await {
        Ok(Response::Changed { version }) => {
            emit("proposed", format_args!("start={start} version={version}"))
        }
        other => emit(
            "proposed",
            format_args!("start={start} error={}", one_word(&format!("{other:?}"))),
        ),
    }
}

/// Sends renewals of this node's lease to the manager as fast as `concurrency` callers
/// can, to measure what one manager process sustains.
async fn flood(node: &Arc<Member>, net: &Arc<CountingNet>, seconds: Duration, concurrency: usize) {
    let status = node.status();
    let state = node.state();
    let target = status
        .manager
        .and_then(|m| state.nodes.get(&m).map(|r| (m, r.address.clone())));
    let (Some((manager, address)), Some(epoch)) = (target, status.epoch) else {
        return emit("flooded", format_args!("error=no_manager_or_epoch"));
    };
    let deadline = tokio::time::Instant::now() + seconds;
    let tallies: Vec<_> = (0..concurrency.clamp(1, 256))
        .map(|_| {
            let net = Arc::clone(net);
            let address = address.clone();
            let me = node.me();
            tokio::spawn(async move {
                let mut tally = [0u64; 3];
                while tokio::time::Instant::now() < deadline {
                    let request = PeerRequest::Renew { node: me, epoch };
                    let reply = net.call(manager, &address, request, seconds).await;
                    match reply {
                        Ok(PeerReply::Renewed(Ok(_))) => tally[0] += 1,
                        Ok(PeerReply::Renewed(Err(_))) => tally[1] += 1,
                        _ => tally[2] += 1,
                    }
                }
                tally
            })
        })
        .collect();
    let mut total = [0u64; 3];
    for task in tallies {
        let tally = task.await.unwrap_or([0, 0, 1]);
        (0..3).for_each(|i| total[i] += tally[i]);
    }
    emit(
        "flooded",
        format_args!(
            "grants={} refusals={} errors={} manager={manager}",
            total[0], total[1], total[2]
        ),
    );
}

/// What this node last reported, so only changes are printed.
#[derive(Default)]
struct Reported {
    leader: Option<(Option<u64>, u64)>,
    version: Option<u64>,
    manager: Option<(Option<NodeNumber>, u64)>,
    incarnations: BTreeMap<NodeNumber, u64>,
    lease: Option<NodeState>,
}

/// Reports Raft leadership, applied versions, takeovers, joins, expels and the lease
/// state as they change.
async fn watch(node: Arc<Member>) {
    let mut metrics = node.raft().metrics();
    let mut reported = Reported::default();
    loop {
        report_changes(&node, &mut reported);
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(LEASE_POLL) => {}
        }
    }
}

fn report_changes(node: &Member, reported: &mut Reported) {
    let metrics = node.raft().metrics().borrow().clone();
    let leader = (metrics.current_leader, metrics.current_term);
    if reported.leader != Some(leader) {
        reported.leader = Some(leader);
        let who = leader.0.unwrap_or(0);
        emit("leader", format_args!("leader={who} term={}", leader.1));
    }
    let state = node.state();
    if reported.version != Some(state.version) {
        reported.version = Some(state.version);
        emit("version", format_args!("version={}", state.version));
    }
    let manager = (state.manager, state.manager_term);
    if reported.manager != Some(manager) {
        reported.manager = Some(manager);
        let who = manager.0.unwrap_or(0);
        emit("takeover", format_args!("manager={who} term={}", manager.1));
    }
    for (n, epoch) in &reported.incarnations {
        if state.incarnations.get(n) != Some(epoch) {
            emit("expelled", format_args!("node={n} epoch={epoch}"));
        }
    }
    for (n, epoch) in &state.incarnations {
        if reported.incarnations.get(n) != Some(epoch) {
            emit("joined", format_args!("node={n} epoch={epoch}"));
        }
    }
    reported.incarnations = state.incarnations.clone();
    let lease = node.status().state;
    if reported.lease != Some(lease) {
        reported.lease = Some(lease);
        emit("lease", format_args!("state={lease:?}"));
    }
}

/// Messages and wire bytes of one kind.
#[derive(Clone, Copy, Default)]
struct Tally {
    calls: u64,
    call_bytes: u64,
    served: u64,
    served_bytes: u64,
}

#[derive(Default)]
struct Traffic {
    by_kind: Mutex<BTreeMap<&'static str, Tally>>,
}

impl Traffic {
    fn called(&self, kind: &'static str, bytes: usize) {
        let mut by_kind = self.by_kind.lock();
        let tally = by_kind.entry(kind).or_default();
        tally.calls += 1;
        tally.call_bytes += bytes as u64;
    }

    fn answered(&self, kind: &'static str, bytes: usize) {
        let mut by_kind = self.by_kind.lock();
        let tally = by_kind.entry(kind).or_default();
        tally.served += 1;
        tally.served_bytes += bytes as u64;
    }

    fn print(&self) {
        let by_kind = self.by_kind.lock().clone();
        for (kind, t) in by_kind {
            emit(
                "traffic",
                format_args!(
                    "kind={kind} calls={} call_bytes={} served={} served_bytes={}",
                    t.calls, t.call_bytes, t.served, t.served_bytes
                ),
            );
        }
        emit("traffic-end", format_args!(""));
    }

    fn reset(&self) {
        self.by_kind.lock().clear();
    }
}

/// The message kinds counted apart: Raft appends without entries are the heartbeats (and
/// the manager's leadership confirmations before it grants a lease).
fn kind_of(request: &PeerRequest) -> &'static str {
    match request {
        PeerRequest::Append(rpc) if rpc.entries.is_empty() => "heartbeat",
        PeerRequest::Append(_) => "append",
        PeerRequest::Vote(_) => "vote",
        PeerRequest::Snapshot(_) => "snapshot",
        PeerRequest::Propose(_) => "propose",
        PeerRequest::Renew { .. } => "renew",
        PeerRequest::Status => "status",
        PeerRequest::FileSystem { .. } => "file system",
    }
}

/// Bytes of one message in its transport frame: header, postcard payload, MAC.
fn wire_bytes<T: serde::Serialize>(message: &T) -> usize {
    let payload = postcard::to_allocvec(message).map_or(0, |v| v.len());
    FRAME_HEADER_BYTES + payload + FRAME_MAC_BYTES
}

/// The node transport, counting what goes through it, and noticing the first grant of
/// each new manager term.
struct CountingNet {
    inner: TransportNet,
    traffic: Arc<Traffic>,
    newest_grant_term: AtomicU64,
}

impl NodeNet for CountingNet {
    async fn call(
        &self,
        to: NodeNumber,
        address: &str,
        request: PeerRequest,
        timeout: Duration,
    ) -> Result<PeerReply, NetError> {
        let kind = kind_of(&request);
        let request_bytes = wire_bytes(&request);
        let reply = self.inner.call(to, address, request, timeout).await;
        let reply_bytes = reply.as_ref().map_or(0, wire_bytes);
        self.traffic.called(kind, request_bytes + reply_bytes);
        if let Ok(PeerReply::Renewed(Ok(grant))) = &reply {
            let before = self
                .newest_grant_term
                .fetch_max(grant.manager_term, Ordering::Relaxed);
            if before < grant.manager_term {
                emit(
                    "grant",
                    format_args!("manager={} term={}", grant.manager, grant.manager_term),
                );
            }
        }
        reply
    }
}

/// `tessera_cluster::net::serve`, counting each request and its answer.
async fn serve_counted(
    listener: TcpListener,
    identity: Arc<Identity>,
    node: Arc<Member>,
    traffic: Arc<Traffic>,
) {
    tessera_transport::serve(listener, identity, move |connection| {
        answer(connection, Arc::clone(&node), Arc::clone(&traffic))
    })
    .await
}

async fn answer(mut connection: Connection, node: Arc<Member>, traffic: Arc<Traffic>) {
    while let Ok(Some(addressed)) = connection.recv::<Addressed>().await {
        let kind = kind_of(&addressed.request);
        let request_bytes = wire_bytes(&addressed);
        let reply = tessera_cluster::net::answer(&node, addressed).await;
        traffic.answered(kind, request_bytes + wire_bytes(&reply));
        if connection.send(&reply).await.is_err() {
            return;
        }
    }
}
