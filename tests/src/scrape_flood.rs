//! A scrape flood against the node Envoy's `stats` listener (the chart's bootstrap, docs/listeners.md):
//! `clients` HTTP/1.1 keep-alive connections, each sending `GET /stats/prometheus` again as soon as
//! the last answer arrived, while the caller probes Envoy's admin at a fixed pace on its own
//! thread. The e2e flood test asserts the rate limit's counters against the tally; `make bench`
//! times the probes.

use std::time::{Duration, Instant};

/// What the flooding clients got back, by outcome.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// 200: a scrape the admin answered.
    pub served: u64,
    /// 429: refused by the listener's rate limit (`local_ratelimit`).
    pub rate_limited: u64,
    /// 503: refused by the `envoy_admin` cluster's circuit breakers (a scrape already running and
    /// one waiting).
    pub overflowed: u64,
    /// Any other status, or a request that failed (connection refused or reset, a timeout).
    pub other: u64,
    /// The first few of [`Tally::other`], as text.
    pub other_examples: Vec<String>,
}

impl Tally {
    /// Every request sent.
    pub fn total(&self) -> u64 {
        self.served + self.rate_limited + self.overflowed + self.other
    }

    fn add(&mut self, other: Tally) {
        self.served += other.served;
        self.rate_limited += other.rate_limited;
        self.overflowed += other.overflowed;
        self.other += other.other;
        for e in other.other_examples {
            if self.other_examples.len() < 5 {
                self.other_examples.push(e);
            }
        }
    }

    fn count(&mut self, outcome: Result<u16, String>) {
        match outcome {
            Ok(200) => self.served += 1,
            Ok(429) => self.rate_limited += 1,
            Ok(503) => self.overflowed += 1,
            Ok(code) => self.note_other(format!("status {code}")),
            Err(e) => self.note_other(e),
        }
    }

    fn note_other(&mut self, what: String) {
        self.other += 1;
        if self.other_examples.len() < 5 {
            self.other_examples.push(what);
        }
    }
}

/// Floods `http://<host>:<port>/stats/prometheus` from `clients` keep-alive HTTP/1.1 connections
/// (one request at a time on each, the next as soon as the last answer's body is read) for
/// `length`, calling `probe` every `probe_every` on the calling thread meanwhile. Each request
/// may take up to 60 s (the listener answers within 30 s). Returns the clients' tally and the
/// probes' results in order.
///
/// # Errors
/// When a client cannot be built; a failed request is counted in [`Tally::other`], not an error.
pub fn flood<T>(
    host: &str,
    port: u16,
    clients: usize,
    length: Duration,
    probe_every: Duration,
    mut probe: impl FnMut() -> T,
) -> anyhow::Result<(Tally, Vec<T>)> {
    let url = format!("http://{host}:{port}/stats/prometheus");
    let deadline = Instant::now() + length;
    // reqwest builds its TLS config even for plain HTTP: it needs a process-wide provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut http = Vec::new();
    for _ in 0..clients {
        // One client each: its own pool, so its own connection, kept alive between requests.
        http.push(
            reqwest::blocking::Client::builder()
                .http1_only()
                .pool_max_idle_per_host(1)
                .timeout(Duration::from_secs(60))
                .build()?,
        );
    }
    std::thread::scope(|scope| {
        let workers: Vec<_> = http
            .into_iter()
            .map(|client| {
                let url = url.clone();
                scope.spawn(move || {
                    let mut tally = Tally::default();
                    while Instant::now() < deadline {
                        let outcome = client.get(&url).send().and_then(|r| {
                            let code = r.status().as_u16();
                            r.bytes().map(|_| code)
                        });
                        tally.count(outcome.map_err(|e| error_chain(&e)));
                    }
                    tally
                })
            })
            .collect();
        let mut probes = Vec::new();
        while Instant::now() < deadline {
            let next = Instant::now() + probe_every;
            probes.push(probe());
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        let mut tally = Tally::default();
        for w in workers {
            tally.add(w.join().map_err(|_| anyhow::anyhow!("a flooding client panicked"))?);
        }
        Ok((tally, probes))
    })
}

/// An error and its sources, `: `-separated (reqwest's own text names only the URL).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tally_counts_by_outcome_and_keeps_five_examples() {
        let mut t = Tally::default();
        for outcome in [Ok(200), Ok(429), Ok(429), Ok(503), Ok(404)] {
            t.count(outcome);
        }
        for i in 0..6 {
            t.count(Err(format!("reset {i}")));
        }
        assert_eq!((t.served, t.rate_limited, t.overflowed, t.other, t.total()), (1, 2, 1, 7, 11));
        assert_eq!(t.other_examples.len(), 5);
        assert_eq!(t.other_examples[0], "status 404");
    }
}
