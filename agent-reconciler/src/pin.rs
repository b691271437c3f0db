//! Socket pinning (docs/design-notes.md, "Agent"): Envoy dials a path the agent owns that reaches
//! the socket inode the agent verified, never a name the pod controls.
//!
//! The threat: the socket path lies in the pod's emptyDir, which the pod writes. `connect(2)`
//! follows symlinks and Envoy (root) re-resolves the path on every new upstream connection, so a
//! pod that swaps its socket for a symlink to another pod's socket *between* two checks gets that
//! pod's traffic (measured: 272 of 325 requests with a 10 s `lstat` re-check). Any
//! check-then-dial design has this window (CVE-2017-1002101 and CVE-2021-25741 are this kind).
//!
//! The mechanism, per pod:
//! 1. **Open without following anything.** The volume dir
//!    `<pods-dir>/<uid>/volumes/kubernetes.io~empty-dir/<volume>` is opened with `openat2(2)`
//!    (`RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH`) from the pods dir, then the socket with `O_PATH |
//!    O_NOFOLLOW` and `RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH | RESOLVE_NO_XDEV` *from the volume
//!    dir's fd* (a `medium: Memory` volume is its own mount, so `NO_XDEV` applies only below it).
//! 2. **Check the opened inode**, not a name: `fstat` must say `S_IFSOCK` with one hard link (a
//!    symlink opened with `O_PATH | O_NOFOLLOW` is the link itself, and is refused as one).
//! 3. **Pin it**: `open_tree(fd, "", OPEN_TREE_CLONE | AT_EMPTY_PATH)` clones a mount of exactly
//!    that inode, and `move_mount` attaches it on `<pin-dir>/<uid>.sock`, a file in a directory
//!    only the agent writes. Envoy's pipe endpoint is that path (at most 53 + len(pin dir) bytes),
//!    so what the pod does to its names afterwards changes nothing Envoy reaches. A pin is a
//!    mount: it outlives an agent restart (new connections keep working while the agent is down).
//!
//! When the app re-creates its socket (a container restart: a new inode), the old pin answers
//! `ECONNREFUSED` (unhealthy, never another socket) until the next check re-verifies and re-pins.
//! Needs `CAP_SYS_ADMIN` in the mount namespace that holds the pin dir, and mount propagation
//! from the agent to Envoy (chart: the agent's pin-dir mount is `Bidirectional`, Envoy's
//! `HostToContainer`).

use std::collections::HashSet;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use aether_crds::SocketPath;
use rustix::fs::{self as rfs, FileType, Mode, OFlags, ResolveFlags};
use rustix::mount::{self, MoveMountFlags, OpenTreeFlags, UnmountFlags};

use crate::fscheck::Refusal;

/// The pin of one pod's socket: the agent-owned path Envoy dials and the inode it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    /// `<pin-dir>/<uid>.sock`.
    pub path: String,
    /// Device and inode of the pinned socket.
    pub inode: (u64, u64),
}

/// Why a pin could not be made (besides a [`Refusal`] of the pod's socket).
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// The pod's socket path is refused: the pod goes to TCP with this reason.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The socket does not exist yet (the app has not bound it): nothing is pinned, and the pin
    /// path reaches nothing (unhealthy, like a port that is not listening yet).
    #[error("{path} does not exist yet")]
    NotYet {
        /// The socket path.
        path: String,
    },
    /// Mounting or unmounting on the pin dir failed (e.g. no `CAP_SYS_ADMIN`): nothing is pinned.
    #[error("cannot pin {path}: {error}")]
    Mount {
        /// The pin path.
        path: String,
        /// The OS error. Its text ends the message, so it is not also the `source()`: a printed
        /// cause chain shows it once.
        error: io::Error,
    },
}

/// Pins sockets of pods under `pods_dir` onto files in `pin_dir`.
#[derive(Debug, Clone)]
pub struct Pinner {
    pods_dir: PathBuf,
    pin_dir: PathBuf,
}

pub use crate::names::pin_path;

fn errno_refusal(path: &str, e: rustix::io::Errno) -> PinError {
    match e {
        rustix::io::Errno::NOENT => PinError::NotYet { path: path.to_owned() },
        rustix::io::Errno::LOOP => Refusal::Symlink { path: path.to_owned() }.into(),
        rustix::io::Errno::NOTDIR => Refusal::NotDirectory { path: path.to_owned() }.into(),
        // RESOLVE_NO_XDEV: something is mounted over a name below the volume dir.
        rustix::io::Errno::XDEV => {
            Refusal::Unreadable { path: path.to_owned(), error: "crosses a mount point".into() }.into()
        }
        e => Refusal::Unreadable { path: path.to_owned(), error: io::Error::from(e).to_string() }.into(),
    }
}

fn file_kind(ft: FileType) -> &'static str {
    match ft {
        FileType::RegularFile => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "symlink",
        FileType::Fifo => "fifo",
        FileType::CharacterDevice | FileType::BlockDevice => "device",
        _ => "special file",
    }
}

impl Pinner {
    /// Pins under `pin_dir` (created if missing, mode 0755) sockets found under `pods_dir` (the
    /// kubelet pods dir as the agent sees it).
    ///
    /// # Errors
    /// When `pin_dir` cannot be created.
    pub fn new(pods_dir: impl Into<PathBuf>, pin_dir: impl Into<PathBuf>) -> io::Result<Pinner> {
        let pin_dir = pin_dir.into();
        std::fs::create_dir_all(&pin_dir)?;
        Ok(Pinner { pods_dir: pods_dir.into(), pin_dir })
    }

    /// The pin dir.
    pub fn dir(&self) -> &Path {
        &self.pin_dir
    }

    /// Opens pod `uid`'s socket without following any link and checks the opened inode.
    ///
    /// # Errors
    /// [`PinError::NotYet`] when a component does not exist; [`PinError::Refused`] for a symlink
    /// anywhere (`ELOOP`, or the final component opened as a link), a non-directory where a
    /// directory must be, something other than a socket, or a socket with more than one link. A
    /// socket unlinked since it was opened (0 links) is [`PinError::NotYet`].
    pub fn open_verified(&self, uid: &str, socket: &SocketPath) -> Result<(OwnedFd, (u64, u64)), PinError> {
        let full = socket.as_str();
        let volume_dir = socket.volume_dir();
        let rel_dir = volume_dir
            .strip_prefix(self.pods_dir.to_str().unwrap_or_default())
            .map(|r| r.trim_start_matches('/'))
            .filter(|r| r.starts_with(uid))
            .ok_or_else(|| Refusal::Unreadable { path: full.to_owned(), error: "not under the pods dir".into() })?;
        let file = full.rsplit('/').next().unwrap_or_default();
        // A failed open is classified by the lstat walk, which names the offending component
        // (a symlinked volume dir opened with O_NOFOLLOW | O_DIRECTORY fails with ENOTDIR).
        let pods_dir = self.pods_dir.to_str().unwrap_or_default();
        let classify = |at: &str, e: rustix::io::Errno| match crate::fscheck::check(pods_dir, socket) {
            Err(refusal) => PinError::Refused(refusal),
            Ok(()) => errno_refusal(at, e),
        };
        let pods = rfs::open(&self.pods_dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| errno_refusal(pods_dir, e))?;
        let dir_flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let vol =
            rfs::openat2(&pods, rel_dir, dir_flags, Mode::empty(), ResolveFlags::NO_SYMLINKS | ResolveFlags::BENEATH)
                .map_err(|e| classify(volume_dir, e))?;
        let resolve = ResolveFlags::NO_SYMLINKS | ResolveFlags::BENEATH | ResolveFlags::NO_XDEV;
        let fd = rfs::openat2(&vol, file, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty(), resolve)
            .map_err(|e| classify(full, e))?;
        let st = rfs::fstat(&fd).map_err(|e| errno_refusal(full, e))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Socket => {}
            FileType::Symlink => return Err(Refusal::Symlink { path: full.to_owned() }.into()),
            other => return Err(Refusal::NotSocket { path: full.to_owned(), found: file_kind(other) }.into()),
        }
        if st.st_nlink == 0 {
            // Unlinked since it was opened: the app is re-creating its socket.
            return Err(PinError::NotYet { path: full.to_owned() });
        }
        if st.st_nlink != 1 {
            return Err(Refusal::HardLink { path: full.to_owned(), links: st.st_nlink }.into());
        }
        Ok((fd, (st.st_dev, st.st_ino)))
    }

    /// Verifies pod `uid`'s socket and makes `<pin-dir>/<uid>.sock` reach exactly that inode. A
    /// pin already holding the same inode is kept; a pin of another inode (the app re-created its
    /// socket) is replaced. On any error the pod's pin is removed, so the pin path reaches nothing.
    ///
    /// # Errors
    /// See [`Pinner::open_verified`]; [`PinError::Mount`] when the mount calls fail.
    ///
    /// An app re-creating its socket while it is pinned is not an error: a socket unlinked after
    /// it was opened (no link left), or before its mount is attached (`move_mount` answers
    /// `ENOENT`), is [`PinError::NotYet`], like a socket not bound yet. Its next creation is an
    /// event of the socket watch, which re-checks the pod.
    pub fn pin(&self, uid: &str, socket: &SocketPath) -> Result<Pin, PinError> {
        let path = pin_path(self.pin_dir.to_str().unwrap_or_default(), uid);
        let (fd, inode) = match self.open_verified(uid, socket) {
            Ok(v) => v,
            Err(e) => {
                self.unpin(uid);
                return Err(e);
            }
        };
        if self.pinned_inode(&path) == Some(inode) {
            return Ok(Pin { path, inode });
        }
        self.unpin(uid);
        let mount_err = |error: io::Error| PinError::Mount { path: path.clone(), error };
        // The mount point: an empty file only the agent writes (0600).
        rfs::open(&path, OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW, Mode::RUSR | Mode::WUSR)
            .map_err(|e| mount_err(e.into()))?;
        let tree = mount::open_tree(
            fd.as_fd(),
            "",
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC | OpenTreeFlags::AT_EMPTY_PATH,
        )
        .map_err(|e| mount_err(e.into()))?;
        mount::move_mount(tree.as_fd(), "", rfs::CWD, &path, MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH).map_err(|e| {
            match e {
                // The verified socket was unlinked since it was opened: the app is re-creating it.
                rustix::io::Errno::NOENT => {
                    remove_pin(Path::new(&path));
                    PinError::NotYet { path: socket.as_str().to_owned() }
                }
                e => mount_err(e.into()),
            }
        })?;
        Ok(Pin { path, inode })
    }

    /// The inode a pin path reaches now, if it is a pinned socket.
    fn pinned_inode(&self, path: &str) -> Option<(u64, u64)> {
        let st = rfs::lstat(path).ok()?;
        (FileType::from_raw_mode(st.st_mode) == FileType::Socket).then_some((st.st_dev, st.st_ino))
    }

    /// Removes pod `uid`'s pin: detaches every mount stacked on its pin path, then the file.
    /// Nothing happens when there is none.
    pub fn unpin(&self, uid: &str) {
        let path = pin_path(self.pin_dir.to_str().unwrap_or_default(), uid);
        remove_pin(Path::new(&path));
    }

    /// Removes every pin whose pod UID is not in `keep` (stale pins at start-up, or all of them
    /// with an empty `keep`); returns how many were removed.
    pub fn retain(&self, keep: &HashSet<String>) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.pin_dir) else { return 0 };
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(uid) = name.strip_suffix(".sock") else { continue };
            if !keep.contains(uid) {
                remove_pin(&entry.path());
                removed += 1;
            }
        }
        removed
    }
}

fn remove_pin(path: &Path) {
    // Pins may be stacked if an earlier unmount failed: detach until nothing is mounted there.
    for _ in 0..8 {
        if mount::unmount(path, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW).is_err() {
            break;
        }
    }
    let _ = std::fs::remove_file(path);
}
