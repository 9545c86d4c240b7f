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
//!
//! This file holds the walk ([`walk_dir`], [`WalkOptions`]); [`filter`]
//! the selection rules, [`file`](mod@file) the items ([`SourceFile`]) and [`cache`]
//! the [`FingerprintCache`].

mod cache;
mod file;
mod filter;

use cache::FileIdentity;
pub use cache::FingerprintCache;
pub use file::SourceFile;
pub(super) use filter::{key_of, Filter};

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use weir_actors::Result;

/// How recent a modification time (or, on Unix, status-change time) must be
/// for a fingerprint not to be stored in a [`FingerprintCache`]: a file
/// written this close to the moment it is read could be written again within
/// the same tick of the file system's clock, keeping its size and times
/// while its content changes. Two seconds cover the coarsest common clocks
/// (FAT).
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
/// - A leading `/` (or `./`) anchors the glob at the root (`/README.md`);
///   a trailing `/` is dropped.
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
    /// size and modification time (and, on Unix, inode and status-change
    /// time), and stores what it computes.
    #[must_use]
    pub fn fingerprint_cache(mut self, cache: FingerprintCache) -> Self {
        self.cache = Some(cache);
        self
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
    identity: FileIdentity,
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
        .map(|f| SourceFile::found(f, cache))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_with_the_same_key_are_merged_and_win_over_files() {
        let item = |key: &str, error: Option<&str>| Found {
            key: key.into(),
            path: PathBuf::from(key),
            size: 3,
            modified: None,
            identity: FileIdentity::default(),
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
}
