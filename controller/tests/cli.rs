//! The `aether-controller` binary: `validate` (the webhook's decision offline, for GitOps CI),
//! `crd`, and the help text of `run`.

mod common;

use std::process::Output;

use common::fixture_path;
use serde_json::Value;

/// Runs the binary with `args`, with no `AETHER_*` variable inherited from the environment.
fn run(args: &[&str]) -> Output {
    run_with(args, &[], None)
}

fn run_with(args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> Output {
    let mut cmd = assert_cmd::cargo::cargo_bin_cmd!("aether-controller");
    for (k, _) in std::env::vars() {
        if k.starts_with("AETHER_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied()).args(args);
    if let Some(input) = stdin {
        cmd.write_stdin(input);
    }
    cmd.output().expect("the binary runs")
}

fn policies(name: &str) -> String {
    fixture_path(&format!("policies/{name}")).display().to_string()
}

fn example(name: &str) -> String {
    format!("{}/../crds/examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited, not killed")
}

/// `validate -o json` of `files`: the exit code and the parsed array.
fn validate_json(files: &[&str], extra: &[&str]) -> (i32, Vec<Value>) {
    let mut args = vec!["validate", "-o", "json"];
    for f in files {
        args.extend(["-f", f]);
    }
    args.extend(extra);
    let out = run(&args);
    let json: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("-o json is not JSON ({e}): {}\nstderr: {}", stdout(&out), stderr(&out)));
    (code(&out), json.as_array().expect("-o json prints an array").clone())
}

fn entry<'a>(entries: &'a [Value], name: &str) -> &'a Value {
    entries.iter().find(|e| e["name"] == name).unwrap_or_else(|| panic!("no entry named {name}: {entries:?}"))
}

// ---------------------------------------------------------------------------------------------
// validate: exit codes and text
// ---------------------------------------------------------------------------------------------

#[test]
fn validate_all_valid_documents_exits_0() {
    let f = policies("all-valid.yaml");
    let out = run(&["validate", "-f", &f]);
    assert_eq!(code(&out), 0, "stdout: {}\nstderr: {}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    for name in ["shop/echo-uds", "shop/cart-uds", "payments/grpc-uds"] {
        assert!(text.contains(&format!("ALLOWED endpointpolicy/{name}")), "{text}");
    }
    assert!(text.contains("3 allowed, 0 denied, 0 skipped"), "the empty document is not counted: {text}");
}

#[test]
fn validate_with_one_denied_document_exits_1_and_names_the_field() {
    let f = policies("one-denied.yaml");
    let out = run(&["validate", "-f", &f]);
    assert_eq!(code(&out), 1, "stdout: {}\nstderr: {}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    let denied = text.lines().find(|l| l.starts_with("DENIED")).unwrap_or_else(|| panic!("no DENIED line: {text}"));
    assert!(denied.contains("endpointpolicy/shop/echo-too-long"), "{denied}");
    for want in ["spec.udsSocket", "17 bytes", "16 bytes", "/var/lib/kubelet/pods"] {
        assert!(denied.contains(want), "denial lacks {want:?}: {denied}");
    }
    assert!(text.contains("ALLOWED endpointpolicy/shop/echo-uds"), "{text}");
    assert!(text.contains("1 allowed, 1 denied, 0 skipped"), "{text}");
}

#[test]
fn validate_gives_the_same_message_as_the_webhook() {
    // One decision function: the offline denial text is the webhook's denial text.
    let (_, entries) = validate_json(&[&policies("one-denied.yaml")], &[]);
    let offline = entry(&entries, "echo-too-long")["message"].as_str().expect("message").to_owned();
    let budget = aether_crds::Budget::new(aether_crds::udspath::DEFAULT_PODS_DIR).expect("default budget");
    let object = common::review("create-over-budget.json")["request"]["object"].clone();
    let webhook = aether_crds::review(&object, &budget).message().expect("denied");
    assert_eq!(offline, webhook);
}

#[test]
fn validate_schema_failure_is_a_denial_not_unreadable_input() {
    let (code, entries) = validate_json(&[&policies("schema-failure.yaml")], &[]);
    assert_eq!(code, 1);
    let message = entry(&entries, "echo-uds")["message"].as_str().expect("message").to_owned();
    assert!(message.contains("spec.targetRef.namespace"), "{message}");
    assert!(message.contains("udsSocket"), "{message}");
}

#[test]
fn validate_denies_an_api_version_that_is_not_served() {
    let yaml = "apiVersion: config.aether.io/v2\nkind: EndpointPolicy\nmetadata: {name: future}\nspec:\n  targetRef: {kind: Service, name: echo}\n  udsSocket: sockets/app.sock\n";
    let out = run_with(&["validate", "-f", "-"], &[], Some(yaml));
    assert_eq!(code(&out), 1, "{}", stdout(&out));
    assert!(stdout(&out).contains("config.aether.io/v1"), "{}", stdout(&out));
}

#[test]
fn validate_reads_standard_input() {
    let yaml = std::fs::read_to_string(policies("one-denied.yaml")).expect("fixture");
    let out = run_with(&["validate", "-f", "-"], &[], Some(&yaml));
    assert_eq!(code(&out), 1);
    assert!(stdout(&out).contains("spec.udsSocket"), "{}", stdout(&out));
}

#[test]
fn validate_expands_a_list() {
    let (code, entries) = validate_json(&[&policies("list.yaml")], &[]);
    assert_eq!(code, 1);
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_eq!(entry(&entries, "echo-uds")["allowed"], true);
    let cart = entry(&entries, "cart-uds");
    assert_eq!(cart["allowed"], false);
    assert!(cart["message"].as_str().is_some_and(|m| m.contains("spec.targetRef.kind")), "{cart}");
}

// ---------------------------------------------------------------------------------------------
// validate -o json
// ---------------------------------------------------------------------------------------------

#[test]
fn validate_json_entries_have_the_documented_keys() {
    let (code, entries) = validate_json(&[&policies("one-denied.yaml"), &policies("mixed-kinds.yaml")], &[]);
    assert_eq!(code, 1);
    assert_eq!(entries.len(), 5, "{entries:?}");
    for e in &entries {
        let obj = e.as_object().expect("entries are objects");
        for key in ["kind", "namespace", "name", "allowed", "message", "warnings"] {
            assert!(obj.contains_key(key), "entry lacks {key:?}: {e}");
        }
        assert!(e["warnings"].is_array(), "{e}");
        assert!(e["file"].as_str().is_some_and(|f| f.ends_with(".yaml")), "entries name their file: {e}");
    }
    let denied = entry(&entries, "echo-too-long");
    assert_eq!(denied["kind"], "EndpointPolicy");
    assert_eq!(denied["namespace"], "shop");
    assert_eq!(denied["allowed"], false);
    assert!(denied["message"].as_str().is_some_and(|m| m.contains("spec.udsSocket")), "{denied}");
    let allowed =
        entries.iter().find(|e| e["name"] == "echo-uds" && e["allowed"] == true).expect("an allowed echo-uds");
    assert!(allowed["message"].is_null(), "{allowed}");
}

#[test]
fn validate_lists_other_kinds_as_skipped() {
    let f = policies("mixed-kinds.yaml");
    let (code, entries) = validate_json(&[&f], &[]);
    assert_eq!(code, 0, "skipped documents do not fail validation");
    for (kind, name) in [("Service", "echo"), ("ConfigMap", "echo-config")] {
        let e = entries
            .iter()
            .find(|e| e["kind"] == kind && e["name"] == name)
            .unwrap_or_else(|| panic!("{kind} {name} missing: {entries:?}"));
        assert_eq!(e["skipped"], true, "{e}");
        assert!(e["allowed"].is_null(), "a skipped document is not decided: {e}");
        assert!(e["message"].as_str().is_some_and(|m| m.contains("not an EndpointPolicy")), "{e}");
    }
    let text = stdout(&run(&["validate", "-f", &f]));
    assert!(text.contains("SKIPPED service/shop/echo"), "{text}");
    assert!(text.contains("SKIPPED configmap/shop/echo-config"), "{text}");
    assert!(text.contains("1 allowed, 0 denied, 2 skipped"), "{text}");
}

// ---------------------------------------------------------------------------------------------
// validate: exit code 2
// ---------------------------------------------------------------------------------------------

#[test]
fn validate_missing_file_exits_2_with_the_reason_on_stderr() {
    let missing = fixture_path("policies/does-not-exist.yaml").display().to_string();
    let out = run(&["validate", "-f", &missing]);
    assert_eq!(code(&out), 2);
    let err = stderr(&out);
    assert!(err.contains("cannot read") && err.contains(&missing), "{err}");
    assert!(stdout(&out).is_empty(), "no verdicts for unreadable input: {}", stdout(&out));
}

#[test]
fn validate_invalid_yaml_exits_2_naming_file_and_document() {
    let f = policies("invalid-yaml.yaml");
    let out = run(&["validate", "-f", &f]);
    assert_eq!(code(&out), 2, "stdout: {}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("cannot parse") && err.contains(&f) && err.contains("document 2"), "{err}");
}

#[test]
fn validate_unusable_pods_dir_exits_2_with_the_reason() {
    let f = policies("all-valid.yaml");
    let out = run(&["validate", "-f", &f, "--kubelet-pods-dir", "/var/snap/microk8s/common/var/lib/kubelet/pods"]);
    assert_eq!(code(&out), 2);
    let err = stderr(&out);
    assert!(err.contains("--kubelet-pods-dir") && err.contains("budget"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// validate: budget and tie-break
// ---------------------------------------------------------------------------------------------

#[test]
fn validate_short_pods_dir_lets_a_35_byte_value_pass_that_the_default_denies() {
    let f = policies("wide-budget.yaml");
    let (default_code, entries) = validate_json(&[&f], &[]);
    assert_eq!(default_code, 1);
    let message = entry(&entries, "echo-long-socket")["message"].as_str().expect("denied").to_owned();
    assert!(message.contains("35 bytes") && message.contains("16 bytes"), "{message}");

    let (short_code, entries) = validate_json(&[&f], &["--kubelet-pods-dir", "/k"]);
    assert_eq!(short_code, 0, "{entries:?}");
    assert_eq!(entry(&entries, "echo-long-socket")["allowed"], true);
}

#[test]
fn validate_takes_the_pods_dir_from_the_environment() {
    let f = policies("wide-budget.yaml");
    let out = run_with(&["validate", "-f", &f], &[("AETHER_KUBELET_PODS_DIR", "/k")], None);
    assert_eq!(code(&out), 0, "{}", stdout(&out));
}

#[test]
fn validate_warns_about_policies_sharing_a_service_naming_the_winner() {
    let f = policies("shared-target.yaml");
    let (code, entries) = validate_json(&[&f], &[]);
    assert_eq!(code, 0, "a conflict is a warning, not a denial");
    let conflict = |entries: &[serde_json::Value], name: &str| -> Vec<String> {
        let warnings = entry(entries, name)["warnings"].as_array().expect("warnings").clone();
        warnings
            .iter()
            .filter_map(|w| w.as_str())
            .filter(|w| w.starts_with("spec.targetRef.name"))
            .map(str::to_owned)
            .collect()
    };
    let loser = conflict(&entries, "zeta-uds");
    assert_eq!(loser.len(), 1, "{loser:?}");
    assert!(
        loser[0].contains("\"alpha-uds\" wins (the smallest name wins)") && loser[0].contains("Conflicted"),
        "{loser:?}"
    );
    let winner = conflict(&entries, "alpha-uds");
    assert_eq!(winner.len(), 1, "{winner:?}");
    assert!(winner[0].contains("this policy \"alpha-uds\" wins"), "the smallest name wins: {winner:?}");
    assert!(conflict(&entries, "aaa-uds").is_empty(), "another namespace is another Service");

    let text = stdout(&run(&["validate", "-f", &f]));
    assert!(text.contains("warning:") && text.contains("\"alpha-uds\" wins"), "{text}");
}

#[test]
fn validate_tie_break_spans_files() {
    let (_, entries) = validate_json(&[&policies("shared-target.yaml"), &policies("one-denied.yaml")], &[]);
    // echo-uds (one-denied.yaml) also targets shop/echo and sorts before zeta-uds but after alpha-uds;
    // the denied echo-too-long is never a candidate.
    let warnings = entry(&entries, "zeta-uds")["warnings"].as_array().expect("warnings").clone();
    let w =
        warnings.iter().filter_map(|w| w.as_str()).find(|w| w.starts_with("spec.targetRef.name")).expect("conflict");
    assert!(w.contains("echo-uds") && w.contains("\"alpha-uds\" wins"), "{w}");
    assert!(
        w.contains("EndpointPolicy \"echo-too-long\" also targets it but fails validation and never wins"),
        "a denied policy never wins: {w}"
    );
}

#[test]
fn validate_warns_about_a_value_within_two_bytes_of_the_budget_like_the_webhook() {
    // echo-uds in all-valid.yaml: "sockets/app.sock", exactly the 16-byte budget.
    let (code, entries) = validate_json(&[&policies("all-valid.yaml")], &[]);
    assert_eq!(code, 0);
    let warnings = entry(&entries, "echo-uds")["warnings"].as_array().expect("warnings").clone();
    assert!(
        warnings.iter().filter_map(|w| w.as_str()).any(|w| w.starts_with("spec.udsSocket") && w.contains("0 to spare")),
        "{warnings:?}"
    );
}

/// The canonical example (the README's, the Quickstart's) applies without any warning: a first
/// `kubectl apply` of it must not look like a mistake.
#[test]
fn validate_gives_the_canonical_example_no_warning() {
    let (code, entries) = validate_json(&[&example("ok-echo-uds.yaml")], &[]);
    assert_eq!(code, 0);
    let e = entry(&entries, "echo-uds");
    assert_eq!(e["allowed"], true, "{e}");
    assert!(e["warnings"].as_array().is_none_or(Vec::is_empty), "{e}");
}

// ---------------------------------------------------------------------------------------------
// crd and help
// ---------------------------------------------------------------------------------------------

#[test]
fn crd_prints_the_custom_resource_definition() {
    let out = run(&["crd"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("kind: CustomResourceDefinition"), "{text}");
    assert!(text.contains("endpointpolicies.config.aether.io"), "{text}");
    assert_eq!(text, aether_crds::crd_yaml(), "`crd` prints exactly what crdgen generates");
}

#[test]
fn run_help_explains_the_pods_dir_and_the_budget_arithmetic() {
    let out = run(&["run", "--help"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("--kubelet-pods-dir"), "{text}");
    assert!(text.contains("107 - len(dir) - 70"), "{text}");
    assert!(text.contains("AETHER_KUBELET_PODS_DIR"), "flags can be set from the environment: {text}");
}

#[test]
fn run_without_a_certificate_is_a_usage_error() {
    let out = run(&["run"]);
    assert_eq!(code(&out), 2, "clap's usage error");
    assert!(stderr(&out).contains("--tls-dir"), "{}", stderr(&out));
}

#[test]
fn run_refuses_a_body_cap_below_its_bound_and_accepts_the_bound() {
    use aether_controller::cli::{Cli, Command};
    use aether_controller::webhook::MIN_MAX_BODY_BYTES;
    use clap::Parser;
    let below = (MIN_MAX_BODY_BYTES - 1).to_string();
    let out = run(&["run", "--tls-dir", "/nonexistent", "--max-body-bytes", &below]);
    assert_eq!(code(&out), 2, "clap's usage error: {}", stderr(&out));
    for said in ["--max-body-bytes", &below, &MIN_MAX_BODY_BYTES.to_string()] {
        assert!(stderr(&out).contains(said), "lacks {said:?}: {}", stderr(&out));
    }
    let exact = MIN_MAX_BODY_BYTES.to_string();
    let cli = Cli::try_parse_from(["aether-controller", "run", "--tls-dir", "/x", "--max-body-bytes", &exact])
        .unwrap_or_else(|e| panic!("{exact} refused: {e}"));
    let Command::Run(args) = cli.command else { panic!("not run") };
    assert_eq!(args.max_body_bytes, MIN_MAX_BODY_BYTES);
}

#[test]
fn run_with_the_status_writer_and_no_kube_config_fails_saying_how_to_fix_it() {
    let home = tempfile::tempdir().expect("tempdir");
    let mut cmd = assert_cmd::cargo::cargo_bin_cmd!("aether-controller");
    for (k, _) in std::env::vars() {
        if k.starts_with("AETHER_") || k.starts_with("KUBERNETES_") || k == "KUBECONFIG" {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .env("HOME", home.path())
        .args(["run", "--tls-dir", "/nonexistent", "--admin-addr", "127.0.0.1:0", "--webhook-addr", "127.0.0.1:0"])
        .output()
        .expect("runs");
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    for want in ["KUBECONFIG", "--status-writer=false", "service account"] {
        assert!(stderr(&out).contains(want), "lacks {want}: {}", stderr(&out));
    }
}

#[test]
fn run_with_a_missing_kubeconfig_names_the_file() {
    let out = run(&["run", "--tls-dir", "/nonexistent", "--kubeconfig", "/nonexistent/kubeconfig"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("/nonexistent/kubeconfig") && stderr(&out).contains("--status-writer=false"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn run_help_describes_status_and_warnings() {
    let out = run(&["run", "--help"]);
    let text = stdout(&out);
    for want in [
        "--status-writer",
        "AETHER_STATUS_WRITER",
        "--lease-name",
        "--lease-namespace",
        "--lease-holder",
        "Conflicted",
        "AcceptedWithoutService",
    ] {
        assert!(text.contains(want), "lacks {want}: {text}");
    }
    let top = stdout(&run(&["--help"]));
    assert!(top.contains("Warning:") && top.contains("GEP-713"), "{top}");
}

#[test]
fn validate_of_input_without_any_document_is_an_input_error() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.yaml");
    std::fs::write(&empty, "# nothing rendered\n---\n").unwrap();
    let out = run(&["validate", "-f", empty.to_str().unwrap()]);
    assert_eq!(code(&out), 2, "{}", stdout(&out));
    assert!(stderr(&out).contains("no objects passed to validate"), "{}", stderr(&out));
}
