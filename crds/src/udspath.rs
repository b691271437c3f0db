//! Socket value grammar, the socket limits (sun_path budget or file system), and the host path
//! resolver.
//!
//! A socket value is `<volume>/<file>` (docs/workload-requirements.md, "The byte budget"). It
//! resolves to
//! `<pods-dir>/<pod-dir-id>/volumes/kubernetes.io~empty-dir/<volume>/<file>`. Every length here is
//! counted in **bytes**, never characters. What bounds the value's length is the
//! [`SocketLimit`] the node runs with (`--socket-limit`):
//!
//! - [`SocketLimit::SunPath`] (the default): Envoy dials that path, so it must fit in `sun_path`:
//!   108 bytes including the terminating NUL, so at most [`SUN_PATH_MAX`] = 107 bytes of path
//!   (unix(7)). The budget for the value is `107 − len(pods-dir) − 70`, where 70 bytes are `/`, a
//!   36-byte pod UID and `/volumes/kubernetes.io~empty-dir/`. With the default pods dir
//!   `/var/lib/kubelet/pods` (21 bytes) the budget is 16 bytes.
//! - [`SocketLimit::Filesystem`]: every node's agent pins sockets (`--pin-dir`), so
//!   Envoy dials only the short pin path and the 107 bytes apply to that, not to the pod's path.
//!   The value is then bounded by the file system: the volume by its grammar (a DNS-1123 label,
//!   at most [`VOLUME_NAME_MAX`] = 63 bytes) and the file by [`NAME_MAX`] = 255 bytes, so at most
//!   [`FILESYSTEM_VALUE_MAX`] = 319 bytes in all, whatever the pods dir.

use std::fmt;

/// The longest pathname a Unix socket address can hold, in bytes: `sun_path` is 108 bytes and
/// the kernel needs one for the terminating NUL (unix(7)).
pub const SUN_PATH_MAX: usize = 107;

/// Bytes of a Kubernetes pod UID in its canonical UUID form (`8-4-4-4-12` hex digits).
pub const UID_BYTES: usize = 36;

/// Bytes of a static (mirror) pod's directory name: kubelet's 32-hex-digit config hash.
pub const MIRROR_HASH_BYTES: usize = 32;

/// The path segment kubelet uses for emptyDir volumes under a pod's `volumes/` directory.
pub const EMPTY_DIR_PLUGIN: &str = "kubernetes.io~empty-dir";

/// Fixed bytes between the pods dir and the socket value: `/`, the 36-byte UID and
/// `/volumes/kubernetes.io~empty-dir/` (34 bytes): 70 in all.
pub const FIXED_BYTES: usize = 1 + UID_BYTES + "/volumes/".len() + EMPTY_DIR_PLUGIN.len() + 1;

/// The shortest possible socket value, `a/b`, in bytes. A pods dir whose budget is below this can
/// never pipe any pod: a configuration error.
pub const MIN_VALUE_BYTES: usize = 3;

/// kubelet's default pods dir (`--root-dir` `/var/lib/kubelet` + `/pods`).
pub const DEFAULT_PODS_DIR: &str = "/var/lib/kubelet/pods";

/// The longest a volume name may be: a DNS-1123 label (Kubernetes API conventions).
pub const VOLUME_NAME_MAX: usize = 63;

/// The longest pods dir, in bytes, that still leaves [`MIN_VALUE_BYTES`] for the socket value:
/// `107 − 70 − 3` = 34. [`Budget::new`] refuses a longer one; the chart's values schema repeats
/// this number as the `maxLength` of the mount path (a test keeps the two equal).
pub const MAX_PODS_DIR_BYTES: usize = SUN_PATH_MAX - FIXED_BYTES - MIN_VALUE_BYTES;

/// The widest budget any pods dir can give (the shortest absolute pods dir is one byte, `/`):
/// no socket value longer than this can ever fit under [`SocketLimit::SunPath`], whatever the
/// configuration. The CRD schema uses it in the CEL length rule of `spec.udsSocket`
/// (`size(bytes(self)) <= 36`: the CRD chart's default, `socketLimit: sunPath`).
pub const WIDEST_BUDGET: usize = SUN_PATH_MAX - 1 - FIXED_BYTES;

/// The longest file name a Linux file system takes, in bytes: `NAME_MAX` of `<linux/limits.h>`
/// (ext4, xfs, btrfs and tmpfs, which backs `medium: Memory` emptyDirs, all hold 255). Under
/// [`SocketLimit::Filesystem`] it bounds the file part of a socket value.
pub const NAME_MAX: usize = 255;

/// The longest socket value under [`SocketLimit::Filesystem`], in bytes: a [`VOLUME_NAME_MAX`]
/// volume, `/` and a [`NAME_MAX`] file, 63 + 1 + 255 = 319. The bound of the CRD chart's
/// `spec.udsSocket` length rule with `socketLimit: filesystem`.
pub const FILESYSTEM_VALUE_MAX: usize = VOLUME_NAME_MAX + 1 + NAME_MAX;

/// What bounds the length of a socket value (`--socket-limit` of the controller and the agent;
/// the charts' `socketLimit`). The grammar is the same under both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SocketLimit {
    /// Envoy dials the pod's own socket path, which must fit in `sun_path`: the value gets the
    /// budget `107 − len(pods-dir) − 70` bytes (16 with `/var/lib/kubelet/pods`). The default.
    #[default]
    SunPath,
    /// Envoy dials only the agent's pin of the socket (`--pin-dir`, at most 107 bytes whatever
    /// the pod's path), so the value is limited by the file system alone: the volume a DNS-1123
    /// label (at most 63 bytes), the file at most [`NAME_MAX`] (255) bytes. The pods dir's length
    /// no longer matters. Correct only when every node's agent pins sockets.
    Filesystem,
}

impl SocketLimit {
    /// The value of `--socket-limit` that selects this limit: `sun-path` or `filesystem`.
    pub const fn flag_value(self) -> &'static str {
        match self {
            SocketLimit::SunPath => "sun-path",
            SocketLimit::Filesystem => "filesystem",
        }
    }

    /// The longest socket value this limit can ever admit, whatever the pods dir, in bytes:
    /// [`WIDEST_BUDGET`] (36) or [`FILESYSTEM_VALUE_MAX`] (319). The bound of the CRD's
    /// `spec.udsSocket` length rule for this limit.
    pub const fn longest_value(self) -> usize {
        match self {
            SocketLimit::SunPath => WIDEST_BUDGET,
            SocketLimit::Filesystem => FILESYSTEM_VALUE_MAX,
        }
    }
}

impl fmt::Display for SocketLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.flag_value())
    }
}

/// Why a socket value is rejected. The `Display` text states the rule; callers put the field
/// name and the quoted value in front of it (e.g. `spec.udsSocket "a/b/c" must ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SocketError {
    /// The value is empty.
    #[error("must not be empty: expected <volume>/<file>, e.g. \"sockets/app.sock\"")]
    Empty,
    /// The value does not contain exactly one `/`.
    #[error(
        "must contain exactly one '/' separating <volume>/<file> (found {found}); no leading, trailing or doubled '/'"
    )]
    Slashes {
        /// How many `/` the value holds.
        found: usize,
    },
    /// The volume part is not a DNS-1123 label.
    #[error(
        "names volume {volume:?}, which is not a DNS-1123 label (1-63 of lowercase a-z, 0-9 and '-', starting and ending with a letter or digit), so it cannot be a pod volume"
    )]
    Volume {
        /// The offending volume part.
        volume: String,
    },
    /// The file part is empty, `.`/`..`, or has a character outside `[A-Za-z0-9._-]`.
    #[error(
        "names file {file:?}, which is not allowed: a file name is 1 or more of A-Z a-z 0-9 . _ - and not \".\" or \"..\""
    )]
    File {
        /// The offending file part.
        file: String,
    },
    /// Under [`SocketLimit::Filesystem`]: the file part is longer than [`NAME_MAX`] bytes, so no
    /// file system could hold the socket.
    #[error(
        "names a file of {file_bytes} bytes, over the {NAME_MAX}-byte limit of a file name (NAME_MAX, the file system's name limit; --socket-limit filesystem)"
    )]
    FileTooLong {
        /// Length of the file part in bytes.
        file_bytes: usize,
    },
    /// Under [`SocketLimit::SunPath`]: the value is longer than the budget the pods dir leaves in
    /// `sun_path`.
    #[error(
        "is {value_bytes} bytes; the budget is {budget} bytes with pods dir {pods_dir} (sun_path holds {SUN_PATH_MAX})"
    )]
    TooLong {
        /// Length of the value in bytes.
        value_bytes: usize,
        /// The budget in bytes.
        budget: usize,
        /// The pods dir the budget was computed for.
        pods_dir: String,
    },
}

impl SocketError {
    /// A short, stable name of the rule broken, for metric labels and pod-event reasons.
    pub fn rule(&self) -> &'static str {
        match self {
            SocketError::Empty | SocketError::Slashes { .. } => "socket-shape",
            SocketError::Volume { .. } => "socket-volume-name",
            SocketError::File { .. } => "socket-file-name",
            SocketError::FileTooLong { .. } => "socket-file-too-long",
            SocketError::TooLong { .. } => "socket-path-too-long",
        }
    }
}

/// A socket value that passed the grammar: `<volume>/<file>`, both single clean segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketRef<'a> {
    /// The emptyDir volume name (a DNS-1123 label).
    pub volume: &'a str,
    /// The socket file name inside the volume.
    pub file: &'a str,
}

/// True when `s` is a DNS-1123 label: 1–63 bytes of `[a-z0-9-]`, starting and ending
/// alphanumeric (Kubernetes API conventions, used for volume names).
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= VOLUME_NAME_MAX
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

fn is_file_name(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// Checks the grammar of a socket value (not its length beyond the volume's 63 bytes; see
/// [`Budget::check`]).
///
/// # Errors
/// [`SocketError::Empty`], [`SocketError::Slashes`], [`SocketError::Volume`] or
/// [`SocketError::File`], in that order of precedence.
pub fn parse(value: &str) -> Result<SocketRef<'_>, SocketError> {
    if value.is_empty() {
        return Err(SocketError::Empty);
    }
    let found = value.bytes().filter(|b| *b == b'/').count();
    let Some((volume, file)) = value.split_once('/').filter(|_| found == 1) else {
        return Err(SocketError::Slashes { found });
    };
    if !is_dns1123_label(volume) {
        return Err(SocketError::Volume { volume: volume.to_owned() });
    }
    if !is_file_name(file) {
        return Err(SocketError::File { file: file.to_owned() });
    }
    Ok(SocketRef { volume, file })
}

/// Why a pods dir cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodsDirError {
    /// Not an absolute, clean path (`/`-rooted, no empty, `.` or `..` segments, no NUL).
    #[error(
        "pods dir {0:?} must be an absolute, clean path (starting with '/', no '.', '..' or empty segments, no NUL)"
    )]
    NotClean(String),
    /// The pods dir leaves fewer than [`MIN_VALUE_BYTES`] for the socket value.
    #[error(
        "pods dir {pods_dir} ({len} bytes) leaves a socket budget of {budget} bytes ({SUN_PATH_MAX} - {len} - {FIXED_BYTES}); at least {MIN_VALUE_BYTES} are needed for the shortest value \"a/b\", so no pod can be delivered over a Unix socket: mount the kubelet pods dir at a shorter path (or, when every node's agent pins sockets, use --socket-limit filesystem)"
    )]
    BudgetTooSmall {
        /// The pods dir as configured.
        pods_dir: String,
        /// Its length in bytes.
        len: usize,
        /// The (possibly negative) budget in bytes.
        budget: i64,
    },
}

/// The socket-value budget of one pods dir under one [`SocketLimit`]: what `sun_path` leaves
/// for the value, or the file system's limits.
///
/// Built once from the configured `--kubelet-pods-dir` (the path as the proxy sees it) and
/// `--socket-limit` by both the webhook and the agent, so the two always agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pods_dir: String,
    bytes: usize,
    limit: SocketLimit,
}

impl Budget {
    /// The sun_path budget for `pods_dir`: [`Budget::with_limit`] under [`SocketLimit::SunPath`].
    ///
    /// # Errors
    /// As [`Budget::with_limit`].
    pub fn new(pods_dir: &str) -> Result<Self, PodsDirError> {
        Budget::with_limit(pods_dir, SocketLimit::SunPath)
    }

    /// The budget for `pods_dir` under `limit`. A single trailing `/` is tolerated and dropped.
    /// Under [`SocketLimit::SunPath`] it is `107 − len(pods-dir) − 70` bytes; under
    /// [`SocketLimit::Filesystem`] [`FILESYSTEM_VALUE_MAX`] bytes whatever the pods dir's length
    /// (the file part also at most [`NAME_MAX`]).
    ///
    /// # Errors
    /// [`PodsDirError::NotClean`] for a relative or unclean path (under either limit);
    /// [`PodsDirError::BudgetTooSmall`] under [`SocketLimit::SunPath`] when fewer than
    /// [`MIN_VALUE_BYTES`] bytes remain.
    pub fn with_limit(pods_dir: &str, limit: SocketLimit) -> Result<Self, PodsDirError> {
        let trimmed = if pods_dir.len() > 1 { pods_dir.strip_suffix('/').unwrap_or(pods_dir) } else { pods_dir };
        let clean = trimmed.starts_with('/')
            && !trimmed.contains('\0')
            && (trimmed == "/" || trimmed[1..].split('/').all(|s| !s.is_empty() && s != "." && s != ".."));
        if !clean {
            return Err(PodsDirError::NotClean(pods_dir.to_owned()));
        }
        let pods_dir = trimmed.to_owned();
        if limit == SocketLimit::Filesystem {
            return Ok(Budget { pods_dir, bytes: FILESYSTEM_VALUE_MAX, limit });
        }
        let len = trimmed.len();
        let budget = SUN_PATH_MAX as i64 - len as i64 - FIXED_BYTES as i64;
        if budget < MIN_VALUE_BYTES as i64 {
            return Err(PodsDirError::BudgetTooSmall { pods_dir, len, budget });
        }
        Ok(Budget { pods_dir, bytes: budget as usize, limit })
    }

    /// The longest `<volume>/<file>` value admitted, in bytes: the sun_path budget under
    /// [`SocketLimit::SunPath`], [`FILESYSTEM_VALUE_MAX`] under [`SocketLimit::Filesystem`].
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The limit this budget was computed under.
    pub fn limit(&self) -> SocketLimit {
        self.limit
    }

    /// The pods dir this budget was computed for (no trailing `/`).
    pub fn pods_dir(&self) -> &str {
        &self.pods_dir
    }

    /// Checks grammar and length of a socket value.
    ///
    /// # Errors
    /// Any [`SocketError`]; grammar errors come before the length errors
    /// ([`SocketError::TooLong`] under [`SocketLimit::SunPath`], [`SocketError::FileTooLong`]
    /// under [`SocketLimit::Filesystem`]).
    pub fn check<'a>(&self, value: &'a str) -> Result<SocketRef<'a>, SocketError> {
        let parsed = parse(value)?;
        if self.limit == SocketLimit::Filesystem {
            // The grammar bounds the volume to 63 bytes, so the value is at most 319 bytes.
            if parsed.file.len() > NAME_MAX {
                return Err(SocketError::FileTooLong { file_bytes: parsed.file.len() });
            }
            return Ok(parsed);
        }
        if value.len() > self.bytes {
            return Err(SocketError::TooLong {
                value_bytes: value.len(),
                budget: self.bytes,
                pods_dir: self.pods_dir.clone(),
            });
        }
        Ok(parsed)
    }

    /// Resolves a socket value for one pod to the host path of its socket:
    /// `<pods-dir>/<pod-dir-id>/volumes/kubernetes.io~empty-dir/<volume>/<file>`, at most
    /// [`SUN_PATH_MAX`] bytes under [`SocketLimit::SunPath`] (under [`SocketLimit::Filesystem`]
    /// it may be longer: only its pin is dialed).
    ///
    /// # Errors
    /// Any [`SocketError`] of [`Budget::check`].
    pub fn resolve(&self, pod_dir: &PodDirId, value: &str) -> Result<SocketPath, SocketError> {
        let s = self.check(value)?;
        let volume_dir = format!("{}/{}/volumes/{EMPTY_DIR_PLUGIN}/{}", self.pods_dir, pod_dir.as_str(), s.volume);
        let path = format!("{volume_dir}/{}", s.file);
        debug_assert!(
            self.limit != SocketLimit::SunPath || path.len() <= SUN_PATH_MAX,
            "the sun_path budget arithmetic must bound the path"
        );
        Ok(SocketPath { volume_dir_len: volume_dir.len(), path })
    }
}

/// A resolved socket path on the host (as the proxy sees it); at most [`SUN_PATH_MAX`] bytes
/// under [`SocketLimit::SunPath`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SocketPath {
    path: String,
    volume_dir_len: usize,
}

impl SocketPath {
    /// The full socket path.
    pub fn as_str(&self) -> &str {
        &self.path
    }

    /// The emptyDir volume directory that holds the socket (no trailing `/`).
    pub fn volume_dir(&self) -> &str {
        &self.path[..self.volume_dir_len]
    }

    /// The socket's file name in [`SocketPath::volume_dir`] (the `<file>` of `<volume>/<file>`).
    pub fn file_name(&self) -> &str {
        self.path[self.volume_dir_len..].trim_start_matches('/')
    }
}

impl fmt::Display for SocketPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.path)
    }
}

/// The name of a pod's directory under the pods dir: its API UID (canonical lowercase UUID, 36
/// bytes) or, for a static pod, kubelet's config hash (32 lowercase hex digits;
/// docs/design-notes.md, "Agent"). Both are untrusted input and are checked before they become a
/// path segment.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodDirId(String);

/// A pod directory id that is neither a canonical UUID nor a 32-hex-digit mirror hash.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "pod directory id {0:?} is neither a lowercase UUID (8-4-4-4-12 hex digits) nor a 32-hex-digit static pod hash"
)]
pub struct PodDirIdError(pub String);

impl PodDirId {
    /// Accepts a canonical lowercase UUID (36 bytes) or a 32-lowercase-hex static pod hash.
    ///
    /// # Errors
    /// [`PodDirIdError`] for anything else.
    pub fn new(id: &str) -> Result<Self, PodDirIdError> {
        let hex = |c: u8| c.is_ascii_digit() || (b'a'..=b'f').contains(&c);
        let b = id.as_bytes();
        let uuid = b.len() == UID_BYTES
            && b.iter().enumerate().all(|(i, c)| if matches!(i, 8 | 13 | 18 | 23) { *c == b'-' } else { hex(*c) });
        let mirror = b.len() == MIRROR_HASH_BYTES && b.iter().all(|c| hex(*c));
        if uuid || mirror { Ok(PodDirId(id.to_owned())) } else { Err(PodDirIdError(id.to_owned())) }
    }

    /// A 36-byte stand-in UID for pods that have none yet (an offline plan of a manifest); it
    /// takes the same room as a real UID, so budgets stay exact.
    pub fn placeholder() -> Self {
        Self::numbered_placeholder(0)
    }

    /// The `n`-th placeholder (`00000000-0000-0000-0000-<n, 12 digits>`), so that several pods
    /// without UIDs stay distinct. Never a real UID: the all-zero version field is not that of a
    /// random (v4) UUID, which is what the API server assigns.
    pub fn numbered_placeholder(n: u64) -> Self {
        PodDirId(format!("00000000-0000-0000-0000-{:012}", n % 1_000_000_000_000))
    }

    /// True for [`PodDirId::placeholder`] and [`PodDirId::numbered_placeholder`] ids.
    pub fn is_placeholder(&self) -> bool {
        self.0.starts_with("00000000-0000-0000-0000-")
    }

    /// The id as a path segment.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}
