//! Deterministic simulation of membership, manager election and disk leases: random
//! schedules of kills, restarts, partitions, frozen nodes, message delays and losses, each
//! checked against the safety invariants:
//! - never two managers granting leases in the same term;
//! - no node may do I/O with an epoch the committed configuration has expelled;
//! - every acknowledged configuration change survives;
//!
//! and, once the faults stop, against liveness: one manager, every node active.
//!
//! `TESSERA_SIM_SCHEDULES` sets how many schedules run (CI runs a few dozen, long runs
//! tens of thousands), `TESSERA_SIM_SEED` the first seed (random otherwise; every seed is
//! printed so a failure can be replayed with `TESSERA_SIM_SCHEDULES=1`).

mod sim;

use std::time::Duration;

use rand::Rng;
use sim::Sim;
use tessera_cluster::lease::NodeState;

fn runtime() -> tokio::runtime::Runtime {
    // `TESSERA_LOG=info` shows what the services did, on the virtual clock.
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("TESSERA_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("tokio runtime")
}

fn env_u64(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    Some(
        text.parse()
            .unwrap_or_else(|_| panic!("{name}={text} is not a number")),
    )
}

/// Starts every node, creates the cluster and waits until all are active.
async fn healthy(sim: &mut Sim) {
    for n in sim.numbers() {
        sim.start(n).await;
    }
    sim.bootstrap().await;
    settle(sim, Duration::from_secs(30)).await;
}

/// Runs until every node is active under one manager, or fails after `limit`.
async fn settle(sim: &Sim, limit: Duration) {
    let mut waited = Duration::ZERO;
    while !sim.all_active() {
        assert!(
            waited < limit,
            "seed {}: the cluster did not become active within {limit:?}",
            sim.seed
        );
        sim.run_for(Duration::from_millis(100)).await;
        waited += Duration::from_millis(100);
    }
}

async fn one_schedule(seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64_for(seed);
    let quorum = if rng.gen_bool(0.5) { 3 } else { 5 };
    let clients = rng.gen_range(0..=2);
    let mut sim = Sim::new(seed, quorum, clients);
    healthy(&mut sim).await;
    let nodes = sim.numbers();
    for _ in 0..12 {
        let node = nodes[sim.rng().gen_range(0..nodes.len())];
        match sim.rng().gen_range(0..7) {
            0 => sim.kill(node).await,
            1 => sim.start(node).await,
            2 => {
                let size = sim.rng().gen_range(1..nodes.len());
                let mut side = nodes.clone();
                while side.len() > size {
                    let i = sim.rng().gen_range(0..side.len());
                    side.remove(i);
                }
                sim.partition(&side);
            }
            3 => sim.heal(),
            4 => sim.freeze(node),
            5 => sim.thaw(node),
            _ => {
                for _ in 0..3 {
                    sim.write_document().await;
                }
            }
        }
        let span = Duration::from_millis(sim.rng().gen_range(100..4000));
        sim.run_for(span).await;
    }
    sim.heal();
    for n in sim.numbers() {
        sim.start(n).await;
    }
    settle(&sim, Duration::from_secs(60)).await;
    // Every node has applied every acknowledged change.
    sim.run_for(Duration::from_secs(2)).await;
    for n in sim.numbers() {
        let state = sim.node(n).expect("up").state();
        for key in &sim.acknowledged {
            assert!(
                state.documents.contains_key(key),
                "seed {seed}: node {n} lost acknowledged change {key}"
            );
        }
    }
    let violations = sim.violations();
    assert!(violations.is_empty(), "seed {seed}: {violations:#?}");
    sim.stop_all().await;
}

trait SeedFor {
    fn seed_from_u64_for(seed: u64) -> Self;
}

impl SeedFor for rand::rngs::StdRng {
    /// A generator for the schedule itself, independent of the one `Sim` draws from.
    fn seed_from_u64_for(seed: u64) -> Self {
        rand::SeedableRng::seed_from_u64(seed ^ 0x5eed_5eed_5eed_5eed)
    }
}

#[test]
fn random_schedules_keep_the_safety_invariants() {
    let schedules = env_u64("TESSERA_SIM_SCHEDULES").unwrap_or(24);
    let first = env_u64("TESSERA_SIM_SEED").unwrap_or_else(|| rand::thread_rng().gen());
    for seed in first..first + schedules {
        println!("schedule seed {seed}");
        let result = std::panic::catch_unwind(|| runtime().block_on(one_schedule(seed)));
        if let Err(panic) = result {
            eprintln!(
                "schedule failed; replay with TESSERA_SIM_SEED={seed} TESSERA_SIM_SCHEDULES=1"
            );
            std::panic::resume_unwind(panic);
        }
    }
}

#[test]
fn a_new_manager_is_active_soon_after_the_manager_dies() {
    runtime().block_on(async {
        let mut sim = Sim::new(7, 3, 1);
        healthy(&mut sim).await;
        let manager = sim.node(1).unwrap().status().manager.expect("a manager");
        sim.kill(manager).await;
        let mut waited = Duration::ZERO;
        loop {
            sim.run_for(Duration::from_millis(100)).await;
            waited += Duration::from_millis(100);
            let survivors: Vec<_> = sim
                .numbers()
                .into_iter()
                .filter(|n| *n != manager)
                .map(|n| sim.node(n).unwrap().status())
                .collect();
            let new = survivors[0].manager;
            if new.is_some() && new != Some(manager) && survivors.iter().all(|s| s.manager == new) {
                break;
            }
            assert!(
                waited < Duration::from_secs(10),
                "no new manager within 10 s"
            );
        }
        println!("new manager after {waited:?} (failureDetectionTime 2 s)");
        // The dead manager's incarnation is expelled once it misses failureDetectionTime.
        sim.run_for(Duration::from_secs(4)).await;
        let state = sim.newest_state().unwrap();
        assert!(!state.incarnations.contains_key(&manager), "expelled");
        assert!(sim.violations().is_empty(), "{:#?}", sim.violations());
        sim.stop_all().await;
    });
}

#[test]
fn a_partitioned_minority_goes_arbitrating_and_rejoins_after_heal() {
    runtime().block_on(async {
        let mut sim = Sim::new(11, 3, 0);
        healthy(&mut sim).await;
        let manager = sim.node(1).unwrap().status().manager.expect("a manager");
        let minority = sim.numbers().into_iter().find(|n| *n != manager).unwrap();
        let epoch_before = sim.node(minority).unwrap().status().epoch;
        sim.partition(&[minority]);
        sim.run_for(Duration::from_secs(5)).await;
        assert_eq!(
            sim.node(minority).unwrap().status().state,
            NodeState::Arbitrating
        );
        for n in sim.numbers().into_iter().filter(|n| *n != minority) {
            assert_eq!(sim.node(n).unwrap().status().state, NodeState::Active);
        }
        sim.heal();
        settle(&sim, Duration::from_secs(20)).await;
        let epoch_after = sim.node(minority).unwrap().status().epoch;
        assert!(epoch_after > epoch_before, "it rejoined with a new epoch");
        assert!(sim.violations().is_empty(), "{:#?}", sim.violations());
        sim.stop_all().await;
    });
}
