//! Where Envoy's admin API answers, as the agent (`--envoy-admin`) and the proxy launcher
//! (`--admin`, `--foreign-admin`) take it: a Unix socket (the chart's,
//! `/run/aether/envoy/admin.sock`, mode 0600 in a root-only directory: only root reaches it, and
//! `pods/portforward`, which dials TCP ports only, cannot) or a TCP address (Envoys of releases up
//! to 0.10.0, and tests). docs/design-notes.md, "Envoy's admin", says why.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

/// The longest path a Unix socket address holds: `sun_path` is 108 bytes on Linux, one of them
/// the terminating NUL (unix(7)).
pub const SUN_PATH_MAX_BYTES: usize = 107;

/// Envoy's admin address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvoyAdmin {
    /// A Unix socket at this absolute path (the bootstrap's `admin.address.pipe.path`).
    Unix(PathBuf),
    /// `IP:PORT` (the bootstrap's `admin.address.socket_address`).
    Tcp(SocketAddr),
}

impl FromStr for EnvoyAdmin {
    type Err = String;

    /// An absolute path (at most [`SUN_PATH_MAX_BYTES`] bytes) is a Unix socket; otherwise
    /// `IP:PORT`. The error names the rule broken.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.starts_with('/') {
            if s.len() > SUN_PATH_MAX_BYTES {
                return Err(format!(
                    "{s:?} is {} bytes: a Unix socket path holds at most {SUN_PATH_MAX_BYTES} (sun_path)",
                    s.len()
                ));
            }
            return Ok(EnvoyAdmin::Unix(PathBuf::from(s)));
        }
        s.parse().map(EnvoyAdmin::Tcp).map_err(|_| {
            format!("{s:?} is neither an absolute path (a Unix socket) nor IP:PORT (e.g. /run/aether/envoy/admin.sock)")
        })
    }
}

impl fmt::Display for EnvoyAdmin {
    /// `unix:<path>` or `IP:PORT`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvoyAdmin::Unix(p) => write!(f, "unix:{}", p.display()),
            EnvoyAdmin::Tcp(a) => write!(f, "{a}"),
        }
    }
}

impl EnvoyAdmin {
    /// The URL of `path_and_query` (starting with `/`) on this admin; over a Unix socket the
    /// host is only the `Host` header (the HTTP client dials the socket).
    pub fn url(&self, path_and_query: &str) -> String {
        match self {
            EnvoyAdmin::Unix(_) => format!("http://localhost{path_and_query}"),
            EnvoyAdmin::Tcp(a) => format!("http://{a}{path_and_query}"),
        }
    }

    /// The Unix socket's path; `None` for a TCP address.
    pub fn unix_path(&self) -> Option<&std::path::Path> {
        match self {
            EnvoyAdmin::Unix(p) => Some(p),
            EnvoyAdmin::Tcp(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_a_unix_socket_and_ip_port_is_tcp() {
        assert_eq!(
            "/run/aether/envoy/admin.sock".parse::<EnvoyAdmin>().unwrap(),
            EnvoyAdmin::Unix("/run/aether/envoy/admin.sock".into())
        );
        assert_eq!("127.0.0.1:9901".parse::<EnvoyAdmin>().unwrap(), EnvoyAdmin::Tcp("127.0.0.1:9901".parse().unwrap()));
        assert_eq!("[::1]:9901".parse::<EnvoyAdmin>().unwrap().to_string(), "[::1]:9901");
        assert_eq!(
            "/run/aether/envoy/admin.sock".parse::<EnvoyAdmin>().unwrap().to_string(),
            "unix:/run/aether/envoy/admin.sock"
        );
    }

    #[test]
    fn anything_else_is_refused_naming_the_rule() {
        let e = "run/admin.sock".parse::<EnvoyAdmin>().unwrap_err();
        assert!(e.contains("neither an absolute path"), "{e}");
        let e = "localhost:9901".parse::<EnvoyAdmin>().unwrap_err();
        assert!(e.contains("IP:PORT"), "{e}");
        let long = format!("/{}", "a".repeat(SUN_PATH_MAX_BYTES));
        let e = long.parse::<EnvoyAdmin>().unwrap_err();
        assert!(e.contains("sun_path"), "{e}");
        assert!(format!("/{}", "a".repeat(SUN_PATH_MAX_BYTES - 1)).parse::<EnvoyAdmin>().is_ok());
    }

    #[test]
    fn urls_name_the_path_on_either_transport() {
        assert_eq!(EnvoyAdmin::Unix("/x.sock".into()).url("/config_dump"), "http://localhost/config_dump");
        assert_eq!(EnvoyAdmin::Tcp("127.0.0.1:1".parse().unwrap()).url("/a?b"), "http://127.0.0.1:1/a?b");
    }
}
