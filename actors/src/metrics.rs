//! The catalogue of weir's metrics: every metric is named and described
//! here once, and recorded through the `metrics` facade.
//!
//! weir never installs a recorder by itself: call [`install_prometheus`]
//! (or install any `metrics` recorder) to collect them. Names follow
//! `weir_<subsystem>_<noun>_<unit>[_total]`; labels are bounded (the root
//! provider name, the shard index, an outcome, an action kind, a restore's
//! reason, a connector's table or target directory), never a key, a
//! component path or a member id (each member exports its own: Prometheus
//! tells them apart by `instance`). Metrics are recorded
//! once per batch or per component, never per target state. The
//! `weir_group_*` metrics are recorded only by a member of a worker group
//! (see [`group`](crate::group)).

use std::net::SocketAddr;
use std::sync::Once;

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::error::{Error, Result};

/// Update runs, by `outcome` (`ok`, `failed`).
pub const UPDATE_RUNS: &str = "weir_update_runs_total";
/// How long update runs take.
pub const UPDATE_DURATION: &str = "weir_update_duration_seconds";
/// Components run, by `outcome` (`succeeded`, `failed`, `memoized` for a
/// component skipped because its memo key was unchanged, or `unchanged`
/// for one that succeeded declaring exactly what its last clean commit
/// recorded, with nothing reconciled: see
/// [`TargetHandler::unchanged_needs_nothing`](crate::TargetHandler::unchanged_needs_nothing)).
pub const COMPONENT_RUNS: &str = "weir_component_runs_total";
/// Change batches that woke live mode ([`App::watch`](crate::App::watch)).
pub const LIVE_CHANGES: &str = "weir_live_changes_total";
/// Components running now.
pub const COMPONENTS_INFLIGHT: &str = "weir_component_inflight";
/// Components of the last run that failed in at least
/// `AppBuilder::quarantine_after` runs in a row.
pub const COMPONENTS_QUARANTINED: &str = "weir_component_quarantined";
/// Partitions of a worker group this member holds (the root partition
/// counts as one): 0 before it acquires any, after its membership expired
/// and after it left.
pub const GROUP_PARTITIONS_HELD: &str = "weir_group_partitions_held";
/// Rebalances this member took part in: runs before which its assignment
/// changed (it gave partitions up, or acquired some).
pub const GROUP_REBALANCES: &str = "weir_group_rebalances_total";
/// Partitions this member acquired with a new epoch: free ones (at the
/// start, or given up by a member that left or rebalanced) and those of a
/// member whose membership expired.
pub const GROUP_TAKEOVERS: &str = "weir_group_takeovers_total";
/// Writes of this member refused by the fence because another member took
/// their partition over: a component's actions dropped from a sink call,
/// or an append to a partition's changelog.
pub const GROUP_FENCED_WRITES: &str = "weir_group_fenced_writes_total";
/// Times this member's membership expired before it renewed it (it paused
/// or lost the database for a lease TTL): it dropped every partition and
/// joins again.
pub const GROUP_EXPIRIES: &str = "weir_group_membership_expiries_total";
/// How long restoring a partition's local copy from its changelog took, by
/// `reason`: `takeover` (a partition acquired) or `root_replay` (the root
/// partition, replayed before each run by a member that does not hold it).
pub const GROUP_RESTORE_DURATION: &str = "weir_group_restore_duration_seconds";
/// Changelog rows (snapshot and log) read by restores, by `reason` (as
/// [`GROUP_RESTORE_DURATION`]).
pub const GROUP_RESTORED_ROWS: &str = "weir_group_restored_rows_total";
/// Rows the changelogs (snapshot and log) of the partitions this member
/// holds: as read when it acquired each, plus the rows it appended since.
pub const GROUP_CHANGELOG_ROWS: &str = "weir_group_changelog_rows";
/// The `reason` of a restore of a partition acquired.
pub const RESTORE_TAKEOVER: &str = "takeover";
/// The `reason` of the root partition's replay by a member that does not
/// hold it.
pub const RESTORE_ROOT_REPLAY: &str = "root_replay";
/// Target states declared by components.
pub const DECLARATIONS: &str = "weir_component_declarations_total";
/// Handler `reconcile` calls, by `shard`.
pub const RECONCILE_CALLS: &str = "weir_reconcile_calls_total";
/// How long a shard takes to reconcile one component's batch, by `shard`.
pub const RECONCILE_BATCH_DURATION: &str = "weir_reconcile_batch_duration_seconds";
/// Batches waiting for a shard, by `shard`.
pub const RECONCILE_QUEUE_DEPTH: &str = "weir_reconcile_queue_depth";
/// Actions applied, by `provider` (root provider name) and `kind`.
pub const ACTIONS: &str = "weir_actions_applied_total";
/// Sink calls, by `sink` (root provider name) and `outcome` (`ok`, `failed`).
pub const SINK_CALLS: &str = "weir_sink_calls_total";
/// Actions per sink call, by `sink`.
pub const SINK_BATCH_SIZE: &str = "weir_sink_batch_size_actions";
/// How long sink calls take, by `sink`.
pub const SINK_APPLY_DURATION: &str = "weir_sink_apply_duration_seconds";
/// Failed batches split along component boundaries, by `sink`.
pub const SINK_SPLITS: &str = "weir_sink_splits_total";
/// Calls retried after a backoff, by `sink` (a retry is not a failure).
pub const SINK_RETRIES: &str = "weir_sink_retries_total";
/// Components whose actions failed for good in a sink, by `sink`.
pub const SINK_FAILURES: &str = "weir_sink_failures_total";
/// Ledger group commits (one sled batch and flush each).
pub const LEDGER_COMMITS: &str = "weir_ledger_commits_total";
/// How long a ledger group commit takes, flush included.
pub const LEDGER_COMMIT_DURATION: &str = "weir_ledger_commit_duration_seconds";
/// Bytes written to the ledger.
pub const LEDGER_WRITTEN_BYTES: &str = "weir_ledger_written_bytes_total";
/// Ledger keys written or removed.
pub const LEDGER_RECORDS: &str = "weir_ledger_records_written_total";

/// Changes a source delivered to [`App::consume`](crate::App::consume), by
/// `source` (its name).
pub const SOURCE_RECEIVED: &str = "weir_source_items_received_total";
/// Changes acknowledged after their run committed (or ignored as older
/// than what was applied), by `source`.
pub const SOURCE_ACKNOWLEDGED: &str = "weir_source_items_acknowledged_total";
/// Changes handed back for redelivery (their component failed, or the run
/// stopped first), by `source`.
pub const SOURCE_REDELIVERED: &str = "weir_source_items_redelivered_total";
/// Changes released after their last allowed delivery, by `source`.
pub const SOURCE_DEAD_LETTERED: &str = "weir_source_items_dead_lettered_total";
/// Changes fetched and not yet settled, by `source`.
pub const SOURCE_IN_FLIGHT: &str = "weir_source_items_in_flight";
/// Changes the source holds beyond those settled (its position against the
/// committed one), by `source`; set after each batch when the source knows.
pub const SOURCE_LAG: &str = "weir_source_lag_items";

/// Rows (or files) a connector's sink wrote, once their transaction
/// committed, by `connector` (`postgres`, `sqlite`, `localfs`), `target`
/// (the table, or the directory) and `kind` (`created`, `updated`,
/// `deleted`).
pub const CONNECTOR_ROWS: &str = "weir_connector_rows_written_total";
/// How long a connector's statements take, by `connector`, `target` (the
/// table; the database for a transaction's commit) and `statement`
/// (`upsert`, `delete`, `commit`, `ddl`; `write` for a local directory's
/// files of one call).
pub const CONNECTOR_STATEMENT_DURATION: &str = "weir_connector_statement_duration_seconds";
/// Failed connector statements, by `connector`, `target`, `kind` (the
/// [`ErrorKind`](crate::ErrorKind) of the error, in snake case) and
/// `class` (`transient` when the engine retries it, else `permanent`).
/// The engine's retries of a connector's calls are
/// [`SINK_RETRIES`], by sink.
pub const CONNECTOR_ERRORS: &str = "weir_connector_errors_total";

/// Every metric of the catalogue: name, kind, unit, description.
pub const CATALOGUE: &[(&str, MetricKind, Unit, &str)] = &[
    (
        CONNECTOR_ROWS,
        MetricKind::Counter,
        Unit::Count,
        "Rows or files a connector wrote once committed, by connector, target and kind.",
    ),
    (
        CONNECTOR_STATEMENT_DURATION,
        MetricKind::Histogram,
        Unit::Seconds,
        "How long a connector's statements take, by connector, target and statement.",
    ),
    (
        CONNECTOR_ERRORS,
        MetricKind::Counter,
        Unit::Count,
        "Failed connector statements, by connector, target, error kind and class (transient, permanent).",
    ),
    (
        SOURCE_RECEIVED,
        MetricKind::Counter,
        Unit::Count,
        "Changes a source delivered, by source.",
    ),
    (
        SOURCE_ACKNOWLEDGED,
        MetricKind::Counter,
        Unit::Count,
        "Changes acknowledged after their run committed, by source.",
    ),
    (
        SOURCE_REDELIVERED,
        MetricKind::Counter,
        Unit::Count,
        "Changes handed back for redelivery, by source.",
    ),
    (
        SOURCE_DEAD_LETTERED,
        MetricKind::Counter,
        Unit::Count,
        "Changes released after their last allowed delivery, by source.",
    ),
    (
        SOURCE_IN_FLIGHT,
        MetricKind::Gauge,
        Unit::Count,
        "Changes fetched and not yet settled, by source.",
    ),
    (
        SOURCE_LAG,
        MetricKind::Gauge,
        Unit::Count,
        "Changes the source holds beyond those settled, by source.",
    ),
    (
        UPDATE_RUNS,
        MetricKind::Counter,
        Unit::Count,
        "Update runs, by outcome.",
    ),
    (
        UPDATE_DURATION,
        MetricKind::Histogram,
        Unit::Seconds,
        "How long update runs take.",
    ),
    (
        COMPONENT_RUNS,
        MetricKind::Counter,
        Unit::Count,
        "Components run, by outcome (succeeded, failed, memoized, unchanged).",
    ),
    (
        LIVE_CHANGES,
        MetricKind::Counter,
        Unit::Count,
        "Change batches that woke live mode, after debouncing.",
    ),
    (
        COMPONENTS_INFLIGHT,
        MetricKind::Gauge,
        Unit::Count,
        "Components running now.",
    ),
    (
        COMPONENTS_QUARANTINED,
        MetricKind::Gauge,
        Unit::Count,
        "Components of the last run that have failed quarantine_after runs in a row or more.",
    ),
    (
        GROUP_PARTITIONS_HELD,
        MetricKind::Gauge,
        Unit::Count,
        "Partitions of its worker group this member holds, the root partition included (0 once its membership expired or it left).",
    ),
    (
        GROUP_REBALANCES,
        MetricKind::Counter,
        Unit::Count,
        "Runs before which this member's assignment changed (it gave partitions up or acquired some).",
    ),
    (
        GROUP_TAKEOVERS,
        MetricKind::Counter,
        Unit::Count,
        "Partitions this member acquired with a new epoch (free, or from a member whose membership expired).",
    ),
    (
        GROUP_FENCED_WRITES,
        MetricKind::Counter,
        Unit::Count,
        "Writes of this member refused because another member took their partition over (a component's actions in a sink call, or a changelog append).",
    ),
    (
        GROUP_EXPIRIES,
        MetricKind::Counter,
        Unit::Count,
        "Times this member's membership expired before it renewed it; it then dropped its partitions and joined again.",
    ),
    (
        GROUP_RESTORE_DURATION,
        MetricKind::Histogram,
        Unit::Seconds,
        "How long restoring a partition's local copy from its changelog took, by reason (takeover, root_replay).",
    ),
    (
        GROUP_RESTORED_ROWS,
        MetricKind::Counter,
        Unit::Count,
        "Changelog rows (snapshot and log) read by restores, by reason (takeover, root_replay).",
    ),
    (
        GROUP_CHANGELOG_ROWS,
        MetricKind::Gauge,
        Unit::Count,
        "Rows (snapshot and log) of the changelogs of the partitions this member holds: as read when it acquired each, plus the rows it appended since.",
    ),
    (
        DECLARATIONS,
        MetricKind::Counter,
        Unit::Count,
        "Target states declared by components.",
    ),
    (
        RECONCILE_CALLS,
        MetricKind::Counter,
        Unit::Count,
        "Handler reconcile calls, by shard.",
    ),
    (
        RECONCILE_BATCH_DURATION,
        MetricKind::Histogram,
        Unit::Seconds,
        "Time to reconcile one component's batch on a shard.",
    ),
    (
        RECONCILE_QUEUE_DEPTH,
        MetricKind::Gauge,
        Unit::Count,
        "Batches waiting for a reconciler shard.",
    ),
    (
        ACTIONS,
        MetricKind::Counter,
        Unit::Count,
        "Actions applied, by provider and kind.",
    ),
    (
        SINK_CALLS,
        MetricKind::Counter,
        Unit::Count,
        "Sink calls, by sink and outcome.",
    ),
    (
        SINK_BATCH_SIZE,
        MetricKind::Histogram,
        Unit::Count,
        "Actions per sink call.",
    ),
    (
        SINK_APPLY_DURATION,
        MetricKind::Histogram,
        Unit::Seconds,
        "How long sink calls take.",
    ),
    (
        SINK_SPLITS,
        MetricKind::Counter,
        Unit::Count,
        "Failed batches split along component boundaries.",
    ),
    (
        SINK_RETRIES,
        MetricKind::Counter,
        Unit::Count,
        "Sink calls retried after a backoff.",
    ),
    (
        SINK_FAILURES,
        MetricKind::Counter,
        Unit::Count,
        "Components whose actions failed for good in a sink.",
    ),
    (
        LEDGER_COMMITS,
        MetricKind::Counter,
        Unit::Count,
        "Ledger group commits.",
    ),
    (
        LEDGER_COMMIT_DURATION,
        MetricKind::Histogram,
        Unit::Seconds,
        "How long a ledger group commit takes.",
    ),
    (
        LEDGER_WRITTEN_BYTES,
        MetricKind::Counter,
        Unit::Bytes,
        "Bytes written to the ledger.",
    ),
    (
        LEDGER_RECORDS,
        MetricKind::Counter,
        Unit::Count,
        "Ledger keys written or removed.",
    ),
];

/// The kind of a metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution (exported with explicit buckets).
    Histogram,
}

/// Histogram buckets for durations, in seconds.
pub const DURATION_BUCKETS: &[f64] = &[
    0.000_1, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0, 60.0,
];
/// Histogram buckets for batch sizes, in actions.
pub const SIZE_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
];

/// Registers the descriptions of every metric with the current recorder.
/// Called by [`install_prometheus`] and when an `App` is built.
pub fn describe() {
    for (name, kind, unit, help) in CATALOGUE {
        match kind {
            MetricKind::Counter => describe_counter!(*name, *unit, *help),
            MetricKind::Gauge => describe_gauge!(*name, *unit, *help),
            MetricKind::Histogram => describe_histogram!(*name, *unit, *help),
        }
    }
}

static DESCRIBE: Once = Once::new();

pub(crate) fn describe_once() {
    DESCRIBE.call_once(describe);
}

/// Installs a Prometheus exporter serving `/metrics` on `addr` (use a
/// loopback address unless you mean to expose it), as the global `metrics`
/// recorder. The exporter runs on a thread of its own. Returns a handle
/// that can also render the metrics as text.
///
/// # Errors
/// When the address cannot be bound, or a global recorder is already set.
pub fn install_prometheus(addr: SocketAddr) -> Result<PrometheusHandle> {
    let builder = PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), DURATION_BUCKETS)
        .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_actions".into()), SIZE_BUCKETS))
        .map_err(|e| Error::Usage(format!("cannot configure the Prometheus exporter: {e}")))?;
    // The exporter's runtime lives and dies on a thread of its own: one
    // dropped where the caller stands (an async context, often) would
    // panic, so even a failed start (an address in use) ends there.
    let (sent, started) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("weir-metrics".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = sent.send(Err(Error::from(e)));
                    return;
                }
            };
            let built = {
                let _guard = runtime.enter();
                builder.build()
            };
            let (recorder, exporter) = match built {
                Ok(built) => built,
                Err(e) => {
                    let _ = sent.send(Err(Error::Usage(format!(
                        "cannot start the Prometheus exporter on {addr}: {e}"
                    ))));
                    return;
                }
            };
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                let _ = sent.send(Err(Error::Usage(
                    "a global metrics recorder is already installed".into(),
                )));
                return;
            }
            let _ = sent.send(Ok(handle));
            // The exporter serves until the process ends.
            let _ = runtime.block_on(exporter);
        })?;
    let handle = started
        .recv()
        .map_err(|_| Error::msg("the Prometheus exporter's thread stopped before it started"))??;
    describe();
    Ok(handle)
}

/// The handles a run records through per component, resolved once per run
/// (a registry lookup per component would cost more than the work measured).
pub(crate) struct RunMetrics {
    pub components_ok: metrics::Counter,
    pub components_failed: metrics::Counter,
    pub components_memoized: metrics::Counter,
    /// Components that succeeded with nothing to reconcile (see
    /// `actors::component::unchanged`).
    pub components_unchanged: metrics::Counter,
    pub inflight: metrics::Gauge,
    pub declarations: metrics::Counter,
    /// Per shard: batches sent and not handled yet.
    pub queue_depth: Vec<metrics::Gauge>,
}

impl RunMetrics {
    pub(crate) fn new(shards: usize) -> Self {
        Self {
            components_ok: metrics::counter!(COMPONENT_RUNS, "outcome" => "succeeded"),
            components_failed: metrics::counter!(COMPONENT_RUNS, "outcome" => "failed"),
            components_memoized: metrics::counter!(COMPONENT_RUNS, "outcome" => "memoized"),
            components_unchanged: metrics::counter!(COMPONENT_RUNS, "outcome" => "unchanged"),
            inflight: metrics::gauge!(COMPONENTS_INFLIGHT),
            declarations: metrics::counter!(DECLARATIONS),
            queue_depth: (0..shards)
                .map(|s| metrics::gauge!(RECONCILE_QUEUE_DEPTH, "shard" => s.to_string()))
                .collect(),
        }
    }
}

/// A shard's handles, resolved once per run.
pub(crate) struct ShardMetrics {
    pub run_id: u64,
    pub queue_depth: metrics::Gauge,
    pub calls: metrics::Counter,
    pub duration: metrics::Histogram,
}

impl ShardMetrics {
    pub(crate) fn new(shard: &str, run_id: u64) -> Self {
        Self {
            run_id,
            queue_depth: metrics::gauge!(RECONCILE_QUEUE_DEPTH, "shard" => shard.to_string()),
            calls: metrics::counter!(RECONCILE_CALLS, "shard" => shard.to_string()),
            duration: metrics::histogram!(RECONCILE_BATCH_DURATION, "shard" => shard.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_names_follow_the_naming_rule_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for (name, kind, unit, _) in CATALOGUE {
            assert!(seen.insert(*name), "{name} listed twice");
            assert!(name.starts_with("weir_"), "{name}");
            match kind {
                MetricKind::Counter => assert!(name.ends_with("_total"), "{name}"),
                MetricKind::Histogram if *unit == Unit::Seconds => {
                    assert!(name.ends_with("_seconds"), "{name}")
                }
                _ => assert!(!name.ends_with("_total"), "{name}"),
            }
        }
    }
}
