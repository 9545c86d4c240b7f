//! The coordinator's tables, in schema `weir`: created once per
//! coordinator, on first use, under an advisory lock so that members
//! starting together do not race on `CREATE ... IF NOT EXISTS`.
//!
//! Every table is keyed by the group's name first; a partition is an
//! `integer`, the root partition being `-1` (see
//! [`PartitionId::as_i32`](weir_actors::PartitionId::as_i32)). No foreign
//! keys: a foreign key check would take a lock on the group's row, which
//! the assignment holds; [`drop_group`](super::PostgresCoordinator)
//! deletes from every table instead.

use sqlx::PgPool;
use weir_actors::Result;

/// The advisory lock key of the migration (`weirgrp1` in ASCII).
const MIGRATION_LOCK: i64 = 0x7765_6972_6772_7031;

/// Every object the coordinator uses: when they all exist, nothing is run.
const OBJECTS: &[&str] = &[
    "weir.worker_group",
    "weir.member",
    "weir.partition",
    "weir.fence",
    "weir.fence_intent",
    "weir.partition_pass",
    "weir.changelog",
    "weir.snapshot",
    "weir.pass_seq",
    "weir.incarnation_seq",
    "weir.changelog_seq",
    "weir.epoch_seq",
];

/// The DDL, in order; each statement is idempotent.
const DDL: &[&str] = &[
    "CREATE SCHEMA IF NOT EXISTS weir",
    // A group: its partition count and lease TTL, fixed at creation.
    "CREATE TABLE IF NOT EXISTS weir.worker_group (
        group_name text PRIMARY KEY,
        partitions integer NOT NULL CHECK (partitions > 0),
        lease_ttl_ms bigint NOT NULL CHECK (lease_ttl_ms > 0),
        created timestamptz NOT NULL DEFAULT now())",
    // A membership: live while `expires_at` (the database's clock) is in
    // the future. A join takes a new incarnation, so that the leases of an
    // expired membership do not come back with a new one of the same id.
    "CREATE TABLE IF NOT EXISTS weir.member (
        group_name text NOT NULL,
        member_id text NOT NULL,
        incarnation bigint NOT NULL,
        host text NOT NULL,
        joined_at timestamptz NOT NULL,
        expires_at timestamptz NOT NULL,
        PRIMARY KEY (group_name, member_id))",
    // Who owns a partition (its lease is the owner's membership, of that
    // incarnation), and who the assignment gives it to.
    "CREATE TABLE IF NOT EXISTS weir.partition (
        group_name text NOT NULL,
        partition integer NOT NULL,
        owner text,
        owner_incarnation bigint,
        target text,
        PRIMARY KEY (group_name, partition))",
    // The epoch: locked `FOR SHARE` by writers, updated by a takeover only.
    "CREATE TABLE IF NOT EXISTS weir.fence (
        group_name text NOT NULL,
        partition integer NOT NULL,
        epoch bigint NOT NULL,
        PRIMARY KEY (group_name, partition))",
    // The epoch a takeover is about to take: read by writers, never locked.
    "CREATE TABLE IF NOT EXISTS weir.fence_intent (
        group_name text NOT NULL,
        partition integer NOT NULL,
        pending_epoch bigint NOT NULL,
        PRIMARY KEY (group_name, partition))",
    "CREATE TABLE IF NOT EXISTS weir.partition_pass (
        group_name text NOT NULL,
        partition integer NOT NULL,
        running_pass bigint,
        completed_pass bigint,
        PRIMARY KEY (group_name, partition))",
    // The log: one `seq` per append, `pos` the entry's place in it. `kind`
    // is 1 (a record), 2 (a removal) or 3 (intents).
    "CREATE TABLE IF NOT EXISTS weir.changelog (
        group_name text NOT NULL,
        partition integer NOT NULL,
        seq bigint NOT NULL,
        pos integer NOT NULL,
        kind smallint NOT NULL CHECK (kind IN (1, 2, 3)),
        component bytea NOT NULL,
        entry bytea NOT NULL,
        PRIMARY KEY (group_name, partition, seq, pos))",
    // The latest record of each component, folded from the log, with the
    // place in the log it came from.
    "CREATE TABLE IF NOT EXISTS weir.snapshot (
        group_name text NOT NULL,
        partition integer NOT NULL,
        component bytea NOT NULL,
        seq bigint NOT NULL,
        pos integer NOT NULL,
        record bytea NOT NULL,
        PRIMARY KEY (group_name, partition, component))",
    "CREATE SEQUENCE IF NOT EXISTS weir.pass_seq",
    "CREATE SEQUENCE IF NOT EXISTS weir.incarnation_seq",
    "CREATE SEQUENCE IF NOT EXISTS weir.changelog_seq",
    "CREATE SEQUENCE IF NOT EXISTS weir.epoch_seq",
];

/// Creates what is missing of the coordinator's schema. When everything
/// exists (the usual case) this is one query and needs no privilege to
/// create anything.
pub(super) async fn migrate(pool: &PgPool) -> Result<()> {
    let names: Vec<&str> = OBJECTS.to_vec();
    let present: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM unnest($1::text[]) n WHERE to_regclass(n) IS NOT NULL",
    )
    .bind(&names)
    .fetch_one(pool)
    .await?;
    if usize::try_from(present).is_ok_and(|n| n == OBJECTS.len()) {
        return Ok(());
    }
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *tx)
        .await?;
    for statement in DDL {
        sqlx::query(statement).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}
