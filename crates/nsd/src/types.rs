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
    /// Every usage, in the order error messages list them.
    pub const ALL: [DiskUsage; 4] = [
        DiskUsage::DataAndMetadata,
        DiskUsage::DataOnly,
        DiskUsage::MetadataOnly,
        DiskUsage::DescOnly,
    ];

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
    /// Every thin-disk type, in the order error messages list them.
    pub const ALL: [ThinDiskType; 4] = [
        ThinDiskType::No,
        ThinDiskType::Nvme,
        ThinDiskType::Scsi,
        ThinDiskType::Auto,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            ThinDiskType::No => "no",
            ThinDiskType::Nvme => "nvme",
            ThinDiskType::Scsi => "scsi",
            ThinDiskType::Auto => "auto",
        }
    }
}

/// The longest NSD (and storage pool) name, in bytes. The NSD descriptor stores the name in
/// a fixed 255-byte field, as GPFS allows names of up to 255 characters.
pub const NAME_MAX_BYTES: usize = 255;

/// The rule [`check_name`] enforces, phrased as advice for error messages.
pub const NAME_RULE: &str =
    "use 1 to 255 letters, digits, `_`, `.` or `-`, starting with a letter or `_`";

/// Checks an NSD or pool name; on failure returns what is wrong (see [`NAME_RULE`]).
///
/// Names are plain ASCII so they print and sort the same everywhere and fit the descriptor
/// byte for byte. They must start with a letter or `_` so a name can never be taken for a
/// number (a failure group, an index) or for an option (`-v`) on a command line.
pub fn check_name(name: &str) -> Result<(), &'static str> {
    let Some(first) = name.chars().next() else {
        return Err("empty name");
    };
    if name.len() > NAME_MAX_BYTES {
        return Err("name longer than 255 bytes");
    }
    if !(first.is_ascii_alphabetic() || first == '_') {
        return Err("name must start with a letter or `_`");
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if !name.chars().all(allowed) {
        return Err("name contains a character other than letters, digits, `_`, `.`, `-`");
    }
    Ok(())
}

/// A stanza value that names none of the accepted spellings; says which ones are accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{value}`; use one of {accepted}")]
pub struct ParseValueError {
    /// What was being parsed, e.g. "usage".
    pub what: &'static str,
    /// The text that did not parse.
    pub value: String,
    /// The accepted spellings, comma separated.
    pub accepted: String,
}

/// Matches `text` against the `as_str` spellings of `all`. Case is ignored because
/// `dataonly` and `dataOnly` cannot mean anything different, and a refusal would only
/// cost the administrator a round trip.
fn parse_spelling<T: Copy>(
    text: &str,
    what: &'static str,
    all: &[T],
    spell: fn(&T) -> &'static str,
) -> Result<T, ParseValueError> {
    all.iter()
        .copied()
        .find(|v| spell(v).eq_ignore_ascii_case(text))
        .ok_or_else(|| ParseValueError {
            what,
            value: text.to_string(),
            accepted: all.iter().map(spell).collect::<Vec<_>>().join(", "),
        })
}

impl std::str::FromStr for DiskUsage {
    type Err = ParseValueError;
    fn from_str(text: &str) -> Result<DiskUsage, ParseValueError> {
        parse_spelling(text, "usage", &DiskUsage::ALL, DiskUsage::as_str)
    }
}

impl std::str::FromStr for ThinDiskType {
    type Err = ParseValueError;
    fn from_str(text: &str) -> Result<ThinDiskType, ParseValueError> {
        parse_spelling(
            text,
            "thinDiskType",
            &ThinDiskType::ALL,
            ThinDiskType::as_str,
        )
    }
}

impl std::fmt::Display for DiskUsage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for ThinDiskType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_roundtrip_and_ignore_case() {
        for u in DiskUsage::ALL {
            assert_eq!(u.as_str().parse::<DiskUsage>(), Ok(u));
            assert_eq!(u.as_str().to_uppercase().parse::<DiskUsage>(), Ok(u));
        }
        for t in ThinDiskType::ALL {
            assert_eq!(t.as_str().parse::<ThinDiskType>(), Ok(t));
        }
    }

    #[test]
    fn names() {
        assert_eq!(check_name("de0704a01v1"), Ok(()));
        assert_eq!(check_name("_a.b-c"), Ok(()));
        assert!(check_name("").is_err());
        assert!(check_name("1abc").is_err());
        assert!(check_name("-v").is_err());
        assert!(check_name("a b").is_err());
        assert!(check_name(&"a".repeat(255)).is_ok());
        assert!(check_name(&"a".repeat(256)).is_err());
    }

    #[test]
    fn unknown_spelling_lists_accepted_values() {
        let err = "dataOnlyy".parse::<DiskUsage>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown usage `dataOnlyy`; \
             use one of dataAndMetadata, dataOnly, metadataOnly, descOnly"
        );
        let err = "yes".parse::<ThinDiskType>().unwrap_err();
        assert!(err.to_string().contains("no, nvme, scsi, auto"), "{err}");
    }
}
