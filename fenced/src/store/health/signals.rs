//! What the store's own requests say about etcd: every request passes through the
//! channel [`Watched`] builds; a slow or failed one wakes the prober at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tonic::codegen::http;

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
pub(in crate::store) struct Signals {
    /// A request unanswered this long is slow.
    slow_after: Duration,
    pub(super) wake: tokio::sync::Notify,
    /// The first signal since the last round (for the log).
    why: Mutex<Option<String>>,
    hook: OnceLock<RequestHook>,
}

impl Signals {
    pub(in crate::store) fn new(slow_after: Duration) -> Arc<Self> {
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

    pub(super) fn take_why(&self) -> Option<String> {
        self.why
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Sets the hook that receives every request; `false` if one was set already.
    pub(in crate::store) fn set_hook(&self, hook: RequestHook) -> bool {
        self.hook.set(hook).is_ok()
    }

    fn record(&self, op: &'static str, took: Duration, result: &'static str) {
        if let Some(h) = self.hook.get() {
            h(op, took, result);
        }
    }

    /// Awaits `answer`; if it is not there after `slow_after`, signals *slow* at that
    /// moment and goes on waiting.
    pub(in crate::store) async fn watch<F: Future>(
        &self,
        op: &'static str,
        answer: F,
    ) -> F::Output {
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
pub(in crate::store) struct Watched(pub(in crate::store) Arc<Signals>);

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

#[cfg(test)]
mod tests {
    use super::*;

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
