//! An order-preserving, prefix-free byte encoding of keys and paths.
//!
//! Ledger keys and shard routing are computed on these bytes. Every segment
//! is self-delimiting, so the encoding of a path is a byte prefix of the
//! encoding of every path below it. It is also a byte prefix of the
//! encoding of a path whose last text or bytes key extends its own with
//! zero bytes (`[1]` and `[1, 0]`: the terminating zero, then an escaped
//! one), so "below" is [`is_below`], never a bare prefix test.

use std::sync::Arc;

use super::key::StableKey;

pub(crate) const TAG_ARRAY_END: u8 = 0x02;
/// Separates a component path from what follows it in ledger keys.
pub(crate) const TAG_COMPONENT_END: u8 = 0x03;
pub(crate) const TAG_PROVIDER: u8 = 0x05;
pub(crate) const TAG_ATTACHMENT: u8 = 0x06;
const TAG_NULL: u8 = 0x10;
const TAG_FALSE: u8 = 0x11;
const TAG_TRUE: u8 = 0x12;
const TAG_INT: u8 = 0x20;
const TAG_STR: u8 = 0x30;
const TAG_SYMBOL: u8 = 0x31;
const TAG_BYTES: u8 = 0x40;
const TAG_UUID: u8 = 0x50;
const TAG_ARRAY: u8 = 0x60;

/// The byte after a zero that makes it an escaped zero byte of a text or
/// bytes key rather than the key's end (see `put_escaped`). No segment
/// starts with it.
const ESCAPED_ZERO: u8 = 0xff;

fn put_escaped(out: &mut Vec<u8>, bytes: &[u8]) {
    for &b in bytes {
        out.push(b);
        if b == 0 {
            out.push(ESCAPED_ZERO);
        }
    }
    out.push(0);
}

/// Appends the encoding of `key` to `out`.
pub(crate) fn put_key(out: &mut Vec<u8>, key: &StableKey) {
    match key {
        StableKey::Null => out.push(TAG_NULL),
        StableKey::Bool(false) => out.push(TAG_FALSE),
        StableKey::Bool(true) => out.push(TAG_TRUE),
        StableKey::Int(i) => {
            out.push(TAG_INT);
            out.extend_from_slice(&((*i as u64) ^ (1 << 63)).to_be_bytes());
        }
        StableKey::Str(s) => {
            out.push(TAG_STR);
            put_escaped(out, s.as_bytes());
        }
        StableKey::Symbol(s) => {
            out.push(TAG_SYMBOL);
            put_escaped(out, s.as_bytes());
        }
        StableKey::Bytes(b) => {
            out.push(TAG_BYTES);
            put_escaped(out, b);
        }
        StableKey::Uuid(u) => {
            out.push(TAG_UUID);
            out.extend_from_slice(u.as_bytes());
        }
        StableKey::Array(items) => {
            out.push(TAG_ARRAY);
            for item in items.iter() {
                put_key(out, item);
            }
            out.push(TAG_ARRAY_END);
        }
    }
}

/// Appends a named segment (a root provider name or an attachment type).
pub(crate) fn put_name(out: &mut Vec<u8>, tag: u8, name: &str) {
    out.push(tag);
    put_escaped(out, name.as_bytes());
}

/// Encodes a component path; the result ends with [`TAG_COMPONENT_END`].
pub(crate) fn component_key(segments: &[StableKey]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 * segments.len() + 1);
    put_component_key(&mut out, segments);
    out
}

/// [`component_key`], in shared bytes, encoded in the thread's kept
/// buffer: one allocation, for the shared bytes.
pub(crate) fn component_key_shared(segments: &[StableKey]) -> Arc<[u8]> {
    super::encode::with_buffer(|out| {
        put_component_key(out, segments);
        Arc::from(out.as_slice())
    })
}

/// Writes a component path's key into `out`.
fn put_component_key(out: &mut Vec<u8>, segments: &[StableKey]) {
    for s in segments {
        put_key(out, s);
    }
    out.push(TAG_COMPONENT_END);
}

/// One decoded segment of a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Segment {
    Provider(Arc<str>),
    Attachment(Arc<str>),
    Key(StableKey),
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    fn escaped(&mut self) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            let b = self.byte()?;
            if b == 0 {
                if self.bytes.get(self.pos) == Some(&ESCAPED_ZERO) {
                    self.pos += 1;
                    out.push(0);
                } else {
                    return Some(out);
                }
            } else {
                out.push(b);
            }
        }
    }

    fn string(&mut self) -> Option<Arc<str>> {
        let bytes = self.escaped()?;
        String::from_utf8(bytes).ok().map(Arc::from)
    }

    fn key_with_tag(&mut self, tag: u8) -> Option<StableKey> {
        Some(match tag {
            TAG_NULL => StableKey::Null,
            TAG_FALSE => StableKey::Bool(false),
            TAG_TRUE => StableKey::Bool(true),
            TAG_INT => {
                let end = self.pos.checked_add(8)?;
                let raw: [u8; 8] = self.bytes.get(self.pos..end)?.try_into().ok()?;
                self.pos = end;
                StableKey::Int((u64::from_be_bytes(raw) ^ (1 << 63)) as i64)
            }
            TAG_STR => StableKey::Str(self.string()?),
            TAG_SYMBOL => StableKey::Symbol(self.string()?),
            TAG_BYTES => StableKey::Bytes(Arc::from(self.escaped()?)),
            TAG_UUID => {
                let end = self.pos.checked_add(16)?;
                let raw: [u8; 16] = self.bytes.get(self.pos..end)?.try_into().ok()?;
                self.pos = end;
                StableKey::Uuid(uuid::Uuid::from_bytes(raw))
            }
            TAG_ARRAY => {
                let mut items = Vec::new();
                loop {
                    let t = self.byte()?;
                    if t == TAG_ARRAY_END {
                        break;
                    }
                    items.push(self.key_with_tag(t)?);
                }
                StableKey::Array(Arc::from(items))
            }
            _ => return None,
        })
    }
}

/// Decodes a path made of provider, attachment and key segments.
/// Returns `None` when the bytes are not a valid encoding.
pub(crate) fn decode_segments(bytes: &[u8]) -> Option<Vec<Segment>> {
    let mut reader = Reader { bytes, pos: 0 };
    let mut out = Vec::new();
    while let Some(tag) = reader.byte() {
        out.push(match tag {
            TAG_PROVIDER => Segment::Provider(reader.string()?),
            TAG_ATTACHMENT => Segment::Attachment(reader.string()?),
            TAG_COMPONENT_END => return None,
            t => Segment::Key(reader.key_with_tag(t)?),
        });
    }
    Some(out)
}

/// The name of the root provider a state or provider path starts with,
/// and the bytes after it; `None` when it does not start with one.
pub(crate) fn split_root_provider(path: &[u8]) -> Option<(Arc<str>, &[u8])> {
    let mut reader = Reader {
        bytes: path,
        pos: 0,
    };
    if reader.byte()? != TAG_PROVIDER {
        return None;
    }
    let name = reader.string()?;
    Some((name, path.get(reader.pos..)?))
}

/// Splits an encoded state path into its provider path and its key.
pub(crate) fn split_state_path(bytes: &[u8]) -> Option<(&[u8], StableKey)> {
    let mut reader = Reader { bytes, pos: 0 };
    let mut last: Option<(usize, StableKey)> = None;
    while let Some(tag) = reader.byte() {
        let start = reader.pos - 1;
        match tag {
            TAG_PROVIDER | TAG_ATTACHMENT => {
                reader.escaped()?;
                last = None;
            }
            TAG_COMPONENT_END => return None,
            t => last = Some((start, reader.key_with_tag(t)?)),
        }
    }
    let (start, key) = last?;
    Some((bytes.get(..start)?, key))
}

/// The container a state is below, if any: the state path of the
/// container whose child provider declared it, that is, the part of the
/// state's provider path up to its last key (an attachment of a child
/// provider is below the same container). `None` for a state of a root
/// provider, or bytes that are not a state path.
pub(crate) fn container_of_state(path: &[u8]) -> Option<&[u8]> {
    let (provider, _) = split_state_path(path)?;
    let mut reader = Reader {
        bytes: provider,
        pos: 0,
    };
    let mut end = None;
    while let Some(tag) = reader.byte() {
        match tag {
            TAG_PROVIDER | TAG_ATTACHMENT => {
                reader.escaped()?;
            }
            TAG_COMPONENT_END => return None,
            t => {
                reader.key_with_tag(t)?;
                end = Some(reader.pos);
            }
        }
    }
    provider.get(..end?)
}

/// The key of a state path made of `provider` (a provider path given by
/// [`split_state_path`]) and one key, if that is what `bytes` is: what
/// `split_state_path` finds then, without decoding the provider path.
pub(crate) fn key_below(bytes: &[u8], provider: &[u8]) -> Option<StableKey> {
    let rest = bytes.strip_prefix(provider)?;
    let mut reader = Reader {
        bytes: rest,
        pos: 0,
    };
    let key = match reader.byte()? {
        TAG_PROVIDER | TAG_ATTACHMENT | TAG_COMPONENT_END => return None,
        t => reader.key_with_tag(t)?,
    };
    (reader.pos == rest.len()).then_some(key)
}

/// Decodes the encoding of a component path made by [`component_key`].
pub(crate) fn decode_component(bytes: &[u8]) -> Option<Vec<StableKey>> {
    let (last, body) = bytes.split_last()?;
    if *last != TAG_COMPONENT_END {
        return None;
    }
    decode_segments(body)?
        .into_iter()
        .map(|s| match s {
            Segment::Key(k) => Some(k),
            _ => None,
        })
        .collect()
}

/// The component path a key made by [`component_key`] encodes.
pub(crate) fn decode_component_path(bytes: &[u8]) -> Option<super::ComponentPath> {
    decode_component(bytes).map(super::ComponentPath::from_segments)
}

/// Whether `path` lies below `ancestor` (a state or provider path): it
/// continues it with more segments (a child's key, an attachment). Being
/// a byte prefix is not enough: a text or bytes key ends with a zero,
/// which is also how an escaped zero byte starts, so `[1]` encodes to a
/// prefix of `[1, 0]`; what follows the prefix tells them apart.
pub(crate) fn is_below(path: &[u8], ancestor: &[u8]) -> bool {
    path.strip_prefix(ancestor)
        .and_then(|rest| rest.first())
        .is_some_and(|&next| next != ESCAPED_ZERO)
}

/// A stable 64-bit hash of encoded bytes (FNV-1a), used to pick shards.
pub(crate) fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // Finalize (splitmix) so that short keys spread over all shards.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::key::IntoStableKey;

    fn enc(key: &StableKey) -> Vec<u8> {
        let mut out = Vec::new();
        put_key(&mut out, key);
        out
    }

    #[test]
    fn encoding_preserves_order_of_ints_and_strings() {
        assert!(enc(&(-5i64).into_stable_key()) < enc(&3i64.into_stable_key()));
        assert!(enc(&"ab".into_stable_key()) < enc(&"abc".into_stable_key()));
        assert!(enc(&"a\0".into_stable_key()) > enc(&"a".into_stable_key()));
    }

    #[test]
    fn a_shared_component_key_is_the_component_key_whatever_the_thread_encoded_before() {
        let long = "x"
            .repeat(2 * crate::model::encode::MAX_KEPT_BUFFER)
            .into_stable_key();
        let paths = [
            vec!["a".into_stable_key(), 1i64.into_stable_key()],
            vec![long],
            vec![],
            vec!["b".into_stable_key()],
        ];
        for segments in &paths {
            assert_eq!(
                &*component_key_shared(segments),
                component_key(segments).as_slice()
            );
        }
    }

    #[test]
    fn a_key_is_never_a_prefix_of_a_different_key() {
        let a = enc(&"ab".into_stable_key());
        let b = enc(&"abc".into_stable_key());
        assert!(!b.starts_with(&a));
    }

    #[test]
    fn paths_round_trip() {
        let mut out = Vec::new();
        put_name(&mut out, TAG_PROVIDER, "t/x");
        put_key(
            &mut out,
            &("a\0b", 7i64, uuid::Uuid::nil()).into_stable_key(),
        );
        put_name(&mut out, TAG_ATTACHMENT, "idx");
        put_key(&mut out, &StableKey::Bytes(Arc::from(&[0u8, 1, 0][..])));
        let segs = decode_segments(&out).unwrap_or_default();
        assert_eq!(segs.len(), 4);
        assert_eq!(segs[0], Segment::Provider(Arc::from("t/x")));
        assert_eq!(segs[2], Segment::Attachment(Arc::from("idx")));
        let comp = component_key(&["a".into_stable_key(), 1i64.into_stable_key()]);
        assert_eq!(
            decode_component(&comp),
            Some(vec!["a".into_stable_key(), 1i64.into_stable_key()])
        );
    }

    #[test]
    fn a_key_below_a_provider_path_is_the_one_a_full_split_finds() {
        let keys: Vec<StableKey> = vec![
            7i64.into_stable_key(),
            (-3i64).into_stable_key(),
            "a\0b".into_stable_key(),
            ("x", 2i64).into_stable_key(),
            StableKey::Bytes(Arc::from(&[0u8, 1][..])),
        ];
        // Provider paths: a root, one below a container's key, one ending
        // in a key (a state path whose last segment is split off).
        let mut providers: Vec<Vec<u8>> = Vec::new();
        let mut root = Vec::new();
        put_name(&mut root, TAG_PROVIDER, "tables");
        providers.push(root.clone());
        put_key(&mut root, &"docs".into_stable_key());
        put_name(&mut root, TAG_PROVIDER, "rows");
        providers.push(root.clone());
        put_key(&mut root, &1i64.into_stable_key());
        providers.push(root);
        for provider in &providers {
            for key in &keys {
                let mut path = provider.clone();
                put_key(&mut path, key);
                let split = split_state_path(&path);
                assert_eq!(split, Some((provider.as_slice(), key.clone())));
                assert_eq!(key_below(&path, provider), Some(key.clone()));
                // Not below another provider path, nor below its own when
                // more follows the key.
                for other in providers.iter().filter(|o| *o != provider) {
                    if let Some(found) = key_below(&path, other) {
                        assert_eq!(split_state_path(&path), Some((other.as_slice(), found)));
                    }
                }
                let mut longer = path.clone();
                put_name(&mut longer, TAG_ATTACHMENT, "idx");
                assert_eq!(key_below(&longer, provider), None);
                put_key(&mut longer, key);
                assert_eq!(key_below(&longer, provider), None);
            }
        }
    }

    #[test]
    fn a_key_extended_with_zero_bytes_is_not_below_the_shorter_one() {
        let mut provider = Vec::new();
        put_name(&mut provider, TAG_PROVIDER, "rows");
        for (short, long) in [
            (&[1u8][..], &[1u8, 0][..]),
            (&[][..], &[0u8, 0][..]),
            (&[][..], &[0u8][..]),
        ] {
            let mut a = provider.clone();
            put_key(&mut a, &StableKey::Bytes(Arc::from(short)));
            let mut b = provider.clone();
            put_key(&mut b, &StableKey::Bytes(Arc::from(long)));
            assert!(b.starts_with(&a), "the case this guards against");
            assert!(!is_below(&b, &a), "{short:?} / {long:?}");
            // A child's path is its container's path and its own key.
            for key in [StableKey::Int(1), StableKey::Bytes(Arc::from(&[0u8][..]))] {
                let mut child = a.clone();
                put_key(&mut child, &key);
                assert!(is_below(&child, &a), "{key:?} below {short:?}");
            }
            let mut attached = a.clone();
            put_name(&mut attached, TAG_ATTACHMENT, "idx");
            assert!(is_below(&attached, &a));
            assert!(!is_below(&a, &a));
        }
        let text = enc(&"a".into_stable_key());
        let longer = enc(&"a\0".into_stable_key());
        assert!(!is_below(&longer, &text));
    }

    #[test]
    fn component_keys_do_not_prefix_their_children_keys() {
        let parent = component_key(&["a".into_stable_key()]);
        let child = component_key(&["a".into_stable_key(), "b".into_stable_key()]);
        assert!(!child.starts_with(&parent));
    }
}
