//! Harness for tests against real components.
//!
//! - [`ControlPlane`]: etcd + kube-apiserver started by `tests/harness/controlplane.sh` (built by
//!   `tests/harness/build-tools.sh`), stopped on drop, with a `kubectl` of the same version.
//! - [`Controller`]: the real `aether-controller run` binary on loopback with freshly minted
//!   certificates, killed on drop.
//!
//! The binaries under test are the workspace's own (`target/<profile>/`): build them first
//! (`make test` does).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// Where build-tools.sh put kube-apiserver, etcd, kubectl and helm.
pub fn tools_bin() -> PathBuf {
    std::env::var_os("AETHER_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache/tools"))
        .join("bin")
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
    /// # Errors
    /// When the binaries are missing or the API server does not become ready; the script's
    /// output (with the tail of the component logs) is included.
    pub fn start() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("aether-cp-").tempdir()?;
        let script = repo_root().join("tests/harness/controlplane.sh");
        let out = Command::new(&script).arg("start").arg(dir.path()).output()?;
        let cp = ControlPlane { dir, script };
        if !out.status.success() {
            bail!("control plane did not start:\n{}", String::from_utf8_lossy(&out.stderr));
        }
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

    /// Runs `kubectl --kubeconfig <ours> ARGS`, returning its output whatever its exit code.
    ///
    /// # Errors
    /// Only when kubectl cannot be started.
    pub fn kubectl<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> anyhow::Result<Output> {
        Command::new(tools_bin().join("kubectl"))
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("running kubectl")
    }

    /// Like [`ControlPlane::kubectl`] but fails unless kubectl exits 0; returns stdout.
    ///
    /// # Errors
    /// On a non-zero exit, with kubectl's stderr.
    pub fn kubectl_ok<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> anyhow::Result<String> {
        let out = self.kubectl(args)?;
        if !out.status.success() {
            let shown: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy().into_owned()).collect();
            bail!("kubectl {} failed: {}", shown.join(" "), String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
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
