//! Repeated, paired runs of a sync benchmark (weir against raw sqlx).
//!
//! A sync benchmark runs its phases through weir and, right after each,
//! the same work the raw way, so that both see the machine in the same
//! state. The whole sequence runs `WEIR_BENCH_REPEAT` times (default 3)
//! from scratch: raw's own rate varies by up to a factor of two between
//! runs on this machine, so one run's ratio says little. Each run's rates
//! are printed as they come; then each phase gets one line of medians:
//! `RESULT <bench> <phase> weir_rows_per_sec=<n> raw_rows_per_sec=<n>
//! ratio=<r>`, where the ratio is the median of the runs' own ratios (each
//! weir rate against the raw rate measured beside it), not the ratio of
//! the two medians.

#[path = "median.rs"]
mod median;

use median::median;

/// The rates of one phase of one run, in rows per second.
pub struct Rates {
    pub phase: &'static str,
    pub weir: f64,
    pub raw: f64,
}

impl Rates {
    fn ratio(&self) -> f64 {
        self.weir / self.raw
    }
}

/// The app's reconciler shards: `WEIR_BENCH_SHARDS`, else the default
/// (one per core).
pub fn shards(builder: weir::AppBuilder) -> weir::AppBuilder {
    match std::env::var("WEIR_BENCH_SHARDS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(n) => builder.shards(n),
        None => builder,
    }
}

/// How many times the sequence runs: `WEIR_BENCH_REPEAT`, else 3.
pub fn repeats() -> usize {
    std::env::var("WEIR_BENCH_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1)
}

/// Prints run `run`'s rates for one phase.
pub fn print_run(bench: &str, run: usize, rates: &Rates) {
    println!(
        "{bench} run {run} {}: weir {:.0} rows/s, raw {:.0} rows/s, ratio {:.2}",
        rates.phase,
        rates.weir,
        rates.raw,
        rates.ratio()
    );
}

/// Prints one `RESULT` line of medians per phase, in the order of the
/// first run.
pub fn print_medians(bench: &str, runs: &[Vec<Rates>]) {
    let Some(first) = runs.first() else { return };
    for phase in first.iter().map(|r| r.phase) {
        let of_phase = || runs.iter().flatten().filter(move |r| r.phase == phase);
        println!(
            "RESULT {bench} {phase} weir_rows_per_sec={:.0} raw_rows_per_sec={:.0} ratio={:.2}",
            median(of_phase().map(|r| r.weir)),
            median(of_phase().map(|r| r.raw)),
            median(of_phase().map(Rates::ratio)),
        );
    }
}
