//! Prompt re-checks of pod sockets: inotify on the volume dir of each pod delivered (or meant to be
//! delivered) over its socket, so that when the app re-creates its socket (a container restart: a
//! new inode, the old pin answers `ECONNREFUSED`), removes it, or puts a real socket back where a
//! FIFO, a file or a directory stood, the driver re-verifies that pod at once instead of at the
//! next periodic re-check, which stays as the safety net. Which pods are watched is the driver's
//! choice (`Driver::check_pipes`): every pod with a socket path, except one refused for a link
//! (that refusal lasts until the pod is re-created, so no event can change it).
//!
//! One inotify instance for the node; one watch per pod, on the volume dir *as resolved when the
//! pod is checked* (so on a `medium: Memory` volume's own tmpfs once it is mounted: a watch placed
//! on the directory beneath it would see nothing). `IN_DONT_FOLLOW | IN_ONLYDIR`: a symlinked
//! volume dir is never watched through (it is refused anyway). At most `cap` pods are watched
//! (`--socket-watch-max`; each watch costs kernel memory and counts against
//! `fs.inotify.max_user_watches`); pods past it, or whose watch the kernel refuses, rely on the
//! periodic re-check.
//!
//! What one pod can cost the agent is bounded: the volume dir is the pod's to write, so a pod may
//! create and delete files in it as fast as it likes.
//! - Only events on the socket's own name (or on the dir itself) count; the reader thread drops
//!   every other name after one comparison, counted as `other-name` in
//!   `aether_agent_socket_watch_events_total`. After a read that drained the kernel's queue it
//!   waits [`READ_PAUSE`], so a flood is read a buffer of events at a time.
//! - The pods named by counted events are gathered into one set ([`Changes`]), taken by the driver
//!   at most once per [`MIN_BATCH_INTERVAL`]: a pod re-creating its socket in a loop costs at most
//!   one re-check per interval, however many events it makes.
//! - The reader reads on without pausing while reads come back full, so the kernel's queue keeps
//!   up with a flood; should it overflow anyway (`IN_Q_OVERFLOW`: events were lost), every watched
//!   pod is re-checked, at most once per [`OVERFLOW_RECHECK`].

use std::collections::{BTreeSet, HashMap};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use tokio::sync::Notify;

/// The default cap on watched pods (`--socket-watch-max`).
pub const DEFAULT_MAX_WATCHES: usize = 4096;

/// How long the reader thread waits after a read that drained the kernel's queue (fewer than
/// [`FULL_READ_EVENTS`] events) before the next: events arriving meanwhile are read together (one
/// `read(2)` for up to 16 KiB of them), so a flood costs a few hundred reads a second, not one
/// per event. It adds at most this much to a socket event's delay.
pub const READ_PAUSE: Duration = Duration::from_millis(10);

/// Events in one read (a 16 KiB buffer holds about 500 with short names) from which the queue
/// counts as still filling: the reader then reads on without [`READ_PAUSE`].
pub const FULL_READ_EVENTS: usize = 128;

/// The shortest time between two re-checks of every watched pod after the kernel's queue
/// overflowed (`IN_Q_OVERFLOW`).
pub const OVERFLOW_RECHECK: Duration = Duration::from_secs(1);

/// The shortest time between two batches handed to the driver: a batch holds every pod named
/// since the last one, so a flood of events makes at most 50 driver passes a second, and a
/// socket's return waits at most this plus [`READ_PAUSE`] beyond the event.
pub const MIN_BATCH_INTERVAL: Duration = Duration::from_millis(20);

/// The `outcome` label values of `aether_agent_socket_watch_events_total`.
pub const OUTCOMES: [&str; 3] = ["socket", "other-name", "overflow"];

/// Labels of `aether_agent_socket_watch_events_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// `aether_agent_socket_watch_events_total{outcome}`: inotify events read from the watched volume
/// dirs. `socket`: on the socket's name or the dir itself (its pod is re-checked); `other-name`:
/// on any other name (dropped); `overflow`: the kernel's queue overflowed (every watched pod is
/// re-checked). Clones share the counts.
#[derive(Clone, Debug)]
pub struct SocketWatchMetrics {
    family: Family<OutcomeLabel, Counter>,
    /// The three counters, created once so the reader thread never takes the family's lock.
    counters: [Counter; 3],
}

impl Default for SocketWatchMetrics {
    fn default() -> Self {
        let family = Family::<OutcomeLabel, Counter>::default();
        let counters = OUTCOMES.map(|outcome| family.get_or_create(&OutcomeLabel { outcome }).clone());
        SocketWatchMetrics { family, counters }
    }
}

impl SocketWatchMetrics {
    /// Registers the family (every outcome listed, also at zero).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "aether_agent_socket_watch_events",
            "inotify events from the watched pods' volume dirs: on the socket's name (re-check), on another name (dropped), or a queue overflow",
            self.family.clone(),
        );
    }

    /// The count of `outcome` (one of [`OUTCOMES`]) so far.
    pub fn get(&self, outcome: &str) -> u64 {
        OUTCOMES.iter().position(|o| *o == outcome).map_or(0, |i| self.counters[i].get())
    }
}

/// One watched pod.
#[derive(Debug)]
struct Watched {
    wd: i32,
    dir: PathBuf,
    /// The socket's file name in `dir`: the only name whose events count.
    name: Vec<u8>,
}

#[derive(Debug, Default)]
struct State {
    by_uid: HashMap<String, Watched>,
    /// Watch descriptor → pod UID (several pods never share a dir, but a wd can be reused).
    by_wd: HashMap<i32, String>,
    /// The cap was hit and logged.
    capped: bool,
}

/// The pods named since the driver last took them, and the bell that tells it.
#[derive(Debug, Default)]
struct Pending {
    uids: Mutex<BTreeSet<String>>,
    bell: Notify,
    stopped: AtomicBool,
}

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.uids.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The node's socket watch: a handle to add and remove per-pod watches; a thread reads the events
/// and gathers the affected pod UIDs for [`Changes`].
#[derive(Debug, Clone)]
pub struct SocketWatch {
    fd: Arc<OwnedFd>,
    state: Arc<Mutex<State>>,
    pending: Arc<Pending>,
    metrics: SocketWatchMetrics,
    cap: usize,
}

/// The receiving end of a [`SocketWatch`]: batches of pod UIDs to re-check.
#[derive(Debug)]
pub struct Changes {
    pending: Arc<Pending>,
    last: Option<tokio::time::Instant>,
}

impl Changes {
    /// The next batch: every pod UID named since the last batch (sorted, each once), at least
    /// [`MIN_BATCH_INTERVAL`] after the previous batch. `None` once the reader thread has stopped
    /// (the kernel failed a read); the periodic re-check remains.
    pub async fn next(&mut self) -> Option<Vec<String>> {
        loop {
            if let Some(last) = self.last {
                tokio::time::sleep_until(last + MIN_BATCH_INTERVAL).await;
            }
            let batch: Vec<String> = std::mem::take(&mut *self.pending.lock()).into_iter().collect();
            if !batch.is_empty() {
                self.last = Some(tokio::time::Instant::now());
                return Some(batch);
            }
            if self.pending.stopped.load(Ordering::Acquire) {
                return None;
            }
            self.pending.bell.notified().await;
        }
    }
}

impl SocketWatch {
    /// Starts the inotify instance and its reader thread; events are counted in `metrics`.
    ///
    /// # Errors
    /// When the kernel refuses an inotify instance (`fs.inotify.max_user_instances`) or a thread.
    pub fn spawn(cap: usize, metrics: SocketWatchMetrics) -> std::io::Result<(SocketWatch, Changes)> {
        let fd = Arc::new(inotify::init(CreateFlags::CLOEXEC)?);
        let pending = Arc::new(Pending::default());
        let watch = SocketWatch { fd, state: Arc::default(), pending: pending.clone(), metrics, cap };
        let reader = watch.clone();
        std::thread::Builder::new().name("socket-watch".into()).spawn(move || reader.read_loop())?;
        Ok((watch, Changes { pending, last: None }))
    }

    fn read_loop(&self) {
        let mut buf = [MaybeUninit::<u8>::uninit(); 16384];
        let mut reader = inotify::Reader::new(self.fd.as_ref(), &mut buf);
        let mut last_overflow: Option<Instant> = None;
        loop {
            // One blocking read, then the rest of what it returned, as one batch.
            let (mut named, mut events) = (Vec::new(), 0usize);
            loop {
                match reader.next() {
                    Ok(event) => {
                        events += 1;
                        named.extend(self.classify(&event, &mut last_overflow));
                    }
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "socket watch stopped; the periodic re-check remains");
                        self.pending.stopped.store(true, Ordering::Release);
                        self.pending.bell.notify_one();
                        return;
                    }
                }
                if reader.is_buffer_empty() {
                    break;
                }
            }
            if !named.is_empty() {
                self.pending.lock().extend(named);
                self.pending.bell.notify_one();
            }
            // A read that was far from full drained the queue: let events gather before the next,
            // so a flood is read a buffer at a time, not one wake-up and one read(2) per event.
            // A fuller read means a queue still filling up: read on at once, so it never
            // overflows (the kernel holds fs.inotify.max_queued_events, 16384 by default).
            if events < FULL_READ_EVENTS {
                std::thread::sleep(READ_PAUSE);
            }
        }
    }

    /// Counts one event; the pods to re-check: the watched pod whose socket name or dir it is
    /// about, or every watched pod when the kernel's queue overflowed (events were lost).
    ///
    /// An overflow re-checks every watched pod at most once per [`OVERFLOW_RECHECK`]: events lost
    /// beyond that wait for the periodic re-check, so a pod overflowing the queue on purpose
    /// cannot make the agent re-check the node's pods over and over.
    fn classify(&self, event: &inotify::Event<'_>, last_overflow: &mut Option<Instant>) -> Vec<String> {
        let [socket, other, overflow] = &self.metrics.counters;
        let st = self.lock();
        if event.events().contains(ReadFlags::QUEUE_OVERFLOW) {
            overflow.inc();
            let now = Instant::now();
            if last_overflow.is_some_and(|t| now.duration_since(t) < OVERFLOW_RECHECK) {
                return Vec::new();
            }
            *last_overflow = Some(now);
            return st.by_uid.keys().cloned().collect();
        }
        let Some(uid) = st.by_wd.get(&event.wd()) else { return Vec::new() };
        let ours = match event.file_name() {
            Some(name) => st.by_uid.get(uid).is_some_and(|w| w.name == name.to_bytes()),
            None => true,
        };
        if ours {
            socket.inc();
            vec![uid.clone()]
        } else {
            other.inc();
            Vec::new()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Watches `dir` (the pod's volume dir, as resolved now) for pod `uid`: creation, removal and
    /// renames of `socket_name` in it (events on other names are dropped). Re-watching the same
    /// pod moves the watch when the path now resolves to another directory (a tmpfs mounted over
    /// it). Returns `false` when the pod is not watched (the cap, or the kernel refused: missing
    /// dir, symlink, `ENOSPC`).
    pub fn watch(&self, uid: &str, dir: &Path, socket_name: &str) -> bool {
        let mut st = self.lock();
        if !st.by_uid.contains_key(uid) && st.by_uid.len() >= self.cap {
            if !st.capped {
                st.capped = true;
                tracing::warn!(
                    cap = self.cap,
                    "socket watch cap reached; further pods are re-checked periodically only"
                );
            }
            return false;
        }
        let flags = WatchFlags::CREATE
            | WatchFlags::DELETE
            | WatchFlags::MOVED_FROM
            | WatchFlags::MOVED_TO
            | WatchFlags::DONT_FOLLOW
            | WatchFlags::ONLYDIR
            | WatchFlags::EXCL_UNLINK;
        let wd = match inotify::add_watch(self.fd.as_ref(), dir, flags) {
            Ok(wd) => wd,
            Err(_) => return false,
        };
        let watched = Watched { wd, dir: dir.to_owned(), name: socket_name.as_bytes().to_vec() };
        if let Some(old) = st.by_uid.insert(uid.to_owned(), watched)
            && old.wd != wd
        {
            st.by_wd.remove(&old.wd);
            let _ = inotify::remove_watch(self.fd.as_ref(), old.wd);
        }
        st.by_wd.insert(wd, uid.to_owned());
        true
    }

    /// Stops watching pod `uid` (gone, on TCP, or refused for a link). Nothing for an unwatched pod.
    pub fn unwatch(&self, uid: &str) {
        let mut st = self.lock();
        if let Some(w) = st.by_uid.remove(uid) {
            st.by_wd.remove(&w.wd);
            let _ = inotify::remove_watch(self.fd.as_ref(), w.wd);
        }
    }

    /// True when pod `uid` is watched now.
    pub fn is_watched(&self, uid: &str) -> bool {
        self.lock().by_uid.contains_key(uid)
    }

    /// The dir watched for pod `uid`, if any.
    pub fn watched_dir(&self, uid: &str) -> Option<PathBuf> {
        self.lock().by_uid.get(uid).map(|w| w.dir.clone())
    }

    /// How many pods are watched now.
    pub fn len(&self) -> usize {
        self.lock().by_uid.len()
    }

    /// True when no pod is watched.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
