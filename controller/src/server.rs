//! `aether-controller run`: the webhook over rustls and the admin port, until SIGTERM/SIGINT.
//! With `--tls-dir` the certificate is reloaded when the mounted Secret changes. With a status
//! writer configured, the caches, the election and the status writer run alongside
//! ([`crate::status_writer`]); the webhook never waits for them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aether_crds::Rules;
use aether_serve_policy::{ConnectionPolicy, Gate, GatedListener, ListenerKind};
use aether_webhook_certs::ReloadingCertResolver;
use anyhow::Context;
use axum_server::tls_rustls::RustlsConfig;

use crate::admin::{self, AdminState};
use crate::metrics::Metrics;
use crate::status_writer::{self, StatusWriterConfig};
use crate::webhook::{self, WebhookState};

/// How long a client may take to send a request's headers (HTTP/1.1).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Concurrent HTTP/2 streams the webhook allows per connection (hyper's default is 200).
pub const WEBHOOK_MAX_STREAMS: u32 = 32;

/// The webhook's HTTP/2 flow-control windows, per stream and per connection, in bytes: 64 KiB
/// (HTTP/2's own default; hyper's server sets 1 MiB).
pub const WEBHOOK_H2_WINDOW_BYTES: u32 = 64 * 1024;

/// The connection policies of the two listeners (docs/listeners.md): caps, the webhook's TLS
/// handshake / first-byte timeout, the idle timeouts. From the `run` flags
/// (`--webhook-max-connections`, `--admin-max-connections`, ...); the defaults otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listeners {
    /// The HTTPS webhook's.
    pub webhook: ConnectionPolicy,
    /// The plain-HTTP admin port's.
    pub admin: ConnectionPolicy,
}

impl Default for Listeners {
    fn default() -> Self {
        Listeners { webhook: ListenerKind::Webhook.default_policy(), admin: ListenerKind::Admin.default_policy() }
    }
}

/// Where the serving certificate and key come from.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

/// Settings of `run`.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Webhook (HTTPS) listen address.
    pub webhook_addr: SocketAddr,
    /// Admin (plain HTTP) listen address.
    pub admin_addr: SocketAddr,
    /// Certificate and key.
    pub tls: TlsFiles,
    /// The rules reviews are decided by: the kubelet pods dir the budget is computed for and the
    /// socket limit (`--kubelet-pods-dir`, `--socket-limit`).
    pub rules: Rules,
    /// The connection policies of the webhook and admin listeners (docs/listeners.md).
    pub listeners: Listeners,
    /// Cap on review bodies, in bytes.
    pub max_body_bytes: usize,
    /// The status writer (and the caches behind the webhook's warnings); `None` serves the
    /// webhook alone, with no Kubernetes client.
    pub status_writer: Option<StatusWriterConfig>,
    /// `--probe-socket`: also serve the admin routes on this pod-local Unix socket, for the
    /// kubelet's exec probes ([`aether_serve_policy::probe`]); unset: no probe socket.
    pub probe: aether_serve_policy::probe::ProbeSocketArgs,
}

/// Binds both listeners and serves until a shutdown signal, with the certificate loaded once.
///
/// # Errors
/// When a listener cannot be bound or the certificate cannot be loaded; the error names the
/// address or file.
pub async fn run(cfg: RunConfig) -> anyhow::Result<()> {
    serve(cfg, None).await
}

/// Like [`run`], but the certificate and key files are re-read every `poll` and a new good pair
/// is served from the next handshake on, without a restart (a mounted Secret rotated by the
/// kubelet's `..data` swap). A bad or half-written pair is logged and the last good one kept.
///
/// # Errors
/// As [`run`]; the first load must succeed.
pub async fn run_reloading(cfg: RunConfig, poll: Duration) -> anyhow::Result<()> {
    serve(cfg, Some(poll)).await
}

/// Loads the serving pair, and sets `aether_webhook_certificate_expiry_timestamp_seconds` from its
/// leaf: once, or (with `reload`) again with every pair the resolver swaps in.
async fn load_tls(files: &TlsFiles, reload: Option<Duration>, metrics: &Metrics) -> anyhow::Result<RustlsConfig> {
    let what = || format!("cannot load TLS certificate {} / key {}", files.cert.display(), files.key.display());
    match reload {
        None => {
            let config = RustlsConfig::from_pem_file(&files.cert, &files.key).await.with_context(what)?;
            match aether_webhook_certs::expiry::leaf_not_after_file(&files.cert) {
                Ok(unix) => {
                    metrics.certificate_expiry.set(unix);
                }
                Err(e) => tracing::warn!(error = %e, "cannot read the serving certificate's notAfter"),
            }
            Ok(config)
        }
        Some(poll) => {
            let resolver = Arc::new(ReloadingCertResolver::from_files(&files.cert, &files.key).with_context(what)?);
            let gauge = metrics.clone();
            resolver.on_load(move |ck| match ck.cert.first() {
                Some(leaf) => gauge.set_certificate(leaf),
                None => tracing::warn!("the served certificate chain is empty"),
            });
            resolver.watch(poll).context("cannot start the certificate reload thread")?;
            tracing::info!(poll_seconds = poll.as_secs_f64(), "watching the certificate files for rotation");
            Ok(RustlsConfig::from_config(Arc::new(resolver.server_config().context("building the TLS configuration")?)))
        }
    }
}

async fn serve(cfg: RunConfig, reload: Option<Duration>) -> anyhow::Result<()> {
    let rules = cfg.rules;
    match rules.budget() {
        Ok(b) => tracing::info!(
            pods_dir = b.pods_dir(),
            budget_bytes = b.bytes(),
            socket_limit = %b.limit(),
            "socket value budget"
        ),
        Err(e) => {
            tracing::error!(error = %e, "--kubelet-pods-dir gives no usable budget: every EndpointPolicy will be denied with this reason")
        }
    }
    let metrics = Metrics::default();
    let ready = Arc::new(AtomicBool::new(false));
    let rules = Arc::new(rules);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (cluster, writer_task) = match cfg.status_writer.clone() {
        None => {
            tracing::info!("status writer off (--status-writer=false): serving the webhook only");
            (None, None)
        }
        Some(writer) => {
            let (view, task) = status_writer::start(writer, rules.clone(), metrics.clone(), stop_rx)?;
            (Some(view), Some(task))
        }
    };

    let listeners = cfg.listeners;
    // Logs a warning when the caps and the process's own files do not fit under `ulimit -n`.
    let _ = aether_serve_policy::open_files::check(
        &[&[listeners.webhook, listeners.admin][..], cfg.probe.policy().as_slice()].concat(),
    );
    // [::] is one dual-stack socket (IPv4 and IPv6 clients); IPv4 only on a kernel without IPv6.
    let admin_listener =
        tokio::net::TcpListener::from_std(aether_serve_policy::bind_tcp("--admin-addr", cfg.admin_addr)?)?;
    let admin_listener = GatedListener::new(admin_listener, Gate::new(listeners.admin, &metrics.listeners));
    let admin_app =
        admin::router(AdminState { ready: ready.clone(), metrics: metrics.clone(), cluster: cluster.clone() });
    tracing::info!(addr = %cfg.admin_addr, "admin endpoints (/healthz, /readyz, /metrics) listening");
    if let Some(probe_listener) = cfg.probe.open(&metrics.listeners)? {
        let probe_app = admin_app.clone();
        tokio::spawn(
            async move { aether_serve_policy::http::serve(probe_listener, probe_app, shutdown_signal()).await },
        );
    }
    let admin_task = tokio::spawn(async move {
        aether_serve_policy::http::serve(admin_listener, admin_app, shutdown_signal()).await;
        anyhow::Ok(())
    });

    let tls = load_tls(&cfg.tls, reload, &metrics).await?;
    let listener = aether_serve_policy::bind_tcp("--webhook-addr", cfg.webhook_addr)?;
    let webhook_gate = Gate::new(listeners.webhook, &metrics.listeners);
    let app = webhook::router(WebhookState { rules, metrics, cluster }, cfg.max_body_bytes);
    let handle = axum_server::Handle::new();
    // Idle and slow clients must not hold connections (and file descriptors) open: at most
    // `max_connections` at once (more are closed at once), the TLS handshake and the first
    // request byte within the handshake timeout of accept, closed after the idle timeout with no
    // byte either way (this replaces HTTP/2 keepalive PINGs, whose answers would count as
    // activity), request headers within HEADER_READ_TIMEOUT, and the whole request answered
    // (408) within webhook::REQUEST_TIMEOUT.
    let mut server = axum_server::from_tcp(listener)?.acceptor(webhook_gate.tls_acceptor(tls)).handle(handle.clone());
    server.http_builder().http1().timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    // HTTP/2 streams per connection: the API server opens another connection past it rather than
    // queue (Go's transport), so a client cannot multiply one connection slot into hundreds of
    // requests; the reviews in flight are bounded by their parse memory in any case
    // (webhook::inflight_budget_bytes).
    // Flow-control windows bound what a connection's unread bodies buffer: a review's body is
    // read only once its share of the budget is free, and meanwhile each connection holds at most
    // WEBHOOK_H2_WINDOW_BYTES of it (hyper's defaults, 1 MiB per connection, let 256 connections
    // buffer 256 MiB). Reviews are KiB: the window costs them nothing.
    server
        .http_builder()
        .http2()
        .max_concurrent_streams(WEBHOOK_MAX_STREAMS)
        .initial_stream_window_size(WEBHOOK_H2_WINDOW_BYTES)
        .initial_connection_window_size(WEBHOOK_H2_WINDOW_BYTES);
    let server = server.serve(app.into_make_service());
    ready.store(true, Ordering::Release);
    tracing::info!(addr = %cfg.webhook_addr, "admission webhook (POST /validate) listening over TLS");
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down: draining in-flight reviews");
        handle.graceful_shutdown(Some(Duration::from_secs(10)));
        let _ = stop_tx.send(true);
    });
    server.await.context("webhook server failed")?;
    ready.store(false, Ordering::Release);
    if let Some(task) = writer_task {
        // Releases the Lease if held; bounded, so an unreachable API server cannot hold up exit.
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    admin_task.await??;
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
}
