//! Watch drivers (kube-runtime reflector-style watchers) that feed the reconcile loop.
//!
//! - Pods: only this node's (`spec.nodeName=<node>` field selector) and only managed ones
//!   (`aether.io/managed=true` label selector).
//! - EndpointPolicies: gated on the CRD being served, dynamically. While it is absent the gate
//!   polls discovery with bounded, jittered backoff ([`crd_check_delays`]: 1 s doubling to 30 s,
//!   each plus a random part of up to its own length) and logs the absence once; once
//!   installed the watch starts without a restart; when it goes away the loop is told
//!   ([`Event::CrdAbsent`]) and the gate polls again (F07).
//!
//! Watch errors and 410 Gone never end a loop: kube-runtime relists with backoff, and a relist
//! arrives as one complete list that replaces the index's state (F08). Policies are watched as
//! untyped objects and parsed one by one, so one malformed object is logged and skipped instead of
//! failing the whole list.
//!
//! Every watch reports to the [`WatchBoard`] ([`health`]): each error is counted by resource and
//! reason, an outage is logged once when it starts and once when it ends, and `/readyz` turns 503
//! while a required watch has been failing for longer than `--watch-grace-seconds`. Both watches
//! are required ([`PODS_REQUIRED`], [`POLICIES_REQUIRED`]); the policy watch is off (never
//! degrading readiness) while the CRD is not installed or with `--uds-workloads=false`. Whatever
//! fails, the loop keeps serving the last good state: a watch error withdraws nothing.

pub mod health;

use std::time::Duration;

use aether_crds::EndpointPolicy;
use aether_crds::pod::{MANAGED_LABEL, MANAGED_VALUE};
use backon::{BackoffBuilder, ExponentialBuilder};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject};
use kube::core::ApiResource;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event as WEvent};
use kube::{Client, Resource};
use tokio::sync::mpsc;

use crate::driver::Event;
pub use health::{Watch, WatchBoard, WatchMetrics, WatchStartLayer};

/// Why `/readyz` depends on the pod watch (shown there).
pub const PODS_REQUIRED: &str = "pods of this node that are created, changed or deleted reach Envoy only through it";
/// Why `/readyz` depends on the EndpointPolicy watch while the CRD is installed (shown there).
pub const POLICIES_REQUIRED: &str = "EndpointPolicy changes reach this node's pods only through it";
/// Why the EndpointPolicy watch is off while the CRD is absent.
pub const CRD_ABSENT: &str = "the EndpointPolicy CRD is not installed: only pod annotations apply";

/// Registers the agent's watches on `board`: the pod watch, and the EndpointPolicy watch (off
/// when `uds_workloads` is false). Returns their handles: (pods, policies).
pub fn register(board: &WatchBoard, uds_workloads: bool) -> (Watch, Watch) {
    let pods = board.register("", "pods", Some(PODS_REQUIRED));
    let policies = board.register(aether_crds::policy::GROUP, aether_crds::policy::PLURAL, Some(POLICIES_REQUIRED));
    if !uds_workloads {
        policies.off("--uds-workloads=false: EndpointPolicies are not watched and every pod is TCP");
    }
    (pods, policies)
}

/// The agent's Kubernetes client from the usual configuration (in-cluster, or `KUBECONFIG`),
/// with the [`WatchStartLayer`] reporting accepted watch requests to `board`.
///
/// # Errors
/// When no configuration can be inferred or the client cannot be built.
pub async fn client(board: &WatchBoard) -> Result<Client, kube::Error> {
    let config = kube::Config::infer().await.map_err(kube::Error::InferConfig)?;
    Ok(kube::client::ClientBuilder::try_from(config)?.with_layer(&WatchStartLayer::new(board.clone())).build())
}

/// Watches this node's managed pods forever, sending events to `tx` and reporting to `health`.
/// Returns when `tx` closes.
pub async fn pods(client: Client, node: String, tx: mpsc::Sender<Event>, health: Watch) {
    let api: Api<Pod> = Api::all(client);
    let cfg = watcher::Config::default()
        .fields(&format!("spec.nodeName={node}"))
        .labels(&format!("{MANAGED_LABEL}={MANAGED_VALUE}"));
    let mut stream = without_init(watcher::watcher(api, cfg)).default_backoff().boxed();
    let mut buffer: Vec<Pod> = Vec::new();
    loop {
        let event = match stream.next().await {
            None => return,
            Some(Err(e)) => {
                buffer.clear();
                health.failed(&e);
                continue;
            }
            Some(Ok(ev)) => ev,
        };
        if matches!(event, WEvent::InitDone | WEvent::Apply(_) | WEvent::Delete(_)) {
            health.ok();
        }
        let sent = match event {
            WEvent::Init => Ok(()),
            WEvent::InitApply(p) => {
                buffer.push(p);
                Ok(())
            }
            WEvent::InitDone => tx.send(Event::PodsListed(std::mem::take(&mut buffer))).await,
            WEvent::Apply(p) => tx.send(Event::PodApplied(Box::new(p))).await,
            WEvent::Delete(p) => tx.send(Event::PodDeleted(Box::new(p))).await,
        };
        if sent.is_err() {
            return;
        }
    }
}

/// Whether the API server serves `endpointpolicies.config.aether.io/v1`.
///
/// # Errors
/// When discovery itself fails (API server unreachable), as opposed to "not served".
pub async fn crd_served(client: &Client) -> Result<bool, kube::Error> {
    let gv = format!("{}/{}", aether_crds::policy::GROUP, aether_crds::policy::VERSION);
    match client.list_api_group_resources(&gv).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == aether_crds::policy::PLURAL)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// The CRD gate and the policy watch, forever, reporting to `health` (discovery failures
/// included). Returns when `tx` closes.
pub async fn policies(client: Client, tx: mpsc::Sender<Event>, health: Watch) {
    let mut delays = crd_check_delays().build();
    let mut reported: Option<bool> = None;
    loop {
        match crd_served(&client).await {
            Ok(true) => {
                tracing::info!("EndpointPolicy CRD is served; watching EndpointPolicies");
                reported = Some(true);
                delays = crd_check_delays().build();
                health.on();
                if watch_policies(&client, &tx, &health).await.is_err() {
                    return;
                }
                // The watch ended because the CRD went away.
                continue;
            }
            Ok(false) => {
                health.off(CRD_ABSENT);
                if reported != Some(false) {
                    tracing::warn!(
                        "EndpointPolicy CRD not installed: only pod annotations apply; checking again with backoff up to {}s",
                        CRD_CHECK_MAX.as_secs()
                    );
                    reported = Some(false);
                    if tx.send(Event::CrdAbsent).await.is_err() {
                        return;
                    }
                }
            }
            Err(e) => health.failed_request(&e),
        }
        tokio::time::sleep(delays.next().unwrap_or(CRD_CHECK_MAX)).await;
    }
}

/// The longest pause between two CRD checks, before its jitter.
pub const CRD_CHECK_MAX: Duration = Duration::from_secs(30);

/// The pauses between CRD checks while the CRD is absent or discovery fails: 1 s doubling to
/// [`CRD_CHECK_MAX`], each plus a random part of up to its own length (backon's jitter), so the
/// agents of every node, which an API server restart fails together, spread their checks out
/// instead of coming back in lockstep. Never ends; restarted once the CRD is served.
pub fn crd_check_delays() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(CRD_CHECK_MAX)
        .without_max_times()
        .with_jitter()
}

/// Watches policies until the CRD disappears (`Ok`) or `tx` closes (`Err`).
async fn watch_policies(client: &Client, tx: &mpsc::Sender<Event>, health: &Watch) -> Result<(), ()> {
    let ar = ApiResource::erase::<EndpointPolicy>(&());
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let mut stream = without_init(watcher::watcher(api, watcher::Config::default())).default_backoff().boxed();
    let mut buffer: Vec<EndpointPolicy> = Vec::new();
    loop {
        let event = match stream.try_next().await {
            Ok(Some(ev)) => ev,
            Ok(None) => return Ok(()),
            Err(e) => {
                buffer.clear();
                if let Ok(false) = crd_served(client).await {
                    tracing::warn!("EndpointPolicy CRD was removed: policies no longer apply");
                    health.counted(&e);
                    health.off(CRD_ABSENT);
                    tx.send(Event::CrdAbsent).await.map_err(|_| ())?;
                    return Ok(());
                }
                health.failed(&e);
                continue;
            }
        };
        if matches!(event, WEvent::InitDone | WEvent::Apply(_) | WEvent::Delete(_)) {
            health.ok();
        }
        let sent = match event {
            WEvent::Init => Ok(()),
            WEvent::InitApply(obj) => {
                buffer.extend(parse(obj));
                Ok(())
            }
            WEvent::InitDone => tx.send(Event::PoliciesListed(std::mem::take(&mut buffer))).await,
            WEvent::Apply(obj) => {
                let (namespace, name) = id(&obj);
                match parse(obj) {
                    Some(p) => tx.send(Event::PolicyApplied(Box::new(p))).await,
                    // A policy that no longer parses must stop applying.
                    None => tx.send(Event::PolicyDeleted { namespace, name }).await,
                }
            }
            WEvent::Delete(obj) => {
                let (namespace, name) = id(&obj);
                tx.send(Event::PolicyDeleted { namespace, name }).await
            }
        };
        sent.map_err(|_| ())?;
    }
}

fn id(obj: &DynamicObject) -> (String, String) {
    (obj.meta().namespace.clone().unwrap_or_default(), obj.meta().name.clone().unwrap_or_default())
}

/// One policy from its untyped form; a malformed one is logged and skipped.
fn parse(obj: DynamicObject) -> Option<EndpointPolicy> {
    let (namespace, name) = id(&obj);
    let value = serde_json::to_value(&obj).ok()?;
    match serde_json::from_value::<EndpointPolicy>(value) {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!(policy = %format!("{namespace}/{name}"), error = %e, "skipping a malformed EndpointPolicy");
            None
        }
    }
}

/// Drops `Init` (the start of a relist) before the backoff: kube-runtime's backoff resets on every
/// successful item, and `Init` comes before the list call, so while the API server is down it
/// would reset the backoff on every attempt and retry every second forever. A relist's partial
/// items are discarded on the error that ends it, so nothing is lost.
fn without_init<K: Send + 'static>(
    stream: impl futures::Stream<Item = watcher::Result<WEvent<K>>> + Send + 'static,
) -> impl futures::Stream<Item = watcher::Result<WEvent<K>>> + Send {
    stream.filter(|e| futures::future::ready(!matches!(e, Ok(WEvent::Init))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crd_checks_back_off_to_thirty_seconds_with_jitter() {
        let runs: Vec<Vec<Duration>> = (0..8).map(|_| crd_check_delays().build().take(10).collect()).collect();
        for delays in &runs {
            for (i, d) in delays.iter().enumerate() {
                let base = (Duration::from_secs(1) * 2u32.pow(i as u32)).min(CRD_CHECK_MAX);
                assert!(*d >= base && *d < base * 2, "delay {i} of {delays:?}");
            }
        }
        assert!(runs.iter().any(|r| r != &runs[0]), "no jitter: {runs:?}");
    }
}
