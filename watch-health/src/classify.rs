//! The reason and the cause of a watch's error: [`classify`] (kube-runtime's watcher) and
//! [`classify_client`] (any request of kube's client).

use kube::runtime::watcher;

use crate::WatchErrorReason;

/// The reason and the cause of one watcher error. The cause is what the API server answered
/// (`HTTP <code> <reason>: <message>`) or the client error with its sources.
pub fn classify(error: &watcher::Error) -> (WatchErrorReason, String) {
    match error {
        watcher::Error::InitialListFailed(e) | watcher::Error::WatchStartFailed(e) | watcher::Error::WatchFailed(e) => {
            classify_client(e)
        }
        watcher::Error::WatchError(status) => (WatchErrorReason::of_http(status.code), status_text(status)),
        watcher::Error::NoResourceVersion => (WatchErrorReason::Decode, error.to_string()),
    }
}

/// The reason and the cause of one client error: an API answer by its HTTP status
/// ([`WatchErrorReason::of_http`]); missing credentials `unauthorized`; no answer (connection,
/// TLS, a broken stream) `connect`; an unreadable answer `decode`; anything else `other`.
pub fn classify_client(error: &kube::Error) -> (WatchErrorReason, String) {
    use kube::Error as E;
    let reason = match error {
        E::Api(status) => return (WatchErrorReason::of_http(status.code), status_text(status)),
        E::Auth(_) => WatchErrorReason::Unauthorized,
        E::Service(e) if e.downcast_ref::<kube::client::AuthError>().is_some() => WatchErrorReason::Unauthorized,
        E::HyperError(_) | E::Service(_) | E::ReadEvents(_) => WatchErrorReason::Connect,
        E::SerdeError(_) | E::FromUtf8(_) | E::LinesCodecMaxLineLengthExceeded => WatchErrorReason::Decode,
        _ => WatchErrorReason::Other,
    };
    (reason, aether_process::logging::error_chain(error))
}

/// `HTTP 403 Forbidden: <message>` from a Kubernetes `Status`.
fn status_text(status: &kube::core::Status) -> String {
    let mut out = format!("HTTP {}", status.code);
    if !status.reason.is_empty() {
        out.push(' ');
        out.push_str(&status.reason);
    }
    if !status.message.is_empty() {
        out.push_str(": ");
        out.push_str(&status.message);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status::failure(message, reason).with_code(code)))
    }

    #[test]
    fn api_answers_are_classified_by_status_code_with_the_servers_message_as_cause() {
        let msg = "endpointpolicies.config.aether.io is forbidden: User \"system:serviceaccount:wh:agent\" cannot \
                   watch resource \"endpointpolicies\" in API group \"config.aether.io\" at the cluster scope";
        let (reason, cause) = classify(&watcher::Error::WatchStartFailed(api_error(403, "Forbidden", msg)));
        assert_eq!(reason, WatchErrorReason::Forbidden);
        assert_eq!(cause, format!("HTTP 403 Forbidden: {msg}"));
        for (code, want) in [
            (401, WatchErrorReason::Unauthorized),
            (404, WatchErrorReason::NotFound),
            (410, WatchErrorReason::Expired),
            (429, WatchErrorReason::ServerError),
            (503, WatchErrorReason::ServerError),
            (400, WatchErrorReason::Other),
        ] {
            assert_eq!(classify(&watcher::Error::InitialListFailed(api_error(code, "X", "m"))).0, want, "{code}");
        }
        // An error event inside a running watch stream carries the same Status.
        let gone = kube::core::Status::failure("too old resource version", "Expired").with_code(410);
        assert_eq!(classify(&watcher::Error::WatchError(Box::new(gone))).0, WatchErrorReason::Expired);
    }

    #[test]
    fn errors_without_an_http_answer_are_connect_or_decode() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused (os error 111)");
        let (reason, cause) = classify(&watcher::Error::WatchFailed(kube::Error::Service(Box::new(io))));
        assert_eq!(reason, WatchErrorReason::Connect);
        assert!(cause.contains("Connection refused"), "{cause}");
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert_eq!(classify(&watcher::Error::WatchFailed(kube::Error::ReadEvents(reset))).0, WatchErrorReason::Connect);
        let serde = serde_json::from_str::<u8>("x").unwrap_err();
        assert_eq!(classify(&watcher::Error::WatchFailed(kube::Error::SerdeError(serde))).0, WatchErrorReason::Decode);
        assert_eq!(classify(&watcher::Error::NoResourceVersion).0, WatchErrorReason::Decode);
        assert_eq!(classify_client(&kube::Error::TlsRequired).0, WatchErrorReason::Other);
    }
}
