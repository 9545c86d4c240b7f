//! Reading the table: the listing (one snapshot), the change mark that
//! tells whether a new listing differs, and the bulk load of payloads.

use std::sync::Arc;

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row as _};
use weir_actors::source::{Listed, Listing, Load, Loading};
use weir_actors::{Error, Fingerprint, Result, StableKey};

use super::catalog::{KeyKind, Table};
use super::SourceRow;
use crate::sql::quote_identifier;

/// How many keys one load statement asks for.
pub(super) const LOAD_CHUNK: usize = 5_000;

/// What a listing (or a change check) saw of the whole table: its row
/// count and the sum of its rows' hashes. Two equal marks: nothing to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Mark {
    rows: i64,
    hash: String,
}

/// The SQL text of a source's statements, written once.
#[derive(Debug)]
pub(super) struct Plan {
    /// The table, as the catalog describes it.
    pub table: Table,
    /// Every row (snapshot mode) or every key and ordinal (incremental
    /// mode), ordered by key.
    list: String,
    /// The change mark.
    mark: String,
    /// The rows of the keys bound as text arrays, one per key column.
    load: String,
}

impl Plan {
    /// The statements reading `table`.
    pub fn new(table: Table) -> Self {
        let keys = select_keys(&table);
        let ordinal = table
            .ordinal
            .as_ref()
            .map(|c| format!(", t.{}::text", quote_identifier(&c.name)))
            .unwrap_or_default();
        let from = format!("FROM {} AS t", table.quoted());
        let order = order_by_key(&table);
        let row = ", to_jsonb(t.*)::text";
        let list = match table.ordinal {
            Some(_) => format!("SELECT {keys}{ordinal} {from} ORDER BY {order}"),
            None => format!("SELECT {keys}{row} {from} ORDER BY {order}"),
        };
        let hashed = match &table.ordinal {
            Some(c) => format!("ROW({order}, t.{})::text", quote_identifier(&c.name)),
            None => "(t.*)::text".to_string(),
        };
        let mark = format!(
            "SELECT count(*)::int8, coalesce(sum(hashtextextended({hashed}, 0)), 0)::text {from}"
        );
        let load = format!(
            "SELECT {keys}{ordinal}{row} {from} WHERE ({order}) IN ({})",
            unnest_keys(&table)
        );
        Self {
            table,
            list,
            mark,
            load,
        }
    }

    /// Whether payloads are loaded lazily (incremental mode).
    fn incremental(&self) -> bool {
        self.table.ordinal.is_some()
    }
}

/// `t."k1"::text, t."k2"::text`
fn select_keys(table: &Table) -> String {
    let parts: Vec<String> = table
        .key
        .iter()
        .map(|c| format!("t.{}::text", quote_identifier(&c.name)))
        .collect();
    parts.join(", ")
}

/// `t."k1", t."k2"`
fn order_by_key(table: &Table) -> String {
    let parts: Vec<String> = table
        .key
        .iter()
        .map(|c| format!("t.{}", quote_identifier(&c.name)))
        .collect();
    parts.join(", ")
}

/// `SELECT u.c1::type1, ... FROM UNNEST($1::text[], ...) AS u(c1, ...)`:
/// the keys bound as text, cast back to the key columns' types.
fn unnest_keys(table: &Table) -> String {
    let n = table.key.len();
    let casts: Vec<String> = table
        .key
        .iter()
        .enumerate()
        .map(|(i, c)| format!("u.c{}::{}", i + 1, c.ty))
        .collect();
    let params: Vec<String> = (1..=n).map(|i| format!("${i}::text[]")).collect();
    let names: Vec<String> = (1..=n).map(|i| format!("c{i}")).collect();
    format!(
        "SELECT {} FROM UNNEST({}) AS u({})",
        casts.join(", "),
        params.join(", "),
        names.join(", ")
    )
}

/// Lists the table from one snapshot (`REPEATABLE READ`), with the mark of
/// that snapshot when `marked` (live mode). Payloads are given in snapshot
/// mode, left to a loader in incremental mode.
pub(super) async fn list(
    pool: &PgPool,
    plan: &Arc<Plan>,
    marked: bool,
) -> Result<(Listing<SourceRow>, Option<Mark>)> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let rows = sqlx::query(&plan.list).fetch_all(&mut *tx).await?;
    let mark = match marked {
        true => Some(read_mark(&mut tx, plan).await?),
        false => None,
    };
    tx.commit().await?;
    let items = if plan.incremental() {
        lazy_items(&plan.table, &rows)?
    } else {
        full_items(&plan.table, &rows)?
    };
    let listing = Listing::new(items);
    let listing = if plan.incremental() {
        let loader = RowLoader {
            pool: pool.clone(),
            plan: Arc::clone(plan),
        };
        listing.with_loader(Arc::new(loader))
    } else {
        listing
    };
    Ok((listing, mark))
}

/// The table's current change mark.
pub(super) async fn mark(pool: &PgPool, plan: &Plan) -> Result<Mark> {
    let mut conn = pool.acquire().await?;
    read_mark(&mut conn, plan).await
}

async fn read_mark(conn: &mut PgConnection, plan: &Plan) -> Result<Mark> {
    let (rows, hash): (i64, String) = sqlx::query_as(&plan.mark).fetch_one(conn).await?;
    Ok(Mark { rows, hash })
}

/// Snapshot mode: every row with its payload, versioned by the
/// fingerprint of its JSON text.
fn full_items(table: &Table, rows: &[PgRow]) -> Result<Vec<Listed<SourceRow>>> {
    let n = table.key.len();
    let mut items: Vec<Listed<SourceRow>> = Vec::with_capacity(rows.len());
    for row in rows {
        let texts = key_texts(table, row)?;
        let json: String = row.try_get(n)?;
        let version = Fingerprint::from_bytes(json.as_bytes()).as_bytes().to_vec();
        let (key, payload) = source_row(table, texts, None, &json)?;
        check_unique(table, items.last().map(|l| &l.key), &key)?;
        items.push(Listed::new(key, Some(version), payload));
    }
    Ok(items)
}

/// Incremental mode: every key, versioned by its ordinal's text; a NULL
/// ordinal leaves the version out, so the row runs at every listing.
fn lazy_items(table: &Table, rows: &[PgRow]) -> Result<Vec<Listed<SourceRow>>> {
    let n = table.key.len();
    let mut items: Vec<Listed<SourceRow>> = Vec::with_capacity(rows.len());
    for row in rows {
        let key = stable_key(table, &key_texts(table, row)?)?;
        check_unique(table, items.last().map(|l| &l.key), &key)?;
        let ordinal: Option<String> = row.try_get(n)?;
        items.push(Listed {
            key,
            version: ordinal.map(String::into_bytes),
            payload: None,
        });
    }
    Ok(items)
}

/// The texts of a row's key columns (its first columns); a NULL is an
/// error naming the column.
fn key_texts(table: &Table, row: &PgRow) -> Result<Vec<String>> {
    let mut texts = Vec::with_capacity(table.key.len());
    for (i, column) in table.key.iter().enumerate() {
        let text: Option<String> = row.try_get(i)?;
        let Some(text) = text else {
            return Err(Error::permanent(format!(
                "a row of PostgreSQL table `{}` has NULL in its key column `{}`",
                table.display(),
                column.name
            )));
        };
        texts.push(text);
    }
    Ok(texts)
}

/// Rows are listed ordered by key: a key equal to the one before is held
/// by several rows.
fn check_unique(table: &Table, previous: Option<&StableKey>, key: &StableKey) -> Result<()> {
    if previous != Some(key) {
        return Ok(());
    }
    let columns: Vec<&str> = table.key.iter().map(|c| c.name.as_str()).collect();
    Err(Error::permanent(format!(
        "the key ({}) of PostgreSQL table `{}` is not unique: {key} is held by several rows",
        columns.join(", "),
        table.display()
    )))
}

/// A row as a component receives it, with its stable key.
fn source_row(
    table: &Table,
    texts: Vec<String>,
    ordinal: Option<String>,
    json: &str,
) -> Result<(StableKey, SourceRow)> {
    let key = stable_key(table, &texts)?;
    let value: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| Error::msg(format!("a row of `{}` is not JSON: {e}", table.display())))?;
    let key_values: Vec<serde_json::Value> = table
        .key
        .iter()
        .map(|c| value.get(&c.name).cloned().unwrap_or_default())
        .collect();
    let key_text = match <[String; 1]>::try_from(texts) {
        Ok([text]) => text,
        Err(_) => serde_json::Value::Array(key_values.clone()).to_string(),
    };
    let row = SourceRow {
        key: key_values,
        key_text,
        value,
        ordinal,
    };
    Ok((key, row))
}

/// The stable key of a row from its key columns' texts: one column, its
/// part; several, an array of their parts.
fn stable_key(table: &Table, texts: &[String]) -> Result<StableKey> {
    let parts = table
        .key
        .iter()
        .zip(texts)
        .map(|(c, text)| key_part(c.kind, text, &c.name))
        .collect::<Result<Vec<_>>>()?;
    match <[StableKey; 1]>::try_from(parts) {
        Ok([part]) => Ok(part),
        Err(parts) => Ok(StableKey::Array(Arc::from(parts))),
    }
}

fn key_part(kind: KeyKind, text: &str, column: &str) -> Result<StableKey> {
    let bad = |e: &dyn std::fmt::Display| {
        Error::permanent(format!("key column `{column}` holds {text:?}: {e}"))
    };
    Ok(match kind {
        KeyKind::Int => StableKey::Int(text.parse().map_err(|e| bad(&e))?),
        KeyKind::Uuid => StableKey::Uuid(text.parse().map_err(|e| bad(&e))?),
        KeyKind::Text => StableKey::Str(Arc::from(text)),
    })
}

/// The texts of a stable key's parts, one per key column: what the load
/// statement binds.
fn key_part_texts(table: &Table, key: &StableKey) -> Result<Vec<String>> {
    let parts: &[StableKey] = match key {
        StableKey::Array(parts) if table.key.len() > 1 => parts,
        single => std::slice::from_ref(single),
    };
    if parts.len() != table.key.len() {
        return Err(Error::Usage(format!(
            "key {key} is not a key of PostgreSQL table `{}`",
            table.display()
        )));
    }
    parts
        .iter()
        .map(|part| match part {
            StableKey::Int(i) => Ok(i.to_string()),
            StableKey::Uuid(u) => Ok(u.to_string()),
            StableKey::Str(s) => Ok(s.to_string()),
            other => Err(Error::Usage(format!(
                "key part {other} is not a key of PostgreSQL table `{}`",
                table.display()
            ))),
        })
        .collect()
}

/// Loads the payloads of incremental listings, [`LOAD_CHUNK`] keys per
/// statement.
struct RowLoader {
    pool: PgPool,
    plan: Arc<Plan>,
}

impl Load<SourceRow> for RowLoader {
    fn load(&self, keys: Vec<StableKey>) -> Loading<'_, SourceRow> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(keys.len());
            for chunk in keys.chunks(LOAD_CHUNK) {
                out.extend(self.load_chunk(chunk).await?);
            }
            Ok(out)
        })
    }
}

impl RowLoader {
    async fn load_chunk(&self, keys: &[StableKey]) -> Result<Vec<(StableKey, SourceRow)>> {
        let table = &self.plan.table;
        let mut columns: Vec<Vec<String>> = vec![Vec::with_capacity(keys.len()); table.key.len()];
        for key in keys {
            for (column, text) in columns.iter_mut().zip(key_part_texts(table, key)?) {
                column.push(text);
            }
        }
        let mut query = sqlx::query(&self.plan.load);
        for column in columns {
            query = query.bind(column);
        }
        let rows = query.fetch_all(&self.pool).await?;
        let n = table.key.len();
        rows.iter()
            .map(|row| {
                let texts = key_texts(table, row)?;
                let ordinal: Option<String> = row.try_get(n)?;
                let json: String = row.try_get(n + 1)?;
                source_row(table, texts, ordinal, &json)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::source::catalog::Column;

    fn column(name: &str, ty: &str, kind: KeyKind) -> Column {
        Column {
            name: name.to_string(),
            ty: ty.to_string(),
            kind,
        }
    }

    fn table(key: Vec<Column>, ordinal: Option<Column>) -> Table {
        Table {
            schema: "public".to_string(),
            name: "a\"b".to_string(),
            is_table: true,
            key,
            ordinal,
        }
    }

    #[test]
    fn names_are_quoted_and_keys_are_bound_as_text_arrays_cast_back() {
        let t = table(
            vec![
                column("re\"gion", "text", KeyKind::Text),
                column("id", "integer", KeyKind::Int),
            ],
            Some(column("rev", "bigint", KeyKind::Int)),
        );
        let plan = Plan::new(t);
        assert_eq!(
            plan.list,
            r#"SELECT t."re""gion"::text, t."id"::text, t."rev"::text FROM "public"."a""b" AS t ORDER BY t."re""gion", t."id""#
        );
        assert!(
            plan.load.ends_with(
                r#"WHERE (t."re""gion", t."id") IN (SELECT u.c1::text, u.c2::integer FROM UNNEST($1::text[], $2::text[]) AS u(c1, c2))"#
            ),
            "{}",
            plan.load
        );
    }

    #[test]
    fn stable_keys_round_trip_through_the_texts_the_loader_binds() {
        let t = table(
            vec![
                column("id", "bigint", KeyKind::Int),
                column("u", "uuid", KeyKind::Uuid),
                column("s", "text", KeyKind::Text),
            ],
            None,
        );
        let texts = vec![
            "-42".to_string(),
            "67e55044-10b1-426f-9247-bb680e5fe0c8".to_string(),
            "x y".to_string(),
        ];
        let key = stable_key(&t, &texts).ok();
        let back = key.as_ref().and_then(|k| key_part_texts(&t, k).ok());
        assert_eq!(back, Some(texts));
        assert!(matches!(key, Some(StableKey::Array(ref parts)) if parts.len() == 3));
    }

    #[test]
    fn a_one_column_integer_key_is_an_int_and_a_bad_one_names_its_column() {
        let t = table(vec![column("id", "integer", KeyKind::Int)], None);
        assert_eq!(
            stable_key(&t, &["7".to_string()]).ok(),
            Some(StableKey::Int(7))
        );
        let err = stable_key(&t, &["seven".to_string()]).err();
        let text = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("key column `id`"), "{text}");
    }
}
