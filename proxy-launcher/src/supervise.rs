//! The launcher's loop: pick an epoch, start Envoy from the main thread, publish it once it is
//! LIVE, keep the readiness marker, and on SIGTERM either wait for Envoy's hand-over to finish or
//! stop it (docs/design-notes.md, "Handing the node proxy over").
//!
//! Envoy is forked from the main thread on purpose: it sets `PR_SET_PDEATHSIG`, which fires when
//! the *thread* that forked it exits. The loop is single-threaded and polls (Envoy every 100 ms,
//! the admin and the state dir every second).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ExitCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use crate::admin::Admin;
use crate::envoy::{Envoy, HotRestart};
use crate::epoch::{Build, Incompatibility, LiveRecord, Observation, Plan};
use crate::marker;
use crate::shm;
use crate::state_dir::{Held, StateDir};

/// What the launcher runs with (the `run` subcommand's flags).
#[derive(Debug, Clone)]
pub struct Config {
    /// The Envoy command.
    pub envoy: Envoy,
    /// `None`: the hand-over is off (`--disable-hot-restart`, SIGTERM stops Envoy at once).
    pub hot_restart: Option<HandOver>,
    /// The node's Envoy admin address (the bootstrap's, bound with `SO_REUSEPORT`).
    pub admin: SocketAddr,
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
    /// How long to wait for an Envoy outside the hand-over to exit before starting cold anyway.
    pub foreign_wait: Duration,
}

/// The window of [`Config::crash_restarts`].
pub const CRASH_WINDOW: Duration = Duration::from_secs(600);

/// How one Envoy ended.
enum Outcome {
    /// Stopped on SIGTERM (or never started because of it).
    Stopped,
    /// A successor took over (or it was asked to step down): nothing left to do in this pod.
    Superseded,
    /// It exited on its own, or never served.
    Failed(String),
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
    info!(
        envoy = %build.version,
        hot_restart_version = build.hot_restart_version.as_deref().unwrap_or("disabled"),
        hand_over = state.is_some(),
        "Envoy's configuration is valid"
    );
    let node = Node { cfg: &cfg, state, admin: Admin::new(cfg.admin), build, term };
    let mut crashes: VecDeque<Instant> = VecDeque::new();
    loop {
        match node.one_envoy() {
            Ok(Outcome::Stopped) => return ExitCode::SUCCESS,
            Ok(Outcome::Superseded) => {
                // Exiting would make the kubelet restart this container, which would start yet
                // another Envoy; the DaemonSet deletes this pod once its successor is Ready.
                info!("this pod's Envoy has handed over and exited; waiting for the pod to be deleted");
                while !node.stopping() {
                    std::thread::sleep(Duration::from_millis(200));
                }
                return ExitCode::SUCCESS;
            }
            Ok(Outcome::Failed(why)) => {
                if node.stopping() {
                    error!("{why}");
                    return ExitCode::FAILURE;
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
    build: Build,
    term: Arc<AtomicBool>,
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

    /// Under the start lock: the epoch to start and its parent, or `None` on SIGTERM.
    fn pick(&self, state: &StateDir, hr: &HandOver) -> std::io::Result<Option<(u32, Option<u32>, Held)>> {
        let Some(lock) = state.lock_start(
            || info!("another proxy pod on this node is starting its Envoy; waiting for it to serve"),
            || self.stopping(),
        )?
        else {
            return Ok(None);
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
            let foreign_admin = alive.is_empty() && self.admin.server_info().is_some();
            let plan = crate::epoch::plan(&Observation { live, alive, foreign_admin }, &self.build);
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
                    return Ok(Some((0, None, lock)));
                }
                Plan::Successor { parent, epoch } => {
                    match shm::clear_initializing(&shm::segment(&hr.shm_dir, hr.base_id)) {
                        Ok(shm::Flag::Cleared) => {
                            warn!("cleared the initializing flag left by an Envoy that died before it took over")
                        }
                        Ok(_) => {}
                        Err(e) => warn!(error = %e, "cannot check Envoy's hot restart segment"),
                    }
                    return Ok(Some((epoch, Some(parent), lock)));
                }
                Plan::WaitForDraining { parent, draining } => {
                    let bound = Duration::from_secs(u64::from(hr.parent_shutdown_seconds) + 15);
                    if since.elapsed() > bound {
                        warn!(
                            ?draining,
                            "still draining after {} s: taking over now, which makes Envoy end their connections",
                            bound.as_secs()
                        );
                        return Ok(Some((parent + 1, Some(parent), lock)));
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
                Plan::WaitForForeign => {
                    if since.elapsed() > hr.foreign_wait {
                        warn!(
                            admin = %self.cfg.admin,
                            "an Envoy outside the hand-over still answers after {} s: starting cold anyway; \
                             listeners it still holds will fail to bind",
                            hr.foreign_wait.as_secs()
                        );
                        return Ok(Some((0, None, lock)));
                    }
                    if first {
                        info!(
                            admin = %self.cfg.admin,
                            "an Envoy that takes no part in the hand-over (an older release's, or hot restart \
                             disabled) answers on the admin address: waiting for it to exit before a cold start \
                             (at most {} s)",
                            hr.foreign_wait.as_secs()
                        );
                    }
                }
                Plan::StopDraining { draining } => {
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
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Starts one Envoy and follows it until it ends.
    fn one_envoy(&self) -> std::io::Result<Outcome> {
        let hr = self.cfg.hot_restart.as_ref();
        let (epoch, parent, start_lock) = match (&self.state, hr) {
            (Some(state), Some(hr)) => match self.pick(state, hr)? {
                Some((e, p, l)) => (e, p, Some(l)),
                None => return Ok(Outcome::Stopped),
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
        let mut child = self.cfg.envoy.command(epoch, flags.as_ref()).spawn()?;
        info!(epoch, parent, pid = child.id(), "started Envoy");
        let started = Instant::now();
        // Until it serves.
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(Outcome::Failed(format!("Envoy at epoch {epoch} exited before it served ({status})")));
            }
            if self.stopping() {
                info!(epoch, "SIGTERM before Envoy served: stopping it");
                stop(&mut child);
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
        if let Some(state) = &self.state {
            state.write_live(&LiveRecord { epoch, build: self.build.clone() })?;
        }
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
        // Serving (and, after a hand-over, draining) until Envoy exits.
        let mut superseded = false;
        let mut stepped_down = false;
        let mut stopped = false;
        let mut term_at: Option<Instant> = None;
        let mut tick = 0u32;
        loop {
            if let Some(status) = child.try_wait()? {
                let _ = marker::remove(&self.cfg.marker);
                drop(alive);
                return Ok(if stopped && !stepped_down {
                    info!(epoch, %status, "Envoy stopped");
                    self.clean_if_last();
                    Outcome::Stopped
                } else if superseded || stepped_down || self.successor_serves(epoch) || self.successor_runs(epoch) {
                    info!(epoch, %status, "Envoy finished draining and exited");
                    Outcome::Superseded
                } else {
                    Outcome::Failed(format!("Envoy at epoch {epoch} exited ({status})"))
                });
            }
            tick += 1;
            if tick.is_multiple_of(10) {
                touch();
                if let (Some(state), Some(hr)) = (&self.state, hr) {
                    if !superseded && self.successor_serves(epoch) {
                        superseded = true;
                        info!(
                            epoch,
                            "a successor took the listening sockets over; this Envoy drains for {} s, then exits",
                            hr.parent_shutdown_seconds
                        );
                    }
                    if !stopped && let Some(why) = state.take_step_down(epoch)? {
                        warn!(epoch, "asked to stop without a hand-over: {why}");
                        signal(&child, rustix::process::Signal::TERM);
                        stopped = true;
                        stepped_down = true;
                    }
                }
                if self.stopping() && !stopped {
                    let at = *term_at.get_or_insert_with(|| {
                        if superseded {
                            info!(epoch, "SIGTERM: this Envoy has handed over; waiting for it to finish draining");
                        } else if let Some(hr) = hr {
                            info!(
                                epoch,
                                "SIGTERM: serving until a successor takes over (at most {} s), then stopping",
                                hr.successor_wait.as_secs()
                            );
                        }
                        Instant::now()
                    });
                    let child_attached = self.successor_runs(epoch);
                    let wait = hr.map_or(Duration::ZERO, |h| h.successor_wait);
                    // Never stop a parent whose child is starting: the child's messages to it would fail.
                    if !superseded && !child_attached && at.elapsed() >= wait {
                        if hr.is_some() {
                            info!(epoch, "no successor took over: stopping Envoy (its listeners close now)");
                        }
                        signal(&child, rustix::process::Signal::TERM);
                        stopped = true;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// After a stop with no successor: the node's hand-over state goes if no Envoy is left.
    fn clean_if_last(&self) {
        if let (Some(state), Some(hr)) = (&self.state, &self.cfg.hot_restart) {
            match state.clean_if_last(&shm::segment(&hr.shm_dir, hr.base_id)) {
                Ok(true) => info!("no Envoy left on the node: removed the hand-over state"),
                Ok(false) => {}
                Err(e) => warn!(error = %e, "cannot remove the hand-over state"),
            }
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
