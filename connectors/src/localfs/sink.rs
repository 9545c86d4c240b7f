//! The sinks: they apply directory and file actions with `std::fs`, on a
//! blocking thread, one action after the other.
//!
//! Every action is idempotent: creating a directory that exists, writing a
//! file that exists (it is overwritten) and deleting one that is gone all
//! succeed, so a retried batch does no harm.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use weir_actors::{ChildTargetDef, Error, Result, TargetAction, TargetActionSink};

use super::action::{DirAction, FileAction};
use super::path;
use crate::observe::{Connector, Tally};

/// The sink of directories (shared by all of them), whose child-handler
/// factory (`files`) gives each directory a files handler with a sink of
/// its own.
pub(crate) fn dir_sink(
    files: fn(&DirAction) -> Result<ChildTargetDef>,
) -> TargetActionSink<DirAction> {
    TargetActionSink::from_async_fn_with_child_handler(
        |actions: Vec<TargetAction<DirAction>>| blocking(move || apply_dir_actions(actions)),
        files,
    )
}

/// The sink of the files of the directory `root`: all its file actions of a
/// run go through it, so they batch together. Calls are applied one at a
/// time, so a delete's cleanup of empty directories never races a write.
pub(crate) fn file_sink(root: Arc<Path>) -> TargetActionSink<FileAction> {
    let lock = Arc::new(Mutex::new(()));
    TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<FileAction>>| {
        let root = Arc::clone(&root);
        let lock = Arc::clone(&lock);
        blocking(move || {
            let _one_at_a_time = lock.lock().unwrap_or_else(PoisonError::into_inner);
            apply_file_actions(&root, actions)
        })
    })
}

/// Runs `work` on tokio's blocking pool (inline when there is no runtime).
///
/// The future does not end before the work does, even when it is dropped
/// (a sink call cancelled after its timeout): the engine calls the same
/// keys again once the cancelled call has stopped, and work left running
/// on the pool could then land after the newer call's.
pub(crate) async fn blocking<T, F>(work: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            let (running, stopped) = std::sync::mpsc::channel::<()>();
            let _wait = WaitForWork(stopped);
            handle
                .spawn_blocking(move || {
                    // Dropped when the work ends (or unwinds, or never starts).
                    let _running = running;
                    work()
                })
                .await
                .map_err(|e| {
                    Error::msg(format!("localfs: a file-system task did not complete: {e}"))
                })?
        }
        Err(_) => work(),
    }
}

/// Waits, when dropped, until the work holding the other end of the
/// channel has ended: at once after a normal completion, for as long as
/// the work takes when a cancelled call drops its future.
struct WaitForWork(std::sync::mpsc::Receiver<()>);

impl Drop for WaitForWork {
    fn drop(&mut self) {
        // Nothing is ever sent: this returns when the sender is dropped.
        let _ = self.0.recv();
    }
}

/// An I/O error as a weir error naming the directory and what failed.
/// Errors that retrying cannot fix (permissions, a directory where a file
/// should be, ...) are permanent.
fn io_error(root: &Path, what: &str, error: &io::Error) -> Error {
    use io::ErrorKind as K;
    let message = format!("localfs directory {}: {what}: {error}", root.display());
    match error.kind() {
        K::PermissionDenied
        | K::ReadOnlyFilesystem
        | K::InvalidInput
        | K::InvalidFilename
        | K::IsADirectory
        | K::NotADirectory
        | K::DirectoryNotEmpty
        | K::AlreadyExists => Error::permanent(message),
        _ => Error::msg(message),
    }
}

fn apply_dir_actions(actions: Vec<TargetAction<DirAction>>) -> Result<()> {
    for action in actions {
        match action {
            TargetAction::Create(dir) | TargetAction::Update(dir) => {
                let root = Path::new(&dir.path);
                fs::create_dir_all(root)
                    .map_err(|e| io_error(root, "cannot create the directory", &e))?;
            }
            TargetAction::Delete(dir) => {
                if dir.remove_tree {
                    remove_tree(Path::new(&dir.path))?;
                }
            }
        }
    }
    Ok(())
}

/// Removes the directory weir created, with everything in it. Something
/// other than a directory at the path (a file, a symbolic link) is not
/// weir's and is left alone; nothing at all is fine.
fn remove_tree(root: &Path) -> Result<()> {
    let meta = match fs::symlink_metadata(root) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error(root, "cannot read the directory", &e)),
    };
    if !meta.is_dir() {
        return Ok(());
    }
    match fs::remove_dir_all(root) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error(root, "cannot remove the directory", &e)),
    }
}

/// Writes and deletes the files of `root` (each file on its own: a file
/// written stays written should a later one fail), timed as one `write`
/// statement: metrics are recorded per call, never per file.
pub(crate) fn apply_file_actions(
    root: &Path,
    actions: Vec<TargetAction<FileAction>>,
) -> Result<()> {
    let target = root.display().to_string();
    let tally = Tally::of_one(&target, &actions);
    let span = LOCALFS.call_span(&target, &tally, actions.len());
    let _in_span = span.enter();
    LOCALFS.timed_now(&target, "write", || write_files(root, actions))?;
    tally.record(LOCALFS);
    Ok(())
}

fn write_files(root: &Path, actions: Vec<TargetAction<FileAction>>) -> Result<()> {
    for action in actions {
        match action {
            TargetAction::Create(file) | TargetAction::Update(file) => {
                let content = file.content.ok_or_else(|| {
                    Error::permanent(format!(
                        "localfs directory {}: write of file {:?} carries no content",
                        root.display(),
                        file.path
                    ))
                })?;
                write_file(root, &file.path, &content)?;
            }
            TargetAction::Delete(file) => delete_file(root, &file.path)?,
        }
    }
    Ok(())
}

/// This connector, as its metrics and spans name it.
const LOCALFS: Connector = Connector::LocalFs;

/// The longest part of a file name kept in its temporary file's name.
const TMP_NAME_PREFIX_MAX: usize = 64;

/// The name of a temporary file for `name`, in the same directory:
/// `.<name>.weir-tmp-<random>`.
fn tmp_name(name: &str) -> String {
    let mut end = name.len().min(TMP_NAME_PREFIX_MAX);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!(".{}.weir-tmp-{:016x}", &name[..end], fastrand::u64(..))
}

/// Writes `content` to the file `key` of `root` atomically: into a
/// temporary file in the same directory, flushed to disk, then renamed over
/// the file. Missing directories are created. The path is checked again
/// first: links may have changed since it was declared.
fn write_file(root: &Path, key: &str, content: &[u8]) -> Result<()> {
    let key = path::file_key(root, Path::new(key))?;
    path::check_within(root, &key)?;
    let target = path::file_path(root, &key);
    let (Some(parent), Some(name)) = (target.parent(), target.file_name()) else {
        return Err(Error::permanent(format!(
            "localfs directory {}: file path {key:?} has no file name",
            root.display()
        )));
    };
    // What stands in the way is looked for only once a write has failed,
    // not before every write.
    let failed = |what: &str, e: &io::Error| match conflict(root, &key, &target) {
        Some(conflict) => Error::permanent(format!(
            "localfs directory {}: cannot write file {key:?}: {conflict}",
            root.display()
        )),
        None => io_error(root, &format!("{what} {key:?}"), e),
    };
    fs::create_dir_all(parent).map_err(|e| failed("cannot create the directories of file", &e))?;
    let tmp = parent.join(tmp_name(&name.to_string_lossy()));
    let written = write_then_rename(&tmp, &target, content);
    if written.is_err() {
        // Best effort: the temporary file may not even exist.
        let _ = fs::remove_file(&tmp);
    }
    written.map_err(|e| failed("cannot write file", &e))?;
    // Best effort: make the rename itself durable.
    if let Ok(dir) = File::open(parent) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// What stands where the file `key` (at `target`) must go: a directory
/// at its path, or a file at the path of one of its directories. weir
/// deletes the files it no longer declares only at the end of a run, after
/// every write, so one of its own files from an earlier run can be in the
/// way too; the message says how to get past it.
fn conflict(root: &Path, key: &str, target: &Path) -> Option<String> {
    if fs::symlink_metadata(target).is_ok_and(|m| m.is_dir()) {
        return Some(format!(
            "a directory is at its path (files of an earlier run are \
             deleted only at the end of a run, after the writes: remove \
             {:?} by hand, or declare the file under another name)",
            target.display().to_string()
        ));
    }
    let mut dir = root.to_path_buf();
    let parts: Vec<&str> = key.split('/').collect();
    let (_, ancestors) = parts.split_last()?;
    for (i, part) in ancestors.iter().enumerate() {
        dir.push(part);
        match fs::symlink_metadata(&dir) {
            Ok(meta) if meta.is_dir() || meta.file_type().is_symlink() => {}
            Ok(_) => {
                let file = ancestors.get(..=i).map(|p| p.join("/")).unwrap_or_default();
                return Some(format!(
                    "{file:?} is a file, not a directory (a file of an \
                     earlier run is deleted only at the end of a run, after \
                     the writes: remove it by hand, or declare the new file \
                     under another name)"
                ));
            }
            Err(_) => return None,
        }
    }
    None
}

fn write_then_rename(tmp: &Path, target: &Path, content: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).create_new(true).open(tmp)?;
    // An overwritten file keeps its permissions.
    if let Ok(meta) = fs::symlink_metadata(target) {
        if meta.is_file() {
            file.set_permissions(meta.permissions())?;
        }
    }
    file.write_all(content)?;
    file.sync_all()?;
    drop(file);
    fs::rename(tmp, target)
}

/// Deletes the file `key` of `root`, then the directories that became
/// empty, up to (not including) `root`. A file already gone is fine.
///
/// Nothing outside `root` is ever deleted: when the path now leads out
/// through a symbolic link, weir's file cannot be there any more (the
/// directory it was in was replaced), so there is nothing to delete. A
/// directory where the file was is not weir's and is left alone too.
fn delete_file(root: &Path, key: &str) -> Result<()> {
    let key = path::file_key(root, Path::new(key))?;
    match path::find_escape(root, &key) {
        Ok(None) => {}
        Ok(Some(_)) => return Ok(()),
        Err(e) => {
            return Err(io_error(
                root,
                &format!("cannot check file path {key:?}"),
                &e,
            ))
        }
    }
    let target = path::file_path(root, &key);
    match fs::symlink_metadata(&target) {
        Ok(meta) if meta.is_dir() => return Ok(()),
        Ok(_) => match fs::remove_file(&target) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_error(root, &format!("cannot delete file {key:?}"), &e)),
        },
        Err(e) if path::is_absent(&e) => {}
        Err(e) => return Err(io_error(root, &format!("cannot read file {key:?}"), &e)),
    }
    remove_empty_parents(root, &target);
    Ok(())
}

/// Removes the directories between `file` and `root` that are empty,
/// deepest first, stopping at the first that is not (or is not a plain
/// directory). `root` itself is kept.
fn remove_empty_parents(root: &Path, file: &Path) {
    let mut dir = file.parent();
    while let Some(current) = dir {
        if current == root || !current.starts_with(root) {
            break;
        }
        match fs::remove_dir(current) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(_) => break,
        }
        dir = current.parent();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &str, content: &str) -> TargetAction<FileAction> {
        TargetAction::Create(FileAction {
            path: path.to_string(),
            content: Some(content.as_bytes().to_vec()),
        })
    }

    fn delete(path: &str) -> TargetAction<FileAction> {
        TargetAction::Delete(FileAction {
            path: path.to_string(),
            content: None,
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_call_ends_only_once_its_blocking_work_has() -> Result<()> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        let call = tokio::spawn(blocking(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            flag.store(true, Ordering::SeqCst);
            Ok(())
        }));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        call.abort();
        // The engine awaits the cancelled call before calling its keys again.
        let joined = call.await;
        assert!(joined.is_err_and(|e| e.is_cancelled()));
        assert!(
            done.load(Ordering::SeqCst),
            "the call ended while its file-system work still ran"
        );
        Ok(())
    }

    #[test]
    fn writes_replace_files_atomically_and_leave_no_temporary_files() -> Result<()> {
        let tmp = tempfile::tempdir()?;
        let root = tmp.path().join("out");
        apply_file_actions(
            &root,
            vec![write("a/b.txt", "one"), write("a/b.txt", "two")],
        )?;
        assert_eq!(fs::read_to_string(root.join("a/b.txt"))?, "two");
        let names: Vec<_> = fs::read_dir(root.join("a"))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<io::Result<_>>()?;
        assert_eq!(names, vec![std::ffi::OsString::from("b.txt")]);
        Ok(())
    }

    #[test]
    fn deletes_are_idempotent_and_remove_empty_parents_but_not_the_root() -> Result<()> {
        let tmp = tempfile::tempdir()?;
        let root = tmp.path().join("out");
        apply_file_actions(&root, vec![write("a/b/c.txt", "x"), write("a/d.txt", "y")])?;
        apply_file_actions(&root, vec![delete("a/b/c.txt"), delete("a/b/c.txt")])?;
        assert!(!root.join("a/b").exists());
        assert!(root.join("a/d.txt").exists());
        apply_file_actions(&root, vec![delete("a/d.txt"), delete("never/was.txt")])?;
        assert!(!root.join("a").exists());
        assert!(root.is_dir());
        Ok(())
    }

    #[cfg(unix)]
    #[test]
    fn the_sink_checks_links_again_and_never_touches_files_outside() -> Result<()> {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir()?;
        let root = tmp.path().join("out");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(&outside)?;
        apply_file_actions(&root, vec![write("sub/f.txt", "mine")])?;
        // The directory is replaced by a link outside after the write.
        fs::remove_dir_all(root.join("sub"))?;
        symlink(&outside, root.join("sub"))?;
        fs::write(outside.join("f.txt"), "theirs")?;

        let err = match apply_file_actions(&root, vec![write("sub/f.txt", "new")]) {
            Ok(()) => panic!("a write through a link outside was accepted"), // ok: test
            Err(e) => e,
        };
        assert!(err.to_string().contains("\"sub/f.txt\""), "{err}");
        assert!(!err.is_retriable(), "{err}");
        apply_file_actions(&root, vec![delete("sub/f.txt")])?;
        assert_eq!(fs::read_to_string(outside.join("f.txt"))?, "theirs");
        Ok(())
    }

    #[test]
    fn a_tree_weir_created_is_removed_and_anything_else_is_left() -> Result<()> {
        let tmp = tempfile::tempdir()?;
        let root = tmp.path().join("out");
        fs::create_dir_all(root.join("a"))?;
        fs::write(root.join("a/f"), "x")?;
        let path = root.to_string_lossy().to_string();
        apply_dir_actions(vec![TargetAction::Delete(DirAction {
            path: path.clone(),
            remove_tree: false,
        })])?;
        assert!(root.join("a/f").exists());
        apply_dir_actions(vec![TargetAction::Delete(DirAction {
            path: path.clone(),
            remove_tree: true,
        })])?;
        assert!(!root.exists());
        apply_dir_actions(vec![TargetAction::Delete(DirAction {
            path,
            remove_tree: true,
        })])?;
        Ok(())
    }

    #[test]
    fn temporary_names_are_hidden_and_bounded() {
        let long = "é".repeat(200);
        let name = tmp_name(&long);
        assert!(name.starts_with('.'));
        assert!(name.len() < 100, "{name}");
        assert!(tmp_name("a.txt").starts_with(".a.txt.weir-tmp-"));
    }
}
