//! The declustered array's metadata: configuration, pdisk table, vdisk table with stripe
//! maps, and the list of stale strips. One postcard-encoded [`MetaImage`], framed (see
//! `layout::frame`) and written to slot `generation mod 2` of every present pdisk.

use serde::{Deserialize, Serialize};
use tessera_drive::{AlignedBuf, BlockDevice};

use crate::layout::{self, PdiskLayout, SECTOR, SECTOR_USIZE};

/// Version of the [`MetaImage`] encoding; bumped on any incompatible change.
pub const META_FORMAT: u32 = 1;

/// The state of a pdisk, as recorded in the metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PdiskState {
    /// In service: read, written, and a placement target.
    Ok,
    /// Temporarily out of service (admin `suspend`): neither read nor written; writes that
    /// skip it are caught up on `resume` by comparing stripe versions.
    Suspended,
    /// Its device was not found when the array was opened; its strips are rebuilt elsewhere.
    Missing,
    /// Failed (admin `fail`, or I/O errors past the limit); its strips are rebuilt elsewhere.
    Dead,
    /// Healthy but being emptied (admin `drain`): still read, its strips move elsewhere.
    Draining,
    /// Retired by `pdisk replace`; a new pdisk took its enclosure slot.
    Replaced,
}

impl PdiskState {
    /// Strips on the pdisk may be read (and are current).
    pub fn readable(self) -> bool {
        matches!(self, PdiskState::Ok | PdiskState::Draining)
    }

    /// Strips on the pdisk must move to other pdisks.
    pub fn evacuate(self) -> bool {
        matches!(
            self,
            PdiskState::Missing | PdiskState::Dead | PdiskState::Draining | PdiskState::Replaced
        )
    }

    /// The pdisk counts for capacity and spare space.
    pub fn in_service(self) -> bool {
        matches!(
            self,
            PdiskState::Ok | PdiskState::Suspended | PdiskState::Draining
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PdiskState::Ok => "ok",
            PdiskState::Suspended => "suspended",
            PdiskState::Missing => "missing",
            PdiskState::Dead => "dead",
            PdiskState::Draining => "draining",
            PdiskState::Replaced => "replaced",
        }
    }
}

impl std::fmt::Display for PdiskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The code of a vdisk as stored; decoupled from the codec crate's own serde form so the
/// on-disk format is owned here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CodeRecord {
    Replication { copies: u8 },
    ReedSolomon { k: u8, m: u8 },
}

impl From<tessera_ec::Code> for CodeRecord {
    fn from(c: tessera_ec::Code) -> CodeRecord {
        match c {
            tessera_ec::Code::Replication { copies } => CodeRecord::Replication { copies },
            tessera_ec::Code::ReedSolomon { k, m } => CodeRecord::ReedSolomon { k, m },
        }
    }
}

impl From<CodeRecord> for tessera_ec::Code {
    fn from(c: CodeRecord) -> tessera_ec::Code {
        match c {
            CodeRecord::Replication { copies } => tessera_ec::Code::Replication { copies },
            CodeRecord::ReedSolomon { k, m } => tessera_ec::Code::ReedSolomon { k, m },
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaConfig {
    pub uuid: [u8; 16],
    pub name: String,
    pub created_unix: u64,
    pub meta_slot_bytes: u64,
    /// Spare capacity, in pdisks' worth, spread over all pdisks.
    pub spare_pdisks: u32,
    /// Percent of I/O time left to foreground I/O while a rebuild runs.
    pub rebuild_io_share: u8,
    pub scrub_rate_mb_s: u32,
    /// I/O errors after which a pdisk is declared dead.
    pub pdisk_error_limit: u32,
    /// Vdisk ids are never reused, so headers of a deleted vdisk never match a new one.
    pub next_vdisk_id: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PdiskRecord {
    pub uuid: [u8; 16],
    pub name: String,
    /// The device path it was last seen at (informational: pdisks are found by label).
    pub device: String,
    pub enclosure: String,
    pub slot: u32,
    pub device_bytes: u64,
    pub state: PdiskState,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VdiskRecord {
    pub id: u32,
    pub name: String,
    pub code: CodeRecord,
    pub codec_id: u8,
    pub block_bytes: u64,
    pub strip_bytes: u64,
    pub stripes: u64,
    pub region_stripes: u64,
    /// For each stripe, for each of its strips: the pdisk index ...
    pub map_pdisk: Vec<u16>,
    /// ... and the first sector of the strip's slot on that pdisk.
    pub map_sector: Vec<u64>,
}

/// A strip whose last write failed: not read until it is rewritten.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StaleStrip {
    pub vdisk_id: u32,
    pub stripe: u64,
    pub strip: u16,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaImage {
    pub format: u32,
    pub da: DaConfig,
    pub pdisks: Vec<PdiskRecord>,
    pub vdisks: Vec<VdiskRecord>,
    pub stale: Vec<StaleStrip>,
    /// Stripe write versions are `write_epoch << 40 | counter`; the epoch is bumped and
    /// persisted on every open, before the first write, so versions only grow.
    pub write_epoch: u64,
}

impl MetaImage {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("metadata encodes")
    }

    pub fn decode(bytes: &[u8]) -> Result<MetaImage, String> {
        let image: MetaImage =
            postcard::from_bytes(bytes).map_err(|e| format!("metadata does not decode: {e}"))?;
        if image.format != META_FORMAT {
            return Err(format!(
                "metadata format {}, this Tessera reads {META_FORMAT}",
                image.format
            ));
        }
        image.check()?;
        Ok(image)
    }

    /// Structural invariants; a violation means a bug wrote the image.
    pub fn check(&self) -> Result<(), String> {
        for v in &self.vdisks {
            let n = match v.code {
                CodeRecord::Replication { copies } => usize::from(copies),
                CodeRecord::ReedSolomon { k, m } => usize::from(k) + usize::from(m),
            };
            let want = usize::try_from(v.stripes)
                .unwrap_or(usize::MAX)
                .saturating_mul(n);
            if v.map_pdisk.len() != want || v.map_sector.len() != want {
                return Err(format!("vdisk {}: stripe map has the wrong length", v.name));
            }
            if let Some(p) = v
                .map_pdisk
                .iter()
                .find(|&&p| usize::from(p) >= self.pdisks.len())
            {
                return Err(format!("vdisk {}: stripe map names pdisk {p}", v.name));
            }
        }
        Ok(())
    }
}

/// Reads a framed slot at `offset` of at most `slot_bytes`: the verified payload and its
/// generation and array, or `None` when the slot is empty, torn or unreadable.
pub fn read_slot(
    dev: &dyn BlockDevice,
    magic: [u8; 8],
    offset: u64,
    slot_bytes: u64,
) -> Option<(u64, [u8; 16], Vec<u8>)> {
    let mut first = AlignedBuf::zeroed(SECTOR_USIZE);
    dev.read_at(&mut first, offset).ok()?;
    let total = layout::frame_total_bytes(&first)?;
    if total > slot_bytes {
        return None;
    }
    let mut all = AlignedBuf::zeroed(total as usize);
    all[..SECTOR_USIZE].copy_from_slice(&first);
    if total > SECTOR {
        dev.read_at(&mut all[SECTOR_USIZE..], offset + SECTOR)
            .ok()?;
    }
    let u = layout::unframe(magic, &all)?;
    Some((u.generation, u.da_uuid, u.payload.to_vec()))
}

/// The newest valid metadata image on one device, with its generation.
pub fn read_newest(
    dev: &dyn BlockDevice,
    layout: &PdiskLayout,
    da_uuid: [u8; 16],
) -> Option<(u64, MetaImage)> {
    let mut best: Option<(u64, MetaImage)> = None;
    for slot in 0..2 {
        let Some((generation, uuid, payload)) = read_slot(
            dev,
            layout::META_MAGIC,
            layout.meta_slot(slot),
            layout.meta_slot_bytes,
        ) else {
            continue;
        };
        if uuid != da_uuid || generation % 2 != slot {
            continue;
        }
        let Ok(image) = MetaImage::decode(&payload) else {
            continue;
        };
        if best.as_ref().is_none_or(|(g, _)| generation > *g) {
            best = Some((generation, image));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_roundtrip_and_check() {
        let image = MetaImage {
            format: META_FORMAT,
            da: DaConfig {
                uuid: [1; 16],
                name: "da".into(),
                created_unix: 5,
                meta_slot_bytes: 1 << 20,
                spare_pdisks: 1,
                rebuild_io_share: 50,
                scrub_rate_mb_s: 100,
                pdisk_error_limit: 8,
                next_vdisk_id: 2,
            },
            pdisks: vec![PdiskRecord {
                uuid: [2; 16],
                name: "p0".into(),
                device: "/dev/x".into(),
                enclosure: "e0".into(),
                slot: 0,
                device_bytes: 1 << 30,
                state: PdiskState::Ok,
            }],
            vdisks: vec![VdiskRecord {
                id: 1,
                name: "v".into(),
                code: CodeRecord::Replication { copies: 3 },
                codec_id: 2,
                block_bytes: 65536,
                strip_bytes: 65536,
                stripes: 1,
                region_stripes: 1,
                map_pdisk: vec![0, 0, 0],
                map_sector: vec![256, 300, 400],
            }],
            stale: vec![],
            write_epoch: 3,
        };
        let bytes = image.encode();
        assert_eq!(MetaImage::decode(&bytes).unwrap(), image);
        let mut bad = image.clone();
        bad.vdisks[0].map_pdisk[1] = 4;
        assert!(MetaImage::decode(&bad.encode()).is_err());
    }
}
