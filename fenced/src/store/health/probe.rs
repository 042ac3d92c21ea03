//! One probe of an etcd endpoint and its verdict (serves, degraded, silent,
//! refused), the rotation rule over verdicts, and `fenced check`'s one-shot probe of
//! every endpoint.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions};

use super::StoreOptions;

/// A probe's read that has not answered within its timeout / this is slow: only then
/// are `Status` and a TCP connect sent beside it.
const HEDGE_DIVISOR: u32 = 4;

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
pub(super) enum Probe {
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

    pub(super) fn serves(&self) -> bool {
        *self == Self::Serves
    }

    pub(super) fn answers(&self) -> bool {
        matches!(self, Self::Serves | Self::Degraded(_))
    }

    /// What is wrong with the endpoint and what the operator should check.
    pub(super) fn trouble(&self, timeout: Duration) -> String {
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
pub(super) fn rotation(probes: &[Probe]) -> Vec<bool> {
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
pub(super) struct Target {
    pub(super) endpoint: String,
    pub(super) client: Option<Client>,
}

/// Probes `endpoint` once within `timeout`: a linearizable count-only read of `key`
/// through `client`, and only if that has not answered within a quarter of the
/// timeout, a `Status` call and a TCP connect beside it (so a healthy member costs
/// one request and no new connection).
pub(super) async fn probe_endpoint(
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
/// [`EtcdStore::endpoint_rotation`]: crate::store::EtcdStore::endpoint_rotation
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
    pub(super) fn verdict(&self) -> &'static str {
        match self {
            Self::Serves => "serves",
            Self::Degraded(_) => "degraded",
            Self::Silent => "silent",
            Self::Refused => "refused",
        }
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
}
