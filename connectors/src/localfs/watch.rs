//! The local-directory watcher: the keys of the files that changed under a
//! root, in debounced batches, from the operating system's notifications
//! (`notify`'s recommended watcher: inotify, FSEvents, ReadDirectoryChangesW).

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsStr;
use std::fmt;
use std::fs;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ignore::gitignore::{Gitignore, GitignoreBuilder};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use weir_actors::{Error, Result};

use super::source::{key_of, Filter};
use super::WalkOptions;

/// What the notification thread tells the watcher.
enum Notice {
    /// These keys changed.
    Changed(Vec<String>),
    /// Events were lost (or the watcher failed): anything may have changed.
    Rescan,
}

/// How many debounce intervals a batch of changes may keep growing before
/// it is reported anyway.
pub const MAX_DEBOUNCE_ROUNDS: u32 = 10;

/// Watches a directory tree and reports, in debounced batches, the keys of
/// the files that changed under it (created, modified, removed, renamed).
///
/// The keys are those of [`walk_dir`](super::walk_dir): paths relative to
/// the root with `/` separators. The selection of [`WalkOptions`] applies:
/// events under `.git`, under an excluded path or matching an exclude glob
/// are dropped, and include globs drop events on files they do not select.
///
/// With [`WalkOptions::gitignore`] on, events on what the ignore files
/// ignore are dropped too, as in the walk: the `.gitignore` and `.ignore`
/// files of the root and of every directory below it (and a repository's
/// `.git/info/exclude`), each applying to its own directory and below. They
/// are read when an event first needs them and read again after they
/// change, so a change to one applies to the events that follow it. A
/// change to an ignore file is itself reported (even when the globs do not
/// select the file, but not when its directory is excluded or ignored):
/// the files it ignores or brings back are only known to a new walk.
///
/// A directory that appeared (created, or moved in) is reported as the
/// selected files it holds when the batch is returned, including those
/// written before the operating system watched it.
///
/// # Caveats
///
/// - A batch is a hint, not a diff: it may name a key that no longer
///   exists, a directory that was removed or moved out as a whole (its
///   files are not listed), or an ignore file that the globs do not select.
///   Walk again to learn the current state.
/// - When the operating system drops events (its queue overflowed), the
///   batch is empty: something changed, and only a new walk tells what.
/// - Changes made through a symbolic link to a directory outside the root
///   are not reported.
pub struct DirWatcher {
    /// Kept alive: dropping it stops the notifications.
    _watcher: notify::RecommendedWatcher,
    events: mpsc::UnboundedReceiver<Notice>,
    selection: Arc<Selection>,
    /// The keys of the batch being collected, kept across cancelled calls.
    pending: BTreeSet<String>,
    /// Whether the batch being collected is a rescan.
    pending_rescan: bool,
}

impl DirWatcher {
    /// Starts watching `root` recursively.
    ///
    /// Events for paths excluded by `options` (exclude globs,
    /// [`WalkOptions::exclude_path`] entries, `.git`) are dropped, and
    /// include globs filter files too (a path that no longer exists passes
    /// them, since it may have been a directory).
    ///
    /// # Errors
    /// As [`walk_dir`](super::walk_dir) for the root and the globs, and an
    /// error naming the directory when the operating system refuses to
    /// watch it (on Linux, too many inotify watches, say).
    pub fn new(root: impl AsRef<Path>, options: &WalkOptions) -> Result<DirWatcher> {
        let filter = Filter::new(root.as_ref(), options)?;
        let root = filter.root.clone();
        let selection = Arc::new(Selection {
            filter,
            gitignore: options.respects_gitignore(),
            rules: Mutex::default(),
        });
        let (tx, events) = mpsc::unbounded_channel();
        let handler = {
            let selection = Arc::clone(&selection);
            move |event: notify::Result<notify::Event>| {
                let notice = match event {
                    Ok(event) if event.need_rescan() => {
                        selection.forget_all_rules();
                        Some(Notice::Rescan)
                    }
                    Ok(event) => selection.keys(&event).map(Notice::Changed),
                    Err(_) => {
                        selection.forget_all_rules();
                        Some(Notice::Rescan)
                    }
                };
                if let Some(notice) = notice {
                    // The channel is closed only when the watcher is dropped.
                    let _ = tx.send(notice);
                }
            }
        };
        let mut watcher =
            notify::recommended_watcher(handler).map_err(|e| watch_error(&root, &e))?;
        watcher
            .watch(&root, RecursiveMode::Recursive)
            .map_err(|e| watch_error(&root, &e))?;
        Ok(DirWatcher {
            _watcher: watcher,
            events,
            selection,
            pending: BTreeSet::new(),
            pending_rescan: false,
        })
    }

    /// Waits for the next batch of changes: waits for at least one relevant
    /// event, then keeps collecting until `debounce` passes without a new
    /// one, or [`MAX_DEBOUNCE_ROUNDS`] times `debounce` has passed. Returns
    /// the changed keys, sorted and deduplicated; an empty batch means
    /// events were lost and anything may have changed.
    ///
    /// Directories in the batch that exist are listed (on tokio's blocking
    /// pool) and replaced by their selected files.
    ///
    /// Returns `None` when the watcher has stopped (its notification thread
    /// is gone); a batch collected until then is returned first.
    ///
    /// Cancel-safe: when the future is dropped (in a `tokio::select!`),
    /// the events collected so far are kept for the next call.
    pub async fn changed(&mut self, debounce: Duration) -> Option<Vec<String>> {
        if self.pending.is_empty() && !self.pending_rescan {
            let notice = self.events.recv().await?;
            self.absorb(notice);
        }
        // Until `debounce` passes quietly, or the channel closes; but never
        // longer than `MAX_DEBOUNCE_ROUNDS` debounces, so that a file
        // written without pause (a log) cannot hold every change back.
        let deadline = tokio::time::Instant::now() + debounce * MAX_DEBOUNCE_ROUNDS;
        while let Ok(Some(notice)) = tokio::time::timeout(
            debounce.min(deadline.saturating_duration_since(tokio::time::Instant::now())),
            self.events.recv(),
        )
        .await
        {
            self.absorb(notice);
            if tokio::time::Instant::now() >= deadline {
                break;
            }
        }
        if self.pending_rescan {
            self.pending.clear();
            self.pending_rescan = false;
            return Some(Vec::new());
        }
        // `pending` is cleared only once the listing is done, so a call
        // cancelled while it runs loses nothing.
        let keys = self.pending.clone();
        let selection = Arc::clone(&self.selection);
        let listed = tokio::task::spawn_blocking(move || Selection::expand(selection, keys)).await;
        let keys = std::mem::take(&mut self.pending);
        Some(listed.unwrap_or_else(|_| keys.into_iter().collect()))
    }

    fn absorb(&mut self, notice: Notice) {
        match notice {
            Notice::Changed(keys) => self.pending.extend(keys),
            Notice::Rescan => self.pending_rescan = true,
        }
    }
}

impl fmt::Debug for DirWatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirWatcher")
            .field("root", &self.selection.filter.root)
            .field("pending", &self.pending)
            .field("pending_rescan", &self.pending_rescan)
            .finish_non_exhaustive()
    }
}

/// Decides which keys an event changed (on the notification thread), and
/// lists new directories (on a blocking thread).
struct Selection {
    filter: Filter,
    /// Whether ignore files apply.
    gitignore: bool,
    /// The ignore rules of the directories events were met in.
    rules: Mutex<RulesCache>,
}

/// The ignore rules of directories, keyed by their path relative to the
/// root (empty for the root), read when first needed.
#[derive(Default)]
struct RulesCache {
    dirs: HashMap<PathBuf, Arc<DirRules>>,
    /// Counts the times rules were forgotten: rules read while some were
    /// may be stale, and are not kept.
    generation: u64,
}

/// The ignore files of one directory, as the walk reads them.
struct DirRules {
    /// `.ignore`: its matches win over those of the others.
    ignore: Option<Gitignore>,
    /// `.gitignore`.
    gitignore: Option<Gitignore>,
    /// `.git/info/exclude`, in a repository's top directory.
    exclude: Option<Gitignore>,
}

impl DirRules {
    /// The rules of the directory at `dir`.
    fn read(dir: &Path) -> DirRules {
        DirRules {
            ignore: ignore_file(dir, ".ignore"),
            gitignore: ignore_file(dir, ".gitignore"),
            exclude: ignore_file(dir, ".git/info/exclude"),
        }
    }
}

/// The rules of the ignore file at `dir/name`, applying below `dir`, when
/// there is one and it has any.
fn ignore_file(dir: &Path, name: &str) -> Option<Gitignore> {
    let path = dir.join(name);
    if !path.is_file() {
        return None;
    }
    let mut builder = GitignoreBuilder::new(dir);
    // A file that fails to parse in part keeps the lines that did (the
    // walk reports the others).
    let _ = builder.add(path);
    builder.build().ok().filter(|g| !g.is_empty())
}

/// Whether a file name is that of an ignore file in a directory.
fn is_ignore_file_name(name: Option<&OsStr>) -> bool {
    name.is_some_and(|n| n == ".gitignore" || n == ".ignore")
}

impl Selection {
    /// The selected keys of the event's paths, or `None` when there is none.
    fn keys(&self, event: &notify::Event) -> Option<Vec<String>> {
        if matches!(event.kind, EventKind::Access(_)) {
            return None;
        }
        for path in &event.paths {
            self.forget_rules(path);
        }
        let keys: Vec<String> = event
            .paths
            .iter()
            .filter_map(|path| self.key(path))
            .collect();
        (!keys.is_empty()).then_some(keys)
    }

    /// The key of `path` when the options select it.
    fn key(&self, path: &Path) -> Option<String> {
        let filter = &self.filter;
        let relative = filter.relative(path)?;
        if relative.as_os_str().is_empty() || filter.is_skipped_path(relative) {
            return None;
        }
        let key = key_of(relative);
        if filter.excludes_a_parent(&key) {
            return None;
        }
        let metadata = fs::metadata(path).ok();
        let is_dir = metadata.as_ref().is_some_and(fs::Metadata::is_dir);
        if self.gitignore && !is_dir && is_ignore_file_name(relative.file_name()) {
            // It applies wherever its directory is walked, whatever the
            // globs say of the file itself.
            let parent = relative.parent().unwrap_or(Path::new(""));
            let walked = parent.as_os_str().is_empty() || !self.is_ignored(parent, true);
            return walked.then_some(key);
        }
        let selected = match &metadata {
            Some(_) if is_dir => !filter.excludes_dir(&key),
            Some(_) => !filter.excludes_file(&key) && filter.includes_file(&key),
            // Gone: it may have been a file or a directory.
            None => !filter.excludes_file(&key),
        };
        (selected && !self.is_ignored(relative, is_dir)).then_some(key)
    }

    /// Whether the ignore files ignore the entry at `relative` (a directory
    /// when `is_dir`), or one of the directories above it, as the walk
    /// decides: for each, the match of the deepest `.ignore` that has one,
    /// else of the deepest `.gitignore`, else of an exclude file.
    fn is_ignored(&self, relative: &Path, is_dir: bool) -> bool {
        if !self.gitignore {
            return false;
        }
        let names: Vec<&OsStr> = relative
            .components()
            .filter_map(|c| match c {
                Component::Normal(name) => Some(name),
                _ => None,
            })
            .collect();
        let mut chain = vec![self.rules_of(Path::new(""))];
        let mut entry = PathBuf::new();
        for (i, name) in names.iter().enumerate() {
            entry.push(name);
            let last = i + 1 == names.len();
            let path = self.filter.root.join(&entry);
            if matched(&chain, &path, !last || is_dir) {
                return true;
            }
            if !last {
                chain.push(self.rules_of(&entry));
            }
        }
        false
    }

    /// The ignore rules of the directory at `relative`.
    fn rules_of(&self, relative: &Path) -> Arc<DirRules> {
        let generation = {
            let cache = self.lock_rules();
            if let Some(rules) = cache.dirs.get(relative) {
                return Arc::clone(rules);
            }
            cache.generation
        };
        let rules = Arc::new(DirRules::read(&self.filter.root.join(relative)));
        let mut cache = self.lock_rules();
        if cache.generation == generation {
            cache
                .dirs
                .insert(relative.to_path_buf(), Arc::clone(&rules));
        }
        rules
    }

    /// Forgets the rules an event at `path` may have changed: those of the
    /// directory of an ignore file, of a repository whose `.git` changed,
    /// and of a directory (and those below it) that appeared or went.
    fn forget_rules(&self, path: &Path) {
        if !self.gitignore {
            return;
        }
        let Some(relative) = self.filter.relative(path) else {
            return;
        };
        let repository = relative
            .components()
            .position(|c| c.as_os_str() == ".git")
            .map(|at| relative.components().take(at).collect::<PathBuf>());
        let mut cache = self.lock_rules();
        if let Some(dir) = repository {
            cache.generation += 1;
            cache.dirs.remove(&dir);
        } else if is_ignore_file_name(relative.file_name()) {
            cache.generation += 1;
            let dir = relative.parent().unwrap_or(Path::new(""));
            cache.dirs.remove(dir);
        } else if cache.dirs.contains_key(relative) || path.is_dir() {
            cache.generation += 1;
            cache.dirs.retain(|dir, _| !dir.starts_with(relative));
        }
    }

    /// Forgets every directory's rules (events were lost).
    fn forget_all_rules(&self) {
        let mut cache = self.lock_rules();
        cache.generation += 1;
        cache.dirs.clear();
    }

    fn lock_rules(&self) -> MutexGuard<'_, RulesCache> {
        // The cache stays consistent whatever panicked while holding it.
        self.rules.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The keys, with each existing directory replaced by the selected
    /// files under it (excluded directories are not descended into).
    fn expand(self: Arc<Self>, keys: BTreeSet<String>) -> Vec<String> {
        let mut expanded = BTreeSet::new();
        for key in keys {
            let path = self.filter.root.join(&key);
            if !path.is_dir() {
                expanded.insert(key);
                continue;
            }
            let selection = Arc::clone(&self);
            let walk = ignore::WalkBuilder::new(&path)
                .standard_filters(false)
                .follow_links(true)
                .filter_entry(move |entry| {
                    entry.depth() == 0 || selection.key(entry.path()).is_some()
                })
                .build();
            for entry in walk.flatten() {
                if entry.file_type().is_some_and(|t| t.is_file()) {
                    expanded.extend(self.key(entry.path()));
                }
            }
        }
        expanded.into_iter().collect()
    }
}

/// Whether the rules of `chain` (the directories above `path`, the root
/// first) ignore `path`.
fn matched(chain: &[Arc<DirRules>], path: &Path, is_dir: bool) -> bool {
    let deepest = |file: fn(&DirRules) -> Option<&Gitignore>| {
        chain.iter().rev().find_map(|rules| {
            let found = file(rules)?.matched(path, is_dir);
            (!found.is_none()).then_some(found.is_ignore())
        })
    };
    deepest(|r| r.ignore.as_ref())
        .or_else(|| deepest(|r| r.gitignore.as_ref()))
        .or_else(|| deepest(|r| r.exclude.as_ref()))
        .unwrap_or(false)
}

fn watch_error(root: &Path, e: &notify::Error) -> Error {
    Error::msg(format!(
        "cannot watch localfs source directory `{}`: {e}",
        root.display()
    ))
}
