//! Errors of the vdisk layer. Each one names the device, pdisk, declustered array or vdisk
//! it is about and, where there is one, what the administrator can do.

use std::io;

/// Everything that can go wrong creating, opening or using a declustered array.
#[derive(Debug, thiserror::Error)]
pub enum VdiskError {
    // The I/O error is part of the message and deliberately not a `source()`: callers
    // print errors with their chain (`{:#}`), which would repeat it.
    #[error("{device}: {action}: {error}")]
    Io {
        device: String,
        action: String,
        error: io::Error,
    },
    #[error("`{name}`: invalid {what} name: {problem}; {NAME_RULE}")]
    InvalidName {
        what: &'static str,
        name: String,
        problem: &'static str,
    },
    #[error("{0}")]
    Invalid(String),
    #[error(
        "{device}: the same device is listed twice (also as {other}); every pdisk must be a \
         distinct drive"
    )]
    DuplicateDevice { device: String, other: String },
    #[error(
        "{device}: already holds a pdisk label of declustered array `{da}`; to reuse the \
         drive and destroy what it holds, {how_to_force}"
    )]
    DeviceInUse {
        device: String,
        da: String,
        /// How the caller overrides the check, in the words of its interface.
        how_to_force: &'static str,
    },
    #[error(
        "{device}: belongs to declustered array `{other_da}` ({other_uuid}), not to `{da}`; \
         remove it from the device list (or open `{other_da}` with it)"
    )]
    ForeignPdisk {
        device: String,
        other_da: String,
        other_uuid: String,
        da: String,
    },
    #[error(
        "{device}: no pdisk label (not part of any declustered array); remove it from the \
         device list, or add it to an array with `pdisk replace`"
    )]
    NotAPdisk { device: String },
    #[error("{device}: the pdisk label is corrupt: {reason}")]
    CorruptLabel { device: String, reason: String },
    #[error(
        "declustered array `{da}`: no valid metadata on any of its devices ({devices}); the \
         array cannot be opened"
    )]
    NoMetadata { da: String, devices: String },
    #[error(
        "declustered array `{da}`: the metadata (pdisks, vdisks and stripe maps) would need \
         {needed_bytes} bytes but its metadata area holds {area_bytes}; use a larger block \
         size (fewer stripes) or a smaller vdisk, or spread the data over another array"
    )]
    MetadataFull {
        da: String,
        needed_bytes: u64,
        area_bytes: u64,
    },
    #[error(
        "{device}: {size_bytes} bytes is too small for a pdisk; the minimum is {min_bytes} \
         bytes ({} MiB)", min_bytes >> 20
    )]
    TooSmall {
        device: String,
        size_bytes: u64,
        min_bytes: u64,
    },
    #[error(
        "declustered array `{da}`: code {code} needs {needed} pdisks in service but the \
         array has {have}; use a code with fewer strips or add pdisks"
    )]
    CodeDoesNotFit {
        da: String,
        code: String,
        needed: usize,
        have: usize,
    },
    #[error("vdisk `{vdisk}`: block size {block_bytes}: {reason}")]
    BadBlockSize {
        vdisk: String,
        block_bytes: u64,
        reason: String,
    },
    #[error(
        "declustered array `{da}`: not enough free space: {what} needs {needed_bytes} bytes, \
         {free_bytes} bytes are free outside the spare reserve; free space or add pdisks"
    )]
    NoSpace {
        da: String,
        what: String,
        needed_bytes: u64,
        free_bytes: u64,
    },
    #[error("declustered array `{da}`: a vdisk named `{vdisk}` already exists")]
    VdiskExists { da: String, vdisk: String },
    #[error("declustered array `{da}`: no vdisk named `{vdisk}`")]
    NoSuchVdisk { da: String, vdisk: String },
    #[error("declustered array `{da}`: no pdisk named `{pdisk}`")]
    NoSuchPdisk { da: String, pdisk: String },
    #[error("declustered array `{da}`: at most {max} {what}")]
    Limit {
        da: String,
        what: &'static str,
        max: usize,
    },
    #[error("pdisk `{pdisk}` is {state}: cannot {action}")]
    PdiskState {
        pdisk: String,
        state: String,
        action: &'static str,
    },
    #[error(
        "vdisk `{vdisk}` stripe {stripe}: data lost: {reason} (pdisks {pdisks}); the rest of \
         the vdisk stays readable; restore this range from a backup"
    )]
    Unrecoverable {
        vdisk: String,
        stripe: u64,
        pdisks: String,
        reason: String,
    },
    #[error("vdisk `{vdisk}` was deleted or its declustered array was closed")]
    Closed { vdisk: String },
    #[error("erasure code: {0}")]
    Codec(tessera_ec::CodecError),
}

/// The rule for pdisk, array and vdisk names, shown in errors.
pub const NAME_RULE: &str =
    "names are 1 to 63 characters of letters, digits, `_`, `-` and `.`, starting with a \
     letter or digit";

/// Most bytes in a pdisk, array, vdisk or enclosure name.
pub const NAME_MAX_BYTES: usize = 63;

/// Checks a name against [`NAME_RULE`].
pub fn check_name(what: &'static str, name: &str) -> Result<(), VdiskError> {
    let problem = if name.is_empty() {
        Some("empty")
    } else if name.len() > NAME_MAX_BYTES {
        Some("too long")
    } else if !name.as_bytes()[0].is_ascii_alphanumeric() {
        Some("must start with a letter or digit")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
    {
        Some("contains a character other than letters, digits, `_`, `-`, `.`")
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(problem) => Err(VdiskError::InvalidName {
            what,
            name: name.to_string(),
            problem,
        }),
    }
}

impl From<tessera_ec::CodecError> for VdiskError {
    fn from(e: tessera_ec::CodecError) -> VdiskError {
        VdiskError::Codec(e)
    }
}

impl VdiskError {
    /// Wraps an I/O error with the device and what was being done.
    pub(crate) fn io(device: &str, action: impl Into<String>, source: io::Error) -> VdiskError {
        VdiskError::Io {
            device: device.to_string(),
            action: action.into(),
            error: source,
        }
    }
}

impl From<VdiskError> for io::Error {
    /// Data errors become EIO-like `io::Error`s that keep the full message, so the file
    /// system above logs which vdisk, stripe and pdisks are affected.
    fn from(e: VdiskError) -> io::Error {
        io::Error::other(e)
    }
}
