//! Which restart epoch a starting Envoy takes: the pure decision over what the node's state dir
//! shows (docs/design-notes.md, "Handing the node proxy over").
//!
//! Envoy's hot restart passes the listening sockets from the process at epoch `R` to one started
//! with `--restart-epoch R+1`; epoch 0 starts cold and binds its own. Starting `R+1` also makes
//! Envoy terminate epoch `R-1` (the grandparent) at once, and it works only between binaries of
//! the same hot-restart version and base id; listeners bound in another network namespace are
//! handed over only from Envoy 1.38.0 on (before, the child binds a new socket and gets
//! EADDRINUSE, so the listener is lost when the parent exits).

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The first Envoy release that hands over listeners bound in another network namespace
/// (`network_namespace_filepath`): the inbound listeners of every TCP-delivered pod.
pub const NETNS_HANDOVER_SINCE: Version = Version(1, 38, 0);

/// An Envoy release number, `major.minor.patch`, as `envoy --version` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Version(pub u32, pub u32, pub u32);

impl Version {
    /// Parses `1.40.0` (a trailing `-dev` or similar suffix on the patch is ignored).
    pub fn parse(s: &str) -> Option<Version> {
        let mut it = s.trim().splitn(3, '.');
        let major = it.next()?.parse().ok()?;
        let minor = it.next()?.parse().ok()?;
        let patch: String = it.next()?.chars().take_while(char::is_ascii_digit).collect();
        Some(Version(major, minor, patch.parse().ok()?))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// What a launcher knows of the Envoy binary it runs, and what it records for its successor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Build {
    /// `envoy --version`'s release number.
    pub version: Version,
    /// `envoy --hot-restart-version` (e.g. `11.104`: shared-memory layout version and size in
    /// bytes); `None` when the binary was built without hot restart (it prints `disabled`).
    pub hot_restart_version: Option<String>,
    /// `--base-id`: names the shared-memory segment and the hot restart sockets.
    pub base_id: u32,
}

/// The `live-epoch` record: which epoch serves the node, written by its launcher only once that
/// Envoy reported `state: LIVE` at that epoch (one JSON object).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveRecord {
    /// The serving Envoy's `--restart-epoch`.
    pub epoch: u32,
    /// Its binary.
    pub build: Build,
    /// Which proxy DaemonSet's pod runs it (`--owner`, `<namespace>/<name>`); absent in records of
    /// releases up to 0.10.0, and when the launcher was given none. Two owners are two Helm
    /// releases (or a moved DaemonSet) sharing the node's hand-over state: one never takes the
    /// other's sockets over (docs/install.md, "One release per cluster").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// What a starting launcher sees, under the node's start lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// The `live-epoch` record, if any.
    pub live: Option<LiveRecord>,
    /// The epochs whose Envoy still runs (their `alive.<epoch>` lock is held).
    pub alive: BTreeSet<u32>,
    /// Whether an Envoy answers on the admin address although no epoch is alive: one that takes
    /// no part in the hand-over (an older chart's, started with `--disable-hot-restart`).
    pub foreign_admin: bool,
    /// Whether the owner the `live-epoch` record names, when it is not ours, still holds the node
    /// (its lease held, or left unheld by a crash not long ago: `crate::serving::LeaseWatch`):
    /// its Envoy may be gone only for a restart.
    pub other_owner_holds: bool,
}

/// Why the running Envoy cannot hand its sockets to ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incompatibility {
    /// One of the two binaries has hot restart compiled out.
    HotRestartDisabled,
    /// The shared-memory layouts differ (`--hot-restart-version`).
    HotRestartVersion {
        /// The running Envoy's.
        running: String,
        /// Ours.
        ours: String,
    },
    /// A different `--base-id` (a changed chart value): other segment, other sockets.
    BaseId {
        /// The running Envoy's.
        running: u32,
        /// Ours.
        ours: u32,
    },
    /// One side predates the hand-over of listeners bound in a pod's network namespace.
    TooOldForNetns {
        /// The older of the two releases.
        version: Version,
    },
}

impl fmt::Display for Incompatibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Incompatibility::HotRestartDisabled => {
                f.write_str("one of the two Envoy binaries has hot restart disabled")
            }
            Incompatibility::HotRestartVersion { running, ours } => {
                write!(f, "hot restart versions differ (running {running}, ours {ours})")
            }
            Incompatibility::BaseId { running, ours } => write!(f, "base ids differ (running {running}, ours {ours})"),
            Incompatibility::TooOldForNetns { version } => write!(
                f,
                "Envoy {version} cannot hand over listeners bound in a pod's network namespace \
                 (needs {NETNS_HANDOVER_SINCE} or later on both sides)"
            ),
        }
    }
}

/// What to do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// No Envoy of ours runs: start at epoch 0, binding every listener anew.
    Cold,
    /// Hot restart: `epoch` = `parent + 1` takes the parent's listening sockets.
    Successor {
        /// The serving epoch.
        parent: u32,
        /// Ours.
        epoch: u32,
    },
    /// Wait: an older epoch still drains its connections, and starting now would make Envoy
    /// terminate it (at most one draining generation per node).
    WaitForDraining {
        /// The serving epoch.
        parent: u32,
        /// The draining ones.
        draining: Vec<u32>,
    },
    /// Stand by: an Envoy outside the hand-over holds the node's listeners, and a cold start beside
    /// it would fail every bind; start cold once it is gone (`crate::serving::Standby`).
    WaitForForeign,
    /// Stand by: the serving Envoy belongs to another owner (another release's proxy DaemonSet,
    /// or this one's before a namespace move), or its Envoy is gone but its launchers still hold
    /// the node. Taking its sockets over would leave that pod superseded while its DaemonSet still
    /// counts on it; start cold once it is gone and its lease released.
    WaitForOtherOwner {
        /// The recorded epoch (running or not).
        parent: u32,
        /// Its owner.
        owner: String,
    },
    /// No epoch serves, but older ones still drain (their successor died): ask them to stop
    /// first. They serve no listener any more, and a cold start beside them would share their
    /// epoch numbers and hot restart socket names.
    StopDraining {
        /// The draining epochs.
        draining: Vec<u32>,
    },
    /// The serving Envoy cannot hand over to ours: ask it to step down, then start cold.
    Replace {
        /// The serving epoch.
        parent: u32,
        /// Why.
        why: Incompatibility,
    },
}

/// Whether `running` can hand its sockets over to `ours`.
pub fn compatible(running: &Build, ours: &Build) -> Result<(), Incompatibility> {
    let (Some(r), Some(o)) = (&running.hot_restart_version, &ours.hot_restart_version) else {
        return Err(Incompatibility::HotRestartDisabled);
    };
    if r != o {
        return Err(Incompatibility::HotRestartVersion { running: r.clone(), ours: o.clone() });
    }
    if running.base_id != ours.base_id {
        return Err(Incompatibility::BaseId { running: running.base_id, ours: ours.base_id });
    }
    let older = running.version.min(ours.version);
    if older < NETNS_HANDOVER_SINCE {
        return Err(Incompatibility::TooOldForNetns { version: older });
    }
    Ok(())
}

/// The serving Envoy's owner when it is not `ours` (both known and different). A record without
/// an owner (an older release's launcher) or a launcher without one matches any owner.
pub fn other_owner<'a>(live: &'a LiveRecord, ours: Option<&str>) -> Option<&'a str> {
    live.owner.as_deref().zip(ours).filter(|(theirs, ours)| theirs != ours).map(|(theirs, _)| theirs)
}

/// The decision. `ours` is this launcher's binary and `owner` its `--owner`; `seen` what the
/// state dir and the admin address show.
pub fn plan(seen: &Observation, ours: &Build, owner: Option<&str>) -> Plan {
    // Another owner's node: its Envoy serves, or its launchers still run (a crashed Envoy being
    // restarted, with its draining epochs): neither taken over, stopped nor started beside.
    if let Some(live) = &seen.live
        && let Some(theirs) = other_owner(live, owner)
        && (seen.alive.contains(&live.epoch) || seen.other_owner_holds)
    {
        return Plan::WaitForOtherOwner { parent: live.epoch, owner: theirs.to_owned() };
    }
    let serving = seen.live.as_ref().filter(|l| seen.alive.contains(&l.epoch));
    match serving {
        Some(live) => {
            if let Err(why) = compatible(&live.build, ours) {
                return Plan::Replace { parent: live.epoch, why };
            }
            let draining: Vec<u32> = seen.alive.iter().copied().filter(|e| *e != live.epoch).collect();
            if !draining.is_empty() {
                return Plan::WaitForDraining { parent: live.epoch, draining };
            }
            Plan::Successor { parent: live.epoch, epoch: live.epoch + 1 }
        }
        None if !seen.alive.is_empty() => Plan::StopDraining { draining: seen.alive.iter().copied().collect() },
        // Nothing of ours runs: only an Envoy outside the protocol can still hold the listeners.
        None if seen.foreign_admin => Plan::WaitForForeign,
        None => Plan::Cold,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(v: (u32, u32, u32), hr: Option<&str>, base: u32) -> Build {
        Build { version: Version(v.0, v.1, v.2), hot_restart_version: hr.map(str::to_owned), base_id: base }
    }
    fn b140() -> Build {
        build((1, 40, 0), Some("11.104"), 7391)
    }
    fn seen(live: Option<(u32, Build)>, alive: &[u32], foreign: bool) -> Observation {
        Observation {
            live: live.map(|(epoch, build)| LiveRecord { epoch, build, owner: None }),
            alive: alive.iter().copied().collect(),
            foreign_admin: foreign,
            other_owner_holds: false,
        }
    }

    #[test]
    fn a_fresh_node_starts_cold() {
        assert_eq!(plan(&seen(None, &[], false), &b140(), None), Plan::Cold);
    }

    #[test]
    fn a_live_compatible_epoch_is_succeeded() {
        assert_eq!(plan(&seen(Some((4, b140())), &[4], false), &b140(), None), Plan::Successor { parent: 4, epoch: 5 });
    }

    #[test]
    fn a_record_whose_envoy_is_gone_means_cold() {
        // The serving Envoy crashed (or the node rebooted and the record survived): no parent.
        assert_eq!(plan(&seen(Some((4, b140())), &[], false), &b140(), None), Plan::Cold);
        // Only an older, draining epoch is left: it is stopped first.
        assert_eq!(
            plan(&seen(Some((4, b140())), &[3], false), &b140(), None),
            Plan::StopDraining { draining: vec![3] }
        );
    }

    #[test]
    fn a_draining_generation_is_waited_for() {
        assert_eq!(
            plan(&seen(Some((4, b140())), &[3, 4], false), &b140(), None),
            Plan::WaitForDraining { parent: 4, draining: vec![3] }
        );
    }

    #[test]
    fn an_envoy_outside_the_protocol_is_waited_for_not_bound_beside() {
        assert_eq!(plan(&seen(None, &[], true), &b140(), None), Plan::WaitForForeign);
        // Our own draining epoch answering admin is not foreign.
        assert_eq!(plan(&seen(None, &[2], true), &b140(), None), Plan::StopDraining { draining: vec![2] });
    }

    #[test]
    fn incompatible_binaries_are_replaced_cold_with_the_reason() {
        let live = |b: Build| seen(Some((2, b)), &[2], false);
        assert_eq!(
            plan(&live(build((1, 40, 0), Some("11.120"), 7391)), &b140(), None),
            Plan::Replace {
                parent: 2,
                why: Incompatibility::HotRestartVersion { running: "11.120".into(), ours: "11.104".into() }
            }
        );
        assert_eq!(
            plan(&live(build((1, 37, 0), Some("11.104"), 7391)), &b140(), None),
            Plan::Replace { parent: 2, why: Incompatibility::TooOldForNetns { version: Version(1, 37, 0) } }
        );
        assert_eq!(
            plan(&live(b140()), &build((1, 37, 2), Some("11.104"), 7391), None),
            Plan::Replace { parent: 2, why: Incompatibility::TooOldForNetns { version: Version(1, 37, 2) } }
        );
        assert_eq!(
            plan(&live(b140()), &build((1, 40, 0), None, 7391), None),
            Plan::Replace { parent: 2, why: Incompatibility::HotRestartDisabled }
        );
        assert_eq!(
            plan(&live(b140()), &build((1, 40, 0), Some("11.104"), 1), None),
            Plan::Replace { parent: 2, why: Incompatibility::BaseId { running: 7391, ours: 1 } }
        );
    }

    #[test]
    fn versions_parse_and_order() {
        assert_eq!(Version::parse("1.40.0"), Some(Version(1, 40, 0)));
        assert_eq!(Version::parse("1.38.0-dev"), Some(Version(1, 38, 0)));
        assert_eq!(Version::parse("1.x.0"), None);
        assert!(Version(1, 37, 9) < NETNS_HANDOVER_SINCE);
        assert_eq!(Version(1, 40, 0).to_string(), "1.40.0");
    }

    #[test]
    fn the_live_record_round_trips_as_json() {
        let r = LiveRecord { epoch: 3, build: b140(), owner: Some("aether-system/aether-proxy".into()) };
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<LiveRecord>(&s).unwrap(), r);
        // A record of a release up to 0.10.0 has no owner, and one without an owner writes none
        // (that release's launcher reads what this one writes).
        let old = r#"{"epoch":3,"build":{"version":[1,40,0],"hot_restart_version":"11.104","base_id":7391}}"#;
        assert_eq!(serde_json::from_str::<LiveRecord>(old).unwrap(), LiveRecord { owner: None, ..r.clone() });
        assert_eq!(serde_json::to_string(&LiveRecord { owner: None, ..r }).unwrap(), old);
    }

    #[test]
    fn another_owners_envoy_is_stood_beside_never_taken_over() {
        let owned = |o: Option<&str>| Observation {
            live: Some(LiveRecord { epoch: 2, build: b140(), owner: o.map(str::to_owned) }),
            alive: [2].into(),
            foreign_admin: false,
            other_owner_holds: false,
        };
        let ours = Some("aether-system/aether-proxy");
        assert_eq!(
            plan(&owned(Some("team-b/aether-proxy")), &b140(), ours),
            Plan::WaitForOtherOwner { parent: 2, owner: "team-b/aether-proxy".into() }
        );
        // The same owner, an owner-less record (an older launcher's) or an owner-less launcher:
        // the hand-over as before.
        let successor = Plan::Successor { parent: 2, epoch: 3 };
        assert_eq!(plan(&owned(ours), &b140(), ours), successor);
        assert_eq!(plan(&owned(None), &b140(), ours), successor);
        assert_eq!(plan(&owned(Some("team-b/aether-proxy")), &b140(), None), successor);
        // Another owner's record whose Envoy is gone and whose lease is released: start cold.
        let gone = Observation { alive: BTreeSet::new(), ..owned(Some("team-b/aether-proxy")) };
        assert_eq!(plan(&gone, &b140(), ours), Plan::Cold);
        // ... and with only its draining epochs left, those are stopped first.
        let draining = Observation { alive: [1].into(), ..gone.clone() };
        assert_eq!(plan(&draining, &b140(), ours), Plan::StopDraining { draining: vec![1] });
    }

    #[test]
    fn another_owner_still_holding_the_node_is_waited_for_even_between_its_envoys() {
        // Its serving Envoy crashed and its launcher is starting the next one (or its container
        // restarts): no cold start beside it, and its draining epochs are not ours to stop.
        let theirs = |alive: &[u32]| Observation {
            live: Some(LiveRecord { epoch: 2, build: b140(), owner: Some("team-b/aether-proxy".into()) }),
            alive: alive.iter().copied().collect(),
            foreign_admin: false,
            other_owner_holds: true,
        };
        let ours = Some("aether-system/aether-proxy");
        let wait = Plan::WaitForOtherOwner { parent: 2, owner: "team-b/aether-proxy".into() };
        assert_eq!(plan(&theirs(&[]), &b140(), ours), wait);
        assert_eq!(plan(&theirs(&[1]), &b140(), ours), wait);
        // Its own launcher (same owner) restarts its Envoy cold as before.
        assert_eq!(plan(&theirs(&[]), &b140(), Some("team-b/aether-proxy")), Plan::Cold);
    }
}
