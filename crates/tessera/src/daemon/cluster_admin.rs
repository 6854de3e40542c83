//! The cluster's admin commands as the daemon answers them (`cluster ls`, `node add |
//! delete | change`, `config set`, `state`), and the daemon's first steps in the cluster
//! at start.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use tessera_cluster::node::{check_unique, NodeSpec};
use tessera_cluster::state::{Command, ConfigState, Response};

use super::member::LOOPBACK_ANY_PORT;
use super::Daemon;
use crate::config::{write_atomic, CLUSTER_FORMAT};
use crate::rpc::{ClusterStates, ClusterView, NodeStateRow, Reply, Request};

/// How long a daemon that is the only quorum node waits to lead itself and hold a lease
/// before it gives up mounting at start. It takes a few milliseconds unless the disk is
/// very slow.
const LONE_NODE_ACTIVE_WAIT: Duration = Duration::from_secs(60);

impl Daemon {
    /// Before anything mounts: a one-node home from before the cluster layer becomes a
    /// one-node cluster (its registries move into the replicated configuration); a node
    /// that alone makes the quorum waits until it holds its lease, so file systems it had
    /// mounted are mounted again before the daemon answers. A node of a larger cluster
    /// goes on at once and mounts once it is active.
    pub(super) fn join_at_start(&self) -> Result<bool> {
        let lone = self.is_lone_quorum_node();
        if !lone {
            return Ok(false);
        }
        if !self.member.wait_active(LONE_NODE_ACTIVE_WAIT) {
            tracing::error!(
                "this node is the cluster's only quorum node but did not become active within \
                 {LONE_NODE_ACTIVE_WAIT:?}; see the log above"
            );
            return Ok(false);
        }
        if self.cluster.format == 0 {
            self.import_home_registries(&self.home)?;
            let mut upgraded = self.cluster.clone();
            upgraded.format = CLUSTER_FORMAT;
            upgraded.address = LOOPBACK_ANY_PORT.into();
            let mut text = serde_json::to_vec_pretty(&upgraded).expect("serializes");
            text.push(b'\n');
            write_atomic(&self.home.cluster_path(), &text)?;
            tracing::info!(
                "this home from before the cluster layer is now a one-node cluster; its NSD, \
                 file system and array tables are in the replicated configuration"
            );
        }
        Ok(true)
    }

    /// Whether this node's vote alone is a majority: one quorum node, this one (known from
    /// the applied configuration, the pending bootstrap entry, or an old one-node home).
    fn is_lone_quorum_node(&self) -> bool {
        let me = self.cluster.node_number;
        let state = self.member.state();
        if state.identity.is_some() {
            let quorum: Vec<u32> = state.quorum_nodes().map(|n| n.number).collect();
            return quorum == [me];
        }
        if self.cluster.format == 0 {
            return true;
        }
        match self.home.bootstrap() {
            Ok(Some(Command::Create { nodes, .. })) => {
                let quorum: Vec<u32> = (1..)
                    .zip(&nodes)
                    .filter(|(_, n)| n.designation.quorum)
                    .map(|(number, _)| number)
                    .collect();
                quorum == [me]
            }
            _ => false,
        }
    }

    pub(super) fn cluster_request(&self, request: Request) -> Result<Reply> {
        match request {
            Request::ClusterShow => Ok(Reply::Cluster(Box::new(self.cluster_view()?))),
            Request::NodeAdd { nodes } => self.node_add(nodes),
            Request::NodeDelete { names } => self.node_delete(names),
            Request::NodeChange {
                names,
                quorum,
                manager,
                address,
            } => self.node_change(names, quorum, manager, address),
            Request::ConfigSet { nodes, changes } => {
                let _admin = self.admin.lock();
                self.member.propose(Command::SetParams { nodes, changes })?;
                Ok(Reply::Done)
            }
            Request::ClusterState { names } => Ok(Reply::States(self.cluster_states(&names)?)),
            other => unreachable!("not a cluster request: {other:?}"),
        }
    }

    fn created_state(&self) -> Result<ConfigState> {
        let state = self.member.state();
        if state.identity.is_none() {
            bail!(
                "this node has no cluster configuration yet: a new cluster needs a majority \
                 of its quorum nodes running (`tessera startup -a`), a new node needs the \
                 cluster manager to reach it; see `tessera state -a`"
            );
        }
        Ok(state)
    }

    fn cluster_view(&self) -> Result<ClusterView> {
        let state = self.created_state()?;
        let status = self.member.status();
        Ok(ClusterView {
            identity: state.identity.clone().expect("created"),
            nodes: state.nodes.values().cloned().collect(),
            me: self.member.me(),
            manager: status.manager,
            config_version: state.version,
            params: state.params,
        })
    }

    fn node_add(&self, nodes: Vec<NodeSpec>) -> Result<Reply> {
        let _admin = self.admin.lock();
        let state = self.created_state()?;
        if let Some(alone) = state
            .nodes
            .values()
            .find(|n| n.address == LOOPBACK_ANY_PORT)
        {
            bail!(
                "node {} listens only on loopback (a one-node cluster made without -N), so no \
                 other node can reach it; give it an address first: `tessera node change -N \
                 {} --address HOST:PORT` and restart its daemon",
                alone.name,
                alone.name
            );
        }
        let mut all: Vec<NodeSpec> = state
            .nodes
            .values()
            .map(|n| NodeSpec {
                name: n.name.clone(),
                designation: n.designation,
                address: n.address.clone(),
            })
            .collect();
        all.extend(nodes.iter().cloned());
        check_unique(&all).map_err(|e| anyhow::anyhow!("{e}; nothing was added"))?;
        match self.member.propose(Command::AddNodes { nodes })? {
            Response::Added { nodes } => {
                self.wait_applied(|s| nodes.iter().all(|n| s.nodes.contains_key(&n.number)));
                Ok(Reply::NodesAdded(nodes))
            }
            other => bail!("the cluster answered an addition with {other:?}"),
        }
    }

    /// Waits a little for this node to apply what a leader elsewhere already committed.
    fn wait_applied(&self, done: impl Fn(&ConfigState) -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !done(&self.member.state()) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn node_delete(&self, names: Vec<String>) -> Result<Reply> {
        let _admin = self.admin.lock();
        let state = self.created_state()?;
        let mut records = Vec::new();
        for name in &names {
            let Some(record) = state.node_by_name(name) else {
                bail!("{name} is not a node of this cluster; `tessera cluster ls` lists them");
            };
            if record.number == self.member.me() {
                bail!(
                    "{name} is the node this command runs on; run `tessera node delete` on \
                     another node of the cluster"
                );
            }
            records.push(record.clone());
        }
        let states = self.member.node_states(&records);
        for (record, (word, _)) in records.iter().zip(&states) {
            if word == "active" || word == "arbitrating" {
                bail!(
                    "node {} is running ({word}); stop it first with `tessera shutdown -N {}`; \
                     nothing was deleted",
                    record.name,
                    record.name
                );
            }
        }
        for fs in self.file_systems()?.file_systems {
            if let Some(on) = fs.mounted.then_some(fs.mounted_on.as_deref()).flatten() {
                if names.iter().any(|n| n == on) {
                    bail!(
                        "file system {} is still recorded as mounted on node {on}; start {on} \
                         and unmount it there (`tessera umount {}`); nothing was deleted",
                        fs.name,
                        fs.name
                    );
                }
            }
        }
        for da in self.arrays()?.arrays {
            if let Some(server) = da
                .server
                .as_deref()
                .filter(|s| names.iter().any(|n| n == s))
            {
                bail!(
                    "node {server} serves declustered array {}; delete the array first \
                     (`tessera da delete {}` on {server}); nothing was deleted",
                    da.name,
                    da.name
                );
            }
        }
        self.member.propose(Command::DeleteNodes { names })?;
        Ok(Reply::Done)
    }

    fn node_change(
        &self,
        names: Vec<String>,
        quorum: Option<bool>,
        manager: Option<bool>,
        address: Option<String>,
    ) -> Result<Reply> {
        let _admin = self.admin.lock();
        self.created_state()?;
        if let Some(address) = address {
            let [name] = names.as_slice() else {
                bail!("--address changes one node at a time; give one node with -N");
            };
            self.member.propose(Command::SetAddress {
                name: name.clone(),
                address,
            })?;
        }
        if quorum.is_some() || manager.is_some() {
            self.member.propose(Command::ChangeNodes {
                names,
                quorum,
                manager,
            })?;
        }
        Ok(Reply::Done)
    }

    pub(super) fn cluster_states(&self, names: &[String]) -> Result<ClusterStates> {
        let state = self.member.state();
        let status = self.member.status();
        if state.identity.is_none() {
            // No configuration yet: only this node can be described.
            let row = NodeStateRow {
                number: self.cluster.node_number,
                name: self.cluster.node_name.clone(),
                designation: Default::default(),
                state: "arbitrating".into(),
                epoch: None,
            };
            return Ok(ClusterStates {
                rows: vec![row],
                manager: None,
                quorum_nodes_defined: 0,
                quorum_nodes_up: 0,
                quorum_needed: 0,
                fs_managers: Default::default(),
            });
        }
        let mut records = Vec::new();
        for name in names {
            let record = state.node_by_name(name).with_context(|| {
                format!("{name} is not a node of this cluster; `tessera cluster ls` lists them")
            })?;
            records.push(record.clone());
        }
        let all: Vec<_> = state.nodes.values().cloned().collect();
        // The quorum summary needs every quorum node, whatever rows were asked for.
        let asked = if records.is_empty() { &all } else { &records };
        let quorum: Vec<_> = all
            .iter()
            .filter(|n| n.designation.quorum)
            .cloned()
            .collect();
        let mut wanted = asked.clone();
        for q in &quorum {
            if !wanted.iter().any(|w| w.number == q.number) {
                wanted.push(q.clone());
            }
        }
        let answers = self.member.node_states(&wanted);
        let quorum_up = wanted
            .iter()
            .zip(&answers)
            .filter(|(n, (word, _))| n.designation.quorum && word == "active")
            .count();
        let rows = asked
            .iter()
            .zip(&answers)
            .map(|(n, (word, epoch))| NodeStateRow {
                number: n.number,
                name: n.name.clone(),
                designation: n.designation,
                state: word.clone(),
                // A node that does not answer: its incarnation as the configuration has it,
                // until the manager expels it.
                epoch: epoch.or_else(|| state.incarnations.get(&n.number).copied()),
            })
            .collect();
        // Without a lease this node cannot tell whether the manager it last followed still
        // is one (a cut-off manager does not know it was replaced).
        let active = status.state == tessera_cluster::lease::NodeState::Active;
        let manager = status.manager.filter(|_| active);
        let mut fs_managers = std::collections::BTreeMap::<String, Vec<String>>::new();
        for fs in self.file_systems()?.file_systems {
            if let Some(node) = fs.mounted.then_some(fs.mounted_on).flatten() {
                fs_managers.entry(node).or_default().push(fs.name);
            }
        }
        Ok(ClusterStates {
            rows,
            manager,
            quorum_nodes_defined: quorum.len(),
            quorum_nodes_up: quorum_up,
            quorum_needed: quorum.len() / 2 + 1,
            fs_managers,
        })
    }
}
