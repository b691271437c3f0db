//! Certificates for the admission webhook's TLS listener.
//!
//! [`mint`] creates a self-signed CA and a serving certificate signed by it for the given DNS
//! names and IP addresses (rcgen; ECDSA P-256). The API server trusts the CA through the
//! ValidatingWebhookConfiguration's `caBundle`; aether-controller serves the leaf.
//!
//! [`reload::ReloadingCertResolver`] serves the pair from a mounted Secret folder and follows
//! its updates, and [`expiry`] reads when the served leaf expires; [`bootstrap`] creates the Secret and sets the webhook configuration's `caBundle`
//! (the chart's hook Job); [`cleanup`] deletes that Secret again after `helm uninstall` (the
//! chart's post-delete hook Job), and only if bootstrap created it. [`cli`] is the command line
//! of the `aether-webhook-certs` binary; [`logging`] (shared by every aether binary) sets up its logs.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

/// File names in a TLS directory, as in a `kubernetes.io/tls` Secret mounted as a volume.
pub const CA_FILE: &str = "ca.crt";
/// The serving certificate chain (PEM).
pub const CERT_FILE: &str = "tls.crt";
/// The serving private key (PEM, PKCS#8).
pub const KEY_FILE: &str = "tls.key";

pub mod bootstrap;
pub mod cleanup;
pub mod cli;
pub mod expiry;
/// The log set-up every aether binary shares ([`aether_process::logging`]).
pub use aether_process::logging;
pub mod reload;

pub use reload::{CheckOutcome, LoadError, ReloadingCertResolver};

/// Validity of certificates minted by [`mint`]: 10 years.
pub const DEFAULT_VALIDITY_DAYS: u32 = 3650;

/// Errors of minting or writing certificates.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// No subject alternative name was given.
    #[error("at least one DNS name or IP address is needed for the serving certificate")]
    NoNames,
    /// A name is neither an IP address nor a DNS name.
    #[error("{0:?} is neither an IP address nor a DNS name (letters, digits, '-', '.', a leading '*.')")]
    BadName(String),
    /// rcgen refused the parameters. Its error's text ends the message, so it is not also the
    /// `source()`: a printed cause chain shows it once.
    #[error("cannot mint certificate: {0}")]
    Mint(rcgen::Error),
    /// Writing a file failed.
    #[error("cannot write {path}: {error}")]
    Write {
        /// The file.
        path: String,
        /// The I/O error. Its text ends the message, so it is not also the `source()`: a printed
        /// cause chain shows it once.
        error: std::io::Error,
    },
}

impl From<rcgen::Error> for CertError {
    fn from(e: rcgen::Error) -> Self {
        CertError::Mint(e)
    }
}

/// A CA certificate and a serving certificate + key it signed, all PEM.
#[derive(Debug, Clone)]
pub struct Bundle {
    /// The CA certificate (what goes into `caBundle`).
    pub ca_pem: String,
    /// The serving certificate.
    pub cert_pem: String,
    /// The serving certificate's private key (PKCS#8).
    pub key_pem: String,
}

/// Mints a fresh CA and a serving certificate for `names`, valid for
/// [`DEFAULT_VALIDITY_DAYS`]; each name that parses as an IP address becomes an IP SAN, any other
/// a DNS SAN.
///
/// # Errors
/// [`CertError::NoNames`] for an empty list; [`CertError::Mint`] when rcgen rejects a name.
pub fn mint(names: &[String]) -> Result<Bundle, CertError> {
    mint_with_validity(names, DEFAULT_VALIDITY_DAYS)
}

/// Like [`mint`], with both certificates valid from an hour ago (clock skew) for `days` days.
///
/// # Errors
/// As [`mint`].
pub fn mint_with_validity(names: &[String], days: u32) -> Result<Bundle, CertError> {
    if names.is_empty() {
        return Err(CertError::NoNames);
    }
    if let Some(bad) = names.iter().find(|n| {
        n.parse::<std::net::IpAddr>().is_err()
            && (n.is_empty()
                || n.len() > 253
                || !n.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'*')))
    }) {
        return Err(CertError::BadName(bad.clone()));
    }
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.distinguished_name.push(DnType::CommonName, "aether-webhook-ca");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let not_before = time::OffsetDateTime::now_utc() - Duration::from_secs(3600);
    let not_after = time::OffsetDateTime::now_utc() + Duration::from_secs(u64::from(days) * 86_400);
    ca_params.not_before = not_before;
    ca_params.not_after = not_after;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.to_vec())?;
    params.distinguished_name.push(DnType::CommonName, names[0].clone());
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = not_before;
    params.not_after = not_after;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Bundle { ca_pem: ca_cert.pem(), cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

/// Writes `ca.crt`, `tls.crt` and `tls.key` (mode 0600) into `dir`, creating it.
///
/// # Errors
/// [`CertError::Write`] naming the file that could not be written.
pub fn write_dir(bundle: &Bundle, dir: &Path) -> Result<(), CertError> {
    let err = |p: &Path| {
        let path = p.display().to_string();
        move |error| CertError::Write { path, error }
    };
    fs::create_dir_all(dir).map_err(err(dir))?;
    for (name, body, mode) in
        [(CA_FILE, &bundle.ca_pem, 0o644), (CERT_FILE, &bundle.cert_pem, 0o644), (KEY_FILE, &bundle.key_pem, 0o600)]
    {
        let path = dir.join(name);
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&path)
            .map_err(err(&path))?;
        f.write_all(body.as_bytes()).map_err(err(&path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mint_refuses_an_empty_name_list() {
        assert!(matches!(mint(&[]), Err(CertError::NoNames)));
        assert!(matches!(mint(&["".into()]), Err(CertError::BadName(_))));
        assert!(matches!(mint(&["bad name!".into()]), Err(CertError::BadName(_))));
    }

    #[test]
    fn written_key_is_private_and_files_are_pem() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let b = mint(&["localhost".into(), "127.0.0.1".into()]).unwrap();
        write_dir(&b, dir.path()).unwrap();
        let mode = fs::metadata(dir.path().join(KEY_FILE)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        for f in [CA_FILE, CERT_FILE] {
            assert!(fs::read_to_string(dir.path().join(f)).unwrap().starts_with("-----BEGIN CERTIFICATE-----"));
        }
        assert_ne!(b.ca_pem, b.cert_pem);
    }
}
