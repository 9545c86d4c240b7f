//! Running weir as user nobody, for the tests that need a file it cannot
//! read (the tests run as root on CI).

use std::path::Path;

use super::{set_mode, Env, TestResult};

/// User and group nobody, who runs weir in the tests that need a file it
/// cannot read.
pub const NOBODY: u32 = 65534;

/// Whether `uid` cannot read a mode-000 file (false when running as a user
/// that reads anything).
fn nobody_is_denied(dir: &Path) -> bool {
    let probe = dir.join("probe");
    std::fs::write(&probe, "x").unwrap();
    set_mode(&probe, 0o000).unwrap();
    let out = std::process::Command::new("cat")
        .arg(&probe)
        .uid_gid(NOBODY)
        .output();
    let _ = std::fs::remove_file(&probe);
    matches!(out, Ok(o) if !o.status.success())
}

trait UidGid {
    fn uid_gid(&mut self, id: u32) -> &mut Self;
}

impl UidGid for std::process::Command {
    fn uid_gid(&mut self, id: u32) -> &mut Self {
        use std::os::unix::process::CommandExt;
        self.uid(id).gid(id)
    }
}

/// Says a test this machine cannot run is skipped; under `CI=true`, where
/// the machine is known to run it (as root), that is a failure.
pub fn skipped(why: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "cannot run under CI: {why}"
    );
    eprintln!("SKIPPED: {why}");
}

/// An `Env` for running weir as user nobody, whose temporary directory
/// anyone may write in; `None` (after a message) unless the tests run as
/// root and nobody cannot read a mode-000 file.
pub fn nobody_env() -> Result<Option<Env>, Box<dyn std::error::Error>> {
    if std::process::Command::new("id").arg("-u").output()?.stdout != b"0\n" {
        skipped("needs root to run weir as user nobody");
        return Ok(None);
    }
    let env = Env::new();
    // Everything belongs to nobody, who runs weir.
    set_mode(env.tmp.path(), 0o777)?;
    if !nobody_is_denied(env.tmp.path()) {
        skipped("user nobody reads a mode-000 file here");
        return Ok(None);
    }
    Ok(Some(env))
}

/// Gives the whole tree of `env` to user nobody.
pub fn give_tree_to_nobody(env: &Env) -> TestResult {
    let chown = std::process::Command::new("chown")
        .args(["-R", &format!("{NOBODY}:{NOBODY}")])
        .arg(&env.tree)
        .status()?;
    assert!(chown.success());
    Ok(())
}
