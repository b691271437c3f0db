//! The command line of `aether-webhook-certs`. Every flag can also be set from the environment
//! variable named in its help. [`dispatch`] runs the parsed subcommand and prints its outcome.
//!
//! The flags' doc comments are their `--help` text (clap), where placeholders such as
//! `<pod uid>` are meant literally, so rustdoc's HTML-tag check is off for this module.
#![allow(rustdoc::invalid_html_tags)]

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::bootstrap::{self, CaBundleOutcome, Options, SecretOutcome};
use crate::cleanup;
pub use crate::logging::{LogArgs, LogFormat, LogLevel};

/// Certificates for aether-controller's admission webhook.
#[derive(Parser, Debug)]
#[command(version = aether_process::build_info::VERSION_LINE, about)]
pub struct Cli {
    /// --log-format and --log-level.
    #[command(flatten)]
    pub log: LogArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Mint a new self-signed CA and a serving certificate signed by it, and write ca.crt,
    /// tls.crt and tls.key (0600) into --out-dir. Put ca.crt (base64) in the webhook's caBundle
    /// and point aether-controller's --tls-dir at the folder.
    Mint {
        /// Folder to write ca.crt, tls.crt and tls.key into (created if missing).
        #[arg(long, env = "AETHER_CERTS_OUT_DIR")]
        out_dir: PathBuf,
        /// A DNS name or IP address the serving certificate is valid for (repeatable), e.g. the
        /// webhook Service's DNS name, or 127.0.0.1 for a webhook registered by URL.
        #[arg(long = "name", env = "AETHER_CERTS_NAMES", value_delimiter = ',', required = true)]
        names: Vec<String>,
    },
    /// Create or reuse the kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt) for the webhook
    /// Service's DNS names, then set caBundle of every webhook of --webhook-config-name to the
    /// Secret's ca.crt if that configuration exists (a pre-install run finds none and succeeds).
    /// Idempotent: a usable Secret is reused; it is re-minted only when a file is missing or
    /// unparsable, the key does not match, a DNS name is missing, or it expires within 30 days.
    /// Uses the in-cluster ServiceAccount, or $KUBECONFIG.
    Bootstrap {
        /// Namespace of the Secret and the webhook Service.
        #[arg(long, env = "AETHER_CERTS_NAMESPACE")]
        namespace: String,
        /// Name of the kubernetes.io/tls Secret to create or reuse.
        #[arg(long, env = "AETHER_CERTS_SECRET_NAME")]
        secret_name: String,
        /// Name of the webhook Service; the certificate names <svc>.<ns>.svc and
        /// <svc>.<ns>.svc.cluster.local.
        #[arg(long, env = "AETHER_CERTS_SERVICE_NAME")]
        service_name: String,
        /// ValidatingWebhookConfiguration whose caBundle is set (omit to skip that step).
        #[arg(long, env = "AETHER_CERTS_WEBHOOK_CONFIG_NAME")]
        webhook_config_name: Option<String>,
        /// Validity of a newly minted CA and certificate, in days (more than the 30-day renewal
        /// window).
        #[arg(long, default_value_t = crate::DEFAULT_VALIDITY_DAYS, value_parser = clap::value_parser!(u32).range(31..=36500), env = "AETHER_CERTS_VALIDITY_DAYS")]
        validity_days: u32,
    },
    /// Delete the Secret that bootstrap created. The chart runs this as a post-delete hook Job
    /// after `helm uninstall`: the Secret is not part of the release, so Helm leaves it behind.
    /// Only a Secret labelled app.kubernetes.io/managed-by=aether-webhook-certs (bootstrap labels
    /// the Secret it creates) is deleted; one without that label, e.g. your own Secret of that
    /// name, is left in place. Exits 0 when the Secret was deleted, is already gone, or is not
    /// ours; non-zero, naming the Secret and the cause, on any other API error (the Job retries).
    /// Needs get and delete on that Secret. Uses the in-cluster ServiceAccount, or $KUBECONFIG.
    Cleanup {
        /// Namespace of the Secret.
        #[arg(long, env = "AETHER_CERTS_NAMESPACE")]
        namespace: String,
        /// Name of the kubernetes.io/tls Secret bootstrap created (its --secret-name).
        #[arg(long, env = "AETHER_CERTS_SECRET_NAME")]
        secret_name: String,
    },
}

/// Runs a subcommand to its end, printing what it did on standard output.
///
/// # Errors
/// When it fails; `main` returns the error (printed on standard error, exit code 1).
pub fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Mint { out_dir, names } => {
            let bundle = crate::mint(&names)?;
            crate::write_dir(&bundle, &out_dir)?;
            println!("wrote {}/{{ca.crt,tls.crt,tls.key}} for {}", out_dir.display(), names.join(", "));
        }
        Command::Bootstrap { namespace, secret_name, service_name, webhook_config_name, validity_days } => {
            let opts = Options { namespace, secret_name, service_name, webhook_config_name, validity_days };
            let rt = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
            let report = rt.block_on(async {
                let client = kube::Client::try_default().await.context("cannot build a Kubernetes client")?;
                anyhow::Ok(bootstrap::run(client, &opts).await?)
            })?;
            let secret = format!("Secret {}/{}", opts.namespace, opts.secret_name);
            match &report.secret {
                SecretOutcome::Created => println!("{secret}: created with a new CA and serving certificate"),
                SecretOutcome::Reused => println!("{secret}: reused (certificate valid for the Service names)"),
                SecretOutcome::Renewed(why) => println!("{secret}: re-minted ({why})"),
            }
            let config = opts.webhook_config_name.as_deref().unwrap_or_default();
            match report.ca_bundle {
                CaBundleOutcome::NotRequested => println!("caBundle: not requested (no --webhook-config-name)"),
                CaBundleOutcome::ConfigMissing => println!(
                    "ValidatingWebhookConfiguration {config} does not exist yet; caBundle not set (run again after install)"
                ),
                CaBundleOutcome::AlreadyCurrent => {
                    println!("ValidatingWebhookConfiguration {config}: caBundle already equals the Secret's ca.crt")
                }
                CaBundleOutcome::Patched(n) => {
                    println!("ValidatingWebhookConfiguration {config}: caBundle set on {n} webhook(s)")
                }
            }
        }
        Command::Cleanup { namespace, secret_name } => {
            let rt = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
            let outcome = rt.block_on(async {
                let client = kube::Client::try_default().await.context("cannot build a Kubernetes client")?;
                anyhow::Ok(cleanup::run(client, &namespace, &secret_name).await?)
            })?;
            let secret = format!("Secret {namespace}/{secret_name}");
            match outcome {
                cleanup::Outcome::Deleted => println!("{secret}: deleted (created by bootstrap)"),
                cleanup::Outcome::AlreadyGone => println!("{secret}: not found, nothing to do"),
                cleanup::Outcome::NotOurs(why) => println!("{secret}: not ours, left in place ({why})"),
            }
        }
    }
    Ok(())
}
