//! The replicated cluster configuration: what every node of the cluster agrees on.
//!
//! [`ConfigState`] is the Raft state machine. It changes only by applying a [`Command`]
//! committed by a majority of the quorum nodes, in log order, on every node; `apply` is
//! deterministic (no clock, no randomness, no I/O: times and random ids travel inside the
//! command) and either makes the whole change or none of it and says why.
//!
//! It holds:
//! - the cluster's identity (name, id, remote shell) and its node table;
//! - configuration parameters ([`crate::params`]);
//! - *documents*: versioned JSON values written with compare-and-set, for registries the
//!   layers above keep (NSDs, file systems, declustered arrays), so a change computed from
//!   a stale copy is refused rather than lost;
//! - node incarnations: the epoch each running node was given when it joined. Epochs come
//!   from one counter that only grows; an expelled incarnation's epoch is never valid
//!   again, which is what drive and NSD servers check to fence late writes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::node::{check_unique, Designation, NodeNumber, NodeSpec};
use crate::params::{ParamChange, Params, Scope, PARAMS};

/// The largest document (bytes of JSON). The configuration is replicated to every node
/// and rewritten on each change, so it stays small; NSD tables of thousands of disks fit.
pub const MAX_DOCUMENT_BYTES: usize = 16 << 20;

/// Who the cluster is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterIdentity {
    pub name: String,
    /// Lower-case hex of 16 random bytes; written into every NSD descriptor.
    pub id: String,
    pub created_unix: u64,
    /// The command that reaches a node whose daemon is down (`startup -a`), GPFS's `-r`.
    pub remote_shell: String,
}

/// One node of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub number: NodeNumber,
    pub name: String,
    pub address: String,
    pub designation: Designation,
}

/// A versioned JSON value; version 0 means "never written".
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Document {
    pub version: u64,
    pub json: String,
}

/// A change to the configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// The first entry of a new cluster.
    Create {
        identity: ClusterIdentity,
        nodes: Vec<NodeSpec>,
        /// Parameters different from the defaults (`cluster create --config`).
        params: Vec<ParamChange>,
    },
    AddNodes {
        nodes: Vec<NodeSpec>,
    },
    DeleteNodes {
        names: Vec<String>,
    },
    /// `node change`: `None` leaves that half of the designation as it is.
    ChangeNodes {
        names: Vec<String>,
        quorum: Option<bool>,
        manager: Option<bool>,
    },
    /// `node change --address`: where the node's daemon listens from its next start.
    SetAddress {
        name: String,
        address: String,
    },
    /// `config set`; empty `nodes` is the cluster-wide value.
    SetParams {
        nodes: Vec<String>,
        changes: Vec<ParamChange>,
    },
    /// Compare-and-set of a document: applies only if its version is still `expected`.
    PutDocument {
        key: String,
        expected: u64,
        json: String,
    },
    /// A node's daemon started (or lost its lease and comes back): a new incarnation with a
    /// new epoch. Its previous epoch, if any, is fenced.
    Join {
        node: NodeNumber,
        /// A random number drawn once per daemon process: a Join that arrives twice (a
        /// retried proposal whose first attempt committed late) gets the same epoch back
        /// instead of retiring the incarnation that is running.
        process: u64,
    },
    /// The cluster manager expels an incarnation that stopped renewing its lease. Applies
    /// only if `epoch` is still the node's current one (a node that re-joined meanwhile is
    /// not expelled by a late decision about its previous life).
    Expel {
        node: NodeNumber,
        epoch: u64,
        /// The Raft term of the manager that decided it.
        term: u64,
    },
    /// A new cluster manager starts managing: committed before it grants or expels, so an
    /// expel decided by an earlier manager that only commits after this is refused (its
    /// decision may predate leases this manager's predecessors granted).
    Takeover {
        node: NodeNumber,
        term: u64,
    },
}

/// What applying a command did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// A blank or membership entry: nothing of ours changed.
    #[default]
    Nothing,
    /// The change is made; the configuration is now at `version`.
    Changed { version: u64 },
    /// The nodes added, with their numbers.
    Added { nodes: Vec<NodeRecord> },
    /// The epoch of the new incarnation.
    Joined { epoch: u64 },
    /// Nothing changed, and why (for the admin).
    Refused { reason: String },
}

/// The state machine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigState {
    pub identity: Option<ClusterIdentity>,
    pub nodes: BTreeMap<NodeNumber, NodeRecord>,
    pub next_node_number: NodeNumber,
    pub params: Params,
    pub documents: BTreeMap<String, Document>,
    /// The epoch the next incarnation gets; starts at 1 so 0 never is one.
    pub next_epoch: u64,
    /// The current incarnation of each running node; absent when the node never joined or
    /// was expelled.
    pub incarnations: BTreeMap<NodeNumber, u64>,
    /// The `process` number of each current incarnation's Join.
    pub incarnation_processes: BTreeMap<NodeNumber, u64>,
    /// Bumped by every change, so a listing can say which version it shows.
    pub version: u64,
    /// The longest disk lease ever in force (ms): a new cluster manager waits this long
    /// before expelling an incarnation it has not heard from, because its predecessor may
    /// have granted such a lease before `failureDetectionTime` was shortened.
    pub longest_lease_ms: u64,
    /// The term of the latest cluster manager that took over, and its node.
    pub manager_term: u64,
    pub manager: Option<NodeNumber>,
}

impl ConfigState {
    /// Applies one committed command. Deterministic; all or nothing.
    pub fn apply(&mut self, command: &Command) -> Response {
        let mut next = self.clone();
        match next.apply_to_copy(command) {
            Ok(response) => {
                next.version += 1;
                let response = match response {
                    Response::Nothing => Response::Changed {
                        version: next.version,
                    },
                    other => other,
                };
                *self = next;
                response
            }
            Err(reason) => Response::Refused { reason },
        }
    }

    fn apply_to_copy(&mut self, command: &Command) -> Result<Response, String> {
        if self.identity.is_none() && !matches!(command, Command::Create { .. }) {
            return Err("the cluster is not created yet".into());
        }
        match command {
            Command::Create {
                identity,
                nodes,
                params,
            } => self.create(identity, nodes, params),
            Command::AddNodes { nodes } => self.add_nodes(nodes),
            Command::DeleteNodes { names } => self.delete_nodes(names),
            Command::ChangeNodes {
                names,
                quorum,
                manager,
            } => self.change_nodes(names, *quorum, *manager),
            Command::SetAddress { name, address } => self.set_address(name, address),
            Command::SetParams { nodes, changes } => self.set_params(nodes, changes),
            Command::PutDocument {
                key,
                expected,
                json,
            } => self.put_document(key, *expected, json),
            Command::Join { node, process } => self.join(*node, *process),
            Command::Expel { node, epoch, term } => self.expel(*node, *epoch, *term),
            Command::Takeover { node, term } => self.takeover(*node, *term),
        }
    }

    fn create(
        &mut self,
        identity: &ClusterIdentity,
        nodes: &[NodeSpec],
        params: &[ParamChange],
    ) -> Result<Response, String> {
        if let Some(existing) = &self.identity {
            return Err(format!("cluster {} already exists", existing.name));
        }
        self.identity = Some(identity.clone());
        self.next_node_number = 1;
        self.next_epoch = 1;
        let added = self.add_nodes(nodes)?;
        self.check_quorum_nodes()?;
        self.set_params(&[], params)?;
        Ok(added)
    }

    fn add_nodes(&mut self, nodes: &[NodeSpec]) -> Result<Response, String> {
        let mut all: Vec<NodeSpec> = self.nodes.values().map(spec_of).collect();
        all.extend(nodes.iter().cloned());
        check_unique(&all).map_err(|e| format!("{e}; nothing was added"))?;
        let mut added = Vec::new();
        for spec in nodes {
            let record = NodeRecord {
                number: self.next_node_number,
                name: spec.name.clone(),
                address: spec.address.clone(),
                designation: spec.designation,
            };
            self.next_node_number += 1;
            self.nodes.insert(record.number, record.clone());
            added.push(record);
        }
        Ok(Response::Added { nodes: added })
    }

    fn delete_nodes(&mut self, names: &[String]) -> Result<Response, String> {
        let numbers = self.numbers_of(names)?;
        for number in &numbers {
            self.nodes.remove(number);
            self.incarnations.remove(number);
            self.incarnation_processes.remove(number);
            self.params.per_node.remove(number);
        }
        self.check_quorum_nodes()
            .map_err(|e| format!("{e}; nothing was deleted"))?;
        Ok(Response::Nothing)
    }

    fn change_nodes(
        &mut self,
        names: &[String],
        quorum: Option<bool>,
        manager: Option<bool>,
    ) -> Result<Response, String> {
        for number in self.numbers_of(names)? {
            let node = self.nodes.get_mut(&number).expect("numbers_of checked it");
            node.designation.quorum = quorum.unwrap_or(node.designation.quorum);
            node.designation.manager = manager.unwrap_or(node.designation.manager);
        }
        self.check_quorum_nodes()
            .map_err(|e| format!("{e}; nothing was changed"))?;
        Ok(Response::Nothing)
    }

    fn set_address(&mut self, name: &str, address: &str) -> Result<Response, String> {
        let normalized = crate::node::parse_address(address)?;
        if normalized != address {
            return Err(format!(
                "address `{address}` is not normalized (`{normalized}`)"
            ));
        }
        let [number] = self.numbers_of(&[name.to_string()])?[..] else {
            unreachable!("one name, one number");
        };
        if let Some(other) = self
            .nodes
            .values()
            .find(|n| n.address == address && n.number != number)
        {
            return Err(format!(
                "address {address} is already node {}'s; nothing was changed",
                other.name
            ));
        }
        self.nodes
            .get_mut(&number)
            .expect("numbers_of checked it")
            .address = address.into();
        Ok(Response::Nothing)
    }

    fn set_params(
        &mut self,
        nodes: &[String],
        changes: &[ParamChange],
    ) -> Result<Response, String> {
        let numbers = self.numbers_of(nodes)?;
        for change in changes {
            let spec = PARAMS
                .iter()
                .find(|p| p.name == change.name)
                .ok_or_else(|| format!("unknown configuration parameter `{}`", change.name))?;
            if let Some(value) = &change.value {
                let normalized = (spec.check)(value)?;
                assert_eq!(&normalized, value, "changes arrive normalized");
            }
            if numbers.is_empty() {
                set_or_clear(&mut self.params.cluster, &change.name, &change.value);
                continue;
            }
            if spec.scope == Scope::Cluster {
                return Err(format!("{} is cluster-wide; set it without -N", spec.name));
            }
            for number in &numbers {
                let own = self.params.per_node.entry(*number).or_default();
                set_or_clear(own, &change.name, &change.value);
            }
            self.params.per_node.retain(|_, m| !m.is_empty());
        }
        let lease = self.params.lease_timings().lease;
        self.longest_lease_ms = self.longest_lease_ms.max(lease.as_millis() as u64);
        Ok(Response::Nothing)
    }

    /// The longest disk lease ever in force (at least the current one).
    pub fn longest_lease(&self) -> std::time::Duration {
        let current = self.params.lease_timings().lease;
        current.max(std::time::Duration::from_millis(self.longest_lease_ms))
    }

    fn put_document(&mut self, key: &str, expected: u64, json: &str) -> Result<Response, String> {
        if json.len() > MAX_DOCUMENT_BYTES {
            return Err(format!(
                "{key}: {} bytes is more than the {MAX_DOCUMENT_BYTES} a configuration \
                 document may hold",
                json.len()
            ));
        }
        let document = self.documents.entry(key.to_string()).or_default();
        if document.version != expected {
            return Err(format!(
                "{key} changed meanwhile (version {} is now {}); run the command again",
                expected, document.version
            ));
        }
        document.version += 1;
        document.json = json.to_string();
        Ok(Response::Nothing)
    }

    fn join(&mut self, node: NodeNumber, process: u64) -> Result<Response, String> {
        if !self.nodes.contains_key(&node) {
            return Err(format!("node number {node} is not in the cluster"));
        }
        if let Some(epoch) = self.incarnations.get(&node) {
            if self.incarnation_processes.get(&node) == Some(&process) {
                return Ok(Response::Joined { epoch: *epoch });
            }
        }
        let epoch = self.next_epoch;
        assert!(epoch > 0, "epoch 0 is never issued");
        self.next_epoch += 1;
        self.incarnations.insert(node, epoch);
        self.incarnation_processes.insert(node, process);
        Ok(Response::Joined { epoch })
    }

    fn takeover(&mut self, node: NodeNumber, term: u64) -> Result<Response, String> {
        if term < self.manager_term {
            return Err(format!(
                "manager term {term} is older than term {}",
                self.manager_term
            ));
        }
        self.manager_term = term;
        self.manager = Some(node);
        Ok(Response::Nothing)
    }

    fn expel(&mut self, node: NodeNumber, epoch: u64, term: u64) -> Result<Response, String> {
        if term < self.manager_term {
            return Err(format!(
                "the expel of node {node} was decided by the manager of term {term}, and a \
                 later manager (term {}) has taken over since; not expelled",
                self.manager_term
            ));
        }
        match self.incarnations.get(&node) {
            Some(current) if *current == epoch => {
                self.incarnations.remove(&node);
                self.incarnation_processes.remove(&node);
                Ok(Response::Nothing)
            }
            Some(current) => Err(format!(
                "node {node} runs as epoch {current}, not {epoch}: it re-joined; not expelled"
            )),
            None => Err(format!(
                "node {node} epoch {epoch} is not running; nothing to expel"
            )),
        }
    }

    /// Whether `epoch` is the live incarnation of `node`: what a fenced layer checks.
    pub fn epoch_is_live(&self, node: NodeNumber, epoch: u64) -> bool {
        self.incarnations.get(&node) == Some(&epoch)
    }

    pub fn node_by_name(&self, name: &str) -> Option<&NodeRecord> {
        self.nodes.values().find(|n| n.name == name)
    }

    pub fn quorum_nodes(&self) -> impl Iterator<Item = &NodeRecord> {
        self.nodes.values().filter(|n| n.designation.quorum)
    }

    /// Quorum nodes that stand for cluster manager: the quorum-manager nodes, or every
    /// quorum node when none is a manager (GPFS's rule when no manager is designated).
    pub fn manager_candidates(&self) -> Vec<NodeNumber> {
        let quorum: Vec<&NodeRecord> = self.quorum_nodes().collect();
        let managers: Vec<NodeNumber> = quorum
            .iter()
            .filter(|n| n.designation.manager)
            .map(|n| n.number)
            .collect();
        if managers.is_empty() {
            quorum.iter().map(|n| n.number).collect()
        } else {
            managers
        }
    }

    pub fn document(&self, key: &str) -> Document {
        self.documents.get(key).cloned().unwrap_or_default()
    }

    fn numbers_of(&self, names: &[String]) -> Result<Vec<NodeNumber>, String> {
        let mut numbers = Vec::new();
        for name in names {
            let node = self.node_by_name(name).ok_or_else(|| {
                format!("node {name} is not in the cluster (see `tessera cluster ls`)")
            })?;
            if numbers.contains(&node.number) {
                return Err(format!("node {name} is named twice"));
            }
            numbers.push(node.number);
        }
        Ok(numbers)
    }

    fn check_quorum_nodes(&self) -> Result<(), String> {
        if self.quorum_nodes().next().is_none() {
            return Err(
                "the cluster would have no quorum node; keep at least one (three or \
                        five survive node failures)"
                    .into(),
            );
        }
        Ok(())
    }
}

impl crate::store::Replicated for ConfigState {
    type Command = Command;
    type Response = Response;

    fn apply(&mut self, command: &Command) -> Response {
        ConfigState::apply(self, command)
    }
}

fn spec_of(record: &NodeRecord) -> NodeSpec {
    NodeSpec {
        name: record.name.clone(),
        designation: record.designation,
        address: record.address.clone(),
    }
}

fn set_or_clear(map: &mut BTreeMap<String, String>, name: &str, value: &Option<String>) {
    match value {
        Some(v) => map.insert(name.to_string(), v.clone()),
        None => map.remove(name),
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::parse_node_list;

    fn created() -> ConfigState {
        let mut s = ConfigState::default();
        let nodes = parse_node_list(
            "n1:quorum-manager:10.0.0.1,n2:quorum-manager:10.0.0.2,n3:quorum:10.0.0.3",
        )
        .unwrap();
        let identity = ClusterIdentity {
            name: "c1".into(),
            id: "00".repeat(16),
            created_unix: 1,
            remote_shell: "ssh".into(),
        };
        let r = s.apply(&Command::Create {
            identity,
            nodes,
            params: vec![],
        });
        assert!(
            matches!(r, Response::Added { ref nodes } if nodes.len() == 3),
            "{r:?}"
        );
        s
    }

    #[test]
    fn nothing_changes_before_create() {
        let mut s = ConfigState::default();
        let r = s.apply(&Command::Join {
            node: 1,
            process: 1,
        });
        assert!(matches!(r, Response::Refused { .. }));
        assert_eq!(s, ConfigState::default());
    }

    #[test]
    fn nodes_get_numbers_that_are_never_reused() {
        let mut s = created();
        let r = s.apply(&Command::DeleteNodes {
            names: vec!["n3".into()],
        });
        assert!(matches!(r, Response::Changed { .. }), "{r:?}");
        let r = s.apply(&Command::AddNodes {
            nodes: parse_node_list("n4::10.0.0.4").unwrap(),
        });
        let Response::Added { nodes } = r else {
            panic!("{r:?}")
        };
        assert_eq!(nodes[0].number, 4);
    }

    #[test]
    fn refusals_change_nothing() {
        let mut s = created();
        let before = s.clone();
        // A duplicate address in the middle of a list: the first node is not added either.
        let r = s.apply(&Command::AddNodes {
            nodes: parse_node_list("n4::10.0.0.4,n5::10.0.0.1").unwrap(),
        });
        assert!(matches!(r, Response::Refused { ref reason } if reason.contains("n1 and n5")));
        let r = s.apply(&Command::DeleteNodes {
            names: vec!["n1".into(), "n2".into(), "n3".into()],
        });
        assert!(matches!(r, Response::Refused { ref reason } if reason.contains("no quorum node")));
        let r = s.apply(&Command::ChangeNodes {
            names: vec!["n1".into(), "n2".into(), "n3".into()],
            quorum: Some(false),
            manager: None,
        });
        assert!(matches!(r, Response::Refused { .. }));
        let r = s.apply(&Command::DeleteNodes {
            names: vec!["nope".into()],
        });
        assert!(matches!(r, Response::Refused { ref reason } if reason.contains("nope")));
        assert_eq!(s, before);
    }

    #[test]
    fn epochs_only_grow_and_expel_fences_only_the_current_incarnation() {
        let mut s = created();
        let Response::Joined { epoch: e1 } = s.apply(&Command::Join {
            node: 2,
            process: 1,
        }) else {
            panic!()
        };
        let Response::Joined { epoch: e2 } = s.apply(&Command::Join {
            node: 2,
            process: 2,
        }) else {
            panic!()
        };
        assert!(e2 > e1);
        assert!(!s.epoch_is_live(2, e1) && s.epoch_is_live(2, e2));
        // A late expel of the earlier incarnation does not touch the new one.
        let r = s.apply(&Command::Expel {
            node: 2,
            epoch: e1,
            term: 0,
        });
        assert!(matches!(r, Response::Refused { .. }));
        assert!(s.epoch_is_live(2, e2));
        s.apply(&Command::Expel {
            node: 2,
            epoch: e2,
            term: 0,
        });
        assert!(!s.epoch_is_live(2, e2));
        let Response::Joined { epoch: e3 } = s.apply(&Command::Join {
            node: 2,
            process: 3,
        }) else {
            panic!()
        };
        assert!(e3 > e2);
    }

    #[test]
    fn a_join_that_arrives_twice_keeps_the_running_incarnation() {
        let mut s = created();
        let join = Command::Join {
            node: 3,
            process: 77,
        };
        let first = s.apply(&join);
        let again = s.apply(&join);
        assert_eq!(first, again);
        let Response::Joined { epoch } = first else {
            panic!("{first:?}")
        };
        assert!(s.epoch_is_live(3, epoch));
    }

    #[test]
    fn an_expel_decided_before_a_takeover_is_refused() {
        let mut s = created();
        let Response::Joined { epoch } = s.apply(&Command::Join {
            node: 2,
            process: 9,
        }) else {
            panic!()
        };
        s.apply(&Command::Takeover { node: 1, term: 5 });
        let stale = Command::Expel {
            node: 2,
            epoch,
            term: 4,
        };
        assert!(matches!(s.apply(&stale), Response::Refused { .. }));
        assert!(s.epoch_is_live(2, epoch));
        let r = s.apply(&Command::Takeover { node: 3, term: 4 });
        assert!(matches!(r, Response::Refused { .. }));
        let current = Command::Expel {
            node: 2,
            epoch,
            term: 5,
        };
        assert!(matches!(s.apply(&current), Response::Changed { .. }));
        assert_eq!(s.manager, Some(1));
    }

    #[test]
    fn documents_are_compare_and_set() {
        let mut s = created();
        let put = |expected| Command::PutDocument {
            key: "nsd".into(),
            expected,
            json: format!("{{\"v\":{expected}}}"),
        };
        assert!(matches!(s.apply(&put(0)), Response::Changed { .. }));
        let r = s.apply(&put(0));
        assert!(matches!(r, Response::Refused { ref reason } if reason.contains("meanwhile")));
        assert!(matches!(s.apply(&put(1)), Response::Changed { .. }));
        assert_eq!(s.document("nsd").version, 2);
    }

    #[test]
    fn params_cluster_wide_and_per_node() {
        let mut s = created();
        let changes = crate::params::parse_changes("failureDetectionTime=3", false).unwrap();
        let r = s.apply(&Command::SetParams {
            nodes: vec![],
            changes: changes.clone(),
        });
        assert!(matches!(r, Response::Changed { .. }));
        assert_eq!(s.params.get("failureDetectionTime", Some(1)), "3");
        let r = s.apply(&Command::SetParams {
            nodes: vec!["n1".into()],
            changes,
        });
        assert!(matches!(r, Response::Refused { ref reason } if reason.contains("cluster-wide")));
    }

    #[test]
    fn manager_candidates_prefer_quorum_managers() {
        let s = created();
        assert_eq!(s.manager_candidates(), vec![1, 2]);
    }

    #[test]
    fn a_node_moves_to_a_free_normalized_address_only() {
        let mut s = created();
        let moved = s.apply(&Command::SetAddress {
            name: "n2".into(),
            address: "10.0.0.9:1191".into(),
        });
        assert!(matches!(moved, Response::Changed { .. }), "{moved:?}");
        assert_eq!(s.node_by_name("n2").unwrap().address, "10.0.0.9:1191");
        let before = s.clone();
        for (name, address) in [("n1", "10.0.0.9:1191"), ("n1", "10.0.0.7"), ("nx", "h:1")] {
            let r = s.apply(&Command::SetAddress {
                name: name.into(),
                address: address.into(),
            });
            assert!(
                matches!(r, Response::Refused { .. }),
                "{name} {address}: {r:?}"
            );
        }
        assert_eq!(s, before, "refused changes change nothing");
    }
}
