//! Owner slots (`metadataSlots=yes`): which node serves the metadata of which slot of a
//! file system, and how a slot moves when its holder dies or unmounts.
//!
//! The replicated file-system table records each slot's holder as a node and the
//! incarnation that claimed it (`SlotHolder`). A holder serves its slot while that
//! incarnation is live; a node's own mount claims the slot recorded for it (or asks the
//! file system manager for a new one), and an unmount releases it (incarnation `None`).
//! A slot whose holder is not serving — its incarnation was expelled, the node restarted,
//! or it unmounted — is taken over by the first node that needs it: compare-and-set of
//! the holder in the table, then a second mount of the slot in that node's daemon
//! (`FileSystem::mount_slot` replays the slot's own log over its on-disk metadata, so
//! takeover time does not grow with the file count), then a fence of every node that
//! mounts the file system (each hands over what it did under the old holder), then it
//! serves. Clients follow the holder as they follow the file system manager
//! (`FollowingChannel` with the slot's number).
//!
//! A slot whose log (or on-disk metadata) a takeover finds damaged cannot be served until
//! `fsck -y` repairs it, which needs the file system unmounted everywhere. Its shards are
//! then marked on the node that tried ([`DamagedSlot`]): requests for them fail at once
//! with EIO and a log line naming the slot and the repair, where they waited a minute each
//! for an owner that could not come while the takeover was tried every 200 ms; the rest
//! of the file system goes on as before. The takeover is tried again at most every
//! [`DAMAGED_RECHECK`], in case what failed was not the disk.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use tessera_fs::FileSystem;

use super::metanode_service::{FollowingChannel, OwnerTarget};
use super::Daemon;
use crate::config::{FsRecord, SlotHolder};

/// How long a slot found damaged at a takeover stays marked before the takeover is tried
/// again.
pub(super) const DAMAGED_RECHECK: Duration = Duration::from_secs(30);

/// A takeover of an owner slot found its log or on-disk metadata damaged: the slot cannot
/// be served until `fsck -y` repairs it. Carried in the error, so that a request for one of
/// its shards fails at once instead of waiting for an owner.
#[derive(Debug)]
pub(super) struct DamagedSlot(pub String);

impl std::fmt::Display for DamagedSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DamagedSlot {}

impl Daemon {
    /// Whether nodes that mount beside the manager own what they make (`metadataSlots`).
    pub(super) fn metadata_slots(&self) -> bool {
        self.member.state().params.get("metadataSlots", None) == "yes"
    }

    /// This node's incarnation in the cluster, if it is a live member.
    fn incarnation(&self) -> Option<u64> {
        let me = self.member.me();
        self.member.state().incarnations.get(&me).copied()
    }

    /// Whether `holder` serves its slot now: the incarnation that claimed it is live.
    fn holder_serving(&self, holder: &SlotHolder) -> bool {
        let Some(claimed) = holder.incarnation else {
            return false;
        };
        let state = self.member.state();
        state
            .nodes
            .values()
            .find(|n| n.name == holder.node)
            .is_some_and(|n| state.incarnations.get(&n.number) == Some(&claimed))
    }

    /// The mount on this node that serves owner slot `slot` of `fs`: one taken over from
    /// another node, or this node's own mount when it owns that slot.
    pub(super) fn slot_server(&self, fs: &str, slot: u32) -> Option<Arc<FileSystem>> {
        if let Some(taken) = self.taken_slots.lock().get(&(fs.to_string(), slot)) {
            return Some(Arc::clone(taken));
        }
        self.mounts
            .lock()
            .get(fs)
            .filter(|m| m.fs.is_owner() && m.fs.owner_slot() == slot && slot != 0)
            .map(|m| Arc::clone(&m.fs))
    }

    /// Tells the owner slots of `fs` this node took over from other nodes news every
    /// metanode instance follows ([`tessera_fs::Fence::is_for_every_metanode`]: a
    /// descriptor change, disks stopped or started), as the mount of each slot's own node
    /// would be told; returns the reply of the first that refused.
    pub(super) fn tell_taken_slots(&self, fs: &str, request: &[u8]) -> Option<Vec<u8>> {
        let taken: Vec<(u32, Arc<FileSystem>)> = self
            .taken_slots
            .lock()
            .iter()
            .filter(|((name, _), _)| name == fs)
            .map(|((_, slot), mount)| (*slot, Arc::clone(mount)))
            .collect();
        let mut refused = None;
        for (slot, mount) in taken {
            let Some(reply) = mount.serve_while_mounted(None, request) else {
                continue;
            };
            if let Err(e) = tessera_fs::Fence::check(&reply) {
                tracing::warn!("{fs}: owner slot {slot} (taken over here): {e}");
                refused.get_or_insert(reply);
            }
        }
        refused
    }

    /// This node's owner slot of `record`: the one the table records for it, claimed for
    /// this incarnation by compare-and-set (unless another node took it over meanwhile),
    /// or a new one the manager makes when asked through `channel`, recorded before it is
    /// used. Other slots recorded for this node (taken over from others before) are
    /// released: whoever needs them takes them.
    pub(super) fn slot_of_this_node(
        &self,
        record: &FsRecord,
        channel: &dyn tessera_fs::MetanodeChannel,
    ) -> Result<u32> {
        let me = self.cluster.node_name.clone();
        let incarnation = self.incarnation().ok_or_else(|| {
            anyhow!("this node is not a live member of the cluster; it cannot claim a slot")
        })?;
        let mut record = record.clone();
        // The slot recorded for this node; if another node took it over meanwhile, once
        // more after that node gave it back.
        for attempt in 0..2 {
            if let Some(slot) = self.slot_to_claim(&record) {
                let claimed = self.change_fs_record(&record.name, &|rec| {
                    let mut mine = false;
                    for h in rec.slot_holders.iter_mut() {
                        if h.slot == slot {
                            if h.node != me && self.holder_serving(h) {
                                break;
                            }
                            h.node = me.clone();
                            h.incarnation = Some(incarnation);
                            mine = true;
                        } else if h.node == me {
                            h.incarnation = None;
                        }
                    }
                    if !mine {
                        bail!("owner slot {slot} was taken over by another node");
                    }
                    Ok(())
                });
                match claimed {
                    Ok(()) => {
                        tracing::info!("{}: this node holds owner slot {slot} again", record.name);
                        return Ok(slot);
                    }
                    Err(e) => tracing::info!("{}: {e:#}", record.name),
                }
            }
            // The table as the failed claim saw it (it applied every change up to it).
            record = self.file_systems()?.require(&record.name)?.clone();
            if attempt > 0 {
                break;
            }
            match self.take_home_slot_back(&record) {
                Some(slot) => record = self.wait_to_hold(&record.name, slot)?,
                None => break,
            }
        }
        tracing::info!("{}: asking the manager for a new owner slot", record.name);
        let slot = tessera_fs::ask_for_slot(channel).map_err(|e| {
            anyhow!(
                "file system {}: no owner slot for this node: {e}",
                record.name
            )
        })?;
        self.change_fs_record(&record.name, &|rec| {
            // Any other slot the table names this node for is not mounted here: released,
            // for the first node that needs it (a slot given back whose claim came too late
            // would otherwise stay named for a node that does not serve it).
            for h in rec.slot_holders.iter_mut().filter(|h| h.node == me) {
                h.incarnation = None;
            }
            rec.slot_holders.retain(|h| h.slot != slot);
            rec.slot_holders.push(SlotHolder {
                node: me.clone(),
                slot,
                incarnation: Some(incarnation),
                home: Some(me.clone()),
            });
            Ok(())
        })?;
        tracing::info!("{}: this node holds owner slot {slot}", record.name);
        Ok(slot)
    }

    /// The slot this node claims at its mount: the one made for it (its directories are
    /// there) when it is recorded for this node or for a node that no longer serves it (one
    /// that took it over and unmounted since); else, for a table from before homes were
    /// kept, the lowest slot recorded for this node. Never a slot made for another node that
    /// this node only took over: that node claims it when it mounts, and a node claiming it
    /// instead would send that node to make a new slot beside its own directories.
    fn slot_to_claim(&self, record: &FsRecord) -> Option<u32> {
        let me = &self.cluster.node_name;
        let home = record
            .slot_holders
            .iter()
            .filter(|h| h.home.as_ref() == Some(me))
            .filter(|h| &h.node == me || !self.holder_serving(h))
            .map(|h| h.slot)
            .min();
        home.or_else(|| {
            record
                .slot_holders
                .iter()
                .filter(|h| &h.node == me && h.home.is_none())
                .map(|h| h.slot)
                .min()
        })
    }

    /// Asks the node that took over the slot made for this node (while this node was down)
    /// to give it back, so that this node serves its own directories again rather than a
    /// new, empty slot beside them, which another node would go on serving for it. Returns
    /// the slot if the holder did: the table then names this incarnation its holder, to
    /// claim and mount as its own. When it does not (it unmounts, died, or refuses), this
    /// node asks for a new slot, as before.
    fn take_home_slot_back(&self, record: &FsRecord) -> Option<u32> {
        let me = &self.cluster.node_name;
        let h = record
            .slot_holders
            .iter()
            .find(|h| h.home.as_ref() == Some(me) && &h.node != me && self.holder_serving(h))?;
        let (number, address, _) = self.target_of(&h.node)?;
        let channel = self
            .member
            .metanode_channel(number, address, record.name.clone(), h.slot);
        use tessera_fs::MetanodeChannel;
        let given = channel
            .call(tessera_fs::SlotHandBack::request())
            .and_then(|reply| tessera_fs::Fence::check(&reply));
        match given {
            Ok(()) => {
                tracing::info!(
                    "{}: node {} gave owner slot {} back to this node",
                    record.name,
                    h.node,
                    h.slot
                );
                Some(h.slot)
            }
            Err(e) => {
                tracing::warn!(
                    "{}: node {} did not give owner slot {} back ({e}); asking for a new slot",
                    record.name,
                    h.node,
                    h.slot
                );
                None
            }
        }
    }

    /// The record of `fs` once this node has applied the change that names it the holder of
    /// `slot` (made by the node that gave it back), waiting a bounded time for it.
    fn wait_to_hold(&self, fs: &str, slot: u32) -> Result<FsRecord> {
        let me = &self.cluster.node_name;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let record = self.file_systems()?.require(fs)?.clone();
            let held = record
                .slot_holders
                .iter()
                .any(|h| h.slot == slot && &h.node == me);
            if held || std::time::Instant::now() >= deadline {
                return Ok(record);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Gives owner slot `slot` of `fs`, which this node took over, back to node `to` (its
    /// number and live incarnation, as the transport vouched for them), the node it was
    /// made for, which mounts again: this node stops serving it (requests in flight finish,
    /// later ones go looking for the holder), checkpoints and lets its mount go, then names
    /// `to` the holder in the table. Between the two, requests wait for the holder; if
    /// `to` dies before it mounts the slot, the first node that needs it takes it over.
    pub(super) fn give_slot_back(&self, fs: &str, slot: u32, to: (u32, u64)) -> Result<()> {
        let _one = self.takeover.lock();
        let me = self.cluster.node_name.clone();
        let state = self.member.state();
        let Some(home) = state
            .nodes
            .values()
            .find(|n| n.number == to.0)
            .map(|n| n.name.clone())
        else {
            bail!("node {} is not in the cluster", to.0);
        };
        if state.incarnations.get(&to.0) != Some(&to.1) {
            bail!(
                "node {home} asked in incarnation {}, which is not live",
                to.1
            );
        }
        drop(state);
        let record = self.file_systems()?.require(fs)?.clone();
        let recorded = record.slot_holders.iter().find(|h| h.slot == slot);
        if !recorded.is_some_and(|h| h.node == me && h.home.as_ref() == Some(&home)) {
            bail!(
                "owner slot {slot} of {fs} is not held by node {me} for node {home} (see \
                 `tessera mount ls {fs} -L`)"
            );
        }
        let Some(mount) = self.taken_slots.lock().remove(&(fs.to_string(), slot)) else {
            bail!("node {me} serves owner slot {slot} of {fs} as its own, not taken over");
        };
        match mount.let_go() {
            Ok(()) => {}
            // Nothing is lost: the log holds what the checkpoint would have written, and
            // the next mount of the slot replays it.
            Err(e) => tracing::warn!(
                "{fs}: owner slot {slot}: the final checkpoint before giving it back failed \
                 ({e}); its next mount replays its log"
            ),
        }
        mount.fence();
        let named = self.change_fs_record(fs, &|rec| {
            let Some(h) = rec.slot_holders.iter_mut().find(|h| h.slot == slot) else {
                bail!("owner slot {slot} of {fs} is no longer in the table");
            };
            if h.node != me {
                bail!(
                    "owner slot {slot} of {fs} was taken by node {} meanwhile",
                    h.node
                );
            }
            h.node = home.clone();
            h.incarnation = Some(to.1);
            Ok(())
        });
        if let Err(e) = named {
            // Not served here any more: released, for the first node that needs it.
            let _ = self.change_fs_record(fs, &|rec| {
                for h in rec.slot_holders.iter_mut() {
                    if h.slot == slot && h.node == me {
                        h.incarnation = None;
                    }
                }
                Ok(())
            });
            return Err(e);
        }
        tracing::info!("{fs}: owner slot {slot} given back to node {home}, which it was made for");
        Ok(())
    }

    /// How a mount of `fs_name` reaches the owners of other slots: a channel that follows
    /// each slot's holder (and takes the slot over when its holder is gone).
    pub(super) fn slot_router(
        &self,
        fs_name: &str,
    ) -> Box<dyn Fn(u32) -> Option<Box<dyn tessera_fs::MetanodeChannel>> + Send + Sync> {
        let daemon = self.this.clone();
        let fs_name = fs_name.to_string();
        Box::new(move |slot| {
            let d = daemon.upgrade()?;
            // Not known yet (no holder serving, and this node could not take it over now):
            // the channel's first send looks for it again, within its bounded wait.
            let target = match d.locate_slot_holder(&fs_name, slot) {
                Ok(Some(target)) => target,
                Ok(None) => (0, String::new(), None),
                Err(e) => {
                    tracing::warn!("{fs_name}: owner slot {slot}: {e:#}");
                    (0, String::new(), None)
                }
            };
            Some(Box::new(d.following_channel(&fs_name, slot, target))
                as Box<dyn tessera_fs::MetanodeChannel>)
        })
    }

    /// A channel to metanode `slot` of `fs` (0: the file system manager) that starts at
    /// `target` and follows it as it moves.
    pub(super) fn following_channel(
        &self,
        fs: &str,
        slot: u32,
        target: OwnerTarget,
    ) -> FollowingChannel {
        FollowingChannel {
            daemon: self.this.clone(),
            fs: fs.to_string(),
            slot,
            target: parking_lot::Mutex::new(target),
            moves: std::sync::atomic::AtomicU64::new(0),
            suspect: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Where owner slot `slot` of `fs` is served now: by its recorded holder while the
    /// incarnation that claimed it is live; otherwise by this node, which takes it over
    /// (`None` while this node's own mount is claiming it, or while this node holds no
    /// disk lease: then it may not serve anything).
    pub(super) fn locate_slot_holder(&self, fs: &str, slot: u32) -> Result<Option<OwnerTarget>> {
        if self.slot_server(fs, slot).is_some() {
            return Ok(Some(self.own_target()));
        }
        let record = self.file_systems()?.require(fs)?.clone();
        if let Some(h) = record.slot_holders.iter().find(|h| h.slot == slot) {
            if self.holder_serving(h) {
                if h.node == self.cluster.node_name {
                    return Ok(None);
                }
                let state = self.member.state();
                return Ok(state
                    .nodes
                    .values()
                    .find(|n| n.name == h.node)
                    .map(|n| (n.number, n.address.clone(), h.incarnation)));
            }
        }
        if !self.member.holds_lease() {
            return Ok(None);
        }
        // A node unmounting the file system (its final commits at the slots, after a
        // peer's unmount released its slot) takes nothing over: it would serve a slot with
        // no mount of its own left to reach the manager through, and the slot's final
        // checkpoint would wait a minute for a manager that is gone.
        if self.is_unmounting(fs) {
            bail!(
                "owner slot {slot} of {fs} is not served (its holder let it go or died) and \
                 this node is unmounting {fs}, so it does not take the slot over"
            );
        }
        if let Some(found) = self.damaged_slot(fs, slot) {
            return Err(anyhow::Error::new(DamagedSlot(found)));
        }
        self.take_over_slot(&record, slot)?;
        Ok(Some(self.own_target()))
    }

    /// What a takeover of slot `slot` of `fs` found damaged, while that is recent (see
    /// [`DAMAGED_RECHECK`]).
    pub(super) fn damaged_slot(&self, fs: &str, slot: u32) -> Option<String> {
        let mut damaged = self.damaged_slots.lock();
        let key = (fs.to_string(), slot);
        match damaged.get(&key) {
            Some((found, at)) if at.elapsed() < DAMAGED_RECHECK => Some(found.clone()),
            Some(_) => {
                damaged.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Marks metanode `slot` of `fs` (0: the file system manager's) as found damaged by a
    /// takeover (`found`): see [`Daemon::damaged_slot`].
    pub(super) fn mark_damaged(&self, fs: &str, slot: u32, found: &anyhow::Error) {
        self.damaged_slots.lock().insert(
            (fs.to_string(), slot),
            (format!("{found:#}"), Instant::now()),
        );
    }

    /// Forgets the slots of `fs` found damaged (its unmount on this node: the repair
    /// needs it unmounted everywhere, and the next mount tries afresh).
    pub(super) fn forget_damaged_slots(&self, fs: &str) {
        self.damaged_slots.lock().retain(|(name, _), _| name != fs);
    }

    /// Takes owner slot `slot` of `record` over from a holder that no longer serves it:
    /// this node becomes its holder in the table (compare-and-set: of two nodes that try at
    /// once, one wins and the other follows it), replays the slot's log in a mount of its
    /// own (no FUSE: this node's kernel reaches it as every other node does), fences every
    /// node that mounts the file system, and serves.
    fn take_over_slot(&self, record: &FsRecord, slot: u32) -> Result<()> {
        let _one = self.takeover.lock();
        if self.slot_server(&record.name, slot).is_some() {
            return Ok(());
        }
        let me = self.cluster.node_name.clone();
        let incarnation = self
            .incarnation()
            .ok_or_else(|| anyhow!("this node is not a live member of the cluster"))?;
        let previous = parking_lot::Mutex::new(None);
        self.change_fs_record(&record.name, &|rec| {
            match rec.slot_holders.iter_mut().find(|h| h.slot == slot) {
                Some(h) if self.holder_serving(h) => bail!(
                    "owner slot {slot} of {} is held by live node {}; following it",
                    rec.name,
                    h.node
                ),
                Some(h) => {
                    *previous.lock() = Some(h.node.clone());
                    h.node = me.clone();
                    h.incarnation = Some(incarnation);
                }
                None => rec.slot_holders.push(SlotHolder {
                    node: me.clone(),
                    slot,
                    incarnation: Some(incarnation),
                    home: None,
                }),
            }
            Ok(())
        })?;
        let previous = previous.lock().clone().unwrap_or_else(|| "none".into());
        tracing::warn!(
            "{}: taking over owner slot {slot} from node {previous}, which no longer serves \
             it; replaying its log",
            record.name
        );
        let started = std::time::Instant::now();
        let fs = match self.mount_taken_slot(record, slot) {
            Ok(fs) => fs,
            Err(e) => {
                if e.downcast_ref::<DamagedSlot>().is_some() {
                    tracing::error!(
                        "{}: owner slot {slot} cannot be taken over: {e:#}. Its files and \
                         directories answer EIO until it is repaired; the rest of {} stays \
                         in service. To repair: `tessera umount {} -a`, `tessera fsck {} -y`, \
                         then mount again (tried again here in {} s)",
                        record.name,
                        record.name,
                        record.name,
                        record.name,
                        DAMAGED_RECHECK.as_secs()
                    );
                    self.mark_damaged(&record.name, slot, &e);
                } else {
                    tracing::error!(
                        "{}: takeover of owner slot {slot} failed: {e:#}",
                        record.name
                    );
                }
                let _ = self.change_fs_record(&record.name, &|rec| {
                    for h in rec.slot_holders.iter_mut() {
                        if h.slot == slot && h.node == me {
                            h.incarnation = None;
                        }
                    }
                    Ok(())
                });
                return Err(e);
            }
        };
        self.fence_clients(record, &fs, slot);
        self.taken_slots
            .lock()
            .insert((record.name.clone(), slot), fs);
        tracing::info!(
            "{}: this node serves owner slot {slot} now (taken over in {:?})",
            record.name,
            started.elapsed()
        );
        Ok(())
    }

    /// Mounts owner slot `slot` of `record` beside this node's own mount: it reaches the
    /// file system manager and the other slots as this node's mount does.
    fn mount_taken_slot(&self, record: &FsRecord, slot: u32) -> Result<Arc<FileSystem>> {
        let nsds = self.nsds()?;
        let (available, _) = self.open_disks(record, &nsds)?;
        if available.len() < record.nsds.len() {
            bail!(
                "this node reaches {} of the {} NSDs of {}; a slot's owner must reach every \
                 disk",
                available.len(),
                record.nsds.len(),
                record.name
            );
        }
        let fs = FileSystem::mount_slot(available, slot).map_err(|e| match e {
            tessera_fs::FsError::Corrupt(found) => anyhow::Error::new(DamagedSlot(format!(
                "file system {}: owner slot {slot}: damaged metadata: {found}",
                record.name
            ))),
            e => anyhow!("file system {}: owner slot {slot}: {e}", record.name),
        })?;
        let manager = self
            .locate_manager_target(record)
            .unwrap_or((0, String::new(), None));
        fs.route_metadata_through(Box::new(self.following_channel(&record.name, 0, manager)));
        self.configure_owner(&fs, record, &nsds)?;
        fs.route_slots_through(self.slot_router(&record.name));
        Ok(fs)
    }

    /// The file system manager's node as the table names it, if it is a member.
    fn locate_manager_target(&self, record: &FsRecord) -> Option<OwnerTarget> {
        let owner = record
            .mounted
            .then_some(record.mounted_on.as_deref())
            .flatten()?;
        self.target_of(owner)
    }

    /// Node `name` as a metanode's target: its number, daemon address and incarnation now
    /// (`None` if it is not in the configuration).
    pub(super) fn target_of(&self, name: &str) -> Option<OwnerTarget> {
        let state = self.member.state();
        state.nodes.values().find(|n| n.name == name).map(|n| {
            (
                n.number,
                n.address.clone(),
                state.incarnations.get(&n.number).copied(),
            )
        })
    }

    /// At the unmount of `fs` on this node: the slots it took over from other nodes are
    /// checkpointed and let go, and every slot the table records for this node is
    /// released, so that another node takes over what it served (its own slot stays
    /// recorded for it, to claim again at its next mount if nobody took it meanwhile).
    pub(super) fn release_slots(&self, fs: &str) {
        self.forget_damaged_slots(fs);
        let taken: Vec<(u32, Arc<FileSystem>)> = {
            let mut taken = self.taken_slots.lock();
            let slots: Vec<u32> = taken
                .keys()
                .filter(|(name, _)| name == fs)
                .map(|(_, s)| *s)
                .collect();
            slots
                .into_iter()
                .filter_map(|s| taken.remove(&(fs.to_string(), s)).map(|f| (s, f)))
                .collect()
        };
        for (slot, mount) in taken {
            match mount.let_go() {
                Ok(()) => tracing::info!("{fs}: owner slot {slot} checkpointed and let go"),
                Err(e) => tracing::error!(
                    "{fs}: owner slot {slot}: the final checkpoint failed ({e}); the next \
                     holder replays its log"
                ),
            }
        }
        let me = self.cluster.node_name.clone();
        let holds = self.file_systems().ok().is_some_and(|fss| {
            fss.file_systems.iter().any(|r| {
                r.name == fs
                    && r.slot_holders
                        .iter()
                        .any(|h| h.node == me && h.incarnation.is_some())
            })
        });
        if !holds {
            return;
        }
        let released = self.change_fs_record(fs, &|rec| {
            for h in rec.slot_holders.iter_mut().filter(|h| h.node == me) {
                h.incarnation = None;
            }
            Ok(())
        });
        if let Err(e) = released {
            tracing::warn!("{fs}: releasing this node's owner slots in the table: {e:#}");
        }
    }
}
