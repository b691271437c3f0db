//! [`GatedIo`]: an admitted connection that obeys its listener's timeouts.
//!
//! The timeouts live at the byte level, below HTTP, so that they hold in every state hyper can
//! be in, including the ones it does not time itself: protocol detection (hyper-util's `auto`
//! builder reads the first bytes with no timeout), an HTTP/2 connection with no stream, a
//! keep-alive connection between requests. When the deadline of [`Liveness::deadline`] passes
//! with nothing moving, the next read or write fails with [`std::io::ErrorKind::TimedOut`];
//! hyper then drops the connection, which closes the socket and frees its [`Slot`].

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::gate::Slot;
use crate::policy::{Eviction, Liveness};
use crate::requests::Requests;

/// An admitted connection: the stream `S`, its [`Slot`] under the cap, and its timers.
///
/// Reads and writes pass through unchanged. A byte read counts as the client speaking; a byte
/// either way is activity for the idle timeout, and so is a request in flight when the
/// connection's service counts them ([`GatedIo::requests`]). Built by [`GatedIo::new`] from a slot
/// [`crate::Gate::admit`] gave (or by a [`crate::GatedListener`] / `GatedAcceptor`).
#[derive(Debug)]
pub struct GatedIo<S> {
    // Declared (so dropped) before `io`: the cap's place is free by the time the socket is
    // closed, so a client that sees the server's descriptor gone can count on the place.
    slot: Slot,
    io: S,
    live: Liveness,
    requests: Requests,
    timer: Pin<Box<Sleep>>,
    evicted: Option<Eviction>,
}

impl<S> GatedIo<S> {
    /// Wraps a connection accepted at `accepted` and admitted under `slot`, so that it obeys the
    /// timeouts of the policy of the slot's gate.
    pub fn new(io: S, slot: Slot, accepted: Instant) -> Self {
        let live = Liveness::new(accepted);
        let first = live.deadline(slot.gate().policy(), None).map_or(accepted, |(at, _)| at);
        let requests = Requests::default();
        GatedIo { slot, io, live, requests, timer: Box::pin(tokio::time::sleep_until(first)), evicted: None }
    }

    /// This connection's requests: wrap its HTTP service with [`Requests::count`] so that its
    /// idle timeout counts from the last request ([`crate::http::serve`] and
    /// [`crate::GatedAcceptor`] do).
    pub fn requests(&self) -> &Requests {
        &self.requests
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.io
    }

    /// Why this connection was evicted, if it was.
    pub fn evicted(&self) -> Option<Eviction> {
        self.evicted
    }

    /// `Pending` until the policy's deadline passes with nothing moving; then counts the
    /// eviction (once) and gives the error every later call returns too.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            let Some((at, why)) = self.live.deadline(self.slot.gate().policy(), self.requests.state()) else {
                return Poll::Pending;
            };
            if Instant::now() >= at {
                self.evicted = Some(why);
                self.slot.gate().count_eviction(why);
                return Poll::Ready(eviction_error(self, why));
            }
            // The timer only moves earlier here; activity pushing the deadline later is noticed
            // when it fires (below), so a busy connection does not re-arm it on every byte.
            if self.timer.deadline() > at {
                self.timer.as_mut().reset(at);
            }
            match self.timer.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(()) => self.timer.as_mut().reset(at),
            }
        }
    }

    fn failed(&self) -> Option<io::Error> {
        self.evicted.map(|why| eviction_error(self, why))
    }
}

fn eviction_error<S>(io: &GatedIo<S>, why: Eviction) -> io::Error {
    let listener = io.slot.gate().policy().listener;
    io::Error::new(io::ErrorKind::TimedOut, format!("{listener} listener closed the connection: {}", why.label()))
}

impl<S: AsyncRead + Unpin> AsyncRead for GatedIo<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(e) = this.failed() {
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                this.live.read(Instant::now(), buf.filled().len() - before);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.poll_deadline(cx).map(Err),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for GatedIo<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Some(e) = this.failed() {
            return Poll::Ready(Err(e));
        }
        match Pin::new(&mut this.io).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                this.live.wrote(Instant::now(), n);
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            // A client that stops reading our response is as quiet as one that stops writing.
            Poll::Pending => this.poll_deadline(cx).map(Err),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Some(e) = this.failed() {
            return Poll::Ready(Err(e));
        }
        match Pin::new(&mut this.io).poll_write_vectored(cx, bufs) {
            Poll::Ready(Ok(n)) => {
                this.live.wrote(Instant::now(), n);
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.poll_deadline(cx).map(Err),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(e) = this.failed() {
            return Poll::Ready(Err(e));
        }
        match Pin::new(&mut this.io).poll_flush(cx) {
            Poll::Pending => this.poll_deadline(cx).map(Err),
            done => done,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.evicted.is_some() {
            // Already failing: the caller drops the connection; nothing more to send.
            return Poll::Ready(Ok(()));
        }
        let r = ready!(Pin::new(&mut this.io).poll_shutdown(cx));
        Poll::Ready(r)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::gate::Gate;
    use crate::metrics::ListenerMetrics;
    use crate::policy::{ConnectionPolicy, KeepAlive, ListenerKind, Quiet};

    const SECOND: Duration = Duration::from_secs(1);

    fn gate(quiet: Quiet) -> (Gate, ListenerMetrics) {
        let metrics = ListenerMetrics::new();
        let policy = ConnectionPolicy {
            listener: ListenerKind::Admin,
            max_connections: 4,
            max_connections_per_source: None,
            first_byte_timeout: 2 * SECOND,
            quiet,
        };
        (Gate::new(policy, &metrics), metrics)
    }

    fn connect(gate: &Gate) -> (GatedIo<tokio::io::DuplexStream>, tokio::io::DuplexStream) {
        let (server, client) = tokio::io::duplex(1024);
        let slot = gate.admit(None).expect("under the cap");
        (GatedIo::new(server, slot, Instant::now()), client)
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_never_speaks_is_evicted_at_the_first_byte_timeout_and_frees_its_slot() {
        let (gate, metrics) = gate(Quiet::IdleTimeout(10 * SECOND));
        let (mut server, _client) = connect(&gate);
        let start = Instant::now();
        let mut buf = [0u8; 8];
        let err = server.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(start.elapsed(), 2 * SECOND);
        assert_eq!(server.evicted(), Some(Eviction::FirstByteTimeout));
        assert_eq!(metrics.evictions(ListenerKind::Admin, Eviction::FirstByteTimeout), 1);
        assert_eq!(server.write(b"x").await.unwrap_err().kind(), io::ErrorKind::TimedOut, "stays failed");
        assert_eq!(metrics.evictions(ListenerKind::Admin, Eviction::FirstByteTimeout), 1, "counted once");
        assert_eq!(metrics.open(ListenerKind::Admin), 1);
        drop(server);
        assert_eq!(metrics.open(ListenerKind::Admin), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn writing_to_a_silent_client_does_not_save_it() {
        let (gate, metrics) = gate(Quiet::IdleTimeout(10 * SECOND));
        let (mut server, _client) = connect(&gate);
        tokio::time::sleep(SECOND).await;
        server.write_all(b"banner").await.unwrap();
        let start = Instant::now();
        let err = server.read(&mut [0u8; 8]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(start.elapsed(), SECOND, "2 s after accept, not after the write");
        assert_eq!(metrics.evictions(ListenerKind::Admin, Eviction::FirstByteTimeout), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_port_connection_is_evicted_after_the_idle_timeout_counted_from_the_last_byte() {
        let (gate, metrics) = gate(Quiet::IdleTimeout(10 * SECOND));
        let (mut server, mut client) = connect(&gate);
        let mut buf = [0u8; 8];
        client.write_all(b"GET").await.unwrap();
        assert_eq!(server.read(&mut buf).await.unwrap(), 3);
        // Activity every 6 s keeps it open well past one idle timeout.
        for _ in 0..3 {
            tokio::time::sleep(6 * SECOND).await;
            server.write_all(b"ok").await.unwrap();
        }
        let start = Instant::now();
        let err = server.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(start.elapsed(), 10 * SECOND);
        assert_eq!(metrics.evictions(ListenerKind::Admin, Eviction::IdleTimeout), 1);
        assert_eq!(metrics.evictions(ListenerKind::Admin, Eviction::FirstByteTimeout), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_our_response_is_idle_too() {
        let (gate, metrics) = gate(Quiet::IdleTimeout(10 * SECOND));
        let (mut server, mut client) = connect(&gate);
        client.write_all(b"GET").await.unwrap();
        server.read_exact(&mut [0u8; 3]).await.unwrap();
        let big = vec![0u8; 64 * 1024]; // more than the 1 KiB pipe holds
        let start = Instant::now();
        let err = server.write_all(&big).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(start.elapsed(), 10 * SECOND);
        assert_eq!(metrics.evictions(ListenerKind::Admin, Eviction::IdleTimeout), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_streaming_connection_may_stay_quiet_forever_once_it_has_spoken() {
        let keepalive = KeepAlive { interval: 30 * SECOND, timeout: 10 * SECOND };
        let (gate, metrics) = gate(Quiet::KeepAlive(keepalive));
        let (mut server, mut client) = connect(&gate);
        client.write_all(b"PRI * HTTP/2.0").await.unwrap();
        let mut buf = [0u8; 32];
        server.read_exact(&mut buf[..14]).await.unwrap();
        let quiet = tokio::time::timeout(3600 * SECOND, server.read(&mut buf)).await;
        assert!(quiet.is_err(), "still open after an hour of silence: {quiet:?}");
        client.write_all(b"x").await.unwrap();
        assert_eq!(server.read(&mut buf).await.unwrap(), 1);
        assert_eq!(metrics.evictions(ListenerKind::Admin, Eviction::IdleTimeout), 0);
        assert_eq!(metrics.evictions(ListenerKind::Admin, Eviction::FirstByteTimeout), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_closing_first_is_not_an_eviction() {
        let (gate, metrics) = gate(Quiet::IdleTimeout(10 * SECOND));
        let (mut server, client) = connect(&gate);
        drop(client);
        assert_eq!(server.read(&mut [0u8; 8]).await.unwrap(), 0, "end of stream");
        drop(server);
        for why in Eviction::ALL {
            assert_eq!(metrics.evictions(ListenerKind::Admin, why), 0);
        }
        assert_eq!(metrics.open(ListenerKind::Admin), 0);
    }
}
