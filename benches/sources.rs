//! Sources against hand-written baselines, measured in the same run:
//!
//! - **JetStream to PostgreSQL**: messages per second of
//!   `weir::connectors::nats::JetStreamSource` + `App::consume` into a
//!   PostgreSQL table target, against a raw async-nats pull consumer plus a
//!   batched `UNNEST` upsert that acknowledges after each batch (goal:
//!   weir ≥ 0.6× the baseline);
//! - **PostgreSQL table snapshot**: seconds to copy a table of 100k rows
//!   into another PostgreSQL table with `TableSource`, against client-side
//!   copying (one read, batched `UNNEST` inserts; no `INSERT … SELECT`).
//!
//! Needs the NATS server with JetStream at `WEIR_BENCH_NATS` (default
//! `nats://127.0.0.1:4222`) and PostgreSQL at `WEIR_BENCH_POSTGRES`
//! (default `postgres://postgres@127.0.0.1:5432/test`).
//! `WEIR_BENCH_MESSAGES` and `WEIR_BENCH_ROWS` set the sizes.
//!
//! Run with `cargo bench --bench sources`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

// As the `weir` command: weir allocates across many threads.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "shared/documents.rs"]
mod documents;
#[path = "sources/jetstream.rs"]
mod jetstream;
#[path = "sources/pg_snapshot.rs"]
mod pg_snapshot;

type BenchResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn bench() -> BenchResult<()> {
    let pg = std::env::var("WEIR_BENCH_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string());
    let messages = env_or("WEIR_BENCH_MESSAGES", 20_000);
    let rows = env_or("WEIR_BENCH_ROWS", 100_000);
    println!("| workload | weir | baseline | weir / baseline |");
    println!("|---|---:|---:|---:|");
    let (weir, raw) = jetstream::measure(messages, &pg).await?;
    println!(
        "| JetStream → PostgreSQL, {messages} messages (msg/s) | {weir:.0} | {raw:.0} | {:.2}× |",
        weir / raw
    );
    let (weir, copy) = pg_snapshot::measure(rows, &pg).await?;
    println!(
        "| PostgreSQL table snapshot, {rows} rows (s) | {weir:.2} | {copy:.2} | {:.2}× the time |",
        weir / copy
    );
    Ok(())
}

fn main() -> BenchResult<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench())
}
