//! Splits text into chunks: paragraphs, packed up to a size.

/// The most bytes in a chunk (a longer paragraph is split at line breaks,
/// then at character boundaries).
pub const MAX_CHUNK_BYTES: usize = 2000;

/// Splits `text` into chunks of at most `max` bytes (at least one
/// character each): paragraphs (separated by blank lines) are packed
/// together while they fit; a paragraph longer than `max` is cut at line
/// breaks, and a line longer than `max` at character boundaries. Chunks
/// are trimmed; empty text gives no chunk.
pub fn chunk_text(text: &str, max: usize) -> Vec<String> {
    let max = max.max(4);
    let mut chunks = Vec::new();
    let mut current = String::new();
    for paragraph in paragraphs(text) {
        for piece in split_long(paragraph, max) {
            if !current.is_empty() && current.len() + 2 + piece.len() > max {
                chunks.push(std::mem::take(&mut current));
            }
            if !current.is_empty() {
                current.push_str("\n\n");
            }
            current.push_str(piece);
        }
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    chunks
}

/// The non-blank paragraphs of `text`, trimmed.
fn paragraphs(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || loop {
        if rest.is_empty() {
            return None;
        }
        let (para, next) = match find_blank_line(rest) {
            Some((start, end)) => (&rest[..start], &rest[end..]),
            None => (rest, ""),
        };
        rest = next;
        let para = para.trim();
        if !para.is_empty() {
            return Some(para);
        }
    })
}

/// The byte range of the first run of blank lines (a line break, optional
/// spaces, a line break) in `text`.
fn find_blank_line(text: &str) -> Option<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(off) = bytes.get(i..)?.iter().position(|&b| b == b'\n') {
        let start = i + off;
        let mut j = start + 1;
        while bytes
            .get(j)
            .is_some_and(|b| *b == b' ' || *b == b'\t' || *b == b'\r')
        {
            j += 1;
        }
        if bytes.get(j) == Some(&b'\n') {
            let mut end = j + 1;
            while bytes.get(end).is_some_and(|b| b.is_ascii_whitespace()) {
                end += 1;
            }
            return Some((start, end));
        }
        i = start + 1;
    }
    None
}

/// Cuts a paragraph longer than `max` into pieces of at most `max` bytes.
fn split_long(paragraph: &str, max: usize) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut rest = paragraph;
    while rest.len() > max {
        let window = floor_char_boundary(rest, max);
        // A line break right after the window still ends a piece that fits.
        let search = if rest.as_bytes().get(window) == Some(&b'\n') {
            window + 1
        } else {
            window
        };
        let cut = match rest[..search].rfind('\n') {
            Some(i) if i > 0 => i,
            _ => window,
        };
        let (piece, next) = rest.split_at(cut.min(window));
        let piece = piece.trim();
        if !piece.is_empty() {
            pieces.push(piece);
        }
        rest = next.trim_start();
    }
    let rest = rest.trim();
    if !rest.is_empty() {
        pieces.push(rest);
    }
    pieces
}

/// The largest char boundary of `s` at or below `index` (and above 0).
fn floor_char_boundary(s: &str, index: usize) -> usize {
    let mut i = index.min(s.len());
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    if i == 0 {
        // A single character wider than `index`: take it whole.
        s.char_indices().nth(1).map_or(s.len(), |(i, _)| i)
    } else {
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paragraphs_are_packed_until_the_size_limit() {
        let text = "one\n\ntwo\n\n\nthree";
        assert_eq!(chunk_text(text, 100), vec!["one\n\ntwo\n\nthree"]);
        assert_eq!(chunk_text(text, 8), vec!["one\n\ntwo", "three"]);
    }

    #[test]
    fn blank_lines_with_spaces_separate_paragraphs() {
        assert_eq!(chunk_text("aa\n  \t\nbb", 5), vec!["aa", "bb"]);
        assert_eq!(chunk_text("a\n  \t\nb", 4), vec!["a\n\nb"]);
    }

    #[test]
    fn a_long_paragraph_is_cut_at_line_breaks_then_characters() {
        let text = "aaaa\nbbbb\ncccc";
        assert_eq!(chunk_text(text, 9), vec!["aaaa\nbbbb", "cccc"]);
        let long = "é".repeat(10);
        let chunks = chunk_text(&long, 5);
        assert!(chunks.iter().all(|c| c.len() <= 5), "{chunks:?}");
        assert_eq!(chunks.concat(), long);
    }

    #[test]
    fn empty_and_blank_text_give_no_chunks() {
        assert!(chunk_text("", 10).is_empty());
        assert!(chunk_text(" \n\n \n", 10).is_empty());
    }

    #[test]
    fn every_chunk_respects_the_limit_on_mixed_text() {
        let text = "word ".repeat(3000) + "\n\n" + &"line\n".repeat(500);
        for c in chunk_text(&text, MAX_CHUNK_BYTES) {
            assert!(c.len() <= MAX_CHUNK_BYTES && !c.is_empty());
        }
    }
}
