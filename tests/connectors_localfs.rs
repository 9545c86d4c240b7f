//! The local-directory target connector (`weir::connectors::localfs`)
//! against real temporary directories: writes, no-op re-runs, updates,
//! deletes with empty-directory cleanup, input safety, and the directory's
//! own lifecycle.

#![cfg(unix)]

use std::fs;
use std::future::Future;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use weir::connectors::localfs;
use weir::prelude::*;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Bounds anything that could hang.
async fn bounded<T>(fut: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .map_err(|_| Error::msg("timed out after 60s"))?
}

/// A temporary place with a ledger and an app on it.
struct Bench {
    tmp: tempfile::TempDir,
    app: App,
}

impl Bench {
    async fn new() -> Result<Self> {
        let tmp = tempfile::tempdir()?;
        let app = App::builder("localfs-test")
            .ledger_path(tmp.path().join("ledger"))
            .shards(3)
            .retry_policy(RetryPolicy {
                max_attempts: 3,
                initial_backoff: Duration::from_millis(5),
                max_backoff: Duration::from_millis(20),
                call_timeout: Some(Duration::from_secs(10)),
            })
            .build()
            .await?;
        Ok(Self { tmp, app })
    }

    /// A path in the temporary place.
    fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    /// Mounts the directory `dir` and declares `files` in it, in one run.
    async fn sync(&self, dir: &Path, files: &[(&str, &str)]) -> Result<UpdateStats> {
        self.sync_dirs(&[(dir, files)]).await
    }

    /// Mounts each directory and declares its files, in one run.
    async fn sync_dirs(&self, dirs: &[(&Path, &[(&str, &str)])]) -> Result<UpdateStats> {
        let dirs: Vec<(PathBuf, Vec<(String, String)>)> = dirs
            .iter()
            .map(|(dir, files)| (dir.to_path_buf(), owned(files)))
            .collect();
        bounded(self.app.run(move |ctx| async move {
            localfs::register_dir_provider(&ctx)?;
            for (dir, files) in dirs {
                let target = localfs::mount_dir_target(&ctx, &dir).await?;
                for (path, content) in files {
                    target.declare_file(&ctx, &path, content)?;
                }
            }
            Ok(())
        }))
        .await
    }

    /// A run that declares no directory.
    async fn sync_nothing(&self) -> Result<UpdateStats> {
        bounded(
            self.app
                .run(|ctx| async move { localfs::register_dir_provider(&ctx) }),
        )
        .await
    }
}

fn owned(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files
        .iter()
        .map(|(p, c)| (p.to_string(), c.to_string()))
        .collect()
}

fn read(path: &Path) -> Result<String> {
    Ok(fs::read_to_string(path)?)
}

fn inode(path: &Path) -> Result<u64> {
    Ok(fs::metadata(path)?.ino())
}

/// Every entry below `dir`, relative, sorted (directories end with `/`).
fn tree(dir: &Path) -> Result<Vec<String>> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let path = entry.path();
            let rel = path
                .strip_prefix(base)
                .map_err(Error::msg)?
                .to_string_lossy()
                .to_string();
            if entry.file_type()?.is_dir() {
                out.push(format!("{rel}/"));
                walk(base, &path, out)?;
            } else {
                out.push(rel);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    out.sort();
    Ok(out)
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

// ---------------------------------------------------------------------------
// Writes, no-op re-runs, updates
// ---------------------------------------------------------------------------

#[tokio::test]
async fn files_are_written_and_missing_nested_directories_are_created() -> Result<()> {
    let bench = Bench::new().await?;
    let out = bench.path("out");
    assert!(!out.exists());

    bench
        .sync(&out, &[("top.txt", "top"), ("sub/deeper/leaf.txt", "leaf")])
        .await?;

    assert_eq!(read(&out.join("top.txt"))?, "top");
    assert_eq!(read(&out.join("sub/deeper/leaf.txt"))?, "leaf");
    // No temporary file is left behind.
    assert_eq!(
        tree(&out)?,
        strings(&["sub/", "sub/deeper/", "sub/deeper/leaf.txt", "top.txt"])
    );
    Ok(())
}

#[tokio::test]
async fn a_file_whose_content_did_not_change_is_not_written_again() -> Result<()> {
    let bench = Bench::new().await?;
    let out = bench.path("out");
    let files = [("a.txt", "alpha"), ("nested/b.txt", "beta")];
    bench.sync(&out, &files).await?;
    let before = (
        inode(&out.join("a.txt"))?,
        inode(&out.join("nested/b.txt"))?,
    );

    let stats = bench.sync(&out, &files).await?;

    // An atomic rewrite would have renamed a new inode into place.
    let after = (
        inode(&out.join("a.txt"))?,
        inode(&out.join("nested/b.txt"))?,
    );
    assert_eq!(before, after);
    // The two files and the directory itself.
    assert_eq!(stats.unchanged, 3, "stats: {stats:?}");
    assert_eq!(stats.created + stats.updated, 0, "stats: {stats:?}");
    Ok(())
}

#[tokio::test]
async fn a_file_whose_content_changed_is_replaced_by_a_new_file_with_the_new_content() -> Result<()>
{
    let bench = Bench::new().await?;
    let out = bench.path("out");
    bench
        .sync(&out, &[("a.txt", "v1"), ("same.txt", "same")])
        .await?;
    let (a_before, same_before) = (inode(&out.join("a.txt"))?, inode(&out.join("same.txt"))?);

    bench
        .sync(&out, &[("a.txt", "v2"), ("same.txt", "same")])
        .await?;

    assert_eq!(read(&out.join("a.txt"))?, "v2");
    assert_ne!(
        inode(&out.join("a.txt"))?,
        a_before,
        "not renamed into place"
    );
    assert_eq!(inode(&out.join("same.txt"))?, same_before);
    assert_eq!(tree(&out)?, strings(&["a.txt", "same.txt"]));
    Ok(())
}

#[tokio::test]
async fn an_existing_file_weir_did_not_write_is_overwritten() -> Result<()> {
    let bench = Bench::new().await?;
    let out = bench.path("out");
    fs::create_dir_all(&out)?;
    fs::write(out.join("a.txt"), "the user's")?;

    bench.sync(&out, &[("a.txt", "weir's")]).await?;

    assert_eq!(read(&out.join("a.txt"))?, "weir's");
    Ok(())
}

#[tokio::test]
async fn the_directory_is_keyed_by_its_absolute_path_so_another_spelling_is_the_same_directory(
) -> Result<()> {
    let bench = Bench::new().await?;
    let out = bench.path("out");
    bench.sync(&out, &[("a.txt", "a")]).await?;
    let before = inode(&out.join("a.txt"))?;

    let respelled = PathBuf::from(format!("{}/./out/", bench.tmp.path().display()));
    let stats = bench.sync(&respelled, &[("a.txt", "a")]).await?;

    assert_eq!(inode(&out.join("a.txt"))?, before);
    // The file and the directory itself.
    assert_eq!(stats.unchanged, 2, "stats: {stats:?}");
    assert_eq!(stats.deleted, 0, "stats: {stats:?}");
    assert!(out.is_dir());
    Ok(())
}

// ---------------------------------------------------------------------------
// Deletes
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_file_no_longer_declared_is_deleted_with_the_directories_it_leaves_empty() -> Result<()> {
    let bench = Bench::new().await?;
    let out = bench.path("out");
    bench
        .sync(
            &out,
            &[
                ("keep.txt", "k"),
                ("a/b/c.txt", "c"),
                ("a/other/d.txt", "d"),
                ("x/y/z.txt", "z"),
            ],
        )
        .await?;

    let stats = bench
        .sync(&out, &[("keep.txt", "k"), ("a/other/d.txt", "d")])
        .await?;
    assert_eq!(stats.deleted, 2, "stats: {stats:?}");
    assert_eq!(
        tree(&out)?,
        strings(&["a/", "a/other/", "a/other/d.txt", "keep.txt"])
    );

    bench.sync(&out, &[]).await?;
    // The directory itself stays: it is still declared.
    assert_eq!(tree(&out)?, Vec::<String>::new());
    assert!(out.is_dir());
    Ok(())
}

#[tokio::test]
async fn a_file_already_removed_by_hand_is_deleted_without_error() -> Result<()> {
    let bench = Bench::new().await?;
    let out = bench.path("out");
    bench
        .sync(&out, &[("gone/soon.txt", "x"), ("stay.txt", "y")])
        .await?;
    fs::remove_dir_all(out.join("gone"))?;

    let stats = bench.sync(&out, &[("stay.txt", "y")]).await?;

    assert_eq!(stats.failed_components, 0, "stats: {stats:?}");
    assert_eq!(tree(&out)?, strings(&["stay.txt"]));
    Ok(())
}

#[tokio::test]
async fn a_file_moved_between_components_of_one_mount_each_in_the_same_run_is_not_deleted(
) -> Result<()> {
    let bench = Bench::new().await?;
    let out = bench.path("out");

    // Run 1: component "first" declares the file; run 2: "second" does.
    for (run, owner) in [(1, "first"), (2, "second")] {
        let dir = out.clone();
        bounded(bench.app.run(move |ctx| async move {
            let target = localfs::mount_dir_target(&ctx, &dir).await?;
            ctx.mount_each(
                vec!["first", "second"],
                |name| name.to_string(),
                move |ctx, name| {
                    let target = target.clone();
                    async move {
                        target.declare_file(&ctx, format!("{name}.txt"), name)?;
                        if name == owner {
                            target.declare_file(&ctx, "moving/file.txt", "payload")?;
                        }
                        Ok(())
                    }
                },
            )
            .await
        }))
        .await
        .map_err(|e| Error::msg(format!("run {run}: {e}")))?;
        assert_eq!(
            read(&out.join("moving/file.txt"))?,
            "payload",
            "after run {run}"
        );
    }
    assert_eq!(
        tree(&out)?,
        strings(&["first.txt", "moving/", "moving/file.txt", "second.txt"])
    );
    Ok(())
}

/// The error of a run expected to fail.
async fn failure(run: impl Future<Output = Result<UpdateStats>>) -> Result<String> {
    match run.await {
        Ok(stats) => Err(Error::msg(format!("the run succeeded: {stats:?}"))),
        Err(e) => Ok(e.to_string()),
    }
}

#[tokio::test]
async fn a_file_in_the_way_of_a_new_directory_fails_only_that_write_and_loses_nothing() -> Result<()>
{
    let bench = Bench::new().await?;
    let out = bench.path("out");
    bench
        .sync(&out, &[("x", "file"), ("keep.txt", "k")])
        .await?;
    // weir deletes `x` only at the end of a run, after the writes: the
    // write of `x/y` finds it in its way, and says so.
    let err = failure(bench.sync(&out, &[("x/y", "nested"), ("keep.txt", "k")])).await?;
    assert!(err.contains("\"x/y\""), "{err}");
    assert!(err.contains("\"x\" is a file, not a directory"), "{err}");
    assert_eq!(read(&out.join("x"))?, "file");
    // Once the file is gone, the same run goes through.
    fs::remove_file(out.join("x"))?;
    bench
        .sync(&out, &[("x/y", "nested"), ("keep.txt", "k")])
        .await?;
    assert_eq!(tree(&out)?, strings(&["keep.txt", "x/", "x/y"]));
    assert_eq!(read(&out.join("x/y"))?, "nested");
    Ok(())
}

#[tokio::test]
async fn a_directory_in_the_way_of_a_new_file_fails_only_that_write_and_loses_nothing() -> Result<()>
{
    let bench = Bench::new().await?;
    let out = bench.path("out");
    bench
        .sync(&out, &[("x/y", "1"), ("x/z/w", "2"), ("keep.txt", "k")])
        .await?;
    let err = failure(bench.sync(&out, &[("x", "file"), ("keep.txt", "k")])).await?;
    assert!(err.contains("\"x\""), "{err}");
    assert!(err.contains("a directory is at its path"), "{err}");
    assert_eq!(
        tree(&out)?,
        strings(&["keep.txt", "x/", "x/y", "x/z/", "x/z/w"])
    );
    // Once the directory is gone, the file is written and the files that
    // were in it are forgotten without error.
    fs::remove_dir_all(out.join("x"))?;
    let stats = bench
        .sync(&out, &[("x", "file"), ("keep.txt", "k")])
        .await?;
    assert_eq!(stats.deleted, 2, "{stats:?}");
    assert_eq!(tree(&out)?, strings(&["keep.txt", "x"]));
    assert_eq!(read(&out.join("x"))?, "file");
    Ok(())
}

#[tokio::test]
async fn a_directory_holding_a_file_weir_did_not_write_is_never_replaced_by_a_file() -> Result<()> {
    let bench = Bench::new().await?;
    let out = bench.path("out");
    bench.sync(&out, &[("x/y", "1"), ("keep.txt", "k")]).await?;
    fs::write(out.join("x/theirs.txt"), "user data")?;
    let err = failure(bench.sync(&out, &[("x", "file"), ("keep.txt", "k")])).await?;
    assert!(err.contains("\"x\""), "{err}");
    assert_eq!(read(&out.join("x/theirs.txt"))?, "user data");
    Ok(())
}

// ---------------------------------------------------------------------------
// Input safety
// ---------------------------------------------------------------------------

#[tokio::test]
async fn unsafe_file_paths_are_rejected_naming_the_path_and_the_other_files_are_still_written(
) -> Result<()> {
    let bench = Bench::new().await?;
    let out = bench.path("out");
    let absolute = bench.path("absolute.txt").to_string_lossy().to_string();
    let cases: Vec<(&str, String, String)> = vec![
        ("good", "good.txt".into(), "\"good.txt\"".into()),
        ("dotdot", "../escape.txt".into(), "\"../escape.txt\"".into()),
        (
            "deep-dotdot",
            "a/../../escape.txt".into(),
            "\"a/../../escape.txt\"".into(),
        ),
        ("absolute", absolute.clone(), format!("{absolute:?}")),
        ("nul", "bad\0name.txt".into(), "\"bad\\0name.txt\"".into()),
        ("empty", String::new(), "\"\"".into()),
    ];
    let declared: Vec<(String, String)> = cases
        .iter()
        .map(|(name, path, _)| (name.to_string(), path.clone()))
        .collect();

    let dir = out.clone();
    let result = bounded(bench.app.run(move |ctx| async move {
        let target = localfs::mount_dir_target(&ctx, &dir).await?;
        ctx.mount_each(
            declared,
            |(name, _)| name.clone(),
            move |ctx, (_, path)| {
                let target = target.clone();
                async move { target.declare_file(&ctx, path, "content") }
            },
        )
        .await
    }))
    .await;

    let err = match result {
        Ok(stats) => return Err(Error::msg(format!("the run succeeded: {stats:?}"))),
        Err(e) => e,
    };
    let failures = err.failed_components();
    assert_eq!(failures.len(), cases.len() - 1, "{err}");
    for (name, _, shown) in cases.iter().skip(1) {
        let failure = failures
            .iter()
            .find(|f| f.path.to_string() == format!("/{name}"))
            .ok_or_else(|| Error::msg(format!("{name} did not fail: {err}")))?;
        assert!(failure.cause.contains(shown.as_str()), "{name}: {failure}");
        assert!(
            failure.cause.contains(&out.display().to_string()),
            "{name} does not name the directory: {failure}"
        );
        assert!(!failure.retriable, "{name}: {failure}");
    }
    // The good component was written; nothing escaped.
    assert_eq!(tree(&out)?, strings(&["good.txt"]));
    assert!(!bench.path("escape.txt").exists());
    assert!(!Path::new(&absolute).exists());
    Ok(())
}

#[tokio::test]
async fn a_write_through_a_symlink_pointing_outside_the_directory_is_rejected() -> Result<()> {
    let bench = Bench::new().await?;
    let out = bench.path("out");
    let outside = bench.path("outside");
    fs::create_dir_all(&out)?;
    fs::create_dir_all(&outside)?;
    fs::write(outside.join("secret.txt"), "untouched")?;
    symlink(&outside, out.join("linked_dir"))?;
    symlink(outside.join("secret.txt"), out.join("linked_file.txt"))?;
    fs::create_dir_all(out.join("real"))?;
    symlink(out.join("real"), out.join("inner_link"))?;

    let dir = out.clone();
    let result = bounded(bench.app.run(move |ctx| async move {
        let target = localfs::mount_dir_target(&ctx, &dir).await?;
        ctx.mount_each(
            vec![
                ("through-dir", "linked_dir/pwned.txt"),
                ("through-file", "linked_file.txt"),
                ("inside", "inner_link/ok.txt"),
                ("plain", "plain.txt"),
            ],
            |(name, _)| name.to_string(),
            move |ctx, (_, path)| {
                let target = target.clone();
                async move { target.declare_file(&ctx, path, "weir") }
            },
        )
        .await
    }))
    .await;

    let err = match result {
        Ok(stats) => return Err(Error::msg(format!("the run succeeded: {stats:?}"))),
        Err(e) => e,
    };
    let mut failed: Vec<String> = err
        .failed_components()
        .iter()
        .map(|f| f.path.to_string())
        .collect();
    failed.sort();
    assert_eq!(failed, strings(&["/through-dir", "/through-file"]), "{err}");
    let text = err.to_string();
    assert!(text.contains("\"linked_dir/pwned.txt\""), "{text}");
    assert!(text.contains("\"linked_file.txt\""), "{text}");
    assert!(text.contains("symbolic link"), "{text}");
    // Nothing was written outside; links inside the directory are fine.
    assert!(!outside.join("pwned.txt").exists());
    assert_eq!(read(&outside.join("secret.txt"))?, "untouched");
    assert_eq!(read(&out.join("real/ok.txt"))?, "weir");
    assert_eq!(read(&out.join("plain.txt"))?, "weir");
    Ok(())
}

#[tokio::test]
async fn a_symlink_made_after_the_declaration_is_caught_by_the_sink_before_the_write() -> Result<()>
{
    let bench = Bench::new().await?;
    let out = bench.path("out");
    let outside = bench.path("outside");
    fs::create_dir_all(&outside)?;

    let (dir, away) = (out.clone(), outside.clone());
    let result = bounded(bench.app.run(move |ctx| async move {
        // The directory does not exist yet: the declaration passes its check.
        let target = localfs::declare_dir_target(&ctx, &dir)?;
        target.declare_file(&ctx, "sub/pwned.txt", "weir")?;
        // Then, before the component commits, `sub` becomes a link outside.
        fs::create_dir_all(&dir)?;
        symlink(&away, dir.join("sub"))?;
        Ok(())
    }))
    .await;

    let err = match result {
        Ok(stats) => return Err(Error::msg(format!("the run succeeded: {stats:?}"))),
        Err(e) => e,
    };
    let text = err.to_string();
    assert!(text.contains("\"sub/pwned.txt\""), "{text}");
    assert!(text.contains("symbolic link"), "{text}");
    assert!(!outside.join("pwned.txt").exists());
    Ok(())
}

// ---------------------------------------------------------------------------
// The directory's own lifecycle
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_directory_weir_created_is_removed_with_its_files_when_no_longer_declared() -> Result<()>
{
    let bench = Bench::new().await?;
    let out = bench.path("parent/out");
    bench
        .sync(&out, &[("a.txt", "a"), ("sub/b.txt", "b")])
        .await?;
    // A file someone else put in weir's directory goes with it.
    fs::write(out.join("stray.txt"), "stray")?;

    let stats = bench.sync_nothing().await?;

    assert!(!out.exists());
    assert!(bench.path("parent").is_dir(), "only the directory goes");
    assert_eq!(stats.failed_components, 0, "stats: {stats:?}");
    Ok(())
}

#[tokio::test]
async fn a_directory_that_already_existed_is_left_as_it_is_when_no_longer_declared() -> Result<()> {
    let bench = Bench::new().await?;
    let out = bench.path("out");
    fs::create_dir_all(&out)?;
    fs::write(out.join("users.txt"), "the user's")?;
    bench.sync(&out, &[("weirs.txt", "weir's")]).await?;
    // Later runs do not forget that the directory was the user's.
    bench.sync(&out, &[("weirs.txt", "weir's")]).await?;

    bench.sync_nothing().await?;

    assert_eq!(tree(&out)?, strings(&["users.txt", "weirs.txt"]));
    assert_eq!(read(&out.join("users.txt"))?, "the user's");
    Ok(())
}

#[tokio::test]
async fn drop_state_removes_a_directory_weir_created() -> Result<()> {
    let bench = Bench::new().await?;
    let out = bench.path("out");
    bench.sync(&out, &[("a/b.txt", "b")]).await?;

    let stats = bounded(
        bench
            .app
            .drop_state(|ctx| async move { localfs::register_dir_provider(&ctx) }),
    )
    .await?;

    assert!(!out.exists());
    assert_eq!(
        stats.deleted, 1,
        "only the directory's delete runs: {stats:?}"
    );
    Ok(())
}

#[tokio::test]
async fn two_directories_in_one_run_are_written_and_cleaned_up_independently() -> Result<()> {
    let bench = Bench::new().await?;
    let one = bench.path("one");
    let two = bench.path("two");
    bench
        .sync_dirs(&[
            (&one, &[("a.txt", "1a"), ("shared/name.txt", "1")]),
            (&two, &[("b.txt", "2b"), ("shared/name.txt", "2")]),
        ])
        .await?;
    assert_eq!(read(&one.join("shared/name.txt"))?, "1");
    assert_eq!(read(&two.join("shared/name.txt"))?, "2");
    let one_a = inode(&one.join("a.txt"))?;

    // The same relative path in the other directory is another file.
    bench
        .sync_dirs(&[
            (&one, &[("a.txt", "1a"), ("shared/name.txt", "1")]),
            (&two, &[("b.txt", "2b")]),
        ])
        .await?;
    assert_eq!(
        tree(&one)?,
        strings(&["a.txt", "shared/", "shared/name.txt"])
    );
    assert_eq!(tree(&two)?, strings(&["b.txt"]));
    assert_eq!(inode(&one.join("a.txt"))?, one_a);

    // A directory no longer declared goes; the other stays untouched.
    bench
        .sync_dirs(&[(&one, &[("a.txt", "1a"), ("shared/name.txt", "1")])])
        .await?;
    assert!(!two.exists());
    assert_eq!(inode(&one.join("a.txt"))?, one_a);
    Ok(())
}

#[tokio::test]
async fn a_directory_declared_in_the_component_is_created_when_the_component_commits() -> Result<()>
{
    let bench = Bench::new().await?;
    let out = bench.path("declared/out");

    for files in [
        owned(&[("a.txt", "a"), ("b/c.txt", "c")]),
        owned(&[("a.txt", "a")]),
    ] {
        let dir = out.clone();
        bounded(bench.app.run(move |ctx| async move {
            let target = localfs::declare_dir_target(&ctx, &dir)?;
            assert_eq!(target.path(), dir.as_path());
            for (path, content) in files {
                target.declare_file(&ctx, path, content)?;
            }
            Ok(())
        }))
        .await?;
    }

    assert_eq!(tree(&out)?, strings(&["a.txt"]));
    Ok(())
}

#[tokio::test]
async fn a_directory_path_that_cannot_be_a_key_is_rejected() -> Result<()> {
    let bench = Bench::new().await?;
    let result = bounded(bench.app.run(|ctx| async move {
        localfs::mount_dir_target(&ctx, "").await?;
        Ok(())
    }))
    .await;
    let err = match result {
        Ok(stats) => return Err(Error::msg(format!("the run succeeded: {stats:?}"))),
        Err(e) => e,
    };
    assert!(err.to_string().contains("empty"), "{err}");
    Ok(())
}

#[tokio::test]
async fn a_preview_lists_the_writes_and_touches_nothing() -> Result<()> {
    let bench = Bench::new().await?;
    let out = bench.path("out");

    let dir = out.clone();
    let actions = bounded(bench.app.preview(move |ctx| async move {
        let target = localfs::mount_dir_target(&ctx, &dir).await?;
        target.declare_file(&ctx, "a/b.txt", "b")?;
        Ok(())
    }))
    .await?;

    assert!(!out.exists(), "a preview created the directory");
    let files: Vec<String> = actions
        .iter()
        .filter(|a| a.provider != localfs::DIR_PROVIDER_NAME)
        .map(|a| format!("{:?} {}", a.kind, a.key))
        .collect();
    assert_eq!(files, strings(&["Create \"a/b.txt\""]), "{actions:?}");
    Ok(())
}

#[test]
fn a_dir_target_can_be_shared_between_components() {
    fn shareable<T: Clone + Send + Sync + 'static>() {}
    shareable::<localfs::DirTarget>();
}
