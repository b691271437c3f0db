//! The state dir (`--state-dir`): what the agent needs to serve the same clusters while the API
//! server is unreachable (spec "Shared Plumbing" item 1: delivery must not depend on API-server
//! availability at boot).
//!
//! Layout, each file JSON with a format version, written atomically (temp file in the same
//! directory, fsync, rename):
//!
//! ```text
//! <state-dir>/pods/<pod uid>.json   {"version": 1, "record": {<pod record>, "netns": "/run/netns/cni-..."}}
//! <state-dir>/policies.json         {"version": 1, "record": [<policy record>, ...]}
//! <state-dir>/pod-events.json       {"version": 1, "record": {"ledger": ..., "stranded": [...]}}
//! ```
//!
//! A pod's file holds its record and the node facts it was last served with ([`StoredPod`]: the
//! network namespace the runtime reported, absent for a pod without one), so a restarted agent
//! offers Envoy the same clusters and inbound listeners before it can ask the runtime or the API
//! server again. Files written before `netns` was kept read as pods without one.
//!
//! `pod-events.json` holds which pods were already told about a TCP fallback (with a Kubernetes
//! Event) and why, so a restarted agent does not tell them again.
//!
//! One file per pod keeps a pod change to one small write. A file that cannot be read, parsed, or
//! has another format version is reported and skipped, never fatal: the agent then serves less
//! until the API server answers, and rewrites it.

use std::collections::HashSet;
use std::fs;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use aether_crds::PodDirId;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The format version written into every state file.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Serialize, serde::Deserialize)]
struct Envelope<T> {
    version: u32,
    record: T,
}

/// One pod's state file as written: the pod's record with the node facts it was served with
/// (its fields and `netns` side by side in one JSON object).
#[derive(Serialize)]
pub struct StoredPodRef<'a, T> {
    /// The pod's record.
    #[serde(flatten)]
    pub record: &'a T,
    /// The pod's network-namespace path as the proxy opens it (the runtime's answer); `None` when
    /// none is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub netns: Option<&'a str>,
}

/// One pod's state file as read back ([`StoredPodRef`]).
#[derive(serde::Deserialize)]
pub struct StoredPod<T> {
    /// The pod's record.
    #[serde(flatten)]
    pub record: T,
    /// The network-namespace path it was served with; `None` when none was known (or the file
    /// predates it).
    #[serde(default)]
    pub netns: Option<String>,
}

/// Errors of the state store; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An I/O error.
    #[error("state file {path}: {error}")]
    Io {
        /// The file or directory.
        path: String,
        /// The OS error. Its text ends the message, so it is not also the `source()`: a printed
        /// cause chain shows it once.
        error: std::io::Error,
    },
    /// Not valid JSON of the expected shape.
    #[error("state file {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: String,
        /// The parser's message.
        reason: String,
    },
    /// Written by another format version.
    #[error("state file {path} has format version {found}, this agent reads {FORMAT_VERSION}")]
    Version {
        /// The file.
        path: String,
        /// The version found.
        found: u32,
    },
    /// A pod record whose own UID is not the one its file is named after (a copied or edited
    /// file): not replayed.
    #[error("state file {path} holds the record of pod uid {found:?}, not of the uid it is named after")]
    UidMismatch {
        /// The file.
        path: String,
        /// The UID inside the record.
        found: String,
    },
    /// A pod UID that is not a canonical UUID cannot name a file.
    #[error("refusing to store a pod under uid {0:?}: not a canonical UUID")]
    BadUid(String),
}

/// The state dir.
#[derive(Debug, Clone)]
pub struct StateStore {
    dir: PathBuf,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |error| StoreError::Io { path: path.display().to_string(), error }
}

impl StateStore {
    /// Opens (creating) `<dir>` and `<dir>/pods`.
    ///
    /// # Errors
    /// [`StoreError::Io`] when the directories cannot be created.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let dir = dir.into();
        let pods = dir.join("pods");
        fs::create_dir_all(&pods).map_err(io_err(&pods))?;
        Ok(StateStore { dir })
    }

    fn pod_path(&self, uid: &str) -> Result<PathBuf, StoreError> {
        PodDirId::new(uid).map_err(|_| StoreError::BadUid(uid.to_owned()))?;
        Ok(self.dir.join("pods").join(format!("{uid}.json")))
    }

    fn write_atomic<T: Serialize>(&self, path: &Path, record: &T) -> Result<(), StoreError> {
        let parent = path.parent().unwrap_or(&self.dir);
        let body = serde_json::to_vec(&Envelope { version: FORMAT_VERSION, record })
            .map_err(|e| StoreError::Corrupt { path: path.display().to_string(), reason: e.to_string() })?;
        let mut tmp = tempfile::NamedTempFile::new_in(parent).map_err(io_err(parent))?;
        tmp.write_all(&body).map_err(io_err(path))?;
        tmp.as_file().sync_all().map_err(io_err(path))?;
        tmp.persist(path).map_err(|e| StoreError::Io { path: path.display().to_string(), error: e.error })?;
        Ok(())
    }

    fn read<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, StoreError> {
        let bytes = match fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(path)(e)),
        };
        let corrupt =
            |e: serde_json::Error| StoreError::Corrupt { path: path.display().to_string(), reason: e.to_string() };
        let head: Envelope<serde::de::IgnoredAny> = serde_json::from_slice(&bytes).map_err(corrupt)?;
        if head.version != FORMAT_VERSION {
            return Err(StoreError::Version { path: path.display().to_string(), found: head.version });
        }
        let env: Envelope<T> = serde_json::from_slice(&bytes).map_err(corrupt)?;
        Ok(Some(env.record))
    }

    /// Writes one pod's record atomically.
    ///
    /// # Errors
    /// [`StoreError::BadUid`] for a uid that is not a canonical UUID; [`StoreError::Io`].
    pub fn save_pod<T: Serialize>(&self, uid: &str, record: &T) -> Result<(), StoreError> {
        let path = self.pod_path(uid)?;
        self.write_atomic(&path, record)
    }

    /// Removes one pod's record (absent is fine).
    ///
    /// # Errors
    /// [`StoreError::Io`] for anything but "not found".
    pub fn remove_pod(&self, uid: &str) -> Result<(), StoreError> {
        let path = self.pod_path(uid)?;
        match fs::remove_file(&path) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(io_err(&path)(e)),
            _ => Ok(()),
        }
    }

    /// Loads every pod record, each with its file (`pods/<uid>.json`), so the caller can refuse a
    /// record whose own UID is not the file's. Files that cannot be used are returned as
    /// errors beside the records that can (and left in place until [`StateStore::retain_pods`] or a
    /// save replaces them).
    pub fn load_pods<T: DeserializeOwned>(&self) -> (Vec<(PathBuf, T)>, Vec<StoreError>) {
        let dir = self.dir.join("pods");
        let (mut records, mut errors) = (Vec::new(), Vec::new());
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) => return (records, vec![io_err(&dir)(e)]),
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        for path in paths {
            match Self::read(&path) {
                Ok(Some(r)) => records.push((path, r)),
                Ok(None) => {}
                Err(e) => errors.push(e),
            }
        }
        (records, errors)
    }

    /// After the first complete pod list: removes the records of pods not in `keep` (uids).
    /// Returns how many were removed.
    ///
    /// # Errors
    /// [`StoreError::Io`] when the directory cannot be listed or a file removed.
    pub fn retain_pods(&self, keep: &HashSet<String>) -> Result<usize, StoreError> {
        let dir = self.dir.join("pods");
        let mut removed = 0;
        for entry in fs::read_dir(&dir).map_err(io_err(&dir))?.filter_map(Result::ok) {
            let path = entry.path();
            let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_owned();
            let is_record = path.extension().is_some_and(|x| x == "json");
            if (is_record && !keep.contains(&stem)) || stem.starts_with(".tmp") {
                fs::remove_file(&path).map_err(io_err(&path))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Writes the policy records atomically (the whole list; policies are few).
    ///
    /// # Errors
    /// [`StoreError::Io`].
    pub fn save_policies<T: Serialize>(&self, records: &[T]) -> Result<(), StoreError> {
        self.write_atomic(&self.dir.join("policies.json"), &records)
    }

    /// Writes the pod-Event records atomically (see [`crate::pod_events::Ledger`]).
    ///
    /// # Errors
    /// [`StoreError::Io`].
    pub fn save_pod_events<T: Serialize>(&self, record: &T) -> Result<(), StoreError> {
        self.write_atomic(&self.dir.join("pod-events.json"), record)
    }

    /// Loads the pod-Event records, `None` when never saved.
    ///
    /// # Errors
    /// [`StoreError`] naming the file when it cannot be used.
    pub fn load_pod_events<T: DeserializeOwned>(&self) -> Result<Option<T>, StoreError> {
        Self::read(&self.dir.join("pod-events.json"))
    }

    /// Loads the policy records, `None` when never saved.
    ///
    /// # Errors
    /// [`StoreError`] naming the file when it cannot be used.
    pub fn load_policies<T: DeserializeOwned>(&self) -> Result<Option<Vec<T>>, StoreError> {
        Self::read(&self.dir.join("policies.json"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, serde::Deserialize, Debug, PartialEq, Clone)]
    struct Rec {
        uid: String,
        socket: Option<String>,
    }

    const A: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
    const B: &str = "11111111-2222-3333-4444-555555555555";

    fn rec(uid: &str) -> Rec {
        Rec { uid: uid.into(), socket: Some("s/app.sock".into()) }
    }

    #[test]
    fn records_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::open(dir.path()).unwrap();
        s.save_pod(A, &rec(A)).unwrap();
        s.save_pod(B, &rec(B)).unwrap();
        s.save_policies(&[rec("p")]).unwrap();
        let s2 = StateStore::open(dir.path()).unwrap();
        let (pods, errors): (Vec<(PathBuf, Rec)>, _) = s2.load_pods();
        assert!(errors.is_empty());
        assert_eq!(pods.into_iter().map(|(_, r)| r).collect::<Vec<_>>(), vec![rec(A), rec(B)]);
        assert_eq!(s2.load_policies::<Rec>().unwrap(), Some(vec![rec("p")]));
    }

    #[test]
    fn a_corrupt_or_foreign_version_file_is_reported_and_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::open(dir.path()).unwrap();
        s.save_pod(A, &rec(A)).unwrap();
        fs::write(dir.path().join(format!("pods/{B}.json")), b"{\"version\":1,\"rec").unwrap();
        fs::write(dir.path().join("pods/22222222-2222-3333-4444-555555555555.json"), b"{\"version\":9,\"record\":{}}")
            .unwrap();
        let (pods, errors): (Vec<(PathBuf, Rec)>, _) = s.load_pods();
        assert_eq!(pods, vec![(dir.path().join(format!("pods/{A}.json")), rec(A))]);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors.iter().any(|e| matches!(e, StoreError::Version { found: 9, .. })));
    }

    #[test]
    fn stale_records_are_removed_after_the_first_complete_list() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::open(dir.path()).unwrap();
        s.save_pod(A, &rec(A)).unwrap();
        s.save_pod(B, &rec(B)).unwrap();
        let removed = s.retain_pods(&HashSet::from([A.to_owned()])).unwrap();
        assert_eq!(removed, 1);
        let (pods, _): (Vec<(PathBuf, Rec)>, _) = s.load_pods();
        assert_eq!(pods, vec![(dir.path().join(format!("pods/{A}.json")), rec(A))]);
    }

    #[test]
    fn a_uid_that_is_not_a_uuid_never_names_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::open(dir.path()).unwrap();
        assert!(matches!(s.save_pod("../../etc/x", &rec("x")), Err(StoreError::BadUid(_))));
        assert!(matches!(s.remove_pod("../x"), Err(StoreError::BadUid(_))));
    }

    #[test]
    fn no_policy_file_means_none() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateStore::open(dir.path()).unwrap();
        assert_eq!(s.load_policies::<Rec>().unwrap(), None);
    }
}
