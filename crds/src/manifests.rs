//! Multi-document YAML manifests as JSON values: the one reader behind `aether-controller
//! validate -f` and `aether-agent plan --pods/--policies`. It parses text only; each binary
//! reads its files (or standard input) and words its own errors from [`DocumentError`].

use serde_json::Value;

/// A document of the text that is not YAML.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("document {index}: {reason}")]
pub struct DocumentError {
    /// 1-based position of the document in the text, empty documents included.
    pub index: usize,
    /// The YAML parser's message (it gives the line and column).
    pub reason: String,
}

/// The documents of a multi-document YAML text, in order, as `kubectl` reads a manifest file:
/// empty documents (a bare `---`, `null`) are dropped, and a `kind: List` document is replaced
/// by its `items`. A text without any document gives an empty list (whether that is an error is
/// the caller's call).
///
/// # Errors
/// [`DocumentError`] for the first document that is not YAML.
pub fn documents(text: &str) -> Result<Vec<Value>, DocumentError> {
    let mut docs = Vec::new();
    for (i, de) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let v: Value =
            serde::Deserialize::deserialize(de).map_err(|e| DocumentError { index: i + 1, reason: e.to_string() })?;
        match v {
            Value::Null => {}
            Value::Object(ref m) if m.get("kind").and_then(Value::as_str) == Some("List") => {
                docs.extend(m.get("items").and_then(Value::as_array).cloned().unwrap_or_default());
            }
            v => docs.push(v),
        }
    }
    Ok(docs)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn empty_documents_are_dropped_and_a_text_without_any_gives_none() {
        assert_eq!(documents(""), Ok(vec![]));
        assert_eq!(documents("---\n---\nnull\n"), Ok(vec![]));
        assert_eq!(documents("---\na: 1\n---\n---\nb: 2\n"), Ok(vec![json!({"a": 1}), json!({"b": 2})]));
    }

    #[test]
    fn a_list_is_replaced_by_its_items_in_place() {
        let text = "kind: Pod\n---\nkind: List\nitems:\n- {kind: Service}\n- {kind: Pod}\n---\nkind: List\n---\nx: 1\n";
        assert_eq!(
            documents(text),
            Ok(vec![json!({"kind": "Pod"}), json!({"kind": "Service"}), json!({"kind": "Pod"}), json!({"x": 1})])
        );
    }

    #[test]
    fn the_error_names_the_document_counting_empty_ones() {
        let e = documents("a: 1\n---\n---\nb: [\n").unwrap_err();
        assert_eq!(e.index, 3, "the empty second document counts");
        assert!(e.reason.contains("line 5"), "{}", e.reason);
        assert_eq!(e.to_string(), format!("document 3: {}", e.reason));
    }
}
