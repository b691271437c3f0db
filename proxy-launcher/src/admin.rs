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

/// A shared flock on the admin socket's directory, held by a launcher from just before it starts
/// an Envoy until that Envoy has exited: while any launcher holds one, no launcher removes the
/// directory ([`remove_unused_socket_dir`]). The kernel drops the lock with its holder.
#[derive(Debug)]
pub struct SocketDirHold(#[allow(dead_code)] std::fs::File);

/// How long [`hold_socket_dir`] waits for an exclusive holder of the admin socket's directory.
pub const SOCKET_DIR_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Prepares the socket's directory as [`prepare_socket_dir`] does and takes a shared flock on it,
/// checking that the locked directory is still the one at that path (a last launcher elsewhere
/// may have removed it in between; then it is made anew). Waits only while a removal holds the
/// lock exclusively (a few system calls), at most [`SOCKET_DIR_LOCK_WAIT`]. `None` for a socket
/// path without a directory.
///
/// # Errors
/// Those of [`prepare_socket_dir`]; I/O errors of flock(2) and stat(2), naming the directory;
/// `TimedOut` naming the directory and the holder's PID when it stays locked exclusively.
pub fn hold_socket_dir(socket: &Path) -> std::io::Result<Option<SocketDirHold>> {
    hold_socket_dir_within(socket, SOCKET_DIR_LOCK_WAIT)
}

/// [`hold_socket_dir`] with the wait for an exclusive holder bounded by `wait`.
fn hold_socket_dir_within(socket: &Path, wait: std::time::Duration) -> std::io::Result<Option<SocketDirHold>> {
    let Some(dir) = socket.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(None);
    };
    let named = |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", dir.display()));
    // Each turn follows a removal that won a race with this one; a handful is already unlikely.
    for _ in 0..10 {
        let f = std::fs::File::from(crate::state_dir::open_root_only(dir, "Envoy admin socket dir")?);
        if !crate::state_dir::try_lock_within(&f, crate::state_dir::LockKind::Shared, wait).map_err(named)? {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "{}: locked exclusively for {:.1} s by {} (a removal takes a few system calls)",
                    dir.display(),
                    wait.as_secs_f64(),
                    crate::state_dir::holder_of(&f)
                ),
            ));
        }
        if still_at(&f, dir).map_err(named)? {
            return Ok(Some(SocketDirHold(f)));
        }
    }
    Err(std::io::Error::other(format!("{}: removed again each time it was made", dir.display())))
}

/// After this launcher's Envoy stopped with no successor and no Envoy left on the node: removes
/// the admin socket file and its directory, unless another launcher holds the directory
/// ([`hold_socket_dir`]: its Envoy runs or is starting, maybe from another hand-over state dir)
/// or the directory holds anything else. Returns whether the directory is gone.
///
/// # Errors
/// I/O errors other than the file or directory being gone, held, or not empty.
pub fn remove_unused_socket_dir(socket: &Path) -> std::io::Result<bool> {
    use rustix::fs::{AtFlags, Mode, OFlags};
    use std::io::ErrorKind;
    let (Some(dir), Some(name)) = (socket.parent().filter(|d| !d.as_os_str().is_empty()), socket.file_name()) else {
        return Ok(false);
    };
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let f = match rustix::fs::open(dir, flags, Mode::empty()) {
        Ok(fd) => std::fs::File::from(fd),
        Err(rustix::io::Errno::NOENT) => return Ok(true),
        Err(e) => return Err(e.into()),
    };
    match f.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Ok(false),
        Err(std::fs::TryLockError::Error(e)) => return Err(e),
    }
    if !still_at(&f, dir)? {
        return Ok(false);
    }
    match rustix::fs::unlinkat(&f, name, AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(e.into()),
    }
    // Removed while locked: a launcher that opened it meanwhile finds it gone once it gets the
    // lock, and makes it anew.
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(true),
        Err(e) if e.kind() == ErrorKind::DirectoryNotEmpty => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether the open directory `f` is still the one at `dir` (same device and inode).
fn still_at(f: &std::fs::File, dir: &Path) -> std::io::Result<bool> {
    let open = rustix::fs::fstat(f)?;
    match rustix::fs::lstat(dir) {
        Ok(now) => Ok(now.st_dev == open.st_dev && now.st_ino == open.st_ino),
        Err(rustix::io::Errno::NOENT) => Ok(false),
        Err(e) => Err(e.into()),
    }
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

    #[test]
    fn an_unused_socket_dir_goes_a_held_one_stays() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("envoy/admin.sock");
        let hold = hold_socket_dir(&socket).unwrap().expect("a directory");
        let _stale = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        // Another launcher's Envoy runs (or starts): nothing is removed.
        assert!(!remove_unused_socket_dir(&socket).unwrap());
        assert!(socket.exists());
        drop(hold);
        assert!(remove_unused_socket_dir(&socket).unwrap(), "the socket file and its dir go");
        assert!(!socket.parent().unwrap().exists());
        assert!(remove_unused_socket_dir(&socket).unwrap(), "gone already: nothing to do");
        // A dir with anything else in it stays.
        let _hold = hold_socket_dir(&socket).unwrap();
        drop(_hold);
        std::fs::write(socket.parent().unwrap().join("other"), "x").unwrap();
        assert!(!remove_unused_socket_dir(&socket).unwrap());
    }

    #[test]
    fn a_socket_dir_held_exclusively_is_waited_for_within_a_bound_naming_the_holder() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("envoy/admin.sock");
        prepare_socket_dir(&socket).unwrap();
        let holder = std::fs::File::open(socket.parent().unwrap()).unwrap();
        holder.lock().unwrap();
        let err = hold_socket_dir_within(&socket, std::time::Duration::from_millis(300)).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
        let me = format!("PID {}", std::process::id());
        assert!(err.to_string().contains("locked exclusively for 0.3 s by") && err.to_string().contains(&me), "{err}");
        // Released within the bound: held.
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            drop(holder);
        });
        assert!(hold_socket_dir_within(&socket, std::time::Duration::from_secs(5)).unwrap().is_some());
        release.join().unwrap();
    }

    #[test]
    fn a_launcher_that_opened_the_dir_before_its_removal_makes_it_anew() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("envoy/admin.sock");
        let dir = socket.parent().unwrap().to_owned();
        prepare_socket_dir(&socket).unwrap();
        // The removal holds the lock (as remove_unused_socket_dir does) and removes the dir
        // while another launcher waits for its shared lock on the old one.
        let old = std::fs::File::open(&dir).unwrap();
        old.lock().unwrap();
        let waiter = {
            let socket = socket.clone();
            std::thread::spawn(move || hold_socket_dir(&socket).unwrap().expect("a directory"))
        };
        std::thread::sleep(std::time::Duration::from_millis(200));
        std::fs::remove_dir(&dir).unwrap();
        drop(old);
        let hold = waiter.join().unwrap();
        let open = rustix::fs::fstat(&hold.0).unwrap();
        let now = rustix::fs::lstat(&dir).expect("made anew");
        assert_eq!((open.st_dev, open.st_ino), (now.st_dev, now.st_ino), "the hold is on the dir at the path");
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777, 0o700);
    }
}
