//! aether-agent entry point: parse flags, set up logging, run the subcommand.

use std::process::ExitCode;

use aether_agent_reconciler::cli::{Cli, Command, LogFormat, Output};
use aether_agent_reconciler::{Settings, agent, plan};
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
        Command::Plan(args) => {
            let settings = Settings::new(&args.delivery.kubelet_pods_dir, args.delivery.uds_workloads);
            if let Err(e) = settings.budget() {
                eprintln!("warning: --kubelet-pods-dir: {e}");
            }
            let stdin = std::path::Path::new("-");
            if args.pods == stdin && args.policies.as_deref() == Some(stdin) {
                eprintln!("error: --pods and --policies cannot both read standard input (\"-\")");
                return ExitCode::from(2);
            }
            let read = |p: &std::path::Path| plan::read_yaml(p);
            let pods = match read(&args.pods) {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            let policies = match args.policies.as_deref().map(read).transpose() {
                Ok(d) => d.unwrap_or_default(),
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            match plan::plan(&pods, &policies, &settings) {
                Ok(plans) => {
                    match args.output {
                        Output::Json => println!("{}", serde_json::to_string_pretty(&plans).expect("plans serialize")),
                        Output::Text => print!("{}", plan::render_text(&plans)),
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Run(args) => {
            if rustls::crypto::ring::default_provider().install_default().is_err() {
                tracing::debug!("a rustls crypto provider was already installed");
            }
            let rt = tokio::runtime::Runtime::new().expect("starting the tokio runtime");
            match rt.block_on(agent::run(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
