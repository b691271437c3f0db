//! `-o text|json|yaml`: the same value printed for people or scripts.

use serde::Serialize;

use crate::cli::Output;

/// `value` as pretty JSON or YAML (each ending in a newline), or `text()` for `-o text`.
pub fn format<T: Serialize>(value: &T, output: Output, text: impl FnOnce() -> String) -> String {
    match output {
        Output::Text => text(),
        Output::Json => serde_json::to_string_pretty(value).expect("our outputs serialize") + "\n",
        Output::Yaml => yaml_serde::to_string(value).expect("our outputs serialize"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_yaml_carry_the_same_fields_and_text_is_the_callers() {
        let v = serde_json::json!({"live": false, "pod": "shop/cart-1"});
        let json: serde_json::Value = serde_json::from_str(&format(&v, Output::Json, String::new)).unwrap();
        let yaml: serde_json::Value = yaml_serde::from_str(&format(&v, Output::Yaml, String::new)).unwrap();
        assert_eq!(json, v);
        assert_eq!(yaml, v);
        assert_eq!(format(&v, Output::Text, || "text\n".into()), "text\n");
    }
}
