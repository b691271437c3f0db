//! The agent's own DaemonSet (`--own-daemonset <namespace>/<name>`), watched so that at SIGTERM
//! the agent can tell `helm uninstall` from everything else.
//!
//! The node's Envoy runs in its own DaemonSet (docs/design-notes.md, "The agent and the node
//! proxy in two DaemonSets"), so when the agent stops, Envoy usually keeps serving: the socket
//! pins and the health socket must stay for it, and the next agent adopts them. Only when the
//! release goes (Helm deletes the DaemonSets first, then the RBAC; the garbage collector then
//! deletes the pods) are they the agent's to remove. That is what this watch reports: the
//! DaemonSet's metadata only (metadata-only requests, one object selected by
//! `metadata.name=<name>`), folded by [`owner_of`] into an [`Owner`].
//!
//! The watch starts with the agent, so the DaemonSet's deletion reaches it before the garbage
//! collector deletes the agent's pod (which happens only after that deletion), and before Helm
//! deletes the RoleBinding that lets the agent read it.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::Client;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event as WEvent};
use tokio::sync::watch;

/// What the agent knows of its own DaemonSet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// Not known yet (the first list has not arrived: API server unreachable or slow).
    Unknown,
    /// It exists and is not being deleted: the agent stops for a restart, a roll or a pod
    /// deletion.
    Present,
    /// It has a `deletionTimestamp` (foreground deletion of the release).
    Deleting,
    /// It does not exist (deleted, or never existed under that name).
    Gone,
}

/// The [`Owner`] state of a listed or watched object: [`Owner::Gone`] when there is none.
pub fn owner_of(obj: Option<&PartialObjectMeta<DaemonSet>>) -> Owner {
    match obj {
        None => Owner::Gone,
        Some(o) if o.metadata.deletion_timestamp.is_some() => Owner::Deleting,
        Some(_) => Owner::Present,
    }
}

/// Parses `--own-daemonset`: `<namespace>/<name>`, both non-empty.
///
/// # Errors
/// A message naming the flag and the expected shape.
pub fn parse_ref(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        _ => Err(format!("--own-daemonset {s:?}: expected <namespace>/<name>, e.g. aether-system/aether-node")),
    }
}

/// Watches DaemonSet `namespace/name` forever, publishing its [`Owner`] state on `state`.
/// Errors keep the last state (kube-runtime retries with backoff). Returns when every receiver of
/// `state` is gone.
pub async fn watch_owner(client: Client, namespace: String, name: String, state: watch::Sender<Owner>) {
    let daemonset = format!("{namespace}/{name}");
    // `Api<PartialObjectMeta<_>>` makes metadata-only requests.
    let api: Api<PartialObjectMeta<DaemonSet>> = Api::namespaced(client, &namespace);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api, cfg).default_backoff().boxed();
    // What the list under way found: nothing (gone) until an object arrives.
    let mut listed = Owner::Gone;
    // Logged once when the watch starts failing and once when it works again, not per retry.
    let mut failing = false;
    loop {
        let event = match events.try_next().await {
            Ok(Some(e)) => e,
            Ok(None) => return,
            Err(e) => {
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(%daemonset, error = %e, "cannot watch the agent's own DaemonSet; at exit, pins stay unless it is known gone");
                }
                continue;
            }
        };
        if std::mem::take(&mut failing) {
            tracing::info!(%daemonset, "watching the agent's own DaemonSet again");
        }
        let next = match event {
            WEvent::Init => {
                listed = Owner::Gone;
                continue;
            }
            WEvent::InitApply(obj) => {
                listed = owner_of(Some(&obj));
                continue;
            }
            WEvent::InitDone => listed,
            WEvent::Apply(obj) => owner_of(Some(&obj)),
            WEvent::Delete(_) => Owner::Gone,
        };
        if next != *state.borrow() {
            tracing::info!(%daemonset, "{}", next.at_exit());
        }
        if state.send(next).is_err() {
            return;
        }
    }
}

impl Owner {
    /// What this state means for the host state at exit, for the log.
    fn at_exit(self) -> &'static str {
        match self {
            Owner::Gone => {
                "the agent's own DaemonSet is gone: at exit the agent removes its socket pins and the health socket"
            }
            Owner::Deleting => {
                "the agent's own DaemonSet is being deleted: at exit the agent removes its socket pins and the health socket"
            }
            Owner::Present => {
                "the agent's own DaemonSet exists: at exit its socket pins and the health socket stay for the node's Envoy"
            }
            Owner::Unknown => {
                "the agent's own DaemonSet is not known: at exit its socket pins and the health socket stay"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn meta(deleting: bool) -> PartialObjectMeta<DaemonSet> {
        let mut m = PartialObjectMeta::<DaemonSet>::default();
        m.metadata.name = Some("aether-node".into());
        if deleting {
            m.metadata.deletion_timestamp = Some(Time(Default::default()));
        }
        m
    }

    #[test]
    fn the_daemonset_state_is_present_deleting_or_gone() {
        assert_eq!(owner_of(Some(&meta(false))), Owner::Present);
        assert_eq!(owner_of(Some(&meta(true))), Owner::Deleting);
        assert_eq!(owner_of(None), Owner::Gone);
    }

    #[test]
    fn the_flag_takes_namespace_slash_name() {
        assert_eq!(parse_ref("aether-system/aether-node"), Ok(("aether-system".into(), "aether-node".into())));
        for bad in ["aether-node", "/aether-node", "ns/", "a/b/c", ""] {
            let e = parse_ref(bad).unwrap_err();
            assert!(e.contains("--own-daemonset") && e.contains("<namespace>/<name>"), "{bad}: {e}");
        }
    }
}
