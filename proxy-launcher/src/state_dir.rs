//! The node's hand-over state: one host directory shared by every proxy pod on the node (a
//! hostPath on tmpfs, so a reboot clears it), holding
//!
//! - `start.lock`: held (flock, exclusive) by a launcher from its epoch decision until its Envoy is
//!   LIVE or gone, so at most one Envoy initializes at a time (Envoy refuses a second with
//!   "previous envoy process is still initializing") and no two pick the same epoch;
//! - `alive.<epoch>`: held by the launcher of that epoch for as long as its Envoy runs. The kernel
//!   drops a flock when its holder dies, whatever pod or PID namespace it was in, so "is epoch E
//!   still running" never depends on a file someone forgot to delete;
//! - `live-epoch`: the [`LiveRecord`] of the serving Envoy, replaced by rename;
//! - `step-down.<epoch>`: a successor's request that epoch's Envoy exit without a hand-over
//!   (incompatible binaries), with the reason;
//! - `hr_*`: Envoy's own hot restart sockets (`--socket-path <dir>/hr`, mode 0600).

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::epoch::LiveRecord;

/// The state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    dir: PathBuf,
}

/// A held flock; dropping it releases the lock.
#[derive(Debug)]
pub struct Held(#[allow(dead_code)] File);

impl StateDir {
    /// Opens (creating, mode 0700) the directory.
    pub fn open(dir: &Path) -> io::Result<StateDir> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        Ok(StateDir { dir: dir.to_owned() })
    }

    /// Envoy's `--socket-path`: its hot restart sockets are `<this>_parent_<n>`, `<this>_child_<n>`.
    pub fn socket_path(&self) -> PathBuf {
        self.dir.join("hr")
    }

    fn lock_file(&self, name: &str) -> io::Result<File> {
        OpenOptions::new().create(true).truncate(false).write(true).open(self.dir.join(name))
    }

    /// Takes `start.lock`, waiting for another launcher's hand-over to finish; `waiting` is called
    /// once if it has to wait, and `give_up` is polled every 200 ms (true: stop waiting, `None`).
    pub fn lock_start(&self, waiting: impl FnOnce(), give_up: impl Fn() -> bool) -> io::Result<Option<Held>> {
        let f = self.lock_file("start.lock")?;
        let mut waiting = Some(waiting);
        loop {
            match f.try_lock() {
                Ok(()) => return Ok(Some(Held(f))),
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => return Err(e),
            }
            if let Some(w) = waiting.take() {
                w();
            }
            if give_up() {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Takes `alive.<epoch>` for this launcher's Envoy. Others probe it with a brief shared lock,
    /// so a conflict is retried for up to 1 s before it is an error.
    pub fn hold_alive(&self, epoch: u32) -> io::Result<Held> {
        let f = self.lock_file(&format!("alive.{epoch}"))?;
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            match f.try_lock() {
                Ok(()) => return Ok(Held(f)),
                Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(TryLockError::WouldBlock) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("epoch {epoch} is already running (alive.{epoch} is locked)"),
                    ));
                }
                Err(TryLockError::Error(e)) => return Err(e),
            }
        }
    }

    /// Whether `alive.<epoch>` is held by a running Envoy's launcher (not by `mine`).
    pub fn is_alive(&self, epoch: u32) -> io::Result<bool> {
        let path = self.dir.join(format!("alive.{epoch}"));
        let f = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        match f.try_lock_shared() {
            Ok(()) => Ok(false),
            Err(TryLockError::WouldBlock) => Ok(true),
            Err(TryLockError::Error(e)) => Err(e),
        }
    }

    /// Every epoch whose Envoy runs, except `except` (this launcher's own).
    pub fn alive_epochs(&self, except: Option<u32>) -> io::Result<BTreeSet<u32>> {
        let mut out = BTreeSet::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            let Some(epoch) = name.to_str().and_then(|n| n.strip_prefix("alive.")).and_then(|e| e.parse().ok()) else {
                continue;
            };
            if Some(epoch) != except && self.is_alive(epoch)? {
                out.insert(epoch);
            }
        }
        Ok(out)
    }

    /// The `live-epoch` record; `None` when there is none. A record that does not parse is an
    /// error naming the file.
    pub fn read_live(&self) -> io::Result<Option<LiveRecord>> {
        let path = self.dir.join("live-epoch");
        match std::fs::read_to_string(&path) {
            Ok(s) => serde_json::from_str(&s).map(Some).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("{}: not a live-epoch record: {e}", path.display()))
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Replaces the `live-epoch` record (write to a temporary file, then rename).
    pub fn write_live(&self, record: &LiveRecord) -> io::Result<()> {
        let tmp = self.dir.join(format!("live-epoch.tmp.{}", std::process::id()));
        std::fs::write(&tmp, serde_json::to_vec(record).map_err(io::Error::other)?)?;
        std::fs::rename(&tmp, self.dir.join("live-epoch"))
    }

    /// Removes the node's hand-over state (records, locks, Envoy's hot restart sockets and the
    /// shared-memory segment `shm_segment`) when this launcher's Envoy was the last one: no epoch
    /// alive and no launcher starting (the start lock is taken here first). A pod deletion with
    /// no successor, e.g. `helm uninstall`, so leaves only the empty host directories. Returns
    /// whether it cleaned; errors are I/O.
    pub fn clean_if_last(&self, shm_segment: &Path) -> io::Result<bool> {
        let lock = self.lock_file("start.lock")?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(false),
            Err(TryLockError::Error(e)) => return Err(e),
        }
        if !self.alive_epochs(None)?.is_empty() {
            return Ok(false);
        }
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let ours = ["live-epoch", "start.lock"].contains(&name.as_ref())
                || ["alive.", "step-down.", "hr_", "live-epoch.tmp."].iter().any(|p| name.starts_with(p));
            if ours {
                std::fs::remove_file(entry.path())?;
            }
        }
        match std::fs::remove_file(shm_segment) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        Ok(true)
    }

    /// Asks the launcher of `epoch` to stop its Envoy without a hand-over, saying why.
    pub fn request_step_down(&self, epoch: u32, why: &str) -> io::Result<()> {
        std::fs::write(self.dir.join(format!("step-down.{epoch}")), why)
    }

    /// A pending step-down request for `epoch`, if any (its reason); reading it consumes it.
    pub fn take_step_down(&self, epoch: u32) -> io::Result<Option<String>> {
        let path = self.dir.join(format!("step-down.{epoch}"));
        match std::fs::read_to_string(&path) {
            Ok(why) => {
                std::fs::remove_file(&path)?;
                Ok(Some(why))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::epoch::{Build, Version};

    #[test]
    fn alive_locks_are_seen_by_others_and_released_on_drop() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(tmp.path()).unwrap();
        assert!(dir.alive_epochs(None).unwrap().is_empty());
        let held = dir.hold_alive(3).unwrap();
        assert!(dir.is_alive(3).unwrap());
        assert_eq!(dir.alive_epochs(None).unwrap(), BTreeSet::from([3]));
        assert!(dir.alive_epochs(Some(3)).unwrap().is_empty());
        let err = dir.hold_alive(3).unwrap_err();
        assert!(err.to_string().contains("epoch 3 is already running"), "{err}");
        drop(held);
        assert!(!dir.is_alive(3).unwrap());
        assert!(dir.hold_alive(3).is_ok());
    }

    #[test]
    fn the_start_lock_waits_for_its_holder() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(tmp.path()).unwrap();
        let first = dir.lock_start(|| panic!("the first taker does not wait"), || false).unwrap();
        assert!(first.is_some());
        let waited = std::cell::Cell::new(false);
        let second = dir.lock_start(|| waited.set(true), || true).unwrap();
        assert!(second.is_none() && waited.get());
        drop(first);
        assert!(dir.lock_start(|| (), || true).unwrap().is_some());
    }

    #[test]
    fn the_live_record_and_step_down_requests_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(tmp.path()).unwrap();
        assert_eq!(dir.read_live().unwrap(), None);
        let rec = LiveRecord {
            epoch: 7,
            build: Build { version: Version(1, 40, 0), hot_restart_version: Some("11.104".into()), base_id: 9 },
        };
        dir.write_live(&rec).unwrap();
        assert_eq!(dir.read_live().unwrap(), Some(rec));
        std::fs::write(tmp.path().join("live-epoch"), "7 11.104").unwrap();
        let err = dir.read_live().unwrap_err();
        assert!(err.to_string().contains("not a live-epoch record"), "{err}");
        assert_eq!(dir.take_step_down(7).unwrap(), None);
        dir.request_step_down(7, "base ids differ").unwrap();
        assert_eq!(dir.take_step_down(7).unwrap().as_deref(), Some("base ids differ"));
        assert_eq!(dir.take_step_down(7).unwrap(), None);
    }

    #[test]
    fn the_last_launcher_leaves_only_the_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(tmp.path()).unwrap();
        std::fs::create_dir(tmp.path().join("shm")).unwrap();
        let seg = tmp.path().join("shm/envoy_shared_memory_10");
        std::fs::write(&seg, b"x").unwrap();
        std::fs::write(tmp.path().join("hr_parent_10"), b"").unwrap();
        dir.request_step_down(3, "x").unwrap();
        let rec =
            LiveRecord { epoch: 1, build: Build { version: Version(1, 40, 0), hot_restart_version: None, base_id: 1 } };
        dir.write_live(&rec).unwrap();
        // Another epoch still runs: nothing is removed.
        let other = dir.hold_alive(2).unwrap();
        assert!(!dir.clean_if_last(&seg).unwrap());
        assert!(seg.exists());
        drop(other);
        // A launcher is starting: nothing is removed.
        let starting = dir.lock_start(|| (), || true).unwrap();
        assert!(!dir.clean_if_last(&seg).unwrap());
        drop(starting);
        assert!(dir.clean_if_last(&seg).unwrap());
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("shm")]);
        assert!(!seg.exists());
    }
}
