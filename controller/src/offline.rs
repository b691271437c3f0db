//! `aether-controller validate`: the webhook's decision, offline, for GitOps CI.
//!
//! Reads multi-document YAML files (a `List` kind is expanded), decides every EndpointPolicy
//! with [`aether_crds::review`] (the webhook's function), gives the webhook's warnings for what
//! it can see offline (other policies among the given files targeting the same Service, a socket
//! value within 2 bytes of the sun_path budget; not a missing Service), and lists other documents
//! as skipped. `--kubelet-pods-dir` and `--socket-limit` select the rules, as for `run`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use aether_crds::policy::EndpointPolicySpec;
use aether_crds::tiebreak::ServiceKey;
use aether_crds::udspath::Budget;
use aether_crds::{manifests, policy};
use serde::Serialize;
use serde_json::Value;

use crate::cli::flags::{Output, ValidateArgs};
use crate::warnings::{self, Rival};

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
    #[error("cannot read {path}: {error}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error. Its text ends the message, so it is not also the `source()`: a printed
        /// cause chain shows it once.
        error: std::io::Error,
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
    /// The files hold no document at all (like `kubectl apply`'s "no objects passed"): most
    /// likely a wrong path or an empty render, which must not pass CI silently.
    #[error("no objects passed to validate: {0} hold no YAML document")]
    Empty(String),
}

/// `aether-controller validate`: decides the documents of `-f` and prints the outcomes. Exit
/// code 0: all allowed (or skipped); 1: any denied; 2: an unusable `--kubelet-pods-dir`, or input
/// that cannot be read or parsed or holds no document (the reason on standard error).
pub fn validate(args: &ValidateArgs) -> ExitCode {
    let rules = args.pods_dir.rules();
    let budget = match rules.budget() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: --kubelet-pods-dir: {e}");
            return ExitCode::from(2);
        }
    };
    let docs = match read_documents(&args.files) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let outcomes = decide_all(&docs, budget);
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&outcomes).expect("outcomes serialize")),
        Output::Text => print!("{}", render_plain(&outcomes)),
    }
    ExitCode::from(exit_code(&outcomes) as u8)
}

/// Reads every document of every file (`-` is standard input), each with the file's name; the
/// documents are split by [`aether_crds::manifests::documents`].
///
/// # Errors
/// [`InputError`] naming the file (and document) that cannot be read or parsed, or all of them
/// when they hold no document.
pub fn read_documents(files: &[PathBuf]) -> Result<Vec<(String, Value)>, InputError> {
    let mut docs = Vec::new();
    for path in files {
        let name = path.display().to_string();
        let text = if path == Path::new("-") {
            std::io::read_to_string(std::io::stdin())
        } else {
            std::fs::read_to_string(path)
        }
        .map_err(|error| InputError::Read { path: name.clone(), error })?;
        let found = manifests::documents(&text).map_err(|e| InputError::Parse {
            path: name.clone(),
            doc: e.index,
            reason: e.reason,
        })?;
        docs.extend(found.into_iter().map(|v| (name.clone(), v)));
    }
    if docs.is_empty() {
        let names: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
        return Err(InputError::Empty(names.join(", ")));
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
    warn_like_the_webhook(docs, budget, &mut out);
    out
}

/// The webhook's warnings ([`warnings::for_allowed_policy`]) for every allowed policy, with the
/// other given documents as the only rivals (denied ones count as invalid rivals) and no
/// missing-Service warning (offline, Services are unknown).
fn warn_like_the_webhook(docs: &[(String, Value)], budget: &Budget, out: &mut [Outcome]) {
    let key_of = |i: usize| -> Option<ServiceKey> {
        let target = text(&docs[i].1, "/spec/targetRef/name")?;
        Some(ServiceKey::new(out[i].namespace.clone().unwrap_or_else(|| "default".to_owned()), target))
    };
    let policies: Vec<(usize, ServiceKey)> =
        (0..out.len()).filter(|i| out[*i].allowed.is_some()).filter_map(|i| Some((i, key_of(i)?))).collect();
    let mut found: Vec<(usize, Vec<String>)> = Vec::new();
    for (i, key) in &policies {
        if out[*i].allowed != Some(true) {
            continue;
        }
        // Allowed means it passed review, so the spec deserializes.
        let Some(spec) =
            docs[*i].1.get("spec").and_then(|s| serde_json::from_value::<EndpointPolicySpec>(s.clone()).ok())
        else {
            continue;
        };
        let rivals: Vec<Rival<'_>> = policies
            .iter()
            .filter(|(j, k)| j != i && k == key)
            .map(|(j, _)| Rival { name: out[*j].name.as_str(), valid: out[*j].allowed == Some(true) })
            .collect();
        let texts = warnings::for_allowed_policy(&out[*i].name, &key.namespace, &spec, Some(&rivals), None, budget)
            .into_iter()
            .map(|w| w.text)
            .collect();
        found.push((*i, texts));
    }
    for (i, texts) in found {
        out[i].warnings.extend(texts);
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
