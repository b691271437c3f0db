//! `webhook-floor --tls-dir DIR --addr 127.0.0.1:PORT`: the floor of `make bench`'s webhook
//! section. The same server stack as `aether-controller run` (axum on axum-server with rustls and
//! ring, HTTP/1.1 and HTTP/2, one multi-threaded tokio runtime) with none of its work: `POST
//! /validate` reads the body and answers one fixed, allowing AdmissionReview. No parsing, no
//! validation, no logging, no metrics. The ratio of the real webhook's latency to this one's
//! is what the webhook itself costs on top of TLS and HTTP on this machine.

use std::net::SocketAddr;
use std::path::PathBuf;

use axum::Router;
use axum::body::Bytes;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::post;
use axum_server::tls_rustls::RustlsConfig;

const REVIEW: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"b0a1c2d3-0004-4000-8000-000000000004","allowed":true,"status":{"metadata":{},"code":200}}}"#;

async fn validate(body: Bytes) -> impl IntoResponse {
    std::hint::black_box(body.len());
    ([(header::CONTENT_TYPE, "application/json")], REVIEW)
}

fn usage() -> ! {
    eprintln!("usage: webhook-floor --tls-dir DIR --addr HOST:PORT");
    std::process::exit(2)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (mut tls_dir, mut addr): (Option<PathBuf>, Option<SocketAddr>) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--tls-dir" => tls_dir = args.next().map(PathBuf::from),
            "--addr" => addr = args.next().and_then(|v| v.parse().ok()),
            _ => usage(),
        }
    }
    let (Some(tls_dir), Some(addr)) = (tls_dir, addr) else { usage() };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tls = RustlsConfig::from_pem_file(
        tls_dir.join(aether_webhook_certs::CERT_FILE),
        tls_dir.join(aether_webhook_certs::KEY_FILE),
    )
    .await?;
    let app = Router::new().route("/validate", post(validate));
    eprintln!("webhook-floor listening on https://{addr}/validate");
    // TCP_NODELAY as the webhook's acceptor sets it (serve-policy's `Gate::tls_acceptor`).
    let acceptor =
        axum_server::tls_rustls::RustlsAcceptor::new(tls).acceptor(axum_server::accept::NoDelayAcceptor::new());
    axum_server::bind(addr).acceptor(acceptor).serve(app.into_make_service()).await?;
    Ok(())
}
