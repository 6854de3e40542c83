use serde::{Deserialize, Serialize};

/// The permanent identity of an NSD, written in its descriptor; 16 random bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NsdId(pub [u8; 16]);

impl NsdId {
    /// A fresh random id.
    pub fn random() -> NsdId {
        NsdId(rand::random())
    }

    /// Lower-case hex, as shown by `tessera nsd ls -X`.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl std::fmt::Debug for NsdId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NsdId({})", self.to_hex())
    }
}

impl std::fmt::Display for NsdId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// What an NSD holds in a file system (`usage=` in a `%nsd:` stanza).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DiskUsage {
    DataAndMetadata,
    DataOnly,
    MetadataOnly,
    /// Holds only a copy of the file system descriptor (a tie-breaker disk).
    DescOnly,
}

impl DiskUsage {
    /// The stanza spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            DiskUsage::DataAndMetadata => "dataAndMetadata",
            DiskUsage::DataOnly => "dataOnly",
            DiskUsage::MetadataOnly => "metadataOnly",
            DiskUsage::DescOnly => "descOnly",
        }
    }

    pub fn holds_data(&self) -> bool {
        matches!(self, DiskUsage::DataAndMetadata | DiskUsage::DataOnly)
    }

    pub fn holds_metadata(&self) -> bool {
        matches!(self, DiskUsage::DataAndMetadata | DiskUsage::MetadataOnly)
    }
}

/// `thinDiskType=` of a stanza: whether the device is thin provisioned and how space is
/// given back to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ThinDiskType {
    No,
    Nvme,
    Scsi,
    Auto,
}

impl ThinDiskType {
    pub fn as_str(&self) -> &'static str {
        match self {
            ThinDiskType::No => "no",
            ThinDiskType::Nvme => "nvme",
            ThinDiskType::Scsi => "scsi",
            ThinDiskType::Auto => "auto",
        }
    }
}
