//! `tessera daemon`: the node daemon. It owns the mounted file systems and answers the admin
//! CLI on `$TESSERA_HOME/daemon.sock`, one thread per connection. Configuration changes are
//! serialized by one admin lock; mounted file systems live in their own map so that `pmon`
//! and `state` answer while a long format runs.

mod api;
mod cluster_admin;
mod da_admin;
mod diag;
mod fs_admin;
mod health;
mod history;
mod http;
mod lease_gate;
pub mod member;
mod memory;
mod metanode_service;
mod metrics;
mod mounts;
mod nsd_admin;
mod nsd_server;
mod nvme_admin;
mod pdisk_fence;
mod policy_admin;
mod registry;
mod slots;

use std::collections::BTreeMap;
use std::io::BufReader;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use parking_lot::Mutex;
use tessera_fs::FileSystem;
use tessera_fuse::FuseMount;

use crate::config::{ClusterConfig, Home};
use crate::rpc::{read_frame, write_frame, Frame, Reply, Request};

/// A file system mounted by this daemon.
pub struct Mounted {
    pub fs: Arc<FileSystem>,
    pub fuse: FuseMount,
    pub mount_point: PathBuf,
    /// Requests, bytes, errors and latencies of each of its NSDs on this node.
    pub nsd_stats: mounts::NsdStats,
    /// The node whose metanode this mount is a client of; `None` when this node owns the
    /// file system's metadata.
    pub client_of: Option<String>,
}

pub struct Daemon {
    home: Home,
    cluster: ClusterConfig,
    /// Held by every operation that changes the configuration or the set of mounts.
    admin: Mutex<()>,
    mounts: Mutex<BTreeMap<String, Mounted>>,
    /// File systems whose mount at start failed and is tried again
    /// (`Daemon::mount_later`); an `umount` takes a name out, which stops its tries.
    waiting_mounts: Mutex<std::collections::BTreeSet<String>>,
    /// File systems this node is unmounting: their final commits make one attempt at each
    /// owner slot and take none over (`Daemon::locate_slot_holder`).
    unmounting: Mutex<std::collections::BTreeSet<String>>,
    /// File systems whose metadata this node took over from a dead owner for their
    /// clients, served without a FUSE mount of their own (this node's mount of such a file
    /// system, if any, stays a client: see `metanode_service.rs`).
    owned: Mutex<BTreeMap<String, Arc<FileSystem>>>,
    /// Owner slots (file system, slot) this node took over from nodes that no longer
    /// serve them, served without a FUSE mount of their own (`slots.rs`).
    taken_slots: Mutex<BTreeMap<(String, u32), Arc<FileSystem>>>,
    /// Owner slots (file system, slot) whose takeover found their log or metadata damaged,
    /// with what was found and when: requests for their shards fail at once instead of
    /// waiting for an owner that cannot come (`slots.rs`, `DamagedSlot`).
    damaged_slots: Mutex<BTreeMap<(String, u32), (String, std::time::Instant)>>,
    /// Held while this node takes a file system over, so that its request threads that
    /// all found the owner dead do it once.
    takeover: Mutex<()>,
    /// The daemon itself, for the metanode channels of its client mounts.
    this: std::sync::Weak<Daemon>,
    /// Declustered arrays open on this node, by name.
    arrays: Mutex<BTreeMap<String, Arc<tessera_vdisk::DeclusteredArray>>>,
    /// The incarnation (epoch) the open arrays were opened under, once known.
    arrays_epoch: Mutex<Option<u64>>,
    /// The NVMe/TCP host: remote controllers, their paths and namespaces.
    nvme: Arc<tessera_nvme::host::Host>,
    /// NSDs this node serves to others, and its paths to other nodes' NSD servers.
    nsd_service: nsd_server::NsdService,
    /// This node in the cluster: the replicated configuration, its lease.
    member: member::Member,
    /// The last disk I/Os of the mounted file systems, all NSDs together.
    io_history: Arc<tessera_drive::stats::IoHistory>,
    /// Component states and events, kept by the monitor thread.
    health: health::Health,
    /// The last hour of each mounted file system's throughput, kept by the monitor thread.
    history: history::ThroughputHistory,
    /// Admin requests being served (`diag --waiters`).
    requests: diag::RequestsInFlight,
    started: std::time::Instant,
}

/// Disk I/Os kept for `tessera diag --iohist` (mmdiag keeps 512 by default).
const IO_HISTORY_ENTRIES: usize = 512;

/// Streams `Info` and `Progress` frames to the client of one request; requests of the
/// HTTP API have no such client (`stream` is `None`) and their lines go to the log only.
pub struct Reporter<'a> {
    stream: Option<&'a mut UnixStream>,
    gone: bool,
}

impl Reporter<'_> {
    /// A reporter for requests the daemon makes of itself: nobody reads the lines.
    pub fn quiet() -> Reporter<'static> {
        Reporter {
            stream: None,
            gone: false,
        }
    }

    /// Sends a line for the user. A client that went away does not stop the operation.
    pub fn info(&mut self, line: impl Into<String>) {
        let line = line.into();
        tracing::info!("{line}");
        if let Some(stream) = self.stream.as_deref_mut() {
            let _ = write_frame(stream, &Frame::Info(line));
        }
    }

    pub fn progress(&mut self, phase: &str, done: u64, total: u64) {
        let frame = Frame::Progress {
            phase: phase.to_string(),
            done,
            total,
        };
        if let Some(stream) = self.stream.as_deref_mut() {
            if write_frame(stream, &frame).is_err() {
                self.stream = None;
                self.gone = true;
            }
        }
    }

    /// Whether the client went away (an interrupted command): operations that can stop
    /// cleanly and continue later do so.
    pub fn client_gone(&self) -> bool {
        self.gone
    }
}

/// Runs the daemon in the foreground until SIGTERM, SIGINT or a `shutdown` request.
pub fn run(home: Home) -> Result<()> {
    memory::limit_arenas();
    let cluster = home.cluster()?;
    std::fs::create_dir_all(home.log_dir())
        .with_context(|| format!("cannot create {}", home.log_dir().display()))?;
    init_logging(&home)?;
    let listener = bind_socket(&home)?;
    std::fs::write(home.pid_path(), format!("{}\n", std::process::id()))
        .with_context(|| format!("cannot write {}", home.pid_path().display()))?;
    tracing::info!(cluster = %cluster.name, node = %cluster.node_name, "daemon starting");
    let identity = tessera_nvme::host::HostIdentity::load_or_create(&home.hostnqn_path())
        .map_err(|e| anyhow::anyhow!("{}: {e}", home.hostnqn_path().display()))?;
    tracing::info!(hostnqn = %identity.nqn, "NVMe/TCP host identity");
    let member = member::Member::start(&home, &cluster)?;
    let daemon = Arc::new_cyclic(|this| Daemon {
        home,
        cluster,
        admin: Mutex::new(()),
        mounts: Mutex::new(BTreeMap::new()),
        waiting_mounts: Mutex::new(std::collections::BTreeSet::new()),
        unmounting: Mutex::new(std::collections::BTreeSet::new()),
        owned: Mutex::new(BTreeMap::new()),
        taken_slots: Mutex::new(BTreeMap::new()),
        damaged_slots: Mutex::new(BTreeMap::new()),
        takeover: Mutex::new(()),
        this: this.clone(),
        arrays: Mutex::new(BTreeMap::new()),
        arrays_epoch: Mutex::new(None),
        nvme: Arc::new(tessera_nvme::host::Host::new(identity)),
        nsd_service: nsd_server::NsdService::new(),
        member,
        io_history: Arc::new(tessera_drive::stats::IoHistory::new(IO_HISTORY_ENTRIES)),
        health: health::Health::default(),
        history: history::ThroughputHistory::default(),
        requests: diag::RequestsInFlight::default(),
        started: std::time::Instant::now(),
    });
    daemon
        .member
        .serve_file_systems(Arc::new(metanode_service::MountedFileSystems(
            Arc::downgrade(&daemon),
        )));
    spawn_signal_thread(Arc::clone(&daemon))?;
    let active = daemon.join_at_start()?;
    if active {
        http::start(&daemon)?;
    }
    daemon.start_monitor()?;
    daemon.start_lease_watch()?;
    daemon.restore_nvme_at_start();
    // Devices may have been renamed since the last start: find NSDs by their descriptors
    // (and pdisks by their labels, when the arrays open) before anything mounts.
    daemon.discover_nsds_at_start();
    daemon.open_arrays_at_start();
    // Before the mounts: a mount here may reach its NSDs through this node's own service.
    daemon.start_nsd_service()?;
    if active {
        daemon.remount_at_start();
    } else {
        // A node of a larger cluster mounts once it holds a lease; its admin socket
        // answers meanwhile (`tessera state` says arbitrating).
        let waiting = Arc::clone(&daemon);
        std::thread::Builder::new()
            .name("remount".into())
            .spawn(move || {
                while !waiting.member.wait_active(Duration::from_secs(3600)) {}
                // Its parameters are the cluster's from here on.
                if let Err(e) = http::start(&waiting) {
                    tracing::error!("{e:#}");
                }
                // Arrays first (their pdisk I/O needed the lease), then the file systems on
                // their vdisks.
                waiting.open_arrays_given_here();
                waiting.remount_at_start();
            })?;
    }
    tracing::info!("daemon active");
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                continue;
            }
        };
        let daemon = Arc::clone(&daemon);
        std::thread::spawn(move || daemon.serve(stream));
    }
    Ok(())
}

fn init_logging(home: &Home) -> Result<()> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(home.log_path())
        .with_context(|| format!("cannot open {}", home.log_path().display()))?;
    let filter = tracing_subscriber::EnvFilter::try_from_env("TESSERA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::sync::Mutex::new(log))
        .with_ansi(false)
        .init();
    Ok(())
}

/// Binds the admin socket, refusing when another daemon already answers on it.
fn bind_socket(home: &Home) -> Result<UnixListener> {
    let path = home.socket_path();
    if UnixStream::connect(&path).is_ok() {
        bail!(
            "a Tessera daemon is already running for {} (it answers on {}); \
             stop it with `tessera shutdown` first",
            home.root().display(),
            path.display()
        );
    }
    // Nobody answers: the file is left over from a daemon that died.
    let _ = std::fs::remove_file(&path);
    UnixListener::bind(&path).with_context(|| format!("cannot listen on {}", path.display()))
}

/// Blocks SIGTERM and SIGINT in every thread and waits for them in one, so shutdown runs
/// as ordinary code rather than in a signal handler.
fn spawn_signal_thread(daemon: Arc<Daemon>) -> Result<()> {
    let set = crate::signals::block_termination()?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let signal = crate::signals::wait(&set);
            tracing::info!("signal {signal} received; shutting down");
            daemon.shutdown();
            std::process::exit(0);
        })?;
    Ok(())
}

impl Daemon {
    fn serve(&self, stream: UnixStream) {
        let Ok(read_half) = stream.try_clone() else {
            return;
        };
        let mut reader = BufReader::new(read_half);
        let mut stream = stream;
        loop {
            let request: Request = match read_frame(&mut reader) {
                Ok(Some(r)) => r,
                Ok(None) => return,
                Err(e) => {
                    let _ = write_frame(&mut stream, &Frame::Err(e.to_string()));
                    return;
                }
            };
            let shutdown = matches!(request, Request::Shutdown);
            let serving = self.requests.enter(&request);
            let frame = {
                let mut reporter = Reporter {
                    stream: Some(&mut stream),
                    gone: false,
                };
                match self.handle(request, &mut reporter) {
                    Ok(reply) => Frame::Ok(reply),
                    Err(e) => match e.downcast::<crate::rpc::ManagerElsewhere>() {
                        Ok(elsewhere) => Frame::Elsewhere {
                            fs: elsewhere.fs,
                            node: elsewhere.node,
                        },
                        Err(e) => {
                            tracing::warn!("request failed: {e:#}");
                            Frame::Err(format!("{e:#}"))
                        }
                    },
                }
            };
            drop(serving);
            let _ = write_frame(&mut stream, &frame);
            if shutdown {
                std::process::exit(0);
            }
        }
    }

    fn handle(&self, request: Request, r: &mut Reporter) -> Result<Reply> {
        tracing::debug!(?request, "request");
        if let Some(fs) = mounts::manager_only(&request) {
            if let Some(node) = self.manager_elsewhere(fs)? {
                return Err(anyhow::Error::new(crate::rpc::ManagerElsewhere {
                    fs: fs.to_string(),
                    node,
                }));
            }
            // Without a disk lease this node does no disk I/O and no owner slot answers
            // it: refused at once rather than after every slot's wait.
            if !self.member.holds_lease() {
                anyhow::bail!(
                    "node {} holds no disk lease now, so it cannot manage file system {fs}: \
                     it does not reach a majority of the quorum nodes, or was expelled \
                     (`tessera state -a`); start the quorum nodes or fix the network, then \
                     retry",
                    self.cluster.node_name
                );
            }
        }
        match request {
            Request::Ping => Ok(Reply::Pong {
                pid: std::process::id(),
                node_name: self.cluster.node_name.clone(),
                node_number: self.cluster.node_number,
            }),
            Request::Shutdown => {
                self.shutdown();
                Ok(Reply::Done)
            }
            Request::NsdCreate { nsds, verify } => self.nsd_create(nsds, verify, r),
            Request::NsdList => Ok(Reply::Nsds(self.nsds()?.nsds)),
            Request::NsdAccess => Ok(Reply::NsdAccess(self.nsd_access()?)),
            Request::NsdDelete { names } => self.nsd_delete(&names, r),
            Request::NsdDiscover => {
                let _admin = self.admin.lock();
                Ok(Reply::NsdDiscovery(self.discover_nsds()?))
            }
            Request::NsdChange { name, device } => self.nsd_change(&name, &device),
            Request::NsdChangeServers { changes } => self.nsd_change_servers(&changes),
            Request::PerfNsd {
                nsd,
                write,
                size,
                threads,
                seconds,
            } => Ok(Reply::PerfNsd(
                self.perf_nsd(&nsd, write, size, threads, seconds)?,
            )),
            Request::FsCreate(spec) => self.fs_create(*spec, r),
            Request::FsShow { name } => self.fs_show(&name),
            Request::FsDelete {
                name,
                unreadable_ok,
            } => self.fs_delete(&name, unreadable_ok, r),
            Request::Mount { name, mount_point } => self.mount_request(&name, mount_point),
            Request::MountList { name } => self.mount_list(name.as_deref()),
            Request::Umount { name } => self.umount(&name),
            Request::Df { name } => self.df(&name),
            Request::Fsck { name, repair } => self.fsck(&name, repair, r),
            Request::ReclaimSpace { name } => self.reclaim_space(&name, r),
            Request::PolicyChange { name, text, test } => {
                self.policy_change(&name, text.as_deref(), test)
            }
            Request::PolicyLs { name } => self.policy_ls(&name),
            Request::FileAttr { name, ino } => self.file_attr(&name, ino),
            Request::FileReplicationSet { name, ino, copies } => {
                self.file_replication_set(&name, ino, copies)
            }
            Request::FsReplicationSet { name, copies } => self.fs_replication_set(&name, copies),
            Request::FsMetadataReplicationSet { name, copies } => {
                self.fs_metadata_replication_set(&name, copies)
            }
            Request::DiskAdd {
                name,
                disks,
                verify,
                rebalance,
            } => self.disk_add(&name, &disks, verify, rebalance, r),
            Request::DiskChange { name, nsds, status } => self.disk_change(&name, &nsds, status),
            Request::DiskAvailability { name, nsds, up } => {
                self.disk_availability(&name, &nsds, up)
            }
            Request::DiskDelete { name, nsds } => self.disk_delete(&name, &nsds, r),
            Request::Restripe {
                name,
                balance,
                placement,
                replication,
                check,
            } => {
                use tessera_fs::restripe::RestripeMode;
                let mode = if placement {
                    RestripeMode::Placement
                } else if balance {
                    RestripeMode::Balance
                } else if replication {
                    RestripeMode::Replicate
                } else if check {
                    RestripeMode::Check
                } else {
                    RestripeMode::Migrate
                };
                self.restripe(&name, mode, r)
            }
            Request::PolicyApply { name, text, mode } => self.policy_apply(&name, &text, mode, r),
            Request::Pmon { name } => self.pmon(name.as_deref()),
            Request::IoHistory => Ok(self.io_history()),
            Request::Health => Ok(self.health_report()),
            Request::Diag => self.diag_report(),
            request @ (Request::DaCreate { .. }
            | Request::DaChange { .. }
            | Request::DaList
            | Request::DaDelete { .. }
            | Request::DaMove { .. }
            | Request::DaScrub { .. }
            | Request::VdiskCreate { .. }
            | Request::VdiskList
            | Request::VdiskDelete { .. }
            | Request::PdiskList
            | Request::PdiskChange { .. }
            | Request::PdiskReplace { .. }) => self.da_request(request, r),
            request @ (Request::ClusterShow
            | Request::NodeAdd { .. }
            | Request::NodeDelete { .. }
            | Request::NodeChange { .. }
            | Request::ConfigSet { .. }
            | Request::ClusterState { .. }) => self.cluster_request(request),
            request @ (Request::NvmeConnect(_)
            | Request::NvmeDisconnect { .. }
            | Request::NvmeList) => self.nvme_request(request, r),
        }
    }

    /// Unmounts every file system (FUSE first, then the core's final checkpoint) and
    /// removes the socket and pid file. Failures are logged: shutdown goes on regardless.
    /// A file system this node manages for other live nodes goes to one of them first, as
    /// at `umount` [mmshutdown moves the file system manager]: without that they would
    /// wait for this node's expel (`failureDetectionTime`) and a log replay.
    fn shutdown(&self) {
        let managed: Vec<String> = self
            .mounts
            .lock()
            .iter()
            .filter(|(_, m)| m.client_of.is_none())
            .map(|(name, _)| name.clone())
            .collect();
        let fss = self.file_systems().unwrap_or_default();
        for name in managed {
            let has_clients = fss
                .get(&name)
                .is_some_and(|r| !self.live_clients(r).is_empty());
            if !has_clients {
                continue;
            }
            if let Err(e) = self.umount(&name) {
                tracing::warn!(
                    "{name}: not handed over at shutdown: {e:#}; its clients take it over \
                     once this node is expelled"
                );
            }
        }
        let _admin = self.admin.lock();
        let mounted = std::mem::take(&mut *self.mounts.lock());
        for (name, m) in mounted {
            if let Err(e) = m.fuse.unmount() {
                tracing::error!("{name}: FUSE unmount of {}: {e}", m.mount_point.display());
            }
            match m.fs.unmount() {
                Ok(()) => tracing::info!("{name}: unmounted from {}", m.mount_point.display()),
                Err(e) => tracing::error!("{name}: final checkpoint failed: {e}"),
            }
            self.release_slots(&name);
        }
        // Taken over for its clients: handed to one of them, or checkpointed.
        let owned: Vec<String> = self.owned.lock().keys().cloned().collect();
        for name in owned {
            if let Err(e) = self.release_owned(&name) {
                tracing::error!("{name}: not let go at shutdown: {e:#}");
            }
        }
        self.close_arrays();
        // Closes the controllers cleanly; nvme.json keeps them for the next start.
        let closed = self.nvme.disconnect_all();
        tracing::info!("NVMe/TCP: {closed} controller(s) disconnected");
        self.member.shutdown();
        let _ = std::fs::remove_file(self.home.socket_path());
        let _ = std::fs::remove_file(self.home.pid_path());
        tracing::info!("daemon stopped");
    }
}
