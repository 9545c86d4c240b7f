//! `weir sync SOURCE` with a PostgreSQL table or a NATS JetStream stream
//! as SOURCE, end to end: the real `weir` binary against the real
//! PostgreSQL server and the real NATS server (127.0.0.1:4222). Each item
//! becomes a row of `records` (`key`, `value`, `source`, `position`).

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli;
mod cmd;
mod nats;
mod pg;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use sqlx::{PgPool, SqlitePool};

use cli::{exits, ok, Env, PgDatabase, TestResult};
use nats::server::NatsServer;
use nats::TestStream;

/// `key → value` of the records table of a SQLite database.
async fn sqlite_records(env: &Env) -> BTreeMap<String, serde_json::Value> {
    let Ok(pool) = SqlitePool::connect(&format!("sqlite://{}", env.db.display())).await else {
        return BTreeMap::new(); // not created yet
    };
    let rows: Vec<(String, String)> = sqlx::query_as("SELECT key, value FROM records")
        .fetch_all(&pool)
        .await
        .unwrap_or_default();
    pool.close().await;
    rows.into_iter()
        .map(|(k, v)| (k, serde_json::from_str(&v).unwrap()))
        .collect()
}

/// `key → (value, position)` of a PostgreSQL records table.
async fn pg_records(pool: &PgPool, table: &str) -> BTreeMap<String, (serde_json::Value, String)> {
    let rows: Vec<(String, serde_json::Value, Option<String>)> =
        sqlx::query_as(&format!("SELECT key, value, position FROM {table}"))
            .fetch_all(pool)
            .await
            .unwrap_or_default();
    rows.into_iter()
        .map(|(k, v, p)| (k, (v, p.unwrap_or_default())))
        .collect()
}

/// `key → value` of the records table `table` in PostgreSQL.
async fn pg_values(pool: &PgPool, table: &str) -> BTreeMap<String, serde_json::Value> {
    pg_records(pool, table)
        .await
        .into_iter()
        .map(|(k, (v, _))| (k, v))
        .collect()
}

/// `id → name` as the records of the `orders` table should hold them.
fn orders(rows: &[(i32, &str)]) -> BTreeMap<String, serde_json::Value> {
    rows.iter()
        .map(|(id, name)| {
            (
                id.to_string(),
                serde_json::json!({ "id": id, "name": name }),
            )
        })
        .collect()
}

/// The records with the `updated_at` of their value left out.
fn without_times(
    records: BTreeMap<String, serde_json::Value>,
) -> BTreeMap<String, serde_json::Value> {
    records
        .into_iter()
        .map(|(k, mut v)| {
            if let Some(o) = v.as_object_mut() {
                o.remove("updated_at");
            }
            (k, v)
        })
        .collect()
}

async fn make_orders(pool: &PgPool) {
    sqlx::raw_sql(
        "CREATE TABLE orders (id int PRIMARY KEY, name text NOT NULL, \
         updated_at timestamptz NOT NULL DEFAULT clock_timestamp()); \
         INSERT INTO orders (id, name) VALUES (1, 'one'), (2, 'two'), (3, 'three');",
    )
    .execute(pool)
    .await
    .unwrap();
}

async fn change_orders(pool: &PgPool) {
    sqlx::raw_sql(
        "INSERT INTO orders (id, name) VALUES (4, 'four'); \
         UPDATE orders SET name = 'TWO', updated_at = clock_timestamp() WHERE id = 2; \
         DELETE FROM orders WHERE id = 3;",
    )
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn a_table_synced_then_changed_and_synced_again_leaves_the_records_exact() -> TestResult {
    PgDatabase::around("src_snapshot", async |pg: &PgDatabase| {
        let pool = PgPool::connect(&pg.url).await?;
        make_orders(&pool).await;
        let env = Env::new();
        let source = format!("{}?table=orders", pg.url);
        let out = ok(&env.sync_source(&source, &env.url_arg(), &[]));
        assert!(out.contains("synced 3 items"), "{out}");
        assert_eq!(
            without_times(sqlite_records(&env).await),
            orders(&[(1, "one"), (2, "two"), (3, "three")])
        );
        change_orders(&pool).await;
        let out = ok(&env.sync_source(&source, &env.url_arg(), &[]));
        assert!(out.contains("1 created, 1 updated, 1 deleted"), "{out}");
        assert_eq!(
            without_times(sqlite_records(&env).await),
            orders(&[(1, "one"), (2, "TWO"), (4, "four")])
        );
        let out = ok(&env.sync_source(&source, &env.url_arg(), &[]));
        assert!(out.contains("0 created, 0 updated, 0 deleted"), "{out}");
        pool.close().await;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn a_table_synced_by_its_ordinal_column_into_postgres_is_exact_after_changes() -> TestResult {
    PgDatabase::around("src_ordinal", async |pg: &PgDatabase| {
        let pool = PgPool::connect(&pg.url).await?;
        make_orders(&pool).await;
        let env = Env::new();
        let source = format!("{}?table=orders&ordinal=updated_at", pg.url);
        let into = &pg.url;
        ok(&env.sync_source(&source, into, &["--table", "order_copy"]));
        change_orders(&pool).await;
        let out = ok(&env.sync_source(&source, into, &["--table", "order_copy"]));
        assert!(out.contains("1 created, 1 updated, 1 deleted"), "{out}");
        let copy: BTreeMap<String, serde_json::Value> = pg_records(&pool, "order_copy")
            .await
            .into_iter()
            .map(|(k, (v, _))| (k, v))
            .collect();
        assert_eq!(
            without_times(copy),
            orders(&[(1, "one"), (2, "TWO"), (4, "four")])
        );
        pool.close().await;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn a_bad_table_or_column_is_an_error_naming_it() -> TestResult {
    PgDatabase::around("src_bad_names", async |pg: &PgDatabase| {
        let pool = PgPool::connect(&pg.url).await?;
        make_orders(&pool).await;
        let env = Env::new();
        let out = env.sync_source(&format!("{}?table=orderz", pg.url), &env.url_arg(), &[]);
        assert!(exits(&out, 2).contains("orderz"));
        let out = env.sync_source(
            &format!("{}?table=orders&ordinal=changed_at", pg.url),
            &env.url_arg(),
            &[],
        );
        assert!(exits(&out, 2).contains("changed_at"));
        pool.close().await;
        Ok(())
    })
    .await
}

#[test]
fn a_worker_group_with_a_table_source_is_refused_with_what_to_do() {
    let env = Env::new();
    let out = env.sync_source(
        "postgres://postgres@127.0.0.1:5432/test?table=orders",
        "postgres://postgres@127.0.0.1:5432/test",
        &["--group", "g"],
    );
    let err = exits(&out, 2);
    assert!(
        err.contains("worker group g") && err.contains("App::consume"),
        "{err}"
    );
}

/// Starts member `n` of group `group` (4 partitions, a lease TTL of 3 s)
/// syncing `source` into `into`, with a ledger of its own.
fn start_member(env: &Env, source: &str, into: &str, group: &str, n: usize) -> cmd::Running {
    let ledger = env.tmp.path().join(format!("ledger-{n}"));
    let member = format!("member-{n}");
    let args = [
        "sync",
        source,
        "--into",
        into,
        "--ledger",
        ledger.to_str().unwrap(),
        "--group",
        group,
        "--partitions",
        "4",
        "--lease-ttl",
        "3",
        "--member-id",
        &member,
    ];
    cmd::Running(cmd::spawn(env.tmp.path(), &args, None))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_of_a_group_sync_a_stream_and_every_key_lands_once_with_its_latest_payload(
) -> TestResult {
    PgDatabase::around("src_group", async |pg: &PgDatabase| {
        let pool = PgPool::connect(&pg.url).await?;
        let s = TestStream::new("group").await;
        let msgs = messages(2_000, 200);
        s.publish_all(&msgs).await;
        let env = Env::new();
        let members: Vec<cmd::Running> = (0..2)
            .map(|n| start_member(&env, &s.url(), &pg.url, "streams", n))
            .collect();
        for mut m in members {
            let status = cmd::wait_for_exit(&mut m.0, cmd::COMMAND_LIMIT);
            let mut err = String::new();
            if let Some(mut stderr) = m.0.stderr.take() {
                std::io::Read::read_to_string(&mut stderr, &mut err)?;
            }
            assert_eq!(status.and_then(|s| s.code()), Some(0), "{err}");
        }
        let records = pg_values(&pool, "records").await;
        assert_eq!(records, expected(&msgs));
        // Each partition's consumer read the stream to its end.
        for p in 0..4 {
            let info = s.consumer_info(&format!("weir-p{p}")).await;
            assert_eq!((info.num_pending, info.num_ack_pending), (0, 0), "p{p}");
        }
        s.delete().await;
        pool.close().await;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn live_mode_picks_up_a_table_change_within_a_second() -> TestResult {
    PgDatabase::around("src_live", async |pg: &PgDatabase| {
        let pool = PgPool::connect(&pg.url).await?;
        make_orders(&pool).await;
        let env = Env::new();
        let source = format!("{}?table=orders&ordinal=updated_at&notify=1", pg.url);
        let mut child = cmd::Running(env.spawn_source(&source, &env.url_arg(), &["--live"]));
        let first = cli::wait_until(Duration::from_secs(60), || async {
            sqlite_records(&env).await.len() == 3
        })
        .await;
        assert!(first, "the first listing never landed");
        sqlx::query("INSERT INTO orders (id, name) VALUES (5, 'five')")
            .execute(&pool)
            .await?;
        let inserted = Instant::now();
        let landed = cli::wait_until(Duration::from_secs(10), || async {
            sqlite_records(&env).await.contains_key("5")
        })
        .await;
        let latency = inserted.elapsed();
        let (status, output) = child.terminate(Duration::from_secs(30));
        assert!(landed, "the insert never landed: {output}");
        assert!(
            latency < Duration::from_secs(1),
            "the insert took {latency:?} to land"
        );
        assert_eq!(status.and_then(|s| s.code()), Some(130), "{output}");
        pool.close().await;
        Ok(())
    })
    .await
}

/// What the records should hold after `messages`: each key's last message,
/// unless it is a tombstone.
fn expected(messages: &[(String, Option<String>)]) -> BTreeMap<String, serde_json::Value> {
    let mut last = BTreeMap::new();
    for (k, p) in messages {
        last.insert(k.clone(), p.clone());
    }
    last.into_iter()
        .filter_map(|(k, p)| Some((k, serde_json::from_str(&p?).unwrap())))
        .collect()
}

/// `n` messages over `keys` keys; every 7th message of a key from the
/// second round on is a tombstone.
fn messages(n: usize, keys: usize) -> Vec<(String, Option<String>)> {
    (0..n)
        .map(|i| {
            let key = format!("k{}", i % keys);
            let round = i / keys;
            let payload = (round == 0 || i % 7 != 0).then(|| format!(r#"{{"i":{i}}}"#));
            (key, payload)
        })
        .collect()
}

#[tokio::test]
async fn a_stream_syncs_to_its_last_message_then_exits_and_a_replay_changes_no_row() -> TestResult {
    let s = TestStream::new("replay").await;
    let msgs = messages(300, 40);
    for (k, p) in &msgs {
        s.publish_change(k, p.as_deref()).await;
    }
    s.publish_change("plain", Some("not json")).await;
    let env = Env::new();
    let out = ok(&env.sync_source(&s.url(), &env.url_arg(), &[]));
    assert!(out.contains("301 acknowledged"), "{out}");
    let mut want = expected(&msgs);
    want.insert("plain".into(), serde_json::json!("not json"));
    assert_eq!(sqlite_records(&env).await, want);
    let info = s.consumer_info("weir").await;
    assert_eq!((info.num_pending, info.num_ack_pending), (0, 0));
    // The whole stream again, through a new consumer: nothing changes.
    let out = ok(&env.sync_source(&s.url(), &env.url_arg(), &["--consumer", "again"]));
    assert!(out.contains("0 created, 0 updated, 0 deleted"), "{out}");
    assert_eq!(sqlite_records(&env).await, want);
    s.delete().await;
    Ok(())
}

#[tokio::test]
async fn a_sync_killed_mid_stream_and_restarted_leaves_every_row_once_and_no_tombstone_lost(
) -> TestResult {
    PgDatabase::around("src_kill", async |pg: &PgDatabase| {
        let pool = PgPool::connect(&pg.url).await?;
        let s = TestStream::new("kill").await;
        let msgs = messages(10_000, 1_000);
        s.publish_all(&msgs).await;
        let env = Env::new();
        let mut child = cmd::Running(env.spawn_source(&s.url(), &pg.url, &[]));
        let started = cli::wait_until(Duration::from_secs(60), || async {
            s.ack_floor("weir").await > 2_000
        })
        .await;
        child.kill();
        assert!(started, "the sync never got going");
        let out = ok(&env.sync_source(&s.url(), &pg.url, &[]));
        assert!(out.contains(" 0 dead-lettered"), "{out}");
        let records = pg_values(&pool, "records").await;
        assert_eq!(records, expected(&msgs));
        let info = s.consumer_info("weir").await;
        assert_eq!((info.num_pending, info.num_ack_pending), (0, 0));
        s.delete().await;
        pool.close().await;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn no_message_is_acknowledged_before_its_row_is_committed() -> TestResult {
    PgDatabase::around("src_no_early_ack", async |pg: &PgDatabase| {
        let pool = PgPool::connect(&pg.url).await?;
        let s = TestStream::new("early_ack").await;
        // Upserts only: each key's row must hold at least the last message
        // acknowledged for it.
        let msgs: Vec<(String, Option<String>)> = (0..6_000)
            .map(|i| (format!("k{}", i % 500), Some(format!(r#"{{"i":{i}}}"#))))
            .collect();
        s.publish_all(&msgs).await;
        let env = Env::new();
        let mut child = cmd::Running(env.spawn_source(&s.url(), &pg.url, &[]));
        let going = cli::wait_until(Duration::from_secs(60), || async {
            s.ack_floor("weir").await > 500
        })
        .await;
        assert!(going, "the sync never got going");
        // The target stops taking writes.
        sqlx::query("ALTER TABLE records ADD CONSTRAINT stopped CHECK (false) NOT VALID")
            .execute(&pool)
            .await?;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let floor = s.ack_floor("weir").await;
        let rows = pg_records(&pool, "records").await;
        for (seq, (k, _)) in msgs.iter().enumerate().take(floor as usize) {
            let seq = seq as u64 + 1;
            let (_, position) = rows.get(k).unwrap_or_else(|| {
                panic!("message {seq} was acknowledged, its key {k} has no row")
            });
            let position: u64 = position.parse().unwrap();
            assert!(
                position >= seq,
                "message {seq} was acknowledged, but {k}'s row holds message {position}"
            );
        }
        sqlx::query("ALTER TABLE records DROP CONSTRAINT stopped")
            .execute(&pool)
            .await?;
        let (status, output) = child.terminate(Duration::from_secs(120));
        let code = status.and_then(|s| s.code());
        assert!(matches!(code, Some(0 | 130)), "{code:?}: {output}");
        ok(&env.sync_source(&s.url(), &pg.url, &[]));
        let records = pg_values(&pool, "records").await;
        assert_eq!(records, expected(&msgs));
        s.delete().await;
        pool.close().await;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn credentials_in_the_url_connect_and_wrong_ones_are_an_error_hiding_the_password(
) -> TestResult {
    let server = NatsServer::start(&["--user", "weir", "--pass", "s3cret"].map(OsStr::new));
    // Listening already: `start` waited.
    let options =
        async_nats::ConnectOptions::with_user_and_password("weir".into(), "s3cret".into());
    let js = jetstream::new(options.connect(server.url("")).await?);
    js.create_stream(stream::Config {
        name: "AUTH".into(),
        subjects: vec!["auth.>".into()],
        ..Default::default()
    })
    .await?;
    js.publish("auth.k1", r#"{"a":1}"#.into()).await?.await?;
    let env = Env::new();
    let good = format!("{}/AUTH", server.url("weir:s3cret@"));
    let out = ok(&env.sync_source(&good, &env.url_arg(), &[]));
    assert!(out.contains("1 acknowledged"), "{out}");
    assert_eq!(
        sqlite_records(&env).await,
        BTreeMap::from([("k1".to_string(), serde_json::json!({"a": 1}))])
    );
    let bad = format!("{}/AUTH", server.url("weir:wrong-pass@"));
    let err = exits(&env.sync_source(&bad, &env.url_arg(), &[]), 2);
    assert!(err.contains(&format!("127.0.0.1:{}", server.port)), "{err}");
    assert!(!err.contains("wrong-pass"), "the password shows: {err}");
    drop(server);
    Ok(())
}

#[tokio::test]
async fn a_credentials_file_connects_to_a_server_of_signed_users_and_a_missing_one_is_an_error_naming_it(
) -> TestResult {
    let server = nats::server::SecuredServer::start();
    let signed = async_nats::ConnectOptions::with_credentials_file(&server.creds).await?;
    let js = jetstream::new(signed.connect(&server.url).await?);
    js.create_stream(stream::Config {
        name: "SIGNED".into(),
        subjects: vec!["signed.>".into()],
        ..Default::default()
    })
    .await?;
    js.publish("signed.k1", r#"{"a":1}"#.into()).await?.await?;
    let env = Env::new();
    let source = format!("{}/SIGNED", server.url);
    let creds = server.creds.display().to_string();

    let out = ok(&env.sync_source(&source, &env.url_arg(), &["--creds", &creds]));
    assert!(out.contains("1 acknowledged"), "{out}");
    assert_eq!(
        sqlite_records(&env).await,
        BTreeMap::from([("k1".to_string(), serde_json::json!({"a": 1}))])
    );

    // Without the file the server refuses the connection.
    let err = exits(&env.sync_source(&source, &env.url_arg(), &[]), 2);
    assert!(err.contains(&server.url.replace("nats://", "")), "{err}");
    let missing = env.tmp.path().join("nobody.creds").display().to_string();
    let err = exits(
        &env.sync_source(&source, &env.url_arg(), &["--creds", &missing]),
        2,
    );
    assert!(err.contains(&missing), "{err}");
    Ok(())
}
