//! The chart mounts the kubelet pods dir read-only (docs/design-notes.md, "Envoy facts the design
//! relies on"). A common claim is that connect(2) on a Unix socket through a read-only mount fails
//! with EROFS; it does not: connect checks write permission on the socket inode, not whether the
//! mount is writable. This test keeps us honest with a real read-only bind mount (needs root, as CI
//! and the proxy have).

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::Command;

struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn run(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().expect("run mount");
    assert!(out.status.success(), "{args:?} failed (this test needs root): {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn connect_through_a_read_only_bind_mount_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("src"), dir.path().join("ro"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&dst).unwrap();
    let listener = UnixListener::bind(src.join("app.sock")).unwrap();
    run(&["mount", "--bind", src.to_str().unwrap(), dst.to_str().unwrap()]);
    let _mount = Mount(dst.clone());
    run(&["mount", "-o", "remount,bind,ro", dst.to_str().unwrap()]);
    // The mount really is read-only...
    let err = std::fs::write(dst.join("probe"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(30), "expected EROFS writing through the mount: {err}");
    // ...and connecting to the socket through it works.
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(b"pong").unwrap();
    });
    let mut client = UnixStream::connect(dst.join("app.sock")).expect("connect through the read-only mount");
    let mut buf = String::new();
    client.read_to_string(&mut buf).unwrap();
    server.join().unwrap();
    assert_eq!(buf, "pong");
}
