//! Components: `mount`, `mount_each`, removal of what is no longer declared
//! or mounted, states moving between components, duplicate declarations,
//! failing components, scale over shards, context keys, `Send` futures and
//! embedding (threads stopped and ledger released on drop).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::FutureExt;
use support::*;
use weir::prelude::*;

/// The provider every test declares its rows through.
const ROWS: &str = "test/row";

/// How long one test may take before it counts as a hang.
const LIMIT: Duration = Duration::from_secs(120);

/// Runs `fut`, failing (instead of hanging) when it takes longer than `LIMIT`.
async fn bounded<T>(fut: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(LIMIT, fut)
        .await
        .map_err(|_| Error::msg(format!("the test did not finish within {LIMIT:?}")))?
}

/// Declares `rows` through the `ROWS` provider (registering it) in `ctx`.
fn declare_all(ctx: &Ctx, handler: &RowHandler, rows: &[(String, String)]) -> Result<()> {
    declare_each(ctx, ROWS, handler.clone(), rows.iter().cloned())
}

/// The error of an update that should have failed.
fn update_error<T: std::fmt::Debug>(result: Result<T>) -> Result<Error> {
    err_or(result, |v| {
        format!("the update succeeded ({v:?}) but was expected to fail")
    })
}

/// The cause reported for the failed component at `path`.
fn cause_of(err: &Error, path: &str) -> Option<String> {
    err.failed_components()
        .iter()
        .find(|f| f.path.to_string() == path)
        .map(|f| f.cause.clone())
}

/// A component in a tree of components: its rows, its children (mounted
/// with `mount_each`), and whether its code returns an error at the end.
#[derive(Clone, Debug)]
struct Node {
    key: String,
    rows: Vec<(String, String)>,
    children: Vec<Node>,
    fail: Option<String>,
}

fn node(key: &str, rows: &[(&str, &str)], children: Vec<Node>) -> Node {
    Node {
        key: key.to_string(),
        rows: owned(rows),
        children,
        fail: None,
    }
}

fn leaf(key: &str, rows: &[(&str, &str)]) -> Node {
    node(key, rows, Vec::new())
}

impl Node {
    fn failing(mut self, msg: &str) -> Self {
        self.fail = Some(msg.to_string());
        self
    }
}

/// Runs a node: declares its rows, mounts its children, then fails if told.
fn run_node(ctx: Ctx, handler: RowHandler, node: Node) -> BoxFuture<'static, Result<()>> {
    async move {
        declare_all(&ctx, &handler, &node.rows)?;
        if !node.children.is_empty() {
            let h = handler.clone();
            ctx.mount_each(
                node.children,
                |n| n.key.clone(),
                move |c, n| run_node(c, h.clone(), n),
            )
            .await?;
        }
        match node.fail {
            Some(msg) => Err(Error::msg(msg)),
            None => Ok(()),
        }
    }
    .boxed()
}

/// One run whose root declares `root_rows` and mounts `children` with
/// `mount_each` (concurrently).
async fn run_tree(
    app: &App,
    rig: &Rig,
    root_rows: &[(&str, &str)],
    children: Vec<Node>,
) -> Result<UpdateStats> {
    let handler = rig.handler();
    let root = node("", root_rows, children);
    app.run(move |ctx| run_node(ctx, handler, root)).await
}

/// One run whose root mounts `children` one after another with `mount`, in
/// list order.
async fn run_seq(app: &App, rig: &Rig, children: Vec<Node>) -> Result<UpdateStats> {
    let handler = rig.handler();
    app.run(move |ctx| async move {
        declare_all(&ctx, &handler, &[])?;
        for child in children {
            let h = handler.clone();
            let key = child.key.clone();
            ctx.mount(key, move |c| run_node(c, h, child)).await?;
        }
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------
// 1. mount
// ---------------------------------------------------------------------------

#[tokio::test]
async fn mount_runs_the_child_and_commits_it_before_returning() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let rig = Rig::new();
        let handler = rig.handler();
        let store = rig.store.clone();
        let (value, child_path, seen_after_mount) = app
            .update(move |ctx| async move {
                let (value, path) = ctx
                    .mount("child", move |c| async move {
                        declare_all(&c, &handler, &owned(&[("c1", "1"), ("c2", "2")]))?;
                        Ok((7u32, c.path().to_string()))
                    })
                    .await?;
                // Read the external system from inside the root, right after
                // mount returned: the child must already be applied.
                Ok((value, path, store.snapshot()))
            })
            .await?;
        assert_eq!(value, 7, "mount returns the child's value");
        assert_eq!(child_path, "/child");
        assert_eq!(seen_after_mount, map(&[("c1", "1"), ("c2", "2")]));
        assert_eq!(rig.log.entries(), vec!["create c1=1", "create c2=2"]);
        Ok(())
    })
    .await
}

#[tokio::test]
async fn mount_returns_the_child_error_and_the_update_lists_the_child_as_failed() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let rig = Rig::new();
        let handler = rig.handler();
        let seen: Arc<Mutex<Option<String>>> = Arc::default();
        let seen_in_root = Arc::clone(&seen);
        let result = app
            .update(move |ctx| async move {
                let h = handler.clone();
                let mounted = ctx
                    .mount("child", move |c| async move {
                        declare_all(&c, &h, &owned(&[("c1", "1")]))?;
                        Err::<(), _>(Error::msg("the child broke"))
                    })
                    .await;
                let text = match mounted {
                    Ok(()) => return Err(Error::msg("mount returned Ok for a failing child")),
                    Err(e) => e.to_string(),
                };
                if let Ok(mut s) = seen_in_root.lock() {
                    *s = Some(text);
                }
                // The root goes on: a sibling mounted afterwards commits.
                let h = handler.clone();
                ctx.mount("sibling", move |c| async move {
                    declare_all(&c, &h, &owned(&[("s1", "1")]))
                })
                .await?;
                Ok(())
            })
            .await;
        let err = update_error(result)?;
        let mount_text = seen.lock().map(|s| s.clone()).unwrap_or_default();
        assert!(
            mount_text
                .as_deref()
                .is_some_and(|t| t.contains("the child broke")),
            "mount should return the child's error, got {mount_text:?}"
        );
        assert_eq!(failed_paths(&err), strings(&["/child"]));
        let text = err.to_string();
        assert!(text.contains("/child"), "{text}");
        assert!(text.contains("the child broke"), "{text}");
        assert_eq!(rig.store.snapshot(), map(&[("s1", "1")]));
        assert_eq!(rig.log.entries(), vec!["create s1=1"]);
        Ok(())
    })
    .await
}

#[tokio::test]
async fn a_failed_grandchild_is_reported_with_its_full_path() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let rig = Rig::new();
        let handler = rig.handler();
        let result = app
            .update(move |ctx| async move {
                declare_all(&ctx, &handler, &[])?;
                ctx.mount("a", move |a| async move {
                    // The parent ignores its child's failure and succeeds.
                    let _ = a
                        .mount("b", |_b| async move {
                            Err::<(), _>(Error::msg("grandchild failure"))
                        })
                        .await;
                    Ok(())
                })
                .await
            })
            .await;
        let err = update_error(result)?;
        assert_eq!(failed_paths(&err), strings(&["/a/b"]));
        let text = err.to_string();
        assert!(text.contains("/a/b"), "{text}");
        assert!(text.contains("grandchild failure"), "{text}");
        Ok(())
    })
    .await
}

#[tokio::test]
async fn mounting_a_child_key_already_mounted_in_this_run_is_an_error() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let rig = Rig::new();
        let handler = rig.handler();
        let second_ran = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&second_ran);
        let (twice, each_again) = app
            .update(move |ctx| async move {
                let h = handler.clone();
                ctx.mount("a", move |c| async move {
                    declare_all(&c, &h, &owned(&[("a1", "1")]))
                })
                .await?;
                let c1 = Arc::clone(&counter);
                let twice = ctx
                    .mount("a", move |_c| async move {
                        c1.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    })
                    .await;
                let c2 = Arc::clone(&counter);
                let each_again = ctx
                    .mount_each(
                        vec!["a".to_string()],
                        |k| k.clone(),
                        move |_c, _k| {
                            let c2 = Arc::clone(&c2);
                            async move {
                                c2.fetch_add(1, Ordering::SeqCst);
                                Ok(())
                            }
                        },
                    )
                    .await;
                Ok((twice.is_err(), each_again.is_err()))
            })
            .await?;
        assert!(twice, "mounting \"a\" twice must be an error");
        assert!(
            each_again,
            "mount_each over a key already mounted must be an error"
        );
        assert_eq!(second_ran.load(Ordering::SeqCst), 0, "no second \"a\" ran");
        assert_eq!(rig.store.snapshot(), map(&[("a1", "1")]));
        Ok(())
    })
    .await
}

#[tokio::test]
async fn a_ctx_kept_after_its_component_returned_declares_and_mounts_nothing() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let rig = Rig::new();
        let handler = rig.handler();
        let late_ran = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&late_ran);
        let (declared, mounted) = app
            .update(move |ctx| async move {
                let h = handler.clone();
                // The child hands its own Ctx back to its parent.
                let kept = ctx
                    .mount("child", move |c| async move {
                        declare_all(&c, &h, &owned(&[("c1", "1")]))?;
                        Ok(c)
                    })
                    .await?;
                let declared = declare_all(&kept, &handler, &owned(&[("late", "1")]));
                let mounted = kept
                    .mount("grandchild", move |_c| async move {
                        counter.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    })
                    .await;
                Ok((declared.err(), mounted.err()))
            })
            .await?;
        for (what, err) in [("declaring", declared), ("mounting", mounted)] {
            let text = err.map(|e| e.to_string()).unwrap_or_default();
            assert!(
                text.contains("component /child has finished"),
                "{what} through a kept Ctx: {text:?}"
            );
        }
        assert_eq!(late_ran.load(Ordering::SeqCst), 0);
        assert_eq!(rig.store.snapshot(), map(&[("c1", "1")]));
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------
// 2. mount_each
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn mount_each_returns_ok_when_children_fail_and_the_update_names_each_failure() -> Result<()>
{
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let rig = Rig::new();
        // The root propagates mount_each's result with `?`: if mount_each
        // returned Err, the root would be listed as failed too.
        let result = run_tree(
            &app,
            &rig,
            &[],
            vec![
                leaf("a", &[("a1", "1")]),
                leaf("b", &[("b1", "1")]).failing("b is broken"),
                leaf("c", &[("c1", "1")]),
                leaf("d", &[("d1", "1")]).failing("d is broken"),
            ],
        )
        .await;
        let err = update_error(result)?;
        assert_eq!(failed_paths(&err), strings(&["/b", "/d"]));
        assert!(cause_of(&err, "/b").is_some_and(|c| c.contains("b is broken")));
        assert!(cause_of(&err, "/d").is_some_and(|c| c.contains("d is broken")));
        let text = err.to_string();
        for needle in ["/b", "b is broken", "/d", "d is broken"] {
            assert!(text.contains(needle), "{needle:?} missing from {text}");
        }
        assert_eq!(rig.store.snapshot(), map(&[("a1", "1"), ("c1", "1")]));
        assert_eq!(rig.log.entries(), vec!["create a1=1", "create c1=1"]);
        Ok(())
    })
    .await
}

#[tokio::test]
async fn duplicate_child_keys_in_mount_each_fail_before_any_child_runs() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let rig = Rig::new();
        let handler = rig.handler();
        let ran = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&ran);
        let result = app
            .run(move |ctx| async move {
                declare_all(&ctx, &handler, &owned(&[("root", "1")]))?;
                let h = handler.clone();
                ctx.mount_each(
                    vec!["x", "y", "x"],
                    |k| k.to_string(),
                    move |c, k| {
                        counter.fetch_add(1, Ordering::SeqCst);
                        let h = h.clone();
                        async move { declare_all(&c, &h, &owned(&[(k, "child")])) }
                    },
                )
                .await
            })
            .await;
        let err = update_error(result)?;
        assert_eq!(ran.load(Ordering::SeqCst), 0, "no child may run");
        // The root propagated the error: it is the failed component.
        assert_eq!(failed_paths(&err), strings(&["/"]));
        let cause = cause_of(&err, "/").unwrap_or_default();
        assert!(
            cause.contains("x"),
            "the error should name the key: {cause}"
        );
        assert_eq!(rig.log.call_count(), 0, "a failed root applies nothing");
        assert!(rig.store.snapshot().is_empty());
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------
// Guarantees 2 and 3: what is no longer declared or mounted is deleted.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_key_a_component_no_longer_declares_is_deleted() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let rig = Rig::new();
        run_tree(
            &app,
            &rig,
            &[("r", "1")],
            vec![leaf("c", &[("a", "1"), ("b", "1"), ("c", "1")])],
        )
        .await?;
        rig.log.clear();
        let stats = run_tree(&app, &rig, &[("r", "1")], vec![leaf("c", &[("a", "1")])]).await?;
        assert_eq!(rig.log.entries(), vec!["delete b", "delete c"]);
        assert_eq!(stats.deleted, 2);
        assert_eq!(rig.store.snapshot(), map(&[("a", "1"), ("r", "1")]));
        // The records are gone: nothing is deleted again.
        rig.log.clear();
        run_tree(&app, &rig, &[("r", "1")], vec![leaf("c", &[("a", "1")])]).await?;
        assert_eq!(rig.log.call_count(), 0);
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_no_longer_mounted_is_deleted_with_its_grandchildren() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let rig = Rig::new();
        let tree = |keep_p: bool| {
            let mut children = vec![node(
                "q",
                &[("q-own", "1")],
                vec![leaf("g", &[("q-g", "1")])],
            )];
            if keep_p {
                children.push(node(
                    "p",
                    &[("p-own", "1")],
                    vec![node(
                        "g",
                        &[("p-g", "1")],
                        vec![leaf("gg", &[("p-gg", "1")])],
                    )],
                ));
            }
            children
        };
        run_tree(&app, &rig, &[], tree(true)).await?;
        assert_eq!(rig.store.snapshot().len(), 5);
        rig.log.clear();
        let stats = run_tree(&app, &rig, &[], tree(false)).await?;
        assert_eq!(
            rig.log.entries(),
            vec!["delete p-g", "delete p-gg", "delete p-own"]
        );
        assert_eq!(stats.deleted, 3);
        assert_eq!(rig.store.snapshot(), map(&[("q-g", "1"), ("q-own", "1")]));
        // The removed components are forgotten: a rerun touches nothing.
        rig.log.clear();
        let stats = run_tree(&app, &rig, &[], tree(false)).await?;
        assert_eq!(rig.log.call_count(), 0);
        assert_eq!((stats.deleted, stats.unchanged), (0, 2));
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------
// Guarantee 4: a state moving between components is one state.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_moving_between_concurrent_siblings_with_the_same_value_calls_no_sink() -> Result<()>
{
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let rig = Rig::new();
        run_tree(
            &app,
            &rig,
            &[],
            vec![
                leaf("a", &[("m", "1"), ("a1", "1")]),
                leaf("b", &[("b1", "1")]),
            ],
        )
        .await?;
        rig.log.clear();
        let stats = run_tree(
            &app,
            &rig,
            &[],
            vec![
                leaf("a", &[("a1", "1")]),
                leaf("b", &[("b1", "1"), ("m", "1")]),
            ],
        )
        .await?;
        assert_eq!(
            rig.log.entries(),
            Vec::<String>::new(),
            "no delete, no create"
        );
        assert_eq!((stats.created, stats.deleted, stats.unchanged), (0, 0, 3));
        assert_eq!(
            rig.store.snapshot(),
            map(&[("a1", "1"), ("b1", "1"), ("m", "1")])
        );
        // The new owner tracks it: no longer declaring it deletes it.
        rig.log.clear();
        run_tree(
            &app,
            &rig,
            &[],
            vec![leaf("a", &[("a1", "1")]), leaf("b", &[("b1", "1")])],
        )
        .await?;
        assert_eq!(rig.log.entries(), vec!["delete m"]);
        assert_eq!(rig.store.snapshot(), map(&[("a1", "1"), ("b1", "1")]));
        Ok(())
    })
    .await
}

/// A state moves from `a` to `b` with a new value; `new_owner_first` says
/// whether `b` runs (and commits) before `a` in the run of the move.
async fn moving_state_is_updated_not_recreated(new_owner_first: bool) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let rig = Rig::new();
    run_seq(
        &app,
        &rig,
        vec![
            leaf("a", &[("m", "1"), ("a1", "1")]),
            leaf("b", &[("b1", "1")]),
        ],
    )
    .await?;
    rig.log.clear();
    let old_owner = leaf("a", &[("a1", "1")]);
    let new_owner = leaf("b", &[("b1", "1"), ("m", "2")]);
    let order = if new_owner_first {
        vec![new_owner, old_owner]
    } else {
        vec![old_owner, new_owner]
    };
    let stats = run_seq(&app, &rig, order).await?;
    if rig.log.entries() != vec!["update m=2"] {
        return Err(Error::msg(format!(
            "moving m (new owner first: {new_owner_first}) should be one update, the sink saw {:?}",
            rig.log.entries()
        )));
    }
    if (stats.created, stats.updated, stats.deleted) != (0, 1, 0) {
        return Err(Error::msg(format!(
            "unexpected stats for the move: {stats:?}"
        )));
    }
    if rig.store.snapshot() != map(&[("a1", "1"), ("b1", "1"), ("m", "2")]) {
        return Err(Error::msg(format!(
            "the store lost the moved row: {:?}",
            rig.store.snapshot()
        )));
    }
    rig.log.clear();
    run_seq(
        &app,
        &rig,
        vec![leaf("a", &[("a1", "1")]), leaf("b", &[("b1", "1")])],
    )
    .await?;
    if rig.log.entries() != vec!["delete m"] {
        return Err(Error::msg(format!(
            "the new owner no longer declaring m should delete it, the sink saw {:?}",
            rig.log.entries()
        )));
    }
    Ok(())
}

#[tokio::test]
async fn a_state_moving_to_a_component_that_runs_earlier_is_updated_not_recreated() -> Result<()> {
    bounded(moving_state_is_updated_not_recreated(true)).await
}

#[tokio::test]
async fn a_state_moving_to_a_component_that_runs_later_is_updated_not_recreated() -> Result<()> {
    bounded(moving_state_is_updated_not_recreated(false)).await
}

#[tokio::test]
async fn a_state_moving_out_of_a_removed_component_is_kept() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let rig = Rig::new();
        run_tree(
            &app,
            &rig,
            &[],
            vec![
                leaf("a", &[("m", "1"), ("a1", "1")]),
                leaf("b", &[("b1", "1")]),
            ],
        )
        .await?;
        rig.log.clear();
        // `a` is no longer mounted; `b` takes over m.
        run_tree(&app, &rig, &[], vec![leaf("b", &[("b1", "1"), ("m", "1")])]).await?;
        assert_eq!(rig.log.entries(), vec!["delete a1"]);
        assert_eq!(rig.store.snapshot(), map(&[("b1", "1"), ("m", "1")]));
        rig.log.clear();
        run_tree(&app, &rig, &[], vec![leaf("b", &[("b1", "1")])]).await?;
        assert_eq!(rig.log.entries(), vec!["delete m"]);
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------
// Guarantee 11: duplicate declarations.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn declaring_one_state_twice_in_a_component_fails_only_that_component() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let rig = Rig::new();
        let handler = rig.handler();
        let second: Arc<Mutex<Vec<String>>> = Arc::default();
        let second_in = Arc::clone(&second);
        let result = app
            .run(move |ctx| async move {
                declare_all(&ctx, &handler, &[])?;
                let h = handler.clone();
                ctx.mount_each(
                    vec!["ignores", "propagates", "fine"],
                    |k| k.to_string(),
                    move |c, k| {
                        let h = h.clone();
                        let second = Arc::clone(&second_in);
                        async move {
                            let p = register_root_target_states_provider(&c, ROWS, h)?;
                            declare_target_state(
                                &c,
                                p.target_state(format!("{k}-own"), "1".into()),
                            )?;
                            if k == "fine" {
                                return Ok(());
                            }
                            let key = format!("{k}-dup");
                            declare_target_state(&c, p.target_state(key.as_str(), "1".into()))?;
                            let again =
                                declare_target_state(&c, p.target_state(key.as_str(), "2".into()));
                            if let Err(e) = &again {
                                if let Ok(mut s) = second.lock() {
                                    s.push(e.to_string());
                                }
                            }
                            if k == "propagates" {
                                again?;
                            }
                            // "ignores" drops the error and returns Ok.
                            Ok(())
                        }
                    },
                )
                .await
            })
            .await;
        let errors = second.lock().map(|s| s.clone()).unwrap_or_default();
        assert_eq!(
            errors.len(),
            2,
            "the second declaration returns Err: {errors:?}"
        );
        for e in &errors {
            assert!(e.contains("-dup"), "the error should name the key: {e}");
        }
        let err = update_error(result)?;
        assert_eq!(failed_paths(&err), strings(&["/ignores", "/propagates"]));
        for path in ["/ignores", "/propagates"] {
            let cause = cause_of(&err, path).unwrap_or_default();
            assert!(cause.contains("-dup"), "{path}: {cause}");
        }
        // Only the sibling committed; the failing components applied nothing.
        assert_eq!(rig.store.snapshot(), map(&[("fine-own", "1")]));
        assert_eq!(rig.log.entries(), vec!["create fine-own=1"]);
        Ok(())
    })
    .await
}

/// The keys declared in each order, with the index of the declaration
/// that repeats an earlier one: in key order up to a repeat of the last,
/// out of order with a repeat of the first, out of order from the start.
const REPEATS: &[(&[&str], usize)] = &[
    (&["k1", "k2", "k3", "k3"], 3),
    (&["k1", "k2", "k3", "k1"], 3),
    (&["k3", "k1", "k2", "k3"], 3),
    (&["k2", "k4", "k1", "k3", "k4", "k5"], 4),
];

#[tokio::test]
async fn a_repeated_declaration_is_refused_whatever_order_the_keys_come_in() -> Result<()> {
    bounded(async {
        for &(keys, repeat) in REPEATS {
            let dir = tempfile::tempdir()?;
            let app = app(dir.path()).await?;
            let rig = Rig::new();
            let handler = rig.handler();
            let results: Arc<Mutex<Vec<bool>>> = Arc::default();
            let seen = Arc::clone(&results);
            let run = app
                .run(move |ctx| async move {
                    let p = register_root_target_states_provider(&ctx, ROWS, handler)?;
                    for k in keys {
                        let ok = declare_target_state(&ctx, p.target_state(*k, "1".into())).is_ok();
                        if let Ok(mut s) = seen.lock() {
                            s.push(ok);
                        }
                    }
                    Ok(())
                })
                .await;
            let results = results.lock().map(|r| r.clone()).unwrap_or_default();
            let expected: Vec<bool> = (0..keys.len()).map(|i| i != repeat).collect();
            assert_eq!(results, expected, "{keys:?}: only the repeat is refused");
            let err = update_error(run)?;
            let cause = cause_of(&err, "/").unwrap_or_default();
            assert!(cause.contains(keys[repeat]), "{keys:?}: {cause}");
            assert!(rig.store.snapshot().is_empty(), "{keys:?}: nothing applied");
        }
        Ok(())
    })
    .await
}

#[tokio::test]
async fn the_states_no_longer_declared_are_deleted_whatever_order_the_rest_come_in() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let rig = Rig::new();
        let key = |i: usize| format!("k{i:03}");
        let rows = |ids: &[usize]| -> Vec<(String, String)> {
            ids.iter().map(|&i| (key(i), "1".to_string())).collect()
        };
        let run = |ids: Vec<usize>| {
            let handler = rig.handler();
            let rows = rows(&ids);
            app.run(move |ctx| async move { declare_all(&ctx, &handler, &rows) })
        };
        let all: Vec<usize> = (0..300).collect();
        run(all.clone()).await?;
        // In key order, every third left out; then the survivors but every
        // fifth, out of order (odd keys backwards, then even ones); then all
        // back, in key order but for the first, declared last.
        let in_order: Vec<usize> = all.iter().copied().filter(|i| i % 3 != 0).collect();
        let mut shuffled: Vec<usize> = in_order.iter().copied().filter(|i| i % 5 != 0).collect();
        shuffled.sort_by_key(|&i| (i % 2 == 0, std::cmp::Reverse(i)));
        let mut last_first: Vec<usize> = all[1..].to_vec();
        last_first.push(0);
        let mut expected: BTreeMap<String, String> = rows(&all).into_iter().collect();
        for (ids, deleted) in [(in_order, 100), (shuffled, 40), (last_first, 0)] {
            rig.log.clear();
            let stats = run(ids.clone()).await?;
            assert_eq!(stats.deleted, deleted, "{ids:?}");
            let kept: BTreeSet<usize> = ids.iter().copied().collect();
            let mut deletes: Vec<String> = expected
                .keys()
                .filter(|k| !kept.iter().any(|&i| &key(i) == *k))
                .map(|k| format!("delete {k}"))
                .collect();
            expected = rows(&ids).into_iter().collect();
            let mut entries: Vec<String> = rig
                .log
                .entries()
                .into_iter()
                .filter(|e| e.starts_with("delete"))
                .collect();
            entries.sort();
            deletes.sort();
            assert_eq!(entries, deletes);
            assert_eq!(rig.store.snapshot(), expected);
        }
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declaring_one_state_in_two_sibling_components_fails_exactly_one_of_them() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let rig = Rig::new();
        let result = run_tree(
            &app,
            &rig,
            &[],
            vec![
                leaf("x", &[("x-own", "1"), ("shared-key", "from-x")]),
                leaf("y", &[("y-own", "1"), ("shared-key", "from-y")]),
                leaf("z", &[("z-own", "1")]),
            ],
        )
        .await;
        let err = update_error(result)?;
        let failed = failed_paths(&err);
        assert_eq!(failed.len(), 1, "exactly one declarer fails: {failed:?}");
        let loser = failed[0].trim_start_matches('/').to_string();
        assert!(
            loser == "x" || loser == "y",
            "unexpected failure {failed:?}"
        );
        let winner = if loser == "x" { "y" } else { "x" };
        let text = err.to_string();
        assert!(
            text.contains("shared-key"),
            "the error names the key: {text}"
        );
        let store = rig.store.snapshot();
        assert_eq!(
            store.get("shared-key").map(String::as_str),
            Some(format!("from-{winner}").as_str()),
            "the first declarer's value is applied"
        );
        assert!(store.contains_key(&format!("{winner}-own")));
        assert!(store.contains_key("z-own"));
        assert!(
            !store.contains_key(&format!("{loser}-own")),
            "the failed component applies nothing: {store:?}"
        );
        Ok(())
    })
    .await
}

#[tokio::test]
async fn the_same_key_under_two_providers_is_two_target_states() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let first = Rig::new();
        let second = Rig::new();
        let (h1, h2) = (first.handler(), second.handler());
        app.run(move |ctx| async move {
            let p1 = register_root_target_states_provider(&ctx, "test/one", h1)?;
            let p2 = register_root_target_states_provider(&ctx, "test/two", h2)?;
            declare_target_state(&ctx, p1.target_state("k", "1".to_string()))?;
            declare_target_state(&ctx, p2.target_state("k", "2".to_string()))?;
            Ok(())
        })
        .await?;
        assert_eq!(first.store.snapshot(), map(&[("k", "1")]));
        assert_eq!(second.store.snapshot(), map(&[("k", "2")]));
        Ok(())
    })
    .await
}

#[tokio::test]
async fn states_no_longer_declared_under_two_providers_are_each_deleted_by_their_own() -> Result<()>
{
    // The orphans of both providers reach the end of the run together,
    // sorted by path; each must be reconciled by its own provider's handler
    // and deleted through its own sink.
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let (first, second) = (Rig::new(), Rig::new());
        let run = |one: Vec<usize>, two: Vec<usize>| {
            let (h1, h2) = (first.handler(), second.handler());
            app.run(move |ctx| async move {
                let p1 = register_root_target_states_provider(&ctx, "test/one", h1)?;
                let p2 = register_root_target_states_provider(&ctx, "test/two", h2)?;
                // Interleaved, as rows of two tables read together.
                for i in 0..one.len().max(two.len()) {
                    if let Some(k) = one.get(i) {
                        declare_target_state(&ctx, p1.target_state(*k as i64, "1".to_string()))?;
                    }
                    if let Some(k) = two.get(i) {
                        declare_target_state(&ctx, p2.target_state(*k as i64, "2".to_string()))?;
                    }
                }
                Ok(())
            })
        };
        let all: Vec<usize> = (0..40).collect();
        run(all.clone(), all.clone()).await?;
        first.log.clear();
        second.log.clear();
        let kept_one: Vec<usize> = all.iter().copied().filter(|i| i % 3 != 0).collect();
        let kept_two: Vec<usize> = all.iter().copied().filter(|i| i % 4 != 1).collect();
        let stats = run(kept_one.clone(), kept_two.clone()).await?;
        assert_eq!(stats.deleted, 14 + 10);
        let deletes = |rig: &Rig| -> Vec<String> {
            let mut d: Vec<String> = rig.log.entries();
            d.sort();
            d
        };
        let expected = |kept: &[usize]| -> Vec<String> {
            let mut d: Vec<String> = all
                .iter()
                .filter(|i| !kept.contains(i))
                .map(|i| format!("delete {i}"))
                .collect();
            d.sort();
            d
        };
        assert_eq!(deletes(&first), expected(&kept_one));
        assert_eq!(deletes(&second), expected(&kept_two));
        let snapshot = |kept: &[usize], v: &str| -> BTreeMap<String, String> {
            kept.iter()
                .map(|i| (i.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(first.store.snapshot(), snapshot(&kept_one, "1"));
        assert_eq!(second.store.snapshot(), snapshot(&kept_two, "2"));
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------
// Guarantee 13: a component whose code fails applies and deletes nothing.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_whose_code_fails_applies_nothing_and_deletes_nothing() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let rig = Rig::new();
        run_tree(
            &app,
            &rig,
            &[],
            vec![
                leaf("ok", &[("ok-1", "1"), ("ok-2", "1")]),
                leaf("bad", &[("bad-1", "1"), ("bad-2", "1")]),
            ],
        )
        .await?;
        let before = rig.store.snapshot();
        rig.log.clear();

        // `bad` changes bad-1, adds bad-3, drops bad-2, then fails.
        let result = run_tree(
            &app,
            &rig,
            &[],
            vec![
                leaf("ok", &[("ok-1", "2"), ("ok-2", "1")]),
                leaf("bad", &[("bad-1", "2"), ("bad-3", "1")]).failing("bad input"),
            ],
        )
        .await;
        let err = update_error(result)?;
        assert_eq!(failed_paths(&err), strings(&["/bad"]));
        let text = err.to_string();
        assert!(
            text.contains("/bad") && text.contains("bad input"),
            "{text}"
        );
        assert_eq!(rig.log.entries(), vec!["update ok-1=2"], "nothing of bad");
        let mut expected = before.clone();
        expected.insert("ok-1".into(), "2".into());
        assert_eq!(rig.store.snapshot(), expected);

        // A later successful run of `bad` decides.
        rig.log.clear();
        let stats = run_tree(
            &app,
            &rig,
            &[],
            vec![
                leaf("ok", &[("ok-1", "2"), ("ok-2", "1")]),
                leaf("bad", &[("bad-1", "2"), ("bad-3", "1")]),
            ],
        )
        .await?;
        assert_eq!(
            rig.log.entries(),
            vec!["create bad-3=1", "delete bad-2", "update bad-1=2"]
        );
        assert_eq!((stats.created, stats.updated, stats.deleted), (1, 1, 1));
        assert_eq!(
            rig.store.snapshot(),
            map(&[("bad-1", "2"), ("bad-3", "1"), ("ok-1", "2"), ("ok-2", "1")])
        );
        // And it is all tracked: an identical rerun calls no sink.
        rig.log.clear();
        run_tree(
            &app,
            &rig,
            &[],
            vec![
                leaf("ok", &[("ok-1", "2"), ("ok-2", "1")]),
                leaf("bad", &[("bad-1", "2"), ("bad-3", "1")]),
            ],
        )
        .await?;
        assert_eq!(rig.log.call_count(), 0);
        Ok(())
    })
    .await
}

#[tokio::test]
async fn a_component_whose_code_fails_does_not_unmount_its_children() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let rig = Rig::new();
        let with_child = || node("bad", &[("bad-1", "1")], vec![leaf("g", &[("bad-g", "1")])]);
        run_tree(&app, &rig, &[], vec![with_child()]).await?;
        rig.log.clear();
        // This time `bad` fails before mounting its child.
        let result = run_tree(
            &app,
            &rig,
            &[],
            vec![leaf("bad", &[("bad-1", "1")]).failing("early failure")],
        )
        .await;
        let err = update_error(result)?;
        assert_eq!(failed_paths(&err), strings(&["/bad"]));
        assert_eq!(
            rig.log.call_count(),
            0,
            "a failed component deletes nothing"
        );
        assert_eq!(rig.store.snapshot(), map(&[("bad-1", "1"), ("bad-g", "1")]));
        // Its next successful run without the child removes the child.
        rig.log.clear();
        run_tree(&app, &rig, &[], vec![leaf("bad", &[("bad-1", "1")])]).await?;
        assert_eq!(rig.log.entries(), vec!["delete bad-g"]);
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------
// Guarantee 12 and scale.
// ---------------------------------------------------------------------------

const SCALE_COMPONENTS: i64 = 3_000;

async fn run_scale(app: &App, rig: &Rig, changed: &BTreeSet<i64>) -> Result<UpdateStats> {
    let handler = rig.handler();
    let changed = Arc::new(changed.clone());
    app.run(move |ctx| async move {
        declare_all(&ctx, &handler, &[])?;
        ctx.mount_each(
            0..SCALE_COMPONENTS,
            |i| *i,
            move |c, i| {
                let h = handler.clone();
                let changed = Arc::clone(&changed);
                async move {
                    let p = register_root_target_states_provider(&c, ROWS, h)?;
                    let a = if changed.contains(&i) {
                        format!("v2-{i}")
                    } else {
                        format!("v1-{i}")
                    };
                    declare_target_state(&c, p.target_state(format!("c{i}-a"), a))?;
                    declare_target_state(&c, p.target_state(format!("c{i}-b"), format!("v1-{i}")))?;
                    Ok(())
                }
            },
        )
        .await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_thousand_components_over_four_shards_land_once_and_rerun_silently() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app_with(dir.path(), |b| b.shards(4)).await?;
        let rig = Rig::new();

        let stats = run_scale(&app, &rig, &BTreeSet::new()).await?;
        assert_eq!(stats.created, 6_000);
        let store = rig.store.snapshot();
        assert_eq!(store.len(), 6_000);
        for i in 0..SCALE_COMPONENTS {
            let want = format!("v1-{i}");
            assert_eq!(store.get(&format!("c{i}-a")), Some(&want));
            assert_eq!(store.get(&format!("c{i}-b")), Some(&want));
        }
        let entries = rig.log.entries();
        assert_eq!(entries.len(), 6_000, "each row applied exactly once");
        assert!(entries.iter().all(|e| e.starts_with("create ")));

        rig.log.clear();
        let stats = run_scale(&app, &rig, &BTreeSet::new()).await?;
        assert_eq!(rig.log.call_count(), 0, "an identical run calls no sink");
        assert_eq!(stats.unchanged, 6_000);
        assert_eq!((stats.created, stats.updated, stats.deleted), (0, 0, 0));

        // 1% of the values change: row a of every 50th component.
        let changed: BTreeSet<i64> = (0..SCALE_COMPONENTS).filter(|i| i % 50 == 0).collect();
        rig.log.clear();
        let stats = run_scale(&app, &rig, &changed).await?;
        let mut expected: Vec<String> = changed
            .iter()
            .map(|i| format!("update c{i}-a=v2-{i}"))
            .collect();
        expected.sort();
        assert_eq!(rig.log.entries(), expected);
        assert_eq!(stats.updated, 60);
        assert_eq!(stats.unchanged, 5_940);
        assert_eq!((stats.created, stats.deleted), (0, 0));
        assert_eq!(rig.store.snapshot().len(), 6_000);
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------
// Context keys.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn get_key_returns_the_provided_value_and_names_a_missing_key() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let url: ContextKey<String> = ContextKey::new("db-url");
        let app = app_with(dir.path(), |b| {
            b.provide_key(&url, "postgres://example".to_string())
        })
        .await?;
        let missing: ContextKey<u32> = ContextKey::new("never-provided-key");
        let wrong_type: ContextKey<u64> = ContextKey::new("db-url");
        let (in_root, in_child, missing_err, wrong_type_is_err) = app
            .update(move |ctx| async move {
                let in_root = ctx.get_key(&url)?.clone();
                let child_url = url.clone();
                let in_child = ctx
                    .mount("child", move |c| async move {
                        Ok(c.get_key(&child_url)?.clone())
                    })
                    .await?;
                let missing_err = match ctx.get_key(&missing) {
                    Ok(v) => return Err(Error::msg(format!("a missing key returned {v}"))),
                    Err(e) => e.to_string(),
                };
                Ok((
                    in_root,
                    in_child,
                    missing_err,
                    ctx.get_key(&wrong_type).is_err(),
                ))
            })
            .await?;
        assert_eq!(in_root, "postgres://example");
        assert_eq!(in_child, "postgres://example");
        assert!(
            missing_err.contains("never-provided-key"),
            "the error names the key: {missing_err}"
        );
        assert!(
            wrong_type_is_err,
            "a key of another type is not the provided value"
        );
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------
// Send / Sync.
// ---------------------------------------------------------------------------

fn assert_send<T: Send>(_: &T) {}
fn assert_send_sync<T: Send + Sync>() {}

#[tokio::test]
async fn api_futures_are_send_and_handles_are_send_and_sync() -> Result<()> {
    assert_send_sync::<App>();
    assert_send_sync::<Ctx>();
    assert_send_sync::<TargetStateProvider<String>>();
    assert_send_sync::<TargetActionSink<RowAction>>();
    bounded(async {
        let dir = tempfile::tempdir()?;
        let build = App::builder("send-check")
            .ledger_path(dir.path().join("ledger"))
            .shards(2)
            .build();
        assert_send(&build);
        let app = build.await?;
        let rig = Rig::new();

        let handler = rig.handler();
        let update = app.update(move |ctx| async move {
            let mount = ctx.mount("a", |_c| async move { Ok(()) });
            assert_send(&mount);
            mount.await?;
            let each = ctx.mount_each(vec![1i64, 2], |i| *i, |_c, _i| async move { Ok(()) });
            assert_send(&each);
            each.await?;
            let provider = register_root_target_states_provider(&ctx, ROWS, handler)?;
            let target =
                mount_target::<String, String>(&ctx, provider.target_state("c", "v".into()));
            assert_send(&target);
            drop(target); // never polled: checked for Send only
            declare_target_state(&ctx, provider.target_state("r", "1".to_string()))?;
            Ok(1u8)
        });
        assert_send(&update);
        assert_eq!(update.await?, 1);

        let handler = rig.handler();
        let run =
            app.run(move |ctx| async move { declare_all(&ctx, &handler, &owned(&[("r", "1")])) });
        assert_send(&run);
        assert_eq!(run.await?.unchanged, 1);

        let handler = rig.handler();
        let preview = app.preview(move |ctx| async move {
            declare_all(&ctx, &handler, &owned(&[("r", "2")]))?;
            Ok(())
        });
        assert_send(&preview);
        assert_eq!(preview.await?.len(), 1);

        let handler = rig.handler();
        let drop_state = app.drop_state(move |ctx| async move {
            register_root_target_states_provider(&ctx, ROWS, handler)?;
            Ok(())
        });
        assert_send(&drop_state);
        assert_eq!(drop_state.await?.deleted, 1);
        assert!(rig.store.snapshot().is_empty());
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------
// UpdateStats.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn update_stats_count_created_updated_deleted_and_unchanged() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let rig = Rig::new();
        let stats = run_tree(
            &app,
            &rig,
            &[("r1", "1")],
            vec![
                leaf("c", &[("c1", "1"), ("c2", "1")]),
                leaf("d", &[("d1", "1")]),
            ],
        )
        .await?;
        assert_eq!(
            (stats.created, stats.updated, stats.deleted, stats.unchanged),
            (4, 0, 0, 0)
        );
        assert_eq!(stats.failed_components, 0);

        // r1 unchanged, r2 created, c1 updated, c2 no longer declared,
        // d no longer mounted.
        let stats = run_tree(
            &app,
            &rig,
            &[("r1", "1"), ("r2", "1")],
            vec![leaf("c", &[("c1", "2")])],
        )
        .await?;
        assert_eq!(
            (stats.created, stats.updated, stats.deleted, stats.unchanged),
            (1, 1, 2, 1)
        );
        assert_eq!(stats.failed_components, 0);
        assert_eq!(
            rig.store.snapshot(),
            map(&[("c1", "2"), ("r1", "1"), ("r2", "1")])
        );
        Ok(())
    })
    .await
}

// ---------------------------------------------------------------------------
// Embedding.
// ---------------------------------------------------------------------------

#[test]
fn an_app_runs_inside_a_hand_built_current_thread_runtime() -> Result<(), Box<dyn std::error::Error>>
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let rig = Rig::new();
    let rig_in = rig.clone();
    rt.block_on(bounded(async move {
        let dir = tempfile::tempdir()?;
        let app = app(dir.path()).await?;
        let stats = run_tree(
            &app,
            &rig_in,
            &[("r", "1")],
            vec![leaf("a", &[("a1", "1")]), leaf("b", &[("b1", "1")])],
        )
        .await?;
        if stats.created != 3 {
            return Err(Error::msg(format!("expected 3 creates, got {stats:?}")));
        }
        drop(app);
        Ok(())
    }))?;
    assert_eq!(
        rig.store.snapshot(),
        map(&[("a1", "1"), ("b1", "1"), ("r", "1")])
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_apps_ledger_opens_again_at_once_with_its_records() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let rig = Rig::new();
        let app1 = app(dir.path()).await?;
        run_tree(&app1, &rig, &[("r", "1")], vec![leaf("a", &[("a1", "1")])]).await?;
        drop(app1);
        let app2 = app(dir.path()).await?;
        rig.log.clear();
        let stats = run_tree(&app2, &rig, &[("r", "1")], vec![leaf("a", &[("a1", "1")])]).await?;
        assert_eq!(rig.log.call_count(), 0, "the records survived the reopen");
        assert_eq!(stats.unchanged, 2);
        Ok(())
    })
    .await
}

/// Set when a test runs in a child process of its own.
const ISOLATED_ENV: &str = "WEIR_ENGINE_COMPONENTS_ISOLATED";

/// Runs `body` in a fresh process running only the test `name` (so that no
/// other test's threads are around), and checks that it passed.
fn in_own_process(
    name: &'static str,
    body: impl FnOnce() -> Result<(), Box<dyn std::error::Error>>,
) -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os(ISOLATED_ENV).is_some() {
        // A watchdog ends the process if the engine hangs.
        let (done, wait) = std::sync::mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("test-watchdog".into())
            .spawn(move || {
                if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(LIMIT) {
                    eprintln!("{name}: did not finish within {LIMIT:?}: the engine hangs");
                    std::process::exit(3);
                }
            })?;
        let result = body();
        let _ = done.send(());
        return result;
    }
    let out = std::process::Command::new(std::env::current_exe()?)
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(ISOLATED_ENV, "1")
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || !stdout.contains("1 passed") {
        eprintln!("--- {name} in its own process ---\n{stdout}\n{stderr}");
        return Err(format!(
            "{name} failed in its own process ({}); its output is above",
            out.status
        )
        .into());
    }
    Ok(())
}

/// Threads of this process that belong to a weir engine, by thread id.
fn engine_threads() -> std::io::Result<BTreeMap<u64, String>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir("/proc/self/task")? {
        let entry = entry?;
        let Ok(tid) = entry.file_name().to_string_lossy().parse::<u64>() else {
            continue;
        };
        // A thread may exit while we look.
        let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) else {
            continue;
        };
        let comm = comm.trim().to_string();
        if comm.starts_with("weir-") || comm.starts_with("actix-rt") {
            out.insert(tid, comm);
        }
    }
    Ok(out)
}

/// Engine threads that did not exist in `before`.
fn new_engine_threads(before: &BTreeMap<u64, String>) -> std::io::Result<Vec<String>> {
    Ok(engine_threads()?
        .into_iter()
        .filter(|(tid, _)| !before.contains_key(tid))
        .map(|(tid, comm)| format!("{comm} ({tid})"))
        .collect())
}

#[test]
fn isolated_dropping_an_app_stops_its_threads_and_frees_its_ledger(
) -> Result<(), Box<dyn std::error::Error>> {
    in_own_process(
        "isolated_dropping_an_app_stops_its_threads_and_frees_its_ledger",
        || {
            let before = engine_threads()?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let dir = tempfile::tempdir()?;
            let rig = Rig::new();
            let running = rt.block_on(bounded(async {
                let app = app(dir.path()).await?;
                run_tree(&app, &rig, &[("r", "1")], vec![leaf("a", &[("a1", "1")])]).await?;
                let running = new_engine_threads(&before)?;
                drop(app);
                Ok(running)
            }))?;
            // The check sees the engine's threads while it runs.
            for name in ["weir-ledger", "weir-actix"] {
                assert!(
                    running.iter().any(|t| t.starts_with(name)),
                    "{name} not found among {running:?}"
                );
            }
            // Joined threads leave /proc/self/task as the kernel reaps them:
            // allow that a bounded moment, without sleeping.
            let deadline = Instant::now() + Duration::from_secs(5);
            let left = loop {
                let left = new_engine_threads(&before)?;
                if left.is_empty() || Instant::now() >= deadline {
                    break left;
                }
                std::thread::yield_now();
            };
            assert!(
                left.is_empty(),
                "threads still running after drop: {left:?}"
            );

            // The same ledger path opens again at once, with its records.
            rig.log.clear();
            let stats = rt.block_on(bounded(async {
                let app = app(dir.path()).await?;
                run_tree(&app, &rig, &[("r", "1")], vec![leaf("a", &[("a1", "1")])]).await
            }))?;
            assert_eq!(rig.log.call_count(), 0);
            assert_eq!(stats.unchanged, 2);
            Ok(())
        },
    )
}

#[tokio::test]
async fn app_state_is_one_value_per_app_and_name_for_every_run_and_component_and_never_shared_between_apps(
) -> Result<()> {
    /// Counts the components of one app that asked for it.
    #[derive(Default)]
    struct Seen(AtomicUsize);

    async fn run_three(app: &App, name: &'static str) -> Result<Arc<Seen>> {
        let last: Arc<Mutex<Option<Arc<Seen>>>> = Arc::default();
        let keep = Arc::clone(&last);
        app.run(move |ctx| async move {
            ctx.mount_each(
                vec!["a", "b", "c"],
                |k| k.to_string(),
                move |ctx, _k| {
                    let keep = Arc::clone(&keep);
                    async move {
                        let seen = ctx.app_state(name, Seen::default);
                        seen.0.fetch_add(1, Ordering::SeqCst);
                        *keep.lock().unwrap() = Some(seen);
                        Ok(())
                    }
                },
            )
            .await
        })
        .await?;
        let seen = last.lock().unwrap().take();
        seen.ok_or_else(|| Error::msg("no component ran"))
    }

    let (d1, d2) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let (one, two) = (app(d1.path()).await?, app(d2.path()).await?);
    let first = run_three(&one, "db").await?;
    let again = run_three(&one, "db").await?;
    assert!(
        Arc::ptr_eq(&first, &again),
        "a second run got another value"
    );
    assert_eq!(first.0.load(Ordering::SeqCst), 6);
    let other_name = run_three(&one, "other").await?;
    assert_eq!(other_name.0.load(Ordering::SeqCst), 3);
    let other_app = run_three(&two, "db").await?;
    assert!(!Arc::ptr_eq(&first, &other_app), "two apps share a value");
    assert_eq!(other_app.0.load(Ordering::SeqCst), 3);
    Ok(())
}
