//! The main job end to end: the `weir` binary syncing a directory into
//! SQLite.
//!
//! `cargo bench --bench file_sync` generates 10k files (`WEIR_BENCH_FILES`)
//! of 1-20 KiB of text in paragraphs, then runs `weir sync` (the release
//! binary, as a user would) phase by phase, each on the ledger and database
//! the previous phase left:
//!
//! - `first`: every file is new;
//! - `nochange`: nothing changed (memoized: no file content is read
//!   beyond fingerprinting, no component code runs, nothing is written);
//! - `change1pct`: 1% of the files have new content.
//!
//! The whole sequence runs `WEIR_BENCH_REPEAT` times (default 3) from
//! scratch; medians are printed. Each phase ends with
//! `RESULT file_sync <phase> secs=<s> ratio_to_first=<r>`.

#[path = "shared/median.rs"]
mod median;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use median::median;

type BenchResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A deterministic pseudo-random text of `size` bytes in paragraphs.
fn text(seed: u64, size: usize) -> String {
    const WORDS: [&str; 12] = [
        "weir",
        "river",
        "stream",
        "declare",
        "target",
        "state",
        "ledger",
        "actor",
        "sink",
        "shard",
        "commit",
        "reconcile",
    ];
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out = String::with_capacity(size + 16);
    while out.len() < size {
        let sentence = rng.usize(5..15);
        for _ in 0..sentence {
            out.push_str(WORDS[rng.usize(..WORDS.len())]);
            out.push(' ');
        }
        out.push_str(if rng.u8(..) < 40 { ".\n\n" } else { ". " });
    }
    out.truncate(size);
    out
}

fn generate(root: &Path, files: usize) -> BenchResult<u64> {
    let mut bytes = 0;
    for i in 0..files {
        let dir = root.join(format!("d{:02}", i % 50));
        std::fs::create_dir_all(&dir)?;
        let size = 1024 + (i * 7919) % (19 * 1024);
        let body = text(i as u64, size);
        bytes += body.len() as u64;
        std::fs::write(dir.join(format!("f{i:05}.md")), body)?;
    }
    Ok(bytes)
}

fn change(root: &Path, files: usize, round: u64) -> BenchResult<usize> {
    let step = 100;
    let mut changed = 0;
    for i in (0..files).step_by(step) {
        let path = root
            .join(format!("d{:02}", i % 50))
            .join(format!("f{i:05}.md"));
        std::fs::write(&path, text(1_000_000 + round * 100_000 + i as u64, 4096))?;
        changed += 1;
    }
    Ok(changed)
}

/// Runs one `weir sync`, returning its wall time.
fn sync(work: &Path) -> BenchResult<Duration> {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args([
            "sync",
            "tree",
            "--into",
            "sqlite://out.db",
            "--ledger",
            "ledger",
        ])
        .current_dir(work)
        .env("RUST_LOG", "warn")
        .output()?;
    let elapsed = started.elapsed();
    if !out.status.success() {
        return Err(format!(
            "weir sync failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    eprintln!("  {}", String::from_utf8_lossy(&out.stdout).trim());
    Ok(elapsed)
}

fn main() -> BenchResult<()> {
    let files = env_usize("WEIR_BENCH_FILES", 10_000);
    let repeat = env_usize("WEIR_BENCH_REPEAT", 3).max(1);
    let tmp = tempfile::tempdir()?;
    let tree = tmp.path().join("tree");
    let bytes = generate(&tree, files)?;
    println!(
        "file_sync: {files} files, {:.1} MiB, {repeat} repeat(s)",
        bytes as f64 / (1024.0 * 1024.0)
    );
    let (mut first, mut nochange, mut change1) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..repeat {
        for leftover in ["out.db", "out.db-wal", "out.db-shm"] {
            let _ = std::fs::remove_file(tmp.path().join(leftover));
        }
        let _ = std::fs::remove_dir_all(tmp.path().join("ledger"));
        first.push(sync(tmp.path())?.as_secs_f64());
        nochange.push(sync(tmp.path())?.as_secs_f64());
        let changed = change(&tree, files, round as u64)?;
        eprintln!("  ({changed} files changed)");
        change1.push(sync(tmp.path())?.as_secs_f64());
    }
    let first = median(first);
    for (phase, secs) in [
        ("first", first),
        ("nochange", median(nochange)),
        ("change1pct", median(change1)),
    ] {
        println!(
            "RESULT file_sync {phase} secs={secs:.3} ratio_to_first={:.3}",
            secs / first
        );
    }
    Ok(())
}
