//! The chart READMEs are generated (`make chart-docs`, `tools/chart-readme`) from each
//! chart's `values.yaml` and `values.schema.json`: they must not drift from what the generator
//! writes, and every value must have a schema description. No control plane needed.

use std::path::PathBuf;

use aether_chart_readme as readme;

fn chart_dir(name: &str) -> PathBuf {
    aether_tests::repo_root().join("charts").join(name)
}

fn read(dir: &std::path::Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{}: {e}", dir.join(file).display()))
}

const CHARTS: [&str; 2] = ["aether", "aether-crds"];

#[test]
fn every_value_of_both_charts_has_a_schema_description() {
    for name in CHARTS {
        let dir = chart_dir(name);
        let (values, schema) = (read(&dir, "values.yaml"), read(&dir, "values.schema.json"));
        let chart = readme::Chart { chart_yaml: "", values_yaml: &values, schema_json: &schema };
        let groups = readme::groups(&chart).unwrap_or_else(|e| panic!("{name}: {e}"));
        let missing = readme::undescribed(&groups);
        assert!(missing.is_empty(), "charts/{name}/values.schema.json: add a `description` to: {}", missing.join(", "));
    }
}

#[test]
fn the_chart_readmes_are_what_make_chart_docs_writes() {
    for name in CHARTS {
        let dir = chart_dir(name);
        let (meta, values, schema) =
            (read(&dir, "Chart.yaml"), read(&dir, "values.yaml"), read(&dir, "values.schema.json"));
        let want = readme::render(&readme::Chart { chart_yaml: &meta, values_yaml: &values, schema_json: &schema })
            .unwrap_or_else(|e| panic!("{e}"));
        let got = std::fs::read_to_string(dir.join("README.md")).unwrap_or_default();
        assert!(got == want, "charts/{name}/README.md differs from the generator's output: run `make chart-docs`");
    }
}

/// Every key of `values.yaml` (leaf or group) appears in the README of the aether chart, so the
/// generator cannot skip a value.
#[test]
fn every_key_of_values_yaml_is_documented() {
    fn keys(v: &yaml_serde::Value, path: &str, out: &mut Vec<String>) {
        if let Some(m) = v.as_mapping() {
            for (k, child) in m {
                let key = k.as_str().expect("string keys");
                let p = if path.is_empty() { key.to_owned() } else { format!("{path}.{key}") };
                out.push(p.clone());
                keys(child, &p, out);
            }
        }
    }
    for name in CHARTS {
        let dir = chart_dir(name);
        let (values, schema) = (read(&dir, "values.yaml"), read(&dir, "values.schema.json"));
        let groups = readme::groups(&readme::Chart { chart_yaml: "", values_yaml: &values, schema_json: &schema })
            .expect("the chart's values parse");
        let documented: Vec<&str> = groups
            .iter()
            .flat_map(|g| std::iter::once(g.key.as_str()).chain(g.rows.iter().map(|r| r.key.as_str())))
            .collect();
        let mut all = Vec::new();
        keys(&yaml_serde::from_str(&values).expect("values.yaml parses"), "", &mut all);
        for key in all {
            // A key inside an opaque object (e.g. `controller.resources.limits`) is part of its
            // parent's default.
            let covered = documented.iter().any(|d| {
                key == *d
                    || (key.starts_with(d)
                        && key[d.len()..].starts_with('.')
                        && !d.is_empty()
                        && groups.iter().all(|g| g.key != *d))
            });
            assert!(covered, "charts/{name}: values.yaml key `{key}` is not in the README");
        }
    }
}

const SCHEMA: &str = r##"{
  "definitions": {
    "port": {"type": "integer", "minimum": 1024, "maximum": 65535, "description": "A TCP port."}
  },
  "properties": {
    "mode": {"type": "string", "enum": ["a", "b"], "description": "The mode | pipe."},
    "port": {"$ref": "#/definitions/port"},
    "adminPort": {"$ref": "#/definitions/port", "description": "The admin port."},
    "bare": {"type": "boolean"},
    "unset": {"type": "string", "description": "Not in values.yaml."},
    "box": {
      "type": "object",
      "properties": {"path": {"type": "string", "pattern": "^/", "description": "A path."}},
      "allOf": [{"properties": {"path": {"maxLength": 34}}}]
    },
    "resources": {"type": "object", "description": "Opaque."}
  }
}"##;

const DEMO_CHART: &str = "name: demo\ndescription: A demo.\nhome: https://example.org/demo\nappVersion: \"1.2.3\"\n";

const VALUES: &str = "# -- The mode.\nmode: a\nport: 9090\nbare: true\n# A box of things.\nbox:\n  path: /k\nresources:\n  limits: {memory: 1Mi}\n";

/// The generator's own rules on a small chart: `$ref` descriptions and bounds, `allOf` bounds,
/// schema-only values, opaque objects as one value, and a value without a description refused
/// by name.
#[test]
fn the_generator_reads_refs_allof_and_refuses_a_value_without_description() {
    let chart = readme::Chart { chart_yaml: DEMO_CHART, values_yaml: VALUES, schema_json: SCHEMA };
    let groups = readme::groups(&chart).expect("parses");
    let row = |key: &str| {
        groups.iter().flat_map(|g| &g.rows).find(|r| r.key == key).unwrap_or_else(|| panic!("{key}: no row"))
    };
    assert_eq!(row("port").bounds, "1024 to 65535");
    assert_eq!(row("port").description.as_deref(), Some("A TCP port."));
    assert_eq!(row("box.path").description.as_deref(), Some("A path."));
    assert_eq!(row("adminPort").description.as_deref(), Some("The admin port. A TCP port."));
    assert_eq!(row("mode").bounds, "one of `a`, `b`");
    assert_eq!(row("unset").default, "unset");
    assert_eq!(row("box.path").bounds, "length ≤ 34; pattern `^/`");
    assert_eq!(row("resources").default, r#"{"limits":{"memory":"1Mi"}}"#);
    assert_eq!(readme::undescribed(&groups), ["bare"]);
    let group = groups.iter().find(|g| g.key == "box").expect("box is a group");
    assert_eq!(group.intro.as_deref(), Some("A box of things."));
    let err = readme::render(&chart).expect_err("bare has no description").to_string();
    assert!(err.contains("bare"), "{err}");
    let described =
        SCHEMA.replace(r#""bare": {"type": "boolean"}"#, r#""bare": {"type": "boolean", "description": "On."}"#);
    let text = readme::render(&readme::Chart { schema_json: &described, ..chart }).expect("renders");
    assert!(text.contains("| `mode` | string | `\"a\"` | one of `a`, `b` | The mode \\| pipe. |"), "{text}");
    let unknown = format!("{VALUES}extra: 1\n");
    let err = readme::groups(&readme::Chart { values_yaml: &unknown, ..chart }).expect_err("no schema for extra");
    assert!(err.to_string().contains("extra"), "{err}");
}

/// The README's links are absolute (it travels in the packaged chart): `docs/<page>.md` mentions
/// become links at `<home>/blob/v<appVersion>`, a quoted heading after one its GitHub anchor;
/// mentions in a path, a code span or an existing link stay as they are; no `home` is an error.
#[test]
fn the_generator_links_docs_mentions_at_the_charts_release() {
    let base = "https://example.org/demo/blob/v1.2.3";
    let chart: yaml_serde::Value = yaml_serde::from_str(DEMO_CHART).expect("parses");
    assert_eq!(readme::docs_base(&chart).expect("home and appVersion"), base);
    for (text, want) in [
        ("Caps (docs/listeners.md).", format!("Caps ([docs/listeners.md]({base}/docs/listeners.md)).")),
        (
            "No refusal (docs/design-notes.md, \"Handing the node proxy over\").",
            format!(
                "No refusal ([docs/design-notes.md, \"Handing the node proxy over\"]({base}/docs/design-notes.md#handing-the-node-proxy-over))."
            ),
        ),
        ("see docs/rbac.md", format!("see [docs/rbac.md]({base}/docs/rbac.md)")),
        (
            "x/docs/a.md, `docs/b.md`, [docs/c.md](u), docs/d.txt",
            "x/docs/a.md, `docs/b.md`, [docs/c.md](u), docs/d.txt".to_owned(),
        ),
    ] {
        assert_eq!(readme::link_docs(text, base), want, "{text}");
    }
    assert_eq!(
        readme::github_anchor("Webhook certificates (`webhook.certs.mode`)"),
        "webhook-certificates-webhookcertsmode"
    );
    assert_eq!(readme::github_anchor("Troubleshooting: a watch that fails"), "troubleshooting-a-watch-that-fails");
    let no_home =
        readme::Chart { chart_yaml: "name: demo\nappVersion: \"1\"\n", values_yaml: VALUES, schema_json: SCHEMA };
    let err = readme::render(&no_home).expect_err("no home").to_string();
    assert!(err.contains("home"), "{err}");
}
