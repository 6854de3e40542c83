//! What cluster daemons say to each other, and the seam through which they say it.
//!
//! Every message between daemons of the cluster layer is one [`PeerRequest`] answered by
//! one [`PeerReply`]. The daemon carries them over the authenticated node transport
//! (`tessera-transport`); a simulation carries them over a simulated network with delays,
//! losses and partitions. Both implement [`NodeNet`], the only way this layer reaches
//! another node.

use std::future::Future;
use std::time::Duration;

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};

use crate::lease::{Grant, NodeState, Refusal};
use crate::node::NodeNumber;
use crate::raft::TypeConfig;
use crate::state::{Command, Response};

/// A request from one cluster daemon to another.
#[derive(Debug, Serialize, Deserialize)]
pub enum PeerRequest {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<u64>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
    /// A configuration change for the cluster manager (the Raft leader) to commit.
    Propose(Command),
    /// A disk-lease renewal, sent to the cluster manager.
    Renew {
        node: NodeNumber,
        epoch: u64,
    },
    /// What the node thinks of itself and of the cluster (`tessera state`).
    Status,
    /// A request of the file-system layer (a metanode request, encoded by it) from node
    /// `from` in its incarnation `epoch`, for the metanode of owner slot `slot` of file
    /// system `fs` (0: the file system manager). Answered only while that incarnation is
    /// live: an expelled node's requests are refused here, as its disk I/O is by its
    /// lease.
    FileSystem {
        from: NodeNumber,
        epoch: u64,
        fs: String,
        slot: u32,
        request: Vec<u8>,
    },
}

/// The answer to a [`PeerRequest`], same variant.
#[derive(Debug, Serialize, Deserialize)]
pub enum PeerReply {
    Append(Result<AppendEntriesResponse<u64>, RaftError<u64>>),
    Vote(Result<VoteResponse<u64>, RaftError<u64>>),
    Snapshot(Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>),
    Proposed(Result<Response, ProposeError>),
    Renewed(Result<Grant, Refusal>),
    Status(NodeStatus),
    /// The request was for another node number than this node's (see `net::Addressed`).
    NotAddressee {
        me: NodeNumber,
    },
    /// The file-system layer's encoded answer, or why the request was refused.
    FileSystem(Result<Vec<u8>, String>),
}

/// What answers [`PeerRequest::FileSystem`] on a node: the daemon's mounted file systems.
/// Called on a thread that may block, with the sender's node number and the incarnation
/// (epoch) the cluster checked live, and the file system and owner slot addressed.
pub trait FileSystemService: Send + Sync + 'static {
    fn call(
        &self,
        from: (NodeNumber, u64),
        to: (&str, u32),
        request: Vec<u8>,
    ) -> Result<Vec<u8>, String>;
}

/// Why a proposal was not committed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ProposeError {
    #[error("node {asked} is not the cluster manager (the manager is {leader:?})")]
    NotManager {
        asked: NodeNumber,
        leader: Option<NodeNumber>,
    },
    #[error(
        "no cluster manager: fewer than a majority of the quorum nodes are reachable; \
         start them (`tessera startup -a`) or check the network, then retry"
    )]
    NoQuorum,
    #[error("the cluster service is stopping: {0}")]
    Stopping(String),
}

/// One node's report of itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub node: NodeNumber,
    pub state: NodeState,
    pub epoch: Option<u64>,
    /// The cluster manager this node follows, if it knows one.
    pub manager: Option<NodeNumber>,
    pub term: u64,
    /// The configuration version this node has applied.
    pub config_version: u64,
}

/// How the cluster layer reaches another node. `address` is the node's daemon address from
/// the node table; `timeout` bounds the whole call, so a vanished peer costs at most that.
pub trait NodeNet: Send + Sync + 'static {
    fn call(
        &self,
        to: NodeNumber,
        address: &str,
        request: PeerRequest,
        timeout: Duration,
    ) -> impl Future<Output = Result<PeerReply, NetError>> + Send;
}

/// A call that did not get an answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    #[error("node {0} is unreachable: {1}")]
    Unreachable(NodeNumber, String),
    #[error("node {0} did not answer within {1:?}")]
    Timeout(NodeNumber, Duration),
    #[error("node {0} answered with the wrong kind of message")]
    WrongReply(NodeNumber),
}
