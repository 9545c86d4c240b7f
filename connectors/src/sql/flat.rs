//! The fast path of [`Row::from_serialize`](super::value::Row::from_serialize).
//!
//! Most rows are a struct (or a map) whose fields are scalars (numbers,
//! text, booleans, bytes, options of these) or JSON-like values (sequences,
//! maps and structs of these, as a JSON column holds). Such a row is
//! collected straight into generic values, field by field, without encoding
//! the whole row to MessagePack and decoding it back. The values are the
//! ones that round trip would give (integers keep their sign and width,
//! `f32` stays `F32`, a `char` is text, `None` and `()` are nil, a struct is
//! a map of its field names), so the conversion rules that follow are the
//! same on both paths.
//!
//! Anything else (an enum, a unit or tuple struct, a non-string key at the
//! top level, a value nested more than [`MAX_DEPTH`] levels) makes the
//! collector give up, and the row takes the general path, which handles
//! every shape and bounds nesting.

use std::borrow::Cow;
use std::fmt;

use rmpv::Value;
use serde::ser::{
    self, Impossible, Serialize, SerializeMap, SerializeSeq, SerializeStruct, SerializeTuple,
};

/// A row's fields by name, in serialization order.
pub(super) type Fields = Vec<(Cow<'static, str>, Value)>;

/// The deepest a field's value may nest on the fast path: a scalar is 0, a
/// list of scalars 1. Deeper values take the general path, which bounds
/// nesting at [`MAX_NESTING`](super::value::MAX_NESTING) levels with errors
/// of its own, so that the fast path never accepts what it would refuse.
pub(super) const MAX_DEPTH: usize = 32;

/// The fields of `row` if it is a struct or a map of scalar or JSON-like
/// values, or `None` if it needs the general path.
pub(super) fn flat_fields<T: Serialize + ?Sized>(row: &T) -> Option<Fields> {
    row.serialize(RowCollector).ok()
}

/// Why the fast path gave up (never shown: the general path takes over).
#[derive(Debug)]
pub(super) struct NotFlat;

impl fmt::Display for NotFlat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a flat row")
    }
}

impl std::error::Error for NotFlat {}

impl ser::Error for NotFlat {
    fn custom<T: fmt::Display>(_msg: T) -> Self {
        NotFlat
    }
}

/// Generates the methods of a serializer that refuse their input.
macro_rules! refuse {
    ($($name:ident($($arg:ty),*) -> $ret:ty;)*) => {
        $(fn $name(self, $(_: $arg),*) -> Result<$ret, NotFlat> {
            Err(NotFlat)
        })*
    };
}

/// A newtype's inner value, collected by `collector`; MessagePack gives
/// one newtype name a meaning of its own, which takes the general path.
fn newtype<S, T>(collector: S, name: &'static str, value: &T) -> Result<S::Ok, NotFlat>
where
    S: ser::Serializer<Error = NotFlat>,
    T: Serialize + ?Sized,
{
    if name == rmp_serde::MSGPACK_EXT_STRUCT_NAME {
        return Err(NotFlat);
    }
    value.serialize(collector)
}

/// Collects the top level of a row: a struct, a map, or a newtype of one.
struct RowCollector;

impl ser::Serializer for RowCollector {
    type Ok = Fields;
    type Error = NotFlat;
    type SerializeSeq = Impossible<Fields, NotFlat>;
    type SerializeTuple = Impossible<Fields, NotFlat>;
    type SerializeTupleStruct = Impossible<Fields, NotFlat>;
    type SerializeTupleVariant = Impossible<Fields, NotFlat>;
    type SerializeMap = MapFields;
    type SerializeStruct = StructFields;
    type SerializeStructVariant = Impossible<Fields, NotFlat>;

    // As MessagePack: types with a compact form (UUIDs, addresses) use it.
    fn is_human_readable(&self) -> bool {
        false
    }

    fn serialize_struct(self, _name: &'static str, len: usize) -> Result<StructFields, NotFlat> {
        Ok(StructFields(Vec::with_capacity(len)))
    }

    fn serialize_map(self, len: Option<usize>) -> Result<MapFields, NotFlat> {
        Ok(MapFields {
            fields: Vec::with_capacity(len.unwrap_or(0)),
            key: None,
        })
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<Fields, NotFlat> {
        newtype(self, name, value)
    }

    refuse! {
        serialize_bool(bool) -> Fields;
        serialize_i8(i8) -> Fields;
        serialize_i16(i16) -> Fields;
        serialize_i32(i32) -> Fields;
        serialize_i64(i64) -> Fields;
        serialize_u8(u8) -> Fields;
        serialize_u16(u16) -> Fields;
        serialize_u32(u32) -> Fields;
        serialize_u64(u64) -> Fields;
        serialize_f32(f32) -> Fields;
        serialize_f64(f64) -> Fields;
        serialize_char(char) -> Fields;
        serialize_str(&str) -> Fields;
        serialize_bytes(&[u8]) -> Fields;
        serialize_none() -> Fields;
        serialize_unit() -> Fields;
        serialize_unit_struct(&'static str) -> Fields;
        serialize_unit_variant(&'static str, u32, &'static str) -> Fields;
        serialize_seq(Option<usize>) -> Impossible<Fields, NotFlat>;
        serialize_tuple(usize) -> Impossible<Fields, NotFlat>;
        serialize_tuple_struct(&'static str, usize) -> Impossible<Fields, NotFlat>;
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> Impossible<Fields, NotFlat>;
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> Impossible<Fields, NotFlat>;
    }

    fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<Fields, NotFlat> {
        Err(NotFlat)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<Fields, NotFlat> {
        Err(NotFlat)
    }
}

/// The fields of a struct row.
struct StructFields(Fields);

impl SerializeStruct for StructFields {
    type Ok = Fields;
    type Error = NotFlat;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), NotFlat> {
        self.0.push((
            Cow::Borrowed(key),
            value.serialize(ValueCollector::field())?,
        ));
        Ok(())
    }

    fn end(self) -> Result<Fields, NotFlat> {
        Ok(self.0)
    }
}

/// The entries of a map row (string keys only).
struct MapFields {
    fields: Fields,
    key: Option<String>,
}

impl SerializeMap for MapFields {
    type Ok = Fields;
    type Error = NotFlat;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), NotFlat> {
        match key.serialize(ValueCollector::field())? {
            Value::String(s) => {
                self.key = Some(s.into_str().ok_or(NotFlat)?);
                Ok(())
            }
            _ => Err(NotFlat),
        }
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NotFlat> {
        let key = self.key.take().ok_or(NotFlat)?;
        self.fields
            .push((Cow::Owned(key), value.serialize(ValueCollector::field())?));
        Ok(())
    }

    fn end(self) -> Result<Fields, NotFlat> {
        Ok(self.fields)
    }
}

/// Collects one field value, as MessagePack would encode it, nesting at
/// most `depth_left` more levels.
#[derive(Clone, Copy)]
struct ValueCollector {
    depth_left: usize,
}

impl ValueCollector {
    /// The collector of a row's field.
    fn field() -> Self {
        Self {
            depth_left: MAX_DEPTH,
        }
    }

    /// The collector of the items of a sequence or map this one opens.
    fn inner(self) -> Result<Self, NotFlat> {
        Ok(Self {
            depth_left: self.depth_left.checked_sub(1).ok_or(NotFlat)?,
        })
    }
}

impl ser::Serializer for ValueCollector {
    type Ok = Value;
    type Error = NotFlat;
    type SerializeSeq = Items;
    type SerializeTuple = Items;
    type SerializeTupleStruct = Impossible<Value, NotFlat>;
    type SerializeTupleVariant = Impossible<Value, NotFlat>;
    type SerializeMap = Entries;
    type SerializeStruct = Entries;
    type SerializeStructVariant = Impossible<Value, NotFlat>;

    fn is_human_readable(&self) -> bool {
        false
    }

    fn serialize_bool(self, v: bool) -> Result<Value, NotFlat> {
        Ok(Value::Boolean(v))
    }
    fn serialize_i8(self, v: i8) -> Result<Value, NotFlat> {
        Ok(Value::from(v))
    }
    fn serialize_i16(self, v: i16) -> Result<Value, NotFlat> {
        Ok(Value::from(v))
    }
    fn serialize_i32(self, v: i32) -> Result<Value, NotFlat> {
        Ok(Value::from(v))
    }
    fn serialize_i64(self, v: i64) -> Result<Value, NotFlat> {
        Ok(Value::from(v))
    }
    fn serialize_u8(self, v: u8) -> Result<Value, NotFlat> {
        Ok(Value::from(v))
    }
    fn serialize_u16(self, v: u16) -> Result<Value, NotFlat> {
        Ok(Value::from(v))
    }
    fn serialize_u32(self, v: u32) -> Result<Value, NotFlat> {
        Ok(Value::from(v))
    }
    fn serialize_u64(self, v: u64) -> Result<Value, NotFlat> {
        Ok(Value::from(v))
    }
    fn serialize_f32(self, v: f32) -> Result<Value, NotFlat> {
        Ok(Value::F32(v))
    }
    fn serialize_f64(self, v: f64) -> Result<Value, NotFlat> {
        Ok(Value::F64(v))
    }
    fn serialize_char(self, v: char) -> Result<Value, NotFlat> {
        Ok(Value::from(v.to_string()))
    }
    fn serialize_str(self, v: &str) -> Result<Value, NotFlat> {
        Ok(Value::from(v))
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<Value, NotFlat> {
        Ok(Value::Binary(v.to_vec()))
    }
    fn serialize_none(self) -> Result<Value, NotFlat> {
        Ok(Value::Nil)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Value, NotFlat> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<Value, NotFlat> {
        Ok(Value::Nil)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<Value, NotFlat> {
        newtype(self, name, value)
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Items, NotFlat> {
        Items::new(self, len.unwrap_or(0))
    }

    fn serialize_tuple(self, len: usize) -> Result<Items, NotFlat> {
        Items::new(self, len)
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Entries, NotFlat> {
        Entries::new(self, len.unwrap_or(0))
    }

    fn serialize_struct(self, _name: &'static str, len: usize) -> Result<Entries, NotFlat> {
        Entries::new(self, len)
    }

    refuse! {
        serialize_unit_struct(&'static str) -> Value;
        serialize_unit_variant(&'static str, u32, &'static str) -> Value;
        serialize_tuple_struct(&'static str, usize) -> Impossible<Value, NotFlat>;
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> Impossible<Value, NotFlat>;
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> Impossible<Value, NotFlat>;
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<Value, NotFlat> {
        Err(NotFlat)
    }
}

/// The items of a sequence or tuple: an array.
struct Items {
    items: Vec<Value>,
    collector: ValueCollector,
}

impl Items {
    fn new(outer: ValueCollector, len: usize) -> Result<Self, NotFlat> {
        Ok(Self {
            items: Vec::with_capacity(len),
            collector: outer.inner()?,
        })
    }

    fn push<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NotFlat> {
        self.items.push(value.serialize(self.collector)?);
        Ok(())
    }
}

/// Implements serde's traits for sequences and tuples on [`Items`]: both
/// are arrays.
macro_rules! items_as_array {
    ($($trait_name:ident),*) => {
        $(impl $trait_name for Items {
            type Ok = Value;
            type Error = NotFlat;

            fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NotFlat> {
                self.push(value)
            }

            fn end(self) -> Result<Value, NotFlat> {
                Ok(Value::Array(self.items))
            }
        })*
    };
}

items_as_array!(SerializeSeq, SerializeTuple);

/// The entries of a map, or the fields of a struct by name: a map.
struct Entries {
    entries: Vec<(Value, Value)>,
    key: Option<Value>,
    collector: ValueCollector,
}

impl Entries {
    fn new(outer: ValueCollector, len: usize) -> Result<Self, NotFlat> {
        Ok(Self {
            entries: Vec::with_capacity(len),
            key: None,
            collector: outer.inner()?,
        })
    }
}

impl SerializeMap for Entries {
    type Ok = Value;
    type Error = NotFlat;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), NotFlat> {
        self.key = Some(key.serialize(self.collector)?);
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NotFlat> {
        let key = self.key.take().ok_or(NotFlat)?;
        self.entries.push((key, value.serialize(self.collector)?));
        Ok(())
    }

    fn end(self) -> Result<Value, NotFlat> {
        Ok(Value::Map(self.entries))
    }
}

impl SerializeStruct for Entries {
    type Ok = Value;
    type Error = NotFlat;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), NotFlat> {
        let value = value.serialize(self.collector)?;
        self.entries.push((Value::from(key), value));
        Ok(())
    }

    fn end(self) -> Result<Value, NotFlat> {
        Ok(Value::Map(self.entries))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Serialize;

    use super::*;

    /// What the general path reads back: the row encoded to MessagePack
    /// and decoded as a map.
    fn round_trip<T: Serialize>(row: &T) -> Option<Fields> {
        let bytes = rmp_serde::to_vec_named(row).ok()?;
        match rmpv::decode::read_value(&mut bytes.as_slice()).ok()? {
            Value::Map(entries) => entries
                .into_iter()
                .map(|(k, v)| Some((Cow::Owned(k.as_str()?.to_string()), v)))
                .collect(),
            _ => None,
        }
    }

    #[derive(Serialize)]
    struct Id(i64);

    #[derive(Serialize)]
    struct Scalars {
        b: bool,
        i8: i8,
        i16: i16,
        i32: i32,
        i64: i64,
        negative: i64,
        u8: u8,
        u16: u16,
        u32: u32,
        u64: u64,
        f32: f32,
        f64: f64,
        nan: f64,
        c: char,
        s: String,
        empty: &'static str,
        none: Option<i64>,
        some: Option<String>,
        unit: (),
        id: Id,
        #[serde(with = "serde_bytes_like")]
        bytes: Vec<u8>,
        #[serde(skip_serializing_if = "Option::is_none")]
        skipped: Option<i64>,
        /// A type whose form depends on `is_human_readable` (bytes here).
        uuid: uuid::Uuid,
    }

    /// Serializes a byte vector as MessagePack bytes (as `serde_bytes` does).
    mod serde_bytes_like {
        pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(v)
        }
    }

    fn scalars() -> Scalars {
        Scalars {
            b: true,
            i8: -8,
            i16: 16,
            i32: -32,
            i64: i64::MIN,
            negative: -1,
            u8: 255,
            u16: 16,
            u32: u32::MAX,
            u64: u64::MAX,
            f32: 1.5,
            f64: -2.25,
            nan: f64::NAN,
            c: 'é',
            s: "text".into(),
            empty: "",
            none: None,
            some: Some("x".into()),
            unit: (),
            id: Id(7),
            bytes: vec![0, 1, 255],
            skipped: None,
            uuid: uuid::Uuid::from_u128(1),
        }
    }

    /// Values compared by their encoding (NaN is not equal to itself).
    fn encoded(fields: &Fields) -> Vec<(String, Vec<u8>)> {
        fields
            .iter()
            .map(|(k, v)| {
                let mut buf = Vec::new();
                let _ = rmpv::encode::write_value(&mut buf, v);
                (k.to_string(), buf)
            })
            .collect()
    }

    #[test]
    fn a_struct_of_scalars_collects_the_values_the_round_trip_gives() {
        let row = scalars();
        let fast = flat_fields(&row).map(|f| encoded(&f));
        let slow = round_trip(&row).map(|f| encoded(&f));
        assert!(fast.is_some());
        assert_eq!(fast, slow);
    }

    #[test]
    fn a_map_of_scalars_collects_the_values_the_round_trip_gives() {
        let row = BTreeMap::from([("a", Some(1.5)), ("b", None), ("c", Some(-3.0))]);
        let fast = flat_fields(&row).map(|f| encoded(&f));
        assert!(fast.is_some());
        assert_eq!(fast, round_trip(&row).map(|f| encoded(&f)));
    }

    #[test]
    fn nested_values_collect_what_the_round_trip_gives() {
        #[derive(Serialize)]
        struct Inner {
            name: &'static str,
            #[serde(with = "serde_bytes_like")]
            raw: Vec<u8>,
            maybe: Option<u64>,
            pair: (i8, f32),
        }
        #[derive(Serialize)]
        struct Row {
            id: i64,
            tags: Vec<String>,
            doc: serde_json::Value,
            inner: Inner,
            by_number: BTreeMap<u32, Vec<Option<bool>>>,
            empty: Vec<i64>,
        }
        let row = Row {
            id: 1,
            tags: vec!["a".into(), "b".into()],
            doc: serde_json::json!({
                "seq": 7, "big": u64::MAX, "neg": -3, "ratio": 0.5, "none": null,
                "list": [1, "two", [3.0, {"four": true}]], "text": "é\"x",
            }),
            inner: Inner {
                name: "n",
                raw: vec![0, 255],
                maybe: Some(9),
                pair: (-1, 2.5),
            },
            by_number: BTreeMap::from([(3, vec![Some(true), None])]),
            empty: Vec::new(),
        };
        let fast = flat_fields(&row).map(|f| encoded(&f));
        assert!(fast.is_some());
        assert_eq!(fast, round_trip(&row).map(|f| encoded(&f)));
        let map = BTreeMap::from([("a", vec![1]), ("b", vec![])]);
        let fast = flat_fields(&map).map(|f| encoded(&f));
        assert!(fast.is_some());
        assert_eq!(fast, round_trip(&map).map(|f| encoded(&f)));
    }

    /// `{"v": [[...[0]...]]}`, the number `depth` lists deep.
    fn nested_lists(depth: usize) -> BTreeMap<&'static str, serde_json::Value> {
        let mut v = serde_json::json!(0);
        for _ in 0..depth {
            v = serde_json::Value::Array(vec![v]);
        }
        BTreeMap::from([("v", v)])
    }

    #[test]
    fn values_nested_deeper_than_the_bound_take_the_general_path() {
        let at_bound = nested_lists(MAX_DEPTH);
        let fast = flat_fields(&at_bound).map(|f| encoded(&f));
        assert!(fast.is_some());
        assert_eq!(fast, round_trip(&at_bound).map(|f| encoded(&f)));
        assert!(flat_fields(&nested_lists(MAX_DEPTH + 1)).is_none());
    }

    #[test]
    fn enums_unit_structs_and_odd_keys_take_the_general_path() {
        #[derive(Serialize)]
        enum Kind {
            A,
        }
        #[derive(Serialize)]
        struct WithEnum {
            kind: Kind,
        }
        #[derive(Serialize)]
        struct WithNestedEnum {
            kinds: Vec<Kind>,
        }
        #[derive(Serialize)]
        struct Unit;
        #[derive(Serialize)]
        struct WithUnitStruct {
            u: Unit,
        }
        #[derive(Serialize)]
        struct Pair(i64, i64);
        #[derive(Serialize)]
        struct WithTupleStruct {
            p: Pair,
        }
        assert!(flat_fields(&WithEnum { kind: Kind::A }).is_none());
        assert!(flat_fields(&WithNestedEnum {
            kinds: vec![Kind::A]
        })
        .is_none());
        assert!(flat_fields(&WithUnitStruct { u: Unit }).is_none());
        assert!(flat_fields(&WithTupleStruct { p: Pair(1, 2) }).is_none());
        assert!(flat_fields(&BTreeMap::from([(1, 2)])).is_none());
        assert!(flat_fields(&5_i64).is_none());
        assert!(flat_fields(&Some(scalars())).is_none());
        assert!(flat_fields(&vec![1, 2]).is_none());
        // Not human-readable, an address is an enum of byte arrays.
        #[derive(Serialize)]
        struct WithAddress {
            ip: std::net::IpAddr,
        }
        let ip = std::net::IpAddr::from([127, 0, 0, 1]);
        assert!(flat_fields(&WithAddress { ip }).is_none());
    }
}
