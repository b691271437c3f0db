//! The Helm charts: `helm lint`, `helm template` over a matrix of values with assertions on the
//! rendered objects, the schema refusing bad values, the RBAC report against `docs/rbac.md`, the
//! per-version content digests, and the rendered chart applied to a real kube-apiserver with
//! `kubectl auth can-i` checks per ServiceAccount.
//!
//! The tests that need an API server share one ([`ControlPlane::shared`]): the NOTES tests only
//! render (`helm install --dry-run=client`), so the chart the RBAC test applies cannot disturb
//! them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use aether_controller::webhook::MIN_MAX_BODY_BYTES;
use aether_crds::udspath::{
    Budget, DEFAULT_PODS_DIR, FIXED_BYTES, MAX_PODS_DIR_BYTES, MIN_VALUE_BYTES, SUN_PATH_MAX, SocketError,
};
use aether_tests::{ControlPlane, repo_root, tools_bin};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

const RELEASE: &str = "aether";
const NS: &str = "aether-system";

fn helm() -> PathBuf {
    tools_bin().join("helm")
}

fn chart(name: &str) -> PathBuf {
    repo_root().join("charts").join(name)
}

/// `helm template` of the main chart with `--set` values; Err carries helm's stderr.
fn try_render(sets: &[&str]) -> Result<Vec<Value>, String> {
    let text = try_render_text("aether", sets)?;
    let mut docs = Vec::new();
    for de in yaml_serde::Deserializer::from_str(&text) {
        let v = Value::deserialize(de).map_err(|e| format!("rendered YAML does not parse: {e}"))?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

fn try_render_text(chart_name: &str, sets: &[&str]) -> Result<String, String> {
    try_render_text_with(chart_name, sets, &[])
}

/// [`try_render_text`] with extra `helm template` flags (e.g. `--skip-tests`).
fn try_render_text_with(chart_name: &str, sets: &[&str], flags: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new(helm());
    cmd.args(["template", RELEASE]).arg(chart(chart_name)).args(["--namespace", NS]).args(flags);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| format!("running {}: {e}", helm().display()))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn render(sets: &[&str]) -> Vec<Value> {
    try_render(sets).unwrap_or_else(|e| panic!("helm template {sets:?} failed: {e}"))
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

fn has(docs: &[Value], kind: &str) -> bool {
    docs.iter().any(|d| d["kind"] == kind)
}

fn container<'a>(pod_spec: &'a Value, name: &str) -> &'a Value {
    pod_spec["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn args(c: &Value) -> Vec<String> {
    c["args"].as_array().map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect()).unwrap_or_default()
}

fn flag(c: &Value, name: &str) -> Option<String> {
    let prefix = format!("{name}=");
    args(c).iter().find_map(|a| a.strip_prefix(&prefix).map(str::to_owned))
}

/// One row of the values matrix.
struct Case {
    name: &'static str,
    sets: &'static [&'static str],
    uds: bool,
    host_dir: &'static str,
    mount: &'static str,
    mode: &'static str,
}

const PROVIDED_CA: &str = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==";

const MATRIX: &[Case] = &[
    Case {
        name: "defaults",
        sets: &[],
        uds: true,
        host_dir: "/var/lib/kubelet/pods",
        mount: "/var/lib/kubelet/pods",
        mode: "selfSigned",
    },
    Case {
        name: "pinning off",
        sets: &["agent.pinning.enabled=false"],
        uds: true,
        host_dir: "/var/lib/kubelet/pods",
        mount: "/var/lib/kubelet/pods",
        mode: "selfSigned",
    },
    Case {
        name: "uds disabled",
        sets: &["proxy.udsWorkloads.enabled=false"],
        uds: false,
        host_dir: "/var/lib/kubelet/pods",
        mount: "/var/lib/kubelet/pods",
        mode: "selfSigned",
    },
    Case {
        name: "k0s pods dir",
        sets: &[
            "proxy.udsWorkloads.hostPodsDir=/var/lib/k0s/kubelet/pods",
            "proxy.udsWorkloads.mountPath=/var/lib/k0s/kubelet/pods",
        ],
        uds: true,
        host_dir: "/var/lib/k0s/kubelet/pods",
        mount: "/var/lib/k0s/kubelet/pods",
        mode: "selfSigned",
    },
    Case {
        name: "short mount path",
        sets: &["proxy.udsWorkloads.mountPath=/k"],
        uds: true,
        host_dir: "/var/lib/kubelet/pods",
        mount: "/k",
        mode: "selfSigned",
    },
    Case {
        name: "microk8s at a short mount path",
        sets: &[
            "proxy.udsWorkloads.hostPodsDir=/var/snap/microk8s/common/var/lib/kubelet/pods",
            "proxy.udsWorkloads.mountPath=/k",
        ],
        uds: true,
        host_dir: "/var/snap/microk8s/common/var/lib/kubelet/pods",
        mount: "/k",
        mode: "selfSigned",
    },
    Case {
        name: "certManager",
        sets: &["webhook.certs.mode=certManager"],
        uds: true,
        host_dir: "/var/lib/kubelet/pods",
        mount: "/var/lib/kubelet/pods",
        mode: "certManager",
    },
    Case {
        name: "provided",
        sets: &[
            "webhook.certs.mode=provided",
            "webhook.certs.provided.secretName=my-webhook-tls",
            "webhook.certs.provided.caBundle=LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==",
        ],
        uds: true,
        host_dir: "/var/lib/kubelet/pods",
        mount: "/var/lib/kubelet/pods",
        mode: "provided",
    },
];

/// SELinux nodes: the node pod runs as spc_t by default (else a confined agent cannot read other
/// pods' emptyDirs), options are the user's to set, and `enabled=false` leaves labelling to the
/// runtime. No SELinux host here: the real-node suite runs the default label on a node without
/// SELinux, where the runtime ignores it.
#[test]
fn the_node_pod_runs_as_spc_t_unless_selinux_labelling_is_turned_off() {
    let pod_security = |sets: &[&str]| {
        let docs = render(sets);
        let agent = find(&docs, "DaemonSet", "aether-node")["spec"]["template"]["spec"]["securityContext"].clone();
        let proxy = &find(&docs, "DaemonSet", "aether-proxy")["spec"]["template"]["spec"]["securityContext"];
        assert_eq!(&agent, proxy, "{sets:?}: the agent's and the proxy's pods are labelled alike");
        agent
    };
    assert_eq!(pod_security(&[])["seLinuxOptions"], serde_json::json!({"type": "spc_t"}));
    assert_eq!(
        pod_security(&["daemonset.seLinux.options.level=s0"])["seLinuxOptions"],
        serde_json::json!({"type": "spc_t", "level": "s0"})
    );
    assert!(pod_security(&["daemonset.seLinux.enabled=false"]).get("seLinuxOptions").is_none());
    let bad = try_render(&["daemonset.seLinux.options.kind=x"]);
    assert!(bad.is_err_and(|e| e.contains("kind")), "the schema refuses unknown seLinuxOptions fields");
}

#[test]
fn helm_lint_passes_for_both_charts() {
    for name in ["aether", "aether-crds"] {
        let out = Command::new(helm()).args(["lint", "--strict"]).arg(chart(name)).output().expect("running helm");
        assert!(
            out.status.success(),
            "helm lint {name}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn check_controller(case: &Case, docs: &[Value]) {
    let dep = find(docs, "Deployment", "aether-controller");
    assert_eq!(dep["spec"]["replicas"], 2, "{}", case.name);
    let pod = &dep["spec"]["template"]["spec"];
    let c = container(pod, "aether-controller");
    assert_eq!(flag(c, "--kubelet-pods-dir").as_deref(), Some(case.mount), "{}: controller budget flag", case.name);
    assert_eq!(flag(c, "--socket-limit").as_deref(), Some("sun-path"), "{}: the default socket limit", case.name);
    assert_eq!(flag(c, "--tls-dir").as_deref(), Some("/etc/aether/webhook-tls"));
    assert_eq!(c["securityContext"]["runAsNonRoot"], true);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(c[probe]["httpGet"]["path"], path);
        assert_eq!(c[probe]["httpGet"]["port"], "admin");
    }
    let ports = c["ports"].as_array().expect("ports");
    let port_of = |n: &str| ports.iter().find(|p| p["name"] == n).map(|p| p["containerPort"].clone());
    assert_eq!(port_of("admin"), Some(Value::from(9090)));
    assert_eq!(port_of("webhook"), Some(Value::from(10250)));
    assert_eq!(flag(c, "--admin-addr").as_deref(), Some("0.0.0.0:9090"));
    assert_eq!(flag(c, "--webhook-addr").as_deref(), Some("0.0.0.0:10250"));
    assert!(dep["spec"]["template"]["spec"].get("hostNetwork").is_none(), "pod network by default");

    let pdb = find(docs, "PodDisruptionBudget", "aether-controller");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(pdb["spec"]["selector"]["matchLabels"], dep["spec"]["selector"]["matchLabels"]);

    let svc = find(docs, "Service", "aether-controller");
    let https = &svc["spec"]["ports"][0];
    assert_eq!((https["port"].clone(), https["targetPort"].clone()), (Value::from(443), Value::from("webhook")));
    assert_eq!(svc["spec"]["selector"], dep["spec"]["selector"]["matchLabels"]);
}

fn check_webhook(case: &Case, docs: &[Value]) {
    let cfg = find(docs, "ValidatingWebhookConfiguration", "aether-endpointpolicy");
    let hooks = cfg["webhooks"].as_array().expect("webhooks");
    assert_eq!(hooks.len(), 1);
    let w = &hooks[0];
    assert_eq!(w["sideEffects"], "None");
    assert_eq!(w["admissionReviewVersions"], serde_json::json!(["v1"]));
    assert_eq!(w["failurePolicy"], "Fail");
    assert!(w["timeoutSeconds"].as_u64().is_some_and(|t| (1..=10).contains(&t)));
    assert_eq!(
        w["rules"],
        serde_json::json!([{ "apiGroups": ["config.aether.io"], "apiVersions": ["v1"], "resources": ["endpointpolicies"],
            "operations": ["CREATE", "UPDATE"], "scope": "Namespaced" }]),
        "only EndpointPolicy CREATE/UPDATE"
    );
    let svc = &w["clientConfig"]["service"];
    assert_eq!((svc["name"].as_str(), svc["namespace"].as_str()), (Some("aether-controller"), Some(NS)));
    assert_eq!((svc["path"].as_str(), svc["port"].as_u64()), (Some("/validate"), Some(443)));

    let dep = find(docs, "Deployment", "aether-controller");
    let secret = dep["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"].as_str().expect("secret volume");
    let job = docs.iter().find(|d| d["kind"] == "Job" && d["metadata"]["name"] == "aether-webhook-certs");
    let cleanup = docs.iter().find(|d| d["kind"] == "Job" && d["metadata"]["name"] == "aether-webhook-certs-cleanup");
    let inject = cfg["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].as_str();
    match case.mode {
        "selfSigned" => {
            let job = job.expect("selfSigned renders the cert Job");
            let hooks = job["metadata"]["annotations"]["helm.sh/hook"].as_str().expect("a hook");
            for h in ["pre-install", "post-install", "post-upgrade"] {
                assert!(hooks.split(',').any(|x| x == h), "cert Job lacks hook {h}");
            }
            let c = container(&job["spec"]["template"]["spec"], "aether-webhook-certs");
            assert_eq!(args(c).first().map(String::as_str), Some("bootstrap"));
            // helm uninstall: a post-delete Job removes the Secret bootstrap made.
            let cleanup = cleanup.expect("selfSigned renders the cleanup Job");
            assert_eq!(cleanup["metadata"]["annotations"]["helm.sh/hook"], "post-delete");
            let cc = container(&cleanup["spec"]["template"]["spec"], "aether-webhook-certs");
            assert_eq!(args(cc).first().map(String::as_str), Some("cleanup"));
            assert_eq!(flag(cc, "--secret-name").as_deref(), Some(secret));
            assert_eq!(flag(c, "--namespace").as_deref(), Some(NS));
            assert_eq!(flag(c, "--secret-name").as_deref(), Some(secret));
            assert_eq!(flag(c, "--service-name").as_deref(), Some("aether-controller"));
            assert_eq!(flag(c, "--webhook-config-name").as_deref(), Some("aether-endpointpolicy"));
            assert!(inject.is_none() && !has(docs, "Certificate"));
        }
        "certManager" => {
            assert!(job.is_none() && cleanup.is_none(), "no cert Jobs with cert-manager");
            let cert = find(docs, "Certificate", "aether-webhook");
            assert_eq!(cert["spec"]["secretName"].as_str(), Some(secret));
            assert_eq!(inject, Some(format!("{NS}/aether-webhook").as_str()));
            let dns: Vec<_> = cert["spec"]["dnsNames"].as_array().expect("dnsNames").iter().collect();
            assert!(dns.contains(&&Value::from(format!("aether-controller.{NS}.svc"))));
            assert!(w["clientConfig"].get("caBundle").is_none(), "cert-manager injects the caBundle");
        }
        "provided" => {
            assert!(job.is_none() && cleanup.is_none() && inject.is_none() && !has(docs, "Certificate"));
            assert_eq!(secret, "my-webhook-tls");
            assert_eq!(w["clientConfig"]["caBundle"], PROVIDED_CA);
        }
        other => panic!("unknown mode {other}"),
    }
}

fn check_node(case: &Case, docs: &[Value]) {
    // Two DaemonSets: the agent's (aether-node) and Envoy's (aether-proxy), each with one
    // container, on the same nodes (the same scheduling values), both on the host network.
    let ds = find(docs, "DaemonSet", "aether-node");
    let pod = &ds["spec"]["template"]["spec"];
    let proxy = &find(docs, "DaemonSet", "aether-proxy")["spec"]["template"]["spec"];
    for key in ["hostNetwork", "tolerations", "nodeSelector", "priorityClassName", "securityContext"] {
        assert_eq!(pod[key], proxy[key], "{}: both node pods share {key}", case.name);
    }
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(
        (pod["containers"].as_array().map(Vec::len), proxy["containers"].as_array().map(Vec::len)),
        (Some(1), Some(1))
    );
    assert_eq!(proxy["automountServiceAccountToken"], false, "Envoy's pod has no API credentials");
    let agent = container(pod, "aether-agent");
    let envoy = container(proxy, "envoy");
    // helm uninstall (this DaemonSet gone) is when the agent removes the pins and health.sock.
    assert_eq!(flag(agent, "--own-daemonset").as_deref(), Some("$(POD_NAMESPACE)/aether-node"));
    assert!(
        agent["env"]
            .as_array()
            .expect("env")
            .iter()
            .any(|e| e["name"] == "POD_NAMESPACE" && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace")
    );
    assert_eq!(envoy["securityContext"]["privileged"], true, "the proxy is privileged");
    assert_eq!(envoy["securityContext"]["readOnlyRootFilesystem"], true);
    // Socket pinning (default on) mounts: the agent is privileged, its pin dir Bidirectional and
    // Envoy's HostToContainer (read-only); off, the agent keeps only DAC_READ_SEARCH.
    let pin_mount =
        |c: &Value| c["volumeMounts"].as_array().into_iter().flatten().find(|m| m["name"] == "pins").cloned();
    if flag(agent, "--pin-dir").is_some() {
        assert_eq!(flag(agent, "--pin-dir").as_deref(), Some("/run/aether-pins"));
        assert_eq!(agent["securityContext"]["privileged"], true, "mounting pins needs a privileged agent");
        let (a, e) = (pin_mount(agent).expect("agent pin mount"), pin_mount(envoy).expect("envoy pin mount"));
        assert_eq!(
            (a["mountPath"].as_str(), a["mountPropagation"].as_str()),
            (Some("/run/aether-pins"), Some("Bidirectional"))
        );
        assert_eq!((e["mountPropagation"].as_str(), e["readOnly"].as_bool()), (Some("HostToContainer"), Some(true)));
    } else {
        assert_eq!(agent["securityContext"]["capabilities"]["drop"], serde_json::json!(["ALL"]));
        assert_eq!(agent["securityContext"]["allowPrivilegeEscalation"], false);
        assert!(pin_mount(agent).is_none() && pin_mount(envoy).is_none());
    }

    assert_eq!(flag(agent, "--socket-limit").as_deref(), Some("sun-path"), "{}: the default socket limit", case.name);
    // xDS and health sockets in the shared /run/aether, and Envoy's ADS pointing at the agent.
    assert_eq!(flag(agent, "--xds-address").as_deref(), Some("unix:///run/aether/xds.sock"));
    assert_eq!(flag(agent, "--health-socket").as_deref(), Some("/run/aether/health.sock"));
    let mounts = |c: &Value| c["volumeMounts"].as_array().cloned().unwrap_or_default();
    for c in [agent, envoy] {
        assert!(mounts(c).iter().any(|m| m["name"] == "run" && m["mountPath"] == "/run/aether"));
    }
    let bootstrap =
        find(docs, "ConfigMap", "aether-node-envoy-bootstrap")["data"]["envoy.yaml"].as_str().expect("envoy.yaml");
    let boot: Value = yaml_serde::from_str(bootstrap).expect("the bootstrap is YAML");
    assert_eq!(boot["dynamic_resources"]["ads_config"]["grpc_services"][0]["envoy_grpc"]["cluster_name"], "aether_xds");
    assert_eq!(
        boot["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
            ["pipe"]["path"],
        "/run/aether/xds.sock"
    );
    assert!(mounts(agent).iter().any(|m| m["name"] == "state" && m["mountPath"] == "/var/lib/aether/agent"));
    // Pod netns from containerd over CRI: the socket's directory, read-only, for the agent only.
    assert_eq!(flag(agent, "--cri-endpoint").as_deref(), Some("unix:///run/containerd/containerd.sock"));
    assert_eq!(flag(agent, "--netns-host-dir").as_deref(), Some("/run/netns"));
    assert!(
        mounts(agent)
            .iter()
            .any(|m| m["name"] == "cri" && m["mountPath"] == "/run/containerd" && m["readOnly"] == true)
    );
    assert!(mounts(envoy).iter().all(|m| m["name"] != "cri"), "Envoy never gets the runtime's socket");
    // PID 1 is the launcher, installed from the agent's image; Envoy's own args follow `--`.
    let launcher = "/aether/bin/aether-proxy-launcher";
    assert_eq!(envoy["command"], serde_json::json!([launcher]));
    let init = &proxy["initContainers"][0];
    assert_eq!(
        init["command"],
        serde_json::json!(["/usr/local/bin/aether-proxy-launcher", "install", "--to", "/aether/bin"])
    );
    assert_eq!(init["image"], agent["image"], "the launcher comes from the agent's image");
    let all_args = args(envoy);
    let envoy_args: Vec<String> = all_args.iter().skip_while(|a| *a != "--").skip(1).cloned().collect();
    assert_eq!(envoy_args.first().map(String::as_str), Some("envoy"), "{all_args:?}");
    // Envoy's parser takes "--flag value" only: "--flag=value" crash-loops it (found on a real node).
    assert!(envoy_args.iter().all(|a| !(a.starts_with("--") && a.contains('='))), "Envoy args: {envoy_args:?}");
    assert!(envoy_args.windows(2).any(|w| w[0] == "--config-path" && w[1] == "/etc/envoy/envoy.yaml"));
    assert!(envoy_args.windows(2).any(|w| w[0] == "--concurrency" && w[1] == "2"), "pinned for the hand-over");
    assert!(!all_args.iter().any(|a| a == "--disable-hot-restart"), "the hand-over is on by default");
    assert_eq!(flag(envoy, "--base-id").as_deref(), Some("7391"));
    assert_eq!(flag(envoy, "--state-dir").as_deref(), Some("/run/aether-proxy"));
    // A surge pod must fit beside the old one: no host ports, and readiness from the launcher's
    // marker (an Envoy port reaches whichever Envoy holds the socket).
    assert!(envoy.get("ports").is_none(), "no host ports on the proxy: {}", envoy["ports"]);
    assert_eq!(
        envoy["readinessProbe"]["exec"]["command"],
        serde_json::json!([launcher, "probe", "--marker", "/aether/ready"])
    );
    let proxy_ds = find(docs, "DaemonSet", "aether-proxy");
    assert_eq!(
        proxy_ds["spec"]["updateStrategy"]["rollingUpdate"],
        serde_json::json!({"maxSurge": 1, "maxUnavailable": 0})
    );
    assert!(mounts(envoy).iter().any(|m| m["name"] == "hand-over-shm" && m["mountPath"] == "/dev/shm"));
    // The new Envoy serves only once it holds the agent's CDS and LDS (no 15 s initial fetch timeout).
    for c in ["cds_config", "lds_config"] {
        assert_eq!(boot["dynamic_resources"][c]["initial_fetch_timeout"], "0s", "{c}");
    }
    assert_eq!(flag(agent, "--readyz-requires-envoy").as_deref(), Some("true"));
    let listeners = boot["static_resources"]["listeners"].as_array().expect("static listeners");
    assert!(listeners.iter().any(|l| l["name"] == "readiness" && l["address"]["socket_address"]["port_value"] == 9902));
    // The agent's state is pod-scoped by default (nothing left on the host after uninstall).
    let state =
        pod["volumes"].as_array().expect("volumes").iter().find(|v| v["name"] == "state").expect("state volume");
    assert!(state.get("emptyDir").is_some() && state.get("hostPath").is_none(), "state: {state}");

    let volumes = pod["volumes"].as_array().expect("volumes");
    let pods_volume = volumes.iter().find(|v| v["name"] == "kubelet-pods");
    let role = find(docs, "ClusterRole", "aether-node");
    let policy_rule = role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .any(|r| r["resources"].as_array().is_some_and(|rs| rs.iter().any(|x| x == "endpointpolicies")));
    let pods_rule = role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .find(|r| r["resources"] == serde_json::json!(["pods"]))
        .expect("pods rule");
    assert_eq!(pods_rule["verbs"], serde_json::json!(["get", "list", "watch"]));

    if case.uds {
        assert_eq!(flag(agent, "--uds-workloads").as_deref(), Some("true"), "{}", case.name);
        assert_eq!(
            flag(agent, "--kubelet-pods-dir").as_deref(),
            Some(case.mount),
            "{}: agent flag = mount path",
            case.name
        );
        let v = pods_volume.unwrap_or_else(|| panic!("{}: no kubelet-pods volume", case.name));
        assert_eq!(v["hostPath"]["path"], case.host_dir, "{}", case.name);
        for c in [agent, envoy] {
            let m = mounts(c)
                .into_iter()
                .find(|m| m["name"] == "kubelet-pods")
                .unwrap_or_else(|| panic!("{}: {} lacks the pods dir mount", case.name, c["name"]));
            assert_eq!(m["mountPath"], case.mount, "{}", case.name);
            assert_eq!(m["mountPropagation"], "HostToContainer", "{}", case.name);
            assert_eq!(m["readOnly"], true, "{}", case.name);
        }
        assert!(policy_rule, "{}: the agent needs EndpointPolicy read access", case.name);
        let budget = Budget::new(case.mount);
        assert!(budget.is_ok(), "{}: {budget:?}", case.name);
    } else {
        assert_eq!(flag(agent, "--uds-workloads").as_deref(), Some("false"));
        assert!(pods_volume.is_none(), "disabled: no pods dir volume");
        assert!(volumes.iter().all(|v| v["hostPath"]["path"] != case.host_dir));
        for c in [agent, envoy] {
            assert!(mounts(c).iter().all(|m| m["name"] != "kubelet-pods"));
        }
        assert!(!policy_rule, "disabled: no EndpointPolicy RBAC for the agent");
    }
}

#[test]
fn rendered_objects_follow_the_values_matrix() {
    for case in MATRIX {
        let docs = render(case.sets);
        check_controller(case, &docs);
        check_webhook(case, &docs);
        check_node(case, &docs);
        for d in &docs {
            let ns = d["metadata"]["namespace"].as_str();
            assert!(
                ns.is_none() || ns == Some(NS),
                "{}: {} outside the release namespace",
                case.name,
                d["metadata"]["name"]
            );
        }
    }
}

/// The tests' Envoy (`aether_fixtures::envoy`, the one launcher of every suite and bench) runs
/// the chart's bootstrap and flags: `ChartBootstrap::render` equals the `envoy.yaml` helm renders
/// for the same values, and the launcher changes only the xDS socket path and the ports (0:
/// ephemeral) and passes the DaemonSet's Envoy flags.
#[test]
fn the_test_envoy_runs_the_charts_bootstrap_and_flags() {
    use aether_fixtures::envoy::{CHART_STATS_PORT, CHART_XDS_SOCKET, ChartBootstrap, chart_flags};
    let cases: [(&[&str], u16, u16, Option<u16>); 3] = [
        (&[], 9901, 9902, Some(CHART_STATS_PORT)),
        (&["proxy.adminPort=19901", "proxy.readinessPort=19902", "proxy.stats.port=19090"], 19901, 19902, Some(19090)),
        (&["proxy.stats.port=0"], 9901, 9902, None),
    ];
    for (sets, admin_port, readiness_port, stats_port) in cases {
        let docs = render(sets);
        let text =
            find(&docs, "ConfigMap", "aether-node-envoy-bootstrap")["data"]["envoy.yaml"].as_str().expect("envoy.yaml");
        let chart: Value = yaml_serde::from_str(text).expect("the bootstrap is YAML");
        let ours =
            ChartBootstrap { xds_socket: CHART_XDS_SOCKET.to_owned(), admin_port, readiness_port, stats_port }.render();
        assert_eq!(
            chart, ours,
            "{sets:?}: the chart's bootstrap changed; change aether_fixtures::envoy::ChartBootstrap::render with it"
        );

        // The DaemonSet's Envoy flags (after the proxy launcher's `--` and the binary), but for
        // the file, the log level and the worker count: the fixture's.
        let ds = find(&docs, "DaemonSet", "aether-proxy");
        let chart_args = args(container(&ds["spec"]["template"]["spec"], "envoy"));
        let mut rest = Vec::new();
        let mut it = chart_args.iter().skip_while(|a| *a != "--").skip(2);
        while let Some(a) = it.next() {
            match a.as_str() {
                "--config-path" | "--log-level" | "--concurrency" => {
                    it.next();
                }
                _ => rest.push(a.clone()),
            }
        }
        assert_eq!(rest, chart_flags("$(NODE_NAME)"), "{sets:?}: the chart's Envoy args {chart_args:?}");
    }
    let launcher = aether_fixtures::Envoy::builder("/tmp/t/xds.sock", "node-a", "/tmp/t");
    let overridden =
        ChartBootstrap { xds_socket: "/tmp/t/xds.sock".to_owned(), admin_port: 0, readiness_port: 0, stats_port: None };
    assert_eq!(launcher.bootstrap(), overridden.render());
    let launcher_args = launcher.args().join(" ");
    assert!(launcher_args.contains(&chart_flags("node-a").join(" ")), "{launcher_args}");
}

#[test]
fn aggregation_labels_follow_the_value() {
    let label = |docs: &[Value], name: &str, key: &str| {
        find(docs, "ClusterRole", name)["metadata"]["labels"]
            .get(format!("rbac.authorization.k8s.io/aggregate-to-{key}"))
            .cloned()
    };
    let on = render(&[]);
    assert_eq!(label(&on, "aether-endpointpolicies-edit", "edit"), Some(Value::from("true")));
    assert_eq!(label(&on, "aether-endpointpolicies-edit", "admin"), Some(Value::from("true")));
    assert_eq!(label(&on, "aether-endpointpolicies-view", "view"), Some(Value::from("true")));
    let off = render(&["rbac.aggregateToDefaultRoles=false"]);
    for (name, key) in [
        ("aether-endpointpolicies-edit", "edit"),
        ("aether-endpointpolicies-edit", "admin"),
        ("aether-endpointpolicies-view", "view"),
    ] {
        assert_eq!(label(&off, name, key), None, "{name} still aggregates to {key}");
    }
}

#[test]
fn schema_refuses_bad_values() {
    for (sets, needle) in [
        (&["webhook.timeoutSeconds=11"][..], "timeoutSeconds"),
        (&["webhook.failurePolicy=Maybe"][..], "failurePolicy"),
        (&["webhook.certs.mode=acme"][..], "mode"),
        (&["webhook.certs.mode=provided"][..], "caBundle"),
        (&["proxy.udsWorkloads.mountPath=/var/snap/microk8s/common/var/lib/kubelet/pods"][..], "mountPath"),
        (&["proxy.udsWorkloads.mountPath=relative/pods"][..], "mountPath"),
        (&["proxy.udsWorkloads.mountPath=/k/"][..], "mountPath"),
        (&["proxy.udsWorkloads.hostPodsDir="][..], "hostPodsDir"),
        (&["proxy.udsWorkloads.enabeld=true"][..], "enabeld"),
        (&["socketLimit=filesystm"][..], "socketLimit"),
    ] {
        match try_render(sets) {
            Ok(_) => panic!("{sets:?} rendered; the schema should refuse it"),
            Err(e) => assert!(e.contains(needle), "{sets:?}: error lacks {needle:?}: {e}"),
        }
    }
}

/// The schema's `controller.maxBodyBytes` bounds are the binary's own: `minimum` is
/// `aether_controller::webhook::MIN_MAX_BODY_BYTES` (what `run --max-body-bytes` refuses below,
/// so a value the schema lets through can no longer crash-loop the controller) and there is no
/// `maximum` (the binary has none). helm refuses one byte below the bound and renders the bound
/// itself into the flag.
#[test]
fn schema_max_body_bytes_bounds_are_the_binarys() {
    let text = std::fs::read_to_string(chart("aether").join("values.schema.json")).expect("values.schema.json");
    let schema: Value = serde_json::from_str(&text).expect("the schema is JSON");
    let field = &schema["properties"]["controller"]["properties"]["maxBodyBytes"];
    assert_eq!(field["minimum"].as_u64(), Some(MIN_MAX_BODY_BYTES as u64), "{field}");
    assert!(field.get("maximum").is_none() && field.get("exclusiveMinimum").is_none(), "{field}");
    let description = field["description"].as_str().expect("a description");
    assert!(description.contains(&format!("at least {MIN_MAX_BODY_BYTES}")), "{description}");

    let below = format!("controller.maxBodyBytes={}", MIN_MAX_BODY_BYTES - 1);
    match try_render(&[below.as_str()]) {
        Ok(_) => panic!("{below} rendered; the schema should refuse it"),
        Err(e) => assert!(e.contains("maxBodyBytes") && e.contains("minimum"), "{below}: {e}"),
    }
    let exact = format!("controller.maxBodyBytes={MIN_MAX_BODY_BYTES}");
    let docs = try_render(&[exact.as_str()]).unwrap_or_else(|e| panic!("{exact} refused: {e}"));
    let c = container(&find(&docs, "Deployment", "aether-controller")["spec"]["template"]["spec"], "aether-controller");
    assert_eq!(flag(c, "--max-body-bytes"), Some(MIN_MAX_BODY_BYTES.to_string()));
}

/// `(values path, minimum, maximum)` of every integer value of `schema` with a bound, `$ref`s to
/// `#/definitions/...` followed.
fn bounded_integers(schema: &Value, node: &Value, path: &str, out: &mut Vec<(String, Option<i64>, Option<i64>)>) {
    let resolved;
    let node = match node["$ref"].as_str().and_then(|r| r.strip_prefix("#/definitions/")) {
        Some(name) => {
            resolved = schema["definitions"][name].clone();
            &resolved
        }
        None => node,
    };
    let (min, max) = (node["minimum"].as_i64(), node["maximum"].as_i64());
    if node["type"] == "integer" && (min.is_some() || max.is_some()) {
        out.push((path.to_owned(), min, max));
    }
    for (key, child) in node["properties"].as_object().into_iter().flatten() {
        let child_path = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
        bounded_integers(schema, child, &child_path, out);
    }
}

/// Every bounded integer value of charts/aether renders at each of its edges and
/// is refused one past it, with an error naming the value and the bound. The real-node suite runs
/// the chart with the values at their edges (`chart_values_at_their_edges_run_on_the_real_node`).
#[test]
fn every_bounded_integer_value_renders_at_its_edges_and_is_refused_past_them() {
    let text = std::fs::read_to_string(chart("aether").join("values.schema.json")).expect("values.schema.json");
    let schema: Value = serde_json::from_str(&text).expect("the schema is JSON");
    let mut bounded = Vec::new();
    bounded_integers(&schema, &schema, "", &mut bounded);
    assert!(bounded.len() >= 25, "bounded integer values found: {bounded:?}");
    let mut checked = 0;
    for (path, min, max) in &bounded {
        let leaf = path.rsplit('.').next().expect("a path");
        for (edge, past, word) in [(*min, min.map(|m| m - 1), "minimum"), (*max, max.map(|m| m + 1), "maximum")] {
            let (Some(edge), Some(past)) = (edge, past) else { continue };
            let at = format!("{path}={edge}");
            try_render(&[at.as_str()]).unwrap_or_else(|e| panic!("{at} is within the schema but does not render: {e}"));
            let over = format!("{path}={past}");
            match try_render(&[over.as_str()]) {
                Ok(_) => panic!("{over} rendered; the schema's {word} is {edge}"),
                Err(e) => assert!(
                    e.contains(leaf) && e.contains(word),
                    "{over}: the error names neither {leaf} nor {word}: {e}"
                ),
            }
            checked += 1;
        }
    }
    eprintln!("{checked} edges of {} bounded values rendered and refused one past", bounded.len());
}

/// `proxy.handOver.enabled=false` is the old behaviour: Envoy with `--disable-hot-restart`, no
/// hand-over mounts, delete-first rolls.
#[test]
fn the_hand_over_switches_off() {
    let docs = render(&["proxy.handOver.enabled=false"]);
    let ds = find(&docs, "DaemonSet", "aether-proxy");
    assert_eq!(ds["metadata"]["annotations"]["aether.io/proxy-hand-over"], "off");
    assert_eq!(ds["spec"]["updateStrategy"]["rollingUpdate"], serde_json::json!({"maxSurge": 0, "maxUnavailable": 1}));
    let envoy = container(&ds["spec"]["template"]["spec"], "envoy");
    let a = args(envoy);
    assert!(a.iter().any(|x| x == "--no-hot-restart") && !a.iter().any(|x| x == "--state-dir"), "{a:?}");
    let volumes = ds["spec"]["template"]["spec"]["volumes"].as_array().expect("volumes");
    assert!(volumes.iter().all(|v| v["name"] != "hand-over" && v["name"] != "hand-over-shm"));
}

/// The agent and Envoy run in two DaemonSets that meet only on the host: values that would
/// separate them fail the render, naming the value and why.
#[test]
fn values_that_would_separate_agent_and_proxy_fail_naming_the_value() {
    for (set, says) in [
        ("proxy.runDirHostPath=", "proxy.runDirHostPath must be set"),
        ("proxy.hostNetwork=false", "proxy.hostNetwork=false is not supported"),
    ] {
        match try_render(&[set]) {
            Ok(_) => panic!("{set} rendered"),
            Err(e) => assert!(e.contains(says), "{set}: {e}"),
        }
    }
}

/// `socketLimit`: the main chart passes it to both binaries as `--socket-limit` (sun-path by
/// default, filesystem when set) and refuses `filesystem` without socket pinning, where Envoy
/// would dial paths that must fit in sun_path.
#[test]
fn socket_limit_reaches_both_binaries_and_filesystem_needs_pinning() {
    let limits = |sets: &[&str]| {
        let docs = render(sets);
        let controller =
            container(&find(&docs, "Deployment", "aether-controller")["spec"]["template"]["spec"], "aether-controller")
                .clone();
        let agent =
            container(&find(&docs, "DaemonSet", "aether-node")["spec"]["template"]["spec"], "aether-agent").clone();
        (flag(&controller, "--socket-limit"), flag(&agent, "--socket-limit"), flag(&agent, "--pin-dir"))
    };
    let sun = Some("sun-path".to_owned());
    assert_eq!(limits(&[]), (sun.clone(), sun.clone(), Some("/run/aether-pins".to_owned())));
    assert_eq!(limits(&["socketLimit=sunPath", "agent.pinning.enabled=false"]), (sun.clone(), sun, None));
    let fs = Some("filesystem".to_owned());
    assert_eq!(limits(&["socketLimit=filesystem"]), (fs.clone(), fs.clone(), Some("/run/aether-pins".to_owned())));
    assert_eq!(limits(&["socketLimit=filesystem", "proxy.udsWorkloads.enabled=false"]).1, fs);
    match try_render(&["socketLimit=filesystem", "agent.pinning.enabled=false"]) {
        Ok(_) => panic!("socketLimit=filesystem without pinning rendered"),
        Err(e) => assert!(
            e.contains("socketLimit=filesystem needs agent.pinning.enabled=true") && e.contains("sun_path"),
            "{e}"
        ),
    }
}

/// The CRD chart takes the same `socketLimit`: `helm template` renders exactly the generated CRD
/// plus chart metadata (`aether_crds::chart`), with the length rule of `spec.udsSocket` 36 bytes
/// by default and 319 under `filesystem`; the unrendered file (what `kubectl apply -f` of it creates) is the
/// default; the schema refuses anything else.
#[test]
fn the_crd_chart_renders_the_generated_crd_for_each_socket_limit() {
    use aether_crds::SocketLimit;
    use aether_crds::chart::{crd_with_chart_metadata, crd_with_chart_metadata_for};
    let one_doc = |text: &str| -> Value {
        let docs: Vec<Value> = yaml_serde::Deserializer::from_str(text)
            .map(|de| Value::deserialize(de).expect("rendered YAML parses"))
            .filter(|v| !v.is_null())
            .collect();
        assert_eq!(docs.len(), 1, "one CRD: {text}");
        docs.into_iter().next().unwrap_or_default()
    };
    let max_length = aether_crds::chart::socket_max_bytes;
    let default = one_doc(&try_render_text("aether-crds", &[]).expect("render aether-crds"));
    assert_eq!(default, serde_json::to_value(crd_with_chart_metadata()).unwrap());
    assert_eq!(max_length(&default), Some(36));
    let sun = one_doc(&try_render_text("aether-crds", &["socketLimit=sunPath"]).expect("render sunPath"));
    assert_eq!(sun, default);
    let fs = one_doc(&try_render_text("aether-crds", &["socketLimit=filesystem"]).expect("render filesystem"));
    assert_eq!(fs, serde_json::to_value(crd_with_chart_metadata_for(SocketLimit::Filesystem)).unwrap());
    assert_eq!(max_length(&fs), Some(319));
    let raw = std::fs::read_to_string(aether_tests::crd_file()).expect("the chart's CRD file");
    assert_eq!(one_doc(&raw), default, "the unrendered file is the default CRD");
    match try_render_text("aether-crds", &["socketLimit=Filesystem"]) {
        Ok(_) => panic!("socketLimit=Filesystem rendered; the schema should refuse it"),
        Err(e) => assert!(e.contains("socketLimit"), "{e}"),
    }
}

/// A PodDisruptionBudget with `minAvailable: 1` over a single replica forbids every eviction
/// (node drains block forever): it is rendered only with more than one replica, and a
/// `minAvailable` not below `replicas` is refused naming both values.
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
#[test]
fn monitors_are_rendered_only_when_enabled_and_scrape_the_admin_ports() {
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

/// One version: the chart's default image tags are its `appVersion`, which is the binaries'
/// version (this crate's, `workspace.package.version`; `--version` prints it).
#[test]
fn default_images_are_tagged_with_the_binaries_version() {
    let docs = render(&[]);
    let version = env!("CARGO_PKG_VERSION");
    let deploy = find(&docs, "Deployment", "aether-controller");
    let ds = find(&docs, "DaemonSet", "aether-node");
    for (what, c) in [
        ("controller", container(&deploy["spec"]["template"]["spec"], "aether-controller")),
        ("agent", container(&ds["spec"]["template"]["spec"], "aether-agent")),
    ] {
        let image = c["image"].as_str().expect("an image");
        assert_eq!(image.rsplit_once(':').map(|(_, t)| t), Some(version), "{what} image {image}");
    }
}

#[test]
fn pdb_is_rendered_only_when_a_replica_can_be_evicted() {
    let single = render(&["controller.replicas=1"]);
    assert_eq!(find(&single, "Deployment", "aether-controller")["spec"]["replicas"], 1);
    assert!(!has(&single, "PodDisruptionBudget"), "a PDB over 1 replica blocks drains");

    for replicas in [2, 3] {
        let set = format!("controller.replicas={replicas}");
        let docs = render(&[set.as_str()]);
        let dep = find(&docs, "Deployment", "aether-controller");
        assert_eq!(dep["spec"]["replicas"], replicas);
        let pdb = find(&docs, "PodDisruptionBudget", "aether-controller");
        assert_eq!(pdb["spec"]["minAvailable"], 1, "{set}");
        assert_eq!(pdb["spec"]["selector"]["matchLabels"], dep["spec"]["selector"]["matchLabels"]);
    }
    assert!(!has(&render(&["controller.podDisruptionBudget.enabled=false"]), "PodDisruptionBudget"));

    match try_render(&["controller.podDisruptionBudget.minAvailable=2"]) {
        Ok(_) => panic!("minAvailable 2 of 2 replicas rendered; it blocks every eviction"),
        Err(e) => assert!(
            e.contains("controller.podDisruptionBudget.minAvailable (2) must be less than controller.replicas (2)"),
            "{e}"
        ),
    }
    let docs = render(&["controller.replicas=3", "controller.podDisruptionBudget.minAvailable=2"]);
    assert_eq!(find(&docs, "PodDisruptionBudget", "aether-controller")["spec"]["minAvailable"], 2);
    let docs = render(&["controller.podDisruptionBudget.minAvailable=50%"]);
    assert_eq!(find(&docs, "PodDisruptionBudget", "aether-controller")["spec"]["minAvailable"], "50%");
}

/// A mount path of `len` bytes (`/` and `len - 1` letters).
fn mount_path_of(len: usize) -> String {
    format!("/{}", "p".repeat(len - 1))
}

/// The schema's `maxLength` of `proxy.udsWorkloads.mountPath` is the contract crate's longest
/// pods dir with a budget (`aether_crds::udspath::MAX_PODS_DIR_BYTES`), not a hand-derived copy:
/// helm accepts that length and refuses one byte more, exactly where `Budget::new` does.
#[test]
fn schema_max_mount_path_is_the_longest_pods_dir_with_a_budget() {
    let text = std::fs::read_to_string(chart("aether").join("values.schema.json")).expect("values.schema.json");
    let schema: Value = serde_json::from_str(&text).expect("the schema is JSON");
    let uds = &schema["properties"]["proxy"]["properties"]["udsWorkloads"];
    assert_eq!(uds["allOf"][0]["properties"]["mountPath"]["maxLength"].as_u64(), Some(MAX_PODS_DIR_BYTES as u64));
    let description = uds["properties"]["mountPath"]["description"].as_str().expect("a description");
    for said in [
        format!("{SUN_PATH_MAX} - len(mountPath) - {FIXED_BYTES} bytes"),
        format!("at most {MAX_PODS_DIR_BYTES} bytes"),
        format!("budget >= {MIN_VALUE_BYTES}"),
    ] {
        assert!(description.contains(&said), "the mountPath description lacks {said:?}: {description}");
    }

    let longest = mount_path_of(MAX_PODS_DIR_BYTES);
    assert_eq!(Budget::new(&longest).map(|b| b.bytes()), Ok(MIN_VALUE_BYTES), "{longest}");
    let set = format!("proxy.udsWorkloads.mountPath={longest}");
    try_render(&[set.as_str()]).unwrap_or_else(|e| panic!("{longest} ({MAX_PODS_DIR_BYTES} bytes) refused: {e}"));
    let too_long = mount_path_of(MAX_PODS_DIR_BYTES + 1);
    assert!(Budget::new(&too_long).is_err(), "{too_long}");
    let set = format!("proxy.udsWorkloads.mountPath={too_long}");
    match try_render(&[set.as_str()]) {
        Ok(_) => panic!("{too_long} ({} bytes) rendered; the schema should refuse it", too_long.len()),
        Err(e) => assert!(e.contains("mountPath"), "{e}"),
    }
}

/// NOTES.txt repeats the budget arithmetic: for several mount paths, the numbers it prints (and
/// its over-budget sample value) are the ones `aether_crds::udspath::Budget` computes. NOTES are
/// rendered by `helm install --dry-run` only, which needs an API server to talk to.
#[test]
fn notes_show_the_budget_the_contract_crate_computes() {
    let cp = ControlPlane::shared().expect("control plane");
    let longest = mount_path_of(MAX_PODS_DIR_BYTES);
    for mount in [DEFAULT_PODS_DIR, "/k", "/var/lib/k0s/kubelet/pods", longest.as_str()] {
        let out = Command::new(helm())
            .args(["install", RELEASE])
            .arg(chart("aether"))
            .args(["--namespace", NS, "--dry-run=client", "--kubeconfig"])
            .arg(cp.kubeconfig())
            .args(["--set", &format!("proxy.udsWorkloads.mountPath={mount}")])
            .stdin(Stdio::null())
            .output()
            .expect("running helm");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "helm install --dry-run {mount}: {}", String::from_utf8_lossy(&out.stderr));
        let notes =
            text.split_once("\nNOTES:\n").map(|(_, n)| n).unwrap_or_else(|| panic!("no NOTES for {mount}: {text}"));
        let budget = Budget::new(mount).unwrap_or_else(|e| panic!("{mount}: {e}"));
        let line = format!(
            "Pods dir as the proxy sees it: {mount} -> socket value budget {} bytes ({SUN_PATH_MAX} - {} - {FIXED_BYTES}).",
            budget.bytes(),
            mount.len()
        );
        assert!(notes.contains(&line), "NOTES for {mount} lack {line:?}:\n{notes}");
        let expect = format!("... the budget is {} bytes.", budget.bytes());
        assert!(notes.contains(&expect), "NOTES for {mount} lack {expect:?}:\n{notes}");
        // The dry-run sample is exactly one byte over the budget, so the webhook denies it.
        let sample = notes
            .lines()
            .find_map(|l| l.trim().strip_prefix("udsSocket: "))
            .unwrap_or_else(|| panic!("no sample udsSocket in the NOTES for {mount}"));
        assert_eq!(sample.len(), budget.bytes() + 1, "{mount}: sample {sample:?}");
        assert!(matches!(budget.check(sample), Err(SocketError::TooLong { .. })), "{mount}: sample {sample:?}");
    }
}

/// NOTES.txt says how many controller replicas to expect (the value, not a fixed "2"), and with
/// one replica that no PodDisruptionBudget protects it.
#[test]
fn notes_show_the_replica_count() {
    let cp = ControlPlane::shared().expect("control plane");
    for (replicas, count) in [(1, "1 replica)"), (2, "2 replicas)"), (3, "3 replicas)")] {
        let out = Command::new(helm())
            .args(["install", RELEASE])
            .arg(chart("aether"))
            .args(["--namespace", NS, "--dry-run=client", "--kubeconfig"])
            .arg(cp.kubeconfig())
            .args(["--set", &format!("controller.replicas={replicas}")])
            .stdin(Stdio::null())
            .output()
            .expect("running helm");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "helm install --dry-run {replicas}: {}", String::from_utf8_lossy(&out.stderr));
        let notes =
            text.split_once("\nNOTES:\n").map(|(_, n)| n).unwrap_or_else(|| panic!("no NOTES for {replicas}: {text}"));
        let line = format!("2. The controller is ready ({count} and answers /readyz");
        assert!(notes.contains(&line), "NOTES for {replicas} replicas lack {line:?}:\n{notes}");
        let no_pdb = "With 1 replica no PodDisruptionBudget is rendered";
        assert_eq!(notes.contains(no_pdb), replicas == 1, "{replicas} replicas:\n{notes}");
    }
}

#[test]
fn rbac_doc_equals_the_report() {
    let out = Command::new("python3")
        .arg(repo_root().join("tests/harness/rbac-report.py"))
        .arg(helm())
        .output()
        .expect("running python3");
    assert!(out.status.success(), "rbac-report failed: {}", String::from_utf8_lossy(&out.stderr));
    let committed = std::fs::read_to_string(repo_root().join("docs/rbac.md")).expect("docs/rbac.md");
    assert_eq!(
        committed,
        String::from_utf8_lossy(&out.stdout),
        "docs/rbac.md drifted from the chart: run `make rbac-report > docs/rbac.md`"
    );
}

/// sha256 over every file of the chart except Chart.yaml and the digest file, as
/// `<relative path>\0<bytes>\0` in path order.
fn chart_digest(dir: &Path) -> String {
    fn walk(dir: &Path, base: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(dir).expect("readable chart dir") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                walk(&p, base, out);
            } else {
                let rel = p.strip_prefix(base).expect("under base").to_string_lossy().replace('\\', "/");
                if rel != "Chart.yaml" && rel != ".chart-digests" {
                    out.insert(rel, std::fs::read(&p).expect("readable file"));
                }
            }
        }
    }
    let mut files = BTreeMap::new();
    walk(dir, dir, &mut files);
    let mut h = Sha256::new();
    for (rel, bytes) in &files {
        h.update(rel.as_bytes());
        h.update([0]);
        h.update(bytes);
        h.update([0]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn chart_version(dir: &Path) -> String {
    let y: Value =
        yaml_serde::from_str(&std::fs::read_to_string(dir.join("Chart.yaml")).expect("Chart.yaml")).expect("YAML");
    y["version"].as_str().expect("a version").to_owned()
}

#[test]
fn chart_content_changes_bump_the_version() {
    for name in ["aether", "aether-crds"] {
        let dir = chart(name);
        let (version, digest) = (chart_version(&dir), chart_digest(&dir));
        let file = dir.join(".chart-digests");
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let mut recorded = BTreeMap::new();
        for line in text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
            let (v, d) = line.split_once(' ').unwrap_or_else(|| panic!("{}: bad line {line:?}", file.display()));
            assert!(
                recorded.insert(v.to_owned(), d.trim().to_owned()).is_none(),
                "{}: version {v} listed twice",
                file.display()
            );
        }
        let line = format!("{version} sha256:{digest}");
        match recorded.get(&version) {
            Some(d) if *d == format!("sha256:{digest}") => {}
            Some(d) => panic!(
                "charts/{name}: templates or values changed but Chart.yaml still says version {version} (recorded {d}, now \
                 sha256:{digest}). Bump `version` in charts/{name}/Chart.yaml and append `<new version> sha256:<digest>` to \
                 charts/{name}/.chart-digests (this test prints the digest for the new version)."
            ),
            None => panic!("charts/{name}/.chart-digests has no line for version {version}: append `{line}`"),
        }
    }
}

// --- verify-install: the startup check Job and the `helm test` Pod ---------------------------

/// The startup check's objects' name (Job, ServiceAccount, Role, RoleBinding).
const VERIFY: &str = "aether-verify-install";
/// The `helm test` runner's objects' name (Pod, ServiceAccount, Role, RoleBinding).
const VERIFY_TEST: &str = "aether-verify-install-test";

/// The verify-install objects of a render: (kind, name, namespace) → the object.
fn verify_objects(docs: &[Value]) -> BTreeMap<(String, String, String), Value> {
    docs.iter()
        .filter(|d| d["metadata"]["name"].as_str().is_some_and(|n| n.starts_with(VERIFY)))
        .map(|d| {
            let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
            ((text(&d["kind"]), text(&d["metadata"]["name"]), text(&d["metadata"]["namespace"])), d.clone())
        })
        .collect()
}

fn key(kind: &str, name: &str, ns: &str) -> (String, String, String) {
    (kind.to_owned(), name.to_owned(), ns.to_owned())
}

fn annotation<'a>(d: &'a Value, key: &str) -> &'a str {
    d["metadata"]["annotations"][key].as_str().unwrap_or_else(|| panic!("{} lacks annotation {key}", d["kind"]))
}

/// `[(apiGroup, resource, verbs)]` of a Role, sorted.
fn role_rules(role: &Value) -> Vec<(String, String, Vec<String>)> {
    let strs = |v: &Value| -> Vec<String> {
        v.as_array().into_iter().flatten().filter_map(|x| x.as_str().map(str::to_owned)).collect()
    };
    let mut out = Vec::new();
    for r in role["rules"].as_array().into_iter().flatten() {
        assert!(r.get("resourceNames").is_none(), "no resourceNames expected: {r}");
        for g in strs(&r["apiGroups"]) {
            for res in strs(&r["resources"]) {
                out.push((g.clone(), res, strs(&r["verbs"])));
            }
        }
    }
    out.sort();
    out
}

fn rule(group: &str, resource: &str, verbs: &[&str]) -> (String, String, Vec<String>) {
    (group.to_owned(), resource.to_owned(), verbs.iter().map(|v| v.to_string()).collect())
}

/// The startup check Job runs after every install and upgrade, after the
/// certificate Job has set the webhook's caBundle (hook weight 10 > 0), retries for
/// `verifyInstall.timeoutSeconds` and fails the release (backoffLimit 0: the binary retries); the
/// `helm test` Pod checks once; each runs `aether-controller verify-install` from the controller
/// image under its own ServiceAccount (hook RBAC first, weight 5), with the controller's own
/// budget flags, the DaemonSet's selector and the agent's admin port, as the other Jobs'
/// restricted non-root user; every object goes away once a run passed.
#[test]
fn verify_install_hooks_run_after_the_cert_job_with_the_controllers_budget_and_the_agents_selector() {
    let custom = ["proxy.udsWorkloads.mountPath=/k", "agent.adminPort=9555", "verifyInstall.timeoutSeconds=30"];
    for (sets, timeout) in [(&[][..], 120), (&custom[..], 30)] {
        let docs = render(sets);
        let objects = verify_objects(&docs);
        let mut want: Vec<_> = ["ServiceAccount", "Role", "RoleBinding"]
            .iter()
            .flat_map(|k| [key(k, VERIFY, NS), key(k, VERIFY_TEST, NS)])
            .chain([key("Job", VERIFY, NS), key("Pod", VERIFY_TEST, NS)])
            .collect();
        want.sort();
        assert_eq!(objects.keys().cloned().collect::<Vec<_>>(), want, "{sets:?}");
        let cert_weight: i64 =
            annotation(find(&docs, "Job", "aether-webhook-certs"), "helm.sh/hook-weight").parse().unwrap();
        for ((kind, name, _), d) in &objects {
            assert_eq!(annotation(d, "helm.sh/hook-delete-policy"), "before-hook-creation,hook-succeeded", "{kind}");
            let weight: i64 = annotation(d, "helm.sh/hook-weight").parse().unwrap();
            assert!(weight > cert_weight, "{kind} {name} runs before the cert Job sets the caBundle");
            let runner = matches!(kind.as_str(), "Job" | "Pod");
            assert_eq!(weight, if runner { 10 } else { 5 }, "{kind} {name}: RBAC before its runner");
            let hook = if name == VERIFY_TEST { "test" } else { "post-install,post-upgrade" };
            assert_eq!(annotation(d, "helm.sh/hook"), hook, "{kind} {name}");
        }

        let controller =
            container(&find(&docs, "Deployment", "aether-controller")["spec"]["template"]["spec"], "aether-controller");
        let ds = find(&docs, "DaemonSet", "aether-node");
        let agent = container(&ds["spec"]["template"]["spec"], "aether-agent");
        let selector: Vec<String> = ds["spec"]["selector"]["matchLabels"]
            .as_object()
            .expect("matchLabels")
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
            .collect();
        let job = &objects[&key("Job", VERIFY, NS)];
        assert_eq!(job["spec"]["backoffLimit"], 0);
        assert_eq!(job["spec"]["activeDeadlineSeconds"].as_i64(), Some(timeout + 60));
        let pod = &objects[&key("Pod", VERIFY_TEST, NS)];
        for (spec, account, retry) in
            [(&job["spec"]["template"]["spec"], VERIFY, timeout), (&pod["spec"], VERIFY_TEST, 0)]
        {
            assert_eq!(spec["serviceAccountName"], account);
            assert_eq!(spec["restartPolicy"], "Never");
            let c = container(spec, "verify-install");
            assert_eq!(c["image"], controller["image"]);
            assert_eq!(c["command"], serde_json::json!(["aether-controller"]));
            assert_eq!(args(c)[0], "verify-install");
            for f in ["--kubelet-pods-dir", "--socket-limit", "--log-format", "--log-level"] {
                assert_eq!(flag(c, f), flag(controller, f), "{f} differs from the controller's");
            }
            let admin = flag(agent, "--admin-addr").unwrap();
            assert_eq!(Some(admin.rsplit(':').next().unwrap().to_owned()), flag(c, "--agent-admin-port"));
            let mut theirs: Vec<String> = flag(c, "--agent-selector").unwrap().split(',').map(str::to_owned).collect();
            theirs.sort();
            assert_eq!(theirs, selector);
            assert_eq!(flag(c, "--agent-namespace").as_deref(), Some(NS));
            assert_eq!(flag(c, "--namespace").as_deref(), Some(NS));
            assert_eq!(flag(c, "--agent-access").as_deref(), Some("pod-ip"));
            assert_eq!(flag(c, "--retry-for-seconds"), Some(retry.to_string()));
            let sc = &c["securityContext"];
            assert_eq!((sc["runAsNonRoot"].as_bool(), sc["runAsUser"].as_i64()), (Some(true), Some(65532)));
            assert_eq!(
                (sc["readOnlyRootFilesystem"].as_bool(), sc["allowPrivilegeEscalation"].as_bool()),
                (Some(true), Some(false))
            );
            assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
            assert_eq!(spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
        }
    }
}

/// Each verify-install account gets exactly what its checks use: `create` on EndpointPolicies in
/// the dry-run namespace (a dry run is authorized as the create) and `list` pods in the release
/// namespace; `get pods/proxy` only with `agentAccess=apiServerProxy`. Each runner can be turned
/// off, and `helm template --skip-tests` (GitOps renders) keeps the startup check whole.
#[test]
fn verify_install_rbac_is_minimal_and_each_runner_can_be_turned_off() {
    let policies = rule("config.aether.io", "endpointpolicies", &["create"]);
    let pods = rule("", "pods", &["list"]);
    let events = rule("", "events", &["list"]);
    let daemonsets = rule("apps", "daemonsets", &["list"]);
    let objects = verify_objects(&render(&[]));
    for name in [VERIFY, VERIFY_TEST] {
        assert_eq!(
            role_rules(&objects[&key("Role", name, NS)]),
            vec![events.clone(), pods.clone(), daemonsets.clone(), policies.clone()],
            "{name}"
        );
        let binding = &objects[&key("RoleBinding", name, NS)];
        assert_eq!(binding["roleRef"]["name"], name);
        assert_eq!(binding["subjects"], serde_json::json!([{"kind": "ServiceAccount", "name": name, "namespace": NS}]));
    }

    let objects = verify_objects(&render(&["verifyInstall.namespace=team-a"]));
    for name in [VERIFY, VERIFY_TEST] {
        assert_eq!(
            role_rules(&objects[&key("Role", name, NS)]),
            vec![events.clone(), pods.clone(), daemonsets.clone()],
            "{name}"
        );
        assert_eq!(role_rules(&objects[&key("Role", name, "team-a")]), vec![policies.clone()], "{name}");
        let binding = &objects[&key("RoleBinding", name, "team-a")];
        assert_eq!(binding["subjects"][0]["namespace"], NS);
    }
    let job = &objects[&key("Job", VERIFY, NS)];
    let c = container(&job["spec"]["template"]["spec"], "verify-install");
    assert_eq!(flag(c, "--namespace").as_deref(), Some("team-a"));

    let objects = verify_objects(&render(&["verifyInstall.agentAccess=apiServerProxy"]));
    let proxy = rule("", "pods/proxy", &["get"]);
    for name in [VERIFY, VERIFY_TEST] {
        let rules = role_rules(&objects[&key("Role", name, NS)]);
        assert_eq!(
            rules,
            vec![events.clone(), pods.clone(), proxy.clone(), daemonsets.clone(), policies.clone()],
            "{name}"
        );
    }
    let pod = &objects[&key("Pod", VERIFY_TEST, NS)];
    assert_eq!(flag(container(&pod["spec"], "verify-install"), "--agent-access").as_deref(), Some("api-server-proxy"));

    let names = |sets: &[&str]| -> Vec<String> {
        let mut n: Vec<String> = verify_objects(&render(sets)).into_keys().map(|(_, name, _)| name).collect();
        n.dedup();
        n
    };
    assert_eq!(names(&["verifyInstall.enabled=false"]), [VERIFY_TEST]);
    assert_eq!(names(&["verifyInstall.helmTest=false"]), [VERIFY]);
    assert!(names(&["verifyInstall.enabled=false", "verifyInstall.helmTest=false"]).is_empty());

    let text = try_render_text_with("aether", &[], &["--skip-tests"]).expect("helm template --skip-tests");
    let skipped: Vec<Value> = yaml_serde::Deserializer::from_str(&text)
        .map(|de| Value::deserialize(de).expect("YAML"))
        .filter(|v| !v.is_null())
        .collect();
    let kept: Vec<_> = verify_objects(&skipped).into_keys().collect();
    let want: Vec<_> = ["Job", "Role", "RoleBinding", "ServiceAccount"].iter().map(|k| key(k, VERIFY, NS)).collect();
    assert_eq!(kept, want, "--skip-tests keeps the startup check and its account, drops the test's");
}

#[test]
fn schema_refuses_bad_verify_install_values() {
    for (sets, needle) in [
        (&["verifyInstall.timeoutSeconds=29"][..], "timeoutSeconds"),
        (&["verifyInstall.timeoutSeconds=1801"][..], "timeoutSeconds"),
        (&["verifyInstall.agentAccess=direct"][..], "agentAccess"),
        (&["verifyInstall.namespace=Team_A"][..], "namespace"),
        (&["verifyInstall.enabled=yes"][..], "enabled"),
        (&["verifyInstall.retryForSeconds=5"][..], "retryForSeconds"),
    ] {
        match try_render(sets) {
            Ok(_) => panic!("{sets:?} rendered; the schema should refuse it"),
            Err(e) => assert!(e.contains(needle), "{sets:?}: error lacks {needle:?}: {e}"),
        }
    }
    for ok in ["verifyInstall.timeoutSeconds=30", "verifyInstall.timeoutSeconds=1800", "verifyInstall.namespace=team-a"]
    {
        try_render(&[ok]).unwrap_or_else(|e| panic!("{ok} refused: {e}"));
    }
}

// --- against a real kube-apiserver ---------------------------------------------------------

fn can_i(cp: &ControlPlane, sa: &str, args: &[&str]) -> bool {
    let who = format!("--as=system:serviceaccount:{NS}:{sa}");
    let mut all = vec!["auth", "can-i", who.as_str()];
    all.extend_from_slice(args);
    let out = cp.kubectl(&all).expect("kubectl runs");
    let said = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    match said.as_str() {
        "yes" => true,
        "no" => false,
        _ => panic!("kubectl auth can-i {args:?}: {said} {}", String::from_utf8_lossy(&out.stderr)),
    }
}

fn apply_rendered(cp: &ControlPlane, dir: &Path, file: &str, text: &str, dry_run: bool) {
    let path = dir.join(file);
    std::fs::write(&path, text).expect("writing rendered chart");
    let p = path.to_string_lossy().into_owned();
    let mut a = vec!["apply", "--server-side", "--field-manager=helm-test", "-f", p.as_str()];
    if dry_run {
        a.push("--dry-run=server");
    }
    cp.kubectl_ok(&a).unwrap_or_else(|e| panic!("server-side apply of {file} (dry run {dry_run}): {e:#}"));
}

#[test]
fn rendered_chart_is_accepted_by_a_real_api_server_and_rbac_is_least_privilege() {
    let cp = ControlPlane::shared().expect("control plane");
    let tmp = tempfile::tempdir().expect("tempdir");
    let crds = try_render_text("aether-crds", &[]).expect("render aether-crds");
    apply_rendered(cp, tmp.path(), "crds.yaml", &crds, false);
    cp.kubectl_ok(&["create", "namespace", NS]).expect("namespace");
    cp.kubectl_ok(&["wait", "--for=condition=Established", "crd/endpointpolicies.config.aether.io", "--timeout=60s"])
        .expect("CRD established");

    for (file, sets) in [
        ("uds-off.yaml", &["proxy.udsWorkloads.enabled=false"][..]),
        ("short.yaml", &["proxy.udsWorkloads.mountPath=/k", "rbac.aggregateToDefaultRoles=false"][..]),
        // The NetworkPolicy is schema-checked here only: the real node's bridge CNI enforces none.
        (
            "netpol.yaml",
            &[
                "controller.networkPolicy.enabled=true",
                "controller.networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.0/8",
                "controller.networkPolicy.adminFrom[0].podSelector.matchLabels.app=prometheus",
            ][..],
        ),
        ("host-network.yaml", &["controller.hostNetwork=true", "controller.webhookPort=10260"][..]),
        (
            "provided.yaml",
            &[
                "webhook.certs.mode=provided",
                "webhook.certs.provided.secretName=t",
                "webhook.certs.provided.caBundle=Y2E=",
            ][..],
        ),
    ] {
        // --skip-tests: a dry run creates no ServiceAccount, and the test Pod's admission needs
        // its account to exist (the startup check Job is admitted without one).
        let text = try_render_text_with("aether", sets, &["--skip-tests"]).expect("render");
        apply_rendered(cp, tmp.path(), file, &text, true);
    }
    let skipped = try_render_text_with("aether", &[], &["--skip-tests"]).expect("render");
    apply_rendered(cp, tmp.path(), "defaults-skip-tests.yaml", &skipped, true);
    // Applied for real, in order: the test Pod's ServiceAccount exists before the Pod.
    let defaults = try_render_text("aether", &[]).expect("render");
    apply_rendered(cp, tmp.path(), "defaults.yaml", &defaults, false);

    let controller = "aether-controller";
    let yes: &[(&str, &[&str])] = &[
        (controller, &["list", "endpointpolicies.config.aether.io", "--all-namespaces"]),
        (controller, &["watch", "endpointpolicies.config.aether.io", "-n", "shop"]),
        (controller, &["patch", "endpointpolicies.config.aether.io", "--subresource=status", "-n", "shop"]),
        (controller, &["list", "services", "--all-namespaces"]),
        (controller, &["create", "events.events.k8s.io", "-n", "shop"]),
        (controller, &["create", "leases.coordination.k8s.io", "-n", NS]),
        (controller, &["update", "leases.coordination.k8s.io/aether-controller-status-writer", "-n", NS]),
        ("aether-node", &["list", "pods", "--all-namespaces"]),
        ("aether-node", &["watch", "pods", "--all-namespaces"]),
        ("aether-node", &["watch", "endpointpolicies.config.aether.io", "--all-namespaces"]),
        ("aether-node", &["create", "events.events.k8s.io", "-n", "shop"]),
        ("aether-node", &["get", "daemonsets.apps/aether-node", "-n", NS]),
        ("aether-node", &["watch", "daemonsets.apps/aether-node", "-n", NS]),
        ("aether-webhook-certs", &["create", "secrets", "-n", NS]),
        ("aether-webhook-certs", &["get", "secrets/aether-webhook-tls", "-n", NS]),
        ("aether-webhook-certs", &["update", "secrets/aether-webhook-tls", "-n", NS]),
        ("aether-webhook-certs", &["get", "validatingwebhookconfigurations/aether-endpointpolicy"]),
        ("aether-webhook-certs", &["patch", "validatingwebhookconfigurations/aether-endpointpolicy"]),
        ("aether-webhook-certs", &["update", "validatingwebhookconfigurations/aether-endpointpolicy"]),
        ("aether-webhook-certs-cleanup", &["get", "secrets/aether-webhook-tls", "-n", NS]),
        ("aether-webhook-certs-cleanup", &["delete", "secrets/aether-webhook-tls", "-n", NS]),
        ("aether-verify-install", &["create", "endpointpolicies.config.aether.io", "-n", NS]),
        ("aether-verify-install", &["list", "pods", "-n", NS]),
        ("aether-verify-install-test", &["create", "endpointpolicies.config.aether.io", "-n", NS]),
        ("aether-verify-install-test", &["list", "pods", "-n", NS]),
    ];
    let no: &[(&str, &[&str])] = &[
        (controller, &["update", "endpointpolicies.config.aether.io", "-n", "shop"]),
        (controller, &["delete", "endpointpolicies.config.aether.io", "-n", "shop"]),
        (controller, &["get", "secrets", "-n", NS]),
        (controller, &["list", "pods", "--all-namespaces"]),
        (controller, &["create", "leases.coordination.k8s.io", "-n", "default"]),
        (controller, &["update", "leases.coordination.k8s.io/kube-scheduler", "-n", NS]),
        (controller, &["patch", "validatingwebhookconfigurations/aether-endpointpolicy"]),
        (controller, &["get", "services", "-n", "shop"]),
        (controller, &["patch", "leases.coordination.k8s.io/aether-controller-status-writer", "-n", NS]),
        (controller, &["create", "events", "-n", "shop"]),
        (controller, &["delete", "events.events.k8s.io", "-n", "shop"]),
        (controller, &["patch", "events.events.k8s.io", "-n", "shop"]),
        ("aether-node", &["get", "daemonsets.apps/aether-proxy", "-n", NS]),
        ("aether-node", &["list", "daemonsets.apps", "-n", NS]),
        ("aether-node", &["update", "daemonsets.apps/aether-node", "-n", NS]),
        ("aether-node", &["patch", "events.events.k8s.io", "-n", "shop"]),
        ("aether-node", &["create", "pods", "-n", "shop"]),
        ("aether-node", &["update", "pods", "-n", "shop"]),
        ("aether-node", &["delete", "pods", "-n", "shop"]),
        ("aether-node", &["create", "pods/exec", "-n", "shop"]),
        ("aether-node", &["get", "secrets", "--all-namespaces"]),
        ("aether-node", &["get", "secrets", "-n", NS]),
        ("aether-node", &["patch", "endpointpolicies.config.aether.io", "-n", "shop"]),
        ("aether-node", &["list", "services", "--all-namespaces"]),
        ("aether-node", &["create", "events", "-n", "shop"]),
        ("aether-node", &["list", "events.events.k8s.io", "-n", "shop"]),
        ("aether-webhook-certs", &["get", "secrets", "-n", "default"]),
        ("aether-webhook-certs", &["list", "secrets", "-n", NS]),
        ("aether-webhook-certs", &["get", "secrets/other", "-n", NS]),
        ("aether-webhook-certs", &["delete", "secrets/aether-webhook-tls", "-n", NS]),
        ("aether-webhook-certs", &["patch", "validatingwebhookconfigurations/someone-elses"]),
        ("aether-webhook-certs", &["update", "validatingwebhookconfigurations/someone-elses"]),
        ("aether-webhook-certs", &["create", "validatingwebhookconfigurations"]),
        ("aether-webhook-certs", &["list", "pods", "-n", NS]),
        ("aether-webhook-certs-cleanup", &["delete", "secrets/other", "-n", NS]),
        ("aether-webhook-certs-cleanup", &["list", "secrets", "-n", NS]),
        ("aether-webhook-certs-cleanup", &["create", "secrets", "-n", NS]),
        ("aether-webhook-certs-cleanup", &["update", "secrets/aether-webhook-tls", "-n", NS]),
        ("aether-verify-install", &["create", "endpointpolicies.config.aether.io", "-n", "shop"]),
        ("aether-verify-install", &["get", "endpointpolicies.config.aether.io", "-n", NS]),
        ("aether-verify-install", &["update", "endpointpolicies.config.aether.io", "-n", NS]),
        ("aether-verify-install", &["delete", "endpointpolicies.config.aether.io", "-n", NS]),
        ("aether-verify-install", &["list", "pods", "-n", "shop"]),
        ("aether-verify-install", &["get", "pods/proxy", "-n", NS]),
        ("aether-verify-install", &["create", "pods", "-n", NS]),
        ("aether-verify-install", &["get", "secrets", "-n", NS]),
        ("aether-verify-install-test", &["create", "endpointpolicies.config.aether.io", "-n", "shop"]),
        ("aether-verify-install-test", &["get", "pods/proxy", "-n", NS]),
        ("aether-verify-install-test", &["list", "pods", "-n", "shop"]),
    ];
    let mut wrong = Vec::new();
    for (sa, a) in yes {
        if !can_i(cp, sa, a) {
            wrong.push(format!("{sa} cannot {a:?}"));
        }
    }
    for (sa, a) in no {
        if can_i(cp, sa, a) {
            wrong.push(format!("{sa} can {a:?}"));
        }
    }
    assert!(wrong.is_empty(), "RBAC differs from what the chart promises:\n{}", wrong.join("\n"));

    // Turning UDS workloads off takes the agent's policy access away on upgrade.
    let off = try_render_text("aether", &["proxy.udsWorkloads.enabled=false"]).expect("render");
    apply_rendered(cp, tmp.path(), "uds-off.yaml", &off, false);
    assert!(!can_i(cp, "aether-node", &["list", "endpointpolicies.config.aether.io", "--all-namespaces"]));
    assert!(can_i(cp, "aether-node", &["list", "pods", "--all-namespaces"]));
}

/// The node pods run at system-node-critical with a ResourceQuota scoped to that class in the
/// release namespace (what ResourceQuota admission with limitedResources demands), sized for a
/// surging proxy; an empty class or priorityQuota.enabled=false renders no quota.
#[test]
fn node_pods_are_node_critical_with_a_quota_scoped_to_that_class() {
    let docs = render(&[]);
    for ds in ["aether-node", "aether-proxy"] {
        let spec = &find(&docs, "DaemonSet", ds)["spec"]["template"]["spec"];
        assert_eq!(spec["priorityClassName"], "system-node-critical", "{ds}");
    }
    let quota = find(&docs, "ResourceQuota", "aether-node-critical-pods");
    assert_eq!(quota["metadata"]["namespace"], NS);
    assert_eq!(quota["spec"]["hard"]["pods"], "20000");
    assert_eq!(
        quota["spec"]["scopeSelector"]["matchExpressions"],
        serde_json::json!([{"scopeName": "PriorityClass", "operator": "In", "values": ["system-node-critical"]}])
    );
    assert!(!has(&render(&["daemonset.priorityQuota.enabled=false"]), "ResourceQuota"));
    let none = render(&["daemonset.priorityClassName="]);
    assert!(!has(&none, "ResourceQuota"), "no class, no quota");
    assert!(find(&none, "DaemonSet", "aether-node")["spec"]["template"]["spec"].get("priorityClassName").is_none());
    assert!(!has(&render(&["daemonset.priorityClassName=team-high"]), "ResourceQuota"), "only the limited classes");
}

/// controller.hostNetwork: the webhook listens on the node's network at webhookPort, its ports
/// declared as hostPorts (so no two replicas share a node), replaced one at a time, DNS through
/// the cluster; 10250 (the kubelet's) is refused. Only the preferred spread of the default stays:
/// a required anti-affinity would also bind the pods that replace them when hostNetwork is
/// turned off again, and that rollout would never finish.
#[test]
fn host_network_webhook_needs_a_port_other_than_the_kubelets() {
    let err = try_render(&["controller.hostNetwork=true"]).expect_err("10250 with hostNetwork");
    assert!(err.contains("controller.webhookPort=10250") && err.contains("kubelet"), "{err}");
    let docs = render(&["controller.hostNetwork=true", "controller.webhookPort=10260"]);
    let dep = find(&docs, "Deployment", "aether-controller");
    let spec = &dep["spec"]["template"]["spec"];
    assert_eq!(spec["hostNetwork"], true);
    assert_eq!(spec["dnsPolicy"], "ClusterFirstWithHostNet");
    assert_eq!(dep["spec"]["strategy"]["rollingUpdate"], serde_json::json!({"maxSurge": 0, "maxUnavailable": 1}));
    assert!(spec["affinity"]["podAntiAffinity"].get("requiredDuringSchedulingIgnoredDuringExecution").is_none());
    let c = container(spec, "aether-controller");
    assert_eq!(flag(c, "--webhook-addr").as_deref(), Some("0.0.0.0:10260"));
    let ports: Vec<(Value, Value)> =
        c["ports"].as_array().unwrap().iter().map(|p| (p["containerPort"].clone(), p["hostPort"].clone())).collect();
    assert_eq!(ports, [(Value::from(10260), Value::from(10260)), (Value::from(9090), Value::from(9090))]);
    let default = render(&[]);
    let c =
        container(&find(&default, "Deployment", "aether-controller")["spec"]["template"]["spec"], "aether-controller");
    assert!(
        c["ports"].as_array().unwrap().iter().all(|p| p.get("hostPort").is_none()),
        "no hostPort in the pod network"
    );
}

/// The controller's NetworkPolicy (opt-in): the webhook port from webhookFrom (anywhere when
/// empty), the admin port only from adminFrom, nothing else.
#[test]
fn controller_network_policy_opens_only_the_webhook_and_admin_ports() {
    assert!(!has(&render(&[]), "NetworkPolicy"), "opt-in");
    let docs = render(&[
        "controller.networkPolicy.enabled=true",
        "controller.networkPolicy.adminFrom[0].namespaceSelector.matchLabels.team=observability",
    ]);
    let np = find(&docs, "NetworkPolicy", "aether-controller");
    let dep = find(&docs, "Deployment", "aether-controller");
    assert_eq!(np["spec"]["podSelector"]["matchLabels"], dep["spec"]["selector"]["matchLabels"]);
    assert_eq!(np["spec"]["policyTypes"], serde_json::json!(["Ingress"]));
    assert_eq!(
        np["spec"]["ingress"],
        serde_json::json!([
            {"ports": [{"port": 10250, "protocol": "TCP"}]},
            {"ports": [{"port": 9090, "protocol": "TCP"}],
             "from": [{"namespaceSelector": {"matchLabels": {"team": "observability"}}}]}
        ])
    );
}

/// The README's Quickstart installs as the two-node suite does (on an API server that enforces
/// Pod Security `restricted` by default): the release namespace made by `release_namespace_command`,
/// the node side in `README_NODE_NAMESPACE`, which the chart creates labelled `privileged`. It
/// installs the charts `make charts` packages (`helm package`: `.cache/charts/<name>-<version>.tgz`),
/// so the README names each chart's current version.
#[test]
fn readme_installs_the_node_side_in_its_own_namespace_as_the_two_node_suite_does() {
    use aether_tests::node::{README_NODE_NAMESPACE, release_namespace_command};
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let create = format!("kubectl {}", release_namespace_command("aether-system").join(" "));
    assert!(readme.lines().any(|l| l.trim() == create), "README.md lacks the line `{create}`");
    let package = |name: &str| -> String {
        let meta: Value = yaml_serde::from_str(
            &std::fs::read_to_string(repo_root().join("charts").join(name).join("Chart.yaml")).expect("Chart.yaml"),
        )
        .expect("Chart.yaml parses");
        format!(".cache/charts/{name}-{}.tgz", meta["version"].as_str().expect("Chart.yaml version"))
    };
    let crds = format!("helm install aether-crds {}", package("aether-crds"));
    assert!(readme.lines().any(|l| l.trim() == crds), "README.md lacks the line `{crds}`");
    let install = format!("helm install aether {} -n aether-system", package("aether"));
    let set = format!("--set daemonset.namespace={README_NODE_NAMESPACE}");
    assert!(
        readme.lines().any(|l| l.starts_with(&install) && l.contains(&set)),
        "README.md lacks a line starting `{install}` with `{set}`"
    );
    assert!(!readme.contains("--create-namespace"), "an unlabelled namespace fails on restricted clusters");
}

/// `daemonset.namespace`: every node-side object goes there, the chart renders that namespace
/// labelled for Pod Security `privileged` (unless createNamespace=false), the controller stays in
/// the release namespace, and the install check looks for the agents there with a Role there.
#[test]
fn the_node_side_can_live_in_its_own_privileged_namespace() {
    let docs = render(&["daemonset.namespace=aether-node"]);
    let ns_of = |kind: &str, name: &str| find(&docs, kind, name)["metadata"]["namespace"].as_str().unwrap().to_owned();
    for (kind, name) in [
        ("DaemonSet", "aether-node"),
        ("DaemonSet", "aether-proxy"),
        ("ServiceAccount", "aether-node"),
        ("Role", "aether-node"),
        ("RoleBinding", "aether-node"),
        ("ConfigMap", "aether-node-envoy-bootstrap"),
        ("ResourceQuota", "aether-node-critical-pods"),
    ] {
        assert_eq!(ns_of(kind, name), "aether-node", "{kind} {name}");
    }
    assert_eq!(ns_of("Deployment", "aether-controller"), NS);
    let binding = find(&docs, "ClusterRoleBinding", "aether-node");
    assert_eq!(binding["subjects"][0]["namespace"], "aether-node");
    let ns = find(&docs, "Namespace", "aether-node");
    assert_eq!(ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "privileged");
    let job = find(&docs, "Job", VERIFY);
    assert_eq!(
        flag(container(&job["spec"]["template"]["spec"], "verify-install"), "--agent-namespace").as_deref(),
        Some("aether-node")
    );
    let objects = verify_objects(&docs);
    let agents =
        vec![rule("", "events", &["list"]), rule("", "pods", &["list"]), rule("apps", "daemonsets", &["list"])];
    assert_eq!(role_rules(&objects[&key("Role", VERIFY, "aether-node")]), agents);
    assert_eq!(
        role_rules(&objects[&key("Role", VERIFY, NS)]),
        vec![rule("config.aether.io", "endpointpolicies", &["create"])]
    );
    assert!(!has(&render(&["daemonset.namespace=aether-node", "daemonset.createNamespace=false"]), "Namespace"));
    assert!(!has(&render(&[&format!("daemonset.namespace={NS}")]), "Namespace"), "the release namespace is Helm's");
    assert!(!has(&render(&[]), "Namespace"));
    let err = try_render(&["daemonset.namespace=Aether_Node"]).expect_err("not a DNS label");
    assert!(err.contains("/daemonset/namespace"), "{err}");
}

/// `metrics.dashboard`: the Grafana dashboard ConfigMap is rendered only when enabled, in the
/// namespace asked for (the release's by default), with the sidecar's label; its one file is the
/// dashboard JSON, whose every panel query reads the Prometheus data source variable.
#[test]
fn the_dashboard_configmap_carries_the_dashboard_for_grafanas_sidecar() {
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
