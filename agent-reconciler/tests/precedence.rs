//! The precedence fold, rule by rule (docs/contracts.md, "Precedence: which delivery a pod gets"
//! and "The socket value"). Each test is named as the claim it checks.

mod support;

use aether_agent_reconciler::fold::{deliver, select_policy};
use aether_agent_reconciler::{Delivery, Index, PodRecord, PolicyRecord, Settings, Source, TcpReason};
use aether_crds::udspath::SUN_PATH_MAX;
use support::*;

/// The delivery of one pod given every policy on the node (the index picks the winner).
fn fold_with(settings: &Settings, pod: &PodRecord, policies: &[PolicyRecord]) -> Delivery {
    let key = pod.service_key();
    deliver(pod, select_policy(policies.iter().filter(|p| p.target == key)), settings)
}

fn fold(pod: &PodRecord, policies: &[PolicyRecord]) -> Delivery {
    fold_with(&settings(), pod, policies)
}

fn path_for(uid: &str, value: &str) -> String {
    format!("/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/{value}")
}

// ------------------------------------------------------------------- annotation over policy

#[test]
fn annotation_wins_over_the_policy() {
    let pod = pod_with_socket("shop", "cart-1", UID, "cart", "sockets/a.sock");
    let d = fold(&pod, &[policy("shop", "cart-uds", "cart", "sockets/p.sock")]);
    assert_eq!(d.source, Source::Annotation);
    assert_eq!(d.socket.as_deref(), Some("sockets/a.sock"));
    assert_eq!(d.policy, None);
    assert_eq!(d.path.unwrap().as_str(), path_for(UID, "sockets/a.sock"));
}

#[test]
fn invalid_annotation_never_falls_back_to_the_policy() {
    let valid_policy = policy("shop", "cart-uds", "cart", "sockets/p.sock");
    assert!(valid_policy.is_valid());
    // Values that try to leave the volume or slip past the grammar (traversal, look-alikes,
    // escapes, NUL, whitespace), plus a value over budget: each is TCP with its reason, never the
    // policy.
    let cases = [
        ("sockets/app.sock\n", TcpReason::InvalidAnnotation),
        ("../app.sock", TcpReason::InvalidAnnotation),
        ("sockets/..", TcpReason::InvalidAnnotation),
        ("./app.sock", TcpReason::InvalidAnnotation),
        ("sockets//app.sock", TcpReason::InvalidAnnotation),
        ("/sockets/app.sock", TcpReason::InvalidAnnotation),
        ("sockets/app.sock/", TcpReason::InvalidAnnotation),
        ("Sockets/app.sock", TcpReason::InvalidAnnotation),
        ("sockets\\app.sock", TcpReason::InvalidAnnotation),
        ("%2e%2e/app.sock", TcpReason::InvalidAnnotation),
        ("sockets／app.sock", TcpReason::InvalidAnnotation),
        ("sockets/app\0.sock", TcpReason::InvalidAnnotation),
        ("sockets/app.sock ", TcpReason::InvalidAnnotation),
        (" ", TcpReason::InvalidAnnotation),
        ("sockets/app1.sock", TcpReason::PathTooLong),
    ];
    for (value, reason) in cases {
        let pod = pod_with_socket("shop", "cart-1", UID, "cart", value);
        let d = fold(&pod, std::slice::from_ref(&valid_policy));
        assert_eq!(d.source, Source::Tcp(reason), "{value:?}: {}", d.reason);
        assert_eq!(d.socket.as_deref(), Some(value), "the rejected value is reported");
        assert_eq!(d.policy, None, "{value:?} must not use the policy");
        assert!(d.path.is_none());
        assert!(
            d.reason.contains("takes precedence"),
            "{value:?}: the reason says the policy is shadowed: {}",
            d.reason
        );
    }
}

#[test]
fn pod_without_annotation_uses_the_policy_of_its_service() {
    let pod = pod("shop", "cart-1", UID, "cart");
    let d = fold(&pod, &[policy("shop", "cart-uds", "cart", "sockets/p.sock")]);
    assert_eq!(d.source, Source::Policy);
    assert_eq!(d.policy.as_deref(), Some("cart-uds"));
    assert_eq!(d.path.unwrap().as_str(), path_for(UID, "sockets/p.sock"));
}

#[test]
fn pod_without_annotation_or_policy_is_tcp_no_socket_declared() {
    let d = fold(&pod("shop", "cart-1", UID, "cart"), &[]);
    assert_eq!(d.source, Source::NoSocketDeclared);
    assert_eq!(d.source.label(), "no-socket-declared");
    assert_eq!((d.socket, d.policy, d.path), (None, None, None));
}

#[test]
fn policy_of_another_service_or_namespace_does_not_apply() {
    let pod = pod("shop", "cart-1", UID, "cart");
    let other_service = policy("shop", "a", "checkout", "sockets/p.sock");
    let other_namespace = policy("billing", "a", "cart", "sockets/p.sock");
    let mut index = Index::new(settings());
    index.apply_policy(other_service);
    index.apply_policy(other_namespace);
    index.apply_pod(pod.clone());
    let d = index.snapshot().get(&pod.key()).unwrap().delivery.clone();
    assert_eq!(d.source, Source::NoSocketDeclared);
}

#[test]
fn pods_are_matched_by_service_account_which_defaults_to_default() {
    let mut api = api_pod("shop", "cart-1", UID, "").build();
    api.spec.as_mut().unwrap().service_account_name = None;
    let pod = record(&api);
    assert_eq!(pod.service_account, "default");
    let d = fold(&pod, &[policy("shop", "p", "default", "sockets/p.sock")]);
    assert_eq!(d.source, Source::Policy);
}

// ------------------------------------------------------------------------------- tie-break

#[test]
fn among_valid_policies_the_smallest_name_wins() {
    let pod = pod("shop", "cart-1", UID, "cart");
    let policies = [
        policy("shop", "cart-b", "cart", "sockets/b.sock"),
        policy("shop", "cart-a", "cart", "sockets/a.sock"),
        policy("shop", "cart-c", "cart", "sockets/c.sock"),
    ];
    let d = fold(&pod, &policies);
    assert_eq!(d.policy.as_deref(), Some("cart-a"));
    assert_eq!(d.socket.as_deref(), Some("sockets/a.sock"));
}

#[test]
fn tie_break_compares_bytes_not_case_folded_or_numeric() {
    let pod = pod("shop", "cart-1", UID, "cart");
    // Byte order: "a-10" < "a-9" and "Z..." would precede "a..." (names are lowercase anyway).
    let d = fold(
        &pod,
        &[policy("shop", "a-9", "cart", "sockets/9.sock"), policy("shop", "a-10", "cart", "sockets/10.sock")],
    );
    assert_eq!(d.policy.as_deref(), Some("a-10"));
}

#[test]
fn invalid_policy_never_wins_even_with_the_smallest_name() {
    let pod = pod("shop", "cart-1", UID, "cart");
    let invalid = policy("shop", "aaa", "cart", "sockets/app1.sock"); // 17 bytes > 16
    assert!(!invalid.is_valid());
    let valid = policy("shop", "zzz", "cart", "sockets/z.sock");
    let d = fold(&pod, &[invalid.clone(), valid]);
    assert_eq!(d.policy.as_deref(), Some("zzz"));
    // Alone, an invalid policy is as good as none.
    let d = fold(&pod, &[invalid]);
    assert_eq!(d.source, Source::NoSocketDeclared);
}

#[test]
fn policy_targeting_a_non_service_kind_is_invalid() {
    let api = aether_fixtures::policy("shop", "p").target("cart").socket("sockets/p.sock").target_kind("Deployment");
    let record = PolicyRecord::from_policy(&api.build(), &settings()).unwrap();
    assert!(!record.is_valid());
    assert!(record.invalid.unwrap().contains("spec.targetRef.kind"));
}

#[test]
fn a_hand_made_cross_namespace_policy_record_never_applies() {
    let mut p = policy("evil", "p", "cart", "sockets/p.sock");
    p.target.namespace = "shop".to_owned();
    assert!(!p.is_valid());
    let d = deliver(&pod("shop", "cart-1", UID, "cart"), Some(&p), &settings());
    assert_eq!(d.source, Source::NoSocketDeclared);
}

// ---------------------------------------------------------------------- volume must be emptyDir

#[test]
fn policy_naming_a_volume_the_pod_lacks_is_tcp_naming_the_volume() {
    let pod = pod("shop", "cart-1", UID, "cart");
    let d = fold(&pod, &[policy("shop", "cart-uds", "cart", "sock/app.sock")]);
    assert_eq!(d.source, Source::Tcp(TcpReason::VolumeNotEmptyDir));
    assert_eq!(d.source.label(), "volume-not-emptydir");
    assert_eq!(d.policy.as_deref(), Some("cart-uds"), "the reason names the drifted policy");
    assert!(d.reason.contains("\"sock\""), "the reason names the volume: {}", d.reason);
}

#[test]
fn socket_in_a_configmap_volume_is_tcp_volume_not_emptydir() {
    let pod = pod_with_socket("shop", "cart-1", UID, "cart", "config/app.sock");
    let d = fold(&pod, &[]);
    assert_eq!(d.source, Source::Tcp(TcpReason::VolumeNotEmptyDir));
    assert!(d.reason.contains("\"config\""));
}

// ------------------------------------ budget (sun_path's 107 bytes; a pods dir without budget)

#[test]
fn socket_of_16_bytes_pipes_at_exactly_107_bytes() {
    let d = fold(&pod_with_socket("shop", "cart-1", UID, "cart", "sockets/app.sock"), &[]);
    assert_eq!(d.source, Source::Annotation);
    assert_eq!(d.path.unwrap().as_str().len(), SUN_PATH_MAX);
}

#[test]
fn socket_of_17_bytes_with_the_default_pods_dir_is_tcp_path_too_long() {
    let d = fold(&pod_with_socket("shop", "cart-1", UID, "cart", "sockets/app1.sock"), &[]);
    assert_eq!(d.source, Source::Tcp(TcpReason::PathTooLong));
    assert_eq!(d.source.label(), "path-too-long");
    assert!(d.reason.contains("17 bytes") && d.reason.contains("16"), "{}", d.reason);
}

#[test]
fn a_policy_admitted_under_a_wider_budget_is_rechecked_by_the_agent() {
    // Admitted where the pods dir is "/k" (budget 35), replayed on a node with the default one.
    let wide = Settings::new("/k", true);
    let p = policy_in(&wide, "shop", "p", "cart", "sockets/application.sock");
    assert!(p.is_valid());
    let d = deliver(&pod("shop", "cart-1", UID, "cart"), Some(&p), &settings());
    assert_eq!(d.source, Source::Tcp(TcpReason::PathTooLong));
    // And it pipes where the budget allows it.
    let d = deliver(&pod("shop", "cart-1", UID, "cart"), Some(&p), &wide);
    assert_eq!(d.source, Source::Policy);
    assert!(d.path.unwrap().as_str().starts_with("/k/"));
}

#[test]
fn a_pods_dir_without_budget_makes_every_pod_tcp_budget_config() {
    let settings = Settings::new("/var/snap/microk8s/common/var/lib/kubelet/pods", true);
    assert!(settings.budget().is_err());
    let p = policy_in(&settings, "shop", "p", "cart", "s/a");
    assert!(!p.is_valid(), "no policy is usable without a budget");
    for pod in [pod_with_socket("shop", "cart-1", UID, "cart", "s/a"), pod("shop", "cart-2", &uid(2), "cart")] {
        let d = deliver(&pod, Some(&p), &settings);
        assert_eq!(d.source, Source::Tcp(TcpReason::BudgetConfig));
        assert!(d.reason.contains("budget"), "{}", d.reason);
    }
}

#[test]
fn uds_disabled_makes_every_pod_tcp() {
    let settings = Settings::new("/var/lib/kubelet/pods", false);
    let p = policy_in(&settings, "shop", "p", "cart", "sockets/p.sock");
    for pod in
        [pod_with_socket("shop", "cart-1", UID, "cart", "sockets/a.sock"), pod("shop", "cart-2", &uid(2), "cart")]
    {
        let d = deliver(&pod, Some(&p), &settings);
        assert_eq!(d.source, Source::Tcp(TcpReason::UdsDisabled));
        assert_eq!(d.source.label(), "uds-disabled");
    }
}

// ---------------------------------------------------------------- endpoint annotation defects

#[test]
fn bad_port_annotation_keeps_the_pod_on_tcp_with_the_defaults() {
    let api = api_pod("shop", "cart-1", UID, "cart").annotation_ports("8080,http").annotation_socket("sockets/a.sock");
    let pod = record(&api.build());
    assert_eq!(pod.ports.len(), 1);
    assert_eq!(pod.ports[0].port, 8080);
    let d = fold(&pod, &[]);
    assert_eq!(d.source, Source::Tcp(TcpReason::InvalidEndpointAnnotation));
    assert!(d.reason.contains("endpoint.aether.io/ports"), "{}", d.reason);
}

// --------------------------------------------------------------------------------- pod dir

#[test]
fn pod_uid_that_is_not_a_canonical_uuid_is_tcp_bad_pod_uid() {
    for bad in ["0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0", "../../etc", "0123456789abcdef0123456789abcdef"] {
        let mut pod = pod_with_socket("shop", "cart-1", UID, "cart", "sockets/a.sock");
        pod.uid = bad.to_owned();
        let d = fold(&pod, &[]);
        assert_eq!(d.source, Source::Tcp(TcpReason::BadPodUid), "{bad:?}");
    }
}

#[test]
fn placeholder_uid_of_an_offline_plan_is_used_and_said() {
    let pod = pod_with_socket("shop", "cart-1", "00000000-0000-0000-0000-000000000000", "cart", "sockets/a.sock");
    let d = fold(&pod, &[]);
    assert_eq!(d.source, Source::Annotation);
    assert!(d.reason.contains("placeholder UID"), "{}", d.reason);
}

// ----------------------------------------------------------------------------- static pods

const HASH: &str = "6d1c4e7b2f0a9e8d7c6b5a4f3e2d1c0b";

#[test]
fn mirror_pod_is_tcp_even_when_owned_by_its_node_because_the_hash_can_be_forged() {
    let api = api_pod("kube-system", "proxy-node-a", UID, "default").annotation_socket("sockets/a.sock");
    let pod = record(&api.mirror(HASH, Some("node-a")).build());
    let d = fold(&pod, &[]);
    assert_eq!(d.source, Source::Tcp(TcpReason::StaticPod), "{}", d.reason);
    assert!(d.path.is_none());
    assert!(d.reason.contains("forge"), "{}", d.reason);
}

#[test]
fn mirror_pod_not_owned_by_its_node_is_tcp_static_pod() {
    let api = api_pod("kube-system", "proxy-node-a", UID, "default").annotation_socket("sockets/a.sock");
    for owner in [None, Some("node-b")] {
        let d = fold(&record(&api.clone().mirror(HASH, owner).build()), &[]);
        assert_eq!(d.source, Source::Tcp(TcpReason::StaticPod), "owner {owner:?}");
        assert_eq!(d.source.label(), "static-pod");
    }
}

#[test]
fn mirror_hash_that_is_not_32_lowercase_hex_is_tcp_static_pod() {
    let bad = [
        "",
        "6D1C4E7B2F0A9E8D7C6B5A4F3E2D1C0B",
        "6d1c4e7b2f0a9e8d7c6b5a4f3e2d1c0",
        UID,
        "../../../../var/run/x",
        "6d1c4e7b2f0a9e8d7c6b5a4f3e2d1c0g",
    ];
    for hash in bad {
        let api = api_pod("kube-system", "proxy-node-a", UID, "default").annotation_socket("sockets/a.sock");
        let d = fold(&record(&api.mirror(hash, Some("node-a")).build()), &[]);
        assert_eq!(d.source, Source::Tcp(TcpReason::StaticPod), "hash {hash:?}");
    }
}

#[test]
fn mirror_pod_without_a_declared_socket_is_plain_tcp() {
    let pod = record(&api_pod("kube-system", "etcd-node-a", UID, "default").mirror("bad", None).build());
    assert_eq!(fold(&pod, &[]).source, Source::NoSocketDeclared);
}

// -------------------------------------------------------------------------------- invariants

#[test]
fn path_is_set_exactly_for_pipe_sources() {
    let pods = [
        pod_with_socket("shop", "a", UID, "cart", "sockets/a.sock"),
        pod_with_socket("shop", "b", UID, "cart", "nope/a.sock"),
        pod("shop", "c", UID, "cart"),
        pod("shop", "d", UID, "other"),
    ];
    let policies = [policy("shop", "p", "cart", "sockets/p.sock")];
    for pod in &pods {
        let d = fold(pod, &policies);
        assert_eq!(d.is_pipe(), matches!(d.source, Source::Annotation | Source::Policy), "{d:?}");
        assert_eq!(d.tcp_reason().is_some(), !d.is_pipe() && d.source != Source::NoSocketDeclared);
    }
}
