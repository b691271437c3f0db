//! The charts as a release ships them: `helm package` of both charts (what `make charts` and the
//! release workflow run) into a temporary folder, then, on each `.tgz` with the real Helm:
//! `helm lint --strict` and `helm template` pass; `helm show chart` says the `kubeVersion` that
//! docs/compatibility.md gives as the minimum, the project's `home` and `sources`, and the release
//! as `appVersion` (the workspace version of the root `Cargo.toml`, which this crate inherits); the
//! packaged CRD carries the release as its `app.kubernetes.io/version` label.
//!
//! A packaged chart has no repository files next to it, so every link of its README (`helm show
//! readme`) and of the NOTES a `helm install --dry-run` prints is absolute, and each one into the
//! repository at the release tag (`https://github.com/aether-mesh/aether/blob/v<appVersion>/<path>`)
//! names a file of this repository and, with `#<anchor>`, one of its headings (GitHub's anchor
//! rule: lowercase, punctuation other than `-` and `_` dropped, spaces to `-`, `-1`, `-2`... for
//! repeated headings). No `docs/<page>.md` mention is left outside such a link.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use aether_chart_readme::github_anchor;
use aether_tests::{ControlPlane, helm_bin, repo_root};
use pulldown_cmark::{Event, Parser, Tag, TagEnd};
use serde_json::Value;

/// The release: `workspace.package.version` of the root `Cargo.toml` (tests/Cargo.toml has
/// `version.workspace = true`).
const RELEASE: &str = env!("CARGO_PKG_VERSION");
const PROJECT: &str = "https://github.com/aether-mesh/aether";
const CHARTS: [&str; 2] = ["aether-crds", "aether"];

fn helm() -> PathBuf {
    helm_bin()
}

/// Runs helm with `args`; its stdout, or a panic with the command and its stderr.
fn helm_ok(args: &[&str]) -> String {
    let out = Command::new(helm()).args(args).stdin(Stdio::null()).output().expect("running helm");
    assert!(
        out.status.success(),
        "helm {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("helm prints UTF-8")
}

/// `helm package` of both charts, once per test process: chart name → its `.tgz`.
fn packaged() -> &'static [(String, PathBuf)] {
    static PACKAGED: OnceLock<(tempfile::TempDir, Vec<(String, PathBuf)>)> = OnceLock::new();
    let (_dir, tgzs) = PACKAGED.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let dest = dir.path().to_str().expect("UTF-8 temp path").to_owned();
        let mut args = vec!["package".to_owned()];
        args.extend(CHARTS.iter().map(|c| repo_root().join("charts").join(c).display().to_string()));
        args.extend(["--destination".to_owned(), dest]);
        helm_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let tgzs = CHARTS
            .iter()
            .map(|name| {
                let chart: Value = yaml_serde::from_str(
                    &std::fs::read_to_string(repo_root().join("charts").join(name).join("Chart.yaml"))
                        .expect("Chart.yaml"),
                )
                .expect("Chart.yaml parses");
                let version = chart["version"].as_str().expect("a chart version");
                let tgz = dir.path().join(format!("{name}-{version}.tgz"));
                assert!(tgz.is_file(), "helm package wrote no {}", tgz.display());
                ((*name).to_owned(), tgz)
            })
            .collect();
        (dir, tgzs)
    });
    tgzs
}

fn tgz(name: &str) -> &'static str {
    packaged().iter().find(|(n, _)| n == name).and_then(|(_, p)| p.to_str()).expect("packaged chart")
}

/// The minimum Kubernetes version of docs/compatibility.md: the "untested" row `| Kubernetes | >= X.Y |`.
fn documented_minimum() -> String {
    let doc = std::fs::read_to_string(repo_root().join("docs/compatibility.md")).expect("docs/compatibility.md");
    doc.lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            (cells.len() >= 3 && cells[0] == "Kubernetes" && cells[2] == "untested")
                .then(|| cells[1].strip_prefix(">=").map(|v| v.trim().to_owned()))
                .flatten()
        })
        .next()
        .expect("docs/compatibility.md has a row `| Kubernetes | >= X.Y | untested | ... |`")
}

#[test]
fn packaged_charts_lint_render_and_name_the_release() {
    let want_kube = format!(">={}.0-0", documented_minimum());
    for name in CHARTS {
        let tgz = tgz(name);
        helm_ok(&["lint", "--strict", tgz]);
        let rendered = helm_ok(&["template", "aether", tgz, "--namespace", "aether-system"]);
        assert!(rendered.contains("kind: "), "{name}: helm template rendered no object:\n{rendered}");
        let chart: Value = yaml_serde::from_str(&helm_ok(&["show", "chart", tgz])).expect("helm show chart is YAML");
        assert_eq!(chart["kubeVersion"], want_kube.as_str(), "{name}: kubeVersion vs docs/compatibility.md");
        assert_eq!(chart["home"], PROJECT, "{name}: home");
        assert!(
            chart["sources"].as_array().is_some_and(|s| s.iter().any(|u| u == PROJECT)),
            "{name}: sources {}",
            chart["sources"]
        );
        assert_eq!(chart["appVersion"], RELEASE, "{name}: appVersion must be the workspace version of Cargo.toml");
        if name == "aether" {
            assert!(chart["keywords"].as_array().is_some_and(|k| !k.is_empty()), "{name}: keywords");
        }
        // The repository's bookkeeping stays out of the package (each chart's .helmignore).
        let listing = std::process::Command::new("tar").args(["tzf", tgz]).output().expect("tar");
        let files = String::from_utf8_lossy(&listing.stdout);
        assert!(listing.status.success() && files.contains("Chart.yaml"), "{name}: tar tzf {tgz}");
        assert!(!files.contains(".chart-digests"), "{name}: the package carries .chart-digests:\n{files}");
    }
    let crd: Value = yaml_serde::from_str(&helm_ok(&["template", "aether-crds", tgz("aether-crds")])).expect("one CRD");
    let labels = &crd["metadata"]["labels"];
    assert_eq!(labels["app.kubernetes.io/version"], RELEASE, "the CRD's version label: {labels}");
    assert_eq!(labels["app.kubernetes.io/part-of"], "aether", "{labels}");
}

/// GitHub's anchors of every heading of a Markdown file (repeated ones get `-1`, `-2`, ...).
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut heading: Option<String> = None;
    for event in Parser::new(markdown) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let base = github_anchor(&heading.take().unwrap_or_default());
                let mut slug = base.clone();
                let mut n = 0;
                while out.contains(&slug) {
                    n += 1;
                    slug = format!("{base}-{n}");
                }
                out.insert(slug);
            }
            _ => {}
        }
    }
    out
}

/// Every link must be absolute (https); a link into the repository at the release tag must name a
/// file of this repository and, with an anchor, one of its headings. Returns how many links went
/// into the repository.
fn check_links(what: &str, links: &[String]) -> usize {
    let base = format!("{PROJECT}/blob/v{RELEASE}/");
    let mut into_repo = 0;
    for link in links {
        assert!(link.starts_with("https://"), "{what}: link {link:?} is not absolute (https://...)");
        let Some(rest) = link.strip_prefix(&base) else {
            assert!(!link.starts_with(PROJECT), "{what}: {link} points into the project but not at {base}");
            continue;
        };
        into_repo += 1;
        let (path, anchor) = rest.split_once('#').map_or((rest, None), |(p, a)| (p, Some(a)));
        let file = repo_root().join(path);
        assert!(file.is_file(), "{what}: {link} names {path}, which is not a file of this repository");
        if let Some(anchor) = anchor {
            let text = std::fs::read_to_string(&file).expect("readable doc");
            let known = anchors(&text);
            assert!(known.contains(anchor), "{what}: {link}: {path} has no heading #{anchor}; its anchors: {known:?}");
        }
    }
    into_repo
}

/// A `docs/<page>.md` mention in `text` (a path a reader could only follow inside a checkout).
fn relative_doc_mention(text: &str) -> Option<&str> {
    text.match_indices("docs/").find_map(|(i, _)| {
        let rest = &text[i..];
        let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || "/._-".contains(c))).unwrap_or(rest.len());
        let path = rest[..end].trim_end_matches('.');
        path.ends_with(".md").then_some(path)
    })
}

#[test]
fn every_link_of_the_packaged_readmes_is_absolute_and_resolves() {
    for name in CHARTS {
        let readme = helm_ok(&["show", "readme", tgz(name)]);
        let (mut links, mut in_link) = (Vec::new(), 0usize);
        for event in Parser::new(&readme) {
            match event {
                Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                    links.push(dest_url.to_string());
                    in_link += 1;
                }
                Event::End(TagEnd::Link | TagEnd::Image) => in_link -= 1,
                Event::Text(t) | Event::Code(t) | Event::Html(t) | Event::InlineHtml(t) if in_link == 0 => {
                    if let Some(m) = relative_doc_mention(&t) {
                        panic!("charts/{name}/README.md (packaged): {m:?} is a repository path, not a link: {t}");
                    }
                }
                _ => {}
            }
        }
        let into_repo = check_links(&format!("{name} README"), &links);
        // install, upgrade and troubleshooting at least (the generator's install hint).
        assert!(into_repo >= 3, "{name} README: {into_repo} links into the repository: {links:?}");
    }
}

/// The URLs of plain text: each `https://` or `http://` run up to whitespace or a closing
/// bracket or quote, without a sentence's trailing `.`, `,`, `;` or `:`.
fn urls(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for scheme in ["https://", "http://"] {
        for (i, _) in text.match_indices(scheme) {
            let rest = &text[i..];
            let end = rest.find(|c: char| c.is_whitespace() || ")]>\"'`".contains(c)).unwrap_or(rest.len());
            out.push(rest[..end].trim_end_matches(['.', ',', ';', ':']).to_owned());
        }
    }
    out
}

#[test]
fn every_link_of_the_rendered_notes_is_absolute_and_resolves() {
    let cp = ControlPlane::start().expect("control plane");
    let kubeconfig = cp.kubeconfig();
    let kubeconfig = kubeconfig.to_str().expect("UTF-8 path");
    for sets in [&[][..], &["socketLimit=filesystem", "daemonset.namespace=edge-node", "controller.replicas=1"][..]] {
        let mut args = vec!["install", "aether", tgz("aether"), "--namespace", "aether-system"];
        args.extend(["--dry-run=client", "--kubeconfig", kubeconfig]);
        for s in sets {
            args.extend(["--set", s]);
        }
        let out = helm_ok(&args);
        let notes = out.split_once("\nNOTES:\n").map(|(_, n)| n).unwrap_or_else(|| panic!("no NOTES {sets:?}: {out}"));
        let links = urls(notes);
        let mut bare = notes.to_owned();
        for l in &links {
            bare = bare.replace(l.as_str(), "");
        }
        assert_eq!(relative_doc_mention(&bare), None, "NOTES {sets:?}: a repository path, not a link:\n{notes}");
        let into_repo = check_links(&format!("NOTES {sets:?}"), &links);
        assert!(into_repo >= 3, "NOTES {sets:?}: {into_repo} links into the repository: {links:?}\n{notes}");
    }
}

/// The link checks themselves: a relative link, a missing file and a missing heading fail.
#[test]
fn the_link_check_refuses_relative_links_missing_files_and_missing_headings() {
    let base = format!("{PROJECT}/blob/v{RELEASE}");
    let good = [format!("{base}/docs/install.md#logs"), format!("{base}/docs/design-notes.md")];
    assert_eq!(check_links("good", &good), 2);
    for bad in [
        "docs/install.md".to_owned(),
        "../../docs/install.md".to_owned(),
        format!("{base}/docs/no-such-page.md"),
        format!("{base}/docs/install.md#no-such-heading"),
        format!("{PROJECT}/blob/main/docs/install.md"),
    ] {
        let caught = std::panic::catch_unwind(|| check_links("bad", std::slice::from_ref(&bad)));
        assert!(caught.is_err(), "{bad} passed the link check");
    }
    assert_eq!(relative_doc_mention("see docs/install.md."), Some("docs/install.md"));
    assert_eq!(relative_doc_mention("see docs/ and install.md"), None);
    let md = "# A `code` title: x\n## Dup\n## Dup\n### Under_score-dash (2)\n";
    let want: BTreeSet<String> =
        ["a-code-title-x", "dup", "dup-1", "under_score-dash-2"].iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(anchors(md), want);
}
