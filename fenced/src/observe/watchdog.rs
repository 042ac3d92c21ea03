//! The systemd watchdog loop: `WATCHDOG=1` only while the daemon is healthy and ready.

use std::sync::Arc;
use std::time::Duration;

use super::Observer;
use crate::notify::Notifier;

/// Sends `WATCHDOG=1` every quarter `period` (at most every 500 ms) while `observer`
/// says the daemon is healthy and ready ([`Observer::watchdog_ok`]): lease fresh, agent
/// loop ticking, controller and keepalive tasks running. Runs until dropped.
pub async fn watchdog_loop(notifier: Arc<Notifier>, observer: Observer, period: Duration) {
    let mut tick = tokio::time::interval((period / 4).min(Duration::from_millis(500)));
    let mut withheld = false;
    loop {
        tick.tick().await;
        match observer.watchdog_ok(std::time::Instant::now()) {
            Ok(()) => {
                if withheld {
                    tracing::info!("systemd watchdog: healthy again, pinging");
                    withheld = false;
                }
                notifier.watchdog_ping();
            }
            Err(why) => {
                if !withheld {
                    tracing::warn!(why = %why, "systemd watchdog: not pinging ({why}); systemd kills the daemon if this lasts WatchdogSec");
                    withheld = true;
                }
            }
        }
    }
}
