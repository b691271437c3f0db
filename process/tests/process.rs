//! The `process_*` series of a real process (this test), scraped through a registry as a binary's
//! `/metrics` does and parsed as Prometheus parses it.

use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::registry::Registry;

/// Held by every test of this binary for its whole run: the fd count is per process, and another
/// test's file open during one scrape and closed by the next would shift the count (seen: 19 of
/// 20 files counted).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn scrape() -> prometheus_parse::Scrape {
    let mut registry = Registry::default();
    aether_process::register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("the exposition parses")
}

fn value(scrape: &prometheus_parse::Scrape, name: &str) -> f64 {
    let s = scrape.samples.iter().find(|s| s.metric == name).unwrap_or_else(|| panic!("{name} missing"));
    match s.value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => v,
        ref other => panic!("{name}: {other:?}"),
    }
}

#[test]
fn open_fds_follow_the_files_this_process_opens() {
    let _serial = serial();
    let before = value(&scrape(), "process_open_fds");
    let files: Vec<std::fs::File> = (0..20).map(|_| std::fs::File::open("/proc/self/stat").unwrap()).collect();
    let during = value(&scrape(), "process_open_fds");
    drop(files);
    let after = value(&scrape(), "process_open_fds");
    assert!(during >= before + 20.0, "before {before}, with 20 more open {during}");
    assert!(after <= during - 20.0, "with 20 open {during}, after closing them {after}");
}

#[test]
fn max_fds_is_the_soft_open_files_limit() {
    let _serial = serial();
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    let s = scrape();
    match limit {
        Some(l) => assert_eq!(value(&s, "process_max_fds"), l as f64),
        None => assert!(s.samples.iter().all(|x| x.metric != "process_max_fds"), "unlimited: no series"),
    }
}

#[test]
fn memory_cpu_and_start_time_describe_this_process() {
    let _serial = serial();
    let s = scrape();
    // The kernel's own account of the same process, from another file, read after the scrape:
    // its peak resident size bounds the current one from above. (Comparing with VmRSS read at
    // another moment is flaky: the other tests of this binary allocate in parallel threads.)
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib = |key: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{key} in /proc/self/status"))
    };
    let peak = kib("VmHWM:") * 1024.0;
    let rss = value(&s, "process_resident_memory_bytes");
    // Bytes, not pages or KiB: a test process holds more than 1 MB, and never more than its peak.
    assert!(rss > 1_000_000.0, "a test process holds more than 1 MB resident: {rss}");
    assert!(rss <= peak * 1.01, "resident {rss} B above the peak VmHWM {peak} B");
    assert!(value(&s, "process_virtual_memory_bytes") >= rss);

    let mut burn = 0u64;
    let before = value(&s, "process_cpu_seconds_total");
    while value(&scrape(), "process_cpu_seconds_total") <= before {
        burn = (0..100_000u64).fold(burn, |a, b| a.wrapping_mul(31).wrapping_add(b));
    }
    assert_ne!(burn, 1, "keeps the loop");

    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    let start = value(&s, "process_start_time_seconds");
    let age = now - start;
    // The test binary started moments ago (a clock tick is 10 ms; btime is whole seconds).
    assert!((-2.0..600.0).contains(&age), "start {start}, now {now}");
}
