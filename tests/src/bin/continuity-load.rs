//! `continuity-load --target IP:PORT --expect NAME [--seconds N]`: the continuity client
//! (`aether_tests::continuity`) from the command line, for measuring by hand what an event (an
//! agent or proxy restart, an upgrade) does to traffic through the node's Envoy. It runs the
//! field reports' load (50 new-connection requests per second, 3 keep-alive connections, no
//! retries) for `--seconds` or until Ctrl-C, then prints one summary line and each failure's
//! time and kind. Exit 0 when nothing failed, 1 otherwise.

use std::net::SocketAddr;
use std::time::Duration;

use aether_tests::continuity::{Load, run};
use clap::Parser;

/// Steady load through a Service, counting every failed request (no retries).
#[derive(Parser)]
struct Args {
    /// Where to connect: a Service's ClusterIP and port, or a pod IP and port.
    #[arg(long)]
    target: SocketAddr,
    /// A 200 counts only when its body contains this (the expected responder's name).
    #[arg(long)]
    expect: String,
    /// The request path.
    #[arg(long, default_value = "/")]
    path: String,
    /// How long to run, in seconds; 0: until Ctrl-C.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// New-connection requests per second.
    #[arg(long, default_value_t = 50)]
    rate: u32,
    /// Keep-alive connections (one request each every 100 ms).
    #[arg(long, default_value_t = 3)]
    keepalive: usize,
    /// Bound on one request (connect plus answer), in milliseconds.
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let load = Load {
        rate: args.rate,
        keepalive: args.keepalive,
        timeout: Duration::from_millis(args.timeout_ms),
        ..Load::field(args.target, &args.path, &args.expect)
    };
    let seconds = args.seconds;
    let stop = async move {
        if seconds == 0 {
            let _ = tokio::signal::ctrl_c().await;
        } else {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(seconds)) => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
    };
    let report = run(&load, stop).await;
    println!("{}", report.summary());
    for o in report.requests.iter().filter(|o| o.failure.is_some()) {
        let late = o.late.map(|l| format!(": {}", l.describe())).unwrap_or_default();
        println!(
            "  +{:.3} s {:?}{late}",
            o.at.as_secs_f64(),
            o.failure.unwrap_or(aether_tests::continuity::Failure::Other)
        );
    }
    for (i, k) in report.keepalive.iter().enumerate() {
        match k.cut {
            Some((at, why)) => {
                println!("  keep-alive {i}: cut at +{:.3} s ({why:?}) after {} requests", at.as_secs_f64(), k.served)
            }
            None => println!(
                "  keep-alive {i}: no request lost, {} requests ({} connections ended announced, {} closed while idle)",
                k.served, k.announced, k.closed_idle
            ),
        }
    }
    if report.failed() == 0 && report.keepalive.iter().all(|k| k.cut.is_none()) {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
