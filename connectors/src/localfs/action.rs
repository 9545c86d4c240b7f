//! The actions of the local directory target: what its sinks do with a
//! directory and with a file.

use serde::{Deserialize, Serialize};

/// What the directory sink does with one directory.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct DirAction {
    /// The directory's absolute path (its key).
    pub path: String,
    /// On `Delete`: remove the directory and everything in it. `false`
    /// leaves it as it is (the directory is abandoned).
    pub remove_tree: bool,
}

/// What the file sink does with one file.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct FileAction {
    /// The file's path relative to the directory, with forward slashes.
    pub path: String,
    /// The content to write, on `Create` and `Update`; `None` on `Delete`.
    #[serde(with = "serde_bytes")]
    pub content: Option<Vec<u8>>,
}
