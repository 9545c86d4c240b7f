//! One file found by a walk, with its fingerprint computed lazily.

use std::fmt;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use weir_actors::{Error, Fingerprint, Result};

use super::{FileIdentity, FingerprintCache, Found};

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
    identity: FileIdentity,
    error: Option<String>,
    unlisted_dir: bool,
    fingerprint: OnceLock<Fingerprint>,
    cache: Option<FingerprintCache>,
}

impl SourceFile {
    /// Shares what the walk found.
    pub(super) fn found(f: Found, cache: Option<&FingerprintCache>) -> SourceFile {
        SourceFile {
            inner: Arc::new(Inner {
                key: f.key,
                path: f.path,
                size: if f.error.is_some() { 0 } else { f.size },
                modified: f.modified,
                identity: f.identity,
                error: f.error,
                unlisted_dir: f.unlisted_dir,
                fingerprint: OnceLock::new(),
                cache: cache.cloned(),
            }),
        }
    }

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
    /// for this path, size, modification time (and, on Unix, inode and
    /// status-change time) is used without reading the file, and a computed
    /// one is stored.
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
        let cached = cache.and_then(|(cache, modified)| {
            cache.lookup(&inner.path, inner.size, modified, inner.identity)
        });
        let fingerprint = match cached {
            Some(fingerprint) => fingerprint,
            None => {
                let read_at = SystemTime::now();
                let fingerprint = File::open(&inner.path)
                    .and_then(Fingerprint::from_reader)
                    .map_err(|e| self.io_error(&e))?;
                if let Some((cache, modified)) = cache {
                    cache.store(
                        &inner.path,
                        inner.size,
                        modified,
                        inner.identity,
                        fingerprint,
                        read_at,
                    );
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
