//! Dispatch: runs one subcommand, prints its output, returns the exit code.
//!
//! Exit codes: `why` 0 with an answer (live or offline), 1 when the pod cannot be read or the
//! kubeconfig is unusable; `validate` 0 all allowed, 1 any denied, 2 unreadable input (as
//! `aether-controller validate`); `budget` 0, or 1 when a given value does not fit.

use std::process::ExitCode;

use clap::CommandFactory;

use crate::cli::{Cli, Command, Output, ValidateArgs};

/// Runs `cli`.
pub fn run(cli: Cli) -> ExitCode {
    match &cli.command {
        Command::Why(args) => {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("error: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let answered = runtime.block_on(async {
                let (client, ns) =
                    crate::cluster::client(cli.kubeconfig.as_deref(), cli.context.as_deref(), cli.namespace.as_deref())
                        .await?;
                crate::why::why(&client, &ns, &args.pod, args).await
            });
            match answered {
                Ok(a) => {
                    print!("{}", crate::output::format(&a, cli.output, || crate::answer::render_text(&a)));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Validate(args) => validate(args, cli.output),
        Command::Budget(args) => {
            let r = crate::budget::report(&args.rules.rules(), &args.rules.pods_dir, &args.values);
            print!("{}", crate::output::format(&r, cli.output, || crate::budget::render_text(&r)));
            if r.values.iter().all(|v| v.fits) { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Command::Completion { shell } => {
            clap_complete::generate(*shell, &mut Cli::command(), "kubectl-aether", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
    }
}

/// `validate`: `aether_controller::offline` (the webhook's decision) on the files.
fn validate(args: &ValidateArgs, output: Output) -> ExitCode {
    use aether_controller::offline;
    let rules = args.rules.rules();
    let budget = match rules.budget() {
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
    let outcomes = offline::decide_all(&docs, budget);
    print!("{}", crate::output::format(&outcomes, output, || offline::render_plain(&outcomes)));
    ExitCode::from(offline::exit_code(&outcomes) as u8)
}
