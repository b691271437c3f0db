//! `aether-webhook-certs cleanup`: the chart's post-delete hook Job.
//!
//! `helm uninstall` deletes the release's objects, but not the serving-cert Secret that
//! [`crate::bootstrap`] created: it is not part of the release. This deletes that Secret, and
//! only that one: [`ownership`] requires the label
//! `app.kubernetes.io/managed-by: aether-webhook-certs`, which bootstrap puts on a Secret it
//! creates (and a renewal keeps). A Secret of the same name without it (one you provided, or one
//! bootstrap found there and reused or re-minted) is left in place. A Secret that is already
//! gone is nothing to do. Any other API error is returned, naming the Secret, so the Job fails
//! and its backoff retries.
//!
//! The delete carries the uid and resourceVersion of the object the decision was made on as
//! preconditions: if the Secret was replaced or changed in between (409), it is read and decided
//! again instead of being deleted unseen.
//!
//! RBAC: in the Secret's namespace, `get` and `delete` on that one Secret, by `resourceNames`:
//!
//! ```yaml
//! - apiGroups: [""]
//!   resources: ["secrets"]
//!   resourceNames: ["<the --secret-name>"]
//!   verbs: ["get", "delete"]
//! ```

use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, ObjectMeta, Preconditions};
use kube::{Api, Client};

use crate::bootstrap::{ATTEMPTS, MANAGED_BY_LABEL, MANAGED_BY_VALUE, is_status};

/// Whether a Secret is the one bootstrap made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// It carries [`MANAGED_BY_LABEL`] = [`MANAGED_BY_VALUE`]: bootstrap created it.
    Ours,
    /// It does not (why): someone else's, to be left in place.
    NotOurs(String),
}

/// Decides from the Secret's metadata whether bootstrap created it: only the label
/// [`MANAGED_BY_LABEL`] with the value [`MANAGED_BY_VALUE`] says so.
pub fn ownership(meta: &ObjectMeta) -> Ownership {
    match meta.labels.as_ref().and_then(|l| l.get(MANAGED_BY_LABEL)) {
        Some(v) if v == MANAGED_BY_VALUE => Ownership::Ours,
        Some(v) => Ownership::NotOurs(format!("label {MANAGED_BY_LABEL} is {v:?}, not {MANAGED_BY_VALUE:?}")),
        None => Ownership::NotOurs(format!("no label {MANAGED_BY_LABEL}={MANAGED_BY_VALUE}")),
    }
}

/// What [`run`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The Secret was bootstrap's and is deleted.
    Deleted,
    /// There was no such Secret: nothing to do.
    AlreadyGone,
    /// The Secret is someone else's (why) and was left in place.
    NotOurs(String),
}

/// Errors of the cleanup.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    /// An API call failed.
    #[error("{action} Secret {secret}: {error}")]
    Api {
        /// What was being done ("reading", "deleting").
        action: &'static str,
        /// `namespace/name`.
        secret: String,
        /// The client error. Its text ends the message, so it is not also the `source()`: a
        /// printed cause chain shows it once.
        error: kube::Error,
    },
    /// The Secret kept changing between the read and the delete.
    #[error("Secret {0}: still changing under us after {ATTEMPTS} attempts")]
    Conflicts(String),
}

/// Deletes the Secret `namespace/name` if bootstrap created it. See the module docs.
///
/// # Errors
/// [`CleanupError`] naming the Secret, for any API error but "not found".
pub async fn run(client: Client, namespace: &str, name: &str) -> Result<Outcome, CleanupError> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let secret = format!("{namespace}/{name}");
    let api_err = |action| {
        let secret = secret.clone();
        move |error| CleanupError::Api { action, secret, error }
    };
    for _ in 0..ATTEMPTS {
        let Some(found) = api.get_opt(name).await.map_err(api_err("reading"))? else {
            tracing::info!(secret = %secret, "no such Secret: nothing to do");
            return Ok(Outcome::AlreadyGone);
        };
        if let Ownership::NotOurs(why) = ownership(&found.metadata) {
            tracing::info!(secret = %secret, reason = %why, "not ours, left in place");
            return Ok(Outcome::NotOurs(why));
        }
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: found.metadata.uid.clone(),
                resource_version: found.metadata.resource_version.clone(),
            }),
            ..DeleteParams::default()
        };
        match api.delete(name, &dp).await {
            Ok(_) => {
                tracing::info!(secret = %secret, "deleted the Secret bootstrap created");
                return Ok(Outcome::Deleted);
            }
            Err(e) if is_status(&e, 404) => {
                tracing::info!(secret = %secret, "already gone: nothing to do");
                return Ok(Outcome::AlreadyGone);
            }
            // Replaced or changed since the read: decide again on what is there now.
            Err(e) if is_status(&e, 409) => {
                tracing::info!(secret = %secret, "the Secret changed under us; reading it again");
            }
            Err(e) => return Err(api_err("deleting")(e)),
        }
    }
    Err(CleanupError::Conflicts(secret))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn meta(labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: Some("aether-webhook-tls".to_owned()),
            labels: Some(labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn a_secret_bootstrap_creates_is_ours() {
        let created = crate::bootstrap::created_metadata("sys", "aether-webhook-tls");
        assert_eq!(ownership(&created), Ownership::Ours);
        assert_eq!(
            ownership(&meta(&[("app.kubernetes.io/managed-by", "aether-webhook-certs"), ("team", "x")])),
            Ownership::Ours
        );
    }

    #[test]
    fn a_secret_without_the_label_is_not_ours() {
        let no_labels = ObjectMeta { labels: None, ..ObjectMeta::default() };
        let Ownership::NotOurs(why) = ownership(&no_labels) else { panic!("no labels is not ours") };
        assert!(why.contains("no label app.kubernetes.io/managed-by=aether-webhook-certs"), "{why}");
        assert!(matches!(ownership(&meta(&[])), Ownership::NotOurs(_)));
        assert!(matches!(
            ownership(&meta(&[("app.kubernetes.io/name", "aether-webhook-certs")])),
            Ownership::NotOurs(_)
        ));
        let annotated = ObjectMeta {
            annotations: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                "aether-webhook-certs".to_owned(),
            )])),
            ..ObjectMeta::default()
        };
        assert!(matches!(ownership(&annotated), Ownership::NotOurs(_)), "an annotation is not the label");
    }

    #[test]
    fn a_secret_managed_by_someone_else_is_not_ours() {
        for other in ["Helm", "cert-manager", "", "Aether-Webhook-Certs", "aether-webhook-certs "] {
            let Ownership::NotOurs(why) = ownership(&meta(&[("app.kubernetes.io/managed-by", other)])) else {
                panic!("managed-by {other:?} is not ours");
            };
            assert!(why.contains(&format!("{other:?}")), "{why}");
        }
    }
}
