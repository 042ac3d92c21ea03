//! Endpoint health: probes every etcd endpoint and keeps the client's rotation on
//! those that serve.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, GetOptions};

use super::StoreOptions;

/// How often [`EndpointHealth`] probes the endpoints.
const HEALTH_PERIOD: Duration = Duration::from_millis(500);

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
/// So every [`HEALTH_PERIOD`] this task probes all endpoints concurrently (per endpoint
/// and round: one TCP connect and two small requests), each within
/// [`StoreOptions::health_timeout`]: a TCP connect, then, through a client of its own
/// on that endpoint alone, a linearizable count-only read of one key and a
/// maintenance `Status` call side by side. The read needs the member to run and to
/// reach a leader, at no disk write; `Status` is answered locally by any running
/// member. An endpoint *serves* when the read answers; it is *degraded* when only
/// `Status` answers (an election, no quorum, a stalled apply), and *silent* when
/// nothing answers (stopped, hung) or it refuses the connection. In rotation: the
/// endpoints that serve; when none does, those that at least answer (during an
/// election the healthy members answer `Status` and the hung one does not); when none
/// answers, all, so requests fail fast instead of waiting for one endpoint. Each
/// transition is logged once (`step = "etcd_endpoint"`) and counted in
/// [`EtcdStore::endpoint_removals`]. If a probe client cannot be built for an
/// endpoint (an `https://` URL: this build of etcd-client has no TLS), that endpoint
/// is probed by TCP connect alone, as before.
pub(super) struct EndpointHealth {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EndpointHealth {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `host:port` of an endpoint URL.
fn authority(endpoint: &str) -> &str {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest)
}

async fn accepts(endpoint: &str, timeout: Duration) -> bool {
    tokio::time::timeout(timeout, tokio::net::TcpStream::connect(authority(endpoint)))
        .await
        .is_ok_and(|r| r.is_ok())
}

/// What one probe of an endpoint found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Probe {
    /// Answered the linearizable read in time.
    Serves,
    /// Answered `Status` but not the read (why, in words).
    Degraded(String),
    /// Accepted the connection but answered nothing in time.
    Silent,
    /// Refused the connection or did not accept it in time.
    Refused,
}

impl Probe {
    /// The verdict on an endpoint that accepted the connection: `read` is the read's
    /// outcome (`None`: no answer within `timeout`), `status_ok` whether `Status`
    /// answered in time.
    fn of(
        read: Option<Result<(), etcd_client::Error>>,
        status_ok: bool,
        timeout: Duration,
    ) -> Self {
        match (read, status_ok) {
            (Some(Ok(())), _) => Self::Serves,
            (_, false) => Self::Silent,
            (None, true) => Self::Degraded(format!("no answer within {timeout:?}")),
            (Some(Err(e)), true) => Self::Degraded(e.to_string()),
        }
    }

    fn serves(&self) -> bool {
        *self == Self::Serves
    }

    fn answers(&self) -> bool {
        matches!(self, Self::Serves | Self::Degraded(_))
    }

    /// What is wrong with the endpoint and what the operator should check.
    fn trouble(&self, timeout: Duration) -> String {
        match self {
            Self::Serves => "serves".into(),
            Self::Refused => format!(
                "refuses connections (or accepts none within {timeout:?}): check that etcd runs there and is reachable"
            ),
            Self::Silent => format!(
                "accepts connections but answers nothing within {timeout:?}: check whether that etcd process is stopped or hung"
            ),
            Self::Degraded(why) => format!(
                "answers but serves no linearizable read ({why}): check that member's log, its disk and its connection to its peers (no leader, no quorum, stalled)"
            ),
        }
    }
}

/// Which endpoints belong in rotation: those that serve; when none does, those that
/// answer; when none answers, every one.
fn rotation(probes: &[Probe]) -> Vec<bool> {
    let keep: fn(&Probe) -> bool = if probes.iter().any(Probe::serves) {
        Probe::serves
    } else if probes.iter().any(Probe::answers) {
        Probe::answers
    } else {
        |_| true
    };
    probes.iter().map(keep).collect()
}

/// One endpoint and the client that probes it alone (`None`: TCP connect only).
struct Target {
    endpoint: String,
    client: Option<Client>,
}

/// Probes `endpoint` once: TCP connect, then a linearizable count-only read of `key`
/// and a `Status` call, all within `timeout`.
async fn probe_endpoint(
    endpoint: String,
    client: Option<Client>,
    key: String,
    timeout: Duration,
) -> Probe {
    let t0 = Instant::now();
    if !accepts(&endpoint, timeout).await {
        return Probe::Refused;
    }
    let Some(mut client) = client else {
        return Probe::Serves;
    };
    let mut status_client = client.clone();
    let left = timeout.saturating_sub(t0.elapsed());
    let (read, status) = tokio::join!(
        tokio::time::timeout(
            left,
            client.get(key, Some(GetOptions::new().with_count_only()))
        ),
        tokio::time::timeout(left, status_client.status()),
    );
    Probe::of(
        read.ok().map(|r| r.map(drop)),
        status.is_ok_and(|s| s.is_ok()),
        timeout,
    )
}

/// Probes every endpoint once, the way the daemons' rotation does (`fenced check`):
/// per endpoint, `None` when it would stay in rotation, else what is wrong with it.
pub async fn probe_endpoints(
    endpoints: &[String],
    key: &str,
    opts: &StoreOptions,
) -> Vec<(String, Option<String>)> {
    let timeout = opts.connect_timeout.min(opts.health_timeout);
    // Same TLS and credentials as the store (files already checked when it connected;
    // if they fail here the endpoint is probed by TCP connect only).
    let popts = opts
        .security
        .apply(
            endpoints,
            ConnectOptions::new().with_connect_timeout(timeout),
        )
        .ok();
    let mut set = tokio::task::JoinSet::new();
    for (i, ep) in endpoints.iter().enumerate() {
        let client = match &popts {
            Some(p) => Client::connect([ep], Some(p.clone())).await.ok(),
            None => None,
        };
        let probe = probe_endpoint(ep.clone(), client, key.to_owned(), timeout);
        set.spawn(async move { (i, probe.await) });
    }
    let mut probes = vec![Probe::Silent; endpoints.len()];
    while let Some(r) = set.join_next().await {
        if let Ok((i, p)) = r {
            probes[i] = p;
        }
    }
    let keep = rotation(&probes);
    endpoints
        .iter()
        .zip(probes.iter().zip(keep))
        .map(|(ep, (p, keep))| {
            (
                ep.clone(),
                (!keep || !p.serves()).then(|| p.trouble(timeout)),
            )
        })
        .collect()
}

/// One endpoint as the last probe round saw it ([`EtcdStore::endpoint_rotation`]).
///
/// [`EtcdStore::endpoint_rotation`]: super::EtcdStore::endpoint_rotation
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointState {
    /// The endpoint URL, as configured.
    pub endpoint: String,
    /// Whether the client balances requests onto it.
    pub in_rotation: bool,
    /// `serves`, `degraded` (answers `Status`, no linearizable read), `silent`
    /// (accepts connections, answers nothing) or `refused`.
    pub verdict: &'static str,
    /// How long the probe took (its requests are bounded by the probe timeout).
    pub probe: Duration,
}

impl Probe {
    fn verdict(&self) -> &'static str {
        match self {
            Self::Serves => "serves",
            Self::Degraded(_) => "degraded",
            Self::Silent => "silent",
            Self::Refused => "refused",
        }
    }
}

/// The probing task's state.
struct Rotation {
    in_rotation: Vec<bool>,
    /// No endpoint served at the last probe (warned about once per spell).
    none_serves: bool,
}

impl EndpointHealth {
    /// Probes once (so the first request already avoids a dead or hung member), then
    /// keeps probing in a task. `key` is the key the probes read; `removals` counts
    /// the endpoints taken out of rotation.
    pub(super) async fn start(
        client: Client,
        endpoints: &[String],
        key: &str,
        opts: &StoreOptions,
        removals: Arc<tokio::sync::watch::Sender<u64>>,
        states: Arc<tokio::sync::watch::Sender<Vec<EndpointState>>>,
    ) -> Self {
        let timeout = opts.connect_timeout.min(opts.health_timeout);
        // No request timeout of its own: the probe's `timeout` bounds each call. No
        // `require_leader`: it would make `Status` fail without a leader too.
        let popts = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_keep_alive(opts.keepalive_interval, opts.keepalive_timeout);
        // Same TLS and credentials as the store, which already checked them.
        let popts = opts.security.apply(endpoints, popts);
        let mut targets = Vec::with_capacity(endpoints.len());
        for ep in endpoints {
            // Lazy: nothing is sent before the first probe.
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
        let key = key.to_owned();
        let mut state = Rotation {
            in_rotation: vec![true; endpoints.len()],
            none_serves: false,
        };
        let publish = |s: Vec<EndpointState>| states.send_replace(s);
        publish(Self::probe(&client, &targets, &key, &mut state, timeout, &removals).await);
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(HEALTH_PERIOD).await;
                let seen =
                    Self::probe(&client, &targets, &key, &mut state, timeout, &removals).await;
                states.send_replace(seen);
            }
        });
        Self { task }
    }

    async fn probe(
        client: &Client,
        targets: &[Target],
        key: &str,
        state: &mut Rotation,
        timeout: Duration,
        removals: &tokio::sync::watch::Sender<u64>,
    ) -> Vec<EndpointState> {
        // Concurrently: a hung endpoint costs one timeout per round, not one each.
        let mut set = tokio::task::JoinSet::new();
        for (i, t) in targets.iter().enumerate() {
            let probe = probe_endpoint(
                t.endpoint.clone(),
                t.client.clone(),
                key.to_owned(),
                timeout,
            );
            set.spawn(async move {
                let t0 = Instant::now();
                let p = probe.await;
                (i, p, t0.elapsed())
            });
        }
        let mut probes = vec![Probe::Silent; targets.len()];
        let mut took = vec![timeout; targets.len()];
        while let Some(r) = set.join_next().await {
            if let Ok((i, p, d)) = r {
                probes[i] = p;
                took[i] = d;
            }
        }
        let want = rotation(&probes);
        let none_serves = !probes.iter().any(Probe::serves);
        if none_serves && !state.none_serves {
            let seen: Vec<String> = targets
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
        state.none_serves = none_serves;
        for (i, t) in targets.iter().enumerate() {
            if want[i] == state.in_rotation[i] {
                continue;
            }
            let ep = &t.endpoint;
            let r = if want[i] {
                client.add_endpoint(ep).await
            } else {
                client.remove_endpoint(ep).await
            };
            match r {
                Ok(()) => {
                    state.in_rotation[i] = want[i];
                    if !want[i] {
                        removals.send_modify(|n| *n += 1);
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
        targets
            .iter()
            .zip(probes.iter().zip(took))
            .zip(&state.in_rotation)
            .map(|((t, (p, probe)), &in_rotation)| EndpointState {
                endpoint: t.endpoint.clone(),
                in_rotation,
                verdict: p.verdict(),
                probe,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::error::tests::status;

    #[test]
    fn endpoint_authority() {
        assert_eq!(authority("http://127.0.0.1:2379"), "127.0.0.1:2379");
        assert_eq!(
            authority("https://etcd-1.internal:2379/"),
            "etcd-1.internal:2379"
        );
        assert_eq!(authority("10.0.0.1:2379"), "10.0.0.1:2379");
    }

    #[test]
    fn probe_verdicts_and_rotation() {
        use tonic::Code;
        let t = Duration::from_millis(500);
        assert_eq!(Probe::of(Some(Ok(())), true, t), Probe::Serves);
        assert_eq!(Probe::of(Some(Ok(())), false, t), Probe::Serves);
        assert_eq!(Probe::of(None, false, t), Probe::Silent);
        let no_leader = || Some(Err(status(Code::Unavailable, "etcdserver: no leader")));
        assert_eq!(Probe::of(no_leader(), false, t), Probe::Silent);
        let degraded = Probe::of(no_leader(), true, t);
        assert!(
            matches!(&degraded, Probe::Degraded(m) if m.contains("no leader")),
            "{degraded:?}"
        );
        let electing = Probe::of(None, true, t);
        assert_eq!(electing, Probe::Degraded("no answer within 500ms".into()));
        // Operators' greps and `etcd_faults.rs` look for "refuses connections".
        assert!(Probe::Refused.trouble(t).starts_with("refuses connections"));
        assert!(Probe::Silent.trouble(t).contains("stopped or hung"));
        assert!(degraded.trouble(t).contains("no leader"));

        use Probe::{Refused, Serves, Silent};
        assert_eq!(rotation(&[Serves, Silent, Serves]), [true, false, true]);
        assert_eq!(
            rotation(&[Refused, Serves, degraded.clone()]),
            [false, true, false]
        );
        // An election: the healthy members answer Status, the hung one nothing.
        assert_eq!(
            rotation(&[electing.clone(), Silent, degraded]),
            [true, false, true]
        );
        // Nothing answers (lost quorum and worse): all stay, requests fail fast.
        assert_eq!(rotation(&[Refused, Silent, Silent]), [true, true, true]);
        assert_eq!(rotation(&[]), Vec::<bool>::new());
    }
}
