//! The CRI client: which network namespace a pod's sandbox has, asked over the runtime's Unix
//! socket.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ListPodSandboxRequest, NamespaceMode, PodSandbox, PodSandboxFilter, PodSandboxState, PodSandboxStateValue,
    PodSandboxStatusRequest, PodSandboxStatusResponse,
};
use tokio::net::UnixStream;
use tokio::sync::Mutex;
use tonic::transport::{Channel, Endpoint, Uri};

use super::error::RuntimeError;
use super::netns::{NetnsDirs, NetnsPath, sandbox_netns};

/// The default of `--cri-endpoint`: containerd's socket.
pub const DEFAULT_CRI_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

/// The sandbox label kubelet sets to the pod's UID.
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";

/// How long connecting to the CRI socket may take. A runtime that accepts no connection within
/// it counts as down for this lookup; the next lookup tries again. The socket is local: a healthy
/// runtime accepts in microseconds.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one CRI call (`ListPodSandbox`, `PodSandboxStatus`) may take once a connection is
/// there. Also sent to the runtime as the call's gRPC deadline. A lookup makes two calls, so it
/// ends after at most `CONNECT_TIMEOUT + 2 * CALL_TIMEOUT`.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// `--cri-endpoint`: a Unix socket, or disabled (the empty string).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CriEndpoint {
    /// No runtime is asked: netns paths come from `--cni-records-dir` only.
    Disabled,
    /// `unix://<path>`.
    Unix(PathBuf),
}

impl CriEndpoint {
    /// The socket path, if enabled.
    pub fn socket(&self) -> Option<&Path> {
        match self {
            CriEndpoint::Disabled => None,
            CriEndpoint::Unix(p) => Some(p),
        }
    }
}

impl FromStr for CriEndpoint {
    type Err = RuntimeError;

    /// `""` → disabled; `unix:///abs/path` (kubelet's spelling) → that socket. Anything else
    /// (TCP endpoints, relative paths) is refused: CRI is served on a local socket.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason| RuntimeError::Endpoint { endpoint: s.to_owned(), reason };
        if s.is_empty() {
            return Ok(CriEndpoint::Disabled);
        }
        let path = s
            .strip_prefix("unix://")
            .ok_or_else(|| bad("must be unix:///<absolute socket path>, or empty to disable"))?;
        if !path.starts_with('/') {
            return Err(bad("the socket path must be absolute (unix:///run/...)"));
        }
        if path.contains('\0') {
            return Err(bad("contains a NUL byte"));
        }
        if path.len() > 107 {
            return Err(bad("the socket path is longer than a Unix socket address allows (107 bytes)"));
        }
        Ok(CriEndpoint::Unix(PathBuf::from(path)))
    }
}

impl fmt::Display for CriEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CriEndpoint::Disabled => f.write_str("(disabled)"),
            CriEndpoint::Unix(p) => write!(f, "unix://{}", p.display()),
        }
    }
}

/// A CRI `RuntimeService` client on a Unix socket. Cheap to share (`&self` methods); no I/O until
/// the first lookup.
///
/// Connection: made on first use, bounded by [`CONNECT_TIMEOUT`]. A runtime that is down then is
/// tried again by the next lookup. Once connected, tonic's channel reconnects by itself after the
/// runtime restarts (the call that meets the broken connection fails, the next one reconnects).
pub struct CriClient {
    socket: PathBuf,
    /// `unix://<socket>`, for messages.
    endpoint: String,
    dirs: NetnsDirs,
    channel: Mutex<Option<Channel>>,
}

impl fmt::Debug for CriClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CriClient").field("endpoint", &self.endpoint).field("dirs", &self.dirs).finish_non_exhaustive()
    }
}

impl CriClient {
    /// A client for `socket` whose netns paths are checked and translated with `dirs`.
    pub fn new(socket: impl Into<PathBuf>, dirs: NetnsDirs) -> Self {
        let socket = socket.into();
        let endpoint = format!("unix://{}", socket.display());
        CriClient { socket, endpoint, dirs, channel: Mutex::new(None) }
    }

    /// A client for `--cri-endpoint`, or `None` when it is disabled.
    pub fn from_endpoint(endpoint: &CriEndpoint, dirs: NetnsDirs) -> Option<Self> {
        endpoint.socket().map(|s| CriClient::new(s, dirs))
    }

    /// `unix://<socket>`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The network namespace of pod `pod_uid`, as the proxy opens it.
    ///
    /// `Ok(None)`: no ready sandbox carries that UID (not started yet, or gone), or the pod uses
    /// the host's network namespace. `Err`: the runtime could not be asked, answered in a shape
    /// this module does not read, or reported a path [`NetnsDirs::translate`] refuses.
    pub async fn netns_of(&self, pod_uid: &str) -> Result<Option<NetnsPath>, RuntimeError> {
        let mut client = RuntimeServiceClient::new(self.channel().await?);
        let filter = PodSandboxFilter {
            id: String::new(),
            state: Some(PodSandboxStateValue { state: PodSandboxState::SandboxReady as i32 }),
            label_selector: [(POD_UID_LABEL.to_owned(), pod_uid.to_owned())].into(),
        };
        let list = self
            .call("ListPodSandbox", client.list_pod_sandbox(request(ListPodSandboxRequest { filter: Some(filter) })))
            .await?;
        let Some(sandbox) = newest_ready(&list.items, pod_uid) else {
            return Ok(None);
        };
        let status = self
            .call(
                "PodSandboxStatus",
                client.pod_sandbox_status(request(PodSandboxStatusRequest {
                    pod_sandbox_id: sandbox.id.clone(),
                    verbose: true,
                })),
            )
            .await?;
        if uses_host_network(&status) {
            return Ok(None);
        }
        match sandbox_netns(&sandbox.id, &status.info)? {
            None => Ok(None),
            Some(host_path) => self.dirs.translate(&host_path).map(Some),
        }
    }

    /// The connected channel; connects first if there is none (bounded by [`CONNECT_TIMEOUT`]).
    async fn channel(&self) -> Result<Channel, RuntimeError> {
        let mut slot = self.channel.lock().await;
        if let Some(channel) = slot.as_ref() {
            return Ok(channel.clone());
        }
        let socket = self.socket.clone();
        // The URI is required by the API and unused: the connector dials the socket.
        let endpoint = Endpoint::from_static("http://cri.invalid").connect_timeout(CONNECT_TIMEOUT);
        let connect = endpoint.connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
        }));
        let channel = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Err(_) => {
                return Err(RuntimeError::Timeout {
                    endpoint: self.endpoint.clone(),
                    call: "connect",
                    after: CONNECT_TIMEOUT,
                });
            }
            Ok(Err(e)) => {
                return Err(RuntimeError::Connect {
                    endpoint: self.endpoint.clone(),
                    detail: aether_process::logging::error_chain(&e),
                });
            }
            Ok(Ok(channel)) => channel,
        };
        *slot = Some(channel.clone());
        Ok(channel)
    }

    /// One unary call, bounded by [`CALL_TIMEOUT`]. (A reconnect the channel makes inside the call,
    /// after the runtime restarted, is part of it: a local socket connects in microseconds.)
    async fn call<T>(
        &self,
        call: &'static str,
        fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, RuntimeError> {
        match tokio::time::timeout(CALL_TIMEOUT, fut).await {
            Err(_) => Err(RuntimeError::Timeout { endpoint: self.endpoint.clone(), call, after: CALL_TIMEOUT }),
            Ok(Err(status)) if is_timeout(&status) => {
                Err(RuntimeError::Timeout { endpoint: self.endpoint.clone(), call, after: CALL_TIMEOUT })
            }
            Ok(Err(status)) => Err(RuntimeError::Call {
                endpoint: self.endpoint.clone(),
                call,
                code: status.code(),
                detail: status_detail(&status),
            }),
            Ok(Ok(response)) => Ok(response.into_inner()),
        }
    }
}

/// A request carrying [`CALL_TIMEOUT`] as its gRPC deadline, so the runtime gives up too.
fn request<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(CALL_TIMEOUT);
    request
}

/// The ready sandbox of `pod_uid` created last (a pod whose sandbox was recreated can briefly
/// list two). The label is checked again here: a runtime that ignores the filter must not hand
/// us another pod's sandbox.
fn newest_ready<'a>(items: &'a [PodSandbox], pod_uid: &str) -> Option<&'a PodSandbox> {
    items
        .iter()
        .filter(|s| s.state == PodSandboxState::SandboxReady as i32)
        .filter(|s| s.labels.get(POD_UID_LABEL).is_some_and(|uid| uid == pod_uid))
        .max_by(|a, b| a.created_at.cmp(&b.created_at).then_with(|| a.id.cmp(&b.id)))
}

/// The CRI status says the sandbox runs in the node's network namespace (`hostNetwork: true`).
fn uses_host_network(status: &PodSandboxStatusResponse) -> bool {
    status
        .status
        .as_ref()
        .and_then(|s| s.linux.as_ref())
        .and_then(|l| l.namespaces.as_ref())
        .and_then(|n| n.options.as_ref())
        .is_some_and(|o| o.network == NamespaceMode::Node as i32)
}

/// The call's deadline passed: the runtime said so (`DEADLINE_EXCEEDED`), or tonic enforced the
/// request's `grpc-timeout` on the client side first (`CANCELLED`, "Timeout expired").
fn is_timeout(status: &tonic::Status) -> bool {
    match status.code() {
        tonic::Code::DeadlineExceeded => true,
        tonic::Code::Cancelled => {
            status.message() == tonic::TimeoutExpired(()).to_string()
                || std::iter::successors(std::error::Error::source(status), |e| e.source())
                    .any(|e| e.is::<tonic::TimeoutExpired>())
        }
        _ => false,
    }
}

/// A status's message and its causes (a transport failure's cause is the useful part).
fn status_detail(status: &tonic::Status) -> String {
    aether_process::logging::with_sources(status.message().to_owned(), std::error::Error::source(status))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use k8s_cri::v1::{LinuxPodSandboxStatus, Namespace, NamespaceOption, PodSandboxStatus};

    use super::*;

    const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

    fn sandbox(id: &str, uid: &str, state: PodSandboxState, created_at: i64) -> PodSandbox {
        PodSandbox {
            id: id.to_owned(),
            state: state as i32,
            created_at,
            labels: HashMap::from([(POD_UID_LABEL.to_owned(), uid.to_owned())]),
            ..Default::default()
        }
    }

    #[test]
    fn the_newest_ready_sandbox_of_the_pod_wins() {
        let items = [
            sandbox("old", UID, PodSandboxState::SandboxReady, 100),
            sandbox("new", UID, PodSandboxState::SandboxReady, 300),
            sandbox("newer-but-not-ready", UID, PodSandboxState::SandboxNotready, 400),
            sandbox("other-pod", "another-uid", PodSandboxState::SandboxReady, 500),
        ];
        assert_eq!(newest_ready(&items, UID).map(|s| s.id.as_str()), Some("new"));
        assert_eq!(newest_ready(&items[2..3], UID), None);
        assert_eq!(newest_ready(&items[3..], UID), None, "a runtime ignoring the filter must not leak another pod");
        assert_eq!(newest_ready(&[], UID), None);
    }

    #[test]
    fn the_cri_status_marks_host_network_sandboxes() {
        let with = |mode: NamespaceMode| PodSandboxStatusResponse {
            status: Some(PodSandboxStatus {
                linux: Some(LinuxPodSandboxStatus {
                    namespaces: Some(Namespace {
                        options: Some(NamespaceOption { network: mode as i32, ..Default::default() }),
                    }),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(uses_host_network(&with(NamespaceMode::Node)));
        assert!(!uses_host_network(&with(NamespaceMode::Pod)));
        assert!(!uses_host_network(&PodSandboxStatusResponse::default()));
    }

    #[test]
    fn a_passed_deadline_is_a_timeout_whichever_side_noticed_it() {
        assert!(is_timeout(&tonic::Status::deadline_exceeded("context deadline exceeded")));
        assert!(is_timeout(&tonic::Status::cancelled(tonic::TimeoutExpired(()).to_string())));
        assert!(!is_timeout(&tonic::Status::cancelled("the runtime is shutting down")));
        assert!(!is_timeout(&tonic::Status::unavailable("connection refused")));
    }

    #[test]
    fn the_endpoint_flag_is_a_unix_socket_or_empty() {
        assert_eq!("".parse::<CriEndpoint>().unwrap(), CriEndpoint::Disabled);
        assert_eq!(
            DEFAULT_CRI_ENDPOINT.parse::<CriEndpoint>().unwrap(),
            CriEndpoint::Unix("/run/containerd/containerd.sock".into())
        );
        assert_eq!(
            "unix:///var/run/crio/crio.sock".parse::<CriEndpoint>().unwrap().to_string(),
            "unix:///var/run/crio/crio.sock"
        );
        for bad in
            ["/run/containerd/containerd.sock", "tcp://127.0.0.1:1234", "unix://run/x.sock", "http://[::1]:50051"]
        {
            let e = bad.parse::<CriEndpoint>().unwrap_err();
            assert!(matches!(e, RuntimeError::Endpoint { .. }) && e.to_string().contains(bad), "{bad}: {e}");
        }
        let long = format!("unix:///{}", "s".repeat(107));
        assert!(long.parse::<CriEndpoint>().is_err());
    }
}
