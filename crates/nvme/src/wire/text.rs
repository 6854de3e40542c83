//! Fixed-width text fields and NVMe Qualified Names (NQNs).
//!
//! NVMe structures carry two kinds of text: ASCII fields padded with spaces (serial number,
//! model, firmware revision, transport address and service id) and UTF-8 NQNs padded with
//! NUL bytes (subsystem and host NQNs). Both are wrapped in types that can only hold valid
//! values, so encoding them is infallible and decoding them validates once.

use std::fmt;

use super::error::WireError;

/// Longest NQN the specification allows, in bytes (NVMe Base 2.0, 4.5 "NVMe Qualified
/// Names"); it is shorter than the 256-byte fields that carry it, so one NUL always fits.
pub const NQN_MAX_BYTES: usize = 223;

/// Size of every NQN field in Connect data, Identify Controller and the Discovery log.
pub const NQN_FIELD_BYTES: usize = 256;

/// The well-known NQN of a discovery subsystem; hosts connect to it to read the Discovery
/// log page.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// Prefix of NQNs built from a UUID (the format `nvme gen-hostnqn` produces).
pub const UUID_NQN_PREFIX: &str = "nqn.2014-08.org.nvmexpress:uuid:";

/// Why a text field was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// The text does not fit in its field.
    #[error("{len} bytes do not fit in {max}")]
    TooLong {
        /// Length of the text in bytes.
        len: usize,
        /// Largest length the field allows.
        max: usize,
    },
    /// A byte is not printable ASCII (0x20..=0x7e) in an ASCII field.
    #[error("byte {index} is {byte:#04x}, not printable ASCII")]
    NotAscii {
        /// Index of the byte inside the text.
        index: usize,
        /// The byte.
        byte: u8,
    },
    /// An NQN field is not valid UTF-8.
    #[error("not UTF-8 at byte {index}")]
    NotUtf8 {
        /// Index of the first invalid byte.
        index: usize,
    },
    /// An NQN contains a NUL byte, which would end it early on the wire.
    #[error("NUL byte at {index}")]
    Nul {
        /// Index of the NUL.
        index: usize,
    },
    /// An NQN does not start with "nqn.".
    #[error("does not start with \"nqn.\"")]
    NqnPrefix,
}

/// Printable ASCII text of at most `N` bytes, stored on the wire space-padded to `N` bytes.
///
/// Used for SN (20), MN (40), FR (8), TRSVCID (32) and TRADDR (256).
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct FixedAscii<const N: usize> {
    text: String,
}

impl<const N: usize> FixedAscii<N> {
    /// Validates `text`: at most `N` bytes, all printable ASCII.
    ///
    /// # Errors
    /// [`TextError::TooLong`] or [`TextError::NotAscii`].
    pub fn new(text: &str) -> Result<Self, TextError> {
        if text.len() > N {
            return Err(TextError::TooLong {
                len: text.len(),
                max: N,
            });
        }
        if let Some((index, &byte)) = text
            .as_bytes()
            .iter()
            .enumerate()
            .find(|(_, b)| !(0x20..=0x7e).contains(*b))
        {
            return Err(TextError::NotAscii { index, byte });
        }
        Ok(FixedAscii {
            text: text.to_owned(),
        })
    }

    /// The text without padding.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Writes the field into `out` (exactly `N` bytes), padded with spaces as the
    /// specification requires for ASCII fields.
    pub(crate) fn write(&self, out: &mut [u8]) {
        let out = &mut out[..N];
        out.fill(b' ');
        out[..self.text.len()].copy_from_slice(self.text.as_bytes());
    }

    /// Reads the field from `raw` (at least `N` bytes), dropping trailing spaces and NULs:
    /// some implementations pad with NUL, and being lenient there costs nothing.
    pub(crate) fn read(raw: &[u8]) -> Result<Self, TextError> {
        let raw = &raw[..N];
        let end = raw
            .iter()
            .rposition(|&b| b != b' ' && b != 0)
            .map_or(0, |i| i + 1);
        if let Some((index, &byte)) = raw[..end]
            .iter()
            .enumerate()
            .find(|(_, b)| !(0x20..=0x7e).contains(*b))
        {
            return Err(TextError::NotAscii { index, byte });
        }
        // Every byte was checked to be ASCII, so this conversion cannot fail.
        let text = String::from_utf8_lossy(&raw[..end]).into_owned();
        Ok(FixedAscii { text })
    }

    /// Decodes the field at `offset` of `buf`, naming `structure` and `field` in the error.
    pub(crate) fn decode_at(
        buf: &[u8],
        offset: usize,
        structure: &'static str,
        field: &'static str,
    ) -> Result<Self, WireError> {
        Self::read(&buf[offset..offset + N]).map_err(|source| WireError::InvalidText {
            structure,
            field,
            offset,
            source,
        })
    }
}

impl<const N: usize> fmt::Debug for FixedAscii<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.text, f)
    }
}

impl<const N: usize> fmt::Display for FixedAscii<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A validated NVMe Qualified Name: UTF-8, starts with "nqn.", at most
/// [`NQN_MAX_BYTES`] bytes, no NUL. Stored on the wire NUL-padded to [`NQN_FIELD_BYTES`].
///
/// The check is the part of the NQN grammar every implementation agrees on; the date and
/// reverse domain that follow "nqn." are not checked, because Linux and SPDK accept NQNs
/// that do not follow them and rejecting a host for it would only hurt interoperability.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Nqn(String);

impl Nqn {
    /// Validates `nqn`.
    ///
    /// # Errors
    /// [`TextError`] naming what is wrong.
    pub fn new(nqn: &str) -> Result<Self, TextError> {
        if nqn.len() > NQN_MAX_BYTES {
            return Err(TextError::TooLong {
                len: nqn.len(),
                max: NQN_MAX_BYTES,
            });
        }
        if let Some(index) = nqn.bytes().position(|b| b == 0) {
            return Err(TextError::Nul { index });
        }
        if !nqn.starts_with("nqn.") {
            return Err(TextError::NqnPrefix);
        }
        Ok(Nqn(nqn.to_owned()))
    }

    /// The well-known discovery subsystem NQN, [`DISCOVERY_NQN`].
    #[must_use]
    pub fn discovery() -> Self {
        Nqn(DISCOVERY_NQN.to_owned())
    }

    /// The UUID-based NQN "nqn.2014-08.org.nvmexpress:uuid:xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
    /// for a 16-byte UUID, the form hosts use when they have no domain of their own.
    #[must_use]
    pub fn from_uuid(uuid: &[u8; 16]) -> Self {
        let mut s = String::with_capacity(UUID_NQN_PREFIX.len() + 36);
        s.push_str(UUID_NQN_PREFIX);
        for (i, b) in uuid.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                s.push('-');
            }
            s.push_str(&format!("{b:02x}"));
        }
        Nqn(s)
    }

    /// True for the well-known discovery NQN.
    #[must_use]
    pub fn is_discovery(&self) -> bool {
        self.0 == DISCOVERY_NQN
    }

    /// The NQN as text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Writes the NQN NUL-padded into `out[..NQN_FIELD_BYTES]`.
    pub(crate) fn write(&self, out: &mut [u8]) {
        let out = &mut out[..NQN_FIELD_BYTES];
        out.fill(0);
        out[..self.0.len()].copy_from_slice(self.0.as_bytes());
    }

    /// Reads an NQN from a 256-byte field: the text ends at the first NUL (or at the end of
    /// the field, which then fails the length check).
    pub(crate) fn read(raw: &[u8]) -> Result<Self, TextError> {
        let raw = &raw[..NQN_FIELD_BYTES];
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        let text = std::str::from_utf8(&raw[..end]).map_err(|e| TextError::NotUtf8 {
            index: e.valid_up_to(),
        })?;
        Nqn::new(text)
    }

    /// Decodes the NQN field at `offset` of `buf`, naming `structure` and `field`.
    pub(crate) fn decode_at(
        buf: &[u8],
        offset: usize,
        structure: &'static str,
        field: &'static str,
    ) -> Result<Self, WireError> {
        Self::read(&buf[offset..offset + NQN_FIELD_BYTES]).map_err(|source| {
            WireError::InvalidText {
                structure,
                field,
                offset,
                source,
            }
        })
    }
}

impl fmt::Debug for Nqn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Nqn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Nqn {
    type Err = TextError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Nqn::new(s)
    }
}

/// Checks that `nqn` is a valid NQN (see [`Nqn`]).
///
/// # Errors
/// [`TextError`] naming what is wrong.
pub fn validate_nqn(nqn: &str) -> Result<(), TextError> {
    Nqn::new(nqn).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_nqn_has_canonical_form() {
        let uuid = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        assert_eq!(
            Nqn::from_uuid(&uuid).as_str(),
            "nqn.2014-08.org.nvmexpress:uuid:12345678-9abc-def0-0123-456789abcdef"
        );
    }

    #[test]
    fn nqn_rules() {
        assert!(Nqn::new(DISCOVERY_NQN).unwrap().is_discovery());
        assert_eq!(Nqn::new("iqn.foo"), Err(TextError::NqnPrefix));
        let long = format!("nqn.{}", "a".repeat(NQN_MAX_BYTES - 3));
        assert_eq!(
            Nqn::new(&long),
            Err(TextError::TooLong { len: 224, max: 223 })
        );
        assert!(Nqn::new(&long[..NQN_MAX_BYTES]).is_ok());
        assert_eq!(Nqn::new("nqn.a\0b"), Err(TextError::Nul { index: 5 }));
    }

    #[test]
    fn fixed_ascii_pads_with_spaces_and_trims() {
        let sn = FixedAscii::<8>::new("AB1").unwrap();
        let mut raw = [0u8; 8];
        sn.write(&mut raw);
        assert_eq!(&raw, b"AB1     ");
        assert_eq!(
            FixedAscii::<8>::read(b"AB1\0\0\0\0\0").unwrap().as_str(),
            "AB1"
        );
        assert!(FixedAscii::<2>::new("abc").is_err());
        assert_eq!(
            FixedAscii::<4>::read(b"a\x01b ").unwrap_err(),
            TextError::NotAscii { index: 1, byte: 1 }
        );
    }
}
