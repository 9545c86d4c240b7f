//! MessagePack encoding into a reused per-thread buffer.
//!
//! Declared values, actions and tracking records are encoded once per
//! state. `rmp_serde::to_vec` starts from an empty vector that grows
//! (and is copied) several times per value; encoding into a buffer kept
//! by the thread and copying the result once costs a fraction of that.
//! The bytes are the same as `rmp_serde::to_vec`'s.

use std::cell::RefCell;
use std::sync::Arc;

use serde::Serialize;

/// The largest buffer kept between encodings, per thread.
const MAX_KEPT_BUFFER: usize = 64 * 1024;

thread_local! {
    static BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
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
    let encode = |buf: &mut Vec<u8>| {
        buf.clear();
        rmp_serde::encode::write(&mut *buf, value).map(|()| then(buf))
    };
    BUFFER.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            let out = encode(&mut buf);
            // Do not keep a huge buffer alive for the thread's lifetime.
            if buf.capacity() > MAX_KEPT_BUFFER {
                *buf = Vec::new();
            }
            out
        }
        // Encoding from inside another encoding (a `Serialize` impl that
        // encodes or fingerprints a value of its own).
        Err(_) => encode(&mut Vec::new()),
    })
}

/// `value` encoded, in shared bytes.
pub(crate) fn to_arc<T>(value: &T) -> Result<Arc<[u8]>, rmp_serde::encode::Error>
where
    T: Serialize + ?Sized,
{
    with_encoded(value, |bytes| Arc::from(bytes))
}

/// `value` encoded, in a vector of exactly its length.
pub(crate) fn to_vec<T>(value: &T) -> Result<Vec<u8>, rmp_serde::encode::Error>
where
    T: Serialize + ?Sized,
{
    with_encoded(value, |bytes| bytes.to_vec())
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
            let inner = to_vec(&self.0).map_err(serde::ser::Error::custom)?;
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
        assert_eq!(to_vec(&value)?, expected);
        assert_eq!(&*to_arc(&value)?, expected.as_slice());
        // Twice in a row: the kept buffer starts empty each time.
        assert_eq!(to_vec(&"short")?, rmp_serde::to_vec(&"short")?);
        Ok(())
    }

    #[test]
    fn a_value_may_encode_another_while_it_is_encoded() -> Result<(), rmp_serde::encode::Error> {
        let inner = Nested {
            name: "inner".into(),
            parts: vec![1, 2, 3],
        };
        let expected = rmp_serde::to_vec(&serde_bytes::Bytes::new(&rmp_serde::to_vec(&inner)?))?;
        assert_eq!(to_vec(&EncodesInside(inner))?, expected);
        Ok(())
    }
}
