//! Network namespaces of pods, from the CNI plugin's records: the source used until the container
//! runtime answers (docs/reference.md, "`aether-agent`: the node side").
//!
//! The netns path is not in the Kubernetes API; the CNI plugin knows it. With
//! `--cni-records-dir DIR`, the agent reads `DIR/<pod uid>.json` = `{"netns": "/var/run/netns/..."}`
//! on the pod's events and on each periodic re-check (the driver stores the answer in the index,
//! so render does no I/O), and dials `127.0.0.1:<port>` inside that namespace. Without a
//! record it dials the pod IP. A record whose netns is not an absolute path is ignored (logged).

use std::path::PathBuf;

use aether_crds::PodDirId;

/// Reads CNI records from a directory; `None` directory = no records.
#[derive(Debug, Clone, Default)]
pub struct CniRecords {
    dir: Option<PathBuf>,
}

#[derive(serde::Deserialize)]
struct Record {
    netns: String,
}

impl CniRecords {
    /// Records under `dir`, or none.
    pub fn new(dir: Option<PathBuf>) -> Self {
        CniRecords { dir }
    }

    /// The netns path of pod `uid`, when a usable record exists.
    pub fn netns(&self, uid: &str) -> Option<String> {
        let dir = self.dir.as_ref()?;
        PodDirId::new(uid).ok()?;
        let path = dir.join(format!("{uid}.json"));
        let bytes = std::fs::read(&path).ok()?;
        match serde_json::from_slice::<Record>(&bytes) {
            Ok(r) if r.netns.starts_with('/') && !r.netns.contains('\0') => Some(r.netns),
            Ok(r) => {
                tracing::warn!(file = %path.display(), netns = %r.netns, "CNI record ignored: netns is not an absolute path");
                None
            }
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
        let recs = CniRecords::new(Some(dir.path().to_owned()));
        assert_eq!(recs.netns(UID), None);
        std::fs::write(dir.path().join(format!("{UID}.json")), br#"{"netns": "/var/run/netns/cni-1"}"#).unwrap();
        assert_eq!(recs.netns(UID).as_deref(), Some("/var/run/netns/cni-1"));
        std::fs::write(dir.path().join(format!("{UID}.json")), br#"{"netns": "relative"}"#).unwrap();
        assert_eq!(recs.netns(UID), None);
        assert_eq!(recs.netns("../etc/passwd"), None);
        assert_eq!(CniRecords::default().netns(UID), None);
    }
}
