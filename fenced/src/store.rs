//! The etcd adapter (etcd-client 0.21): every transaction of the protocol, the error
//! classification, and a round-trip counter.
//!
//! Critical path of a watch-triggered fence: **2 etcd round trips** (claim transaction,
//! finishing transaction) plus the Fencer's device commands. The claim's lease is
//! granted ahead of time ([`EtcdStore::prepare_claim_lease`]), so granting it is not on
//! the path; it is not kept alive, so a claim whose controller dies expires with it.
//! A sweep-triggered fence costs the shared sweep read plus the same two.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, LeaseKeepAliveStream,
    LeaseKeeper, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchOptions, WatchStream,
};
use tokio::sync::Mutex;

use crate::core::{BumpOutcome, ClaimOutcome, SnapshotGuard, SweepSnapshot, Victim};
use crate::keys::Keys;
use crate::node::NodeId;

/// An etcd failure, classified once, here.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// etcd could not be reached or did not answer in time (retry with backoff).
    #[error("etcd unavailable during {op}: {source}")]
    Unavailable {
        /// The operation.
        op: &'static str,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// The requested revision has been compacted away.
    #[error("etcd revision compacted during {op}: {source}")]
    Compacted {
        /// The operation.
        op: &'static str,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// The lease is gone (expired or revoked).
    #[error("etcd lease expired or not found during {op}: {source}")]
    LeaseGone {
        /// The operation.
        op: &'static str,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// Any other etcd error.
    #[error("etcd error during {op}: {source}")]
    Other {
        /// The operation.
        op: &'static str,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// A stored value does not parse.
    #[error("malformed value at {key}: {what}")]
    Malformed {
        /// The key.
        key: String,
        /// What is wrong.
        what: String,
    },
}

impl StoreError {
    /// Classifies an etcd-client error. etcd-client reports some conditions only as
    /// strings (lease keepalive) or as gRPC statuses with a message, so this is the one
    /// place that looks at them.
    pub fn classify(op: &'static str, source: etcd_client::Error) -> Self {
        use etcd_client::Error as E;
        use tonic::Code;
        match &source {
            E::TransportError(_) | E::IoError(_) => Self::Unavailable { op, source },
            E::LeaseKeepAliveError(_) => Self::LeaseGone { op, source },
            E::GRpcStatus(s) => match s.code() {
                Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted => {
                    Self::Unavailable { op, source }
                }
                Code::Unknown if s.message().contains("transport") => {
                    Self::Unavailable { op, source }
                }
                Code::OutOfRange if s.message().contains("compacted") => {
                    Self::Compacted { op, source }
                }
                Code::NotFound if s.message().contains("lease not found") => {
                    Self::LeaseGone { op, source }
                }
                _ => Self::Other { op, source },
            },
            _ => Self::Other { op, source },
        }
    }

    /// Worth retrying with backoff.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// The revision asked for was compacted.
    pub fn is_compacted(&self) -> bool {
        matches!(self, Self::Compacted { .. })
    }

    /// The lease is gone.
    pub fn is_lease_gone(&self) -> bool {
        matches!(self, Self::LeaseGone { .. })
    }
}

/// Result alias.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

tokio::task_local! {
    static TASK_ROUND_TRIPS: std::cell::Cell<u64>;
}

/// Runs `f` and returns its output with the etcd round trips `f` itself made through
/// any store. Unlike differences of [`EtcdStore::round_trips`], work that other tasks
/// do on a shared store meanwhile (the sweep, the spare-lease refill) is not counted,
/// so the number is exact however busy the controller is.
pub async fn count_round_trips<F: std::future::Future>(f: F) -> (F::Output, u64) {
    TASK_ROUND_TRIPS
        .scope(std::cell::Cell::new(0), async {
            let out = f.await;
            (out, TASK_ROUND_TRIPS.with(std::cell::Cell::get))
        })
        .await
}

/// What the watch path's claim guards on besides the claim itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimGuard {
    /// Watch path: membership absent, no departure marker, and no fence mark written
    /// since the membership DELETE at `deleted_rev`. The last compare is what makes a
    /// late or duplicated DELETE harmless: without it, a controller whose event
    /// arrives after another controller finished (and released its claim) wins a
    /// fresh claim and bumps the generation a second time for one departure.
    Watch {
        /// Revision of the membership DELETE this attempt acts on.
        deleted_rev: i64,
    },
    /// Watch path after a departure marker was found not honourable (the node still
    /// owns arenas): membership absent, the marker ignored, same fence-mark guard.
    IgnoreDeparture {
        /// Revision of the membership DELETE this attempt acts on (`i64::MAX`: no
        /// DELETE to anchor to, e.g. an operator's attestation).
        deleted_rev: i64,
    },
    /// Sweep path: membership absent and the snapshot unchanged (`recheck_intent`).
    Sweep(SnapshotGuard),
}

/// Why a watch-path claim was refused, when it was not another controller's claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimRefusal {
    /// The node holds membership again.
    Member,
    /// The node left a departure marker; `arenas` is the number of arenas it still owns
    /// (`None`: could not be read).
    Departed {
        /// Arenas still owned.
        arenas: Option<usize>,
    },
    /// The sweep's snapshot aged.
    SnapshotAged,
    /// A fence mark was written after the DELETE this attempt acts on: that departure
    /// is already fenced.
    AlreadyFenced,
}

/// A claim transaction's full result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimResult {
    /// Won, held elsewhere, or not owed.
    Outcome(ClaimOutcome),
    /// Refused by the guard, with the reason.
    Refused(ClaimRefusal),
}

/// The result of a join transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Joined {
    /// `create_revision` of our `membership/<node>`: the departure and arena claims
    /// are conditioned on it (our membership, still live).
    pub membership_rev: i64,
    /// Our generation when we joined.
    pub generation: u64,
}

/// A status view for `fenced status`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Status {
    /// Live members and their instance ids.
    pub members: Vec<(String, String)>,
    /// Generations.
    pub generations: Vec<(String, u64)>,
    /// Owed fences (intents) and their instance ids.
    pub owed: Vec<(String, String)>,
    /// Fence marks.
    pub done: Vec<(String, u64)>,
    /// Claims held and their holders.
    pub claims: Vec<(String, String)>,
    /// Departure markers.
    pub departed: Vec<String>,
    /// Arena owners.
    pub arenas: Vec<(String, String)>,
    /// Free arenas.
    pub free_arenas: Vec<String>,
    /// Number of audit records.
    pub audit_records: usize,
}

/// The etcd store: a client, the key layout, a round-trip counter and the spare claim
/// lease.
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    keys: Keys,
    round_trips: Arc<AtomicU64>,
    claim_ttl: Duration,
    first_attempt_timeout: Duration,
    spare: Arc<Mutex<Option<(i64, Instant)>>>,
    /// Counts endpoints taken out of rotation ([`EtcdStore::endpoint_removals`]).
    removals: Arc<tokio::sync::watch::Sender<u64>>,
    /// Ends the endpoint health task with the last clone.
    _health: Option<Arc<EndpointHealth>>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("root", &self.keys.root())
            .field("round_trips", &self.round_trips())
            .finish_non_exhaustive()
    }
}

fn kvs(resp: &TxnOpResponse) -> &[KeyValue] {
    match resp {
        TxnOpResponse::Get(g) => g.kvs(),
        _ => &[],
    }
}

fn count(resp: &TxnOpResponse) -> usize {
    match resp {
        TxnOpResponse::Get(g) => usize::try_from(g.count()).unwrap_or(usize::MAX),
        _ => 0,
    }
}

fn parse_u64(kv: &KeyValue) -> Result<u64> {
    let key = String::from_utf8_lossy(kv.key()).into_owned();
    let s = std::str::from_utf8(kv.value()).map_err(|e| StoreError::Malformed {
        key: key.clone(),
        what: e.to_string(),
    })?;
    s.trim().parse().map_err(|e| StoreError::Malformed {
        key,
        what: format!("{s:?}: {e}"),
    })
}

fn text(kv: &KeyValue) -> String {
    String::from_utf8_lossy(kv.value()).into_owned()
}

/// A won claim: the generation (and its mod revision) from the `generation` read, the
/// victim's arenas from the `arenas` index read, and the claim's revision.
fn won(
    k: &Keys,
    generation: &TxnOpResponse,
    arenas: &TxnOpResponse,
    claim_rev: i64,
) -> Result<ClaimOutcome> {
    let (generation, generation_rev) = match kvs(generation).first() {
        Some(kv) => (parse_u64(kv)?, kv.mod_revision()),
        None => (0, 0),
    };
    let arenas = kvs(arenas)
        .iter()
        .filter_map(|kv| k.arena_node_of(kv.key()).map(|(_, a)| a))
        .collect();
    Ok(ClaimOutcome::Won {
        generation,
        generation_rev,
        claim_rev,
        arenas,
    })
}

fn revision(resp: &TxnResponse) -> i64 {
    resp.header().map_or(0, |h| h.revision())
}

fn absent(key: String) -> Compare {
    Compare::create_revision(key, CompareOp::Equal, 0)
}

fn prefix() -> Option<GetOptions> {
    Some(GetOptions::new().with_prefix())
}

fn prefix_keys_only() -> Option<GetOptions> {
    Some(GetOptions::new().with_prefix().with_keys_only())
}

/// Client-side timeouts of the etcd connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// TCP connect timeout per endpoint.
    pub connect_timeout: Duration,
    /// Deadline of each unary request (not of the watch and keepalive streams once
    /// they are open).
    pub request_timeout: Duration,
    /// HTTP/2 keepalive: a PING is sent after this much silence on the connection...
    pub keepalive_interval: Duration,
    /// ...and the connection (with every stream on it) is dropped when the PING is not
    /// answered within this. It only has to notice a dead peer that sent no FIN (a
    /// partition); a refused or reset connection is noticed at once. Keep it above the
    /// worst round trip to etcd you tolerate: a timeout breaks the agent's lease
    /// keepalive stream.
    pub keepalive_timeout: Duration,
    /// A fence's claim and finishing transactions give their first attempt this long
    /// before retrying; later attempts get the whole request timeout, so a link
    /// slower than this still completes. Retrying is safe because both check whether
    /// an earlier attempt landed. A proposal dropped by a dying leader is never
    /// answered: waiting the whole request timeout for it delayed fences by ~5 s.
    pub first_attempt_timeout: Duration,
    /// With several endpoints, how long each health probe waits for a member's answer
    /// (capped by the connect timeout) before that member is taken out of rotation.
    /// Keep it well under the lease TTL: keepalives sitting on a hung member are
    /// moved only once it is detected (up to 500 ms + this later).
    pub health_timeout: Duration,
}

impl Default for StoreOptions {
    /// Connect 2 s, requests 5 s (a fence transaction's first attempt 2 s), PING
    /// after 2 s of silence, dropped after 2 s more; health probes 1 s (etcd's own
    /// `/health` gives its quorum read 1 s).
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            keepalive_interval: Duration::from_secs(2),
            keepalive_timeout: Duration::from_secs(2),
            first_attempt_timeout: Duration::from_secs(2),
            health_timeout: Duration::from_secs(1),
        }
    }
}

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
struct EndpointHealth {
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
    async fn start(
        client: Client,
        endpoints: &[String],
        key: &str,
        opts: &StoreOptions,
        removals: Arc<tokio::sync::watch::Sender<u64>>,
    ) -> Self {
        let timeout = opts.connect_timeout.min(opts.health_timeout);
        // No request timeout of its own: the probe's `timeout` bounds each call. No
        // `require_leader`: it would make `Status` fail without a leader too.
        let popts = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_keep_alive(opts.keepalive_interval, opts.keepalive_timeout);
        let mut targets = Vec::with_capacity(endpoints.len());
        for ep in endpoints {
            // Lazy: nothing is sent before the first probe.
            let client = match Client::connect([ep], Some(popts.clone())).await {
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
        Self::probe(&client, &targets, &key, &mut state, timeout, &removals).await;
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(HEALTH_PERIOD).await;
                Self::probe(&client, &targets, &key, &mut state, timeout, &removals).await;
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
    ) {
        // Concurrently: a hung endpoint costs one timeout per round, not one each.
        let mut set = tokio::task::JoinSet::new();
        for (i, t) in targets.iter().enumerate() {
            let probe = probe_endpoint(
                t.endpoint.clone(),
                t.client.clone(),
                key.to_owned(),
                timeout,
            );
            set.spawn(async move { (i, probe.await) });
        }
        let mut probes = vec![Probe::Silent; targets.len()];
        while let Some(r) = set.join_next().await {
            if let Ok((i, p)) = r {
                probes[i] = p;
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
    }
}

impl StoreOptions {
    /// The options for a daemon whose membership lease has `ttl`: the HTTP/2
    /// keepalive timeout is at least TTL/2, so a slow link that still renews the lease
    /// is not torn down. With a fixed 2 s, a 9 s lease behind a link of 1.1 s each way
    /// kept losing its connection: watches restarted, requests in flight failed, and
    /// the agent self-fenced with its lease alive in etcd (`tests/etcd_faults.rs`).
    /// The health probe's timeout is TTL/4 (at most the default 1 s, at least 250 ms),
    /// so a hung member is out of rotation well within a TTL.
    pub fn for_lease_ttl(ttl: Duration) -> Self {
        let d = Self::default();
        Self {
            keepalive_timeout: d.keepalive_timeout.max(ttl / 2),
            health_timeout: (ttl / 4).clamp(Duration::from_millis(250), d.health_timeout),
            ..d
        }
    }
}

impl EtcdStore {
    /// Connects to `endpoints` with the default [`StoreOptions`], keys under `root`.
    /// Fails fast (connect timeout 2 s); the caller retries with backoff.
    pub async fn connect(endpoints: &[String], root: &str, claim_ttl: Duration) -> Result<Self> {
        Self::connect_with(endpoints, root, claim_ttl, &StoreOptions::default()).await
    }

    /// Connects to `endpoints` with `opts`, keys under `root`; one read proves that an
    /// endpoint answers.
    pub async fn connect_with(
        endpoints: &[String],
        root: &str,
        claim_ttl: Duration,
        opts: &StoreOptions,
    ) -> Result<Self> {
        let copts = ConnectOptions::new()
            .with_connect_timeout(opts.connect_timeout)
            .with_timeout(opts.request_timeout)
            .with_keep_alive(opts.keepalive_interval, opts.keepalive_timeout);
        let client = Client::connect(endpoints, Some(copts))
            .await
            .map_err(|e| StoreError::classify("connect", e))?;
        let keys = Keys::new(root);
        let removals = Arc::new(tokio::sync::watch::Sender::new(0));
        let health = match endpoints.len() {
            0 | 1 => None,
            _ => Some(Arc::new(
                EndpointHealth::start(
                    client.clone(),
                    endpoints,
                    keys.root(),
                    opts,
                    removals.clone(),
                )
                .await,
            )),
        };
        let store = Self {
            client,
            keys,
            round_trips: Arc::new(AtomicU64::new(0)),
            claim_ttl,
            first_attempt_timeout: opts.first_attempt_timeout,
            spare: Arc::new(Mutex::new(None)),
            removals,
            _health: health,
        };
        // Connecting is lazy in tonic: one cheap read proves the server answers.
        store
            .client()
            .get(store.keys.root(), Some(GetOptions::new().with_count_only()))
            .await
            .map_err(|e| StoreError::classify("connect", e))?;
        Ok(store)
    }

    /// TTL of fence claims.
    pub fn claim_ttl(&self) -> Duration {
        self.claim_ttl
    }

    /// The key layout.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// Changes each time an endpoint is taken out of rotation. A stream opened
    /// earlier (a lease keepalive, a watch) may sit on that endpoint and wait for an
    /// answer that never comes: reopen it, and it lands on a member that serves.
    pub fn endpoint_removals(&self) -> tokio::sync::watch::Receiver<u64> {
        self.removals.subscribe()
    }

    /// The etcd client (cheap clone).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// etcd round trips made so far through this store (and its clones).
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    fn rt(&self) {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let _ = TASK_ROUND_TRIPS.try_with(|c| c.set(c.get() + 1));
    }

    async fn txn(&self, op: &'static str, txn: Txn) -> Result<TxnResponse> {
        self.rt();
        self.client()
            .txn(txn)
            .await
            .map_err(|e| StoreError::classify(op, e))
    }

    /// One attempt of a fence transaction whose outcome the caller checks on retry:
    /// the first gets [`StoreOptions::first_attempt_timeout`], later ones the request
    /// timeout.
    async fn fence_txn(&self, op: &'static str, txn: Txn, attempt: u32) -> Result<TxnResponse> {
        if attempt > 1 {
            return self.txn(op, txn).await;
        }
        match tokio::time::timeout(self.first_attempt_timeout, self.txn(op, txn)).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Unavailable {
                op,
                source: etcd_client::Error::GRpcStatus(tonic::Status::deadline_exceeded(format!(
                    "no answer within {:?} (first attempt; its outcome is checked on retry)",
                    self.first_attempt_timeout
                ))),
            }),
        }
    }

    /// Grants a lease of `ttl`.
    pub async fn grant(&self, ttl: Duration) -> Result<i64> {
        self.rt();
        let secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let r = self
            .client()
            .lease_grant(secs, None)
            .await
            .map_err(|e| StoreError::classify("lease_grant", e))?;
        Ok(r.id())
    }

    /// Revokes a lease (deleting every key bound to it).
    pub async fn revoke(&self, lease: i64) -> Result<()> {
        self.rt();
        self.client()
            .lease_revoke(lease)
            .await
            .map_err(|e| StoreError::classify("lease_revoke", e))?;
        Ok(())
    }

    /// Opens a keepalive stream for `lease`.
    pub async fn keep_alive(&self, lease: i64) -> Result<(LeaseKeeper, LeaseKeepAliveStream)> {
        self.rt();
        self.client()
            .lease_keep_alive(lease)
            .await
            .map_err(|e| StoreError::classify("lease_keep_alive", e))
    }

    /// Remaining TTL of `lease` in seconds (<= 0: gone). etcd-client reports an expired
    /// lease on the keepalive stream only as a string, so the agent asks directly.
    pub async fn lease_ttl(&self, lease: i64) -> Result<i64> {
        self.rt();
        let r = self
            .client()
            .lease_time_to_live(lease, None)
            .await
            .map_err(|e| StoreError::classify("lease_time_to_live", e))?;
        Ok(r.ttl())
    }

    /// Makes sure a fresh spare lease is ready for the next claim (off the critical
    /// path). A spare older than a quarter of the claim TTL is replaced, so a claim
    /// always has at least three quarters of its TTL left.
    pub async fn prepare_claim_lease(&self) -> Result<()> {
        let max_age = self.claim_ttl / 4;
        {
            let spare = self.spare.lock().await;
            if let Some((_, at)) = *spare
                && at.elapsed() < max_age
            {
                return Ok(());
            }
        }
        let lease = self.grant(self.claim_ttl).await?;
        *self.spare.lock().await = Some((lease, Instant::now()));
        Ok(())
    }

    async fn take_claim_lease(&self) -> Result<i64> {
        let taken = self.spare.lock().await.take();
        match taken {
            Some((lease, at)) if at.elapsed() < self.claim_ttl / 4 => Ok(lease),
            _ => self.grant(self.claim_ttl).await,
        }
    }

    /// `record_intent` + `claim` (+ `recheck_intent`) + `read_generation`, one transaction.
    pub async fn claim(
        &self,
        victim: &Victim,
        controller: &str,
        guard: ClaimGuard,
    ) -> Result<ClaimResult> {
        let k = &self.keys;
        let n = &victim.node;
        let lease = self.take_claim_lease().await?;
        let mut when = vec![absent(k.claim(n)), absent(k.membership(n))];
        let not_fenced_since = |rev: i64| Compare::mod_revision(k.done(n), CompareOp::Less, rev);
        match guard {
            ClaimGuard::Watch { deleted_rev } => {
                when.push(absent(k.departed(n)));
                when.push(not_fenced_since(deleted_rev));
            }
            ClaimGuard::IgnoreDeparture { deleted_rev } => when.push(not_fenced_since(deleted_rev)),
            ClaimGuard::Sweep(g) => {
                when.push(Compare::mod_revision(
                    k.pending(n),
                    CompareOp::Equal,
                    g.pending_rev,
                ));
                when.push(Compare::mod_revision(
                    k.done(n),
                    CompareOp::Equal,
                    g.done_rev,
                ));
                when.push(Compare::mod_revision(
                    k.departed(n),
                    CompareOp::Equal,
                    g.departed_rev,
                ));
            }
        }
        let txn = Txn::new()
            .when(when)
            .and_then(vec![
                TxnOp::put(k.pending(n), victim.instance.clone(), None),
                TxnOp::put(
                    k.claim(n),
                    controller,
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::get(k.generation(n), None),
                TxnOp::get(k.arena_node_prefix(n), prefix_keys_only()),
            ])
            .or_else(vec![
                TxnOp::get(k.claim(n), None),
                TxnOp::get(k.membership(n), None),
                TxnOp::get(k.departed(n), None),
                TxnOp::get(k.arena_node_prefix(n), prefix_keys_only()),
                TxnOp::get(k.done(n), None),
                TxnOp::get(k.generation(n), None),
            ]);
        // An answer lost to a timeout or a dead leader leaves the outcome unknown.
        // Retry with the same lease: if an earlier attempt landed, the claim found
        // carries our lease (a lease is used by at most one claim that landed) and is
        // ours. Without this the claim in doubt blocked the fence until its lease
        // expired (claim TTL, 120 s by default). An error that reaches the caller
        // leaves the lease unused or holding a claim that expires with it.
        let t0 = Instant::now();
        let mut delay = Duration::from_millis(100);
        let mut attempt = 0;
        let resp = loop {
            attempt += 1;
            let r = self.fence_txn("claim", txn.clone(), attempt).await;
            #[cfg(feature = "failpoints")]
            let r = match r {
                // Tests: the transaction was applied, its answer is "lost".
                Ok(_)
                    if attempt == 1
                        && fail::eval("store::claim::answer_lost", |who| {
                            who.as_deref() == Some(controller)
                        }) == Some(true) =>
                {
                    Err(StoreError::Unavailable {
                        op: "claim",
                        source: etcd_client::Error::GRpcStatus(tonic::Status::cancelled(
                            "fail point store::claim::answer_lost",
                        )),
                    })
                }
                r => r,
            };
            match r {
                Err(e) if e.is_retryable() && t0.elapsed() + delay < self.claim_ttl / 2 => {
                    tracing::warn!(step = "claim", node = %n, attempt, error = %e, "claim transaction failed, retrying (its outcome is checked)");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
                r => break r?,
            }
        };
        let ops = resp.op_responses();
        if resp.succeeded() {
            return Ok(ClaimResult::Outcome(won(
                k,
                &ops[2],
                &ops[3],
                revision(&resp),
            )?));
        }
        if let Some(kv) = kvs(&ops[0]).first()
            && attempt > 1
            && kv.lease() == lease
        {
            // An earlier attempt landed. Nothing it read can have moved since: a
            // generation bump and an arena change need this claim or the victim's
            // membership, which a join cannot take while the claim exists.
            tracing::info!(step = "claim", node = %n, attempt, "an earlier claim attempt whose answer was lost had landed: the claim is ours");
            return Ok(ClaimResult::Outcome(won(
                k,
                &ops[5],
                &ops[3],
                kv.create_revision(),
            )?));
        }
        // The lease was not used: keep it as the spare.
        *self.spare.lock().await = Some((lease, Instant::now() - self.claim_ttl / 8));
        if let Some(kv) = kvs(&ops[0]).first() {
            return Ok(ClaimResult::Outcome(ClaimOutcome::Held { by: text(kv) }));
        }
        if !kvs(&ops[1]).is_empty() {
            return Ok(ClaimResult::Refused(ClaimRefusal::Member));
        }
        let fenced_since = |rev: i64| {
            kvs(&ops[4])
                .first()
                .is_some_and(|kv| kv.mod_revision() >= rev)
        };
        match guard {
            ClaimGuard::Sweep(_) => Ok(ClaimResult::Refused(ClaimRefusal::SnapshotAged)),
            ClaimGuard::Watch { deleted_rev } | ClaimGuard::IgnoreDeparture { deleted_rev }
                if fenced_since(deleted_rev) =>
            {
                Ok(ClaimResult::Refused(ClaimRefusal::AlreadyFenced))
            }
            _ if !kvs(&ops[2]).is_empty() => Ok(ClaimResult::Refused(ClaimRefusal::Departed {
                arenas: Some(count(&ops[3]).max(kvs(&ops[3]).len())),
            })),
            _ => Ok(ClaimResult::Refused(ClaimRefusal::SnapshotAged)),
        }
    }

    /// `bump` + `mark_done` + `clear_intent` + `release_arenas` (when `release` is
    /// given) + audit record + `release_claim`, one transaction guarded by the
    /// generation compare and our claim.
    #[allow(clippy::too_many_arguments)]
    pub async fn finish(
        &self,
        node: &NodeId,
        from: u64,
        generation_rev: i64,
        claim_rev: i64,
        release: Option<&[String]>,
        audit_json: String,
    ) -> Result<BumpOutcome> {
        let k = &self.keys;
        let to = from + 1;
        let mut ops = vec![
            TxnOp::put(k.generation(node), to.to_string(), None),
            TxnOp::put(k.done(node), to.to_string(), None),
            TxnOp::delete(k.pending(node), None),
        ];
        for arena in release.unwrap_or_default() {
            ops.push(TxnOp::delete(k.arena_owner(arena), None));
            ops.push(TxnOp::delete(k.arena_node(node, arena), None));
            ops.push(TxnOp::put(k.arena_free(arena), "", None));
        }
        ops.push(TxnOp::put(k.audit(node, to), audit_json.clone(), None));
        ops.push(TxnOp::delete(k.claim(node), None));
        let txn = Txn::new()
            .when(vec![
                Compare::mod_revision(k.generation(node), CompareOp::Equal, generation_rev),
                Compare::create_revision(k.claim(node), CompareOp::Equal, claim_rev),
            ])
            .and_then(ops)
            .or_else(vec![
                TxnOp::get(k.generation(node), None),
                TxnOp::get(k.claim(node), None),
                TxnOp::get(k.audit(node, to), None),
            ]);
        // A timeout or a lost leader leaves the outcome unknown: the transaction may
        // have been applied. Retrying is safe (it is conditioned on our claim and the
        // generation we read, both of which it consumes) and our own audit record
        // tells a retry that an earlier attempt applied. Without the retry the fence
        // waits for its claim to expire (claim TTL, 120 s by default) before the
        // sweep may take it up again: measured in tests/etcd_faults.rs, a leader
        // SIGKILLed during a fence dropped the proposal and the finish timed out.
        let t0 = Instant::now();
        let mut delay = Duration::from_millis(100);
        let mut attempt = 0;
        let resp = loop {
            attempt += 1;
            match self.fence_txn("finish", txn.clone(), attempt).await {
                Err(e) if e.is_retryable() && t0.elapsed() + delay < self.claim_ttl => {
                    tracing::warn!(step = "bump", node = %node, error = %e, "finishing transaction failed, retrying (its outcome is checked)");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
                r => break r?,
            }
        };
        if resp.succeeded() {
            return Ok(BumpOutcome::Bumped);
        }
        let ops = resp.op_responses();
        if kvs(&ops[2])
            .first()
            .is_some_and(|kv| kv.value() == audit_json.as_bytes())
        {
            // An earlier attempt of ours was applied (its answer was lost).
            return Ok(BumpOutcome::Bumped);
        }
        let now = match kvs(&ops[0]).first() {
            Some(kv) => parse_u64(kv)?,
            None => 0,
        };
        let claim_ok = kvs(&ops[1])
            .first()
            .is_some_and(|kv| kv.create_revision() == claim_rev);
        if claim_ok {
            Ok(BumpOutcome::GenerationMoved { now })
        } else {
            Ok(BumpOutcome::ClaimLost)
        }
    }

    /// A failed fence: `release_claim` (only our own claim) and write the audit record
    /// of the attempt. The intent stays: the fence is still owed.
    pub async fn abort(
        &self,
        node: &NodeId,
        claim_rev: i64,
        generation: u64,
        unix_ms: u64,
        audit_json: String,
    ) -> Result<()> {
        let k = &self.keys;
        let audit_key = format!("{}.failed.{unix_ms}", k.audit(node, generation));
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                k.claim(node),
                CompareOp::Equal,
                claim_rev,
            )])
            .and_then(vec![
                TxnOp::delete(k.claim(node), None),
                TxnOp::put(audit_key.clone(), audit_json.clone(), None),
            ])
            .or_else(vec![TxnOp::put(audit_key, audit_json, None)]);
        self.txn("abort", txn).await?;
        Ok(())
    }

    /// A departure marker was honoured: nothing to write (the watch path wrote nothing).
    /// The sweep drops the stale intent and mark of a live member with this.
    pub async fn drop_stale(&self, node: &NodeId) -> Result<bool> {
        let k = &self.keys;
        let txn = Txn::new()
            .when(vec![Compare::version(
                k.membership(node),
                CompareOp::Greater,
                0,
            )])
            .and_then(vec![
                TxnOp::delete(k.pending(node), None),
                TxnOp::delete(k.done(node), None),
            ]);
        Ok(self.txn("drop_stale", txn).await?.succeeded())
    }

    /// `sweep`: one transaction of range reads.
    pub async fn sweep_snapshot(&self) -> Result<(SweepSnapshot, i64)> {
        let k = &self.keys;
        let txn = Txn::new().and_then(vec![
            TxnOp::get(k.generation_prefix(), prefix()),
            TxnOp::get(k.pending_prefix(), prefix()),
            TxnOp::get(k.done_prefix(), prefix()),
            TxnOp::get(k.membership_prefix(), prefix()),
            TxnOp::get(k.departed_prefix(), prefix()),
            TxnOp::get(k.arena_node_all_prefix(), prefix_keys_only()),
            TxnOp::get(k.claim_prefix(), prefix_keys_only()),
            TxnOp::get(k.instance_prefix(), prefix()),
        ]);
        let resp = self.txn("sweep", txn).await?;
        let ops = resp.op_responses();
        let mut s = SweepSnapshot::default();
        for kv in kvs(&ops[0]) {
            if let Some(n) = k.node_of(&k.generation_prefix(), kv.key()) {
                s.generations.insert(n, (parse_u64(kv)?, kv.mod_revision()));
            }
        }
        for kv in kvs(&ops[1]) {
            if let Some(n) = k.node_of(&k.pending_prefix(), kv.key()) {
                s.pending.insert(n, (text(kv), kv.mod_revision()));
            }
        }
        for kv in kvs(&ops[2]) {
            if let Some(n) = k.node_of(&k.done_prefix(), kv.key()) {
                s.done.insert(n, kv.mod_revision());
            }
        }
        for kv in kvs(&ops[3]) {
            if let Some(n) = k.node_of(&k.membership_prefix(), kv.key()) {
                s.members.insert(n, text(kv));
            }
        }
        for kv in kvs(&ops[4]) {
            if let Some(n) = k.node_of(&k.departed_prefix(), kv.key()) {
                s.departed.insert(n, (text(kv), kv.mod_revision()));
            }
        }
        for kv in kvs(&ops[5]) {
            if let Some((n, _)) = k.arena_node_of(kv.key()) {
                *s.arenas.entry(n).or_default() += 1;
            }
        }
        for kv in kvs(&ops[6]) {
            if let Some(n) = k.node_of(&k.claim_prefix(), kv.key()) {
                s.claims.insert(n);
            }
        }
        for kv in kvs(&ops[7]) {
            if let Some(n) = k.node_of(&k.instance_prefix(), kv.key()) {
                s.instances.insert(n, text(kv));
            }
        }
        Ok((s, revision(&resp)))
    }

    /// Opens the membership watch from `start_rev` (0: from now), with previous values
    /// (the instance id of a deleted member).
    pub async fn watch_membership(&self, start_rev: i64) -> Result<WatchStream> {
        self.rt();
        let mut opts = WatchOptions::new().with_prefix().with_prev_key();
        if start_rev > 0 {
            opts = opts.with_start_revision(start_rev);
        }
        self.client()
            .watch(self.keys.membership_prefix(), Some(opts))
            .await
            .map_err(|e| StoreError::classify("watch", e))
    }

    /// `join`: `membership/<node>` on `lease` (value = instance id), dropping a stale
    /// intent, mark and departure marker, reading our generation. Refused (returns
    /// `None`) while a controller holds a fence claim on us or we are already a member.
    pub async fn join(&self, node: &NodeId, instance: &str, lease: i64) -> Result<Option<Joined>> {
        let k = &self.keys;
        let txn = Txn::new()
            .when(vec![absent(k.claim(node)), absent(k.membership(node))])
            .and_then(vec![
                TxnOp::put(
                    k.membership(node),
                    instance,
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::delete(k.pending(node), None),
                TxnOp::delete(k.done(node), None),
                TxnOp::delete(k.departed(node), None),
                TxnOp::get(k.generation(node), None),
                TxnOp::put(k.instance(node), instance, None),
            ]);
        let resp = self.txn("join", txn).await?;
        if !resp.succeeded() {
            return Ok(None);
        }
        let membership_rev = revision(&resp);
        let ops = resp.op_responses();
        let generation = match kvs(&ops[4]).first() {
            Some(kv) => parse_u64(kv)?,
            None => {
                // First join ever: make the node known to the sweep by `gen/`.
                let txn = Txn::new()
                    .when(vec![absent(k.generation(node))])
                    .and_then(vec![TxnOp::put(k.generation(node), "0", None)]);
                self.txn("join", txn).await?;
                0
            }
        };
        Ok(Some(Joined {
            membership_rev,
            generation,
        }))
    }

    /// `read_own_generation` (and anyone's): the generation and its mod revision.
    pub async fn generation(&self, node: &NodeId) -> Result<(u64, i64)> {
        self.rt();
        let r = self
            .client()
            .get(self.keys.generation(node), None)
            .await
            .map_err(|e| StoreError::classify("read_generation", e))?;
        match r.kvs().first() {
            Some(kv) => Ok((parse_u64(kv)?, kv.mod_revision())),
            None => Ok((0, 0)),
        }
    }

    /// Records the agent's liveness (Unix milliseconds of a lease renewal).
    pub async fn put_liveness(&self, node: &NodeId, unix_ms: u64) -> Result<()> {
        self.rt();
        self.client()
            .put(self.keys.liveness(node), unix_ms.to_string(), None)
            .await
            .map_err(|e| StoreError::classify("liveness", e))?;
        Ok(())
    }

    /// The agent's last recorded liveness and whether it holds membership now.
    pub async fn liveness(&self, node: &NodeId) -> Result<(Option<u64>, bool)> {
        let txn = Txn::new().and_then(vec![
            TxnOp::get(self.keys.liveness(node), None),
            TxnOp::get(self.keys.membership(node), None),
            TxnOp::get(self.keys.pending(node), None),
        ]);
        let resp = self.txn("liveness", txn).await?;
        let ops = resp.op_responses();
        let live = match kvs(&ops[0]).first() {
            Some(kv) => Some(parse_u64(kv)?),
            None => None,
        };
        Ok((live, !kvs(&ops[1]).is_empty()))
    }

    /// The instance id recorded in `fence_pending/<node>` (empty when absent).
    pub async fn intent_instance(&self, node: &NodeId) -> Result<String> {
        self.rt();
        let r = self
            .client()
            .get(self.keys.pending(node), None)
            .await
            .map_err(|e| StoreError::classify("intent", e))?;
        Ok(r.kvs().first().map(text).unwrap_or_default())
    }

    /// Is `membership/<node>` still ours (created at `membership_rev`)?
    pub async fn is_member(&self, node: &NodeId, membership_rev: i64) -> Result<bool> {
        self.rt();
        let r = self
            .client()
            .get(self.keys.membership(node), None)
            .await
            .map_err(|e| StoreError::classify("membership", e))?;
        Ok(r.kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == membership_rev))
    }

    /// Puts arenas into the free pool unless someone owns them (administration, tests).
    pub async fn add_free_arenas(&self, arenas: &[String]) -> Result<()> {
        for a in arenas {
            let txn = Txn::new()
                .when(vec![absent(self.keys.arena_owner(a))])
                .and_then(vec![TxnOp::put(self.keys.arena_free(a), "", None)]);
            self.txn("add_free_arena", txn).await?;
        }
        Ok(())
    }

    /// `claim_arena`: create-only claim of a free arena, conditioned on our live
    /// membership. Returns whether we got it.
    pub async fn claim_arena(
        &self,
        node: &NodeId,
        membership_rev: i64,
        arena: &str,
    ) -> Result<bool> {
        let k = &self.keys;
        let txn = Txn::new()
            .when(vec![
                Compare::create_revision(k.membership(node), CompareOp::Equal, membership_rev),
                Compare::version(k.arena_free(arena), CompareOp::Greater, 0),
                absent(k.arena_owner(arena)),
            ])
            .and_then(vec![
                TxnOp::delete(k.arena_free(arena), None),
                TxnOp::put(k.arena_owner(arena), node.as_str(), None),
                TxnOp::put(k.arena_node(node, arena), "", None),
            ]);
        Ok(self.txn("claim_arena", txn).await?.succeeded())
    }

    /// The free pool.
    pub async fn free_arenas(&self) -> Result<Vec<String>> {
        self.rt();
        let p = self.keys.arena_free_prefix();
        let r = self
            .client()
            .get(p.clone(), prefix_keys_only())
            .await
            .map_err(|e| StoreError::classify("free_arenas", e))?;
        Ok(r.kvs()
            .iter()
            .filter_map(|kv| {
                std::str::from_utf8(kv.key())
                    .ok()?
                    .strip_prefix(&p)
                    .map(str::to_owned)
            })
            .collect())
    }

    /// The arenas `node` owns.
    /// The arenas the records say `node` owns, read in a transaction conditioned on
    /// our live membership (`None`: not a member any more). An agent adopts arenas
    /// from an earlier incarnation only this way, after `unfence`: a plain read could
    /// adopt an arena that a fence in flight (claimed while we were not a member) is
    /// about to free (found by the protocol model).
    pub async fn adopt_arenas(
        &self,
        node: &NodeId,
        membership_rev: i64,
    ) -> Result<Option<Vec<String>>> {
        let k = &self.keys;
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                k.membership(node),
                CompareOp::Equal,
                membership_rev,
            )])
            .and_then(vec![TxnOp::get(
                k.arena_node_prefix(node),
                prefix_keys_only(),
            )]);
        let resp = self.txn("adopt_arenas", txn).await?;
        if !resp.succeeded() {
            return Ok(None);
        }
        let ops = resp.op_responses();
        Ok(Some(
            kvs(&ops[0])
                .iter()
                .filter_map(|kv| k.arena_node_of(kv.key()).map(|(_, a)| a))
                .collect(),
        ))
    }

    /// The arenas the records say `node` owns (a plain read, for status and tests).
    pub async fn owned_arenas(&self, node: &NodeId) -> Result<Vec<String>> {
        self.rt();
        let r = self
            .client()
            .get(self.keys.arena_node_prefix(node), prefix_keys_only())
            .await
            .map_err(|e| StoreError::classify("owned_arenas", e))?;
        Ok(r.kvs()
            .iter()
            .filter_map(|kv| self.keys.arena_node_of(kv.key()).map(|(_, a)| a))
            .collect())
    }

    /// `release_own_arenas`: gives one arena back (only if we own it).
    ///
    /// Conditioned on our live membership as well as on ownership: a node whose lease
    /// expired while it was leaving may already have been claimed for a fence that read
    /// this arena as ours and will free it after the bump; returning it ourselves now
    /// would let another node claim it first and then lose it under live writes (found
    /// by the protocol model, `fenced/tests/protocol_model.rs`).
    pub async fn release_arena(
        &self,
        node: &NodeId,
        membership_rev: i64,
        arena: &str,
    ) -> Result<bool> {
        let k = &self.keys;
        let txn = Txn::new()
            .when(vec![
                Compare::create_revision(k.membership(node), CompareOp::Equal, membership_rev),
                Compare::value(k.arena_owner(arena), CompareOp::Equal, node.as_str()),
            ])
            .and_then(vec![
                TxnOp::delete(k.arena_owner(arena), None),
                TxnOp::delete(k.arena_node(node, arena), None),
                TxnOp::put(k.arena_free(arena), "", None),
            ]);
        Ok(self.txn("release_arena", txn).await?.succeeded())
    }

    /// `depart`: one transaction conditioned on our own live membership puts
    /// `departed/<node>` and deletes `membership/<node>`. `false`: not a member any more
    /// (a node whose lease expired cannot exempt itself).
    pub async fn depart(&self, node: &NodeId, instance: &str, membership_rev: i64) -> Result<bool> {
        let k = &self.keys;
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                k.membership(node),
                CompareOp::Equal,
                membership_rev,
            )])
            .and_then(vec![
                TxnOp::put(k.departed(node), instance, None),
                TxnOp::delete(k.membership(node), None),
            ]);
        Ok(self.txn("depart", txn).await?.succeeded())
    }

    /// Audit records of `node` (JSON), oldest first.
    pub async fn audit_records(&self, node: &NodeId) -> Result<Vec<serde_json::Value>> {
        self.rt();
        let r = self
            .client()
            .get(format!("{}{node}/", self.keys.audit_prefix()), prefix())
            .await
            .map_err(|e| StoreError::classify("audit", e))?;
        Ok(r.kvs()
            .iter()
            .filter_map(|kv| serde_json::from_slice(kv.value()).ok())
            .collect())
    }

    /// Everything `fenced status` shows, in one transaction.
    pub async fn status(&self) -> Result<Status> {
        let k = &self.keys;
        let txn = Txn::new().and_then(vec![
            TxnOp::get(k.membership_prefix(), prefix()),
            TxnOp::get(k.generation_prefix(), prefix()),
            TxnOp::get(k.pending_prefix(), prefix()),
            TxnOp::get(k.done_prefix(), prefix()),
            TxnOp::get(k.claim_prefix(), prefix()),
            TxnOp::get(k.departed_prefix(), prefix_keys_only()),
            TxnOp::get(format!("{}arena_owner/", k.root()), prefix()),
            TxnOp::get(k.arena_free_prefix(), prefix_keys_only()),
            TxnOp::get(
                k.audit_prefix(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
        ]);
        let resp = self.txn("status", txn).await?;
        let ops = resp.op_responses();
        let tail = |prefix: String, kv: &KeyValue| {
            String::from_utf8_lossy(kv.key())
                .strip_prefix(&prefix)
                .unwrap_or_default()
                .to_owned()
        };
        let pairs = |i: usize, prefix: String| -> Vec<(String, String)> {
            kvs(&ops[i])
                .iter()
                .map(|kv| (tail(prefix.clone(), kv), text(kv)))
                .collect()
        };
        let nums = |i: usize, prefix: String| -> Vec<(String, u64)> {
            kvs(&ops[i])
                .iter()
                .map(|kv| (tail(prefix.clone(), kv), parse_u64(kv).unwrap_or(0)))
                .collect()
        };
        Ok(Status {
            members: pairs(0, k.membership_prefix()),
            generations: nums(1, k.generation_prefix()),
            owed: pairs(2, k.pending_prefix()),
            done: nums(3, k.done_prefix()),
            claims: pairs(4, k.claim_prefix()),
            departed: kvs(&ops[5])
                .iter()
                .map(|kv| tail(k.departed_prefix(), kv))
                .collect(),
            arenas: pairs(6, format!("{}arena_owner/", k.root())),
            free_arenas: kvs(&ops[7])
                .iter()
                .map(|kv| tail(k.arena_free_prefix(), kv))
                .collect(),
            audit_records: count(&ops[8]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: tonic::Code, msg: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, msg))
    }

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

    #[test]
    fn health_timeout_scales_with_the_lease() {
        let h = |s| StoreOptions::for_lease_ttl(Duration::from_secs(s)).health_timeout;
        assert_eq!(h(2), Duration::from_millis(500));
        assert_eq!(h(5), Duration::from_secs(1));
        assert_eq!(h(1), Duration::from_millis(250));
        assert_eq!(
            StoreOptions::default().health_timeout,
            Duration::from_secs(1)
        );
    }

    #[test]
    fn classification() {
        use tonic::Code;
        let e = StoreError::classify(
            "watch",
            status(
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
        );
        assert!(e.is_compacted() && !e.is_retryable());
        let e = StoreError::classify(
            "txn",
            status(Code::Unavailable, "etcdserver: leader changed"),
        );
        assert!(e.is_retryable());
        let e = StoreError::classify(
            "txn",
            status(Code::DeadlineExceeded, "context deadline exceeded"),
        );
        assert!(e.is_retryable());
        let e = StoreError::classify(
            "lease_keep_alive",
            status(Code::NotFound, "etcdserver: requested lease not found"),
        );
        assert!(e.is_lease_gone());
        let e = StoreError::classify(
            "lease_keep_alive",
            etcd_client::Error::LeaseKeepAliveError("lease expired or revoked".into()),
        );
        assert!(e.is_lease_gone());
        let e = StoreError::classify(
            "txn",
            status(
                Code::InvalidArgument,
                "etcdserver: too many operations in txn request",
            ),
        );
        assert!(!e.is_retryable() && !e.is_compacted() && !e.is_lease_gone());
        assert!(e.to_string().starts_with("etcd error during txn"));
    }
}
