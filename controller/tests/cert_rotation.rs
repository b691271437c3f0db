//! Certificate rotation without a restart: `server::run_reloading` serves the pair in a folder
//! laid out as the kubelet mounts a `kubernetes.io/tls` Secret (`tls.crt` -> `..data/tls.crt`,
//! `..data` -> a timestamped folder). While clients POST AdmissionReviews continuously, the
//! folder is swapped to a new CA + certificate the way the kubelet does it. No request may fail
//! (the clients trust both CAs, as an API server does while `caBundle` holds both during a
//! rotation) and the certificate presented on new connections changes.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use aether_controller::server::{self, Listeners, RunConfig, TlsFiles};
use aether_controller::webhook::DEFAULT_MAX_BODY_BYTES;
use aether_crds::Rules;
use aether_crds::udspath::DEFAULT_PODS_DIR;
use aether_webhook_certs::{Bundle, CA_FILE, CERT_FILE, KEY_FILE};
use common::{assert_allowed, response_for, review, review_bytes, uid_of};
use reqwest::StatusCode;
use serde_json::Value;

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("binding an ephemeral port")
}

fn names() -> Vec<String> {
    vec!["localhost".to_owned(), "127.0.0.1".to_owned()]
}

/// Writes `b` as the kubelet updates a Secret volume: a new timestamped folder, `..data`
/// repointed by one atomic rename, the visible names symlinks through `..data`.
fn kubelet_write(dir: &Path, b: &Bundle, generation: u32) {
    let ts = format!("..2026_11_29_13_00_{generation:02}.{generation}");
    aether_webhook_certs::write_dir(b, &dir.join(&ts)).expect("writing the timestamped folder");
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&ts, &tmp).expect("symlink");
    std::fs::rename(&tmp, dir.join("..data")).expect("swapping ..data");
    for f in [CA_FILE, CERT_FILE, KEY_FILE] {
        let link = dir.join(f);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{f}"), &link).expect("symlink");
        }
    }
}

fn leaf_der(b: &Bundle) -> Vec<u8> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(b.cert_pem.as_bytes()).expect("leaf PEM").to_vec()
}

/// A client trusting `cas`; with `fresh`, no idle connection is kept. (A client also caches TLS
/// sessions: a resumed session presents no certificate, so the tests that watch the served
/// certificate build a new client per request.)
fn client(cas: &[&str], fresh: bool) -> reqwest::Client {
    let certs = cas.iter().map(|pem| reqwest::Certificate::from_pem(pem.as_bytes()).expect("CA PEM"));
    let mut b = reqwest::Client::builder()
        .tls_backend_rustls()
        .tls_certs_only(certs)
        .tls_info(true)
        .timeout(Duration::from_secs(30));
    if fresh {
        b = b.pool_max_idle_per_host(0);
    }
    b.build().expect("client builds")
}

/// One review POSTed; returns the leaf certificate of the connection, or why it failed.
async fn post(client: &reqwest::Client, url: &str, body: &[u8], uid: &str) -> Result<Vec<u8>, String> {
    let res = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_vec())
        .send()
        .await
        .map_err(|e| format!("send: {e:?}"))?;
    let status = res.status();
    let peer = res
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|i| i.peer_certificate())
        .map(<[u8]>::to_vec)
        .ok_or("no TLS info on the response")?;
    let bytes = res.bytes().await.map_err(|e| format!("body: {e}"))?;
    if status != StatusCode::OK {
        return Err(format!("status {status}: {}", String::from_utf8_lossy(&bytes)));
    }
    let answer: Value = serde_json::from_slice(&bytes).map_err(|e| format!("answer is not JSON: {e}"))?;
    assert_allowed(response_for(&answer, uid));
    Ok(peer)
}

/// Starts `server::run_reloading` on the cert files in `dir` (polling every 50 ms) and waits
/// until `/readyz` answers 200; returns the server task and the webhook address.
async fn start_reloading(dir: &std::path::Path) -> (tokio::task::JoinHandle<anyhow::Result<()>>, SocketAddr) {
    let cfg = RunConfig {
        webhook_addr: free_addr(),
        admin_addr: free_addr(),
        tls: TlsFiles { cert: dir.join(CERT_FILE), key: dir.join(KEY_FILE) },
        rules: Rules::new(DEFAULT_PODS_DIR),
        listeners: Listeners::default(),
        max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        status_writer: None,
        probe: Default::default(),
    };
    let (webhook, admin) = (cfg.webhook_addr, cfg.admin_addr);
    let task = tokio::spawn(server::run_reloading(cfg, Duration::from_millis(50)));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !matches!(reqwest::get(format!("http://{admin}/readyz")).await, Ok(r) if r.status() == StatusCode::OK) {
        assert!(!task.is_finished() && Instant::now() < deadline, "the server did not become ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (task, webhook)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn served_certificate_rotates_under_load_without_a_failed_request() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().expect("temp dir");
    let (old, new) = (aether_webhook_certs::mint(&names()).unwrap(), aether_webhook_certs::mint(&names()).unwrap());
    kubelet_write(dir.path(), &old, 1);

    let (task, webhook) = start_reloading(dir.path()).await;

    let url = format!("https://127.0.0.1:{}/validate", webhook.port());
    let body = Arc::new(review_bytes("create-valid.json"));
    let uid = Arc::new(uid_of(&review("create-valid.json")));
    let stop = Arc::new(AtomicBool::new(false));
    let cas = [old.ca_pem.as_str(), new.ca_pem.as_str()];
    // Two workers handshaking per request and one keeping its pooled connection.
    let mut workers = Vec::new();
    for fresh in [true, true, false] {
        let (pooled, url, body, uid, stop) =
            (client(&cas, false), url.clone(), body.clone(), uid.clone(), stop.clone());
        let cas = (old.ca_pem.clone(), new.ca_pem.clone());
        workers.push(tokio::spawn(async move {
            let mut seen: Vec<Vec<u8>> = Vec::new();
            let mut failures = Vec::new();
            let mut sent = 0usize;
            while !stop.load(Ordering::Acquire) {
                sent += 1;
                // A fresh worker handshakes anew on each request (new client: no connection,
                // no session to resume); the other keeps its pooled connection.
                let c = if fresh { client(&[&cas.0, &cas.1], true) } else { pooled.clone() };
                match post(&c, &url, &body, &uid).await {
                    Ok(peer) => {
                        if seen.last() != Some(&peer) {
                            seen.push(peer);
                        }
                    }
                    Err(e) => failures.push(e),
                }
            }
            (fresh, sent, seen, failures)
        }));
    }

    tokio::time::sleep(Duration::from_millis(300)).await;
    kubelet_write(dir.path(), &new, 2);
    // Wait until a fresh handshake presents the new certificate, then keep the load on a little.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let peer = post(&client(&cas, true), &url, &body, &uid).await.expect("a request during rotation");
        if peer == leaf_der(&new) {
            break;
        }
        assert!(Instant::now() < deadline, "the new certificate was not served within 15 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Release);

    for w in workers {
        let (fresh, sent, seen, failures) = w.await.expect("worker");
        assert!(failures.is_empty(), "{} of {sent} requests failed: {:?}", failures.len(), &failures[..1]);
        assert!(sent > 5, "the worker sent only {sent} requests");
        assert_eq!(seen.first(), Some(&leaf_der(&old)), "the first certificate served is the original");
        if fresh {
            assert_eq!(
                seen,
                vec![leaf_der(&old), leaf_der(&new)],
                "new connections switch once, from the old certificate to the new one"
            );
        }
    }
    // A client trusting only the new CA now gets through; one trusting only the old does not.
    post(&client(&[&new.ca_pem], true), &url, &body, &uid).await.expect("the new CA verifies the served cert");
    assert!(post(&client(&[&old.ca_pem], true), &url, &body, &uid).await.is_err());
    assert!(!task.is_finished(), "the server kept running: no restart");
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_rotation_keeps_serving_the_previous_certificate() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().expect("temp dir");
    let (old, new) = (aether_webhook_certs::mint(&names()).unwrap(), aether_webhook_certs::mint(&names()).unwrap());
    kubelet_write(dir.path(), &old, 1);
    let (task, webhook) = start_reloading(dir.path()).await;
    // A half-done update: the new certificate with the old key.
    let broken = Bundle { key_pem: old.key_pem.clone(), ..new.clone() };
    kubelet_write(dir.path(), &broken, 2);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let url = format!("https://127.0.0.1:{}/validate", webhook.port());
    let body = review_bytes("create-valid.json");
    let uid = uid_of(&review("create-valid.json"));
    let peer = post(&client(&[&old.ca_pem, &new.ca_pem], true), &url, &body, &uid).await.expect("still serving");
    assert_eq!(peer, leaf_der(&old));
    assert!(!task.is_finished());
    task.abort();
}
