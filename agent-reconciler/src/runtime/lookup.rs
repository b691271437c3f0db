//! The asynchronous front of the CRI client: the driver asks for a pod's netns without waiting,
//! a worker task asks the runtime, and answers come back on a channel.
//!
//! - [`NetnsLookup::request`] is synchronous and never waits: it enqueues the UID on a bounded
//!   queue, or says the UID is already queued, or that the queue is full (the caller asks again
//!   on its next event or resync). A runtime that is down or slow fills the queue, never the
//!   caller's loop.
//! - The worker resolves up to [`IN_FLIGHT`] pods at once, each lookup bounded by the client's
//!   timeouts. One pod is never resolved twice at once: a request for a pod in flight is run again
//!   after the running one, so the last answer sent for a pod is the freshest.
//! - Failures are logged once per pod (with the pod UID and the endpoint) until a lookup of that
//!   pod succeeds again or the pod is [`forget`](NetnsLookup::forget)ten; later failures of the
//!   same pod are debug lines. Every answer, failure included, is sent as a [`NetnsUpdate`].
//! - The worker ends when every handle is dropped or the updates receiver is dropped.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::mpsc;
use tokio::task::{Id, JoinSet};

use super::cri::CriClient;
use super::error::RuntimeError;
use super::netns::NetnsPath;

/// The default queue size for [`NetnsLookup::spawn`]: more than the pods a node runs (kubelet's
/// default maximum is 110), so a full relist fits.
pub const LOOKUP_QUEUE: usize = 1024;

/// How many lookups run at once. A slow runtime then costs a relist of N pods about
/// N / IN_FLIGHT lookup timeouts, not N.
pub const IN_FLIGHT: usize = 4;

/// One answer: the pod UID, and its netns (`Ok(None)`: the runtime knows no netns path for it).
pub type NetnsUpdate = (String, Result<Option<NetnsPath>, RuntimeError>);

/// Where netns paths come from: the CRI client, or a fake in tests.
pub trait NetnsSource: Send + Sync + 'static {
    /// The endpoint, for logs.
    fn endpoint(&self) -> &str;
    /// The netns of pod `pod_uid` (see [`CriClient::netns_of`]).
    fn netns_of(&self, pod_uid: &str) -> impl Future<Output = Result<Option<NetnsPath>, RuntimeError>> + Send;
}

impl NetnsSource for CriClient {
    fn endpoint(&self) -> &str {
        CriClient::endpoint(self)
    }

    fn netns_of(&self, pod_uid: &str) -> impl Future<Output = Result<Option<NetnsPath>, RuntimeError>> + Send {
        CriClient::netns_of(self, pod_uid)
    }
}

/// What [`NetnsLookup::request`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requested {
    /// Enqueued; an update will come.
    Queued,
    /// That UID was already waiting in the queue: this request is folded into it.
    AlreadyQueued,
    /// The queue is full: nothing was enqueued. Ask again later.
    Full,
    /// The worker has ended (the updates receiver was dropped).
    Stopped,
}

enum Msg {
    Resolve(String),
    Forget(String),
}

/// The handle the driver keeps. Cloning it shares the queue.
#[derive(Clone)]
pub struct NetnsLookup {
    tx: mpsc::Sender<Msg>,
    /// UIDs in the queue, not yet picked up by the worker (duplicates are dropped).
    queued: Arc<Mutex<HashSet<String>>>,
}

impl std::fmt::Debug for NetnsLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetnsLookup").field("capacity", &self.tx.max_capacity()).finish_non_exhaustive()
    }
}

impl NetnsLookup {
    /// Starts the worker on the current Tokio runtime. `queue`: how many requests may wait
    /// ([`LOOKUP_QUEUE`]); also the size of the updates channel.
    pub fn spawn<S: NetnsSource>(source: S, queue: usize) -> (NetnsLookup, mpsc::Receiver<NetnsUpdate>) {
        let queue = queue.max(1);
        let (tx, rx) = mpsc::channel(queue);
        let (updates_tx, updates_rx) = mpsc::channel(queue);
        let queued = Arc::new(Mutex::new(HashSet::new()));
        tokio::spawn(worker(Arc::new(source), rx, updates_tx, Arc::clone(&queued)));
        (NetnsLookup { tx, queued }, updates_rx)
    }

    /// Asks for pod `pod_uid`'s netns. Never waits.
    pub fn request(&self, pod_uid: &str) -> Requested {
        let mut queued = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
        if queued.contains(pod_uid) {
            return Requested::AlreadyQueued;
        }
        match self.tx.try_send(Msg::Resolve(pod_uid.to_owned())) {
            Ok(()) => {
                queued.insert(pod_uid.to_owned());
                Requested::Queued
            }
            Err(mpsc::error::TrySendError::Full(_)) => Requested::Full,
            Err(mpsc::error::TrySendError::Closed(_)) => Requested::Stopped,
        }
    }

    /// The pod is gone: forget that its failure was logged, and drop a re-run waiting for it. An
    /// answer already on its way is still sent (ignore answers for pods you do not know). Never
    /// waits; with a full queue it is skipped (the cost: one UID kept in the worker's set).
    pub fn forget(&self, pod_uid: &str) {
        let _ = self.tx.try_send(Msg::Forget(pod_uid.to_owned()));
    }
}

async fn worker<S: NetnsSource>(
    source: Arc<S>,
    mut rx: mpsc::Receiver<Msg>,
    updates: mpsc::Sender<NetnsUpdate>,
    queued: Arc<Mutex<HashSet<String>>>,
) {
    let mut tasks: JoinSet<Result<Option<NetnsPath>, RuntimeError>> = JoinSet::new();
    let mut in_flight: HashMap<Id, String> = HashMap::new();
    // Requested again while in flight: run once more when the running lookup ends.
    let mut rerun: HashSet<String> = HashSet::new();
    // Failing pods whose failure was logged at warn level.
    let mut logged: HashSet<String> = HashSet::new();
    let start = |tasks: &mut JoinSet<_>, in_flight: &mut HashMap<Id, String>, uid: String| {
        let source = Arc::clone(&source);
        let task_uid = uid.clone();
        let handle = tasks.spawn(async move { source.netns_of(&task_uid).await });
        in_flight.insert(handle.id(), uid);
    };
    loop {
        tokio::select! {
            msg = rx.recv(), if in_flight.len() < IN_FLIGHT => match msg {
                None => break,
                Some(Msg::Resolve(uid)) => {
                    queued.lock().unwrap_or_else(PoisonError::into_inner).remove(&uid);
                    if in_flight.values().any(|u| *u == uid) {
                        rerun.insert(uid);
                    } else {
                        start(&mut tasks, &mut in_flight, uid);
                    }
                }
                Some(Msg::Forget(uid)) => {
                    logged.remove(&uid);
                    rerun.remove(&uid);
                }
            },
            Some(done) = tasks.join_next_with_id() => {
                let (id, result) = match done {
                    Ok((id, result)) => (id, result),
                    Err(e) => {
                        // A panicking lookup: report it for its pod like any other failure.
                        let id = e.id();
                        (id, Err(RuntimeError::Call {
                            endpoint: source.endpoint().to_owned(),
                            call: "lookup",
                            code: tonic::Code::Internal,
                            detail: e.to_string(),
                        }))
                    }
                };
                let Some(uid) = in_flight.remove(&id) else { continue };
                match &result {
                    Err(e) if logged.insert(uid.clone()) => tracing::warn!(
                        pod_uid = %uid, endpoint = %source.endpoint(), error = %e, reason = e.label(),
                        "pod network namespace: the container runtime did not give it (logged once for this pod until it succeeds)"
                    ),
                    Err(e) => tracing::debug!(pod_uid = %uid, endpoint = %source.endpoint(), error = %e, "pod network namespace: still failing"),
                    Ok(found) => {
                        if logged.remove(&uid) {
                            tracing::info!(pod_uid = %uid, endpoint = %source.endpoint(), netns = ?found.as_ref().map(NetnsPath::as_str), "pod network namespace: resolved after earlier failures");
                        }
                    }
                }
                if updates.send((uid.clone(), result)).await.is_err() {
                    break;
                }
                if rerun.remove(&uid) {
                    start(&mut tasks, &mut in_flight, uid);
                }
            }
        }
    }
    tasks.abort_all();
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use tokio::sync::Semaphore;

    use super::*;
    use crate::runtime::NetnsDirs;

    /// Answers `/run/netns/<uid>-<n>` for the n-th lookup of a pod, after taking a permit.
    struct Fake {
        gate: Arc<Semaphore>,
        calls: Mutex<HashMap<String, usize>>,
        running: AtomicUsize,
        max_running: AtomicUsize,
        fail: bool,
    }

    impl Fake {
        fn new(permits: usize, fail: bool) -> (Arc<Semaphore>, Fake) {
            let gate = Arc::new(Semaphore::new(permits));
            let fake = Fake {
                gate: Arc::clone(&gate),
                calls: Mutex::default(),
                running: AtomicUsize::new(0),
                max_running: AtomicUsize::new(0),
                fail,
            };
            (gate, fake)
        }
    }

    impl NetnsSource for Arc<Fake> {
        fn endpoint(&self) -> &str {
            "unix:///fake.sock"
        }

        async fn netns_of(&self, pod_uid: &str) -> Result<Option<NetnsPath>, RuntimeError> {
            let n = {
                let mut calls = self.calls.lock().unwrap();
                let n = calls.entry(pod_uid.to_owned()).or_default();
                *n += 1;
                *n
            };
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_running.fetch_max(now, Ordering::SeqCst);
            self.gate.acquire().await.unwrap().forget();
            self.running.fetch_sub(1, Ordering::SeqCst);
            if self.fail {
                return Err(RuntimeError::Connect { endpoint: self.endpoint().into(), detail: "refused".into() });
            }
            NetnsDirs::default().translate(&format!("/var/run/netns/{pod_uid}-{n}")).map(Some)
        }
    }

    async fn next(rx: &mut mpsc::Receiver<NetnsUpdate>) -> NetnsUpdate {
        tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("an update in time").expect("worker alive")
    }

    #[tokio::test]
    async fn requests_never_wait_for_a_stuck_runtime_and_a_full_queue_says_so() {
        let (_gate, fake) = Fake::new(0, false); // the runtime never answers
        let fake = Arc::new(fake);
        let (lookup, _updates) = NetnsLookup::spawn(Arc::clone(&fake), 2);
        // The worker picks up to IN_FLIGHT requests, then stops reading; the queue holds 2 more.
        let mut outcomes = Vec::new();
        for i in 0..20 {
            outcomes.push(lookup.request(&format!("pod-{i}")));
            tokio::task::yield_now().await;
        }
        assert!(outcomes.contains(&Requested::Full), "{outcomes:?}");
        let queued = outcomes.iter().filter(|o| **o == Requested::Queued).count();
        assert_eq!(queued, IN_FLIGHT + 2, "{outcomes:?}");
        assert_eq!(fake.max_running.load(Ordering::SeqCst), IN_FLIGHT);
    }

    #[tokio::test]
    async fn duplicates_in_the_queue_are_dropped_and_answers_come_back() {
        let (gate, fake) = Fake::new(0, false);
        let fake = Arc::new(fake);
        let (lookup, mut updates) = NetnsLookup::spawn(Arc::clone(&fake), 16);
        // Fill the worker so that the next requests stay queued.
        for i in 0..IN_FLIGHT {
            assert_eq!(lookup.request(&format!("busy-{i}")), Requested::Queued);
        }
        while fake.running.load(Ordering::SeqCst) < IN_FLIGHT {
            tokio::task::yield_now().await;
        }
        assert_eq!(lookup.request("a"), Requested::Queued);
        assert_eq!(lookup.request("a"), Requested::AlreadyQueued);
        gate.add_permits(IN_FLIGHT + 1);
        let mut got = Vec::new();
        for _ in 0..=IN_FLIGHT {
            got.push(next(&mut updates).await);
        }
        let a: Vec<_> = got.iter().filter(|(uid, _)| uid == "a").collect();
        assert_eq!(a.len(), 1, "{got:?}");
        assert_eq!(a[0].1.as_ref().unwrap().as_ref().unwrap().as_str(), "/run/netns/a-1");
        assert_eq!(fake.calls.lock().unwrap()["a"], 1);
    }

    #[tokio::test]
    async fn a_pod_requested_while_in_flight_is_looked_up_again_afterwards_never_concurrently() {
        let (gate, fake) = Fake::new(0, false);
        let fake = Arc::new(fake);
        let (lookup, mut updates) = NetnsLookup::spawn(Arc::clone(&fake), 16);
        assert_eq!(lookup.request("p"), Requested::Queued);
        while fake.running.load(Ordering::SeqCst) < 1 {
            tokio::task::yield_now().await;
        }
        // In flight now: the new request is queued, then held back until the first one ends.
        assert_eq!(lookup.request("p"), Requested::Queued);
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert_eq!(fake.running.load(Ordering::SeqCst), 1, "never two lookups of one pod at once");
        gate.add_permits(2);
        let first = next(&mut updates).await;
        let second = next(&mut updates).await;
        assert_eq!(first.1.unwrap().unwrap().as_str(), "/run/netns/p-1");
        assert_eq!(second.1.unwrap().unwrap().as_str(), "/run/netns/p-2", "the last answer is the freshest");
    }

    #[tokio::test]
    async fn failures_are_sent_every_time() {
        let (gate, fake) = Fake::new(100, true);
        let (lookup, mut updates) = NetnsLookup::spawn(Arc::new(fake), 16);
        for _ in 0..2 {
            assert_eq!(lookup.request("p"), Requested::Queued);
            let (uid, result) = next(&mut updates).await;
            assert_eq!(uid, "p");
            assert_eq!(result.unwrap_err().label(), "connect");
        }
        lookup.forget("p");
        drop(gate);
    }

    #[tokio::test]
    async fn the_worker_stops_when_the_updates_receiver_is_dropped() {
        let (_gate, fake) = Fake::new(100, false);
        let (lookup, updates) = NetnsLookup::spawn(Arc::new(fake), 1);
        drop(updates);
        assert_eq!(lookup.request("p"), Requested::Queued);
        let t0 = tokio::time::Instant::now();
        for i in 0.. {
            if lookup.request(&format!("q{i}")) == Requested::Stopped {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "the worker did not stop");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
