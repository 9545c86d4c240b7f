//! Plans: what each component declares in a run, which paths fail, and
//! how they are generated; and the paths they name.
//!
//! A plan prints as `{c0: [k1=v2 A:g1D{k0=v0 x:g0L{k2=v1}}] fails after
//! mounts, c2: [] | failing: A/k0 k3 | seed 7}`: component `c0` declares the
//! root row `k1` with value `v2`, and mounts the container `A` at
//! generation 1 (`D`: its handler answers a change of generation with
//! `Destructive`; `L`: with `Lossy`) holding the row `A/k0` and the nested
//! container `A/x` with the row `A/x/k2`; its code returns `Err` once its
//! containers are mounted. `c2` is mounted and declares nothing. Any sink
//! call with an action on `A/k0` or `k3` fails.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use proptest::prelude::*;

use crate::rig::Node;

/// The root provider of rows declared outside containers.
pub(crate) const ROWS: &str = "model/row";
/// The root provider of the outer containers.
pub(crate) const CONTAINERS: &str = "model/container";
pub(crate) const COMPONENTS: usize = 4;
const ROOT_KEYS: usize = 6;
const OUTER: [&str; 3] = ["A", "B", "C"];
const INNER: [&str; 2] = ["x", "y"];
/// Rows per container.
const CONTAINER_KEYS: usize = 3;
const VALUES: usize = 3;
const GENERATIONS: u32 = 3;
/// Container levels: the container sinks the handlers have.
pub(crate) const DEPTH: usize = 2;
const MAX_RUNS: usize = 5;
pub(crate) const DEFAULT_CASES: u32 = 96;

pub(crate) fn row_key(k: usize) -> String {
    format!("k{k}")
}

pub(crate) fn value(v: usize) -> String {
    format!("v{v}")
}

/// What the external store holds for a container: its generation.
pub(crate) fn marker(generation: u32) -> String {
    format!("g{generation}")
}

pub(crate) fn outer_name(b: usize) -> &'static str {
    OUTER.get(b).copied().unwrap_or("?")
}

pub(crate) fn inner_name(i: usize) -> &'static str {
    INNER.get(i).copied().unwrap_or("?")
}

pub(crate) fn is_row_key(key: &str) -> bool {
    key.starts_with('k')
}

/// Whether the path names a container (its last segment is no row key).
pub(crate) fn is_container(path: &str) -> bool {
    !is_row_key(path.rsplit('/').next().unwrap_or(path))
}

pub(crate) fn parent_of(path: &str) -> Option<&str> {
    path.rsplit_once('/').map(|(parent, _)| parent)
}

/// The containers above a path, innermost first.
pub(crate) fn ancestors(path: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut at = path;
    while let Some(parent) = parent_of(at) {
        out.push(parent);
        at = parent;
    }
    out
}

pub(crate) fn is_below(path: &str, container: &str) -> bool {
    path.strip_prefix(container)
        .is_some_and(|rest| rest.starts_with('/'))
}

/// Every path a plan can declare: where failing sink calls are aimed.
fn all_paths() -> Vec<String> {
    let mut out: Vec<String> = (0..ROOT_KEYS).map(row_key).collect();
    for outer in OUTER {
        out.push(outer.to_string());
        out.extend((0..CONTAINER_KEYS).map(|k| format!("{outer}/{}", row_key(k))));
        for inner in INNER {
            out.push(format!("{outer}/{inner}"));
            out.extend((0..CONTAINER_KEYS).map(|k| format!("{outer}/{inner}/{}", row_key(k))));
        }
    }
    out
}

/// Whether a `Lossy` change of a container with `seed` loses `path`: a
/// fixed pseudo-random choice, so that the model can make it too.
pub(crate) fn thinned(seed: u64, path: &str) -> bool {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for b in path.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h & 1 == 1
}

/// Where a failing component's code returns `Err`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FailAt {
    /// Before it mounts or declares anything.
    Start,
    /// After its containers are mounted (and committed), before its rows.
    AfterMounts,
    /// After it declared its rows.
    AfterRows,
}

/// A container's declared value: its generation, and how its handler
/// answers a change of it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spec {
    pub(crate) generation: u32,
    pub(crate) destructive: bool,
}

impl fmt::Debug for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = if self.destructive { "D" } else { "L" };
        write!(f, "g{}{how}", self.generation)
    }
}

impl Spec {
    pub(crate) fn node(self, seed: u64) -> Node {
        Node::Container {
            generation: self.generation,
            destructive: self.destructive,
            seed,
        }
    }
}

#[derive(Clone)]
pub(crate) struct ContainerPlan {
    pub(crate) spec: Spec,
    /// Row key index -> value index.
    pub(crate) rows: BTreeMap<usize, usize>,
    /// Nested containers (empty below the outer level).
    pub(crate) inner: BTreeMap<usize, ContainerPlan>,
}

/// `k<key>=v<value>` for each row.
fn row_parts(rows: &BTreeMap<usize, usize>) -> Vec<String> {
    rows.iter().map(|(k, v)| format!("k{k}=v{v}")).collect()
}

impl fmt::Debug for ContainerPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = row_parts(&self.rows);
        parts.extend(
            self.inner
                .iter()
                .map(|(i, inner)| format!("{}:{inner:?}", inner_name(*i))),
        );
        write!(f, "{:?}{{{}}}", self.spec, parts.join(" "))
    }
}

/// What one component does in a run.
#[derive(Clone, Default)]
pub(crate) struct CompPlan {
    /// Root row key index -> value index.
    pub(crate) rows: BTreeMap<usize, usize>,
    /// Outer container index -> what it holds.
    pub(crate) containers: BTreeMap<usize, ContainerPlan>,
    pub(crate) fail: Option<FailAt>,
}

impl fmt::Debug for CompPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = row_parts(&self.rows);
        parts.extend(
            self.containers
                .iter()
                .map(|(b, c)| format!("{}:{c:?}", outer_name(*b))),
        );
        write!(f, "[{}]", parts.join(" "))?;
        match self.fail {
            Some(FailAt::Start) => write!(f, " fails at start"),
            Some(FailAt::AfterMounts) => write!(f, " fails after mounts"),
            Some(FailAt::AfterRows) => write!(f, " fails after rows"),
            None => Ok(()),
        }
    }
}

/// A container as a component mounts it.
#[derive(Clone, Debug)]
pub(crate) struct Mount {
    pub(crate) path: String,
    pub(crate) spec: Spec,
}

impl CompPlan {
    /// The containers the component mounts, in order: each outer one, then
    /// the ones nested in it.
    pub(crate) fn mounts(&self) -> Vec<Mount> {
        let mut out = Vec::new();
        for (b, c) in &self.containers {
            let outer = outer_name(*b).to_string();
            out.push(Mount {
                path: outer.clone(),
                spec: c.spec,
            });
            for (i, inner) in &c.inner {
                out.push(Mount {
                    path: format!("{outer}/{}", inner_name(*i)),
                    spec: inner.spec,
                });
            }
        }
        out
    }

    /// Every row the component declares, by path.
    pub(crate) fn rows(&self) -> BTreeMap<String, String> {
        let mut out: BTreeMap<String, String> = self
            .rows
            .iter()
            .map(|(k, v)| (row_key(*k), value(*v)))
            .collect();
        for (b, c) in &self.containers {
            let outer = outer_name(*b);
            for (k, v) in &c.rows {
                out.insert(format!("{outer}/{}", row_key(*k)), value(*v));
            }
            for (i, inner) in &c.inner {
                for (k, v) in &inner.rows {
                    out.insert(
                        format!("{outer}/{}/{}", inner_name(*i), row_key(*k)),
                        value(*v),
                    );
                }
            }
        }
        out
    }
}

/// One run: what each mounted component does, which paths make any sink
/// call containing them fail, and the seed of the `Lossy` changes.
#[derive(Clone)]
pub(crate) struct Plan {
    pub(crate) comps: BTreeMap<usize, CompPlan>,
    pub(crate) failing: BTreeSet<String>,
    pub(crate) seed: u64,
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{")?;
        for (i, (c, comp)) in self.comps.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "c{c}: {comp:?}")?;
        }
        if !self.failing.is_empty() {
            let paths: Vec<&str> = self.failing.iter().map(String::as_str).collect();
            write!(f, " | failing: {}", paths.join(" "))?;
        }
        write!(f, " | seed {}}}", self.seed)
    }
}

impl Plan {
    /// The plan with nothing failing.
    pub(crate) fn clean(&self) -> Plan {
        Plan {
            comps: self
                .comps
                .iter()
                .map(|(c, p)| {
                    (
                        *c,
                        CompPlan {
                            fail: None,
                            ..p.clone()
                        },
                    )
                })
                .collect(),
            failing: BTreeSet::new(),
            seed: self.seed,
        }
    }

    /// The external store a clean run of the plan must leave.
    pub(crate) fn expected_store(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for comp in self.comps.values() {
            for m in comp.mounts() {
                out.insert(m.path, marker(m.spec.generation));
            }
            out.extend(comp.rows());
        }
        out
    }
}

fn rows_strategy(keys: usize, weight: f64) -> impl Strategy<Value = BTreeMap<usize, usize>> {
    prop::collection::vec(prop::option::weighted(weight, 0..VALUES), keys).prop_map(|values| {
        values
            .into_iter()
            .enumerate()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect()
    })
}

fn spec_strategy() -> impl Strategy<Value = Spec> {
    (0..GENERATIONS, any::<bool>()).prop_map(|(generation, destructive)| Spec {
        generation,
        destructive,
    })
}

fn inner_strategy() -> impl Strategy<Value = ContainerPlan> {
    (spec_strategy(), rows_strategy(CONTAINER_KEYS, 0.6)).prop_map(|(spec, rows)| ContainerPlan {
        spec,
        rows,
        inner: BTreeMap::new(),
    })
}

fn outer_strategy() -> impl Strategy<Value = ContainerPlan> {
    (
        spec_strategy(),
        rows_strategy(CONTAINER_KEYS, 0.6),
        prop::collection::vec(prop::option::weighted(0.5, inner_strategy()), INNER.len()),
    )
        .prop_map(|(spec, rows, inner)| ContainerPlan {
            spec,
            rows,
            inner: inner
                .into_iter()
                .enumerate()
                .filter_map(|(i, c)| c.map(|c| (i, c)))
                .collect(),
        })
}

fn fail_strategy() -> impl Strategy<Value = Option<FailAt>> {
    prop::option::weighted(
        0.15,
        prop_oneof![
            Just(FailAt::Start),
            Just(FailAt::AfterMounts),
            Just(FailAt::AfterRows)
        ],
    )
}

fn plan_strategy() -> impl Strategy<Value = Plan> {
    let paths = all_paths();
    (
        // per root key: not declared, or (component, value)
        prop::collection::vec(
            prop::option::weighted(0.6, (0..COMPONENTS, 0..VALUES)),
            ROOT_KEYS,
        ),
        // per outer container: not declared, or (its owner: mostly the
        // same component from run to run, sometimes another, its contents)
        prop::collection::vec(
            prop::option::weighted(
                0.7,
                (
                    prop_oneof![3 => Just(None), 1 => (0..COMPONENTS).prop_map(Some)],
                    outer_strategy(),
                ),
            ),
            OUTER.len(),
        ),
        prop::collection::vec(fail_strategy(), COMPONENTS),
        // components mounted even when they declare nothing
        prop::collection::vec(prop::bool::weighted(0.3), COMPONENTS),
        prop::option::weighted(
            0.5,
            prop::collection::btree_set(prop::sample::select(paths), 1..=3),
        ),
        any::<u64>(),
    )
        .prop_map(|(rows, containers, fails, mounted, failing, seed)| {
            let mut comps: BTreeMap<usize, CompPlan> = BTreeMap::new();
            for (c, m) in mounted.iter().enumerate() {
                if *m {
                    comps.entry(c).or_default();
                }
            }
            for (k, a) in rows.iter().enumerate() {
                if let Some((c, v)) = a {
                    comps.entry(*c).or_default().rows.insert(k, *v);
                }
            }
            for (b, a) in containers.into_iter().enumerate() {
                if let Some((owner, plan)) = a {
                    let c = owner.unwrap_or(b % COMPONENTS);
                    comps.entry(c).or_default().containers.insert(b, plan);
                }
            }
            for (c, comp) in comps.iter_mut() {
                comp.fail = fails.get(*c).copied().flatten();
            }
            Plan {
                comps,
                failing: failing.unwrap_or_default(),
                seed,
            }
        })
}

/// One test case: the engine's settings and the sequence of runs.
#[derive(Clone, Debug)]
pub(crate) struct Case {
    pub(crate) max_attempts: u32,
    /// Declarations a component sends to the reconcilers while it runs.
    pub(crate) reconcile_chunk: usize,
    /// Actions per sink call.
    pub(crate) max_actions: usize,
    pub(crate) runs: Vec<Plan>,
}

pub(crate) fn case_strategy() -> impl Strategy<Value = Case> {
    (
        1u32..=2,
        prop_oneof![Just(1usize), Just(2), Just(3), Just(4096)],
        prop_oneof![Just(1usize), Just(2), Just(4096)],
        prop::collection::vec(plan_strategy(), 1..=MAX_RUNS),
    )
        .prop_map(|(max_attempts, reconcile_chunk, max_actions, runs)| Case {
            max_attempts,
            reconcile_chunk,
            max_actions,
            runs,
        })
}
