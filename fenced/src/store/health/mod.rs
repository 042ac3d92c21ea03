//! Endpoint health: keeps the client's rotation on the etcd endpoints that serve.
//! Passive: the endpoints are probed when the store's own requests say something is
//! wrong (one failed, or went unanswered for too long), and slowly otherwise.
//!
//! Rooms: `signals` (what the store's requests tell), `probe` (one probe and the
//! rotation rule), this file (the probing task and its pace).

mod probe;
mod signals;

pub use probe::{EndpointState, probe_endpoints};
use probe::{Probe, Target, probe_endpoint, rotation};
pub use signals::RequestHook;
pub(super) use signals::{Signals, Watched};

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};

use super::StoreOptions;

/// With every endpoint serving and no trouble signalled, a probe round every random
/// time in this range (spread, so daemons started together do not probe together).
/// It only notices what no request touches: a member that recovered, or one that
/// broke while nothing was sent to it.
const IDLE_PERIOD: (Duration, Duration) = (Duration::from_secs(5), Duration::from_secs(15));

/// While an endpoint does not serve, rounds this often (±25 %), so it is back in
/// rotation soon after it recovers; doubled after each round that found the same, up
/// to [`RECOVERY_MAX`].
const RECOVERY_BASE: Duration = Duration::from_secs(1);
const RECOVERY_MAX: Duration = Duration::from_secs(4);

/// A round triggered by a slow or failed request starts at least this long after the
/// previous round started; doubled after each triggered round that found what the one
/// before it found (a slow etcd, an outage: every request signals, probing more tells
/// nothing new and loads etcd more), up to [`TRIGGER_GAP_MAX`]; back to the base once
/// a round sees a change or no trouble came for [`TRIGGER_GAP_RESET`].
const TRIGGER_GAP_BASE: Duration = Duration::from_millis(250);
const TRIGGER_GAP_MAX: Duration = Duration::from_secs(2);
const TRIGGER_GAP_RESET: Duration = Duration::from_secs(10);

/// Keeps the client's balanced channel on the endpoints that serve.
///
/// etcd-client spreads requests over every endpoint it was given and keeps sending a
/// share of them to a member that is down or hung. A member that refuses connections
/// fails each of them at once ("tcp connect error"; with one of three members
/// SIGKILLed, claims, bumps and sweeps kept failing until the test's deadline). A
/// member that still accepts connections but does not serve (the process stopped or
/// hung, a stalled disk, cut off from its quorum) is worse: the kernel completes the
/// connection, and requests, watches and lease keepalives balanced onto it wait for
/// their timeouts; with a 2 s lease every healthy agent self-fenced
/// (`tests/hung_member.rs`).
///
/// **When.** Every request of the store passes through its channel ([`Watched`]): a
/// request still unanswered after [`StoreOptions::health_timeout`] signals *slow* the
/// moment that time passes (it is not waited for), and one that fails for want of a
/// member (a transport error, `Unavailable`, `DeadlineExceeded`, `Unknown`) signals
/// *failed*. Answers on streams the channel does not see (a lease keepalive's
/// renewals) are watched the same way ([`super::EtcdStore::observed`]). A signal
/// starts a probe round at once, at most one per [`TRIGGER_GAP_BASE`] (more apart
/// while rounds find nothing new), so a hung member is out of rotation about one
/// probe timeout after the first request on it went slow. Without signals, a round
/// every 5–15 s ([`IDLE_PERIOD`]), and every 1–4 s while an endpoint does not serve
/// (to put it back). Probing all endpoints every 500 ms, as this did before, cost
/// etcd 12 requests and 6 new TCP connections per second per daemon with three
/// endpoints.
///
/// **How.** A round probes all endpoints concurrently, each within the probe timeout
/// (the connect timeout capped by [`StoreOptions::health_timeout`]), through a client
/// of its own on that endpoint alone, kept across rounds (one HTTP/2 connection per
/// endpoint, no new connection per round): a linearizable count-only read of one
/// key. Only when the read has not answered within a quarter of the timeout (or
/// failed) are a maintenance `Status` call and a TCP connect sent beside it. The read
/// needs the member to run and to reach a leader, at no disk write; `Status` is
/// answered locally by any running member. An endpoint *serves* when the read
/// answers; it is *degraded* when only `Status` answers (an election, no quorum, a
/// stalled apply), *silent* when nothing answers but it accepts connections (stopped,
/// hung), and *refused* when it does not accept one in time. In rotation: the
/// endpoints that serve; when none does, those that at least answer (during an
/// election the healthy members answer `Status` and the hung one does not); when none
/// answers, all, so requests fail fast instead of waiting for one endpoint. Each
/// transition is logged once (`step = "etcd_endpoint"`) and counted in
/// [`EtcdStore::endpoint_removals`]. If a probe client cannot be built for an
/// endpoint (its TLS files failed to load), that endpoint is probed by TCP connect
/// alone.
///
/// [`EtcdStore::endpoint_removals`]: super::EtcdStore::endpoint_removals
pub(super) struct EndpointHealth {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EndpointHealth {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A random fraction in [0, 1) (for jitter; no cryptographic use).
fn random_fraction() -> f64 {
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    // 53 random bits: every value exactly representable.
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// A random time between `lo` and `hi`.
fn between(lo: Duration, hi: Duration) -> Duration {
    lo + (hi.saturating_sub(lo)).mul_f64(random_fraction())
}

/// The probing task: the endpoints, their clients and what the last round found.
struct Prober {
    client: Client,
    targets: Vec<Target>,
    key: String,
    timeout: Duration,
    removals: Arc<tokio::sync::watch::Sender<u64>>,
    states: Arc<tokio::sync::watch::Sender<Vec<EndpointState>>>,
    in_rotation: Vec<bool>,
    /// Each endpoint's verdict at the last round.
    verdicts: Vec<&'static str>,
    /// No endpoint served at the last probe (warned about once per spell).
    none_serves: bool,
}

/// When the next round runs ([`IDLE_PERIOD`], [`RECOVERY_BASE`],
/// [`TRIGGER_GAP_BASE`]).
struct Pace {
    last_start: tokio::time::Instant,
    gap: Duration,
    recovery: Duration,
}

impl Pace {
    /// How long to wait for a signal before probing anyway.
    fn unprompted(&self, all_serve: bool) -> Duration {
        if all_serve {
            between(IDLE_PERIOD.0, IDLE_PERIOD.1)
        } else {
            between(self.recovery.mul_f64(0.75), self.recovery.mul_f64(1.25))
        }
    }

    /// When a triggered round may start.
    fn triggered_at(&mut self, now: tokio::time::Instant) -> tokio::time::Instant {
        if now.duration_since(self.last_start) >= TRIGGER_GAP_RESET {
            self.gap = TRIGGER_GAP_BASE;
        }
        self.last_start + self.gap
    }

    /// After a round: `same` when it found every endpoint as the round before did.
    fn after(&mut self, triggered: bool, same: bool, all_serve: bool) {
        self.gap = match (triggered, same) {
            (_, false) => TRIGGER_GAP_BASE,
            (true, true) => (self.gap * 2).min(TRIGGER_GAP_MAX),
            (false, true) => self.gap,
        };
        self.recovery = if all_serve || !same {
            RECOVERY_BASE
        } else {
            (self.recovery * 2).min(RECOVERY_MAX)
        };
    }
}

impl EndpointHealth {
    /// Probes once (so the first request already avoids a dead or hung member), then
    /// keeps probing in a task when `signals` says so, and slowly otherwise. `key` is
    /// the key the probes read; `removals` counts the endpoints taken out of rotation.
    pub(super) async fn start(
        client: Client,
        endpoints: &[String],
        key: &str,
        opts: &StoreOptions,
        removals: Arc<tokio::sync::watch::Sender<u64>>,
        states: Arc<tokio::sync::watch::Sender<Vec<EndpointState>>>,
        signals: Arc<Signals>,
    ) -> Self {
        let timeout = opts.connect_timeout.min(opts.health_timeout);
        // No request timeout of its own: the probe's `timeout` bounds each call. No
        // `require_leader`: it would make `Status` fail without a leader too. HTTP/2
        // PINGs only while a probe is in flight: etcd answers PINGs on a connection
        // without streams as abuse (`too_many_pings`, GOAWAY), so PINGs while idle
        // between rounds closed the kept connection and each round reconnected.
        let popts = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_keep_alive(opts.keepalive_interval, opts.keepalive_timeout)
            .with_keep_alive_while_idle(false);
        // Same TLS and credentials as the store, which already checked them.
        let popts = opts.security.apply(endpoints, popts);
        let mut targets = Vec::with_capacity(endpoints.len());
        for ep in endpoints {
            // Lazy: nothing is sent before the first probe; kept for every round.
            let connected = match &popts {
                Ok(p) => Client::connect([ep], Some(p.clone()))
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            let client = match connected {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!(step = "etcd_endpoint", endpoint = %ep, error = %e, "cannot build a probe client for etcd endpoint {ep}: probing it by TCP connect only (a hung member there stays in rotation)");
                    None
                }
            };
            targets.push(Target {
                endpoint: ep.clone(),
                client,
            });
        }
        let mut prober = Prober {
            client,
            targets,
            key: key.to_owned(),
            timeout,
            removals,
            states,
            in_rotation: vec![true; endpoints.len()],
            verdicts: vec!["serves"; endpoints.len()],
            none_serves: false,
        };
        prober.round().await;
        let task = tokio::spawn(async move { prober.run(&signals).await });
        Self { task }
    }
}

impl Prober {
    fn all_serve(&self) -> bool {
        self.verdicts.iter().all(|v| *v == "serves")
    }

    async fn run(&mut self, signals: &Signals) {
        let mut pace = Pace {
            last_start: tokio::time::Instant::now(),
            gap: TRIGGER_GAP_BASE,
            recovery: RECOVERY_BASE,
        };
        loop {
            let triggered = tokio::select! {
                () = signals.wake.notified() => true,
                () = tokio::time::sleep(pace.unprompted(self.all_serve())) => false,
            };
            if triggered {
                tokio::time::sleep_until(pace.triggered_at(tokio::time::Instant::now())).await;
                if let Some(why) = signals.take_why() {
                    tracing::debug!(step = "etcd_endpoint", "probing the etcd endpoints: {why}");
                }
            }
            pace.last_start = tokio::time::Instant::now();
            let before = self.verdicts.clone();
            self.round().await;
            pace.after(triggered, before == self.verdicts, self.all_serve());
        }
    }

    /// One round: probes every endpoint, moves the rotation, publishes what it saw.
    async fn round(&mut self) {
        let timeout = self.timeout;
        // Concurrently: a hung endpoint costs one timeout per round, not one each.
        let mut set = tokio::task::JoinSet::new();
        for (i, t) in self.targets.iter().enumerate() {
            let probe = probe_endpoint(
                t.endpoint.clone(),
                t.client.clone(),
                self.key.clone(),
                timeout,
            );
            set.spawn(async move {
                let t0 = Instant::now();
                let p = probe.await;
                (i, p, t0.elapsed())
            });
        }
        let mut probes = vec![Probe::Silent; self.targets.len()];
        let mut took = vec![timeout; self.targets.len()];
        while let Some(r) = set.join_next().await {
            if let Ok((i, p, d)) = r {
                probes[i] = p;
                took[i] = d;
            }
        }
        let want = rotation(&probes);
        let none_serves = !probes.iter().any(Probe::serves);
        if none_serves && !self.none_serves {
            let seen: Vec<String> = self
                .targets
                .iter()
                .zip(&probes)
                .map(|(t, p)| format!("{}: {p:?}", t.endpoint))
                .collect();
            tracing::warn!(
                step = "etcd_endpoint",
                "no etcd endpoint serves linearizable reads ({}): keeping those that answer in rotation (all, if none does); check the etcd cluster's leader, quorum and network",
                seen.join(", ")
            );
        }
        self.none_serves = none_serves;
        for (i, t) in self.targets.iter().enumerate() {
            if want[i] == self.in_rotation[i] {
                continue;
            }
            let ep = &t.endpoint;
            let r = if want[i] {
                self.client.add_endpoint(ep).await
            } else {
                self.client.remove_endpoint(ep).await
            };
            match r {
                Ok(()) => {
                    self.in_rotation[i] = want[i];
                    if !want[i] {
                        self.removals.send_modify(|n| *n += 1);
                        let trouble = probes[i].trouble(timeout);
                        tracing::warn!(step = "etcd_endpoint", endpoint = %ep, "etcd endpoint {ep} {trouble}: out of rotation until it serves again");
                    } else if probes[i].answers() {
                        tracing::info!(step = "etcd_endpoint", endpoint = %ep, "etcd endpoint {ep} answers again: back in rotation");
                    }
                }
                Err(e) => {
                    tracing::warn!(step = "etcd_endpoint", endpoint = %ep, error = %e, "cannot change the client's endpoints");
                }
            }
        }
        self.verdicts = probes.iter().map(Probe::verdict).collect();
        let seen = self
            .targets
            .iter()
            .zip(probes.iter().zip(took))
            .zip(&self.in_rotation)
            .map(|((t, (p, probe)), &in_rotation)| EndpointState {
                endpoint: t.endpoint.clone(),
                in_rotation,
                verdict: p.verdict(),
                probe,
            })
            .collect();
        self.states.send_replace(seen);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pace_backs_off_while_rounds_find_nothing_new() {
        let t0 = tokio::time::Instant::now();
        let mut p = Pace {
            last_start: t0,
            gap: TRIGGER_GAP_BASE,
            recovery: RECOVERY_BASE,
        };
        for _ in 0..20 {
            let idle = p.unprompted(true);
            assert!((IDLE_PERIOD.0..=IDLE_PERIOD.1).contains(&idle), "{idle:?}");
        }
        assert_eq!(p.triggered_at(t0), t0 + TRIGGER_GAP_BASE);
        // A slow etcd: every triggered round finds the same.
        p.after(true, true, true);
        p.after(true, true, true);
        assert_eq!(p.gap, 4 * TRIGGER_GAP_BASE);
        for _ in 0..10 {
            p.after(true, true, true);
        }
        assert_eq!(p.gap, TRIGGER_GAP_MAX);
        // A change (a member stopped serving): back to the base at once.
        p.after(true, false, false);
        assert_eq!(p.gap, TRIGGER_GAP_BASE);
        assert_eq!(p.recovery, RECOVERY_BASE);
        // Out of rotation and still down: rechecked less often, up to the maximum.
        for _ in 0..10 {
            p.after(false, true, false);
        }
        assert_eq!(p.recovery, RECOVERY_MAX);
        let r = p.unprompted(false);
        assert!(r >= RECOVERY_MAX.mul_f64(0.75) && r <= RECOVERY_MAX.mul_f64(1.25));
        // A long quiet spell resets a backed-off gap.
        p.gap = TRIGGER_GAP_MAX;
        let later = t0 + TRIGGER_GAP_RESET;
        assert_eq!(p.triggered_at(later), t0 + TRIGGER_GAP_BASE);
    }
}
