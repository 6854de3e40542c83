//! The file-system layer's requests between nodes: this daemon answers other nodes'
//! metanode requests for the file systems it has mounted ([`MountedFileSystems`]), and a
//! client's requests reach another node's metanode over the node transport
//! ([`TransportChannel`]). The cluster layer carries the bytes and refuses a sender whose
//! incarnation is no longer live; the file-system layer encodes and decodes them.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tessera_cluster::net::TransportNet;
use tessera_cluster::node::NodeNumber;
use tessera_cluster::rpc::{FileSystemService, PeerReply, PeerRequest};
use tessera_cluster::service::ClusterNode;
use tessera_fs::{Fence, FileSystem, FsError, FsResult, MetanodeChannel};

use super::Daemon;

/// How long a client waits for a metanode's answer before the application gets EIO. A
/// bound, never an indefinite hang (CLUSTER.md); takeover of a dead owner waits for its
/// expel first, which test timings keep within seconds and the defaults within a minute.
pub(super) const METANODE_WAIT: Duration = Duration::from_secs(60);

/// The metanodes of the file systems mounted on this node.
pub(super) struct MountedFileSystems(pub Weak<Daemon>);

impl FileSystemService for MountedFileSystems {
    fn call(
        &self,
        from: (NodeNumber, u64),
        (fs, slot): (&str, u32),
        request: Vec<u8>,
    ) -> Result<Vec<u8>, String> {
        let daemon = self.0.upgrade().ok_or("the daemon is stopping")?;
        // This node's own client mount (a node that took a file system over keeps its
        // mount a client) is no other node: it holds no views and no locks of a node that
        // could die apart from this owner.
        let origin = (from.0 != daemon.member.me()).then_some(tessera_fs::locks::Origin {
            node: from.0,
            incarnation: from.1,
        });
        // An owner without a disk lease may have been expelled and taken over meanwhile:
        // what it holds in memory is not to be answered from (its disk I/O is refused by
        // the lease gate already). Refused as not served: the client waits and looks for
        // the owner again.
        let serving = || {
            if daemon.member.holds_lease() {
                Ok(())
            } else {
                Err(format!(
                    "node {} owns metadata of file system {fs} but holds no disk lease now; \
                     it serves metadata again once it renews it (or another node takes it \
                     over)",
                    daemon.cluster.node_name
                ))
            }
        };
        let mounted = daemon
            .mounts
            .lock()
            .get(fs)
            .map(|m| (Arc::clone(&m.fs), m.client_of.clone()));
        // An owner's message to its clients (a fence, a revocation): for this node's own
        // mount, whatever metanodes this node serves besides.
        if Fence::is_fence(&request) {
            // The owner slots this node took over follow a descriptor change too (a disk
            // to be emptied: they move their own blocks off it).
            if Fence::is_for_every_metanode(&request) {
                if let Some(refused) = daemon.tell_taken_slots(fs, &request) {
                    return Ok(refused);
                }
            }
            return match mounted {
                // A daemon started with `TESSERA_TEST_STALL_REVOCATIONS=1` never answers a
                // revocation: how the tests make a node that is alive but hung for its
                // owner.
                Some((_, Some(_))) if stalls_revocations() && Fence::is_revocation(&request) => {
                    tracing::warn!(
                        "{fs}: not answering a revocation (TESSERA_TEST_STALL_REVOCATIONS)"
                    );
                    loop {
                        std::thread::sleep(Duration::from_secs(3600));
                    }
                }
                Some((fs, _)) => Ok(fs.serve_metanode_request(&request)),
                // Nothing mounted here, so no write of this node's to fence, and nothing
                // held to give back.
                None => Ok(Fence::done()),
            };
        }
        if tessera_fs::SlotHandBack::is_request(&request) {
            return daemon
                .give_slot_back(fs, slot, from)
                .map(|()| Fence::done())
                .map_err(|e| format!("{e:#}"));
        }
        if slot != 0 {
            // An owner slot's metanode: served here if this node holds it (taken over, or
            // its own mount's); otherwise refused as not served, so that the sender looks
            // for the slot's holder again.
            return match daemon.slot_server(fs, slot) {
                Some(server) => {
                    serving()?;
                    server
                        .serve_while_mounted(origin, &request)
                        .ok_or_else(|| not_served(fs, slot, &daemon.cluster.node_name))
                }
                None => Err(format!(
                    "owner slot {slot} of file system {fs} is not served on node {}; its \
                     holder is in the file-system table (`tessera mount ls {fs} -L`)",
                    daemon.cluster.node_name
                )),
            };
        }
        if let Some(owned) = daemon.owned.lock().get(fs).map(Arc::clone) {
            serving()?;
            return owned
                .serve_while_mounted(origin, &request)
                .ok_or_else(|| not_served(fs, 0, &daemon.cluster.node_name));
        }
        match mounted {
            Some((mount, None)) => {
                serving()?;
                mount
                    .serve_while_mounted(origin, &request)
                    .ok_or_else(|| not_served(fs, 0, &daemon.cluster.node_name))
            }
            // Refused as not served, so that the sender looks for the owner again (this
            // node may be about to serve it, after a takeover).
            Some((_, Some(owner))) => Err(format!(
                "file system {fs} is mounted on node {} as a client of node {owner}, which \
                 owns its metadata: send metanode requests there",
                daemon.cluster.node_name
            )),
            None => Err(format!(
                "file system {fs} is not mounted on node {}; its metanode is the node that \
                 mounts it (`tessera mount ls {fs} -L`)",
                daemon.cluster.node_name
            )),
        }
    }
}

/// Why a metanode request found the mount that served it being unmounted: refused as not
/// served, so that the sender looks for the owner again (another node takes it next).
fn not_served(fs: &str, slot: u32, node: &str) -> String {
    format!(
        "metanode {slot} of file system {fs} is being let go on node {node} (an unmount); \
         its next holder is in the file-system table (`tessera mount ls {fs} -L`)"
    )
}

/// A client's way to metanode `slot` of file system `fs` on node `to`, over the node
/// transport; each request carries this node's number and current epoch.
pub(super) struct TransportChannel {
    pub runtime: tokio::runtime::Handle,
    pub net: Arc<TransportNet>,
    pub node: Arc<ClusterNode<TransportNet>>,
    pub to: NodeNumber,
    pub address: String,
    pub fs: String,
    pub slot: u32,
}

impl MetanodeChannel for TransportChannel {
    fn call(&self, request: Vec<u8>) -> FsResult<Vec<u8>> {
        self.call_while(request, &|| true)
    }
}

/// How often a client waiting for a metanode's answer checks that the metanode's node is
/// still a member of the cluster.
const OWNER_WATCH: Duration = Duration::from_millis(200);

impl TransportChannel {
    /// Sends `request` and waits for the answer while `alive()` holds (checked every
    /// `OWNER_WATCH`): a request to a node that the cluster expelled meanwhile will never
    /// be answered (a cut-off node's packets are lost, not refused), and cannot have been
    /// made durable there (the node's lease ran out before its expel), so it is given up
    /// as not served.
    pub fn call_while(
        &self,
        request: Vec<u8>,
        alive: &(dyn Fn() -> bool + Sync),
    ) -> FsResult<Vec<u8>> {
        let me = self.node.me();
        let Some(epoch) = self.node.status().epoch else {
            return Err(FsError::Io(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "this node is not a live member of the cluster (no epoch): it cannot reach \
                 the metanode until it joins again",
            )));
        };
        let call = PeerRequest::FileSystem {
            from: me,
            epoch,
            fs: self.fs.clone(),
            slot: self.slot,
            request,
        };
        let unreachable = |why: String| {
            FsError::Io(std::io::Error::other(format!(
                "metanode of {} on node {}: {why}",
                self.fs, self.to
            )))
        };
        let mut keep_waiting = || alive();
        let reply = self
            .net
            .call_blocking(
                &self.runtime,
                self.to,
                &self.address,
                call,
                METANODE_WAIT,
                OWNER_WATCH,
                &mut keep_waiting,
            )
            .map_err(|e| {
                if alive() {
                    unreachable(e.to_string())
                } else {
                    unreachable(
                        "its node was expelled from the cluster while this request waited".into(),
                    )
                }
            })?;
        match reply {
            PeerReply::FileSystem(Ok(bytes)) => Ok(bytes),
            PeerReply::FileSystem(Err(why)) => Err(unreachable(why)),
            other => Err(unreachable(format!("answered {other:?}"))),
        }
    }
}

/// A client mount's way to the metanode of file system `fs`, wherever it is: the node the
/// replicated file-system table names as its owner. When that node stops answering, the
/// channel looks the owner up again; once the cluster has expelled a dead owner (its lease
/// ran out, so it does no more disk I/O), the first client node to notice takes the file
/// system over itself: it records itself as the owner by compare-and-set, replays the
/// dead owner's recovery log (`FileSystem::mount`) and serves the metadata to every client,
/// its own mount included. Applications see a pause, bounded by `METANODE_WAIT`, then EIO.
///
/// A request is sent again only after a failure that says it was not served (the node
/// could not be reached, or does not serve the file system); one lost with its answer
/// while the owner died may be applied twice (a create then finds its own file: EEXIST).
pub(super) struct FollowingChannel {
    pub daemon: Weak<Daemon>,
    pub fs: String,
    /// Which of its metanodes: 0 the file system manager, another number the holder of
    /// that owner slot (`slots.rs`).
    pub slot: u32,
    /// The owner this channel sends to: node number, daemon address and the incarnation
    /// (epoch) it had when this channel last looked.
    pub target: parking_lot::Mutex<OwnerTarget>,
    /// Counts the owners this channel moved to (`MetanodeChannel::generation`): another
    /// node, or the same node restarted (a new incarnation replayed the old one's log and
    /// knows nothing of what it had not made durable).
    pub moves: std::sync::atomic::AtomicU64,
    /// A request failed since the owner's incarnation was last checked.
    pub suspect: std::sync::atomic::AtomicBool,
}

/// Node number, daemon address and incarnation of a file system's owner.
pub(super) type OwnerTarget = (NodeNumber, String, Option<u64>);

/// How long a client waits between two looks at who owns a file system whose owner does
/// not answer.
const OWNER_POLL: Duration = Duration::from_millis(200);

/// Whether this daemon was started to leave revocations unanswered (a test's hung node).
fn stalls_revocations() -> bool {
    static STALLS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *STALLS.get_or_init(|| {
        std::env::var_os("TESSERA_TEST_STALL_REVOCATIONS").is_some_and(|v| v == "1")
    })
}

/// How long an owner waits for a node to answer a revocation before it has the node
/// expelled: twice the lease, so that a node busy for a moment (a long write under a kept
/// data token, a full transport) is never expelled, and a hung one is within seconds of a
/// dead one's detection.
fn revocation_bound(timings: &tessera_cluster::params::LeaseTimings) -> Duration {
    timings.lease * 2
}

impl MetanodeChannel for FollowingChannel {
    fn call(&self, request: Vec<u8>) -> FsResult<Vec<u8>> {
        self.call_pinned(request, None)
    }

    fn call_seen(&self, request: Vec<u8>, seen: u64) -> FsResult<Vec<u8>> {
        self.call_pinned(request, Some(seen))
    }

    fn call_once(&self, request: Vec<u8>) -> FsResult<Vec<u8>> {
        self.call_attempts(request, None, false)
    }

    fn generation(&self) -> u64 {
        self.moves.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn owner_announced(&self, owner: u32, incarnation: u64) {
        let Some(daemon) = self.daemon.upgrade() else {
            return;
        };
        // The move must happen whatever this node knows of the new owner: it is what voids
        // the old owner's answers. An address not known yet (this node's copy of the
        // configuration lags) fails the first send, and the owner is looked up then.
        let address = daemon
            .member
            .state()
            .nodes
            .get(&owner)
            .map(|n| n.address.clone());
        if address.is_none() {
            tracing::warn!(
                "{}: node {owner} announced it owns the metadata, but it is not in this \
                 node's copy of the cluster configuration yet; looking it up when sending",
                self.fs
            );
        }
        let address = address.unwrap_or_default();
        self.move_to(|t| *t = (owner, address, Some(incarnation)));
    }
}

impl FollowingChannel {
    /// Sends `request` to the owner, following it as it moves; with `seen`, only while the
    /// owner is still the one of that generation (checked under the target's lock with
    /// every attempt, so a move between two attempts is never missed).
    fn call_pinned(&self, request: Vec<u8>, seen: Option<u64>) -> FsResult<Vec<u8>> {
        self.call_attempts(request, seen, true)
    }

    /// [`FollowingChannel::call_pinned`]; without `patient`, one attempt only.
    fn call_attempts(
        &self,
        request: Vec<u8>,
        seen: Option<u64>,
        patient: bool,
    ) -> FsResult<Vec<u8>> {
        let deadline = std::time::Instant::now() + METANODE_WAIT;
        let mut last_error;
        loop {
            let daemon = self
                .daemon
                .upgrade()
                .ok_or_else(|| FsError::Io(std::io::Error::other("the daemon is stopping")))?;
            let (to, address, epoch) = {
                let target = self.target.lock();
                if seen.is_some_and(|s| s != self.generation()) {
                    return Err(FsError::OwnerMoved);
                }
                target.clone()
            };
            let channel =
                daemon
                    .member
                    .metanode_channel(to, address.clone(), self.fs.clone(), self.slot);
            // The owner's incarnation still in the cluster's table (when it was known).
            let alive =
                || epoch.is_none() || daemon.member.state().incarnations.get(&to).copied() == epoch;
            // No address: the owner was not known when this channel was made, or is not
            // in this node's copy of the configuration yet.
            let sent = if address.is_empty() {
                Err(FsError::Io(std::io::Error::other(format!(
                    "no node serves metanode {} of {} yet",
                    self.slot, self.fs
                ))))
            } else {
                channel.call_while(request.clone(), &alive)
            };
            match sent {
                Ok(reply) => {
                    if self
                        .suspect
                        .swap(false, std::sync::atomic::Ordering::SeqCst)
                    {
                        // Answered after failures: by the incarnation that failed, or by
                        // the same node started again?
                        let now = daemon.member.state().incarnations.get(&to).copied();
                        self.move_to(|t| t.2 = now);
                    }
                    return Ok(reply);
                }
                Err(e) => {
                    self.suspect
                        .store(true, std::sync::atomic::Ordering::SeqCst);
                    last_error = e;
                }
            }
            // A node unmounting the file system waits for no slot holder: one that let its
            // slot go made what it acknowledged durable, one that died loses what no fsync
            // asked for, and nothing here takes a slot over (`locate_slot_holder`).
            if !patient
                || std::time::Instant::now() >= deadline
                || (self.slot != 0 && daemon.is_unmounting(&self.fs))
            {
                return Err(last_error);
            }
            let located = match self.slot {
                0 => daemon.locate_owner(&self.fs),
                slot => daemon.locate_slot_holder(&self.fs, slot),
            };
            match located {
                Ok(Some(target)) => self.move_to(|t| *t = target.clone()),
                Ok(None) => {}
                // No owner can come until a repair: the caller hears it now (EIO), and the
                // takeover said why once.
                Err(e) if e.downcast_ref::<super::slots::DamagedSlot>().is_some() => {
                    return Err(FsError::Io(std::io::Error::other(format!("{e:#}"))));
                }
                Err(e) => tracing::warn!("{}: {e:#}", self.fs),
            }
            std::thread::sleep(OWNER_POLL);
        }
    }

    /// Changes the target with `change`; a different one counts as a move.
    fn move_to(&self, change: impl FnOnce(&mut OwnerTarget)) {
        let mut target = self.target.lock();
        let before = target.clone();
        change(&mut target);
        if *target != before {
            tracing::warn!(
                "{}: its metanode {} is now node {} at {} (incarnation {:?}; was node {}, {:?})",
                self.fs,
                self.slot,
                target.0,
                target.1,
                target.2,
                before.0,
                before.2
            );
            self.moves.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

impl Daemon {
    /// Where the metanode of `fs` is now, for a client whose owner stopped answering: the
    /// owner the table names if it is live, this node after it took a dead owner's file
    /// system over, or `None` while the owner is neither live nor expelled yet.
    fn locate_owner(&self, fs: &str) -> anyhow::Result<Option<OwnerTarget>> {
        let record = self.file_systems()?.require(fs)?.clone();
        let me = self.cluster.node_name.clone();
        let owner = record.mounted.then(|| record.mounted_on.clone()).flatten();
        match owner {
            Some(owner) if owner == me => return Ok(Some(self.own_target())),
            Some(owner) if self.node_is_live(&owner) => return Ok(self.target_of(&owner)),
            _ => {}
        }
        if !self.member.holds_lease() {
            return Ok(None);
        }
        if let Some(found) = self.damaged_slot(fs, 0) {
            return Err(anyhow::Error::new(super::slots::DamagedSlot(found)));
        }
        self.take_over(&record)?;
        Ok(Some(self.own_target()))
    }

    pub(super) fn own_target(&self) -> OwnerTarget {
        let me = self.member.me();
        let epoch = self.member.state().incarnations.get(&me).copied();
        (me, self.member.bound_address().to_string(), epoch)
    }

    /// Takes file system `record` over from its dead owner for the clients: this node
    /// becomes its owner in the table (compare-and-set: of two clients that try at once,
    /// one wins and the other finds it live), then replays its log and serves it.
    pub(super) fn take_over(&self, record: &crate::config::FsRecord) -> anyhow::Result<()> {
        let _one = self.takeover.lock();
        if self.owned.lock().contains_key(&record.name) {
            return Ok(());
        }
        let me = self.cluster.node_name.clone();
        let dead = record.mounted_on.clone().unwrap_or_default();
        // What the claim changed, to put back if the log cannot be replayed.
        let claimed_over = parking_lot::Mutex::new(None);
        self.change_fs_record(&record.name, &|rec| {
            // Checked on the table the compare-and-set writes over: an owner that is live
            // (another client took over first, or the dead owner came back and mounted it
            // again) keeps it, so there is never a second owner.
            let owner = rec.mounted.then_some(rec.mounted_on.as_deref()).flatten();
            match owner {
                Some(o) if o != me && (o != dead || self.node_is_live(o)) => anyhow::bail!(
                    "file system {} is owned by live node {o}; following it",
                    rec.name
                ),
                _ => {}
            }
            let clients = rec.clients.len();
            super::mounts::keep_dead_owner_as_client(rec, &me);
            *claimed_over.lock() = Some((
                rec.mounted,
                rec.mounted_on.clone(),
                rec.private_cache,
                rec.clients.len() > clients,
            ));
            rec.mounted = true;
            rec.mounted_on = Some(me.clone());
            rec.private_cache = false;
            Ok(())
        })?;
        if dead.is_empty() {
            tracing::info!(
                "{}: its file system manager unmounted it while this node mounts it: this \
                 node takes it over and serves the clients",
                record.name
            );
        } else {
            tracing::warn!(
                "{}: taking over from node {dead}, which owned it and was expelled; replaying \
                 its recovery log to serve the clients",
                record.name
            );
        }
        let fs = match self.open_core(record) {
            Ok((fs, _)) => fs,
            Err(e) if e.downcast_ref::<super::slots::DamagedSlot>().is_some() => {
                self.give_up_damaged_takeover(record, &me, claimed_over.lock().take(), &e);
                return Err(e);
            }
            Err(e) => {
                tracing::error!("{}: takeover failed: {e:#}", record.name);
                return Err(e);
            }
        };
        if self.metadata_slots() {
            fs.route_slots_through(self.slot_router(&record.name));
        }
        self.fence_clients(record, &fs, 0);
        self.owned.lock().insert(record.name.clone(), fs);
        tracing::info!("{}: this node serves its metadata now", record.name);
        Ok(())
    }

    /// A takeover of `record` whose log or metadata is damaged: nothing can serve it until
    /// `fsck -y`. The claim is put back (`before`: what it changed), so that no node waits
    /// for this one to serve; every node that needs the file system finds it so itself and
    /// answers EIO at once, as for a damaged owner slot (`slots.rs`).
    fn give_up_damaged_takeover(
        &self,
        record: &crate::config::FsRecord,
        me: &str,
        before: Option<(bool, Option<String>, bool, bool)>,
        found: &anyhow::Error,
    ) {
        tracing::error!(
            "{}: its file system manager's metadata cannot be taken over: {found:#}. The \
             file system answers EIO until it is repaired: `tessera umount {} -a`, \
             `tessera fsck {} -y`, then mount again (tried again here in {} s)",
            record.name,
            record.name,
            record.name,
            super::slots::DAMAGED_RECHECK.as_secs()
        );
        self.mark_damaged(&record.name, 0, found);
        let Some((mounted, mounted_on, private_cache, added_client)) = before else {
            return;
        };
        let put_back = self.change_fs_record(&record.name, &|rec| {
            if rec.mounted_on.as_deref() != Some(me) {
                return Ok(());
            }
            if added_client {
                if let Some(i) = rec.clients.iter().position(|c| {
                    Some(c.node.as_str()) == mounted_on.as_deref() && c.incarnation.is_none()
                }) {
                    rec.clients.remove(i);
                }
            }
            rec.mounted = mounted;
            rec.mounted_on = mounted_on.clone();
            rec.private_cache = private_cache;
            Ok(())
        });
        if let Err(e) = put_back {
            tracing::warn!(
                "{}: giving back the claim of a takeover that found damage: {e:#}",
                record.name
            );
        }
    }

    /// Before this node serves file system `record` as its new owner (`owner`): every
    /// node that mounts it as a client may still write data into space the old owner gave
    /// out or showed mapped, which the old owner's log may not hold (it died before making
    /// it durable), so this node could give the same space to another file; and the
    /// client holds updates the old owner acknowledged and may have lost. Each client is
    /// told who owns the metadata now; it answers once no such write is in flight or can
    /// start, handing over its unsynced updates (`RemoteMetanode::fence`), which this
    /// node applies and commits (`FileSystem::replay_fenced`) before it tells the client
    /// they are durable (`Fence::settled`). A client that cannot be reached is waited for
    /// until the cluster expels it: then its lease has run out and it does no more disk
    /// I/O. Clients wait meanwhile (this node does not serve yet) rather than fail.
    ///
    /// `slot` is the metanode `owner` serves: 0, the file system manager, whose clients
    /// are the nodes the table lists as mounting it; another owner slot, whose clients are
    /// those nodes and the manager's node too.
    pub(super) fn fence_clients(
        &self,
        record: &crate::config::FsRecord,
        owner: &FileSystem,
        slot: u32,
    ) {
        let me = self.member.me();
        let Some(incarnation) = self.member.state().incarnations.get(&me).copied() else {
            return;
        };
        let started = std::time::Instant::now();
        let mut replayed = 0;
        // The caller's record may predate its claim: a node that joined as a client in
        // between is in the table now, and a client left unfenced could write into space
        // the old owner gave it after this node gave the same space to another file. A
        // node fenced that no longer mounts the file system answers at once.
        let latest = self
            .file_systems()
            .ok()
            .and_then(|t| t.require(&record.name).ok().cloned());
        let mut nodes: Vec<String> = record
            .clients
            .iter()
            .chain(latest.iter().flat_map(|r| r.clients.iter()))
            .map(|c| c.node.clone())
            .collect();
        if slot != 0 {
            nodes.extend(record.mounted.then(|| record.mounted_on.clone()).flatten());
        }
        nodes.sort();
        nodes.dedup();
        for node in &nodes {
            let fenced = self.ask_client(record, node, Fence::request(slot, me, incarnation));
            let Some(answer) = fenced else {
                continue;
            };
            let origin = self.client_origin(node);
            let applied = owner.replay_fenced(&answer, origin);
            match &applied {
                Ok(n) => replayed += n,
                Err(e) => tracing::error!(
                    "{}: the updates client node {node} handed over: {e}",
                    record.name,
                ),
            }
            let settled = self.ask_client(record, node, Fence::settled(slot, applied.is_ok()));
            if let Some(Err(e)) = settled.map(|reply| Fence::check(&reply)) {
                tracing::error!(
                    "{}: client node {node} on the end of its fence: {e}",
                    record.name,
                );
            }
        }
        tracing::info!(
            "{}: metanode {slot}: {} client node(s) fenced and {replayed} of their unsynced \
             updates applied in {:?}",
            record.name,
            nodes.len(),
            started.elapsed()
        );
        // Now every client has said which inodes it has open: those unlinked while open
        // and open nowhere go.
        if let Err(e) = owner.reclaim_orphans() {
            tracing::error!("{}: freeing inodes unlinked while open: {e}", record.name);
        }
    }

    /// How the owner of file system `fs` on this node takes back what a client node holds:
    /// `request(inodes)` is the revocation (`Fence::drop_held` for the views, names and
    /// attributes it keeps, `Fence::give_back_data` for its kept data tokens), sent by
    /// [`Daemon::revoke`] until the node answers, is gone, or this node lost its lease.
    /// Called before the changing operation or the conflicting write goes on.
    pub(super) fn revoker(
        &self,
        fs: &str,
        request: fn(Vec<u64>) -> Vec<u8>,
        what: &'static str,
    ) -> Box<dyn Fn(tessera_fs::locks::Origin, Vec<u64>) + Send + Sync> {
        let this = self.this.clone();
        let fs = fs.to_string();
        Box::new(move |origin, inos| {
            if let Some(daemon) = this.upgrade() {
                daemon.revoke(&fs, origin, request(inos), what);
            }
        })
    }

    /// Sends `request` (a revocation) to node `origin` until it answers, or until it is
    /// gone from the cluster or this node loses its lease. Bounded: a node that is alive
    /// (it renews its lease) but has not answered within twice the lease is expelled, at
    /// this owner's request to the cluster manager, and once its lease has run out (it
    /// does no more disk I/O) the revocation counts as done. A holder that hangs must
    /// never hang the cluster (GPFS-class systems are hated for exactly that).
    fn revoke(&self, fs: &str, origin: tessera_fs::locks::Origin, request: Vec<u8>, what: &str) {
        let alive =
            || self.member.state().incarnations.get(&origin.node) == Some(&origin.incarnation);
        let timings = self.member.state().params.lease_timings();
        let give_up_at = std::time::Instant::now() + revocation_bound(&timings);
        let waiting = || alive() && std::time::Instant::now() < give_up_at;
        let mut warned = false;
        let mut expelled_at = None;
        loop {
            let state = self.member.state();
            let Some(address) = state.nodes.get(&origin.node).map(|n| n.address.clone()) else {
                return;
            };
            if !alive() {
                if let Some(at) = expelled_at {
                    // Its last lease, granted before the expel, runs out by then.
                    let lapsed: std::time::Instant = at + timings.lease + timings.recovery_wait;
                    std::thread::sleep(lapsed.saturating_duration_since(std::time::Instant::now()));
                }
                return;
            }
            if !self.member.holds_lease() {
                return;
            }
            if std::time::Instant::now() >= give_up_at {
                if self.expel_unanswering(fs, origin, what) {
                    expelled_at = Some(std::time::Instant::now());
                    continue;
                }
                std::thread::sleep(OWNER_POLL);
                continue;
            }
            let channel = self
                .member
                .metanode_channel(origin.node, address, fs.to_string(), 0);
            match channel.call_while(request.clone(), &waiting) {
                Ok(_) => return,
                Err(e) if !warned => {
                    tracing::warn!(
                        "{fs}: node {} does not answer the revocation of its {what} ({e}); \
                         the change or write that needs them waits for it, at most {:?} \
                         before it is expelled",
                        origin.node,
                        revocation_bound(&timings)
                    );
                    warned = true;
                }
                Err(_) => {}
            }
            std::thread::sleep(OWNER_POLL);
        }
    }

    /// Asks the cluster manager to expel incarnation `origin`, which has not answered a
    /// revocation within the bound; true once the expel is committed (or the node is gone
    /// anyway).
    fn expel_unanswering(&self, fs: &str, origin: tessera_fs::locks::Origin, what: &str) -> bool {
        let term = self.member.state().manager_term;
        let expel = tessera_cluster::state::Command::Expel {
            node: origin.node,
            epoch: origin.incarnation,
            term,
        };
        tracing::error!(
            "{fs}: node {} has not answered the revocation of its {what}; asking the cluster \
             manager to expel it (its mounts go stale; it rejoins by itself)",
            origin.node
        );
        match self.member.propose(expel) {
            Ok(_) => true,
            Err(e) => {
                let gone =
                    self.member.state().incarnations.get(&origin.node) != Some(&origin.incarnation);
                if !gone {
                    tracing::warn!(
                        "{fs}: the expel of node {} was not committed: {e:#}",
                        origin.node
                    );
                }
                gone
            }
        }
    }

    /// Where requests of client node `node` come from, as the transport names them
    /// (`None` for this node's own mount).
    fn client_origin(&self, node: &str) -> Option<tessera_fs::locks::Origin> {
        if node == self.cluster.node_name {
            return None;
        }
        let state = self.member.state();
        let (number, _) = state.nodes.iter().find(|(_, n)| n.name == node)?;
        Some(tessera_fs::locks::Origin {
            node: *number,
            incarnation: state.incarnations.get(number).copied()?,
        })
    }

    /// Sends one half of a fence to client node `node` of `record` (this node's own client
    /// in process) until it answers; `None` once it is expelled or gone from the
    /// configuration (its lease ran out: it writes nothing more), or when this node has
    /// no mount of its own to ask.
    pub(super) fn ask_client(
        &self,
        record: &crate::config::FsRecord,
        node: &str,
        request: Vec<u8>,
    ) -> Option<Vec<u8>> {
        if node == self.cluster.node_name {
            let mine = self
                .mounts
                .lock()
                .get(&record.name)
                .map(|m| Arc::clone(&m.fs));
            return mine.map(|fs| fs.serve_metanode_request(&request));
        }
        let mut warned = false;
        loop {
            let state = self.member.state();
            let (number, address) = state
                .nodes
                .iter()
                .find(|(_, n)| n.name == node)
                .map(|(k, n)| (*k, n.address.clone()))?;
            let epoch = state.incarnations.get(&number).copied()?;
            let alive = || self.member.state().incarnations.get(&number) == Some(&epoch);
            let channel = self
                .member
                .metanode_channel(number, address, record.name.clone(), 0);
            match channel.call_while(request.clone(), &alive) {
                Ok(reply) => return Some(reply),
                Err(e) if !warned => {
                    tracing::warn!(
                        "{}: client node {node} does not answer its fence ({e}); waiting for \
                         it or for its expel before serving",
                        record.name
                    );
                    warned = true;
                }
                Err(_) => {}
            }
            std::thread::sleep(OWNER_POLL);
        }
    }
}
