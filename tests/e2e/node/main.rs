//! The real-node suite: a dual-stack kubelet + containerd node (`tests/harness/node.sh`,
//! `AETHER_IP_FAMILY=dual`; CRI-O instead with `AETHER_RUNTIME=crio`), the charts installed
//! with `helm install` from images built here (`tests/harness/images.sh`, no registry), and real
//! pods whose app serves HTTP on a Unix socket in an emptyDir.
//!
//! What it proves: the chart's containers run as configured (command lines,
//! paths, probes) with no restarts; the installed webhook is reached through its Service; `helm
//! install --wait --wait-for-jobs` runs the startup check (`aether-controller verify-install`) and
//! `helm test` passes, while both fail, naming the webhook check, when the webhook is broken; Envoy
//! in the node pod dials the socket an app container made in the kubelet's real emptyDir path
//! (disk and `medium: Memory`), through the chart's read-only HostToContainer mount; a policy
//! switches delivery to the socket and back; a client pod is served over the socket at a pod's IPv6
//! address and through an IPv6 Service; an app restart (new socket inode), a replaced node
//! pod and a deleted pod are followed; the `why` grant reaches no Envoy admin; a `helm rollback` either way across the hand-over costs one cold start; a second
//! release on the node changes nothing of the first; `helm upgrade` with other values runs (among them
//! `socketLimit=filesystem` and every bounded value at its schema edges); `helm uninstall`
//! leaves no release object and nothing of ours on the host; and `node.sh down` leaves the host as
//! it found it.
//!
//! Needs root (CI runs as root); without it the suite fails, naming the cause.
//!
//! The trials run one at a time in the order of `main`'s list, later ones on what earlier ones
//! left (the pods `web` and `mem`; uninstall and `node.sh down` last). Each lives in the module of
//! its theme: `install`, `delivery`, `observability`, `access`, `restarts`, `rollback`, `upgrade` and `teardown`, on the
//! shared environment of `env`.

#[path = "../suite.rs"]
mod suite;

mod access;
mod delivery;
mod env;
mod install;
mod observability;
mod restarts;
mod rollback;
mod teardown;
mod upgrade;

use std::time::Instant;

use aether_tests::node::{IpFamily, RealNode, Runtime, Shape, privileged_label_command, release_namespace_command};
use anyhow::Context;

use crate::env::{Env, NS};

// --- set-up ------------------------------------------------------------------------------------

fn setup() -> anyhow::Result<Env> {
    let t0 = Instant::now();
    // Dual-stack, IPv4 primary (docs/compatibility.md, "IP families"): every case runs with pods
    // holding both families; `make demo` and the two-node suite keep an IPv4-only node. containerd
    // 2.x, as everywhere, unless AETHER_RUNTIME=crio asks CRI-O (docs/compatibility.md,
    // "Container runtimes").
    let node = RealNode::up_with(Shape { family: IpFamily::Dual, runtime: Runtime::from_env()? })?;
    eprintln!("node up in {} s", t0.elapsed().as_secs());
    let env = Env { node, installed_at: Instant::now() };
    let crds = aether_tests::node::packaged_chart("aether-crds")?;
    env.node.helm(&["install", "aether-crds", crds.to_str().context("path")?, "--wait"])?;
    let t1 = Instant::now();
    // One namespace for everything (docs/install.md's alternative to the README's split): this
    // suite reads the node pods in NS.
    env.kube().ok(&release_namespace_command(NS))?;
    env.kube().ok(&privileged_label_command(NS))?;
    env.helm_aether("install", &[]).with_context(|| env::context(&env))?;
    eprintln!("helm install --wait in {} s", t1.elapsed().as_secs());
    Ok(Env { installed_at: Instant::now(), ..env })
}

fn main() {
    let mut cases = suite::cases![
        install::install_brings_every_release_pod_ready,
        install::installed_webhook_denies_an_over_budget_policy_with_the_arithmetic,
        install::helm_test_passes_and_fails_naming_the_webhook_when_its_service_is_broken,
        delivery::annotated_pod_is_served_over_the_kubelets_emptydir_socket,
        delivery::policy_switches_delivery_to_the_socket_and_delete_switches_back,
        observability::kubectl_aether_why_reads_the_node_agents_live_decision,
        access::the_why_grant_reaches_no_envoy_admin,
        delivery::a_client_pod_reaches_a_uds_only_app_through_its_service_ip,
        delivery::a_dual_stack_pod_is_served_over_its_socket_at_its_ipv6_address_and_service,
        delivery::a_pod_swapping_its_socket_for_a_link_never_gets_another_pods_traffic,
        delivery::memory_emptydir_socket_is_reached,
        delivery::a_grpc_server_on_its_socket_is_promoted_and_answers_a_grpc_client_through_its_service,
        observability::a_dotted_pod_name_keeps_envoys_metric_names,
        delivery::a_pod_back_on_its_socket_is_served_at_once,
        restarts::app_container_restart_recovers_without_an_agent_restart,
        install::release_containers_have_no_restarts_two_minutes_after_install,
        restarts::agent_restarts_under_load_fail_no_request,
        restarts::proxy_replacements_under_load_fail_no_request,
        restarts::a_changed_hand_over_dir_costs_one_cold_start_and_nothing_after,
        rollback::a_rollback_either_way_across_the_hand_over_costs_one_cold_start_and_nothing_after,
        rollback::a_second_release_on_the_node_changes_nothing_of_the_first,
        restarts::replaced_node_pod_resumes_delivery,
        delivery::deleted_pod_clusters_are_withdrawn,
        observability::prometheus_scrapes_the_node_and_every_rule_and_panel_has_series,
        upgrade::helm_upgrade_runs_every_chart_variant,
        upgrade::upgrade_with_a_broken_webhook_fails_through_the_startup_check,
        upgrade::socket_limit_filesystem_serves_a_path_past_sun_path_through_its_pin,
        upgrade::chart_values_at_their_edges_run_on_the_real_node,
        teardown::uninstall_leaves_no_release_object_and_nothing_on_the_host,
        teardown::node_down_restores_the_host,
    ];
    // `make soak` (--ignored): long, outside `make test`.
    cases.push(
        suite::case("a_quiet_soak_under_load_fails_no_request", restarts::a_quiet_soak_under_load_fails_no_request)
            .ignored(),
    );
    suite::run(cases, setup, env::context)
}
