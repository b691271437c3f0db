//! Watch drivers (kube-runtime reflector-style watchers) that feed the reconcile loop.
//!
//! - Pods: only this node's (`spec.nodeName=<node>` field selector) and only managed ones
//!   (`aether.io/managed=true` label selector).
//! - EndpointPolicies: gated on the CRD being served, dynamically. While it is absent the gate
//!   polls discovery with bounded backoff (1 s doubling to 30 s) and logs the absence once; once
//!   installed the watch starts without a restart; when it goes away the loop is told
//!   ([`Event::CrdAbsent`]) and the gate polls again (F07).
//!
//! Watch errors and 410 Gone never end a loop: kube-runtime relists with backoff, and a relist
//! arrives as one complete list that replaces the index's state (F08). Policies are watched as
//! untyped objects and parsed one by one, so one malformed object is logged and skipped instead of
//! failing the whole list.

use std::time::Duration;

use aether_crds::EndpointPolicy;
use aether_crds::pod::{MANAGED_LABEL, MANAGED_VALUE};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject};
use kube::core::ApiResource;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event as WEvent};
use kube::{Client, Resource};
use tokio::sync::mpsc;

use crate::driver::Event;

/// Watches this node's managed pods forever, sending events to `tx`. Returns when `tx` closes.
pub async fn pods(client: Client, node: String, tx: mpsc::Sender<Event>) {
    let api: Api<Pod> = Api::all(client);
    let cfg = watcher::Config::default()
        .fields(&format!("spec.nodeName={node}"))
        .labels(&format!("{MANAGED_LABEL}={MANAGED_VALUE}"));
    let mut stream = without_init(watcher::watcher(api, cfg)).default_backoff().boxed();
    let mut buffer: Vec<Pod> = Vec::new();
    let mut last_error: Option<String> = None;
    loop {
        let next = stream.next().await;
        let event = match next {
            None => return,
            Some(Err(e)) => {
                buffer.clear();
                let text = e.to_string();
                if last_error.as_ref() != Some(&text) {
                    tracing::warn!(error = %text, "pod watch failed; retrying with backoff");
                    last_error = Some(text);
                }
                continue;
            }
            Some(Ok(ev)) => ev,
        };
        if matches!(event, WEvent::InitDone | WEvent::Apply(_) | WEvent::Delete(_)) && last_error.take().is_some() {
            tracing::info!("pod watch recovered");
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

/// The CRD gate and the policy watch, forever. Returns when `tx` closes.
pub async fn policies(client: Client, tx: mpsc::Sender<Event>) {
    const MIN: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(30);
    let mut delay = MIN;
    let mut reported: Option<bool> = None;
    loop {
        match crd_served(&client).await {
            Ok(true) => {
                tracing::info!("EndpointPolicy CRD is served; watching EndpointPolicies");
                reported = Some(true);
                delay = MIN;
                if watch_policies(&client, &tx).await.is_err() {
                    return;
                }
                // The watch ended because the CRD went away.
                continue;
            }
            Ok(false) => {
                if reported != Some(false) {
                    tracing::warn!(
                        "EndpointPolicy CRD not installed: only pod annotations apply; checking again with backoff up to {}s",
                        MAX.as_secs()
                    );
                    reported = Some(false);
                    if tx.send(Event::CrdAbsent).await.is_err() {
                        return;
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot ask the API server whether the EndpointPolicy CRD is served"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(MAX);
    }
}

/// Watches policies until the CRD disappears (`Ok`) or `tx` closes (`Err`).
async fn watch_policies(client: &Client, tx: &mpsc::Sender<Event>) -> Result<(), ()> {
    let ar = ApiResource::erase::<EndpointPolicy>(&());
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let mut stream = without_init(watcher::watcher(api, watcher::Config::default())).default_backoff().boxed();
    let mut buffer: Vec<EndpointPolicy> = Vec::new();
    let mut last_error: Option<String> = None;
    loop {
        let event = match stream.try_next().await {
            Ok(Some(ev)) => ev,
            Ok(None) => return Ok(()),
            Err(e) => {
                buffer.clear();
                if let Ok(false) = crd_served(client).await {
                    tracing::warn!("EndpointPolicy CRD was removed: policies no longer apply");
                    tx.send(Event::CrdAbsent).await.map_err(|_| ())?;
                    return Ok(());
                }
                let text = e.to_string();
                if last_error.as_ref() != Some(&text) {
                    tracing::warn!(error = %text, "EndpointPolicy watch failed; retrying with backoff");
                    last_error = Some(text);
                }
                continue;
            }
        };
        last_error = None;
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
