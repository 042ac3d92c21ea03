//! The etcd adapter (etcd-client 0.21): every transaction of the protocol, the error
//! classification, and a round-trip counter.
//!
//! Critical path of a watch-triggered fence: **2 etcd round trips** (claim transaction,
//! finishing transaction) plus the Fencer's device commands. The claim's lease is
//! granted ahead of time ([`EtcdStore::prepare_claim_lease`]), so granting it is not on
//! the path; it is not kept alive, so a claim whose controller dies expires with it.
//! A sweep-triggered fence costs the shared sweep read plus the same two.
//!
//! Layout: this file holds the handle ([`EtcdStore`]), its connection and options, the
//! transaction helpers and the round-trip counter; `error` the classification of
//! etcd-client errors; `health` the endpoint probe and rotation; `fence` the
//! controller's transactions (claim, finish, abort); `presence` the controllers' own
//! keys (presence, sweep stamp, a standby's check); `membership` the agent's (join,
//! depart, leases, liveness, watch); `arenas` the arena pool; `view` the one read of
//! the key space behind the sweep and `fenced status`; `operator` the reads of the
//! operator commands (`fenced attest`'s view of one node); `space` etcd's history and
//! space as a client sees them (alarms, compaction, database size).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, Txn, TxnOpResponse,
    TxnResponse,
};
use tokio::sync::Mutex;

use crate::keys::Keys;

mod approvals;
mod arenas;
mod error;
mod fence;
mod health;
mod identity;
mod membership;
mod operator;
mod presence;
pub mod roles;
mod rows;
mod security;
mod space;
mod view;

pub use approvals::Approval;
pub use arenas::LegacyArena;
pub use error::StoreError;
pub use fence::{Abort, ClaimGuard, Finish};
pub use health::{EndpointState, RequestHook, probe_endpoints};
pub use membership::{BootRecord, Joined, RestartState};
pub use presence::apply_controller_event;
pub use security::{EtcdSecurity, SecurityError};
pub use space::{
    Alarm, HISTORY_WARNING_REVISIONS, SpaceFinding, SpaceLevel, SpaceReport, judge_space,
    lease_revocation_warning,
};
pub use view::{
    AuditEntry, AuditItem, AuditView, FenceSummary, MalformedRecord, NodeRow, Owed, Status,
    decode_audit, decode_liveness, json_text,
};

use health::{EndpointHealth, Signals, Watched};

/// Result alias.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

tokio::task_local! {
    static TASK_ROUND_TRIPS: std::cell::Cell<u64>;
}

/// Runs `f` and returns its output with the etcd round trips `f` itself made through
/// any store. Unlike differences of [`EtcdStore::round_trips`], work that other tasks
/// do on a shared store meanwhile (the sweep, the spare-lease refill) is not counted,
/// so the number is exact however busy the controller is. Counts nest: an enclosing
/// `count_round_trips` counts these round trips too.
pub async fn count_round_trips<F: std::future::Future>(f: F) -> (F::Output, u64) {
    let (out, n) = TASK_ROUND_TRIPS
        .scope(std::cell::Cell::new(0), async {
            let out = f.await;
            (out, TASK_ROUND_TRIPS.with(std::cell::Cell::get))
        })
        .await;
    let _ = TASK_ROUND_TRIPS.try_with(|c| c.set(c.get() + n));
    (out, n)
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
    /// Each endpoint as the last probe round saw it ([`EtcdStore::endpoint_rotation`]).
    rotation: Arc<tokio::sync::watch::Sender<Vec<EndpointState>>>,
    /// Malformed records the sweep has logged (escaped key -> mod revision), so each
    /// is logged once ([`view`]).
    malformed_seen: Arc<std::sync::Mutex<std::collections::HashMap<String, i64>>>,
    /// The paged read of the key space ([`view`]): its own KV client (answers up to
    /// [`StoreOptions::read_max_response_bytes`]) and page size.
    reader: view::Reader,
    /// What the store's requests tell the endpoint health ([`EtcdStore::observed`]).
    signals: Arc<Signals>,
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

/// A decimal value (generation, liveness stamp) read back from etcd.
fn parse_u64(kv: &KeyValue) -> Result<u64> {
    crate::keys::decode_u64("decimal number", kv.value()).map_err(|e| StoreError::Malformed {
        key: String::from_utf8_lossy(kv.key()).escape_debug().to_string(),
        what: e.to_string(),
    })
}

fn text(kv: &KeyValue) -> String {
    String::from_utf8_lossy(kv.value()).into_owned()
}

/// An id read back as text (a claim holder, an intent's instance id). A value that is
/// not one is returned quoted and escaped, so it reaches no log raw and no fencer
/// takes it for an id (the EBS fencer refuses anything but an EC2 id).
fn id_text(kv: &KeyValue) -> String {
    crate::keys::decode_id_text("id", kv.value()).unwrap_or_else(|_| crate::keys::shown(kv.value()))
}

fn revision(resp: &TxnResponse) -> i64 {
    resp.header().map_or(0, |h| h.revision())
}

fn absent(key: String) -> Compare {
    Compare::create_revision(key, CompareOp::Equal, 0)
}

/// `node`'s membership is the one created at `membership_rev`: the guard of a write
/// made as a live member (a node whose lease expired, or that joined again since,
/// writes nothing).
fn live_member(k: &Keys, node: &crate::node::NodeId, membership_rev: i64) -> Compare {
    Compare::create_revision(k.membership(node), CompareOp::Equal, membership_rev)
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
    /// HTTP/2 keepalive: a PING is sent after this much silence on a connection that
    /// carries a stream (a watch, the lease keepalive; idle connections are not pinged)...
    /// Keep it at or above etcd's `--grpc-keepalive-min-time` (default 5 s): etcd counts
    /// a PING sooner than that after the previous one as a strike and, at the third,
    /// closes the connection (`GOAWAY too_many_pings`) with every stream on it. At 2 s
    /// a quiet watch lost its connection every 6–15 s against a 3-member cluster
    /// (`tests/http2_keepalive.rs`).
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
    /// (capped by the connect timeout) before that member is taken out of rotation,
    /// and how long a request of the store (or a lease renewal) may go unanswered
    /// before the endpoints are probed. Keep it well under the lease TTL: keepalives
    /// sitting on a hung member are moved only once it is detected (about twice this
    /// after the renewal was sent).
    pub health_timeout: Duration,
    /// TLS files and credentials of every connection (the store's and the health
    /// probe's).
    pub security: EtcdSecurity,
    /// The sweep's and `fenced status`'s read of the key space comes in pages of about
    /// this many bytes (as decoded), every page at the first page's revision, so the
    /// read stays one point-in-time view however large the cluster is. A key space
    /// under this size is one page, one round trip (about 10,000 records of a few
    /// dozen bytes).
    pub read_page_bytes: usize,
    /// The largest answer the paged read accepts (etcd-client's limit for every other
    /// request: 4 MiB). A page that comes back larger (records much larger than
    /// their kind usually is) is read again in smaller pages.
    pub read_max_response_bytes: usize,
}

impl Default for StoreOptions {
    /// Connect 2 s, requests 5 s (a fence transaction's first attempt 2 s), PING
    /// after 5 s of silence (etcd's minimum), dropped after 2 s more; health probes 1 s (etcd's own
    /// `/health` gives its quorum read 1 s); read pages of 1 MiB, a quarter of the
    /// 4 MiB answers are limited to.
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            keepalive_interval: Duration::from_secs(5),
            keepalive_timeout: Duration::from_secs(2),
            first_attempt_timeout: Duration::from_secs(2),
            health_timeout: Duration::from_secs(1),
            security: EtcdSecurity::default(),
            read_page_bytes: 1 << 20,
            read_max_response_bytes: 4 << 20,
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
            .with_keep_alive(opts.keepalive_interval, opts.keepalive_timeout)
            // etcd takes a PING on a connection without a stream as a strike too.
            .with_keep_alive_while_idle(false);
        let copts = opts.security.apply(endpoints, copts)?;
        // Every request passes through the channel `Watched` builds: a slow or failed
        // one triggers a probe of the endpoints.
        let signals = Signals::new(opts.connect_timeout.min(opts.health_timeout));
        let client =
            Client::connect_with_balanced_channel(endpoints, Some(copts), Watched(signals.clone()))
                .await
                .map_err(|e| StoreError::classify("connect", e))?;
        let keys = Keys::new(root);
        let removals = Arc::new(tokio::sync::watch::Sender::new(0));
        let rotation = Arc::new(tokio::sync::watch::Sender::new(Vec::new()));
        let health = match endpoints.len() {
            0 | 1 => None,
            _ => Some(Arc::new(
                EndpointHealth::start(
                    client.clone(),
                    endpoints,
                    keys.root(),
                    opts,
                    removals.clone(),
                    rotation.clone(),
                    signals.clone(),
                )
                .await,
            )),
        };
        let reader = view::Reader::new(&client, opts);
        let store = Self {
            client,
            keys,
            round_trips: Arc::new(AtomicU64::new(0)),
            claim_ttl,
            first_attempt_timeout: opts.first_attempt_timeout,
            spare: Arc::new(Mutex::new(None)),
            removals,
            rotation,
            malformed_seen: Arc::default(),
            reader,
            signals,
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

    /// Each endpoint as the last probe round saw it: in rotation or not, the probe's
    /// verdict and duration. Probing runs with two or more endpoints; with one, this
    /// stays empty.
    pub fn endpoint_rotation(&self) -> tokio::sync::watch::Receiver<Vec<EndpointState>> {
        self.rotation.subscribe()
    }

    /// Sends every request of this store (and its clones) to `hook` as it is
    /// answered ([`RequestHook`]: by operation, since etcd-client's channel does not
    /// say which endpoint served it). One hook per store; `false` if one was set.
    pub fn observe_requests(&self, hook: RequestHook) -> bool {
        self.signals.set_hook(hook)
    }

    /// Awaits `answer`, the answer to a request on a stream the store's channel does
    /// not see (a renewal on a lease keepalive stream), and treats it like the
    /// channel's own requests: unanswered after [`StoreOptions::health_timeout`], the
    /// endpoints are probed at once (the answer is still awaited), so a stream that
    /// sits on a hung member is noticed by its first renewal that goes unanswered.
    pub async fn observed<F: std::future::Future>(&self, op: &'static str, answer: F) -> F::Output {
        self.signals.watch(op, answer).await
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
