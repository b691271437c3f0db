//! `aether-webhook-certs bootstrap`: the chart's hook Job.
//!
//! 1. Create-or-reuse the `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`, `ca.crt`) for the
//!    webhook Service's DNS names. An existing Secret is reused unless it lacks a file, does not
//!    parse, has a key that does not match, does not verify against its own `ca.crt` for every
//!    required name, or would not verify any more [`RENEW_BEFORE_DAYS`] from now; then a new CA
//!    and certificate are minted into it.
//! 2. Set `caBundle` of every webhook of the named ValidatingWebhookConfiguration to the Secret's
//!    `ca.crt`, if the configuration exists. A pre-install hook runs before it does: that is
//!    reported and is not an error (the post-install/post-upgrade run sets it). A plain upgrade
//!    re-renders the configuration from the template, which is why the hook runs after it too.
//!
//! Both steps are idempotent: a second run writes nothing when nothing is due. Concurrent
//! writers are detected by resourceVersion (409) and retried.
//!
//! A Secret this creates carries the label `app.kubernetes.io/managed-by: aether-webhook-certs`
//! ([`MANAGED_BY_LABEL`], [`MANAGED_BY_VALUE`]); a renewal keeps the object's labels as they are.
//! That label is how [`crate::cleanup`] (the chart's post-delete Job) tells it from a
//! user-provided Secret of the same name: a Secret bootstrap found already there (reused or
//! re-minted) does not gain the label, so cleanup never deletes it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

use crate::reload::certified_key_from_pem;
use crate::{CA_FILE, CERT_FILE, KEY_FILE};

/// A Secret whose certificate stops verifying within this many days is re-minted.
pub const RENEW_BEFORE_DAYS: u32 = 30;
/// The Secret type the kubelet mounts as `tls.crt` / `tls.key`.
pub const TLS_SECRET_TYPE: &str = "kubernetes.io/tls";
/// The label bootstrap puts on a Secret it creates, and [`crate::cleanup`] requires before it
/// deletes one.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The value of [`MANAGED_BY_LABEL`] on a Secret bootstrap created.
pub const MANAGED_BY_VALUE: &str = "aether-webhook-certs";
pub(crate) const ATTEMPTS: usize = 5;

/// What to bootstrap.
#[derive(Debug, Clone)]
pub struct Options {
    /// Namespace of the Secret and the webhook Service.
    pub namespace: String,
    /// Name of the `kubernetes.io/tls` Secret.
    pub secret_name: String,
    /// Name of the webhook Service (the certificate names `<svc>.<ns>.svc` and
    /// `<svc>.<ns>.svc.cluster.local`).
    pub service_name: String,
    /// The ValidatingWebhookConfiguration whose `caBundle`s are set; `None` skips that step.
    pub webhook_config_name: Option<String>,
    /// Validity of newly minted certificates, in days.
    pub validity_days: u32,
}

/// The DNS names the serving certificate must carry.
pub fn dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![format!("{service}.{namespace}.svc"), format!("{service}.{namespace}.svc.cluster.local")]
}

/// What happened to the Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretOutcome {
    /// It did not exist and was created.
    Created,
    /// It existed with a usable certificate and was left alone.
    Reused,
    /// It existed but was not usable (the reason); a new CA and certificate were written.
    Renewed(String),
}

/// What happened to the webhook configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaBundleOutcome {
    /// No configuration was named.
    NotRequested,
    /// The named configuration does not exist (yet: e.g. a pre-install hook).
    ConfigMissing,
    /// Every webhook already carried the Secret's CA.
    AlreadyCurrent,
    /// `caBundle` was set on this many webhooks.
    Patched(usize),
}

/// The result of [`run`].
#[derive(Debug, Clone)]
pub struct Report {
    /// The Secret step.
    pub secret: SecretOutcome,
    /// The caBundle step.
    pub ca_bundle: CaBundleOutcome,
    /// The CA (PEM) now in the Secret and, if patched or current, in `caBundle`.
    pub ca_pem: String,
}

/// Errors of the bootstrap.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// An API call failed.
    #[error("{action}: {error}")]
    Api {
        /// What was being done.
        action: String,
        /// The client error. Its text ends the message, so it is not also the `source()`: a
        /// printed cause chain shows it once.
        error: kube::Error,
    },
    /// Minting failed.
    #[error(transparent)]
    Cert(#[from] crate::CertError),
    /// The Secret exists with another type, which cannot be changed in place.
    #[error("Secret {0} has type {1:?}, not kubernetes.io/tls; delete it or choose another --secret-name")]
    WrongType(String, String),
    /// Writers kept conflicting.
    #[error("{0}: still conflicting after {ATTEMPTS} attempts")]
    Conflicts(String),
}

fn api_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> BootstrapError {
    let action = action.into();
    move |error| BootstrapError::Api { action, error }
}

pub(crate) fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Why the Secret data cannot be reused as is, or `None` when it can: every file present, key
/// matching the certificate, and the certificate verifying against `ca.crt` for every name both
/// now and `renew_before` from `now`.
pub fn renewal_reason(
    data: &BTreeMap<String, ByteString>,
    names: &[String],
    now: SystemTime,
    renew_before: Duration,
) -> Option<String> {
    let file = |k: &str| data.get(k).map(|b| b.0.as_slice()).filter(|b| !b.is_empty());
    let (Some(cert), Some(key), Some(ca)) = (file(CERT_FILE), file(KEY_FILE), file(CA_FILE)) else {
        let missing: Vec<&str> = [CERT_FILE, KEY_FILE, CA_FILE].into_iter().filter(|k| file(k).is_none()).collect();
        return Some(format!("missing {}", missing.join(", ")));
    };
    let ck = match certified_key_from_pem(cert, key, CERT_FILE.as_ref(), KEY_FILE.as_ref()) {
        Ok(ck) => ck,
        Err(e) => return Some(e.to_string()),
    };
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca) {
        match c {
            Ok(c) => {
                if let Err(e) = roots.add(c) {
                    return Some(format!("{CA_FILE} holds an unusable CA certificate: {e}"));
                }
            }
            Err(e) => return Some(format!("{CA_FILE} does not parse: {e}")),
        }
    }
    if roots.is_empty() {
        return Some(format!("{CA_FILE} holds no certificate"));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = match rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider).build()
    {
        Ok(v) => v,
        Err(e) => return Some(format!("{CA_FILE} is not usable: {e}")),
    };
    let (leaf, intermediates) = ck.cert.split_first()?;
    for name in names {
        let Ok(server_name) = ServerName::try_from(name.as_str()) else {
            return Some(format!("{name} is not a valid server name"));
        };
        for (when, label) in [(now, "now"), (now + renew_before, "within the renewal window")] {
            let at = UnixTime::since_unix_epoch(when.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default());
            if let Err(e) = verifier.verify_server_cert(leaf, intermediates, &server_name, &[], at) {
                return Some(format!("{CERT_FILE} does not verify for {name} {label}: {e}"));
            }
        }
    }
    None
}

/// Creates or reuses the Secret, then sets `caBundle`. See the module docs.
///
/// # Errors
/// [`BootstrapError`] naming the object and action.
pub async fn run(client: Client, opts: &Options) -> Result<Report, BootstrapError> {
    let names = dns_names(&opts.service_name, &opts.namespace);
    let (secret, ca_pem) = ensure_secret(client.clone(), opts, &names).await?;
    let ca_bundle = match &opts.webhook_config_name {
        None => CaBundleOutcome::NotRequested,
        Some(name) => patch_ca_bundle(client, name, ca_pem.as_bytes()).await?,
    };
    Ok(Report { secret, ca_bundle, ca_pem })
}

/// Metadata of a Secret bootstrap creates: its name and the [`MANAGED_BY_LABEL`] that
/// [`crate::cleanup`] looks for.
pub(crate) fn created_metadata(namespace: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        labels: Some(BTreeMap::from([(MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned())])),
        ..ObjectMeta::default()
    }
}

async fn ensure_secret(
    client: Client,
    opts: &Options,
    names: &[String],
) -> Result<(SecretOutcome, String), BootstrapError> {
    let api: Api<Secret> = Api::namespaced(client, &opts.namespace);
    let what = format!("Secret {}/{}", opts.namespace, opts.secret_name);
    let renew_before = Duration::from_secs(u64::from(RENEW_BEFORE_DAYS) * 86_400);
    for _ in 0..ATTEMPTS {
        let existing = api.get_opt(&opts.secret_name).await.map_err(api_err(format!("reading {what}")))?;
        let reason = match &existing {
            None => None,
            Some(s) => {
                let ty = s.type_.clone().unwrap_or_default();
                if ty != TLS_SECRET_TYPE {
                    return Err(BootstrapError::WrongType(what, ty));
                }
                let data = s.data.clone().unwrap_or_default();
                match renewal_reason(&data, names, SystemTime::now(), renew_before) {
                    None => {
                        let ca = String::from_utf8_lossy(&data[CA_FILE].0).into_owned();
                        tracing::info!(secret = %what, "reusing the existing certificate");
                        return Ok((SecretOutcome::Reused, ca));
                    }
                    Some(r) => Some(r),
                }
            }
        };
        let bundle = crate::mint_with_validity(names, opts.validity_days)?;
        let data = BTreeMap::from([
            (CA_FILE.to_owned(), ByteString(bundle.ca_pem.clone().into_bytes())),
            (CERT_FILE.to_owned(), ByteString(bundle.cert_pem.clone().into_bytes())),
            (KEY_FILE.to_owned(), ByteString(bundle.key_pem.clone().into_bytes())),
        ]);
        let written = match existing {
            None => {
                let secret = Secret {
                    metadata: created_metadata(&opts.namespace, &opts.secret_name),
                    type_: Some(TLS_SECRET_TYPE.to_owned()),
                    data: Some(data),
                    ..Secret::default()
                };
                api.create(&PostParams::default(), &secret).await.map(|_| SecretOutcome::Created)
            }
            Some(mut s) => {
                // Replace carries the resourceVersion read above: a concurrent writer gives 409.
                // Only the data changes: the labels stay as read (ours keeps MANAGED_BY_LABEL; a
                // Secret someone else created does not gain it, so cleanup leaves it alone).
                s.data = Some(data);
                s.string_data = None;
                api.replace(&opts.secret_name, &PostParams::default(), &s)
                    .await
                    .map(|_| SecretOutcome::Renewed(reason.unwrap_or_default()))
            }
        };
        match written {
            Ok(outcome) => {
                tracing::info!(secret = %what, ?outcome, names = ?names, days = opts.validity_days, "wrote a new CA and serving certificate");
                return Ok((outcome, bundle.ca_pem));
            }
            // Another run created or replaced it first: look again.
            Err(e) if is_status(&e, 409) => {
                tracing::info!(secret = %what, "the Secret changed under us; reading it again");
            }
            Err(e) => return Err(api_err(format!("writing {what}"))(e)),
        }
    }
    Err(BootstrapError::Conflicts(what))
}

async fn patch_ca_bundle(client: Client, name: &str, ca: &[u8]) -> Result<CaBundleOutcome, BootstrapError> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client);
    let what = format!("ValidatingWebhookConfiguration {name}");
    for _ in 0..ATTEMPTS {
        let Some(mut vwc) = api.get_opt(name).await.map_err(api_err(format!("reading {what}")))? else {
            tracing::info!(config = %what, "not there (yet): a pre-install run; the post-install/post-upgrade run sets caBundle");
            return Ok(CaBundleOutcome::ConfigMissing);
        };
        let webhooks = vwc.webhooks.get_or_insert_with(Vec::new);
        let stale =
            webhooks.iter().filter(|w| w.client_config.ca_bundle.as_ref().map(|b| b.0.as_slice()) != Some(ca)).count();
        if stale == 0 {
            tracing::info!(config = %what, webhooks = webhooks.len(), "caBundle already matches the Secret's ca.crt");
            return Ok(CaBundleOutcome::AlreadyCurrent);
        }
        for w in webhooks.iter_mut() {
            w.client_config.ca_bundle = Some(ByteString(ca.to_vec()));
        }
        match api.replace(name, &PostParams::default(), &vwc).await {
            Ok(_) => {
                tracing::info!(config = %what, webhooks = stale, "set caBundle to the Secret's ca.crt");
                return Ok(CaBundleOutcome::Patched(stale));
            }
            Err(e) if is_status(&e, 409) => tracing::info!(config = %what, "changed under us; reading it again"),
            Err(e) if is_status(&e, 404) => return Ok(CaBundleOutcome::ConfigMissing),
            Err(e) => return Err(api_err(format!("updating {what}"))(e)),
        }
    }
    Err(BootstrapError::Conflicts(what))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(b: &crate::Bundle) -> BTreeMap<String, ByteString> {
        BTreeMap::from([
            (CA_FILE.to_owned(), ByteString(b.ca_pem.clone().into_bytes())),
            (CERT_FILE.to_owned(), ByteString(b.cert_pem.clone().into_bytes())),
            (KEY_FILE.to_owned(), ByteString(b.key_pem.clone().into_bytes())),
        ])
    }

    const MONTH: Duration = Duration::from_secs(30 * 86_400);

    #[test]
    fn names_are_the_service_dns_names() {
        assert_eq!(dns_names("hook", "sys"), ["hook.sys.svc", "hook.sys.svc.cluster.local"]);
    }

    #[test]
    fn a_fresh_secret_is_reused() {
        let names = dns_names("hook", "sys");
        let b = crate::mint_with_validity(&names, 365).unwrap();
        assert_eq!(renewal_reason(&data(&b), &names, SystemTime::now(), MONTH), None);
    }

    #[test]
    fn a_certificate_expiring_within_the_window_is_renewed() {
        let names = dns_names("hook", "sys");
        let b = crate::mint_with_validity(&names, 20).unwrap();
        let r = renewal_reason(&data(&b), &names, SystemTime::now(), MONTH).expect("due");
        assert!(r.contains("renewal window"), "{r}");
    }

    #[test]
    fn a_missing_name_file_or_foreign_ca_is_renewed() {
        let names = dns_names("hook", "sys");
        let b = crate::mint_with_validity(&names[..1], 365).unwrap();
        let r = renewal_reason(&data(&b), &names, SystemTime::now(), MONTH).expect("lacks a name");
        assert!(r.contains("hook.sys.svc.cluster.local"), "{r}");

        let b = crate::mint_with_validity(&names, 365).unwrap();
        let mut d = data(&b);
        d.remove(CA_FILE);
        assert_eq!(renewal_reason(&d, &names, SystemTime::now(), MONTH).unwrap(), "missing ca.crt");

        let other = crate::mint_with_validity(&names, 365).unwrap();
        let mut d = data(&b);
        d.insert(CA_FILE.to_owned(), ByteString(other.ca_pem.into_bytes()));
        assert!(renewal_reason(&d, &names, SystemTime::now(), MONTH).unwrap().contains("does not verify"));

        let mut d = data(&b);
        d.insert(KEY_FILE.to_owned(), ByteString(other.key_pem.into_bytes()));
        assert!(renewal_reason(&d, &names, SystemTime::now(), MONTH).unwrap().contains("does not match"));

        let mut d = data(&b);
        d.insert(CERT_FILE.to_owned(), ByteString(b"garbage".to_vec()));
        assert!(renewal_reason(&d, &names, SystemTime::now(), MONTH).is_some());
    }
}
