//! Extraction of pod and policy records from API objects (docs/contracts.md, "Managed pods and
//! their annotations"): only managed pods, defaults, fallbacks for bad endpoint annotations, and
//! serde round trips for the state dir.

mod support;

use std::net::IpAddr;

use aether_agent_reconciler::record::{AppProtocol, HealthCheck, PortSpec};
use aether_agent_reconciler::{PodRecord, PolicyRecord, RecordError, Settings};
use k8s_openapi::api::core::v1::{PodIP, Volume};
use support::*;

fn ports(list: &[(u16, AppProtocol)]) -> Vec<PortSpec> {
    list.iter().map(|&(port, protocol)| PortSpec { port, protocol }).collect()
}

#[test]
fn unmanaged_pods_are_ignored_even_with_a_socket_annotation() {
    for label in [None, Some("false"), Some("True"), Some("")] {
        let unlabeled = api_pod("shop", "cart-1", UID, "cart").annotation_socket("sockets/a.sock").unmanaged();
        let api = match label {
            None => unlabeled.build(),
            Some(v) => unlabeled.label("aether.io/managed", v).build(),
        };
        assert_eq!(PodRecord::from_pod(&api), Ok(None), "label {label:?}");
    }
}

#[test]
fn a_succeeded_pod_gets_no_record_so_no_clusters() {
    let api = api_pod("shop", "job-1", UID, "cart").annotation_socket("sockets/a.sock").phase("Succeeded").build();
    assert_eq!(PodRecord::from_pod(&api), Ok(None));
}

#[test]
fn a_failed_pod_gets_no_record_so_no_clusters() {
    let api = api_pod("shop", "job-1", UID, "cart").annotation_socket("sockets/a.sock").phase("Failed").build();
    assert_eq!(PodRecord::from_pod(&api), Ok(None));
}

#[test]
fn a_finished_pod_gets_no_record_even_while_it_is_being_deleted() {
    for phase in ["Succeeded", "Failed"] {
        let api = api_pod("shop", "job-1", UID, "cart").phase(phase).deleting("2030-01-01T00:00:00Z").build();
        assert_eq!(PodRecord::from_pod(&api), Ok(None), "{phase}");
    }
}

#[test]
fn a_running_pod_with_a_deletion_timestamp_is_draining_and_keeps_its_record() {
    let running = api_pod("shop", "cart-1", UID, "cart").annotation_socket("sockets/a.sock").phase("Running");
    let draining = running.clone().deleting("2030-01-01T00:00:00Z").build();
    assert_eq!(record(&draining), record(&running.build()), "deletion alone changes nothing the fold sees");
}

#[test]
fn pods_in_a_live_or_unknown_phase_keep_their_record() {
    for phase in [None, Some("Pending"), Some("Running"), Some("Unknown")] {
        let p = api_pod("shop", "cart-1", UID, "cart");
        let api = match phase {
            None => p.build(),
            Some(phase) => p.phase(phase).build(),
        };
        assert!(matches!(PodRecord::from_pod(&api), Ok(Some(_))), "phase {phase:?}");
    }
}

#[test]
fn managed_pod_without_endpoint_annotations_gets_the_defaults() {
    let pod = pod("shop", "cart-1", UID, "cart");
    assert_eq!((pod.uid.as_str(), pod.namespace.as_str(), pod.name.as_str()), (UID, "shop", "cart-1"));
    assert_eq!(pod.service_account, "cart");
    assert_eq!(pod.ports, ports(&[(8080, AppProtocol::Http1)]));
    assert_eq!(pod.health, HealthCheck::Http { path: "/".to_owned() });
    assert_eq!(pod.uds_socket, None);
    assert_eq!(pod.pod_ips, vec!["10.0.0.7".parse::<IpAddr>().unwrap()]);
    assert_eq!(pod.empty_dirs.iter().collect::<Vec<_>>(), ["sockets"], "the configMap volume is not an emptyDir");
    assert_eq!(pod.static_pod, None);
    assert!(pod.defects.is_empty());
    assert_eq!(pod.service_key().to_string(), "shop/cart");
}

#[test]
fn empty_socket_annotation_counts_as_absent() {
    let pod = record(&api_pod("shop", "cart-1", UID, "cart").annotation_socket("").build());
    assert_eq!(pod.uds_socket, None);
}

#[test]
fn socket_annotation_is_kept_raw_for_the_fold_to_judge() {
    let pod = pod_with_socket("shop", "cart-1", UID, "cart", "../x ");
    assert_eq!(pod.uds_socket.as_deref(), Some("../x "));
    assert!(pod.defects.is_empty(), "the socket is not an endpoint-annotation defect");
}

#[test]
fn ports_annotation_declares_ports_with_protocols() {
    let pod = record(&api_pod("shop", "cart-1", UID, "cart").annotation_ports("8080,9090=h2").build());
    assert_eq!(pod.ports, ports(&[(8080, AppProtocol::Http1), (9090, AppProtocol::H2)]));
    assert_eq!(pod.primary_port().port, 8080);
    assert!(pod.defects.is_empty());
}

#[test]
fn port_annotation_declares_a_single_http1_port() {
    let pod = record(&api_pod("shop", "cart-1", UID, "cart").annotation_port("9000").build());
    assert_eq!(pod.ports, ports(&[(9000, AppProtocol::Http1)]));
}

#[test]
fn port_and_ports_together_must_agree() {
    let both = |port: &str| {
        record(&api_pod("shop", "cart-1", UID, "cart").annotation_ports("9090=h2,8080").annotation_port(port).build())
    };
    let agree = both("8080");
    assert_eq!(agree.ports, ports(&[(9090, AppProtocol::H2), (8080, AppProtocol::Http1)]));
    assert!(agree.defects.is_empty());
    let disagree = both("7000");
    assert_eq!(disagree.ports, ports(&[(8080, AppProtocol::Http1)]));
    assert_eq!(disagree.defects[0].annotation, "endpoint.aether.io/port");
}

#[test]
fn bad_port_annotations_keep_the_pod_with_default_port_and_a_defect() {
    for (key, value) in [
        ("endpoint.aether.io/port", "0"),
        ("endpoint.aether.io/port", "80x"),
        ("endpoint.aether.io/port", "70000"),
        ("endpoint.aether.io/ports", "8080,"),
        ("endpoint.aether.io/ports", "8080=thrift"),
        ("endpoint.aether.io/ports", "8080,8080=h2"),
    ] {
        let pod = record(&api_pod("shop", "cart-1", UID, "cart").annotation(key, value).build());
        assert_eq!(pod.ports, ports(&[(8080, AppProtocol::Http1)]), "{key}={value:?}");
        assert_eq!(pod.defects.len(), 1, "{key}={value:?}");
        assert_eq!(pod.defects[0].annotation, key);
        assert!(pod.defects[0].to_string().contains(value), "the defect quotes the value: {}", pod.defects[0]);
    }
}

#[test]
fn protocol_tcp_makes_the_health_check_connect_only() {
    let pod = record(&api_pod("shop", "cart-1", UID, "cart").annotation_protocol("tcp").build());
    assert_eq!(pod.health, HealthCheck::Connect);
}

#[test]
fn health_path_annotation_sets_the_http_check_path() {
    let pod = record(&api_pod("shop", "cart-1", UID, "cart").annotation_health_path("/healthz").build());
    assert_eq!(pod.health, HealthCheck::Http { path: "/healthz".to_owned() });
}

#[test]
fn bad_protocol_or_health_path_falls_back_to_an_http_check_on_slash_with_a_defect() {
    for (key, value) in [
        ("endpoint.aether.io/protocol", "TCP"),
        ("endpoint.aether.io/health-path", "healthz"),
        ("endpoint.aether.io/health-path", "/a\r\nb"),
    ] {
        let pod = record(&api_pod("shop", "cart-1", UID, "cart").annotation(key, value).build());
        assert_eq!(pod.health, HealthCheck::Http { path: "/".to_owned() }, "{key}={value:?}");
        assert_eq!(pod.defects[0].annotation, key);
    }
}

#[test]
fn pod_ips_come_from_pod_ips_then_pod_ip_and_skip_garbage() {
    let mut api = api_pod("shop", "cart-1", UID, "cart").build();
    let status = api.status.as_mut().unwrap();
    status.pod_ips =
        Some(vec![PodIP { ip: "10.0.0.7".into() }, PodIP { ip: "fd00::7".into() }, PodIP { ip: "x".into() }]);
    assert_eq!(record(&api).pod_ips.len(), 2);
    let status = api.status.as_mut().unwrap();
    status.pod_ips = None;
    status.pod_ip = Some("10.0.0.9".into());
    assert_eq!(record(&api).pod_ips, vec!["10.0.0.9".parse::<IpAddr>().unwrap()]);
    api.status = None;
    assert!(record(&api).pod_ips.is_empty(), "a pod without an IP yet is still recorded");
}

#[test]
fn only_emptydir_volumes_are_recorded() {
    let api =
        api_pod("shop", "cart-1", UID, "cart").volume(Volume { name: "bare".into(), ..Volume::default() }).build();
    assert_eq!(record(&api).empty_dirs.iter().collect::<Vec<_>>(), ["sockets"]);
}

#[test]
fn mirror_pod_records_its_hash_node_and_node_owner() {
    let pod = record(&api_pod("kube-system", "etcd-node-a", UID, "").mirror("abc", Some("node-a")).build());
    let s = pod.static_pod.expect("a mirror pod");
    assert_eq!(
        (s.config_hash.as_str(), s.node_name.as_deref(), s.owner_node.as_deref()),
        ("abc", Some("node-a"), Some("node-a"))
    );
    assert!(s.owned_by_its_node());
}

#[test]
fn mirror_annotation_counts_even_when_empty() {
    let pod = record(&api_pod("kube-system", "etcd-node-a", UID, "").mirror("", None).build());
    assert!(pod.static_pod.is_some());
}

#[test]
fn pod_without_uid_name_or_namespace_is_an_error() {
    let mut api = api_pod("shop", "cart-1", UID, "cart").build();
    api.metadata.uid = None;
    assert_eq!(PodRecord::from_pod(&api), Err(RecordError::Missing { kind: "Pod", field: "metadata.uid" }));
    let mut api = api_pod("shop", "cart-1", UID, "cart").build();
    api.metadata.namespace = Some(String::new());
    assert_eq!(PodRecord::from_pod(&api).unwrap_err().label(), "missing-field");
}

#[test]
fn names_that_could_hold_an_underscore_are_rejected() {
    let from = |namespace: &str, name: &str| PodRecord::from_pod(&api_pod(namespace, name, UID, "cart").build());
    let err = from("my_ns", "cart-1").unwrap_err();
    assert_eq!(err.label(), "invalid-name");
    assert!(from("shop", "cart_1").is_err());
    assert!(from("shop", &"a".repeat(254)).is_err());
    assert!(from(&"n".repeat(63), &"a".repeat(253)).is_ok());
}

#[test]
fn pod_record_survives_a_json_round_trip() {
    let api = api_pod("shop", "cart-1", UID, "cart")
        .annotation_ports("8080,9090=h2")
        .annotation_socket("sockets/a.sock")
        .mirror("abc", Some("node-a"));
    let pod = record(&api.build());
    let json = serde_json::to_string(&pod).unwrap();
    assert_eq!(serde_json::from_str::<PodRecord>(&json).unwrap(), pod);
    let bad = record(&api_pod("shop", "cart-1", UID, "cart").annotation_protocol("udp").build());
    assert_eq!(serde_json::from_str::<PodRecord>(&serde_json::to_string(&bad).unwrap()).unwrap(), bad);
}

#[test]
fn policy_record_is_valid_exactly_when_the_webhook_would_admit_it() {
    let settings = settings();
    let ok = policy("shop", "cart-uds", "cart", "sockets/app.sock");
    assert!(ok.is_valid());
    assert_eq!(ok.target.to_string(), "shop/cart");
    for (service, socket) in [("cart", "sockets/app1.sock"), ("cart", "../x"), ("1cart", "s/a")] {
        let api = aether_fixtures::policy("shop", "p").target(service).socket(socket).build();
        let record = PolicyRecord::from_policy(&api, &settings).unwrap();
        let webhook = aether_crds::review(&serde_json::to_value(&api).unwrap(), settings.budget().unwrap());
        assert_eq!(record.is_valid(), webhook.allowed(), "{service} {socket}");
        assert_eq!(record.invalid, webhook.message());
    }
}

#[test]
fn policy_record_survives_a_json_round_trip() {
    let p = policy("shop", "cart-uds", "cart", "sockets/app1.sock");
    let json = serde_json::to_string(&p).unwrap();
    assert_eq!(serde_json::from_str::<PolicyRecord>(&json).unwrap(), p);
}

#[test]
fn policy_without_namespace_is_an_error() {
    let mut api = aether_fixtures::policy("shop", "p").target("cart").socket("s/a").build();
    api.metadata.namespace = None;
    let err = PolicyRecord::from_policy(&api, &Settings::new("/var/lib/kubelet/pods", true)).unwrap_err();
    assert_eq!(err, RecordError::Missing { kind: "EndpointPolicy", field: "metadata.namespace" });
}
