//! Fingerprints: short, stable digests of values, for content-based change
//! detection.
//!
//! A [`Fingerprint`] is the first 16 bytes of a BLAKE3 hash. It is the same on
//! every run, platform and architecture, so it can be kept as a tracking
//! record in place of the content it summarizes: a connector compares the
//! fingerprint of the desired content with the previous records to decide
//! whether anything has to be written.
//!
//! There are two ways to make one, and they never produce the same digest for
//! the same input, because each hashes in its own BLAKE3 key-derivation
//! context:
//!
//! - [`Fingerprint::from`] (`Fingerprint::from(&value)`) hashes the
//!   MessagePack encoding of any [`Serialize`] value
//!   ([`Fingerprint::from_msgpack`] takes that encoding, made by the caller);
//! - [`Fingerprint::from_bytes`] hashes raw bytes as they are
//!   ([`Fingerprint::from_reader`] streams them from a reader, with the same
//!   digest).

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use crate::error::Error;

/// The number of bytes in a [`Fingerprint`].
const LEN: usize = 16;

/// The BLAKE3 key-derivation context of fingerprints of serialized values.
const SERDE_CONTEXT: &str = "weir fingerprint v1: MessagePack-encoded value";
/// The BLAKE3 key-derivation context of fingerprints of raw bytes.
const BYTES_CONTEXT: &str = "weir fingerprint v1: raw bytes";
/// The BLAKE3 key-derivation context of values that could not be serialized.
const SERDE_ERROR_CONTEXT: &str = "weir fingerprint v1: value that failed to serialize";

/// A 128-bit digest of a value: the first 16 bytes of its BLAKE3 hash.
///
/// Fingerprints are stable across runs and platforms, compare and order by
/// their bytes, and are displayed as 32 lowercase hexadecimal digits (which
/// [`FromStr`] parses back).
///
/// A fingerprint is itself serializable, so it can serve as a tracking
/// record. Compact formats (such as MessagePack) store it as a 16-byte
/// binary string; human-readable formats (such as JSON) store it as its hex
/// form.
///
/// Note that `Fingerprint::from(&fingerprint)` is the fingerprint *of* a
/// fingerprint, not a copy of it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; LEN]);

impl Fingerprint {
    /// Fingerprints raw bytes.
    ///
    /// The bytes are hashed in a BLAKE3 context of their own, so
    /// `Fingerprint::from_bytes(b)` is not equal to `Fingerprint::from(&b)`
    /// (which hashes the MessagePack encoding of `b`): pick one form per
    /// tracking record and stick to it.
    pub fn from_bytes(bytes: &[u8]) -> Fingerprint {
        let mut hasher = bytes_hasher();
        hasher.update(bytes);
        Self::finish(&hasher)
    }

    /// Fingerprints everything `reader` yields, streamed through the hasher
    /// in 64 KiB chunks: the content never has to be in memory at once.
    ///
    /// The digest is the one [`Fingerprint::from_bytes`] gives for the same
    /// bytes, so a file can be fingerprinted from disk and compared with
    /// the fingerprint of content held in memory. Reads interrupted by a
    /// signal are retried.
    ///
    /// # Errors
    /// The first read error other than [`std::io::ErrorKind::Interrupted`].
    pub fn from_reader(reader: impl std::io::Read) -> std::io::Result<Fingerprint> {
        let mut hasher = bytes_hasher();
        hasher.update_reader(reader)?;
        Ok(Self::finish(&hasher))
    }

    /// Fingerprints a value given as its MessagePack encoding: the bytes
    /// `rmp_serde::to_vec(&value)` returns (structs as arrays). The digest
    /// is `Fingerprint::from(&value)`'s.
    ///
    /// For connectors that encode their values themselves, more cheaply
    /// than through serde, and must keep the digests their ledgers hold.
    pub fn from_msgpack(encoded: &[u8]) -> Fingerprint {
        hash_serialized(encoded)
    }

    /// The 16 bytes of the fingerprint.
    pub fn as_bytes(&self) -> &[u8; LEN] {
        &self.0
    }

    /// Truncates the output of `hasher` to a fingerprint. `finalize` is the
    /// first 32 bytes of the extendable output, computed without an output
    /// reader (which costs more for 16 bytes).
    fn finish(hasher: &blake3::Hasher) -> Fingerprint {
        let mut out = [0u8; LEN];
        out.copy_from_slice(&hasher.finalize().as_bytes()[..LEN]);
        Fingerprint(out)
    }
}

/// A hasher in one of the key-derivation contexts, its key derived once
/// (cloning it gives the same digests as deriving the key again).
fn context_hasher(
    cell: &'static std::sync::OnceLock<blake3::Hasher>,
    context: &str,
) -> blake3::Hasher {
    cell.get_or_init(|| blake3::Hasher::new_derive_key(context))
        .clone()
}

/// The hasher of serialized values.
fn serde_hasher() -> blake3::Hasher {
    static HASHER: std::sync::OnceLock<blake3::Hasher> = std::sync::OnceLock::new();
    context_hasher(&HASHER, SERDE_CONTEXT)
}

thread_local! {
    /// This thread's hasher of serialized values, reset before each use.
    /// A hasher holds about 1.9 KB of state, which getting a fresh one (a
    /// clone of the shared one, returned by value) copies for every
    /// fingerprint.
    static SERDE_HASHER: std::cell::RefCell<Option<blake3::Hasher>> =
        const { std::cell::RefCell::new(None) };
}

/// The fingerprint of a value's MessagePack encoding.
fn hash_serialized(encoded: &[u8]) -> Fingerprint {
    let kept = SERDE_HASHER.try_with(|cell| {
        let mut slot = cell.try_borrow_mut().ok()?;
        let hasher = slot.get_or_insert_with(serde_hasher);
        // Back to the context's initial state: same key, no input.
        hasher.reset();
        hasher.update(encoded);
        Some(Fingerprint::finish(hasher))
    });
    match kept {
        Ok(Some(fingerprint)) => fingerprint,
        // A thread being torn down, or a fingerprint taken while this
        // thread's is (which nothing does): a hasher of its own.
        _ => hash_serialized_afresh(encoded),
    }
}

/// [`hash_serialized`] with a hasher of its own.
fn hash_serialized_afresh(encoded: &[u8]) -> Fingerprint {
    let mut hasher = serde_hasher();
    hasher.update(encoded);
    Fingerprint::finish(&hasher)
}

/// The hasher of raw bytes.
fn bytes_hasher() -> blake3::Hasher {
    static HASHER: std::sync::OnceLock<blake3::Hasher> = std::sync::OnceLock::new();
    context_hasher(&HASHER, BYTES_CONTEXT)
}

/// Fingerprints any serializable value.
///
/// The value is encoded with MessagePack (`rmp_serde`, structs as arrays)
/// and hashed. The digest
/// therefore follows the serialized form: two values with the same encoding
/// have the same fingerprint, whatever their Rust types. For a stable
/// fingerprint the encoding must be deterministic: prefer `BTreeMap` to
/// `HashMap`, whose iteration order changes from run to run.
///
/// `From` cannot fail, so if the value refuses to serialize (a `Serialize`
/// impl returning an error, such as a map with non-string keys in some
/// formats), the fingerprint is instead the hash of the error message in a
/// separate BLAKE3 context. It is still deterministic, and it never equals
/// the fingerprint of a value that serialized successfully, but all values
/// that fail with the same message share it.
impl<T: Serialize + ?Sized> From<&T> for Fingerprint {
    fn from(value: &T) -> Self {
        // The context's key is derived once; the value is encoded into a
        // reused buffer and hashed in one call (many tiny `update` calls
        // cost more than the copy). The digest is the same either way.
        match super::encode::with_encoded(value, hash_serialized) {
            Ok(fingerprint) => fingerprint,
            Err(error) => {
                let mut hasher = blake3::Hasher::new_derive_key(SERDE_ERROR_CONTEXT);
                hasher.update(error.to_string().as_bytes());
                Self::finish(&hasher)
            }
        }
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in &self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// The value of one hexadecimal digit, either case.
fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Parses exactly 32 hexadecimal digits (either case).
fn parse_hex(s: &str) -> Option<[u8; LEN]> {
    let digits = s.as_bytes();
    if digits.len() != 2 * LEN {
        return None;
    }
    let mut out = [0u8; LEN];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        let [high, low] = pair else {
            return None;
        };
        *byte = (hex_digit(*high)? << 4) | hex_digit(*low)?;
    }
    Some(out)
}

/// Parses the [`Display`](fmt::Display) form: 32 hexadecimal digits.
/// Upper-case digits are accepted too.
impl FromStr for Fingerprint {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_hex(s).map(Fingerprint).ok_or_else(|| {
            Error::msg(format!(
                "invalid fingerprint {s:?}: expected {} hexadecimal digits",
                2 * LEN
            ))
        })
    }
}

impl Serialize for Fingerprint {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.collect_str(self)
        } else {
            serializer.serialize_bytes(&self.0)
        }
    }
}

impl<'de> Deserialize<'de> for Fingerprint {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            deserializer.deserialize_str(FingerprintVisitor)
        } else {
            deserializer.deserialize_bytes(FingerprintVisitor)
        }
    }
}

/// Accepts a fingerprint as 16 bytes, a sequence of 16 integers or a hex string.
struct FingerprintVisitor;

impl<'de> Visitor<'de> for FingerprintVisitor {
    type Value = Fingerprint;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a fingerprint: {LEN} bytes or {} hexadecimal digits",
            2 * LEN
        )
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Fingerprint, E> {
        <[u8; LEN]>::try_from(v)
            .map(Fingerprint)
            .map_err(|_| E::invalid_length(v.len(), &self))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Fingerprint, E> {
        parse_hex(v)
            .map(Fingerprint)
            .ok_or_else(|| E::invalid_value(de::Unexpected::Str(v), &self))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Fingerprint, A::Error> {
        let mut out = [0u8; LEN];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = seq
                .next_element()?
                .ok_or_else(|| de::Error::invalid_length(i, &self))?;
        }
        if seq.next_element::<de::IgnoredAny>()?.is_some() {
            return Err(de::Error::invalid_length(LEN + 1, &self));
        }
        Ok(Fingerprint(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[derive(Serialize)]
    struct Row<'a> {
        id: u64,
        name: &'a str,
        tags: Vec<&'a str>,
    }

    #[test]
    fn a_values_msgpack_encoding_has_the_values_fingerprint() -> Result<(), rmp_serde::encode::Error>
    {
        let row = Row {
            id: 7,
            name: "seven",
            tags: vec!["odd", "prime"],
        };
        let encoded = rmp_serde::to_vec(&row)?;
        assert_eq!(Fingerprint::from_msgpack(&encoded), Fingerprint::from(&row));
        assert_ne!(
            Fingerprint::from_msgpack(&encoded),
            Fingerprint::from_bytes(&encoded)
        );
        Ok(())
    }

    #[test]
    fn equal_values_have_equal_fingerprints() {
        let a = Row {
            id: 7,
            name: "seven",
            tags: vec!["odd", "prime"],
        };
        let b = Row {
            id: 7,
            name: "seven",
            tags: vec!["odd", "prime"],
        };
        assert_eq!(Fingerprint::from(&a), Fingerprint::from(&b));
        assert_eq!(
            Fingerprint::from_bytes(b"abc"),
            Fingerprint::from_bytes(b"abc")
        );
    }

    #[test]
    fn different_values_have_different_fingerprints() {
        let a = Row {
            id: 7,
            name: "seven",
            tags: vec!["odd", "prime"],
        };
        let b = Row {
            id: 7,
            name: "seven",
            tags: vec!["prime", "odd"],
        };
        assert_ne!(Fingerprint::from(&a), Fingerprint::from(&b));
        assert_ne!(Fingerprint::from(&1u32), Fingerprint::from(&2u32));
        assert_ne!(Fingerprint::from("a"), Fingerprint::from("b"));
        assert_ne!(Fingerprint::from_bytes(b"a"), Fingerprint::from_bytes(b"b"));
        assert_ne!(Fingerprint::from_bytes(b""), Fingerprint::from_bytes(b"\0"));
    }

    #[test]
    fn raw_bytes_and_serialized_values_are_hashed_in_separate_domains() {
        let bytes: &[u8] = b"weir";
        assert_ne!(Fingerprint::from_bytes(bytes), Fingerprint::from(bytes));
        assert_ne!(Fingerprint::from_bytes(bytes), Fingerprint::from("weir"));
        // The MessagePack encoding of "weir" is 0xa4 followed by the text.
        assert_ne!(
            Fingerprint::from_bytes(b"\xa4weir"),
            Fingerprint::from("weir")
        );
    }

    #[test]
    fn fingerprints_follow_the_encoding_not_the_rust_type() {
        assert_eq!(Fingerprint::from(&5u8), Fingerprint::from(&5u64));
        assert_eq!(
            Fingerprint::from("x"),
            Fingerprint::from(&String::from("x"))
        );
        let map: BTreeMap<&str, i32> = [("b", 2), ("a", 1)].into_iter().collect();
        let reordered: BTreeMap<&str, i32> = [("a", 1), ("b", 2)].into_iter().collect();
        assert_eq!(Fingerprint::from(&map), Fingerprint::from(&reordered));
    }

    #[test]
    fn values_that_fail_to_serialize_still_get_a_deterministic_fingerprint() {
        struct Refuses;
        impl Serialize for Refuses {
            fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
                Err(serde::ser::Error::custom("refused"))
            }
        }
        let a = Fingerprint::from(&Refuses);
        assert_eq!(a, Fingerprint::from(&Refuses));
        assert_ne!(a, Fingerprint::from("refused"));
        assert_ne!(a, Fingerprint::from_bytes(b"refused"));
    }

    #[test]
    fn a_threads_kept_hasher_starts_each_fingerprint_afresh() {
        // Each fingerprint on a thread reuses its hasher: nothing of the
        // one before may carry over.
        let inputs: Vec<Vec<u8>> = vec![
            b"\x93\x01\x02\x03".to_vec(),
            vec![7u8; 5000],
            Vec::new(),
            b"\xa1x".to_vec(),
        ];
        let sent = inputs.clone();
        let on_one_thread = std::thread::spawn(move || {
            sent.iter()
                .chain(sent.iter())
                .map(|b| Fingerprint::from_msgpack(b))
                .collect::<Vec<_>>()
        })
        .join()
        .map_err(|_| "the fingerprinting thread panicked");
        let expected: Vec<Fingerprint> = inputs
            .iter()
            .chain(inputs.iter())
            .map(|b| hash_serialized_afresh(b))
            .collect();
        assert_eq!(on_one_thread, Ok(expected));
    }

    #[test]
    fn pinned_values_do_not_change_between_releases() {
        // Computed once; a change here means stored tracking records would no
        // longer match and every target would be rewritten.
        assert_eq!(
            Fingerprint::from(&("weir", 1u32, [true, false])).to_string(),
            "881f05f6c26e98b5de7f7179a00118b7"
        );
        assert_eq!(
            Fingerprint::from_bytes(b"weir").to_string(),
            "1d9789aa1b49e869a38ed7142ba4013f"
        );
        assert_eq!(
            Fingerprint::from_bytes(b"").to_string(),
            "8c2a1a6f4cc4e2ee04afffd6dfa4ad77"
        );
    }

    /// Serializes as the fingerprint of its text, taken while serializing.
    struct Nested(&'static str);

    impl Serialize for Nested {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            Fingerprint::from(&self.0).serialize(s)
        }
    }

    #[test]
    fn a_fingerprint_taken_while_serializing_another_value_is_the_same() {
        let inner = Fingerprint::from(&"inner");
        assert_eq!(
            Fingerprint::from(&(Nested("inner"), 1u8)),
            Fingerprint::from(&(inner, 1u8))
        );
    }

    #[test]
    fn serialized_values_are_hashed_as_their_message_pack_encoding() {
        // fixarray(3), fixstr(4) "weir", 1, fixarray(2), true, false
        let encoding = [0x93, 0xa4, b'w', b'e', b'i', b'r', 0x01, 0x92, 0xc3, 0xc2];
        let mut hasher = blake3::Hasher::new_derive_key(SERDE_CONTEXT);
        hasher.update(&encoding);
        assert_eq!(
            Fingerprint::from(&("weir", 1u32, [true, false])),
            Fingerprint::finish(&hasher)
        );
    }

    #[test]
    fn display_is_32_lowercase_hex_digits_and_parses_back() -> crate::error::Result<()> {
        let fp = Fingerprint::from(&"round trip");
        let text = fp.to_string();
        assert_eq!(text.len(), 32);
        assert!(text
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
        assert_eq!(text.parse::<Fingerprint>()?, fp);
        assert_eq!(text.to_uppercase().parse::<Fingerprint>()?, fp);
        assert_eq!(format!("{fp:?}"), format!("Fingerprint({text})"));
        Ok(())
    }

    #[test]
    fn malformed_hex_is_rejected() {
        let fp = Fingerprint::from_bytes(b"x").to_string();
        assert!(fp[..31].parse::<Fingerprint>().is_err());
        assert!(format!("{fp}0").parse::<Fingerprint>().is_err());
        assert!(format!("g{}", &fp[1..]).parse::<Fingerprint>().is_err());
        assert!(format!("é{}", &fp[2..]).parse::<Fingerprint>().is_err());
        assert!("".parse::<Fingerprint>().is_err());
    }

    #[test]
    fn as_bytes_matches_the_display_form() {
        let fp = Fingerprint::from_bytes(b"bytes");
        let hex: String = fp.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, fp.to_string());
    }

    #[test]
    fn round_trips_through_message_pack_as_16_bytes() -> Result<(), Box<dyn std::error::Error>> {
        let fp = Fingerprint::from(&42u64);
        let encoded = rmp_serde::to_vec(&fp)?;
        // bin8 marker, length 16, then the bytes.
        assert_eq!(encoded.len(), 2 + LEN);
        assert_eq!(&encoded[..2], &[0xc4, 16]);
        assert_eq!(&encoded[2..], fp.as_bytes());
        let decoded: Fingerprint = rmp_serde::from_slice(&encoded)?;
        assert_eq!(decoded, fp);
        Ok(())
    }

    #[test]
    fn round_trips_inside_a_tracking_record() -> Result<(), Box<dyn std::error::Error>> {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct Record {
            path: String,
            content: Fingerprint,
        }
        let record = Record {
            path: "a/b.txt".into(),
            content: Fingerprint::from_bytes(b"hello"),
        };
        let decoded: Record = rmp_serde::from_slice(&rmp_serde::to_vec(&record)?)?;
        assert_eq!(decoded, record);
        let named: Record = rmp_serde::from_slice(&rmp_serde::to_vec_named(&record)?)?;
        assert_eq!(named, record);
        Ok(())
    }

    #[test]
    fn decodes_from_a_sequence_of_16_integers() -> Result<(), Box<dyn std::error::Error>> {
        let fp = Fingerprint::from_bytes(b"seq");
        let as_array = rmp_serde::to_vec(fp.as_bytes())?;
        let decoded: Fingerprint = rmp_serde::from_slice(&as_array)?;
        assert_eq!(decoded, fp);
        let too_short = rmp_serde::to_vec(&[1u8; 15])?;
        assert!(rmp_serde::from_slice::<Fingerprint>(&too_short).is_err());
        let wrong_len = rmp_serde::to_vec(&serde_bytes_like(&[1u8; 17]))?;
        assert!(rmp_serde::from_slice::<Fingerprint>(&wrong_len).is_err());
        Ok(())
    }

    /// Serializes a slice as a MessagePack binary string.
    fn serde_bytes_like(bytes: &[u8]) -> impl Serialize + '_ {
        struct Bin<'a>(&'a [u8]);
        impl Serialize for Bin<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(self.0)
            }
        }
        Bin(bytes)
    }

    #[test]
    fn streamed_bytes_have_the_fingerprint_of_the_same_bytes_in_memory() -> std::io::Result<()> {
        // Sizes around the 64 KiB chunk of `update_reader`, and a reader
        // that hands out a few bytes at a time.
        struct Trickle<'a>(&'a [u8]);
        impl std::io::Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = buf.len().min(self.0.len()).min(7);
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        for len in [0, 1, 1023, 65_535, 65_536, 65_537, 200_000] {
            let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let expected = Fingerprint::from_bytes(&bytes);
            assert_eq!(Fingerprint::from_reader(&bytes[..])?, expected, "len {len}");
            assert_eq!(
                Fingerprint::from_reader(Trickle(&bytes))?,
                expected,
                "len {len}"
            );
        }
        assert_eq!(
            Fingerprint::from_reader(&b"weir"[..])?.to_string(),
            "1d9789aa1b49e869a38ed7142ba4013f"
        );
        Ok(())
    }

    #[test]
    fn ordering_and_equality_follow_the_bytes() {
        let a = Fingerprint([0u8; LEN]);
        let mut b_bytes = [0u8; LEN];
        b_bytes[LEN - 1] = 1;
        let b = Fingerprint(b_bytes);
        assert!(a < b);
        assert_eq!(a.cmp(&a), std::cmp::Ordering::Equal);
    }
}
