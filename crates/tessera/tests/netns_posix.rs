//! The POSIX conformance set (`crates/fuse/tests/posix_set/cases.rs`) on a node that is
//! neither the file system manager nor the owner of anything it touches: two real daemons
//! in network namespaces (`scripts/cluster-netns.sh`), node 1 owning every file system's
//! metadata (`metadataSlots=no`), the cases run on node 2's mount, whose every metadata
//! request crosses the node transport (TCP between the namespaces) to node 1 while its
//! data goes to the shared drive files itself. The in-process form of the same check is
//! `crates/fuse/tests/posix_client.rs`; this one adds the daemon, the CLI, the network and
//! the kernel cache a client node of a real cluster gets.
//!
//! One cluster serves every case of this binary (a cluster per case would spend most of
//! the run starting daemons); each case makes its own file system on its own drive files
//! and deletes it at the end, while others run, so the cases also run admin commands on
//! the two nodes at once (and one test below does only that). The cluster goes down when
//! the process exits.
//!
//! Needs root and `ip netns`; without them the cases say why and pass, except under
//! CI=true, where they fail.

mod common;

/// The harness the cases are written against (`crates/fuse/tests/harness`), with a file
/// system of the netns cluster behind it.
mod harness {
    #![allow(dead_code)]

    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::OnceLock;

    use crate::common::netns::{
        all_in_state, netns_usable, tessera, tessera_ok, wait_for, Cluster, SETTLE, TEST_TIMINGS,
    };

    /// Node 1 owns every file system's metadata; the cases run on node 2's mount.
    const OWNER: u32 = 1;
    const CLIENT: u32 = 2;

    static CLUSTER: OnceLock<Cluster> = OnceLock::new();

    extern "C" fn cluster_down_at_exit() {
        if let Some(c) = CLUSTER.get() {
            let out = c.sh(&["down"]);
            if !out.status.success() {
                eprintln!("down failed: {}", String::from_utf8_lossy(&out.stderr));
            }
            if let Some(parent) = c.base.parent() {
                let _ = std::fs::remove_dir_all(parent);
            }
        }
    }

    /// The binary's one cluster, brought up by the first case that asks.
    pub fn cluster() -> &'static Cluster {
        CLUSTER.get_or_init(|| {
            let c = Cluster::new();
            let config = format!("{TEST_TIMINGS},metadataSlots=no");
            c.ok(&["up", "2", "--config", &config]);
            wait_for("both nodes active", SETTLE, || {
                all_in_state(&c, OWNER, &[OWNER, CLIENT], "active")
            });
            // SAFETY: registers a plain function; it runs once, at process exit.
            unsafe { libc::atexit(cluster_down_at_exit) };
            c
        })
    }

    /// Format options the cases ask for, as `fs create` flags.
    #[derive(Clone, Debug)]
    pub struct FsOptions {
        block: &'static str,
        log: &'static str,
    }

    pub fn small_fs() -> FsOptions {
        FsOptions {
            block: "256K",
            log: "16M",
        }
    }

    /// Whether this machine can run the cases (root, /dev/fuse and `ip netns`).
    pub fn can_mount() -> bool {
        if !netns_usable() {
            return false;
        }
        assert!(
            std::path::Path::new("/dev/fuse").exists()
                || std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but /dev/fuse is missing"
        );
        std::path::Path::new("/dev/fuse").exists()
    }

    /// The cases map files through a child process (here only for their sake: another
    /// process serves this file system).
    pub use tessera_testkit::in_child;

    /// What `tessera fsck -n` said, in the shape of `tessera_fs::FsckReport` the cases use.
    #[derive(Debug)]
    pub struct FsckReport {
        pub problems: Vec<String>,
        clean: bool,
    }

    impl FsckReport {
        pub fn is_clean(&self) -> bool {
            self.clean
        }
    }

    /// A file system of the cluster on its own drive files, mounted on node 1 (its owner)
    /// and on node 2 at `mnt()`; unmounted and deleted on drop.
    pub struct Mounted {
        pub dir: tempfile::TempDir,
        name: String,
        nsds: Vec<String>,
        mounted: bool,
    }

    impl Mounted {
        pub fn new(disk_count: usize, disk_bytes: u64, opts: FsOptions) -> Mounted {
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let c = cluster();
            let name = format!("px{}", NEXT.fetch_add(1, Ordering::Relaxed));
            let dir = tessera_testkit::scratch_dir("tessera-netns-posix");
            let mut stanza = String::new();
            let mut nsds = Vec::new();
            for i in 0..disk_count {
                let drive = dir.path().join(format!("d{i}.img"));
                std::fs::File::create(&drive)
                    .unwrap()
                    .set_len(disk_bytes)
                    .unwrap();
                let nsd = format!("{name}d{i}");
                stanza.push_str(&format!(
                    "%nsd: device={} nsd={nsd} usage=dataAndMetadata failureGroup={} \
                     pool=system\n",
                    drive.display(),
                    i + 1
                ));
                nsds.push(nsd);
            }
            let stanza_file = dir.path().join("nsd.stanza");
            std::fs::write(&stanza_file, stanza).unwrap();
            let stanza_file = stanza_file.to_str().unwrap();
            tessera_ok(c, OWNER, &["nsd", "create", "-F", stanza_file]);
            let owner_mnt = c.base.join(format!("node{OWNER}/mnt/{name}"));
            tessera_ok(
                c,
                OWNER,
                &[
                    "fs",
                    "create",
                    &name,
                    "-F",
                    stanza_file,
                    "-B",
                    opts.block,
                    "-L",
                    opts.log,
                    "-A",
                    "no",
                    "-T",
                    owner_mnt.to_str().unwrap(),
                ],
            );
            let mut m = Mounted {
                dir,
                name,
                nsds,
                mounted: false,
            };
            m.mount();
            m
        }

        /// Node 1 first (it owns the metadata), then node 2, the cases' node.
        fn mount(&mut self) {
            let c = cluster();
            tessera_ok(c, OWNER, &["mount", &self.name]);
            std::fs::create_dir_all(self.mnt()).unwrap();
            let here = self.mnt();
            tessera_ok(
                c,
                CLIENT,
                &["mount", &self.name, "-T", here.to_str().unwrap()],
            );
            let listed = tessera_ok(c, OWNER, &["mount", "ls", &self.name, "-Y"]);
            assert!(
                listed
                    .lines()
                    .any(|l| l.contains(":node2:") && l.contains(":client")),
                "node 2 mounts {} as a client of node 1: {listed}",
                self.name
            );
            self.mounted = true;
        }

        pub fn mnt(&self) -> PathBuf {
            self.dir.path().join("mnt")
        }

        pub fn path(&self, rel: &str) -> PathBuf {
            self.mnt().join(rel)
        }

        /// Node 2 unmounts, then node 1, which writes the final checkpoint.
        pub fn unmount(&mut self) {
            if !self.mounted {
                return;
            }
            let c = cluster();
            tessera_ok(c, CLIENT, &["umount", &self.name]);
            tessera_ok(c, OWNER, &["umount", &self.name]);
            self.mounted = false;
        }

        pub fn remount(&mut self) {
            self.unmount();
            self.mount();
        }

        /// `tessera fsck -n` on node 1; the file system must be unmounted.
        pub fn fsck(&self) -> FsckReport {
            let out = tessera(cluster(), OWNER, &["fsck", &self.name, "-n"]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let clean = out.status.success() && text.contains(" 0 problems found");
            FsckReport {
                problems: if clean {
                    Vec::new()
                } else {
                    text.lines()
                        .map(String::from)
                        .chain(std::iter::once(
                            String::from_utf8_lossy(&out.stderr).into_owned(),
                        ))
                        .collect()
                },
                clean,
            }
        }
    }

    impl Drop for Mounted {
        fn drop(&mut self) {
            let c = cluster();
            if self.mounted {
                let _ = tessera(c, CLIENT, &["umount", &self.name]);
                let _ = tessera(c, OWNER, &["umount", &self.name]);
            }
            let _ = tessera(c, OWNER, &["fs", "delete", &self.name]);
            let mut delete = vec!["nsd", "delete"];
            delete.extend(self.nsds.iter().map(String::as_str));
            let _ = tessera(c, OWNER, &delete);
            let _ = std::process::Command::new("umount")
                .args(["-l", self.mnt().to_str().unwrap()])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

include!("../../fuse/tests/posix_set/cases.rs");

/// Admin commands that change the NSD and file-system tables, on both nodes at once, all
/// land: node 1 creates and deletes file systems (each `fs create` formats for a while)
/// while node 2 creates and deletes NSDs. Each command makes its change on the tables as
/// they are when it saves; none fails because another one landed during its format or
/// its descriptor writes.
#[test]
fn admin_commands_on_both_nodes_at_once_all_land() {
    if !can_mount() {
        return;
    }
    let c = harness::cluster();
    let dir = tempfile::tempdir().unwrap();
    let drive = |name: &str| {
        let path = dir.path().join(format!("{name}.img"));
        File::create(&path).unwrap().set_len(128 << 20).unwrap();
        let stanza = dir.path().join(format!("{name}.stanza"));
        fs::write(
            &stanza,
            format!(
                "%nsd: device={} nsd={name} usage=dataAndMetadata failureGroup=1 pool=system\n",
                path.display()
            ),
        )
        .unwrap();
        stanza.to_str().unwrap().to_string()
    };
    let ok = |k: u32, args: &[&str]| common::netns::tessera_ok(c, k, args);
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..4 {
                let (fs_name, nsd) = (format!("adm{i}"), format!("adm{i}n"));
                let stanza = drive(&nsd);
                ok(1, &["nsd", "create", "-F", &stanza]);
                let made = ok(
                    1,
                    &[
                        "fs", "create", &fs_name, "-F", &stanza, "-B", "256K", "-A", "no",
                    ],
                );
                assert!(
                    made.contains(&format!("Completed creation of file system {fs_name}")),
                    "{made}"
                );
                ok(1, &["fs", "delete", &fs_name]);
                ok(1, &["nsd", "delete", &nsd]);
            }
        });
        s.spawn(|| {
            for i in 0..8 {
                let nsd = format!("adm{i}b");
                let stanza = drive(&nsd);
                ok(2, &["nsd", "create", "-F", &stanza]);
                ok(2, &["nsd", "delete", &nsd]);
            }
        });
    });
    let listed = ok(1, &["nsd", "ls"]);
    assert!(
        !listed.contains("adm"),
        "every NSD made here was deleted: {listed}"
    );
    let listed =
        String::from_utf8_lossy(&common::netns::tessera(c, 2, &["fs", "ls", "all", "-Y"]).stdout)
            .into_owned();
    assert!(
        !listed.contains("adm"),
        "every file system made here was deleted: {listed}"
    );
}
