//! The ledger: what weir created in earlier runs, stored in sled.
//!
//! # Layout
//!
//! One sled tree, and a second one for large values; every commit is one
//! atomic sled batch, or one sled transaction when it writes both trees.
//! Keys start with a byte naming their table:
//!
//! | prefix | key after the prefix            | value                          |
//! |--------|---------------------------------|--------------------------------|
//! | `m`    | `format`                        | the format version, u32 BE     |
//! | `m`    | `seq`                           | the number of commits, u64 BE  |
//! | `m`    | `id`                            | the ledger's identity, a UUID  |
//! | `m`    | `upgrade`                       | while an upgrade is under way, the format it started from, u32 BE (see [`upgrade`]) |
//! | `c`    | encoded component path          | [`ComponentEntry`]: its states |
//! | `e`    | encoded component path          | changes to its `c` value (see [`delta`]) |
//! | `h`    | encoded component path          | its child component keys       |
//! | `d`    | container path, component path, u32 BE length of the component path | empty |
//! | `i`    | intent batch id, u64 BE         | `Vec<Intent>` (earlier builds; recovered and deleted on open) |
//! | `k`    | pack id, u64 BE                 | small component entries written together, packed (see [`pack`]) |
//! | `q`    | pack id, u64 BE                 | the memo keys of the last successful runs of components, packed (see [`memo`]) |
//! | `n`    | encoded component path          | a memo key forgotten: the first `q` pack id that may hold it again, u64 BE |
//! | `o`    | encoded component path          | its memo key (formats 1 to 3; moved into `q` packs on open) |
//! | `f`    | encoded component path          | how many runs in a row it failed, u32 BE (none after a success) |
//!
//! A `c` value of [`delta::MIN_OWN`] bytes or more is written to the
//! second tree, `entries`, under the same key, and its key in the first
//! tree deleted (a ledger of format 1 may still hold one in the first tree
//! until it is next written whole): sled keeps a node's changes as
//! fragments and writes the whole node again at every tenth, so a large
//! value sharing a node with keys that every commit writes was written
//! again every few commits.
//!
//! A component's states live in one value, read and written in one go
//! (with, for a large one, the changes since that value was written beside
//! it: see [`delta`]).
//! Nothing is written per state besides that value: the owner index (which
//! component holds a state, for ownership transfer) lives in memory
//! ([`index::OwnerIndex`]), rebuilt from the entries when the ledger opens,
//! and `d` records which components hold states below each container, so
//! that deleting a container drops everything below it. What each
//! component declared at its last clean commit is kept in memory too, as a
//! digest, never stored ([`digest`]).
//! Intents are the records of actions about to be applied; commit collapses
//! them, and opening a ledger folds leftovers from a crash into the entries
//! as possible records. They are kept out of sled, in the append-only
//! [`journal`] beside the store, which a run empties when it ends.
//!
//! # Damage
//!
//! sled opens some damaged stores without an error: a truncated or
//! overwritten log reads as empty, or as an earlier state. Either would make
//! weir forget what it created. So every commit counts itself in the store
//! (`mseq`), and after each flush the count is also written to `weir.seq`
//! beside the store (atomically, by rename; it may lag, never lead). A
//! ledger whose `weir.seq` counts commits but whose store has no format
//! version, or counts fewer commits than `weir.seq`, is refused as corrupt.
//!
//! `weir.seq` also marks the directory as a ledger: a new ledger writes it
//! (counting none) before it creates its store. A `sled/` without it is a
//! ledger only when its store holds weir's format version (a build that
//! did not write `weir.seq`); any other is refused as not a weir ledger,
//! so that weir neither takes over nor reports on a store it did not write.
//!
//! # Code
//!
//! This file holds [`Ledger`] and its reads; [`open`] opens it (locks,
//! checks, indexes, recovery), and [`batch`] applies a commit's ops to the
//! store, editing component entries with [`edit`]. The other modules are
//! the stored forms ([`record`], [`stored`], [`delta`], [`pack`], [`scan`])
//! and what lives beside the store ([`journal`], [`index`]).

pub(crate) mod delta;
pub(crate) mod digest;
pub(crate) mod index;
pub(crate) mod journal;
pub(crate) mod pack;
pub(crate) mod partition;
pub(crate) mod record;
pub(crate) mod scan;
pub(crate) mod stored;

mod batch;
mod edit;
mod memo;
mod open;
mod upgrade;

use stored::StoredEntry;

use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use rustc_hash::FxHashSet;
use serde::Serialize;
use serde_bytes::ByteBuf;

use crate::error::{Error, Result};
use crate::model::{keycode, StableKey};
use index::OwnerIndex;
use journal::Journal;
use record::{ComponentEntry, Intent};

/// The ledger format this build reads and writes.
pub(crate) const FORMAT_VERSION: u32 = 4;
/// The earliest format this build opens (and upgrades: see [`upgrade`]).
const FORMAT_OLDEST: u32 = 1;
/// The default sled page cache size: 64 MiB.
pub const DEFAULT_LEDGER_CACHE_BYTES: u64 = 64 * 1024 * 1024;

const P_COMPONENT: u8 = b'c';
const P_DELTA: u8 = b'e';
/// The tree of large `c` values.
const ENTRIES_TREE: &[u8] = b"entries";
const P_CHILDREN: u8 = b'h';
const P_CONTAINER: u8 = b'd';
const P_PACK: u8 = b'k';
/// Fewest small component entries in one batch that are packed together.
const PACK_MIN: usize = 4;
const P_INTENT: u8 = b'i';
const P_MEMO: u8 = b'o';
const P_FAILED_RUNS: u8 = b'f';
const FORMAT_KEY: &[u8] = b"mformat";
/// The format an upgrade under way started from (see [`upgrade`]).
const UPGRADE_KEY: &[u8] = b"mupgrade";
/// This ledger's identity: a random UUID given when it is created (or
/// first opened by a build that gives one), which names it as the owner of
/// the tables it creates.
const ID_KEY: &[u8] = b"mid";
const SEQ_KEY: &[u8] = b"mseq";
/// The file beside the store that holds the commit count last flushed.
const SEQ_FILE: &str = "weir.seq";

fn key(prefix: u8, rest: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(rest.len() + 1);
    k.push(prefix);
    k.extend_from_slice(rest);
    k
}

/// An open ledger. Cheap to clone; the lock file is released when the App
/// stops ([`Ledger::release_lock`]) or the last clone is dropped, and
/// sled's own lock when the last clone is dropped.
#[derive(Clone)]
pub(crate) struct Ledger {
    // Field order matters: when the last clone goes, sled closes before
    // the lock file is released.
    tree: sled::Db,
    /// Large `c` values (see the module's docs).
    entries: sled::Tree,
    dir: Arc<str>,
    index: Arc<RwLock<OwnerIndex>>,
    packs: Arc<RwLock<pack::PackIndex>>,
    /// Where entries and child lists are. Reading an entry holds this for
    /// reading, and applying a commit holds it for writing, so that an
    /// entry's value (in either tree) and its delta are read as one commit
    /// left them.
    layout: Arc<RwLock<Layout>>,
    /// Commits applied so far (stored under `mseq` by each batch).
    seq: Arc<std::sync::atomic::AtomicU64>,
    /// `weir.seq`: the commit count last flushed.
    seq_file: Arc<PathBuf>,
    /// The intent journal (`weir.intents`).
    journal: Arc<std::sync::Mutex<Journal>>,
    /// What components declared at their last clean commit (see
    /// [`digest`]).
    digests: Arc<digest::Digests>,
    /// Which pack holds each component's memo key (see [`memo`]).
    memos: Arc<RwLock<pack::PackIndex>>,
    /// The open `weir.lock`, whose lock is the App's hold on the ledger;
    /// taken (and so released) when the App stops, even while a run it
    /// left behind still holds a clone of the ledger.
    lock: Arc<std::sync::Mutex<Option<File>>>,
}

fn container_key(container: &[u8], component: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(container.len() + component.len() + 5);
    k.push(P_CONTAINER);
    k.extend_from_slice(container);
    k.extend_from_slice(component);
    k.extend_from_slice(&(component.len() as u32).to_be_bytes());
    k
}

/// Splits a `d` key (without its prefix byte) into container and component.
fn split_container_key(rest: &[u8]) -> Option<(&[u8], &[u8])> {
    let (body, len) = rest.split_at_checked(rest.len().checked_sub(4)?)?;
    let len = u32::from_be_bytes(len.try_into().ok()?) as usize;
    let (container, component) = body.split_at_checked(body.len().checked_sub(len)?)?;
    Some((container, component))
}

/// What the ledger knows in memory of where its components' values are,
/// so that a read looks only where a value can be: a component's entry is
/// read with one sled lookup (not one per tree), and with none when it has
/// no value anywhere (a new component, as every component of a first run
/// is); its child list with none when it has none, as most components have
/// none.
///
/// Each set holds at least the components it names (a stale member only
/// costs a lookup that finds nothing): they are loaded when the ledger
/// opens, and a commit adds to them before it is applied and removes from
/// them only what it deleted, under the write lock.
#[derive(Default)]
pub(crate) struct Layout {
    /// The components whose entries have a delta (`e`).
    deltas: FxHashSet<Vec<u8>>,
    /// The components whose entries are in the tree of large values.
    large: FxHashSet<Vec<u8>>,
    /// The components with a child list (`h`).
    parents: FxHashSet<Vec<u8>>,
    /// The components with a value of their own in the first tree (`c`:
    /// an entry, or a tombstone that hides older packs). Components in a
    /// pack are in the pack index instead.
    own: FxHashSet<Vec<u8>>,
}

/// What a commit changes in the [`Layout`], by set: components that join
/// it (true) or leave it.
#[derive(Default)]
pub(crate) struct LayoutChanges {
    deltas: Vec<(Vec<u8>, bool)>,
    large: Vec<(Vec<u8>, bool)>,
    parents: Vec<(Vec<u8>, bool)>,
    own: Vec<(Vec<u8>, bool)>,
}

impl Layout {
    /// Notes what an applied commit changed: components whose entries got
    /// (true) or lost a delta, moved into (true) or out of the tree of large
    /// values, got (true) or lost a child list, and got a value of their
    /// own in the first tree (true) or lost it.
    fn note(&mut self, changes: LayoutChanges) {
        let LayoutChanges {
            deltas,
            large,
            parents,
            own,
        } = changes;
        for (set, changes) in [
            (&mut self.deltas, deltas),
            (&mut self.large, large),
            (&mut self.parents, parents),
            (&mut self.own, own),
        ] {
            for (component, has) in changes {
                if has {
                    set.insert(component);
                } else {
                    set.remove(&component);
                }
            }
        }
    }
}

impl Ledger {
    fn layout(&self) -> std::sync::RwLockReadGuard<'_, Layout> {
        crate::sync::read(&self.layout)
    }

    fn layout_mut(&self) -> std::sync::RwLockWriteGuard<'_, Layout> {
        crate::sync::write(&self.layout)
    }

    fn packs_mut(&self) -> std::sync::RwLockWriteGuard<'_, pack::PackIndex> {
        crate::sync::write(&self.packs)
    }

    fn memos(&self) -> std::sync::RwLockReadGuard<'_, pack::PackIndex> {
        crate::sync::read(&self.memos)
    }

    fn memos_mut(&self) -> std::sync::RwLockWriteGuard<'_, pack::PackIndex> {
        crate::sync::write(&self.memos)
    }

    fn packs(&self) -> std::sync::RwLockReadGuard<'_, pack::PackIndex> {
        crate::sync::read(&self.packs)
    }

    fn pack_of(&self, component: &[u8]) -> Option<u64> {
        self.packs().members.get(component).copied()
    }

    /// Every component held in a pack.
    fn pack_members(&self) -> Vec<Vec<u8>> {
        self.packs().members.keys().cloned().collect()
    }

    /// A component's entry in the pack that holds it, if one does: read
    /// from memory when the pack is a recent one.
    fn packed_raw(&self, component: &[u8]) -> Result<Option<sled::IVec>> {
        let found = self.packs().find_member(component);
        let pack = match found {
            None => return Ok(None),
            Some((_, Some(bytes))) => bytes,
            Some((id, None)) => match self.tree.get(key(P_PACK, &id.to_be_bytes()))? {
                Some(bytes) => bytes,
                None => return Ok(None),
            },
        };
        Ok(pack::find(&pack, component).map(|(off, len)| pack.subslice(off, len)))
    }

    /// Every component entry: own keys and live pack members.
    fn all_entries(&self) -> Result<Vec<(Vec<u8>, ComponentEntry)>> {
        let mut out = Vec::new();
        // Held throughout, so that no commit lands between an entry and
        // its delta.
        let layout = self.layout();
        for item in self
            .tree
            .scan_prefix([P_COMPONENT])
            .chain(self.entries.scan_prefix([P_COMPONENT]))
        {
            let (k, v) = item?;
            if pack::tombstone_generation(&v).is_some() {
                continue;
            }
            let component = k.get(1..).unwrap_or_default();
            let entry: ComponentEntry = match self.delta_of(component, &layout)? {
                Some(delta) => StoredEntry::parse(self, v, Some(delta))?.to_owned_entry(),
                None => self.decode(&v, "a component entry")?,
            };
            out.push((component.to_vec(), entry));
        }
        for component in self.pack_members() {
            if let Some((raw, delta)) = self.bytes_with(&component, &layout)? {
                out.push((
                    component,
                    StoredEntry::parse(self, raw, delta)?.to_owned_entry(),
                ));
            }
        }
        Ok(out)
    }

    fn index_mut(&self) -> std::sync::RwLockWriteGuard<'_, OwnerIndex> {
        crate::sync::write(&self.index)
    }

    /// The components that may hold a state (confirm in their entries).
    pub(crate) fn owner_candidates(&self, path: &[u8]) -> Vec<Arc<[u8]>> {
        crate::sync::read(&self.index).candidates(path)
    }

    fn journal(&self) -> Result<std::sync::MutexGuard<'_, Journal>> {
        self.journal
            .lock()
            .map_err(|_| Error::msg("the intent journal's lock is poisoned"))
    }

    /// Releases the ledger's lock file, so that another App may open the
    /// ledger: called once the App's ledger actor, its only writer, has
    /// stopped. sled's own lock lasts while clones of the ledger do; opening
    /// waits for it a little (see `Ledger::open`).
    pub(crate) fn release_lock(&self) {
        let file = match self.lock.lock() {
            Ok(mut file) => file.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        drop(file);
    }

    pub(crate) fn dir(&self) -> &str {
        &self.dir
    }

    pub(crate) fn corrupt(&self, detail: impl Into<String>) -> Error {
        Error::LedgerCorrupt {
            path: self.dir.to_string(),
            detail: detail.into(),
        }
    }

    fn decode<'a, T: serde::Deserialize<'a>>(&self, bytes: &'a [u8], what: &str) -> Result<T> {
        rmp_serde::from_slice(bytes).map_err(|e| self.corrupt(format!("cannot decode {what}: {e}")))
    }

    /// The entry of a component, if it has one.
    pub(crate) fn component(&self, component: &[u8]) -> Result<Option<ComponentEntry>> {
        Ok(self.stored(component)?.map(|e| e.to_owned_entry()))
    }

    /// The entry of a component as stored, if it has one: read without
    /// copying its states (see [`StoredEntry`]).
    pub(crate) fn stored(&self, component: &[u8]) -> Result<Option<StoredEntry>> {
        match self.stored_bytes(component)? {
            Some((raw, delta)) => StoredEntry::parse(self, raw, delta).map(Some),
            None => Ok(None),
        }
    }

    /// The stored bytes of a component's own entry and of its delta, if
    /// it has an entry.
    fn stored_bytes(&self, component: &[u8]) -> Result<Option<(sled::IVec, Option<sled::IVec>)>> {
        // Held even for an entry without a delta: its value may be moving
        // between the trees, which `component_raw` reads one after the
        // other.
        let layout = self.layout();
        self.bytes_with(component, &layout)
    }

    /// [`Ledger::stored_bytes`], with the layout held.
    fn bytes_with(
        &self,
        component: &[u8],
        layout: &Layout,
    ) -> Result<Option<(sled::IVec, Option<sled::IVec>)>> {
        let Some(raw) = self.raw_with(component, layout)? else {
            return Ok(None);
        };
        Ok(Some((raw, self.delta_of(component, layout)?)))
    }

    /// The delta of a component's entry, if the layout says it has one.
    fn delta_of(&self, component: &[u8], layout: &Layout) -> Result<Option<sled::IVec>> {
        if !layout.deltas.contains(component) {
            return Ok(None);
        }
        Ok(self.tree.get(key(P_DELTA, component))?)
    }

    /// The stored bytes of a component's own entry (without its delta):
    /// from its pack, or its own key.
    fn component_raw(&self, component: &[u8]) -> Result<Option<sled::IVec>> {
        self.raw_with(component, &self.layout())
    }

    /// [`Ledger::component_raw`], with the layout held.
    fn raw_with(&self, component: &[u8], layout: &Layout) -> Result<Option<sled::IVec>> {
        if let Some(raw) = self.packed_raw(component)? {
            return Ok(Some(raw));
        }
        let k = key(P_COMPONENT, component);
        if layout.own.contains(component) {
            if let Some(v) = self.tree.get(&k)? {
                // A tombstone means the component was deleted.
                return Ok(Some(v).filter(|v| pack::tombstone_generation(v).is_none()));
            }
        }
        if layout.large.contains(component) {
            return Ok(self.entries.get(&k)?);
        }
        Ok(None)
    }

    /// The child components a component mounted in its last successful run.
    pub(crate) fn children(&self, component: &[u8]) -> Result<Vec<StableKey>> {
        let layout = self.layout();
        if !layout.parents.contains(component) {
            return Ok(Vec::new());
        }
        match self.tree.get(key(P_CHILDREN, component))? {
            Some(v) => self.decode(&v, "a child list"),
            None => Ok(Vec::new()),
        }
    }

    /// This ledger's identity (see `ID_KEY`).
    pub(crate) fn id(&self) -> Result<String> {
        match self.tree.get(ID_KEY)? {
            Some(v) => Ok(String::from_utf8_lossy(&v).into_owned()),
            None => Err(self.corrupt("it has no identity")),
        }
    }

    /// How many commits this ledger has applied: it only grows.
    pub(crate) fn commits(&self) -> u64 {
        self.seq.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How many runs in a row a component failed (0 when its last run
    /// succeeded). A count written with another width reads as damage.
    pub(crate) fn failed_runs(&self, component: &[u8]) -> Result<u32> {
        match self.tree.get(key(P_FAILED_RUNS, component))? {
            None => Ok(0),
            Some(v) => v
                .as_ref()
                .try_into()
                .map(u32::from_be_bytes)
                .map_err(|_| self.corrupt("a failed-run count is not 4 bytes")),
        }
    }

    /// Appends an intent batch to the journal; durable once
    /// [`Ledger::sync_intents`] or [`Ledger::flush`] returns.
    pub(crate) fn put_intents(&self, id: u64, intents: &[Intent]) -> Result<()> {
        Ok(self.journal()?.append(id, intents)?)
    }

    /// Makes the intents appended so far durable.
    pub(crate) fn sync_intents(&self) -> Result<()> {
        Ok(self.journal()?.sync()?)
    }

    /// Makes everything written so far durable, then forgets the intent
    /// batches deleted by the commits just made durable.
    pub(crate) fn flush(&self) -> Result<()> {
        self.tree.flush()?;
        self.write_seq_file()?;
        let mut journal = self.journal()?;
        journal.forget_pending()?;
        Ok(journal.sync()?)
    }

    /// The size of the ledger on disk, in bytes.
    pub(crate) fn size_on_disk(&self) -> u64 {
        self.tree.size_on_disk().unwrap_or(0)
    }

    /// What the ledger holds, for people: states by provider and the
    /// components that failed.
    pub(crate) fn report(&self) -> Result<LedgerReport> {
        let mut providers: std::collections::BTreeMap<String, u64> = Default::default();
        let mut maybe_missing: std::collections::BTreeMap<String, u64> = Default::default();
        let mut failures = Vec::new();
        let mut states = 0;
        let entries = self.all_entries()?;
        for (component, entry) in &entries {
            for s in &entry.states {
                states += 1;
                let name = keycode::split_state_path(&s.path)
                    .and_then(|(provider, _)| {
                        crate::model::provider::ProviderPath::name_of(provider)
                    })
                    .unwrap_or_else(|| "(undecodable provider)".to_string());
                if s.may_be_missing {
                    *maybe_missing.entry(name.clone()).or_default() += 1;
                }
                *providers.entry(name).or_default() += 1;
            }
            if let Some(cause) = &entry.failure {
                let path = keycode::decode_component_path(component)
                    .ok_or_else(|| self.corrupt("a component key is malformed"))?;
                failures.push((path, cause.clone()));
            }
        }
        failures.sort_by_key(|f| f.0.to_string());
        Ok(LedgerReport {
            path: self.dir.to_string(),
            format_version: FORMAT_VERSION,
            size_on_disk: self.size_on_disk(),
            components: entries.len() as u64,
            target_states: states,
            providers: providers.into_iter().collect(),
            maybe_missing: maybe_missing.into_iter().collect(),
            failures,
        })
    }

    /// Counts what the ledger tracks: (components, states).
    pub(crate) fn counts(&self) -> Result<(u64, u64)> {
        let entries = self.all_entries()?;
        let states = entries.iter().map(|(_, e)| e.states.len() as u64).sum();
        Ok((entries.len() as u64, states))
    }
}

fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    Ok(rmp_serde::to_vec(value)?)
}

/// Converts raw bytes into the ledger's byte-buffer type.
pub(crate) fn buf(bytes: &[u8]) -> ByteBuf {
    ByteBuf::from(bytes.to_vec())
}

/// What a ledger holds (see [`App::inspect`](crate::App::inspect)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LedgerReport {
    /// The ledger directory.
    pub path: String,
    /// The ledger's format version.
    pub format_version: u32,
    /// The ledger's size on disk, in bytes.
    pub size_on_disk: u64,
    /// Components with an entry (states or a failure).
    pub components: u64,
    /// Target states tracked.
    pub target_states: u64,
    /// Target states tracked, by provider name (`documents`, or
    /// `tables/documents` for the rows of a table below a container).
    pub providers: Vec<(String, u64)>,
    /// Of those, the states that may not exist (by provider): tracked as
    /// possibly created by a run stopped while it applied them, or after a
    /// failed update.
    pub maybe_missing: Vec<(String, u64)>,
    /// Components whose last run failed, with the cause.
    pub failures: Vec<(crate::model::ComponentPath, String)>,
}

#[cfg(test)]
mod tests;
