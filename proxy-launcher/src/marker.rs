//! The readiness marker: a pod-local file the launcher rewrites every second while its Envoy
//! serves: seen LIVE at its own epoch, and since then saying on its admin that it is LIVE with no
//! listener stopped ([`crate::readiness`]), or handed over and draining. The kubelet's readiness probe (`aether-proxy-launcher
//! probe`) checks that it is fresh. A probe of Envoy's own ports cannot tell the two proxy pods of
//! a hand-over apart: both reach whichever Envoy holds the shared sockets.
//!
//! So a successor is Ready only once it took over, and its parent stays Ready until its Envoy
//! exits: the DaemonSet's `maxUnavailable: 0` holds through the hand-over. The one exception is a
//! pod standing by beside an Envoy outside the hand-over ([`touch_standby`]): Ready without
//! serving, only while that Envoy's admin answers, so that a surge roll deletes the old pod.

use std::io::{self, Write};
use std::path::Path;
use std::time::{Duration, SystemTime};

/// Writes (or refreshes) the marker with a line saying which epoch.
pub fn touch(path: &Path, epoch: u32) -> io::Result<()> {
    replace(path, &format!("epoch {epoch} live\n"))
}

/// Writes (or refreshes) the marker of a pod that stands by beside an Envoy outside the hand-over
/// answering on `admin` (`crate::serving::Standby`): Ready without serving.
/// `beside` says which Envoy, e.g. "an Envoy outside the hand-over answers on ADDR".
pub fn touch_standby(path: &Path, beside: &str) -> io::Result<()> {
    replace(path, &format!("standby: {beside}; this pod's Envoy starts once it exits\n"))
}

/// Replaces the marker's content in one step: written to a temporary file in the marker's own
/// directory, then renamed over it (rename(2) is atomic within one file system). A reader, the
/// probe or a test, sees the old line or the new one, never the empty file that truncating in
/// place shows between the truncation and the write. Errors: the directory is not writable, or
/// the rename fails.
fn replace(path: &Path, line: &str) -> io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".marker-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .tempfile_in(dir)?;
    tmp.write_all(line.as_bytes())?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Removes the marker (absent is fine).
pub fn remove(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The probe: Ok with the marker's line when it was written within `max_age`; else an error that
/// says why (the kubelet shows it in the pod's events).
pub fn check(path: &Path, max_age: Duration) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("not ready: {}: {e}", path.display()))?;
    let age = meta.modified().ok().and_then(|m| SystemTime::now().duration_since(m).ok()).unwrap_or_default();
    if age > max_age {
        return Err(format!(
            "not ready: {} is {:.1} s old (the launcher refreshes it every second; limit {} s)",
            path.display(),
            age.as_secs_f64(),
            max_age.as_secs()
        ));
    }
    Ok(std::fs::read_to_string(path).unwrap_or_default().trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_is_ready_stale_or_absent_is_not() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("ready");
        assert!(check(&p, Duration::from_secs(5)).unwrap_err().contains("not ready"));
        touch(&p, 4).unwrap();
        assert_eq!(check(&p, Duration::from_secs(5)).unwrap(), "epoch 4 live");
        std::thread::sleep(Duration::from_millis(1100));
        assert!(check(&p, Duration::from_secs(0)).unwrap_err().contains("old"));
        remove(&p).unwrap();
        remove(&p).unwrap();
        assert!(check(&p, Duration::from_secs(5)).is_err());
    }

    #[test]
    fn a_reader_never_sees_a_half_written_marker() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("ready");
        touch(&p, 0).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (p, stop) = (p.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    touch(&p, n % 2).unwrap();
                    touch_standby(&p, "an Envoy outside the hand-over answers on X").unwrap();
                    n += 1;
                }
                n
            })
        };
        for _ in 0..20_000 {
            let line = check(&p, Duration::from_secs(5)).unwrap();
            assert!(line.starts_with("epoch ") || line.starts_with("standby: "), "read {line:?}");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(writer.join().unwrap() > 0);
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("ready")], "temporary files left behind");
    }
}
