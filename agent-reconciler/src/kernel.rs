//! The kernel features the agent relies on beyond what every supported kernel has, checked once
//! at start (docs/compatibility.md, "Kernel").
//!
//! Socket pinning (`--pin-dir`, [`crate::pin`]) opens a pod's socket with `openat2(2)` and its
//! `RESOLVE_*` flags (Linux 5.6) and pins the inode with the mount API's `open_tree(2)` and
//! `move_mount(2)` (Linux 5.2, one patch series). On an older kernel each call answers `ENOSYS`
//! (so does a seccomp profile that refuses it with that errno, as container runtimes' defaults do):
//! [`check`] finds that once, with calls that change nothing (an `O_PATH` open of the working
//! directory each; `move_mount` came with `open_tree`, so the `open_tree` probe stands for both).
//! The agent then stays not ready (`/readyz` names the feature and the kernel) and publishes a
//! Warning Event on its Node; it never turns pinning off by itself, since pinning is what keeps a
//! pod from receiving another pod's traffic (docs/design-notes.md, "Agent").

use std::fmt;

use rustix::fs::{self as rfs, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use rustix::mount::{self, OpenTreeFlags};

/// A kernel feature: the calls, the first Linux release with them, and what the agent uses them for.
#[derive(Debug, PartialEq, Eq)]
pub struct Feature {
    /// The system calls (and flags), as the man pages name them.
    pub calls: &'static str,
    /// The first mainline Linux release that has them (man-pages).
    pub since: &'static str,
    /// What the agent does with them.
    pub used_for: &'static str,
}

/// `openat2(2)` with the resolve flags [`crate::pin`] passes.
pub const OPENAT2: Feature = Feature {
    calls: "openat2(2) with RESOLVE_BENEATH, RESOLVE_NO_SYMLINKS and RESOLVE_NO_XDEV",
    since: "5.6",
    used_for: "opening a pod's socket without following a link (socket pinning, --pin-dir)",
};

/// The mount API calls [`crate::pin`] pins a socket inode with.
pub const MOUNT_API: Feature = Feature {
    calls: "open_tree(2) and move_mount(2)",
    since: "5.2",
    used_for: "pinning the verified socket inode for Envoy (socket pinning, --pin-dir)",
};

/// The Event reason of a [`Gap`] (a Warning on the agent's Node).
pub const GAP_REASON: &str = "KernelFeatureMissing";
/// The Event action of a [`Gap`].
pub const GAP_ACTION: &str = "PinSockets";

/// A feature this kernel lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    /// The feature.
    pub feature: &'static Feature,
    /// The running kernel's release (`uname -r`).
    pub kernel: String,
    /// The probe's error (`ENOSYS`).
    pub error: Errno,
}

impl fmt::Display for Gap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kernel {} lacks {} (Linux {} and later), which the agent needs for {}: the probe answered {} \
             (or a seccomp profile on the agent refuses the call); run this node on a newer kernel \
             (docs/compatibility.md, \"Kernel\")",
            self.kernel, self.feature.calls, self.feature.since, self.feature.used_for, self.error
        )
    }
}

/// The gaps among probe results: a probe that answered `ENOSYS` (the call does not exist) is one;
/// any other error (a permission, a path) is not a missing feature, and the feature's own use
/// reports it.
pub fn gaps(kernel: &str, probes: &[(&'static Feature, Result<(), Errno>)]) -> Vec<Gap> {
    probes
        .iter()
        .filter_map(|(feature, result)| match result {
            Err(e) if *e == Errno::NOSYS => Some(Gap { feature, kernel: kernel.to_owned(), error: *e }),
            _ => None,
        })
        .collect()
}

/// Probes the features socket pinning needs on the running kernel; empty when it has them all.
pub fn check() -> Vec<Gap> {
    let kernel = rustix::system::uname().release().to_string_lossy().into_owned();
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_XDEV;
    let openat2 =
        rfs::openat2(rfs::CWD, ".", OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty(), resolve);
    // Without OPEN_TREE_CLONE, open_tree is an O_PATH open: no mount is made, no privilege needed.
    let open_tree = mount::open_tree(rfs::CWD, ".", OpenTreeFlags::OPEN_TREE_CLOEXEC);
    gaps(&kernel, &[(&OPENAT2, openat2.map(drop)), (&MOUNT_API, open_tree.map(drop))])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_kernel_has_what_pinning_needs() {
        // The build and test machines run Linux 6.x; the suites pin sockets on it.
        assert_eq!(check(), Vec::new());
    }

    #[test]
    fn only_a_missing_call_is_a_gap_and_it_names_the_feature_and_the_kernel() {
        let found = gaps(
            "4.19.0-27-amd64",
            &[(&OPENAT2, Err(Errno::NOSYS)), (&MOUNT_API, Err(Errno::PERM)), (&MOUNT_API, Ok(()))],
        );
        assert_eq!(found.len(), 1, "{found:?}");
        let text = found[0].to_string();
        for part in
            ["kernel 4.19.0-27-amd64", "openat2(2)", "Linux 5.6 and later", "--pin-dir", "docs/compatibility.md"]
        {
            assert!(text.contains(part), "{part:?} in {text}");
        }
    }
}
