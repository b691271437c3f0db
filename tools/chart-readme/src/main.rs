//! `chart-readme`: writes `charts/<chart>/README.md` from each chart's `Chart.yaml`,
//! `values.yaml` and `values.schema.json` (`make chart-docs`), or with `--check` only says which
//! README differs from what it would write (exit 1). Exit 2: a chart's files cannot be read or
//! parsed, or a value has no `description` in its schema.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use aether_chart_readme as readme;
use clap::Parser;

/// Generate the chart READMEs from values.yaml and values.schema.json.
#[derive(Parser)]
#[command(name = "chart-readme", version)]
struct Args {
    /// Compare instead of writing: exit 1 and name every README that differs.
    #[arg(long)]
    check: bool,
    /// Chart directories (default: charts/aether and charts/aether-crds of this repository).
    charts: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let charts = if args.charts.is_empty() {
        let root = repo_root();
        vec![root.join("charts/aether"), root.join("charts/aether-crds")]
    } else {
        args.charts
    };
    let mut drifted = false;
    for dir in charts {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name)).map_err(|e| format!("{}: {e}", dir.join(name).display()))
        };
        let text = match (read("Chart.yaml"), read("values.yaml"), read("values.schema.json")) {
            (Ok(chart_yaml), Ok(values_yaml), Ok(schema_json)) => readme::render(&readme::Chart {
                chart_yaml: &chart_yaml,
                values_yaml: &values_yaml,
                schema_json: &schema_json,
            })
            .map_err(|e| format!("{}: {e}", dir.display())),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => Err(e),
        };
        let text = match text {
            Ok(t) => t,
            Err(e) => {
                eprintln!("chart-readme: {e}");
                return ExitCode::from(2);
            }
        };
        let path = dir.join("README.md");
        if args.check {
            if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                eprintln!("chart-readme: {} differs from what `make chart-docs` writes", path.display());
                drifted = true;
            }
        } else if let Err(e) = std::fs::write(&path, text) {
            eprintln!("chart-readme: {}: {e}", path.display());
            return ExitCode::from(2);
        } else {
            println!("wrote {}", path.display());
        }
    }
    if drifted { ExitCode::from(1) } else { ExitCode::SUCCESS }
}

/// The repository root: this crate lives in `tools/chart-readme`.
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).expect("tools/chart-readme has a repo root").to_path_buf()
}
