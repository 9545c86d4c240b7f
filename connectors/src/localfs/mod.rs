//! Local directories on this machine: a target (files weir writes) and a
//! source (files weir reads).
//!
//! As a target, a directory is a container target; its files are its
//! children. The source is described [below](self#source-reading-a-directory).
//!
//! ```no_run
//! # async fn example() -> weir_actors::Result<()> {
//! use weir_actors::App;
//! use weir_connectors::localfs;
//!
//! let app = App::builder("docs").ledger_path("weir-ledger").build().await?;
//! app.run(|ctx| async move {
//!     let out = localfs::mount_dir_target(&ctx, "out").await?;
//!     out.declare_file(&ctx, "index.html", "<h1>hello</h1>")?;
//!     out.declare_file(&ctx, "posts/first.html", "<p>first</p>")?;
//!     Ok(())
//! })
//! .await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Identity
//!
//! A directory's key is its path made absolute against the current
//! directory, without touching the file system ([`std::path::absolute`]):
//! `.` components and repeated or trailing separators are dropped, so
//! `out`, `./out/` and `<cwd>/out` are one directory, but symbolic links and
//! `..` components are not resolved (`a/../out` is another key than `out`,
//! and a directory reached through a link keeps the link's path). A file's
//! key is its path relative to the directory, with forward slashes
//! (`posts/first.html`); its tracking record is the fingerprint of its
//! content, so a file whose content did not change is not written again.
//!
//! # Writes and deletes
//!
//! A file is written atomically: into a temporary file
//! `.<name>.weir-tmp-<random>` in the same directory, flushed to disk, then
//! renamed over the file (an existing file is overwritten and keeps its
//! permissions). Missing subdirectories are created. A file no longer
//! declared is deleted, then the subdirectories that became empty, up to
//! (not including) the directory itself; a file already gone is fine. All
//! file actions of one directory in a run go to one sink, which applies
//! them one after the other with `std::fs` on tokio's blocking pool.
//!
//! Files no longer declared are deleted at the end of a run, after every
//! write (a file may have moved to another component). So a path cannot
//! turn from a file into a directory, or back, in one run: the write of
//! `x/y` finds the old file `x` in its way (or the write of `x` the old
//! directory `x`), and fails its component with a permanent error that
//! names both, leaving everything as it was. Removing the old file or
//! directory by hand lets the next run through.
//!
//! # Input safety
//!
//! A file path is rejected, with a permanent error naming the directory and
//! the path, when it is empty, absolute, contains a `..` component or a NUL
//! byte, is not valid UTF-8, or resolves through a symbolic link existing in
//! the directory to somewhere outside it (or through a dangling link). The
//! check runs when the file is declared and again in the sink just before
//! the write, since links may change in between. A delete never follows a
//! link out of the directory: when the path now leads outside, there is
//! nothing of weir's left to delete.
//!
//! # A directory no longer declared
//!
//! weir remembers whether it created the directory: whether nothing was at
//! the path the first time the directory was declared.
//!
//! - A directory weir created is removed with everything in it (*destroy*).
//! - A directory that already existed is left as it is, files included
//!   (*abandon*): it is the user's, and weir no longer writes to it.
//!
//! Only a run that reaches the directories' handler can do either: one
//! that declares another directory, or calls [`register_dir_provider`]
//! (as does the function given to `App::drop_state`).
//!
//! Whether the directory existed is read when it is declared, so a
//! directory created by someone else between that moment and weir's own
//! creation of it is taken for weir's.
//!
//! # Source: reading a directory
//!
//! [`walk_dir`] lists the files under a directory as [`SourceFile`]s, sorted
//! by key (the path relative to the directory, with `/` separators, as for
//! the target). It follows symbolic links, respects `.gitignore` and
//! `.ignore` files (also outside a git repository), always skips `.git`,
//! and selects with include and exclude globs and excluded paths
//! ([`WalkOptions`]). A problem met on the way (an unreadable directory, a
//! link loop, a name that is not UTF-8) does not stop the walk: it is an
//! item whose [`SourceFile::error`] is set. A file's content is read only
//! when asked for ([`SourceFile::read`], [`SourceFile::fingerprint`]), and
//! a [`FingerprintCache`] shared by successive walks keeps unchanged files
//! (same size and modification time) from being read again.
//!
//! [`DirWatcher`] reports, in debounced batches, the keys that changed under
//! a directory, with the same selection: a live mode walks again after each
//! batch.
//!
//! ```no_run
//! # async fn example() -> weir_actors::Result<()> {
//! use std::time::Duration;
//! use weir_connectors::localfs::{walk_dir, DirWatcher, FingerprintCache, WalkOptions};
//!
//! let options = WalkOptions::new()
//!     .include("**/*.md")
//!     .exclude_path("weir-ledger")
//!     .fingerprint_cache(FingerprintCache::new());
//! let mut watcher = DirWatcher::new("docs", &options)?;
//! loop {
//!     for file in walk_dir("docs", &options)? {
//!         match file.error() {
//!             Some(problem) => eprintln!("skipping {}: {problem}", file.key()),
//!             None => println!("{} {}", file.key(), file.fingerprint()?),
//!         }
//!     }
//!     if watcher.changed(Duration::from_millis(200)).await.is_none() {
//!         break;
//!     }
//! }
//! # Ok(())
//! # }
//! ```

mod action;
mod path;
mod sink;
mod source;
mod target;
mod watch;

pub use source::{
    walk_dir, FingerprintCache, SourceFile, WalkOptions, FINGERPRINT_CACHE_RACY_WINDOW,
};
pub use watch::{DirWatcher, MAX_DEBOUNCE_ROUNDS};

use std::path::Path;
use std::sync::Arc;

use weir_actors::{
    declare_target_state, declare_target_state_with_child, mount_target,
    register_root_target_states_provider, Ctx, Result, StableKey, TargetState, TargetStateProvider,
};

use target::{DirHandler, DirSpec, FileSpec};

/// The name of the root provider of local directories.
pub const DIR_PROVIDER_NAME: &str = "weir/localfs/dir";

/// A local directory declared as a target: declare its files with
/// [`DirTarget::declare_file`].
///
/// Cheap to clone; a clone declares into the same directory, from any
/// component of the run (for example the children of a
/// [`Ctx::mount_each`]).
#[derive(Clone, Debug)]
pub struct DirTarget {
    root: Arc<Path>,
    files: TargetStateProvider<FileSpec>,
}

/// Declares the directory at `path`, commits it at once in a foreground
/// child component (creating it, with its parents, if missing) and returns
/// it ready to declare files into.
///
/// The directory's key is `path` made absolute (see the
/// [module documentation](self#identity)).
///
/// # Errors
/// When `path` is empty, holds a NUL byte or is not valid UTF-8, when the
/// directory is already declared in this run, or when it cannot be created
/// (the child component fails, and so does this call).
pub async fn mount_dir_target(ctx: &Ctx, path: impl AsRef<Path>) -> Result<DirTarget> {
    let root: Arc<Path> = Arc::from(path::normalize_root(path.as_ref())?);
    let existed = {
        let root = Arc::clone(&root);
        sink::blocking(move || Ok(exists(&root))).await?
    };
    let state = dir_state(ctx, &root, existed)?;
    let files = mount_target(ctx, state).await?;
    Ok(DirTarget { root, files })
}

/// Declares the directory at `path` in the current component and returns
/// it. Its files can be declared at once; the directory is created (if
/// missing) when the component commits, before its files are written.
///
/// This reads whether something exists at `path` (one `lstat`) on the
/// calling thread.
///
/// # Errors
/// When `path` is empty, holds a NUL byte or is not valid UTF-8, or the
/// directory is already declared in this run. Return it from the component
/// to fail the component.
pub fn declare_dir_target(ctx: &Ctx, path: impl AsRef<Path>) -> Result<DirTarget> {
    let root: Arc<Path> = Arc::from(path::normalize_root(path.as_ref())?);
    let state = dir_state(ctx, &root, exists(&root))?;
    let files = declare_target_state_with_child(ctx, state)?;
    Ok(DirTarget { root, files })
}

/// Registers the directories' provider in this run without declaring a
/// directory.
///
/// A directory is deleted (or abandoned) by a run that reaches its handler:
/// one that declares some other directory, or that calls this. Call it in a
/// run that declares no directory, and in the function given to
/// [`App::drop_state`](weir_actors::App::drop_state), so that directories
/// no longer declared are cleaned up.
///
/// # Errors
/// When the provider name is registered with another value type.
pub fn register_dir_provider(ctx: &Ctx) -> Result<()> {
    register_root_target_states_provider::<DirSpec, _>(ctx, DIR_PROVIDER_NAME, DirHandler::new())
        .map(|_| ())
}

/// Whether anything (a directory, a file, a link) is at `path`.
fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// Registers the directories' provider and builds the directory's state.
fn dir_state(ctx: &Ctx, root: &Path, existed: bool) -> Result<TargetState<DirSpec>> {
    let key = path::root_key(root)?;
    let dirs = register_root_target_states_provider(ctx, DIR_PROVIDER_NAME, DirHandler::new())?;
    Ok(dirs.target_state(StableKey::Str(Arc::from(key)), DirSpec { existed }))
}

impl DirTarget {
    /// The directory's absolute path: its identity.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Declares that the file `relative_path` of this directory holds
    /// `content`. Subdirectories are created as needed; the file is
    /// written only when its content changed since the last run.
    ///
    /// The path is checked first (see the
    /// [module documentation](self#input-safety)); this reads the file
    /// system (a few `lstat`s) to follow existing symbolic links.
    ///
    /// # Errors
    /// A permanent error naming the directory and the path when the path is
    /// empty, absolute, contains `..` or a NUL byte, is not valid UTF-8, or
    /// resolves through a symbolic link to outside the directory; or when
    /// the file is already declared in this run. The error also fails the
    /// component, even if its code goes on.
    pub fn declare_file(
        &self,
        ctx: &Ctx,
        relative_path: impl AsRef<Path>,
        content: impl Into<Vec<u8>>,
    ) -> Result<()> {
        let checked = path::file_key(&self.root, relative_path.as_ref())
            .and_then(|key| path::check_within(&self.root, &key).map(|()| key));
        let key = match checked {
            Ok(key) => key,
            Err(e) => {
                ctx.fail_component(&e);
                return Err(e);
            }
        };
        let spec = FileSpec {
            content: content.into(),
        };
        declare_target_state(
            ctx,
            self.files
                .target_state_exact(StableKey::Str(Arc::from(key)), spec),
        )
    }
}
