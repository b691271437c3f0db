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
use std::time::Duration;

use aether_agent_reconciler::fscheck::Refusal;
use aether_agent_reconciler::pin::{PinError, Pinner, pin_path};
use aether_agent_reconciler::socket_watch::{Changes, MIN_BATCH_INTERVAL, SocketWatch, SocketWatchMetrics};
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
    // Refused, or reset when a test running alongside forked while the listener was open (the
    // child holds the CLOEXEC fd until its exec): either way the dead socket answers nothing.
    let dead = who(&pin.path);
    assert!(
        matches!(dead, Err(std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::ConnectionReset)),
        "{dead:?}"
    );
    let again = node.pinner.pin(ATTACKER, &node.socket(ATTACKER)).unwrap();
    assert_ne!(again.inode, pin.inode);
    assert_eq!(who(&again.path).as_deref(), Ok("second"));

    // The socket removed: the pin goes, the path reaches nothing.
    std::fs::remove_file(node.socket(ATTACKER).as_str()).unwrap();
    assert!(matches!(node.pinner.pin(ATTACKER, &node.socket(ATTACKER)), Err(PinError::NotYet { .. })));
    assert!(who(&again.path).is_err());
}

/// An app re-creating its socket in a tight loop while the agent pins it: the socket verified can
/// be unlinked before its mount is attached. That race is never a mount error: each pin either
/// holds a socket the app bound, or reports the socket as not there yet.
#[test]
fn a_socket_re_created_while_it_is_pinned_is_never_a_mount_error() {
    let node = Node::new();
    let dir = node.volume_dir(ATTACKER);
    std::fs::create_dir_all(&dir).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let path = dir.join("app.sock");
    let churn = std::thread::spawn(move || {
        while !flag.load(Ordering::Relaxed) {
            let _ = std::fs::remove_file(&path);
            let _listener = UnixListener::bind(&path);
        }
    });
    let (mut pinned, mut not_yet) = (0u32, 0u32);
    for _ in 0..3000 {
        match node.pinner.pin(ATTACKER, &node.socket(ATTACKER)) {
            Ok(_) => pinned += 1,
            Err(PinError::NotYet { .. }) => not_yet += 1,
            // The listener is dropped at once: a socket seen between bind and drop is fine.
            Err(PinError::Refused(r)) => panic!("refused a plain socket: {r}"),
            Err(e @ PinError::Mount { .. }) => panic!("a re-created socket made a mount error: {e}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    churn.join().unwrap();
    assert!(pinned > 0, "some pins held ({pinned} pinned, {not_yet} not yet)");
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

/// The next batch of a socket watch, or `None` after `secs` seconds without one.
fn next_batch(rt: &tokio::runtime::Runtime, changes: &mut Changes, secs: f64) -> Option<Vec<String>> {
    rt.block_on(async { tokio::time::timeout(Duration::from_secs_f64(secs), changes.next()).await.ok().flatten() })
}

#[test]
fn the_socket_watch_names_the_pod_whose_socket_was_re_created_and_follows_a_tmpfs_mounted_later() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let node = Node::new();
    let (watch, mut changes) = SocketWatch::spawn(1, SocketWatchMetrics::default()).unwrap();
    let dir = node.volume_dir(ATTACKER);
    std::fs::create_dir_all(&dir).unwrap();
    assert!(watch.watch(ATTACKER, &dir, "app.sock"));
    let app = node.app(ATTACKER, "first");
    assert_eq!(next_batch(&rt, &mut changes, 5.0), Some(vec![ATTACKER.to_owned()]), "the socket's creation is seen");
    drop(app);
    let _again = node.app(ATTACKER, "second");
    assert_eq!(next_batch(&rt, &mut changes, 5.0), Some(vec![ATTACKER.to_owned()]), "its re-creation too");
    while next_batch(&rt, &mut changes, 0.1).is_some() {}

    // The cap: a second pod is not watched (it relies on the periodic re-check).
    std::fs::create_dir_all(node.volume_dir(VICTIM)).unwrap();
    assert!(!watch.watch(VICTIM, &node.volume_dir(VICTIM), "app.sock"));
    assert_eq!(watch.len(), 1);

    // A tmpfs mounted over the dir after the watch: re-watching moves the watch onto it.
    let mounted = Command::new("mount").args(["-t", "tmpfs", "aether-test", dir.to_str().unwrap()]).status().unwrap();
    assert!(mounted.success(), "mount tmpfs (needs root)");
    let _unmount = Unmount(dir.clone());
    while next_batch(&rt, &mut changes, 0.1).is_some() {}
    assert!(watch.watch(ATTACKER, &dir, "app.sock"));
    let _on_tmpfs = node.app(ATTACKER, "tmpfs");
    assert_eq!(next_batch(&rt, &mut changes, 5.0), Some(vec![ATTACKER.to_owned()]), "events inside the tmpfs are seen");

    watch.unwatch(ATTACKER);
    assert!(watch.is_empty());
    std::fs::remove_file(dir.join("app.sock")).unwrap();
    assert_eq!(next_batch(&rt, &mut changes, 0.5), None, "no events after unwatch");
}

/// A pod churning files in its volume dir: every name but the socket's is dropped by the reader
/// thread (counted), and events on the socket's name, however many, reach the driver as batches
/// at most one per `MIN_BATCH_INTERVAL`.
#[test]
fn the_socket_watch_drops_other_names_and_coalesces_a_flood_of_socket_events() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let node = Node::new();
    let metrics = SocketWatchMetrics::default();
    let (watch, mut changes) = SocketWatch::spawn(2, metrics.clone()).unwrap();
    let dir = node.volume_dir(ATTACKER);
    std::fs::create_dir_all(&dir).unwrap();
    assert!(watch.watch(ATTACKER, &dir, "app.sock"));

    for i in 0..2000 {
        let f = dir.join(format!("junk-{i}"));
        std::fs::write(&f, b"x").unwrap();
        std::fs::remove_file(&f).unwrap();
    }
    assert_eq!(next_batch(&rt, &mut changes, 0.5), None, "4000 events on other names: no re-check");
    assert_eq!((metrics.get("other-name"), metrics.get("socket")), (4000, 0));

    // 2000 creations and removals of the socket's own name in a burst: a handful of batches.
    let started = std::time::Instant::now();
    for _ in 0..2000 {
        std::fs::write(dir.join("app.sock"), b"x").unwrap();
        std::fs::remove_file(dir.join("app.sock")).unwrap();
    }
    let burst = started.elapsed();
    let mut batches = 0u32;
    while let Some(uids) = next_batch(&rt, &mut changes, 0.3) {
        assert_eq!(uids, [ATTACKER], "one pod, named once per batch");
        batches += 1;
    }
    assert_eq!(metrics.get("socket"), 4000);
    let bound = burst.as_secs_f64() / MIN_BATCH_INTERVAL.as_secs_f64() + 2.0;
    assert!(batches >= 1 && f64::from(batches) <= bound, "{batches} batches for a {burst:?} burst (bound {bound})");
}

/// The dir the watch follows is the one resolved when the pod was checked, and it is reported.
#[test]
fn the_socket_watch_reports_the_dir_it_watches() {
    let node = Node::new();
    let (watch, _changes) = SocketWatch::spawn(4, SocketWatchMetrics::default()).unwrap();
    let dir = node.volume_dir(VICTIM);
    assert!(!watch.watch(VICTIM, &dir, "app.sock"), "a missing dir cannot be watched");
    std::fs::create_dir_all(&dir).unwrap();
    assert!(watch.watch(VICTIM, &dir, "app.sock"));
    assert!(watch.is_watched(VICTIM));
    assert_eq!(watch.watched_dir(VICTIM), Some(dir));
}
