//! Which build this is: the one version (the workspace's `workspace.package.version`, which the
//! chart's `appVersion` and the default image tags repeat; `process/tests/release.rs`
//! keeps them equal) and the git commit it was built from (`build.rs`: `AETHER_GIT_SHA`, else
//! `git rev-parse --short HEAD`, else `unknown`).

use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// The version of every aether binary and of the chart's `appVersion`, e.g. `0.4.0`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The abbreviated git commit of the build (`git rev-parse --short HEAD`), or `unknown` when
/// built outside a git checkout without `AETHER_GIT_SHA`.
pub const GIT_SHA: &str = env!("AETHER_GIT_SHA");

/// What `--version` prints after the binary's name: `<version> (git <sha>)`, e.g.
/// `0.4.0 (git d0361be)`.
pub const VERSION_LINE: &str = concat!(env!("CARGO_PKG_VERSION"), " (git ", env!("AETHER_GIT_SHA"), ")");

/// Registers `aether_build_info{version,git_sha} 1` (an OpenMetrics info metric: one series for
/// the process's life, two label values per build).
pub fn register(registry: &mut Registry) {
    registry.register(
        "aether_build",
        "The version and git commit of this binary",
        Info::new(vec![("version", VERSION), ("git_sha", GIT_SHA)]),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn the_version_line_carries_the_version_and_the_commit_of_this_checkout() {
        assert_eq!(VERSION_LINE, format!("{VERSION} (git {GIT_SHA})"));
        let head = Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
        match head {
            // build.rs re-runs when HEAD moves, so a stale SHA fails here.
            Some(head) if std::env::var_os("AETHER_GIT_SHA").is_none() => assert_eq!(GIT_SHA, head),
            _ => assert!(!GIT_SHA.is_empty()),
        }
    }

    #[test]
    fn build_info_is_one_series_with_the_version_and_the_sha() {
        let mut registry = Registry::default();
        register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("# TYPE aether_build info"), "{text}");
        let want = format!("aether_build_info{{version=\"{VERSION}\",git_sha=\"{GIT_SHA}\"}} 1");
        assert_eq!(text.lines().filter(|l| l.starts_with("aether_build_info")).collect::<Vec<_>>(), [want.as_str()]);
    }
}
