//! Nodes, their designations, and the node file that names them.
//!
//! A node file is what `tessera cluster create -N` and `tessera node add -N` read, one node
//! per line, in GPFS's `NodeName:NodeDesignations:AdminNodeName` shape with the third field
//! used for the daemon address:
//!
//! ```text
//! # comment to the end of the line
//! x36i04:quorum-manager
//! x36i05:quorum-manager:10.10.0.5
//! x36i06:client:10.10.0.6:1191
//! node4::[fd00::4]:11904
//! ```
//!
//! - `NodeName`: the node's name in the cluster (a host name: letters, digits, `-` and `.`).
//! - `NodeDesignations`: `quorum` or `nonquorum` and `manager` or `client`, joined by `-` in
//!   either order (`quorum-manager`, `manager-quorum`, `client-nonquorum`); empty or missing
//!   means `client-nonquorum`, as in GPFS.
//! - Daemon address: `host`, `host:port`, `ipv4:port` or `[ipv6]:port`. Without it the node
//!   name is the host; without a port the daemon port is [`DEFAULT_DAEMON_PORT`]. Several
//!   nodes on one machine differ by address (network namespaces) or by port.
//!
//! On the command line, `-N node1,node2:quorum,...` gives the same entries separated by
//! commas; a `-N` value naming an existing file is read as a node file.

use std::fmt;

use serde::{Deserialize, Serialize};

/// GPFS's daemon port (`tscTcpPort`), so firewalls already opened for it work.
pub const DEFAULT_DAEMON_PORT: u16 = 1191;

/// The longest node name: a DNS name.
pub const NODE_NAME_MAX: usize = 253;

/// The most nodes one node file or `-N` list may name, so that a runaway file is refused
/// before anything is sent to the quorum. GPFS clusters reach a few thousand nodes.
pub const MAX_NODES_PER_REQUEST: usize = 16_384;

/// A node's number in the cluster: assigned at `cluster create`/`node add`, never reused.
pub type NodeNumber = u32;

/// What a node does in the cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Designation {
    /// A quorum node holds a copy of the Raft log and votes: quorum is a majority of them.
    pub quorum: bool,
    /// A manager node may become cluster manager (if also quorum) or file-system manager.
    pub manager: bool,
}

impl Designation {
    pub const CLIENT: Designation = Designation {
        quorum: false,
        manager: false,
    };
    pub const QUORUM_MANAGER: Designation = Designation {
        quorum: true,
        manager: true,
    };

    /// Parses `quorum-manager`, `manager`, `nonquorum`, `client-quorum`, ...; empty is a
    /// client.
    pub fn parse(text: &str) -> Result<Designation, String> {
        let mut quorum: Option<bool> = None;
        let mut manager: Option<bool> = None;
        if text.is_empty() {
            return Ok(Designation::CLIENT);
        }
        for word in text.split('-') {
            let (slot, value, opposite) = match word.to_ascii_lowercase().as_str() {
                "quorum" => (&mut quorum, true, "nonquorum"),
                "nonquorum" => (&mut quorum, false, "quorum"),
                "manager" => (&mut manager, true, "client"),
                "client" => (&mut manager, false, "manager"),
                _ => {
                    return Err(format!(
                        "unknown designation `{word}` in `{text}`; use quorum or nonquorum \
                         and manager or client, joined by `-` (e.g. quorum-manager)"
                    ))
                }
            };
            match *slot {
                Some(previous) if previous != value => {
                    return Err(format!(
                        "designation `{text}` says both {word} and {opposite}; choose one"
                    ))
                }
                _ => *slot = Some(value),
            }
        }
        Ok(Designation {
            quorum: quorum.unwrap_or(false),
            manager: manager.unwrap_or(false),
        })
    }
}

impl fmt::Display for Designation {
    /// GPFS's `mmlscluster` column: `quorum-manager`, `quorum`, `manager` or empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match (self.quorum, self.manager) {
            (true, true) => "quorum-manager",
            (true, false) => "quorum",
            (false, true) => "manager",
            (false, false) => "",
        };
        f.write_str(text)
    }
}

/// One node as an admin names it, before it has a number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSpec {
    pub name: String,
    pub designation: Designation,
    /// `host:port` (IPv6 hosts in brackets) where the node's daemon listens.
    pub address: String,
}

/// Checks a node name; on failure says what is wrong.
pub fn check_node_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty node name".into());
    }
    if name.len() > NODE_NAME_MAX {
        return Err(format!("node name longer than {NODE_NAME_MAX} bytes"));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
    if !name.chars().all(allowed) {
        return Err(format!(
            "node name `{name}` may contain only letters, digits, `-` and `.` (a host name)"
        ));
    }
    if name.starts_with(['-', '.']) || name.ends_with(['-', '.']) {
        return Err(format!(
            "node name `{name}` must start and end with a letter or digit"
        ));
    }
    Ok(())
}

/// Parses a daemon address (`host`, `host:port`, `[v6]:port`, `v4:port`) and returns it
/// normalized to `host:port`.
pub fn parse_address(text: &str) -> Result<String, String> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let Some((host, after)) = rest.split_once(']') else {
            return Err(format!(
                "address `{text}`: missing `]` after an IPv6 address"
            ));
        };
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("address `{text}`: `{host}` is not an IPv6 address"));
        }
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("address `{text}`: expected `:port` after `]`"))?,
            ),
        };
        (format!("[{host}]"), port)
    } else {
        match text.split_once(':') {
            Some((_, p)) if p.contains(':') => {
                return Err(format!(
                    "address `{text}`: write IPv6 addresses in brackets, e.g. [fd00::1]:1191"
                ))
            }
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (text.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err(format!("address `{text}`: empty host"));
    }
    if !host.starts_with('[') && host.parse::<std::net::Ipv4Addr>().is_err() {
        check_node_name(&host).map_err(|e| format!("address `{text}`: {e}"))?;
    }
    let port = match port {
        None => DEFAULT_DAEMON_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => {
                return Err(format!(
                    "address `{text}`: port `{p}` is not a number from 1 to 65535"
                ))
            }
            Ok(port) => port,
        },
    };
    Ok(format!("{host}:{port}"))
}

/// Parses one node entry, `name[:designation[:address]]`.
pub fn parse_node_entry(entry: &str) -> Result<NodeSpec, String> {
    let mut fields = entry.splitn(3, ':');
    let name = fields.next().unwrap_or_default().trim();
    check_node_name(name)?;
    let designation = Designation::parse(fields.next().unwrap_or_default().trim())?;
    let address = match fields.next().map(str::trim) {
        None | Some("") => parse_address(name)?,
        Some(address) => parse_address(address)?,
    };
    Ok(NodeSpec {
        name: name.to_string(),
        designation,
        address,
    })
}

/// Parses a node file. Every error names the line. Names and addresses must be unique.
pub fn parse_node_file(text: &str) -> Result<Vec<NodeSpec>, String> {
    let mut nodes = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let node = parse_node_entry(line).map_err(|e| format!("line {}: {e}", number + 1))?;
        nodes.push(node);
        if nodes.len() > MAX_NODES_PER_REQUEST {
            return Err(format!(
                "line {}: more than {MAX_NODES_PER_REQUEST} nodes in one file",
                number + 1
            ));
        }
    }
    if nodes.is_empty() {
        return Err("the node file names no node".into());
    }
    check_unique(&nodes)?;
    Ok(nodes)
}

/// Parses a `-N` list: comma-separated node entries.
pub fn parse_node_list(text: &str) -> Result<Vec<NodeSpec>, String> {
    let nodes = text
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(parse_node_entry)
        .collect::<Result<Vec<_>, _>>()?;
    if nodes.is_empty() {
        return Err("-N names no node".into());
    }
    if nodes.len() > MAX_NODES_PER_REQUEST {
        return Err(format!("-N names more than {MAX_NODES_PER_REQUEST} nodes"));
    }
    check_unique(&nodes)?;
    Ok(nodes)
}

/// Refuses a list that names a node or an address twice: two entries for one node would
/// give it two numbers, two nodes on one address would answer for each other.
pub fn check_unique(nodes: &[NodeSpec]) -> Result<(), String> {
    let mut names = std::collections::BTreeSet::new();
    let mut addresses = std::collections::BTreeMap::new();
    for node in nodes {
        if !names.insert(node.name.as_str()) {
            return Err(format!("node {} is named twice", node.name));
        }
        if let Some(other) = addresses.insert(node.address.as_str(), node.name.as_str()) {
            return Err(format!(
                "nodes {other} and {} both have the daemon address {}; give each node its \
                 own address or port (name:designation:host:port)",
                node.name, node.address
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn designations_parse_in_either_order() {
        assert_eq!(
            Designation::parse("quorum-manager").unwrap(),
            Designation::QUORUM_MANAGER
        );
        assert_eq!(
            Designation::parse("manager-quorum").unwrap(),
            Designation::QUORUM_MANAGER
        );
        assert_eq!(Designation::parse("").unwrap(), Designation::CLIENT);
        assert_eq!(
            Designation::parse("client-nonquorum").unwrap(),
            Designation::CLIENT
        );
        let q = Designation::parse("quorum").unwrap();
        assert!(q.quorum && !q.manager);
        assert_eq!(q.to_string(), "quorum");
        let e = Designation::parse("quorum-nonquorum").unwrap_err();
        assert!(e.contains("both"), "{e}");
        let e = Designation::parse("quorom").unwrap_err();
        assert!(e.contains("unknown designation `quorom`"), "{e}");
    }

    #[test]
    fn addresses_default_the_port_and_keep_ipv6_in_brackets() {
        assert_eq!(parse_address("node1").unwrap(), "node1:1191");
        assert_eq!(parse_address("10.0.0.1:2000").unwrap(), "10.0.0.1:2000");
        assert_eq!(parse_address("[fd00::1]:7").unwrap(), "[fd00::1]:7");
        assert_eq!(parse_address("[fd00::1]").unwrap(), "[fd00::1]:1191");
        assert!(parse_address("fd00::1").unwrap_err().contains("brackets"));
        assert!(parse_address("node1:0").unwrap_err().contains("port"));
        assert!(parse_address("node1:99999").unwrap_err().contains("port"));
        assert!(parse_address("[zz]:1").unwrap_err().contains("IPv6"));
        assert!(parse_address("bad_host:1").is_err());
    }

    #[test]
    fn node_file_with_comments_designations_and_addresses() {
        let text = "# site nodes\n\
                    x36i04:quorum-manager\n\
                    x36i05:quorum-manager:10.10.0.5 # rack 2\n\
                    \n\
                    x36i06:client:10.10.0.6:1300\n\
                    node4::[fd00::4]:11904\n";
        let nodes = parse_node_file(text).unwrap();
        assert_eq!(nodes.len(), 4);
        assert_eq!(nodes[0].address, "x36i04:1191");
        assert_eq!(nodes[1].address, "10.10.0.5:1191");
        assert_eq!(nodes[2].address, "10.10.0.6:1300");
        assert_eq!(nodes[2].designation, Designation::CLIENT);
        assert_eq!(nodes[3].address, "[fd00::4]:11904");
    }

    #[test]
    fn node_file_errors_name_the_line() {
        let e = parse_node_file("a:quorum\nb:quorom\n").unwrap_err();
        assert!(e.starts_with("line 2:"), "{e}");
        let e = parse_node_file("a:quorum\na:client:10.0.0.2\n").unwrap_err();
        assert!(e.contains("node a is named twice"), "{e}");
        let e = parse_node_file("a::10.0.0.1\nb::10.0.0.1\n").unwrap_err();
        assert!(
            e.contains("both have the daemon address 10.0.0.1:1191"),
            "{e}"
        );
        assert!(parse_node_file("# nothing\n")
            .unwrap_err()
            .contains("no node"));
        assert!(parse_node_file("-bad\n").unwrap_err().contains("line 1"));
    }

    #[test]
    fn node_list_is_comma_separated() {
        let nodes = parse_node_list("n1:quorum-manager:127.0.0.1:2001,n2::127.0.0.1:2002").unwrap();
        assert_eq!(nodes[1].name, "n2");
        assert_eq!(nodes[1].address, "127.0.0.1:2002");
        assert!(parse_node_list(" , ").is_err());
    }

    proptest::proptest! {
        #[test]
        fn node_file_parser_never_panics(text in ".{0,400}") {
            let _ = parse_node_file(&text);
            let _ = parse_node_list(&text);
        }
    }
}
