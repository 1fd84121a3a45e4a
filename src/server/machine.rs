//! Machine info for the Node's capacity and system info and cAdvisor's
//! `machine_*` families, read once from /proc and /sys, in the shape of
//! cAdvisor's MachineInfo.

#[derive(Debug, Clone, Default)]
pub struct MachineInfo {
    pub num_cores: usize,
    pub cpu_frequency_khz: u64,
    pub memory_capacity: u64,
    pub machine_id: String,
    pub system_uuid: String,
    pub boot_id: String,
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Total memory from /proc/meminfo, in bytes.
pub fn memory_capacity() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

impl MachineInfo {
    pub fn read() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let mhz = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("cpu MHz").and_then(|r| r.split(':').nth(1)))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        let khz = read_trim("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
            .parse()
            .unwrap_or((mhz * 1000.0) as u64);
        MachineInfo {
            num_cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            cpu_frequency_khz: khz,
            memory_capacity: memory_capacity(),
            machine_id: read_trim("/etc/machine-id"),
            system_uuid: read_trim("/sys/class/dmi/id/product_uuid"),
            boot_id: read_trim("/proc/sys/kernel/random/boot_id"),
        }
    }
}
