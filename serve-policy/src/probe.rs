//! The kubelet's probes, asked over a pod-local Unix socket instead of the admin port
//! (docs/listeners.md, "Probes").
//!
//! The admin port (`--admin-addr`) is reachable from every pod and from the node's own
//! processes, and its cap and per-source share are for all of them: clients that fill them (idle
//! connections, slow readers, a process on the host network, which shares its source address
//! with the kubelet's probes of a host-network pod) would fail an HTTP probe through it, and the
//! kubelet would restart a healthy process (liveness) or withdraw it (readiness: the webhook's
//! Service loses its endpoints). So each binary also serves its admin routes on a Unix socket,
//! `--probe-socket` ([`ProbeSocketArgs`]), in an emptyDir of its own pod, behind its own
//! [`crate::Gate`] ([`crate::ListenerKind::Probe`]); the chart's probes are `exec` probes that run
//! `<binary> probe --socket <path> --path /healthz` ([`ProbeArgs`], [`command`]) inside the
//! container. Only processes in the pod reach that socket.
//!
//! - [`bind`]: binds the socket (replacing a stale one a previous container left in the
//!   emptyDir, which outlives container restarts; never a live one or another file);
//! - [`get`]: one `GET` over the socket, the status and the body;
//! - [`command`]: the `probe` subcommand, exit code 0 on a 2xx answer and 1 otherwise, with the
//!   reason on stderr (the kubelet shows it in the pod's events).

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use crate::{ConnectionPolicy, Gate, GatedListener, ListenerKind, ListenerMetrics};

/// The `--help` section of [`ProbeSocketArgs`].
pub const HELP_HEADING: &str = "Probes (docs/listeners.md, \"Probes\")";

/// The most bytes of an answer's body [`get`] reads (bytes): `/readyz` bodies are a few lines.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// The `run` flag that opens the probe socket (both binaries flatten it into `run`).
#[derive(Args, Debug, Clone, PartialEq, Eq, Default)]
#[command(next_help_heading = HELP_HEADING)]
pub struct ProbeSocketArgs {
    /// Also serve /healthz, /readyz and /metrics on this Unix socket, for the kubelet's exec
    /// probes (`probe --socket <path>`): put it in an emptyDir of the pod, where only the pod's
    /// own processes reach it, so clients filling the admin port cannot fail a probe. A stale
    /// socket left there by a previous container is replaced; any other file is an error. At
    /// most 4 connections, closed after 2 s without a request or 5 s idle. Unset: no probe
    /// socket (probe through the admin port).
    #[arg(long, value_name = "PATH", env = "AETHER_PROBE_SOCKET")]
    pub probe_socket: Option<PathBuf>,
}

impl ProbeSocketArgs {
    /// The probe socket's [`ConnectionPolicy`] when `--probe-socket` is set (for
    /// [`crate::open_files::check`] with the process's other listeners).
    pub fn policy(&self) -> Option<ConnectionPolicy> {
        self.probe_socket.as_ref().map(|_| ListenerKind::Probe.default_policy())
    }

    /// Binds `--probe-socket` ([`bind`]) behind its own gate, counted in `metrics` under
    /// `listener="probe"`, and logs where; `None` when the flag is unset. Serve it with
    /// [`crate::http::serve`].
    ///
    /// # Errors
    /// What [`bind`] returns. Must be called inside a Tokio runtime.
    pub fn open(&self, metrics: &ListenerMetrics) -> io::Result<Option<GatedListener<tokio::net::UnixListener>>> {
        let (Some(path), Some(policy)) = (&self.probe_socket, self.policy()) else { return Ok(None) };
        let listener = GatedListener::new(bind(path)?, Gate::new(policy, metrics));
        tracing::info!(socket = %path.display(), "probe endpoints (/healthz, /readyz) listening");
        Ok(Some(listener))
    }
}

/// The `probe` subcommand's flags: which socket, which path, how long to wait.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct ProbeArgs {
    /// The Unix socket the running process serves its probes on (its `run --probe-socket`).
    #[arg(long, value_name = "PATH", env = "AETHER_PROBE_SOCKET")]
    pub socket: PathBuf,
    /// Which endpoint: /healthz (liveness: the process serves) or /readyz (readiness).
    #[arg(long, default_value = "/healthz", value_parser = ["/healthz", "/readyz"])]
    pub path: String,
    /// Seconds to wait for the whole answer (keep it under the probe's timeoutSeconds, so the
    /// reason is printed before the kubelet gives up).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=60))]
    pub timeout_seconds: u64,
}

/// Binds the probe socket at `path` (`--probe-socket`), readable and writable by the owner only
/// (mode 0600: the exec probe runs as the container's user).
///
/// A socket file already at `path` that nothing accepts on (left by a previous container: an
/// emptyDir outlives container restarts) is removed first.
///
/// # Errors
/// The directory is missing or not writable; a live socket is there (another process serves
/// it); a file that is not a socket is there. Each message names `--probe-socket` and the path.
/// Must be called inside a Tokio runtime.
pub fn bind(path: &Path) -> io::Result<tokio::net::UnixListener> {
    let context = |e: io::Error| io::Error::new(e.kind(), format!("--probe-socket {}: {e}", path.display()));
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(context(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a file that is not a socket is there; refusing to replace it",
            )));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(context(io::Error::new(
                io::ErrorKind::AddrInUse,
                "another process is serving on this socket (is a second instance running in this pod?)",
            )));
        }
        std::fs::remove_file(path).map_err(context)?;
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(context)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(context)?;
    Ok(listener)
}

/// One `GET <target>` (HTTP/1.1) over the Unix socket `socket`: the status code and the body
/// (at most [`MAX_ANSWER_BYTES`], lossily decoded as UTF-8).
///
/// # Errors
/// A message saying what failed: connecting (the process is not serving the socket), the HTTP
/// exchange, or a body over [`MAX_ANSWER_BYTES`].
pub async fn get(socket: &Path, target: &str) -> Result<(u16, String), String> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", socket.display()))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake over {}: {e}", socket.display()))?;
    let connection = tokio::spawn(connection);
    let request = hyper::Request::get(target)
        .header(hyper::header::HOST, "localhost")
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("building GET {target}: {e}"))?;
    let answer = sender.send_request(request).await.map_err(|e| format!("GET {target}: {e}"))?;
    let status = answer.status().as_u16();
    let body = Limited::new(answer.into_body(), MAX_ANSWER_BYTES)
        .collect()
        .await
        .map_err(|e| format!("reading the answer to GET {target}: {e}"))?
        .to_bytes();
    connection.abort();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// The `probe` subcommand: asks `args.path` over `args.socket` within `args.timeout_seconds`.
/// A 2xx answer prints its body on stdout and exits 0; anything else (another status, no
/// answer, the timeout) prints the reason on stderr and exits 1: the kubelet counts a failed
/// probe and shows the text in the pod's events.
pub fn command(args: &ProbeArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("probe: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let timeout = Duration::from_secs(args.timeout_seconds);
    let answer = runtime.block_on(async { tokio::time::timeout(timeout, get(&args.socket, &args.path)).await });
    match answer {
        Ok(Ok((status, body))) if (200..300).contains(&status) => {
            print!("{body}");
            ExitCode::SUCCESS
        }
        Ok(Ok((status, body))) => {
            eprint!("probe: GET {} over {} answered {status}: {body}", args.path, args.socket.display());
            ExitCode::FAILURE
        }
        Ok(Err(e)) => {
            eprintln!("probe: {e}");
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!(
                "probe: no answer to GET {} over {} within {} s (--timeout-seconds)",
                args.path,
                args.socket.display(),
                args.timeout_seconds
            );
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use axum::Router;
    use axum::http::StatusCode;
    use axum::routing::get as route_get;

    use super::*;

    fn app() -> Router {
        Router::new()
            .route("/healthz", route_get(|| async { "ok\n" }))
            .route("/readyz", route_get(|| async { (StatusCode::SERVICE_UNAVAILABLE, "envoy: not connected\n") }))
    }

    #[tokio::test]
    async fn a_probe_is_answered_over_the_socket_and_a_stale_socket_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("probe.sock");
        // A previous container's socket: nothing accepts on it.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let listener = bind(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let metrics = ListenerMetrics::default();
        let gate = Gate::new(ListenerKind::Probe.default_policy(), &metrics);
        tokio::spawn(crate::http::serve(GatedListener::new(listener, gate), app(), std::future::pending()));
        assert_eq!(get(&path, "/healthz").await.unwrap(), (200, "ok\n".to_owned()));
        assert_eq!(get(&path, "/readyz").await.unwrap(), (503, "envoy: not connected\n".to_owned()));
        // A live socket is never taken over.
        let again = bind(&path).unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::AddrInUse, "{again}");
        assert!(again.to_string().contains("--probe-socket"), "{again}");
    }

    #[tokio::test]
    async fn another_file_is_never_replaced_and_no_server_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("probe.sock");
        std::fs::write(&path, "data").unwrap();
        let e = bind(&path).unwrap_err();
        assert!(e.to_string().contains("not a socket"), "{e}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "data");
        let missing = dir.path().join("none.sock");
        let e = get(&missing, "/healthz").await.unwrap_err();
        assert!(e.starts_with("cannot connect to "), "{e}");
    }

    #[test]
    fn the_subcommand_exits_zero_only_on_a_2xx_answer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("probe.sock");
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let listener = runtime.block_on(async { bind(&path) }).unwrap();
        let metrics = ListenerMetrics::default();
        let gate = Gate::new(ListenerKind::Probe.default_policy(), &metrics);
        runtime.spawn(crate::http::serve(GatedListener::new(listener, gate), app(), std::future::pending()));
        let args = |path: &str, socket: &Path| ProbeArgs {
            socket: socket.to_owned(),
            path: path.to_owned(),
            timeout_seconds: 2,
        };
        assert_eq!(command(&args("/healthz", &path)), ExitCode::SUCCESS);
        assert_eq!(command(&args("/readyz", &path)), ExitCode::FAILURE);
        assert_eq!(command(&args("/healthz", &dir.path().join("gone.sock"))), ExitCode::FAILURE);
    }
}
