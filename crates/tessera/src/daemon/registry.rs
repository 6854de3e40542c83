//! The cluster's registries of NSDs, file systems and declustered arrays, kept as
//! documents of the replicated configuration (keys `nsd`, `fs`, `da`, JSON in the shape of
//! the one-node files `nsd.json`, `fs.json`, `da.json` they replace).
//!
//! Reads come from this node's applied copy; a save is a compare-and-set against the
//! version that copy had, committed by a majority. Two admin commands on different nodes
//! that changed the same registry from the same version cannot both land: the second is
//! refused and says to run the command again, instead of silently undoing the first.

use anyhow::{bail, Context, Result};
use serde::{de::DeserializeOwned, Serialize};
use tessera_cluster::state::{Command, ConfigState};

use super::Daemon;
use crate::config::{DaRegistry, FsRegistry, Home, NsdRegistry};

const NSD_KEY: &str = "nsd";
const FS_KEY: &str = "fs";
/// What a save that lost its compare-and-set says ([`Daemon::until_saved`] looks for it).
const CHANGED_MEANWHILE: &str = "changed while this command ran";
const DA_KEY: &str = "da";
/// How many times a change of the NSD and file-system tables is made on newer tables after
/// another admin command (a mount on another node, an `nsd create`) changed them first.
const CHANGE_ATTEMPTS: usize = 8;
/// How long such a retry waits for this node's copy of the configuration to catch up with
/// the change that came first (it lags a commit behind for a moment).
const CATCH_UP: std::time::Duration = std::time::Duration::from_secs(2);

impl Daemon {
    pub(super) fn nsds(&self) -> Result<NsdRegistry> {
        let (mut registry, version) = self.read_document::<NsdRegistry>(NSD_KEY)?;
        registry.version = version;
        Ok(registry)
    }

    pub(super) fn save_nsds(&self, registry: &NsdRegistry) -> Result<()> {
        self.write_document(NSD_KEY, "NSD table", registry.version, registry)
    }

    pub(super) fn file_systems(&self) -> Result<FsRegistry> {
        let (mut registry, version) = self.read_document::<FsRegistry>(FS_KEY)?;
        registry.version = version;
        Ok(registry)
    }

    pub(super) fn save_file_systems(&self, registry: &FsRegistry) -> Result<()> {
        self.write_document(FS_KEY, "file system table", registry.version, registry)
    }

    /// Runs `attempt` (read a table, change it, save it) until its save lands, up to
    /// `tries` times: a save that lost its compare-and-set to another admin command is made
    /// again once this node's copy shows another version than before (`versions`; it lags a
    /// commit behind for a moment), or after [`CATCH_UP`]. Any other error ends it.
    pub(super) fn until_saved(
        &self,
        tries: usize,
        versions: &dyn Fn() -> Result<Vec<u64>>,
        attempt: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        for tried in 1.. {
            let seen = versions()?;
            match attempt() {
                Err(e) if tried < tries && e.to_string().contains(CHANGED_MEANWHILE) => {
                    let deadline = std::time::Instant::now() + CATCH_UP;
                    while versions()? == seen && std::time::Instant::now() < deadline {
                        std::thread::sleep(std::time::Duration::from_millis(50));
                    }
                }
                done => return done,
            }
        }
        unreachable!("the loop returns by its last try")
    }

    /// Makes `change` to fresh copies of the NSD and file-system tables and saves the ones
    /// it changed (the NSD table first). When another admin command changed either table
    /// after it was read, both are read again and `change` made again, up to a bound, so an
    /// admin command that ran for a while (a format, a disk add) is not refused because an
    /// unrelated one landed meanwhile. `change` therefore checks what it needs on the
    /// tables it is given, and must be harmless to make twice: after a lost save of the
    /// file-system table, the NSD table it is given already holds its own change.
    pub(super) fn change_nsds_and_file_systems(
        &self,
        change: &mut dyn FnMut(&mut NsdRegistry, &mut FsRegistry) -> Result<()>,
    ) -> Result<()> {
        self.until_saved(
            CHANGE_ATTEMPTS,
            &|| Ok(vec![self.nsds()?.version, self.file_systems()?.version]),
            &mut || {
                let mut nsds = self.nsds()?;
                let mut fss = self.file_systems()?;
                let before = (json(&nsds), json(&fss));
                change(&mut nsds, &mut fss)?;
                if json(&nsds) != before.0 {
                    self.save_nsds(&nsds)?;
                }
                if json(&fss) != before.1 {
                    self.save_file_systems(&fss)?;
                }
                Ok(())
            },
        )
    }

    /// [`Self::change_nsds_and_file_systems`] for the declustered array table.
    pub(super) fn change_arrays(
        &self,
        change: &mut dyn FnMut(&mut DaRegistry) -> Result<()>,
    ) -> Result<()> {
        self.until_saved(
            CHANGE_ATTEMPTS,
            &|| Ok(vec![self.arrays()?.version]),
            &mut || {
                let mut registry = self.arrays()?;
                change(&mut registry)?;
                self.save_arrays(&registry)
            },
        )
    }

    pub(super) fn arrays(&self) -> Result<DaRegistry> {
        let (mut registry, version) = self.read_document::<DaRegistry>(DA_KEY)?;
        registry.version = version;
        Ok(registry)
    }

    pub(super) fn save_arrays(&self, registry: &DaRegistry) -> Result<()> {
        self.write_document(
            DA_KEY,
            "declustered array table",
            registry.version,
            registry,
        )
    }

    fn read_document<T: DeserializeOwned + Default>(&self, key: &str) -> Result<(T, u64)> {
        read_document_in(&self.member.state(), key)
    }

    fn write_document<T: Serialize>(
        &self,
        key: &str,
        what: &str,
        expected: u64,
        value: &T,
    ) -> Result<()> {
        let json = serde_json::to_string(value).expect("registries serialize");
        let put = Command::PutDocument {
            key: key.to_string(),
            expected,
            json,
        };
        match self.member.propose(put) {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("changed meanwhile") => bail!(
                "the {what} {CHANGED_MEANWHILE} (an admin command on another node?), so \
                 this command's last step was not saved; run the command again"
            ),
            Err(e) => Err(e.context(format!("cannot save the {what}"))),
        }
    }

    /// Moves the registries of a home from before the cluster layer into the replicated
    /// configuration, once: a document already written is left alone, and each file is
    /// renamed to `*.imported` after its document is committed (a crash in between imports
    /// nothing twice, because the compare-and-set of version 0 is then refused).
    pub(super) fn import_home_registries(&self, home: &Home) -> Result<()> {
        let me = self.cluster.node_name.clone();
        if let Some(mut fss) = read_old::<FsRegistry>(&home.fs_path())? {
            for fs in &mut fss.file_systems {
                if fs.mounted && fs.mounted_on.is_none() {
                    fs.mounted_on = Some(me.clone());
                }
            }
            self.import_one(FS_KEY, &home.fs_path(), &fss)?;
        }
        if let Some(mut das) = read_old::<DaRegistry>(&home.da_path())? {
            for da in &mut das.arrays {
                da.server.get_or_insert_with(|| me.clone());
            }
            self.import_one(DA_KEY, &home.da_path(), &das)?;
        }
        if let Some(nsds) = read_old::<NsdRegistry>(&home.nsd_path())? {
            self.import_one(NSD_KEY, &home.nsd_path(), &nsds)?;
        }
        Ok(())
    }

    fn import_one<T: Serialize>(&self, key: &str, path: &std::path::Path, value: &T) -> Result<()> {
        if self.member.state().document(key).version == 0 {
            let json = serde_json::to_string(value).expect("registries serialize");
            let put = Command::PutDocument {
                key: key.to_string(),
                expected: 0,
                json,
            };
            self.member
                .propose(put)
                .with_context(|| format!("cannot import {}", path.display()))?;
            tracing::info!("imported {} into the cluster configuration", path.display());
        }
        let done = path.with_extension("json.imported");
        std::fs::rename(path, &done)
            .with_context(|| format!("cannot rename {} to {}", path.display(), done.display()))?;
        Ok(())
    }
}

fn read_old<T: DeserializeOwned>(path: &std::path::Path) -> Result<Option<T>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let value = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not valid; restore it from a backup or fix the JSON by hand, then start \
             the daemon again",
            path.display()
        )
    })?;
    Ok(Some(value))
}

/// The array registry in configuration `state` (for threads that hold no `Daemon`).
pub(super) fn arrays_in(state: &ConfigState) -> Result<DaRegistry> {
    let (mut registry, version) = read_document_in::<DaRegistry>(state, DA_KEY)?;
    registry.version = version;
    Ok(registry)
}

fn read_document_in<T: DeserializeOwned + Default>(
    state: &ConfigState,
    key: &str,
) -> Result<(T, u64)> {
    let document = state.document(key);
    if document.version == 0 {
        return Ok((T::default(), 0));
    }
    let value = serde_json::from_str(&document.json).with_context(|| {
        format!(
            "the replicated `{key}` document (version {}) does not parse; this daemon \
             may be older than the one that wrote it: upgrade it",
            document.version
        )
    })?;
    Ok((value, document.version))
}

/// A registry as saved, to tell whether a change changed it.
fn json<T: Serialize>(registry: &T) -> String {
    serde_json::to_string(registry).expect("registries serialize")
}
