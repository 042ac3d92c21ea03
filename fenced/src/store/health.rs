//! Endpoint health: keeps the client's rotation on the etcd endpoints that serve.
//! Passive: the endpoints are probed when the store's own requests say something is
//! wrong (one failed, or went unanswered for too long), and slowly otherwise.

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, GetOptions};
use tonic::codegen::http;

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

/// A probe's read that has not answered within its timeout / this is slow: only then
/// are `Status` and a TCP connect sent beside it.
const HEDGE_DIVISOR: u32 = 4;

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

/// Receives every request of a store's channel: the operation (the gRPC method:
/// `Range`, `Txn`, `LeaseGrant`, ...), how long until etcd answered (until the stream
/// was open, for `Watch` and `LeaseKeepAlive`) and the result (`ok`, a gRPC code in
/// snake case such as `unavailable`, `transport` when no answer came at all, or
/// `abandoned` when the caller stopped waiting first). Requests are balanced over the
/// endpoints inside etcd-client's channel, which does not tell which endpoint served
/// one: they are reported by operation, not by endpoint (the endpoint probes are).
pub type RequestHook = Arc<dyn Fn(&'static str, Duration, &'static str) + Send + Sync>;

/// What the store's requests tell the probing task, shared by the store's channel
/// ([`Watched`]) and the task.
pub(super) struct Signals {
    /// A request unanswered this long is slow.
    slow_after: Duration,
    wake: tokio::sync::Notify,
    /// The first signal since the last round (for the log).
    why: Mutex<Option<String>>,
    hook: OnceLock<RequestHook>,
}

impl Signals {
    pub(super) fn new(slow_after: Duration) -> Arc<Self> {
        Arc::new(Self {
            slow_after,
            wake: tokio::sync::Notify::new(),
            why: Mutex::new(None),
            hook: OnceLock::new(),
        })
    }

    fn trouble(&self, why: impl FnOnce() -> String) {
        {
            let mut w = self.why.lock().unwrap_or_else(PoisonError::into_inner);
            if w.is_none() {
                *w = Some(why());
            }
        }
        // A permit is kept when the task is busy probing: one more round after it.
        self.wake.notify_one();
    }

    fn take_why(&self) -> Option<String> {
        self.why
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Sets the hook that receives every request; `false` if one was set already.
    pub(super) fn set_hook(&self, hook: RequestHook) -> bool {
        self.hook.set(hook).is_ok()
    }

    fn record(&self, op: &'static str, took: Duration, result: &'static str) {
        if let Some(h) = self.hook.get() {
            h(op, took, result);
        }
    }

    /// Awaits `answer`; if it is not there after `slow_after`, signals *slow* at that
    /// moment and goes on waiting.
    pub(super) async fn watch<F: Future>(&self, op: &'static str, answer: F) -> F::Output {
        tokio::pin!(answer);
        tokio::select! {
            biased;
            out = &mut answer => return out,
            () = tokio::time::sleep(self.slow_after) => {}
        }
        let after = self.slow_after;
        self.trouble(|| format!("a {op} request got no answer within {after:?}"));
        answer.await
    }
}

/// Results that say a member did not serve the request (rather than that etcd
/// refused it: a failed compare is no error, a denied permission is not the
/// endpoint's fault).
fn is_member_failure(result: &str) -> bool {
    matches!(
        result,
        "transport" | "unavailable" | "deadline_exceeded" | "unknown"
    )
}

/// The operation of a gRPC path (`/etcdserverpb.KV/Range` -> `Range`), as a static
/// label: the methods this daemon uses, `other` for the rest.
fn operation(path: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        "Range",
        "Put",
        "DeleteRange",
        "Txn",
        "Compact",
        "Watch",
        "LeaseGrant",
        "LeaseRevoke",
        "LeaseKeepAlive",
        "LeaseTimeToLive",
        "LeaseLeases",
        "Status",
        "Alarm",
        "MemberList",
        "Authenticate",
    ];
    let method = path.rsplit('/').next().unwrap_or("");
    KNOWN
        .iter()
        .find(|k| **k == method)
        .copied()
        .unwrap_or("other")
}

/// The result of a response whose headers arrived: a non-zero `grpc-status` there is
/// an error answered without a message (how etcd answers errors); without one the
/// status follows in the trailers, after the message: `ok`.
fn grpc_result(headers: &http::HeaderMap) -> &'static str {
    let Some(code) = headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
    else {
        return "ok";
    };
    use tonic::Code;
    match Code::from_i32(code) {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

/// Builds the store's balanced channel (etcd-client's own, tonic's) with every
/// request passing through [`Observed`]: the one place all of the store's requests
/// go through, so no call site reports anything itself.
pub(super) struct Watched(pub(super) Arc<Signals>);

type EndpointUpdater = tokio::sync::mpsc::Sender<
    tonic::transport::channel::Change<http::Uri, tonic::transport::Endpoint>,
>;

impl etcd_client::BalancedChannelBuilder for Watched {
    type Error = tonic::transport::Error;

    fn balanced_channel(
        self,
        buffer_size: usize,
    ) -> Result<(etcd_client::Channel, EndpointUpdater), Self::Error> {
        let (inner, tx) = tonic::transport::Channel::balance_channel(buffer_size);
        let observed = Observed {
            inner,
            signals: self.0,
        };
        Ok((
            etcd_client::Channel::Custom(tower::util::BoxCloneSyncService::new(observed)),
            tx,
        ))
    }
}

/// The store's channel, timing each request ([`Signals::watch`]) and reporting its
/// result ([`RequestHook`], and *failed* to the probing task).
#[derive(Clone)]
struct Observed {
    inner: tonic::transport::Channel,
    signals: Arc<Signals>,
}

type Request = http::Request<tonic::body::Body>;
type Response = http::Response<tonic::body::Body>;

impl tower::Service<Request> for Observed {
    type Response = Response;
    type Error = tower::BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response, tower::BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let op = operation(req.uri().path());
        let call = self.inner.call(req);
        let mut flight = InFlight {
            signals: self.signals.clone(),
            op,
            t0: Instant::now(),
            done: false,
        };
        Box::pin(async move {
            let r = flight.signals.clone().watch(op, call).await;
            flight.done(match &r {
                Ok(resp) => grpc_result(resp.headers()),
                Err(_) => "transport",
            });
            r.map_err(Into::into)
        })
    }
}

/// A request of the store's channel until it is answered; dropped before that, it is
/// reported `abandoned` (the caller's own timeout: its slowness, if any, was
/// signalled when it passed `slow_after`).
struct InFlight {
    signals: Arc<Signals>,
    op: &'static str,
    t0: Instant,
    done: bool,
}

impl InFlight {
    fn done(&mut self, result: &'static str) {
        self.done = true;
        self.signals.record(self.op, self.t0.elapsed(), result);
        if is_member_failure(result) {
            let op = self.op;
            self.signals
                .trouble(|| format!("a {op} request failed ({result})"));
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.done {
            self.signals.record(self.op, self.t0.elapsed(), "abandoned");
        }
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
    /// The verdict on an endpoint: `read` is the read's outcome (`None`: no answer
    /// within `timeout`), `status_ok` whether `Status` answered in time, `accepts`
    /// whether a TCP connect to it completed in time.
    fn of(
        read: Option<Result<(), etcd_client::Error>>,
        status_ok: bool,
        accepts: bool,
        timeout: Duration,
    ) -> Self {
        match (read, status_ok) {
            (Some(Ok(())), _) => Self::Serves,
            (None, true) => Self::Degraded(format!("no answer within {timeout:?}")),
            (Some(Err(e)), true) => Self::Degraded(e.to_string()),
            (_, false) if accepts => Self::Silent,
            (_, false) => Self::Refused,
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

/// Probes `endpoint` once within `timeout`: a linearizable count-only read of `key`
/// through `client`, and only if that has not answered within a quarter of the
/// timeout, a `Status` call and a TCP connect beside it (so a healthy member costs
/// one request and no new connection).
async fn probe_endpoint(
    endpoint: String,
    client: Option<Client>,
    key: String,
    timeout: Duration,
) -> Probe {
    let Some(mut client) = client else {
        return if accepts(&endpoint, timeout).await {
            Probe::Serves
        } else {
            Probe::Refused
        };
    };
    let deadline = tokio::time::Instant::now() + timeout;
    let mut status_client = client.clone();
    let read = client.get(key, Some(GetOptions::new().with_count_only()));
    tokio::pin!(read);
    let early = tokio::time::timeout(timeout / HEDGE_DIVISOR, &mut read)
        .await
        .ok();
    if matches!(early, Some(Ok(_))) {
        return Probe::Serves;
    }
    let read = async {
        match early {
            Some(r) => Some(r.map(drop)),
            None => tokio::time::timeout_at(deadline, read)
                .await
                .ok()
                .map(|r| r.map(drop)),
        }
    };
    let status = tokio::time::timeout_at(deadline, status_client.status());
    let connect = tokio::time::timeout_at(
        deadline,
        tokio::net::TcpStream::connect(authority(&endpoint)),
    );
    let (read, status, connect) = tokio::join!(read, status, connect);
    Probe::of(
        read,
        status.is_ok_and(|s| s.is_ok()),
        connect.is_ok_and(|c| c.is_ok()),
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
        assert_eq!(Probe::of(Some(Ok(())), true, true, t), Probe::Serves);
        assert_eq!(Probe::of(Some(Ok(())), false, false, t), Probe::Serves);
        assert_eq!(Probe::of(None, false, true, t), Probe::Silent);
        assert_eq!(Probe::of(None, false, false, t), Probe::Refused);
        let no_leader = || Some(Err(status(Code::Unavailable, "etcdserver: no leader")));
        assert_eq!(Probe::of(no_leader(), false, true, t), Probe::Silent);
        let degraded = Probe::of(no_leader(), true, true, t);
        assert!(
            matches!(&degraded, Probe::Degraded(m) if m.contains("no leader")),
            "{degraded:?}"
        );
        let electing = Probe::of(None, true, true, t);
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

    #[test]
    fn operations_and_results_of_the_store_channel() {
        assert_eq!(operation("/etcdserverpb.KV/Range"), "Range");
        assert_eq!(
            operation("/etcdserverpb.Lease/LeaseKeepAlive"),
            "LeaseKeepAlive"
        );
        assert_eq!(operation("/etcdserverpb.Maintenance/Defragment"), "other");
        assert_eq!(operation(""), "other");
        let with = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert("grpc-status", v.parse().unwrap());
            grpc_result(&h)
        };
        assert_eq!(grpc_result(&http::HeaderMap::new()), "ok");
        assert_eq!(with("0"), "ok");
        assert_eq!(with("14"), "unavailable");
        assert_eq!(with("4"), "deadline_exceeded");
        assert_eq!(with("7"), "permission_denied");
        assert_eq!(with("x"), "ok");
        // A member that does not serve, not a request etcd refused.
        for r in ["transport", "unavailable", "deadline_exceeded", "unknown"] {
            assert!(is_member_failure(r), "{r}");
        }
        for r in ["ok", "permission_denied", "invalid_argument", "abandoned"] {
            assert!(!is_member_failure(r), "{r}");
        }
    }

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

    #[tokio::test]
    async fn a_request_unanswered_past_the_threshold_wakes_the_prober_at_once() {
        let s = Signals::new(Duration::from_millis(100));
        let answered = s.watch("Range", async { 7 }).await;
        assert_eq!(answered, 7);
        assert!(s.take_why().is_none(), "a prompt answer signals nothing");
        let slow = {
            let s = s.clone();
            tokio::spawn(async move {
                s.watch("Range", tokio::time::sleep(Duration::from_secs(30)))
                    .await
            })
        };
        // Signalled when the threshold passes, long before the answer.
        let t0 = Instant::now();
        tokio::time::timeout(Duration::from_secs(5), s.wake.notified())
            .await
            .expect("woken once the threshold passed");
        assert!(t0.elapsed() < Duration::from_secs(5));
        let why = s.take_why().expect("a reason");
        assert!(why.contains("Range") && why.contains("100ms"), "{why}");
        assert!(!slow.is_finished(), "the answer is still awaited");
        slow.abort();
    }
}
