//! What one delta response carries, as pure functions of what the client holds and the set the
//! server serves now: [`Subscription`] (which names a stream asked for), [`Held`] (the versions
//! the client has) and [`plan`] (the resources to send and the names to remove).
//!
//! Rules (the xDS protocol's incremental variant, envoyproxy.io "xDS REST and gRPC protocol",
//! section "Incremental xDS"):
//! - a stream's first request of a type with an empty `resource_names_subscribe` subscribes to
//!   every resource of the type (the legacy wildcard); `*` subscribes to every resource at any
//!   time, `*` in `resource_names_unsubscribe` ends that;
//! - the server sends a resource when the client does not hold its current version, and must
//!   send every name listed in `resource_names_subscribe` even if the client holds it;
//! - a name the client holds that the server no longer has goes in `removed_resources`, and so
//!   does a name subscribed explicitly that the server does not have (the client then knows it
//!   does not exist instead of waiting for it).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::super::resource_set::{Served, SetKey};

/// The wildcard resource name.
pub const WILDCARD: &str = "*";

/// One type's subscription on one delta stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subscription {
    /// Subscribed to every resource of the type.
    pub wildcard: bool,
    /// Names subscribed explicitly (never [`WILDCARD`]).
    pub names: BTreeSet<String>,
}

impl Subscription {
    /// Applies one request's `resource_names_subscribe` and `resource_names_unsubscribe`;
    /// `first`: the stream's first request of this type. Returns the names (re)subscribed
    /// explicitly, which the next response must carry whether the client holds them or not.
    pub fn apply(&mut self, first: bool, subscribe: &[String], unsubscribe: &[String]) -> BTreeSet<String> {
        if first && subscribe.is_empty() {
            self.wildcard = true;
        }
        let mut forced = BTreeSet::new();
        for name in subscribe {
            if name == WILDCARD {
                self.wildcard = true;
            } else {
                self.names.insert(name.clone());
                forced.insert(name.clone());
            }
        }
        for name in unsubscribe {
            if name == WILDCARD {
                self.wildcard = false;
            } else {
                self.names.remove(name);
                forced.remove(name);
            }
        }
        forced
    }

    /// Whether resource `name` is subscribed (explicitly or by the wildcard).
    pub fn covers(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }

    /// Whether anything is subscribed.
    pub fn is_empty(&self) -> bool {
        !self.wildcard && self.names.is_empty()
    }
}

/// The resources of one type a client holds: name → the version it got from this server (or
/// from a previous one: a new stream's `initial_resource_versions`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held(HashMap<String, String>);

impl Held {
    /// What a new stream's client says it holds (`initial_resource_versions`).
    pub fn from_initial(versions: HashMap<String, String>) -> Held {
        Held(versions)
    }

    /// The version of `name` the client holds.
    pub fn version(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// Number of resources held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Records a response built from `plan` over `current` as delivered: the client holds the
    /// sent versions and none of the removed names.
    pub fn record<V: Versioned + Clone>(&mut self, current: &imbl::OrdMap<SetKey, V>, plan: &Plan) {
        for key in &plan.send {
            if let Some(v) = current.get(key) {
                self.0.insert(key.0.clone(), v.version().to_owned());
            }
        }
        for name in &plan.removed {
            self.0.remove(name);
        }
    }

    /// Forgets `names` (the client dropped them, or rejected the response that carried them:
    /// its state is unknown, so the next response of the type carries them again).
    pub fn forget<'a>(&mut self, names: impl IntoIterator<Item = &'a String>) {
        for name in names {
            self.0.remove(name);
        }
    }
}

/// One delta response's content, before encoding.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Keys into the current set of the resources to send, in the set's (name) order.
    pub send: Vec<SetKey>,
    /// Names for `removed_resources`, sorted.
    pub removed: Vec<String>,
}

impl Plan {
    /// Whether the response would carry nothing.
    pub fn is_empty(&self) -> bool {
        self.send.is_empty() && self.removed.is_empty()
    }
}

/// A served resource's delta version.
pub trait Versioned {
    /// The version (a content hash).
    fn version(&self) -> &str;
}

impl Versioned for String {
    fn version(&self) -> &str {
        self
    }
}

impl Versioned for Arc<Served> {
    fn version(&self) -> &str {
        &self.version
    }
}

/// What to send a client holding `held`, subscribed as `subscription`, so that it holds the
/// subscribed part of `current` (by [`SetKey`], i.e. by name): every subscribed resource whose
/// version the client does not hold or that is in `forced`, and the removal of every held name
/// `current` lacks and of every forced name `current` lacks.
///
/// `candidates` limits the names looked at (with `forced` always added): the names that can
/// differ since the client was last brought up to date (what changed in the set since then, and
/// names whose held state moved outside a response). `None` looks at every name of `current`,
/// of `held` and of `forced` (a new subscription). Cost: O((candidates + forced) · log n), or
/// O(n) for `None`.
pub fn plan<V: Versioned + Clone>(
    held: &Held,
    current: &imbl::OrdMap<SetKey, V>,
    subscription: &Subscription,
    forced: &BTreeSet<String>,
    candidates: Option<&BTreeSet<String>>,
) -> Plan {
    let names: BTreeSet<&str> = match candidates {
        Some(c) => c.iter().chain(forced).map(String::as_str).collect(),
        None => current
            .keys()
            .map(|(n, _)| n.as_str())
            .chain(held.0.keys().map(String::as_str))
            .chain(forced.iter().map(String::as_str))
            .collect(),
    };
    let mut plan = Plan::default();
    for name in names {
        let mut present = false;
        for (key, v) in current.range((name.to_owned(), 0)..=(name.to_owned(), u32::MAX)) {
            present = true;
            if subscription.covers(name) && (forced.contains(name) || held.version(name) != Some(v.version())) {
                plan.send.push(key.clone());
            }
        }
        if !present && (held.version(name).is_some() || forced.contains(name)) {
            plan.removed.push(name.to_owned());
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    type Set = imbl::OrdMap<SetKey, String>;

    fn set(pairs: &[(&str, &str)]) -> Set {
        pairs.iter().map(|(n, v)| (((*n).to_owned(), 0), (*v).to_owned())).collect()
    }

    fn names(_current: &Set, plan: &Plan) -> Vec<String> {
        plan.send.iter().map(|(n, _)| n.clone()).collect()
    }

    /// [`super::plan`] over every name.
    fn plan(held: &Held, current: &Set, subscription: &Subscription, forced: &BTreeSet<String>) -> Plan {
        super::plan(held, current, subscription, forced, None)
    }

    fn wildcard() -> Subscription {
        let mut s = Subscription::default();
        s.apply(true, &[], &[]);
        s
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn an_empty_first_request_or_a_star_subscribes_to_everything_and_names_are_forced() {
        assert!(wildcard().wildcard && wildcard().covers("anything"));
        let mut s = Subscription::default();
        let forced = s.apply(true, &strings(&["checks"]), &[]);
        assert!(!s.wildcard && s.covers("checks") && !s.covers("other"));
        assert_eq!(forced.into_iter().collect::<Vec<_>>(), ["checks"]);
        // A later empty request (an ACK) changes nothing.
        assert!(s.apply(false, &[], &[]).is_empty());
        assert!(!s.wildcard);
        s.apply(false, &strings(&["*"]), &strings(&["checks"]));
        assert!(s.wildcard && s.names.is_empty());
        s.apply(false, &[], &strings(&["*"]));
        assert!(s.is_empty());
    }

    #[test]
    fn a_fresh_client_gets_everything_subscribed() {
        let current = set(&[("a", "1"), ("b", "1"), ("c", "1")]);
        let p = plan(&Held::default(), &current, &wildcard(), &BTreeSet::new());
        assert_eq!(names(&current, &p), ["a", "b", "c"]);
        assert!(p.removed.is_empty());
        let mut only_b = Subscription::default();
        let forced = only_b.apply(true, &strings(&["b"]), &[]);
        assert_eq!(names(&current, &plan(&Held::default(), &current, &only_b, &forced)), ["b"]);
    }

    #[test]
    fn only_what_changed_is_sent_and_what_is_gone_is_removed() {
        let before = set(&[("a", "1"), ("b", "1"), ("c", "1")]);
        let mut held = Held::default();
        held.record(&before, &plan(&held, &before, &wildcard(), &BTreeSet::new()));
        assert_eq!(held.len(), 3);
        let after = set(&[("a", "1"), ("b", "2"), ("d", "1")]);
        let p = plan(&held, &after, &wildcard(), &BTreeSet::new());
        assert_eq!(names(&after, &p), ["b", "d"]);
        assert_eq!(p.removed, ["c"]);
        held.record(&after, &p);
        assert_eq!((held.version("b"), held.version("c"), held.version("d")), (Some("2"), None, Some("1")));
        assert!(plan(&held, &after, &wildcard(), &BTreeSet::new()).is_empty(), "nothing left to send");
    }

    #[test]
    fn a_reconnecting_client_gets_only_what_changed_since_its_initial_versions() {
        let held = Held::from_initial(
            [("a", "1"), ("b", "1"), ("gone", "1")].into_iter().map(|(n, v)| (n.to_owned(), v.to_owned())).collect(),
        );
        let current = set(&[("a", "1"), ("b", "2"), ("new", "1")]);
        let p = plan(&held, &current, &wildcard(), &BTreeSet::new());
        assert_eq!(names(&current, &p), ["b", "new"]);
        assert_eq!(p.removed, ["gone"]);
    }

    #[test]
    fn a_forced_name_is_sent_even_when_held_and_reported_removed_when_absent() {
        let current = set(&[("checks", "1")]);
        let mut held = Held::default();
        let mut s = Subscription::default();
        let forced = s.apply(true, &strings(&["checks", "missing"]), &[]);
        let p = plan(&held, &current, &s, &forced);
        assert_eq!((names(&current, &p), p.removed.clone()), (strings(&["checks"]), strings(&["missing"])));
        held.record(&current, &p);
        assert!(plan(&held, &current, &s, &BTreeSet::new()).is_empty());
        let again = s.apply(false, &strings(&["checks"]), &[]);
        assert_eq!(names(&current, &plan(&held, &current, &s, &again)), ["checks"], "re-subscribed: resent");
    }

    #[test]
    fn a_plan_over_the_names_a_diff_finds_equals_the_plan_over_every_name() {
        let before: Set = (0..1000).map(|i| ((format!("c{i:04}"), 0), "1".to_owned())).collect();
        let mut held = Held::default();
        held.record(&before, &plan(&held, &before, &wildcard(), &BTreeSet::new()));
        let mut after = before.clone();
        after.insert(("c0500".to_owned(), 0), "2".to_owned());
        after.insert(("new".to_owned(), 0), "1".to_owned());
        after.remove(&("c0007".to_owned(), 0));
        let candidates: BTreeSet<String> = before
            .diff(&after)
            .map(|item| match item {
                imbl::ordmap::DiffItem::Add((n, _), _) | imbl::ordmap::DiffItem::Remove((n, _), _) => n.clone(),
                imbl::ordmap::DiffItem::Update { new: ((n, _), _), .. } => n.clone(),
            })
            .collect();
        assert_eq!(candidates.len(), 3, "the diff skips what the two sets share");
        let limited = super::plan(&held, &after, &wildcard(), &BTreeSet::new(), Some(&candidates));
        assert_eq!(limited, plan(&held, &after, &wildcard(), &BTreeSet::new()));
        assert_eq!(
            (names(&after, &limited), limited.removed.clone()),
            (strings(&["c0500", "new"]), strings(&["c0007"]))
        );
    }

    #[test]
    fn unsubscribed_and_forgotten_names_follow_the_rules() {
        let current = set(&[("a", "1"), ("b", "1")]);
        let mut s = Subscription::default();
        let forced = s.apply(true, &strings(&["a", "b"]), &[]);
        let mut held = Held::default();
        held.record(&current, &plan(&held, &current, &s, &forced));
        s.apply(false, &[], &strings(&["b"]));
        held.forget(&strings(&["b"]));
        let changed = set(&[("a", "2"), ("b", "2")]);
        assert_eq!(names(&changed, &plan(&held, &changed, &s, &BTreeSet::new())), ["a"], "b is not subscribed");
        // A NACKed response's names are forgotten: the next plan carries them again.
        held.forget(&strings(&["a"]));
        assert_eq!(names(&current, &plan(&held, &current, &s, &BTreeSet::new())), ["a"]);
    }
}
