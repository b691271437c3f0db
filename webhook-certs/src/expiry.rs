//! When the serving certificate expires: the `notAfter` of the leaf certificate (the first of the
//! chain in `tls.crt`, the one the webhook presents), read with x509-parser. aether-controller
//! exports it as `aether_webhook_certificate_expiry_timestamp_seconds` (docs/troubleshooting.md,
//! "Metrics"), set at start-up and after every reload of the files.

use std::path::Path;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::reload::LoadError;

/// Why a certificate's `notAfter` could not be read.
#[derive(Debug, thiserror::Error)]
#[error("the serving certificate is not a parsable X.509 certificate (DER): {0}")]
pub struct ExpiryError(String);

/// The `notAfter` of one DER-encoded X.509 certificate, in seconds since the Unix epoch (UTC;
/// X.509 validity times have whole seconds).
///
/// # Errors
/// [`ExpiryError`] when `der` is not a certificate x509-parser can read, with its reason.
pub fn not_after_unix(der: &[u8]) -> Result<i64, ExpiryError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| ExpiryError(e.to_string()))?;
    Ok(cert.validity().not_after.timestamp())
}

/// The `notAfter` of the first certificate in a PEM file (the leaf of a `tls.crt` chain), in
/// seconds since the Unix epoch.
///
/// # Errors
/// [`LoadError::Read`] when the file cannot be read; [`LoadError::Cert`] naming the file when it
/// holds no PEM certificate or the first one is not parsable X.509.
pub fn leaf_not_after_file(path: &Path) -> Result<i64, LoadError> {
    let pem = std::fs::read(path).map_err(|error| LoadError::Read { path: path.to_path_buf(), error })?;
    let cert = |reason: String| LoadError::Cert { path: path.to_path_buf(), reason };
    let leaf = CertificateDer::pem_slice_iter(&pem)
        .next()
        .ok_or_else(|| cert("no CERTIFICATE block".into()))?
        .map_err(|e| cert(e.to_string()))?;
    not_after_unix(&leaf).map_err(|e| cert(e.to_string()))
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, KeyPair};

    use super::*;
    use crate::{CERT_FILE, mint_with_validity, write_dir};

    /// A real certificate with a chosen notAfter, from rcgen.
    fn cert_expiring_at(unix: i64) -> rcgen::Certificate {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.not_before = time::OffsetDateTime::from_unix_timestamp(unix - 86_400).unwrap();
        params.not_after = time::OffsetDateTime::from_unix_timestamp(unix).unwrap();
        params.self_signed(&KeyPair::generate().unwrap()).unwrap()
    }

    #[test]
    fn reads_the_not_after_it_was_minted_with() {
        // 2031-05-04T03:02:01Z, and one in the past (an expired certificate still has one).
        for unix in [1_935_630_121, 1_600_000_000] {
            let cert = cert_expiring_at(unix);
            assert_eq!(not_after_unix(cert.der()).unwrap(), unix);
        }
    }

    #[test]
    fn the_file_s_first_certificate_is_the_leaf() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CERT_FILE);
        let (leaf, intermediate) = (cert_expiring_at(1_935_630_121), cert_expiring_at(2_000_000_000));
        std::fs::write(&path, format!("{}{}", leaf.pem(), intermediate.pem())).unwrap();
        assert_eq!(leaf_not_after_file(&path).unwrap(), 1_935_630_121);
    }

    #[test]
    fn a_minted_bundle_expires_after_its_validity() {
        let dir = tempfile::tempdir().unwrap();
        let before = time::OffsetDateTime::now_utc().unix_timestamp();
        write_dir(&mint_with_validity(&["localhost".into()], 30).unwrap(), dir.path()).unwrap();
        let after = time::OffsetDateTime::now_utc().unix_timestamp();
        let got = leaf_not_after_file(&dir.path().join(CERT_FILE)).unwrap();
        assert!((before + 30 * 86_400..=after + 30 * 86_400).contains(&got), "{before} {got} {after}");
    }

    #[test]
    fn errors_name_the_file_and_the_fault() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CERT_FILE);
        let err = leaf_not_after_file(&path).unwrap_err();
        assert!(matches!(err, LoadError::Read { .. }) && err.to_string().contains(CERT_FILE), "{err}");
        std::fs::write(&path, "not a certificate").unwrap();
        let err = leaf_not_after_file(&path).unwrap_err();
        assert!(err.to_string().contains("no CERTIFICATE block") && err.to_string().contains(CERT_FILE), "{err}");
        // A well-formed PEM block whose bytes are not X.509.
        std::fs::write(&path, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").unwrap();
        let err = leaf_not_after_file(&path).unwrap_err();
        assert!(matches!(err, LoadError::Cert { .. }) && err.to_string().contains("X.509"), "{err}");
        assert!(not_after_unix(b"junk").is_err());
    }
}
