//! `kubectl aether budget`: the socket-value arithmetic of [`aether_crds::udspath::Budget`]
//! (docs/kubectl-plugin.md, "`budget`: the arithmetic"), explained, and given values checked
//! against it.

use aether_crds::udspath::{self, Budget, FIXED_BYTES, SUN_PATH_MAX, UID_BYTES};
use aether_crds::{Rules, SocketLimit};
use serde::Serialize;

/// The budget report, the `-o json|yaml` shape.
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The pods dir as given (no trailing `/`).
    pub pods_dir: String,
    /// Its length in bytes.
    pub pods_dir_bytes: usize,
    /// `sun-path` or `filesystem`.
    pub socket_limit: String,
    /// The longest `<volume>/<file>` value admitted, in bytes; `None` when the pods dir leaves
    /// no usable budget (every pod would be delivered over TCP).
    pub budget_bytes: Option<usize>,
    /// The arithmetic, one sentence.
    pub arithmetic: String,
    /// The longest host path of a socket under this budget (with a 36-byte UID), as an example.
    pub example_path: Option<String>,
    /// Each checked value: fits or why not.
    pub values: Vec<ValueCheck>,
}

/// One checked value.
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ValueCheck {
    /// The value.
    pub value: String,
    /// Its length in bytes.
    pub bytes: usize,
    /// True when it passes the grammar and fits the budget.
    pub fits: bool,
    /// Why not (the rule, as the webhook and the agent word it).
    pub error: Option<String>,
}

/// The report for `rules` and `values`.
pub fn report(rules: &Rules, pods_dir: &str, values: &[String]) -> Report {
    let limit = rules.limit();
    let trimmed = pods_dir.strip_suffix('/').filter(|t| !t.is_empty()).unwrap_or(pods_dir);
    let (budget_bytes, arithmetic, example_path) = match rules.budget() {
        Ok(b) => (Some(b.bytes()), explain(b), Some(example(b))),
        Err(e) => (None, e.to_string(), None),
    };
    let values = values
        .iter()
        .map(|v| {
            let error = match rules.budget() {
                Ok(b) => b.check(v).err().map(|e| format!("{v:?} {e}")),
                Err(e) => Some(format!("no value fits: {e}")),
            };
            ValueCheck { value: v.clone(), bytes: v.len(), fits: error.is_none(), error }
        })
        .collect();
    Report {
        pods_dir: trimmed.to_owned(),
        pods_dir_bytes: trimmed.len(),
        socket_limit: limit.flag_value().to_owned(),
        budget_bytes,
        arithmetic,
        example_path,
        values,
    }
}

/// The sentence that derives the budget.
fn explain(b: &Budget) -> String {
    match b.limit() {
        SocketLimit::SunPath => format!(
            "a <volume>/<file> value may have {SUN_PATH_MAX} - {len} - {FIXED_BYTES} = {bytes} bytes: the socket's host \
             path {dir}/<uid>/volumes/{plugin}/<volume>/<file> must fit in sun_path ({SUN_PATH_MAX} bytes without \
             the NUL); {len} bytes are the pods dir, {FIXED_BYTES} are \"/\" + the {UID_BYTES}-byte pod UID + \
             \"/volumes/{plugin}/\"",
            len = b.pods_dir().len(),
            bytes = b.bytes(),
            dir = b.pods_dir(),
            plugin = udspath::EMPTY_DIR_PLUGIN,
        ),
        SocketLimit::Filesystem => format!(
            "a <volume>/<file> value may have {bytes} bytes whatever the pods dir: Envoy dials only the agent's pin \
             (--pin-dir), so only the file system limits it: the volume a DNS-1123 label of at most {vol} bytes, \"/\", \
             the file at most {name} bytes (NAME_MAX)",
            bytes = b.bytes(),
            vol = udspath::VOLUME_NAME_MAX,
            name = udspath::NAME_MAX,
        ),
    }
}

/// The longest socket path the budget admits, with an example UID and a value of exactly the
/// budget (`s/` and `x`s).
fn example(b: &Budget) -> String {
    let uid = "0".repeat(8) + "-0000-0000-0000-" + &"0".repeat(12);
    let file = "x".repeat(b.bytes().saturating_sub(2).min(udspath::NAME_MAX));
    format!("{}/{uid}/volumes/{}/s/{file}", b.pods_dir(), udspath::EMPTY_DIR_PLUGIN)
}

/// The text form.
pub fn render_text(r: &Report) -> String {
    let mut s =
        format!("pods dir:     {} ({} bytes)\nsocket limit: {}\n", r.pods_dir, r.pods_dir_bytes, r.socket_limit);
    match r.budget_bytes {
        Some(b) => s.push_str(&format!("budget:       {b} bytes for <volume>/<file>\n")),
        None => s.push_str("budget:       none: every pod is delivered over TCP\n"),
    }
    s.push_str(&format!("why:          {}\n", r.arithmetic));
    if let Some(p) = &r.example_path {
        s.push_str(&format!("longest path: {p} ({} bytes)\n", p.len()));
    }
    for v in &r.values {
        match &v.error {
            None => s.push_str(&format!("fits:         {:?} ({} bytes)\n", v.value, v.bytes)),
            Some(e) => s.push_str(&format!("does not fit: {e}\n")),
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(dir: &str, limit: SocketLimit, values: &[&str]) -> Report {
        let values: Vec<String> = values.iter().map(|v| (*v).to_owned()).collect();
        report(&Rules::with_limit(dir, limit), dir, &values)
    }

    #[test]
    fn the_default_pods_dir_leaves_16_bytes_and_the_example_path_is_exactly_107() {
        let r = of("/var/lib/kubelet/pods", SocketLimit::SunPath, &["s/app.sock", "sockets/app.sock", "s/x/y"]);
        assert_eq!((r.pods_dir_bytes, r.budget_bytes), (21, Some(16)));
        assert!(
            r.arithmetic.starts_with("a <volume>/<file> value may have 107 - 21 - 70 = 16 bytes"),
            "{}",
            r.arithmetic
        );
        assert_eq!(r.example_path.as_ref().map(String::len), Some(SUN_PATH_MAX));
        let fits: Vec<(bool, usize)> = r.values.iter().map(|v| (v.fits, v.bytes)).collect();
        assert_eq!(fits, [(true, 10), (true, 16), (false, 5)]);
        assert!(r.values[2].error.as_deref().is_some_and(|e| e.contains("\"s/x/y\"")), "{:?}", r.values[2]);
        let over = of("/var/lib/kubelet/pods", SocketLimit::SunPath, &["sockets/app1.sock"]);
        assert!(!over.values[0].fits, "17 bytes is over 16");
        assert!(render_text(&over).contains("does not fit: \"sockets/app1.sock\""), "{}", render_text(&over));
    }

    #[test]
    fn a_short_mount_path_widens_the_budget_and_a_long_one_leaves_none() {
        assert_eq!(of("/k", SocketLimit::SunPath, &[]).budget_bytes, Some(35));
        let long = of("/var/snap/microk8s/common/var/lib/kubelet/pods", SocketLimit::SunPath, &["a/b"]);
        assert_eq!(long.budget_bytes, None);
        assert!(long.arithmetic.contains("at least 3 are needed"), "{}", long.arithmetic);
        assert!(!long.values[0].fits);
        assert!(render_text(&long).contains("budget:       none"), "{}", render_text(&long));
    }

    #[test]
    fn the_file_system_limit_ignores_the_pods_dir_length() {
        let r = of("/var/snap/microk8s/common/var/lib/kubelet/pods", SocketLimit::Filesystem, &["s/app.sock"]);
        assert_eq!(r.budget_bytes, Some(udspath::FILESYSTEM_VALUE_MAX));
        assert!(r.arithmetic.contains("--pin-dir"), "{}", r.arithmetic);
        assert!(r.values[0].fits);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["socketLimit"], "filesystem");
        assert_eq!(json["budgetBytes"], 319);
    }
}
