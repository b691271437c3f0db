//! One policy per Service (spec Phase 1b "Precedence"): among the valid candidates the
//! lexicographically smallest `metadata.name`, in byte order, wins, whatever the input order;
//! invalid candidates never win.

use std::collections::BTreeSet;

use aether_crds::tiebreak::{Resolution, ServiceKey, resolve};
use proptest::prelude::*;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Candidate {
    name: String,
    arrival: usize,
}

fn candidates(names: &[&str]) -> Vec<Candidate> {
    names.iter().enumerate().map(|(arrival, name)| Candidate { name: (*name).to_owned(), arrival }).collect()
}

/// Every candidate valid: the winner alone.
fn winner<'c>(held: impl IntoIterator<Item = &'c Candidate>) -> Option<&'c Candidate> {
    resolve(held, |c| c.name.as_str(), |_| true).winner
}

/// The index hands the tie-break references to the policies it holds.
fn winning_name(names: &[&str]) -> Option<String> {
    let held = candidates(names);
    winner(&held).map(|c| c.name.clone())
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
    assert_eq!(resolve(names.iter(), |n| n, |_| true).winner, Some(&"a"));
}

#[test]
fn an_invalid_candidate_never_wins_and_never_shadows_a_valid_one() {
    let r = resolve([("a", false), ("c", true), ("b", true), ("0", false)], |c| c.0, |c| c.1);
    assert_eq!(
        r,
        Resolution {
            winner: Some(("b", true)),
            conflicted: vec![("c", true)],
            invalid: vec![("0", false), ("a", false)]
        }
    );
    assert!(r.is_conflict());
    let none = resolve([("a", false)], |c| c.0, |c| c.1);
    assert_eq!((none.winner, none.conflicted.len(), none.invalid.len()), (None, 0, 1));
    assert!(!none.is_conflict());
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
        let won = winner(&held).expect("at least one candidate");
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
        let pick = |names: &[String]| resolve(names.iter(), |n| n.as_str(), |_| true).winner.cloned();
        prop_assert_eq!(pick(&shuffled), pick(&rotated));
        prop_assert_eq!(pick(&shuffled), pick(&reversed));
    }
}

/// Distinct names, each valid or not.
fn judged_names() -> impl Strategy<Value = Vec<(String, bool)>> {
    prop::collection::btree_map("[a-z0-9][a-z0-9.-]{0,8}", any::<bool>(), 0..10)
        .prop_map(|m| m.into_iter().collect::<Vec<_>>())
        .prop_shuffle()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn the_winner_is_the_smallest_valid_name_and_every_candidate_lands_once(judged in judged_names()) {
        let r = resolve(judged.iter(), |c| c.0.as_str(), |c| c.1);
        let smallest_valid = judged.iter().filter(|c| c.1).map(|c| &c.0).min();
        prop_assert_eq!(r.winner.map(|c| &c.0), smallest_valid);
        prop_assert!(r.conflicted.iter().all(|c| c.1) && r.invalid.iter().all(|c| !c.1));
        prop_assert_eq!(r.winner.iter().count() + r.conflicted.len() + r.invalid.len(), judged.len());
        prop_assert!(r.conflicted.windows(2).all(|w| w[0].0 < w[1].0) && r.invalid.windows(2).all(|w| w[0].0 < w[1].0));
    }
}
