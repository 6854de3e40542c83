//! `cluster create`, `cluster accept` and `cluster ls` [mmcrcluster, mmlscluster], and the
//! hand-over of accept packages that `node add` shares.
//!
//! A node becomes a member by accepting a package (`config::AcceptPackage`): the cluster
//! identity, its own node record, the node table and the cluster secret, plus the first
//! configuration entry on the quorum nodes of a new cluster. `cluster create` sets up this
//! node directly and hands every other node its package on the standard input of
//! `RSH NODE "tessera cluster accept"`. A node that cannot be reached gets its package as
//! `$TESSERA_HOME/cluster/accept-NODE.json` (mode 0600: it holds the secret) for the admin
//! to copy; accepting the same package twice is harmless.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use tessera_cluster::node::{check_node_name, Designation, NodeSpec};
use tessera_cluster::params::parse_changes;
use tessera_cluster::state::{ClusterIdentity, Command, ConfigState, NodeRecord, Response};
use tessera_nsd::{check_name, NAME_RULE};
use tessera_transport::{ClusterId, ClusterSecret};

use super::lifecycle::stamp;
use super::remote::{
    env_node, local_node_among, parse_node_entries, tessera_command_line, RemoteShell,
};
use crate::config::{host_name, now_unix, AcceptPackage, Home, NodesCache};
use crate::output::{local_time, PartlyDone, Table, YRecord};
use crate::rpc::{Client, ClusterView, Reply, Request};

/// How long one node may take to accept its package through the remote shell.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(60);

/// The most bytes of an accept package read from standard input. A package holds the
/// node table twice (records, and the first configuration entry on quorum nodes), about
/// 220 bytes per node: at `MAX_NODES_PER_REQUEST` nodes some 4 MiB, well below this.
const ACCEPT_PACKAGE_BYTES_MAX: u64 = 16 << 20;

/// The address of the node of a one-node cluster: loopback, any free port (the daemon
/// picks one; no other node needs to find it).
const SINGLE_NODE_ADDRESS: &str = "127.0.0.1:0";

/// What `cluster create` was given.
pub struct CreateArgs<'a> {
    pub name: &'a str,
    pub nodes: Option<&'a str>,
    pub remote_shell: &'a str,
    pub config: Option<&'a str>,
}

/// Creates the cluster; every check runs before anything is written.
pub fn create(home: &Home, args: &CreateArgs) -> Result<()> {
    let name = args.name;
    check_name(name).map_err(|p| anyhow!("--name {name}: {p}; {NAME_RULE}"))?;
    refuse_existing_cluster(home)?;
    let rsh = RemoteShell::parse(args.remote_shell).context("-r")?;
    let params = match args.config {
        Some(text) => parse_changes(text, false).map_err(|e| anyhow!("--config {text}: {e}"))?,
        None => Vec::new(),
    };
    let (specs, local) = match args.nodes {
        Some(text) => {
            let specs = parse_node_entries(text)?;
            let names: Vec<&str> = specs.iter().map(|n| n.name.as_str()).collect();
            let local = local_node_among(&names)?;
            (specs, local)
        }
        None => single_node()?,
    };
    let identity = ClusterIdentity {
        name: name.to_string(),
        id: ClusterId::generate().to_string(),
        created_unix: now_unix(),
        remote_shell: args
            .remote_shell
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
    };
    let create = Command::Create {
        identity: identity.clone(),
        nodes: specs,
        params,
    };
    let records = number_nodes(&create)?;
    if records.len() > 1 {
        rsh.check_runnable()?;
    }
    let secret = ClusterSecret::generate().to_file_text();
    let package = |node: &NodeRecord| AcceptPackage {
        identity: identity.clone(),
        secret: secret.clone(),
        node: node.clone(),
        nodes: records.clone(),
        bootstrap: node.designation.quorum.then(|| create.clone()),
    };
    let me = records
        .iter()
        .find(|r| r.name == local)
        .expect("the local node is one of the records");
    stamp("cluster create", &format!("Processing node {}", me.name));
    home.accept(&package(me))?;
    let others: Vec<AcceptPackage> = records
        .iter()
        .filter(|r| r.name != local)
        .map(package)
        .collect();
    let failed = hand_over(home, "cluster create", &rsh, &others)?;
    if !failed.is_empty() {
        return Err(not_all_reached(
            "the cluster is created",
            &failed,
            records.len(),
        ));
    }
    println!("tessera cluster create: Command successfully completed");
    if records.len() == 1 {
        println!(
            "Cluster {name} (id {}) has one node; start it with `tessera startup`",
            identity.id
        );
    } else {
        println!(
            "Cluster {name} (id {}) has {} nodes; start them with `tessera startup -a`",
            identity.id,
            records.len()
        );
    }
    Ok(())
}

fn refuse_existing_cluster(home: &Home) -> Result<()> {
    if !home.cluster_exists() {
        return Ok(());
    }
    let existing = home
        .cluster()
        .map(|c| c.name)
        .unwrap_or_else(|_| "?".into());
    bail!(
        "cluster {existing} is already defined in {}; to start over, stop the daemon with \
         `tessera shutdown` and remove {} (this forgets every NSD and file system), or set \
         TESSERA_HOME to another directory",
        home.cluster_path().display(),
        home.root().display()
    )
}

/// The one node of a cluster created without -N: this host, quorum-manager, on loopback.
fn single_node() -> Result<(Vec<NodeSpec>, String)> {
    let name = env_node().unwrap_or_else(host_name);
    check_node_name(&name).map_err(|e| {
        anyhow!("this node's name: {e}; set TESSERA_NODE to the name the node should have")
    })?;
    let spec = NodeSpec {
        name: name.clone(),
        designation: Designation::QUORUM_MANAGER,
        address: SINGLE_NODE_ADDRESS.to_string(),
    };
    Ok((vec![spec], name))
}

/// Numbers the nodes of `create` by applying it to an empty configuration, exactly as the
/// cluster will when the entry commits; a node table the cluster would refuse (no quorum
/// node, a name or address twice) is refused here, before anything is written.
fn number_nodes(create: &Command) -> Result<Vec<NodeRecord>> {
    match ConfigState::default().apply(create) {
        Response::Added { nodes } => Ok(nodes),
        Response::Refused { reason } => bail!("{reason}; nothing was created"),
        other => bail!("internal error: creating the cluster answered {other:?}"),
    }
}

/// Hands every package to its node through the remote shell, in parallel; a node that
/// cannot be reached gets its package written under the home for the admin to copy.
/// Returns the names of those nodes.
pub fn hand_over(
    home: &Home,
    command: &str,
    rsh: &RemoteShell,
    packages: &[AcceptPackage],
) -> Result<Vec<String>> {
    let command_line = tessera_command_line(&["cluster", "accept"])?;
    let outcomes = super::remote::for_each_parallel(packages, |package| {
        let node = &package.node.name;
        stamp(command, &format!("Processing node {node}"));
        let json = serde_json::to_vec(package).expect("packages serialize");
        rsh.run(node, &command_line, Some(json), ACCEPT_TIMEOUT)
            .map(|_| ())
    });
    let mut failed = Vec::new();
    for (package, outcome) in packages.iter().zip(outcomes) {
        let Err(why) = outcome else { continue };
        let node = &package.node.name;
        let path = save_package(home, package)?;
        println!(
            "tessera {command}: node {node} was not reached: {why}\n  its accept package is \
             {}: copy it to {node} and run `tessera cluster accept < {}` there",
            path.display(),
            path.file_name()
                .expect("the package has a file name")
                .to_string_lossy()
        );
        failed.push(node.clone());
    }
    Ok(failed)
}

/// The error of a command that did its work but left nodes without their package.
pub fn not_all_reached(done: &str, failed: &[String], total: usize) -> anyhow::Error {
    anyhow::Error::new(PartlyDone {
        code: 2,
        message: format!(
            "{done}, but {} of {total} nodes did not get their accept package ({}); run \
             `tessera cluster accept` on each of them with the package named above",
            failed.len(),
            failed.join(", ")
        ),
    })
}

/// Writes `accept-NODE.json` (mode 0600 from its creation on: it holds the secret).
fn save_package(home: &Home, package: &AcceptPackage) -> Result<PathBuf> {
    let dir = home.cluster_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join(format!("accept-{}.json", package.node.name));
    let temp = dir.join(format!(".accept-{}.json.tmp", package.node.name));
    let _ = std::fs::remove_file(&temp);
    let mut text = serde_json::to_vec_pretty(package).expect("packages serialize");
    text.push(b'\n');
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)?;
        file.write_all(&text)?;
        file.sync_all()?;
        std::fs::rename(&temp, &path)
    };
    write().with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// `cluster accept`: sets up this home from the package on standard input.
pub fn accept(home: &Home) -> Result<()> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .take(ACCEPT_PACKAGE_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .context("cannot read the accept package from standard input")?;
    if bytes.len() as u64 > ACCEPT_PACKAGE_BYTES_MAX {
        bail!(
            "the standard input is larger than {ACCEPT_PACKAGE_BYTES_MAX} bytes, which no \
             accept package is; give the accept-NODE.json file that `tessera cluster create` \
             or `tessera node add` wrote"
        );
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        bail!(
            "no accept package on standard input; run `tessera cluster accept < \
             accept-NODE.json` with the file that `tessera cluster create` or `tessera node \
             add` wrote"
        );
    }
    let package: AcceptPackage = serde_json::from_slice(&bytes).map_err(|e| {
        anyhow!(
            "the standard input is not an accept package ({e}); give the accept-NODE.json \
             file that `tessera cluster create` or `tessera node add` wrote, unchanged"
        )
    })?;
    let node = &package.node;
    if let Some(me) = env_node().filter(|me| *me != node.name) {
        bail!(
            "this accept package is for node {}, but TESSERA_NODE says this is node {me}; \
             give this node its own package (accept-{me}.json)",
            node.name
        );
    }
    home.accept(&package)?;
    println!(
        "tessera cluster accept: node {} (number {}) of cluster {} is set up in {}; start it \
         with `tessera startup`",
        node.name,
        node.number,
        package.identity.name,
        home.root().display()
    );
    Ok(())
}

/// The configuration as the local daemon has applied it; `None` when no daemon answers
/// (an error when the caller may not use its socket, or when the daemon refuses).
pub fn cluster_view(home: &Home) -> Result<Option<ClusterView>> {
    match Client::connect(home) {
        Err(e) if Client::denied(&e) => Err(e),
        Err(_) => Ok(None),
        Ok(_) => match super::call(home, &Request::ClusterShow)? {
            Reply::Cluster(view) => Ok(Some(*view)),
            other => Err(super::unexpected(other)),
        },
    }
}

/// The node table from the local daemon, else [`cached_nodes`].
pub fn known_nodes(home: &Home) -> Result<NodesCache> {
    match cluster_view(home) {
        Ok(Some(view)) => {
            return Ok(NodesCache {
                identity: view.identity,
                nodes: view.nodes,
            })
        }
        Err(e) if Client::denied(&e) => return Err(e),
        // A daemon that cannot say (down, or refusing) leaves the copy this node keeps.
        _ => {}
    }
    cached_nodes(home)
}

/// The node table as this node last knew it (`nodes.json`), or in a one-node home from
/// before the cluster layer, the node itself.
pub fn cached_nodes(home: &Home) -> Result<NodesCache> {
    if let Some(cache) = home.nodes_cache()? {
        return Ok(cache);
    }
    let cluster = home.cluster()?;
    Ok(NodesCache {
        identity: ClusterIdentity {
            name: cluster.name,
            id: cluster.cluster_id,
            created_unix: cluster.created_unix,
            remote_shell: "ssh".into(),
        },
        nodes: vec![NodeRecord {
            number: cluster.node_number,
            name: cluster.node_name,
            address: cluster.address,
            designation: Designation::QUORUM_MANAGER,
        }],
    })
}

/// `cluster ls` [mmlscluster].
pub fn ls(home: &Home, machine: bool) -> Result<()> {
    home.cluster()?;
    let why_not_live = match cluster_view(home) {
        Ok(Some(view)) => {
            let view = ListedCluster::from_view(view);
            if machine {
                print_cluster_y(&view);
            } else {
                print_cluster(&view);
            }
            return Ok(());
        }
        Err(e) if Client::denied(&e) => return Err(e),
        Ok(None) => "the local daemon is down".to_string(),
        // A daemon still waiting for its quorum has no configuration to show yet.
        Err(e) => format!("the local daemon cannot show the configuration ({e:#})"),
    };
    let cache = home.nodes_cache()?.ok_or_else(|| {
        anyhow!(
            "{why_not_live}, and this node has no copy of the node table ({}); start the \
             daemon with `tessera startup`",
            home.nodes_cache_path().display()
        )
    })?;
    let note = format!(
        "{why_not_live}: this is the last known node table of this node ({})",
        home.nodes_cache_path().display()
    );
    let view = ListedCluster::from_cache(cache);
    if machine {
        // On stderr, so that a script reading the records is not disturbed.
        eprintln!("tessera cluster ls: {note}");
        print_cluster_y(&view);
    } else {
        println!("{}{}.\n", note[..1].to_uppercase(), &note[1..]);
        print_cluster(&view);
    }
    Ok(())
}

/// What `cluster ls` shows; the version and manager only a running daemon knows.
struct ListedCluster {
    identity: ClusterIdentity,
    nodes: Vec<NodeRecord>,
    config_version: Option<u64>,
    manager: Option<u32>,
}

impl ListedCluster {
    fn from_view(view: ClusterView) -> ListedCluster {
        ListedCluster {
            identity: view.identity,
            nodes: view.nodes,
            config_version: Some(view.config_version),
            manager: view.manager,
        }
    }

    fn from_cache(cache: NodesCache) -> ListedCluster {
        ListedCluster {
            identity: cache.identity,
            nodes: cache.nodes,
            config_version: None,
            manager: None,
        }
    }

    fn manager_text(&self) -> String {
        let Some(number) = self.manager else {
            return if self.config_version.is_some() {
                "none".into()
            } else {
                "unknown".into()
            };
        };
        match self.nodes.iter().find(|n| n.number == number) {
            Some(node) => format!("{} (number {number})", node.name),
            None => format!("number {number}"),
        }
    }
}

fn print_cluster(c: &ListedCluster) {
    let version = c
        .config_version
        .map_or_else(|| "unknown".to_string(), |v| v.to_string());
    println!("Tessera cluster information");
    println!("===========================");
    println!("  Cluster name:              {}", c.identity.name);
    println!("  Cluster id:                {}", c.identity.id);
    println!(
        "  Created:                   {}",
        local_time(c.identity.created_unix, false)
    );
    println!("  Remote shell command:      {}", c.identity.remote_shell);
    println!("  Repository type:           Raft");
    println!("  Configuration version:     {version}");
    println!("  Cluster manager:           {}", c.manager_text());
    println!();
    let mut t =
        Table::new(&["Node number", "Daemon node name", "Address", "Designation"]).right(&[0]);
    for node in &c.nodes {
        t.row(vec![
            node.number.to_string(),
            node.name.clone(),
            node.address.clone(),
            node.designation.to_string(),
        ]);
    }
    print!("{}", t.render());
}

fn print_cluster_y(c: &ListedCluster) {
    let summary = YRecord::new("cluster", "clusterSummary");
    println!(
        "{}",
        summary.header(&[
            "clusterName",
            "clusterId",
            "createdUnix",
            "rshPath",
            "repositoryType",
            "configVersion",
            "clusterManager",
        ])
    );
    let manager = c
        .manager
        .and_then(|m| c.nodes.iter().find(|n| n.number == m))
        .map_or_else(String::new, |n| n.name.clone());
    println!(
        "{}",
        summary.data(&[
            c.identity.name.clone(),
            c.identity.id.clone(),
            c.identity.created_unix.to_string(),
            c.identity.remote_shell.clone(),
            "Raft".into(),
            c.config_version.map_or_else(String::new, |v| v.to_string()),
            manager,
        ])
    );
    let nodes = YRecord::new("cluster", "clusterNode");
    println!(
        "{}",
        nodes.header(&["nodeNumber", "daemonNodeName", "address", "designation"])
    );
    for node in &c.nodes {
        println!(
            "{}",
            nodes.data(&[
                node.number.to_string(),
                node.name.clone(),
                node.address.clone(),
                node.designation.to_string(),
            ])
        );
    }
}
