//! The CRD's OpenAPI schema rejects bad shapes even when the webhook is not registered, so its
//! patterns, lengths and enums must agree with the Rust rules exactly: the schema may never
//! admit a value the agent would reject for its shape, nor reject one it would accept.
//! (The sun_path budget depends on configuration, so only the webhook enforces it; the schema
//! holds the widest budget any configuration can give.)

use std::sync::LazyLock;

use aether_crds::policy::{DNS1035_LABEL_PATTERN, SOCKET_PATTERN};
use aether_crds::udspath::{self, WIDEST_BUDGET};
use aether_crds::{EndpointPolicy, validate};
use kube::CustomResourceExt;
use proptest::prelude::*;
use regex::Regex;
use serde_json::{Value, json};

/// The generated CRD as JSON.
static CRD: LazyLock<Value> =
    LazyLock::new(|| serde_json::to_value(EndpointPolicy::crd()).expect("the CRD serializes to JSON"));

fn spec_schema() -> &'static Value {
    let versions = CRD["spec"]["versions"].as_array().expect("versions");
    assert_eq!(versions.len(), 1, "one served version");
    &versions[0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
}

fn socket_schema() -> &'static Value {
    &spec_schema()["properties"]["udsSocket"]
}

fn target_ref_schema() -> &'static Value {
    &spec_schema()["properties"]["targetRef"]
}

fn name_schema() -> &'static Value {
    &target_ref_schema()["properties"]["name"]
}

/// The regex inside the field's CEL rule `self.matches(r'<regex>')` (the CRD states shape
/// rules in CEL so that the API server prints our message, not the bare regex).
fn rule_pattern(schema: &Value) -> &str {
    let rules = schema["x-kubernetes-validations"].as_array().expect("the field has CEL rules");
    assert_eq!(rules.len(), 1, "one rule: {rules:?}");
    assert!(rules[0]["message"].as_str().is_some_and(|m| !m.is_empty()), "the rule has a message");
    let rule = rules[0]["rule"].as_str().expect("rule text");
    rule.strip_prefix("self.matches(r'").and_then(|r| r.strip_suffix("')")).expect("rule is self.matches(r'...')")
}

/// Compiles a rule's regex the way kube-apiserver's CEL `matches` would (RE2 syntax; unanchored
/// unless the pattern anchors itself; `$` only at the end of the text).
fn compile(schema: &Value) -> Regex {
    assert!(schema.get("pattern").is_none(), "a `pattern` would duplicate the CEL rule with a worse message");
    Regex::new(rule_pattern(schema)).expect("the pattern compiles as RE2")
}

static SOCKET_RE: LazyLock<Regex> = LazyLock::new(|| compile(socket_schema()));
static NAME_RE: LazyLock<Regex> = LazyLock::new(|| compile(name_schema()));

fn usize_of(schema: &Value, key: &str) -> usize {
    usize::try_from(schema[key].as_u64().unwrap_or_else(|| panic!("{key} in {schema}"))).unwrap()
}

/// Whether the schema (pattern and length bounds, counted in characters as the API server does)
/// accepts `s`.
fn schema_accepts(schema: &Value, re: &Regex, s: &str) -> bool {
    let chars = s.chars().count();
    re.is_match(s) && chars >= usize_of(schema, "minLength") && chars <= usize_of(schema, "maxLength")
}

// ---------------------------------------------------------------- the schema's fixed facts

#[test]
fn socket_max_length_is_the_widest_budget() {
    assert_eq!(usize_of(socket_schema(), "maxLength"), WIDEST_BUDGET);
    assert_eq!(usize_of(socket_schema(), "minLength"), udspath::MIN_VALUE_BYTES);
    assert_eq!(socket_schema()["type"], "string");
}

#[test]
fn service_name_length_is_that_of_a_dns1035_label() {
    assert_eq!(usize_of(name_schema(), "minLength"), 1);
    assert_eq!(usize_of(name_schema(), "maxLength"), 63);
}

#[test]
fn schema_patterns_are_the_published_constants() {
    assert_eq!(rule_pattern(socket_schema()), SOCKET_PATTERN);
    assert_eq!(rule_pattern(name_schema()), DNS1035_LABEL_PATTERN);
}

#[test]
fn group_enum_is_exactly_empty_and_core() {
    let group = &target_ref_schema()["properties"]["group"];
    assert_eq!(group["enum"], json!(["", "core"]));
    assert_eq!(group["default"], json!(""));
}

#[test]
fn kind_enum_is_exactly_service() {
    assert_eq!(target_ref_schema()["properties"]["kind"]["enum"], json!(["Service"]));
}

#[test]
fn target_ref_has_no_namespace_and_keeps_no_unknown_fields() {
    let properties = target_ref_schema()["properties"].as_object().expect("targetRef properties");
    let mut names: Vec<&str> = properties.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(names, ["group", "kind", "name"]);
    assert_eq!(target_ref_schema()["required"], json!(["kind", "name"]));
    assert_eq!(spec_schema()["required"], json!(["targetRef", "udsSocket"]));
    // Without preserve-unknown-fields the API server prunes (or, strictly, rejects) a namespace.
    let text = CRD.to_string();
    assert!(!text.contains("x-kubernetes-preserve-unknown-fields"), "{text}");
}

#[test]
fn crd_yaml_is_the_generated_crd() {
    let parsed: Value = yaml_serde::from_str(&aether_crds::crd_yaml()).expect("crd_yaml() is YAML");
    assert_eq!(parsed, *CRD);
}

#[test]
fn schema_rejects_every_field_report_injection_value() {
    for value in [
        "sockets/app.sock\n",
        "../app.sock",
        "sockets/..",
        "sockets/.",
        "./app.sock",
        "sockets//app.sock",
        "/sockets/app.sock",
        "sockets/app.sock/",
        "Sockets/app.sock",
        "sockets\\app.sock",
        "%2e%2e/app.sock",
        "sockets\u{FF0F}app.sock",
        "sockets/app\0.sock",
        "sockets/app.sock ",
    ] {
        assert!(!schema_accepts(socket_schema(), &SOCKET_RE, value), "schema accepts {value:?}");
        assert!(udspath::parse(value).is_err(), "grammar accepts {value:?}");
    }
}

#[test]
fn schema_and_grammar_agree_on_dot_files() {
    for (value, ok) in [
        ("s/.", false),
        ("s/..", false),
        ("s/.x", true),
        ("s/..x", true),
        ("s/...", true),
        ("s/.-", true),
        ("s/x.", true),
        ("s/._", true),
    ] {
        assert_eq!(SOCKET_RE.is_match(value), ok, "pattern on {value:?}");
        assert_eq!(udspath::parse(value).is_ok(), ok, "grammar on {value:?}");
    }
}

// ---------------------------------------------------------------- properties

/// Arbitrary strings, biased toward the alphabet of the grammar `[a-zA-Z0-9./_-]`.
fn socket_candidate() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-zA-Z0-9./_-]{0,40}",
        3 => "[a-z0-9.-]{0,8}/[a-zA-Z0-9._-]{0,8}",
        2 => "[a-z0-9-]{0,3}/\\.{0,3}[a-zA-Z0-9._-]{0,2}",
        1 => "[a-z0-9-]{60,66}/[a-z.]{1,3}",
        1 => "[a-z0-9]{1,10}/[a-z.]{20,30}",
        1 => "[a-z0-9./\\\\ \\x00\n\r\u{FF0F}\u{212A}\u{17F}-]{0,16}",
        1 => any::<String>(),
    ]
}

fn name_candidate() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z0-9-]{0,66}",
        2 => "[a-zA-Z0-9./_-]{0,12}",
        1 => "[a-z][a-z0-9-]{0,8}[\n\\x00 \u{212A}\u{17F}]?",
        1 => any::<String>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn socket_schema_accepts_exactly_what_fits_the_widest_budget(s in socket_candidate()) {
        let rust = udspath::parse(&s).is_ok() && s.len() <= WIDEST_BUDGET;
        prop_assert_eq!(schema_accepts(socket_schema(), &SOCKET_RE, &s), rust, "{:?}", s);
    }

    #[test]
    fn socket_pattern_matches_exactly_the_grammar(s in socket_candidate()) {
        // The pattern alone does not bound the volume to 63 bytes; below 66 bytes no value
        // can hold a longer volume, and above the schema's maxLength rejects it anyway.
        prop_assume!(s.len() < udspath::VOLUME_NAME_MAX + 3);
        prop_assert_eq!(SOCKET_RE.is_match(&s), udspath::parse(&s).is_ok(), "{:?}", s);
    }

    #[test]
    fn name_schema_accepts_exactly_dns1035_labels(s in name_candidate()) {
        prop_assert_eq!(schema_accepts(name_schema(), &NAME_RE, &s), validate::is_dns1035_label(&s), "{:?}", s);
        if s.len() <= 63 {
            prop_assert_eq!(NAME_RE.is_match(&s), validate::is_dns1035_label(&s), "{:?}", s);
        }
    }
}
