//! `aether-webhook-certs`: mints the webhook's CA and serving certificate.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Certificates for aether-controller's admission webhook.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Mint { out_dir, names } => {
            let bundle = aether_webhook_certs::mint(&names)?;
            aether_webhook_certs::write_dir(&bundle, &out_dir)?;
            println!("wrote {}/{{ca.crt,tls.crt,tls.key}} for {}", out_dir.display(), names.join(", "));
        }
    }
    Ok(())
}
