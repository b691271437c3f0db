//! `aether-pause`: the pod sandbox ("pause") process of the real-node tests, PID 1 of every pod
//! sandbox there (image `localhost/aether/pause:dev`, built by `tests/harness/images.sh`). It
//! holds the pod's namespaces open by doing nothing until SIGTERM or SIGINT, then exits 0.
//!
//! Unlike registry.k8s.io/pause it does not reap zombies (that needs `waitpid`, i.e. unsafe
//! code): pods with `shareProcessNamespace: true` would keep their orphans' zombies. `--help`
//! prints this summary and exits 0, so an image check can run it without a signal.

use tokio::signal::unix::{SignalKind, signal};

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    if let Some(arg) = std::env::args().nth(1) {
        eprintln!("usage: aether-pause  (pod sandbox PID 1: waits for SIGTERM or SIGINT, exits 0)");
        std::process::exit(if arg == "--help" || arg == "-h" { 0 } else { 2 });
    }
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
