//! `aether-controller validate`: the webhook's decision, offline, for GitOps CI.
//!
//! Reads multi-document YAML files (a `List` kind is expanded), decides every EndpointPolicy
//! with [`aether_crds::review`] (the webhook's function), warns about several policies targeting
//! one Service among the given files, and lists other documents as skipped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use aether_crds::policy;
use aether_crds::tiebreak::{self, ServiceKey};
use aether_crds::udspath::Budget;
use serde::Serialize;
use serde_json::Value;

/// The outcome for one document.
#[derive(Debug, Serialize, PartialEq)]
pub struct Outcome {
    /// The document's kind (empty when it has none).
    pub kind: String,
    /// `metadata.namespace`, when given.
    pub namespace: Option<String>,
    /// `metadata.name`.
    pub name: String,
    /// `true`/`false` for an EndpointPolicy; `null` for a skipped document.
    pub allowed: Option<bool>,
    /// The denial reason, or why the document was skipped.
    pub message: Option<String>,
    /// Warnings, as the webhook would return them.
    pub warnings: Vec<String>,
    /// True when the document is not an EndpointPolicy and was not decided.
    pub skipped: bool,
    /// The file it came from.
    pub file: String,
}

/// Input that cannot be read or parsed: exit code 2.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not YAML.
    #[error("cannot parse {path} as YAML (document {doc}): {reason}")]
    Parse {
        /// The file.
        path: String,
        /// 1-based document index.
        doc: usize,
        /// The parser's message.
        reason: String,
    },
}

/// Reads every document of every file (`-` is standard input).
///
/// # Errors
/// [`InputError`] naming the file (and document) that cannot be read or parsed.
pub fn read_documents(files: &[PathBuf]) -> Result<Vec<(String, Value)>, InputError> {
    let mut docs = Vec::new();
    for path in files {
        let name = path.display().to_string();
        let text = if path == Path::new("-") {
            std::io::read_to_string(std::io::stdin())
        } else {
            std::fs::read_to_string(path)
        }
        .map_err(|source| InputError::Read { path: name.clone(), source })?;
        for (i, de) in yaml_serde::Deserializer::from_str(&text).enumerate() {
            let v: Value = serde::Deserialize::deserialize(de).map_err(|e| InputError::Parse {
                path: name.clone(),
                doc: i + 1,
                reason: e.to_string(),
            })?;
            match v {
                Value::Null => {}
                Value::Object(ref m) if m.get("kind").and_then(Value::as_str) == Some("List") => {
                    let items = m.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
                    docs.extend(items.into_iter().map(|it| (name.clone(), it)));
                }
                v => docs.push((name.clone(), v)),
            }
        }
    }
    Ok(docs)
}

fn text(v: &Value, ptr: &str) -> Option<String> {
    v.pointer(ptr).and_then(Value::as_str).map(str::to_owned)
}

/// Decides every document against `budget`.
pub fn decide_all(docs: &[(String, Value)], budget: &Budget) -> Vec<Outcome> {
    let mut out: Vec<Outcome> = docs
        .iter()
        .map(|(file, doc)| {
            let kind = text(doc, "/kind").unwrap_or_default();
            let api_version = text(doc, "/apiVersion").unwrap_or_default();
            let mut o = Outcome {
                kind: kind.clone(),
                namespace: text(doc, "/metadata/namespace"),
                name: text(doc, "/metadata/name").unwrap_or_default(),
                allowed: None,
                message: None,
                warnings: vec![],
                skipped: false,
                file: file.clone(),
            };
            let group = api_version.split_once('/').map(|(g, _)| g);
            if kind != policy::KIND || group != Some(policy::GROUP) {
                o.skipped = true;
                o.message = Some(format!(
                    "not an {} {}/{} (apiVersion {api_version:?}, kind {kind:?})",
                    policy::KIND,
                    policy::GROUP,
                    policy::VERSION
                ));
                return o;
            }
            if api_version != format!("{}/{}", policy::GROUP, policy::VERSION) {
                o.allowed = Some(false);
                o.message = Some(format!(
                    "apiVersion {api_version:?} is not served; use {}/{}",
                    policy::GROUP,
                    policy::VERSION
                ));
                return o;
            }
            let verdict = aether_crds::review(doc, budget);
            o.allowed = Some(verdict.allowed());
            o.message = verdict.message();
            o
        })
        .collect();
    warn_shared_targets(docs, &mut out);
    out
}

/// Several allowed policies targeting one Service: only the smallest name applies.
fn warn_shared_targets(docs: &[(String, Value)], out: &mut [Outcome]) {
    let mut by_service: BTreeMap<ServiceKey, Vec<usize>> = BTreeMap::new();
    for (i, o) in out.iter().enumerate() {
        if o.allowed == Some(true)
            && let Some(target) = text(&docs[i].1, "/spec/targetRef/name")
        {
            let ns = o.namespace.clone().unwrap_or_else(|| "default".to_owned());
            by_service.entry(ServiceKey::new(ns, target)).or_default().push(i);
        }
    }
    for (key, idx) in by_service.into_iter().filter(|(_, v)| v.len() > 1) {
        let names: Vec<&str> = idx.iter().map(|i| out[*i].name.as_str()).collect();
        let Some(win) = tiebreak::winner(names.iter().copied(), |n| n) else { continue };
        let warning = format!(
            "policies {} all target Service {key}; only {win:?} applies (the lexicographically smallest name wins), the others are conflicted",
            names.join(", ")
        );
        for i in idx {
            out[i].warnings.push(warning.clone());
        }
    }
}

/// The exit code for a set of outcomes: 0 all allowed (or skipped), 1 any denied.
pub fn exit_code(outcomes: &[Outcome]) -> i32 {
    if outcomes.iter().any(|o| o.allowed == Some(false)) { 1 } else { 0 }
}

/// Human-readable report, one line per document and a summary.
pub fn render_plain(outcomes: &[Outcome]) -> String {
    let mut s = String::new();
    for o in outcomes {
        let id = match &o.namespace {
            Some(ns) => format!("{}/{ns}/{}", o.kind.to_lowercase(), o.name),
            None => format!("{}/{}", o.kind.to_lowercase(), o.name),
        };
        let (tag, msg) = match o.allowed {
            Some(true) => ("ALLOWED", String::new()),
            Some(false) => ("DENIED ", format!(": {}", o.message.as_deref().unwrap_or(""))),
            None => ("SKIPPED", format!(": {}", o.message.as_deref().unwrap_or(""))),
        };
        s.push_str(&format!("{tag} {id} ({}){msg}\n", o.file));
        for w in &o.warnings {
            s.push_str(&format!("        warning: {w}\n"));
        }
    }
    let count = |f: &dyn Fn(&Outcome) -> bool| outcomes.iter().filter(|o| f(o)).count();
    s.push_str(&format!(
        "{} allowed, {} denied, {} skipped\n",
        count(&|o| o.allowed == Some(true)),
        count(&|o| o.allowed == Some(false)),
        count(&|o| o.skipped)
    ));
    s
}
