//! The model: what the engine may be tracking for each path, the values
//! each path may have in the external store after a run, the containers'
//! child generations, and the checks of a run against them.

use std::collections::{BTreeMap, BTreeSet};

use crate::plan::*;

/// Whether something happens: `can` (in some outcome the engine may
/// legitimately choose) and `must` (in all of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Maybe {
    can: bool,
    must: bool,
}

impl Maybe {
    const NO: Maybe = Maybe {
        can: false,
        must: false,
    };
    const YES: Maybe = Maybe {
        can: true,
        must: true,
    };

    fn of(b: bool) -> Maybe {
        if b {
            Maybe::YES
        } else {
            Maybe::NO
        }
    }

    /// Both happen.
    fn and(self, o: Maybe) -> Maybe {
        Maybe {
            can: self.can && o.can,
            must: self.must && o.must,
        }
    }

    /// One of them happens.
    fn or(self, o: Maybe) -> Maybe {
        Maybe {
            can: self.can || o.can,
            must: self.must || o.must,
        }
    }

    fn not(self) -> Maybe {
        Maybe {
            can: !self.must,
            must: !self.can,
        }
    }

    /// Over the possibilities of one thing: can if one can, must if all
    /// must (never, with no possibility).
    fn across(items: impl IntoIterator<Item = Maybe>) -> Maybe {
        let mut out: Option<Maybe> = None;
        for m in items {
            out = Some(match out {
                None => m,
                Some(o) => Maybe {
                    can: o.can || m.can,
                    must: o.must && m.must,
                },
            });
        }
        out.unwrap_or(Maybe::NO)
    }
}

/// What the engine may be tracking for one path. A container's `gens` are
/// its records (its possible generations); a row's are empty.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Track {
    /// In no component's entry.
    Gone,
    /// In `holder`'s entry, but below a container destroyed or created anew
    /// since it was written: none of its records counts. `direct`: its own
    /// container's generation leaves it out. Otherwise a container further
    /// up was destroyed, which makes its own container new when that is
    /// next reconciled; should that container's action then fail, the
    /// engine keeps the container's old records (the change may not have
    /// happened), and the state's records count again.
    Wiped {
        holder: usize,
        gens: BTreeSet<u32>,
        direct: bool,
    },
    /// In `owner`'s entry (a container: in the component `mount_target`
    /// mounted under `owner`), with its records.
    Held { owner: usize, gens: BTreeSet<u32> },
}

impl Track {
    fn holder(&self) -> Option<usize> {
        match self {
            Track::Gone => None,
            Track::Wiped { holder, .. } => Some(*holder),
            Track::Held { owner, .. } => Some(*owner),
        }
    }

    fn held(owner: usize, gens: impl IntoIterator<Item = u32>) -> Track {
        Track::Held {
            owner,
            gens: gens.into_iter().collect(),
        }
    }
}

type Tracks = BTreeSet<Track>;
/// The values a path may have in the external store (`None`: absent).
type Vals = BTreeSet<Option<String>>;

fn gone() -> Tracks {
    BTreeSet::from([Track::Gone])
}

fn absent() -> Vals {
    BTreeSet::from([None])
}

/// What the model knows of a container's child generation, which the
/// memo key of its child provider shows.
#[derive(Clone, Debug)]
struct ChildGen {
    /// The container's records were written under its own container's
    /// current generation and are not maybe missing: a mount that keeps its
    /// generation leaves the child generation as it is (otherwise the
    /// engine invalidates the children as `Lossy`, and moves it on).
    clean: Maybe,
    /// Whether the child generation moved on since its memo key was last
    /// seen.
    moved: Maybe,
    /// The memo key last seen, and every memo key it gave.
    last: Option<String>,
    given: BTreeSet<String>,
}

impl Default for ChildGen {
    fn default() -> Self {
        Self {
            clean: Maybe::YES,
            moved: Maybe::NO,
            last: None,
            given: BTreeSet::new(),
        }
    }
}

/// What the model knows between runs: the external store as last
/// observed, what the engine may be tracking for each path (absent: only
/// `Gone`), and the containers' child generations.
#[derive(Clone, Debug, Default)]
pub(crate) struct Model {
    store: BTreeMap<String, String>,
    tracks: BTreeMap<String, Tracks>,
    child_gens: BTreeMap<String, ChildGen>,
}

impl Model {
    /// Checks a run of `plan` against the model, given the components it
    /// reported failed, the memo keys its mounts gave and the store it
    /// left. Returns the model of the next run, or what the run did that
    /// the API rules out.
    pub(crate) fn after(
        &self,
        plan: &Plan,
        failed: &BTreeSet<usize>,
        memo_keys: &BTreeMap<String, String>,
        store: &BTreeMap<String, String>,
    ) -> std::result::Result<Model, String> {
        predict(self, plan, failed, memo_keys).and_then(|world| observe(world, self, store))
    }

    /// The store as last observed.
    pub(crate) fn store(&self) -> &BTreeMap<String, String> {
        &self.store
    }
}

/// The model during a run: the values each path may have, what may be
/// tracked for it, the containers' child generations, the memo keys the
/// run's mounts gave, and what contradicts the model so far.
struct World {
    vals: BTreeMap<String, Vals>,
    tracks: BTreeMap<String, Tracks>,
    child_gens: BTreeMap<String, ChildGen>,
    memo_keys: BTreeMap<String, String>,
    errors: Vec<String>,
}

impl World {
    fn new(model: &Model, memo_keys: &BTreeMap<String, String>) -> Self {
        Self {
            vals: model
                .store
                .iter()
                .map(|(p, v)| (p.clone(), BTreeSet::from([Some(v.clone())])))
                .collect(),
            tracks: model.tracks.clone(),
            child_gens: model.child_gens.clone(),
            memo_keys: memo_keys.clone(),
            errors: Vec::new(),
        }
    }

    fn child_gen(&self, p: &str) -> ChildGen {
        self.child_gens.get(p).cloned().unwrap_or_default()
    }

    /// Whether mounting `m` moves the container's child generation on: a
    /// new container, a changed one, or one whose records are not clean.
    fn bump(&self, m: &Mount) -> Maybe {
        let clean = self.child_gen(&m.path).clean;
        Maybe::across(self.tracks(&m.path).iter().map(|t| match t {
            Track::Held { gens, .. } if gens.contains(&m.spec.generation) => clean.not(),
            _ => Maybe::YES,
        }))
    }

    /// The containers directly below `p` are stale after a bump of its
    /// child generation.
    fn stale_below(&mut self, p: &str, bump: Maybe) {
        for d in self.below(p) {
            if parent_of(&d) == Some(p) && is_container(&d) {
                let mut g = self.child_gen(&d);
                g.clean = g.clean.and(bump.not());
                self.child_gens.insert(d, g);
            }
        }
    }

    /// Checks the memo key a successful mount of `m` gave.
    fn check_memo_key(&mut self, m: &Mount, bump: Maybe) {
        let mut g = self.child_gen(&m.path);
        let moved = g.moved.or(bump);
        let Some(key) = self.memo_keys.get(&m.path).cloned() else {
            self.errors.push(format!(
                "{} was mounted, but its memo key was not recorded",
                m.path
            ));
            return;
        };
        if moved.must && g.given.contains(&key) {
            self.errors.push(format!(
                "the child generation of {} moved on, but its memo key {key} is one it gave before ({:?})",
                m.path, g.given
            ));
        }
        if let Some(last) = &g.last {
            if !moved.can && *last != key {
                self.errors.push(format!(
                    "the memo key of {} changed from {last} to {key}, though nothing invalidated its children",
                    m.path
                ));
            }
        }
        g.clean = Maybe::YES;
        g.moved = Maybe::NO;
        g.last = Some(key.clone());
        g.given.insert(key);
        self.child_gens.insert(m.path.clone(), g);
    }

    fn vals(&self, p: &str) -> Vals {
        self.vals.get(p).cloned().unwrap_or_else(absent)
    }

    fn tracks(&self, p: &str) -> Tracks {
        self.tracks.get(p).cloned().unwrap_or_else(gone)
    }

    fn paths(&self) -> BTreeSet<String> {
        self.vals
            .keys()
            .chain(self.tracks.keys())
            .cloned()
            .collect()
    }

    fn below(&self, container: &str) -> Vec<String> {
        self.paths()
            .into_iter()
            .filter(|p| is_below(p, container))
            .collect()
    }

    /// The path's value is deleted (`m.must`), or may be (`m.can`).
    fn lose(&mut self, p: &str, m: Maybe) {
        if m.must {
            self.vals.insert(p.to_string(), absent());
        } else if m.can {
            self.vals.entry(p.to_string()).or_default().insert(None);
        }
    }

    /// A successful `mount_target` of `m` by component `c`: the container's
    /// action is applied, with the invalidation its handler answers.
    fn mount(&mut self, c: usize, m: &Mount, seed: u64) {
        #[derive(PartialEq)]
        enum Kind {
            New,
            Same,
            Changed,
        }
        let kinds: Vec<Kind> = self
            .tracks(&m.path)
            .iter()
            .map(|t| match t {
                Track::Gone | Track::Wiped { .. } => Kind::New,
                Track::Held { gens, .. } if gens.contains(&m.spec.generation) => Kind::Same,
                Track::Held { .. } => Kind::Changed,
            })
            .collect();
        let share = |f: &dyn Fn(&Kind) -> bool| Maybe {
            can: kinds.iter().any(f),
            must: kinds.iter().all(f),
        };
        let changed = share(&|k| *k == Kind::Changed);
        let destructive = m.spec.destructive;
        // A destructive change drops everything below from the store and
        // from what counts; a new container's contents have no records
        // that count either (the engine gives it a new generation).
        let wiped = share(&|k| *k == Kind::New || (destructive && *k == Kind::Changed));
        let bump = self.bump(m);
        self.check_memo_key(m, bump);
        self.stale_below(&m.path, bump);
        for d in self.below(&m.path) {
            let lost = if destructive || thinned(seed, &d) {
                changed
            } else {
                Maybe::NO
            };
            self.lose(&d, lost);
            let direct = parent_of(&d) == Some(m.path.as_str());
            self.wipe(&d, wiped, direct);
        }
        self.vals.insert(
            m.path.clone(),
            BTreeSet::from([Some(marker(m.spec.generation))]),
        );
        self.tracks.insert(
            m.path.clone(),
            BTreeSet::from([Track::held(c, [m.spec.generation])]),
        );
    }

    /// Records below a wiped container stop counting (`direct`: the
    /// container is the state's own).
    fn wipe(&mut self, p: &str, m: Maybe, direct: bool) {
        if !m.can {
            return;
        }
        let mut out = Tracks::new();
        for t in self.tracks(p) {
            let wiped = match &t {
                Track::Held { owner, gens } => Track::Wiped {
                    holder: *owner,
                    gens: gens.clone(),
                    direct,
                },
                Track::Wiped { holder, gens, .. } if direct => Track::Wiped {
                    holder: *holder,
                    gens: gens.clone(),
                    direct,
                },
                other => other.clone(),
            };
            if !m.must {
                out.insert(t);
            }
            out.insert(wiped);
        }
        self.tracks.insert(p.to_string(), out);
    }

    /// A `mount_target` of `m` by `c` whose container action failed: the
    /// store is unchanged; the attempted record is kept as a possible one,
    /// in the entry that held the container (a new one: in `c`'s).
    fn mount_failed(&mut self, c: usize, m: &Mount) {
        let generation = m.spec.generation;
        let before = self.tracks(&m.path);
        // A failed refresh (an unchanged container, clean, in its own
        // component) changes no record; any other failed action is kept as
        // possible, with the child generation it moved to, and leaves the
        // container maybe missing.
        let mut g = self.child_gen(&m.path);
        let refresh = Maybe::across(before.iter().map(|t| match t {
            Track::Held { owner, gens }
                if *owner == c && gens.len() == 1 && gens.contains(&generation) =>
            {
                g.clean
            }
            _ => Maybe::NO,
        }));
        let moved = self.bump(m).and(refresh.not());
        g.moved = g.moved.or(moved);
        g.clean = g.clean.and(refresh);
        self.child_gens.insert(m.path.clone(), g);
        self.stale_below(&m.path, moved);
        let out: Tracks = before
            .iter()
            .cloned()
            .map(|t| match t {
                Track::Gone => Track::held(c, [generation]),
                Track::Wiped {
                    holder, mut gens, ..
                }
                | Track::Held {
                    owner: holder,
                    mut gens,
                } => {
                    gens.insert(generation);
                    Track::Held {
                        owner: holder,
                        gens,
                    }
                }
            })
            .collect();
        self.tracks.insert(m.path.clone(), out);
        // A wiped container's old records are kept: what was wiped only
        // through it counts again.
        let revived = Maybe {
            can: before.iter().any(|t| matches!(t, Track::Wiped { .. })),
            must: before.iter().all(|t| matches!(t, Track::Wiped { .. })),
        };
        if !revived.can {
            return;
        }
        for d in self.below(&m.path) {
            if parent_of(&d) != Some(m.path.as_str()) {
                continue;
            }
            let mut out = Tracks::new();
            for t in self.tracks(&d) {
                if let Track::Wiped {
                    holder,
                    gens,
                    direct: false,
                } = &t
                {
                    out.insert(Track::Held {
                        owner: *holder,
                        gens: gens.clone(),
                    });
                    if revived.must {
                        continue;
                    }
                }
                out.insert(t);
            }
            self.tracks.insert(d, out);
        }
    }

    /// Component `c` commits its rows: `ok` if the commit may succeed
    /// (every row written and now held by `c`), `failed` if it may fail
    /// (each row written or not; records stay where they were, a new one
    /// goes to `c`).
    fn commit(&mut self, c: usize, rows: &BTreeMap<String, String>, ok: bool, failed: bool) {
        for (p, v) in rows {
            let mut vals = Vals::new();
            let mut tracks = Tracks::new();
            if ok {
                vals.insert(Some(v.clone()));
                tracks.insert(Track::held(c, []));
            }
            if failed {
                vals.extend(self.vals(p));
                vals.insert(Some(v.clone()));
                tracks.extend(self.tracks(p).into_iter().map(|t| match t {
                    Track::Gone => Track::held(c, []),
                    Track::Wiped { holder, .. } | Track::Held { owner: holder, .. } => {
                        Track::held(holder, [])
                    }
                }));
            }
            self.vals.insert(p.clone(), vals);
            self.tracks.insert(p.clone(), tracks);
        }
    }
}

/// What happens to each tracked state at the end of a run.
struct Fates {
    /// Per path and possibility: whether the state leaves the ledger, and
    /// whether its delete action is applied.
    own: BTreeMap<String, Vec<(Track, Maybe, Maybe)>>,
    /// Per holder: whether a delete of it that must fail (its path is
    /// failing) is attempted.
    failing_deletes: BTreeMap<usize, Maybe>,
    /// Per container: whether its delete is attempted and fails.
    failed_container_deletes: BTreeMap<String, Maybe>,
}

impl Fates {
    /// The end-of-run deletions. `registered`: the paths declared in this
    /// run by components that reached their commit (rows) or by container
    /// components (containers). `cleaning(o)`: whether `o` commits (or is
    /// no longer mounted), so its states no longer declared are deleted.
    /// `unit_ok(o)`, if known: whether `o`'s row deletions all succeed.
    fn new(
        world: &World,
        registered: &BTreeSet<String>,
        failing: &BTreeSet<String>,
        cleaning: &dyn Fn(usize) -> Maybe,
        unit_ok: &dyn Fn(usize) -> Option<bool>,
    ) -> Self {
        let paths: Vec<String> = world.tracks.keys().cloned().collect();
        let survivor_of = |p: &str, t: &Track| match t.holder() {
            Some(o) if !registered.contains(p) => cleaning(o),
            _ => Maybe::NO,
        };
        let survivor: BTreeMap<&str, Maybe> = paths
            .iter()
            .map(|p| {
                let s = Maybe::across(world.tracks(p).iter().map(|t| survivor_of(p, t)));
                (p.as_str(), s)
            })
            .collect();
        // Reconciled one by one: a survivor with no survivor above it,
        // whose provider is registered (the root's, or a container's
        // declared in this run).
        let top_of = |p: &str, t: &Track| {
            let below = ancestors(p).iter().fold(Maybe::NO, |acc, a| {
                acc.or(survivor.get(a).copied().unwrap_or(Maybe::NO))
            });
            let resolved = parent_of(p).is_none_or(|a| registered.contains(a));
            survivor_of(p, t).and(below.not()).and(Maybe::of(resolved))
        };
        let mut failing_deletes: BTreeMap<usize, Maybe> = BTreeMap::new();
        let mut failing_rows: BTreeMap<usize, Maybe> = BTreeMap::new();
        let mut failed_container_deletes: BTreeMap<String, Maybe> = BTreeMap::new();
        for p in paths.iter().filter(|p| failing.contains(*p)) {
            let tracks = world.tracks(p);
            if is_container(p) {
                let attempted = Maybe::across(tracks.iter().map(|t| match t {
                    Track::Held { .. } => top_of(p, t),
                    _ => Maybe::NO,
                }));
                failed_container_deletes.insert(p.clone(), attempted);
            }
            let owners: BTreeSet<usize> = tracks
                .iter()
                .filter_map(|t| match t {
                    Track::Held { owner, .. } => Some(*owner),
                    _ => None,
                })
                .collect();
            for o in owners {
                let attempted = Maybe::across(tracks.iter().map(|t| match t {
                    Track::Held { owner, .. } if *owner == o => top_of(p, t),
                    _ => Maybe::NO,
                }));
                let all = failing_deletes.entry(o).or_insert(Maybe::NO);
                *all = all.or(attempted);
                if !is_container(p) {
                    let rows = failing_rows.entry(o).or_insert(Maybe::NO);
                    *rows = rows.or(attempted);
                }
            }
        }
        // A component's row deletions are one unit, which fails when one of
        // them does; a container's delete is a unit of its own.
        let row_unit = |o: usize| match unit_ok(o) {
            Some(true) => Maybe::YES,
            _ => failing_rows.get(&o).copied().unwrap_or(Maybe::NO).not(),
        };
        let mut own = BTreeMap::new();
        for p in &paths {
            let fates = world
                .tracks(p)
                .into_iter()
                .map(|t| {
                    let top = top_of(p, &t);
                    // The unit's success: the state leaves the ledger. A
                    // failed unit keeps every state (maybe missing), but
                    // those of its deletes that went in calls that did not
                    // fail were applied.
                    let unit = |holder: usize| {
                        if failing.contains(p) {
                            Maybe::NO
                        } else if is_container(p) {
                            Maybe::YES
                        } else {
                            row_unit(holder)
                        }
                    };
                    match &t {
                        Track::Gone => (t, Maybe::NO, Maybe::NO),
                        Track::Held { owner, .. } => {
                            let unit = unit(*owner);
                            let removed = top.and(unit);
                            let deleted = if failing.contains(p) {
                                Maybe::NO
                            } else {
                                Maybe {
                                    can: top.can,
                                    must: top.must && unit.must,
                                }
                            };
                            (t, removed, deleted)
                        }
                        // No record counts: no action, only forgotten.
                        Track::Wiped { holder, .. } => {
                            let removed = top.and(unit(*holder));
                            (t, removed, Maybe::NO)
                        }
                    }
                })
                .collect();
            own.insert(p.clone(), fates);
        }
        Self {
            own,
            failing_deletes,
            failed_container_deletes,
        }
    }

    fn failing_delete(&self, o: usize) -> Maybe {
        self.failing_deletes.get(&o).copied().unwrap_or(Maybe::NO)
    }

    /// Applies the deletions: a deleted container takes everything below
    /// it, in the store and in the ledger; a container whose delete failed
    /// is maybe missing.
    fn apply(&self, world: &mut World) {
        for (p, failed) in &self.failed_container_deletes {
            let mut g = world.child_gen(p);
            g.clean = g.clean.and(failed.not());
            world.child_gens.insert(p.clone(), g);
        }
        let mut container_removed: BTreeMap<&str, Maybe> = BTreeMap::new();
        let mut container_deleted: BTreeMap<&str, Maybe> = BTreeMap::new();
        for (p, fates) in &self.own {
            if is_container(p) {
                container_removed.insert(p, Maybe::across(fates.iter().map(|f| f.1)));
                container_deleted.insert(p, Maybe::across(fates.iter().map(|f| f.2)));
            }
        }
        for p in world.paths() {
            let from_above = |m: &BTreeMap<&str, Maybe>| {
                ancestors(&p).iter().fold(Maybe::NO, |acc, a| {
                    acc.or(m.get(a).copied().unwrap_or(Maybe::NO))
                })
            };
            let removed_above = from_above(&container_removed);
            let deleted_above = from_above(&container_deleted);
            let fates = self.own.get(&p).cloned().unwrap_or_default();
            let deleted = Maybe::across(fates.iter().map(|f| f.2)).or(deleted_above);
            world.lose(&p, deleted);
            if fates.is_empty() && !removed_above.can {
                continue;
            }
            let possibilities = if fates.is_empty() {
                world
                    .tracks(&p)
                    .into_iter()
                    .map(|t| (t, Maybe::NO, Maybe::NO))
                    .collect()
            } else {
                fates
            };
            let mut tracks = Tracks::new();
            for (t, removed, _) in possibilities {
                let removed = removed.or(removed_above);
                if !removed.must {
                    tracks.insert(t);
                }
                if removed.can {
                    tracks.insert(Track::Gone);
                }
            }
            world.tracks.insert(p, tracks);
        }
    }
}

/// How a component's run goes as far as its code decides.
struct CompRun {
    mounts: Vec<Mount>,
    rows: BTreeMap<String, String>,
    /// How many containers it mounted successfully.
    applied: usize,
    /// Whether the next container's action failed (its mount returned `Err`).
    failed_mount: bool,
    /// Whether its code returned `Ok` (then it reaches its commit).
    code_ok: bool,
    fail: Option<FailAt>,
}

impl CompRun {
    fn new(plan: &CompPlan, failing: &BTreeSet<String>) -> Self {
        let mounts = plan.mounts();
        let mut run = CompRun {
            applied: 0,
            failed_mount: false,
            code_ok: false,
            rows: plan.rows(),
            fail: plan.fail,
            mounts,
        };
        if plan.fail == Some(FailAt::Start) {
            return run;
        }
        match run.mounts.iter().position(|m| failing.contains(&m.path)) {
            Some(i) => {
                run.applied = i;
                run.failed_mount = true;
            }
            None => {
                run.applied = run.mounts.len();
                run.code_ok = plan.fail.is_none();
            }
        }
        run
    }

    /// The containers whose components reconciled them.
    fn reached(&self) -> &[Mount] {
        let n = self.applied + usize::from(self.failed_mount);
        self.mounts.get(..n).unwrap_or(&[])
    }

    fn why_failed(&self) -> String {
        match (self.fail, self.failed_mount) {
            (_, true) => format!(
                "the action of its container {} fails",
                self.mounts
                    .get(self.applied)
                    .map_or("?", |m| m.path.as_str())
            ),
            (Some(at), _) => format!("its code returns Err ({at:?})"),
            (None, false) => "nothing".into(),
        }
    }
}

/// Predicts a run of `plan` from `model`, given the components the run
/// reported failed: the values each path may have, and what the engine may
/// track next. An `Err` names an outcome the API rules out.
fn predict(
    model: &Model,
    plan: &Plan,
    failed: &BTreeSet<usize>,
    memo_keys: &BTreeMap<String, String>,
) -> std::result::Result<World, String> {
    let runs: BTreeMap<usize, CompRun> = plan
        .comps
        .iter()
        .map(|(c, p)| (*c, CompRun::new(p, &plan.failing)))
        .collect();
    let mut registered: BTreeSet<String> = BTreeSet::new();
    for r in runs.values() {
        registered.extend(r.reached().iter().map(|m| m.path.clone()));
        if r.code_ok {
            registered.extend(r.rows.keys().cloned());
        }
    }
    for (c, r) in &runs {
        if !r.code_ok && !failed.contains(c) {
            return Err(format!(
                "c{c} must fail ({}), but the run did not report it",
                r.why_failed()
            ));
        }
    }

    let mut world = World::new(model, memo_keys);
    for (c, r) in &runs {
        for m in r.mounts.get(..r.applied).unwrap_or(&[]) {
            world.mount(*c, m, plan.seed);
        }
        if r.failed_mount {
            if let Some(m) = r.mounts.get(r.applied) {
                world.mount_failed(*c, m);
            }
        }
    }

    // Which deletions could fail if every component that can commit did.
    let optimistic = |o: usize| runs.get(&o).map_or(Maybe::YES, |r| Maybe::of(r.code_ok));
    let probe = Fates::new(&world, &registered, &plan.failing, &optimistic, &|_| None);
    // For each component that reaches its commit: whether the commit may
    // succeed, and whether it may fail, as its reported failure allows.
    let mut commits: BTreeMap<usize, (bool, bool)> = BTreeMap::new();
    for (c, r) in runs.iter().filter(|(_, r)| r.code_ok) {
        if !failed.contains(c) {
            commits.insert(*c, (true, false));
            continue;
        }
        let may_fail_commit = r.rows.keys().any(|p| plan.failing.contains(p));
        let may_fail_deletes = probe.failing_delete(*c).can;
        if !may_fail_commit && !may_fail_deletes {
            return Err(format!(
                "c{c} was reported failed, but none of its rows or deletions has a failing path"
            ));
        }
        commits.insert(*c, (may_fail_deletes, may_fail_commit));
    }
    for c in failed.iter().filter(|c| !runs.contains_key(c)) {
        if !probe.failing_delete(*c).can {
            return Err(format!(
                "c{c} (no longer mounted) was reported failed, but none of its deletions has a failing path"
            ));
        }
    }
    for (c, r) in &runs {
        if let Some((ok, bad)) = commits.get(c) {
            world.commit(*c, &r.rows, *ok, *bad);
        }
    }

    let cleaning = |o: usize| match (runs.get(&o), commits.get(&o)) {
        (None, _) => Maybe::YES,
        (Some(_), Some((ok, bad))) => Maybe {
            can: *ok,
            must: !*bad,
        },
        (Some(_), None) => Maybe::NO,
    };
    let unit_ok = |o: usize| (!failed.contains(&o)).then_some(true);
    let fates = Fates::new(&world, &registered, &plan.failing, &cleaning, &unit_ok);
    for o in 0..COMPONENTS {
        if !failed.contains(&o) && fates.failing_delete(o).must {
            return Err(format!(
                "a delete of c{o} with a failing path must have been attempted, but the run did not report c{o} failed"
            ));
        }
    }
    fates.apply(&mut world);
    if !world.errors.is_empty() {
        return Err(world.errors.join("\n  "));
    }
    let unexpected: Vec<&String> = memo_keys
        .keys()
        .filter(|p| {
            !runs.values().any(|r| {
                r.mounts
                    .get(..r.applied)
                    .unwrap_or(&[])
                    .iter()
                    .any(|m| m.path == **p)
            })
        })
        .collect();
    if !unexpected.is_empty() {
        return Err(format!(
            "mounts of {unexpected:?} succeeded, which the model says could not"
        ));
    }
    Ok(world)
}

fn show_tracks(tracks: &Tracks) -> String {
    let items: Vec<String> = tracks
        .iter()
        .map(|t| match t {
            Track::Gone => "gone".to_string(),
            Track::Wiped {
                holder,
                gens,
                direct,
            } => {
                let how = if *direct { "wiped" } else { "wiped above" };
                format!("{how} in c{holder} {gens:?}")
            }
            Track::Held { owner, gens } if gens.is_empty() => format!("c{owner}"),
            Track::Held { owner, gens } => format!("c{owner} {gens:?}"),
        })
        .collect();
    format!("{{{}}}", items.join(", "))
}

/// Checks the observed store against a prediction, and makes the model of
/// the next run: the observed store, and what may be tracked (a path in the
/// store is tracked with records that count, or the engine lost it).
fn observe(
    world: World,
    before: &Model,
    store: &BTreeMap<String, String>,
) -> std::result::Result<Model, String> {
    let mut wrong = Vec::new();
    let paths: BTreeSet<String> = world
        .paths()
        .into_iter()
        .chain(store.keys().cloned())
        .collect();
    for p in &paths {
        let allowed = world.vals(p);
        let seen = store.get(p).cloned();
        if !allowed.contains(&seen) {
            let before_value = before.store.get(p);
            wrong.push(format!(
                "{p} is {seen:?} (before the run {before_value:?}; tracked as {} before, {} now), expected one of {allowed:?}",
                show_tracks(&before.tracks.get(p).cloned().unwrap_or_else(gone)),
                show_tracks(&world.tracks(p)),
            ));
        }
    }
    if !wrong.is_empty() {
        return Err(wrong.join("\n  "));
    }
    let mut tracks = world.tracks;
    for (p, v) in store {
        let entry = tracks.entry(p.clone()).or_insert_with(gone);
        entry.retain(|t| matches!(t, Track::Held { .. }));
        if entry.is_empty() {
            return Err(format!(
                "{p}={v} is in the external store, but no component can hold records of it that count"
            ));
        }
    }
    tracks.retain(|_, t| *t != gone());
    Ok(Model {
        store: store.clone(),
        tracks,
        child_gens: world.child_gens,
    })
}
