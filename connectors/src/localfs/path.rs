//! Paths: the directory's identity, and the checks every file path passes.
//!
//! Two kinds of check, both run at declare time and again in the sink:
//!
//! - [`file_key`] is lexical and pure: it rejects empty and absolute paths,
//!   `..` components, NUL bytes and non-UTF-8 names, and returns the path
//!   with forward slashes (the file's key).
//! - [`check_within`] reads the file system: it follows the symbolic links
//!   that already exist along the path and rejects the path when one of them
//!   leads outside the directory (or nowhere).

use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use weir_actors::{Error, Result};

/// The directory's path made absolute, which is its identity (its key).
///
/// The path is made absolute against the current directory with
/// [`std::path::absolute`], without touching the file system: symbolic
/// links are not resolved and `..` components are kept (resolving them
/// lexically could name another directory than the one the system would
/// open). `.` components, repeated and trailing separators are dropped, so
/// `out`, `./out/` and `<cwd>/out` are one directory.
///
/// # Errors
/// When the path is empty, holds a NUL byte or is not valid UTF-8 (the key
/// is a string), or the current directory cannot be read.
pub(crate) fn normalize_root(path: &Path) -> Result<PathBuf> {
    let shown = path.display();
    let text = path.to_str().ok_or_else(|| {
        Error::permanent(format!(
            "localfs directory {shown:?} is rejected: its path is not valid UTF-8"
        ))
    })?;
    if text.is_empty() {
        return Err(Error::permanent(
            "localfs directory path is rejected: it is empty",
        ));
    }
    if text.contains('\0') {
        return Err(Error::permanent(format!(
            "localfs directory {text:?} is rejected: its path contains a NUL byte"
        )));
    }
    let absolute = std::path::absolute(path).map_err(|e| {
        Error::msg(format!(
            "localfs directory {text:?}: cannot make the path absolute: {e}"
        ))
    })?;
    Ok(absolute.components().collect())
}

/// The key of the directory at `root` (already normalized): its path as a
/// string.
pub(crate) fn root_key(root: &Path) -> Result<String> {
    root.to_str().map(str::to_owned).ok_or_else(|| {
        Error::permanent(format!(
            "localfs directory {:?} is rejected: its path is not valid UTF-8",
            root.display()
        ))
    })
}

/// Checks a file path relative to the directory `root` and returns its key:
/// its normal components joined with `/`. `.` components, repeated and
/// trailing separators are dropped.
///
/// # Errors
/// A permanent error naming the directory and the path when the path is
/// empty, absolute, has a `..` component, holds a NUL byte or is not valid
/// UTF-8.
pub(crate) fn file_key(root: &Path, relative: &Path) -> Result<String> {
    let reject = |why: &str| {
        Error::permanent(format!(
            "localfs directory {}: file path {:?} is rejected: {why}",
            root.display(),
            relative.display()
        ))
    };
    let text = relative
        .to_str()
        .ok_or_else(|| reject("it is not valid UTF-8"))?;
    if text.contains('\0') {
        return Err(reject("it contains a NUL byte"));
    }
    if text.is_empty() {
        return Err(reject("it is empty"));
    }
    let mut parts: Vec<&str> = Vec::new();
    for component in relative.components() {
        match component {
            Component::Normal(part) => parts.push(
                part.to_str()
                    .ok_or_else(|| reject("it is not valid UTF-8"))?,
            ),
            Component::CurDir => {}
            Component::ParentDir => return Err(reject("it contains a `..` component")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(reject(
                    "it is absolute; give a path relative to the directory",
                ))
            }
        }
    }
    if parts.is_empty() {
        return Err(reject("it names the directory itself, not a file in it"));
    }
    Ok(parts.join("/"))
}

/// The path of the file `key` (as returned by [`file_key`]) in `root`.
pub(crate) fn file_path(root: &Path, key: &str) -> PathBuf {
    let mut path = root.to_path_buf();
    path.extend(key.split('/'));
    path
}

/// Why a file path leads outside its directory, when it does.
#[derive(Debug)]
pub(crate) struct Escape {
    /// The symbolic link, inside the directory, that leads out.
    link: PathBuf,
    /// Where it leads, when that could be told.
    leads_to: Option<PathBuf>,
}

impl Escape {
    /// The error for a file path that leads outside its directory.
    pub(crate) fn error(&self, root: &Path, key: &str) -> Error {
        let where_to = match &self.leads_to {
            Some(target) => format!("to {}, outside the directory", target.display()),
            None => "nowhere (a dangling link), so it cannot be checked".to_string(),
        };
        Error::permanent(format!(
            "localfs directory {}: file path {key:?} is rejected: it resolves through the symbolic link {} {where_to}",
            root.display(),
            self.link.display(),
        ))
    }
}

/// Follows the symbolic links that exist along `key` (as returned by
/// [`file_key`]) below `root`, and tells whether one leads outside `root`.
///
/// A path whose prefix does not exist yet cannot escape (the missing
/// directories will be created as plain directories); neither can a `root`
/// that does not exist. The final component counts too: a file that is a
/// link to a file outside the directory is an escape. A dangling link is
/// treated as an escape, since where it points cannot be checked.
///
/// # Errors
/// When the file system cannot be read (other than "not found").
pub(crate) fn find_escape(root: &Path, key: &str) -> io::Result<Option<Escape>> {
    let real_root = match fs::canonicalize(root) {
        Ok(real) => real,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut current = real_root.clone();
    let mut shown = root.to_path_buf();
    for part in key.split('/') {
        shown.push(part);
        let candidate = current.join(part);
        let meta = match fs::symlink_metadata(&candidate) {
            Ok(meta) => meta,
            // Nothing there, or a file where the path needs a directory
            // (a file about to be replaced by one): no link further on.
            Err(e) if is_absent(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        if !meta.file_type().is_symlink() {
            current = candidate;
            continue;
        }
        match fs::canonicalize(&candidate) {
            Ok(real) if real.starts_with(&real_root) => current = real,
            Ok(real) => {
                return Ok(Some(Escape {
                    link: shown,
                    leads_to: Some(real),
                }))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(Some(Escape {
                    link: shown,
                    leads_to: None,
                }))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// Whether `e` says the path does not exist: nothing at it, or a
/// non-directory where it needs a directory.
pub(crate) fn is_absent(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// Checks that the file `key` of `root` does not lead outside `root`
/// through existing symbolic links.
///
/// # Errors
/// A permanent error naming the directory, the path and the link when it
/// does; an error naming them when the file system cannot be read.
pub(crate) fn check_within(root: &Path, key: &str) -> Result<()> {
    match find_escape(root, key) {
        Ok(None) => Ok(()),
        Ok(Some(escape)) => Err(escape.error(root, key)),
        Err(e) => Err(Error::msg(format!(
            "localfs directory {}: cannot check file path {key:?}: {e}",
            root.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(relative: &str) -> Result<String> {
        file_key(Path::new("/data/out"), Path::new(relative))
    }

    #[test]
    fn a_relative_path_becomes_a_key_with_forward_slashes() -> Result<()> {
        assert_eq!(key("a.txt")?, "a.txt");
        assert_eq!(key("a/b/c.txt")?, "a/b/c.txt");
        assert_eq!(key("./a//b/./c.txt")?, "a/b/c.txt");
        assert_eq!(key("a/b/")?, "a/b");
        Ok(())
    }

    #[test]
    fn unsafe_relative_paths_are_rejected_naming_the_directory_and_the_path() {
        for (bad, why) in [
            ("", "empty"),
            (".", "directory itself"),
            ("/etc/passwd", "absolute"),
            ("../x", "`..`"),
            ("a/../../x", "`..`"),
            ("a/..", "`..`"),
            ("a\0b", "NUL"),
        ] {
            let err = match key(bad) {
                Ok(k) => panic!("{bad:?} was accepted as {k:?}"), // ok: test
                Err(e) => e,
            };
            let text = err.to_string();
            assert!(text.contains("/data/out"), "{text}");
            assert!(text.contains(&format!("{bad:?}")), "{text}");
            assert!(text.contains(why), "{text}");
            assert!(!err.is_retriable(), "{text}");
        }
    }

    #[test]
    fn the_directory_path_is_made_absolute_without_dots_or_trailing_slashes() -> Result<()> {
        let cwd = std::env::current_dir()?;
        assert_eq!(normalize_root(Path::new("out"))?, cwd.join("out"));
        assert_eq!(normalize_root(Path::new("./out/"))?, cwd.join("out"));
        assert_eq!(
            normalize_root(Path::new("/data//./out/"))?,
            PathBuf::from("/data/out")
        );
        // `..` is kept: resolving it lexically could name another directory.
        assert_eq!(
            normalize_root(Path::new("/data/a/../out"))?,
            PathBuf::from("/data/a/../out")
        );
        assert!(normalize_root(Path::new("")).is_err());
        assert!(normalize_root(Path::new("a\0b")).is_err());
        Ok(())
    }

    #[cfg(unix)]
    #[test]
    fn links_are_followed_and_only_those_leading_outside_are_escapes() -> Result<()> {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir()?;
        let root = tmp.path().join("root");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(root.join("real"))?;
        fs::create_dir_all(&outside)?;
        symlink(&outside, root.join("out_link"))?;
        symlink(root.join("real"), root.join("in_link"))?;
        symlink(outside.join("f.txt"), root.join("file_link"))?;
        symlink(tmp.path().join("missing"), root.join("dangling"))?;

        assert!(check_within(&root, "real/new/file.txt").is_ok());
        assert!(check_within(&root, "in_link/file.txt").is_ok());
        assert!(check_within(&root, "missing/dir/file.txt").is_ok());
        assert!(check_within(&tmp.path().join("nope"), "a/b").is_ok());
        for bad in ["out_link/file.txt", "out_link", "file_link", "dangling/x"] {
            let err = match check_within(&root, bad) {
                Ok(()) => panic!("{bad} was accepted"), // ok: test
                Err(e) => e,
            };
            let text = err.to_string();
            assert!(text.contains(&format!("{bad:?}")), "{text}");
            assert!(text.contains("symbolic link"), "{text}");
            assert!(!err.is_retriable(), "{text}");
        }
        Ok(())
    }
}
