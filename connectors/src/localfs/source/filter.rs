//! The selection rules of a walk: globs, excluded paths, and the
//! problems the walker reports.

use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use weir_actors::{Error, Result};

use super::{FileIdentity, Found, WalkOptions, ROOT_KEY};

/// The selection rules of [`WalkOptions`], compiled against a root.
pub(in crate::localfs) struct Filter {
    /// The root made absolute (`.` components dropped).
    pub(in crate::localfs) root: PathBuf,
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
    pub(in crate::localfs) fn new(root: &Path, options: &WalkOptions) -> Result<Filter> {
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
    pub(in crate::localfs) fn relative<'a>(&self, path: &'a Path) -> Option<&'a Path> {
        path.strip_prefix(&self.root).ok().or_else(|| {
            self.root_canonical
                .as_ref()
                .and_then(|root| path.strip_prefix(root).ok())
        })
    }

    /// Whether the entry at `relative` (under the root) is always skipped:
    /// it is in a `.git` directory, or under an excluded path.
    pub(in crate::localfs) fn is_skipped_path(&self, relative: &Path) -> bool {
        if relative.components().any(|c| c.as_os_str() == ".git") {
            return true;
        }
        self.excluded_relative
            .iter()
            .any(|excluded| relative.starts_with(excluded))
    }

    /// Whether a directory with this key matches an exclude glob.
    pub(in crate::localfs) fn excludes_dir(&self, key: &str) -> bool {
        self.excludes.is_match(key) || self.excluded_dirs.is_match(key)
    }

    /// Whether a file with this key matches an exclude glob.
    pub(in crate::localfs) fn excludes_file(&self, key: &str) -> bool {
        self.excludes.is_match(key)
    }

    /// Whether one of the directories above `key` matches an exclude glob.
    pub(in crate::localfs) fn excludes_a_parent(&self, key: &str) -> bool {
        key.match_indices('/')
            .any(|(at, _)| self.excludes_dir(&key[..at]))
    }

    /// Whether a file with this key is selected by the include globs.
    pub(in crate::localfs) fn includes_file(&self, key: &str) -> bool {
        self.includes.as_ref().is_none_or(|set| set.is_match(key))
    }

    /// The `filter_entry` of the walk: whether to yield (and, for a
    /// directory, descend into) the entry. Directories with a name that is
    /// not valid UTF-8 are skipped and recorded in `unnamed_dirs`.
    pub(super) fn keeps_entry(
        &self,
        entry: &ignore::DirEntry,
        unnamed_dirs: &Mutex<Vec<PathBuf>>,
    ) -> bool {
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
    pub(super) fn file(&self, entry: &ignore::DirEntry) -> Found {
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
                identity: FileIdentity::of(&meta),
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
    pub(super) fn problem(&self, path: Option<&Path>, message: String) -> Found {
        let relative = path
            .and_then(|p| self.relative(p))
            .filter(|r| !r.as_os_str().is_empty());
        Found {
            key: relative.map_or_else(|| ROOT_KEY.to_owned(), key_of),
            path: relative.map_or_else(|| self.root.clone(), |r| self.root.join(r)),
            size: 0,
            modified: None,
            identity: FileIdentity::default(),
            error: Some(message),
            unlisted_dir: false,
        }
    }

    /// Turns an error of the walk into problem items, unless the options
    /// exclude its culprit.
    pub(super) fn push_problems(&self, err: &ignore::Error, out: &mut Vec<Found>) {
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
pub(in crate::localfs) fn key_of(relative: &Path) -> String {
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

/// Anchors or unanchors a glob: a leading `/` or `./` anchors it at the root, a
/// trailing `/` is dropped, and a glob without `/` matches at any depth.
fn normalize_glob(glob: &str) -> String {
    let mut trimmed = glob.strip_suffix('/').unwrap_or(glob);
    // Keys have no `./`: one written as in a shell (even `.//`, `././`)
    // anchors like `/`.
    let mut anchored = false;
    while let Some(rest) = trimmed
        .strip_prefix('/')
        .or_else(|| trimmed.strip_prefix("./"))
    {
        trimmed = rest;
        anchored = true;
    }
    if anchored || trimmed.contains('/') || trimmed.starts_with("**") {
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
        assert_eq!(normalize_glob("./README.md"), "README.md");
        assert_eq!(normalize_glob("./docs/*.md"), "docs/*.md");
        assert_eq!(normalize_glob(".//a.md"), "a.md");
        assert_eq!(normalize_glob("././a.md"), "a.md");
        assert_eq!(normalize_glob("//a.md"), "a.md");
        assert_eq!(normalize_glob("docs/**"), "docs/**");
        assert_eq!(normalize_glob("**/x"), "**/x");

        let f = filter(&WalkOptions::new().include("*.md").include("/top.txt"));
        assert!(f.includes_file("a.md"));
        assert!(f.includes_file("a/b/c.md"));
        assert!(f.includes_file("top.txt"));
        assert!(!f.includes_file("sub/top.txt"));
        assert!(!f.includes_file("a.txt"));

        let f = filter(&WalkOptions::new().include("./docs/*.md"));
        assert!(f.includes_file("docs/a.md"));
        assert!(!f.includes_file("x/docs/a.md"));
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
}
