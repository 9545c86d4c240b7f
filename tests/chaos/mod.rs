//! A sink that fails a share of its calls at random, for the reliability
//! tests (`reliability_faults.rs`, `reliability_retries_metrics.rs`).
//!
//! Each call's fate is a draw from a generator seeded with the test's seed,
//! the call's keys (sorted) and how many calls with exactly these keys came
//! before. Drawing from one shared generator in call order would make the
//! fates depend on how the engine happened to interleave its calls; keyed
//! draws make them depend on the seed and on what is in each call only. In
//! particular, the calls that carry a single component's actions (the only
//! ones the engine counts attempts for) fail or succeed the same way in
//! every run with a given seed, so whether a component exhausts its retries
//! is reproducible from the seed alone.
//!
//! The seed is `WEIR_TEST_SEED` when set (decimal or `0x` hex), else
//! [`DEFAULT_SEED`]; [`Chaos::from_env`] prints it.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use weir::prelude::*;

use crate::support::{apply_rows, Log, RowAction, Store};

/// The seed used unless `WEIR_TEST_SEED` says otherwise.
pub const DEFAULT_SEED: u64 = 0x5EED_2026_0006;

/// Fails calls at random, at a fixed rate, and counts what it did.
pub struct Chaos {
    pub seed: u64,
    /// The share of calls that fail, in thousandths.
    pub per_mille: u32,
    /// Calls seen with each key set (by the set's hash).
    seen: Mutex<HashMap<u64, u64>>,
    pub calls: AtomicUsize,
    pub failed: AtomicUsize,
    /// Keys whose calls always fail (a component that cannot be written).
    pub always_fail: Mutex<Vec<String>>,
}

/// SplitMix64: a good 64-bit mixer.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// FNV-1a over the keys, each followed by a separator.
fn hash_keys(keys: &[String]) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for k in keys {
        for b in k.bytes().chain(std::iter::once(0xFF)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01B3);
        }
    }
    h
}

impl Chaos {
    /// A chaos sink failing `per_mille` thousandths of its calls, seeded
    /// from `WEIR_TEST_SEED` or [`DEFAULT_SEED`] (printed).
    pub fn from_env(per_mille: u32) -> Arc<Chaos> {
        let seed = std::env::var("WEIR_TEST_SEED")
            .ok()
            .and_then(|s| {
                let s = s.trim();
                match s.strip_prefix("0x") {
                    Some(hex) => u64::from_str_radix(hex, 16).ok(),
                    None => s.parse().ok(),
                }
            })
            .unwrap_or(DEFAULT_SEED);
        eprintln!(
            "chaos seed: {seed:#x} (set WEIR_TEST_SEED to replay another); failing {}.{}% of sink calls",
            per_mille / 10,
            per_mille % 10
        );
        Chaos::with_seed(seed, per_mille)
    }

    /// A chaos sink failing `per_mille` thousandths of its calls, seeded
    /// with `seed`.
    pub fn with_seed(seed: u64, per_mille: u32) -> Arc<Chaos> {
        Arc::new(Chaos {
            seed,
            per_mille,
            seen: Mutex::new(HashMap::new()),
            calls: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            always_fail: Mutex::new(Vec::new()),
        })
    }

    /// Whether the call carrying `keys` fails.
    pub fn fails(&self, keys: &[String]) -> Result<bool> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let always = self
            .always_fail
            .lock()
            .map_err(|_| Error::msg("poisoned"))?;
        if keys.iter().any(|k| always.contains(k)) {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Ok(true);
        }
        drop(always);
        let mut sorted = keys.to_vec();
        sorted.sort();
        let set = hash_keys(&sorted);
        let nth = {
            let mut seen = self.seen.lock().map_err(|_| Error::msg("poisoned"))?;
            let n = seen.entry(set).or_default();
            *n += 1;
            *n
        };
        let mut rng = fastrand::Rng::with_seed(mix(self.seed ^ mix(set ^ mix(nth))));
        let fail = rng.u32(0..1000) < self.per_mille;
        if fail {
            self.failed.fetch_add(1, Ordering::SeqCst);
        }
        Ok(fail)
    }

    pub fn failed(&self) -> usize {
        self.failed.load(Ordering::SeqCst)
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// A row sink that asks `chaos` about each call: a failing call applies
/// nothing and returns a retriable error; the others are applied to
/// `store` and logged in `log`.
pub fn chaos_sink(chaos: Arc<Chaos>, log: Log, store: Store) -> TargetActionSink<RowAction> {
    TargetActionSink::from_async_fn(move |actions: Vec<TargetAction<RowAction>>| {
        let chaos = Arc::clone(&chaos);
        let log = log.clone();
        let store = store.clone();
        async move {
            let keys: Vec<String> = actions.iter().map(|a| a.inner().key.clone()).collect();
            if chaos.fails(&keys)? {
                return Err(Error::msg(format!(
                    "induced failure of a call of {} action(s)",
                    keys.len()
                )));
            }
            apply_rows(&log, &store, actions)
        }
    })
}

/// `components` components of `rows` rows each: component `cNN` declares
/// `cNN-rMMM = vNN-MMM`.
pub fn grid(components: usize, rows: usize) -> Vec<(String, Vec<(String, String)>)> {
    (0..components)
        .map(|c| {
            (
                format!("c{c:02}"),
                (0..rows)
                    .map(|r| (format!("c{c:02}-r{r:03}"), format!("v{c:02}-{r:03}")))
                    .collect(),
            )
        })
        .collect()
}

/// Every row of a grid, as the store should hold it.
pub fn desired(
    grid: &[(String, Vec<(String, String)>)],
) -> std::collections::BTreeMap<String, String> {
    grid.iter()
        .flat_map(|(_, rows)| rows.iter().cloned())
        .collect()
}
