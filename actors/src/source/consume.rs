//! [`App::consume`]: a source's batches, each as one run, settled after
//! it commits.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::app::App;
use crate::ctx::Ctx;
use crate::error::{ComponentFailure, Error, Result};
use crate::live::RunReport;
use crate::metrics as m;
use crate::model::StableKey;
use crate::run::UpdateStats;
use crate::scope::RunScope;
use crate::sync::lock;

use super::mount::{Mounted, Prepared, SourceBatch};
use super::{Assignment, Batch, Change, Outcome, Settled, Source};

/// The default of [`ConsumeOptions::max_in_flight`]: the default of
/// [`AppBuilder::max_inflight_components`](crate::AppBuilder::max_inflight_components),
/// so that a batch's components all run at once.
pub const DEFAULT_MAX_IN_FLIGHT: usize = crate::config::DEFAULT_MAX_INFLIGHT_COMPONENTS;
/// The default of [`ConsumeOptions::max_deliveries`].
pub const DEFAULT_MAX_DELIVERIES: u32 = 5;

/// How [`App::consume`] paces a source.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ConsumeOptions {
    /// The most changes in one batch. With [`read_ahead`](Self::read_ahead)
    /// the next batch is fetched while one runs, so up to twice as many
    /// are unacknowledged at once; without it, this many.
    ///
    /// A batch also holds no more changes than the app runs components at
    /// once ([`AppBuilder::max_inflight_components`](crate::AppBuilder::max_inflight_components)):
    /// a larger one would run in waves, each after the one before has
    /// applied and committed, while its changes wait unacknowledged. To
    /// read larger batches, raise both.
    pub max_in_flight: usize,
    /// Whether the next batch of changes is fetched while a batch runs,
    /// and a batch's changes are settled while the next one runs (default:
    /// yes), so that the source's round trips overlap the runs' work
    /// instead of following it.
    pub read_ahead: bool,
    /// Deliveries of a change whose component fails before it is released
    /// ([`Outcome::DeadLetter`]).
    pub max_deliveries: u32,
    /// The delay before the first redelivery of a failed change; doubled at
    /// each delivery, up to `max_backoff`.
    pub initial_backoff: Duration,
    /// The longest delay before a redelivery.
    pub max_backoff: Duration,
    /// How often a batch still running is reported in progress
    /// ([`Source::keep_alive`]).
    pub keep_alive: Duration,
}

impl Default for ConsumeOptions {
    fn default() -> Self {
        Self {
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            read_ahead: true,
            max_deliveries: DEFAULT_MAX_DELIVERIES,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(60),
            keep_alive: Duration::from_secs(5),
        }
    }
}

impl ConsumeOptions {
    /// Sets [`max_in_flight`](Self::max_in_flight) (at least 1).
    #[must_use]
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// Sets [`read_ahead`](Self::read_ahead).
    #[must_use]
    pub fn read_ahead(mut self, on: bool) -> Self {
        self.read_ahead = on;
        self
    }

    /// Sets [`max_deliveries`](Self::max_deliveries) (at least 1).
    #[must_use]
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = n.max(1);
        self
    }

    /// Sets the backoff of redeliveries.
    #[must_use]
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max.max(initial);
        self
    }

    /// Sets [`keep_alive`](Self::keep_alive).
    #[must_use]
    pub fn keep_alive(mut self, every: Duration) -> Self {
        self.keep_alive = every.max(Duration::from_millis(10));
        self
    }

    /// The delay before delivery `deliveries + 1` of a failed change.
    fn backoff_after(&self, deliveries: u32) -> Duration {
        crate::config::doubled(
            self.initial_backoff,
            self.max_backoff,
            deliveries.saturating_sub(1),
        )
    }
}

/// What [`App::consume`] did, over all its batches.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct ConsumeReport {
    /// Batches run.
    pub batches: u64,
    /// Changes received.
    pub received: u64,
    /// Items of the listings run.
    pub listed: u64,
    /// Changes acknowledged: applied, or older than what was applied.
    pub acknowledged: u64,
    /// Changes handed back for redelivery after their component failed.
    pub retried: u64,
    /// Changes released after their last allowed delivery.
    pub dead_lettered: u64,
    /// Changes left to the member of a worker group holding their
    /// partition.
    pub not_held: u64,
    /// Changes handed back because the run stopped first.
    pub interrupted: u64,
    /// What the runs did, summed.
    pub stats: UpdateStats,
    /// The components that failed in the last batch that had failures.
    pub failures: Vec<ComponentFailure>,
}

impl ConsumeReport {
    fn add_stats(&mut self, s: &UpdateStats) {
        let t = &mut self.stats;
        t.created += s.created;
        t.updated += s.updated;
        t.deleted += s.deleted;
        t.unchanged += s.unchanged;
        t.failed_components += s.failed_components;
        t.elapsed += s.elapsed;
        t.quarantined = s.quarantined;
        t.components += s.components;
        t.memoized += s.memoized;
    }

    fn count(&mut self, outcome: &Outcome) {
        let n = match outcome {
            Outcome::Ack => &mut self.acknowledged,
            Outcome::Retry { .. } => &mut self.retried,
            Outcome::DeadLetter { .. } => &mut self.dead_lettered,
            Outcome::NotHeld => &mut self.not_held,
            Outcome::Interrupted => &mut self.interrupted,
        };
        *n += 1;
    }
}

/// The latest change of a key in a batch, with the older ones it
/// supersedes (settled as it is).
struct Latest<A> {
    ordinal: u64,
    deliveries: u32,
    acks: Vec<A>,
}

impl App {
    /// Consumes `source` until it ends (or a shutdown is requested, see
    /// [`App::shutdown_handle`]): each batch is one run of `f`, which
    /// declares what the run needs (tables) and mounts the batch with
    /// [`Ctx::mount_source`]; the batch's changes are then settled with the
    /// source. See the [`source`](crate::source) module for the
    /// guarantees.
    ///
    /// A listing is run as a whole update (keys not listed are deleted); a
    /// batch of changes as a run scoped to its keys.
    ///
    /// # Errors
    /// When the source cannot be read or settled, or a run fails as a whole
    /// (a ledger error); the changes not settled are then redelivered by
    /// the source. Failed components are not errors: their changes are
    /// retried, then released, and counted in the report.
    pub async fn consume<S, F, Fut>(
        &self,
        source: &mut S,
        options: ConsumeOptions,
        f: F,
    ) -> Result<ConsumeReport>
    where
        S: Source,
        F: Fn(Ctx, SourceBatch<S::Payload>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        self.consume_reporting(source, options, f, |_| {}).await
    }

    /// [`App::consume`], calling `on_batch` with the report so far after
    /// each batch.
    ///
    /// # Errors
    /// As [`App::consume`].
    pub async fn consume_reporting<S, F, Fut, E>(
        &self,
        source: &mut S,
        options: ConsumeOptions,
        f: F,
        mut on_batch: E,
    ) -> Result<ConsumeReport>
    where
        S: Source,
        F: Fn(Ctx, SourceBatch<S::Payload>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
        E: FnMut(&ConsumeReport) + Send,
    {
        let f = Arc::new(f);
        let name = source.name().to_string();
        let keep_alive = keep_alive_ticks(options.keep_alive);
        let mut consumer = Consumer {
            app: self,
            assigned: None,
            options,
            report: ConsumeReport::default(),
            attempts: HashMap::new(),
            metrics: SourceMetrics::new(&name),
            keep_alive,
        };
        let mut pipe = Pipeline::default();
        let read = consumer
            .read_batches(source, &f, &mut pipe, &mut on_batch)
            .await;
        let settled = settle_committed(source, &mut pipe).await;
        let handed_back = consumer.hand_back(source, pipe.ahead.take()).await;
        source.release().await;
        consumer.metrics.in_flight(0);
        read.and(settled).and(handed_back)?;
        Ok(consumer.report)
    }
}

impl App {
    /// In a worker group, the partitions this member holds now (as its
    /// last run acquired them); `None` outside a group.
    pub fn assignment(&self) -> Option<Assignment> {
        let holding = self.engine.member.as_ref()?.holding();
        // Ascending: the holding's partitions are ordered.
        Some(Assignment {
            partitions: holding.partitions,
            held: holding.data(),
        })
    }
}

/// The state of one [`App::consume`] call.
struct Consumer<'a> {
    app: &'a App,
    /// In a worker group: the partitions the source was last told of.
    assigned: Option<Assignment>,
    options: ConsumeOptions,
    report: ConsumeReport,
    /// Deliveries counted here, for sources that do not count them.
    attempts: HashMap<(StableKey, u64), u32>,
    metrics: SourceMetrics,
    /// When the changes in flight are next kept alive.
    keep_alive: tokio::time::Interval,
}

/// How long a member of a worker group holding no partition waits before
/// it tries to acquire some again.
const ASSIGNMENT_RETRY: Duration = Duration::from_millis(500);

impl Consumer<'_> {
    /// Runs the source's batches until it ends or a shutdown is requested;
    /// a batch read ahead but not run, and the outcomes of the last batch
    /// run, are left in `pipe`.
    async fn read_batches<S, F, Fut, E>(
        &mut self,
        source: &mut S,
        f: &Arc<F>,
        pipe: &mut Pipeline<S>,
        on_batch: &mut E,
    ) -> Result<()>
    where
        S: Source,
        F: Fn(Ctx, SourceBatch<S::Payload>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
        E: FnMut(&ConsumeReport) + Send,
    {
        let shutdown = self.app.shutdown_handle();
        loop {
            if shutdown.is_requested() {
                return Ok(());
            }
            if !self.assign(source).await? {
                settle_committed(source, pipe).await?;
                self.hand_back(source, pipe.ahead.take()).await?;
                // A member holding no partition yet: wait, then try again.
                tokio::select! {
                    () = tokio::time::sleep(ASSIGNMENT_RETRY) => continue,
                    () = shutdown.requested() => return Ok(()),
                }
            }
            let next = match pipe.ahead.take() {
                Some(fetched) => Some(fetched?),
                None => {
                    // A bounded read may wait for these acknowledgements.
                    settle_committed(source, pipe).await?;
                    tokio::select! {
                        next = source.next_batch(self.batch_limit()) => next?,
                        () = shutdown.requested() => return Ok(()),
                    }
                }
            };
            let Some(batch) = next else { return Ok(()) };
            match batch {
                Batch::Listing(listing) => {
                    settle_committed(source, pipe).await?;
                    self.report.listed += listing.items.len() as u64;
                    let f = Arc::clone(f);
                    let report = self
                        .app
                        .run_report(move |ctx| f(ctx, SourceBatch::from(listing)))
                        .await?;
                    self.note_run(&report);
                }
                Batch::Changes(changes) => self.changes(source, changes, f, pipe).await?,
            }
            self.report.batches += 1;
            if let Some(lag) = source.lag().await {
                self.metrics.lag(lag);
            }
            on_batch(&self.report);
        }
    }

    /// In a worker group, tells the source the partitions held when they
    /// changed; a member holding none runs an empty run to acquire its
    /// share first. Returns whether the member holds any (always `true`
    /// outside a group).
    async fn assign<S: Source>(&mut self, source: &mut S) -> Result<bool> {
        let Some(mut assignment) = self.app.assignment() else {
            return Ok(true);
        };
        if assignment.held.is_empty() {
            let nothing = RunScope::keys(Vec::<StableKey>::new());
            self.app
                .scoped(nothing)
                .run_report(|_ctx| async { Ok(()) })
                .await?;
            assignment = self.app.assignment().unwrap_or_default();
        }
        if self.assigned.as_ref() != Some(&assignment) {
            source.assign(&assignment).await?;
            self.assigned = Some(assignment);
        }
        Ok(self.assigned.as_ref().is_some_and(|a| !a.held.is_empty()))
    }

    /// Runs a batch of changes, meanwhile settling the last batch's and
    /// reading the next one (into `pipe`), then settles its own, or with
    /// [`ConsumeOptions::read_ahead`] leaves them in `pipe` to be settled
    /// while the next batch runs.
    async fn changes<S, F, Fut>(
        &mut self,
        source: &mut S,
        changes: Vec<Change<S::Payload, S::Ack>>,
        f: &Arc<F>,
        pipe: &mut Pipeline<S>,
    ) -> Result<()>
    where
        S: Source,
        F: Fn(Ctx, SourceBatch<S::Payload>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        self.note_received(changes.len());
        let (prepared, mut latest) = self.coalesce(changes);
        let keys: Vec<StableKey> = prepared.iter().map(|p| p.key.clone()).collect();
        let seen = Arc::new(Mutex::new(Mounted::default()));
        let batch = SourceBatch::changes(prepared, Arc::clone(&seen));
        let f = Arc::clone(f);
        self.metrics.in_flight(acks_in(&latest) + pipe.waiting());
        let scoped = self.app.scoped(RunScope::keys(keys));
        let run = scoped.run_report(move |ctx| f(ctx, batch));
        let (result, settled_last) = self.while_running(source, &latest, pipe, run).await;
        let settled = self.outcomes(result, &seen, &mut latest)?;
        if self.options.read_ahead {
            pipe.committed = settled;
        } else {
            source.settle(settled).await?;
        }
        self.metrics.in_flight(pipe.waiting());
        settled_last
    }

    /// Awaits `run`, meanwhile settling the last batch's changes (in
    /// `pipe`; how that went is returned with the run's result), then
    /// reading the next batch into `pipe` (with
    /// [`ConsumeOptions::read_ahead`], if none is read yet) and telling
    /// the source every [`ConsumeOptions::keep_alive`] that the changes of
    /// both are still in progress. The ticks run on across batches, so a
    /// batch read ahead is told of as often while it waits as once it
    /// runs.
    async fn while_running<S: Source, T>(
        &mut self,
        source: &mut S,
        latest: &HashMap<StableKey, Latest<S::Ack>>,
        pipe: &mut Pipeline<S>,
        run: impl Future<Output = T>,
    ) -> (T, Result<()>) {
        tokio::pin!(run);
        let committed = std::mem::take(&mut pipe.committed);
        let (ran, settled_last) = settle_while(source, committed, run.as_mut()).await;
        if let Some(done) = ran {
            return (done, settled_last);
        }
        let ahead = &mut pipe.ahead;
        let running = acks_in(latest);
        let start = Instant::now();
        // A read ahead that finds the source done is not the end: the
        // running batch's changes may yet be handed back for redelivery.
        // The loop reads again once they are settled.
        let mut ended = false;
        let limit = self.batch_limit();
        loop {
            let reading = self.options.read_ahead && ahead.is_none() && !ended;
            // A read cut short by a tick is cancel-safe (see
            // `Source::next_batch`): the next one goes on with it.
            tokio::select! {
                done = &mut run => return (done, settled_last),
                _ = self.keep_alive.tick() => {
                    let acks = in_progress::<S>(latest, ahead);
                    keep_alive(source, &acks, start).await;
                }
                fetched = source.next_batch(limit), if reading => {
                    *ahead = fetched.transpose();
                    ended = ahead.is_none();
                    self.metrics.in_flight(running + changes_in::<S>(ahead));
                }
            }
        }
    }

    /// The most changes to read in one batch: the options' limit, within
    /// the components the app runs at once (see
    /// [`ConsumeOptions::max_in_flight`]).
    fn batch_limit(&self) -> usize {
        self.options
            .max_in_flight
            .min(self.app.engine.config.max_inflight)
            .max(1)
    }

    /// Hands the changes of a batch read ahead but not run back to the
    /// source, for redelivery ([`Outcome::Interrupted`]).
    async fn hand_back<S: Source>(&mut self, source: &mut S, ahead: Ahead<S>) -> Result<()> {
        let changes = match ahead {
            Some(Ok(Batch::Changes(changes))) => changes,
            Some(Err(e)) => {
                tracing::warn!(
                    source = source.name(),
                    "reading the next batch ahead failed, and it was not needed: {e}"
                );
                return Ok(());
            }
            _ => return Ok(()),
        };
        if changes.is_empty() {
            return Ok(());
        }
        self.note_received(changes.len());
        let settled: Vec<Settled<S::Ack>> = changes
            .into_iter()
            .map(|change| {
                self.note_settled(&Outcome::Interrupted);
                Settled {
                    ack: change.ack,
                    outcome: Outcome::Interrupted,
                }
            })
            .collect();
        self.metrics.in_flight(0);
        source.settle(settled).await
    }

    /// One change per key (the latest), the older ones kept to be settled
    /// with it.
    fn coalesce<P, A>(
        &mut self,
        changes: Vec<Change<P, A>>,
    ) -> (Vec<Prepared<P>>, HashMap<StableKey, Latest<A>>) {
        let mut latest: HashMap<StableKey, (Prepared<P>, Latest<A>)> =
            HashMap::with_capacity(changes.len());
        for change in changes {
            let deliveries = self.deliveries(&change.key, change.ordinal, change.deliveries);
            let prepared = Prepared {
                key: change.key.clone(),
                ordinal: change.ordinal,
                op: change.op,
            };
            match latest.get_mut(&change.key) {
                Some((kept, l)) => {
                    l.acks.push(change.ack);
                    if change.ordinal >= l.ordinal {
                        l.ordinal = change.ordinal;
                        l.deliveries = deliveries;
                        *kept = prepared;
                    }
                }
                None => {
                    let l = Latest {
                        ordinal: change.ordinal,
                        deliveries,
                        acks: vec![change.ack],
                    };
                    latest.insert(change.key, (prepared, l));
                }
            }
        }
        let mut prepared = Vec::with_capacity(latest.len());
        let mut acks = HashMap::with_capacity(latest.len());
        for (key, (p, l)) in latest {
            prepared.push(p);
            acks.insert(key, l);
        }
        (prepared, acks)
    }

    /// How many times a change has been delivered: the source's count, or
    /// this consumer's.
    fn deliveries(&mut self, key: &StableKey, ordinal: u64, counted: u32) -> u32 {
        if counted > 0 {
            // The source counts: nothing to keep here.
            return counted;
        }
        let n = self.attempts.entry((key.clone(), ordinal)).or_insert(0);
        *n += 1;
        *n
    }

    /// What becomes of each change, from how its batch's run went.
    fn outcomes<A>(
        &mut self,
        result: Result<RunReport>,
        seen: &Mutex<Mounted>,
        latest: &mut HashMap<StableKey, Latest<A>>,
    ) -> Result<Vec<Settled<A>>> {
        let stopping = self.app.shutdown_handle().is_requested();
        let report = match result {
            Ok(report) => report,
            Err(Error::Shutdown(_)) if stopping => RunReport {
                stats: UpdateStats::default(),
                failures: vec![ComponentFailure::new(
                    crate::model::ComponentPath::root(),
                    &Error::msg("the run stopped"),
                )],
            },
            Err(e) => return Err(e),
        };
        self.note_run(&report);
        let seen = lock(seen);
        let (failed, whole) = failed_keys(&report.failures, seen.mounted);
        let not_held: std::collections::HashSet<&StableKey> = seen.not_held.iter().collect();
        let mut settled = Vec::with_capacity(latest.values().map(|l| l.acks.len()).sum());
        for (key, l) in latest.drain() {
            let outcome = if not_held.contains(&key) {
                Outcome::NotHeld
            } else {
                match failed.get(&key).or(whole.as_ref()) {
                    None => Outcome::Ack,
                    Some(_) if stopping => Outcome::Interrupted,
                    Some(cause) => self.failed(l.deliveries, cause),
                }
            };
            if !matches!(outcome, Outcome::Retry { .. } | Outcome::Interrupted) {
                self.attempts.remove(&(key, l.ordinal));
            }
            for ack in l.acks {
                self.note_settled(&outcome);
                settled.push(Settled {
                    ack,
                    outcome: outcome.clone(),
                });
            }
        }
        Ok(settled)
    }

    /// A failed change: redelivered after a backoff, or released on its
    /// last allowed delivery.
    fn failed(&self, deliveries: u32, cause: &str) -> Outcome {
        if deliveries >= self.options.max_deliveries {
            Outcome::DeadLetter {
                reason: cause.to_string(),
            }
        } else {
            Outcome::Retry {
                delay: self.options.backoff_after(deliveries),
            }
        }
    }

    /// Counts changes received from the source.
    fn note_received(&mut self, changes: usize) {
        self.report.received += changes as u64;
        self.metrics.received(changes);
    }

    /// Counts a change settled with `outcome`.
    fn note_settled(&mut self, outcome: &Outcome) {
        self.report.count(outcome);
        self.metrics.settled(outcome);
    }

    fn note_run(&mut self, report: &RunReport) {
        self.report.add_stats(&report.stats);
        if !report.failures.is_empty() {
            self.report.failures.clone_from(&report.failures);
        }
    }
}

/// The causes of failed root-level components, by key, and the cause of a
/// failure of the whole batch: the root's, or a batch the run's function
/// never mounted.
fn failed_keys(
    failures: &[ComponentFailure],
    mounted: bool,
) -> (HashMap<StableKey, String>, Option<String>) {
    let mut failed = HashMap::new();
    let mut whole = None;
    for failure in failures {
        match failure.path.segments() {
            [] => whole = Some(failure.cause.clone()),
            [key, ..] => {
                failed
                    .entry(key.clone())
                    .or_insert_with(|| failure.cause.clone());
            }
        }
    }
    if !mounted && whole.is_none() {
        whole =
            Some("the consume function did not mount its batch with Ctx::mount_source".to_string());
    }
    (failed, whole)
}

/// Ticks every `every`, from `every` from now; a tick missed while no
/// batch ran comes at once, then every `every` again.
fn keep_alive_ticks(every: Duration) -> tokio::time::Interval {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks
}

/// What [`App::consume`] holds between batches: the batch read ahead, and
/// the outcomes of the last batch run, committed and not yet told to the
/// source.
struct Pipeline<S: Source> {
    ahead: Ahead<S>,
    committed: Vec<Settled<S::Ack>>,
}

impl<S: Source> Default for Pipeline<S> {
    fn default() -> Self {
        Self {
            ahead: None,
            committed: Vec::new(),
        }
    }
}

impl<S: Source> Pipeline<S> {
    /// The changes held, read ahead or to be settled.
    fn waiting(&self) -> usize {
        changes_in::<S>(&self.ahead) + self.committed.len()
    }
}

/// Tells the source the outcomes of the last batch run, if not yet told.
async fn settle_committed<S: Source>(source: &mut S, pipe: &mut Pipeline<S>) -> Result<()> {
    let committed = std::mem::take(&mut pipe.committed);
    if committed.is_empty() {
        return Ok(());
    }
    source.settle(committed).await
}

/// Settles `committed` while `run` goes on; `run`'s result too if it
/// finished first. The settling is never cut short.
async fn settle_while<S: Source, T>(
    source: &mut S,
    committed: Vec<Settled<S::Ack>>,
    mut run: std::pin::Pin<&mut impl Future<Output = T>>,
) -> (Option<T>, Result<()>) {
    if committed.is_empty() {
        return (None, Ok(()));
    }
    let settle = source.settle(committed);
    tokio::pin!(settle);
    let mut ran = None;
    loop {
        tokio::select! {
            settled = &mut settle => return (ran, settled),
            done = &mut run, if ran.is_none() => ran = Some(done),
        }
    }
}

/// A batch read while the last one ran, or the error reading it: `None`
/// when none was read (a read that found the source done included).
type Ahead<S> = Option<Result<Batch<<S as Source>::Payload, <S as Source>::Ack>>>;

/// The changes of a batch read ahead.
fn changes_in<S: Source>(ahead: &Ahead<S>) -> usize {
    match ahead {
        Some(Ok(Batch::Changes(changes))) => changes.len(),
        _ => 0,
    }
}

/// The acknowledgement handles of a running batch's changes.
fn acks_in<A>(latest: &HashMap<StableKey, Latest<A>>) -> usize {
    latest.values().map(|l| l.acks.len()).sum()
}

/// The acknowledgement handles of the running batch and of the batch
/// read ahead.
fn in_progress<'a, S: Source>(
    latest: &'a HashMap<StableKey, Latest<S::Ack>>,
    ahead: &'a Ahead<S>,
) -> Vec<&'a S::Ack> {
    let mut acks: Vec<&S::Ack> = latest.values().flat_map(|l| l.acks.iter()).collect();
    if let Some(Ok(Batch::Changes(changes))) = ahead {
        acks.extend(changes.iter().map(|c| &c.ack));
    }
    acks
}

/// Tells the source that these changes are still in progress; a failure
/// is logged.
async fn keep_alive<S: Source>(source: &mut S, acks: &[&S::Ack], start: Instant) {
    if let Err(e) = source.keep_alive(acks).await {
        tracing::warn!(
            source = source.name(),
            running_for = ?start.elapsed(),
            "telling the source that a batch is in progress failed: {e}"
        );
    }
}

/// A source's metrics, labelled with its name.
struct SourceMetrics {
    received: metrics::Counter,
    acknowledged: metrics::Counter,
    redelivered: metrics::Counter,
    dead_lettered: metrics::Counter,
    in_flight: metrics::Gauge,
    lag: metrics::Gauge,
}

impl SourceMetrics {
    fn new(name: &str) -> Self {
        let label = [("source", name.to_string())];
        let this = Self {
            received: metrics::counter!(m::SOURCE_RECEIVED, &label),
            acknowledged: metrics::counter!(m::SOURCE_ACKNOWLEDGED, &label),
            redelivered: metrics::counter!(m::SOURCE_REDELIVERED, &label),
            dead_lettered: metrics::counter!(m::SOURCE_DEAD_LETTERED, &label),
            in_flight: metrics::gauge!(m::SOURCE_IN_FLIGHT, &label),
            lag: metrics::gauge!(m::SOURCE_LAG, &label),
        };
        // Exported from the start, at zero.
        for c in [
            &this.received,
            &this.acknowledged,
            &this.redelivered,
            &this.dead_lettered,
        ] {
            c.increment(0);
        }
        this.in_flight.set(0.0);
        this
    }

    fn received(&self, n: usize) {
        self.received.increment(n as u64);
    }

    fn in_flight(&self, n: usize) {
        self.in_flight.set(n as f64);
    }

    fn lag(&self, n: u64) {
        self.lag.set(n as f64);
    }

    fn settled(&self, outcome: &Outcome) {
        match outcome {
            Outcome::Ack => self.acknowledged.increment(1),
            Outcome::Retry { .. } | Outcome::Interrupted => self.redelivered.increment(1),
            Outcome::DeadLetter { .. } => self.dead_lettered.increment(1),
            Outcome::NotHeld => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redeliveries_back_off_exponentially_up_to_the_maximum() {
        let o = ConsumeOptions::default().backoff(Duration::from_secs(1), Duration::from_secs(5));
        assert_eq!(o.backoff_after(1), Duration::from_secs(1));
        assert_eq!(o.backoff_after(2), Duration::from_secs(2));
        assert_eq!(o.backoff_after(3), Duration::from_secs(4));
        assert_eq!(o.backoff_after(4), Duration::from_secs(5));
        assert_eq!(o.backoff_after(40), Duration::from_secs(5));
    }
}
