//! Deciding whether a write that failed with `EIO` was fenced.
//!
//! # The problem
//! A preempt-and-abort removes this host's registration and aborts the commands it
//! has in flight. Aborted commands do not come back as a reservation conflict: the
//! Linux NVMe target (nvmet) completes the requests that arrive while it drains the
//! victim's controller with Internal Error, a PCIe drive answers *Command Aborted due
//! to Preempt and Abort*, and the block layer reports both as `EIO` — possibly before
//! the first `EBADE`, possibly with no `EBADE` at all if nothing else was queued. On
//! its own, such an `EIO` is indistinguishable from a media or path error, and a
//! caller that treats it as one might retry the write (on this path or another) or
//! fail the disk instead of stopping.
//!
//! # The choice: ask the device
//! A write that fails with `EIO` is classified by a caller-supplied [`FenceProbe`]
//! (set with [`Options::fence_probe`](crate::Options::fence_probe)), consulted right
//! there, before the completion is handed out:
//!
//! | state when the `EIO` arrives | result |
//! |---|---|
//! | writer already fenced (an earlier `EBADE` or probe) | [`Error::ReservationConflict`](crate::Error::ReservationConflict), no probe |
//! | probe says [`FenceVerdict::Fenced`] (at once or within the settle time) | `ReservationConflict`; the writer becomes fenced |
//! | probe still says [`FenceVerdict::NotFenced`] when the settle time has passed | [`Error::Io`](crate::Error::Io) (a real I/O error) |
//! | the probe itself fails | [`Error::FenceUnverified`](crate::Error::FenceUnverified) |
//! | no probe configured | `Error::Io`, with [`Error::may_be_fenced`](crate::Error::may_be_fenced) true |
//!
//! ## Why "not fenced" must settle
//! One report right after the `EIO` is not enough. The specification describes Preempt
//! and Abort as the preempt (the preempted registrations are removed) followed by
//! aborting the preempted hosts' commands, but Linux nvmet (7.3) does it the other way
//! round for each victim: `nvmet_pr_set_ctrl_to_abort` kills the victim controller's
//! per-namespace command reference — from then on its new commands fail with Internal
//! Error, `EIO` on the host — waits for that kill to be confirmed (an RCU grace
//! period), and only then `nvmet_pr_unregister_one` removes the registration. A report
//! in that window still lists the victim. hwtests caught exactly this: the probe said
//! "not fenced" three times for `EIO`s of a preempt-and-abort in one of ten rounds.
//!
//! So a "not fenced" answer is believed only once it still holds
//! [`Options::fence_probe_settle`](crate::Options::fence_probe_settle) (default 1 s)
//! after the failed completion was collected; until then the probe is asked again
//! (2 ms pauses doubling to 50 ms). "Fenced" ends the wait at once, so a fenced host
//! is classified in the time of one or a few reports, and only genuine I/O errors pay
//! the settle time — once per batch of completions collected together, since a report
//! that settled clears every `EIO` collected at least the settle time before it.
//! The window on nvmet is one RCU grace period (milliseconds), far below the default.
//! A device that can take longer between failing a victim's commands and dropping its
//! registration needs a longer settle time.
//!
//! The probe can use the victim's own controller: nvmet dispatches reservation
//! commands before the per-controller reference is taken, so a Reservation Report
//! from the victim succeeds while its reads and writes fail.
//!
//! The alternative — holding `EIO` completions in a "suspect" state until a later
//! completion (an `EBADE`) decides — was rejected: nothing guarantees a later
//! completion (the aborted write may have been the last one queued), a real media error
//! would be delayed for an unbounded time, and a held `EIO` still needs something to
//! decide it when no `EBADE` follows — which is the device's reservation state, the
//! probe.
//!
//! A probe failure does not fence the writer: the device keeps enforcing the
//! reservation on every later write (a fenced host's next write fails with `EBADE`), so
//! refusing writes locally would only turn a probe hiccup into an outage. The failed
//! write itself is reported as possibly fenced and must not be retried.
//!
//! With the `nvme-resv` feature, `ReservationProbe` implements the probe with a
//! Reservation Report on the namespace (or any other `nvme_resv::Reservations`).

use std::fmt;

/// What a [`FenceProbe`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FenceVerdict {
    /// This host may no longer write: its registration is gone or the reservation now
    /// excludes it. The failed write is classified as a reservation conflict.
    Fenced,
    /// This host is still allowed to write: the failure was an ordinary I/O error.
    NotFenced,
}

/// The error a [`FenceProbe`] returns when it cannot decide.
pub type ProbeError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Tells whether this host has been fenced, by asking the device (or whatever holds
/// the truth) *now*. Consulted when a write fails with `EIO`; see the
/// [module documentation](self) for when and why.
///
/// `probe` runs on the thread that reaps the failed completion, while other requests
/// may still be in flight on the same device; it must not use the [`DirectWriter`]
/// it is attached to. It should be quick (one admin or reservation command) and must
/// not itself wait for the writer's requests.
///
/// [`DirectWriter`]: crate::DirectWriter
pub trait FenceProbe: Send + Sync + fmt::Debug {
    /// Whether this host is fenced right now.
    fn probe(&self) -> Result<FenceVerdict, ProbeError>;
}

impl<F: FenceProbe + ?Sized> FenceProbe for std::sync::Arc<F> {
    fn probe(&self) -> Result<FenceVerdict, ProbeError> {
        (**self).probe()
    }
}

impl<F: FenceProbe + ?Sized> FenceProbe for Box<F> {
    fn probe(&self) -> Result<FenceVerdict, ProbeError> {
        (**self).probe()
    }
}

#[cfg(feature = "nvme-resv")]
pub use nvme::ReservationProbe;

#[cfg(feature = "nvme-resv")]
mod nvme {
    use nvme_resv::{HostId, Key, ReservationStatus, ReservationType, Reservations};

    use super::{FenceProbe, FenceVerdict, ProbeError};

    /// A [`FenceProbe`] that reads the Reservation Report through `R` (typically the
    /// writer's own namespace, `nvme_resv::Namespace::open` on the same device) and
    /// says [`FenceVerdict::Fenced`] when this host's key is no longer registered, or
    /// is registered but the reservation type lets only another holder write (Write
    /// Exclusive, Exclusive Access).
    ///
    /// The host is identified by its key, and additionally by its host identifier when
    /// [`host_id`](ReservationProbe::host_id) is given (then a registration of the same
    /// key by another host does not count).
    #[derive(Debug)]
    pub struct ReservationProbe<R> {
        ns: R,
        key: Key,
        hostid: Option<HostId>,
    }

    impl<R: Reservations> ReservationProbe<R> {
        /// Probes through `ns` for the registration of `key`.
        pub fn new(ns: R, key: Key) -> Self {
            Self {
                ns,
                key,
                hostid: None,
            }
        }

        /// Also requires the registration to belong to host identifier `hostid`.
        pub fn host_id(mut self, hostid: HostId) -> Self {
            self.hostid = Some(hostid);
            self
        }

        /// The verdict for a report already read (pure; used by `probe`).
        pub fn verdict(&self, status: &ReservationStatus) -> FenceVerdict {
            let mine = status
                .registrants
                .iter()
                .find(|r| r.rkey == self.key && self.hostid.is_none_or(|h| h == r.hostid));
            let Some(mine) = mine else {
                return FenceVerdict::Fenced;
            };
            let rtype = status.rtype;
            if rtype != ReservationType::NONE && rtype.is_holder_only() && !mine.holds_reservation()
            {
                return FenceVerdict::Fenced;
            }
            FenceVerdict::NotFenced
        }
    }

    impl<R> FenceProbe for ReservationProbe<R>
    where
        R: Reservations + Send + Sync + std::fmt::Debug,
    {
        fn probe(&self) -> Result<FenceVerdict, ProbeError> {
            let status = self.ns.report()?;
            let verdict = self.verdict(&status);
            tracing::debug!(key = %self.key, generation = status.generation, ?verdict, "blockio: fence probe read the reservation report");
            Ok(verdict)
        }
    }
}

#[cfg(all(test, feature = "nvme-resv"))]
mod tests {
    //! `ReservationProbe` against `nvme_resv::model` (the specification's rules, checked
    //! against the real nvmet target in hwtests), alone and inside a `DirectWriter`.

    use std::sync::Arc;

    use nvme_resv::model::Namespace;
    use nvme_resv::{
        Acquire, HostId, Key, NvmeStatus, Operation, Register, ReservationType, Reservations,
    };

    use super::*;
    use crate::{AlignedBuf, DirectWriter, EngineKind, Error, Options};

    const KA: Key = Key(0xa);
    const KB: Key = Key(0xb);
    const A: HostId = HostId([0xa; 16]);
    const B: HostId = HostId([0xb; 16]);
    const C: HostId = HostId([0xc; 16]);
    const WEAR: ReservationType = ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS;

    #[test]
    fn registered_is_not_fenced_preempted_is() {
        let ns = Namespace::new();
        let (a, b) = (ns.host(A), ns.host(B));
        let probe = ReservationProbe::new(ns.host(A), KA).host_id(A);
        assert_eq!(
            probe.probe().expect("probe"),
            FenceVerdict::Fenced,
            "never registered"
        );
        a.register(&Register::register(KA)).expect("register A");
        assert_eq!(
            probe.probe().expect("probe"),
            FenceVerdict::NotFenced,
            "no reservation"
        );
        a.acquire(&Acquire::acquire(KA, WEAR)).expect("acquire");
        b.register(&Register::register(KB)).expect("register B");
        assert_eq!(probe.probe().expect("probe"), FenceVerdict::NotFenced);
        b.acquire(&Acquire::preempt_and_abort(KB, KA, WEAR))
            .expect("B preempts A");
        assert_eq!(probe.probe().expect("probe"), FenceVerdict::Fenced);
        // B, still registered, is not.
        let pb = ReservationProbe::new(ns.host(B), KB);
        assert_eq!(pb.probe().expect("probe"), FenceVerdict::NotFenced);
    }

    #[test]
    fn a_registrant_shut_out_by_a_holder_only_type_is_fenced() {
        let ns = Namespace::new();
        let (a, b) = (ns.host(A), ns.host(B));
        a.register(&Register::register(KA)).expect("register A");
        b.register(&Register::register(KB)).expect("register B");
        b.acquire(&Acquire::acquire(KB, ReservationType::WRITE_EXCLUSIVE))
            .expect("B holds Write Exclusive");
        let pa = ReservationProbe::new(ns.host(A), KA);
        assert_eq!(pa.probe().expect("probe"), FenceVerdict::Fenced);
        let pb = ReservationProbe::new(ns.host(B), KB);
        assert_eq!(
            pb.probe().expect("probe"),
            FenceVerdict::NotFenced,
            "the holder"
        );
    }

    #[test]
    fn the_host_id_pins_the_registration_to_this_host() {
        let ns = Namespace::new();
        // Another host registered the same key: by key alone this host looks registered.
        ns.host(C)
            .register(&Register::register(KA))
            .expect("register C");
        let by_key = ReservationProbe::new(ns.host(A), KA);
        assert_eq!(by_key.probe().expect("probe"), FenceVerdict::NotFenced);
        let by_host = ReservationProbe::new(ns.host(A), KA).host_id(A);
        assert_eq!(by_host.probe().expect("probe"), FenceVerdict::Fenced);
    }

    #[test]
    fn a_failed_report_is_a_probe_error() {
        let ns = Namespace::new();
        ns.host(A)
            .register(&Register::register(KA))
            .expect("register A");
        ns.fail_next(Operation::Report, NvmeStatus::INTERNAL);
        let probe = ReservationProbe::new(ns.host(A), KA);
        let e = probe.probe().expect_err("the report failed");
        assert!(!e.to_string().is_empty());
        assert_eq!(probe.probe().expect("probe"), FenceVerdict::NotFenced);
    }

    /// The writer and the probe together: an injected EIO is an I/O error while this
    /// host is registered and a conflict once the model says it was preempted.
    fn writer_with_reservation_probe(engine: EngineKind) {
        let base = std::env::var_os("BLOCKIO_TEST_DIR").unwrap_or_else(|| "/var/tmp".into());
        let dir = tempfile::tempdir_in(base).expect("temp dir");
        let path = dir.path().join("dev.img");
        std::fs::File::create(&path)
            .and_then(|f| f.set_len(1 << 20))
            .expect("create");

        let ns = Namespace::new();
        let (a, b) = (ns.host(A), ns.host(B));
        a.register(&Register::register(KA)).expect("register A");
        a.acquire(&Acquire::acquire(KA, WEAR)).expect("acquire");
        b.register(&Register::register(KB)).expect("register B");
        let probe = Arc::new(ReservationProbe::new(ns.host(A), KA).host_id(A));
        let opts = Options::default()
            .engine(engine)
            .fence_probe(probe)
            .fence_probe_settle(std::time::Duration::from_millis(50));
        let mut w = DirectWriter::open(&path, opts).expect("open");
        assert_eq!(w.engine(), engine);
        let mut buf = AlignedBuf::zeroed(w.alignment(), w.alignment()).expect("buf");
        buf.as_mut_slice().fill(0x5e);

        w.inject_completion(-libc::EIO);
        let e = w.write_at(&buf, 0).expect_err("EIO while registered");
        assert!(matches!(e, Error::Io { .. }), "{e:?}");
        assert!(!w.is_fenced());
        w.write_at(&buf, 0).expect("A still writes");

        b.acquire(&Acquire::preempt_and_abort(KB, KA, WEAR))
            .expect("B preempts A");
        w.inject_completion(-libc::EIO);
        let e = w.write_at(&buf, 0).expect_err("EIO after the preempt");
        assert!(e.is_reservation_conflict(), "{e:?}");
        assert!(w.is_fenced());
    }

    on_each_engine!(writer_with_reservation_probe);
}
