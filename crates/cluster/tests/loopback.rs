//! The cluster service over the real node transport: three quorum nodes and a client on
//! loopback TCP, each with its own redb store, on a multi-threaded runtime with the real
//! clock. They elect a manager, every node joins and holds a lease, the manager is killed
//! and a new one takes over, and a node without the cluster's secret gets nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_cluster::lease::NodeState;
use tessera_cluster::net::{serve, TransportNet};
use tessera_cluster::node::{parse_node_list, NodeNumber};
use tessera_cluster::params::{parse_changes, LeaseTimings};
use tessera_cluster::raft::TypeConfig;
use tessera_cluster::rpc::{FileSystemService, NodeNet, PeerReply, PeerRequest};
use tessera_cluster::service::{raft_config, Clock, ClusterNode, StateReader};
use tessera_cluster::state::{ClusterIdentity, Command, ConfigState};
use tessera_transport::{ClusterId, ClusterSecret, Identity};
use tokio::net::TcpListener;

/// Answers a file-system request with its bytes reversed, naming the file system.
struct Echo;

impl FileSystemService for Echo {
    fn call(
        &self,
        _from: (u32, u64),
        (fs, slot): (&str, u32),
        mut request: Vec<u8>,
    ) -> Result<Vec<u8>, String> {
        request.reverse();
        request.extend_from_slice(fs.as_bytes());
        request.extend_from_slice(format!("/{slot}").as_bytes());
        Ok(request)
    }
}

struct Running {
    node: Arc<ClusterNode<TransportNet>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    async fn kill(self) {
        for task in &self.tasks {
            task.abort();
        }
        self.node.shutdown().await;
    }
}

async fn start(
    number: NodeNumber,
    listener: TcpListener,
    identity: Arc<Identity>,
    store: &std::path::Path,
) -> Running {
    let timings = LeaseTimings::new(Duration::from_secs(2), Duration::from_millis(500));
    let (log, machine) =
        tessera_cluster::store::open::<TypeConfig, ConfigState>(store).expect("store opens");
    let reader = machine.clone();
    let read_state: StateReader = Arc::new(move || reader.state());
    let net = Arc::new(TransportNet::new(Arc::clone(&identity)));
    let node = ClusterNode::start(
        number,
        rand::random(),
        raft_config(&timings, "loopback"),
        net,
        log,
        machine,
        read_state,
        Clock::new(),
    )
    .await
    .expect("service starts");
    let server = tokio::spawn(serve(listener, identity, Arc::clone(&node)));
    let run = tokio::spawn(Arc::clone(&node).run());
    Running {
        node,
        tasks: vec![server, run],
    }
}

async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_quorum_nodes_elect_grant_and_fail_over_over_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let cluster_id = ClusterId::generate();
    let secret = ClusterSecret::generate();
    let mut listeners = Vec::new();
    let mut entries = Vec::new();
    for n in 1..=4u32 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let designation = if n <= 3 { "quorum-manager" } else { "client" };
        entries.push(format!("node{n}:{designation}:127.0.0.1:{port}"));
        listeners.push(listener);
    }
    let specs = parse_node_list(&entries.join(",")).unwrap();
    let mut nodes = Vec::new();
    for (n, listener) in (1..=4u32).zip(listeners) {
        let identity = Arc::new(Identity {
            cluster_id,
            node_name: format!("node{n}"),
            secret: secret.clone(),
        });
        let store = dir.path().join(format!("node{n}.redb"));
        nodes.push(Some(start(n, listener, identity, &store).await));
    }
    let create = Command::Create {
        identity: ClusterIdentity {
            name: "loopback".into(),
            id: cluster_id.to_string(),
            created_unix: 0,
            remote_shell: "ssh".into(),
        },
        nodes: specs.clone(),
        params: parse_changes("failureDetectionTime=2,leaseRecoveryWait=0.5", false).unwrap(),
    };
    let first = Arc::clone(&nodes[0].as_ref().unwrap().node);
    first.bootstrap(&create).await.expect("cluster created");
    let up = |nodes: &Vec<Option<Running>>| {
        nodes
            .iter()
            .flatten()
            .all(|r| r.node.status().state == NodeState::Active)
    };
    wait_until("every node active", Duration::from_secs(30), || up(&nodes)).await;
    let manager = first.status().manager.expect("a manager") as usize;
    assert!((1..=3).contains(&manager), "the client never manages");

    // Kill -9 of the manager: a new one is active soon, and the dead one is expelled.
    let killed = nodes[manager - 1].take().unwrap();
    let dead_epoch = killed.node.status().epoch.unwrap();
    killed.kill().await;
    let survivor = Arc::clone(&nodes.iter().flatten().next().unwrap().node);
    let took = wait_until("a new manager", Duration::from_secs(10), || {
        let m = survivor.status().manager;
        m.is_some() && m != Some(manager as u32)
    })
    .await;
    println!("new manager {took:?} after the kill (failureDetectionTime 2 s)");
    wait_until("the dead manager expelled", Duration::from_secs(10), || {
        !survivor.state().epoch_is_live(manager as u32, dead_epoch)
    })
    .await;
    wait_until("survivors active", Duration::from_secs(10), || up(&nodes)).await;

    // File-system requests: carried to the service for a live incarnation, refused for the
    // expelled one (fencing at the metanode).
    let target = nodes.iter().flatten().next().unwrap();
    target.node.serve_file_systems(Arc::new(Echo));
    let address = &specs[target.node.me() as usize - 1].address;
    let sender = nodes.iter().flatten().nth(1).unwrap();
    let net = TransportNet::new(Arc::new(Identity {
        cluster_id,
        node_name: format!("node{}", sender.node.me()),
        secret: secret.clone(),
    }));
    let ask = |from: NodeNumber, epoch: u64| {
        net.call(
            target.node.me(),
            address,
            PeerRequest::FileSystem {
                from,
                epoch,
                fs: "fs1".into(),
                slot: 2,
                request: vec![1, 2, 3],
            },
            Duration::from_secs(5),
        )
    };
    let live = ask(sender.node.me(), sender.node.status().epoch.unwrap()).await;
    match live {
        Ok(PeerReply::FileSystem(Ok(bytes))) => assert_eq!(bytes, b"\x03\x02\x01fs1/2"),
        other => panic!("a live node's request: {other:?}"),
    }
    match ask(manager as u32, dead_epoch).await {
        Ok(PeerReply::FileSystem(Err(why))) => assert!(why.contains("not a live member"), "{why}"),
        other => panic!("the expelled node's request: {other:?}"),
    }

    // A node that does not hold the secret reaches nobody.
    let impostor = TransportNet::new(Arc::new(Identity {
        cluster_id,
        node_name: "impostor".into(),
        secret: ClusterSecret::generate(),
    }));
    let target = specs
        .iter()
        .find(|s| s.name != format!("node{manager}"))
        .unwrap();
    let refused = impostor
        .call(
            1,
            &target.address,
            PeerRequest::Status,
            Duration::from_secs(5),
        )
        .await;
    let error = refused.expect_err("an impostor is refused").to_string();
    assert!(error.contains("secret"), "{error}");

    for running in nodes.into_iter().flatten() {
        running.kill().await;
    }
}
