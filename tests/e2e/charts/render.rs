//! The rendered objects against the values: `helm lint`, and `helm template` over a matrix of
//! values with assertions on the rendered objects (`rendered_objects_follow_the_values_matrix`),
//! then one test per value that shapes them: SELinux labelling, the test Envoy's bootstrap and
//! flags, RBAC aggregation, the hand-over switch, values that would separate agent and proxy,
//! `socketLimit` in both charts, the default image tags, the PodDisruptionBudget, the priority
//! class and its quota, the host-network webhook, the NetworkPolicy and the node side's own
//! namespace.

use std::process::Command;

use aether_crds::udspath::Budget;
use serde::Deserialize;
use serde_json::Value;

use crate::install_check::{VERIFY, key, role_rules, rule, verify_objects};
use crate::template::{NS, args, chart, container, find, flag, has, helm, render, try_render, try_render_text};

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
pub(crate) fn the_node_pod_runs_as_spc_t_unless_selinux_labelling_is_turned_off() {
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

pub(crate) fn helm_lint_passes_for_both_charts() {
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

/// The container's liveness and readiness probes are exec probes of `binary probe` over the
/// probe socket `run --probe-socket` opens, in an emptyDir mounted at its directory.
fn check_exec_probes(pod: &Value, c: &Value, binary: &str) {
    // The path is the released image's: its Dockerfile's ENTRYPOINT (the e2e images are built
    // from the same Dockerfile and run these probes on a real kubelet).
    let dockerfile =
        if binary.ends_with("aether-agent") { "agent-reconciler/Dockerfile" } else { "controller/Dockerfile" };
    let text = std::fs::read_to_string(aether_tests::repo_root().join(dockerfile)).expect(dockerfile);
    assert!(text.contains(&format!("ENTRYPOINT [\"{binary}\"]")), "{dockerfile} does not run {binary}");
    let socket = flag(c, "--probe-socket").expect("--probe-socket");
    assert_eq!(socket, "/run/aether-probe/probe.sock");
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let want = vec![binary.to_owned(), "probe".into(), format!("--socket={socket}"), format!("--path={path}")];
        assert_eq!(c[probe]["exec"]["command"], Value::from(want), "{binary}: {probe}");
        assert!(c[probe]["timeoutSeconds"].as_u64().unwrap_or(1) > 2, "{binary}: {probe} outlasts --timeout-seconds 2");
    }
    let mount =
        c["volumeMounts"].as_array().expect("volumeMounts").iter().find(|m| m["mountPath"] == "/run/aether-probe");
    let volume = &mount.expect("a mount at the probe socket's directory")["name"];
    let vol = pod["volumes"].as_array().expect("volumes").iter().find(|v| &v["name"] == volume).expect("its volume");
    assert!(vol.get("emptyDir").is_some(), "{binary}: the probe socket's volume is pod-local: {vol}");
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
    check_exec_probes(pod, c, "/usr/local/bin/aether-controller");
    let ports = c["ports"].as_array().expect("ports");
    let port_of = |n: &str| ports.iter().find(|p| p["name"] == n).map(|p| p["containerPort"].clone());
    assert_eq!(port_of("admin"), Some(Value::from(9090)));
    assert_eq!(port_of("webhook"), Some(Value::from(10250)));
    assert_eq!(flag(c, "--admin-addr").as_deref(), Some("[::]:9090"));
    assert_eq!(flag(c, "--webhook-addr").as_deref(), Some("[::]:10250"));
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
    check_exec_probes(pod, agent, "/usr/local/bin/aether-agent");
    // helm uninstall (this DaemonSet gone) is when the agent removes the pins and health.sock.
    assert_eq!(flag(agent, "--own-daemonset").as_deref(), Some("$(POD_NAMESPACE)/aether-node"));
    // Each pod's inbound listeners: the chart's defaults are the agent's own.
    let opts = aether_agent_reconciler::xds::BuildOptions::default();
    assert_eq!(flag(agent, "--inbound-max-connections"), Some(opts.inbound_max_connections.to_string()));
    assert_eq!(flag(agent, "--inbound-idle-timeout-seconds"), Some(opts.inbound_idle_timeout.as_secs().to_string()));
    assert!(
        agent["env"]
            .as_array()
            .expect("env")
            .iter()
            .any(|e| e["name"] == "POD_NAMESPACE" && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace")
    );
    // Not privileged: the capabilities Envoy needs (values.yaml says which for what), the
    // runtime's seccomp profile. The real-node suite runs it so.
    let sc = &envoy["securityContext"];
    assert!(sc.get("privileged").is_none_or(|p| p == false), "the proxy is not privileged: {sc}");
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(
        sc["capabilities"]["add"],
        serde_json::json!(["SYS_ADMIN", "DAC_OVERRIDE", "NET_BIND_SERVICE", "NET_ADMIN"])
    );
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!((sc["runAsUser"].as_u64(), sc["readOnlyRootFilesystem"].as_bool()), (Some(0), Some(true)));
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
    // Recorded with the serving epoch, so that another release's launcher never takes it over.
    let ns = proxy_ds["metadata"]["namespace"].as_str().expect("namespace");
    assert_eq!(flag(envoy, "--owner"), Some(format!("{ns}/aether-proxy")));
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
        // With pinning Envoy dials only the pins: the proxy gets no pods dir (every pod's Secret
        // and token volumes) at all; without it, Envoy dials the socket there.
        let pinning = flag(agent, "--pin-dir").is_some();
        let proxy_volumes = proxy["volumes"].as_array().expect("proxy volumes");
        assert_eq!(
            proxy_volumes.iter().any(|v| v["hostPath"]["path"] == case.host_dir),
            !pinning,
            "{}: the proxy has a hostPath of the pods dir exactly when pinning is off",
            case.name
        );
        assert_eq!(mounts(envoy).iter().any(|m| m["name"] == "kubelet-pods"), !pinning, "{}", case.name);
        for c in if pinning { vec![agent] } else { vec![agent, envoy] } {
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

pub(crate) fn rendered_objects_follow_the_values_matrix() {
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
/// for the same values (the admin on its Unix socket whatever `proxy.adminPort` says), and the
/// launcher changes only the xDS socket path, the admin (an ephemeral TCP port) and the ports (0:
/// ephemeral) and passes the DaemonSet's Envoy flags.
pub(crate) fn the_test_envoy_runs_the_charts_bootstrap_and_flags() {
    use aether_fixtures::envoy::{
        CHART_ADMIN_SOCKET, CHART_MAX_HEAP_BYTES, CHART_OVERLOAD_MAX_CONNECTIONS, CHART_STATS_PORT,
        CHART_STATS_SCRAPES_PER_MINUTE, CHART_XDS_SOCKET, ChartBootstrap, EnvoyAdmin, chart_flags,
    };
    // --set values, then the bootstrap's readiness port, stats port, listenIPv6, scrapes a minute.
    type Case<'a> = (&'a [&'a str], u16, Option<u16>, bool, u32);
    let cases: [Case; 5] = [
        (&[], 9902, Some(CHART_STATS_PORT), true, CHART_STATS_SCRAPES_PER_MINUTE),
        (
            &["proxy.adminPort=19901", "proxy.readinessPort=19902", "proxy.stats.port=19090"],
            19902,
            Some(19090),
            true,
            CHART_STATS_SCRAPES_PER_MINUTE,
        ),
        (&["proxy.stats.port=0"], 9902, None, true, CHART_STATS_SCRAPES_PER_MINUTE),
        (&["proxy.listenIPv6=false"], 9902, Some(CHART_STATS_PORT), false, CHART_STATS_SCRAPES_PER_MINUTE),
        // 60 / 7 is not whole: the fill interval is rounded to the millisecond (8.571s), as in the chart.
        (&["proxy.stats.maxScrapesPerMinute=7"], 9902, Some(CHART_STATS_PORT), true, 7),
    ];
    for (sets, readiness_port, stats_port, listen_ipv6, stats_scrapes_per_minute) in cases {
        let docs = render(sets);
        let text =
            find(&docs, "ConfigMap", "aether-node-envoy-bootstrap")["data"]["envoy.yaml"].as_str().expect("envoy.yaml");
        let chart: Value = yaml_serde::from_str(text).expect("the bootstrap is YAML");
        let ours = ChartBootstrap {
            xds_socket: CHART_XDS_SOCKET.to_owned(),
            admin: EnvoyAdmin::Pipe(CHART_ADMIN_SOCKET.to_owned()),
            readiness_port,
            listen_ipv6,
            stats_port,
            stats_scrapes_per_minute,
            ..ChartBootstrap::default()
        }
        .render();
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
    // The overload manager's bounds follow proxy.overload and the proxy's memory limit.
    let overload: [(&[&str], u32, u64); 5] = [
        (&["proxy.overload.maxConnections=5"], 5, CHART_MAX_HEAP_BYTES),
        (&["proxy.resources.limits.memory=1Gi"], CHART_OVERLOAD_MAX_CONNECTIONS, (1 << 30) * 85 / 100),
        (&["proxy.resources.limits.memory=2000M"], CHART_OVERLOAD_MAX_CONNECTIONS, 2_000_000_000 * 85 / 100),
        (&["proxy.overload.maxHeapBytes=1000000"], CHART_OVERLOAD_MAX_CONNECTIONS, 1_000_000),
        // No memory limit: no heap monitor, the connection cap alone.
        (&["proxy.resources.limits=null"], CHART_OVERLOAD_MAX_CONNECTIONS, 0),
    ];
    for (sets, overload_max_connections, max_heap_bytes) in overload {
        let docs = render(sets);
        let text =
            find(&docs, "ConfigMap", "aether-node-envoy-bootstrap")["data"]["envoy.yaml"].as_str().expect("envoy.yaml");
        let chart: Value = yaml_serde::from_str(text).expect("the bootstrap is YAML");
        let ours = ChartBootstrap { overload_max_connections, max_heap_bytes, ..ChartBootstrap::default() }.render();
        assert_eq!(chart, ours, "{sets:?}: the overload manager");
    }
    // A memory limit the chart cannot read: helm fails naming the value and the way out.
    let err = try_render(&["proxy.resources.limits.memory=0.5Gi"]).expect_err("0.5Gi rendered");
    assert!(
        err.contains(r#"proxy.resources.limits.memory "0.5Gi""#) && err.contains("proxy.overload.maxHeapBytes"),
        "{err}"
    );

    let launcher = aether_fixtures::Envoy::builder("/tmp/t/xds.sock", "node-a", "/tmp/t");
    let overridden = ChartBootstrap {
        xds_socket: "/tmp/t/xds.sock".to_owned(),
        admin: EnvoyAdmin::Tcp(0),
        readiness_port: 0,
        listen_ipv6: true,
        stats_port: None,
        ..ChartBootstrap::default()
    };
    assert_eq!(launcher.bootstrap(), overridden.render());
    let launcher_args = launcher.args().join(" ");
    assert!(launcher_args.contains(&chart_flags("node-a").join(" ")), "{launcher_args}");
}

pub(crate) fn aggregation_labels_follow_the_value() {
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

/// `proxy.handOver.enabled=false` is the old behaviour: Envoy with `--disable-hot-restart`, no
/// hand-over mounts, delete-first rolls.
pub(crate) fn the_hand_over_switches_off() {
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
pub(crate) fn values_that_would_separate_agent_and_proxy_fail_naming_the_value() {
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
pub(crate) fn socket_limit_reaches_both_binaries_and_filesystem_needs_pinning() {
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
pub(crate) fn the_crd_chart_renders_the_generated_crd_for_each_socket_limit() {
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

/// One version: the chart's default image tags are its `appVersion`, which is the binaries'
/// version (this crate's, `workspace.package.version`; `--version` prints it).
pub(crate) fn default_images_are_tagged_with_the_binaries_version() {
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

/// The proxy launcher's image is `images.launcher`, each empty field taking `images.agent`'s: by
/// default a new agent tag changes the proxy pod template too (its initContainer; a hand-over),
/// and with the launcher's tag pinned an agent-only change leaves the proxy DaemonSet as it was.
pub(crate) fn the_launcher_image_follows_the_agents_unless_pinned() {
    let launcher = |sets: &[&str]| -> (Value, String) {
        let docs = render(sets);
        let ds = find(&docs, "DaemonSet", "aether-proxy");
        let init = ds["spec"]["template"]["spec"]["initContainers"][0].clone();
        assert_eq!(init["name"], "install-launcher");
        (
            ds.clone(),
            format!("{} {}", init["image"].as_str().unwrap_or("?"), init["imagePullPolicy"].as_str().unwrap_or("?")),
        )
    };
    let version = env!("CARGO_PKG_VERSION");
    let (default, image) = launcher(&[]);
    assert_eq!(image, format!("ghcr.io/aether-mesh/aether-agent:{version} IfNotPresent"));
    let (followed, image) = launcher(&["images.agent.tag=next", "images.agent.pullPolicy=Always"]);
    assert_eq!(image, "ghcr.io/aether-mesh/aether-agent:next Always");
    assert_ne!(followed, default, "by default the proxy pods follow the agent's image");
    let pinned = format!("images.launcher.tag={version}");
    let (base, _) = launcher(&[pinned.as_str()]);
    let (moved, image) = launcher(&[pinned.as_str(), "images.agent.tag=next"]);
    assert_eq!(image, format!("ghcr.io/aether-mesh/aether-agent:{version} IfNotPresent"));
    assert_eq!(moved, base, "with the launcher pinned, an agent-only tag change leaves the proxy DaemonSet alone");
    let (_, image) = launcher(&["images.launcher.repository=mirror/launcher", "images.launcher.pullPolicy=Never"]);
    assert_eq!(image, format!("mirror/launcher:{version} Never"));
}

/// A PodDisruptionBudget with `minAvailable: 1` over a single replica forbids every eviction
/// (node drains block forever): it is rendered only with more than one replica, and a
/// `minAvailable` not below `replicas` is refused naming both values.
pub(crate) fn pdb_is_rendered_only_when_a_replica_can_be_evicted() {
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

/// The node pods run at system-node-critical with a ResourceQuota scoped to that class in the
/// release namespace (what ResourceQuota admission with limitedResources demands), sized for a
/// surging proxy; an empty class or priorityQuota.enabled=false renders no quota.
pub(crate) fn node_pods_are_node_critical_with_a_quota_scoped_to_that_class() {
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
pub(crate) fn host_network_webhook_needs_a_port_other_than_the_kubelets() {
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
    assert_eq!(flag(c, "--webhook-addr").as_deref(), Some("[::]:10260"));
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
pub(crate) fn controller_network_policy_opens_only_the_webhook_and_admin_ports() {
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

/// `daemonset.namespace`: every node-side object goes there, the chart renders that namespace
/// labelled for Pod Security `privileged` (unless createNamespace=false), the controller stays in
/// the release namespace, and the install check looks for the agents there with a Role there.
pub(crate) fn the_node_side_can_live_in_its_own_privileged_namespace() {
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

/// Every pod the chart runs (the controller's Deployment, both node DaemonSets, the certificate
/// and install-check Jobs, the `helm test` Pod) selects `kubernetes.io/os: linux` nodes (the
/// images are Linux ones: a Windows pool must not get them), merged under the user's
/// `*.nodeSelector`, whose keys win.
pub(crate) fn every_pod_selects_linux_nodes_under_the_users_selector() {
    let pod_specs = |docs: &[Value]| -> Vec<(String, Value)> {
        docs.iter()
            .filter_map(|d| {
                let spec = match d["kind"].as_str()? {
                    "Deployment" | "DaemonSet" | "Job" => &d["spec"]["template"]["spec"],
                    "Pod" => &d["spec"],
                    _ => return None,
                };
                Some((
                    format!("{}/{}", d["kind"].as_str()?, d["metadata"]["name"].as_str()?),
                    spec["nodeSelector"].clone(),
                ))
            })
            .collect()
    };
    let defaults = pod_specs(&render(&[]));
    assert!(defaults.len() >= 6, "{defaults:?}");
    for (name, selector) in &defaults {
        assert_eq!(selector, &serde_json::json!({ "kubernetes.io/os": "linux" }), "{name}");
    }
    let set = render(&[
        "daemonset.nodeSelector.pool=edge",
        "controller.nodeSelector.pool=system",
        "verifyInstall.nodeSelector.pool=system",
    ]);
    for (name, selector) in pod_specs(&set) {
        assert_eq!(selector["kubernetes.io/os"], "linux", "{name}: {selector}");
        let want = match name.as_str() {
            "DaemonSet/aether-node" | "DaemonSet/aether-proxy" => Some("edge"),
            "Deployment/aether-controller" => Some("system"),
            n if n.contains("verify") => Some("system"),
            _ => None,
        };
        assert_eq!(selector["pool"].as_str(), want, "{name}: {selector}");
    }
    let arm = render(&[
        "controller.nodeSelector.kubernetes\\.io/arch=arm64",
        "controller.nodeSelector.kubernetes\\.io/os=linux",
    ]);
    let (_, controller) =
        pod_specs(&arm).into_iter().find(|(n, _)| n == "Deployment/aether-controller").expect("controller");
    assert_eq!(controller, serde_json::json!({ "kubernetes.io/os": "linux", "kubernetes.io/arch": "arm64" }));
}
