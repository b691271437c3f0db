//! `aether-agent run`: wires the state dir, the reconcile loop, the watch drivers, the xDS server
//! and the admin port together.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use tokio::sync::{mpsc, watch};

use crate::admin::{self, AdminState};
use crate::cli::RunArgs;
use crate::cni::CniRecords;
use crate::driver::{Driver, Event, Status};
use crate::fold::Settings;
use crate::index::Index;
use crate::metrics::Metrics;
use crate::recorder::{self, NoticeSender};
use crate::store::StateStore;
use crate::watch as watchers;
use crate::xds::resources::{RenderOptions, Renderer, Snapshot};
use crate::xds::server::{self as xds, XdsAddr, XdsListener, XdsServer};

/// Runs the agent until SIGTERM/SIGINT.
///
/// # Errors
/// When the state dir, the xDS address or the admin address cannot be used; the error names it.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let settings = Settings::new(&args.delivery.kubelet_pods_dir, args.delivery.uds_workloads);
    match settings.budget() {
        Ok(b) => tracing::info!(
            pods_dir = b.pods_dir(),
            budget_bytes = b.bytes(),
            uds_workloads = settings.uds_workloads(),
            "socket value budget"
        ),
        Err(e) => {
            tracing::error!(error = %e, "--kubelet-pods-dir gives no usable budget: EVERY POD IS DELIVERED OVER TCP")
        }
    }
    let store =
        StateStore::open(&args.state_dir).with_context(|| format!("--state-dir {}", args.state_dir.display()))?;
    let (snap_tx, snap_rx) = watch::channel(Arc::new(Snapshot::default()));
    let (status_tx, status_rx) = watch::channel(Status::default());
    let metrics = Arc::new(Metrics::new());
    let (notices, notice_rx) = NoticeSender::channel(metrics.clone());
    let mut driver = Driver::new(
        Index::new(settings.clone()),
        Some(store),
        CniRecords::new(args.cni_records_dir.clone()),
        snap_tx,
        status_tx,
    )
    .with_notices(notices)
    .with_change_clock(metrics.xds.clock.clone());
    driver.boot();

    let opts = RenderOptions { health_socket: Some(args.health_socket.clone()), ..RenderOptions::default() };
    let (resources, _render_task) = xds::spawn_renderer_with_clock(
        snap_rx,
        Renderer::new(opts),
        Duration::from_millis(args.xds_debounce_ms),
        metrics.xds.clock.clone(),
    );
    let addr = XdsAddr::from_str(&args.xds_address).with_context(|| "--xds-address")?;
    let listener = XdsListener::bind(&addr).await.with_context(|| format!("--xds-address {addr}"))?;
    let xds_bound = Arc::new(AtomicBool::new(true));
    tracing::info!(%addr, "xDS (ADS: CDS + LDS) listening");
    let server = XdsServer::new(resources).with_metrics(metrics.xds.clone());
    let xds_task = tokio::spawn(xds::serve_listener(listener, server, shutdown_signal()));

    let admin_listener = tokio::net::TcpListener::bind(args.admin_addr)
        .await
        .with_context(|| format!("cannot bind --admin-addr {}", args.admin_addr))?;
    tracing::info!(addr = %args.admin_addr, "admin endpoints (/healthz, /readyz, /metrics) listening");
    let admin_app = admin::router(AdminState::new(xds_bound.clone(), status_rx).with_metrics(metrics.clone()));
    tokio::spawn(async move { axum::serve(admin_listener, admin_app).with_graceful_shutdown(shutdown_signal()).await });

    let (tx, rx) = mpsc::channel::<Event>(1024);
    let loop_task = tokio::spawn(driver.run(rx));
    match kube::Client::try_default().await {
        Ok(client) => {
            recorder::spawn(client.clone(), &args.node_name, notice_rx, metrics.clone());
            tokio::spawn(watchers::pods(client.clone(), args.node_name.clone(), tx.clone()));
            if settings.uds_workloads() {
                tokio::spawn(watchers::policies(client, tx.clone()));
            } else {
                tracing::info!("--uds-workloads=false: EndpointPolicies are not watched and every pod is TCP");
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "no Kubernetes client configuration; serving the state dir only");
            drop(notice_rx);
        }
    }
    let recheck = Duration::from_secs(args.recheck_seconds.max(1));
    let ticker = tx.clone();
    tokio::spawn(async move {
        let mut t = tokio::time::interval(recheck);
        t.tick().await;
        loop {
            t.tick().await;
            if ticker.send(Event::Recheck).await.is_err() {
                return;
            }
        }
    });
    drop(tx);

    let result = xds_task.await;
    xds_bound.store(false, Ordering::Release);
    loop_task.abort();
    result.context("xDS server task")?.context("xDS server")?;
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
    tracing::info!("shutting down");
}
