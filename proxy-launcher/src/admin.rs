//! Envoy's admin `GET /server_info`: which epoch answers on the node's admin address, and in which
//! state. Every Envoy on the node binds the same admin address (`SO_REUSEPORT` in the bootstrap),
//! and an Envoy starting a hot restart closes its parent's admin, so the answer comes from the
//! newest Envoy.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

/// The fields of `/server_info` the launcher reads.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ServerInfo {
    /// `PRE_INITIALIZING`, `INITIALIZING`, `LIVE` or `DRAINING`.
    pub state: String,
    /// The answering Envoy's command line.
    pub command_line_options: CommandLine,
}

/// `command_line_options` of `/server_info`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CommandLine {
    /// `--restart-epoch`.
    #[serde(default)]
    pub restart_epoch: u32,
}

impl ServerInfo {
    /// Whether this answer says: epoch `epoch` is serving.
    pub fn live_at(&self, epoch: u32) -> bool {
        self.state == "LIVE" && self.command_line_options.restart_epoch == epoch
    }
}

/// The admin client: 1 s to connect and answer, one connection per request.
#[derive(Debug, Clone)]
pub struct Admin {
    url: String,
    agent: ureq::Agent,
}

impl Admin {
    /// A client for the admin at `addr`.
    pub fn new(addr: SocketAddr) -> Admin {
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(1)))
            .http_status_as_error(true)
            // A new connection per request: an Envoy whose admin closed for a hot restart child
            // keeps answering on connections it had already accepted.
            .max_idle_connections(0)
            .build();
        Admin { url: format!("http://{addr}/server_info"), agent: ureq::Agent::new_with_config(config) }
    }

    /// `/server_info`; `None` when nothing answers or the answer is not server info.
    pub fn server_info(&self) -> Option<ServerInfo> {
        let mut resp = self.agent.get(&self.url).call().ok()?;
        let body = resp.body_mut().with_config().limit(1 << 20).read_to_string().ok()?;
        serde_json::from_str(&body).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_info_reads_state_and_epoch() {
        let s: ServerInfo = serde_json::from_str(
            r#"{"version":"x","state":"LIVE","hot_restart_version":"11.104",
                "command_line_options":{"base_id":"7391","restart_epoch":2,"concurrency":2}}"#,
        )
        .unwrap();
        assert!(s.live_at(2));
        assert!(!s.live_at(1));
        let init: ServerInfo = serde_json::from_str(r#"{"state":"INITIALIZING","command_line_options":{}}"#).unwrap();
        assert!(!init.live_at(0));
    }

    #[test]
    fn nothing_listening_is_none() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        assert_eq!(Admin::new(addr).server_info(), None);
    }
}
