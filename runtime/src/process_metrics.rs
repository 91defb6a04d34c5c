//! Process metrics read from `/proc/self` at scrape time, as Prometheus' client libraries name them.
//! The page size and the clock tick are the kernel's, read from the auxiliary vector
//! (`/proc/self/auxv`) once.

/// Process metrics read from `/proc/self` at scrape time: `process_resident_memory_bytes`,
/// `process_virtual_memory_bytes`, `process_cpu_seconds_total`, `process_open_fds`,
/// `process_threads` and `process_start_time_seconds`.
#[derive(Debug)]
pub struct ProcessCollector {
    start_time_seconds: f64,
    page_size_bytes: f64,
    clock_ticks_per_second: f64,
}

impl Default for ProcessCollector {
    fn default() -> Self {
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let auxv = std::fs::read("/proc/self/auxv").unwrap_or_default();
        let from_auxv = |key| auxv_value(&auxv, key).filter(|v| *v > 0).map(|v| v as f64);
        Self {
            start_time_seconds: start.as_secs_f64(),
            page_size_bytes: from_auxv(AT_PAGESZ).unwrap_or(FALLBACK_PAGE_SIZE_BYTES),
            clock_ticks_per_second: from_auxv(AT_CLKTCK).unwrap_or(FALLBACK_CLOCK_TICKS_PER_SECOND),
        }
    }
}

/// Auxiliary vector keys (see getauxval(3)): the page size and the clock tick of `times(2)` and
/// `/proc/<pid>/stat`.
const AT_PAGESZ: usize = 6;
const AT_CLKTCK: usize = 17;
/// Used only if `/proc/self/auxv` cannot be read: the values of every Linux architecture
/// Kubernetes nodes commonly run (x86_64, arm64 with 4 KiB pages).
const FALLBACK_PAGE_SIZE_BYTES: f64 = 4096.0;
const FALLBACK_CLOCK_TICKS_PER_SECOND: f64 = 100.0;

/// The value of `key` in an auxiliary vector: pairs of native-endian machine words, ended by
/// `AT_NULL` (0).
fn auxv_value(auxv: &[u8], key: usize) -> Option<usize> {
    const WORD: usize = std::mem::size_of::<usize>();
    let word = |bytes: &[u8]| bytes.try_into().ok().map(usize::from_ne_bytes);
    auxv.chunks_exact(2 * WORD)
        .map_while(|pair| {
            let (k, v) = (word(&pair[..WORD])?, word(&pair[WORD..])?);
            (k != 0).then_some((k, v))
        })
        .find_map(|(k, v)| (k == key).then_some(v))
}

impl prometheus_client::collector::Collector for ProcessCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::{
            encoding::EncodeMetric,
            metrics::{counter::ConstCounter, gauge::ConstGauge},
        };
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the parenthesised command name; see proc(5).
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let field = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        let cpu_seconds = (field(11) + field(12)) / self.clock_ticks_per_second;
        let threads = field(17);
        let virtual_bytes = field(20);
        let resident_bytes = field(21) * self.page_size_bytes;
        let open_fds = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0) as f64;

        let counter = ConstCounter::new(cpu_seconds);
        counter.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            counter.metric_type(),
        )?)?;
        for (name, help, value) in [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                virtual_bytes,
            ),
            ("process_open_fds", "Number of open file descriptors.", open_fds),
            ("process_threads", "Number of OS threads.", threads),
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch in seconds.",
                self.start_time_seconds,
            ),
        ] {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vector(pairs: &[(usize, usize)]) -> Vec<u8> {
        pairs
            .iter()
            .flat_map(|(k, v)| [k.to_ne_bytes(), v.to_ne_bytes()])
            .flatten()
            .collect()
    }

    #[test]
    fn reads_a_key_of_the_auxiliary_vector_up_to_its_end() {
        let auxv = vector(&[
            (33, 1),
            (AT_PAGESZ, 16384),
            (AT_CLKTCK, 250),
            (0, 0),
            (AT_PAGESZ, 1),
        ]);
        assert_eq!(auxv_value(&auxv, AT_PAGESZ), Some(16384));
        assert_eq!(auxv_value(&auxv, AT_CLKTCK), Some(250));
        assert_eq!(auxv_value(&auxv, 99), None, "absent");
        assert_eq!(auxv_value(&[], AT_PAGESZ), None, "unreadable");
        let after_end = vector(&[(0, 0), (AT_CLKTCK, 250)]);
        assert_eq!(
            auxv_value(&after_end, AT_CLKTCK),
            None,
            "nothing counts after AT_NULL"
        );
    }

    #[test]
    fn this_process_has_a_page_size_and_a_clock_tick() {
        let auxv = std::fs::read("/proc/self/auxv").expect("Linux exposes the auxiliary vector");
        let page = auxv_value(&auxv, AT_PAGESZ).expect("AT_PAGESZ");
        assert!(page.is_power_of_two() && page >= 4096, "{page}");
        assert!(auxv_value(&auxv, AT_CLKTCK).is_some_and(|t| t > 0));
    }
}
