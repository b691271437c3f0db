//! Socket pinning against real sockets and real mounts (root; the CI runs as root): the pin path
//! reaches the inode the agent verified, whatever the pod does to its names afterwards.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use aether_agent_reconciler::fscheck::Refusal;
use aether_agent_reconciler::pin::{PinError, Pinner, pin_path};
use aether_crds::{Budget, SocketPath};

const ATTACKER: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
const VICTIM: &str = "11111111-2222-4333-8444-555555555555";

/// A pods dir and a pin dir in one temp dir; every pin is removed on drop.
struct Node {
    dir: tempfile::TempDir,
    pinner: Pinner,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.pinner.retain(&HashSet::new());
    }
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::Builder::new().prefix("apin").tempdir_in("/tmp").unwrap();
        let pinner = Pinner::new(dir.path().join("pods"), dir.path().join("pins")).unwrap();
        Node { dir, pinner }
    }

    fn pods(&self) -> PathBuf {
        self.dir.path().join("pods")
    }

    /// The resolved socket path of `uid`'s `s/app.sock`.
    fn socket(&self, uid: &str) -> SocketPath {
        let budget = Budget::new(self.pods().to_str().unwrap()).unwrap();
        budget.resolve(&aether_crds::PodDirId::new(uid).unwrap(), "s/app.sock").unwrap()
    }

    fn volume_dir(&self, uid: &str) -> PathBuf {
        self.pods().join(uid).join("volumes/kubernetes.io~empty-dir/s")
    }

    /// An app serving `name` on `uid`'s socket (one answer per connection), as an app does:
    /// unlink, bind, listen. Stopped (its listening socket closed) on drop.
    fn app(&self, uid: &str, name: &'static str) -> App {
        let dir = self.volume_dir(uid);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("app.sock");
        let _ = std::fs::remove_file(&path);
        App::serve(UnixListener::bind(&path).unwrap(), name)
    }
}

/// A socket server thread; dropping it closes the listening socket (a stopped container).
struct App {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl App {
    fn serve(listener: UnixListener, name: &'static str) -> App {
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut c, _)) => {
                        let _ = c.write_all(name.as_bytes());
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(2)),
                }
            }
        });
        App { stop, thread: Some(thread) }
    }
}

impl Drop for App {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Who answers on `path`: `Ok(name)` or the connect error.
fn who(path: &str) -> Result<String, std::io::ErrorKind> {
    let mut c = UnixStream::connect(path).map_err(|e| e.kind())?;
    let mut s = String::new();
    c.read_to_string(&mut s).map_err(|e| e.kind())?;
    Ok(s)
}

fn refusal(r: Result<aether_agent_reconciler::pin::Pin, PinError>) -> Refusal {
    match r {
        Err(PinError::Refused(r)) => r,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_pin_keeps_reaching_the_verified_socket_after_the_pod_swaps_its_name_for_a_link() {
    let node = Node::new();
    let _a = node.app(ATTACKER, "attacker");
    let _v = node.app(VICTIM, "victim");
    let pin = node.pinner.pin(ATTACKER, &node.socket(ATTACKER)).unwrap();
    assert_eq!(pin.path, pin_path(node.pinner.dir().to_str().unwrap(), ATTACKER));
    assert!(pin.path.len() < 108);
    assert_eq!(who(&pin.path).as_deref(), Ok("attacker"));

    // The attack: the pod's socket name becomes a link to the victim's socket.
    let name = node.volume_dir(ATTACKER).join("app.sock");
    std::fs::rename(&name, node.volume_dir(ATTACKER).join("real.sock")).unwrap();
    std::os::unix::fs::symlink(node.socket(VICTIM).as_str(), &name).unwrap();
    assert_eq!(who(name.to_str().unwrap()).as_deref(), Ok("victim"), "the name now leads to the victim");
    for _ in 0..100 {
        assert_eq!(who(&pin.path).as_deref(), Ok("attacker"), "the pin never does");
    }
    // The next check refuses the link and removes the pin: nothing is reached, never the victim.
    assert!(matches!(refusal(node.pinner.pin(ATTACKER, &node.socket(ATTACKER))), Refusal::Symlink { .. }));
    assert!(who(&pin.path).is_err());
}

#[test]
fn a_symlinked_volume_dir_a_hard_link_and_a_regular_file_are_refused() {
    let node = Node::new();
    let _v = node.app(VICTIM, "victim");
    // The volume dir itself is a link to the victim's.
    let parent = node.pods().join(ATTACKER).join("volumes/kubernetes.io~empty-dir");
    std::fs::create_dir_all(&parent).unwrap();
    std::os::unix::fs::symlink(node.volume_dir(VICTIM), parent.join("s")).unwrap();
    assert!(matches!(refusal(node.pinner.pin(ATTACKER, &node.socket(ATTACKER))), Refusal::Symlink { .. }));
    std::fs::remove_file(parent.join("s")).unwrap();

    // A hard link to the victim's socket (same file system).
    std::fs::create_dir_all(node.volume_dir(ATTACKER)).unwrap();
    std::fs::hard_link(node.socket(VICTIM).as_str(), node.socket(ATTACKER).as_str()).unwrap();
    assert!(matches!(refusal(node.pinner.pin(ATTACKER, &node.socket(ATTACKER))), Refusal::HardLink { links: 2, .. }));
    // ... which also makes the victim's own socket two-named: refused too, until the link goes.
    assert!(matches!(refusal(node.pinner.pin(VICTIM, &node.socket(VICTIM))), Refusal::HardLink { .. }));
    std::fs::remove_file(node.socket(ATTACKER).as_str()).unwrap();
    assert_eq!(who(&node.pinner.pin(VICTIM, &node.socket(VICTIM)).unwrap().path).as_deref(), Ok("victim"));

    std::fs::write(node.socket(ATTACKER).as_str(), b"not a socket").unwrap();
    assert!(matches!(
        refusal(node.pinner.pin(ATTACKER, &node.socket(ATTACKER))),
        Refusal::NotSocket { found: "regular file", .. }
    ));
}

#[test]
fn a_missing_socket_pins_nothing_and_a_re_created_one_is_re_pinned() {
    let node = Node::new();
    assert!(matches!(node.pinner.pin(ATTACKER, &node.socket(ATTACKER)), Err(PinError::NotYet { .. })));
    let first = node.app(ATTACKER, "first");
    let pin = node.pinner.pin(ATTACKER, &node.socket(ATTACKER)).unwrap();
    assert_eq!(who(&pin.path).as_deref(), Ok("first"));
    assert_eq!(node.pinner.pin(ATTACKER, &node.socket(ATTACKER)).unwrap(), pin, "same inode: kept");

    // The app restarts: the old process is gone, unlink + bind makes a new inode; the old pin
    // reaches the dead socket.
    drop(first);
    let _second = node.app(ATTACKER, "second");
    assert_eq!(who(&pin.path), Err(std::io::ErrorKind::ConnectionRefused));
    let again = node.pinner.pin(ATTACKER, &node.socket(ATTACKER)).unwrap();
    assert_ne!(again.inode, pin.inode);
    assert_eq!(who(&again.path).as_deref(), Ok("second"));

    // The socket removed: the pin goes, the path reaches nothing.
    std::fs::remove_file(node.socket(ATTACKER).as_str()).unwrap();
    assert!(matches!(node.pinner.pin(ATTACKER, &node.socket(ATTACKER)), Err(PinError::NotYet { .. })));
    assert!(who(&again.path).is_err());
}

#[test]
fn a_memory_volume_is_pinned_through_its_own_mount_and_stale_pins_are_collected() {
    let node = Node::new();
    let dir = node.volume_dir(ATTACKER);
    std::fs::create_dir_all(&dir).unwrap();
    let mounted = Command::new("mount").args(["-t", "tmpfs", "aether-test", dir.to_str().unwrap()]).status().unwrap();
    assert!(mounted.success(), "mount tmpfs (needs root)");
    let _unmount = Unmount(dir.clone());
    let _app = node.app(ATTACKER, "tmpfs-app");
    let pin = node.pinner.pin(ATTACKER, &node.socket(ATTACKER)).unwrap();
    assert_eq!(who(&pin.path).as_deref(), Ok("tmpfs-app"));

    let _v = node.app(VICTIM, "victim");
    node.pinner.pin(VICTIM, &node.socket(VICTIM)).unwrap();
    assert_eq!(node.pinner.retain(&HashSet::from([VICTIM.to_owned()])), 1);
    assert!(who(&pin.path).is_err(), "the stale pin is gone");
    assert!(!Path::new(&pin.path).exists());
    assert_eq!(node.pinner.retain(&HashSet::new()), 1);
}

/// Unmounts a test mount on drop.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn the_socket_watch_names_the_pod_whose_socket_was_re_created_and_follows_a_tmpfs_mounted_later() {
    use aether_agent_reconciler::socket_watch::SocketWatch;
    use std::time::Duration;
    let node = Node::new();
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let watch = SocketWatch::spawn(1, tx).unwrap();
    let dir = node.volume_dir(ATTACKER);
    std::fs::create_dir_all(&dir).unwrap();
    assert!(watch.watch(ATTACKER, &dir));
    let next = |rx: &mut tokio::sync::mpsc::Receiver<Vec<String>>| {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(uids) = rx.try_recv() {
                return Some(uids);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let app = node.app(ATTACKER, "first");
    assert_eq!(next(&mut rx), Some(vec![ATTACKER.to_owned()]), "the socket's creation is seen");
    drop(app);
    let _again = node.app(ATTACKER, "second");
    assert_eq!(next(&mut rx), Some(vec![ATTACKER.to_owned()]), "its re-creation too");
    while rx.try_recv().is_ok() {}

    // The cap: a second pod is not watched (it relies on the periodic re-check).
    std::fs::create_dir_all(node.volume_dir(VICTIM)).unwrap();
    assert!(!watch.watch(VICTIM, &node.volume_dir(VICTIM)));
    assert_eq!(watch.len(), 1);

    // A tmpfs mounted over the dir after the watch: re-watching moves the watch onto it.
    let mounted = Command::new("mount").args(["-t", "tmpfs", "aether-test", dir.to_str().unwrap()]).status().unwrap();
    assert!(mounted.success(), "mount tmpfs (needs root)");
    let _unmount = Unmount(dir.clone());
    while rx.try_recv().is_ok() {}
    assert!(watch.watch(ATTACKER, &dir));
    let _on_tmpfs = node.app(ATTACKER, "tmpfs");
    assert_eq!(next(&mut rx), Some(vec![ATTACKER.to_owned()]), "events inside the tmpfs are seen");

    watch.unwatch(ATTACKER);
    assert!(watch.is_empty());
    std::fs::write(dir.join("other"), b"x").unwrap();
    assert_eq!(next(&mut rx), None, "no events after unwatch");
}
