//! The join-time check of the EBS fencer: before a node joins, the instance it runs on
//! must be one of the shared volume's attachments. A wrong instance id (a typo, a
//! copied config, a machine id) is refused here, at start, instead of being discovered
//! at fence time, when detaching "it" would leave the real instance attached.
//!
//! The instance id comes from the instance metadata service (IMDSv2, through
//! `aws-config`'s client, with a short timeout) where it answers; `--instance-id`, when
//! given, must agree with it. Only when IMDS does not answer (disabled with
//! `AWS_EC2_METADATA_DISABLED=true`, not on EC2, blocked) is the configured id taken
//! as it is, else the host's id as before ([`local_instance_id`]). Whatever the source,
//! the id must have the EC2 form and `DescribeVolumes` must show it attached.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::{AttachmentView, EbsConfig, EbsError, EbsFencer, is_instance_id};
use crate::node::local_instance_id;

/// Bound on asking IMDS for the instance id (connect, token, read).
pub const IMDS_TIMEOUT: Duration = Duration::from_secs(2);

/// Bound on the join-time `DescribeVolumes` (retried while throttled or transient).
pub const JOIN_CHECK_TIMEOUT: Duration = Duration::from_secs(20);

/// Attachment states in which the instance has the volume.
const HAS_VOLUME: [&str; 2] = ["attached", "busy"];

/// Where the instance id came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdSource {
    /// The instance metadata service (IMDSv2).
    Imds,
    /// `--instance-id` (or the config file), IMDS not answering.
    Configured,
    /// The host ([`local_instance_id`]), IMDS not answering and nothing configured.
    Host,
}

impl fmt::Display for IdSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Imds => "from the instance metadata service",
            Self::Configured => {
                "from --instance-id; the instance metadata service is disabled or did not answer"
            }
            Self::Host => {
                "from the host: no --instance-id, and the instance metadata service is disabled or did not answer"
            }
        })
    }
}

/// Why a node with the EBS fencer may not join.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JoinError {
    /// The EBS fencer could not be set up (region, endpoint, limits...).
    #[error("cannot set up the EBS fencer: {0}")]
    Setup(#[source] Box<EbsError>),
    /// The instance id does not have the EC2 form.
    #[error(
        "instance id {id:?} ({from}) is not an EC2 instance id (i- and 8 or 17 hex digits): pass this instance's id with --instance-id"
    )]
    BadInstanceId {
        /// The refused id (printed escaped).
        id: String,
        /// Where it came from.
        from: IdSource,
    },
    /// `--instance-id` disagrees with IMDS.
    #[error(
        "--instance-id {configured:?} but the instance metadata service says this instance is {imds:?}: fix --instance-id, or drop it"
    )]
    Mismatch {
        /// The configured id.
        configured: String,
        /// What IMDS answered.
        imds: String,
    },
    /// The volume is not attached to this instance.
    #[error(
        "volume {volume_id} is not attached to this instance {instance_id} ({from}): DescribeVolumes lists {}; attach the volume to this instance, or fix --instance-id; refusing to join",
        list(attachments)
    )]
    NotAttached {
        /// The volume.
        volume_id: String,
        /// This instance.
        instance_id: String,
        /// Where its id came from.
        from: IdSource,
        /// The volume's attachments.
        attachments: Vec<AttachmentView>,
    },
    /// `DescribeVolumes` gave no usable answer in time.
    #[error(
        "cannot check that volume {volume_id} is attached to {instance_id}: no usable DescribeVolumes answer within {waited:?}{}; refusing to join",
        last_error.as_ref().map(|e| format!(" (last error: {e})")).unwrap_or_default()
    )]
    NoAnswer {
        /// The volume.
        volume_id: String,
        /// This instance.
        instance_id: String,
        /// Time spent.
        waited: Duration,
        /// The last failure, if any.
        #[source]
        last_error: Option<Box<super::Ec2Error>>,
    },
    /// `DescribeVolumes` failed.
    #[error(
        "cannot check that volume {volume_id} is attached to {instance_id}: {source}; refusing to join"
    )]
    Check {
        /// The volume.
        volume_id: String,
        /// This instance.
        instance_id: String,
        /// Why.
        #[source]
        source: Box<EbsError>,
    },
}

fn list(attachments: &[AttachmentView]) -> String {
    if attachments.is_empty() {
        return "no attachment".to_owned();
    }
    attachments
        .iter()
        .map(|a| format!("{} ({})", a.instance_id, a.state))
        .collect::<Vec<_>>()
        .join(", ")
}

/// This instance's id from IMDSv2, `None` when IMDS is disabled
/// (`AWS_EC2_METADATA_DISABLED=true`) or does not answer within [`IMDS_TIMEOUT`].
/// `AWS_EC2_METADATA_SERVICE_ENDPOINT` moves it (tests).
pub async fn imds_instance_id() -> Option<String> {
    let disabled = std::env::var("AWS_EC2_METADATA_DISABLED")
        .is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
    if disabled {
        return None;
    }
    let client = aws_config::imds::Client::builder()
        .connect_timeout(IMDS_TIMEOUT / 2)
        .read_timeout(IMDS_TIMEOUT / 2)
        .operation_timeout(IMDS_TIMEOUT)
        .max_attempts(1)
        .build();
    let got = tokio::time::timeout(IMDS_TIMEOUT, client.get("/latest/meta-data/instance-id")).await;
    match got {
        Ok(Ok(id)) => Some(id.as_ref().trim().to_owned()),
        Ok(Err(e)) => {
            tracing::debug!(step = "join", error = %e, "instance metadata service did not answer");
            None
        }
        Err(_) => {
            tracing::debug!(
                step = "join",
                "instance metadata service did not answer within {IMDS_TIMEOUT:?}"
            );
            None
        }
    }
}

/// The instance id to join with: IMDS's, checked against `configured`; else
/// `configured`; else the host's. Not yet checked against the volume.
pub fn choose_instance_id(
    configured: Option<&str>,
    imds: Option<String>,
) -> Result<(String, IdSource), JoinError> {
    let (id, from) = match (configured, imds) {
        (Some(c), Some(i)) if c != i => {
            return Err(JoinError::Mismatch {
                configured: c.to_owned(),
                imds: i,
            });
        }
        (_, Some(i)) => (i, IdSource::Imds),
        (Some(c), None) => (c.to_owned(), IdSource::Configured),
        (None, None) => (local_instance_id(), IdSource::Host),
    };
    if !is_instance_id(&id) {
        return Err(JoinError::BadInstanceId { id, from });
    }
    Ok((id, from))
}

impl EbsFencer {
    /// The join-time check: this instance's id (see [`choose_instance_id`]) must be a
    /// live attachment of the volume (`attached` or `busy`) in a complete
    /// `DescribeVolumes` answer. Returns the id to join with.
    pub async fn check_join(&self, configured: Option<&str>) -> Result<String, JoinError> {
        let (instance_id, from) = choose_instance_id(configured, imds_instance_id().await)?;
        let vol = self.volume_id();
        let check_error = |source| JoinError::Check {
            volume_id: vol.to_owned(),
            instance_id: instance_id.clone(),
            source: Box::new(source),
        };
        let start = Instant::now();
        let deadline = start + JOIN_CHECK_TIMEOUT.min(self.limits.deadline);
        let mut backoff = self.limits.first_backoff;
        let mut last_error = None;
        let view = loop {
            match tokio::time::timeout_at(deadline, self.api.describe_volume(vol)).await {
                Ok(Ok(view)) => break view,
                // Throttled, transient, malformed: retried until the deadline.
                Ok(Err(e)) => {
                    last_error = Some(EbsError::retry_or_stop(vol, e).map_err(check_error)?);
                }
                Err(_) => {}
            }
            if Instant::now() + backoff >= deadline {
                return Err(JoinError::NoAnswer {
                    volume_id: vol.to_owned(),
                    instance_id,
                    waited: start.elapsed(),
                    last_error,
                });
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(self.limits.max_backoff);
        };
        let attached = view
            .attachments
            .iter()
            .any(|a| a.instance_id == instance_id && HAS_VOLUME.contains(&a.state.as_str()));
        if !attached {
            return Err(JoinError::NotAttached {
                volume_id: vol.to_owned(),
                instance_id,
                from,
                attachments: view.attachments,
            });
        }
        tracing::info!(step = "join", volume = %vol, instance = %instance_id, source = %from, "EBS: volume {vol} is attached to this instance {instance_id}");
        Ok(instance_id)
    }
}

/// Sets up the EBS fencer for `config` and runs [`EbsFencer::check_join`]: the fencer
/// and the instance id to join with.
pub async fn connect_and_check(
    config: &EbsConfig,
    configured_instance: Option<&str>,
    claim_ttl: Duration,
) -> Result<(EbsFencer, String), JoinError> {
    let fencer = EbsFencer::connect(config, claim_ttl)
        .await
        .map_err(|e| JoinError::Setup(Box::new(e)))?;
    let instance = fencer.check_join(configured_instance).await?;
    Ok((fencer, instance))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "i-0123456789abcdef0";
    const B: &str = "i-0123456789abcdef1";

    #[test]
    fn imds_wins_and_must_agree() {
        assert_eq!(
            choose_instance_id(None, Some(A.into())).unwrap(),
            (A.to_owned(), IdSource::Imds)
        );
        assert_eq!(
            choose_instance_id(Some(A), Some(A.into())).unwrap(),
            (A.to_owned(), IdSource::Imds)
        );
        let e = choose_instance_id(Some(B), Some(A.into())).unwrap_err();
        assert!(matches!(e, JoinError::Mismatch { .. }), "{e}");
        assert_eq!(
            choose_instance_id(Some(B), None).unwrap(),
            (B.to_owned(), IdSource::Configured)
        );
        for bad in ["i-typo", "i-1\nforged", "machine-id-0123"] {
            let e = choose_instance_id(Some(bad), None).unwrap_err();
            assert!(matches!(e, JoinError::BadInstanceId { .. }), "{e}");
            assert!(!e.to_string().contains('\n'), "{e}");
        }
        let e = choose_instance_id(None, Some("i-fake".into())).unwrap_err();
        assert!(
            matches!(
                e,
                JoinError::BadInstanceId {
                    from: IdSource::Imds,
                    ..
                }
            ),
            "{e}"
        );
    }
}
