//! Section 3c of `make bench`: a pod added or removed → the health gateway answering for it on a
//! keep-alive connection opened before the change (docs/design-notes.md, "Health gateway without
//! listener churn").
//!
//! The release `aether-agent` watching the bench's kube-apiserver, a real Envoy on its ADS, and
//! one HTTP/1.1 connection to the gateway socket (`--health-socket`) opened before the first pod
//! exists and used for every request. Each add creates a managed pod on the agent's node through
//! the API (no kubelet: the pod never gets an IP, so the agent lists its health cluster as
//! waiting and the gateway answers 503, not 404); each removal deletes one (grace period 0).
//! Envoy's own counters show what the churn did to the listener and the connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use aether_fixtures::{Envoy, pod};
use aether_tests::{ControlPlane, envoy_bin};
use anyhow::{Context, bail, ensure};

use crate::api_client::api_client;
use crate::processes::workspace_bin;
use crate::stats::{Spread, md_table, percentile, show_secs};
use crate::{Goal, Opts, Report};

const NS: &str = "bench-gw";
const NODE: &str = "bench-gw-node";
/// How long one add or removal may take to show before the run fails.
const STEP: Duration = Duration::from_secs(30);
/// The gateway's HTTP stat prefix and Envoy's listener counters the churn must not move.
const STATS: [&str; 6] = [
    "listener_manager.listener_modified",
    "listener_manager.listener_in_place_updated",
    "listener_manager.total_filter_chains_draining",
    "listener_manager.total_listeners_draining",
    "http.aether_health.downstream_cx_total",
    "extension_config_discovery.http_filter.aether_health_checks.update_success",
];

/// One HTTP/1.1 connection to the gateway socket, kept for the whole section: a response that
/// ends it (EOF or `Connection: close`) fails the run instead of reconnecting.
struct KeepAlive {
    reader: BufReader<UnixStream>,
}

impl KeepAlive {
    fn open(socket: &Path) -> anyhow::Result<KeepAlive> {
        let stream = UnixStream::connect(socket).with_context(|| format!("connecting to {}", socket.display()))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(KeepAlive { reader: BufReader::new(stream) })
    }

    /// `GET path` on this connection: the status.
    fn get(&mut self, path: &str) -> anyhow::Result<u16> {
        write!(self.reader.get_mut(), "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n")?;
        let mut line = String::new();
        ensure!(self.reader.read_line(&mut line)? > 0, "the gateway closed the kept connection");
        let status = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).context("no status line")?;
        let (mut length, mut close) = (0usize, false);
        loop {
            line.clear();
            ensure!(self.reader.read_line(&mut line)? > 0, "the gateway closed the kept connection mid-response");
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').unwrap_or((header, ""));
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().context("Content-Length")?;
            }
            close |= name.eq_ignore_ascii_case("connection") && value.trim().eq_ignore_ascii_case("close");
        }
        let mut body = vec![0u8; length];
        self.reader.read_exact(&mut body)?;
        ensure!(!close, "the gateway answered {status} with `Connection: close`: the kept connection ends");
        Ok(status)
    }

    /// Polls `path` (every ~0.2 ms) until `done(status)`; the instant it first was.
    fn until(&mut self, path: &str, done: impl Fn(u16) -> bool) -> anyhow::Result<Instant> {
        let deadline = Instant::now() + STEP;
        loop {
            let status = self.get(path)?;
            let now = Instant::now();
            if done(status) {
                return Ok(now);
            }
            ensure!(now < deadline, "GET {path} still {status} after {} s", STEP.as_secs());
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// The section: `opts.changes` pods added one by one, then removed one by one.
pub(crate) fn section_health_gateway(r: &mut Report, opts: &Opts, cp: &ControlPlane) -> anyhow::Result<()> {
    let work = tempfile::Builder::new().prefix("aebg").tempdir_in("/tmp")?;
    let pods = work.path().join("pods");
    std::fs::create_dir_all(&pods)?;
    cp.kubectl_ok(&["create", "namespace", NS])?;
    cp.kubectl_ok(&["create", "serviceaccount", "-n", NS, "app"])?;
    let agent_bin = workspace_bin("aether-agent")?;
    let (agent, xds, health) = crate::repin::start_agent(cp, NODE, &agent_bin, work.path(), None, "health gateway")?;
    let envoy_dir = work.path().join("envoy");
    std::fs::create_dir_all(&envoy_dir)?;
    let mut envoy = Envoy::builder(&xds, NODE, &envoy_dir).binary(envoy_bin()?).start()?;
    envoy.wait_ready()?;
    let deadline = Instant::now() + STEP;
    while !health.exists() {
        ensure!(Instant::now() < deadline, "Envoy never bound the gateway socket: {}", envoy.log_tail());
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut conn = KeepAlive::open(&health)?;
    let name = |i: usize| format!("gw-{i}");
    let healthz = |i: usize| format!("/healthz/health_{NS}_gw-{i}");
    ensure!(conn.get(&healthz(0))? == 404, "a pod that does not exist yet is not answered 404");
    let stat = |envoy: &Envoy, s: &str| envoy.stat(s).with_context(|| format!("Envoy stat {s}"));
    let before = STATS.iter().map(|s| stat(&envoy, s)).collect::<anyhow::Result<Vec<u64>>>()?;

    let (api, server) = api_client(cp)?;
    let collection = format!("{server}/api/v1/namespaces/{NS}/pods");
    let (mut adds, mut removals) = (Vec::new(), Vec::new());
    for i in 0..opts.changes {
        let manifest = pod(NS, &name(i)).node(NODE).sa("app").container("app", "registry.example/app:bench").json();
        let t0 = Instant::now();
        let resp = api.post(&collection).json(&manifest).send()?;
        ensure!(resp.status().is_success(), "create: {} {}", resp.status(), resp.text().unwrap_or_default());
        let answered = conn
            .until(&healthz(i), |s| s != 404)
            .with_context(|| std::fs::read_to_string(&agent.log).unwrap_or_default())?;
        adds.push((answered - t0).as_secs_f64());
    }
    for i in 0..opts.changes {
        let t0 = Instant::now();
        let resp = api.delete(format!("{collection}/{}?gracePeriodSeconds=0", name(i))).send()?;
        ensure!(resp.status().is_success(), "delete: {} {}", resp.status(), resp.text().unwrap_or_default());
        removals.push((conn.until(&healthz(i), |s| s == 404)? - t0).as_secs_f64());
    }
    let after = STATS.iter().map(|s| stat(&envoy, s)).collect::<anyhow::Result<Vec<u64>>>()?;
    if let Some(status) = envoy.try_wait()? {
        bail!("Envoy exited ({status}) during the section: {}", envoy.log_tail());
    }
    drop(conn);
    drop(envoy);
    drop(agent);

    let delta = |k: usize| after[k].saturating_sub(before[k]);
    let (modified, in_place, draining_chains, draining_listeners, connections, ecds) =
        (delta(0), delta(1), after[2], after[3], after[4], delta(5));
    r.line("### 3c. Health gateway: a pod added or removed → answered on an open keep-alive connection\n");
    r.line(&format!(
        "The release `aether-agent` (default flags) watching the bench's kube-apiserver, a real \
         Envoy on its ADS, and one HTTP/1.1 keep-alive connection to the gateway socket opened before the first pod \
         exists; every request below goes over it (a close would fail the run). Each of {n} adds creates a managed \
         pod on the agent's node with one API write (no kubelet: the pod never gets an IP, so its health cluster is \
         listed as waiting and the gateway answers 503); each of {n} removals deletes one (grace period 0). The \
         interval runs from just before the write to the first `GET /healthz/health_{NS}_<pod>` on the kept \
         connection (polled every ~0.2 ms) that is not 404 (add) or is 404 (removal): the API write, the watch \
         event, the agent's fold and render, its 20 ms debounce (`--xds-debounce-ms`), the CDS and ECDS push, Envoy applying the gateway's checks \
         (ECDS: the listener is not touched), one poll.\n",
        n = opts.changes
    ));
    let mut rows = Vec::new();
    for (what, v) in [("pod added → answered (503, not 404)", &adds), ("pod removed → 404", &removals)] {
        rows.push(vec![
            what.to_owned(),
            percentile(v, 50.0).map_or("n/a".into(), show_secs),
            percentile(v, 99.0).map_or("n/a".into(), show_secs),
            Spread::of(v).map_or("n/a".into(), |s| format!("{}–{}", show_secs(s.min), show_secs(s.max))),
            v.len().to_string(),
        ]);
    }
    r.add(&md_table(&["change (on the kept connection)", "p50", "p99", "min–max", "n"], &rows));
    r.line(&format!(
        "\nEnvoy's counters across the {} changes: `listener_modified` +{modified}, `listener_in_place_updated` \
         +{in_place}, `total_filter_chains_draining` {draining_chains}, `total_listeners_draining` \
         {draining_listeners}; `http.aether_health.downstream_cx_total` {connections} (the one kept connection); \
         the gateway's checks updated over ECDS {ecds} times.\n",
        2 * opts.changes
    ));
    let churn_free = modified == 0 && in_place == 0 && draining_chains == 0 && draining_listeners == 0;
    let p99 = percentile(&adds, 99.0);
    r.goals.push(Goal {
        goal: "A pod added is answered on an existing keep-alive connection; no listener churn",
        figure: format!(
            "add → answered p99 {} over {} adds on 1 connection; listener modified +{modified}, filter chains \
             draining {draining_chains}",
            p99.map_or("n/a".into(), show_secs),
            adds.len()
        ),
        met: Some(churn_free && connections == 1),
        limit: "the listener changed or the connection was replaced: see section 3c".into(),
    });
    Ok(())
}
