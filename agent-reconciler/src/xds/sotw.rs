//! One state-of-the-world ADS stream (`StreamAggregatedResources`), from Envoy's first request
//! to its end: [`SotwStream`], which [`super::service`] spawns per stream and
//! [`super::session::run`] drives.
//!
//! The stream sends a type's resources when Envoy subscribes and again whenever that type's
//! version changes (the encoder task already coalesced bursts: no second wait here), matches each
//! request's nonce to the last response of its type (a stale nonce is ignored), and records every
//! ACK and NACK through its [`Session`]. A NACK is logged with Envoy's message and the node id;
//! nothing is re-sent for it: Envoy keeps its last good config (for CDS, every cluster it could
//! accept), and the next change gets a new version.
//!
//! Types served: CDS, LDS and ECDS (the health gateway's checks,
//! [`super::build::health_gateway`]). Each type has its own version, nonce and ACK/NACK state, so
//! a NACK of one type withdraws nothing of another (Envoy keeps its last good version of the
//! NACKed type and applies the others). ECDS is subscribed by resource name; the server always
//! sends its whole set of that type (one resource, the one the gateway names).
//!
//! Incremental (delta) xDS, `DeltaAggregatedResources`, is served by [`super::delta`].

use std::collections::HashMap;
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use prost::Message;
use tokio::sync::mpsc;
use tonic::Status;

use super::acks::{AckTracker, Nack};
use super::metrics::{MODE_SOTW, XdsMetrics};
use super::resource_set::ResourceSet;
use super::session::{Protocol, Session, next_nonce};

/// Per-stream, per-type state.
#[derive(Default)]
struct Sent {
    subscribed: bool,
    version: Option<String>,
    nonce: Option<String>,
}

/// One state-of-the-world stream: its session, per type what it sent, where responses go.
pub(super) struct SotwStream {
    session: Session,
    types: HashMap<String, Sent>,
    out: mpsc::Sender<Result<DiscoveryResponse, Status>>,
}

impl SotwStream {
    /// A stream from `peer` answering into `out`, recording into `tracker` and `metrics`.
    pub(super) fn new(
        peer: String,
        tracker: AckTracker,
        metrics: Option<XdsMetrics>,
        out: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    ) -> SotwStream {
        SotwStream { session: Session::new(peer, tracker, metrics, MODE_SOTW, "xDS"), types: HashMap::new(), out }
    }

    /// Sends `type_url` from `resources` unless this stream already sent that version (or
    /// `force`, for a fresh subscription). Returns false when the client is gone.
    async fn push(&mut self, resources: &ResourceSet, type_url: &str, force: bool) -> bool {
        let Some(set) = resources.get(type_url) else {
            return true;
        };
        let sent = self.types.entry(type_url.to_owned()).or_default();
        if !force && sent.version.as_deref() == Some(set.version.as_str()) {
            return true;
        }
        let nonce = next_nonce();
        sent.version = Some(set.version.clone());
        sent.nonce = Some(nonce.clone());
        let response = DiscoveryResponse {
            version_info: set.version.clone(),
            resources: set.iter().map(|r| r.resource.resource.clone()).collect(),
            type_url: type_url.to_owned(),
            nonce,
            ..Default::default()
        };
        tracing::debug!(node = %self.session.node, type_url, version = %set.version,
            resources = set.resources.len(), "xDS push");
        self.session.sent(
            type_url,
            set.version.clone(),
            response.resources.len() as u64,
            response.encoded_len() as u64,
        );
        self.out.send(Ok(response)).await.is_ok()
    }

    /// Handles one request; returns false when the client is gone.
    async fn request(&mut self, req: DiscoveryRequest, resources: &ResourceSet) -> bool {
        self.session.identify(req.node.as_ref());
        let node = &self.session.node;
        let type_url = req.type_url.clone();
        if resources.get(&type_url).is_none() {
            tracing::warn!(node = %node, type_url, "xDS request for a type we do not serve");
            return true;
        }
        if req.response_nonce.is_empty() {
            // A (re)subscription: always answer with the current state.
            self.types.entry(type_url.clone()).or_default().subscribed = true;
            return self.push(resources, &type_url, true).await;
        }
        let sent = self.types.entry(type_url.clone()).or_default();
        sent.subscribed = true;
        if sent.nonce.as_deref() != Some(req.response_nonce.as_str()) {
            tracing::debug!(node = %node, type_url, nonce = %req.response_nonce,
                "stale xDS nonce ignored");
            return true;
        }
        let sent_version = sent.version.clone().unwrap_or_default();
        if let Some(err) = req.error_detail {
            tracing::warn!(node = %node, type_url, version = %sent_version,
                applied_version = %req.version_info, code = err.code, error = %err.message,
                "Envoy rejected xDS update (NACK); it keeps its last good config");
            let nack = Nack { version: sent_version, nonce: req.response_nonce, message: err.message, code: err.code };
            self.session.nacked(&type_url, nack);
        } else if req.version_info == sent_version {
            tracing::debug!(node = %node, type_url, version = %sent_version, "xDS ACK");
            self.session.acked(&type_url, sent_version);
        }
        true
    }

    async fn push_changes(&mut self, resources: &ResourceSet) -> bool {
        for type_url in resources.type_urls() {
            let subscribed = self.types.get(type_url).is_some_and(|s| s.subscribed);
            if subscribed && !self.push(resources, type_url, false).await {
                return false;
            }
        }
        true
    }
}

impl Protocol for SotwStream {
    type Request = DiscoveryRequest;

    fn session(&self) -> &Session {
        &self.session
    }

    fn on_request(&mut self, req: DiscoveryRequest, current: &Arc<ResourceSet>) -> impl Future<Output = bool> + Send {
        self.request(req, current)
    }

    fn on_change(&mut self, current: &Arc<ResourceSet>) -> impl Future<Output = bool> + Send {
        self.push_changes(current)
    }
}
