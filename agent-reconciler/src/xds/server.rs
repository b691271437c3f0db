//! Serving the ADS service ([`XdsServer`], [`super::service`]) on a listener: [`serve`] and
//! [`serve_listener`], with their graceful shutdown.
//!
//! Shutdown ([`serve_listener`]): stop accepting, remove the own socket file (if still ours),
//! wait up to [`XdsServer::with_shutdown_wait`] for the clients to close their streams, end the
//! rest; the returned [`Drained`] says whether the clients had gone.
//!
//! Connections ([`XdsServer::with_connection_gate`], docs/listeners.md): at most the policy's
//! `max_connections` at once (more are closed at once and counted), the first byte within the
//! first-byte timeout of accept, then no idle timeout (the ADS stream is quiet between pushes):
//! HTTP/2 PINGs every keepalive interval find a dead peer instead.
//!
//! Memory (docs/listeners.md, "Memory"): a connection has at most [`XDS_MAX_STREAMS`] streams,
//! [`XDS_WINDOW_BYTES`] of request data the server has not read, and a request message being
//! decoded of at most [`XDS_MAX_REQUEST_BYTES`] per stream; the gate's `max_connections` bounds
//! the connections.

use std::future::Future;
use std::path::PathBuf;

use aether_serve_policy::GatedListener;

use crate::shutdown::FileId;

use super::listen::{ServeError, XdsAddr, XdsListener};
use super::service::XdsServer;

/// HTTP/2: most streams one ADS connection has open at once; one more is refused with
/// `REFUSED_STREAM` (RFC 9113, section 5.1.2). Envoy opens one ADS stream per connection (delta or
/// state of the world); the second is room for a stream being replaced.
pub const XDS_MAX_STREAMS: u32 = 2;
/// HTTP/2: the connection's and each stream's initial flow-control window (bytes): the most
/// request data Envoy may send that the server has not read yet. Envoy's requests are ACKs,
/// NACKs and subscriptions; a larger one takes more window updates, not more memory.
pub const XDS_WINDOW_BYTES: u32 = 256 * 1024;
/// The largest `DiscoveryRequest` or `DeltaDiscoveryRequest` decoded (bytes): 4 MiB, tonic's
/// default, stated. A larger one ends its stream with `RESOURCE_EXHAUSTED`. Envoy's largest are a
/// reconnect's `initial_resource_versions` (a name and a version per resource, ~200 KB at 2,000
/// clusters) and a NACK's `error_detail`.
pub const XDS_MAX_REQUEST_BYTES: usize = 4 << 20;
/// HTTP/2 `SETTINGS_MAX_HEADER_LIST_SIZE` (bytes): a larger request header block is refused.
/// Envoy's gRPC headers are a few hundred bytes.
pub const XDS_MAX_HEADER_BYTES: u32 = 16 * 1024;

/// How [`serve_listener`] shut down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drained {
    /// ADS streams still open when the shutdown wait ended, which the server then ended itself.
    /// 0: every client had closed its streams (or none was connected).
    pub left_open: usize,
}

impl Drained {
    /// Whether every client closed its streams within the wait: the proxies went away too.
    pub fn clients_gone(&self) -> bool {
        self.left_open == 0
    }
}

/// Binds `addr` and serves `server` until `shutdown` completes; see [`serve_listener`].
///
/// # Errors
/// [`ServeError::Bind`] or [`ServeError::Transport`].
pub async fn serve(
    addr: &XdsAddr,
    server: XdsServer,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<Drained, ServeError> {
    serve_listener(XdsListener::bind(addr).await?, server, shutdown).await
}

/// Serves ADS on an already-bound listener until `shutdown` completes, then:
///
/// 1. stops accepting connections and removes its Unix socket file, if the path still holds the
///    socket it bound (see [`crate::shutdown::remove_own_socket`]);
/// 2. waits up to the server's shutdown wait ([`XdsServer::with_shutdown_wait`]; default zero)
///    for the clients to close every open ADS stream;
/// 3. ends the streams still open (Envoy sees the RPC finish and keeps its config) and returns
///    once connections have drained, saying how many it had to end.
///
/// # Errors
/// [`ServeError::Transport`].
pub async fn serve_listener(
    listener: XdsListener,
    server: XdsServer,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<Drained, ServeError> {
    let own_socket = listener.own_socket();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let drain = drain_after(shutdown, server.clone(), stop_tx, own_socket.clone());
    let serving = serve_until(listener, server, async {
        let _ = stop_rx.await;
    });
    tokio::pin!(serving, drain);
    tokio::select! {
        drained = &mut drain => {
            serving.await?;
            Ok(drained)
        }
        // The server ended before shutdown was asked for (a transport error).
        result = &mut serving => {
            if let Some((path, id)) = &own_socket {
                crate::shutdown::remove_own_socket(path, *id);
            }
            result?;
            Ok(Drained { left_open: 0 })
        }
    }
}

/// The gRPC server on `listener` until `stop` completes (it stops accepting at once, then waits
/// for open connections to finish).
async fn serve_until(
    listener: XdsListener,
    server: XdsServer,
    stop: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let gate = server.gate.clone();
    let keepalive = gate.policy().keepalive();
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(keepalive.map(|k| k.interval))
        .http2_keepalive_timeout(keepalive.map(|k| k.timeout))
        .max_concurrent_streams(XDS_MAX_STREAMS)
        .initial_stream_window_size(XDS_WINDOW_BYTES)
        .initial_connection_window_size(XDS_WINDOW_BYTES)
        .http2_max_header_list_size(XDS_MAX_HEADER_BYTES);
    let router = builder.add_service(server.into_service().max_decoding_message_size(XDS_MAX_REQUEST_BYTES));
    match listener {
        XdsListener::Tcp(l) => router.serve_with_incoming_shutdown(GatedListener::new(l, gate).incoming(), stop).await,
        XdsListener::Unix(l, ..) => {
            router.serve_with_incoming_shutdown(GatedListener::new(l, gate).incoming(), stop).await
        }
    }
}

/// After `shutdown`: stops the accept loop (`stop`), removes the own socket, waits for the
/// clients, ends what is left.
async fn drain_after(
    shutdown: impl Future<Output = ()>,
    server: XdsServer,
    stop: tokio::sync::oneshot::Sender<()>,
    own_socket: Option<(PathBuf, FileId)>,
) -> Drained {
    shutdown.await;
    let _ = stop.send(());
    if let Some((path, id)) = &own_socket {
        crate::shutdown::remove_own_socket(path, *id);
    }
    let tracker = server.tracker();
    let open = tracker.connected_total();
    if open > 0 && !server.shutdown_wait.is_zero() {
        tracing::info!(streams = open, wait = ?server.shutdown_wait, "waiting for Envoy to close its ADS streams");
        tracker.wait_for(server.shutdown_wait, |t| t.connected_total() == 0).await;
    }
    let left_open = tracker.connected_total();
    if left_open > 0 {
        tracing::info!(streams = left_open, "ending the ADS streams still open (Envoy keeps its config)");
    }
    server.close_streams();
    Drained { left_open }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::xds::ResourceSet;

    /// A raw HTTP/2 client on the ADS socket: of [`XDS_MAX_STREAMS`] + 2 open streams (as Envoy's,
    /// never ended), the first ones are live ADS streams (the server answers their headers) and
    /// the rest are refused (`REFUSED_STREAM`), or held back by the client once the server's
    /// SETTINGS announced the limit, which the client then reports.
    #[tokio::test]
    async fn ads_streams_past_the_limit_are_refused_while_the_first_ones_stay_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("xds.sock");
        let listener = XdsListener::bind(&XdsAddr::Unix(path.clone())).await.unwrap();
        let (_keep, resources) = tokio::sync::watch::channel(Arc::new(ResourceSet::default()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(serve_listener(listener, XdsServer::new(resources), async move {
            let _ = stopped.await;
        }));

        let unix = tokio::net::UnixStream::connect(&path).await.unwrap();
        let (h2, connection) = h2::client::handshake(unix).await.unwrap();
        tokio::spawn(connection);
        let mut opened = Vec::new();
        for _ in 0..(XDS_MAX_STREAMS + 2) {
            let Ok(ready) = tokio::time::timeout(Duration::from_secs(1), h2.clone().ready()).await else {
                break; // held back by the client: the server announced its limit
            };
            let request = http::Request::post(
                "http://xds/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources",
            )
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
            let (response, body) = ready.unwrap().send_request(request, false).unwrap();
            opened.push((response, body));
        }
        let (mut answered, mut refused) = (0, 0);
        for (response, _body) in opened {
            match tokio::time::timeout(Duration::from_secs(5), response).await.expect("headers or a refusal") {
                Ok(r) => {
                    assert_eq!(r.status(), 200);
                    answered += 1;
                }
                Err(e) => {
                    assert_eq!(e.reason(), Some(h2::Reason::REFUSED_STREAM), "{e}");
                    refused += 1;
                }
            }
        }
        assert_eq!(answered, XDS_MAX_STREAMS, "live ADS streams ({refused} refused)");
        assert_eq!(h2.current_max_send_streams(), XDS_MAX_STREAMS as usize, "the limit the server announced");
        let _ = stop.send(());
        served.await.unwrap().unwrap();
    }
}
