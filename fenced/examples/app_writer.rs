//! An application that writes the shared namespace next to `fenced` on the same host:
//! the application contract (README "Operating it") in one program.
//!
//! ```text
//! cargo run -p fenced --example app_writer -- http://127.0.0.1:2379 /fenced/ n1 /dev/nvme0n1 [COUNT]
//! ```
//!
//! 1. It starts only while `fenced` holds this node's membership (its unit is ordered
//!    `After=fenced.service` and `BindsTo=fenced.service`), and reads the node's
//!    generation in the same read: that is the generation fenced joined with, unless
//!    the node was fenced since (then every guarded update below is refused).
//! 2. Every block write goes through blockio (O_DIRECT); every metadata update carries
//!    the generation guard.
//! 3. "Fenced, stop" is: a write error for which `blockio::Error::may_be_fenced()` is
//!    true (a reservation conflict, `EBADE`; a write failed with `EIO` by a
//!    preempt-and-abort, which the writer's `ReservationProbe` classifies by reading
//!    the reservation report), or a guarded transaction refused. It never retries either: it
//!    exits with status 10 at once. Anything else is an ordinary error (status 1).
//!
//! Each round writes one 4 KiB block at `offset = round * 4096` and records it in
//! `<root>app/<node>/last` under the guard, `COUNT` rounds (default: until stopped),
//! one every 200 ms.

use std::process::ExitCode;
use std::time::Duration;

use etcd_client::{Txn, TxnOp};
use fenced::NodeId;
use fenced::guard::GenerationGuard;
use fenced::store::EtcdStore;

/// Exit status meaning "this node was fenced: stopped".
const EXIT_FENCED: u8 = 10;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("app_writer: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(endpoint), Some(root), Some(node), Some(device)) =
        (args.next(), args.next(), args.next(), args.next())
    else {
        return Err("usage: app_writer ENDPOINT ROOT NODE DEVICE [COUNT]".into());
    };
    let count: u64 = args.next().map_or(Ok(u64::MAX), |c| c.parse())?;
    let node = NodeId::new(&node)?;
    let store = EtcdStore::connect(&[endpoint], &root, Duration::from_secs(120)).await?;

    // 1. Membership and generation, in one read.
    let keys = store.keys();
    let resp = store
        .client()
        .txn(Txn::new().and_then(vec![
            TxnOp::get(keys.membership(&node), None),
            TxnOp::get(keys.generation(&node), None),
        ]))
        .await?;
    let got = |i: usize| match &resp.op_responses()[i] {
        etcd_client::TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
        _ => None,
    };
    if got(0).is_none() {
        return Err(format!(
            "{node} is not a member: start this application after fenced has joined (After=fenced.service)"
        )
        .into());
    }
    let generation: u64 = String::from_utf8(got(1).unwrap_or_default())?
        .trim()
        .parse()?;
    let guard = GenerationGuard::new(keys, &node, generation);
    println!("app_writer: {node} at generation {generation}");

    // 2. Writes through blockio, metadata under the guard.
    //    A write in flight when the node is preempted-and-aborted fails with EIO; the
    //    probe reads the reservation report and turns it into a reservation conflict
    //    when this node's key is gone.
    let key = nvme_resv::key_for_node(node.as_str());
    let probe = blockio::ReservationProbe::new(nvme_resv::Namespace::open(&device)?, key);
    let options = blockio::Options::default().fence_probe(std::sync::Arc::new(probe));
    let dev = device.clone();
    let mut writer =
        tokio::task::spawn_blocking(move || blockio::DirectWriter::open(&dev, options)).await??;
    for round in 0..count {
        let offset = round * 4096;
        let (w, r) = tokio::task::spawn_blocking(move || {
            let r = (|| {
                let align = writer.alignment().max(512);
                let buf = blockio::AlignedBuf::from_slice(&[0xa5; 4096], align)?;
                writer.write_at(&buf, offset)?;
                writer.flush()
            })();
            (writer, r)
        })
        .await?;
        writer = w;
        match r {
            Ok(()) => {}
            // 3. Fenced: stop at once, never retry.
            Err(e) if e.may_be_fenced() => {
                println!(
                    "app_writer: FENCED: write at {offset} refused: {}: stopping",
                    with_causes(&e)
                );
                return Ok(ExitCode::from(EXIT_FENCED));
            }
            Err(e) => return Err(format!("write at {offset} on {device}: {e}").into()),
        }
        let update = vec![TxnOp::put(
            format!("{}app/{node}/last", keys.root()),
            offset.to_string(),
            None,
        )];
        let resp = store.client().txn(guard.txn(update)).await?;
        if GenerationGuard::refused(&resp) {
            println!(
                "app_writer: FENCED: metadata update refused ({node} is past generation {generation}): stopping"
            );
            return Ok(ExitCode::from(EXIT_FENCED));
        }
        println!("app_writer: wrote block at {offset}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(ExitCode::SUCCESS)
}

/// `e` and each of its sources, `: `-separated: the cause of a refused write (EBADE or
/// the EIO of an aborted write) is in the source, not in the top-level message.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
