//! Section 5's row "the admin under a scrape flood" (why: each request to Envoy's stats listener
//! walks every stat on Envoy's main thread, which also applies xDS updates and answers the
//! launcher's probes; before the listener was rate-limited, 16 looping clients pushed the admin's
//! latency from milliseconds to seconds).
//!
//! What runs, on the Envoy of section 5's cell at the agent's `--max-clusters` and the chart's
//! worker count, started with the chart's `stats` listener (`aether_fixtures`, the chart's
//! bootstrap): the admin's `/ready` timed every 250 ms for 10 s while nothing else asks Envoy
//! anything, then the same for 20 s while [`aether_tests::scrape_flood`] runs as many HTTP/1.1
//! clients as the listener's connection cap, each scraping back to back; and the time of one
//! scrape through the listener, quiet. The flood's answers are tallied by status.

use std::time::{Duration, Instant};

use aether_fixtures::envoy::{CHART_STATS_SCRAPES_PER_MINUTE, STATS_BURST, STATS_MAX_CONNECTIONS};
use aether_tests::scrape_flood::{Tally, flood};

use crate::stats::{md_table, percentile, show_count};

const PROBE_EVERY: Duration = Duration::from_millis(250);
const QUIET: Duration = Duration::from_secs(10);
const FLOOD: Duration = Duration::from_secs(20);

/// What one flood measured, in seconds where a time.
pub struct Figures {
    /// The admin `/ready` latencies with no flood.
    pub quiet: Vec<f64>,
    /// The same during the flood.
    pub flooded: Vec<f64>,
    /// Probes that failed or did not answer 200 during the flood.
    pub probes_failed: usize,
    /// Quiet scrapes through the listener, each.
    pub scrape: Vec<f64>,
    /// Bytes of one scrape.
    pub scrape_bytes: usize,
    pub tally: Tally,
}

/// Runs the quiet probes, three quiet scrapes through the `stats` listener on `stats_port`, then
/// the flood, against the Envoy whose admin is 127.0.0.1:`admin_port`.
///
/// # Errors
/// When a quiet probe or scrape fails (the flood's failures are counted, not errors).
pub fn measure(admin_port: u16, stats_port: u16) -> anyhow::Result<Figures> {
    let admin = reqwest::blocking::Client::builder().timeout(Duration::from_secs(30)).build()?;
    let ready = || -> anyhow::Result<f64> {
        let asked = Instant::now();
        let resp = admin.get(format!("http://127.0.0.1:{admin_port}/ready")).send()?;
        anyhow::ensure!(resp.status() == 200, "admin /ready: {}", resp.status());
        resp.bytes()?;
        Ok(asked.elapsed().as_secs_f64())
    };
    let mut quiet = Vec::new();
    let until = Instant::now() + QUIET;
    while Instant::now() < until {
        quiet.push(ready()?);
        std::thread::sleep(PROBE_EVERY);
    }
    let mut scrape = Vec::new();
    let mut scrape_bytes = 0;
    {
        // Its own client, dropped before the flood: its kept-alive connection would hold a place.
        let listener = reqwest::blocking::Client::builder().timeout(Duration::from_secs(60)).build()?;
        for _ in 0..3 {
            let asked = Instant::now();
            let resp = listener.get(format!("http://127.0.0.1:{stats_port}/stats/prometheus")).send()?;
            anyhow::ensure!(resp.status() == 200, "a quiet scrape: {}", resp.status());
            scrape_bytes = resp.bytes()?.len();
            scrape.push(asked.elapsed().as_secs_f64());
        }
    }
    let (tally, probes) = flood("127.0.0.1", stats_port, STATS_MAX_CONNECTIONS, FLOOD, PROBE_EVERY, ready)?;
    let flooded: Vec<f64> = probes.iter().filter_map(|p| p.as_ref().ok().copied()).collect();
    Ok(Figures { probes_failed: probes.len() - flooded.len(), quiet, flooded, scrape, scrape_bytes, tally })
}

/// The row's text for `report`: a table and a line, for `clusters` clusters at `workers` workers.
pub fn report(f: &Figures, clusters: usize, workers: usize) -> String {
    let ms = |v: &[f64], p: f64| percentile(v, p).map_or("n/a".to_owned(), |s| format!("{:.1} ms", s * 1e3));
    let max = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::max);
    let rows = vec![
        vec![
            "quiet".to_owned(),
            f.quiet.len().to_string(),
            ms(&f.quiet, 50.0),
            ms(&f.quiet, 99.0),
            format!("{:.1} ms", max(&f.quiet) * 1e3),
            "0".to_owned(),
        ],
        vec![
            format!("{STATS_MAX_CONNECTIONS} clients scraping back to back"),
            f.flooded.len().to_string(),
            ms(&f.flooded, 50.0),
            ms(&f.flooded, 99.0),
            format!("{:.1} ms", max(&f.flooded) * 1e3),
            f.probes_failed.to_string(),
        ],
    ];
    let t = &f.tally;
    format!(
        "### The admin under a scrape flood\n\nEnvoy's admin `/ready` every {} ms, quiet for {} s then during a {} s flood \
         of its `stats` listener ({} clusters, {workers} workers; the chart's rate limit: a bucket of {STATS_BURST}, {} \
         a minute, one admin scrape at a time with one waiting). One quiet scrape through the listener: {} ({} bytes, \
         median of {}).\n\n{}\nThe flood sent {} requests: {} served, {} refused by the rate limit (429), {} by the admin \
         cluster's circuit breakers (503), {} failed otherwise.\n",
        PROBE_EVERY.as_millis(),
        QUIET.as_secs(),
        FLOOD.as_secs(),
        show_count(clusters as f64),
        CHART_STATS_SCRAPES_PER_MINUTE,
        ms(&f.scrape, 50.0),
        show_count(f.scrape_bytes as f64),
        f.scrape.len(),
        md_table(&["admin /ready", "probes", "p50", "p99", "max", "failed"], &rows),
        show_count(t.total() as f64),
        show_count(t.served as f64),
        show_count(t.rate_limited as f64),
        show_count(t.overflowed as f64),
        show_count(t.other as f64),
    )
}
