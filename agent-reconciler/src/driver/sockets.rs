//! The on-disk verification of pods' sockets: each pipe's path is checked where it is
//! ([`crate::fscheck`]), or, with `--pin-dir`, its verified inode is pinned where Envoy dials it
//! ([`crate::pin`]) and its volume dir watched for prompt re-checks ([`crate::socket_watch`]).
//! A path refused for a link (a symlink anywhere, or a second hard link) stays refused until the
//! pod is gone, whatever later checks find: otherwise the pod could retry the swap after every
//! clean check (docs/troubleshooting.md "`UdsSymlinkRefused`", "`UdsHardLinkRefused`").

use std::collections::{HashMap, HashSet};
use std::path::Path;

use aether_agent_core::index::DeliveryMap;
use aether_agent_core::record::PodKey;
use aether_agent_core::refusal::Refusal;
use aether_crds::SocketPath;

use crate::fscheck;
use crate::pin::{PinError, Pinner};
use crate::socket_watch::SocketWatch;

/// How the loop verifies pods' sockets.
#[derive(Debug, Clone)]
pub enum SocketCheck {
    /// No pin dir: each socket path is checked where it is (`lstat`), Envoy dials it there.
    OnDisk,
    /// `--pin-dir`: each verified socket inode is pinned where Envoy dials it (the index's
    /// settings must carry the same pin dir, so render dials the pins); re-checked periodically.
    Pinned(Pinner),
    /// Pinned, and the pods' volume dirs watched with inotify for prompt re-checks
    /// ([`crate::event::Event::SocketsChanged`]).
    Watched(Pinner, SocketWatch),
}

impl SocketCheck {
    fn pinner(&self) -> Option<&Pinner> {
        match self {
            SocketCheck::OnDisk => None,
            SocketCheck::Pinned(p) | SocketCheck::Watched(p, _) => Some(p),
        }
    }

    fn watch(&self, uid: &str, socket: &SocketPath) {
        if let SocketCheck::Watched(_, w) = self {
            w.watch(uid, Path::new(socket.volume_dir()), socket.file_name());
        }
    }

    fn unwatch(&self, uid: &str) {
        if let SocketCheck::Watched(_, w) = self {
            w.unwatch(uid);
        }
    }

    fn unpin(&self, uid: &str) {
        if let Some(p) = self.pinner() {
            p.unpin(uid);
        }
    }
}

/// What one check of pipes found.
#[derive(Debug, Default)]
pub struct Checked {
    /// Pods whose refusal appeared, altered or cleared.
    pub changed: Vec<PodKey>,
    /// Pods whose awaited socket is there now: delivered over it from now on.
    pub verified: Vec<PodKey>,
    /// A link refusal was recorded (it is kept in the state dir).
    pub stuck: bool,
}

/// The verdicts of the pods' sockets.
#[derive(Debug)]
pub struct Sockets {
    check: SocketCheck,
    /// The on-disk refusal of each refused pod.
    refused: HashMap<PodKey, Refusal>,
    /// Pods whose socket path ever held a link, by UID: the refusal sticks until the pod is gone.
    /// Kept in the state dir.
    pub(super) link_refused: HashMap<String, Refusal>,
    /// Pods delivered over a socket that does not exist yet (the app has not bound it, or cannot
    /// start): they are logged as delivered over their socket once it is verified.
    awaiting: HashSet<PodKey>,
    /// Whether the policies are known (listed, or the CRD found absent): until then a pod
    /// without a socket may be one whose policy is not in yet, and its pin stays (below).
    policies_known: bool,
}

impl Sockets {
    /// Verdicts kept by `check`, none yet. `policies_known`: whether a pod's socket can come
    /// from an EndpointPolicy the loop has not seen yet (false while the policy watch has not
    /// listed; true without one, `--uds-workloads=false`).
    pub fn new(check: SocketCheck, policies_known: bool) -> Self {
        Sockets {
            check,
            refused: HashMap::new(),
            link_refused: HashMap::new(),
            awaiting: HashSet::new(),
            policies_known,
        }
    }

    /// Records that the policies are known now; true the first time (the caller then re-checks
    /// the pods without a socket, whose pins may be stale).
    pub fn policies_known(&mut self) -> bool {
        !std::mem::replace(&mut self.policies_known, true)
    }

    /// The on-disk refusal of each refused pod.
    pub fn refused(&self) -> &HashMap<PodKey, Refusal> {
        &self.refused
    }

    /// The pods refused for a link, by UID.
    pub fn link_refused(&self) -> &HashMap<String, Refusal> {
        &self.link_refused
    }

    /// Takes the link refusals a previous agent kept in the state dir.
    pub fn remember_links(&mut self, link_refused: HashMap<String, Refusal>) {
        self.link_refused = link_refused;
    }

    /// The pods whose socket does not exist yet.
    pub fn awaiting(&self) -> &HashSet<PodKey> {
        &self.awaiting
    }

    /// Re-checks the sockets of the pods `keys` (their paths from `map`; `pods_dir` is the
    /// kubelet pods dir the on-disk check resolves them under).
    pub fn check(&mut self, map: &DeliveryMap, pods_dir: &str, keys: &[PodKey]) -> Checked {
        let mut out = Checked::default();
        for key in keys {
            let socket = map.get(key).and_then(|e| e.delivery.path.as_ref());
            let (verdict, present) = self.verdict(key, socket, pods_dir);
            if verdict.is_none() && !present && socket.is_some() {
                self.awaiting.insert(key.clone());
            } else if self.awaiting.remove(key) && verdict.is_none() {
                out.verified.push(key.clone());
            }
            out.stuck |= self.stick(key, verdict.as_ref());
            if self.refused.get(key) != verdict.as_ref() {
                out.changed.push(key.clone());
                self.set(key, verdict, present);
            }
        }
        out
    }

    /// The verdict on `key`'s socket (`None`: not refused) and whether a socket is there
    /// (pinned, or refused). Watches the pod's volume dir unless it is refused for a link (that
    /// lasts the pod's life): a pod waiting for its socket, or fallen back because the path held a
    /// FIFO, a file or a directory, is served over its socket as soon as one appears.
    fn verdict(&self, key: &PodKey, socket: Option<&SocketPath>, pods_dir: &str) -> (Option<Refusal>, bool) {
        let sticky = socket.and_then(|_| self.link_refused.get(&*key.uid).cloned());
        match (self.check.pinner(), socket) {
            _ if sticky.is_some() => (sticky, true),
            (Some(pinner), Some(p)) => {
                let (verdict, present) = pin_verdict(pinner, key, p);
                if matches!(verdict, Some(Refusal::Symlink { .. } | Refusal::HardLink { .. })) {
                    self.check.unwatch(&key.uid);
                } else {
                    self.check.watch(&key.uid, p);
                }
                (verdict, present)
            }
            // A replaced agent lists pods before policies (its state dir starts empty): a pod
            // whose socket comes from a policy has none until the policy list is in, while the
            // node's Envoy still dials its pin (this agent serves Envoy only once its state is
            // complete). Removing the pin then failed those connections; it waits for the list.
            (Some(_), None) if !self.policies_known => (None, true),
            (Some(pinner), None) => {
                pinner.unpin(&key.uid);
                self.check.unwatch(&key.uid);
                (None, true)
            }
            (None, Some(p)) => match fscheck::check(pods_dir, p) {
                Ok(()) => (None, std::fs::symlink_metadata(p.as_str()).is_ok()),
                Err(r) => (Some(r), true),
            },
            (None, None) => (None, true),
        }
    }

    /// Records a link refusal of `key` not recorded yet (unpinning it); true when it did.
    fn stick(&mut self, key: &PodKey, verdict: Option<&Refusal>) -> bool {
        let Some(r @ (Refusal::Symlink { .. } | Refusal::HardLink { .. })) = verdict else { return false };
        if self.link_refused.contains_key(&*key.uid) {
            return false;
        }
        tracing::warn!(pod = %key, reason = r.label(), detail = %r, "the pod's socket path held a link: TCP until the pod is re-created");
        self.check.unpin(&key.uid);
        self.link_refused.insert(key.uid.to_string(), r.clone());
        true
    }

    /// Sets `key`'s new verdict (`present`: a socket is there), logging the change.
    fn set(&mut self, key: &PodKey, verdict: Option<Refusal>, present: bool) {
        match verdict {
            Some(r) => {
                tracing::warn!(pod = %key, reason = r.label(), detail = %r, "refusing the pod's socket path; delivering over TCP");
                self.refused.insert(key.clone(), r);
            }
            None => {
                if self.refused.remove(key).is_some() && present {
                    tracing::info!(pod = %key, "the pod's socket path holds a socket again; delivering over it");
                }
            }
        }
    }

    /// Forgets a removed pod: unpinned, unwatched, its verdicts dropped. True when it was refused
    /// for a link (the state dir's records change).
    pub fn forget(&mut self, key: &PodKey) -> bool {
        self.check.unpin(&key.uid);
        self.check.unwatch(&key.uid);
        let linked = self.link_refused.remove(&*key.uid).is_some();
        self.refused.remove(key);
        self.awaiting.remove(key);
        linked
    }

    /// Removes the pins of pods not in `keep` (by UID: a complete pod list).
    pub fn retain(&self, keep: &HashSet<String>) {
        if let Some(pinner) = self.check.pinner() {
            match pinner.retain(keep) {
                0 => {}
                n => tracing::info!(removed = n, "removed pins of pods no longer on this node"),
            }
        }
    }
}

/// Pins pod `key`'s socket: its refusal, if any, and whether a socket is there (pinned, or
/// refused). A socket that does not exist yet is no refusal: the pin path reaches nothing, like a
/// port nobody listens on. A failed mount is logged and is no refusal of the pod either (the pin
/// path reaches nothing until a re-check succeeds).
fn pin_verdict(pinner: &Pinner, key: &PodKey, socket: &SocketPath) -> (Option<Refusal>, bool) {
    match pinner.pin(&key.uid, socket) {
        Ok(_) => (None, true),
        Err(PinError::NotYet { .. }) => (None, false),
        Err(PinError::Refused(r)) => (Some(r), true),
        Err(e @ PinError::Mount { .. }) => {
            tracing::error!(pod = %key, error = %e, "cannot pin the pod's socket; its pipe reaches nothing until a re-check succeeds");
            (None, false)
        }
    }
}
