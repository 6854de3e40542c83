//! `state [-a | -N nodes] [-s] [-Y]` [mmgetstate]: each node's daemon state as the local
//! daemon sees it, and the quorum summary. With the local daemon down, this node is `down`
//! and the command asks the others itself, over the node transport with the cluster
//! secret, from this node's copy of the node table.

use std::sync::Arc;

use anyhow::Result;
use tessera_cluster::net::{ask_statuses, nothing_listens, TransportNet};
use tessera_cluster::rpc::{NetError, NodeStatus};
use tessera_cluster::state::NodeRecord;
use tessera_transport::{ClusterId, ClusterSecret, Identity};

use super::cluster::cached_nodes;
use super::lifecycle::PING_TIMEOUT;
use super::remote::parse_node_names;
use crate::cli::NodeSelectArgs;
use crate::config::{ClusterConfig, Home};
use crate::daemon::member::STATUS_TIMEOUT;
use crate::output::{Table, YRecord};
use crate::rpc::{Client, ClusterStates, NodeStateRow, Reply, Request};

pub fn state(home: &Home, select: &NodeSelectArgs, summary: bool, machine: bool) -> Result<()> {
    let cluster = home.cluster()?;
    if let Err(e) = Client::connect(home) {
        if Client::denied(&e) {
            return Err(e);
        }
    }
    let names = if select.all {
        Vec::new()
    } else if let Some(text) = &select.nodes {
        parse_node_names(text)?
    } else {
        vec![cluster.node_name.clone()]
    };
    let (states, asked) = match Client::ping(home, PING_TIMEOUT) {
        None => offline_states(home, &cluster, &names)?,
        Some(_) => match super::call(
            home,
            &Request::ClusterState {
                names: names.clone(),
            },
        ) {
            Ok(Reply::States(states)) => (states, true),
            Ok(other) => return Err(super::unexpected(other)),
            Err(e) => return Err(e),
        },
    };
    if machine {
        print_y(&states, summary);
    } else {
        print_table(&states, summary, asked);
    }
    Ok(())
}

/// The states without the local daemon: this node is `down`; every other node is asked
/// directly (`unknown` if the secret cannot be read). Returns whether others were asked.
fn offline_states(
    home: &Home,
    cluster: &ClusterConfig,
    names: &[String],
) -> Result<(ClusterStates, bool)> {
    let known = cached_nodes(home)?;
    let chosen = super::lifecycle::select_nodes(
        &known.nodes,
        &NodeSelectArgs {
            all: names.is_empty(),
            nodes: (!names.is_empty()).then(|| names.join(",")),
        },
    )?;
    let quorum: Vec<&NodeRecord> = known
        .nodes
        .iter()
        .filter(|n| n.designation.quorum)
        .collect();
    let mut ask: Vec<&NodeRecord> = chosen.iter().collect();
    ask.extend(quorum.iter().copied());
    ask.retain(|n| n.name != cluster.node_name);
    ask.sort_by_key(|n| n.number);
    ask.dedup_by_key(|n| n.number);
    let answers = ask_directly(home, cluster, &ask);
    let state_of = |node: &NodeRecord| -> (String, Option<u64>) {
        if node.name == cluster.node_name {
            return ("down".into(), None);
        }
        let at = ask.iter().position(|n| n.number == node.number);
        match (&answers, at) {
            (Some(answers), Some(at)) => match &answers[at] {
                Ok(status) => (crate::daemon::member::state_word(status), status.epoch),
                Err(e) if nothing_listens(e) => ("down".into(), None),
                Err(_) => ("unknown".into(), None),
            },
            _ => ("unknown".into(), None),
        }
    };
    let rows: Vec<NodeStateRow> = chosen
        .iter()
        .map(|node| {
            let (state, epoch) = state_of(node);
            NodeStateRow {
                number: node.number,
                name: node.name.clone(),
                designation: node.designation,
                state,
                epoch,
            }
        })
        .collect();
    let up = quorum.iter().filter(|n| state_of(n).0 == "active").count();
    let manager = answers.as_ref().and_then(|answers| {
        answers
            .iter()
            .flatten()
            .find(|s| s.state == tessera_cluster::lease::NodeState::Active)
            .and_then(|s| s.manager)
    });
    let states = ClusterStates {
        rows,
        manager,
        quorum_nodes_defined: quorum.len(),
        quorum_nodes_up: up,
        quorum_needed: quorum.len() / 2 + 1,
        // Only the daemons know who owns what.
        fs_managers: Default::default(),
    };
    Ok((states, answers.is_some()))
}

/// Asks `nodes` for their status over the node transport, as this node; `None` when this
/// node cannot authenticate (no readable secret).
fn ask_directly(
    home: &Home,
    cluster: &ClusterConfig,
    nodes: &[&NodeRecord],
) -> Option<Vec<Result<NodeStatus, NetError>>> {
    let secret = ClusterSecret::load(&home.secret_path()).ok()?;
    let identity = Arc::new(Identity {
        cluster_id: ClusterId(cluster.cluster_id_bytes()),
        node_name: cluster.node_name.clone(),
        secret,
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    let net = Arc::new(TransportNet::new(identity));
    let targets: Vec<_> = nodes
        .iter()
        .map(|n| (n.number, n.address.clone()))
        .collect();
    Some(runtime.block_on(ask_statuses(net, &targets, STATUS_TIMEOUT)))
}

fn remarks(row: &NodeStateRow, states: &ClusterStates) -> String {
    let mut words = Vec::new();
    if row.designation.quorum {
        words.push("quorum node".to_string());
    }
    if states.manager == Some(row.number) {
        words.push("cluster manager".to_string());
    }
    // As mmlsmgr says it: the file system manager of each file system mounted anywhere.
    if let Some(managed) = states.fs_managers.get(&row.name) {
        words.push(format!("file system manager of {}", managed.join(" ")));
    }
    words.join(", ")
}

fn print_table(states: &ClusterStates, summary: bool, asked: bool) {
    let mut t = Table::new(&["Node number", "Node name", "State", "Remarks"]).right(&[0]);
    for row in &states.rows {
        t.row(vec![
            row.number.to_string(),
            row.name.clone(),
            row.state.clone(),
            remarks(row, states),
        ]);
    }
    print!("{}", t.render());
    if !summary {
        return;
    }
    println!();
    println!(" Summary information");
    println!("---------------------");
    println!(
        "Number of quorum nodes defined in the cluster:  {}",
        states.quorum_nodes_defined
    );
    if !asked {
        println!("Number of quorum nodes active in the cluster:   unknown");
        println!(
            "Quorum = {}, unknown: no other node was asked (the local daemon is down and \
             the cluster secret cannot be read)",
            states.quorum_needed
        );
        return;
    }
    println!(
        "Number of quorum nodes active in the cluster:   {}",
        states.quorum_nodes_up
    );
    let achieved = if states.quorum_nodes_up >= states.quorum_needed {
        "Quorum achieved"
    } else {
        "Quorum not achieved"
    };
    println!("Quorum = {}, {achieved}", states.quorum_needed);
}

fn print_y(states: &ClusterStates, summary: bool) {
    let y = YRecord::new("state", "");
    println!(
        "{}",
        y.header(&[
            "nodeNumber",
            "nodeName",
            "state",
            "designation",
            "epoch",
            "remarks"
        ])
    );
    for row in &states.rows {
        println!(
            "{}",
            y.data(&[
                row.number.to_string(),
                row.name.clone(),
                row.state.clone(),
                row.designation.to_string(),
                row.epoch.map_or_else(String::new, |e| e.to_string()),
                remarks(row, states),
            ])
        );
    }
    if !summary {
        return;
    }
    let s = YRecord::new("state", "summary");
    println!(
        "{}",
        s.header(&[
            "quorumNodesDefined",
            "quorumNodesActive",
            "quorumNeeded",
            "managerNumber",
        ])
    );
    let manager = states.manager.map_or_else(String::new, |m| m.to_string());
    println!(
        "{}",
        s.data(&[
            states.quorum_nodes_defined.to_string(),
            states.quorum_nodes_up.to_string(),
            states.quorum_needed.to_string(),
            manager,
        ])
    );
}
