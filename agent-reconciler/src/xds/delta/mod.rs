//! One incremental (delta) ADS stream, `DeltaAggregatedResources`, from Envoy's first request to
//! its end: `DeltaStream`, which [`super::service`] spawns per stream and `session::run` drives.
//! CDS, LDS and ECDS, served beside the state-of-the-world stream (`sotw`) from the same
//! [`ResourceSet`], recorded through the same session (`session::Session`) into the same
//! [`AckTracker`] and metrics.
//!
//! Per type URL the stream keeps the client's [`Subscription`] (CDS and LDS: the wildcard; ECDS:
//! the checks' name) and what it [`Held`]: on a new stream the client's
//! `initial_resource_versions` (a reconnecting Envoy lists what it has, so it gets only what
//! changed meanwhile), then every version sent. Each response carries only the subscribed
//! resources whose version ([`resource_version`](super::resource_set::resource_version), a
//! content hash) the client does not hold, plus the names it holds that are gone
//! (`removed_resources`); see [`diff::plan`].
//!
//! - A name subscribed explicitly is sent even if the client holds it (the protocol's rule),
//!   except on a new stream's first request when `initial_resource_versions` lists it: then its
//!   version decides, as for the wildcard.
//! - A response is sent for a type on the stream's first request of it (always, even empty, so
//!   Envoy's initial fetch completes and the version can be ACKed), when a request subscribes
//!   names, and after every change of the published resources (as state of the world: at once,
//!   the encoder task has coalesced bursts) when something differs or the type's version moved on.
//! - `system_version_info` is the type's [`TypedResources`](super::resource_set::TypedResources)
//!   version: the full set the response brings the client to. The tracker records it as the sent
//!   version, and as the ACKed one when Envoy ACKs the response, so `/readyz` reads delta streams
//!   as it reads state-of-the-world ones.
//! - One nonce per response; a request whose `response_nonce` names one of the responses in
//!   flight is its ACK (no `error_detail`) or NACK (with it; Envoy's message names the rejected
//!   resources). A NACK is logged and recorded; nothing is re-sent for it, but the names that
//!   response carried are forgotten (Envoy may hold some of them, not which), so the next change
//!   of the type sends them again: an ACK then means every resource of its version is applied.

pub mod diff;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource};
use imbl::ordmap::DiffItem;
use prost::Message;
use tokio::sync::mpsc;
use tonic::Status;

pub use diff::{Held, Plan, Subscription, plan};

use super::acks::{AckTracker, Nack};
use super::metrics::{MODE_DELTA, XdsMetrics};
use super::resource_set::{ResourceSet, Served, SetKey};
use super::session::{Protocol, Session, next_nonce};

/// Responses of one type kept waiting for their ACK or NACK; older ones are forgotten (their
/// late answer is then ignored as stale).
const IN_FLIGHT: usize = 16;

/// One response sent and not yet ACKed or NACKed.
#[derive(Debug)]
struct InFlight {
    nonce: String,
    /// Its `system_version_info`.
    version: String,
    /// The names it carried (sent or removed).
    names: Vec<String>,
}

/// One type on one stream.
#[derive(Debug, Default)]
struct TypeStream {
    subscription: Subscription,
    held: Held,
    /// Names (re)subscribed since the last response: sent whether held or not.
    forced: BTreeSet<String>,
    /// `system_version_info` of the last response.
    sent_version: Option<String>,
    in_flight: VecDeque<InFlight>,
    /// The set the last response was planned against (a structural share, not a copy): the
    /// next plan looks only at the names that differ from it ([`imbl::OrdMap::diff`]), so a
    /// change costs the stream O(changed · log n). `None` until the first response, or after
    /// a wildcard subscription: the next plan looks at every name.
    synced: Option<imbl::OrdMap<SetKey, Arc<Served>>>,
    /// Names whose held state moved outside a response (unsubscribed, or carried by a NACKed
    /// response): looked at by the next plan.
    recheck: BTreeSet<String>,
}

/// One delta stream: its session, per type what the client holds and asked for, where responses
/// go.
pub(super) struct DeltaStream {
    session: Session,
    types: HashMap<String, TypeStream>,
    out: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
}

impl DeltaStream {
    /// A stream from `peer` answering into `out`, recording into `tracker` and `metrics`.
    pub(super) fn new(
        peer: String,
        tracker: AckTracker,
        metrics: Option<XdsMetrics>,
        out: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
    ) -> DeltaStream {
        DeltaStream {
            session: Session::new(peer, tracker, metrics, MODE_DELTA, "delta xDS"),
            types: HashMap::new(),
            out,
        }
    }

    /// Sends what `type_url`'s client lacks of `resources`: when the plan is not empty, when the
    /// type's version differs from the last one sent, or when `always`. Returns false when the
    /// client is gone.
    async fn push(&mut self, resources: &Arc<ResourceSet>, type_url: &str, always: bool) -> bool {
        let (Some(set), Some(t)) = (resources.get(type_url), self.types.get_mut(type_url)) else {
            return true;
        };
        if t.subscription.is_empty() {
            return true;
        }
        let current = &set.resources;
        let candidates: Option<BTreeSet<String>> = t.synced.as_ref().map(|synced| {
            let mut names: BTreeSet<String> = synced
                .diff(current)
                .map(|item| match item {
                    DiffItem::Add((name, _), _) | DiffItem::Remove((name, _), _) => name.clone(),
                    DiffItem::Update { new: ((name, _), _), .. } => name.clone(),
                })
                .collect();
            names.append(&mut t.recheck);
            names
        });
        let plan = plan(&t.held, current, &t.subscription, &t.forced, candidates.as_ref());
        t.forced.clear();
        t.recheck.clear();
        t.synced = Some(current.clone());
        if plan.is_empty() && !always && t.sent_version.as_deref() == Some(set.version.as_str()) {
            return true;
        }
        t.held.record(current, &plan);
        let nonce = next_nonce();
        let response = DeltaDiscoveryResponse {
            system_version_info: set.version.clone(),
            resources: plan
                .send
                .iter()
                .filter_map(|key| current.get(key))
                .map(|r| Resource {
                    name: r.resource.name.clone(),
                    version: r.version.clone(),
                    resource: Some(r.resource.resource.clone()),
                    ..Default::default()
                })
                .collect(),
            type_url: type_url.to_owned(),
            removed_resources: plan.removed.clone(),
            nonce: nonce.clone(),
            ..Default::default()
        };
        let names = plan.send.iter().map(|(name, _)| name.clone()).chain(plan.removed.iter().cloned()).collect();
        if t.in_flight.len() == IN_FLIGHT {
            t.in_flight.pop_front();
        }
        t.in_flight.push_back(InFlight { nonce, version: set.version.clone(), names });
        t.sent_version = Some(set.version.clone());
        tracing::debug!(node = %self.session.node, type_url, version = %set.version, sent = plan.send.len(),
            removed = plan.removed.len(), held = t.held.len(), "delta xDS push");
        self.session.sent(type_url, set.version.clone(), plan.send.len() as u64, response.encoded_len() as u64);
        self.out.send(Ok(response)).await.is_ok()
    }

    /// Handles one request; returns false when the client is gone.
    async fn request(&mut self, req: DeltaDiscoveryRequest, resources: &Arc<ResourceSet>) -> bool {
        self.session.identify(req.node.as_ref());
        let type_url = req.type_url.clone();
        if resources.get(&type_url).is_none() {
            tracing::warn!(node = %self.session.node, type_url, "delta xDS request for a type we do not serve");
            return true;
        }
        let first = !self.types.contains_key(&type_url);
        let t = self.types.entry(type_url.clone()).or_default();
        if first {
            t.held = Held::from_initial(req.initial_resource_versions);
            tracing::debug!(node = %self.session.node, type_url, held = t.held.len(), "delta xDS subscription");
        }
        let was_wildcard = t.subscription.wildcard;
        let mut forced = t.subscription.apply(first, &req.resource_names_subscribe, &req.resource_names_unsubscribe);
        if t.subscription.wildcard && !was_wildcard {
            // Every name is subscribed now: the next plan looks at all of them.
            t.synced = None;
        }
        t.recheck.extend(req.resource_names_unsubscribe.iter().cloned());
        if first {
            // A reconnecting client subscribes again to the names it holds: their versions tell
            // whether they changed, so they are not forced.
            forced.retain(|name| t.held.version(name).is_none());
        }
        t.held.forget(req.resource_names_unsubscribe.iter());
        let subscribed = !forced.is_empty();
        t.forced.extend(forced);
        if !req.response_nonce.is_empty() {
            self.answer(&type_url, req.response_nonce, req.error_detail);
        }
        if first || subscribed {
            return self.push(resources, &type_url, first).await;
        }
        true
    }

    /// Records Envoy's ACK (`error` is `None`) or NACK of the response with `nonce`.
    fn answer(&mut self, type_url: &str, nonce: String, error: Option<envoy_types::pb::google::rpc::Status>) {
        let Some(t) = self.types.get_mut(type_url) else { return };
        let Some(at) = t.in_flight.iter().position(|f| f.nonce == nonce) else {
            tracing::debug!(node = %self.session.node, type_url, nonce, "stale delta xDS nonce ignored");
            return;
        };
        let Some(flight) = t.in_flight.remove(at) else { return };
        let version = flight.version;
        if let Some(err) = error {
            tracing::warn!(node = %self.session.node, type_url, %version, code = err.code, error = %err.message,
                resources = flight.names.len(),
                "Envoy rejected a delta xDS update (NACK); it keeps its last good config");
            t.held.forget(flight.names.iter());
            t.recheck.extend(flight.names.iter().cloned());
            let nack = Nack { version, nonce, message: err.message, code: err.code };
            self.session.nacked(type_url, nack);
        } else {
            tracing::debug!(node = %self.session.node, type_url, %version, "delta xDS ACK");
            self.session.acked(type_url, version);
        }
    }

    async fn push_changes(&mut self, resources: &Arc<ResourceSet>) -> bool {
        for type_url in resources.type_urls() {
            if self.types.contains_key(type_url) && !self.push(resources, type_url, false).await {
                return false;
            }
        }
        true
    }
}

impl Protocol for DeltaStream {
    type Request = DeltaDiscoveryRequest;

    fn session(&self) -> &Session {
        &self.session
    }

    fn on_request(
        &mut self,
        req: DeltaDiscoveryRequest,
        current: &Arc<ResourceSet>,
    ) -> impl Future<Output = bool> + Send {
        self.request(req, current)
    }

    fn on_change(&mut self, current: &Arc<ResourceSet>) -> impl Future<Output = bool> + Send {
        self.push_changes(current)
    }
}
