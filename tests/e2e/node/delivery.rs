//! Delivery over the socket: `annotated_pod_is_served_over_the_kubelets_emptydir_socket`,
//! `policy_switches_delivery_to_the_socket_and_delete_switches_back`,
//! `a_client_pod_reaches_a_uds_only_app_through_its_service_ip`,
//! `a_dual_stack_pod_is_served_over_its_socket_at_its_ipv6_address_and_service`,
//! `a_pod_swapping_its_socket_for_a_link_never_gets_another_pods_traffic`,
//! `memory_emptydir_socket_is_reached`,
//! `a_grpc_server_on_its_socket_is_promoted_and_answers_a_grpc_client_through_its_service`,
//! `a_pod_back_on_its_socket_is_served_at_once` and `deleted_pod_clusters_are_withdrawn`.
//!
//! What they prove: Envoy in the node pod dials the socket an app container made in the kubelet's
//! real emptyDir path (disk and `medium: Memory`), through the chart's read-only HostToContainer
//! mount and the socket's pin; a policy switches delivery to the socket and back; a client pod
//! reaches a UDS-only app through its Service (at IPv4, and at IPv6 on this dual-stack node), and a gRPC server on its socket through its
//! Service, health-checked with grpc.health.v1; a pod swapping its socket for a link to another
//! pod's never gets that pod's traffic; a socket put back is served at once; and a deleted pod's
//! clusters are withdrawn.

use std::time::{Duration, Instant};

use aether_crds::pod::{GRPC_HEALTH_SERVICE_ANNOTATION, PORTS_ANNOTATION};
use aether_fixtures::{echo_app, policy, service};
use aether_tests::eventually;
use anyhow::{Context, ensure};

use crate::env::{Env, PINS, WAIT, active_listener_netns, uid};

pub(crate) fn annotated_pod_is_served_over_the_kubelets_emptydir_socket(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&echo_app("web").annotated().manifest())?;
    let pod = env.wait_pod_ready("default", "web")?;
    let path = env.socket_path(&uid(&pod)?, "s", "app.sock");
    eventually("the app's socket at the kubelet's emptyDir path", WAIT, || {
        Ok(std::fs::symlink_metadata(&path).is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type())))
    })?;
    env.wait_pinned("app_default_web_8080", &uid(&pod)?, &path)?;
    eventually("health gateway 200 for health_default_web", WAIT, || Ok(env.health("health_default_web")? == 200))?;
    Ok(())
}

pub(crate) fn policy_switches_delivery_to_the_socket_and_delete_switches_back(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&echo_app("both").tcp_sidecar().manifest())?;
    let pod = env.wait_pod_ready("default", "both")?;
    // TCP delivery dials 127.0.0.1 inside the pod's netns, which the agent learned from containerd
    // over CRI: Envoy (privileged, /run/netns mounted HostToContainer) health-checks the app there.
    let tcp = "127.0.0.1:8080".to_owned();
    env.wait_healthy_at("app_default_both_8080", &tcp, |a| a == tcp)?;
    let netns = env.bind_netns("app_default_both_8080")?.context("no upstream_bind_config netns")?;
    ensure!(netns.starts_with(env.node.netns_prefix()), "netns path from the runtime: {netns}");
    env.kube().apply(&policy("default", "both-uds").target("both").socket("s/app.sock").manifest())?;
    let path = env.socket_path(&uid(&pod)?, "s", "app.sock");
    env.wait_pinned("app_default_both_8080", &uid(&pod)?, &path)?;
    // Its app also holds TCP 8080: Envoy cannot bind the inbound listener there; the agent reads
    // that from Envoy's config dump, withdraws that listener and tells the pod.
    let mut events = String::new();
    eventually("a UdsInboundListenerFailed Event on pod both", WAIT, || {
        events = env.kube().ok(&[
            "get",
            "events",
            "-n",
            "default",
            "--field-selector",
            "involvedObject.name=both,reason=UdsInboundListenerFailed",
            "-o",
            "jsonpath={.items[*].message}",
        ])?;
        Ok(events.contains("port 8080"))
    })?;
    println!("Event on pod both: {events}");
    eventually("the failed listener is not offered", WAIT, || {
        Ok(active_listener_netns("inbound_default_both_8080")?.is_none())
    })?;
    env.kube().ok(&["delete", "endpointpolicy", "-n", "default", "both-uds"])?;
    env.wait_healthy_at("app_default_both_8080", &tcp, |a| a == tcp)?;
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "both", "--wait=true"])?;
    Ok(())
}

pub(crate) fn a_client_pod_reaches_a_uds_only_app_through_its_service_ip(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&echo_app("inb").annotated().ready_through_port_8080().manifest())?;
    // Ready means kubelet's httpGet probe on pod IP:8080 passed: through the netns-bound listener.
    env.wait_pod_ready("default", "inb")?;
    let netns = wait_active_listener("inbound_default_inb_8080")?;
    ensure!(netns.starts_with(env.node.netns_prefix()), "listener bound in the pod's netns from the runtime: {netns}");
    let url = format!("http://{}/hello", env.service_target("inb", 8080)?);
    let (ok, body) = env.client_get("client-uds", &url)?;
    println!("client pod: uds-echo --get {url}\n{body}");
    ensure!(ok && body.contains("inb over unix:/s/app.sock: GET /hello"), "through the Service: {body}");
    println!("listener inbound_default_inb_8080 in Envoy's config_dump, bound in {netns}");

    // Back to TCP: the listener goes, the port is free in the pod, a UDS-only app is unreachable.
    env.kube().ok(&["annotate", "pod", "-n", "default", "inb", "endpoint.aether.io/uds-socket-"])?;
    eventually("the inbound listener is withdrawn", WAIT, || {
        Ok(active_listener_netns("inbound_default_inb_8080")?.is_none())
    })?;
    eventually("nothing listens on 8080 in the pod's netns", WAIT, || {
        let out = std::process::Command::new("nsenter")
            .arg(format!("--net={netns}"))
            .args(["ss", "-Htln", "sport = :8080"])
            .output()
            .context("nsenter ss")?;
        ensure!(out.status.success(), "nsenter: {}", String::from_utf8_lossy(&out.stderr));
        Ok(out.stdout.iter().all(u8::is_ascii_whitespace))
    })?;
    let (ok, body) = env.client_get("client-tcp", &url)?;
    ensure!(!ok, "a UDS-only app delivered over TCP has nothing on its port, yet: {body}");
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "inb", "--wait=true"])?;
    Ok(())
}

/// On the suite's dual-stack node (IPv4 primary): a UDS-only pod gets an IPv4 and an IPv6 address,
/// Envoy's inbound listener binds both `0.0.0.0:8080` and `[::]:8080` in the pod's netns
/// (docs/listeners.md, "IP families"), and a client pod reaches the app over its socket at the
/// pod's IPv6 address and through an IPv6-only Service, as it does at IPv4 (the case above).
pub(crate) fn a_dual_stack_pod_is_served_over_its_socket_at_its_ipv6_address_and_service(
    env: &Env,
) -> anyhow::Result<()> {
    env.kube().apply(&echo_app("dual").annotated().ready_through_port_8080().manifest())?;
    let pod = env.wait_pod_ready("default", "dual")?;
    let ips: Vec<&str> = pod["status"]["podIPs"]
        .as_array()
        .map(|a| a.iter().filter_map(|i| i["ip"].as_str()).collect())
        .unwrap_or_default();
    println!("pod dual: podIPs {ips:?}");
    let [v4, v6] = ips[..] else { anyhow::bail!("a dual-stack node gives a pod two IPs, IPv4 first: {ips:?}") };
    ensure!(!v4.contains(':') && v6.contains(':'), "IPv4 first, then IPv6: {ips:?}");
    let netns = wait_active_listener("inbound_default_dual_8080")?;
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={netns}"))
        .args(["ss", "-Htln", "sport = :8080"])
        .output()
        .context("nsenter ss")?;
    ensure!(out.status.success(), "nsenter: {}", String::from_utf8_lossy(&out.stderr));
    let listening = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("listening on 8080 in {netns}:\n{listening}");
    ensure!(
        listening.contains("0.0.0.0:8080") && listening.contains("[::]:8080"),
        "Envoy holds 0.0.0.0:8080 and [::]:8080 in the pod's netns: {listening}"
    );
    let expect = "dual over unix:/s/app.sock: GET /hello";
    let url = format!("http://[{v6}]:8080/hello");
    let (ok, body) = env.client_get("client-v6-pod", &url)?;
    println!("client pod: uds-echo --get {url}\n{body}");
    ensure!(ok && body.contains(expect), "at the pod's IPv6 address: {body}");
    let svc = service("default", "dual-v6").select("app", "dual").port(8080, 8080).ip_families(&["IPv6"]);
    env.kube().apply(&svc.json().to_string())?;
    let target = env.service_target("dual-v6", 8080)?;
    ensure!(target.is_ipv6(), "an IPv6-only Service has an IPv6 ClusterIP: {target}");
    let url = format!("http://{target}/hello");
    let (ok, body) = env.client_get("client-v6-svc", &url)?;
    println!("client pod: uds-echo --get {url}\n{body}");
    ensure!(ok && body.contains(expect), "through the IPv6 Service: {body}");
    env.kube().ok(&["delete", "service", "-n", "default", "dual-v6", "--wait=true"])?;
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "dual", "--wait=true"])?;
    Ok(())
}

/// The toggle attack between two real pods (docs/design-notes.md, "Agent"): pod atk's app keeps
/// swapping its socket for a symlink to pod vic's socket (the path Envoy would resolve) every ~2
/// ms; requests to atk's pod IP:8080 (its inbound listener) for 10 s. Envoy dials atk's pin, so
/// none reaches vic.
pub(crate) fn a_pod_swapping_its_socket_for_a_link_never_gets_another_pods_traffic(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&echo_app("vic").annotated().manifest())?;
    let vic_uid = uid(&env.wait_pod_ready("default", "vic")?)?;
    let vic_socket = env.socket_path(&vic_uid, "s", "app.sock");
    let vic_socket = vic_socket.to_str().context("vic's socket path")?;
    env.kube().apply(&echo_app("atk").annotated().args(&["--swap-link", vic_socket]).manifest())?;
    let atk = env.wait_pod_ready("default", "atk")?;
    let ip = atk["status"]["podIP"].as_str().context("atk's pod IP")?.to_owned();
    // Either Envoy serves atk through its pin, or (inotify makes a swap visible at once, and a link
    // refusal lasts the pod's life) the agent has already put atk on TCP: then nothing listens.
    let refused = || -> anyhow::Result<bool> {
        let field = "involvedObject.name=atk,reason=UdsSymlinkRefused";
        let events = env.kube().ok(&["get", "events", "-n", "default", "--field-selector", field, "-o", "name"])?;
        Ok(!events.trim().is_empty())
    };
    eventually("atk served through its pin, or refused", WAIT, || {
        Ok(active_listener_netns("inbound_default_atk_8080")?.is_some() || refused()?)
    })?;
    let client = reqwest::blocking::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build()?;
    let (mut own, mut victim, mut other) = (0u32, 0u32, 0u32);
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        match client.get(format!("http://{ip}:8080/steal")).send().and_then(|r| r.text()) {
            Ok(body) if body.contains("vic over unix") => victim += 1,
            Ok(body) if body.contains("atk over unix") => own += 1,
            _ => other += 1,
        }
    }
    println!(
        "toggle attack on the real node, 10 s: {} requests to atk's pod IP: {own} to atk, {victim} to vic, {other} \
         refused/unhealthy; atk refused (UdsSymlinkRefused Event): {}",
        own + victim + other,
        refused()?
    );
    ensure!(victim == 0, "{victim} requests for atk were delivered to vic's socket");
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "atk", "vic", "--wait=true"])?;
    Ok(())
}

/// A gRPC server (`uds-echo --grpc`: tonic with the standard health service) only on its socket,
/// port 9090 declared `=grpc`: Envoy checks it with grpc.health.v1 (kubelet's own gRPC readiness
/// probe goes through the inbound listener), the health gateway follows SERVING / NOT_SERVING,
/// and a gRPC client pod reaches it through its Service.
pub(crate) fn a_grpc_server_on_its_socket_is_promoted_and_answers_a_grpc_client_through_its_service(
    env: &Env,
) -> anyhow::Result<()> {
    let grpc = echo_app("grpc")
        .annotated()
        .annotation(PORTS_ANNOTATION, "9090=grpc")
        .annotation(GRPC_HEALTH_SERVICE_ANNOTATION, "grpc")
        .args(&["--grpc"])
        .grpc_on(9090);
    env.kube().apply(&grpc.manifest())?;
    // Ready: kubelet's gRPC probe on pod IP:9090 passed, through the inbound listener.
    let pod = env.wait_pod_ready("default", "grpc")?;
    let pod_uid = uid(&pod)?;
    env.wait_pinned("app_default_grpc_9090", &pod_uid, &env.socket_path(&pod_uid, "s", "app.sock"))?;
    eventually("health gateway 200 while SERVING", WAIT, || Ok(env.health("health_default_grpc")? == 200))?;
    let check = env.endpoint("health_default_grpc")?;
    println!("health_default_grpc SERVING: gateway 200, Envoy's endpoint {check:?}");

    let flag = env.socket_path(&pod_uid, "s", "not-serving");
    std::fs::write(&flag, b"")?;
    let flipped = Instant::now();
    eventually("health gateway 503 while NOT_SERVING", WAIT, || Ok(env.health("health_default_grpc")? == 503))?;
    println!("NOT_SERVING: gateway 503 after {:.1} s", flipped.elapsed().as_secs_f64());
    // kubelet's gRPC probe sees NOT_SERVING too: the pod leaves the Service's endpoints.
    let ready = || -> anyhow::Result<bool> {
        let pod = env.pod_json("default", "grpc")?;
        let conditions = pod["status"]["conditions"].as_array().cloned().unwrap_or_default();
        Ok(conditions.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
    };
    eventually("pod grpc NotReady while NOT_SERVING", WAIT, || Ok(!ready()?))?;
    let ip = env.kube().ok(&["get", "service", "-n", "default", "grpc", "-o", "jsonpath={.spec.clusterIP}"])?;
    let url = format!("http://{}:9090", ip.trim());
    let (ok, out) = env.client_run("grpc-client-down", &["--grpc-check", &url, "--service", "grpc"])?;
    ensure!(!ok, "through the Service while NOT_SERVING (no ready endpoint): {out}");

    std::fs::remove_file(&flag)?;
    let flipped = Instant::now();
    eventually("health gateway 200 when SERVING again", WAIT, || Ok(env.health("health_default_grpc")? == 200))?;
    println!("SERVING again: gateway 200 after {:.1} s", flipped.elapsed().as_secs_f64());
    eventually("pod grpc Ready again", WAIT, ready)?;
    // Its endpoint back in kube-proxy's DNAT (the REJECT it had while NOT_SERVING is gone).
    aether_tests::service_rules::wait_programmed_here(format!("{}:9090", ip.trim()).parse()?)?;
    let (ok, out) = env.client_run("grpc-client", &["--grpc-check", &url, "--service", "grpc"])?;
    println!("client pod: uds-echo --grpc-check {url} --service grpc\n{out}");
    ensure!(ok && out.contains("SERVING"), "a gRPC client through the Service: {out}");
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "grpc", "--wait=true"])?;
    Ok(())
}

/// Pod web's socket path is made a FIFO (its socket moved aside): the agent falls back to TCP.
/// The socket put back is served over its pin at once (the socket watch), not at the next
/// periodic re-check (`recheckSeconds`, 10 s by default).
pub(crate) fn a_pod_back_on_its_socket_is_served_at_once(env: &Env) -> anyhow::Result<()> {
    let pod = env.pod_json("default", "web")?;
    let pod_uid = uid(&pod)?;
    let socket = env.socket_path(&pod_uid, "s", "app.sock");
    let aside = socket.with_file_name("app.sock.aside");
    let pin = format!("{PINS}/{pod_uid}.sock");
    env.wait_pinned("app_default_web_8080", &pod_uid, &socket)?;
    std::fs::rename(&socket, &aside)?;
    let made = std::process::Command::new("mkfifo").arg(&socket).status().context("mkfifo")?;
    ensure!(made.success(), "mkfifo {}", socket.display());
    let fell = Instant::now();
    eventually("web falls back to TCP (not a socket)", WAIT, || {
        Ok(env.endpoint("app_default_web_8080")?.is_some_and(|(a, _)| a != pin))
    })?;
    println!("FIFO at the socket path: web on TCP after {:.2} s", fell.elapsed().as_secs_f64());
    std::fs::remove_file(&socket)?;
    std::fs::rename(&aside, &socket)?;
    let back = Instant::now();
    let mut polls = 0u32;
    while env.endpoint("app_default_web_8080")?.is_none_or(|(a, _)| a != pin) {
        polls += 1;
        ensure!(back.elapsed() < WAIT, "web not back on its pin within {} s", WAIT.as_secs());
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = back.elapsed();
    println!("socket back: Envoy dials web's pin again after {:.3} s ({polls} polls of /clusters)", took.as_secs_f64());
    env.wait_pinned("app_default_web_8080", &pod_uid, &socket)?;
    eventually("health gateway 200 again", WAIT, || Ok(env.health("health_default_web")? == 200))?;
    println!("health_default_web 200 again after {:.2} s", back.elapsed().as_secs_f64());
    // Half the periodic re-check: only the socket watch can be this quick.
    ensure!(took < Duration::from_secs(5), "back on the socket after {took:?}: not the socket watch");
    Ok(())
}

pub(crate) fn memory_emptydir_socket_is_reached(env: &Env) -> anyhow::Result<()> {
    env.kube().apply(&echo_app("mem").socket_volume("m").in_memory().annotated().manifest())?;
    let pod = env.wait_pod_ready("default", "mem")?;
    let pod_uid = uid(&pod)?;
    let path = env.socket_path(&pod_uid, "m", "app.sock");
    // The tmpfs was mounted after the node pod started: HostToContainer propagation shows it.
    let volume = format!("{pod_uid}/volumes/kubernetes.io~empty-dir/m ");
    let mounted = std::fs::read_to_string("/proc/self/mountinfo")?.lines().any(|l| l.contains(&volume));
    ensure!(mounted, "the Memory emptyDir of pod mem is not a mount on the host");
    env.wait_pinned("app_default_mem_8080", &pod_uid, &path)?;
    Ok(())
}

pub(crate) fn deleted_pod_clusters_are_withdrawn(env: &Env) -> anyhow::Result<()> {
    ensure!(env.endpoint("app_default_mem_8080")?.is_some(), "mem is not served before the delete");
    env.kube().ok(&["delete", "pod,service,serviceaccount", "-n", "default", "mem", "--wait=true"])?;
    eventually("app_default_mem_8080 gone from Envoy", WAIT, || Ok(env.endpoint("app_default_mem_8080")?.is_none()))?;
    eventually("health gateway 404 for health_default_mem", WAIT, || Ok(env.health("health_default_mem")? == 404))?;
    Ok(())
}

/// Waits until Envoy's inbound listener `name` is active; returns the netns it is bound in.
fn wait_active_listener(name: &str) -> anyhow::Result<String> {
    let mut netns = None;
    eventually(&format!("Envoy's {name} listener is active"), WAIT, || {
        netns = active_listener_netns(name)?;
        Ok(netns.is_some())
    })?;
    netns.context("listener netns")
}
