//! The ledger's side of worker groups: a component's whole record (what
//! the changelog of its partition keeps), listing the components of a
//! partition, and the ops that forget a component or restore it from a
//! record.

// The member runtime of worker groups uses these as it is wired in.
#![allow(dead_code)]

use serde_bytes::ByteBuf;

use super::record::ComponentRecord;
use super::{Ledger, P_CHILDREN, P_COMPONENT, P_FAILED_RUNS};
use crate::error::Result;
use crate::model::keycode;

impl ComponentRecord {
    /// Whether the record holds nothing (the component is gone).
    pub(crate) fn is_empty(&self) -> bool {
        self.entry.states.is_empty()
            && self.entry.failure.is_none()
            && self.children.is_empty()
            && self.memo.is_none()
            && self.failed_runs == 0
    }

    /// The containers the component's states are below: the `d` index
    /// entries to make when the record is restored.
    pub(crate) fn containers(&self) -> Vec<Vec<u8>> {
        let mut out: Vec<Vec<u8>> = self
            .entry
            .states
            .iter()
            .filter_map(|s| keycode::container_of_state(&s.path).map(<[u8]>::to_vec))
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

impl Ledger {
    /// The whole record of a component; `None` when it has nothing.
    pub(crate) fn record_of(&self, component: &[u8]) -> Result<Option<ComponentRecord>> {
        let record = ComponentRecord {
            entry: self.component(component)?.unwrap_or_default(),
            children: self.children(component)?,
            memo: self.memo(component)?.map(|m| ByteBuf::from(m.to_vec())),
            failed_runs: self.failed_runs(component)?,
        };
        Ok((!record.is_empty()).then_some(record))
    }

    /// The keys of every component the ledger holds something of (an
    /// entry, children, a memo key, a failure count) that `wanted`
    /// accepts, sorted.
    pub(crate) fn component_keys(&self, wanted: impl Fn(&[u8]) -> bool) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        for prefix in [P_COMPONENT, P_CHILDREN, P_FAILED_RUNS] {
            for item in self.tree.scan_prefix([prefix]) {
                let (k, _) = item?;
                let component = k.get(1..).unwrap_or_default();
                if prefix == P_COMPONENT && self.component_raw(component)?.is_none() {
                    continue; // a tombstone
                }
                if wanted(component) {
                    out.push(component.to_vec());
                }
            }
        }
        for item in self.entries.scan_prefix([P_COMPONENT]) {
            let (k, _) = item?;
            let component = k.get(1..).unwrap_or_default();
            if wanted(component) {
                out.push(component.to_vec());
            }
        }
        out.extend(self.pack_members().into_iter().filter(|c| wanted(c)));
        out.extend(self.memo_members().into_iter().filter(|c| wanted(c)));
        out.sort();
        out.dedup();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::buf;
    use crate::ledger::record::{LedgerOp, StateEntry};
    use crate::model::StableKey;

    fn state(path: &[u8]) -> StateEntry {
        StateEntry {
            path: buf(path),
            records: vec![buf(b"r")],
            ..StateEntry::default()
        }
    }

    #[test]
    fn a_record_restored_into_another_ledger_reads_back_the_same() -> Result<()> {
        let (a, b) = (tempfile::tempdir()?, tempfile::tempdir()?);
        let (from, to) = (
            Ledger::open(a.path(), 1 << 20)?,
            Ledger::open(b.path(), 1 << 20)?,
        );
        let comp = keycode::component_key(&[StableKey::Str("c".into())]);
        let child = StableKey::Str("x".into());
        from.apply(vec![
            LedgerOp::Put {
                component: comp.clone(),
                entry: state(b"p1"),
                index_owner: true,
                container: None,
            },
            LedgerOp::AddChildren {
                component: comp.clone(),
                children: vec![child.clone()],
            },
            LedgerOp::SetMemo {
                component: comp.clone(),
                memo: Some(b"m".to_vec()),
            },
        ])?;
        let record = from
            .record_of(&comp)?
            .ok_or_else(|| crate::Error::msg("no record"))?;
        to.apply(vec![LedgerOp::Restore {
            component: comp.clone(),
            record: Box::new(record),
        }])?;
        let back = to
            .record_of(&comp)?
            .ok_or_else(|| crate::Error::msg("not restored"))?;
        assert_eq!(back.entry.states, vec![state(b"p1")]);
        assert_eq!(back.children, vec![child]);
        assert_eq!(back.memo.map(|m| m.into_vec()), Some(b"m".to_vec()));
        assert_eq!(
            to.owner_candidates(b"p1").len(),
            1,
            "the owner index knows it"
        );
        assert_eq!(to.component_keys(|_| true)?, vec![comp.clone()]);

        to.apply(vec![LedgerOp::Forget {
            component: comp.clone(),
        }])?;
        assert!(to.record_of(&comp)?.is_none());
        assert!(to.component_keys(|_| true)?.is_empty());
        Ok(())
    }
}
