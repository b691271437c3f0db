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

use std::future::Future;
use std::path::PathBuf;

use aether_serve_policy::GatedListener;

use crate::shutdown::FileId;

use super::listen::{ServeError, XdsAddr, XdsListener};
use super::service::XdsServer;

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
        .http2_keepalive_timeout(keepalive.map(|k| k.timeout));
    let router = builder.add_service(server.into_service());
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
