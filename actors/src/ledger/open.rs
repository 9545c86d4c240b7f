//! Opening a ledger: sled's lock, the format and commit-count checks,
//! the in-memory indexes, and the recovery of a crash's intents.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustc_hash::FxHashSet;

use super::index::OwnerIndex;
use super::journal::{Journal, JournalError};
use super::record::{Intent, LedgerOp};
use super::{
    key, pack, Layout, Ledger, ENTRIES_TREE, FORMAT_KEY, FORMAT_OLDEST, FORMAT_VERSION, ID_KEY,
    P_CHILDREN, P_COMPONENT, P_DELTA, P_INTENT, P_PACK, SEQ_FILE, SEQ_KEY, UPGRADE_KEY,
};
use crate::error::{Error, Result};

/// How long opening a ledger waits for sled's own lock.
const SLED_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// How often it tries again meanwhile.
const SLED_LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(20);

/// Whether sled failed to open because its lock is held.
fn is_sled_lock(e: &std::io::Error) -> bool {
    e.to_string().contains("could not acquire lock")
}

/// An i/o error of the ledger at `dir`, naming it: the bare one rarely
/// says which file it is about.
fn named_io(e: std::io::Error, dir: &str) -> Error {
    Error::Io(std::io::Error::new(
        e.kind(),
        format!("the ledger at {dir}: {e}"),
    ))
}

/// A sled error of the ledger at `dir`: an i/o one names the ledger.
fn storage(e: sled::Error, dir: &str) -> Error {
    match e {
        sled::Error::Io(e) => named_io(e, dir),
        other => Error::Storage(other),
    }
}

/// `result`, its i/o and sled errors naming the ledger at `dir`.
fn named<T>(dir: &str, result: Result<T>) -> Result<T> {
    result.map_err(|e| match e {
        Error::Io(e) => named_io(e, dir),
        Error::Storage(e) => storage(e, dir),
        other => other,
    })
}

/// The file whose lock is an App's hold on the ledger.
const LOCK_FILE: &str = "weir.lock";
/// The directory of the sled store.
const STORE_DIR: &str = "sled";

impl Ledger {
    /// Whether `dir` holds a ledger, without creating one: `Ok(true)` when
    /// it holds weir's marks, `Ok(false)` when it holds neither them nor a
    /// store (`sled/`).
    ///
    /// What marks a ledger is `weir.seq`, which weir writes beside the store
    /// of every ledger it opens, before it creates the store; a store
    /// without it (from a build that did not write it) is a ledger when it
    /// holds weir's format version.
    ///
    /// # Errors
    /// A usage error naming the directory when it holds a `sled/` that is
    /// not a weir ledger's.
    pub(crate) fn exists(dir: &Path) -> Result<bool> {
        if dir.join(SEQ_FILE).is_file() {
            // Opening it tells whether its store is whole.
            return Ok(true);
        }
        let sled_dir = dir.join(STORE_DIR);
        if !sled_dir.is_dir() {
            return Ok(false);
        }
        let display = dir.display().to_string();
        if !is_sled_store(&sled_dir) {
            return Err(not_a_ledger(&display, NOT_A_STORE));
        }
        let config = sled::Config::new().path(&sled_dir).cache_capacity(1 << 20);
        match open_sled(&config) {
            Ok(db) if db.contains_key(FORMAT_KEY).unwrap_or(false) => Ok(true),
            Ok(_) => Err(not_a_ledger(&display, NO_FORMAT)),
            Err(SledOpen::Panicked) => Err(not_a_ledger(
                &display,
                "sled panicked while reading its sled/",
            )),
            Err(SledOpen::Locked) => Err(Error::LedgerLocked { path: display }),
            Err(SledOpen::Failed(e)) => Err(not_a_ledger(
                &display,
                &format!("its sled/ cannot be opened ({e}) and it has no {SEQ_FILE}"),
            )),
        }
    }

    /// Opens (or creates) the ledger in `dir`.
    pub(crate) fn open(dir: &Path, cache_bytes: u64) -> Result<Ledger> {
        let opening = Opening::new(dir)?;
        std::fs::create_dir_all(dir).map_err(|e| opening.io(e))?;
        let lock = opening.lock()?;
        if !opening.existed && !opening.marked {
            // A new ledger is marked before its store exists, so that a
            // crash while the store is created leaves a ledger, not a
            // directory weir would refuse.
            write_seq(&dir.join(SEQ_FILE), 0).map_err(|e| opening.io(e))?;
        }
        let (db, lock) = opening.open_store(cache_bytes, lock)?;
        let (journal, pending) = Journal::open(dir).map_err(|e| match e {
            JournalError::Io(e) => opening.io(e),
            JournalError::Corrupt(detail) => opening.corrupt(detail),
        })?;
        let entries = db
            .open_tree(ENTRIES_TREE)
            .map_err(|e| storage(e, &opening.display))?;
        let ledger = Ledger {
            tree: db,
            entries,
            dir: Arc::clone(&opening.display),
            index: Arc::new(RwLock::new(OwnerIndex::default())),
            packs: Arc::new(RwLock::new(pack::PackIndex::default())),
            layout: Arc::new(RwLock::new(Layout::default())),
            seq: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            seq_file: Arc::new(dir.join(SEQ_FILE)),
            journal: Arc::new(std::sync::Mutex::new(journal)),
            digests: Arc::default(),
            memos: Arc::default(),
            lock: Arc::new(std::sync::Mutex::new(Some(lock))),
        };
        ledger.load(opening.existed, pending)?;
        Ok(ledger)
    }

    /// Checks an opened store and loads what lives in memory: the format,
    /// the commit count, the identity, the packs, the layout and the owner
    /// index; then folds the intents a crash left (`pending`, from the
    /// journal), and upgrades a ledger of an earlier format.
    fn load(&self, existed: bool, pending: Vec<Intent>) -> Result<()> {
        let flushed_seq = self.read_seq_file();
        let dir = &*self.dir;
        let format = named(
            dir,
            self.check_format(existed, flushed_seq.is_some_and(|n| n > 0)),
        )?;
        // Its write of `weir.seq` names the ledger already.
        self.check_seq(flushed_seq)?;
        named(dir, self.ensure_id())?;
        let tombstones = named(dir, self.load_layout())?;
        named(dir, self.load_packs(tombstones))?;
        named(dir, self.load_memos())?;
        named(dir, self.build_index())?;
        named(dir, self.recover(pending))?;
        named(dir, self.upgrade(format))?;
        Ok(())
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
        let stored = match self.tree.get(SEQ_KEY).map_err(|e| storage(e, &self.dir))? {
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
    pub(super) fn write_seq_file(&self) -> Result<()> {
        let seq = self.seq.load(std::sync::atomic::Ordering::SeqCst);
        write_seq(&self.seq_file, seq).map_err(|e| named_io(e, &self.dir))
    }

    /// Gives the ledger its identity if it has none yet.
    fn ensure_id(&self) -> Result<()> {
        if self.tree.contains_key(ID_KEY)? {
            return Ok(());
        }
        let id = uuid::Uuid::new_v4().to_string();
        self.tree.insert(ID_KEY, id.as_bytes())?;
        self.tree.flush()?;
        Ok(())
    }

    /// Checks the format version of the store, or marks a new one with
    /// this build's; returns the version to upgrade from (this build's
    /// when there is nothing to upgrade), which
    /// [`upgrade`](Ledger::upgrade) brings to this build's once the ledger
    /// is loaded.
    ///
    /// A ledger of an earlier version is marked with this build's at once,
    /// with the version it had under `UPGRADE_KEY`, before anything is
    /// written to it: from then on, builds that read only the earlier
    /// version refuse it, and a crash before the upgrade ends leaves the
    /// marker that resumes it.
    pub(super) fn check_format(&self, existed: bool, was_written: bool) -> Result<u32> {
        let Some(found) = self.stored_version(FORMAT_KEY)? else {
            if existed && !self.tree.is_empty() {
                return Err(self.corrupt("the format version is missing"));
            }
            if was_written {
                return Err(self.corrupt(format!(
                    "its store is empty or unreadable, but it had been written ({SEQ_FILE} counts commits)"
                )));
            }
            self.tree
                .insert(FORMAT_KEY, &FORMAT_VERSION.to_be_bytes())?;
            self.tree.flush()?;
            return Ok(FORMAT_VERSION);
        };
        if !(FORMAT_OLDEST..=FORMAT_VERSION).contains(&found) {
            return Err(Error::LedgerVersion {
                path: self.dir.to_string(),
                found,
                supported: FORMAT_VERSION,
            });
        }
        if found == FORMAT_VERSION {
            return Ok(self.stored_version(UPGRADE_KEY)?.unwrap_or(FORMAT_VERSION));
        }
        let mut mark = sled::Batch::default();
        mark.insert(FORMAT_KEY, &FORMAT_VERSION.to_be_bytes());
        mark.insert(UPGRADE_KEY, &found.to_be_bytes());
        self.tree.apply_batch(mark)?;
        self.tree.flush()?;
        Ok(found)
    }

    /// A version stored under `key` (u32 BE), if there is one.
    fn stored_version(&self, key: &[u8]) -> Result<Option<u32>> {
        let Some(v) = self.tree.get(key)? else {
            return Ok(None);
        };
        let raw: [u8; 4] = v.as_ref().try_into().map_err(|_| {
            self.corrupt(format!(
                "{} is not 4 bytes",
                String::from_utf8_lossy(key.get(1..).unwrap_or_default())
            ))
        })?;
        Ok(Some(u32::from_be_bytes(raw)))
    }

    /// Finds the live members of every pack (see [`Ledger::read_packs`]);
    /// deletes packs with no live member and tombstones that hide nothing.
    fn load_packs(&self, tombstones: HashMap<Vec<u8>, u64>) -> Result<()> {
        let Packs {
            mut index,
            contained,
            keys,
        } = self.read_packs(&tombstones)?;
        let mut gc = sled::Batch::default();
        let mut dirty = index.collect_dead(keys, &mut gc);
        let mut useless = Vec::new();
        for (component, generation) in tombstones {
            index.next_id = index.next_id.max(generation + 1);
            if !contained.contains(&component) {
                gc.remove(key(P_COMPONENT, &component));
                dirty = true;
                useless.push(component);
            }
        }
        if dirty {
            self.tree.apply_batch(gc)?;
            self.tree.flush()?;
        }
        let mut layout = self.layout_mut();
        for component in &useless {
            layout.own.remove(component);
        }
        *self.packs_mut() = index;
        Ok(())
    }

    /// Reads every pack: its live members are those with no value of their
    /// own (see [`Layout`], loaded first), or only a tombstone older than
    /// the pack (`tombstones`, by component), and no newer pack holding
    /// them (a packed component written again moves to the newest pack).
    fn read_packs(&self, tombstones: &HashMap<Vec<u8>, u64>) -> Result<Packs> {
        let layout = self.layout();
        let hidden = |component: &[u8], id: u64| {
            layout.large.contains(component)
                || (layout.own.contains(component)
                    && tombstones.get(component).is_none_or(|&t| t > id))
        };
        let mut packs = Packs::default();
        // Packs come in ascending id: a member found again is the newer.
        for item in self.tree.scan_prefix([P_PACK]) {
            let (k, v) = item?;
            let raw: [u8; 8] = k
                .get(1..)
                .and_then(|s| s.try_into().ok())
                .ok_or_else(|| self.corrupt("a pack key is malformed"))?;
            let id = u64::from_be_bytes(raw);
            packs.index.next_id = packs.index.next_id.max(id + 1);
            packs.keys.push((id, k));
            for (component, _, _) in pack::records(&v) {
                if !hidden(component, id) {
                    packs.index.add(component.to_vec(), id);
                }
                packs.contained.insert(component.to_vec());
            }
        }
        Ok(packs)
    }

    /// Finds the components whose entries have a delta, those whose
    /// entries are in the tree of large values, those with a child list,
    /// and those with a value of their own in the first tree (see
    /// [`Layout`]). Returns the generations of the tombstones among the
    /// last, by component (see [`pack`]).
    fn load_layout(&self) -> Result<HashMap<Vec<u8>, u64>> {
        let components = |tree: &sled::Tree, prefix: u8| -> Result<FxHashSet<Vec<u8>>> {
            let mut found = FxHashSet::default();
            for k in tree.scan_prefix([prefix]).keys() {
                found.insert(k?.get(1..).unwrap_or_default().to_vec());
            }
            Ok(found)
        };
        let mut own = FxHashSet::default();
        let mut tombstones = HashMap::new();
        for item in self.tree.scan_prefix([P_COMPONENT]) {
            let (k, v) = item?;
            let component = k.get(1..).unwrap_or_default().to_vec();
            if let Some(generation) = pack::tombstone_generation(&v) {
                tombstones.insert(component.clone(), generation);
            }
            own.insert(component);
        }
        *self.layout_mut() = Layout {
            deltas: components(&self.tree, P_DELTA)?,
            large: components(&self.entries, P_COMPONENT)?,
            parents: components(&self.tree, P_CHILDREN)?,
            own,
        };
        Ok(tombstones)
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
}

impl Ledger {
    /// Whether the journal holds intents no commit collapsed yet: left by
    /// a run that was cancelled (or failed) before its end.
    pub(crate) fn has_leftover_intents(&self) -> bool {
        self.journal().is_ok_and(|j| j.has_live())
    }

    /// Folds the intents the journal holds into the entries, as opening
    /// the ledger does after a crash, and forgets them once that is
    /// durable.
    pub(crate) fn recover_leftovers(&self) -> Result<()> {
        let (ids, intents) = self.journal()?.live_intents().map_err(|e| match e {
            JournalError::Io(e) => Error::Io(e),
            JournalError::Corrupt(detail) => self.corrupt(detail),
        })?;
        if ids.is_empty() {
            return Ok(());
        }
        let ops: Vec<LedgerOp> = intents.into_iter().map(LedgerOp::Recover).collect();
        if !ops.is_empty() {
            self.apply(ops)?;
        }
        self.tree.flush()?;
        self.write_seq_file()?;
        let mut journal = self.journal()?;
        journal.forget(&ids)?;
        Ok(journal.sync()?)
    }
}

/// Writes a commit count to `file` (by rename, so it is whole).
fn write_seq(file: &Path, seq: u64) -> std::io::Result<()> {
    let tmp = file.with_extension("seq.tmp");
    std::fs::write(&tmp, format!("{seq}\n")).and_then(|()| std::fs::rename(&tmp, file))
}

/// Why a `sled/` that is not a store is not a ledger.
/// What opening a ledger knows of its directory before the store is open.
struct Opening {
    dir: PathBuf,
    /// The directory, as errors name it.
    display: Arc<str>,
    /// Its `sled/` existed.
    existed: bool,
    /// Its `weir.seq` existed: it is marked as a ledger.
    marked: bool,
    /// Its `weir.lock` existed.
    lock_existed: bool,
}

impl Opening {
    /// Refuses a file, and a `sled/` weir did not write (unmarked, and not
    /// a sled store).
    fn new(dir: &Path) -> Result<Self> {
        let display: Arc<str> = Arc::from(dir.display().to_string());
        if dir.is_file() {
            return Err(Error::Usage(format!(
                "cannot open the ledger at {display}: it is a file; a ledger is a directory"
            )));
        }
        let sled_dir = dir.join(STORE_DIR);
        let existed = sled_dir.exists();
        // `weir.seq` marks a ledger (see `Ledger::exists`): a `sled/`
        // without it must be a store weir wrote, checked once it is open.
        let marked = dir.join(SEQ_FILE).is_file();
        if existed && !marked && !is_sled_store(&sled_dir) {
            return Err(not_a_ledger(&display, NOT_A_STORE));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            display,
            existed,
            marked,
            lock_existed: dir.join(LOCK_FILE).exists(),
        })
    }

    fn io(&self, e: std::io::Error) -> Error {
        named_io(e, &self.display)
    }

    fn corrupt(&self, detail: String) -> Error {
        Error::LedgerCorrupt {
            path: self.display.to_string(),
            detail,
        }
    }

    fn locked(&self) -> Error {
        Error::LedgerLocked {
            path: self.display.to_string(),
        }
    }

    /// Takes the App's hold on the ledger: the lock of `weir.lock`.
    fn lock(&self) -> Result<File> {
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join(LOCK_FILE))
            .map_err(|e| self.io(e))?;
        match lock.try_lock() {
            Ok(()) => Ok(lock),
            Err(std::fs::TryLockError::WouldBlock) => Err(self.locked()),
            Err(std::fs::TryLockError::Error(e)) => Err(self.io(e)),
        }
    }

    /// Refuses the directory as not weir's: what this opening created (the
    /// lock file) it removes.
    fn refuse(&self, lock: File, detail: &str) -> Error {
        drop(lock);
        if !self.lock_existed {
            let _ = std::fs::remove_file(self.dir.join(LOCK_FILE));
        }
        not_a_ledger(&self.display, detail)
    }

    /// Opens the sled store, waiting a little for sled's own lock, which a
    /// ledger closed a moment ago may still hold while its background
    /// threads wind down. An unmarked directory whose store cannot be
    /// opened, or holds no weir format version, is refused as not weir's;
    /// a marked one is corrupt.
    fn open_store(&self, cache_bytes: u64, lock: File) -> Result<(sled::Db, File)> {
        let config = sled::Config::new()
            .path(self.dir.join(STORE_DIR))
            .cache_capacity(cache_bytes)
            .flush_every_ms(None);
        let unmarked = self.existed && !self.marked;
        let db = match open_sled(&config) {
            Ok(db) => db,
            Err(SledOpen::Panicked) if unmarked => {
                return Err(self.refuse(lock, "sled panicked while reading its sled/"))
            }
            Err(SledOpen::Panicked) => {
                return Err(self.corrupt("sled panicked while reading it".into()))
            }
            Err(SledOpen::Locked) => return Err(self.locked()),
            Err(SledOpen::Failed(sled::Error::Io(e)))
                if e.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                return Err(self.io(e))
            }
            Err(SledOpen::Failed(other)) if unmarked => {
                let detail =
                    format!("its sled/ cannot be opened ({other}) and it has no {SEQ_FILE}");
                return Err(self.refuse(lock, &detail));
            }
            Err(SledOpen::Failed(other)) => {
                return Err(self.corrupt(format!("sled cannot open it: {other}")))
            }
        };
        if unmarked && !db.contains_key(FORMAT_KEY).unwrap_or(false) {
            drop(db);
            return Err(self.refuse(lock, NO_FORMAT));
        }
        start_io_threads(&db);
        Ok((db, lock))
    }
}

/// Starts sled's pool of IO threads now, while the first ledger of the
/// process opens, rather than at the first commit that writes a full
/// buffer of sled's log. The pool is the process's, and starting it is
/// costly: it spawns seven threads, which spin until the last of them is
/// spawned (sled's lazily made queue). Amid a run's first commits that
/// took about 4 % of a 100k-state first run's CPU time (`perf record`,
/// `benches/engine.rs` flat100k). A flush through the pool starts it; it
/// has nothing to write yet, and its outcome does not matter (a later
/// flush reports what fails). Ledgers opened later in the process find
/// the pool running, and skip the flush.
fn start_io_threads(db: &sled::Db) {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let _ = futures::executor::block_on(db.flush_async());
    });
}

/// Why sled did not open a store.
enum SledOpen {
    /// It panicked (on damaged files).
    Panicked,
    /// Its lock stayed held for [`SLED_LOCK_WAIT`].
    Locked,
    /// Any other error.
    Failed(sled::Error),
}

/// Opens a sled store, waiting up to [`SLED_LOCK_WAIT`] for sled's own
/// lock, which a store closed a moment ago (in this process too) may
/// still hold while its background threads wind down.
fn open_sled(config: &sled::Config) -> std::result::Result<sled::Db, SledOpen> {
    let mut waited = std::time::Duration::ZERO;
    loop {
        // sled may panic on damaged files.
        let config = config.clone();
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || config.open()))
            .map_err(|_| SledOpen::Panicked)?;
        match opened {
            Ok(db) => return Ok(db),
            Err(sled::Error::Io(io)) if is_sled_lock(&io) && waited < SLED_LOCK_WAIT => {
                std::thread::sleep(SLED_LOCK_RETRY);
                waited += SLED_LOCK_RETRY;
            }
            Err(sled::Error::Io(io)) if is_sled_lock(&io) => return Err(SledOpen::Locked),
            Err(other) => return Err(SledOpen::Failed(other)),
        }
    }
}

const NOT_A_STORE: &str = "its sled/ is not a sled store, and it has no weir.seq";
/// Why a store without weir's format version is not a ledger.
const NO_FORMAT: &str = "its sled/ store holds no weir format version, and it has no weir.seq";

/// Whether `dir` looks like a sled store (its configuration and its log),
/// so that opening it would not create one.
fn is_sled_store(dir: &Path) -> bool {
    dir.join("conf").is_file() && dir.join("db").is_file()
}

/// The refusal of a directory that holds a `sled/` but not a ledger.
fn not_a_ledger(dir: &str, detail: &str) -> Error {
    Error::Usage(format!(
        "{dir} is not a weir ledger: {detail}; give weir another directory for its ledger (an empty or a new one starts a new ledger), or move this one's content away"
    ))
}

/// What the packs hold when a ledger opens: the index of their live
/// members, every component any of them holds, and their keys by id.
#[derive(Default)]
struct Packs {
    index: pack::PackIndex,
    contained: HashSet<Vec<u8>>,
    keys: Vec<(u64, sled::IVec)>,
}
