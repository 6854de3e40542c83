//! `policy change`, `policy ls` [mmchpolicy, mmlspolicy] and `file attr ls` [mmlsattr] in
//! the daemon: the policy lives in the file-system descriptor, so these work on a mounted
//! file system or open an unmounted one for the purpose.

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{anyhow, Result};
use tessera_fs::policy_run::ApplyMode;
use tessera_fs::Ino;

use super::Daemon;
use crate::rpc::{FileAttrReply, Reply};

impl Daemon {
    /// Installs (or, with `None`, removes) the policy of file system `name`; with `test`
    /// only checks it [mmchpolicy -I test].
    pub(super) fn policy_change(
        &self,
        name: &str,
        text: Option<&str>,
        test: bool,
    ) -> Result<Reply> {
        let _admin = self.admin.lock();
        let reply = self.with_fs(name, "opening it here to change its policy", |fs| {
            let summary = if test {
                fs.check_policy(text)
            } else {
                fs.set_policy(text)
            }
            .map_err(|e| anyhow!("file system {name}: {e}"))?;
            if !test {
                tracing::info!(
                    "{name}: policy {} ({} rules, {} placement)",
                    if text.is_some() {
                        "installed"
                    } else {
                        "removed"
                    },
                    summary.rules,
                    summary.placement_rules
                );
            }
            Ok(Reply::PolicyChanged(summary))
        })?;
        if !test {
            // Owner slots place the files they create themselves.
            self.followed_everywhere(name, "the policy")?;
        }
        Ok(reply)
    }

    /// Runs the management rules of `text` over file system `name` [mmapplypolicy], with
    /// progress; a client that goes away stops it between files.
    pub(super) fn policy_apply(
        &self,
        name: &str,
        text: &str,
        mode: ApplyMode,
        r: &mut super::Reporter,
    ) -> Result<Reply> {
        let _admin = self.admin.lock();
        let stop = AtomicBool::new(false);
        let report = self.with_fs(name, "opening it here to apply a policy", |fs| {
            fs.apply_policy(text, mode, &stop, &mut |p| {
                r.progress(p.phase, p.done, p.total);
                if r.client_gone() {
                    stop.store(true, Ordering::Relaxed);
                }
            })
            .map_err(|e| {
                anyhow!(
                    "file system {name}: policy apply: {e}; files migrated so far stay \
                     migrated (tessera restripe {name} -p moves the data of any file left \
                     half-way), run it again to continue"
                )
            })
        })?;
        tracing::info!(
            "{name}: policy apply ({mode:?}): {} files scanned, {} migrated ({} bytes moved),              {} deleted{}",
            report.files_scanned,
            report.migrated,
            report.bytes_moved,
            report.deleted,
            if report.stopped { ", stopped by the client" } else { "" }
        );
        Ok(Reply::PolicyApplied(report))
    }

    pub(super) fn policy_ls(&self, name: &str) -> Result<Reply> {
        let _admin = self.admin.lock();
        self.with_fs(name, "opening it here to read its policy", |fs| {
            Ok(Reply::Policy(fs.policy_text()))
        })
    }

    /// The attributes of inode `ino` of mounted file system `name` that `stat` does not
    /// show [mmlsattr -L].
    pub(super) fn file_attr(&self, name: &str, ino: Ino) -> Result<Reply> {
        let fs = self
            .mounts
            .lock()
            .get(name)
            .map(|m| std::sync::Arc::clone(&m.fs))
            .ok_or_else(|| anyhow!("file system {name} is not mounted on this node"))?;
        let pool = fs
            .file_pool_name(ino)
            .map_err(|e| anyhow!("file system {name}, inode {ino}: {e}"))?;
        let blocks_per_disk = fs
            .file_blocks_per_disk(ino)
            .map_err(|e| anyhow!("file system {name}, inode {ino}: {e}"))?;
        let (replication, ill_replicated) = fs
            .file_replication(ino)
            .map_err(|e| anyhow!("file system {name}, inode {ino}: {e}"))?;
        Ok(Reply::FileAttr(FileAttrReply {
            pool,
            replication,
            ill_replicated,
            blocks_per_disk,
        }))
    }

    /// `file attr set --replication` [mmchattr -r] of inode `ino` of mounted file system
    /// `name`.
    pub(super) fn file_replication_set(&self, name: &str, ino: Ino, copies: u8) -> Result<Reply> {
        let fs = self
            .mounts
            .lock()
            .get(name)
            .map(|m| std::sync::Arc::clone(&m.fs))
            .ok_or_else(|| anyhow!("file system {name} is not mounted on this node"))?;
        fs.set_file_replication(ino, copies)
            .map_err(|e| anyhow!("file system {name}, inode {ino}: {e}"))?;
        Ok(Reply::Done)
    }

    /// `fs change -r` [mmchfs -r], mounted or not.
    pub(super) fn fs_replication_set(&self, name: &str, copies: u8) -> Result<Reply> {
        let _admin = self.admin.lock();
        self.with_fs(name, "opening it here to change it", |fs| {
            fs.set_data_replication(copies)
                .map_err(|e| anyhow!("file system {name}: {e}"))
        })?;
        tracing::info!("{name}: new files get {copies} data copies");
        self.followed_everywhere(name, &format!("{copies} data copies for new files"))?;
        Ok(Reply::Done)
    }

    /// `fs change -m` [mmchfs -m], mounted or not.
    pub(super) fn fs_metadata_replication_set(&self, name: &str, copies: u8) -> Result<Reply> {
        let _admin = self.admin.lock();
        self.with_fs(name, "opening it here to change it", |fs| {
            fs.set_metadata_replication(copies)
                .map_err(|e| anyhow!("file system {name}: {e}"))
        })?;
        tracing::info!("{name}: metadata has {copies} copies from now on");
        Ok(Reply::Done)
    }
}
