//! Serializing a row with a bound on nesting.
//!
//! Serialization, decoding and conversion of a value all recurse once per
//! level of nesting, so a value nested deeply enough (a JSON document of
//! 100,000 nested arrays, a long linked list) overflows the thread's stack
//! and aborts the process, which no error handling can catch. [`Bounded`]
//! wraps a value so that it serializes at most [`Limits::max`] levels deep:
//! anything deeper is written as nil instead (its own serialization never
//! runs), and the [`Limits`] remember which entry of the outermost map or
//! struct (the row's column) held it, so that the caller can refuse that
//! column by name and ignore fields that are not columns.

use std::cell::RefCell;

use serde::ser::{
    Serialize, SerializeMap, SerializeSeq, SerializeStruct, SerializeStructVariant, SerializeTuple,
    SerializeTupleStruct, SerializeTupleVariant, Serializer,
};

/// What was cut while serializing with a bound.
#[derive(Debug, Default)]
struct Cuts {
    /// Whether the outermost map or struct was entered.
    outer_seen: bool,
    /// Entries (by position) of the outermost map or struct that held a cut.
    entries: Vec<usize>,
    /// A cut outside any entry of the outermost map or struct.
    outside: bool,
}

/// The bound on nesting of one serialization, and what it cut.
#[derive(Debug)]
pub(crate) struct Limits {
    max: usize,
    cuts: RefCell<Cuts>,
}

impl Limits {
    /// A bound of `max` levels of maps, structs, sequences, tuples and enum
    /// variants with data, and of `max` wrappers (`Some`, newtype structs)
    /// besides.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            max,
            cuts: RefCell::new(Cuts::default()),
        }
    }

    /// The bound.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// Whether the entry at `position` of the outermost map or struct was
    /// cut.
    pub(crate) fn cut_entry(&self, position: usize) -> bool {
        self.cuts.borrow().entries.contains(&position)
    }

    /// Whether something outside the entries of the outermost map or struct
    /// was cut (the value itself is too deep, or has no outer map).
    pub(crate) fn cut_outside(&self) -> bool {
        self.cuts.borrow().outside
    }

    fn cut(&self, entry: Option<usize>) {
        let mut cuts = self.cuts.borrow_mut();
        match entry {
            Some(e) => {
                if !cuts.entries.contains(&e) {
                    cuts.entries.push(e);
                }
            }
            None => cuts.outside = true,
        }
    }

    /// Marks the outermost map or struct as entered; true the first time.
    fn enter_outer(&self) -> bool {
        let mut cuts = self.cuts.borrow_mut();
        !std::mem::replace(&mut cuts.outer_seen, true)
    }
}

/// Where a value is: its depth, the wrappers around it, and the outermost
/// entry holding it.
#[derive(Clone, Copy)]
struct At<'a> {
    /// Levels of nesting that show in the serialized form: maps, structs,
    /// sequences, tuples, enum variants with data.
    depth: usize,
    /// Wrappers that do not (`Some`, newtype structs). They cost stack too,
    /// so they have a bound of their own, the same number.
    wraps: usize,
    entry: Option<usize>,
    limits: &'a Limits,
}

impl<'a> At<'a> {
    /// One level deeper, or `None` (the cut recorded) past the bound.
    fn deeper(self) -> Option<At<'a>> {
        if self.depth >= self.limits.max {
            self.limits.cut(self.entry);
            None
        } else {
            Some(At {
                depth: self.depth + 1,
                ..self
            })
        }
    }

    /// One wrapper more, or `None` (the cut recorded) past the bound.
    fn wrapped(self) -> Option<At<'a>> {
        if self.wraps >= self.limits.max {
            self.limits.cut(self.entry);
            None
        } else {
            Some(At {
                wraps: self.wraps + 1,
                ..self
            })
        }
    }
}

/// A value that serializes at most its limits' bound deep.
pub(crate) struct Bounded<'a, T: ?Sized> {
    value: &'a T,
    at: At<'a>,
}

impl<'a, T: ?Sized> Bounded<'a, T> {
    /// `value`, bounded by `limits`.
    pub(crate) fn new(value: &'a T, limits: &'a Limits) -> Self {
        Self {
            value,
            at: At {
                depth: 0,
                wraps: 0,
                entry: None,
                limits,
            },
        }
    }
}

impl<T: Serialize + ?Sized> Serialize for Bounded<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(Ser {
            inner: serializer,
            at: self.at,
        })
    }
}

/// A serializer passing everything to `inner`, bounding nesting.
struct Ser<'a, S> {
    inner: S,
    at: At<'a>,
}

/// A compound being serialized, or one past the bound, already written as
/// nil (its elements are dropped unseen).
enum Compound<'a, C, Ok> {
    Open {
        inner: C,
        at: At<'a>,
        /// Whether this is the outermost map or struct: its entries are
        /// numbered.
        outer: bool,
        next: usize,
    },
    Cut(Ok),
}

impl<'a, C, Ok> Compound<'a, C, Ok> {
    /// The place of the compound's next element.
    fn child(&self) -> Option<At<'a>> {
        match self {
            Compound::Open {
                at, outer, next, ..
            } => Some(At {
                entry: if *outer { Some(*next) } else { at.entry },
                ..*at
            }),
            Compound::Cut(_) => None,
        }
    }

    fn advance(&mut self) {
        if let Compound::Open { next, .. } = self {
            *next += 1;
        }
    }
}

impl<'a, S: Serializer> Ser<'a, S> {
    /// Opens a compound one level deeper with `open`, or writes nil.
    fn open<C>(
        self,
        outer_kind: bool,
        open: impl FnOnce(S) -> Result<C, S::Error>,
    ) -> Result<Compound<'a, C, S::Ok>, S::Error> {
        match self.at.deeper() {
            Some(at) => {
                let outer = outer_kind && self.at.limits.enter_outer();
                Ok(Compound::Open {
                    inner: open(self.inner)?,
                    at,
                    outer,
                    next: 0,
                })
            }
            None => Ok(Compound::Cut(self.inner.serialize_unit()?)),
        }
    }
}

macro_rules! forward {
    ($($method:ident($($arg:ident: $ty:ty),*);)*) => {
        $(fn $method(self, $($arg: $ty),*) -> Result<S::Ok, S::Error> {
            self.inner.$method($($arg),*)
        })*
    };
}

impl<'a, S: Serializer> Serializer for Ser<'a, S> {
    type Ok = S::Ok;
    type Error = S::Error;
    type SerializeSeq = Compound<'a, S::SerializeSeq, S::Ok>;
    type SerializeTuple = Compound<'a, S::SerializeTuple, S::Ok>;
    type SerializeTupleStruct = Compound<'a, S::SerializeTupleStruct, S::Ok>;
    type SerializeTupleVariant = Compound<'a, S::SerializeTupleVariant, S::Ok>;
    type SerializeMap = Compound<'a, S::SerializeMap, S::Ok>;
    type SerializeStruct = Compound<'a, S::SerializeStruct, S::Ok>;
    type SerializeStructVariant = Compound<'a, S::SerializeStructVariant, S::Ok>;

    forward! {
        serialize_bool(v: bool);
        serialize_i8(v: i8);
        serialize_i16(v: i16);
        serialize_i32(v: i32);
        serialize_i64(v: i64);
        serialize_i128(v: i128);
        serialize_u8(v: u8);
        serialize_u16(v: u16);
        serialize_u32(v: u32);
        serialize_u64(v: u64);
        serialize_u128(v: u128);
        serialize_f32(v: f32);
        serialize_f64(v: f64);
        serialize_char(v: char);
        serialize_str(v: &str);
        serialize_bytes(v: &[u8]);
        serialize_none();
        serialize_unit();
        serialize_unit_struct(name: &'static str);
        serialize_unit_variant(name: &'static str, index: u32, variant: &'static str);
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<S::Ok, S::Error> {
        match self.at.wrapped() {
            Some(at) => self.inner.serialize_some(&Bounded { value, at }),
            None => self.inner.serialize_unit(),
        }
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<S::Ok, S::Error> {
        match self.at.wrapped() {
            Some(at) => self
                .inner
                .serialize_newtype_struct(name, &Bounded { value, at }),
            None => self.inner.serialize_unit(),
        }
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<S::Ok, S::Error> {
        match self.at.deeper() {
            Some(at) => {
                self.inner
                    .serialize_newtype_variant(name, index, variant, &Bounded { value, at })
            }
            None => self.inner.serialize_unit(),
        }
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Self::SerializeSeq, S::Error> {
        self.open(false, |s| s.serialize_seq(len))
    }

    fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, S::Error> {
        self.open(false, |s| s.serialize_tuple(len))
    }

    fn serialize_tuple_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleStruct, S::Error> {
        self.open(false, |s| s.serialize_tuple_struct(name, len))
    }

    fn serialize_tuple_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleVariant, S::Error> {
        self.open(false, |s| {
            s.serialize_tuple_variant(name, index, variant, len)
        })
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Self::SerializeMap, S::Error> {
        self.open(true, |s| s.serialize_map(len))
    }

    fn serialize_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStruct, S::Error> {
        self.open(true, |s| s.serialize_struct(name, len))
    }

    fn serialize_struct_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStructVariant, S::Error> {
        self.open(false, |s| {
            s.serialize_struct_variant(name, index, variant, len)
        })
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

/// Implements a compound trait whose elements are plain values.
macro_rules! elements {
    ($trait:ident, $method:ident) => {
        impl<C: $trait> $trait for Compound<'_, C, C::Ok> {
            type Ok = C::Ok;
            type Error = C::Error;

            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), C::Error> {
                let child = self.child();
                if let (Compound::Open { inner, .. }, Some(at)) = (&mut *self, child) {
                    inner.$method(&Bounded { value, at })?;
                }
                self.advance();
                Ok(())
            }

            fn end(self) -> Result<C::Ok, C::Error> {
                match self {
                    Compound::Open { inner, .. } => inner.end(),
                    Compound::Cut(ok) => Ok(ok),
                }
            }
        }
    };
}

elements!(SerializeSeq, serialize_element);
elements!(SerializeTuple, serialize_element);
elements!(SerializeTupleStruct, serialize_field);
elements!(SerializeTupleVariant, serialize_field);

/// Implements a compound trait whose elements are named fields.
macro_rules! fields {
    ($trait:ident) => {
        impl<C: $trait> $trait for Compound<'_, C, C::Ok> {
            type Ok = C::Ok;
            type Error = C::Error;

            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), C::Error> {
                let child = self.child();
                if let (Compound::Open { inner, .. }, Some(at)) = (&mut *self, child) {
                    inner.serialize_field(key, &Bounded { value, at })?;
                }
                self.advance();
                Ok(())
            }

            fn skip_field(&mut self, key: &'static str) -> Result<(), C::Error> {
                match self {
                    Compound::Open { inner, .. } => inner.skip_field(key),
                    Compound::Cut(_) => Ok(()),
                }
            }

            fn end(self) -> Result<C::Ok, C::Error> {
                match self {
                    Compound::Open { inner, .. } => inner.end(),
                    Compound::Cut(ok) => Ok(ok),
                }
            }
        }
    };
}

fields!(SerializeStruct);
fields!(SerializeStructVariant);

impl<C: SerializeMap> SerializeMap for Compound<'_, C, C::Ok> {
    type Ok = C::Ok;
    type Error = C::Error;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), C::Error> {
        let child = self.child();
        if let (Compound::Open { inner, .. }, Some(at)) = (self, child) {
            inner.serialize_key(&Bounded { value: key, at })?;
        }
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), C::Error> {
        let child = self.child();
        if let (Compound::Open { inner, .. }, Some(at)) = (&mut *self, child) {
            inner.serialize_value(&Bounded { value, at })?;
        }
        self.advance();
        Ok(())
    }

    fn end(self) -> Result<C::Ok, C::Error> {
        match self {
            Compound::Open { inner, .. } => inner.end(),
            Compound::Cut(ok) => Ok(ok),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Serialize;

    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// `depth` nested arrays, built without recursion.
    fn nested(depth: usize) -> serde_json::Value {
        let mut v = serde_json::Value::Array(Vec::new());
        for _ in 0..depth {
            v = serde_json::Value::Array(vec![v]);
        }
        v
    }

    /// Drops a value without recursion (dropping a deep one recurses).
    fn dismantle(v: serde_json::Value) {
        let mut stack = vec![v];
        while let Some(v) = stack.pop() {
            match v {
                serde_json::Value::Array(items) => stack.extend(items),
                serde_json::Value::Object(map) => stack.extend(map.into_iter().map(|(_, v)| v)),
                _ => {}
            }
        }
    }

    #[derive(Serialize)]
    struct Doc {
        id: String,
        n: Option<i64>,
        doc: serde_json::Value,
        tags: Vec<String>,
    }

    fn decode(bytes: &[u8]) -> Result<rmpv::Value, Box<dyn std::error::Error>> {
        Ok(rmpv::decode::read_value_with_max_depth(
            &mut &bytes[..],
            1024,
        )?)
    }

    #[test]
    fn a_shallow_row_serializes_exactly_as_without_the_bound() -> TestResult {
        let doc = Doc {
            id: "a".into(),
            n: Some(3),
            doc: serde_json::json!({"x": [1, {"y": null}], "z": "t"}),
            tags: vec!["p".into()],
        };
        let limits = Limits::new(16);
        let bounded = rmp_serde::to_vec_named(&Bounded::new(&doc, &limits))?;
        assert_eq!(bounded, rmp_serde::to_vec_named(&doc)?);
        assert!(!limits.cut_outside());
        assert!((0..4).all(|i| !limits.cut_entry(i)));
        Ok(())
    }

    #[derive(Serialize)]
    enum Kind {
        Unit,
        Newtype(i32),
        Tuple(i32, String),
        Struct { a: Option<Box<Kind>> },
    }

    #[derive(Serialize)]
    struct Wrapper(u64);

    /// A byte string (`serialize_bytes`).
    struct Bytes(Vec<u8>);

    impl Serialize for Bytes {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(&self.0)
        }
    }

    #[derive(Serialize)]
    struct Everything {
        flag: bool,
        small: i8,
        big: u128,
        neg: i128,
        real: f32,
        c: char,
        bytes: Bytes,
        at: chrono::DateTime<chrono::Utc>,
        id: uuid::Uuid,
        kinds: Vec<Kind>,
        tuple: (u8, String, Option<()>),
        wrapper: Wrapper,
        map: BTreeMap<String, Vec<Option<f64>>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        skipped: Option<i32>,
    }

    #[test]
    fn every_kind_of_value_serializes_exactly_as_without_the_bound() -> TestResult {
        let row = Everything {
            flag: true,
            small: -3,
            big: u128::MAX,
            neg: i128::MIN,
            real: 1.5,
            c: 'é',
            bytes: Bytes(vec![0, 1, 255]),
            at: chrono::DateTime::from_timestamp(1_700_000_000, 5).ok_or("a time")?,
            id: uuid::Uuid::from_u128(42),
            kinds: vec![
                Kind::Unit,
                Kind::Newtype(7),
                Kind::Tuple(1, "t".into()),
                Kind::Struct {
                    a: Some(Box::new(Kind::Unit)),
                },
            ],
            tuple: (1, "x".into(), Some(())),
            wrapper: Wrapper(9),
            map: BTreeMap::from([("k".into(), vec![Some(1.0), None])]),
            skipped: None,
        };
        for named in [true, false] {
            let limits = Limits::new(16);
            let (bounded, plain) = if named {
                (
                    rmp_serde::to_vec_named(&Bounded::new(&row, &limits))?,
                    rmp_serde::to_vec_named(&row)?,
                )
            } else {
                (
                    rmp_serde::to_vec(&Bounded::new(&row, &limits))?,
                    rmp_serde::to_vec(&row)?,
                )
            };
            assert_eq!(bounded, plain);
            let limits = Limits::new(16);
            assert_eq!(
                serde_json::to_string(&Bounded::new(&row, &limits))?,
                serde_json::to_string(&row)?,
                "a human-readable format sees the same"
            );
        }
        Ok(())
    }

    #[test]
    fn a_value_past_the_bound_is_cut_to_nil_and_its_entry_is_named() -> TestResult {
        let doc = Doc {
            id: "a".into(),
            n: None,
            doc: nested(100_000),
            tags: vec!["p".into()],
        };
        let limits = Limits::new(64);
        let bytes = rmp_serde::to_vec_named(&Bounded::new(&doc, &limits));
        dismantle(doc.doc);
        let bytes = bytes?;
        assert!(limits.cut_entry(2), "the third field, doc, was cut");
        assert!(!limits.cut_entry(0) && !limits.cut_entry(1) && !limits.cut_entry(3));
        assert!(!limits.cut_outside());
        let rmpv::Value::Map(fields) = decode(&bytes)? else {
            return Err("not a map".into());
        };
        assert_eq!(fields.len(), 4);
        assert_eq!(fields[0].1.as_str(), Some("a"));
        assert_eq!(fields[3].1, rmpv::Value::Array(vec!["p".into()]));
        Ok(())
    }

    #[test]
    fn map_entries_and_deep_options_are_numbered_and_cut_too() -> TestResult {
        let mut row: BTreeMap<&str, serde_json::Value> = BTreeMap::new();
        row.insert("a", serde_json::json!(1));
        row.insert("b", nested(50));
        let limits = Limits::new(10);
        let bytes = rmp_serde::to_vec_named(&Bounded::new(&row, &limits));
        dismantle(row.remove("b").unwrap_or_default());
        assert!(limits.cut_entry(1) && !limits.cut_entry(0));
        assert!(matches!(decode(&bytes?)?, rmpv::Value::Map(m) if m.len() == 2));

        // Not a map at the top: the cut is outside any entry. Options are
        // wrappers, bounded on their own.
        type Deep = Option<Box<Option<Box<Option<i32>>>>>;
        let deep: Deep = Some(Box::new(Some(Box::new(Some(1)))));
        let limits = Limits::new(2);
        rmp_serde::to_vec_named(&Bounded::new(&deep, &limits))?;
        assert!(limits.cut_outside());
        let shallow: Deep = Some(Box::new(None));
        let limits = Limits::new(2);
        rmp_serde::to_vec_named(&Bounded::new(&shallow, &limits))?;
        assert!(!limits.cut_outside());
        Ok(())
    }
}
