//! The requests in flight on one connection, so that a request/response listener's idle timeout
//! counts from the last request, not from the last byte: an HTTP/2 client that sends only PINGs
//! (or WINDOW_UPDATEs, or SETTINGS) holds no stream, and is idle however often it writes.
//!
//! Each admitted connection ([`crate::GatedIo`]) carries a [`Requests`]. The connection's HTTP
//! service is wrapped in [`CountRequests`], which marks a request in flight from the call of the
//! service until its response (head) is ready. Served that way:
//! - plain HTTP (an axum router): [`crate::http::serve`];
//! - TLS (axum-server): [`crate::GatedAcceptor`] wraps the connection's service itself.
//!
//! A connection whose service was never wrapped keeps the byte rule only ([`Requests::state`] is
//! `None`), so a server that forgets the wrapper does not cut its busy connections.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use tokio::time::Instant;

use crate::policy::RequestsState;

/// One connection's requests; clones share them (the connection's I/O and its service each hold
/// one).
#[derive(Clone, Debug, Default)]
pub struct Requests {
    inner: Arc<RequestsInner>,
}

#[derive(Debug, Default)]
struct RequestsInner {
    /// Set once a [`CountRequests`] serves the connection: only then are the counts meaningful.
    counted: AtomicBool,
    state: Mutex<RequestsState>,
}

impl Requests {
    /// The counts, or `None` while no [`CountRequests`] serves this connection.
    pub fn state(&self) -> Option<RequestsState> {
        if !self.inner.counted.load(Ordering::Acquire) {
            return None;
        }
        Some(*self.inner.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// `service` counting its requests into these.
    pub fn count<S>(&self, service: S) -> CountRequests<S> {
        self.inner.counted.store(true, Ordering::Release);
        CountRequests { inner: service, requests: self.clone() }
    }

    fn start(&self) -> InFlight {
        self.inner.state.lock().unwrap_or_else(PoisonError::into_inner).in_flight += 1;
        InFlight(self.clone())
    }
}

/// One request in flight; dropping it ends the request.
#[derive(Debug)]
struct InFlight(Requests);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = self.0.inner.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.in_flight = s.in_flight.saturating_sub(1);
        s.last_end = Some(Instant::now());
    }
}

/// A connection's HTTP service that counts its requests into the connection's [`Requests`]
/// (built by [`Requests::count`]).
#[derive(Clone, Debug)]
pub struct CountRequests<S> {
    inner: S,
    requests: Requests,
}

impl<S, R> tower::Service<R> for CountRequests<S>
where
    S: tower::Service<R>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let in_flight = self.requests.start();
        let response = self.inner.call(req);
        Box::pin(async move {
            let r = response.await;
            drop(in_flight);
            r
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use std::convert::Infallible;

    use tower::Service;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_request_is_in_flight_from_the_call_until_its_response_and_then_ends_at_that_time() {
        let requests = Requests::default();
        assert_eq!(requests.state(), None, "no service counts them yet");
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        let wait = Arc::new(Mutex::new(Some(wait)));
        let mut service = requests.count(tower::service_fn(move |()| {
            let wait = wait.lock().unwrap().take();
            async move {
                if let Some(w) = wait {
                    let _ = w.await;
                }
                Ok::<_, Infallible>("done")
            }
        }));
        assert_eq!(requests.state(), Some(RequestsState { in_flight: 0, last_end: None }));
        let first = tokio::spawn(service.call(()));
        tokio::task::yield_now().await;
        assert_eq!(requests.state().unwrap().in_flight, 1);
        tokio::time::sleep(Duration::from_secs(3)).await;
        release.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), "done");
        let ended = Instant::now();
        assert_eq!(requests.state(), Some(RequestsState { in_flight: 0, last_end: Some(ended) }));
        service.call(()).await.unwrap();
        assert_eq!(requests.state().unwrap().in_flight, 0);
    }
}
