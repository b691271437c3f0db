//! Where the ADS server listens: the address ([`XdsAddr`]: a Unix socket or TCP), the bound
//! [`XdsListener`] (a stale socket file of a previous run is replaced, a live one never), and
//! [`ServeError`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use crate::shutdown::FileId;

/// Where the ADS server listens: `unix://<path>` (or `unix:<path>`) or `<ip>:<port>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum XdsAddr {
    /// A TCP address (port 0 picks a free port; see [`XdsListener::local_addr`]).
    Tcp(SocketAddr),
    /// A Unix socket path; a stale socket file there is replaced.
    Unix(PathBuf),
}

impl FromStr for XdsAddr {
    type Err = ServeError;

    /// Parses `unix:///run/x.sock`, `unix:/run/x.sock` or `127.0.0.1:18000`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix://").or_else(|| s.strip_prefix("unix:")) {
            if path.is_empty() {
                return Err(ServeError::Address(s.to_owned()));
            }
            return Ok(XdsAddr::Unix(PathBuf::from(path)));
        }
        s.parse().map(XdsAddr::Tcp).map_err(|_| ServeError::Address(s.to_owned()))
    }
}

impl std::fmt::Display for XdsAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            XdsAddr::Tcp(a) => write!(f, "{a}"),
            XdsAddr::Unix(p) => write!(f, "unix://{}", p.display()),
        }
    }
}

/// Errors of [`XdsAddr::from_str`], [`XdsListener::bind`] and [`serve`].
///
/// [`serve`]: super::server::serve
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Neither `unix://<path>` nor `<ip>:<port>`.
    #[error("invalid xDS listen address {0:?}: want unix://<path> or <ip>:<port>")]
    Address(String),
    /// Binding failed (address in use, permission, missing directory, or a non-socket file at
    /// the Unix path, which is never removed).
    #[error("cannot listen on {addr}: {error}")]
    Bind {
        /// The address.
        addr: String,
        /// The OS error. Its text ends the message, so it is not also the `source()`: a printed
        /// cause chain shows it once.
        error: std::io::Error,
    },
    /// The gRPC server failed while serving. tonic's error says only "transport error" and keeps
    /// the cause in its own `source()`, so it stays this error's source and the message does not
    /// repeat it: print the chain (`{:#}` of anyhow) to see why.
    #[error("xDS gRPC server failed")]
    Transport(#[from] tonic::transport::Error),
}

/// A bound listener, so callers (tests) learn the port before serving.
#[derive(Debug)]
pub enum XdsListener {
    /// Bound TCP listener.
    Tcp(tokio::net::TcpListener),
    /// Bound Unix listener, its path, and the identity of the socket file it created there.
    Unix(tokio::net::UnixListener, PathBuf, FileId),
}

impl XdsListener {
    /// Binds `addr`. A Unix path that holds a stale socket (left by a previous run: nothing
    /// accepts on it) is removed first; a live socket or any other file there is an error.
    ///
    /// # Errors
    /// [`ServeError::Bind`].
    pub async fn bind(addr: &XdsAddr) -> Result<Self, ServeError> {
        let bind_err = |error| ServeError::Bind { addr: addr.to_string(), error };
        match addr {
            XdsAddr::Tcp(a) => Ok(XdsListener::Tcp(tokio::net::TcpListener::bind(a).await.map_err(bind_err)?)),
            XdsAddr::Unix(path) => {
                use std::os::unix::fs::FileTypeExt;
                if let Ok(meta) = std::fs::symlink_metadata(path)
                    && meta.file_type().is_socket()
                {
                    // A socket someone still accepts on belongs to a live process (another agent):
                    // never take it over. Only a stale one (connection refused) is replaced.
                    if std::os::unix::net::UnixStream::connect(path).is_ok() {
                        return Err(bind_err(std::io::Error::new(
                            std::io::ErrorKind::AddrInUse,
                            "another process is serving on this socket (is a second agent running?)",
                        )));
                    }
                    std::fs::remove_file(path).map_err(bind_err)?;
                }
                let l = tokio::net::UnixListener::bind(path).map_err(bind_err)?;
                let id = FileId::of(&std::fs::symlink_metadata(path).map_err(bind_err)?);
                Ok(XdsListener::Unix(l, path.clone(), id))
            }
        }
    }

    /// The Unix socket path and the identity of the socket file bound there (`None` for TCP).
    pub(crate) fn own_socket(&self) -> Option<(PathBuf, FileId)> {
        match self {
            XdsListener::Unix(_, path, id) => Some((path.clone(), *id)),
            XdsListener::Tcp(_) => None,
        }
    }

    /// The bound TCP address (`None` for a Unix socket).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match self {
            XdsListener::Tcp(l) => l.local_addr().ok(),
            XdsListener::Unix(..) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        assert_eq!(
            "unix:///run/aether/xds.sock".parse::<XdsAddr>().unwrap(),
            XdsAddr::Unix("/run/aether/xds.sock".into())
        );
        assert_eq!("unix:/x.sock".parse::<XdsAddr>().unwrap(), XdsAddr::Unix("/x.sock".into()));
        assert_eq!("127.0.0.1:18000".parse::<XdsAddr>().unwrap(), XdsAddr::Tcp("127.0.0.1:18000".parse().unwrap()));
        assert!("unix://".parse::<XdsAddr>().is_err());
        assert!("localhost:1".parse::<XdsAddr>().is_err());
    }
}
