//! What the end-to-end tests of worker groups share (`cli::group`): a
//! tree of files to split, what `documents` must hold for it, the
//! arguments of a member, its `partitions synced:` line, and a member
//! process whose output is read as it runs.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;
use std::process::{Command, ExitStatus, Output};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{doc_of, Doc, Env, PgDatabase};
use crate::cmd::{self, text};

/// Writes `files` small text files under the tree: `d{i % 4}/f{i}.md`.
pub fn generate(env: &Env, files: usize) {
    for i in 0..files {
        env.put(
            &file_name(i),
            format!("file {i}\n\nsecond paragraph of {i}\n"),
        );
    }
}

/// The path under the tree of file `i` of [`generate`].
pub fn file_name(i: usize) -> String {
    format!("d{}/f{i}.md", i % 4)
}

/// What `documents` must hold: every file of the tree.
pub fn expected(root: &Path) -> BTreeMap<String, Doc> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                out.insert(rel, doc_of(&std::fs::read(&path).unwrap()));
            }
        }
    }
    out
}

/// Whether the `documents` table exists and equals the tree.
pub async fn matches_tree(pg: &PgDatabase, env: &Env) -> bool {
    pg.tables().await.iter().any(|t| t == "documents") && pg.docs().await == expected(&env.tree)
}

/// A worker group as its members are started: its name, partition count
/// and lease TTL in seconds.
#[derive(Clone, Copy, Debug)]
pub struct Group<'a> {
    /// The group's name (`--group`).
    pub name: &'a str,
    /// `--partitions`.
    pub partitions: u32,
    /// `--lease-ttl`, in seconds.
    pub lease_ttl: u64,
}

/// The id of member `n`: `member-{n}`.
pub fn member_id(n: usize) -> String {
    format!("member-{n}")
}

/// The arguments of member `n` of `group` syncing the tree into `url`,
/// with a ledger of its own (`ledger-{n}` in the temporary directory).
pub fn member_args(env: &Env, url: &str, group: &Group, n: usize, extra: &[&str]) -> Vec<String> {
    let ledger = env.tmp.path().join(format!("ledger-{n}"));
    let mut args: Vec<String> = vec![
        "sync".into(),
        env.tree.to_str().unwrap().into(),
        "--into".into(),
        url.into(),
        "--ledger".into(),
        ledger.to_str().unwrap().into(),
        "--group".into(),
        group.name.into(),
        "--partitions".into(),
        group.partitions.to_string(),
        "--lease-ttl".into(),
        group.lease_ttl.to_string(),
        "--member-id".into(),
        member_id(n),
    ];
    args.extend(extra.iter().map(ToString::to_string));
    args
}

/// The partitions a member's stdout names as synced by it (its
/// `partitions synced: 0, 3, 7` line), or `None` without that line.
pub fn synced_in(stdout: &str) -> Option<BTreeSet<u32>> {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("partitions synced: "))?;
    if line == "none" {
        return Some(BTreeSet::new());
    }
    Some(
        line.split(", ")
            .map(|part| part.parse::<u32>().unwrap())
            .collect(),
    )
}

/// The partitions a member printed as synced by it.
pub fn synced_by(out: &Output) -> BTreeSet<u32> {
    let stdout = text(&out.stdout);
    synced_in(&stdout)
        .unwrap_or_else(|| panic!("no partitions line in: {stdout}\n{}", text(&out.stderr)))
}

/// An output of a process, read on a thread of its own as the process
/// writes it, so that a process writing much never blocks on a full pipe.
struct Drain {
    bytes: Arc<Mutex<Vec<u8>>>,
    thread: Option<JoinHandle<()>>,
}

impl Drain {
    fn start(mut from: impl Read + Send + 'static) -> Drain {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&bytes);
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = from.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Drain {
            bytes,
            thread: Some(thread),
        }
    }

    /// What was read so far; everything once the process has exited and
    /// [`Drain::finish`] ran.
    fn text(&self) -> String {
        text(&self.bytes.lock().unwrap())
    }

    /// Waits for the end of the output (the process has exited).
    fn finish(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A member of a group: a `weir sync --group` process, killed and reaped
/// when dropped (see [`cmd::Running`]), whose stdout and stderr are read
/// as it runs.
pub struct Member {
    /// Its `--member-id`.
    pub id: String,
    process: cmd::Running,
    stdout: Drain,
    stderr: Drain,
}

impl Member {
    /// Starts member `n` of `group` on the tree of `env`, syncing into
    /// `url`, with `extra` arguments (`--live`, say).
    pub fn start(env: &Env, url: &str, group: &Group, n: usize, extra: &[&str]) -> Member {
        Member::start_env(env, url, group, n, extra, &[])
    }

    /// [`Member::start`], with the environment variables `vars` set
    /// besides (`PGOPTIONS`, say, which its PostgreSQL connections pass to the
    /// server).
    pub fn start_env(
        env: &Env,
        url: &str,
        group: &Group,
        n: usize,
        extra: &[&str],
        vars: &[(&str, &str)],
    ) -> Member {
        let mut child = cmd::spawn_env(
            env.tmp.path(),
            &member_args(env, url, group, n, extra),
            None,
            vars,
        );
        let stdout = Drain::start(child.stdout.take().unwrap());
        let stderr = Drain::start(child.stderr.take().unwrap());
        Member {
            id: member_id(n),
            process: cmd::Running(child),
            stdout,
            stderr,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.process.0.id()
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`, `KILL`) with `kill`. The
    /// process is not reaped before the guard is dropped or it is waited
    /// for, so its pid is not another process's.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([format!("-{signal}"), self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} {} failed", self.pid());
    }

    /// Kills the process with SIGKILL and reaps it.
    pub fn kill(&mut self) {
        self.process.kill();
        self.stdout.finish();
        self.stderr.finish();
    }

    /// Its exit status if it has exited (it is then reaped, and its output
    /// read to the end), `None` while it runs.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        let status = self.process.0.try_wait().unwrap()?;
        self.stdout.finish();
        self.stderr.finish();
        Some(status)
    }

    /// Waits up to `limit` for the process to exit: its status, or `None`
    /// when it had to be killed.
    pub fn wait(&mut self, limit: Duration) -> Option<ExitStatus> {
        let status = cmd::wait_for_exit(&mut self.process.0, limit);
        self.stdout.finish();
        self.stderr.finish();
        status
    }

    /// Sends SIGTERM and waits up to `limit` (see [`Member::wait`]).
    pub fn terminate(&mut self, limit: Duration) -> Option<ExitStatus> {
        self.signal("TERM");
        self.wait(limit)
    }

    /// Its stdout so far (all of it once it exited).
    pub fn stdout(&self) -> String {
        self.stdout.text()
    }

    /// Its stderr so far (all of it once it exited).
    pub fn stderr(&self) -> String {
        self.stderr.text()
    }

    /// Its id, stdout and stderr, to show when a check fails.
    pub fn output(&self) -> String {
        format!(
            "{}:\nstdout: {}\nstderr: {}",
            self.id,
            self.stdout(),
            self.stderr()
        )
    }
}
