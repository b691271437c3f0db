//! Socket value grammar and the sun_path budget as tables (docs/workload-requirements.md, "The
//! byte budget"). Every length is in bytes.

use aether_crds::udspath::{self, PodsDirError, SocketError};
use aether_crds::{Budget, PodDirId};

/// The UID the field reports use.
const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

fn default_budget() -> Budget {
    Budget::new("/var/lib/kubelet/pods").expect("the default pods dir has a budget")
}

fn uid() -> PodDirId {
    PodDirId::new(UID).expect("the field-report UID is a canonical UUID")
}

// ---------------------------------------------------------------- the sun_path off-by-one

#[test]
fn default_pods_dir_leaves_a_budget_of_16_bytes() {
    let budget = default_budget();
    assert_eq!(budget.bytes(), 16);
    assert_eq!(budget.pods_dir(), "/var/lib/kubelet/pods");
    assert_eq!(udspath::FIXED_BYTES, 70, "'/' + 36-byte UID + '/volumes/kubernetes.io~empty-dir/'");
}

#[test]
fn value_of_16_bytes_resolves_to_a_path_of_exactly_107_bytes() {
    let value = "sockets/app.sock";
    assert_eq!(value.len(), 16);
    let path = default_budget().resolve(&uid(), value).expect("16 bytes fit the 16-byte budget");
    assert_eq!(
        path.as_str(),
        "/var/lib/kubelet/pods/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/volumes/kubernetes.io~empty-dir/sockets/app.sock"
    );
    assert_eq!(path.as_str().len(), 107);
    assert_eq!(path.as_str().len(), udspath::SUN_PATH_MAX);
    assert_eq!(
        path.volume_dir(),
        "/var/lib/kubelet/pods/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/volumes/kubernetes.io~empty-dir/sockets"
    );
    assert_eq!(path.to_string(), path.as_str());
}

#[test]
fn value_of_17_bytes_is_denied_with_the_arithmetic() {
    let value = "sockets/app1.sock";
    assert_eq!(value.len(), 17, "its path would be 108 bytes, one too many for sun_path");
    let err = default_budget().resolve(&uid(), value).expect_err("17 bytes exceed the 16-byte budget");
    assert_eq!(err, SocketError::TooLong { value_bytes: 17, budget: 16, pods_dir: "/var/lib/kubelet/pods".to_owned() });
    assert_eq!(err.rule(), "socket-path-too-long");
    let shown = err.to_string();
    for needle in ["17 bytes", "16 bytes", "/var/lib/kubelet/pods", "107"] {
        assert!(shown.contains(needle), "{shown:?} should contain {needle:?}");
    }
}

#[test]
fn check_and_resolve_agree_on_the_budget_edge() {
    let budget = default_budget();
    assert!(budget.check("sockets/app.sock").is_ok());
    assert!(matches!(budget.check("sockets/app1.sock"), Err(SocketError::TooLong { value_bytes: 17, .. })));
}

#[test]
fn grammar_errors_come_before_the_length_error() {
    // 40 bytes and ungrammatical: the grammar rule is reported, not the length.
    let value = "Sockets/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.sock";
    assert!(value.len() > 16);
    assert!(matches!(default_budget().check(value), Err(SocketError::Volume { .. })));
}

// ---------------------------------------------------------------- kubelet roots by distro

#[test]
fn budget_table_for_distro_pods_dirs() {
    // (pods dir, expected budget in bytes)
    let table: &[(&str, usize)] = &[
        ("/var/lib/kubelet/pods", 16),
        ("/var/lib/kubelet/pods/", 16), // one trailing '/' is tolerated and dropped
        ("/var/lib/k0s/kubelet/pods", 12),
        ("/k", 35),
        ("/", udspath::WIDEST_BUDGET),
    ];
    for (dir, expected) in table {
        let budget = Budget::new(dir).unwrap_or_else(|e| panic!("{dir}: {e}"));
        assert_eq!(budget.bytes(), *expected, "budget for {dir}");
        assert_eq!(budget.pods_dir(), dir.strip_suffix('/').filter(|d| !d.is_empty()).unwrap_or(dir));
    }
}

#[test]
fn k0s_pods_dir_gives_a_budget_of_12_bytes() {
    let budget = Budget::new("/var/lib/k0s/kubelet/pods").unwrap();
    assert_eq!(budget.bytes(), 12);
    let twelve = "sockets/a.so";
    assert_eq!(twelve.len(), 12);
    let path = budget.resolve(&uid(), twelve).unwrap();
    assert_eq!(path.as_str().len(), 107);
    let err = budget.check("sockets/a.soc").unwrap_err();
    assert_eq!(
        err,
        SocketError::TooLong { value_bytes: 13, budget: 12, pods_dir: "/var/lib/k0s/kubelet/pods".to_owned() }
    );
    assert!(err.to_string().contains("/var/lib/k0s/kubelet/pods"));
}

#[test]
fn microk8s_pods_dir_is_a_configuration_error_with_a_negative_budget() {
    let dir = "/var/snap/microk8s/common/var/lib/kubelet/pods";
    assert_eq!(dir.len(), 46);
    let err = Budget::new(dir).expect_err("107 - 46 - 70 = -9 bytes: no value can fit");
    assert_eq!(err, PodsDirError::BudgetTooSmall { pods_dir: dir.to_owned(), len: 46, budget: -9 });
    let shown = err.to_string();
    for needle in [dir, "46 bytes", "-9 bytes", "107 - 46 - 70", "a/b", "shorter path"] {
        assert!(shown.contains(needle), "{shown:?} should contain {needle:?}");
    }
}

#[test]
fn pods_dirs_longer_than_34_bytes_are_configuration_errors() {
    for (dir, budget) in [
        ("/var/lib/rancher/k3s/agent/kubelet/pods", -2),
        ("/var/snap/microk8s/common/var/lib/kubelet/pods", -9),
        ("/var/lib/kubelet-with-a-long-root/pods", 107 - 38 - 70),
    ] {
        assert_eq!(
            Budget::new(dir),
            Err(PodsDirError::BudgetTooSmall { pods_dir: dir.to_owned(), len: dir.len(), budget }),
            "{dir}"
        );
    }
}

#[test]
fn short_mount_path_widens_the_budget_to_35_bytes() {
    let budget = Budget::new("/k").unwrap();
    assert_eq!(budget.bytes(), 35);
    let value = "sockets/a-rather-long-name.sock.abc";
    assert_eq!(value.len(), 35);
    assert_eq!(budget.resolve(&uid(), value).unwrap().as_str().len(), 107);
    assert!(matches!(
        budget.check("sockets/a-rather-long-name.sock.abcd"),
        Err(SocketError::TooLong { value_bytes: 36, budget: 35, .. })
    ));
}

#[test]
fn budget_of_exactly_3_bytes_is_the_smallest_accepted() {
    // 107 - len - 70 = 3  <=>  len = 34
    let dir3 = format!("/{}", "d".repeat(33));
    assert_eq!(dir3.len(), 34);
    let budget = Budget::new(&dir3).unwrap();
    assert_eq!(budget.bytes(), udspath::MIN_VALUE_BYTES);
    assert_eq!(budget.resolve(&uid(), "a/b").unwrap().as_str().len(), 107);

    let dir2 = format!("/{}", "d".repeat(34));
    assert!(matches!(Budget::new(&dir2), Err(PodsDirError::BudgetTooSmall { len: 35, budget: 2, .. })));
}

#[test]
fn budget_counts_bytes_of_a_non_ascii_pods_dir() {
    // "ü" is 2 bytes and "日本" 6: counting characters would overstate the budget.
    let dir = "/var/lib/kübelet/pods";
    assert_eq!(dir.chars().count(), 21);
    assert_eq!(dir.len(), 22);
    let budget = Budget::new(dir).unwrap();
    assert_eq!(budget.bytes(), 15);
    let err = budget.check("sockets/app.sock").unwrap_err();
    assert!(matches!(err, SocketError::TooLong { value_bytes: 16, budget: 15, .. }));
    let path = budget.resolve(&uid(), "sockets/app.soc").unwrap();
    assert_eq!(path.as_str().len(), 107);

    let dir = "/日本/pods";
    assert_eq!(Budget::new(dir).unwrap().bytes(), 107 - 12 - 70);
}

#[test]
fn unclean_pods_dirs_are_rejected() {
    for dir in [
        "",
        "var/lib/kubelet/pods",
        "./pods",
        "/var/lib/../kubelet/pods",
        "/var/lib/./kubelet/pods",
        "/var//lib/kubelet/pods",
        "/var/lib/kubelet/pods//",
        "/var/lib/kubelet/\0pods",
    ] {
        assert_eq!(Budget::new(dir), Err(PodsDirError::NotClean(dir.to_owned())), "pods dir {dir:?}");
    }
}

// ---------------------------------------------------------------- grammar and injection

/// Every injection-shaped value and the variant (and rule) that rejects it.
#[test]
fn field_report_injection_values_are_rejected_with_their_rule() {
    fn slashes(found: usize) -> SocketError {
        SocketError::Slashes { found }
    }
    fn volume(v: &str) -> SocketError {
        SocketError::Volume { volume: v.to_owned() }
    }
    fn file(f: &str) -> SocketError {
        SocketError::File { file: f.to_owned() }
    }
    let table: Vec<(&str, SocketError, &str)> = vec![
        ("sockets/app.sock\n", file("app.sock\n"), "socket-file-name"),
        ("../app.sock", volume(".."), "socket-volume-name"),
        ("sockets/..", file(".."), "socket-file-name"),
        ("sockets/.", file("."), "socket-file-name"),
        ("./app.sock", volume("."), "socket-volume-name"),
        ("sockets//app.sock", slashes(2), "socket-shape"),
        ("/sockets/app.sock", slashes(2), "socket-shape"),
        ("sockets/app.sock/", slashes(2), "socket-shape"),
        ("Sockets/app.sock", volume("Sockets"), "socket-volume-name"),
        ("sockets\\app.sock", slashes(0), "socket-shape"),
        ("%2e%2e/app.sock", volume("%2e%2e"), "socket-volume-name"),
        ("sockets\u{FF0F}app.sock", slashes(0), "socket-shape"), // full-width solidus
        ("sockets\u{2215}app.sock", slashes(0), "socket-shape"), // division slash
        ("sockets/app\0.sock", file("app\0.sock"), "socket-file-name"),
        ("sock\0ets/app.sock", volume("sock\0ets"), "socket-volume-name"),
        ("sockets/app.sock\0", file("app.sock\0"), "socket-file-name"),
        ("sockets/app.sock ", file("app.sock "), "socket-file-name"),
        (" sockets/app.sock", volume(" sockets"), "socket-volume-name"),
        ("sockets/app.sock\t", file("app.sock\t"), "socket-file-name"),
        ("sockets/app.sock\r\n", file("app.sock\r\n"), "socket-file-name"),
        ("sockets/%2e%2e", file("%2e%2e"), "socket-file-name"),
        ("sockets/app\u{2024}sock", file("app\u{2024}sock"), "socket-file-name"), // one-dot leader
        ("sockets/\u{FF0E}\u{FF0E}", file("\u{FF0E}\u{FF0E}"), "socket-file-name"), // full-width dots
        ("söckets/app.sock", volume("söckets"), "socket-volume-name"),
        ("", SocketError::Empty, "socket-shape"),
        ("/", volume(""), "socket-volume-name"),
        ("sockets", slashes(0), "socket-shape"),
        ("sockets/", file(""), "socket-file-name"),
        ("/app.sock", volume(""), "socket-volume-name"),
        ("-sockets/app.sock", volume("-sockets"), "socket-volume-name"),
        ("sockets-/app.sock", volume("sockets-"), "socket-volume-name"),
        ("sock_ets/app.sock", volume("sock_ets"), "socket-volume-name"),
        ("sock.ets/app.sock", volume("sock.ets"), "socket-volume-name"),
        ("sockets/app:sock", file("app:sock"), "socket-file-name"),
        ("sockets/app~sock", file("app~sock"), "socket-file-name"),
        ("sockets/*", file("*"), "socket-file-name"),
    ];
    let budget = default_budget();
    for (value, expected, rule) in table {
        let got = udspath::parse(value).expect_err(value);
        assert_eq!(got, expected, "parse({value:?})");
        assert_eq!(got.rule(), rule, "rule for {value:?}");
        // The budget check and the resolver report the same grammar error.
        assert_eq!(budget.check(value).unwrap_err(), expected, "check({value:?})");
        assert_eq!(budget.resolve(&uid(), value).unwrap_err(), expected, "resolve({value:?})");
    }
}

#[test]
fn rejection_messages_state_the_rule() {
    let cases: &[(&str, &[&str])] = &[
        ("", &["must not be empty", "<volume>/<file>"]),
        ("sockets//app.sock", &["exactly one '/'", "found 2"]),
        ("Sockets/app.sock", &["\"Sockets\"", "DNS-1123 label"]),
        ("sockets/..", &["\"..\"", "A-Z a-z 0-9 . _ -"]),
        ("sockets/app\0.sock", &["\"app\\0.sock\""]),
    ];
    for (value, needles) in cases {
        let shown = udspath::parse(value).unwrap_err().to_string();
        for needle in *needles {
            assert!(shown.contains(needle), "message for {value:?} is {shown:?}; expected {needle:?}");
        }
    }
}

#[test]
fn well_formed_values_parse_into_volume_and_file() {
    let table: &[(&str, &str, &str)] = &[
        ("sockets/app.sock", "sockets", "app.sock"),
        ("a/b", "a", "b"),
        ("0/0", "0", "0"),
        ("run-1/App_1.sock", "run-1", "App_1.sock"),
        ("s/.hidden", "s", ".hidden"),
        ("s/..x", "s", "..x"),
        ("s/...", "s", "..."),
        ("s/x..", "s", "x.."),
        ("s/-", "s", "-"),
        ("s/_", "s", "_"),
    ];
    for (value, volume, file) in table {
        let parsed = udspath::parse(value).unwrap_or_else(|e| panic!("{value:?}: {e}"));
        assert_eq!((parsed.volume, parsed.file), (*volume, *file));
    }
}

#[test]
fn volume_names_are_dns1123_labels_of_at_most_63_bytes() {
    let v63 = "v".repeat(63);
    assert!(udspath::is_dns1123_label(&v63));
    assert!(udspath::parse(&format!("{v63}/s")).is_ok());
    let v64 = "v".repeat(64);
    assert!(!udspath::is_dns1123_label(&v64));
    assert_eq!(udspath::parse(&format!("{v64}/s")), Err(SocketError::Volume { volume: v64 }));
    for ok in ["a", "0", "a-b", "1a", "a1", "a--b"] {
        assert!(udspath::is_dns1123_label(ok), "{ok:?}");
    }
    for bad in ["", "-", "-a", "a-", "A", "a_b", "a.b", "ä"] {
        assert!(!udspath::is_dns1123_label(bad), "{bad:?}");
    }
}

#[test]
fn widest_budget_is_what_the_one_byte_pods_dir_leaves() {
    assert_eq!(udspath::WIDEST_BUDGET, 36);
    assert_eq!(udspath::WIDEST_BUDGET, udspath::SUN_PATH_MAX - 1 - udspath::FIXED_BYTES);
    assert_eq!(Budget::new("/").unwrap().bytes(), udspath::WIDEST_BUDGET);
}

#[test]
fn placeholder_uid_takes_the_room_of_a_real_uid() {
    let placeholder = PodDirId::placeholder();
    assert_eq!(placeholder.as_str().len(), udspath::UID_BYTES);
    assert!(PodDirId::new(placeholder.as_str()).is_ok());
    let real = default_budget().resolve(&uid(), "sockets/app.sock").unwrap();
    let planned = default_budget().resolve(&placeholder, "sockets/app.sock").unwrap();
    assert_eq!(real.as_str().len(), planned.as_str().len());
}
