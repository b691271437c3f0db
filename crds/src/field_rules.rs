//! The check of each string field of an EndpointPolicy spec, as garde custom validators with the
//! [`Budget`] as context: the socket value against the configured pods dir and socket limit
//! (which the CRD schema cannot know), and the target's group, kind and Service name. The spec's
//! fields name them (`#[garde(custom(...))]` in [`crate::policy`]); [`crate::validate`] runs them
//! and turns their errors into field violations.
//!
//! A message quotes the value it refuses, cut at 64 bytes with its full length stated, so that a
//! denial never echoes megabytes back.

use crate::udspath::{self, Budget, SocketLimit};

/// Longest value quoted in full in a message; longer ones are cut (a denial or log line must not
/// echo megabytes back).
const SHOWN_BYTES: usize = 64;

/// `value` quoted for a message, cut at [`SHOWN_BYTES`] with its full length stated.
fn shown(value: &str) -> String {
    if value.len() <= SHOWN_BYTES {
        return format!("{value:?}");
    }
    let mut end = SHOWN_BYTES;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}... ({} bytes)", &value[..end], value.len())
}

pub(crate) fn socket_rule(value: &str, budget: &Budget) -> garde::Result {
    let longest = budget.limit().longest_value();
    if value.len() > longest.max(SHOWN_BYTES) {
        let why = match budget.limit() {
            SocketLimit::SunPath => {
                format!("the budget here is {} bytes with pods dir {}", budget.bytes(), budget.pods_dir())
            }
            SocketLimit::Filesystem => format!(
                "a {}-byte volume, '/' and a {}-byte file: the file system's limits; --socket-limit filesystem",
                udspath::VOLUME_NAME_MAX,
                udspath::NAME_MAX
            ),
        };
        return Err(garde::Error::new(format!(
            "{} is too long: no socket value can exceed {longest} bytes ({why})",
            shown(value)
        )));
    }
    budget.check(value).map(|_| ()).map_err(|e| garde::Error::new(format!("{} {e}", shown(value))))
}

pub(crate) fn group_rule(value: &str, _: &Budget) -> garde::Result {
    match value {
        "" | "core" => Ok(()),
        _ => Err(garde::Error::new(format!(
            "{} is not allowed: the target must be in the core group, written \"\" or \"core\"",
            shown(value)
        ))),
    }
}

pub(crate) fn kind_rule(value: &str, _: &Budget) -> garde::Result {
    if value == "Service" {
        Ok(())
    } else {
        Err(garde::Error::new(format!(
            "{} is not allowed: an EndpointPolicy attaches to kind \"Service\" only (case-sensitive)",
            shown(value)
        )))
    }
}

/// True when `s` is a DNS-1035 label (Service names): 1–63 bytes of `[a-z0-9-]`, starting with
/// a letter and ending with a letter or digit (Kubernetes API conventions).
pub fn is_dns1035_label(s: &str) -> bool {
    udspath::is_dns1123_label(s) && s.as_bytes()[0].is_ascii_lowercase()
}

pub(crate) fn service_name_rule(value: &str, _: &Budget) -> garde::Result {
    if is_dns1035_label(value) {
        Ok(())
    } else {
        Err(garde::Error::new(format!(
            "{} is not a valid Service name: a DNS-1035 label is 1-63 of lowercase a-z, 0-9 and '-', starting with a letter and ending with a letter or digit",
            shown(value)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_value_is_cut_in_the_message_with_its_length() {
        let budget = Budget::new(udspath::DEFAULT_PODS_DIR).unwrap();
        let huge = "a".repeat(2_500_000);
        let msg = socket_rule(&huge, &budget).unwrap_err().to_string();
        assert!(msg.len() < 300, "{} bytes", msg.len());
        assert!(msg.contains("(2500000 bytes)") && msg.contains("36 bytes"), "{msg}");
        let msg = kind_rule(&"é".repeat(100), &budget).unwrap_err().to_string();
        assert!(msg.contains("(200 bytes)"), "{msg}");
    }

    #[test]
    fn under_the_file_system_limit_a_huge_value_is_cut_and_names_the_319_byte_limit() {
        let budget = Budget::with_limit(udspath::DEFAULT_PODS_DIR, SocketLimit::Filesystem).unwrap();
        let msg = socket_rule(&"a".repeat(2_500_000), &budget).unwrap_err().to_string();
        assert!(msg.len() < 300, "{} bytes", msg.len());
        assert!(msg.contains("(2500000 bytes)") && msg.contains("exceed 319 bytes"), "{msg}");
        assert!(msg.contains("--socket-limit filesystem"), "{msg}");
        // 320 bytes of good grammar: over the longest value, refused before the file's check.
        let value = format!("{}/{}", "v".repeat(63), "f".repeat(256));
        assert_eq!(value.len(), 320);
        assert!(socket_rule(&value, &budget).unwrap_err().to_string().contains("exceed 319 bytes"));
    }
}
