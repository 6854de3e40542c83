//! `node add`, `node delete` and `node change` [mmaddnode, mmdelnode, mmchnode]: checked
//! here, decided by the cluster (the local daemon proposes the change; it is made when a
//! majority of the quorum nodes committed it).

use anyhow::{anyhow, bail, Result};
use tessera_cluster::node::parse_address;
use tessera_transport::ClusterSecret;

use super::cluster::{cluster_view, hand_over, not_all_reached};
use super::remote::{parse_node_entries, parse_node_names, RemoteShell};
use crate::config::{AcceptPackage, Home};
use crate::rpc::{ClusterView, Reply, Request};

/// The running cluster as the local daemon knows it, or why it cannot be asked.
fn require_view(home: &Home) -> Result<ClusterView> {
    cluster_view(home)?.ok_or_else(|| {
        anyhow!(
            "the local daemon is not running; changes to the cluster go through it: start \
             it with `tessera startup`"
        )
    })
}

/// `node add -N ...`: the cluster numbers the new nodes; each then gets its accept package
/// through the remote shell (or as a file, when it cannot be reached).
pub fn add(home: &Home, nodes_text: &str) -> Result<()> {
    let specs = parse_node_entries(nodes_text)?;
    // Everything a hand-over needs is checked before the cluster changes.
    let secret_path = home.secret_path();
    let secret = ClusterSecret::load(&secret_path)
        .map_err(|e| anyhow!("{e}; node add hands this secret to the new nodes"))?
        .to_file_text();
    let before = require_view(home)?;
    let rsh = RemoteShell::parse(&before.identity.remote_shell)?;
    rsh.check_runnable()?;
    let added = match super::call(home, &Request::NodeAdd { nodes: specs })? {
        Reply::NodesAdded(records) => records,
        other => return Err(super::unexpected(other)),
    };
    let mut nodes = match require_view(home) {
        Ok(after) => after.nodes,
        Err(_) => before.nodes.clone(),
    };
    for record in &added {
        if !nodes.iter().any(|n| n.number == record.number) {
            nodes.push(record.clone());
        }
    }
    let packages: Vec<AcceptPackage> = added
        .iter()
        .map(|record| AcceptPackage {
            identity: before.identity.clone(),
            secret: secret.clone(),
            node: record.clone(),
            nodes: nodes.clone(),
            bootstrap: None,
        })
        .collect();
    let failed = hand_over(home, "node add", &rsh, &packages)?;
    let names: Vec<&str> = added.iter().map(|n| n.name.as_str()).collect();
    if !failed.is_empty() {
        return Err(not_all_reached(
            &if names.len() == 1 {
                format!("node {} is added", names[0])
            } else {
                format!("nodes {} are added", names.join(", "))
            },
            &failed,
            added.len(),
        ));
    }
    println!("tessera node add: Command successfully completed");
    println!(
        "Start the new nodes with `tessera startup -N {}`",
        names.join(",")
    );
    Ok(())
}

/// `node delete -N names`.
pub fn delete(home: &Home, nodes_text: &str) -> Result<()> {
    let names = parse_node_names(nodes_text)?;
    require_view(home)?;
    println!("tessera node delete: Verifying the daemon is stopped on all affected nodes ...");
    match super::call(home, &Request::NodeDelete { names })? {
        Reply::Done => {}
        other => return Err(super::unexpected(other)),
    }
    println!("tessera node delete: Command successfully completed");
    Ok(())
}

/// What `node change` was given; clap refuses contradicting flags and no change at all.
pub struct ChangeArgs<'a> {
    pub nodes: &'a str,
    pub quorum: bool,
    pub nonquorum: bool,
    pub manager: bool,
    pub client: bool,
    pub address: Option<&'a str>,
}

/// `node change -N names ...`.
pub fn change(home: &Home, args: &ChangeArgs) -> Result<()> {
    let names = parse_node_names(args.nodes)?;
    let address = match args.address {
        None => None,
        Some(_) if names.len() != 1 => bail!(
            "--address names the address of one node, and -N names {}; change one node at a \
             time",
            names.len()
        ),
        Some(text) => Some(parse_address(text).map_err(|e| anyhow!("--address: {e}"))?),
    };
    if (args.quorum && args.nonquorum) || (args.manager && args.client) {
        bail!("--quorum and --nonquorum (or --manager and --client) contradict each other");
    }
    let either = |yes: bool, no: bool| (yes || no).then_some(yes);
    let request = Request::NodeChange {
        names,
        quorum: either(args.quorum, args.nonquorum),
        manager: either(args.manager, args.client),
        address,
    };
    if let Request::NodeChange {
        quorum: None,
        manager: None,
        address: None,
        ..
    } = &request
    {
        bail!("nothing to change: give --quorum, --nonquorum, --manager, --client or --address");
    }
    require_view(home)?;
    match super::call(home, &request)? {
        Reply::Done => {}
        other => return Err(super::unexpected(other)),
    }
    println!("tessera node change: Command successfully completed");
    if args.address.is_some() {
        println!("The new address takes effect at the node's next `tessera startup`");
    }
    Ok(())
}
