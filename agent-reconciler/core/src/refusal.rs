//! Why the on-disk check (`aether_agent_reconciler::fscheck`, the I/O side) refused a pod's
//! socket path: plain data, so the pure layers (render, pod Events) can name the refusal without
//! depending on the module that runs `lstat`.

use crate::fallback::TcpReason;

/// Why a socket path is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A component on the way to the socket is a symlink.
    #[error("{path} is a symlink; a pipe is never rendered through a link (it could point at another pod's socket)")]
    Symlink {
        /// The offending path.
        path: String,
    },
    /// A component that must be a directory is something else.
    #[error("{path} is not a directory")]
    NotDirectory {
        /// The offending path.
        path: String,
    },
    /// The socket path exists but is not a socket.
    #[error("{path} exists but is not a Unix socket (it is a {found})")]
    NotSocket {
        /// The socket path.
        path: String,
        /// What it is instead: `regular file`, `directory`, ...
        found: &'static str,
    },
    /// The socket has more than one hard link (another name, possibly another pod's, reaches it).
    #[error("{path} has {links} hard links; a pipe is only rendered to a socket with one name")]
    HardLink {
        /// The socket path.
        path: String,
        /// Its link count.
        links: u64,
    },
    /// `lstat` failed for another reason than "not found".
    #[error("cannot inspect {path}: {error}")]
    Unreadable {
        /// The path.
        path: String,
        /// The OS error.
        error: String,
    },
}

impl Refusal {
    /// The fallback reason of this refusal, for the log, the pod Event and the metrics.
    pub fn tcp_reason(&self) -> TcpReason {
        match self {
            Refusal::Symlink { .. } => TcpReason::Symlink,
            Refusal::NotDirectory { .. } => TcpReason::NotADirectory,
            Refusal::NotSocket { .. } => TcpReason::NotASocket,
            Refusal::HardLink { .. } => TcpReason::HardLink,
            Refusal::Unreadable { .. } => TcpReason::Unreadable,
        }
    }

    /// The kebab-case label of [`Refusal::tcp_reason`], e.g. `not-a-directory`.
    pub fn label(&self) -> &'static str {
        self.tcp_reason().label()
    }
}
