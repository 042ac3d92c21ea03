//! Many controllers on one real etcd: who acts on a death (one claim, at most two
//! standby checks, not one claim per controller) and who sweeps (one full sweep per
//! period, not one per controller), and that a dead or wedged first rank or sweeper is
//! covered. The claim transaction still decides who fences: every test also checks
//! that the victim was fenced exactly once.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use fenced::controller::{Controller, ControllerStats};
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(20);

/// One daemon (agent + controller) whose controller sweeps every `sweep` (and at
/// start), its presence bound to the agent's lease as `fenced run` binds it.
async fn daemon(c: &Cluster, n: &str, sweep: Duration) -> Daemon {
    let agent = c.agent(n, 0).await;
    let mut cfg = c.controller_cfg(n);
    cfg.own_node = Some(node(n));
    cfg.presence_lease = Some(agent.lease);
    cfg.sweep_interval = sweep;
    let (controller, ctl_task) = c.controller(c.nvme_fencer(n), cfg).await;
    Daemon {
        agent,
        controller,
        ctl_task,
    }
}

/// Waits until every controller of `ctls` follows `count` live controllers.
async fn wait_rosters(ctls: &[&Arc<Controller>], count: usize) {
    wait_until(
        &format!("every controller sees {count} live controllers"),
        WAIT,
        || async {
            ctls.iter().all(|c| {
                let r = c.roster();
                r.is_synced() && r.len() == count
            })
        },
    )
    .await;
}

fn sum(ctls: &[&Arc<Controller>], f: fn(&ControllerStats) -> &std::sync::atomic::AtomicU64) -> u64 {
    ctls.iter()
        .map(|c| f(c.stats()).load(Ordering::Relaxed))
        .sum()
}

/// Deaths each controller is done with (fenced, skipped or left to peers, failed).
fn handled(c: &Controller) -> u64 {
    let s = c.stats();
    s.fenced.load(Ordering::Relaxed)
        + s.skipped.load(Ordering::Relaxed)
        + s.failed.load(Ordering::Relaxed)
}

const HOUR: Duration = Duration::from_secs(3600);

/// Five survivors see one death. Today's controllers each sent a claim transaction
/// (four losers: four round trips beyond the winner's); ranked, the first claims and
/// the two standbys each make one small check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_death_costs_one_claim_and_at_most_three_more_round_trips() {
    let c = Cluster::new();
    let store = c.store().await;
    // Sweeps at start only: every fence here is the watch path's.
    let mut daemons = Vec::new();
    for n in ["n1", "n2", "n3", "n4", "n5", "n6"] {
        daemons.push(daemon(&c, n, HOUR).await);
    }
    let victim = daemons.pop().unwrap();
    let all: Vec<&Arc<Controller>> = daemons
        .iter()
        .map(|d| &d.controller)
        .chain([&victim.controller])
        .collect();
    wait_rosters(&all, 6).await;
    let ctls: Vec<&Arc<Controller>> = daemons.iter().map(|d| &d.controller).collect();
    let order = ctls[0].roster().fence_order("n1", &node("n6"));
    assert_eq!(order.len(), 3);
    assert!(
        !order.contains(&"n6".to_owned()),
        "the victim's own controller never ranks"
    );
    let before: Vec<u64> = ctls.iter().map(|c| handled(c)).collect();

    victim.kill();
    store.revoke(victim.agent.lease).await.unwrap();
    wait_until("n6 fenced", WAIT, || async {
        generation(&store, "n6").await == 1
    })
    .await;
    // Every survivor is done with the DELETE (standbys check after 1 and 2 steps).
    wait_until("every survivor handled the death", WAIT, || async {
        ctls.iter().zip(&before).all(|(c, b)| handled(c) == b + 1)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    assert_eq!(
        fences_of(&store, "n6").await.len(),
        1,
        "fenced exactly once"
    );
    let winners: Vec<&&Arc<Controller>> = ctls
        .iter()
        .filter(|c| c.stats().fenced.load(Ordering::Relaxed) == 1)
        .collect();
    assert_eq!(winners.len(), 1);
    let audit = &fences_of(&store, "n6").await[0];
    assert_eq!(audit["trigger"], "watch");
    let winner_rts = winners[0].stats().watch_round_trips.load(Ordering::Relaxed);
    let total_rts = sum(&ctls, |s| &s.watch_round_trips);
    let checks = sum(&ctls, |s| &s.standby_checks);
    let left = sum(&ctls, |s| &s.left_to_peers);
    eprintln!(
        "one death, 5 survivors: {total_rts} etcd round trips in all, the winner's {winner_rts}, \
         {checks} standby checks, {left} left to peers"
    );
    assert!(
        total_rts <= winner_rts + 3,
        "{total_rts} round trips for one death, the winner's {winner_rts}: more than 3 beyond it"
    );
    assert_eq!(
        (checks, left),
        (2, 4),
        "two standbys checked; all four others left it"
    );
    assert_eq!(
        audit["fenced_by"],
        order[0].as_str(),
        "the first-ranked fenced"
    );
    for d in &daemons {
        d.kill();
    }
}

/// The first-ranked controller is dead but still announced (its agent lives on, so
/// its presence stays): the rank-1 standby finds nothing claimed after one step and
/// fences, on the watch path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_first_rank_is_covered_by_its_standby() {
    let c = Cluster::new();
    let store = c.store().await;
    let mut daemons = Vec::new();
    for n in ["n1", "n2", "n3", "n4", "n5"] {
        daemons.push(daemon(&c, n, HOUR).await);
    }
    let ctls: Vec<&Arc<Controller>> = daemons.iter().map(|d| &d.controller).collect();
    let victim = c.agent("v1", 0).await;
    wait_rosters(&ctls, 5).await;
    let order = ctls[0].roster().fence_order("n1", &node("v1"));
    let first = daemons
        .iter()
        .find(|d| d.agent.node.as_str() == order[0])
        .unwrap();
    first.ctl_task.abort();

    victim.kill();
    let t0 = Instant::now();
    store.revoke(victim.lease).await.unwrap();
    wait_until("v1 fenced", WAIT, || async {
        generation(&store, "v1").await == 1
    })
    .await;
    let took = t0.elapsed();
    let audits = fences_of(&store, "v1").await;
    assert_eq!(audits.len(), 1);
    assert_eq!(audits[0]["trigger"], "watch");
    assert_eq!(
        audits[0]["fenced_by"],
        order[1].as_str(),
        "the rank-1 standby"
    );
    eprintln!("first rank dead: fenced by its standby {took:?} after the lease went");
    // One step (500 ms) plus the fence itself.
    assert!(took < Duration::from_secs(5), "{took:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(generation(&store, "v1").await, 1);
    for d in &daemons {
        d.kill();
    }
}

/// The three controllers that act on a death are all dead but announced: nobody
/// claims on the watch path, and the sweep fences (its sweeper, dead too, is
/// replaced by the next live one in the sweep order once the stamps stop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_death_nobody_acted_on_is_the_sweeps() {
    let c = Cluster::new();
    let store = c.store().await;
    let mut daemons = Vec::new();
    for n in ["n1", "n2", "n3", "n4", "n5"] {
        daemons.push(daemon(&c, n, Duration::from_millis(500)).await);
    }
    let ctls: Vec<&Arc<Controller>> = daemons.iter().map(|d| &d.controller).collect();
    let victim = c.agent("v1", 0).await;
    wait_rosters(&ctls, 5).await;
    let order = ctls[0].roster().fence_order("n1", &node("v1"));
    for d in &daemons {
        if order.contains(&d.agent.node.as_str().to_owned()) {
            d.ctl_task.abort();
        }
    }
    victim.kill();
    store.revoke(victim.lease).await.unwrap();
    wait_until("v1 fenced by the sweep", WAIT, || async {
        generation(&store, "v1").await == 1
    })
    .await;
    let audits = fences_of(&store, "v1").await;
    assert_eq!(audits.len(), 1);
    assert_eq!(audits[0]["trigger"], "sweep");
    assert!(!order.contains(&audits[0]["fenced_by"].as_str().unwrap().to_owned()));
    for d in &daemons {
        d.kill();
    }
}

/// Five controllers, one full sweep per period between them (today: five).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_full_sweep_per_period_across_five_controllers() {
    let c = Cluster::new();
    const PERIOD: Duration = Duration::from_millis(300);
    let mut ctls = Vec::new();
    for i in 1..=5 {
        let mut cfg = c.controller_cfg(&format!("c{i}"));
        cfg.sweep_interval = PERIOD;
        ctls.push(c.controller(c.nvme_fencer("n1"), cfg).await);
    }
    let refs: Vec<&Arc<Controller>> = ctls.iter().map(|(c, _)| c).collect();
    wait_rosters(&refs, 5).await;
    // Past the start-up sweeps (each controller sweeps once when it starts).
    tokio::time::sleep(2 * PERIOD).await;
    let before: Vec<u64> = refs
        .iter()
        .map(|c| c.stats().sweeps.load(Ordering::Relaxed))
        .collect();
    let t0 = Instant::now();
    tokio::time::sleep(20 * PERIOD).await;
    let periods = t0.elapsed().as_secs_f64() / PERIOD.as_secs_f64();
    let swept: Vec<u64> = refs
        .iter()
        .zip(&before)
        .map(|(c, b)| c.stats().sweeps.load(Ordering::Relaxed) - b)
        .collect();
    let total: u64 = swept.iter().sum();
    let skipped = sum(&refs, |s| &s.sweeps_skipped);
    eprintln!(
        "5 controllers, {periods:.1} periods: {total} full sweeps ({swept:?}), {skipped} ticks skipped"
    );
    // Every controller names the same sweeper, and it swept (about) every period.
    let sweeper = refs[0].roster().sweeper("c1");
    assert!(refs.iter().all(|c| c.roster().sweeper("c1") == sweeper));
    let i: usize = sweeper[1..].parse::<usize>().unwrap() - 1;
    assert!(
        swept[i] as f64 >= periods * 0.5,
        "{sweeper} swept: {swept:?}"
    );
    assert!(
        (total as f64) <= periods * 1.3 + 2.0,
        "{total} full sweeps in {periods:.1} periods across 5 controllers: {swept:?}"
    );
    for (_, t) in &ctls {
        t.abort();
    }
}

/// The period's sweeper dies (its presence lease expires): the next in the sweep
/// order sweeps from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sweeper_is_replaced() {
    let c = Cluster::new();
    const PERIOD: Duration = Duration::from_millis(300);
    let mut ctls: Vec<(String, Arc<Controller>, JoinHandle<()>)> = Vec::new();
    for i in 1..=4 {
        let id = format!("c{i}");
        let mut cfg = c.controller_cfg(&id);
        cfg.sweep_interval = PERIOD;
        let (ctl, t) = c.controller(c.nvme_fencer("n1"), cfg).await;
        ctls.push((id, ctl, t));
    }
    let refs: Vec<&Arc<Controller>> = ctls.iter().map(|(_, c, _)| c).collect();
    wait_rosters(&refs, 4).await;
    let mut live = refs[0].roster();
    let sweeper = live.sweeper("c1");
    let k = ctls.iter().position(|(id, _, _)| *id == sweeper).unwrap();
    let (_, _, task) = ctls.remove(k);
    task.abort();
    live.remove(&sweeper);
    let next = live.sweeper("c1");
    let (_, next_ctl, _) = ctls.iter().find(|(id, _, _)| *id == next).unwrap();
    let before = next_ctl.stats().sweeps.load(Ordering::Relaxed);
    // Its presence lease (2 s) expires, then the next in order sweeps every period.
    wait_until(
        &format!("{next} sweeps in place of {sweeper}"),
        WAIT,
        || async { next_ctl.stats().sweeps.load(Ordering::Relaxed) >= before + 5 },
    )
    .await;
    let refs: Vec<&Arc<Controller>> = ctls.iter().map(|(_, c, _)| c).collect();
    wait_rosters(&refs, 3).await;
    for (_, _, t) in &ctls {
        t.abort();
    }
}

/// The period's sweeper stops sweeping but stays announced (its controller task is
/// gone, its agent and so its presence live on): after a few periods without a stamp
/// the next in the sweep order sweeps, and only it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wedged_sweeper_is_replaced_by_the_next_in_order() {
    let c = Cluster::new();
    let mut daemons = Vec::new();
    for n in ["n1", "n2", "n3", "n4"] {
        daemons.push(daemon(&c, n, Duration::from_millis(300)).await);
    }
    let ctls: Vec<&Arc<Controller>> = daemons.iter().map(|d| &d.controller).collect();
    wait_rosters(&ctls, 4).await;
    // Past the start-up sweeps.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let roster = ctls[0].roster();
    let mut by_position: Vec<&Daemon> = daemons.iter().collect();
    by_position.sort_by_key(|d| roster.sweep_position(d.agent.node.as_str()));
    by_position[0].ctl_task.abort();
    let (second, rest) = (by_position[1], &by_position[2..]);
    let before = second.controller.stats().sweeps.load(Ordering::Relaxed);
    let rest_before: u64 = rest
        .iter()
        .map(|d| d.controller.stats().sweeps.load(Ordering::Relaxed))
        .sum();
    wait_until("the second in order sweeps", WAIT, || async {
        second.controller.stats().sweeps.load(Ordering::Relaxed) >= before + 5
    })
    .await;
    let rest_after: u64 = rest
        .iter()
        .map(|d| d.controller.stats().sweeps.load(Ordering::Relaxed))
        .sum();
    assert_eq!(rest_after, rest_before, "only the second took over");
    for d in &daemons {
        d.kill();
    }
}
