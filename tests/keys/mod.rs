//! Primary keys of every column type, for the SQL targets' tests (`mod
//! keys;`): each case is a table keyed by one or more columns of given
//! types, and key values that are awkward for that type. The dialect's test
//! declares the rows, updates them, stops declaring some and checks the
//! table itself after each run.

#![allow(dead_code)]

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use weir::connectors::sql::{ColumnType, TableSchema};
use weir::prelude::*;

/// A field value, serialized exactly as given: maps keep the order of
/// their members, bytes are a byte string, an `F32` is a 32-bit float.
#[derive(Clone, Debug)]
pub enum Cell {
    /// An integer.
    Int(i64),
    /// An unsigned integer (beyond `i64` in JSON).
    UInt(u64),
    /// A 32-bit float.
    F32(f32),
    /// A 64-bit float.
    F64(f64),
    /// A boolean.
    Bool(bool),
    /// Text.
    Text(String),
    /// A byte string.
    Bytes(Vec<u8>),
    /// A list.
    List(Vec<Cell>),
    /// A map, its members in this order.
    Map(Vec<(String, Cell)>),
    /// A missing value (`None`).
    Null,
}

impl Serialize for Cell {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Cell::Int(i) => s.serialize_i64(*i),
            Cell::UInt(u) => s.serialize_u64(*u),
            Cell::F32(f) => s.serialize_f32(*f),
            Cell::F64(f) => s.serialize_f64(*f),
            Cell::Bool(b) => s.serialize_bool(*b),
            Cell::Text(t) => s.serialize_str(t),
            Cell::Bytes(b) => s.serialize_bytes(b),
            Cell::Null => s.serialize_none(),
            Cell::List(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Cell::Map(members) => {
                let mut map = s.serialize_map(Some(members.len()))?;
                for (k, v) in members {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

impl Cell {
    /// The same value with the members of every map in reverse order: the
    /// same JSON document, spelled differently.
    pub fn respelled(&self) -> Cell {
        match self {
            Cell::List(items) => Cell::List(items.iter().map(Cell::respelled).collect()),
            Cell::Map(members) => Cell::Map(
                members
                    .iter()
                    .rev()
                    .map(|(k, v)| (k.clone(), v.respelled()))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

/// A row of a case's table: key columns `k0`, `k1`, ... and the text
/// column `v`, serialized as a map.
#[derive(Clone, Debug)]
pub struct KeyedRow {
    /// The key values, in key order.
    pub key: Vec<Cell>,
    /// The value of `v`.
    pub v: String,
}

impl Serialize for KeyedRow {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.key.len() + 1))?;
        for (i, cell) in self.key.iter().enumerate() {
            map.serialize_entry(&format!("k{i}"), cell)?;
        }
        map.serialize_entry("v", &self.v)?;
        map.end()
    }
}

/// One table: its key's column types and its rows' key values.
#[derive(Clone, Debug)]
pub struct KeyCase {
    /// What the case is, for failure messages (the key's types).
    pub name: &'static str,
    /// The types of the key columns `k0`, `k1`, ...
    pub types: Vec<ColumnType>,
    /// The key values of each row.
    pub keys: Vec<Vec<Cell>>,
}

impl KeyCase {
    /// The table: the key columns, then a nullable text column `v`.
    pub fn schema(&self) -> Result<TableSchema> {
        let mut b = TableSchema::builder();
        let mut key = Vec::new();
        for (i, ty) in self.types.iter().enumerate() {
            let name = format!("k{i}");
            b = b.column(&name, ty.clone());
            key.push(name);
        }
        b.nullable_column("v", ColumnType::Text)
            .primary_key(key)
            .build()
    }

    /// The rows whose index `keep` accepts, with `v` = `{label} {index}`,
    /// their keys spelled as given or `respelled`.
    pub fn rows(
        &self,
        label: &str,
        respelled: bool,
        keep: impl Fn(usize) -> bool,
    ) -> Vec<KeyedRow> {
        self.keys
            .iter()
            .enumerate()
            .filter(|(i, _)| keep(*i))
            .map(|(i, key)| KeyedRow {
                key: if respelled {
                    key.iter().map(Cell::respelled).collect()
                } else {
                    key.clone()
                },
                v: format!("{label} {i}"),
            })
            .collect()
    }

    /// The values of `v` of the rows whose index `keep` accepts, sorted.
    pub fn values(&self, label: &str, keep: impl Fn(usize) -> bool) -> Vec<String> {
        let mut v: Vec<String> = (0..self.keys.len())
            .filter(|i| keep(*i))
            .map(|i| format!("{label} {i}"))
            .collect();
        v.sort();
        v
    }
}

/// Which rows the third run keeps declaring: every other one, so that the
/// deleted rows sit between kept ones.
pub fn kept(i: usize) -> bool {
    i.is_multiple_of(2)
}

fn text(s: &str) -> Cell {
    Cell::Text(s.to_string())
}

fn list(items: Vec<Cell>) -> Cell {
    Cell::List(items)
}

fn map(members: Vec<(&str, Cell)>) -> Cell {
    Cell::Map(
        members
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    )
}

fn array(inner: ColumnType) -> ColumnType {
    ColumnType::Array(Box::new(inner))
}

/// Single-column cases: one key value per row.
fn single(name: &'static str, ty: ColumnType, values: Vec<Cell>) -> KeyCase {
    KeyCase {
        name,
        types: vec![ty],
        keys: values.into_iter().map(|v| vec![v]).collect(),
    }
}

/// JSON documents no two of which are equal as JSON (nor as `jsonb`).
fn json_documents() -> Vec<Cell> {
    vec![
        map(vec![
            ("b", list(vec![Cell::Int(1), Cell::Int(2)])),
            ("a", Cell::Int(1)),
        ]),
        map(vec![
            (
                "z",
                map(vec![("y", Cell::Int(1)), ("x", text("é\u{1F600}"))]),
            ),
            ("a", Cell::Null),
        ]),
        map(vec![]),
        list(vec![]),
        list(vec![
            list(vec![Cell::Int(1), Cell::Int(2)]),
            list(vec![]),
            list(vec![list(vec![text("deep")])]),
        ]),
        text(""),
        text("quote \" and \\ back"),
        Cell::Int(i64::MIN),
        Cell::UInt(u64::MAX),
        Cell::F64(-1.5),
        Cell::F64(0.1),
        // Its shortest text parses back to another float unless JSON
        // numbers are parsed exactly.
        Cell::F64(212.918_907_267_134_59),
        Cell::Bool(true),
        map(vec![("x", Cell::F64(1.071_566_039_146_582_6e-75))]),
        Cell::Bool(false),
    ]
}

/// Every column type the connectors take as a key, alone, then in
/// composite keys that mix them. Arrays of arrays are SQLite's own: see
/// [`nested_array_cases`].
pub fn cases() -> Vec<KeyCase> {
    let uuid_bytes = (0..16u8).collect::<Vec<u8>>();
    vec![
        single(
            "Text",
            ColumnType::Text,
            vec![
                text(""),
                text("a"),
                text("A"),
                text("é\u{1F600}中文"),
                text("quote ' \" back \\ comma , braces {}"),
                text("NULL"),
                text("1"),
                text(" padded "),
                Cell::Text("x".repeat(2_000)),
            ],
        ),
        single(
            "SmallInt",
            ColumnType::SmallInt,
            [i16::MIN, -1, 0, 1, i16::MAX]
                .map(|i| Cell::Int(i64::from(i)))
                .to_vec(),
        ),
        single(
            "Integer",
            ColumnType::Integer,
            [i32::MIN, -7, 0, 7, i32::MAX]
                .map(|i| Cell::Int(i64::from(i)))
                .to_vec(),
        ),
        single(
            "BigInt",
            ColumnType::BigInt,
            [i64::MIN, i64::MIN + 1, -1, 0, 1, i64::MAX - 1, i64::MAX]
                .map(Cell::Int)
                .to_vec(),
        ),
        single(
            "Real",
            ColumnType::Real,
            [f32::MIN, -1.5, 0.0, 0.1, 1.0, f32::MIN_POSITIVE, f32::MAX]
                .map(Cell::F32)
                .to_vec(),
        ),
        single(
            "Double",
            ColumnType::Double,
            [
                f64::MIN,
                -2.25e100,
                -0.0,
                1e-300,
                0.1,
                1.0,
                2.5,
                1e21,
                f64::MAX,
            ]
            .map(Cell::F64)
            .to_vec(),
        ),
        single(
            "Boolean",
            ColumnType::Boolean,
            vec![Cell::Bool(false), Cell::Bool(true)],
        ),
        single(
            "Bytes",
            ColumnType::Bytes,
            vec![
                Cell::Bytes(vec![]),
                Cell::Bytes(vec![0]),
                Cell::Bytes(vec![0, 0]),
                Cell::Bytes(vec![1]),
                Cell::Bytes(vec![1, 0]),
                Cell::Bytes(vec![255, 0, 7]),
                Cell::Bytes((0..=255).collect()),
            ],
        ),
        single("Json", ColumnType::Json, json_documents()),
        single(
            "Timestamp",
            ColumnType::Timestamp,
            vec![
                text("1970-01-01T00:00:00Z"),
                text("1969-12-31T23:59:59Z"),
                text("0001-01-01T00:00:00Z"),
                text("2024-05-01T14:00:00+02:00"),
                text("2024-05-01T12:00:00.123456Z"),
                text("2000-01-01T00:00:01.5-08:00"),
                text("9999-12-31T23:59:59Z"),
                Cell::Int(1_700_000_000),
            ],
        ),
        single(
            "Uuid",
            ColumnType::Uuid,
            vec![
                text("00000000-0000-0000-0000-000000000000"),
                text("ffffffff-ffff-ffff-ffff-ffffffffffff"),
                text("67E55044-10B1-426F-9247-BB680E5FE0C8"),
                Cell::Bytes(uuid_bytes),
            ],
        ),
        single(
            "Array(Text)",
            array(ColumnType::Text),
            vec![
                list(vec![]),
                list(vec![text("")]),
                list(vec![text("a")]),
                list(vec![text("a"), text("b")]),
                list(vec![
                    text("NULL"),
                    text("a,b"),
                    text("{c}"),
                    text("\"q\""),
                    text("\\"),
                    text("é\u{1F600}"),
                ]),
                list(vec![text("a"), Cell::Null]),
            ],
        ),
        single(
            "Array(SmallInt)",
            array(ColumnType::SmallInt),
            vec![
                list(vec![]),
                list(vec![Cell::Int(i16::MIN.into()), Cell::Int(i16::MAX.into())]),
                list(vec![Cell::Int(0)]),
            ],
        ),
        single(
            "Array(Integer)",
            array(ColumnType::Integer),
            vec![
                list(vec![]),
                list(vec![Cell::Int(i32::MIN.into()), Cell::Int(-1)]),
                list(vec![Cell::Int(i32::MAX.into())]),
            ],
        ),
        single(
            "Array(BigInt)",
            array(ColumnType::BigInt),
            vec![
                list(vec![]),
                list(vec![Cell::Int(i64::MIN), Cell::Int(i64::MAX)]),
                list(vec![Cell::Int(1), Cell::Null, Cell::Int(-3)]),
                list(vec![Cell::Int(0)]),
                list(vec![Cell::Null]),
            ],
        ),
        single(
            "Array(Real)",
            array(ColumnType::Real),
            vec![
                list(vec![]),
                list(vec![Cell::F32(0.1), Cell::F32(1.0)]),
                list(vec![Cell::F32(-3.4e38)]),
            ],
        ),
        single(
            "Array(Double)",
            array(ColumnType::Double),
            vec![
                list(vec![]),
                list(vec![Cell::F64(-0.0), Cell::F64(1.5)]),
                list(vec![Cell::F64(1e300)]),
                list(vec![Cell::F64(0.1), Cell::F64(2.0), Cell::Null]),
            ],
        ),
        single(
            "Array(Boolean)",
            array(ColumnType::Boolean),
            vec![
                list(vec![]),
                list(vec![Cell::Bool(true), Cell::Bool(false)]),
                list(vec![Cell::Bool(false)]),
            ],
        ),
        single(
            "Array(Bytes)",
            array(ColumnType::Bytes),
            vec![
                list(vec![]),
                list(vec![Cell::Bytes(vec![0, 0]), Cell::Bytes(vec![])]),
                list(vec![Cell::Bytes(vec![1])]),
            ],
        ),
        single(
            "Array(Json)",
            array(ColumnType::Json),
            vec![
                list(vec![]),
                list(vec![map(vec![("b", Cell::Int(2)), ("a", Cell::Int(1))])]),
                list(vec![
                    list(vec![Cell::Int(1), Cell::Int(2)]),
                    text("x"),
                    Cell::F64(2.5),
                ]),
                list(vec![text("")]),
                list(vec![Cell::Null]),
                list(vec![Cell::F64(212.918_907_267_134_59)]),
            ],
        ),
        single(
            "Array(Timestamp)",
            array(ColumnType::Timestamp),
            vec![
                list(vec![]),
                list(vec![
                    text("2024-05-01T14:00:00+02:00"),
                    text("1970-01-01T00:00:00.5Z"),
                ]),
                list(vec![text("1969-12-31T23:59:59Z")]),
            ],
        ),
        single(
            "Array(Uuid)",
            array(ColumnType::Uuid),
            vec![
                list(vec![]),
                list(vec![
                    text("00000000-0000-0000-0000-000000000000"),
                    text("FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF"),
                ]),
            ],
        ),
        KeyCase {
            name: "(Text, BigInt)",
            types: vec![ColumnType::Text, ColumnType::BigInt],
            keys: vec![
                vec![text(""), Cell::Int(i64::MIN)],
                vec![text(""), Cell::Int(0)],
                vec![text("a"), Cell::Int(0)],
                vec![text("a"), Cell::Int(i64::MAX)],
                vec![text("é"), Cell::Int(-1)],
            ],
        },
        KeyCase {
            name: "(Uuid, Timestamp, Boolean, SmallInt)",
            types: vec![
                ColumnType::Uuid,
                ColumnType::Timestamp,
                ColumnType::Boolean,
                ColumnType::SmallInt,
            ],
            keys: vec![
                vec![
                    text("67e55044-10b1-426f-9247-bb680e5fe0c8"),
                    text("2024-05-01T14:00:00+02:00"),
                    Cell::Bool(true),
                    Cell::Int(-1),
                ],
                vec![
                    text("67e55044-10b1-426f-9247-bb680e5fe0c8"),
                    text("2024-05-01T14:00:00+02:00"),
                    Cell::Bool(false),
                    Cell::Int(-1),
                ],
                vec![
                    text("67e55044-10b1-426f-9247-bb680e5fe0c8"),
                    text("1970-01-01T00:00:00Z"),
                    Cell::Bool(true),
                    Cell::Int(0),
                ],
                vec![
                    text("00000000-0000-0000-0000-000000000000"),
                    text("1970-01-01T00:00:00Z"),
                    Cell::Bool(true),
                    Cell::Int(0),
                ],
            ],
        },
        KeyCase {
            name: "(Json, Array(Text), Bytes)",
            types: vec![ColumnType::Json, array(ColumnType::Text), ColumnType::Bytes],
            keys: vec![
                vec![
                    map(vec![("b", Cell::Int(1)), ("a", list(vec![]))]),
                    list(vec![text("x")]),
                    Cell::Bytes(vec![0]),
                ],
                vec![
                    map(vec![("b", Cell::Int(1)), ("a", list(vec![]))]),
                    list(vec![text("x")]),
                    Cell::Bytes(vec![0, 0]),
                ],
                vec![
                    map(vec![("b", Cell::Int(1)), ("a", list(vec![]))]),
                    list(vec![]),
                    Cell::Bytes(vec![0]),
                ],
                vec![list(vec![]), list(vec![]), Cell::Bytes(vec![])],
            ],
        },
        KeyCase {
            name: "(Double, Real, Integer)",
            types: vec![ColumnType::Double, ColumnType::Real, ColumnType::Integer],
            keys: vec![
                vec![Cell::F64(0.1), Cell::F32(0.1), Cell::Int(1)],
                vec![Cell::F64(0.1), Cell::F32(-0.5), Cell::Int(1)],
                vec![Cell::F64(-0.0), Cell::F32(0.1), Cell::Int(1)],
                vec![Cell::F64(1e-300), Cell::F32(0.1), Cell::Int(-1)],
            ],
        },
        KeyCase {
            name: "(Array(Json), Array(Double), Array(Uuid))",
            types: vec![
                array(ColumnType::Json),
                array(ColumnType::Double),
                array(ColumnType::Uuid),
            ],
            keys: vec![
                vec![
                    list(vec![map(vec![
                        ("y", Cell::Bool(true)),
                        ("x", Cell::Int(1)),
                    ])]),
                    list(vec![Cell::F64(1.0)]),
                    list(vec![text("00000000-0000-0000-0000-000000000001")]),
                ],
                vec![
                    list(vec![map(vec![
                        ("y", Cell::Bool(true)),
                        ("x", Cell::Int(1)),
                    ])]),
                    list(vec![Cell::F64(1.0)]),
                    list(vec![]),
                ],
                vec![list(vec![]), list(vec![]), list(vec![])],
            ],
        },
    ]
}

/// Keys of arrays of arrays, which SQLite stores as JSON text (PostgreSQL
/// refuses such columns).
pub fn nested_array_cases() -> Vec<KeyCase> {
    vec![
        single(
            "Array(Array(BigInt))",
            array(array(ColumnType::BigInt)),
            vec![
                list(vec![]),
                list(vec![list(vec![])]),
                list(vec![
                    list(vec![Cell::Int(1), Cell::Int(2)]),
                    list(vec![Cell::Int(3)]),
                ]),
                list(vec![
                    list(vec![Cell::Int(1)]),
                    list(vec![Cell::Int(2), Cell::Int(3)]),
                ]),
                list(vec![Cell::Null, list(vec![Cell::Null])]),
            ],
        ),
        single(
            "Array(Array(Json))",
            array(array(ColumnType::Json)),
            vec![
                list(vec![list(vec![map(vec![
                    ("b", Cell::Int(1)),
                    ("a", Cell::Int(2)),
                ])])]),
                list(vec![list(vec![text("s"), list(vec![])])]),
            ],
        ),
        single(
            "Array(Array(Timestamp))",
            array(array(ColumnType::Timestamp)),
            vec![
                list(vec![list(vec![text("2024-05-01T14:00:00+02:00")])]),
                list(vec![list(vec![]), list(vec![text("1970-01-01T00:00:00Z")])]),
            ],
        ),
    ]
}
