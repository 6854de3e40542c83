//! The `driver` role: starts the node processes, creates the cluster, measures, kills
//! members with SIGKILL, and prints Markdown tables.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use tessera_transport::wire::hex_encode;
use tessera_transport::{ClusterId, ClusterSecret};

use crate::stats::{grouped, Samples};
use crate::{check_options, monotonic_nanos, option};

/// Renewal requests the flood keeps in flight from one node.
const FLOOD_CONCURRENCY: usize = 32;

struct Options {
    quorum: Vec<usize>,
    rounds: usize,
    fdt: f64,
    lrw: f64,
    changes: usize,
    flood_seconds: f64,
}

impl Options {
    fn parse(args: &[String]) -> anyhow::Result<Options> {
        let known = [
            "--quorum",
            "--rounds",
            "--failure-detection",
            "--lease-recovery-wait",
            "--changes",
            "--flood",
        ];
        check_options(args, &known)?;
        let number = |name: &str, default: f64| -> anyhow::Result<f64> {
            option(args, name).map_or(Ok(default), |v| {
                v.parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v >= 0.0)
                    .ok_or_else(|| anyhow!("{name} {v}: expected a number of at least 0"))
            })
        };
        let quorum = option(args, "--quorum")
            .unwrap_or("3,5")
            .split(',')
            .map(|q| match q.trim().parse::<usize>() {
                Ok(q) if (3..=7).contains(&q) => Ok(q),
                _ => Err(anyhow!("--quorum {q}: quorum node counts from 3 to 7")),
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let options = Options {
            quorum,
            rounds: number("--rounds", 3.0)? as usize,
            fdt: number("--failure-detection", 2.0)?,
            lrw: number("--lease-recovery-wait", 1.0)?,
            changes: number("--changes", 100.0)? as usize,
            flood_seconds: number("--flood", 5.0)?,
        };
        // The node file format and parse_changes check these too; say it before starting.
        anyhow::ensure!(
            (0.5..=300.0).contains(&options.fdt),
            "--failure-detection: 0.5 to 300 s"
        );
        anyhow::ensure!(options.lrw <= 299.0, "--lease-recovery-wait: at most 299 s");
        anyhow::ensure!(options.rounds >= 1, "--rounds: at least 1");
        Ok(options)
    }

    fn renew_every(&self) -> f64 {
        self.fdt / 4.0
    }
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let options = Options::parse(args)?;
    let exe = std::env::current_exe()?;
    let started = Instant::now();
    println!(
        "# cluster timings: failureDetectionTime={} s, leaseRecoveryWait={} s, {} round(s), \
         quorum nodes {:?} (+1 client each)\n",
        options.fdt, options.lrw, options.rounds, options.quorum
    );
    for &quorum in &options.quorum {
        let mut results = QuorumResults::default();
        for round in 0..options.rounds {
            eprintln!("quorum {quorum}, round {}/{}", round + 1, options.rounds);
            measure_round(&exe, &options, quorum, round, &mut results)?;
        }
        print_results(&options, quorum, &results);
    }
    println!("whole run: {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// One line from a node.
#[derive(Debug)]
struct Event {
    node: u32,
    name: String,
    nanos: u64,
    fields: BTreeMap<String, String>,
}

impl Event {
    fn parse(node: u32, line: &str) -> Event {
        let mut words = line.split_whitespace();
        let name = words.next().unwrap_or_default().to_string();
        let nanos = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
        let fields = words
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Event {
            node,
            name,
            nanos,
            fields,
        }
    }

    fn text(&self, key: &str) -> &str {
        self.fields.get(key).map_or("", String::as_str)
    }

    fn number(&self, key: &str) -> u64 {
        self.text(key).parse().unwrap_or(0)
    }
}

/// What the driver knows of the cluster from the events so far.
#[derive(Default)]
struct View {
    active: BTreeMap<u32, bool>,
    /// Each node's applied version and when it reached it.
    version: BTreeMap<u32, (u64, u64)>,
    /// The latest takeover applied anywhere: manager and term.
    manager: Option<(u32, u64)>,
}

impl View {
    fn apply(&mut self, e: &Event) {
        match e.name.as_str() {
            "lease" => {
                self.active.insert(e.node, e.text("state") == "Active");
            }
            "version" => {
                self.version.insert(e.node, (e.number("version"), e.nanos));
            }
            "takeover" => {
                let term = e.number("term");
                if e.number("manager") != 0 && self.manager.is_none_or(|(_, t)| t < term) {
                    self.manager = Some((e.number("manager") as u32, term));
                }
            }
            _ => {}
        }
    }
}

struct Process {
    number: u32,
    child: Child,
    stdin: ChildStdin,
    alive: bool,
}

/// Node processes of one cluster, killed (SIGKILL) when dropped.
struct Cluster {
    dir: tempfile::TempDir,
    processes: Vec<Process>,
    events: mpsc::Receiver<Event>,
    view: View,
    quorum: usize,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for p in self.processes.iter_mut().filter(|p| p.alive) {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

impl Cluster {
    /// Starts `quorum` quorum-manager nodes and one client, and creates the cluster.
    fn launch(exe: &Path, options: &Options, quorum: usize) -> anyhow::Result<Cluster> {
        let dir = tempfile::Builder::new()
            .prefix("tessera-cluster-timings")
            .tempdir()?;
        let cluster_id = hex_encode(&ClusterId::generate().0);
        let secret = hex_encode(ClusterSecret::generate().as_bytes());
        let (events_tx, events) = mpsc::channel();
        let mut processes = Vec::new();
        for number in 1..=quorum as u32 + 1 {
            let log = std::fs::File::create(dir.path().join(format!("node{number}.log")))?;
            let store = dir.path().join(format!("node{number}.redb"));
            let mut child = std::process::Command::new(exe)
                .arg("node")
                .args(["--number", &number.to_string()])
                .args(["--name", &format!("node{number}")])
                .arg("--store")
                .arg(&store)
                .args(["--cluster-id", &cluster_id, "--secret", &secret])
                .args(["--failure-detection", &options.fdt.to_string()])
                .args(["--lease-recovery-wait", &options.lrw.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(log)
                .spawn()
                .context("starting a node process")?;
            let stdout = child.stdout.take().expect("stdout is piped");
            let stdin = child.stdin.take().expect("stdin is piped");
            let tx = events_tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(Event::parse(number, &line)).is_err() {
                        break;
                    }
                }
            });
            processes.push(Process {
                number,
                child,
                stdin,
                alive: true,
            });
        }
        let mut cluster = Cluster {
            dir,
            processes,
            events,
            view: View::default(),
            quorum,
        };
        cluster.create(options)?;
        Ok(cluster)
    }

    fn create(&mut self, options: &Options) -> anyhow::Result<()> {
        let mut ports = BTreeMap::new();
        let all = self.processes.len();
        self.wait_for("every node ready", Duration::from_secs(60), |_, e| {
            if e.name == "ready" {
                ports.insert(e.node, e.number("port"));
            }
            (ports.len() == all).then_some(())
        })?;
        let entries: Vec<String> = ports
            .iter()
            .map(|(n, port)| {
                let designation = if *n as usize <= self.quorum {
                    "quorum-manager"
                } else {
                    "client"
                };
                format!("node{n}:{designation}:127.0.0.1:{port}")
            })
            .collect();
        let command = format!(
            "bootstrap {} {} {}",
            options.fdt,
            options.lrw,
            entries.join(",")
        );
        self.send(1, &command)?;
        let result = self.wait_for("bootstrap", Duration::from_secs(120), |_, e| {
            (e.name == "bootstrapped").then(|| e.text("result").to_string())
        })?;
        anyhow::ensure!(result == "ok", "bootstrap failed: {result}");
        let limit = Duration::from_secs_f64(60.0 + 4.0 * options.fdt);
        self.wait_view("every node active under a manager", limit, |c| {
            c.view.manager.is_some() && c.alive().all(|n| c.view.active.get(&n) == Some(&true))
        })
    }

    fn alive(&self) -> impl Iterator<Item = u32> + '_ {
        self.processes.iter().filter(|p| p.alive).map(|p| p.number)
    }

    fn is_alive(&self, node: u32) -> bool {
        self.processes.iter().any(|p| p.number == node && p.alive)
    }

    fn pid(&self, node: u32) -> u32 {
        self.processes[node as usize - 1].child.id()
    }

    fn send(&mut self, node: u32, line: &str) -> anyhow::Result<()> {
        let p = &mut self.processes[node as usize - 1];
        assert_eq!(p.number, node, "processes are kept in node order");
        writeln!(p.stdin, "{line}").with_context(|| format!("telling node {node} `{line}`"))?;
        p.stdin.flush()?;
        Ok(())
    }

    /// SIGKILL, and the monotonic time just before it.
    fn kill(&mut self, node: u32) -> anyhow::Result<u64> {
        let p = &mut self.processes[node as usize - 1];
        assert!(p.alive, "node {node} is killed once");
        let at = monotonic_nanos();
        p.child.kill()?;
        p.child.wait()?;
        p.alive = false;
        Ok(at)
    }

    fn next(&mut self, what: &str, deadline: Instant) -> anyhow::Result<Event> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.events.recv_timeout(left) {
            Ok(event) => {
                self.view.apply(&event);
                Ok(event)
            }
            Err(_) => Err(anyhow!(
                "{what}: not within the time limit{}",
                self.log_tails()
            )),
        }
    }

    /// Consumes events until `found` returns something.
    fn wait_for<T>(
        &mut self,
        what: &str,
        limit: Duration,
        mut found: impl FnMut(&Cluster, &Event) -> Option<T>,
    ) -> anyhow::Result<T> {
        let deadline = Instant::now() + limit;
        loop {
            let event = self.next(what, deadline)?;
            if event.name == "error" {
                bail!("node {} refused a command: {event:?}", event.node);
            }
            if let Some(value) = found(self, &event) {
                return Ok(value);
            }
        }
    }

    /// Consumes events until `done` holds of the cluster.
    fn wait_view(
        &mut self,
        what: &str,
        limit: Duration,
        done: impl Fn(&Cluster) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        while !done(self) {
            self.next(what, deadline)?;
        }
        Ok(())
    }

    /// Lets events pile up for `d`, then takes them into the view.
    fn pause(&mut self, d: Duration) {
        std::thread::sleep(d);
        while let Ok(event) = self.events.try_recv() {
            self.view.apply(&event);
        }
    }

    fn log_tails(&self) -> String {
        let mut text = String::new();
        for p in &self.processes {
            let path = self.dir.path().join(format!("node{}.log", p.number));
            let log = std::fs::read_to_string(&path).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(8).collect();
            for line in tail.into_iter().rev() {
                text.push_str(&format!("\n  node{}: {line}", p.number));
            }
        }
        text
    }

    /// User plus system CPU seconds a node process has used.
    fn cpu_seconds(&self, node: u32) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.pid(node))).unwrap_or_default();
        let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<u64> = after_name
            .split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        // After the name: state is field 3 of proc(5), utime 14, stime 15.
        let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
        // SAFETY: sysconf only reads a system constant.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
        ticks as f64 / per_second as f64
    }

    /// Every node's traffic counters, by node and kind.
    fn counters(&mut self) -> anyhow::Result<BTreeMap<u32, BTreeMap<String, Tally>>> {
        let alive: Vec<u32> = self.alive().collect();
        for &n in &alive {
            self.send(n, "counters")?;
        }
        let mut by_node: BTreeMap<u32, BTreeMap<String, Tally>> = BTreeMap::new();
        let mut ended = 0;
        self.wait_for("traffic counters", Duration::from_secs(30), |_, e| {
            match e.name.as_str() {
                "traffic" => {
                    let tally = Tally {
                        calls: e.number("calls"),
                        call_bytes: e.number("call_bytes"),
                        served: e.number("served"),
                        served_bytes: e.number("served_bytes"),
                    };
                    by_node
                        .entry(e.node)
                        .or_default()
                        .insert(e.text("kind").to_string(), tally);
                }
                "traffic-end" => ended += 1,
                _ => {}
            }
            (ended == alive.len()).then_some(())
        })?;
        Ok(by_node)
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    calls: u64,
    call_bytes: u64,
    served: u64,
    served_bytes: u64,
}

/// Lease traffic in a quiet window.
struct TrafficWindow {
    seconds: f64,
    nodes: usize,
    manager: u32,
    by_node: BTreeMap<u32, BTreeMap<String, Tally>>,
    manager_cpu: f64,
}

/// The manager under a flood of renewals.
struct Flood {
    seconds: f64,
    grants: u64,
    failed: u64,
    manager_cpu: f64,
    heartbeats: u64,
}

#[derive(Default)]
struct QuorumResults {
    startup: Samples,
    elected: Samples,
    takeover: Samples,
    first_grant: Samples,
    manager_expel: Samples,
    client_expel: Samples,
    /// Survivors' lease lapses during failovers, and the longest per failover.
    lease_gaps: u64,
    longest_gap: Samples,
    commit_at_manager: Samples,
    applied_from_manager: Samples,
    commit_from_other: Samples,
    applied_from_other: Samples,
    traffic: Option<TrafficWindow>,
    flood: Option<Flood>,
}

fn measure_round(
    exe: &Path,
    options: &Options,
    quorum: usize,
    round: usize,
    results: &mut QuorumResults,
) -> anyhow::Result<()> {
    let launched = Instant::now();
    let mut cluster = Cluster::launch(exe, options, quorum)?;
    results.startup.push(launched.elapsed());
    if round == 0 {
        results.traffic = Some(measure_traffic(&mut cluster, options)?);
        if options.flood_seconds > 0.0 {
            results.flood = Some(measure_flood(&mut cluster, options)?);
        }
    }
    measure_changes(&mut cluster, options, round, results)?;
    let client = quorum as u32 + 1;
    let killed_at = cluster.kill(client)?;
    let limit = Duration::from_secs_f64(30.0 + 4.0 * options.fdt);
    let expelled = cluster.wait_for("the killed client's expel", limit, |c, e| {
        let client_gone = e.name == "expelled" && e.number("node") == u64::from(client);
        (client_gone && c.is_alive(e.node)).then_some(e.nanos)
    })?;
    results.client_expel.push(since(killed_at, expelled));
    measure_failover(&mut cluster, options, results)
}

fn since(start: u64, end: u64) -> Duration {
    Duration::from_nanos(end.saturating_sub(start))
}

/// Counts messages and bytes over two renewal periods (at least 5 s) of a quiet cluster.
fn measure_traffic(cluster: &mut Cluster, options: &Options) -> anyhow::Result<TrafficWindow> {
    let (manager, _) = cluster
        .view
        .manager
        .expect("a created cluster has a manager");
    let alive: Vec<u32> = cluster.alive().collect();
    for &n in &alive {
        cluster.send(n, "reset")?;
    }
    // Let the resets land before the clock starts.
    cluster.pause(Duration::from_millis(200));
    let cpu_before = cluster.cpu_seconds(manager);
    let started = Instant::now();
    cluster.pause(Duration::from_secs_f64(
        (2.0 * options.renew_every()).max(5.0),
    ));
    let by_node = cluster.counters()?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(TrafficWindow {
        seconds,
        nodes: alive.len(),
        manager,
        by_node,
        manager_cpu: cluster.cpu_seconds(manager) - cpu_before,
    })
}

/// Renewals as fast as a non-manager node can send them, and the manager's CPU for them.
fn measure_flood(cluster: &mut Cluster, options: &Options) -> anyhow::Result<Flood> {
    let (manager, _) = cluster
        .view
        .manager
        .expect("a created cluster has a manager");
    let sender = (1..=cluster.quorum as u32)
        .find(|n| *n != manager)
        .expect("three or more quorum nodes");
    cluster.send(manager, "reset")?;
    cluster.pause(Duration::from_millis(200));
    let cpu_before = cluster.cpu_seconds(manager);
    let started = Instant::now();
    cluster.send(
        sender,
        &format!("flood {} {FLOOD_CONCURRENCY}", options.flood_seconds),
    )?;
    let limit = Duration::from_secs_f64(options.flood_seconds + 30.0);
    let (grants, failed) = cluster.wait_for("the flood of renewals", limit, |_, e| {
        (e.name == "flooded" && e.node == sender).then(|| {
            (
                e.number("grants"),
                e.number("refusals") + e.number("errors"),
            )
        })
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let manager_cpu = cluster.cpu_seconds(manager) - cpu_before;
    let counters = cluster.counters()?;
    let heartbeats = counters
        .get(&manager)
        .and_then(|k| k.get("heartbeat"))
        .map_or(0, |t| t.calls);
    Ok(Flood {
        seconds,
        grants,
        failed,
        manager_cpu,
        heartbeats,
    })
}

/// `config set leaseRecoveryWait=...` alternately at the manager and at the client, each
/// to its commit and to its application on every node.
fn measure_changes(
    cluster: &mut Cluster,
    options: &Options,
    round: usize,
    results: &mut QuorumResults,
) -> anyhow::Result<()> {
    let (manager, _) = cluster
        .view
        .manager
        .expect("a created cluster has a manager");
    let client = cluster.quorum as u32 + 1;
    for i in 0..options.changes {
        let proposer = if i % 2 == 0 { manager } else { client };
        // A new value each time (so each is a change), within a second of the setting.
        let step = (round * options.changes + i) % 999 + 1;
        let value = format!("{:.3}", options.lrw + step as f64 / 1000.0);
        cluster.send(proposer, &format!("propose leaseRecoveryWait={value}"))?;
        let limit = Duration::from_secs(60);
        let (start, end, version) = cluster
            .wait_for("a configuration change", limit, |_, e| {
                (e.name == "proposed" && e.node == proposer).then(|| {
                    let version = e.number("version");
                    (
                        e.number("start"),
                        e.nanos,
                        version,
                        e.text("error").to_string(),
                    )
                })
            })
            .and_then(|(start, end, version, error)| match version {
                0 => Err(anyhow!("the change was refused: {error}")),
                v => Ok((start, end, v)),
            })?;
        cluster.wait_view("the change applied everywhere", limit, |c| {
            c.alive()
                .all(|n| c.view.version.get(&n).is_some_and(|(v, _)| *v >= version))
        })?;
        let applied = cluster
            .alive()
            .filter_map(|n| cluster.view.version.get(&n).map(|(_, at)| *at))
            .max()
            .expect("live nodes");
        let (commit, everywhere) = if proposer == manager {
            (
                &mut results.commit_at_manager,
                &mut results.applied_from_manager,
            )
        } else {
            (
                &mut results.commit_from_other,
                &mut results.applied_from_other,
            )
        };
        commit.push(since(start, end));
        everywhere.push(since(start, applied.max(end)));
    }
    Ok(())
}

/// Kill -9 of the manager: when a survivor knows a new leader, sees its takeover applied,
/// gets a grant of the new term, and sees the dead manager expelled.
fn measure_failover(
    cluster: &mut Cluster,
    options: &Options,
    results: &mut QuorumResults,
) -> anyhow::Result<()> {
    let (manager, term) = cluster
        .view
        .manager
        .expect("a created cluster has a manager");
    let killed_at = cluster.kill(manager)?;
    let old = u64::from(manager);
    let limit = Duration::from_secs_f64(30.0 + 4.0 * options.fdt);
    let mut firsts: BTreeMap<&'static str, u64> = BTreeMap::new();
    // Survivors whose lease ran out, since when; and the longest such gap.
    let mut lapsed: BTreeMap<u32, u64> = BTreeMap::new();
    let mut longest_gap = 0;
    cluster.wait_for("a new manager and the old one's expel", limit, |c, e| {
        if !c.is_alive(e.node) || e.nanos < killed_at {
            return None;
        }
        let name = match e.name.as_str() {
            "leader" if ![0, old].contains(&e.number("leader")) => Some("elected"),
            "takeover" if e.number("term") > term => Some("takeover"),
            "grant" if e.number("term") > term => Some("grant"),
            "expelled" if e.number("node") == old => Some("expel"),
            "lease" if e.text("state") != "Active" => {
                lapsed.insert(e.node, e.nanos);
                results.lease_gaps += 1;
                None
            }
            "lease" => {
                let gap = lapsed
                    .remove(&e.node)
                    .map_or(0, |from| e.nanos.saturating_sub(from));
                longest_gap = longest_gap.max(gap);
                None
            }
            _ => None,
        };
        if let Some(name) = name {
            firsts.entry(name).or_insert(e.nanos);
        }
        let all_active = c.alive().all(|n| c.view.active.get(&n) == Some(&true));
        (firsts.len() == 4 && all_active).then_some(())
    })?;
    results.longest_gap.push(Duration::from_nanos(longest_gap));
    results.elected.push(since(killed_at, firsts["elected"]));
    results.takeover.push(since(killed_at, firsts["takeover"]));
    results.first_grant.push(since(killed_at, firsts["grant"]));
    results
        .manager_expel
        .push(since(killed_at, firsts["expel"]));
    Ok(())
}

fn print_results(options: &Options, quorum: usize, r: &QuorumResults) {
    let fdt = options.fdt;
    println!(
        "## {quorum} quorum-manager nodes + 1 client, failureDetectionTime {fdt} s \
         ({} round(s))\n",
        r.startup.len()
    );
    println!(
        "| after kill -9 of | until | seconds, median (min–max) | / failureDetectionTime \
         | each round, s |"
    );
    println!("| --- | --- | ---: | ---: | --- |");
    let rows = [
        ("the manager", "a survivor follows a new leader", &r.elected),
        (
            "the manager",
            "the new manager's Takeover applied",
            &r.takeover,
        ),
        (
            "the manager",
            "a survivor holds a grant of the new term",
            &r.first_grant,
        ),
        (
            "the manager",
            "the dead manager's Expel applied",
            &r.manager_expel,
        ),
        ("the client", "its Expel applied", &r.client_expel),
    ];
    for (whom, until, samples) in rows {
        println!(
            "| {whom} | {until} | {} | {} | {} |",
            samples.range(1.0, 2),
            samples.range(fdt, 2),
            samples.list(1.0, 2)
        );
    }
    println!(
        "\nSurvivors' leases ran out {} time(s) during the failovers (no grant while the new \
         manager is elected); the longest lapse per failover, s: {}. Cluster start \
         (processes to every node active): {} s.\n",
        r.lease_gaps,
        r.longest_gap.list(1.0, 2),
        r.startup.range(1.0, 1)
    );
    print_changes(r);
    if let Some(t) = &r.traffic {
        print_traffic(options, quorum, t, r.flood.as_ref());
    }
}

fn print_changes(r: &QuorumResults) {
    println!("| config set (leaseRecoveryWait) | samples | median ms | p99 ms | max ms |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    let rows = [
        ("at the manager, to its commit", &r.commit_at_manager),
        (
            "at the manager, to applied on every node",
            &r.applied_from_manager,
        ),
        ("at the client, to its commit", &r.commit_from_other),
        (
            "at the client, to applied on every node",
            &r.applied_from_other,
        ),
    ];
    for (what, s) in rows {
        let ms = |p: f64| {
            s.percentile(p)
                .map_or("–".into(), |v| format!("{:.1}", v * 1e3))
        };
        println!(
            "| {what} | {} | {} | {} | {} |",
            s.len(),
            ms(50.0),
            ms(99.0),
            ms(100.0)
        );
    }
    println!();
}

fn print_traffic(options: &Options, quorum: usize, t: &TrafficWindow, flood: Option<&Flood>) {
    let renew = |n: u32| t.by_node.get(&n).and_then(|k| k.get("renew")).copied();
    let others: Vec<Tally> = t
        .by_node
        .keys()
        .filter(|n| **n != t.manager)
        .filter_map(|n| renew(*n))
        .collect();
    let per_node_calls =
        others.iter().map(|x| x.calls).sum::<u64>() as f64 / others.len().max(1) as f64 / t.seconds;
    let renew_bytes = others.iter().map(|x| x.call_bytes).sum::<u64>() as f64
        / others.iter().map(|x| x.calls).sum::<u64>().max(1) as f64;
    let m = t.by_node.get(&t.manager).cloned().unwrap_or_default();
    let total = |f: fn(&Tally) -> u64| m.values().map(f).sum::<u64>() as f64 / t.seconds;
    let (msgs, bytes) = (
        total(|x| x.calls + x.served),
        total(|x| x.call_bytes + x.served_bytes),
    );
    println!(
        "Lease traffic over {:.1} s, {} nodes (renewal every {:.2} s): each other node sends \
         {:.3} renewals/s of {renew_bytes:.0} bytes (request + reply, framed). The manager \
         (node {}) exchanges {msgs:.2} messages/s, {} bytes/s in all, and used {:.2} % of \
         a core:\n",
        t.seconds,
        t.nodes,
        options.renew_every(),
        per_node_calls,
        t.manager,
        grouped(bytes),
        100.0 * t.manager_cpu / t.seconds
    );
    println!("| manager, by kind | sent/s | answered/s | bytes/s | bytes per message |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for (kind, x) in &m {
        let messages = (x.calls + x.served).max(1) as f64;
        let bytes = (x.call_bytes + x.served_bytes) as f64;
        println!(
            "| {kind} | {:.2} | {:.2} | {} | {:.0} |",
            x.calls as f64 / t.seconds,
            x.served as f64 / t.seconds,
            grouped(bytes / t.seconds),
            bytes / messages
        );
    }
    println!();
    if let Some(f) = flood {
        let rate = f.grants as f64 / f.seconds;
        println!(
            "Flood: {FLOOD_CONCURRENCY} renewers on one node for {:.1} s got {} grants \
             ({rate:.0}/s, {} failed); the manager used {:.2} CPU s ({:.0} µs per grant) and \
             sent {:.2} heartbeats per grant (leadership confirmations shared by concurrent \
             renewals).\n",
            f.seconds,
            f.grants,
            f.failed,
            f.manager_cpu,
            1e6 * f.manager_cpu / f.grants.max(1) as f64,
            f.heartbeats as f64 / f.grants.max(1) as f64
        );
    }
    print_extrapolation(options, quorum, renew_bytes, flood);
}

/// Renewals, their bytes and the CPU they cost at the manager of a large cluster, from
/// the measured bytes per renewal and CPU per grant under the flood. Every node is also a
/// Raft learner, so the manager sends each one a heartbeat every F/16; the last column
/// prices every exchange (renewal or heartbeat) at the flood's CPU per grant.
fn print_extrapolation(options: &Options, quorum: usize, renew_bytes: f64, flood: Option<&Flood>) {
    let cpu_per_grant = flood.map(|f| f.manager_cpu / f.grants.max(1) as f64);
    let heartbeat_every = options.fdt / 16.0;
    println!(
        "| nodes | renewals/s at the manager | renewal bytes/s | Raft heartbeats/s to \
         learners | manager CPU, renewals only | manager CPU, renewals + heartbeats |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    let share = |exchanges: f64| {
        cpu_per_grant.map_or("–".into(), |c| format!("{:.1} %", 100.0 * c * exchanges))
    };
    for nodes in [1_000.0, 10_000.0] {
        let renewals = nodes / options.renew_every();
        let heartbeats = (nodes - quorum as f64) / heartbeat_every;
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            grouped(nodes),
            grouped(renewals),
            grouped(renewals * renew_bytes),
            grouped(heartbeats),
            share(renewals),
            share(renewals + heartbeats)
        );
    }
    println!();
}
