//! What the driver knows of pods' network namespaces from the container runtime, and when it
//! asks again.
//!
//! - A pod is asked for when it appears or its pod IPs change (a new sandbox), never per publish.
//! - An answer `Some(path)` is kept until the pod goes or is answered again. `None` (host network,
//!   a static pod's API UID, no ready sandbox) is final for that sandbox: the pod is asked again
//!   only when its IPs change. Asking every such pod again on each periodic re-check, forever,
//!   cost 150–190 ms of agent CPU per re-check at 10k pods.
//! - An error is retried on the periodic re-check after a per-pod delay: [`RETRY_MIN`] doubling
//!   to [`RETRY_MAX`], each plus a random part of up to its own length (backon's jitter), so the
//!   retries of many pods spread out.
//! - While the runtime cannot be connected to
//!   ([`super::error::RuntimeError::is_unreachable`]) every pod would fail alike: a re-check then
//!   asks for one due pod only (a probe). The first answer that is not an error ends it, and
//!   every failed pod is due at the next re-check.
//!
//! Pure bookkeeping around the [`NetnsLookup`] handle (which never waits); time is passed in.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

use super::lookup::{NetnsLookup, NetnsUpdate, Requested};

/// The first delay before a pod whose lookup failed is asked again (before jitter): one default
/// `--recheck-seconds`, so the next re-check but one at the latest.
pub const RETRY_MIN: Duration = Duration::from_secs(10);

/// The longest delay before a pod whose lookups keep failing is asked again (before jitter).
pub const RETRY_MAX: Duration = Duration::from_secs(300);

/// One pod the runtime was asked about.
#[derive(Debug)]
struct Asked {
    /// The pod IPs when it was last asked for: other IPs mean another sandbox, asked at once.
    ips: Vec<IpAddr>,
    /// Set while its last lookup failed: when to ask again, and the delays after that.
    retry: Option<Retry>,
    /// Whether any answer (a path, none, or an error) arrived since it was asked.
    answered: bool,
}

#[derive(Debug)]
struct Retry {
    at: Instant,
    delays: ExponentialBackoff,
}

impl Retry {
    /// The first retry after a failure at `now`, with fresh delays ([`delays`]).
    fn start(now: Instant) -> Retry {
        let mut retry = Retry { at: now, delays: delays() };
        retry.again(now);
        retry
    }

    /// The next retry after another failure at `now`.
    fn again(&mut self, now: Instant) {
        // Never ends (`without_max_times`); the fallback is for the type only.
        self.at = now + self.delays.next().unwrap_or(RETRY_MAX);
    }
}

/// Pods' network namespaces as the runtime reported them, and the lookups asked or due (module
/// doc). Keyed by pod UID.
#[derive(Debug, Default)]
pub struct PodNetns {
    lookup: Option<NetnsLookup>,
    /// Pod UID → netns path as the proxy sees it.
    known: HashMap<String, String>,
    asked: HashMap<String, Asked>,
    /// Set while the runtime cannot be connected to: when the next probe is due.
    unreachable: Option<Retry>,
}

/// The retry delays of one pod, or of the runtime while it is unreachable (module doc).
fn delays() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(RETRY_MIN)
        .with_max_delay(RETRY_MAX)
        .without_max_times()
        .with_jitter()
        .build()
}

impl PodNetns {
    /// Asks through `lookup` from now on (without one, nothing is ever asked or known).
    pub fn with_lookup(lookup: NetnsLookup) -> PodNetns {
        PodNetns { lookup: Some(lookup), ..PodNetns::default() }
    }

    /// The netns path of pod `uid` as the proxy sees it, when the runtime gave one.
    pub fn path(&self, uid: &str) -> Option<&str> {
        self.known.get(uid).map(String::as_str)
    }

    /// Whether the runtime gave a netns path for pod `uid`.
    pub fn is_known(&self, uid: &str) -> bool {
        self.known.contains_key(uid)
    }

    /// Whether nothing is known or asked (every pod forgotten).
    pub fn is_empty(&self) -> bool {
        self.known.is_empty() && self.asked.is_empty()
    }

    /// Asks for pod `uid`'s netns unless it was asked for with the same pod IPs `ips` (same
    /// sandbox). A pod without IPs has no sandbox network yet: not asked.
    pub fn ask(&mut self, uid: &str, ips: &[IpAddr]) {
        if ips.is_empty() || self.asked.get(uid).is_some_and(|a| a.ips == ips) {
            return;
        }
        if self.request(uid) {
            self.asked.insert(uid.to_owned(), Asked { ips: ips.to_vec(), retry: None, answered: false });
        }
    }

    /// Takes `path`, the netns of pod `uid` replayed from the state dir by a restarted agent, as
    /// known (so the pod is served as it was before the restart) and asks the runtime to confirm
    /// it (`ips`: the pod IPs of the stored record). An answer with another path or none replaces
    /// it; an error keeps it.
    pub fn replay(&mut self, uid: &str, path: String, ips: &[IpAddr]) {
        self.known.insert(uid.to_owned(), path);
        self.ask(uid, ips);
    }

    /// Whether the runtime is still to answer for pod `uid`: a lookup is configured, no path is
    /// known, and no answer (path, none or error) arrived since it was asked or due.
    pub fn awaiting(&self, uid: &str) -> bool {
        self.lookup.is_some() && !self.known.contains_key(uid) && !self.asked.get(uid).is_some_and(|a| a.answered)
    }

    /// The periodic re-check: asks again for each of `pods` (UID, pod IPs) the runtime has not
    /// answered for and whose retry is due at `now`, and for those a full queue kept from being
    /// asked. While the runtime is unreachable, for one due pod only, once its probe is due.
    pub fn ask_due<'a>(&mut self, pods: impl Iterator<Item = (&'a str, &'a [IpAddr])>, now: Instant) {
        if self.lookup.is_none() {
            return;
        }
        let probing = match &self.unreachable {
            Some(r) if r.at > now => return,
            Some(_) => true,
            None => false,
        };
        for (uid, ips) in pods {
            let due = match self.asked.get(uid) {
                None => true,
                Some(a) => a.retry.as_ref().is_some_and(|r| r.at <= now),
            };
            if !due || ips.is_empty() || self.known.contains_key(uid) {
                continue;
            }
            if !self.request(uid) {
                break; // the queue is full: the rest at the next re-check
            }
            match self.asked.get_mut(uid) {
                // Pushed out until its answer arrives (which sets the next retry).
                Some(Asked { retry: Some(r), .. }) => r.at = now + RETRY_MAX,
                _ => {
                    self.asked.insert(uid.to_owned(), Asked { ips: ips.to_vec(), retry: None, answered: false });
                }
            }
            if probing {
                if let Some(r) = &mut self.unreachable {
                    r.again(now);
                }
                return;
            }
        }
    }

    /// Enqueues a lookup of `uid`; `false` when the queue is full (not asked).
    fn request(&self, uid: &str) -> bool {
        self.lookup.as_ref().is_some_and(|l| l.request(uid) != Requested::Full)
    }

    /// Forgets pod `uid` (deleted): what was known, asked and the lookup's state of it.
    pub fn forget(&mut self, uid: &str) {
        self.known.remove(uid);
        self.asked.remove(uid);
        if let Some(lookup) = &self.lookup {
            lookup.forget(uid);
        }
    }

    /// Forgets every asked pod for which `keep` is false (a complete pod list).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        let gone: Vec<String> = self.asked.keys().filter(|u| !keep(u)).cloned().collect();
        gone.iter().for_each(|u| self.forget(u));
    }

    /// Takes one answer at `now`; `true` when the known path changed. `live`: the pod is still
    /// on the node (an answer for a pod the driver does not know is dropped). An error keeps
    /// what was known and schedules a retry; `None` forgets the path.
    pub fn update(&mut self, (uid, answer): NetnsUpdate, live: bool, now: Instant) -> bool {
        if !live {
            return false;
        }
        let failed = match &answer {
            Err(e) if e.is_unreachable() => {
                if self.unreachable.is_none() {
                    self.unreachable = Some(Retry::start(now));
                }
                true
            }
            Err(_) => true,
            Ok(_) => {
                if self.unreachable.take().is_some() {
                    // The runtime answers again: every pod that failed is due now.
                    self.asked.values_mut().filter_map(|a| a.retry.as_mut()).for_each(|r| r.at = now);
                }
                false
            }
        };
        if let Some(asked) = self.asked.get_mut(&uid) {
            asked.answered = true;
            match (&mut asked.retry, failed) {
                (Some(r), true) => r.again(now),
                (None, true) => asked.retry = Some(Retry::start(now)),
                (_, false) => asked.retry = None,
            }
        }
        match answer {
            Ok(Some(path)) => {
                let path = path.into_string();
                let changed = self.known.get(&uid) != Some(&path);
                self.known.insert(uid, path);
                changed
            }
            Ok(None) => self.known.remove(&uid).is_some(),
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{NetnsDirs, NetnsPath, NetnsSource, RuntimeError};
    use std::sync::{Arc, Mutex};

    /// Records every UID asked and answers at once with an error (the tests hand the answers
    /// that matter to `update` themselves).
    #[derive(Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<String>>>);

    impl NetnsSource for Recorder {
        fn endpoint(&self) -> &str {
            "unix:///test"
        }
        fn netns_of(&self, uid: &str) -> impl Future<Output = Result<Option<NetnsPath>, RuntimeError>> + Send {
            self.0.lock().unwrap().push(uid.to_owned());
            std::future::ready(Err(refused()))
        }
    }

    fn ip(last: u8) -> Vec<IpAddr> {
        vec![IpAddr::from([10, 0, 0, last])]
    }

    fn refused() -> RuntimeError {
        RuntimeError::Connect { endpoint: "unix:///test".into(), detail: "connection refused".into() }
    }

    fn not_found() -> RuntimeError {
        RuntimeError::Call {
            endpoint: "unix:///test".into(),
            call: "PodSandboxStatus",
            code: tonic::Code::NotFound,
            detail: "gone".into(),
        }
    }

    fn path(f: &str) -> NetnsPath {
        NetnsDirs::new(std::path::Path::new("/run/netns"), None).unwrap().translate(&format!("/run/netns/{f}")).unwrap()
    }

    /// The UIDs the worker has looked up since the last call, once it has stopped picking up
    /// more (no new lookup for 20 ms).
    async fn asked(rec: &Recorder) -> Vec<String> {
        let mut seen = 0;
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let n = rec.0.lock().unwrap().len();
            if n == seen {
                break;
            }
            seen = n;
        }
        std::mem::take(&mut *rec.0.lock().unwrap())
    }

    /// Hands `n` the answer `a` for each of `uids`.
    fn answer(n: &mut PodNetns, uids: &[&str], a: impl Fn() -> Result<Option<NetnsPath>, RuntimeError>, now: Instant) {
        for uid in uids {
            n.update(((*uid).to_owned(), a()), true, now);
        }
    }

    #[tokio::test]
    async fn a_host_network_answer_is_final_until_the_pod_ips_change() {
        let rec = Recorder::default();
        let (lookup, _rx) = NetnsLookup::spawn(rec.clone(), 1024);
        let mut n = PodNetns::with_lookup(lookup);
        let t0 = Instant::now();
        n.ask("a", &ip(1));
        assert_eq!(asked(&rec).await, ["a"]);
        answer(&mut n, &["a"], || Ok(None), t0);
        for k in 1..=40 {
            n.ask_due([("a", ip(1).as_slice())].into_iter(), t0 + RETRY_MAX * k);
        }
        assert!(asked(&rec).await.is_empty(), "an Ok(None) pod is never asked again on a re-check");
        n.ask("a", &ip(2));
        assert_eq!(asked(&rec).await, ["a"], "a new sandbox (new IPs) is asked at once");
    }

    #[tokio::test]
    async fn a_failing_pod_is_asked_again_only_once_its_growing_delay_is_past() {
        let rec = Recorder::default();
        let (lookup, _rx) = NetnsLookup::spawn(rec.clone(), 1024);
        let mut n = PodNetns::with_lookup(lookup);
        let t0 = Instant::now();
        let pods = [("a", ip(1))];
        let pods = || pods.iter().map(|(u, i)| (*u, i.as_slice()));
        n.ask("a", &ip(1));
        assert_eq!(asked(&rec).await, ["a"]);
        // Pending: a re-check does not ask again before the answer.
        n.ask_due(pods(), t0 + RETRY_MAX * 3);
        assert!(asked(&rec).await.is_empty());
        let mut now = t0;
        let mut waits = Vec::new();
        for _ in 0..7 {
            answer(&mut n, &["a"], || Err(not_found()), now);
            let mut t = now;
            // Re-checks every 10 s until it is asked again.
            loop {
                t += RETRY_MIN;
                n.ask_due(pods(), t);
                if !asked(&rec).await.is_empty() {
                    break;
                }
            }
            waits.push((t - now).as_secs());
            now = t;
        }
        assert!(waits[0] <= 2 * RETRY_MIN.as_secs(), "{waits:?}");
        assert!(waits.iter().all(|w| *w <= 2 * RETRY_MAX.as_secs() + RETRY_MIN.as_secs()), "{waits:?}");
        assert!(waits[6] >= RETRY_MAX.as_secs(), "the delay grows to the cap: {waits:?}");
        // An answer ends the retries.
        answer(&mut n, &["a"], || Ok(Some(path("cni-1"))), now);
        n.ask_due(pods(), now + RETRY_MAX * 3);
        assert!(asked(&rec).await.is_empty());
        assert_eq!(n.path("a"), Some("/run/netns/cni-1"));
    }

    #[tokio::test]
    async fn an_unreachable_runtime_is_probed_with_one_pod_until_it_answers_then_every_failed_pod_is_asked() {
        let rec = Recorder::default();
        let (lookup, _rx) = NetnsLookup::spawn(rec.clone(), 1024);
        let mut n = PodNetns::with_lookup(lookup);
        let uids: Vec<String> = (0..50).map(|i| format!("p{i}")).collect();
        let ips: Vec<Vec<IpAddr>> = (0..50).map(|i| ip(i as u8)).collect();
        let pods = || uids.iter().zip(&ips).map(|(u, i)| (u.as_str(), i.as_slice()));
        let t0 = Instant::now();
        for (u, i) in pods() {
            n.ask(u, i);
        }
        assert_eq!(asked(&rec).await.len(), 50);
        let names: Vec<&str> = uids.iter().map(String::as_str).collect();
        answer(&mut n, &names, || Err(refused()), t0);
        // 15 minutes of re-checks every 10 s: a handful of one-pod probes, not 50 pods × 90.
        let mut probes = 0;
        let mut now = t0;
        for _ in 0..90 {
            now += RETRY_MIN;
            n.ask_due(pods(), now);
            let probe = asked(&rec).await;
            assert!(probe.len() <= 1, "{probe:?}");
            probes += probe.len();
            let refs: Vec<&str> = probe.iter().map(String::as_str).collect();
            answer(&mut n, &refs, || Err(refused()), now);
        }
        assert!((3..=10).contains(&probes), "{probes} lookups");
        // The runtime answers the next probe: every other failed pod is asked at once.
        let probe = loop {
            now += RETRY_MIN;
            n.ask_due(pods(), now);
            let probe = asked(&rec).await;
            if !probe.is_empty() {
                break probe;
            }
        };
        answer(&mut n, &[probe[0].as_str()], || Ok(None), now);
        n.ask_due(pods(), now);
        let mut all = asked(&rec).await;
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 49);
        assert!(!all.contains(&probe[0]));
    }

    #[tokio::test]
    async fn a_deleted_pod_is_forgotten_and_a_list_keeps_only_its_pods() {
        let (lookup, _rx) = NetnsLookup::spawn(Recorder::default(), 16);
        let mut n = PodNetns::with_lookup(lookup);
        let t0 = Instant::now();
        n.ask("a", &ip(1));
        n.ask("b", &ip(2));
        answer(&mut n, &["a", "b"], || Ok(Some(path("cni-1"))), t0);
        assert!(!n.update(("c".into(), Ok(Some(path("cni-2")))), false, t0), "not live: dropped");
        assert!(!n.is_known("c"));
        n.retain(|u| u == "b");
        assert!(!n.is_known("a") && n.is_known("b"));
        n.forget("b");
        assert!(n.is_empty());
    }
}
