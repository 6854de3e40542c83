//! openraft's types for the configuration repository, and its network over [`NodeNet`].
//!
//! Raft node ids are cluster node numbers; a Raft node's address is its daemon address.
//! Quorum nodes are voters; every other node is a learner, so every node holds an applied
//! copy of the configuration and admin listings read it locally.

use std::io::Cursor;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;

use crate::rpc::{NetError, NodeNet, PeerReply, PeerRequest};
use crate::state::{Command, Response};

openraft::declare_raft_types!(
    /// The Raft type configuration of the cluster configuration repository.
    pub TypeConfig:
        D = Command,
        R = Response,
);

/// The Raft handle of this node.
pub type ConfigRaft = openraft::Raft<TypeConfig>;

/// Creates one [`PeerLink`] per target, all over one [`NodeNet`].
pub struct PeerLinks<N: NodeNet> {
    net: Arc<N>,
}

impl<N: NodeNet> PeerLinks<N> {
    pub fn new(net: Arc<N>) -> PeerLinks<N> {
        PeerLinks { net }
    }
}

impl<N: NodeNet> RaftNetworkFactory<TypeConfig> for PeerLinks<N> {
    type Network = PeerLink<N>;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> PeerLink<N> {
        PeerLink {
            net: Arc::clone(&self.net),
            target,
            address: node.addr.clone(),
        }
    }
}

/// The Raft RPCs to one peer.
pub struct PeerLink<N: NodeNet> {
    net: Arc<N>,
    target: u64,
    address: String,
}

type RpcResult<T, E = openraft::error::Infallible> =
    Result<T, RPCError<u64, BasicNode, RaftError<u64, E>>>;

impl<N: NodeNet> PeerLink<N> {
    async fn call<E: std::error::Error>(
        &self,
        request: PeerRequest,
        option: &RPCOption,
    ) -> Result<PeerReply, RPCError<u64, BasicNode, RaftError<u64, E>>> {
        let timeout = option.hard_ttl().max(Duration::from_millis(1));
        let target = u32::try_from(self.target).expect("node numbers are u32");
        self.net
            .call(target, &self.address, request, timeout)
            .await
            .map_err(|e| match e {
                NetError::WrongReply(_) => RPCError::Network(NetworkError::new(&e)),
                _ => RPCError::Unreachable(Unreachable::new(&e)),
            })
    }

    fn remote<E: std::error::Error>(
        &self,
        e: RaftError<u64, E>,
    ) -> RPCError<u64, BasicNode, RaftError<u64, E>> {
        RPCError::RemoteError(RemoteError::new(self.target, e))
    }

    fn wrong<E: std::error::Error>(&self) -> RPCError<u64, BasicNode, RaftError<u64, E>> {
        let target = u32::try_from(self.target).expect("node numbers are u32");
        RPCError::Network(NetworkError::new(&NetError::WrongReply(target)))
    }
}

impl<N: NodeNet> RaftNetwork<TypeConfig> for PeerLink<N> {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<u64>> {
        match self.call(PeerRequest::Append(rpc), &option).await? {
            PeerReply::Append(reply) => reply.map_err(|e| self.remote(e)),
            _ => Err(self.wrong()),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<u64>, InstallSnapshotError> {
        match self.call(PeerRequest::Snapshot(rpc), &option).await? {
            PeerReply::Snapshot(reply) => reply.map_err(|e| self.remote(e)),
            _ => Err(self.wrong()),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<u64>> {
        match self.call(PeerRequest::Vote(rpc), &option).await? {
            PeerReply::Vote(reply) => reply.map_err(|e| self.remote(e)),
            _ => Err(self.wrong()),
        }
    }
}
