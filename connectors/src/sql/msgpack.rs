//! Rows fingerprinted from a MessagePack encoding written directly.
//!
//! A row's tracking record is the fingerprint of its values' MessagePack
//! encoding. Encoding them through serde (`rmp_serde`) cost about a
//! thousand instructions a row, more than hashing the bytes; this module
//! writes the same bytes for the common kinds (NULL, booleans, integers,
//! floats, text) with `rmp`'s writers, and hands the others to
//! `rmp_serde`. The digests are those ledgers already hold.

use std::cell::Cell;

use serde::Serialize;
use weir_actors::Fingerprint;

use super::value::SqlValue;

/// The largest buffer kept between fingerprints, per thread.
const MAX_KEPT_BUFFER: usize = 64 * 1024;

thread_local! {
    static BUFFER: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Appends what `rmp_serde` writes for `value`.
pub(crate) fn write_value(
    buf: &mut Vec<u8>,
    value: &SqlValue,
) -> Result<(), rmp_serde::encode::Error> {
    // A newtype variant is a one-entry map from its name to its content.
    fn variant(buf: &mut Vec<u8>, name: &str) -> Result<(), rmp_serde::encode::Error> {
        rmp::encode::write_map_len(buf, 1)?;
        Ok(rmp::encode::write_str(buf, name)?)
    }
    match value {
        SqlValue::Null => rmp::encode::write_str(buf, "Null")?,
        SqlValue::Bool(b) => {
            variant(buf, "Bool")?;
            rmp::encode::write_bool(buf, *b).map_err(|e| {
                rmp_serde::encode::Error::InvalidValueWrite(
                    rmp::encode::ValueWriteError::InvalidMarkerWrite(e),
                )
            })?;
        }
        SqlValue::Int(i) => {
            variant(buf, "Int")?;
            rmp::encode::write_sint(buf, *i)?;
        }
        SqlValue::Float(f) => {
            variant(buf, "Float")?;
            rmp::encode::write_f64(buf, *f)?;
        }
        SqlValue::Text(s) => {
            variant(buf, "Text")?;
            rmp::encode::write_str(buf, s)?;
        }
        other => rmp_serde::encode::write(buf, other)?,
    }
    Ok(())
}

/// Appends a sequence's length, as `rmp_serde` writes it.
pub(crate) fn write_len(buf: &mut Vec<u8>, len: usize) -> Result<(), rmp_serde::encode::Error> {
    let len = u32::try_from(len).map_err(|_| {
        rmp_serde::encode::Error::Syntax(format!("a sequence of {len} items is too long"))
    })?;
    rmp::encode::write_array_len(buf, len)?;
    Ok(())
}

/// The fingerprint of `value`, whose MessagePack encoding `write` appends
/// to the buffer it is given. If `write` fails, the fingerprint is
/// `Fingerprint::from(value)`, whatever that gives.
pub(crate) fn fingerprint<T: Serialize + ?Sized>(
    value: &T,
    write: impl FnOnce(&mut Vec<u8>) -> Result<(), rmp_serde::encode::Error>,
) -> Fingerprint {
    with_buffer(|buf| match write(buf) {
        Ok(()) => Fingerprint::from_msgpack(buf),
        Err(_) => Fingerprint::from(value),
    })
}

/// Runs `f` with the thread's kept buffer, emptied. The buffer is taken
/// out of its cell while in use: a fingerprint taken meanwhile (or one on a
/// thread being torn down) finds none and starts a fresh one.
fn with_buffer<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    let mut buf = BUFFER.try_with(Cell::take).unwrap_or_default();
    buf.clear();
    let out = f(&mut buf);
    if buf.capacity() <= MAX_KEPT_BUFFER {
        let _ = BUFFER.try_with(|cell| cell.set(buf));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::value::Row;

    fn every_kind() -> Vec<SqlValue> {
        vec![
            SqlValue::Null,
            SqlValue::Bool(true),
            SqlValue::Bool(false),
            SqlValue::Int(0),
            SqlValue::Int(127),
            SqlValue::Int(128),
            SqlValue::Int(-1),
            SqlValue::Int(-33),
            SqlValue::Int(70_000),
            SqlValue::Int(i64::MIN),
            SqlValue::Int(i64::MAX),
            SqlValue::Float(-0.0),
            SqlValue::Float(2.5),
            SqlValue::Text(String::new()),
            SqlValue::Text("t".repeat(31)),
            SqlValue::Text("t".repeat(32)),
            SqlValue::Text("é".repeat(40_000)),
            SqlValue::Bytes(vec![0, 1, 255]),
            SqlValue::Json(serde_json::json!({"a": [1, 2.5, "x", null]})),
            SqlValue::Timestamp(chrono::DateTime::<chrono::Utc>::UNIX_EPOCH),
            SqlValue::Uuid(uuid::Uuid::from_u128(7)),
            SqlValue::Array(vec![SqlValue::Int(1), SqlValue::Text("x".into())]),
        ]
    }

    #[test]
    fn values_are_written_as_rmp_serde_writes_them() -> Result<(), rmp_serde::encode::Error> {
        for value in every_kind() {
            let mut buf = Vec::new();
            write_value(&mut buf, &value)?;
            assert_eq!(buf, rmp_serde::to_vec(&value)?, "{value:?}");
        }
        Ok(())
    }

    #[test]
    fn a_row_written_directly_has_the_fingerprint_of_its_serde_encoding() {
        let row = Row {
            values: every_kind(),
        };
        let digest = fingerprint(&row, |buf| {
            write_len(buf, 1)?;
            write_len(buf, row.values.len())?;
            row.values.iter().try_for_each(|v| write_value(buf, v))
        });
        assert_eq!(digest, Fingerprint::from(&row));
    }

    #[test]
    fn a_fingerprint_taken_while_another_is_written_leaves_both_right() {
        let outer = Row {
            values: vec![SqlValue::Text("outer".into())],
        };
        let inner = Row {
            values: vec![SqlValue::Int(7), SqlValue::Null],
        };
        let write_row = |row: &Row, buf: &mut Vec<u8>| {
            write_len(buf, 1)?;
            write_len(buf, row.values.len())?;
            row.values.iter().try_for_each(|v| write_value(buf, v))
        };
        let mut nested = None;
        let digest = fingerprint(&outer, |buf| {
            write_len(buf, 1)?;
            nested = Some(fingerprint(&inner, |b| write_row(&inner, b)));
            write_len(buf, outer.values.len())?;
            outer.values.iter().try_for_each(|v| write_value(buf, v))
        });
        assert_eq!(digest, Fingerprint::from(&outer));
        assert_eq!(nested, Some(Fingerprint::from(&inner)));
    }

    #[test]
    fn a_failed_write_gives_the_serde_fingerprint() {
        let row = Row {
            values: vec![SqlValue::Int(1)],
        };
        let digest = fingerprint(&row, |buf| {
            buf.push(0xc1);
            Err(rmp_serde::encode::Error::Syntax("refused".into()))
        });
        assert_eq!(digest, Fingerprint::from(&row));
    }
}
