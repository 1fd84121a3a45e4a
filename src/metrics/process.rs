//! client_golang's process collector, read from `/proc/self` at scrape
//! time (registered raw upstream, so no stability prefix in the help).
//! Blocking reads: the `/metrics` handler renders on a blocking thread.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

#[derive(Debug)]
pub(super) struct ProcessCollector;

#[derive(Debug, Default, PartialEq)]
pub(super) struct Stat {
    pub cpu_seconds: f64,
    pub start_time: f64,
    pub virtual_bytes: f64,
    pub resident_bytes: f64,
}

/// Parses `/proc/self/stat` (fields after the command name, which may hold
/// spaces) with the clock tick, page size and boot time.
pub(super) fn parse_stat(stat: &str, ticks: f64, page: f64, btime: f64) -> Option<Stat> {
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Field n of proc(5) is f[n - 3].
    let num = |n: usize| f.get(n - 3)?.parse::<f64>().ok();
    Some(Stat {
        cpu_seconds: (num(14)? + num(15)?) / ticks,
        start_time: btime + num(22)? / ticks,
        virtual_bytes: num(23)?,
        resident_bytes: num(24)? * page,
    })
}

/// The process start time in Unix seconds (blocking on first use: call
/// `init_start_time` at start so no handler pays for it).
pub(super) fn start_time() -> Option<f64> {
    static START: std::sync::OnceLock<Option<f64>> = std::sync::OnceLock::new();
    *START.get_or_init(|| read().map(|(s, _, _)| s.start_time))
}

/// Reads the start time now (blocking; at startup).
pub fn init_start_time() {
    let _ = start_time();
}

fn read() -> Option<(Stat, f64, Option<f64>)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let btime = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok())?;
    // SAFETY: sysconf only reads system configuration.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK) as f64,
            libc::sysconf(libc::_SC_PAGESIZE) as f64,
        )
    };
    let s = parse_stat(&stat, ticks, page, btime)?;
    let fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
    let max = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines()
                .find(|l| l.starts_with("Max open files"))?
                .split_whitespace()
                .nth(3)?
                .parse::<f64>()
                .ok()
        });
    Some((s, fds, max))
}

impl Collector for ProcessCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some((s, fds, max)) = read() else {
            return Ok(());
        };
        let gauge = |enc: &mut DescriptorEncoder, name: &str, help: &str, v: f64| {
            ConstGauge::new(v).encode(enc.encode_descriptor(name, help, None, MetricType::Gauge)?)
        };
        ConstCounter::new(s.cpu_seconds).encode(enc.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            MetricType::Counter,
        )?)?;
        if let Some(max) = max {
            gauge(
                &mut enc,
                "process_max_fds",
                "Maximum number of open file descriptors.",
                max,
            )?;
        }
        gauge(
            &mut enc,
            "process_open_fds",
            "Number of open file descriptors.",
            fds,
        )?;
        gauge(
            &mut enc,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            s.resident_bytes,
        )?;
        gauge(
            &mut enc,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            s.start_time,
        )?;
        gauge(
            &mut enc,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            s.virtual_bytes,
        )?;
        Ok(())
    }
}
