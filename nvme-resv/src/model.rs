//! An in-memory model of a namespace's reservation state, per the NVM Express Base
//! Specification 2.0c section 8.19 ("Reservations") and sections 7.2-7.5, resolved
//! where the specification leaves room the way the Linux NVMe target does
//! (`drivers/nvme/target/pr.c`, Linux 6.13+), because the hardware tests hold the
//! model to that target:
//!
//! - Registrants are kept per host identifier, in registration order; the report
//!   lists them in that order with controller ID 0xFFFF (dynamic controller model) and
//!   PTPLS 0. CPTPL is accepted and ignored (state is volatile), unless the model is
//!   made PTPL-capable ([`Namespace::with_ptpl_capable`], RESCAP bit 0 of a device that
//!   has it): then a successful Register with CPTPL 11b sets the Persist Through Power
//!   Loss state, 10b clears it, and the report's PTPLS shows it.
//! - A power loss or target restart ([`Namespace::lose_state`]): without the PTPL
//!   state every registrant and the reservation are gone and the generation starts
//!   again at 0 (what nvmet does when its namespace is disabled and enabled again:
//!   every host may then write); with it, nothing changes (Base 2.0c 8.19.9,
//!   "Reservation Persistence").
//! - The generation starts at 0 and is incremented by every successful Reservation
//!   Register (register, including re-registering the same key; unregister; replace),
//!   every successful Preempt / Preempt and Abort, and every Clear; never by Acquire
//!   or Release.
//! - One registrant is the holder. For the All Registrants types (5, 6) every
//!   registrant reports RCSTS=1 and holds the reservation, and when the holder record
//!   unregisters the reservation passes to the first remaining registrant; for the
//!   other types the reservation is released when its holder unregisters.
//! - Register when already registered succeeds only with the same key (CRKEY and
//!   IEKEY are not looked at). Unregister and Replace need CRKEY to match unless IEKEY
//!   is set; Unregister from a host that is not registered is a conflict, and so is
//!   Replace without IEKEY, but Replace with IEKEY from an unregistered host registers
//!   NRKEY (what Linux 7.3's nvmet does, checked by hwtests; the pr.c of 6.13 answered
//!   a conflict).
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
use crate::identity::NamespaceIdentity;
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
    identity: NamespaceIdentity,
    /// RESCAP bit 0: the device can persist through a power loss.
    ptpl_capable: bool,
    /// The Persist Through Power Loss state (Get Features 83h, report PTPLS).
    ptpls: bool,
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
        self.register_keys(me, c)?;
        if self.ptpl_capable {
            match c.cptpl {
                crate::Cptpl::Persist => self.ptpls = true,
                crate::Cptpl::Clear => self.ptpls = false,
                _ => {}
            }
        }
        Ok(())
    }

    /// A power loss or target restart: without the PTPL state, every registrant and the
    /// reservation are lost. Whether the state survived.
    fn lose_state(&mut self) -> bool {
        if self.ptpls {
            return true;
        }
        self.registrants.clear();
        self.holder = None;
        self.generation = 0;
        false
    }

    fn register_keys(&mut self, me: HostId, c: &Register) -> std::result::Result<(), NvmeStatus> {
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
                // Observed on Linux 7.3's nvmet: with IEKEY, an unregistered host's
                // Replace registers NRKEY.
                None if c.iekey => self.registrants.push(Registrant {
                    hostid: me,
                    rkey: c.nrkey,
                }),
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
            ptpls: self.ptpls,
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

    /// Sets what [`Reservations::identity`] answers for every host (default: all zero,
    /// empty subsystem NQN: no identity).
    pub fn set_identity(&self, identity: NamespaceIdentity) {
        self.lock().identity = identity;
    }

    /// A namespace whose device reports Persist Through Power Loss (RESCAP bit 0): a
    /// Register with CPTPL 11b turns persistence on, and [`lose_state`](Self::lose_state)
    /// then keeps every registrant and the reservation. Persistence starts off.
    pub fn with_ptpl_capable() -> Self {
        let ns = Self::default();
        ns.lock().ptpl_capable = true;
        ns
    }

    /// Whether the device reports Persist Through Power Loss (RESCAP bit 0).
    pub fn ptpl_capable(&self) -> bool {
        self.lock().ptpl_capable
    }

    /// The Reservation Persistence feature now (Get Features 83h): whether a power loss
    /// keeps the registrants and the reservation. Always `false` for a namespace that
    /// is not [PTPL-capable](Self::with_ptpl_capable).
    pub fn ptpl_state(&self) -> bool {
        self.lock().ptpls
    }

    /// A power loss, a target restart or an NVMe-oF target fail-over: without the PTPL
    /// state every registrant and the reservation vanish (every host may write again)
    /// and the generation restarts at 0; with it, nothing changes. Returns whether the
    /// reservation state survived.
    pub fn lose_state(&self) -> bool {
        self.lock().lose_state()
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

    fn identity(&self) -> Result<NamespaceIdentity> {
        Ok(self.ns.lock().identity.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KA: Key = Key(0xa);
    const KB: Key = Key(0xb);
    const KC: Key = Key(0xc);

    fn hosts() -> (Namespace, Host, Host, Host) {
        hosts_on(Namespace::new())
    }

    fn hosts_on(ns: Namespace) -> (Namespace, Host, Host, Host) {
        let (a, b, c) = (
            ns.host(HostId([0xa; 16])),
            ns.host(HostId([0xb; 16])),
            ns.host(HostId([0xc; 16])),
        );
        (ns, a, b, c)
    }

    fn status_of(r: Result<()>) -> Option<NvmeStatus> {
        match r {
            Ok(()) => None,
            Err(e) => Some(e.status().unwrap_or_else(|| panic!("not a status: {e}"))),
        }
    }

    fn is_conflict(r: Result<()>) -> bool {
        status_of(r).is_some_and(|s| s.is_reservation_conflict() && s.dnr())
    }

    fn is_invalid_field(r: Result<()>) -> bool {
        status_of(r).is_some_and(|s| s.same_code(NvmeStatus::INVALID_FIELD) && s.dnr())
    }

    fn allowed(h: &Host, access: Access) -> bool {
        match h.check(access) {
            Ok(()) => true,
            Err(e) if e.is_reservation_conflict() => false,
            Err(e) => panic!("{e}"),
        }
    }

    /// Base 2.0c 8.19, "Command Behavior in the Presence of a Reservation": per type,
    /// (read, write) allowed for the holder, a registrant and a non-registrant.
    #[test]
    fn access_matrix_for_all_six_types() {
        type Row = (ReservationType, [(bool, bool); 3]);
        const Y: bool = true;
        const N: bool = false;
        let table: [Row; 6] = [
            (ReservationType::WRITE_EXCLUSIVE, [(Y, Y), (Y, N), (Y, N)]),
            (ReservationType::EXCLUSIVE_ACCESS, [(Y, Y), (N, N), (N, N)]),
            (
                ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY,
                [(Y, Y), (Y, Y), (Y, N)],
            ),
            (
                ReservationType::EXCLUSIVE_ACCESS_REGISTRANTS_ONLY,
                [(Y, Y), (Y, Y), (N, N)],
            ),
            (
                ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS,
                [(Y, Y), (Y, Y), (Y, N)],
            ),
            (
                ReservationType::EXCLUSIVE_ACCESS_ALL_REGISTRANTS,
                [(Y, Y), (Y, Y), (N, N)],
            ),
        ];
        for (rtype, want) in table {
            let (_ns, a, b, c) = hosts();
            for h in [&a, &b, &c] {
                assert!(
                    allowed(h, Access::Read) && allowed(h, Access::Write),
                    "no reservation"
                );
            }
            a.register(&Register::register(KA)).unwrap();
            b.register(&Register::register(KB)).unwrap();
            a.acquire(&Acquire::acquire(KA, rtype)).unwrap();
            let got = [&a, &b, &c].map(|h| (allowed(h, Access::Read), allowed(h, Access::Write)));
            assert_eq!(got, want, "{rtype}: holder, registrant, non-registrant");
            // The non-registrant registering gets the registrant row.
            c.register(&Register::register(KC)).unwrap();
            assert_eq!(
                (allowed(&c, Access::Read), allowed(&c, Access::Write)),
                want[1],
                "{rtype}: C after registering"
            );
            let report = a.report().unwrap();
            assert_eq!(report.rtype, rtype);
            let rcsts: Vec<u8> = report.registrants.iter().map(|r| r.rcsts).collect();
            if rtype.is_all_registrants() {
                assert_eq!(rcsts, [1, 1, 1], "{rtype}: every registrant holds");
            } else {
                assert_eq!(rcsts, [1, 0, 0], "{rtype}");
            }
        }
    }

    #[test]
    fn register_replace_unregister_with_and_without_iekey() {
        let (ns, a, b, _) = hosts();
        assert!(matches!(
            a.register(&Register::register(Key(0))),
            Err(Error::ZeroKey { .. })
        ));
        assert_eq!(
            ns.snapshot().generation,
            0,
            "refused before reaching the device"
        );
        a.register(&Register::register(KA)).unwrap();
        // Same key again: success, and counted.
        a.register(&Register::register(KA)).unwrap();
        assert_eq!(ns.snapshot().generation, 2);
        assert!(is_conflict(a.register(&Register::register(KB))));
        // Replace needs CRKEY unless IEKEY.
        assert!(is_conflict(a.register(&Register::replace(KB, KC))));
        a.register(&Register::replace(KA, KC)).unwrap();
        a.register(&Register::replace(Key(0x999), KA).with_iekey(true))
            .unwrap();
        // Unregister by a host that is not registered: conflict even with IEKEY.
        assert!(is_conflict(
            b.register(&Register::unregister(KB).with_iekey(true))
        ));
        // Replace by a host that is not registered: conflict without IEKEY; with IEKEY
        // it registers NRKEY (nvmet on Linux 7.3).
        assert!(is_conflict(b.register(&Register::replace(KB, KC))));
        let g = ns.snapshot().generation;
        b.register(&Register::replace(KB, KC).with_iekey(true))
            .unwrap();
        assert!(ns.snapshot().is_registered(KC));
        assert_eq!(ns.snapshot().generation, g + 1);
        b.register(&Register::unregister(KC)).unwrap();
        assert!(is_conflict(a.register(&Register::unregister(KB))));
        a.register(&Register::unregister(Key(0)).with_iekey(true))
            .unwrap();
        let st = ns.snapshot();
        assert!(st.registrants.is_empty());
        assert_eq!(st.generation, 7, "register x2, replace x3, unregister x2");
    }

    #[test]
    fn acquire_rules() {
        let (ns, a, b, c) = hosts();
        a.register(&Register::register(KA)).unwrap();
        b.register(&Register::register(KB)).unwrap();
        let we = ReservationType::WRITE_EXCLUSIVE;
        assert!(is_invalid_field(
            a.acquire(&Acquire::acquire(KA, we).with_iekey(true))
        ));
        assert!(is_invalid_field(
            a.acquire(&Acquire::acquire(KA, ReservationType(0)))
        ));
        assert!(is_invalid_field(
            a.acquire(&Acquire::acquire(KA, ReservationType(7)))
        ));
        assert!(
            is_conflict(c.acquire(&Acquire::acquire(KC, we))),
            "not registered"
        );
        assert!(
            is_conflict(a.acquire(&Acquire::acquire(KB, we))),
            "wrong CRKEY"
        );
        let g = ns.snapshot().generation;
        a.acquire(&Acquire::acquire(KA, we)).unwrap();
        a.acquire(&Acquire::acquire(KA, we)).unwrap();
        assert!(is_conflict(a.acquire(&Acquire::acquire(
            KA,
            ReservationType::EXCLUSIVE_ACCESS
        ))));
        assert!(is_conflict(b.acquire(&Acquire::acquire(KB, we))));
        assert_eq!(ns.snapshot().generation, g, "acquire does not count");
        assert_eq!(ns.snapshot().holder().map(|h| h.rkey), Some(KA));
    }

    #[test]
    fn acquire_all_registrants_held_by_another_registrant_is_a_conflict() {
        // nvmet keeps one holder record even for the All Registrants types.
        let (_ns, a, b, _) = hosts();
        let wear = ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS;
        a.register(&Register::register(KA)).unwrap();
        b.register(&Register::register(KB)).unwrap();
        a.acquire(&Acquire::acquire(KA, wear)).unwrap();
        assert!(is_conflict(b.acquire(&Acquire::acquire(KB, wear))));
    }

    #[test]
    fn preempting_the_holder_moves_the_reservation_and_removes_it() {
        for rtype in ReservationType::ALL
            .into_iter()
            .filter(|t| !t.is_all_registrants())
        {
            let (ns, a, b, c) = hosts();
            a.register(&Register::register(KA)).unwrap();
            b.register(&Register::register(KB)).unwrap();
            c.register(&Register::register(KC)).unwrap();
            a.acquire(&Acquire::acquire(KA, rtype)).unwrap();
            let g = ns.snapshot().generation;
            let new_type = ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY;
            b.acquire(&Acquire::preempt(KB, KA, new_type)).unwrap();
            let st = ns.snapshot();
            assert_eq!(st.generation, g + 1, "{rtype}");
            assert_eq!(st.rtype, new_type);
            assert_eq!(st.holder().map(|h| h.rkey), Some(KB));
            assert!(!st.is_registered(KA) && st.is_registered(KC));
            assert!(
                !allowed(&a, Access::Write),
                "{rtype}: preempted host fenced"
            );
            assert!(allowed(&c, Access::Write));
            // The preempted host can no longer act with its key.
            assert!(is_conflict(a.acquire(&Acquire::acquire(KA, new_type))));
        }
    }

    #[test]
    fn preempting_a_non_holder_leaves_the_reservation() {
        let (ns, a, b, c) = hosts();
        let earo = ReservationType::EXCLUSIVE_ACCESS_REGISTRANTS_ONLY;
        for (h, k) in [(&a, KA), (&b, KB), (&c, KC)] {
            h.register(&Register::register(k)).unwrap();
        }
        a.acquire(&Acquire::acquire(KA, earo)).unwrap();
        b.acquire(&Acquire::preempt_and_abort(
            KB,
            KC,
            ReservationType::WRITE_EXCLUSIVE,
        ))
        .unwrap();
        let st = ns.snapshot();
        assert_eq!(st.rtype, earo, "type unchanged");
        assert_eq!(st.holder().map(|h| h.rkey), Some(KA));
        assert!(!st.is_registered(KC) && st.is_registered(KB));
        assert!(!allowed(&c, Access::Read));
        // PRKEY 0 with a holder-based reservation held by another: Invalid Field.
        assert!(is_invalid_field(b.acquire(&Acquire::preempt(
            KB,
            Key(0),
            earo
        ))));
        // A PRKEY nobody has: conflict.
        assert!(is_conflict(b.acquire(&Acquire::preempt(
            KB,
            Key(0x77),
            earo
        ))));
        assert_eq!(
            st.generation,
            ns.snapshot().generation,
            "failures do not count"
        );
    }

    #[test]
    fn holder_preempting_itself_changes_the_type() {
        let (ns, a, b, _) = hosts();
        a.register(&Register::register(KA)).unwrap();
        b.register(&Register::register(KB)).unwrap();
        a.acquire(&Acquire::acquire(KA, ReservationType::WRITE_EXCLUSIVE))
            .unwrap();
        a.acquire(&Acquire::preempt(KA, KB, ReservationType::EXCLUSIVE_ACCESS))
            .unwrap();
        let st = ns.snapshot();
        assert_eq!(st.rtype, ReservationType::EXCLUSIVE_ACCESS);
        assert!(
            st.is_registered(KB),
            "nvmet does not remove PRKEY's registrants here"
        );
        assert_eq!(st.generation, 3, "two registers, one preempt");
    }

    #[test]
    fn preempt_without_reservation_removes_by_key() {
        let (ns, a, b, c) = hosts();
        a.register(&Register::register(KA)).unwrap();
        b.register(&Register::register(KB)).unwrap();
        c.register(&Register::register(KB)).unwrap();
        a.acquire(&Acquire::preempt(KA, KB, ReservationType::WRITE_EXCLUSIVE))
            .unwrap();
        let st = ns.snapshot();
        assert_eq!(st.rtype, ReservationType::NONE, "no reservation is created");
        assert_eq!(st.registrants.len(), 1);
        assert!(is_conflict(a.acquire(&Acquire::preempt(
            KA,
            Key(0),
            ReservationType::WRITE_EXCLUSIVE
        ))));
    }

    /// Issue 26, hole 1: after the holder releases (both hosts still registered), a
    /// preempt only unregisters the victim's key and the victim still writes; the
    /// evidence rule refuses that report. Acquiring first, then preempting, cuts the
    /// victim off, and the rule confirms it.
    #[test]
    fn preempt_after_a_release_cuts_nothing_and_is_not_evidence() {
        use crate::report::{NotCutOff, fence_evidence};
        let rtype = ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS;
        let (ns, a, b, _) = hosts();
        a.register(&Register::register(KA)).unwrap();
        b.register(&Register::register(KB)).unwrap();
        b.acquire(&Acquire::acquire(KB, rtype)).unwrap();
        b.release(&Release::release(KB, rtype)).unwrap();
        assert_eq!(ns.snapshot().rtype, ReservationType::NONE);
        a.acquire(&Acquire::preempt_and_abort(KA, KB, rtype))
            .unwrap();
        let st = ns.snapshot();
        // The old test (key gone, ours present) would have confirmed this fence...
        assert!(!st.is_registered(KB) && st.is_registered(KA));
        // ...while the victim still writes.
        assert!(allowed(&b, Access::Write));
        assert_eq!(
            fence_evidence(&st, KB, KA),
            Err(NotCutOff::NoReservation(KB))
        );

        // The fix: with no reservation held, acquire it (we are a registrant), then
        // preempt, then verify.
        let (ns, a, b, _) = hosts();
        a.register(&Register::register(KA)).unwrap();
        b.register(&Register::register(KB)).unwrap();
        b.acquire(&Acquire::acquire(KB, rtype)).unwrap();
        b.release(&Release::release(KB, rtype)).unwrap();
        a.acquire(&Acquire::acquire(KA, rtype)).unwrap();
        a.acquire(&Acquire::preempt_and_abort(KA, KB, rtype))
            .unwrap();
        let st = ns.snapshot();
        assert!(fence_evidence(&st, KB, KA).is_ok(), "{st:?}");
        assert!(!allowed(&b, Access::Write));
    }

    #[test]
    fn all_registrants_preempt_with_zero_prkey_takes_everything() {
        for rtype in [
            ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS,
            ReservationType::EXCLUSIVE_ACCESS_ALL_REGISTRANTS,
        ] {
            let (ns, a, b, c) = hosts();
            for (h, k) in [(&a, KA), (&b, KB), (&c, KC)] {
                h.register(&Register::register(k)).unwrap();
            }
            a.acquire(&Acquire::acquire(KA, rtype)).unwrap();
            b.acquire(&Acquire::preempt(
                KB,
                Key(0),
                ReservationType::WRITE_EXCLUSIVE,
            ))
            .unwrap();
            let st = ns.snapshot();
            assert_eq!(st.rtype, ReservationType::WRITE_EXCLUSIVE);
            assert_eq!(st.registrants.len(), 1);
            assert_eq!(st.holder().map(|h| h.rkey), Some(KB));
            assert!(!allowed(&a, Access::Write) && !allowed(&c, Access::Write));
        }
    }

    #[test]
    fn all_registrants_preempt_by_key_keeps_the_reservation() {
        let (ns, a, b, c) = hosts();
        let eaar = ReservationType::EXCLUSIVE_ACCESS_ALL_REGISTRANTS;
        for (h, k) in [(&a, KA), (&b, KB), (&c, KC)] {
            h.register(&Register::register(k)).unwrap();
        }
        a.acquire(&Acquire::acquire(KA, eaar)).unwrap();
        // C preempts A (the holder record): the reservation stays All Registrants and
        // passes on; A is out.
        c.acquire(&Acquire::preempt(KC, KA, ReservationType::WRITE_EXCLUSIVE))
            .unwrap();
        let st = ns.snapshot();
        assert_eq!(st.rtype, eaar);
        assert_eq!(
            st.registrants.iter().map(|r| r.rkey).collect::<Vec<_>>(),
            [KB, KC]
        );
        assert!(st.registrants.iter().all(|r| r.rcsts == 1));
        assert!(!allowed(&a, Access::Read) && allowed(&b, Access::Write));
    }

    #[test]
    fn holder_unregistering() {
        // Holder-based types: the reservation is released.
        let (ns, a, b, _) = hosts();
        a.register(&Register::register(KA)).unwrap();
        b.register(&Register::register(KB)).unwrap();
        a.acquire(&Acquire::acquire(KA, ReservationType::EXCLUSIVE_ACCESS))
            .unwrap();
        a.register(&Register::unregister(KA)).unwrap();
        assert_eq!(ns.snapshot().rtype, ReservationType::NONE);
        // All Registrants: it passes to the next registrant, and ends with the last.
        let wear = ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS;
        a.register(&Register::register(KA)).unwrap();
        b.acquire(&Acquire::acquire(KB, wear)).unwrap();
        b.register(&Register::unregister(KB)).unwrap();
        let st = ns.snapshot();
        assert_eq!(st.rtype, wear);
        assert_eq!(st.holder().map(|h| h.rkey), Some(KA));
        a.release(&Release::release(KA, wear)).unwrap();
        assert_eq!(ns.snapshot().rtype, ReservationType::NONE);
    }

    #[test]
    fn release_and_clear() {
        let (ns, a, b, c) = hosts();
        let we = ReservationType::WRITE_EXCLUSIVE;
        a.register(&Register::register(KA)).unwrap();
        b.register(&Register::register(KB)).unwrap();
        a.acquire(&Acquire::acquire(KA, we)).unwrap();
        let g = ns.snapshot().generation;
        assert!(is_invalid_field(
            a.release(&Release::release(KA, we).with_iekey(true))
        ));
        assert!(
            is_conflict(c.release(&Release::release(KC, we))),
            "not registered"
        );
        assert!(
            is_conflict(a.release(&Release::release(KB, we))),
            "wrong key"
        );
        b.release(&Release::release(KB, we)).unwrap();
        assert_eq!(ns.snapshot().rtype, we, "a non-holder's release is a no-op");
        assert!(is_conflict(a.release(&Release::release(
            KA,
            ReservationType::EXCLUSIVE_ACCESS
        ))));
        a.release(&Release::release(KA, we)).unwrap();
        assert_eq!(ns.snapshot().rtype, ReservationType::NONE);
        assert_eq!(ns.snapshot().generation, g, "release does not count");
        a.acquire(&Acquire::acquire(KA, we)).unwrap();
        b.release(&Release::clear(KB)).unwrap();
        let st = ns.snapshot();
        assert!(st.registrants.is_empty() && st.rtype == ReservationType::NONE);
        assert_eq!(st.generation, g + 1);
    }

    /// Generation per step (nvmet's rules; see the module docs).
    #[test]
    fn generation_table() {
        enum C {
            Reg(Register),
            Acq(Acquire),
            Rel(Release),
        }
        let (ns, a, b, _) = hosts();
        let we = ReservationType::WRITE_EXCLUSIVE;
        // (what, host, command, succeeds, generation delta)
        let steps = [
            ("A register", &a, C::Reg(Register::register(KA)), true, 1),
            ("B register", &b, C::Reg(Register::register(KB)), true, 1),
            ("A acquire", &a, C::Acq(Acquire::acquire(KA, we)), true, 0),
            ("B replace", &b, C::Reg(Register::replace(KB, KC)), true, 1),
            (
                "B replace, stale key",
                &b,
                C::Reg(Register::replace(KB, KC)),
                false,
                0,
            ),
            ("A release", &a, C::Rel(Release::release(KA, we)), true, 0),
            ("A acquire", &a, C::Acq(Acquire::acquire(KA, we)), true, 0),
            (
                "B preempt A",
                &b,
                C::Acq(Acquire::preempt(KC, KA, we)),
                true,
                1,
            ),
            (
                "A register again",
                &a,
                C::Reg(Register::register(KA)),
                true,
                1,
            ),
            (
                "A acquire, held",
                &a,
                C::Acq(Acquire::acquire(KA, we)),
                false,
                0,
            ),
            (
                "A preempt-and-abort B",
                &a,
                C::Acq(Acquire::preempt_and_abort(KA, KC, we)),
                true,
                1,
            ),
            ("A clear", &a, C::Rel(Release::clear(KA)), true, 1),
        ];
        for (what, h, cmd, ok, delta) in steps {
            let before = ns.snapshot().generation;
            let r = match &cmd {
                C::Reg(c) => h.register(c),
                C::Acq(c) => h.acquire(c),
                C::Rel(c) => h.release(c),
            };
            assert_eq!(r.is_ok(), ok, "{what}: {r:?}");
            assert_eq!(ns.snapshot().generation - before, delta, "{what}");
        }
        assert_eq!(ns.snapshot().generation, 7);
    }

    /// A fenced state: A holds, B was preempted (a fence), C never registered.
    fn fenced_state(ns: &Namespace) -> (Host, Host, Host) {
        let (_, a, b, c) = hosts_on(ns.clone());
        let wear = ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS;
        a.register(&Register::register(KA).with_cptpl(crate::Cptpl::Persist))
            .unwrap();
        b.register(&Register::register(KB)).unwrap();
        a.acquire(&Acquire::acquire(KA, wear)).unwrap();
        a.acquire(&Acquire::preempt_and_abort(KA, KB, wear))
            .unwrap();
        assert!(!allowed(&b, Access::Write), "B is fenced");
        (a, b, c)
    }

    #[test]
    fn state_loss_without_ptpl_reopens_every_host() {
        // The kernel target: CPTPL accepted and ignored, nothing persists.
        let ns = Namespace::new();
        let (a, b, c) = fenced_state(&ns);
        assert!(!ns.ptpl_capable() && !ns.ptpl_state() && !ns.snapshot().ptpls);
        assert!(!ns.lose_state(), "nothing survives");
        let st = ns.snapshot();
        assert!(st.registrants.is_empty() && st.rtype == ReservationType::NONE);
        assert_eq!(st.generation, 0);
        // The fenced host writes again, as does everyone: the window invariant 9 names.
        for h in [&a, &b, &c] {
            assert!(allowed(h, Access::Write));
        }
        // A's key is gone: its next acquire is a conflict until it registers again.
        let wear = ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS;
        assert!(is_conflict(a.acquire(&Acquire::acquire(KA, wear))));
        // What a live agent does (fenced's rule): register again and acquire; the
        // fenced host is shut out again, the unregistered one too.
        a.register(&Register::register(KA)).unwrap();
        a.acquire(&Acquire::acquire(KA, wear)).unwrap();
        assert!(!allowed(&b, Access::Write) && !allowed(&c, Access::Write));
        assert!(allowed(&a, Access::Write));
    }

    #[test]
    fn state_loss_with_ptpl_keeps_registrants_reservation_and_fence() {
        let ns = Namespace::with_ptpl_capable();
        let (a, b, _c) = fenced_state(&ns);
        assert!(ns.ptpl_capable() && ns.ptpl_state());
        let before = ns.snapshot();
        assert!(before.ptpls, "the report shows PTPLS");
        assert!(ns.lose_state());
        assert_eq!(ns.snapshot(), before, "everything survives");
        assert!(allowed(&a, Access::Write) && !allowed(&b, Access::Write));
        // CPTPL 10b turns it off again: the next loss drops everything.
        a.register(&Register::register(KA).with_cptpl(crate::Cptpl::Clear))
            .unwrap();
        assert!(!ns.ptpl_state() && !ns.snapshot().ptpls);
        assert!(!ns.lose_state());
        assert!(ns.snapshot().registrants.is_empty());
        assert!(allowed(&b, Access::Write));
    }

    #[test]
    fn cptpl_of_a_failed_register_changes_nothing() {
        let ns = Namespace::with_ptpl_capable();
        let (_, a, _, _) = hosts_on(ns.clone());
        a.register(&Register::register(KA)).unwrap();
        // Registering another key while registered is a conflict: no persistence.
        assert!(is_conflict(a.register(
            &Register::register(KB).with_cptpl(crate::Cptpl::Persist)
        )));
        assert!(!ns.ptpl_state());
        // NoChange leaves the state as it is.
        a.register(&Register::replace(KA, KB).with_cptpl(crate::Cptpl::Persist))
            .unwrap();
        a.register(&Register::replace(KB, KC)).unwrap();
        assert!(ns.ptpl_state());
    }

    #[test]
    fn fault_injection() {
        let (ns, a, _, _) = hosts();
        ns.fail_next(Operation::Register, NvmeStatus::INTERNAL);
        ns.fail_next(Operation::Report, NvmeStatus::RESERVATION_CONFLICT);
        let e = a.register(&Register::register(KA)).unwrap_err();
        assert_eq!(e.status(), Some(NvmeStatus::INTERNAL));
        assert!(ns.snapshot().registrants.is_empty(), "state untouched");
        a.register(&Register::register(KA)).unwrap();
        assert!(a.report().unwrap_err().is_reservation_conflict());
        assert_eq!(a.report().unwrap().registrants.len(), 1);
        ns.fail_next(Operation::Acquire, NvmeStatus::INTERNAL);
        ns.clear_faults();
        a.acquire(&Acquire::acquire(KA, ReservationType::WRITE_EXCLUSIVE))
            .unwrap();
    }

    #[test]
    fn report_shape_matches_nvmet() {
        let (_ns, a, b, _) = hosts();
        b.register(&Register::register(KB)).unwrap();
        a.register(&Register::register(KA)).unwrap();
        let st = a.report().unwrap();
        assert!(st.extended && !st.ptpls);
        assert_eq!(st.regctl, 2);
        assert_eq!(st.registrants[0].hostid, b.hostid(), "registration order");
        assert!(
            st.registrants
                .iter()
                .all(|r| r.cntlid == 0xffff && r.rcsts == 0)
        );
        // The report survives the wire format.
        assert_eq!(
            crate::report::parse_extended(&crate::report::encode(&st)),
            Ok(st)
        );
    }

    #[test]
    fn hosts_are_shareable_across_threads() {
        let (ns, a, _, _) = hosts();
        let handles: Vec<_> = (0..4u8)
            .map(|i| {
                let h = ns.host(HostId([0x10 + i; 16]));
                std::thread::spawn(move || h.register(&Register::register(Key(100 + u64::from(i)))))
            })
            .collect();
        for h in handles {
            h.join().unwrap().unwrap();
        }
        assert_eq!(a.report().unwrap().registrants.len(), 4);
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            Reg(u8, u8, u8, bool, u8),
            Acq(u8, u8, u8, u8, bool),
            Rel(u8, u8, u8, bool),
        }

        fn key(i: u8) -> Key {
            // Key 0 included, to exercise PRKEY 0 and the zero-key refusal.
            Key(u64::from(i))
        }

        fn op() -> impl Strategy<Value = (usize, Op)> {
            let k = 0u8..4;
            let cmd = prop_oneof![
                (
                    0u8..3,
                    k.clone(),
                    k.clone(),
                    any::<bool>(),
                    prop_oneof![Just(0u8), Just(2), Just(3)]
                )
                    .prop_map(|(a, c, n, ie, p)| Op::Reg(a, c, n, ie, p)),
                (0u8..3, 0u8..8, k.clone(), k.clone(), any::<bool>())
                    .prop_map(|(a, t, c, p, ie)| Op::Acq(a, t, c, p, ie)),
                (0u8..2, 0u8..8, k, any::<bool>()).prop_map(|(a, t, c, ie)| Op::Rel(a, t, c, ie)),
            ];
            (0usize..3, cmd)
        }

        fn apply(h: &Host, op: &Op) -> Result<()> {
            match *op {
                Op::Reg(a, c, n, ie, p) => h.register(&Register {
                    rrega: RegisterAction::from_rrega(a).unwrap(),
                    crkey: key(c),
                    nrkey: key(n),
                    iekey: ie,
                    cptpl: crate::Cptpl::from_cptpl(p).unwrap(),
                }),
                Op::Acq(a, t, c, p, ie) => h.acquire(&Acquire {
                    racqa: AcquireAction::from_racqa(a).unwrap(),
                    rtype: ReservationType(t),
                    crkey: key(c),
                    prkey: key(p),
                    iekey: ie,
                }),
                Op::Rel(a, t, c, ie) => h.release(&Release {
                    rrela: ReleaseAction::from_rrela(a).unwrap(),
                    rtype: ReservationType(t),
                    crkey: key(c),
                    iekey: ie,
                }),
            }
        }

        proptest! {
            /// A power loss at any point: with the PTPL state on, the report is
            /// unchanged and every host keeps its access; with it off, no registrant,
            /// no reservation, generation 0, and every host may write (the window
            /// fenced closes by registering and acquiring again). The PTPL state only
            /// ever turns on in a PTPL-capable namespace.
            #[test]
            fn power_loss_keeps_exactly_what_ptpl_says(
                capable in any::<bool>(),
                ops in proptest::collection::vec(op(), 0..40),
            ) {
                let ns = if capable { Namespace::with_ptpl_capable() } else { Namespace::new() };
                let (ns, a, b, c) = hosts_on(ns);
                let hs = [a, b, c];
                for (h, op) in &ops {
                    let _ = apply(&hs[*h], op);
                    prop_assert!(capable || !ns.ptpl_state(), "PTPL on without RESCAP bit 0");
                    prop_assert_eq!(ns.snapshot().ptpls, ns.ptpl_state());
                }
                let before = ns.snapshot();
                let access = |hs: &[Host; 3]| hs.iter().map(|h| (h.check(Access::Read).is_ok(), h.check(Access::Write).is_ok())).collect::<Vec<_>>();
                let access_before = access(&hs);
                let kept = ns.lose_state();
                prop_assert_eq!(kept, before.ptpls);
                let after = ns.snapshot();
                if kept {
                    prop_assert_eq!(&after, &before);
                    prop_assert_eq!(access(&hs), access_before);
                } else {
                    prop_assert!(after.registrants.is_empty() && after.rtype == ReservationType::NONE);
                    prop_assert_eq!(after.generation, 0);
                    prop_assert!(hs.iter().all(|h| h.check(Access::Write).is_ok()));
                }
            }
        }

        proptest! {
            /// Invariants of the model under any command sequence: one record per host,
            /// the holder is a registrant, a failed command changes nothing, the
            /// generation moves by 0 or 1, hosts with access rules consistent.
            #[test]
            fn invariants_hold(ops in proptest::collection::vec(op(), 0..60)) {
                let (ns, a, b, c) = hosts();
                let hs = [a, b, c];
                for (h, op) in &ops {
                    let before = ns.snapshot();
                    let r = apply(&hs[*h], op);
                    let after = ns.snapshot();
                    match &r {
                        Err(_) => prop_assert_eq!(&after, &before, "{:?} failed but changed state", op),
                        Ok(()) => prop_assert!(after.generation.wrapping_sub(before.generation) <= 1),
                    }
                    if let Err(e) = &r {
                        let zero_key = matches!(e, Error::ZeroKey { .. });
                        prop_assert!(e.status().is_some() || zero_key, "{}", e);
                    }
                    let mut ids: Vec<_> = after.registrants.iter().map(|r| r.hostid).collect();
                    ids.sort();
                    ids.dedup();
                    prop_assert_eq!(ids.len(), after.registrants.len(), "one record per host");
                    prop_assert!(after.registrants.iter().all(|r| r.rkey.0 != 0), "key 0 registered");
                    prop_assert_eq!(after.rtype == ReservationType::NONE, after.holder().is_none());
                    prop_assert!(after.rtype == ReservationType::NONE || after.rtype.is_valid());
                    for h in &hs {
                        let holds = after.registrant(h.hostid()).is_some_and(|r| r.holds_reservation());
                        if holds || after.rtype == ReservationType::NONE {
                            prop_assert!(h.check(Access::Read).is_ok() && h.check(Access::Write).is_ok());
                        }
                        // The evidence rule (issue 26): whenever a report is evidence
                        // that key k is cut off, every host without a registration is
                        // denied writes: a host that held k is one.
                        for k in 1..4u8 {
                            if crate::report::cut_off(&after, key(k)).is_ok()
                                && after.registrant(h.hostid()).is_none()
                            {
                                prop_assert!(h.check(Access::Write).is_err(), "evidence for {} but {:?} writes", key(k), h.hostid());
                            }
                        }
                        if after.rtype == ReservationType::NONE {
                            prop_assert!((1..4u8).all(|k| crate::report::cut_off(&after, key(k)).is_err()));
                        }
                        // Under any of the six types a non-registrant cannot write.
                        if after.registrant(h.hostid()).is_none() && after.rtype != ReservationType::NONE {
                            prop_assert!(h.check(Access::Write).is_err());
                        }
                    }
                }
            }
        }
    }
}
