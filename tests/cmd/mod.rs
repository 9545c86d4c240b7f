//! Running the built `weir` binary from the tests that drive it (`mod cmd;`).

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// How long one command may run before it counts as a hang.
pub const COMMAND_LIMIT: Duration = Duration::from_secs(120);

/// Starts `weir args...` in `cwd` (as user and group `uid` when given),
/// with its output piped.
pub fn spawn<S: AsRef<OsStr>>(cwd: &Path, args: &[S], uid: Option<u32>) -> Child {
    spawn_env(cwd, args, uid, &[])
}

/// [`spawn`], with the environment variables `vars` set besides.
pub fn spawn_env<S: AsRef<OsStr>>(
    cwd: &Path,
    args: &[S],
    uid: Option<u32>,
    vars: &[(&str, &str)],
) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_weir"));
    if let Some(uid) = uid {
        command.uid(uid).gid(uid);
    }
    command
        .envs(vars.iter().copied())
        .args(args)
        .current_dir(cwd)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the weir binary starts")
}

/// Waits for `child` to exit; kills it and returns `None` past `limit`.
pub fn wait_for_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait for weir") {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `weir args...` in `cwd` and returns its output; kills it (and
/// fails) when it runs longer than `COMMAND_LIMIT`.
pub fn run<S: AsRef<OsStr> + std::fmt::Debug>(cwd: &Path, args: &[S], uid: Option<u32>) -> Output {
    let mut child = spawn(cwd, args, uid);
    if wait_for_exit(&mut child, COMMAND_LIMIT).is_none() {
        panic!("weir {args:?} did not finish within {COMMAND_LIMIT:?}");
    }
    child.wait_with_output().expect("weir's output")
}

/// Sends SIGTERM to `child` and waits up to `limit` for it to exit:
/// its exit status (`None` if it had to be killed) and its stderr.
pub fn terminate(child: &mut Child, limit: Duration) -> (Option<ExitStatus>, String) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = wait_for_exit(child, limit);
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    (status, stderr)
}

/// A started process that is killed and reaped when dropped, so a test
/// that fails midway leaves no process (and no zombie) behind.
pub struct Running(pub Child);

impl Running {
    /// Sends SIGTERM and waits up to `limit`: see [`terminate`].
    pub fn terminate(&mut self, limit: Duration) -> (Option<ExitStatus>, String) {
        terminate(&mut self.0, limit)
    }

    /// Kills the process with SIGKILL and reaps it.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}

/// Output bytes as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
