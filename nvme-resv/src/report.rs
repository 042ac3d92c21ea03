//! Reservation Report data structures and their parser (pure: no I/O).
//!
//! NVM Express Base Specification 2.0c section 7.5: the Reservation Status Data
//! Structure (24-byte header, 24-byte Registered Controller entries) and the
//! Reservation Status Extended Data Structure (64-byte header, 64-byte Registered
//! Controller Extended entries with 128-bit host identifiers). Little endian.

use crate::error::ReportError;
use crate::{HostId, Key, ReservationType};

/// Header size of the regular data structure.
pub const REGULAR_HEADER_LEN: usize = 24;
/// Size of one Registered Controller data structure.
pub const REGULAR_ENTRY_LEN: usize = 24;
/// Header size of the extended data structure.
pub const EXTENDED_HEADER_LEN: usize = 64;
/// Size of one Registered Controller Extended data structure.
pub const EXTENDED_ENTRY_LEN: usize = 64;

/// One Registered Controller (regular) or Registered Controller Extended data structure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredController {
    /// Controller ID (nvmet reports 0xffff: dynamic controller model).
    pub cntlid: u16,
    /// Reservation Status: bit 0 set when this registrant holds the reservation.
    pub rcsts: u8,
    /// Host Identifier (64-bit ids zero-extended when the regular structure was used).
    pub hostid: HostId,
    /// Reservation Key.
    pub rkey: Key,
}

/// A parsed Reservation Report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationStatus {
    /// Generation (GEN; `gen` is a reserved word in Rust 2024): incremented by the device on every preempt, clear, and
    /// registration change per the specification.
    pub generation: u32,
    /// Reservation Type held, `ReservationType::NONE` when none is held.
    pub rtype: ReservationType,
    /// Number of Registered Controllers (REGCTL), as the device reported it.
    pub regctl: u16,
    /// Persist Through Power Loss State.
    pub ptpls: bool,
    /// Every registrant (the buffer is grown until all fit).
    pub registrants: Vec<RegisteredController>,
    /// Whether the extended data structure (128-bit host ids) was used.
    pub extended: bool,
}

impl ReservationStatus {
    /// A report built by hand (test doubles, benchmarks): REGCTL is the number of
    /// `registrants` (saturating at 65535), PTPLS clear, extended data structure.
    /// Refine with [`with_ptpls`](Self::with_ptpls) and
    /// [`with_extended`](Self::with_extended).
    pub fn new(
        generation: u32,
        rtype: ReservationType,
        registrants: Vec<RegisteredController>,
    ) -> Self {
        Self {
            generation,
            rtype,
            regctl: u16::try_from(registrants.len()).unwrap_or(u16::MAX),
            ptpls: false,
            registrants,
            extended: true,
        }
    }

    /// Sets PTPLS.
    #[must_use]
    pub fn with_ptpls(mut self, ptpls: bool) -> Self {
        self.ptpls = ptpls;
        self
    }

    /// Sets whether the report is in the extended data structure.
    #[must_use]
    pub fn with_extended(mut self, extended: bool) -> Self {
        self.extended = extended;
        self
    }

    /// The registrant holding the reservation (RCSTS bit 0), `None` when no
    /// reservation is held. For the all-registrants types every registrant holds it;
    /// this returns the first.
    pub fn holder(&self) -> Option<&RegisteredController> {
        if self.rtype == ReservationType::NONE {
            return None;
        }
        self.registrants.iter().find(|r| r.holds_reservation())
    }

    /// Whether a registrant with key `key` is listed.
    pub fn is_registered(&self, key: Key) -> bool {
        self.registrants.iter().any(|r| r.rkey == key)
    }

    /// The registrant with host identifier `hostid`, if registered.
    pub fn registrant(&self, hostid: HostId) -> Option<&RegisteredController> {
        self.registrants.iter().find(|r| r.hostid == hostid)
    }

    /// The report as `nvme resv-report --eds -o json` prints it (nvme-cli 2.x):
    /// `gen`, `rtype`, `regctl`, `ptpls` as numbers, and `regctlext` entries with
    /// `cntlid`, `rcsts`, `rkey` as numbers and `hostid` as 32 lowercase hex digits in
    /// byte order. A report read with the regular structure is printed under
    /// `regctls` with `hostid` as a number, as nvme-cli does without `--eds`.
    ///
    /// Needs the `json` feature (on with the default `cli`).
    #[cfg(feature = "json")]
    pub fn to_nvme_cli_json(&self) -> serde_json::Value {
        use serde_json::{Value, json};
        let entries: Vec<Value> = self
            .registrants
            .iter()
            .map(|r| {
                if self.extended {
                    json!({
                        "cntlid": r.cntlid,
                        "rcsts": r.rcsts,
                        "rkey": r.rkey.0,
                        "hostid": r.hostid.to_string(),
                    })
                } else {
                    let mut low = [0u8; 8];
                    low.copy_from_slice(&r.hostid.0[..8]);
                    json!({
                        "cntlid": r.cntlid,
                        "rcsts": r.rcsts,
                        "hostid": u64::from_le_bytes(low),
                        "rkey": r.rkey.0,
                    })
                }
            })
            .collect();
        let list = if self.extended {
            "regctlext"
        } else {
            "regctls"
        };
        json!({
            "gen": self.generation,
            "rtype": self.rtype.0,
            "regctl": self.regctl,
            "ptpls": u8::from(self.ptpls),
            list: entries,
        })
    }
}

impl RegisteredController {
    /// A registrant with `hostid` and `rkey` that does not hold the reservation, with
    /// controller ID 0xFFFF (dynamic controller model) — for reports built by hand
    /// (test doubles, benchmarks). Refine with [`with_cntlid`](Self::with_cntlid) and
    /// [`holding`](Self::holding).
    pub const fn new(hostid: HostId, rkey: Key) -> Self {
        Self {
            cntlid: 0xffff,
            rcsts: 0,
            hostid,
            rkey,
        }
    }

    /// Sets the controller ID.
    #[must_use]
    pub const fn with_cntlid(mut self, cntlid: u16) -> Self {
        self.cntlid = cntlid;
        self
    }

    /// Sets or clears RCSTS bit 0 (holds the reservation).
    #[must_use]
    pub const fn holding(mut self, holds: bool) -> Self {
        self.rcsts = (self.rcsts & !1) | holds as u8;
        self
    }

    /// RCSTS bit 0: this registrant holds the reservation.
    pub const fn holds_reservation(&self) -> bool {
        self.rcsts & 1 != 0
    }
}

/// Whether a reservation of type `rtype` denies writes to a host that is not
/// registered: true for each of the six types (NVMe Base 2.0c 8.19, "Command
/// Behavior in the Presence of a Reservation"), false for no reservation (every host
/// may write) and for a value outside 1..=6.
pub const fn denies_unregistered_writes(rtype: ReservationType) -> bool {
    rtype.is_valid()
}

/// What a report shows when it is evidence that `victim` is cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CutOff {
    /// The reservation type held, which denies the victim's writes.
    pub rtype: ReservationType,
    /// The holder's key (the first holder for the All Registrants types), when the
    /// report marks one.
    pub holder: Option<Key>,
}

/// Why a report is not evidence that a victim is cut off. A fence is confirmed only
/// by [`fence_evidence`]; each of these leaves it owed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotCutOff {
    /// The victim's key is still registered.
    #[error("the victim's key {0} is still registered")]
    VictimRegistered(Key),
    /// Our own key is not registered: we were fenced ourselves (or never unfenced),
    /// so our word about the victim is worth nothing.
    #[error("our own key {0} is not registered")]
    OwnKeyAbsent(Key),
    /// No reservation is held: with none, every host may write, registered or not, so
    /// removing the victim's key cut nothing.
    #[error(
        "no reservation is held: with none every host may write, so the absence of key {0} cuts nothing"
    )]
    NoReservation(Key),
    /// The report names a reservation type outside the six.
    #[error(
        "the report names reservation type {0}, not one of the six: it cannot be taken as denying key {1}"
    )]
    UnknownType(ReservationType, Key),
    /// A Write Exclusive or Exclusive Access reservation held by the victim's key:
    /// the holder may always write.
    #[error("the reservation ({0}) is held by the victim's key {1}")]
    VictimHolds(ReservationType, Key),
}

/// Whether `report` shows that the host whose key is `victim` cannot write: its key
/// absent, and a reservation held whose type denies an unregistered host (any of the
/// six types does), not held by the victim for Write Exclusive / Exclusive Access.
/// Does not look at our own key: see [`fence_evidence`].
pub fn cut_off(report: &ReservationStatus, victim: Key) -> Result<CutOff, NotCutOff> {
    if report.is_registered(victim) {
        return Err(NotCutOff::VictimRegistered(victim));
    }
    reservation_denies(report, victim)
}

/// The evidence rule for a fence: `victim`'s key absent, our key `own` present, and a
/// reservation held whose type denies the victim ([`cut_off`]). A report without a
/// reservation is never evidence: a Reservation Acquire - Preempt with none held only
/// unregisters the key, and every host may still write.
pub fn fence_evidence(
    report: &ReservationStatus,
    victim: Key,
    own: Key,
) -> Result<CutOff, NotCutOff> {
    if report.is_registered(victim) {
        return Err(NotCutOff::VictimRegistered(victim));
    }
    if !report.is_registered(own) {
        return Err(NotCutOff::OwnKeyAbsent(own));
    }
    reservation_denies(report, victim)
}

fn reservation_denies(report: &ReservationStatus, victim: Key) -> Result<CutOff, NotCutOff> {
    let rtype = report.rtype;
    if rtype == ReservationType::NONE {
        return Err(NotCutOff::NoReservation(victim));
    }
    if !denies_unregistered_writes(rtype) {
        return Err(NotCutOff::UnknownType(rtype, victim));
    }
    let holder = report.holder().map(|h| h.rkey);
    if rtype.is_holder_only() && holder == Some(victim) {
        return Err(NotCutOff::VictimHolds(rtype, victim));
    }
    Ok(CutOff { rtype, holder })
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Bytes a report with `regctl` registrants needs in the given layout.
pub const fn report_len(extended: bool, regctl: u16) -> usize {
    if extended {
        EXTENDED_HEADER_LEN + regctl as usize * EXTENDED_ENTRY_LEN
    } else {
        REGULAR_HEADER_LEN + regctl as usize * REGULAR_ENTRY_LEN
    }
}

/// Parses a Reservation Status (regular) data structure. Every one of REGCTL entries
/// must be in `buf`, else [`ReportError::Truncated`] says how many bytes are needed.
pub fn parse_regular(buf: &[u8]) -> Result<ReservationStatus, ReportError> {
    parse(buf, false)
}

/// Parses a Reservation Status Extended data structure (EDS); same rules as
/// [`parse_regular`].
pub fn parse_extended(buf: &[u8]) -> Result<ReservationStatus, ReportError> {
    parse(buf, true)
}

/// Parses either layout.
pub fn parse(buf: &[u8], extended: bool) -> Result<ReservationStatus, ReportError> {
    let header = if extended {
        EXTENDED_HEADER_LEN
    } else {
        REGULAR_HEADER_LEN
    };
    if buf.len() < header {
        return Err(ReportError::TruncatedHeader {
            len: buf.len(),
            header,
        });
    }
    // Header: GEN 3:0, RTYPE 4, REGCTL 6:5, PTPLS 9.
    let generation = le32(buf, 0);
    let rtype = ReservationType(buf[4]);
    let regctl = le16(buf, 5);
    let ptpls = buf[9] & 1 != 0;
    let needed = report_len(extended, regctl);
    if buf.len() < needed {
        return Err(ReportError::Truncated {
            regctl,
            needed,
            len: buf.len(),
        });
    }
    let entry = if extended {
        EXTENDED_ENTRY_LEN
    } else {
        REGULAR_ENTRY_LEN
    };
    let registrants = buf[header..needed]
        .chunks_exact(entry)
        .map(|e| {
            let mut hostid = [0u8; 16];
            let rkey;
            if extended {
                // CNTLID 1:0, RCSTS 2, RKEY 15:8, HOSTID 31:16.
                rkey = le64(e, 8);
                hostid.copy_from_slice(&e[16..32]);
            } else {
                // CNTLID 1:0, RCSTS 2, HOSTID 15:8, RKEY 23:16.
                hostid[..8].copy_from_slice(&e[8..16]);
                rkey = le64(e, 16);
            }
            RegisteredController {
                cntlid: le16(e, 0),
                rcsts: e[2],
                hostid: HostId(hostid),
                rkey: Key(rkey),
            }
        })
        .collect();
    Ok(ReservationStatus {
        generation,
        rtype,
        regctl,
        ptpls,
        registrants,
        extended,
    })
}

/// Encodes `status` in its layout ([`ReservationStatus::extended`]); the inverse of
/// [`parse`], used by the model and by tests. REGCTL is written as the number of
/// registrants.
pub fn encode(status: &ReservationStatus) -> Vec<u8> {
    let regctl = status.registrants.len() as u16;
    let mut buf = vec![0u8; report_len(status.extended, regctl)];
    buf[0..4].copy_from_slice(&status.generation.to_le_bytes());
    buf[4] = status.rtype.0;
    buf[5..7].copy_from_slice(&regctl.to_le_bytes());
    buf[9] = u8::from(status.ptpls);
    let (header, entry) = if status.extended {
        (EXTENDED_HEADER_LEN, EXTENDED_ENTRY_LEN)
    } else {
        (REGULAR_HEADER_LEN, REGULAR_ENTRY_LEN)
    };
    for (r, e) in status
        .registrants
        .iter()
        .zip(buf[header..].chunks_exact_mut(entry))
    {
        e[0..2].copy_from_slice(&r.cntlid.to_le_bytes());
        e[2] = r.rcsts;
        if status.extended {
            e[8..16].copy_from_slice(&r.rkey.0.to_le_bytes());
            e[16..32].copy_from_slice(&r.hostid.0);
        } else {
            e[8..16].copy_from_slice(&r.hostid.0[..8]);
            e[16..24].copy_from_slice(&r.rkey.0.to_le_bytes());
        }
    }
    buf
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A hand-written extended report: GEN 3, RTYPE 3 (WE-RO), two registrants, the
    /// second one holding; bytes laid out per Base 2.0c 7.5 "Reservation Status
    /// Extended Data Structure".
    fn extended_fixture() -> Vec<u8> {
        let mut b = vec![0u8; 64 + 2 * 64];
        b[0] = 3; // GEN
        b[4] = 3; // RTYPE
        b[5] = 2; // REGCTL low byte
        b[9] = 0; // PTPLS
        // Entry 0 at 64: CNTLID 0xffff, RCSTS 0, RKEY 0xaaaa, HOSTID 00 01 .. 0f.
        b[64] = 0xff;
        b[65] = 0xff;
        b[64 + 8] = 0xaa;
        b[64 + 9] = 0xaa;
        for i in 0..16 {
            b[64 + 16 + i] = i as u8;
        }
        // Entry 1 at 128: CNTLID 2, RCSTS 1, RKEY 0x0102030405060708, HOSTID ff..f0.
        b[128] = 2;
        b[130] = 1;
        b[136..144].copy_from_slice(&[8, 7, 6, 5, 4, 3, 2, 1]);
        for i in 0..16 {
            b[144 + i] = 0xff - i as u8;
        }
        b
    }

    #[test]
    fn extended_fixture_parses() {
        let st = parse_extended(&extended_fixture()).unwrap();
        assert_eq!(st.generation, 3);
        assert_eq!(st.rtype, ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY);
        assert_eq!(st.regctl, 2);
        assert!(!st.ptpls && st.extended);
        assert_eq!(st.registrants.len(), 2);
        let r0 = &st.registrants[0];
        assert_eq!((r0.cntlid, r0.rcsts, r0.rkey), (0xffff, 0, Key(0xaaaa)));
        assert_eq!(r0.hostid.0, core::array::from_fn(|i| i as u8));
        let r1 = &st.registrants[1];
        assert_eq!((r1.cntlid, r1.rcsts), (2, 1));
        assert_eq!(r1.rkey, Key(0x0102_0304_0506_0708));
        assert_eq!(st.holder(), Some(r1));
        assert!(st.is_registered(Key(0xaaaa)) && !st.is_registered(Key(0xbbbb)));
        assert_eq!(encode(&st), extended_fixture());
    }

    #[test]
    fn regular_fixture_parses() {
        let mut b = vec![0u8; 24 + 3 * 24];
        b[0..4].copy_from_slice(&0x0102_0304u32.to_le_bytes());
        b[4] = 1;
        b[5] = 3;
        b[9] = 1;
        for i in 0..3 {
            let e = &mut b[24 + i * 24..48 + i * 24];
            e[0] = i as u8 + 1; // CNTLID
            e[2] = u8::from(i == 0); // RCSTS
            e[8..16].copy_from_slice(&(0x1000 + i as u64).to_le_bytes()); // HOSTID
            e[16..24].copy_from_slice(&(0xb0 + i as u64).to_le_bytes()); // RKEY
        }
        let st = parse_regular(&b).unwrap();
        assert_eq!(st.generation, 0x0102_0304);
        assert_eq!(st.rtype, ReservationType::WRITE_EXCLUSIVE);
        assert!(st.ptpls && !st.extended);
        assert_eq!(st.registrants.len(), 3);
        assert_eq!(st.registrants[2].cntlid, 3);
        assert_eq!(st.registrants[2].rkey, Key(0xb2));
        assert_eq!(st.registrants[2].hostid.0[..8], 0x1002u64.to_le_bytes());
        assert_eq!(st.registrants[2].hostid.0[8..], [0; 8]);
        assert_eq!(st.holder().map(|h| h.rkey), Some(Key(0xb0)));
        assert_eq!(encode(&st), b);
        #[cfg(feature = "json")]
        {
            let j = st.to_nvme_cli_json();
            assert_eq!(j["regctls"][2]["hostid"], 0x1002);
        }
    }

    #[test]
    fn hand_built_report_matches_the_parsed_one() {
        let parsed = parse_extended(&extended_fixture()).unwrap();
        let built = ReservationStatus::new(
            parsed.generation,
            parsed.rtype,
            vec![
                RegisteredController::new(parsed.registrants[0].hostid, parsed.registrants[0].rkey),
                RegisteredController::new(parsed.registrants[1].hostid, parsed.registrants[1].rkey)
                    .with_cntlid(parsed.registrants[1].cntlid)
                    .holding(true),
            ],
        )
        .with_ptpls(parsed.ptpls);
        assert_eq!(built, parsed);
        assert_eq!(encode(&built), extended_fixture());
        let r = RegisteredController::new(HostId::default(), Key(1)).holding(true);
        assert!(r.holds_reservation() && !r.holding(false).holds_reservation());
        assert!(
            !ReservationStatus::new(0, ReservationType::NONE, vec![])
                .with_extended(false)
                .extended
        );
    }

    #[test]
    fn zero_registrants() {
        let st = parse_extended(&[0u8; 64]).unwrap();
        assert!(st.registrants.is_empty() && st.regctl == 0);
        assert_eq!(st.holder(), None);
        let st = parse_regular(&[0u8; 24]).unwrap();
        assert!(st.registrants.is_empty());
        // A 4 KiB buffer with nothing after the header is fine too.
        assert!(parse_extended(&[0u8; 4096]).unwrap().registrants.is_empty());
    }

    #[test]
    fn many_registrants() {
        let n = 300u16;
        let st = ReservationStatus {
            generation: 9,
            rtype: ReservationType::EXCLUSIVE_ACCESS_ALL_REGISTRANTS,
            regctl: n,
            ptpls: false,
            registrants: (0..n)
                .map(|i| RegisteredController {
                    cntlid: i,
                    rcsts: 1,
                    hostid: HostId([i as u8; 16]),
                    rkey: Key(u64::from(i) + 1),
                })
                .collect(),
            extended: true,
        };
        let buf = encode(&st);
        assert_eq!(buf.len(), 64 + 300 * 64);
        assert_eq!(parse_extended(&buf).unwrap(), st);
    }

    #[test]
    fn truncated_header_and_entries() {
        assert_eq!(
            parse_extended(&[0u8; 63]),
            Err(ReportError::TruncatedHeader {
                len: 63,
                header: 64
            })
        );
        assert_eq!(
            parse_regular(&[]),
            Err(ReportError::TruncatedHeader { len: 0, header: 24 })
        );
        let b = extended_fixture();
        assert_eq!(
            parse_extended(&b[..64 + 64 + 10]),
            Err(ReportError::Truncated {
                regctl: 2,
                needed: 192,
                len: 138
            })
        );
    }

    #[test]
    fn regctl_larger_than_buffer() {
        // A device with 1000 registrants answering into a 4 KiB buffer: the header
        // says 1000, only 63 entries fit. The parser says how much to ask for.
        let mut b = vec![0u8; 4096];
        b[5..7].copy_from_slice(&1000u16.to_le_bytes());
        match parse_extended(&b) {
            Err(ReportError::Truncated {
                regctl,
                needed,
                len,
            }) => {
                assert_eq!((regctl, needed, len), (1000, 64 + 64_000, 4096));
            }
            other => panic!("{other:?}"),
        }
        b[5..7].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(parse_regular(&b).is_err());
    }

    fn reg(key: u64, holds: bool) -> RegisteredController {
        RegisteredController::new(HostId([key as u8; 16]), Key(key)).holding(holds)
    }

    #[test]
    fn evidence_needs_a_reservation_that_denies_the_victim() {
        let (own, victim) = (Key(0xa), Key(0xb));
        // Key gone, ours present, no reservation: the hole of issue 26. Not evidence.
        let none = ReservationStatus::new(4, ReservationType::NONE, vec![reg(0xa, false)]);
        assert_eq!(
            fence_evidence(&none, victim, own),
            Err(NotCutOff::NoReservation(victim))
        );
        assert_eq!(
            cut_off(&none, victim),
            Err(NotCutOff::NoReservation(victim))
        );
        assert!(
            NotCutOff::NoReservation(victim)
                .to_string()
                .contains("no reservation is held"),
        );
        // Any of the six types, held by us (or another registrant): evidence.
        for t in 1..=6u8 {
            let rtype = ReservationType(t);
            let held = ReservationStatus::new(5, rtype, vec![reg(0xa, true), reg(0xc, false)]);
            assert_eq!(
                fence_evidence(&held, victim, own),
                Ok(CutOff {
                    rtype,
                    holder: Some(own)
                }),
                "{rtype}"
            );
            assert!(denies_unregistered_writes(rtype));
        }
        assert!(!denies_unregistered_writes(ReservationType::NONE));
        // The victim still registered, or our key gone, whatever the reservation.
        let both = ReservationStatus::new(
            6,
            ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS,
            vec![reg(0xa, true), reg(0xb, true)],
        );
        assert_eq!(
            fence_evidence(&both, victim, own),
            Err(NotCutOff::VictimRegistered(victim))
        );
        let others = ReservationStatus::new(
            6,
            ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS,
            vec![reg(0xc, true)],
        );
        assert_eq!(
            fence_evidence(&others, victim, own),
            Err(NotCutOff::OwnKeyAbsent(own))
        );
        assert!(cut_off(&others, victim).is_ok());
        // A type outside the six is not taken as denying anyone.
        let odd = ReservationStatus::new(6, ReservationType(7), vec![reg(0xa, true)]);
        assert_eq!(
            fence_evidence(&odd, victim, own),
            Err(NotCutOff::UnknownType(ReservationType(7), victim))
        );
    }

    #[test]
    fn a_holder_only_reservation_held_by_the_victims_key_is_not_evidence() {
        // A device that marks a holder whose key it no longer lists as a registrant
        // (it cannot happen on a correct device): the holder may write.
        for rtype in [
            ReservationType::WRITE_EXCLUSIVE,
            ReservationType::EXCLUSIVE_ACCESS,
        ] {
            let mut st = ReservationStatus::new(2, rtype, vec![reg(0xa, false), reg(0xb, true)]);
            // Key 0xb is the victim: registered, so refused as registered first.
            assert_eq!(
                cut_off(&st, Key(0xb)),
                Err(NotCutOff::VictimRegistered(Key(0xb)))
            );
            // Same holder, the victim's key looked up under another listing: the rule
            // itself refuses a holder with the victim's key.
            st.registrants[1].rkey = Key(0xb);
            assert_eq!(
                reservation_denies(&st, Key(0xb)),
                Err(NotCutOff::VictimHolds(rtype, Key(0xb)))
            );
            assert_eq!(
                reservation_denies(&st, Key(0xc)),
                Ok(CutOff {
                    rtype,
                    holder: Some(Key(0xb))
                })
            );
        }
    }

    #[cfg(feature = "json")]
    #[test]
    fn nvme_cli_json_shape() {
        let st = parse_extended(&extended_fixture()).unwrap();
        let j = st.to_nvme_cli_json();
        let want = serde_json::json!({
            "gen": 3, "rtype": 3, "regctl": 2, "ptpls": 0,
            "regctlext": [
                {"cntlid": 65535, "rcsts": 0, "rkey": 0xaaaa,
                 "hostid": "000102030405060708090a0b0c0d0e0f"},
                {"cntlid": 2, "rcsts": 1, "rkey": 0x0102030405060708u64,
                 "hostid": "fffefdfcfbfaf9f8f7f6f5f4f3f2f1f0"},
            ]
        });
        assert_eq!(j, want);
        // Large keys stay exact (nvme-cli prints u64 keys as unsigned numbers).
        let mut st2 = st.clone();
        st2.registrants[0].rkey = Key(u64::MAX);
        assert_eq!(
            st2.to_nvme_cli_json()["regctlext"][0]["rkey"].as_u64(),
            Some(u64::MAX)
        );
    }

    proptest! {
        #[test]
        fn parser_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..2048), ext in any::<bool>()) {
            match parse(&buf, ext) {
                Ok(st) => {
                    prop_assert_eq!(st.registrants.len(), st.regctl as usize);
                    prop_assert!(buf.len() >= report_len(ext, st.regctl));
                }
                Err(ReportError::Truncated { needed, len, .. }) => prop_assert!(needed > len),
                Err(ReportError::TruncatedHeader { len, header }) => prop_assert!(len < header),
            }
        }

        #[test]
        fn encode_parse_round_trip(
            generation in any::<u32>(), rtype in 0u8..8, ptpls in any::<bool>(), ext in any::<bool>(),
            regs in proptest::collection::vec((any::<u16>(), 0u8..2, any::<[u8; 8]>(), any::<[u8; 8]>(), any::<u64>()), 0..40),
        ) {
            let registrants: Vec<_> = regs.iter().map(|&(cntlid, rcsts, lo, hi, rkey)| {
                let mut h = [0u8; 16];
                h[..8].copy_from_slice(&lo);
                if ext { h[8..].copy_from_slice(&hi); }
                RegisteredController { cntlid, rcsts, hostid: HostId(h), rkey: Key(rkey) }
            }).collect();
            let st = ReservationStatus {
                generation, rtype: ReservationType(rtype), regctl: registrants.len() as u16,
                ptpls, registrants, extended: ext,
            };
            prop_assert_eq!(parse(&encode(&st), ext), Ok(st));
        }
    }
}
