//! Prints a namespace's reservation state: what it supports, the reservation held and
//! every registrant. Read-only (Identify and Reservation Report only).
//!
//! ```text
//! cargo run -p nvme-resv --example report -- /dev/nvme0n1
//! ```
//!
//! Needs read-write access to the device node (root, or the node's group).

use std::process::ExitCode;

use nvme_resv::{Namespace, Reservations};

fn main() -> ExitCode {
    let Some(path) = std::env::args_os().nth(1) else {
        eprintln!("usage: report /dev/nvmeXnY");
        return ExitCode::from(2);
    };
    match run(&path) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The error names the device, the step and the OS or NVMe cause.
            eprintln!("report: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(path: &std::ffi::OsStr) -> nvme_resv::Result<()> {
    let ns = Namespace::open(path)?;
    let caps = ns.require_reservations()?;
    println!("{} (nsid {})", ns.path().display(), ns.nsid());
    let types: Vec<String> = caps.types().iter().map(|t| t.0.to_string()).collect();
    println!("  types supported: {}", types.join(", "));
    let st = ns.report()?;
    println!("  generation {}, type held: {}", st.generation, st.rtype);
    for r in &st.registrants {
        let holder = if r.holds_reservation() {
            " (holder)"
        } else {
            ""
        };
        println!("  host {} key {}{holder}", r.hostid, r.rkey);
    }
    Ok(())
}
