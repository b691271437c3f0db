//! Properties of the budget and the resolver (docs/workload-requirements.md, "The byte budget";
//! docs/design-notes.md, "Agent"): whatever the value, the resolved path stays inside the pod's
//! own emptyDir volume and fits in sun_path; anything else is an error.

use aether_crds::udspath::{self, EMPTY_DIR_PLUGIN, SUN_PATH_MAX};
use aether_crds::{Budget, PodDirId};
use proptest::prelude::*;

/// Pods dirs: the distros' kubelet ones, a non-ASCII one, the shortest, and random clean paths
/// (some with multi-byte characters) of any length.
fn pods_dir() -> impl Strategy<Value = String> {
    let segment = "[a-z0-9ü日._-]{1,9}".prop_filter("clean segment", |s| s != "." && s != "..");
    prop_oneof![
        Just(udspath::DEFAULT_PODS_DIR.to_owned()),
        Just("/var/lib/k0s/kubelet/pods".to_owned()),
        Just("/var/lib/kübelet/pods".to_owned()),
        Just("/k".to_owned()),
        Just("/".to_owned()),
        prop::collection::vec(segment, 1..6).prop_map(|segs| format!("/{}", segs.join("/"))),
    ]
}

fn pod_dir_id() -> impl Strategy<Value = PodDirId> {
    prop_oneof!["[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "[0-9a-f]{32}",]
        .prop_map(|id| PodDirId::new(&id).expect("generated ids are well-formed"))
}

/// Any string, biased toward what could confuse a path: separators, dots, NUL, look-alikes.
fn socket_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[a-zA-Z0-9./_-]{0,40}",
        "[a-z0-9-]{1,12}/[A-Za-z0-9._-]{1,24}",
        "[a-z0-9.]{0,3}/[.a-z]{0,3}(/[.a-z]{0,3})?",
        "[a-z0-9./\\\\ \\x00\n\u{FF0F}\u{2215}\u{FF0E}%-]{0,20}",
        "\\PC{0,4}/\\PC{0,6}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn resolved_path_stays_in_the_pods_own_empty_dir(dir in pods_dir(), id in pod_dir_id(), value in socket_value()) {
        let Ok(budget) = Budget::new(&dir) else { return Ok(()) };
        let Ok(path) = budget.resolve(&id, &value) else { return Ok(()) };
        let p = path.as_str();
        let base = format!("{}/{}/volumes/{EMPTY_DIR_PLUGIN}/", budget.pods_dir(), id.as_str());

        prop_assert!(p.len() <= SUN_PATH_MAX, "{p:?} is {} bytes", p.len());
        let rest = p.strip_prefix(&base).expect("path starts with <pods-dir>/<uid>/volumes/kubernetes.io~empty-dir/");
        prop_assert_eq!(rest, value.as_str());
        let (volume, file) = rest.split_once('/').expect("<volume>/<file>");
        prop_assert!(udspath::is_dns1123_label(volume), "volume {volume:?}");
        prop_assert!(!file.is_empty() && !file.contains('/'), "exactly one segment after the volume: {file:?}");
        prop_assert_eq!(path.volume_dir(), format!("{base}{volume}"));
        for segment in p.split('/') {
            prop_assert!(segment != "." && segment != "..", "{p:?} has a {segment:?} segment");
        }
        for segment in rest.split('/') {
            prop_assert!(!segment.is_empty(), "empty segment in {rest:?}");
        }
        prop_assert!(!p.contains('\0'));
        prop_assert!(p.is_ascii() || !budget.pods_dir().is_ascii(), "only the pods dir may be non-ASCII: {p:?}");
    }

    #[test]
    fn resolve_fails_exactly_when_grammar_or_budget_fails(dir in pods_dir(), id in pod_dir_id(), value in socket_value()) {
        let Ok(budget) = Budget::new(&dir) else { return Ok(()) };
        let expected_ok = udspath::parse(&value).is_ok() && value.len() <= budget.bytes();
        let resolved = budget.resolve(&id, &value);
        prop_assert_eq!(resolved.is_ok(), expected_ok, "{:?} under {}: {:?}", value, budget.pods_dir(), resolved);
        prop_assert_eq!(budget.check(&value).is_ok(), expected_ok);
    }

    #[test]
    fn value_that_fills_the_budget_gives_a_path_of_exactly_107_bytes_with_a_uid(dir in pods_dir(), id in pod_dir_id()) {
        let Ok(budget) = Budget::new(&dir) else { return Ok(()) };
        let fits = format!("v/{}", "f".repeat(budget.bytes() - 2));
        // The budget reserves 36 bytes for the pod dir; a 32-byte static pod hash leaves 4 spare.
        let spare = udspath::UID_BYTES - id.as_str().len();
        prop_assert_eq!(budget.resolve(&id, &fits).expect("fills the budget").as_str().len(), SUN_PATH_MAX - spare);
        let over = format!("{fits}f");
        let is_too_long = matches!(budget.resolve(&id, &over), Err(udspath::SocketError::TooLong { .. }));
        prop_assert!(is_too_long);
    }

    #[test]
    fn budget_is_107_minus_pods_dir_bytes_minus_70(dir in pods_dir()) {
        let expected = 107 - dir.len() as i64 - 70;
        match Budget::new(&dir) {
            Ok(budget) => {
                prop_assert!(expected >= udspath::MIN_VALUE_BYTES as i64);
                prop_assert_eq!(budget.bytes() as i64, expected);
                prop_assert!(budget.bytes() <= udspath::WIDEST_BUDGET);
            }
            Err(udspath::PodsDirError::BudgetTooSmall { len, budget, .. }) => {
                prop_assert!(expected < udspath::MIN_VALUE_BYTES as i64);
                prop_assert_eq!(len, dir.len());
                prop_assert_eq!(budget, expected);
            }
            Err(e) => prop_assert!(false, "clean pods dir {dir:?} rejected: {e}"),
        }
    }

    #[test]
    fn any_pods_dir_string_is_either_rejected_or_clean(dir in prop_oneof![any::<String>(), "[/a-z.\\x00]{0,12}"]) {
        if let Ok(budget) = Budget::new(&dir) {
            let d = budget.pods_dir();
            prop_assert!(d.starts_with('/') && !d.contains('\0'), "{d:?}");
            prop_assert!(d == "/" || d[1..].split('/').all(|s| !s.is_empty() && s != "." && s != ".."), "{d:?}");
            prop_assert!(budget.bytes() >= udspath::MIN_VALUE_BYTES);
        }
    }
}
