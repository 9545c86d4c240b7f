//! The connectors' own metrics, exact, for both SQL dialects: rows written
//! by kind once committed, statement latency by statement, and failed
//! statements by error kind and retry class. Runs in its own process (one
//! test): it installs a global recorder.

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod pg;

use std::collections::BTreeMap;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::CompositeKey;
use serde::Serialize;
use sqlx::{PgPool, SqlitePool};
use weir::connectors::sql::{ColumnType, TableSchema};
use weir::connectors::{postgres, sqlite};
use weir::metrics::{CONNECTOR_ERRORS, CONNECTOR_ROWS, CONNECTOR_STATEMENT_DURATION};
use weir::prelude::*;

#[derive(Clone, Serialize)]
struct Doc {
    id: String,
    body: String,
}

fn docs(rows: &[(&str, &str)]) -> Vec<Doc> {
    rows.iter()
        .map(|(id, body)| Doc {
            id: id.to_string(),
            body: body.to_string(),
        })
        .collect()
}

fn schema() -> TableSchema {
    TableSchema::builder()
        .column("id", ColumnType::Text)
        .column("body", ColumnType::Text)
        .primary_key(["id"])
        .build()
        .unwrap()
}

/// One dialect: declares rows of `table` through its connector.
#[derive(Clone)]
enum Dialect {
    Sqlite(ContextKey<SqlitePool>),
    Postgres(ContextKey<PgPool>),
}

impl Dialect {
    /// The name of its database's `ContextKey`: the target of commits.
    fn database(&self) -> &str {
        match self {
            Dialect::Sqlite(db) => db.name(),
            Dialect::Postgres(db) => db.name(),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Dialect::Sqlite(_) => "sqlite",
            Dialect::Postgres(_) => "postgres",
        }
    }

    /// One run: the root mounts `table`, then one component per row
    /// declares it.
    async fn sync(&self, app: &App, table: &str, rows: Vec<Doc>) -> Result<()> {
        let (dialect, table) = (self.clone(), table.to_string());
        app.run(move |ctx| async move {
            let target = dialect.mount(&ctx, &table).await?;
            ctx.mount_each(
                rows,
                |d| d.id.clone(),
                move |ctx, doc| {
                    let target = target.clone();
                    async move { target.declare(&ctx, &doc) }
                },
            )
            .await
        })
        .await
        .map(|_| ())
    }

    async fn mount(&self, ctx: &Ctx, table: &str) -> Result<Target> {
        Ok(match self {
            Dialect::Sqlite(db) => {
                Target::Sqlite(sqlite::mount_table_target(ctx, db, table, schema()).await?)
            }
            Dialect::Postgres(db) => {
                Target::Postgres(postgres::mount_table_target(ctx, db, table, schema()).await?)
            }
        })
    }
}

/// A mounted table of either dialect.
#[derive(Clone)]
enum Target {
    Sqlite(sqlite::TableTarget),
    Postgres(postgres::TableTarget),
}

impl Target {
    fn declare(&self, ctx: &Ctx, doc: &Doc) -> Result<()> {
        match self {
            Target::Sqlite(t) => t.declare_row(ctx, doc),
            Target::Postgres(t) => t.declare_row(ctx, doc),
        }
    }
}

/// A snapshot of the recorder: what was recorded since the last one.
type Snapshot = Vec<(
    CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;

/// The counters named `name` of `connector`, by the values of `labels`.
fn counters(
    snapshot: &Snapshot,
    name: &str,
    connector: &str,
    labels: &[&str],
) -> BTreeMap<Vec<String>, u64> {
    let mut out = BTreeMap::new();
    for (key, _, _, value) in snapshot {
        let key = key.key();
        let label = |l: &str| {
            key.labels()
                .find(|x| x.key() == l)
                .map(|x| x.value().to_string())
                .unwrap_or_default()
        };
        if key.name() != name || label("connector") != connector {
            continue;
        }
        if let DebugValue::Counter(n) = value {
            out.insert(labels.iter().map(|l| label(l)).collect(), *n);
        }
    }
    out
}

/// The statements of `connector` timed at least once, as `target/statement`.
fn statements(snapshot: &Snapshot, connector: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (key, _, _, value) in snapshot {
        let key = key.key();
        let label = |l: &str| key.labels().find(|x| x.key() == l).map(|x| x.value());
        let timed = matches!(value, DebugValue::Histogram(v) if !v.is_empty());
        if key.name() == CONNECTOR_STATEMENT_DURATION
            && label("connector") == Some(connector)
            && timed
        {
            out.push(format!(
                "{}/{}",
                label("target").unwrap_or_default(),
                label("statement").unwrap_or_default()
            ));
        }
    }
    out.sort();
    out
}

fn row(labels: &[&str], n: u64) -> (Vec<String>, u64) {
    (labels.iter().map(ToString::to_string).collect(), n)
}

/// Creates 3 rows, updates 1 and deletes 1, then fails a row on a unique
/// index made by hand; checks the connector's counts after each step.
async fn check(
    snapshotter: &Snapshotter,
    dialect: Dialect,
    app: &App,
    table: &str,
    make_unique: impl std::future::Future<Output = Result<()>>,
) -> Result<()> {
    let c = dialect.name();
    dialect
        .sync(app, table, docs(&[("1", "a"), ("2", "b"), ("3", "c")]))
        .await?;
    dialect
        .sync(app, table, docs(&[("1", "a"), ("2", "B")]))
        .await?;
    let snapshot = snapshotter.snapshot().into_vec();
    let rows = counters(&snapshot, CONNECTOR_ROWS, c, &["target", "kind"]);
    let want = BTreeMap::from([
        row(&[table, "created"], 3),
        row(&[table, "updated"], 1),
        row(&[table, "deleted"], 1),
    ]);
    assert_eq!(rows, want, "{c}");
    let timed = statements(&snapshot, c);
    for statement in ["upsert", "delete", "ddl"] {
        let s = format!("{table}/{statement}");
        assert!(timed.contains(&s), "{c}: {s} not timed: {timed:?}");
    }
    // Commits (of rows and of DDL) are timed under the database's name.
    let commit = format!("{}/commit", dialect.database());
    assert!(
        timed.contains(&commit),
        "{c}: {commit} not timed: {timed:?}"
    );
    let commits = timed.iter().filter(|s| s.ends_with("/commit")).count();
    assert_eq!(commits, 1, "{c}: {timed:?}");
    assert!(counters(&snapshot, CONNECTOR_ERRORS, c, &["target"]).is_empty());

    // A row the database refuses: counted once per failed statement, by
    // kind and class, and not as written.
    make_unique.await?;
    let refused = dialect
        .sync(app, table, docs(&[("1", "a"), ("2", "B"), ("4", "B")]))
        .await;
    assert!(refused.is_err(), "{c}: the duplicate body was accepted");
    let snapshot = snapshotter.snapshot().into_vec();
    let errors = counters(&snapshot, CONNECTOR_ERRORS, c, &["target", "kind", "class"]);
    // A constraint violation: retrying cannot fix it.
    assert!(
        errors
            .iter()
            .any(|(l, n)| l[0] == table && l[2] == "permanent" && *n >= 1),
        "{c}: {errors:?}"
    );
    // Counters read since the last snapshot: the refused row added none.
    let rows = counters(&snapshot, CONNECTOR_ROWS, c, &["target", "kind"]);
    assert!(
        rows.values().all(|&n| n == 0),
        "{c}: counted as written: {rows:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_dialect_counts_rows_by_kind_times_its_statements_and_counts_refused_ones_by_kind(
) -> Result<()> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    if recorder.install().is_err() {
        return Err(Error::msg("a global recorder was already installed"));
    }
    let dir = tempfile::tempdir()?;

    let lite = sqlite::connect(dir.path().join("docs.db")).await?;
    let key = ContextKey::<SqlitePool>::new("lite");
    let app = App::builder("connector-metrics-sqlite")
        .ledger_path(dir.path().join("ledger-sqlite"))
        .provide_key(&key, lite.clone())
        .build()
        .await?;
    let unique = sqlx::query("CREATE UNIQUE INDEX docs_body ON docs (body)").execute(&lite);
    check(&snapshotter, Dialect::Sqlite(key), &app, "docs", async {
        unique.await.map(|_| ()).map_err(Error::from)
    })
    .await?;

    let Some((_, pool)) = pg::server(4).await.map_err(Error::msg)? else {
        return Ok(());
    };
    let table = pg::unique("metrics_docs");
    let key = ContextKey::<PgPool>::new("pg");
    let app = App::builder("connector-metrics-postgres")
        .ledger_path(dir.path().join("ledger-postgres"))
        .provide_key(&key, pool.clone())
        .build()
        .await?;
    let index = format!("CREATE UNIQUE INDEX ON \"{table}\" (body)");
    let unique = sqlx::raw_sql(&index).execute(&pool);
    let checked = check(&snapshotter, Dialect::Postgres(key), &app, &table, async {
        unique.await.map(|_| ()).map_err(Error::from)
    })
    .await;
    sqlx::raw_sql(&format!("DROP TABLE IF EXISTS \"{table}\""))
        .execute(&pool)
        .await?;
    checked
}
