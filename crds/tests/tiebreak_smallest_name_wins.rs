//! One policy per Service (spec Phase 1b "Precedence"): among the valid candidates the
//! lexicographically smallest `metadata.name`, in byte order, wins, whatever the input order.

use std::collections::BTreeSet;

use aether_crds::tiebreak::{ServiceKey, winner};
use proptest::prelude::*;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Candidate {
    name: String,
    arrival: usize,
}

fn candidates(names: &[&str]) -> Vec<Candidate> {
    names.iter().enumerate().map(|(arrival, name)| Candidate { name: (*name).to_owned(), arrival }).collect()
}

/// The index hands the tie-break references to the policies it holds.
fn winning_name(names: &[&str]) -> Option<String> {
    let held = candidates(names);
    winner(&held, |c| c.name.as_str()).map(|c| c.name.clone())
}

#[test]
fn no_candidate_no_winner() {
    assert_eq!(winning_name(&[]), None);
}

#[test]
fn single_candidate_wins() {
    assert_eq!(winning_name(&["cart-uds"]).as_deref(), Some("cart-uds"));
}

#[test]
fn smallest_name_wins_in_byte_order_not_natural_order() {
    let table: &[(&[&str], &str)] = &[
        (&["web-b", "web-a"], "web-a"),
        (&["web-9", "web-10"], "web-10"),
        (&["a0", "a.b", "a-b", "a"], "a"),
        (&["a0", "a.b", "a-b"], "a-b"), // '-' (0x2d) < '.' (0x2e) < '0' (0x30)
        (&["b", "Zeta"], "Zeta"),       // uppercase sorts before lowercase in bytes
        (&["z", "\u{e9}"], "z"),        // 'é' is 0xc3 0xa9 in UTF-8, after every ASCII byte
        (&["policy-2", "policy-1", "policy-3"], "policy-1"),
    ];
    for (names, expected) in table {
        assert_eq!(winning_name(names).as_deref(), Some(*expected), "{names:?}");
    }
}

#[test]
fn winner_works_on_references_too() {
    let names = ["c", "a", "b"];
    assert_eq!(winner(names.iter(), |n: &&&str| **n), Some(&"a"));
}

#[test]
fn service_key_displays_as_namespace_slash_name() {
    let key = ServiceKey::new("shop", "cart");
    assert_eq!(key.to_string(), "shop/cart");
    assert_eq!(key, ServiceKey { namespace: "shop".to_owned(), name: "cart".to_owned() });
}

/// Distinct policy names (names are unique within a namespace), shuffled.
fn shuffled_names() -> impl Strategy<Value = (Vec<String>, Vec<String>)> {
    prop::collection::btree_set(prop_oneof![3 => "[a-z0-9][a-z0-9.-]{0,12}", 1 => "\\PC{1,6}"], 1..10)
        .prop_map(|set: BTreeSet<String>| set.into_iter().collect::<Vec<_>>())
        .prop_flat_map(|sorted| (Just(sorted.clone()), Just(sorted).prop_shuffle()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn winner_is_the_byte_smallest_name_in_any_order((sorted, shuffled) in shuffled_names()) {
        let refs: Vec<&str> = shuffled.iter().map(String::as_str).collect();
        let held = candidates(&refs);
        let won = winner(&held, |c| c.name.as_str()).expect("at least one candidate");
        prop_assert_eq!(&won.name, &sorted[0]);
        prop_assert!(shuffled.iter().all(|n| won.name.as_bytes() <= n.as_bytes()));
        // The winning candidate itself is returned, not just its name.
        prop_assert_eq!(&shuffled[won.arrival], &won.name);
    }

    #[test]
    fn winner_does_not_depend_on_input_order((_sorted, shuffled) in shuffled_names(), rotate in 0usize..10) {
        let mut rotated = shuffled.clone();
        rotated.rotate_left(rotate % shuffled.len());
        let mut reversed = shuffled.clone();
        reversed.reverse();
        let pick = |names: &[String]| winner(names.iter(), |n: &&String| n.as_str()).cloned();
        prop_assert_eq!(pick(&shuffled), pick(&rotated));
        prop_assert_eq!(pick(&shuffled), pick(&reversed));
    }
}
