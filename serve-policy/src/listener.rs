//! [`GatedListener`]: a bound listener whose accepted connections pass its [`Gate`]: over the
//! cap they are closed at once; admitted ones come out as [`GatedIo`] with the policy's timers.
//!
//! It is an [`axum::serve::Listener`] (the admin ports: [`crate::http::serve`]), and
//! [`GatedListener::incoming`] turns it into the connection stream tonic's
//! `serve_with_incoming_shutdown` takes (the xDS server, with the `grpc` feature). The inner
//! listener is any axum `Listener` (tokio's `TcpListener` and `UnixListener` are), which also
//! retries failed accepts (`EMFILE`: axum waits 1 s and tries again).

use std::io;
use std::net::IpAddr;

use axum::serve::Listener;
use futures::Stream;
use tokio::time::Instant;

use crate::gate::Gate;
use crate::io::GatedIo;

/// A listener behind a [`Gate`].
#[derive(Debug)]
pub struct GatedListener<L> {
    inner: L,
    gate: Gate,
}

impl<L> GatedListener<L> {
    /// `inner` behind `gate`.
    pub fn new(inner: L, gate: Gate) -> Self {
        GatedListener { inner, gate }
    }

    /// The gate.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// The wrapped listener.
    pub fn get_ref(&self) -> &L {
        &self.inner
    }
}

/// The source address of a peer, for its share of a listener's cap
/// ([`crate::ConnectionPolicy::max_connections_per_source`]).
pub trait PeerSource {
    /// The peer's IP address; `None` when it has none (a Unix socket peer).
    fn source(&self) -> Option<IpAddr>;
}

impl PeerSource for std::net::SocketAddr {
    fn source(&self) -> Option<IpAddr> {
        Some(self.ip())
    }
}

impl PeerSource for tokio::net::unix::SocketAddr {
    fn source(&self) -> Option<IpAddr> {
        None
    }
}

impl PeerSource for tokio::net::TcpStream {
    fn source(&self) -> Option<IpAddr> {
        self.peer_addr().ok().map(|a| a.ip())
    }
}

impl<L: Listener> GatedListener<L>
where
    L::Addr: PeerSource,
{
    /// The next admitted connection; connections over the cap or over their source's share are
    /// closed (and counted) on the way.
    pub async fn accept_admitted(&mut self) -> (GatedIo<L::Io>, L::Addr) {
        loop {
            let (io, addr) = self.inner.accept().await;
            let accepted = Instant::now();
            match self.gate.admit(addr.source()) {
                Some(slot) => return (GatedIo::new(io, slot, accepted), addr),
                None => drop(io),
            }
        }
    }

    /// The admitted connections as a stream that never ends nor fails (for tonic's
    /// `serve_with_incoming_shutdown`; dropping the stream closes the listener).
    pub fn incoming(self) -> impl Stream<Item = io::Result<GatedIo<L::Io>>> + Send + 'static {
        futures::stream::unfold(self, |mut l| async move {
            let (io, _) = l.accept_admitted().await;
            Some((Ok(io), l))
        })
    }
}

impl<L: Listener> Listener for GatedListener<L>
where
    L::Addr: PeerSource,
{
    type Io = GatedIo<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        self.accept_admitted().await
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;
    use crate::metrics::ListenerMetrics;
    use crate::policy::{ConnectionPolicy, Eviction, ListenerKind, Quiet};

    /// Reads until end of stream or error; `Ok(bytes)` at EOF.
    async fn read_to_end(s: &mut TcpStream) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.map(|_| out)
    }

    #[tokio::test]
    async fn axum_behind_the_gate_closes_connections_over_the_cap_evicts_silent_ones_and_then_serves() {
        let metrics = ListenerMetrics::new();
        let policy = ConnectionPolicy {
            listener: ListenerKind::Admin,
            max_connections: 3,
            max_connections_per_source: None,
            first_byte_timeout: Duration::from_secs(2),
            quiet: Quiet::IdleTimeout(Duration::from_secs(5)),
        };
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let gated = GatedListener::new(tcp, Gate::new(policy, &metrics));
        let app = axum::Router::new().route("/metrics", axum::routing::get(|| async { "up" }));
        tokio::spawn(crate::http::serve(gated, app, std::future::pending()));

        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(TcpStream::connect(addr).await.unwrap());
        }
        // Wait until the three are admitted, so the next ones are over the cap.
        while metrics.open(ListenerKind::Admin) < 3 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for _ in 0..3 {
            let mut over = TcpStream::connect(addr).await.unwrap();
            let closed = tokio::time::timeout(Duration::from_secs(5), read_to_end(&mut over)).await;
            assert!(matches!(closed, Ok(Ok(ref b)) if b.is_empty()) || matches!(closed, Ok(Err(_))), "{closed:?}");
        }
        assert_eq!(metrics.refusals(ListenerKind::Admin), 3);
        for mut s in held {
            let closed = tokio::time::timeout(Duration::from_secs(5), read_to_end(&mut s)).await;
            assert!(closed.is_ok(), "evicted by the first-byte timeout");
        }
        assert_eq!(metrics.evictions(ListenerKind::Admin, Eviction::FirstByteTimeout), 3);
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let body = String::from_utf8(read_to_end(&mut s).await.unwrap()).unwrap();
        assert!(body.starts_with("HTTP/1.1 200") && body.ends_with("up"), "{body}");
        while metrics.open(ListenerKind::Admin) != 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
