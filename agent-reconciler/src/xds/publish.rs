//! From snapshots to served resources: a task that renders each published [`Snapshot`] (after a
//! debounce that coalesces bursts) and publishes the [`Resources`] the ADS server sends, only
//! when a version changed.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::metrics::ChangeClock;
use super::resources::{Renderer, Resources, Snapshot};

/// Renders every snapshot `snapshots` receives (after `debounce`, so a burst renders once) with
/// a caching [`Renderer`] and publishes the result, only when a version changed. Returns the
/// receiver to give [`XdsServer::new`] and the task, which ends when `snapshots`' sender is
/// dropped. Rejected specs are logged (warn) and listed in [`Resources::rejected`].
///
/// [`XdsServer::new`]: super::server::XdsServer::new
pub fn spawn_renderer(
    snapshots: watch::Receiver<Arc<Snapshot>>,
    renderer: Renderer,
    debounce: Duration,
) -> (watch::Receiver<Arc<Resources>>, JoinHandle<()>) {
    spawn_renderer_with_clock(snapshots, renderer, debounce, ChangeClock::new())
}

/// [`spawn_renderer`] that also stamps every new version on `clock` (see [`ChangeClock`]).
pub fn spawn_renderer_with_clock(
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    mut renderer: Renderer,
    debounce: Duration,
    clock: ChangeClock,
) -> (watch::Receiver<Arc<Resources>>, JoinHandle<()>) {
    let first = Arc::new(render_logged(&mut renderer, &snapshots.borrow_and_update()));
    clock.discard_unrendered();
    let (tx, rx) = watch::channel(first);
    let task = tokio::spawn(async move {
        while snapshots.changed().await.is_ok() {
            if !debounce.is_zero() {
                tokio::time::sleep(debounce).await;
            }
            let snapshot = snapshots.borrow_and_update().clone();
            let next = render_logged(&mut renderer, &snapshot);
            tx.send_if_modified(|current| {
                // Stamp before receivers are notified, so an ACK can never precede its stamp.
                clock.rendered(current, &next);
                if current.same_versions(&next) && current.rejected == next.rejected {
                    false
                } else {
                    *current = Arc::new(next);
                    true
                }
            });
        }
    });
    (rx, task)
}

fn render_logged(renderer: &mut Renderer, snapshot: &Snapshot) -> Resources {
    let resources = renderer.render(snapshot);
    for r in &resources.rejected {
        tracing::warn!(cluster = %r.name, reason = r.error.label(), error = %r.error,
            "xDS resource left out before rendering");
    }
    resources
}
