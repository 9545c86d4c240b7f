//! Crashes (guarantee 7): the process is killed at the engine's fault points
//! (`WEIR_FAULT_KILL`, the root package's tests build the engine with them)
//! during a run with moves, removals and a destructive container change; a
//! file-backed store survives the kill; after recovery a clean run converges
//! and a further run calls no sink.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use weir::prelude::*;

use crate::support::*;

const CRASH_DIR: &str = "ACCEPT_CRASH_DIR";
const CRASH_POINTS: [&str; 4] = [
    "reconcile.batch",
    "sink.before_apply",
    "sink.after_apply",
    "ledger.group_commit",
];

/// An external system that lives in a file: each sink call appends its
/// lines in one write.
#[derive(Clone)]
struct FileStore {
    path: std::path::PathBuf,
}

impl FileStore {
    fn append(&self, text: String) -> Result<()> {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        f.write_all(text.as_bytes())?;
        Ok(())
    }

    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.path)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The table (if any) and the rows (kv rows and table rows), replayed
    /// from the file.
    fn state(&self) -> (bool, BTreeMap<String, String>) {
        let mut table = false;
        let mut kv = BTreeMap::new();
        let mut trows = BTreeMap::new();
        for line in self.lines() {
            let parts: Vec<&str> = line.splitn(3, ' ').collect();
            match parts.as_slice() {
                ["set", key, value] => {
                    kv.insert(key.to_string(), value.to_string());
                }
                ["del", key] => {
                    kv.remove(*key);
                }
                ["tset", key, value] => {
                    trows.insert(key.to_string(), value.to_string());
                }
                ["tdel", key] => {
                    trows.remove(*key);
                }
                ["table", "create" | "ensure"] => table = true,
                ["table", "recreate"] => {
                    table = true;
                    trows.clear();
                }
                ["table", "drop"] => {
                    table = false;
                    trows.clear();
                }
                _ => {}
            }
        }
        kv.extend(trows);
        (table, kv)
    }

    fn row_sink(&self) -> TargetActionSink<Put> {
        self.row_sink_with("")
    }

    fn row_sink_with(&self, prefix: &'static str) -> TargetActionSink<Put> {
        let fs = self.clone();
        TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<Put>>| {
            let fs = fs.clone();
            async move {
                let mut text = String::new();
                for a in actions {
                    let p = payload(a);
                    let key = match &p.key {
                        StableKey::Str(s) => s.to_string(),
                        other => other.to_string(),
                    };
                    match p.value {
                        Some(v) => text.push_str(&format!("{prefix}set {key} {v}\n")),
                        None => text.push_str(&format!("{prefix}del {key}\n")),
                    }
                }
                fs.append(text)
            }
        })
    }

    fn kv(&self) -> Kv {
        Kv {
            sink: self.row_sink(),
            seen: Arc::default(),
        }
    }

    fn table(&self) -> Table {
        let fs = self.clone();
        let rows = self.row_sink_with("t");
        let sink = TargetActionSink::from_async_fn_with_child_handler(
            move |actions: Vec<TargetAction<TableAct>>| {
                let fs = fs.clone();
                async move {
                    let mut text = String::new();
                    for a in actions {
                        let v = verb(&a);
                        let t = payload(a);
                        let what = match (v, t.recreate) {
                            ("delete", _) => "drop",
                            (_, true) => "recreate",
                            ("create", _) => "create",
                            _ => "ensure",
                        };
                        text.push_str(&format!("table {what}\n"));
                    }
                    fs.append(text)
                }
            },
            move |_: &TableAct| {
                Ok(ChildTargetDef::new::<String, _>(Kv {
                    sink: rows.clone(),
                    seen: Arc::default(),
                }))
            },
        );
        Table {
            sink,
            invalidation: Some(TargetChildInvalidation::Destructive),
        }
    }
}

/// The declarations of each phase: (table generation, components with
/// their kv rows, components with their table rows).
type Phase = (
    u32,
    Vec<(&'static str, Vec<(&'static str, &'static str)>)>,
    Vec<(&'static str, Vec<(&'static str, &'static str)>)>,
);

fn crash_phase(phase: u8) -> Phase {
    if phase == 0 {
        let kv: Vec<_> = (0..12)
            .map(|c| {
                let name: &'static str = Box::leak(format!("k{c:02}").into_boxed_str());
                let rows: Vec<(&'static str, &'static str)> = (0..3)
                    .map(|r| {
                        let key: &'static str = Box::leak(format!("{name}.{r}").into_boxed_str());
                        (key, "v0")
                    })
                    .collect();
                (name, rows)
            })
            .collect();
        let table = vec![
            ("t1", vec![("ra", "1"), ("rb", "1")]),
            ("t2", vec![("rc", "1")]),
        ];
        (1, kv, table)
    } else {
        // Every other component changes its first row; k00's rows move to
        // k01; k02..k04 are removed; a new component appears; the table is
        // recreated (destructive) and t2's row moves to t1.
        let (_, kv0, _) = crash_phase(0);
        let mut kv: Vec<(&'static str, Vec<(&'static str, &'static str)>)> = Vec::new();
        let moved = kv0[0].1.clone();
        for (i, (name, rows)) in kv0.into_iter().enumerate() {
            match i {
                0 => kv.push((name, vec![])),
                1 => {
                    let mut rows = rows;
                    rows.extend(moved.iter().map(|(k, _)| (*k, "v1")));
                    kv.push((name, rows));
                }
                2..=4 => {}
                _ => {
                    let rows = rows
                        .into_iter()
                        .enumerate()
                        .map(|(r, (k, v))| (k, if r == 0 && i % 2 == 1 { "v1" } else { v }))
                        .collect();
                    kv.push((name, rows));
                }
            }
        }
        kv.push(("k99", vec![("k99.0", "v1")]));
        let table = vec![("t1", vec![("ra", "1"), ("rc", "2")]), ("t2", vec![])];
        (2, kv, table)
    }
}

fn crash_expected() -> (bool, BTreeMap<String, String>) {
    let (_, kv, table) = crash_phase(1);
    let mut rows = BTreeMap::new();
    for (_, list) in kv.into_iter().chain(table) {
        for (k, v) in list {
            rows.insert(k.to_string(), v.to_string());
        }
    }
    (true, rows)
}

async fn crash_run(app: &App, fs: &FileStore, phase: u8) -> Result<UpdateStats> {
    let (generation, kv, table) = crash_phase(phase);
    let kvh = fs.kv();
    let th = fs.table();
    bounded(app.run(move |ctx| async move {
        let p = register_root_target_states_provider(&ctx, KV, kvh)?;
        let tp = register_root_target_states_provider(&ctx, TABLES, th)?;
        let rows: TargetStateProvider<String> =
            mount_target(&ctx, tp.target_state("t", Spec { generation })).await?;
        ctx.mount_each(
            kv,
            |(c, _)| *c,
            move |c, (_, list)| {
                let p = p.clone();
                async move {
                    for (k, v) in list {
                        declare_target_state(&c, p.target_state(k, v.to_string()))?;
                    }
                    Ok(())
                }
            },
        )
        .await?;
        ctx.mount_each(
            table,
            |(c, _)| *c,
            move |c, (_, list)| {
                let rows = rows.clone();
                async move {
                    for (k, v) in list {
                        declare_target_state(&c, rows.target_state(k, v.to_string()))?;
                    }
                    Ok(())
                }
            },
        )
        .await
    }))
    .await
}

async fn open_crash_app(dir: &Path) -> Result<App> {
    open_with(dir, |b| {
        b.batch_policy(BatchPolicy {
            max_actions: 4,
            linger: Duration::from_millis(2),
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_killed_at_any_fault_point_converges_exactly_on_the_next_clean_run() -> Result<()> {
    if let Some(dir) = std::env::var_os(CRASH_DIR) {
        // The child: run phase 1 and (unless killed) exit normally.
        let dir = std::path::PathBuf::from(dir);
        let fs = FileStore {
            path: dir.join("store.log"),
        };
        let app = open_crash_app(&dir).await?;
        crash_run(&app, &fs, 1).await?;
        return Ok(());
    }
    let exe = std::env::current_exe()?;
    let mut problems = Vec::new();
    let mut fired = 0;
    let mut plans = 0;
    for point in CRASH_POINTS {
        for n in [1u32, 2, 3, 5, 8] {
            plans += 1;
            let dir = tempfile::tempdir()?;
            let fs = FileStore {
                path: dir.path().join("store.log"),
            };
            {
                let app = open_crash_app(dir.path()).await?;
                crash_run(&app, &fs, 0).await?;
            }
            let status = std::process::Command::new(&exe)
                .args([
                    "crash::a_run_killed_at_any_fault_point_converges_exactly_on_the_next_clean_run",
                    "--exact",
                    "--test-threads=1",
                ])
                .env(CRASH_DIR, dir.path())
                .env("WEIR_FAULT_KILL", format!("{point}:{n}"))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()?;
            if status.code().is_none() {
                fired += 1;
            }
            let app = open_crash_app(dir.path()).await?;
            let r = crash_run(&app, &fs, 1).await;
            if let Err(e) = &r {
                problems.push(format!(
                    "{point}:{n}: the clean run after the crash failed: {e}"
                ));
                continue;
            }
            let got = fs.state();
            let want = crash_expected();
            if got != want {
                let missing: Vec<_> = want
                    .1
                    .iter()
                    .filter(|(k, v)| got.1.get(*k) != Some(v))
                    .collect();
                let extra: Vec<_> = got.1.keys().filter(|k| !want.1.contains_key(*k)).collect();
                problems.push(format!(
                    "{point}:{n} (killed: {}): after a clean run, table {} (want {}), wrong or missing rows {missing:?}, extra rows {extra:?}",
                    status.code().is_none(),
                    got.0,
                    want.0
                ));
            }
            // A further run applies no row action: only the table's
            // refresh reaches its sink.
            let before = fs.lines().len();
            let r = crash_run(&app, &fs, 1).await;
            let lines = fs.lines();
            let new_lines = lines.get(before..).unwrap_or_default();
            if r.is_err() || new_lines.iter().any(|l| l != "table ensure") {
                problems.push(format!(
                    "{point}:{n}: a further run was not silent: {r:?}, new lines {new_lines:?}"
                ));
            }
        }
    }
    eprintln!("crash harness: {fired} of {plans} kills fired");
    assert!(fired * 2 >= plans, "only {fired} of {plans} kills fired");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}
