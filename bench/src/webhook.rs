//! Section 2: the webhook (the release `aether-controller run`) against `webhook-floor` (the same
//! TLS + HTTP stack answering a fixed review), with two real reviews the webhook allows: one that
//! produces no warning and one that does (`sockets/app.sock` of `create-valid.json`, exactly the
//! 16-byte budget). Goals (docs/benchmarks.md, "Goals"): saturation ≥ 0.7× the floor and p99 at
//! 2k/s ≤ 1.5× the floor, per review. When one is missed and perf is there, the webhook is sampled
//! under saturation and its top self-time symbols go into the report ([`crate::profile`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aether_tests::{ControlPlane, repo_root};
use anyhow::{Context, ensure};

use crate::api_client::api_client;
use crate::oha::oha;
use crate::processes::Proc;
use crate::stats::{OhaRun, Spread, md_table, ratio, show_count, show_ratio, show_secs};
use crate::{Goal, Opts, Report, profile};

/// Fixed rates; `None` = saturation. 500/s was dropped: two reviews and the floor at
/// four rates would not fit the section's 4-minute budget, and 500/s showed nothing 2k/s does not.
const RATES: [Option<u32>; 3] = [Some(2_000), Some(5_000), None];
const WEBHOOK_CONNECTIONS: usize = 8;
const SATURATION_CONNECTIONS: usize = 32;
/// Saturation throughput must be at least this share of the floor's.
const SATURATION_GOAL: f64 = 0.7;
/// p99 at 2k/s may be at most this multiple of the floor's.
const P99_GOAL: f64 = 1.5;
/// Symbols of the profile printed when a goal is missed.
const TOP_SYMBOLS: usize = 8;

/// One review the bench posts.
struct Fixture {
    /// `no warning` or `warned`, the table's label.
    label: &'static str,
    /// Under `controller/tests/fixtures/admission/`.
    file: &'static str,
    /// Whether the webhook's answer carries `warnings`.
    warned: bool,
    saturation_goal: &'static str,
    p99_goal: &'static str,
}

const FIXTURES: [Fixture; 2] = [
    Fixture {
        label: "no warning",
        file: "create-valid-nowarn.json",
        warned: false,
        saturation_goal: "Webhook saturation ≥ 0.7× the floor (review without warning)",
        p99_goal: "Webhook p99 at 2k/s ≤ 1.5× the floor (review without warning)",
    },
    Fixture {
        label: "warned",
        file: "create-valid.json",
        warned: true,
        saturation_goal: "Webhook saturation ≥ 0.7× the floor (warned review)",
        p99_goal: "Webhook p99 at 2k/s ≤ 1.5× the floor (warned review)",
    },
];

fn fixture_path(f: &Fixture) -> PathBuf {
    repo_root().join("controller/tests/fixtures/admission").join(f.file)
}

/// Creates namespace `shop` and Service `shop/echo` (what the fixtures' policy targets), so that
/// the status writer's caches give no `accepted-without-service` warning. Existing objects are fine.
fn create_target_service(cp: &ControlPlane) -> anyhow::Result<()> {
    let (client, server) = api_client(cp)?;
    let objects = [
        (
            "/api/v1/namespaces",
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}),
        ),
        (
            "/api/v1/namespaces/shop/services",
            serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo", "namespace": "shop"},
                "spec": {"ports": [{"port": 80}]}}),
        ),
    ];
    for (path, body) in objects {
        let resp = client.post(format!("{server}{path}")).json(&body).send()?;
        let status = resp.status();
        ensure!(status.is_success() || status.as_u16() == 409, "POST {path}: {status} {}", resp.text()?);
    }
    Ok(())
}

/// Posts `f` to `port` until the answer allows it with (or without) warnings as `f` says; the
/// controller's caches may still be syncing the Service just created. Up to 20 s.
fn check_answer(
    client: &reqwest::blocking::Client,
    who: &str,
    port: u16,
    f: &Fixture,
    floor: bool,
) -> anyhow::Result<()> {
    let body = std::fs::read(fixture_path(f))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let resp = client
            .post(format!("https://127.0.0.1:{port}/validate"))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()?
            .text()?;
        ensure!(resp.contains("\"allowed\":true"), "{who} did not allow {}: {resp}", f.file);
        if floor || resp.contains("\"warnings\"") == f.warned {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{who} answered {} {} warnings, expected {}: {resp}",
            f.file,
            if f.warned { "without" } else { "with" },
            if f.warned { "some" } else { "none" }
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The oha arguments for `body` at `rate` (`None`: saturation).
fn oha_args(body: &Path, ca: &Path, rate: Option<u32>) -> Vec<String> {
    let mut args: Vec<String> = ["-m", "POST", "-T", "application/json", "-D"].map(String::from).to_vec();
    args.push(body.display().to_string());
    args.extend(["--cacert".to_owned(), ca.display().to_string()]);
    match rate {
        Some(q) => args.extend([
            "-c".to_owned(),
            WEBHOOK_CONNECTIONS.to_string(),
            "-q".to_owned(),
            q.to_string(),
            "--latency-correction".to_owned(),
        ]),
        None => args.extend(["-c".to_owned(), SATURATION_CONNECTIONS.to_string()]),
    }
    args
}

/// Section 2. `controller` runs with its status writer against `cp`; `certs` holds its TLS files
/// and the CA.
pub fn section_webhook(
    r: &mut Report,
    opts: &Opts,
    cp: &ControlPlane,
    controller: &Proc,
    certs: &Path,
) -> anyhow::Result<()> {
    create_target_service(cp).context("creating Service shop/echo for the reviews")?;
    let floor = Proc::floor(certs)?;
    let ca = certs.join(aether_webhook_certs::CA_FILE);
    let client = reqwest::blocking::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(&ca)?)?)
        .build()?;
    for f in &FIXTURES {
        check_answer(&client, "aether-controller", controller.port, f, false)?;
        check_answer(&client, "webhook-floor", floor.port, f, true)?;
    }
    let url = |port: u16| format!("https://127.0.0.1:{port}/validate");
    // runs[rate][0] = floor, runs[rate][1 + i] = the webhook with FIXTURES[i].
    let mut runs: Vec<[Vec<OhaRun>; 3]> = RATES.iter().map(|_| Default::default()).collect();
    for (ri, rate) in RATES.iter().enumerate() {
        for _ in 0..opts.reps {
            // The floor, then each review: alternating, so that load from elsewhere hits all alike.
            let targets =
                [(floor.port, &FIXTURES[0]), (controller.port, &FIXTURES[0]), (controller.port, &FIXTURES[1])];
            for (slot, (port, f)) in targets.into_iter().enumerate() {
                let run = oha(opts, &oha_args(&fixture_path(f), &ca, *rate), &url(port))?;
                ensure!(run.failures("200") == 0, "failed requests at {rate:?}/s ({}): {run:?}", f.file);
                runs[ri][slot].push(run);
            }
        }
    }
    r.line("## 2. Webhook: AdmissionReview over TLS under load\n");
    r.line(&format!(
        "oha posts two real EndpointPolicy CREATE reviews the webhook allows — `create-valid-nowarn.json` \
         (`sock/app.sock`, no warning; {} bytes) and `create-valid.json` (`sockets/app.sock`, exactly the 16-byte \
         budget, answered with a near-budget warning; {} bytes), both in `controller/tests/fixtures/admission/` — over \
         TLS 1.3 (HTTP/1.1, keep-alive) to the release `aether-controller run` (log level info to a file: allowed \
         reviews, warned or not, are debug lines and not written; metrics on; the status writer's caches consulted \
         for warnings, Service `shop/echo` present) and to `webhook-floor`: the same axum + axum-server + rustls(ring) \
         stack answering a fixed review without parsing, validating, logging or counting. Fixed rates use \
         {WEBHOOK_CONNECTIONS} connections and `--latency-correction` (latency counted from each request's scheduled \
         send time, so a stall is not hidden); saturation uses {SATURATION_CONNECTIONS} connections and no rate limit. \
         Within each repetition the floor, the review without warning and the warned review run in turn; oha, the \
         server and the machine's other load share the 2 cores.\n",
        std::fs::metadata(fixture_path(&FIXTURES[0]))?.len(),
        std::fs::metadata(fixture_path(&FIXTURES[1]))?.len(),
    ));
    let spread = |runs: &[OhaRun], f: fn(&OhaRun) -> f64| Spread::of(&runs.iter().map(f).collect::<Vec<_>>());
    let mut rows = Vec::new();
    // Per fixture: (saturation ratio, p99 ratio at 2k/s with both p99s).
    let mut sat: [Option<(f64, f64, f64)>; 2] = [None; 2];
    let mut p99_2k: [Option<(f64, f64, f64)>; 2] = [None; 2];
    for (ri, rate) in RATES.iter().enumerate() {
        let floor_runs = &runs[ri][0];
        let (Some(fp50), Some(fp99), Some(frps)) =
            (spread(floor_runs, |x| x.p50), spread(floor_runs, |x| x.p99), spread(floor_runs, |x| x.rps))
        else {
            continue;
        };
        for (fi, f) in FIXTURES.iter().enumerate() {
            let ctl = &runs[ri][1 + fi];
            let (Some(cp50), Some(cp99), Some(crps)) =
                (spread(ctl, |x| x.p50), spread(ctl, |x| x.p99), spread(ctl, |x| x.rps))
            else {
                continue;
            };
            let p99r = ratio(cp99.median, fp99.median);
            let rpsr = ratio(crps.median, frps.median);
            match rate {
                Some(2_000) => p99_2k[fi] = p99r.map(|x| (x, cp99.median, fp99.median)),
                None => sat[fi] = rpsr.map(|x| (x, crps.median, frps.median)),
                _ => {}
            }
            rows.push(vec![
                rate.map_or_else(|| "saturation".to_owned(), |q| format!("{}/s", show_count(f64::from(q)))),
                f.label.to_owned(),
                crps.show(show_count),
                frps.show(show_count),
                cp50.show(show_secs),
                fp50.show(show_secs),
                cp99.show(show_secs),
                fp99.show(show_secs),
                show_ratio(ratio(cp50.median, fp50.median)),
                show_ratio(p99r),
                show_ratio(rpsr),
            ]);
        }
    }
    r.add(&md_table(
        &[
            "offered",
            "review",
            "webhook req/s",
            "floor req/s",
            "webhook p50",
            "floor p50",
            "webhook p99",
            "floor p99",
            "p50 ratio",
            "p99 ratio",
            "throughput ratio",
        ],
        &rows,
    ));
    r.line(&format!(
        "\nmedian [min–max] over {} runs of {} s each per cell; the floor's columns repeat for both reviews (the same \
         runs).\n",
        opts.reps, opts.secs
    ));
    let missed = FIXTURES.iter().enumerate().any(|(i, _)| {
        sat[i].is_none_or(|(x, _, _)| x < SATURATION_GOAL) || p99_2k[i].is_none_or(|(x, _, _)| x > P99_GOAL)
    });
    let cause =
        if missed { profile_cause(r, opts, controller, certs, &ca, &url(controller.port)) } else { String::new() };
    for (i, f) in FIXTURES.iter().enumerate() {
        r.goals.push(Goal {
            goal: f.saturation_goal,
            figure: sat[i].map_or_else(
                || "not measured".into(),
                |(x, c, fl)| format!("{x:.2}× ({} vs {} req/s)", show_count(c), show_count(fl)),
            ),
            met: sat[i].map(|(x, _, _)| x >= SATURATION_GOAL),
            limit: cause.clone(),
        });
        r.goals.push(Goal {
            goal: f.p99_goal,
            figure: p99_2k[i].map_or_else(
                || "not measured".into(),
                |(x, c, fl)| format!("{x:.2}× ({} vs {})", show_secs(c), show_secs(fl)),
            ),
            met: p99_2k[i].map(|(x, _, _)| x <= P99_GOAL),
            limit: cause.clone(),
        });
    }
    Ok(())
}

/// Samples the webhook with perf while oha saturates it with the warned review, prints the top
/// self-time symbols under a sub-heading and returns them in one line for the goals table; or
/// says why there is no profile.
fn profile_cause(r: &mut Report, opts: &Opts, controller: &Proc, certs: &Path, ca: &Path, url: &str) -> String {
    if !profile::perf_available() {
        return "no profile: perf is not installed".into();
    }
    let body = fixture_path(&FIXTURES[1]);
    let load = Command::new(&opts.oha)
        .args(["--no-tui", "--output-format", "json", "-z", &format!("{}s", opts.secs + 1)])
        .args(oha_args(&body, ca, None))
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let mut load = match load {
        Ok(child) => child,
        Err(e) => return format!("no profile: cannot start oha: {e}"),
    };
    // Let the connections open, then sample for the run's length less the ramp.
    std::thread::sleep(Duration::from_millis(500));
    let top = profile::record_top(controller.child.id(), Duration::from_secs(opts.secs), TOP_SYMBOLS, certs);
    let _ = load.kill();
    let _ = load.wait();
    match top {
        Ok(top) => {
            r.line(&format!(
                "A webhook goal was missed: `perf record -F 999` of the webhook for {} s under saturation (warned \
                 review, {SATURATION_CONNECTIONS} connections), top {TOP_SYMBOLS} symbols by self time:\n",
                opts.secs
            ));
            for s in &top {
                r.line(&format!("- {}", s.show(100)));
            }
            r.line("");
            let short: Vec<String> = top.iter().take(4).map(|s| s.show(60)).collect();
            format!("profile under saturation, top self time: {}", short.join("; "))
        }
        Err(e) => format!("no profile: {e:#}"),
    }
}
