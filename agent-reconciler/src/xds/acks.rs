//! What each node's Envoy applied or rejected, and which ADS streams are open now: the
//! [`AckTracker`]. The server records into it; `/readyz`, metrics, tests and the shutdown wait
//! read it.
//!
//! The tracker keeps, per node id and type URL (CDS, LDS and ECDS alike: nothing here is specific
//! to a type), the versions sent and acknowledged and the last NACK ([`TypeState`], [`Nack`]);
//! and it counts the streams open now, per node id: a stream
//! counts from its first request that carries a node until it ends, however it ends (the client
//! went away, an error, the server's shutdown); see [`AckTracker::connected`] and
//! [`AckTracker::streams`] (what each open stream ACKed, [`StreamState`], read by `/readyz`
//! through [`super::readiness`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

/// What Envoy said about one NACKed response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nack {
    /// Version of the rejected response.
    pub version: String,
    /// Nonce of the rejected response.
    pub nonce: String,
    /// `error_detail.message`: Envoy's reason, verbatim.
    pub message: String,
    /// `error_detail.code` (a gRPC status code; Envoy uses 13, INTERNAL).
    pub code: i32,
}

/// ACK/NACK state of one type URL for one node, across its streams.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TypeState {
    /// Version of the last response sent.
    pub sent_version: Option<String>,
    /// Number of responses sent: one per (re)subscription plus one per version change; an
    /// unchanged version is never re-sent on a stream.
    pub sends: u64,
    /// Version Envoy last acknowledged (applied).
    pub acked_version: Option<String>,
    /// Number of ACKs received.
    pub acks: u64,
    /// Number of NACKs received.
    pub nacks: u64,
    /// The most recent NACK, kept after later ACKs (see `nacks` for whether one happened).
    pub last_nack: Option<Nack>,
}

/// What one open ADS stream has done, for readers of [`AckTracker::streams`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamState {
    /// Envoy's node id, from the stream's first request that carried a node.
    pub node: String,
    /// Per type URL: the version Envoy last acknowledged on this stream.
    pub acked: HashMap<String, String>,
    /// Per type URL: the last NACK on this stream (kept after later ACKs).
    pub nacked: HashMap<String, Nack>,
}

#[derive(Debug, Default)]
struct TrackerState {
    /// Node id -> type URL -> state, across the node's streams (closed ones included).
    nodes: HashMap<String, HashMap<String, TypeState>>,
    /// Open streams by a per-tracker id (increasing: oldest first).
    streams: BTreeMap<u64, StreamState>,
    next_stream: u64,
    /// Streams that ended, since the tracker was made.
    ended: u64,
}

/// Shared, queryable ACK/NACK state per node id and type URL, and the ADS streams open now;
/// cheap to clone. Readers are tests, `/readyz`, metrics and the shutdown wait; every recorded
/// event (a send, an ACK, a NACK, a stream opening or closing) wakes [`AckTracker::wait_for`].
///
/// A stream counts as connected from its first request that carries a node until it ends,
/// however it ends (the client went away, an error, the server's shutdown).
#[derive(Clone, Debug)]
pub struct AckTracker {
    state: Arc<Mutex<TrackerState>>,
    changes: watch::Sender<u64>,
}

impl Default for AckTracker {
    fn default() -> Self {
        AckTracker { state: Arc::default(), changes: watch::Sender::new(0) }
    }
}

impl AckTracker {
    /// An empty tracker.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TrackerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state of `type_url` for `node` (default if never seen).
    pub fn get(&self, node: &str, type_url: &str) -> TypeState {
        self.lock().nodes.get(node).and_then(|types| types.get(type_url)).cloned().unwrap_or_default()
    }

    /// Node ids seen so far (connected now or not), sorted.
    pub fn nodes(&self) -> Vec<String> {
        let mut nodes: Vec<String> = self.lock().nodes.keys().cloned().collect();
        nodes.sort();
        nodes
    }

    /// Last acked version of `type_url` for `node`.
    pub fn acked_version(&self, node: &str, type_url: &str) -> Option<String> {
        self.get(node, type_url).acked_version
    }

    /// Total NACKs of `type_url` from `node`.
    pub fn nack_count(&self, node: &str, type_url: &str) -> u64 {
        self.get(node, type_url).nacks
    }

    /// Number of ADS streams open now, all nodes together.
    pub fn connected_total(&self) -> usize {
        self.lock().streams.len()
    }

    /// Number of ADS streams open now from `node`.
    pub fn connected(&self, node: &str) -> usize {
        self.lock().streams.values().filter(|s| s.node == node).count()
    }

    /// Number of ADS streams that have ended since the tracker was made (an Envoy exited, or its
    /// stream broke).
    pub fn ended_total(&self) -> u64 {
        self.lock().ended
    }

    /// The ADS streams open now, oldest first.
    pub fn streams(&self) -> Vec<StreamState> {
        self.lock().streams.values().cloned().collect()
    }

    /// Waits until `pred(self)` holds, re-checking on every recorded event, for at most
    /// `timeout`. Returns whether it held.
    pub async fn wait_for(&self, timeout: Duration, mut pred: impl FnMut(&AckTracker) -> bool) -> bool {
        let mut rx = self.changes.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            rx.borrow_and_update();
            if pred(self) {
                return true;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return pred(self),
            }
        }
    }

    fn notify(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    pub(super) fn update(&self, node: &str, type_url: &str, f: impl FnOnce(&mut TypeState)) {
        {
            let mut state = self.lock();
            let entry = state.nodes.entry(node.to_owned()).or_default().entry(type_url.to_owned()).or_default();
            f(entry);
        }
        self.notify();
    }

    /// Records an ACK or NACK on open stream `id` (nothing if it is not open).
    pub(super) fn update_stream(&self, id: u64, f: impl FnOnce(&mut StreamState)) {
        if let Some(stream) = self.lock().streams.get_mut(&id) {
            f(stream);
        }
        self.notify();
    }

    /// Counts a stream from `node` as open; returns its id for [`AckTracker::stream_closed`].
    pub(super) fn stream_opened(&self, node: &str) -> u64 {
        let id = {
            let mut state = self.lock();
            state.next_stream += 1;
            let id = state.next_stream;
            state.streams.insert(id, StreamState { node: node.to_owned(), ..StreamState::default() });
            id
        };
        self.notify();
        id
    }

    pub(super) fn stream_closed(&self, id: u64) {
        {
            let mut state = self.lock();
            if state.streams.remove(&id).is_some() {
                state.ended += 1;
            }
        }
        self.notify();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_tracker_wakes_waiters_and_times_out() {
        let t = AckTracker::new();
        let t2 = t.clone();
        let waiter =
            tokio::spawn(
                async move { t2.wait_for(Duration::from_secs(5), |t| t.acked_version("n", "x").is_some()).await },
            );
        tokio::time::sleep(Duration::from_millis(20)).await;
        t.update("n", "x", |s| s.acked_version = Some("v1".into()));
        assert!(waiter.await.unwrap());
        assert!(!t.wait_for(Duration::from_millis(30), |t| t.nack_count("n", "x") > 0).await);
        assert_eq!(t.nodes(), vec!["n".to_owned()]);
    }
}
