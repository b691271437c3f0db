//! Section 3 of `make bench` (docs/benchmarks.md, "3. Convergence: policy write → Envoy"): a
//! policy written with kubectl or straight to the API, timed until the node's Envoy dials the
//! pod's socket (apply) or its pod IP again (delete), through the release webhook and agent and a
//! real Envoy on the agent's ADS.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use aether_fixtures::{Envoy, pod, policy};
use aether_tests::{ControlPlane, envoy_bin, free_port, http_get_status};
use anyhow::{Context, ensure};

use crate::api_client::api_client;
use crate::processes::{Proc, workspace_bin};
use crate::stats::{Spread, md_table, percentile, show_secs};
use crate::{Goal, Opts, Report};

const NS: &str = "bench";
const NODE: &str = "bench-node";
/// The agent's `--xds-debounce-ms` in the convergence section (its default).
const DEBOUNCE_MS: u64 = 20;

/// Polls Envoy's admin config_dump (one keep-alive client) until cluster `name`'s endpoint
/// contains `want`; returns when it did.
fn wait_envoy(client: &reqwest::blocking::Client, admin: u16, name: &str, want: &str) -> anyhow::Result<Instant> {
    let url = format!("http://127.0.0.1:{admin}/config_dump?resource=dynamic_active_clusters&name_regex=^{name}$");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let body = client.get(&url).send()?.text()?;
        let now = Instant::now();
        if body.contains(want) {
            return Ok(now);
        }
        ensure!(now < deadline, "Envoy never showed {want} for {name}: {body}");
        std::thread::sleep(Duration::from_micros(500));
    }
}

struct Convergence {
    via: &'static str,
    apply: Vec<f64>,
    delete: Vec<f64>,
}

/// Writes section 3 (needs the control plane and the running `controller`, whose TLS files are
/// in `certs`).
pub fn section(r: &mut Report, opts: &Opts, cp: &ControlPlane, controller: &Proc, certs: &Path) -> anyhow::Result<()> {
    let work = tempfile::Builder::new().prefix("aeb").tempdir_in("/tmp")?;
    let (pods, run) = (work.path().join("pods"), work.path().join("run"));
    std::fs::create_dir_all(&pods)?;
    std::fs::create_dir_all(&run)?;
    cp.install_crd()?;
    cp.register_webhook(
        &format!("https://127.0.0.1:{}/validate", controller.port),
        &certs.join(aether_webhook_certs::CA_FILE),
    )?;
    cp.kubectl_ok(&["create", "namespace", NS])?;
    cp.kubectl_ok(&["create", "serviceaccount", "-n", NS, "echo"])?;
    cp.apply(
        &pod(NS, "echo-1")
            .node(NODE)
            .sa("echo")
            .container("app", "registry.example/uds-echo:bench")
            .emptydir("s")
            .manifest(),
    )?;
    // No kubelet: give the pod an IP so its TCP delivery renders (status subresource).
    cp.kubectl_ok(&[
        "patch",
        "pod",
        "-n",
        NS,
        "echo-1",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"podIP":"10.0.0.9","podIPs":[{"ip":"10.0.0.9"}]}}"#,
    ])?;
    let uid = cp.kubectl_ok(&["get", "pod", "-n", NS, "echo-1", "-o", "jsonpath={.metadata.uid}"])?;
    let volume = pods.join(&uid).join("volumes/kubernetes.io~empty-dir/s");
    std::fs::create_dir_all(&volume)?;
    let socket = volume.join("app.sock");
    let _echo = Proc::echo(work.path(), "echo-1", Some(&socket))?;

    let xds = run.join("xds.sock");
    let agent_admin = free_port();
    let mut cmd = Command::new(workspace_bin("aether-agent")?);
    cmd.arg("run")
        .args(["--node-name", NODE, "--admin-addr", &format!("127.0.0.1:{agent_admin}")])
        // Any free loopback debug port, by env: an earlier release under comparison has no such flag.
        .env("AETHER_DEBUG_ADDR", "127.0.0.1:0")
        .args(["--xds-debounce-ms", &DEBOUNCE_MS.to_string()])
        .arg("--kubelet-pods-dir")
        .arg(&pods)
        .arg("--state-dir")
        .arg(work.path().join("state"))
        .arg("--xds-address")
        .arg(format!("unix://{}", xds.display()))
        .arg("--health-socket")
        .arg(run.join("health.sock"))
        .env("KUBECONFIG", cp.kubeconfig());
    let mut agent = Proc::spawn(cmd, work.path().join("agent.log"), agent_admin)?;
    agent.wait_until("aether-agent", || http_get_status(agent_admin, "/readyz") == Some(200))?;
    let envoy_dir = work.path().join("envoy");
    std::fs::create_dir_all(&envoy_dir)?;
    let envoy = Envoy::builder(&xds, NODE, &envoy_dir).binary(envoy_bin()?).start()?;
    let cluster = "app_bench_echo-1_8080";
    let poll = reqwest::blocking::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let pipe = format!("\"path\": \"{}\"", socket.display());
    let tcp = "\"address\": \"10.0.0.9\"";
    wait_envoy(&poll, envoy.admin_port(), cluster, tcp).context("the pod's TCP cluster before any policy")?;

    let echo_uds = policy(NS, "echo-uds").target("echo").socket("s/app.sock");
    let (policy_manifest, policy_json) = (echo_uds.manifest(), echo_uds.json());
    let (api, server) = api_client(cp)?;
    let collection = format!("{server}/apis/config.aether.io/v1/namespaces/{NS}/endpointpolicies");
    let mut results = Vec::new();

    // kubectl, as the issue asks: process start, discovery, the write, then the agent and Envoy.
    let mut kc = Convergence { via: "kubectl apply / kubectl delete", apply: Vec::new(), delete: Vec::new() };
    for _ in 0..opts.changes {
        let t0 = Instant::now();
        cp.apply(&policy_manifest)?;
        kc.apply.push((wait_envoy(&poll, envoy.admin_port(), cluster, &pipe)? - t0).as_secs_f64());
        let t0 = Instant::now();
        cp.kubectl_ok(&["delete", "epol", "-n", NS, "echo-uds", "--wait=false"])?;
        kc.delete.push((wait_envoy(&poll, envoy.admin_port(), cluster, tcp)? - t0).as_secs_f64());
    }
    results.push(kc);

    // The API directly (one keep-alive HTTPS client with the kubeconfig's client certificate).
    let mut direct = Convergence { via: "API write (POST / DELETE)", apply: Vec::new(), delete: Vec::new() };
    for _ in 0..opts.changes {
        let t0 = Instant::now();
        let resp = api.post(&collection).json(&policy_json).send()?;
        ensure!(resp.status().is_success(), "create: {} {}", resp.status(), resp.text().unwrap_or_default());
        direct.apply.push((wait_envoy(&poll, envoy.admin_port(), cluster, &pipe)? - t0).as_secs_f64());
        let t0 = Instant::now();
        let resp = api.delete(format!("{collection}/echo-uds")).send()?;
        ensure!(resp.status().is_success(), "delete: {} {}", resp.status(), resp.text().unwrap_or_default());
        direct.delete.push((wait_envoy(&poll, envoy.admin_port(), cluster, tcp)? - t0).as_secs_f64());
    }
    results.push(direct);

    // What kubectl alone costs: a no-op apply (the object exists and is unchanged) and the API's
    // own write latency (create + delete, answered; no wait for Envoy).
    cp.apply(&policy_manifest)?;
    let mut noop = Vec::new();
    for _ in 0..10 {
        let t0 = Instant::now();
        cp.apply(&policy_manifest)?;
        noop.push(t0.elapsed().as_secs_f64());
    }
    cp.kubectl_ok(&["delete", "epol", "-n", NS, "echo-uds"])?;
    wait_envoy(&poll, envoy.admin_port(), cluster, tcp)?;
    let mut api_only = Vec::new();
    for _ in 0..10 {
        let t0 = Instant::now();
        let resp = api.post(&collection).json(&policy_json).send()?;
        ensure!(resp.status().is_success(), "create: {}", resp.status());
        api_only.push(t0.elapsed().as_secs_f64());
        wait_envoy(&poll, envoy.admin_port(), cluster, &pipe)?;
        api.delete(format!("{collection}/echo-uds")).send()?;
        wait_envoy(&poll, envoy.admin_port(), cluster, tcp)?;
    }

    r.line("## 3. Convergence: policy write → Envoy\n");
    r.line(&format!(
        "A real kube-apiserver + etcd with the webhook registered (the release `aether-controller` admits every \
         create), the release `aether-agent` watching it, a real Envoy on the agent's ADS, and one managed pod whose \
         service the policy targets (its echo server listening on the socket). Each interval runs from just before \
         the write starts to the first poll of Envoy's admin `config_dump` (every ~0.5 ms, one keep-alive client) \
         that shows the pod's cluster dialing the pipe (apply) or its pod IP over TCP again (delete). It includes: \
         the client (kubectl: process start, discovery, the request; or one HTTPS request), the webhook call (create \
         only), the API server and etcd write, the watch event to the agent, the fold and render, the xDS \
         debounce ({DEBOUNCE_MS} ms, the agent's default, coalescing bursts), the push, Envoy's CDS update, and up to one poll. {} changes of each \
         kind, alternating apply and delete.\n",
        opts.changes
    ));
    let mut rows = Vec::new();
    for c in &results {
        for (kind, v) in [("apply → pipe", &c.apply), ("delete → TCP", &c.delete)] {
            rows.push(vec![
                c.via.to_owned(),
                kind.to_owned(),
                percentile(v, 50.0).map_or("n/a".into(), show_secs),
                percentile(v, 99.0).map_or("n/a".into(), show_secs),
                Spread::of(v).map_or("n/a".into(), |s| format!("{}–{}", show_secs(s.min), show_secs(s.max))),
                v.len().to_string(),
            ]);
        }
    }
    r.add(&md_table(&["client", "change", "p50", "p99", "min–max", "n"], &rows));
    let (noop_p50, api_p50) =
        (percentile(&noop, 50.0).unwrap_or(f64::NAN), percentile(&api_only, 50.0).unwrap_or(f64::NAN));
    r.line(&format!(
        "\nFor scale: a no-op `kubectl apply` of the unchanged policy takes {} (p50 of 10): kubectl's own cost; \
         the bare API create (answered, webhook included, no wait for Envoy) takes {} (p50 of 10). The debounce \
         alone is {DEBOUNCE_MS} ms of every figure above.\n",
        show_secs(noop_p50),
        show_secs(api_p50)
    ));
    let kubectl_p99 = percentile(&results[0].apply.iter().chain(&results[0].delete).copied().collect::<Vec<_>>(), 99.0);
    let api_p99 = percentile(&results[1].apply.iter().chain(&results[1].delete).copied().collect::<Vec<_>>(), 99.0);
    r.goals.push(Goal {
        goal: "Convergence p99 ≤ 100 ms",
        figure: format!(
            "kubectl: {}; API write: {} (p99 over apply and delete)",
            kubectl_p99.map_or("n/a".into(), show_secs),
            api_p99.map_or("n/a".into(), show_secs)
        ),
        met: api_p99.zip(kubectl_p99).map(|(a, k)| a <= 0.1 && k <= 0.1),
        limit: format!(
            "{DEBOUNCE_MS} ms of it is the agent's xDS debounce; kubectl's process start and discovery add about {} (no-op apply)",
            show_secs(noop_p50)
        ),
    });
    Ok(())
}
