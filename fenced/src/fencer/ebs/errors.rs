//! The EC2 error taxonomy: every EC2 failure is classified once ([`classify`],
//! [`classify_credentials`]) into an [`Ec2ErrorKind`], and what a kind means for the
//! fence is decided once ([`EbsError::retry_or_stop`]).

use std::fmt;
use std::time::Duration;

use aws_credential_types::provider::error::CredentialsError;

use super::{ClientError, PollLimits};
use crate::core::FenceStep;
use crate::fencer::{FenceCause, FenceError};

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

/// The details of [`EbsError::UnknownAttachment`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unaccounted {
    /// The volume.
    pub volume_id: String,
    /// The victim.
    pub node: String,
    /// The victim's recorded instance id.
    pub instance_id: String,
    /// Live attachments not accounted for by another node.
    pub others: Vec<String>,
    /// Why the other nodes' instance ids could not be read, if they could not.
    pub lookup_error: Option<String>,
}

impl fmt::Display for Unaccounted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self {
            volume_id,
            node,
            instance_id,
            others,
            lookup_error,
        } = self;
        write!(
            f,
            "volume {volume_id}: no attachment to {instance_id} (node {node}), but EC2 never \
             showed {instance_id} attached and the volume is attached to {} which no other node \
             is recorded on",
            others.join(", ")
        )?;
        if let Some(e) = lookup_error {
            write!(f, " (the cluster's instance ids could not be read: {e})")?;
        }
        f.write_str(
            ": the recorded id may be wrong; not confirmed. Check the node's instance id, and \
             detach its real instance by hand if it is one of those",
        )
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
    /// The instance id recorded for the node (read back from etcd) is not an EC2
    /// instance id: nothing is sent to EC2.
    #[error(
        "node {node}: recorded instance id {instance_id:?} is not an EC2 instance id (i- and 8 or 17 hex digits); cannot fence it by EBS: detach its instance from the volume by hand, then `fenced attest`"
    )]
    BadInstanceId {
        /// The victim.
        node: String,
        /// The refused id (printed escaped).
        instance_id: String,
    },
    /// The volume lists no attachment to the victim's instance, but EC2 never showed
    /// that instance attached during the fence and the volume is attached to instances
    /// no other node is recorded on: the recorded id may be wrong (a typo, a stale
    /// record) while the victim's real instance is one of those. Not severed.
    #[error("{0}")]
    UnknownAttachment(Box<Unaccounted>),
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
    /// The limits are invalid, or their deadline does not fit the fence-claim TTL's
    /// budget ([`crate::core::ClaimBudget`]).
    #[error("{}", bad_limits(.limits, *.claim_ttl))]
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
            Self::NoInstanceId { .. }
            | Self::BadInstanceId { .. }
            | Self::Denied { .. }
            | Self::Rejected { .. } => FenceStep::Sever,
            Self::VolumeNotFound { op, .. } => match op {
                Ec2Op::DetachVolume => FenceStep::Sever,
                Ec2Op::DescribeVolumes => FenceStep::Verify,
            },
            Self::Unconfirmed { .. }
            | Self::UnknownAttachment(_)
            | Self::NoRegion
            | Self::Client(_)
            | Self::BadLimits { .. } => FenceStep::Verify,
        }
    }

    /// Whether nothing but an operator can make a later attempt at this victim succeed:
    /// the instance id recorded for the node is missing or not an EC2 id. It was read
    /// from etcd and stays what it is until the node registers again or an operator
    /// fences it (`fenced attest`), so retrying every sweep only repeats the failure.
    /// (A denied call or an unknown volume may be fixed by IAM or configuration
    /// without touching the node's record: those keep being retried.)
    pub fn needs_operator(&self) -> bool {
        matches!(self, Self::NoInstanceId { .. } | Self::BadInstanceId { .. })
    }

    /// Whether a later attempt (the sweep) may succeed without an operator: only running
    /// out of time. Everything else needs a fix, and the sweep keeps logging it.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unconfirmed { .. })
    }

    /// What a failed call of the fence loop means, decided here once for both calls:
    /// `Ok(e)` when a retry inside the deadline may succeed (throttled, transient: the
    /// loop keeps `e` as the last error and polls on), `Err` when the fence must stop
    /// (an unknown volume, refused credentials, a rejected request). The answers that
    /// mean "not attached" are the caller's to take first: only `DetachVolume` has
    /// them, and from any other call they are a rejection.
    pub fn retry_or_stop(volume_id: &str, e: Ec2Error) -> Result<Box<Ec2Error>, Self> {
        let volume_id = volume_id.to_owned();
        let source = Box::new(e);
        match source.kind {
            k if k.is_retryable() => Ok(source),
            Ec2ErrorKind::VolumeNotFound => Err(Self::VolumeNotFound {
                volume_id,
                op: source.op,
                source,
            }),
            Ec2ErrorKind::Denied => Err(Self::Denied { volume_id, source }),
            _ => Err(Self::Rejected { volume_id, source }),
        }
    }
}

impl From<EbsError> for FenceError {
    fn from(e: EbsError) -> Self {
        Self::at(e.step(), FenceCause::Ebs(e))
    }
}

/// Why `limits` are refused with a claim TTL of `claim_ttl`, and what to change.
fn bad_limits(limits: &PollLimits, claim_ttl: Duration) -> String {
    let b = crate::core::ClaimBudget::new(claim_ttl);
    if limits.deadline.is_zero() {
        "EBS fence deadline is zero: a fence needs time to detach and poll; give it a positive deadline (default 60 s)".to_owned()
    } else if !b.fits_sever(limits.deadline) {
        format!(
            "EBS fence deadline {:?} does not fit the fence-claim TTL {claim_ttl:?}: a claim's lease may be {:?} old when the claim is won (a spare granted ahead), the sever may start up to {:?} after that, and {:?} are kept before the lease expires, which leaves {:?} for the sever; a longer one could outlive the claim, and the victim could rejoin before the detach lands. Raise --claim-ttl-secs to at least {} s, or lower the EBS deadline to at most {:?}",
            limits.deadline,
            b.spare_max_age(),
            b.before_sever(),
            b.margin(),
            b.sever(),
            crate::core::ClaimBudget::min_ttl_secs_for(limits.deadline),
            b.sever(),
        )
    } else {
        format!(
            "EBS fence poll backoff invalid: the first wait {:?} must be non-zero and at most the longest {:?}",
            limits.first_backoff, limits.max_backoff
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn one_decision_for_both_calls() {
        use Ec2ErrorKind::*;
        for op in [Ec2Op::DetachVolume, Ec2Op::DescribeVolumes] {
            let judge = |k| EbsError::retry_or_stop("vol-1", Ec2Error::new(op, k, None));
            for k in [Throttled, Transient] {
                assert_eq!(judge(k).unwrap().kind, k);
            }
            let e = judge(VolumeNotFound).unwrap_err();
            assert!(
                matches!(&e, EbsError::VolumeNotFound { op: o, volume_id, .. } if *o == op && volume_id == "vol-1"),
                "{e:?}"
            );
            assert!(matches!(judge(Denied), Err(EbsError::Denied { .. })));
            for k in [Rejected, NotAttached, InstanceNotFound] {
                assert!(matches!(judge(k), Err(EbsError::Rejected { .. })), "{k:?}");
            }
        }
    }
}
