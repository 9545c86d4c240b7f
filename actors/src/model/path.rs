//! Component paths: where a component sits in the tree of components of an app.

use std::fmt;
use std::sync::Arc;

use super::key::StableKey;

/// The path of a component from the root component: `/` for the root,
/// `/a/b` for the child `b` of the child `a` of the root.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComponentPath {
    segments: Arc<[StableKey]>,
}

impl ComponentPath {
    /// The path of the root component.
    pub fn root() -> Self {
        Self::default()
    }

    /// The path of the child `key` of this component.
    pub fn child(&self, key: StableKey) -> Self {
        // Collected straight into one allocation: the iterator's length is
        // known.
        let segments: Arc<[StableKey]> = self
            .segments
            .iter()
            .cloned()
            .chain(std::iter::once(key))
            .collect();
        Self { segments }
    }

    /// The path of the keys `segments`, from the root.
    pub(crate) fn from_segments(segments: Vec<StableKey>) -> Self {
        Self {
            segments: segments.into(),
        }
    }

    /// The keys from the root to this component.
    pub fn segments(&self) -> &[StableKey] {
        &self.segments
    }

    /// The path of the parent component, or `None` for the root.
    pub fn parent(&self) -> Option<Self> {
        let (_, rest) = self.segments.split_last()?;
        Some(Self {
            segments: Arc::from(rest),
        })
    }

    /// Whether this is the root component.
    pub fn is_root(&self) -> bool {
        self.segments.is_empty()
    }
}

impl fmt::Display for ComponentPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.segments.is_empty() {
            return f.write_str("/");
        }
        for segment in self.segments.iter() {
            f.write_str("/")?;
            segment.fmt_segment(f)?;
        }
        Ok(())
    }
}

/// The symbol that starts the key of the component
/// [`mount_target`](crate::mount_target) mounts a container in
/// (`[@target, provider, key]`).
pub(crate) const TARGET_SYMBOL: &str = "target";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::key::IntoStableKey;

    #[test]
    fn paths_display_like_file_paths() {
        let root = ComponentPath::root();
        assert_eq!(root.to_string(), "/");
        let b = root
            .child("a".into_stable_key())
            .child(2i64.into_stable_key());
        assert_eq!(b.to_string(), "/a/2");
        assert_eq!(b.parent().map(|p| p.to_string()), Some("/a".to_string()));
        assert_eq!(root.parent(), None);
    }
}
