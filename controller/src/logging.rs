//! Log set-up for the binary: [`aether_process::logging`] (`--log-format`, `--log-level`,
//! `RUST_LOG` as the fine-grained override, flat JSON lines), the same in every aether binary.
//! docs/install.md, "Logs", has the precedence and the defaults.

pub use aether_process::logging::{DEFAULT_FILTER, LogArgs, LogFormat, LogLevel, QUIET_WATCHER, directives, init};

#[cfg(test)]
mod tests {
    //! Every error type of the workspace whose message quotes an underlying error, from the
    //! controller, aether-webhook-certs and aether-agent (a dev-dependency), made to fail for real
    //! where a test can (a taken port, a missing file, a file where a directory must be).

    use std::error::Error;

    use aether_agent_reconciler::pin::PinError;
    use aether_agent_reconciler::store::StateStore;
    use aether_agent_reconciler::xds::{XdsAddr, XdsListener};
    use aether_webhook_certs::bootstrap::BootstrapError;
    use aether_webhook_certs::cleanup::CleanupError;
    use aether_webhook_certs::{CertError, ReloadingCertResolver};

    use crate::status_writer::StatusError;

    /// `cause` shows exactly once in each way an error is printed: its message (`error = %e` in
    /// a log line), anyhow's one-line chain (`{:#}`, how `run` logs a fatal error) and anyhow's
    /// `Caused by:` list (`{:?}`, how aether-webhook-certs' `main` reports one). And no link of
    /// the chain repeats the next one's text.
    fn assert_cause_once<E: Error + Send + Sync + 'static>(err: E, cause: &str) {
        let mut link: Option<&(dyn Error + 'static)> = Some(&err);
        while let Some(e) = link {
            if let Some(next) = e.source() {
                assert!(!e.to_string().contains(&next.to_string()), "{e} repeats its source {next}");
            }
            link = e.source();
        }
        let message = err.to_string();
        let wrapped = anyhow::Error::new(err).context("starting");
        for printed in [message, format!("{wrapped:#}"), format!("{wrapped:?}")] {
            assert_eq!(printed.matches(cause).count(), 1, "{cause:?} in {printed:?}");
        }
    }

    fn api_error() -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("etcdserver: request timed out", "Timeout").with_code(504),
        ))
    }

    #[tokio::test]
    async fn every_error_with_an_underlying_error_prints_it_once() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();

        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let Err(e) = XdsListener::bind(&XdsAddr::Tcp(taken.local_addr().unwrap())).await else {
            panic!("bound a taken port")
        };
        // EADDRINUSE: the "(os error 98): Address already in use (os error 98)".
        assert_cause_once(e, &std::io::Error::from_raw_os_error(98).to_string());

        let Err(e) = StateStore::open(file.join("state")) else { panic!("a state dir under a file") };
        // ENOTDIR, ENOENT, EPERM: the OS errors of Linux, where these binaries run.
        let not_a_dir = std::io::Error::from_raw_os_error(20).to_string();
        assert_cause_once(e, &not_a_dir);

        let bundle = aether_webhook_certs::mint(&["localhost".into()]).unwrap();
        let e = aether_webhook_certs::write_dir(&bundle, &file.join("tls")).unwrap_err();
        assert!(matches!(e, CertError::Write { .. }), "{e}");
        assert_cause_once(e, &not_a_dir);

        let Err(e) = ReloadingCertResolver::new(dir.path().join("missing")) else { panic!("loaded missing files") };
        let not_found = std::io::Error::from_raw_os_error(2).to_string();
        assert_cause_once(e, &not_found);

        let e = crate::offline::read_documents(&[dir.path().join("missing.yaml")]).unwrap_err();
        assert_cause_once(e, &not_found);

        let eperm = std::io::Error::from_raw_os_error(1);
        let cause = eperm.to_string();
        assert_cause_once(PinError::Mount { path: "/run/aether/pins/x.sock".into(), error: eperm }, &cause);

        let cause = api_error().to_string();
        assert_cause_once(StatusError::Patch { object: "shop/cart".into(), error: api_error() }, &cause);
        assert_cause_once(BootstrapError::Api { action: "reading Secret x/y".into(), error: api_error() }, &cause);
        assert_cause_once(CleanupError::Api { action: "deleting", secret: "x/y".into(), error: api_error() }, &cause);
    }
}
