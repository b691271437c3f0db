//! [`GatedAcceptor`]: the gate in front of axum-server's TLS acceptor (the webhook).
//!
//! axum-server accepts every TCP connection and hands it to its acceptor in a task of its own;
//! this acceptor takes a [`Slot`](crate::Slot) first (over the cap the connection is dropped at
//! once: closed and counted as refused), then runs the TLS handshake under the policy's
//! first-byte timeout (axum-server's `RustlsAcceptor::handshake_timeout`; a handshake that does
//! not finish is counted as `handshake-timeout`), and hands the TLS stream on as a
//! [`GatedIo`] whose first-byte deadline still counts from the TCP accept, with the connection's
//! service wrapped in [`CountRequests`] (its idle timeout counts from its last request).

use std::io;
use std::pin::Pin;

use axum_server::accept::{Accept, NoDelayAcceptor};
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use futures::future::BoxFuture;
use tokio::time::Instant;

use crate::gate::Gate;
use crate::io::GatedIo;
use crate::listener::PeerSource;
use crate::policy::Eviction;
use crate::requests::CountRequests;

/// An axum-server acceptor behind a [`Gate`]; `A` is the TLS acceptor.
#[derive(Clone, Debug)]
pub struct GatedAcceptor<A> {
    inner: A,
    gate: Gate,
}

impl Gate {
    /// axum-server's rustls acceptor for `config` behind this gate, its handshake bounded by
    /// the policy's first-byte timeout, on TCP connections with `TCP_NODELAY` set (a small
    /// answer written in two TLS records must not wait for the client's delayed ACK, up to
    /// 40 ms on Linux; Go's HTTP server, e.g. the API server's, sets it too). Use with
    /// `axum_server::from_tcp(..)?.acceptor(..)`.
    pub fn tls_acceptor(&self, config: RustlsConfig) -> GatedAcceptor<RustlsAcceptor<NoDelayAcceptor>> {
        let tls = RustlsAcceptor::new(config)
            .handshake_timeout(self.policy().first_byte_timeout)
            .acceptor(NoDelayAcceptor::new());
        self.metrics().init_handshake(self.policy().listener);
        GatedAcceptor { inner: tls, gate: self.clone() }
    }
}

impl<A, I, S> Accept<I, S> for GatedAcceptor<A>
where
    I: PeerSource,
    A: Accept<I, S>,
    A::Future: Send + 'static,
    A::Stream: Send + 'static,
    A::Service: Send + 'static,
{
    type Stream = GatedIo<A::Stream>;
    type Service = CountRequests<A::Service>;
    type Future = Pin<Box<dyn Future<Output = io::Result<(Self::Stream, Self::Service)>> + Send>>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        let accepted = Instant::now();
        let Some(slot) = self.gate.admit(stream.source()) else {
            drop(stream);
            return refused(&self.gate);
        };
        let handshake = self.inner.accept(stream, service);
        let gate = self.gate.clone();
        Box::pin(async move {
            match handshake.await {
                Ok((tls, service)) => {
                    let io = GatedIo::new(tls, slot, accepted);
                    let service = io.requests().count(service);
                    Ok((io, service))
                }
                Err(e) => {
                    if e.kind() == io::ErrorKind::TimedOut {
                        gate.count_eviction(Eviction::HandshakeTimeout);
                    }
                    Err(e)
                }
            }
        })
    }
}

fn refused<T: Send + 'static>(gate: &Gate) -> BoxFuture<'static, io::Result<T>> {
    let listener = gate.policy().listener;
    let cap = gate.policy().max_connections;
    Box::pin(std::future::ready(Err(io::Error::other(format!(
        "{listener} listener at its cap of {cap} connections: connection closed"
    )))))
}
