//! The cluster secret and its file.
//!
//! File format: one line, the 32 secret bytes as 64 lower-case hex digits, then an optional
//! `\n`; nothing else. The file must be a regular file that neither group nor others can
//! read or write (mode 0600 or stricter), as ssh refuses loose private keys and munge a
//! loose key: a secret others can read lets any local user join the cluster.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::wire::{hex_decode, hex_encode};
use crate::TransportError;

/// Bytes of a cluster secret.
pub const SECRET_BYTES: usize = 32;
/// Name of the secret file under `$TESSERA_HOME` (the cluster layer places it there).
pub const SECRET_FILE_NAME: &str = "cluster.secret";
/// A secret file larger than this is refused before it is read whole.
const SECRET_FILE_BYTES_MAX: u64 = 256;

/// The shared secret every node of one cluster holds. Debug never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret([u8; SECRET_BYTES]);

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterSecret(fingerprint {})", self.fingerprint())
    }
}

impl ClusterSecret {
    /// 32 bytes from the operating system's random source (via `rand`'s `OsRng`).
    pub fn generate() -> ClusterSecret {
        let mut bytes = [0u8; SECRET_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        ClusterSecret(bytes)
    }

    pub fn from_bytes(bytes: [u8; SECRET_BYTES]) -> ClusterSecret {
        ClusterSecret(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; SECRET_BYTES] {
        &self.0
    }

    /// 8 hex digits of a hash of the secret: lets an admin compare the secrets of two nodes
    /// in logs without revealing them.
    pub fn fingerprint(&self) -> String {
        let mut hash = Sha256::new();
        hash.update(b"tessera secret fingerprint");
        hash.update(self.0);
        hex_encode(&hash.finalize()[..4])
    }

    /// The file's content: 64 lower-case hex digits and a newline.
    pub fn to_file_text(&self) -> String {
        format!("{}\n", hex_encode(&self.0))
    }

    /// Parses a secret file's content (pure; `path` is only for the messages).
    pub fn parse_file_text(path: &Path, text: &[u8]) -> Result<ClusterSecret, TransportError> {
        let bad = |problem: String| TransportError::SecretFile {
            path: path.to_owned(),
            problem: format!("{problem}; expected one line of 64 lower-case hex digits"),
        };
        let text = std::str::from_utf8(text).map_err(|_| bad("not UTF-8 text".to_owned()))?;
        let line = text.strip_suffix('\n').unwrap_or(text);
        if line.contains('\n') {
            return Err(bad("more than one line".to_owned()));
        }
        let bytes = hex_decode(line).map_err(bad)?;
        let bytes: [u8; SECRET_BYTES] = bytes
            .try_into()
            .map_err(|bytes: Vec<u8>| bad(format!("{} hex digits", bytes.len() * 2)))?;
        Ok(ClusterSecret(bytes))
    }

    /// Writes the secret atomically (temporary file in the same directory, fsync, rename,
    /// fsync of the directory) with mode 0600, so a crash leaves the old file or the new.
    pub fn save(&self, path: &Path) -> Result<(), TransportError> {
        let fail = |doing: &str, error: std::io::Error| TransportError::SecretFile {
            path: path.to_owned(),
            problem: format!("cannot {doing}: {error}"),
        };
        let dir = parent_dir(path);
        let temp = temp_path(path);
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&temp)?;
            file.write_all(self.to_file_text().as_bytes())?;
            file.sync_all()
        };
        if let Err(error) = write() {
            let _ = std::fs::remove_file(&temp);
            return Err(fail("write the temporary file", error));
        }
        if let Err(error) = std::fs::rename(&temp, path) {
            let _ = std::fs::remove_file(&temp);
            return Err(fail("rename the temporary file over it", error));
        }
        std::fs::File::open(&dir)
            .and_then(|dir| dir.sync_all())
            .map_err(|error| fail("sync its directory", error))
    }

    /// Reads the secret file, refusing one that group or others can access, that is not a
    /// regular file, or whose content is not exactly one secret.
    pub fn load(path: &Path) -> Result<ClusterSecret, TransportError> {
        let fail = |problem: String| TransportError::SecretFile {
            path: path.to_owned(),
            problem,
        };
        let file = std::fs::File::open(path).map_err(|error| {
            fail(format!(
                "cannot open: {error}; copy it from a cluster node (mode 0600) or use a join token"
            ))
        })?;
        let meta = file
            .metadata()
            .map_err(|error| fail(format!("cannot stat: {error}")))?;
        if !meta.is_file() {
            return Err(fail("not a regular file".to_owned()));
        }
        let mode = meta.mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(fail(format!(
                "mode {mode:04o} lets group or others access the cluster secret; \
                 run `chmod 600 {}`",
                path.display()
            )));
        }
        if meta.len() > SECRET_FILE_BYTES_MAX {
            return Err(fail(format!(
                "{} bytes, too large for a secret file",
                meta.len()
            )));
        }
        let mut text = Vec::with_capacity(SECRET_FILE_BYTES_MAX as usize);
        file.take(SECRET_FILE_BYTES_MAX + 1)
            .read_to_end(&mut text)
            .map_err(|error| fail(format!("cannot read: {error}")))?;
        ClusterSecret::parse_file_text(path, &text)
    }
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    }
}

fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let suffix = rand::random::<u32>();
    parent_dir(path).join(format!(".{name}.tmp.{}.{suffix:08x}", std::process::id()))
}
