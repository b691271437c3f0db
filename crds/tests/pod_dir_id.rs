//! A pod's directory name under the pods dir is untrusted path input (docs/design-notes.md,
//! "Agent"): only a canonical lowercase UUID or a 32-hex-digit static pod hash becomes a path
//! segment.

use aether_crds::PodDirId;
use aether_crds::udspath::{MIRROR_HASH_BYTES, UID_BYTES};
use proptest::prelude::*;

const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
const MIRROR_HASH: &str = "0123456789abcdef0123456789abcdef";

#[test]
fn lowercase_uuid_is_accepted() {
    let id = PodDirId::new(UID).expect("canonical lowercase UUID");
    assert_eq!(id.as_str(), UID);
    assert_eq!(UID.len(), UID_BYTES);
}

#[test]
fn thirty_two_hex_mirror_hash_is_accepted() {
    let id = PodDirId::new(MIRROR_HASH).expect("32 lowercase hex digits");
    assert_eq!(id.as_str(), MIRROR_HASH);
    assert_eq!(MIRROR_HASH.len(), MIRROR_HASH_BYTES);
}

#[test]
fn placeholder_is_a_valid_uuid() {
    let placeholder = PodDirId::placeholder();
    assert_eq!(PodDirId::new(placeholder.as_str()), Ok(placeholder));
}

#[test]
fn malformed_ids_are_rejected() {
    let uid_with = |i: usize, c: char| {
        let mut s: Vec<char> = UID.chars().collect();
        s[i] = c;
        s.into_iter().collect::<String>()
    };
    let rejected: Vec<(String, &str)> = vec![
        (UID.to_uppercase(), "uppercase UUID"),
        (uid_with(0, 'F'), "one uppercase hex digit"),
        (MIRROR_HASH.to_uppercase(), "uppercase mirror hash"),
        ("..".to_owned(), "parent dir"),
        (".".to_owned(), "current dir"),
        (String::new(), "empty"),
        (UID[..35].to_owned(), "35 chars"),
        (format!("{UID}0"), "37 chars"),
        (MIRROR_HASH[..31].to_owned(), "31 hex"),
        (format!("{MIRROR_HASH}0"), "33 hex"),
        (uid_with(8, '/'), "slash instead of a hyphen"),
        (uid_with(0, '/'), "slash inside"),
        (format!("../{}", &UID[3..]), "traversal, 36 chars"),
        (format!("../../../../../../../../../../{}", &MIRROR_HASH[..2]), "traversal, 32 chars"),
        (format!("/{}", &MIRROR_HASH[1..]), "leading slash, 32 chars"),
        (uid_with(0, 'g'), "non-hex letter"),
        (uid_with(35, '\0'), "NUL"),
        (uid_with(35, '\n'), "newline"),
        (UID.replace('-', "_"), "underscores"),
        ("0f1e2d3c4-b5a-6978-8796-a5b4c3d2e1f0".to_owned(), "hyphen in the wrong place"),
        ("{0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1}".to_owned(), "braces"),
        ("0123456789abcdef0123456789abcde\u{00e9}".to_owned(), "non-ASCII"),
        ("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f\u{FF10}".to_owned(), "full-width digit"),
    ];
    for (id, why) in rejected {
        let err = PodDirId::new(&id).expect_err(why);
        assert_eq!(err.0, id, "{why}");
        assert!(err.to_string().contains("neither a lowercase UUID"), "{why}");
    }
}

#[test]
fn uuid_without_hyphens_is_read_as_a_mirror_hash() {
    // 32 lowercase hex digits are a well-formed static pod hash, whatever they spell.
    assert!(PodDirId::new(&UID.replace('-', "")).is_ok());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn generated_uuids_and_hashes_are_accepted(
        id in prop_oneof![
            "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            "[0-9a-f]{32}",
        ]
    ) {
        prop_assert_eq!(PodDirId::new(&id).map(|i| i.as_str().to_owned()), Ok(id));
    }

    #[test]
    fn accepted_ids_are_single_clean_segments(
        id in prop_oneof![
            any::<String>(),
            "[0-9a-fA-F./-]{30,38}",
            "[0-9a-f]{8}.[0-9a-f]{4}.[0-9a-f]{4}.[0-9a-f]{4}.[0-9a-f]{12}",
        ]
    ) {
        if let Ok(accepted) = PodDirId::new(&id) {
            let s = accepted.as_str();
            prop_assert_eq!(s, id.as_str());
            prop_assert!(s.len() == UID_BYTES || s.len() == MIRROR_HASH_BYTES);
            prop_assert!(s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b) || b == b'-'));
            prop_assert!(!s.contains('/') && s != "." && s != "..");
        }
    }

    #[test]
    fn any_uppercase_hex_digit_is_rejected(
        id in "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}",
        pick in any::<prop::sample::Index>(),
    ) {
        let letters: Vec<usize> = id.char_indices().filter(|(_, c)| c.is_ascii_lowercase()).map(|(i, _)| i).collect();
        prop_assume!(!letters.is_empty());
        let at = letters[pick.index(letters.len())];
        let mut upper = id.clone();
        upper.replace_range(at..=at, &id[at..=at].to_uppercase());
        prop_assert!(PodDirId::new(&upper).is_err(), "{upper:?}");
    }
}
