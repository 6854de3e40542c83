//! An owner slot's region (its records and log) moved to other blocks while its owner
//! writes there: `disk delete` and `restripe -m` of the disk it lies on, `restripe -r` with
//! it on a down disk.
//!
//! The slot's owner writes records and log records into its region at any time, so the
//! file system manager cannot copy the region under it; and a slot's owner mounts from the
//! descriptor alone, so the descriptor cannot be what commits the move (an owner mounting
//! just before that commit would go on writing the old place). The commit point is the
//! slot's own: a *forward record* in the old region, written by the owner under its
//! metadata and checkpoint locks, that sends every reader of the slot's records to the new
//! region:
//!
//! ```text
//!   manager                                   the slot's owner
//!   new region allocated, reserved in the
//!   descriptor (`slot_moves`), committed
//!   MoveSlotRegion{to} ─────────────────────► metadata and checkpoint locks taken;
//!                                             checkpoint (record g, old region);
//!                                             log formatted at `to`, its LSNs going on,
//!                                             record g+1 at `to`, flushed;
//!                                             forward g+1 in the old region (commit point);
//!                                             records and log written at `to` from now
//!                          ◄───────────────── moved
//!   descriptor naming `to` as the slot's region (the reservation dropped); the old blocks
//!   freed once it is durable
//! ```
//!
//! Whatever stops where: before the forward lands the old region is the slot's (its record
//! g is the newest there, nothing was written after it), and the reserved blocks are only
//! reserved; after it, every mount of the slot and every reader of its records (fsck, the
//! manager's hand-over checks) follows the forward to `to`, which holds the record and an
//! empty log continuing the LSNs. A reservation a manager leaves (it died, or the slot did
//! not answer) stays in the descriptor until a later `disk delete` or restripe settles it:
//! it asks the slot again (a slot already at `to` answers at once), and when the owner
//! cannot do it, asks it to give the move up; a slot that gave a move up refuses it from
//! then on, so a late request can never write a forward the manager no longer reserves.
//! Only when the owner cannot be reached at all does the reservation stay, with the error.
//!
//! The forward record is written through (FUA) into the half of its generation's parity,
//! as every slot record; little endian:
//!
//! ```text
//! 0        8         12       16          24       28       32              48
//! +--------+---------+--------+-----------+--------+--------+---------------+
//! | magic  | version | slot   | generation| length | crc32c | fs uuid       |
//! |TSRSLOTF| u32 = 1 | u32    | u64       | u32=32 | u32    | 16 bytes      |
//! +--------+---------+--------+-----------+--------+--------+---------------+
//! 48       52       56         64                80       84       88         96
//! +--------+--------+----------+-----------------+--------+--------+----------+
//! | disk   | zero   | offset   | log id          | disk 2 | zero   | offset 2 |
//! | u32    | u32    | u64      | 16 bytes        | u32    | u32    | u64      |
//! +--------+--------+----------+-----------------+--------+--------+----------+
//! ```
//!
//! The length is 32 for a region with one copy (the body ends at byte 80) and 48 for a
//! region with two (`-m 2`). The crc covers the header and the body with its own four bytes
//! taken as zero; the rest of the record's sectors is zero.
//!
//! A region with two copies moves with both: the new log is a `MirroredLog` over the new
//! copies, formatted on both, and the record there must land on both, or the move is given
//! up before anything is forwarded. The forward goes to every current copy of the old
//! region; a copy that misses it would still name the old region as the slot's, so it is
//! called behind in the descriptor (through the manager, `RecordSlotLog`) before the slot
//! writes anything at the new place, and a copy called behind is never read alone.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tessera_alloc::DiskIndex;
use tessera_drive::AlignedBuf;

use crate::descriptor::FsDescriptor;
use crate::disk_set::DiskSet;
use crate::error::{FsError, FsResult};
use crate::fs::FileSystem;
use crate::slot::{SlotRecord, SlotRegion};

pub const FORWARD_MAGIC: [u8; 8] = *b"TSRSLOTF";
pub const FORWARD_VERSION: u32 = 1;
const HEADER_BYTES: usize = 48;
/// The body of a forward to a region with one copy.
const BODY_BYTES: usize = 32;
/// The body of a forward to a region with two copies (`-m 2`).
const BODY_BYTES_TWO_COPIES: usize = 48;

/// A slot record that says the slot's records and log moved to another region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotForward {
    pub slot: u32,
    /// Above the generation of every record in the region it is written to.
    pub generation: u64,
    pub disk: u16,
    /// Byte offset of the new region's record A on `disk`.
    pub offset: u64,
    /// The id the new region's log was formatted with.
    pub log_id: [u8; 16],
    /// (disk, byte offset of record A) of the new region's second copy, with `-m 2`.
    pub second: Option<(u16, u64)>,
}

impl SlotForward {
    /// The region it forwards to, as large as `from`, the region it lies in.
    pub fn target(&self, from: &SlotRegion) -> SlotRegion {
        SlotRegion {
            slot: from.slot,
            disk: self.disk,
            offset: self.offset,
            bytes: from.bytes,
            record_bytes: from.record_bytes,
            log_id: self.log_id,
            second: self
                .second
                .map(|(disk, offset)| crate::slot::SlotSecondCopy {
                    disk,
                    offset,
                    log_behind: None,
                }),
        }
    }

    /// The record as it is stored, `record_bytes` long.
    pub fn encode(&self, fs_uuid: &[u8; 16], record_bytes: u32) -> AlignedBuf {
        let body = match self.second {
            None => BODY_BYTES,
            Some(_) => BODY_BYTES_TWO_COPIES,
        };
        assert!(HEADER_BYTES + body <= record_bytes as usize);
        let mut buf = AlignedBuf::zeroed(record_bytes as usize);
        buf[0..8].copy_from_slice(&FORWARD_MAGIC);
        buf[8..12].copy_from_slice(&FORWARD_VERSION.to_le_bytes());
        buf[12..16].copy_from_slice(&self.slot.to_le_bytes());
        buf[16..24].copy_from_slice(&self.generation.to_le_bytes());
        buf[24..28].copy_from_slice(&(body as u32).to_le_bytes());
        buf[32..48].copy_from_slice(fs_uuid);
        buf[48..52].copy_from_slice(&u32::from(self.disk).to_le_bytes());
        buf[56..64].copy_from_slice(&self.offset.to_le_bytes());
        buf[64..80].copy_from_slice(&self.log_id);
        if let Some((disk, offset)) = self.second {
            buf[80..84].copy_from_slice(&u32::from(disk).to_le_bytes());
            buf[88..96].copy_from_slice(&offset.to_le_bytes());
        }
        let crc = crc32c::crc32c(&buf[..HEADER_BYTES + body]);
        buf[28..32].copy_from_slice(&crc.to_le_bytes());
        buf
    }

    /// Reads a forward of `slot` of the file system `fs_uuid` from its stored bytes (which
    /// start with [`FORWARD_MAGIC`]); an error says what is wrong with one that is damaged
    /// or belongs elsewhere.
    pub fn decode(bytes: &[u8], fs_uuid: &[u8; 16], slot: u32) -> Result<SlotForward, String> {
        let le_u32 = |b: &[u8]| u32::from_le_bytes(b[..4].try_into().unwrap());
        let le_u64 = |b: &[u8]| u64::from_le_bytes(b[..8].try_into().unwrap());
        if bytes.len() < HEADER_BYTES + BODY_BYTES || bytes[0..8] != FORWARD_MAGIC {
            return Err("not a forward record".into());
        }
        let version = le_u32(&bytes[8..]);
        if version != FORWARD_VERSION {
            return Err(format!(
                "forward record version {version}, this Tessera reads version {FORWARD_VERSION}"
            ));
        }
        let body = le_u32(&bytes[24..]) as usize;
        if body != BODY_BYTES && body != BODY_BYTES_TWO_COPIES {
            return Err(format!(
                "forward record body length {body} (not {BODY_BYTES} or \
                 {BODY_BYTES_TWO_COPIES})"
            ));
        }
        if bytes.len() < HEADER_BYTES + body {
            return Err("forward record cut short".into());
        }
        crate::slot::verify_header(bytes, body, fs_uuid, slot, "forward record")?;
        let disk_at = |at: usize| {
            let disk = le_u32(&bytes[at..]);
            if le_u32(&bytes[at + 4..]) != 0 {
                return Err("forward record: reserved bytes not zero".to_string());
            }
            u16::try_from(disk).map_err(|_| format!("forward to disk {disk}"))
        };
        let second = match body {
            BODY_BYTES_TWO_COPIES => Some((disk_at(80)?, le_u64(&bytes[88..]))),
            _ => None,
        };
        Ok(SlotForward {
            slot,
            generation: le_u64(&bytes[16..]),
            disk: disk_at(48)?,
            offset: le_u64(&bytes[56..]),
            log_id: bytes[64..80].try_into().unwrap(),
            second,
        })
    }
}

/// Writes `forward` through (FUA) into the half of its generation's parity of every copy
/// of `from` whose disk is up, except copy `behind` (which the descriptor calls behind: it
/// is never read while that holds). At least one must take it; returns the copies that did
/// not, with why.
fn write_forward(
    desc: &FsDescriptor,
    disks: &DiskSet,
    from: &SlotRegion,
    forward: &SlotForward,
    behind: Option<u8>,
) -> FsResult<Vec<(u8, String)>> {
    let buf = forward.encode(&desc.fs_uuid, from.record_bytes);
    let half = (forward.generation % 2) * u64::from(from.record_bytes);
    let mut written = 0;
    let mut last_err = None;
    let mut missed = Vec::new();
    for (c, (disk, offset)) in from.copies().into_iter().enumerate() {
        let c = c as u8;
        if behind == Some(c) {
            continue;
        }
        if disks.is_down(disk) {
            missed.push((c, format!("{} is down", disks.name(disk))));
            continue;
        }
        match disks.get(disk).write_fua(&buf, offset + half) {
            Ok(()) => written += 1,
            Err(e) => {
                missed.push((c, format!("writing the forward record failed: {e}")));
                last_err = Some(e);
            }
        }
    }
    match (written, last_err) {
        (0, Some(e)) => Err(FsError::Io(e)),
        (0, None) => Err(FsError::Usage(format!(
            "no current copy of owner slot {} of {} is on a disk that is up",
            from.slot, desc.name
        ))),
        _ => Ok(missed),
    }
}

impl FileSystem {
    /// `Namespace::move_slot_region` on the owner of a slot other than 0: moves its records
    /// and log to `to`, the region the descriptor on disk reserves for the move (see the
    /// module doc); `Ok(true)` once the slot is there (at once when it already is). With
    /// `give_up`, the move is given up instead unless the slot is there already:
    /// `Ok(false)`, and a later request for it is refused.
    pub fn move_own_region(&self, to: &SlotRegion, give_up: bool) -> FsResult<bool> {
        self.owner_here("moving an owner slot's region")?;
        let Some(slot) = &self.owner().slot else {
            return Err(FsError::Invalid(
                "slot 0's commit point is the descriptor; its log moves with the restripe".into(),
            ));
        };
        let mut m = self.owner().meta.lock();
        let _one = self.owner().checkpoint_lock.lock();
        let from = slot.region.lock().clone();
        if from.same_place(to) {
            return Ok(true);
        }
        if slot.forward_in_doubt.load(Ordering::SeqCst) {
            return Err(FsError::Usage(format!(
                "owner slot {}: a write of the forward record of its region move failed, and \
                 whether it landed only a mount can tell; unmount and mount the file system on \
                 its node, then run the command again",
                slot.number
            )));
        }
        {
            let mut given_up = slot.moves_given_up.lock();
            if give_up {
                given_up.push(to.log_id);
                return Ok(false);
            }
            if given_up.contains(&to.log_id) {
                return Err(FsError::Usage(format!(
                    "owner slot {}: the file system manager gave this move of its region up; \
                     run the command again",
                    slot.number
                )));
            }
        }
        if to.slot != slot.number || to.bytes != from.bytes || to.record_bytes != from.record_bytes
        {
            return Err(FsError::Invalid(format!(
                "owner slot {}: a region of {} bytes ({} per record) cannot take the place of \
                 its region of {} bytes ({} per record)",
                slot.number, to.bytes, to.record_bytes, from.bytes, from.record_bytes,
            )));
        }
        self.check_writable()?;
        let durable = crate::descriptor::read_descriptor(&self.devices.all())?;
        if !durable
            .slot_move(slot.number)
            .is_some_and(|m| m.same_place(to))
        {
            return Err(FsError::Usage(format!(
                "owner slot {}: the descriptor on disk (generation {}) reserves no region at \
                 {} byte {} for it; run the command again",
                slot.number,
                durable.generation,
                self.devices.name(to.disk),
                to.offset
            )));
        }
        // A copy of the new region lacks nothing yet: both are written from here on.
        let mut to = to.clone();
        if let Some(second) = &mut to.second {
            second.log_behind = None;
        }
        let to = &to;
        let lsn = self.checkpoint_for_a_new_log(&mut m)?;
        let desc = self.owner().desc.lock().clone();
        // Every copy formatted and holding its first record, or an error: nothing is
        // forwarded yet, so the old region stays the slot's.
        crate::slot::initialise(&desc, &self.devices, to)?;
        let new_copies = match to.second {
            Some(_) => Some(crate::mirrored_log::MirroredLog::for_slot(
                &desc,
                &self.devices,
                to,
            )?),
            None => None,
        };
        let log_dev: Arc<dyn tessera_drive::BlockDevice> = match &new_copies {
            Some(log) => Arc::clone(log) as Arc<dyn tessera_drive::BlockDevice>,
            None => self.devices.get(to.disk),
        };
        let (journal, records) =
            tessera_journal::Journal::open(log_dev, to.log_region(), to.log_id, lsn)?;
        assert!(records.is_empty(), "a freshly formatted log has no records");
        let mut record = slot.record.lock();
        let next = SlotRecord {
            generation: record.generation + 1,
            replay_from: lsn,
            ..record.clone()
        };
        // On every copy, or the move is given up: a copy of the new region must not be
        // behind before the descriptor can say so.
        let missed = crate::slot::write_record_copies(&desc, &self.devices, to, &next)?;
        if let Some((c, why)) = missed.first() {
            return Err(FsError::Io(std::io::Error::other(format!(
                "owner slot {}: copy {} of the new region did not take its record ({why}); \
                 the slot stays where it was",
                slot.number,
                c + 1
            ))));
        }
        // The log's format and the zeroed halves are plain writes: on stable storage before
        // the forward sends anyone there.
        for (disk, _) in to.copies() {
            self.devices.get(disk).flush()?;
        }
        let forward = SlotForward {
            slot: slot.number,
            generation: next.generation,
            disk: to.disk,
            offset: to.offset,
            log_id: to.log_id,
            second: to.second.map(|s| (s.disk, s.offset)),
        };
        let old_copies = self.owner().log_copies.read().clone();
        let behind = old_copies.as_ref().and_then(|l| l.behind());
        let forwarded =
            write_forward(&desc, &self.devices, &from, &forward, behind).and_then(|missed| {
                // A copy of the old region without the forward still names the old region
                // as the slot's: it is called behind (never read alone) before anything is
                // written at the new place.
                let log = old_copies.as_ref();
                for (c, why) in missed {
                    let log = log.expect("a region with two copies has a mirrored log");
                    log.missed(c, &why).map_err(FsError::Io)?;
                }
                Ok(())
            });
        if let Err(e) = forwarded {
            // It may have landed: only a mount can tell which region is the slot's.
            slot.forward_in_doubt.store(true, Ordering::SeqCst);
            self.stop_checkpoints();
            self.fence_commits();
            return Err(FsError::Corrupt(format!(
                "owner slot {}: writing the forward record of its region move failed ({e}); \
                 whether it landed only a mount can tell: unmount and mount the file system \
                 on this node, then run the command again",
                slot.number
            )));
        }
        *record = next;
        *slot.region.lock() = to.clone();
        if let (Some(log), Some(hook)) = (&new_copies, self.owner().log_hook.get()) {
            log.set_on_behind(Arc::clone(hook));
        }
        *self.owner().log_copies.write() = new_copies;
        self.replace_journal(journal);
        drop(record);
        drop(m);
        tracing::info!(
            "{}: owner slot {}: records and log moved from {} to {} (LSN {lsn})",
            desc.name,
            slot.number,
            self.devices.name(from.disk),
            self.devices.name(to.disk)
        );
        Ok(true)
    }

    /// On the file system manager: moves the region of owner slot `old.slot`, which is in
    /// use, to blocks of metadata disks that `stays` accepts, through its owner (see the
    /// module doc). A move an earlier run reserved is settled first, to its end or given up.
    pub(crate) fn move_live_slot_region(
        &self,
        old: &SlotRegion,
        stays: &dyn Fn(DiskIndex) -> bool,
    ) -> FsResult<()> {
        let reserved = self.owner().desc.lock().slot_move(old.slot).cloned();
        let to = match reserved {
            Some(to) => to,
            None => self.reserve_slot_move(old, stays)?,
        };
        self.settle_slot_move(old.slot, &to)
    }

    /// Allocates the new region of `old.slot` and commits the descriptor reserving it.
    fn reserve_slot_move(
        &self,
        old: &SlotRegion,
        stays: &dyn Fn(DiskIndex) -> bool,
    ) -> FsResult<SlotRegion> {
        let mut m = self.owner().meta.lock();
        let _one = self.owner().checkpoint_lock.lock();
        let desc = self.owner().desc.lock().clone();
        let to =
            self.place_slot_region(&mut m, &desc, old.slot, old.bytes, old.record_bytes, stays)?;
        let mut next = desc;
        next.slot_moves
            .get_or_insert_with(Vec::new)
            .push(to.clone());
        *self.owner().desc.lock() = next;
        self.commit_descriptor_change(
            &mut m,
            false,
            &format!("reserving a new region for owner slot {}", old.slot),
            "unmount and mount the file system again, then run the command again",
        )?;
        Ok(to)
    }

    /// Has the owner of `slot` move to `to`, reserved in the descriptor, and commits the
    /// outcome: `to` as the slot's region, or the reservation dropped when the owner gave
    /// the move up (then the error says why it did not move). Either way the blocks no
    /// longer used are freed after the commit.
    fn settle_slot_move(&self, slot: u32, to: &SlotRegion) -> FsResult<()> {
        let Some(ns) = self.slot_namespace(slot) else {
            return Err(FsError::Usage(format!(
                "owner slot {slot} has no owner this node can reach to move its region; mount \
                 the file system on its node and run the command again"
            )));
        };
        let why = match ns.move_slot_region(to, false) {
            Ok(_) => return self.end_slot_move(slot, true),
            Err(e) => e,
        };
        match ns.move_slot_region(to, true) {
            // The first answer was lost, not the move.
            Ok(true) => self.end_slot_move(slot, true),
            Ok(false) => {
                self.end_slot_move(slot, false)?;
                Err(FsError::Usage(format!(
                    "owner slot {slot} did not move its region ({why}); it stays where it was"
                )))
            }
            Err(e) => Err(FsError::Usage(format!(
                "owner slot {slot} did not move its region ({why}) and could not be asked to \
                 give the move up ({e}); the new region stays reserved until a later disk \
                 delete or restripe settles it: run the command again once its owner answers"
            ))),
        }
    }

    /// Commits the end of `slot`'s reserved move: with `moved`, the reserved region becomes
    /// the slot's and its old one is freed; without, the reserved one is freed.
    fn end_slot_move(&self, slot: u32, moved: bool) -> FsResult<()> {
        let mut m = self.owner().meta.lock();
        let _one = self.owner().checkpoint_lock.lock();
        let desc = self.owner().desc.lock().clone();
        let Some(to) = desc.slot_move(slot).cloned() else {
            return Err(FsError::Usage(format!(
                "the move of owner slot {slot}'s region was settled meanwhile (another disk \
                 delete or restripe?); run the command again"
            )));
        };
        let mut next = desc.clone();
        if let Some(moves) = &mut next.slot_moves {
            moves.retain(|r| r.slot != slot);
        }
        if next.slot_moves.as_ref().is_some_and(|m| m.is_empty()) {
            next.slot_moves = None;
        }
        let freed = if moved {
            let region = next
                .slots
                .iter_mut()
                .flat_map(|s| s.regions.iter_mut())
                .find(|r| r.slot == slot)
                .expect("a moving slot has a region");
            std::mem::replace(region, to.clone()).extents(&desc)
        } else {
            to.extents(&desc)
        };
        *self.owner().desc.lock() = next;
        m.pending_free.extend(freed.into_iter().map(|e| (0, e)));
        self.commit_descriptor_change(
            &mut m,
            false,
            &format!("moving owner slot {slot}"),
            "unmount and mount the file system again, then run the command again",
        )?;
        if moved {
            tracing::info!(
                "{}: owner slot {slot} moved to {} under its owner",
                desc.name,
                self.devices.name(to.disk)
            );
        }
        Ok(())
    }

    /// Settles every move a run before this one reserved and left (see the module doc).
    pub(crate) fn settle_reserved_slot_moves(&self) -> FsResult<()> {
        let moves = self.owner().desc.lock().slot_moves.clone();
        for to in moves.unwrap_or_default() {
            self.settle_slot_move(to.slot, &to)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: [u8; 16] = [7; 16];

    fn sample() -> SlotForward {
        SlotForward {
            slot: 3,
            generation: 0x0102_0304_0506_0709,
            disk: 5,
            offset: 0x1122_3344_5566,
            log_id: [0xab; 16],
            second: None,
        }
    }

    /// A region of slot 3 a forward can lie in: 8 MiB on disk 1, with `second`.
    fn region_of_slot_3(second: Option<crate::slot::SlotSecondCopy>) -> SlotRegion {
        SlotRegion {
            slot: 3,
            disk: 1,
            offset: 1 << 20,
            bytes: 8 << 20,
            record_bytes: 8192,
            log_id: [1; 16],
            second,
        }
    }

    #[test]
    fn a_forward_record_has_the_documented_bytes() {
        let buf = sample().encode(&UUID, 4096);
        assert_eq!(buf.len(), 4096);
        assert_eq!(&buf[0..8], b"TSRSLOTF");
        assert_eq!(buf[8..12], 1u32.to_le_bytes());
        assert_eq!(buf[12..16], 3u32.to_le_bytes());
        assert_eq!(buf[16..24], 0x0102_0304_0506_0709u64.to_le_bytes());
        assert_eq!(buf[24..28], 32u32.to_le_bytes());
        assert_eq!(&buf[32..48], &UUID);
        assert_eq!(buf[48..52], 5u32.to_le_bytes());
        assert_eq!(buf[52..56], [0; 4]);
        assert_eq!(buf[56..64], 0x1122_3344_5566u64.to_le_bytes());
        assert_eq!(&buf[64..80], &[0xab; 16]);
        assert!(buf[80..].iter().all(|b| *b == 0));
        let mut covered = buf[..80].to_vec();
        covered[28..32].fill(0);
        assert_eq!(buf[28..32], crc32c::crc32c(&covered).to_le_bytes());
        assert_eq!(SlotForward::decode(&buf, &UUID, 3), Ok(sample()));
    }

    #[test]
    fn a_forward_to_two_copies_has_the_documented_bytes() {
        let forward = SlotForward {
            second: Some((9, 0x7788_99aa_bb00)),
            ..sample()
        };
        let buf = forward.encode(&UUID, 4096);
        assert_eq!(buf[24..28], 48u32.to_le_bytes());
        assert_eq!(buf[48..52], 5u32.to_le_bytes());
        assert_eq!(&buf[64..80], &[0xab; 16]);
        assert_eq!(buf[80..84], 9u32.to_le_bytes());
        assert_eq!(buf[84..88], [0; 4]);
        assert_eq!(buf[88..96], 0x7788_99aa_bb00u64.to_le_bytes());
        assert!(buf[96..].iter().all(|b| *b == 0));
        let mut covered = buf[..96].to_vec();
        covered[28..32].fill(0);
        assert_eq!(buf[28..32], crc32c::crc32c(&covered).to_le_bytes());
        assert_eq!(SlotForward::decode(&buf, &UUID, 3), Ok(forward.clone()));
        let from = region_of_slot_3(Some(crate::slot::SlotSecondCopy {
            disk: 2,
            offset: 1 << 21,
            log_behind: Some(1),
        }));
        let to = forward.target(&from);
        assert_eq!(
            to.second,
            Some(crate::slot::SlotSecondCopy {
                disk: 9,
                offset: 0x7788_99aa_bb00,
                log_behind: None
            })
        );
        // A bit of the second copy's place is covered by the crc.
        let mut torn = buf.to_vec();
        torn[90] ^= 1;
        assert!(SlotForward::decode(&torn, &UUID, 3)
            .unwrap_err()
            .contains("checksum mismatch"));
        torn[90] ^= 1;
        torn[84] = 1;
        assert!(SlotForward::decode(&torn, &UUID, 3).is_err());
    }

    #[test]
    fn damaged_or_foreign_forwards_are_refused_by_name() {
        let good = sample().encode(&UUID, 512);
        let refused = |edit: &dyn Fn(&mut [u8]), slot: u32, why: &str| {
            let mut b = good.to_vec();
            edit(&mut b);
            let e = SlotForward::decode(&b, &UUID, slot).unwrap_err();
            assert!(e.contains(why), "{e}");
        };
        refused(&|_| {}, 4, "slot 3's");
        refused(&|b| b[60] ^= 1, 3, "checksum mismatch");
        refused(&|b| b[8] = 2, 3, "version 2");
        refused(&|b| b[24] = 40, 3, "body length 40");
        let other = sample().encode(&[9; 16], 512);
        assert!(SlotForward::decode(&other, &UUID, 3)
            .unwrap_err()
            .contains("another file system"));
        assert!(SlotForward::decode(&good[..64], &UUID, 3).is_err());
    }

    #[test]
    fn a_forward_leads_to_a_region_as_large_as_the_one_it_lies_in() {
        let from = region_of_slot_3(None);
        let to = sample().target(&from);
        assert_eq!((to.slot, to.disk, to.offset), (3, 5, 0x1122_3344_5566));
        assert_eq!(
            (to.bytes, to.record_bytes, to.log_id),
            (8 << 20, 8192, [0xab; 16])
        );
    }

    proptest::proptest! {
        #[test]
        fn garbage_never_panics_the_forward_decoder(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            magic in proptest::prelude::any::<bool>(),
        ) {
            let mut bytes = bytes;
            if magic && bytes.len() >= 8 {
                bytes[..8].copy_from_slice(&FORWARD_MAGIC);
            }
            let _ = SlotForward::decode(&bytes, &UUID, 3);
        }

        #[test]
        fn a_flipped_bit_of_a_forward_to_two_copies_is_refused(bit in 64usize..96 * 8) {
            let forward = SlotForward { second: Some((9, 1 << 30)), ..sample() };
            let mut buf = forward.encode(&UUID, 512).to_vec();
            buf[bit / 8] ^= 1 << (bit % 8);
            let decoded = SlotForward::decode(&buf, &UUID, 3);
            proptest::prop_assert!(decoded.is_err(), "bit {} accepted: {:?}", bit, decoded);
        }
    }
}
