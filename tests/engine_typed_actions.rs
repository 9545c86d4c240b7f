//! A sink's first call gets the actions as their handler returned them,
//! without decoding them; a retried call gets them decoded from their
//! MessagePack encoding, equal to the first.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Deserializer, Serialize};
use support::*;
use weir::prelude::*;

/// How many `Put`s were decoded (this test binary has one test).
static DECODED: AtomicUsize = AtomicUsize::new(0);

/// An action that counts its decodings.
#[derive(Clone, Debug, PartialEq, Serialize)]
struct Put {
    key: String,
    value: String,
}

impl<'de> Deserialize<'de> for Put {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Raw {
            key: String,
            value: String,
        }
        let raw = Raw::deserialize(d)?;
        DECODED.fetch_add(1, Ordering::SeqCst);
        Ok(Put {
            key: raw.key,
            value: raw.value,
        })
    }
}

struct PutHandler {
    sink: TargetActionSink<Put>,
}

impl TargetHandler<String> for PutHandler {
    type TrackingRecord = String;
    type Action = Put;

    fn reconcile(
        &self,
        key: StableKey,
        desired: Option<String>,
        prev: Vec<String>,
        _prev_may_be_missing: bool,
    ) -> Result<Option<TargetReconcileOutput<Put, String>>> {
        let Some(value) = desired else {
            return Ok(None);
        };
        if prev == [value.clone()] {
            return Ok(None);
        }
        let put = Put {
            key: key_str(&key),
            value: value.clone(),
        };
        Ok(Some(TargetReconcileOutput {
            action: if prev.is_empty() {
                TargetAction::Create(put)
            } else {
                TargetAction::Update(put)
            },
            sink: self.sink.clone(),
            tracking_record: Some(value),
            child_invalidation: None,
        }))
    }
}

/// Every call's actions, and whether the next call fails (retriably).
#[derive(Default)]
struct Calls {
    seen: Mutex<Vec<Vec<Put>>>,
    fail_next: AtomicBool,
}

fn sink(calls: &Arc<Calls>) -> TargetActionSink<Put> {
    let calls = Arc::clone(calls);
    TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<Put>>| {
        let calls = Arc::clone(&calls);
        async move {
            let puts = actions.into_iter().map(TargetAction::into_inner).collect();
            calls
                .seen
                .lock()
                .map_err(|_| Error::msg("poisoned"))?
                .push(puts);
            if calls.fail_next.swap(false, Ordering::SeqCst) {
                return Err(Error::msg("the target is busy"));
            }
            Ok(())
        }
    })
}

async fn sync(app: &App, calls: &Arc<Calls>, value: &str) -> Result<()> {
    let (sink, value) = (sink(calls), value.to_string());
    app.run(move |ctx| async move {
        let provider = register_root_target_states_provider(&ctx, "puts", PutHandler { sink })?;
        for key in ["a", "b", "c"] {
            declare_target_state(&ctx, provider.target_state(key, value.clone()))?;
        }
        Ok(())
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_first_call_gets_actions_undecoded_and_a_retried_call_gets_equal_decoded_ones(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let app = app(dir.path()).await?;
    let calls = Arc::new(Calls::default());

    sync(&app, &calls, "one").await?;
    let first = calls
        .seen
        .lock()
        .map_err(|_| Error::msg("poisoned"))?
        .clone();
    assert_eq!(first.concat().len(), 3, "{first:?}");
    assert_eq!(
        DECODED.load(Ordering::SeqCst),
        0,
        "a call that succeeds at once decodes nothing"
    );

    calls
        .seen
        .lock()
        .map_err(|_| Error::msg("poisoned"))?
        .clear();
    calls.fail_next.store(true, Ordering::SeqCst);
    sync(&app, &calls, "two").await?;
    let seen = calls
        .seen
        .lock()
        .map_err(|_| Error::msg("poisoned"))?
        .clone();
    assert_eq!(seen.len(), 2, "one failed call, one retry: {seen:?}");
    let sorted = |mut puts: Vec<Put>| {
        puts.sort_by(|a, b| a.key.cmp(&b.key));
        puts
    };
    assert_eq!(sorted(seen[0].clone()), sorted(seen[1].clone()));
    assert!(seen[1].iter().all(|p| p.value == "two"));
    assert_eq!(
        DECODED.load(Ordering::SeqCst),
        3,
        "only the retried call decoded its actions"
    );
    Ok(())
}
