//! The fingerprint cache shared by walks of one tree.

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use weir_actors::{Error, Fingerprint, Result};

use super::{SourceFile, FINGERPRINT_CACHE_RACY_WINDOW};

/// A shared, thread-safe cache of content fingerprints, keyed by a file's
/// absolute path, size and modification time (and, on Unix, its inode and
/// status-change time), so that repeated walks (live mode) read
/// only the files whose metadata changed.
///
/// Cheap to clone; clones share the entries. One entry is kept per path;
/// a walk with the cache drops the entries of the files under its root that
/// it no longer finds, so the cache does not grow with deleted files.
///
/// A fingerprint is not stored when the file was modified (or, on Unix,
/// its status changed) less than [`FINGERPRINT_CACHE_RACY_WINDOW`] before it
/// was read: it could change again without its size and times moving, even
/// when its modification time was set back. On Unix, a file renamed
/// over another or swapped with it is told apart by its inode, and a
/// writer that sets the modification time back moves the status-change
/// time. Elsewhere, like any cache keyed by size and time, it is fooled by
/// such a file.
#[derive(Clone, Default)]
pub struct FingerprintCache {
    entries: Arc<Mutex<HashMap<PathBuf, CacheEntry>>>,
}

/// The format version of a saved cache. Version 1 had no identities: it
/// loads empty, and the files are read once more.
const SAVED_CACHE_VERSION: u32 = 2;
/// A saved cache entry: path, size, modification time (seconds and
/// nanoseconds since the epoch), identity and fingerprint.
type SavedEntry = (String, u64, u64, u32, FileIdentity, Fingerprint);

/// What tells apart two versions of a file at one path that have the same
/// size and modification time. On Unix: its inode (a file renamed over
/// another, or swapped with it, keeps its size and time, not its inode)
/// and its status-change time (which moves when a writer sets the
/// modification time back). Zero elsewhere. Not the device: a remount may
/// renumber it, which would throw the whole cache away.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct FileIdentity {
    inode: u64,
    changed_secs: i64,
    changed_nanos: i64,
}

impl FileIdentity {
    /// The identity of the file `meta` describes.
    pub(super) fn of(meta: &fs::Metadata) -> FileIdentity {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            FileIdentity {
                inode: meta.ino(),
                changed_secs: meta.ctime(),
                changed_nanos: meta.ctime_nsec(),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = meta;
            FileIdentity::default()
        }
    }

    /// The status-change time, when the platform reports one.
    fn changed(&self) -> Option<SystemTime> {
        if *self == FileIdentity::default() {
            return None;
        }
        let nanos = u32::try_from(self.changed_nanos).ok()?;
        match u64::try_from(self.changed_secs) {
            Ok(secs) => SystemTime::UNIX_EPOCH.checked_add(Duration::new(secs, nanos)),
            // Before 1970: far outside any racy window.
            Err(_) => Some(SystemTime::UNIX_EPOCH),
        }
    }
}

/// What the cache knows of one file.
#[derive(Clone, Copy)]
struct CacheEntry {
    size: u64,
    modified: SystemTime,
    identity: FileIdentity,
    fingerprint: Fingerprint,
}

impl FingerprintCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many files the cache holds a fingerprint for.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the cache holds no fingerprint.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Forgets every fingerprint.
    pub fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, CacheEntry>> {
        // The map stays consistent whatever panicked while holding the lock.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn lookup(
        &self,
        path: &Path,
        size: u64,
        modified: SystemTime,
        identity: FileIdentity,
    ) -> Option<Fingerprint> {
        self.lock()
            .get(path)
            .filter(|e| e.size == size && e.modified == modified && e.identity == identity)
            .map(|e| e.fingerprint)
    }

    pub(super) fn store(
        &self,
        path: &Path,
        size: u64,
        modified: SystemTime,
        identity: FileIdentity,
        fingerprint: Fingerprint,
        read_at: SystemTime,
    ) {
        // Both times: a writer that sets the modification time back leaves
        // an old one, and only the status-change time says the file was
        // just written (and could be written again within its tick).
        let settled = |time: SystemTime| {
            read_at
                .duration_since(time)
                .is_ok_and(|age| age >= FINGERPRINT_CACHE_RACY_WINDOW)
        };
        if settled(modified) && identity.changed().is_none_or(settled) {
            let entry = CacheEntry {
                size,
                modified,
                identity,
                fingerprint,
            };
            self.lock().insert(path.to_path_buf(), entry);
        }
    }

    /// Loads a cache written by [`FingerprintCache::save`], so that a new
    /// process does not read files that did not change since. A missing,
    /// unreadable or damaged file gives an empty cache: it is only a cache,
    /// so the worst outcome is reading every file once more.
    pub fn load(file: impl AsRef<Path>) -> FingerprintCache {
        let cache = FingerprintCache::new();
        let Ok(bytes) = fs::read(file.as_ref()) else {
            return cache;
        };
        let Ok((version, saved)) = rmp_serde::from_slice::<(u32, Vec<SavedEntry>)>(&bytes) else {
            return cache;
        };
        if version != SAVED_CACHE_VERSION {
            return cache;
        }
        let mut entries = cache.lock();
        for (path, size, secs, nanos, identity, fingerprint) in saved {
            // A damaged file can hold any numbers: an entry whose time is
            // out of range is skipped, never a panic.
            let Some(modified) = (nanos < 1_000_000_000)
                .then(|| SystemTime::UNIX_EPOCH.checked_add(Duration::new(secs, nanos)))
                .flatten()
            else {
                continue;
            };
            entries.insert(
                PathBuf::from(path),
                CacheEntry {
                    size,
                    modified,
                    identity,
                    fingerprint,
                },
            );
        }
        drop(entries);
        cache
    }

    /// Writes the cache to `file` (atomically: a temporary file renamed
    /// over it). Entries of paths that are not valid UTF-8 are left out.
    ///
    /// # Errors
    /// When the file cannot be written, naming it.
    pub fn save(&self, file: impl AsRef<Path>) -> Result<()> {
        let file = file.as_ref();
        let saved: Vec<SavedEntry> = self
            .lock()
            .iter()
            .filter_map(|(path, e)| {
                let since = e.modified.duration_since(SystemTime::UNIX_EPOCH).ok()?;
                Some((
                    path.to_str()?.to_string(),
                    e.size,
                    since.as_secs(),
                    since.subsec_nanos(),
                    e.identity,
                    e.fingerprint,
                ))
            })
            .collect();
        let bytes = rmp_serde::to_vec(&(SAVED_CACHE_VERSION, saved))?;
        let mut tmp = file.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let shown = file.display();
        fs::write(&tmp, bytes)
            .and_then(|()| fs::rename(&tmp, file))
            .map_err(|e| Error::msg(format!("cannot save the fingerprint cache `{shown}`: {e}")))
    }

    /// Drops the entries under `root` whose path is not in `seen`.
    pub(super) fn retain_under(&self, root: &Path, seen: &[SourceFile]) {
        let mut entries = self.lock();
        if entries.is_empty() {
            return;
        }
        let seen: std::collections::HashSet<&Path> = seen.iter().map(SourceFile::path).collect();
        entries.retain(|path, _| !path.starts_with(root) || seen.contains(path.as_path()));
    }
}

impl fmt::Debug for FingerprintCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FingerprintCache")
            .field("len", &self.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_cache_loads_back_and_a_damaged_one_loads_empty() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let cache = FingerprintCache::new();
        let old = SystemTime::UNIX_EPOCH + Duration::new(1_600_000_000, 123);
        let fp = Fingerprint::from_bytes(b"x");
        let id = FileIdentity {
            inode: 2,
            changed_secs: 1_600_000_000,
            changed_nanos: 5,
        };
        cache.store(Path::new("/a/b"), 1, old, id, fp, SystemTime::now());
        let file = dir.path().join("cache");
        cache.save(&file)?;
        let loaded = FingerprintCache::load(&file);
        assert_eq!(loaded.lookup(Path::new("/a/b"), 1, old, id), Some(fp));
        // Times out of range, as a damaged file may hold them.
        let bad: Vec<SavedEntry> = vec![
            ("/x".into(), 1, u64::MAX, 0, id, fp),
            ("/y".into(), 1, 0, 2_000_000_000, id, fp),
            ("/a/b".into(), 1, 1_600_000_000, 123, id, fp),
        ];
        std::fs::write(&file, rmp_serde::to_vec(&(SAVED_CACHE_VERSION, bad))?)?;
        let loaded = FingerprintCache::load(&file);
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded.lookup(Path::new("/a/b"), 1, old, id), Some(fp));
        std::fs::write(&file, b"garbage")?;
        assert!(FingerprintCache::load(&file).is_empty());
        assert!(FingerprintCache::load(dir.path().join("missing")).is_empty());
        Ok(())
    }

    #[test]
    fn the_cache_does_not_keep_fingerprints_of_files_modified_just_before_the_read() {
        let cache = FingerprintCache::new();
        let fp = Fingerprint::from_bytes(b"x");
        let now = SystemTime::now();
        let id = FileIdentity::default();
        cache.store(Path::new("/a"), 1, now, id, fp, now);
        assert!(cache.is_empty());
        let old = now - Duration::from_secs(60);
        cache.store(Path::new("/a"), 1, old, id, fp, now);
        assert_eq!(cache.lookup(Path::new("/a"), 1, old, id), Some(fp));
        assert_eq!(cache.lookup(Path::new("/a"), 2, old, id), None);
        assert_eq!(cache.lookup(Path::new("/a"), 1, now, id), None);
    }

    #[test]
    fn the_cache_does_not_keep_fingerprints_of_files_whose_status_changed_just_before_the_read() {
        let cache = FingerprintCache::new();
        let fp = Fingerprint::from_bytes(b"x");
        let now = SystemTime::now();
        let old = now - Duration::from_secs(60);
        let since_epoch =
            |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        let changed_at = |t: SystemTime| FileIdentity {
            inode: 7,
            changed_secs: i64::try_from(since_epoch(t).as_secs()).unwrap_or(0),
            changed_nanos: i64::from(since_epoch(t).subsec_nanos()),
        };
        // Its modification time set back, its status changed just now.
        cache.store(Path::new("/a"), 1, old, changed_at(now), fp, now);
        assert!(cache.is_empty());
        // Both safely older than the window: kept.
        cache.store(Path::new("/a"), 1, old, changed_at(old), fp, now);
        assert_eq!(
            cache.lookup(Path::new("/a"), 1, old, changed_at(old)),
            Some(fp)
        );
        // Before 1970 is old too.
        let ancient = FileIdentity {
            inode: 8,
            changed_secs: -5,
            changed_nanos: 0,
        };
        cache.store(Path::new("/b"), 1, old, ancient, fp, now);
        assert_eq!(cache.lookup(Path::new("/b"), 1, old, ancient), Some(fp));
    }

    #[test]
    fn the_cache_tells_apart_files_of_one_size_and_time_by_their_identity() {
        let cache = FingerprintCache::new();
        let fp = Fingerprint::from_bytes(b"x");
        let now = SystemTime::now();
        let old = now - Duration::from_secs(60);
        let since_epoch =
            |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        let identity = |inode: u64, changed: SystemTime| FileIdentity {
            inode,
            changed_secs: i64::try_from(since_epoch(changed).as_secs()).unwrap_or(0),
            changed_nanos: i64::from(since_epoch(changed).subsec_nanos()),
        };
        let a = identity(7, old);
        cache.store(Path::new("/a"), 1, old, a, fp, now);
        assert_eq!(cache.lookup(Path::new("/a"), 1, old, a), Some(fp));
        // Another inode at the path (a rename over it, a swap).
        assert_eq!(
            cache.lookup(Path::new("/a"), 1, old, identity(8, old)),
            None
        );
        // The same inode, its status changed (its time set back).
        assert_eq!(
            cache.lookup(Path::new("/a"), 1, old, identity(7, now)),
            None
        );
    }
}
