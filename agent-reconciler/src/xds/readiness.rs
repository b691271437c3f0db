//! Is the node's Envoy caught up? The pure decision behind `/readyz` (see [`crate::admin`]).
//!
//! Envoy is caught up when at least one of its ADS streams is open and has ACKed, on that
//! stream, the CDS and the LDS versions the server would send now, and the ECDS version too while
//! the health gateway's checks are served (a NACKed checks config leaves the gateway answering
//! from the previous one). Not connected, behind (a
//! current version not ACKed yet) and rejected (a current version NACKed) are not caught up.
//!
//! [`assess`] takes the open streams from
//! [`AckTracker::streams`](super::acks::AckTracker::streams) and the current versions from the
//! encoder task's `watch` channel; the result prints as the one `envoy: ...` line of the `/readyz`
//! body, without Envoy's NACK messages (they name pods, and `/readyz` answers on every node IP),
//! and with them on the loopback debug port's `/debug/envoy`.

use std::fmt;

use super::acks::StreamState;
use super::resource_set::{CLUSTER_TYPE_URL, EXTENSION_CONFIG_TYPE_URL, LISTENER_TYPE_URL};

/// Longest NACK message shown, in characters (Envoy's messages can list many resources).
const MESSAGE_CHARS: usize = 160;

/// Where one resource type stands on the stream [`assess`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeProgress {
    /// `CDS`, `LDS` or `ECDS`.
    pub label: &'static str,
    /// The version the server would send now.
    pub current: String,
    /// The version the stream last ACKed.
    pub acked: Option<String>,
    /// Envoy's message, when the stream NACKed the current version.
    pub rejected: Option<String>,
    /// Whether that NACK is taken as the failure of a re-offer of withdrawn inbound listeners
    /// (LDS only, within the grace after a re-offer: [`crate::driver::REOFFER_GRACE`]): Envoy
    /// applied the rest of the update, and the agent withdraws the listener again.
    pub reoffer: bool,
}

impl TypeProgress {
    fn of(label: &'static str, type_url: &str, current: &str, stream: &StreamState) -> TypeProgress {
        let acked = stream.acked.get(type_url).cloned();
        let rejected = match stream.nacked.get(type_url) {
            Some(nack) if nack.version == current && acked.as_deref() != Some(current) => Some(nack.message.clone()),
            _ => None,
        };
        TypeProgress { label, current: current.to_owned(), acked, rejected, reoffer: false }
    }

    /// Whether the current version is ACKed, or NACKed by a re-offer of withdrawn listeners.
    pub fn caught_up(&self) -> bool {
        self.acked.as_deref() == Some(self.current.as_str()) || (self.reoffer && self.rejected.is_some())
    }
}

/// Where the `/readyz` line sends a reader for Envoy's NACK message.
pub const NACK_MESSAGE_AT: &str = "Envoy's message: GET /debug/envoy on the debug port";

/// `{}`: type and versions only, for `/readyz` on every node IP (Envoy's NACK message names pods
/// and paths; [`NACK_MESSAGE_AT`] says where it is). `{:#}`: with that message, on one line, for
/// the loopback debug port.
impl fmt::Display for TypeProgress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (label, current) = (self.label, &self.current);
        let acked = self.acked.as_deref().unwrap_or("none");
        if self.acked.as_deref() == Some(current.as_str()) {
            return write!(f, "{label} version {current} acked");
        }
        let Some(message) = &self.rejected else {
            return write!(f, "{label} version {current} not acked yet (acked {acked})");
        };
        let why = if f.alternate() { one_line(message) } else { NACK_MESSAGE_AT.to_owned() };
        if self.reoffer {
            write!(
                f,
                "{label} version {current} NACKed while withdrawn inbound listeners are offered again (acked \
                 {acked}): {why}"
            )
        } else {
            write!(f, "{label} version {current} NACKed (acked {acked}): {why}")
        }
    }
}

/// The open streams, and the most caught-up one's progress (the newest among equals).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connected {
    /// Open streams, all nodes together.
    pub streams: usize,
    /// Node ids of the open streams, sorted, without duplicates.
    pub nodes: Vec<String>,
    /// CDS on the reported stream.
    pub cds: TypeProgress,
    /// LDS on the reported stream.
    pub lds: TypeProgress,
    /// ECDS (the health gateway's checks) on the reported stream, when any is served.
    pub ecds: Option<TypeProgress>,
}

impl Connected {
    fn caught_up(&self) -> bool {
        self.cds.caught_up() && self.lds.caught_up() && self.ecds.as_ref().is_none_or(TypeProgress::caught_up)
    }
}

/// Where the node's Envoy stands; its `Display` is the `/readyz` line (no newline), `{:#}` the
/// same with Envoy's NACK messages (see [`TypeProgress`]'s `Display`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnvoyReadiness {
    /// No ADS stream is open.
    NotConnected,
    /// At least one stream is open.
    Connected(Box<Connected>),
}

impl EnvoyReadiness {
    /// Whether a connected stream has ACKed every current version.
    pub fn caught_up(&self) -> bool {
        match self {
            EnvoyReadiness::NotConnected => false,
            EnvoyReadiness::Connected(c) => c.caught_up(),
        }
    }
}

impl fmt::Display for EnvoyReadiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvoyReadiness::NotConnected => write!(f, "envoy: not connected"),
            EnvoyReadiness::Connected(c) => {
                let Connected { streams, nodes, cds, lds, ecds } = &**c;
                let noun = if nodes.len() == 1 { "node" } else { "nodes" };
                write!(f, "envoy: {streams} stream(s) connected ({noun} {}); ", nodes.join(", "))?;
                // Each part gets this formatter, so `{:#}` reaches them.
                fmt::Display::fmt(cds, f)?;
                f.write_str("; ")?;
                fmt::Display::fmt(lds, f)?;
                if let Some(ecds) = ecds {
                    f.write_str("; ")?;
                    fmt::Display::fmt(ecds, f)?;
                }
                Ok(())
            }
        }
    }
}

/// Where Envoy stands, given the open `streams` (oldest first) and the CDS, LDS and (when the
/// health gateway's checks are served) ECDS versions the server would send now. With
/// `reoffering` (withdrawn inbound listeners were offered again moments ago), an LDS NACK of the
/// current version counts as caught up: it is that offer failing, which the agent undoes.
pub fn assess(
    streams: &[StreamState],
    current_cds: &str,
    current_lds: &str,
    current_ecds: Option<&str>,
    reoffering: bool,
) -> EnvoyReadiness {
    let progress = |s: &StreamState| {
        let mut lds = TypeProgress::of("LDS", LISTENER_TYPE_URL, current_lds, s);
        lds.reoffer = reoffering;
        (
            TypeProgress::of("CDS", CLUSTER_TYPE_URL, current_cds, s),
            lds,
            current_ecds.map(|v| TypeProgress::of("ECDS", EXTENSION_CONFIG_TYPE_URL, v, s)),
        )
    };
    let score = |(c, l, e): &(TypeProgress, TypeProgress, Option<TypeProgress>)| {
        u8::from(c.caught_up()) + u8::from(l.caught_up()) + u8::from(e.as_ref().is_some_and(TypeProgress::caught_up))
    };
    // `max_by_key` keeps the last of equals: the newest stream.
    let Some((cds, lds, ecds)) = streams.iter().map(progress).max_by_key(score) else {
        return EnvoyReadiness::NotConnected;
    };
    let mut nodes: Vec<String> = streams.iter().map(|s| s.node.clone()).collect();
    nodes.sort();
    nodes.dedup();
    EnvoyReadiness::Connected(Box::new(Connected { streams: streams.len(), nodes, cds, lds, ecds }))
}

/// `message` on one line, at most [`MESSAGE_CHARS`] characters (then `...`).
fn one_line(message: &str) -> String {
    let flat: String = message.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= MESSAGE_CHARS {
        return flat;
    }
    let cut: String = flat.chars().take(MESSAGE_CHARS).collect();
    format!("{cut}...")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::acks::Nack;

    #[test]
    fn served_health_checks_must_be_acked_too_and_show_on_the_line() {
        let mut s = stream("n1", Some("c1"), Some("l1"));
        let behind = assess(std::slice::from_ref(&s), "c1", "l1", Some("e1"), false);
        assert!(!behind.caught_up());
        assert!(behind.to_string().ends_with("; ECDS version e1 not acked yet (acked none)"), "{behind}");
        s.acked.insert(EXTENSION_CONFIG_TYPE_URL.to_owned(), "e1".to_owned());
        let r = assess(std::slice::from_ref(&s), "c1", "l1", Some("e1"), false);
        assert!(r.caught_up());
        assert!(r.to_string().ends_with("; LDS version l1 acked; ECDS version e1 acked"), "{r}");
        // No checks served (no gateway): ECDS plays no part.
        assert!(assess(&[stream("n1", Some("c1"), Some("l1"))], "c1", "l1", None, false).caught_up());
    }

    fn stream(node: &str, cds: Option<&str>, lds: Option<&str>) -> StreamState {
        let mut s = StreamState { node: node.to_owned(), ..StreamState::default() };
        for (type_url, v) in [(CLUSTER_TYPE_URL, cds), (LISTENER_TYPE_URL, lds)] {
            if let Some(v) = v {
                s.acked.insert(type_url.to_owned(), v.to_owned());
            }
        }
        s
    }

    #[test]
    fn not_connected() {
        let r = assess(&[], "c1", "l1", None, false);
        assert!(!r.caught_up());
        assert_eq!(r.to_string(), "envoy: not connected");
    }

    #[test]
    fn connected_but_behind() {
        let r = assess(&[stream("n1", Some("c1"), Some("l1"))], "c2", "l1", None, false);
        assert!(!r.caught_up());
        assert_eq!(
            r.to_string(),
            "envoy: 1 stream(s) connected (node n1); CDS version c2 not acked yet (acked c1); LDS version l1 acked"
        );
        let fresh = assess(&[stream("n1", None, None)], "c1", "l1", None, false);
        assert!(!fresh.caught_up());
        assert!(
            fresh
                .to_string()
                .ends_with("CDS version c1 not acked yet (acked none); LDS version l1 not acked yet (acked none)")
        );
    }

    #[test]
    fn caught_up_on_one_stream_of_several() {
        let streams =
            [stream("n1", Some("c1"), Some("l1")), stream("n2", Some("c2"), Some("l2")), stream("n1", None, None)];
        let r = assess(&streams, "c2", "l2", None, false);
        assert!(r.caught_up());
        assert_eq!(
            r.to_string(),
            "envoy: 3 stream(s) connected (nodes n1, n2); CDS version c2 acked; LDS version l2 acked"
        );
    }

    #[test]
    fn acks_of_different_streams_do_not_add_up() {
        let streams = [stream("n1", Some("c2"), Some("l1")), stream("n1", Some("c1"), Some("l2"))];
        assert!(!assess(&streams, "c2", "l2", None, false).caught_up());
    }

    #[test]
    fn a_nacked_current_version_is_not_caught_up_and_says_why() {
        let mut s = stream("n1", Some("c1"), Some("l1"));
        let nack = |version: &str| Nack {
            version: version.to_owned(),
            nonce: "7".to_owned(),
            message: "duplicate cluster a\nand more".to_owned(),
            code: 13,
        };
        s.nacked.insert(CLUSTER_TYPE_URL.to_owned(), nack("c2"));
        let r = assess(std::slice::from_ref(&s), "c2", "l1", None, false);
        assert!(!r.caught_up());
        // /readyz (every node IP): type and versions, and where the message is.
        assert_eq!(
            r.to_string(),
            format!(
                "envoy: 1 stream(s) connected (node n1); CDS version c2 NACKed (acked c1): {NACK_MESSAGE_AT}; LDS version l1 acked"
            )
        );
        // The debug port (loopback): Envoy's message, on one line.
        assert_eq!(
            format!("{r:#}"),
            "envoy: 1 stream(s) connected (node n1); CDS version c2 NACKed (acked c1): duplicate cluster a and more; \
             LDS version l1 acked"
        );
        // A NACK of an older version does not matter once the current one is ACKed.
        s.acked.insert(CLUSTER_TYPE_URL.to_owned(), "c3".to_owned());
        assert!(assess(&[s], "c3", "l1", None, false).caught_up());
    }

    #[test]
    fn an_lds_nack_during_a_re_offer_counts_as_caught_up_and_says_so() {
        let mut s = stream("n1", Some("c1"), Some("l1"));
        let busy = Nack {
            version: "l2".to_owned(),
            nonce: "8".to_owned(),
            message: "Error adding/updating listener(s) inbound_shop_cart-1_8080: cannot bind".to_owned(),
            code: 13,
        };
        s.nacked.insert(LISTENER_TYPE_URL.to_owned(), busy.clone());
        assert!(!assess(std::slice::from_ref(&s), "c1", "l2", None, false).caught_up(), "outside the grace");
        let r = assess(std::slice::from_ref(&s), "c1", "l2", None, true);
        assert!(r.caught_up());
        assert!(
            format!("{r:#}").ends_with(
                "LDS version l2 NACKed while withdrawn inbound listeners are offered again (acked l1): \
                 Error adding/updating listener(s) inbound_shop_cart-1_8080: cannot bind"
            ),
            "{r:#}"
        );
        assert!(!r.to_string().contains("inbound_shop_cart-1"), "no pod's name on /readyz: {r}");
        // Only LDS: a CDS NACK in the grace still fails readiness.
        s.nacked.insert(CLUSTER_TYPE_URL.to_owned(), Nack { version: "c2".to_owned(), ..busy });
        assert!(!assess(std::slice::from_ref(&s), "c2", "l2", None, true).caught_up());
        // Not yet answered is not a NACK: still behind.
        assert!(!assess(&[stream("n1", Some("c1"), Some("l1"))], "c1", "l3", None, true).caught_up());
    }

    #[test]
    fn long_messages_are_cut() {
        let shown = one_line(&"x".repeat(500));
        assert_eq!(shown.len(), MESSAGE_CHARS + 3);
        assert!(shown.ends_with("..."));
    }
}
