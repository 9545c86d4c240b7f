//! Live mode: waking up when the table may have changed, by
//! `LISTEN`/`NOTIFY` (with the trigger weir installs when asked) or by
//! polling.

use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use weir_actors::Result;

use super::catalog::Table;
use crate::sql::quote_identifier;

/// How long a notification waits for those that follow it (one statement
/// each), so that a burst of statements costs one check.
const DEBOUNCE: Duration = Duration::from_millis(75);

/// The name of the trigger (on the table) and of the trigger function (in
/// the table's schema, shared by its tables).
pub(super) const TRIGGER: &str = "weir_notify";
const TRIGGER_FUNCTION: &str = "weir_notify_change";

/// The channel of a table, as SQL of its schema's and table's names:
/// `weir:<schema>.<table>`, or `weir:` and the MD5 of `<schema>.<table>`
/// when that is longer than 63 bytes (the longest channel name).
fn channel_sql(schema: &str, table: &str) -> String {
    let name = format!("{schema} || '.' || {table}");
    format!("CASE WHEN octet_length('weir:' || {name}) <= 63 THEN 'weir:' || {name} ELSE 'weir:' || md5({name}) END")
}

/// The notification channel of `table`.
pub(super) async fn channel(pool: &PgPool, table: &Table) -> Result<String> {
    let sql = format!("SELECT {}", channel_sql("$1", "$2"));
    Ok(sqlx::query_scalar(&sql)
        .bind(&table.schema)
        .bind(&table.name)
        .fetch_one(pool)
        .await?)
}

/// Installs (or installs again: it is idempotent) the statement trigger
/// that notifies the table's channel after each insert, update, delete or
/// truncate.
pub(super) async fn install_trigger(pool: &PgPool, table: &Table) -> Result<()> {
    if !table.is_table {
        return Err(weir_actors::Error::permanent(format!(
            "`{}` is a view or a foreign table: it cannot have the trigger that notifies weir; follow it by polling (TableSourceOptions::notify(false))",
            table.display()
        )));
    }
    let function = format!(
        "{}.{}",
        quote_identifier(&table.schema),
        quote_identifier(TRIGGER_FUNCTION)
    );
    let trigger = quote_identifier(TRIGGER);
    let channel = channel_sql("TG_TABLE_SCHEMA", "TG_TABLE_NAME");
    let statements = [
        // Concurrent `CREATE OR REPLACE` of one function can fail: one at a time.
        "SELECT pg_advisory_xact_lock(hashtext('weir.postgres.source.trigger'))".to_string(),
        format!(
            "CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $weir$ \
             BEGIN PERFORM pg_notify({channel}, ''); RETURN NULL; END $weir$"
        ),
        format!("DROP TRIGGER IF EXISTS {trigger} ON {}", table.quoted()),
        format!(
            "CREATE TRIGGER {trigger} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {} \
             FOR EACH STATEMENT EXECUTE FUNCTION {function}()",
            table.quoted()
        ),
    ];
    let mut tx = pool.begin().await?;
    for sql in statements {
        sqlx::query(&sql).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// When to check the table for a change: at each poll interval, and, with
/// a listener, soon after a notification or a lost connection.
pub(super) struct Watch {
    pool: PgPool,
    poll_interval: Duration,
    /// The channel listened to, with `notify`.
    channel: Option<String>,
    listener: Option<PgListener>,
    /// A notification arrived (or notifications may have been lost): check
    /// at once. Set before any wait that may be cancelled, so that a
    /// dropped wait loses nothing.
    woken: bool,
}

impl Watch {
    /// Polls every `poll_interval`, and listens on `channel` when given.
    ///
    /// # Errors
    /// When the listener cannot connect or listen.
    pub async fn new(
        pool: PgPool,
        poll_interval: Duration,
        channel: Option<String>,
    ) -> Result<Self> {
        let listener = match &channel {
            Some(channel) => Some(listen(&pool, channel).await?),
            None => None,
        };
        Ok(Self {
            pool,
            poll_interval,
            channel,
            listener,
            woken: false,
        })
    }

    /// Waits until the table should be checked. Cancel-safe.
    pub async fn wait(&mut self, source: &str) {
        if std::mem::take(&mut self.woken) {
            return;
        }
        let poll = self.poll_interval;
        let Some(listener) = self.listener.as_mut() else {
            tokio::time::sleep(poll).await;
            self.reconnect(source).await;
            return;
        };
        let woke = tokio::select! {
            received = listener.try_recv() => Some(received),
            () = tokio::time::sleep(poll) => None,
        };
        match woke {
            Some(Ok(Some(_))) => self.debounce().await,
            // Reconnected: what was notified meanwhile is lost.
            Some(Ok(None)) => tracing::warn!(
                source,
                "the LISTEN connection was lost and made again; checking the table"
            ),
            Some(Err(e)) => {
                tracing::warn!(
                    source,
                    "the LISTEN connection is lost ({e}); polling every {poll:?} until it is back"
                );
                self.listener = None;
            }
            None => {}
        }
    }

    /// Lets the notifications of a burst of statements arrive, then drops
    /// them: one check covers them all.
    async fn debounce(&mut self) {
        self.woken = true;
        tokio::time::sleep(DEBOUNCE).await;
        if let Some(listener) = self.listener.as_mut() {
            while listener.next_buffered().is_some() {}
        }
        self.woken = false;
    }

    /// Listens again after the connection was lost (with `notify`).
    async fn reconnect(&mut self, source: &str) {
        let Some(channel) = &self.channel else {
            return;
        };
        match listen(&self.pool, channel).await {
            Ok(listener) => {
                tracing::info!(source, "listening to notifications again");
                self.listener = Some(listener);
            }
            Err(e) => tracing::warn!(source, "listening to notifications failed again: {e}"),
        }
    }
}

async fn listen(pool: &PgPool, channel: &str) -> Result<PgListener> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    Ok(listener)
}
