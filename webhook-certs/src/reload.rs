//! A rustls [`ResolvesServerCert`] that serves `tls.crt` + `tls.key` from a folder and picks up
//! new files without a restart.
//!
//! The folder is typically a mounted `kubernetes.io/tls` Secret: the kubelet writes a new
//! timestamped folder, repoints the `..data` symlink at it in one `rename(2)`, and `tls.crt` /
//! `tls.key` are symlinks through `..data`. Reading the two paths therefore follows the swap.
//!
//! The resolver polls: every interval it reads both files and, when their bytes differ from the
//! last ones it looked at, parses them and checks that the key matches the certificate. A good
//! pair replaces the served one atomically; a bad one (unparsable, half-written, key of another
//! certificate, missing file) is logged once, naming the file, and the last good pair keeps
//! being served. Nothing here panics.
//!
//! [`ReloadingCertResolver::on_load`] registers a function called with every pair that is served
//! from then on (aether-controller sets its certificate-expiry gauge there).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::{CERT_FILE, KEY_FILE};

/// Why a certificate/key pair could not be loaded. Each variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file could not be read.
    #[error("cannot read {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error. Its text ends the message, so it is not also the `source()`: a printed
        /// cause chain shows it once.
        error: std::io::Error,
    },
    /// The certificate file holds no parsable PEM certificate.
    #[error("{path} holds no PEM certificate: {reason}")]
    Cert {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The key file holds no parsable PEM private key.
    #[error("{path} holds no PEM private key: {reason}")]
    Key {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The key does not belong to the certificate (e.g. files caught half-way through a swap).
    #[error("{key} does not match the certificate in {cert}: {reason}")]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls' reason.
        reason: String,
    },
}

impl LoadError {
    /// A short, stable label for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            LoadError::Read { .. } => "read",
            LoadError::Cert { .. } => "cert",
            LoadError::Key { .. } => "key",
            LoadError::Mismatch { .. } => "mismatch",
        }
    }
}

fn provider() -> Arc<CryptoProvider> {
    CryptoProvider::get_default().cloned().unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

/// Parses a PEM certificate chain and a PEM private key and checks that they belong together.
/// `cert_path` and `key_path` only name the sources in errors.
///
/// # Errors
/// [`LoadError`] naming the file at fault.
pub fn certified_key_from_pem(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: &Path,
    key_path: &Path,
) -> Result<CertifiedKey, LoadError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| LoadError::Cert { path: cert_path.to_path_buf(), reason: e.to_string() })?;
    if chain.is_empty() {
        return Err(LoadError::Cert { path: cert_path.to_path_buf(), reason: "no CERTIFICATE block".into() });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| LoadError::Key { path: key_path.to_path_buf(), reason: e.to_string() })?;
    let provider = provider();
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| LoadError::Key { path: key_path.to_path_buf(), reason: e.to_string() })?;
    let ck = CertifiedKey::new(chain, signing);
    // A key whose public half is unknown cannot be checked; every key rcgen/ring load can.
    ck.keys_match().map_err(|e| LoadError::Mismatch {
        cert: cert_path.to_path_buf(),
        key: key_path.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok(ck)
}

/// The bytes of both files, as last looked at.
#[derive(PartialEq, Eq, Clone, Default)]
struct Seen {
    cert: Vec<u8>,
    key: Vec<u8>,
}

/// A function told of each pair served ([`ReloadingCertResolver::on_load`]).
type OnLoad = Box<dyn Fn(&CertifiedKey) + Send + Sync>;

/// Serves the certificate in a folder's `tls.crt` / `tls.key` (or two named files) and reloads it
/// when they change.
/// See the module docs.
pub struct ReloadingCertResolver {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    /// What the files held at the last check (good or bad), so a bad pair is logged once.
    seen: Mutex<Seen>,
    /// Called with each newly served pair.
    on_load: Mutex<Vec<OnLoad>>,
}

impl std::fmt::Debug for ReloadingCertResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCertResolver")
            .field("cert", &self.cert_path)
            .field("key", &self.key_path)
            .finish_non_exhaustive()
    }
}

/// What a [`ReloadingCertResolver::check`] found.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum CheckOutcome {
    /// The files are byte-for-byte what was last looked at.
    Unchanged,
    /// A new good pair is now served.
    Reloaded,
    /// The files changed but are not a usable pair; the last good one is still served.
    KeptPrevious,
}

impl ReloadingCertResolver {
    /// Loads `dir/tls.crt` and `dir/tls.key`. The first load must succeed (there is nothing to
    /// fall back to).
    ///
    /// # Errors
    /// [`LoadError`] naming the file at fault.
    pub fn new(dir: impl AsRef<Path>) -> Result<Self, LoadError> {
        let dir = dir.as_ref();
        Self::from_files(dir.join(CERT_FILE), dir.join(KEY_FILE))
    }

    /// Like [`new`](Self::new) for a certificate and a key file named freely.
    ///
    /// # Errors
    /// [`LoadError`] naming the file at fault.
    pub fn from_files(cert_path: impl Into<PathBuf>, key_path: impl Into<PathBuf>) -> Result<Self, LoadError> {
        let (cert_path, key_path) = (cert_path.into(), key_path.into());
        let seen = read_pair(&cert_path, &key_path)?;
        let ck = certified_key_from_pem(&seen.cert, &seen.key, &cert_path, &key_path)?;
        tracing::info!(cert = %cert_path.display(), key = %key_path.display(), "loaded webhook serving certificate");
        Ok(ReloadingCertResolver {
            cert_path,
            key_path,
            current: RwLock::new(Arc::new(ck)),
            seen: Mutex::new(seen),
            on_load: Mutex::new(Vec::new()),
        })
    }

    /// Calls `f` with the pair served now, and again with each pair a later
    /// [`check`](Self::check) swaps in (not with a bad pair that was refused), on the thread
    /// that runs the check. `f` should be quick: the next check waits for it.
    pub fn on_load(&self, f: impl Fn(&CertifiedKey) + Send + Sync + 'static) {
        // Held across the call, so a reload cannot slip between `current` and the registration.
        let mut hooks = self.on_load.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&self.current());
        hooks.push(Box::new(f));
    }

    /// The certificate file watched.
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// The key file watched.
    pub fn key_path(&self) -> &Path {
        &self.key_path
    }

    /// The pair served now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Reads the files once and swaps in a new good pair. Logs a reload (info) or a failure
    /// (warn, once per distinct bad content) naming the file.
    pub fn check(&self) -> CheckOutcome {
        let (cert_path, key_path) = (&self.cert_path, &self.key_path);
        let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = match read_pair(cert_path, key_path) {
            Ok(now) => now,
            Err(e) => {
                // A missing file during a swap is normal for a moment; report it once.
                let marker = Seen { cert: format!("\0unreadable:{e}").into_bytes(), key: Vec::new() };
                if *seen != marker {
                    tracing::warn!(error = %e, kind = e.kind(), "cannot reload webhook certificate; serving the previous one");
                    *seen = marker;
                    return CheckOutcome::KeptPrevious;
                }
                return CheckOutcome::Unchanged;
            }
        };
        if *seen == now {
            return CheckOutcome::Unchanged;
        }
        let outcome = match certified_key_from_pem(&now.cert, &now.key, cert_path, key_path) {
            Ok(ck) => {
                let ck = Arc::new(ck);
                let hooks = self.on_load.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = ck.clone();
                tracing::info!(cert = %cert_path.display(), key = %key_path.display(), "reloaded webhook serving certificate");
                for f in hooks.iter() {
                    f(&ck);
                }
                CheckOutcome::Reloaded
            }
            Err(e) => {
                tracing::warn!(error = %e, kind = e.kind(), "new webhook certificate files are not usable; serving the previous one");
                CheckOutcome::KeptPrevious
            }
        };
        *seen = now;
        outcome
    }

    /// Starts a background thread that calls [`check`](Self::check) every `interval`. The
    /// thread holds only a weak reference and ends once the resolver is dropped.
    ///
    /// # Errors
    /// When the thread cannot be spawned.
    pub fn watch(self: &Arc<Self>, interval: Duration) -> std::io::Result<()> {
        let weak: Weak<Self> = Arc::downgrade(self);
        std::thread::Builder::new().name("tls-reload".into()).spawn(move || {
            loop {
                std::thread::sleep(interval);
                match weak.upgrade() {
                    Some(r) => {
                        r.check();
                    }
                    None => return,
                }
            }
        })?;
        Ok(())
    }

    /// A rustls server configuration (no client auth, ALPN h2 and http/1.1) that asks this
    /// resolver for the certificate on every handshake.
    ///
    /// # Errors
    /// When the crypto provider supports none of the default protocol versions.
    pub fn server_config(self: &Arc<Self>) -> Result<rustls::ServerConfig, rustls::Error> {
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(cfg)
    }
}

impl ResolvesServerCert for ReloadingCertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn read_pair(cert_path: &Path, key_path: &Path) -> Result<Seen, LoadError> {
    let read = |path: &Path| std::fs::read(path).map_err(|error| LoadError::Read { path: path.to_path_buf(), error });
    Ok(Seen { cert: read(cert_path)?, key: read(key_path)? })
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    use rustls::pki_types::ServerName;

    use super::*;
    use crate::{Bundle, CA_FILE, mint, mint_with_validity, write_dir};

    fn names() -> Vec<String> {
        vec!["localhost".to_owned(), "127.0.0.1".to_owned()]
    }

    /// One TLS handshake against `resolver` on a loopback socket, with a client trusting `cas`;
    /// returns the leaf certificate the server presented, or the client's error.
    fn handshake(resolver: &Arc<ReloadingCertResolver>, cas: &[&str]) -> Result<Vec<u8>, String> {
        let server_cfg = Arc::new(resolver.server_config().expect("server config"));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut sock, _) = listener.accept().unwrap();
            let mut conn = rustls::ServerConnection::new(server_cfg).unwrap();
            let mut tls = rustls::Stream::new(&mut conn, &mut sock);
            let mut buf = [0u8; 4];
            if tls.read_exact(&mut buf).is_ok() {
                let _ = tls.write_all(b"pong");
            }
        });
        let mut roots = rustls::RootCertStore::empty();
        for ca in cas {
            for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                roots.add(c.unwrap()).unwrap();
            }
        }
        let client_cfg = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut conn =
            rustls::ClientConnection::new(Arc::new(client_cfg), ServerName::try_from("localhost").unwrap()).unwrap();
        let mut sock = TcpStream::connect(addr).unwrap();
        let mut tls = rustls::Stream::new(&mut conn, &mut sock);
        let result = tls.write_all(b"ping").and_then(|()| {
            let mut buf = [0u8; 4];
            tls.read_exact(&mut buf)
        });
        let out = match result {
            Ok(()) => Ok(conn.peer_certificates().expect("peer certificates")[0].to_vec()),
            Err(e) => Err(e.to_string()),
        };
        drop(sock);
        let _ = server.join();
        out
    }

    fn leaf_der(b: &Bundle) -> Vec<u8> {
        CertificateDer::from_pem_slice(b.cert_pem.as_bytes()).unwrap().to_vec()
    }

    /// Writes a bundle the way the kubelet updates a Secret volume: a new timestamped folder,
    /// `..data` repointed by an atomic rename, and the visible names symlinks through `..data`.
    fn kubelet_write(dir: &Path, b: &Bundle, generation: u32) {
        let ts = format!("..2026_11_29_13_00_{generation:02}.{generation}");
        write_dir(b, &dir.join(&ts)).unwrap();
        let tmp = dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&ts, &tmp).unwrap();
        std::fs::rename(&tmp, dir.join("..data")).unwrap();
        for f in [CA_FILE, CERT_FILE, KEY_FILE] {
            let link = dir.join(f);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(format!("..data/{f}"), &link).unwrap();
            }
        }
    }

    #[test]
    fn serves_the_files_and_a_replaced_pair_after_a_check() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (mint(&names()).unwrap(), mint(&names()).unwrap());
        write_dir(&a, dir.path()).unwrap();
        let r = Arc::new(ReloadingCertResolver::new(dir.path()).unwrap());
        assert_eq!(handshake(&r, &[&a.ca_pem]).unwrap(), leaf_der(&a));
        assert_eq!(r.check(), CheckOutcome::Unchanged);
        write_dir(&b, dir.path()).unwrap();
        assert_eq!(r.check(), CheckOutcome::Reloaded);
        assert_eq!(handshake(&r, &[&a.ca_pem, &b.ca_pem]).unwrap(), leaf_der(&b));
        assert!(handshake(&r, &[&a.ca_pem]).is_err(), "the old CA must not verify the new certificate");
    }

    #[test]
    fn follows_the_kubelet_data_symlink_swap() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (mint(&names()).unwrap(), mint(&names()).unwrap());
        kubelet_write(dir.path(), &a, 1);
        let r = Arc::new(ReloadingCertResolver::new(dir.path()).unwrap());
        assert_eq!(handshake(&r, &[&a.ca_pem]).unwrap(), leaf_der(&a));
        kubelet_write(dir.path(), &b, 2);
        assert_eq!(r.check(), CheckOutcome::Reloaded);
        assert_eq!(handshake(&r, &[&b.ca_pem]).unwrap(), leaf_der(&b));
    }

    #[test]
    fn the_watch_thread_picks_up_a_swap_without_an_explicit_check() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (mint(&names()).unwrap(), mint(&names()).unwrap());
        kubelet_write(dir.path(), &a, 1);
        let r = Arc::new(ReloadingCertResolver::new(dir.path()).unwrap());
        r.watch(Duration::from_millis(20)).unwrap();
        kubelet_write(dir.path(), &b, 2);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while r.current().cert[0].as_ref() != leaf_der(&b).as_slice() {
            assert!(std::time::Instant::now() < deadline, "the watcher did not reload within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(handshake(&r, &[&b.ca_pem]).unwrap(), leaf_der(&b));
    }

    #[test]
    fn bad_or_half_written_files_keep_the_last_good_pair() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (mint(&names()).unwrap(), mint(&names()).unwrap(), mint(&names()).unwrap());
        write_dir(&a, dir.path()).unwrap();
        let r = Arc::new(ReloadingCertResolver::new(dir.path()).unwrap());
        // Half-way through a non-atomic copy: new certificate, old key.
        std::fs::write(dir.path().join(CERT_FILE), &b.cert_pem).unwrap();
        assert_eq!(r.check(), CheckOutcome::KeptPrevious);
        assert_eq!(handshake(&r, &[&a.ca_pem]).unwrap(), leaf_der(&a));
        // The same bad pair again is not news.
        assert_eq!(r.check(), CheckOutcome::Unchanged);
        // Garbage, a truncated certificate, an empty key, a missing key.
        std::fs::write(dir.path().join(CERT_FILE), "not a certificate").unwrap();
        assert_eq!(r.check(), CheckOutcome::KeptPrevious);
        std::fs::write(dir.path().join(CERT_FILE), &c.cert_pem[..c.cert_pem.len() / 2]).unwrap();
        std::fs::write(dir.path().join(KEY_FILE), &c.key_pem).unwrap();
        assert_eq!(r.check(), CheckOutcome::KeptPrevious);
        std::fs::write(dir.path().join(CERT_FILE), &c.cert_pem).unwrap();
        std::fs::write(dir.path().join(KEY_FILE), "").unwrap();
        assert_eq!(r.check(), CheckOutcome::KeptPrevious);
        std::fs::remove_file(dir.path().join(KEY_FILE)).unwrap();
        assert_eq!(r.check(), CheckOutcome::KeptPrevious);
        assert_eq!(r.check(), CheckOutcome::Unchanged);
        assert_eq!(handshake(&r, &[&a.ca_pem]).unwrap(), leaf_der(&a));
        // Once the pair is whole again it is served.
        std::fs::write(dir.path().join(KEY_FILE), &c.key_pem).unwrap();
        assert_eq!(r.check(), CheckOutcome::Reloaded);
        assert_eq!(handshake(&r, &[&c.ca_pem]).unwrap(), leaf_der(&c));
    }

    #[test]
    fn on_load_sees_the_served_pair_and_each_reload_but_no_refused_one() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (mint_with_validity(&names(), 30).unwrap(), mint_with_validity(&names(), 3).unwrap());
        write_dir(&a, dir.path()).unwrap();
        let r = Arc::new(ReloadingCertResolver::new(dir.path()).unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        r.on_load(move |ck| record.lock().unwrap().push(ck.cert[0].to_vec()));
        assert_eq!(*seen.lock().unwrap(), [leaf_der(&a)], "called at once with the pair served");
        assert_eq!(r.check(), CheckOutcome::Unchanged);
        std::fs::write(dir.path().join(CERT_FILE), &b.cert_pem).unwrap();
        assert_eq!(r.check(), CheckOutcome::KeptPrevious);
        assert_eq!(seen.lock().unwrap().len(), 1, "a refused pair is not reported");
        write_dir(&b, dir.path()).unwrap();
        assert_eq!(r.check(), CheckOutcome::Reloaded);
        assert_eq!(*seen.lock().unwrap(), [leaf_der(&a), leaf_der(&b)]);
        let days = |der: &[u8]| {
            let left = crate::expiry::not_after_unix(der).unwrap() - time::OffsetDateTime::now_utc().unix_timestamp();
            (left + 3600) / 86_400
        };
        assert_eq!(seen.lock().unwrap().iter().map(|d| days(d)).collect::<Vec<_>>(), [30, 3]);
    }

    #[test]
    fn errors_name_the_file_at_fault() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (mint(&names()).unwrap(), mint(&names()).unwrap());
        let err = ReloadingCertResolver::new(dir.path()).unwrap_err();
        assert!(err.to_string().contains(CERT_FILE), "{err}");
        write_dir(&a, dir.path()).unwrap();
        std::fs::write(dir.path().join(KEY_FILE), &b.key_pem).unwrap();
        let err = ReloadingCertResolver::new(dir.path()).unwrap_err();
        assert_eq!(err.kind(), "mismatch");
        assert!(err.to_string().contains(KEY_FILE) && err.to_string().contains(CERT_FILE), "{err}");
        std::fs::write(dir.path().join(KEY_FILE), "junk").unwrap();
        let err = ReloadingCertResolver::new(dir.path()).unwrap_err();
        assert!(matches!(err, LoadError::Key { .. }) && err.to_string().contains(KEY_FILE), "{err}");
    }
}
