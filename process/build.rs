//! Stamps the git commit into the crate as `AETHER_GIT_SHA` (see `src/build_info.rs`).
//!
//! Source, in order: the `AETHER_GIT_SHA` environment variable (a build without `.git`, e.g. a
//! container build whose context leaves it out, can pass it in); `git rev-parse --short HEAD`
//! in a git checkout; else `unknown`. The build never fails for want of git. Cargo re-runs this
//! script when HEAD moves: it watches `.git/HEAD`, the branch's loose ref and `packed-refs`
//! (only files that exist: a missing one would make cargo re-run the script on every build).

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!text.is_empty()).then_some(text)
}

fn watch(git_path: &str) {
    if let Some(p) = git(&["rev-parse", "--path-format=absolute", "--git-path", git_path]).map(PathBuf::from)
        && p.is_file()
    {
        println!("cargo:rerun-if-changed={}", p.display());
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=AETHER_GIT_SHA");
    println!("cargo:rerun-if-changed=build.rs");
    let from_env = std::env::var("AETHER_GIT_SHA").ok().filter(|s| !s.trim().is_empty());
    let sha = match from_env {
        Some(sha) => sha.trim().to_owned(),
        None => {
            watch("HEAD");
            watch("packed-refs");
            if let Some(head_ref) = git(&["symbolic-ref", "-q", "HEAD"]) {
                watch(&head_ref);
            }
            git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
        }
    };
    println!("cargo:rustc-env=AETHER_GIT_SHA={sha}");
}
