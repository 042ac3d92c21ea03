//! The controller's presence: announce this controller (`controller/live/<id>`) and
//! follow the others' into the [`Roster`](crate::core::Roster).

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::EventType;

use super::Controller;
use crate::store::{EtcdStore, StoreError, apply_controller_event};

/// Presence is an etcd lease and a watch: only over [`EtcdStore`].
impl Controller<EtcdStore> {
    /// Announces this controller and follows the others' presence (and the sweep
    /// stamp) into the [`Roster`](crate::core::Roster). Whenever the watch or the lease
    /// fails, the roster is marked out of sync (this controller then claims every
    /// death at once and sweeps every period, as if alone) and the session starts
    /// again.
    pub(super) async fn presence_loop(self: Arc<Self>) {
        let mut backoff = Duration::from_millis(100);
        loop {
            let t0 = Instant::now();
            let why = self.presence_session().await;
            self.lock_roster().lost_sync();
            if t0.elapsed() > Duration::from_secs(10) {
                backoff = Duration::from_millis(100);
            }
            if self.cfg.is_leaving() {
                // Not an incident, and nothing to restart: the daemon stops this
                // controller once the departure is done.
                tracing::info!(
                    step = "presence",
                    "controller presence ended: this node left"
                );
                std::future::pending::<()>().await;
            }
            if why.is_denied() {
                // An older role without `controller/`: safe (this controller acts as
                // if alone), but every death costs a claim more.
                tracing::warn!(step = "presence", error = %why, "etcd refuses this controller's presence under controller/: run `fenced etcd-roles --apply` again (the controller role writes controller/); until then it claims every death at once and sweeps every period");
                backoff = Duration::from_secs(60);
            } else {
                tracing::warn!(step = "presence", error = %why, ?backoff, "controller presence lost (claiming every death at once and sweeping every period until it is back): retrying");
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    /// One presence session: lease, announce, list, then watch (and keep our own
    /// lease alive) until something fails; returns why.
    async fn presence_session(&self) -> StoreError {
        let closed = |what: &str| StoreError::Unavailable {
            op: "presence",
            source: etcd_client::Error::WatchError(what.to_owned()),
        };
        let ttl = self.cfg.presence_ttl;
        let (lease, mut own) = match self.cfg.presence_lease {
            Some(lease) => (lease, None),
            None => {
                let lease = match self.store.grant(ttl).await {
                    Ok(l) => l,
                    Err(e) => return e,
                };
                match self.store.keep_alive(lease).await {
                    Ok(k) => (lease, Some(k)),
                    Err(e) => return e,
                }
            }
        };
        if let Err(e) = self
            .store
            .announce_controller(&self.cfg.id, self.cfg.own_node.as_ref(), lease)
            .await
        {
            return e;
        }
        let (roster, revision) = match self.store.roster().await {
            Ok(r) => r,
            Err(e) => return e,
        };
        let mut stream = match self.store.watch_controllers(revision + 1).await {
            Ok(s) => s,
            Err(e) => return e,
        };
        tracing::info!(
            step = "presence",
            controllers = roster.len(),
            "controller presence announced; following {} live controllers",
            roster.len()
        );
        self.set_roster(roster);
        let own_key = self.store.keys().controller_live(&self.cfg.id);
        let mut renew = tokio::time::interval((ttl / 3).max(Duration::from_millis(200)));
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let keeping = own.is_some();
        loop {
            tokio::select! {
                msg = stream.message() => {
                    let msg = match msg {
                        Ok(Some(m)) => m,
                        Ok(None) => return closed("presence watch closed"),
                        Err(e) => return StoreError::classify("watch", e),
                    };
                    if msg.canceled() {
                        return closed("presence watch canceled (compacted?)");
                    }
                    let mut roster = self.lock_roster();
                    for ev in msg.events() {
                        apply_controller_event(self.store.keys(), &mut roster, ev);
                        let ours = ev.kv().is_some_and(|kv| kv.key() == own_key.as_bytes());
                        if ours && ev.event_type() == EventType::Delete {
                            return closed("our presence key was deleted");
                        }
                    }
                }
                answer = async {
                    match &mut own {
                        Some((_, answers)) => answers.message().await,
                        None => std::future::pending().await,
                    }
                } => match answer {
                    Ok(Some(a)) if a.ttl() > 0 => {}
                    Ok(Some(_)) => return closed("presence lease expired"),
                    Ok(None) => return closed("presence keepalive stream closed"),
                    Err(e) => return StoreError::classify("lease_keep_alive", e),
                },
                _ = renew.tick(), if keeping => {
                    if let Some((keeper, _)) = &mut own
                        && let Err(e) = keeper.keep_alive().await
                    {
                        return StoreError::classify("lease_keep_alive", e);
                    }
                }
            }
        }
    }
}
