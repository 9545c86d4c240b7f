//! The local-directory source: a walk of a directory tree, yielding its
//! files with their keys, sizes, modification times and (lazily) content
//! fingerprints.
//!
//! The walk itself is `ignore`'s (the walker of ripgrep), which reads
//! `.gitignore` and `.ignore` files as it descends; include and exclude
//! globs are `globset` globs, matched against the key (the path relative to
//! the root, with `/` separators). The same selection rules, compiled once
//! into a [`Filter`], decide which events the
//! [`DirWatcher`](super::DirWatcher) reports.

use std::collections::HashMap;
use std::fmt;
use std::fs::{self, File};
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use weir_actors::{Error, Fingerprint, Result};

/// How recent a modification time must be for a fingerprint not to be
/// stored in a [`FingerprintCache`]: a file modified this close to the
/// moment it is read could be modified again within the same tick of the
/// file system's clock, keeping its size and modification time while its
/// content changes. Two seconds cover the coarsest common clocks (FAT).
pub const FINGERPRINT_CACHE_RACY_WINDOW: Duration = Duration::from_secs(2);

/// The key of problems that cannot be tied to a path under the root.
const ROOT_KEY: &str = ".";

/// Options of a directory walk (and of a [`DirWatcher`](super::DirWatcher)).
///
/// The default selects every file: hidden files (names starting with `.`)
/// included, `.gitignore` and `.ignore` files respected, symbolic links
/// followed. A `.git` directory (or file) is always skipped.
///
/// # Globs
///
/// Include and exclude globs match the *key* of a file: its path relative
/// to the root, with `/` separators (`docs/guide/intro.md`). `*` and `?` do
/// not cross a `/`; `**` matches any number of directories
/// (`docs/**`, `**/*.md`); `{a,b}` and `[ab]` work as usual.
///
/// - A glob without a `/` (other than a trailing one) matches at any depth,
///   as in `.gitignore`: `*.md` is `**/*.md`, `node_modules` is
///   `**/node_modules`.
/// - A leading `/` anchors the glob at the root (`/README.md`); a trailing
///   `/` is dropped.
///
/// A directory matching an exclude glob is not descended into, and
/// `dir/**` excludes the directory `dir` itself too. Include globs only
/// select files: every directory not excluded is descended into.
///
/// # Example
///
/// ```
/// use weir_connectors::localfs::WalkOptions;
///
/// let options = WalkOptions::new()
///     .include("**/*.md")
///     .exclude("drafts/**")
///     .exclude_path("weir-ledger");
/// # let _ = options;
/// ```
#[derive(Clone, Debug)]
pub struct WalkOptions {
    includes: Vec<String>,
    excludes: Vec<String>,
    exclude_paths: Vec<PathBuf>,
    gitignore: bool,
    cache: Option<FingerprintCache>,
}

impl Default for WalkOptions {
    fn default() -> Self {
        WalkOptions {
            includes: Vec::new(),
            excludes: Vec::new(),
            exclude_paths: Vec::new(),
            gitignore: true,
            cache: None,
        }
    }
}

impl WalkOptions {
    /// Every file, `.gitignore` respected (see the [type
    /// documentation](WalkOptions)).
    pub fn new() -> Self {
        Self::default()
    }

    /// Selects only the files whose key matches `glob` (repeatable: a file
    /// matching any of them is selected). Without includes, every file is.
    ///
    /// The glob is checked when the walk starts: an invalid glob fails
    /// [`walk_dir`] and [`DirWatcher::new`](super::DirWatcher::new).
    #[must_use]
    pub fn include(mut self, glob: impl Into<String>) -> Self {
        self.includes.push(glob.into());
        self
    }

    /// Skips the files and directories whose key matches `glob`
    /// (repeatable). Excludes win over includes, and a directory matching
    /// one is not descended into.
    #[must_use]
    pub fn exclude(mut self, glob: impl Into<String>) -> Self {
        self.excludes.push(glob.into());
        self
    }

    /// Skips the file or directory at `path` entirely (repeatable): an
    /// absolute path or one relative to the current directory, such as the
    /// output database or the ledger directory when they live inside the
    /// walked root.
    ///
    /// The path is compared after being made absolute, and also in its
    /// canonical form (symbolic links resolved) when it exists when the walk
    /// or the watcher starts.
    #[must_use]
    pub fn exclude_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.exclude_paths.push(path.into());
        self
    }

    /// Whether to respect `.gitignore` and `.ignore` files (default `true`):
    /// those in the root and in its subdirectories, each applying to its own
    /// directory and below, even outside a git repository. Ignore files
    /// above the root and the user's global git excludes are never read, so
    /// a directory that the enclosing project ignores (a data directory,
    /// typically) is still walked.
    #[must_use]
    pub fn gitignore(mut self, respect: bool) -> Self {
        self.gitignore = respect;
        self
    }

    /// Whether ignore files are respected.
    pub(super) fn respects_gitignore(&self) -> bool {
        self.gitignore
    }

    /// Fingerprints files through `cache`: [`SourceFile::fingerprint`]
    /// reads a file only when the cache holds no fingerprint for its path,
    /// size and modification time, and stores what it computes.
    #[must_use]
    pub fn fingerprint_cache(mut self, cache: FingerprintCache) -> Self {
        self.cache = Some(cache);
        self
    }
}

/// A shared, thread-safe cache of content fingerprints, keyed by a file's
/// absolute path, size and modification time, so that repeated walks (live
/// mode) read only the files whose size or modification time changed.
///
/// Cheap to clone; clones share the entries. One entry is kept per path;
/// a walk with the cache drops the entries of the files under its root that
/// it no longer finds, so the cache does not grow with deleted files.
///
/// A fingerprint is not stored when the file was modified less than
/// [`FINGERPRINT_CACHE_RACY_WINDOW`] before it was read: it could change
/// again without its modification time moving. Like any cache keyed by
/// metadata, it is fooled by a writer that restores both the size and the
/// modification time of a file it changed.
#[derive(Clone, Default)]
pub struct FingerprintCache {
    entries: Arc<Mutex<HashMap<PathBuf, CacheEntry>>>,
}

/// The format version of a saved cache.
const SAVED_CACHE_VERSION: u32 = 1;
/// A saved cache entry: path, size, modification time (seconds and
/// nanoseconds since the epoch) and fingerprint.
type SavedEntry = (String, u64, u64, u32, Fingerprint);

/// What the cache knows of one file.
#[derive(Clone, Copy)]
struct CacheEntry {
    size: u64,
    modified: SystemTime,
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

    fn lookup(&self, path: &Path, size: u64, modified: SystemTime) -> Option<Fingerprint> {
        self.lock()
            .get(path)
            .filter(|e| e.size == size && e.modified == modified)
            .map(|e| e.fingerprint)
    }

    fn store(
        &self,
        path: &Path,
        size: u64,
        modified: SystemTime,
        fingerprint: Fingerprint,
        read_at: SystemTime,
    ) {
        let settled = read_at
            .duration_since(modified)
            .is_ok_and(|age| age >= FINGERPRINT_CACHE_RACY_WINDOW);
        if settled {
            let entry = CacheEntry {
                size,
                modified,
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
        for (path, size, secs, nanos, fingerprint) in saved {
            let modified = SystemTime::UNIX_EPOCH + Duration::new(secs, nanos);
            entries.insert(
                PathBuf::from(path),
                CacheEntry {
                    size,
                    modified,
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
    fn retain_under(&self, root: &Path, seen: &[SourceFile]) {
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

/// One file under the walked root, or one problem met by the walk
/// ([`SourceFile::error`] is then set).
///
/// Cheap to clone (the clones share the lazily computed fingerprint), and
/// `Send + Sync + 'static`, so it can be handed to a component.
#[derive(Clone)]
pub struct SourceFile {
    inner: Arc<Inner>,
}

struct Inner {
    key: String,
    path: PathBuf,
    size: u64,
    modified: Option<SystemTime>,
    error: Option<String>,
    unlisted_dir: bool,
    fingerprint: OnceLock<Fingerprint>,
    cache: Option<FingerprintCache>,
}

impl SourceFile {
    /// The path relative to the root, with `/` separators
    /// (`posts/first.md`); never absolute. Keys are unique in a walk.
    ///
    /// For a name that is not valid UTF-8 this is its lossy form (invalid
    /// sequences replaced by `U+FFFD`) and [`SourceFile::error`] is set. A
    /// problem not tied to a path under the root has the key `.`.
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// The absolute path of the file (under the root as given, made
    /// absolute; symbolic links are not resolved).
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The size in bytes when walked (of the link's target, for a symbolic
    /// link); `0` for a problem.
    pub fn size(&self) -> u64 {
        self.inner.size
    }

    /// The modification time when walked, when the platform reports one.
    pub fn modified(&self) -> Option<SystemTime> {
        self.inner.modified
    }

    /// The problem the walk met with this item, if any, such as `file name
    /// is not valid UTF-8`, `symbolic link loop: a/b -> a` or
    /// `permission denied`.
    pub fn error(&self) -> Option<&str> {
        self.inner.error.as_deref()
    }

    /// Whether this item stands for a directory the walk could not list
    /// (permission denied, an I/O error, a name that is not UTF-8): the
    /// files under it were not seen, so a consumer must not take them for
    /// deleted. [`SourceFile::error`] says why.
    pub fn is_unlisted_dir(&self) -> bool {
        self.inner.unlisted_dir
    }

    /// Reads the whole file.
    ///
    /// This blocks: in async code, call it on a blocking thread (or use
    /// `tokio::fs::read` on [`SourceFile::path`]) for large files.
    ///
    /// # Errors
    /// An error naming the key when the item is a problem
    /// ([`SourceFile::error`] is set) or the file cannot be read, e.g.
    /// ``cannot read file `a.txt`: Permission denied (os error 13)``.
    /// Permission problems and walk problems are permanent; other I/O errors
    /// (the file vanished since the walk, say) are retriable.
    pub fn read(&self) -> Result<Vec<u8>> {
        self.check()?;
        fs::read(&self.inner.path).map_err(|e| self.io_error(&e))
    }

    /// The fingerprint of the file's content
    /// ([`Fingerprint::from_bytes`] of what [`SourceFile::read`] returns).
    ///
    /// Computed on the first call by streaming the file, then kept: later
    /// calls (on this item or its clones) do not read the file again. With
    /// a [`FingerprintCache`] in the walk's options, a fingerprint cached
    /// for this path, size and modification time is used without reading
    /// the file, and a computed one is stored.
    ///
    /// # Errors
    /// As [`SourceFile::read`].
    pub fn fingerprint(&self) -> Result<Fingerprint> {
        if let Some(fingerprint) = self.inner.fingerprint.get() {
            return Ok(*fingerprint);
        }
        self.check()?;
        let inner = &self.inner;
        let cache = inner.cache.as_ref().zip(inner.modified);
        let cached =
            cache.and_then(|(cache, modified)| cache.lookup(&inner.path, inner.size, modified));
        let fingerprint = match cached {
            Some(fingerprint) => fingerprint,
            None => {
                let read_at = SystemTime::now();
                let fingerprint = File::open(&inner.path)
                    .and_then(Fingerprint::from_reader)
                    .map_err(|e| self.io_error(&e))?;
                if let Some((cache, modified)) = cache {
                    cache.store(&inner.path, inner.size, modified, fingerprint, read_at);
                }
                fingerprint
            }
        };
        Ok(*inner.fingerprint.get_or_init(|| fingerprint))
    }

    /// Fails when the item is a walk problem.
    fn check(&self) -> Result<()> {
        match &self.inner.error {
            Some(problem) => Err(Error::permanent(format!(
                "cannot read file `{}`: {problem}",
                self.inner.key
            ))),
            None => Ok(()),
        }
    }

    fn io_error(&self, e: &io::Error) -> Error {
        let message = format!("cannot read file `{}`: {e}", self.inner.key);
        match e.kind() {
            io::ErrorKind::PermissionDenied | io::ErrorKind::IsADirectory => {
                Error::permanent(message)
            }
            _ => Error::msg(message),
        }
    }
}

impl fmt::Debug for SourceFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("SourceFile");
        s.field("key", &self.inner.key)
            .field("size", &self.inner.size);
        if let Some(error) = &self.inner.error {
            s.field("error", error);
        }
        s.finish()
    }
}

/// Walks the directory `root` and returns its files, sorted by key.
///
/// Only files are returned (including files reached through symbolic
/// links); directories are descended into, and other kinds of entries
/// (sockets, FIFOs, devices) are skipped. See [`WalkOptions`] for what is
/// selected.
///
/// Problems met on the way do not stop the walk: each becomes an item with
/// [`SourceFile::error`] set, keyed by the relative path of the culprit — a
/// directory that cannot be read, a symbolic link loop or a broken link, a
/// name that is not valid UTF-8 (a directory with such a name is not
/// descended into), a `.gitignore` that cannot be parsed.
///
/// This blocks while it lists the tree (it reads no file content): in async
/// code, call it on a blocking thread (`tokio::task::spawn_blocking`).
///
/// # Errors
/// An error naming the directory when `root` does not exist, is not a
/// directory or cannot be inspected, and a usage error naming the glob when
/// an include or exclude glob is invalid.
///
/// # Example
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use weir_connectors::localfs::{walk_dir, WalkOptions};
///
/// let root = tempfile::tempdir()?;
/// std::fs::create_dir_all(root.path().join("posts"))?;
/// std::fs::write(root.path().join("posts/first.md"), "# first")?;
/// std::fs::write(root.path().join("notes.txt"), "not selected")?;
///
/// let files = walk_dir(root.path(), &WalkOptions::new().include("*.md"))?;
/// let keys: Vec<&str> = files.iter().map(|f| f.key()).collect();
/// assert_eq!(keys, ["posts/first.md"]);
/// assert_eq!(files[0].read()?, b"# first");
/// # Ok(())
/// # }
/// ```
pub fn walk_dir(root: impl AsRef<Path>, options: &WalkOptions) -> Result<Vec<SourceFile>> {
    let filter = Arc::new(Filter::new(root.as_ref(), options)?);
    let unnamed_dirs: Arc<Mutex<Vec<PathBuf>>> = Arc::default();

    let mut builder = ignore::WalkBuilder::new(&filter.root);
    builder
        .standard_filters(false)
        .hidden(false)
        .follow_links(true)
        .git_ignore(options.gitignore)
        .git_exclude(options.gitignore)
        .ignore(options.gitignore)
        .require_git(false);
    {
        let filter = Arc::clone(&filter);
        let unnamed_dirs = Arc::clone(&unnamed_dirs);
        builder.filter_entry(move |entry| filter.keeps_entry(entry, &unnamed_dirs));
    }

    let mut found: Vec<Found> = Vec::new();
    for result in builder.build() {
        match result {
            Ok(entry) => {
                if let Some(err) = entry.error() {
                    filter.push_problems(err, &mut found);
                }
                if entry.depth() > 0 && entry.file_type().is_some_and(|t| t.is_file()) {
                    found.push(filter.file(&entry));
                }
            }
            Err(err) => filter.push_problems(&err, &mut found),
        }
    }
    let unnamed_dirs =
        std::mem::take(&mut *unnamed_dirs.lock().unwrap_or_else(PoisonError::into_inner));
    for dir in unnamed_dirs {
        let mut problem = filter.problem(Some(&dir), "directory name is not valid UTF-8".into());
        problem.unlisted_dir = true;
        found.push(problem);
    }

    let files = merge(found, options.cache.as_ref());
    if let Some(cache) = &options.cache {
        cache.retain_under(&filter.root, &files);
    }
    Ok(files)
}

/// A file or problem found by the walk, before it is shared.
struct Found {
    key: String,
    path: PathBuf,
    size: u64,
    modified: Option<SystemTime>,
    error: Option<String>,
    /// A directory the walk could not list.
    unlisted_dir: bool,
}

/// Sorts by key and merges the items sharing one (a problem wins over a
/// file, problems are joined), then shares them.
fn merge(mut found: Vec<Found>, cache: Option<&FingerprintCache>) -> Vec<SourceFile> {
    found.sort_by(|a, b| a.key.cmp(&b.key));
    let mut merged: Vec<Found> = Vec::with_capacity(found.len());
    for item in found {
        let unlisted_dir = item.unlisted_dir;
        match merged.last_mut() {
            Some(last) if last.key == item.key => match (&mut last.error, item.error) {
                (Some(first), Some(second)) => {
                    last.unlisted_dir |= unlisted_dir;
                    if *first != second {
                        first.push_str("; ");
                        first.push_str(&second);
                    }
                }
                (Some(_), None) => {}
                (None, Some(second)) => {
                    *last = Found {
                        error: Some(second),
                        ..item
                    }
                }
                (None, None) => {}
            },
            _ => merged.push(item),
        }
    }
    merged
        .into_iter()
        .map(|f| SourceFile {
            inner: Arc::new(Inner {
                key: f.key,
                path: f.path,
                size: if f.error.is_some() { 0 } else { f.size },
                modified: f.modified,
                error: f.error,
                unlisted_dir: f.unlisted_dir,
                fingerprint: OnceLock::new(),
                cache: cache.cloned(),
            }),
        })
        .collect()
}

/// The selection rules of [`WalkOptions`], compiled against a root.
pub(super) struct Filter {
    /// The root made absolute (`.` components dropped).
    pub(super) root: PathBuf,
    /// The root with symbolic links resolved.
    root_canonical: Option<PathBuf>,
    includes: Option<GlobSet>,
    /// Excludes, matched against files and directories.
    excludes: GlobSet,
    /// The `dir` of each `dir/**` exclude, matched against directories.
    excluded_dirs: GlobSet,
    /// Each excluded path, absolute, and canonical when it exists.
    /// Excluded paths relative to the root.
    excluded_relative: Vec<PathBuf>,
}

impl Filter {
    /// Checks the root and compiles the options.
    pub(super) fn new(root: &Path, options: &WalkOptions) -> Result<Filter> {
        let shown = root.display();
        let absolute: PathBuf = std::path::absolute(root)
            .map_err(|e| Error::msg(format!("localfs source directory `{shown}`: {e}")))?
            .components()
            .collect();
        match fs::metadata(&absolute) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(Error::permanent(format!(
                    "localfs source directory `{shown}` is not a directory"
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Error::permanent(format!(
                    "localfs source directory `{shown}` does not exist"
                )))
            }
            Err(e) => {
                return Err(Error::msg(format!(
                    "localfs source directory `{shown}` cannot be inspected: {e}"
                )))
            }
        }
        let includes = if options.includes.is_empty() {
            None
        } else {
            Some(glob_set(&options.includes, "include", false)?)
        };
        let mut excluded_paths = Vec::new();
        for path in &options.exclude_paths {
            let absolute: PathBuf = std::path::absolute(path)
                .map_err(|e| {
                    Error::msg(format!(
                        "localfs source: excluded path `{}`: {e}",
                        path.display()
                    ))
                })?
                .components()
                .collect();
            if let Ok(canonical) = fs::canonicalize(&absolute) {
                if canonical != absolute {
                    excluded_paths.push(canonical);
                }
            }
            excluded_paths.push(absolute);
        }
        let root_canonical = fs::canonicalize(&absolute).ok();
        // Excluded paths as paths relative to the root (either spelling of
        // it), so that checking an entry is a cheap prefix test; an empty
        // one (a path containing the root) excludes everything.
        let mut excluded_relative: Vec<PathBuf> = Vec::new();
        for excluded in &excluded_paths {
            for root in std::iter::once(&absolute).chain(root_canonical.as_ref()) {
                let relative = if let Ok(rel) = excluded.strip_prefix(root) {
                    Some(rel.to_path_buf())
                } else if root.starts_with(excluded) {
                    Some(PathBuf::new())
                } else {
                    None
                };
                if let Some(rel) = relative {
                    if !excluded_relative.contains(&rel) {
                        excluded_relative.push(rel);
                    }
                }
            }
        }
        Ok(Filter {
            root_canonical,
            root: absolute,
            includes,
            excludes: glob_set(&options.excludes, "exclude", false)?,
            excluded_dirs: glob_set(&options.excludes, "exclude", true)?,
            excluded_relative,
        })
    }

    /// The path relative to the root, when it is under it (as given or
    /// canonical).
    pub(super) fn relative<'a>(&self, path: &'a Path) -> Option<&'a Path> {
        path.strip_prefix(&self.root).ok().or_else(|| {
            self.root_canonical
                .as_ref()
                .and_then(|root| path.strip_prefix(root).ok())
        })
    }

    /// Whether the entry at `relative` (under the root) is always skipped:
    /// it is in a `.git` directory, or under an excluded path.
    pub(super) fn is_skipped_path(&self, relative: &Path) -> bool {
        if relative.components().any(|c| c.as_os_str() == ".git") {
            return true;
        }
        self.excluded_relative
            .iter()
            .any(|excluded| relative.starts_with(excluded))
    }

    /// Whether a directory with this key matches an exclude glob.
    pub(super) fn excludes_dir(&self, key: &str) -> bool {
        self.excludes.is_match(key) || self.excluded_dirs.is_match(key)
    }

    /// Whether a file with this key matches an exclude glob.
    pub(super) fn excludes_file(&self, key: &str) -> bool {
        self.excludes.is_match(key)
    }

    /// Whether one of the directories above `key` matches an exclude glob.
    pub(super) fn excludes_a_parent(&self, key: &str) -> bool {
        key.match_indices('/')
            .any(|(at, _)| self.excludes_dir(&key[..at]))
    }

    /// Whether a file with this key is selected by the include globs.
    pub(super) fn includes_file(&self, key: &str) -> bool {
        self.includes.as_ref().is_none_or(|set| set.is_match(key))
    }

    /// The `filter_entry` of the walk: whether to yield (and, for a
    /// directory, descend into) the entry. Directories with a name that is
    /// not valid UTF-8 are skipped and recorded in `unnamed_dirs`.
    fn keeps_entry(&self, entry: &ignore::DirEntry, unnamed_dirs: &Mutex<Vec<PathBuf>>) -> bool {
        if entry.depth() == 0 {
            return true;
        }
        let Some(relative) = self.relative(entry.path()) else {
            return true;
        };
        if self.is_skipped_path(relative) {
            return false;
        }
        let key = key_of(relative);
        if entry.file_type().is_some_and(|t| t.is_dir()) {
            if self.excludes_dir(&key) {
                return false;
            }
            if relative.to_str().is_none() {
                unnamed_dirs
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(entry.path().to_path_buf());
                return false;
            }
            true
        } else {
            !self.excludes_file(&key) && self.includes_file(&key)
        }
    }

    /// The item of a file entry.
    fn file(&self, entry: &ignore::DirEntry) -> Found {
        let path = entry.path();
        let relative = self.relative(path).unwrap_or(path);
        if relative.to_str().is_none() {
            return self.problem(Some(path), "file name is not valid UTF-8".into());
        }
        match entry.metadata() {
            Ok(meta) => Found {
                key: key_of(relative),
                path: path.to_path_buf(),
                size: meta.len(),
                modified: meta.modified().ok(),
                error: None,
                unlisted_dir: false,
            },
            Err(err) => {
                let mut found = Vec::new();
                self.push_problems(&err, &mut found);
                found
                    .pop()
                    .unwrap_or_else(|| self.problem(Some(path), err.to_string()))
            }
        }
    }

    /// A problem item for `path` (or the root, when unknown).
    fn problem(&self, path: Option<&Path>, message: String) -> Found {
        let relative = path
            .and_then(|p| self.relative(p))
            .filter(|r| !r.as_os_str().is_empty());
        Found {
            key: relative.map_or_else(|| ROOT_KEY.to_owned(), key_of),
            path: relative.map_or_else(|| self.root.clone(), |r| self.root.join(r)),
            size: 0,
            modified: None,
            error: Some(message),
            unlisted_dir: false,
        }
    }

    /// Turns an error of the walk into problem items, unless the options
    /// exclude its culprit.
    fn push_problems(&self, err: &ignore::Error, out: &mut Vec<Found>) {
        let mut problems = Vec::new();
        flatten(err, None, None, &mut problems);
        for problem in problems {
            let (path, message, is_dir, unlisted) = match problem {
                Problem::Loop { ancestor, child } => {
                    let message = format!(
                        "symbolic link loop: {} -> {}",
                        self.shown(&child),
                        self.shown(&ancestor)
                    );
                    // Its files are walked through the ancestor.
                    (Some(child), message, true, false)
                }
                Problem::Io { path, error } => {
                    let is_dir = path
                        .as_deref()
                        .is_some_and(|p| fs::metadata(p).is_ok_and(|m| m.is_dir()));
                    let message = self.io_message(path.as_deref(), &error);
                    (path, message, is_dir, is_dir)
                }
                Problem::Other { path, message } => (path, message, false, false),
            };
            if let Some(relative) = path.as_deref().and_then(|p| self.relative(p)) {
                let key = key_of(relative);
                let excluded = self.is_skipped_path(relative)
                    || self.excludes_a_parent(&key)
                    || if is_dir {
                        self.excludes_dir(&key)
                    } else {
                        self.excludes_file(&key) || !self.includes_file(&key)
                    };
                if excluded && !relative.as_os_str().is_empty() {
                    continue;
                }
            }
            let mut found = self.problem(path.as_deref(), message);
            found.unlisted_dir = unlisted;
            out.push(found);
        }
    }

    /// Describes an I/O problem, naming broken links.
    fn io_message(&self, path: Option<&Path>, error: &io::Error) -> String {
        if error.kind() == io::ErrorKind::PermissionDenied {
            return "permission denied".to_owned();
        }
        if let Some(path) = path {
            let is_link = fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
            if is_link && error.kind() == io::ErrorKind::NotFound {
                let target = fs::read_link(path)
                    .map(|t| t.display().to_string())
                    .unwrap_or_else(|_| "?".to_owned());
                return format!("broken symbolic link: {} -> {target}", self.shown(path));
            }
        }
        error.to_string()
    }

    /// A path for a message: relative to the root when under it.
    fn shown(&self, path: &Path) -> String {
        match self.relative(path) {
            Some(relative) if relative.as_os_str().is_empty() => ROOT_KEY.to_owned(),
            Some(relative) => key_of(relative),
            None => path.display().to_string(),
        }
    }
}

/// One problem out of an `ignore::Error`.
enum Problem {
    Loop {
        ancestor: PathBuf,
        child: PathBuf,
    },
    Io {
        path: Option<PathBuf>,
        error: io::Error,
    },
    Other {
        path: Option<PathBuf>,
        message: String,
    },
}

/// Flattens the nesting of an `ignore::Error` (paths, depths, line numbers,
/// partial errors) into problems.
fn flatten(err: &ignore::Error, path: Option<&Path>, line: Option<u64>, out: &mut Vec<Problem>) {
    use ignore::Error as E;
    match err {
        E::Partial(errs) => errs.iter().for_each(|e| flatten(e, path, line, out)),
        E::WithLineNumber { line, err } => flatten(err, path, Some(*line), out),
        E::WithPath { path, err } => flatten(err, Some(path), line, out),
        E::WithDepth { err, .. } => flatten(err, path, line, out),
        E::Loop { ancestor, child } => out.push(Problem::Loop {
            ancestor: ancestor.clone(),
            child: child.clone(),
        }),
        E::Io(error) => out.push(Problem::Io {
            path: path.map(Path::to_path_buf),
            error: io::Error::new(error.kind(), error.to_string()),
        }),
        E::Glob { glob, err } => {
            let at = line.map(|l| format!(" on line {l}")).unwrap_or_default();
            let glob = glob.as_deref().unwrap_or("?");
            out.push(Problem::Other {
                path: path.map(Path::to_path_buf),
                message: format!("invalid ignore pattern {glob:?}{at}: {err}"),
            });
        }
        other => out.push(Problem::Other {
            path: path.map(Path::to_path_buf),
            message: other.to_string(),
        }),
    }
}

/// The key of a relative path: its components joined with `/` (lossy for
/// names that are not valid UTF-8).
pub(super) fn key_of(relative: &Path) -> String {
    let mut key = String::new();
    for component in relative.components() {
        if let Component::Normal(name) = component {
            if !key.is_empty() {
                key.push('/');
            }
            key.push_str(&name.to_string_lossy());
        }
    }
    key
}

/// Compiles globs (see [`WalkOptions`]); with `dirs_only`, only the `dir`
/// of each `dir/**` glob.
fn glob_set(globs: &[String], role: &str, dirs_only: bool) -> Result<GlobSet> {
    let mut set = GlobSetBuilder::new();
    for original in globs {
        let mut glob = normalize_glob(original);
        if dirs_only {
            match glob.strip_suffix("/**") {
                Some(dir) if !dir.is_empty() => glob = dir.to_owned(),
                _ => continue,
            }
        }
        let compiled = GlobBuilder::new(&glob)
            .literal_separator(true)
            .build()
            .map_err(|e| {
                Error::Usage(format!(
                    "localfs source: invalid {role} glob {original:?}: {}",
                    e.kind()
                ))
            })?;
        set.add(compiled);
    }
    set.build()
        .map_err(|e| Error::Usage(format!("localfs source: invalid {role} globs: {e}")))
}

/// Anchors or unanchors a glob: a leading `/` anchors it at the root, a
/// trailing `/` is dropped, and a glob without `/` matches at any depth.
fn normalize_glob(glob: &str) -> String {
    let trimmed = glob.strip_suffix('/').unwrap_or(glob);
    if let Some(anchored) = trimmed.strip_prefix('/') {
        anchored.to_owned()
    } else if trimmed.contains('/') || trimmed.starts_with("**") {
        trimmed.to_owned()
    } else {
        format!("**/{trimmed}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(options: &WalkOptions) -> Filter {
        let root = std::env::temp_dir();
        match Filter::new(&root, options) {
            Ok(filter) => filter,
            Err(e) => unreachable!("a valid filter: {e}"),
        }
    }

    #[test]
    fn globs_without_a_slash_match_at_any_depth_and_a_leading_slash_anchors() {
        assert_eq!(normalize_glob("*.md"), "**/*.md");
        assert_eq!(normalize_glob("node_modules/"), "**/node_modules");
        assert_eq!(normalize_glob("/README.md"), "README.md");
        assert_eq!(normalize_glob("docs/**"), "docs/**");
        assert_eq!(normalize_glob("**/x"), "**/x");

        let f = filter(&WalkOptions::new().include("*.md").include("/top.txt"));
        assert!(f.includes_file("a.md"));
        assert!(f.includes_file("a/b/c.md"));
        assert!(f.includes_file("top.txt"));
        assert!(!f.includes_file("sub/top.txt"));
        assert!(!f.includes_file("a.txt"));
    }

    #[test]
    fn star_does_not_cross_a_slash() {
        let f = filter(&WalkOptions::new().include("docs/*.md"));
        assert!(f.includes_file("docs/a.md"));
        assert!(!f.includes_file("docs/sub/a.md"));
    }

    #[test]
    fn an_exclude_ending_in_double_star_excludes_the_directory_itself() {
        let f = filter(&WalkOptions::new().exclude("build/**").exclude("cache"));
        assert!(f.excludes_dir("build"));
        assert!(!f.excludes_file("build"));
        assert!(f.excludes_file("build/x"));
        assert!(f.excludes_dir("a/cache"));
        assert!(f.excludes_a_parent("build/deep/x.txt"));
        assert!(f.excludes_a_parent("a/cache/x.txt"));
        assert!(!f.excludes_a_parent("a/x.txt"));
    }

    #[test]
    fn git_metadata_is_always_skipped() {
        let f = filter(&WalkOptions::new());
        assert!(f.is_skipped_path(Path::new(".git")));
        assert!(f.is_skipped_path(Path::new("sub/.git/config")));
        assert!(!f.is_skipped_path(Path::new(".gitignore")));
    }

    #[test]
    fn keys_join_components_with_forward_slashes() {
        assert_eq!(key_of(Path::new("a/./b//c.txt")), "a/b/c.txt");
        assert_eq!(key_of(Path::new("")), "");
    }

    #[test]
    fn an_invalid_glob_is_a_usage_error_naming_it() {
        let result = Filter::new(&std::env::temp_dir(), &WalkOptions::new().exclude("a["));
        let Err(err) = result.map(|_| ()) else {
            unreachable!("an invalid glob is refused");
        };
        assert_eq!(err.kind(), weir_actors::ErrorKind::Usage);
        assert!(err.to_string().contains("\"a[\""), "{err}");
    }

    #[test]
    fn problems_with_the_same_key_are_merged_and_win_over_files() {
        let item = |key: &str, error: Option<&str>| Found {
            key: key.into(),
            path: PathBuf::from(key),
            size: 3,
            modified: None,
            error: error.map(str::to_owned),
            unlisted_dir: false,
        };
        let files = merge(
            vec![
                item("b", None),
                item("a", None),
                item("b", Some("bad pattern")),
                item("c", Some("one")),
                item("c", Some("two")),
            ],
            None,
        );
        let summary: Vec<(&str, Option<&str>, u64)> = files
            .iter()
            .map(|f| (f.key(), f.error(), f.size()))
            .collect();
        assert_eq!(
            summary,
            [
                ("a", None, 3),
                ("b", Some("bad pattern"), 0),
                ("c", Some("one; two"), 0)
            ]
        );
    }

    #[test]
    fn a_saved_cache_loads_back_and_a_damaged_one_loads_empty() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let cache = FingerprintCache::new();
        let old = SystemTime::UNIX_EPOCH + Duration::new(1_600_000_000, 123);
        let fp = Fingerprint::from_bytes(b"x");
        cache.store(Path::new("/a/b"), 1, old, fp, SystemTime::now());
        let file = dir.path().join("cache");
        cache.save(&file)?;
        let loaded = FingerprintCache::load(&file);
        assert_eq!(loaded.lookup(Path::new("/a/b"), 1, old), Some(fp));
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
        cache.store(Path::new("/a"), 1, now, fp, now);
        assert!(cache.is_empty());
        let old = now - Duration::from_secs(60);
        cache.store(Path::new("/a"), 1, old, fp, now);
        assert_eq!(cache.lookup(Path::new("/a"), 1, old), Some(fp));
        assert_eq!(cache.lookup(Path::new("/a"), 2, old), None);
        assert_eq!(cache.lookup(Path::new("/a"), 1, now), None);
    }
}
