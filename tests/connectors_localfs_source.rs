//! The local-directory source (`weir::connectors::localfs::walk_dir`) and
//! watcher (`DirWatcher`) against real temporary directories: keys,
//! selection (globs, ignore files, excluded paths), walk problems as items,
//! lazy and cached fingerprints, and change notifications.

#![cfg(unix)]

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

use weir::connectors::localfs::{
    walk_dir, DirWatcher, FingerprintCache, SourceFile, WalkOptions, FINGERPRINT_CACHE_RACY_WINDOW,
};
use weir::prelude::*;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// How long a watcher test waits for an expected change.
const WATCH_LIMIT: Duration = Duration::from_secs(10);
/// The debounce of the watcher tests.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// What the tests return: any error fails the test with its message.
type TestResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Writes `content` at `root/relative`, creating the parent directories.
fn put(root: &Path, relative: &str, content: &str) -> TestResult {
    let path = root.join(relative);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::write(path, content)?;
    Ok(())
}

/// The keys of the items without a problem.
fn file_keys(items: &[SourceFile]) -> Vec<&str> {
    items
        .iter()
        .filter(|f| f.error().is_none())
        .map(SourceFile::key)
        .collect()
}

/// The keys and messages of the problem items.
fn problems(items: &[SourceFile]) -> Vec<(&str, &str)> {
    items
        .iter()
        .filter_map(|f| f.error().map(|e| (f.key(), e)))
        .collect()
}

/// The item with `key`.
fn item<'a>(items: &'a [SourceFile], key: &str) -> TestResult<&'a SourceFile> {
    items
        .iter()
        .find(|f| f.key() == key)
        .ok_or_else(|| format!("no item {key:?} in {items:?}").into())
}

/// Sets the modification time of the file at `path`.
fn set_modified(path: &Path, time: SystemTime) -> TestResult {
    fs::File::options()
        .write(true)
        .open(path)?
        .set_modified(time)?;
    Ok(())
}

/// Waits until the status-change times of the files at `paths` are older
/// than the fingerprint cache's racy window, so that their fingerprints may
/// be cached (setting a modification time back changes the status-change
/// time, which no call sets back).
fn wait_out_the_racy_window(paths: &[&Path]) -> TestResult {
    use std::os::unix::fs::MetadataExt;
    for path in paths {
        let meta = fs::metadata(path)?;
        let changed = SystemTime::UNIX_EPOCH
            + Duration::new(
                u64::try_from(meta.ctime())?,
                u32::try_from(meta.ctime_nsec())?,
            );
        let settled = changed + FINGERPRINT_CACHE_RACY_WINDOW + Duration::from_millis(10);
        if let Ok(left) = settled.duration_since(SystemTime::now()) {
            std::thread::sleep(left);
        }
    }
    Ok(())
}

/// Whether this process can read files whatever their permissions (root).
fn reads_anything(dir: &Path) -> TestResult<bool> {
    let probe = dir.join("permission-probe");
    fs::write(&probe, "probe")?;
    fs::set_permissions(&probe, fs::Permissions::from_mode(0o000))?;
    let readable = fs::read(&probe).is_ok();
    fs::set_permissions(&probe, fs::Permissions::from_mode(0o644))?;
    fs::remove_file(&probe)?;
    Ok(readable)
}

/// Collects batches until one holds `key`; returns every key seen.
async fn wait_for(watcher: &mut DirWatcher, key: &str) -> TestResult<BTreeSet<String>> {
    let mut seen = BTreeSet::new();
    let waiting = async {
        while !seen.contains(key) {
            match watcher.changed(DEBOUNCE).await {
                Some(batch) => seen.extend(batch),
                None => return Err("the watcher stopped"),
            }
        }
        Ok(())
    };
    match tokio::time::timeout(WATCH_LIMIT, waiting).await {
        Ok(Ok(())) => Ok(seen),
        Ok(Err(stopped)) => Err(stopped.into()),
        Err(_) => Err(format!(
            "no change of {key:?} reported within {WATCH_LIMIT:?}; saw {seen:?}"
        )
        .into()),
    }
}

// ---------------------------------------------------------------------------
// Keys and selection
// ---------------------------------------------------------------------------

#[test]
fn walk_yields_relative_keys_sorted_and_never_absolute() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    put(root, "b.txt", "b")?;
    put(root, "a/z.txt", "z")?;
    put(root, "a/deep/er/x.md", "x")?;
    put(root, "c/.hidden", "h")?;
    fs::create_dir_all(root.join("empty/dir"))?;

    let items = walk_dir(root, &WalkOptions::new())?;

    assert_eq!(
        file_keys(&items),
        ["a/deep/er/x.md", "a/z.txt", "b.txt", "c/.hidden"]
    );
    assert!(problems(&items).is_empty(), "{items:?}");
    for file in &items {
        assert!(!file.key().starts_with('/'), "{}", file.key());
        assert!(file.path().is_absolute());
        assert_eq!(file.path(), root.join(file.key()));
    }
    let x = item(&items, "a/deep/er/x.md")?;
    assert_eq!(x.size(), 1);
    assert!(x.modified().is_some());
    assert_eq!(x.read()?, b"x");
    Ok(())
}

#[test]
fn a_root_given_as_a_relative_path_gives_the_same_keys_and_absolute_paths() -> TestResult {
    let tmp = tempfile::tempdir()?;
    put(tmp.path(), "one/two.txt", "2")?;
    // The temporary directory named from the current directory:
    // `../../tmp/.tmpXXXX`.
    let cwd = std::env::current_dir()?;
    let mut relative = std::path::PathBuf::new();
    for _ in cwd.components().skip(1) {
        relative.push("..");
    }
    relative.push(tmp.path().strip_prefix("/")?);
    assert!(relative.is_relative());

    let items = walk_dir(&relative, &WalkOptions::new())?;

    assert_eq!(file_keys(&items), ["one/two.txt"]);
    assert!(items[0].path().is_absolute());
    assert_eq!(items[0].read()?, b"2");
    Ok(())
}

#[test]
fn include_globs_select_files_and_exclude_globs_win_over_them() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    for key in [
        "README.md",
        "notes.txt",
        "docs/guide.md",
        "docs/api/index.md",
        "docs/api/logo.png",
        "docs/drafts/wip.md",
        "src/lib.rs",
    ] {
        put(root, key, key)?;
    }

    let md = walk_dir(root, &WalkOptions::new().include("**/*.md"))?;
    assert_eq!(
        file_keys(&md),
        [
            "README.md",
            "docs/api/index.md",
            "docs/drafts/wip.md",
            "docs/guide.md"
        ]
    );

    // A glob without '/' matches at any depth; a leading '/' anchors it.
    let anywhere = walk_dir(root, &WalkOptions::new().include("*.md"))?;
    assert_eq!(file_keys(&anywhere), file_keys(&md));
    let anchored = walk_dir(root, &WalkOptions::new().include("/*.md"))?;
    assert_eq!(file_keys(&anchored), ["README.md"]);

    let docs = WalkOptions::new()
        .include("docs/**")
        .include("*.txt")
        .exclude("docs/drafts/**")
        .exclude("*.png");
    let items = walk_dir(root, &docs)?;
    assert_eq!(
        file_keys(&items),
        ["docs/api/index.md", "docs/guide.md", "notes.txt"]
    );

    // `*` does not cross a '/'.
    let shallow = walk_dir(root, &WalkOptions::new().include("docs/*"))?;
    assert_eq!(file_keys(&shallow), ["docs/guide.md"]);
    Ok(())
}

#[test]
fn a_directory_matching_an_exclude_glob_is_not_descended_into() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    put(root, "keep.txt", "k")?;
    put(root, "node_modules/pkg/index.js", "js")?;
    put(root, "a/node_modules/x.js", "js")?;
    // A loop inside the excluded directory would be reported if the walk
    // went in.
    symlink("..", root.join("node_modules/pkg/loop"))?;

    let items = walk_dir(root, &WalkOptions::new().exclude("node_modules"))?;

    assert_eq!(file_keys(&items), ["keep.txt"]);
    assert!(problems(&items).is_empty(), "{items:?}");
    Ok(())
}

#[test]
fn gitignore_files_are_respected_by_default_without_a_git_repository() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    put(root, ".gitignore", "*.log\n/build/\n")?;
    put(root, "sub/.gitignore", "secret.txt\n")?;
    put(root, ".ignore", "scratch/\n")?;
    put(root, "app.log", "log")?;
    put(root, "build/out.bin", "bin")?;
    put(root, "src/main.rs", "fn main() {}")?;
    put(root, "src/debug.log", "log")?;
    put(root, "sub/secret.txt", "s")?;
    put(root, "secret.txt", "not ignored above sub/")?;
    put(root, "scratch/tmp.txt", "t")?;
    assert!(!root.join(".git").exists());

    let items = walk_dir(root, &WalkOptions::new())?;

    assert_eq!(
        file_keys(&items),
        [
            ".gitignore",
            ".ignore",
            "secret.txt",
            "src/main.rs",
            "sub/.gitignore"
        ]
    );
    Ok(())
}

#[test]
fn gitignore_files_are_not_respected_when_turned_off() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    put(root, ".gitignore", "*.log\n")?;
    put(root, "app.log", "log")?;
    put(root, "main.rs", "fn main() {}")?;

    let items = walk_dir(root, &WalkOptions::new().gitignore(false))?;

    assert_eq!(file_keys(&items), [".gitignore", "app.log", "main.rs"]);
    Ok(())
}

#[test]
fn git_metadata_is_always_skipped_but_other_hidden_files_are_walked() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    put(root, ".git/HEAD", "ref: refs/heads/main")?;
    put(root, ".git/objects/ab/cdef", "blob")?;
    put(root, "vendored/.git", "gitdir: ../.git/modules/vendored")?;
    put(root, ".env", "A=1")?;
    put(root, "vendored/lib.rs", "")?;

    for gitignore in [true, false] {
        let items = walk_dir(root, &WalkOptions::new().gitignore(gitignore))?;
        assert_eq!(file_keys(&items), [".env", "vendored/lib.rs"]);
    }
    Ok(())
}

#[test]
fn exclude_path_skips_a_directory_and_a_file_inside_the_root() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    put(root, "doc.md", "d")?;
    put(root, "weir-ledger/db", "sled")?;
    put(root, "weir-ledger/conf", "sled")?;
    put(root, "out.sqlite", "sqlite")?;

    let options = WalkOptions::new()
        .exclude_path(root.join("weir-ledger"))
        .exclude_path(root.join("out.sqlite"));
    let items = walk_dir(root, &options)?;
    assert_eq!(file_keys(&items), ["doc.md"]);

    // The same directory named through a symbolic link outside the root.
    let elsewhere = tempfile::tempdir()?;
    let alias = elsewhere.path().join("ledger-alias");
    symlink(root.join("weir-ledger"), &alias)?;
    let items = walk_dir(root, &WalkOptions::new().exclude_path(&alias))?;
    assert_eq!(file_keys(&items), ["doc.md", "out.sqlite"]);
    Ok(())
}

#[test]
fn files_reached_through_symbolic_links_are_walked() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let outside = tempfile::tempdir()?;
    put(outside.path(), "shared/notes.md", "shared")?;
    put(outside.path(), "single.txt", "one")?;
    let root = tmp.path();
    put(root, "own.txt", "own")?;
    symlink(outside.path().join("shared"), root.join("linked"))?;
    symlink(
        outside.path().join("single.txt"),
        root.join("single-link.txt"),
    )?;

    let items = walk_dir(root, &WalkOptions::new())?;

    assert_eq!(
        file_keys(&items),
        ["linked/notes.md", "own.txt", "single-link.txt"]
    );
    assert_eq!(item(&items, "linked/notes.md")?.read()?, b"shared");
    assert_eq!(item(&items, "single-link.txt")?.size(), 3);
    Ok(())
}

// ---------------------------------------------------------------------------
// Errors and problem items
// ---------------------------------------------------------------------------

#[test]
fn a_missing_root_is_an_error_naming_it() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let missing = tmp.path().join("no-such-dir");

    let err = walk_dir(&missing, &WalkOptions::new()).unwrap_err();

    let text = err.to_string();
    assert!(text.contains("no-such-dir"), "{text}");
    assert!(text.contains("does not exist"), "{text}");
    assert!(DirWatcher::new(&missing, &WalkOptions::new()).is_err());
    Ok(())
}

#[test]
fn a_root_that_is_a_file_is_an_error_naming_it() -> TestResult {
    let tmp = tempfile::tempdir()?;
    put(tmp.path(), "plain.txt", "x")?;

    let err = walk_dir(tmp.path().join("plain.txt"), &WalkOptions::new()).unwrap_err();

    let text = err.to_string();
    assert!(text.contains("plain.txt"), "{text}");
    assert!(text.contains("not a directory"), "{text}");
    Ok(())
}

#[test]
fn an_invalid_glob_is_an_error_naming_the_glob() -> TestResult {
    let tmp = tempfile::tempdir()?;

    let err = walk_dir(tmp.path(), &WalkOptions::new().include("src/[a")).unwrap_err();

    assert_eq!(err.kind(), weir::ErrorKind::Usage);
    assert!(err.to_string().contains("src/[a"), "{err}");
    Ok(())
}

#[test]
fn an_unreadable_file_is_an_item_whose_read_fails_naming_the_key() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    put(root, "fine.txt", "fine")?;
    put(root, "locked/secret.txt", "secret")?;
    let locked = root.join("locked/secret.txt");
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o000))?;

    let items = walk_dir(root, &WalkOptions::new())?;

    assert_eq!(file_keys(&items), ["fine.txt", "locked/secret.txt"]);
    assert_eq!(item(&items, "fine.txt")?.read()?, b"fine");
    let secret = item(&items, "locked/secret.txt")?;
    if reads_anything(root)? {
        eprintln!(
            "!!! SKIPPED the permission assertions of \
             an_unreadable_file_is_an_item_whose_read_fails_naming_the_key: \
             this process can read a file with mode 000 (running as root)"
        );
    } else {
        let err = secret.read().unwrap_err();
        let text = err.to_string();
        assert!(text.contains("`locked/secret.txt`"), "{text}");
        assert!(text.contains("ermission denied"), "{text}");
        assert!(!err.is_retriable());
        assert!(secret.fingerprint().is_err());
    }
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o644))?;
    Ok(())
}

#[test]
fn an_unreadable_directory_is_an_error_item_and_the_walk_goes_on() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    put(root, "fine.txt", "fine")?;
    put(root, "closed/inside.txt", "x")?;
    let closed = root.join("closed");
    fs::set_permissions(&closed, fs::Permissions::from_mode(0o000))?;
    let root_can_read = fs::read_dir(&closed).is_ok();

    let items = walk_dir(root, &WalkOptions::new())?;
    fs::set_permissions(&closed, fs::Permissions::from_mode(0o755))?;

    if root_can_read {
        eprintln!(
            "!!! SKIPPED an_unreadable_directory_is_an_error_item_and_the_walk_goes_on: \
             this process can list a directory with mode 000 (running as root)"
        );
        return Ok(());
    }
    assert_eq!(file_keys(&items), ["fine.txt"]);
    assert_eq!(problems(&items), [("closed", "permission denied")]);
    let closed = items.iter().find(|i| i.key() == "closed").unwrap();
    assert!(closed.is_unlisted_dir(), "the files under it were not seen");
    Ok(())
}

#[test]
fn a_symlink_loop_is_an_error_item_and_the_walk_goes_on() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    put(root, "a/file.txt", "f")?;
    put(root, "top.txt", "t")?;
    symlink("..", root.join("a/up"))?;

    let items = walk_dir(root, &WalkOptions::new())?;

    assert_eq!(file_keys(&items), ["a/file.txt", "top.txt"]);
    let loop_item = item(&items, "a/up")?;
    assert_eq!(loop_item.error(), Some("symbolic link loop: a/up -> ."));
    assert_eq!(loop_item.size(), 0);
    assert!(
        !loop_item.is_unlisted_dir(),
        "its files are walked through the ancestor"
    );
    let err = loop_item.read().unwrap_err().to_string();
    assert!(err.contains("`a/up`"), "{err}");
    assert!(loop_item.fingerprint().is_err());
    Ok(())
}

#[test]
fn a_broken_symlink_is_an_error_item_naming_its_target() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    put(root, "ok.txt", "ok")?;
    symlink("nowhere.txt", root.join("dangling.txt"))?;

    let items = walk_dir(root, &WalkOptions::new())?;

    assert_eq!(file_keys(&items), ["ok.txt"]);
    assert_eq!(
        problems(&items),
        [(
            "dangling.txt",
            "broken symbolic link: dangling.txt -> nowhere.txt"
        )]
    );
    // An excluded broken link is not reported.
    let items = walk_dir(root, &WalkOptions::new().include("*.md"))?;
    assert!(items.is_empty(), "{items:?}");
    Ok(())
}

#[test]
fn a_file_name_that_is_not_utf8_is_an_error_item_with_a_lossy_relative_key() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    put(root, "good.txt", "g")?;
    let bad_file = OsStr::from_bytes(b"bad-\xff.txt");
    fs::write(root.join(bad_file), "b")?;
    let bad_dir = OsStr::from_bytes(b"dir-\xfe");
    fs::create_dir(root.join(bad_dir))?;
    fs::write(root.join(bad_dir).join("inside.txt"), "i")?;

    let items = walk_dir(root, &WalkOptions::new())?;

    assert_eq!(file_keys(&items), ["good.txt"]);
    assert_eq!(
        problems(&items),
        [
            ("bad-\u{fffd}.txt", "file name is not valid UTF-8"),
            ("dir-\u{fffd}", "directory name is not valid UTF-8"),
        ]
    );
    let bad = item(&items, "bad-\u{fffd}.txt")?;
    assert_eq!(bad.path(), root.join(bad_file));
    assert!(bad.read().is_err());
    Ok(())
}

#[test]
fn an_ignore_file_with_a_bad_pattern_is_reported_on_that_file_and_its_other_lines_apply(
) -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    put(root, "sub/.gitignore", "*.log\nx[z-a]\n")?;
    put(root, "sub/app.log", "log")?;
    put(root, "sub/keep.txt", "k")?;

    let items = walk_dir(root, &WalkOptions::new())?;

    assert_eq!(file_keys(&items), ["sub/keep.txt"]);
    let problems = problems(&items);
    assert_eq!(problems.len(), 1, "{problems:?}");
    let (key, message) = problems[0];
    assert_eq!(key, "sub/.gitignore");
    assert!(message.contains("x[z-a]"), "{message}");
    assert!(message.contains("line 2"), "{message}");
    Ok(())
}

// ---------------------------------------------------------------------------
// Fingerprints
// ---------------------------------------------------------------------------

#[test]
fn the_fingerprint_is_that_of_the_content_and_is_computed_only_once() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    let content = "x".repeat(200_000);
    put(root, "big.txt", &content)?;

    let items = walk_dir(root, &WalkOptions::new())?;
    let big = item(&items, "big.txt")?;
    let fingerprint = big.fingerprint()?;
    assert_eq!(fingerprint, Fingerprint::from_bytes(content.as_bytes()));

    // Gone from disk: a second call (on a clone too) does not read it.
    fs::remove_file(root.join("big.txt"))?;
    assert!(big.read().is_err());
    assert_eq!(big.fingerprint()?, fingerprint);
    assert_eq!(big.clone().fingerprint()?, fingerprint);
    Ok(())
}

#[test]
fn a_fingerprint_cache_keeps_fingerprints_but_not_for_a_file_rewritten_in_place() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    put(root, "a.txt", "aaaa")?;
    let path = root.join("a.txt");
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    set_modified(&path, an_hour_ago)?;
    wait_out_the_racy_window(&[&path])?;
    let cache = FingerprintCache::new();
    let options = WalkOptions::new().fingerprint_cache(cache.clone());

    let first = walk_dir(root, &options)?;
    let old = item(&first, "a.txt")?.fingerprint()?;
    assert_eq!(old, Fingerprint::from_bytes(b"aaaa"));
    assert_eq!(cache.len(), 1);

    // A file that did not change is not read again: gone after the walk
    // found it, it still has its fingerprint.
    let second = walk_dir(root, &options)?;
    let kept = tmp.path().join("kept");
    fs::rename(&path, &kept)?;
    assert_eq!(item(&second, "a.txt")?.fingerprint()?, old);
    fs::rename(&kept, &path)?;

    // Same size, same modification time, other bytes: on Unix the status
    // change time moved, so the cache misses and the file is read.
    fs::write(&path, "bbbb")?;
    set_modified(&path, an_hour_ago)?;
    let rewritten = walk_dir(root, &options)?;
    assert_eq!(
        item(&rewritten, "a.txt")?.fingerprint()?,
        Fingerprint::from_bytes(b"bbbb")
    );

    // Another modification time: the cache misses and the file is read.
    set_modified(&path, an_hour_ago + Duration::from_secs(1))?;
    let third = walk_dir(root, &options)?;
    assert_eq!(
        item(&third, "a.txt")?.fingerprint()?,
        Fingerprint::from_bytes(b"bbbb")
    );
    assert_eq!(cache.len(), 1);
    Ok(())
}

#[test]
fn files_swapped_by_renames_keeping_size_and_time_are_read_again() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    for (key, text) in [("a.md", "AAAA"), ("b.md", "BBBB")] {
        put(root, key, text)?;
        set_modified(&root.join(key), an_hour_ago)?;
    }
    wait_out_the_racy_window(&[&root.join("a.md"), &root.join("b.md")])?;
    let cache = FingerprintCache::new();
    let options = WalkOptions::new().fingerprint_cache(cache.clone());
    for file in walk_dir(root, &options)? {
        file.fingerprint()?;
    }
    assert_eq!(cache.len(), 2);

    // Renames keep each file's size and modification time.
    fs::rename(root.join("a.md"), root.join("tmp"))?;
    fs::rename(root.join("b.md"), root.join("a.md"))?;
    fs::rename(root.join("tmp"), root.join("b.md"))?;

    let swapped = walk_dir(root, &options)?;
    assert_eq!(
        item(&swapped, "a.md")?.fingerprint()?,
        Fingerprint::from_bytes(b"BBBB")
    );
    assert_eq!(
        item(&swapped, "b.md")?.fingerprint()?,
        Fingerprint::from_bytes(b"AAAA")
    );
    Ok(())
}

#[test]
fn a_fingerprint_cache_forgets_files_a_later_walk_no_longer_finds() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    for key in ["a.txt", "b.txt"] {
        put(root, key, key)?;
        set_modified(&root.join(key), an_hour_ago)?;
    }
    wait_out_the_racy_window(&[&root.join("a.txt"), &root.join("b.txt")])?;
    let cache = FingerprintCache::new();
    let options = WalkOptions::new().fingerprint_cache(cache.clone());
    for file in walk_dir(root, &options)? {
        file.fingerprint()?;
    }
    assert_eq!(cache.len(), 2);

    fs::remove_file(root.join("b.txt"))?;
    walk_dir(root, &options)?;

    assert_eq!(cache.len(), 1);
    Ok(())
}

#[test]
fn a_fingerprint_cache_skips_files_modified_just_now() -> TestResult {
    let tmp = tempfile::tempdir()?;
    put(tmp.path(), "fresh.txt", "fresh")?;
    let cache = FingerprintCache::new();
    let options = WalkOptions::new().fingerprint_cache(cache.clone());

    let items = walk_dir(tmp.path(), &options)?;

    assert_eq!(
        item(&items, "fresh.txt")?.fingerprint()?,
        Fingerprint::from_bytes(b"fresh")
    );
    assert!(cache.is_empty());
    Ok(())
}

#[test]
fn a_file_rewritten_within_the_racy_window_with_its_size_and_time_kept_is_read_again() -> TestResult
{
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    let path = root.join("a.txt");
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    put(root, "a.txt", "aaaa")?;
    // An old modification time, a status-change time of just now.
    set_modified(&path, an_hour_ago)?;
    let cache = FingerprintCache::new();
    let options = WalkOptions::new().fingerprint_cache(cache.clone());

    let first = walk_dir(root, &options)?;
    assert_eq!(
        item(&first, "a.txt")?.fingerprint()?,
        Fingerprint::from_bytes(b"aaaa")
    );
    // A rewrite within the same tick of the clock would keep the status
    // change time too: the fingerprint must not be kept.
    assert!(cache.is_empty(), "{cache:?}");

    put(root, "a.txt", "bbbb")?;
    set_modified(&path, an_hour_ago)?;
    let second = walk_dir(root, &options)?;
    assert_eq!(
        item(&second, "a.txt")?.fingerprint()?,
        Fingerprint::from_bytes(b"bbbb")
    );

    // Once both times are older than the window, it is kept.
    wait_out_the_racy_window(&[&path])?;
    let third = walk_dir(root, &options)?;
    item(&third, "a.txt")?.fingerprint()?;
    assert_eq!(cache.len(), 1);
    Ok(())
}

#[test]
fn source_types_are_send_sync_and_static() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<SourceFile>();
    assert_send_sync::<FingerprintCache>();
    assert_send_sync::<WalkOptions>();
    fn assert_send<T: Send + 'static>() {}
    assert_send::<DirWatcher>();
}

// ---------------------------------------------------------------------------
// Watching
// ---------------------------------------------------------------------------

#[tokio::test]
async fn the_watcher_reports_a_created_file_and_a_deleted_file() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    put(root, "old.txt", "old")?;
    let mut watcher = DirWatcher::new(root, &WalkOptions::new())?;

    put(root, "sub/new.txt", "new")?;
    let seen = wait_for(&mut watcher, "sub/new.txt").await?;
    assert!(seen.iter().all(|k| !k.starts_with('/')), "{seen:?}");

    fs::remove_file(root.join("old.txt"))?;
    wait_for(&mut watcher, "old.txt").await?;
    Ok(())
}

#[tokio::test]
async fn a_directory_moved_in_is_reported_as_the_files_it_holds() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join("root");
    fs::create_dir(&root)?;
    let staging = tmp.path().join("staging");
    put(&staging, "a.md", "a")?;
    put(&staging, "deep/b.md", "b")?;
    put(&staging, "deep/skip.png", "png")?;
    let options = WalkOptions::new().exclude("*.png");
    let mut watcher = DirWatcher::new(&root, &options)?;

    fs::rename(&staging, root.join("moved"))?;
    let seen = wait_for(&mut watcher, "moved/deep/b.md").await?;

    assert_eq!(
        seen,
        BTreeSet::from(["moved/a.md".to_owned(), "moved/deep/b.md".to_owned()])
    );
    Ok(())
}

#[tokio::test]
async fn the_watcher_drops_changes_under_excluded_paths() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    fs::create_dir_all(root.join("ledger"))?;
    fs::create_dir_all(root.join("build"))?;
    fs::create_dir_all(root.join(".git"))?;
    let options = WalkOptions::new()
        .exclude_path(root.join("ledger"))
        .exclude("build/**")
        .include("*.md");
    let mut watcher = DirWatcher::new(root, &options)?;

    put(root, "ledger/db", "sled")?;
    put(root, "build/deep/out.md", "o")?;
    put(root, ".git/index", "i")?;
    put(root, "notes.txt", "not included")?;
    put(root, "marker.md", "m")?;
    let seen = wait_for(&mut watcher, "marker.md").await?;

    assert_eq!(seen, BTreeSet::from(["marker.md".to_owned()]));
    Ok(())
}

#[tokio::test]
async fn the_watcher_drops_changes_to_what_a_gitignore_in_a_subdirectory_ignores() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    put(root, "sub/.gitignore", "*.log\nbuild/\n")?;
    let mut watcher = DirWatcher::new(root, &WalkOptions::new())?;

    put(root, "sub/a.log", "ignored")?;
    put(root, "sub/build/out.md", "in an ignored directory")?;
    put(root, "sub/deeper/c.log", "ignored below too")?;
    put(root, "top.log", "not ignored above sub/")?;
    put(root, "sub/marker.md", "m")?;
    let mut seen = wait_for(&mut watcher, "sub/marker.md").await?;
    // A directory created is reported as its selected files: none here.
    seen.remove("sub/deeper");

    assert_eq!(
        seen,
        BTreeSet::from(["sub/marker.md".to_owned(), "top.log".to_owned()])
    );
    Ok(())
}

#[tokio::test]
async fn a_change_to_a_gitignore_in_a_subdirectory_is_reported_and_applies_to_later_events(
) -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    fs::create_dir(root.join("sub"))?;
    // The globs do not select the ignore file: its change is reported all
    // the same, since it changes what a walk selects.
    let options = WalkOptions::new().include("*.md");
    let mut watcher = DirWatcher::new(root, &options)?;

    put(root, "sub/.gitignore", "draft.md\n")?;
    wait_for(&mut watcher, "sub/.gitignore").await?;
    put(root, "sub/draft.md", "ignored now")?;
    put(root, "sub/final.md", "f")?;
    let seen = wait_for(&mut watcher, "sub/final.md").await?;
    assert!(!seen.contains("sub/draft.md"), "{seen:?}");

    put(root, "sub/.gitignore", "")?;
    wait_for(&mut watcher, "sub/.gitignore").await?;
    put(root, "sub/draft.md", "not ignored any more")?;
    wait_for(&mut watcher, "sub/draft.md").await?;
    Ok(())
}

#[tokio::test]
async fn the_watcher_debounces_a_burst_into_one_sorted_batch_and_keeps_it_across_cancellation(
) -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    let mut watcher = DirWatcher::new(root, &WalkOptions::new())?;

    // Cancelled before the debounce ends: nothing collected is lost.
    put(root, "b.txt", "b")?;
    let cancelled = tokio::time::timeout(
        Duration::from_secs(1),
        watcher.changed(Duration::from_secs(5)),
    )
    .await;
    assert!(
        cancelled.is_err(),
        "the first call should still be debouncing"
    );
    put(root, "a.txt", "a")?;
    put(root, "a.txt", "a again")?;

    let mut seen = Vec::new();
    tokio::time::timeout(WATCH_LIMIT, async {
        while seen.len() < 2 {
            let batch = watcher
                .changed(Duration::from_millis(300))
                .await
                .expect("the watcher stopped");
            let mut sorted = batch.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(batch, sorted, "a batch is sorted and deduplicated");
            seen.extend(batch);
            seen.sort();
            seen.dedup();
        }
    })
    .await
    .expect("the burst was not reported");
    assert_eq!(seen, ["a.txt", "b.txt"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_written_without_pause_does_not_hold_changes_back_forever() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().to_path_buf();
    let mut watcher = DirWatcher::new(&root, &WalkOptions::new())?;
    let writer_root = root.clone();
    let writer = tokio::spawn(async move {
        for i in 0..200 {
            let _ = std::fs::write(writer_root.join("busy.log"), format!("line {i}\n"));
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    });
    // Debounce 200 ms: the batch is reported after at most 10 rounds (2 s),
    // although the log never pauses for 200 ms.
    let batch = tokio::time::timeout(
        Duration::from_secs(6),
        watcher.changed(Duration::from_millis(200)),
    )
    .await
    .expect("a batch is reported while the writes go on")
    .expect("the watcher stopped");
    writer.abort();
    assert_eq!(batch, ["busy.log"]);
    Ok(())
}
