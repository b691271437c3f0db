//! The `process_*` metrics of the running process, read from `/proc` at scrape time (Linux).
//!
//! Sources (proc(5)):
//! - `/proc/self/stat`: `utime` + `stime` (fields 14, 15, clock ticks) for
//!   `process_cpu_seconds_total`; `starttime` (field 22, clock ticks after boot) plus `btime`
//!   from `/proc/stat` for `process_start_time_seconds`; `vsize` (field 23, bytes) and `rss`
//!   (field 24, pages) for the memory gauges;
//! - the entries of `/proc/self/fd` for `process_open_fds`;
//! - getrlimit(`RLIMIT_NOFILE`), the soft limit, for `process_max_fds`.
//!
//! [`ProcStat::parse`] and [`boot_time`] are the pure parts; [`Sample::read`] does the I/O;
//! [`ProcessCollector`] encodes a fresh sample on every scrape.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// The fields of `/proc/<pid>/stat` the metrics use, in the file's units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStat {
    /// User-mode CPU time, in clock ticks (field 14).
    pub utime_ticks: u64,
    /// Kernel-mode CPU time, in clock ticks (field 15).
    pub stime_ticks: u64,
    /// When the process started, in clock ticks after boot (field 22).
    pub start_ticks: u64,
    /// Virtual memory size, in bytes (field 23).
    pub vsize_bytes: u64,
    /// Resident set size, in pages (field 24).
    pub rss_pages: u64,
}

/// A `/proc/<pid>/stat` line that is not what proc(5) describes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError(String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/proc/self/stat: {}", self.0)
    }
}

impl std::error::Error for ParseError {}

impl ProcStat {
    /// Parses one `/proc/<pid>/stat` line. The command name (field 2) is in parentheses and may
    /// itself hold spaces and parentheses, so fields are counted after its last `)`.
    ///
    /// # Errors
    /// [`ParseError`] naming the field that is missing or not a number.
    pub fn parse(line: &str) -> Result<ProcStat, ParseError> {
        let (_, rest) = line.rsplit_once(')').ok_or_else(|| ParseError("no ')' after the command name".into()))?;
        // rest holds fields 3 (state) onwards: field n is at index n - 3.
        let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
        let field = |n: usize, name: &str| -> Result<u64, ParseError> {
            let v = fields.get(n - 3).ok_or_else(|| ParseError(format!("field {n} ({name}) is missing")))?;
            v.parse().map_err(|_| ParseError(format!("field {n} ({name}) is {v:?}, not a non-negative integer")))
        };
        Ok(ProcStat {
            utime_ticks: field(14, "utime")?,
            stime_ticks: field(15, "stime")?,
            start_ticks: field(22, "starttime")?,
            vsize_bytes: field(23, "vsize")?,
            rss_pages: field(24, "rss")?,
        })
    }
}

/// The boot time in seconds since the Unix epoch: the `btime` line of `/proc/stat`; `None`
/// without one.
pub fn boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
}

/// One reading of the process's resources, in the metrics' units.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// `process_cpu_seconds_total`: user + system CPU time, seconds.
    pub cpu_seconds: f64,
    /// `process_resident_memory_bytes`.
    pub resident_bytes: u64,
    /// `process_virtual_memory_bytes`.
    pub virtual_bytes: u64,
    /// `process_open_fds`.
    pub open_fds: u64,
    /// `process_max_fds`: the soft `RLIMIT_NOFILE`; `None` when unlimited.
    pub max_fds: Option<u64>,
    /// `process_start_time_seconds`: seconds since the Unix epoch.
    pub start_time_seconds: f64,
}

impl Sample {
    /// The sample of `stat` on a system with `ticks_per_second` clock ticks per second, pages of
    /// `page_bytes` bytes and the boot time `boot_time` (seconds since the epoch), with the
    /// descriptor counts read elsewhere.
    pub fn from_stat(
        stat: &ProcStat,
        ticks_per_second: u64,
        page_bytes: u64,
        boot_time: u64,
        open_fds: u64,
        max_fds: Option<u64>,
    ) -> Sample {
        let hz = ticks_per_second.max(1) as f64;
        Sample {
            cpu_seconds: (stat.utime_ticks + stat.stime_ticks) as f64 / hz,
            resident_bytes: stat.rss_pages * page_bytes,
            virtual_bytes: stat.vsize_bytes,
            open_fds,
            max_fds,
            start_time_seconds: boot_time as f64 + stat.start_ticks as f64 / hz,
        }
    }

    /// Reads this process's sample from `/proc`.
    ///
    /// # Errors
    /// A file of `/proc` could not be read (not Linux, `/proc` not mounted), or
    /// `/proc/self/stat` did not parse ([`ParseError`], as `InvalidData`).
    #[cfg(target_os = "linux")]
    pub fn read() -> std::io::Result<Sample> {
        use std::io::{Error, ErrorKind};
        let stat = ProcStat::parse(&std::fs::read_to_string("/proc/self/stat")?)
            .map_err(|e| Error::new(ErrorKind::InvalidData, e))?;
        let btime = boot_time(&std::fs::read_to_string("/proc/stat")?)
            .ok_or_else(|| Error::new(ErrorKind::InvalidData, "/proc/stat has no btime line"))?;
        // The directory handle read_dir holds is itself one of the entries: counted, as the
        // Prometheus client libraries do.
        let open_fds = std::fs::read_dir("/proc/self/fd")?.count() as u64;
        let max_fds = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        let (ticks, page) = (rustix::param::clock_ticks_per_second(), rustix::param::page_size() as u64);
        Ok(Sample::from_stat(&stat, ticks, page, btime, open_fds, max_fds))
    }

    /// Not Linux: there is no `/proc/self/stat` to read.
    ///
    /// # Errors
    /// Always `Unsupported`.
    #[cfg(not(target_os = "linux"))]
    pub fn read() -> std::io::Result<Sample> {
        Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "process metrics are read from /proc (Linux only)"))
    }
}

/// Encodes a fresh [`Sample`] on every scrape; a sample that cannot be read leaves the
/// `process_*` series out of that scrape (logged nowhere: the scrape itself is the report).
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let Ok(s) = Sample::read() else { return Ok(()) };
        let cpu = ConstCounter::new(s.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent, in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges: [(&str, &str, Option<f64>); 5] = [
            ("process_resident_memory_bytes", "Resident memory size, in bytes", Some(s.resident_bytes as f64)),
            ("process_virtual_memory_bytes", "Virtual memory size, in bytes", Some(s.virtual_bytes as f64)),
            ("process_open_fds", "Number of open file descriptors", Some(s.open_fds as f64)),
            (
                "process_max_fds",
                "Maximum number of open file descriptors (soft RLIMIT_NOFILE)",
                s.max_fds.map(|m| m as f64),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch, in seconds",
                Some(s.start_time_seconds),
            ),
        ];
        for (name, help, value) in gauges {
            let Some(value) = value else { continue };
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A real line (captured on Linux 6.x) whose command name holds a space and a ')'.
    const LINE: &str = "4242 (aether a)gent) S 1 4242 4242 0 -1 4194560 2921 0 0 0 150 25 0 0 20 0 9 0 \
                        123456 1048576000 5120 18446744073709551615 1 1 0 0 0 0 0 4096 17638 0 0 0 17 3 0 0 0 0 0";

    #[test]
    fn the_stat_line_is_read_after_the_last_parenthesis() {
        let s = ProcStat::parse(LINE).unwrap();
        assert_eq!(
            s,
            ProcStat {
                utime_ticks: 150,
                stime_ticks: 25,
                start_ticks: 123_456,
                vsize_bytes: 1_048_576_000,
                rss_pages: 5_120
            }
        );
        let sample = Sample::from_stat(&s, 100, 4096, 1_700_000_000, 7, Some(1024));
        assert_eq!(sample.cpu_seconds, 1.75);
        assert_eq!(sample.resident_bytes, 5_120 * 4096);
        assert_eq!(sample.virtual_bytes, 1_048_576_000);
        assert_eq!(sample.start_time_seconds, 1_700_000_000.0 + 1_234.56);
    }

    #[test]
    fn a_short_or_garbled_line_names_the_field() {
        let e = ProcStat::parse("1 (x) S 1 2 3").unwrap_err();
        assert_eq!(e.to_string(), "/proc/self/stat: field 14 (utime) is missing");
        let garbled = LINE.replace(" 150 25 ", " 150 -25 ");
        let e = ProcStat::parse(&garbled).unwrap_err();
        assert_eq!(e.to_string(), "/proc/self/stat: field 15 (stime) is \"-25\", not a non-negative integer");
        assert!(ProcStat::parse("no parenthesis").is_err());
    }

    #[test]
    fn boot_time_is_the_btime_line() {
        assert_eq!(boot_time("cpu  1 2 3\nintr 5\nbtime 1700000000\nprocesses 9\n"), Some(1_700_000_000));
        assert_eq!(boot_time("cpu  1 2 3\n"), None);
    }
}
