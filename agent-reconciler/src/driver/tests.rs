//! The loop's tests: events in, snapshots, status, state dir and pod Events out.

use std::sync::Arc;

use aether_agent_core::pod_events;
use aether_agent_core::refusal::Refusal;
use aether_fixtures::PodBuilder;
use k8s_openapi::api::core::v1::Pod;

use super::*;
use crate::fold::Settings;

const UID_A: &str = aether_fixtures::UID;
const UID_B: &str = "11111111-2222-4333-8444-555555555555";

/// Managed pod shop/<name> of ServiceAccount cart (the Service [`cart_policy`] targets), with
/// one container and emptyDir `s`; no socket annotation and no status (no IP) yet.
fn cart(name: &str, uid: &str) -> PodBuilder {
    aether_fixtures::pod("shop", name)
        .uid(uid)
        .sa("cart")
        .container("app", "registry.example/uds-echo:test")
        .emptydir("s")
}

/// [`Event::PodsListed`] of `pods`, as the watch makes it: the records of the readable,
/// managed, unfinished ones.
fn listed(pods: Vec<Pod>) -> Event {
    Event::PodsListed(pods.iter().filter_map(crate::event::listed_record).collect())
}

/// The event of `pod` added or changed, as the watch makes it.
fn applied(pod: Pod) -> Event {
    Event::pod_applied(&pod).expect("a readable pod with a UID")
}

/// The event of `pod` deleted, as the watch makes it.
fn deleted(pod: Pod) -> Event {
    Event::pod_deleted(&pod).expect("a pod with a UID")
}

/// [`cart`] annotated with socket [`SOCKET`].
fn pod(name: &str, uid: &str) -> Pod {
    cart(name, uid).annotation_socket(SOCKET).build()
}

fn driver(state: &std::path::Path) -> (Driver, crate::xds::publish::PodSpecs) {
    driver_with(state, Settings::new("/var/lib/kubelet/pods", true))
}

fn driver_with(state: &std::path::Path, settings: Settings) -> (Driver, crate::xds::publish::PodSpecs) {
    driver_wired(state, settings, Collaborators::detached())
}

fn driver_wired(
    state: &std::path::Path,
    settings: Settings,
    with: Collaborators,
) -> (Driver, crate::xds::publish::PodSpecs) {
    let (tx, rx) = crate::xds::publish::pod_specs();
    let (status, _) = watch::channel(Status::default());
    let store = StateStore::open(state).unwrap();
    let d = Driver::new(Index::new(settings), Some(store), CniRecords::default(), tx, status, with);
    (d, rx)
}

fn records(state: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(state.join("pods")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    v.sort();
    v
}

/// The endpoint of `shop/<name>`'s app cluster in the last published snapshot.
fn app_endpoint(rx: &crate::xds::publish::PodSpecs, name: &str) -> crate::xds::Endpoint {
    let snap = rx.snapshot();
    let cluster = snap.clusters.iter().find(|c| c.name == format!("app_shop_{name}_8080")).expect("app cluster");
    cluster.endpoint.clone()
}

#[test]
fn the_runtimes_netns_answer_makes_tcp_delivery_dial_inside_the_pod_until_the_pod_goes() {
    use crate::runtime::{NetnsDirs, RuntimeError};
    use crate::xds::Endpoint;
    let dir = tempfile::tempdir().unwrap();
    let (mut d, rx) = driver(dir.path());
    let p = cart("a", UID_A).ip("10.1.2.3").build();
    d.handle(listed(vec![p.clone()]));
    let by_ip = Endpoint::Tcp { address: "10.1.2.3".parse().unwrap(), port: 8080, netns: None };
    assert_eq!(app_endpoint(&rx, "a"), by_ip);

    let dirs = NetnsDirs::new(std::path::Path::new("/run/netns"), None).unwrap();
    let netns = |f: &str| dirs.translate(&format!("/var/run/netns/{f}")).unwrap();
    d.handle(Event::Netns(vec![(UID_A.into(), Ok(Some(netns("cni-1"))))]));
    let inside =
        Endpoint::Tcp { address: "127.0.0.1".parse().unwrap(), port: 8080, netns: Some("/run/netns/cni-1".into()) };
    assert_eq!(app_endpoint(&rx, "a"), inside);

    // A failed lookup keeps what was known; an answer for a pod the agent does not know is dropped.
    let timeout = RuntimeError::Timeout {
        endpoint: "unix:///x".into(),
        call: "ListPodSandbox",
        after: std::time::Duration::from_secs(2),
    };
    d.handle(Event::Netns(vec![(UID_A.into(), Err(timeout))]));
    d.handle(Event::Netns(vec![(UID_B.into(), Ok(Some(netns("cni-2"))))]));
    assert_eq!(app_endpoint(&rx, "a"), inside);
    assert!(!d.netns.runtime.is_known(UID_B));

    // No sandbox netns any more (e.g. host network): back to the pod IP. A delete forgets.
    d.handle(Event::Netns(vec![(UID_A.into(), Ok(None))]));
    assert_eq!(app_endpoint(&rx, "a"), by_ip);
    d.handle(Event::Netns(vec![(UID_A.into(), Ok(Some(netns("cni-3"))))]));
    d.handle(deleted(p));
    assert!(d.netns.runtime.is_empty());
}

#[test]
fn a_cni_record_is_read_on_the_pods_events_and_the_recheck_never_per_publish() {
    use crate::xds::Endpoint;
    let (state, records) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (tx, rx) = crate::xds::publish::pod_specs();
    let (status, _) = watch::channel(Status::default());
    let cni = CniRecords::new(Some(records.path().to_owned()), crate::runtime::NetnsDirs::default());
    let settings = Settings::new("/var/lib/kubelet/pods", true);
    let store = Some(StateStore::open(state.path()).unwrap());
    let mut d = Driver::new(Index::new(settings), store, cni, tx, status, Collaborators::detached());
    let p = cart("a", UID_A).ip("10.1.2.3").build();
    d.handle(applied(p.clone()));
    let by_ip = Endpoint::Tcp { address: "10.1.2.3".parse().unwrap(), port: 8080, netns: None };
    assert_eq!(app_endpoint(&rx, "a"), by_ip);

    // Written after the pod's event: another pod's event (a publish) does not read it ...
    std::fs::write(records.path().join(format!("{UID_A}.json")), br#"{"netns": "/var/run/netns/cni-1"}"#).unwrap();
    d.handle(applied(cart("b", UID_B).build()));
    assert_eq!(app_endpoint(&rx, "a"), by_ip);
    // ... the periodic re-check does, as the proxy opens it (the runtime's rules: /var/run is /run).
    d.handle(Event::Recheck);
    let inside =
        Endpoint::Tcp { address: "127.0.0.1".parse().unwrap(), port: 8080, netns: Some("/run/netns/cni-1".into()) };
    assert_eq!(app_endpoint(&rx, "a"), inside);
}

#[test]
fn a_listener_envoy_could_not_bind_is_withdrawn_alone_and_its_pod_gets_one_warning() {
    use crate::xds::bind_failures::BindFailure;
    let dir = tempfile::tempdir().unwrap();
    let (d, rx) = driver(dir.path());
    let (mut d, mut events) = with_notices(d);
    let p = cart("a", UID_A).annotation_socket(SOCKET).ip("10.1.2.3").build();
    d.handle(listed(vec![p]));
    let dirs = crate::runtime::NetnsDirs::new(std::path::Path::new("/run/netns"), None).unwrap();
    let netns = dirs.translate("/var/run/netns/cni-1").unwrap();
    d.handle(Event::Netns(vec![(UID_A.into(), Ok(Some(netns)))]));
    let listeners = |rx: &crate::xds::publish::PodSpecs| -> Vec<String> {
        rx.snapshot().listeners.iter().map(|l| l.name.clone()).collect()
    };
    assert_eq!(listeners(&rx), ["inbound_shop_a_8080"]);
    drain(&mut events);

    let failure = |pod: &str| BindFailure {
        namespace: "shop".into(),
        pod: pod.into(),
        port: 8080,
        details: "cannot bind '0.0.0.0:8080': Address already in use".into(),
    };
    d.handle(Event::InboundBindFailed(vec![failure("a"), failure("not-on-this-node")]));
    assert!(listeners(&rx).is_empty());
    assert!(cluster_names(&rx).contains(&"app_shop_a_8080".to_owned()), "its clusters stay");
    let reasons = drain(&mut events);
    assert_eq!(reasons, [pod_events::INBOUND_BIND_FAILED_REASON]);
    // Envoy reporting the same failure again changes nothing and says nothing.
    d.handle(Event::InboundBindFailed(vec![failure("a")]));
    assert!(drain(&mut events).is_empty());
    // Not withdrawn for good: an Envoy going away (its ports free) brings the listener back, and
    // its NACK does not fail /readyz meanwhile.
    d.handle(Event::EnvoyStreamEnded);
    assert_eq!(listeners(&rx), ["inbound_shop_a_8080"]);
    assert!(d.out.status_now().reoffer_grace_until.is_some_and(|t| t > std::time::Instant::now()));
    // The port is still held: withdrawn again, and the pod is not told a second time.
    d.handle(Event::InboundBindFailed(vec![failure("a")]));
    assert!(listeners(&rx).is_empty());
    assert!(drain(&mut events).is_empty(), "one Event per cause");
    // Nothing is due before its back-off: a re-check offers nothing.
    d.handle(Event::Recheck);
    assert!(listeners(&rx).is_empty());
    // Another cause is news.
    d.handle(Event::EnvoyStreamEnded);
    d.handle(Event::InboundBindFailed(vec![BindFailure {
        details: "cannot bind: permission denied".into(),
        ..failure("a")
    }]));
    assert_eq!(drain(&mut events), [pod_events::INBOUND_BIND_FAILED_REASON]);
    // A stream ending with nothing withdrawn changes nothing.
    d.handle(Event::EnvoyStreamEnded);
    d.handle(Event::EnvoyStreamEnded);
    assert_eq!(listeners(&rx), ["inbound_shop_a_8080"]);
}

#[test]
fn a_socket_pod_without_a_netns_of_its_own_is_told_once_and_gets_no_listener() {
    let dir = tempfile::tempdir().unwrap();
    let (d, rx) = driver(dir.path());
    let (mut d, mut events) = with_notices(d);
    let tcp_pod = cart("t", UID_B).ip("10.1.2.4").build();
    d.handle(listed(vec![cart("a", UID_A).annotation_socket(SOCKET).ip("10.1.2.3").build(), tcp_pod]));
    drain(&mut events);
    for _ in 0..2 {
        d.handle(Event::Netns(vec![(UID_A.into(), Ok(None)), (UID_B.into(), Ok(None))]));
    }
    assert_eq!(drain(&mut events), [pod_events::INBOUND_NO_NETNS_REASON], "once, and not for the TCP pod");
    assert!(rx.snapshot().listeners.is_empty());

    // A runtime that cannot be asked: the same Event, once, naming the error.
    let (d2, _rx2) = driver(tempfile::tempdir().unwrap().path());
    let (mut d2, mut events2) = with_notices(d2);
    d2.handle(listed(vec![cart("b", UID_B).annotation_socket(SOCKET).ip("10.1.2.5").build()]));
    drain(&mut events2);
    let timeout = || crate::runtime::RuntimeError::Timeout {
        endpoint: "unix:///x".into(),
        call: "ListPodSandbox",
        after: std::time::Duration::from_secs(2),
    };
    d2.handle(Event::Netns(vec![(UID_B.into(), Err(timeout()))]));
    d2.handle(Event::Netns(vec![(UID_B.into(), Err(timeout()))]));
    let notes: Vec<pod_events::Notice> = std::iter::from_fn(|| events2.try_recv().ok()).collect();
    assert_eq!(notes.len(), 1);
    assert!(notes[0].note.contains("could not say") && notes[0].note.contains("ListPodSandbox"), "{}", notes[0].note);
}

#[test]
fn a_socket_path_that_held_a_link_stays_refused_until_the_pod_is_gone_across_a_restart() {
    let (state, pods) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let settings = || Settings::new(pods.path().to_str().unwrap(), true);
    let volume = pods.path().join(UID_A).join("volumes/kubernetes.io~empty-dir/s");
    std::fs::create_dir_all(&volume).unwrap();
    std::os::unix::fs::symlink("/elsewhere/app.sock", volume.join("app.sock")).unwrap();
    let app_is_pipe = |rx: &crate::xds::publish::PodSpecs| {
        rx.snapshot()
            .clusters
            .iter()
            .any(|c| c.name == "app_shop_a_8080" && matches!(c.endpoint, crate::xds::Endpoint::Pipe { .. }))
    };
    let p = cart("a", UID_A).annotation_socket(SOCKET).ip("10.1.2.3").build();
    let (mut d, rx) = driver_with(state.path(), settings());
    d.handle(listed(vec![p.clone()]));
    assert!(!app_is_pipe(&rx), "a symlinked socket is refused");
    // The pod puts a real socket back: still refused, at every re-check.
    std::fs::remove_file(volume.join("app.sock")).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(volume.join("app.sock")).unwrap();
    d.handle(Event::Recheck);
    assert!(!app_is_pipe(&rx), "the refusal sticks");
    // ... and across an agent restart (the state dir remembers it).
    drop(d);
    let (mut again, rx) = driver_with(state.path(), settings());
    again.boot();
    again.handle(listed(vec![p.clone()]));
    again.handle(Event::Recheck);
    assert!(!app_is_pipe(&rx), "the refusal sticks across a restart");
    // The pod is gone: forgotten; a pod re-created (new UID) starts clean.
    again.handle(deleted(p));
    assert!(again.sockets.link_refused().is_empty());
}

#[test]
fn a_zero_link_record_of_an_older_agent_is_forgotten_at_boot_and_a_real_link_stays() {
    let (state, pods) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let settings = || Settings::new(pods.path().to_str().unwrap(), true);
    let (mut d, _rx) = driver_with(state.path(), settings());
    // What an agent before 0.9.0 saved when an app re-created its socket while it was pinned.
    d.sockets.link_refused.insert(UID_A.to_owned(), Refusal::HardLink { path: "/p/a.sock".into(), links: 0 });
    d.sockets.link_refused.insert(UID_B.to_owned(), Refusal::HardLink { path: "/p/b.sock".into(), links: 2 });
    d.save_events();
    drop(d);
    let (mut again, _rx) = driver_with(state.path(), settings());
    again.boot();
    assert!(!again.sockets.link_refused().contains_key(UID_A), "0 links is no link");
    assert_eq!(
        again.sockets.link_refused().get(UID_B),
        Some(&Refusal::HardLink { path: "/p/b.sock".into(), links: 2 })
    );
}

#[test]
fn a_restarted_driver_serves_the_same_snapshot_from_the_state_dir_before_any_list() {
    let dir = tempfile::tempdir().unwrap();
    let (mut d, rx) = driver(dir.path());
    d.handle(listed(vec![pod("a", UID_A), pod("b", UID_B)]));
    let served = rx.snapshot();
    assert_eq!(served.clusters.len(), 4, "{served:?}");
    drop(d);
    let (mut again, rx2) = driver(dir.path());
    again.boot();
    assert_eq!(rx2.snapshot(), served);
}

/// A netns the runtime answers with, as a file in `dir` (the host and proxy netns dir).
fn netns_in(dir: &std::path::Path, file: &str) -> crate::runtime::NetnsPath {
    std::fs::write(dir.join(file), b"").unwrap();
    let dirs = crate::runtime::NetnsDirs::new(dir, None).unwrap();
    dirs.translate(&dir.join(file).display().to_string()).unwrap()
}

/// A driver whose netns dir (host and proxy) is `netns_dir`, as `--netns-host-dir` sets it.
fn driver_in(state: &std::path::Path, netns_dir: &std::path::Path) -> (Driver, crate::xds::publish::PodSpecs) {
    let (tx, rx) = crate::xds::publish::pod_specs();
    let (status, _) = watch::channel(Status::default());
    let store = StateStore::open(state).unwrap();
    let cni = CniRecords::new(None, crate::runtime::NetnsDirs::new(netns_dir, None).unwrap());
    let settings = Settings::new("/var/lib/kubelet/pods", true);
    let d = Driver::new(Index::new(settings), Some(store), cni, tx, status, Collaborators::detached());
    (d, rx)
}

#[test]
fn a_replayed_netns_or_record_that_breaks_the_rules_is_not_given_to_envoy() {
    let (state, netns_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut d, rx) = driver_in(state.path(), netns_dir.path());
    d.handle(listed(vec![cart("a", UID_A).annotation_socket(SOCKET).ip("10.1.2.3").build()]));
    d.handle(Event::Netns(vec![(UID_A.into(), Ok(Some(netns_in(netns_dir.path(), "cni-a"))))]));
    assert_eq!(rx.snapshot().listeners.len(), 1);
    drop(d);
    let file = state.path().join(format!("pods/{UID_A}.json"));
    let stored = std::fs::read_to_string(&file).unwrap();
    let served = netns_dir.path().join("cni-a").display().to_string();
    assert!(stored.contains(&served), "{stored}");
    // An edited record naming another namespace: the path rules refuse it, nothing is replayed.
    for hostile in ["/proc/1/ns/net", "/run/netns/cni-a", &format!("{served}/../x")] {
        std::fs::write(&file, stored.replace(&served, hostile)).unwrap();
        let (mut again, rx2) = driver_in(state.path(), netns_dir.path());
        again.boot();
        assert!(rx2.snapshot().listeners.is_empty(), "{hostile}: {:?}", rx2.snapshot());
        assert!(!format!("{:?}", rx2.snapshot()).contains(hostile), "{hostile} reached the specs");
    }
    // A record filed under another pod's UID is not replayed at all.
    std::fs::remove_file(&file).unwrap();
    std::fs::write(state.path().join(format!("pods/{UID_B}.json")), &stored).unwrap();
    let (mut moved, rx3) = driver_in(state.path(), netns_dir.path());
    moved.boot();
    assert!(rx3.snapshot().listeners.is_empty() && rx3.snapshot().clusters.is_empty(), "{:?}", rx3.snapshot());
}

#[test]
fn a_restarted_driver_replays_each_pods_netns_so_its_first_push_equals_what_was_served() {
    let (state, netns_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut d, rx) = driver_in(state.path(), netns_dir.path());
    let socket_pod = cart("a", UID_A).annotation_socket(SOCKET).ip("10.1.2.3").build();
    let tcp_pod = cart("b", UID_B).ip("10.1.2.4").build();
    d.handle(listed(vec![socket_pod, tcp_pod]));
    d.handle(Event::Netns(vec![
        (UID_A.into(), Ok(Some(netns_in(netns_dir.path(), "cni-a")))),
        (UID_B.into(), Ok(Some(netns_in(netns_dir.path(), "cni-b")))),
    ]));
    let served = rx.snapshot();
    assert_eq!(served.listeners.len(), 1, "the socket pod's inbound listener: {served:?}");
    drop(d);

    // No API server, no runtime answer yet: the state dir alone gives the same push.
    let (mut again, rx2) = driver_in(state.path(), netns_dir.path());
    again.boot();
    assert_eq!(rx2.snapshot(), served, "listeners and in-netns clusters replayed");

    // A netns that is gone (the sandbox was replaced while the agent was down) is not
    // replayed: that pod loses its listener and dials its pod IP until the runtime answers.
    std::fs::remove_file(netns_dir.path().join("cni-a")).unwrap();
    std::fs::remove_file(netns_dir.path().join("cni-b")).unwrap();
    let (mut third, rx3) = driver_in(state.path(), netns_dir.path());
    third.boot();
    let replayed = rx3.snapshot();
    assert!(replayed.listeners.is_empty(), "{replayed:?}");
    let by_ip = crate::xds::Endpoint::Tcp { address: "10.1.2.4".parse().unwrap(), port: 8080, netns: None };
    assert_eq!(app_endpoint(&rx3, "b"), by_ip);
}

/// A driver whose status starts holding Envoy's streams, as `aether-agent run` starts it,
/// with a netns lookup that never answers by itself (the test hands the answers over).
fn holding_driver(state: &std::path::Path) -> (Driver, watch::Receiver<Status>) {
    struct Silent;
    impl crate::runtime::NetnsSource for Silent {
        fn endpoint(&self) -> &str {
            "unix:///silent"
        }
        fn netns_of(
            &self,
            _: &str,
        ) -> impl Future<Output = Result<Option<crate::runtime::NetnsPath>, crate::runtime::RuntimeError>> + Send
        {
            std::future::pending()
        }
    }
    let (tx, _rx) = crate::xds::publish::pod_specs();
    let (status, status_rx) = watch::channel(Status { holding_xds: true, ..Status::default() });
    let store = StateStore::open(state).unwrap();
    let settings = Settings::new("/var/lib/kubelet/pods", true);
    let (lookup, _answers) = crate::runtime::NetnsLookup::spawn(Silent, 16);
    let with = Collaborators { netns: PodNetns::with_lookup(lookup), ..Collaborators::detached() };
    let d = Driver::new(Index::new(settings), Some(store), CniRecords::default(), tx, status, with);
    (d, status_rx)
}

#[tokio::test]
async fn a_new_agent_serves_envoy_only_after_the_pod_list_and_its_socket_pods_netns() {
    let (state, netns_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut d, status) = holding_driver(state.path());
    d.boot();
    assert!(status.borrow().holding_xds, "an empty state dir: nothing complete to serve");
    d.handle(listed(vec![cart("a", UID_A).annotation_socket(SOCKET).ip("10.1.2.3").build()]));
    assert!(status.borrow().holding_xds, "listed, but the socket pod's netns is not answered yet");
    d.handle(Event::Netns(vec![(UID_A.into(), Ok(Some(netns_in(netns_dir.path(), "cni-a"))))]));
    assert!(!status.borrow().holding_xds, "every socket pod answered");

    // TCP pods wait for nothing; an error is an answer too (the pod is told why it has no listener).
    let (mut d2, status2) = holding_driver(tempfile::tempdir().unwrap().path());
    d2.handle(listed(vec![cart("t", UID_B).ip("10.1.2.4").build()]));
    assert!(!status2.borrow().holding_xds, "a TCP pod's netns is never waited for");
    let (mut d5, status5) = holding_driver(tempfile::tempdir().unwrap().path());
    d5.handle(listed(vec![cart("a", UID_A).annotation_socket(SOCKET).ip("10.1.2.3").build()]));
    let refused = crate::runtime::RuntimeError::Connect { endpoint: "unix:///x".into(), detail: "refused".into() };
    d5.handle(Event::Netns(vec![(UID_A.into(), Err(refused))]));
    assert!(!status5.borrow().holding_xds);

    // A runtime that never answers is waited for HOLD_NETNS_WAIT after the list, then served.
    let (mut d3, status3) = holding_driver(tempfile::tempdir().unwrap().path());
    d3.handle(listed(vec![cart("a", UID_A).annotation_socket(SOCKET).ip("10.1.2.3").build()]));
    d3.handle(Event::Recheck);
    assert!(status3.borrow().holding_xds);
    d3.out.listed_at = Some(Instant::now() - HOLD_NETNS_WAIT);
    d3.handle(Event::Recheck);
    assert!(!status3.borrow().holding_xds);

    // A restarted agent with pods in its state dir serves them at once.
    drop(d);
    let (mut again, status4) = holding_driver(state.path());
    again.boot();
    assert!(!status4.borrow().holding_xds);
}

#[test]
fn deleted_pods_lose_their_record_and_a_relist_prunes_stale_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (mut d, _rx) = driver(dir.path());
    d.handle(listed(vec![pod("a", UID_A), pod("b", UID_B)]));
    assert_eq!(records(dir.path()), [format!("{UID_A}.json"), format!("{UID_B}.json")]);
    d.handle(deleted(pod("a", UID_A)));
    assert_eq!(records(dir.path()), [format!("{UID_B}.json")]);
    // A pod deleted while the agent was down: the next complete list removes its record.
    let (mut fresh, _rx) = driver(dir.path());
    fresh.boot();
    fresh.handle(listed(vec![pod("a", UID_A)]));
    assert_eq!(records(dir.path()), [format!("{UID_A}.json")]);
}

/// The cluster names of the last published snapshot, sorted.
fn cluster_names(rx: &crate::xds::publish::PodSpecs) -> Vec<String> {
    let mut names: Vec<String> = rx.snapshot().clusters.iter().map(|c| c.name.clone()).collect();
    names.sort();
    names
}

/// A driver whose [`Status`] (what `aether_agent_pods` reports) the test can read.
fn driver_with_status(state: &std::path::Path) -> (Driver, crate::xds::publish::PodSpecs, watch::Receiver<Status>) {
    let (tx, rx) = crate::xds::publish::pod_specs();
    let (status_tx, status) = watch::channel(Status::default());
    let index = Index::new(Settings::new("/var/lib/kubelet/pods", true));
    let store = Some(StateStore::open(state).unwrap());
    let d = Driver::new(index, store, CniRecords::default(), tx, status_tx, Collaborators::detached());
    (d, rx, status)
}

fn counted(status: &watch::Receiver<Status>) -> usize {
    status.borrow().pods.values().sum()
}

const B_CLUSTERS: [&str; 2] = ["app_shop_b_8080", "health_shop_b"];

#[test]
fn a_served_pod_that_turns_succeeded_loses_its_clusters_record_and_ledger_entry_on_that_event() {
    let dir = tempfile::tempdir().unwrap();
    let (d, rx, status) = driver_with_status(dir.path());
    let (mut d, mut events) = with_notices(d);
    // Pod a has a ledger entry (an over-budget socket) so the test sees it handled too.
    // Running with an IP, so a TCP-delivered pod gets clusters, not "waiting".
    let a = cart("a", UID_A).annotation_socket(LONG).phase("Running").ip("10.1.2.3");
    d.handle(listed(vec![a.clone().build(), pod("b", UID_B)]));
    assert_eq!(drain(&mut events), ["UdsPathTooLong"]);
    assert_eq!(cluster_names(&rx).len(), 4);
    assert_eq!(counted(&status), 2);

    let finished = a.phase("Succeeded").build();
    d.handle(applied(finished.clone()));
    assert_eq!(cluster_names(&rx), B_CLUSTERS, "the finished pod keeps clusters");
    assert_eq!(counted(&status), 1, "the finished pod is still counted");
    assert_eq!(records(dir.path()), [format!("{UID_B}.json")]);
    assert!(d.ledger().get(UID_A).is_none(), "the ledger still holds the finished pod");
    assert_eq!(status.borrow().fallbacks.get("path-too-long"), Some(&0));
    assert_eq!(drain(&mut events), Vec::<&str>::new(), "finishing is not a delivery change to report");

    // Resyncs of the finished pod and its final delete change nothing.
    d.handle(applied(finished.clone()));
    d.handle(deleted(finished));
    assert_eq!(cluster_names(&rx), B_CLUSTERS);
    assert_eq!(drain(&mut events), Vec::<&str>::new());

    // A restart does not resurrect it from the state dir.
    drop(d);
    let (mut again, rx2) = driver(dir.path());
    again.boot();
    assert_eq!(cluster_names(&rx2), B_CLUSTERS);
    assert!(again.ledger().is_empty());
}

#[test]
fn a_failed_pod_gets_no_clusters_from_its_first_event() {
    let dir = tempfile::tempdir().unwrap();
    let (mut d, rx, status) = driver_with_status(dir.path());
    d.handle(listed(vec![pod("b", UID_B)]));
    d.handle(applied(cart("a", UID_A).annotation_socket(SOCKET).phase("Failed").build()));
    assert_eq!(cluster_names(&rx), B_CLUSTERS);
    assert_eq!(counted(&status), 1);
    assert_eq!(records(dir.path()), [format!("{UID_B}.json")]);
}

#[test]
fn a_relist_with_a_served_pod_now_finished_prunes_it_and_its_state_dir_record() {
    let dir = tempfile::tempdir().unwrap();
    let (d, _rx) = driver(dir.path());
    let (mut d, mut events) = with_notices(d);
    let a = cart("a", UID_A).annotation_socket(LONG).phase("Running").ip("10.1.2.3");
    d.handle(listed(vec![a.clone().build(), pod("b", UID_B)]));
    assert_eq!(drain(&mut events), ["UdsPathTooLong"]);
    drop(d);
    // The pod finished while the agent was down: the boot serves it from the state dir, the
    // first list (where it is Failed) drops it, its record and its ledger entry.
    let (again, rx, status) = driver_with_status(dir.path());
    let (mut again, mut events) = with_notices(again);
    again.boot();
    assert_eq!(cluster_names(&rx).len(), 4);
    again.handle(listed(vec![a.phase("Failed").build(), pod("b", UID_B)]));
    assert_eq!(cluster_names(&rx), B_CLUSTERS);
    assert_eq!(counted(&status), 1);
    assert_eq!(records(dir.path()), [format!("{UID_B}.json")]);
    assert!(again.ledger().is_empty());
    assert_eq!(drain(&mut events), Vec::<&str>::new());
}

#[test]
fn a_draining_pod_keeps_its_clusters_until_it_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut d, mut rx, status) = driver_with_status(dir.path());
    let a = cart("a", UID_A).annotation_socket(SOCKET).phase("Running").ip("10.1.2.3");
    d.handle(listed(vec![a.clone().build(), pod("b", UID_B)]));
    let served = cluster_names(&rx);
    assert_eq!(served.len(), 4);
    rx.mark_unchanged();

    // Being deleted (a `deletionTimestamp`): kubelet is stopping it.
    let draining = a.deleting("2030-01-01T00:00:00Z");
    d.handle(applied(draining.clone().build()));
    d.handle(listed(vec![draining.clone().build(), pod("b", UID_B)]));
    assert!(!rx.has_changed(), "a deletionTimestamp alone changed the snapshot");
    assert_eq!(cluster_names(&rx), served);
    assert_eq!(counted(&status), 2);
    assert_eq!(records(dir.path()), [format!("{UID_A}.json"), format!("{UID_B}.json")]);

    d.handle(applied(draining.phase("Succeeded").build()));
    assert_eq!(cluster_names(&rx), B_CLUSTERS);
    assert_eq!(counted(&status), 1);
    assert_eq!(records(dir.path()), [format!("{UID_B}.json")]);
}

#[test]
fn a_relist_of_the_same_state_writes_nothing_and_publishes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (mut d, mut rx) = driver(dir.path());
    d.handle(listed(vec![pod("a", UID_A)]));
    rx.mark_unchanged();
    let file = dir.path().join(format!("pods/{UID_A}.json"));
    let before = std::fs::metadata(&file).unwrap().modified().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    d.handle(listed(vec![pod("a", UID_A)]));
    assert_eq!(std::fs::metadata(&file).unwrap().modified().unwrap(), before, "record rewritten");
    assert!(!rx.has_changed(), "a snapshot was published for a no-op relist");
}

/// `d` (fresh: nothing reported yet) queueing its pod Events where the test reads them.
fn with_notices(mut d: Driver) -> (Driver, tokio::sync::mpsc::Receiver<pod_events::Notice>) {
    let (tx, rx) = NoticeSender::channel(Arc::new(crate::metrics::Metrics::new()));
    d.notices = Notices::new(tx);
    (d, rx)
}

fn drain(rx: &mut tokio::sync::mpsc::Receiver<pod_events::Notice>) -> Vec<&'static str> {
    std::iter::from_fn(|| rx.try_recv().ok()).map(|n| n.reason).collect()
}

/// The socket [`pod`] declares and [`cart_policy`] names.
const SOCKET: &str = "s/app.sock";

const LONG: &str = "sockets/app1234567890.sock";

/// Policy shop/cart-uds: Service cart (the fixture pods' ServiceAccount) over [`SOCKET`].
fn cart_policy() -> EndpointPolicy {
    aether_fixtures::policy("shop", "cart-uds").target("cart").socket(SOCKET).build()
}

#[test]
fn a_policy_change_sends_the_renderer_only_the_pods_of_its_service_and_a_resync_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (mut d, rx, status) = driver_with_status(dir.path());
    let other = |name: &str, uid: &str| aether_fixtures::pod("shop", name).uid(uid).sa("other").ip("10.0.0.9").build();
    let pods = vec![
        cart("a", UID_A).ip("10.0.0.1").build(),
        cart("b", UID_B).ip("10.0.0.2").build(),
        other("x", "22222222-2222-4333-8444-555555555555"),
        other("y", "33333333-2222-4333-8444-555555555555"),
    ];
    d.handle(listed(pods));
    assert_eq!(rx.take(false).len(), 4, "the first list sends every pod");
    assert_eq!(status.borrow().pods.get("tcp"), Some(&4));

    d.handle(Event::PolicyApplied(Box::new(cart_policy())));
    let sent: Vec<String> = rx.take(false).into_iter().map(|(k, r)| format!("{}:{}", k.name, r.is_some())).collect();
    assert_eq!(sent, ["a:true", "b:true"], "only the policy's service's pods, re-rendered");
    let s = status.borrow().clone();
    assert_eq!((s.pods.get("tcp"), s.pods.values().sum::<usize>()), (Some(&2), 4), "counts kept by difference");
    assert_eq!(s.by_source.get(&("tcp", "none")), Some(&2));

    d.handle(Event::PolicyApplied(Box::new(cart_policy())));
    d.handle(applied(other("x", "22222222-2222-4333-8444-555555555555")));
    assert!(rx.take(false).is_empty(), "a resync sends nothing");

    d.handle(deleted(other("y", "33333333-2222-4333-8444-555555555555")));
    let sent: Vec<String> = rx.take(false).into_iter().map(|(k, r)| format!("{}:{}", k.name, r.is_some())).collect();
    assert_eq!(sent, ["y:false"]);
    assert_eq!(status.borrow().pods.values().sum::<usize>(), 3);
    assert_eq!(rx.snapshot().health_clusters.len(), 3, "the whole picture is still there");
}

#[test]
fn a_fallback_event_is_queued_once_across_resyncs_and_an_agent_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (d, _rx) = driver(dir.path());
    let (mut d, mut events) = with_notices(d);
    let long = cart("a", UID_A).annotation_socket(LONG).build();
    d.handle(listed(vec![long.clone(), pod("b", UID_B)]));
    assert_eq!(drain(&mut events), ["UdsPathTooLong"]);
    d.handle(applied(long.clone()));
    d.handle(listed(vec![long.clone(), pod("b", UID_B)]));
    d.handle(Event::Recheck);
    assert_eq!(drain(&mut events), Vec::<&str>::new());
    drop(d);
    // A restart boots from the state dir and relists: nothing is told twice.
    let (again, _rx) = driver(dir.path());
    let (mut again, mut events) = with_notices(again);
    again.boot();
    again.handle(listed(vec![long.clone(), pod("b", UID_B)]));
    assert_eq!(drain(&mut events), Vec::<&str>::new());
    assert_eq!(again.ledger().get(UID_A), Some(crate::TcpReason::PathTooLong));
    // Fixed: one Normal event; deleted while away: forgotten by the relist.
    again.handle(applied(cart("a", UID_A).annotation_socket(SOCKET).build()));
    assert_eq!(drain(&mut events), [pod_events::DELIVERED_REASON]);
    again.handle(applied(long.clone()));
    again.handle(listed(vec![pod("b", UID_B)]));
    assert!(again.ledger().is_empty());
    assert_eq!(drain(&mut events), ["UdsPathTooLong"]);
}

#[test]
fn a_fallback_fixed_by_configuration_across_a_restart_gets_its_delivered_event_once_the_pod_is_listed() {
    let dir = tempfile::tempdir().unwrap();
    let (d, _rx) = driver_with(dir.path(), Settings::new("/var/lib/kubelet/pods", false));
    let (mut d, mut events) = with_notices(d);
    d.handle(listed(vec![pod("a", UID_A), pod("b", UID_B)]));
    assert_eq!(drain(&mut events), ["UdsDisabled", "UdsDisabled"]);
    drop(d);
    // Restarted with --uds-workloads=true: the boot decides "delivered" but says nothing
    // until the API server confirms the pods; pod b was deleted meanwhile.
    let (again, _rx) = driver(dir.path());
    let (mut again, mut events) = with_notices(again);
    again.boot();
    assert_eq!(drain(&mut events), Vec::<&str>::new(), "nothing before the API server confirms");
    again.handle(listed(vec![pod("a", UID_A)]));
    let sent: Vec<pod_events::Notice> = std::iter::from_fn(|| events.try_recv().ok()).collect();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!((sent[0].reason, &*sent[0].pod.uid), (pod_events::DELIVERED_REASON, UID_A));
    again.handle(listed(vec![pod("a", UID_A)]));
    assert_eq!(drain(&mut events), Vec::<&str>::new(), "sent once");
}

#[test]
fn pods_of_a_policy_whose_crd_went_away_get_one_crd_missing_event_and_the_gauge_follows() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, _rx) = crate::xds::publish::pod_specs();
    let (status_tx, status) = watch::channel(Status::default());
    let d = Driver::new(
        Index::new(Settings::new("/var/lib/kubelet/pods", true)),
        Some(StateStore::open(dir.path()).unwrap()),
        CniRecords::default(),
        tx,
        status_tx,
        Collaborators::detached(),
    );
    let (mut d, mut events) = with_notices(d);
    d.handle(Event::PoliciesListed(vec![cart_policy()]));
    d.handle(listed(vec![cart("a", UID_A).build()]));
    assert_eq!(drain(&mut events), Vec::<&str>::new());
    assert_eq!(status.borrow().by_source.get(&("pipe", "policy")), Some(&1));
    d.handle(Event::CrdAbsent);
    assert_eq!(drain(&mut events), ["UdsPolicyCrdMissing"]);
    assert_eq!(status.borrow().fallbacks.get("policy-crd-missing"), Some(&1));
    d.handle(Event::CrdAbsent);
    d.handle(listed(vec![cart("a", UID_A).build()]));
    assert_eq!(drain(&mut events), Vec::<&str>::new());
    // Served again (CRD re-installed, its objects gone): the cause ends without an event.
    d.handle(Event::PoliciesListed(vec![]));
    assert_eq!(drain(&mut events), Vec::<&str>::new());
    assert_eq!(status.borrow().fallbacks.get("policy-crd-missing"), Some(&0));
    // No pod IP in the fixture: TCP without an address is "waiting".
    assert_eq!(status.borrow().by_source.get(&("waiting", "none")), Some(&1));
}

#[test]
fn with_uds_workloads_off_a_policy_map_left_in_the_state_dir_governs_no_pod() {
    let dir = tempfile::tempdir().unwrap();
    let (mut d, _rx) = driver(dir.path());
    d.handle(Event::PoliciesListed(vec![cart_policy()]));
    d.handle(listed(vec![cart("a", UID_A).build()]));
    let key = |d: &Driver| d.index.snapshot().iter().next().map(|(_, e)| e.delivery.policy.clone()).unwrap();
    assert_eq!(key(&d), Some("cart-uds".to_owned()));
    drop(d);
    let (mut off, _rx) = driver_with(dir.path(), Settings::new("/var/lib/kubelet/pods", false));
    off.boot();
    assert_eq!(key(&off), None, "a policy from the state dir still governs the pod");
}

/// [`cart`] with an IP (so its clusters render), created at second `created`.
fn dated(name: &str, uid: &str, created: i64) -> Pod {
    let mut p = cart(name, uid).ip("10.1.2.3").build();
    let at = k8s_openapi::jiff::Timestamp::from_second(created).unwrap();
    p.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at));
    p
}

#[test]
fn the_cluster_cap_is_metered_told_and_kept_across_an_agent_restart() {
    const UID_C: &str = "22222222-2222-4333-8444-555555555555";
    let dir = tempfile::tempdir().unwrap();
    let capped = || Settings::new("/var/lib/kubelet/pods", true).with_max_clusters(Some(4));
    let metrics = crate::metrics::Metrics::new();
    let with = Collaborators { cluster_metrics: metrics.clusters.clone(), ..Collaborators::detached() };
    let (d, rx) = driver_wired(dir.path(), capped(), with);
    let (mut d, mut events) = with_notices(d);
    d.handle(listed(vec![dated("a", UID_A, 200), dated("b", UID_B, 300)]));
    // Created before both, seen after them (scheduled here late): it waits.
    d.handle(applied(dated("late", UID_C, 100)));
    assert_eq!(drain(&mut events), ["UdsNodeClusterCapReached"]);
    let names = |rx: &crate::xds::publish::PodSpecs| -> Vec<String> {
        let mut v: Vec<String> = rx.snapshot().clusters.iter().map(|c| c.name.clone()).collect();
        v.sort();
        v
    };
    let served = ["app_shop_a_8080", "app_shop_b_8080", "health_shop_a", "health_shop_b"];
    assert_eq!(names(&rx), served);
    let text = metrics.encode(&Status::default());
    for want in [
        "aether_agent_clusters 4",
        "aether_agent_clusters_max 4",
        "aether_agent_pods_refused{reason=\"node-cluster-cap\"} 1",
    ] {
        assert!(text.lines().any(|l| l == want), "missing {want:?} in\n{text}");
    }
    drop(d);

    // A restart from the state dir serves the same pods, and tells nobody again.
    let (d, rx) = driver_with(dir.path(), capped());
    let (mut d, mut events) = with_notices(d);
    d.boot();
    assert_eq!(names(&rx), served);
    d.handle(listed(vec![dated("late", UID_C, 100), dated("a", UID_A, 200), dated("b", UID_B, 300)]));
    assert_eq!(names(&rx), served);
    assert_eq!(drain(&mut events), Vec::<&str>::new());
    // b goes: the late pod gets its room.
    d.handle(deleted(dated("b", UID_B, 300)));
    assert_eq!(names(&rx), ["app_shop_a_8080", "app_shop_late_8080", "health_shop_a", "health_shop_late"]);
}

/// Removes every pin of a pin dir when dropped (they are mounts), whatever the test's outcome.
struct PinsRemoved(crate::pin::Pinner);

impl Drop for PinsRemoved {
    fn drop(&mut self) {
        self.0.retain(&std::collections::HashSet::new());
    }
}

/// A replaced agent (its state dir starts empty) lists the pods before the policies. A pod whose
/// socket comes from a policy keeps the pin the previous agent made until the policy list is in:
/// the node's Envoy dials that pin meanwhile, and removing it failed those connections (seen as
/// a lone reset under load at every agent pod replacement). Once the policies are listed, a pin
/// that no policy names any more goes. Real sockets and real pins (mounts: root, as CI runs).
#[test]
fn a_replaced_agent_keeps_a_policy_pods_pin_until_the_policies_are_listed() {
    use std::os::unix::net::{UnixListener, UnixStream};
    let dir = tempfile::Builder::new().prefix("apin").tempdir_in("/tmp").unwrap();
    let (pods, pins) = (dir.path().join("pods"), dir.path().join("pins"));
    let _cleanup = PinsRemoved(crate::pin::Pinner::new(&pods, &pins).unwrap());
    // The apps of pods a and b have bound their sockets.
    let _apps: Vec<UnixListener> = [UID_A, UID_B]
        .iter()
        .map(|uid| {
            let volume = pods.join(uid).join("volumes/kubernetes.io~empty-dir/s");
            std::fs::create_dir_all(&volume).unwrap();
            UnixListener::bind(volume.join("app.sock")).unwrap()
        })
        .collect();
    let agent = |state: &std::path::Path| {
        let settings =
            Settings::new(pods.to_str().unwrap(), true).with_pin_dir(Some(pins.to_str().unwrap().to_owned()));
        let pinner = crate::pin::Pinner::new(&pods, &pins).unwrap();
        let with = Collaborators { sockets: SocketCheck::Pinned(pinner), ..Collaborators::detached() };
        driver_wired(state, settings, with).0
    };
    let reaches = |uid: &str| UnixStream::connect(pins.join(format!("{uid}.sock"))).is_ok();
    let pods_now = || vec![cart("a", UID_A).ip("10.0.0.1").build(), cart("b", UID_B).ip("10.0.0.2").build()];

    let first = tempfile::tempdir().unwrap();
    let mut old = agent(first.path());
    old.handle(listed(pods_now()));
    old.handle(Event::PoliciesListed(vec![cart_policy()]));
    assert!(reaches(UID_A) && reaches(UID_B), "the first agent pinned both policy pods");
    drop(old);

    let second = tempfile::tempdir().unwrap();
    let mut new = agent(second.path());
    new.handle(listed(pods_now()));
    assert!(reaches(UID_A) && reaches(UID_B), "a replaced agent removed the pins before the policies were listed");
    new.handle(Event::PoliciesListed(vec![cart_policy()]));
    assert!(reaches(UID_A) && reaches(UID_B), "the pins after the policy list");
    drop(new);

    // The policy was deleted while no agent ran: its pods' pins go once the (empty) list is in.
    let third = tempfile::tempdir().unwrap();
    let mut next = agent(third.path());
    next.handle(listed(pods_now()));
    assert!(reaches(UID_A), "kept until the policies are known");
    next.handle(Event::PoliciesListed(Vec::new()));
    assert!(!pins.join(format!("{UID_A}.sock")).exists(), "a pin no policy names stays after the list");
    assert!(!pins.join(format!("{UID_B}.sock")).exists(), "a pin no policy names stays after the list");
}
