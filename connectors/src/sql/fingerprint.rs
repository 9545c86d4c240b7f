//! A row's tracking record: the fingerprint of its non-NULL values by
//! column name, shared by the SQL targets.
//!
//! Keyed by name and without NULLs, the fingerprint of an unchanged row
//! stays the same when a nullable column is added or columns are
//! reordered, so such a schema change rewrites no row.

use serde::Serialize;
use weir_actors::Fingerprint;

use super::{msgpack, Column, SqlValue, TableSchema};

/// A row as it is fingerprinted: its non-NULL values by column name, in
/// name order, so that adding a nullable column (or reordering columns)
/// leaves unchanged rows alone. It encodes as the list of `(name, value)`
/// pairs it stands for.
pub(crate) struct NamedValues<'a> {
    columns: &'a [Column],
    /// Column positions in name order.
    by_name: &'a [usize],
    values: &'a [SqlValue],
}

impl NamedValues<'_> {
    fn pairs(&self) -> impl Iterator<Item = (&str, &SqlValue)> + '_ {
        self.by_name.iter().filter_map(|&i| {
            let value = self.values.get(i)?;
            let column = self.columns.get(i)?;
            (!matches!(value, SqlValue::Null)).then_some((column.name.as_str(), value))
        })
    }
}

impl Serialize for NamedValues<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(self.pairs().count()))?;
        for pair in self.pairs() {
            seq.serialize_element(&pair)?;
        }
        seq.end()
    }
}

/// The fingerprint of a row's `values` (see [`NamedValues`]); `by_name` is
/// [`name_order`] of `schema`.
pub(crate) fn row_fingerprint(
    schema: &TableSchema,
    by_name: &[usize],
    values: &[SqlValue],
) -> Fingerprint {
    let named = NamedValues {
        columns: schema.columns(),
        by_name,
        values,
    };
    // The bytes `named` serializes to, written directly.
    msgpack::fingerprint(&named, |buf| {
        let pair = |buf: &mut Vec<u8>, (name, value): (&str, &SqlValue)| {
            msgpack::write_len(buf, 2)?;
            rmp::encode::write_str(buf, name)?;
            msgpack::write_value(buf, value)
        };
        // Up to 15 pairs, the length is one byte (a fixarray): written
        // once the pairs are counted, rather than counting them first.
        if values.len() <= MAX_FIXARRAY {
            let at = buf.len();
            msgpack::write_len(buf, 0)?;
            let mut count: u8 = 0;
            for p in named.pairs() {
                pair(buf, p)?;
                count += 1;
            }
            if let Some(slot) = buf.get_mut(at) {
                *slot = rmp::Marker::FixArray(count).to_u8();
            }
            return Ok(());
        }
        msgpack::write_len(buf, named.pairs().count())?;
        named.pairs().try_for_each(|p| pair(buf, p))
    })
}

/// The most items whose MessagePack array header is one byte.
const MAX_FIXARRAY: usize = 15;

/// The positions of `schema`'s columns, in name order.
pub(crate) fn name_order(schema: &TableSchema) -> Vec<usize> {
    let mut order: Vec<usize> = (0..schema.columns().len()).collect();
    order.sort_by(|&a, &b| {
        let name = |i: usize| schema.columns().get(i).map(|c| c.name.as_str());
        name(a).cmp(&name(b))
    });
    order
}
