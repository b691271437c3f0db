//! The status writer and the caches it shares with the webhook (the I/O around [`crate::status`]).
//!
//! - Two reflectors, all namespaces: EndpointPolicies (full objects) and Services (metadata only:
//!   only their existence matters). Every replica runs them; the webhook reads them for its
//!   warnings through [`ClusterView`] and never waits for them or for the API server.
//! - A `kube::runtime::Controller` for EndpointPolicy. A policy is reconciled when it changes, when
//!   a *sibling* (same namespace and `spec.targetRef.name`, before or after the change) changes or
//!   is deleted, so deleting the winner promotes the next one, and when a Service of its target
//!   name appears or disappears. The triggers are derived from the reflector's own event stream,
//!   after the store has applied the event, so a reconcile always sees at least that event.
//!   After every (re)list all policies are reconciled, which also covers deletions missed while
//!   the watch was down; a 5-minute resync catches a Service deleted during a watch outage.
//! - Only the replica holding the Lease ([`crate::lease`]) writes. A reconcile computes the
//!   desired `Accepted` condition and writes only when it differs from the stored one (ignoring
//!   `lastTransitionTime`), by server-side apply of the status subresource with field manager
//!   [`FIELD_MANAGER`] (forced: the condition is ours). Nothing is written before both caches
//!   have synced (a half-filled Service cache would report AcceptedWithoutService for
//!   everything).
//! - A change of reason is also recorded as an Event on the policy (Normal when the condition is
//!   True: Accepted or AcceptedWithoutService; Warning otherwise), once per change.
//! - Both watches report to [`crate::admin::watches`]: each error is counted, an outage is logged
//!   once when it starts and once when it ends, and `/readyz` lists them. A cache counts as synced
//!   after its first list and while its watch is not failing; the watch recovers when the API
//!   server accepts it again (the client's
//!   [`WatchStartLayer`](crate::admin::watches::WatchStartLayer)), without waiting for a re-list.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aether_crds::policy;
use aether_crds::tiebreak::{self, ServiceKey};
use aether_crds::{EndpointPolicy, Rules};
use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{PartialObjectMeta, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store, store};
use kube::runtime::watcher::{self, Event, watcher};
use kube::runtime::{WatchStreamExt, reflector};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::watch;

use crate::admin::watches::{WatchHandle, Watches};
use crate::admission::ClusterFacts;
use crate::lease::{Elector, LeaseConfig};
use crate::metrics::Metrics;
use crate::status::{self, Desired};

/// The target of this module's log lines: its path before it was named `status_writer`, so
/// `RUST_LOG=aether_controller::cluster=debug` (docs/install.md, "Logs") still selects them.
const LOG_TARGET: &str = "aether_controller::cluster";

/// The field manager of status writes.
pub const FIELD_MANAGER: &str = "aether-controller";

/// Reconcile every policy this often even without a change (a safety net for missed events).
pub const RESYNC: Duration = Duration::from_secs(300);

/// The longest pause before retrying a policy's failed status write, before its jitter.
pub const RETRY_MAX: Duration = Duration::from_secs(60);

/// The pauses before retrying one policy's failed status write: 1 s doubling to [`RETRY_MAX`],
/// each plus a random part of up to its own length (backon's jitter), so the writes that an API
/// server restart fails together do not come back in one burst. Kept per policy, and restarted
/// once a write of that policy succeeds (or it turns out current or deleted).
pub fn retry_delays() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(RETRY_MAX)
        .without_max_times()
        .with_jitter()
}

type ServiceMeta = PartialObjectMeta<Service>;

/// Read access to the caches, shared by the status writer and the webhook (cheap to clone).
#[derive(Clone)]
pub struct ClusterView {
    policies: Store<EndpointPolicy>,
    services: Store<ServiceMeta>,
    policies_synced: Arc<AtomicBool>,
    services_synced: Arc<AtomicBool>,
    watches: Watches,
    rules: Arc<Rules>,
}

impl ClusterView {
    /// Whether the policy and the Service caches are synced: listed once, and their watch not
    /// failing now.
    pub fn synced(&self) -> (bool, bool) {
        (
            self.policies_synced.load(Ordering::Acquire) && !self.watches.is_failing(policy::PLURAL),
            self.services_synced.load(Ordering::Acquire) && !self.watches.is_failing("services"),
        )
    }

    /// A one-line description of the caches for `/readyz`.
    pub fn describe(&self) -> String {
        let word = |b| if b { "synced" } else { "syncing" };
        let (p, s) = self.synced();
        format!(
            "caches: endpointpolicies {} ({}), services {} ({})",
            word(p),
            self.policies.len(),
            word(s),
            self.services.len()
        )
    }
}

impl ClusterFacts for ClusterView {
    /// The rivals in the order [`tiebreak::resolve`] gives them (stable, readable warnings): the
    /// valid ones by name, then the invalid ones by name.
    fn rivals(&self, namespace: &str, target: &str, name: &str) -> Option<Vec<(String, bool)>> {
        if !self.synced().0 {
            return None;
        }
        let key = ServiceKey::new(namespace, target);
        let found = self.policies.state_filter(|p| key.is_targeted_by(p) && p.metadata.name.as_deref() != Some(name));
        let resolution = tiebreak::resolve(
            found.iter().map(AsRef::as_ref),
            |p: &&EndpointPolicy| p.metadata.name.as_deref().unwrap_or_default(),
            |p| status::invalid_because(p, &self.rules).is_none(),
        );
        let valid = resolution.winner.into_iter().chain(resolution.conflicted).map(|p| (p.name_any(), true));
        let invalid = resolution.invalid.into_iter().map(|p| (p.name_any(), false));
        Some(valid.chain(invalid).collect())
    }

    fn service_exists(&self, namespace: &str, name: &str) -> Option<bool> {
        if !self.synced().1 {
            return None;
        }
        Some(self.services.get(&ObjectRef::new(name).within(namespace)).is_some())
    }
}

/// Why a status write failed.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The API server refused or could not be reached.
    #[error("cannot write the status of EndpointPolicy {object}: {error}")]
    Patch {
        /// `namespace/name`.
        object: String,
        /// The client error. Its text ends the message, so it is not also the `source()`: a
        /// printed cause chain shows it once.
        error: kube::Error,
    },
}

impl StatusError {
    /// A bounded label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            StatusError::Patch { .. } => "patch",
        }
    }
}

/// Per policy: the resourceVersion before our last write, and what we wrote.
type Written = HashMap<ObjectRef<EndpointPolicy>, (Option<String>, Desired)>;

struct Ctx {
    client: Client,
    view: ClusterView,
    metrics: Metrics,
    leader: watch::Receiver<bool>,
    /// Who records the status-change Events. A fresh [`Recorder`] per Event: kube-runtime's
    /// recorder folds a recurring (type, reason, action, object) into a series that keeps the
    /// *first* note, so a Conflicted policy whose winner changed would show the old winner. We
    /// only record on a change, so there is nothing to fold.
    reporter: Reporter,
    /// What we last wrote per policy, with the resourceVersion the policy had *before* the write:
    /// while the cache still holds that version, the write is in flight back to us, not undone.
    written: Mutex<Written>,
    /// The retry pauses of policies whose last status write failed ([`retry_delays`]).
    retries: Mutex<HashMap<ObjectRef<EndpointPolicy>, ExponentialBackoff>>,
}

fn object_id(p: &EndpointPolicy) -> String {
    format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())
}

async fn reconcile(p: Arc<EndpointPolicy>, ctx: Arc<Ctx>) -> Result<Action, StatusError> {
    if !*ctx.leader.borrow() {
        return Ok(Action::await_change());
    }
    if ctx.view.synced() != (true, true) {
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    let namespace = p.namespace().unwrap_or_default();
    let name = p.name_any();
    let target = p.spec.target_ref.name.clone();
    let all = ctx.view.policies.state();
    let others: Vec<&EndpointPolicy> = all.iter().map(AsRef::as_ref).collect();
    let exists = ctx.view.service_exists(&namespace, &target) == Some(true);
    let desired = status::desired(&p, &others, exists, &ctx.view.rules);
    let key = ObjectRef::from_obj(p.as_ref());
    if status::is_current(p.status.as_ref(), &desired) {
        ctx.retries.lock().expect("lock").remove(&key);
        return Ok(Action::requeue(RESYNC));
    }
    let in_flight = (p.resource_version(), desired.clone());
    if ctx.written.lock().expect("lock").get(&key) == Some(&in_flight) {
        return Ok(Action::requeue(RESYNC));
    }
    let new_status = status::status_for(p.status.as_ref(), &desired, Time(Timestamp::now()));
    let body = serde_json::json!({
        "apiVersion": format!("{}/{}", policy::GROUP, policy::VERSION),
        "kind": policy::KIND,
        "status": new_status,
    });
    let api: Api<EndpointPolicy> = Api::namespaced(ctx.client.clone(), &namespace);
    let object = object_id(&p);
    match api.patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body)).await {
        Ok(_) => {}
        // Deleted meanwhile: nothing to report on.
        Err(kube::Error::Api(s)) if s.code == 404 => {
            ctx.retries.lock().expect("lock").remove(&key);
            return Ok(Action::await_change());
        }
        Err(error) => {
            ctx.metrics.count_patch("failed", desired.reason.label());
            return Err(StatusError::Patch { object, error });
        }
    }
    ctx.metrics.count_patch("applied", desired.reason.label());
    ctx.retries.lock().expect("lock").remove(&key);
    ctx.written.lock().expect("lock").insert(key, in_flight);
    tracing::info!(target: LOG_TARGET,
        %object,
        accepted = desired.status(),
        reason = desired.reason.as_str(),
        detail = %desired.message,
        generation = desired.observed_generation.unwrap_or_default(),
        "EndpointPolicy status written"
    );
    // An Event when the reason or its message changes (e.g. another winner), not on a
    // generation-only rewrite.
    let changed = status::current(p.status.as_ref())
        .is_none_or(|c| c.reason != desired.reason.as_str() || c.message != desired.message);
    if changed {
        let event = KubeEvent {
            type_: if desired.accepted { EventType::Normal } else { EventType::Warning },
            reason: desired.reason.as_str().to_owned(),
            note: Some(desired.message.clone()),
            action: "Reconcile".to_owned(),
            secondary: None,
        };
        let recorder = Recorder::new(ctx.client.clone(), ctx.reporter.clone());
        if let Err(e) = recorder.publish(&event, &p.object_ref(&())).await {
            tracing::warn!(target: LOG_TARGET, %object, error = %e, "cannot record an Event for the status change");
        }
    }
    Ok(Action::requeue(RESYNC))
}

fn error_policy(p: Arc<EndpointPolicy>, err: &StatusError, ctx: Arc<Ctx>) -> Action {
    let delay = ctx
        .retries
        .lock()
        .expect("lock")
        .entry(ObjectRef::from_obj(p.as_ref()))
        .or_insert_with(|| retry_delays().build())
        .next()
        .unwrap_or(RETRY_MAX);
    tracing::warn!(target: LOG_TARGET, object = %object_id(&p), error = %err, kind = err.label(), retry_in = ?delay, "status write failed; retrying");
    Action::requeue(delay)
}

type Key = ObjectRef<EndpointPolicy>;

/// Turns policy watch events (after the store applied them) into the policies to reconcile: the
/// policy itself and every policy sharing its target before or after the change.
struct Triggers {
    store: Store<EndpointPolicy>,
    /// Last known (namespace, target) per policy, to find the siblings a retarget leaves behind.
    targets: HashMap<Key, (String, String)>,
    synced: Arc<AtomicBool>,
    health: WatchHandle,
}

impl Triggers {
    fn siblings(&self, ns: &str, target: &str) -> Vec<EndpointPolicy> {
        let key = ServiceKey::new(ns, target);
        self.store.state_filter(|p| key.is_targeted_by(p)).iter().map(|p| p.as_ref().clone()).collect()
    }

    fn place(p: &EndpointPolicy) -> (String, String) {
        (p.namespace().unwrap_or_default(), p.spec.target_ref.name.clone())
    }

    fn on(&mut self, ev: Result<Event<EndpointPolicy>, watcher::Error>) -> Vec<Result<EndpointPolicy, watcher::Error>> {
        match ev {
            Err(e) => {
                // While the watch fails the cache may be stale: no status writes and no
                // cluster-based warnings meanwhile, and /readyz says "syncing" (ClusterView).
                self.health.failed(&e);
                vec![Err(e)]
            }
            Ok(Event::Apply(p)) => {
                self.health.ok();
                let place = Self::place(&p);
                let before = self.targets.insert(ObjectRef::from_obj(&p), place.clone());
                let mut out = self.siblings(&place.0, &place.1);
                if let Some(old) = before.filter(|old| *old != place) {
                    out.extend(self.siblings(&old.0, &old.1));
                }
                out.retain(|s| s.name_any() != p.name_any() || s.namespace() != p.namespace());
                out.push(p);
                out.into_iter().map(Ok).collect()
            }
            Ok(Event::Delete(p)) => {
                self.health.ok();
                self.targets.remove(&ObjectRef::from_obj(&p));
                let (ns, target) = Self::place(&p);
                self.siblings(&ns, &target).into_iter().map(Ok).collect()
            }
            Ok(Event::Init | Event::InitApply(_)) => vec![],
            Ok(Event::InitDone) => {
                self.health.ok();
                if !self.synced.swap(true, Ordering::AcqRel) {
                    tracing::info!(target: LOG_TARGET,
                        policies = self.store.state().len(),
                        "EndpointPolicies listed; the status writer's cache is synced"
                    );
                }
                let all = self.store.state();
                self.targets = all.iter().map(|p| (ObjectRef::from_obj(p.as_ref()), Self::place(p))).collect();
                all.iter().map(|p| Ok(p.as_ref().clone())).collect()
            }
        }
    }
}

/// One item each time this replica becomes the leader (to reconcile everything then).
fn leadership_gained(rx: watch::Receiver<bool>) -> impl Stream<Item = ()> + Send {
    futures::stream::unfold(rx, |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            if *rx.borrow_and_update() {
                return Some(((), rx));
            }
        }
    })
}

/// Everything the status writer needs.
#[derive(Debug, Clone)]
pub struct StatusWriterConfig {
    /// The client configuration (from `kube::Config::infer()` or `--kubeconfig`).
    pub kube: kube::Config,
    /// The Lease that elects the one writer.
    pub lease: LeaseConfig,
}

/// Starts the caches, the election and the status writer; returns the view for the webhook and
/// the task, which ends after `stop` turns true (releasing the Lease if held).
///
/// # Errors
/// When no client can be built from the configuration.
pub fn start(
    cfg: StatusWriterConfig,
    rules: Arc<Rules>,
    metrics: Metrics,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<(ClusterView, tokio::task::JoinHandle<()>)> {
    let watches = metrics.watches.clone();
    let policy_health = watches.register(policy::GROUP, policy::PLURAL);
    let service_health = watches.register("", "services");
    let client = kube::client::ClientBuilder::try_from(cfg.kube)
        .map_err(|e| anyhow::anyhow!("cannot build a Kubernetes client: {e}"))?
        .with_layer(&watches.layer())
        .build();
    let (policies, policy_writer) = store::<EndpointPolicy>();
    let (services, service_writer) = store::<ServiceMeta>();
    let view = ClusterView {
        policies: policies.clone(),
        services: services.clone(),
        policies_synced: Arc::new(AtomicBool::new(false)),
        services_synced: Arc::new(AtomicBool::new(false)),
        watches,
        rules,
    };

    let mut triggers = Triggers {
        store: policies.clone(),
        targets: HashMap::new(),
        synced: view.policies_synced.clone(),
        health: policy_health,
    };
    let policy_events =
        reflector(policy_writer, watcher(Api::<EndpointPolicy>::all(client.clone()), watcher::Config::default()))
            .default_backoff()
            .flat_map(move |ev| futures::stream::iter(triggers.on(ev)));

    let services_synced = view.services_synced.clone();
    let service_events =
        reflector(service_writer, watcher(Api::<ServiceMeta>::all(client.clone()), watcher::Config::default()))
            .default_backoff()
            .inspect(move |ev| match ev {
                Ok(Event::InitDone) => {
                    service_health.ok();
                    if !services_synced.swap(true, Ordering::AcqRel) {
                        tracing::info!(target: LOG_TARGET, "Services listed; the missing-Service check is synced");
                    }
                }
                // While it fails, AcceptedWithoutService and its warning wait (ClusterView::synced).
                Err(e) => service_health.failed(e),
                Ok(Event::Apply(_) | Event::Delete(_)) => service_health.ok(),
                Ok(_) => {}
            })
            .touched_objects();
    let by_target = policies.clone();
    let policies_of_service = move |svc: ServiceMeta| {
        let key = ServiceKey::new(svc.namespace().unwrap_or_default(), svc.name_any());
        by_target
            .state_filter(|p| key.is_targeted_by(p))
            .iter()
            .map(|p| ObjectRef::from_obj(p.as_ref()))
            .collect::<Vec<_>>()
    };

    let (leader_tx, leader_rx) = watch::channel(false);
    let reporter = Reporter { controller: FIELD_MANAGER.to_owned(), instance: Some(cfg.lease.holder.clone()) };
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        view: view.clone(),
        metrics: metrics.clone(),
        leader: leader_rx.clone(),
        reporter,
        written: Mutex::new(HashMap::new()),
        retries: Mutex::new(HashMap::new()),
    });
    let controller = Controller::for_stream(policy_events, policies)
        .watches_stream(service_events, policies_of_service)
        .reconcile_all_on(leadership_gained(leader_rx))
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok(_) => {}
                Err(kube::runtime::controller::Error::ObjectNotFound(r)) => {
                    tracing::debug!(target: LOG_TARGET, object = %r, "reconcile of a deleted policy skipped")
                }
                // Write failures are logged by `error_policy`, watch failures once per outage by
                // the reflectors above.
                Err(e) => tracing::debug!(target: LOG_TARGET, error = %e, "status writer"),
            }
        });

    tracing::info!(target: LOG_TARGET,
        lease = %format!("{}/{}", cfg.lease.namespace, cfg.lease.name),
        holder = %cfg.lease.holder,
        "status writer starting: watching EndpointPolicies and Services, electing one writer"
    );
    let elector = Elector::new(client, cfg.lease);
    let task = tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        tokio::select! {
            () = controller => tracing::warn!(target: LOG_TARGET, "the status writer's controller stopped"),
            () = elector.run(leader_tx, metrics, stopped) => {},
        }
    });
    Ok((view, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_status_writes_back_off_to_a_minute_with_jitter() {
        let runs: Vec<Vec<Duration>> = (0..8).map(|_| retry_delays().build().take(9).collect()).collect();
        for delays in &runs {
            for (i, d) in delays.iter().enumerate() {
                let base = (Duration::from_secs(1) * 2u32.pow(i as u32)).min(RETRY_MAX);
                assert!(*d >= base && *d < base * 2, "delay {i} of {delays:?}");
            }
        }
        assert!(runs.iter().any(|r| r != &runs[0]), "no jitter: {runs:?}");
    }
}
