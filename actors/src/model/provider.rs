//! Target-state providers and target states.

use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::erased::ErasedHandler;
use super::key::{IntoStableKey, StableKey};
use super::keycode;

/// The encoded path of a provider, with a readable name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ProviderPath {
    pub enc: Arc<[u8]>,
    pub name: Arc<str>,
    /// The path of the container state this provider's states are below.
    pub container: Option<Arc<[u8]>>,
    /// The root provider's name: a bounded label for metrics.
    pub root: Arc<str>,
}

impl ProviderPath {
    pub(crate) fn root(name: &str) -> Self {
        let mut enc = Vec::with_capacity(name.len() + 2);
        keycode::put_name(&mut enc, keycode::TAG_PROVIDER, name);
        Self {
            enc: Arc::from(enc),
            name: Arc::from(name),
            container: None,
            root: Arc::from(name),
        }
    }

    /// The provider of the children of the state `key` of this provider.
    pub(crate) fn child(&self, key: &StableKey) -> Self {
        let mut enc = self.enc.to_vec();
        keycode::put_key(&mut enc, key);
        let mut name = String::with_capacity(self.name.len() + 8);
        name.push_str(&self.name);
        name.push('/');
        name.push_str(&segment_text(key));
        let enc: Arc<[u8]> = Arc::from(enc);
        Self {
            container: Some(Arc::clone(&enc)),
            enc,
            name: Arc::from(name),
            root: Arc::clone(&self.root),
        }
    }

    /// The provider of the attachment type `att` of this provider.
    pub(crate) fn attachment(&self, att: &str) -> Self {
        let mut enc = self.enc.to_vec();
        keycode::put_name(&mut enc, keycode::TAG_ATTACHMENT, att);
        Self {
            enc: Arc::from(enc),
            name: Arc::from(format!("{}@{}", self.name, att)),
            container: self.container.clone(),
            root: Arc::clone(&self.root),
        }
    }

    /// The readable name of an encoded provider path, spelled as
    /// [`ProviderPath::child`] and [`ProviderPath::attachment`] spell it:
    /// `table`, `table/child-key`, `table@attachment`. `None` when the
    /// bytes are not a provider path.
    pub(crate) fn name_of(enc: &[u8]) -> Option<String> {
        let mut name = String::new();
        for segment in keycode::decode_segments(enc)? {
            match segment {
                keycode::Segment::Provider(p) => name.push_str(&p),
                keycode::Segment::Attachment(a) => {
                    name.push('@');
                    name.push_str(&a);
                }
                keycode::Segment::Key(k) => {
                    name.push('/');
                    name.push_str(&segment_text(&k));
                }
            }
        }
        Some(name)
    }

    /// The encoded path of the state `key` of this provider.
    pub(crate) fn state_path(&self, key: &StableKey) -> Vec<u8> {
        let mut enc = Vec::with_capacity(self.enc.len() + 16);
        enc.extend_from_slice(&self.enc);
        keycode::put_key(&mut enc, key);
        enc
    }
}

fn segment_text(key: &StableKey) -> String {
    match key {
        StableKey::Str(s) => s.to_string(),
        other => other.to_string(),
    }
}

/// How a container's children are judged against their records: a record
/// written under a generation below `destructive_floor` is dropped, one below
/// `current` is possibly missing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct ChildGeneration {
    pub current: u64,
    pub destructive_floor: u64,
}

/// A resolved provider: its handler and eagerly registered attachments.
pub(crate) struct Resolved {
    pub handler: Arc<dyn ErasedHandler>,
    pub attachments: HashMap<String, Arc<ProviderCore>>,
    pub generation: ChildGeneration,
}

/// The shared state behind a [`TargetStateProvider`].
pub(crate) struct ProviderCore {
    pub path: ProviderPath,
    /// The run this provider belongs to.
    pub run_id: u64,
    pub resolved: OnceLock<Resolved>,
}

impl ProviderCore {
    pub(crate) fn new(path: ProviderPath, run_id: u64) -> Self {
        Self {
            path,
            run_id,
            resolved: OnceLock::new(),
        }
    }
}

/// A factory of [`TargetState`]s for one handler (a root provider, the
/// children of a container, or an attachment type).
pub struct TargetStateProvider<V> {
    pub(crate) core: Arc<ProviderCore>,
    _value: PhantomData<fn() -> V>,
}

impl<V> Clone for TargetStateProvider<V> {
    fn clone(&self) -> Self {
        Self {
            core: Arc::clone(&self.core),
            _value: PhantomData,
        }
    }
}

impl<V> fmt::Debug for TargetStateProvider<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TargetStateProvider")
            .field("path", &self.core.path.name)
            .field("resolved", &self.core.resolved.get().is_some())
            .finish()
    }
}

impl<V> TargetStateProvider<V> {
    pub(crate) fn from_core(core: Arc<ProviderCore>) -> Self {
        Self {
            core,
            _value: PhantomData,
        }
    }

    /// The provider's path, for people: the root provider's name, then
    /// `/key` per container level and `@type` per attachment.
    pub fn name(&self) -> &str {
        &self.core.path.name
    }

    /// Whether the provider's handler is known yet. A provider returned by
    /// `declare_target_state_with_child` resolves when its component commits.
    pub fn is_resolved(&self) -> bool {
        self.core.resolved.get().is_some()
    }

    /// A key for memoizing work that depends on this provider: it changes
    /// when a `Destructive` or `Lossy` invalidation of the container bumps the
    /// provider's generation.
    pub fn memo_key(&self) -> String {
        match self.core.resolved.get() {
            Some(r) => format!("{}#{}", self.core.path.name, r.generation.current),
            None => format!("{}#unresolved", self.core.path.name),
        }
    }
}

impl<V> TargetStateProvider<V>
where
    V: Serialize,
{
    /// A target state of this provider: `value` declared under `key`. The
    /// value is serialized now; later changes to it are not seen.
    pub fn target_state(&self, key: impl IntoStableKey, value: V) -> TargetState<V> {
        let key = key.into_stable_key();
        let value = super::encode::to_arc(&value)
            .map(DeclaredValue::Encoded)
            .map_err(|e| e.to_string());
        TargetState {
            provider: Arc::clone(&self.core),
            key,
            value,
            _value: PhantomData,
        }
    }
}

impl<V> TargetStateProvider<V>
where
    V: Serialize + Send + Sync + 'static,
{
    /// Like [`target_state`](Self::target_state), but the value is not
    /// serialized: the handler's `reconcile` is given `value` itself,
    /// rather than a copy decoded from its serialized form. That saves
    /// encoding and decoding each value (each declaration is reconciled
    /// once).
    ///
    /// Use it only for a value type whose serialization cannot fail and
    /// decodes back to an equal value (no skipped fields, no custom encoding
    /// that drops data), and that shares no state a later change could
    /// reach (no `Arc<Mutex<_>>` inside): for such a type the handler cannot
    /// tell the difference. The connectors' own row and file values are such
    /// types (they are checked when declared).
    pub fn target_state_exact(&self, key: impl IntoStableKey, value: V) -> TargetState<V> {
        TargetState {
            provider: Arc::clone(&self.core),
            key: key.into_stable_key(),
            value: Ok(DeclaredValue::Exact(Some(Box::new(value)))),
            _value: PhantomData,
        }
    }
}

impl<V> TargetStateProvider<V>
where
    V: DeserializeOwned,
{
    pub(crate) fn check_value_type(core: &ProviderCore) -> crate::Result<()> {
        if let Some(r) = core.resolved.get() {
            let expected = r.handler.value_type();
            let asked = std::any::type_name::<V>();
            if expected != asked {
                return Err(crate::Error::Usage(format!(
                    "provider {} holds values of type {expected}, not {asked}",
                    core.path.name
                )));
            }
        }
        Ok(())
    }
}

/// A key and a value declared through a provider.
pub struct TargetState<V> {
    pub(crate) provider: Arc<ProviderCore>,
    pub(crate) key: StableKey,
    /// The value, or why it could not be serialized.
    pub(crate) value: Result<DeclaredValue, String>,
    _value: PhantomData<fn() -> V>,
}

pub(crate) use super::erased::DeclaredValue;

impl<V> TargetState<V> {
    /// The key of the state.
    pub fn key(&self) -> &StableKey {
        &self.key
    }

    /// The name of the provider the state belongs to.
    pub fn provider_name(&self) -> &str {
        &self.provider.path.name
    }
}

impl<V> fmt::Debug for TargetState<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TargetState")
            .field("provider", &self.provider.path.name)
            .field("key", &self.key)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_states_container_is_the_container_whose_child_provider_declared_it() {
        use crate::model::keycode::{container_of_state, put_key};
        let key = |s: &str| StableKey::Str(s.into());
        let state = |provider: &ProviderPath, k: &str| {
            let mut p = provider.enc.to_vec();
            put_key(&mut p, &key(k));
            p
        };
        let tables = ProviderPath::root("tables");
        let table = state(&tables, "docs");
        let rows = tables.child(&key("docs"));
        assert_eq!(container_of_state(&table), None);
        assert_eq!(container_of_state(&state(&rows, "r1")), Some(&table[..]));
        let att = rows.attachment("index");
        assert_eq!(container_of_state(&state(&att, "i1")), Some(&table[..]));
        let nested = rows.child(&key("r1"));
        let r1 = state(&rows, "r1");
        assert_eq!(container_of_state(&state(&nested, "x")), Some(&r1[..]));
    }

    use super::*;

    #[test]
    fn a_provider_name_decoded_from_its_path_is_the_name_it_was_built_with() {
        let table = StableKey::Array(Arc::from([
            StableKey::Str(Arc::from("db")),
            StableKey::Str(Arc::from("docs")),
        ]));
        for path in [
            ProviderPath::root("tables"),
            ProviderPath::root("tables").child(&StableKey::Str(Arc::from("docs"))),
            ProviderPath::root("tables").child(&table),
            ProviderPath::root("tables").attachment("index"),
        ] {
            assert_eq!(
                ProviderPath::name_of(&path.enc).as_deref(),
                Some(&*path.name)
            );
        }
    }
}
