//! MessagePack encoding into a reused per-thread buffer.
//!
//! Declared values, actions and tracking records are encoded once per
//! state. `rmp_serde::to_vec` starts from an empty vector that grows
//! (and is copied) several times per value; encoding into a buffer kept
//! by the thread and copying the result once costs a fraction of that.
//! The bytes are the same as `rmp_serde::to_vec`'s. Unlike `to_vec`, a
//! failed allocation aborts (as everywhere else in weir) instead of
//! returning an error: checking each of rmp's many small writes for it
//! cost more than the encoding itself.

use std::cell::Cell;
use std::sync::Arc;

use serde::Serialize;

/// The largest buffer kept between encodings, per thread.
pub(crate) const MAX_KEPT_BUFFER: usize = 64 * 1024;

thread_local! {
    static BUFFER: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Encodes `value` (structs as arrays, as `rmp_serde::to_vec`) and hands
/// the bytes to `then`.
pub(crate) fn with_encoded<T, R>(
    value: &T,
    then: impl FnOnce(&[u8]) -> R,
) -> Result<R, rmp_serde::encode::Error>
where
    T: Serialize + ?Sized,
{
    with_buffer(|buf| rmp_serde::encode::write(&mut *buf, value).map(|()| then(buf)))
}

/// Hands `write` the thread's kept buffer, emptied, to write bytes into.
pub(crate) fn with_buffer<R>(write: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    // The kept buffer is taken out of its cell while in use, so that a
    // use nested in this one (a `Serialize` impl that encodes or
    // fingerprints a value of its own) simply finds none; so does one on a
    // thread being torn down.
    let mut buf = BUFFER.try_with(Cell::take).unwrap_or_default();
    buf.clear();
    let out = write(&mut buf);
    // Keep it for the next use, unless it grew huge.
    if buf.capacity() <= MAX_KEPT_BUFFER {
        let _ = BUFFER.try_with(|cell| cell.set(buf));
    }
    out
}

/// `value` encoded, in shared bytes.
pub(crate) fn to_arc<T>(value: &T) -> Result<Arc<[u8]>, rmp_serde::encode::Error>
where
    T: Serialize + ?Sized,
{
    with_encoded(value, |bytes| Arc::from(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Nested {
        name: String,
        parts: Vec<u32>,
    }

    /// A value whose encoding encodes another value on the same thread.
    struct EncodesInside(Nested);

    impl Serialize for EncodesInside {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let inner = to_arc(&self.0).map_err(serde::ser::Error::custom)?;
            s.serialize_bytes(&inner)
        }
    }

    #[test]
    fn encodings_are_the_bytes_rmp_serde_gives() -> Result<(), rmp_serde::encode::Error> {
        let value = Nested {
            name: "a name".into(),
            parts: (0..300).collect(),
        };
        let expected = rmp_serde::to_vec(&value)?;
        assert_eq!(&*to_arc(&value)?, expected.as_slice());
        // Twice in a row: the kept buffer starts empty each time.
        assert_eq!(&*to_arc(&"short")?, rmp_serde::to_vec(&"short")?.as_slice());
        Ok(())
    }

    #[test]
    fn a_value_may_encode_another_while_it_is_encoded() -> Result<(), rmp_serde::encode::Error> {
        let inner = Nested {
            name: "inner".into(),
            parts: vec![1, 2, 3],
        };
        let expected = rmp_serde::to_vec(&serde_bytes::Bytes::new(&rmp_serde::to_vec(&inner)?))?;
        assert_eq!(&*to_arc(&EncodesInside(inner))?, expected.as_slice());
        Ok(())
    }

    /// A value whose encoding panics halfway.
    struct Panics;

    impl Serialize for Panics {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeSeq;
            let mut seq = s.serialize_seq(Some(2))?;
            seq.serialize_element("first")?;
            std::panic::panic_any("a Serialize impl panicked")
        }
    }

    #[test]
    fn a_panic_while_encoding_leaves_the_buffer_usable() -> Result<(), rmp_serde::encode::Error> {
        let caught = std::panic::catch_unwind(|| to_arc(&Panics));
        assert!(caught.is_err());
        assert_eq!(&*to_arc(&"after")?, rmp_serde::to_vec(&"after")?.as_slice());
        Ok(())
    }
}
