//! A real Prometheus (Debian's `prometheus` package, `/usr/bin/prometheus`) for the real-node
//! suite: started on a free loopback port with its own storage in a test folder, stopped by its
//! PID when dropped.
//!
//! The Prometheus Operator does not run in the tests. [`scrape_configs`] turns the chart's
//! PodMonitors and ServiceMonitors (as the API server stored them) into the scrape configuration
//! the operator would generate for them (its `pkg/prometheus/promcfg.go` at v0.90.1, the version
//! of `tests/vendor/prometheus-operator`): a `keep` per selector label, the port filter, the
//! `namespace`/`pod`/`container` and `job` labels, then the monitor's own relabelings.
//!
//! Debian's Prometheus is built without the Kubernetes service discovery (`kubernetes_sd_configs`
//! is refused as an unknown field), so [`kubernetes_sd_targets`] lists the pods or Endpoints as
//! that discovery would and writes its targets, with the same `__meta_kubernetes_*` labels, for
//! `file_sd_configs`. Prometheus then runs the relabelings, the scrapes and the rules itself.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

/// The Prometheus server binary of Debian's `prometheus` package (scripts/install-deps.sh, test).
pub const PROMETHEUS: &str = "/usr/bin/prometheus";

/// A running Prometheus; dropping it stops the process (SIGKILL by PID) and waits for it.
pub struct Prometheus {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Prometheus {
    /// Writes `config` (a Prometheus configuration as JSON, which is YAML) to `dir/prometheus.yml`
    /// and starts Prometheus with storage in `dir/data`, its log in `dir/prometheus.log`, on a
    /// free port of 127.0.0.1; waits for `/-/ready`.
    ///
    /// # Errors
    /// When the binary is missing, exits, or is not ready within 60 s (its log is included).
    pub fn start(dir: &Path, config: &Value) -> anyhow::Result<Self> {
        anyhow::ensure!(
            Path::new(PROMETHEUS).exists(),
            "{PROMETHEUS} is missing: `scripts/install-deps.sh test` installs Debian's prometheus package"
        );
        std::fs::create_dir_all(dir)?;
        let file = dir.join("prometheus.yml");
        std::fs::write(&file, serde_json::to_string_pretty(config)?)?;
        let port = crate::free_port();
        let log = dir.join("prometheus.log");
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", file.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {PROMETHEUS}"))?;
        let mut p = Prometheus { child, port, log };
        let deadline = Instant::now() + Duration::from_secs(60);
        while crate::http_get_status(port, "/-/ready") != Some(200) {
            if let Some(status) = p.child.try_wait()? {
                bail!("prometheus exited ({status}): {}", p.log());
            }
            if Instant::now() > deadline {
                bail!("prometheus not ready after 60 s: {}", p.log());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(p)
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET /api/v1/<path>` with `params`; the `data` of a `success` answer.
    ///
    /// # Errors
    /// When Prometheus does not answer, or answers an error (its `error` text).
    pub fn api(&self, path: &str, params: &[(&str, &str)]) -> anyhow::Result<Value> {
        let url = reqwest::Url::parse_with_params(&format!("http://127.0.0.1:{}/api/v1/{path}", self.port), params)?;
        let body: Value = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(20))
            .build()?
            .get(url)
            .send()?
            .json()
            .context("Prometheus's answer is JSON")?;
        if body["status"] != "success" {
            bail!("Prometheus: {} {}: {}", path, body["errorType"], body["error"]);
        }
        Ok(body["data"].clone())
    }

    /// The series an instant query of `expr` returns (its `result` array).
    ///
    /// # Errors
    /// What [`Prometheus::api`] returns (a query that does not parse among them).
    pub fn query(&self, expr: &str) -> anyhow::Result<Vec<Value>> {
        let data = self.api("query", &[("query", expr)])?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The active targets: `(job, scrape URL, health, last error)` each.
    ///
    /// # Errors
    /// What [`Prometheus::api`] returns.
    pub fn targets(&self) -> anyhow::Result<Vec<(String, String, String, String)>> {
        let data = self.api("targets", &[("state", "active")])?;
        Ok(data["activeTargets"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
                (s(&t["labels"]["job"]), s(&t["scrapeUrl"]), s(&t["health"]), s(&t["lastError"]))
            })
            .collect())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Prometheus's label-name rule: every character outside `[a-zA-Z0-9_]` becomes `_` (what the
/// operator's `sanitizeLabelName` and Kubernetes SD do to label keys).
fn sanitize(key: &str) -> String {
    key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
}

/// One monitor relabeling (the CRD's camelCase) as Prometheus's `relabel_configs` entry.
fn relabeling(r: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for (k, v) in r.as_object().into_iter().flatten() {
        let key = match k.as_str() {
            "sourceLabels" => "source_labels",
            "targetLabel" => "target_label",
            other => other,
        };
        out.insert(key.to_owned(), v.clone());
    }
    Value::Object(out)
}

/// The scrape configurations the Prometheus Operator generates for `monitors` (PodMonitor and
/// ServiceMonitor objects, `monitoring.coreos.com/v1`, as JSON), each discovering its targets from
/// the file `sd_dir/<namespace>_<name>.json` ([`kubernetes_sd_targets`] writes it). Selectors are `matchLabels` only (the chart uses nothing
/// else); endpoints by `port` name, `portNumber`, or neither (every target, for relabelings to
/// address). Jobs: `<namespace>/<name>` for a PodMonitor, the Service's name for a
/// ServiceMonitor, as the operator sets them.
///
/// # Errors
/// When a monitor is neither kind or has a selector other than `matchLabels`.
pub fn scrape_configs(monitors: &[Value], sd_dir: &Path) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for m in monitors {
        let (kind, ns, name) = (
            m["kind"].as_str().unwrap_or_default(),
            m["metadata"]["namespace"].as_str().unwrap_or_default(),
            m["metadata"]["name"].as_str().unwrap_or_default(),
        );
        let (meta, endpoints) = match kind {
            "PodMonitor" => ("pod", &m["spec"]["podMetricsEndpoints"]),
            "ServiceMonitor" => ("service", &m["spec"]["endpoints"]),
            other => bail!("{ns}/{name}: a {other} is not a monitor"),
        };
        if m["spec"]["selector"].get("matchExpressions").is_some() {
            bail!("{kind} {ns}/{name}: matchExpressions are not translated here");
        }
        for (i, ep) in endpoints.as_array().into_iter().flatten().enumerate() {
            let mut relabel = Vec::new();
            if kind == "PodMonitor" {
                relabel.push(json!({"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}));
            }
            for (k, v) in m["spec"]["selector"]["matchLabels"].as_object().into_iter().flatten() {
                let k = sanitize(k);
                relabel.push(json!({
                    "action": "keep",
                    "source_labels": [format!("__meta_kubernetes_{meta}_label_{k}"), format!("__meta_kubernetes_{meta}_labelpresent_{k}")],
                    "regex": format!("({});true", v.as_str().unwrap_or_default()),
                }));
            }
            let port_label = if kind == "PodMonitor" {
                "__meta_kubernetes_pod_container_port_name"
            } else {
                "__meta_kubernetes_endpoint_port_name"
            };
            if let Some(port) = ep["port"].as_str().filter(|p| !p.is_empty()) {
                relabel.push(json!({"action": "keep", "source_labels": [port_label], "regex": port}));
            } else if let Some(n) = ep["portNumber"].as_u64() {
                relabel.push(json!({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_number"], "regex": n.to_string()}));
            }
            relabel.push(json!({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}));
            relabel
                .push(json!({"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"}));
            relabel.push(json!({"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}));
            if kind == "PodMonitor" {
                relabel.push(json!({"target_label": "job", "replacement": format!("{ns}/{name}")}));
            } else {
                relabel.push(json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"}));
                relabel.push(json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"}));
            }
            relabel.extend(ep["relabelings"].as_array().into_iter().flatten().map(relabeling));
            let mut sc = json!({
                "job_name": format!("{}/{ns}/{name}/{i}", if kind == "PodMonitor" { "podMonitor" } else { "serviceMonitor" }),
                "honor_labels": false,
                "metrics_path": ep["path"].as_str().unwrap_or("/metrics"),
                "scheme": ep["scheme"].as_str().unwrap_or("http"),
                "file_sd_configs": [{"files": [sd_dir.join(format!("{ns}_{name}.json")).display().to_string()]}],
                "relabel_configs": relabel,
            });
            for (from, to) in [("interval", "scrape_interval"), ("scrapeTimeout", "scrape_timeout")] {
                if let Some(v) = ep[from].as_str() {
                    sc[to] = json!(v);
                }
            }
            out.push(sc);
        }
    }
    Ok(out)
}

/// What Prometheus's Kubernetes service discovery finds for `monitor` (a PodMonitor: role `pod`;
/// a ServiceMonitor: role `endpoints`) in the namespaces of its `namespaceSelector.matchNames`,
/// as `file_sd_configs` target groups with the discovery's `__meta_kubernetes_*` labels:
/// - role `pod`: per container (init containers too) one target per declared port
///   (`<pod IP>:<port>`, with the port's name, number and protocol), or one port-less target
///   (`<pod IP>`) for a container that declares none;
/// - role `endpoints`: one target per address and port of each Endpoints object, with its
///   Service's labels and, for an address backed by a pod, that pod's labels and the container
///   that declares the port.
///
/// # Errors
/// When kubectl fails or answers something that is not a list.
pub fn kubernetes_sd_targets(kube: &crate::Kubectl, monitor: &Value) -> anyhow::Result<Vec<Value>> {
    let list = |kind: &str, ns: &str| -> anyhow::Result<Vec<Value>> {
        let v: Value = serde_json::from_str(&kube.ok(&["get", kind, "-n", ns, "-o", "json"])?)?;
        v["items"].as_array().cloned().with_context(|| format!("kubectl get {kind} -n {ns}: no items"))
    };
    let labels_of = |prefix: &str, obj: &Value, out: &mut serde_json::Map<String, Value>| {
        for (k, v) in obj["metadata"]["labels"].as_object().into_iter().flatten() {
            let k = sanitize(k);
            out.insert(format!("__meta_kubernetes_{prefix}_label_{k}"), v.clone());
            out.insert(format!("__meta_kubernetes_{prefix}_labelpresent_{k}"), json!("true"));
        }
    };
    let pod_meta = |pod: &Value, out: &mut serde_json::Map<String, Value>| {
        let s = |v: &Value| json!(v.as_str().unwrap_or_default());
        out.insert("__meta_kubernetes_pod_name".into(), s(&pod["metadata"]["name"]));
        out.insert("__meta_kubernetes_pod_ip".into(), s(&pod["status"]["podIP"]));
        out.insert("__meta_kubernetes_pod_node_name".into(), s(&pod["spec"]["nodeName"]));
        out.insert("__meta_kubernetes_pod_phase".into(), s(&pod["status"]["phase"]));
        out.insert("__meta_kubernetes_pod_uid".into(), s(&pod["metadata"]["uid"]));
        labels_of("pod", pod, out);
    };
    let containers = |pod: &Value| -> Vec<(Value, bool)> {
        let of = |key: &str, init: bool| {
            pod["spec"][key].as_array().cloned().unwrap_or_default().into_iter().map(move |c| (c, init))
        };
        of("containers", false).chain(of("initContainers", true)).collect()
    };
    let mut groups = Vec::new();
    for ns in monitor["spec"]["namespaceSelector"]["matchNames"].as_array().into_iter().flatten() {
        let ns = ns.as_str().unwrap_or_default();
        match monitor["kind"].as_str() {
            Some("PodMonitor") => {
                for pod in list("pods", ns)? {
                    let ip = pod["status"]["podIP"].as_str().unwrap_or_default().to_owned();
                    if ip.is_empty() {
                        continue;
                    }
                    let mut common = serde_json::Map::new();
                    common.insert("__meta_kubernetes_namespace".into(), json!(ns));
                    pod_meta(&pod, &mut common);
                    let mut targets = Vec::new();
                    for (c, init) in containers(&pod) {
                        let mut labels = common.clone();
                        labels.insert("__meta_kubernetes_pod_container_name".into(), c["name"].clone());
                        labels.insert("__meta_kubernetes_pod_container_init".into(), json!(init.to_string()));
                        let ports = c["ports"].as_array().cloned().unwrap_or_default();
                        if ports.is_empty() {
                            targets.push(json!({"targets": [ip.clone()], "labels": labels}));
                        }
                        for p in ports {
                            let mut l = labels.clone();
                            let n = p["containerPort"].as_u64().unwrap_or_default();
                            l.insert(
                                "__meta_kubernetes_pod_container_port_name".into(),
                                json!(p["name"].as_str().unwrap_or_default()),
                            );
                            l.insert("__meta_kubernetes_pod_container_port_number".into(), json!(n.to_string()));
                            l.insert(
                                "__meta_kubernetes_pod_container_port_protocol".into(),
                                json!(p["protocol"].as_str().unwrap_or("TCP")),
                            );
                            targets.push(json!({"targets": [format!("{ip}:{n}")], "labels": l}));
                        }
                    }
                    groups.extend(targets);
                }
            }
            Some("ServiceMonitor") => {
                let services = list("services", ns)?;
                let pods = list("pods", ns)?;
                for ep in list("endpoints", ns)? {
                    let name = ep["metadata"]["name"].as_str().unwrap_or_default();
                    let Some(svc) = services.iter().find(|s| s["metadata"]["name"] == name) else { continue };
                    for subset in ep["subsets"].as_array().into_iter().flatten() {
                        for addr in subset["addresses"].as_array().into_iter().flatten() {
                            for port in subset["ports"].as_array().into_iter().flatten() {
                                let (ip, n) = (
                                    addr["ip"].as_str().unwrap_or_default(),
                                    port["port"].as_u64().unwrap_or_default(),
                                );
                                let mut l = serde_json::Map::new();
                                l.insert("__meta_kubernetes_namespace".into(), json!(ns));
                                l.insert("__meta_kubernetes_endpoints_name".into(), json!(name));
                                l.insert("__meta_kubernetes_service_name".into(), json!(name));
                                l.insert(
                                    "__meta_kubernetes_endpoint_port_name".into(),
                                    json!(port["name"].as_str().unwrap_or_default()),
                                );
                                l.insert(
                                    "__meta_kubernetes_endpoint_port_protocol".into(),
                                    json!(port["protocol"].as_str().unwrap_or("TCP")),
                                );
                                l.insert("__meta_kubernetes_endpoint_ready".into(), json!("true"));
                                labels_of("service", svc, &mut l);
                                let pod = pods.iter().find(|p| {
                                    addr["targetRef"]["kind"] == "Pod"
                                        && p["metadata"]["name"] == addr["targetRef"]["name"]
                                });
                                if let Some(pod) = pod {
                                    pod_meta(pod, &mut l);
                                    for (c, _) in containers(pod) {
                                        if c["ports"]
                                            .as_array()
                                            .into_iter()
                                            .flatten()
                                            .any(|p| p["containerPort"].as_u64() == Some(n))
                                        {
                                            l.insert("__meta_kubernetes_pod_container_name".into(), c["name"].clone());
                                        }
                                    }
                                }
                                groups.push(json!({"targets": [format!("{ip}:{n}")], "labels": l}));
                            }
                        }
                    }
                }
            }
            other => bail!("{other:?} is not a monitor kind"),
        }
    }
    Ok(groups)
}

/// The metric names `expr` (PromQL) reads: every identifier that starts with one of `prefixes`,
/// outside label matchers (`{...}`) and outside the label lists of `by`, `without`, `on`,
/// `ignoring`, `group_left` and `group_right`; each once, in order. A lexical scan, not a parser.
pub fn metric_names(expr: &str, prefixes: &[&str]) -> Vec<String> {
    const LABEL_LISTS: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];
    let b = expr.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    // Skips from the opening `open` at `i` to after its matching `close` (quotes respected).
    let skip = |mut i: usize, open: u8, close: u8| {
        let (mut depth, mut quote) = (0usize, None);
        while i < b.len() {
            let c = b[i];
            match quote {
                Some(_) if c == b'\\' => i += 1,
                Some(q) if c == q => quote = None,
                Some(_) => {}
                None if c == b'"' || c == b'\'' || c == b'`' => quote = Some(c),
                None if c == open => depth += 1,
                None if c == close => {
                    depth -= 1;
                    if depth == 0 {
                        return i + 1;
                    }
                }
                None => {}
            }
            i += 1;
        }
        i
    };
    let mut names: Vec<String> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'{' {
            i = skip(i, b'{', b'}');
        } else if c == b'"' || c == b'\'' || c == b'`' {
            i += 1;
            while i < b.len() && b[i] != c {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
            let word = &expr[start..i];
            if LABEL_LISTS.contains(&word) {
                let mut j = i;
                while j < b.len() && b[j].is_ascii_whitespace() {
                    j += 1;
                }
                if j < b.len() && b[j] == b'(' {
                    i = skip(j, b'(', b')');
                }
            } else if prefixes.iter().any(|p| word.starts_with(p)) && !names.iter().any(|n| n == word) {
                names.push(word.to_owned());
            }
        } else if c.is_ascii_digit() {
            while i < b.len() && (ident(b[i]) || b[i] == b'.') {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_names_skip_label_values_and_repeat_nothing() {
        let expr = r#"sum by (envoy_cluster_name) (rate(aether_admission_duration_seconds_bucket{job=~"aether_x",envoy_x="}"}[5m])) / ignoring(envoy_y) aether_admission_duration_seconds_bucket > on (aether_z) group_left(envoy_w) envoy_server_live"#;
        assert_eq!(
            metric_names(expr, &["aether_", "envoy_"]),
            ["aether_admission_duration_seconds_bucket", "envoy_server_live"]
        );
        assert_eq!(metric_names("up{job=\"a\"} == 0 and 1e3 > 2", &["up"]), ["up"]);
    }

    #[test]
    fn a_pod_monitor_becomes_the_operators_relabelings() {
        let pm = json!({"kind": "PodMonitor", "metadata": {"namespace": "n", "name": "m"},
            "spec": {"namespaceSelector": {"matchNames": ["n"]}, "selector": {"matchLabels": {"app.kubernetes.io/name": "a"}},
              "podMetricsEndpoints": [{"port": "admin", "path": "/metrics", "relabelings": [{"action": "replace", "sourceLabels": ["x"], "targetLabel": "y"}]}]}});
        let sc = &scrape_configs(&[pm], Path::new("/sd")).expect("translates")[0];
        let r = sc["relabel_configs"].as_array().expect("relabelings");
        assert_eq!(r[1]["source_labels"][0], "__meta_kubernetes_pod_label_app_kubernetes_io_name");
        assert_eq!(r[1]["regex"], "(a);true");
        assert_eq!(r[2]["regex"], "admin");
        assert_eq!(r.last().expect("one")["target_label"], "y");
        assert_eq!(sc["file_sd_configs"][0]["files"][0], "/sd/n_m.json");
    }
}
