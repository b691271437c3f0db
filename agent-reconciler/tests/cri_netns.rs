//! The CRI client of `aether_agent_reconciler::runtime` against a CRI server on a Unix socket:
//! a fake `RuntimeService` (tonic, the crate's generated server) for the claims, and, ignored by
//! default, the real containerd of `tests/harness/node.sh`:
//!
//! ```text
//! tests/harness/node.sh up DIR && . DIR/env
//! kubectl run netns-probe --image=localhost/aether/uds-echo:dev --image-pull-policy=Never -- --tcp 0.0.0.0:8080
//! AETHER_TEST_POD_UID=$(kubectl get pod netns-probe -o jsonpath='{.metadata.uid}') \
//! AETHER_TEST_POD_IP=$(kubectl get pod netns-probe -o jsonpath='{.status.podIP}') \
//!   cargo test -p aether-agent-reconciler --test cri_netns -- --ignored --nocapture
//! tests/harness/node.sh down DIR
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aether_agent_reconciler::runtime::{CALL_TIMEOUT, CriClient, NetnsDirs, RuntimeError};
use k8s_cri::v1::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use k8s_cri::v1::*;
use tokio::net::UnixListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
const LABEL: &str = "io.kubernetes.pod.uid";

/// What the fake runtime answers, and what it was asked.
#[derive(Default)]
struct State {
    sandboxes: Vec<PodSandbox>,
    /// Verbose info JSON (`info["info"]`) per sandbox ID.
    info: HashMap<String, String>,
    host_network: bool,
    delay: Duration,
    list_requests: Vec<ListPodSandboxRequest>,
    status_requests: Vec<PodSandboxStatusRequest>,
}

#[derive(Clone, Default)]
struct Fake(Arc<Mutex<State>>);

fn spec_with_netns(path: &str) -> String {
    format!(
        r#"{{"pid": 4242, "processStatus": "running", "netNamespaceClosed": false,
            "runtimeSpec": {{"ociVersion": "1.0.2-dev", "linux": {{"namespaces": [
              {{"type": "pid"}}, {{"type": "ipc"}}, {{"type": "uts"}}, {{"type": "mount"}},
              {{"type": "network", "path": "{path}"}}]}}}}}}"#
    )
}

fn sandbox(id: &str, uid: &str, created_at: i64) -> PodSandbox {
    PodSandbox {
        id: id.to_owned(),
        state: PodSandboxState::SandboxReady as i32,
        created_at,
        labels: HashMap::from([(LABEL.to_owned(), uid.to_owned())]),
        ..Default::default()
    }
}

/// The two calls the client makes; every other RPC answers UNIMPLEMENTED.
macro_rules! fake_runtime {
    ($($name:ident($req:ident) -> $resp:ident;)*) => {
        #[tonic::async_trait]
        impl RuntimeService for Fake {
            type GetContainerEventsStream = tokio_stream::Empty<Result<ContainerEventResponse, Status>>;

            async fn list_pod_sandbox(
                &self,
                request: Request<ListPodSandboxRequest>,
            ) -> Result<Response<ListPodSandboxResponse>, Status> {
                let (items, delay) = {
                    let mut s = self.0.lock().unwrap();
                    s.list_requests.push(request.into_inner());
                    (s.sandboxes.clone(), s.delay)
                };
                tokio::time::sleep(delay).await;
                Ok(Response::new(ListPodSandboxResponse { items }))
            }

            async fn pod_sandbox_status(
                &self,
                request: Request<PodSandboxStatusRequest>,
            ) -> Result<Response<PodSandboxStatusResponse>, Status> {
                let mut s = self.0.lock().unwrap();
                let request = request.into_inner();
                let info = s.info.get(&request.pod_sandbox_id).cloned();
                let mode = if s.host_network { NamespaceMode::Node } else { NamespaceMode::Pod };
                s.status_requests.push(request);
                Ok(Response::new(PodSandboxStatusResponse {
                    status: Some(PodSandboxStatus {
                        linux: Some(LinuxPodSandboxStatus {
                            namespaces: Some(Namespace {
                                options: Some(NamespaceOption { network: mode as i32, ..Default::default() }),
                            }),
                        }),
                        ..Default::default()
                    }),
                    info: info.map(|i| HashMap::from([("info".to_owned(), i)])).unwrap_or_default(),
                    ..Default::default()
                }))
            }

            async fn get_container_events(
                &self,
                _: Request<GetEventsRequest>,
            ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
                Err(Status::unimplemented("get_container_events"))
            }

            $(
                async fn $name(&self, _: Request<$req>) -> Result<Response<$resp>, Status> {
                    Err(Status::unimplemented(stringify!($name)))
                }
            )*
        }
    };
}

fake_runtime! {
    version(VersionRequest) -> VersionResponse;
    run_pod_sandbox(RunPodSandboxRequest) -> RunPodSandboxResponse;
    stop_pod_sandbox(StopPodSandboxRequest) -> StopPodSandboxResponse;
    remove_pod_sandbox(RemovePodSandboxRequest) -> RemovePodSandboxResponse;
    create_container(CreateContainerRequest) -> CreateContainerResponse;
    start_container(StartContainerRequest) -> StartContainerResponse;
    stop_container(StopContainerRequest) -> StopContainerResponse;
    remove_container(RemoveContainerRequest) -> RemoveContainerResponse;
    list_containers(ListContainersRequest) -> ListContainersResponse;
    container_status(ContainerStatusRequest) -> ContainerStatusResponse;
    update_container_resources(UpdateContainerResourcesRequest) -> UpdateContainerResourcesResponse;
    reopen_container_log(ReopenContainerLogRequest) -> ReopenContainerLogResponse;
    exec_sync(ExecSyncRequest) -> ExecSyncResponse;
    exec(ExecRequest) -> ExecResponse;
    attach(AttachRequest) -> AttachResponse;
    port_forward(PortForwardRequest) -> PortForwardResponse;
    container_stats(ContainerStatsRequest) -> ContainerStatsResponse;
    list_container_stats(ListContainerStatsRequest) -> ListContainerStatsResponse;
    pod_sandbox_stats(PodSandboxStatsRequest) -> PodSandboxStatsResponse;
    list_pod_sandbox_stats(ListPodSandboxStatsRequest) -> ListPodSandboxStatsResponse;
    update_runtime_config(UpdateRuntimeConfigRequest) -> UpdateRuntimeConfigResponse;
    status(StatusRequest) -> StatusResponse;
    checkpoint_container(CheckpointContainerRequest) -> CheckpointContainerResponse;
    list_metric_descriptors(ListMetricDescriptorsRequest) -> ListMetricDescriptorsResponse;
    list_pod_sandbox_metrics(ListPodSandboxMetricsRequest) -> ListPodSandboxMetricsResponse;
    runtime_config(RuntimeConfigRequest) -> RuntimeConfigResponse;
}

/// Serves `fake` on `socket` until the returned task is aborted (a runtime crash: the socket's
/// connections die with it).
fn serve(fake: &Fake, socket: &Path) -> JoinHandle<()> {
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket).unwrap();
    let service = RuntimeServiceServer::new(fake.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await
            .unwrap();
    })
}

fn socket_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("cri.sock")
}

#[tokio::test]
async fn the_pods_ready_sandboxes_are_asked_for_and_the_newest_ones_netns_is_translated() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::default();
    {
        let mut s = fake.0.lock().unwrap();
        s.sandboxes = vec![sandbox("old", UID, 100), sandbox("new", UID, 200)];
        s.info.insert("old".into(), spec_with_netns("/var/run/netns/cni-old"));
        s.info.insert("new".into(), spec_with_netns("/var/run/netns/cni-new"));
    }
    let server = serve(&fake, &socket_in(&dir));
    let dirs = NetnsDirs::new(Path::new("/run/netns"), Some(Path::new("/host/netns"))).unwrap();
    let client = CriClient::new(socket_in(&dir), dirs);

    let netns = client.netns_of(UID).await.unwrap().expect("a netns");
    assert_eq!(netns.as_str(), "/host/netns/cni-new");

    let s = fake.0.lock().unwrap();
    let filter = s.list_requests[0].filter.as_ref().expect("a filter");
    assert_eq!(filter.label_selector, HashMap::from([(LABEL.to_owned(), UID.to_owned())]));
    assert_eq!(filter.state.as_ref().map(|v| v.state), Some(PodSandboxState::SandboxReady as i32));
    assert_eq!(s.status_requests.len(), 1);
    assert_eq!(s.status_requests[0].pod_sandbox_id, "new");
    assert!(s.status_requests[0].verbose, "the netns path is only in the verbose info");
    server.abort();
}

#[tokio::test]
async fn no_sandbox_or_host_network_is_none_and_a_path_outside_the_netns_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::default();
    let server = serve(&fake, &socket_in(&dir));
    let client = CriClient::new(socket_in(&dir), NetnsDirs::default());

    assert_eq!(client.netns_of(UID).await.unwrap(), None, "no sandbox yet");

    fake.0.lock().unwrap().sandboxes = vec![sandbox("sb", UID, 1)];
    fake.0.lock().unwrap().info.insert("sb".into(), spec_with_netns("/var/run/netns/cni-1"));
    fake.0.lock().unwrap().host_network = true;
    assert_eq!(client.netns_of(UID).await.unwrap(), None, "hostNetwork: the CRI status says NODE");

    fake.0.lock().unwrap().host_network = false;
    assert_eq!(client.netns_of(UID).await.unwrap().unwrap().as_str(), "/run/netns/cni-1");

    for evil in ["/proc/1/ns/net", "/run/netns/../../etc/shadow", "/run/netns/x y"] {
        fake.0.lock().unwrap().info.insert("sb".into(), spec_with_netns(evil));
        match client.netns_of(UID).await {
            Err(e @ RuntimeError::UnsafePath { .. }) => assert!(e.to_string().contains(evil), "{e}"),
            other => panic!("{evil}: expected a refusal, got {other:?}"),
        }
    }

    fake.0.lock().unwrap().info.remove("sb");
    let e = client.netns_of(UID).await.unwrap_err();
    assert!(matches!(e, RuntimeError::VerboseInfo { .. }) && e.to_string().contains("sb"), "{e}");
    server.abort();
}

#[tokio::test]
async fn a_runtime_down_at_start_is_picked_up_later_and_again_after_it_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let fake = Fake::default();
    fake.0.lock().unwrap().sandboxes = vec![sandbox("sb", UID, 1)];
    fake.0.lock().unwrap().info.insert("sb".into(), spec_with_netns("/run/netns/cni-1"));
    let client = CriClient::new(&socket, NetnsDirs::default());

    let e = client.netns_of(UID).await.unwrap_err();
    assert!(matches!(e, RuntimeError::Connect { .. }), "{e}");
    assert!(e.to_string().contains(&socket.display().to_string()), "the error names the endpoint: {e}");

    let server = serve(&fake, &socket);
    assert_eq!(client.netns_of(UID).await.unwrap().unwrap().as_str(), "/run/netns/cni-1");

    // The runtime crashes and comes back on the same path: a few lookups at most fail.
    server.abort();
    let _ = server.await;
    let _restarted = serve(&fake, &socket);
    let mut answers = Vec::new();
    for _ in 0..5 {
        let r = client.netns_of(UID).await;
        let ok = r.is_ok();
        answers.push(r);
        if ok {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let last = answers.last().unwrap();
    assert_eq!(last.as_ref().unwrap().as_ref().unwrap().as_str(), "/run/netns/cni-1", "{answers:?}");
}

#[tokio::test]
async fn a_slow_runtime_is_cut_off_by_the_call_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::default();
    fake.0.lock().unwrap().delay = Duration::from_secs(30);
    let server = serve(&fake, &socket_in(&dir));
    let client = CriClient::new(socket_in(&dir), NetnsDirs::default());
    let t0 = Instant::now();
    let e = client.netns_of(UID).await.unwrap_err();
    let took = t0.elapsed();
    assert!(matches!(e, RuntimeError::Timeout { call: "ListPodSandbox", .. }), "{e}");
    assert!(took >= CALL_TIMEOUT - Duration::from_millis(100) && took < CALL_TIMEOUT * 3, "{took:?}");
    server.abort();
}

/// The real node's containerd (see the file's docs). Prints what it saw.
#[tokio::test]
#[ignore = "needs a real node: tests/harness/node.sh up DIR, a pod, AETHER_CONTAINERD_SOCK and AETHER_TEST_POD_UID"]
async fn real_containerd_reports_the_pods_netns() {
    use std::os::unix::fs::MetadataExt;

    let socket = std::env::var("AETHER_CONTAINERD_SOCK").expect("AETHER_CONTAINERD_SOCK (. DIR/env)");
    let uid = std::env::var("AETHER_TEST_POD_UID").expect("AETHER_TEST_POD_UID");
    let client = CriClient::new(&socket, NetnsDirs::default());

    // What the runtime says, raw: the verbose info this module reads.
    let channel = tonic::transport::Endpoint::from_static("http://cri.invalid")
        .connect_with_connector(tower::service_fn({
            let socket = socket.clone();
            move |_: tonic::transport::Uri| {
                let socket = socket.clone();
                async move {
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                        tokio::net::UnixStream::connect(socket).await?,
                    ))
                }
            }
        }))
        .await
        .unwrap();
    let mut raw = k8s_cri::v1::runtime_service_client::RuntimeServiceClient::new(channel);
    let version = raw.version(VersionRequest::default()).await.unwrap().into_inner();
    println!("runtime: {} {} (CRI {})", version.runtime_name, version.runtime_version, version.runtime_api_version);
    let items = raw
        .list_pod_sandbox(ListPodSandboxRequest {
            filter: Some(PodSandboxFilter {
                label_selector: HashMap::from([(LABEL.to_owned(), uid.clone())]),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .items;
    for s in &items {
        println!("sandbox {} state {} created_at {}", s.id, s.state, s.created_at);
    }
    let newest = items.iter().max_by_key(|s| s.created_at).expect("a sandbox for the pod");
    let status = raw
        .pod_sandbox_status(PodSandboxStatusRequest { pod_sandbox_id: newest.id.clone(), verbose: true })
        .await
        .unwrap()
        .into_inner();
    println!("info keys: {:?}", status.info.keys().collect::<Vec<_>>());
    let info: serde_json::Value = serde_json::from_str(&status.info["info"]).unwrap();
    let top: Vec<&String> = info.as_object().unwrap().keys().collect();
    println!("info[\"info\"] top-level keys: {top:?}");
    println!("runtimeSpec.ociVersion: {}", info["runtimeSpec"]["ociVersion"]);
    println!("runtimeSpec.linux.namespaces: {}", info["runtimeSpec"]["linux"]["namespaces"]);
    println!("pid: {}", info["pid"]);

    let netns = client.netns_of(&uid).await.expect("netns_of").expect("a netns path");
    println!("netns_of({uid}) = {netns}");
    assert!(netns.as_str().starts_with("/run/netns/cni-"), "{netns}");
    let file = std::fs::metadata(netns.as_str()).expect("the netns file exists");
    let pid = info["pid"].as_u64().expect("the sandbox pid");
    let proc_ns = std::fs::metadata(format!("/proc/{pid}/ns/net")).unwrap();
    println!(
        "stat -L {netns}: dev {} ino {}; /proc/{pid}/ns/net: dev {} ino {}",
        file.dev(),
        file.ino(),
        proc_ns.dev(),
        proc_ns.ino()
    );
    assert_eq!((file.dev(), file.ino()), (proc_ns.dev(), proc_ns.ino()), "the same network namespace");

    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={netns}"))
        .args(["ip", "-4", "-o", "addr", "show"])
        .output()
        .expect("nsenter");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("nsenter --net={netns} ip -4 -o addr show:\n{text}");
    if let Ok(ip) = std::env::var("AETHER_TEST_POD_IP") {
        assert!(text.contains(&format!("inet {ip}/")), "the pod IP {ip} is in that namespace");
    }
}
