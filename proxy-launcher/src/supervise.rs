//! The launcher's loop: pick an epoch, start Envoy from the main thread, publish it once it is
//! LIVE, keep the readiness marker, and on SIGTERM either wait for Envoy's hand-over to finish or
//! stop it (docs/design-notes.md, "Handing the node proxy over"). Beside an Envoy outside the
//! hand-over it stands by (Ready, not serving) and starts the moment that Envoy is gone. The
//! decisions are [`crate::epoch::plan`] and [`crate::serving`]; this module does their I/O.
//!
//! Envoy is forked from the main thread on purpose: it sets `PR_SET_PDEATHSIG`, which fires when
//! the *thread* that forked it exits. The loop is single-threaded and polls (Envoy every 100 ms,
//! the admin and the state dir every second).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::{Child, ExitCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use crate::admin::{Admin, EnvoyAdmin};
use crate::envoy::{Envoy, HotRestart};
use crate::epoch::{Build, Incompatibility, LiveRecord, Observation, Plan};
use crate::marker;
use crate::readiness::{Note, Readiness, Said};
use crate::serving::{
    End, Serving, ServingAction, ServingSeen, Standby, StandbyAction, StandbySeen, Superseded, SupersededAction,
    SupersededSeen,
};
use crate::shm;
use crate::state_dir::{Held, StateDir};

/// What the launcher runs with (the `run` subcommand's flags).
#[derive(Debug, Clone)]
pub struct Config {
    /// The Envoy command.
    pub envoy: Envoy,
    /// `None`: the hand-over is off (`--disable-hot-restart`, SIGTERM stops Envoy at once).
    pub hot_restart: Option<HandOver>,
    /// The node's Envoy admin (the bootstrap's: the chart's is a Unix socket).
    pub admin: EnvoyAdmin,
    /// Further admin addresses where an Envoy outside the hand-over may answer (a 0.10.0 Envoy's
    /// TCP admin).
    pub foreign_admins: Vec<EnvoyAdmin>,
    /// The pod-local readiness marker.
    pub marker: PathBuf,
    /// How long a started Envoy may take to serve (LIVE) before it is killed, e.g. because its
    /// xDS server (the agent) never answers.
    pub live_timeout: Duration,
    /// How many unexpected Envoy exits are restarted in process within [`CRASH_WINDOW`] before the
    /// launcher exits non-zero (and the kubelet's crash back-off takes over).
    pub crash_restarts: usize,
}

/// The hand-over settings.
#[derive(Debug, Clone)]
pub struct HandOver {
    /// The node's state directory (see [`crate::state_dir`]).
    pub state_dir: PathBuf,
    /// The directory that is `/dev/shm` for every proxy pod on the node.
    pub shm_dir: PathBuf,
    /// Envoy's `--base-id` and `--parent-shutdown-time-s`.
    pub base_id: u32,
    /// How long a parent drains after the take-over, in seconds (Envoy then exits).
    pub parent_shutdown_seconds: u32,
    /// On SIGTERM while this Envoy serves: how long to keep serving for a successor (a replaced
    /// pod's) to take over before stopping cold.
    pub successor_wait: Duration,
    /// Which proxy DaemonSet this pod belongs to (`<namespace>/<name>`), recorded in `live-epoch`:
    /// a launcher never takes over an Envoy recorded with another owner
    /// ([`crate::epoch::Plan::WaitForOtherOwner`]). `None` matches every owner.
    pub owner: Option<String>,
}

/// The window of [`Config::crash_restarts`].
pub const CRASH_WINDOW: Duration = Duration::from_secs(600);

/// How long a starting launcher waits for older Envoys it asked to step down (a draining epoch
/// with no serving one, or an incompatible serving one) to exit. A launcher reads the request
/// within a second and stops its Envoy at once, so only a lock held by something else lasts this
/// long; then the launcher exits non-zero, naming the holder.
pub const STEP_DOWN_WAIT: Duration = Duration::from_secs(30);

/// How long a launcher waits for the node's start lock: its holder may wait for a draining
/// generation (`parent_shutdown_seconds` + 15 s) or for step-downs ([`STEP_DOWN_WAIT`]), then give
/// its Envoy up to `live_timeout` to serve; plus 30 s. Past it the launcher exits non-zero,
/// naming the holder.
pub fn start_lock_bound(live_timeout: Duration, parent_shutdown_seconds: u32) -> Duration {
    let drain = Duration::from_secs(u64::from(parent_shutdown_seconds) + 15);
    live_timeout + drain.max(STEP_DOWN_WAIT) + Duration::from_secs(30)
}

/// How one Envoy ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Stopped on SIGTERM (or never started because of it).
    Stopped,
    /// A successor took over (or it was asked to step down): nothing left to do in this pod.
    Superseded,
    /// It exited on its own, or never served.
    Failed(String),
    /// None was started (the launcher stood by beside an Envoy outside the hand-over, which is
    /// gone now): pick an epoch again at once.
    Again,
}

/// What [`Node::pick`] chose.
enum Picked {
    /// Start `epoch` (with its `parent`, if a hot restart), holding the start lock.
    Start(u32, Option<u32>, Held),
    /// SIGTERM while waiting.
    Stopped,
    /// Stand by: an Envoy outside the hand-over answers on the admin address, or another owner's
    /// Envoy serves.
    Standby,
}

/// Runs until SIGTERM or a fatal error; the exit code for the process.
pub fn run(cfg: Config) -> ExitCode {
    let term = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        if let Err(e) = signal_hook::flag::register(sig, Arc::clone(&term)) {
            error!(error = %e, "cannot handle signal {sig}");
            return ExitCode::FAILURE;
        }
    }
    if let Err(e) = cfg.envoy.validate() {
        error!("{e}");
        return ExitCode::FAILURE;
    }
    let build = match cfg.envoy.build(cfg.hot_restart.as_ref().map_or(0, |h| h.base_id)) {
        Ok(b) => b,
        Err(e) => {
            error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let state = match cfg.hot_restart.as_ref().map(|h| StateDir::open(&h.state_dir)).transpose() {
        Ok(s) => s,
        Err(e) => {
            error!(error = %e, "cannot open the hand-over state dir");
            return ExitCode::FAILURE;
        }
    };
    if let Some(h) = cfg.hot_restart.as_ref() {
        match crate::shm::restrict_dir(&h.shm_dir) {
            Ok(true) => {}
            Ok(false) => {
                info!(shm_dir = %h.shm_dir.display(), "the shared memory dir is a sticky, shared one: left as it is")
            }
            Err(e) => {
                error!(error = %e, "cannot make the shared memory dir root-only");
                return ExitCode::FAILURE;
            }
        }
    }
    info!(
        envoy = %build.version,
        hot_restart_version = build.hot_restart_version.as_deref().unwrap_or("disabled"),
        hand_over = state.is_some(),
        "Envoy's configuration is valid"
    );
    if let EnvoyAdmin::Unix(socket) = &cfg.admin
        && let Err(e) = crate::admin::prepare_socket_dir(socket)
    {
        error!(error = %e, "cannot prepare the directory of Envoy's admin socket");
        return ExitCode::FAILURE;
    }
    let node = Node {
        cfg: &cfg,
        state,
        admin: Admin::new(cfg.admin.clone()),
        foreign: cfg.foreign_admins.iter().cloned().map(Admin::new).collect(),
        build,
        term,
        lease_watch: Default::default(),
    };
    // This owner's lease, held for the whole run: another release's launcher on the node so
    // knows this one still runs while its Envoy restarts. Given back when the launcher exits
    // because it was told to (SIGTERM), not when it gives up (the kubelet restarts it).
    let lease = match (node.state.as_ref(), node.owner()) {
        (Some(state), Some(owner)) => match state.hold_owner_lease(owner) {
            Ok(held) => Some(held),
            Err(e) => {
                error!(error = %e, owner, "cannot take this proxy DaemonSet's lease in the hand-over state dir");
                return ExitCode::FAILURE;
            }
        },
        _ => None,
    };
    let exit_clean = |code: ExitCode| {
        if let (Some(state), Some(owner), Some(held)) = (node.state.as_ref(), node.owner(), lease) {
            match state.release_owner_lease(owner, held) {
                Ok(true) => info!(owner, "the last launcher of this proxy DaemonSet on the node: lease released"),
                Ok(false) => {}
                Err(e) => warn!(error = %e, owner, "cannot remove this proxy DaemonSet's lease"),
            }
        }
        code
    };
    let mut crashes: VecDeque<Instant> = VecDeque::new();
    loop {
        match node.one_envoy() {
            Ok(Outcome::Stopped) => return exit_clean(ExitCode::SUCCESS),
            Ok(Outcome::Again) => {}
            Ok(Outcome::Superseded) => {
                // Exiting would make the kubelet restart this container, which would start yet
                // another Envoy; the DaemonSet deletes this pod once its successor is Ready.
                info!("this pod's Envoy has handed over and exited; waiting for the pod to be deleted");
                if node.superseded() == SupersededAction::Exit {
                    return exit_clean(ExitCode::SUCCESS);
                }
                warn!(
                    "no Envoy has run on this node for {} s (the one that took over is gone): starting Envoy again",
                    crate::serving::NOTHING_RUNS_FOR.as_secs()
                );
            }
            Ok(Outcome::Failed(why)) => {
                if node.stopping() {
                    // Deleted while failing: gone on purpose, so the lease goes too.
                    error!("{why}");
                    return exit_clean(ExitCode::FAILURE);
                }
                let now = Instant::now();
                crashes.retain(|t| now.duration_since(*t) < CRASH_WINDOW);
                crashes.push_back(now);
                if crashes.len() > cfg.crash_restarts {
                    error!(
                        "{why}; {} unexpected exits within {} s: exiting (the kubelet restarts the container)",
                        crashes.len(),
                        CRASH_WINDOW.as_secs()
                    );
                    return ExitCode::FAILURE;
                }
                warn!(restart = crashes.len(), of = cfg.crash_restarts, "{why}; starting Envoy again");
            }
            Err(e) => {
                error!(error = %e, "hand-over state dir");
                return ExitCode::FAILURE;
            }
        }
    }
}

struct Node<'a> {
    cfg: &'a Config,
    state: Option<StateDir>,
    admin: Admin,
    /// The --foreign-admin addresses.
    foreign: Vec<Admin>,
    build: Build,
    term: Arc<AtomicBool>,
    /// Another owner's lease, as polled.
    lease_watch: std::sync::Mutex<crate::serving::LeaseWatch>,
}

/// Logs a waiting state once, not once per poll.
#[derive(Default)]
struct Once(Option<std::mem::Discriminant<Plan>>);

impl Once {
    fn first(&mut self, plan: &Plan) -> bool {
        let d = std::mem::discriminant(plan);
        self.0.replace(d) != Some(d)
    }
}

impl Node<'_> {
    fn stopping(&self) -> bool {
        self.term.load(Ordering::Relaxed)
    }

    /// The first admin address (ours, then the --foreign-admin ones) where an Envoy answers
    /// `/server_info`. Asked only when no epoch of ours runs: then that Envoy is outside the
    /// hand-over.
    fn answering_admin(&self) -> Option<&EnvoyAdmin> {
        std::iter::once(&self.admin).chain(&self.foreign).find(|a| a.server_info().is_some()).map(Admin::address)
    }

    /// What the admin says of this Envoy at `epoch`, for the readiness rule: LIVE at its epoch
    /// with no listener stopped; a newer epoch answering (a successor taking over) counts as
    /// serving, the state dir decides.
    fn said(&self, epoch: u32) -> Said {
        let Some(info) = self.admin.server_info() else { return Said::NoAnswer };
        if info.command_line_options.restart_epoch != epoch {
            return Said::Serving;
        }
        if info.state != "LIVE" {
            return Said::NotServing(format!("Envoy's admin says its state is {}", info.state));
        }
        match self.admin.listeners_stopped() {
            None => Said::NoAnswer,
            Some(0) => Said::Serving,
            Some(n) => Said::NotServing(format!(
                "{n} of Envoy's listeners were stopped ({}; POST /drain_listeners on its admin?), and Envoy \
                 does not start them again",
                crate::admin::LISTENER_STOPPED
            )),
        }
    }

    /// Under the start lock: the epoch to start and its parent, or why none starts now.
    fn pick(&self, state: &StateDir, hr: &HandOver) -> std::io::Result<Picked> {
        let Some(lock) = state.lock_start(
            start_lock_bound(self.cfg.live_timeout, hr.parent_shutdown_seconds),
            || info!("another proxy pod on this node is starting its Envoy; waiting for it to serve"),
            || self.stopping(),
        )?
        else {
            return Ok(Picked::Stopped);
        };
        let mut logged = Once::default();
        let since = Instant::now();
        // The base id of an Envoy replaced for having another one: its segment goes with it.
        let mut retired_base: Option<u32> = None;
        // Epochs asked to step down, once each (a request left behind would stop the next Envoy
        // of that epoch number).
        let mut asked = std::collections::BTreeSet::new();
        loop {
            let live = state.read_live().unwrap_or_else(|e| {
                warn!(error = %e, "ignoring the live-epoch record");
                None
            });
            let alive = state.alive_epochs(None)?;
            let foreign_admin = alive.is_empty() && self.answering_admin().is_some();
            let other_owner_holds = self.other_owner_holds(state, live.as_ref());
            let seen = Observation { live, alive, foreign_admin, other_owner_holds };
            let plan = crate::epoch::plan(&seen, &self.build, hr.owner.as_deref());
            let first = logged.first(&plan);
            match plan {
                Plan::Cold => {
                    if let Some(b) = retired_base.filter(|b| *b != hr.base_id) {
                        let seg = shm::segment(&hr.shm_dir, b);
                        match std::fs::remove_file(&seg) {
                            Ok(()) => {
                                info!(segment = %seg.display(), "removed the replaced Envoy's hot restart segment")
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                            Err(e) => {
                                warn!(error = %e, segment = %seg.display(), "cannot remove the replaced Envoy's segment")
                            }
                        }
                    }
                    return Ok(Picked::Start(0, None, lock));
                }
                Plan::Successor { parent, epoch } => {
                    clear_initializing(hr);
                    return Ok(Picked::Start(epoch, Some(parent), lock));
                }
                Plan::WaitForDraining { parent, draining } => {
                    let bound = Duration::from_secs(u64::from(hr.parent_shutdown_seconds) + 15);
                    if since.elapsed() > bound {
                        warn!(
                            ?draining,
                            "still draining after {} s: taking over now, which makes Envoy end their connections",
                            bound.as_secs()
                        );
                        clear_initializing(hr);
                        return Ok(Picked::Start(parent + 1, Some(parent), lock));
                    }
                    if first {
                        info!(
                            parent,
                            ?draining,
                            "an earlier hand-over still drains connections; starting now would make Envoy \
                             end them, so waiting (at most {} s)",
                            bound.as_secs()
                        );
                    }
                }
                // Outside the start lock: standing by has no bound.
                Plan::WaitForForeign | Plan::WaitForOtherOwner { .. } => return Ok(Picked::Standby),
                Plan::StopDraining { draining } => {
                    if since.elapsed() > STEP_DOWN_WAIT {
                        return Err(self.still_held(state, &draining));
                    }
                    for e in &draining {
                        if asked.insert(*e) {
                            state.request_step_down(*e, "no epoch serves: a cold start replaces the draining ones")?;
                        }
                    }
                    if first {
                        warn!(
                            ?draining,
                            "no Envoy serves, older ones still drain: asking them to stop, then starting cold"
                        );
                    }
                }
                Plan::Replace { parent, why } => {
                    if since.elapsed() > STEP_DOWN_WAIT {
                        return Err(self.still_held(state, &[parent]));
                    }
                    if let Incompatibility::BaseId { running, .. } = why {
                        retired_base = Some(running);
                    }
                    if asked.insert(parent) {
                        state.request_step_down(parent, &why.to_string())?;
                    }
                    if first {
                        warn!(
                            parent,
                            "the serving Envoy cannot hand over to this one ({why}): asking it to stop, then \
                             starting cold; connections to this node's pods are refused until this Envoy serves"
                        );
                    }
                }
            }
            if self.stopping() {
                return Ok(Picked::Stopped);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// After this pod's Envoy handed over and exited ([`Superseded`]): polls every second until
    /// SIGTERM ([`SupersededAction::Exit`]) or until no Envoy has run on the node for a while
    /// ([`SupersededAction::Restart`]).
    fn superseded(&self) -> SupersededAction {
        let mut superseded = Superseded::default();
        let mut tick = 0u32;
        let mut envoy_runs = true;
        loop {
            if tick.is_multiple_of(5) {
                // A state dir that cannot be read counts as "runs": never start a second Envoy on
                // a guess.
                envoy_runs = self.state.as_ref().is_none_or(|s| s.alive_epochs(None).map_or(true, |a| !a.is_empty()));
            }
            tick += 1;
            let seen = SupersededSeen { now: Instant::now(), term: self.stopping(), envoy_runs };
            match superseded.next(&seen) {
                SupersededAction::Wait => std::thread::sleep(Duration::from_millis(200)),
                done => return done,
            }
        }
    }

    /// Stands by while an Envoy outside the hand-over answers on the admin address and no epoch
    /// of ours runs, or while another owner's epoch serves ([`Standby`]): the pod is Ready without
    /// serving, so that a surge roll deletes the old pod; the state dir and the admin are polled
    /// every 200 ms, and Envoy starts the moment the other one is gone.
    fn stand_by(&self, state: &StateDir) -> Outcome {
        let mut standby = Standby::default();
        let owner = self.owner();
        // The address the other Envoy answered on last (for the marker and the logs).
        let mut answered = self.cfg.admin.clone();
        loop {
            let answering = self.answering_admin().cloned();
            let alive = state.alive_epochs(None);
            // The recorded epoch, when its record names another owner whose Envoy still runs or
            // whose launchers still hold the node.
            let other = state
                .read_live()
                .ok()
                .flatten()
                .filter(|l| {
                    alive.as_ref().is_ok_and(|a| a.contains(&l.epoch)) || self.other_owner_holds(state, Some(l))
                })
                .and_then(|l| crate::epoch::other_owner(&l, owner).map(|o| (l.epoch, o.to_owned())));
            let seen = StandbySeen {
                term: self.stopping(),
                foreign_admin: answering.is_some(),
                ours_alive: alive.is_ok_and(|a| !a.is_empty()),
                other_owner: other.is_some(),
            };
            if let Some(a) = answering {
                answered = a;
            }
            let beside = match &other {
                Some((_, theirs)) => format!("the Envoy of {theirs} serves this node"),
                None => format!("an Envoy outside the hand-over answers on {answered}"),
            };
            let touch = || {
                if let Err(e) = marker::touch_standby(&self.cfg.marker, &beside) {
                    warn!(error = %e, marker = %self.cfg.marker.display(), "cannot write the readiness marker");
                }
            };
            match standby.next(&seen) {
                StandbyAction::Announce => {
                    match &other {
                        Some((epoch, theirs)) => warn!(
                            epoch,
                            owner = %theirs,
                            ours = owner.unwrap_or_default(),
                            "the Envoy serving this node belongs to another proxy DaemonSet ({theirs}): another \
                             release on this node, or this one's before a namespace move. Standing by instead of \
                             taking its sockets over; this pod is Ready without serving until that Envoy exits. \
                             One release per node: uninstall the other, or give the two disjoint nodes \
                             (daemonset.nodeSelector)"
                        ),
                        None => warn!(
                            admin = %answered,
                            "an Envoy that takes no part in the hand-over (an older release's, or hot restart \
                             disabled) answers on the admin address: standing by instead of starting beside it \
                             (every listener would fail to bind). This pod is Ready without serving until that \
                             Envoy exits, so that a surge roll deletes the old pod; if nothing deletes it, delete \
                             the old proxy pod on this node. Envoy starts cold the moment the other one is gone"
                        ),
                    }
                    touch();
                }
                StandbyAction::Wait => touch(),
                StandbyAction::Start => {
                    let _ = marker::remove(&self.cfg.marker);
                    if seen.foreign_admin {
                        info!("an epoch of ours runs: picking an epoch again");
                    } else {
                        info!(admin = %answered, "nothing answers on the admin address any more: starting Envoy");
                    }
                    return Outcome::Again;
                }
                StandbyAction::Stop => {
                    let _ = marker::remove(&self.cfg.marker);
                    info!("SIGTERM while standing by: exiting");
                    return Outcome::Stopped;
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Whether the owner `live` names, when it is not ours, still holds the node: its lease
    /// ([`crate::serving::LeaseWatch`]). A lease that cannot be read counts as held: never start
    /// beside another release's Envoy on a guess.
    fn other_owner_holds(&self, state: &StateDir, live: Option<&LiveRecord>) -> bool {
        let Some(theirs) = live.and_then(|l| crate::epoch::other_owner(l, self.owner())) else { return false };
        let lease = state.owner_lease(theirs).unwrap_or_else(|e| {
            warn!(error = %e, owner = theirs, "cannot read another owner's lease: counting it as held");
            crate::state_dir::Lease::Held
        });
        self.lease_watch.lock().unwrap_or_else(std::sync::PoisonError::into_inner).present(
            theirs,
            lease,
            Instant::now(),
        )
    }

    /// The error of a step-down wait that timed out: which `alive.<epoch>` locks are still held,
    /// and by whom.
    fn still_held(&self, state: &StateDir, epochs: &[u32]) -> std::io::Error {
        let held: Vec<String> = epochs
            .iter()
            .map(|e| {
                format!(
                    "{} (held by {})",
                    state.path().join(format!("alive.{e}")).display(),
                    state.lock_holder(&format!("alive.{e}"))
                )
            })
            .collect();
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "asked epochs {epochs:?} to step down, still running after {} s: {}; exiting (the kubelet \
                 restarts the container)",
                STEP_DOWN_WAIT.as_secs(),
                held.join(", ")
            ),
        )
    }

    /// Starts one Envoy and follows it until it ends.
    fn one_envoy(&self) -> std::io::Result<Outcome> {
        let hr = self.cfg.hot_restart.as_ref();
        let (epoch, parent, start_lock) = match (&self.state, hr) {
            (Some(state), Some(hr)) => match self.pick(state, hr)? {
                Picked::Start(e, p, l) => (e, p, Some(l)),
                Picked::Stopped => return Ok(Outcome::Stopped),
                Picked::Standby => return Ok(self.stand_by(state)),
            },
            _ => (0, None, None),
        };
        let alive = self.state.as_ref().map(|s| s.hold_alive(epoch)).transpose()?;
        if let Some(state) = &self.state {
            // A request meant for an earlier Envoy of this epoch number (gone before it read it).
            if let Some(why) = state.take_step_down(epoch)? {
                info!(epoch, "dropped a step-down request left for an earlier Envoy of this epoch: {why}");
            }
        }
        let flags = hr.zip(self.state.as_ref()).map(|(h, s)| HotRestart {
            base_id: h.base_id,
            socket_path: s.socket_path(),
            parent_shutdown_seconds: h.parent_shutdown_seconds,
        });
        // Held until this Envoy has exited: no last launcher removes the admin dir under it.
        let admin_dir = match &self.cfg.admin {
            EnvoyAdmin::Unix(socket) => match crate::admin::hold_socket_dir(socket) {
                Ok(hold) => hold,
                Err(e) => return Ok(Outcome::Failed(format!("cannot hold the admin socket's directory: {e}"))),
            },
            EnvoyAdmin::Tcp(_) => None,
        };
        let mut child = match self.cfg.envoy.command(epoch, flags.as_ref()).spawn() {
            Ok(c) => c,
            Err(e) => return Ok(Outcome::Failed(format!("cannot start Envoy at epoch {epoch}: {e}"))),
        };
        info!(epoch, parent, pid = child.id(), "started Envoy");
        // From here on no error ends the launcher while its Envoy runs: the launcher is PID 1, and
        // its exit would take a serving Envoy (maybe one that holds the node's only listening
        // sockets) with it. State-dir errors are warnings; a missing record is written again.
        let mut warned = Warned::default();
        let started = Instant::now();
        // Until it serves.
        loop {
            if let Some(status) = exited(&mut child, &mut warned) {
                return Ok(Outcome::Failed(format!("Envoy at epoch {epoch} exited before it served ({status})")));
            }
            if self.stopping() {
                info!(epoch, "SIGTERM before Envoy served: stopping it");
                stop(&mut child);
                // As after a stop once serving: the node's state and admin dir go if it was the last.
                drop(alive);
                drop(admin_dir);
                self.clean_up_if_last();
                return Ok(Outcome::Stopped);
            }
            if started.elapsed() > self.cfg.live_timeout {
                let _ = child.kill();
                let _ = child.wait();
                return Ok(Outcome::Failed(format!(
                    "Envoy at epoch {epoch} did not serve within {} s (is the agent's xDS socket answering?); killed it",
                    self.cfg.live_timeout.as_secs()
                )));
            }
            if self.admin.server_info().is_some_and(|s| s.live_at(epoch)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let record = LiveRecord { epoch, build: self.build.clone(), owner: self.owner().map(str::to_owned) };
        let mut published = self.publish(&record, &mut warned);
        drop(start_lock);
        let took = started.elapsed().as_secs_f64();
        match parent {
            Some(p) => {
                info!(epoch, "Envoy serves after {took:.1} s: it took the listening sockets over from epoch {p}")
            }
            None => info!(epoch, "Envoy serves after {took:.1} s (cold start)"),
        }
        let touch = || {
            if let Err(e) = marker::touch(&self.cfg.marker, epoch) {
                warn!(error = %e, marker = %self.cfg.marker.display(), "cannot write the readiness marker");
            }
        };
        touch();
        // Serving (and, after a hand-over, draining) until Envoy exits: the rules are
        // `serving::Serving`; this loop polls Envoy every 100 ms and the state dir every second.
        let mut serving = Serving::new(hr.map_or(Duration::ZERO, |h| h.successor_wait));
        let mut readiness = Readiness::new(Instant::now());
        let mut seen = ServingSeen {
            now: Instant::now(),
            term: false,
            exited: false,
            successor_serves: false,
            successor_attached: false,
            step_down: None,
        };
        let mut tick = 0u32;
        loop {
            let status = exited(&mut child, &mut warned);
            let term_now = self.stopping() && !seen.term;
            seen.now = Instant::now();
            seen.term = self.stopping();
            seen.exited = status.is_some();
            tick += 1;
            // The state dir every second, and at once when Envoy exits or SIGTERM arrives (what
            // happens next depends on whether a successor took over).
            if tick.is_multiple_of(10) || seen.exited || term_now {
                if !published {
                    published = self.publish(&record, &mut warned);
                }
                seen.successor_serves = self.successor_serves(epoch);
                seen.successor_attached = self.successor_runs(epoch);
                // Ready means serving (`readiness`): once handed over, the old pod stays Ready
                // until its Envoy exits (maxUnavailable: 0 holds through the hand-over).
                if seen.successor_serves || seen.exited {
                    touch();
                } else {
                    let (fresh, note) = readiness.next(seen.now, &self.said(epoch));
                    if fresh {
                        touch();
                    }
                    match note {
                        Some(Note::Withheld(why)) => warn!(
                            epoch,
                            "{why}: this pod reports NotReady (the readiness marker is no longer refreshed); \
                             replace the pod to serve again"
                        ),
                        Some(Note::Restored) => {
                            info!(epoch, "Envoy's admin says it serves again: this pod reports Ready")
                        }
                        None => {}
                    }
                }
                seen.step_down = match &self.state {
                    Some(state) if !serving.stopping() && !seen.exited => self.step_down(state, epoch, &mut warned),
                    _ => None,
                };
            }
            loop {
                match serving.next(&seen) {
                    ServingAction::Wait => break,
                    ServingAction::NoteSuperseded => info!(
                        epoch,
                        "a successor took the listening sockets over; this Envoy drains for {} s, then exits",
                        hr.map_or(0, |h| h.parent_shutdown_seconds)
                    ),
                    ServingAction::StepDown(why) => {
                        warn!(epoch, "asked to stop without a hand-over: {why}");
                        signal(&child, rustix::process::Signal::TERM);
                    }
                    ServingAction::NoteTerm { superseded: true } => {
                        info!(epoch, "SIGTERM: this Envoy has handed over; waiting for it to finish draining")
                    }
                    ServingAction::NoteTerm { superseded: false } => {
                        if let Some(hr) = hr {
                            info!(
                                epoch,
                                "SIGTERM: serving until a successor takes over (at most {} s), then stopping",
                                hr.successor_wait.as_secs()
                            );
                        }
                    }
                    ServingAction::StopEnvoy => {
                        if hr.is_some() {
                            info!(epoch, "no successor took over: stopping Envoy (its listeners close now)");
                        }
                        signal(&child, rustix::process::Signal::TERM);
                    }
                    ServingAction::Ended(end) => {
                        let status = status.map(|s| s.to_string()).unwrap_or_default();
                        let _ = marker::remove(&self.cfg.marker);
                        drop(alive);
                        drop(admin_dir);
                        return Ok(match end {
                            End::Stopped => {
                                info!(epoch, %status, "Envoy stopped");
                                self.clean_up_if_last();
                                Outcome::Stopped
                            }
                            End::Superseded => {
                                info!(epoch, %status, "Envoy finished draining and exited");
                                Outcome::Superseded
                            }
                            End::Failed => Outcome::Failed(format!("Envoy at epoch {epoch} exited ({status})")),
                        });
                    }
                }
            }
            seen.step_down = None;
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// This epoch's step-down request, if any; a read error is a warning (once until it clears).
    fn step_down(&self, state: &StateDir, epoch: u32, warned: &mut Warned) -> Option<String> {
        match state.take_step_down(epoch) {
            Ok(s) => {
                warned.step_down = false;
                s
            }
            Err(e) => {
                if !std::mem::replace(&mut warned.step_down, true) {
                    warn!(epoch, error = %e, "cannot read this epoch's step-down request; still serving");
                }
                None
            }
        }
    }

    /// Writes the `live-epoch` record (no state dir: nothing to write); whether it is written. A
    /// failure is a warning (once until it succeeds), and the caller tries again every second.
    fn publish(&self, record: &LiveRecord, warned: &mut Warned) -> bool {
        let Some(state) = &self.state else { return true };
        match state.write_live(record) {
            Ok(()) => {
                if std::mem::replace(&mut warned.publish, false) {
                    info!(epoch = record.epoch, "wrote the live-epoch record");
                }
                true
            }
            Err(e) => {
                if !std::mem::replace(&mut warned.publish, true) {
                    warn!(
                        epoch = record.epoch,
                        error = %e,
                        "cannot write the live-epoch record; Envoy keeps serving, retrying every second \
                         (until it is written a successor cannot take over from this Envoy)"
                    );
                }
                false
            }
        }
    }

    /// After a stop with no successor: the node's hand-over state goes if no Envoy is left.
    /// Whether none is (always true with the hand-over off: this was the node's Envoy).
    fn clean_if_last(&self) -> bool {
        let (Some(state), Some(hr)) = (&self.state, &self.cfg.hot_restart) else { return true };
        match state.clean_if_last(&shm::segment(&hr.shm_dir, hr.base_id)) {
            Ok(true) => {
                info!("no Envoy left on the node: removed the hand-over state");
                true
            }
            Ok(false) => false,
            Err(e) => {
                warn!(error = %e, "cannot remove the hand-over state");
                false
            }
        }
    }

    /// After a stop with no successor: [`Self::clean_if_last`], then, when no Envoy is left,
    /// [`Self::remove_admin_dir`].
    fn clean_up_if_last(&self) {
        if self.clean_if_last() {
            self.remove_admin_dir();
        }
    }

    /// This pod's proxy DaemonSet (`--owner`), with the hand-over on.
    fn owner(&self) -> Option<&str> {
        self.cfg.hot_restart.as_ref().and_then(|h| h.owner.as_deref())
    }

    /// After the node's last Envoy stopped: removes its admin socket and directory unless another
    /// launcher holds that directory ([`crate::admin::remove_unused_socket_dir`]).
    fn remove_admin_dir(&self) {
        let EnvoyAdmin::Unix(socket) = &self.cfg.admin else { return };
        match crate::admin::remove_unused_socket_dir(socket) {
            Ok(true) => info!(socket = %socket.display(), "removed Envoy's admin socket and its directory"),
            Ok(false) => {}
            Err(e) => warn!(error = %e, socket = %socket.display(), "cannot remove Envoy's admin socket directory"),
        }
    }

    /// Whether the next epoch's Envoy runs (it ends its parent when its drain time is up).
    fn successor_runs(&self, epoch: u32) -> bool {
        self.state.as_ref().is_some_and(|s| s.is_alive(epoch + 1).unwrap_or(false))
    }

    /// Whether a later epoch than `epoch` has published itself as serving.
    fn successor_serves(&self, epoch: u32) -> bool {
        self.state.as_ref().and_then(|s| s.read_live().ok().flatten()).is_some_and(|l| l.epoch > epoch)
    }
}

/// Before a hot restart, under the start lock (no Envoy initializes): clears the initializing flag
/// an Envoy that died before it took over left in the segment, which would make the next one exit.
fn clear_initializing(hr: &HandOver) {
    match shm::clear_initializing(&shm::segment(&hr.shm_dir, hr.base_id)) {
        Ok(shm::Flag::Cleared) => warn!("cleared the initializing flag left by an Envoy that died before it took over"),
        Ok(_) => {}
        Err(e) => warn!(error = %e, "cannot check Envoy's hot restart segment"),
    }
}

/// Which warnings were logged, so that a failure repeated every poll is logged once until it clears.
#[derive(Default)]
struct Warned {
    wait: bool,
    publish: bool,
    step_down: bool,
}

/// The child's exit status if it exited. An error of `waitpid` is a warning (once) and counts as
/// "still running": the child is never given up on while it may run.
fn exited(child: &mut Child, warned: &mut Warned) -> Option<std::process::ExitStatus> {
    match child.try_wait() {
        Ok(s) => s,
        Err(e) => {
            if !std::mem::replace(&mut warned.wait, true) {
                warn!(pid = child.id(), error = %e, "cannot check whether Envoy exited; assuming it runs");
            }
            None
        }
    }
}

fn signal(child: &Child, sig: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

/// SIGTERM, then wait for the exit.
fn stop(child: &mut Child) {
    signal(child, rustix::process::Signal::TERM);
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::path::Path;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicU8;

    /// A tmpfs of `size` mounted on `at`, unmounted on drop (so on every exit path of a test).
    struct Tmpfs(PathBuf);

    impl Tmpfs {
        fn mount(at: &Path, size: &str) -> Tmpfs {
            let ok = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
                .arg(at)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "cannot mount a tmpfs on {} (the launcher's tests run as root)", at.display());
            Tmpfs(at.to_owned())
        }
    }

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }

    /// An admin address answering `/server_info` as LIVE at epoch 0, and no listener stopped,
    /// once `state` is 1; before, it closes every connection unanswered (nothing serves, and no
    /// foreign admin either).
    fn fake_admin(state: Arc<AtomicU8>) -> std::net::SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { continue };
                let mut buf = [0u8; 1024];
                let n = c.read(&mut buf).unwrap_or(0);
                if state.load(Ordering::Relaxed) != 1 {
                    continue;
                }
                let body = if buf[..n].starts_with(b"GET /stats") {
                    r#"{"stats":[{"name":"listener_manager.listener_stopped","value":0}]}"#
                } else {
                    r#"{"state":"LIVE","command_line_options":{"restart_epoch":0}}"#
                };
                let _ =
                    write!(c, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            }
        });
        addr
    }

    /// What the launcher logged, captured for one thread.
    #[derive(Clone, Default)]
    struct Logs(Arc<Mutex<Vec<u8>>>);

    impl Write for Logs {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Logs {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
        }
    }

    struct SetOnDrop(Arc<AtomicBool>);

    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    fn wait_for(what: &str, within: Duration, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + within;
        while !cond() {
            assert!(Instant::now() < deadline, "no {what} within {within:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A full state dir (ENOSPC) once Envoy runs: the record cannot be written, yet the launcher
    /// keeps its Envoy serving, says so, and writes the record once there is room again.
    #[test]
    fn a_state_dir_error_after_spawn_never_ends_the_running_envoy() {
        let tmp = tempfile::tempdir().unwrap();
        let state_dir = tmp.path().join("state");
        std::fs::create_dir(&state_dir).unwrap();
        let _tmpfs = Tmpfs::mount(&state_dir, "64k");
        let admin_state = Arc::new(AtomicU8::new(0));
        let admin = fake_admin(Arc::clone(&admin_state));
        let pid_file = tmp.path().join("envoy.pid");
        let cfg = Config {
            // `sh -c SCRIPT PIDFILE <the hot restart flags>`: an "Envoy" that records its PID.
            envoy: Envoy {
                binary: "/bin/sh".into(),
                args: vec!["-c".into(), "echo $$ > \"$0\"; exec sleep 60".into(), pid_file.clone().into()],
            },
            hot_restart: Some(HandOver {
                state_dir: state_dir.clone(),
                shm_dir: tmp.path().to_owned(),
                base_id: 1,
                parent_shutdown_seconds: 1,
                successor_wait: Duration::ZERO,
                owner: None,
            }),
            admin: EnvoyAdmin::Tcp(admin),
            foreign_admins: Vec::new(),
            marker: tmp.path().join("ready"),
            live_timeout: Duration::from_secs(30),
            crash_restarts: 0,
        };
        let term = Arc::new(AtomicBool::new(false));
        let node = Node {
            cfg: &cfg,
            state: Some(StateDir::open(&state_dir).unwrap()),
            admin: Admin::new(EnvoyAdmin::Tcp(admin)),
            foreign: Vec::new(),
            build: Build { version: crate::epoch::Version(1, 40, 0), hot_restart_version: None, base_id: 1 },
            term: Arc::clone(&term),
            lease_watch: Default::default(),
        };
        let logs = Logs::default();
        let record = state_dir.join("live-epoch");
        let driver = {
            let (pid_file, marker, record, logs) = (pid_file.clone(), cfg.marker.clone(), record.clone(), logs.clone());
            let (state_dir, term) = (state_dir.clone(), Arc::clone(&term));
            std::thread::spawn(move || {
                // However this thread ends (a failed assertion too), the launcher stops.
                let _stop = SetOnDrop(Arc::clone(&term));
                wait_for("Envoy started", Duration::from_secs(10), || {
                    std::fs::read_to_string(&pid_file).is_ok_and(|s| s.ends_with('\n'))
                });
                let pid = std::fs::read_to_string(&pid_file).unwrap().trim().to_owned();
                // Fill the state dir's tmpfs, then let Envoy report LIVE.
                let fill = state_dir.join("fill");
                let err = std::fs::write(&fill, vec![0u8; 1 << 20]).unwrap_err();
                assert_eq!(err.raw_os_error(), Some(28), "{err}");
                admin_state.store(1, Ordering::Relaxed);
                wait_for("the readiness marker", Duration::from_secs(10), || marker.exists());
                std::thread::sleep(Duration::from_millis(2500));
                let alive = std::process::Command::new("kill").args(["-0", &pid]).status().unwrap().success();
                assert!(alive, "Envoy ({pid}) was ended:\n{}", logs.text());
                assert!(!record.exists());
                assert!(
                    logs.text().contains("cannot write the live-epoch record; Envoy keeps serving"),
                    "{}",
                    logs.text()
                );
                // Room again: the record is written within the next poll.
                std::fs::remove_file(&fill).unwrap();
                wait_for("the live-epoch record", Duration::from_secs(5), || record.exists());
                term.store(true, Ordering::Relaxed);
            })
        };
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt().with_ansi(false).with_writer(move || writer.clone()).finish();
        let outcome = tracing::subscriber::with_default(subscriber, || node.one_envoy());
        let driven = driver.join();
        assert_eq!(outcome.unwrap(), Outcome::Stopped, "{}", logs.text());
        driven.unwrap();
        assert!(logs.text().contains("wrote the live-epoch record"), "{}", logs.text());
    }
}
