//! What the node tells about itself: `kubectl_aether_why_reads_the_node_agents_live_decision`,
//! `a_dotted_pod_name_keeps_envoys_metric_names` and
//! `prometheus_scrapes_the_node_and_every_rule_and_panel_has_series`.
//!
//! What they prove: `kubectl aether why` reads the node agent's live decision for each kind of
//! pod, and only those allowed get it; Envoy's Prometheus output keeps one metric family per kind
//! whatever the pod's name; and with `metrics.*` on, a real Prometheus scrapes the agent, the
//! controller and the node Envoy, loads the chart's rules (none firing on a healthy node) and finds
//! series for every rule and dashboard panel.

use std::time::Duration;

use aether_fixtures::{echo_app, policy};
use aether_tests::{eventually, repo_root};
use anyhow::{Context, ensure};
use serde_json::Value;

use crate::env::{Env, NS, STATS_PORT, WAIT, check_release_settled, envoy_admin, uid};

/// Runs the built `kubectl-aether` with the node's admin kubeconfig; its stdout (it must exit 0).
fn kubectl_aether(env: &Env, args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new(aether_tests::workspace_bin("kubectl-aether")?)
        .arg("--kubeconfig")
        .arg(&env.node.facts().kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .context("running kubectl-aether")?;
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "kubectl-aether {args:?} failed ({}): {stderr}{stdout}", out.status);
    Ok(stdout.into_owned())
}

/// On the real node: `kubectl aether why` reads what the node agent decided, through the API
/// server's port-forward to the agent's loopback-only debug port (chart defaults for the agent's
/// namespace, selector and port), for a pod served over its socket, a pod on TCP with its reason
/// and a pod whose Service has two policies (the loser named). Prints the text answers. Nobody
/// else gets the per-pod detail: a pod on the node finds no `/debug/pods` on the admin port and
/// no listener on the debug port at the node IP, and a user without `pods/portforward` gets the
/// offline answer saying so, then the live one once granted what docs/kubectl-plugin.md says.
pub(crate) fn kubectl_aether_why_reads_the_node_agents_live_decision(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&echo_app("why-uds").annotated().manifest())?;
    // Annotated with a volume the pod does not have: TCP, `volume-not-emptydir`.
    env.kube().apply(&echo_app("why-tcp").annotation_socket("nosuch/app.sock").tcp_sidecar().manifest())?;
    env.kube().apply(&echo_app("why-pol").manifest())?;
    for (name, socket) in [("why-pol-a", "s/app.sock"), ("why-pol-b", "s/other.sock")] {
        env.kube().apply(&policy("default", name).target("why-pol").socket(socket).manifest())?;
    }
    for name in ["why-uds", "why-tcp", "why-pol"] {
        env.wait_pod_ready("default", name)?;
    }
    let why = |name: &str, ok: &dyn Fn(&Value) -> bool| -> anyhow::Result<Value> {
        let mut last = Value::Null;
        eventually(&format!("kubectl aether why pod/{name}: a live answer"), WAIT, || {
            last = serde_json::from_str(&kubectl_aether(
                env,
                &["why", &format!("pod/{name}"), "-n", "default", "-o", "json"],
            )?)?;
            Ok(last["live"] == true && ok(&last["decision"]))
        })
        .with_context(|| format!("last answer: {last:#}"))?;
        println!(
            "$ kubectl aether why pod/{name} -n default\n{}",
            kubectl_aether(env, &["why", &format!("pod/{name}"), "-n", "default"])?
        );
        Ok(last)
    };
    let uds = why("why-uds", &|d| d["delivery"] == "pipe")?;
    let d = &uds["decision"];
    ensure!(d["source"] == "annotation" && d["socket"] == "s/app.sock", "{d:#}");
    ensure!(d["path"].as_str().is_some_and(|p| p.ends_with("/volumes/kubernetes.io~empty-dir/s/app.sock")), "{d:#}");
    ensure!(d["clusters"].as_array().is_some_and(|c| c.iter().any(|c| c == "app_default_why-uds_8080")), "{d:#}");
    let tcp = why("why-tcp", &|d| d["delivery"] == "tcp" && d["reason"] == "volume-not-emptydir")?;
    ensure!(tcp["decision"]["eventReason"] == "UdsVolumeNotEmptyDir", "{tcp:#}");
    let pol =
        why("why-pol", &|d| d["delivery"] == "pipe" && d["conflict"]["losers"] == serde_json::json!(["why-pol-b"]))?;
    ensure!(pol["decision"]["policy"] == "why-pol-a" && pol["decision"]["source"] == "policy", "{pol:#}");
    ensure!(uds["agent"]["port"] == 9092 && uds["agent"]["namespace"] == NS, "{uds:#}");

    // A pod on the node (every pod reaches the node IP) gets no per-pod detail.
    let node_ip = env.node.facts().node_ip.clone();
    let (ok, said) = env.client_get("why-probe-admin", &format!("http://{node_ip}:9091/debug/pods"))?;
    println!("a pod GETs http://{node_ip}:9091/debug/pods (the admin port): {}", said.trim());
    ensure!(!ok && said.contains("HTTP 404") && !said.contains("why-uds"), "{said}");
    let (ok, said) = env.client_get("why-probe-debug", &format!("http://{node_ip}:9092/debug/pods"))?;
    println!("a pod GETs http://{node_ip}:9092/debug/pods (the debug port, loopback only): {}", said.trim());
    ensure!(!ok && !said.contains("why-uds") && !said.contains("HTTP "), "no listener at the node IP: {said}");

    // A user who may read pods but not port-forward: offline, saying why; granted: live.
    let viewer = aether_tests::user_kubeconfig(
        &env.node.dir().join("cp/pki"),
        &env.node.facts().kubeconfig,
        "why-viewer",
        "default",
        env.node.dir(),
    )?;
    env.kube().apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: why-viewer}\n\
         rules: [{apiGroups: [''], resources: [pods], verbs: [get, list]}, \
         {apiGroups: [config.aether.io], resources: [endpointpolicies], verbs: [list]}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: why-viewer}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: why-viewer}\n\
         subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: why-viewer}]\n",
    )?;
    let as_viewer = || -> anyhow::Result<Value> {
        let out = std::process::Command::new(aether_tests::workspace_bin("kubectl-aether")?)
            .args(["--kubeconfig", viewer.to_str().context("path")?, "--context", "viewer"])
            .args(["why", "pod/why-uds", "-n", "default", "-o", "json"])
            .stdin(std::process::Stdio::null())
            .output()?;
        ensure!(out.status.success(), "why as why-viewer: {}", String::from_utf8_lossy(&out.stderr));
        Ok(serde_json::from_slice(&out.stdout)?)
    };
    let mut last = Value::Null;
    eventually("why-viewer gets an offline answer naming RBAC", WAIT, || {
        last = as_viewer()?;
        Ok(last["offlineReason"].as_str().is_some_and(|r| r.starts_with("RBAC forbids the port-forward")))
    })
    .with_context(|| format!("last answer: {last:#}"))?;
    println!("why-viewer without pods/portforward: OFFLINE: {}", last["offlineReason"]);
    ensure!(last["live"] == false && last["decision"]["delivery"] == "pipe", "{last:#}");
    env.kube().apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: why-viewer, namespace: {NS}}}\n\
         rules: [{{apiGroups: [''], resources: [pods/portforward], verbs: [get, create]}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: why-viewer, namespace: {NS}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: why-viewer}}\n\
         subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: why-viewer}}]\n"
    ))?;
    eventually("why-viewer gets the live answer once granted pods/portforward", WAIT, || {
        last = as_viewer()?;
        Ok(last["live"] == true)
    })
    .with_context(|| format!("last answer: {last:#}"))?;
    ensure!(last["decision"]["delivery"] == "pipe" && last["decision"]["decidedAt"].is_string(), "{last:#}");
    env.kube().ok(&["delete", "clusterrole,clusterrolebinding", "why-viewer"])?;
    env.kube().ok(&["delete", "role,rolebinding", "-n", NS, "why-viewer"])?;
    env.kube().ok(&["delete", "endpointpolicy", "-n", "default", "why-pol-a", "why-pol-b"])?;
    for name in ["why-uds", "why-tcp", "why-pol"] {
        env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", name, "--wait=true"])?;
    }
    Ok(())
}

/// A pod named with a dot (as a Deployment `api.v2` makes them): Envoy's Prometheus output keeps
/// one metric family per kind, the whole pod identity in the cluster label.
pub(crate) fn a_dotted_pod_name_keeps_envoys_metric_names(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&echo_app("dots").pod_name("api.v2").annotated().manifest())?;
    let pod = env.wait_pod_ready("default", "api.v2")?;
    let pod_uid = uid(&pod)?;
    env.wait_pinned("app_default_api.v2_8080", &pod_uid, &env.socket_path(&pod_uid, "s", "app.sock"))?;
    let ip = pod["status"]["podIP"].as_str().context("the pod's IP")?.to_owned();
    let client = reqwest::blocking::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build()?;
    for _ in 0..3 {
        let body = client.get(format!("http://{ip}:8080/stats")).send()?.text()?;
        ensure!(body.contains("dots over unix"), "through the inbound listener: {body}");
    }
    let (_, prom) = envoy_admin("/stats/prometheus")?;
    let ours: Vec<&str> = prom.lines().filter(|l| l.contains("api~v2")).collect();
    println!("/stats/prometheus, series of pod default/api.v2 ({} in all), e.g.:", ours.len());
    for l in ours.iter().filter(|l| l.contains("upstream_cx_total") || l.contains("tcp_downstream_cx_total")) {
        println!("  {l}");
    }
    // Through the inbound listener's TCP proxy: one upstream connection (the client keeps it alive).
    let want = r#"envoy_cluster_upstream_cx_total{envoy_cluster_name="app_default_api~v2_8080"} "#;
    ensure!(prom.lines().any(|l| l.starts_with(want) && !l.ends_with(" 0")), "{want}<n ≥ 1> missing");
    let leaked: Vec<&str> =
        prom.lines().filter(|l| !l.starts_with('#') && l.split('{').next().unwrap_or(l).contains("v2")).collect();
    ensure!(leaked.is_empty(), "metric names carrying part of the pod name: {leaked:?}");
    env.kube().ok(&["delete", "pod", "-n", "default", "api.v2", "--wait=true"])?;
    env.kube().ok(&["delete", "service,serviceaccount", "-n", "default", "dots", "--wait=true"])?;
    Ok(())
}

/// The chart's observability, on the real node: with `metrics.*` on, its PodMonitors,
/// ServiceMonitor, PrometheusRule and dashboard ConfigMap pass the API server's validation
/// against the Prometheus Operator's CRDs (tests/vendor/prometheus-operator; an object off the
/// schema is refused); a real Prometheus, configured as the operator would configure it from the
/// monitors the API server stored (`aether_tests::prometheus`, the operator does not run here),
/// scrapes the agent, the controller and the node Envoy's stats listener (all targets up, and
/// the listener serves nothing but `/stats/prometheus`); it loads the chart's rules, none fails
/// to evaluate and none fires on this healthy node; every metric a rule reads and every query of
/// every dashboard panel returns series; and requests to a pod served over its socket count in
/// Envoy's stats for its cluster.
pub(crate) fn prometheus_scrapes_the_node_and_every_rule_and_panel_has_series(env: &Env) -> anyhow::Result<()> {
    use aether_tests::prometheus::{Prometheus, kubernetes_sd_targets, metric_names, scrape_configs};
    let kube = env.kube();
    kube.apply(&echo_app("scraped").annotated().manifest())?;
    let pod = env.wait_pod_ready("default", "scraped")?;
    let socket = env.socket_path(&uid(&pod)?, "s", "app.sock");
    env.wait_pinned("app_default_scraped_8080", &uid(&pod)?, &socket)?;
    let vendor = repo_root().join("tests/vendor/prometheus-operator");
    for crd in ["podmonitors", "servicemonitors", "prometheusrules"] {
        let file = vendor.join(format!("{crd}.yaml"));
        kube.ok(&["apply", "--server-side", "-f", file.to_str().context("path")?])?;
        kube.ok(&[
            "wait",
            "--for=condition=Established",
            &format!("crd/{crd}.monitoring.coreos.com"),
            "--timeout=60s",
        ])?;
    }
    // The schemas are enforced: a PodMonitor endpoint with a port number out of range is refused.
    let bad = "apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata: {name: bad, namespace: default}\nspec:\n  selector: {matchLabels: {a: b}}\n  podMetricsEndpoints: [{portNumber: 70000}]\n";
    let file = env.node.dir().join("bad-podmonitor.yaml");
    std::fs::write(&file, bad)?;
    let out = kube.run(&["apply", "--dry-run=server", "-f", file.to_str().context("path")?])?;
    ensure!(!out.status.success(), "the operator's schema let portNumber 70000 through");
    println!("schema check: {}", String::from_utf8_lossy(&out.stderr).trim());

    let on = [
        "metrics.podMonitor.enabled=true",
        "metrics.podMonitor.interval=5s",
        "metrics.podMonitor.scrapeTimeout=5s",
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.interval=5s",
        "metrics.serviceMonitor.scrapeTimeout=5s",
        "metrics.prometheusRule.enabled=true",
        "metrics.dashboard.enabled=true",
    ];
    env.helm_aether("upgrade", &on)?;
    check_release_settled(env)?;
    let stored = |kind: &str| -> anyhow::Result<Vec<Value>> {
        let v: Value = serde_json::from_str(&kube.ok(&["get", kind, "-n", NS, "-o", "json"])?)?;
        Ok(v["items"].as_array().cloned().unwrap_or_default())
    };
    let mut monitors = stored("podmonitors.monitoring.coreos.com")?;
    monitors.extend(stored("servicemonitors.monitoring.coreos.com")?);
    let rules = stored("prometheusrules.monitoring.coreos.com")?;
    let dashboards = stored("configmaps")?
        .into_iter()
        .filter(|c| c["metadata"]["labels"]["grafana_dashboard"] == "1")
        .collect::<Vec<_>>();
    ensure!(
        monitors.len() == 3 && rules.len() == 1 && dashboards.len() == 1,
        "stored: {} monitors, {} rules, {} dashboards",
        monitors.len(),
        rules.len(),
        dashboards.len()
    );

    // The stats listener serves only GET /stats/prometheus, without a query string.
    let ip = env.node.facts().node_ip.clone();
    let stats = |path: &str| -> anyhow::Result<(u16, String)> {
        let resp = reqwest::blocking::Client::new().get(format!("http://{ip}:{STATS_PORT}{path}")).send()?;
        Ok((resp.status().as_u16(), resp.text()?))
    };
    let (code, body) = stats("/stats/prometheus")?;
    ensure!(
        code == 200
            && body.contains("envoy_cluster_upstream_cx_total{envoy_cluster_name=\"app_default_scraped_8080\"}"),
        "stats listener: {code}"
    );
    ensure!(
        !body.contains("envoy_cluster_upstream_cx_rx_bytes_total"),
        "the default filter keeps out per-cluster byte counters"
    );
    for path in ["/stats/prometheus?filter=.*", "/config_dump", "/stats", "/quitquitquit"] {
        let (code, _) = stats(path)?;
        ensure!(code == 404, "{path} on the stats listener answered {code}");
    }

    let dir = env.node.dir().join("prometheus");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let groups: Vec<Value> =
        rules.iter().flat_map(|r| r["spec"]["groups"].as_array().cloned().unwrap_or_default()).collect();
    std::fs::write(dir.join("rules.yml"), serde_json::to_string(&serde_json::json!({ "groups": groups }))?)?;
    // Debian's Prometheus has no Kubernetes discovery: the test discovers as it would.
    for m in &monitors {
        let file = dir.join(format!(
            "{}_{}.json",
            m["metadata"]["namespace"].as_str().unwrap_or_default(),
            m["metadata"]["name"].as_str().unwrap_or_default()
        ));
        std::fs::write(file, serde_json::to_string(&kubernetes_sd_targets(&kube, m)?)?)?;
    }
    let config = serde_json::json!({
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
        "rule_files": [dir.join("rules.yml").display().to_string()],
        "scrape_configs": scrape_configs(&monitors, &dir)?,
    });
    let prom = Prometheus::start(&dir, &config)?;
    let jobs = [format!("{NS}/aether-node"), format!("{NS}/aether-proxy"), "aether-controller".to_owned()];
    let mut last = Vec::new();
    eventually("Prometheus's agent, Envoy and controller targets are up", WAIT, || {
        last = prom.targets()?;
        Ok(jobs.iter().all(|j| last.iter().any(|(job, _, health, _)| job == j && health == "up"))
            && last.iter().all(|(_, _, health, _)| health == "up"))
    })
    .with_context(|| format!("targets: {last:#?}\n{}", prom.log()))?;
    for (job, url, health, _) in &last {
        println!("target {job} {url} {health}");
    }

    // Requests through the pod's inbound listener count in Envoy's stats for its cluster.
    let pod_ip = pod["status"]["podIP"].as_str().context("the pod's IP")?.to_owned();
    for _ in 0..5 {
        let resp = reqwest::blocking::Client::new().get(format!("http://{pod_ip}:8080/hello")).send()?;
        let (status, body) = (resp.status(), resp.text()?);
        ensure!(status.is_success() && body.contains("over unix:/s/app.sock"), "the pod answered {status}: {body}");
    }
    let served = r#"envoy_cluster_upstream_cx_total{envoy_cluster_name="app_default_scraped_8080"} >= 5"#;
    eventually("Prometheus sees the pod's 5 connections in Envoy's stats", WAIT, || {
        Ok(!prom.query(served)?.is_empty())
    })?;

    // Two scrapes' worth of samples for rate() and the rules' first evaluations.
    std::thread::sleep(Duration::from_secs(20));
    let mut missing = Vec::new();
    let mut names_checked = 0;
    for group in &groups {
        for rule in group["rules"].as_array().into_iter().flatten() {
            let (alert, expr) = (rule["alert"].as_str().unwrap_or("?"), rule["expr"].as_str().unwrap_or_default());
            for name in metric_names(expr, &["aether_", "envoy_", "up"]) {
                names_checked += 1;
                if prom.query(&format!("count({name})"))?.is_empty() {
                    missing.push(format!("rule {alert}: {name}"));
                }
            }
        }
    }
    let substitute = |e: &str| {
        e.replace("$__rate_interval", "1m")
            .replace("$job_controller", ".*")
            .replace("$job_node", ".*")
            .replace("$job_proxy", ".*")
            .replace("$node", ".*")
    };
    let mut queries = 0;
    for cm in &dashboards {
        for (file, text) in cm["data"].as_object().into_iter().flatten() {
            let dash: Value =
                serde_json::from_str(text.as_str().unwrap_or_default()).with_context(|| format!("{file} is JSON"))?;
            for panel in dash["panels"].as_array().into_iter().flatten() {
                for target in panel["targets"].as_array().into_iter().flatten() {
                    let expr = substitute(target["expr"].as_str().unwrap_or_default());
                    queries += 1;
                    if prom.query(&expr)?.is_empty() {
                        missing.push(format!("panel {:?}: {expr}", panel["title"]));
                    }
                }
            }
            for var in dash["templating"]["list"].as_array().into_iter().flatten() {
                if let Some(q) = var["query"]["query"].as_str().and_then(|q| q.strip_prefix("label_values(")) {
                    let (metric, label) =
                        q.trim_end_matches(')').split_once(',').context("label_values(metric, label)")?;
                    queries += 1;
                    let values = prom.api(&format!("label/{}/values", label.trim()), &[("match[]", metric.trim())])?;
                    if values.as_array().is_none_or(Vec::is_empty) {
                        missing.push(format!("variable {}: {q}", var["name"]));
                    }
                }
            }
        }
    }
    ensure!(missing.is_empty(), "no series for:\n{}", missing.join("\n"));
    println!("{names_checked} metric names of the rules and {queries} dashboard queries return series");

    let loaded = prom.api("rules", &[])?;
    let mut count = 0;
    for group in loaded["groups"].as_array().into_iter().flatten() {
        for rule in group["rules"].as_array().into_iter().flatten() {
            count += 1;
            ensure!(rule["health"] == "ok", "rule {} does not evaluate: {}", rule["name"], rule["lastError"]);
            ensure!(rule["state"] != "firing", "alert {} fires on a healthy node: {}", rule["name"], rule["alerts"]);
        }
    }
    ensure!(count > 0, "Prometheus loaded no rule");
    println!("{count} rules loaded, evaluated, none firing");
    drop(prom);

    kube.ok(&["delete", "pod,service,serviceaccount", "-n", "default", "scraped", "--wait=true"])?;
    env.helm_aether("upgrade", &[])?;
    check_release_settled(env)?;
    Ok(())
}
