//! Process plumbing both binaries share: structured logs and the shutdown signal.

use tracing_subscriber::{EnvFilter, fmt};

/// Installs JSON logs on stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_json_logs() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    fmt()
        .json()
        .with_env_filter(filter)
        .with_current_span(false)
        .with_writer(std::io::stderr)
        .init();
}

/// Installs ring as the one rustls crypto provider of the process. Must run first in `main`,
/// before any TLS client or server is built.
pub fn install_crypto_provider() {
    // An Err only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Resolves when the process receives SIGTERM or SIGINT, and names the signal.
pub async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        // Without signal handlers the process can only be killed; never return early.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

/// Process metrics read from `/proc/self` at scrape time: `process_resident_memory_bytes`,
/// `process_virtual_memory_bytes`, `process_cpu_seconds_total`, `process_open_fds`,
/// `process_threads` and `process_start_time_seconds`.
#[derive(Debug)]
pub struct ProcessCollector {
    start_time_seconds: f64,
}

impl Default for ProcessCollector {
    fn default() -> Self {
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Self {
            start_time_seconds: start.as_secs_f64(),
        }
    }
}

/// Kernel clock ticks per second; 100 on every Linux architecture Kubernetes runs on.
const CLOCK_TICKS_PER_SECOND: f64 = 100.0;
const PAGE_SIZE_BYTES: f64 = 4096.0;

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
        let cpu_seconds = (field(11) + field(12)) / CLOCK_TICKS_PER_SECOND;
        let threads = field(17);
        let virtual_bytes = field(20);
        let resident_bytes = field(21) * PAGE_SIZE_BYTES;
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
