//! The file-system layer's requests between nodes: this daemon answers other nodes'
//! metanode requests for the file systems it has mounted ([`MountedFileSystems`]), and a
//! client's requests reach another node's metanode over the node transport
//! ([`TransportChannel`]). The cluster layer carries the bytes and refuses a sender whose
//! incarnation is no longer live; the file-system layer encodes and decodes them.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tessera_cluster::net::TransportNet;
use tessera_cluster::node::NodeNumber;
use tessera_cluster::rpc::{FileSystemService, NodeNet, PeerReply, PeerRequest};
use tessera_cluster::service::ClusterNode;
use tessera_fs::{FsError, FsResult, MetanodeChannel};

use super::Daemon;

/// How long a client waits for a metanode's answer before the application gets EIO. A
/// bound, never an indefinite hang (CLUSTER.md); takeover of a dead owner waits for its
/// expel first, which test timings keep within seconds and the defaults within a minute.
pub(super) const METANODE_WAIT: Duration = Duration::from_secs(60);

/// The metanodes of the file systems mounted on this node.
pub(super) struct MountedFileSystems(pub Weak<Daemon>);

impl FileSystemService for MountedFileSystems {
    fn call(&self, fs: &str, request: Vec<u8>) -> Result<Vec<u8>, String> {
        let daemon = self.0.upgrade().ok_or("the daemon is stopping")?;
        let mounted = daemon
            .mounts
            .lock()
            .get(fs)
            .map(|m| (Arc::clone(&m.fs), m.client_of.clone()));
        match mounted {
            Some((_, Some(owner))) => Err(format!(
                "file system {fs} is mounted on node {} as a client of node {owner}, which                  owns its metadata: send metanode requests there",
                daemon.cluster.node_name
            )),
            Some((fs, None)) => Ok(fs.serve_metanode_request(&request)),
            None => Err(format!(
                "file system {fs} is not mounted on node {}; its metanode is the node that \
                 mounts it (`tessera mount ls {fs} -L`)",
                daemon.cluster.node_name
            )),
        }
    }
}

/// A client's way to the metanode of file system `fs` on node `to`, over the node
/// transport; each request carries this node's number and current epoch.
pub(super) struct TransportChannel {
    pub runtime: tokio::runtime::Handle,
    pub net: Arc<TransportNet>,
    pub node: Arc<ClusterNode<TransportNet>>,
    pub to: NodeNumber,
    pub address: String,
    pub fs: String,
}

impl MetanodeChannel for TransportChannel {
    fn call(&self, request: Vec<u8>) -> FsResult<Vec<u8>> {
        let me = self.node.me();
        let Some(epoch) = self.node.status().epoch else {
            return Err(FsError::Io(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "this node is not a live member of the cluster (no epoch): it cannot reach \
                 the metanode until it joins again",
            )));
        };
        let call = PeerRequest::FileSystem {
            from: me,
            epoch,
            fs: self.fs.clone(),
            request,
        };
        let unreachable = |why: String| {
            FsError::Io(std::io::Error::other(format!(
                "metanode of {} on node {}: {why}",
                self.fs, self.to
            )))
        };
        let reply = self
            .runtime
            .block_on(self.net.call(self.to, &self.address, call, METANODE_WAIT))
            .map_err(|e| unreachable(e.to_string()))?;
        match reply {
            PeerReply::FileSystem(Ok(bytes)) => Ok(bytes),
            PeerReply::FileSystem(Err(why)) => Err(unreachable(why)),
            other => Err(unreachable(format!("answered {other:?}"))),
        }
    }
}
