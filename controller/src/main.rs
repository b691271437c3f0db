//! aether-controller entry point: parse flags, set up logging, run the subcommand.

use std::process::ExitCode;
use std::time::Duration;

use aether_controller::cli::{Cli, Command, LogFormat, Output};
use aether_controller::server::{RunConfig, TlsFiles};
use aether_controller::{offline, server};
use clap::Parser;

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Plain => builder.init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Command::Crd => {
            print!("{}", aether_crds::crd_yaml());
            ExitCode::SUCCESS
        }
        Command::Validate(args) => {
            let budget = match aether_crds::Budget::new(&args.pods_dir.kubelet_pods_dir) {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("error: --kubelet-pods-dir: {e}");
                    return ExitCode::from(2);
                }
            };
            let docs = match offline::read_documents(&args.files) {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            let outcomes = offline::decide_all(&docs, &budget);
            match args.output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&outcomes).expect("outcomes serialize")),
                Output::Text => print!("{}", offline::render_plain(&outcomes)),
            }
            ExitCode::from(offline::exit_code(&outcomes) as u8)
        }
        Command::Run(args) => {
            if rustls::crypto::ring::default_provider().install_default().is_err() {
                tracing::debug!("a rustls crypto provider was already installed");
            }
            let reload = args.tls_dir.is_some().then(|| Duration::from_secs(args.tls_reload_seconds));
            let tls = match (args.tls_dir, args.tls_cert, args.tls_key) {
                (Some(dir), _, _) => TlsFiles {
                    cert: dir.join(aether_webhook_certs::CERT_FILE),
                    key: dir.join(aether_webhook_certs::KEY_FILE),
                },
                (None, Some(cert), Some(key)) => TlsFiles { cert, key },
                _ => unreachable!("clap requires --tls-dir or --tls-cert with --tls-key"),
            };
            let cfg = RunConfig {
                webhook_addr: args.webhook_addr,
                admin_addr: args.admin_addr,
                tls,
                kubelet_pods_dir: args.pods_dir.kubelet_pods_dir,
                max_body_bytes: args.max_body_bytes,
            };
            let rt = tokio::runtime::Runtime::new().expect("starting the tokio runtime");
            let served = match reload {
                Some(poll) => rt.block_on(server::run_reloading(cfg, poll)),
                None => rt.block_on(server::run(cfg)),
            };
            match served {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
