//! The client's side of the namespace: the operations the access layer (FUSE) calls, each
//! sent to the metanode of the inode it names first through [`Namespace`]. This node owns
//! every shard today, so that metanode is this `FileSystem` and a request is a call; with
//! shard owners on other nodes the same request crosses the cluster transport. What stays
//! here is what a client does itself: counting its own operations (`pmon`) and cutting a
//! file's size through its data path before the owner changes the other attributes.

use std::sync::Arc;

use crate::acl::{Acl, AclKind};
use crate::error::{FsError, FsResult};
use crate::fs::FileSystem;
use crate::inode::{Attr, FileKind, Ino};
use crate::metanode::{Namespace, NewNode, RenameHow, XattrHow};
use crate::namespace::{Caller, DirListing, SetAttr, StatFs};

/// How often [`FileSystem::routed`] asks, at most: the shards a request is about move
/// between slots rarely (an empty one given with a directory, a dead node's taken over),
/// so a third move while one request is on its way is one too many to chase.
const ROUTED_TRIES: u32 = 3;

impl FileSystem {
    /// The metanode of `ino`'s shard, as a client reaches it (see [`FileSystem::route`]).
    pub(crate) fn namespace_of(&self, ino: Ino) -> &dyn Namespace {
        match self.route(ino) {
            crate::fs::Route::Here => self,
            crate::fs::Route::There(remote) => remote,
        }
    }

    /// The file system manager, which answers for space and inodes of the whole file
    /// system; on one node it also owns every shard.
    pub(crate) fn namespace_manager(&self) -> &dyn Namespace {
        match self.remote.get() {
            Some(remote) => &**remote,
            None => self,
        }
    }

    /// Sends this node's metanode requests (namespace, data path, allocation) through
    /// their wire encoding to its own owner, as they will travel to an owner on another
    /// node; `TESSERA_METANODE_LOOPBACK=1` does it at mount. A check of the wire form for
    /// tests and diagnosis: it costs an encode and a decode per request. Idempotent.
    pub fn route_metadata_through_wire(self: &Arc<Self>) {
        let channel = crate::metanode_wire::Loopback(Arc::downgrade(self));
        self.route_own_metadata_through(Box::new(channel));
    }

    /// Sends every metanode request of this owner's mount through `channel`, which leads
    /// back to this same owner (its wire form, or this node's own daemon over the node
    /// transport): a check of that path, as a client on another node takes it.
    pub fn route_own_metadata_through(&self, channel: Box<dyn crate::MetanodeChannel>) {
        self.route_metadata_through(channel);
        self.loopback
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// How this mount reaches the owner of another owner slot: `channel(slot)` gives the
    /// channel to the node that holds it (the daemon's node transport; in tests an owner
    /// in this process), asked once per slot, when a request first goes there. Without
    /// it, requests for other slots' shards go to the file system manager, which answers
    /// that the shard is elsewhere. Only the first function set is used.
    pub fn route_slots_through(
        &self,
        channel: Box<dyn Fn(u32) -> Option<Box<dyn crate::MetanodeChannel>> + Send + Sync>,
    ) {
        let _ = self.slot_channel.set(channel);
    }

    /// Sends this node's metanode requests through `channel` (the node transport, to the
    /// node that owns the metadata) instead of to its own owner. Only the first channel
    /// set is used.
    pub fn route_metadata_through(&self, channel: Box<dyn crate::MetanodeChannel>) {
        let remote = crate::metanode_wire::RemoteMetanode::new(channel, self.devices.clone());
        let _ = self.remote.set(Arc::new(remote));
    }

    /// Answers one encoded metanode request from another node's client (see
    /// `metanode_wire.rs`) with its encoded reply, or on a client-only mount a new
    /// owner's fence; a request that does not decode is answered with an error naming it.
    pub fn serve_metanode_request(&self, request: &[u8]) -> Vec<u8> {
        self.serve_metanode_request_from(None, request)
    }

    /// Whether `shard`, which this slot's owner was asked about and does not hold, is one
    /// the owner map gives it since it last looked, now taken (see
    /// [`FileSystem::take_from_owner_map`]). A directory made for this slot takes its shard
    /// once the manager's answer is back here, and another node may ask about the new
    /// directory in between. The file system manager gives shards; it never takes any.
    fn takes_shard_given_meanwhile(&self, shard: u32) -> bool {
        if self.owner_slot() == 0 || self.owner().meta.lock().state.holds(shard as usize) {
            return false;
        }
        match self.take_from_owner_map() {
            Ok(_) => self.owner().meta.lock().state.holds(shard as usize),
            Err(e) => {
                tracing::warn!(
                    "{}: could not read the owner map for shard {shard}: {e}",
                    self.geo.fs_name
                );
                false
            }
        }
    }

    /// [`FileSystem::serve_metanode_request_from`] unless this mount is unmounted or being
    /// unmounted (`None`: the caller answers that the metanode is not served here). The
    /// unmount waits for requests let in before it to finish.
    pub fn serve_while_mounted(
        &self,
        origin: Option<crate::locks::Origin>,
        request: &[u8],
    ) -> Option<Vec<u8>> {
        // Recursive: a request served here may be asked of this mount again on its way
        // (through another node), and must not wait behind an unmount waiting for it.
        let _serving = self.serving.read_recursive();
        if self.unmounted.load(std::sync::atomic::Ordering::SeqCst) {
            return None;
        }
        Some(self.serve_metanode_request_from(origin, request))
    }

    /// [`FileSystem::serve_metanode_request`] for a request that came from `origin` (the
    /// node and incarnation the transport vouches for; `None` for this node's own).
    pub fn serve_metanode_request_from(
        &self,
        origin: Option<crate::locks::Origin>,
        request_bytes: &[u8],
    ) -> Vec<u8> {
        use crate::metanode_wire::{cache_changes, decode, encode, serve, MetanodeReply};
        use crate::metanode_wire::{MetanodeRequest, RemoteError};
        let request: MetanodeRequest = match decode(request_bytes, "request") {
            Ok(request) => request,
            Err(e) => return encode(&MetanodeReply::Failed(RemoteError::from(&e))),
        };
        if let MetanodeRequest::DiskAvailability { nsds, up } = &request {
            let done = if *up {
                self.start_disks(nsds)
            } else {
                self.stop_disks(nsds)
            };
            return encode(&match done {
                Ok(_) => MetanodeReply::Done,
                Err(e) => MetanodeReply::Failed(RemoteError::from(&e)),
            });
        }
        if let MetanodeRequest::DescriptorChanged = request {
            return encode(&match self.follow_descriptor() {
                Ok(_) => MetanodeReply::Done,
                Err(e) => MetanodeReply::Failed(RemoteError::from(&e)),
            });
        }
        if let MetanodeRequest::DropHeld { inos } = &request {
            // From the owner of another slot (or the manager): what this mount holds of
            // those inodes, from whichever owner, goes; so does what this node's kernel
            // keeps of those its own metanode does not serve (it drops its own itself).
            let slots: Vec<_> = self.slot_routes.iter().filter_map(|r| r.get()).collect();
            if self.remote.get().is_some() || !slots.is_empty() {
                for remote in self.remote.get().into_iter().chain(slots) {
                    remote.drop_held(inos);
                }
                // The names the kernel was given, when it was given any under those
                // directories, and the inodes: the answer goes back once the kernel
                // dropped them.
                let mut foreign = self.kernel_kept.take(inos);
                foreign.extend(
                    inos.iter()
                        .filter(|i| crate::read_tokens::is_inode_key(**i))
                        .filter(|i| !self.serves(**i))
                        .map(|i| crate::CacheChange::Inode(*i)),
                );
                if let Some(notify) = self.remote_change.get().filter(|_| !foreign.is_empty()) {
                    notify(foreign);
                }
                return encode(&MetanodeReply::Done);
            }
        }
        if let MetanodeRequest::GiveBackData { inos } = &request {
            // Data tokens this mount keeps of another slot's files go back to that owner.
            if self.slot_routes.iter().any(|r| r.get().is_some()) {
                self.give_back_kept(inos);
                return encode(&MetanodeReply::Done);
            }
        }
        match &request {
            // The new owner of another slot: only what this mount did under that slot's
            // old owner is fenced and handed over.
            MetanodeRequest::FenceWrites {
                owner,
                incarnation,
                slot,
            } if *slot != 0 => {
                let reply = match self.made_slot_route(*slot) {
                    Some(remote) => self.fence_reply(remote, *owner, *incarnation, *slot),
                    // Never reached: nothing done under it, and the way to it made later
                    // goes to the holder the table names then.
                    None => MetanodeReply::Done,
                };
                return encode(&reply);
            }
            MetanodeRequest::FenceSettled { replayed, slot } if *slot != 0 => {
                if let Some(remote) = self.made_slot_route(*slot) {
                    remote.fence_settled(*replayed);
                }
                return encode(&MetanodeReply::Done);
            }
            _ => {}
        }
        if let Some(remote) = self.remote.get() {
            match request {
                MetanodeRequest::FenceWrites {
                    owner, incarnation, ..
                } => {
                    // A move of map regions the old manager left unfinished ends here: the
                    // descriptor on disk is final now.
                    self.release_map_hold_of_a_gone_manager();
                    return encode(&self.fence_reply(remote, owner, incarnation, 0));
                }
                MetanodeRequest::FenceSettled { replayed, .. } => {
                    remote.fence_settled(replayed);
                    return encode(&MetanodeReply::Done);
                }
                // `DropHeld` was answered above, for every mount that reaches an owner.
                MetanodeRequest::GiveBackData { inos } => {
                    self.give_back_kept(&inos);
                    return encode(&MetanodeReply::Done);
                }
                _ => {}
            }
        }
        // A client-only mount has no metadata to answer from (a request sent to the wrong
        // node).
        if let Err(e) = self.owner_here("answering a metanode request") {
            return encode(&MetanodeReply::Failed(RemoteError::from(&e)));
        }
        // What this mount (or another node) gathered of the file lands before another
        // node is answered.
        if let Some(node) = origin {
            self.before_remote_request(&request, node);
        }
        if let MetanodeRequest::ProvideSlot = request {
            let reply = match self.provide_slot() {
                Ok(slot) => MetanodeReply::Count(u64::from(slot)),
                Err(e) => MetanodeReply::Failed(RemoteError::from(&e)),
            };
            return encode(&reply);
        }
        if let MetanodeRequest::ProvideRegion { slot } = request {
            let reply = match self.provide_region(slot) {
                Ok(region) => MetanodeReply::Count(region as u64),
                Err(e) => MetanodeReply::Failed(RemoteError::from(&e)),
            };
            return encode(&reply);
        }
        if let MetanodeRequest::GiveRegionBack = request {
            let reply = match self.give_region_back() {
                Ok(region) => MetanodeReply::Count(region as u64),
                Err(e) => MetanodeReply::Failed(RemoteError::from(&e)),
            };
            return encode(&reply);
        }
        if let MetanodeRequest::Leaving = request {
            if let Some(node) = origin {
                self.owner().meta.holders.forget(node);
            }
            return encode(&MetanodeReply::Done);
        }
        if let MetanodeRequest::Lock { ino, call } = request {
            let reply = match Namespace::lock(self, ino, call, origin) {
                Ok(conflict) => MetanodeReply::Lock(conflict),
                Err(e) => MetanodeReply::Failed(RemoteError::from(&e)),
            };
            return encode(&reply);
        }
        if let MetanodeRequest::Gather { ino } = request {
            let reply = match self.grant_gather(ino, origin) {
                Ok(granted) => MetanodeReply::Count(u64::from(granted)),
                Err(e) => MetanodeReply::Failed(RemoteError::from(&e)),
            };
            return encode(&reply);
        }
        if let MetanodeRequest::DropKept { holder, inos } = &request {
            let reply = match Namespace::drop_kept(self, *holder, inos, origin) {
                Ok(()) => MetanodeReply::Done,
                Err(e) => MetanodeReply::Failed(RemoteError::from(&e)),
            };
            return encode(&reply);
        }
        let durable = crate::metanode_wire::durable_before_answer(&request);
        // Answered once logged, unless it touched another origin's uncommitted change
        // (`early_answer.rs`).
        let early = origin.is_some() && crate::early_answer::answered_early(&request);
        if let MetanodeRequest::Once {
            client,
            seq,
            request: inner,
        } = &request
        {
            let done = self.owner().meta.lock().state.was_answered(*client, *seq);
            if done {
                // A retry of a request this owner (or the one whose log it replayed) did:
                // its answer, not a second run.
                tracing::info!("client {client:x}: request {seq} was done already; answering it");
                // What it changed the first time is not known here: the client drops
                // everything it holds. Made durable first: the first answer may have been
                // one before the commit (`early_answer.rs`) that the client never read.
                if let Err(e) = self.sync_own() {
                    return encode(&MetanodeReply::Failed(RemoteError::from(&e)));
                }
                let reply = crate::metanode_wire::answer_again(self, inner);
                return encode(&MetanodeReply::Changed {
                    inos: None,
                    reply: encode(&reply),
                    fresh: Vec::new(),
                });
            }
        }
        let child =
            |parent: Ino, name: &[u8]| Namespace::find(self, parent, name).ok().map(|a| a.ino);
        let notify = self.remote_change.get();
        let mut changes = match notify {
            Some(_) => cache_changes(&request, &child),
            None => Vec::new(),
        };
        if let (Some(node), MetanodeRequest::Update { ino, .. }) = (origin, &request) {
            // The write of a node gathering the file under its mark: this node's kernel
            // cached nothing of the file since the mark was set (`grant_gather` dropped it,
            // and a read here takes the token back first, which waits for this write). A
            // drop asked now could wait for such a read, whose page it locks while its
            // take-back waits for this very write.
            if self.gathered_by(*ino, node) {
                changes.retain(|c| !matches!(c, crate::CacheChange::Inode(i) if i == ino));
            }
        }
        let once = match &request {
            MetanodeRequest::Once { client, seq, .. } => Some((*client, *seq)),
            _ => None,
        };
        // Another node may keep what it reads until this owner revokes it; it is recorded
        // as holding the inode before what it is answered is read (`read_tokens.rs`).
        let holders = &self.owner().meta.holders;
        if let (Some(_), Some(gone)) = (origin, self.holder_gone.get()) {
            holders.sweep_if_full(&**gone);
        }
        if origin.is_some() {
            holders.evict_if_full();
        }
        let held = match (&request, origin) {
            (
                MetanodeRequest::View { ino, .. }
                | MetanodeRequest::Attr { ino }
                | MetanodeRequest::HeldBytes { ino }
                | MetanodeRequest::AttrBytes { ino },
                Some(node),
            ) => holders.grant(*ino, node),
            // Under a token of its own (see `read_tokens.rs`).
            (MetanodeRequest::Protection { ino }, Some(node)) => {
                holders.grant(crate::read_tokens::protection_key(*ino), node)
            }
            (MetanodeRequest::Find { parent, name }, Some(node)) => {
                holders.note_found(*parent, name, node);
                holders.grant(*parent, node)
            }
            _ => false,
        };
        let asked = match &request {
            MetanodeRequest::Find { .. } => Asked::Find,
            MetanodeRequest::Make { .. } => Asked::Make,
            MetanodeRequest::Once { request, .. }
                if matches!(**request, MetanodeRequest::Make { .. }) =>
            {
                Asked::Make
            }
            _ => Asked::Read,
        };
        // The name a `Find` or `Make` is about: kept under a token of its own when its
        // directory's is not granted (`read_tokens::name_key`).
        let named = match &request {
            MetanodeRequest::Find { parent, name } => Some((*parent, name.clone())),
            MetanodeRequest::Once { request, .. } => match &**request {
                MetanodeRequest::Make { parent, name, .. } => Some((*parent, name.clone())),
                _ => None,
            },
            MetanodeRequest::Make { parent, name, .. } => Some((*parent, name.clone())),
            _ => None,
        };
        crate::fs::ANSWERING.set(once);
        crate::read_tokens::SERVING.set(origin);
        drop(crate::read_tokens::take_own_changed());
        let keep_data = match &request {
            MetanodeRequest::Once { request, .. } => match &**request {
                MetanodeRequest::Make { node, .. } if node.open => node.keep_data,
                _ => None,
            },
            _ => None,
        };
        crate::early_answer::start();
        let mut reply = serve(self, request);
        if let MetanodeReply::Failed(RemoteError::ShardElsewhere { shard }) = reply {
            // A shard the manager gave this slot with a directory made for it, asked about
            // by another node (which read the owner map) before the node that made the
            // directory had its answer and took the shard: taken now, and served. The
            // failed run changed nothing (a shard is looked up before anything is logged).
            if self.takes_shard_given_meanwhile(shard) {
                if let Ok(again) = decode(request_bytes, "request") {
                    crate::fs::ANSWERING.set(once);
                    crate::early_answer::start();
                    reply = serve(self, again);
                }
            }
        }
        let logged = crate::early_answer::finish();
        let own_changed = crate::read_tokens::take_own_changed();
        crate::read_tokens::SERVING.set(None);
        // Taken by the request's first log record; left over when it logged nothing.
        crate::fs::ANSWERING.set(None);
        if let (true, MetanodeReply::View(view)) = (held, &mut reply) {
            let view = std::mem::replace(
                view,
                crate::metanode::FileView {
                    attr: view.attr,
                    pool: view.pool,
                    copies: view.copies,
                    content: crate::metanode::Content::None,
                },
            );
            reply = MetanodeReply::HeldView(view);
        }
        // A found name's inode may be kept even when its directory may not (other nodes
        // change it): its attributes under its own token.
        if let (true, Some(node)) = (held || asked != Asked::Read, origin) {
            reply = self.held_reply(reply, asked, node, held, named.as_ref());
        }
        if let (
            Some(lock),
            MetanodeReply::Held(crate::metanode_wire::HeldReply::Made(a, _, _, kept)),
        ) = (keep_data, &mut reply)
        {
            // The creator keeps the new file's data token: a lock nobody else can hold yet.
            let call = crate::locks::LockCall {
                lock,
                test: false,
                wait: false,
            };
            *kept = matches!(Namespace::lock(self, a.ino, call, origin), Ok(None));
        }
        let mut early_at = None;
        if durable && !matches!(reply, MetanodeReply::Failed(_)) {
            match logged.filter(|_| early) {
                Some(lsn) => early_at = Some(lsn),
                None => {
                    if let Err(e) = self.sync_own() {
                        reply = MetanodeReply::Failed(RemoteError::from(&e));
                    }
                }
            }
        }
        // Whatever the answer: dropping a cached entry that did not change costs the
        // kernel one lookup, keeping one that did would serve a stale name.
        if let Some(notify) = notify.filter(|_| !changes.is_empty()) {
            notify(changes);
        }
        if !own_changed.is_empty() {
            // Read after the change, while the node is still recorded as holding them:
            // whatever changes them next revokes them.
            let fresh = own_changed
                .iter()
                .filter(|&&key| crate::read_tokens::is_inode_key(key))
                .filter_map(|&ino| self.attr_and_bytes(ino))
                .collect();
            reply = MetanodeReply::Changed {
                inos: Some(own_changed),
                reply: encode(&reply),
                fresh,
            };
        }
        if let Some(lsn) = early_at {
            reply = MetanodeReply::Early {
                lsn,
                reply: encode(&reply),
            };
        }
        encode(&reply)
    }

    /// `reply` to a read whose inode `node` was recorded as holding (`held`), or to its
    /// `Make` or `Find` of `named`, as one it may keep. A name found is kept under its
    /// directory's token (when `held`: granted) and its attributes and bytes under the
    /// child's, and what a `Make` made under its own: the child is recorded too, and read
    /// again after that, so that no change between the first read and the record goes
    /// unrevoked. Every `Found` and `Made` also keeps the name under its own token
    /// (`read_tokens::name_key`), recorded before the name is looked up again: a
    /// directory that other nodes create in is never granted, but the names this node
    /// made or found there change only when someone renames or removes them.
    fn held_reply(
        &self,
        reply: crate::metanode_wire::MetanodeReply,
        asked: Asked,
        node: crate::locks::Origin,
        held: bool,
        named: Option<&(Ino, Vec<u8>)>,
    ) -> crate::metanode_wire::MetanodeReply {
        use crate::metanode_wire::{HeldReply, MetanodeReply as R, RemoteError};
        match (reply, asked) {
            (R::Attr(a), Asked::Find | Asked::Make) => {
                let holders = &self.owner().meta.holders;
                if !holders.grant(a.ino, node) {
                    return R::Attr(a);
                }
                let name_held = named.is_some_and(|(parent, name)| {
                    holders.grant(crate::read_tokens::name_key(*parent, name), node)
                        && Namespace::find(self, *parent, name).is_ok_and(|now| now.ino == a.ino)
                });
                if !name_held {
                    return R::Attr(a);
                }
                match (asked, self.attr_and_bytes(a.ino)) {
                    (Asked::Find, Some((again, bytes))) => R::Held(HeldReply::Found {
                        attr: again,
                        bytes,
                        name: held,
                    }),
                    (_, Some((again, bytes))) => {
                        // A new file's view: the write that follows its create needs it.
                        let view = (again.kind == crate::inode::FileKind::Regular)
                            .then(|| crate::metanode::Metanode::view(self, a.ino, 0..0).ok())
                            .flatten();
                        R::Held(HeldReply::Made(again, bytes, view, false))
                    }
                    (_, None) => R::Attr(a),
                }
            }
            (R::Failed(RemoteError::NotFound), Asked::Find) if held => R::Held(HeldReply::Absent),
            (R::Failed(RemoteError::InodeElsewhere { ino }), Asked::Find) if held => {
                R::Held(HeldReply::Elsewhere(ino))
            }
            (reply, Asked::Find) if !held => reply,
            // A Make's other answers (a failure) are plain.
            (reply, Asked::Make) => reply,
            (R::Attr(a), _) => R::Held(HeldReply::Attr(a)),
            (R::Count(n), _) => R::Held(HeldReply::Count(n)),
            (R::AttrBytes(a, n), _) => R::Held(HeldReply::AttrBytes(a, n)),
            (R::Protection(a, acl), _) => R::Held(HeldReply::Protection(a, acl)),
            (other, _) => other,
        }
    }

    /// An inode's attributes and the bytes it holds, as this owner has them now.
    fn attr_and_bytes(&self, ino: Ino) -> Option<(Attr, u64)> {
        let attr = Namespace::attr(self, ino).ok()?;
        Some((attr, Namespace::held_bytes(self, ino).ok()?))
    }

    /// Calls `notify` with everything a request from another node's client changed that
    /// this node's kernel may cache (see [`crate::CacheChange`]), after the change and
    /// before the answer goes back: `notify` returns once the caches have dropped them
    /// (or after a bound of its own), so that once the other node's operation has
    /// returned no cached copy here is older than it. Only the first function set is used.
    pub fn on_remote_change(&self, notify: Box<dyn Fn(Vec<crate::CacheChange>) + Send + Sync>) {
        let _ = self.remote_change.set(notify);
    }

    /// Tells this mount how to learn whether its node may answer from what its own
    /// metanode keeps: a node whose disk lease lapsed may have been expelled and its
    /// metadata taken over by another node, which changes it meanwhile, so its memory is
    /// no answer to its own kernel either. Only the first function set is used.
    pub fn on_serve_check(&self, check: crate::fs::ServeCheck) {
        let _ = self.serve_check.set(check);
    }

    /// Waits while this node's lease has lapsed (up to a bound), and refuses once it is
    /// expelled, on a mount that owns metadata (a client-only mount keeps nothing of its
    /// own: what it holds of others' it dropped when the lease lapsed, and its requests
    /// wait for a lease at the transport). Called by the access layer before every
    /// request of the kernel.
    pub fn may_serve(&self) -> FsResult<()> {
        /// A lapse longer than this is an expel in the making (`leaseRecoveryWait`).
        const LAPSE_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(60);
        let Some(check) = self.serve_check.get().filter(|_| self.owner.is_some()) else {
            return Ok(());
        };
        let started = std::time::Instant::now();
        loop {
            match check() {
                Ok(()) => return Ok(()),
                Err(crate::fs::ServeRefusal::Stale(why)) => {
                    return Err(FsError::Remote {
                        errno: libc::EIO,
                        message: why,
                    })
                }
                Err(crate::fs::ServeRefusal::Lapsed(why)) => {
                    if started.elapsed() > LAPSE_WAIT_MAX {
                        return Err(FsError::Remote {
                            errno: libc::EIO,
                            message: why,
                        });
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
            }
        }
    }

    /// Whether this node's kernel may keep `name` in `parent`, naming `ino`, for the
    /// mount's cache time: when this node's own metanode serves `parent` (it drops from
    /// the kernel what other nodes change), or when this mount holds the name under
    /// `parent`'s read token or the name's own (the owner revokes it before any change of
    /// the directory, or of that name, returns, and the revocation makes the kernel's
    /// names invalid first). Recorded before the token is checked (see
    /// `read_tokens::KernelKept`). The kernel's own changes (its create, unlink, rename) it
    /// orders itself. Only for a kernel that can make its names invalid without a
    /// directory's lock (`CacheChange::AllNames`).
    pub fn kernel_may_keep_name(&self, parent: Ino, name: &[u8], ino: Ino) -> bool {
        let drop = self.remote_change.get().map(|d| &**d as &dyn Fn(_));
        self.kernel_may_keep(parent, |kept, remote| {
            (kept.note_names(parent, drop) && remote.holds_name(parent, name, ino))
                || (kept.note_names(crate::read_tokens::name_key(parent, name), drop)
                    && remote.holds_named(parent, name, ino))
        })
    }

    /// Whether this node's own metanode serves `ino` ([`FileSystem::serves`]), or else
    /// what `noted_and_held` says of the way to the owner that does (recorded for the
    /// kernel, then held there).
    fn kernel_may_keep(
        &self,
        ino: Ino,
        noted_and_held: impl FnOnce(
            &crate::read_tokens::KernelKept,
            &crate::metanode_wire::RemoteMetanode,
        ) -> bool,
    ) -> bool {
        match self.route(ino) {
            crate::fs::Route::Here => self.is_owner(),
            crate::fs::Route::There(remote) => noted_and_held(&self.kernel_kept, remote),
        }
    }

    /// This node lost its disk lease. Owners revoke what it holds of their inodes only
    /// until the cluster expels it (they wait for that, never longer): from then on they
    /// change those inodes without asking it. So neither its daemon nor its kernel keeps
    /// anything another owner granted (and its kernel no name at all, since this node's
    /// own shards may be taken over too); what it is asked next goes to the owners, and
    /// waits or fails until it holds a lease again. Called within a fraction of
    /// `leaseRecoveryWait` of the lease running out (the daemon watches it), before any
    /// other node's change can return without this node.
    pub fn lease_lost(&self) {
        let slots = self.slot_routes.iter().filter_map(|r| r.get());
        for remote in self.remote.get().into_iter().chain(slots) {
            remote.drop_all_held();
        }
        let mut kept = self.kernel_kept.take_all();
        kept.push(crate::CacheChange::AllNames);
        if let Some(notify) = self.remote_change.get() {
            notify(kept);
        }
    }

    /// Records that this node's kernel is about to keep a name in `parent` whatever this
    /// mount holds: a rename there moves the kernel's entry of the old name under the new
    /// one, with the time it had left to live. Called before the rename goes to the owner,
    /// so that a revocation of `parent` after it drops the name.
    pub fn kernel_moves_name_into(&self, parent: Ino) {
        if !self.serves(parent) {
            self.kernel_kept.note_moved_into(parent);
        }
    }

    /// Whether this node's kernel may keep `ino`'s attributes for the mount's cache time
    /// (see [`FileSystem::kernel_may_keep_name`]). Only for an answer to the kernel's
    /// `GETATTR`: the kernel discards an answer to one that a revocation of the inode
    /// overtook (its attribute version), which it does not for an inode a lookup or create
    /// brings in new.
    pub fn kernel_may_keep_attr(&self, ino: Ino) -> bool {
        self.kernel_may_keep(ino, |kept, remote| {
            kept.note_attr(ino) && remote.holds_attr(ino)
        })
    }

    /// `op` on the namespace that serves `ino`, and again after reading the owner map
    /// again when that owner answers that the shard is elsewhere (it was given to another
    /// slot since this mount read the map), as long as each reading finds it moved, at most
    /// `ROUTED_TRIES` times in all.
    pub(crate) fn routed<T>(
        &self,
        ino: Ino,
        op: impl Fn(&dyn Namespace) -> FsResult<T>,
    ) -> FsResult<T> {
        let mut tries = 1;
        loop {
            // The slot asked, as the map stood when the request left: another of this
            // node's requests may read the map again while this one is on its way, and then
            // the read below finds nothing new although this request went by the old map.
            let asked = self.slot_serving(ino);
            let shard = match op(self.namespace_of(ino)) {
                Err(FsError::ShardElsewhere { shard }) if tries < ROUTED_TRIES => shard,
                other => return other,
            };
            // Read again, and taken when the map now gives it to this mount's own slot,
            // whose directory made a moment ago another of this node's requests may reach
            // before the making request took its shard.
            let moved = self.reread_owner_map()?;
            let elsewhere_now = self.slot_serving(ino) != asked;
            if !(self.takes_shard_given_meanwhile(shard) || moved || elsewhere_now) {
                return Err(FsError::ShardElsewhere { shard });
            }
            tries += 1;
        }
    }

    pub fn getattr(&self, ino: Ino) -> FsResult<Attr> {
        self.take_back_gathered(ino, None);
        self.with_gathered(ino, || self.routed(ino, |ns| ns.attr(ino)), |a| a)
    }

    /// The attributes and the bytes of storage the file holds, at once (a `stat`).
    pub fn getattr_allocated(&self, ino: Ino) -> FsResult<(Attr, u64)> {
        self.take_back_gathered(ino, None);
        self.with_gathered(
            ino,
            || self.routed(ino, |ns| ns.attr_and_bytes(ino)),
            |(a, _)| a,
        )
    }

    /// Bytes of storage the file holds (for st_blocks): whole sub-blocks of its block map.
    pub fn allocated_bytes(&self, ino: Ino) -> u64 {
        self.routed(ino, |ns| ns.held_bytes(ino)).unwrap_or(0)
    }

    /// The attributes of `name` in `parent`: asked of `parent`'s owner, and of the
    /// inode's own owner when another slot serves it (a directory made for a slot).
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> FsResult<Attr> {
        match self.routed(parent, |ns| ns.find(parent, name)) {
            Err(FsError::InodeElsewhere { ino }) => self.getattr(ino),
            // Read again with the file's runs held, or another node's gathered writes
            // taken back.
            Ok(a) if self.attrs_may_lag(a.ino) => self.getattr(a.ino),
            found => found,
        }
    }

    /// Creates a file, directory, symlink or special file in `parent` with `mode` as given
    /// (a default ACL of `parent` still applies, see [`FileSystem::create_node_umask`]).
    #[allow(clippy::too_many_arguments)]
    pub fn create_node(
        &self,
        parent: Ino,
        name: &[u8],
        kind: FileKind,
        mode: u32,
        rdev: u32,
        caller: Caller,
        symlink_target: Option<&[u8]>,
    ) -> FsResult<Attr> {
        self.create_node_umask(parent, name, kind, (mode, 0), rdev, caller, symlink_target)
    }

    /// Creates a file, directory, symlink or special file in `parent`. `(mode, umask)` are
    /// the creator's: when `parent` has a default ACL the new node inherits it and the
    /// umask is ignored (POSIX.1e), otherwise the mode is `mode & !umask`.
    #[allow(clippy::too_many_arguments)]
    pub fn create_node_umask(
        &self,
        parent: Ino,
        name: &[u8],
        kind: FileKind,
        (mode, umask): (u32, u32),
        rdev: u32,
        caller: Caller,
        symlink_target: Option<&[u8]>,
    ) -> FsResult<Attr> {
        // A directory this mount's slot makes where another slot serves the parent is
        // made for this slot: it and what is made in it are this node's work.
        let mine = self.owner_slot();
        let for_slot = (kind == FileKind::Directory
            && mine != 0
            && self.owner.is_some()
            && self.slot_serving(parent) != mine)
            .then_some(mine);
        let node = NewNode {
            open: false,
            kind,
            mode,
            umask,
            rdev,
            caller,
            symlink_target: symlink_target.map(<[u8]>::to_vec),
            for_slot,
            keep_data: None,
        };
        let made = self.routed(parent, |ns| ns.make(parent, name, node.clone()))?;
        if for_slot.is_some() && self.slot_serving(made.ino) != mine {
            // Given to this slot (unless no empty shard was left): take it before the
            // caller goes on in it.
            self.take_from_owner_map()?;
        }
        Ok(made)
    }

    pub fn readlink(&self, ino: Ino) -> FsResult<Vec<u8>> {
        self.routed(ino, |ns| ns.link_target(ino))
    }

    /// Removes a name (unlink or rmdir).
    pub fn remove(&self, parent: Ino, name: &[u8], dir: bool) -> FsResult<()> {
        // What another owner serves than `parent`'s is removed in steps with it
        // (`across_owners.rs`).
        match self.routed(parent, |ns| ns.drop_name(parent, name, dir)) {
            Err(FsError::InodeElsewhere { ino }) if dir => {
                self.rmdir_across_owners(parent, name, ino)
            }
            Err(FsError::InodeElsewhere { ino }) => self.unlink_across_owners(parent, name, ino),
            done => done,
        }
    }

    pub fn link(&self, ino: Ino, parent: Ino, name: &[u8]) -> FsResult<Attr> {
        match self.routed(parent, |ns| ns.add_name(ino, parent, name)) {
            Err(FsError::AcrossOwners(_)) => self.link_across_owners(ino, parent, name),
            Ok(a) if self.attrs_may_lag(a.ino) => self.getattr(a.ino),
            done => done,
        }
    }

    /// rename(2) with RENAME_NOREPLACE and RENAME_EXCHANGE.
    pub fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        noreplace: bool,
        exchange: bool,
    ) -> FsResult<()> {
        // A directory that moves where several owners serve the namespace moves under the
        // cluster's rename lock (`across_owners.rs`), whichever owner does it: another
        // owner's move may change the parents it checks. Within one directory too: a move
        // to another directory takes the old name last, and a rename of it meanwhile left
        // the directory named twice. A name that named a file when this client looked may
        // name a directory by the time the owner moves it: the owner then moves nothing
        // (`dirs_may_move`) and the rename goes on under the lock (`rename_across_owners`).
        let lock_dirs = self.moves_take_the_rename_lock();
        let locked =
            if lock_dirs && (exchange || self.lookup(parent, name)?.kind == FileKind::Directory) {
                Some(self.rename_lock()?)
            } else {
                None
            };
        let how = RenameHow {
            noreplace,
            exchange,
            dirs_may_move: !lock_dirs || locked.is_some(),
        };
        let moved = self.routed(parent, |ns| {
            ns.move_name((parent, name), (new_parent, new_name), how)
        });
        match moved {
            Err(FsError::AcrossOwners(_)) if !exchange => self.rename_across_owners(
                (parent, name),
                (new_parent, new_name),
                noreplace,
                locked.is_some(),
            ),
            done => done,
        }
    }

    /// Changes attributes; a new size is cut (or extended) by the data path first.
    pub fn setattr(&self, ino: Ino, set: SetAttr) -> FsResult<Attr> {
        // Explicit times must not be stamped over by gathered writes landing later, here
        // or on another node.
        self.take_back_gathered(ino, None);
        self.flush_gathered(ino)?;
        if let Some(size) = set.size {
            self.truncate(ino, size)?;
        }
        let set = SetAttr { size: None, ..set };
        self.routed(ino, |ns| ns.change_attr(ino, set))
    }

    pub fn open(&self, ino: Ino) -> FsResult<Attr> {
        let attr = self.routed(ino, |ns| ns.opened(ino))?;
        self.count_open(ino);
        self.pmon.open();
        Ok(attr)
    }

    /// Counts an open of `ino` on a client-only mount (see `client_opens`).
    fn count_open(&self, ino: Ino) {
        if self.owner.is_none() {
            *self.client_opens.lock().entry(ino).or_insert(0) += 1;
        }
    }

    /// What this mount asked other nodes' metanodes, by owner (0: the file system manager,
    /// another number: that owner slot) and kind: requests sent and seconds spent waiting
    /// for their answers. Empty on a mount that reached no other node.
    pub fn metanode_requests(&self) -> Vec<(u32, &'static str, u64, f64)> {
        let mut out = Vec::new();
        if let Some(remote) = self.remote.get() {
            out.extend(remote.sent().into_iter().map(|(k, n, s)| (0, k, n, s)));
        }
        for (slot, route) in self.slot_routes.iter().enumerate() {
            if let Some(remote) = route.get() {
                let slot = u32::try_from(slot).expect("slot numbers fit u32");
                out.extend(remote.sent().into_iter().map(|(k, n, s)| (slot, k, n, s)));
            }
        }
        out
    }

    /// The way to the owner of `slot` if this mount has made it (it reached that owner).
    fn made_slot_route(&self, slot: u32) -> Option<&crate::metanode_wire::RemoteMetanode> {
        self.slot_routes
            .get(slot as usize)
            .and_then(|r| r.get())
            .map(|r| &**r)
    }

    /// This mount's answer to the fence of `remote`'s new owner (node `owner` in
    /// `incarnation`): once no write under the old owner is in flight, the updates it
    /// acknowledged and this mount does not know durable, and the locks and opens this
    /// mount holds there (of the inodes `slot` serves: 0 for the file system manager). The
    /// kernel keeps nothing it was given under the old owner's tokens: the new owner does
    /// not know what this node holds.
    fn fence_reply(
        &self,
        remote: &crate::metanode_wire::RemoteMetanode,
        owner: u32,
        incarnation: u64,
        slot: u32,
    ) -> crate::metanode_wire::MetanodeReply {
        use crate::metanode_wire::MetanodeReply;
        let reply = remote.fence(owner, incarnation);
        let kept = self.kernel_kept.take_all();
        if let Some(notify) = self.remote_change.get().filter(|_| !kept.is_empty()) {
            notify(kept);
        }
        let of_slot = |ino: Ino| self.slot_serving(ino) == slot;
        let mut locks = self.held_locks.lock().of_client(self.lock_client);
        locks.retain(|(ino, _)| of_slot(*ino));
        // The new owner must know which files this mount may have gathered writes of.
        for (ino, lock) in &mut locks {
            if crate::locks::is_kept_data(lock)
                && self.kept_token(*ino).is_some_and(|t| t.gathers())
            {
                lock.pid = crate::locks::GATHERING_PID;
            }
        }
        let mut open = self.open_here();
        open.retain(|(ino, _)| of_slot(*ino));
        match reply {
            _ if locks.is_empty() && open.is_empty() => reply,
            MetanodeReply::Done => MetanodeReply::Handover {
                updates: Vec::new(),
                locks,
                open,
            },
            MetanodeReply::Replay(updates) => MetanodeReply::Handover {
                updates,
                locks,
                open,
            },
            MetanodeReply::ReplayChanges(changes) => MetanodeReply::HandoverChanges {
                changes,
                locks,
                open,
            },
            failed => failed,
        }
    }

    pub(crate) fn open_here(&self) -> Vec<(Ino, u32)> {
        let opens = self.client_opens.lock();
        let mut out: Vec<(Ino, u32)> = opens.iter().map(|(i, n)| (*i, *n)).collect();
        out.sort_unstable();
        out
    }

    /// Creates a regular file in `parent` and opens it, in one step (FUSE's create; see
    /// [`FileSystem::create_node_umask`] for `mode` and `umask`); released like any open.
    pub fn create_open(
        &self,
        parent: Ino,
        name: &[u8],
        (mode, umask): (u32, u32),
        caller: Caller,
    ) -> FsResult<Attr> {
        let node = NewNode {
            kind: FileKind::Regular,
            mode,
            umask,
            rdev: 0,
            caller,
            symlink_target: None,
            open: true,
            for_slot: None,
            keep_data: self.data_token_to_keep_at_create(parent),
        };
        crate::metanode_wire::MADE_KEPT.set(None);
        let attr = self.routed(parent, |ns| ns.make(parent, name, node.clone()))?;
        if crate::metanode_wire::MADE_KEPT.take() == Some(attr.ino) {
            self.keep_data_token_made(attr.ino);
        }
        self.count_open(attr.ino);
        self.pmon.open();
        Ok(attr)
    }

    /// Drops one open handle; frees the inode if it was the last reference.
    pub fn release(&self, ino: Ino) -> FsResult<()> {
        self.pmon.close();
        let gathered = self.release_gathered(ino);
        if self.owner.is_none() {
            let mut opens = self.client_opens.lock();
            if let Some(n) = opens.get_mut(&ino) {
                *n -= 1;
                if *n == 0 {
                    opens.remove(&ino);
                }
            }
        }
        let closed = self.routed(ino, |ns| ns.closed(ino));
        gathered.and(closed)
    }

    pub fn readdir(&self, ino: Ino, after: u64) -> FsResult<DirListing> {
        self.pmon.readdir();
        self.routed(ino, |ns| ns.entries(ino, after))
    }

    /// The whole file system's space and inodes. With owner slots each owner counts the
    /// inodes of its shards and the free space of its allocation regions (holding the
    /// others' as used): the file system's are the manager's plus every slot's.
    pub fn statfs(&self) -> StatFs {
        let mut space = self.namespace_manager().space();
        let mut used = space.inodes_total.saturating_sub(space.inodes_free);
        for slot in self.slots_beside_the_manager(&self.descriptor()) {
            let Some(owner) = self.slot_namespace(slot) else {
                continue;
            };
            let theirs = owner.space();
            if theirs.inodes_total == 0 {
                continue; // It could not answer (logged).
            }
            space.fragments_free += theirs.fragments_free;
            used += theirs.inodes_total.saturating_sub(theirs.inodes_free);
        }
        space.inodes_free = space.inodes_total.saturating_sub(used);
        space
    }

    pub fn setxattr(
        &self,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        create: bool,
        replace: bool,
    ) -> FsResult<()> {
        let how = XattrHow { create, replace };
        self.routed(ino, |ns| ns.put_xattr(ino, name, value, how))
    }

    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> FsResult<Vec<u8>> {
        self.routed(ino, |ns| ns.xattr(ino, name))
    }

    /// Names as the kernel wants them: each followed by a NUL.
    pub fn listxattr(&self, ino: Ino) -> FsResult<Vec<u8>> {
        self.routed(ino, |ns| ns.xattr_names(ino))
    }

    pub fn removexattr(&self, ino: Ino, name: &[u8]) -> FsResult<()> {
        self.routed(ino, |ns| ns.drop_xattr(ino, name))
    }

    /// Sets an access or default ACL from its extended attribute value (checked, EINVAL
    /// if malformed). An access ACL sets the mode bits it mirrors and is stored only if it
    /// says more than they do; `drop_setgid` clears the setgid bit as the kernel's
    /// `posix_acl_update_mode` does for a caller outside the file's group. A default ACL
    /// exists only on directories.
    pub fn set_acl(
        &self,
        ino: Ino,
        kind: AclKind,
        value: &[u8],
        (create, replace): (bool, bool),
        drop_setgid: bool,
    ) -> FsResult<()> {
        let how = XattrHow { create, replace };
        self.routed(ino, |ns| ns.put_acl(ino, kind, value, how, drop_setgid))
    }

    /// The access ACL of `ino`, if it has one.
    pub fn access_acl(&self, ino: Ino) -> FsResult<Option<Acl>> {
        Ok(self.routed(ino, |ns| ns.protection(ino))?.acl)
    }
}

/// What a request read, for what its answer lets another node keep
/// (`FileSystem::held_reply`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Asked {
    /// `View`, `Attr`, `HeldBytes`, `Protection`, or a request that keeps nothing.
    Read,
    Find,
    Make,
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use crate::metanode_wire::{decode, encode, MetanodeReply, MetanodeRequest};

    /// An unmount waits for the requests being served to finish before its final
    /// checkpoint, and refuses the later ones as not served here: no request logs into a
    /// slot's log after the checkpoint that lets the slot go to another node.
    #[test]
    fn an_unmount_waits_for_requests_in_flight_and_refuses_later_ones() {
        let dir = tempfile::tempdir().unwrap();
        let fs = crate::owner::tests::mounted(dir.path());
        let asked = encode(&MetanodeRequest::DiskFree);
        let answer = fs
            .serve_while_mounted(None, &asked)
            .expect("served while mounted");
        let reply: MetanodeReply = decode(&answer, "reply").unwrap();
        assert!(matches!(reply, MetanodeReply::DiskFree(_)), "{reply:?}");
        // A request in flight (its share of the gate held).
        let in_flight = fs.serving.read_recursive();
        let (done, unmounted) = mpsc::channel();
        let unmounting = std::thread::spawn({
            let fs = fs.clone();
            move || {
                fs.unmount().unwrap();
                done.send(()).unwrap();
            }
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            unmounted.try_recv().is_err(),
            "the unmount went on under a request in flight"
        );
        drop(in_flight);
        unmounted.recv_timeout(Duration::from_secs(30)).unwrap();
        unmounting.join().unwrap();
        assert!(fs.serve_while_mounted(None, &asked).is_none());
    }
}
