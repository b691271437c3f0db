//! `--socket-limit filesystem` (docs/design-notes.md, "The socket limit once every node pins"):
//! with socket pinning on every node, Envoy dials only the short pin path, so a socket value is
//! limited by the file system (volume a DNS-1123 label of at most 63 bytes, file at most NAME_MAX =
//! 255 bytes), not by the sun_path budget of the pods dir; the grammar is the same. `sun-path` (the
//! default) decides exactly as before. Every length is in bytes.

use aether_crds::chart::{crd_with_chart_metadata, crd_with_chart_metadata_for, socket_max_bytes};
use aether_crds::policy::{EndpointPolicySpec, TargetRef, socket_length_rule};
use aether_crds::udspath::{
    self, FILESYSTEM_VALUE_MAX, NAME_MAX, PodsDirError, SocketError, SocketLimit, VOLUME_NAME_MAX, WIDEST_BUDGET,
};
use aether_crds::{Budget, PodDirId, Rules};
use proptest::prelude::*;

const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
const MICROK8S: &str = "/var/snap/microk8s/common/var/lib/kubelet/pods";

fn uid() -> PodDirId {
    PodDirId::new(UID).unwrap()
}

fn fs(pods_dir: &str) -> Budget {
    Budget::with_limit(pods_dir, SocketLimit::Filesystem).unwrap_or_else(|e| panic!("{pods_dir}: {e}"))
}

fn spec(socket: &str) -> EndpointPolicySpec {
    let target_ref = TargetRef { group: String::new(), kind: "Service".into(), name: "echo".into() };
    EndpointPolicySpec { target_ref, uds_socket: socket.into() }
}

#[test]
fn the_limits_are_name_max_and_the_dns1123_label() {
    assert_eq!(NAME_MAX, 255);
    assert_eq!(VOLUME_NAME_MAX, 63);
    assert_eq!(FILESYSTEM_VALUE_MAX, 319);
    assert_eq!(FILESYSTEM_VALUE_MAX, VOLUME_NAME_MAX + 1 + NAME_MAX);
    assert_eq!(SocketLimit::default(), SocketLimit::SunPath);
    assert_eq!(SocketLimit::SunPath.longest_value(), WIDEST_BUDGET);
    assert_eq!(SocketLimit::Filesystem.longest_value(), FILESYSTEM_VALUE_MAX);
    assert_eq!(
        (SocketLimit::SunPath.to_string(), SocketLimit::Filesystem.to_string()),
        ("sun-path".to_owned(), "filesystem".to_owned())
    );
}

#[test]
fn a_256_byte_file_is_refused_naming_its_length_the_limit_and_why() {
    let value = format!("s/{}", "f".repeat(256));
    let err = fs(udspath::DEFAULT_PODS_DIR).check(&value).unwrap_err();
    assert_eq!(err, SocketError::FileTooLong { file_bytes: 256 });
    assert_eq!(err.rule(), "socket-file-too-long");
    assert_eq!(
        err.to_string(),
        "names a file of 256 bytes, over the 255-byte limit of a file name (NAME_MAX, the file system's name limit; \
         --socket-limit filesystem)"
    );
    // Through the webhook's decision: the field, the value cut at 64 bytes with its length, the rule.
    let rules = Rules::with_limit(udspath::DEFAULT_PODS_DIR, SocketLimit::Filesystem);
    let message = rules.review_spec(&spec(&value)).unwrap().message().expect("denied");
    assert_eq!(
        message,
        format!(
            "spec.udsSocket {:?}... (258 bytes) names a file of 256 bytes, over the 255-byte limit of a file name \
             (NAME_MAX, the file system's name limit; --socket-limit filesystem)",
            &value[..64]
        )
    );
    // 255 bytes is the limit itself.
    assert!(fs(udspath::DEFAULT_PODS_DIR).check(&format!("s/{}", "f".repeat(255))).is_ok());
}

#[test]
fn a_319_byte_value_is_accepted_and_resolves_to_a_path_longer_than_sun_path() {
    let value = format!("{}/{}", "v".repeat(63), "f".repeat(255));
    assert_eq!(value.len(), 319);
    let budget = fs(udspath::DEFAULT_PODS_DIR);
    assert_eq!(budget.bytes(), FILESYSTEM_VALUE_MAX);
    assert_eq!(budget.limit(), SocketLimit::Filesystem);
    let path = budget.resolve(&uid(), &value).expect("319 bytes fit the file system's limits");
    assert_eq!(path.as_str(), format!("/var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~empty-dir/{value}"));
    assert_eq!(path.as_str().len(), 21 + udspath::FIXED_BYTES + 319);
    assert!(path.as_str().len() > udspath::SUN_PATH_MAX);
    assert_eq!(
        path.volume_dir(),
        format!("/var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~empty-dir/{}", "v".repeat(63))
    );
    assert!(
        Rules::with_limit(udspath::DEFAULT_PODS_DIR, SocketLimit::Filesystem)
            .review_spec(&spec(&value))
            .unwrap()
            .allowed()
    );
}

#[test]
fn a_40_byte_value_fits_the_file_system_limit_but_not_the_sun_path_budget() {
    let value = format!("sockets/{}.sock", "a".repeat(27));
    assert_eq!(value.len(), 40);
    assert!(fs(udspath::DEFAULT_PODS_DIR).check(&value).is_ok());
    assert_eq!(
        Budget::new(udspath::DEFAULT_PODS_DIR).unwrap().check(&value),
        Err(SocketError::TooLong { value_bytes: 40, budget: 16, pods_dir: udspath::DEFAULT_PODS_DIR.to_owned() })
    );
}

#[test]
fn the_microk8s_pods_dir_has_no_sun_path_budget_but_is_usable_under_the_file_system_limit() {
    assert_eq!(MICROK8S.len(), 46);
    assert!(matches!(Budget::new(MICROK8S), Err(PodsDirError::BudgetTooSmall { budget: -9, .. })));
    let shown = Budget::new(MICROK8S).unwrap_err().to_string();
    assert!(shown.contains("--socket-limit filesystem"), "the error names the way out: {shown}");
    let budget = fs(MICROK8S);
    assert_eq!((budget.pods_dir(), budget.bytes()), (MICROK8S, 319));
    let path = budget.resolve(&uid(), "sockets/app.sock").unwrap();
    assert_eq!(path.as_str(), format!("{MICROK8S}/{UID}/volumes/kubernetes.io~empty-dir/sockets/app.sock"));
    assert_eq!(path.as_str().len(), 46 + 70 + 16);
    assert_eq!(path.volume_dir(), format!("{MICROK8S}/{UID}/volumes/kubernetes.io~empty-dir/sockets"));
    assert_eq!(path.file_name(), "app.sock");
    // Any pods dir length: a 1000-byte clean dir still gives the same limit.
    let deep = format!("/{}", vec!["d".repeat(99); 10].join("/"));
    assert_eq!(fs(&deep).bytes(), 319);
}

#[test]
fn unclean_pods_dirs_are_refused_under_the_file_system_limit_too() {
    for dir in ["", "var/lib/kubelet/pods", "/var/lib/../kubelet/pods", "/var//lib", "/a/\0b"] {
        assert_eq!(
            Budget::with_limit(dir, SocketLimit::Filesystem),
            Err(PodsDirError::NotClean(dir.to_owned())),
            "{dir:?}"
        );
    }
    assert_eq!(fs("/var/lib/kubelet/pods/").pods_dir(), "/var/lib/kubelet/pods", "one trailing '/' is dropped");
}

#[test]
fn the_sun_path_limit_is_exactly_what_budget_new_computes() {
    for dir in ["/var/lib/kubelet/pods", "/var/lib/k0s/kubelet/pods", "/k", "/", MICROK8S, "relative", "/a/../b"] {
        assert_eq!(Budget::with_limit(dir, SocketLimit::SunPath), Budget::new(dir), "{dir}");
        assert_eq!(Rules::with_limit(dir, SocketLimit::SunPath), Rules::new(dir), "{dir}");
    }
    let budget = Budget::new(udspath::DEFAULT_PODS_DIR).unwrap();
    assert_eq!((budget.limit(), budget.bytes()), (SocketLimit::SunPath, 16));
    let err = budget.check("sockets/app1.sock").unwrap_err();
    assert_eq!(
        err.to_string(),
        "is 17 bytes; the budget is 16 bytes with pods dir /var/lib/kubelet/pods (sun_path holds 107)"
    );
    let message = Rules::new(udspath::DEFAULT_PODS_DIR).review_spec(&spec("sockets/app1.sock")).unwrap().message();
    assert_eq!(
        message.as_deref(),
        Some(
            "spec.udsSocket \"sockets/app1.sock\" is 17 bytes; the budget is 16 bytes with pods dir \
             /var/lib/kubelet/pods (sun_path holds 107)"
        )
    );
}

#[test]
fn the_grammar_is_the_same_under_both_limits() {
    let sun = Budget::new(udspath::DEFAULT_PODS_DIR).unwrap();
    let fs = fs(udspath::DEFAULT_PODS_DIR);
    for value in [
        "",
        "../app.sock",
        "sockets/..",
        "sockets//app.sock",
        "/sockets/app.sock",
        "Sockets/app.sock",
        "sockets\\app.sock",
        "sockets\u{FF0F}app.sock",
        "sockets/app\0.sock",
        "sockets/app.sock ",
        "sockets/app.sock\n",
    ] {
        let want = udspath::parse(value).unwrap_err();
        assert_eq!(fs.check(value), Err(want.clone()), "{value:?}");
        assert_eq!(sun.check(value), Err(want), "{value:?}");
    }
    let v64 = format!("{}/s", "v".repeat(64));
    assert!(matches!(fs.check(&v64), Err(SocketError::Volume { .. })), "the volume stays a 63-byte label");
}

/// The chart renders the CRD for the limit: only `spec.udsSocket`'s length rule differs.
#[test]
fn the_crd_for_the_file_system_limit_differs_only_in_the_socket_length_rule() {
    let default = serde_json::to_value(crd_with_chart_metadata()).unwrap();
    let sun = serde_json::to_value(crd_with_chart_metadata_for(SocketLimit::SunPath)).unwrap();
    let mut filesystem = serde_json::to_value(crd_with_chart_metadata_for(SocketLimit::Filesystem)).unwrap();
    assert_eq!(sun, default);
    assert_eq!(socket_max_bytes(&default), Some(36));
    assert_eq!(socket_max_bytes(&filesystem), Some(319));
    let rules = &mut filesystem["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["udsSocket"]["x-kubernetes-validations"];
    assert_eq!(rules[0]["rule"], "size(bytes(self)) <= 319");
    assert!(rules[0]["message"].as_str().is_some_and(|m| m.contains("at most 319 bytes")), "{rules}");
    rules[0] = serde_json::to_value(socket_length_rule(SocketLimit::SunPath)).unwrap();
    assert_eq!(filesystem, default);
}

proptest! {
    /// Whatever the value and the pods dir: under the file system limit, an accepted value has a
    /// file of at most 255 bytes, is at most 319 bytes, and resolves inside its own volume dir.
    #[test]
    fn accepted_values_stay_within_the_file_system_limits(
        volume in "[a-z0-9]([a-z0-9-]{0,70}[a-z0-9])?",
        file in "[A-Za-z0-9._-]{1,300}",
        depth in 1usize..40,
    ) {
        let pods_dir = format!("/{}", vec!["p"; depth].join("/"));
        let value = format!("{volume}/{file}");
        let budget = fs(&pods_dir);
        match budget.resolve(&uid(), &value) {
            Ok(path) => {
                prop_assert!(file.len() <= NAME_MAX && volume.len() <= VOLUME_NAME_MAX);
                prop_assert!(value.len() <= FILESYSTEM_VALUE_MAX);
                prop_assert_eq!(path.volume_dir(), format!("{pods_dir}/{UID}/volumes/kubernetes.io~empty-dir/{volume}"));
                prop_assert_eq!(path.as_str(), format!("{}/{file}", path.volume_dir()));
            }
            Err(SocketError::FileTooLong { file_bytes }) => {
                prop_assert!(file_bytes == file.len() && file_bytes > NAME_MAX);
            }
            Err(e) => prop_assert!(udspath::parse(&value).is_err(), "{value:?}: {e}"),
        }
    }
}
