//! The PostgreSQL server the tests run against, for the test files that
//! need one (`mod pg;`).
//!
//! The server is `WEIR_TEST_POSTGRES_URL`, else
//! `postgres://postgres@127.0.0.1:5432/test`, else
//! `postgres://root@127.0.0.1:5432/test`. When none answers, the tests print
//! `SKIPPED` and pass, except under `CI=true`, where they fail.

use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

/// The first server that answers: its URL and a pool of at most
/// `max_connections` on it. `Ok(None)` (after a loud message) when there is
/// none and `CI` is not `true`; `Err` when there is none under `CI=true`.
pub async fn server(max_connections: u32) -> Result<Option<(String, PgPool)>, String> {
    let urls: Vec<String> = match std::env::var("WEIR_TEST_POSTGRES_URL") {
        Ok(url) => vec![url],
        Err(_) => vec![
            "postgres://postgres@127.0.0.1:5432/test".into(),
            "postgres://root@127.0.0.1:5432/test".into(),
        ],
    };
    let mut last = String::new();
    for url in &urls {
        let connect = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(5))
            .connect(url);
        match tokio::time::timeout(Duration::from_secs(10), connect).await {
            Ok(Ok(pool)) => return Ok(Some((url.clone(), pool))),
            Ok(Err(e)) => last = format!("{url}: {e}"),
            Err(_) => last = format!("{url}: timed out"),
        }
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        return Err(format!("no PostgreSQL server for the tests ({last})"));
    }
    eprintln!("SKIPPED: no PostgreSQL server ({last}); set WEIR_TEST_POSTGRES_URL");
    Ok(None)
}

/// A name no other test (of this process, or another) uses: for tables,
/// groups and databases in the shared test database.
#[allow(dead_code)] // Not every test binary that shares this module uses it.
pub fn unique(test: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!(
        "{test}_{:x}_{:x}_{}",
        std::process::id(),
        nanos,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
