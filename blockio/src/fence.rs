//! The writer's judgment: the one place where a request's raw result (`cqe.res`, or
//! `n`/`-errno` from a system call) is interpreted, and the fenced state it keeps.
//!
//! Both engines hand every raw result to a [`Fence`] (through [`Judge`]) and do what it
//! says: submit the rest, or finish the request with its outcome. Here, and only here,
//! `EBADE` becomes [`Error::ReservationConflict`] and fences the writer (why:
//! `crate::error`), short transfers are continued from an aligned point or reported as
//! [`Error::Short`], `EINTR`/`EAGAIN` are resubmitted (bounded), and a write failing
//! with `EIO` is classified with the fence probe, whose pauses are set here too (the
//! rules: `crate::probe`).

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Op};
use crate::probe::{FenceProbe, FenceVerdict};
use crate::req::{Judge, Next, Progress};

/// The writer's judge: the fenced state (the first request found refused because of a
/// reservation), and the one place where a raw result is interpreted and a failed
/// write is classified as fenced or not.
#[derive(Debug)]
pub(crate) struct Fence {
    /// Offset alignment: a short transfer is continued only from an aligned point.
    align: usize,
    first: Option<(u64, usize)>,
    probe: Option<Arc<dyn FenceProbe>>,
    settle: Duration,
    /// When the latest probe that settled on "not fenced" started: it clears every
    /// `EIO` observed at least `settle` before that.
    cleared_at: Option<Instant>,
}

/// First pause between two probes while a "not fenced" answer settles; doubled each
/// time up to [`PROBE_PAUSE_MAX`].
const PROBE_PAUSE_MIN: Duration = Duration::from_millis(2);
const PROBE_PAUSE_MAX: Duration = Duration::from_millis(50);

impl Fence {
    /// A judge for requests aligned to `align` bytes, classifying write `EIO`s with
    /// `probe` (if any) and believing "not fenced" once it held for `settle`.
    pub(crate) fn new(align: usize, probe: Option<Arc<dyn FenceProbe>>, settle: Duration) -> Self {
        Self {
            align: align.max(1),
            first: None,
            probe,
            settle,
            cleared_at: None,
        }
    }

    pub(crate) fn is_fenced(&self) -> bool {
        self.first.is_some()
    }

    /// Records a conflict; the first one is kept.
    fn set(&mut self, offset: u64, len: usize, why: &'static str) {
        if self.first.is_none() {
            tracing::error!(
                offset,
                len,
                why,
                "blockio: reservation conflict: this host is fenced; refusing all further writes"
            );
            self.first = Some((offset, len));
        }
    }

    pub(crate) fn first(&self) -> Option<(u64, usize)> {
        self.first
    }

    /// Classifies the failure of a request (see the `probe` module for the rules): an
    /// `EBADE` fences; a write failing with `EIO` is a conflict when the writer is
    /// already fenced or the probe finds this host fenced within the settle time.
    /// `observed` is when the engine collected the failed completion (it finished in
    /// the kernel before that). Every failed request passes through here, from
    /// [`Judge::judge`].
    fn fail(&mut self, error: Error, observed: Instant) -> Error {
        let (offset, len, source) = match error {
            Error::ReservationConflict { offset, len } => {
                self.set(offset, len, "EBADE");
                return Error::ReservationConflict { offset, len };
            }
            Error::Io {
                op: Op::Write,
                offset,
                len,
                source,
            } if source.raw_os_error() == Some(libc::EIO) => (offset, len, source),
            other => return other,
        };
        let io = |source| Error::Io {
            op: Op::Write,
            offset,
            len,
            source,
        };
        if self.is_fenced() {
            tracing::warn!(
                offset,
                len,
                "blockio: write failed with EIO after this host was fenced; reported as a reservation conflict"
            );
            return Error::ReservationConflict { offset, len };
        }
        let Some(probe) = self.probe.clone() else {
            return io(source);
        };
        let settled = observed + self.settle;
        if self.cleared_at.is_some_and(|t| t >= settled) {
            return io(source);
        }
        let mut pause = PROBE_PAUSE_MIN;
        let mut probes = 0u32;
        loop {
            let started = Instant::now();
            probes += 1;
            match probe.probe() {
                Ok(FenceVerdict::Fenced) => {
                    self.set(
                        offset,
                        len,
                        "EIO, and the fence probe found this host fenced",
                    );
                    return Error::ReservationConflict { offset, len };
                }
                Ok(FenceVerdict::NotFenced) if started >= settled => {
                    tracing::warn!(
                        offset,
                        len,
                        probes,
                        "blockio: write failed with EIO; the fence probe says this host is not fenced"
                    );
                    self.cleared_at = Some(started);
                    return io(source);
                }
                Ok(FenceVerdict::NotFenced) => {
                    // A device may fail the victim's commands a moment before the
                    // registration disappears (nvmet does): ask again until settled.
                    std::thread::sleep(
                        pause.min(settled.saturating_duration_since(Instant::now())),
                    );
                    pause = (pause * 2).min(PROBE_PAUSE_MAX);
                }
                Err(probe) => {
                    tracing::error!(
                        offset,
                        len,
                        error = %probe,
                        "blockio: write failed with EIO and the fence probe failed: it may have been fenced"
                    );
                    return Error::FenceUnverified {
                        offset,
                        len,
                        source,
                        probe,
                    };
                }
            }
        }
    }
}

impl Judge for Fence {
    fn judge(&mut self, p: &mut Progress, res: i32, observed: Instant) -> Next {
        let error = match step(p.op, p.offset, p.len, p.done, &mut p.again, self.align, res) {
            Step::Done => return Next::Finish(Ok(())),
            Step::Continue { .. } if p.op == Op::Write && self.is_fenced() => {
                // The rest of this write would be a new submission after the fence.
                Error::ReservationConflict {
                    offset: p.offset,
                    len: p.len,
                }
            }
            Step::Continue { done } => {
                p.done = done;
                return Next::Resubmit;
            }
            Step::Fail(e) => e,
        };
        Next::Finish(Err(self.fail(error, observed)))
    }
}

/// What a raw request result (`cqe.res`, or `-errno` from a syscall) means; only
/// [`step`] asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// `n` bytes were transferred (may be fewer than asked).
    Transferred(usize),
    /// `EBADE`: the reservation refused the request. Never retried.
    Conflict,
    /// `EINTR`/`EAGAIN`: nothing happened; resubmitting is correct.
    Again(i32),
    /// Any other errno.
    Failed(i32),
}

fn classify(res: i32) -> Outcome {
    if res >= 0 {
        // Non-negative i32 always fits usize on the 64-bit targets this crate builds for.
        Outcome::Transferred(res as usize)
    } else {
        match -res {
            libc::EBADE => Outcome::Conflict,
            libc::EINTR | libc::EAGAIN => Outcome::Again(-res),
            errno => Outcome::Failed(errno),
        }
    }
}

/// How many times an `EINTR`/`EAGAIN` result is resubmitted before it is reported.
const MAX_AGAIN: u32 = 64;

/// Progress of one request after a result came back.
#[derive(Debug)]
enum Step {
    /// The request is complete.
    Done,
    /// Submit the rest: `done` bytes are transferred so far.
    Continue { done: usize },
    /// The request failed.
    Fail(Error),
}

/// Advances a request of `len` bytes at `offset` that had `done` bytes transferred and
/// `again` resubmissions, given the raw result of its latest submission. `align` is the
/// offset alignment: a short transfer is continued only from an aligned point.
fn step(
    op: Op,
    offset: u64,
    len: usize,
    done: usize,
    again: &mut u32,
    align: usize,
    res: i32,
) -> Step {
    match classify(res) {
        Outcome::Conflict => Step::Fail(Error::ReservationConflict { offset, len }),
        Outcome::Again(errno) => {
            *again += 1;
            if *again > MAX_AGAIN {
                Step::Fail(Error::Io {
                    op,
                    offset,
                    len,
                    source: io::Error::from_raw_os_error(errno),
                })
            } else {
                Step::Continue { done }
            }
        }
        Outcome::Failed(errno) => Step::Fail(Error::Io {
            op,
            offset,
            len,
            source: io::Error::from_raw_os_error(errno),
        }),
        Outcome::Transferred(n) => {
            let total = done.saturating_add(n).min(len);
            if total == len {
                Step::Done
            } else if n == 0 || total % align != 0 {
                Step::Fail(Error::Short {
                    op,
                    offset,
                    len,
                    done: total,
                })
            } else {
                Step::Continue { done: total }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ebade_is_a_reservation_conflict_and_never_retried() {
        let mut again = 0;
        match step(Op::Write, 8192, 4096, 0, &mut again, 512, -libc::EBADE) {
            Step::Fail(e) => {
                assert!(e.is_reservation_conflict());
                assert!(!e.is_retryable());
                assert!(matches!(
                    e,
                    Error::ReservationConflict {
                        offset: 8192,
                        len: 4096
                    }
                ));
            }
            other => panic!("EBADE must fail the request, got {other:?}"),
        }
        assert_eq!(again, 0);
    }

    #[test]
    fn other_errnos_are_io_errors_with_context() {
        let mut again = 0;
        let Step::Fail(e) = step(Op::Read, 0, 512, 0, &mut again, 512, -libc::EIO) else {
            panic!("EIO must fail");
        };
        assert!(!e.is_reservation_conflict());
        match e {
            Error::Io {
                op: Op::Read,
                offset: 0,
                len: 512,
                source,
            } => assert_eq!(source.raw_os_error(), Some(libc::EIO)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn eintr_and_eagain_resubmit_until_the_limit() {
        let mut again = 0;
        for _ in 0..MAX_AGAIN {
            assert!(matches!(
                step(Op::Write, 0, 512, 0, &mut again, 512, -libc::EINTR),
                Step::Continue { done: 0 }
            ));
        }
        let Step::Fail(e) = step(Op::Write, 0, 512, 0, &mut again, 512, -libc::EAGAIN) else {
            panic!("must give up after MAX_AGAIN");
        };
        assert!(e.is_retryable(), "{e:?}");
    }

    #[test]
    fn short_transfers_continue_from_aligned_points_only() {
        let mut again = 0;
        assert!(matches!(
            step(Op::Write, 0, 4096, 0, &mut again, 512, 1024),
            Step::Continue { done: 1024 }
        ));
        assert!(matches!(
            step(Op::Write, 0, 4096, 1024, &mut again, 512, 3072),
            Step::Done
        ));
        assert!(matches!(
            step(Op::Write, 0, 4096, 0, &mut again, 512, 100),
            Step::Fail(Error::Short { done: 100, .. })
        ));
        assert!(matches!(
            step(Op::Write, 0, 4096, 512, &mut again, 512, 0),
            Step::Fail(Error::Short { done: 512, .. })
        ));
    }

    fn judge_once(fence: &mut Fence, p: &mut Progress, res: i32) -> Next {
        fence.judge(p, res, Instant::now())
    }

    #[test]
    fn the_judge_continues_short_transfers_and_finishes_with_the_outcome() {
        let mut fence = Fence::new(512, None, Duration::ZERO);
        let mut p = Progress::new(Op::Write, 4096, 2048);
        assert!(matches!(
            judge_once(&mut fence, &mut p, 512),
            Next::Resubmit
        ));
        assert_eq!(p.done, 512);
        assert!(matches!(
            judge_once(&mut fence, &mut p, -libc::EINTR),
            Next::Resubmit
        ));
        assert_eq!((p.done, p.again), (512, 1));
        assert!(matches!(
            judge_once(&mut fence, &mut p, 1536),
            Next::Finish(Ok(()))
        ));
        let mut p = Progress::new(Op::Write, 0, 2048);
        assert!(matches!(
            judge_once(&mut fence, &mut p, -libc::EIO),
            Next::Finish(Err(Error::Io {
                op: Op::Write,
                offset: 0,
                len: 2048,
                ..
            }))
        ));
        assert!(!fence.is_fenced(), "EIO without a probe does not fence");
    }

    #[test]
    fn after_a_conflict_the_rest_of_a_short_write_is_a_conflict_too() {
        let mut fence = Fence::new(512, None, Duration::ZERO);
        let mut refused = Progress::new(Op::Write, 8192, 1024);
        assert!(matches!(
            judge_once(&mut fence, &mut refused, -libc::EBADE),
            Next::Finish(Err(Error::ReservationConflict {
                offset: 8192,
                len: 1024
            }))
        ));
        assert_eq!(fence.first(), Some((8192, 1024)));

        // A write in flight when the conflict arrived came back short: its rest would
        // be a new submission after the fence.
        let mut write = Progress::new(Op::Write, 0, 1024);
        assert!(matches!(
            judge_once(&mut fence, &mut write, 512),
            Next::Finish(Err(Error::ReservationConflict {
                offset: 0,
                len: 1024
            }))
        ));
        // Reads are not fenced: the device decides.
        let mut read = Progress::new(Op::Read, 0, 1024);
        assert!(matches!(
            judge_once(&mut fence, &mut read, 512),
            Next::Resubmit
        ));
        // A later write EIO is a conflict without a probe; the first conflict is kept.
        let mut eio = Progress::new(Op::Write, 4096, 512);
        assert!(matches!(
            judge_once(&mut fence, &mut eio, -libc::EIO),
            Next::Finish(Err(Error::ReservationConflict {
                offset: 4096,
                len: 512
            }))
        ));
        assert_eq!(fence.first(), Some((8192, 1024)));
    }
}
