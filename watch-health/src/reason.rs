//! [`WatchErrorReason`]: why one attempt of a watch failed.

/// Why one attempt of a watch failed: the `reason` label of `<prefix>_watch_errors_total`,
/// derived from the API server's answer (its HTTP status) or from the lack of one. A closed set,
/// so the metric's series stay bounded; every value is kebab-case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WatchErrorReason {
    /// HTTP 401, or the client could not produce credentials: the token is expired, revoked or
    /// unreadable.
    Unauthorized,
    /// HTTP 403: RBAC does not grant the verb (`list` or `watch`) on the resource.
    Forbidden,
    /// HTTP 404: the API server does not serve the resource (a CRD removed, an API disabled).
    NotFound,
    /// HTTP 410 Gone: the watch's resourceVersion is too old and kube-runtime re-lists at once.
    /// Counted, but it never makes a watch failing: it is part of normal operation.
    Expired,
    /// HTTP 429 or 5xx: the API server, or etcd behind it, is overloaded or unavailable.
    ServerError,
    /// No HTTP answer: connection refused or reset, TLS failure, time-out, a broken stream.
    Connect,
    /// An answer that could not be read as the expected objects.
    Decode,
    /// Anything else, e.g. another 4xx such as 400 for a selector the server refuses.
    Other,
}

impl WatchErrorReason {
    /// Every reason, in label order of the docs.
    pub const ALL: [WatchErrorReason; 8] = [
        WatchErrorReason::Unauthorized,
        WatchErrorReason::Forbidden,
        WatchErrorReason::NotFound,
        WatchErrorReason::Expired,
        WatchErrorReason::ServerError,
        WatchErrorReason::Connect,
        WatchErrorReason::Decode,
        WatchErrorReason::Other,
    ];

    /// The metric label, e.g. `not-found`.
    pub fn label(self) -> &'static str {
        match self {
            WatchErrorReason::Unauthorized => "unauthorized",
            WatchErrorReason::Forbidden => "forbidden",
            WatchErrorReason::NotFound => "not-found",
            WatchErrorReason::Expired => "expired",
            WatchErrorReason::ServerError => "server-error",
            WatchErrorReason::Connect => "connect",
            WatchErrorReason::Decode => "decode",
            WatchErrorReason::Other => "other",
        }
    }

    /// The reason of an HTTP status the API server answered with (a Kubernetes `Status` code).
    /// Source: the Kubernetes API conventions' status codes.
    pub fn of_http(code: u16) -> WatchErrorReason {
        match code {
            401 => WatchErrorReason::Unauthorized,
            403 => WatchErrorReason::Forbidden,
            404 => WatchErrorReason::NotFound,
            410 => WatchErrorReason::Expired,
            429 | 500..=599 => WatchErrorReason::ServerError,
            _ => WatchErrorReason::Other,
        }
    }

    /// Whether an error of this reason makes the watch failing (all but [`Self::Expired`]).
    pub fn is_failure(self) -> bool {
        self != WatchErrorReason::Expired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_codes_map_to_the_documented_reasons() {
        let cases = [
            (401, "unauthorized"),
            (403, "forbidden"),
            (404, "not-found"),
            (410, "expired"),
            (429, "server-error"),
            (500, "server-error"),
            (503, "server-error"),
            (599, "server-error"),
            (400, "other"),
            (422, "other"),
        ];
        for (code, label) in cases {
            assert_eq!(WatchErrorReason::of_http(code).label(), label, "HTTP {code}");
        }
    }

    #[test]
    fn reason_labels_are_distinct_kebab_case_and_only_expired_is_not_a_failure() {
        let labels: std::collections::BTreeSet<_> = WatchErrorReason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), WatchErrorReason::ALL.len());
        for l in labels {
            assert!(l.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') && !l.starts_with('-'), "{l}");
        }
        let not_failures: Vec<_> = WatchErrorReason::ALL.iter().filter(|r| !r.is_failure()).collect();
        assert_eq!(not_failures, [&WatchErrorReason::Expired]);
    }
}
