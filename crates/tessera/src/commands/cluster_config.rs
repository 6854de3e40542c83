//! `config set` and `config ls` [mmchconfig, mmlsconfig]. Names and values are checked
//! here with the cluster's own rules (`tessera_cluster::params`), so a typo is refused
//! before anything is proposed, with the list of the parameters Tessera implements.
//!
//! `config ls` shows every known parameter with the value in force; a value nobody set is
//! followed by `(default)`. Per-node values follow in `[node,...]` sections, nodes with
//! the same settings together, as mmlsconfig prints them.

use std::collections::BTreeMap;

use anyhow::{anyhow, Result};
use tessera_cluster::params::{parse_changes, PARAMS};

use super::cluster::cluster_view;
use super::remote::parse_node_names;
use crate::config::Home;
use crate::output::YRecord;
use crate::rpc::{ClusterView, Reply, Request};

/// `config set NAME=VALUE[,...] [-N nodes]`.
pub fn set(home: &Home, changes_text: &str, nodes_text: Option<&str>) -> Result<()> {
    let nodes = match nodes_text {
        Some(text) => parse_node_names(text)?,
        None => Vec::new(),
    };
    let changes =
        parse_changes(changes_text, !nodes.is_empty()).map_err(|e| anyhow!("{e}; nothing set"))?;
    require_view(home)?;
    match super::call(home, &Request::ConfigSet { nodes, changes })? {
        Reply::Done => {}
        other => return Err(super::unexpected(other)),
    }
    println!(
        "tessera config set: Propagating the cluster configuration data to all affected nodes."
    );
    println!("tessera config set: Command successfully completed");
    Ok(())
}

fn require_view(home: &Home) -> Result<ClusterView> {
    cluster_view(home)?.ok_or_else(|| {
        anyhow!(
            "the local daemon is not running; the configuration is read and changed through \
             it: start it with `tessera startup`"
        )
    })
}

/// `config ls [-Y]`.
pub fn ls(home: &Home, machine: bool) -> Result<()> {
    let view = require_view(home)?;
    if machine {
        print_y(&view);
        return Ok(());
    }
    let title = format!("Configuration data for cluster {}:", view.identity.name);
    println!("{title}");
    println!("{}", "-".repeat(title.len()));
    println!("clusterName {}", view.identity.name);
    println!("clusterId {}", view.identity.id);
    for spec in PARAMS {
        let value = view.params.get(spec.name, None);
        if view.params.cluster.contains_key(spec.name) {
            println!("{} {value}", spec.name);
        } else {
            println!("{} {value} (default)", spec.name);
        }
    }
    for (names, settings) in node_sections(&view) {
        println!();
        println!("[{}]", names.join(","));
        for (name, value) in settings {
            println!("{name} {value}");
        }
    }
    Ok(())
}

/// Per-node settings, nodes with identical settings in one section.
fn node_sections(view: &ClusterView) -> Vec<(Vec<String>, BTreeMap<String, String>)> {
    let mut sections: Vec<(Vec<String>, BTreeMap<String, String>)> = Vec::new();
    for (number, settings) in &view.params.per_node {
        let name = node_name(view, *number);
        match sections.iter_mut().find(|(_, s)| s == settings) {
            Some((names, _)) => names.push(name),
            None => sections.push((vec![name], settings.clone())),
        }
    }
    sections
}

fn node_name(view: &ClusterView, number: u32) -> String {
    view.nodes
        .iter()
        .find(|n| n.number == number)
        .map_or_else(|| format!("node number {number}"), |n| n.name.clone())
}

fn print_y(view: &ClusterView) {
    let y = YRecord::new("config", "");
    println!("{}", y.header(&["configParameter", "nodeName", "value"]));
    let row = |name: &str, node: String, value: String| {
        println!("{}", y.data(&[name.to_string(), node, value]));
    };
    row("clusterName", String::new(), view.identity.name.clone());
    row("clusterId", String::new(), view.identity.id.clone());
    for spec in PARAMS {
        row(spec.name, String::new(), view.params.get(spec.name, None));
    }
    for (number, settings) in &view.params.per_node {
        for (name, value) in settings {
            row(name, node_name(view, *number), value.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_cluster::node::Designation;
    use tessera_cluster::params::Params;
    use tessera_cluster::state::{ClusterIdentity, NodeRecord};

    #[test]
    fn nodes_with_the_same_settings_share_a_section() {
        let node = |number: u32| NodeRecord {
            number,
            name: format!("n{number}"),
            address: format!("10.0.0.{number}:1191"),
            designation: Designation::CLIENT,
        };
        let mut params = Params::default();
        let fast: BTreeMap<String, String> = [("p".to_string(), "1".to_string())].into();
        let slow: BTreeMap<String, String> = [("p".to_string(), "9".to_string())].into();
        params.per_node.insert(1, fast.clone());
        params.per_node.insert(2, slow.clone());
        params.per_node.insert(3, fast.clone());
        params.per_node.insert(7, slow.clone());
        let view = ClusterView {
            identity: ClusterIdentity::default(),
            nodes: (1..=3).map(node).collect(),
            me: 1,
            manager: None,
            config_version: 1,
            params,
        };
        let sections = node_sections(&view);
        assert_eq!(
            sections,
            vec![
                (vec!["n1".to_string(), "n3".to_string()], fast),
                (vec!["n2".to_string(), "node number 7".to_string()], slow),
            ]
        );
    }
}
