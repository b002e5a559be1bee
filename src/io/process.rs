//! What the operating system reports about this process (Linux `/proc/self/status`).

/// Peak resident set size of this process in bytes (`VmHWM`, the RSS high-water mark), or
/// `None` where `/proc` does not report it (not Linux). A measurement, not an estimate: run a
/// workload in its own process to measure its peak.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_status_kib(&status, "VmHWM:").map(|kib| kib * 1024)
}

/// The `kB` value of the line starting with `key` in a `/proc/*/status` text.
fn parse_status_kib(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    let mut parts = line[key.len()..].split_whitespace();
    let value = parts.next()?.parse().ok()?;
    (parts.next() == Some("kB")).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_parse() {
        let text = "Name:\telm\nVmPeak:\t  200 kB\nVmHWM:\t    1234 kB\nVmRSS:\t 99 kB\n";
        assert_eq!(parse_status_kib(text, "VmHWM:"), Some(1234));
        assert_eq!(parse_status_kib(text, "VmSwap:"), None);
        assert_eq!(parse_status_kib("VmHWM:\t12 MB\n", "VmHWM:"), None);
    }

    /// Touching a 256 MiB buffer raises the high-water mark by at least that much.
    #[cfg(target_os = "linux")]
    #[test]
    fn touching_memory_raises_the_high_water_mark() {
        let before = peak_rss_bytes().expect("Linux reports VmHWM");
        let size = 256usize << 20;
        let mut buf = vec![0u8; size];
        for i in (0..size).step_by(4096) {
            buf[i] = 1;
        }
        let touched: usize = buf.iter().step_by(4096).map(|&b| b as usize).sum();
        let after = peak_rss_bytes().unwrap();
        assert_eq!(touched, size / 4096);
        // The buffer is resident while measured, so the peak is at least its size (the
        // earlier peak may already have been higher, hence max).
        assert!(after >= before.max(size as u64), "{before} -> {after}");
        drop(buf);
    }
}
