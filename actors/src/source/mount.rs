//! [`Ctx::mount_source`]: one component per item of a batch.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use crate::actors::component::{self, Memo, MemoFn};
use crate::ctx::Ctx;
use crate::error::{Error, Result};
use crate::model::{Fingerprint, StableKey};
use crate::sync::lock;

use super::{ChangeOp, Listed, Listing, SourceItem};

/// A batch ready to mount with [`Ctx::mount_source`]: a [`Listing`]
/// (convert it with `into()`), or the changes
/// [`App::consume`](crate::App::consume) hands to its function.
pub struct SourceBatch<P> {
    kind: Kind<P>,
    salt: String,
    /// Shared with `App::consume`, which reads it once the run has ended.
    seen: Option<Arc<Mutex<Mounted>>>,
}

enum Kind<P> {
    Listing(Listing<P>),
    Changes(Vec<Prepared<P>>),
}

/// A change whose acknowledgement `App::consume` keeps.
pub(super) struct Prepared<P> {
    pub key: StableKey,
    pub ordinal: u64,
    pub op: ChangeOp<P>,
}

/// What `mount_source` did with a batch of changes.
#[derive(Default)]
pub(super) struct Mounted {
    /// Whether the batch was mounted at all.
    pub mounted: bool,
    /// Keys outside the run's scope (partitions this member does not hold).
    pub not_held: Vec<StableKey>,
}

impl<P> SourceBatch<P> {
    pub(super) fn changes(changes: Vec<Prepared<P>>, seen: Arc<Mutex<Mounted>>) -> Self {
        Self {
            kind: Kind::Changes(changes),
            salt: String::new(),
            seen: Some(seen),
        }
    }

    /// Mixes `salt` into every item's memo key: the version of the code
    /// that reads the items, and the
    /// [`memo_key`](crate::TargetStateProvider::memo_key) of the providers
    /// it declares into. A change applied under another salt is applied
    /// again, whatever its ordinal (a table created again gets its rows
    /// back from a replay).
    #[must_use]
    pub fn salt(mut self, salt: impl AsRef<str>) -> Self {
        self.salt.push_str(salt.as_ref());
        self
    }

    /// How many items the batch holds.
    pub fn len(&self) -> usize {
        match &self.kind {
            Kind::Listing(l) => l.items.len(),
            Kind::Changes(c) => c.len(),
        }
    }

    /// Whether the batch holds no item.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<P> From<Listing<P>> for SourceBatch<P> {
    fn from(listing: Listing<P>) -> Self {
        let salt = listing.salt.clone();
        Self {
            kind: Kind::Listing(listing),
            salt,
            seen: None,
        }
    }
}

impl<P> std::fmt::Debug for SourceBatch<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Listing(_) => "listing",
            Kind::Changes(_) => "changes",
        };
        f.debug_struct("SourceBatch")
            .field("kind", &kind)
            .field("items", &self.len())
            .finish()
    }
}

/// What a component mounted for an item does.
enum Slot<P> {
    /// Runs the user's function on the item.
    Run(SourceItem<P>),
    /// Kept as it is: a lazily listed item whose version is unchanged
    /// (skipped by its memo key).
    Kept(StableKey),
    /// Declares nothing: its states are deleted.
    Tombstone,
}

/// An item to mount, with its memo key.
struct Mountable<P> {
    key: StableKey,
    /// `None`: it always runs.
    memo: Option<Vec<u8>>,
    slot: Slot<P>,
}

impl Ctx {
    /// Mounts one child component per item of `batch`, as
    /// [`Ctx::mount_each`] does, calling `f` with each item.
    ///
    /// - A [`Listing`]: an item whose version (with the batch's salt) is
    ///   that of its last successful run is skipped; payloads left out are
    ///   loaded in bulk for the items that must run; a key not listed is not
    ///   mounted, so its states are deleted.
    /// - Changes (from [`App::consume`](crate::App::consume), at the root
    ///   of its run): an upsert runs `f` unless its key's last applied
    ///   ordinal is as recent; a tombstone's component declares nothing, so
    ///   its states are deleted, and keeps the tombstone's ordinal.
    ///
    /// See the [`source`](crate::source) module for the guarantees.
    ///
    /// # Errors
    /// As [`Ctx::mount_each`]; also when a listing leaves payloads out
    /// without a loader, when its loader fails, and when changes are
    /// mounted below the root or twice.
    pub async fn mount_source<P, B, F, Fut>(&self, batch: B, f: F) -> Result<()>
    where
        P: Send + 'static,
        B: Into<SourceBatch<P>>,
        F: Fn(Ctx, SourceItem<P>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        let batch = batch.into();
        let salt = Fingerprint::from(&batch.salt);
        let key_of: MemoFn<Mountable<P>> = Arc::new(|m: &Mountable<P>| m.memo.clone());
        let (items, memo) = match batch.kind {
            Kind::Listing(listing) => (self.listed(listing, &salt).await?, Memo::equal(key_of)),
            Kind::Changes(changes) => {
                let seen = batch.seen.as_ref();
                let memo = Memo {
                    key: key_of,
                    covers: ordinal_covers,
                };
                (self.changed(changes, &salt, seen)?, memo)
            }
        };
        let f = Arc::new(f);
        component::mount_each(
            &self.state,
            items,
            |m| m.key.clone(),
            Some(memo),
            move |ctx, m: Mountable<P>| {
                let f = Arc::clone(&f);
                async move {
                    match m.slot {
                        Slot::Run(item) => f(ctx, item).await,
                        Slot::Tombstone => Ok(()),
                        Slot::Kept(key) => Err(Error::msg(format!(
                            "the payload of item {key} was not loaded: its last run's memo key changed while the listing was mounted; the next run loads it"
                        ))),
                    }
                }
            },
        )
        .await
    }

    /// A listing's items with their memo keys, payloads loaded for those
    /// that must run.
    async fn listed<P>(
        &self,
        listing: Listing<P>,
        salt: &Fingerprint,
    ) -> Result<Vec<Mountable<P>>> {
        let Listing { items, loader, .. } = listing;
        let mut lazy = Vec::new();
        let mut out = Vec::with_capacity(items.len());
        for Listed {
            key,
            version,
            payload,
        } in items
        {
            let memo = version.map(|v| listing_memo(&v, salt));
            match payload {
                Some(payload) => out.push(Mountable {
                    slot: Slot::Run(SourceItem {
                        key: key.clone(),
                        ordinal: None,
                        payload,
                    }),
                    key,
                    memo,
                }),
                // A lazy item has a version (`Listed::lazy`); one built
                // by hand without runs and is loaded every time.
                None => lazy.push((key, memo)),
            }
        }
        if lazy.is_empty() {
            return Ok(out);
        }
        let Some(loader) = loader else {
            return Err(Error::Usage(format!(
                "component {}: a listing leaves the payload of {} out but has no loader",
                self.path(),
                lazy.first().map(|(k, _)| k.to_string()).unwrap_or_default()
            )));
        };
        let (kept, to_load): (Vec<_>, Vec<_>) = lazy
            .into_iter()
            .filter(|(key, _)| self.state.child_in_scope(key))
            .partition(|(key, memo)| {
                memo.as_ref()
                    .is_some_and(|memo| self.state.stored_memo_is(key, memo))
            });
        out.extend(kept.into_iter().map(|(key, memo)| Mountable {
            slot: Slot::Kept(key.clone()),
            key,
            memo,
        }));
        let mut memos: HashMap<StableKey, Option<Vec<u8>>> = to_load.into_iter().collect();
        let loaded = loader.load(memos.keys().cloned().collect()).await?;
        for (key, payload) in loaded {
            // Keys left out are gone: not mounted, their states are deleted.
            let Some(memo) = memos.remove(&key) else {
                continue;
            };
            out.push(Mountable {
                slot: Slot::Run(SourceItem {
                    key: key.clone(),
                    ordinal: None,
                    payload,
                }),
                key,
                memo,
            });
        }
        Ok(out)
    }

    /// A batch of changes' items with their ordinal memo keys. Notes the
    /// keys outside the run's scope.
    fn changed<P>(
        &self,
        changes: Vec<Prepared<P>>,
        salt: &Fingerprint,
        seen: Option<&Arc<Mutex<Mounted>>>,
    ) -> Result<Vec<Mountable<P>>> {
        let Some(seen) = seen.filter(|_| self.path().segments().is_empty()) else {
            return Err(Error::Usage(format!(
                "component {}: changes are mounted at the root of the run App::consume drives",
                self.path()
            )));
        };
        let mut seen = lock(seen);
        if std::mem::replace(&mut seen.mounted, true) {
            return Err(Error::Usage(
                "a batch of changes is mounted twice in one run".to_string(),
            ));
        }
        let mut out = Vec::with_capacity(changes.len());
        for Prepared { key, ordinal, op } in changes {
            if !self.state.child_in_scope(&key) {
                seen.not_held.push(key);
                continue;
            }
            let slot = match op {
                ChangeOp::Upsert(payload) => Slot::Run(SourceItem {
                    key: key.clone(),
                    ordinal: Some(ordinal),
                    payload,
                }),
                ChangeOp::Delete => Slot::Tombstone,
            };
            out.push(Mountable {
                memo: Some(ordinal_memo(ordinal, salt)),
                key,
                slot,
            });
        }
        Ok(out)
    }
}

/// A listed item's memo key: the fingerprint of the salt's fingerprint
/// (fixed-length) followed by the version.
fn listing_memo(version: &[u8], salt: &Fingerprint) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(salt.as_bytes().len() + version.len());
    bytes.extend_from_slice(salt.as_bytes());
    bytes.extend_from_slice(version);
    Fingerprint::from_bytes(&bytes).as_bytes().to_vec()
}

/// The first byte of an ordinal memo key.
const ORDINAL_TAG: u8 = b'o';

/// A change's memo key: its ordinal, then the salt's fingerprint.
fn ordinal_memo(ordinal: u64, salt: &Fingerprint) -> Vec<u8> {
    let mut memo = Vec::with_capacity(9 + salt.as_bytes().len());
    memo.push(ORDINAL_TAG);
    memo.extend_from_slice(&ordinal.to_be_bytes());
    memo.extend_from_slice(salt.as_bytes());
    memo
}

/// Whether the ordinal recorded for a key covers a change's: the same salt,
/// and an ordinal at least as recent.
fn ordinal_covers(stored: &[u8], new: &[u8]) -> bool {
    let split = |m: &[u8]| -> Option<(u64, Vec<u8>)> {
        let (tag, rest) = m.split_first()?;
        let (ordinal, salt) = rest.split_at_checked(8)?;
        let ordinal = u64::from_be_bytes(ordinal.try_into().ok()?);
        (*tag == ORDINAL_TAG).then(|| (ordinal, salt.to_vec()))
    };
    match (split(stored), split(new)) {
        (Some((old, old_salt)), Some((new, new_salt))) => old_salt == new_salt && old >= new,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ordinal_is_covered_by_an_equal_or_later_one_under_the_same_salt_only() {
        let salt = Fingerprint::from(&"t1");
        let other = Fingerprint::from(&"t2");
        assert!(ordinal_covers(
            &ordinal_memo(5, &salt),
            &ordinal_memo(5, &salt)
        ));
        assert!(ordinal_covers(
            &ordinal_memo(6, &salt),
            &ordinal_memo(5, &salt)
        ));
        assert!(!ordinal_covers(
            &ordinal_memo(4, &salt),
            &ordinal_memo(5, &salt)
        ));
        assert!(!ordinal_covers(
            &ordinal_memo(9, &other),
            &ordinal_memo(5, &salt)
        ));
        assert!(!ordinal_covers(b"not an ordinal", &ordinal_memo(5, &salt)));
    }
}
