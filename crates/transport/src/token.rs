//! Join tokens: everything a new node needs to join, in one line an admin can copy.
//!
//! Text: `tessera-join-1:` followed by lower-case hex of
//!
//! | bytes | field |
//! | --- | --- |
//! | 16 | cluster id |
//! | 32 | cluster secret |
//! | 1 + n | cluster name (length byte, UTF-8) |
//! | 1 + m | contact address `host:port` (length byte, UTF-8) |
//! | 4 | CRC-32C (LE) of the prefix text and every byte above |
//!
//! The checksum turns a mistyped or cut token into "token damaged" instead of a join
//! attempt with a wrong secret. The `1` in the prefix is the format version; a different
//! version is refused by name. The token holds the secret: treat it like the secret file.

use crate::secret::{ClusterSecret, SECRET_BYTES};
use crate::wire::{hex_decode, hex_encode, validate_name, NAME_BYTES_MAX};
use crate::{ClusterId, TransportError};

/// Prefix of version 1 tokens; the text before the version number is shared by all versions.
pub const JOIN_TOKEN_PREFIX: &str = "tessera-join-1:";
const PREFIX_STEM: &str = "tessera-join-";
/// Longer text is refused before it is decoded.
const TOKEN_CHARS_MAX: usize = JOIN_TOKEN_PREFIX.len() + 2 * (16 + 32 + 2 * 256 + 4);

/// What a joining node needs: which cluster, its secret and one node to contact.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken {
    pub cluster_id: ClusterId,
    pub cluster_name: String,
    pub secret: ClusterSecret,
    /// `host:port` of a daemon of the cluster.
    pub contact: String,
}

impl std::fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinToken")
            .field("cluster_id", &self.cluster_id)
            .field("cluster_name", &self.cluster_name)
            .field("secret", &self.secret)
            .field("contact", &self.contact)
            .finish()
    }
}

impl JoinToken {
    /// Checks the fields, then returns the one-line token.
    pub fn encode(&self) -> Result<String, TransportError> {
        let invalid = |what, value: &str, detail| TransportError::InvalidArgument {
            what,
            value: value.to_owned(),
            detail,
        };
        validate_name(&self.cluster_name)
            .map_err(|detail| invalid("cluster name", &self.cluster_name, detail))?;
        validate_address(&self.contact)
            .map_err(|detail| invalid("contact address", &self.contact, detail))?;
        let mut bytes = Vec::with_capacity(64 + self.cluster_name.len() + self.contact.len());
        bytes.extend_from_slice(&self.cluster_id.0);
        bytes.extend_from_slice(self.secret.as_bytes());
        for text in [&self.cluster_name, &self.contact] {
            bytes.push(text.len() as u8);
            bytes.extend_from_slice(text.as_bytes());
        }
        let crc = checksum(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        Ok(format!("{JOIN_TOKEN_PREFIX}{}", hex_encode(&bytes)))
    }

    /// Parses a token; surrounding whitespace (from copy and paste) is ignored.
    pub fn parse(text: &str) -> Result<JoinToken, TransportError> {
        let text = text.trim();
        let damaged = |detail: String| TransportError::TokenDamaged { detail };
        let Some(hex) = text.strip_prefix(JOIN_TOKEN_PREFIX) else {
            return Err(not_a_token(text));
        };
        if text.len() > TOKEN_CHARS_MAX {
            return Err(damaged(format!(
                "{} characters, longer than any token",
                text.len()
            )));
        }
        let bytes = hex_decode(hex).map_err(damaged)?;
        if bytes.len() < 4 {
            return Err(damaged(format!("only {} bytes", bytes.len())));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        let crc = u32::from_le_bytes(crc.try_into().expect("split at 4 bytes from the end"));
        if crc != checksum(body) {
            return Err(damaged("checksum mismatch".to_owned()));
        }
        decode_body(body).map_err(damaged)
    }
}

fn not_a_token(text: &str) -> TransportError {
    if let Some(rest) = text.strip_prefix(PREFIX_STEM) {
        let version: String = rest.chars().take_while(|c| *c != ':').take(8).collect();
        let detail = format!(
            "token format version {version:?}, this node reads version 1; make the token with \
             the same Tessera release as this node"
        );
        return TransportError::NotAToken { detail };
    }
    let detail = format!("it does not start with {JOIN_TOKEN_PREFIX:?}");
    TransportError::NotAToken { detail }
}

fn checksum(body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(JOIN_TOKEN_PREFIX.as_bytes()), body)
}

fn decode_body(body: &[u8]) -> Result<JoinToken, String> {
    let fixed = 16 + SECRET_BYTES;
    if body.len() < fixed {
        return Err(format!(
            "{} bytes, fewer than the {fixed} of id and secret",
            body.len()
        ));
    }
    let (fixed_bytes, mut rest) = body.split_at(fixed);
    let cluster_id = ClusterId(fixed_bytes[..16].try_into().expect("16 bytes"));
    let secret = ClusterSecret::from_bytes(fixed_bytes[16..].try_into().expect("32 bytes"));
    let cluster_name = take_text(&mut rest, "cluster name")?;
    let contact = take_text(&mut rest, "contact address")?;
    if !rest.is_empty() {
        return Err(format!("{} bytes after the contact address", rest.len()));
    }
    validate_name(&cluster_name).map_err(|detail| format!("cluster name {detail}"))?;
    validate_address(&contact).map_err(|detail| format!("contact address {detail}"))?;
    Ok(JoinToken {
        cluster_id,
        cluster_name,
        secret,
        contact,
    })
}

fn take_text(rest: &mut &[u8], what: &str) -> Result<String, String> {
    let Some((&len, tail)) = rest.split_first() else {
        return Err(format!("ends before the {what}"));
    };
    let len = usize::from(len);
    if tail.len() < len {
        return Err(format!("{what} cut short"));
    }
    let (text, tail) = tail.split_at(len);
    *rest = tail;
    String::from_utf8(text.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
}

/// Checks a `host:port` address (`[v6]:port` for IPv6 literals) without resolving it.
pub fn validate_address(address: &str) -> Result<(), String> {
    if address.len() > NAME_BYTES_MAX {
        return Err(format!(
            "{} bytes, more than {NAME_BYTES_MAX}",
            address.len()
        ));
    }
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err("has no :port".to_owned());
    };
    match port.parse::<u16>() {
        Ok(0) | Err(_) => return Err(format!("port {port:?} is not a number from 1 to 65535")),
        Ok(_) => {}
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if bare.is_empty() {
        return Err("has an empty host".to_owned());
    }
    if bare.contains(':') && !host.starts_with('[') {
        return Err("IPv6 addresses need brackets, as in [::1]:7000".to_owned());
    }
    validate_name(bare).map_err(|detail| format!("host {detail}"))
}
