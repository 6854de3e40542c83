//! Where a namespace's reservation state lives while PTPL is on: one file per namespace in
//! the drive server's state directory, named after the namespace's NGUID (which the
//! configuration keeps stable across restarts and never reuses), so renumbering
//! namespaces or moving them between subsystems cannot hand one drive's reservations to
//! another. The format is documented in [`super::reservation`].
//!
//! Durability: the new state is written to a temporary file, synced, renamed over the old
//! one and the directory synced, all before the command that changed the state
//! completes. A crash at any point leaves the old state or the new one, never a mix; a
//! file damaged some other way fails its checksum and the server refuses to start, since
//! starting without the reservations would un-fence every host they fence.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use parking_lot::{Mutex, MutexGuard};

use super::reservation::ReservationState;
use crate::wire::Status;

/// The state file of one namespace.
#[derive(Debug)]
pub(crate) struct ReservationStore {
    dir: PathBuf,
    path: PathBuf,
    temp: PathBuf,
}

impl ReservationStore {
    /// The store of namespace `nguid` in `dir`, which is created if missing.
    pub fn new(dir: &Path, nguid: &[u8; 16]) -> io::Result<ReservationStore> {
        fs::create_dir_all(dir)?;
        let name = file_name(nguid);
        Ok(ReservationStore {
            dir: dir.to_path_buf(),
            path: dir.join(&name),
            temp: dir.join(format!("{name}.tmp")),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The persisted bytes, or `None` when there is no file (PTPL off).
    pub fn load(&self) -> io::Result<Option<Vec<u8>>> {
        match fs::read(&self.path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Replaces the file with `bytes`, durably.
    pub fn save(&self, bytes: &[u8]) -> io::Result<()> {
        let mut f = File::create(&self.temp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&self.temp, &self.path)?;
        self.sync_dir()
    }

    /// Removes the file durably: PTPL was turned off, so a restart clears the state.
    pub fn remove(&self) -> io::Result<()> {
        match fs::remove_file(&self.path) {
            Ok(()) => self.sync_dir(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }
}

fn file_name(nguid: &[u8; 16]) -> String {
    let hex: String = nguid.iter().map(|b| format!("{b:02x}")).collect();
    format!("resv-{hex}")
}

/// A namespace's reservation state with its store, if the server has a state directory.
#[derive(Debug)]
pub(crate) struct Reservations {
    state: Mutex<ReservationState>,
    store: Option<ReservationStore>,
    nguid: [u8; 16],
}

impl Reservations {
    /// State that lives only in memory (no state directory, or a caller-supplied device).
    pub fn volatile(nguid: [u8; 16]) -> Reservations {
        Reservations {
            state: Mutex::new(ReservationState::default()),
            store: None,
            nguid,
        }
    }

    /// State kept in `dir`, loaded from there if a host had turned PTPL on.
    ///
    /// # Errors
    /// The file's path and what is wrong with it (unreadable or damaged).
    pub fn persistent(dir: &Path, nguid: [u8; 16]) -> Result<Reservations, (PathBuf, String)> {
        let store = ReservationStore::new(dir, &nguid).map_err(|e| {
            (
                dir.to_path_buf(),
                format!("cannot create the state directory: {e}"),
            )
        })?;
        let state = match store.load() {
            Ok(None) => ReservationState::persistable(),
            Ok(Some(bytes)) => ReservationState::decode_persistent(&bytes, &nguid)
                .map_err(|why| (store.path().to_path_buf(), why))?,
            Err(e) => return Err((store.path().to_path_buf(), e.to_string())),
        };
        Ok(Reservations {
            state: Mutex::new(state),
            store: Some(store),
            nguid,
        })
    }

    /// State files in `dir` that belong to none of the namespaces `nguids`.
    pub fn orphans(dir: &Path, nguids: &[[u8; 16]]) -> Vec<PathBuf> {
        let claimed: Vec<String> = nguids.iter().map(file_name).collect();
        let Ok(entries) = fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut orphans: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("resv-") && !n.ends_with(".tmp"))
                    && !claimed.iter().any(|c| p.ends_with(c))
            })
            .collect();
        orphans.sort();
        orphans
    }

    /// The state, to read (access checks, Reservation Report, Get Features).
    pub fn lock(&self) -> MutexGuard<'_, ReservationState> {
        self.state.lock()
    }

    /// Applies a reservation command or PTPL change. With PTPL on (before or after), the
    /// new state is on stable storage before this returns Ok; if it cannot be written the
    /// change is undone and the command fails with Internal Error, so a host is never told
    /// of a fence that a restart would forget.
    ///
    /// # Errors
    /// The command's status.
    pub fn update(
        &self,
        op: impl FnOnce(&mut ReservationState) -> Result<(), Status>,
    ) -> Result<(), Status> {
        let mut state = self.state.lock();
        let Some(store) = &self.store else {
            return op(&mut state);
        };
        let before = state.clone();
        op(&mut state)?;
        if !state.ptpl() && !before.ptpl() {
            return Ok(());
        }
        let written = if state.ptpl() {
            store.save(&state.encode_persistent(&self.nguid))
        } else {
            store.remove()
        };
        if let Err(e) = written {
            tracing::error!(
                file = %store.path().display(),
                "cannot persist reservation state: {e}; the command fails and the state is unchanged"
            );
            *state = before;
            return Err(Status::INTERNAL_ERROR);
        }
        Ok(())
    }
}
