//! A large key space written fast, for the tests and benches that need one (the
//! sweep's paged read at 100 000 nodes): etcd transactions of at most etcd's default
//! `--max-txn-ops` operations, several in flight.

use std::sync::{Arc, Mutex};

use etcd_client::{Client, Txn, TxnOp};

/// etcd's default `--max-txn-ops`: the most operations one transaction may hold.
pub const MAX_TXN_OPS: usize = 128;

/// Writes `ops` in transactions of at most [`MAX_TXN_OPS`], 4 in flight (so in no set
/// order between transactions). Panics if etcd refuses one.
pub async fn put_all(client: &Client, ops: Vec<TxnOp>) {
    let mut batches = Vec::new();
    let mut ops = ops.into_iter().peekable();
    while ops.peek().is_some() {
        batches.push(ops.by_ref().take(MAX_TXN_OPS).collect::<Vec<_>>());
    }
    let batches = Arc::new(Mutex::new(batches));
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let (mut client, batches) = (client.clone(), batches.clone());
            tokio::spawn(async move {
                loop {
                    let Some(batch) = batches.lock().expect("lock").pop() else {
                        return;
                    };
                    client
                        .txn(Txn::new().and_then(batch))
                        .await
                        .expect("seed transaction");
                }
            })
        })
        .collect();
    for w in writers {
        w.await.expect("seed writer");
    }
}
