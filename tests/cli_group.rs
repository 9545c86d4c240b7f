//! Worker groups end to end: several `weir sync --group` processes on one
//! PostgreSQL database split the files between them, take over a member
//! that died, and leave tables equal to the tree.

// Test support code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli;
mod cmd;
mod pg;

use std::collections::BTreeSet;
use std::process::{Child, Output};
use std::time::Duration;

use cli::group::{expected, generate, matches_tree, member_args, synced_by, Group};
use cli::{within, Env, PgDatabase, TestResult};
use cmd::text;

/// Member `n` of group `name`, with 8 partitions and a lease TTL of 3 s.
fn start(env: &Env, url: &str, name: &str, n: usize, extra: &[&str]) -> Child {
    let group = Group {
        name,
        partitions: 8,
        lease_ttl: 3,
    };
    cmd::spawn(
        env.tmp.path(),
        &member_args(env, url, &group, n, extra),
        None,
    )
}

/// Waits for a one-shot member to exit and returns its output.
fn finish(mut child: Child) -> Output {
    if cmd::wait_for_exit(&mut child, cmd::COMMAND_LIMIT).is_none() {
        panic!("a member did not finish within {:?}", cmd::COMMAND_LIMIT);
    }
    child.wait_with_output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_started_together_split_the_partitions_and_leave_the_tables_equal_to_the_tree(
) -> TestResult {
    PgDatabase::around("cli_group_split", async |pg| {
        let env = Env::new();
        generate(&env, 60);
        let members: Vec<Child> = (0..3)
            .map(|n| start(&env, &pg.url, "split", n, &[]))
            .collect();
        let outputs: Vec<Output> = members.into_iter().map(finish).collect();
        let mut all = BTreeSet::new();
        let mut shares = Vec::new();
        for out in &outputs {
            assert_eq!(
                out.status.code(),
                Some(0),
                "stdout: {}\nstderr: {}",
                text(&out.stdout),
                text(&out.stderr)
            );
            let mine = synced_by(out);
            shares.push(mine.len());
            all.extend(mine);
        }
        // Every partition was synced, and the work was split (a member
        // that joined after the others finished re-runs every partition,
        // finding nothing to do: its sync began after theirs).
        assert_eq!(all, (0..8).collect::<BTreeSet<u32>>());
        assert!(shares.iter().filter(|&&n| n < 8).count() >= 2, "{shares:?}");
        assert_eq!(pg.docs().await, expected(&env.tree));

        // A second pass by one member alone covers every partition, and
        // finds nothing to change.
        let out = finish(start(&env, &pg.url, "split", 0, &[]));
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(synced_by(&out), (0..8).collect::<BTreeSet<u32>>());
        let stdout = text(&out.stdout);
        assert!(
            stdout.contains("0 created, 0 updated, 0 deleted"),
            "{stdout}"
        );
        assert_eq!(pg.docs().await, expected(&env.tree));
        TestResult::Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_killed_with_sigkill_is_taken_over_and_its_files_changes_are_synced_by_the_survivor(
) -> TestResult {
    PgDatabase::around("cli_group_kill", async |pg| {
        let env = Env::new();
        generate(&env, 40);
        let live = ["--live", "--debounce-ms", "100"];
        let mut a = cmd::Running(start(&env, &pg.url, "kill", 0, &live));
        let mut b = cmd::Running(start(&env, &pg.url, "kill", 1, &live));
        let synced = within(Duration::from_secs(60), || async {
            matches_tree(pg, &env).await
        })
        .await;
        assert!(synced.is_some(), "the two members did not sync the tree");

        // SIGKILL: no leave, the lease runs out after its TTL (3 s).
        a.kill();
        for i in 0..40 {
            env.put(&format!("d{}/f{i}.md", i % 4), format!("changed {i}\n"));
        }
        env.put("added.md", "added\n");
        let taken_over = within(Duration::from_secs(60), || async {
            matches_tree(pg, &env).await
        })
        .await;
        let (status, stderr) = b.terminate(Duration::from_secs(20));
        assert!(
            taken_over.is_some(),
            "the survivor did not sync every change; its stderr: {stderr}"
        );
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{stderr}");
        TestResult::Ok(())
    })
    .await
}

#[test]
fn a_group_with_a_sqlite_database_is_refused_with_what_to_do() {
    let env = Env::new();
    generate(&env, 2);
    let out = env.sync(&["--group", "g"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("worker group g"), "{stderr}");
    assert!(stderr.contains("PostgreSQL"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
