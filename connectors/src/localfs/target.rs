//! The handlers: the directory (a container) and its files (the children).
//!
//! Both `reconcile`s are pure: they compare the declared value with the
//! tracking records and return an action for the sinks in
//! [`super::sink`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use weir_actors::statediff::{diff, DiffAction, TrackingRecordTransition};
use weir_actors::{
    ChildTargetDef, Error, Fingerprint, Result, StableKey, TargetAction, TargetActionSink,
    TargetChildInvalidation, TargetHandler, TargetReconcileOutput,
};

use super::action::{DirAction, FileAction};
use super::path;
use super::sink;

/// The declared value of a directory: what was seen when it was declared.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct DirSpec {
    /// Whether something already existed at the path when it was declared.
    /// Only read the first time weir tracks the directory.
    pub existed: bool,
}

/// The tracking record of a directory.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct DirRecord {
    /// Whether weir created the directory (nothing was at the path when it
    /// was first declared). Only such a directory is removed when it is no
    /// longer declared.
    pub created_by_weir: bool,
}

/// The handler of directories: the root provider's handler.
pub(crate) struct DirHandler {
    sink: TargetActionSink<DirAction>,
}

impl DirHandler {
    pub(crate) fn new() -> Self {
        Self {
            sink: sink::dir_sink(file_handler_for),
        }
    }
}

/// The string of a key this connector made, or an error naming it.
fn key_text(key: &StableKey, what: &str) -> Result<Arc<str>> {
    match key {
        StableKey::Str(text) => Ok(Arc::clone(text)),
        other => Err(Error::permanent(format!(
            "localfs {what} key {other} is not a string; it was not declared by this connector"
        ))),
    }
}

impl TargetHandler<DirSpec> for DirHandler {
    type TrackingRecord = DirRecord;
    type Action = DirAction;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<DirSpec>,
        prev: Vec<DirRecord>,
        prev_may_be_missing: bool,
    ) -> Result<Option<TargetReconcileOutput<DirAction, DirRecord>>> {
        let dir_path = key_text(&key, "directory")?.to_string();
        // A directory is weir's only when every record agrees: a record that
        // says the user had it wins.
        let created_by_weir = !prev.is_empty() && prev.iter().all(|r| r.created_by_weir);
        match desired {
            // A container always answers while declared: the child-handler
            // factory builds the files' handler from this action.
            Some(spec) => {
                let created_by_weir = if prev.is_empty() {
                    !spec.existed
                } else {
                    created_by_weir
                };
                let action = DirAction {
                    path: dir_path,
                    remove_tree: false,
                };
                Ok(Some(TargetReconcileOutput {
                    action: if prev.is_empty() {
                        TargetAction::Create(action)
                    } else {
                        TargetAction::Update(action)
                    },
                    sink: self.sink.clone(),
                    tracking_record: Some(DirRecord { created_by_weir }),
                    child_invalidation: None,
                }))
            }
            None => {
                if prev.is_empty() && !prev_may_be_missing {
                    return Ok(None);
                }
                Ok(Some(TargetReconcileOutput {
                    action: TargetAction::Delete(DirAction {
                        path: dir_path,
                        remove_tree: created_by_weir,
                    }),
                    sink: self.sink.clone(),
                    tracking_record: None,
                    child_invalidation: created_by_weir
                        .then_some(TargetChildInvalidation::Destructive),
                }))
            }
        }
    }
}

/// The files' handler of the directory a container action names: the
/// directory sink's child-handler factory. Pure: it only builds a sink.
pub(crate) fn file_handler_for(action: &DirAction) -> Result<ChildTargetDef> {
    Ok(ChildTargetDef::new::<FileSpec, _>(FileHandler::new(
        PathBuf::from(&action.path),
    )))
}

/// The declared value of a file: its content.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct FileSpec {
    /// The bytes the file holds.
    #[serde(with = "serde_bytes")]
    pub content: Vec<u8>,
}

/// The handler of the files of one directory. Its tracking record is the
/// fingerprint of the content.
pub(crate) struct FileHandler {
    root: Arc<Path>,
    sink: TargetActionSink<FileAction>,
}

impl FileHandler {
    /// A handler, with a sink of its own, for the files of `root`.
    pub(crate) fn new(root: PathBuf) -> Self {
        let root: Arc<Path> = Arc::from(root);
        Self {
            sink: sink::file_sink(Arc::clone(&root)),
            root,
        }
    }
}

impl TargetHandler<FileSpec> for FileHandler {
    type TrackingRecord = Fingerprint;
    type Action = FileAction;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<FileSpec>,
        prev: Vec<Fingerprint>,
        prev_may_be_missing: bool,
    ) -> Result<Option<TargetReconcileOutput<FileAction, Fingerprint>>> {
        let rel = key_text(&key, "file")?;
        // The key was checked when declared; check it again (lexically)
        // since a ledger outlives the code that wrote it.
        let rel = path::file_key(&self.root, Path::new(rel.as_ref()))?;
        let fingerprint = desired
            .as_ref()
            .map(|spec| Fingerprint::from_bytes(&spec.content));
        let transition = TrackingRecordTransition::new(fingerprint, prev, prev_may_be_missing);
        let Some(kind) = diff(Some(&transition)).map(DiffAction::action_kind) else {
            return Ok(None);
        };
        let action = FileAction {
            path: rel,
            content: desired.map(|spec| spec.content),
        };
        Ok(Some(TargetReconcileOutput {
            action: TargetAction::with_kind(kind, action),
            sink: self.sink.clone(),
            tracking_record: fingerprint,
            child_invalidation: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_key() -> StableKey {
        StableKey::Str(Arc::from("/data/out"))
    }

    fn dir_reconcile(
        desired: Option<DirSpec>,
        prev: Vec<DirRecord>,
    ) -> Result<Option<TargetReconcileOutput<DirAction, DirRecord>>> {
        DirHandler::new().reconcile(dir_key(), desired, prev, false)
    }

    const MINE: DirRecord = DirRecord {
        created_by_weir: true,
    };
    const USERS: DirRecord = DirRecord {
        created_by_weir: false,
    };

    #[test]
    fn a_directory_is_weirs_only_if_nothing_was_there_when_first_declared() -> Result<()> {
        let out = dir_reconcile(Some(DirSpec { existed: false }), vec![])?
            .ok_or_else(|| Error::msg("no output"))?;
        assert_eq!(out.tracking_record, Some(MINE));
        assert!(matches!(out.action, TargetAction::Create(_)));
        let out = dir_reconcile(Some(DirSpec { existed: true }), vec![])?
            .ok_or_else(|| Error::msg("no output"))?;
        assert_eq!(out.tracking_record, Some(USERS));
        // Later declarations see the directory weir made; the record wins.
        let out = dir_reconcile(Some(DirSpec { existed: true }), vec![MINE])?
            .ok_or_else(|| Error::msg("no output"))?;
        assert_eq!(out.tracking_record, Some(MINE));
        assert!(matches!(out.action, TargetAction::Update(_)));
        let out = dir_reconcile(Some(DirSpec { existed: false }), vec![USERS])?
            .ok_or_else(|| Error::msg("no output"))?;
        assert_eq!(out.tracking_record, Some(USERS));
        Ok(())
    }

    #[test]
    fn only_a_directory_every_record_says_weir_created_is_removed() -> Result<()> {
        for (prev, remove) in [
            (vec![MINE], true),
            (vec![USERS], false),
            (vec![MINE, USERS], false),
        ] {
            let out = dir_reconcile(None, prev.clone())?.ok_or_else(|| Error::msg("none"))?;
            match out.action {
                TargetAction::Delete(a) => assert_eq!(a.remove_tree, remove, "{prev:?}"),
                _ => panic!("not a delete for {prev:?}"), // ok: test
            }
        }
        assert!(dir_reconcile(None, vec![])?.is_none());
        Ok(())
    }

    #[test]
    fn unchanged_file_content_gives_no_action_unless_the_file_may_be_missing() -> Result<()> {
        let handler = FileHandler::new(PathBuf::from("/data/out"));
        let key = || StableKey::Str(Arc::from("a/b.txt"));
        let spec = || FileSpec {
            content: b"hello".to_vec(),
        };
        let fp = Fingerprint::from_bytes(b"hello");
        assert!(handler
            .reconcile(key(), Some(spec()), vec![fp], false)?
            .is_none());
        assert!(handler
            .reconcile(key(), Some(spec()), vec![fp], true)?
            .is_some());
        let other = Fingerprint::from_bytes(b"other");
        let out = handler
            .reconcile(key(), Some(spec()), vec![fp, other], false)?
            .ok_or_else(|| Error::msg("none"))?;
        assert!(matches!(out.action, TargetAction::Update(_)));
        let out = handler
            .reconcile(key(), None, vec![fp], false)?
            .ok_or_else(|| Error::msg("none"))?;
        assert!(matches!(out.action, TargetAction::Delete(_)));
        assert!(handler.reconcile(key(), None, vec![], false)?.is_none());
        let bad = handler.reconcile(
            StableKey::Str(Arc::from("../x")),
            Some(spec()),
            vec![],
            false,
        );
        assert!(bad.is_err());
        Ok(())
    }
}
