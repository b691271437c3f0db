//! An ADS client standing in for a node's Envoy (section `fleet`): one incremental
//! `DeltaAggregatedResources` stream (the chart's `DELTA_GRPC`) over the agent's Unix socket,
//! subscribed to every cluster (CDS wildcard), that ACKs each response with its nonce at once and
//! logs when each response arrived.
//!
//! The client is the generated `AggregatedDiscoveryServiceClient` of the `envoy-types` crate on a
//! tonic channel whose connector dials the socket.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tonic::transport::{Endpoint, Uri};

/// The CDS type URL.
pub(crate) const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// One CDS response as the client saw it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Response {
    /// When it arrived and its ACK was queued on the stream.
    pub at: Instant,
    /// Resources it carried (added or changed).
    pub resources: usize,
    /// Names it removed.
    pub removed: usize,
}

/// What one client has received so far.
#[derive(Debug, Default)]
pub(crate) struct Received {
    /// Every CDS response, in order.
    pub responses: Vec<Response>,
    /// The cluster names the client holds (added by responses, dropped by `removed_resources`).
    pub clusters: BTreeSet<String>,
    /// Why the stream ended, once it has.
    pub ended: Option<String>,
}

/// A running client; its stream task is aborted when dropped.
pub(crate) struct AdsClient {
    received: Arc<Mutex<Received>>,
    task: tokio::task::JoinHandle<()>,
}

impl AdsClient {
    /// Opens the stream to the agent's xDS socket `socket` as node `node` on `rt` and subscribes
    /// to every cluster. Returns at once; connection errors show in [`Received::ended`].
    pub(crate) fn start(rt: &tokio::runtime::Handle, socket: &Path, node: &str) -> AdsClient {
        let received = Arc::new(Mutex::new(Received::default()));
        let task = rt.spawn(run(socket.to_owned(), node.to_owned(), received.clone()));
        AdsClient { received, task }
    }

    /// Reads what the client has received under its lock.
    pub(crate) fn with<T>(&self, f: impl FnOnce(&Received) -> T) -> T {
        f(&self.received.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Drop for AdsClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run(socket: PathBuf, node: String, received: Arc<Mutex<Received>>) {
    let result = stream(&socket, &node, &received).await;
    let why = match result {
        Ok(()) => "the agent closed the stream".to_owned(),
        Err(e) => format!("{e:#}"),
    };
    received.lock().unwrap_or_else(PoisonError::into_inner).ended = Some(why);
}

async fn stream(socket: &Path, node: &str, received: &Mutex<Received>) -> anyhow::Result<()> {
    let socket = socket.to_owned();
    // The URI is required by the API and unused: the connector dials the socket.
    let channel = Endpoint::from_static("http://xds.invalid")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
        }))
        .await?;
    let mut client = AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(64 << 20);
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(DeltaDiscoveryRequest {
        node: Some(Node { id: node.to_owned(), cluster: "aether-bench-fleet".to_owned(), ..Default::default() }),
        type_url: CLUSTER.to_owned(),
        ..Default::default()
    })?;
    let mut responses =
        client.delta_aggregated_resources(tokio_stream::wrappers::UnboundedReceiverStream::new(rx)).await?.into_inner();
    while let Some(response) = responses.message().await? {
        tx.send(DeltaDiscoveryRequest {
            type_url: response.type_url.clone(),
            response_nonce: response.nonce.clone(),
            ..Default::default()
        })?;
        let at = Instant::now();
        if response.type_url != CLUSTER {
            continue;
        }
        let mut r = received.lock().unwrap_or_else(PoisonError::into_inner);
        for name in &response.removed_resources {
            r.clusters.remove(name);
        }
        r.clusters.extend(response.resources.iter().map(|res| res.name.clone()));
        r.responses.push(Response {
            at,
            resources: response.resources.len(),
            removed: response.removed_resources.len(),
        });
    }
    Ok(())
}
