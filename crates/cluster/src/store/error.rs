//! Errors of the Raft store, each naming the file and what the operator can do about it.

use std::io;
use std::path::{Path, PathBuf};

/// What went wrong with the local Raft store (`raft.redb`).
///
/// Damage is never repaired in place: the quorum holds the configuration, so the cure for a
/// damaged local copy is to drop it and let the node copy the configuration again.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file holds bytes this store cannot trust: a checksum failed, the file is cut short,
    /// it is not a database, or a record does not decode.
    #[error(
        "{path}: this node's copy of the configuration is damaged ({detail}); remove {path} and \
         re-add the node with `tessera node add`, it copies the configuration from the quorum"
    )]
    Damaged { path: PathBuf, detail: String },

    /// The file was written by a newer Tessera whose format this one does not know.
    #[error(
        "{path}: written in Raft store format version {found}, this tessera reads only version \
         {supported}; run the tessera release that wrote it (or a newer one)"
    )]
    NewerFormat {
        path: PathBuf,
        found: u32,
        supported: u32,
    },

    /// A snapshot sent by the leader does not decode or contradicts its own metadata. Nothing
    /// was installed; the leader retries, and a leader of a newer format needs this node
    /// upgraded.
    #[error(
        "snapshot {id} received from the leader is refused ({detail}); nothing was installed. \
         If the leader runs a newer tessera, upgrade this node"
    )]
    BadSnapshot { id: String, detail: String },

    /// Another process (or another open in this process) holds the database lock.
    #[error(
        "{path}: the Raft store is open in another process; stop the other tessera daemon \
         using this TESSERA_HOME first"
    )]
    InUse { path: PathBuf },

    /// An operating-system error: permissions, a full disk, a missing directory.
    #[error("{path}: {action}: {source}")]
    Io {
        path: PathBuf,
        action: &'static str,
        source: io::Error,
    },

    /// A database operation failed for a reason that is neither damage nor I/O.
    #[error("{path}: {action}: {detail}")]
    Database {
        path: PathBuf,
        action: &'static str,
        detail: String,
    },
}

impl StoreError {
    pub(crate) fn damaged(path: &Path, detail: impl Into<String>) -> Self {
        StoreError::Damaged {
            path: path.to_path_buf(),
            detail: detail.into(),
        }
    }

    /// Sorts a redb error into damage, lock contention, I/O and the rest, because the three
    /// first need different operator actions.
    pub(crate) fn from_redb(path: &Path, action: &'static str, err: redb::Error) -> Self {
        let path_buf = path.to_path_buf();
        match err {
            redb::Error::DatabaseAlreadyOpen => StoreError::InUse { path: path_buf },
            redb::Error::Corrupted(detail) => StoreError::damaged(path, detail),
            redb::Error::TableDoesNotExist(table) => {
                StoreError::damaged(path, format!("table `{table}` is missing"))
            }
            redb::Error::UpgradeRequired(version) => StoreError::damaged(
                path,
                format!("the file uses redb file format {version}, which this build does not read"),
            ),
            redb::Error::Io(source) if source.kind() == io::ErrorKind::InvalidData => {
                StoreError::damaged(path, format!("not a Raft store database: {source}"))
            }
            redb::Error::Io(source) if source.kind() == io::ErrorKind::UnexpectedEof => {
                StoreError::damaged(path, format!("the file is cut short: {source}"))
            }
            redb::Error::Io(source) => StoreError::Io {
                path: path_buf,
                action,
                source,
            },
            other => StoreError::Database {
                path: path_buf,
                action,
                detail: other.to_string(),
            },
        }
    }
}

/// Converts any redb error type into [`StoreError`] at a call site that knows the path.
pub(crate) trait RedbResultExt<T> {
    fn at(self, path: &Path, action: &'static str) -> Result<T, StoreError>;
}

impl<T, E: Into<redb::Error>> RedbResultExt<T> for Result<T, E> {
    fn at(self, path: &Path, action: &'static str) -> Result<T, StoreError> {
        self.map_err(|err| StoreError::from_redb(path, action, err.into()))
    }
}
