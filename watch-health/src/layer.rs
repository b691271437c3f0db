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

use http::{Request, Response, Uri};

use crate::{WatchBoard, WatchOwner};

/// `(group, plural)` of a watch request: a path `/api/v1/[namespaces/<ns>/]<plural>` (group
/// `""`) or `/apis/<group>/<version>/[namespaces/<ns>/]<plural>` with `watch=true` (or `1`) in
/// its query. `None` for anything else (lists, gets, a watch of one named object's
/// subresource).
pub fn watched_resource(uri: &Uri) -> Option<(String, String)> {
    let watching = uri.query()?.split('&').any(|kv| kv == "watch=true" || kv == "watch=1");
    if !watching {
        return None;
    }
    let segments: Vec<&str> = uri.path().trim_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let plural = match rest {
        [plural] | ["namespaces", _, plural] => *plural,
        _ => return None,
    };
    Some((group.to_owned(), plural.to_owned()))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    #[test]
    fn watch_requests_name_their_resource_and_lists_do_not() {
        let cases = [
            ("/api/v1/pods?&fieldSelector=spec.nodeName%3Dn1&watch=true&timeoutSeconds=290", Some(("", "pods"))),
            ("/api/v1/namespaces/shop/pods?watch=1", Some(("", "pods"))),
            (
                "/apis/config.aether.io/v1/endpointpolicies?&watch=true&resourceVersion=12",
                Some(("config.aether.io", "endpointpolicies")),
            ),
            (
                "/apis/config.aether.io/v1/namespaces/shop/endpointpolicies?watch=true",
                Some(("config.aether.io", "endpointpolicies")),
            ),
            ("/api/v1/pods?&fieldSelector=spec.nodeName%3Dn1", None),
            ("/api/v1/pods?watch=false", None),
            ("/api/v1/pods", None),
            ("/apis/config.aether.io/v1", None),
            ("/api/v1/namespaces/shop/pods/web/log?watch=true", None),
            ("/version?watch=true", None),
        ];
        for (u, want) in cases {
            let got = watched_resource(&uri(u));
            assert_eq!(got.as_ref().map(|(g, p)| (g.as_str(), p.as_str())), want, "{u}");
        }
    }
}
