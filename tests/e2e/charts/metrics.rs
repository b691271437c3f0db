//! The monitoring objects: `monitors_are_rendered_only_when_enabled_and_scrape_the_admin_ports`
//! and `the_dashboard_configmap_carries_the_dashboard_for_grafanas_sidecar`.
//!
//! What they prove: the ServiceMonitor and PodMonitors are rendered only when enabled, and each
//! selects the pods that serve `/metrics` on the port the binary's `--admin-addr` names (the node
//! Envoy's at `proxy.stats.port`); the Grafana dashboard ConfigMap is rendered only when enabled,
//! with the sidecar's label, and every panel query reads the data source variable.

use serde_json::Value;

use crate::template::{NS, container, find, flag, has, render, try_render};

/// The container port named `port` in `c`, and the port of `c`'s `--admin-addr` flag.
fn named_port_and_admin_flag(c: &Value, port: &str) -> (u64, u64) {
    let container_port = c["ports"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == port))
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("container {} has no port named {port}", c["name"]));
    let flag = flag(c, "--admin-addr").unwrap_or_else(|| panic!("container {} has no --admin-addr", c["name"]));
    let flag_port = flag.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).expect("--admin-addr HOST:PORT");
    (container_port, flag_port)
}

/// `metrics.serviceMonitor` (controller) and `metrics.podMonitor` (node pods, on the host network:
/// no Service selects them) are rendered only when enabled, each on its own; each selects what
/// the controller Service / the DaemonSet's pods carry, on the port that serves `/metrics` (the
/// binary's `--admin-addr`). Rendering is the test: the test API server has no
/// monitoring.coreos.com CRDs to accept the objects.
pub(crate) fn monitors_are_rendered_only_when_enabled_and_scrape_the_admin_ports() {
    let off = render(&[]);
    assert!(!has(&off, "ServiceMonitor") && !has(&off, "PodMonitor"), "off by default");
    let only_pods = render(&["metrics.podMonitor.enabled=true"]);
    assert!(has(&only_pods, "PodMonitor") && !has(&only_pods, "ServiceMonitor"));
    let only_controller = render(&["metrics.serviceMonitor.enabled=true"]);
    assert!(has(&only_controller, "ServiceMonitor") && !has(&only_controller, "PodMonitor"));

    let on = render(&[
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.interval=15s",
        "metrics.serviceMonitor.labels.release=prom",
        "metrics.podMonitor.enabled=true",
        "metrics.podMonitor.scrapeTimeout=",
        "controller.adminPort=9191",
        "agent.adminPort=9292",
    ]);
    // The controller: the ServiceMonitor selects the Service, whose named port targets the
    // container's admin port, which is the one the controller serves /metrics on.
    let sm = find(&on, "ServiceMonitor", "aether-controller");
    assert_eq!(sm["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(sm["metadata"]["namespace"], NS);
    assert_eq!(sm["metadata"]["labels"]["release"], "prom");
    let svc = find(&on, "Service", "aether-controller");
    let selector = sm["spec"]["selector"]["matchLabels"].as_object().expect("matchLabels");
    assert!(!selector.is_empty());
    for (k, v) in selector {
        assert_eq!(&svc["metadata"]["labels"][k], v, "the Service lacks the ServiceMonitor's label {k}");
    }
    assert_eq!(sm["spec"]["namespaceSelector"]["matchNames"][0], NS);
    let ep = &sm["spec"]["endpoints"][0];
    assert_eq!(
        (ep["path"].as_str(), ep["interval"].as_str(), ep["scrapeTimeout"].as_str()),
        (Some("/metrics"), Some("15s"), Some("10s"))
    );
    let svc_port = svc["spec"]["ports"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == ep["port"]))
        .unwrap_or_else(|| panic!("the Service has no port named {}", ep["port"]));
    let deploy = find(&on, "Deployment", "aether-controller");
    let target = svc_port["targetPort"].as_str().expect("a named targetPort");
    let controller = container(&deploy["spec"]["template"]["spec"], "aether-controller");
    assert_eq!(named_port_and_admin_flag(controller, target), (9191, 9191));

    // The node: the PodMonitor selects the DaemonSet's pods on the agent's admin port.
    let pm = find(&on, "PodMonitor", "aether-node");
    assert_eq!(pm["metadata"]["namespace"], NS);
    assert!(pm["metadata"]["labels"].get("release").is_none(), "labels are per object");
    let ds = find(&on, "DaemonSet", "aether-node");
    let selector = pm["spec"]["selector"]["matchLabels"].as_object().expect("matchLabels");
    assert!(!selector.is_empty());
    for (k, v) in selector {
        assert_eq!(
            &ds["spec"]["template"]["metadata"]["labels"][k], v,
            "the node pods lack the PodMonitor's label {k}"
        );
    }
    let ep = &pm["spec"]["podMetricsEndpoints"][0];
    assert_eq!(ep["path"], "/metrics");
    assert!(ep.get("scrapeTimeout").is_none(), "an empty value leaves Prometheus's default: {ep}");
    let agent = container(&ds["spec"]["template"]["spec"], "aether-agent");
    assert_eq!(named_port_and_admin_flag(agent, ep["port"].as_str().expect("a named port")), (9292, 9292));

    // The node Envoy's stats: the proxy pods declare no ports, so the endpoint names none and
    // its relabelings keep the envoy container and address it at <pod IP>:<proxy.stats.port>.
    let pm = find(&on, "PodMonitor", "aether-proxy");
    let ds = find(&on, "DaemonSet", "aether-proxy");
    for (k, v) in pm["spec"]["selector"]["matchLabels"].as_object().expect("matchLabels") {
        assert_eq!(&ds["spec"]["template"]["metadata"]["labels"][k], v, "the proxy pods lack the label {k}");
    }
    let ep = &pm["spec"]["podMetricsEndpoints"][0];
    assert_eq!(ep["path"], "/stats/prometheus");
    assert!(ep.get("port").is_none() && ep.get("portNumber").is_none(), "{ep}");
    let relabel = ep["relabelings"].as_array().expect("relabelings");
    assert_eq!(relabel[0]["regex"], "envoy;false");
    assert!(container(&ds["spec"]["template"]["spec"], "envoy")["name"] == "envoy");
    assert_eq!(relabel[1]["replacement"], "${1}:15090");
    // The pod IP (the node's primary one) becomes the address, an IPv6 one in brackets: the
    // relabelings applied as Prometheus does (fully anchored RE2, `${1}` replaced, no match: no
    // change).
    let address = |pod_ip: &str| {
        let mut address = String::from("unset");
        for r in relabel.iter().filter(|r| r["sourceLabels"][0] == "__meta_kubernetes_pod_ip") {
            assert_eq!(r["targetLabel"], "__address__", "{r}");
            let re = regex::Regex::new(&format!("^(?:{})$", r["regex"].as_str().expect("regex"))).expect("RE2 syntax");
            if let Some(c) = re.captures(pod_ip) {
                address = r["replacement"].as_str().expect("replacement").replace("${1}", &c[1]);
            }
        }
        address
    };
    assert_eq!(address("10.0.0.5"), "10.0.0.5:15090");
    assert_eq!(address("fd00:10:244:1::5"), "[fd00:10:244:1::5]:15090");
    assert_eq!(address("::ffff:10.0.0.5"), "[::ffff:10.0.0.5]:15090");
    let moved = render(&["metrics.podMonitor.enabled=true", "proxy.stats.port=19090"]);
    assert_eq!(
        find(&moved, "PodMonitor", "aether-proxy")["spec"]["podMetricsEndpoints"][0]["relabelings"][1]["replacement"],
        "${1}:19090"
    );
    let off = render(&["metrics.podMonitor.enabled=true", "proxy.stats.port=0"]);
    assert!(
        has(&off, "PodMonitor")
            && off.iter().all(|d| d["metadata"]["name"] != "aether-proxy" || d["kind"] != "PodMonitor"),
        "no stats listener, no proxy PodMonitor"
    );
    match try_render(&["proxy.stats.port=70000"]) {
        Ok(_) => panic!("proxy.stats.port=70000 rendered"),
        Err(e) => assert!(e.contains("stats"), "{e}"),
    }

    match try_render(&["metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.interval=soon"]) {
        Ok(_) => panic!("interval=soon rendered; the schema should refuse it"),
        Err(e) => assert!(e.contains("interval"), "{e}"),
    }
}

/// `metrics.dashboard`: the Grafana dashboard ConfigMap is rendered only when enabled, in the
/// namespace asked for (the release's by default), with the sidecar's label; its one file is the
/// dashboard JSON, whose every panel query reads the Prometheus data source variable.
pub(crate) fn the_dashboard_configmap_carries_the_dashboard_for_grafanas_sidecar() {
    assert!(!render(&[]).iter().any(|d| d["metadata"]["name"] == "aether-dashboard"), "off by default");
    let on = render(&["metrics.dashboard.enabled=true"]);
    let cm = find(&on, "ConfigMap", "aether-dashboard");
    assert_eq!(cm["metadata"]["namespace"], NS);
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let dash: Value = serde_json::from_str(cm["data"]["aether.json"].as_str().expect("aether.json")).expect("JSON");
    assert_eq!(dash["uid"], "aether-overview");
    let targets: Vec<&Value> = dash["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .collect();
    assert!(targets.len() >= 10, "{} queries", targets.len());
    for t in targets {
        assert_eq!(t["datasource"]["uid"], "${datasource}", "{t}");
        assert!(!t["expr"].as_str().unwrap_or_default().is_empty(), "{t}");
    }
    let moved = render(&["metrics.dashboard.enabled=true", "metrics.dashboard.namespace=monitoring"]);
    assert_eq!(find(&moved, "ConfigMap", "aether-dashboard")["metadata"]["namespace"], "monitoring");
}
