//! Where a running process spends its CPU, from `perf`: [`record_top`] samples a PID with
//! `perf record` for a while and [`parse_report`] reads the self-time table of `perf report
//! --stdio --no-children --sort dso,sym`. Sections call this when a goal is missed, so the report
//! names the measured cause rather than a guess.
//!
//! Needs `perf` on `PATH` and permission to sample the PID (root, or `perf_event_paranoid` ≤ 1 for
//! the user's own processes); [`perf_available`] says whether to try.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, ensure};

/// One line of the self-time table.
#[derive(Debug, Clone, PartialEq)]
pub struct Symbol {
    /// Share of the samples taken in this symbol itself (not its callees), in percent (0–100).
    pub percent: f64,
    /// The binary or library it is in (`aether-controller`, `libc.so.6`, `[kernel.kallsyms]`).
    pub object: String,
    /// The symbol, demangled; a bare address when the object has no symbols.
    pub symbol: String,
    /// Whether it runs in the kernel (`[k]`) rather than user space (`[.]`).
    pub kernel: bool,
}

impl Symbol {
    /// `12.3 % serde_json::de::... (aether-controller)`, the symbol cut to `width` characters.
    pub fn show(&self, width: usize) -> String {
        let mut symbol: String = self.symbol.chars().take(width).collect();
        if symbol.len() < self.symbol.len() {
            symbol.push('…');
        }
        format!("{:.1} % {symbol} ({})", self.percent, self.object)
    }
}

/// The rows of a `perf report --stdio --no-children` table, in the order given (perf sorts by
/// overhead, largest first). Comment lines (`#`), blank lines and call-chain lines are skipped;
/// a row is `PERCENT% [COMMAND] OBJECT [.]|[k] SYMBOL`, whatever the `--sort` keys before the
/// privilege marker.
pub fn parse_report(text: &str) -> Vec<Symbol> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let (percent, rest) = line.split_once('%')?;
            let percent: f64 = percent.trim().parse().ok()?;
            let (kernel, marker) = [(false, " [.] "), (true, " [k] ")].into_iter().find(|(_, m)| rest.contains(m))?;
            let (before, symbol) = rest.split_once(marker)?;
            let object = before.split_whitespace().last()?.to_owned();
            Some(Symbol { percent, object, symbol: symbol.trim().to_owned(), kernel })
        })
        .collect()
}

/// Whether `perf` runs here at all (`perf --version`).
pub fn perf_available() -> bool {
    Command::new("perf")
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Samples process `pid` (all its threads) at 999 Hz for `duration`, then returns the top `n`
/// symbols by self time. The samples are written to `dir/perf-PID.data`.
///
/// # Errors
/// When perf cannot be run, cannot attach (permissions, the process exited) or its report is
/// empty; the error carries perf's own message.
pub fn record_top(pid: u32, duration: Duration, n: usize, dir: &Path) -> anyhow::Result<Vec<Symbol>> {
    let data = dir.join(format!("perf-{pid}.data"));
    let secs = format!("{:.1}", duration.as_secs_f64());
    let out = Command::new("perf")
        .args(["record", "-F", "999", "-p", &pid.to_string(), "-o"])
        .arg(&data)
        .args(["--", "sleep", &secs])
        .stdin(Stdio::null())
        .output()
        .context("running perf record")?;
    ensure!(out.status.success(), "perf record -p {pid} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    let out = Command::new("perf")
        .args(["report", "--stdio", "--no-children", "--sort", "dso,sym", "-i"])
        .arg(&data)
        .stdin(Stdio::null())
        .output()
        .context("running perf report")?;
    let _ = std::fs::remove_file(&data);
    ensure!(out.status.success(), "perf report failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    let mut top = parse_report(&String::from_utf8_lossy(&out.stdout));
    ensure!(!top.is_empty(), "perf report for PID {pid} has no samples");
    top.truncate(n);
    Ok(top)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from `perf report --stdio --no-children --sort dso,sym` of the release
    /// aether-controller under saturation (trimmed).
    const SAMPLE: &str = "\
# To display the perf.data header info, please use --header/--header-only options.
#
#
# Total Lost Samples: 0
#
# Samples: 7K of event 'cpu-clock:ppp'
# Event count (approx.): 7615000000
#
# Overhead  Shared Object         Symbol
# ........  ....................  ...........................................
#
    11.27%  [kernel.kallsyms]     [k] finish_task_switch.isra.0
     4.02%  libc.so.6             [.] __memmove_avx_unaligned_erms
     3.15%  aether-controller     [.] ring_core_0_17_14__aes_gcm_enc_update_vaes_avx2
     0.05%  aether-controller     [.] <serde_json::de::Deserializer<R> as serde::de::Deserializer>::deserialize_str
     0.01%  [unknown]             [.] 0x00007f3a2b1c0d10


#
# (Tip: For a higher level overview, try: perf report --sort comm,dso)
#
";

    #[test]
    fn rows_are_read_in_order_with_object_and_privilege() {
        let rows = parse_report(SAMPLE);
        assert_eq!(rows.len(), 5, "{rows:?}");
        assert_eq!(
            rows[0],
            Symbol {
                percent: 11.27,
                object: "[kernel.kallsyms]".into(),
                symbol: "finish_task_switch.isra.0".into(),
                kernel: true
            }
        );
        assert_eq!(rows[2].object, "aether-controller");
        assert_eq!(rows[2].symbol, "ring_core_0_17_14__aes_gcm_enc_update_vaes_avx2");
        assert!(!rows[2].kernel);
        assert_eq!(
            rows[3].symbol, "<serde_json::de::Deserializer<R> as serde::de::Deserializer>::deserialize_str",
            "a symbol with spaces is kept whole"
        );
        assert_eq!(rows[4].object, "[unknown]");
        assert!(rows.windows(2).all(|w| w[0].percent >= w[1].percent));
    }

    #[test]
    fn a_row_with_the_command_column_reads_the_same() {
        let rows = parse_report("     2.50%  tokio-runtime-w  libc.so.6  [.] malloc\n");
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].percent, rows[0].object.as_str(), rows[0].symbol.as_str()), (2.5, "libc.so.6", "malloc"));
    }

    #[test]
    fn headers_tips_and_call_chains_are_not_rows() {
        let text = "# Overhead  Shared Object  Symbol\n\n            |\n            ---__libc_start_main\n                      |          \n                       --50.00%--main\n";
        assert!(parse_report(text).is_empty(), "{:?}", parse_report(text));
    }

    #[test]
    fn a_long_symbol_is_cut_for_display() {
        let s = Symbol { percent: 3.125, object: "x".into(), symbol: "abcdefgh".into(), kernel: false };
        assert_eq!(s.show(4), "3.1 % abcd… (x)");
        assert_eq!(s.show(8), "3.1 % abcdefgh (x)");
    }
}
