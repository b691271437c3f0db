//! Envoy's hot restart shared memory: the `envoy_shared_memory_<10 × base id>` segment in the
//! node's shared `/dev/shm`. Its layout (Envoy `source/server/hot_restart_impl.h`, `SharedMemory`):
//! `size_` (u64, the segment's size in bytes), `version_` (u64, 11 since 2019), two
//! `pthread_mutex_t`, then `flags_` (u64) as the last 8 bytes; 104 bytes on x86_64, which is the
//! `.104` in `envoy --hot-restart-version`.
//!
//! Bit 0 of `flags_` (`SHMEM_FLAGS_INITIALIZING`) is set by an Envoy at epoch > 0 when it starts
//! and cleared only once it takes over. An Envoy that died before taking over leaves it set, and
//! every later epoch then exits with "previous envoy process is still initializing". The launcher
//! clears it while it holds the start lock, when no Envoy can be initializing.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The layout version this code knows (`HOT_RESTART_VERSION` in Envoy's `hot_restart_impl.h`).
pub const SHARED_MEMORY_VERSION: u64 = 11;
const INITIALIZING: u64 = 1;

/// The segment's path in `shm_dir` for `base_id` (Envoy multiplies the base id by 10).
pub fn segment(shm_dir: &Path, base_id: u32) -> PathBuf {
    shm_dir.join(format!("envoy_shared_memory_{}", u64::from(base_id) * 10))
}

/// Makes the node's shared-memory directory `dir` root-only (mode 0700, refused unless root owns
/// it: [`crate::state_dir`]'s rule for the hand-over state), so no other user of the node sees
/// or touches Envoy's segment there. A sticky directory (mode `1777`: a host's own `/dev/shm`,
/// shared by every process on it, as when the launcher runs outside the chart) is left as it is.
/// Returns whether the directory is now root-only. Errors: I/O with the path, or
/// `PermissionDenied` naming the owner.
pub fn restrict_dir(dir: &Path) -> io::Result<bool> {
    use std::os::unix::fs::PermissionsExt;
    let meta =
        std::fs::symlink_metadata(dir).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    if meta.is_dir() && meta.permissions().mode() & 0o1000 != 0 {
        return Ok(false);
    }
    crate::state_dir::open_root_only(dir, "shared memory dir").map(|_| true)
}

/// What [`clear_initializing`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Flag {
    /// No segment yet (a cold start creates it).
    NoSegment,
    /// The flag was clear.
    Clear,
    /// The flag was set by an Envoy that never took over; it is now clear.
    Cleared,
}

/// Clears the initializing flag of the segment at `path`. Errors: I/O, or a segment whose size or
/// version is not the layout above (then it is left untouched, and the error says what it held).
pub fn clear_initializing(path: &Path) -> io::Result<Flag> {
    let f = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Flag::NoSegment),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    let word = |at: u64| -> io::Result<u64> {
        let mut b = [0u8; 8];
        f.read_exact_at(&mut b, at)?;
        Ok(u64::from_ne_bytes(b))
    };
    let (size, version) = if len >= 24 { (word(0)?, word(8)?) } else { (0, 0) };
    if len < 24 || size != len || version != SHARED_MEMORY_VERSION {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: {len} bytes, size field {size}, version {version}: not an Envoy hot restart segment of \
                 version {SHARED_MEMORY_VERSION}",
                path.display()
            ),
        ));
    }
    let flags = word(len - 8)?;
    if flags & INITIALIZING == 0 {
        return Ok(Flag::Clear);
    }
    f.write_all_at(&(flags & !INITIALIZING).to_ne_bytes(), len - 8)?;
    Ok(Flag::Cleared)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment_bytes(flags: u64) -> Vec<u8> {
        let mut b = vec![0u8; 104];
        b[0..8].copy_from_slice(&104u64.to_ne_bytes());
        b[8..16].copy_from_slice(&11u64.to_ne_bytes());
        b[96..104].copy_from_slice(&flags.to_ne_bytes());
        b
    }

    #[test]
    fn a_left_over_initializing_flag_is_cleared_and_nothing_else_is_touched() {
        let tmp = tempfile::tempdir().unwrap();
        let p = segment(tmp.path(), 7391);
        assert!(p.ends_with("envoy_shared_memory_73910"));
        assert_eq!(clear_initializing(&p).unwrap(), Flag::NoSegment);
        std::fs::write(&p, segment_bytes(0b11)).unwrap();
        assert_eq!(clear_initializing(&p).unwrap(), Flag::Cleared);
        assert_eq!(std::fs::read(&p).unwrap(), segment_bytes(0b10));
        assert_eq!(clear_initializing(&p).unwrap(), Flag::Clear);
    }

    #[test]
    fn an_unknown_layout_is_refused_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let p = segment(tmp.path(), 1);
        let mut b = segment_bytes(1);
        b[8..16].copy_from_slice(&12u64.to_ne_bytes());
        std::fs::write(&p, &b).unwrap();
        let err = clear_initializing(&p).unwrap_err();
        assert!(err.to_string().contains("version 12"), "{err}");
        assert_eq!(std::fs::read(&p).unwrap(), b);
        std::fs::write(&p, [0u8; 10]).unwrap();
        assert!(clear_initializing(&p).is_err());
    }

    #[test]
    fn the_chart_s_shm_dir_becomes_root_only_a_host_s_sticky_dev_shm_is_left_alone() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let tmp = tempfile::tempdir().unwrap();
        // What the kubelet makes for a DirectoryOrCreate hostPath: 0755.
        let ours = tmp.path().join("shm");
        std::fs::create_dir(&ours).unwrap();
        std::fs::set_permissions(&ours, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(restrict_dir(&ours).unwrap());
        assert_eq!(mode(&ours), 0o700);
        let shared = tmp.path().join("dev-shm");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(!restrict_dir(&shared).unwrap());
        assert_eq!(mode(&shared), 0o1777);
        // A symlink in its place is refused, its target untouched.
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&ours, &link).unwrap();
        std::fs::set_permissions(&ours, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(restrict_dir(&link).is_err());
        assert_eq!(mode(&ours), 0o755);
    }
}
