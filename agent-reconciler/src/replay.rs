//! Checks a restarted agent makes before it replays a node fact from the state dir
//! ([`crate::store::StoredPod`]): a pod's network namespace is replayed only while its file still
//! exists, because Envoy binds the pod's inbound listeners (and dials its TCP clusters) inside it,
//! and a namespace file that is gone means the pod's sandbox was replaced while the agent was
//! down. The runtime is asked to confirm every replayed path anyway
//! ([`crate::runtime::PodNetns::replay`]).

use std::io::ErrorKind;
use std::path::Path;

/// What the agent can see of a replayed netns path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// The file exists.
    Present,
    /// Its directory is visible but the file is not there: the sandbox went away.
    Gone,
    /// The agent cannot look (its directory is not mounted into the agent, or a permission or
    /// I/O error): the path is replayed as it was served, and the runtime's answer decides.
    Unknown,
}

/// Whether the netns file at `path` (as the proxy opens it; the chart mounts the host's netns
/// directory at the same path into the agent, read-only) still exists. One `stat(2)`, plus one of
/// its directory when the file is missing.
pub fn netns_present(path: &Path) -> Presence {
    match std::fs::symlink_metadata(path) {
        Ok(_) => Presence::Present,
        Err(e) if e.kind() == ErrorKind::NotFound => match path.parent().map(std::fs::metadata) {
            Some(Ok(dir)) if dir.is_dir() => Presence::Gone,
            _ => Presence::Unknown,
        },
        Err(_) => Presence::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_netns_file_is_present_gone_from_a_visible_dir_or_unknown_without_its_dir() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cni-1");
        std::fs::write(&file, b"").unwrap();
        assert_eq!(netns_present(&file), Presence::Present);
        assert_eq!(netns_present(&dir.path().join("cni-2")), Presence::Gone);
        assert_eq!(netns_present(&dir.path().join("not-mounted/cni-3")), Presence::Unknown);
    }
}
