//! Pure helpers of `aether-bench`: percentiles, spreads, ratios, oha's and criterion's JSON
//! output, Markdown tables. Unit-tested here; the bench itself is not part of `make test`.

use anyhow::Context;
use serde_json::Value;

/// The `p`-th percentile (0..=100) of `values`, nearest-rank on the sorted values (the smallest
/// value with at least `p`% of the values at or below it). `None` for no values.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Median and range of repeated measurements of one figure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// The median (mean of the two middle values for an even count).
    pub median: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
    /// How many values.
    pub n: usize,
}

impl Spread {
    /// The spread of `values`; `None` for no values.
    pub fn of(values: &[f64]) -> Option<Spread> {
        if values.is_empty() {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 { sorted[n / 2] } else { (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0 };
        Some(Spread { median, min: sorted[0], max: sorted[n - 1], n })
    }

    /// `median [min–max]` with `fmt` applied to each.
    pub fn show(&self, fmt: impl Fn(f64) -> String) -> String {
        if self.n == 1 {
            return fmt(self.median);
        }
        format!("{} [{}–{}]", fmt(self.median), fmt(self.min), fmt(self.max))
    }
}

/// `a / b`, `None` when `b` is zero or either is not finite.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    (b != 0.0 && a.is_finite() && b.is_finite()).then(|| a / b)
}

/// `1.23×`, or `n/a`.
pub fn show_ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}×"))
}

/// A duration given in seconds, in the unit that suits it (ns, µs, ms, s).
pub fn show_secs(s: f64) -> String {
    let ns = s * 1e9;
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{s:.2} s")
    }
}

/// A rate with a thousands separator (`12,345`).
pub fn show_count(v: f64) -> String {
    let n = v.round() as i64;
    let digits = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// oha's error for a request cut off by the end of a `-z` run: not a failure of the server.
pub const DEADLINE: &str = "aborted due to deadline";

/// The figures of one oha run (`--output-format json`); times in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct OhaRun {
    /// Completed requests per second over the run.
    pub rps: f64,
    /// Median latency.
    pub p50: f64,
    /// 99th-percentile latency.
    pub p99: f64,
    /// Share of requests that got a response (any status).
    pub success_rate: f64,
    /// Responses by status code.
    pub statuses: Vec<(String, u64)>,
    /// Errors (connection, timeout) by message.
    pub errors: Vec<(String, u64)>,
}

impl OhaRun {
    /// Responses with a status other than `code`, plus errors other than the requests still in
    /// flight when the run's duration ended (oha's "aborted due to deadline").
    pub fn failures(&self, code: &str) -> u64 {
        let bad: u64 = self.statuses.iter().filter(|(c, _)| c != code).map(|(_, n)| n).sum();
        bad + self.errors.iter().filter(|(e, _)| e != DEADLINE).map(|(_, n)| n).sum::<u64>()
    }
}

/// Parses oha's JSON output.
///
/// # Errors
/// When it is not JSON or lacks the summary or latency percentiles.
pub fn parse_oha(text: &str) -> anyhow::Result<OhaRun> {
    let v: Value = serde_json::from_str(text).context("oha output is not JSON")?;
    let num = |ptr: &str| v.pointer(ptr).and_then(Value::as_f64).with_context(|| format!("oha output has no {ptr}"));
    let counts = |key: &str| -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> =
            v[key].as_object().into_iter().flatten().map(|(k, n)| (k.clone(), n.as_u64().unwrap_or(0))).collect();
        out.sort();
        out
    };
    Ok(OhaRun {
        rps: num("/summary/requestsPerSec")?,
        p50: num("/latencyPercentiles/p50")?,
        p99: num("/latencyPercentiles/p99")?,
        success_rate: num("/summary/successRate")?,
        statuses: counts("statusCodeDistribution"),
        errors: counts("errorDistribution"),
    })
}

/// A criterion benchmark's time per iteration, in seconds: the median of its samples' means
/// (from `sample.json`: `times[i] / iters[i]`, nanoseconds) and their range.
///
/// # Errors
/// When the file is not criterion's `sample.json`.
pub fn criterion_samples(sample_json: &str) -> anyhow::Result<Spread> {
    let v: Value = serde_json::from_str(sample_json).context("sample.json is not JSON")?;
    let list = |k: &str| -> anyhow::Result<Vec<f64>> {
        v[k].as_array()
            .with_context(|| format!("sample.json has no {k}"))?
            .iter()
            .map(|x| x.as_f64().context("a number"))
            .collect()
    };
    let (iters, times) = (list("iters")?, list("times")?);
    anyhow::ensure!(iters.len() == times.len() && !iters.is_empty(), "sample.json: iters and times differ");
    let per_iter: Vec<f64> = iters.iter().zip(&times).map(|(i, t)| t / i / 1e9).collect();
    Spread::of(&per_iter).context("no samples")
}

/// A Markdown table.
pub fn md_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!("| {} |\n", headers.join(" | "));
    out.push_str(&format!("|{}\n", "---|".repeat(headers.len())));
    for r in rows {
        out.push_str(&format!("| {} |\n", r.join(" | ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 50.0), Some(2.0), "unsorted input");
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        // 50 values: p99 is the largest (rank ceil(49.5) = 50).
        let fifty: Vec<f64> = (1..=50).map(f64::from).collect();
        assert_eq!(percentile(&fifty, 99.0), Some(50.0));
    }

    #[test]
    fn spread_has_median_and_range() {
        assert_eq!(Spread::of(&[3.0, 1.0, 2.0]), Some(Spread { median: 2.0, min: 1.0, max: 3.0, n: 3 }));
        assert_eq!(Spread::of(&[4.0, 1.0]).map(|s| s.median), Some(2.5));
        assert_eq!(Spread::of(&[]), None);
        let s = Spread::of(&[1.0, 2.0, 3.0]).unwrap();
        assert_eq!(s.show(|v| format!("{v}")), "2 [1–3]");
        assert_eq!(Spread::of(&[5.0]).unwrap().show(|v| format!("{v}")), "5");
    }

    #[test]
    fn ratios_refuse_zero_and_show_two_decimals() {
        assert_eq!(ratio(3.0, 2.0), Some(1.5));
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(f64::NAN, 1.0), None);
        assert_eq!(show_ratio(Some(1.234)), "1.23×");
        assert_eq!(show_ratio(None), "n/a");
    }

    #[test]
    fn durations_and_counts_read_well() {
        assert_eq!(show_secs(0.000_000_5), "500 ns");
        assert_eq!(show_secs(0.000_123_4), "123.4 µs");
        assert_eq!(show_secs(0.012_345), "12.35 ms");
        assert_eq!(show_secs(2.5), "2.50 s");
        assert_eq!(show_count(1234567.4), "1,234,567");
        assert_eq!(show_count(999.0), "999");
        assert_eq!(show_count(-1000.0), "-1,000");
    }

    #[test]
    fn oha_json_is_parsed() {
        let text = r#"{
          "summary": {"successRate": 1.0, "total": 4.0, "slowest": 0.01, "fastest": 0.0001,
                      "average": 0.0004, "requestsPerSec": 1999.5, "totalData": 100, "sizePerRequest": 50, "sizePerSec": 1.0},
          "latencyPercentiles": {"p10": 0.0002, "p50": 0.0003, "p99": 0.0021, "p99.9": 0.004},
          "statusCodeDistribution": {"200": 7990, "500": 8},
          "errorDistribution": {"connection closed": 2, "aborted due to deadline": 5}
        }"#;
        let run = parse_oha(text).unwrap();
        assert_eq!(run.rps, 1999.5);
        assert_eq!(run.p50, 0.0003);
        assert_eq!(run.p99, 0.0021);
        assert_eq!(run.statuses, vec![("200".to_owned(), 7990), ("500".to_owned(), 8)]);
        assert_eq!(run.failures("200"), 10);
        assert!(parse_oha("{}").is_err());
        assert!(parse_oha("not json").is_err());
    }

    #[test]
    fn criterion_samples_are_per_iteration_seconds() {
        let text = r#"{"sampling_mode":"Linear","iters":[10.0,20.0,30.0],"times":[1000.0,4000.0,3000.0]}"#;
        let s = criterion_samples(text).unwrap();
        assert_eq!((s.min, s.median, s.max, s.n), (100e-9, 100e-9, 200e-9, 3));
        assert!(criterion_samples(r#"{"iters":[1.0],"times":[]}"#).is_err());
    }

    #[test]
    fn markdown_tables_have_a_separator_row() {
        let t = md_table(&["a", "b"], &[vec!["1".into(), "2".into()]]);
        assert_eq!(t, "| a | b |\n|---|---|\n| 1 | 2 |\n");
    }
}
