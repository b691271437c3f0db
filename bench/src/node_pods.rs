//! A node full of pods for the live-agent sections (3d `rss`, 3e `per-change`): real API objects
//! created through the bench's kube-apiserver, and a fresh release `aether-agent` watching them.
//!
//! Each pod is managed, has a service account, one container, one `emptyDir` named `s` and a pod
//! IP (a status write: no kubelet runs), so the agent renders its TCP clusters (`app_` and
//! `health_`: 2 per pod).

use std::ops::Range;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use aether_fixtures::pod;
use aether_tests::{ControlPlane, Scrape, free_port, http_get_status};
use anyhow::{Context, bail, ensure};

use crate::api_client::api_client;
use crate::processes::{Proc, workspace_bin};

/// How many API writes run at once while pods are created.
pub(crate) const WRITERS: usize = 8;
/// Names another `aether-agent` binary to measure (e.g. one built from an older commit, for a
/// before/after comparison); default: the release binary beside `aether-bench`.
pub(crate) const AGENT_ENV: &str = "AETHER_BENCH_AGENT";
/// The longest wait for the agent to fold a list.
pub(crate) const FOLD: Duration = Duration::from_secs(180);

/// A family of pods on one node: `<prefix><i>` in `namespace`, service account `service_account`
/// (the agent's service key is namespace + service account), pod IP `10.<net + i / 65536>.x.y`.
pub(crate) struct PodSet<'a> {
    pub namespace: &'a str,
    pub node: &'a str,
    pub prefix: &'a str,
    pub service_account: &'a str,
    /// The second octet of the first pod's IP (sets on one node keep their IPs apart).
    pub net: u8,
}

impl PodSet<'_> {
    /// The name of pod `i`.
    pub(crate) fn name(&self, i: usize) -> String {
        format!("{}{i}", self.prefix)
    }

    /// The pod IP of pod `i` (`i` < 65,536 × (255 − `net`)).
    pub(crate) fn ip(&self, i: usize) -> String {
        format!("10.{}.{}.{}", usize::from(self.net) + i / 65_536, (i / 256) % 256, i % 256)
    }

    /// Creates pods `range` (each with its pod IP), [`WRITERS`] at a time, each writer with its
    /// own client: thousands of streams on one shared HTTP/2 connection trip h2's reset-flood guard.
    ///
    /// # Errors
    /// The first create or status write the API server does not answer with success.
    pub(crate) fn create(&self, cp: &ControlPlane, range: Range<usize>) -> anyhow::Result<()> {
        let next = AtomicUsize::new(range.start);
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..WRITERS)
                .map(|_| {
                    s.spawn(|| -> anyhow::Result<()> {
                        let (api, server) = api_client(cp)?;
                        let collection = format!("{server}/api/v1/namespaces/{}/pods", self.namespace);
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= range.end {
                                return Ok(());
                            }
                            let name = self.name(i);
                            let manifest = pod(self.namespace, &name)
                                .node(self.node)
                                .sa(self.service_account)
                                .container("app", "registry.example/app:bench")
                                .emptydir("s")
                                .json();
                            let resp = api.post(&collection).json(&manifest).send()?;
                            ensure!(resp.status().is_success(), "create {name}: {}", resp.status());
                            let ip = self.ip(i);
                            let patch = serde_json::json!({"status": {"podIP": ip, "podIPs": [{"ip": ip}]}});
                            let resp = api
                                .patch(format!("{collection}/{name}/status"))
                                .header("Content-Type", "application/merge-patch+json")
                                .body(patch.to_string())
                                .send()?;
                            ensure!(resp.status().is_success(), "status of {name}: {}", resp.status());
                        }
                    })
                })
                .collect();
            workers.into_iter().try_for_each(|w| w.join().map_err(|_| anyhow::anyhow!("a pod writer panicked"))?)
        })
    }
}

/// A fresh release agent for `node` (empty state dir, pods dir, sockets in `dir`) with `extra`
/// flags, ready (`/readyz` 200). Returns it and its admin port. Its xDS socket is
/// `<dir>/run/xds.sock`.
///
/// # Errors
/// When the binary is missing, or it exits or is not ready in 30 s (with its log).
pub(crate) fn start_agent(cp: &ControlPlane, dir: &Path, node: &str, extra: &[String]) -> anyhow::Result<(Proc, u16)> {
    std::fs::create_dir_all(pods_dir(dir))?;
    std::fs::create_dir_all(dir.join("run"))?;
    let admin = free_port();
    let bin = match std::env::var_os(AGENT_ENV) {
        Some(path) => path.into(),
        None => workspace_bin("aether-agent")?,
    };
    let mut cmd = Command::new(bin);
    cmd.arg("run")
        .args(["--node-name", node, "--admin-addr", &format!("127.0.0.1:{admin}")])
        // Any free loopback debug port, by env: an earlier release under comparison has no such flag.
        .env("AETHER_DEBUG_ADDR", "127.0.0.1:0")
        .arg("--kubelet-pods-dir")
        .arg(pods_dir(dir))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--xds-address")
        .arg(format!("unix://{}", xds_socket(dir).display()))
        .arg("--health-socket")
        .arg(dir.join("run/health.sock"))
        .args(extra)
        .env("KUBECONFIG", cp.kubeconfig());
    let mut agent = Proc::spawn(cmd, dir.join("agent.log"), admin)?;
    agent
        .wait_until(&format!("aether-agent ({})", dir.display()), || http_get_status(admin, "/readyz") == Some(200))?;
    Ok((agent, admin))
}

/// The `--kubelet-pods-dir` of an agent started in `dir`: short, because a pipe's path
/// (`<pods dir>/<uid>/volumes/kubernetes.io~empty-dir/<socket>`) must fit `sun_path` (108 bytes).
pub(crate) fn pods_dir(dir: &Path) -> std::path::PathBuf {
    dir.join("p")
}

/// The xDS socket of an agent started in `dir`.
pub(crate) fn xds_socket(dir: &Path) -> std::path::PathBuf {
    dir.join("run/xds.sock")
}

/// User + system CPU time of `pid`, in clock ticks (`/proc/<pid>/stat` fields 14 and 15).
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("malformed /proc/<pid>/stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Ok(f.get(11).context("utime")?.parse::<u64>()? + f.get(12).context("stime")?.parse::<u64>()?)
}

/// Waits until `pid` used at most 2 ticks of CPU over one second (it has finished folding).
///
/// # Errors
/// When it is still busy after [`FOLD`], or `/proc/<pid>/stat` cannot be read.
pub(crate) fn quiet(pid: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + FOLD;
    let mut last = cpu_ticks(pid)?;
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = cpu_ticks(pid)?;
        if now - last <= 2 {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "the agent was still busy after {} s", FOLD.as_secs());
        last = now;
    }
}

/// Waits until the agent's `aether_agent_pods` counts `n` pods and its CPU is quiet.
///
/// # Errors
/// When the agent exits, or does not count `n` pods within [`FOLD`].
pub(crate) fn folded(agent: &mut Proc, admin: u16, n: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + FOLD;
    loop {
        let counted = Scrape::get(admin)?.value("aether_agent_pods", &[]);
        if counted as usize == n {
            break;
        }
        if let Some(status) = agent.child.try_wait()? {
            bail!("the agent exited ({status}): {}", std::fs::read_to_string(&agent.log).unwrap_or_default());
        }
        ensure!(Instant::now() < deadline, "the agent counts {counted} pods of {n} after {} s", FOLD.as_secs());
        std::thread::sleep(Duration::from_millis(200));
    }
    quiet(agent.child.id())
}

/// `VmRSS` and `VmHWM` of `pid`, in KiB (`/proc/<pid>/status`). Used by 3d and 3f.
pub(crate) fn memory_kib(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("/proc/{pid}/status has no {name}"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// ns the process `pid` has been on a CPU: the sum over its threads of the first field of
/// `/proc/<pid>/task/<tid>/schedstat`. Threads that ended are not counted: the agent's runtime
/// keeps its workers. Used by 3e and 3f (agent and kube-apiserver CPU per write).
pub(crate) fn schedstat_ns(pid: u32) -> anyhow::Result<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = task?.path().join("schedstat");
        // A thread may end between the listing and the read.
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        total += text
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .with_context(|| format!("{} is not schedstat", path.display()))?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_counts_this_process() {
        let pid = std::process::id();
        let a = schedstat_ns(pid).unwrap();
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(20) {
            std::hint::black_box(t.elapsed());
        }
        assert!(schedstat_ns(pid).unwrap() > a, "20 ms of spinning shows in schedstat");
    }

    #[test]
    fn ips_stay_apart_between_sets_and_roll_over_octets() {
        let set = |net| PodSet { namespace: "ns", node: "n", prefix: "p-", service_account: "a", net };
        assert_eq!(set(1).ip(0), "10.1.0.0");
        assert_eq!(set(1).ip(257), "10.1.1.1");
        assert_eq!(set(1).ip(65_536), "10.2.0.0");
        assert_eq!(set(200).ip(3), "10.200.0.3");
        assert_eq!(set(1).name(7), "p-7");
    }
}
