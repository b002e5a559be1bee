//! What the operating system reports about this process (Linux `/proc/self/status`).

/// Peak resident set size of this process in bytes (`VmHWM`, the RSS high-water mark), or
/// `None` where `/proc` does not report it (not Linux). A measurement, not an estimate: run a
/// workload in its own process to measure its peak.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_status_kib(&status, "VmHWM:").map(|kib| kib * 1024)
}

/// The resident-set counters of `/proc/self/status` at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResidentSet {
    /// `VmRSS`: pages resident now.
    pub rss_bytes: u64,
    /// `RssAnon`: the heap, stacks and other anonymous pages among them.
    pub anon_bytes: u64,
    /// `RssFile`: pages of mapped files (the binary, libraries, a mapped model file).
    pub file_bytes: u64,
    /// `VmHWM`: the highest `VmRSS` since the start or the last [`reset_peak_rss`].
    pub peak_bytes: u64,
    /// `AnonHugePages` of `/proc/self/smaps_rollup`: anonymous pages held as transparent
    /// huge pages (the streamed weights, [`crate::heap::back_with_huge_pages`]); 0 where
    /// the kernel does not say.
    #[serde(default)]
    pub anon_huge_bytes: u64,
}

/// The counters now, or `None` where `/proc` does not report them (not Linux).
pub fn resident_set() -> Option<ResidentSet> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = |key: &str| parse_status_kib(&status, key).map(|v| v * 1024);
    Some(ResidentSet {
        rss_bytes: kib("VmRSS:")?,
        anon_bytes: kib("RssAnon:")?,
        file_bytes: kib("RssFile:")?,
        peak_bytes: kib("VmHWM:")?,
        anon_huge_bytes: std::fs::read_to_string("/proc/self/smaps_rollup")
            .ok()
            .and_then(|r| parse_status_kib(&r, "AnonHugePages:"))
            .map_or(0, |kib| kib * 1024),
    })
}

/// Resident set size of this process now, in bytes (`VmRSS`).
pub fn rss_bytes() -> Option<u64> {
    resident_set().map(|r| r.rss_bytes)
}

/// Starts a new high-water mark at the current RSS (`/proc/self/clear_refs` = 5), so that
/// [`peak_rss_bytes`] measures what follows; `false` where the kernel refuses.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// What a generating process holds against what it peaked at, measured (issue 42): the
/// kernel's counters for the process and [`crate::heap::CountingAlloc`]'s for the heap. A
/// deployment's promise is `peak_rss ≈ held`: loading never keeps the model file and the loaded
/// weights resident together, nor reads the layers an ELM drops.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ResidentReport {
    /// RSS before anything was loaded: the binary, its shared libraries, thread stacks.
    pub startup_rss_bytes: u64,
    /// The weights held for inference (the model's own count of its tensors' bytes).
    pub weight_bytes: u64,
    /// What the load left live on the heap besides the weights: the tokenizer's tables, the
    /// config, buffers the model keeps.
    pub other_loaded_bytes: u64,
    /// The decoding state allocated for the run (KV cache; for an ELM also its fixed-point
    /// cache).
    pub kv_cache_bytes: u64,
    /// startup + weights + other loaded + KV: what the process has to hold.
    pub held_bytes: u64,
    /// The process's RSS high-water mark (`VmHWM`), load and generation included.
    pub peak_rss_bytes: u64,
    /// `peak_rss_bytes / held_bytes`.
    pub peak_over_held: f64,
    /// The heap's high-water mark (all live allocations at once), where counted.
    pub heap_peak_bytes: Option<u64>,
    /// RSS at the end, split into anonymous pages (heap, stacks) and mapped files.
    pub end: ResidentSet,
}

/// The counters [`ResidentReport`] needs from before a model is loaded.
#[derive(Clone, Copy, Debug)]
pub struct BeforeLoad {
    rss_bytes: u64,
    heap_live_bytes: Option<u64>,
}

impl BeforeLoad {
    /// Reads the counters now; `None` where `/proc` does not report them (not Linux).
    pub fn now() -> Option<Self> {
        Some(BeforeLoad {
            rss_bytes: rss_bytes()?,
            heap_live_bytes: crate::heap::counters().map(|c| c.live_bytes as u64),
        })
    }

    /// The report at the end of a run that loaded `weight_bytes` of weights, with the heap
    /// as the load left it in `heap_live_after_load` (`None` where the heap is not counted:
    /// then nothing besides the weights is attributed to the load) and `kv_cache_bytes` of
    /// decoding state.
    pub fn report(
        &self,
        weight_bytes: u64,
        heap_live_after_load: Option<u64>,
        kv_cache_bytes: u64,
    ) -> Option<ResidentReport> {
        let end = resident_set()?;
        let loaded = match (heap_live_after_load, self.heap_live_bytes) {
            (Some(after), Some(before)) => after.saturating_sub(before),
            _ => weight_bytes,
        };
        let other_loaded_bytes = loaded.saturating_sub(weight_bytes);
        let held_bytes = self.rss_bytes + weight_bytes + other_loaded_bytes + kv_cache_bytes;
        Some(ResidentReport {
            startup_rss_bytes: self.rss_bytes,
            weight_bytes,
            other_loaded_bytes,
            kv_cache_bytes,
            held_bytes,
            peak_rss_bytes: end.peak_bytes,
            peak_over_held: end.peak_bytes as f64 / held_bytes.max(1) as f64,
            heap_peak_bytes: crate::heap::counters().map(|c| c.peak_bytes as u64),
            end,
        })
    }
}

/// One configuration's memory, measured in a process of its own (`elm generate`), against
/// what it must hold: weights + decoding state + the runtime. The runtime is measured too, as
/// the same command on a probe model with the same tokenizer and one layer
/// (`formats::write_runtime_probe`), less that probe's own weights and state: the binary,
/// libraries, threads, the tokenizer's tables and the allocator's overhead on them.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProcessMemory {
    pub report: ResidentReport,
    /// Runtime bytes, from the probe.
    pub runtime_bytes: u64,
    /// `weights + decoding state + runtime`.
    pub bound_bytes: u64,
    /// `peak RSS / bound`: 1.0 means the process held nothing it did not need (issue 42's
    /// target is ≤ 1.10).
    pub peak_over_bound: f64,
}

impl ProcessMemory {
    /// `run` against the runtime measured by `probe` (see the type's comment).
    pub fn new(run: ResidentReport, probe: &ResidentReport) -> Self {
        let runtime_bytes = probe
            .peak_rss_bytes
            .saturating_sub(probe.weight_bytes + probe.kv_cache_bytes);
        let bound_bytes = run.weight_bytes + run.kv_cache_bytes + runtime_bytes;
        ProcessMemory {
            peak_over_bound: run.peak_rss_bytes as f64 / bound_bytes.max(1) as f64,
            report: run,
            runtime_bytes,
            bound_bytes,
        }
    }
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
