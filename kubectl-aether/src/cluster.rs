//! The Kubernetes client from kubectl's flags: `--kubeconfig` (one file; without it `$KUBECONFIG`,
//! which may list several, else `~/.kube/config`), `--context`, and the namespace (`-n`, else the
//! context's, else `default`).

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};

/// A client for `context` of `kubeconfig` and the namespace to use (`namespace`, else the
/// context's default).
///
/// # Errors
/// When the kubeconfig cannot be read or has no such context, naming the file or context.
pub async fn client(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
    namespace: Option<&str>,
) -> anyhow::Result<(kube::Client, String)> {
    let options = KubeConfigOptions { context: context.map(str::to_owned), ..KubeConfigOptions::default() };
    let config = match kubeconfig {
        Some(path) => {
            let kc =
                Kubeconfig::read_from(path).map_err(|e| anyhow::anyhow!("--kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options).await
        }
        None => kube::Config::from_kubeconfig(&options).await,
    }
    .map_err(|e| match context {
        Some(c) => anyhow::anyhow!("kubeconfig context {c:?}: {e}"),
        None => anyhow::anyhow!("kubeconfig: {e}"),
    })?;
    let ns = namespace.map(str::to_owned).unwrap_or_else(|| config.default_namespace.clone());
    let client = kube::Client::try_from(config).map_err(|e| anyhow::anyhow!("Kubernetes client: {e}"))?;
    Ok((client, ns))
}
