//! The EBS fencer: force-detach the shared volume from the victim's instance, then poll
//! `DescribeVolumes` until no attachment to that instance remains.
//!
//! This is the fallback level for volumes that cannot do NVMe reservations (gp3, older
//! io2 attachments). It is weaker evidence than a reservation report: the enforcement is
//! the EC2 control plane detaching the volume, and the evidence is the same control
//! plane describing an asynchronous operation. So it is held to these rules:
//!
//! - **Confirmation is only `DescribeVolumes`.** The `DetachVolume` answer (even
//!   `detached`) never confirms anything; it only starts the operation. A victim is
//!   severed when the volume exists and lists no attachment to its instance (or lists it
//!   as `detached`). `detaching`, `attached` and `busy` are not severed.
//! - **Bounded.** The whole fence (detach, polls, backoff, every HTTP attempt) ends by
//!   [`PollLimits::deadline`] (default 60 s), which must stay below the fence-claim TTL
//!   (120 s) so that a claim never expires under a live fencer. Running out of time is
//!   [`EbsError::Unconfirmed`]: nothing is bumped, the intent stays owed, the sweep retries.
//! - **Idempotent.** An already-detached volume is a confirmed fence: `DetachVolume`
//!   answering "not attached" (`IncorrectState`, `InvalidAttachment.NotFound`) or
//!   "unknown instance" (`InvalidInstanceID.NotFound`) just moves on to the
//!   `DescribeVolumes` check, which decides.
//! - **Errors classified once, here** ([`classify`]): throttling and transient failures
//!   are retried inside the deadline; auth/permission failures fail at once and loudly
//!   (the fence stays owed; retrying cannot help until an operator fixes the role); an
//!   unknown **volume** is a misconfiguration and never counts as severed (a typo in
//!   `--ebs-volume-id` must not turn every fence into a "success"); an unknown
//!   **instance** counts as severed only through `DescribeVolumes` showing no attachment
//!   to it, which is what a terminated instance looks like.
//! - **The instance id comes from the intent** (`fence_pending/<node>`, recorded from the
//!   membership value at join), because the membership key is gone by the time a retry
//!   runs. A victim with no known instance id cannot be fenced by EBS: detaching "every
//!   attachment but ours" would cut off healthy peers of a Multi-Attach volume.
//!
//! A fenced instance is replaced, not resurrected: nothing here ever re-attaches. See
//! `docs/ebs.md`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use aws_credential_types::provider::error::CredentialsError;
use tokio::time::Instant;

use crate::core::{Confirmation, FenceStep, Victim};
use crate::fencer::{BoxFuture, FenceError, Fencer};

mod query;

pub use query::{API_VERSION, ClientError, Ec2Client, regional_endpoint};

/// Default bound on one whole EBS fence.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);

/// The EC2 operations the fencer performs (names as in the EC2 API).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ec2Op {
    /// `DetachVolume` (with `Force=true` and `InstanceId`).
    DetachVolume,
    /// `DescribeVolumes` for the one configured volume.
    DescribeVolumes,
}

impl fmt::Display for Ec2Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::DetachVolume => "DetachVolume",
            Self::DescribeVolumes => "DescribeVolumes",
        })
    }
}

/// What an EC2 API failure means for a fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ec2ErrorKind {
    /// The volume does not exist (`InvalidVolume.NotFound`): a misconfiguration, never
    /// "severed".
    VolumeNotFound,
    /// The instance does not exist (`InvalidInstanceID.NotFound`): it was terminated;
    /// `DescribeVolumes` decides.
    InstanceNotFound,
    /// The volume is not attached to that instance (`IncorrectState`,
    /// `InvalidAttachment.NotFound`): `DescribeVolumes` decides.
    NotAttached,
    /// Authentication or authorisation failed (`UnauthorizedOperation`, `AuthFailure`,
    /// missing credentials...): fail loudly, retrying cannot help.
    Denied,
    /// The request is malformed or refused for another reason (`InvalidParameterValue`,
    /// a malformed id, a request that could not be built): fail loudly.
    Rejected,
    /// Throttled (`RequestLimitExceeded`, HTTP 429...): retry after backoff.
    Throttled,
    /// A transient failure (5xx, connection refused or reset, timeout): retry.
    Transient,
}

impl Ec2ErrorKind {
    /// Whether retrying within the deadline may succeed.
    pub fn is_retryable(self) -> bool {
        matches!(self, Self::Throttled | Self::Transient)
    }
}

/// How an EC2 call failed before any error code could be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// The request could not be built or signed.
    Construction,
    /// The per-attempt timeout fired.
    Timeout,
    /// The request could not be sent or no response came (connection refused...).
    Dispatch,
    /// A response came but could not be parsed.
    Response,
    /// The service answered with an error (code and HTTP status known).
    Service,
}

/// Classifies one EC2 API failure. `code` is the EC2 error code, `status` the HTTP
/// status of the answer, when there was one.
pub fn classify(transport: Transport, code: Option<&str>, status: Option<u16>) -> Ec2ErrorKind {
    match transport {
        Transport::Construction => return Ec2ErrorKind::Rejected,
        Transport::Timeout | Transport::Dispatch | Transport::Response => {
            return Ec2ErrorKind::Transient;
        }
        Transport::Service => {}
    }
    if let Some(code) = code {
        match code {
            "InvalidVolume.NotFound" => return Ec2ErrorKind::VolumeNotFound,
            "InvalidInstanceID.NotFound" => return Ec2ErrorKind::InstanceNotFound,
            "IncorrectState" | "InvalidAttachment.NotFound" => return Ec2ErrorKind::NotAttached,
            "UnauthorizedOperation"
            | "AuthFailure"
            | "InvalidClientTokenId"
            | "SignatureDoesNotMatch"
            | "MissingAuthenticationToken"
            | "OptInRequired"
            | "Blocked"
            | "PendingVerification"
            | "AccessDenied"
            | "AccessDeniedException"
            | "UnrecognizedClientException"
            | "ExpiredToken" => return Ec2ErrorKind::Denied,
            "RequestLimitExceeded"
            | "Throttling"
            | "ThrottlingException"
            | "RequestThrottled"
            | "RequestThrottledException"
            | "TooManyRequestsException"
            | "SlowDown"
            | "EC2ThrottledException" => return Ec2ErrorKind::Throttled,
            "InternalError"
            | "InternalFailure"
            | "ServiceUnavailable"
            | "Unavailable"
            | "RequestTimeout"
            | "RequestTimeoutException"
            | "RequestExpired" => {
                return Ec2ErrorKind::Transient;
            }
            _ => {}
        }
    }
    match status {
        Some(429) => Ec2ErrorKind::Throttled,
        Some(401 | 403) => Ec2ErrorKind::Denied,
        Some(s) if s >= 500 => Ec2ErrorKind::Transient,
        // An unknown 4xx code, or no code at all: not something a retry fixes.
        _ => Ec2ErrorKind::Rejected,
    }
}

/// One failed EC2 API call, classified.
#[derive(Debug, thiserror::Error)]
#[error("{op} {kind:?}{}{}", code.as_deref().map(|c| format!(" ({c})")).unwrap_or_default(), message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
pub struct Ec2Error {
    /// The operation.
    pub op: Ec2Op,
    /// What the failure means.
    pub kind: Ec2ErrorKind,
    /// The EC2 error code, when the service answered.
    pub code: Option<String>,
    /// The service's message, when it answered.
    pub message: Option<String>,
    /// The HTTP status, when there was an answer.
    pub status: Option<u16>,
    /// The underlying error (transport, credentials), if any.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl Ec2Error {
    /// A failure of `op` of kind `kind` (fakes, tests).
    pub fn new(op: Ec2Op, kind: Ec2ErrorKind, code: Option<&str>) -> Self {
        Self {
            op,
            kind,
            code: code.map(str::to_owned),
            message: None,
            status: None,
            source: None,
        }
    }
}

/// No credentials, or a broken credentials configuration, fails loudly; a provider that
/// timed out or failed (IMDS or STS briefly unavailable) is retried.
pub fn classify_credentials(e: &CredentialsError) -> Ec2ErrorKind {
    match e {
        CredentialsError::ProviderTimedOut(_) | CredentialsError::ProviderError(_) => {
            Ec2ErrorKind::Transient
        }
        _ => Ec2ErrorKind::Denied,
    }
}

/// One attachment of the volume, as `DescribeVolumes` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachmentView {
    /// The instance it is attached to.
    pub instance_id: String,
    /// `attaching`, `attached`, `detaching`, `detached`, `busy` (open: EC2 may add more).
    pub state: String,
}

/// The volume as `DescribeVolumes` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeView {
    /// `available`, `in-use`, ...
    pub state: String,
    /// Its attachments.
    pub attachments: Vec<AttachmentView>,
}

impl VolumeView {
    /// The attachment to `instance` that still gives it access: any listed attachment
    /// whose state is not `detached`.
    pub fn live_attachment(&self, instance: &str) -> Option<&AttachmentView> {
        self.attachments
            .iter()
            .find(|a| a.instance_id == instance && a.state != "detached")
    }
}

/// The two EC2 calls, behind a small trait so the fence logic has an in-crate fake.
pub trait Ec2Volumes: Send + Sync + fmt::Debug {
    /// `DetachVolume(VolumeId, InstanceId, Force=true)`; the attachment state it reports.
    fn detach_volume<'a>(
        &'a self,
        volume_id: &'a str,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, Ec2Error>>;
    /// `DescribeVolumes(VolumeIds=[volume_id])`.
    fn describe_volume<'a>(
        &'a self,
        volume_id: &'a str,
    ) -> BoxFuture<'a, Result<VolumeView, Ec2Error>>;
}

/// Timing of one fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollLimits {
    /// Bound on the whole fence (default 60 s; must stay below the fence-claim TTL).
    pub deadline: Duration,
    /// First wait between two `DescribeVolumes` polls (doubles up to `max_backoff`).
    pub first_backoff: Duration,
    /// Longest wait between two polls.
    pub max_backoff: Duration,
    /// If the attachment is still plain `attached` (not `detaching`) this long after a
    /// `DetachVolume`, send it again: the first may have been lost.
    pub redetach_after: Duration,
}

impl Default for PollLimits {
    fn default() -> Self {
        Self {
            deadline: DEFAULT_DEADLINE,
            first_backoff: Duration::from_millis(250),
            max_backoff: Duration::from_secs(4),
            redetach_after: Duration::from_secs(10),
        }
    }
}

impl PollLimits {
    /// Checks the limits against the fence-claim TTL: a claim must outlive the fence.
    pub fn check(&self, claim_ttl: Duration) -> Result<(), EbsError> {
        let ok = !self.deadline.is_zero()
            && self.deadline < claim_ttl
            && !self.first_backoff.is_zero()
            && self.first_backoff <= self.max_backoff;
        if ok {
            Ok(())
        } else {
            Err(EbsError::BadLimits {
                limits: *self,
                claim_ttl,
            })
        }
    }
}

/// Configuration of the EBS fencer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EbsConfig {
    /// The shared volume (`vol-…`).
    pub volume_id: String,
    /// The region; `None` takes it from the standard chain (`AWS_REGION`, profile, IMDS).
    pub region: Option<String>,
    /// An endpoint override (a VPC endpoint, or a test peer); `None` uses the regional one.
    pub endpoint_url: Option<String>,
    /// Timing.
    pub limits: PollLimits,
}

impl EbsConfig {
    /// A config for `volume_id` with the default chain and limits.
    pub fn new(volume_id: impl Into<String>) -> Self {
        Self {
            volume_id: volume_id.into(),
            region: None,
            endpoint_url: None,
            limits: PollLimits::default(),
        }
    }

    /// The config loader: the standard credential chain (environment, profile, web
    /// identity, ECS, IMDSv2 instance profile), region and endpoint override, and HTTP
    /// timeouts well inside the fence deadline (used by [`Ec2Client`] for every call; the
    /// retry setting applies to the credential providers' own calls, the fence loop
    /// retries EC2 calls itself). Tests add static credentials to it before loading.
    pub fn loader(&self) -> aws_config::ConfigLoader {
        let attempt =
            (self.limits.deadline / 4).clamp(Duration::from_millis(500), Duration::from_secs(10));
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(3))
            .timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(3).min(attempt))
                    .operation_attempt_timeout(attempt)
                    .build(),
            );
        if let Some(region) = &self.region {
            loader = loader.region(aws_config::Region::new(region.clone()));
        }
        if let Some(url) = &self.endpoint_url {
            loader = loader.endpoint_url(url);
        }
        loader
    }
}

/// Why an EBS fence did not confirm. Every variant leaves the fence owed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EbsError {
    /// The intent records no instance id for the node, so there is no attachment to
    /// sever (detaching every other attachment would cut off healthy peers).
    #[error(
        "node {node}: no instance id recorded in the fence intent; cannot choose an attachment to detach from {volume_id}"
    )]
    NoInstanceId {
        /// The victim.
        node: String,
        /// The volume.
        volume_id: String,
    },
    /// The configured volume does not exist: a misconfiguration, never "severed".
    #[error("volume {volume_id} not found ({op}): check --ebs-volume-id and --ebs-region")]
    VolumeNotFound {
        /// The volume.
        volume_id: String,
        /// The call that said so.
        op: Ec2Op,
        /// The EC2 error.
        #[source]
        source: Box<Ec2Error>,
    },
    /// Authentication or authorisation failed: the fence cannot proceed until an operator
    /// fixes the credentials or the role (ec2:DetachVolume, ec2:DescribeVolumes).
    #[error("EC2 refused our credentials for {volume_id}: {source}")]
    Denied {
        /// The volume.
        volume_id: String,
        /// The EC2 error.
        #[source]
        source: Box<Ec2Error>,
    },
    /// EC2 rejected the request (a malformed id, an invalid parameter...).
    #[error("EC2 rejected the request for {volume_id}: {source}")]
    Rejected {
        /// The volume.
        volume_id: String,
        /// The EC2 error.
        #[source]
        source: Box<Ec2Error>,
    },
    /// The deadline passed and `DescribeVolumes` never showed the attachment gone.
    #[error(
        "attachment of {volume_id} to {instance_id} not confirmed gone after {waited:?} ({polls} poll(s), last state {}{})",
        last_state.as_deref().unwrap_or("unknown"),
        last_error.as_ref().map(|e| format!(", last error: {e}")).unwrap_or_default()
    )]
    Unconfirmed {
        /// The volume.
        volume_id: String,
        /// The victim's instance.
        instance_id: String,
        /// Time spent.
        waited: Duration,
        /// `DescribeVolumes` answers received.
        polls: u32,
        /// The attachment's last observed state.
        last_state: Option<String>,
        /// The last retryable failure, if any.
        #[source]
        last_error: Option<Box<Ec2Error>>,
    },
    /// The SDK config has no region.
    #[error("no AWS region: pass --ebs-region or set AWS_REGION")]
    NoRegion,
    /// The EC2 client cannot be built (no credentials provider, a bad endpoint URL, no
    /// TLS trust roots).
    #[error("cannot build the EC2 client: {0}")]
    Client(#[source] ClientError),
    /// The limits do not fit the fence-claim TTL.
    #[error(
        "EBS fence limits {limits:?} invalid: the deadline must be non-zero and below the fence-claim TTL {claim_ttl:?}"
    )]
    BadLimits {
        /// The refused limits.
        limits: PollLimits,
        /// The claim TTL.
        claim_ttl: Duration,
    },
}

impl EbsError {
    /// The protocol step that failed.
    pub fn step(&self) -> FenceStep {
        match self {
            Self::NoInstanceId { .. } | Self::Denied { .. } | Self::Rejected { .. } => {
                FenceStep::Sever
            }
            Self::VolumeNotFound { op, .. } => match op {
                Ec2Op::DetachVolume => FenceStep::Sever,
                Ec2Op::DescribeVolumes => FenceStep::Verify,
            },
            Self::Unconfirmed { .. }
            | Self::NoRegion
            | Self::Client(_)
            | Self::BadLimits { .. } => FenceStep::Verify,
        }
    }

    /// Whether a later attempt (the sweep) may succeed without an operator: only running
    /// out of time. Everything else needs a fix, and the sweep keeps logging it.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unconfirmed { .. })
    }
}

impl From<EbsError> for FenceError {
    fn from(e: EbsError) -> Self {
        Self {
            step: e.step(),
            message: format!("ebs: {e}"),
            source: Some(Box::new(e)),
        }
    }
}

/// The EBS fencer. See the module docs.
#[derive(Debug, Clone)]
pub struct EbsFencer {
    api: Arc<dyn Ec2Volumes>,
    volume_id: String,
    limits: PollLimits,
}

impl EbsFencer {
    /// A fencer for `volume_id` over `api`.
    pub fn new(api: Arc<dyn Ec2Volumes>, volume_id: impl Into<String>, limits: PollLimits) -> Self {
        Self {
            api,
            volume_id: volume_id.into(),
            limits,
        }
    }

    /// A fencer on the EC2 Query API with the standard chain, checking the limits against
    /// `claim_ttl`.
    pub async fn connect(config: &EbsConfig, claim_ttl: Duration) -> Result<Self, EbsError> {
        let sdk = config.loader().load().await;
        Self::from_sdk_config(config, &sdk, claim_ttl)
    }

    /// A fencer on an already loaded SDK config (region, credentials, endpoint override,
    /// timeouts; tests add static credentials).
    pub fn from_sdk_config(
        config: &EbsConfig,
        sdk: &aws_config::SdkConfig,
        claim_ttl: Duration,
    ) -> Result<Self, EbsError> {
        config.limits.check(claim_ttl)?;
        let client = Ec2Client::new(sdk).map_err(|e| match e {
            ClientError::NoRegion => EbsError::NoRegion,
            other => EbsError::Client(other),
        })?;
        Ok(Self::new(
            Arc::new(client),
            config.volume_id.clone(),
            config.limits,
        ))
    }

    /// The configured volume.
    pub fn volume_id(&self) -> &str {
        &self.volume_id
    }

    /// Detaches the volume from `victim`'s instance and waits for `DescribeVolumes` to
    /// confirm it.
    pub async fn sever(&self, victim: &Victim) -> Result<Confirmation, EbsError> {
        let vol = self.volume_id.as_str();
        let instance = victim.instance.trim();
        if instance.is_empty() {
            return Err(EbsError::NoInstanceId {
                node: victim.node.to_string(),
                volume_id: vol.to_owned(),
            });
        }
        let start = Instant::now();
        let deadline = start + self.limits.deadline;
        let mut backoff = self.limits.first_backoff;
        let mut detached_at: Option<Instant> = None;
        let mut detach_note = String::from("DetachVolume not answered");
        let mut detach_calls = 0u32;
        let mut polls = 0u32;
        let mut last_state: Option<String> = None;
        let mut last_error: Option<Box<Ec2Error>> = None;

        while Instant::now() < deadline {
            let resend = match detached_at {
                None => true,
                Some(at) => {
                    last_state.as_deref() == Some("attached")
                        && at.elapsed() >= self.limits.redetach_after
                }
            };
            if resend {
                detach_calls += 1;
                let r =
                    tokio::time::timeout_at(deadline, self.api.detach_volume(vol, instance)).await;
                let Ok(r) = r else { break };
                match r {
                    Ok(state) => {
                        detached_at = Some(Instant::now());
                        detach_note = format!(
                            "DetachVolume(Force) answered {}",
                            state.as_deref().unwrap_or("no state")
                        );
                    }
                    Err(e) => match e.kind {
                        Ec2ErrorKind::NotAttached | Ec2ErrorKind::InstanceNotFound => {
                            detached_at = Some(Instant::now());
                            detach_note = format!(
                                "DetachVolume: {}",
                                e.code.as_deref().unwrap_or("not attached")
                            );
                        }
                        Ec2ErrorKind::VolumeNotFound => {
                            return Err(EbsError::VolumeNotFound {
                                volume_id: vol.to_owned(),
                                op: Ec2Op::DetachVolume,
                                source: Box::new(e),
                            });
                        }
                        Ec2ErrorKind::Denied => {
                            return Err(EbsError::Denied {
                                volume_id: vol.to_owned(),
                                source: Box::new(e),
                            });
                        }
                        // Throttled or transient: still poll, the volume may already
                        // be detached (a retry of an earlier fence).
                        k if k.is_retryable() => last_error = Some(Box::new(e)),
                        _ => {
                            return Err(EbsError::Rejected {
                                volume_id: vol.to_owned(),
                                source: Box::new(e),
                            });
                        }
                    },
                }
            }

            let r = tokio::time::timeout_at(deadline, self.api.describe_volume(vol)).await;
            let Ok(r) = r else { break };
            match r {
                Ok(view) => {
                    polls += 1;
                    match view.live_attachment(instance) {
                        None => {
                            let others = view
                                .attachments
                                .iter()
                                .filter(|a| a.instance_id != instance && a.state != "detached")
                                .count();
                            return Ok(Confirmation {
                                fencer: "ebs".to_owned(),
                                severed: true,
                                evidence: format!(
                                    "volume {vol}: DescribeVolumes lists no attachment to {instance} \
                                     (volume {}, {others} other live attachment(s)); {detach_note}; \
                                     {detach_calls} detach call(s), {polls} poll(s) in {:?}",
                                    if view.state.is_empty() {
                                        "state unknown"
                                    } else {
                                        &view.state
                                    },
                                    start.elapsed()
                                ),
                            });
                        }
                        Some(a) => last_state = Some(a.state.clone()),
                    }
                }
                Err(e) => match e.kind {
                    Ec2ErrorKind::VolumeNotFound => {
                        return Err(EbsError::VolumeNotFound {
                            volume_id: vol.to_owned(),
                            op: Ec2Op::DescribeVolumes,
                            source: Box::new(e),
                        });
                    }
                    Ec2ErrorKind::Denied => {
                        return Err(EbsError::Denied {
                            volume_id: vol.to_owned(),
                            source: Box::new(e),
                        });
                    }
                    k if k.is_retryable() => last_error = Some(Box::new(e)),
                    _ => {
                        return Err(EbsError::Rejected {
                            volume_id: vol.to_owned(),
                            source: Box::new(e),
                        });
                    }
                },
            }

            let now = Instant::now();
            if now >= deadline {
                break;
            }
            tokio::time::sleep(backoff.min(deadline - now)).await;
            backoff = (backoff * 2).min(self.limits.max_backoff);
        }
        Err(EbsError::Unconfirmed {
            volume_id: vol.to_owned(),
            instance_id: instance.to_owned(),
            waited: start.elapsed(),
            polls,
            last_state,
            last_error,
        })
    }
}

impl Fencer for EbsFencer {
    fn name(&self) -> &'static str {
        "ebs"
    }

    fn fence<'a>(&'a self, victim: &'a Victim) -> BoxFuture<'a, Result<Confirmation, FenceError>> {
        Box::pin(async move { self.sever(victim).await.map_err(FenceError::from) })
    }
}

/// Fencing levels, as in Pacemaker: each level is tried in order and the first that
/// confirms wins (NVMe preferred, EBS as the fallback when the NVMe fence cannot be
/// confirmed). If no level confirms, the fence is not confirmed and stays owed; the
/// error carries every level's failure. A level answering `severed: false` (single
/// signal) is not a confirmation either, so the next level is tried.
#[derive(Debug, Clone)]
pub struct FencingLevels {
    levels: Vec<Arc<dyn Fencer>>,
    name: &'static str,
}

impl FencingLevels {
    /// Levels tried in the order given (at least one).
    pub fn new(levels: Vec<Arc<dyn Fencer>>) -> Self {
        assert!(
            !levels.is_empty(),
            "FencingLevels needs at least one fencer"
        );
        let names: Vec<&str> = levels.iter().map(|l| l.name()).collect();
        // Built once per daemon; the trait wants a `&'static str` (e.g. `nvme+ebs`).
        let name = Box::leak(names.join("+").into_boxed_str());
        Self { levels, name }
    }
}

impl Fencer for FencingLevels {
    fn name(&self) -> &'static str {
        // The confirmation's `fencer` (in the audit record's signals) names the level
        // that confirmed.
        self.name
    }

    fn fence<'a>(&'a self, victim: &'a Victim) -> BoxFuture<'a, Result<Confirmation, FenceError>> {
        Box::pin(async move {
            let mut failed: Vec<String> = Vec::new();
            let mut last: Option<FenceError> = None;
            for level in &self.levels {
                match level.fence(victim).await {
                    Ok(c) if c.severed => {
                        let mut c = c;
                        if !failed.is_empty() {
                            c.evidence = format!("{} (after: {})", c.evidence, failed.join("; "));
                        }
                        return Ok(c);
                    }
                    Ok(c) => {
                        failed.push(format!("{}: not severed ({})", level.name(), c.evidence));
                    }
                    Err(e) => {
                        tracing::warn!(
                            node = %victim.node,
                            fencer = level.name(),
                            error = %e,
                            "fencing level failed; trying the next level"
                        );
                        failed.push(format!("{}: {e}", level.name()));
                        last = Some(e);
                    }
                }
            }
            let step = last.as_ref().map_or(FenceStep::Verify, |e| e.step);
            Err(FenceError {
                step,
                message: format!("no fencing level confirmed: {}", failed.join("; ")),
                source: last.map(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use super::*;
    use crate::node::NodeId;

    /// Scripted EC2: each call pops the next answer of its queue; an empty queue
    /// repeats the last answer given.
    #[derive(Debug, Default)]
    struct Script {
        detach: Mutex<VecDeque<Result<Option<String>, Ec2ErrorKind>>>,
        describe: Mutex<VecDeque<Result<VolumeView, Ec2ErrorKind>>>,
        last_describe: Mutex<Option<Result<VolumeView, Ec2ErrorKind>>>,
        calls: Mutex<Vec<Ec2Op>>,
        describe_delay: Option<Duration>,
    }

    impl Script {
        fn detach(self, a: Result<Option<&str>, Ec2ErrorKind>) -> Self {
            self.detach
                .lock()
                .unwrap()
                .push_back(a.map(|s| s.map(str::to_owned)));
            self
        }
        fn describe(self, a: Result<VolumeView, Ec2ErrorKind>) -> Self {
            self.describe.lock().unwrap().push_back(a);
            self
        }
        fn calls(&self, op: Ec2Op) -> usize {
            self.calls
                .lock()
                .unwrap()
                .iter()
                .filter(|c| **c == op)
                .count()
        }
    }

    impl Ec2Volumes for Script {
        fn detach_volume<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
        ) -> BoxFuture<'a, Result<Option<String>, Ec2Error>> {
            self.calls.lock().unwrap().push(Ec2Op::DetachVolume);
            let a = self
                .detach
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Ok(Some("detaching".into())));
            Box::pin(async move { a.map_err(|k| Ec2Error::new(Ec2Op::DetachVolume, k, None)) })
        }
        fn describe_volume<'a>(
            &'a self,
            _: &'a str,
        ) -> BoxFuture<'a, Result<VolumeView, Ec2Error>> {
            self.calls.lock().unwrap().push(Ec2Op::DescribeVolumes);
            let mut last = self.last_describe.lock().unwrap();
            let a = match self.describe.lock().unwrap().pop_front() {
                Some(a) => {
                    *last = Some(a.clone());
                    a
                }
                None => last.clone().expect("describe script empty"),
            };
            let delay = self.describe_delay;
            Box::pin(async move {
                if let Some(d) = delay {
                    tokio::time::sleep(d).await;
                }
                a.map_err(|k| Ec2Error::new(Ec2Op::DescribeVolumes, k, None))
            })
        }
    }

    fn vol(atts: &[(&str, &str)]) -> VolumeView {
        VolumeView {
            state: if atts.is_empty() {
                "available"
            } else {
                "in-use"
            }
            .into(),
            attachments: atts
                .iter()
                .map(|(i, s)| AttachmentView {
                    instance_id: (*i).into(),
                    state: (*s).into(),
                })
                .collect(),
        }
    }

    fn victim(instance: &str) -> Victim {
        Victim {
            node: NodeId::new("n1").unwrap(),
            instance: instance.into(),
        }
    }

    fn fast() -> PollLimits {
        PollLimits {
            deadline: Duration::from_millis(400),
            first_backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(20),
            redetach_after: Duration::from_millis(100),
        }
    }

    fn fencer(s: &Arc<Script>) -> EbsFencer {
        EbsFencer::new(s.clone(), "vol-1", fast())
    }

    #[tokio::test]
    async fn polls_until_the_attachment_is_gone() {
        let s = Arc::new(
            Script::default()
                .describe(Ok(vol(&[("i-v", "detaching"), ("i-s", "attached")])))
                .describe(Ok(vol(&[("i-v", "detaching"), ("i-s", "attached")])))
                .describe(Ok(vol(&[("i-s", "attached")]))),
        );
        let c = fencer(&s).sever(&victim("i-v")).await.unwrap();
        assert!(c.severed);
        assert_eq!(c.fencer, "ebs");
        assert!(
            c.evidence.contains("1 other live attachment"),
            "{}",
            c.evidence
        );
        assert_eq!(s.calls(Ec2Op::DescribeVolumes), 3);
        assert_eq!(s.calls(Ec2Op::DetachVolume), 1);
    }

    #[tokio::test]
    async fn detach_answer_alone_never_confirms() {
        // DetachVolume says "detached" but DescribeVolumes keeps listing the attachment.
        let s = Arc::new(
            Script::default()
                .detach(Ok(Some("detached")))
                .describe(Ok(vol(&[("i-v", "attached")]))),
        );
        let e = fencer(&s).sever(&victim("i-v")).await.unwrap_err();
        match &e {
            EbsError::Unconfirmed {
                polls, last_state, ..
            } => {
                assert!(*polls >= 2);
                assert_eq!(last_state.as_deref(), Some("attached"));
            }
            other => panic!("{other:?}"),
        }
        assert!(e.is_retryable());
        assert_eq!(e.step(), FenceStep::Verify);
        // Still "attached" long after the detach: it is sent again.
        assert!(s.calls(Ec2Op::DetachVolume) >= 2);
    }

    #[tokio::test]
    async fn detaching_is_not_severed_and_not_resent() {
        let s = Arc::new(Script::default().describe(Ok(vol(&[("i-v", "detaching")]))));
        let e = fencer(&s).sever(&victim("i-v")).await.unwrap_err();
        assert!(matches!(e, EbsError::Unconfirmed { .. }), "{e:?}");
        assert_eq!(s.calls(Ec2Op::DetachVolume), 1);
    }

    #[tokio::test]
    async fn already_detached_is_success() {
        let s = Arc::new(
            Script::default()
                .detach(Err(Ec2ErrorKind::NotAttached))
                .describe(Ok(vol(&[("i-v", "detached")]))),
        );
        let c = fencer(&s).sever(&victim("i-v")).await.unwrap();
        assert!(c.severed);
        assert_eq!(s.calls(Ec2Op::DescribeVolumes), 1);
    }

    #[tokio::test]
    async fn terminated_instance_is_severed_through_describe() {
        let s = Arc::new(
            Script::default()
                .detach(Err(Ec2ErrorKind::InstanceNotFound))
                .describe(Ok(vol(&[]))),
        );
        assert!(fencer(&s).sever(&victim("i-gone")).await.unwrap().severed);
    }

    #[tokio::test]
    async fn unknown_volume_is_not_severed() {
        let s = Arc::new(Script::default().detach(Err(Ec2ErrorKind::VolumeNotFound)));
        let e = fencer(&s).sever(&victim("i-v")).await.unwrap_err();
        assert!(
            matches!(
                e,
                EbsError::VolumeNotFound {
                    op: Ec2Op::DetachVolume,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(!e.is_retryable());
        let s = Arc::new(Script::default().describe(Err(Ec2ErrorKind::VolumeNotFound)));
        let e = fencer(&s).sever(&victim("i-v")).await.unwrap_err();
        assert!(
            matches!(
                e,
                EbsError::VolumeNotFound {
                    op: Ec2Op::DescribeVolumes,
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn denied_fails_at_once() {
        let s = Arc::new(Script::default().detach(Err(Ec2ErrorKind::Denied)));
        let e = fencer(&s).sever(&victim("i-v")).await.unwrap_err();
        assert!(matches!(e, EbsError::Denied { .. }), "{e:?}");
        assert_eq!(s.calls(Ec2Op::DescribeVolumes), 0);
        let fe = FenceError::from(e);
        assert_eq!(fe.step, FenceStep::Sever);
        assert!(fe.message.contains("credentials"), "{fe}");
    }

    #[tokio::test]
    async fn throttling_is_retried_within_the_deadline() {
        let s = Arc::new(
            Script::default()
                .detach(Err(Ec2ErrorKind::Throttled))
                .detach(Err(Ec2ErrorKind::Transient))
                .detach(Ok(Some("detaching")))
                .describe(Err(Ec2ErrorKind::Throttled))
                .describe(Ok(vol(&[("i-v", "attached")])))
                .describe(Ok(vol(&[("i-v", "detaching")])))
                .describe(Ok(vol(&[]))),
        );
        assert!(fencer(&s).sever(&victim("i-v")).await.unwrap().severed);
        assert_eq!(s.calls(Ec2Op::DetachVolume), 3);
        assert_eq!(s.calls(Ec2Op::DescribeVolumes), 4);
    }

    #[tokio::test]
    async fn throttled_to_the_end_is_unconfirmed_with_the_cause() {
        let s = Arc::new(
            Script::default()
                .detach(Err(Ec2ErrorKind::Throttled))
                .describe(Err(Ec2ErrorKind::Throttled)),
        );
        let t = Instant::now();
        let e = fencer(&s).sever(&victim("i-v")).await.unwrap_err();
        let EbsError::Unconfirmed {
            last_error, waited, ..
        } = &e
        else {
            panic!("{e:?}")
        };
        assert_eq!(last_error.as_ref().unwrap().kind, Ec2ErrorKind::Throttled);
        assert!(*waited >= fast().deadline && t.elapsed() < fast().deadline * 3);
    }

    #[tokio::test]
    async fn a_hung_call_ends_at_the_deadline() {
        let s = Arc::new(Script {
            describe_delay: Some(Duration::from_secs(3600)),
            ..Script::default()
        });
        s.describe.lock().unwrap().push_back(Ok(vol(&[])));
        let t = Instant::now();
        let e = fencer(&s).sever(&victim("i-v")).await.unwrap_err();
        assert!(matches!(e, EbsError::Unconfirmed { polls: 0, .. }), "{e:?}");
        assert!(t.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn no_instance_id_cannot_be_fenced() {
        let s = Arc::new(Script::default());
        let e = fencer(&s).sever(&victim(" ")).await.unwrap_err();
        assert!(matches!(e, EbsError::NoInstanceId { .. }), "{e:?}");
        assert!(s.calls.lock().unwrap().is_empty());
    }

    #[test]
    fn classification() {
        use Ec2ErrorKind::*;
        use Transport::*;
        let cases: &[(Transport, Option<&str>, Option<u16>, Ec2ErrorKind)] = &[
            (
                Service,
                Some("InvalidVolume.NotFound"),
                Some(400),
                VolumeNotFound,
            ),
            (
                Service,
                Some("InvalidInstanceID.NotFound"),
                Some(400),
                InstanceNotFound,
            ),
            (Service, Some("IncorrectState"), Some(400), NotAttached),
            (
                Service,
                Some("InvalidAttachment.NotFound"),
                Some(400),
                NotAttached,
            ),
            (Service, Some("UnauthorizedOperation"), Some(403), Denied),
            (Service, Some("AuthFailure"), Some(401), Denied),
            (Service, None, Some(403), Denied),
            (Service, Some("RequestLimitExceeded"), Some(503), Throttled),
            (Service, Some("SomethingNew"), Some(429), Throttled),
            (Service, Some("InternalError"), Some(500), Transient),
            (Service, Some("SomethingNew"), Some(502), Transient),
            (Service, Some("InvalidParameterValue"), Some(400), Rejected),
            (
                Service,
                Some("InvalidVolumeID.Malformed"),
                Some(400),
                Rejected,
            ),
            (Construction, None, None, Rejected),
            (Dispatch, None, None, Transient),
            (Timeout, None, None, Transient),
            (Response, None, Some(200), Transient),
        ];
        for (t, code, status, want) in cases {
            assert_eq!(
                classify(*t, *code, *status),
                *want,
                "{t:?} {code:?} {status:?}"
            );
        }
        assert!(Throttled.is_retryable() && Transient.is_retryable());
        assert!(
            !Denied.is_retryable() && !VolumeNotFound.is_retryable() && !Rejected.is_retryable()
        );
    }

    #[test]
    fn limits_must_fit_the_claim_ttl() {
        let ttl = Duration::from_secs(120);
        assert!(PollLimits::default().check(ttl).is_ok());
        let long = PollLimits {
            deadline: ttl,
            ..PollLimits::default()
        };
        assert!(matches!(long.check(ttl), Err(EbsError::BadLimits { .. })));
        let zero = PollLimits {
            deadline: Duration::ZERO,
            ..PollLimits::default()
        };
        assert!(zero.check(ttl).is_err());
    }

    #[derive(Debug)]
    struct Fixed(&'static str, Option<bool>);

    impl Fencer for Fixed {
        fn name(&self) -> &'static str {
            self.0
        }
        fn fence<'a>(&'a self, _: &'a Victim) -> BoxFuture<'a, Result<Confirmation, FenceError>> {
            let r = match self.1 {
                Some(severed) => Ok(Confirmation {
                    fencer: self.0.to_owned(),
                    severed,
                    evidence: format!("{} evidence", self.0),
                }),
                None => Err(FenceError::new(
                    FenceStep::Verify,
                    format!("{} failed", self.0),
                )),
            };
            Box::pin(async move { r })
        }
    }

    #[tokio::test]
    async fn levels_fall_back_in_order() {
        let v = victim("i-v");
        let nvme_ok = FencingLevels::new(vec![
            Arc::new(Fixed("nvme", Some(true))),
            Arc::new(Fixed("ebs", None)),
        ]);
        assert_eq!(nvme_ok.name(), "nvme+ebs");
        let c = nvme_ok.fence(&v).await.unwrap();
        assert_eq!(
            (c.fencer.as_str(), c.evidence.as_str()),
            ("nvme", "nvme evidence")
        );

        let fallback = FencingLevels::new(vec![
            Arc::new(Fixed("nvme", None)),
            Arc::new(Fixed("ebs", Some(true))),
        ]);
        let c = fallback.fence(&v).await.unwrap();
        assert_eq!(c.fencer, "ebs");
        assert!(
            c.evidence
                .contains("after: nvme: verify failed: nvme failed"),
            "{}",
            c.evidence
        );

        let none = FencingLevels::new(vec![
            Arc::new(Fixed("nvme", None)),
            Arc::new(Fixed("ebs", None)),
        ]);
        let e = none.fence(&v).await.unwrap_err();
        assert!(
            e.message.contains("nvme") && e.message.contains("ebs failed"),
            "{e}"
        );

        // Single-signal is not a confirmation: the next level runs.
        let weak = FencingLevels::new(vec![
            Arc::new(Fixed("none", Some(false))),
            Arc::new(Fixed("ebs", Some(true))),
        ]);
        assert_eq!(weak.fence(&v).await.unwrap().fencer, "ebs");
    }
}
