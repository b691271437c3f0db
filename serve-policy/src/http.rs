//! Serving a plain-HTTP router (the admin, debug and probe ports) over a [`GatedListener`] with
//! HTTP limits that bound what one connection can make the process hold (docs/listeners.md,
//! "Memory").
//!
//! `axum::serve` takes hyper's defaults, made for throughput, not for a port any pod can reach:
//! an HTTP/2 connection may open 200 streams at once, with 1 MiB flow-control windows, and hyper
//! keeps each stream's whole response (a `/metrics` text) until the client reads it; an HTTP/1
//! connection may buffer ~400 KiB of request head. With 32 connections that is thousands of
//! responses held at once. [`serve`] serves the same router with
//! - HTTP/2: [`HTTP2_MAX_STREAMS`] streams per connection, [`HTTP2_WINDOW_BYTES`] windows (what
//!   a client may send before it is read), [`HTTP2_MAX_SEND_BUF_BYTES`] buffered per stream, and
//!   [`MAX_HEADER_BYTES`] of request headers;
//! - HTTP/1: a request head refused (431) once [`HTTP1_MAX_BUF_BYTES`] of it are buffered
//!   incomplete (less than twice that buffered per connection);
//! - each connection's requests counted ([`crate::CountRequests`]) for its idle timeout;
//! - a graceful shutdown: when `shutdown` resolves it stops accepting, asks every connection to
//!   finish (HTTP/1: after its response; HTTP/2: GOAWAY) and returns when they have closed.

use std::future::Future;
use std::pin::pin;

use axum::serve::Listener;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tower::ServiceExt;

use crate::listener::{GatedListener, PeerSource};

/// HTTP/2: most streams one connection has open at once (a scraper or probe uses one). One more
/// is refused with `REFUSED_STREAM` (RFC 9113, section 5.1.2).
pub const HTTP2_MAX_STREAMS: u32 = 4;
/// HTTP/2: the connection's and each stream's initial flow-control window (bytes): the most
/// request data a client may send that the server has not read yet. The admin routes are `GET`s.
pub const HTTP2_WINDOW_BYTES: u32 = 64 * 1024;
/// HTTP/2: the most response bytes queued per stream for a client that does not read (bytes).
pub const HTTP2_MAX_SEND_BUF_BYTES: usize = 64 * 1024;
/// HTTP/2 `SETTINGS_MAX_HEADER_LIST_SIZE` (bytes): a larger request header block is refused.
pub const MAX_HEADER_BYTES: u32 = 16 * 1024;
/// HTTP/1: hyper's `max_buf_size` (bytes): once this much of a request head is buffered and it is
/// still incomplete, the request is answered 431 and the connection closed. hyper checks it
/// between reads of up to the same size, so a connection buffers less than twice this.
pub const HTTP1_MAX_BUF_BYTES: usize = 16 * 1024;

/// The hyper connection builder with the limits above (HTTP/1 and HTTP/2, detected per
/// connection).
fn builder() -> Builder<TokioExecutor> {
    let mut b = Builder::new(TokioExecutor::new());
    b.http1().max_buf_size(HTTP1_MAX_BUF_BYTES);
    b.http2()
        .max_concurrent_streams(HTTP2_MAX_STREAMS)
        .initial_stream_window_size(HTTP2_WINDOW_BYTES)
        .initial_connection_window_size(HTTP2_WINDOW_BYTES)
        .max_send_buf_size(HTTP2_MAX_SEND_BUF_BYTES)
        .max_header_list_size(MAX_HEADER_BYTES);
    b
}

/// Serves `router` on `listener` until `shutdown` resolves, then drains (the module's list).
/// Connections over the listener's cap or source share never reach HTTP ([`GatedListener`]).
pub async fn serve<L>(mut listener: GatedListener<L>, router: axum::Router, shutdown: impl Future<Output = ()>)
where
    L: Listener,
    L::Addr: PeerSource,
{
    let builder = builder();
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = pin!(shutdown);
    loop {
        let (io, _) = tokio::select! {
            accepted = listener.accept_admitted() => accepted,
            () = &mut shutdown => break,
        };
        let service = io
            .requests()
            .count(router.clone())
            .map_request(|req: hyper::Request<Incoming>| req.map(axum::body::Body::new));
        let connection = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(service)).into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::trace!(error = %e, "HTTP connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::routing::get;
    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;

    use super::*;
    use crate::{Gate, ListenerKind, ListenerMetrics};

    /// A server on 127.0.0.1 whose `/big` answers 1 MiB, and its address.
    async fn server() -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let metrics = ListenerMetrics::default();
        let gate = Gate::new(ListenerKind::Admin.default_policy(), &metrics);
        let app = axum::Router::new()
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/big", get(|| async { "x".repeat(1 << 20) }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(GatedListener::new(tcp, gate), app, async move {
            let _ = stopped.await;
        }));
        (addr, stop)
    }

    #[tokio::test]
    async fn http2_streams_past_the_limit_are_refused_while_the_first_ones_are_held() {
        let (addr, _stop) = server().await;
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (h2, connection) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(connection);
        let mut h2 = h2.ready().await.unwrap();
        // Open streams whose 1 MiB answers are never read: the server holds each one's response
        // until its window opens, so each stays open.
        let mut held = Vec::new();
        let mut refused = 0;
        for _ in 0..(HTTP2_MAX_STREAMS + 4) {
            let request = hyper::Request::get(format!("http://{addr}/big")).body(()).unwrap();
            let (response, _) = h2.send_request(request, true).unwrap();
            held.push(response);
            h2 = h2.ready().await.unwrap();
        }
        for response in held {
            match tokio::time::timeout(Duration::from_secs(5), response).await.expect("an answer or a refusal") {
                Ok(r) => assert_eq!(r.status(), 200),
                Err(e) => {
                    assert_eq!(e.reason(), Some(h2::Reason::REFUSED_STREAM), "{e}");
                    refused += 1;
                }
            }
        }
        assert_eq!(refused, 4, "the streams past {HTTP2_MAX_STREAMS} are refused");
    }

    #[tokio::test]
    async fn http1_requests_are_served_and_a_head_over_the_buffer_is_refused() {
        let (addr, stop) = server().await;
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.unwrap();
        tokio::spawn(connection);
        let get = |path: &str, header: usize| {
            hyper::Request::get(path)
                .header("host", "x")
                .header("x-pad", "a".repeat(header))
                .body(Empty::<Bytes>::new())
                .unwrap()
        };
        let ok = sender.send_request(get("/healthz", 1)).await.unwrap();
        assert_eq!(ok.status(), 200);
        assert_eq!(ok.into_body().collect().await.unwrap().to_bytes(), "ok\n");
        // hyper checks the limit between reads, so a head is refused once the buffered part
        // reaches it: one four times over it certainly is.
        let big = sender.send_request(get("/healthz", 4 * HTTP1_MAX_BUF_BYTES)).await;
        let big = big.map(|r| r.status());
        assert!(
            matches!(big, Ok(s) if s == 431) || big.is_err(),
            "a head over {HTTP1_MAX_BUF_BYTES} bytes is refused: {big:?}"
        );
        // Shutdown: the listener stops accepting.
        stop.send(()).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "still accepting after shutdown");
    }
}
