//! The gate in front of axum-server's real rustls acceptor, over real TCP sockets: half-open
//! handshakes and silent connections are evicted as `handshake-timeout`, a finished handshake
//! with no request as `first-byte-timeout`, connections over the cap are closed at once, and
//! afterwards an HTTPS request is answered.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use aether_serve_policy::{ConnectionPolicy, Eviction, Gate, ListenerKind, ListenerMetrics, Quiet};
use axum_server::tls_rustls::RustlsConfig;

const TIMEOUT: Duration = Duration::from_secs(2);
/// A bound for the waits below, far above TIMEOUT (not a timing assertion).
const WAIT: Duration = Duration::from_secs(10);

struct Server {
    addr: SocketAddr,
    metrics: ListenerMetrics,
    client: Arc<rustls::ClientConfig>,
}

async fn start(max_connections: usize, first_byte_timeout: Duration) -> Server {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let key = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let tls = RustlsConfig::from_pem(key.cert.pem().into_bytes(), key.signing_key.serialize_pem().into_bytes())
        .await
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(key.cert.der().clone()).unwrap();
    let client = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();

    let metrics = ListenerMetrics::new();
    let policy = ConnectionPolicy {
        listener: ListenerKind::Webhook,
        max_connections,
        max_connections_per_source: None,
        first_byte_timeout,
        quiet: Quiet::IdleTimeout(Duration::from_secs(30)),
    };
    let gate = Gate::new(policy, &metrics);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/validate", axum::routing::get(|| async { "reviewed" }));
    let server = axum_server::from_tcp(listener).unwrap().acceptor(gate.tls_acceptor(tls));
    tokio::spawn(server.serve(app.into_make_service()));
    Server { addr, metrics, client: Arc::new(client) }
}

/// Blocks until the server closes `s` (end of stream or reset); false if it stays open for WAIT.
fn closed_by_server(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // e.g. a TLS alert before the close
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
                return false;
            }
            Err(_) => return true,
        }
    }
}

fn tls_session(server: &Server) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let name = "localhost".try_into().unwrap();
    let conn = rustls::ClientConnection::new(server.client.clone(), name).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, TcpStream::connect(server.addr).unwrap());
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock).unwrap();
    }
    tls
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_half_open_and_mute_tls_connections_are_evicted_by_reason_and_then_a_request_is_answered() {
    let server = start(8, TIMEOUT).await;
    let m = server.metrics.clone();
    let addr = server.addr;
    let s = Arc::new(server);

    // Three flavours: TCP only, a TLS record header of a ClientHello with no body (half-open),
    // and a finished handshake that never sends a request.
    let silent = TcpStream::connect(addr).unwrap();
    let mut half = TcpStream::connect(addr).unwrap();
    half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).unwrap();
    let s2 = s.clone();
    let mute = tokio::task::spawn_blocking(move || tls_session(&s2)).await.unwrap();
    wait_for("3 open webhook connections", || m.open(ListenerKind::Webhook) == 3).await;

    let (mut silent, mut half, mut mute) = (silent, half, mute);
    let closed = tokio::task::spawn_blocking(move || {
        (closed_by_server(&mut silent), closed_by_server(&mut half), closed_by_server(&mut mute.sock))
    })
    .await
    .unwrap();
    assert_eq!(closed, (true, true, true));
    wait_for("the connections to be released", || m.open(ListenerKind::Webhook) == 0).await;
    assert_eq!(m.evictions(ListenerKind::Webhook, Eviction::HandshakeTimeout), 2);
    assert_eq!(m.evictions(ListenerKind::Webhook, Eviction::FirstByteTimeout), 1);
    assert_eq!(m.evictions(ListenerKind::Webhook, Eviction::IdleTimeout), 0);
    assert_eq!(m.refusals(ListenerKind::Webhook), 0);

    let s2 = s.clone();
    let answer = tokio::task::spawn_blocking(move || {
        let mut tls = tls_session(&s2);
        tls.write_all(b"GET /validate HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = Vec::new();
        let _ = tls.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("reviewed"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_are_closed_at_once_while_the_admitted_ones_are_held() {
    // Held connections stay admitted for the whole test (a timeout far beyond it).
    let server = start(2, Duration::from_secs(600)).await;
    let m = server.metrics.clone();
    let held: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(server.addr).unwrap()).collect();
    wait_for("2 open webhook connections", || m.open(ListenerKind::Webhook) == 2).await;
    let addr = server.addr;
    let refused = tokio::task::spawn_blocking(move || {
        (0..2)
            .map(|_| {
                let mut s = TcpStream::connect(addr).unwrap();
                closed_by_server(&mut s)
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    assert_eq!(refused, [true, true]);
    assert_eq!(m.refusals(ListenerKind::Webhook), 2);
    assert_eq!(m.open(ListenerKind::Webhook), 2, "the admitted ones are still held");
    drop(held);
    wait_for("the held ones to be released", || m.open(ListenerKind::Webhook) == 0).await;
    assert_eq!(m.evictions(ListenerKind::Webhook, Eviction::HandshakeTimeout), 0, "closed by the client");
}
