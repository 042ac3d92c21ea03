//! The shared namespace the in-process agents and controllers talk to.
//!
//! A stand-in for `nvme_resv::model` covering what the daemon uses (Write Exclusive -
//! Registrants Only; register, unregister, acquire, preempt / preempt-and-abort,
//! release, clear, report, write access), per NVMe Base Specification 2.0 §8.19.
//! It exists because `nvme_resv::model` (as of commit 320ae0e) does not unregister
//! the preempted registrant when the *holder* preempts another registrant's key
//! (§8.19.7: "registrants whose key matches PRKEY are unregistered"); see the ignored
//! test `model_holder_preempting_a_registrant_unregisters_it` in tests/fencing.rs.
//! Swap to `pub use nvme_resv::model::{Host, Namespace}` once that test passes.

use std::sync::{Arc, Mutex};

use nvme_resv::status::NvmeStatus;
use nvme_resv::{
    Acquire, AcquireAction, Error, HostId, Key, Operation, Register, RegisterAction,
    RegisteredController, Release, ReleaseAction, ReservationStatus, ReservationType, Reservations,
};

#[derive(Debug, Default)]
struct State {
    generation: u32,
    regs: Vec<(HostId, Key)>,
    holder: Option<HostId>,
    rtype: ReservationType,
}

/// One namespace.
#[derive(Debug, Clone, Default)]
pub struct Namespace(Arc<Mutex<State>>);

/// One host's handle.
#[derive(Debug, Clone)]
pub struct Host {
    ns: Namespace,
    id: HostId,
}

fn conflict(op: Operation) -> Error {
    Error::Device {
        op,
        nsid: 1,
        status: NvmeStatus::RESERVATION_CONFLICT,
    }
}

impl Namespace {
    /// An empty namespace.
    pub fn new() -> Self {
        Self::default()
    }
    /// The handle of host `id`.
    pub fn host(&self, id: HostId) -> Host {
        Host {
            ns: self.clone(),
            id,
        }
    }
}

impl Host {
    fn key(s: &State, id: HostId) -> Option<Key> {
        s.regs.iter().find(|(h, _)| *h == id).map(|(_, k)| *k)
    }
}

/// Whether `host` may write now (WERO: registrants only; no reservation: anyone).
pub fn can_write(host: &Host) -> bool {
    let s = host.ns.0.lock().unwrap();
    s.holder.is_none() || Host::key(&s, host.id).is_some()
}

impl Reservations for Host {
    fn register(&self, cmd: &Register) -> nvme_resv::Result<()> {
        let mut s = self.ns.0.lock().unwrap();
        let cur = Self::key(&s, self.id);
        match cmd.rrega {
            RegisterAction::Register => match cur {
                None => {
                    s.regs.push((self.id, cmd.nrkey));
                    s.generation += 1;
                }
                Some(k) if k == cmd.nrkey => {}
                Some(_) => return Err(conflict(Operation::Register)),
            },
            RegisterAction::Unregister => {
                if cur.is_none() || !(cur == Some(cmd.crkey) || cmd.iekey) {
                    return Err(conflict(Operation::Register));
                }
                s.regs.retain(|(h, _)| *h != self.id);
                s.generation += 1;
                if s.holder == Some(self.id) {
                    s.holder = None;
                    s.rtype = ReservationType::NONE;
                }
            }
            RegisterAction::Replace => {
                if cur.is_some() && !(cur == Some(cmd.crkey) || cmd.iekey) {
                    return Err(conflict(Operation::Register));
                }
                s.regs.retain(|(h, _)| *h != self.id);
                s.regs.push((self.id, cmd.nrkey));
            }
        }
        Ok(())
    }

    fn acquire(&self, cmd: &Acquire) -> nvme_resv::Result<()> {
        let mut s = self.ns.0.lock().unwrap();
        if Self::key(&s, self.id) != Some(cmd.crkey) {
            return Err(conflict(Operation::Acquire));
        }
        match cmd.racqa {
            AcquireAction::Acquire => match s.holder {
                None => {
                    s.holder = Some(self.id);
                    s.rtype = cmd.rtype;
                }
                Some(h) if h == self.id && s.rtype == cmd.rtype => {}
                Some(_) => return Err(conflict(Operation::Acquire)),
            },
            AcquireAction::Preempt | AcquireAction::PreemptAndAbort => {
                let victims: Vec<HostId> = s
                    .regs
                    .iter()
                    .filter(|(h, k)| *k == cmd.prkey && *h != self.id)
                    .map(|(h, _)| *h)
                    .collect();
                let holder_preempted = s.holder.is_some_and(|h| victims.contains(&h));
                if victims.is_empty() {
                    return Err(conflict(Operation::Acquire));
                }
                s.regs.retain(|(h, _)| !victims.contains(h));
                if holder_preempted {
                    s.holder = Some(self.id);
                    s.rtype = cmd.rtype;
                }
                s.generation += 1;
            }
        }
        Ok(())
    }

    fn release(&self, cmd: &Release) -> nvme_resv::Result<()> {
        let mut s = self.ns.0.lock().unwrap();
        if Self::key(&s, self.id) != Some(cmd.crkey) {
            return Err(conflict(Operation::Release));
        }
        match cmd.rrela {
            ReleaseAction::Release => {
                if s.holder == Some(self.id) {
                    s.holder = None;
                    s.rtype = ReservationType::NONE;
                }
            }
            ReleaseAction::Clear => {
                s.regs.clear();
                s.holder = None;
                s.rtype = ReservationType::NONE;
                s.generation += 1;
            }
        }
        Ok(())
    }

    fn report(&self) -> nvme_resv::Result<ReservationStatus> {
        let s = self.ns.0.lock().unwrap();
        Ok(ReservationStatus {
            generation: s.generation,
            rtype: s.rtype,
            regctl: u16::try_from(s.regs.len()).unwrap(),
            ptpls: false,
            registrants: s
                .regs
                .iter()
                .map(|(h, k)| RegisteredController {
                    cntlid: 0xffff,
                    rcsts: u8::from(s.holder == Some(*h)),
                    hostid: *h,
                    rkey: *k,
                })
                .collect(),
            extended: true,
        })
    }
}
