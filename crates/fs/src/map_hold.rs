//! Allocation-map regions moved while other nodes' owner slots write their own chunks of
//! them (`restripe -m`, `disk delete` of a disk that stores other disks' maps, `restripe
//! -r` with a map copy on a down disk).
//!
//! A map region holds one chunk (two alternating 4 KiB copies) per allocation region of its
//! disk, and the owner of each allocation region writes that region's chunk at its own
//! checkpoints: the file system manager its own, each owner slot the ones the owner map
//! gives it. The manager cannot rewrite a slot's chunks from its memory (it holds a slot's
//! regions as used, not as the slot has them), so it copies the region's bytes instead,
//! while no slot writes there:
//!
//! ```text
//!   manager                                   each slot in use
//!   HoldMapWrites{hold, id} ───────────────►  no chunk write starts; one in flight ends
//!                           ◄─────────────── Done
//!   new regions allocated, old bytes copied
//!   HoldMapWrites{hold, id} (confirm) ─────►  still held under `id` (not remounted)?
//!   descriptor naming the new regions (the commit point)
//!   HoldMapWrites{release, id} ────────────►  reads the descriptor from disk, takes its
//!                           ◄─────────────── map regions, chunk writes go on there
//! ```
//!
//! The copy is byte for byte, both copies of every chunk, so each owner's record and
//! digest name the same chunk generations in the new region as in the old one; nothing is
//! re-encoded. A crash of the manager before the descriptor is durable leaves the old
//! regions valid, written by nobody meanwhile; after it, the new ones. A slot is released
//! only by the manager that held it, or when a new manager fences it (a manager that
//! died): either way it reads the descriptor from disk first, which is then final, so it
//! never writes a chunk where the durable descriptor does not put it. A slot whose owner
//! remounted while held lost the hold; the confirm finds that out before the commit, and
//! the move fails with the old regions still in place. A slot's checkpoint that reaches its
//! chunk writes while held waits, holding its metadata lock (the slot's metadata changes
//! pause for the copy, a few milliseconds); the release takes no lock the waiting
//! checkpoint holds.

use parking_lot::{Condvar, Mutex};

use crate::alloc_map::MapRegion;
use crate::error::{FsError, FsResult};
use crate::fs::FileSystem;
use tessera_alloc::DiskIndex;

/// Bytes copied per read and write when a map region moves.
const COPY_BYTES: u64 = 1 << 20;

/// A slot's hold on its chunk writes ([`FileSystem::hold_own_map_writes`]).
#[derive(Default)]
pub(crate) struct MapWriteHold {
    state: Mutex<HoldState>,
    changed: Condvar,
}

#[derive(Default)]
struct HoldState {
    /// The manager's id of the move holding the writes, if one does.
    held: Option<u64>,
    /// Checkpoints between the hold's gate and the end of their chunk writes.
    writing: u32,
}

/// One checkpoint's passage through the gate: chunk writes may go on until it is dropped.
pub(crate) struct ChunkWrites<'a>(Option<&'a MapWriteHold>);

impl Drop for ChunkWrites<'_> {
    fn drop(&mut self) {
        if let Some(hold) = self.0 {
            let mut s = hold.state.lock();
            s.writing -= 1;
            hold.changed.notify_all();
        }
    }
}

impl MapWriteHold {
    /// Waits while a move holds the chunk writes, then counts this checkpoint's writes
    /// until the guard is dropped. Read the map regions from the descriptor only after it.
    pub(crate) fn enter(&self) -> ChunkWrites<'_> {
        let mut s = self.state.lock();
        while s.held.is_some() {
            self.changed.wait(&mut s);
        }
        s.writing += 1;
        ChunkWrites(Some(self))
    }
}

impl ChunkWrites<'_> {
    /// No hold to pass: the file system manager's own checkpoints (it moves the regions
    /// under its own checkpoint lock).
    pub(crate) fn none() -> ChunkWrites<'static> {
        ChunkWrites(None)
    }
}

impl FileSystem {
    /// The gate a slot's checkpoint passes before it reads where the map regions are and
    /// writes its chunks there.
    pub(crate) fn enter_chunk_writes(&self) -> ChunkWrites<'_> {
        match &self.owner().slot {
            Some(slot) => slot.map_hold.enter(),
            None => ChunkWrites::none(),
        }
    }

    /// `Namespace::hold_map_writes` on an owner slot's owner: with `hold`, no chunk
    /// write of this slot starts until the release of move `id`, and the answer waits for
    /// the one in flight (asked again under the same id, it confirms the hold still stands);
    /// without, the slot takes the map regions of the descriptor on disk and writes there
    /// (a release of a hold that is not `id`'s changes nothing).
    pub fn hold_own_map_writes(&self, hold: bool, id: u64) -> FsResult<()> {
        self.owner_here("holding allocation-map writes")?;
        let Some(slot) = &self.owner().slot else {
            return Err(FsError::Invalid(
                "the file system manager's own map writes are not held by request".into(),
            ));
        };
        let gate = &slot.map_hold;
        let mut s = gate.state.lock();
        if !hold {
            if s.held != Some(id) {
                return Ok(());
            }
            drop(s);
            return self.release_map_hold(gate);
        }
        match s.held {
            Some(held) if held == id => return Ok(()),
            Some(held) => {
                return Err(FsError::Usage(format!(
                    "owner slot {}: another move of allocation-map regions ({held:x}) holds \
                     its map writes; run the command again once it ends",
                    self.owner_slot()
                )))
            }
            None => {}
        }
        s.held = Some(id);
        while s.writing > 0 {
            gate.changed.wait(&mut s);
        }
        tracing::info!(
            "{}: owner slot {}: allocation-map writes held for a move of map regions ({id:x})",
            self.geo.fs_name,
            self.owner_slot()
        );
        Ok(())
    }

    /// A new file system manager fenced this slot's clients of the old one: a hold the old
    /// manager left is released (the descriptor on disk is final, since the old manager
    /// can no longer write it).
    pub(crate) fn release_map_hold_of_a_gone_manager(&self) {
        let Some(slot) = self.owner.as_ref().and_then(|o| o.slot.as_ref()) else {
            return;
        };
        if slot.map_hold.state.lock().held.is_none() {
            return;
        }
        if let Err(e) = self.release_map_hold(&slot.map_hold) {
            tracing::error!(
                "{}: owner slot {}: the map writes held by a manager that is gone stay held: \
                 {e}; unmount and mount the file system on this node",
                self.geo.fs_name,
                self.owner_slot()
            );
        }
    }

    /// Takes the map regions of the descriptor on disk, then lets chunk writes go on.
    /// Takes no metadata or checkpoint lock: a checkpoint waiting at the gate holds them.
    fn release_map_hold(&self, gate: &MapWriteHold) -> FsResult<()> {
        let newest = crate::descriptor::read_descriptor(&self.devices.all())?;
        {
            let mut desc = self.owner().desc.lock();
            if let (Some(mine), Some(theirs)) = (&mut desc.alloc_map, &newest.alloc_map) {
                mine.regions = theirs.regions.clone();
            }
            if let (Some(mine), Some(theirs)) = (&mut desc.metadata_copies, &newest.metadata_copies)
            {
                mine.map_regions = theirs.map_regions.clone();
            }
        }
        let mut s = gate.state.lock();
        s.held = None;
        gate.changed.notify_all();
        tracing::info!(
            "{}: owner slot {}: allocation-map writes go on, in the regions of descriptor \
             generation {}",
            self.geo.fs_name,
            self.owner_slot(),
            newest.generation
        );
        Ok(())
    }

    /// `Namespace::hold_map_writes` asked of the owner of `slot`.
    fn tell_slot_hold(&self, slot: u32, hold: bool, id: u64) -> FsResult<()> {
        match self.slot_namespace(slot) {
            Some(ns) => ns.hold_map_writes(hold, id),
            None => Err(FsError::Usage(format!(
                "owner slot {slot} has no owner this node can reach; mount the file system \
                 on its node and run the command again"
            ))),
        }
    }

    /// On the file system manager: holds the chunk writes of every owner slot in use
    /// (see the module doc); `Ok(None)` when no slot holds an allocation region, so that
    /// nothing is held. On failure every slot held so far is released.
    pub(crate) fn hold_slots_map_writes(&self) -> FsResult<Option<(u64, Vec<u32>)>> {
        let desc = self.owner().desc.lock().clone();
        if crate::slot::foreign_regions(&desc).is_empty() {
            return Ok(None);
        }
        let id = rand::random::<u64>() | 1;
        let mut held = Vec::new();
        for slot in self.slots_beside_the_manager(&desc) {
            if !crate::slot::slot_in_use(&desc, slot) {
                continue;
            }
            if let Err(e) = self.tell_slot_hold(slot, true, id) {
                self.release_slots_map_writes(id, &held);
                return Err(FsError::Usage(format!(
                    "owner slot {slot} could not hold its allocation-map writes for the move \
                     of map regions: {e}"
                )));
            }
            held.push(slot);
        }
        Ok(Some((id, held)))
    }

    /// Checks that every slot in `held` still holds its chunk writes under `id` (its owner
    /// did not remount or move meanwhile).
    pub(crate) fn confirm_slots_map_writes_held(&self, id: u64, held: &[u32]) -> FsResult<()> {
        for &slot in held {
            self.tell_slot_hold(slot, true, id).map_err(|e| {
                FsError::Usage(format!(
                    "owner slot {slot} no longer holds its allocation-map writes ({e}); the map \
                     regions stay where they were: run the command again"
                ))
            })?;
        }
        Ok(())
    }

    /// Releases the slots in `held` (each takes the map regions of the descriptor on disk).
    /// A slot that cannot be told is named in the log: it is released when a manager
    /// fences it, or at its owner's next mount.
    pub(crate) fn release_slots_map_writes(&self, id: u64, held: &[u32]) {
        for &slot in held {
            if let Err(e) = self.tell_slot_hold(slot, false, id) {
                tracing::error!(
                    "{}: owner slot {slot} could not be told to write its allocation-map \
                     chunks again: {e}; it waits until a file system manager fences it or its \
                     owner mounts again",
                    self.geo.fs_name
                );
            }
        }
    }

    /// Copies each region of `old` to the region of the same disk and copy in `new` byte for
    /// byte, reading a region whose disk is down from its disk's other map copy (`sources`:
    /// every region of the descriptor before the move), then flushes the disks written.
    pub(crate) fn copy_map_regions(
        &self,
        old: &[MapRegion],
        new: &[MapRegion],
        sources: &[MapRegion],
    ) -> FsResult<()> {
        let mut written: Vec<DiskIndex> = Vec::new();
        for (from, to) in old.iter().zip(new) {
            assert_eq!(
                from.disk, to.disk,
                "a map region moves within its disk's map"
            );
            assert!(to.bytes >= from.bytes, "a map region moves to one as large");
            let readable = |r: &&MapRegion| r.disk == from.disk && !self.devices.is_down(r.on_disk);
            let source = std::iter::once(from)
                .chain(sources.iter())
                .find(readable)
                .ok_or_else(|| {
                    FsError::Io(std::io::Error::other(format!(
                        "the allocation map of {} has no copy on a disk that is up, and owner \
                         slots hold chunks of it that only they know; start the disk holding \
                         it (disk change start) and run the command again",
                        self.devices.name(from.disk)
                    )))
                })?;
            let mut at = 0;
            while at < from.bytes {
                let n = COPY_BYTES.min(from.bytes - at);
                let mut buf = tessera_drive::AlignedBuf::zeroed(n as usize);
                self.devices
                    .get(source.on_disk)
                    .read_at(&mut buf, source.offset + at)?;
                self.devices
                    .get(to.on_disk)
                    .write_at(&buf, to.offset + at)?;
                at += n;
            }
            if !written.contains(&to.on_disk) {
                written.push(to.on_disk);
            }
        }
        for disk in written {
            self.devices.get(disk).flush()?;
        }
        Ok(())
    }
}
