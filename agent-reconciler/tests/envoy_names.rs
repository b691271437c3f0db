//! Envoy cluster names are unique across namespaces and stable, and never truncated
//! (docs/contracts.md, "Envoy resources and their names").

mod support;

use std::collections::HashSet;

use aether_agent_reconciler::names::{ClusterName, app_cluster, health_cluster, inbound_listener, stat_name};
use aether_agent_reconciler::record::is_dns1123_subdomain;
use aether_crds::udspath::is_dns1123_label;
use proptest::prelude::*;
use support::*;

#[test]
fn names_are_namespace_qualified() {
    assert_eq!(app_cluster("shop", "cart-7d9f", 8080), "app_shop_cart-7d9f_8080");
    assert_eq!(health_cluster("shop", "cart-7d9f"), "health_shop_cart-7d9f");
}

#[test]
fn stat_names_write_a_pod_names_dots_as_tildes_and_leave_other_names_alone() {
    assert_eq!(stat_name(&app_cluster("shop", "api.v2-7d9", 8080)), "app_shop_api~v2-7d9_8080");
    assert_eq!(stat_name(&inbound_listener("shop", "a.b.c", 9090)), "inbound_shop_a~b~c_9090");
    assert_eq!(stat_name(&health_cluster("shop", "cart-7d9f")), "health_shop_cart-7d9f");
    // One-to-one: two pods that differ only by a dot and a dash keep distinct stat names.
    assert_ne!(stat_name(&app_cluster("shop", "api.v2", 80)), stat_name(&app_cluster("shop", "api-v2", 80)));
}

#[test]
fn same_pod_name_in_two_namespaces_gives_distinct_names() {
    assert_ne!(app_cluster("shop", "web-0", 8080), app_cluster("bank", "web-0", 8080));
    assert_ne!(health_cluster("shop", "web-0"), health_cluster("bank", "web-0"));
}

#[test]
fn pod_names_differing_only_past_60_characters_give_distinct_untruncated_names() {
    let stem = "a".repeat(240);
    let (one, two) = (format!("{stem}-1"), format!("{stem}-2"));
    let ns = "n".repeat(63);
    let (a, b) = (app_cluster(&ns, &one, 65535), app_cluster(&ns, &two, 65535));
    assert_ne!(a, b);
    assert!(a.contains(&one), "the whole pod name is kept");
    assert_eq!(a.len(), "app_".len() + 63 + 1 + 242 + 1 + 5);
    assert_ne!(health_cluster(&ns, &one), health_cluster(&ns, &two));
}

#[test]
fn ten_thousand_pods_in_two_namespaces_get_unique_names() {
    let stem = "x".repeat(60);
    let mut names = HashSet::new();
    let mut count = 0;
    for ns in ["shop", "bank"] {
        for i in 0..5_000 {
            let pod = format!("{stem}{i}");
            for port in [8080, 9090] {
                names.insert(app_cluster(ns, &pod, port));
                count += 1;
            }
            names.insert(health_cluster(ns, &pod));
            count += 1;
        }
    }
    assert_eq!(count, 30_000);
    assert_eq!(names.len(), count, "every name is unique");
}

#[test]
fn names_do_not_depend_on_the_uid_so_they_survive_restarts_and_recreation() {
    let a = pod("shop", "web-0", &uid(1), "web");
    let b = pod("shop", "web-0", &uid(2), "web");
    assert_eq!(app_cluster(&a.namespace, &a.name, 8080), app_cluster(&b.namespace, &b.name, 8080));
}

#[test]
fn parse_rejects_names_that_are_not_ours() {
    for bad in [
        "app_shop_web_8080_x",
        "app_shop__8080",
        "app_shop_web_0",
        "app_shop_web_08080",
        "app_shop_web_65536",
        "eds_shop_web",
        "health_shop",
    ] {
        assert_eq!(ClusterName::parse(bad), None, "{bad:?}");
    }
}

fn namespace() -> impl Strategy<Value = String> {
    "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?".prop_filter("label", |s| is_dns1123_label(s))
}

fn pod_name() -> impl Strategy<Value = String> {
    prop::collection::vec("[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", 1..12)
        .prop_map(|parts| parts.join("."))
        .prop_filter("subdomain", |s| is_dns1123_subdomain(s))
}

proptest! {
    /// Injectivity: every name reads back to exactly the triple that made it, so two distinct
    /// triples can never share a name (the '_' separator is unambiguous for DNS-1123 parts).
    #[test]
    fn every_name_parses_back_to_its_parts(ns in namespace(), pod in pod_name(), port in 1..=65535u16) {
        prop_assert_eq!(ClusterName::parse(&app_cluster(&ns, &pod, port)), Some(ClusterName::App { namespace: ns.clone(), pod: pod.clone(), port }));
        prop_assert_eq!(ClusterName::parse(&health_cluster(&ns, &pod)), Some(ClusterName::Health { namespace: ns, pod }));
    }

    #[test]
    fn distinct_triples_give_distinct_names(a in (namespace(), pod_name(), 1..=65535u16), b in (namespace(), pod_name(), 1..=65535u16)) {
        prop_assert_eq!(app_cluster(&a.0, &a.1, a.2) == app_cluster(&b.0, &b.1, b.2), a == b);
        prop_assert_eq!(health_cluster(&a.0, &a.1) == health_cluster(&b.0, &b.1), (&a.0, &a.1) == (&b.0, &b.1));
    }
}
