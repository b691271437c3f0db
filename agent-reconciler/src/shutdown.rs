//! What the agent removes from the host when it stops (SIGTERM/SIGINT), so nothing it created
//! outlives it.
//!
//! - Its own xDS socket file: always, but only while the path still holds the very socket it
//!   bound (same device and inode, [`FileId`]): a newer agent that replaced it keeps its socket.
//! - The health-gateway socket (`--health-socket`): Envoy binds it from the agent's LDS and
//!   unlinks a stale one when it binds, but never removes it on exit. The agent removes it only
//!   when every Envoy ADS stream closed within `--shutdown-wait-seconds` (the proxy went away
//!   with the agent: pod deletion, `helm uninstall`), and only if the path is a socket (`lstat`:
//!   a symlink is never followed, a non-socket never removed). An Envoy still connected when the
//!   wait ends is still serving that listener (only the agent container is restarting): the
//!   socket stays.
//!
//! The decisions ([`own_socket_action`], [`health_socket_action`]) are pure; [`remove_own_socket`]
//! and [`remove_health_socket`] look at the path, decide, act, and log the decision at info with
//! the path. Between the look and the unlink another process could replace the file; both run
//! once, at exit, on paths only the agent and its Envoy use.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

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

/// The health-gateway socket at exit: removed when every Envoy stream closed within the wait
/// (`envoy_gone`) and the path is a socket.
pub fn health_socket_action(envoy_gone: bool, found: Found) -> Action {
    match (envoy_gone, found) {
        (false, _) => Action::Keep("an Envoy is still connected and serves the health listener"),
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
pub fn remove_health_socket(path: &Path, envoy_gone: bool) {
    act(path, "health socket", Found::at(path).map(|found| health_socket_action(envoy_gone, found)));
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

    #[test]
    fn the_health_socket_is_removed_only_when_envoy_is_gone_and_it_is_a_socket() {
        assert_eq!(health_socket_action(true, Found::Socket(OURS)), Action::Remove);
        for found in [Found::Socket(OURS), Found::Missing, Found::Symlink, Found::Other] {
            assert!(matches!(health_socket_action(false, found), Action::Keep(_)), "{found:?}");
        }
        for found in [Found::Missing, Found::Symlink, Found::Other] {
            assert!(matches!(health_socket_action(true, found), Action::Keep(_)), "{found:?}");
        }
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
        remove_health_socket(&link, true);
        remove_health_socket(&file, true);
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
