//! When one of Envoy's ADS streams ends: an Envoy exited (a hand-over's parent after its drain, an
//! Envoy outside the hand-over, a crash) or its stream broke. Whatever held the ports of the
//! inbound listeners the agent withdrew may be gone with it, so the loop offers them again
//! (docs/design-notes.md, "Agent": a withdrawn listener is offered again).

use std::time::Duration;

use tokio::sync::mpsc;

use super::acks::AckTracker;

/// Watches `tracker` and sends one `()` to `tx` after each batch of ended streams (streams that
/// end together make one message). Ends when `tx` closes.
pub fn spawn_watch(tracker: AckTracker, tx: mpsc::Sender<()>) {
    tokio::spawn(async move {
        let mut seen = tracker.ended_total();
        loop {
            if !tracker.wait_for(Duration::from_secs(3600), |t| t.ended_total() > seen).await {
                if tx.is_closed() {
                    return;
                }
                continue;
            }
            seen = tracker.ended_total();
            if tx.send(()).await.is_err() {
                return;
            }
        }
    });
}
