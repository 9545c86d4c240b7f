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
//! | `c`    | encoded component path          | [`ComponentEntry`]: its states |
//! | `e`    | encoded component path          | changes to its `c` value (see [`delta`]) |
//! | `h`    | encoded component path          | its child component keys       |
//! | `d`    | container path, component path, u32 BE length of the component path | empty |
//! | `i`    | intent batch id, u64 BE         | `Vec<Intent>` (earlier builds; recovered and deleted on open) |
//! | `k`    | pack id, u64 BE                 | new components' entries, packed (see [`pack`]) |
//! | `o`    | encoded component path          | the memo key of its last successful run |
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
//! that deleting a container drops everything below it.
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
//! ledger whose `weir.seq` exists but whose store has no format version, or
//! counts fewer commits than `weir.seq`, is refused as corrupt.

pub(crate) mod delta;
pub(crate) mod index;
pub(crate) mod journal;
pub(crate) mod pack;
pub(crate) mod record;
pub(crate) mod scan;
pub(crate) mod stored;

use stored::{ShallowEntry, StoredEntry};

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;
use serde_bytes::ByteBuf;

use crate::error::{Error, Result};
use crate::model::{keycode, StableKey};
use index::OwnerIndex;
use journal::{Journal, JournalError};
use record::{ComponentEntry, Intent, LedgerOp, StateEntry};

/// The ledger format this build reads and writes.
pub(crate) const FORMAT_VERSION: u32 = 2;
/// The earlier format this build also reads: it is version 2 without deltas
/// or the second tree, and is marked version 2 when opened (for good:
/// builds that read only version 1 refuse it from then on).
const FORMAT_WITHOUT_DELTAS: u32 = 1;
/// The default sled page cache size: 64 MiB.
pub const DEFAULT_LEDGER_CACHE_BYTES: u64 = 64 * 1024 * 1024;

const P_COMPONENT: u8 = b'c';
const P_DELTA: u8 = b'e';
/// The tree of large `c` values.
const ENTRIES_TREE: &[u8] = b"entries";
const P_CHILDREN: u8 = b'h';
const P_CONTAINER: u8 = b'd';
const P_PACK: u8 = b'k';
/// Fewest new component entries in one batch that are packed together.
const PACK_MIN: usize = 4;
const P_INTENT: u8 = b'i';
const P_MEMO: u8 = b'o';
const FORMAT_KEY: &[u8] = b"mformat";
const SEQ_KEY: &[u8] = b"mseq";
/// The file beside the store that holds the commit count last flushed.
const SEQ_FILE: &str = "weir.seq";

fn key(prefix: u8, rest: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(rest.len() + 1);
    k.push(prefix);
    k.extend_from_slice(rest);
    k
}

/// An open ledger. Cheap to clone; the lock is released when the last clone
/// is dropped.
#[derive(Clone)]
pub(crate) struct Ledger {
    // Field order matters: sled closes before the lock file is released.
    tree: sled::Db,
    /// Large `c` values (see the module's docs).
    entries: sled::Tree,
    dir: Arc<str>,
    index: Arc<RwLock<OwnerIndex>>,
    packs: Arc<RwLock<pack::PackIndex>>,
    /// The components whose entries have a delta. Reading an entry holds
    /// this for reading, and applying a commit holds it for writing, so
    /// that an entry's value (in either tree) and its delta are read as one
    /// commit left them.
    deltas: Arc<RwLock<FxHashSet<Vec<u8>>>>,
    /// Commits applied so far (stored under `mseq` by each batch).
    seq: Arc<std::sync::atomic::AtomicU64>,
    /// `weir.seq`: the commit count last flushed.
    seq_file: Arc<PathBuf>,
    /// The intent journal (`weir.intents`).
    journal: Arc<std::sync::Mutex<Journal>>,
    _lock: Arc<File>,
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

/// How long opening a ledger waits for sled's own lock.
const SLED_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// How often it tries again meanwhile.
const SLED_LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(20);

/// Whether sled failed to open because its lock is held.
fn is_sled_lock(e: &std::io::Error) -> bool {
    e.to_string().contains("could not acquire lock")
}

impl Ledger {
    /// Opens (or creates) the ledger in `dir`.
    pub(crate) fn open(dir: &Path, cache_bytes: u64) -> Result<Ledger> {
        let display: Arc<str> = Arc::from(dir.display().to_string());
        std::fs::create_dir_all(dir)?;
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("weir.lock"))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::LedgerLocked {
                    path: display.to_string(),
                })
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::Io(e)),
        }
        let sled_dir: PathBuf = dir.join("sled");
        let existed = sled_dir.exists();
        let config = sled::Config::new()
            .path(&sled_dir)
            .cache_capacity(cache_bytes)
            .flush_every_ms(None);
        let corrupt = |detail: String| Error::LedgerCorrupt {
            path: display.to_string(),
            detail,
        };
        // sled takes a lock of its own, which a ledger closed a moment ago
        // may still hold while its background threads wind down: wait
        // for it a little, rather than call the ledger corrupt.
        let mut waited = std::time::Duration::ZERO;
        let db = loop {
            // sled may panic on damaged files: that is corruption too.
            let config = config.clone();
            let opened =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || config.open()))
                    .map_err(|_| corrupt("sled panicked while reading it".into()))?;
            match opened {
                Ok(db) => break db,
                Err(sled::Error::Io(io)) if is_sled_lock(&io) && waited < SLED_LOCK_WAIT => {
                    std::thread::sleep(SLED_LOCK_RETRY);
                    waited += SLED_LOCK_RETRY;
                }
                Err(sled::Error::Io(io)) if is_sled_lock(&io) => {
                    return Err(Error::LedgerLocked {
                        path: display.to_string(),
                    })
                }
                Err(sled::Error::Io(io)) if io.kind() == std::io::ErrorKind::PermissionDenied => {
                    return Err(Error::Io(io))
                }
                Err(other) => return Err(corrupt(format!("sled cannot open it: {other}"))),
            }
        };
        let (journal, pending) = Journal::open(dir).map_err(|e| match e {
            JournalError::Io(io) => Error::Io(io),
            JournalError::Corrupt(detail) => corrupt(detail),
        })?;
        let entries = db.open_tree(ENTRIES_TREE)?;
        let ledger = Ledger {
            tree: db,
            entries,
            dir: display,
            index: Arc::new(RwLock::new(OwnerIndex::default())),
            packs: Arc::new(RwLock::new(pack::PackIndex::default())),
            deltas: Arc::new(RwLock::new(FxHashSet::default())),
            seq: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            seq_file: Arc::new(dir.join(SEQ_FILE)),
            journal: Arc::new(std::sync::Mutex::new(journal)),
            _lock: Arc::new(lock),
        };
        let flushed_seq = ledger.read_seq_file();
        ledger.check_format(existed, flushed_seq.is_some())?;
        ledger.check_seq(flushed_seq)?;
        ledger.load_packs()?;
        ledger.load_deltas()?;
        ledger.build_index()?;
        ledger.recover(pending)?;
        Ok(ledger)
    }

    /// The commit count in `weir.seq`; `None` when there is none (a new
    /// ledger, one written by an older build) or it cannot be read (a
    /// crash while it was replaced; it only ever lags the store).
    fn read_seq_file(&self) -> Option<u64> {
        std::fs::read_to_string(&*self.seq_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }

    /// Refuses a store that lost commits `weir.seq` saw flushed, then
    /// records the store's count.
    fn check_seq(&self, flushed: Option<u64>) -> Result<()> {
        let stored = match self.tree.get(SEQ_KEY)? {
            Some(v) => u64::from_be_bytes(
                v.as_ref()
                    .try_into()
                    .map_err(|_| self.corrupt("the commit count is not 8 bytes"))?,
            ),
            None => 0,
        };
        if let Some(flushed) = flushed.filter(|f| *f > stored) {
            return Err(self.corrupt(format!(
                "its store holds {stored} commits, but {flushed} had been written ({SEQ_FILE}): the store was truncated or damaged and lost writes"
            )));
        }
        self.seq.store(stored, std::sync::atomic::Ordering::SeqCst);
        self.write_seq_file()
    }

    /// Writes the commit count to `weir.seq` (by rename, so it is whole).
    fn write_seq_file(&self) -> Result<()> {
        let seq = self.seq.load(std::sync::atomic::Ordering::SeqCst);
        let tmp = self.seq_file.with_extension("seq.tmp");
        std::fs::write(&tmp, format!("{seq}\n"))?;
        std::fs::rename(&tmp, &*self.seq_file)?;
        Ok(())
    }

    fn check_format(&self, existed: bool, was_written: bool) -> Result<()> {
        match self.tree.get(FORMAT_KEY)? {
            Some(v) => {
                let raw: [u8; 4] = v
                    .as_ref()
                    .try_into()
                    .map_err(|_| self.corrupt("format version is not 4 bytes"))?;
                let found = u32::from_be_bytes(raw);
                if found == FORMAT_WITHOUT_DELTAS {
                    self.tree
                        .insert(FORMAT_KEY, &FORMAT_VERSION.to_be_bytes())?;
                    self.tree.flush()?;
                    return Ok(());
                }
                if found != FORMAT_VERSION {
                    return Err(Error::LedgerVersion {
                        path: self.dir.to_string(),
                        found,
                        supported: FORMAT_VERSION,
                    });
                }
                Ok(())
            }
            None if existed && !self.tree.is_empty() => {
                Err(self.corrupt("the format version is missing"))
            }
            None if was_written => Err(self.corrupt(format!(
                "its store is empty or unreadable, but it had been written ({SEQ_FILE} exists)"
            ))),
            None => {
                self.tree
                    .insert(FORMAT_KEY, &FORMAT_VERSION.to_be_bytes())?;
                self.tree.flush()?;
                Ok(())
            }
        }
    }

    /// Finds the live members of every pack: those with no key of their
    /// own, or only a tombstone older than the pack. Deletes packs with no
    /// live member and tombstones that hide nothing.
    fn load_packs(&self) -> Result<()> {
        let mut index = pack::PackIndex::default();
        let mut contained: HashSet<Vec<u8>> = HashSet::new();
        let mut gc = sled::Batch::default();
        let mut dirty = false;
        for item in self.tree.scan_prefix([P_PACK]) {
            let (k, v) = item?;
            let raw: [u8; 8] = k
                .get(1..)
                .and_then(|s| s.try_into().ok())
                .ok_or_else(|| self.corrupt("a pack key is malformed"))?;
            let id = u64::from_be_bytes(raw);
            index.next_id = index.next_id.max(id + 1);
            let mut live = 0;
            let members: Vec<Vec<u8>> = pack::records(&v).map(|(c, _, _)| c.to_vec()).collect();
            for component in &members {
                let k = key(P_COMPONENT, component);
                let own = match self.tree.get(&k)? {
                    Some(v) => Some(v),
                    None => self.entries.get(&k)?,
                };
                let hidden = match &own {
                    None => false,
                    Some(value) => pack::tombstone_generation(value).is_none_or(|t| t > id),
                };
                if !hidden {
                    index.members.insert(component.clone(), id);
                    live += 1;
                }
            }
            if live == 0 {
                gc.remove(k);
                dirty = true;
            } else {
                index.live.insert(id, live);
                contained.extend(members);
            }
        }
        for item in self.tree.scan_prefix([P_COMPONENT]) {
            let (k, v) = item?;
            let Some(generation) = pack::tombstone_generation(&v) else {
                continue;
            };
            index.next_id = index.next_id.max(generation + 1);
            let component = k.get(1..).unwrap_or_default();
            if !contained.contains(component) {
                gc.remove(k);
                dirty = true;
            }
        }
        if dirty {
            self.tree.apply_batch(gc)?;
            self.tree.flush()?;
        }
        *self.packs_mut() = index;
        Ok(())
    }

    /// Finds the components whose entries have a delta.
    fn load_deltas(&self) -> Result<()> {
        let mut deltas = FxHashSet::default();
        for item in self.tree.scan_prefix([P_DELTA]) {
            let (k, _) = item?;
            deltas.insert(k.get(1..).unwrap_or_default().to_vec());
        }
        *self.deltas_mut() = deltas;
        Ok(())
    }

    fn deltas(&self) -> std::sync::RwLockReadGuard<'_, FxHashSet<Vec<u8>>> {
        match self.deltas.read() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    fn deltas_mut(&self) -> std::sync::RwLockWriteGuard<'_, FxHashSet<Vec<u8>>> {
        match self.deltas.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    fn packs_mut(&self) -> std::sync::RwLockWriteGuard<'_, pack::PackIndex> {
        match self.packs.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    fn pack_of(&self, component: &[u8]) -> Option<u64> {
        match self.packs.read() {
            Ok(g) => g.members.get(component).copied(),
            Err(p) => p.into_inner().members.get(component).copied(),
        }
    }

    /// Every component entry: own keys and live pack members.
    fn all_entries(&self) -> Result<Vec<(Vec<u8>, ComponentEntry)>> {
        let mut out = Vec::new();
        // Held throughout, so that no commit lands between an entry and
        // its delta.
        let deltas = self.deltas();
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
            let entry: ComponentEntry = match self.delta_of(component, &deltas)? {
                Some(delta) => StoredEntry::parse(self, v, Some(delta))?.to_owned_entry(),
                None => self.decode(&v, "a component entry")?,
            };
            out.push((component.to_vec(), entry));
        }
        let members: Vec<Vec<u8>> = match self.packs.read() {
            Ok(g) => g.members.keys().cloned().collect(),
            Err(p) => p.into_inner().members.keys().cloned().collect(),
        };
        for component in members {
            if let Some((raw, delta)) = self.bytes_with(&component, &deltas)? {
                out.push((
                    component,
                    StoredEntry::parse(self, raw, delta)?.to_owned_entry(),
                ));
            }
        }
        Ok(out)
    }

    /// Rebuilds the in-memory owner index from the component entries.
    fn build_index(&self) -> Result<()> {
        let mut index = OwnerIndex::default();
        for (component, entry) in self.all_entries()? {
            for s in &entry.states {
                index.add(&s.path, &component);
            }
        }
        *self.index_mut() = index;
        Ok(())
    }

    fn index_mut(&self) -> std::sync::RwLockWriteGuard<'_, OwnerIndex> {
        match self.index.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// The components that may hold a state (confirm in their entries).
    pub(crate) fn owner_candidates(&self, path: &[u8]) -> Vec<Arc<[u8]>> {
        match self.index.read() {
            Ok(g) => g.candidates(path),
            Err(p) => p.into_inner().candidates(path),
        }
    }

    /// Folds intents left by a crash into the component entries: those of
    /// the journal, and those an earlier build kept in the store. Then
    /// empties the journal and deletes the stored ones.
    fn recover(&self, journaled: Vec<Intent>) -> Result<()> {
        let mut ops: Vec<LedgerOp> = journaled.into_iter().map(LedgerOp::Recover).collect();
        let mut stored = sled::Batch::default();
        let mut any_stored = false;
        for item in self.tree.scan_prefix([P_INTENT]) {
            let (k, v) = item?;
            let intents: Vec<Intent> = self.decode(&v, "an intent batch")?;
            ops.extend(intents.into_iter().map(LedgerOp::Recover));
            stored.remove(k);
            any_stored = true;
        }
        if !ops.is_empty() {
            self.apply(ops)?;
            self.tree.flush()?;
        }
        // Only once the folds are durable: a crash before this recovers
        // the same intents again, which folds nothing new.
        if any_stored {
            self.tree.apply_batch(stored)?;
            self.tree.flush()?;
        }
        self.journal()?.clear()?;
        Ok(())
    }

    fn journal(&self) -> Result<std::sync::MutexGuard<'_, Journal>> {
        self.journal
            .lock()
            .map_err(|_| Error::msg("the intent journal's lock is poisoned"))
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
        let deltas = self.deltas();
        self.bytes_with(component, &deltas)
    }

    /// [`Ledger::stored_bytes`], with the components that have deltas held.
    fn bytes_with(
        &self,
        component: &[u8],
        deltas: &FxHashSet<Vec<u8>>,
    ) -> Result<Option<(sled::IVec, Option<sled::IVec>)>> {
        let Some(raw) = self.component_raw(component)? else {
            return Ok(None);
        };
        Ok(Some((raw, self.delta_of(component, deltas)?)))
    }

    /// The delta of a component's entry, if `deltas` says it has one.
    fn delta_of(
        &self,
        component: &[u8],
        deltas: &FxHashSet<Vec<u8>>,
    ) -> Result<Option<sled::IVec>> {
        if !deltas.contains(component) {
            return Ok(None);
        }
        Ok(self.tree.get(key(P_DELTA, component))?)
    }

    /// The stored bytes of a component's own entry (without its delta):
    /// from its pack, or its own key.
    fn component_raw(&self, component: &[u8]) -> Result<Option<sled::IVec>> {
        if let Some(id) = self.pack_of(component) {
            if let Some(p) = self.tree.get(key(P_PACK, &id.to_be_bytes()))? {
                if let Some((off, len)) = pack::find(&p, component) {
                    return Ok(Some(p.subslice(off, len)));
                }
            }
        }
        let k = key(P_COMPONENT, component);
        match self.tree.get(&k)? {
            // A tombstone means the component was deleted.
            Some(v) => Ok(Some(v).filter(|v| pack::tombstone_generation(v).is_none())),
            None => Ok(self.entries.get(&k)?),
        }
    }

    /// The child components a component mounted in its last successful run.
    pub(crate) fn children(&self, component: &[u8]) -> Result<Vec<StableKey>> {
        match self.tree.get(key(P_CHILDREN, component))? {
            Some(v) => self.decode(&v, "a child list"),
            None => Ok(Vec::new()),
        }
    }

    /// The memo key a component committed with in its last successful
    /// run, if it was mounted with one and has not failed or been
    /// interrupted since.
    pub(crate) fn memo(&self, component: &[u8]) -> Result<Option<sled::IVec>> {
        Ok(self.tree.get(key(P_MEMO, component))?)
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
    pub(crate) fn report(&self) -> Result<crate::app::LedgerReport> {
        let mut providers: std::collections::BTreeMap<String, u64> = Default::default();
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
                *providers.entry(name).or_default() += 1;
            }
            if let Some(cause) = &entry.failure {
                let path = keycode::decode_component(component)
                    .map(|segments| {
                        segments
                            .into_iter()
                            .fold(crate::model::ComponentPath::root(), |p, k| p.child(k))
                    })
                    .ok_or_else(|| self.corrupt("a component key is malformed"))?;
                failures.push((path, cause.clone()));
            }
        }
        failures.sort_by_key(|f| f.0.to_string());
        Ok(crate::app::LedgerReport {
            path: self.dir.to_string(),
            format_version: FORMAT_VERSION,
            size_on_disk: self.size_on_disk(),
            components: entries.len() as u64,
            target_states: states,
            providers: providers.into_iter().collect(),
            failures,
        })
    }

    /// Counts what the ledger tracks: (components, states).
    pub(crate) fn counts(&self) -> Result<(u64, u64)> {
        let entries = self.all_entries()?;
        let states = entries.iter().map(|(_, e)| e.states.len() as u64).sum();
        Ok((entries.len() as u64, states))
    }

    /// Applies ops atomically (one sled batch). Does not flush.
    pub(crate) fn apply(&self, ops: Vec<LedgerOp>) -> Result<()> {
        let mut b = BatchBuilder {
            ledger: self,
            entries: HashMap::new(),
            index_adds: Vec::new(),
            index_removes: Vec::new(),
            forget_intents: Vec::new(),
            containers: HashSet::new(),
            children: HashMap::new(),
            child_removals: HashMap::new(),
            raw_puts: HashMap::new(),
            large: sled::Batch::default(),
            large_used: false,
            keys: 0,
            bytes: 0,
            batch: sled::Batch::default(),
        };
        for op in ops {
            b.op(op)?;
        }
        b.finish()
    }
}

/// A component entry being edited: upserts and removals are recorded and
/// merged in one pass, so a batch costs O(n + m log m), not O(n * m).
struct EntryEdit {
    base: ComponentEntry,
    /// The entry as stored, while nothing needed its states copied out
    /// (`base.states` is empty meanwhile; `base.failure` is the entry's).
    /// Encoding the edited entry then copies each state left alone as it
    /// is stored.
    stored: Option<StoredEntry>,
    /// The entry as stored, read shallowly (instead of `stored`) while
    /// nothing needed more than a delta against it.
    shallow: Option<ShallowEntry>,
    /// Whether `stored` or `shallow` was read from the store (not given
    /// whole earlier in this batch), so that a delta may be written against
    /// it.
    in_store: bool,
    /// Whether the entry was read with a delta, which writing it whole
    /// (or deleting it) must delete.
    had_delta: bool,
    /// The length of the own value it was read from (0: none), which a
    /// large one keeps in the tree of large values.
    own_len: usize,
    /// Upserts with their sequence number; the last one of a path wins.
    upserts: Vec<(u64, StateEntry)>,
    /// Removed paths with the sequence number of the removal.
    removes: FxHashMap<Vec<u8>, u64>,
    seq: u64,
}

/// An edited entry, encoded for the store.
enum Encoded {
    /// The whole entry, for its own key.
    Whole(Vec<u8>),
    /// A delta against its own value, which stays as stored.
    Delta(Vec<u8>),
    /// No state and no failure: the component's entry is deleted.
    Empty,
}

impl EntryEdit {
    fn new(base: ComponentEntry) -> Self {
        Self {
            base,
            stored: None,
            shallow: None,
            in_store: false,
            had_delta: false,
            own_len: 0,
            upserts: Vec::new(),
            removes: FxHashMap::default(),
            seq: 0,
        }
    }

    /// The edit of an entry kept as stored; `in_store` when it was read
    /// from the store.
    fn read(mut stored: StoredEntry, in_store: bool) -> Self {
        let mut edit = Self::new(ComponentEntry {
            states: Vec::new(),
            failure: stored.failure.take(),
        });
        edit.in_store = in_store;
        edit.had_delta = stored.has_delta();
        edit.own_len = stored.own_len();
        edit.stored = Some(stored);
        edit
    }

    /// The edit of an entry read shallowly from the store.
    fn read_shallow(mut shallow: ShallowEntry) -> Self {
        let mut edit = Self::new(ComponentEntry {
            states: Vec::new(),
            failure: shallow.take_failure(),
        });
        edit.in_store = true;
        edit.had_delta = shallow.has_delta();
        edit.own_len = shallow.delta_base().own_len;
        edit.shallow = Some(shallow);
        edit
    }

    /// Reads in full an entry read shallowly.
    fn deepen(&mut self, ledger: &Ledger) -> Result<()> {
        if let Some(shallow) = self.shallow.take() {
            // Its failure is `base.failure`, perhaps edited since.
            self.stored = Some(shallow.deepen(ledger)?);
        }
        Ok(())
    }

    /// Copies the stored states out into `base`, for edits that need them.
    fn copy_out(&mut self) {
        if let Some(stored) = self.stored.take() {
            let bytes = stored.bytes();
            self.base.states = stored.states.iter().map(|s| s.to_entry(bytes)).collect();
        }
    }

    /// The upserts that stand: the last one of each path, unless a later
    /// removal undid it, sorted by path.
    fn latest_upserts(&mut self) -> Vec<StateEntry> {
        let mut upserts = std::mem::take(&mut self.upserts);
        // Sort by path, then by sequence.
        upserts.sort_by(|a, b| a.1.path.cmp(&b.1.path).then(a.0.cmp(&b.0)));
        let mut latest: Vec<StateEntry> = Vec::with_capacity(upserts.len());
        let mut iter = upserts.into_iter().peekable();
        while let Some((seq, entry)) = iter.next() {
            if iter.peek().is_some_and(|(_, next)| next.path == entry.path) {
                continue;
            }
            if self
                .removes
                .get(entry.path.as_slice())
                .is_some_and(|r| *r > seq)
            {
                continue;
            }
            latest.push(entry);
        }
        latest
    }

    /// The edited entry, encoded: as a delta when `delta_ok` (its own value
    /// is not in a pack) and [`delta::encode`] takes it, else whole. An
    /// entry kept as stored is encoded whole by merging: its states left
    /// alone are copied as stored, the others encoded; the bytes are the
    /// same as encoding the materialized entry. `ledger` names the store in
    /// the error for a span outside the stored bytes (never made by the
    /// scanner).
    fn encoded(&mut self, ledger: &Ledger, delta_ok: bool) -> Result<Encoded> {
        if self.stored.is_none() && self.shallow.is_none() {
            self.materialize(ledger)?;
            if self.base.is_empty() {
                return Ok(Encoded::Empty);
            }
            return Ok(Encoded::Whole(encode(&self.base)?));
        }
        let latest = self.latest_upserts();
        let removes = std::mem::take(&mut self.removes);
        if delta_ok && self.in_store {
            let base = match (&self.shallow, &self.stored) {
                (Some(shallow), _) => Some(shallow.delta_base()),
                (None, Some(stored)) => Some(stored.delta_base()),
                (None, None) => None,
            };
            if let Some(base) = base {
                if let Some(d) =
                    delta::encode(&base, &latest, &removes, &self.base.failure, ledger)?
                {
                    return Ok(Encoded::Delta(d));
                }
            }
        }
        self.deepen(ledger)?;
        let Some(stored) = self.stored.take() else {
            return Err(Error::Shutdown("ledger entry vanished".into()));
        };
        let bytes = stored.bytes();
        let pieces = delta::Pieces::merge(&stored.states, bytes, &latest, &removes);
        if pieces.states == 0 && self.base.failure.is_none() {
            return Ok(Encoded::Empty);
        }
        // `[states, failure]`, as rmp_serde writes a ComponentEntry.
        let mut out = Vec::with_capacity(stored.own_len() + 64);
        out.push(0x92);
        pieces.write(&mut out, bytes, ledger)?;
        rmp_serde::encode::write(&mut out, &self.base.failure)?;
        Ok(Encoded::Whole(out))
    }

    fn upsert(&mut self, entry: StateEntry) {
        self.seq += 1;
        self.upserts.push((self.seq, entry));
    }

    fn remove(&mut self, path: &[u8]) {
        self.seq += 1;
        self.removes.insert(path.to_vec(), self.seq);
    }

    fn materialize(&mut self, ledger: &Ledger) -> Result<()> {
        self.deepen(ledger)?;
        self.copy_out();
        self.apply_edits();
        Ok(())
    }

    /// Applies the recorded upserts and removals to `base.states`.
    fn apply_edits(&mut self) {
        if self.upserts.is_empty() && self.removes.is_empty() {
            return;
        }
        let latest = self.latest_upserts();
        let removes = std::mem::take(&mut self.removes);
        let old = std::mem::take(&mut self.base.states);
        let mut merged = Vec::with_capacity(old.len() + latest.len());
        let mut new = latest.into_iter().peekable();
        for s in old {
            while let Some(n) = new.next_if(|n| n.path.as_slice() < s.path.as_slice()) {
                merged.push(n);
            }
            if new.peek().is_some_and(|n| n.path == s.path) {
                continue;
            }
            if !removes.contains_key(s.path.as_slice()) {
                merged.push(s);
            }
        }
        merged.extend(new);
        self.base.states = merged;
    }
}

/// Paths a component comes to hold: (component, paths).
type IndexRun = (Vec<u8>, Vec<Arc<[u8]>>);

struct BatchBuilder<'a> {
    ledger: &'a Ledger,
    entries: HashMap<Vec<u8>, EntryEdit>,
    /// Owner index additions, applied once the batch is written: runs of
    /// paths a component comes to hold, in the order of the ops.
    index_adds: Vec<IndexRun>,
    /// Owner index removals, (path, component), applied before additions.
    index_removes: Vec<(Vec<u8>, Vec<u8>)>,
    /// Intent batches to forget once the batch is durable.
    forget_intents: Vec<u64>,
    /// `d` keys (container, component) to make sure exist.
    containers: HashSet<Vec<u8>>,
    children: HashMap<Vec<u8>, Vec<StableKey>>,
    /// Children to drop from each parent's list, applied once at the end.
    child_removals: HashMap<Vec<u8>, HashSet<StableKey>>,
    /// Whole entries already encoded by their component, stored as given.
    raw_puts: HashMap<Vec<u8>, Vec<u8>>,
    /// Keys written or removed, and bytes written, for metrics.
    keys: u64,
    bytes: u64,
    batch: sled::Batch,
    /// Writes to the tree of large values, and whether there are any.
    large: sled::Batch,
    large_used: bool,
}

impl BatchBuilder<'_> {
    fn edit(&mut self, component: &[u8]) -> Result<&mut EntryEdit> {
        if !self.entries.contains_key(component) {
            let edit = match self.raw_puts.remove(component) {
                Some(raw) => {
                    let given = StoredEntry::parse(self.ledger, sled::IVec::from(raw), None)?;
                    EntryEdit::read(given, false)
                }
                None => match self.ledger.stored_bytes(component)? {
                    Some((own, delta)) => {
                        match ShallowEntry::read(self.ledger, own.clone(), delta.clone())? {
                            Some(shallow) => EntryEdit::read_shallow(shallow),
                            None => {
                                EntryEdit::read(StoredEntry::parse(self.ledger, own, delta)?, true)
                            }
                        }
                    }
                    None => EntryEdit::new(ComponentEntry::default()),
                },
            };
            self.entries.insert(component.to_vec(), edit);
        }
        self.entries
            .get_mut(component)
            .ok_or_else(|| Error::Shutdown("ledger entry vanished".into()))
    }

    /// Whether the component's entry already holds exactly what `intent`
    /// says, committed: the record as its only one (or, for a delete, no
    /// state at all), not possibly missing, under the same generations.
    /// Then the action was applied and its commit landed, and folding the
    /// intent would only make the next run redo it. (An intent that equals
    /// the committed state is never written for an action still to apply:
    /// such an action needs none.)
    ///
    /// The intent names the component that held the state when the action
    /// was planned; a state that moved is committed in its new owner, so the
    /// other components the owner index names are looked at too.
    fn already_committed(&mut self, intent: &Intent) -> Result<bool> {
        let mut holders: Vec<Arc<[u8]>> = vec![Arc::from(intent.component.as_slice())];
        holders.extend(self.ledger.owner_candidates(&intent.path));
        for holder in holders {
            let entry = self.entry(&holder)?;
            let Ok(i) = entry.find(&intent.path) else {
                continue;
            };
            // Held: a delete did not land; a write landed if the state holds
            // exactly its record.
            let Some(record) = &intent.record else {
                return Ok(false);
            };
            return Ok(entry.states.get(i).is_some_and(|s| {
                !s.may_be_missing
                    && s.records.len() == 1
                    && s.records.first() == Some(record)
                    && s.gen == intent.gen
                    && (intent.child_gen.is_none() || s.child_gen == intent.child_gen)
            }));
        }
        // Held by no one: a delete landed; a write did not.
        Ok(intent.record.is_none())
    }

    /// The component's entry with every recorded edit applied.
    fn entry(&mut self, component: &[u8]) -> Result<&mut ComponentEntry> {
        let ledger = self.ledger;
        let edit = self.edit(component)?;
        edit.materialize(ledger)?;
        Ok(&mut edit.base)
    }

    /// A component's child list as this batch leaves it.
    fn children_of(&mut self, component: &[u8]) -> Result<&Vec<StableKey>> {
        if !self.children.contains_key(component) {
            let list = self.ledger.children(component)?;
            self.children.insert(component.to_vec(), list);
        }
        self.children
            .get(component)
            .ok_or_else(|| Error::Shutdown("ledger child list vanished".into()))
    }

    fn put(&mut self, k: Vec<u8>, v: Vec<u8>) {
        self.keys += 1;
        self.bytes += (k.len() + v.len()) as u64;
        self.batch.insert(k, v);
    }

    /// Writes a component's own value: to the tree of large values when it
    /// is large (deleting its key in the first tree, which may hold a
    /// smaller value or a tombstone), else to the first tree (deleting
    /// its key in the other when `was_large`).
    fn put_own(&mut self, component: &[u8], value: Vec<u8>, was_large: bool) {
        let k = key(P_COMPONENT, component);
        if value.len() >= delta::MIN_OWN {
            // Counted as a key written here, and one removed by `del`.
            self.keys += 1;
            self.bytes += (k.len() + value.len()) as u64;
            self.del(k.clone());
            self.large.insert(k, value);
            self.large_used = true;
        } else {
            if was_large {
                self.keys += 1;
                self.large.remove(k.clone());
                self.large_used = true;
            }
            self.put(k, value);
        }
    }

    fn del(&mut self, k: impl Into<sled::IVec>) {
        self.keys += 1;
        self.batch.remove(k);
    }

    fn index_add(&mut self, component: &[u8], path: &[u8]) {
        let path = Arc::from(path);
        match self.index_adds.last_mut() {
            Some((last, paths)) if last.as_slice() == component => paths.push(path),
            _ => self.index_adds.push((component.to_vec(), vec![path])),
        }
    }

    fn note_container(&mut self, container: Option<&[u8]>, component: &[u8]) {
        if let Some(c) = container {
            self.containers.insert(container_key(c, component));
        }
    }

    fn op(&mut self, op: LedgerOp) -> Result<()> {
        match op {
            LedgerOp::Put {
                component,
                entry,
                index_owner,
                container,
            } => {
                if index_owner {
                    self.index_add(&component, &entry.path);
                }
                self.note_container(container.as_deref(), &component);
                self.edit(&component)?.upsert(entry);
            }
            LedgerOp::PutEntry {
                component,
                encoded,
                indexed,
                containers,
            } => {
                self.index_adds.push((component.clone(), indexed));
                for c in containers {
                    self.note_container(Some(&c), &component);
                }
                if self.entries.contains_key(&component) {
                    // Edited earlier in this batch: merge instead.
                    let entry: ComponentEntry =
                        self.ledger.decode(&encoded, "a component entry")?;
                    let edit = self.edit(&component)?;
                    for s in entry.states {
                        edit.upsert(s);
                    }
                } else {
                    self.raw_puts.insert(component, encoded);
                }
            }
            LedgerOp::Remove { component, path } => {
                self.edit(&component)?.remove(&path);
                self.index_removes.push((path, component));
            }
            LedgerOp::Recover(intent) => {
                if !self.already_committed(&intent)? {
                    self.op(LedgerOp::Fold(intent))?;
                }
            }
            LedgerOp::Fold(intent) => {
                // The component's states may now differ from what its memo
                // key stands for: it must run again.
                self.del(key(P_MEMO, &intent.component));
                self.note_container(
                    intent.container.as_ref().map(|c| c.as_slice()),
                    &intent.component,
                );
                let entry = self.entry(&intent.component)?;
                match entry.find(&intent.path) {
                    Ok(i) => {
                        let s = &mut entry.states[i];
                        if let Some(r) = &intent.record {
                            if !s.records.contains(r) {
                                s.records.push(r.clone());
                            }
                        }
                        s.may_be_missing = true;
                        // The record may have been written under the newer
                        // parent generation: never let it fall below a floor.
                        s.gen = s.gen.max(intent.gen);
                        if let Some(cg) = intent.child_gen {
                            // The container change may or may not have
                            // happened: children may be missing (a lossy
                            // bump), but their records are kept.
                            let old = s.child_gen.unwrap_or_default();
                            s.child_gen = Some(crate::model::provider::ChildGeneration {
                                current: old.current.max(cg.current),
                                destructive_floor: old.destructive_floor,
                            });
                        }
                    }
                    Err(i) => {
                        entry.states.insert(
                            i,
                            StateEntry {
                                path: intent.path.clone(),
                                records: intent.record.iter().cloned().collect(),
                                may_be_missing: true,
                                gen: intent.gen,
                                child_gen: intent.child_gen,
                            },
                        );
                        self.index_add(&intent.component, &intent.path);
                    }
                }
            }
            LedgerOp::DropDescendants { path } => {
                let path = path.as_slice();
                let mut holders: Vec<Vec<u8>> = Vec::new();
                // The container itself, or one below it (a byte prefix can
                // also be another key: see `keycode::is_below`).
                let at_or_below = |rest: &[u8]| {
                    split_container_key(rest).is_some_and(|(container, _)| {
                        container == path || keycode::is_below(container, path)
                    })
                };
                for item in self.ledger.tree.scan_prefix(key(P_CONTAINER, path)) {
                    let (k, _) = item?;
                    let rest = k.get(1..).unwrap_or_default();
                    if !at_or_below(rest) {
                        continue;
                    }
                    if let Some((_, component)) = split_container_key(rest) {
                        holders.push(component.to_vec());
                    }
                    self.del(k);
                }
                let pending: Vec<Vec<u8>> = self
                    .containers
                    .iter()
                    .filter(|k| k.get(1..).is_some_and(at_or_below))
                    .cloned()
                    .collect();
                for k in pending {
                    if let Some((_, component)) = k.get(1..).and_then(split_container_key) {
                        holders.push(component.to_vec());
                    }
                    self.containers.remove(&k);
                }
                holders.sort();
                holders.dedup();
                for component in holders {
                    let entry = self.entry(&component)?;
                    let mut gone = Vec::new();
                    entry.states.retain(|s| {
                        let below = keycode::is_below(&s.path, path);
                        if below {
                            gone.push(s.path.to_vec());
                        }
                        !below
                    });
                    for p in gone {
                        self.index_removes.push((p, component.clone()));
                    }
                }
            }
            LedgerOp::AddChildren {
                component,
                children,
            } => {
                self.children_of(&component)?;
                if let Some(list) = self.children.get_mut(&component) {
                    let known: HashSet<StableKey> = list.iter().cloned().collect();
                    list.extend(children.into_iter().filter(|k| !known.contains(k)));
                }
            }
            LedgerOp::SetFailure { component, failure } => {
                if failure.is_some() {
                    // A failed component is never memoized.
                    self.del(key(P_MEMO, &component));
                }
                self.edit(&component)?.base.failure = failure;
            }
            LedgerOp::SetMemo { component, memo } => {
                let k = key(P_MEMO, &component);
                match memo {
                    Some(m) => self.put(k, m),
                    None => self.del(k),
                }
            }
            LedgerOp::RemoveComponent { component, parent } => {
                let entry = self.entry(&component)?;
                if !entry.states.is_empty() {
                    return Ok(());
                }
                self.children_of(&component)?;
                let pending = self.child_removals.get(&component);
                let left = self.children.get(&component).is_some_and(|list| {
                    list.iter().any(|k| !pending.is_some_and(|p| p.contains(k)))
                });
                if left {
                    return Ok(());
                }
                self.edit(&component)?.base.failure = None;
                self.del(key(P_MEMO, &component));
                self.children.insert(component.clone(), Vec::new());
                self.child_removals.remove(&component);
                if let Some((parent, key)) = parent {
                    self.children_of(&parent)?;
                    self.child_removals.entry(parent).or_default().insert(key);
                }
            }
            LedgerOp::DeleteIntents { id } => self.forget_intents.push(id),
        }
        Ok(())
    }

    fn finish(mut self) -> Result<()> {
        for (parent, gone) in std::mem::take(&mut self.child_removals) {
            if let Some(list) = self.children.get_mut(&parent) {
                list.retain(|k| !gone.contains(k));
            }
        }
        // New components' entries: packed together when there are enough.
        let raw: Vec<(Vec<u8>, Vec<u8>)> = std::mem::take(&mut self.raw_puts).into_iter().collect();
        let mut new_pack: Option<(u64, Vec<Vec<u8>>)> = None;
        // Components whose delta this batch writes (true) or deletes.
        let mut delta_changes: Vec<(Vec<u8>, bool)> = Vec::new();
        {
            // An entry given whole replaces any delta (none is expected:
            // only a component without an entry gives its entry whole).
            let deltas = self.ledger.deltas();
            for (component, _) in &raw {
                if deltas.contains(component) {
                    delta_changes.push((component.clone(), false));
                }
            }
        }
        for (component, _) in &delta_changes {
            self.del(key(P_DELTA, component));
        }
        // Large new entries are not packed: they go to their own tree.
        let (large, mut raw): (Vec<_>, Vec<_>) = raw
            .into_iter()
            .partition(|(_, v)| v.len() >= delta::MIN_OWN);
        for (component, value) in large {
            self.put_own(&component, value, false);
        }
        if raw.len() >= PACK_MIN {
            raw.sort_by(|a, b| a.0.cmp(&b.0));
            let id = {
                let mut packs = self.ledger.packs_mut();
                let id = packs.next_id;
                packs.next_id += 1;
                id
            };
            self.put(key(P_PACK, &id.to_be_bytes()), pack::encode(&raw));
            new_pack = Some((id, raw.into_iter().map(|(c, _)| c).collect()));
        } else {
            for (component, value) in raw {
                self.put_own(&component, value, false);
            }
        }
        // Edited entries get keys of their own (a packed one moves out of
        // its pack), or a delta beside it; a deleted one leaves a tombstone,
        // so that no pack that still holds an old copy brings it back.
        let mut entries = std::mem::take(&mut self.entries);
        let next_id = match self.ledger.packs.read() {
            Ok(g) => g.next_id,
            Err(p) => p.into_inner().next_id,
        };
        let mut unpacked: Vec<Vec<u8>> = Vec::new();
        for (component, edit) in entries.iter_mut() {
            let packed = self.ledger.pack_of(component).is_some();
            if packed {
                unpacked.push(component.clone());
            }
            let was_large = edit.own_len >= delta::MIN_OWN;
            let whole = match edit.encoded(self.ledger, !packed)? {
                Encoded::Whole(encoded) => Some(encoded),
                Encoded::Empty => Some(pack::tombstone(next_id)),
                Encoded::Delta(delta) => {
                    self.put(key(P_DELTA, component), delta);
                    if !edit.had_delta {
                        delta_changes.push((component.clone(), true));
                    }
                    None
                }
            };
            if let Some(value) = whole {
                self.put_own(component, value, was_large);
                if edit.had_delta {
                    self.del(key(P_DELTA, component));
                    delta_changes.push((component.clone(), false));
                }
            }
        }
        // Packs left without a live member are deleted.
        let emptied: Vec<u64> = {
            let packs = match self.ledger.packs.read() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            let mut leaving: HashMap<u64, usize> = HashMap::new();
            for c in &unpacked {
                if let Some(id) = packs.members.get(c) {
                    *leaving.entry(*id).or_default() += 1;
                }
            }
            leaving
                .into_iter()
                .filter(|(id, n)| packs.live.get(id).is_none_or(|live| live <= n))
                .map(|(id, _)| id)
                .collect()
        };
        for id in &emptied {
            self.del(key(P_PACK, &id.to_be_bytes()));
        }
        let children = std::mem::take(&mut self.children);
        for (component, children) in &children {
            let k = key(P_CHILDREN, component);
            if children.is_empty() {
                self.del(k);
            } else {
                self.put(k, encode(children)?);
            }
        }
        let containers = std::mem::take(&mut self.containers);
        for k in containers {
            if !self.ledger.tree.contains_key(&k)? {
                self.put(k, Vec::new());
            }
        }
        // Count the commit in the batch; the count in memory moves only once
        // the batch is applied, so `weir.seq` never leads the store.
        let seq = self.ledger.seq.load(std::sync::atomic::Ordering::SeqCst) + 1;
        self.batch.insert(SEQ_KEY, &seq.to_be_bytes());
        let ledger = self.ledger;
        {
            // Readers of entries wait, so that none reads an entry from
            // before this batch with a delta from after it, or the reverse.
            let mut deltas = ledger.deltas_mut();
            if self.large_used {
                use sled::Transactional;
                let (first, large) = (&self.batch, &self.large);
                (&*ledger.tree, &ledger.entries)
                    .transaction(|(tree, entries)| {
                        tree.apply_batch(first)?;
                        entries.apply_batch(large)?;
                        Ok(())
                    })
                    .map_err(|e: sled::transaction::TransactionError<()>| match e {
                        sled::transaction::TransactionError::Storage(e) => Error::from(e),
                        sled::transaction::TransactionError::Abort(()) => {
                            Error::msg("a ledger commit was aborted")
                        }
                    })?;
            } else {
                ledger.tree.apply_batch(self.batch)?;
            }
            for (component, has) in delta_changes {
                if has {
                    deltas.insert(component);
                } else {
                    deltas.remove(&component);
                }
            }
        }
        self.ledger
            .seq
            .store(seq, std::sync::atomic::Ordering::SeqCst);
        // Forgotten at the flush that makes this batch durable.
        self.ledger.journal()?.forget_later(&self.forget_intents);
        metrics::counter!(crate::metrics::LEDGER_RECORDS).increment(self.keys);
        metrics::counter!(crate::metrics::LEDGER_WRITTEN_BYTES).increment(self.bytes);
        {
            let mut packs = self.ledger.packs_mut();
            for c in &unpacked {
                packs.unpack(c);
            }
            if let Some((id, members)) = new_pack {
                packs.live.insert(id, members.len());
                for c in members {
                    packs.members.insert(c, id);
                }
            }
        }
        let mut index = self.ledger.index_mut();
        for (path, component) in &self.index_removes {
            index.remove(path, component);
        }
        for (component, paths) in &self.index_adds {
            index.add_all(component, paths);
        }
        Ok(())
    }
}

fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    Ok(rmp_serde::to_vec(value)?)
}

/// Converts raw bytes into the ledger's byte-buffer type.
pub(crate) fn buf(bytes: &[u8]) -> ByteBuf {
    ByteBuf::from(bytes.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::provider::ChildGeneration;

    fn state(path: &str, record: &str) -> StateEntry {
        StateEntry {
            path: buf(path.as_bytes()),
            records: vec![buf(record.as_bytes())],
            ..StateEntry::default()
        }
    }

    fn paths(e: &ComponentEntry) -> Vec<String> {
        e.states
            .iter()
            .map(|s| String::from_utf8_lossy(&s.path).into_owned())
            .collect()
    }

    #[test]
    fn entry_edits_merge_upserts_and_removals_in_order() {
        let base = ComponentEntry {
            states: vec![state("b", "1"), state("d", "1"), state("f", "1")],
            failure: None,
        };
        let mut edit = EntryEdit::new(base);
        edit.upsert(state("a", "2"));
        edit.upsert(state("d", "2"));
        edit.remove(b"f");
        edit.upsert(state("g", "2"));
        edit.remove(b"g");
        edit.remove(b"b");
        edit.upsert(state("b", "3"));
        edit.apply_edits();
        assert_eq!(paths(&edit.base), vec!["a", "b", "d"]);
        let d = &edit.base.states[2];
        assert_eq!(d.records, vec![buf(b"2")]);
        assert_eq!(edit.base.states[1].records, vec![buf(b"3")]);
    }

    /// An edited entry's whole encoding (`None`: empty).
    type Whole = Option<Vec<u8>>;

    /// The edit of `base` as if read from the store.
    fn as_stored(ledger: &Ledger, base: &ComponentEntry) -> Result<EntryEdit> {
        let stored = StoredEntry::parse(ledger, sled::IVec::from(encode(base)?), None)?;
        Ok(EntryEdit::read(stored, true))
    }

    /// The whole encoding of an edited entry.
    fn whole(ledger: &Ledger, edit: &mut EntryEdit) -> Result<Whole> {
        match edit.encoded(ledger, false)? {
            Encoded::Whole(v) => Ok(Some(v)),
            Encoded::Empty => Ok(None),
            Encoded::Delta(_) => Err(Error::msg("a delta where none may be written")),
        }
    }

    /// The same edits on an entry kept as stored and on one decoded.
    fn edit_both(
        ledger: &Ledger,
        base: &ComponentEntry,
        edits: impl Fn(&mut EntryEdit),
    ) -> Result<(Whole, Whole)> {
        let mut stored = as_stored(ledger, base)?;
        assert!(stored.stored.is_some(), "an entry weir wrote scans");
        let mut owned = EntryEdit::new(base.clone());
        edits(&mut stored);
        edits(&mut owned);
        Ok((whole(ledger, &mut stored)?, whole(ledger, &mut owned)?))
    }

    #[test]
    fn an_entry_edited_as_stored_encodes_to_the_bytes_of_the_decoded_one() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        let mut container = state("c", "1");
        container.child_gen = Some(ChildGeneration {
            current: 3,
            destructive_floor: 1,
        });
        container.records.push(buf(b"old"));
        container.may_be_missing = true;
        let mut states = vec![state("a", "1"), state("b", "1"), container, state("d", "1")];
        // Enough states for a 16-bit array length.
        states.extend((0..40).map(|i| state(&format!("m{i:03}"), "1")));
        for failure in [None, Some("it broke".to_string())] {
            let base = ComponentEntry {
                states: states.clone(),
                failure: failure.clone(),
            };
            let (stored, owned) = edit_both(&ledger, &base, |e| {
                e.upsert(state("b", "2"));
                e.upsert(state("bb", "2"));
                e.remove(b"d");
                e.upsert(state("e", "2"));
                e.remove(b"e");
                e.remove(b"a");
                e.upsert(state("a", "3"));
                e.upsert(state("z", "1"));
                e.upsert(state("z", "2"));
                e.remove(b"m005");
            })?;
            assert!(stored.is_some());
            assert_eq!(stored, owned);
            // Untouched, and with every state removed.
            let (stored, owned) = edit_both(&ledger, &base, |_| {})?;
            assert_eq!(stored, owned);
            assert_eq!(stored, Some(encode(&base)?));
            let (stored, owned) = edit_both(&ledger, &base, |e| {
                for s in &states {
                    e.remove(&s.path);
                }
            })?;
            assert_eq!(stored, owned);
            assert_eq!(stored.is_none(), failure.is_none());
        }
        Ok(())
    }

    #[test]
    fn a_stored_state_outside_its_entrys_bytes_is_refused_as_corrupt_not_dropped() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        let base = ComponentEntry {
            states: vec![state("a", "1"), state("b", "1")],
            failure: None,
        };
        let mut edit = as_stored(&ledger, &base)?;
        let Some(last) = edit.stored.as_mut().and_then(|s| s.states.last_mut()) else {
            return Err(Error::msg("the entry did not scan"));
        };
        last.whole = last.whole.start..last.whole.end + 100;
        edit.upsert(state("c", "1"));
        match whole(&ledger, &mut edit) {
            Err(Error::LedgerCorrupt { detail, .. }) => {
                assert!(detail.contains("outside"), "{detail}");
                Ok(())
            }
            other => Err(Error::msg(format!(
                "expected a corrupt ledger, got {other:?}"
            ))),
        }
    }

    fn fresh(component: &str, path: &str) -> LedgerOp {
        let entry = ComponentEntry {
            states: vec![state(path, "r")],
            failure: None,
        };
        LedgerOp::PutEntry {
            component: component.as_bytes().to_vec(),
            encoded: rmp_serde::to_vec(&entry).unwrap_or_default(),
            indexed: vec![Arc::from(path.as_bytes())],
            containers: Vec::new(),
        }
    }

    fn has(ledger: &Ledger, component: &str) -> bool {
        ledger
            .component(component.as_bytes())
            .ok()
            .flatten()
            .is_some_and(|e| !e.states.is_empty())
    }

    fn remove(component: &str, path: &str) -> LedgerOp {
        LedgerOp::Remove {
            component: component.as_bytes().to_vec(),
            path: path.as_bytes().to_vec(),
        }
    }

    fn recovered(component: &str, path: &str, record: Option<&str>) -> LedgerOp {
        LedgerOp::Recover(intent(component, path, record))
    }

    fn intent(component: &str, path: &str, record: Option<&str>) -> Intent {
        Intent {
            component: buf(component.as_bytes()),
            path: buf(path.as_bytes()),
            record: record.map(|r| buf(r.as_bytes())),
            gen: 0,
            child_gen: None,
            container: None,
        }
    }

    /// The ledger in `dir` opened again after `first` ran on it, then was
    /// dropped without any other clean-up.
    fn reopened(dir: &Path, first: impl FnOnce(&Ledger) -> Result<()>) -> Result<Ledger> {
        first(&Ledger::open(dir, 1 << 20)?)?;
        Ledger::open(dir, 1 << 20)
    }

    /// The length of the intent journal in `dir`.
    fn journal_len(dir: &Path) -> Result<u64> {
        Ok(std::fs::metadata(dir.join(journal::JOURNAL_FILE))?.len())
    }

    fn state_of(ledger: &Ledger, component: &str, path: &str) -> Option<StateEntry> {
        ledger
            .component(component.as_bytes())
            .ok()
            .flatten()
            .and_then(|e| {
                e.states
                    .into_iter()
                    .find(|s| s.path.as_slice() == path.as_bytes())
            })
    }

    #[test]
    fn an_intent_whose_commit_landed_is_not_folded_back() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        // Committed: c holds p with record r; q was deleted.
        ledger.apply(vec![fresh("c", "p")])?;
        ledger.apply(vec![
            recovered("c", "p", Some("r")),
            recovered("c", "q", None),
        ])?;
        let p = state_of(&ledger, "c", "p");
        assert!(p.as_ref().is_some_and(|s| !s.may_be_missing), "{p:?}");
        assert!(
            state_of(&ledger, "c", "q").is_none(),
            "no phantom for a committed delete"
        );
        Ok(())
    }

    #[test]
    fn intents_left_in_the_journal_by_a_crash_are_folded_when_the_ledger_opens() -> Result<()> {
        let dir = tempfile::tempdir()?;
        // Dropped without deleting its intents: as after a crash.
        let ledger = reopened(dir.path(), |ledger| {
            ledger.put_intents(1, &[intent("c", "p", Some("r"))])?;
            ledger.sync_intents()
        })?;
        let p = state_of(&ledger, "c", "p");
        assert!(
            p.as_ref()
                .is_some_and(|s| s.may_be_missing && s.records == vec![buf(b"r")]),
            "{p:?}"
        );
        assert_eq!(journal_len(dir.path())?, 0, "emptied once folded");
        Ok(())
    }

    #[test]
    fn intents_an_earlier_build_kept_in_the_store_are_folded_and_deleted() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let ledger = reopened(dir.path(), |ledger| {
            let batch = vec![intent("c", "p", Some("r"))];
            ledger
                .tree
                .insert(key(P_INTENT, &7u64.to_be_bytes()), encode(&batch)?)?;
            ledger.tree.flush()?;
            Ok(())
        })?;
        assert!(state_of(&ledger, "c", "p").is_some_and(|s| s.may_be_missing));
        assert_eq!(ledger.tree.scan_prefix([P_INTENT]).count(), 0);
        Ok(())
    }

    #[test]
    fn a_runs_intents_are_forgotten_only_at_the_flush_after_their_deletion() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        ledger.put_intents(1, &[intent("c", "p", Some("r"))])?;
        ledger.sync_intents()?;
        assert!(journal_len(dir.path())? > 0);
        ledger.apply(vec![LedgerOp::DeleteIntents { id: 1 }])?;
        assert!(
            journal_len(dir.path())? > 0,
            "kept until the deleting commit is durable"
        );
        ledger.flush()?;
        assert_eq!(journal_len(dir.path())?, 0);
        Ok(())
    }

    fn set_memo(component: &str, memo: &str) -> LedgerOp {
        LedgerOp::SetMemo {
            component: component.as_bytes().to_vec(),
            memo: Some(memo.as_bytes().to_vec()),
        }
    }

    #[test]
    fn a_folded_intent_forgets_the_memo_of_its_component_and_a_committed_one_keeps_it() -> Result<()>
    {
        let dir = tempfile::tempdir()?;
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        ledger.apply(vec![
            fresh("a", "p"),
            fresh("b", "q"),
            set_memo("a", "m1"),
            set_memo("b", "m2"),
        ])?;
        ledger.apply(vec![
            recovered("a", "p", Some("r")),
            recovered("b", "q", Some("changed")),
        ])?;
        assert!(ledger.memo(b"a")?.is_some(), "a's intent had committed");
        assert!(ledger.memo(b"b")?.is_none(), "b may differ from its memo");
        // A failure forgets the memo too.
        ledger.apply(vec![LedgerOp::SetFailure {
            component: b"a".to_vec(),
            failure: Some("boom".into()),
        }])?;
        assert!(ledger.memo(b"a")?.is_none());
        Ok(())
    }

    #[test]
    fn an_intent_for_a_state_that_moved_and_committed_in_its_new_owner_is_not_folded_back(
    ) -> Result<()> {
        let dir = tempfile::tempdir()?;
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        // p moved from a to b, and b's commit landed (p committed as "r").
        ledger.apply(vec![fresh("b", "p")])?;
        ledger.apply(vec![recovered("a", "p", Some("r"))])?;
        assert!(
            state_of(&ledger, "a", "p").is_none(),
            "a does not get p back"
        );
        let p = state_of(&ledger, "b", "p");
        assert!(p.as_ref().is_some_and(|s| !s.may_be_missing), "{p:?}");
        Ok(())
    }

    #[test]
    fn an_intent_whose_commit_did_not_land_is_folded_as_a_possible_record() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        ledger.apply(vec![fresh("c", "p")])?;
        // An update to r2, a delete of p's sibling that exists, a create.
        ledger.apply(vec![
            recovered("c", "p", Some("r2")),
            recovered("c", "new", Some("n")),
        ])?;
        let p = state_of(&ledger, "c", "p").ok_or_else(|| Error::msg("p is kept"))?;
        assert!(p.may_be_missing);
        assert_eq!(p.records.len(), 2);
        let created = state_of(&ledger, "c", "new")
            .ok_or_else(|| Error::msg("the attempted create is tracked"))?;
        assert!(created.may_be_missing);
        ledger.apply(vec![recovered("c", "p", None)])?;
        let p = state_of(&ledger, "c", "p")
            .ok_or_else(|| Error::msg("an attempted delete keeps the state"))?;
        assert!(p.may_be_missing);
        Ok(())
    }

    /// Opens a ledger in `dir`, commits `n` batches, flushes and closes it.
    fn commit_batches(dir: &Path, n: usize) -> Result<()> {
        let ledger = Ledger::open(dir, 1 << 20)?;
        for i in 0..n {
            ledger.apply(vec![fresh(&format!("c{i}"), &format!("p{i}"))])?;
            ledger.flush()?;
        }
        Ok(())
    }

    fn refusal(dir: &Path) -> String {
        match Ledger::open(dir, 1 << 20) {
            Ok(_) => "opened".to_string(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn every_commit_is_counted_and_a_reopened_ledger_keeps_counting() -> Result<()> {
        let dir = tempfile::tempdir()?;
        commit_batches(dir.path(), 3)?;
        assert_eq!(
            std::fs::read_to_string(dir.path().join(SEQ_FILE))?.trim(),
            "3"
        );
        commit_batches(dir.path(), 2)?;
        assert_eq!(
            std::fs::read_to_string(dir.path().join(SEQ_FILE))?.trim(),
            "5"
        );
        Ok(())
    }

    #[test]
    fn a_store_that_lost_flushed_commits_is_refused_as_corrupt() -> Result<()> {
        let dir = tempfile::tempdir()?;
        commit_batches(dir.path(), 3)?;
        // As if the store had rolled back to an earlier state.
        std::fs::write(dir.path().join(SEQ_FILE), "9\n")?;
        let err = refusal(dir.path());
        assert!(
            err.contains("is corrupt") && err.contains("lost writes"),
            "{err}"
        );
        Ok(())
    }

    #[test]
    fn an_empty_store_of_a_ledger_that_was_written_is_refused_as_corrupt() -> Result<()> {
        let dir = tempfile::tempdir()?;
        commit_batches(dir.path(), 2)?;
        std::fs::remove_dir_all(dir.path().join("sled"))?;
        let err = refusal(dir.path());
        assert!(err.contains("is corrupt") && err.contains("empty"), "{err}");
        Ok(())
    }

    #[test]
    fn a_ledger_without_a_commit_count_file_opens_and_gets_one() -> Result<()> {
        let dir = tempfile::tempdir()?;
        commit_batches(dir.path(), 2)?;
        // As written by a build before the count existed, or lost in a crash.
        std::fs::remove_file(dir.path().join(SEQ_FILE))?;
        commit_batches(dir.path(), 1)?;
        assert_eq!(
            std::fs::read_to_string(dir.path().join(SEQ_FILE))?.trim(),
            "3"
        );
        Ok(())
    }

    #[test]
    fn a_ledger_of_the_format_before_deltas_opens_with_its_entries_and_is_marked_current(
    ) -> Result<()> {
        let dir = tempfile::tempdir()?;
        let ledger = reopened(dir.path(), |ledger| {
            ledger.apply(vec![fresh("c", "p")])?;
            ledger
                .tree
                .insert(FORMAT_KEY, &FORMAT_WITHOUT_DELTAS.to_be_bytes())?;
            ledger.flush()
        })?;
        assert!(state_of(&ledger, "c", "p").is_some());
        assert_eq!(
            ledger.tree.get(FORMAT_KEY)?.as_deref(),
            Some(&FORMAT_VERSION.to_be_bytes()[..])
        );
        Ok(())
    }

    #[test]
    fn packed_entries_are_read_back_and_survive_reopening() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let ledger = reopened(dir.path(), |ledger| {
            ledger.apply(
                (0..10)
                    .map(|i| fresh(&format!("c{i}"), &format!("p{i}")))
                    .collect(),
            )?;
            assert!(
                ledger.pack_of(b"c3").is_some(),
                "ten new entries are packed"
            );
            assert!(has(ledger, "c3"));
            assert_eq!(ledger.owner_candidates(b"p3").len(), 1);
            ledger.flush()
        })?;
        for i in 0..10 {
            assert!(has(&ledger, &format!("c{i}")), "c{i} after reopening");
        }
        assert_eq!(ledger.counts()?, (10, 10));
        assert_eq!(ledger.owner_candidates(b"p7").len(), 1);
        Ok(())
    }

    #[test]
    fn a_deleted_packed_component_does_not_come_back_and_can_be_created_again() -> Result<()> {
        let dir = tempfile::tempdir()?;
        {
            let ledger = Ledger::open(dir.path(), 1 << 20)?;
            ledger.apply(
                (0..5)
                    .map(|i| fresh(&format!("c{i}"), &format!("p{i}")))
                    .collect(),
            )?;
            // c1 is rewritten (moves out of the pack), then deleted.
            ledger.apply(vec![LedgerOp::Put {
                component: b"c1".to_vec(),
                entry: state("p1", "r2"),
                index_owner: false,
                container: None,
            }])?;
            ledger.apply(vec![remove("c1", "p1")])?;
            // c2 is deleted straight out of the pack.
            ledger.apply(vec![remove("c2", "p2")])?;
            assert!(!has(&ledger, "c1") && !has(&ledger, "c2"));
            ledger.flush()?;
        }
        {
            let ledger = Ledger::open(dir.path(), 1 << 20)?;
            assert!(!has(&ledger, "c1"), "c1 came back from its pack");
            assert!(!has(&ledger, "c2"), "c2 came back from its pack");
            assert!(has(&ledger, "c0") && has(&ledger, "c4"));
            // c2 is created again in a newer pack.
            ledger.apply(
                ["c2", "x1", "x2", "x3"]
                    .iter()
                    .map(|c| fresh(c, &format!("q{c}")))
                    .collect(),
            )?;
            assert!(has(&ledger, "c2"));
            ledger.flush()?;
        }
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        assert!(
            has(&ledger, "c2"),
            "a newer pack wins over an older tombstone"
        );
        assert!(!has(&ledger, "c1"));
        Ok(())
    }

    #[test]
    fn packs_without_live_members_and_useless_tombstones_are_collected() -> Result<()> {
        let dir = tempfile::tempdir()?;
        {
            let ledger = Ledger::open(dir.path(), 1 << 20)?;
            ledger.apply(
                (0..4)
                    .map(|i| fresh(&format!("c{i}"), &format!("p{i}")))
                    .collect(),
            )?;
            ledger.apply(
                (0..4)
                    .map(|i| remove(&format!("c{i}"), &format!("p{i}")))
                    .collect(),
            )?;
            ledger.flush()?;
        }
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        assert_eq!(
            ledger.tree.scan_prefix([P_PACK]).count(),
            0,
            "the empty pack is gone"
        );
        assert_eq!(
            ledger.tree.scan_prefix([P_COMPONENT]).count(),
            0,
            "tombstones that hide nothing are gone"
        );
        Ok(())
    }

    #[test]
    fn a_ledger_reopened_while_sled_still_holds_its_lock_waits_for_it() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        // sled's background work can keep its lock a moment after the
        // ledger is dropped: a clone of the store does the same here.
        let lingering = ledger.tree.clone();
        drop(ledger);
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(lingering);
        });
        let reopened = Ledger::open(dir.path(), 1 << 20);
        let _ = release.join();
        assert!(reopened.is_ok(), "{:?}", reopened.err());
        Ok(())
    }

    #[test]
    fn container_keys_split_back_into_container_and_component() {
        let k = container_key(b"container\x00path", b"comp");
        assert_eq!(
            split_container_key(&k[1..]),
            Some((&b"container\x00path"[..], &b"comp"[..]))
        );
        assert_eq!(split_container_key(b"ab"), None);
    }
}
