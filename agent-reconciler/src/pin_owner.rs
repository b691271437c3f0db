//! One agent per pin dir (docs/install.md, "One release per cluster").
//!
//! The pin dir (`--pin-dir`) is a host path: two agents that share it pin, re-pin and, when their
//! release goes, remove each other's pins. A second release's agent on a node rendered without
//! the chart's install check (`helm template`, GitOps) would do exactly that. So before the agent
//! reads its state dir or touches a pin, it claims the pin dir: an exclusive `flock(2)` on
//! `<pin-dir>/.owner` (mode 0600, never through a symlink), held for the process's life (the
//! kernel drops it when the process dies, whatever the way), with the agent's owner written in
//! it: its DaemonSet as `<namespace>/<name>` (`--own-daemonset`), or empty without one.
//!
//! The claim is also a lease: the holder refreshes the file's mtime every [`REFRESH`]. A file
//! nobody holds that names another owner and was refreshed less than [`STALE`] ago is that
//! owner's still: its agent is between two runs (a roll, a crash), so a newcomer of another owner
//! is refused then too, and cannot slip in while the first release's agent restarts. After
//! [`STALE`] (an owner that went without removing its file) the newcomer takes it.
//!
//! While another process holds the claim, [`verdict`] decides from the holder's owner:
//! - the same owner (the previous agent of this release, still in its shutdown: a roll or a pod
//!   deletion): wait, up to a bound, then fail naming it;
//! - another owner: refuse at once, naming it. The agent exits non-zero before it has changed
//!   anything on the node, and the kubelet's back-off retries it; it starts once the other
//!   release is gone.
//!
//! The file goes with the pins when the release goes ([`PinOwner::remove`]), while the lock is
//! held; a waiter that opened it before then finds its inode unlinked and opens the new one.

use std::io::{self, Read, Seek, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{self as rfs, FlockOperation, Mode, OFlags};

/// The claim's file name in the pin dir (a dot file: the pins are `<uid>.sock`, and
/// [`crate::pin::Pinner::retain`] touches only those).
pub const FILE: &str = ".owner";
/// The most bytes of the holder's owner read from the file (a `<namespace>/<name>` is at most
/// 63 + 1 + 253 bytes, Kubernetes' name limits).
const OWNER_MAX: u64 = 512;
/// How often a waiting agent tries the lock again.
const RETRY: Duration = Duration::from_millis(250);
/// How often the holder refreshes the claim file's mtime ([`PinOwner::refresh`]).
pub const REFRESH: Duration = Duration::from_secs(30);
/// How long an unheld claim file of another owner still counts as that owner's.
pub const STALE: Duration = Duration::from_secs(600);

/// What an agent does about a claim another process holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The holder is this release's previous agent: wait for it to exit.
    Wait,
    /// The holder is another release's agent, named here: refuse.
    Refuse(String),
}

/// Decides from the holder's recorded owner (`holder`, the file's text) and this agent's
/// (`me`, `<namespace>/<name>` or empty). Pure. An empty holder text (a holder that has not
/// written it yet) counts as the same owner.
pub fn verdict(holder: &str, me: &str) -> Verdict {
    let holder = holder.trim();
    if holder.is_empty() || holder == me { Verdict::Wait } else { Verdict::Refuse(holder.to_owned()) }
}

/// A held claim on a pin dir; dropping it releases the lock (the file stays).
#[derive(Debug)]
pub struct PinOwner {
    path: PathBuf,
    /// Holds the lock while open.
    file: std::fs::File,
}

/// Why an agent could not claim its pin dir.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// Another release's agent holds it, or held it less than [`STALE`] ago.
    #[error(
        "the pin dir {dir} belongs to the agent of {other}{when}, another aether release on this \
         node (this agent's DaemonSet: {me}); two releases on one node remove each other's socket \
         pins, so this agent changes nothing and exits: uninstall one of them, or give them \
         disjoint daemonset.nodeSelector (docs/install.md, \"One release per cluster\")"
    )]
    OtherOwner {
        /// Empty when it holds the claim now; else when it last did (`" (not running now; it \
        /// held the claim N s ago)"`).
        when: String,
        /// The pin dir.
        dir: String,
        /// The holder's `<namespace>/<name>`.
        other: String,
        /// This agent's owner, or a note that it has none.
        me: String,
    },
    /// Another agent that is not another release's (this release's previous agent, or one that
    /// wrote no owner) still held it after the wait.
    #[error(
        "the pin dir {dir} is still held by {holder} after {waited_s} s (look for a second \
         aether-agent process on the node: cat /proc/locks lists flock holders)"
    )]
    StillHeld {
        /// The pin dir.
        dir: String,
        /// Who: "this DaemonSet's previous agent (`<ns>/<name>`)" or "an agent that wrote no owner".
        holder: String,
        /// Seconds waited.
        waited_s: u64,
    },
    /// SIGTERM or SIGINT came while waiting.
    #[error("stopped while waiting for the pin dir {dir}")]
    Stopped {
        /// The pin dir.
        dir: String,
    },
    /// The file could not be opened, locked or written.
    #[error("{path}: {source}")]
    Io {
        /// The claim file.
        path: String,
        /// The OS error.
        source: io::Error,
    },
}

/// Claims `dir` for `me` (`<namespace>/<name>`, or empty), waiting up to `wait` while this
/// release's previous agent holds it, unless `stop` turns true; `dir` must exist.
///
/// # Errors
/// [`ClaimError::OtherOwner`] at once when another owner holds it (or left it less than
/// [`STALE`] ago), [`ClaimError::StillHeld`] after `wait`, [`ClaimError::Stopped`],
/// [`ClaimError::Io`] for the file (a symlink there is refused: `ELOOP`).
pub async fn claim(
    dir: &Path,
    me: &str,
    wait: Duration,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Result<PinOwner, ClaimError> {
    let path = dir.join(FILE);
    let io_err = |source: io::Error| ClaimError::Io { path: path.display().to_string(), source };
    let named = if me.is_empty() { "none (no --own-daemonset)".to_owned() } else { me.to_owned() };
    let start = Instant::now();
    let mut logged = false;
    loop {
        let mut file = open(&path).map_err(io_err)?;
        match rfs::flock(file.as_fd(), FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {
                // Removed (by the holder leaving with its release) between our open and the lock:
                // the lock is on an unlinked inode, so take the new file.
                if !still_at(&file, &path).map_err(io_err)? {
                    continue;
                }
                // Unheld: another owner's file still counts as theirs for STALE after its last
                // refresh (their agent is between two runs).
                let left = read_owner(&mut file).map_err(io_err)?;
                let age = file.metadata().and_then(|m| m.modified()).map_err(io_err)?.elapsed().unwrap_or_default();
                if let Verdict::Refuse(other) = verdict(&left, me)
                    && age < STALE
                {
                    return Err(ClaimError::OtherOwner {
                        when: format!(" (not running now; it held the claim {} s ago)", age.as_secs()),
                        dir: dir.display().to_string(),
                        other,
                        me: named,
                    });
                }
                file.set_len(0).map_err(io_err)?;
                file.rewind().map_err(io_err)?;
                file.write_all(me.as_bytes()).map_err(io_err)?;
                if logged {
                    tracing::info!(pin_dir = %dir.display(), waited_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX), "the previous agent let go of the pin dir");
                }
                return Ok(PinOwner { path, file });
            }
            Err(rustix::io::Errno::WOULDBLOCK) => {}
            Err(e) => return Err(io_err(e.into())),
        }
        let holder = read_owner(&mut file).map_err(io_err)?;
        match verdict(&holder, me) {
            Verdict::Refuse(other) => {
                return Err(ClaimError::OtherOwner {
                    when: String::new(),
                    dir: dir.display().to_string(),
                    other,
                    me: named,
                });
            }
            Verdict::Wait if *stop.borrow() => return Err(ClaimError::Stopped { dir: dir.display().to_string() }),
            Verdict::Wait if start.elapsed() >= wait => {
                let holder = if holder.trim().is_empty() {
                    "an agent that wrote no owner".to_owned()
                } else {
                    format!("this DaemonSet's previous agent ({named})")
                };
                return Err(ClaimError::StillHeld {
                    dir: dir.display().to_string(),
                    holder,
                    waited_s: start.elapsed().as_secs(),
                });
            }
            Verdict::Wait => {
                if !logged {
                    tracing::info!(pin_dir = %dir.display(), wait_s = wait.as_secs(), "another agent of this release holds the pin dir; waiting for it to exit");
                    logged = true;
                }
                drop(file);
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

impl PinOwner {
    /// The claim file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Renews the lease: sets the claim file's mtime to now (every [`REFRESH`]).
    ///
    /// # Errors
    /// The OS error of `futimens`.
    pub fn refresh(&self) -> io::Result<()> {
        self.file.set_modified(std::time::SystemTime::now())
    }

    /// Removes the claim file while still holding the lock: the release goes and its pins with
    /// it. A missing file is fine.
    ///
    /// # Errors
    /// The OS error of the unlink.
    pub fn remove(&self) -> io::Result<()> {
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// The owner text in the claim file (at most [`OWNER_MAX`] bytes).
fn read_owner(file: &mut std::fs::File) -> io::Result<String> {
    let mut text = String::new();
    file.rewind()?;
    file.take(OWNER_MAX).read_to_string(&mut text)?;
    Ok(text)
}

/// Opens (creating, mode 0600) the claim file without following a symlink.
fn open(path: &Path) -> io::Result<std::fs::File> {
    let fd = rfs::open(
        path,
        OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    Ok(std::fs::File::from(fd))
}

/// Whether `file` is still the inode at `path`.
fn still_at(file: &std::fs::File, path: &Path) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let held = file.metadata()?;
    match std::fs::symlink_metadata(path) {
        Ok(now) => Ok(now.dev() == held.dev() && now.ino() == held.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_owner_or_an_unwritten_claim_is_waited_for_another_is_refused() {
        assert_eq!(verdict("aether-node/aether-node\n", "aether-node/aether-node"), Verdict::Wait);
        assert_eq!(verdict("", "aether-node/aether-node"), Verdict::Wait);
        assert_eq!(verdict("", ""), Verdict::Wait);
        assert_eq!(
            verdict("aether-node/aether-node", "second/second-node"),
            Verdict::Refuse("aether-node/aether-node".into())
        );
        // An agent without --own-daemonset never shares with a named one.
        assert_eq!(verdict("aether-node/aether-node", ""), Verdict::Refuse("aether-node/aether-node".into()));
    }

    fn running() -> tokio::sync::watch::Receiver<bool> {
        tokio::sync::watch::channel(false).1
    }

    #[tokio::test]
    async fn a_second_owner_is_refused_while_the_first_holds_and_gets_it_once_the_first_leaves() {
        let dir = tempfile::tempdir().unwrap();
        let first = claim(dir.path(), "ns-a/a-node", Duration::ZERO, &running()).await.unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join(FILE)).unwrap(), "ns-a/a-node");
        let err = claim(dir.path(), "ns-b/b-node", Duration::from_secs(5), &running()).await.unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, ClaimError::OtherOwner { .. }), "{text}");
        assert!(text.contains("ns-a/a-node") && text.contains("ns-b/b-node"), "{text}");
        // The same owner waits, then names its wait.
        let err = claim(dir.path(), "ns-a/a-node", Duration::from_millis(300), &running()).await.unwrap_err();
        assert!(matches!(err, ClaimError::StillHeld { .. }), "{err}");
        // The release goes: the file with it; the other release's agent then claims it.
        first.remove().unwrap();
        assert!(!dir.path().join(FILE).exists());
        let second = claim(dir.path(), "ns-b/b-node", Duration::ZERO, &running()).await.unwrap();
        assert_eq!(std::fs::read_to_string(second.path()).unwrap(), "ns-b/b-node");
    }

    #[tokio::test]
    async fn a_waiting_agent_of_the_same_release_gets_the_claim_when_its_predecessor_exits() {
        let dir = tempfile::tempdir().unwrap();
        let first = claim(dir.path(), "ns/node", Duration::ZERO, &running()).await.unwrap();
        let path = dir.path().to_owned();
        let waiter = tokio::spawn(async move { claim(&path, "ns/node", Duration::from_secs(10), &running()).await });
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(!waiter.is_finished(), "the successor did not wait");
        drop(first);
        let second = waiter.await.unwrap().unwrap();
        assert_eq!(std::fs::read_to_string(second.path()).unwrap(), "ns/node");
    }

    #[tokio::test]
    async fn another_owner_s_unheld_claim_is_theirs_until_stale_and_a_wait_ends_on_stop() {
        let dir = tempfile::tempdir().unwrap();
        // The first release's agent between two runs: its claim file, nobody holding it.
        let first = claim(dir.path(), "ns-a/a-node", Duration::ZERO, &running()).await.unwrap();
        first.refresh().unwrap();
        drop(first);
        let err = claim(dir.path(), "ns-b/b-node", Duration::ZERO, &running()).await.unwrap_err();
        assert!(err.to_string().contains("not running now"), "{err}");
        // Its own next agent takes it at once.
        let again = claim(dir.path(), "ns-a/a-node", Duration::ZERO, &running()).await.unwrap();
        // A SIGTERM ends a wait behind it.
        let (tx, stop) = tokio::sync::watch::channel(false);
        let path = dir.path().to_owned();
        let waiter = tokio::spawn(async move { claim(&path, "ns-a/a-node", Duration::from_secs(30), &stop).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        tx.send(true).unwrap();
        let err = tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap().unwrap_err();
        assert!(matches!(err, ClaimError::Stopped { .. }), "{err}");
        drop(again);
        // Left STALE ago: taken.
        let old = std::time::SystemTime::now() - STALE - Duration::from_secs(1);
        std::fs::File::options().write(true).open(dir.path().join(FILE)).unwrap().set_modified(old).unwrap();
        let second = claim(dir.path(), "ns-b/b-node", Duration::ZERO, &running()).await.unwrap();
        assert_eq!(std::fs::read_to_string(second.path()).unwrap(), "ns-b/b-node");
    }

    #[tokio::test]
    async fn a_symlink_in_place_of_the_claim_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "x").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(FILE)).unwrap();
        let err = claim(dir.path(), "ns/node", Duration::ZERO, &running()).await.unwrap_err();
        assert!(matches!(err, ClaimError::Io { .. }), "{err}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "x");
    }
}
