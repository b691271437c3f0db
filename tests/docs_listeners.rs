//! `docs/listeners.md` says what the code does: each row of its policy table (the cap, the
//! handshake or first-byte timeout, the idle timeout or keepalive, the HTTP limits that bound a
//! connection's memory) against the production
//! defaults in `aether-serve-policy`, and its figures for Envoy's listeners (the chart's
//! bootstrap: readiness and stats caps, the stats rate limit, the overload manager's cap and heap
//! share; the agent's inbound listener and health gateway defaults) against the constants the
//! bootstrap and the agent's builders use. A default changed in code and not in the page (or
//! the other way round) fails here.

use std::time::Duration;

use aether_agent_reconciler::xds::BuildOptions;
use aether_fixtures::envoy::{
    CHART_OVERLOAD_MAX_CONNECTIONS, CHART_STATS_SCRAPES_PER_MINUTE, READINESS_MAX_CONNECTIONS, STATS_BURST,
    STATS_MAX_CONNECTIONS,
};
use aether_serve_policy::{ListenerKind, Quiet};
use aether_tests::repo_root;

fn page() -> String {
    std::fs::read_to_string(repo_root().join("docs/listeners.md")).expect("docs/listeners.md")
}

/// The rows of the table under "## The policy": cells of each `| ... |` line after the header.
fn policy_rows(page: &str) -> Vec<Vec<String>> {
    let section = page.split("## The policy").nth(1).expect("a \"## The policy\" section");
    section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2) // the header and its separator
        .map(|l| l.trim_matches('|').split(" | ").map(|c| c.trim().to_owned()).collect())
        .collect()
}

/// `5 s`, `120 s`: how the page writes a duration.
fn secs(d: Duration) -> String {
    format!("{} s", d.as_secs())
}

/// `3,600`, `16,384`: how the page writes a count of four digits or more.
fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[test]
fn the_policy_table_states_each_listeners_defaults() {
    let rows = policy_rows(&page());
    for kind in ListenerKind::ALL {
        let policy = kind.default_policy();
        let label = format!("`{}`", kind.label());
        let mine: Vec<_> = rows.iter().filter(|r| r[0] == label).collect();
        assert!(!mine.is_empty(), "no row for {label} in docs/listeners.md");
        for row in mine {
            assert_eq!(row[3], policy.max_connections.to_string(), "{label}: the cap column");
            match policy.max_connections_per_source {
                Some(share) => assert_eq!(row[4], share.to_string(), "{label}: the per-source share column"),
                None => assert!(row[4].starts_with("none"), "{label}: the per-source share column {:?}", row[4]),
            }
            assert!(
                row[5].starts_with(&secs(policy.first_byte_timeout)),
                "{label}: the first-byte column {:?} (want {})",
                row[5],
                secs(policy.first_byte_timeout)
            );
            let after = &row[6];
            match policy.quiet {
                Quiet::IdleTimeout(idle) => {
                    assert!(after.contains(&format!("idle timeout {}", secs(idle))), "{label}: {after:?}")
                }
                Quiet::KeepAlive(k) => assert!(
                    after.contains(&format!("PING every {}", secs(k.interval)))
                        && after.contains(&format!("unanswered for {}", secs(k.timeout))),
                    "{label}: {after:?}"
                ),
            }
        }
    }
}

#[test]
fn the_envoy_listener_figures_are_the_bootstraps_and_the_agents() {
    let page = page();
    let opts = BuildOptions::default();
    let said = [
        (
            "readiness cap",
            format!("`readiness` (`proxy.readinessPort`: `GET /ready`; {READINESS_MAX_CONNECTIONS} connections"),
        ),
        ("stats cap", format!("`GET /stats/prometheus`; {STATS_MAX_CONNECTIONS} connections")),
        (
            "stats rate",
            format!(
                "`proxy.stats.maxScrapesPerMinute` requests a minute for the whole Envoy, {CHART_STATS_SCRAPES_PER_MINUTE} by default, from a\nbucket of {STATS_BURST}"
            ),
        ),
        ("global cap", format!("({} by default;", count(u64::from(CHART_OVERLOAD_MAX_CONNECTIONS)))),
        ("heap share", "a\nheap limit of 85 % of `proxy.resources.limits.memory`".to_owned()),
        ("inbound cap", format!("(`--inbound-max-connections`, {})", count(opts.inbound_max_connections))),
        ("inbound idle", format!("(`--inbound-idle-timeout-seconds`, {})", count(opts.inbound_idle_timeout.as_secs()))),
    ];
    for (what, text) in said {
        assert!(page.contains(&text), "docs/listeners.md does not say the {what}: {text:?}");
    }
    // The heap share the page states is the one the fixture's default derives.
    assert_eq!(aether_fixtures::envoy::CHART_MAX_HEAP_BYTES, 512 * 1024 * 1024 * 85 / 100);
}

/// `16 KiB`, `64 MiB`: how the page writes a size.
fn kib(bytes: u64) -> String {
    format!("{} KiB", bytes / 1024)
}

#[test]
fn the_memory_column_states_the_http_limits_of_the_code() {
    use aether_controller::server::{WEBHOOK_H2_WINDOW_BYTES, WEBHOOK_MAX_STREAMS};
    use aether_controller::webhook::MIN_INFLIGHT_BUDGET_BYTES;
    use aether_serve_policy::http::{
        HTTP1_MAX_BUF_BYTES, HTTP2_MAX_SEND_BUF_BYTES, HTTP2_MAX_STREAMS, HTTP2_WINDOW_BYTES,
    };
    let rows = policy_rows(&page());
    let memory = |label: &str| -> String {
        let row = rows.iter().find(|r| r[0] == label).unwrap_or_else(|| panic!("no row for {label}"));
        row.get(8).cloned().unwrap_or_else(|| panic!("{label}: no memory column"))
    };
    let admin = memory("`admin`");
    for want in [
        format!("HTTP/1: {} of request head", kib(HTTP1_MAX_BUF_BYTES as u64)),
        format!(
            "HTTP/2: {HTTP2_MAX_STREAMS} streams, {} windows, {} queued per stream",
            kib(u64::from(HTTP2_WINDOW_BYTES)),
            kib(HTTP2_MAX_SEND_BUF_BYTES as u64)
        ),
        format!("at most {HTTP2_MAX_STREAMS} responses"),
    ] {
        assert!(admin.contains(&want), "the admin row's memory column {admin:?} does not say {want:?}");
    }
    let webhook = memory("`webhook`");
    for want in [
        format!("{} of unread request data", kib(u64::from(WEBHOOK_H2_WINDOW_BYTES))),
        format!("at most {WEBHOOK_MAX_STREAMS} reviews"),
        format!("the {} MiB parse budget", MIN_INFLIGHT_BUDGET_BYTES / (1024 * 1024)),
    ] {
        assert!(webhook.contains(&want), "the webhook row's memory column {webhook:?} does not say {want:?}");
    }
    use aether_agent_reconciler::xds::{XDS_MAX_REQUEST_BYTES, XDS_MAX_STREAMS, XDS_WINDOW_BYTES};
    let xds = memory("`xds`");
    let want = format!(
        "HTTP/2: {XDS_MAX_STREAMS} streams, {} windows, a request decoded up to {} MiB per stream",
        kib(u64::from(XDS_WINDOW_BYTES)),
        XDS_MAX_REQUEST_BYTES / (1024 * 1024)
    );
    assert!(xds.contains(&want), "the xds row's memory column {xds:?} does not say {want:?}");
    assert!(!memory("`probe`").is_empty(), "`probe`: an empty memory column");
}

#[test]
fn counts_are_written_with_thousands_separators() {
    assert_eq!(count(16), "16");
    assert_eq!(count(3600), "3,600");
    assert_eq!(count(16_384), "16,384");
    assert_eq!(count(20_000), "20,000");
    assert_eq!(count(1_000_000), "1,000,000");
}
