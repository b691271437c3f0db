//! The real server (`server::run`) over real TLS: certificates minted with
//! `aether_webhook_certs::mint`, listeners on 127.0.0.1, and a reqwest client that trusts only
//! the minted CA (as the API server trusts only `caBundle`). Admin endpoints on the plain port.

mod common;

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use aether_controller::server::{self, Listeners, RunConfig, TlsFiles};
use aether_controller::webhook::DEFAULT_MAX_BODY_BYTES;
use aether_crds::Rules;
use aether_crds::udspath::DEFAULT_PODS_DIR;
use aether_webhook_certs::{CERT_FILE, KEY_FILE};
use common::{assert_allowed, denial, padded, response_for, review, review_bytes, uid_of};
use reqwest::StatusCode;
use serde_json::Value;
use tokio::task::JoinHandle;

const MIB: usize = 1024 * 1024;

fn install_crypto_provider() {
    // Several tests race to install it; only the first wins, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("binding an ephemeral port");
    l.local_addr().expect("bound address")
}

/// A running `server::run` with its own CA.
struct Server {
    webhook: SocketAddr,
    admin: SocketAddr,
    ca_pem: String,
    task: JoinHandle<anyhow::Result<()>>,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start() -> Server {
        Server::start_with(DEFAULT_PODS_DIR).await
    }

    async fn start_with(pods_dir: &str) -> Server {
        install_crypto_provider();
        let dir = tempfile::tempdir().expect("temp dir");
        let bundle = aether_webhook_certs::mint(&["localhost".to_owned(), "127.0.0.1".to_owned()])
            .expect("minting certificates");
        aether_webhook_certs::write_dir(&bundle, dir.path()).expect("writing certificates");
        // Ports are picked by binding port 0 and released before `run` binds them again: another
        // process may take one in between, so retry a few times on a bind failure.
        for _ in 0..5 {
            let cfg = RunConfig {
                webhook_addr: free_addr(),
                admin_addr: free_addr(),
                tls: TlsFiles { cert: dir.path().join(CERT_FILE), key: dir.path().join(KEY_FILE) },
                rules: Rules::new(pods_dir),
                listeners: Listeners::default(),
                max_body_bytes: DEFAULT_MAX_BODY_BYTES,
                status_writer: None,
                probe: Default::default(),
            };
            let (webhook, admin) = (cfg.webhook_addr, cfg.admin_addr);
            let task = tokio::spawn(server::run(cfg));
            let plain = reqwest::Client::new();
            for _ in 0..500 {
                if task.is_finished() {
                    break;
                }
                if let Ok(r) = plain.get(format!("http://{admin}/readyz")).send().await
                    && r.status() == StatusCode::OK
                {
                    return Server { webhook, admin, ca_pem: bundle.ca_pem.clone(), task, _dir: dir };
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            match task.await {
                Ok(Err(e)) if format!("{e:#}").contains("cannot bind") => continue,
                other => panic!("the server did not become ready: {other:?}"),
            }
        }
        panic!("no free ports after 5 attempts");
    }

    /// A client that trusts only this server's CA.
    fn client(&self) -> reqwest::Client {
        client_trusting(&self.ca_pem, false)
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}/validate", self.webhook.port())
    }

    async fn post(&self, client: &reqwest::Client, content_type: &str, body: Vec<u8>) -> (StatusCode, Vec<u8>) {
        let res = client
            .post(self.url())
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body)
            .send()
            .await
            .expect("the webhook answers");
        let status = res.status();
        (status, res.bytes().await.expect("answer body").to_vec())
    }

    /// POSTs a review fixture (as JSON) and returns its `response`, checking 200 and the envelope.
    async fn decide(&self, client: &reqwest::Client, review: &Value) -> Value {
        let (status, body) = self.post(client, "application/json", serde_json::to_vec(review).expect("JSON")).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        let answer: Value = serde_json::from_slice(&body).expect("the answer is JSON");
        response_for(&answer, &uid_of(review)).clone()
    }

    async fn admin_get(&self, path: &str) -> (StatusCode, String) {
        let res = reqwest::get(format!("http://{}{path}", self.admin)).await.expect("admin port answers");
        let status = res.status();
        (status, res.text().await.expect("admin body"))
    }

    async fn metrics(&self) -> Metrics {
        let (status, text) = self.admin_get("/metrics").await;
        assert_eq!(status, StatusCode::OK);
        Metrics::parse(&text)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn client_trusting(ca_pem: &str, http1_only: bool) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(ca_pem.as_bytes()).expect("CA PEM");
    let mut b = reqwest::Client::builder().tls_backend_rustls().tls_certs_only([ca]).timeout(Duration::from_secs(60));
    if http1_only {
        b = b.http1_only();
    }
    b.build().expect("client builds")
}

/// Samples of a Prometheus / OpenMetrics text exposition, keyed by `name{labels}`.
struct Metrics(BTreeMap<String, f64>);

impl Metrics {
    /// Parses the text format strictly enough to catch a broken exposition: every line is a
    /// `# HELP`/`# TYPE`/`# UNIT` comment, `# EOF` (last), or `name{labels} value`.
    fn parse(text: &str) -> Metrics {
        let mut samples = BTreeMap::new();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.last(), Some(&"# EOF"), "OpenMetrics text ends with # EOF:\n{text}");
        for line in &lines[..lines.len() - 1] {
            if let Some(comment) = line.strip_prefix("# ") {
                let word = comment.split_whitespace().next().unwrap_or_default();
                assert!(["HELP", "TYPE", "UNIT"].contains(&word), "unexpected comment line {line:?}");
                continue;
            }
            let (series, value) =
                line.rsplit_once(' ').unwrap_or_else(|| panic!("sample line without a value: {line:?}"));
            let name_end = series.find('{').unwrap_or(series.len());
            let name = &series[..name_end];
            assert!(
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
                "bad metric name in {line:?}"
            );
            if name_end < series.len() {
                assert!(series.ends_with('}'), "unclosed label set in {line:?}");
            }
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().unwrap_or_else(|e| panic!("bad sample value in {line:?}: {e}")),
            };
            assert!(samples.insert(series.to_owned(), value).is_none(), "duplicate series {series}");
        }
        Metrics(samples)
    }

    fn requests(&self, kind: &str, result: &str) -> f64 {
        self.0
            .get(&format!("aether_admission_requests_total{{kind=\"{kind}\",result=\"{result}\"}}"))
            .copied()
            .unwrap_or(0.0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn decisions_over_tls_allow_deny_and_echo_the_uid() {
    let server = Server::start().await;
    let client = server.client();
    assert_allowed(&server.decide(&client, &review("create-valid.json")).await);
    let message = denial(&server.decide(&client, &review("create-over-budget.json")).await);
    for want in ["spec.udsSocket", "17 bytes", "16 bytes", "/var/lib/kubelet/pods"] {
        assert!(message.contains(want), "denial lacks {want:?}: {message}");
    }
    let message = denial(&server.decide(&client, &review("create-traversal.json")).await);
    assert!(message.contains("spec.udsSocket"), "{message}");
    let message = denial(&server.decide(&client, &review("create-deployment-target.json")).await);
    assert!(message.contains("spec.targetRef.kind"), "{message}");
    assert_allowed(&server.decide(&client, &review("update-valid.json")).await);
    denial(&server.decide(&client, &review("update-over-budget.json")).await);
    assert_allowed(&server.decide(&client, &review("delete-null-object.json")).await);
    assert_allowed(&server.decide(&client, &review("create-unknown-request-field-no-dryrun.json")).await);
    assert_allowed(&server.decide(&client, &review("pod-create.json")).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_configured_pods_dir_drives_the_budget_over_tls() {
    let server = Server::start_with("/k").await;
    let mut r = review("create-over-budget.json");
    r["request"]["object"]["spec"]["udsSocket"] = serde_json::json!("sockets/application-server-012.sock");
    assert_allowed(&server.decide(&server.client(), &r).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn misconfigured_pods_dir_still_serves_and_denies_every_policy() {
    // The budget error is not fatal: the server starts, becomes ready, and denies policies with
    // the reason (fail closed), so the misconfiguration is visible at `kubectl apply`.
    let server = Server::start_with("/var/snap/microk8s/common/var/lib/kubelet/pods").await;
    let message = denial(&server.decide(&server.client(), &review("create-valid.json")).await);
    assert!(message.contains("misconfigured"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn valid_update_near_the_body_cap_is_decided_over_tls() {
    // Two objects with 448 KiB of annotations each: past the API server's 256 KiB per object,
    // under the default 1 MiB cap.
    let server = Server::start().await;
    let big = padded(review("update-valid.json"), 7 * MIB / 16);
    let size = serde_json::to_vec(&big).expect("JSON").len();
    assert!(size > 7 * MIB / 8 && size < MIB, "review is {size} bytes");
    assert_allowed(&server.decide(&server.client(), &big).await);
}

fn eight_mib_review() -> Vec<u8> {
    let bytes = serde_json::to_vec(&padded(review("update-valid.json"), 4 * MIB)).expect("JSON");
    assert!(bytes.len() >= 8 * MIB);
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn body_of_8_mib_is_413_over_http2() {
    let server = Server::start().await;
    let probe = server.client().get(server.url()).send().await.expect("the webhook answers");
    assert_eq!(probe.version(), reqwest::Version::HTTP_2, "ALPN negotiates h2, as the API server's client does");
    let (status, body) = server.post(&server.client(), "application/json", eight_mib_review()).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{}", String::from_utf8_lossy(&body));
    assert_eq!(server.metrics().await.requests("none", "too-large"), 1.0);
}

/// Speaks HTTP/1.1 over TLS by hand (rustls, trusting only `ca_pem`): sends `head` and `body`
/// as they are, then reads the answer until the end of its headers or EOF.
fn raw_http1(addr: SocketAddr, ca_pem: &str, head: &str, body: &[u8]) -> String {
    raw_http1_waiting(addr, ca_pem, head, body, Duration::from_secs(10))
}

/// Like [`raw_http1`], waiting up to `wait` for the answer; an empty string means the server
/// closed the connection without answering.
fn raw_http1_waiting(addr: SocketAddr, ca_pem: &str, head: &str, body: &[u8], wait: Duration) -> String {
    use std::io::{Read, Write};

    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};

    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("CA PEM")).expect("CA is a usable root");
    }
    let config = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    let name = ServerName::try_from("127.0.0.1").expect("IP server name");
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).expect("TLS client");
    let sock = std::net::TcpStream::connect(addr).expect("connect");
    sock.set_read_timeout(Some(wait)).expect("timeout");
    let mut tls = rustls::StreamOwned::new(conn, sock);
    tls.write_all(head.as_bytes()).expect("sending the head");
    tls.write_all(body).expect("sending the body prefix");
    tls.flush().expect("flush");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        match tls.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            // The server hung up without a TLS close_notify: no answer (the caller checks).
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => panic!("reading the answer: {e} (so far: {})", String::from_utf8_lossy(&answer)),
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn declared_8_mib_is_413_over_http1_without_the_body_being_sent() {
    // "Above the cap → 413 without buffering it all": the client declares 8 MiB, sends 9 bytes
    // of it and waits. The answer comes anyway.
    let server = Server::start().await;
    let head = format!(
        "POST /validate HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        server.webhook.port(),
        8 * MIB
    );
    let (addr, ca) = (server.webhook, server.ca_pem.clone());
    let answer =
        tokio::task::spawn_blocking(move || raw_http1(addr, &ca, &head, b"{\"kind\":\"A")).await.expect("raw client");
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert_eq!(server.metrics().await.requests("none", "too-large"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn full_8_mib_upload_over_http1_is_refused_and_the_server_stays_healthy() {
    // Over HTTP/1.1 the server answers 413 and closes the connection without reading the rest;
    // a client still writing may see the 413 or only the closed connection (hyper's client
    // reports the broken pipe instead of the early answer). Either way nothing was decided.
    let server = Server::start().await;
    let http1 = client_trusting(&server.ca_pem, true);
    let result = http1
        .post(server.url())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(eight_mib_review())
        .send()
        .await;
    match result {
        Ok(res) => assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE),
        Err(e) => assert!(e.is_request() && !e.is_timeout(), "expected a 413 or the connection closed early: {e:?}"),
    }
    assert_eq!(
        server.metrics().await.requests("EndpointPolicy", "allowed"),
        0.0,
        "the oversized review was not decided"
    );
    assert_allowed(&server.decide(&http1, &review("create-valid.json")).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_requests_do_not_disturb_concurrent_valid_ones() {
    let server = std::sync::Arc::new(Server::start().await);
    // One client: over HTTP/2 every request below is a stream on the same connection, so a 400
    // or a 413 must not take the connection down with it.
    let client = server.client();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..8 {
        let (s, c) = (server.clone(), client.clone());
        tasks.spawn(async move {
            let (ct, body, want): (&str, Vec<u8>, StatusCode) = match i % 4 {
                0 => ("application/json", Vec::new(), StatusCode::BAD_REQUEST),
                1 => ("application/json", b"{}".to_vec(), StatusCode::BAD_REQUEST),
                2 => ("text/plain", review_bytes("create-valid.json"), StatusCode::BAD_REQUEST),
                _ => ("application/json", eight_mib_review(), StatusCode::PAYLOAD_TOO_LARGE),
            };
            let (status, body) = s.post(&c, ct, body).await;
            assert_eq!(status, want, "malformed request {i}: {}", String::from_utf8_lossy(&body));
            if want == StatusCode::BAD_REQUEST {
                assert!(!body.is_empty(), "a 400 carries its reason");
            }
        });
        let (s, c) = (server.clone(), client.clone());
        tasks.spawn(async move {
            let r = review(if i % 2 == 0 { "create-valid.json" } else { "update-valid.json" });
            assert_allowed(&s.decide(&c, &r).await);
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("request task");
    }
    // And after all that, the same connection and a fresh one still work.
    assert_allowed(&server.decide(&client, &review("create-valid.json")).await);
    assert_allowed(&server.decide(&server.client(), &review("create-valid.json")).await);
    let m = server.metrics().await;
    // Of the six 400s, the two `{}` lack the envelope (apiVersion, kind); the rest are malformed.
    assert_eq!(m.requests("none", "malformed"), 4.0);
    assert_eq!(m.requests("none", "unsupported-envelope"), 2.0);
    assert_eq!(m.requests("none", "too-large"), 2.0);
    assert_eq!(m.requests("EndpointPolicy", "allowed"), 10.0);
    assert!(!server.task.is_finished(), "the server is still running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_endpoints_report_health_readiness_and_metrics_that_move() {
    let server = Server::start().await;
    let (status, _) = server.admin_get("/healthz").await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = server.admin_get("/readyz").await;
    assert_eq!(status, StatusCode::OK);

    let before = server.metrics().await;
    assert_eq!(before.requests("EndpointPolicy", "allowed"), 0.0);
    let client = server.client();
    server.decide(&client, &review("create-valid.json")).await;
    server.decide(&client, &review("create-valid.json")).await;
    server.decide(&client, &review("create-over-budget.json")).await;
    server.decide(&client, &review("pod-create.json")).await;
    let (status, _) = server.post(&client, "application/json", b"{}".to_vec()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let res = reqwest::get(format!("http://{}/metrics", server.admin)).await.expect("metrics");
    let ct =
        res.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    assert!(ct.starts_with("application/openmetrics-text"), "Content-Type {ct:?}");
    let text = res.text().await.expect("metrics body");
    assert!(text.contains("aether_admission_requests_total"), "{text}");
    assert!(text.contains("# TYPE aether_admission_requests counter"), "{text}");
    let after = Metrics::parse(&text);
    assert_eq!(after.requests("EndpointPolicy", "allowed") - before.requests("EndpointPolicy", "allowed"), 2.0);
    assert_eq!(after.requests("EndpointPolicy", "denied") - before.requests("EndpointPolicy", "denied"), 1.0);
    assert_eq!(after.requests("other", "allowed"), 1.0);
    assert_eq!(after.requests("none", "unsupported-envelope"), 1.0, "`{{}}` has no envelope");
    assert_eq!(
        after.0.get("aether_admission_duration_seconds_count").copied(),
        Some(4.0),
        "one observation per decision"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_that_does_not_trust_the_ca_fails_the_handshake() {
    let server = Server::start().await;
    let stranger = aether_webhook_certs::mint(&["localhost".to_owned(), "127.0.0.1".to_owned()]).expect("another CA");
    let untrusting = client_trusting(&stranger.ca_pem, false);
    let err = untrusting
        .post(server.url())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(review_bytes("create-valid.json"))
        .send()
        .await
        .expect_err("a client that does not trust the CA must not get an answer");
    assert!(err.is_connect(), "expected a TLS handshake (connect) failure, got {err:?}");
    // The failed handshake does not hurt the server.
    assert_allowed(&server.decide(&server.client(), &review("create-valid.json")).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn certificate_names_the_loopback_address_and_localhost() {
    // The API server calls the webhook by URL at 127.0.0.1 in the harness, or by Service DNS
    // name in a cluster; both are in the minted SANs. A name outside them fails verification.
    let server = Server::start().await;
    let client = reqwest::Client::builder()
        .tls_backend_rustls()
        .tls_certs_only([reqwest::Certificate::from_pem(server.ca_pem.as_bytes()).expect("CA")])
        .resolve("localhost", server.webhook)
        .resolve("not-in-the-cert.example", server.webhook)
        .build()
        .expect("client");
    let ok = client
        .post(format!("https://localhost:{}/validate", server.webhook.port()))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(review_bytes("create-valid.json"))
        .send()
        .await
        .expect("localhost is a SAN");
    assert_eq!(ok.status(), StatusCode::OK);
    let bad = client
        .post(format!("https://not-in-the-cert.example:{}/validate", server.webhook.port()))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(review_bytes("create-valid.json"))
        .send()
        .await;
    assert!(bad.is_err(), "a name outside the SANs must fail verification");
}

#[tokio::test]
async fn run_fails_naming_the_missing_certificate_file() {
    install_crypto_provider();
    let dir = tempfile::tempdir().expect("temp dir");
    let cert = dir.path().join("absent.crt");
    let cfg = RunConfig {
        webhook_addr: free_addr(),
        admin_addr: free_addr(),
        tls: TlsFiles { cert: cert.clone(), key: dir.path().join("absent.key") },
        rules: Rules::new(DEFAULT_PODS_DIR),
        listeners: Listeners::default(),
        max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        status_writer: None,
        probe: Default::default(),
    };
    let err = tokio::time::timeout(Duration::from_secs(10), server::run(cfg))
        .await
        .expect("run fails promptly")
        .expect_err("run cannot serve without a certificate");
    let text = format!("{err:#}");
    assert!(text.contains(&cert.display().to_string()), "{text}");
}

#[tokio::test]
async fn run_fails_naming_the_webhook_address_in_use() {
    install_crypto_provider();
    let dir = tempfile::tempdir().expect("temp dir");
    let bundle = aether_webhook_certs::mint(&["127.0.0.1".to_owned()]).expect("mint");
    aether_webhook_certs::write_dir(&bundle, dir.path()).expect("write");
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr");
    let cfg = RunConfig {
        webhook_addr: addr,
        admin_addr: free_addr(),
        tls: TlsFiles { cert: dir.path().join(CERT_FILE), key: dir.path().join(KEY_FILE) },
        rules: Rules::new(DEFAULT_PODS_DIR),
        listeners: Listeners::default(),
        max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        status_writer: None,
        probe: Default::default(),
    };
    let err = tokio::time::timeout(Duration::from_secs(10), server::run(cfg))
        .await
        .expect("run fails promptly")
        .expect_err("the port is taken");
    let text = format!("{err:#}");
    assert!(text.contains("--webhook-addr") && text.contains(&addr.to_string()), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_that_stall_mid_request_are_cut_off_and_others_are_served_meanwhile() {
    // Slow clients must not hold connections (file descriptors) open: a body that stops coming is
    // answered 408 after REQUEST_TIMEOUT, and headers that stop coming close the connection
    // after HEADER_READ_TIMEOUT.
    let server = Server::start().await;
    let port = server.webhook.port();
    let (addr, ca) = (server.webhook, server.ca_pem.clone());
    let stalled_body = tokio::task::spawn_blocking(move || {
        let head = format!(
            "POST /validate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        );
        let start = std::time::Instant::now();
        (raw_http1_waiting(addr, &ca, &head, b"{", Duration::from_secs(40)), start.elapsed())
    });
    let ca = server.ca_pem.clone();
    let stalled_head = tokio::task::spawn_blocking(move || {
        let start = std::time::Instant::now();
        let head = format!("POST /validate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n");
        (raw_http1_waiting(addr, &ca, &head, b"", Duration::from_secs(40)), start.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let answer = server.decide(&server.client(), &common::review("create-valid.json")).await;
    common::assert_allowed(&answer);
    let (body_answer, body_after) = stalled_body.await.expect("stalled body client");
    assert!(body_answer.starts_with("HTTP/1.1 408"), "{body_answer}");
    assert!(body_after < Duration::from_secs(25), "answered after {body_after:?}");
    let (head_answer, head_after) = stalled_head.await.expect("stalled head client");
    assert!(!head_answer.starts_with("HTTP/1.1 2"), "{head_answer}");
    assert!(head_after < Duration::from_secs(25), "connection held for {head_after:?}");
}
