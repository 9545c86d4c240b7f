//! What every connector reports of its sink calls, through the engine's
//! metric catalogue ([`weir_actors::metrics`]):
//!
//! - rows (or files) written, by target and kind, once their transaction
//!   committed ([`CONNECTOR_ROWS`](weir_actors::metrics::CONNECTOR_ROWS));
//! - how long each statement takes, by target and statement
//!   ([`CONNECTOR_STATEMENT_DURATION`](weir_actors::metrics::CONNECTOR_STATEMENT_DURATION));
//! - failed statements, by target, the error's
//!   [`kind`](weir_actors::Error::kind) and its retry class
//!   ([`CONNECTOR_ERRORS`](weir_actors::metrics::CONNECTOR_ERRORS)): the
//!   classes the engine retries by, not a second classification.
//!
//! A call's retries are the engine's (its sink actor splits and retries
//! failed calls) and are counted there, by sink. Each call runs in a
//! `tracing` span naming the connector, the database and the tables; the
//! engine's span around it names the components of the call.

use std::future::Future;
use std::time::Instant;

use weir_actors::metrics as m;
use weir_actors::{Error, Result, TargetAction};

/// A connector, as its metrics and spans name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Connector {
    Postgres,
    Sqlite,
    LocalFs,
}

impl Connector {
    /// The `connector` label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Connector::Postgres => "postgres",
            Connector::Sqlite => "sqlite",
            Connector::LocalFs => "localfs",
        }
    }

    /// Awaits `statement` on `target`, recording how long it took; a
    /// failure is counted by kind and class.
    pub(crate) async fn timed<T>(
        self,
        target: &str,
        statement: &'static str,
        run: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let started = Instant::now();
        let result = run.await;
        self.ran(target, statement, started, result.as_ref().err());
        result
    }

    /// [`timed`](Self::timed) for a statement that does not wait.
    pub(crate) fn timed_now<T>(
        self,
        target: &str,
        statement: &'static str,
        run: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let started = Instant::now();
        let result = run();
        self.ran(target, statement, started, result.as_ref().err());
        result
    }

    /// Records a statement that ran from `started`, and its error if any.
    fn ran(self, target: &str, statement: &'static str, started: Instant, error: Option<&Error>) {
        metrics::histogram!(
            m::CONNECTOR_STATEMENT_DURATION,
            "connector" => self.as_str(),
            "target" => target.to_string(),
            "statement" => statement
        )
        .record(started.elapsed().as_secs_f64());
        if let Some(e) = error {
            self.failed(target, statement, e);
        }
    }

    /// Counts a failed statement, and logs it.
    fn failed(self, target: &str, statement: &'static str, e: &Error) {
        if e.is_fenced() {
            // Not the connector's failure: counted by the worker group.
            return;
        }
        let class = if e.is_retriable() {
            "transient"
        } else {
            "permanent"
        };
        let kind = e.kind().as_str();
        metrics::counter!(
            m::CONNECTOR_ERRORS,
            "connector" => self.as_str(),
            "target" => target.to_string(),
            "kind" => kind,
            "class" => class
        )
        .increment(1);
        tracing::debug!(
            connector = self.as_str(),
            target,
            statement,
            kind,
            class,
            "statement failed: {e}"
        );
    }

    /// A span for one sink call of this connector on `database`, naming
    /// the targets of its `tally` (written out only when the span is
    /// enabled).
    pub(crate) fn call_span(self, database: &str, tally: &Tally, actions: usize) -> tracing::Span {
        tracing::debug_span!(
            "connector_call",
            connector = self.as_str(),
            database,
            targets = %tally,
            actions
        )
    }
}

/// Actions of one call by target and kind, to count once the call's
/// transaction committed.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// `(target, [created, updated, deleted])`, in first-seen order.
    targets: Vec<(String, [u64; 3])>,
}

impl Tally {
    /// Tallies `actions`, each under the target `target_of` gives.
    pub(crate) fn of<A>(actions: &[TargetAction<A>], target_of: impl Fn(&A) -> &str) -> Self {
        let mut tally = Tally::default();
        for action in actions {
            let (kind, a) = kind_of(action);
            tally.add(target_of(a), kind);
        }
        tally
    }

    /// Tallies `actions`, all of them on `target`.
    pub(crate) fn of_one<A>(target: &str, actions: &[TargetAction<A>]) -> Self {
        let mut counts = [0; 3];
        for action in actions {
            counts[kind_of(action).0] += 1;
        }
        Tally {
            targets: vec![(target.to_string(), counts)],
        }
    }

    fn add(&mut self, target: &str, kind: usize) {
        // Calls write one table or a few: a list beats a map.
        let i = match self.targets.iter().position(|(t, _)| t == target) {
            Some(i) => i,
            None => {
                self.targets.push((target.to_string(), [0; 3]));
                self.targets.len() - 1
            }
        };
        self.targets[i].1[kind] += 1;
    }

    /// Records the tally as written by `connector`.
    pub(crate) fn record(&self, connector: Connector) {
        for (target, counts) in &self.targets {
            for (kind, n) in ["created", "updated", "deleted"].into_iter().zip(counts) {
                if *n > 0 {
                    metrics::counter!(
                        m::CONNECTOR_ROWS,
                        "connector" => connector.as_str(),
                        "target" => target.clone(),
                        "kind" => kind
                    )
                    .increment(*n);
                }
            }
        }
    }
}

/// The targets tallied, in first-seen order, separated by commas.
impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (target, _)) in self.targets.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(target)?;
        }
        Ok(())
    }
}

/// The index of an action's kind in a tally (created, updated, deleted),
/// and its value.
fn kind_of<A>(action: &TargetAction<A>) -> (usize, &A) {
    match action {
        TargetAction::Create(a) => (0, a),
        TargetAction::Update(a) => (1, a),
        TargetAction::Delete(a) => (2, a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tally_counts_each_targets_actions_by_kind_in_first_seen_order() {
        let actions = vec![
            TargetAction::Create("b"),
            TargetAction::Update("a"),
            TargetAction::Create("b"),
            TargetAction::Delete("a"),
            TargetAction::Delete("a"),
        ];
        let tally = Tally::of(&actions, |t| t);
        assert_eq!(tally.to_string(), "b, a");
        assert_eq!(
            tally.targets,
            vec![("b".to_string(), [2, 0, 0]), ("a".to_string(), [0, 1, 2])]
        );
    }
}
