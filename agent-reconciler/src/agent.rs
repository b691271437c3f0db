//! `aether-agent run`: wires the state dir, the reconcile loop, the watch drivers, the xDS server
//! and the admin port together.
//!
//! On SIGTERM/SIGINT the xDS server stops accepting and removes its socket file (if it is still
//! the one it bound) and ends the ADS streams (after up to `--shutdown-wait-seconds` for them to
//! close, without `--own-daemonset`); then the agent removes the socket pins and the
//! `--health-socket` file only when the release goes (see [`crate::shutdown`]).

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use tokio::sync::{mpsc, watch};

use aether_agent_core::status::Status;

use crate::admin::EnvoyView;
use crate::admin::{self, AdminState};
use crate::cli::flags::RunArgs;
use crate::cni::CniRecords;
use crate::driver::{Collaborators, Driver, SocketCheck};
use crate::event::Event;
use crate::fold::Settings;
use crate::index::Index;
use crate::metrics::Metrics;
use crate::recorder::{self, NoticeSender};
use crate::shutdown;
use crate::store::StateStore;
use crate::watch as watchers;
use crate::watch::owner::Owner;
use crate::xds::encoder::Encoder;
use crate::xds::listen::{ServeError, XdsAddr, XdsListener};
use crate::xds::options::BuildOptions;
use crate::xds::publish::PodSpecs;
use crate::xds::publish::spawn_encoder_with_clock;
use crate::xds::server::{Drained, serve_listener};
use crate::xds::service::XdsServer;

/// The container-runtime netns lookup (`--cri-endpoint`; none when it is empty) and the channel
/// of its answers. Does no I/O: the first lookup connects.
///
/// # Errors
/// When `--netns-host-dir`/`--netns-proxy-dir` are unusable.
fn netns_lookup(
    args: &RunArgs,
) -> anyhow::Result<Option<(crate::runtime::NetnsLookup, mpsc::Receiver<crate::runtime::NetnsUpdate>)>> {
    let dirs = args.netns_dirs()?;
    let Some(client) = crate::runtime::CriClient::from_endpoint(&args.cri_endpoint, dirs.clone()) else {
        tracing::info!("--cri-endpoint is empty: pod network namespaces only from --cni-records-dir");
        return Ok(None);
    };
    tracing::info!(
        endpoint = client.endpoint(),
        netns_host_dir = dirs.host(),
        netns_proxy_dir = dirs.proxy(),
        "asking the container runtime for pod network namespaces"
    );
    Ok(Some(crate::runtime::NetnsLookup::spawn(client, crate::runtime::LOOKUP_QUEUE)))
}

/// How the loop verifies sockets: on disk without `pinner` (`--pin-dir`), else pinned, with the
/// volume dirs watched (`socket_watch_max`, `--socket-watch-max`, above 0 and an inotify instance
/// to be had). With the watch, the batches of pods it names.
fn socket_check(
    pinner: Option<&crate::pin::Pinner>,
    socket_watch_max: usize,
    metrics: &Metrics,
) -> (SocketCheck, Option<crate::socket_watch::Changes>) {
    let Some(pinner) = pinner else { return (SocketCheck::OnDisk, None) };
    tracing::info!(pin_dir = %pinner.dir().display(), "pinning verified sockets; Envoy dials <pin-dir>/<pod uid>.sock");
    if socket_watch_max == 0 {
        return (SocketCheck::Pinned(pinner.clone()), None);
    }
    match crate::socket_watch::SocketWatch::spawn(socket_watch_max, metrics.socket_watch.clone()) {
        Ok((w, changes)) => (SocketCheck::Watched(pinner.clone(), w), Some(changes)),
        Err(e) => {
            tracing::warn!(error = %e, "no inotify instance; sockets are re-pinned at each re-check only");
            (SocketCheck::Pinned(pinner.clone()), None)
        }
    }
}

/// Runs the agent until SIGTERM/SIGINT.
///
/// # Errors
/// When the state dir, the xDS address or the admin address cannot be used; the error names it.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let pin_dir = args.pin_dir.as_ref().map(|d| d.to_string_lossy().into_owned());
    let rules = args.socket_rules().map_err(anyhow::Error::msg)?;
    let settings = Settings::with_rules(rules, args.delivery.uds_workloads).with_pin_dir(pin_dir);
    let settings = settings.with_max_clusters(Some(args.max_clusters));
    log_budget(&settings);
    tracing::info!(
        max_clusters = args.max_clusters,
        "the node's Envoy is given at most this many app_/health_ clusters"
    );
    let stop = stop_on_signal()?;
    // Before the state dir is read or a pin touched: one agent per pin dir (another release's
    // agent is refused here, having changed nothing on the node).
    let pin_owner = match &args.pin_dir {
        Some(dir) => Some(claim_pin_dir(dir, &args, &stop).await?),
        None => None,
    };
    let store =
        StateStore::open(&args.state_dir).with_context(|| format!("--state-dir {}", args.state_dir.display()))?;
    // Only the pods a change re-rendered travel to the encoder task: a change costs work for the pods
    // it touched (docs/design-notes.md "Per-change work and a lean process").
    let (snap_tx, snap_rx) = crate::xds::publish::pod_specs();
    // Envoy's streams are held unanswered until the loop has a complete state (the driver clears
    // it: a replayed state dir, or the first pod list and the socket pods' netns).
    let (status_tx, status_rx) = watch::channel(Status { holding_xds: true, ..Status::default() });
    let metrics = Arc::new(Metrics::new());
    let (notices, notice_rx) = NoticeSender::channel(metrics.clone());
    let decisions = crate::decisions::Decisions::new(&args.node_name);
    // Pinning's calls on this kernel (docs/compatibility.md, "Kernel"): a gap leaves the agent
    // not ready, with an Event on the Node below; pinning is never turned off for it.
    let kernel_gaps: Vec<String> = match &args.pin_dir {
        Some(_) => crate::kernel::check().iter().map(ToString::to_string).collect(),
        None => Vec::new(),
    };
    for gap in &kernel_gaps {
        tracing::error!(node = %args.node_name, "{gap}");
    }
    let pinner = match &args.pin_dir {
        Some(dir) => Some(
            crate::pin::Pinner::new(&args.delivery.socket.kubelet_pods_dir, dir)
                .with_context(|| format!("--pin-dir {}", dir.display()))?,
        ),
        None => None,
    };
    let (sockets, socket_events) = socket_check(pinner.as_ref(), args.socket_watch_max, &metrics);
    let (netns, netns_updates) = match netns_lookup(&args)? {
        Some((lookup, updates)) => (crate::runtime::PodNetns::with_lookup(lookup), Some(updates)),
        None => (crate::runtime::PodNetns::default(), None),
    };
    let collaborators = Collaborators {
        notices,
        clock: metrics.xds.clock.clone(),
        cluster_metrics: metrics.clusters.clone(),
        decisions: decisions.clone(),
        sockets,
        netns,
    };
    let mut driver = Driver::new(
        Index::new(settings.clone()),
        Some(store),
        CniRecords::new(args.cni_records_dir.clone(), args.netns_dirs()?),
        snap_tx,
        status_tx,
        collaborators,
    );
    driver.boot();

    let opts = BuildOptions {
        health_socket: Some(args.health_socket.clone()),
        inbound_max_connections: args.inbound_max_connections,
        inbound_idle_timeout: Duration::from_secs(args.inbound_idle_timeout_seconds),
        ..BuildOptions::default()
    };
    let (resources, _encode_task) = spawn_encoder_with_clock(
        snap_rx.clone(),
        Encoder::new(opts),
        Duration::from_millis(args.xds_debounce_ms),
        metrics.xds.clock.clone(),
    );
    // The admin port first: a failure there must not leave an xDS socket behind.
    let (admin_policy, xds_policy) = (args.admin_listener.policy(), args.xds_listener.policy());
    // Logs a warning when the caps and the process's own files do not fit under `ulimit -n`.
    let _ = aether_serve_policy::open_files::check(
        &[&[admin_policy, xds_policy][..], args.probe.policy().as_slice()].concat(),
    );
    // [::] is one dual-stack socket (IPv4 and IPv6 clients); IPv4 only on a kernel without IPv6.
    let admin_listener =
        tokio::net::TcpListener::from_std(aether_serve_policy::bind_tcp("--admin-addr", args.admin_addr)?)?;
    let debug_listener =
        tokio::net::TcpListener::from_std(aether_serve_policy::bind_tcp("--debug-addr", args.debug_addr)?)?;
    // One gate for both: the debug port shares the admin port's cap and timeouts.
    let admin_gate = aether_serve_policy::Gate::new(admin_policy, &metrics.listeners);
    let debug_listener = aether_serve_policy::GatedListener::new(debug_listener, admin_gate.clone());
    let admin_listener = aether_serve_policy::GatedListener::new(admin_listener, admin_gate);
    // The kubelet's exec probes ask here, out of reach of the clients that can fill the admin port.
    let probe_listener = args.probe.open(&metrics.listeners)?;
    let addr = XdsAddr::from_str(&args.xds_address).with_context(|| "--xds-address")?;
    let listener = XdsListener::bind(&addr).await.with_context(|| format!("--xds-address {addr}"))?;
    let xds_bound = Arc::new(AtomicBool::new(true));
    tracing::info!(%addr, "xDS (ADS: CDS + LDS + ECDS) listening");
    let server = XdsServer::new(resources.clone())
        .with_metrics(metrics.xds.clone())
        // With --own-daemonset the DaemonSet decides what stays on the host: nothing to wait for.
        .with_shutdown_wait(if args.own_daemonset.is_some() {
            Duration::ZERO
        } else {
            Duration::from_secs(args.shutdown_wait_seconds)
        })
        .with_connection_gate(aether_serve_policy::Gate::new(xds_policy, &metrics.listeners));
    let tracker = server.tracker();
    let envoy = EnvoyView { tracker: tracker.clone(), resources, required: args.readyz_requires_envoy };
    let xds_task = tokio::spawn(serve_when_complete(listener, server, status_rx.clone(), snap_rx, stop.clone()));

    tracing::info!(addr = %args.admin_addr, "admin endpoints (/healthz, /readyz, /metrics) listening");
    tracing::info!(addr = %args.debug_addr, "debug endpoints (/debug/pods) listening on loopback");
    let board = watchers::WatchBoard::new(metrics.watches.clone());
    let (pod_watch, policy_watch) = watchers::register(&board, settings.uds_workloads());
    let watch_view = admin::WatchView { board: board.clone(), grace: Duration::from_secs(args.watch_grace_seconds) };
    let admin_state = AdminState::new(xds_bound.clone(), status_rx)
        .with_metrics(metrics.clone())
        .with_envoy(envoy)
        .with_watches(watch_view)
        .with_decisions(decisions)
        .with_kernel_gaps(kernel_gaps.clone());
    let debug_app = admin::debug_router(admin_state.clone());
    let admin_app = admin::router(admin_state);
    if let Some(probe_listener) = probe_listener {
        let (probe_app, probe_stop) = (admin_app.clone(), stop.clone());
        tokio::spawn(
            async move { aether_serve_policy::http::serve(probe_listener, probe_app, stopped(probe_stop)).await },
        );
    }
    let debug_stop = stop.clone();
    tokio::spawn(async move { aether_serve_policy::http::serve(debug_listener, debug_app, stopped(debug_stop)).await });
    tokio::spawn(async move { aether_serve_policy::http::serve(admin_listener, admin_app, stopped(stop)).await });

    let (tx, rx) = mpsc::channel::<Event>(1024);
    if let Some(mut updates) = netns_updates {
        let tx = tx.clone();
        tokio::spawn(async move {
            // Whatever has arrived goes to the driver as one event (one publish).
            while let Some(first) = updates.recv().await {
                let mut batch = vec![first];
                while let Ok(more) = updates.try_recv() {
                    batch.push(more);
                }
                if tx.send(Event::Netns(batch)).await.is_err() {
                    return;
                }
            }
        });
    }
    if let Some(mut changed) = socket_events {
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(uids) = changed.next().await {
                if tx.send(Event::SocketsChanged(uids)).await.is_err() {
                    return;
                }
            }
        });
    }
    if let Some(admin) = args.envoy_admin {
        let (ended_tx, mut ended) = mpsc::channel(1);
        crate::xds::stream_ends::spawn_watch(tracker.clone(), ended_tx);
        let to_loop = tx.clone();
        tokio::spawn(async move {
            while ended.recv().await.is_some() {
                if to_loop.send(Event::EnvoyStreamEnded).await.is_err() {
                    return;
                }
            }
        });
        let (failed_tx, mut failed) = mpsc::channel(16);
        crate::xds::bind_failures::spawn_watch(tracker, admin, failed_tx);
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(list) = failed.recv().await {
                if tx.send(Event::InboundBindFailed(list)).await.is_err() {
                    return;
                }
            }
        });
    }
    let loop_task = tokio::spawn(driver.run(rx));
    let (owner_tx, owner) = watch::channel(Owner::Unknown);
    match watchers::client(&board).await {
        Ok(client) => {
            if let Some((namespace, name)) = args.own_daemonset.clone() {
                tokio::spawn(watchers::owner::watch_owner(client.clone(), namespace, name, owner_tx));
            }
            recorder::spawn(client.clone(), &args.node_name, notice_rx, metrics.clone());
            for gap in kernel_gaps {
                let (reason, action) = (crate::kernel::GAP_REASON, crate::kernel::GAP_ACTION);
                recorder::spawn_node_warning(client.clone(), &args.node_name, reason, action, gap);
            }
            tokio::spawn(watchers::pods(client.clone(), args.node_name.clone(), tx.clone(), pod_watch));
            if settings.uds_workloads() {
                tokio::spawn(watchers::policies(client, tx.clone(), policy_watch));
            } else {
                tracing::info!("--uds-workloads=false: EndpointPolicies are not watched and every pod is TCP");
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "no Kubernetes client configuration; serving the state dir only");
            let _ = tx.send(Event::NoApiServer).await;
            // No watch can run: both fail from now on (and /readyz says so after the grace).
            pod_watch.failed_request(&e);
            if settings.uds_workloads() {
                policy_watch.failed_request(&e);
            }
            drop(notice_rx);
        }
    }
    spawn_recheck(tx, Duration::from_secs(args.recheck_seconds.max(1)));

    let result = xds_task.await;
    xds_bound.store(false, Ordering::Release);
    loop_task.abort();
    let drained = result.context("xDS server task")?.context("xDS server")?;
    let host =
        shutdown::host_state_at_exit(args.own_daemonset.is_some().then(|| *owner.borrow()), drained.clients_gone());
    shutdown::remove_health_socket(Path::new(&args.health_socket), host);
    // Pins are mounts on the host: they stay for an Envoy still serving, and go with the release.
    if let Some(pinner) = pinner {
        if host.remove {
            let n = pinner.retain(&std::collections::HashSet::new());
            tracing::info!(pin_dir = %pinner.dir().display(), removed = n, reason = host.why, "removed every socket pin");
            if let Some(owner) = pin_owner
                && let Err(e) = owner.remove()
            {
                tracing::warn!(pin_dir = %pinner.dir().display(), error = %e, "cannot remove the pin dir's claim file");
            }
        } else {
            tracing::info!(pin_dir = %pinner.dir().display(), reason = host.why, "socket pins stay");
        }
    }
    Ok(())
}

/// Claims the pin dir for this agent's DaemonSet ([`crate::pin_owner`]), waiting for a previous
/// agent of the same release up to `--shutdown-wait-seconds` + 30 s (its own exit wait, and then
/// some for the kubelet to stop it).
/// Renews the lease every [`crate::pin_owner::REFRESH`] for the process's life.
async fn claim_pin_dir(
    dir: &Path,
    args: &RunArgs,
    stop: &watch::Receiver<bool>,
) -> anyhow::Result<Arc<crate::pin_owner::PinOwner>> {
    std::fs::create_dir_all(dir).with_context(|| format!("--pin-dir {}", dir.display()))?;
    let me = args.own_daemonset.as_ref().map(|(ns, name)| format!("{ns}/{name}")).unwrap_or_default();
    let wait = Duration::from_secs(args.shutdown_wait_seconds + 30);
    let owner = Arc::new(crate::pin_owner::claim(dir, &me, wait, stop).await?);
    tracing::info!(pin_dir = %dir.display(), owner = %me, claim = %owner.path().display(), "claimed the pin dir");
    let lease = owner.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(crate::pin_owner::REFRESH);
        loop {
            every.tick().await;
            if let Err(e) = lease.refresh() {
                tracing::warn!(claim = %lease.path().display(), error = %e, "cannot renew the pin dir's claim");
            }
        }
    });
    Ok(owner)
}

fn log_budget(settings: &Settings) {
    match settings.budget() {
        Ok(b) if b.limit() == aether_crds::SocketLimit::Filesystem => tracing::info!(
            pods_dir = b.pods_dir(),
            socket_limit = %b.limit(),
            budget_bytes = b.bytes(),
            volume_max_bytes = aether_crds::udspath::VOLUME_NAME_MAX,
            file_max_bytes = aether_crds::udspath::NAME_MAX,
            uds_workloads = settings.uds_workloads(),
            "socket value limit: the file system's (Envoy dials only the pins), whatever the pods dir's length"
        ),
        Ok(b) => tracing::info!(
            pods_dir = b.pods_dir(),
            socket_limit = %b.limit(),
            budget_bytes = b.bytes(),
            uds_workloads = settings.uds_workloads(),
            "socket value budget"
        ),
        Err(e) => {
            tracing::error!(error = %e, "--kubelet-pods-dir gives no usable budget: EVERY POD IS DELIVERED OVER TCP")
        }
    }
}

/// Serves ADS on `listener` once the loop stops holding ([`Status::holding_xds`]) and the
/// resources the server would send hold the publication that completed the state
/// ([`Status::serve_from_publication`], [`PodSpecs::served_through`]), until `stop`. Until then
/// the socket is bound but nothing accepts: Envoy's connection waits in the listen backlog and
/// Envoy keeps its last config, instead of being offered fewer resources than a previous agent
/// served (the encoder task's debounce lags the loop: answering at once sent the rendering of the pod
/// list without the inbound listeners, and Envoy removed them for the 20 ms until the next one).
/// A stop while holding removes the socket file and ends nothing.
async fn serve_when_complete(
    listener: XdsListener,
    server: XdsServer,
    mut status: watch::Receiver<Status>,
    specs: PodSpecs,
    stop: watch::Receiver<bool>,
) -> Result<Drained, ServeError> {
    if status.borrow().holding_xds {
        tracing::info!("holding Envoy's ADS streams until the agent has a complete state to serve");
        let rendered = async {
            let through = status.wait_for(|s| !s.holding_xds).await.map(|s| s.serve_from_publication).unwrap_or(0);
            let mut served = specs.served_through();
            if tokio::time::timeout(RENDER_WAIT, served.wait_for(|n| *n >= through)).await.is_err() {
                tracing::warn!(through, served = *served.borrow(), wait = ?RENDER_WAIT,
                    "the encoder task has not caught up with the complete state; serving Envoy what it has");
            }
        };
        tokio::select! {
            _ = rendered => {}
            _ = stopped(stop.clone()) => {
                if let Some((path, id)) = listener.own_socket() {
                    crate::shutdown::remove_own_socket(&path, id);
                }
                return Ok(Drained { left_open: 0 });
            }
        }
    }
    serve_listener(listener, server, stopped(stop)).await
}

/// The longest a released hold waits for the encoder task (which renders within its debounce,
/// `--xds-debounce-ms`, plus the render itself) before serving anyway, with a warning.
const RENDER_WAIT: Duration = Duration::from_secs(10);

/// Sends [`Event::Recheck`] every `every` until the loop is gone.
fn spawn_recheck(tx: mpsc::Sender<Event>, every: Duration) {
    tokio::spawn(async move {
        let mut t = tokio::time::interval(every);
        t.tick().await;
        loop {
            t.tick().await;
            if tx.send(Event::Recheck).await.is_err() {
                return;
            }
        }
    });
}

/// A flag set once SIGTERM or SIGINT arrives. The handlers are installed before this returns,
/// so a signal right after start-up is not missed.
fn stop_on_signal() -> anyhow::Result<watch::Receiver<bool>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        tracing::info!("shutting down");
        let _ = tx.send(true);
    });
    Ok(rx)
}

/// Completes once `stop` is set (or its sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
