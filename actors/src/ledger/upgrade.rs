//! Upgrades of the stored form of a ledger written by an earlier build.
//!
//! A ledger records its format version (`mformat`). A build opens every
//! format it knows and, before it writes anything, marks the ledger with
//! its own version and the version it found (`mupgrade`); it then
//! upgrades the ledger in place and clears `mupgrade`. Builds that do not
//! know the new version refuse the ledger from the start, naming the
//! version they read, so none ever reads a ledger half upgraded; a build
//! that finds `mupgrade` (the upgrade was cut short) resumes it.
//!
//! | from | to | what changes in the store |
//! |------|----|---------------------------|
//! | 1    | 2  | nothing: deltas and the tree of large values appear as commits write them |
//! | 2    | 3  | SQLite's tables providers are renamed (below) |
//! | 3    | 4  | memo keys (`o`) move into packs (`q`): see [`memo`](super::memo); moved at every opening that finds some, before anything reads them |
//!
//! # Format 3: one name for the tables providers of SQL databases
//!
//! The SQL table target names the root provider of a database's tables
//! `weir.<dialect>.table/<db>`. Ledgers written before format 3 hold
//! SQLite's under another form, `weir.sqlite/<db>/table`. A ledger keeps
//! a root provider's name in two places:
//! - as the first segment of the path of every state below it (so in
//!   component entries, their deltas and packs, and the `d` keys of the
//!   containers below it);
//! - as the second item of the key `[@target, name, key]` of each
//!   component `mount_target` mounts one of its containers in (so in that
//!   component's keys, and in its parent's child list).
//!
//! Were a name to change without its records, a run would find every
//! table and row of that database undeclared, delete them, and create
//! them again. So the upgrade reads the whole record of every component,
//! renames both forms, and replaces each component whose record changed
//! (forgotten under its old key, restored under its new one, in one
//! commit: the ops that worker groups restore partitions with), a few
//! thousand components a commit; then it deletes the `d` keys that still
//! name an old path or component.
//!
//! An upgrade finds nothing to rename in what it already renamed (no new
//! name has the old form): after a crash at any point, the next opening
//! runs the same upgrade and finishes it before anything reads the ledger
//! (a parent's child list renamed by one commit and its child's record by
//! the next are never seen apart).
//!
//! A component whose new key already has a record (a provider an app
//! named in the new form itself) is merged into it rather than replacing
//! it: the states of both, a state held under both names with the records
//! of both as possible records, possibly missing, so that its next run
//! judges every form it may be in; the children of both; no memo key. The intents a crash left are folded
//! before the upgrade, under the names they were journaled with.
//!
//! The engine names no connector anywhere else. It does here because the
//! stored names are data it wrote, and only it can rewrite them before
//! anything reads them.

use std::sync::Arc;

use serde_bytes::ByteBuf;

use super::record::{ComponentRecord, LedgerOp, StateEntry};
use super::{split_container_key, Ledger, FORMAT_VERSION, P_CONTAINER, UPGRADE_KEY};
use crate::error::Result;
use crate::model::keycode;
use crate::model::path::TARGET_SYMBOL;
use crate::model::StableKey;

/// The first format that names SQLite's tables providers
/// `weir.sqlite.table/<db>`.
const FORMAT_UNIFIED_TABLE_PROVIDERS: u32 = 3;

/// How many components' records one commit of the upgrade renames: each
/// commit holds them in memory, so a ledger of millions of components is
/// renamed a part at a time.
const RENAMED_PER_COMMIT: usize = 4096;

impl Ledger {
    /// Upgrades a ledger of format `from` (already marked with this
    /// build's version, see `check_format`) to this build's, then clears
    /// the mark of the upgrade under way.
    pub(super) fn upgrade(&self, from: u32) -> Result<()> {
        if from >= FORMAT_VERSION {
            return Ok(());
        }
        if from < FORMAT_UNIFIED_TABLE_PROVIDERS {
            self.rename_table_providers()?;
        }
        self.tree.remove(UPGRADE_KEY)?;
        self.tree.flush()?;
        Ok(())
    }

    /// Renames SQLite's tables providers in every component's record, and
    /// drops the container keys that name the old form.
    fn rename_table_providers(&self) -> Result<()> {
        let mut ops = Vec::new();
        let mut renamed = 0;
        for component in self.component_keys(|_| true)? {
            let Some(mut record) = self.record_of(&component)? else {
                continue;
            };
            let new_key = renamed_component(&component);
            if !rename_in_record(&mut record) && new_key.is_none() {
                continue;
            }
            match new_key {
                None => ops.push(LedgerOp::Restore {
                    component,
                    record: Box::new(record),
                }),
                Some(new_key) => {
                    // What the new key holds is read from the store: what
                    // was renamed so far is committed first.
                    self.apply_renamed(&mut ops)?;
                    if let Some(mut held) = self.record_of(&new_key)? {
                        rename_in_record(&mut held);
                        merge_records(&mut held, record);
                        record = held;
                    }
                    ops.push(LedgerOp::Forget { component });
                    ops.push(LedgerOp::Restore {
                        component: new_key,
                        record: Box::new(record),
                    });
                }
            }
            renamed += 1;
            if renamed % RENAMED_PER_COMMIT == 0 {
                self.apply_renamed(&mut ops)?;
            }
        }
        self.apply_renamed(&mut ops)?;
        self.drop_renamed_container_keys()?;
        self.tree.flush()?;
        Ok(())
    }

    /// Commits the renaming ops gathered so far.
    fn apply_renamed(&self, ops: &mut Vec<LedgerOp>) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        self.apply(std::mem::take(ops))
    }

    /// Deletes the `d` keys whose container or component has an old name
    /// (restoring the component wrote them under the new one).
    fn drop_renamed_container_keys(&self) -> Result<()> {
        let mut stale = sled::Batch::default();
        let mut any = false;
        for k in self.tree.scan_prefix([P_CONTAINER]).keys() {
            let k = k?;
            let renamed =
                k.get(1..)
                    .and_then(split_container_key)
                    .is_some_and(|(container, component)| {
                        renamed_path(container).is_some() || renamed_component(component).is_some()
                    });
            if renamed {
                stale.remove(k);
                any = true;
            }
        }
        if any {
            self.tree.apply_batch(stale)?;
        }
        Ok(())
    }
}

/// The format-3 name of a root provider that format 2 named otherwise:
/// `weir.sqlite/<db>/table` becomes `weir.sqlite.table/<db>`.
fn renamed_provider(name: &str) -> Option<String> {
    let db = name.strip_prefix("weir.sqlite/")?.strip_suffix("/table")?;
    Some(format!("weir.sqlite.table/{db}"))
}

/// A state or provider path under a renamed root provider, renamed.
fn renamed_path(path: &[u8]) -> Option<Vec<u8>> {
    let (name, rest) = keycode::split_root_provider(path)?;
    let new = renamed_provider(&name)?;
    let mut out = Vec::with_capacity(path.len() + 1);
    keycode::put_name(&mut out, keycode::TAG_PROVIDER, &new);
    out.extend_from_slice(rest);
    Some(out)
}

/// The key of a component `mount_target` mounted a container of a
/// renamed root provider in, renamed.
fn renamed_key(key: &StableKey) -> Option<StableKey> {
    let StableKey::Array(items) = key else {
        return None;
    };
    let [StableKey::Symbol(symbol), StableKey::Str(name), inner] = &items[..] else {
        return None;
    };
    if &**symbol != TARGET_SYMBOL {
        return None;
    }
    let new = renamed_provider(name)?;
    Some(StableKey::Array(Arc::from([
        StableKey::Symbol(Arc::clone(symbol)),
        StableKey::Str(Arc::from(new)),
        inner.clone(),
    ])))
}

/// An encoded component path with a renamed segment, renamed.
fn renamed_component(component: &[u8]) -> Option<Vec<u8>> {
    let segments = keycode::decode_component(component)?;
    let mut changed = false;
    let renamed: Vec<StableKey> = segments
        .into_iter()
        .map(|segment| match renamed_key(&segment) {
            Some(new) => {
                changed = true;
                new
            }
            None => segment,
        })
        .collect();
    changed.then(|| keycode::component_key(&renamed))
}

/// Renames the paths of a record's states (keeping them sorted by path,
/// and a state held under both names once) and the keys of its children;
/// whether anything changed.
fn rename_in_record(record: &mut ComponentRecord) -> bool {
    let mut changed = false;
    for state in &mut record.entry.states {
        if let Some(path) = renamed_path(&state.path) {
            state.path = ByteBuf::from(path);
            changed = true;
        }
    }
    if changed {
        fold_same_paths(&mut record.entry.states);
    }
    for child in &mut record.children {
        if let Some(key) = renamed_key(child) {
            *child = key;
            changed = true;
        }
    }
    changed
}

/// Sorts states by path, and folds those with one path into one whose
/// records are all of theirs, possibly missing (the state may be in any
/// of those forms, or none), under the older of their generations.
fn fold_same_paths(states: &mut Vec<StateEntry>) {
    states.sort_by(|a, b| a.path.cmp(&b.path));
    let mut folded: Vec<StateEntry> = Vec::with_capacity(states.len());
    for state in states.drain(..) {
        match folded.last_mut() {
            Some(last) if last.path == state.path => {
                for record in state.records {
                    if !last.records.contains(&record) {
                        last.records.push(record);
                    }
                }
                last.may_be_missing = true;
                last.gen = last.gen.min(state.gen);
                last.child_gen = last.child_gen.or(state.child_gen);
            }
            _ => folded.push(state),
        }
    }
    *states = folded;
}

/// Merges `from` (a record renamed to a key that holds one) into `into`
/// (see the module docs).
fn merge_records(into: &mut ComponentRecord, from: ComponentRecord) {
    into.entry.states.extend(from.entry.states);
    fold_same_paths(&mut into.entry.states);
    if into.entry.failure.is_none() {
        into.entry.failure = from.entry.failure;
    }
    let known: std::collections::HashSet<StableKey> = into.children.iter().cloned().collect();
    into.children.extend(
        from.children
            .into_iter()
            .filter(|child| !known.contains(child)),
    );
    into.memo = None;
    into.failed_runs = into.failed_runs.max(from.failed_runs);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::buf;
    use crate::ledger::record::{ComponentEntry, Intent};
    use crate::ledger::tests::container_keys;
    use crate::ledger::FORMAT_KEY;
    use crate::Result;

    fn path(provider: &str, keys: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        keycode::put_name(&mut out, keycode::TAG_PROVIDER, provider);
        for k in keys {
            keycode::put_key(&mut out, &StableKey::Str(Arc::from(*k)));
        }
        out
    }

    fn str_key(s: &str) -> StableKey {
        StableKey::Str(Arc::from(s))
    }

    /// The key of the component `mount_target` mounts the table `docs` of
    /// the database `db` in.
    fn mount_key(provider: &str) -> StableKey {
        StableKey::Array(Arc::from([
            StableKey::Symbol(Arc::from(TARGET_SYMBOL)),
            str_key(provider),
            table_key(),
        ]))
    }

    /// A state at `path` with one record.
    fn held(path: Vec<u8>, record: &[u8]) -> StateEntry {
        StateEntry {
            path: buf(&path),
            records: vec![buf(record)],
            ..StateEntry::default()
        }
    }

    #[test]
    fn only_sqlites_former_tables_provider_names_are_renamed() {
        assert_eq!(
            renamed_provider("weir.sqlite/db/table").as_deref(),
            Some("weir.sqlite.table/db")
        );
        assert_eq!(
            renamed_provider("weir.sqlite/a/b/table").as_deref(),
            Some("weir.sqlite.table/a/b")
        );
        for kept in [
            "weir.sqlite.table/db",
            "weir.postgres.table/db",
            "weir.sqlite/table",
            "weir.sqlite/db/tables",
            "mine/table",
        ] {
            assert_eq!(renamed_provider(kept), None, "{kept}");
        }
    }

    #[test]
    fn a_renamed_path_keeps_everything_after_its_root_provider() {
        let old = path("weir.sqlite/db/table", &["docs", "row\0key"]);
        assert_eq!(
            renamed_path(&old),
            Some(path("weir.sqlite.table/db", &["docs", "row\0key"]))
        );
        assert_eq!(renamed_path(&path("weir.postgres.table/db", &["t"])), None);
        assert_eq!(renamed_path(b"\x30not a path\0"), None);
    }

    #[test]
    fn a_component_mounted_for_a_renamed_provider_is_renamed_at_any_depth() {
        let old = keycode::component_key(&[str_key("file"), mount_key("weir.sqlite/db/table")]);
        assert_eq!(
            renamed_component(&old),
            Some(keycode::component_key(&[
                str_key("file"),
                mount_key("weir.sqlite.table/db")
            ]))
        );
        let other = keycode::component_key(&[str_key("file"), mount_key("weir.postgres.table/db")]);
        assert_eq!(renamed_component(&other), None);
        assert_eq!(renamed_component(&keycode::component_key(&[])), None);
    }

    #[test]
    fn a_record_with_renamed_paths_keeps_its_states_sorted_and_renames_its_children() {
        let state = |p: Vec<u8>| held(p, b"r");
        // The old name sorts before "weir.sqlite.zzz", the new one after.
        let mut record = ComponentRecord {
            entry: super::super::record::ComponentEntry {
                states: vec![
                    state(path("weir.sqlite/db/table", &["docs"])),
                    state(path("weir.sqlite.tablf", &["x"])),
                ],
                failure: None,
            },
            children: vec![mount_key("weir.sqlite/db/table"), str_key("other")],
            memo: None,
            failed_runs: 0,
        };
        assert!(rename_in_record(&mut record));
        let paths: Vec<&[u8]> = record.entry.states.iter().map(|s| &s.path[..]).collect();
        let mut sorted = paths.clone();
        sorted.sort();
        assert_eq!(paths, sorted);
        assert!(paths.contains(&&path("weir.sqlite.table/db", &["docs"])[..]));
        assert_eq!(
            record.children,
            vec![mount_key("weir.sqlite.table/db"), str_key("other")]
        );
        assert!(
            !rename_in_record(&mut record),
            "renaming twice changes nothing"
        );
    }

    /// The keys of a ledger's container index, as (container, component).
    fn mark_format(ledger: &Ledger, version: u32) -> Result<()> {
        ledger.tree.insert(FORMAT_KEY, &version.to_be_bytes())?;
        ledger.flush()
    }

    /// A ledger as format 2 wrote a SQLite table synced from one file: the
    /// root lists the file's component and the one `mount_target` mounted
    /// the table in, which holds the table (with a memo key); the file's
    /// component holds a row below the table.
    fn format_2_ledger(dir: &std::path::Path, old: &str) -> Result<()> {
        let ledger = Ledger::open(dir, 1 << 20)?;
        let table = path(old, &["docs"]);
        let mut row = table.clone();
        keycode::put_key(&mut row, &str_key("a"));
        let entry = |p: &[u8]| held(p.to_vec(), b"r");
        let root = keycode::component_key(&[]);
        let mount = keycode::component_key(&[mount_key(old)]);
        let file = keycode::component_key(&[str_key("a.txt")]);
        ledger.apply(vec![
            LedgerOp::AddChildren {
                component: root,
                children: vec![mount_key(old), str_key("a.txt")],
            },
            LedgerOp::Put {
                component: mount.clone(),
                entry: entry(&table),
                index_owner: true,
                container: None,
            },
            LedgerOp::SetMemo {
                component: mount,
                memo: Some(b"m".to_vec()),
            },
            LedgerOp::Put {
                component: file,
                entry: entry(&row),
                index_owner: true,
                container: Some(table),
            },
        ])?;
        mark_format(&ledger, 2)
    }

    /// A directory holding [`format_2_ledger`]'s ledger.
    fn format_2_dir() -> Result<tempfile::TempDir> {
        let dir = tempfile::tempdir()?;
        format_2_ledger(dir.path(), OLD)?;
        Ok(dir)
    }

    #[test]
    fn a_format_2_ledger_opens_with_sqlites_tables_provider_renamed_everywhere() -> Result<()> {
        let (old, new) = (OLD, NEW);
        let dir = format_2_dir()?;
        let ledger = Ledger::open(dir.path(), 1 << 20)?;

        let (old_table, new_table) = (path(old, &["docs"]), path(new, &["docs"]));
        let mut new_row = new_table.clone();
        keycode::put_key(&mut new_row, &str_key("a"));
        let (old_mount, new_mount) = (
            keycode::component_key(&[mount_key(old)]),
            keycode::component_key(&[mount_key(new)]),
        );
        let file = keycode::component_key(&[str_key("a.txt")]);
        assert!(
            ledger.record_of(&old_mount)?.is_none(),
            "nothing left under the old key"
        );
        let mount = ledger
            .record_of(&new_mount)?
            .ok_or_else(|| crate::Error::msg("the mount component moved"))?;
        let table_paths: Vec<&[u8]> = mount.entry.states.iter().map(|s| &s.path[..]).collect();
        assert_eq!(table_paths, vec![&new_table[..]]);
        assert_eq!(mount.memo.map(|m| m.into_vec()), Some(b"m".to_vec()));
        let rows = ledger
            .component(&file)?
            .ok_or_else(|| crate::Error::msg("the file's entry"))?;
        assert_eq!(rows.states.len(), 1);
        assert_eq!(&rows.states[0].path[..], &new_row[..]);
        assert_eq!(
            ledger.children(&keycode::component_key(&[]))?,
            vec![mount_key(new), str_key("a.txt")]
        );
        assert_eq!(ledger.owner_candidates(&new_table).len(), 1);
        assert!(ledger.owner_candidates(&old_table).is_empty());
        assert_eq!(
            container_keys(&ledger)?,
            vec![(new_table.clone(), file.clone())]
        );
        assert_eq!(
            ledger.tree.get(FORMAT_KEY)?.as_deref(),
            Some(&FORMAT_VERSION.to_be_bytes()[..])
        );

        // The renamed container index still finds the row.
        ledger.apply(vec![LedgerOp::DropDescendants { path: new_table }])?;
        assert!(ledger.component(&file)?.is_none_or(|e| e.states.is_empty()));
        Ok(())
    }

    #[test]
    fn an_upgrade_cut_short_is_finished_when_the_ledger_opens_again() -> Result<()> {
        let (old, new) = (OLD, NEW);
        let dir = format_2_dir()?;
        {
            // As a crash leaves it right after the ledger was marked.
            let ledger = Ledger::open(dir.path(), 1 << 20)?;
            mark_format(&ledger, 2)?;
            ledger.tree.insert(UPGRADE_KEY, &2u32.to_be_bytes())?;
            mark_format(&ledger, FORMAT_VERSION)?;
            ledger.tree.insert(
                super::super::container_key(
                    &path(old, &["docs"]),
                    &keycode::component_key(&[str_key("x")]),
                ),
                &[][..],
            )?;
            ledger.flush()?;
        }
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        let file = keycode::component_key(&[str_key("a.txt")]);
        assert_eq!(container_keys(&ledger)?, vec![(path(new, &["docs"]), file)]);
        assert!(
            ledger.tree.get(UPGRADE_KEY)?.is_none(),
            "the upgrade is over"
        );
        assert_eq!(
            ledger.tree.get(FORMAT_KEY)?.as_deref(),
            Some(&FORMAT_VERSION.to_be_bytes()[..])
        );
        Ok(())
    }

    #[test]
    fn a_ledger_is_marked_with_the_new_format_and_the_upgrade_under_way_before_it_is_renamed(
    ) -> Result<()> {
        let dir = format_2_dir()?;
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        // Opened again, as the renaming would see it mid-way.
        assert_eq!(ledger.check_format(true, true)?, FORMAT_VERSION);
        mark_format(&ledger, 2)?;
        assert_eq!(
            ledger.check_format(true, true)?,
            2,
            "the version to upgrade from"
        );
        assert_eq!(
            ledger.tree.get(FORMAT_KEY)?.as_deref(),
            Some(&FORMAT_VERSION.to_be_bytes()[..]),
            "marked with this build's version at once"
        );
        assert_eq!(
            ledger.tree.get(UPGRADE_KEY)?.as_deref(),
            Some(&2u32.to_be_bytes()[..])
        );
        assert_eq!(
            ledger.check_format(true, true)?,
            2,
            "an upgrade cut short resumes"
        );
        Ok(())
    }

    #[test]
    fn a_format_3_ledger_keeps_a_root_provider_named_like_sqlites_former_name() -> Result<()> {
        let old = OLD;
        let dir = format_2_dir()?;
        {
            let ledger = Ledger::open(dir.path(), 1 << 20)?;
            // A provider an app names so today, in a ledger already upgraded.
            ledger.apply(vec![LedgerOp::Put {
                component: keycode::component_key(&[mount_key(old)]),
                entry: held(path(old, &["mine"]), b"r"),
                index_owner: true,
                container: None,
            }])?;
            ledger.flush()?;
        }
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        assert_eq!(
            ledger.owner_candidates(&path(old, &["mine"])).len(),
            1,
            "only an earlier format is renamed"
        );
        Ok(())
    }

    #[test]
    fn a_ledger_of_more_components_than_one_commit_renames_is_renamed_whole() -> Result<()> {
        let (old, new) = (OLD, NEW);
        let dir = tempfile::tempdir()?;
        let files = RENAMED_PER_COMMIT + 10;
        let row = |provider: &str, i: usize| row_path(provider, i as i64);
        let file = |i: usize| file_of(i as i64);
        {
            let ledger = Ledger::open(dir.path(), 1 << 20)?;
            let ops = (0..files).map(|i| LedgerOp::Put {
                component: file(i),
                entry: held(row(old, i), b"r"),
                index_owner: true,
                container: Some(table_path(old)),
            });
            ledger.apply(ops)?;
            mark_format(&ledger, 2)?;
        }
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        for i in [0, RENAMED_PER_COMMIT - 1, RENAMED_PER_COMMIT, files - 1] {
            let entry = ledger
                .component(&file(i))?
                .ok_or_else(|| crate::Error::msg(format!("file {i}")))?;
            assert_eq!(&entry.states[0].path[..], &row(new, i)[..], "file {i}");
            assert!(ledger.owner_candidates(&row(old, i)).is_empty());
        }
        assert_eq!(container_keys(&ledger)?.len(), files);
        assert!(container_keys(&ledger)?
            .iter()
            .all(|(container, _)| *container == table_path(new)));
        Ok(())
    }

    /// The key of a table `docs` of the database `db`, as the SQL target
    /// keys it.
    fn table_key() -> StableKey {
        StableKey::Array(Arc::from([str_key("db"), str_key("docs")]))
    }

    fn table_path(provider: &str) -> Vec<u8> {
        let mut out = Vec::new();
        keycode::put_name(&mut out, keycode::TAG_PROVIDER, provider);
        keycode::put_key(&mut out, &table_key());
        out
    }

    fn row_path(provider: &str, i: i64) -> Vec<u8> {
        let mut out = table_path(provider);
        keycode::put_key(&mut out, &StableKey::Int(i));
        out
    }

    fn mount_of(provider: &str) -> Vec<u8> {
        keycode::component_key(&[mount_key(provider)])
    }

    fn file_of(i: i64) -> Vec<u8> {
        keycode::component_key(&[StableKey::Int(i)])
    }

    /// A new component's whole entry, as a first commit writes it (packed
    /// with the others of its commit when there are enough).
    fn put_entry(
        component: Vec<u8>,
        states: Vec<StateEntry>,
        containers: Vec<Vec<u8>>,
    ) -> Result<LedgerOp> {
        let indexed = states
            .iter()
            .map(|s| crate::model::keycode::stable_hash(&s.path))
            .collect();
        let encoded = rmp_serde::to_vec(&ComponentEntry {
            states,
            failure: None,
        })?;
        Ok(LedgerOp::PutEntry {
            component,
            encoded: encoded.into(),
            indexed,
            containers,
        })
    }

    /// A new ledger in `dir` whose component mounted for the table `docs`
    /// holds it under the former name.
    fn with_old_table(dir: &std::path::Path) -> Result<Ledger> {
        let ledger = Ledger::open(dir, 1 << 20)?;
        let table = held(table_path(OLD), b"t");
        ledger.apply(vec![put_entry(mount_of(OLD), vec![table], vec![])?])?;
        Ok(ledger)
    }

    const OLD: &str = "weir.sqlite/db/table";
    const NEW: &str = "weir.sqlite.table/db";

    #[test]
    fn packed_entries_are_renamed_and_stay_renamed_once_their_packs_are_collected() -> Result<()> {
        let dir = tempfile::tempdir()?;
        {
            let ledger = Ledger::open(dir.path(), 1 << 20)?;
            let mut ops = vec![put_entry(
                mount_of(OLD),
                vec![held(table_path(OLD), b"t")],
                vec![],
            )?];
            for i in 0..6 {
                ops.push(put_entry(
                    file_of(i),
                    vec![held(row_path(OLD, i), b"r")],
                    vec![table_path(OLD)],
                )?);
            }
            ledger.apply(ops)?;
            assert!(ledger.pack_of(&mount_of(OLD)).is_some(), "packed");
            mark_format(&ledger, 2)?;
        }
        for _ in 0..2 {
            let ledger = Ledger::open(dir.path(), 1 << 20)?;
            assert!(ledger.record_of(&mount_of(OLD))?.is_none());
            assert!(ledger.record_of(&mount_of(NEW))?.is_some());
            for i in 0..6 {
                let paths: Vec<Vec<u8>> = ledger
                    .component(&file_of(i))?
                    .map(|e| e.states.into_iter().map(|s| s.path.into_vec()).collect())
                    .unwrap_or_default();
                assert_eq!(paths, vec![row_path(NEW, i)], "file {i}");
            }
            assert_eq!(ledger.counts()?.0, 7, "seven components, no more");
        }
        Ok(())
    }

    #[test]
    fn large_entries_with_deltas_and_a_child_of_a_renamed_component_are_renamed() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let large = vec![b'x'; 2000];
        let rows = 60;
        let child = |provider: &str| {
            let mut segments = keycode::decode_component(&mount_of(provider)).unwrap_or_default();
            segments.push(str_key("x"));
            keycode::component_key(&segments)
        };
        {
            let ledger = with_old_table(dir.path())?;
            for (i, component) in [file_of(0), child(OLD)].into_iter().enumerate() {
                let first = i as i64 * 1000;
                let states = (0..rows)
                    .map(|j| held(row_path(OLD, first + j), &large))
                    .collect();
                ledger.apply(vec![put_entry(
                    component.clone(),
                    states,
                    vec![table_path(OLD)],
                )?])?;
                ledger.apply(vec![LedgerOp::Put {
                    component: component.clone(),
                    entry: held(row_path(OLD, first + 999), b"d"),
                    index_owner: true,
                    container: Some(table_path(OLD)),
                }])?;
                assert!(ledger.layout().deltas.contains(&component), "a delta");
                assert!(ledger.layout().large.contains(&component), "a large entry");
            }
            ledger.apply(vec![LedgerOp::AddChildren {
                component: mount_of(OLD),
                children: vec![str_key("x")],
            }])?;
            mark_format(&ledger, 2)?;
        }
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        for component in [file_of(0), child(NEW)] {
            let states = ledger
                .component(&component)?
                .map(|e| e.states)
                .unwrap_or_default();
            assert_eq!(states.len(), rows as usize + 1);
            assert!(states.iter().all(|s| s.path.starts_with(&table_path(NEW))));
        }
        assert!(ledger.record_of(&child(OLD))?.is_none());
        assert_eq!(ledger.children(&mount_of(NEW))?, vec![str_key("x")]);
        assert!(ledger.children(&mount_of(OLD))?.is_empty());
        Ok(())
    }

    #[test]
    fn intents_a_crash_left_under_the_former_name_are_folded_then_renamed() -> Result<()> {
        let dir = tempfile::tempdir()?;
        {
            let ledger = with_old_table(dir.path())?;
            mark_format(&ledger, 2)?;
            ledger.put_intents(
                1,
                &[Intent {
                    component: Arc::from(file_of(7).as_slice()),
                    path: Arc::from(row_path(OLD, 7).as_slice()),
                    record: Some(Arc::from(&b"r"[..])),
                    gen: 0,
                    child_gen: None,
                    container: Some(Arc::from(table_path(OLD).as_slice())),
                }],
            )?;
            ledger.sync_intents()?;
        }
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        let states = ledger
            .component(&file_of(7))?
            .map(|e| e.states)
            .unwrap_or_default();
        assert_eq!(states.len(), 1);
        assert_eq!(&states[0].path[..], &row_path(NEW, 7)[..]);
        assert!(states[0].may_be_missing, "folded as a possible record");
        assert_eq!(
            container_keys(&ledger)?,
            vec![(table_path(NEW), file_of(7))]
        );
        Ok(())
    }

    #[test]
    fn a_component_renamed_to_a_key_that_holds_a_record_is_merged_into_it() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let other = path(NEW, &["other"]);
        {
            let ledger = Ledger::open(dir.path(), 1 << 20)?;
            ledger.apply(vec![
                put_entry(mount_of(OLD), vec![held(table_path(OLD), b"t-old")], vec![])?,
                put_entry(
                    mount_of(NEW),
                    vec![held(other.clone(), b"only-new")],
                    vec![],
                )?,
                put_entry(
                    file_of(0),
                    vec![
                        held(row_path(OLD, 0), b"r-old"),
                        held(row_path(NEW, 0), b"r-new"),
                    ],
                    vec![table_path(OLD), table_path(NEW)],
                )?,
            ])?;
            mark_format(&ledger, 2)?;
        }
        let ledger = Ledger::open(dir.path(), 1 << 20)?;
        let mount = ledger
            .component(&mount_of(NEW))?
            .map(|e| e.states)
            .unwrap_or_default();
        let paths: Vec<&[u8]> = mount.iter().map(|s| &s.path[..]).collect();
        assert!(
            paths.contains(&&table_path(NEW)[..]) && paths.contains(&&other[..]),
            "both kept"
        );
        assert_eq!(ledger.owner_candidates(&other).len(), 1);
        let rows = ledger
            .component(&file_of(0))?
            .map(|e| e.states)
            .unwrap_or_default();
        assert_eq!(rows.len(), 1, "one state under one name");
        assert!(
            rows[0].records.contains(&buf(b"r-old")) && rows[0].records.contains(&buf(b"r-new"))
        );
        assert!(rows[0].may_be_missing);
        Ok(())
    }
}
