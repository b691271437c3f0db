//! `aether-controller run`: the webhook over rustls and the admin port, until SIGTERM/SIGINT.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aether_crds::udspath::Budget;
use anyhow::Context;
use axum_server::tls_rustls::RustlsConfig;

use crate::admin::{self, AdminState};
use crate::metrics::Metrics;
use crate::webhook::{self, WebhookState};

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
    /// The kubelet pods dir the budget is computed for.
    pub kubelet_pods_dir: String,
    /// Cap on review bodies, in bytes.
    pub max_body_bytes: usize,
}

/// Binds both listeners and serves until a shutdown signal.
///
/// # Errors
/// When a listener cannot be bound or the certificate cannot be loaded; the error names the
/// address or file.
pub async fn run(cfg: RunConfig) -> anyhow::Result<()> {
    let budget = Budget::new(&cfg.kubelet_pods_dir);
    match &budget {
        Ok(b) => tracing::info!(pods_dir = b.pods_dir(), budget_bytes = b.bytes(), "socket value budget"),
        Err(e) => {
            tracing::error!(error = %e, "--kubelet-pods-dir gives no usable budget: every EndpointPolicy will be denied with this reason")
        }
    }
    let metrics = Metrics::default();
    let ready = Arc::new(AtomicBool::new(false));

    let admin_listener = tokio::net::TcpListener::bind(cfg.admin_addr)
        .await
        .with_context(|| format!("cannot bind --admin-addr {}", cfg.admin_addr))?;
    let admin_app = admin::router(AdminState { ready: ready.clone(), metrics: metrics.clone() });
    tracing::info!(addr = %cfg.admin_addr, "admin endpoints (/healthz, /readyz, /metrics) listening");
    let admin_task =
        tokio::spawn(
            async move { axum::serve(admin_listener, admin_app).with_graceful_shutdown(shutdown_signal()).await },
        );

    let tls = RustlsConfig::from_pem_file(&cfg.tls.cert, &cfg.tls.key).await.with_context(|| {
        format!("cannot load TLS certificate {} / key {}", cfg.tls.cert.display(), cfg.tls.key.display())
    })?;
    let listener = TcpListener::bind(cfg.webhook_addr)
        .with_context(|| format!("cannot bind --webhook-addr {}", cfg.webhook_addr))?;
    listener.set_nonblocking(true)?;
    let app = webhook::router(WebhookState { budget: Arc::new(budget), metrics }, cfg.max_body_bytes);
    let handle = axum_server::Handle::new();
    let server = axum_server::from_tcp_rustls(listener, tls)?.handle(handle.clone()).serve(app.into_make_service());
    ready.store(true, Ordering::Release);
    tracing::info!(addr = %cfg.webhook_addr, "admission webhook (POST /validate) listening over TLS");
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down: draining in-flight reviews");
        handle.graceful_shutdown(Some(Duration::from_secs(10)));
    });
    server.await.context("webhook server failed")?;
    ready.store(false, Ordering::Release);
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
