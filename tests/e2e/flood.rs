//! Idle-connection floods against the real binaries (the policy is docs/listeners.md): the real
//! `aether-controller` (webhook over TLS registered with a real kube-apiserver, `failurePolicy:
//! Fail`; admin port) and the real `aether-agent` (admin port, xDS on a Unix socket, a real Envoy),
//! each under a lowered open-files limit (`prlimit --nofile`) so low that twice the caps would
//! exhaust it, with small caps and timeouts set by their flags.
//!
//! Each port is flooded with twice its cap of connections that never speak (on the webhook also
//! half-open TLS handshakes and finished handshakes that never send a request): the cap's worth
//! is held until the first-byte/handshake timeout evicts it, the rest is closed at once. Then,
//! within a bounded wait: a valid EndpointPolicy is admitted through the webhook, `/metrics`
//! scrapes, and Envoy gets its clusters over xDS while the agent's admin port is still at its
//! cap. The refused/evicted counters moved by exactly the flood's numbers, no accept failed with
//! `EMFILE`, and the processes are alive. Envoy's own `readiness` listener (the chart's bootstrap)
//! holds its cap of such connections, closes the rest at once and counts them; its `stats`
//! listener, on an Envoy holding the chart's most clusters, rate-limits a flood of scrapes while
//! the admin keeps answering; its overload manager holds the chart's global connection cap
//! against tens of thousands of idle connections and refuses new ones under heap pressure.
//!
//! Trials run one at a time in the order listed, against one control plane, controller and agent.

mod suite;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aether_fixtures::process::killed_with_parent;
use aether_fixtures::{Envoy, pod, policy};
use aether_tests::{ControlPlane, Scrape, envoy_bin, eventually, free_port, http_get_status, workspace_bin};
use anyhow::{Context, bail, ensure};

const NS: &str = "flood";
const NODE: &str = "node-f";
/// The bound on every wait of this file (not a timing assertion: things happen well within it).
const WAIT: Duration = Duration::from_secs(20);

/// The controller's open-files limit: the 128. Twice its caps (2 × (64 + 8 + 4), the
/// probe socket's among them) would exhaust it; the caps plus its own descriptors (16 to 20 at
/// rest here) fit.
const CONTROLLER_NOFILE: usize = 128;
const WEBHOOK_CAP: usize = 64;
const CONTROLLER_ADMIN_CAP: usize = 8;
/// The controller's handshake and first-byte timeouts (seconds).
const CONTROLLER_TIMEOUT_SECS: u64 = 3;

/// The agent's open-files limit: twice its caps (2 × (16 + 4 + 4)) plus its own descriptors (16
/// to 20 at rest here) would exhaust it; the caps (Envoy's connection and the probe socket's
/// among them) and its own fit.
const AGENT_NOFILE: usize = 56;
const AGENT_ADMIN_CAP: usize = 16;
const XDS_CAP: usize = 4;
/// Both processes' probe socket cap (`--probe-socket`; not a flag).
const PROBE_CAP: usize = aether_serve_policy::PROBE_MAX_CONNECTIONS;
const XDS_FIRST_BYTE_SECS: u64 = 3;
/// Long enough that the agent's admin flood is still held while Envoy starts and pulls its
/// clusters (the bounded wait for that is shorter), then evicted.
const AGENT_ADMIN_FIRST_BYTE_SECS: u64 = 15;
const AGENT_ADMIN_WAIT: Duration = Duration::from_secs(12);
/// The agent's admin share per source address: the binary's default (two sources fill the cap).
const AGENT_ADMIN_SHARE: usize = aether_serve_policy::ADMIN_MAX_CONNECTIONS_PER_SOURCE;
/// The agent's admin idle timeout (seconds), short so that the PING trial ends soon.
const AGENT_ADMIN_IDLE_SECS: u64 = 5;
/// Loopback addresses the flood's clients bind to: each is a source of its own for the shares.
const FLOOD_SOURCES: [&str; 2] = ["127.0.0.1", "127.0.0.2"];
/// How often a PING client pings.
const PING_EVERY: Duration = Duration::from_millis(500);

/// A binary started under `prlimit --nofile=N:N`, killed on drop.
struct Limited {
    child: Child,
    log: PathBuf,
    what: &'static str,
}

impl Limited {
    fn spawn(
        what: &'static str,
        bin: &Path,
        nofile: usize,
        args: &[String],
        env: &[(&str, &Path)],
        log: &Path,
    ) -> anyhow::Result<Self> {
        let mut cmd = killed_with_parent("prlimit");
        cmd.arg(format!("--nofile={nofile}:{nofile}")).arg(bin).args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .with_context(|| format!("starting {what} under prlimit"))?;
        Ok(Limited { child, log: log.to_owned(), what })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails when the process has exited.
    fn alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} exited ({status}):\n{}", self.what, self.log());
        }
        Ok(())
    }

    /// The soft "Max open files" of the running process, from /proc.
    fn nofile(&self) -> anyhow::Result<usize> {
        let limits = std::fs::read_to_string(format!("/proc/{}/limits", self.child.id()))?;
        let line = limits.lines().find(|l| l.starts_with("Max open files")).context("no Max open files line")?;
        line.split_whitespace().nth(3).context("no soft limit")?.parse().context("soft limit is a number")
    }

    /// Descriptors open now.
    fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id())).map(|d| d.count()).unwrap_or(0)
    }

    /// Waits (bounded) until `/readyz` on `port` is 200.
    fn wait_ready(&mut self, port: u16) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while http_get_status(port, "/readyz") != Some(200) {
            self.alive()?;
            ensure!(Instant::now() < deadline, "{} not ready after 30 s:\n{}", self.what, self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// No accept of this process failed for want of descriptors.
    fn no_emfile(&self) -> anyhow::Result<()> {
        let log = self.log();
        ensure!(!log.contains("Too many open files"), "{} ran out of descriptors:\n{log}", self.what);
        Ok(())
    }
}

impl Drop for Limited {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Env {
    cp: ControlPlane,
    work: tempfile::TempDir,
    controller: Mutex<Limited>,
    webhook_port: u16,
    controller_admin: u16,
    ca_file: PathBuf,
    agent: Mutex<Limited>,
    agent_admin: u16,
    echo: Mutex<Option<Child>>,
    envoy: Mutex<Option<Envoy>>,
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(mut c) = self.echo.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Env {
    fn path(&self, p: &str) -> PathBuf {
        self.work.path().join(p)
    }
    fn xds_socket(&self) -> PathBuf {
        self.path("run/xds.sock")
    }
}

/// How many connections to 127.0.0.1:`port` a server still holds a descriptor for: rows of
/// /proc/net/tcp with that local port, not listening (state `0A`), with an inode (a socket
/// whose descriptor is closed has inode 0 while the kernel finishes its close).
fn server_connections(port: u16) -> anyhow::Result<usize> {
    let table = std::fs::read_to_string("/proc/net/tcp")?;
    let local = format!(":{port:04X}");
    Ok(table
        .lines()
        .skip(1)
        .filter(|row| {
            let f: Vec<&str> = row.split_whitespace().collect();
            f.len() > 9 && f[1].ends_with(&local) && f[3] != "0A" && f[9] != "0"
        })
        .count())
}

/// Waits until the server on `port` has let go of every earlier connection (a scrape's, a
/// readiness probe's): the server frees a connection's place a moment after the client has read
/// the end of its response, and a flood that starts in that moment finds one place taken.
fn wait_quiet(port: u16) -> anyhow::Result<()> {
    eventually(&format!("no connection left open on port {port}"), WAIT, || Ok(server_connections(port)? == 0))
}

/// Connections that never send a byte.
fn silent_tcp(port: u16, n: usize) -> anyhow::Result<Vec<TcpStream>> {
    (0..n).map(|_| TcpStream::connect(("127.0.0.1", port)).context("connecting")).collect()
}

/// A connection to 127.0.0.1:`port` from the loopback address `source` (any of 127.0.0.0/8).
fn connect_from(source: &str, port: u16) -> anyhow::Result<TcpStream> {
    use std::net::{Ipv4Addr, SocketAddr};
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.bind(&SocketAddr::new(source.parse()?, 0).into()).with_context(|| format!("binding to {source}"))?;
    s.connect(&SocketAddr::from((Ipv4Addr::LOCALHOST, port)).into())
        .with_context(|| format!("connecting from {source}"))?;
    Ok(s.into())
}

/// `n` silent connections from each of [`FLOOD_SOURCES`], in that order.
fn silent_tcp_from_sources(port: u16, n: usize) -> anyhow::Result<Vec<TcpStream>> {
    let mut out = Vec::new();
    for source in FLOOD_SOURCES {
        for _ in 0..n {
            out.push(connect_from(source, port)?);
        }
    }
    Ok(out)
}

/// An HTTP/2 client (prior knowledge) from `source` to 127.0.0.1:`port` that opens no stream
/// and sends a PING every [`PING_EVERY`] until the server closes the connection; returns the
/// PINGs answered. `held` is told once the connection is up.
async fn ping_until_closed(
    source: &'static str,
    port: u16,
    held: tokio::sync::mpsc::Sender<()>,
) -> anyhow::Result<u32> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(std::net::SocketAddr::new(source.parse()?, 0))?;
    let tcp = socket.connect(std::net::SocketAddr::from(([127, 0, 0, 1], port))).await?;
    let (_requests, mut conn) = h2::client::handshake(tcp).await.context("HTTP/2 handshake")?;
    let mut pings = conn.ping_pong().context("the connection's PING handle")?;
    let driver = tokio::spawn(conn);
    let _ = held.send(()).await;
    let mut answered = 0;
    // The server's close ends the PING in flight (an error) or the connection's driver.
    while !driver.is_finished() {
        match tokio::time::timeout(WAIT, pings.ping(h2::Ping::opaque())).await {
            Ok(Ok(_pong)) => answered += 1,
            Ok(Err(_)) => break,
            Err(_) => bail!("a PING from {source} neither answered nor failed within {WAIT:?}"),
        }
        tokio::time::sleep(PING_EVERY).await;
    }
    Ok(answered)
}

/// A TLS handshake that never finishes: a handshake record header announcing 512 bytes of
/// ClientHello, and nothing after it.
fn half_open_tls(port: u16) -> anyhow::Result<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00])?;
    Ok(s)
}

/// A finished TLS handshake (trusting `ca_file`) that never sends a request.
fn mute_tls(port: u16, ca_file: &Path) -> anyhow::Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(ca_file).context("reading the webhook CA")?)?;
    let config = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    let conn = rustls::ClientConnection::new(Arc::new(config), "127.0.0.1".try_into()?)?;
    let mut tls = rustls::StreamOwned::new(conn, TcpStream::connect(("127.0.0.1", port))?);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock).context("TLS handshake with the webhook")?;
    }
    Ok(tls)
}

/// A socket the test floods with.
trait FloodSocket: Read {
    fn set_timeout(&self, t: Option<Duration>) -> std::io::Result<()>;
    fn set_nonblocking(&self, on: bool) -> std::io::Result<()>;
}

impl FloodSocket for TcpStream {
    fn set_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        self.set_read_timeout(t)
    }
    fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        TcpStream::set_nonblocking(self, on)
    }
}

impl FloodSocket for UnixStream {
    fn set_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        self.set_read_timeout(t)
    }
    fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        UnixStream::set_nonblocking(self, on)
    }
}

/// Whether the server has closed `s` (end of stream or reset) — without waiting.
fn closed_now(s: &mut impl FloodSocket) -> anyhow::Result<bool> {
    s.set_nonblocking(true)?;
    let mut buf = [0u8; 1024];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => continue, // a TLS alert before the close
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
            Err(_) => break true,
        }
    };
    s.set_nonblocking(false)?;
    Ok(closed)
}

/// Waits until the server has closed every socket of `socks` (at most `within`).
fn wait_all_closed(what: &str, socks: &mut [impl FloodSocket], within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 1024];
    for (i, s) in socks.iter_mut().enumerate() {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            ensure!(!left.is_zero(), "{what}: connection {i} still open after {within:?}");
            s.set_timeout(Some(left))?;
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    bail!("{what}: connection {i} still open after {within:?}")
                }
                Err(_) => break,
            }
        }
    }
    Ok(())
}

/// `name{labels}` from a scrape of `port`, as an integer.
fn metric(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> i64 {
    scrape.value(name, labels) as i64
}

/// The listener series of `listener` in `scrape`: (open, refused, handshake, first-byte, idle).
fn listener_counts(scrape: &Scrape, listener: &str) -> (i64, i64, i64, i64, i64) {
    let l = [("listener", listener)];
    let evicted = |reason| {
        metric(scrape, "aether_listener_connections_evicted_total", &[("listener", listener), ("reason", reason)])
    };
    (
        metric(scrape, "aether_listener_connections", &l),
        metric(scrape, "aether_listener_connections_refused_total", &l),
        evicted("handshake-timeout"),
        evicted("first-byte-timeout"),
        evicted("idle-timeout"),
    )
}

fn the_processes_run_under_the_lowered_open_files_limit(env: &Env) -> anyhow::Result<()> {
    let c = env.controller.lock().unwrap();
    let a = env.agent.lock().unwrap();
    ensure!(c.nofile()? == CONTROLLER_NOFILE, "controller's limit is {}", c.nofile()?);
    ensure!(a.nofile()? == AGENT_NOFILE, "agent's limit is {}", a.nofile()?);
    // Twice the caps would not fit: the flood below could exhaust an uncapped process; the caps
    // fit, with room for the connections being accepted and closed over the cap.
    let (c_fds, a_fds) = (c.open_fds(), a.open_fds());
    eprintln!("open descriptors at rest: controller {c_fds}, agent {a_fds}");
    let (c_caps, a_caps) = (WEBHOOK_CAP + CONTROLLER_ADMIN_CAP + PROBE_CAP, AGENT_ADMIN_CAP + XDS_CAP + PROBE_CAP);
    ensure!(c_fds + 2 * c_caps > CONTROLLER_NOFILE, "controller at rest: {c_fds}");
    ensure!(c_fds + c_caps + 8 < CONTROLLER_NOFILE, "controller at rest: {c_fds}");
    ensure!(a_fds + 2 * a_caps > AGENT_NOFILE, "agent at rest: {a_fds}");
    ensure!(a_fds + a_caps + 8 < AGENT_NOFILE, "agent at rest: {a_fds}");
    Ok(())
}

fn webhook_flood_is_refused_over_the_cap_and_evicted_then_a_review_is_admitted(env: &Env) -> anyhow::Result<()> {
    let port = env.webhook_port;
    let before = Scrape::get(env.controller_admin)?;
    let allowed_before = metric(&before, "aether_admission_requests_total", &[("result", "allowed")]);
    ensure!(
        listener_counts(&before, "webhook") == (0, 0, 0, 0, 0),
        "not fresh: {:?}",
        listener_counts(&before, "webhook")
    );

    // The cap's worth: half silent TCP, a quarter half-open handshakes, a quarter finished
    // handshakes without a request.
    wait_quiet(port)?;
    let mut silent = silent_tcp(port, WEBHOOK_CAP / 2)?;
    let mut half: Vec<TcpStream> = (0..WEBHOOK_CAP / 4).map(|_| half_open_tls(port)).collect::<Result<_, _>>()?;
    let mut mute: Vec<_> = (0..WEBHOOK_CAP / 4).map(|_| mute_tls(port, &env.ca_file)).collect::<Result<_, _>>()?;
    eventually("the webhook holding its cap", WAIT, || {
        Ok(listener_counts(&Scrape::get(env.controller_admin)?, "webhook").0 == WEBHOOK_CAP as i64)
    })?;
    // As many again, over the cap: each closed by the server.
    let mut over = silent_tcp(port, WEBHOOK_CAP)?;
    wait_all_closed("webhook connections over the cap", &mut over, WAIT)?;
    let during = Scrape::get(env.controller_admin)?;
    let (open, refused, ..) = listener_counts(&during, "webhook");
    ensure!(
        (open, refused) == (WEBHOOK_CAP as i64, WEBHOOK_CAP as i64),
        "while flooded: {open} open (want the cap, {WEBHOOK_CAP}; fewer means the flood took longer than the \
         {CONTROLLER_TIMEOUT_SECS} s timeout), {refused} refused"
    );
    let mut mute_socks: Vec<TcpStream> = mute.iter_mut().map(|t| t.sock.try_clone()).collect::<Result<_, _>>()?;
    wait_all_closed("silent webhook connections", &mut silent, WAIT)?;
    wait_all_closed("half-open TLS handshakes", &mut half, WAIT)?;
    wait_all_closed("finished handshakes without a request", &mut mute_socks, WAIT)?;
    drop(mute);

    // A valid policy goes through kube-apiserver → our webhook (failurePolicy Fail).
    let manifest = policy(NS, "after-flood").target("web").socket("s/app.sock").manifest();
    eventually("a valid EndpointPolicy admitted after the flood", WAIT, || {
        let f = env.path("after-flood.yaml");
        std::fs::write(&f, &manifest)?;
        let out = env.cp.kubectl(&["apply".as_ref(), "-f".as_ref(), f.as_os_str()])?;
        ensure!(out.status.success(), "kubectl apply: {}", String::from_utf8_lossy(&out.stderr));
        Ok(true)
    })?;
    let after = Scrape::get(env.controller_admin)?;
    ensure!(
        metric(&after, "aether_admission_requests_total", &[("result", "allowed")]) > allowed_before,
        "the review did not reach our webhook"
    );
    let want = (WEBHOOK_CAP / 2 + WEBHOOK_CAP / 4, WEBHOOK_CAP / 4);
    let (_, refused, handshake, first_byte, idle) = listener_counts(&after, "webhook");
    ensure!(
        (refused, handshake, first_byte, idle) == (WEBHOOK_CAP as i64, want.0 as i64, want.1 as i64, 0),
        "webhook: refused {refused} (want {WEBHOOK_CAP}), handshake-timeout {handshake} (want {}), \
         first-byte-timeout {first_byte} (want {}), idle-timeout {idle} (want 0)",
        want.0,
        want.1
    );
    let mut c = env.controller.lock().unwrap();
    c.alive()?;
    c.no_emfile()
}

fn controller_admin_flood_is_evicted_then_metrics_scrape(env: &Env) -> anyhow::Result<()> {
    wait_quiet(env.controller_admin)?;
    let mut flood = silent_tcp(env.controller_admin, 2 * CONTROLLER_ADMIN_CAP)?;
    // The kubelet's exec probes ask over the probe socket, not the full admin port.
    eventually("the flood holding the controller's admin cap", WAIT, || {
        Ok(server_connections(env.controller_admin)? >= CONTROLLER_ADMIN_CAP)
    })?;
    for path in ["/healthz", "/readyz"] {
        exec_probe("aether-controller", &env.path("run/controller-probe.sock"), path)?;
    }
    wait_all_closed("controller admin flood", &mut flood, WAIT)?;
    let scrape = Scrape::get(env.controller_admin)?;
    let (open, refused, _, first_byte, idle) = listener_counts(&scrape, "admin");
    ensure!(
        (open, refused, first_byte, idle) == (1, CONTROLLER_ADMIN_CAP as i64, CONTROLLER_ADMIN_CAP as i64, 0),
        "controller admin: {open} open (want 1: this scrape), {refused} refused and {first_byte} evicted \
         (want {CONTROLLER_ADMIN_CAP} each), {idle} idle"
    );
    ensure!(http_get_status(env.controller_admin, "/readyz") == Some(200), "/readyz after the flood");
    let mut c = env.controller.lock().unwrap();
    c.alive()?;
    c.no_emfile()
}

fn envoy_gets_its_clusters_over_xds_while_the_agent_admin_port_is_flooded(env: &Env) -> anyhow::Result<()> {
    let app = format!("app_{NS}_web_8080");
    // The xDS socket: twice its cap of silent connections, all closed (half refused, half
    // evicted by the first-byte timeout).
    let mut xds_flood: Vec<UnixStream> =
        (0..2 * XDS_CAP).map(|_| UnixStream::connect(env.xds_socket())).collect::<Result<_, _>>()?;
    wait_all_closed("xDS flood", &mut xds_flood, WAIT)?;

    // The admin port: twice its cap, from two sources (each holds its share, the cap between
    // them; the rest is refused as over its source's share), held while Envoy starts.
    ensure!(FLOOD_SOURCES.len() * AGENT_ADMIN_SHARE == AGENT_ADMIN_CAP, "the sources' shares make the cap");
    wait_quiet(env.agent_admin)?;
    let mut admin_flood = silent_tcp_from_sources(env.agent_admin, 2 * AGENT_ADMIN_SHARE)?;
    let dir = env.path("envoy");
    let envoy = Envoy::builder(env.xds_socket(), NODE, &dir).binary(envoy_bin()?).start()?;
    *env.envoy.lock().unwrap() = Some(envoy);
    eventually(&format!("Envoy holding cluster {app} from xDS"), AGENT_ADMIN_WAIT, || {
        let guard = env.envoy.lock().unwrap();
        Ok(guard.as_ref().context("envoy")?.clusters()?.contains_key(&app))
    })?;
    // Still flooded: the admitted half is held (not yet evicted), the other half was closed.
    let mut open = 0;
    for s in &mut admin_flood {
        if !closed_now(s)? {
            open += 1;
        }
    }
    ensure!(
        open == AGENT_ADMIN_CAP,
        "{open} admin flood connections open while Envoy got its clusters (want the cap, {AGENT_ADMIN_CAP})"
    );
    // No connection to the admin port is possible now, yet the kubelet's exec probes are
    // answered: they ask over the probe socket.
    let probe_socket = env.path("run/agent-probe.sock");
    exec_probe("aether-agent", &probe_socket, "/healthz")?;
    eventually("the agent's /readyz over its probe socket", AGENT_ADMIN_WAIT, || {
        Ok(exec_probe("aether-agent", &probe_socket, "/readyz").is_ok())
    })?;

    wait_all_closed("agent admin flood", &mut admin_flood, Duration::from_secs(AGENT_ADMIN_FIRST_BYTE_SECS) + WAIT)?;
    let scrape = Scrape::get(env.agent_admin)?;
    let admin = listener_counts(&scrape, "admin");
    let a = AGENT_ADMIN_CAP as i64;
    ensure!(admin == (1, a, 0, a, 0), "agent admin (open, refused, handshake, first-byte, idle): {admin:?}");
    let over_share = metric(&scrape, "aether_listener_connections_over_source_share_total", &[("listener", "admin")]);
    ensure!(over_share == a, "agent admin: {over_share} refused over their source's share (want all {a} refused)");
    let probe = listener_counts(&scrape, "probe");
    ensure!(probe.1 == 0 && probe.3 == 0, "the probe socket refused or evicted a probe: {probe:?}");
    let xds = listener_counts(&scrape, "xds");
    let x = XDS_CAP as i64;
    ensure!(xds == (1, x, 0, x, 0), "xDS (open: Envoy's, refused, handshake, first-byte, idle): {xds:?}");
    ensure!(metric(&scrape, "aether_xds_connected_streams", &[]) == 1, "Envoy's ADS stream");
    let mut agent = env.agent.lock().unwrap();
    agent.alive()?;
    agent.no_emfile()
}

/// Runs `<binary> probe --socket <socket> --path <path>` as the kubelet's exec probe does: Ok
/// with its stdout on exit 0, else an error with its exit status and output.
fn exec_probe(binary: &str, socket: &Path, path: &str) -> anyhow::Result<String> {
    let out = Command::new(workspace_bin(binary)?)
        .args(["probe", "--path", path, "--socket"])
        .arg(socket)
        .stdin(Stdio::null())
        .output()?;
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "{binary} probe --path {path}: {}: {stdout}{stderr}", out.status);
    Ok(stdout.into_owned())
}

/// HTTP/2 clients from one source that open no stream and PING every half second hold that
/// source's share of the agent's admin port, no more: one more connection from it is refused
/// (counted as over its share) while a client from another source is served `/healthz`; the
/// PINGs, answered throughout, do not keep the connections open past the idle timeout (no
/// request in flight), and they are evicted and counted as idle.
fn a_source_pinging_with_its_share_of_the_admin_port_is_refused_more_and_evicted_while_another_is_served(
    env: &Env,
) -> anyhow::Result<()> {
    let port = env.agent_admin;
    wait_quiet(port)?;
    let before = Scrape::get(port)?;
    let counts = |s: &Scrape| {
        let l = [("listener", "admin")];
        (
            metric(s, "aether_listener_connections_over_source_share_total", &l),
            metric(
                s,
                "aether_listener_connections_evicted_total",
                &[("listener", "admin"), ("reason", "idle-timeout")],
            ),
        )
    };
    wait_quiet(port)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let source = FLOOD_SOURCES[1];
    let (held_tx, mut held_rx) = tokio::sync::mpsc::channel(AGENT_ADMIN_SHARE);
    let pingers: Vec<_> =
        (0..AGENT_ADMIN_SHARE).map(|_| rt.spawn(ping_until_closed(source, port, held_tx.clone()))).collect();
    rt.block_on(async {
        for _ in 0..AGENT_ADMIN_SHARE {
            tokio::time::timeout(WAIT, held_rx.recv()).await.context("a PING client's connection")?;
        }
        anyhow::Ok(())
    })?;
    // Its share held: one more from that source is closed at once, before its first-byte timeout.
    let mut over = connect_from(source, port)?;
    wait_all_closed("a connection over its source's share", std::slice::from_mut(&mut over), WAIT)?;
    // The scrapes and /healthz come from FLOOD_SOURCES[0], another source.
    let mid = Scrape::get(port)?;
    ensure!(
        counts(&mid).0 == counts(&before).0 + 1,
        "over-share refusals {} -> {} (want one more)",
        counts(&before).0,
        counts(&mid).0
    );
    let healthz = http_get_status(port, "/healthz");
    ensure!(healthz == Some(200), "/healthz from 127.0.0.1 while {source} holds its share: {healthz:?}");
    let idle = Duration::from_secs(AGENT_ADMIN_IDLE_SECS);
    let answered: Vec<u32> = rt.block_on(async {
        let mut out = Vec::new();
        for p in pingers {
            out.push(tokio::time::timeout(idle + WAIT, p).await.context("a PING client still open")???);
        }
        anyhow::Ok(out)
    })?;
    let after = Scrape::get(port)?;
    eprintln!("PING clients: PINGs answered before the idle eviction {answered:?}");
    ensure!(answered.iter().all(|n| *n >= 2), "every PING client pinged while its connection was held: {answered:?}");
    ensure!(
        counts(&after).1 == counts(&before).1 + AGENT_ADMIN_SHARE as i64,
        "idle evictions {} -> {} (want {AGENT_ADMIN_SHARE} more: the PING clients)",
        counts(&before).1,
        counts(&after).1
    );
    let mut agent = env.agent.lock().unwrap();
    agent.alive()?;
    agent.no_emfile()
}

/// Envoy's `readiness` listener (the chart's bootstrap, LIVE here): twice its cap of silent
/// connections; the cap's worth is held, the rest is closed at once and counted by its
/// `connection_limit` filter, and `/ready` answers 200 again once the flood ends.
fn envoys_readiness_listener_holds_its_cap_and_closes_the_rest(env: &Env) -> anyhow::Result<()> {
    let cap = aether_fixtures::envoy::READINESS_MAX_CONNECTIONS;
    let (port, stat) = {
        let guard = env.envoy.lock().unwrap();
        let envoy = guard.as_ref().context("Envoy (started by the previous trial)")?;
        let port = envoy.listener_port("readiness")?;
        (port, move |name: &str| -> anyhow::Result<u64> {
            let guard = env.envoy.lock().unwrap();
            guard.as_ref().context("envoy")?.stat(name)
        })
    };
    ensure!(http_get_status(port, "/ready") == Some(200), "/ready before the flood");
    wait_quiet(port)?;
    let limited_before = stat("connection_limit.readiness.limited_connections")?;
    let mut flood = silent_tcp(port, 2 * cap)?;
    eventually("the connections over the readiness cap counted", WAIT, || {
        Ok(stat("connection_limit.readiness.limited_connections")? == limited_before + cap as u64)
    })?;
    let mut open = 0;
    for s in &mut flood {
        if !closed_now(s)? {
            open += 1;
        }
    }
    ensure!(open == cap, "{open} readiness flood connections open (want the cap, {cap})");
    ensure!(stat("connection_limit.readiness.active_connections")? == cap as u64, "active connections at the cap");
    drop(flood);
    eventually("/ready answering 200 after the flood", WAIT, || Ok(http_get_status(port, "/ready") == Some(200)))
}

/// The chart's `agent.maxClusters` (values.yaml): the most clusters the node Envoy holds.
fn chart_max_clusters() -> anyhow::Result<usize> {
    let values: serde_json::Value =
        yaml_serde::from_str(&std::fs::read_to_string(aether_tests::repo_root().join("charts/aether/values.yaml"))?)?;
    let n = values["agent"]["maxClusters"].as_u64().context("agent.maxClusters in the chart's values")?;
    Ok(usize::try_from(n)?)
}

/// A static cluster named `name` to a closed loopback port: its stats are what a pod's are.
fn idle_cluster(name: &str) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{ "lb_endpoints": [{ "endpoint": {
                "address": { "socket_address": { "address": "127.0.0.1", "port_value": 9 } }
            }}]}]
        }
    })
}

/// How long the stats flood lasts, and how often the admin is probed meanwhile.
const STATS_FLOOD: Duration = Duration::from_secs(20);
const ADMIN_PROBE_EVERY: Duration = Duration::from_millis(250);

/// Envoy's `stats` listener (the chart's bootstrap: HTTP/1.1 only, `local_ratelimit`, one admin
/// scrape at a time) on an Envoy holding the chart's `agent.maxClusters` clusters: as many
/// keep-alive clients as the listener's connection cap scrape back to back for
/// [`STATS_FLOOD`] while the admin is asked `/ready` every [`ADMIN_PROBE_EVERY`]. Every probe is
/// answered 200 (within the fixture's 10 s request timeout); the scrapes that reached the admin
/// are at most the bucket plus one per refill over the flood; each refusal the clients saw is
/// counted by Envoy (429: `rate_limited`; 503: the admin cluster's `upstream_rq_pending_overflow`)
/// and no request failed otherwise; an HTTP/2 client is refused; once the bucket refilled a
/// scrape is served again.
fn envoys_stats_listener_limits_a_scrape_flood_and_the_admin_answers_throughout(env: &Env) -> anyhow::Result<()> {
    use aether_fixtures::envoy::{CHART_STATS_SCRAPES_PER_MINUTE, STATS_BURST};
    let clusters = chart_max_clusters()?;
    let mut builder = Envoy::builder(env.xds_socket(), NODE, env.path("envoy-stats"))
        .binary(envoy_bin()?)
        .log_level("warning")
        .stats_listener()?;
    for i in 0..clusters {
        builder = builder.cluster(idle_cluster(&format!("flood_{i}")));
    }
    let mut envoy = builder.start()?;
    envoy.wait_ready()?;
    let port = envoy.listener_port("stats")?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Its connection is closed with the client (it would hold one of the flood's places).
    let (code, body) = {
        let first = reqwest::blocking::Client::builder().timeout(Duration::from_secs(30)).build()?;
        let resp = first.get(format!("http://127.0.0.1:{port}/stats/prometheus")).send()?;
        (resp.status().as_u16(), resp.text()?)
    };
    ensure!(
        code == 200 && body.contains("envoy_cluster_upstream_cx_total{envoy_cluster_name=\"flood_0\"}"),
        "a scrape before the flood: {code}"
    );
    println!("one scrape of {clusters} clusters: {} bytes", body.len());
    // The default filter serves the refusals of this listener and of the overload manager (per
    // listener with a stat prefix: here the admin's; on a node each pod's inbound listener).
    for series in [
        "envoy_http_local_rate_limit_rate_limited{envoy_local_http_ratelimit_prefix=\"stats\"}",
        "envoy_listener_admin_downstream_global_cx_overflow",
        "envoy_listener_admin_downstream_cx_overload_reject",
    ] {
        ensure!(body.contains(series), "a scrape lacks {series}");
    }
    // HTTP/1.1 only: an HTTP/2 client (prior knowledge, as over h2c) gets no scrape.
    let h2 = reqwest::blocking::Client::builder().http2_prior_knowledge().timeout(WAIT).build()?;
    let refused = h2.get(format!("http://127.0.0.1:{port}/stats/prometheus")).send();
    ensure!(!refused.as_ref().is_ok_and(|r| r.status() == 200), "HTTP/2 got a scrape: {refused:?}");

    let stat = |name: &str| envoy.stat(name);
    let limited = "stats.http_local_rate_limit.rate_limited";
    let (admin_before, limited_before, overflow_before) = (
        stat("cluster.envoy_admin.upstream_rq_total")?,
        stat(limited)?,
        stat("cluster.envoy_admin.upstream_rq_pending_overflow")?,
    );
    let started = Instant::now();
    let (tally, probes) = aether_tests::scrape_flood::flood(
        "127.0.0.1",
        port,
        aether_fixtures::envoy::STATS_MAX_CONNECTIONS,
        STATS_FLOOD,
        ADMIN_PROBE_EVERY,
        || {
            let asked = Instant::now();
            envoy.admin_get("/ready").map(|(code, _)| (code, asked.elapsed()))
        },
    )?;
    let elapsed = started.elapsed();
    let reached = stat("cluster.envoy_admin.upstream_rq_total")? - admin_before;
    let (limited, overflowed) =
        (stat(limited)? - limited_before, stat("cluster.envoy_admin.upstream_rq_pending_overflow")? - overflow_before);
    println!(
        "{:.1} s of flood: {} requests; {} served, {} rate-limited (Envoy: {limited}), {} overflowed (Envoy: \
         {overflowed}), {} other {:?}; {reached} reached the admin; {} admin probes",
        elapsed.as_secs_f64(),
        tally.total(),
        tally.served,
        tally.rate_limited,
        tally.overflowed,
        tally.other,
        tally.other_examples,
        probes.len()
    );
    let slowest = probes.iter().filter_map(|p| p.as_ref().ok()).map(|(_, took)| *took).max();
    println!("the slowest admin /ready meanwhile: {slowest:?} (make bench reports the figures)");
    let failed: Vec<_> = probes.iter().filter(|p| !matches!(p, Ok((200, _)))).collect();
    ensure!(
        failed.is_empty(),
        "admin /ready during the flood: {} of {} not 200: {failed:?}",
        failed.len(),
        probes.len()
    );
    ensure!(tally.other == 0, "requests that failed otherwise: {:?}", tally.other_examples);
    ensure!(
        tally.rate_limited > 0 && tally.rate_limited == limited,
        "429s seen {} vs counted {limited}",
        tally.rate_limited
    );
    ensure!(tally.overflowed == overflowed, "503s seen {} vs counted {overflowed}", tally.overflowed);
    let fill_ms = 60_000 / u64::from(CHART_STATS_SCRAPES_PER_MINUTE);
    let bound = u64::from(STATS_BURST) + elapsed.as_millis() as u64 / fill_ms + 1;
    ensure!(reached <= bound, "{reached} scrapes reached the admin in {elapsed:?} (the bucket allows {bound})");
    ensure!(tally.served <= reached, "{} scrapes served, {reached} reached the admin", tally.served);
    ensure!(envoy.try_wait()?.is_none(), "Envoy exited during the flood:\n{}", envoy.log_tail());
    eventually("a scrape served again after the flood", WAIT, || {
        let resp = reqwest::blocking::get(format!("http://127.0.0.1:{port}/stats/prometheus"))?;
        Ok(resp.status() == 200)
    })
}

/// Raises this process's open-files limit to `want`, or as far as the machine lets it (root
/// without `CAP_SYS_RESOURCE`, as in a container, cannot pass the hard limit), and returns the
/// limit it has: Envoys started after it inherit it.
fn raise_nofile(want: usize) -> anyhow::Result<usize> {
    let pid = std::process::id().to_string();
    let hard = || -> anyhow::Result<usize> {
        let out =
            Command::new("prlimit").args(["--pid", &pid, "--nofile", "--output=HARD", "--noheadings"]).output()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().context("prlimit --output=HARD")
    };
    let raised = Command::new("prlimit").args(["--pid", &pid, &format!("--nofile={want}:{want}")]).output()?;
    let n = if raised.status.success() { want } else { hard()? };
    if !raised.status.success() {
        let soft = Command::new("prlimit").args(["--pid", &pid, &format!("--nofile={n}:{n}")]).output()?;
        ensure!(soft.status.success(), "prlimit --nofile={n}: {}", String::from_utf8_lossy(&soft.stderr));
    }
    Ok(n)
}

/// The sum of one listener counter over every listener (`listener.<address>.<name>`).
fn listeners_sum(envoy: &Envoy, name: &str) -> anyhow::Result<u64> {
    let (_, text) = envoy.admin_get(&format!("/stats?filter=^listener\\..*\\.{name}$"))?;
    Ok(text.lines().filter_map(|l| l.rsplit_once(": ")?.1.trim().parse::<u64>().ok()).sum())
}

/// Connections over the overload manager's cap in [`envoys_overload_manager_caps_connections_and_sheds_on_heap`].
const OVER_THE_CAP: usize = 500;

/// Descriptors a process keeps besides the flood's sockets (its own files, Envoy's listeners and
/// upstream connections, the test's clients).
const NOFILE_RESERVE: usize = 1024;

/// Envoy's overload manager (the chart's bootstrap and defaults): the chart's
/// `proxy.overload.maxConnections` (20,000) idle connections plus [`OVER_THE_CAP`] to an inbound
/// listener, or on a machine whose open-files hard limit cannot hold that many (20,000 in these
/// containers), a cap lowered to fit it: the cap's worth is held, the rest is closed at once and counted
/// (`downstream_global_cx_overflow`); a keep-alive connection to the pod made before the flood is
/// still served; the readiness listener, outside the global cap, still answers; Envoy is alive.
/// Then an Envoy whose heap limit is below the heap it starts with: its heap monitor's pressure is
/// over 1, `reject_incoming_connections` is active, a new connection is refused and counted
/// (`downstream_cx_overload_reject`), and Envoy is alive.
fn envoys_overload_manager_caps_connections_and_sheds_on_heap(env: &Env) -> anyhow::Result<()> {
    use aether_fixtures::envoy::{CHART_OVERLOAD_MAX_CONNECTIONS, ROUTE_HEADER};
    let chart_cap = CHART_OVERLOAD_MAX_CONNECTIONS as usize;
    let nofile = raise_nofile(chart_cap + OVER_THE_CAP + NOFILE_RESERVE)?;
    let cap = chart_cap.min(nofile - OVER_THE_CAP - NOFILE_RESERVE);
    if cap < chart_cap {
        println!("open-files limit {nofile}: the global cap lowered from the chart's {chart_cap} to {cap}");
    }
    let app = format!("app_{NS}_web_8080");
    let mut envoy = Envoy::builder(env.xds_socket(), NODE, env.path("envoy-overload"))
        .binary(envoy_bin()?)
        .inbound()
        .max_connections(u32::try_from(cap)?)
        .start()?;
    envoy.wait_ready()?;
    eventually(&format!("Envoy holding cluster {app}"), WAIT, || Ok(envoy.clusters()?.contains_key(&app)))?;
    let port = envoy.inbound_port()?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kept = reqwest::blocking::Client::builder().pool_max_idle_per_host(1).timeout(WAIT).build()?;
    let hello = || -> anyhow::Result<(u16, String)> {
        let resp = kept.get(format!("http://127.0.0.1:{port}/hello")).header(ROUTE_HEADER, &app).send()?;
        Ok((resp.status().as_u16(), resp.text()?))
    };
    let (code, body) = hello()?;
    ensure!(code == 200, "the pod through the inbound listener before the flood: {code} {body}");
    let overflow_before = listeners_sum(&envoy, "downstream_global_cx_overflow")?;

    let started = Instant::now();
    // One at a time, so that the cap's worth is exactly the first `cap - 1` (the kept one holds a
    // place) and the rest are over it.
    let mut flood = silent_tcp(port, cap + OVER_THE_CAP)?;
    eventually("the connections over the global cap counted", WAIT, || {
        Ok(listeners_sum(&envoy, "downstream_global_cx_overflow")? > overflow_before + OVER_THE_CAP as u64)
    })?;
    let mut open = 0;
    for s in &mut flood {
        if !closed_now(s)? {
            open += 1;
        }
    }
    let overflow = listeners_sum(&envoy, "downstream_global_cx_overflow")? - overflow_before;
    let memory = envoy.admin_json("/memory")?;
    println!(
        "{} connections in {:.1} s: {open} held, {overflow} closed over the cap of {cap}; Envoy's heap {} MiB",
        flood.len(),
        started.elapsed().as_secs_f64(),
        memory["allocated"].as_str().and_then(|a| a.parse::<u64>().ok()).unwrap_or(0) >> 20
    );
    ensure!(open == cap - 1, "{open} flood connections held (want the cap {cap} less the kept one)");
    ensure!(overflow == (OVER_THE_CAP + 1) as u64, "{overflow} connections counted over the cap");
    let (code, body) = hello()?;
    ensure!(code == 200 && body.contains("web"), "the kept connection during the flood: {code} {body}");
    let readiness = envoy.listener_port("readiness")?;
    ensure!(http_get_status(readiness, "/ready") == Some(200), "the readiness listener during the flood");
    ensure!(envoy.try_wait()?.is_none(), "Envoy exited under the flood:\n{}", envoy.log_tail());
    drop(flood);
    drop(envoy);

    // Heap: a limit below what Envoy starts with.
    let mut envoy = Envoy::builder(env.xds_socket(), NODE, env.path("envoy-heap"))
        .binary(envoy_bin()?)
        .inbound()
        .max_heap_bytes(1 << 20)
        .start()?;
    envoy.wait_ready()?;
    let port = envoy.inbound_port()?;
    eventually("the heap monitor's actions active", WAIT, || {
        Ok(envoy.stat("overload.envoy.overload_actions.reject_incoming_connections.active")? == 1
            && envoy.stat("overload.envoy.overload_actions.stop_accepting_requests.active")? == 1)
    })?;
    let pressure = envoy.admin_get("/stats?filter=^overload\\.envoy\\.resource_monitors\\.fixed_heap\\.pressure$")?.1;
    println!("heap monitor: {}", pressure.trim());
    let rejected_before = listeners_sum(&envoy, "downstream_cx_overload_reject")?;
    let mut refused = silent_tcp(port, 1)?;
    eventually("a new connection refused under heap pressure and counted", WAIT, || {
        Ok(listeners_sum(&envoy, "downstream_cx_overload_reject")? > rejected_before && closed_now(&mut refused[0])?)
    })?;
    ensure!(envoy.try_wait()?.is_none(), "Envoy exited under heap pressure:\n{}", envoy.log_tail());
    Ok(())
}

fn main() {
    suite::run(
        suite::cases![
            the_processes_run_under_the_lowered_open_files_limit,
            webhook_flood_is_refused_over_the_cap_and_evicted_then_a_review_is_admitted,
            controller_admin_flood_is_evicted_then_metrics_scrape,
            envoy_gets_its_clusters_over_xds_while_the_agent_admin_port_is_flooded,
            a_source_pinging_with_its_share_of_the_admin_port_is_refused_more_and_evicted_while_another_is_served,
            envoys_readiness_listener_holds_its_cap_and_closes_the_rest,
            envoys_stats_listener_limits_a_scrape_flood_and_the_admin_answers_throughout,
            envoys_overload_manager_caps_connections_and_sheds_on_heap,
        ],
        setup,
        |env| {
            format!(
                "\n--- controller log ---\n{}\n--- agent log ---\n{}",
                tail(&env.controller.lock().unwrap().log()),
                tail(&env.agent.lock().unwrap().log())
            )
        },
    )
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn setup() -> anyhow::Result<Env> {
    let started = Instant::now();
    let cp = ControlPlane::start()?;
    cp.install_crd()?;
    cp.kubectl_ok(&["create", "namespace", NS])?;
    cp.kubectl_ok(&["create", "serviceaccount", "-n", NS, "web"])?;
    // Short: <work>/pods/<uid>/volumes/kubernetes.io~empty-dir/s/app.sock must fit sun_path (107 bytes).
    let work = tempfile::Builder::new().prefix("af-").tempdir()?;
    std::fs::create_dir_all(work.path().join("run"))?;

    // The controller: certificates for 127.0.0.1, small caps and timeouts, 128 open files.
    let certs = work.path().join("certs");
    let bundle = aether_webhook_certs::mint(&["127.0.0.1".into(), "localhost".into()])?;
    aether_webhook_certs::write_dir(&bundle, &certs)?;
    let (webhook_port, controller_admin) = (free_port(), free_port());
    let kubeconfig = cp.kubeconfig();
    let controller_args: Vec<String> = vec![
        "run".into(),
        "--webhook-addr".into(),
        format!("127.0.0.1:{webhook_port}"),
        "--admin-addr".into(),
        format!("127.0.0.1:{controller_admin}"),
        "--tls-dir".into(),
        certs.to_string_lossy().into_owned(),
        "--kubeconfig".into(),
        kubeconfig.to_string_lossy().into_owned(),
        "--lease-namespace".into(),
        "default".into(),
        "--webhook-max-connections".into(),
        WEBHOOK_CAP.to_string(),
        "--webhook-handshake-timeout-seconds".into(),
        CONTROLLER_TIMEOUT_SECS.to_string(),
        "--admin-max-connections".into(),
        CONTROLLER_ADMIN_CAP.to_string(),
        "--admin-first-byte-timeout-seconds".into(),
        CONTROLLER_TIMEOUT_SECS.to_string(),
        "--probe-socket".into(),
        work.path().join("run/controller-probe.sock").to_string_lossy().into_owned(),
    ];
    let mut controller = Limited::spawn(
        "aether-controller",
        &workspace_bin("aether-controller")?,
        CONTROLLER_NOFILE,
        &controller_args,
        &[],
        &work.path().join("controller.log"),
    )?;
    controller.wait_ready(controller_admin)?;
    let ca_file = certs.join(aether_webhook_certs::CA_FILE);
    cp.register_webhook(&format!("https://127.0.0.1:{webhook_port}/validate"), &ca_file)?;

    // A pod on the node served over its socket: the cluster Envoy must get over xDS.
    let p = pod(NS, "web").sa("web").node(NODE).container("app", "registry.example/uds-echo:test").emptydir("s");
    cp.apply(&p.annotation_socket("s/app.sock").manifest())?;
    let uid = cp.kubectl_ok(&["get", "pod", "-n", NS, "web", "-o", "jsonpath={.metadata.uid}"])?;
    let vol = work.path().join("pods").join(&uid).join("volumes/kubernetes.io~empty-dir/s");
    std::fs::create_dir_all(&vol)?;
    let echo = Command::new(workspace_bin("uds-echo")?)
        .arg("--socket")
        .arg(vol.join("app.sock"))
        .arg("--name")
        .arg("web")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let echo = Mutex::new(Some(echo));
    eventually("the echo socket", WAIT, || Ok(vol.join("app.sock").exists()))?;

    // The agent: small caps and timeouts, 48 open files.
    let agent_admin = free_port();
    let path = |p: &str| work.path().join(p).to_string_lossy().into_owned();
    let agent_args: Vec<String> = vec![
        "run".into(),
        "--node-name".into(),
        NODE.to_string(),
        "--kubelet-pods-dir".into(),
        path("pods"),
        "--state-dir".into(),
        path("state"),
        "--xds-address".into(),
        format!("unix://{}", path("run/xds.sock")),
        "--health-socket".into(),
        path("run/health.sock"),
        "--cri-endpoint=".into(),
        "--admin-addr".into(),
        format!("127.0.0.1:{agent_admin}"),
        "--debug-addr=127.0.0.1:0".into(),
        "--admin-max-connections".into(),
        AGENT_ADMIN_CAP.to_string(),
        "--admin-first-byte-timeout-seconds".into(),
        AGENT_ADMIN_FIRST_BYTE_SECS.to_string(),
        "--admin-idle-timeout-seconds".into(),
        AGENT_ADMIN_IDLE_SECS.to_string(),
        "--xds-max-connections".into(),
        XDS_CAP.to_string(),
        "--xds-first-byte-timeout-seconds".into(),
        XDS_FIRST_BYTE_SECS.to_string(),
        "--probe-socket".into(),
        path("run/agent-probe.sock"),
    ];
    let mut agent = Limited::spawn(
        "aether-agent",
        &workspace_bin("aether-agent")?,
        AGENT_NOFILE,
        &agent_args,
        &[("KUBECONFIG", kubeconfig.as_path())],
        &work.path().join("agent.log"),
    )?;
    agent.wait_ready(agent_admin)?;
    eprintln!("flood e2e: set up in {:.1} s", started.elapsed().as_secs_f64());
    Ok(Env {
        cp,
        work,
        controller: Mutex::new(controller),
        webhook_port,
        controller_admin,
        ca_file,
        agent: Mutex::new(agent),
        agent_admin,
        echo,
        envoy: Mutex::new(None),
    })
}
