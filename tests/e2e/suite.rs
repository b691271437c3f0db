//! The runner shared by the end-to-end suites that set up one real environment (a control plane,
//! and the controller, agent or Envoy they need) for all their trials (libtest-mimic,
//! `harness = false`): trials run one at a time against it, `--list` starts nothing, a failed
//! set-up fails the binary, and the environment is dropped (its processes stopped) at the end.

use std::sync::Arc;

use libtest_mimic::{Arguments, Failed, Trial};

/// A trial's body: runs against the shared environment.
type Body<E> = Box<dyn Fn(&E) -> anyhow::Result<()> + Send + Sync>;

/// One trial: its name and body.
pub struct Case<E> {
    name: String,
    body: Body<E>,
    ignored: bool,
}

/// A trial named `name` running `body` against the shared environment.
pub fn case<E>(name: impl Into<String>, body: impl Fn(&E) -> anyhow::Result<()> + Send + Sync + 'static) -> Case<E> {
    Case { name: name.into(), body: Box::new(body), ignored: false }
}

impl<E> Case<E> {
    /// This trial runs only when asked for with `--ignored` (or `--include-ignored`): a long
    /// scenario with a make target of its own, outside `make test`.
    #[allow(dead_code)] // not every suite has one
    pub fn ignored(self) -> Self {
        Case { ignored: true, ..self }
    }
}

/// The trials of a suite, in the order they run: `cases![f, module::g]` is
/// `vec![case("f", f), case("g", module::g)]`, each trial named after its function's last path
/// segment, so a trial keeps its name when its function moves into a module. A trial whose name is
/// not its function's is built with [`case`].
macro_rules! cases {
    (@name $last:ident) => {
        stringify!($last)
    };
    (@name $first:ident :: $($rest:tt)+) => {
        $crate::suite::cases!(@name $($rest)+)
    };
    ($($($segment:ident)::+),* $(,)?) => {
        vec![$($crate::suite::case($crate::suite::cases!(@name $($segment)::+), $($segment)::+)),*]
    };
}
pub(crate) use cases;

/// Runs `cases` against one environment from `setup` and exits with libtest's status; when every
/// case is ignored and none is asked for, only lists them (no set-up). A failing
/// trial's message is its error chain, `context(env)` (e.g. log tails), and the error chain again:
/// CI shows an output's tail, where the error must be.
pub fn run<E: Send + Sync + 'static>(
    cases: Vec<Case<E>>,
    setup: fn() -> anyhow::Result<E>,
    context: fn(&E) -> String,
) -> ! {
    let mut args = Arguments::from_args();
    args.test_threads = Some(1);
    // Nothing to run (e.g. `make test` over a suite whose every trial is ignored): no set-up,
    // which may bring up a node.
    let runs_any = args.ignored || args.include_ignored || cases.iter().any(|c| !c.ignored);
    if args.list || !runs_any {
        let listed = cases.into_iter().map(|c| Trial::test(c.name, || Ok(())).with_ignored_flag(c.ignored));
        libtest_mimic::run(&args, listed.collect()).exit();
    }
    let env = match setup() {
        Ok(e) => Arc::new(e),
        Err(e) => {
            eprintln!("e2e setup failed: {e:#}");
            std::process::exit(1);
        }
    };
    let trials = cases
        .into_iter()
        .map(|c| {
            let env = env.clone();
            Trial::test(c.name, move || {
                (c.body)(&env)
                    .map_err(|e| Failed::from(format!("{e:#}{}\n--- the failure, again\n{e:#}", context(&env))))
            })
            .with_ignored_flag(c.ignored)
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    drop(env);
    conclusion.exit()
}
