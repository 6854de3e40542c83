//! The redb file under both stores: table definitions, the format-version check at open, and
//! the record encoding (layout in the module doc of [`crate::store`]).

use std::fs;
use std::path::{Path, PathBuf};

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::error::{RedbResultExt, StoreError};

/// The format this build writes and the only one it reads. Bump it when any record below
/// changes shape, and add the migration from the previous version to [`check_format`].
pub const FORMAT_VERSION: u32 = 1;

/// Vote, committed log id, last purged log id and the format version.
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// Raft log entries keyed by log index.
pub(crate) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
/// Applied state, last applied log id and membership, and the current snapshot.
pub(crate) const STATE_MACHINE: TableDefinition<&str, &[u8]> =
    TableDefinition::new("state_machine");

pub(crate) const KEY_FORMAT_VERSION: &str = "format_version";
pub(crate) const KEY_VOTE: &str = "vote";
pub(crate) const KEY_COMMITTED: &str = "committed";
pub(crate) const KEY_LAST_PURGED: &str = "last_purged";
pub(crate) const KEY_APPLIED: &str = "applied";
pub(crate) const KEY_STATE: &str = "state";
pub(crate) const KEY_SNAPSHOT_META: &str = "snapshot_meta";
pub(crate) const KEY_SNAPSHOT_DATA: &str = "snapshot_data";
pub(crate) const KEY_SNAPSHOT_SEQ: &str = "snapshot_seq";

/// The configuration is kilobytes to a few megabytes; redb's default page cache of 1 GiB would
/// only reserve memory a daemon needs elsewhere.
const CACHE_BYTES: usize = 16 * 1024 * 1024;

/// One open `raft.redb`, shared by the log store and the state machine store.
pub(crate) struct Db {
    pub(crate) db: Database,
    pub(crate) path: PathBuf,
}

impl Db {
    /// Opens the file, creating it first if it does not exist, and verifies every page
    /// checksum: a file damaged outside redb must fail here with an error, not later in Raft.
    pub(crate) fn open(path: &Path) -> Result<Db, StoreError> {
        if !path.exists() {
            Db::create(path)?;
        }
        let len = fs::metadata(path)
            .map_err(|source| StoreError::Io {
                path: path.to_path_buf(),
                action: "stat",
                source,
            })?
            .len();
        // redb would quietly initialise an empty file, and a node that forgot its vote could
        // vote twice in one term. `create` never leaves an empty file at `path`.
        if len == 0 {
            return Err(StoreError::damaged(path, "the file is empty"));
        }
        let db = Db::open_redb(path)?;
        db.check_format()?;
        Ok(db)
    }

    fn open_redb(path: &Path) -> Result<Db, StoreError> {
        let db = Database::builder()
            .set_check_integrity_on_open(true)
            .set_cache_size(CACHE_BYTES)
            .create(path)
            .at(path, "open the Raft store")?;
        Ok(Db {
            db,
            path: path.to_path_buf(),
        })
    }

    /// Builds a new store beside `path` and renames it into place, so that a file at `path`
    /// always holds at least the format stamp and an empty or short one is damage, never a
    /// creation cut short by a crash.
    fn create(path: &Path) -> Result<(), StoreError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).map_err(|source| StoreError::Io {
                path: parent.to_path_buf(),
                action: "create the directory of the Raft store",
                source,
            })?;
        }
        let mut staging = path.as_os_str().to_owned();
        staging.push(".new");
        let staging = PathBuf::from(staging);
        let io_err = |action, source| StoreError::Io {
            path: staging.clone(),
            action,
            source,
        };
        match fs::remove_file(&staging) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                return Err(io_err("remove a leftover half-created Raft store", err));
            }
            _ => {}
        }
        Db::open_redb(&staging)?.check_format()?;
        fs::rename(&staging, path).map_err(|e| io_err("move the new Raft store into place", e))?;
        sync_parent_dir(path)
    }

    /// Stamps a new file with [`FORMAT_VERSION`] and refuses a file of any other version.
    fn check_format(&self) -> Result<(), StoreError> {
        let path = &self.path;
        let txn = self.begin_write()?;
        let table_count = txn.list_tables().at(path, "list tables")?.count();
        let found = {
            let mut meta = txn.open_table(META).at(path, "open the meta table")?;
            let found = match meta
                .get(KEY_FORMAT_VERSION)
                .at(path, "read the format version")?
            {
                Some(bytes) => Some(decode_version(path, bytes.value())?),
                None => None,
            };
            if found.is_none() {
                if table_count != 0 {
                    return Err(StoreError::damaged(
                        path,
                        "the format version record is missing",
                    ));
                }
                let version = FORMAT_VERSION.to_le_bytes();
                meta.insert(KEY_FORMAT_VERSION, version.as_slice())
                    .at(path, "stamp format")?;
            }
            found
        };
        if found.is_none() {
            // Both tables exist from the first commit on, so a missing one later is damage.
            txn.open_table(LOG).at(path, "create the log table")?;
            txn.open_table(STATE_MACHINE)
                .at(path, "create the state machine table")?;
            txn.commit().at(path, "commit the new Raft store")?;
            return Ok(());
        }
        txn.abort().at(path, "end the format check")?;
        match found {
            Some(FORMAT_VERSION) => Ok(()),
            Some(version) if version > FORMAT_VERSION => Err(StoreError::NewerFormat {
                path: path.clone(),
                found: version,
                supported: FORMAT_VERSION,
            }),
            Some(version) => Err(StoreError::damaged(
                path,
                format!("format version {version} is older than any this build can read"),
            )),
            None => unreachable!("a new file returned above"),
        }
    }

    /// Starts a write transaction that is durable on disk when `commit` returns: every record
    /// here is one Raft relies on after a crash.
    pub(crate) fn begin_write(&self) -> Result<redb::WriteTransaction, StoreError> {
        let mut txn = self.db.begin_write().at(&self.path, "begin a write")?;
        txn.set_durability(Durability::Immediate)
            .map_err(|err| StoreError::Database {
                path: self.path.clone(),
                action: "ask for durable commits",
                detail: err.to_string(),
            })?;
        Ok(txn)
    }

    pub(crate) fn begin_read(&self) -> Result<redb::ReadTransaction, StoreError> {
        self.db.begin_read().at(&self.path, "begin a read")
    }

    /// Reads and decodes one record of a `&str`-keyed table.
    pub(crate) fn get<T: DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        let txn = self.begin_read()?;
        let table = txn.open_table(table).at(&self.path, "open a table")?;
        let value = table.get(key).at(&self.path, "read a record")?;
        value
            .map(|bytes| decode(&self.path, key, bytes.value()))
            .transpose()
    }

    /// Reads one record of a `&str`-keyed table without decoding it.
    pub(crate) fn get_raw(
        &self,
        table: TableDefinition<&str, &[u8]>,
        key: &str,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let txn = self.begin_read()?;
        let table = txn.open_table(table).at(&self.path, "open a table")?;
        let value = table.get(key).at(&self.path, "read a record")?;
        Ok(value.map(|bytes| bytes.value().to_vec()))
    }

    /// Writes one record of a `&str`-keyed table in its own durable transaction.
    pub(crate) fn put<T: Serialize>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        key: &str,
        value: &T,
    ) -> Result<(), StoreError> {
        let bytes = encode(&self.path, key, value)?;
        let txn = self.begin_write()?;
        {
            let mut table = txn.open_table(table).at(&self.path, "open a table")?;
            table
                .insert(key, bytes.as_slice())
                .at(&self.path, "write a record")?;
        }
        txn.commit().at(&self.path, "commit a record")
    }
}

/// A new file's directory entry is not durable until its directory is synced; without it a
/// crash right after `tessera cluster create` could lose the whole store.
fn sync_parent_dir(path: &Path) -> Result<(), StoreError> {
    let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(());
    };
    let sync = fs::File::open(parent).and_then(|dir| dir.sync_all());
    sync.map_err(|source| StoreError::Io {
        path: parent.to_path_buf(),
        action: "sync the directory of the new Raft store",
        source,
    })
}

fn decode_version(path: &Path, bytes: &[u8]) -> Result<u32, StoreError> {
    let array: [u8; 4] = bytes.try_into().map_err(|_| {
        StoreError::damaged(
            path,
            format!("format version record is {} bytes, not 4", bytes.len()),
        )
    })?;
    Ok(u32::from_le_bytes(array))
}

/// Encodes a record with postcard. Failure means a `Serialize` impl refused its own value,
/// which is reported rather than trusted to never happen in the application state.
pub(crate) fn encode<T: Serialize + ?Sized>(
    path: &Path,
    what: &str,
    value: &T,
) -> Result<Vec<u8>, StoreError> {
    postcard::to_allocvec(value).map_err(|err| StoreError::Database {
        path: path.to_path_buf(),
        action: "encode a record",
        detail: format!("{what}: {err}"),
    })
}

/// Decodes a whole record: trailing bytes are damage too, since every record is written whole.
pub(crate) fn decode<T: DeserializeOwned>(
    path: &Path,
    what: &str,
    bytes: &[u8],
) -> Result<T, StoreError> {
    let (value, rest) = postcard::take_from_bytes::<T>(bytes).map_err(|err| {
        StoreError::damaged(path, format!("record `{what}` does not decode: {err}"))
    })?;
    if !rest.is_empty() {
        let detail = format!(
            "record `{what}` has {} stray bytes after its end",
            rest.len()
        );
        return Err(StoreError::damaged(path, detail));
    }
    Ok(value)
}

/// Reads one log table entry range as raw bytes, for callers that decode per entry.
pub(crate) fn log_range(
    db: &Db,
    start: std::ops::Bound<u64>,
    end: std::ops::Bound<u64>,
    limit: usize,
) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
    let txn = db.begin_read()?;
    let table = txn.open_table(LOG).at(&db.path, "open the log table")?;
    let mut out = Vec::new();
    for item in table
        .range::<u64>((start, end))
        .at(&db.path, "read the log")?
        .take(limit)
    {
        let (index, bytes) = item.at(&db.path, "read a log entry")?;
        out.push((index.value(), bytes.value().to_vec()));
    }
    Ok(out)
}
