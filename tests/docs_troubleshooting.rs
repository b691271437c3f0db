//! `docs/troubleshooting.md` has one entry per Event reason the agent (on pods and on its Node) and the controller emit and
//! per metric they serve, and names no reason or metric the code does not define. The names come
//! from the code's own lists: the agent's fallback vocabulary ([`TcpReason::ALL`]) and pod-event
//! constants, the controller's condition [`Reason`]s, and the metric families both binaries
//! register (their `/metrics` exposition at start-up). No control plane needed.

#[path = "served_metrics.rs"]
mod served_metrics;

use std::collections::BTreeSet;

use aether_agent_reconciler::TcpReason;
use aether_agent_reconciler::pod_events;
use aether_controller::status::Reason;
use served_metrics::{code_metrics, metric_names};

fn doc() -> String {
    std::fs::read_to_string(aether_tests::repo_root().join("docs/troubleshooting.md")).expect("docs/troubleshooting.md")
}

/// Every condition reason of the controller. The match is exhaustive, so a new variant does not
/// compile until it is listed here (and then the doc test below wants its entry).
fn controller_reasons() -> Vec<&'static str> {
    let all = [Reason::Accepted, Reason::AcceptedWithoutService, Reason::Invalid, Reason::Conflicted];
    for r in all {
        match r {
            Reason::Accepted | Reason::AcceptedWithoutService | Reason::Invalid | Reason::Conflicted => {}
        }
    }
    all.iter().map(|r| r.as_str()).collect()
}

/// Every Event reason the agent puts on pods.
fn agent_reasons() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = TcpReason::ALL.iter().map(|r| r.event_reason()).collect();
    out.extend([
        pod_events::DELIVERED_REASON,
        pod_events::INBOUND_BIND_FAILED_REASON,
        pod_events::INBOUND_NO_NETNS_REASON,
    ]);
    out
}

/// The entries of a `## ` section: (names in backticks in the `### ` heading, the entry's text).
fn entries(doc: &str, section: &str) -> Vec<(Vec<String>, String)> {
    let start = doc.find(&format!("\n## {section}\n")).unwrap_or_else(|| panic!("no `## {section}` section"));
    let body = &doc[start + 1..];
    let body = &body[body.find('\n').map_or(0, |i| i + 1)..];
    let body = body.find("\n## ").map_or(body, |end| &body[..end]);
    let mut out = Vec::new();
    for chunk in body.split("\n### ").skip(1) {
        let (heading, text) = chunk.split_once('\n').unwrap_or((chunk, ""));
        let names = heading.split('`').skip(1).step_by(2).map(str::to_owned).collect();
        out.push((names, text.to_owned()));
    }
    out
}

fn check(section: &str, defined: &BTreeSet<String>, entry_must: impl Fn(&str, &str) -> Vec<String>) {
    let doc = doc();
    let entries = entries(&doc, section);
    let mut documented = BTreeSet::new();
    let mut problems = Vec::new();
    for (names, text) in &entries {
        if names.is_empty() {
            problems.push(format!("a `### ` heading in `## {section}` names nothing in backticks"));
        }
        for name in names {
            if !defined.contains(name) {
                problems.push(format!("`{name}` is documented but the code defines no such name"));
            }
            if !documented.insert(name.clone()) {
                problems.push(format!("`{name}` has two entries"));
            }
            problems.extend(entry_must(name, text));
        }
    }
    for name in defined.difference(&documented) {
        problems.push(format!("`{name}` has no entry"));
    }
    assert!(problems.is_empty(), "docs/troubleshooting.md, `## {section}`:\n{}", problems.join("\n"));
}

/// An entry says what it means, how to see it and what to do.
fn parts(name: &str, text: &str) -> Vec<String> {
    ["**Means**", "**See it**", "**Fix**"]
        .iter()
        .filter(|p| !text.contains(*p))
        .map(|p| format!("`{name}`: the entry lacks {p}"))
        .collect()
}

#[test]
fn every_pod_event_reason_of_the_agent_has_an_entry_with_its_kubectl_command() {
    let defined: BTreeSet<String> = agent_reasons().into_iter().map(str::to_owned).collect();
    assert_eq!(defined.len(), TcpReason::ALL.len() + 3, "distinct Event reasons");
    check("Pod Events", &defined, |name, text| {
        let mut p = parts(name, text);
        // A fallback's entry states the code's own remedy (`TcpReason::remedy`), so the two
        // cannot disagree.
        let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if let Some(r) = TcpReason::ALL.iter().find(|r| r.event_reason() == name)
            && !flat.contains(r.remedy())
        {
            p.push(format!("`{name}`: the entry lacks the agent's remedy {:?}", r.remedy()));
        }
        if !text.contains(&format!("--field-selector reason={name}")) {
            p.push(format!("`{name}`: the entry lacks `kubectl get events --field-selector reason={name}`"));
        }
        p
    });
}

#[test]
fn every_node_event_reason_of_the_agent_has_an_entry_with_its_kubectl_command() {
    let defined: BTreeSet<String> = [aether_agent_reconciler::kernel::GAP_REASON.to_owned()].into();
    check("Node Events", &defined, |name, text| {
        let mut p = parts(name, text);
        if !text.contains(&format!("--field-selector reason={name}")) {
            p.push(format!("`{name}`: the entry lacks `kubectl get events --field-selector reason={name}`"));
        }
        p
    });
}

#[test]
fn every_policy_condition_reason_of_the_controller_has_an_entry() {
    let defined: BTreeSet<String> = controller_reasons().into_iter().map(str::to_owned).collect();
    check("EndpointPolicy reasons", &defined, |name, text| {
        let mut p = parts(name, text);
        if !text.contains("kubectl get epol") {
            p.push(format!("`{name}`: the entry lacks `kubectl get epol`"));
        }
        p
    });
}

#[test]
fn every_metric_of_both_binaries_has_an_entry() {
    let defined = code_metrics();
    assert!(defined.contains("aether_build_info") && defined.contains("aether_agent_pods"), "{defined:?}");
    check("Metrics", &defined, parts);
}

/// The parser above reads what it should: a made-up section with a typo and a gap is refused.
#[test]
fn a_missing_or_unknown_entry_is_refused() {
    let doc = "# T\n\n## S\n\n### `a`, `b`\n**Means** x **See it** y **Fix** z\n\n### `c`\ntext\n\n## Next\n";
    let got = entries(doc, "S");
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].0, ["a", "b"]);
    assert_eq!(parts("c", &got[1].1).len(), 3);
    let text = "# HELP x_total .\n# TYPE x counter\n# TYPE y gauge\n# TYPE z histogram\n# TYPE aether_build info\n";
    let names: Vec<String> = metric_names(text).into_iter().collect();
    assert_eq!(names, ["aether_build_info", "x_total", "y", "z"]);
}
