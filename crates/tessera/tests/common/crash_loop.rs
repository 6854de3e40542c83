//! The crash loop of the multi-node tests: kill -9 of a node, again and again, under
//! writers on the other nodes that fsync, then every fsynced file verified from a mounted
//! node, and fsck at the end.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::netns::{all_in_state, states, tessera, tessera_ok, wait_for, Cluster, SETTLE};

/// The content of crash-loop file `name`, `len` bytes.
pub fn crash_loop_bytes(name: &str, len: usize) -> Vec<u8> {
    let seed = name
        .bytes()
        .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

/// Writes and fsyncs `name` under `dir`; `Ok` only if every step succeeded.
pub fn write_synced(dir: &Path, name: &str, len: usize) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(dir.join(name))?;
    f.write_all(&crash_loop_bytes(name, len))?;
    f.sync_all()
}

/// The node that manages `fs` now, from `mount ls -Y` on node `from`.
pub fn owner_of(c: &Cluster, from: u32, fs: &str) -> Option<u32> {
    let listed = tessera_ok(c, from, &["mount", "ls", fs, "-Y"]);
    // "manager", or "manager, owner slot N" for a node that also holds owner slots.
    let line = listed
        .lines()
        .find(|l| l.contains(":manager:") || l.contains(":manager,"))?;
    (1..=9).find(|k| line.contains(&format!(":{fs}:node{k}:")))
}

/// Kill -9 of a node of the three that mount `fs` (node k at `mnt(k)`), again and again,
/// under a workload that fsyncs on the other nodes: every third kill is of the file
/// system manager (and a client takes it over), the others of another node. Node `k`'s
/// `i`th file goes where `place(k, name)` says, relative to the mount point. The
/// survivors carry on without an application error (a pause at a metanode's death),
/// every fsynced file verifies from every mounted node, the dead node mounts again when
/// it is back, and fsck finds the file system clean. `TESSERA_CRASH_LOOPS` sets the number
/// of kills (default 20).
pub fn run(
    c: &Cluster,
    fs: &str,
    mnt: &dyn Fn(u32) -> PathBuf,
    place: &(dyn Fn(u32, &str) -> String + Sync),
) {
    let loops: u32 = std::env::var("TESSERA_CRASH_LOOPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let all = [1u32, 2, 3];
    let mut synced: Vec<(String, usize)> = Vec::new();
    let mut rng = 0x9E37_79B9u32;
    let mut next = |n: u32| {
        rng ^= rng << 13;
        rng ^= rng >> 17;
        rng ^= rng << 5;
        rng % n
    };
    const FILES_PER_ROUND: usize = 80;
    let mut pauses = Vec::new();
    for round in 0..loops {
        // Every third kill is of the manager; the others of another node.
        let owner = owner_of(c, 1 + next(3), fs).expect("an owner");
        let victim = if round % 3 == 0 {
            owner
        } else {
            *all.iter()
                .filter(|k| **k != owner)
                .nth(next(2) as usize)
                .unwrap()
        };
        let survivors: Vec<u32> = all.iter().copied().filter(|k| *k != victim).collect();
        // Writers on the survivors fsync files while the victim dies and comes back.
        let stop = std::sync::atomic::AtomicBool::new(false);
        let (written, longest) = std::thread::scope(|s| {
            let writers: Vec<_> = survivors
                .iter()
                .map(|&k| {
                    let stop = &stop;
                    let root = mnt(k);
                    s.spawn(move || {
                        let mut done = Vec::new();
                        let mut longest = Duration::ZERO;
                        let mut i = 0;
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            // A bounded number per round, so twenty rounds fit the drive.
                            if i == FILES_PER_ROUND {
                                std::thread::sleep(Duration::from_millis(50));
                                continue;
                            }
                            let name = place(k, &format!("r{round}-n{k}-{i}"));
                            let len = if i % 20 == 19 {
                                200_000
                            } else {
                                1000 + (i * 7919) % 30_000
                            };
                            let started = Instant::now();
                            // Even when the owner dies holding this file's unsynced changes:
                            // the client hands them to the new owner at its fence.
                            match write_synced(&root, &name, len) {
                                Ok(()) => done.push((name, len)),
                                Err(e) => panic!("round {round}: node {k}: {name}: {e}"),
                            }
                            longest = longest.max(started.elapsed());
                            i += 1;
                            // Paced, so that the writes span the kill and the takeover.
                            std::thread::sleep(Duration::from_millis(60));
                        }
                        (done, longest)
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(300));
            c.ok(&["kill", &victim.to_string()]);
            let _ = std::process::Command::new("umount")
                .args(["-l", mnt(victim).to_str().unwrap()])
                .status();
            wait_for("the victim's expel", SETTLE, || {
                states(c, survivors[0])
                    .get(&format!("node{victim}"))
                    .is_some_and(|(s, epoch)| s == "down" && epoch.is_empty())
            });
            // Some writes after the takeover too.
            std::thread::sleep(Duration::from_millis(500));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let mut written = Vec::new();
            let mut longest = Duration::ZERO;
            for w in writers {
                let (done, l) = w.join().expect("a writer failed");
                written.extend(done);
                longest = longest.max(l);
            }
            (written, longest)
        });
        pauses.push(longest);
        synced.extend(written);
        c.ok(&["start", &victim.to_string()]);
        wait_for("all active after the restart", SETTLE, || {
            all_in_state(c, survivors[0], &all, "active")
        });
        // A client mounts again by itself at start (it was one when it died); a dead
        // owner does not (another node owns the file system now) and joins as a client.
        let again = tessera(
            c,
            victim,
            &["mount", fs, "-T", mnt(victim).to_str().unwrap()],
        );
        let said = String::from_utf8_lossy(&again.stderr).into_owned();
        assert!(
            again.status.success() || said.contains("is already mounted at"),
            "round {round}: node {victim} mounting again: {said}"
        );
        // Every file fsynced so far, from a random mounted node.
        let reader = 1 + next(3);
        for (name, len) in &synced {
            let got = std::fs::read(mnt(reader).join(name)).unwrap_or_else(|e| {
                panic!(
                    "round {round}: node {reader}: {name}: {e}\n{}",
                    c.ok(&["logs", "--lines", "60"])
                )
            });
            assert!(
                got == crash_loop_bytes(name, *len),
                "round {round}: node {reader}: {name} differs"
            );
        }
    }
    eprintln!(
        "{loops} kills, {} files fsynced and verified, no application error; longest \
         write+fsync per round: {pauses:?}",
        synced.len()
    );
    // A pause, never a hang: the bound is loose for a shared CI machine (about 5 s with
    // test timings here).
    let longest = pauses.iter().max().copied().unwrap_or_default();
    assert!(longest < Duration::from_secs(20), "a pause of {longest:?}");
    // Clients first, the manager last; then fsck.
    let owner = owner_of(c, 1, fs).expect("an owner");
    for k in all.iter().copied().filter(|k| *k != owner) {
        tessera_ok(c, k, &["umount", fs]);
    }
    tessera_ok(c, owner, &["umount", fs]);
    let fsck = tessera_ok(c, owner, &["fsck", fs, "-n"]);
    assert!(fsck.contains(" 0 problems found"), "{fsck}");
    tessera_ok(c, 1, &["shutdown", "-a"]);
}
