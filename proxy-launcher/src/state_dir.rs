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
//! - `owner.<hash>`: the lease of one proxy DaemonSet (`--owner`), held (flock, shared) by every
//!   launcher of it for as long as it runs and removed by the last one that exits cleanly; another
//!   owner's launcher so tells "that release still runs here, its Envoy is only restarting" from
//!   "that release is gone" ([`Lease`]);
//! - `hr_*`: Envoy's own hot restart sockets (`--socket-path <dir>/hr`, mode 0600).
//!
//! Only root can touch it: the directory is made mode 0700 when opened (kubelet's
//! `DirectoryOrCreate` makes it 0755) and refused unless root owns it, and every file the launcher
//! creates in it is mode 0600, opened relative to the directory with `O_NOFOLLOW`. Anyone able to
//! open a lock file could flock it and stall every hand-over on the node. The waits on the locks
//! are bounded; on a timeout the error names the holder's PID where `/proc/locks` tells it.

use std::collections::BTreeSet;
use std::fs::{File, TryLockError};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};

use crate::epoch::LiveRecord;

/// The mode of the directory.
pub const DIR_MODE: u32 = 0o700;
/// The mode of every file the launcher creates in it.
pub const FILE_MODE: u32 = 0o600;

/// The state directory: its path and an open descriptor every file is opened relative to.
#[derive(Debug, Clone)]
pub struct StateDir {
    dir: PathBuf,
    fd: Arc<OwnedFd>,
}

/// A held flock; dropping it releases the lock.
#[derive(Debug)]
pub struct Held(#[allow(dead_code)] File);

/// Where a proxy DaemonSet's lease (`owner.<hash>`) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// No lease file: its last launcher released it on a clean exit, or it never ran here.
    Absent,
    /// A launcher of that owner runs.
    Held,
    /// The file is there but nobody holds it: its launchers died without releasing it (a crash, a
    /// SIGKILL, a container restart), and may be back after the kubelet's back-off.
    Unheld,
}

impl StateDir {
    /// Opens the directory (creating it if missing) and makes it mode 0700 if it was not.
    /// Errors: I/O (with the path), or a directory not owned by root (uid 0), named with its owner
    /// and mode (`PermissionDenied`).
    pub fn open(dir: &Path) -> io::Result<StateDir> {
        let fd = open_root_only(dir, "hand-over state dir")?;
        Ok(StateDir { dir: dir.to_owned(), fd: Arc::new(fd) })
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Opens `name` in the directory with `flags`, never following a symlink; created mode 0600.
    fn open_at(&self, name: &str, flags: OFlags) -> io::Result<File> {
        let fd = rustix::fs::openat(
            self.fd.as_fd(),
            name,
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(FILE_MODE),
        )
        .map_err(|e| {
            let e = io::Error::from(e);
            io::Error::new(e.kind(), format!("{}: {e}", self.dir.join(name).display()))
        })?;
        Ok(File::from(fd))
    }

    /// Reads `name`; `None` when it does not exist.
    fn read(&self, name: &str) -> io::Result<Option<String>> {
        let mut f = match self.open_at(name, OFlags::RDONLY) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut s = String::new();
        f.read_to_string(&mut s)?;
        Ok(Some(s))
    }

    /// Creates or replaces `name` (mode 0600) with `bytes`.
    fn write(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let mut f = self.open_at(name, OFlags::CREATE | OFlags::WRONLY | OFlags::TRUNC)?;
        set_mode(&f, rustix::fs::fstat(&f)?.st_mode, FILE_MODE)?;
        f.write_all(bytes)
    }

    /// Who holds a lock on `name`: `PID <n>[, PID <m>]` from `/proc/locks`, or `unknown` (no
    /// entry, or holders in another PID namespace, which the kernel shows as PID 0).
    pub fn lock_holder(&self, name: &str) -> String {
        let Ok(f) = self.open_at(name, OFlags::RDONLY) else { return "unknown".into() };
        holder_of(&f)
    }

    /// Envoy's `--socket-path`: its hot restart sockets are `<this>_parent_<n>`, `<this>_child_<n>`.
    pub fn socket_path(&self) -> PathBuf {
        self.dir.join("hr")
    }

    /// Opens (creating) a lock file; one an older release left with mode 0644 becomes 0600.
    fn lock_file(&self, name: &str) -> io::Result<File> {
        let f = self.open_at(name, OFlags::CREATE | OFlags::RDWR)?;
        set_mode(&f, rustix::fs::fstat(&f)?.st_mode, FILE_MODE)?;
        Ok(f)
    }

    /// Takes `start.lock`, waiting for another launcher's hand-over to finish; `waiting` is called
    /// once if it has to wait, and `give_up` is polled every 200 ms (true: stop waiting, `None`).
    /// Errors: I/O, or still locked after `bound` (`TimedOut`, naming the file and its holder's
    /// PID, see [`StateDir::lock_holder`]).
    pub fn lock_start(
        &self,
        bound: Duration,
        waiting: impl FnOnce(),
        give_up: impl Fn() -> bool,
    ) -> io::Result<Option<Held>> {
        let f = self.lock_file("start.lock")?;
        let since = Instant::now();
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
            if since.elapsed() >= bound {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} is still locked after {:.0} s, held by {}: no hand-over takes that long; \
                         exiting (the kubelet restarts the container)",
                        self.dir.join("start.lock").display(),
                        bound.as_secs_f64(),
                        self.lock_holder("start.lock")
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Takes `alive.<epoch>` for this launcher's Envoy. Others probe it with a brief shared lock,
    /// so a conflict is retried for up to 1 s before it is an error.
    pub fn hold_alive(&self, epoch: u32) -> io::Result<Held> {
        let f = self.lock_file(&format!("alive.{epoch}"))?;
        if !try_lock_within(&f, Exclusive, PROBE_WAIT)? {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("epoch {epoch} is already running (alive.{epoch} is locked)"),
            ));
        }
        Ok(Held(f))
    }

    /// Whether `alive.<epoch>` is held by a running Envoy's launcher (not by `mine`).
    pub fn is_alive(&self, epoch: u32) -> io::Result<bool> {
        let f = match self.open_at(&format!("alive.{epoch}"), OFlags::RDONLY) {
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
        let Some(s) = self.read("live-epoch")? else { return Ok(None) };
        serde_json::from_str(&s).map(Some).map_err(|e| {
            let path = self.dir.join("live-epoch");
            io::Error::new(io::ErrorKind::InvalidData, format!("{}: not a live-epoch record: {e}", path.display()))
        })
    }

    /// Replaces the `live-epoch` record (write to a temporary file, then rename). On an error
    /// (e.g. ENOSPC on a full tmpfs) the temporary file is removed and the old record stays.
    pub fn write_live(&self, record: &LiveRecord) -> io::Result<()> {
        let tmp = format!("live-epoch.tmp.{}", std::process::id());
        let written = self.write(&tmp, &serde_json::to_vec(record).map_err(io::Error::other)?).and_then(|()| {
            rustix::fs::renameat(self.fd.as_fd(), tmp.as_str(), self.fd.as_fd(), "live-epoch").map_err(io::Error::from)
        });
        if written.is_err() {
            let _ = rustix::fs::unlinkat(self.fd.as_fd(), tmp.as_str(), rustix::fs::AtFlags::empty());
        }
        written
    }

    /// Removes the node's hand-over state (the records, the `alive.<epoch>` locks of epochs no
    /// longer running, step-down requests, temporary files, Envoy's hot restart sockets and the
    /// shared-memory segment `shm_segment`) when this launcher's Envoy was the last one: no epoch
    /// alive and no launcher starting (the start lock is taken here first). A pod deletion with
    /// no successor, e.g. `helm uninstall`, so leaves the host directories and `start.lock`.
    /// `start.lock` stays: a launcher may already wait on it, and unlinking it would let the next
    /// one lock a new file beside that waiter (two starts at once). Returns whether it cleaned;
    /// errors are I/O.
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
            let ours = name == "live-epoch"
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

    /// Takes `owner`'s lease (a shared flock on `owner.<hash>`, the file holding `owner`) for as
    /// long as the returned [`Held`] lives: the launchers of one owner (a rolling pod and its
    /// successor) hold it together. Others probe it with a brief exclusive lock, so a conflict is
    /// retried for up to 1 s before it is an error.
    pub fn hold_owner_lease(&self, owner: &str) -> io::Result<Held> {
        let name = lease_name(owner);
        let mut f = self.lock_file(&name)?;
        if !try_lock_within(&f, Shared, PROBE_WAIT)? {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("{} is locked exclusively by {}", self.dir.join(&name).display(), self.lock_holder(&name)),
            ));
        }
        f.set_len(0)?;
        f.write_all(owner.as_bytes())?;
        Ok(Held(f))
    }

    /// Where `owner`'s lease stands (probed with a non-blocking exclusive lock, released at once).
    pub fn owner_lease(&self, owner: &str) -> io::Result<Lease> {
        let f = match self.open_at(&lease_name(owner), OFlags::RDONLY) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Lease::Absent),
            Err(e) => return Err(e),
        };
        match f.try_lock() {
            Ok(()) => Ok(Lease::Unheld),
            Err(TryLockError::WouldBlock) => Ok(Lease::Held),
            Err(TryLockError::Error(e)) => Err(e),
        }
    }

    /// Gives `held` (this launcher's lease of `owner`) back, and removes the lease file when no
    /// other launcher of `owner` holds it: the clean exit of that owner's last launcher on the
    /// node. Returns whether it removed the file; errors are I/O.
    pub fn release_owner_lease(&self, owner: &str, held: Held) -> io::Result<bool> {
        let name = lease_name(owner);
        let f = held.0;
        // Shared to exclusive is not atomic with flock: another launcher of the owner may take
        // its shared lock in between, and then the file stays, as it should. Another owner's
        // probe holds it exclusively for a moment: retried for up to 1 s.
        if !try_lock_within(&f, Exclusive, PROBE_WAIT)? {
            return Ok(false);
        }
        match rustix::fs::unlinkat(self.fd.as_fd(), name.as_str(), rustix::fs::AtFlags::empty()) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Asks the launcher of `epoch` to stop its Envoy without a hand-over, saying why.
    pub fn request_step_down(&self, epoch: u32, why: &str) -> io::Result<()> {
        self.write(&format!("step-down.{epoch}"), why.as_bytes())
    }

    /// A pending step-down request for `epoch`, if any (its reason); reading it consumes it.
    pub fn take_step_down(&self, epoch: u32) -> io::Result<Option<String>> {
        let name = format!("step-down.{epoch}");
        let Some(why) = self.read(&name)? else { return Ok(None) };
        rustix::fs::unlinkat(self.fd.as_fd(), name.as_str(), rustix::fs::AtFlags::empty())?;
        Ok(Some(why))
    }
}

/// How long a lock that others only probe (a brief lock of the other kind, released at once) is
/// retried before its holder counts as a real one.
const PROBE_WAIT: Duration = Duration::from_secs(1);

/// Which flock.
#[derive(Clone, Copy)]
pub(crate) enum LockKind {
    Shared,
    Exclusive,
}
use LockKind::{Exclusive, Shared};

/// Tries `kind` of flock on `f` every 20 ms for up to `within`: whether it was taken.
pub(crate) fn try_lock_within(f: &File, kind: LockKind, within: Duration) -> io::Result<bool> {
    let deadline = Instant::now() + within;
    loop {
        let tried = match kind {
            Shared => f.try_lock_shared(),
            Exclusive => f.try_lock(),
        };
        match tried {
            Ok(()) => return Ok(true),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(TryLockError::WouldBlock) => return Ok(false),
            Err(TryLockError::Error(e)) => return Err(e),
        }
    }
}

/// Who holds a lock on the file or directory `f` is open on, as [`StateDir::lock_holder`] says.
pub(crate) fn holder_of(f: &impl AsFd) -> String {
    let Ok(st) = rustix::fs::fstat(f) else { return "unknown".into() };
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    holders(&locks, rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev), st.st_ino)
}

/// `owner.<hex>`, the lease file of `owner` (`<namespace>/<name>`): the first 8 bytes of the
/// owner's SHA-256, so that two object names (up to 253 bytes each) fit the 255-byte limit of a
/// file name.
fn lease_name(owner: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(owner.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("owner.{hex}")
}

/// Opens `dir` (creating it, and its parents, if missing) without following a symlink, refuses
/// it unless root owns it, and makes it mode 0700 if it was not: a directory only root can enter.
/// `what` names it in the error. Errors: I/O (with the path), or `PermissionDenied` naming the
/// owner and mode.
pub(crate) fn open_root_only(dir: &Path, what: &str) -> io::Result<OwnedFd> {
    use std::os::unix::fs::DirBuilderExt;
    let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", dir.display()));
    std::fs::DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir).map_err(named)?;
    let fd =
        rustix::fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| named(e.into()))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| named(e.into()))?;
    if st.st_uid != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{}: owned by uid {} (mode {:04o}), not root: refusing a {what} that another user controls",
                dir.display(),
                st.st_uid,
                st.st_mode & 0o7777
            ),
        ));
    }
    set_mode(&fd, st.st_mode, DIR_MODE).map_err(named)?;
    Ok(fd)
}

/// `fchmod` to `want` unless the permission bits of `mode` already are.
fn set_mode(fd: impl AsFd, mode: u32, want: u32) -> io::Result<()> {
    if mode & 0o7777 != want {
        rustix::fs::fchmod(fd, Mode::from_raw_mode(want))?;
    }
    Ok(())
}

/// The holders in `/proc/locks` text (`1: FLOCK  ADVISORY  WRITE <pid> <major>:<minor>:<inode> 0
/// EOF`, major and minor in hex; waiters' lines carry `->` and are skipped) of the file with that
/// device and inode: "PID <n>[, PID <m>]", or "unknown".
fn holders(locks: &str, major: u32, minor: u32, inode: u64) -> String {
    let mut pids = Vec::new();
    for line in locks.lines().filter(|l| !l.contains("->")) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(pid), Some(id)) = (fields.get(4), fields.get(5)) else { continue };
        let mut parts = id.split(':');
        let (Some(ma), Some(mi), Some(ino)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let same = u32::from_str_radix(ma, 16).ok() == Some(major)
            && u32::from_str_radix(mi, 16).ok() == Some(minor)
            && ino.parse::<u64>().ok() == Some(inode);
        if same {
            pids.push(match *pid {
                "0" => "unknown (a process in another PID namespace)".to_owned(),
                p => format!("PID {p}"),
            });
        }
    }
    if pids.is_empty() { "unknown".into() } else { pids.join(", ") }
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
        let first =
            dir.lock_start(Duration::from_secs(5), || panic!("the first taker does not wait"), || false).unwrap();
        assert!(first.is_some());
        let waited = std::cell::Cell::new(false);
        let second = dir.lock_start(Duration::from_secs(5), || waited.set(true), || true).unwrap();
        assert!(second.is_none() && waited.get());
        drop(first);
        assert!(dir.lock_start(Duration::from_secs(5), || (), || true).unwrap().is_some());
    }

    fn mode(p: &Path) -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    fn set_mode(p: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// `cmd` run as uid/gid 65534 with no groups (`setpriv`); whether it succeeded, and its stderr.
    fn as_nobody(cmd: &[&str]) -> (bool, String) {
        let out = std::process::Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "--"])
            .args(cmd)
            .output()
            .expect("setpriv (util-linux)");
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    }

    /// A state dir as kubelet's `DirectoryOrCreate` and an older release leave it: the directory
    /// 0755 and a lock file 0644, in a parent others may enter.
    fn old_release_dir() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        set_mode(tmp.path(), 0o755);
        let dir = tmp.path().join("aether-proxy");
        std::fs::create_dir(&dir).unwrap();
        set_mode(&dir, 0o755);
        std::fs::write(dir.join("start.lock"), b"").unwrap();
        set_mode(&dir.join("start.lock"), 0o644);
        (tmp, dir)
    }

    #[test]
    fn opening_makes_the_dir_0700_and_every_file_0600() {
        let (_tmp, path) = old_release_dir();
        let dir = StateDir::open(&path).unwrap();
        assert_eq!(mode(&path), 0o700);
        drop(dir.lock_start(Duration::from_secs(5), || (), || false).unwrap());
        assert_eq!(mode(&path.join("start.lock")), 0o600, "the old lock file is made 0600");
        let _alive = dir.hold_alive(1).unwrap();
        dir.write_live(&LiveRecord {
            epoch: 1,
            build: Build { version: Version(1, 40, 0), hot_restart_version: None, base_id: 1 },
            owner: None,
        })
        .unwrap();
        dir.request_step_down(2, "x").unwrap();
        for f in ["alive.1", "live-epoch", "step-down.2"] {
            assert_eq!(mode(&path.join(f)), 0o600, "{f}");
        }
        // A symlink planted in its place is not followed.
        std::os::unix::fs::symlink(path.join("live-epoch"), path.join("step-down.3")).unwrap();
        assert!(dir.take_step_down(3).is_err());
        assert!(dir.request_step_down(3, "x").is_err());
        // A directory root does not own is refused, with its owner and mode.
        let foreign = path.parent().unwrap().join("foreign");
        std::fs::create_dir(&foreign).unwrap();
        std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
        set_mode(&foreign, 0o755);
        let err = StateDir::open(&foreign).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        let msg = err.to_string();
        assert!(
            msg.contains(&foreign.display().to_string()) && msg.contains("uid 65534") && msg.contains("0755"),
            "{msg}"
        );
        assert_eq!(mode(&foreign), 0o755, "a refused directory is left as it was");
    }

    #[test]
    fn another_user_can_no_longer_open_the_start_lock() {
        let (_tmp, path) = old_release_dir();
        let lock = path.join("start.lock");
        let lock = lock.to_str().unwrap();
        // As the older release left it, any user can flock it (and stall every launcher).
        let (ok, err) = as_nobody(&["flock", "--nonblock", "--shared", lock, "true"]);
        assert!(ok, "the setup should let uid 65534 lock {lock}: {err}");
        let dir = StateDir::open(&path).unwrap();
        drop(dir.lock_start(Duration::from_secs(5), || (), || false).unwrap());
        let (ok, err) = as_nobody(&["flock", "--nonblock", "--shared", lock, "true"]);
        assert!(!ok, "uid 65534 still locks {lock}");
        assert!(err.contains("Permission denied"), "{err}");
        let (ok, _) = as_nobody(&["cat", lock]);
        assert!(!ok);
    }

    /// `flock(1)` holding a file's lock while its `cat` child waits on our pipe (`--close`: `cat`
    /// does not share the locked descriptor). On drop the pipe closes (`cat` exits) and `flock` is
    /// killed, which releases the lock.
    struct Holder(std::process::Child);

    impl Drop for Holder {
        fn drop(&mut self) {
            drop(self.0.stdin.take());
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn the_start_lock_wait_is_bounded_and_names_the_holder() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(tmp.path()).unwrap();
        let lock = tmp.path().join("start.lock");
        let holder = Holder(
            std::process::Command::new("flock")
                .arg("--close")
                .arg(&lock)
                .arg("cat")
                .stdin(std::process::Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let pid = holder.0.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !dir.lock_holder("start.lock").contains(&format!("PID {pid}")) {
            assert!(Instant::now() < deadline, "flock never took {}", lock.display());
            std::thread::sleep(Duration::from_millis(20));
        }
        let since = Instant::now();
        let err = dir.lock_start(Duration::from_millis(600), || (), || false).unwrap_err();
        assert!(since.elapsed() >= Duration::from_millis(600));
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        let msg = err.to_string();
        assert!(msg.contains(&format!("held by PID {pid}")) && msg.contains("start.lock"), "{msg}");
        drop(holder);
        assert!(dir.lock_start(Duration::from_secs(5), || (), || false).unwrap().is_some());
    }

    #[test]
    fn lock_holders_are_read_from_proc_locks() {
        let locks = "1: FLOCK  ADVISORY  WRITE 4242 00:2a:1234 0 EOF\n\
                     1: -> FLOCK  ADVISORY  WRITE 77 00:2a:1234 0 EOF\n\
                     2: FLOCK  ADVISORY  READ 0 fd:01:1234 0 EOF\n\
                     3: POSIX  ADVISORY  WRITE 9 00:2a:99 0 EOF\n";
        assert_eq!(holders(locks, 0, 0x2a, 1234), "PID 4242");
        assert_eq!(holders(locks, 0xfd, 1, 1234), "unknown (a process in another PID namespace)");
        assert_eq!(holders(locks, 0, 0x2a, 5), "unknown");
    }

    #[test]
    fn an_owners_lease_is_shared_by_its_launchers_and_removed_by_the_last_clean_exit() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(tmp.path()).unwrap();
        let owner = "team-b/aether-proxy";
        assert_eq!(dir.owner_lease(owner).unwrap(), Lease::Absent);
        // A rolling pod and its successor hold it together.
        let old = dir.hold_owner_lease(owner).unwrap();
        let new = dir.hold_owner_lease(owner).unwrap();
        assert_eq!(dir.owner_lease(owner).unwrap(), Lease::Held);
        assert_eq!(dir.owner_lease("aether-system/aether-proxy").unwrap(), Lease::Absent);
        let file = tmp.path().join(lease_name(owner));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), owner);
        assert_eq!(mode(&file), FILE_MODE);
        // The old one exits cleanly: the successor still holds it.
        assert!(!dir.release_owner_lease(owner, old).unwrap());
        assert_eq!(dir.owner_lease(owner).unwrap(), Lease::Held);
        // The successor dies without releasing it (a crash): unheld, still there.
        drop(new);
        assert_eq!(dir.owner_lease(owner).unwrap(), Lease::Unheld);
        // Its restarted container takes it again, and at its clean exit, the last, removes it.
        let again = dir.hold_owner_lease(owner).unwrap();
        assert_eq!(dir.owner_lease(owner).unwrap(), Lease::Held);
        assert!(dir.release_owner_lease(owner, again).unwrap());
        assert_eq!(dir.owner_lease(owner).unwrap(), Lease::Absent);
        // Two owners of the longest names still get a file each.
        let long = format!("{}/{}", "n".repeat(253), "d".repeat(253));
        let held = dir.hold_owner_lease(&long).unwrap();
        assert_eq!(dir.owner_lease(&long).unwrap(), Lease::Held);
        assert!(dir.release_owner_lease(&long, held).unwrap());
    }

    #[test]
    fn the_live_record_and_step_down_requests_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(tmp.path()).unwrap();
        assert_eq!(dir.read_live().unwrap(), None);
        let rec = LiveRecord {
            epoch: 7,
            build: Build { version: Version(1, 40, 0), hot_restart_version: Some("11.104".into()), base_id: 9 },
            owner: Some("aether-system/aether-proxy".into()),
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
        let rec = LiveRecord {
            epoch: 1,
            build: Build { version: Version(1, 40, 0), hot_restart_version: None, base_id: 1 },
            owner: None,
        };
        dir.write_live(&rec).unwrap();
        // Another epoch still runs: nothing is removed.
        let other = dir.hold_alive(2).unwrap();
        assert!(!dir.clean_if_last(&seg).unwrap());
        assert!(seg.exists());
        drop(other);
        // A launcher is starting: nothing is removed.
        let starting = dir.lock_start(Duration::from_secs(5), || (), || true).unwrap();
        assert!(!dir.clean_if_last(&seg).unwrap());
        drop(starting);
        assert!(dir.clean_if_last(&seg).unwrap());
        let mut left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        left.sort();
        assert_eq!(left, vec![std::ffi::OsString::from("shm"), "start.lock".into()]);
        assert!(!seg.exists());
    }

    /// A launcher waiting on `start.lock` while the last one cleans up keeps waiting on the same
    /// file as every later one: the lock still excludes.
    #[test]
    fn cleaning_up_never_splits_the_start_lock() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open(tmp.path()).unwrap();
        let seg = tmp.path().join("segment");
        let holder = dir.lock_start(Duration::from_secs(5), || (), || false).unwrap().unwrap();
        let (waiting_tx, waiting_rx) = std::sync::mpsc::channel();
        let (holds_tx, holds_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let a = {
            let dir = dir.clone();
            std::thread::spawn(move || {
                let held = dir.lock_start(Duration::from_secs(30), || waiting_tx.send(()).unwrap(), || false);
                holds_tx.send(()).unwrap();
                let _ = release_rx.recv();
                drop(held);
            })
        };
        // A opened start.lock and waits (its next try is 200 ms away): the holder leaves, and the
        // last launcher cleans up before A retries.
        waiting_rx.recv().unwrap();
        drop(holder);
        assert!(dir.clean_if_last(&seg).unwrap());
        holds_rx.recv_timeout(Duration::from_secs(5)).expect("A takes the start lock");
        // C must wait for A.
        let since = Instant::now();
        let c = dir.lock_start(Duration::from_secs(5), || (), || since.elapsed() > Duration::from_millis(500)).unwrap();
        assert!(c.is_none(), "C took start.lock while A holds it");
        release_tx.send(()).unwrap();
        a.join().unwrap();
        assert!(dir.lock_start(Duration::from_secs(5), || (), || false).unwrap().is_some());
    }
}
