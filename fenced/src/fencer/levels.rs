//! Fencing levels, as in Pacemaker: fencers tried in order until one confirms.

use std::fmt;
use std::sync::Arc;

use super::{BoxFuture, FenceCause, FenceError, Fencer};
use crate::core::{Confirmation, FenceStep, Victim};

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

/// One level that did not confirm.
#[derive(Debug)]
pub enum LevelFailure {
    /// It answered single-signal: nothing severed.
    NotSevered {
        /// The level's fencer.
        fencer: &'static str,
        /// Its evidence.
        evidence: String,
    },
    /// It failed.
    Failed {
        /// The level's fencer.
        fencer: &'static str,
        /// Its error.
        error: FenceError,
    },
}

impl fmt::Display for LevelFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotSevered { fencer, evidence } => {
                write!(f, "{fencer}: not severed ({evidence})")
            }
            Self::Failed { fencer, error } => write!(f, "{fencer}: {error}"),
        }
    }
}

/// The levels that did not confirm, in the order tried. Its source is the last
/// level's error.
#[derive(Debug, Default)]
pub struct LevelFailures(pub Vec<LevelFailure>);

impl fmt::Display for LevelFailures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, failure) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{failure}")?;
        }
        Ok(())
    }
}

impl std::error::Error for LevelFailures {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.last_error()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl LevelFailures {
    /// The error of the last level that failed (rather than answering single-signal).
    pub fn last_error(&self) -> Option<&FenceError> {
        self.0.iter().rev().find_map(|l| match l {
            LevelFailure::Failed { error, .. } => Some(error),
            LevelFailure::NotSevered { .. } => None,
        })
    }
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
            let mut failed = LevelFailures::default();
            for level in &self.levels {
                match level.fence(victim).await {
                    Ok(c) if c.severed => {
                        let mut c = c;
                        if !failed.0.is_empty() {
                            c.evidence = format!("{} (after: {failed})", c.evidence);
                        }
                        return Ok(c);
                    }
                    Ok(c) => {
                        failed.0.push(LevelFailure::NotSevered {
                            fencer: level.name(),
                            evidence: c.evidence,
                        });
                    }
                    Err(e) => {
                        tracing::warn!(
                            node = %victim.node,
                            fencer = level.name(),
                            error = %e,
                            "fencing level failed; trying the next level"
                        );
                        failed.0.push(LevelFailure::Failed {
                            fencer: level.name(),
                            error: e,
                        });
                    }
                }
            }
            let step = failed.last_error().map_or(FenceStep::Verify, |e| e.step);
            Err(FenceError::at(step, FenceCause::NoLevelConfirmed(failed)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::NodeId;

    fn victim(instance: &str) -> Victim {
        Victim {
            node: NodeId::new("n1").unwrap(),
            instance: instance.into(),
        }
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
            e.to_string().contains("nvme") && e.to_string().contains("ebs failed"),
            "{e}"
        );
        let FenceCause::NoLevelConfirmed(failed) = &e.cause else {
            panic!("{e:?}")
        };
        assert_eq!(failed.0.len(), 2);
        assert_eq!(
            failed.last_error().map(ToString::to_string).as_deref(),
            Some("verify failed: ebs failed")
        );

        // Single-signal is not a confirmation: the next level runs.
        let weak = FencingLevels::new(vec![
            Arc::new(Fixed("none", Some(false))),
            Arc::new(Fixed("ebs", Some(true))),
        ]);
        assert_eq!(weak.fence(&v).await.unwrap().fencer, "ebs");
    }
}
