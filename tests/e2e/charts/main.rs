//! The Helm charts: `helm lint`, `helm template` over a matrix of values with assertions on the
//! rendered objects, the schema refusing bad values, the RBAC report against `docs/rbac.md`, the
//! per-version content digests, and the rendered chart applied to a real kube-apiserver with
//! `kubectl auth can-i` checks per ServiceAccount.
//!
//! Each test is a function of the module of its theme: `render` (the rendered objects against the
//! values), `metrics` (the monitoring objects), `schema` (`values.schema.json`), `install_check`
//! (the startup check Job and the `helm test` Pod), `docs` (docs/rbac.md and the README),
//! `digests` (the per-version content digests) and `cluster` (against a real kube-apiserver), with
//! the `helm template` helpers of `template`.

mod cluster;
mod digests;
mod docs;
mod install_check;
mod metrics;
mod render;
mod schema;
mod template;

/// The suite's tests: `tests![module::name, ...]` makes each listed function a `#[test]` named
/// `name`, at the top of the crate, so a test keeps the name it had before it moved into a module
/// (`cargo test -p aether-tests --test e2e_charts -- --exact <name>`). A test function left out of
/// the list is dead code, which `make lint` refuses.
macro_rules! tests {
    ($($module:ident :: $name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $module::$name()
            }
        )*
    };
}

tests![
    render::the_node_pod_runs_as_spc_t_unless_selinux_labelling_is_turned_off,
    render::helm_lint_passes_for_both_charts,
    render::rendered_objects_follow_the_values_matrix,
    render::the_test_envoy_runs_the_charts_bootstrap_and_flags,
    render::aggregation_labels_follow_the_value,
    render::the_hand_over_switches_off,
    render::values_that_would_separate_agent_and_proxy_fail_naming_the_value,
    render::socket_limit_reaches_both_binaries_and_filesystem_needs_pinning,
    render::the_crd_chart_renders_the_generated_crd_for_each_socket_limit,
    render::default_images_are_tagged_with_the_binaries_version,
    render::the_launcher_image_follows_the_agents_unless_pinned,
    render::pdb_is_rendered_only_when_a_replica_can_be_evicted,
    render::node_pods_are_node_critical_with_a_quota_scoped_to_that_class,
    render::host_network_webhook_needs_a_port_other_than_the_kubelets,
    render::controller_network_policy_opens_only_the_webhook_and_admin_ports,
    render::the_node_side_can_live_in_its_own_privileged_namespace,
    render::every_pod_selects_linux_nodes_under_the_users_selector,
    metrics::monitors_are_rendered_only_when_enabled_and_scrape_the_admin_ports,
    metrics::the_dashboard_configmap_carries_the_dashboard_for_grafanas_sidecar,
    schema::schema_refuses_bad_values,
    schema::schema_max_body_bytes_bounds_are_the_binarys,
    schema::every_bounded_integer_value_renders_at_its_edges_and_is_refused_past_them,
    schema::schema_max_mount_path_is_the_longest_pods_dir_with_a_budget,
    docs::rbac_doc_equals_the_report,
    docs::readme_installs_the_node_side_in_its_own_namespace_as_the_two_node_suite_does,
    digests::chart_content_changes_bump_the_version,
    install_check::verify_install_hooks_run_after_the_cert_job_with_the_controllers_budget_and_the_agents_selector,
    install_check::verify_install_rbac_is_minimal_and_each_runner_can_be_turned_off,
    install_check::schema_refuses_bad_verify_install_values,
    cluster::notes_show_the_budget_the_contract_crate_computes,
    cluster::notes_show_the_replica_count,
    cluster::rendered_chart_is_accepted_by_a_real_api_server_and_rbac_is_least_privilege,
    cluster::a_second_release_fails_naming_the_first,
];
