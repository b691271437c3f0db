//! The event task: publishes the [`Notice`]s the reconcile loop decided ([`crate::pod_events`])
//! as `events.k8s.io/v1` Events on the pods (and, [`spawn_node_warning`], a Warning on the Node), through kube-runtime's [`Recorder`] (reporting
//! controller `aether-agent`, reporting instance = the node name).
//!
//! The loop hands notices over a bounded channel with `try_send` ([`NoticeSender`]), so it never
//! waits for the API server: a full queue drops the notice (logged with the pod, counted as
//! `result="dropped"`). A publish that fails is retried a few times with jittered exponential
//! backoff (backon; not for a 4xx answer other than 429, which will not change), then logged with the pod and counted as
//! `result="failed"`; nothing crashes. RBAC: `events.k8s.io` `events` `create`.
//!
//! Each notice is published through a fresh [`Recorder`]: kube-runtime's recorder folds a
//! recurring (type, reason, action, object) into a series that keeps the *first* note, so a pod
//! whose invalid value changed would still show the old value. [`crate::pod_events`] already
//! sends one notice per change, so there is nothing to fold.

use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::metrics::Metrics;
use crate::pod_events::{Notice, Severity};

/// The Event's `reportingController`.
pub const REPORTING_CONTROLLER: &str = "aether-agent";
/// Capacity of the notice queue.
pub const QUEUE: usize = 1024;
/// Attempts per notice before it is counted as failed.
const ATTEMPTS: u32 = 4;

/// The loop's end of the queue: never blocks.
#[derive(Clone)]
pub struct NoticeSender {
    /// The queue and the metrics its drops are counted in; `None` when detached.
    queue: Option<(mpsc::Sender<Notice>, Arc<Metrics>)>,
}

impl NoticeSender {
    /// A queue of [`QUEUE`] notices; the receiver goes to [`spawn`] (or a test).
    pub fn channel(metrics: Arc<Metrics>) -> (NoticeSender, mpsc::Receiver<Notice>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (NoticeSender { queue: Some((tx, metrics)) }, rx)
    }

    /// A sender to no queue: every notice is dropped silently (the loop still logs what it
    /// decides). For a loop that publishes no Events, e.g. in tests and benchmarks.
    pub fn detached() -> NoticeSender {
        NoticeSender { queue: None }
    }

    /// Queues `notice`; a full or closed queue drops it (logged and counted).
    pub fn send(&self, notice: Notice) {
        let Some((tx, metrics)) = &self.queue else { return };
        if let Err(e) = tx.try_send(notice) {
            let n = match e {
                mpsc::error::TrySendError::Full(n) | mpsc::error::TrySendError::Closed(n) => n,
            };
            tracing::warn!(pod = %format!("{}/{}", n.pod.namespace, n.pod.name), reason = n.reason,
                "the pod Event queue is full (or its task ended); dropping the Event");
            metrics.pod_event(n.label, "dropped");
        }
    }
}

/// The Event's `regarding`: the pod, by API version, kind, namespace, name and UID.
pub fn pod_reference(n: &Notice) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(n.pod.namespace.to_string()),
        name: Some(n.pod.name.to_string()),
        uid: Some(n.pod.uid.to_string()),
        ..ObjectReference::default()
    }
}

/// Publishes every notice `rx` receives until it closes.
pub fn spawn(client: Client, node: &str, mut rx: mpsc::Receiver<Notice>, metrics: Arc<Metrics>) -> JoinHandle<()> {
    let reporter = Reporter { controller: REPORTING_CONTROLLER.into(), instance: Some(node.to_owned()) };
    tokio::spawn(async move {
        while let Some(n) = rx.recv().await {
            let result = publish(&Recorder::new(client.clone(), reporter.clone()), &n).await;
            metrics.pod_event(n.label, if result { "created" } else { "failed" });
        }
    })
}

async fn publish(recorder: &Recorder, n: &Notice) -> bool {
    let event = Event {
        type_: match n.severity {
            Severity::Normal => EventType::Normal,
            Severity::Warning => EventType::Warning,
        },
        reason: n.reason.to_owned(),
        note: Some(n.note.clone()),
        action: n.action.to_owned(),
        secondary: None,
    };
    let pod = format!("{}/{}", n.pod.namespace, n.pod.name);
    match publish_with_retries(recorder, &event, &pod_reference(n), &pod).await {
        Ok(()) => {
            tracing::debug!(pod = %pod, reason = n.reason, "published a pod Event");
            true
        }
        Err((e, attempts)) => {
            tracing::warn!(pod = %pod, reason = n.reason, error = %e, attempts, "cannot publish a pod Event");
            false
        }
    }
}

/// Publishes one Warning Event on Node `node` (`regarding` the Node, reporting instance the node
/// name), with the same retries as a pod's; for what concerns the node rather than a pod (e.g.
/// [`crate::kernel::Gap`]). Nothing is counted in the pod Event metric.
pub fn spawn_node_warning(
    client: Client,
    node: &str,
    reason: &'static str,
    action: &'static str,
    note: String,
) -> JoinHandle<()> {
    let reporter = Reporter { controller: REPORTING_CONTROLLER.into(), instance: Some(node.to_owned()) };
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.to_owned()),
        ..ObjectReference::default()
    };
    let node = node.to_owned();
    tokio::spawn(async move {
        let event = Event {
            type_: EventType::Warning,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: None,
        };
        match publish_with_retries(&Recorder::new(client, reporter), &event, &reference, &node).await {
            Ok(()) => tracing::info!(node = %node, reason, "published a Warning Event on the node"),
            Err((e, attempts)) => {
                tracing::warn!(node = %node, reason, error = %e, attempts, "cannot publish a node Event")
            }
        }
    })
}

/// Publishes `event` regarding `reference` (`what` names it in the retry logs): up to
/// [`ATTEMPTS`] tries, none after a 4xx answer other than 429.
///
/// # Errors
/// The last error and the number of attempts made.
async fn publish_with_retries(
    recorder: &Recorder,
    event: &Event,
    reference: &ObjectReference,
    what: &str,
) -> Result<(), (kube::Error, u32)> {
    let permanent = |e: &kube::Error| matches!(e, kube::Error::Api(s) if (400..500).contains(&s.code) && s.code != 429);
    let reason = event.reason.as_str();
    let mut attempts = 1;
    (|| recorder.publish(event, reference))
        .retry(retry_delays())
        .when(|e| !permanent(e))
        .notify(|e, delay| {
            attempts += 1;
            tracing::debug!(regarding = %what, reason, error = %e, retry_in = ?delay, "publishing an Event failed; retrying");
        })
        .await
        .map_err(|e| (e, attempts))
}

/// The delays between the [`ATTEMPTS`] publishes of one notice: 500 ms doubling, each with a
/// random jitter of up to its own length, so the agents of every node, refused together by an
/// API server that restarts, do not all come back at the same instant.
fn retry_delays() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(8))
        .with_max_times(ATTEMPTS as usize - 1)
        .with_jitter()
}

#[cfg(test)]
mod tests {
    use backon::BackoffBuilder;

    use super::*;

    #[test]
    fn retries_are_jittered_doublings_from_half_a_second() {
        let runs: Vec<Vec<Duration>> = (0..8).map(|_| retry_delays().build().collect()).collect();
        for delays in &runs {
            assert_eq!(delays.len(), ATTEMPTS as usize - 1, "{delays:?}");
            for (i, d) in delays.iter().enumerate() {
                let base = Duration::from_millis(500) * 2u32.pow(i as u32);
                assert!(*d >= base && *d < base * 2, "delay {i} of {delays:?}");
            }
        }
        assert!(runs.iter().any(|r| r != &runs[0]), "no jitter: {runs:?}");
    }
}
