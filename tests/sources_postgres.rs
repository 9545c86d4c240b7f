//! The PostgreSQL table source (`weir::connectors::postgres::TableSource`)
//! against a real server: snapshots, incremental listings, composite keys,
//! live mode and names checked against the catalog.

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod pg;
mod support;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::{PgPool, Row as _};
use support::*;
use weir::connectors::postgres::{SourceRow, TableSource, TableSourceOptions};
use weir::connectors::sql::quote_identifier;
use weir::prelude::*;
use weir::source::{ConsumeOptions, ConsumeReport};

const ROWS: &str = "test/row";

/// The key texts of the rows the components ran for, in order.
type Seen = Arc<Mutex<Vec<String>>>;

/// Runs `test` with a pool on the test server and a table name of its own
/// (dropped at the end, whatever happened); skips without a server.
async fn with_table<F, Fut>(test: &str, f: F)
where
    F: FnOnce(PgPool, String) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let Some((_, pool)) = pg::server(8).await.unwrap() else {
        return;
    };
    let table = pg::unique(test);
    let result = f(pool.clone(), table.clone()).await;
    sqlx::query(&format!(
        "DROP TABLE IF EXISTS {} CASCADE",
        quote_identifier(&table)
    ))
    .execute(&pool)
    .await
    .unwrap();
    result.unwrap();
}

async fn exec(pool: &PgPool, sql: &str) {
    sqlx::query(sql).execute(pool).await.unwrap();
}

/// Consumes `source` into the rig: one component per row, declaring the row
/// `key_text = value` (the row's JSON), and noting its key text in `seen`.
async fn consume(
    app: &App,
    source: &mut TableSource,
    rig: &Rig,
    seen: &Seen,
) -> Result<ConsumeReport> {
    let handler = rig.handler();
    let seen = Arc::clone(seen);
    app.consume(source, ConsumeOptions::default(), move |ctx, batch| {
        let handler = handler.clone();
        let seen = Arc::clone(&seen);
        async move {
            let rows = register_root_target_states_provider::<String, _>(&ctx, ROWS, handler)?;
            ctx.mount_source(batch, move |ctx, item| {
                let rows = rows.clone();
                let seen = Arc::clone(&seen);
                async move { declare_row(&ctx, &rows, &seen, &item.payload) }
            })
            .await
        }
    })
    .await
}

fn declare_row(
    ctx: &Ctx,
    rows: &TargetStateProvider<String>,
    seen: &Seen,
    row: &SourceRow,
) -> Result<()> {
    seen.lock().unwrap().push(row.key_text.clone());
    let state = rows.target_state(row.key_text.as_str(), row.value.to_string());
    declare_target_state(ctx, state)
}

/// One listing of `options`' table, consumed into the rig.
async fn sync(
    app: &App,
    pool: &PgPool,
    options: &TableSourceOptions,
    rig: &Rig,
    seen: &Seen,
) -> Result<ConsumeReport> {
    let mut source = TableSource::connect(pool.clone(), options.clone()).await?;
    consume(app, &mut source, rig, seen).await
}

/// What the rig's store must hold: each row's key text (as `key_sql`
/// writes it) and JSON.
async fn expected(pool: &PgPool, table: &str, key_sql: &str) -> BTreeMap<String, String> {
    let sql = format!(
        "SELECT {key_sql}, to_jsonb(t.*)::text FROM {} AS t",
        quote_identifier(table)
    );
    let rows = sqlx::query(&sql).fetch_all(pool).await.unwrap();
    rows.iter()
        .map(|r| {
            let json: String = r.get(1);
            let value: serde_json::Value = serde_json::from_str(&json).unwrap();
            (r.get::<String, _>(0), value.to_string())
        })
        .collect()
}

/// The seen keys, sorted, and forgotten.
fn take_seen(seen: &Seen) -> Vec<String> {
    let mut keys = std::mem::take(&mut *seen.lock().unwrap());
    keys.sort();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_then_inserts_updates_and_deletes_leave_the_target_exact() {
    with_table("src_snapshot", |pool, table| async move {
        let t = quote_identifier(&table);
        exec(
            &pool,
            &format!("CREATE TABLE {t} (id bigint PRIMARY KEY, name text, score int)"),
        )
        .await;
        exec(
            &pool,
            &format!("INSERT INTO {t} SELECT i, 'n' || i, i * 10 FROM generate_series(1, 5) i"),
        )
        .await;
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let (rig, seen) = (Rig::new(), Seen::default());
        let options = TableSourceOptions::new(&table);

        let first = sync(&app, &pool, &options, &rig, &seen).await?;
        assert_eq!(first.batches, 1);
        assert_eq!(
            rig.store.snapshot(),
            expected(&pool, &table, "t.id::text").await
        );
        assert_eq!(take_seen(&seen), strings(&["1", "2", "3", "4", "5"]));
        rig.log.clear();

        sync(&app, &pool, &options, &rig, &seen).await?;
        assert_eq!(rig.log.call_count(), 0, "unchanged rows cause no sink call");
        assert!(take_seen(&seen).is_empty(), "unchanged rows are skipped");

        exec(&pool, &format!("INSERT INTO {t} VALUES (6, 'n6', 60)")).await;
        exec(
            &pool,
            &format!("UPDATE {t} SET name = 'renamed' WHERE id = 2"),
        )
        .await;
        exec(&pool, &format!("DELETE FROM {t} WHERE id = 3")).await;
        sync(&app, &pool, &options, &rig, &seen).await?;
        let store = rig.store.snapshot();
        assert_eq!(store, expected(&pool, &table, "t.id::text").await);
        assert_eq!(store.len(), 5);
        assert_eq!(take_seen(&seen), strings(&["2", "6"]));
        let entries = rig.log.entries();
        assert_eq!(entries.len(), 3, "{entries:?}");
        assert!(entries[0].starts_with("create 6="), "{entries:?}");
        assert_eq!(entries[1], "delete 3");
        assert!(entries[2].starts_with("update 2="), "{entries:?}");
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incremental_listing_loads_only_the_rows_whose_ordinal_changed() {
    with_table("src_incremental", |pool, table| async move {
        let t = quote_identifier(&table);
        exec(
            &pool,
            &format!("CREATE TABLE {t} (id int PRIMARY KEY, body text, rev bigint)"),
        )
        .await;
        exec(
            &pool,
            &format!("INSERT INTO {t} SELECT i, 'b' || i, 1 FROM generate_series(1, 20) i"),
        )
        .await;
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let (rig, seen) = (Rig::new(), Seen::default());
        let options = TableSourceOptions::new(&table).ordinal("rev");

        sync(&app, &pool, &options, &rig, &seen).await?;
        assert_eq!(
            rig.store.snapshot(),
            expected(&pool, &table, "t.id::text").await
        );
        assert_eq!(
            take_seen(&seen).len(),
            20,
            "the first listing loads every row"
        );
        rig.log.clear();

        sync(&app, &pool, &options, &rig, &seen).await?;
        assert!(
            take_seen(&seen).is_empty(),
            "no ordinal changed: nothing is loaded"
        );
        assert_eq!(rig.log.call_count(), 0);

        exec(
            &pool,
            &format!("UPDATE {t} SET body = 'new', rev = 2 WHERE id IN (4, 7)"),
        )
        .await;
        exec(&pool, &format!("INSERT INTO {t} VALUES (21, 'b21', 1)")).await;
        exec(&pool, &format!("DELETE FROM {t} WHERE id IN (1, 2)")).await;
        sync(&app, &pool, &options, &rig, &seen).await?;
        assert_eq!(
            rig.store.snapshot(),
            expected(&pool, &table, "t.id::text").await
        );
        assert_eq!(
            take_seen(&seen),
            strings(&["21", "4", "7"]),
            "only changed rows are loaded"
        );
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_is_loaded_with_its_current_ordinal_as_text() {
    with_table("src_ordinal_text", |pool, table| async move {
        let t = quote_identifier(&table);
        exec(
            &pool,
            &format!("CREATE TABLE {t} (id text PRIMARY KEY, updated_at timestamptz)"),
        )
        .await;
        exec(
            &pool,
            &format!("INSERT INTO {t} VALUES ('a', '2024-01-02 03:04:05+00'), ('b', NULL)"),
        )
        .await;
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let mut source = TableSource::connect(
            pool.clone(),
            TableSourceOptions::new(&table).ordinal("updated_at"),
        )
        .await?;
        let rows: Arc<Mutex<Vec<SourceRow>>> = Arc::default();
        let keep = Arc::clone(&rows);
        app.consume(&mut source, ConsumeOptions::default(), move |ctx, batch| {
            let keep = Arc::clone(&keep);
            async move {
                ctx.mount_source(batch, move |_ctx, item| {
                    let keep = Arc::clone(&keep);
                    async move {
                        keep.lock().unwrap().push(item.payload);
                        Ok(())
                    }
                })
                .await
            }
        })
        .await?;
        let mut rows = rows.lock().unwrap().clone();
        rows.sort_by(|a, b| a.key_text.cmp(&b.key_text));
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].key, vec![serde_json::json!("a")]);
        assert_eq!(
            rows[0]
                .ordinal
                .as_deref()
                .map(|o| o.starts_with("2024-01-0")),
            Some(true)
        );
        assert_eq!(rows[1].ordinal, None, "a NULL ordinal");
        assert_eq!(rows[1].value["id"], "b");
        Ok(())
    })
    .await;
}

/// The store a composite `(region, id)` key gives: keys are the JSON
/// arrays of the key values.
async fn expected_composite(pool: &PgPool, table: &str) -> BTreeMap<String, String> {
    let rows = expected(pool, table, "jsonb_build_array(t.region, t.id)::text").await;
    rows.into_iter()
        .map(|(k, v)| {
            (
                serde_json::from_str::<serde_json::Value>(&k)
                    .unwrap()
                    .to_string(),
                v,
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn composite_keys_key_items_by_every_column_in_both_modes() {
    with_table("src_composite", |pool, table| async move {
        let t = quote_identifier(&table);
        exec(
            &pool,
            &format!(
            "CREATE TABLE {t} (region text, id int, qty int, rev int, PRIMARY KEY (region, id))"
        ),
        )
        .await;
        exec(
            &pool,
            &format!("INSERT INTO {t} VALUES ('eu', 1, 5, 1), ('eu', 2, 6, 1), ('us', 1, 7, 1)"),
        )
        .await;
        for options in [
            TableSourceOptions::new(&table),
            TableSourceOptions::new(&table).ordinal("rev"),
        ] {
            let dir = tempfile::tempdir()?;
            let app = app(dir.path()).await?;
            let (rig, seen) = (Rig::new(), Seen::default());
            sync(&app, &pool, &options, &rig, &seen).await?;
            let store = rig.store.snapshot();
            assert_eq!(
                store,
                expected_composite(&pool, &table).await,
                "{options:?}"
            );
            assert!(store.contains_key(r#"["eu",1]"#), "{store:?}");
            take_seen(&seen);

            exec(
                &pool,
                &format!("UPDATE {t} SET qty = qty + 1, rev = rev + 1 WHERE region = 'us'"),
            )
            .await;
            exec(
                &pool,
                &format!("DELETE FROM {t} WHERE region = 'eu' AND id = 2"),
            )
            .await;
            exec(&pool, &format!("INSERT INTO {t} VALUES ('eu', 3, 1, 1)")).await;
            sync(&app, &pool, &options, &rig, &seen).await?;
            let store = rig.store.snapshot();
            assert_eq!(store.len(), 3);
            assert_eq!(
                store,
                expected_composite(&pool, &table).await,
                "{options:?}"
            );
            assert_eq!(take_seen(&seen), strings(&[r#"["eu",3]"#, r#"["us",1]"#]));
            // Put the table back for the next mode.
            exec(&pool, &format!("DELETE FROM {t}")).await;
            exec(
                &pool,
                &format!(
                    "INSERT INTO {t} VALUES ('eu', 1, 5, 1), ('eu', 2, 6, 1), ('us', 1, 7, 1)"
                ),
            )
            .await;
        }
        Ok(())
    })
    .await;
}

/// Waits up to `within` for the store to equal the table; how long it took.
async fn settles(rig: &Rig, pool: &PgPool, table: &str, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let want = expected(pool, table, "t.id::text").await;
        if rig.store.snapshot() == want {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "the target did not follow the table within {within:?}: {:?} vs {want:?}",
            rig.store.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Follows `table` with `options` while inserting, updating and deleting a
/// row, each picked up within a second; then shuts the app down.
async fn follow_changes(pool: PgPool, table: String, options: TableSourceOptions) -> Result<()> {
    let t = quote_identifier(&table);
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let (rig, seen) = (Rig::new(), Seen::default());
    let mut source = TableSource::connect(pool.clone(), options).await?;
    let second = Duration::from_secs(1);
    let driver = async {
        settles(&rig, &pool, &table, Duration::from_secs(10)).await;
        exec(&pool, &format!("INSERT INTO {t} VALUES (3, 'three')")).await;
        settles(&rig, &pool, &table, second).await;
        exec(
            &pool,
            &format!("UPDATE {t} SET name = 'one again' WHERE id = 1"),
        )
        .await;
        settles(&rig, &pool, &table, second).await;
        exec(&pool, &format!("DELETE FROM {t} WHERE id = 2")).await;
        settles(&rig, &pool, &table, second).await;
        app.shutdown_handle().shutdown();
    };
    let (report, ()) = tokio::join!(consume(&app, &mut source, &rig, &seen), driver);
    let report = report?;
    assert!(report.batches >= 4, "{report:?}");
    assert_eq!(rig.store.snapshot().len(), 2);
    Ok(())
}

async fn trigger_count(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = to_regclass(quote_ident($1)) AND NOT tgisinternal",
    )
    .bind(table)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_mode_with_notifications_picks_up_each_change_within_a_second() {
    with_table("src_live_notify", |pool, table| async move {
        let t = quote_identifier(&table);
        exec(
            &pool,
            &format!("CREATE TABLE {t} (id int PRIMARY KEY, name text)"),
        )
        .await;
        exec(
            &pool,
            &format!("INSERT INTO {t} VALUES (1, 'one'), (2, 'two')"),
        )
        .await;
        // Polling alone would take a minute: the notifications do it.
        let options = TableSourceOptions::new(&table)
            .follow(true)
            .notify(true)
            .poll_interval(Duration::from_secs(60));
        follow_changes(pool.clone(), table.clone(), options.clone()).await?;
        assert_eq!(trigger_count(&pool, &table).await, 1);
        // Installing again is idempotent.
        TableSource::connect(pool.clone(), options).await?;
        assert_eq!(trigger_count(&pool, &table).await, 1);
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_mode_without_notifications_polls_and_installs_no_trigger() {
    with_table("src_live_poll", |pool, table| async move {
        let t = quote_identifier(&table);
        exec(
            &pool,
            &format!("CREATE TABLE {t} (id int PRIMARY KEY, name text)"),
        )
        .await;
        exec(
            &pool,
            &format!("INSERT INTO {t} VALUES (1, 'one'), (2, 'two')"),
        )
        .await;
        let options = TableSourceOptions::new(&table)
            .follow(true)
            .poll_interval(Duration::from_millis(200));
        follow_changes(pool.clone(), table.clone(), options).await?;
        assert_eq!(trigger_count(&pool, &table).await, 0);
        Ok(())
    })
    .await;
}

/// The message of the error `TableSource::connect` gives for `options`.
async fn connect_error(pool: &PgPool, options: TableSourceOptions) -> String {
    match TableSource::connect(pool.clone(), options).await {
        Ok(source) => panic!("{} connected", source.name()),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_table_schema_and_column_names_are_errors_naming_them() {
    with_table("src_names", |pool, table| async move {
        let t = quote_identifier(&table);
        exec(&pool, &format!("CREATE TABLE {t} (id int PRIMARY KEY, name text, updated_at timestamptz)")).await;
        let missing = connect_error(&pool, TableSourceOptions::new(format!("{table}z"))).await;
        assert_eq!(missing, format!("PostgreSQL table `public.{table}z` does not exist"));
        let schema = connect_error(&pool, TableSourceOptions::new(&table).schema("nowhere")).await;
        assert_eq!(schema, "PostgreSQL schema `nowhere` does not exist");
        let key = connect_error(&pool, TableSourceOptions::new(&table).key(["id", "nope"])).await;
        assert_eq!(
            key,
            format!("key column `nope` is not a column of `public.{table}` (its columns: id, name, updated_at)")
        );
        let ordinal = connect_error(&pool, TableSourceOptions::new(&table).ordinal("updated")).await;
        assert!(
            ordinal.contains(&format!("column `updated` is not a column of `public.{table}` (its columns: id, name, updated_at)")),
            "{ordinal}"
        );
        let source = TableSource::connect(pool.clone(), TableSourceOptions::new(&table).schema("public")).await?;
        assert_eq!(source.name(), format!("postgres:public.{table}"));
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_without_a_primary_key_needs_key_columns() {
    with_table("src_no_pk", |pool, table| async move {
        let t = quote_identifier(&table);
        exec(&pool, &format!("CREATE TABLE {t} (code text, label text)")).await;
        exec(
            &pool,
            &format!("INSERT INTO {t} VALUES ('x', 'ex'), ('y', 'why')"),
        )
        .await;
        let err = connect_error(&pool, TableSourceOptions::new(&table)).await;
        assert!(
            err.contains(&format!("`public.{table}` has no primary key")),
            "{err}"
        );
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let (rig, seen) = (Rig::new(), Seen::default());
        let options = TableSourceOptions::new(&table).key(["code"]);
        sync(&app, &pool, &options, &rig, &seen).await?;
        assert_eq!(
            rig.store.snapshot(),
            expected(&pool, &table, "t.code").await
        );

        // A key that is not unique fails the listing, naming the key.
        exec(&pool, &format!("INSERT INTO {t} VALUES ('x', 'again')")).await;
        let err = sync(&app, &pool, &options, &rig, &seen)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("is not unique") && err.contains("\"x\""),
            "{err}"
        );
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_with_quotes_and_semicolons_are_quoted_not_injected() {
    with_table("src_quoted", |pool, base| async move {
        // The table `with_table` drops stays a decoy; this one is odd.
        exec(
            &pool,
            &format!("CREATE TABLE {} (id int)", quote_identifier(&base)),
        )
        .await;
        let table = format!("a\"b; DROP TABLE {base}; --");
        let t = quote_identifier(&table);
        exec(
            &pool,
            &format!("CREATE TABLE {t} (\"my id\" int PRIMARY KEY, \"va\"\"l\" text)"),
        )
        .await;
        exec(
            &pool,
            &format!("INSERT INTO {t} VALUES (1, 'one'), (2, 'two')"),
        )
        .await;
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let (rig, seen) = (Rig::new(), Seen::default());
        sync(&app, &pool, &TableSourceOptions::new(&table), &rig, &seen).await?;
        // Incremental mode binds the keys; the trigger's names are quoted too.
        let options = TableSourceOptions::new(&table).ordinal("va\"l");
        sync(&app, &pool, &options, &rig, &seen).await?;
        assert_eq!(take_seen(&seen), strings(&["1", "1", "2", "2"]));
        let options = options.follow(true).notify(true);
        let source = TableSource::connect(pool.clone(), options).await?;
        assert_eq!(source.name(), format!("postgres:public.{table}"));
        assert_eq!(trigger_count(&pool, &table).await, 1);
        let store = rig.store.snapshot();
        assert_eq!(store.len(), 2, "{store:?}");
        assert!(store["1"].contains("\"va\\\"l\":\"one\""), "{store:?}");
        let decoy: i64 =
            sqlx::query_scalar(&format!("SELECT count(*) FROM {}", quote_identifier(&base)))
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(decoy, 0, "the decoy table is still there");
        exec(&pool, &format!("DROP TABLE {t}")).await;
        Ok(())
    })
    .await;
}

/// The process ids of the connections listening to `table`'s channel.
async fn listeners(pool: &PgPool, table: &str) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND strpos(query, $1) > 0",
    )
    .bind(format!("weir:public.{table}"))
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_listen_connection_falls_back_to_polling_and_listens_again() {
    with_table("src_live_lost", |pool, table| async move {
        let t = quote_identifier(&table);
        exec(
            &pool,
            &format!("CREATE TABLE {t} (id int PRIMARY KEY, name text)"),
        )
        .await;
        exec(&pool, &format!("INSERT INTO {t} VALUES (1, 'one')")).await;
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let (rig, seen) = (Rig::new(), Seen::default());
        let options = TableSourceOptions::new(&table)
            .follow(true)
            .notify(true)
            .poll_interval(Duration::from_millis(300));
        let mut source = TableSource::connect(pool.clone(), options).await?;
        let driver = async {
            settles(&rig, &pool, &table, Duration::from_secs(10)).await;
            let before = listeners(&pool, &table).await;
            assert_eq!(before.len(), 1, "{before:?}");
            exec(
                &pool,
                &format!("SELECT pg_terminate_backend({})", before[0]),
            )
            .await;
            exec(&pool, &format!("INSERT INTO {t} VALUES (2, 'two')")).await;
            settles(&rig, &pool, &table, Duration::from_secs(1)).await;
            let start = Instant::now();
            loop {
                let now = listeners(&pool, &table).await;
                if now.len() == 1 && now != before {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "no new listener: {now:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            exec(&pool, &format!("UPDATE {t} SET name = 'uno' WHERE id = 1")).await;
            settles(&rig, &pool, &table, Duration::from_secs(1)).await;
            app.shutdown_handle().shutdown();
        };
        let (report, ()) = tokio::join!(consume(&app, &mut source, &rig, &seen), driver);
        report?;
        Ok(())
    })
    .await;
}
