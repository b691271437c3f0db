//! [`WatchStartLayer`]: a layer of the binary's Kubernetes client that reports each watch request
//! the API server accepted to the [`WatchBoard`].
//!
//! Recovery needs positive evidence. A watcher whose `watch` call failed after a good list
//! retries only the `watch` call, and a watch that starts again yields nothing until an object
//! changes, so events alone would leave a quiet cluster "failing" forever. The layer therefore
//! reports every watch request the API server accepted (HTTP 2xx to `?watch=true`), which marks
//! that resource's watches ok at once.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};

use crate::{WatchBoard, WatchOwner, watched_resource};

/// A layer for a Kubernetes client (`kube::client::ClientBuilder::with_layer`): reports each
/// watch request the API server accepted to the [`WatchBoard`] ([`WatchBoard::watch_started`]).
/// It only reads the request's URI and the response's status; bodies pass untouched.
pub struct WatchStartLayer<O> {
    board: WatchBoard<O>,
}

impl<O> Clone for WatchStartLayer<O> {
    fn clone(&self) -> Self {
        WatchStartLayer { board: self.board.clone() }
    }
}

impl<O: WatchOwner> WatchStartLayer<O> {
    /// A layer reporting to `board`.
    pub fn new(board: WatchBoard<O>) -> Self {
        WatchStartLayer { board }
    }
}

impl<S, O> tower::Layer<S> for WatchStartLayer<O> {
    type Service = WatchStart<S, O>;

    fn layer(&self, inner: S) -> Self::Service {
        WatchStart { inner, board: self.board.clone() }
    }
}

/// The service of [`WatchStartLayer`].
pub struct WatchStart<S, O> {
    inner: S,
    board: WatchBoard<O>,
}

impl<S: Clone, O> Clone for WatchStart<S, O> {
    fn clone(&self) -> Self {
        WatchStart { inner: self.inner.clone(), board: self.board.clone() }
    }
}

impl<S, O, Req, Res> tower::Service<Request<Req>> for WatchStart<S, O>
where
    S: tower::Service<Request<Req>, Response = Response<Res>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    Res: 'static,
    O: WatchOwner,
{
    type Response = Response<Res>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Res>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Req>) -> Self::Future {
        let watched = watched_resource(req.uri());
        let response = self.inner.call(req);
        let board = self.board.clone();
        Box::pin(async move {
            let response = response.await?;
            if let Some((group, plural)) = watched
                && response.status().is_success()
            {
                board.watch_started(&group, &plural);
            }
            Ok(response)
        })
    }
}
