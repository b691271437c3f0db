//! The on-disk check before a pipe is rendered (docs/design-notes.md, "Agent", "Symlink check and
//! its window; socket pinning closes it").
//!
//! The socket value is written by whoever can create pods, and the proxy that dials it is root.
//! `connect(2)` follows symlinks, so a pod could plant a symlink (as its socket file, or anywhere on
//! the way to it) that points at another pod's socket or an agent socket. Before a pipe is rendered,
//! and again on every periodic re-check, every component under the pod's directory is examined with
//! `lstat` (which does not follow links):
//!
//! - `<pods-dir>/<id>`, `…/volumes`, `…/kubernetes.io~empty-dir` and `…/<volume>` must each be a real
//!   directory, or not exist yet (kubelet has not created it: the pipe is rendered, and the health
//!   check fails like a not-yet-listening port);
//! - the socket file must be a real socket, or not exist yet.
//!
//! Anything else refuses the pipe and the pod is delivered over TCP with the reason. The pods dir
//! itself is operator configuration, not pod input, and is not checked.
//!
//! Remaining window: between this check and Envoy's `connect(2)` the pod can swap the socket for a
//! symlink. The periodic re-check bounds how long such a swap can stand. Envoy's pipe upstream has
//! no `O_NOFOLLOW`-like open, so only socket pinning ([`crate::pin`], `--pin-dir`) closes it: Envoy
//! then dials a path the agent owns, never one the pod can change.

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use aether_crds::SocketPath;

pub use aether_agent_core::refusal::Refusal;

fn kind_of(ft: fs::FileType) -> &'static str {
    if ft.is_file() {
        "regular file"
    } else if ft.is_dir() {
        "directory"
    } else if ft.is_fifo() {
        "fifo"
    } else if ft.is_char_device() || ft.is_block_device() {
        "device"
    } else {
        "special file"
    }
}

/// Checks the components of `socket` below `pods_dir` with `lstat`, as described in the module
/// docs. `pods_dir` must be the prefix `socket` was resolved under.
///
/// # Errors
/// The first [`Refusal`] found, walking from the pod directory down to the socket.
pub fn check(pods_dir: &str, socket: &SocketPath) -> Result<(), Refusal> {
    let volume_dir = socket.volume_dir();
    let below = volume_dir.strip_prefix(pods_dir).unwrap_or(volume_dir);
    let mut current = pods_dir.trim_end_matches('/').to_owned();
    for segment in below.split('/').filter(|s| !s.is_empty()) {
        current.push('/');
        current.push_str(segment);
        match fs::symlink_metadata(&current) {
            Ok(md) if md.file_type().is_symlink() => return Err(Refusal::Symlink { path: current }),
            Ok(md) if !md.is_dir() => return Err(Refusal::NotDirectory { path: current }),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Refusal::Unreadable { path: current, error: e.to_string() }),
        }
    }
    let path = socket.as_str();
    match fs::symlink_metadata(Path::new(path)) {
        Ok(md) if md.file_type().is_symlink() => Err(Refusal::Symlink { path: path.to_owned() }),
        Ok(md) if md.file_type().is_socket() => Ok(()),
        Ok(md) => Err(Refusal::NotSocket { path: path.to_owned(), found: kind_of(md.file_type()) }),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Refusal::Unreadable { path: path.to_owned(), error: e.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;
    use std::os::unix::net::UnixListener;

    use aether_crds::{Budget, PodDirId};

    use super::*;

    const UID_A: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
    const UID_B: &str = "11111111-2222-3333-4444-555555555555";

    struct Pods {
        _dir: tempfile::TempDir,
        root: String,
        budget: Budget,
    }

    impl Pods {
        fn new() -> Self {
            // A short temp root keeps the resolved paths inside sun_path.
            let dir = tempfile::Builder::new().prefix("p").tempdir_in("/tmp").unwrap();
            let root = dir.path().to_str().unwrap().to_owned();
            let budget = Budget::new(&root).unwrap();
            Pods { _dir: dir, root, budget }
        }
        fn path(&self, uid: &str, value: &str) -> SocketPath {
            self.budget.resolve(&PodDirId::new(uid).unwrap(), value).unwrap()
        }
        fn mkvol(&self, p: &SocketPath) {
            fs::create_dir_all(p.volume_dir()).unwrap();
        }
    }

    #[test]
    fn a_real_socket_in_a_real_volume_dir_passes() {
        let pods = Pods::new();
        let p = pods.path(UID_A, "s/app.sock");
        pods.mkvol(&p);
        let _l = UnixListener::bind(p.as_str()).unwrap();
        assert_eq!(check(&pods.root, &p), Ok(()));
    }

    #[test]
    fn a_socket_not_created_yet_passes_so_the_health_check_decides() {
        let pods = Pods::new();
        let p = pods.path(UID_A, "s/app.sock");
        assert_eq!(check(&pods.root, &p), Ok(()), "no pod dir at all");
        pods.mkvol(&p);
        assert_eq!(check(&pods.root, &p), Ok(()), "volume dir, no socket yet");
    }

    #[test]
    fn a_symlinked_socket_pointing_at_another_pods_socket_is_refused() {
        let pods = Pods::new();
        let victim = pods.path(UID_B, "s/app.sock");
        pods.mkvol(&victim);
        let _l = UnixListener::bind(victim.as_str()).unwrap();
        let attacker = pods.path(UID_A, "s/app.sock");
        pods.mkvol(&attacker);
        symlink(victim.as_str(), attacker.as_str()).unwrap();
        let err = check(&pods.root, &attacker).unwrap_err();
        assert_eq!(err.label(), "symlink");
        assert!(err.to_string().contains(attacker.as_str()));
    }

    #[test]
    fn a_symlinked_volume_dir_pointing_at_another_pods_volume_is_refused() {
        let pods = Pods::new();
        let victim = pods.path(UID_B, "s/app.sock");
        pods.mkvol(&victim);
        let _l = UnixListener::bind(victim.as_str()).unwrap();
        let attacker = pods.path(UID_A, "s/app.sock");
        fs::create_dir_all(Path::new(attacker.volume_dir()).parent().unwrap()).unwrap();
        symlink(victim.volume_dir(), attacker.volume_dir()).unwrap();
        assert_eq!(check(&pods.root, &attacker), Err(Refusal::Symlink { path: attacker.volume_dir().to_owned() }));
    }

    #[test]
    fn a_symlink_higher_up_in_the_pod_dir_is_refused() {
        let pods = Pods::new();
        let victim = pods.path(UID_B, "s/app.sock");
        pods.mkvol(&victim);
        let attacker = pods.path(UID_A, "s/app.sock");
        symlink(format!("{}/{UID_B}", pods.root), format!("{}/{UID_A}", pods.root)).unwrap();
        assert_eq!(check(&pods.root, &attacker), Err(Refusal::Symlink { path: format!("{}/{UID_A}", pods.root) }));
    }

    #[test]
    fn a_regular_file_where_the_socket_should_be_is_refused() {
        let pods = Pods::new();
        let p = pods.path(UID_A, "s/app.sock");
        pods.mkvol(&p);
        fs::write(p.as_str(), b"not a socket").unwrap();
        assert_eq!(
            check(&pods.root, &p),
            Err(Refusal::NotSocket { path: p.as_str().to_owned(), found: "regular file" })
        );
    }

    #[test]
    fn a_file_where_the_volume_dir_should_be_is_refused() {
        let pods = Pods::new();
        let p = pods.path(UID_A, "s/app.sock");
        fs::create_dir_all(Path::new(p.volume_dir()).parent().unwrap()).unwrap();
        fs::write(p.volume_dir(), b"").unwrap();
        let err = check(&pods.root, &p).unwrap_err();
        assert_eq!(err, Refusal::NotDirectory { path: p.volume_dir().to_owned() });
        assert_eq!(err.label(), "not-a-directory", "the log, the Event and the metric say the same");
    }
}
