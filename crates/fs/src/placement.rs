//! Where a file's data goes: the installed policy's placement rules [mmchpolicy] and the
//! storage pool each file records.
//!
//! The policy's text lives in the file-system descriptor, so it survives remounts and
//! moves with the disks; it is checked against the pools when installed and parsed again
//! at mount. A placement rule runs once, at create, under the metadata lock, on what is
//! known then (name, owner, group, fileset), and its choice is logged with the create as
//! `Change::SetPool`, so the file's later blocks (and a restripe's moves) stay in that pool
//! whatever policy is installed later. Files no rule placed, and every file made before
//! placement existed, record no pool and use the file system's default data pool.

use std::sync::Arc;

use tessera_alloc::PoolId;
use tessera_policy::{Action, FileAttrs, Policy, ROOT_FILESET};

use crate::error::{FsError, FsResult};
use crate::fs::{FileSystem, Meta};
use crate::inode::{Attr, Ino};

/// An installed policy with its pools resolved to ids.
pub(crate) struct Installed {
    policy: Policy,
    pools: Vec<String>,
}

impl Installed {
    fn pool_id(&self, name: &str) -> Option<PoolId> {
        self.pools
            .iter()
            .position(|p| p == name)
            .and_then(|i| PoolId::try_from(i).ok())
    }
}

/// What `tessera policy change` reports.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct PolicySummary {
    pub rules: usize,
    pub placement_rules: usize,
    pub migrate_rules: usize,
    pub delete_rules: usize,
    pub list_rules: usize,
}

/// Parses `text` for the file system described by `desc` and checks what parsing cannot:
/// that every pool a rule places or migrates files into holds data disks.
pub(crate) fn check_policy(desc: &crate::descriptor::FsDescriptor, text: &str) -> FsResult<Policy> {
    let policy = Policy::parse(text, &desc.pools)
        .map_err(|e| FsError::Invalid(format!("policy refused: {e}")))?;
    for rule in policy.rules() {
        let target = match &rule.action {
            Action::SetPool { pool, .. } => pool,
            Action::Migrate { to, .. } => to,
            _ => continue,
        };
        let holds_data = desc
            .disks
            .iter()
            .any(|d| desc.pools.get(usize::from(d.pool)) == Some(target) && d.usage.holds_data());
        if !holds_data {
            return Err(FsError::Invalid(format!(
                "policy refused: line {}: {} puts file data in pool '{target}', which has no \
                 disk that holds data; add one (tessera disk add) or name another pool",
                rule.line,
                rule.label()
            )));
        }
    }
    Ok(policy)
}

/// The policy of a file system being mounted. One that no longer fits (a pool it names
/// has lost its data disks) is kept in the descriptor but not applied, and the log says
/// why: the mount must not fail over a policy.
pub(crate) fn load(desc: &crate::descriptor::FsDescriptor) -> Option<Arc<Installed>> {
    let text = desc.policy.as_deref()?;
    match check_policy(desc, text) {
        Ok(policy) => Some(Arc::new(Installed {
            policy,
            pools: desc.pools.clone(),
        })),
        Err(e) => {
            tracing::error!(
                "{}: the installed policy is not applied: {e}; install a corrected one with \
                 tessera policy change",
                desc.name
            );
            None
        }
    }
}

fn summary(policy: &Policy) -> PolicySummary {
    let mut s = PolicySummary {
        rules: policy.rules().len(),
        ..PolicySummary::default()
    };
    for r in policy.rules() {
        match r.action {
            Action::SetPool { .. } => s.placement_rules += 1,
            Action::Migrate { .. } => s.migrate_rules += 1,
            Action::Delete { .. } => s.delete_rules += 1,
            Action::List { .. } => s.list_rules += 1,
            Action::ExternalList { .. } => {}
        }
    }
    s
}

impl FileSystem {
    /// Installs `text` as the file system's policy (`None` removes it) [mmchpolicy]: checked
    /// against the pools, then written into the descriptor by a checkpoint. Files created
    /// from then on are placed by its rules; existing files keep their pools.
    pub fn set_policy(&self, text: Option<&str>) -> FsResult<PolicySummary> {
        self.owner_here("installing a policy")?;
        self.manager_here("installing a policy")?;
        self.check_fenced()?;
        let desc = self.descriptor();
        let checked = text.map(|t| check_policy(&desc, t)).transpose()?;
        self.change_descriptor(
            "installing the policy",
            "unmount and mount the file system again, then install it again",
            |next| next.policy = text.map(str::to_string),
        )?;
        let summary = checked.as_ref().map(summary).unwrap_or_default();
        *self.owner().policy.write() = checked.map(|policy| {
            Arc::new(Installed {
                policy,
                pools: desc.pools.clone(),
            })
        });
        Ok(summary)
    }

    /// Checks `text` as [`FileSystem::set_policy`] would, without installing it
    /// [mmchpolicy -I test].
    pub fn check_policy(&self, text: Option<&str>) -> FsResult<PolicySummary> {
        let desc = self.descriptor();
        Ok(text
            .map(|t| check_policy(&desc, t))
            .transpose()?
            .as_ref()
            .map(summary)
            .unwrap_or_default())
    }

    /// Where `ino`'s data lies: (disk index, first sub-block) of every extent of every
    /// copy, in file order (for diagnosis and tests of placement).
    pub fn file_block_addresses(&self, ino: Ino) -> FsResult<Vec<(u16, u64)>> {
        self.owner_here("listing a file's block addresses")?;
        let mut m = self.owner().meta.lock();
        if m.state.content_kind(ino)? != crate::meta::ContentKind::Blocks {
            return Ok(Vec::new());
        }
        Ok(m.state
            .blocks(ino, 0..u64::MAX)?
            .iter()
            .flat_map(|(_, b)| b.extents())
            .map(|e| (e.addr.disk, e.addr.sub_block))
            .collect())
    }

    /// Data blocks of `ino` per disk, by NSD name (disks holding none left out).
    pub fn file_blocks_per_disk(&self, ino: Ino) -> FsResult<Vec<(String, u64)>> {
        self.owner_here("listing a file's blocks per disk")?;
        let names = self.disk_names();
        let mut counts = vec![0u64; names.len()];
        {
            let mut m = self.owner().meta.lock();
            if m.state.content_kind(ino)? == crate::meta::ContentKind::Blocks {
                for (_, b) in m.state.blocks(ino, 0..u64::MAX)? {
                    for e in b.extents() {
                        if let Some(c) = counts.get_mut(usize::from(e.addr.disk)) {
                            *c += 1;
                        }
                    }
                }
            }
        }
        Ok(names
            .into_iter()
            .zip(counts)
            .filter(|(_, c)| *c > 0)
            .collect())
    }

    /// The installed policy's text, as it was given.
    pub fn policy_text(&self) -> Option<String> {
        self.descriptor().policy
    }

    /// The pool a placement rule chooses for a regular file being created, and that rule's
    /// label; `None` when no policy places files or no rule matches.
    pub(crate) fn place(&self, m: &Meta, name: &[u8], attr: &Attr) -> Option<(PoolId, String)> {
        let installed = self.owner().policy.read().clone()?;
        if !installed.policy.has_placement_rules() {
            return None;
        }
        let f = FileAttrs {
            name: String::from_utf8_lossy(name).into_owned(),
            fileset_name: ROOT_FILESET.into(),
            user_id: attr.uid,
            group_id: attr.gid,
            mode: attr.mode(),
            inode: attr.ino,
            ..FileAttrs::default()
        };
        let full_percent = |pool: &str| {
            installed.pool_id(pool).map_or(100, |p| {
                let s = m.alloc.pool_space(p, tessera_alloc::AllocKind::Data);
                let per = u64::from(self.geo.sub_blocks_per_block);
                let total = s.blocks_total * per;
                let free = s.blocks_free * per + s.sub_blocks_free_in_fragments;
                (total.saturating_sub(free) * 100)
                    .checked_div(total)
                    .map_or(100, |p| p.min(100) as u8)
            })
        };
        let (rule, pool) = installed
            .policy
            .place(&f, attr.crtime.secs, &full_percent)?;
        Some((installed.pool_id(pool)?, rule.label()))
    }

    /// The pool that holds (and receives) the data of `ino`.
    pub(crate) fn file_pool(&self, m: &mut Meta, ino: Ino) -> FsResult<PoolId> {
        Ok(m.state.pool_of(ino)?.unwrap_or(self.geo.data_pool))
    }

    /// A pool's name, for messages.
    pub(crate) fn pool_name(&self, pool: PoolId) -> String {
        self.descriptor().pool_name(pool).to_string()
    }

    /// The storage pool of a file's data [mmlsattr -L], by name.
    pub fn file_pool_name(&self, ino: Ino) -> FsResult<String> {
        self.owner_here("naming a file's pool")?;
        let pool = {
            let mut m = self.owner().meta.lock();
            self.file_pool(&mut m, ino)?
        };
        Ok(self.pool_name(pool))
    }
}
