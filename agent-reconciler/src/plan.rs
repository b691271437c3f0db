//! `aether-agent plan`: offline, what each managed pod would get and why. This module reads the
//! files and prints; the plan itself is the core's pure [`aether_agent_core::plan`].

use std::path::Path;
use std::process::ExitCode;

use aether_crds::manifests;
use serde_json::Value;

pub use aether_agent_core::plan::{InputError, PodPlan, plan, render_text};

use crate::cli::flags::{Output, PlanArgs};
use crate::fold::Settings;

/// `aether-agent plan`: reads `--pods` and `--policies`, plans, prints. Exit code 0, or 2 (the
/// reason on standard error) for input that cannot be read or parsed, or both files on stdin.
/// An unusable `--kubelet-pods-dir` is a warning: every pod is then planned over TCP.
/// `--socket-limit filesystem` plans as an agent with `--pin-dir` would decide (no pins offline).
pub fn command(args: &PlanArgs) -> ExitCode {
    let settings = Settings::with_rules(args.delivery.rules(), args.delivery.uds_workloads);
    if let Err(e) = settings.budget() {
        eprintln!("warning: --kubelet-pods-dir: {e}");
    }
    let stdin = Path::new("-");
    if args.pods == stdin && args.policies.as_deref() == Some(stdin) {
        eprintln!("error: --pods and --policies cannot both read standard input (\"-\")");
        return ExitCode::from(2);
    }
    let pods = match read_yaml(&args.pods) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let policies = match args.policies.as_deref().map(read_yaml).transpose() {
        Ok(d) => d.unwrap_or_default(),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match plan(&pods, &policies, &settings) {
        Ok(plans) => {
            match args.output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&plans).expect("plans serialize")),
                Output::Text => print!("{}", render_text(&plans)),
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Reads the documents of one YAML file, or of standard input when `path` is `-`, split by
/// [`aether_crds::manifests::documents`] (`List` items expanded, empty documents dropped).
///
/// # Errors
/// [`InputError`] when the file cannot be read or is not YAML.
pub fn read_yaml(path: &Path) -> Result<Vec<Value>, InputError> {
    let err = |reason: String| InputError { path: path.display().to_string(), reason };
    let text =
        if path == Path::new("-") { std::io::read_to_string(std::io::stdin()) } else { std::fs::read_to_string(path) }
            .map_err(|e| err(e.to_string()))?;
    manifests::documents(&text).map_err(|e| err(e.to_string()))
}
