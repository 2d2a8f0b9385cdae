//! Where a config's values came from, so that a check made after loading (the schedule's
//! shape, the split of the layers, the MPI world) names the flag or the file that set the
//! key it rejects, as the loader's own errors do.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where one key's value came from.
#[derive(Clone, Debug)]
pub(super) enum Origin {
    File(PathBuf),
    /// The flag and its value as given, e.g. `--hidden-size 64`.
    Flag(String),
}

impl Origin {
    /// ``FILE: key `written` `` or ``command line: --flag value``.
    pub(super) fn describe(&self, written: &str) -> String {
        match self {
            Origin::File(p) => format!("{}: key `{written}`", p.display()),
            Origin::Flag(flag) => format!("command line: {flag}"),
        }
    }
}

/// Every key's origin, by canonical key, and the file whose defaults the rest keep (none
/// for a config built in code).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Origins {
    file: Option<PathBuf>,
    said: BTreeMap<String, String>,
}

impl Origins {
    pub(super) fn file(file: &Path) -> Origins {
        Origins { file: Some(file.to_path_buf()), said: BTreeMap::new() }
    }

    /// `key` was set at `origin`, written as `written` (an alias's name where an alias set it).
    pub(super) fn set(&mut self, key: &str, origin: &Origin, written: &str) {
        self.said.insert(key.to_owned(), origin.describe(written));
    }

    /// Where `key`'s value came from: ``command line: --flag value`` where a flag set it (an
    /// alias's flag included), ``FILE: key `written` `` where the file did, else
    /// ``FILE: key `key` (unset)``; ``key `key` `` in a config built in code.
    pub fn of(&self, key: &str) -> String {
        match (self.said.get(key), &self.file) {
            (Some(said), _) => said.clone(),
            (None, Some(file)) => format!("{}: key `{key}` (unset)", file.display()),
            (None, None) => format!("key `{key}`"),
        }
    }
}
