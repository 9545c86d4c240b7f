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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_group_shows_members_and_partitions_and_drop_group_removes_the_group_and_its_tables(
) -> TestResult {
    PgDatabase::around("cli_group_admin", async |pg| {
        let env = Env::new();
        generate(&env, 12);
        let live = ["--live", "--debounce-ms", "100"];
        let mut member = cmd::Running(start(&env, &pg.url, "admin", 0, &live));
        let synced = within(Duration::from_secs(60), || async {
            matches_tree(pg, &env).await
        })
        .await;
        assert!(synced.is_some(), "the member did not sync the tree");
        let into = pg.url.as_str();
        let inspect = |extra: &[&str]| {
            let mut args = vec!["inspect", "--group", "admin", "--into", into];
            args.extend_from_slice(extra);
            env.weir(&args)
        };
        let out = inspect(&[]);
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(
            stdout.contains("worker group admin: 8 partitions, lease TTL 3.0s"),
            "{stdout}"
        );
        assert!(stdout.contains("members: 1"), "{stdout}");
        assert!(stdout.contains("member-0 on "), "{stdout}");
        assert!(
            stdout.contains("9 partition(s), lease expires in"),
            "{stdout}"
        );
        assert!(stdout.contains("root  owner member-0, epoch"), "{stdout}");

        // The group's tables are its own: a ledger outside it is refused.
        let outsider = env.tmp.path().join("outsider");
        let out = env.weir(&cli::sync_args(&env.tree, into, &outsider, &[]));
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
        assert!(text(&out.stderr).contains("is managed by worker group admin"));

        // Not while a member runs.
        let drop_group = || env.weir(&["drop", "--group", "admin", "--into", into, "--yes"]);
        let refused = drop_group();
        assert_eq!(refused.status.code(), Some(2));
        assert!(text(&refused.stderr).contains("live members (member-0)"));
        assert!(
            matches_tree(pg, &env).await,
            "a refused drop changed nothing"
        );

        let (status, stderr) = member.terminate(Duration::from_secs(20));
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{stderr}");
        let out = drop_group();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains("tables public.chunks, public.documents"),
            "{}",
            text(&out.stdout)
        );
        assert_eq!(pg.tables().await, Vec::<String>::new());
        let gone = inspect(&[]);
        assert_eq!(gone.status.code(), Some(2));
        assert!(text(&gone.stderr).contains("worker group admin does not exist"));
        TestResult::Ok(())
    })
    .await
}

/// A free TCP port on the loopback interface.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The metrics the exporter on `port` serves, or `None` when it does not
/// answer.
fn scrape(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    (head.split_whitespace().nth(1) == Some("200")).then(|| body.to_string())
}

/// The sum of the samples of every series named `name` (or of the one
/// series `name` spells with its labels) in an exporter's output.
fn sample(metrics: &str, name: &str) -> Option<f64> {
    let prefix = format!("{name}{{");
    let mut sum = None;
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        if series == name || series.starts_with(&prefix) {
            *sum.get_or_insert(0.0) += value.parse::<f64>().ok()?;
        }
    }
    sum
}

/// A member's gauges as it exports them: partitions held, changelog rows.
fn gauges(port: u16) -> Option<(f64, f64)> {
    let metrics = scrape(port)?;
    Some((
        sample(&metrics, "weir_group_partitions_held")?,
        sample(&metrics, "weir_group_changelog_rows")?,
    ))
}

/// What the database says `member` holds: its partitions, and the rows
/// (snapshot and log) of their changelogs.
async fn held_in_database(pg: &PgDatabase, group: &str, member: &str) -> (f64, f64) {
    let pool = pg.pool().await;
    let (partitions, rows): (i64, i64) = sqlx::query_as(
        "WITH held AS (SELECT partition FROM weir.partition
                        WHERE group_name = $1 AND owner = $2)
         SELECT (SELECT count(*) FROM held),
                (SELECT count(*) FROM weir.changelog
                  WHERE group_name = $1 AND partition IN (SELECT partition FROM held))
              + (SELECT count(*) FROM weir.snapshot
                  WHERE group_name = $1 AND partition IN (SELECT partition FROM held))",
    )
    .bind(group)
    .bind(member)
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    (partitions as f64, rows as f64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_member_exports_the_partitions_it_holds_and_their_changelog_rows_and_a_survivor_its_takeover(
) -> TestResult {
    PgDatabase::around("cli_group_metrics", async |pg| {
        let env = Env::new();
        generate(&env, 40);
        let ports = [free_port(), free_port()];
        let mut members: Vec<cmd::Running> = (0..2)
            .map(|n| {
                let metrics = format!("127.0.0.1:{}", ports[n]);
                let args = ["--live", "--debounce-ms", "100", "--metrics", &metrics];
                cmd::Running(start(&env, &pg.url, "metrics", n, &args))
            })
            .collect();
        let synced = within(Duration::from_secs(60), || async {
            matches_tree(pg, &env).await
        })
        .await;
        assert!(synced.is_some(), "the two members did not sync the tree");

        // Once settled, each member's gauges are what the database holds
        // for it, and together they hold every partition and the root.
        let agreed = within(Duration::from_secs(30), || async {
            let mut total = 0.0;
            for (n, port) in ports.iter().enumerate() {
                let Some(exported) = gauges(*port) else {
                    return false;
                };
                if exported != held_in_database(pg, "metrics", &format!("member-{n}")).await {
                    return false;
                }
                total += exported.0;
            }
            total == 9.0
        })
        .await;
        let now: Vec<_> = ports.iter().map(|p| gauges(*p)).collect();
        assert!(
            agreed.is_some(),
            "the members' gauges never matched the database: {now:?}"
        );

        // SIGKILL: member-1 takes every partition over after the TTL,
        // restoring each from its changelog.
        members[0].kill();
        let took_over = within(Duration::from_secs(30), || async {
            gauges(ports[1]) == Some(held_in_database(pg, "metrics", "member-1").await)
                && gauges(ports[1]).is_some_and(|(held, _)| held == 9.0)
        })
        .await;
        let metrics = scrape(ports[1]).unwrap_or_default();
        assert!(took_over.is_some(), "member-1 did not take over: {metrics}");
        let takeovers = sample(&metrics, "weir_group_takeovers_total").unwrap_or(0.0);
        assert!(takeovers >= 9.0, "{metrics}");
        let restored = sample(
            &metrics,
            "weir_group_restored_rows_total{reason=\"takeover\"}",
        );
        assert!(restored.is_some_and(|rows| rows > 0.0), "{metrics}");
        assert!(
            sample(&metrics, "weir_group_rebalances_total").is_some_and(|n| n >= 2.0),
            "{metrics}"
        );
        let (status, stderr) = members[1].terminate(Duration::from_secs(20));
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{stderr}");
        TestResult::Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_shot_member_whose_file_failed_exits_1_naming_it_after_the_group_synced() -> TestResult
{
    let Some(env) = cli::nobody::nobody_env()? else {
        return Ok(());
    };
    PgDatabase::around("cli_group_failed", async |pg| {
        generate(&env, 8);
        env.put("secret.md", "secret\n");
        cli::nobody::give_tree_to_nobody(&env)?;
        cli::set_mode(&env.path("secret.md"), 0o000)?;
        let group = Group {
            name: "failing",
            partitions: 4,
            lease_ttl: 3,
        };
        let args = member_args(&env, &pg.url, &group, 0, &[]);
        let out = cmd::run(env.tmp.path(), &args, Some(cli::nobody::NOBODY));
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("failed: secret.md"), "{stderr}");
        assert_eq!(synced_by(&out), (0..4).collect::<BTreeSet<u32>>());
        let mut docs = expected(&env.tree);
        docs.remove("secret.md");
        assert_eq!(pg.docs().await, docs);
        TestResult::Ok(())
    })
    .await
}
