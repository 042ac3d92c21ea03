//! The generation guard in a storage tool's metadata path.
//!
//! ```text
//! cargo run -p fenced --example generation_guard -- http://127.0.0.1:2379 /fenced/ n1
//! ```
//!
//! Reads `n1`'s generation (as the node agent does when it joins), then commits one
//! metadata update guarded by it. Run it, bump the generation (`etcdctl put
//! /fenced/gen/n1 <g+1>`, or let a controller fence n1), and the same guarded update
//! is refused: a fenced writer's late metadata never lands.

use etcd_client::TxnOp;
use fenced::NodeId;
use fenced::guard::GenerationGuard;
use fenced::store::EtcdStore;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let endpoint = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:2379".into());
    let root = args.next().unwrap_or_else(|| "/fenced/".into());
    let node = NodeId::new(&args.next().unwrap_or_else(|| "n1".into()))?;
    let store = EtcdStore::connect(&[endpoint], &root, std::time::Duration::from_secs(120)).await?;

    // The generation this writer holds (the agent reads it when joining).
    let (generation, _) = store.generation(&node).await?;
    let guard = GenerationGuard::new(store.keys(), &node, generation);

    // Every metadata mutation carries the guard.
    let update = vec![TxnOp::put(
        format!("/meta/{node}/inode/7"),
        "extent 12",
        None,
    )];
    let resp = store.client().txn(guard.txn(update)).await?;
    if GenerationGuard::refused(&resp) {
        let (now, _) = store.generation(&node).await?;
        println!(
            "refused: {node} holds generation {generation}, etcd says {now}: this writer was fenced"
        );
        std::process::exit(10);
    }
    println!("committed under {node}@{generation}");
    Ok(())
}
