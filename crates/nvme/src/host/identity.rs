//! The host's identity: its NQN and 16-byte host identifier, persisted like Linux's
//! `/etc/nvme/hostnqn` and `/etc/nvme/hostid` so that subsystems' allowed-host lists and
//! reservation registrations keep matching across restarts.

use std::io::{self, Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::HostError;
use crate::wire::text::UUID_NQN_PREFIX;
use crate::wire::Nqn;

/// A host NQN and host identifier.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostIdentity {
    /// Host NQN.
    pub nqn: String,
    /// Host identifier (HOSTID in Connect; the registrant ID of reservations).
    pub id: [u8; 16],
}

impl HostIdentity {
    /// A fresh identity: a random version-4 UUID as host ID and the UUID-based NQN
    /// "nqn.2014-08.org.nvmexpress:uuid:<uuid>" (what `nvme gen-hostnqn` makes).
    ///
    /// # Errors
    /// When no random bytes can be read.
    pub fn generate() -> io::Result<HostIdentity> {
        let mut id = [0u8; 16];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut id)?;
        id[6] = (id[6] & 0x0f) | 0x40;
        id[8] = (id[8] & 0x3f) | 0x80;
        Ok(HostIdentity {
            nqn: Nqn::from_uuid(&id).to_string(),
            id,
        })
    }

    /// Loads the identity from `path`, or creates it there. The file holds the NQN on the
    /// first line and the host ID as a UUID on the second; a file with only an NQN (a copy
    /// of `/etc/nvme/hostnqn`) takes the host ID from a UUID-based NQN. Creation is atomic
    /// and never replaces a file another process created first.
    ///
    /// # Errors
    /// [`HostError::Io`] for file errors, [`HostError::Invalid`] for a malformed file.
    pub fn load_or_create(path: &Path) -> Result<HostIdentity, HostError> {
        let io_err = |context: String| move |source| HostError::Io { context, source };
        match std::fs::read_to_string(path) {
            Ok(text) => return parse(&text, path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(format!("reading {}", path.display()))(e)),
        }
        let identity = HostIdentity::generate().map_err(io_err("generating a host ID".into()))?;
        let text = format!("{}\n{}\n", identity.nqn, format_uuid(&identity.id));
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
        let tmp = dir.join(format!(".hostnqn.{}.tmp", std::process::id()));
        let write = || -> io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()
        };
        write().map_err(io_err(format!("writing {}", tmp.display())))?;
        // A hard link fails if the name exists: the first creator wins, the others read it.
        let linked = std::fs::hard_link(&tmp, path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                if let Ok(d) = std::fs::File::open(dir) {
                    let _ = d.sync_all();
                }
                Ok(identity)
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let text = std::fs::read_to_string(path)
                    .map_err(io_err(format!("reading {}", path.display())))?;
                parse(&text, path)
            }
            Err(e) => Err(io_err(format!("creating {}", path.display()))(e)),
        }
    }
}

fn parse(text: &str, path: &Path) -> Result<HostIdentity, HostError> {
    let invalid = |what: String| HostError::Invalid(format!("{}: {what}", path.display()));
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'));
    let nqn = lines
        .next()
        .ok_or_else(|| invalid("empty; expected a host NQN".into()))?;
    Nqn::new(nqn).map_err(|e| invalid(format!("host NQN {nqn:?}: {e}")))?;
    let id = match lines.next() {
        Some(uuid) => {
            parse_uuid(uuid).ok_or_else(|| invalid(format!("host ID {uuid:?} is not a UUID")))?
        }
        None => nqn
            .strip_prefix(UUID_NQN_PREFIX)
            .and_then(parse_uuid)
            .ok_or_else(|| invalid("no host ID line and the NQN holds no UUID".into()))?,
    };
    Ok(HostIdentity {
        nqn: nqn.to_owned(),
        id,
    })
}

/// Formats 16 bytes as "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
#[must_use]
pub fn format_uuid(id: &[u8; 16]) -> String {
    let nqn = Nqn::from_uuid(id);
    nqn.as_str()[UUID_NQN_PREFIX.len()..].to_owned()
}

/// Parses "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
#[must_use]
pub fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || text.len() != 36 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_once_and_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nvme/hostnqn");
        let a = HostIdentity::load_or_create(&path).unwrap();
        let b = HostIdentity::load_or_create(&path).unwrap();
        assert_eq!(a, b);
        assert!(a.nqn.starts_with(UUID_NQN_PREFIX));
        assert_eq!(parse_uuid(&a.nqn[UUID_NQN_PREFIX.len()..]), Some(a.id));
    }

    #[test]
    fn nqn_only_file_and_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hostnqn");
        let uuid = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f0";
        std::fs::write(&path, format!("{UUID_NQN_PREFIX}{uuid}\n")).unwrap();
        let id = HostIdentity::load_or_create(&path).unwrap();
        assert_eq!(format_uuid(&id.id), uuid);
        std::fs::write(&path, "nqn.2020-12.com.example:node1\n").unwrap();
        assert!(HostIdentity::load_or_create(&path).is_err());
        std::fs::write(&path, "not an nqn\n").unwrap();
        assert!(HostIdentity::load_or_create(&path).is_err());
    }
}
