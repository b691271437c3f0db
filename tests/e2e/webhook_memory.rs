//! The webhook's memory under its worst clients, against the real `aether-controller` (TLS,
//! `--status-writer=false`) in a memory cgroup at the chart's `controller.resources.limits.memory`
//! (128Mi): the kernel kills it if it goes over, as the kubelet's container runtime would.
//!
//! The worst body for a JSON parse is a long array of one-digit numbers: each two bytes become a
//! 32-byte value. [`CLIENTS`] connections each POST [`ROUNDS`] reviews at the body cap (1 MiB,
//! `aether_controller::webhook::DEFAULT_MAX_BODY_BYTES`) whose spec carries such an array, plus
//! one over the cap, at once: together 32 times the limit's worth of parse memory, were each
//! parsed as it arrives. The reviews in flight share one budget of parse memory
//! (`webhook::inflight_budget_bytes`), so the process stays under the limit: it is alive after,
//! not OOM-killed, every review at the cap is answered 200 (denied: an unknown field) or 408 (it
//! waited past the request timeout for its share), every one over the cap 413, and a valid review
//! is then allowed.
//!
//! Needs root and a memory cgroup (v1 `memory.limit_in_bytes`, as on these hosts, or v2
//! `memory.max`); the cgroup is removed on every exit path.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use aether_fixtures::process::killed_with_parent;
use aether_tests::{free_port, http_get_status, repo_root, workspace_bin};
use anyhow::{Context, bail, ensure};

/// Concurrent connections, each sending [`ROUNDS`] worst-case reviews one after the other.
const CLIENTS: usize = 32;
const ROUNDS: usize = 2;

/// The cores of the node the controller is run as if on (its tokio runtime's workers): this
/// machine has 2, a production node 8 to 64.
const NODE_CORES: usize = 16;

/// A memory cgroup of this test, removed on drop (after the process in it is killed).
struct MemoryCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    /// Creates `aether-e2e-<pid>` limited to `bytes` (no swap).
    fn create(bytes: u64) -> anyhow::Result<Self> {
        let name = format!("aether-e2e-{}", std::process::id());
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let (dir, v2) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(&name), false)
        } else if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            (Path::new("/sys/fs/cgroup").join(&name), true)
        } else {
            bail!("no memory cgroup: neither /sys/fs/cgroup/memory (v1) nor /sys/fs/cgroup/cgroup.controllers (v2)");
        };
        std::fs::create_dir(&dir).with_context(|| format!("creating {} (needs root)", dir.display()))?;
        let cgroup = MemoryCgroup { dir, v2 };
        if v2 {
            cgroup.write("memory.max", &bytes.to_string())?;
            let _ = cgroup.write("memory.swap.max", "0");
        } else {
            cgroup.write("memory.limit_in_bytes", &bytes.to_string())?;
            cgroup.write("memory.swappiness", "0")?;
        }
        Ok(cgroup)
    }

    fn write(&self, file: &str, value: &str) -> anyhow::Result<()> {
        std::fs::write(self.dir.join(file), value).with_context(|| format!("writing {value} to {file}"))
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }

    /// Moves process `pid` into the cgroup.
    fn add(&self, pid: u32) -> anyhow::Result<()> {
        self.write("cgroup.procs", &pid.to_string())
    }

    /// The OOM kills in the cgroup (`oom_kill` of `memory.oom_control` in v1, `memory.events`
    /// in v2).
    fn oom_kills(&self) -> u64 {
        let text = if self.v2 { self.read("memory.events") } else { self.read("memory.oom_control") };
        text.lines().find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok()).unwrap_or(0)
    }

    /// The most memory the cgroup used, in bytes (v2 kernels before 5.19 have no peak: 0).
    fn peak(&self) -> u64 {
        let file = if self.v2 { "memory.peak" } else { "memory.max_usage_in_bytes" };
        self.read(file).trim().parse().unwrap_or(0)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // The kernel refuses to remove a cgroup with processes: the caller killed them first;
        // give the kernel a moment to reap.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

/// The controller, killed and reaped on drop.
struct Controller(Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The chart's `controller.resources.limits.memory`, in bytes (a `<n>Mi` quantity).
fn chart_controller_memory_limit() -> anyhow::Result<u64> {
    let values: serde_json::Value =
        yaml_serde::from_str(&std::fs::read_to_string(repo_root().join("charts/aether/values.yaml"))?)?;
    let limit = values["controller"]["resources"]["limits"]["memory"].as_str().context("controller memory limit")?;
    let mib: u64 = limit.strip_suffix("Mi").context("a limit in Mi")?.parse()?;
    Ok(mib << 20)
}

/// A review of the valid fixture whose spec also holds `padding`, an array of `1`s making the
/// body exactly `size` bytes.
fn worst_case_review(size: usize) -> anyhow::Result<Vec<u8>> {
    let fixture = repo_root().join("controller/tests/fixtures/admission/create-valid.json");
    let mut review: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture)?)?;
    review["request"]["uid"] = "worst-case".into();
    review["request"]["object"]["spec"]["padding"] = "PADDING".into();
    let text = serde_json::to_string(&review)?;
    let (head, tail) = text.split_once("\"PADDING\"").context("the placeholder")?;
    // "[1" + ",1" * n + "]"
    let n = size.checked_sub(head.len() + tail.len() + 3).context("size too small")? / 2;
    let mut body = Vec::with_capacity(size);
    body.extend_from_slice(head.as_bytes());
    body.extend_from_slice(b"[1");
    body.extend(std::iter::repeat_n(b",1".iter().copied(), n).flatten());
    body.push(b']');
    // One byte of whitespace where the arithmetic left one short.
    while body.len() + tail.len() < size {
        body.push(b' ');
    }
    body.extend_from_slice(tail.as_bytes());
    ensure!(body.len() == size, "built {} bytes, want {size}", body.len());
    Ok(body)
}

#[test]
fn concurrent_worst_case_reviews_stay_under_the_charts_memory_limit() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let limit = chart_controller_memory_limit()?;
    let cap = aether_controller::webhook::DEFAULT_MAX_BODY_BYTES;
    let work = tempfile::tempdir()?;
    let certs = work.path().join("certs");
    aether_webhook_certs::write_dir(&aether_webhook_certs::mint(&["127.0.0.1".into()])?, &certs)?;
    let (webhook, admin) = (free_port(), free_port());
    let cgroup = MemoryCgroup::create(limit)?;
    let log = work.path().join("controller.log");
    let child = killed_with_parent(workspace_bin("aether-controller")?)
        .args(["run", "--status-writer=false", "--tls-dir"])
        // One runtime worker per core, as on a node with NODE_CORES: as many reviews parsed at
        // once as there are workers, were nothing else to bound them.
        .env("TOKIO_WORKER_THREADS", NODE_CORES.to_string())
        .arg(&certs)
        .args(["--webhook-addr", &format!("127.0.0.1:{webhook}"), "--admin-addr", &format!("127.0.0.1:{admin}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let mut controller = Controller(child);
    cgroup.add(controller.0.id())?;
    let started = Instant::now();
    while http_get_status(admin, "/readyz") != Some(200) {
        ensure!(controller.0.try_wait()?.is_none(), "the controller exited:\n{}", std::fs::read_to_string(&log)?);
        ensure!(started.elapsed() < Duration::from_secs(20), "the controller is not ready");
        std::thread::sleep(Duration::from_millis(100));
    }

    let worst = worst_case_review(cap)?;
    let over = worst_case_review(2 * cap)?;
    let ca = reqwest::Certificate::from_pem(&std::fs::read(certs.join(aether_webhook_certs::CA_FILE))?)?;
    let url = format!("https://127.0.0.1:{webhook}/validate");
    println!(
        "{CLIENTS} connections x {ROUNDS} reviews of {} bytes and one of {} at once, in {} MiB",
        worst.len(),
        over.len(),
        limit >> 20
    );
    let began = Instant::now();
    let answers: Vec<anyhow::Result<Vec<u16>>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let (ca, url, worst, over) = (ca.clone(), &url, &worst, &over);
                scope.spawn(move || -> anyhow::Result<Vec<u16>> {
                    let client = reqwest::blocking::Client::builder()
                        .add_root_certificate(ca)
                        .timeout(Duration::from_secs(60))
                        .build()?;
                    let mut codes = Vec::new();
                    for body in std::iter::repeat_n(worst, ROUNDS).chain([over]) {
                        let resp = client
                            .post(url)
                            .header("content-type", "application/json")
                            .body(body.clone())
                            .send()
                            .context("a review was not answered")?;
                        codes.push(resp.status().as_u16());
                    }
                    Ok(codes)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a client panicked")))).collect()
    });
    let took = began.elapsed();
    let oom_kills = cgroup.oom_kills();
    let alive = controller.0.try_wait()?.is_none();
    println!(
        "answered in {:.1} s; cgroup peak {} MiB of {} MiB; OOM kills {oom_kills}",
        took.as_secs_f64(),
        cgroup.peak() >> 20,
        limit >> 20
    );
    ensure!(
        alive && oom_kills == 0,
        "the controller was killed (OOM kills {oom_kills}); log:\n{}",
        std::fs::read_to_string(&log)?
    );
    let mut tally = std::collections::BTreeMap::<(bool, u16), usize>::new();
    for codes in answers {
        for (i, code) in codes?.into_iter().enumerate() {
            *tally.entry((i < ROUNDS, code)).or_default() += 1;
        }
    }
    println!("answers (at the cap?, status): {tally:?}");
    for ((at_cap, code), n) in &tally {
        let fine = if *at_cap { [200, 408].contains(code) } else { *code == 413 };
        ensure!(fine, "{n} reviews {} the cap answered {code}", if *at_cap { "at" } else { "over" });
    }
    ensure!(tally.get(&(true, 200)).copied().unwrap_or(0) > 0, "no review at the cap was decided");

    // Still deciding: the valid fixture is allowed.
    let valid = std::fs::read(repo_root().join("controller/tests/fixtures/admission/create-valid.json"))?;
    let client = reqwest::blocking::Client::builder().add_root_certificate(ca).build()?;
    let resp = client.post(&url).header("content-type", "application/json").body(valid).send()?;
    let (code, text) = (resp.status().as_u16(), resp.text()?);
    ensure!(code == 200 && text.contains("\"allowed\":true"), "a valid review after the flood: {code} {text}");
    drop(controller);
    drop(cgroup);
    Ok(())
}
