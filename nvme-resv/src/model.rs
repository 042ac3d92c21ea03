//! An in-memory model of a namespace's reservation state, per the NVM Express Base
//! Specification 2.0c section 8.19 ("Reservations") and sections 7.2-7.5, resolved
//! where the specification leaves room the way the Linux NVMe target does
//! (`drivers/nvme/target/pr.c`, Linux 6.13+), because the hardware tests hold the
//! model to that target:
//!
//! - Registrants are kept per host identifier, in registration order; the report
//!   lists them in that order with controller ID 0xFFFF (dynamic controller model) and
//!   PTPLS 0. CPTPL is accepted and ignored (state is volatile).
//! - The generation starts at 0 and is incremented by every successful Reservation
//!   Register (register, including re-registering the same key; unregister; replace),
//!   every successful Preempt / Preempt and Abort, and every Clear; never by Acquire
//!   or Release.
//! - One registrant is the holder. For the All Registrants types (5, 6) every
//!   registrant reports RCSTS=1 and holds the reservation, and when the holder record
//!   unregisters the reservation passes to the first remaining registrant; for the
//!   other types the reservation is released when its holder unregisters.
//! - Register when already registered succeeds only with the same key (CRKEY and
//!   IEKEY are not looked at). Unregister and Replace need the host to be registered
//!   and CRKEY to match unless IEKEY is set.
//! - Acquire, Preempt and Release need the host registered with CRKEY; IEKEY set or
//!   an RTYPE outside 1..=6 is Invalid Field for Acquire, IEKEY is Invalid Field for
//!   Release. Acquire while another host holds is a conflict, re-acquiring the same
//!   type is a no-op, a different type a conflict.
//! - Preempt: with no reservation, removes the registrants with PRKEY (conflict if
//!   none). With an All Registrants reservation, PRKEY 0 makes the caller the holder
//!   with RTYPE and removes every other registrant; another PRKEY removes its
//!   registrants. The holder preempting changes the type. PRKEY equal to the holder's
//!   key moves the reservation to the caller with RTYPE and removes the registrants
//!   with that key; another non-zero PRKEY removes its registrants and leaves the
//!   reservation; PRKEY 0 is Invalid Field.
//! - Release by a registrant that does not hold is a no-op success; by the holder
//!   with another type a conflict. Clear removes everything.
//! - Errors carry DNR as the target sets it.
//!
//! Zero keys are refused before the command is "sent" with [`Error::ZeroKey`], exactly
//! as [`crate::Namespace`] does.
//!
//! Fault injection for tests of callers: [`Namespace::fail_next`].

use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Operation, Result};
use crate::report::{RegisteredController, ReservationStatus};
use crate::status::NvmeStatus;
use crate::{
    Access, Acquire, AcquireAction, HostId, Key, Register, RegisterAction, Release, ReleaseAction,
    ReservationType, Reservations,
};

/// The namespace ID the model reports in errors.
pub const MODEL_NSID: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Registrant {
    hostid: HostId,
    rkey: Key,
}

#[derive(Debug, Default)]
struct State {
    generation: u32,
    registrants: Vec<Registrant>,
    /// The holder record's host and the reservation type.
    holder: Option<(HostId, ReservationType)>,
    faults: Vec<(Operation, NvmeStatus)>,
}

fn conflict() -> NvmeStatus {
    NvmeStatus::RESERVATION_CONFLICT.with_dnr()
}

fn invalid_field() -> NvmeStatus {
    NvmeStatus::INVALID_FIELD.with_dnr()
}

impl State {
    fn find(&self, hostid: HostId) -> Option<usize> {
        self.registrants.iter().position(|r| r.hostid == hostid)
    }

    fn take_fault(&mut self, op: Operation) -> Option<NvmeStatus> {
        let i = self.faults.iter().position(|(o, _)| *o == op)?;
        Some(self.faults.remove(i).1)
    }

    /// Removes the registrant of `hostid`; the reservation follows the rules for a
    /// departing holder.
    fn unregister_one(&mut self, hostid: HostId) {
        let Some(i) = self.find(hostid) else { return };
        self.registrants.remove(i);
        if let Some((h, rtype)) = self.holder
            && h == hostid
        {
            self.holder = if rtype.is_all_registrants() {
                self.registrants.first().map(|r| (r.hostid, rtype))
            } else {
                None
            };
        }
    }

    /// Removes every registrant whose key is `prkey` (excluding `except`); whether any
    /// was removed.
    fn unregister_by_key(&mut self, prkey: Key, except: Option<HostId>) -> bool {
        let victims: Vec<HostId> = self
            .registrants
            .iter()
            .filter(|r| r.rkey == prkey && Some(r.hostid) != except)
            .map(|r| r.hostid)
            .collect();
        for v in &victims {
            self.unregister_one(*v);
        }
        !victims.is_empty()
    }

    fn register(&mut self, me: HostId, c: &Register) -> std::result::Result<(), NvmeStatus> {
        let mine = self.find(me);
        match c.rrega {
            RegisterAction::Register => match mine {
                Some(i) if self.registrants[i].rkey != c.nrkey => return Err(conflict()),
                Some(_) => {}
                None => self.registrants.push(Registrant {
                    hostid: me,
                    rkey: c.nrkey,
                }),
            },
            RegisterAction::Unregister => match mine {
                Some(i) if c.iekey || self.registrants[i].rkey == c.crkey => {
                    self.unregister_one(me)
                }
                _ => return Err(conflict()),
            },
            RegisterAction::Replace => match mine {
                Some(i) if c.iekey || self.registrants[i].rkey == c.crkey => {
                    self.registrants[i].rkey = c.nrkey
                }
                _ => return Err(conflict()),
            },
        }
        self.generation = self.generation.wrapping_add(1);
        Ok(())
    }

    fn registered_with(&self, me: HostId, crkey: Key) -> bool {
        self.registrants
            .iter()
            .any(|r| r.hostid == me && r.rkey == crkey)
    }

    fn acquire(&mut self, me: HostId, c: &Acquire) -> std::result::Result<(), NvmeStatus> {
        if c.iekey || !c.rtype.is_valid() {
            return Err(invalid_field());
        }
        if !self.registered_with(me, c.crkey) {
            return Err(conflict());
        }
        match c.racqa {
            AcquireAction::Acquire => match self.holder {
                Some((h, t)) if h == me && t == c.rtype => Ok(()),
                Some(_) => Err(conflict()),
                None => {
                    self.holder = Some((me, c.rtype));
                    Ok(())
                }
            },
            AcquireAction::Preempt | AcquireAction::PreemptAndAbort => {
                self.preempt(me, c.rtype, c.prkey)?;
                self.generation = self.generation.wrapping_add(1);
                Ok(())
            }
        }
    }

    fn preempt(
        &mut self,
        me: HostId,
        rtype: ReservationType,
        prkey: Key,
    ) -> std::result::Result<(), NvmeStatus> {
        let by_key = |s: &mut Self| {
            if s.unregister_by_key(prkey, None) {
                Ok(())
            } else {
                Err(conflict())
            }
        };
        let Some((holder, htype)) = self.holder else {
            return by_key(self);
        };
        if htype.is_all_registrants() {
            if prkey.0 == 0 {
                self.holder = Some((me, rtype));
                let others: Vec<HostId> = self
                    .registrants
                    .iter()
                    .map(|r| r.hostid)
                    .filter(|h| *h != me)
                    .collect();
                for h in others {
                    self.unregister_one(h);
                }
                return Ok(());
            }
            return by_key(self);
        }
        if holder == me {
            self.holder = Some((me, rtype));
            return Ok(());
        }
        let holder_key = self.find(holder).map(|i| self.registrants[i].rkey);
        if holder_key == Some(prkey) {
            self.holder = Some((me, rtype));
            self.unregister_by_key(prkey, Some(me));
            return Ok(());
        }
        if prkey.0 != 0 {
            return by_key(self);
        }
        Err(invalid_field())
    }

    fn release(&mut self, me: HostId, c: &Release) -> std::result::Result<(), NvmeStatus> {
        if c.iekey {
            return Err(invalid_field());
        }
        if !self.registered_with(me, c.crkey) {
            return Err(conflict());
        }
        match c.rrela {
            ReleaseAction::Release => match self.holder {
                Some((h, t)) if h == me => {
                    if t != c.rtype {
                        return Err(conflict());
                    }
                    self.holder = None;
                    Ok(())
                }
                _ => Ok(()),
            },
            ReleaseAction::Clear => {
                self.holder = None;
                self.registrants.clear();
                self.generation = self.generation.wrapping_add(1);
                Ok(())
            }
        }
    }

    fn report(&self) -> ReservationStatus {
        let rtype = self.holder.map_or(ReservationType::NONE, |(_, t)| t);
        let registrants: Vec<RegisteredController> = self
            .registrants
            .iter()
            .map(|r| {
                let holds =
                    rtype.is_all_registrants() || self.holder.is_some_and(|(h, _)| h == r.hostid);
                RegisteredController {
                    cntlid: 0xffff,
                    rcsts: u8::from(holds),
                    hostid: r.hostid,
                    rkey: r.rkey,
                }
            })
            .collect();
        ReservationStatus {
            generation: self.generation,
            rtype,
            regctl: registrants.len() as u16,
            ptpls: false,
            registrants,
            extended: true,
        }
    }

    /// The access matrix (Base 2.0c 8.19, "Command Behavior in the Presence of a
    /// Reservation").
    fn allows(&self, me: HostId, access: Access) -> bool {
        let Some((holder, rtype)) = self.holder else {
            return true;
        };
        if holder == me {
            return true;
        }
        let registered = self.find(me).is_some();
        match rtype {
            ReservationType::WRITE_EXCLUSIVE => access == Access::Read,
            ReservationType::EXCLUSIVE_ACCESS => false,
            ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY
            | ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS => {
                access == Access::Read || registered
            }
            ReservationType::EXCLUSIVE_ACCESS_REGISTRANTS_ONLY
            | ReservationType::EXCLUSIVE_ACCESS_ALL_REGISTRANTS => registered,
            // Never stored: acquire refuses other types.
            _ => true,
        }
    }
}

/// A modelled namespace shared by any number of hosts. Cheap to clone: clones share
/// the same state.
#[derive(Debug, Clone, Default)]
pub struct Namespace {
    state: Arc<Mutex<State>>,
}

impl Namespace {
    /// A namespace with no registrant, no reservation, generation 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// A host with identifier `hostid` attached to this namespace. Hosts with the same
    /// identifier are the same host.
    pub fn host(&self, hostid: HostId) -> Host {
        Host {
            ns: self.clone(),
            hostid,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent state (every mutation is
        // complete before it can panic), so poisoning is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fault injection: the next `op` (one of Register, Acquire, Release, Report; from
    /// any host) fails with [`Error::Device`] carrying `status`, without changing the
    /// state. Calls queue up: two calls make the next two such commands fail.
    pub fn fail_next(&self, op: Operation, status: NvmeStatus) {
        self.lock().faults.push((op, status));
    }

    /// Drops every pending injected fault.
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// The state as an extended report, bypassing fault injection.
    pub fn snapshot(&self) -> ReservationStatus {
        self.lock().report()
    }
}

/// One host's handle on a [`Namespace`].
#[derive(Debug, Clone)]
pub struct Host {
    ns: Namespace,
    hostid: HostId,
}

impl Host {
    /// This host's identifier.
    pub fn hostid(&self) -> HostId {
        self.hostid
    }

    /// The namespace this host is attached to.
    pub fn namespace(&self) -> &Namespace {
        &self.ns
    }

    /// Whether a read or write by this host would be allowed now: `Err(e)` with
    /// `e.is_reservation_conflict()` when the reservation denies it.
    pub fn check(&self, access: Access) -> Result<()> {
        if self.ns.lock().allows(self.hostid, access) {
            Ok(())
        } else {
            Err(Error::Device {
                op: match access {
                    Access::Read => Operation::Read,
                    Access::Write => Operation::Write,
                },
                nsid: MODEL_NSID,
                status: conflict(),
            })
        }
    }

    fn run(
        &self,
        op: Operation,
        f: impl FnOnce(&mut State) -> std::result::Result<(), NvmeStatus>,
    ) -> Result<()> {
        let mut st = self.ns.lock();
        let res = match st.take_fault(op) {
            Some(status) => Err(status),
            None => f(&mut st),
        };
        res.map_err(|status| Error::Device {
            op,
            nsid: MODEL_NSID,
            status,
        })
    }
}

impl Reservations for Host {
    fn register(&self, cmd: &Register) -> Result<()> {
        cmd.validate()?;
        self.run(Operation::Register, |s| s.register(self.hostid, cmd))
    }

    fn acquire(&self, cmd: &Acquire) -> Result<()> {
        self.run(Operation::Acquire, |s| s.acquire(self.hostid, cmd))
    }

    fn release(&self, cmd: &Release) -> Result<()> {
        self.run(Operation::Release, |s| s.release(self.hostid, cmd))
    }

    fn report(&self) -> Result<ReservationStatus> {
        let mut st = self.ns.lock();
        match st.take_fault(Operation::Report) {
            Some(status) => Err(Error::Device {
                op: Operation::Report,
                nsid: MODEL_NSID,
                status,
            }),
            None => Ok(st.report()),
        }
    }
}
