//! The certification wave at fleet scale (issue #44, item 3): 2,000 simulated nodes of one
//! profile take invasive slots through the real rules — `MaxConcurrentInvasive::resolve`,
//! the fleet controller's `invasive_status` queue, the daemon's `slot_turn` and the slot
//! order `slot_order` — while a model stands in for what no machine here has: the run
//! itself and the jobs.
//!
//! Model (stated, not measured):
//! - a run lasts `--run-min`..`--run-max` minutes, uniform (default 2–4: the issue's "a cold
//!   fleet of 2,000 takes about a day at 4 slots" is ~3 minutes a run);
//! - the daemon's timing as its defaults: a held-back node retries after 60–90 s (the
//!   passive interval with 50% jitter), a certified node is due after `intervalSeconds`
//!   (6 h) plus up to 10% jitter, a waiting node renews its mark every 5 minutes; the fleet
//!   controller rewrites `status.invasive` every 60 s;
//! - jobs: with `--busy 0.3`, each node alternates idle and busy spells, exponential with
//!   means 14 h and 6 h (30% busy); a job does not start on a node mid-run (the `testing`
//!   taint) and a busy node takes no slot.
//!
//! Run: `cargo bench -p railguard-prober --bench certification_wave`
//! (options: `-- --nodes 2000 --days 7 --run-min 2 --run-max 4 --seed 1`).

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use railguard_api::invasive::{
    invasive_status, slot_turn, InvasiveStatus, MaxConcurrentInvasive, WaitingNode, WAITING_RENEW,
};
use railguard_prober::certify::slots::slot_order;

const STEP: f64 = 10.0;
const INTERVAL: f64 = 6.0 * 3600.0;
const TTL: f64 = 24.0 * 3600.0;
const FLEET_EVERY: f64 = 60.0;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        // xorshift64*: enough for a model, and the same for every run of a seed.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
    fn uniform(&mut self, a: f64, b: f64) -> f64 {
        a + (b - a) * self.next()
    }
    fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.next()).ln()
    }
}

#[derive(Clone, Copy)]
struct Options {
    nodes: usize,
    days: f64,
    run_min: f64,
    run_max: f64,
    seed: u64,
}

#[derive(Clone, Copy, PartialEq)]
enum Order {
    /// The fleet controller's queue: oldest certificate first.
    Queue,
    /// The same slots, no queue: first come, first served.
    FirstCome,
    /// No fleet controller: no `status.invasive` at all.
    NoFleet,
}

struct Node {
    name: String,
    certified_at: Option<f64>,
    due_at: f64,
    next_attempt: f64,
    running_until: Option<(f64, usize)>,
    busy: bool,
    next_job_change: f64,
    mark_renewed: Option<f64>,
    /// Since when the node is due and idle: a run's wait is counted from here.
    due_since: f64,
}

struct Outcome {
    /// Seconds until every idle node held a certificate (cold start).
    wave: Option<f64>,
    /// Ages of idle nodes' certificates sampled in steady state, hours.
    idle_ages: Vec<f64>,
    /// Ages of all nodes' certificates sampled in steady state, hours.
    all_ages: Vec<f64>,
    /// Samples of idle nodes past the TTL.
    idle_expired: usize,
    most_running: usize,
    /// Minutes from due (and idle) to the run's start, steady state.
    waits: Vec<f64>,
}

fn at(base: Timestamp, t: f64) -> Timestamp {
    base + SignedDuration::from_secs_f64(t)
}

fn simulate(cap: MaxConcurrentInvasive, order: Order, busy: f64, o: Options) -> Outcome {
    let mut rng = Rng(o.seed.max(1));
    let base: Timestamp = "2026-12-07T00:00:00Z"
        .parse()
        .unwrap_or(Timestamp::UNIX_EPOCH);
    let mut nodes: Vec<Node> = (0..o.nodes)
        .map(|i| Node {
            name: format!("gpu-{i:04}"),
            certified_at: None,
            due_at: 0.0,
            // Daemons start over the first five minutes (a DaemonSet rollout).
            next_attempt: rng.uniform(0.0, 300.0),
            running_until: None,
            busy: false,
            next_job_change: 0.0,
            mark_renewed: None,
            due_since: 0.0,
        })
        .collect();
    for n in &mut nodes {
        n.next_job_change = if busy > 0.0 {
            rng.exp(14.0 * 3600.0)
        } else {
            f64::INFINITY
        };
    }
    let most = cap.most_slots() as usize;
    let mut slots: Vec<Option<usize>> = vec![None; most];
    let orders: Vec<Vec<usize>> = nodes.iter().map(|n| slot_order(most, &n.name)).collect();
    let mut status: Option<InvasiveStatus> = None;
    let mut next_fleet = 0.0;
    let mut waiting: BTreeMap<usize, f64> = BTreeMap::new();
    let end = o.days * 86400.0;
    let steady_from = end - 4.0 * 86400.0;
    let mut out = Outcome {
        wave: None,
        idle_ages: Vec::new(),
        all_ages: Vec::new(),
        idle_expired: 0,
        most_running: 0,
        waits: Vec::new(),
    };
    let mut next_sample = steady_from;
    let mut t = 0.0;
    while t < end {
        // Runs that end; jobs that come and go.
        for n in nodes.iter_mut() {
            if let Some((until, slot)) = n.running_until {
                if t >= until {
                    n.running_until = None;
                    slots[slot] = None;
                    n.certified_at = Some(t);
                    n.due_at = t + INTERVAL * (1.0 + 0.1 * rng.next());
                    n.next_attempt = n.due_at;
                    n.due_since = n.due_at;
                }
            }
            if t >= n.next_job_change && n.running_until.is_none() {
                n.busy = !n.busy;
                let mean = if n.busy { 6.0 } else { 14.0 } * 3600.0;
                n.next_job_change = t + rng.exp(mean * busy.max(1e-9) / 0.3);
                if !n.busy {
                    n.next_attempt = n.next_attempt.max(t);
                    n.due_since = n.due_at.max(t);
                }
            }
        }
        // The fleet controller: slots resolved against the nodes, the queue of marks.
        if order != Order::NoFleet && t >= next_fleet {
            let list = waiting
                .iter()
                .filter(|_| order == Order::Queue)
                .filter(|(_, since)| t - **since <= 15.0 * 60.0)
                .map(|(i, _)| WaitingNode {
                    name: nodes[*i].name.clone(),
                    certified_at: nodes[*i].certified_at.map(|c| at(base, c)),
                })
                .collect();
            let mut s = invasive_status(cap, o.nodes as u32, list);
            s.computed_at = Some(Time(at(base, t)));
            status = Some(s);
            next_fleet = t + FLEET_EVERY;
        }
        // Daemons whose attempt is due.
        let now = at(base, t);
        for (i, n) in nodes.iter_mut().enumerate() {
            if n.busy || n.running_until.is_some() {
                if n.busy && waiting.remove(&i).is_some() {
                    n.mark_renewed = None;
                }
                continue;
            }
            if t < n.next_attempt || t < n.due_at {
                continue;
            }
            let turn = slot_turn(cap, status.as_ref(), &n.name, now);
            let free = turn
                .may_take
                .then(|| {
                    let count = turn.slots as usize;
                    orders[i]
                        .iter()
                        .copied()
                        .filter(|s| *s < count)
                        .find(|s| slots[*s].is_none())
                })
                .flatten();
            match free {
                Some(s) => {
                    if t >= steady_from {
                        out.waits.push((t - n.due_since) / 60.0);
                    }
                    slots[s] = Some(i);
                    n.running_until = Some((t + 60.0 * rng.uniform(o.run_min, o.run_max), s));
                    waiting.remove(&i);
                    n.mark_renewed = None;
                }
                None => {
                    let renew = WAITING_RENEW.as_secs_f64();
                    if n.mark_renewed.is_none_or(|r| t - r >= renew) {
                        waiting.insert(i, t);
                        n.mark_renewed = Some(t);
                    }
                    n.next_attempt = t + rng.uniform(60.0, 90.0);
                }
            }
        }
        let running = slots.iter().filter(|s| s.is_some()).count();
        out.most_running = out.most_running.max(running);
        if out.wave.is_none() && nodes.iter().all(|n| n.busy || n.certified_at.is_some()) {
            out.wave = Some(t);
        }
        if t >= next_sample {
            for n in &nodes {
                let age = n.certified_at.map_or(t, |c| t - c) / 3600.0;
                out.all_ages.push(age);
                if !n.busy {
                    out.idle_ages.push(age);
                    if age * 3600.0 > TTL {
                        out.idle_expired += 1;
                    }
                }
            }
            next_sample = t + 600.0;
        }
        t += STEP;
    }
    out
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i]
}

fn main() {
    let mut o = Options {
        nodes: 2000,
        days: 7.0,
        run_min: 2.0,
        run_max: 4.0,
        seed: 1,
    };
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i + 1 < args.len() {
        let v = &args[i + 1];
        match args[i].as_str() {
            "--nodes" => o.nodes = v.parse().unwrap_or(o.nodes),
            "--days" => o.days = v.parse().unwrap_or(o.days),
            "--run-min" => o.run_min = v.parse().unwrap_or(o.run_min),
            "--run-max" => o.run_max = v.parse().unwrap_or(o.run_max),
            "--seed" => o.seed = v.parse().unwrap_or(o.seed),
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    println!(
        "certification wave: {} nodes, runs {}-{} min, interval 6 h, TTL 24 h, {} days, seed {}",
        o.nodes, o.run_min, o.run_max, o.days, o.seed
    );
    println!();
    println!("| maxConcurrentInvasive | order | slots | cold wave (idle fleet) | steady, 30% busy: idle cert age p50 / p99 | wait from due to run p50 / p99 / max | idle past TTL | most running |");
    println!("|---|---|---|---|---|---|---|---|");
    use MaxConcurrentInvasive::{Count, Percent};
    let cases = [
        (Count(4), Order::Queue),
        (Count(4), Order::FirstCome),
        (Count(16), Order::Queue),
        (Percent(1), Order::Queue),
        (Percent(2), Order::Queue),
        (Percent(5), Order::Queue),
        (Percent(5), Order::FirstCome),
        (Percent(5), Order::NoFleet),
        (Percent(10), Order::Queue),
    ];
    for (cap, order) in cases {
        let cold = simulate(cap, order, 0.0, Options { days: 3.0, ..o });
        let mut steady = simulate(cap, order, 0.3, o);
        let wave = cold.wave.map_or_else(
            || "> 3 days".to_string(),
            |s| format!("{:.1} h", s / 3600.0),
        );
        let samples = steady.idle_ages.len().max(1);
        let p50 = quantile(&mut steady.idle_ages, 0.5);
        let p99 = quantile(&mut steady.idle_ages, 0.99);
        let w50 = quantile(&mut steady.waits, 0.5);
        let w99 = quantile(&mut steady.waits, 0.99);
        let wmax = quantile(&mut steady.waits, 1.0);
        let slots = match order {
            Order::NoFleet => cap.without_fleet(),
            _ => cap.resolve(o.nodes as u32),
        };
        println!(
            "| {cap} | {} | {slots} | {wave} | {p50:.1} / {p99:.1} h | {w50:.0} / {w99:.0} / {wmax:.0} min | {:.1}% | {} |",
            match order {
                Order::Queue => "oldest first",
                Order::FirstCome => "first come",
                Order::NoFleet => "no fleet controller",
            },
            100.0 * steady.idle_expired as f64 / samples as f64,
            steady.most_running.max(cold.most_running),
        );
    }
}
