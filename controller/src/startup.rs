//! `aether-controller run` from its flags: the status writer's kube configuration and Lease
//! (read here, no API call made), the TLS files, the tokio runtime, and the exit code.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use crate::cli::flags::RunArgs;
use crate::lease::LeaseConfig;
use crate::server::{self, RunConfig, TlsFiles};
use crate::status_writer::StatusWriterConfig;

/// The target of the log lines below: the binary's crate, as when they were written in `main`,
/// so `RUST_LOG=aether_controller=...` still selects them.
const LOG_TARGET: &str = "aether_controller";

/// Serves until SIGTERM/SIGINT. Exit code 0 after a clean shutdown; 1 (the error logged) when
/// the status writer's configuration is unusable or serving fails.
pub fn run(args: RunArgs) -> ExitCode {
    if rustls::crypto::ring::default_provider().install_default().is_err() {
        tracing::debug!(target: LOG_TARGET, "a rustls crypto provider was already installed");
    }
    let rt = tokio::runtime::Runtime::new().expect("starting the tokio runtime");
    let writer = match rt.block_on(status_writer(&args)) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(target: LOG_TARGET, "{e:#}");
            return ExitCode::FAILURE;
        }
    };
    let reload = args.tls_dir.is_some().then(|| Duration::from_secs(args.tls_reload_seconds));
    let (rules, listeners) = (args.pods_dir.rules(), args.listeners());
    let tls = match (args.tls_dir, args.tls_cert, args.tls_key) {
        (Some(dir), _, _) => {
            TlsFiles { cert: dir.join(aether_webhook_certs::CERT_FILE), key: dir.join(aether_webhook_certs::KEY_FILE) }
        }
        (None, Some(cert), Some(key)) => TlsFiles { cert, key },
        _ => unreachable!("clap requires --tls-dir or --tls-cert with --tls-key"),
    };
    let cfg = RunConfig {
        webhook_addr: args.webhook_addr,
        admin_addr: args.admin_addr,
        tls,
        rules,
        listeners,
        max_body_bytes: args.max_body_bytes,
        status_writer: writer,
        probe: args.probe,
    };
    let served = match reload {
        Some(poll) => rt.block_on(server::run_reloading(cfg, poll)),
        None => rt.block_on(server::run(cfg)),
    };
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(target: LOG_TARGET, "{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The status writer's settings: the kube configuration (no API call is made here) and the Lease.
async fn status_writer(args: &RunArgs) -> anyhow::Result<Option<StatusWriterConfig>> {
    if !args.status_writer {
        return Ok(None);
    }
    let how_to_fix = "the status writer needs the Kubernetes API: run in a cluster with a service account, set \
                      KUBECONFIG or --kubeconfig, or pass --status-writer=false to serve only the webhook";
    let kube = match &args.kubeconfig {
        None => {
            kube::Config::infer().await.with_context(|| format!("no Kubernetes configuration found; {how_to_fix}"))?
        }
        Some(paths) => {
            let mut merged: Option<kube::config::Kubeconfig> = None;
            for path in std::env::split_paths(paths).filter(|p| !p.as_os_str().is_empty()) {
                let one = kube::config::Kubeconfig::read_from(&path)
                    .with_context(|| format!("cannot read kubeconfig {}; {how_to_fix}", path.display()))?;
                merged = Some(match merged {
                    None => one,
                    Some(m) => m.merge(one).context("cannot merge the kubeconfig files")?,
                });
            }
            let merged = merged.with_context(|| format!("--kubeconfig/KUBECONFIG names no file; {how_to_fix}"))?;
            kube::Config::from_custom_kubeconfig(merged, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("unusable kubeconfig {}; {how_to_fix}", paths.display()))?
        }
    };
    let namespace = args.lease_namespace.clone().unwrap_or_else(|| kube.default_namespace.clone());
    let holder = args
        .lease_holder
        .clone()
        .or_else(|| std::env::var("POD_NAME").ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("aether-controller-{}", std::process::id()));
    Ok(Some(StatusWriterConfig { kube, lease: LeaseConfig::new(&args.lease_name, namespace, holder) }))
}
