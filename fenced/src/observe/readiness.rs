//! Task health and readiness: which supervised tasks run (`/healthz`), whether the
//! agent is joined with a fresh lease and ticking (`/readyz`), and both together as
//! the systemd watchdog's condition.

use std::time::{Duration, Instant};

use super::metrics::TaskLabels;
use super::{AgentTick, Observer, TaskState};

/// The agent's last tick older than this: the agent loop is stalled (it ticks every
/// 100 ms).
const AGENT_STALE: Duration = Duration::from_secs(1);

/// Marks its task stopped when dropped: on return, on panic and on abort alike, so a
/// stopped task looks different from an idle one.
#[derive(Debug)]
pub struct TaskGuard {
    observer: Observer,
    task: &'static str,
    why: Option<String>,
}

impl TaskGuard {
    /// Records why the task stopped (kept until it runs again).
    pub fn stopped(mut self, why: impl Into<String>) {
        self.why = Some(why.into());
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        let why = self.why.take().unwrap_or_else(|| "stopped".to_owned());
        self.observer
            .set_task(self.task, TaskState::Stopped { why });
    }
}

impl Observer {
    fn set_task(&self, task: &'static str, st: TaskState) {
        let up = i64::from(matches!(st, TaskState::Running));
        self.m().task_up.get_or_create(&TaskLabels { task }).set(up);
        self.state().tasks.insert(task, st);
    }

    /// `task` (started now) must keep running; `/healthz` fails once the returned
    /// guard is dropped.
    pub fn task_running(&self, task: &'static str) -> TaskGuard {
        self.set_task(task, TaskState::Running);
        TaskGuard {
            observer: self.clone(),
            task,
            why: None,
        }
    }

    /// A stopped `task` is being started again.
    pub fn task_restarted(&self, task: &'static str) {
        self.m()
            .task_restarts
            .get_or_create(&TaskLabels { task })
            .inc();
    }

    /// Joined, unfenced, arenas claimed: `READY=1` with `status`.
    pub fn ready(&self, status: impl Into<String>) {
        let status = status.into();
        self.state().status.clone_from(&status);
        self.set_joined(true);
        if let Some(n) = self.notifier() {
            n.ready(&status);
        }
    }

    /// A daemon without an agent (`--role controller`) is running: `READY=1`;
    /// readiness is then "running, not leaving", with no lease to be fresh.
    pub fn ready_without_agent(&self, status: impl Into<String>) {
        self.state().no_agent = true;
        self.ready(status);
    }

    /// We joined (READY) or stopped being a member (leaving, self-fenced).
    pub fn set_joined(&self, joined: bool) {
        self.state().joined = joined;
        self.update_ready(Instant::now());
    }

    /// The agent's device check has been unanswered for this long (`None`: the
    /// device answers). `/healthz` turns red while it is set; the gauge
    /// `fenced_device_unanswered_seconds` shows it.
    pub fn device_stalled(&self, unanswered: Option<Duration>) {
        self.state().device_stalled = unanswered;
        self.m()
            .device_unanswered
            .set(unanswered.map_or(0.0, |d| d.as_secs_f64()));
    }

    /// One tick of the agent's self-fencing clock: the lease was last renewed
    /// `lease_age` ago, `margin_left` remains before self-fencing (zero: self-fenced).
    pub fn agent_tick(
        &self,
        now: Instant,
        lease_age: Duration,
        margin_left: Duration,
        ttl: Duration,
        keepalive_running: bool,
    ) {
        self.m().lease_age.set(lease_age.as_secs_f64());
        self.m().margin_left.set(margin_left.as_secs_f64());
        let keepalive_was = {
            let mut s = self.state();
            s.agent = Some(AgentTick {
                at: now,
                lease_age,
                ttl,
                keepalive_running,
            });
            s.tasks
                .get("keepalive")
                .map(|t| matches!(t, TaskState::Running))
        };
        if keepalive_was != Some(keepalive_running) {
            let st = if keepalive_running {
                TaskState::Running
            } else {
                TaskState::Stopped {
                    why: "the lease keepalive task ended".to_owned(),
                }
            };
            self.set_task("keepalive", st);
        }
        self.update_ready(now);
    }

    pub(super) fn update_ready(&self, now: Instant) {
        let ready = self.ready_at(now).is_ok();
        self.m().ready.set(i64::from(ready));
    }

    /// `Ok` while every task that should run is running and the agent's loop ticks;
    /// `Err` says which stopped and why.
    pub fn healthz(&self, now: Instant) -> Result<(), String> {
        let s = self.state();
        let stopped: Vec<String> = s
            .tasks
            .iter()
            .filter_map(|(t, st)| match st {
                TaskState::Running => None,
                TaskState::Stopped { why } => Some(format!("{t} stopped ({why})")),
            })
            .collect();
        if !stopped.is_empty() {
            return Err(stopped.join("; "));
        }
        if let Some(a) = s.agent {
            let since = now.saturating_duration_since(a.at);
            if since > AGENT_STALE {
                return Err(format!(
                    "agent loop stalled: no self-fencing check for {:.1}s",
                    since.as_secs_f64()
                ));
            }
        }
        if let Some(d) = s.device_stalled {
            return Err(format!(
                "the shared device has not answered a reservation report for {:.0}s",
                d.as_secs_f64()
            ));
        }
        Ok(())
    }

    /// `Ok` while joined with a fresh lease: renewed within its TTL, by the agent's
    /// last tick, which is recent.
    pub fn ready_at(&self, now: Instant) -> Result<(), String> {
        let s = self.state();
        if !s.joined {
            return Err("not a member (starting, leaving or self-fenced)".to_owned());
        }
        if s.no_agent {
            return Ok(());
        }
        let Some(a) = s.agent else {
            return Err("the agent has not checked its lease yet".to_owned());
        };
        let since = now.saturating_duration_since(a.at);
        if since > AGENT_STALE {
            return Err(format!(
                "agent loop stalled: no lease check for {:.1}s",
                since.as_secs_f64()
            ));
        }
        if !a.keepalive_running {
            return Err("the lease keepalive task ended".to_owned());
        }
        if a.lease_age >= a.ttl {
            return Err(format!(
                "lease not renewed for {:.1}s (TTL {}s)",
                a.lease_age.as_secs_f64(),
                a.ttl.as_secs()
            ));
        }
        Ok(())
    }

    /// What the systemd watchdog needs before `WATCHDOG=1`: healthy and ready.
    pub fn watchdog_ok(&self, now: Instant) -> Result<(), String> {
        self.healthz(now)?;
        self.ready_at(now)
    }
}
