//! `O_DIRECT` I/O on a shared block device, where a reservation conflict means "fenced".
//!
//! The data path of a host that shares an NVMe namespace with others. Its one
//! non-negotiable property: when this host's registration is preempted, the very next
//! write fails with the typed [`Error::ReservationConflict`] (the kernel's `EBADE`),
//! nothing is retried behind the caller's back, and the [`DirectWriter`] stays *fenced*:
//! every later write fails fast with the same error, without reaching the device.
//!
//! Two engines sit behind one API: io_uring (queued requests, batched submission, a
//! registered file) and synchronous `pwrite`/`pread`, chosen automatically when
//! io_uring is unavailable (the `kernel.io_uring_disabled` sysctl, seccomp filters in
//! containers) or on request; [`DirectWriter::engine`] reports the one in use.
//!
//! ```no_run
//! use blockio::{AlignedBuf, DirectWriter, Options};
//!
//! let mut w = DirectWriter::open("/dev/nvme0n1", Options::default())?;
//! let mut buf = AlignedBuf::zeroed(4096, w.alignment())?;
//! buf.as_mut_slice().fill(0xab);
//! match w.write_at(&buf, 0) {
//!     Err(e) if e.is_reservation_conflict() => {
//!         // This host was fenced: stop all I/O, do not retry.
//!         assert!(w.is_fenced());
//!     }
//!     other => other?,
//! }
//! w.flush()?;
//! # Ok::<(), blockio::Error>(())
//! ```
//!
//! A preempt-and-abort can also fail writes that were in flight with `EIO` instead of
//! `EBADE`; a [`FenceProbe`] given in [`Options::fence_probe`] lets the writer classify
//! those as fenced too (see the [`probe`] module).
//!
//! Queued use, for throughput: [`DirectWriter::submit_write`] takes the buffer by
//! value, [`DirectWriter::reap`] returns it in a [`Completion`] with the request's
//! result, offset and length.
#![deny(unsafe_code)]
#![deny(missing_docs)]

/// For a test body `$test(engine)` (or `$test($via(engine))`), a module `$test` with one
/// `#[test]` per engine, `io_uring` and `sync`: both engines must pass it, and each
/// reports on its own (`cargo test $test` runs both).
#[cfg(test)]
macro_rules! on_each_engine {
    ($test:ident) => {
        on_each_engine!(@mod $test, ::std::convert::identity);
    };
    ($test:ident via $via:ident) => {
        on_each_engine!(@mod $test, super::$via);
    };
    (@mod $test:ident, $via:path) => {
        mod $test {
            #[test]
            fn io_uring() {
                super::$test($via(crate::EngineKind::IoUring));
            }

            #[test]
            fn sync() {
                super::$test($via(crate::EngineKind::Sync));
            }
        }
    };
}

mod error;
mod fence;
mod geometry;
mod options;
pub mod probe;
mod req;
mod sync;
#[allow(unsafe_code)]
mod sys;
mod writer;

pub use error::{Error, Op, Result};
pub use options::{DEFAULT_FENCE_PROBE_SETTLE, EngineKind, Options, RingSetup, SubmitMode};
#[cfg(feature = "nvme-resv")]
pub use probe::ReservationProbe;
pub use probe::{FenceProbe, FenceVerdict, ProbeError};
pub use req::{Completion, Rejected};
pub use sys::buf::AlignedBuf;
pub use writer::DirectWriter;
