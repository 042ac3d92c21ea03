//! `fenced probe`: from this host, try one O_DIRECT write on the shared device and,
//! optionally, one metadata transaction guarded by a node's generation.
//!
//! The device is the shared volume the probe diagnoses, so the probe must not change
//! it: it reads the block at `--offset` and writes the same bytes back. A fenced host's
//! read may still succeed (Write Exclusive reservations let anyone read), its write is
//! refused by the device; a host that may write rewrites what was there.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use fenced::NodeId;
use fenced::guard::GenerationGuard;

use super::OpError;
use crate::config::EtcdArgs;

/// Exit status when the device or the guard refused.
const EXIT_REFUSED: u8 = 10;

#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    etcd: EtcdArgs,
    /// Device to probe: one block is read at --offset and the same bytes are written
    /// back, so the data is unchanged (a writer racing the probe on that block from
    /// another host could lose its write: pick an offset nothing writes while you
    /// probe, e.g. a scratch area of your layout).
    #[arg(long)]
    block_device: Option<PathBuf>,
    /// Byte offset of the probed block (default 1 MiB); a multiple of the device's
    /// block size, inside the device.
    #[arg(long, default_value = "1048576")]
    offset: u64,
    /// Node whose generation guards the metadata transaction.
    #[arg(long, requires = "generation")]
    node_id: Option<String>,
    /// The generation the writer believes it has.
    #[arg(long)]
    generation: Option<u64>,
}

/// A probe could not be carried out (a refusal is a result, not an error).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("probe task failed: {source}")]
    Task {
        #[source]
        source: tokio::task::JoinError,
    },
    /// blockio's error names the path; its source is the OS cause.
    #[error("cannot probe: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: blockio::Error,
    },
    #[error(
        "--offset {offset}: the probed block ({len} bytes) must lie inside {} ({size} bytes) at a multiple of {len}; choose another --offset",
        path.display()
    )]
    Offset {
        path: PathBuf,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error(
        "cannot read the block at offset {offset} (it is written back unchanged, so it must be read first): {source}"
    )]
    Read {
        offset: u64,
        #[source]
        source: blockio::Error,
    },
    #[error("write failed: {source}")]
    Write {
        #[source]
        source: blockio::Error,
    },
    #[error("guarded transaction failed: {source}")]
    GuardedTxn {
        #[source]
        source: etcd_client::Error,
    },
}

pub async fn probe(args: ProbeArgs) -> Result<ExitCode, OpError> {
    let offset = args.offset;
    let mut refused = false;
    if let Some(dev) = args.block_device {
        let r = tokio::task::spawn_blocking(move || rewrite_block(&dev, offset))
            .await
            .map_err(|source| ProbeError::Task { source })?;
        match r {
            Ok(()) => println!(
                "probe: O_DIRECT write at offset {offset}: ok (the block's own bytes written back)"
            ),
            Err(ProbeError::Write { source: e }) if e.is_reservation_conflict() => {
                refused = true;
                println!(
                    "probe: O_DIRECT write at offset {offset}: REFUSED: {e} (this host is fenced)"
                );
            }
            Err(e) => return Err(e.into()),
        }
    }
    if let (Some(node), Some(g)) = (args.node_id, args.generation) {
        let node = NodeId::new(&node)?;
        let store = super::connect(&args.etcd).await?;
        let guard = GenerationGuard::new(store.keys(), &node, g);
        let key = format!("{}probe/{node}", store.keys().root());
        let resp = store
            .client()
            .txn(guard.txn(vec![etcd_client::TxnOp::put(key, "late write", None)]))
            .await
            .map_err(|source| ProbeError::GuardedTxn { source })?;
        if GenerationGuard::refused(&resp) {
            refused = true;
            let now = store
                .generation(&node)
                .await
                .map_err(OpError::store("read the generation"))?
                .0;
            println!(
                "probe: metadata txn guarded by {node}@{g}: REFUSED (generation is now {now})"
            );
        } else {
            println!("probe: metadata txn guarded by {node}@{g}: committed");
        }
    }
    Ok(if refused {
        ExitCode::from(EXIT_REFUSED)
    } else {
        ExitCode::SUCCESS
    })
}

/// Reads the block at `offset` and writes the same bytes back.
fn rewrite_block(dev: &Path, offset: u64) -> Result<(), ProbeError> {
    let mut w =
        blockio::DirectWriter::open(dev, blockio::Options::default()).map_err(|source| {
            ProbeError::Open {
                path: dev.to_owned(),
                source,
            }
        })?;
    let align = w.alignment().max(512);
    let len = align.max(4096);
    let len64 = len as u64;
    if offset % len64 != 0 || offset.checked_add(len64).is_none_or(|end| end > w.size()) {
        return Err(ProbeError::Offset {
            path: dev.to_owned(),
            offset,
            len: len64,
            size: w.size(),
        });
    }
    let mut buf = blockio::AlignedBuf::zeroed(len, align)
        .map_err(|source| ProbeError::Read { offset, source })?;
    w.read_at(&mut buf, offset)
        .map_err(|source| ProbeError::Read { offset, source })?;
    w.write_at(&buf, offset)
        .map_err(|source| ProbeError::Write { source })?;
    w.flush().map_err(|source| ProbeError::Write { source })
}
