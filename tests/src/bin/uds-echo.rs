//! `uds-echo --socket PATH --name NAME`: the test and demo workload. An HTTP/1.1 echo server that
//! listens only on a Unix socket (no TCP port), as a UDS-serving app in an emptyDir would: it
//! unlinks a stale socket file before binding and makes the socket 0660 (docs: workload
//! requirements). Every request gets `200 <name> over unix:<path>: <METHOD> <path>`, with the
//! time it was taken in an `x-uds-echo-received-us` header (microseconds since the Unix epoch).
//!
//! `uds-echo --tcp ADDR [--name NAME]` serves the same router on a TCP address instead (the
//! TCP-loopback side of `make bench`'s data-plane comparison: same server code, other socket).
//!
//! `uds-echo --socket PATH --swap-link TARGET` is the attacker of the socket-pinning tests: it
//! serves like the plain mode and, every ~2 ms, renames its socket aside and puts a symlink to
//! TARGET (another pod's socket, as the node's Envoy sees it) in its place, then puts its socket
//! back; forever.
//!
//! `uds-echo --get URL` is the client: one plain-HTTP GET (5 s timeout), the body on standard
//! output, exit 0 on 200 and 1 otherwise (a client pod calling a Service in the real-node tests;
//! the images have no shell or curl).
//!
//! `uds-echo --socket PATH --grpc` is a gRPC server instead (tonic, with the standard
//! `grpc.health.v1.Health` service of `tonic-health`, nothing else), on the socket only. The
//! overall status (service `""`) and the service `NAME` are SERVING while no file named
//! `not-serving` exists next to the socket, NOT_SERVING while one does (checked every 100 ms:
//! the real-node tests flip it from the host, in the pod's emptyDir).
//!
//! `uds-echo --grpc-check URL [--service S]` is its client: one `Health/Check` of `S` (default
//! `""`) over h2c to `URL` (e.g. `http://10.96.0.12:9090`, 5 s timeout); prints the status and
//! exits 0 on SERVING, 1 otherwise.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use axum::Router;
use axum::extract::{Request, State};

#[derive(Clone)]
struct Who(String);

/// The echo, with the time the request was taken in the `x-uds-echo-received-us` header
/// (microseconds since the Unix epoch): the continuity client tells by it whether a slow answer
/// was slow before or after the app.
async fn echo(State(who): State<Who>, req: Request) -> impl axum::response::IntoResponse {
    let received =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or_default();
    (
        [(aether_tests::continuity::RECEIVED_HEADER, received.to_string())],
        format!("{} {} {}\n", who.0, req.method(), req.uri()),
    )
}

/// GETs `url`; prints the body (or the error) and returns the exit code: 0 on 200, else 1.
async fn fetch(url: &str) -> i32 {
    // reqwest is built without a default TLS provider; plain HTTP still needs one installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Plain HTTP only: no root certificates (the image has none; loading the platform's would fail).
    let builder = reqwest::Client::builder().no_proxy().tls_certs_only(Vec::new());
    let client = match builder.timeout(std::time::Duration::from_secs(5)).build() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("uds-echo --get: {e}");
            return 1;
        }
    };
    match client.get(url).send().await {
        Ok(resp) => {
            let status = resp.status();
            print!("{}", resp.text().await.unwrap_or_default());
            eprintln!("uds-echo --get {url}: HTTP {status}");
            i32::from(status != reqwest::StatusCode::OK)
        }
        Err(e) => {
            // reqwest's own text ("error sending request") hides the cause: print the chain
            // (DNS, connect refused, timed out).
            let mut text = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                text.push_str(": ");
                text.push_str(&cause.to_string());
                source = cause.source();
            }
            eprintln!("uds-echo --get {url}: {text}");
            1
        }
    }
}

/// Serves `grpc.health.v1.Health` on `listener`; the statuses of `""` and `name` follow the
/// `not-serving` file next to `socket`.
async fn serve_grpc_health(
    listener: tokio::net::UnixListener,
    socket: &std::path::Path,
    name: &str,
) -> std::io::Result<()> {
    use tonic_health::ServingStatus;
    let (reporter, service) = tonic_health::server::health_reporter();
    let flag = socket.with_file_name("not-serving");
    let name = name.to_owned();
    eprintln!(
        "uds-echo {name}: gRPC health service on {}; NOT_SERVING while {} exists",
        socket.display(),
        flag.display()
    );
    tokio::spawn(async move {
        let mut last = None;
        loop {
            let status = if flag.exists() { ServingStatus::NotServing } else { ServingStatus::Serving };
            if last != Some(status) {
                reporter.set_service_status("", status).await;
                reporter.set_service_status(&name, status).await;
                eprintln!("uds-echo {name}: {status:?}");
                last = Some(status);
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    });
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming(incoming)
        .await
        .map_err(std::io::Error::other)
}

/// One `Health/Check` of `service` at `url`; prints the answer and returns the exit code: 0 on
/// SERVING, else 1.
async fn grpc_health_check(url: &str, service: &str) -> i32 {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let timeout = std::time::Duration::from_secs(5);
    let endpoint = match tonic::transport::Endpoint::from_shared(url.to_owned()) {
        Ok(e) => e.connect_timeout(timeout).timeout(timeout),
        Err(e) => {
            eprintln!("uds-echo --grpc-check {url}: {e}");
            return 1;
        }
    };
    let answer = match endpoint.connect().await {
        Ok(channel) => HealthClient::new(channel).check(HealthCheckRequest { service: service.to_owned() }).await,
        Err(e) => Err(tonic::Status::unavailable(e.to_string())),
    };
    match answer.map(|r| r.into_inner().status()) {
        Ok(status) => {
            println!("{}", status.as_str_name());
            eprintln!("uds-echo --grpc-check {url} service {service:?}: {}", status.as_str_name());
            i32::from(status != tonic_health::pb::health_check_response::ServingStatus::Serving)
        }
        Err(e) => {
            eprintln!("uds-echo --grpc-check {url} service {service:?}: {e}");
            1
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let mut socket: Option<PathBuf> = None;
    let mut tcp: Option<String> = None;
    let mut get: Option<String> = None;
    let mut swap_link: Option<PathBuf> = None;
    let (mut grpc, mut grpc_check, mut service) = (false, None, String::new());
    let mut name = String::from("uds-echo");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--socket" => socket = args.next().map(PathBuf::from),
            "--name" => name = args.next().unwrap_or(name),
            "--tcp" => tcp = args.next(),
            "--get" => get = args.next(),
            "--swap-link" => swap_link = args.next().map(PathBuf::from),
            "--grpc" => grpc = true,
            "--grpc-check" => grpc_check = args.next(),
            "--service" => service = args.next().unwrap_or_default(),
            _ => {
                eprintln!(
                    "usage: uds-echo --socket PATH [--swap-link TARGET | --grpc] | --tcp ADDR [--name NAME] | --get URL \
                     | --grpc-check URL [--service S]"
                );
                std::process::exit(2);
            }
        }
    }
    if let Some(url) = get {
        std::process::exit(fetch(&url).await);
    }
    if let Some(url) = grpc_check {
        std::process::exit(grpc_health_check(&url, &service).await);
    }
    if let (Some(addr), None) = (&tcp, &socket) {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let who = Who(format!("{name} over tcp:{}:", listener.local_addr()?));
        eprintln!("uds-echo {name} listening on tcp {addr}");
        return axum::serve(listener, Router::new().fallback(echo).with_state(who)).await;
    }
    let (Some(socket), None) = (socket, tcp) else {
        eprintln!("usage: uds-echo --socket PATH | --tcp ADDR [--name NAME]");
        std::process::exit(2);
    };
    if std::fs::symlink_metadata(&socket).is_ok() {
        std::fs::remove_file(&socket)?;
    }
    let listener = tokio::net::UnixListener::bind(&socket)?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o660))?;
    if grpc {
        return serve_grpc_health(listener, &socket, &name).await;
    }
    let who = Who(format!("{name} over unix:{}:", socket.display()));
    eprintln!("uds-echo {name} listening on {}", socket.display());
    if let Some(target) = swap_link {
        let (link, aside) = (socket.clone(), socket.with_extension("real"));
        eprintln!("uds-echo {name}: swapping {} for a link to {} every 2 ms", link.display(), target.display());
        std::thread::spawn(move || {
            loop {
                if std::fs::rename(&link, &aside).is_ok() {
                    let _ = std::os::unix::fs::symlink(&target, &link);
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
                let _ = std::fs::remove_file(&link);
                let _ = std::fs::rename(&aside, &link);
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        });
    }
    axum::serve(listener, Router::new().fallback(echo).with_state(who)).await
}
