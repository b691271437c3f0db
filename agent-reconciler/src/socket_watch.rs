//! Prompt re-pins (issue 13 item 2): inotify on each pinned pod's volume dir, so that when the app
//! re-creates its socket (a container restart: a new inode, the old pin answers `ECONNREFUSED`)
//! or removes it, the driver re-verifies that pod at once instead of at the next periodic
//! re-check, which stays as the safety net.
//!
//! One inotify instance for the node; one watch per pod, on the volume dir *as resolved when the
//! pod is pinned* (so on a `medium: Memory` volume's own tmpfs once it is mounted: a watch placed
//! on the directory beneath it would see nothing). `IN_DONT_FOLLOW | IN_ONLYDIR`: a symlinked
//! volume dir is never watched through (it is refused anyway). At most `cap` pods are watched
//! (`--socket-watch-max`; each watch costs kernel memory and counts against
//! `fs.inotify.max_user_watches`); pods past it, or whose watch the kernel refuses, rely on the
//! periodic re-check. An event only triggers a re-check of its pod: nothing a pod does in its
//! directory can do more.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::fs::inotify::{self, CreateFlags, WatchFlags};
use tokio::sync::mpsc;

/// The default cap on watched pods (`--socket-watch-max`).
pub const DEFAULT_MAX_WATCHES: usize = 4096;

#[derive(Debug, Default)]
struct State {
    /// Pod UID → (watch descriptor, the dir watched).
    by_uid: HashMap<String, (i32, PathBuf)>,
    /// Watch descriptor → pod UIDs (several pods never share a dir, but a wd can be reused).
    by_wd: HashMap<i32, String>,
    /// The cap was hit and logged.
    capped: bool,
}

/// The node's socket watch: a handle to add and remove per-pod watches; a thread reads the events
/// and sends the affected pod UIDs.
#[derive(Debug, Clone)]
pub struct SocketWatch {
    fd: Arc<OwnedFd>,
    state: Arc<Mutex<State>>,
    cap: usize,
}

impl SocketWatch {
    /// Starts the inotify instance and its reader thread, which sends each batch of affected pod
    /// UIDs to `tx` and ends when `tx` is closed.
    ///
    /// # Errors
    /// When the kernel refuses an inotify instance (`fs.inotify.max_user_instances`).
    pub fn spawn(cap: usize, tx: mpsc::Sender<Vec<String>>) -> std::io::Result<SocketWatch> {
        let fd = Arc::new(inotify::init(CreateFlags::CLOEXEC)?);
        let watch = SocketWatch { fd, state: Arc::default(), cap };
        let reader = watch.clone();
        std::thread::Builder::new().name("socket-watch".into()).spawn(move || reader.read_loop(tx))?;
        Ok(watch)
    }

    fn read_loop(&self, tx: mpsc::Sender<Vec<String>>) {
        let mut buf = [MaybeUninit::<u8>::uninit(); 8192];
        let mut reader = inotify::Reader::new(self.fd.as_ref(), &mut buf);
        loop {
            // One blocking read, then the rest of what it returned, as one batch.
            let (mut uids, mut first) = (Vec::new(), true);
            loop {
                match reader.next() {
                    Ok(event) => uids.extend(self.lock().by_wd.get(&event.wd()).cloned()),
                    Err(rustix::io::Errno::INTR) if first => continue,
                    Err(e) if first => {
                        tracing::warn!(error = %e, "socket watch stopped; the periodic re-check remains");
                        return;
                    }
                    Err(_) => break,
                }
                first = false;
                if reader.is_buffer_empty() {
                    break;
                }
            }
            uids.sort();
            uids.dedup();
            if !uids.is_empty() && tx.blocking_send(uids).is_err() {
                return;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Watches `dir` (the pod's volume dir, as resolved now) for pod `uid`: creation, removal and
    /// renames of names in it. Re-watching the same pod moves the watch when the path now
    /// resolves to another directory (a tmpfs mounted over it). Returns `false` when the pod is
    /// not watched (the cap, or the kernel refused: missing dir, symlink, `ENOSPC`).
    pub fn watch(&self, uid: &str, dir: &Path) -> bool {
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
        if let Some((old, _)) = st.by_uid.insert(uid.to_owned(), (wd, dir.to_owned()))
            && old != wd
        {
            st.by_wd.remove(&old);
            let _ = inotify::remove_watch(self.fd.as_ref(), old);
        }
        st.by_wd.insert(wd, uid.to_owned());
        true
    }

    /// Stops watching pod `uid` (gone, on TCP, or refused). Nothing for an unwatched pod.
    pub fn unwatch(&self, uid: &str) {
        let mut st = self.lock();
        if let Some((wd, _)) = st.by_uid.remove(uid) {
            st.by_wd.remove(&wd);
            let _ = inotify::remove_watch(self.fd.as_ref(), wd);
        }
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
