//! Shared pieces of the benchmarks in `benches/benches/`: a real etcd started by the
//! bench itself (from `test-support`), the async runtime, the quick/full switch and
//! latency summaries.
//!
//! Every bench has a quick default (a handful of samples, so `cargo test -p benches
//! --benches` proves it still runs) and a full mode for the README table, selected by
//! `FENCED_BENCH_FULL=1`.
#![deny(missing_docs)]
#![deny(unsafe_code)]

use std::time::Duration;

/// The workspace's etcd launcher (`test-support`): a single-member etcd on free loopback
/// ports with a temp data dir, killed by PID on drop. The binary is `$FENCED_ETCD` (or
/// `$FENCED_BENCH_ETCD`), else `/usr/bin/etcd`.
pub use test_support::etcd::{Etcd, etcd_binary, free_port};

/// The async runtime of the etcd benches: multi-threaded with two workers (the
/// machine the README's figures come from has two vCPUs), timers and I/O enabled.
///
/// # Panics
/// When the runtime cannot be built (a bench has nothing to measure without it).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// True when `FENCED_BENCH_FULL` is set to anything but `0` or empty: take the README's
/// sample sizes instead of the quick ones.
pub fn full_mode() -> bool {
    std::env::var("FENCED_BENCH_FULL").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// `quick` samples by default, `full` with [`full_mode`]; `FENCED_BENCH_SAMPLES`
/// overrides both.
pub fn samples(quick: usize, full: usize) -> usize {
    if let Some(n) = std::env::var("FENCED_BENCH_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    if full_mode() { full } else { quick }
}

/// Order statistics of a set of durations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Smallest.
    pub min: Duration,
    /// Median.
    pub p50: Duration,
    /// 99th percentile (nearest rank).
    pub p99: Duration,
    /// Largest.
    pub max: Duration,
    /// Arithmetic mean.
    pub mean: Duration,
}

impl Summary {
    /// Summarises `samples`; `None` when empty.
    pub fn of(samples: &[Duration]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_unstable();
        let rank = |p: f64| {
            // Nearest-rank percentile: the smallest sample with at least p of the
            // samples at or below it.
            let r = (p * s.len() as f64).ceil() as usize;
            s[r.clamp(1, s.len()) - 1]
        };
        let total: Duration = s.iter().sum();
        Some(Self {
            n: s.len(),
            min: s[0],
            p50: rank(0.50),
            p99: rank(0.99),
            max: s[s.len() - 1],
            mean: total / u32::try_from(s.len()).unwrap_or(u32::MAX),
        })
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        write!(
            f,
            "n={} min={:.3}ms p50={:.3}ms p99={:.3}ms max={:.3}ms mean={:.3}ms",
            self.n,
            ms(self.min),
            ms(self.p50),
            ms(self.p99),
            ms(self.max),
            ms(self.mean)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_percentiles_are_nearest_rank() {
        let v: Vec<Duration> = (1..=200).map(Duration::from_millis).collect();
        let s = Summary::of(&v).unwrap();
        assert_eq!(s.n, 200);
        assert_eq!(s.min, Duration::from_millis(1));
        assert_eq!(s.p50, Duration::from_millis(100));
        assert_eq!(s.p99, Duration::from_millis(198));
        assert_eq!(s.max, Duration::from_millis(200));
        assert_eq!(s.mean, Duration::from_micros(100_500));
        assert!(Summary::of(&[]).is_none());
        let one = Summary::of(&[Duration::from_millis(7)]).unwrap();
        assert_eq!(
            (one.p50, one.p99),
            (Duration::from_millis(7), Duration::from_millis(7))
        );
    }
}
