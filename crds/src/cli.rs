//! `--kubelet-pods-dir` and `--socket-limit`, defined once for every binary that judges socket
//! values (feature `cli`; the agent and the controller turn it on, the pure users of this crate
//! do not): [`SocketRulesArgs`], a clap `Args` struct to `#[command(flatten)]` into a binary's
//! flags, the way `aether_process::logging::LogArgs` is. The flags select the [`Rules`]
//! (docs/endpointpolicy.md, "The socket budget").
//!
//! The names, environment variables (`AETHER_KUBELET_PODS_DIR`, `AETHER_SOCKET_LIMIT`), defaults
//! ([`DEFAULT_PODS_DIR`], `sun-path`) and parsing are the same in every binary; each binary words
//! the `--help` text for its own readers through a [`SocketRulesHelp`] type.

use std::marker::PhantomData;

use clap::Args;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};

use crate::rules::Rules;
use crate::udspath::{DEFAULT_PODS_DIR, SocketLimit};

/// The `--help` text of the two flags in one binary: a type with no value, named as the
/// parameter of [`SocketRulesArgs`].
pub trait SocketRulesHelp: Clone + std::fmt::Debug + Send + Sync + 'static {
    /// The help of `--kubelet-pods-dir`.
    const KUBELET_PODS_DIR: &'static str;
    /// The help of `--socket-limit`.
    const SOCKET_LIMIT: &'static str;
    /// The help of the value `sun-path` ([`SocketLimit::SunPath`]).
    const SUN_PATH: &'static str;
    /// The help of the value `filesystem` ([`SocketLimit::Filesystem`]).
    const FILESYSTEM: &'static str;
}

/// `--kubelet-pods-dir` and `--socket-limit`, with the help text of `H`.
#[derive(Args, Debug, Clone)]
pub struct SocketRulesArgs<H: SocketRulesHelp> {
    /// The kubelet pods dir as the node proxy sees it (the chart's mount path), as given: what
    /// makes it usable (absolute, one trailing `/` ignored) is [`Rules::with_limit`]'s check.
    /// Default: [`DEFAULT_PODS_DIR`].
    #[arg(long, default_value = DEFAULT_PODS_DIR, env = "AETHER_KUBELET_PODS_DIR", help = H::KUBELET_PODS_DIR)]
    pub kubelet_pods_dir: String,
    /// What limits the length of a socket value: `sun-path` (the default) or `filesystem`
    /// ([`SocketLimit::flag_value`]).
    #[arg(
        long,
        value_parser = socket_limit_parser::<H>(),
        default_value = SocketLimit::SunPath.flag_value(),
        env = "AETHER_SOCKET_LIMIT",
        help = H::SOCKET_LIMIT
    )]
    pub socket_limit: SocketLimit,
    #[arg(skip)]
    help: PhantomData<H>,
}

impl<H: SocketRulesHelp> SocketRulesArgs<H> {
    /// The rules these flags select: [`Rules::with_limit`] of `--kubelet-pods-dir` and
    /// `--socket-limit`.
    pub fn rules(&self) -> Rules {
        Rules::with_limit(&self.kubelet_pods_dir, self.socket_limit)
    }
}

/// The values of `--socket-limit` ([`SocketLimit::flag_value`]), each with its help from `H`; an
/// unknown value is clap's "invalid value" error listing the two.
fn socket_limit_parser<H: SocketRulesHelp>() -> impl TypedValueParser<Value = SocketLimit> {
    const LIMITS: [SocketLimit; 2] = [SocketLimit::SunPath, SocketLimit::Filesystem];
    let help = |limit| match limit {
        SocketLimit::SunPath => H::SUN_PATH,
        SocketLimit::Filesystem => H::FILESYSTEM,
    };
    PossibleValuesParser::new(LIMITS.map(|l| PossibleValue::new(l.flag_value()).help(help(l))))
        .map(|value| LIMITS.into_iter().find(|l| l.flag_value() == value).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[derive(Clone, Debug)]
    struct Words;
    impl SocketRulesHelp for Words {
        const KUBELET_PODS_DIR: &'static str = "pods dir";
        const SOCKET_LIMIT: &'static str = "limit";
        const SUN_PATH: &'static str = "sun";
        const FILESYSTEM: &'static str = "fs";
    }

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        rules: SocketRulesArgs<Words>,
    }

    #[test]
    fn both_flags_parse_default_and_carry_the_binarys_help() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(
            (cli.rules.kubelet_pods_dir.as_str(), cli.rules.socket_limit),
            (DEFAULT_PODS_DIR, SocketLimit::SunPath)
        );
        assert_eq!(cli.rules.rules(), Rules::new(DEFAULT_PODS_DIR));
        let cli = Cli::try_parse_from(["x", "--socket-limit", "filesystem", "--kubelet-pods-dir", "/p"]).unwrap();
        assert_eq!(cli.rules.rules(), Rules::with_limit("/p", SocketLimit::Filesystem));
        let err = Cli::try_parse_from(["x", "--socket-limit", "fs"]).unwrap_err().to_string();
        assert!(err.contains("invalid value 'fs' for '--socket-limit <SOCKET_LIMIT>'"), "{err}");
        assert!(err.contains("[possible values: sun-path, filesystem]"), "{err}");
        let help = Cli::command().render_long_help().to_string();
        for text in ["pods dir", "limit", "- sun-path:   sun", "- filesystem: fs", "[env: AETHER_SOCKET_LIMIT=]"] {
            assert!(help.contains(text), "{text} in {help}");
        }
    }
}
