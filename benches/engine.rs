//! Engine throughput and memory, per workload shape and phase.
//!
//! `cargo bench --bench engine` runs every shape in its own process (so the
//! peak RSS is that shape's own), three times (`WEIR_BENCH_REPEAT`), each
//! through the phases `first`, `nochange`, `change1pct` and `delete10pct`,
//! with a sink that only counts actions. Each run prints a line per phase;
//! then each phase ends with a line of medians
//! `RESULT engine <shape> <phase> secs=<s> states_per_sec=<n> peak_rss_mb=<m>`.
//!
//! `WEIR_BENCH_SHAPES=flat100k,c10kx10` limits the shapes;
//! `WEIR_BENCH_LAST_PHASE=first` stops after a phase (for profiling);
//! `WEIR_BENCH_SHARDS=n` sets the shard count (default: cores);
//! `WEIR_BENCH_INFLIGHT=n` sets `max_inflight_components`;
//! `WEIR_BENCH_ALWAYS_RECONCILE=1` makes the handler one that is asked on
//! every run (by default it says that an unchanged state needs nothing,
//! which its `reconcile` bears out: see
//! `TargetHandler::unchanged_needs_nothing`);
//! `WEIR_BENCH_METRICS=1` records metrics into a Prometheus recorder (to
//! compare with the default, where no recorder is installed);
//! `WEIR_BENCH_METRICS=compare` runs each repeat both ways, back to back in
//! alternating order, and ends each phase with
//! `RESULT engine_metrics <shape> <phase> off_secs=<s> on_secs=<s> median_paired_ratio=<r>`.

// weir allocates across many threads; glibc malloc costs it about a third
// of its CPU time. Binaries built on weir should use mimalloc or jemalloc,
// as this benchmark does (`--features bench-system-allocator` to compare).
#[cfg(not(feature = "bench-system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "shared/median.rs"]
mod median;

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use median::median;
use serde::{Deserialize, Serialize};
use weir::prelude::*;

const SHAPES: &[(&str, usize, usize)] = &[
    ("flat100k", 0, 100_000),
    ("c1000x100", 1_000, 100),
    ("c10kx10", 10_000, 10),
    ("c100kx1", 100_000, 1),
    ("flat300k", 0, 300_000),
];

/// The reference design's figures on this machine (first, no change), in
/// seconds, for the shapes it was measured on.
fn reference(shape: &str) -> Option<(f64, f64)> {
    match shape {
        "flat100k" => Some((0.7, 0.75)),
        "c10kx10" => Some((1.25, 1.07)),
        "c100kx1" => Some((9.8, 13.6)),
        _ => None,
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Put {
    key: i64,
    value: Option<String>,
}

struct Counting {
    sink: TargetActionSink<Put>,
    /// What `unchanged_needs_nothing` answers.
    unchanged_needs_nothing: bool,
}

/// Whether the handler says that an unchanged state needs nothing (unless
/// `WEIR_BENCH_ALWAYS_RECONCILE` is set).
fn unchanged_needs_nothing() -> bool {
    std::env::var_os("WEIR_BENCH_ALWAYS_RECONCILE").is_none()
}

impl TargetHandler<String> for Counting {
    type TrackingRecord = String;
    type Action = Put;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<String>,
        prev: Vec<String>,
        prev_may_be_missing: bool,
    ) -> Result<Option<TargetReconcileOutput<Put, String>>> {
        let k = match key {
            StableKey::Int(i) => i,
            _ => -1,
        };
        let action = match &desired {
            Some(v) if !prev_may_be_missing && !prev.is_empty() && prev.iter().all(|p| p == v) => {
                return Ok(None)
            }
            Some(v) if prev.is_empty() => TargetAction::Create(Put {
                key: k,
                value: Some(v.clone()),
            }),
            Some(v) => TargetAction::Update(Put {
                key: k,
                value: Some(v.clone()),
            }),
            None if prev.is_empty() && !prev_may_be_missing => return Ok(None),
            None => TargetAction::Delete(Put {
                key: k,
                value: None,
            }),
        };
        Ok(Some(TargetReconcileOutput {
            action,
            sink: self.sink.clone(),
            tracking_record: desired,
            child_invalidation: None,
        }))
    }

    fn unchanged_needs_nothing(&self) -> bool {
        self.unchanged_needs_nothing
    }
}

fn value(i: usize, version: u32) -> String {
    format!("value-{i:08}-version-{version}-padding-padding")
}

/// The declared states of a phase: (component, index, version), where
/// `None` means "not declared any more".
fn version_of(phase: &str, i: usize) -> Option<u32> {
    match phase {
        "first" | "nochange" => Some(0),
        "change1pct" => Some(if i.is_multiple_of(100) { 1 } else { 0 }),
        // delete10pct: the change1pct values stay; every tenth state goes.
        _ => {
            if i % 10 == 5 {
                None
            } else {
                Some(if i.is_multiple_of(100) { 1 } else { 0 })
            }
        }
    }
}

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn dir_bytes(path: &std::path::Path) -> u64 {
    let mut total = 0;
    if let Ok(entries) = std::fs::read_dir(path) {
        for e in entries.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => total += dir_bytes(&e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

async fn run_phase(
    app: &App,
    counter: &Arc<AtomicU64>,
    components: usize,
    per: usize,
    phase: &'static str,
) -> Result<u64> {
    let counter = Arc::clone(counter);
    let sink = TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<Put>>| {
        let counter = Arc::clone(&counter);
        async move {
            counter.fetch_add(actions.len() as u64, Ordering::Relaxed);
            Ok(())
        }
    });
    let stats = app
        .run(move |ctx| async move {
            let provider = register_root_target_states_provider(
                &ctx,
                "bench/rows",
                Counting {
                    sink,
                    unchanged_needs_nothing: unchanged_needs_nothing(),
                },
            )?;
            if components == 0 {
                for i in 0..per {
                    if let Some(v) = version_of(phase, i) {
                        declare_target_state(&ctx, provider.target_state(i as i64, value(i, v)))?;
                    }
                }
                return Ok(());
            }
            let mounted: Vec<usize> = (0..components)
                .filter(|c| per > 1 || version_of(phase, *c).is_some())
                .collect();
            ctx.mount_each(
                mounted,
                |c| *c as i64,
                move |ctx, c| {
                    let provider = provider.clone();
                    async move {
                        for j in 0..per {
                            let i = c * per + j;
                            let v = if per > 1 {
                                version_of(phase, i)
                            } else {
                                version_of(phase, c).or(Some(0))
                            };
                            if let Some(v) = v {
                                declare_target_state(
                                    &ctx,
                                    provider.target_state(i as i64, value(i, v)),
                                )?;
                            }
                        }
                        Ok(())
                    }
                },
            )
            .await
        })
        .await?;
    Ok(stats.created + stats.updated + stats.deleted + stats.unchanged)
}

fn run_shape(name: &str, components: usize, per: usize) -> Result<()> {
    if std::env::var("WEIR_BENCH_METRICS").is_ok_and(|v| v == "1") {
        // Record every metric into a Prometheus registry (no HTTP listener),
        // to measure the overhead of metrics against a run without a recorder.
        let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .map_err(|e| Error::msg(format!("cannot install the recorder: {e}")))?;
        weir::metrics::describe();
        std::mem::forget(handle);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let dir = tempfile::tempdir()?;
        let ledger = dir.path().join("ledger");
        let mut builder = App::builder("bench").ledger_path(&ledger);
        if let Some(n) = std::env::var("WEIR_BENCH_SHARDS").ok().and_then(|n| n.parse().ok()) {
            builder = builder.shards(n);
        }
        if let Some(n) = std::env::var("WEIR_BENCH_INFLIGHT").ok().and_then(|n| n.parse().ok()) {
            builder = builder.max_inflight_components(n);
        }
        let app = builder.build().await?;
        let counter = Arc::new(AtomicU64::new(0));
        let total = if components == 0 { per } else { components * per };
        let last = std::env::var("WEIR_BENCH_LAST_PHASE").ok();
        for phase in ["first", "nochange", "change1pct", "delete10pct"] {
            counter.store(0, Ordering::Relaxed);
            reset_peak_rss();
            let started = Instant::now();
            let touched = run_phase(&app, &counter, components, per, phase).await?;
            let secs = started.elapsed().as_secs_f64();
            let rss = peak_rss_mb();
            let bytes = dir_bytes(&ledger);
            let rate = total as f64 / secs;
            let vs = match (reference(name), phase) {
                (Some((first, _)), "first") => format!(" reference_secs={first} speedup={:.1}x", first / secs),
                (Some((_, nochange)), "nochange") => {
                    format!(" reference_secs={nochange} speedup={:.1}x", nochange / secs)
                }
                _ => String::new(),
            };
            println!(
                "{name:>10} {phase:>11}: {secs:7.3} s, {rate:>10.0} states/s, {touched} states reconciled, {} actions applied, ledger {:.1} MB, peak RSS {rss:.0} MB{vs}",
                counter.load(Ordering::Relaxed),
                bytes as f64 / 1e6
            );
            println!("SAMPLE {name} {phase} {secs:.4} {rss:.1}");
            if last.as_deref() == Some(phase) {
                break;
            }
        }
        Ok(())
    })
}

/// One phase's measurements over the repeated runs of a shape.
#[derive(Default)]
struct Samples {
    secs: Vec<f64>,
    rss: Vec<f64>,
}

/// One child run of a shape: `(phase, secs, peak RSS MB)` per phase; other
/// output lines are printed.
fn run_child(
    exe: &std::path::Path,
    name: &str,
    metrics: Option<bool>,
) -> Result<Vec<(String, f64, f64)>> {
    let mut cmd = Command::new(exe);
    cmd.env("WEIR_BENCH_CHILD", name);
    match metrics {
        Some(true) => {
            cmd.env("WEIR_BENCH_METRICS", "1");
        }
        Some(false) => {
            cmd.env_remove("WEIR_BENCH_METRICS");
        }
        None => {}
    }
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(Error::msg(format!(
            "shape {name} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let mut samples = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let mut fields = line.split_whitespace();
        if fields.next() != Some("SAMPLE") {
            println!("{line}");
            continue;
        }
        let (Some(_), Some(phase), Some(secs), Some(rss)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        samples.push((
            phase.to_string(),
            secs.parse().unwrap_or(f64::NAN),
            rss.parse().unwrap_or(f64::NAN),
        ));
    }
    Ok(samples)
}

/// Adds a child's samples to per-phase samples, in phase order.
fn collect(phases: &mut Vec<(String, Samples)>, child: Vec<(String, f64, f64)>) {
    for (phase, secs, rss) in child {
        let idx = match phases.iter().position(|(p, _)| *p == phase) {
            Some(i) => i,
            None => {
                phases.push((phase, Samples::default()));
                phases.len() - 1
            }
        };
        if let Some((_, s)) = phases.get_mut(idx) {
            s.secs.push(secs);
            s.rss.push(rss);
        }
    }
}

fn main() -> Result<()> {
    if let Ok(shape) = std::env::var("WEIR_BENCH_CHILD") {
        let (name, c, p) = SHAPES
            .iter()
            .find(|s| s.0 == shape)
            .copied()
            .ok_or_else(|| Error::msg(format!("unknown shape {shape}")))?;
        return run_shape(name, c, p);
    }
    let only = std::env::var("WEIR_BENCH_SHAPES").ok();
    let repeat: usize = std::env::var("WEIR_BENCH_REPEAT")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3)
        .max(1);
    // `compare`: each repeat runs the shape without a recorder and with
    // one, in alternating order, and reports the overhead of metrics.
    let compare = std::env::var("WEIR_BENCH_METRICS").is_ok_and(|v| v == "compare");
    let exe = std::env::current_exe()?;
    println!("each shape runs {repeat} times in its own process; RESULT lines give the median");
    for (name, c, p) in SHAPES {
        if let Some(only) = &only {
            if !only.split(',').any(|s| s == *name) {
                continue;
            }
        }
        let total = if *c == 0 { *p } else { c * p };
        let mut phases: Vec<(String, Samples)> = Vec::new();
        let mut with_metrics: Vec<(String, Samples)> = Vec::new();
        for round in 0..repeat {
            if !compare {
                collect(&mut phases, run_child(&exe, name, None)?);
                continue;
            }
            let order = if round % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for metrics in order {
                let samples = run_child(&exe, name, Some(metrics))?;
                collect(
                    if metrics {
                        &mut with_metrics
                    } else {
                        &mut phases
                    },
                    samples,
                );
            }
        }
        for (phase, s) in &mut phases {
            let secs = median(s.secs.iter().copied());
            let rss = median(s.rss.iter().copied());
            println!(
                "RESULT engine {name} {phase} secs={secs:.3} states_per_sec={:.0} peak_rss_mb={rss:.0}",
                total as f64 / secs
            );
            if let Some((_, m)) = with_metrics.iter_mut().find(|(p, _)| p == phase) {
                // Paired by round: the two runs of a round ran back to back.
                let ratios = m.secs.iter().zip(&s.secs).map(|(on, off)| on / off);
                let on = median(m.secs.iter().copied());
                println!(
                    "RESULT engine_metrics {name} {phase} off_secs={secs:.3} on_secs={on:.3} median_paired_ratio={:.3}",
                    median(ratios)
                );
            }
        }
    }
    Ok(())
}
