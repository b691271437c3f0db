//! What the loop remembers per pod so that it says and counts each thing once: the digest of
//! the pod's last logged delivery line ([`DeliveryLog`]: a line is logged when it changes, never
//! per resync), and what the pod counts for in the status and the cluster metrics ([`Tally`],
//! summed by difference in [`Counts`]: a change costs work for the pods it touched, never a pass
//! over the node; docs/design-notes.md "Per-change work and a lean process").

use std::collections::{BTreeMap, HashMap, HashSet};

use aether_agent_core::fallback::TcpReason;
use aether_agent_core::index::{DeliveryMap, PodDelivery};
use aether_agent_core::record::PodKey;
use aether_agent_core::refusal::Refusal;
use aether_agent_core::render::Effective;

use aether_agent_core::render::PodRender;

/// Each pod's last logged delivery line, as its [`line_digest`] (a digest, not the line: 8 bytes
/// per pod instead of a sentence).
#[derive(Debug, Default)]
pub struct DeliveryLog {
    logged: HashMap<PodKey, u64>,
}

impl DeliveryLog {
    /// Logs the delivery of each pod of `keys` (entries from `map`) whose line changed since it
    /// was last logged. A pod refused on disk (in `refused`) is not: the check logged the refusal
    /// (and logs its end); nor is one whose socket does not exist yet (in `awaiting`): it is
    /// logged as delivered once the socket is verified.
    pub fn log(
        &mut self,
        map: &DeliveryMap,
        keys: &[PodKey],
        refused: &HashMap<PodKey, Refusal>,
        awaiting: &HashSet<PodKey>,
    ) {
        for key in keys {
            let Some(entry) = map.get(key) else { continue };
            let d = &entry.delivery;
            let line = line_digest(d.source.label(), &d.reason);
            if self.logged.get(key) == Some(&line) {
                continue;
            }
            match (d.is_pipe(), &d.socket) {
                _ if d.tcp_reason().is_some_and(TcpReason::serves_nothing) => {
                    tracing::warn!(pod = %key, reason = d.source.label(), detail = %d.reason, "pod is served no clusters")
                }
                (true, _) if refused.contains_key(key) => continue,
                (true, _) if awaiting.contains(key) => {
                    tracing::debug!(pod = %key, path = %d.path.as_ref().map(|p| p.as_str()).unwrap_or(""), "the pod's socket does not exist yet; delivering over it once its app binds it");
                    continue;
                }
                (true, _) => {
                    tracing::info!(pod = %key, source = d.source.label(), path = %d.path.as_ref().map(|p| p.as_str()).unwrap_or(""), "delivering over the pod's Unix socket")
                }
                (false, Some(socket)) => {
                    tracing::warn!(pod = %key, socket = %socket, reason = d.source.label(), detail = %d.reason, "pod declared a socket but is delivered over TCP")
                }
                (false, None) => tracing::debug!(pod = %key, "delivering over TCP"),
            }
            self.logged.insert(key.clone(), line);
        }
    }

    /// Forgets `key`'s last line (gone, or its socket just appeared): the next is logged.
    pub fn forget(&mut self, key: &PodKey) {
        self.logged.remove(key);
    }
}

/// The digest [`DeliveryLog`] keeps of a pod's logged delivery line (its source label and
/// reason): SipHash-1-3 with fixed keys ([`std::hash::DefaultHasher::new`]), so equal lines give
/// equal digests for the life of the process.
fn line_digest(source: &str, reason: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    (source, reason).hash(&mut h);
    h.finish()
}

/// What one pod counts for in the status and the cluster metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// `pipe`, `tcp`, `waiting` or `refused` (its effective delivery).
    kind: &'static str,
    /// `annotation`, `policy` or `none`: what asked for a socket.
    source: &'static str,
    /// Clusters it renders.
    clusters: usize,
    /// The cap that refused it any cluster, if one did.
    refused: Option<TcpReason>,
}

impl Tally {
    /// What the pod of `entry`, rendered as `render`, counts for.
    pub fn of(entry: &PodDelivery, render: &PodRender) -> Tally {
        let kind = match render.effective {
            Effective::Pipe(_) => "pipe",
            Effective::Tcp => "tcp",
            Effective::Waiting => "waiting",
            Effective::Refused => "refused",
        };
        let source = if entry.pod.uds_socket.is_some() {
            "annotation"
        } else if entry.delivery.policy.is_some() {
            "policy"
        } else {
            "none"
        };
        let refused = entry.delivery.tcp_reason().filter(|r| r.serves_nothing());
        Tally { kind, source, clusters: render.clusters.len(), refused }
    }
}

/// The node's counts (pods by delivery and source, clusters, pods refused by a cap), kept by
/// adding and removing each re-rendered pod's [`Tally`]; a count that drops to zero is removed,
/// as a fresh count would not list it.
#[derive(Debug, Default)]
pub struct Counts {
    /// Pods by effective delivery (the status's `pods`).
    pub pods: HashMap<&'static str, usize>,
    /// Pods by effective delivery and source (the status's `by_source`).
    pub by_source: BTreeMap<(&'static str, &'static str), usize>,
    /// Clusters rendered.
    pub clusters: usize,
    /// Pods refused any cluster, by cap.
    pub refused: BTreeMap<TcpReason, usize>,
}

impl Counts {
    /// Counts `t`.
    pub fn add(&mut self, t: &Tally) {
        *self.pods.entry(t.kind).or_default() += 1;
        *self.by_source.entry((t.kind, t.source)).or_default() += 1;
        self.clusters += t.clusters;
        if let Some(r) = t.refused {
            *self.refused.entry(r).or_default() += 1;
        }
    }

    /// Stops counting `t` (counted before).
    pub fn remove(&mut self, t: &Tally) {
        /// Decrements a count; true when it reached zero.
        fn dec(n: Option<&mut usize>) -> bool {
            n.is_some_and(|n| {
                *n -= 1;
                *n == 0
            })
        }
        if dec(self.pods.get_mut(t.kind)) {
            self.pods.remove(t.kind);
        }
        if dec(self.by_source.get_mut(&(t.kind, t.source))) {
            self.by_source.remove(&(t.kind, t.source));
        }
        self.clusters -= t.clusters;
        if let Some(r) = t.refused
            && dec(self.refused.get_mut(&r))
        {
            self.refused.remove(&r);
        }
    }
}
