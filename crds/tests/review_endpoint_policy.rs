//! `aether_crds::review` on whole EndpointPolicy objects, as the webhook, `aether-controller
//! validate` and the agent see them (targetRef, plus the socket budget and grammar through the
//! spec). Every denial names the wire field and the rule.

use aether_crds::{Budget, Verdict, review};
use serde_json::{Value, json};

fn budget() -> Budget {
    Budget::new("/var/lib/kubelet/pods").expect("the default pods dir has a budget")
}

/// A whole EndpointPolicy with the given spec.
fn policy(spec: Value) -> Value {
    json!({
        "apiVersion": "config.aether.io/v1",
        "kind": "EndpointPolicy",
        "metadata": { "name": "cart-uds", "namespace": "shop" },
        "spec": spec,
    })
}

fn target(target_ref: Value) -> Value {
    policy(json!({ "targetRef": target_ref, "udsSocket": "sockets/app.sock" }))
}

fn decide(object: &Value) -> Verdict {
    review(object, &budget())
}

/// Asserts a denial with exactly one violation on `field` whose message holds every needle.
fn assert_denied_on(object: &Value, field: &str, needles: &[&str]) {
    let verdict = decide(object);
    assert!(!verdict.allowed(), "{object} should be denied");
    let fields: Vec<&str> = verdict.violations.iter().map(|v| v.field.as_str()).collect();
    assert_eq!(fields, [field], "violations of {object}: {:?}", verdict.violations);
    let message = verdict.message().expect("a denial has a message");
    assert!(message.starts_with(field), "{message:?} should start with the field {field}");
    for needle in needles {
        assert!(message.contains(needle), "{message:?} should contain {needle:?}");
    }
}

// ---------------------------------------------------------------- accepted

#[test]
fn core_group_written_as_empty_string_is_accepted() {
    let verdict = decide(&target(json!({ "group": "", "kind": "Service", "name": "cart" })));
    assert!(verdict.allowed(), "{:?}", verdict.violations);
    assert_eq!(verdict.message(), None);
}

#[test]
fn core_group_written_as_core_is_accepted() {
    let verdict = decide(&target(json!({ "group": "core", "kind": "Service", "name": "cart" })));
    assert!(verdict.allowed(), "{:?}", verdict.violations);
}

#[test]
fn omitted_group_defaults_to_the_core_group() {
    let verdict = decide(&target(json!({ "kind": "Service", "name": "cart" })));
    assert!(verdict.allowed(), "{:?}", verdict.violations);
}

#[test]
fn status_written_by_the_controller_does_not_affect_the_decision() {
    let mut object = target(json!({ "kind": "Service", "name": "cart" }));
    object["status"] = json!({
        "observedGeneration": 3,
        "conditions": [{
            "type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"
        }]
    });
    assert!(decide(&object).allowed(), "{:?}", decide(&object).violations);
}

#[test]
fn value_that_fills_the_budget_exactly_is_accepted() {
    let object = policy(json!({ "targetRef": { "kind": "Service", "name": "cart" }, "udsSocket": "sockets/app.sock" }));
    assert!(decide(&object).allowed());
}

// ---------------------------------------------------------------- targetRef

#[test]
fn lowercase_service_kind_is_denied_naming_the_allowed_kind() {
    assert_denied_on(
        &target(json!({ "group": "", "kind": "service", "name": "cart" })),
        "spec.targetRef.kind",
        &["\"service\"", "not allowed", "\"Service\"", "case-sensitive"],
    );
}

#[test]
fn deployment_in_apps_group_is_denied_on_group_and_kind() {
    let verdict = decide(&target(json!({ "group": "apps", "kind": "Deployment", "name": "cart" })));
    let fields: Vec<&str> = verdict.violations.iter().map(|v| v.field.as_str()).collect();
    assert_eq!(fields, ["spec.targetRef.group", "spec.targetRef.kind"]);
    let message = verdict.message().unwrap();
    for needle in [
        "spec.targetRef.group \"apps\" is not allowed",
        "core group, written \"\" or \"core\"",
        "spec.targetRef.kind \"Deployment\" is not allowed",
        "kind \"Service\" only",
    ] {
        assert!(message.contains(needle), "{message:?} should contain {needle:?}");
    }
}

#[test]
fn other_group_spellings_of_core_are_denied() {
    for group in ["Core", "CORE", "v1", "core/v1", " ", "apps"] {
        assert_denied_on(
            &target(json!({ "group": group, "kind": "Service", "name": "cart" })),
            "spec.targetRef.group",
            &["\"\" or \"core\""],
        );
    }
}

#[test]
fn namespace_in_target_ref_is_denied_as_an_unknown_field() {
    assert_denied_on(
        &target(json!({ "kind": "Service", "name": "cart", "namespace": "payments" })),
        "spec.targetRef.namespace",
        &["unknown field", "allowed fields are group, kind, name", "own namespace"],
    );
}

#[test]
fn service_name_starting_with_a_digit_is_denied() {
    assert_denied_on(
        &target(json!({ "kind": "Service", "name": "1cart" })),
        "spec.targetRef.name",
        &["\"1cart\"", "DNS-1035 label", "starting with a letter"],
    );
}

#[test]
fn service_names_outside_dns1035_are_denied() {
    let long = "c".repeat(64);
    for name in ["", "Cart", "cart-", "-cart", "cart.shop", "cart_1", "cärt", long.as_str()] {
        assert_denied_on(&target(json!({ "kind": "Service", "name": name })), "spec.targetRef.name", &["DNS-1035"]);
    }
    let longest = "c".repeat(63);
    assert!(decide(&target(json!({ "kind": "Service", "name": longest }))).allowed());
}

#[test]
fn unknown_fields_in_spec_are_denied_naming_the_path() {
    let object = policy(json!({
        "targetRef": { "kind": "Service", "name": "cart", "port": 8080 },
        "udsSocket": "sockets/app.sock",
        "socket": "sockets/other.sock",
    }));
    let verdict = decide(&object);
    let fields: Vec<&str> = verdict.violations.iter().map(|v| v.field.as_str()).collect();
    assert_eq!(fields, ["spec.socket", "spec.targetRef.port"]);
    let message = verdict.message().unwrap();
    assert!(message.contains("spec.socket is an unknown field; allowed fields are targetRef, udsSocket"), "{message}");
    assert!(message.contains("spec.targetRef.port is an unknown field; allowed fields are group, kind, name"));
}

// ---------------------------------------------------------------- spec.udsSocket

#[test]
fn socket_of_17_bytes_is_denied_with_the_arithmetic_and_the_pods_dir() {
    assert_denied_on(
        &policy(json!({ "targetRef": { "kind": "Service", "name": "cart" }, "udsSocket": "sockets/app1.sock" })),
        "spec.udsSocket",
        &["\"sockets/app1.sock\"", "17 bytes", "budget is 16 bytes", "/var/lib/kubelet/pods"],
    );
}

#[test]
fn socket_budget_follows_the_configured_pods_dir() {
    let object = policy(json!({ "targetRef": { "kind": "Service", "name": "cart" }, "udsSocket": "sockets/app.sock" }));
    let k0s = Budget::new("/var/lib/k0s/kubelet/pods").unwrap();
    let verdict = review(&object, &k0s);
    assert_eq!(verdict.violations.len(), 1);
    let message = verdict.message().unwrap();
    assert!(message.contains("16 bytes; the budget is 12 bytes with pods dir /var/lib/k0s/kubelet/pods"), "{message}");
    assert!(review(&object, &Budget::new("/k").unwrap()).allowed());
}

#[test]
fn injection_values_in_the_spec_are_denied_naming_the_rule() {
    let table: &[(&str, &str)] = &[
        ("sockets/app.sock\n", "names file"),
        ("../app.sock", "names volume"),
        ("sockets/..", "names file"),
        ("./app.sock", "names volume"),
        ("sockets//app.sock", "exactly one '/'"),
        ("/sockets/app.sock", "exactly one '/'"),
        ("sockets/app.sock/", "exactly one '/'"),
        ("Sockets/app.sock", "DNS-1123 label"),
        ("sockets\\app.sock", "exactly one '/'"),
        ("%2e%2e/app.sock", "names volume"),
        ("sockets\u{FF0F}app.sock", "exactly one '/'"),
        ("sockets/app\0.sock", "names file"),
        ("sockets/app.sock ", "names file"),
        ("", "must not be empty"),
    ];
    for (value, rule) in table {
        let object = policy(json!({ "targetRef": { "kind": "Service", "name": "cart" }, "udsSocket": value }));
        assert_denied_on(&object, "spec.udsSocket", &[rule]);
    }
}

// ---------------------------------------------------------------- shape

#[test]
fn missing_spec_is_denied_naming_spec() {
    let object = json!({
        "apiVersion": "config.aether.io/v1",
        "kind": "EndpointPolicy",
        "metadata": { "name": "cart-uds" },
    });
    let verdict = decide(&object);
    assert_eq!(verdict.violations.len(), 1);
    assert_eq!(verdict.violations[0].field, "object");
    assert!(verdict.message().unwrap().contains("missing field `spec`"), "{:?}", verdict.message());
}

#[test]
fn missing_socket_is_denied_naming_the_field() {
    let verdict = decide(&policy(json!({ "targetRef": { "kind": "Service", "name": "cart" } })));
    assert_eq!(verdict.violations.len(), 1);
    assert_eq!(verdict.violations[0].field, "spec");
    assert!(verdict.message().unwrap().contains("missing field `udsSocket`"));
}

#[test]
fn missing_target_kind_is_denied_naming_the_field() {
    let verdict = decide(&target(json!({ "name": "cart" })));
    assert_eq!(verdict.violations.len(), 1);
    assert_eq!(verdict.violations[0].field, "spec.targetRef");
    assert!(verdict.message().unwrap().contains("missing field `kind`"));
}

#[test]
fn mistyped_fields_are_denied_naming_their_path() {
    let table: Vec<(Value, &str, &str)> = vec![
        (
            policy(json!({ "targetRef": { "kind": "Service", "name": "cart" }, "udsSocket": 5 })),
            "spec.udsSocket",
            "expected a string",
        ),
        (
            policy(json!({ "targetRef": { "kind": "Service", "name": ["cart"] }, "udsSocket": "sockets/app.sock" })),
            "spec.targetRef.name",
            "expected a string",
        ),
        (
            policy(json!({ "targetRef": "services/cart", "udsSocket": "sockets/app.sock" })),
            "spec.targetRef",
            "invalid type",
        ),
        (policy(json!("sockets/app.sock")), "spec", "invalid type"),
    ];
    for (object, field, needle) in table {
        let verdict = decide(&object);
        assert_eq!(verdict.violations.len(), 1, "{object}: {:?}", verdict.violations);
        assert_eq!(verdict.violations[0].field, field, "{object}");
        let message = verdict.message().unwrap();
        assert!(message.starts_with(&format!("{field} is malformed")), "{message}");
        assert!(message.contains(needle), "{message}");
    }
}

#[test]
fn null_object_is_denied_not_a_panic() {
    let verdict = decide(&Value::Null);
    assert!(!verdict.allowed());
    assert_eq!(verdict.violations[0].field, "object");
}

#[test]
fn several_violations_are_all_reported() {
    let object = policy(json!({
        "targetRef": { "group": "apps", "kind": "Deployment", "name": "1cart", "namespace": "payments" },
        "udsSocket": "sockets/app1.sock",
    }));
    let verdict = decide(&object);
    let fields: Vec<&str> = verdict.violations.iter().map(|v| v.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.targetRef.namespace",
            "spec.targetRef.group",
            "spec.targetRef.kind",
            "spec.targetRef.name",
            "spec.udsSocket"
        ]
    );
    let message = verdict.message().unwrap();
    assert_eq!(message.matches("; spec.").count(), 4, "violations are joined by \"; \": {message}");
    assert!(message.contains("17 bytes"));
}

#[test]
fn unknown_field_and_malformed_shape_are_both_reported() {
    let object =
        policy(json!({ "targetRef": { "kind": "Service", "name": "cart", "namespace": "x" }, "udsSocket": 5 }));
    let fields: Vec<String> = decide(&object).violations.into_iter().map(|v| v.field).collect();
    assert_eq!(fields, ["spec.targetRef.namespace", "spec.udsSocket"]);
}

#[test]
fn violation_display_is_field_then_rule() {
    let verdict = decide(&target(json!({ "kind": "service", "name": "cart" })));
    let v = &verdict.violations[0];
    assert_eq!(v.to_string(), format!("{} {}", v.field, v.message));
    assert_eq!(verdict.message().unwrap(), v.to_string());
}
