//! The fail-point engine: one `fence::<step>` point per device command and etcd
//! transaction of a fence (feature `failpoints`; without it every point compiles to
//! nothing and every fence step goes on).
//!
//! A point is configured with the `fail` crate (`fail::cfg`, or `FAILPOINTS` in a
//! `fenced run` process); [`FaultEffect`] documents the syntax. Each hit is recorded
//! (`fault_hits`, feature `failpoints`) so a test can check which controller's fence met which fault.

use std::future::Future;

use crate::core::{FenceStep, Victim};

/// A `fence::<step>` fail point failed its step: the step was not performed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("fail point fence::{}", step.name())]
pub struct FaultInjected {
    /// The step that was not performed.
    pub step: FenceStep,
}

/// What a `fence::<step>` fail point did to the fence that reached it.
///
/// Fail points (feature `failpoints`; without it they compile to nothing) sit before
/// each etcd transaction and device command of a fence and are named after the first
/// protocol step that command performs: `fence::claim` (the claim transaction:
/// `record_intent`, `claim`, `recheck_intent`, `read_generation`), `fence::sever` (the
/// preempt), `fence::verify` (the report re-read), `fence::bump` (the finishing
/// transaction: `bump` … `release_claim`) and `fence::release_claim` (a failed fence
/// giving its claim back). Steps inside one transaction are atomic, so they cannot
/// fail apart.
///
/// A point is configured with the `fail` crate. `return` without an argument fails the
/// step in every controller. `return(TARGET=EFFECT,...)` chooses per controller:
/// TARGET is a controller id, or an id prefix ending in `*`; EFFECT is `error` (the
/// step is not performed and fails), `lost` (the step is performed but its answer is
/// lost: the caller sees a timeout-like error), `sleep:MS` (the fence waits MS
/// milliseconds, without blocking a thread) or `crash` (the fence stops at the point
/// for good, so a test can abort the controller while it is stopped mid-step: a crash
/// at exactly that step). `fail`'s own `sleep(MS)`
/// and `pause` work too, but block the thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultEffect {
    /// The step failed (the fence stays owed).
    Error,
    /// The step was performed but its answer was lost.
    Lost,
    /// The step was delayed.
    Sleep(std::time::Duration),
    /// The fence stopped at the step, for good.
    Crash,
}

/// One fail point that acted on a fence (feature `failpoints`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultHit {
    /// The controller whose fence reached the point (empty: not run by a controller).
    pub controller: String,
    /// The fence's victim (empty: not run by a controller).
    pub node: String,
    /// The point's step.
    pub step: FenceStep,
    /// What it did.
    pub effect: FaultEffect,
    /// When.
    pub at: std::time::Instant,
}

#[cfg(feature = "failpoints")]
tokio::task_local! {
    /// (controller id, victim) of the fence running in this task.
    static FAULT_SCOPE: (String, String);
}

#[cfg(feature = "failpoints")]
static FAULT_HITS: std::sync::Mutex<Vec<FaultHit>> = std::sync::Mutex::new(Vec::new());

/// The fail point hits so far of the controllers whose id starts with `prefix`
/// (feature `failpoints`).
#[cfg(feature = "failpoints")]
pub fn fault_hits(prefix: &str) -> Vec<FaultHit> {
    FAULT_HITS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .filter(|h| h.controller.starts_with(prefix))
        .cloned()
        .collect()
}

/// Runs `f`, controller `controller`'s fence of `victim`, so that fail points can
/// target it.
pub(crate) async fn fault_scope<F: Future>(controller: &str, victim: &Victim, f: F) -> F::Output {
    #[cfg(feature = "failpoints")]
    {
        FAULT_SCOPE
            .scope((controller.to_owned(), victim.node.to_string()), f)
            .await
    }
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = (controller, victim);
        f.await
    }
}

/// The configured argument of `step`'s fail point: `None` when it does not act,
/// `Some(None)` for a bare `return`.
#[cfg(feature = "failpoints")]
fn fault_config(step: FenceStep) -> Option<Option<String>> {
    let name = format!("fence::{}", step.name());
    fail::fail_point!(&name, Some);
    None
}

/// Which effect `arg` (`TARGET=EFFECT,...`) has on `controller`; the first matching
/// entry wins.
#[cfg(feature = "failpoints")]
fn fault_effect(arg: &str, controller: &str) -> Option<FaultEffect> {
    arg.split(',').find_map(|entry| {
        let (target, effect) = entry.trim().split_once('=')?;
        let hit = match target.strip_suffix('*') {
            Some(prefix) => controller.starts_with(prefix),
            None => controller == target,
        };
        if !hit {
            return None;
        }
        Some(match effect.split_once(':') {
            None if effect == "crash" => FaultEffect::Crash,
            None if effect == "lost" => FaultEffect::Lost,
            Some(("sleep", ms)) => FaultEffect::Sleep(std::time::Duration::from_millis(
                ms.parse().unwrap_or_else(|_| {
                    tracing::warn!(entry, "fail point: bad sleep, using 100 ms");
                    100
                }),
            )),
            _ => FaultEffect::Error,
        })
    })
}

/// `step`'s fail point (see [`FaultEffect`]). `Err`: the step fails without being
/// performed; `Ok(true)`: perform the step, then lose its answer.
pub(crate) async fn fault(step: FenceStep) -> Result<bool, FaultInjected> {
    #[cfg(feature = "failpoints")]
    {
        let Some(arg) = fault_config(step) else {
            return Ok(false);
        };
        let (controller, node) = FAULT_SCOPE.try_with(Clone::clone).unwrap_or_default();
        let effect = match arg.as_deref() {
            None | Some("") => FaultEffect::Error,
            Some(arg) => match fault_effect(arg, &controller) {
                Some(e) => e,
                None => return Ok(false),
            },
        };
        tracing::warn!(step = %step, controller = %controller, node = %node, ?effect, "fail point");
        FAULT_HITS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(FaultHit {
                controller,
                node,
                step,
                effect,
                at: std::time::Instant::now(),
            });
        match effect {
            FaultEffect::Error => return Err(FaultInjected { step }),
            FaultEffect::Lost => return Ok(true),
            FaultEffect::Sleep(d) => tokio::time::sleep(d).await,
            FaultEffect::Crash => std::future::pending::<()>().await,
        }
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = step;
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_injected_fault_names_its_point() {
        assert_eq!(
            FaultInjected {
                step: FenceStep::Verify
            }
            .to_string(),
            "fail point fence::verify"
        );
    }

    #[cfg(feature = "failpoints")]
    #[test]
    fn fault_arguments_pick_a_controller() {
        use std::time::Duration;
        let arg = "s1-c2=crash,s1-*=sleep:50";
        assert_eq!(fault_effect(arg, "s1-c2"), Some(FaultEffect::Crash));
        assert_eq!(
            fault_effect(arg, "s1-c1"),
            Some(FaultEffect::Sleep(Duration::from_millis(50)))
        );
        assert_eq!(fault_effect(arg, "s10-c1"), None);
        assert_eq!(fault_effect("c1=error", "c1"), Some(FaultEffect::Error));
        assert_eq!(fault_effect("c1=error", ""), None);
    }
}
