//! The PostgreSQL table source: the rows of a table (or a view), one item
//! per row, keyed by the table's key.
//!
//! [`TableSource`] implements [`Source`]: each [`next_batch`](Source::next_batch)
//! is a [`Listing`](weir_actors::source::Listing) of the whole table, read
//! from one snapshot (`REPEATABLE READ`) and ordered by key, so a row no
//! longer in the table is no longer listed and its component's target
//! states are deleted. Mount it with
//! [`Ctx::mount_source`](weir_actors::Ctx::mount_source); each component
//! receives a [`SourceRow`].
//!
//! # Modes
//!
//! - **Snapshot** (the default): every row is read, with its payload (the
//!   row as JSON, `to_jsonb`). An item's version is the fingerprint of the
//!   row's JSON text, so a row unchanged since its last successful run is
//!   skipped.
//! - **Incremental** ([`TableSourceOptions::ordinal`]): the listing reads
//!   only each row's key and ordinal column (an `updated_at`, a value
//!   taken from a sequence at each write), whose text is the item's
//!   version. The payloads of the rows whose ordinal changed, and only
//!   those, are loaded in bulk, 5 000 keys per statement
//!   (`WHERE (key) IN (SELECT ... FROM UNNEST(...))`). A row whose ordinal
//!   is NULL runs at every listing. A change that leaves the ordinal as it
//!   was is not seen.
//! - **Live** ([`TableSourceOptions::follow`]): the first listing comes at
//!   once; each later one when the table has changed. Without it, the
//!   source gives one listing, then ends.
//!
//! # Keys
//!
//! The key is the table's primary key, or the columns named with
//! [`TableSourceOptions::key`] (which must then be unique and not NULL: a
//! listing that finds two rows with one key, or a NULL in it, fails).
//! A component's key ([`StableKey`](weir_actors::StableKey)) is, for a key of one column,
//! [`StableKey::Int`](weir_actors::StableKey::Int) for `smallint`, `integer` and `bigint`,
//! [`StableKey::Uuid`](weir_actors::StableKey::Uuid) for `uuid`, and [`StableKey::Str`](weir_actors::StableKey::Str) of the value's
//! PostgreSQL text for any other type; for a key of several columns, a
//! [`StableKey::Array`](weir_actors::StableKey::Array) of those parts, in key order.
//!
//! # Following changes
//!
//! A live source checks whether the table changed by comparing a *mark*
//! with the last listing's: the row count and the sum of a hash of each
//! row's text (snapshot mode) or of each key and ordinal (incremental
//! mode), computed by the server in one scan. It checks every
//! [`poll_interval`](TableSourceOptions::poll_interval) (1 s by default),
//! and, with [`TableSourceOptions::notify`], about 75 ms after a
//! notification.
//!
//! With `notify(true)`, [`TableSource::connect`] installs a trigger
//! `weir_notify` on the table, `AFTER INSERT OR UPDATE OR DELETE OR
//! TRUNCATE ... FOR EACH STATEMENT`, running the function
//! `weir_notify_change()` of the table's schema (shared by its tables),
//! which calls `pg_notify` on the channel `weir:<schema>.<table>` (or
//! `weir:` and the MD5 of `<schema>.<table>` when that is longer than 63
//! bytes). Installing is idempotent (`CREATE OR REPLACE FUNCTION`, and the
//! trigger dropped and created again); weir never installs it otherwise.
//! Remove it with `DROP TRIGGER weir_notify ON <table>`. The source then
//! `LISTEN`s on the channel with a connection it takes from the pool for
//! as long as it lives (give the pool one more connection than it needs
//! otherwise); when that connection is lost, it checks the table, polls,
//! and listens again.
//!
//! [`next_batch`](Source::next_batch) is cancel-safe: a wait dropped
//! (at shutdown) loses nothing, and a listing dropped before it is
//! returned is read again by the next call.
//!
//! # Names
//!
//! Every value is bound as a parameter. The schema, the table and the
//! columns are looked up in `pg_catalog` when connecting (a missing one is
//! an error naming it and, for a column, listing the table's columns) and
//! always quoted in SQL text, so any name PostgreSQL accepts works.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use weir_actors::source::ConsumeOptions;
//! use weir_actors::{App, Result};
//! use weir_connectors::postgres::{TableSource, TableSourceOptions};
//!
//! # async fn example(app: App, pool: sqlx::PgPool) -> Result<()> {
//! let options = TableSourceOptions::new("orders")
//!     .ordinal("updated_at")
//!     .follow(true)
//!     .notify(true)
//!     .poll_interval(Duration::from_secs(5));
//! let mut source = TableSource::connect(pool, options).await?;
//! app.consume(&mut source, ConsumeOptions::default(), |ctx, batch| async move {
//!     ctx.mount_source(batch, |_ctx, item| async move {
//!         let order = &item.payload.value;
//!         // Declare target states from the row here.
//!         let _ = order;
//!         Ok(())
//!     })
//!     .await
//! })
//! .await?;
//! # Ok(())
//! # }
//! ```

mod catalog;
mod live;
mod read;

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use weir_actors::source::{Batch, Settled, Source};
use weir_actors::Result;

use live::Watch;
use read::{Mark, Plan};

/// The default of [`TableSourceOptions::poll_interval`].
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// What a [`TableSource`] reads, and how. See the [module](self).
#[derive(Clone, Debug)]
pub struct TableSourceOptions {
    table: String,
    schema: Option<String>,
    key: Option<Vec<String>>,
    ordinal: Option<String>,
    follow: bool,
    notify: bool,
    poll_interval: Duration,
}

impl TableSourceOptions {
    /// Reads the table (or view) `table`, in snapshot mode, once.
    pub fn new(table: impl Into<String>) -> Self {
        Self {
            table: table.into(),
            schema: None,
            key: None,
            ordinal: None,
            follow: false,
            notify: false,
            poll_interval: DEFAULT_POLL_INTERVAL,
        }
    }

    /// The table's schema. Default: the first schema of the connection's
    /// `search_path` that exists (`current_schema()`, usually `public`).
    #[must_use]
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// The key columns, in order. Default: the table's primary key (a
    /// view, or a table without one, needs this).
    #[must_use]
    pub fn key(mut self, columns: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.key = Some(columns.into_iter().map(Into::into).collect());
        self
    }

    /// Incremental mode: `column` changes at each write of a row (an
    /// `updated_at`, a sequence), and its text is the row's version.
    #[must_use]
    pub fn ordinal(mut self, column: impl Into<String>) -> Self {
        self.ordinal = Some(column.into());
        self
    }

    /// Live mode: after the first listing, wait for changes and list
    /// again. `false` (the default): one listing, then the source ends.
    #[must_use]
    pub fn follow(mut self, live: bool) -> Self {
        self.follow = live;
        self
    }

    /// In live mode, whether to install the notifying trigger on the table
    /// and listen to it (see the [module](self)); `false` (the default):
    /// poll only.
    #[must_use]
    pub fn notify(mut self, install_trigger: bool) -> Self {
        self.notify = install_trigger;
        self
    }

    /// In live mode, how often the table is checked for a change (with
    /// [`notify`](Self::notify), as a safety net). Default: 1 s.
    #[must_use]
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll_interval = d;
        self
    }
}

/// A row, as a component mounted from a [`TableSource`] receives it.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceRow {
    /// The key columns' values, in key order.
    pub key: Vec<serde_json::Value>,
    /// The key as text: for one column, its value's PostgreSQL text; for
    /// several, the JSON array of [`key`](Self::key).
    pub key_text: String,
    /// The whole row as a JSON object (`to_jsonb`).
    pub value: serde_json::Value,
    /// The ordinal column's value as text, in incremental mode (`None`
    /// when NULL, and in snapshot mode).
    pub ordinal: Option<String>,
}

/// A PostgreSQL table as a [`Source`] of [`SourceRow`]s. See the
/// [module](self).
pub struct TableSource {
    pool: PgPool,
    plan: Arc<Plan>,
    name: String,
    follow: bool,
    watch: Option<Watch>,
    /// Whether a listing was returned.
    listed: bool,
    /// The mark of the last listing returned, in live mode.
    last: Option<Mark>,
}

impl std::fmt::Debug for TableSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableSource")
            .field("name", &self.name)
            .field("follow", &self.follow)
            .finish()
    }
}

impl TableSource {
    /// A source reading the table of `options` through `pool`. Checks that
    /// the schema, the table and the key and ordinal columns exist; with
    /// [`notify`](TableSourceOptions::notify) in live mode, installs the
    /// trigger and starts listening.
    ///
    /// # Errors
    /// A permanent error naming what does not exist (a column's error lists
    /// the table's columns), or a table without a primary key and no
    /// [`key`](TableSourceOptions::key); a database error when the catalog
    /// cannot be read or the trigger cannot be installed.
    pub async fn connect(pool: PgPool, options: TableSourceOptions) -> Result<Self> {
        let table = catalog::resolve(&pool, &options).await?;
        let name = format!("postgres:{}", table.display());
        let watch = match options.follow {
            true => Some(watch(&pool, &table, &options).await?),
            false => None,
        };
        Ok(Self {
            pool,
            plan: Arc::new(Plan::new(table)),
            name,
            follow: options.follow,
            watch,
            listed: false,
            last: None,
        })
    }

    /// The source's name: `postgres:<schema>.<table>`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The listing of the table, noted as the last one returned.
    async fn listing(&mut self) -> Result<Batch<SourceRow, ()>> {
        let (listing, mark) = read::list(&self.pool, &self.plan, self.follow).await?;
        self.listed = true;
        self.last = mark;
        Ok(Batch::Listing(listing))
    }

    /// Waits until the table's mark differs from the last listing's.
    async fn changed(&mut self) -> Result<()> {
        let Some(watch) = self.watch.as_mut() else {
            return Ok(());
        };
        loop {
            watch.wait(&self.name).await;
            match read::mark(&self.pool, &self.plan).await {
                Ok(mark) if self.last.as_ref() != Some(&mark) => return Ok(()),
                Ok(_) => {}
                Err(e) if e.is_retriable() => {
                    tracing::warn!(source = self.name, "checking the table failed: {e}");
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// The watch of a live source: with `notify`, the trigger installed and a
/// listener on its channel.
async fn watch(
    pool: &PgPool,
    table: &catalog::Table,
    options: &TableSourceOptions,
) -> Result<Watch> {
    let channel = match options.notify {
        true => {
            live::install_trigger(pool, table).await?;
            Some(live::channel(pool, table).await?)
        }
        false => None,
    };
    Watch::new(pool.clone(), options.poll_interval, channel).await
}

impl Source for TableSource {
    type Payload = SourceRow;
    type Ack = ();

    fn name(&self) -> &str {
        &self.name
    }

    async fn next_batch(&mut self, _max: usize) -> Result<Option<Batch<SourceRow, ()>>> {
        if self.listed {
            if !self.follow {
                return Ok(None);
            }
            self.changed().await?;
        }
        self.listing().await.map(Some)
    }

    async fn settle(&mut self, _settled: Vec<Settled<()>>) -> Result<()> {
        Ok(())
    }
}
