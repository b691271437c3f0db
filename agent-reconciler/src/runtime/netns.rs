//! Pure: the netns path in a sandbox's verbose info, and the rules a runtime-supplied path must
//! pass before Envoy may open it.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use super::error::RuntimeError;

/// The default of `--netns-host-dir`: where containerd (and CRI-O) pin pod network namespaces.
pub const DEFAULT_NETNS_DIR: &str = "/run/netns";

/// The most bytes a netns file name may have (`NAME_MAX`).
const MAX_NAME_BYTES: usize = 255;

/// The key of `PodSandboxStatusResponse.info` holding the runtime's JSON (containerd, CRI-O).
pub const INFO_KEY: &str = "info";

/// A pod's network namespace as the proxy opens it: a file directly inside `--netns-proxy-dir`
/// with a plain name. Only [`NetnsDirs::translate`] makes one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetnsPath(String);

impl NetnsPath {
    /// The path, for `network_namespace_filepath`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path, owned.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for NetnsPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<Path> for NetnsPath {
    fn as_ref(&self) -> &Path {
        Path::new(&self.0)
    }
}

/// Where pod network namespaces are on the host, and where the proxy container sees that dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetnsDirs {
    /// Normalised (`/var/run/` → `/run/`), absolute, no trailing `/`.
    host: String,
    /// Absolute, no trailing `/`.
    proxy: String,
}

impl Default for NetnsDirs {
    fn default() -> Self {
        NetnsDirs { host: DEFAULT_NETNS_DIR.to_owned(), proxy: DEFAULT_NETNS_DIR.to_owned() }
    }
}

impl NetnsDirs {
    /// `--netns-host-dir` and `--netns-proxy-dir` (`None`: the host dir as spelled, since the
    /// proxy mounts it at the same path). Each must be absolute, valid UTF-8, with no `.`/`..`
    /// component and no NUL.
    pub fn new(host: &Path, proxy: Option<&Path>) -> Result<Self, RuntimeError> {
        let host_as_given = check_dir("--netns-host-dir", host)?;
        let proxy = match proxy {
            Some(p) => check_dir("--netns-proxy-dir", p)?,
            None => host_as_given.clone(),
        };
        Ok(NetnsDirs { host: normalise_run(&host_as_given), proxy })
    }

    /// The host dir (normalised: `/var/run/...` is `/run/...`).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The dir as the proxy sees it.
    pub fn proxy(&self) -> &str {
        &self.proxy
    }

    /// The path the proxy opens for the netns file the runtime reported at `host_path`.
    ///
    /// Rules, in order (each refusal names the path and the rule):
    /// 1. an absolute path without NUL;
    /// 2. `/var/run/` is read as `/run/` (on every current distribution `/var/run` is a link to
    ///    `/run`; containerd and CRI-O report either);
    /// 3. directly inside the host dir: nothing between the dir and the file name;
    /// 4. a file name of 1 to 255 bytes from `[A-Za-z0-9._-]`, not `.` or `..`.
    ///
    /// The result is the proxy dir joined with that file name.
    pub fn translate(&self, host_path: &str) -> Result<NetnsPath, RuntimeError> {
        let refuse = |rule: String| RuntimeError::UnsafePath { path: host_path.to_owned(), rule };
        if host_path.contains('\0') {
            return Err(refuse("contains a NUL byte".into()));
        }
        if !host_path.starts_with('/') {
            return Err(refuse("not an absolute path".into()));
        }
        let path = normalise_run(host_path);
        let name = file_in(&path, &self.host, "--netns-host-dir").map_err(refuse)?;
        Ok(NetnsPath(format!("{}/{name}", self.proxy)))
    }

    /// Checks a netns path as the proxy sees it that did not come from the runtime just now: one
    /// the agent served before a restart (its state dir) or a CNI record gave. The same rules as
    /// [`NetnsDirs::translate`] apply: for a served path, directly inside the proxy dir
    /// (`--netns-proxy-dir`, else `--netns-host-dir`) with a plain file name; a CNI record's path
    /// is a host path and goes through [`NetnsDirs::translate`] itself.
    ///
    /// # Errors
    /// [`RuntimeError::UnsafePath`] naming the path and the rule, e.g. for `/proc/1/ns/net`.
    pub fn served(&self, proxy_path: &str) -> Result<NetnsPath, RuntimeError> {
        let refuse = |rule: String| RuntimeError::UnsafePath { path: proxy_path.to_owned(), rule };
        if proxy_path.contains('\0') {
            return Err(refuse("contains a NUL byte".into()));
        }
        file_in(proxy_path, &self.proxy, "the proxy's netns dir").map_err(refuse)?;
        Ok(NetnsPath(proxy_path.to_owned()))
    }
}

/// The file name of `path` when it is directly inside `dir` (named `dir_label` in the error) and
/// passes [`check_name`]; the error is the rule broken.
fn file_in<'a>(path: &'a str, dir: &str, dir_label: &str) -> Result<&'a str, String> {
    let name = path
        .strip_prefix(dir)
        .and_then(|rest| rest.strip_prefix('/'))
        .ok_or_else(|| format!("not inside {dir_label} {dir}"))?;
    if name.contains('/') {
        return Err(format!("not directly inside {dir_label} {dir} (a subdirectory)"));
    }
    check_name(name)?;
    Ok(name)
}

/// The file-name rule of a netns path: 1 to [`MAX_NAME_BYTES`] bytes from `[A-Za-z0-9._-]`, not
/// `.` or `..`; the error is the rule broken.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(format!("file name must have 1 to {MAX_NAME_BYTES} bytes"));
    }
    if name == "." || name == ".." {
        return Err("file name is . or ..".into());
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(format!("file name has {c:?}: only [A-Za-z0-9._-] is allowed"));
    }
    Ok(())
}

/// Checks a dir flag; returns it as a string without repeated or trailing `/`. The root itself
/// is refused.
fn check_dir(flag: &'static str, dir: &Path) -> Result<String, RuntimeError> {
    let shown = dir.to_string_lossy().into_owned();
    let bad = |reason: &'static str| RuntimeError::Dir { flag, dir: shown.clone(), reason };
    let s = dir.to_str().ok_or_else(|| bad("not valid UTF-8"))?;
    if s.contains('\0') {
        return Err(bad("contains a NUL byte"));
    }
    if !s.starts_with('/') {
        return Err(bad("not an absolute path"));
    }
    // By string: `Path::components` drops inner `.` components silently.
    if s.split('/').any(|part| part == "." || part == "..") {
        return Err(bad("has a . or .. component"));
    }
    let trimmed = s.trim_end_matches('/');
    if trimmed.is_empty() {
        return Err(bad("is the root directory"));
    }
    // Collapse repeated slashes so the prefix test in `translate` compares like with like.
    let mut out = String::with_capacity(trimmed.len());
    for part in trimmed.split('/').filter(|p| !p.is_empty()) {
        out.push('/');
        out.push_str(part);
    }
    Ok(out)
}

/// `/var/run` and `/var/run/...` read as `/run` and `/run/...`.
fn normalise_run(path: &str) -> String {
    match path.strip_prefix("/var/run") {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("/run{rest}"),
        _ => path.to_owned(),
    }
}

/// The parts of the runtime's verbose info this module reads. Unknown fields are skipped.
#[derive(serde::Deserialize)]
struct VerboseInfo {
    #[serde(rename = "runtimeSpec")]
    runtime_spec: Option<RuntimeSpec>,
}

#[derive(serde::Deserialize)]
struct RuntimeSpec {
    linux: Option<LinuxSpec>,
}

#[derive(serde::Deserialize)]
struct LinuxSpec {
    namespaces: Option<Vec<NamespaceSpec>>,
}

#[derive(serde::Deserialize)]
struct NamespaceSpec {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    path: Option<String>,
}

/// The host path of the sandbox's network namespace, from `PodSandboxStatusResponse.info`
/// (verbose): `info["info"]` is JSON whose `runtimeSpec.linux.namespaces[]` entry of type
/// `network` has the `path`.
///
/// `Ok(None)`: the sandbox has no network namespace of its own at a path (no `network` entry: the
/// pod shares the host's; or an entry without a path). `Err`: the info is missing or not this
/// shape (`sandbox` names the sandbox in the error).
pub fn sandbox_netns(sandbox: &str, info: &HashMap<String, String>) -> Result<Option<String>, RuntimeError> {
    let err = |detail: String| RuntimeError::VerboseInfo { sandbox: sandbox.to_owned(), detail };
    let json = info.get(INFO_KEY).ok_or_else(|| {
        let mut keys: Vec<&str> = info.keys().map(String::as_str).collect();
        keys.sort_unstable();
        err(format!("no {INFO_KEY:?} key (keys: {keys:?}); is verbose status supported by this runtime?"))
    })?;
    let parsed: VerboseInfo =
        serde_json::from_str(json).map_err(|e| err(format!("info[{INFO_KEY:?}] is not the expected JSON: {e}")))?;
    let namespaces = parsed
        .runtime_spec
        .ok_or_else(|| err("no runtimeSpec".into()))?
        .linux
        .ok_or_else(|| err("no runtimeSpec.linux".into()))?
        .namespaces
        .ok_or_else(|| err("no runtimeSpec.linux.namespaces".into()))?;
    let mut network = namespaces.into_iter().filter(|ns| ns.kind == "network");
    let first = network.next();
    if network.next().is_some() {
        return Err(err("more than one network namespace in runtimeSpec.linux.namespaces".into()));
    }
    Ok(first.and_then(|ns| ns.path).filter(|p| !p.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_served_path_passes_the_same_rules_as_the_runtimes() {
        let d = NetnsDirs::new(Path::new("/run/netns"), Some(Path::new("/host/netns"))).unwrap();
        assert_eq!(d.served("/host/netns/cni-1").unwrap().as_str(), "/host/netns/cni-1");
        for bad in [
            "/proc/1/ns/net",
            "/run/netns/cni-1",
            "/host/netns/a/b",
            "/host/netns/..",
            "/host/netns/",
            "/host/netnsx/a",
            "/host/netns/a b",
            "/host/netns/a\0",
        ] {
            let e = d.served(bad).unwrap_err().to_string();
            assert!(e.contains(bad.trim_end_matches('\0')), "{bad}: {e}");
        }
    }

    fn dirs() -> NetnsDirs {
        NetnsDirs::default()
    }

    fn rule_of(r: Result<NetnsPath, RuntimeError>) -> String {
        match r {
            Err(RuntimeError::UnsafePath { rule, .. }) => rule,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    fn info(json: &str) -> HashMap<String, String> {
        HashMap::from([(INFO_KEY.to_owned(), json.to_owned())])
    }

    /// The shape containerd 1.6 returns (abridged: `config`, `runtimeOptions` and `cniResult` are
    /// as large as the pod's spec).
    const CONTAINERD_16: &str = r#"{
      "pid": 123, "processStatus": "running", "netNamespaceClosed": false,
      "image": "registry.k8s.io/pause:3.6",
      "snapshotKey": "0c1b2a3d4e5f", "snapshotter": "overlayfs",
      "runtimeHandler": "", "runtimeType": "io.containerd.runc.v2",
      "runtimeOptions": {"systemd_cgroup": false},
      "config": {"metadata": {"name": "web-0", "uid": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "namespace": "default"},
                 "hostname": "web-0", "log_directory": "/var/log/pods/default_web-0_0f1e", "linux": {"cgroup_parent": "/kubepods/besteffort/pod0f1e"}},
      "runtimeSpec": {"ociVersion": "1.0.2-dev",
        "process": {"user": {"uid": 65535, "gid": 65535}, "args": ["/pause"], "cwd": "/"},
        "root": {"path": "rootfs", "readonly": true},
        "linux": {"resources": {"cpu": {"shares": 2}},
          "cgroupsPath": "/kubepods/besteffort/pod0f1e/0c1b2a3d",
          "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
                         {"type": "network", "path": "/var/run/netns/cni-6a5c1e2f-0b9d-3c4e-8f7a-1b2c3d4e5f60"}]}},
      "cniResult": {"Interfaces": {"eth0": {"IPConfigs": [{"IP": "10.244.77.5", "Gateway": "10.244.77.1"}], "Mac": "aa:bb:cc:dd:ee:ff", "Sandbox": "/var/run/netns/cni-6a5c1e2f-0b9d-3c4e-8f7a-1b2c3d4e5f60"}}, "DNS": [{}, {}], "Routes": null}
    }"#;

    /// containerd for a `hostNetwork: true` pod: no `network` entry at all.
    const CONTAINERD_HOST_NETWORK: &str = r#"{
      "pid": 456, "processStatus": "running", "netNamespaceClosed": false,
      "runtimeSpec": {"ociVersion": "1.0.2-dev",
        "linux": {"namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}]}},
      "cniResult": null
    }"#;

    #[test]
    fn containerd_verbose_info_gives_the_network_namespace_path() {
        assert_eq!(
            sandbox_netns("sb1", &info(CONTAINERD_16)).unwrap().as_deref(),
            Some("/var/run/netns/cni-6a5c1e2f-0b9d-3c4e-8f7a-1b2c3d4e5f60")
        );
    }

    #[test]
    fn a_host_network_sandbox_has_no_netns_path() {
        assert_eq!(sandbox_netns("sb1", &info(CONTAINERD_HOST_NETWORK)).unwrap(), None);
        // A network namespace without a path (one the runtime would create unpinned) is not
        // reachable by path either.
        let unpinned = r#"{"runtimeSpec": {"linux": {"namespaces": [{"type": "network"}, {"type": "pid"}]}}}"#;
        assert_eq!(sandbox_netns("sb1", &info(unpinned)).unwrap(), None);
        let empty = r#"{"runtimeSpec": {"linux": {"namespaces": [{"type": "network", "path": ""}]}}}"#;
        assert_eq!(sandbox_netns("sb1", &info(empty)).unwrap(), None);
    }

    #[test]
    fn malformed_or_unexpected_verbose_info_is_an_error_naming_the_sandbox() {
        let cases = [
            ("{not json", "not the expected JSON"),
            (r#"{"pid": 1}"#, "no runtimeSpec"),
            (r#"{"runtimeSpec": {"ociVersion": "1.0.2"}}"#, "no runtimeSpec.linux"),
            (r#"{"runtimeSpec": {"linux": {}}}"#, "no runtimeSpec.linux.namespaces"),
            (r#"{"runtimeSpec": {"linux": {"namespaces": "network"}}}"#, "not the expected JSON"),
            (
                r#"{"runtimeSpec": {"linux": {"namespaces": [{"type": "network", "path": 7}]}}}"#,
                "not the expected JSON",
            ),
            (
                r#"{"runtimeSpec": {"linux": {"namespaces": [{"type": "network", "path": "/run/netns/a"}, {"type": "network", "path": "/run/netns/b"}]}}}"#,
                "more than one network namespace",
            ),
        ];
        for (json, want) in cases {
            match sandbox_netns("sb-42", &info(json)) {
                Err(e @ RuntimeError::VerboseInfo { .. }) => {
                    let msg = e.to_string();
                    assert!(msg.contains("sb-42") && msg.contains(want), "{json}: {msg}");
                }
                other => panic!("{json}: expected a verbose-info error, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_missing_info_key_is_an_error_listing_the_keys_there() {
        let other = HashMap::from([("sandboxInfo".to_owned(), "{}".to_owned())]);
        let msg = sandbox_netns("sb1", &other).unwrap_err().to_string();
        assert!(msg.contains("no \"info\" key") && msg.contains("sandboxInfo"), "{msg}");
        assert!(sandbox_netns("sb1", &HashMap::new()).is_err());
    }

    #[test]
    fn var_run_is_read_as_run_and_the_name_is_kept() {
        let d = dirs();
        assert_eq!(d.translate("/var/run/netns/cni-6a5c1e2f-0b9d").unwrap().as_str(), "/run/netns/cni-6a5c1e2f-0b9d");
        assert_eq!(d.translate("/run/netns/cni-1234").unwrap().as_str(), "/run/netns/cni-1234");
        // CRI-O pins under /var/run/netns/<uuid> too.
        assert_eq!(
            d.translate("/var/run/netns/0b6b5f4e-9a8c-4d3e-b2a1-0f9e8d7c6b5a").unwrap().as_str(),
            "/run/netns/0b6b5f4e-9a8c-4d3e-b2a1-0f9e8d7c6b5a"
        );
    }

    #[test]
    fn the_path_is_re_rooted_at_the_proxy_dir() {
        let d = NetnsDirs::new(Path::new("/var/run/netns/"), Some(Path::new("/host/run//netns/"))).unwrap();
        assert_eq!(d.host(), "/run/netns");
        assert_eq!(d.proxy(), "/host/run/netns");
        assert_eq!(d.translate("/var/run/netns/cni-1").unwrap().as_str(), "/host/run/netns/cni-1");
        assert_eq!(d.translate("/run/netns/cni-1").unwrap().as_str(), "/host/run/netns/cni-1");
        let same = NetnsDirs::new(Path::new("/run/netns"), None).unwrap();
        assert_eq!(same, NetnsDirs::default());
    }

    #[test]
    fn paths_outside_the_host_dir_are_refused() {
        let d = dirs();
        for p in ["/run/netnsX/cni-1", "/run/net/cni-1", "/proc/1/ns/net", "/run/netns", "/run/netns/", "/etc/passwd"] {
            let rule = rule_of(d.translate(p));
            assert!(rule.contains("--netns-host-dir") || rule.contains("1 to 255"), "{p}: {rule}");
        }
        assert!(rule_of(d.translate("run/netns/cni-1")).contains("absolute"));
        assert!(rule_of(d.translate("/run/netns/sub/cni-1")).contains("subdirectory"));
        assert!(rule_of(d.translate("/run/netns/../../etc/passwd")).contains("subdirectory"));
    }

    #[test]
    fn unsafe_file_names_are_refused_with_the_rule() {
        let d = dirs();
        assert!(rule_of(d.translate("/run/netns/..")).contains(". or .."));
        assert!(rule_of(d.translate("/run/netns/.")).contains(". or .."));
        assert!(rule_of(d.translate("/run/netns/cni\0x")).contains("NUL"));
        for bad in ["cni 1", "cni;rm", "cni$x", "cnié", "cni\n", "cni:1", "cni\\1"] {
            let rule = rule_of(d.translate(&format!("/run/netns/{bad}")));
            assert!(rule.contains("[A-Za-z0-9._-]"), "{bad:?}: {rule}");
        }
        let long = "a".repeat(256);
        assert!(rule_of(d.translate(&format!("/run/netns/{long}"))).contains("1 to 255"));
        assert!(d.translate(&format!("/run/netns/{}", "a".repeat(255))).is_ok());
        assert!(d.translate("/run/netns/..hidden_ok-1.2").is_ok());
        let e = d.translate("/etc/passwd").unwrap_err().to_string();
        assert!(e.contains("\"/etc/passwd\"") && e.contains("refused"), "{e}");
    }

    #[test]
    fn bad_dir_flags_are_refused() {
        for (host, proxy) in [
            ("run/netns", None),
            ("/", None),
            ("/run/../netns", None),
            ("/run/netns", Some("relative")),
            ("/run/netns", Some("/a/./b")),
        ] {
            let r = NetnsDirs::new(Path::new(host), proxy.map(Path::new));
            assert!(matches!(r, Err(RuntimeError::Dir { .. })), "{host} {proxy:?}: {r:?}");
        }
    }
}
