//! `aether-controller verify-install`: proves an installation works, from inside the cluster
//! (the chart's `helm test` Pod and its post-install/post-upgrade startup check Job; the
//! images have no shell, so this is a subcommand of our own binary).
//!
//! Checks, each printed as one line `PASS <check>: <reason>` or `FAIL <check>: <reason>`:
//! 1. **webhook denies an over-budget policy**: a server-side dry run (`dryRun=All`, nothing is
//!    stored) of creating an EndpointPolicy whose `spec.udsSocket` is one byte over the budget
//!    of `--kubelet-pods-dir`/`--socket-limit` (so the CRD schema lets it through) must be
//!    denied by the webhook [`WEBHOOK_NAME`] itself: the API server's message must read
//!    `admission webhook "endpointpolicies.config.aether.io" denied the request`. A schema
//!    denial, a webhook that cannot be called (`failed calling webhook`) or an admission (the
//!    webhook was skipped: failurePolicy Ignore, or a namespaceSelector) fail the check.
//! 2. **webhook admits a valid policy**: the same dry run of a value within the budget must be
//!    admitted.
//! 3. **agent `<pod>`**: every node agent pod (found by `--agent-selector` in
//!    `--agent-namespace`; none found fails) answers `GET /readyz` with 200. The chart's node pod
//!    uses the host network, so its pod IP is its node's IP and the agent's admin port listens
//!    on it (`--agent-access pod-ip`, as Prometheus scrapes it); where a NetworkPolicy or a
//!    host firewall blocks pods from node ports, `--agent-access api-server-proxy` goes through
//!    the API server's pod proxy instead (RBAC: `get pods/proxy`).
//!
//! 4. **DaemonSet `<name>`**: every DaemonSet matching `--daemonset-selector` in
//!    `--agent-namespace` has a pod on each node it should run on
//!    (`status.currentNumberScheduled` = `desiredNumberScheduled`). One that does not fails with
//!    the message of its latest `FailedCreate` Event, the only place the cause appears (a Pod
//!    Security level that forbids the node pods, a ResourceQuota); the agents' check alone would
//!    only see fewer pods.
//!
//! With `--retry-for-seconds N` a failing check is retried with exponential backoff (1 s
//! doubling to 10 s, with jitter; backon) until it passes or N seconds have passed since the
//! start; only each check's final result is printed on stdout, the failed attempts are logged.
//! Exit code: 0 all checks passed, 1 any failed, 2 no Kubernetes client could be configured.
//! The Kubernetes client comes from `kube::Client::try_default`: KUBECONFIG or
//! `~/.kube/config`, else the in-cluster service account.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use aether_crds::udspath::{Budget, NAME_MAX};
use aether_crds::{EndpointPolicy, EndpointPolicySpec, SocketLimit, TargetRef};
use axum::body::Bytes;
use backon::{ExponentialBuilder, Retryable};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use tokio::time::Instant;

use crate::cli::flags::{AgentAccess, VerifyArgs};

/// The webhook's name in the chart's ValidatingWebhookConfiguration: a denial that names it came
/// from our webhook, not from the CRD schema or another webhook.
pub const WEBHOOK_NAME: &str = "endpointpolicies.config.aether.io";

/// Name prefix of the dry-run policies (`metadata.generateName`: no clash with real objects,
/// and nothing is stored).
pub const POLICY_NAME_PREFIX: &str = "aether-verify-install-";

/// The Service the dry-run policies target (it need not exist: the webhook only warns).
pub const TARGET_SERVICE: &str = "aether-verify-install";

/// How long one agent `/readyz` request may take before it counts as failed.
const AGENT_TIMEOUT: Duration = Duration::from_secs(5);

/// One check's final result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// What was checked, e.g. `webhook denies an over-budget policy`.
    pub check: String,
    /// `Ok(reason)` passed, `Err(reason)` failed.
    pub result: Result<String, String>,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.result {
            Ok(why) => write!(f, "PASS {}: {why}", self.check),
            Err(why) => write!(f, "FAIL {}: {why}", self.check),
        }
    }
}

/// A socket value one byte (sun_path limit) or one file byte (file system limit) over `budget`,
/// within the CRD schema's length bound for the same limit, so only the webhook can deny it.
pub fn over_budget_value(budget: &Budget) -> String {
    match budget.limit() {
        SocketLimit::SunPath => format!("v/{}", "s".repeat(budget.bytes() - 1)),
        SocketLimit::Filesystem => format!("v/{}", "s".repeat(NAME_MAX + 1)),
    }
}

/// A socket value within `budget` (`v/verify.sock`, or `a/b` for a budget under 13 bytes).
pub fn valid_value(budget: &Budget) -> String {
    let value = "v/verify.sock";
    if value.len() <= budget.bytes() { value.to_owned() } else { "a/b".to_owned() }
}

/// Classifies the API server's answer to the dry-run create of the over-budget policy:
/// `Ok(denial message)` only for a denial by [`WEBHOOK_NAME`].
pub fn classify_over_budget(answer: Result<(), kube::Error>, namespace: &str) -> Result<String, String> {
    let denied_by_us = format!("admission webhook \"{WEBHOOK_NAME}\" denied the request");
    match answer {
        Ok(()) => Err(format!(
            "admitted: the webhook {WEBHOOK_NAME} did not decide it (failurePolicy Ignore while it is \
             unreachable, or a webhook namespaceSelector that leaves out namespace {namespace:?})"
        )),
        Err(kube::Error::Api(status)) if status.message.contains(&denied_by_us) => Ok(status.message),
        Err(kube::Error::Api(status))
            if status.message.contains(&format!("failed calling webhook \"{WEBHOOK_NAME}\"")) =>
        {
            Err(format!("the API server could not call the webhook: {}", status.message))
        }
        Err(kube::Error::Api(status)) => Err(format!(
            "denied, but not by the webhook {WEBHOOK_NAME} ({} {}): {}",
            status.code, status.reason, status.message
        )),
        Err(e) => Err(format!("the dry-run create failed: {e}")),
    }
}

/// Classifies the API server's answer to the dry-run create of the valid policy.
pub fn classify_valid(answer: Result<(), kube::Error>) -> Result<String, String> {
    match answer {
        Ok(()) => Ok("admitted (dry run)".to_owned()),
        Err(kube::Error::Api(status))
            if status.message.contains(&format!("failed calling webhook \"{WEBHOOK_NAME}\"")) =>
        {
            Err(format!("the API server could not call the webhook: {}", status.message))
        }
        Err(kube::Error::Api(status)) => Err(format!("denied ({} {}): {}", status.code, status.reason, status.message)),
        Err(e) => Err(format!("the dry-run create failed: {e}")),
    }
}

/// Runs `verify-install` to its end and prints one line per check; the exit code as in the
/// module docs.
pub fn run(args: &VerifyArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("verify-install: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(async {
        let budget = match args.pods_dir.rules().budget() {
            Ok(b) => b.clone(),
            Err(e) => {
                eprintln!("verify-install: --kubelet-pods-dir: {e}");
                return ExitCode::from(2);
            }
        };
        let client = match kube::Client::try_default().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("verify-install: no Kubernetes client (KUBECONFIG, ~/.kube/config or in-cluster): {e}");
                return ExitCode::from(2);
            }
        };
        let outcomes = verify(&client, args, &budget).await;
        let passed = outcomes.iter().filter(|o| o.result.is_ok()).count();
        println!("verify-install: {passed} of {} checks passed", outcomes.len());
        if passed == outcomes.len() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
    })
}

/// Runs every check (each retried until `args.retry_for_seconds` have passed since the start)
/// and prints each final line as soon as it is known. Returns the outcomes in order: the two
/// webhook checks, then one per agent pod (or one `agents` failure when none could be listed).
pub async fn verify(client: &kube::Client, args: &VerifyArgs, budget: &Budget) -> Vec<Outcome> {
    let deadline = Instant::now() + Duration::from_secs(args.retry_for_seconds);
    let namespace = args.namespace.clone().unwrap_or_else(|| client.default_namespace().to_owned());
    let agent_namespace = args.agent_namespace.clone().unwrap_or_else(|| client.default_namespace().to_owned());
    let policies: Api<EndpointPolicy> = Api::namespaced(client.clone(), &namespace);
    let mut outcomes = Vec::new();

    let over = over_budget_value(budget);
    let check =
        format!("webhook denies an over-budget policy (udsSocket {} bytes, budget {})", over.len(), budget.bytes());
    let result = retrying(&check, deadline, || async {
        classify_over_budget(dry_run_create(&policies, &over).await, &namespace)
    })
    .await;
    outcomes.push(print(Outcome { check, result }));

    let valid = valid_value(budget);
    let check = format!("webhook admits a valid policy (udsSocket {valid:?})");
    let result = retrying(&check, deadline, || async { classify_valid(dry_run_create(&policies, &valid).await) }).await;
    outcomes.push(print(Outcome { check, result }));

    let pods: Api<Pod> = Api::namespaced(client.clone(), &agent_namespace);
    let agents = retrying("agents", deadline, || async {
        let found = check_agents(client, &pods, args).await?;
        if found.iter().all(|o| o.result.is_ok()) { Ok(found) } else { Err(Failed::Agents(found)) }
    })
    .await;
    match agents {
        Ok(found) => outcomes.extend(found.into_iter().map(print)),
        Err(Failed::Agents(found)) => outcomes.extend(found.into_iter().map(print)),
        Err(Failed::List(why)) => outcomes.push(print(Outcome { check: "agents".to_owned(), result: Err(why) })),
    }
    outcomes
}

/// Why the agents' check failed: listing them, or some agent's `/readyz`.
#[derive(Debug)]
enum Failed {
    /// The pods could not be listed, or none matched.
    List(String),
    /// One outcome per agent pod, at least one failed.
    Agents(Vec<Outcome>),
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failed::List(why) => f.write_str(why),
            Failed::Agents(found) => {
                let failed: Vec<String> = found.iter().filter(|o| o.result.is_err()).map(|o| o.to_string()).collect();
                f.write_str(&failed.join("; "))
            }
        }
    }
}

fn print(outcome: Outcome) -> Outcome {
    println!("{outcome}");
    outcome
}

/// Runs `attempt` until it succeeds or `deadline` passes: exponential backoff from 1 s to 10 s
/// with jitter, each sleep cut to the time left; every failed attempt that will be retried is
/// logged at info with its reason.
async fn retrying<T, E, F, Fut>(what: &str, deadline: Instant, attempt: F) -> Result<T, E>
where
    E: fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let backoff = ExponentialBuilder::new()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(Duration::from_secs(10))
        .with_jitter()
        .without_max_times();
    attempt
        .retry(backoff)
        .adjust(|_, delay| {
            let left = deadline.saturating_duration_since(Instant::now());
            delay.filter(|_| !left.is_zero()).map(|d| d.min(left))
        })
        .notify(|e, delay| {
            tracing::info!(check = what, retry_in_ms = delay.as_millis() as u64, "failed, retrying: {e}")
        })
        .await
}

/// A server-side dry-run create (`dryRun=All`) of a policy with `uds_socket` targeting
/// [`TARGET_SERVICE`].
async fn dry_run_create(policies: &Api<EndpointPolicy>, uds_socket: &str) -> Result<(), kube::Error> {
    let policy = EndpointPolicy {
        metadata: ObjectMeta { generate_name: Some(POLICY_NAME_PREFIX.to_owned()), ..ObjectMeta::default() },
        spec: EndpointPolicySpec {
            target_ref: TargetRef { group: String::new(), kind: "Service".to_owned(), name: TARGET_SERVICE.to_owned() },
            uds_socket: uds_socket.to_owned(),
        },
        status: None,
    };
    let params = PostParams { dry_run: true, field_manager: Some("aether-verify-install".to_owned()) };
    policies.create(&params, &policy).await.map(|_| ())
}

/// One outcome per agent pod matching the selector; `Err` when they cannot be listed or none match.
async fn check_agents(client: &kube::Client, pods: &Api<Pod>, args: &VerifyArgs) -> Result<Vec<Outcome>, Failed> {
    let list = pods
        .list(&ListParams::default().labels(&args.agent_selector))
        .await
        .map_err(|e| Failed::List(format!("cannot list pods {:?}: {e}", args.agent_selector)))?;
    if list.items.is_empty() {
        let daemonsets = check_daemonsets(client, pods.namespace(), &args.daemonset_selector).await?;
        let why: Vec<String> = daemonsets.iter().filter_map(|o| o.result.as_ref().err().cloned()).collect();
        let why = if why.is_empty() { String::new() } else { format!(": {}", why.join("; ")) };
        return Err(Failed::List(format!("no agent pod matches {:?} in this namespace{why}", args.agent_selector)));
    }
    let mut found = check_daemonsets(client, pods.namespace(), &args.daemonset_selector).await?;
    for pod in &list.items {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_else(|| "(unscheduled)".to_owned());
        let check = format!("agent {name} on node {node} /readyz");
        let result = match args.agent_access {
            AgentAccess::PodIp => match pod.status.as_ref().and_then(|s| s.pod_ip.as_deref()) {
                None => Err("the pod has no IP yet".to_owned()),
                Some(ip) => readyz_direct(ip, args.agent_admin_port).await,
            },
            AgentAccess::ApiServerProxy => readyz_proxy(client, pods, &name, args.agent_admin_port).await,
        };
        found.push(Outcome { check, result });
    }
    Ok(found)
}

/// One outcome per DaemonSet matching `selector` in `namespace` (none when `selector` is empty):
/// `Ok` when it has a pod on every node it should run on, else `Err` naming the shortfall and
/// the message of its latest `FailedCreate` Event (none recorded: say so).
async fn check_daemonsets(
    client: &kube::Client,
    namespace: Option<&str>,
    selector: &str,
) -> Result<Vec<Outcome>, Failed> {
    if selector.is_empty() {
        return Ok(Vec::new());
    }
    let namespace = namespace.unwrap_or_else(|| client.default_namespace());
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let list = daemonsets
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|e| Failed::List(format!("cannot list DaemonSets {selector:?}: {e}")))?;
    let mut found = Vec::new();
    for ds in &list.items {
        let name = ds.metadata.name.clone().unwrap_or_default();
        let status = ds.status.clone().unwrap_or_default();
        let (have, want) = (status.current_number_scheduled, status.desired_number_scheduled);
        let check = format!("DaemonSet {name} has a pod on each of its nodes");
        let result = if have >= want {
            Ok(format!("{have} of {want}"))
        } else {
            let cause = match last_failed_create(client, namespace, &name).await {
                Ok(Some(message)) => format!("FailedCreate: {message}"),
                Ok(None) => "no FailedCreate Event recorded".to_owned(),
                Err(e) => format!("its Events cannot be listed: {e}"),
            };
            Err(format!("{have} of {want} pods exist; {cause}"))
        };
        found.push(Outcome { check, result });
    }
    Ok(found)
}

/// The message of the newest `FailedCreate` Event of DaemonSet `name` (the DaemonSet controller
/// records one per refused pod creation), or `None`.
async fn last_failed_create(client: &kube::Client, namespace: &str, name: &str) -> Result<Option<String>, kube::Error> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let fields = format!("involvedObject.kind=DaemonSet,involvedObject.name={name},reason=FailedCreate");
    let list = events.list(&ListParams::default().fields(&fields)).await?;
    let when = |e: &Event| {
        e.last_timestamp
            .as_ref()
            .map(|t| t.0)
            .or(e.event_time.as_ref().map(|t| t.0))
            .or(e.first_timestamp.as_ref().map(|t| t.0))
    };
    Ok(list.items.iter().max_by_key(|e| when(e)).and_then(|e| e.message.clone()))
}

/// `GET http://<ip>:<port>/readyz`: `Ok` for 200, with the first line of the body.
async fn readyz_direct(ip: &str, port: u16) -> Result<String, String> {
    let ip: IpAddr = ip.parse().map_err(|e| format!("pod IP {ip:?}: {e}"))?;
    let url = format!("http://{}/readyz", SocketAddr::new(ip, port));
    let client: HttpClient<_, Empty<Bytes>> = HttpClient::builder(TokioExecutor::new()).build_http();
    let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
    let answer = tokio::time::timeout(AGENT_TIMEOUT, async {
        let response =
            client.get(uri).await.map_err(|e| format!("GET {url}: {}", aether_process::logging::error_chain(&e)))?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(|e| format!("GET {url}: body: {e}"))?.to_bytes();
        Ok::<_, String>((status, body))
    })
    .await
    .map_err(|_| format!("GET {url}: no answer within {} s", AGENT_TIMEOUT.as_secs()))??;
    let (status, body) = answer;
    let first = first_line(&body);
    if status == http::StatusCode::OK {
        Ok(format!("GET {url}: {status} {first}").trim_end().to_owned())
    } else {
        Err(format!("GET {url}: {status} {first}").trim_end().to_owned())
    }
}

/// `GET /readyz` through the API server's pod proxy; `Ok` for 200.
async fn readyz_proxy(client: &kube::Client, pods: &Api<Pod>, name: &str, port: u16) -> Result<String, String> {
    let path = format!("{}/{name}:{port}/proxy/readyz", pods.resource_url());
    let request = http::Request::get(&path).body(Vec::new()).map_err(|e| format!("GET {path}: {e}"))?;
    match tokio::time::timeout(AGENT_TIMEOUT, client.request_text(request)).await {
        Err(_) => Err(format!("GET {path}: no answer within {} s", AGENT_TIMEOUT.as_secs())),
        Ok(Ok(body)) => Ok(format!("GET {path}: 200 OK {}", first_line(body.as_bytes())).trim_end().to_owned()),
        Ok(Err(kube::Error::Api(status))) => Err(format!("GET {path}: {} {}", status.code, status.message)),
        Ok(Err(e)) => Err(format!("GET {path}: {e}")),
    }
}

/// The first line of a body, at most 200 bytes, lossily decoded.
fn first_line(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    text.lines().next().unwrap_or("").chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use aether_crds::Rules;

    use super::*;

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(kube::core::Status::failure(message, reason).with_code(code).boxed())
    }

    fn policy(value: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "config.aether.io/v1", "kind": "EndpointPolicy",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"targetRef": {"group": "", "kind": "Service", "name": TARGET_SERVICE}, "udsSocket": value},
        })
    }

    #[test]
    fn the_over_budget_value_is_denied_and_the_valid_one_allowed_by_the_webhooks_rules() {
        let dirs = [
            "/var/lib/kubelet/pods",
            "/k",
            "/var/lib/k0s/kubelet/pods",
            "/var/snap/microk8s/common/var/lib/kubelet/pods",
        ];
        for limit in [SocketLimit::SunPath, SocketLimit::Filesystem] {
            for dir in dirs {
                let rules = Rules::with_limit(dir, limit);
                let Ok(budget) = rules.budget() else {
                    assert_eq!(limit, SocketLimit::SunPath, "{dir}: only sun_path can leave no budget");
                    continue;
                };
                let over = over_budget_value(budget);
                let verdict = rules.review(&policy(&over)).unwrap();
                assert!(verdict.message().is_some(), "{dir} {limit:?}: {over} ({} bytes) was allowed", over.len());
                let valid = valid_value(budget);
                assert_eq!(rules.review(&policy(&valid)).unwrap().message(), None, "{dir} {limit:?}: {valid}");
            }
        }
    }

    #[test]
    fn the_over_budget_value_fits_the_crd_schemas_length_bound_so_only_the_webhook_can_deny_it() {
        // The CRD's maxLength per limit (aether-crds chart socketLimit): 36 (sunPath), 319 (filesystem).
        let sun = Budget::new("/var/lib/kubelet/pods").unwrap();
        assert_eq!(over_budget_value(&sun).len(), sun.bytes() + 1);
        assert!(over_budget_value(&sun).len() <= 36);
        let fs = Budget::with_limit("/var/lib/kubelet/pods", SocketLimit::Filesystem).unwrap();
        assert!(over_budget_value(&fs).len() <= aether_crds::udspath::FILESYSTEM_VALUE_MAX);
    }

    #[test]
    fn only_a_denial_naming_our_webhook_passes_the_over_budget_check() {
        let denied = format!(
            "admission webhook \"{WEBHOOK_NAME}\" denied the request: spec.udsSocket: \"v/sssssssssssssss\" is 17 bytes"
        );
        assert_eq!(classify_over_budget(Err(api_error(403, "Forbidden", &denied)), "ns"), Ok(denied));
        let unreachable = format!(
            "Internal error occurred: failed calling webhook \"{WEBHOOK_NAME}\": failed to call webhook: Post \"https://aether-controller.aether-system.svc:443/validate?timeout=5s\": no endpoints available"
        );
        let why = classify_over_budget(Err(api_error(500, "InternalError", &unreachable)), "ns").unwrap_err();
        assert!(why.starts_with("the API server could not call the webhook: Internal error"), "{why}");
        let schema =
            "EndpointPolicy.config.aether.io \"x\" is invalid: spec.udsSocket: Too long: may not be more than 36 bytes";
        let why = classify_over_budget(Err(api_error(422, "Invalid", schema)), "ns").unwrap_err();
        assert!(why.starts_with(&format!("denied, but not by the webhook {WEBHOOK_NAME} (422 Invalid)")), "{why}");
        let other = "admission webhook \"other.example.com\" denied the request: no";
        assert!(classify_over_budget(Err(api_error(403, "Forbidden", other)), "ns").is_err());
        let why = classify_over_budget(Ok(()), "team-a").unwrap_err();
        assert!(why.starts_with("admitted: ") && why.contains("\"team-a\""), "{why}");
    }

    #[test]
    fn the_valid_check_passes_only_on_admission() {
        assert!(classify_valid(Ok(())).is_ok());
        let why = classify_valid(Err(api_error(403, "Forbidden", "denied"))).unwrap_err();
        assert_eq!(why, "denied (403 Forbidden): denied");
        let unreachable = format!("Internal error occurred: failed calling webhook \"{WEBHOOK_NAME}\": x509");
        let why = classify_valid(Err(api_error(500, "InternalError", &unreachable))).unwrap_err();
        assert_eq!(why, format!("the API server could not call the webhook: {unreachable}"));
    }

    #[test]
    fn outcome_lines_start_with_pass_or_fail_and_name_the_check() {
        let ok = Outcome { check: "c".into(), result: Ok("fine".into()) };
        let bad = Outcome { check: "c".into(), result: Err("broken".into()) };
        assert_eq!((ok.to_string(), bad.to_string()), ("PASS c: fine".into(), "FAIL c: broken".into()));
    }

    #[tokio::test]
    async fn readyz_direct_passes_on_200_and_fails_on_503_or_a_closed_port_naming_the_url() {
        use axum::{Router, http::StatusCode, routing::get};
        for (code, pass) in [(StatusCode::OK, true), (StatusCode::SERVICE_UNAVAILABLE, false)] {
            let app = Router::new().route("/readyz", get(move || async move { (code, "envoy: connected\nmore") }));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let server = tokio::spawn(async move { axum::serve(listener, app).await });
            let result = readyz_direct("127.0.0.1", port).await;
            let line = result.clone().unwrap_or_else(|e| e);
            assert_eq!(result.is_ok(), pass, "{line}");
            assert_eq!(line, format!("GET http://127.0.0.1:{port}/readyz: {code} envoy: connected"));
            server.abort();
        }
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let why = readyz_direct("127.0.0.1", port).await.unwrap_err();
        assert!(why.starts_with(&format!("GET http://127.0.0.1:{port}/readyz: ")) && why.contains("refused"), "{why}");
    }

    #[tokio::test]
    async fn retrying_stops_at_the_deadline_and_zero_seconds_means_once() {
        // 2 s: a try at 0, one after the first 1-2 s delay, maybe one more at the deadline.
        for (seconds, at_least, at_most) in [(0, 1, 1), (2, 2, 3)] {
            let deadline = Instant::now() + Duration::from_secs(seconds);
            let mut tries = 0;
            let result: Result<(), String> = retrying("t", deadline, || {
                tries += 1;
                async { Err("no".to_owned()) }
            })
            .await;
            assert_eq!(result, Err("no".to_owned()));
            assert!((at_least..=at_most).contains(&tries), "{seconds} s: {tries} tries");
        }
        let mut tries = 0;
        let result = retrying("t", Instant::now() + Duration::from_secs(60), || {
            tries += 1;
            let n = tries;
            async move { if n < 2 { Err("not yet".to_owned()) } else { Ok(n) } }
        })
        .await;
        assert_eq!(result, Ok(2));
    }
}
