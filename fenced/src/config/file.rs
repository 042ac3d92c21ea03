//! The TOML file: bounded, regular files only, unknown keys refused.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::args::*;
use super::error::*;
use super::limits;

/// Reads the TOML config file (`None`: no file, an empty layer). Unknown keys and
/// values of the wrong type are errors naming the key.
pub fn load_file(path: Option<&Path>) -> Result<Layer, ConfigError> {
    let Some(path) = path else {
        return Ok(Layer::default());
    };
    let read = |source| ConfigError::Read {
        path: path.to_owned(),
        source,
    };
    // O_NONBLOCK: opening a FIFO does not wait for a writer; the type check below
    // refuses it (and devices, directories) before anything is read.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(read)?;
    let ft = file.metadata().map_err(read)?.file_type();
    if !ft.is_file() {
        return Err(ConfigError::NotAFile {
            path: path.to_owned(),
            kind: file_kind(ft),
        });
    }
    let mut bytes = Vec::new();
    file.take(limits::MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read)?;
    if bytes.len() as u64 > limits::MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge {
            path: path.to_owned(),
        });
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        read(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not UTF-8 text ({e})"),
        ))
    })?;
    parse_file(path, &text)
}

pub use fenced::files::file_kind;

/// The parser's message on one line (some span several: "invalid string\nexpected
/// `"`, `'`").
pub(crate) fn flat(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

pub(crate) fn parse_file(path: &Path, text: &str) -> Result<Layer, ConfigError> {
    let table: toml::Table = toml::from_str(text).map_err(|error| ConfigError::Syntax {
        path: path.to_owned(),
        line: error
            .span()
            .and_then(|s| text.get(..s.start))
            .map_or(1, |before| 1 + before.matches('\n').count()),
        message: flat(error.message()),
    })?;
    // Key by key first: serde's own error does not say which key was wrong.
    for (key, value) in &table {
        let one = toml::Table::from_iter([(key.clone(), value.clone())]);
        if let Err(error) = toml::Value::Table(one).try_into::<Layer>() {
            let message = if Layer::KEYS.contains(&key.as_str()) {
                flat(error.message())
            } else {
                unknown_key(key)
            };
            return Err(ConfigError::Key {
                path: path.to_owned(),
                key: key.clone(),
                message,
            });
        }
    }
    toml::Value::Table(table)
        .try_into()
        .map_err(|error: toml::de::Error| ConfigError::Syntax {
            path: path.to_owned(),
            line: 1,
            message: flat(error.message()),
        })
}

/// An unknown key's message: the nearest known key when one is close (a typo, `-` for
/// `_`), instead of all thirty-odd.
fn unknown_key(key: &str) -> String {
    let normalised = key.replace('-', "_");
    // A key cut short (`ttl` for `ttl_secs`), else the nearest by edits.
    let prefixed = Layer::KEYS
        .iter()
        .filter(|k| normalised.len() >= 3 && k.starts_with(&format!("{normalised}_")))
        .min_by_key(|k| k.len());
    let nearest = Layer::KEYS
        .iter()
        .map(|k| (edit_distance(&normalised, k), *k))
        .min()
        .filter(|(d, _)| *d <= 2.max(key.len() / 4))
        .map(|(_, k)| k);
    match prefixed.copied().or(nearest) {
        Some(k) => format!("unknown key; did you mean `{k}`?"),
        _ => "unknown key (the keys are the long flags of `fenced run --help`, with underscores)"
            .to_owned(),
    }
}

/// Levenshtein distance between two short ASCII-ish strings.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}
