//! SQL identifiers: validated once, always quoted.

use weir_actors::{Error, Result};

/// The longest identifier accepted (PostgreSQL's limit).
pub const MAX_IDENTIFIER_LEN: usize = 63;

/// Checks that `name` is a plain identifier: an ASCII letter or `_`, then
/// letters, digits or `_`, at most 63 bytes. `what` names it in the error
/// ("table", "column").
///
/// # Errors
/// A permanent error naming the identifier and what is wrong with it.
pub fn validate_identifier(what: &str, name: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::permanent(format!(
            "invalid {what} name {name:?}: {why}"
        )))
    };
    let Some(first) = name.chars().next() else {
        return bad("it is empty");
    };
    if name.len() > MAX_IDENTIFIER_LEN {
        return bad("it is longer than 63 bytes");
    }
    if !(first.is_ascii_alphabetic() || first == '_') {
        return bad("it must start with a letter or an underscore");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_'))
    {
        return bad(&format!(
            "{c:?} is not allowed (use letters, digits and underscores)"
        ));
    }
    Ok(())
}

/// Quotes an identifier for SQL (`"name"`, doubling any `"`). Used on
/// validated names only, as a second line of defence.
pub fn quote_identifier(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        if c == '"' {
            out.push('"');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_identifiers_are_accepted() {
        for name in ["docs", "_x", "Table_1", "a1b2"] {
            assert!(validate_identifier("table", name).is_ok(), "{name}");
        }
    }

    #[test]
    fn injection_attempts_and_odd_names_are_rejected_with_the_name() {
        for name in [
            "",
            "1abc",
            "docs; DROP TABLE users",
            "a\"b",
            "a-b",
            "naïve",
            "x\0y",
            &"a".repeat(64),
        ] {
            let err = validate_identifier("table", name).err();
            let text = err.map(|e| e.to_string()).unwrap_or_default();
            assert!(text.contains("invalid table name"), "{name:?}: {text}");
        }
    }

    #[test]
    fn quoting_doubles_quotes() {
        assert_eq!(quote_identifier("docs"), "\"docs\"");
        assert_eq!(quote_identifier("a\"b"), "\"a\"\"b\"");
    }
}
