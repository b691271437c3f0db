//! Pod network namespaces from the container runtime, over CRI (docs/reference.md,
//! "`aether-agent`: the node side": TCP delivery dials the pod inside its network namespace).
//!
//! A TCP-delivered pod is reached at `127.0.0.1:<port>` *inside its network namespace*, and an
//! inbound listener is bound in that namespace: Envoy needs the path of the pod's netns
//! (`network_namespace_filepath`). The Kubernetes API does not carry it; the node's container
//! runtime does. This module asks the runtime's CRI endpoint (`--cri-endpoint`, containerd's
//! socket by default) and turns its answer into a path Envoy may open.
//!
//! - [`cri`]: the CRI client. `ListPodSandbox` (label `io.kubernetes.pod.uid`, state
//!   `SANDBOX_READY`, newest `created_at` wins), then `PodSandboxStatus { verbose: true }`.
//!   Connects lazily and again after the runtime restarts; every call is bounded by
//!   [`CONNECT_TIMEOUT`] and [`CALL_TIMEOUT`].
//! - [`error`]: [`RuntimeError`], what went wrong, for every part below.
//! - [`netns`]: pure. Reads the netns path out of the runtime's verbose info, and checks and
//!   translates it ([`NetnsDirs::translate`]): only a file directly inside `--netns-host-dir` with
//!   a plain name becomes a [`NetnsPath`], re-rooted at `--netns-proxy-dir`. A runtime-supplied
//!   path is never handed to Envoy as is.
//! - [`lookup`]: the asynchronous cache front the driver uses: [`NetnsLookup::request`] never
//!   blocks, a worker resolves, answers come back on a channel.
//!
//! # What it needs
//!
//! Read and write access to the CRI socket (`connect(2)` on a Unix socket needs write
//! permission). **The CRI socket is root-equivalent on the node**: whoever can talk to it can run
//! a privileged container. The agent only calls `ListPodSandbox` and `PodSandboxStatus`; the chart
//! is to mount the socket's *directory* read-only (a read-only bind mount still allows
//! `connect(2)`) and nothing else of the runtime. The netns files themselves are opened by Envoy,
//! not by the agent: the proxy container mounts the host's netns dir (`/run/netns`) at
//! `--netns-proxy-dir` (the same path by default).
//!
//! # Why CRI and not `/proc`
//!
//! `/proc/<pid>/ns/net` of the pod's pause process names the same namespace, but reading that link
//! for another user's process needs the host PID namespace *and* `CAP_SYS_PTRACE` (ptrace access
//! mode checks), and the PID would still have to be found from the pod UID (cgroup paths that
//! differ per runtime and cgroup driver). The runtime already maps pod UID → sandbox → netns
//! path, and the path it reports is a bind-mounted file under `/run/netns` that stays valid for
//! the sandbox's life (a `/proc` path dies with the process and is recycled with its PID).
//!
//! # What is relied on in the runtime's answer
//!
//! Only `PodSandboxStatusResponse.info["info"]`, a JSON string, and in it
//! `runtimeSpec.linux.namespaces[]`: the entry with `"type": "network"` and its `"path"` (the OCI
//! runtime spec of the sandbox). Seen on containerd 1.6.20 (the real node of `tests/harness`);
//! containerd 1.7 and 2.x (CRI `podsandbox` controller) and CRI-O put the sandbox's OCI spec under
//! the same key in their verbose info. A host-network pod is recognised by the CRI status itself
//! (`linux.namespaces.options.network == NODE`) or by a spec without a network namespace path.
//! Any other shape is an error, never a guess.
//!
//! # Wiring
//!
//! `agent::run` builds a [`CriClient`] unless `--cri-endpoint` is empty (no I/O: the first lookup
//! connects) and spawns a [`NetnsLookup`]; its answers are forwarded to the driver as
//! `Event::Netns`. The driver keeps a [`PodNetns`]: it asks when a pod appears or its IPs change
//! (a new sandbox), and on the periodic re-check for pods whose lookup failed, after a growing
//! per-pod delay (one probe while the runtime is unreachable); never per publish, and it never
//! awaits the runtime. An answer `Some(path)` makes TCP delivery
//! dial `127.0.0.1:<port>` inside that netns; `None` (no ready sandbox, host network) falls back
//! to a `--cni-records-dir` record, else the pod IP; an error keeps what was known. A deleted pod
//! is forgotten. Static (mirror) pods: the sandbox carries kubelet's UID (the
//! `kubernetes.io/config.mirror` hash), not the API UID, so the API UID finds nothing (`None`)
//! and they are dialled at their IP.

pub mod cri;
pub mod error;
pub mod lookup;
pub mod netns;
pub mod pod_netns;

pub use cri::{CALL_TIMEOUT, CONNECT_TIMEOUT, CriClient, CriEndpoint, DEFAULT_CRI_ENDPOINT};
pub use error::RuntimeError;
pub use lookup::{LOOKUP_QUEUE, NetnsLookup, NetnsSource, NetnsUpdate, Requested};
pub use netns::{DEFAULT_NETNS_DIR, NetnsDirs, NetnsPath, sandbox_netns};
pub use pod_netns::PodNetns;
