//! `state [-a | -N nodes] [-s] [-Y]` [mmgetstate]: each node's daemon state as the local
//! daemon sees it, and the quorum summary. With the local daemon down nobody can be
//! asked: this node is `down` and the others, from this node's copy of the node table,
//! `unknown`.

use anyhow::Result;
use tessera_cluster::state::NodeRecord;

use super::cluster::cached_nodes;
use super::lifecycle::PING_TIMEOUT;
use super::remote::parse_node_names;
use crate::cli::NodeSelectArgs;
use crate::config::{ClusterConfig, Home};
use crate::output::{Table, YRecord};
use crate::rpc::{Client, ClusterStates, NodeStateRow, Reply, Request};

/// The refusal of a daemon from before the cluster layer. Such a daemon still answers for
/// its own node (a ping), which is all a one-node home needs.
const PRE_CLUSTER_DAEMON: &str = "does not run the cluster layer";

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
        None => (offline_states(home, &cluster, &names, "down")?, false),
        Some(_) => match super::call(
            home,
            &Request::ClusterState {
                names: names.clone(),
            },
        ) {
            Ok(Reply::States(states)) => (states, true),
            Ok(other) => return Err(super::unexpected(other)),
            Err(e) if e.to_string().contains(PRE_CLUSTER_DAEMON) => {
                (offline_states(home, &cluster, &names, "active")?, false)
            }
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

/// The states this node can tell without its daemon: its own (`local_state`) and
/// `unknown` for every other node.
fn offline_states(
    home: &Home,
    cluster: &ClusterConfig,
    names: &[String],
    local_state: &str,
) -> Result<ClusterStates> {
    let known = cached_nodes(home)?;
    let chosen = super::lifecycle::select_nodes(
        &known.nodes,
        &NodeSelectArgs {
            all: names.is_empty(),
            nodes: (!names.is_empty()).then(|| names.join(",")),
        },
    )?;
    let rows: Vec<NodeStateRow> = chosen
        .iter()
        .map(|node| NodeStateRow {
            number: node.number,
            name: node.name.clone(),
            designation: node.designation,
            state: if node.name == cluster.node_name {
                local_state.to_string()
            } else {
                "unknown".to_string()
            },
            epoch: None,
        })
        .collect();
    let quorum: Vec<&NodeRecord> = known
        .nodes
        .iter()
        .filter(|n| n.designation.quorum)
        .collect();
    let up = quorum
        .iter()
        .filter(|n| n.name == cluster.node_name && local_state == "active")
        .count();
    Ok(ClusterStates {
        rows,
        manager: None,
        quorum_nodes_defined: quorum.len(),
        quorum_nodes_up: up,
        quorum_needed: quorum.len() / 2 + 1,
    })
}

fn remarks(row: &NodeStateRow, states: &ClusterStates) -> String {
    let mut words = Vec::new();
    if row.designation.quorum {
        words.push("quorum node");
    }
    if states.manager == Some(row.number) {
        words.push("cluster manager");
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
            "Quorum = {}, unknown: no other node was asked (the local daemon is down or \
             predates the cluster layer)",
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
