//! The cluster layer over the node transport: [`TransportNet`] is the [`NodeNet`] daemons
//! use, and [`serve`] answers other nodes' requests on the daemon port.
//!
//! One request is outstanding per connection; idle connections to each peer are kept for
//! reuse (a few per peer: Raft replication, lease renewals and proposals run at once). A
//! connection that failed or timed out is dropped, never reused, because the transport
//! breaks a connection whose call was cut short.
//!
//! File-system requests (a client's metadata calls to a metanode: many per second, each
//! waited for by an application) travel on connections of their own, *lanes*, that a
//! thread blocks on at each end ([`TransportNet::call_blocking`], `serve_lane`): the
//! caller's thread sends and sleeps in `read` until the answer arrives, and the server's
//! thread for that connection serves the request itself. Through the async runtime the same
//! round trip woke four threads more (see `tessera_transport::BlockingConnection`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tessera_transport::{BlockingConnection, Connection, Identity};
use tokio::net::TcpListener;

use crate::node::NodeNumber;
use crate::rpc::{NetError, NodeNet, NodeStatus, PeerReply, PeerRequest};
use crate::service::ClusterNode;

/// Idle connections kept per peer address.
pub const IDLE_CONNECTIONS_PER_PEER: usize = 4;
/// Idle lanes kept per peer address: one per thread that may call at once (a mount's FUSE
/// threads, and the threads answering revocations), so that none is made per call.
pub const IDLE_LANES_PER_PEER: usize = 32;

/// Reaches other nodes over authenticated TCP.
pub struct TransportNet {
    identity: Arc<Identity>,
    idle: Mutex<HashMap<String, Vec<Connection>>>,
    lanes: Mutex<HashMap<String, Vec<BlockingConnection>>>,
}

impl TransportNet {
    pub fn new(identity: Arc<Identity>) -> TransportNet {
        TransportNet {
            identity,
            idle: Mutex::new(HashMap::new()),
            lanes: Mutex::new(HashMap::new()),
        }
    }

    /// [`NodeNet::call`] of a file-system request, on a lane (see the module doc): blocks
    /// the calling thread, which must not be one of `runtime`'s (it makes new lanes).
    /// `keep_waiting` is asked every `tick` while the lane is being made and while no
    /// answer came; when it says no, the call fails and its lane is dropped.
    #[allow(clippy::too_many_arguments)]
    pub fn call_blocking(
        &self,
        runtime: &tokio::runtime::Handle,
        to: NodeNumber,
        address: &str,
        request: PeerRequest,
        timeout: Duration,
        tick: Duration,
        keep_waiting: &mut dyn FnMut() -> bool,
    ) -> Result<PeerReply, NetError> {
        let started = std::time::Instant::now();
        let pooled = self.lanes.lock().get_mut(address).and_then(Vec::pop);
        let mut lane = match pooled {
            Some(lane) => lane,
            None => {
                // A node cut off drops the connection's packets: its connect would wait for
                // the whole timeout unless the caller is asked meanwhile, as it is while it
                // waits for an answer.
                let connect = tessera_transport::connect(address, &self.identity, timeout);
                let connected = runtime.block_on(async {
                    tokio::pin!(connect);
                    loop {
                        tokio::select! {
                            connected = &mut connect => break Ok(connected),
                            () = tokio::time::sleep(tick) => if !keep_waiting() {
                                break Err(NetError::Unreachable(
                                    to,
                                    "its caller gave up while connecting".into(),
                                ));
                            },
                        }
                    }
                })?;
                connected
                    .and_then(Connection::into_blocking)
                    .map_err(|e| NetError::Unreachable(to, e.to_string()))?
            }
        };
        let left = timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(NetError::Timeout(to, timeout));
        }
        let addressed = Addressed { to, request };
        let reply = lane.call_while::<Addressed, PeerReply>(&addressed, left, tick, keep_waiting);
        match reply {
            Ok(reply) => {
                self.put_back_lane(address, lane);
                from_addressee(to, address, reply)
            }
            Err(e) => {
                // The other idle lanes to that address most likely failed the same way
                // (its daemon restarted): dropped, so that the next call connects anew
                // instead of finding each of them dead in turn.
                self.lanes.lock().remove(address);
                Err(NetError::Unreachable(to, e.to_string()))
            }
        }
    }

    fn put_back_lane(&self, address: &str, lane: BlockingConnection) {
        let mut lanes = self.lanes.lock();
        let pool = lanes.entry(address.to_string()).or_default();
        if pool.len() < IDLE_LANES_PER_PEER {
            pool.push(lane);
        }
    }

    async fn connection(
        &self,
        to: NodeNumber,
        address: &str,
        timeout: Duration,
    ) -> Result<Connection, NetError> {
        if let Some(connection) = self.idle.lock().get_mut(address).and_then(Vec::pop) {
            return Ok(connection);
        }
        tessera_transport::connect(address, &self.identity, timeout)
            .await
            .map_err(|e| NetError::Unreachable(to, e.to_string()))
    }

    fn put_back(&self, address: &str, connection: Connection) {
        let mut idle = self.idle.lock();
        let pool = idle.entry(address.to_string()).or_default();
        if pool.len() < IDLE_CONNECTIONS_PER_PEER {
            pool.push(connection);
        }
    }
}

impl NodeNet for TransportNet {
    async fn call(
        &self,
        to: NodeNumber,
        address: &str,
        request: PeerRequest,
        timeout: Duration,
    ) -> Result<PeerReply, NetError> {
        let started = tokio::time::Instant::now();
        let mut connection = self.connection(to, address, timeout).await?;
        let left = timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(NetError::Timeout(to, timeout));
        }
        let addressed = Addressed { to, request };
        match connection
            .call::<Addressed, PeerReply>(&addressed, left)
            .await
        {
            Ok(reply) => {
                self.put_back(address, connection);
                from_addressee(to, address, reply)
            }
            Err(e) => Err(NetError::Unreachable(to, e.to_string())),
        }
    }
}

/// `reply` from `address` as an answer of node `to`: one from another node that listens
/// there now is no answer of `to`'s (the connection stays usable).
fn from_addressee(to: NodeNumber, address: &str, reply: PeerReply) -> Result<PeerReply, NetError> {
    match reply {
        PeerReply::NotAddressee { me } => Err(NetError::Unreachable(
            to,
            format!("{address} is node {me} now, not node {to}"),
        )),
        reply => Ok(reply),
    }
}

/// What travels on a connection: a request and the number of the node it is for. A node
/// answers only what is addressed to it: after `node delete` and `node add` a new node can
/// listen where the deleted one did, and Raft must never take the new node's empty log for
/// the old node's (openraft stops on a follower whose log went backwards).
#[derive(Debug, Serialize, Deserialize)]
pub struct Addressed {
    pub to: NodeNumber,
    pub request: PeerRequest,
}

/// The answer of `node` to one addressed request.
pub async fn answer<N: NodeNet>(node: &ClusterNode<N>, addressed: Addressed) -> PeerReply {
    if addressed.to != node.me() {
        return PeerReply::NotAddressee { me: node.me() };
    }
    node.handle(addressed.request).await
}

/// Answers other nodes on `listener` until the task running it is aborted. Each
/// authenticated connection is served in its own task, one request at a time.
pub async fn serve(
    listener: TcpListener,
    identity: Arc<Identity>,
    node: Arc<ClusterNode<TransportNet>>,
) {
    tessera_transport::serve(listener, identity, move |connection| {
        let node = Arc::clone(&node);
        serve_connection(connection, node)
    })
    .await
}

async fn serve_connection(mut connection: Connection, node: Arc<ClusterNode<TransportNet>>) {
    loop {
        let addressed = match connection.recv::<Addressed>().await {
            Ok(Some(addressed)) => addressed,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(peer = connection.peer_name(), "connection ends: {e}");
                return;
            }
        };
        if matches!(addressed.request, PeerRequest::FileSystem { .. }) {
            // A lane: from here on, a thread of its own serves it (see the module doc).
            let peer = connection.peer_name().to_owned();
            match connection.into_blocking() {
                Ok(lane) => start_lane(lane, &node, addressed),
                Err(e) => tracing::warn!(peer, "cannot serve a file-system lane: {e}"),
            }
            return;
        }
        let reply = answer(&node, addressed).await;
        if let Err(e) = connection.send(&reply).await {
            tracing::debug!(peer = connection.peer_name(), "cannot answer: {e}");
            return;
        }
    }
}

/// Serves `lane` on a thread of its own, starting with `first`, until the peer closes it.
/// The thread holds the node weakly: once the node is gone, it answers nothing more.
fn start_lane(lane: BlockingConnection, node: &Arc<ClusterNode<TransportNet>>, first: Addressed) {
    let node = Arc::downgrade(node);
    let runtime = tokio::runtime::Handle::current();
    let peer = lane.peer_name().to_owned();
    let spawned = std::thread::Builder::new()
        .name("fs-lane".into())
        .spawn(move || serve_lane(lane, &node, &runtime, first));
    if let Err(e) = spawned {
        tracing::warn!(peer, "cannot start a thread for a file-system lane: {e}");
    }
}

fn serve_lane(
    mut lane: BlockingConnection,
    node: &std::sync::Weak<ClusterNode<TransportNet>>,
    runtime: &tokio::runtime::Handle,
    first: Addressed,
) {
    let mut addressed = first;
    loop {
        let Some(node) = node.upgrade() else {
            return;
        };
        let reply = match addressed {
            Addressed {
                to,
                request:
                    PeerRequest::FileSystem {
                        from,
                        epoch,
                        fs,
                        slot,
                        request,
                    },
            } if to == node.me() => PeerReply::FileSystem(node.file_system_request_blocking(
                from,
                epoch,
                (&fs, slot),
                request,
            )),
            // Anything else is answered as on any connection.
            other => runtime.block_on(answer(&node, other)),
        };
        drop(node);
        if let Err(e) = lane.send(&reply) {
            tracing::debug!(peer = lane.peer_name(), "cannot answer on a lane: {e}");
            return;
        }
        addressed = match lane.recv::<Addressed>() {
            Ok(Some(addressed)) => addressed,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(peer = lane.peer_name(), "lane ends: {e}");
                return;
            }
        };
    }
}

/// Asks each of `nodes` (number, daemon address) what it says of itself, all at once,
/// each within `timeout`: `tessera state` on any node, with or without its own daemon.
pub async fn ask_statuses(
    net: Arc<TransportNet>,
    nodes: &[(NodeNumber, String)],
    timeout: Duration,
) -> Vec<Result<NodeStatus, NetError>> {
    let asks: Vec<_> = nodes
        .iter()
        .map(|(number, address)| {
            let net = Arc::clone(&net);
            let (number, address) = (*number, address.clone());
            tokio::spawn(async move {
                match net
                    .call(number, &address, PeerRequest::Status, timeout)
                    .await?
                {
                    PeerReply::Status(status) => Ok(status),
                    _ => Err(NetError::WrongReply(number)),
                }
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(asks.len());
    for ask in asks {
        answers.push(ask.await.expect("status queries do not panic"));
    }
    answers
}

/// Whether a failed call found nothing listening on the daemon port (the daemon is down),
/// rather than no answer (the node or the network is).
pub fn nothing_listens(e: &NetError) -> bool {
    matches!(e, NetError::Unreachable(_, why) if why.contains("refused"))
}
