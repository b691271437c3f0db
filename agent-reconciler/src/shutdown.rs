//! What the agent removes from the host when it stops (SIGTERM/SIGINT), so nothing it created
//! outlives the release.
//!
//! - Its own xDS socket file: always, but only while the path still holds the very socket it
//!   bound (same device and inode, [`FileId`]): a newer agent that replaced it keeps its socket.
//! - The socket pins and the health-gateway socket (`--health-socket`; Envoy binds it from the
//!   agent's LDS and unlinks a stale one when it binds, but never removes it on exit): only when
//!   the release goes, as [`host_state_at_exit`] decides. With `--own-daemonset` (the chart) that
//!   is when the agent's DaemonSet is gone or being deleted (`helm uninstall`;
//!   [`crate::watch::owner`]); a restart, a roll or a pod deletion leaves them for the node's
//!   Envoy, which runs in its own pod, and the next agent adopts them. Without it (agent and
//!   Envoy run together, outside Kubernetes) the agent infers it: every Envoy ADS stream closed
//!   within `--shutdown-wait-seconds`. The health socket is removed only if the path is a socket
//!   (`lstat`: a symlink is never followed, a non-socket never removed).
//!
//! The decisions ([`own_socket_action`], [`host_state_at_exit`], [`health_socket_action`]) are
//! pure; [`remove_own_socket`] and [`remove_health_socket`] look at the path, decide, act, and log
//! the decision at info with the path. Between the look and the unlink another process could
//! replace the file; both run once, at exit, on paths only the agent and its Envoy use.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use crate::watch::owner::Owner;

/// A file's identity: device and inode numbers (from `lstat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileId {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

impl FileId {
    /// The identity of `meta`.
    pub fn of(meta: &std::fs::Metadata) -> FileId {
        FileId { dev: meta.dev(), ino: meta.ino() }
    }
}

/// What `lstat` found at a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// Nothing there.
    Missing,
    /// A Unix socket with this identity.
    Socket(FileId),
    /// A symbolic link (never followed).
    Symlink,
    /// Any other kind of file (regular, directory, ...).
    Other,
}

impl Found {
    /// `lstat`s `path`.
    ///
    /// # Errors
    /// The OS error when `lstat` fails for another reason than the path not existing (e.g. a
    /// permission error on a parent directory).
    pub fn at(path: &Path) -> io::Result<Found> {
        match std::fs::symlink_metadata(path) {
            Ok(meta) => Ok(Found::of(&meta)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Found::Missing),
            Err(e) => Err(e),
        }
    }

    fn of(meta: &std::fs::Metadata) -> Found {
        let kind = meta.file_type();
        if kind.is_symlink() {
            Found::Symlink
        } else if kind.is_socket() {
            Found::Socket(FileId::of(meta))
        } else {
            Found::Other
        }
    }
}

/// A decision about one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Unlink it.
    Remove,
    /// Leave it; the reason, for the log.
    Keep(&'static str),
}

/// The agent's own (xDS) socket at exit, which it bound as `bound`: removed only while it is
/// still that socket.
pub fn own_socket_action(bound: FileId, found: Found) -> Action {
    match found {
        Found::Socket(id) if id == bound => Action::Remove,
        Found::Socket(_) => Action::Keep("another socket replaced ours (a newer agent's): not ours to remove"),
        Found::Missing => Action::Keep("already gone"),
        Found::Symlink | Found::Other => Action::Keep("no longer our socket (not a socket now)"),
    }
}

/// Whether the host state the agent keeps for Envoy (socket pins, the health socket) goes with
/// the agent at exit, and why (for the log).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostState {
    /// Remove it.
    pub remove: bool,
    /// The reason, for the log.
    pub why: &'static str,
}

/// Decides [`HostState`] at exit. `owner`: the agent's own DaemonSet as last watched (`None`
/// without `--own-daemonset`); `envoy_gone`: every Envoy ADS stream closed within the shutdown
/// wait (used only without `--own-daemonset`).
pub fn host_state_at_exit(owner: Option<Owner>, envoy_gone: bool) -> HostState {
    let (remove, why) = match (owner, envoy_gone) {
        (Some(Owner::Gone), _) => (true, "the agent's DaemonSet is gone (the release is uninstalled)"),
        (Some(Owner::Deleting), _) => (true, "the agent's DaemonSet is being deleted (the release is uninstalled)"),
        (Some(Owner::Present), _) => (
            false,
            "the agent's DaemonSet stays (a restart, a roll or a pod deletion): the node's Envoy serves it and the next agent adopts it",
        ),
        (Some(Owner::Unknown), _) => {
            (false, "the agent's DaemonSet could not be read (API server unreachable): kept, as for a restart")
        }
        (None, true) => (true, "every Envoy ADS stream closed: Envoy went away with the agent"),
        (None, false) => (false, "an Envoy is still connected and serves it"),
    };
    HostState { remove, why }
}

/// The health-gateway socket at exit: removed when `host` says so and the path is a socket.
pub fn health_socket_action(host: HostState, found: Found) -> Action {
    match (host.remove, found) {
        (false, _) => Action::Keep(host.why),
        (true, Found::Socket(_)) => Action::Remove,
        (true, Found::Missing) => Action::Keep("already gone"),
        (true, Found::Symlink) => Action::Keep("a symlink, never followed or removed"),
        (true, Found::Other) => Action::Keep("not a socket, never removed"),
    }
}

/// Removes the agent's own socket at `path` if it is still the socket `bound`; logs the decision.
pub fn remove_own_socket(path: &Path, bound: FileId) {
    act(path, "xDS socket", Found::at(path).map(|found| own_socket_action(bound, found)));
}

/// Removes the health-gateway socket at `path` per [`health_socket_action`]; logs the decision.
pub fn remove_health_socket(path: &Path, host: HostState) {
    act(path, "health socket", Found::at(path).map(|found| health_socket_action(host, found)));
}

fn act(path: &Path, what: &str, decided: io::Result<Action>) {
    let path_shown = path.display();
    match decided {
        Ok(Action::Remove) => match std::fs::remove_file(path) {
            Ok(()) => tracing::info!(path = %path_shown, "{what} removed"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                tracing::info!(path = %path_shown, "{what} left: already gone");
            }
            Err(e) => tracing::warn!(path = %path_shown, error = %e, "{what} could not be removed"),
        },
        Ok(Action::Keep(reason)) => tracing::info!(path = %path_shown, "{what} left: {reason}"),
        Err(e) => tracing::warn!(path = %path_shown, error = %e, "{what} left: cannot lstat it"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: FileId = FileId { dev: 1, ino: 42 };

    #[test]
    fn the_own_socket_is_removed_only_while_it_is_the_one_bound() {
        assert_eq!(own_socket_action(OURS, Found::Socket(OURS)), Action::Remove);
        for other in [FileId { dev: 1, ino: 43 }, FileId { dev: 2, ino: 42 }] {
            assert!(matches!(own_socket_action(OURS, Found::Socket(other)), Action::Keep(_)), "{other:?}");
        }
        for found in [Found::Missing, Found::Symlink, Found::Other] {
            assert!(matches!(own_socket_action(OURS, found), Action::Keep(_)), "{found:?}");
        }
    }

    const GO: HostState = HostState { remove: true, why: "test" };
    const STAY: HostState = HostState { remove: false, why: "test" };

    #[test]
    fn the_health_socket_is_removed_only_when_the_host_state_goes_and_it_is_a_socket() {
        assert_eq!(health_socket_action(GO, Found::Socket(OURS)), Action::Remove);
        for found in [Found::Socket(OURS), Found::Missing, Found::Symlink, Found::Other] {
            assert_eq!(health_socket_action(STAY, found), Action::Keep("test"), "{found:?}");
        }
        for found in [Found::Missing, Found::Symlink, Found::Other] {
            assert!(matches!(health_socket_action(GO, found), Action::Keep(_)), "{found:?}");
        }
    }

    #[test]
    fn the_daemonset_decides_when_named_and_envoy_streams_only_otherwise() {
        for envoy_gone in [false, true] {
            assert!(host_state_at_exit(Some(Owner::Gone), envoy_gone).remove);
            assert!(host_state_at_exit(Some(Owner::Deleting), envoy_gone).remove);
            // A roll or a pod deletion: Envoy (in its own pod) keeps serving, even when its stream
            // happened to close during the wait.
            assert!(!host_state_at_exit(Some(Owner::Present), envoy_gone).remove);
            assert!(!host_state_at_exit(Some(Owner::Unknown), envoy_gone).remove);
        }
        assert!(host_state_at_exit(None, true).remove);
        assert!(!host_state_at_exit(None, false).remove);
    }

    #[test]
    fn lstat_sees_sockets_symlinks_and_other_files_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let link = dir.path().join("link.sock");
        std::os::unix::fs::symlink(&sock, &link).unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, "x").unwrap();

        let Found::Socket(id) = Found::at(&sock).unwrap() else { panic!("a socket") };
        assert_eq!(Found::at(&link).unwrap(), Found::Symlink);
        assert_eq!(Found::at(&file).unwrap(), Found::Other);
        assert_eq!(Found::at(&dir.path().join("none")).unwrap(), Found::Missing);

        // The symlink to a socket is left, and so is what it points to.
        remove_health_socket(&link, GO);
        remove_health_socket(&file, GO);
        assert!(link.symlink_metadata().is_ok() && sock.exists() && file.exists());
        // Our socket, replaced by another one at the same path, is left.
        std::fs::remove_file(&sock).unwrap();
        let _newer = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        remove_own_socket(&sock, id);
        assert!(sock.exists(), "a newer socket at the path is not ours");
        let Found::Socket(newer) = Found::at(&sock).unwrap() else { panic!("a socket") };
        remove_own_socket(&sock, newer);
        assert!(!sock.exists());
    }
}
