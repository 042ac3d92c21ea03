//! This node's registration as `on` recorded it: the key (which `off` fences others
//! with, and refuses to fence) and the devices (which `fence_nvme_check` watches).
//!
//! One `name=value` per line; written to a temporary file and renamed, so a reader
//! sees the old record or the new one, never half of one.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nvme_resv::Key;

use crate::error::Error;
use crate::options::parse_key;

/// The record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalState {
    /// This node's name, when `on` was given one.
    pub node: Option<String>,
    /// The key this node registered.
    pub key: Key,
    /// The devices it registered on.
    pub devices: Vec<PathBuf>,
}

impl LocalState {
    /// The file's text.
    pub fn render(&self) -> String {
        let mut s = String::from(
            "# fence_nvme: this node's registration, written by `on`; read by `off` and fence_nvme_check\n",
        );
        if let Some(n) = &self.node {
            s.push_str(&format!("node={n}\n"));
        }
        s.push_str(&format!("key={}\n", self.key));
        for d in &self.devices {
            s.push_str(&format!("device={}\n", d.display()));
        }
        s
    }

    /// Parses the file's text.
    pub fn parse(path: &Path, text: &str) -> Result<Self, Error> {
        let invalid = |line, why| Error::StateInvalid {
            path: path.to_path_buf(),
            line,
            why,
        };
        let (mut node, mut key, mut devices) = (None, None, Vec::new());
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match line.split_once('=') {
                Some(("node", v)) => node = Some(v.to_owned()),
                Some(("key", v)) => {
                    key = Some(parse_key(v).ok_or_else(|| invalid(i + 1, "bad key"))?)
                }
                Some(("device", v)) if v.starts_with('/') => devices.push(PathBuf::from(v)),
                _ => return Err(invalid(i + 1, "unexpected line")),
            }
        }
        let key = key.ok_or_else(|| invalid(0, "no key= line"))?;
        if devices.is_empty() {
            return Err(invalid(0, "no device= line"));
        }
        Ok(Self { node, key, devices })
    }

    /// Reads the record at `path`.
    pub fn load(path: &Path) -> Result<Self, Error> {
        match fs::read_to_string(path) {
            Ok(text) => Self::parse(path, &text),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Error::NotUnfenced {
                path: path.to_path_buf(),
            }),
            Err(source) => Err(Error::StateIo {
                what: "reading",
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Writes the record to `path` (creating its directory), atomically.
    pub fn store(&self, path: &Path) -> Result<(), Error> {
        let io = |what, p: &Path| {
            let p = p.to_path_buf();
            move |source| Error::StateIo {
                what,
                path: p,
                source,
            }
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).map_err(io("creating the directory of", path))?;
        }
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        fs::write(&tmp, self.render()).map_err(io("writing", &tmp))?;
        fs::rename(&tmp, path).map_err(io("renaming into place", path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/state");
        let st = LocalState {
            node: Some("n1".into()),
            key: Key(0xabc),
            devices: vec!["/dev/nvme0n1".into(), "/dev/ng1n1".into()],
        };
        st.store(&path).unwrap();
        assert_eq!(LocalState::load(&path).unwrap(), st);
        assert!(!path.with_file_name("state.tmp").exists());
    }

    #[test]
    fn missing_and_malformed_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let e = LocalState::load(&path).unwrap_err();
        assert!(matches!(e, Error::NotUnfenced { .. }));
        assert!(e.to_string().contains("has not been unfenced"));
        for (text, why) in [
            ("key=0x1\n", "no device= line"),
            ("device=/dev/x\n", "no key= line"),
            ("key=0\ndevice=/dev/x\n", "bad key"),
            ("key=0x1\ndevice=/dev/x\nfoo\n", "unexpected line"),
            ("key=0x1\ndevice=relative\n", "unexpected line"),
        ] {
            let e = LocalState::parse(&path, text).unwrap_err().to_string();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }
}
