//! Harness for tests against real components.
//!
//! - [`ControlPlane`]: etcd + kube-apiserver started by `tests/harness/controlplane.sh` (built by
//!   `tests/harness/build-tools.sh`), stopped on drop, with a `kubectl` of the same version.
//! - [`Controller`]: the real `aether-controller run` binary on loopback with freshly minted
//!   certificates, killed on drop.
//! - [`continuity`]: steady load through the data plane and what an event did to it;
//!   [`tcp_counters`]: the kernel's side of it (`nstat`); [`service_rules`]: no traffic to a
//!   ClusterIP before kube-proxy has programmed it; [`scrape_flood`]: a flood of scrapes at
//!   Envoy's stats listener.
//! - [`node::RealNode`]: a real single node (kubelet + containerd, controller-manager, scheduler,
//!   kube-proxy) from `tests/harness/node.sh`, torn down on drop.
//! - [`nodes::RealNodes`]: several real nodes (`AETHER_NODES=N node.sh up`), each in its own
//!   network, mount and UTS namespaces, torn down on drop.
//!
//! Pods, policies and Envoy come from the workspace's fixtures (`aether_fixtures`: the builders,
//! and the one Envoy launcher running the chart's bootstrap).
//!
//! The binaries under test are the workspace's own (`target/<profile>/`): build them first
//! (`make test` does).

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};

pub mod continuity;
pub mod node;
pub mod nodes;
pub mod prometheus;
pub mod scrape_flood;
pub mod service_rules;
pub mod tcp_counters;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// Where build-tools.sh put kube-apiserver, etcd, kubectl and helm (the tests run helm through
/// [`helm_bin`]).
pub fn tools_bin() -> PathBuf {
    std::env::var_os("AETHER_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache/tools"))
        .join("bin")
}

/// The helm binary the tests run: `AETHER_HELM` when it is set and not empty (a path to another
/// helm, e.g. Helm 4's `<tools>/bin/helm4` of `build-tools.sh helm4`), else build-tools.sh's
/// `<tools>/bin/helm` (its `HELM_VERSION` pin).
pub fn helm_bin() -> PathBuf {
    std::env::var_os("AETHER_HELM")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| tools_bin().join("helm"))
}

/// Path of a workspace binary next to the running test executable (`target/<profile>/NAME`).
///
/// # Errors
/// When it has not been built, with the command that builds it.
pub fn workspace_bin(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let profile_dir = exe.parent().and_then(Path::parent).context("test executable has no target/<profile> dir")?;
    let bin = profile_dir.join(name);
    if !bin.is_file() {
        bail!("{} is not built: run `cargo build --workspace` (make test does)", bin.display());
    }
    Ok(bin)
}

/// A free TCP port on 127.0.0.1 (bound and released; a tiny race is acceptable in tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("binding an ephemeral port")
}

/// A running etcd + kube-apiserver; stopped when dropped.
pub struct ControlPlane {
    dir: tempfile::TempDir,
    script: PathBuf,
}

impl ControlPlane {
    /// Starts a fresh control plane in a new temporary folder and waits until it is ready.
    ///
    /// The script picks free ports, then starts etcd and the API server on them, so another
    /// process can take a port in between ("bind: address already in use", seen in CI with
    /// tests running in parallel): that failure, and only that one, is retried with new ports,
    /// at most 3 attempts in all.
    ///
    /// # Errors
    /// When the binaries are missing or the API server does not become ready; the script's
    /// output (with the tail of the component logs) is included.
    pub fn start() -> anyhow::Result<Self> {
        let script = repo_root().join("tests/harness/controlplane.sh");
        let mut attempt = 1;
        loop {
            let dir = tempfile::Builder::new().prefix("aether-cp-").tempdir()?;
            let out = Command::new(&script).arg("start").arg(dir.path()).output()?;
            let cp = ControlPlane { dir, script: script.clone() };
            if out.status.success() {
                return Ok(cp);
            }
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            drop(cp);
            if attempt < 3 && stderr.contains("address already in use") {
                eprintln!("control plane: a port was taken before its component bound it; retrying with new ports");
                attempt += 1;
                continue;
            }
            bail!("control plane did not start (attempt {attempt}):\n{stderr}");
        }
    }

    /// The control plane shared by the tests of this test binary that call it: started by the
    /// first caller (the others wait for it), then reused by every later one, for as long as the
    /// binary runs. For tests that leave it as they found it for the others: each in its own
    /// namespace, with cluster-scoped objects of its own names; a test that stops or
    /// reconfigures the API server, or installs or deletes what others use (a CRD, a webhook
    /// configuration), starts its own with [`ControlPlane::start`].
    ///
    /// A static is never dropped, so its processes are not stopped by [`Drop`]: a watcher process
    /// (`sh`, in a process group of its own so Ctrl-C does not reach it) holds a pipe from this
    /// process and, when the pipe closes (this process exits, however: normally, on a failed
    /// test, on a signal), runs `controlplane.sh stop` and removes the state folder. The stop
    /// therefore finishes shortly after the binary exits.
    ///
    /// # Errors
    /// As [`ControlPlane::start`], or when the watcher cannot be started; a later call tries again.
    pub fn shared() -> anyhow::Result<&'static ControlPlane> {
        static SHARED: std::sync::Mutex<Option<&'static ControlPlane>> = std::sync::Mutex::new(None);
        let mut slot = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cp) = *slot {
            return Ok(cp);
        }
        let cp = ControlPlane::start()?;
        let watcher = Command::new("sh")
            .args(["-c", r#"read -r _; "$0" stop "$1" >/dev/null 2>&1; rm -rf "$1""#])
            .arg(&cp.script)
            .arg(cp.dir.path())
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the shared control plane's watcher")?;
        // Kept open (never written) until the process exits; then the watcher reads EOF.
        std::mem::forget(watcher.stdin);
        let cp: &'static ControlPlane = Box::leak(Box::new(cp));
        eprintln!("control plane: shared by this binary's tests ({})", cp.dir().display());
        *slot = Some(cp);
        Ok(cp)
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// The folder with state and logs (`apiserver.log`, `etcd.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `kubectl` with this control plane's admin kubeconfig.
    pub fn kube(&self) -> Kubectl {
        Kubectl::new(self.kubeconfig())
    }

    /// Runs `kubectl --kubeconfig <ours> ARGS`, returning its output whatever its exit code.
    ///
    /// # Errors
    /// Only when kubectl cannot be started.
    pub fn kubectl<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> anyhow::Result<Output> {
        self.kube().run(args)
    }

    /// Like [`ControlPlane::kubectl`] but fails unless kubectl exits 0; returns stdout.
    ///
    /// # Errors
    /// On a non-zero exit, with kubectl's stderr.
    pub fn kubectl_ok<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> anyhow::Result<String> {
        self.kube().ok(args)
    }

    /// Registers (or replaces) the ValidatingWebhookConfiguration pointing at `url`.
    ///
    /// # Errors
    /// When kubectl rejects it.
    pub fn register_webhook(&self, url: &str, ca_file: &Path) -> anyhow::Result<()> {
        self.script(&["register-webhook".as_ref(), self.dir().as_os_str(), url.as_ref(), ca_file.as_os_str()])
    }

    /// Deletes the ValidatingWebhookConfiguration.
    ///
    /// # Errors
    /// When kubectl fails.
    pub fn delete_webhook(&self) -> anyhow::Result<()> {
        self.script(&["delete-webhook".as_ref(), self.dir().as_os_str()])
    }

    fn script(&self, args: &[&std::ffi::OsStr]) -> anyhow::Result<()> {
        let out = Command::new(&self.script).args(args).output()?;
        if !out.status.success() {
            bail!("controlplane.sh failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = Command::new(&self.script).arg("stop").arg(self.dir.path()).output();
    }
}

/// A running `aether-controller run`; killed when dropped.
pub struct Controller {
    child: Child,
    /// `https://127.0.0.1:<port>/validate`.
    pub url: String,
    /// `http://127.0.0.1:<port>` of the admin endpoints.
    pub admin: String,
    /// The CA that signed the serving certificate (for `caBundle`).
    pub ca_file: PathBuf,
    _certs: tempfile::TempDir,
}

impl Controller {
    /// Mints certificates for 127.0.0.1, starts the controller with `extra` flags, and waits for
    /// `/readyz` (at most 30 s).
    ///
    /// # Errors
    /// When the binary is missing, exits, or never becomes ready (its log is included).
    pub fn start(extra: &[&str]) -> anyhow::Result<Self> {
        let certs = tempfile::Builder::new().prefix("aether-certs-").tempdir()?;
        let bundle = aether_webhook_certs::mint(&["127.0.0.1".into(), "localhost".into()])?;
        aether_webhook_certs::write_dir(&bundle, certs.path())?;
        let (port, admin_port) = (free_port(), free_port());
        let log = certs.path().join("controller.log");
        let child = Command::new(workspace_bin("aether-controller")?)
            .arg("run")
            .arg("--webhook-addr")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--admin-addr")
            .arg(format!("127.0.0.1:{admin_port}"))
            .arg("--tls-dir")
            .arg(certs.path())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        let mut c = Controller {
            child,
            url: format!("https://127.0.0.1:{port}/validate"),
            admin: format!("http://127.0.0.1:{admin_port}"),
            ca_file: certs.path().join(aether_webhook_certs::CA_FILE),
            _certs: certs,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if http_get_status(admin_port, "/readyz") == Some(200) {
                return Ok(c);
            }
            if let Some(status) = c.child.try_wait()? {
                bail!("aether-controller exited ({status}): {}", std::fs::read_to_string(&log).unwrap_or_default());
            }
            if Instant::now() > deadline {
                bail!("aether-controller not ready after 30 s: {}", std::fs::read_to_string(&log).unwrap_or_default());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Status code of a plain HTTP/1.1 GET on 127.0.0.1, or `None` when nothing answers.
pub fn http_get_status(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    buf.split_whitespace().nth(1)?.parse().ok()
}

impl ControlPlane {
    /// Stops only kube-apiserver (etcd keeps the state).
    ///
    /// # Errors
    /// When the script fails.
    pub fn stop_apiserver(&self) -> anyhow::Result<()> {
        self.script(&["stop-apiserver".as_ref(), self.dir().as_os_str()])
    }

    /// Starts kube-apiserver again with its original flags and waits until it is ready.
    ///
    /// # Errors
    /// When it does not become ready.
    pub fn start_apiserver(&self) -> anyhow::Result<()> {
        self.script(&["start-apiserver".as_ref(), self.dir().as_os_str()])
    }

    /// `kubectl apply -f -` of `yaml`.
    ///
    /// # Errors
    /// When kubectl fails, with its stderr.
    pub fn apply(&self, yaml: &str) -> anyhow::Result<()> {
        self.kube().apply(yaml)
    }
}

/// `kubectl` (the one build-tools.sh built) with one kubeconfig.
#[derive(Clone, Debug)]
pub struct Kubectl {
    kubeconfig: PathBuf,
}

impl Kubectl {
    /// kubectl using `kubeconfig`.
    pub fn new(kubeconfig: impl Into<PathBuf>) -> Self {
        Kubectl { kubeconfig: kubeconfig.into() }
    }

    /// The kubeconfig it uses.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Runs `kubectl --kubeconfig <it> ARGS`, returning its output whatever its exit code.
    ///
    /// # Errors
    /// Only when kubectl cannot be started.
    pub fn run<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> anyhow::Result<Output> {
        Command::new(tools_bin().join("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("running kubectl")
    }

    /// Like [`Kubectl::run`] but fails unless kubectl exits 0; returns stdout.
    ///
    /// # Errors
    /// On a non-zero exit, with kubectl's stderr.
    pub fn ok<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> anyhow::Result<String> {
        let out = self.run(args)?;
        if !out.status.success() {
            let shown: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy().into_owned()).collect();
            bail!("kubectl {} failed: {}", shown.join(" "), String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kubectl apply -f -` of `yaml`.
    ///
    /// # Errors
    /// When kubectl fails, with its stderr.
    pub fn apply(&self, yaml: &str) -> anyhow::Result<()> {
        use std::io::Write;
        let mut child = Command::new(tools_bin().join("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        child.stdin.take().context("kubectl stdin")?.write_all(yaml.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("kubectl apply failed: {}\n{yaml}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }
}

/// Where `tests/harness/install-envoy.sh` installed Envoy (or `$AETHER_ENVOY`); runs the script,
/// which installs Envoy when it is missing. Give it to the launcher
/// (`aether_fixtures::Envoy::builder(..).binary(envoy_bin()?)`) to keep that behaviour.
///
/// # Errors
/// When it is not installed and the script fails, with its output.
pub fn envoy_bin() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("AETHER_ENVOY") {
        return Ok(PathBuf::from(p));
    }
    let out = Command::new(repo_root().join("tests/harness/install-envoy.sh")).output()?;
    if !out.status.success() {
        bail!(
            "Envoy is not installed and tests/harness/install-envoy.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// A blocking HTTP/1.1 GET to 127.0.0.1:`port` (reqwest): (status, body).
///
/// # Errors
/// When nothing answers.
pub fn http_get(port: u16, path: &str, headers: &[(&str, &str)]) -> anyhow::Result<(u16, String)> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(10)).build()?;
    let mut req = client.get(format!("http://127.0.0.1:{port}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send()?;
    let status = resp.status().as_u16();
    Ok((status, resp.text()?))
}

/// `GET path` over the Unix socket `socket` (Envoy's admin, `/run/aether/envoy/admin.sock` on a
/// node): (status, body).
///
/// # Errors
/// When nothing answers on the socket within 10 s.
pub fn unix_http_get(socket: &Path, path: &str) -> anyhow::Result<(u16, String)> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(10)).unix_socket(socket).build()?;
    let resp = client
        .get(format!("http://localhost{path}"))
        .send()
        .with_context(|| format!("GET {path} on {}", socket.display()))?;
    let status = resp.status().as_u16();
    Ok((status, resp.text()?))
}

/// Status code of `GET path` sent over the Unix socket `socket` (the health gateway).
///
/// # Errors
/// When the socket does not answer.
pub fn unix_get_status(socket: &Path, path: &str) -> anyhow::Result<u16> {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("no HTTP status line")
}

/// A running `aether-agent run`; killed on drop.
pub struct Agent {
    child: Child,
    /// The admin port.
    pub admin: u16,
    /// Its log file.
    pub log: PathBuf,
}

impl Agent {
    /// Starts `aether-agent run` with `args` (plus `--admin-addr` on a free port), logging to
    /// `log`, and waits for `/readyz`.
    ///
    /// # Errors
    /// When it exits or is not ready within 30 s (its log is included).
    pub fn start(kubeconfig: &Path, args: &[&str], log: &Path) -> anyhow::Result<Self> {
        let admin = free_port();
        let child = Command::new(workspace_bin("aether-agent")?)
            .arg("run")
            .args(args)
            .arg("--admin-addr")
            .arg(format!("127.0.0.1:{admin}"))
            // Any free loopback port: agents of parallel tests would collide on the default.
            .args(["--debug-addr", "127.0.0.1:0"])
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,aether_agent_reconciler=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::OpenOptions::new().create(true).append(true).open(log)?)
            .spawn()?;
        let mut a = Agent { child, admin, log: log.to_owned() };
        let deadline = Instant::now() + Duration::from_secs(30);
        while http_get_status(admin, "/readyz") != Some(200) {
            if let Some(status) = a.child.try_wait()? {
                bail!("aether-agent exited ({status}): {}", std::fs::read_to_string(log).unwrap_or_default());
            }
            if Instant::now() > deadline {
                bail!("aether-agent not ready after 30 s: {}", std::fs::read_to_string(log).unwrap_or_default());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(a)
    }

    /// Sends SIGTERM and waits for the agent to exit (at most 30 s, then SIGKILL).
    ///
    /// # Errors
    /// When `kill` cannot run or the agent does not exit in time.
    pub fn terminate(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        let ok = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status()?.success();
        anyhow::ensure!(ok, "kill -TERM {}", self.child.id());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                bail!("aether-agent did not exit within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The body of `/readyz`.
    pub fn readyz(&self) -> String {
        http_get(self.admin, "/readyz", &[]).map(|(_, b)| b).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `f` every 200 ms until it returns `Ok(true)` or `timeout` passes.
///
/// # Errors
/// On time-out, with `what` and the last error or value.
pub fn eventually(what: &str, timeout: Duration, mut f: impl FnMut() -> anyhow::Result<bool>) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match f() {
            Ok(true) => return Ok(()),
            Ok(false) => "condition false".to_owned(),
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}: {last}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Plays kubelet and the app: creates the emptyDir directory `dir` and starts the workspace's
/// `uds-echo` answering as `name` on `dir/file`, waiting up to `timeout` for the socket. The caller
/// owns (and kills) the returned child. Returns the child and the socket path.
///
/// # Errors
/// When the directory cannot be made, `uds-echo` is not built or does not start, or its socket
/// does not appear in time.
pub fn start_uds_echo(dir: &Path, file: &str, name: &str, timeout: Duration) -> anyhow::Result<(Child, PathBuf)> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let socket = dir.join(file);
    let mut child = Command::new(workspace_bin("uds-echo")?)
        .arg("--socket")
        .arg(&socket)
        .arg("--name")
        .arg(name)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting uds-echo")?;
    if let Err(e) = eventually("the echo socket", timeout, || Ok(socket.exists())) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    Ok((child, socket))
}

/// One Prometheus text scrape, parsed by `prometheus-parse` (so a malformed exposition fails the
/// test that scrapes it).
pub struct Scrape {
    samples: Vec<prometheus_parse::Sample>,
}

impl Scrape {
    /// GETs `http://127.0.0.1:<port>/metrics` and parses it as Prometheus text.
    ///
    /// # Errors
    /// When nothing answers, the status is not 200, or the body does not parse.
    pub fn get(port: u16) -> anyhow::Result<Self> {
        let (status, body) = http_get(port, "/metrics", &[])?;
        anyhow::ensure!(status == 200, "GET /metrics on port {port}: status {status}");
        Self::parse(&body)
    }

    /// Parses an exposition text.
    ///
    /// # Errors
    /// When a line is not valid Prometheus text format.
    pub fn parse(body: &str) -> anyhow::Result<Self> {
        let lines = body.lines().map(|l| Ok(l.to_owned()));
        let scrape = prometheus_parse::Scrape::parse(lines)
            .map_err(|e| anyhow::anyhow!("metrics do not parse as Prometheus text: {e}\n{body}"))?;
        Ok(Scrape { samples: scrape.samples })
    }

    /// The sum of every sample named `name` (for a histogram: `<name>_count`, `<name>_sum`, or
    /// `<name>` for the buckets) whose labels include all of `labels`; 0.0 when none match.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.metric == name)
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match &s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => *v,
                prometheus_parse::Value::Histogram(_) | prometheus_parse::Value::Summary(_) => 0.0,
            })
            .sum()
    }

    /// Whether any sample is named `name`.
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.metric == name)
    }
}

impl Controller {
    /// The process id of the running controller (e.g. to send it SIGTERM and watch a graceful
    /// shutdown).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The controller's log so far (stderr), for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._certs.path().join("controller.log")).unwrap_or_default()
    }

    /// Sends SIGTERM and waits (at most `timeout`) for the process to exit; returns whether it
    /// exited in time.
    ///
    /// # Errors
    /// When `kill` cannot be run.
    pub fn terminate(&mut self, timeout: Duration) -> anyhow::Result<bool> {
        Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status().context("running kill")?;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(false)
    }
}

/// The chart's copy of the EndpointPolicy CRD (`charts/aether-crds`).
pub fn crd_file() -> PathBuf {
    repo_root().join("charts/aether-crds/templates/endpointpolicy-crd.yaml")
}

impl ControlPlane {
    /// Installs the EndpointPolicy CRD from the chart (server-side apply) and waits until it is
    /// Established.
    ///
    /// # Errors
    /// When kubectl fails or the CRD is not Established within 60 s.
    pub fn install_crd(&self) -> anyhow::Result<()> {
        let f = crd_file();
        self.kubectl_ok(&["apply".as_ref(), "--server-side".as_ref(), "-f".as_ref(), f.as_os_str()])?;
        self.kubectl_ok(&[
            "wait",
            "--for",
            "condition=Established",
            "--timeout",
            "60s",
            "crd/endpointpolicies.config.aether.io",
        ])?;
        Ok(())
    }
}

/// Writes `<dir>/<user>.kubeconfig`: a context `viewer` for `user`, authenticated by a client
/// certificate signed by the control plane's CA in `pki` (`ca.crt`, `ca.key`), against the
/// server of `admin_kubeconfig`, with `namespace` as its default. Returns its path. RBAC gives
/// the user nothing until a test binds it.
///
/// # Errors
/// When openssl fails or a file cannot be read or written.
pub fn user_kubeconfig(
    pki: &Path,
    admin_kubeconfig: &Path,
    user: &str,
    namespace: &str,
    dir: &Path,
) -> anyhow::Result<PathBuf> {
    let file = |ext: &str| dir.join(format!("{user}.{ext}"));
    let (key, csr, crt) = (file("key"), file("csr"), file("crt"));
    let openssl = |args: &[&std::ffi::OsStr]| -> anyhow::Result<()> {
        let out = Command::new("openssl").args(args).output()?;
        ensure!(out.status.success(), "openssl: {}", String::from_utf8_lossy(&out.stderr));
        Ok(())
    };
    let os = |s: &'static str| std::ffi::OsStr::new(s);
    openssl(&[
        os("req"),
        os("-newkey"),
        os("rsa:2048"),
        os("-nodes"),
        os("-subj"),
        std::ffi::OsStr::new(&format!("/CN={user}")),
        os("-keyout"),
        key.as_os_str(),
        os("-out"),
        csr.as_os_str(),
    ])?;
    let ca = pki.join("ca.crt");
    let ca_key = pki.join("ca.key");
    let ext = file("ext");
    std::fs::write(&ext, "extendedKeyUsage=clientAuth\n")?;
    openssl(&[
        os("x509"),
        os("-req"),
        os("-in"),
        csr.as_os_str(),
        os("-CA"),
        ca.as_os_str(),
        os("-CAkey"),
        ca_key.as_os_str(),
        os("-CAcreateserial"),
        os("-days"),
        os("1"),
        // An X.509 v3 client certificate (rustls refuses v1).
        os("-extfile"),
        ext.as_os_str(),
        os("-out"),
        crt.as_os_str(),
    ])?;
    let admin = std::fs::read_to_string(admin_kubeconfig)?;
    let server = admin.lines().find_map(|l| l.trim().strip_prefix("server: ")).context("server in kubeconfig")?;
    let config = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    \
         certificate-authority: {ca}\nusers:\n- name: {user}\n  user:\n    client-certificate: {crt}\n    \
         client-key: {key}\ncontexts:\n- name: viewer\n  context: {{cluster: c, user: {user}, namespace: {namespace}}}\n\
         current-context: none\n",
        ca = ca.display(),
        crt = crt.display(),
        key = key.display(),
    );
    let path = file("kubeconfig");
    std::fs::write(&path, config)?;
    Ok(path)
}
