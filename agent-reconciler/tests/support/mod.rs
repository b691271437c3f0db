//! Presets shared by the integration tests, over the workspace's fixtures (`aether-fixtures`):
//! pods and policies are built with its builders and go through the same pure extraction the
//! watch drivers use (`PodRecord::from_pod`, `PolicyRecord::from_policy`).

#![allow(dead_code, missing_docs, unused_imports)]

pub mod ads;

use std::path::Path;
use std::process::Command;

use aether_agent_reconciler::{PodRecord, PolicyRecord, Settings};
use aether_crds::udspath::DEFAULT_PODS_DIR;
pub use aether_fixtures::{PodBuilder, UID, uid};
use k8s_openapi::api::core::v1::Pod;

/// Settings with the default pods dir (budget 16) and pipes enabled.
pub fn settings() -> Settings {
    Settings::new(DEFAULT_PODS_DIR, true)
}

/// A managed pod as the API server serves it on node `node-a`: UID `uid`, running as
/// `service_account`, an emptyDir `sockets`, a configMap volume `config`, IP 10.0.0.7.
pub fn api_pod(namespace: &str, name: &str, uid: &str, service_account: &str) -> PodBuilder {
    aether_fixtures::pod(namespace, name)
        .uid(uid)
        .sa(service_account)
        .node("node-a")
        .emptydir("sockets")
        .configmap("config", "cfg")
        .ip("10.0.0.7")
}

/// The record of a managed API pod.
pub fn record(pod: &Pod) -> PodRecord {
    PodRecord::from_pod(pod).expect("a well-formed pod").expect("a managed pod")
}

/// The record of [`api_pod`].
pub fn pod(namespace: &str, name: &str, uid: &str, service_account: &str) -> PodRecord {
    record(&api_pod(namespace, name, uid, service_account).build())
}

/// The record of [`api_pod`] with a `uds-socket` annotation.
pub fn pod_with_socket(namespace: &str, name: &str, uid: &str, service_account: &str, socket: &str) -> PodRecord {
    record(&api_pod(namespace, name, uid, service_account).annotation_socket(socket).build())
}

/// The record of policy `namespace/name` on Service `service` over `socket`, validated against
/// `settings`' budget.
pub fn policy_in(settings: &Settings, namespace: &str, name: &str, service: &str, socket: &str) -> PolicyRecord {
    let api = aether_fixtures::policy(namespace, name).target(service).socket(socket).build();
    PolicyRecord::from_policy(&api, settings).expect("a named policy")
}

/// The record of a policy, validated against the default settings.
pub fn policy(namespace: &str, name: &str, service: &str, socket: &str) -> PolicyRecord {
    policy_in(&settings(), namespace, name, service, socket)
}

/// A reqwest builder; reqwest is built without a TLS provider, so install ring first.
pub fn client_builder() -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
}

/// A UDS HTTP echo server (HTTP/1.1 and h2c): answers `<tag> <version> <method> <path>` with
/// 200, except `/unhealthy` (503). Binds a Unix socket only, never a TCP port.
pub fn start_echo(socket: &Path, tag: &str) -> tokio::task::JoinHandle<()> {
    echo_server(socket, tag, false)
}

/// Like [`start_echo`], but every request that is not HTTP/2 gets 505, as from a gRPC server
/// that speaks only h2.
pub fn start_h2_only_echo(socket: &Path, tag: &str) -> tokio::task::JoinHandle<()> {
    echo_server(socket, tag, true)
}

/// A UDS HTTP echo server answering every request with 200 `<tag> <path>` (a stale socket file
/// at `socket` is replaced). Binds a Unix socket only, never a TCP port.
pub fn start_path_echo(socket: &Path, tag: &str) -> tokio::task::JoinHandle<()> {
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(socket).expect("bind echo socket");
    let tag = tag.to_owned();
    let app = axum::Router::new()
        .fallback(move |req: axum::extract::Request| std::future::ready(format!("{tag} {}", req.uri().path())));
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    })
}

fn echo_server(socket: &Path, tag: &str, h2_only: bool) -> tokio::task::JoinHandle<()> {
    use axum::http::{StatusCode, Version};
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let listener = tokio::net::UnixListener::bind(socket).expect("bind echo socket");
    let tag = tag.to_owned();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let tag = tag.clone();
        async move {
            let status = if h2_only && req.version() != Version::HTTP_2 {
                StatusCode::HTTP_VERSION_NOT_SUPPORTED
            } else if req.uri().path() == "/unhealthy" {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::OK
            };
            let body = format!("{tag} {:?} {} {}", req.version(), req.method(), req.uri().path());
            (status, body)
        }
    });
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    })
}

/// A network namespace made with `ip netns add`, deleted on drop.
pub struct Netns(pub String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// A fresh network namespace with loopback up, deleted on drop (test runs as root).
pub fn netns_with_lo(tag: &str) -> Netns {
    let name = format!("aether-{tag}-{}", std::process::id());
    let status = Command::new("ip").args(["netns", "add", &name]).status().expect("run `ip` (iproute2)");
    assert!(status.success(), "`ip netns add {name}` failed: this test needs root and iproute2 (the CI runs as root)");
    let ns = Netns(name);
    assert!(ns.exec(&["ip", "link", "set", "lo", "up"]).status().unwrap().success());
    ns
}

impl Netns {
    /// `ip netns exec <ns> <args>`.
    pub fn exec(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.0]).args(args);
        cmd
    }

    /// The path Envoy opens (`network_namespace_filepath`).
    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.0)
    }

    /// GET `http://127.0.0.1:<port><path>` from inside the namespace (a client in the pod):
    /// `Ok(body)` on 200, `Err(why)` otherwise.
    pub fn get(&self, port: u16, path: &str) -> Result<String, String> {
        self.get_at("127.0.0.1", port, path)
    }

    /// Like [`Netns::get`] to `host` (`127.0.0.1`, `[::1]`).
    pub fn get_at(&self, host: &str, port: u16, path: &str) -> Result<String, String> {
        let script = format!(
            "import urllib.request; print(urllib.request.urlopen('http://{host}:{port}{path}', timeout=3).read().decode(), end='')"
        );
        let out = self.exec(&["python3", "-c", &script]).output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or_default().to_owned())
        }
    }
}
