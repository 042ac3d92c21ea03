//! Fencing on the in-memory model: host B preempts host A, after which A's writes are
//! refused. The same calls work on a real [`nvme_resv::Namespace`]; the model needs no
//! device, so this runs anywhere:
//!
//! ```text
//! cargo run -p nvme-resv --example fence
//! ```

use nvme_resv::{Access, Acquire, HostId, NodeId, Register, ReservationType, Reservations, model};

fn main() -> nvme_resv::Result<()> {
    let ns = model::Namespace::new();
    let (a, b) = (ns.host(HostId([0xa; 16])), ns.host(HostId([0xb; 16])));
    // Keys derived from validated node ids: any survivor can compute any node's key.
    let node = |id: &str| NodeId::new(id).expect("a valid node id").key();
    let (ka, kb) = (node("node-a"), node("node-b"));
    let rtype = ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY;

    a.register(&Register::register(ka))?;
    a.acquire(&Acquire::acquire(ka, rtype))?;
    b.register(&Register::register(kb))?;
    println!(
        "before: {} registrants, A holds",
        ns.snapshot().registrants.len()
    );

    b.acquire(&Acquire::preempt(kb, ka, rtype))?;
    let err = a.check(Access::Write).expect_err("A is fenced");
    println!("A writes: {err}");
    let st = b.report()?;
    let holder = st.holder().map(|h| h.rkey);
    assert_eq!(holder, Some(kb), "B holds the reservation");
    println!("after: holder {kb}, A registered: {}", st.is_registered(ka));
    Ok(())
}
