//! `fenced probe`: from this host, try one O_DIRECT write on the shared device and,
//! optionally, one metadata transaction guarded by a node's generation.

use std::path::PathBuf;
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
    /// Device to write one block to.
    #[arg(long)]
    block_device: Option<PathBuf>,
    /// Byte offset of the write (default 1 MiB).
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
        let r = tokio::task::spawn_blocking(move || -> Result<(), blockio::Error> {
            let mut w = blockio::DirectWriter::open(&dev, blockio::Options::default())?;
            let align = w.alignment().max(512);
            let buf = blockio::AlignedBuf::from_slice(&vec![0x5a; align.max(4096)], align)?;
            w.write_at(&buf, offset)?;
            w.flush()
        })
        .await
        .map_err(|source| ProbeError::Task { source })?;
        match r {
            Ok(()) => println!("probe: O_DIRECT write at offset {offset}: ok"),
            Err(e) if e.is_reservation_conflict() => {
                refused = true;
                println!(
                    "probe: O_DIRECT write at offset {offset}: REFUSED: {e} (this host is fenced)"
                );
            }
            Err(source) => return Err(ProbeError::Write { source }.into()),
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
