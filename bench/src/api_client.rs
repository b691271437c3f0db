//! A blocking HTTPS client for the bench's kube-apiserver, with the admin identity of the
//! harness's kubeconfig (`aether_tests::ControlPlane::kubeconfig`).

use std::time::Duration;

use aether_tests::ControlPlane;
use anyhow::Context;

/// The API server's address and the admin client identity, from the harness's kubeconfig.
pub fn api_client(cp: &ControlPlane) -> anyhow::Result<(reqwest::blocking::Client, String)> {
    let kc = std::fs::read_to_string(cp.kubeconfig())?;
    let field = |k: &str| -> anyhow::Result<String> {
        kc.lines()
            .find_map(|l| l.trim().strip_prefix(k))
            .map(|v| v.trim().to_owned())
            .with_context(|| format!("kubeconfig has no {k}"))
    };
    let server = field("server:")?;
    let ca = std::fs::read(field("certificate-authority:")?)?;
    let mut identity = std::fs::read(field("client-certificate:")?)?;
    identity.extend(std::fs::read(field("client-key:")?)?);
    let client = reqwest::blocking::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca)?)
        .identity(reqwest::Identity::from_pem(&identity)?)
        .timeout(Duration::from_secs(20))
        .build()?;
    Ok((client, server))
}
