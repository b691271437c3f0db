//! Network namespaces of pods, from the CNI plugin's records: the source used until the container
//! runtime answers (docs/reference.md, "`aether-agent`: the node side").
//!
//! The netns path is not in the Kubernetes API; the CNI plugin knows it. With
//! `--cni-records-dir DIR`, the agent reads `DIR/<pod uid>.json` = `{"netns": "/var/run/netns/..."}`
//! on the pod's events and on each periodic re-check (the driver stores the answer in the index,
//! so render does no I/O), and dials `127.0.0.1:<port>` inside that namespace. Without a
//! record it dials the pod IP. A record's netns passes the same rules as the container runtime's
//! ([`NetnsDirs::translate`]: a plain file directly inside `--netns-host-dir`, opened by the proxy
//! under `--netns-proxy-dir`); a record that breaks them is ignored (logged, naming the rule).

use std::path::PathBuf;

use aether_crds::PodDirId;

use crate::runtime::NetnsDirs;

/// Reads CNI records from a directory; `None` directory = no records.
#[derive(Debug, Clone, Default)]
pub struct CniRecords {
    dir: Option<PathBuf>,
    dirs: NetnsDirs,
}

#[derive(serde::Deserialize)]
struct Record {
    netns: String,
}

impl CniRecords {
    /// Records under `dir`, or none; their paths are checked and translated with `dirs`.
    pub fn new(dir: Option<PathBuf>, dirs: NetnsDirs) -> Self {
        CniRecords { dir, dirs }
    }

    /// Where pod network namespaces are on the host and in the proxy.
    pub fn dirs(&self) -> &NetnsDirs {
        &self.dirs
    }

    /// The netns path of pod `uid` as the proxy opens it, when a usable record exists.
    pub fn netns(&self, uid: &str) -> Option<String> {
        let dir = self.dir.as_ref()?;
        PodDirId::new(uid).ok()?;
        let path = dir.join(format!("{uid}.json"));
        let bytes = std::fs::read(&path).ok()?;
        match serde_json::from_slice::<Record>(&bytes) {
            Ok(r) => match self.dirs.translate(&r.netns) {
                Ok(p) => Some(p.into_string()),
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "CNI record ignored");
                    None
                }
            },
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "CNI record ignored: not {{\"netns\": \"/path\"}}");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

    #[test]
    fn a_record_gives_the_netns_and_bad_records_give_none() {
        let dir = tempfile::tempdir().unwrap();
        let recs = CniRecords::new(Some(dir.path().to_owned()), NetnsDirs::default());
        assert_eq!(recs.netns(UID), None);
        std::fs::write(dir.path().join(format!("{UID}.json")), br#"{"netns": "/var/run/netns/cni-1"}"#).unwrap();
        assert_eq!(recs.netns(UID).as_deref(), Some("/run/netns/cni-1"), "as the proxy opens it");
        for bad in ["relative", "/proc/1/ns/net", "/run/netns/a/b", "/run/netns/.."] {
            std::fs::write(dir.path().join(format!("{UID}.json")), format!(r#"{{"netns": "{bad}"}}"#)).unwrap();
            assert_eq!(recs.netns(UID), None, "{bad}");
        }
        assert_eq!(recs.netns("../etc/passwd"), None);
        assert_eq!(CniRecords::default().netns(UID), None);
    }
}
