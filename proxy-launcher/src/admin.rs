//! Envoy's admin API, as the launcher reads it: `GET /server_info` (which epoch answers, and in
//! which state) and the `listener_manager.listener_stopped` counter (has anyone stopped its
//! listeners). A hot restart child closes its parent's admin before it binds its own (and over a
//! Unix socket, unlinks the parent's file first), so the answer comes from the newest Envoy.
//!
//! The chart puts the admin on a Unix socket (`admin.address.pipe`, mode 0600) in a directory
//! only root may enter ([`prepare_socket_dir`]): the admin has no authentication and can stop
//! every listener of the node, and a TCP port on the host's loopback is open to any
//! `pods/portforward` grant on a host-network pod and to every process on the node
//! (docs/design-notes.md, "Envoy's admin").

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

pub use aether_process::envoy_admin::EnvoyAdmin;

/// The fields of `/server_info` the launcher reads.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ServerInfo {
    /// `PRE_INITIALIZING`, `INITIALIZING`, `LIVE` or `DRAINING`.
    pub state: String,
    /// The answering Envoy's command line.
    pub command_line_options: CommandLine,
}

/// `command_line_options` of `/server_info`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CommandLine {
    /// `--restart-epoch`.
    #[serde(default)]
    pub restart_epoch: u32,
}

impl ServerInfo {
    /// Whether this answer says: epoch `epoch` is serving.
    pub fn live_at(&self, epoch: u32) -> bool {
        self.state == "LIVE" && self.command_line_options.restart_epoch == epoch
    }
}

/// The `/stats?format=json` answer: `{"stats": [{"name": ..., "value": ...}, ...]}`.
#[derive(Debug, Deserialize)]
struct Stats {
    #[serde(default)]
    stats: Vec<Stat>,
}

#[derive(Debug, Deserialize)]
struct Stat {
    name: String,
    #[serde(default)]
    value: Option<u64>,
}

/// The counter Envoy's ListenerManager increments for each listener it stops (`POST
/// /drain_listeners`, or a hot restart parent handing over): while an Envoy is the newest, any
/// count means listeners it no longer serves.
pub const LISTENER_STOPPED: &str = "listener_manager.listener_stopped";

/// The most of an admin answer read (bytes).
pub const BODY_MAX_BYTES: u64 = 1 << 20;

/// An admin client: 1 s to connect and answer, one connection per request (an Envoy whose admin
/// closed for a hot restart child keeps answering on connections it had already accepted).
#[derive(Debug, Clone)]
pub struct Admin {
    addr: EnvoyAdmin,
    client: Option<reqwest::blocking::Client>,
}

impl Admin {
    /// A client for the admin at `addr`. Plain HTTP: no certificates are loaded (the Envoy image
    /// may have none).
    pub fn new(addr: EnvoyAdmin) -> Admin {
        // reqwest builds its TLS stack even for plain HTTP: the process's provider, installed once.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let builder = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(1))
            .no_proxy()
            .tls_certs_only(Vec::new())
            .pool_max_idle_per_host(0);
        let builder = match addr.unix_path() {
            Some(p) => builder.unix_socket(p),
            None => builder,
        };
        // A client that cannot be built answers nothing, as an admin that does not answer.
        Admin { client: builder.build().ok(), addr }
    }

    /// The address it reads.
    pub fn address(&self) -> &EnvoyAdmin {
        &self.addr
    }

    fn get(&self, path_and_query: &str) -> Option<String> {
        let url = self.addr.url(path_and_query);
        let resp = self.client.as_ref()?.get(url).send().ok()?.error_for_status().ok()?;
        if resp.content_length().is_some_and(|n| n > BODY_MAX_BYTES) {
            return None;
        }
        let mut body = String::new();
        std::io::Read::read_to_string(&mut std::io::Read::take(resp, BODY_MAX_BYTES), &mut body).ok()?;
        Some(body)
    }

    /// `/server_info`; `None` when nothing answers or the answer is not server info.
    pub fn server_info(&self) -> Option<ServerInfo> {
        serde_json::from_str(&self.get("/server_info")?).ok()
    }

    /// [`LISTENER_STOPPED`]; `None` when nothing answers or the answer lacks it.
    pub fn listeners_stopped(&self) -> Option<u64> {
        let body = self.get("/stats?format=json&filter=%5Elistener_manager%5C.listener_stopped%24")?;
        let stats: Stats = serde_json::from_str(&body).ok()?;
        stats.stats.into_iter().find(|s| s.name == LISTENER_STOPPED).and_then(|s| s.value)
    }
}

/// Makes the directory of a Unix admin socket root's and mode 0700 before Envoy binds the socket
/// in it (creating it if missing): the socket's own mode (0600, the bootstrap's) is applied only
/// after bind(2), and the directory keeps everyone else out meanwhile. Refuses a symlink or a
/// directory another user owns, as the hand-over state dir does ([`crate::state_dir`]).
///
/// # Errors
/// I/O errors naming the path; `PermissionDenied` for a directory not owned by root.
pub fn prepare_socket_dir(socket: &Path) -> std::io::Result<()> {
    let Some(dir) = socket.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(());
    };
    crate::state_dir::open_root_only(dir, "Envoy admin socket dir").map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn server_info_reads_state_and_epoch() {
        let s: ServerInfo = serde_json::from_str(
            r#"{"version":"x","state":"LIVE","hot_restart_version":"11.104",
                "command_line_options":{"base_id":"7391","restart_epoch":2,"concurrency":2}}"#,
        )
        .unwrap();
        assert!(s.live_at(2));
        assert!(!s.live_at(1));
        let init: ServerInfo = serde_json::from_str(r#"{"state":"INITIALIZING","command_line_options":{}}"#).unwrap();
        assert!(!init.live_at(0));
    }

    #[test]
    fn nothing_listening_is_none() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        assert_eq!(Admin::new(EnvoyAdmin::Tcp(addr)).server_info(), None);
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(Admin::new(EnvoyAdmin::Unix(tmp.path().join("none.sock"))).server_info(), None);
    }

    /// Over a Unix socket: `/server_info` and the stopped-listener counter, each from one plain
    /// HTTP/1.1 answer (a listener standing in for Envoy's admin; the handover tests use Envoy's).
    #[test]
    fn the_admin_is_read_over_its_unix_socket() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("admin.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            for c in listener.incoming() {
                let Ok(mut c) = c else { continue };
                let mut buf = [0u8; 2048];
                let n = c.read(&mut buf).unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).into_owned();
                let body = if req.starts_with("GET /server_info ") {
                    r#"{"state":"LIVE","command_line_options":{"restart_epoch":3}}"#
                } else if req.starts_with("GET /stats?format=json&filter=") {
                    r#"{"stats":[{"name":"listener_manager.listener_stopped","value":2}]}"#
                } else {
                    "{}"
                };
                let _ =
                    write!(c, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            }
        });
        let admin = Admin::new(EnvoyAdmin::Unix(path));
        assert!(admin.server_info().unwrap().live_at(3));
        assert_eq!(admin.listeners_stopped(), Some(2));
    }

    #[test]
    fn the_socket_dir_is_made_roots_and_0700() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("envoy");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        prepare_socket_dir(&dir.join("admin.sock")).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777, 0o700);
        let fresh = tmp.path().join("fresh");
        prepare_socket_dir(&fresh.join("admin.sock")).unwrap();
        assert_eq!(std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o7777, 0o700);
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(prepare_socket_dir(&link.join("admin.sock")).is_err(), "a symlinked dir is refused");
    }
}
