//! The cluster layer over the node transport: [`TransportNet`] is the [`NodeNet`] daemons
//! use, and [`serve`] answers other nodes' requests on the daemon port.
//!
//! One request is outstanding per connection; idle connections to each peer are kept for
//! reuse (a few per peer: Raft replication, lease renewals and proposals run at once). A
//! connection that failed or timed out is dropped, never reused, because the transport
//! breaks a connection whose call was cut short.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tessera_transport::{Connection, Identity};
use tokio::net::TcpListener;

use crate::node::NodeNumber;
use crate::rpc::{NetError, NodeNet, NodeStatus, PeerReply, PeerRequest};
use crate::service::ClusterNode;

/// Idle connections kept per peer address.
pub const IDLE_CONNECTIONS_PER_PEER: usize = 4;

/// Reaches other nodes over authenticated TCP.
pub struct TransportNet {
    identity: Arc<Identity>,
    idle: Mutex<HashMap<String, Vec<Connection>>>,
}

impl TransportNet {
    pub fn new(identity: Arc<Identity>) -> TransportNet {
        TransportNet {
            identity,
            idle: Mutex::new(HashMap::new()),
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
            Ok(PeerReply::NotAddressee { me }) => {
                self.put_back(address, connection);
                Err(NetError::Unreachable(
                    to,
                    format!("{address} is node {me} now, not node {to}"),
                ))
            }
            Ok(reply) => {
                self.put_back(address, connection);
                Ok(reply)
            }
            Err(e) => Err(NetError::Unreachable(to, e.to_string())),
        }
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
        let reply = answer(&node, addressed).await;
        if let Err(e) = connection.send(&reply).await {
            tracing::debug!(peer = connection.peer_name(), "cannot answer: {e}");
            return;
        }
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
