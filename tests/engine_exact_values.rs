//! `TargetStateProvider::target_state_exact` hands the handler the value
//! as declared, without serializing it, where `target_state` serializes it
//! when declared and hands the handler a decoded copy. A value type with a
//! skipped field tells the two apart: the decoded copy has lost the field.

mod support;

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use support::*;
use weir::prelude::*;

/// A value whose encoding drops `note`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Doc {
    text: String,
    #[serde(skip)]
    note: String,
}

/// Records the notes of the values it is given, and declares nothing to do.
struct NoteHandler {
    notes: Arc<Mutex<Vec<(String, String)>>>,
}

impl TargetHandler<Doc> for NoteHandler {
    type TrackingRecord = String;
    type Action = String;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<Doc>,
        _prev: Vec<String>,
        _prev_may_be_missing: bool,
    ) -> Result<Option<TargetReconcileOutput<String, String>>> {
        if let Some(doc) = desired {
            self.notes
                .lock()
                .map_err(|_| Error::msg("poisoned"))?
                .push((key_str(&key), doc.note));
        }
        Ok(None)
    }
}

/// Declares `count` docs, `exact`ly or not, and returns the notes the
/// handler saw, sorted by key.
async fn notes_seen(app: &App, count: usize, exact: bool) -> Result<Vec<(String, String)>> {
    let notes = Arc::new(Mutex::new(Vec::new()));
    let handler = NoteHandler {
        notes: Arc::clone(&notes),
    };
    app.run(move |ctx| async move {
        let docs = register_root_target_states_provider(&ctx, "docs", handler)?;
        for i in 0..count {
            let doc = Doc {
                text: format!("text {i}"),
                note: format!("note {i}"),
            };
            let key = format!("k{i:04}");
            let state = if exact {
                docs.target_state_exact(key, doc)
            } else {
                docs.target_state(key, doc)
            };
            declare_target_state(&ctx, state)?;
        }
        Ok(())
    })
    .await?;
    let mut seen = notes.lock().map_err(|_| Error::msg("poisoned"))?.clone();
    seen.sort();
    Ok(seen)
}

fn expected_notes(count: usize) -> Vec<(String, String)> {
    (0..count)
        .map(|i| (format!("k{i:04}"), format!("note {i}")))
        .collect()
}

#[tokio::test]
async fn an_exact_state_reaches_its_handler_as_declared_and_a_plain_one_as_decoded() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    assert_eq!(notes_seen(&app, 3, true).await?, expected_notes(3));
    let decoded = notes_seen(&app, 3, false).await?;
    assert_eq!(decoded.len(), 3);
    assert!(
        decoded.iter().all(|(_, note)| note.is_empty()),
        "a plain state is decoded, which loses the skipped field: {decoded:?}"
    );
    Ok(())
}

#[tokio::test]
async fn exact_states_sent_in_chunks_while_the_component_runs_reach_their_handler_as_declared(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    // Chunks of 10: most states are reconciled while the component declares.
    let app = app_with(dir.path(), |b| b.reconcile_chunk(10).shards(3)).await?;
    assert_eq!(notes_seen(&app, 95, true).await?, expected_notes(95));
    Ok(())
}

/// A value whose serialization always fails.
#[derive(Debug, Deserialize)]
struct Unserializable;

impl Serialize for Unserializable {
    fn serialize<S: serde::Serializer>(&self, _: S) -> std::result::Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("this value never serializes"))
    }
}

/// Counts the values it is given; declares nothing to do.
struct CountingHandler {
    seen: Arc<Mutex<usize>>,
}

impl TargetHandler<Unserializable> for CountingHandler {
    type TrackingRecord = String;
    type Action = String;

    fn reconcile(
        &self,
        _key: StableKey,
        desired: Option<Unserializable>,
        _prev: Vec<String>,
        _prev_may_be_missing: bool,
    ) -> Result<Option<TargetReconcileOutput<String, String>>> {
        if desired.is_some() {
            *self.seen.lock().map_err(|_| Error::msg("poisoned"))? += 1;
        }
        Ok(None)
    }
}

#[tokio::test]
async fn a_plain_state_is_serialized_when_declared_and_an_exact_one_never_is() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    for exact in [false, true] {
        let seen = Arc::new(Mutex::new(0));
        let handler = CountingHandler {
            seen: Arc::clone(&seen),
        };
        let declared = app
            .run(move |ctx| async move {
                let p = register_root_target_states_provider(&ctx, "odd", handler)?;
                let state = if exact {
                    p.target_state_exact("k", Unserializable)
                } else {
                    p.target_state("k", Unserializable)
                };
                declare_target_state(&ctx, state)
            })
            .await;
        let seen = *seen.lock().map_err(|_| Error::msg("poisoned"))?;
        if exact {
            assert!(declared.is_ok(), "{declared:?}");
            assert_eq!(seen, 1);
        } else {
            let text = declared.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(text.contains("cannot serialize"), "{text}");
            assert_eq!(seen, 0);
        }
    }
    Ok(())
}
