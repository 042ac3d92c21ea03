//! The restart rule: a node fenced since its last join does not register its key again
//! from the same boot of its host.
//!
//! A fence cuts the host off the device, but the application on the host may have kept
//! running through the partition. If the daemon's restart (a service manager's
//! `Restart=`, an operator) re-registered the key, that application could write again,
//! possibly into arenas already handed to other nodes. So the join records the host's
//! boot id and the generation it joined with (`boot/<node>`), and a start on the same
//! boot whose generation moved past it is refused. A reboot (new boot id) ended every
//! process of the old boot, so it may join; so may a node an operator unfenced
//! (`fenced unfence`, which rewrites the record to the current generation). fence_scsi
//! unfences only at boot for the same reason; SBD has `SBD_STARTMODE=clean`.

use std::path::{Path, PathBuf};

use crate::node::NodeId;
use crate::store::RestartState;

/// Where the kernel publishes this boot's id (a random UUID per boot).
pub const BOOT_ID_FILE: &str = "/proc/sys/kernel/random/boot_id";

/// The boot id could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BootIdError {
    /// Reading the file failed.
    #[error("cannot read the boot id from {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is empty.
    #[error("the boot id file {} is empty", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// Reads this boot's id from `path` (normally [`BOOT_ID_FILE`]), trimmed.
pub fn read_boot_id(path: &Path) -> Result<String, BootIdError> {
    let text = std::fs::read_to_string(path).map_err(|source| BootIdError::Read {
        path: path.to_owned(),
        source,
    })?;
    let id = text.trim();
    if id.is_empty() {
        return Err(BootIdError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(id.to_owned())
}

/// A start refused by the restart rule: what happened and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{node} was fenced since its last join (generation {joined_generation} at {by}, now \
     {generation}) and this host has not rebooted since (same boot id {boot_id}): refusing \
     to register its reservation key again, since an application that kept running through \
     the partition could then write again. Reboot the host, or, once nothing on this host \
     still writes the shared device, run `fenced unfence --node-id {node} --reason \"...\"` \
     and start fenced again"
)]
pub struct FencedSameBoot {
    /// The node.
    pub node: NodeId,
    /// Its generation now.
    pub generation: u64,
    /// Its generation when it last joined (or was unfenced).
    pub joined_generation: u64,
    /// What wrote the record: `join` or `unfence`.
    pub by: String,
    /// The boot id, unchanged.
    pub boot_id: String,
}

/// The restart rule, pure: refused when the node's last join (or unfence) was from
/// this same boot and its generation moved past the one recorded then. No record (the
/// node never joined with a boot id): allowed.
pub fn check_restart(
    node: &NodeId,
    seen: &RestartState,
    boot_id: &str,
) -> Result<(), FencedSameBoot> {
    match &seen.boot {
        Some(b) if b.boot_id == boot_id && seen.generation > b.generation => Err(FencedSameBoot {
            node: node.clone(),
            generation: seen.generation,
            joined_generation: b.generation,
            by: b.by.clone(),
            boot_id: boot_id.to_owned(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::BootRecord;

    fn state(boot: Option<(&str, u64)>, generation: u64) -> RestartState {
        RestartState {
            boot: boot.map(|(id, g)| BootRecord {
                boot_id: id.into(),
                generation: g,
                by: BootRecord::BY_JOIN.into(),
            }),
            boot_rev: i64::from(boot.is_some()),
            generation,
            generation_rev: 1,
            member: false,
            revision: 9,
        }
    }

    #[test]
    fn only_a_fence_since_the_join_on_the_same_boot_refuses() {
        let n = NodeId::new("n3").unwrap();
        // Fenced since the join, same boot: refused, and the message says what to do.
        let e = check_restart(&n, &state(Some(("b1", 0)), 1), "b1").unwrap_err();
        assert_eq!((e.joined_generation, e.generation), (0, 1));
        let m = e.to_string();
        assert!(m.contains("n3 was fenced since its last join"), "{m}");
        assert!(m.contains("Reboot the host"), "{m}");
        assert!(m.contains("fenced unfence --node-id n3 --reason"), "{m}");
        // Rebooted since: allowed.
        check_restart(&n, &state(Some(("b1", 0)), 1), "b2").unwrap();
        // Not fenced since the join (a clean leave, a crash not yet fenced): allowed.
        check_restart(&n, &state(Some(("b1", 1)), 1), "b1").unwrap();
        // Never joined with a boot id: allowed.
        check_restart(&n, &state(None, 4), "b1").unwrap();
    }

    #[test]
    fn the_boot_id_is_read_trimmed_and_an_empty_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("boot_id");
        std::fs::write(&p, "0f1e2d3c-aaaa\n").unwrap();
        assert_eq!(read_boot_id(&p).unwrap(), "0f1e2d3c-aaaa");
        std::fs::write(&p, "\n").unwrap();
        assert!(matches!(read_boot_id(&p), Err(BootIdError::Empty { .. })));
        let e = read_boot_id(&dir.path().join("missing")).unwrap_err();
        assert!(
            e.to_string().starts_with("cannot read the boot id from"),
            "{e}"
        );
    }
}
