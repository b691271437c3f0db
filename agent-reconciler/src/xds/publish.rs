//! From the driver's output to served resources: a task that encodes what the driver published
//! (after a debounce that coalesces bursts) and publishes the [`ResourceSet`] the ADS server
//! sends, only when a version changed.
//!
//! Two inputs ([`SpecSource`]), both handed to the one [`Encoder::update`]:
//! - the agent's: a [`PodSpecs`] channel ([`pod_specs`]): the driver publishes only the pods whose
//!   rendering changed, the encoder takes exactly those ([`SpecChange::Pod`]): the work of a change is
//!   in proportion to the pods it touched, not to the node, so a node of 10k pods answers a change
//!   as fast as a small one (docs/design-notes.md, "Per-change work and a lean process");
//! - a `watch` channel of whole [`Snapshot`]s (tests, tools): each is handed over whole
//!   ([`SpecChange::Whole`]), and the encoder looks at what moved since the last one.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aether_agent_core::model::Snapshot;
use aether_agent_core::record::PodKey;
use aether_agent_core::render::PodRender;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::encoder::{Encoder, SpecChange};
use super::metrics::ChangeClock;
use super::resource_set::ResourceSet;

/// Default debounce of the encoder task ([`spawn_encoder`], `--xds-debounce-ms`): how long a
/// change waits for further changes before it is encoded and pushed. The only wait on the way:
/// the ADS streams push each version at once.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(20);

/// The per-pod renderings the driver publishes, as a whole (for tests and diagnostics) and as
/// the set of pods changed since the encoder task last took them.
#[derive(Debug, Default)]
struct Shared {
    pods: BTreeMap<PodKey, Arc<PodRender>>,
    changed: BTreeSet<PodKey>,
}

/// The driver's end of a [`pod_specs`] channel.
#[derive(Debug)]
pub struct PodSpecsSender {
    shared: Arc<Mutex<Shared>>,
    notify: watch::Sender<u64>,
}

/// The encoder task's end of a [`pod_specs`] channel (cheap to clone; one task takes the
/// changes).
#[derive(Clone, Debug)]
pub struct PodSpecs {
    shared: Arc<Mutex<Shared>>,
    notify: watch::Receiver<u64>,
    /// The publication number read by the last [`SpecSource::encode`], before it took the
    /// changes (so that encoding holds at least that publication).
    rendering: u64,
    /// The number of the last publication whose rendering the served [`ResourceSet`] holds
    /// ([`PodSpecs::served_through`]).
    served: Arc<watch::Sender<u64>>,
}

/// A channel of per-pod renderings from the driver to the encoder task: the driver sends only
/// the pods whose rendering changed, and the encoder takes only those.
pub fn pod_specs() -> (PodSpecsSender, PodSpecs) {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let (notify, rx) = watch::channel(0);
    let served = Arc::new(watch::Sender::new(0));
    (PodSpecsSender { shared: shared.clone(), notify }, PodSpecs { shared, notify: rx, rendering: 0, served })
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

impl PodSpecsSender {
    /// Publishes new renderings of some pods (`None`: the pod is gone) and wakes the encoder task.
    /// Costs O(k log n) for k pods. Nothing happens for an empty batch.
    pub fn send(&self, pods: impl IntoIterator<Item = (PodKey, Option<Arc<PodRender>>)>) {
        let mut shared = lock(&self.shared);
        let mut any = false;
        for (key, render) in pods {
            match render {
                Some(r) => shared.pods.insert(key.clone(), r),
                None => shared.pods.remove(&key),
            };
            shared.changed.insert(key);
            any = true;
        }
        drop(shared);
        if any {
            self.notify.send_modify(|n| *n += 1);
        }
    }

    /// The number of publications so far (each non-empty [`PodSpecsSender::send`] is one): what
    /// [`PodSpecs::served_through`] must reach before the served resources hold all of them.
    pub fn published(&self) -> u64 {
        *self.notify.borrow()
    }

    /// Everything published so far as one [`Snapshot`] (in pod key order, as
    /// `aether_agent_core::render::render` lists it). O(pods): for tests and diagnostics.
    pub fn snapshot(&self) -> Snapshot {
        snapshot_of(&lock(&self.shared))
    }
}

impl PodSpecs {
    /// The number of the last publication ([`PodSpecsSender::published`]) that the resources the
    /// encoder task serves hold, as a `watch` receiver (it changes after each encoding, whether or
    /// not a version changed): the ADS server waits for this before answering Envoy after a
    /// hold, so its first answer is the encoding of the complete state, not of the publication
    /// before it (the task's debounce lags the driver).
    pub fn served_through(&self) -> watch::Receiver<u64> {
        self.served.subscribe()
    }

    /// [`PodSpecsSender::snapshot`], from the encoder task's end.
    pub fn snapshot(&self) -> Snapshot {
        snapshot_of(&lock(&self.shared))
    }

    /// Whether something was published since the last [`PodSpecs::mark_unchanged`] (or since the
    /// encoder task last encoded).
    pub fn has_changed(&self) -> bool {
        self.notify.has_changed().unwrap_or(false)
    }

    /// Marks what was published so far as seen.
    pub fn mark_unchanged(&mut self) {
        self.notify.mark_unchanged();
    }

    /// Takes the pods changed since the last call, with their current rendering; every pod when
    /// `all`.
    pub(crate) fn take(&self, all: bool) -> Vec<(PodKey, Option<Arc<PodRender>>)> {
        let mut shared = lock(&self.shared);
        let changed = std::mem::take(&mut shared.changed);
        if all {
            return shared.pods.iter().map(|(k, r)| (k.clone(), Some(r.clone()))).collect();
        }
        changed.into_iter().map(|k| (k.clone(), shared.pods.get(&k).cloned())).collect()
    }
}

fn snapshot_of(shared: &Shared) -> Snapshot {
    let mut s = Snapshot::default();
    for pod in shared.pods.values() {
        s.health_clusters.push(pod.health_cluster.clone());
        s.clusters.extend(pod.clusters.iter().cloned());
        s.listeners.extend(pod.listeners.iter().cloned());
    }
    s
}

/// What [`spawn_encoder`] encodes from: a [`PodSpecs`] channel (only the changed pods) or a
/// `watch` channel of whole [`Snapshot`]s.
pub trait SpecSource: Send + 'static {
    /// Waits for the next publication; `false` when the publisher is gone.
    fn changed(&mut self) -> impl Future<Output = bool> + Send;
    /// Hands what was published to `encoder` ([`Encoder::update`]): everything when `first`, else
    /// what changed since the last call.
    fn encode(&mut self, encoder: &mut Encoder, first: bool) -> ResourceSet;
    /// Called once the last [`SpecSource::encode`]'s resources are published to the ADS server
    /// (or found unchanged).
    fn served(&mut self) {}
}

impl SpecSource for PodSpecs {
    async fn changed(&mut self) -> bool {
        self.notify.changed().await.is_ok()
    }

    fn encode(&mut self, encoder: &mut Encoder, first: bool) -> ResourceSet {
        self.rendering = *self.notify.borrow_and_update();
        encoder.update(self.take(first))
    }

    fn served(&mut self) {
        self.served.send_replace(self.rendering);
    }
}

impl SpecSource for watch::Receiver<Arc<Snapshot>> {
    async fn changed(&mut self) -> bool {
        watch::Receiver::changed(self).await.is_ok()
    }

    fn encode(&mut self, encoder: &mut Encoder, _first: bool) -> ResourceSet {
        let model = self.borrow_and_update().clone();
        encoder.update([SpecChange::Whole(model)])
    }
}

/// Encodes everything `source` publishes (after `debounce`, so a burst is encoded once) with
/// `encoder` and publishes the result, only when a version changed. Returns the receiver to give
/// [`XdsServer::new`] and the task, which ends when the source's sender is dropped. Rejected
/// specs are logged (warn) and listed in [`ResourceSet::rejected`].
///
/// [`XdsServer::new`]: super::service::XdsServer::new
pub fn spawn_encoder(
    source: impl SpecSource,
    encoder: Encoder,
    debounce: Duration,
) -> (watch::Receiver<Arc<ResourceSet>>, JoinHandle<()>) {
    spawn_encoder_with_clock(source, encoder, debounce, ChangeClock::new())
}

/// [`spawn_encoder`] that also stamps every new version on `clock` (see [`ChangeClock`]).
pub fn spawn_encoder_with_clock(
    mut source: impl SpecSource,
    mut encoder: Encoder,
    debounce: Duration,
    clock: ChangeClock,
) -> (watch::Receiver<Arc<ResourceSet>>, JoinHandle<()>) {
    let first = Arc::new(logged(source.encode(&mut encoder, true)));
    clock.discard_unrendered();
    let (tx, rx) = watch::channel(first);
    source.served();
    let task = tokio::spawn(async move {
        while source.changed().await {
            if !debounce.is_zero() {
                tokio::time::sleep(debounce).await;
            }
            let next = logged(source.encode(&mut encoder, false));
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
            source.served();
        }
    });
    (rx, task)
}

fn logged(resources: ResourceSet) -> ResourceSet {
    for r in &resources.rejected {
        tracing::warn!(cluster = %r.name, reason = r.error.label(), error = %r.error,
            "xDS resource left out before rendering");
    }
    resources
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::encoder::encode;
    use crate::xds::options::BuildOptions;
    use aether_agent_core::model::{ClusterSpec, Endpoint};
    use aether_agent_core::render::Effective;

    fn pod(i: usize, path: &str) -> (PodKey, Option<Arc<PodRender>>) {
        let key = PodKey { namespace: "ns".into(), name: format!("p{i}").into(), uid: format!("u{i}").into() };
        let spec = |name: String| ClusterSpec {
            name,
            endpoint: Endpoint::Pipe { path: path.to_owned() },
            health: None,
            http2: false,
        };
        let render = PodRender {
            clusters: vec![spec(format!("app_ns_p{i}_8080")), spec(format!("health_ns_p{i}"))],
            listeners: vec![],
            health_cluster: format!("health_ns_p{i}"),
            effective: Effective::Pipe(path.to_owned()),
        };
        (key, Some(Arc::new(render)))
    }

    #[tokio::test]
    async fn the_renderer_task_takes_only_the_pods_sent_and_serves_what_a_whole_render_serves() {
        let (tx, rx) = pod_specs();
        tx.send((0..200).map(|i| pod(i, &format!("/s{i}"))));
        let opts = BuildOptions::default();
        let (mut served, _task) = spawn_encoder(rx.clone(), Encoder::new(opts.clone()), Duration::ZERO);
        let first = served.borrow_and_update().clone();
        assert_eq!(first.clusters.len(), 400, "the first render takes every pod published before it");

        tx.send([pod(7, "/moved")]);
        served.changed().await.unwrap();
        let next = served.borrow_and_update().clone();
        let moved: Vec<String> =
            first.clusters.resources.diff(&next.clusters.resources).map(|d| format!("{d:?}")).collect();
        assert_eq!(moved.len(), 2, "only pod 7's two clusters differ: {moved:?}");
        assert_eq!(*next, encode(&rx.snapshot(), &opts), "the same as rendering the whole node");

        tx.send([(pod(8, "").0, None)]);
        served.changed().await.unwrap();
        assert_eq!(served.borrow().clusters.len(), 398);
        assert!(served.borrow().clusters.get("app_ns_p8_8080").is_none());
    }

    /// A released hold waits for `served_through` to reach the publication that completed the
    /// state: it lags by the debounce, and it advances even when a publication changes no version.
    #[tokio::test]
    async fn served_through_reaches_each_publication_after_the_debounce() {
        let (tx, rx) = pod_specs();
        tx.send([pod(1, "/a")]);
        let (_served, _task) =
            spawn_encoder(rx.clone(), Encoder::new(BuildOptions::default()), Duration::from_millis(200));
        let served = rx.served_through();
        assert_eq!((tx.published(), *served.borrow()), (1, 1), "the first render holds what came before it");
        tx.send([pod(2, "/b")]);
        assert_eq!((tx.published(), *served.borrow()), (2, 1), "published, not yet rendered: the debounce");
        let until = |n: u64| {
            let mut served = served.clone();
            async move {
                let _ = served.wait_for(|s| *s >= n).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), until(2)).await.expect("rendered after the debounce");
        // The same rendering again: no version changes, and the publication still counts as served.
        tx.send([pod(2, "/b")]);
        tokio::time::timeout(Duration::from_secs(5), until(3)).await.expect("an unchanged render counts");
    }
}
