//! The README's Quickstart and the pages around it stay true without a cluster:
//! - every relative link in the top-level pages and `docs/` reaches a file (and a heading, when it
//!   names one);
//! - the Quickstart's workload (`examples/quickstart/echo.yaml`) serves on the socket the
//!   canonical policy (`crds/examples/ok-echo-uds.yaml`) names, runs as the ServiceAccount the
//!   policy targets, and the client calls that Service; the canonical value leaves more than the
//!   webhook's near-budget margin at the default pods dir, so its first apply draws no warning;
//! - `make demo` (`scripts/demo.sh`) runs the Quickstart's own workload files, and the
//!   Quickstart's image values are the images the real-node suites install.
//!
//! The real-node suites run the same workload shape; `make demo` runs these very files. No
//! control plane needed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

// The generator's GitHub anchor rule, so the README check and the chart READMEs agree.
use aether_chart_readme::github_anchor;
use aether_tests::repo_root;
use serde::Deserialize;
use serde_json::Value;

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo_root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every YAML document of `rel` (empty ones skipped).
fn documents(rel: &str) -> Vec<Value> {
    let text = read(rel);
    yaml_serde::Deserializer::from_str(&text)
        .map(|de| Value::deserialize(de).unwrap_or_else(|e| panic!("{rel}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind} in {docs:?}"))
}

/// The pages a reader reaches from the README.
fn pages() -> Vec<PathBuf> {
    let root = repo_root();
    let mut pages: Vec<PathBuf> =
        ["README.md", "CONTRIBUTING.md", "SECURITY.md", "CHANGELOG.md"].iter().map(|p| root.join(p)).collect();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The lines of `text` outside fenced code blocks, with their 1-based line numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .map(|(i, l)| (i + 1, l))
        .collect()
}

fn anchors(page: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
    prose(&text)
        .iter()
        .filter_map(|(_, l)| l.strip_prefix('#'))
        .map(|h| github_anchor(h.trim_start_matches('#')))
        .collect()
}

/// The targets of the inline links `[text](target)` on `line`.
fn link_targets(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        out.push(&after[..end]);
        rest = &after[end..];
    }
    out
}

#[test]
fn every_relative_link_reaches_a_file_and_heading() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        let dir = page.parent().expect("a page has a folder");
        for (n, line) in prose(&text) {
            for target in link_targets(line) {
                if target.contains("://") || target.starts_with("mailto:") || target.contains(char::is_whitespace) {
                    continue;
                }
                let (path, heading) = target.split_once('#').map_or((target, None), |(p, h)| (p, Some(h)));
                let file = if path.is_empty() { page.clone() } else { dir.join(path) };
                let name = format!("{}:{n}: {target}", page.display());
                if !file.exists() {
                    broken.push(format!("{name}: no such file"));
                } else if let Some(h) = heading
                    && file.extension().is_some_and(|e| e == "md")
                    && !anchors(&file).contains(h)
                {
                    broken.push(format!("{name}: no such heading"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_quickstart_workload_serves_on_the_socket_the_canonical_policy_names() {
    let policy = &documents("crds/examples/ok-echo-uds.yaml")[0];
    let value = policy["spec"]["udsSocket"].as_str().expect("spec.udsSocket");
    let target = policy["spec"]["targetRef"]["name"].as_str().expect("spec.targetRef.name");
    let (volume, file) = value.split_once('/').expect("<volume>/<file>");

    // No near-budget warning on a first apply at the default pods dir.
    let budget = aether_crds::Budget::new("/var/lib/kubelet/pods").expect("the default pods dir has a budget");
    budget.check(value).expect("the canonical value fits");
    let spare = budget.bytes() - value.len();
    assert!(
        spare > aether_controller::warnings::NEAR_BUDGET_BYTES,
        "{value:?} leaves {spare} bytes: the webhook warns at {} or fewer",
        aether_controller::warnings::NEAR_BUDGET_BYTES
    );

    let docs = documents("examples/quickstart/echo.yaml");
    let ns = find(&docs, "Namespace")["metadata"]["name"].as_str().expect("namespace name").to_owned();
    let service = find(&docs, "Service");
    assert_eq!(service["metadata"]["name"], target, "the Service is the policy's target");
    let deployment = find(&docs, "Deployment");
    let pod = &deployment["spec"]["template"];
    assert_eq!(pod["metadata"]["labels"]["aether.io/managed"], "true", "aether looks only at managed pods");
    assert_eq!(pod["spec"]["serviceAccountName"], target, "a policy reaches pods by ServiceAccount");
    assert_eq!(find(&docs, "ServiceAccount")["metadata"]["name"], target);
    let selector = service["spec"]["selector"].as_object().expect("Service selector");
    for (k, v) in selector {
        assert_eq!(&pod["metadata"]["labels"][k], v, "the Service selects the pod ({k})");
    }
    let volumes = pod["spec"]["volumes"].as_array().expect("volumes");
    assert!(
        volumes.iter().any(|v| v["name"] == volume && v.get("emptyDir").is_some()),
        "the pod has an emptyDir volume {volume:?}"
    );
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["image"], "localhost/aether/uds-echo:dev");
    let mount = container["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .find(|m| m["name"] == volume)
        .unwrap_or_else(|| panic!("the container mounts {volume:?}"));
    assert!(mount.get("subPath").is_none(), "a subPath mount hides the socket from the node proxy");
    let socket = format!("{}/{file}", mount["mountPath"].as_str().expect("mountPath"));
    let args: Vec<&str> = container["args"].as_array().expect("args").iter().filter_map(Value::as_str).collect();
    assert!(args.windows(2).any(|w| w == ["--socket", socket.as_str()]), "uds-echo serves on {socket}: {args:?}");
    assert!(!args.contains(&"--tcp"), "a UDS-only app: no TCP listener of its own");
    let port = &service["spec"]["ports"][0];
    assert_eq!(port["targetPort"], 8080, "the agent's default port (no endpoint.aether.io/port annotation)");
    assert_eq!(container["readinessProbe"]["httpGet"]["port"], 8080, "the probe goes through Envoy's listener");

    let client = &documents("examples/quickstart/client.yaml")[0];
    assert_eq!(client["metadata"]["namespace"], ns.as_str());
    let url = format!("http://{target}.{ns}.svc.cluster.local:{}/hello", port["port"]);
    let cargs: Vec<&str> =
        client["spec"]["containers"][0]["args"].as_array().expect("args").iter().filter_map(Value::as_str).collect();
    assert_eq!(cargs, ["--get", url.as_str()]);
    let readme = read("README.md");
    assert!(readme.contains(&format!("echo over unix:{socket}: GET /hello")), "README.md shows the reply for {socket}");
    assert!(
        readme.contains(&format!("uds-echo --get {url}: HTTP 200 OK")),
        "README.md shows the client's line for {url}"
    );
}

/// `examples/quickstart/<file>` and `crds/examples/<file>` names in `text`.
fn example_files(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for prefix in ["examples/quickstart/", "crds/examples/"] {
        for (at, _) in text.match_indices(prefix) {
            let name: String = text[at + prefix.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                .collect();
            if name.ends_with(".yaml") {
                out.insert(format!("{prefix}{name}"));
            }
        }
    }
    out
}

#[test]
fn make_demo_runs_the_quickstarts_files() {
    let readme = example_files(&read("README.md"));
    let demo = example_files(&read("scripts/demo.sh"));
    for f in readme.iter().chain(&demo) {
        assert!(repo_root().join(f).is_file(), "{f} is named but does not exist");
    }
    // The demo passes the image values as --set flags (scripts/demo-common.sh), the Quickstart
    // as a values file; the next test keeps the two equal.
    let workload: BTreeSet<String> = readme
        .iter()
        .filter(|f| f.ends_with("echo.yaml") || f.ends_with("client.yaml") || f.contains("ok-echo-uds"))
        .cloned()
        .collect();
    assert_eq!(workload.len(), 3, "the Quickstart names echo.yaml, client.yaml and the canonical policy: {readme:?}");
    let missing: Vec<&String> = workload.iter().filter(|f| !demo.contains(*f)).collect();
    assert!(missing.is_empty(), "scripts/demo.sh does not run the Quickstart's {missing:?}");
}

#[test]
fn the_quickstarts_image_values_are_the_images_the_node_suites_install() {
    let values = &documents("examples/quickstart/local-images.yaml")[0];
    let mut got = BTreeSet::new();
    for (component, image) in values["images"].as_object().expect("images") {
        for (key, v) in image.as_object().expect("an image") {
            let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
            got.insert(format!("images.{component}.{key}={v}"));
        }
    }
    let want: BTreeSet<String> = aether_tests::node::CHART_IMAGE_SETS
        .iter()
        .filter(|s| s.starts_with("images."))
        .map(|s| (*s).to_owned())
        .collect();
    assert_eq!(got, want);
}
