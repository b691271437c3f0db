//! Watch drivers (kube-runtime reflector-style watchers) that feed the reconcile loop.
//!
//! - Pods: only this node's (`spec.nodeName=<node>` field selector) and only managed ones
//!   (`aether.io/managed=true` label selector), each read as a [`ProjectedPod`] (the few fields
//!   the agent uses; the rest of the object is skipped by the parser, never allocated), the
//!   complete list streamed object by object ([`ListStrategy::Streaming`], Kubernetes streaming
//!   lists) or, where the API server does not serve those, in pages of [`PAGE_SIZE`], so the whole
//!   list is never held as full Pod objects (~25 KiB per pod; docs/design-notes.md "Per-change work
//!   and a lean process").
//! - EndpointPolicies: gated on the CRD being served, dynamically. While it is absent the gate
//!   polls discovery with bounded, jittered backoff ([`crd_check_delays`]: 1 s doubling to 30 s,
//!   each plus a random part of up to its own length) and logs the absence once; once
//!   installed the watch starts without a restart; when it goes away the loop is told
//!   ([`Event::CrdAbsent`]) and the gate polls again: a missing CRD never needs an agent restart.
//!
//! Watch errors and 410 Gone never end a loop: kube-runtime relists with backoff, and a relist
//! arrives as one complete list that replaces the index's state, so nothing missed during the
//! outage survives it. Policies are watched as untyped objects and parsed one by one, so one
//! malformed object is logged and skipped instead of failing the whole list.
//!
//! Every watch reports to the [`WatchBoard`] ([`health`]): each error is counted by resource and
//! reason, an outage is logged once when it starts and once when it ends, and `/readyz` turns 503
//! while a required watch has been failing for longer than `--watch-grace-seconds`. Both watches
//! are required ([`PODS_REQUIRED`], [`POLICIES_REQUIRED`]); the policy watch is off (never
//! degrading readiness) while the CRD is not installed or with `--uds-workloads=false`. Whatever
//! fails, the loop keeps serving the last good state: a watch error withdraws nothing.

pub mod health;
pub mod owner;
pub mod projected;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aether_crds::EndpointPolicy;
use aether_crds::pod::{MANAGED_LABEL, MANAGED_VALUE};
use backon::{BackoffBuilder, ExponentialBuilder};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject};
use kube::core::ApiResource;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event as WEvent};
use kube::{Client, Resource};
use tokio::sync::mpsc;

use crate::event::{Event, listed_record};
use crate::record::PodRecord;
pub use health::{Watch, WatchBoard, WatchMetrics, WatchStartLayer};
pub use projected::ProjectedPod;

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

/// How the pod watch gets its complete lists (at start and after a 410 Gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListStrategy {
    /// A watch with `sendInitialEvents=true` (Kubernetes "streaming lists", the `WatchList`
    /// feature, on by default since 1.34): the API server streams the list from its watch cache
    /// one object at a time; no list response is ever held whole.
    Streaming,
    /// Paginated `list` calls of [`PAGE_SIZE`] pods, then a watch (any API server).
    Paged,
}

/// Pods per `list` call with [`ListStrategy::Paged`] (client-go's default page size).
pub const PAGE_SIZE: u32 = 500;

/// The first Kubernetes minor version (of 1.x) whose API server knows `sendInitialEvents`; older
/// ones ignore the parameter and would never end the initial list.
pub const STREAMING_SINCE_MINOR: u32 = 27;

impl ListStrategy {
    /// The strategy for an API server of version 1.`minor` (`None`: unparsable): streaming from
    /// [`STREAMING_SINCE_MINOR`] on, paged before. A server that knows the parameter but has the
    /// `WatchList` feature off (the default in 1.27–1.31 and 1.33) refuses it, and
    /// [`refused_streaming`] switches to [`ListStrategy::Paged`] then (for the rest of the
    /// process), as does a `watch` the RBAC refuses.
    pub fn for_minor(minor: Option<u32>) -> Self {
        match minor {
            Some(m) if m >= STREAMING_SINCE_MINOR => ListStrategy::Streaming,
            _ => ListStrategy::Paged,
        }
    }

    /// The watcher configuration for this node's managed pods.
    pub fn config(self, node: &str) -> watcher::Config {
        let cfg = watcher::Config::default()
            .fields(&format!("spec.nodeName={node}"))
            .labels(&format!("{MANAGED_LABEL}={MANAGED_VALUE}"));
        match self {
            ListStrategy::Streaming => cfg.streaming_lists(),
            ListStrategy::Paged => cfg.page_size(PAGE_SIZE),
        }
    }
}

/// The Kubernetes minor version of 1.x the API server reports (`GET /version`; a `+` suffix as in
/// `27+` is dropped), `None` when it cannot be read.
fn server_minor(info: &k8s_openapi::apimachinery::pkg::version::Info) -> Option<u32> {
    (info.major.trim() == "1").then(|| info.minor.trim_end_matches('+').parse().ok()).flatten()
}

/// Whether `e` is the API server refusing the watch call that starts a streaming list in a way
/// a paged list may not be refused: HTTP 400 or 422 (the `WatchList` feature is off) or 403 (RBAC
/// grants `list` but not `watch`: a paged list still delivers the pods, as lists did before streaming lists, and
/// its watch then fails and is reported like any failing watch).
pub fn refused_streaming(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchStartFailed(kube::Error::Api(s)) if matches!(s.code, 400 | 403 | 422))
}

/// Watches this node's managed pods forever, sending events to `tx` and reporting to `health`.
/// Returns when `tx` closes.
///
/// Each pod is read as a [`ProjectedPod`] (only the fields the agent uses are ever allocated) and
/// the complete list comes as a stream of objects ([`ListStrategy`], chosen from the API server's
/// version); each listed pod becomes its record at once ([`listed_record`]), so neither a
/// whole list response nor Pod objects are held: the buffer that becomes [`Event::PodsListed`]
/// holds records. A pod that cannot be read is logged and left out.
pub async fn pods(client: Client, node: String, tx: mpsc::Sender<Event>, health: Watch) {
    let mut delays = crd_check_delays().build();
    let mut strategy = loop {
        match client.apiserver_version().await {
            Ok(info) => break ListStrategy::for_minor(server_minor(&info)),
            Err(e) => health.failed_request(&e),
        }
        tokio::time::sleep(delays.next().unwrap_or(CRD_CHECK_MAX)).await;
    };
    loop {
        tracing::info!(strategy = ?strategy, "watching this node's pods");
        match watch_pods(&client, strategy.config(&node), &tx, &health).await {
            PodWatchEnd::Closed => return,
            PodWatchEnd::StreamingRefused(e) => {
                tracing::info!(error = %e, "the API server refuses streaming lists; listing pods in pages instead");
                strategy = ListStrategy::Paged;
            }
        }
    }
}

/// Why [`watch_pods`] returned.
enum PodWatchEnd {
    /// `tx` closed.
    Closed,
    /// The API server refused a streaming list ([`refused_streaming`]).
    StreamingRefused(watcher::Error),
}

/// One pod watcher until `tx` closes or a streaming list is refused.
///
/// The records of a list are buffered until its `InitDone`. A list that starts again (kube-runtime
/// yields `Init` first: after an error of a paged list, or a streaming list whose stream ended)
/// drops what the partial one buffered. Errors themselves do not: a streaming list resumes after a
/// stream error without starting again, so its objects so far still count.
async fn watch_pods(client: &Client, cfg: watcher::Config, tx: &mpsc::Sender<Event>, health: &Watch) -> PodWatchEnd {
    let streaming = cfg.initial_list_strategy == watcher::InitialListStrategy::StreamingList;
    let api: Api<ProjectedPod> = Api::all(client.clone());
    // `Init` is seen here, before [`without_init`] drops it (see there why).
    let restarted = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&restarted);
    let events = watcher::watcher(api, cfg).inspect(move |e| {
        if matches!(e, Ok(WEvent::Init)) {
            seen.store(true, Ordering::Relaxed);
        }
    });
    let mut stream = without_init(events).default_backoff().boxed();
    let mut buffer: Vec<PodRecord> = Vec::new();
    loop {
        let event = match stream.next().await {
            None => return PodWatchEnd::Closed,
            Some(Err(e)) if streaming && refused_streaming(&e) => return PodWatchEnd::StreamingRefused(e),
            Some(Err(e)) => {
                health.failed(&e);
                continue;
            }
            Some(Ok(ev)) => ev,
        };
        if matches!(event, WEvent::InitApply(_) | WEvent::InitDone) && restarted.swap(false, Ordering::Relaxed) {
            buffer = Vec::new();
        }
        if matches!(event, WEvent::InitDone | WEvent::Apply(_) | WEvent::Delete(_)) {
            health.ok();
        }
        let sent = match event {
            WEvent::Init => Ok(()),
            WEvent::InitApply(p) => {
                buffer.extend(listed_record(&p.into_pod()));
                Ok(())
            }
            WEvent::InitDone => {
                let listed = std::mem::take(&mut buffer);
                tracing::info!(pods = listed.len(), "listed this node's pods");
                tx.send(Event::PodsListed(listed)).await
            }
            WEvent::Apply(p) => send_some(tx, Event::pod_applied(&p.into_pod())).await,
            WEvent::Delete(p) => send_some(tx, Event::pod_deleted(&p.into_pod())).await,
        };
        if sent.is_err() {
            return PodWatchEnd::Closed;
        }
    }
}

/// Sends `event`, if there is one.
async fn send_some(tx: &mpsc::Sender<Event>, event: Option<Event>) -> Result<(), mpsc::error::SendError<Event>> {
    match event {
        Some(event) => tx.send(event).await,
        None => Ok(()),
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
/// items are discarded on the error that ends it (policies) or when the next list starts (pods,
/// which observe `Init` before this filter), so nothing stale is kept.
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

    fn version(major: &str, minor: &str) -> k8s_openapi::apimachinery::pkg::version::Info {
        k8s_openapi::apimachinery::pkg::version::Info { major: major.into(), minor: minor.into(), ..Default::default() }
    }

    #[test]
    fn streaming_lists_from_1_27_on_pages_before_or_when_the_version_is_unreadable() {
        let strategy = |major, minor| ListStrategy::for_minor(server_minor(&version(major, minor)));
        assert_eq!(strategy("1", "37"), ListStrategy::Streaming);
        assert_eq!(strategy("1", "27+"), ListStrategy::Streaming);
        assert_eq!(strategy("1", "26"), ListStrategy::Paged);
        assert_eq!(strategy("1", ""), ListStrategy::Paged);
        assert_eq!(strategy("2", "40"), ListStrategy::Paged);
        let streaming = ListStrategy::Streaming.config("n1");
        assert_eq!(streaming.initial_list_strategy, watcher::InitialListStrategy::StreamingList);
        assert_eq!(streaming.field_selector.as_deref(), Some("spec.nodeName=n1"));
        assert_eq!(streaming.label_selector.as_deref(), Some("aether.io/managed=true"));
        let paged = ListStrategy::Paged.config("n1");
        assert_eq!(paged.initial_list_strategy, watcher::InitialListStrategy::ListWatch);
        assert_eq!(paged.page_size, Some(PAGE_SIZE));
    }

    #[test]
    fn only_a_refused_streaming_watch_start_switches_to_pages() {
        let status =
            |code| Box::new(kube::core::Status::failure("sendInitialEvents is forbidden", "Invalid").with_code(code));
        let start = |code| watcher::Error::WatchStartFailed(kube::Error::Api(status(code)));
        assert!(refused_streaming(&start(422)));
        assert!(refused_streaming(&start(400)));
        assert!(refused_streaming(&start(403)), "list without watch: a paged list may still succeed");
        assert!(!refused_streaming(&start(500)));
        assert!(!refused_streaming(&watcher::Error::WatchError(status(410))));
    }
}
