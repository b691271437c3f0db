//! [`watched_resource`]: which resource a Kubernetes API request watches, read from its URI
//! alone. The client layer ([`crate::WatchStartLayer`]) and [`crate::WatchBoard::observe`] use it
//! to learn that the API server accepted a watch.

use http::Uri;

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
