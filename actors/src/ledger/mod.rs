//! The ledger: what weir created in earlier runs, stored in sled.
//!
//! # Layout
//!
//! One sled tree, so that every commit is one atomic sled batch. Keys start
//! with a byte naming their table:
//!
//! | prefix | key after the prefix            | value                          |
//! |--------|---------------------------------|--------------------------------|
//! | `m`    | `format`                        | the format version, u32 BE     |
//! | `c`    | encoded component path          | [`ComponentEntry`]: its states |
//! | `h`    | encoded component path          | its child component keys       |
//! | `o`    | encoded target-state path       | encoded owning component path  |
//! | `i`    | intent batch id, u64 BE         | `Vec<Intent>`                  |
//!
//! A component's states live in one value, read and written in one go; the
//! owner index (`o`) finds the component that holds a state when another
//! component takes it over, and the states below a deleted container.
//! Intents are the records of actions about to be applied; commit collapses
//! them, and opening a ledger folds leftovers from a crash into the entries
//! as possible records.

pub(crate) mod record;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_bytes::ByteBuf;

use crate::error::{Error, Result};
use crate::model::StableKey;
use record::{ComponentEntry, Intent, LedgerOp, StateEntry};

/// The ledger format this build reads and writes.
pub(crate) const FORMAT_VERSION: u32 = 1;
/// The default sled page cache size: 64 MiB.
pub const DEFAULT_LEDGER_CACHE_BYTES: u64 = 64 * 1024 * 1024;

const P_COMPONENT: u8 = b'c';
const P_CHILDREN: u8 = b'h';
const P_OWNER: u8 = b'o';
const P_INTENT: u8 = b'i';
const FORMAT_KEY: &[u8] = b"mformat";

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
    dir: Arc<str>,
    _lock: Arc<File>,
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
        let db = sled::Config::new()
            .path(&sled_dir)
            .cache_capacity(cache_bytes)
            .flush_every_ms(None)
            .open()
            .map_err(|e| match e {
                sled::Error::Io(io) if io.kind() != std::io::ErrorKind::PermissionDenied => {
                    Error::LedgerCorrupt {
                        path: display.to_string(),
                        detail: format!("sled cannot open it: {io}"),
                    }
                }
                sled::Error::Corruption { .. } | sled::Error::ReportableBug(_) => {
                    Error::LedgerCorrupt {
                        path: display.to_string(),
                        detail: format!("sled cannot open it: {e}"),
                    }
                }
                other => Error::Storage(other),
            })?;
        let ledger = Ledger {
            tree: db,
            dir: display,
            _lock: Arc::new(lock),
        };
        ledger.check_format(existed)?;
        ledger.recover()?;
        Ok(ledger)
    }

    fn check_format(&self, existed: bool) -> Result<()> {
        match self.tree.get(FORMAT_KEY)? {
            Some(v) => {
                let raw: [u8; 4] = v
                    .as_ref()
                    .try_into()
                    .map_err(|_| self.corrupt("format version is not 4 bytes"))?;
                let found = u32::from_be_bytes(raw);
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
            None => {
                self.tree
                    .insert(FORMAT_KEY, &FORMAT_VERSION.to_be_bytes())?;
                self.tree.flush()?;
                Ok(())
            }
        }
    }

    /// Folds intents left by a crash into the component entries.
    fn recover(&self) -> Result<()> {
        let mut ops = Vec::new();
        for item in self.tree.scan_prefix([P_INTENT]) {
            let (k, v) = item?;
            let intents: Vec<Intent> = self.decode(&v, "an intent batch")?;
            ops.extend(intents.into_iter().map(LedgerOp::Fold));
            let raw: [u8; 8] = k
                .get(1..)
                .and_then(|s| s.try_into().ok())
                .ok_or_else(|| self.corrupt("an intent key is malformed"))?;
            ops.push(LedgerOp::DeleteIntents {
                id: u64::from_be_bytes(raw),
            });
        }
        if !ops.is_empty() {
            self.apply(&ops)?;
            self.tree.flush()?;
        }
        Ok(())
    }

    pub(crate) fn dir(&self) -> &str {
        &self.dir
    }

    fn corrupt(&self, detail: impl Into<String>) -> Error {
        Error::LedgerCorrupt {
            path: self.dir.to_string(),
            detail: detail.into(),
        }
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8], what: &str) -> Result<T> {
        rmp_serde::from_slice(bytes).map_err(|e| self.corrupt(format!("cannot decode {what}: {e}")))
    }

    /// The entry of a component, if it has one.
    pub(crate) fn component(&self, component: &[u8]) -> Result<Option<ComponentEntry>> {
        match self.tree.get(key(P_COMPONENT, component))? {
            Some(v) => Ok(Some(self.decode(&v, "a component entry")?)),
            None => Ok(None),
        }
    }

    /// The child components a component mounted in its last successful run.
    pub(crate) fn children(&self, component: &[u8]) -> Result<Vec<StableKey>> {
        match self.tree.get(key(P_CHILDREN, component))? {
            Some(v) => self.decode(&v, "a child list"),
            None => Ok(Vec::new()),
        }
    }

    /// The component that holds a state, if any.
    pub(crate) fn owner(&self, path: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.tree.get(key(P_OWNER, path))?.map(|v| v.to_vec()))
    }

    /// Writes an intent batch.
    pub(crate) fn put_intents(&self, id: u64, intents: &[Intent]) -> Result<()> {
        self.tree.insert(
            key(P_INTENT, &id.to_be_bytes()),
            rmp_serde::to_vec(intents)?,
        )?;
        Ok(())
    }

    /// Makes everything written so far durable.
    pub(crate) fn flush(&self) -> Result<()> {
        self.tree.flush()?;
        Ok(())
    }

    /// The size of the ledger on disk, in bytes.
    pub(crate) fn size_on_disk(&self) -> u64 {
        self.tree.size_on_disk().unwrap_or(0)
    }

    /// Counts what the ledger tracks: (components, states).
    pub(crate) fn counts(&self) -> Result<(u64, u64)> {
        let mut components = 0;
        let mut states = 0;
        for item in self.tree.scan_prefix([P_COMPONENT]) {
            let (_, v) = item?;
            let entry: ComponentEntry = self.decode(&v, "a component entry")?;
            components += 1;
            states += entry.states.len() as u64;
        }
        Ok((components, states))
    }

    /// Applies ops atomically (one sled batch). Does not flush.
    pub(crate) fn apply(&self, ops: &[LedgerOp]) -> Result<()> {
        let mut b = BatchBuilder {
            ledger: self,
            entries: HashMap::new(),
            owners: BTreeMap::new(),
            children: HashMap::new(),
            removed: Vec::new(),
            batch: sled::Batch::default(),
        };
        for op in ops {
            b.op(op)?;
        }
        b.finish()
    }
}

struct BatchBuilder<'a> {
    ledger: &'a Ledger,
    entries: HashMap<Vec<u8>, ComponentEntry>,
    /// Owner index changes: `Some(component)` sets, `None` removes.
    owners: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    children: HashMap<Vec<u8>, Vec<StableKey>>,
    removed: Vec<Vec<u8>>,
    batch: sled::Batch,
}

impl BatchBuilder<'_> {
    fn entry(&mut self, component: &[u8]) -> Result<&mut ComponentEntry> {
        if !self.entries.contains_key(component) {
            let loaded = self.ledger.component(component)?.unwrap_or_default();
            self.entries.insert(component.to_vec(), loaded);
        }
        self.entries
            .get_mut(component)
            .ok_or_else(|| Error::Shutdown("ledger entry vanished".into()))
    }

    fn current_owner(&self, path: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.owners.get(path) {
            Some(o) => Ok(o.clone()),
            None => self.ledger.owner(path),
        }
    }

    fn op(&mut self, op: &LedgerOp) -> Result<()> {
        match op {
            LedgerOp::Put {
                component,
                entry,
                index_owner,
            } => {
                if *index_owner {
                    self.owners
                        .insert(entry.path.to_vec(), Some(component.clone()));
                }
                self.entry(component)?.upsert(entry.clone());
            }
            LedgerOp::Remove {
                component,
                path,
                keep_owner,
            } => {
                self.entry(component)?.remove(path);
                if !keep_owner {
                    self.owners.insert(path.clone(), None);
                }
            }
            LedgerOp::Fold(intent) => {
                let owner_known = self.current_owner(&intent.path)?.is_some();
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
                        s.gen = s.gen.min(intent.gen);
                        if let Some(cg) = intent.child_gen {
                            let old = s.child_gen.unwrap_or_default();
                            s.child_gen = Some(crate::model::provider::ChildGeneration {
                                current: old.current.max(cg.current),
                                destructive_floor: old.destructive_floor.max(cg.destructive_floor),
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
                        if !owner_known {
                            self.owners
                                .insert(intent.path.to_vec(), Some(intent.component.to_vec()));
                        }
                    }
                }
            }
            LedgerOp::DropDescendants { path } => {
                let mut found: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
                for item in self.ledger.tree.scan_prefix(key(P_OWNER, path)) {
                    let (k, v) = item?;
                    let p = k.get(1..).unwrap_or_default();
                    if p != path.as_slice() {
                        found.push((p.to_vec(), v.to_vec()));
                    }
                }
                for (p, o) in self
                    .owners
                    .range(path.clone()..)
                    .take_while(|(p, _)| p.starts_with(path))
                {
                    if p != path {
                        if let Some(o) = o {
                            found.push((p.clone(), o.clone()));
                        }
                    }
                }
                for (p, owner) in found {
                    self.entry(&owner)?.remove(&p);
                    self.owners.insert(p, None);
                }
            }
            LedgerOp::SetChildren {
                component,
                children,
            } => {
                self.children.insert(component.clone(), children.clone());
            }
            LedgerOp::SetFailure { component, failure } => {
                self.entry(component)?.failure = failure.clone();
            }
            LedgerOp::RemoveComponent { component } => {
                self.entry(component)?;
                self.removed.push(component.clone());
            }
            LedgerOp::DeleteIntents { id } => {
                self.batch.remove(key(P_INTENT, &id.to_be_bytes()));
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Result<()> {
        for component in &self.removed {
            if let Some(entry) = self.entries.get_mut(component) {
                if entry.states.is_empty() {
                    entry.failure = None;
                    self.children.insert(component.clone(), Vec::new());
                }
            }
        }
        for (component, entry) in &self.entries {
            let k = key(P_COMPONENT, component);
            if entry.is_empty() {
                self.batch.remove(k);
            } else {
                self.batch.insert(k, encode(entry)?);
            }
        }
        for (component, children) in &self.children {
            let k = key(P_CHILDREN, component);
            if children.is_empty() {
                self.batch.remove(k);
            } else {
                self.batch.insert(k, encode(children)?);
            }
        }
        for (path, owner) in &self.owners {
            let k = key(P_OWNER, path);
            match owner {
                Some(o) => self.batch.insert(k, o.as_slice()),
                None => self.batch.remove(k),
            }
        }
        self.ledger.tree.apply_batch(self.batch)?;
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
