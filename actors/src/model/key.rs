//! Stable keys: the identity of a target state (and of a component) across runs.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A key that identifies a target state or a component the same way on every run.
///
/// Keys are compared, ordered and hashed structurally. Their `Display` form is
/// meant for people: `"a"`, `42`, `["a",1]`, `@sym`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum StableKey {
    /// No value.
    Null,
    /// A boolean.
    Bool(bool),
    /// A signed integer.
    Int(i64),
    /// A string.
    Str(Arc<str>),
    /// Raw bytes.
    Bytes(Arc<[u8]>),
    /// A UUID.
    Uuid(uuid::Uuid),
    /// A symbol: a name that is not user data (shown as `@name`).
    Symbol(Arc<str>),
    /// A tuple of keys.
    Array(Arc<[StableKey]>),
}

impl StableKey {
    /// The key as a plain string when it is a [`StableKey::Str`] or [`StableKey::Symbol`].
    pub fn as_str(&self) -> Option<&str> {
        match self {
            StableKey::Str(s) | StableKey::Symbol(s) => Some(s),
            _ => None,
        }
    }

    /// Writes the key as a path segment: strings without quotes, everything
    /// else as its `Display` form.
    pub(crate) fn fmt_segment(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StableKey::Str(s) => f.write_str(s),
            other => fmt::Display::fmt(other, f),
        }
    }
}

impl fmt::Display for StableKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StableKey::Null => f.write_str("null"),
            StableKey::Bool(b) => write!(f, "{b}"),
            StableKey::Int(i) => write!(f, "{i}"),
            StableKey::Str(s) => write!(f, "{s:?}"),
            StableKey::Bytes(b) => {
                f.write_str("0x")?;
                for byte in b.iter() {
                    write!(f, "{byte:02x}")?;
                }
                Ok(())
            }
            StableKey::Uuid(u) => write!(f, "{u}"),
            StableKey::Symbol(s) => write!(f, "@{s}"),
            StableKey::Array(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    fmt::Display::fmt(item, f)?;
                }
                f.write_str("]")
            }
        }
    }
}

/// Conversion into a [`StableKey`].
///
/// Implemented for [`StableKey`], `&str`, `String`, `&String`, the integer types
/// `i64`, `i32`, `u32` and `u64` (values above `i64::MAX` become
/// [`StableKey::Bytes`], never a wrapped negative number), [`uuid::Uuid`], and
/// tuples of up to four keys.
pub trait IntoStableKey {
    /// Converts `self` into a key.
    fn into_stable_key(self) -> StableKey;
}

impl IntoStableKey for StableKey {
    fn into_stable_key(self) -> StableKey {
        self
    }
}

impl IntoStableKey for &StableKey {
    fn into_stable_key(self) -> StableKey {
        self.clone()
    }
}

impl IntoStableKey for &str {
    fn into_stable_key(self) -> StableKey {
        StableKey::Str(Arc::from(self))
    }
}

impl IntoStableKey for String {
    fn into_stable_key(self) -> StableKey {
        StableKey::Str(Arc::from(self))
    }
}

impl IntoStableKey for &String {
    fn into_stable_key(self) -> StableKey {
        StableKey::Str(Arc::from(self.as_str()))
    }
}

impl IntoStableKey for Arc<str> {
    fn into_stable_key(self) -> StableKey {
        StableKey::Str(self)
    }
}

impl IntoStableKey for i64 {
    fn into_stable_key(self) -> StableKey {
        StableKey::Int(self)
    }
}

impl IntoStableKey for i32 {
    fn into_stable_key(self) -> StableKey {
        StableKey::Int(i64::from(self))
    }
}

impl IntoStableKey for u32 {
    fn into_stable_key(self) -> StableKey {
        StableKey::Int(i64::from(self))
    }
}

impl IntoStableKey for u64 {
    fn into_stable_key(self) -> StableKey {
        match i64::try_from(self) {
            Ok(v) => StableKey::Int(v),
            Err(_) => StableKey::Bytes(Arc::from(self.to_be_bytes().as_slice())),
        }
    }
}

impl IntoStableKey for usize {
    fn into_stable_key(self) -> StableKey {
        (self as u64).into_stable_key()
    }
}

impl IntoStableKey for bool {
    fn into_stable_key(self) -> StableKey {
        StableKey::Bool(self)
    }
}

impl IntoStableKey for uuid::Uuid {
    fn into_stable_key(self) -> StableKey {
        StableKey::Uuid(self)
    }
}

macro_rules! tuple_into_stable_key {
    ($($name:ident),+) => {
        impl<$($name: IntoStableKey),+> IntoStableKey for ($($name,)+) {
            #[allow(non_snake_case)]
            fn into_stable_key(self) -> StableKey {
                let ($($name,)+) = self;
                StableKey::Array(Arc::from(vec![$($name.into_stable_key()),+]))
            }
        }
    };
}

tuple_into_stable_key!(A);
tuple_into_stable_key!(A, B);
tuple_into_stable_key!(A, B, C);
tuple_into_stable_key!(A, B, C, D);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_human_readable() {
        assert_eq!("a".into_stable_key().to_string(), "\"a\"");
        assert_eq!(42i64.into_stable_key().to_string(), "42");
        assert_eq!(("a", 1i64).into_stable_key().to_string(), "[\"a\",1]");
        assert_eq!(StableKey::Symbol(Arc::from("sym")).to_string(), "@sym");
        assert_eq!(StableKey::Null.to_string(), "null");
    }

    #[test]
    fn u64_above_i64_max_becomes_bytes_not_a_negative_int() {
        let key = u64::MAX.into_stable_key();
        assert_eq!(key, StableKey::Bytes(Arc::from([0xffu8; 8].as_slice())));
        assert_eq!(7u64.into_stable_key(), StableKey::Int(7));
        assert_eq!(
            (i64::MAX as u64).into_stable_key(),
            StableKey::Int(i64::MAX)
        );
    }

    #[test]
    fn string_forms_produce_equal_keys() {
        let owned = String::from("k");
        assert_eq!("k".into_stable_key(), owned.clone().into_stable_key());
        assert_eq!((&owned).into_stable_key(), "k".into_stable_key());
    }

    #[test]
    fn keys_round_trip_through_msgpack() -> Result<(), Box<dyn std::error::Error>> {
        let key = ("a", 1i64, uuid::Uuid::nil(), 3u32).into_stable_key();
        let bytes = rmp_serde::to_vec(&key)?;
        let back: StableKey = rmp_serde::from_slice(&bytes)?;
        assert_eq!(key, back);
        Ok(())
    }
}
