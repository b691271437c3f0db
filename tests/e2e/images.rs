//! The images `make images` builds (`tests/harness/images.sh build`: docker-archive tarballs of
//! the workspace's binaries, no registry, no Docker engine) are what their Dockerfiles say: the
//! controller and agent images carry the Dockerfile's USER, ENTRYPOINT and CMD and every binary
//! its `COPY --from=build` lines put in place, executable, with its ELF interpreter and every
//! shared library it needs (transitively) inside the image, or statically linked (the proxy
//! launcher, copied into an Envoy image that carries nothing of its own). The Envoy, uds-echo and pause images
//! carry their entrypoint binary the same way; the CoreDNS image its static Go binary, run as root.
//! The images of aether's binaries carry the OCI labels (version, revision, created, ...).
//!
//! The Dockerfiles are parsed here, independently of the builder (`tests/harness/mkimage.py`);
//! the tarballs are read with its `inspect` subcommand (JSON: config, paths, library closure).
//! The first test to run builds the images once (cargo build of the binaries included).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use aether_tests::repo_root;
use anyhow::{Context, bail, ensure};
use serde_json::Value;

/// What the final stage of a Dockerfile says about the image.
#[derive(Debug)]
struct FinalStage {
    user: String,
    entrypoint: Vec<String>,
    cmd: Option<Vec<String>>,
    /// Absolute image paths of the binaries `COPY --from=<stage>` puts there.
    binaries: Vec<String>,
}

/// Parses `USER`, exec-form `ENTRYPOINT`/`CMD` and `COPY --from=<stage> SRC... DEST` of the final
/// stage; any line it cannot read is an error naming `file:line` and the rule.
fn final_stage(path: &Path) -> anyhow::Result<FinalStage> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut instructions: Vec<(usize, String)> = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.starts_with('#') || (line.is_empty() && pending.is_none()) {
            continue;
        }
        let (start, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
        match line.strip_suffix('\\') {
            Some(head) => {
                joined.push_str(head);
                joined.push(' ');
                pending = Some((start, joined));
            }
            None => {
                joined.push_str(line);
                instructions.push((start, joined));
            }
        }
    }
    let at = |n: usize| format!("{}:{n}", path.display());
    let last_from = instructions
        .iter()
        .rposition(|(_, l)| l.to_ascii_uppercase().starts_with("FROM "))
        .with_context(|| format!("{}: no FROM line", path.display()))?;
    let (mut user, mut entrypoint, mut cmd, mut binaries) = (None, None, None, Vec::new());
    for (n, line) in &instructions[last_from + 1..] {
        let (word, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let rest = rest.trim();
        let exec_form = || {
            serde_json::from_str::<Vec<String>>(rest)
                .with_context(|| format!("{}: {word} must be an exec-form JSON array: {rest}", at(*n)))
        };
        match word.to_ascii_uppercase().as_str() {
            "USER" => user = Some(rest.to_owned()),
            "ENTRYPOINT" => entrypoint = Some(exec_form()?),
            "CMD" => cmd = Some(exec_form()?),
            "EXPOSE" => {}
            "COPY" => {
                let words: Vec<&str> = rest.split_whitespace().collect();
                let Some((dest, [from, sources @ ..])) = words.split_last() else {
                    bail!("{}: COPY must be `COPY --from=<stage> SRC... DEST`: {rest}", at(*n));
                };
                ensure!(
                    from.starts_with("--from=") && !sources.is_empty() && dest.starts_with('/'),
                    "{}: COPY must be `COPY --from=<stage> SRC... /DEST`: {rest}",
                    at(*n)
                );
                for src in sources {
                    let name = src.rsplit('/').next().unwrap_or(src);
                    binaries.push(if dest.ends_with('/') { format!("{dest}{name}") } else { (*dest).to_owned() });
                }
            }
            other => bail!("{}: final-stage instruction {other} is not one these images reproduce", at(*n)),
        }
    }
    Ok(FinalStage {
        user: user.with_context(|| format!("{}: the final stage has no USER", path.display()))?,
        entrypoint: entrypoint.with_context(|| format!("{}: the final stage has no ENTRYPOINT", path.display()))?,
        cmd,
        binaries,
    })
}

/// `images.sh build` once per test process; then each image's reference and tarball path.
fn built_images() -> anyhow::Result<&'static BTreeMap<String, PathBuf>> {
    static BUILT: OnceLock<Result<BTreeMap<String, PathBuf>, String>> = OnceLock::new();
    let script = repo_root().join("tests/harness/images.sh");
    let built = BUILT.get_or_init(|| {
        let run = |arg: &str| -> Result<String, String> {
            let out =
                Command::new(&script).arg(arg).output().map_err(|e| format!("running {}: {e}", script.display()))?;
            if !out.status.success() {
                return Err(format!(
                    "{} {arg} failed:\n{}{}",
                    script.display(),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        };
        run("build")?;
        Ok(run("list")?
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .map(|(reference, tar)| (reference.to_owned(), PathBuf::from(tar)))
            .collect())
    });
    built.as_ref().map_err(|e| anyhow::anyhow!("{e}"))
}

/// `mkimage.py inspect` of the image whose reference ends with `/<name>:<tag>`.
fn inspect(name: &str) -> anyhow::Result<Value> {
    let images = built_images()?;
    let (reference, tar) = images
        .iter()
        .find(|(r, _)| r.rsplit_once('/').is_some_and(|(_, last)| last.split(':').next() == Some(name)))
        .with_context(|| format!("images.sh list names no image {name}: {images:?}"))?;
    let out = Command::new("python3")
        .arg(repo_root().join("tests/harness/mkimage.py"))
        .arg("inspect")
        .arg(tar)
        .output()
        .context("running mkimage.py inspect")?;
    ensure!(out.status.success(), "inspect {}: {}", tar.display(), String::from_utf8_lossy(&out.stderr));
    let image: Value = serde_json::from_slice(&out.stdout).context("inspect output is not JSON")?;
    ensure!(image["repo_tags"] == serde_json::json!([reference]), "{} is tagged {}", tar.display(), image["repo_tags"]);
    ensure!(
        image["architecture"] == "amd64" && image["os"] == "linux" && image["layers"] == 1,
        "{reference}: expected one linux/amd64 layer, got {} {} {}",
        image["os"],
        image["architecture"],
        image["layers"]
    );
    Ok(image)
}

/// `path` is a regular file of the image that everyone may execute.
fn assert_executable_file(image: &Value, path: &str) -> anyhow::Result<()> {
    let tag = &image["repo_tags"][0];
    let file = &image["files"][path];
    ensure!(file["type"] == "file", "{tag}: {path} is not a regular file in the layer: {file}");
    let mode = file["mode"].as_u64().context("mode")?;
    ensure!(mode & 0o111 == 0o111, "{tag}: {path} has mode {mode:o}, not executable by everyone");
    Ok(())
}

/// `path` is an executable regular file of the image whose interpreter and libraries are all there.
fn assert_runnable(image: &Value, path: &str) -> anyhow::Result<()> {
    let tag = &image["repo_tags"][0];
    assert_executable_file(image, path)?;
    let exe = &image["executables"][path];
    ensure!(exe.is_object(), "{tag}: {path} is not a dynamically linked ELF executable");
    ensure!(exe["interpreter"].is_string(), "{tag}: {path} names no ELF interpreter");
    ensure!(exe["needed"].as_array().is_some_and(|n| !n.is_empty()), "{tag}: {path} needs no library?");
    ensure!(exe["missing"] == serde_json::json!([]), "{tag}: {path} needs what the image lacks: {}", exe["missing"]);
    Ok(())
}

/// Binaries linked statically: the proxy launcher, which the chart's initContainer copies into an
/// Envoy image whose libraries are not ours (`+crt-static`, agent-reconciler/Dockerfile).
const STATIC: [&str; 1] = ["/usr/local/bin/aether-proxy-launcher"];

/// `path` is an executable regular file of the image that names no ELF interpreter, so loads no
/// shared library: it runs in any image it is copied into.
fn assert_static(image: &Value, path: &str) -> anyhow::Result<()> {
    let tag = &image["repo_tags"][0];
    assert_executable_file(image, path)?;
    ensure!(
        image["executables"].get(path).is_none(),
        "{tag}: {path} is dynamically linked: {}",
        image["executables"][path]
    );
    Ok(())
}

/// The image config (Entrypoint, Cmd, User) and binaries equal what the Dockerfile's final stage says.
fn assert_matches_dockerfile(name: &str, dockerfile: &str) -> anyhow::Result<()> {
    let stage = final_stage(&repo_root().join(dockerfile))?;
    let image = inspect(name)?;
    let config = &image["config"];
    ensure!(
        config["Entrypoint"] == serde_json::json!(stage.entrypoint),
        "{name}: Entrypoint {} but {dockerfile} says {:?}",
        config["Entrypoint"],
        stage.entrypoint
    );
    let cmd = stage.cmd.as_ref().map_or(Value::Null, |c| serde_json::json!(c));
    ensure!(config["Cmd"] == cmd, "{name}: Cmd {} but {dockerfile} says {cmd}", config["Cmd"]);
    ensure!(
        config["User"] == stage.user.as_str(),
        "{name}: User {} but {dockerfile} says {}",
        config["User"],
        stage.user
    );
    ensure!(!stage.binaries.is_empty(), "{dockerfile}: no COPY --from line");
    for binary in &stage.binaries {
        if STATIC.contains(&binary.as_str()) {
            assert_static(&image, binary)?;
        } else {
            assert_runnable(&image, binary)?;
        }
        // The chart runs some of them by name (the cert Job's `command: ["aether-webhook-certs"]`).
        let dir = Path::new(binary).parent().and_then(Path::to_str).context("binary path")?;
        ensure!(on_path(config, dir), "{name}: {dir} (of {binary}) is not on the image's PATH: {}", config["Env"]);
    }
    Ok(())
}

/// Whether the config's `PATH` lists `dir`.
fn on_path(config: &Value, dir: &str) -> bool {
    config["Env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|e| e.strip_prefix("PATH=").is_some_and(|p| p.split(':').any(|d| d == dir)))
}

/// An image with a single entrypoint binary: it is there, runnable, and on PATH.
fn assert_entrypoint(name: &str, path: &str) -> anyhow::Result<()> {
    let image = inspect(name)?;
    ensure!(
        image["config"]["Entrypoint"] == serde_json::json!([path]),
        "{name}: Entrypoint is {}",
        image["config"]["Entrypoint"]
    );
    assert_runnable(&image, path)?;
    ensure!(on_path(&image["config"], "/usr/local/bin"), "{name}: /usr/local/bin is not on PATH");
    Ok(())
}

#[test]
fn controller_image_matches_its_dockerfile() -> anyhow::Result<()> {
    assert_matches_dockerfile("aether-controller", "controller/Dockerfile")
}

#[test]
fn agent_image_matches_its_dockerfile() -> anyhow::Result<()> {
    assert_matches_dockerfile("aether-agent", "agent-reconciler/Dockerfile")
}

#[test]
fn envoy_image_has_envoy_at_the_upstream_path() -> anyhow::Result<()> {
    assert_entrypoint("envoy", "/usr/local/bin/envoy")?;
    // Nothing of the launcher's: as in an upstream Envoy image, only what Envoy loads (a
    // dynamically linked launcher would also need libgcc_s, which Envoy does not).
    let image = inspect("envoy")?;
    let libgcc = image["files"].as_object().context("files")?.keys().find(|p| p.contains("libgcc_s"));
    ensure!(libgcc.is_none(), "envoy: carries {libgcc:?}, which only a dynamically linked launcher needs");
    Ok(())
}

#[test]
fn uds_echo_image_has_its_entrypoint() -> anyhow::Result<()> {
    assert_entrypoint("uds-echo", "/usr/local/bin/uds-echo")
}

#[test]
fn pause_image_has_its_entrypoint() -> anyhow::Result<()> {
    assert_entrypoint("pause", "/usr/local/bin/aether-pause")
}

#[test]
fn coredns_image_has_its_static_binary_run_as_root() -> anyhow::Result<()> {
    let path = "/usr/local/bin/coredns";
    let image = inspect("coredns")?;
    let config = &image["config"];
    ensure!(config["Entrypoint"] == serde_json::json!([path]), "coredns: Entrypoint is {}", config["Entrypoint"]);
    // It binds port 53 (dns.sh's pod keeps only NET_BIND_SERVICE of root's capabilities).
    ensure!(config["User"] == "0:0", "coredns: User is {}, not 0:0", config["User"]);
    // A static binary (CGO_ENABLED=0): no interpreter, so no library to carry.
    assert_static(&image, path)
}

/// The images of aether's own binaries carry the OCI annotation keys as config labels: the
/// workspace version (this crate inherits `workspace.package.version`), git HEAD and its commit
/// time (also the config's `created`, so a rebuild of the commit is byte-identical), the project
/// and its licence.
#[test]
fn aether_images_carry_the_oci_labels() -> anyhow::Result<()> {
    let git = |args: &[&str]| -> anyhow::Result<String> {
        let out = Command::new("git").arg("-C").arg(repo_root()).args(args).env("TZ", "UTC0").output()?;
        ensure!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8(out.stdout)?.trim().to_owned())
    };
    built_images()?; // first: the labels name HEAD as of the build
    let head = git(&["rev-parse", "HEAD"])?;
    let created = git(&["log", "-1", "--date=format-local:%Y-%m-%dT%H:%M:%SZ", "--format=%cd", "HEAD"])?;
    for (name, title) in [
        ("aether-controller", "aether-controller"),
        ("aether-agent", "aether-agent"),
        ("uds-echo", "uds-echo"),
        ("pause", "aether-pause"),
    ] {
        let image = inspect(name)?;
        let labels = &image["config"]["Labels"];
        for (key, want) in [
            ("title", title),
            ("version", env!("CARGO_PKG_VERSION")),
            ("revision", head.as_str()),
            ("created", created.as_str()),
            ("source", "https://github.com/aether-mesh/aether"),
            ("licenses", "Apache-2.0"),
        ] {
            let key = format!("org.opencontainers.image.{key}");
            ensure!(labels[&key] == want, "{name}: label {key} is {}, expected {want}", labels[&key]);
        }
        ensure!(
            labels["org.opencontainers.image.description"].as_str().is_some_and(|d| !d.is_empty()),
            "{name}: no description label: {labels}"
        );
        ensure!(
            image["created"] == created.as_str(),
            "{name}: config created {} but HEAD is of {created}",
            image["created"]
        );
    }
    Ok(())
}

#[test]
fn every_image_has_a_sticky_tmp_and_the_distroless_users() -> anyhow::Result<()> {
    for name in ["aether-controller", "aether-agent", "envoy", "uds-echo", "pause", "coredns"] {
        let image = inspect(name)?;
        let tmp = &image["files"]["/tmp"];
        ensure!(tmp["type"] == "dir" && tmp["mode"] == 0o1777, "{name}: /tmp is {tmp}, expected a 1777 dir");
        for path in ["/etc/passwd", "/etc/group", "/proc", "/sys", "/dev"] {
            ensure!(image["files"][path].is_object(), "{name}: {path} is missing");
        }
    }
    Ok(())
}

#[test]
fn the_image_builder_refuses_dockerfile_lines_it_cannot_reproduce() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("Dockerfile");
    let head = "FROM rust AS build\nFROM distroless\nCOPY --from=build /out/x /usr/local/bin/\n";
    for (tail, rule) in [
        ("USER 1\nENTRYPOINT /usr/local/bin/x\n", "Dockerfile:5: ENTRYPOINT must be a non-empty JSON array"),
        ("USER 1\nRUN true\nENTRYPOINT [\"/usr/local/bin/x\"]\n", "Dockerfile:5: the final stage uses RUN"),
        ("ENTRYPOINT [\"/usr/local/bin/x\"]\n", "the final stage has no USER"),
    ] {
        std::fs::write(&file, format!("{head}{tail}"))?;
        let out = Command::new("python3")
            .arg(repo_root().join("tests/harness/mkimage.py"))
            .arg("dockerfile")
            .arg(&file)
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success() && stderr.contains(rule), "{tail:?}: expected failure {rule:?}, got {stderr}");
    }
    Ok(())
}

#[test]
fn the_image_builder_refuses_bad_labels_and_times() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("x.tar");
    for (flags, rule) in [
        (&["--label", "no-equals-sign"][..], "--label no-equals-sign: expected KEY=VALUE"),
        (&["--label", "a=1", "--label", "a=2"][..], "--label a is given twice"),
        (&["--created", "2026-01-01 10:00:00"][..], "expected YYYY-MM-DDTHH:MM:SSZ"),
    ] {
        let run = Command::new("python3")
            .arg(repo_root().join("tests/harness/mkimage.py"))
            .args(["build", "--ref", "localhost/x:dev", "--out"])
            .arg(&out)
            .args(["--add", "/bin/true:/usr/local/bin/true", "--entrypoint", r#"["/usr/local/bin/true"]"#])
            .args(flags)
            .output()?;
        let stderr = String::from_utf8_lossy(&run.stderr);
        ensure!(!run.status.success() && stderr.contains(rule), "{flags:?}: expected failure {rule:?}, got {stderr}");
        ensure!(!out.exists(), "{flags:?}: a tarball was written");
    }
    Ok(())
}
