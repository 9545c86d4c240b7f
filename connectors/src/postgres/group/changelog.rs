//! A partition's changelog: fenced appends, the restore of its ledger
//! (the snapshot, then the log after it), and compaction.
//!
//! Each append takes one number from `weir.changelog_seq`; its entries are
//! numbered by their place in it (`pos`), so `(seq, pos)` orders every
//! entry of a partition. The snapshot holds the latest record of each
//! component folded from the log; a compaction keeps in the log only the
//! intents that no later record or removal of their component collapsed,
//! and those are the only rows of the log older than a snapshot row of
//! their component. So restoring reads the snapshot, then applies the log
//! in order.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use sqlx::PgPool;
use weir_actors::group::{Epoch, LogEntry, Restored};
use weir_actors::{PartitionId, Result};

use super::lease::begin_fenced;

/// `kind` of a component's whole record.
const RECORD: i16 = 1;
/// `kind` of a component's removal (its `entry` is empty).
const REMOVED: i16 = 2;
/// `kind` of intents about to be acted on.
const INTENTS: i16 = 3;

/// Appends `entries`, in order, if `epoch` is still the partition's.
pub(super) async fn append(
    pool: &PgPool,
    group: &str,
    ttl: Option<Duration>,
    (partition, epoch): (PartitionId, Epoch),
    entries: Vec<LogEntry>,
) -> Result<()> {
    let mut tx = begin_fenced(pool, group, ttl, &[(partition, epoch)]).await?;
    if !entries.is_empty() {
        let mut kinds = Vec::with_capacity(entries.len());
        let mut components = Vec::with_capacity(entries.len());
        let mut payloads = Vec::with_capacity(entries.len());
        for entry in entries {
            let (kind, component, payload) = match entry {
                LogEntry::Record { component, record } => (RECORD, component, record),
                LogEntry::Removed { component } => (REMOVED, component, Vec::new()),
                LogEntry::Intents { component, intents } => (INTENTS, component, intents),
            };
            kinds.push(kind);
            components.push(component);
            payloads.push(payload);
        }
        sqlx::query(
            "WITH s AS (SELECT nextval('weir.changelog_seq') AS seq)
             INSERT INTO weir.changelog (group_name, partition, seq, pos, kind, component, entry)
             SELECT $1, $2, s.seq, e.pos::integer, e.kind, e.component, e.entry
               FROM s, unnest($3::smallint[], $4::bytea[], $5::bytea[])
                       WITH ORDINALITY AS e(kind, component, entry, pos)",
        )
        .bind(group)
        .bind(partition.as_i32())
        .bind(&kinds)
        .bind(&components)
        .bind(&payloads)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Reads the partition's snapshot and log (one consistent view) and folds
/// them into its ledger.
pub(super) async fn restore(
    pool: &PgPool,
    group: &str,
    partition: PartitionId,
) -> Result<Restored> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let snapshot: Vec<(Vec<u8>, Vec<u8>)> = sqlx::query_as(
        "SELECT component, record FROM weir.snapshot WHERE group_name = $1 AND partition = $2",
    )
    .bind(group)
    .bind(partition.as_i32())
    .fetch_all(&mut *tx)
    .await?;
    let log: Vec<(i16, Vec<u8>, Vec<u8>)> = sqlx::query_as(
        "SELECT kind, component, entry FROM weir.changelog
          WHERE group_name = $1 AND partition = $2 ORDER BY seq, pos",
    )
    .bind(group)
    .bind(partition.as_i32())
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(fold(snapshot, log))
}

/// The ledger of a snapshot and the log after it: the latest record of
/// each component (removed ones left out), and the intents appended after
/// their component's latest record or removal, in append order.
fn fold(snapshot: Vec<(Vec<u8>, Vec<u8>)>, log: Vec<(i16, Vec<u8>, Vec<u8>)>) -> Restored {
    let rows = u64::try_from(snapshot.len() + log.len()).unwrap_or(u64::MAX);
    let mut latest: BTreeMap<Vec<u8>, Option<Vec<u8>>> = snapshot
        .into_iter()
        .map(|(component, record)| (component, Some(record)))
        .collect();
    let mut intents: Vec<Option<(Vec<u8>, Vec<u8>)>> = Vec::new();
    let mut pending: HashMap<Vec<u8>, Vec<usize>> = HashMap::new();
    for (kind, component, entry) in log {
        if kind == INTENTS {
            pending
                .entry(component.clone())
                .or_default()
                .push(intents.len());
            intents.push(Some((component, entry)));
            continue;
        }
        for collapsed in pending.remove(&component).unwrap_or_default() {
            if let Some(slot) = intents.get_mut(collapsed) {
                *slot = None;
            }
        }
        latest.insert(component, (kind == RECORD).then_some(entry));
    }
    let records = latest
        .into_iter()
        .filter_map(|(component, record)| Some((component, record?)))
        .collect();
    Restored::new(records, intents.into_iter().flatten().collect(), rows)
}

/// Folds the log into the snapshot, in one statement (one view of the
/// log): the latest record or removal of each component replaces its
/// snapshot row or deletes it, and the log keeps only the intents no
/// record or removal collapsed.
const FOLD: &str = "WITH latest AS (
        SELECT DISTINCT ON (component) component, seq, pos, kind, entry
          FROM weir.changelog
         WHERE group_name = $1 AND partition = $2 AND kind IN (1, 2)
         ORDER BY component, seq DESC, pos DESC),
     removed AS (
        DELETE FROM weir.snapshot s USING latest l
         WHERE s.group_name = $1 AND s.partition = $2
           AND s.component = l.component AND l.kind = 2),
     folded AS (
        INSERT INTO weir.snapshot (group_name, partition, component, seq, pos, record)
        SELECT $1, $2, component, seq, pos, entry FROM latest WHERE kind = 1
        ON CONFLICT (group_name, partition, component) DO UPDATE
           SET seq = EXCLUDED.seq, pos = EXCLUDED.pos, record = EXCLUDED.record)
     DELETE FROM weir.changelog c
      WHERE c.group_name = $1 AND c.partition = $2
        AND (c.kind IN (1, 2)
             OR EXISTS (SELECT 1 FROM latest l
                         WHERE l.component = c.component AND (l.seq, l.pos) > (c.seq, c.pos)))";

/// The rows of the partition's log and snapshot.
async fn rows(conn: &mut sqlx::PgConnection, group: &str, partition: i32) -> Result<(i64, i64)> {
    Ok(sqlx::query_as(
        "SELECT (SELECT count(*) FROM weir.changelog WHERE group_name = $1 AND partition = $2),
                (SELECT count(*) FROM weir.snapshot WHERE group_name = $1 AND partition = $2)",
    )
    .bind(group)
    .bind(partition)
    .fetch_one(conn)
    .await?)
}

/// Folds the log into the snapshot when it holds more rows than the
/// snapshot and at least `min_rows`, if `epoch` is still the partition's;
/// the rows of the partition's changelog after it.
pub(super) async fn compact(
    pool: &PgPool,
    group: &str,
    ttl: Option<Duration>,
    (partition, epoch): (PartitionId, Epoch),
    min_rows: u64,
) -> Result<u64> {
    let mut tx = begin_fenced(pool, group, ttl, &[(partition, epoch)]).await?;
    let id = partition.as_i32();
    let (log, snapshot) = rows(&mut tx, group, id).await?;
    let due = log > snapshot && u64::try_from(log).is_ok_and(|log| log >= min_rows);
    let (log, snapshot) = if due {
        sqlx::query(FOLD)
            .bind(group)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        rows(&mut tx, group, id).await?
    } else {
        (log, snapshot)
    };
    tx.commit().await?;
    Ok(u64::try_from(log + snapshot).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    #[test]
    fn the_latest_record_wins_and_a_removal_drops_the_component() {
        let snapshot = vec![(b("a"), b("a0")), (b("c"), b("c0"))];
        let log = vec![
            (RECORD, b("a"), b("a1")),
            (RECORD, b("b"), b("b1")),
            (REMOVED, b("c"), Vec::new()),
            (RECORD, b("a"), b("a2")),
        ];
        let restored = fold(snapshot, log);
        assert_eq!(restored.records, vec![(b("a"), b("a2")), (b("b"), b("b1"))]);
        assert!(restored.intents.is_empty());
        assert_eq!(restored.rows, 6);
    }

    #[test]
    fn intents_are_pending_until_a_later_record_or_removal_of_their_component() {
        let log = vec![
            (INTENTS, b("a"), b("i1")),
            (INTENTS, b("b"), b("i2")),
            (RECORD, b("a"), b("a1")),
            (INTENTS, b("c"), b("i3")),
            (INTENTS, b("a"), b("i4")),
            (REMOVED, b("c"), Vec::new()),
        ];
        let restored = fold(Vec::new(), log);
        assert_eq!(restored.records, vec![(b("a"), b("a1"))]);
        assert_eq!(restored.intents, vec![(b("b"), b("i2")), (b("a"), b("i4"))]);
    }
}
