//! The intent journal: `weir.intents`, beside the store.
//!
//! Intents are written before their actions are applied and are useless
//! once the run that wrote them has committed or folded them, so they are
//! appended to a file of their own rather than kept in sled: appending is
//! one write and one `fdatasync`, and forgetting a run's intents is one
//! truncation. (In sled, large intent batches were stored as blobs, and
//! deleting them made sled merge and rewrite the nodes that held them,
//! megabytes at a time.)
//!
//! # Format
//!
//! A sequence of frames, each a 12-byte header (payload length, u32 LE;
//! checksum of the payload, u64 LE) and a payload: the MessagePack
//! encoding of `(batch id, intents)`. A frame is durable before the sink
//! call it covers starts, so a frame cut short at the end of the file (a
//! crash while it was written) covers nothing that was applied, and is
//! ignored; a damaged frame followed by more data is corruption.
//!
//! The checksum is the payload's CRC-32 in the low half and [`CRC_MARK`]
//! in the high half. Journals written before it carry the payload's
//! [`stable_hash`] instead, and are read as such: a crash can leave one
//! for a newer build to fold in, and compaction keeps such frames as they
//! are, so that reader stays. (`stable_hash` goes a byte at a time: about
//! a millisecond of the ledger's thread per megabyte of intents, 100k
//! intents being about 10 MB; CRC-32 goes at memory speed. It catches
//! every burst of damage up to 32 bits long, and other damage but for one
//! chance in 2^32.) A build from before CRC-32 does not read these frames:
//! it takes a lone last one for a torn write. Downgrading weir while the
//! journal holds intents (after a crash, before the next run) is not
//! supported.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::record::Intent;
use crate::model::keycode::stable_hash;

/// The file name of the journal, in the ledger's directory.
pub(crate) const JOURNAL_FILE: &str = "weir.intents";

/// The size of a frame header.
const HEADER: usize = 12;

/// The high half of a frame's checksum field when its low half is the
/// payload's CRC-32 (`WCRC`); any other is a `stable_hash`.
const CRC_MARK: u64 = 0x5743_5243;

/// The checksum field of a frame whose payload is `payload`.
fn checksum(payload: &[u8]) -> u64 {
    (CRC_MARK << 32) | u64::from(crc32fast::hash(payload))
}

/// Whether `field` is the checksum of `payload`, as written now or as
/// journals written before CRC-32 have it.
fn checksum_matches(field: u64, payload: &[u8]) -> bool {
    // A former checksum may have the mark's bits in its high half too.
    (field >> 32 == CRC_MARK && field == checksum(payload)) || field == stable_hash(payload)
}

/// Rewrite the file without its forgotten frames once they take more than
/// this many bytes and more than the live ones.
const COMPACT_AT: u64 = 1 << 20;

/// What is wrong with a journal that cannot be read back.
#[derive(Debug)]
pub(crate) enum JournalError {
    Io(std::io::Error),
    /// A frame other than the last one is damaged.
    Corrupt(String),
}

impl From<std::io::Error> for JournalError {
    fn from(e: std::io::Error) -> Self {
        JournalError::Io(e)
    }
}

#[derive(Serialize)]
struct FrameRef<'a>(u64, &'a [Intent]);

#[derive(Deserialize)]
struct Frame(u64, Vec<Intent>);

/// A batch still in the file: its id and its bytes (header included).
struct Live {
    id: u64,
    start: u64,
    len: u64,
}

/// The open journal. Only the ledger's thread writes it.
pub(crate) struct Journal {
    path: PathBuf,
    file: File,
    /// The batches not forgotten yet, in file order.
    live: Vec<Live>,
    /// The file's length.
    len: u64,
    /// Written or truncated since the last sync.
    dirty: bool,
    /// Batches to forget at the next [`Journal::forget_pending`].
    pending: Vec<u64>,
    /// The buffer a batch's frame is encoded in, kept for the next one (a
    /// batch of a few thousand intents would otherwise regrow it a dozen
    /// times, copying it each time).
    frame: Vec<u8>,
}

/// The largest frame buffer kept for the next batch.
const KEPT_FRAME: usize = 4 << 20;

impl Journal {
    /// Opens (or creates) the journal in `dir` and reads back the intent
    /// batches it holds, in the order they were written.
    pub(crate) fn open(dir: &Path) -> Result<(Journal, Vec<Intent>), JournalError> {
        let path = dir.join(JOURNAL_FILE);
        let mut file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let Parsed { frames, valid } = parse(&bytes)?;
        let mut live = Vec::with_capacity(frames.len());
        let mut intents = Vec::new();
        for (batch, batch_intents) in frames {
            live.push(batch);
            intents.extend(batch_intents);
        }
        let mut journal = Journal {
            path,
            file,
            live,
            len: bytes.len() as u64,
            dirty: false,
            pending: Vec::new(),
            frame: Vec::new(),
        };
        if valid < journal.len {
            // A frame cut short by a crash: drop it, so appends follow the
            // last whole frame.
            journal.file.set_len(valid)?;
            journal.len = valid;
            journal.dirty = true;
        }
        Ok((journal, intents))
    }

    /// Appends intent batch `id`. It is durable once [`Journal::sync`]
    /// returns.
    pub(crate) fn append(&mut self, id: u64, intents: &[Intent]) -> std::io::Result<()> {
        // The payload is encoded after room for its header, which is
        // filled in once its length and hash are known.
        let mut frame = std::mem::take(&mut self.frame);
        frame.clear();
        frame.resize(HEADER, 0);
        let written = self.append_frame(id, intents, &mut frame);
        if frame.capacity() <= KEPT_FRAME {
            self.frame = frame;
        }
        written
    }

    /// [`Journal::append`], encoding the frame in `frame` (which holds
    /// room for its header).
    fn append_frame(
        &mut self,
        id: u64,
        intents: &[Intent],
        frame: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        rmp_serde::encode::write(frame, &FrameRef(id, intents)).map_err(std::io::Error::other)?;
        let (header, payload) = frame.split_at_mut(HEADER);
        let len = u32::try_from(payload.len()).map_err(|_| {
            std::io::Error::other(format!(
                "an intent batch of {} bytes is too large for the journal",
                payload.len()
            ))
        })?;
        let (len_field, hash_field) = header.split_at_mut(4);
        len_field.copy_from_slice(&len.to_le_bytes());
        hash_field.copy_from_slice(&checksum(payload).to_le_bytes());
        let written = self
            .file
            .seek(SeekFrom::Start(self.len))
            .and_then(|_| self.file.write_all(frame));
        if let Err(e) = written {
            // Do not leave half a frame for the next one to follow.
            let _ = self.file.set_len(self.len);
            return Err(e);
        }
        self.live.push(Live {
            id,
            start: self.len,
            len: frame.len() as u64,
        });
        self.len += frame.len() as u64;
        self.dirty = true;
        Ok(())
    }

    /// Whether some batch is not forgotten yet.
    pub(crate) fn has_live(&self) -> bool {
        !self.live.is_empty()
    }

    /// The batches not forgotten yet: their ids, and their intents in the
    /// order they were written.
    pub(crate) fn live_intents(&mut self) -> Result<(Vec<u64>, Vec<Intent>), JournalError> {
        if self.live.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let mut bytes = Vec::new();
        self.file.seek(SeekFrom::Start(0))?;
        self.file.read_to_end(&mut bytes)?;
        let Parsed { frames, .. } = parse(&bytes)?;
        let mut ids: Vec<u64> = self.live.iter().map(|l| l.id).collect();
        ids.sort_unstable();
        let mut intents = Vec::new();
        for (batch, batch_intents) in frames {
            if ids.binary_search(&batch.id).is_ok() {
                intents.extend(batch_intents);
            }
        }
        Ok((self.live.iter().map(|l| l.id).collect(), intents))
    }

    /// Makes what was appended or forgotten durable.
    pub(crate) fn sync(&mut self) -> std::io::Result<()> {
        if self.dirty {
            self.file.sync_data()?;
            self.dirty = false;
        }
        Ok(())
    }

    /// Marks batches to forget once what made them useless (the commits
    /// that collapsed or folded their intents) is durable.
    pub(crate) fn forget_later(&mut self, ids: &[u64]) {
        self.pending.extend_from_slice(ids);
    }

    /// Forgets the batches marked by [`Journal::forget_later`].
    pub(crate) fn forget_pending(&mut self) -> std::io::Result<()> {
        let ids = std::mem::take(&mut self.pending);
        self.forget(&ids)
    }

    /// Forgets batches whose intents were committed or folded: the file is
    /// emptied once none is left, and rewritten without the forgotten ones
    /// when they take most of it.
    pub(crate) fn forget(&mut self, ids: &[u64]) -> std::io::Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut gone = ids.to_vec();
        gone.sort_unstable();
        self.live.retain(|l| gone.binary_search(&l.id).is_err());
        if self.live.is_empty() {
            if self.len > 0 {
                self.file.set_len(0)?;
                self.len = 0;
                self.dirty = true;
            }
            return Ok(());
        }
        let live_bytes: u64 = self.live.iter().map(|l| l.len).sum();
        let dead = self.len - live_bytes;
        if dead > COMPACT_AT && dead > live_bytes {
            self.compact()?;
        }
        Ok(())
    }

    /// Empties the journal (after its intents were recovered) and makes
    /// that durable.
    pub(crate) fn clear(&mut self) -> std::io::Result<()> {
        self.live.clear();
        if self.len > 0 {
            self.file.set_len(0)?;
            self.len = 0;
            self.dirty = true;
        }
        self.sync()
    }

    /// Rewrites the file with only the live frames (by rename, so a crash
    /// leaves either file whole).
    fn compact(&mut self) -> std::io::Result<()> {
        let mut kept = Vec::new();
        for l in &self.live {
            let mut frame = vec![0u8; usize::try_from(l.len).map_err(std::io::Error::other)?];
            self.file.seek(SeekFrom::Start(l.start))?;
            self.file.read_exact(&mut frame)?;
            kept.push((l.id, frame));
        }
        let tmp = self.path.with_extension("intents.tmp");
        let mut out = File::create(&tmp)?;
        let mut live = Vec::with_capacity(kept.len());
        let mut at = 0u64;
        for (id, frame) in &kept {
            out.write_all(frame)?;
            live.push(Live {
                id: *id,
                start: at,
                len: frame.len() as u64,
            });
            at += frame.len() as u64;
        }
        out.sync_data()?;
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            File::open(dir)?.sync_all()?;
        }
        self.file = File::options().read(true).write(true).open(&self.path)?;
        self.live = live;
        self.len = at;
        self.dirty = false;
        Ok(())
    }
}

/// The whole frames at the start of a journal's bytes.
struct Parsed {
    /// Each batch with its intents, in file order.
    frames: Vec<(Live, Vec<Intent>)>,
    /// The length of the prefix they make up.
    valid: u64,
}

/// Reads the whole frames of `bytes`.
fn parse(bytes: &[u8]) -> Result<Parsed, JournalError> {
    let mut frames = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let Some(header) = bytes.get(at..at + HEADER) else {
            break; // a header cut short: the last write was interrupted
        };
        let (len, hash) = header.split_at(4);
        let len = u32::from_le_bytes(len.try_into().unwrap_or_default()) as usize;
        let hash = u64::from_le_bytes(hash.try_into().unwrap_or_default());
        let end = at + HEADER + len;
        let Some(payload) = bytes.get(at + HEADER..end) else {
            break; // a payload cut short
        };
        let decoded = checksum_matches(hash, payload)
            .then(|| rmp_serde::from_slice::<Frame>(payload).ok())
            .flatten();
        match decoded {
            Some(Frame(id, intents)) => frames.push((
                Live {
                    id,
                    start: at as u64,
                    len: (end - at) as u64,
                },
                intents,
            )),
            // The last frame may be garbage if the crash came while it was
            // written; anything after a bad frame means the file is damaged.
            None if end == bytes.len() => break,
            None => {
                return Err(JournalError::Corrupt(format!(
                    "{JOURNAL_FILE}: the intent batch at byte {at} is damaged"
                )))
            }
        }
        at = end;
    }
    Ok(Parsed {
        frames,
        valid: at as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn intent(path: &str) -> Intent {
        Intent {
            component: Arc::from(&b"c"[..]),
            path: Arc::from(path.as_bytes()),
            record: Some(Arc::from(&b"r"[..])),
            gen: 1,
            child_gen: None,
            container: None,
        }
    }

    fn paths(intents: &[Intent]) -> Vec<String> {
        intents
            .iter()
            .map(|i| String::from_utf8_lossy(&i.path).into_owned())
            .collect()
    }

    fn len(dir: &Path) -> std::io::Result<u64> {
        Ok(std::fs::metadata(dir.join(JOURNAL_FILE))?.len())
    }

    /// A journal in `dir` holding batch 1 (path `a`) and batch 2 (`b`),
    /// durable and closed.
    fn two_batches(dir: &Path) -> Result<(), JournalError> {
        let (mut j, _) = Journal::open(dir)?;
        j.append(1, &[intent("a")])?;
        j.append(2, &[intent("b")])?;
        j.sync()?;
        Ok(())
    }

    #[test]
    fn batches_appended_are_read_back_in_order_when_reopened() -> Result<(), JournalError> {
        let dir = tempfile::tempdir()?;
        let (mut j, found) = Journal::open(dir.path())?;
        assert!(found.is_empty());
        j.append(1, &[intent("a"), intent("b")])?;
        j.append(2, &[intent("c")])?;
        j.sync()?;
        drop(j);
        let (_, found) = Journal::open(dir.path())?;
        assert_eq!(paths(&found), ["a", "b", "c"]);
        Ok(())
    }

    #[test]
    fn forgetting_every_batch_empties_the_file() -> Result<(), JournalError> {
        let dir = tempfile::tempdir()?;
        let (mut j, _) = Journal::open(dir.path())?;
        j.append(1, &[intent("a")])?;
        j.append(2, &[intent("b")])?;
        j.forget(&[1])?;
        assert!(len(dir.path())? > 0, "batch 2 is still live");
        j.forget(&[2])?;
        j.sync()?;
        assert_eq!(len(dir.path())?, 0);
        // Appending after the truncation starts a new file.
        j.append(3, &[intent("c")])?;
        j.sync()?;
        drop(j);
        assert_eq!(paths(&Journal::open(dir.path())?.1), ["c"]);
        Ok(())
    }

    #[test]
    fn a_frame_cut_short_by_a_crash_is_ignored_and_dropped() -> Result<(), JournalError> {
        let dir = tempfile::tempdir()?;
        two_batches(dir.path())?;
        let whole = len(dir.path())?;
        for cut in [whole - 1, whole - 5, whole - 20] {
            let copy = tempfile::tempdir()?;
            let bytes = std::fs::read(dir.path().join(JOURNAL_FILE))?;
            std::fs::write(
                copy.path().join(JOURNAL_FILE),
                &bytes[..usize::try_from(cut).map_err(std::io::Error::other)?],
            )?;
            let (mut j, found) = Journal::open(copy.path())?;
            assert_eq!(paths(&found), ["a"], "cut at {cut}");
            // What follows is appended after the last whole frame.
            j.append(3, &[intent("c")])?;
            j.sync()?;
            drop(j);
            assert_eq!(paths(&Journal::open(copy.path())?.1), ["a", "c"]);
        }
        Ok(())
    }

    /// Damages the first frame's payload of the journal in `dir` (more
    /// follow) and checks that opening it is refused as corrupt.
    fn first_frame_damaged_is_corruption(dir: &Path) -> Result<(), JournalError> {
        let file = dir.join(JOURNAL_FILE);
        let mut bytes = std::fs::read(&file)?;
        if let Some(b) = bytes.get_mut(HEADER + 2) {
            *b ^= 0xff;
        }
        std::fs::write(&file, &bytes)?;
        assert!(matches!(Journal::open(dir), Err(JournalError::Corrupt(_))));
        Ok(())
    }

    #[test]
    fn a_damaged_frame_before_others_is_corruption() -> Result<(), JournalError> {
        let dir = tempfile::tempdir()?;
        two_batches(dir.path())?;
        first_frame_damaged_is_corruption(dir.path())
    }

    /// The journal in `dir` with each frame's checksum field made the
    /// `stable_hash` of its payload, as journals were written before CRC-32.
    fn with_old_checksums(dir: &Path) -> std::io::Result<()> {
        let file = dir.join(JOURNAL_FILE);
        let mut bytes = std::fs::read(&file)?;
        let mut at = 0;
        while at + HEADER <= bytes.len() {
            let len = u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
            let end = at + HEADER + len as usize;
            let old = stable_hash(&bytes[at + HEADER..end]);
            bytes[at + 4..at + HEADER].copy_from_slice(&old.to_le_bytes());
            at = end;
        }
        std::fs::write(&file, &bytes)
    }

    #[test]
    fn frames_are_checked_by_their_crc() -> Result<(), JournalError> {
        let dir = tempfile::tempdir()?;
        two_batches(dir.path())?;
        let bytes = std::fs::read(dir.path().join(JOURNAL_FILE))?;
        let len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        let field = u64::from_le_bytes(bytes[4..HEADER].try_into().unwrap_or_default());
        let payload = &bytes[HEADER..HEADER + len];
        assert_eq!(field >> 32, CRC_MARK);
        assert_eq!(field & 0xffff_ffff, u64::from(crc32fast::hash(payload)));
        Ok(())
    }

    #[test]
    fn a_journal_written_with_the_former_checksum_is_read_back_and_appended_to(
    ) -> Result<(), JournalError> {
        let dir = tempfile::tempdir()?;
        two_batches(dir.path())?;
        with_old_checksums(dir.path())?;
        let (mut j, found) = Journal::open(dir.path())?;
        assert_eq!(paths(&found), ["a", "b"]);
        j.append(3, &[intent("c")])?;
        j.sync()?;
        drop(j);
        assert_eq!(paths(&Journal::open(dir.path())?.1), ["a", "b", "c"]);
        Ok(())
    }

    #[test]
    fn a_damaged_frame_written_with_the_former_checksum_is_corruption() -> Result<(), JournalError>
    {
        let dir = tempfile::tempdir()?;
        two_batches(dir.path())?;
        with_old_checksums(dir.path())?;
        first_frame_damaged_is_corruption(dir.path())
    }

    #[test]
    fn forgotten_batches_are_compacted_away_when_they_take_most_of_the_file(
    ) -> Result<(), JournalError> {
        let dir = tempfile::tempdir()?;
        let (mut j, _) = Journal::open(dir.path())?;
        j.append(1, &[intent("kept")])?;
        let big: Vec<Intent> = (0..100_000).map(|i| intent(&format!("p{i}"))).collect();
        j.append(2, &big)?;
        assert!(len(dir.path())? > COMPACT_AT);
        j.forget(&[2])?;
        assert!(len(dir.path())? < 1024, "only batch 1 is left");
        j.append(3, &[intent("after")])?;
        j.sync()?;
        drop(j);
        assert_eq!(paths(&Journal::open(dir.path())?.1), ["kept", "after"]);
        Ok(())
    }
}
