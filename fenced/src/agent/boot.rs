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
use crate::store::{BootRecord, RestartState};

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

/// A registration refused by the once-per-boot rule: what happened and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{node}'s reservation key is not registered on the device, but an earlier daemon on \
     this same boot (boot id {boot_id}) joined and registered it: the key was removed from \
     the device on this boot, so this host was fenced (or is being fenced). Refusing to \
     register it again, since an application that earlier daemon fed could then write \
     again. This daemon exits unregistered; its membership expires and the node is fenced. \
     Reboot the host, or, once that fence completed and nothing on this host still writes \
     the shared device, run `fenced unfence --node-id {node} --reason \"...\"` and start \
     fenced again"
)]
pub struct KeyRemovedSameBoot {
    /// The node.
    pub node: NodeId,
    /// The boot id, unchanged since the earlier join.
    pub boot_id: String,
}

/// The once-per-boot rule at `unfence`, pure (fence_scsi's rule; the stateright
/// model's `register_once_per_boot`, finding 4): an instance that joined before a
/// fence passes [`check_restart`] and could register its key after the fence preempted
/// it, letting an application an earlier instance fed write again. So the key is
/// registered at most once per boot: refused when it is not on the device and
/// `previous` (the boot record read at start, before this join rewrote it) says an
/// earlier join on this same boot, with no `fenced unfence` nor clean leave since.
/// Allowed: the key is still registered (nothing to do), no record, another boot (a
/// reboot ended every writer), or the record was written by `unfence` or `leave`.
pub fn check_register(
    node: &NodeId,
    previous: Option<&BootRecord>,
    boot_id: &str,
    key_registered: bool,
) -> Result<(), KeyRemovedSameBoot> {
    match previous {
        Some(b) if !key_registered && b.boot_id == boot_id && b.by == BootRecord::BY_JOIN => {
            Err(KeyRemovedSameBoot {
                node: node.clone(),
                boot_id: boot_id.to_owned(),
            })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn the_key_is_registered_at_most_once_per_boot() {
        let n = NodeId::new("n1").unwrap();
        let rec = |id: &str, by: &str| BootRecord {
            boot_id: id.into(),
            generation: 0,
            by: by.into(),
        };
        let join = rec("b1", BootRecord::BY_JOIN);
        // Key gone, an earlier join on this boot registered it: refused.
        let e = check_register(&n, Some(&join), "b1", false).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("removed from the device on this boot"), "{m}");
        assert!(m.contains("Reboot the host"), "{m}");
        assert!(m.contains("fenced unfence --node-id n1 --reason"), "{m}");
        // The key is still there: nothing is registered, nothing to refuse.
        check_register(&n, Some(&join), "b1", true).unwrap();
        // Another boot, no record: allowed.
        check_register(&n, Some(&join), "b2", false).unwrap();
        check_register(&n, None, "b1", false).unwrap();
        // An operator's unfence or a clean leave since: allowed.
        check_register(&n, Some(&rec("b1", BootRecord::BY_UNFENCE)), "b1", false).unwrap();
        check_register(&n, Some(&rec("b1", BootRecord::BY_LEAVE)), "b1", false).unwrap();
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
