//! The caching encoder: what the driver publishes to the [`ResourceSet`] the ADS server serves,
//! building, packing and digesting only what changed.
//!
//! Nothing here knows Kubernetes: the core renders pods into specs (its model,
//! [`aether_agent_core::model`]); the encoder decides which spec is served under each name (the
//! first claimant wins, the rest are [`Rejected`] as duplicates), has [`super::build`] turn the
//! ones that changed into Envoy protos, and keeps the served sets up to date in place.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use aether_agent_core::model::{ClusterSpec, ListenerSpec, RenderError, Snapshot};
use aether_agent_core::record::PodKey;
use aether_agent_core::render::PodRender;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::util::pack_any;

use super::build::{
    HEALTH_LISTENER_NAME, build_cluster, build_health_checks, build_health_listener, build_inbound_listener,
};
use super::options::BuildOptions;
use super::resource_set::{CLUSTER_TYPE_URL, LISTENER_TYPE_URL, Rejected, ResourceSet, Served, TypedResources};

/// One input of [`Encoder::update`], the encoder's only way in.
#[derive(Clone, Debug)]
pub enum SpecChange {
    /// Pod `key` renders as this now (`None`: the pod is gone). What the agent's driver
    /// publishes: only the pods whose rendering changed.
    Pod(PodKey, Option<Arc<PodRender>>),
    /// Everything to serve, as one model (tests and tools publish whole [`Snapshot`]s, whose
    /// health cluster names need not follow their clusters): replaces the model given this way
    /// before. It is compared with that one position by position, so only the clusters,
    /// listeners and health names that moved are looked at.
    Whole(Arc<Snapshot>),
}

impl From<(PodKey, Option<Arc<PodRender>>)> for SpecChange {
    fn from((key, pod): (PodKey, Option<Arc<PodRender>>)) -> SpecChange {
        SpecChange::Pod(key, pod)
    }
}

impl From<Arc<Snapshot>> for SpecChange {
    fn from(model: Arc<Snapshot>) -> SpecChange {
        SpecChange::Whole(model)
    }
}

/// Who asks for specs: a pod, or one position of the whole model. When two claim a name, the
/// smallest wins it: pods in key order (the core's order), then the whole model's specs in their
/// order (the first of each name).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Origin {
    Pod(PodKey),
    Cluster(usize),
    Listener(usize),
    Health(usize),
}

/// What one [`Origin`] asks to serve (cheap to clone: shared).
#[derive(Clone, Debug, PartialEq)]
enum Unit {
    /// A pod's clusters, inbound listeners and health cluster name.
    Pod(Arc<PodRender>),
    /// One cluster of the whole model.
    Cluster(Arc<ClusterSpec>),
    /// One inbound listener of the whole model.
    Listener(Arc<ListenerSpec>),
    /// One health cluster name of the whole model.
    Health(String),
}

impl Unit {
    fn clusters(&self) -> &[ClusterSpec] {
        match self {
            Unit::Pod(p) => &p.clusters,
            Unit::Cluster(c) => std::slice::from_ref(c.as_ref()),
            Unit::Listener(_) | Unit::Health(_) => &[],
        }
    }

    fn listeners(&self) -> &[ListenerSpec] {
        match self {
            Unit::Pod(p) => &p.listeners,
            Unit::Listener(l) => std::slice::from_ref(l.as_ref()),
            Unit::Cluster(_) | Unit::Health(_) => &[],
        }
    }

    fn health_clusters(&self) -> &[String] {
        match self {
            Unit::Pod(p) => std::slice::from_ref(&p.health_cluster),
            Unit::Health(name) => std::slice::from_ref(name),
            Unit::Cluster(_) | Unit::Listener(_) => &[],
        }
    }
}

/// Encodes the node's resources, only what changed, driven one way: [`Encoder::update`] with
/// the [`SpecChange`]s since the last call. Only the changed units' clusters and listeners are
/// compared, and only those whose spec changed are built, packed and digested; the served sets
/// are persistent maps updated in place and their versions are kept by a running sum, so a change
/// costs O(changed · log n) whatever the node's size.
///
/// The health gateway's listener depends on the options only (built once); its checks (ECDS) are
/// built again only when the set of health cluster names changes.
#[derive(Debug)]
pub struct Encoder {
    opts: BuildOptions,
    /// The gateway listener (`None`: no `health_socket`), or why it could not be built.
    gateway: Result<Option<Arc<Served>>, RenderError>,
    /// The gateway's checks for the last list of health cluster names (shared: it lists every
    /// name).
    checks: Option<(Vec<String>, Arc<Served>)>,
    /// What the changes so far add up to.
    state: State,
    /// Clusters and listeners encoded so far: what a test counts to see that a change encodes
    /// only its own resources.
    encoded: u64,
}

/// What [`Encoder::update`] keeps: each origin's unit, who claims each name, the specs served
/// under each name, the health cluster names with their number of claimants, each origin's
/// rejected specs, the last whole model, and the served [`ResourceSet`].
#[derive(Debug, Default)]
struct State {
    units: HashMap<Origin, Unit>,
    cluster_owners: HashMap<String, Owners>,
    listener_owners: HashMap<String, Owners>,
    /// The spec served under each cluster name, as the unit it is in and its place there (the
    /// spec is not copied).
    served_clusters: HashMap<String, SpecAt>,
    served_listeners: HashMap<String, ListenerSpec>,
    health: BTreeMap<String, usize>,
    rejected: BTreeMap<Origin, (Vec<Rejected>, Vec<Rejected>)>,
    /// The model of the last [`SpecChange::Whole`] (empty before the first).
    whole: Arc<Snapshot>,
    current: Option<ResourceSet>,
}

/// A spec inside a unit: the unit (shared) and the spec's index in its clusters.
type SpecAt = (Unit, usize);

/// The cluster spec `at` points to.
fn cluster_at((unit, i): &SpecAt) -> &ClusterSpec {
    &unit.clusters()[*i]
}

/// The origins that claim one name, sorted: the first wins. Nearly always one, so a sorted `Vec`
/// (one small allocation) rather than a tree.
type Owners = Vec<Origin>;

/// Adds `key` to the claimants of `name` (kept sorted, no duplicates).
fn claim(owners: &mut HashMap<String, Owners>, name: &str, key: &Origin) {
    let set = match owners.get_mut(name) {
        Some(set) => set,
        None => owners.entry(name.to_owned()).or_insert_with(|| Vec::with_capacity(1)),
    };
    if let Err(at) = set.binary_search(key) {
        set.insert(at, key.clone());
    }
}

/// Removes `key` from the claimants of `name`, dropping the entry when it empties.
fn release(owners: &mut HashMap<String, Owners>, name: &str, key: &Origin) {
    if let Some(set) = owners.get_mut(name) {
        if let Ok(at) = set.binary_search(key) {
            set.remove(at);
        }
        if set.is_empty() {
            owners.remove(name);
        }
    }
}

/// `msg` packed as an `Any` of `type_url` (the constant, not the formatted `Name::type_url`).
fn any(type_url: &str, msg: &impl prost::Message) -> Any {
    Any { type_url: type_url.to_owned(), value: msg.encode_to_vec() }
}

/// Sorts `v` and drops repeats.
fn sorted_unique<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort_unstable();
    v.dedup();
    v
}

/// The names touched by a batch, once each, with whether any changed unit released the name.
fn touched(mut names: Vec<(String, bool)>) -> Vec<(String, bool)> {
    names.sort_unstable();
    // `dedup_by` hands (later, kept): fold the later's flag into the kept one.
    names.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1 |= later.1;
        }
        same
    });
    names
}

/// [`touched`] for cluster names given as their place in a unit (no name copied): each name once,
/// with whether any changed unit released it, in name order.
fn touched_clusters(mut names: Vec<(SpecAt, bool)>) -> Vec<(SpecAt, bool)> {
    fn name(e: &(SpecAt, bool)) -> &str {
        &cluster_at(&e.0).name
    }
    names.sort_unstable_by(|a, b| name(a).cmp(name(b)).then(a.1.cmp(&b.1)));
    names.dedup_by(|later, kept| {
        let same = name(later) == name(kept);
        if same {
            kept.1 |= later.1;
        }
        same
    });
    names
}

/// The positions where `before` and `after` differ, with what `after` has there (`None`: past its
/// end).
fn moved<'a, T: PartialEq>(before: &'a [T], after: &'a [T]) -> impl Iterator<Item = (usize, Option<&'a T>)> {
    (0..before.len().max(after.len()))
        .map(|i| (i, before.get(i), after.get(i)))
        .filter(|(_, b, a)| b != a)
        .map(|(i, _, a)| (i, a))
}

/// What one [`Encoder::update`] call touched, looked at again once every change is applied.
#[derive(Default)]
struct Touched {
    /// Each cluster of a changed unit, with whether the unit released it (its other claimants
    /// must be re-decided).
    clusters: Vec<(SpecAt, bool)>,
    /// Each listener name of a changed unit, likewise.
    listeners: Vec<(String, bool)>,
    /// Origins whose rejected specs must be decided again.
    rejections: Vec<Origin>,
    /// Health cluster names touched, and whether each was listed before.
    health: HashMap<String, bool>,
}

impl Encoder {
    /// An encoder with these node-wide options and nothing encoded yet.
    pub fn new(opts: BuildOptions) -> Self {
        let gateway = build_health_listener(&opts)
            .map(|listener| listener.map(|l| Arc::new(Served::packed(&l.name.clone(), pack_any(l)))));
        Encoder { opts, gateway, checks: None, state: State::default(), encoded: 0 }
    }

    /// The options this encoder uses.
    pub fn options(&self) -> &BuildOptions {
        &self.opts
    }

    /// How many clusters and inbound listeners this encoder has encoded since it was made.
    pub fn encoded(&self) -> u64 {
        self.encoded
    }

    /// The gateway's checks of `names` (sorted or not: the encoding is by name), from the cache
    /// when the list is the one built last.
    fn checks_of(&mut self, names: Vec<String>) -> Arc<Served> {
        match &self.checks {
            Some((last, served)) if *last == names => served.clone(),
            _ => {
                let config = build_health_checks(&names);
                let served = Arc::new(Served::packed(&config.name.clone(), pack_any(config)));
                self.checks = Some((names, served.clone()));
                served
            }
        }
    }

    /// Applies `changes` (a pod not listed keeps what it had) and returns the served resources:
    /// every valid cluster (the first claimant of each name wins: pods in key order, as
    /// `aether_agent_core::render::render` lists them, then the whole model's in its order), the
    /// inbound listeners likewise, the health gateway if `health_socket` is set (its listener,
    /// and its checks of every health cluster name as the ECDS set), and the list of what was left
    /// out. Never fails as a whole. The gateway's checks are built again when a health cluster
    /// name appears or goes (they list every name: O(pods), on pod arrivals and departures only).
    pub fn update<C: Into<SpecChange>>(&mut self, changes: impl IntoIterator<Item = C>) -> ResourceSet {
        let mut current = match self.state.current.take() {
            Some(c) => c,
            None => self.initial(),
        };
        let changes = changes.into_iter();
        let hint = changes.size_hint().0;
        // A boot or relist hands over every pod at once: grow the maps once, not by doubling.
        self.reserve(hint, 2 * hint);
        // Names and origins touched (sorted and deduplicated below: cheaper than a tree per
        // insert).
        let mut touched_now = Touched {
            clusters: Vec::with_capacity(2 * hint),
            rejections: Vec::with_capacity(hint),
            health: HashMap::with_capacity(hint),
            ..Touched::default()
        };
        for change in changes {
            match change.into() {
                SpecChange::Pod(key, pod) => self.apply(Origin::Pod(key), pod.map(Unit::Pod), &mut touched_now),
                SpecChange::Whole(model) => {
                    let before = std::mem::replace(&mut self.state.whole, model.clone());
                    self.reserve(model.clusters.len(), model.clusters.len());
                    for (i, c) in moved(&before.clusters, &model.clusters) {
                        let unit = c.map(|c| Unit::Cluster(Arc::new(c.clone())));
                        self.apply(Origin::Cluster(i), unit, &mut touched_now);
                    }
                    for (i, l) in moved(&before.listeners, &model.listeners) {
                        let unit = l.map(|l| Unit::Listener(Arc::new(l.clone())));
                        self.apply(Origin::Listener(i), unit, &mut touched_now);
                    }
                    for (i, name) in moved(&before.health_clusters, &model.health_clusters) {
                        self.apply(Origin::Health(i), name.map(|n| Unit::Health(n.clone())), &mut touched_now);
                    }
                }
            }
        }
        let Touched { clusters, listeners, mut rejections, health } = touched_now;
        for (at, released) in touched_clusters(clusters) {
            let name = cluster_at(&at).name.as_str();
            // Other origins claiming a name a changed unit released or shares: their duplicate
            // verdicts may move (a sole claimant that did not release it is a changed unit).
            match self.state.cluster_owners.get(name) {
                Some(owners) if released || owners.len() > 1 => rejections.extend(owners.iter().cloned()),
                _ => {}
            }
            self.refresh_cluster(&mut current.clusters, name);
        }
        for (name, released) in touched(listeners) {
            match self.state.listener_owners.get(&name) {
                Some(owners) if released || owners.len() > 1 => rejections.extend(owners.iter().cloned()),
                _ => {}
            }
            self.refresh_listener(&mut current.listeners, &name);
        }
        for key in sorted_unique(rejections) {
            self.reject(key);
        }
        let health_moved = health.iter().any(|(name, was)| self.state.health.contains_key(name) != *was);
        if health_moved && let Ok(Some(_)) = &self.gateway {
            let checks = self.checks_of(self.state.health.keys().cloned().collect());
            current.extension_configs.add((checks.resource.name.clone(), 0), checks);
        }
        current.clusters.seal();
        current.listeners.seal();
        current.extension_configs.seal();
        current.rejected = self.rejected();
        self.state.current = Some(current.clone());
        current
    }

    /// Room for `units` more units and `clusters` more cluster names.
    fn reserve(&mut self, units: usize, clusters: usize) {
        self.state.units.reserve(units);
        self.state.cluster_owners.reserve(clusters);
        self.state.served_clusters.reserve(clusters);
    }

    /// Records that origin `key` asks for `new` now (`None`: nothing): its old unit's names are
    /// released, the new one's claimed, and all of them noted in `touched` for a second look.
    fn apply(&mut self, key: Origin, new: Option<Unit>, touched: &mut Touched) {
        let sets = &mut self.state;
        let old = match &new {
            Some(n) => sets.units.insert(key.clone(), n.clone()),
            None => sets.units.remove(&key),
        };
        if old == new {
            return;
        }
        for (unit, released) in old.iter().map(|o| (o, true)).chain(new.iter().map(|n| (n, false))) {
            for (i, c) in unit.clusters().iter().enumerate() {
                if released {
                    release(&mut sets.cluster_owners, &c.name, &key);
                } else {
                    claim(&mut sets.cluster_owners, &c.name, &key);
                }
                touched.clusters.push(((unit.clone(), i), released));
            }
        }
        for l in old.iter().flat_map(Unit::listeners) {
            release(&mut sets.listener_owners, &l.name, &key);
            touched.listeners.push((l.name.clone(), true));
        }
        for l in new.iter().flat_map(Unit::listeners) {
            claim(&mut sets.listener_owners, &l.name, &key);
            touched.listeners.push((l.name.clone(), false));
        }
        for name in old.iter().chain(&new).flat_map(Unit::health_clusters) {
            touched.health.entry(name.clone()).or_insert_with(|| sets.health.contains_key(name));
        }
        for name in old.iter().flat_map(Unit::health_clusters) {
            let n = sets.health.entry(name.clone()).or_default();
            *n -= 1;
            if *n == 0 {
                sets.health.remove(name);
            }
        }
        for name in new.iter().flat_map(Unit::health_clusters) {
            *sets.health.entry(name.clone()).or_default() += 1;
        }
        touched.rejections.push(key);
    }

    /// The resources of a node with nothing to serve: the gateway's listener and empty checks.
    fn initial(&mut self) -> ResourceSet {
        let mut r = ResourceSet::default();
        if let Ok(Some(listener)) = self.gateway.clone() {
            r.listeners.add((listener.resource.name.clone(), 0), listener);
            let checks = self.checks_of(Vec::new());
            r.extension_configs.add((checks.resource.name.clone(), 0), checks);
        }
        r.listeners.seal();
        r.extension_configs.seal();
        r
    }

    /// Serves under cluster `name` the spec of the origin that wins it, encoding it only when it
    /// differs from the one served; removes the name when no origin asks for a valid spec of it.
    fn refresh_cluster(&mut self, set: &mut TypedResources, name: &str) {
        let winner = self.state.cluster_owners.get(name).and_then(|o| o.first());
        let at: Option<SpecAt> = winner
            .and_then(|k| self.state.units.get(k))
            .and_then(|u| Some((u.clone(), u.clusters().iter().position(|c| c.name == name)?)));
        if let Some(at) = &at
            && let Some(served) = self.state.served_clusters.get_mut(name)
            && cluster_at(served) == cluster_at(at)
        {
            // The same spec: point at the winner's current unit, so an old one is not kept.
            *served = at.clone();
            return;
        }
        match at.map(|at| {
            let cluster = build_cluster(cluster_at(&at), &self.opts);
            (at, cluster)
        }) {
            Some((at, Ok(cluster))) => {
                self.encoded += 1;
                set.add((name.to_owned(), 0), Arc::new(Served::packed(name, any(CLUSTER_TYPE_URL, &cluster))));
                self.state.served_clusters.insert(name.to_owned(), at);
            }
            Some((_, Err(_))) | None => {
                if self.state.served_clusters.remove(name).is_some() {
                    set.take(&(name.to_owned(), 0));
                }
            }
        }
    }

    /// [`Encoder::refresh_cluster`] for inbound listener `name` (never the gateway's name).
    fn refresh_listener(&mut self, set: &mut TypedResources, name: &str) {
        let winner =
            self.state.listener_owners.get(name).and_then(|o| o.first()).filter(|_| name != HEALTH_LISTENER_NAME);
        let spec =
            winner.and_then(|k| self.state.units.get(k)).and_then(|u| u.listeners().iter().find(|l| l.name == name));
        if spec.is_some() && self.state.served_listeners.get(name) == spec {
            return;
        }
        match spec.map(|s| (s, build_inbound_listener(s, &self.opts))) {
            Some((spec, Ok(listener))) => {
                self.encoded += 1;
                set.add((name.to_owned(), 0), Arc::new(Served::packed(name, any(LISTENER_TYPE_URL, &listener))));
                self.state.served_listeners.insert(name.to_owned(), spec.clone());
            }
            Some((_, Err(_))) | None => {
                if self.state.served_listeners.remove(name).is_some() {
                    set.take(&(name.to_owned(), 0));
                }
            }
        }
    }

    /// Decides again what of origin `key`'s specs is left out: a name a smaller origin also asks
    /// for (or the same unit earlier), or a spec Envoy would refuse.
    fn reject(&mut self, key: Origin) {
        let Some(unit) = self.state.units.get(&key) else {
            self.state.rejected.remove(&key);
            return;
        };
        let wins =
            |owners: &HashMap<String, Owners>, name: &str| owners.get(name).and_then(|o| o.first()) == Some(&key);
        let duplicate = |name: &str| Rejected {
            name: name.to_owned(),
            error: RenderError::DuplicateName { name: name.to_owned() },
        };
        // A unit holds a handful of specs: a scan of the earlier ones finds a repeated name.
        let (unit_clusters, unit_listeners) = (unit.clusters(), unit.listeners());
        let clusters: Vec<Rejected> = unit_clusters
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                if unit_clusters[..i].iter().any(|e| e.name == c.name) || !wins(&self.state.cluster_owners, &c.name) {
                    return Some(duplicate(&c.name));
                }
                c.validate().err().map(|error| Rejected { name: c.name.clone(), error })
            })
            .collect();
        let listeners: Vec<Rejected> = unit_listeners
            .iter()
            .enumerate()
            .filter_map(|(i, l)| {
                if l.name == HEALTH_LISTENER_NAME
                    || unit_listeners[..i].iter().any(|e| e.name == l.name)
                    || !wins(&self.state.listener_owners, &l.name)
                {
                    return Some(duplicate(&l.name));
                }
                l.validate().err().map(|error| Rejected { name: l.name.clone(), error })
            })
            .collect();
        if clusters.is_empty() && listeners.is_empty() {
            self.state.rejected.remove(&key);
        } else {
            self.state.rejected.insert(key, (clusters, listeners));
        }
    }

    /// Everything left out: the clusters (in origin order), then the listeners, then the gateway.
    fn rejected(&self) -> Vec<Rejected> {
        let by_origin = self.state.rejected.values();
        let mut out: Vec<Rejected> = by_origin.clone().flat_map(|(c, _)| c.iter().cloned()).collect();
        out.extend(by_origin.flat_map(|(_, l)| l.iter().cloned()));
        if let Err(error) = &self.gateway {
            out.push(Rejected { name: HEALTH_LISTENER_NAME.to_owned(), error: error.clone() });
        }
        out
    }
}

/// Encodes `model` with a fresh [`Encoder`] (nothing cached): what an encoder fed this whole
/// model serves.
pub fn encode(model: &Snapshot, opts: &BuildOptions) -> ResourceSet {
    Encoder::new(opts.clone()).update([SpecChange::Whole(Arc::new(model.clone()))])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::build::{HEALTH_CHECKS_NAME, HEALTH_LISTENER_NAME};
    use crate::xds::resource_set::EXTENSION_CONFIG_TYPE_URL;
    use crate::xds::test_specs::{h2_with_netns, inbound, pipe};
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::core::v3::{Pipe, address};
    use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
    use prost::Message;

    /// `model` handed to `r` as a whole.
    fn whole_model(r: &mut Encoder, model: &Snapshot) -> ResourceSet {
        r.update([SpecChange::Whole(Arc::new(model.clone()))])
    }

    #[test]
    fn same_content_gives_the_same_version_and_a_change_a_new_one() {
        let opts = BuildOptions::default();
        let snap = Snapshot {
            clusters: vec![pipe("b", "/b"), pipe("a", "/a"), h2_with_netns("c"), h2_with_netns("d")],
            health_clusters: vec!["b".to_owned(), "a".to_owned(), "zz".to_owned()],
            ..Default::default()
        };
        let one = encode(&snap, &opts);
        // Order of input does not matter; fresh HashMaps each time must not either.
        let mut reversed = snap.clone();
        reversed.clusters.reverse();
        reversed.health_clusters.reverse();
        for _ in 0..20 {
            let two = encode(&reversed, &opts);
            assert!(one.same_versions(&two));
            assert_eq!(one, two);
        }
        let mut changed = snap.clone();
        changed.clusters[0] = pipe("b", "/b2");
        let three = encode(&changed, &opts);
        assert_ne!(one.clusters.version, three.clusters.version);
        assert_eq!(one.listeners.version, three.listeners.version);
        assert_eq!(one.extension_configs.version, three.extension_configs.version);
        assert_eq!(one.clusters.names(), vec!["a", "b", "c", "d"]);
    }

    #[test]
    fn a_health_cluster_added_or_removed_changes_the_gateways_checks_never_its_listener() {
        let opts = BuildOptions::default();
        let mut snap = Snapshot { health_clusters: vec!["health_ns_a".to_owned()], ..Default::default() };
        let one = encode(&snap, &opts);
        assert_eq!(one.listeners.names(), [HEALTH_LISTENER_NAME]);
        assert_eq!(one.extension_configs.names(), [HEALTH_CHECKS_NAME]);
        assert_eq!(one.extension_configs.type_url, EXTENSION_CONFIG_TYPE_URL);
        assert_eq!(one.extension_configs.iter().next().unwrap().resource.resource.type_url, EXTENSION_CONFIG_TYPE_URL);
        for change in 0..2 {
            if change == 0 {
                snap.health_clusters.push("health_ns_b".to_owned());
            } else {
                snap.health_clusters.clear();
            }
            let next = encode(&snap, &opts);
            assert_eq!(next.listeners, one.listeners, "the listener is the same resource, same version");
            assert_ne!(next.extension_configs.version, one.extension_configs.version);
            assert!(!next.same_versions(&one));
        }
    }

    #[test]
    fn the_cache_reuses_unchanged_clusters_and_drops_removed_ones() {
        let mut r = Encoder::new(BuildOptions::default());
        let snap = Snapshot {
            clusters: vec![pipe("a", "/a"), pipe("b", "/b")],
            health_clusters: vec![],
            ..Default::default()
        };
        let first = whole_model(&mut r, &snap);
        let fresh = encode(&snap, r.options());
        assert_eq!(first, fresh);
        let smaller = Snapshot { clusters: vec![pipe("b", "/b")], health_clusters: vec![], ..Default::default() };
        assert_eq!(whole_model(&mut r, &smaller).clusters.names(), vec!["b"]);
        assert_eq!(r.state.served_clusters.len(), 1);
    }

    #[test]
    fn a_cached_render_equals_a_fresh_one_as_clusters_listeners_and_the_health_list_change() {
        let opts = BuildOptions { health_socket: Some("/run/aether/health.sock".to_owned()), ..Default::default() };
        let mut r = Encoder::new(opts.clone());
        let mut snap = Snapshot {
            clusters: vec![pipe("a", "/a"), pipe("b", "/b")],
            health_clusters: vec!["a".into()],
            ..Default::default()
        };
        for step in 0..8 {
            match step {
                1 => snap.clusters[0] = pipe("a", "/a2"),
                2 => snap.health_clusters.push("b".into()),
                3 => snap.clusters.push(pipe("c", "/c")),
                4 => snap.listeners.push(inbound("inbound_ns_a_8080", 8080)),
                5 => snap.listeners[0].netns = "/run/netns/cni-2".into(),
                6 => snap.listeners.push(inbound("inbound_ns_a_9090", 9090)),
                7 => {
                    snap.listeners.remove(0);
                }
                _ => {}
            }
            assert_eq!(whole_model(&mut r, &snap), encode(&snap, &opts), "step {step}");
        }
        assert_eq!(r.state.served_listeners.len(), 1, "a removed listener leaves the cache");
    }

    /// Pod `ns/p<i>` (uid `u<i>`, or `dup` for a second pod of the same name) rendered as
    /// `aether_agent_core::render` would: its app cluster on `path`, its health cluster, and an
    /// inbound listener when `listener`.
    fn pod(i: usize, uid: &str, path: &str, listener: bool) -> (PodKey, Option<Arc<PodRender>>) {
        let key = PodKey { namespace: "ns".into(), name: format!("p{i}").into(), uid: format!("{uid}{i}").into() };
        let app = format!("app_ns_p{i}_8080");
        let render = PodRender {
            clusters: vec![pipe(&app, path), pipe(&format!("health_ns_p{i}"), path)],
            listeners: if listener { vec![inbound(&format!("inbound_ns_p{i}_8080"), 8080)] } else { vec![] },
            health_cluster: format!("health_ns_p{i}"),
            effective: aether_agent_core::render::Effective::Pipe(path.to_owned()),
        };
        (key, Some(Arc::new(render)))
    }

    /// The whole [`Snapshot`] of `pods`, in key order (what the core's `render` lists).
    fn whole(pods: &BTreeMap<PodKey, Arc<PodRender>>) -> Snapshot {
        let mut s = Snapshot::default();
        for p in pods.values() {
            s.clusters.extend(p.clusters.iter().cloned());
            s.listeners.extend(p.listeners.iter().cloned());
            s.health_clusters.push(p.health_cluster.clone());
        }
        s
    }

    #[test]
    fn per_pod_updates_serve_exactly_what_a_whole_render_serves() {
        let opts = BuildOptions::default();
        let mut r = Encoder::new(opts.clone());
        let mut all: BTreeMap<PodKey, Arc<PodRender>> = BTreeMap::new();
        let long = format!("/{}", "x".repeat(200));
        let steps: Vec<Vec<(PodKey, Option<Arc<PodRender>>)>> = vec![
            vec![],
            (0..6).map(|i| pod(i, "u", &format!("/s{i}"), i % 2 == 0)).collect(),
            vec![pod(2, "u", "/s2-moved", true)],
            vec![pod(3, "u", &long, false)],
            // A second pod of the same name: its names are duplicates until the first goes.
            vec![pod(1, "v", "/other", true)],
            vec![(pod(1, "u", "", false).0, None)],
            vec![(pod(4, "u", "", false).0, None), pod(7, "u", "/s7", true), pod(3, "u", "/s3", false)],
            vec![pod(0, "u", "/s0", true)],
        ];
        for (n, step) in steps.into_iter().enumerate() {
            for (k, v) in &step {
                match v {
                    Some(v) => all.insert(k.clone(), v.clone()),
                    None => all.remove(k),
                };
            }
            assert_eq!(r.update(step), encode(&whole(&all), &opts), "step {n}");
        }
    }

    #[test]
    fn a_pod_change_encodes_only_its_own_resources_and_shares_the_rest() {
        let mut r = Encoder::new(BuildOptions::default());
        let first = r.update((0..1000).map(|i| pod(i, "u", &format!("/s{i}"), true)));
        assert_eq!((r.encoded(), first.clusters.len(), first.listeners.len()), (3000, 2000, 1001));
        let next = r.update([pod(500, "u", "/moved", true)]);
        assert_eq!(r.encoded(), 3002, "its 2 clusters, nothing else (its listener's spec is the same)");
        assert_ne!(next.clusters.version, first.clusters.version);
        assert_eq!(next.listeners, first.listeners);
        let checks = |r: &ResourceSet| r.extension_configs.resources.values().next().cloned().unwrap();
        assert!(Arc::ptr_eq(&checks(&first), &checks(&next)), "no health name came or went: checks not re-rendered");
        let key = |n: &str| (n.to_owned(), 0);
        let same =
            |a: &TypedResources, b: &TypedResources, n: &str| Arc::ptr_eq(&a.resources[&key(n)], &b.resources[&key(n)]);
        assert!(
            same(&first.clusters, &next.clusters, "app_ns_p499_8080"),
            "an untouched cluster is shared, not copied"
        );
        assert!(!same(&first.clusters, &next.clusters, "app_ns_p500_8080"));
        assert_eq!(first.clusters.resources.diff(&next.clusters.resources).count(), 2);
        let again = r.update([pod(500, "u", "/moved", true)]);
        assert_eq!((r.encoded(), &again.clusters.version), (3002, &next.clusters.version), "an equal pod: nothing");
    }

    #[test]
    fn one_bad_cluster_is_left_out_and_reported_the_rest_render() {
        let long = format!("/{}", "x".repeat(200));
        let snap = Snapshot {
            clusters: vec![pipe("good", "/g"), pipe("bad", &long), pipe("good", "/dup")],
            health_clusters: vec!["good".to_owned()],
            ..Default::default()
        };
        let r = encode(&snap, &BuildOptions::default());
        assert_eq!(r.clusters.names(), vec!["good"]);
        let labels: Vec<_> = r.rejected.iter().map(|x| (x.name.as_str(), x.error.label())).collect();
        assert_eq!(labels, vec![("bad", "pipe-path-too-long"), ("good", "duplicate-name")]);
        // The kept duplicate is the first one.
        let c = Cluster::decode(r.clusters.get("good").unwrap().resource.resource.value.as_slice()).unwrap();
        let ep = c.load_assignment.unwrap().endpoints[0].lb_endpoints[0].clone();
        let Some(HostIdentifier::Endpoint(e)) = ep.host_identifier else { panic!() };
        assert_eq!(e.address.unwrap().address, Some(address::Address::Pipe(Pipe { path: "/g".to_owned(), mode: 0 })));
    }

    #[test]
    fn an_unusable_health_socket_is_reported_and_serves_neither_gateway_resource() {
        let opts = BuildOptions { health_socket: Some(format!("/{}", "h".repeat(107))), ..BuildOptions::default() };
        let snap = Snapshot { health_clusters: vec!["health_ns_a".to_owned()], ..Default::default() };
        let r = encode(&snap, &opts);
        assert!(r.listeners.resources.is_empty() && r.extension_configs.resources.is_empty());
        let labels: Vec<_> = r.rejected.iter().map(|x| (x.name.as_str(), x.error.label())).collect();
        assert_eq!(labels, vec![(HEALTH_LISTENER_NAME, "pipe-path-too-long")]);
    }

    #[test]
    fn no_health_socket_means_no_listener_and_no_checks() {
        let opts = BuildOptions { health_socket: None, ..BuildOptions::default() };
        let snap = Snapshot { health_clusters: vec!["health_ns_a".to_owned()], ..Default::default() };
        let r = encode(&snap, &opts);
        assert!(r.listeners.resources.is_empty());
        assert!(r.extension_configs.resources.is_empty());
        assert_eq!(r.get(LISTENER_TYPE_URL).unwrap().type_url, LISTENER_TYPE_URL);
        assert_eq!(r.get(EXTENSION_CONFIG_TYPE_URL).unwrap().type_url, EXTENSION_CONFIG_TYPE_URL);
        assert!(r.get("type.googleapis.com/other").is_none());
        assert_eq!(r.type_urls(), [CLUSTER_TYPE_URL, LISTENER_TYPE_URL, EXTENSION_CONFIG_TYPE_URL]);
    }
}
