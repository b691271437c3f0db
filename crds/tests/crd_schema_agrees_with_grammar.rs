//! The CRD's OpenAPI schema rejects bad shapes even when the webhook is not registered, so its
//! CEL rules must agree with the Rust rules exactly: the schema may never admit a value the agent
//! would reject for its shape, nor reject one it would accept. Every shape rule is a CEL rule (no
//! `enum`, `maxLength`, `minLength` or `pattern`: those stop the API server's CEL rules and add a
//! "some validation rules were not checked" line, see `aether_crds::policy`), and these tests read
//! the rules' text: a length bound, and the regex of `self.matches(r'<regex>')`.
//! (The sun_path budget depends on configuration, so only the webhook enforces it; the schema
//! holds the widest budget any configuration can give.)

use std::sync::LazyLock;

use aether_crds::policy::{
    DNS1035_LABEL_PATTERN, GROUP_MESSAGE, GROUP_RULE, KIND_MESSAGE, KIND_RULE, SOCKET_PATTERN, socket_length_rule,
};
use aether_crds::udspath::{self, FILESYSTEM_VALUE_MAX, SocketLimit, WIDEST_BUDGET};
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

/// The field's CEL rules as (rule, message); every rule has a message.
fn rules(schema: &Value) -> Vec<(&str, &str)> {
    let rules = schema["x-kubernetes-validations"].as_array().expect("the field has CEL rules");
    rules
        .iter()
        .map(|r| {
            let message = r["message"].as_str().filter(|m| !m.is_empty()).expect("the rule has a message");
            (r["rule"].as_str().expect("rule text"), message)
        })
        .collect()
}

/// The regex inside `<prefix>self.matches(r'<regex>')`.
fn matches_regex<'a>(rule: &'a str, prefix: &str) -> &'a str {
    rule.strip_prefix(prefix)
        .and_then(|r| r.strip_prefix("self.matches(r'"))
        .and_then(|r| r.strip_suffix("')"))
        .unwrap_or_else(|| panic!("rule {rule:?} is not {prefix}self.matches(r'...')"))
}

/// `spec.udsSocket`'s rules: the byte length bound, and the grammar regex run on values of at
/// most 319 characters.
const SOCKET_GRAMMAR_GUARD: &str = "size(self) > 319 || ";
/// `spec.targetRef.name`'s rule: at most 63 characters, then the regex.
const NAME_GUARD: &str = "size(self) <= 63 && ";

fn socket_rules() -> ((&'static str, &'static str), (&'static str, &'static str)) {
    let rules = rules(socket_schema());
    assert_eq!(rules.len(), 2, "a length rule and a grammar rule: {rules:?}");
    (rules[0], rules[1])
}

/// Compiles a regex the way kube-apiserver's CEL `matches` would (RE2 syntax; unanchored unless
/// the pattern anchors itself; `$` only at the end of the text).
fn compile(regex: &str) -> Regex {
    Regex::new(regex).expect("the pattern compiles as RE2")
}

static SOCKET_RE: LazyLock<Regex> = LazyLock::new(|| compile(matches_regex(socket_rules().1.0, SOCKET_GRAMMAR_GUARD)));
static NAME_RE: LazyLock<Regex> = LazyLock::new(|| {
    let rules = rules(name_schema());
    assert_eq!(rules.len(), 1, "one rule: {rules:?}");
    compile(matches_regex(rules[0].0, NAME_GUARD))
});

/// Whether `spec.udsSocket`'s rules accept `s`: `size(bytes(self)) <= 36` counts bytes, the
/// grammar guard (`size(self)`) counts characters, as CEL does.
fn socket_schema_accepts(s: &str) -> bool {
    s.len() <= WIDEST_BUDGET && (s.chars().count() > FILESYSTEM_VALUE_MAX || SOCKET_RE.is_match(s))
}

/// Whether `spec.targetRef.name`'s rule accepts `s` (`size(self)` counts characters).
fn name_schema_accepts(s: &str) -> bool {
    s.chars().count() <= 63 && NAME_RE.is_match(s)
}

/// Every key of `schema` and its sub-schemas, recursively.
fn keys(schema: &Value, out: &mut Vec<String>) {
    if let Some(map) = schema.as_object() {
        for (k, v) in map {
            out.push(k.clone());
            keys(v, out);
        }
    } else if let Some(items) = schema.as_array() {
        items.iter().for_each(|v| keys(v, out));
    }
}

// ---------------------------------------------------------------- the schema's fixed facts

#[test]
fn spec_has_no_check_that_stops_the_cel_rules() {
    let mut found = Vec::new();
    keys(spec_schema(), &mut found);
    for check in ["enum", "maxLength", "minLength", "pattern", "maxItems", "maxProperties"] {
        assert!(!found.iter().any(|k| k == check), "spec schema has {check}: {}", spec_schema());
    }
}

#[test]
fn socket_length_rule_is_the_widest_budget_in_bytes() {
    let (length, _) = socket_rules();
    assert_eq!(length.0, format!("size(bytes(self)) <= {WIDEST_BUDGET}"));
    assert!(length.1.contains("at most 36 bytes"), "{}", length.1);
    assert_eq!(socket_length_rule(SocketLimit::SunPath).rule, length.0);
    assert_eq!(
        socket_length_rule(SocketLimit::Filesystem).rule,
        format!("size(bytes(self)) <= {FILESYSTEM_VALUE_MAX}")
    );
    assert_eq!(socket_schema()["type"], "string");
}

#[test]
fn schema_patterns_are_the_published_constants() {
    assert_eq!(SOCKET_RE.as_str(), SOCKET_PATTERN);
    assert_eq!(NAME_RE.as_str(), DNS1035_LABEL_PATTERN);
}

#[test]
fn group_rule_admits_exactly_empty_and_core() {
    let group = &target_ref_schema()["properties"]["group"];
    assert_eq!(rules(group), [(GROUP_RULE, GROUP_MESSAGE)]);
    assert_eq!(GROUP_RULE, "self == '' || self == 'core'");
    assert_eq!(group["default"], json!(""));
}

#[test]
fn kind_rule_admits_exactly_service() {
    assert_eq!(rules(&target_ref_schema()["properties"]["kind"]), [(KIND_RULE, KIND_MESSAGE)]);
    assert_eq!(KIND_RULE, "self == 'Service'");
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
        assert!(!socket_schema_accepts(value), "schema accepts {value:?}");
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
        prop_assert_eq!(socket_schema_accepts(&s), rust, "{:?}", s);
    }

    #[test]
    fn socket_pattern_matches_exactly_the_grammar(s in socket_candidate()) {
        // The pattern alone does not bound the volume to 63 bytes; below 66 bytes no value
        // can hold a longer volume, and above that the length rule rejects it anyway.
        prop_assume!(s.len() < udspath::VOLUME_NAME_MAX + 3);
        prop_assert_eq!(SOCKET_RE.is_match(&s), udspath::parse(&s).is_ok(), "{:?}", s);
    }

    #[test]
    fn name_schema_accepts_exactly_dns1035_labels(s in name_candidate()) {
        prop_assert_eq!(name_schema_accepts(&s), validate::is_dns1035_label(&s), "{:?}", s);
        if s.len() <= 63 {
            prop_assert_eq!(NAME_RE.is_match(&s), validate::is_dns1035_label(&s), "{:?}", s);
        }
    }
}
