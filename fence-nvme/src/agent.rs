//! The actions, on anything that has reservations: real namespaces in the binary, the
//! `nvme_resv::model` in unit tests.
//!
//! Every device is worked on in its own thread and every action has one deadline
//! (`power_timeout`), so one hung device cannot hide the others' answers; a device that
//! has not answered by the deadline fails the action. A fence is confirmed only by each
//! device's own report, read after the preempt: the preempt's answer is kept for the
//! error message, never taken as the evidence.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nvme_resv::report::{NotCutOff, fence_evidence};
use nvme_resv::{
    Acquire, Key, Namespace, Register, ReservationStatus, ReservationType, Reservations,
};

use crate::error::{Error, chain};
use crate::options::{Action, Settings, Target};
use crate::state::LocalState;

/// An opened device.
pub type Device = Box<dyn Reservations + Send>;

/// Opens devices by path.
pub trait Opener: Send + Sync + 'static {
    /// Opens `path`, failing if it cannot do reservations.
    fn open(&self, path: &Path) -> nvme_resv::Result<Device>;
}

/// The real thing: [`Namespace::open`], then Identify to refuse, in words, a namespace
/// without reservations before any reservation command is sent.
#[derive(Debug, Clone, Copy, Default)]
pub struct NamespaceOpener;

impl Opener for NamespaceOpener {
    fn open(&self, path: &Path) -> nvme_resv::Result<Device> {
        let ns = Namespace::open(path)?;
        ns.require_reservations()?;
        Ok(Box::new(ns))
    }
}

/// One line about a report: generation, registrants' keys, type.
pub fn describe(st: &ReservationStatus) -> String {
    let keys: Vec<String> = st.registrants.iter().map(|r| r.rkey.to_string()).collect();
    format!(
        "report: generation {}, {} registrant(s) [{}], {}",
        st.generation,
        st.registrants.len(),
        keys.join(" "),
        st.rtype
    )
}

fn registered(st: &ReservationStatus, key: Key) -> bool {
    st.registrants.iter().any(|r| r.rkey == key)
}

fn cmd(path: &Path, step: &'static str) -> impl FnOnce(nvme_resv::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Command { path, step, source }
}

/// `on` on one device: register `key` for this host (idempotent: Register of the key
/// this host already holds succeeds, and proves the registration is this host's, not
/// another host's with the same key), create the reservation if none, then require
/// the key and the configured type in the report.
pub fn unfence(
    dev: &dyn Reservations,
    path: &Path,
    key: Key,
    rtype: ReservationType,
) -> Result<String, Error> {
    dev.register(&Register::register(key))
        .map_err(cmd(path, "Reservation Register"))?;
    let now = dev.report().map_err(cmd(path, "Reservation Report"))?;
    let mut created = false;
    if now.rtype == ReservationType::NONE {
        if let Err(e) = dev.acquire(&Acquire::acquire(key, rtype)) {
            // Another node may have created it between our report and our acquire.
            let again = dev.report().map_err(cmd(path, "Reservation Report"))?;
            if again.rtype == ReservationType::NONE {
                return Err(cmd(path, "Reservation Acquire")(e));
            }
        } else {
            created = true;
        }
    }
    let after = dev.report().map_err(cmd(path, "Reservation Report"))?;
    if !registered(&after, key) {
        return Err(Error::NotRegistered {
            path: path.to_path_buf(),
            key,
            report: describe(&after),
        });
    }
    if after.rtype != rtype {
        return Err(Error::WrongType {
            path: path.to_path_buf(),
            held: after.rtype,
            want: rtype,
            report: describe(&after),
        });
    }
    Ok(format!(
        "key {key} registered{}; {}",
        if created { ", reservation created" } else { "" },
        describe(&after)
    ))
}

/// `off` on one device: refuse unless our own key is registered; when no reservation
/// is held, acquire it first with our key (a preempt without one only unregisters the
/// key: every host may still write); preempt-and-abort the victim's key if the report
/// lists it; re-read the report and require it to be evidence
/// ([`nvme_resv::report::fence_evidence`]: the victim gone, ourselves still
/// registered, a reservation held that denies the victim).
pub fn sever(
    dev: &dyn Reservations,
    path: &Path,
    own: Key,
    victim: Key,
    rtype: ReservationType,
) -> Result<String, Error> {
    let before = dev.report().map_err(cmd(path, "Reservation Report"))?;
    if !registered(&before, own) {
        return Err(Error::OwnKeyMissing {
            path: path.to_path_buf(),
            own,
            report: describe(&before),
        });
    }
    let mut acquired = false;
    if before.rtype == ReservationType::NONE {
        if let Err(e) = dev.acquire(&Acquire::acquire(own, rtype)) {
            // Another node may have created it between our report and our acquire.
            let again = dev.report().map_err(cmd(path, "Reservation Report"))?;
            if again.rtype == ReservationType::NONE {
                return Err(Error::NoReservation {
                    path: path.to_path_buf(),
                    own,
                    victim,
                    rtype,
                    answer: chain(&e),
                    report: describe(&again),
                });
            }
        } else {
            acquired = true;
        }
    }
    let preempt = registered(&before, victim)
        .then(|| dev.acquire(&Acquire::preempt_and_abort(own, victim, rtype)));
    let after = dev
        .report()
        .map_err(cmd(path, "Reservation Report (re-read after the preempt)"))?;
    let cut = match fence_evidence(&after, victim, own) {
        Ok(cut) => cut,
        Err(NotCutOff::VictimRegistered(_)) => {
            return Err(Error::StillRegistered {
                path: path.to_path_buf(),
                victim,
                preempt: match &preempt {
                    Some(Ok(())) => "the device reported success".to_owned(),
                    Some(Err(e)) => format!("the device answered: {}", chain(e)),
                    None => "not sent: the key was absent from the first report".to_owned(),
                },
                report: describe(&after),
            });
        }
        Err(NotCutOff::OwnKeyAbsent(_)) => {
            return Err(Error::OwnKeyMissing {
                path: path.to_path_buf(),
                own,
                report: describe(&after),
            });
        }
        Err(why) => {
            return Err(Error::NotCutOff {
                path: path.to_path_buf(),
                victim,
                why,
                report: describe(&after),
            });
        }
    };
    let how = match preempt {
        Some(Ok(())) => "removed by preempt-and-abort".to_owned(),
        Some(Err(e)) => format!("gone (the preempt answered: {})", chain(&e)),
        None => "already absent".to_owned(),
    };
    Ok(format!(
        "key {victim} {how}; reservation {} held{}; {}",
        cut.rtype,
        if acquired {
            " (none was held: acquired before the preempt)"
        } else {
            ""
        },
        describe(&after)
    ))
}

/// Whether `key` is registered on one device, with the report described; a report
/// without a reservation says so (with none, every host may write).
pub fn is_registered(
    dev: &dyn Reservations,
    path: &Path,
    key: Key,
) -> Result<(bool, String), Error> {
    let st = dev.report().map_err(cmd(path, "Reservation Report"))?;
    let mut report = describe(&st);
    if st.rtype == ReservationType::NONE {
        report.push_str(" (no reservation held: every host may write, registered or not)");
    }
    Ok((registered(&st, key), report))
}

/// `status` on one device: whether the host with `key` may still write there, by the
/// evidence rule ([`nvme_resv::report::cut_off`]): its key registered, or absent with
/// no reservation held that denies it. An absent key alone is not "off".
pub fn may_write(dev: &dyn Reservations, path: &Path, key: Key) -> Result<(bool, String), Error> {
    let st = dev.report().map_err(cmd(path, "Reservation Report"))?;
    Ok(match nvme_resv::report::cut_off(&st, key) {
        Ok(_) => (false, describe(&st)),
        Err(NotCutOff::VictimRegistered(_)) => (true, describe(&st)),
        Err(why) => (
            true,
            format!(
                "{} (key {key} absent but not cut off: {why})",
                describe(&st)
            ),
        ),
    })
}

type Work<T> = dyn Fn(&dyn Reservations, &Path) -> Result<T, Error> + Send + Sync;

/// Runs `work` on every device, each in its own thread, and collects the answers in
/// device order; a device that has not answered within `timeout` is a
/// [`Error::Timeout`] (its thread is left behind: the process exits soon after).
pub fn on_every_device<T: Send + 'static>(
    opener: &Arc<dyn Opener>,
    devices: &[PathBuf],
    timeout: Duration,
    work: Arc<Work<T>>,
) -> Vec<(PathBuf, Result<T, Error>)> {
    let (tx, rx) = mpsc::channel();
    for (i, path) in devices.iter().enumerate() {
        let (tx, opener, work, path) = (tx.clone(), opener.clone(), work.clone(), path.clone());
        std::thread::spawn(move || {
            let r = opener
                .open(&path)
                .map_err(cmd(&path, "open"))
                .and_then(|dev| work(dev.as_ref(), &path));
            // The receiver is gone only after the deadline: nothing to tell then.
            let _ = tx.send((i, r));
        });
    }
    drop(tx);
    let mut results: Vec<Option<Result<T, Error>>> = devices.iter().map(|_| None).collect();
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((i, r)) => results[i] = Some(r),
            Err(mpsc::RecvTimeoutError::Timeout) => break,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if results.iter().all(Option::is_some) {
            break;
        }
    }
    let timed_out = !results.iter().all(Option::is_some) && Instant::now() >= deadline;
    devices
        .iter()
        .zip(results)
        .map(|(p, r)| {
            let r = r.unwrap_or_else(|| {
                Err(if timed_out {
                    Error::Timeout {
                        path: p.clone(),
                        secs: timeout.as_secs(),
                    }
                } else {
                    Error::Worker { path: p.clone() }
                })
            });
            (p.clone(), r)
        })
        .collect()
}

/// What an action printed and its exit status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The API's exit status: 0 success (status: on), 1 failure, 2 status off.
    pub code: i32,
    /// Lines for standard output (the result line fence agents print).
    pub stdout: Vec<String>,
    /// Lines for standard error (per-device evidence, warnings, errors).
    pub stderr: Vec<String>,
}

impl Outcome {
    fn info(&mut self, s: &Settings, line: String) {
        if !s.quiet {
            self.stderr.push(format!("fence_nvme: {line}"));
        }
    }
    fn error(&mut self, line: String) {
        self.stderr.push(format!("fence_nvme: ERROR: {line}"));
    }
    /// Reports each device's evidence (or error, with its causes); returns the devices
    /// that failed, for the summary line.
    fn each_device<T: fmt::Display>(
        &mut self,
        s: &Settings,
        results: Vec<(PathBuf, Result<T, Error>)>,
    ) -> Vec<String> {
        let mut failed = Vec::new();
        for (p, r) in results {
            match r {
                Ok(ev) => self.info(s, format!("{}: {ev}", p.display())),
                Err(e) => {
                    self.error(chain(&e));
                    failed.push(p.display().to_string());
                }
            }
        }
        failed
    }

    fn failed(mut self, line: String) -> Self {
        self.code = 1;
        self.stderr.push(format!("Failed: {line}"));
        self
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for l in self.stderr.iter().chain(&self.stdout) {
            writeln!(f, "{l}")?;
        }
        write!(f, "exit {}", self.code)
    }
}

/// Runs a device action (`on`, `off`, `reboot`, `status`, `monitor`, `list`).
/// `metadata` and `validate-all` do not come here: they touch no device.
pub fn run(settings: &Settings, opener: &Arc<dyn Opener>) -> Outcome {
    let out = Outcome::default();
    match settings.action {
        Action::On => on(settings, opener, out),
        Action::Off | Action::Reboot => off(settings, opener, out),
        Action::Status => status(settings, opener, out),
        Action::Monitor => monitor(settings, opener, out),
        Action::List => list(settings, opener, out),
        Action::Metadata | Action::ValidateAll => out,
    }
}

fn target(s: &Settings) -> &Target {
    // Settings::from_input refuses these actions without a target.
    s.target
        .as_ref()
        .expect("on/off/reboot/status are validated to have a target")
}

fn on(s: &Settings, opener: &Arc<dyn Opener>, mut out: Outcome) -> Outcome {
    let t = target(s).clone();
    // One host registers one node's key: `on` runs on the node it unfences. A record of
    // another key means someone asked this host to register another node.
    match LocalState::load(&s.state_file) {
        Ok(prev) if prev.key != t.key => {
            return out.failed(format!(
                "this host registered as key {} ({}); refusing to register {t}: `on` unfences \
                 the node it runs on (if this host was renamed, remove {} first)",
                prev.key,
                prev.node.as_deref().unwrap_or("no name recorded"),
                s.state_file.display()
            ));
        }
        Ok(_) | Err(Error::NotUnfenced { .. }) => {}
        Err(e) => return out.failed(chain(&e)),
    }
    let (key, rtype) = (t.key, s.rtype);
    let results = on_every_device(
        opener,
        &s.devices,
        s.power_timeout,
        Arc::new(move |dev: &dyn Reservations, p: &Path| unfence(dev, p, key, rtype)),
    );
    let failed = out.each_device(s, results);
    if !failed.is_empty() {
        return out.failed(format!(
            "unfencing {t} failed on {} of {} device(s): {}",
            failed.len(),
            s.devices.len(),
            failed.join(", ")
        ));
    }
    let st = LocalState {
        node: t.name.clone(),
        key: t.key,
        devices: s.devices.clone(),
    };
    if let Err(e) = st.store(&s.state_file) {
        return out.failed(format!(
            "registered on every device, but recording it failed: {} (`off` from this node and \
             fence_nvme_check need it)",
            chain(&e)
        ));
    }
    out.stdout.push("Success: Powered ON".to_owned());
    out
}

fn off(s: &Settings, opener: &Arc<dyn Opener>, mut out: Outcome) -> Outcome {
    let t = target(s).clone();
    let me = match LocalState::load(&s.state_file) {
        Ok(me) => me,
        Err(e) => {
            return out.failed(format!(
                "cannot fence {t}: this node's own key is unknown: {}",
                chain(&e)
            ));
        }
    };
    let same_name = t.name.is_some() && t.name == me.node;
    if t.key == me.key || same_name {
        return out.failed(format!(
            "refusing to fence {t}: it is the node this agent runs on ({}, key {}); another \
             node must fence it",
            me.node.as_deref().unwrap_or("name not recorded"),
            me.key
        ));
    }
    if !s.delay.is_zero() {
        out.info(s, format!("waiting {} s (delay)", s.delay.as_secs()));
        std::thread::sleep(s.delay);
    }
    let (own, victim, rtype) = (me.key, t.key, s.rtype);
    let results = on_every_device(
        opener,
        &s.devices,
        s.power_timeout,
        Arc::new(move |dev: &dyn Reservations, p: &Path| sever(dev, p, own, victim, rtype)),
    );
    let failed = out.each_device(s, results);
    if !failed.is_empty() {
        return out.failed(format!(
            "fence of {t} not confirmed on {} of {} device(s): {}",
            failed.len(),
            s.devices.len(),
            failed.join(", ")
        ));
    }
    out.stdout.push("Success: Powered OFF".to_owned());
    out
}

fn status(s: &Settings, opener: &Arc<dyn Opener>, mut out: Outcome) -> Outcome {
    let t = target(s).clone();
    let key = t.key;
    let results = on_every_device(
        opener,
        &s.devices,
        s.power_timeout,
        Arc::new(move |dev: &dyn Reservations, p: &Path| may_write(dev, p, key)),
    );
    let (mut on, mut off, mut failed) = (Vec::new(), Vec::new(), Vec::new());
    for (p, r) in results {
        let name = p.display().to_string();
        match r {
            Ok((yes, report)) => {
                if s.verbose || report.contains("not cut off") {
                    out.info(s, format!("{name}: {report}"));
                }
                if yes { on.push(name) } else { off.push(name) }
            }
            Err(e) => {
                out.error(chain(&e));
                failed.push(name);
            }
        }
    }
    if !failed.is_empty() {
        // Cannot tell: an unreadable device is never taken as "off".
        return out.failed(format!(
            "status of {t} unknown: {} device(s) could not be read: {}",
            failed.len(),
            failed.join(", ")
        ));
    }
    if on.is_empty() {
        out.stdout.push("Status: OFF".to_owned());
        out.code = 2;
    } else {
        if !off.is_empty() {
            out.info(
                s,
                format!(
                    "{t} is registered on {} but not on {}",
                    on.join(", "),
                    off.join(", ")
                ),
            );
        }
        out.stdout.push("Status: ON".to_owned());
    }
    out
}

fn monitor(s: &Settings, opener: &Arc<dyn Opener>, mut out: Outcome) -> Outcome {
    let results = on_every_device(
        opener,
        &s.devices,
        s.power_timeout,
        Arc::new(|dev: &dyn Reservations, p: &Path| {
            dev.report()
                .map(|st| describe(&st))
                .map_err(cmd(p, "Reservation Report"))
        }),
    );
    let mut failed = Vec::new();
    for (p, r) in results {
        match r {
            Ok(ev) if s.verbose => out.info(s, format!("{}: {ev}", p.display())),
            Ok(_) => {}
            Err(e) => {
                out.error(chain(&e));
                failed.push(p.display().to_string());
            }
        }
    }
    if !failed.is_empty() {
        return out.failed(format!(
            "{} of {} device(s) unusable: {}",
            failed.len(),
            s.devices.len(),
            failed.join(", ")
        ));
    }
    out
}

fn list(s: &Settings, opener: &Arc<dyn Opener>, mut out: Outcome) -> Outcome {
    let results = on_every_device(
        opener,
        &s.devices,
        s.power_timeout,
        Arc::new(|dev: &dyn Reservations, p: &Path| {
            dev.report().map_err(cmd(p, "Reservation Report"))
        }),
    );
    let mut failed = false;
    for (p, r) in results {
        match r {
            Ok(st) => {
                for reg in &st.registrants {
                    out.stdout.push(format!("{},{}", reg.rkey, p.display()));
                }
            }
            Err(e) => {
                out.error(chain(&e));
                failed = true;
            }
        }
    }
    if failed {
        out.code = 1;
    }
    out
}

/// `fence_nvme_check`: 0 when this node's key (from the state file) is registered on
/// every device it was unfenced on, 2 when it is gone from any (this node was fenced:
/// the watchdog daemon reboots the host), 1 when a device cannot be read. No state
/// file: 0 (not unfenced yet, nothing to guard).
pub fn check(state_file: &Path, opener: &Arc<dyn Opener>, timeout: Duration) -> Outcome {
    let mut out = Outcome::default();
    let me = match LocalState::load(state_file) {
        Ok(me) => me,
        Err(Error::NotUnfenced { path }) => {
            out.stderr.push(format!(
                "fence_nvme_check: {} does not exist: not unfenced yet, nothing to check",
                path.display()
            ));
            return out;
        }
        Err(e) => {
            out.code = 1;
            out.stderr.push(format!("fence_nvme_check: {}", chain(&e)));
            return out;
        }
    };
    let key = me.key;
    let results = on_every_device(
        opener,
        &me.devices,
        timeout,
        Arc::new(move |dev: &dyn Reservations, p: &Path| is_registered(dev, p, key)),
    );
    let (mut gone, mut unreadable) = (Vec::new(), Vec::new());
    for (p, r) in results {
        match r {
            Ok((true, report)) => {
                if report.contains("no reservation held") {
                    out.stderr.push(format!(
                        "fence_nvme_check: {}: warning: {report}: a fence of any node on this device cuts nothing until a reservation is acquired (`fence_nvme -o on` or a fence acquires one)",
                        p.display()
                    ));
                }
            }
            Ok((false, report)) => {
                out.stderr.push(format!(
                    "fence_nvme_check: {}: this node's key {key} is gone ({report}): this node was fenced",
                    p.display()
                ));
                gone.push(p);
            }
            Err(e) => {
                out.stderr.push(format!("fence_nvme_check: {}", chain(&e)));
                unreadable.push(p);
            }
        }
    }
    out.code = if !gone.is_empty() {
        2
    } else if !unreadable.is_empty() {
        1
    } else {
        0
    };
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use nvme_resv::model;
    use nvme_resv::{Access, HostId, NvmeStatus, Operation};

    use super::*;
    use crate::options::Input;

    /// Paths to model hosts: one host's view of each namespace.
    #[derive(Clone, Default)]
    struct ModelOpener {
        hosts: HashMap<PathBuf, model::Host>,
        hang: Option<PathBuf>,
    }

    impl Opener for ModelOpener {
        fn open(&self, path: &Path) -> nvme_resv::Result<Device> {
            if self.hang.as_deref() == Some(path) {
                std::thread::sleep(Duration::from_secs(30));
            }
            match self.hosts.get(path) {
                Some(h) => Ok(Box::new(h.clone())),
                None => Err(nvme_resv::Error::NotNvme {
                    path: path.to_path_buf(),
                }),
            }
        }
    }

    /// Two namespaces shared by three hosts A, B, C; each host sees them as
    /// /dev/<h>1 and /dev/<h>2, and has its own state file.
    struct Cluster {
        ns: [model::Namespace; 2],
        dir: tempfile::TempDir,
    }

    impl Cluster {
        fn new() -> Self {
            Self {
                ns: [model::Namespace::new(), model::Namespace::new()],
                dir: tempfile::tempdir().unwrap(),
            }
        }
        fn host(&self, h: char) -> model::Host {
            self.ns[0].host(HostId([h as u8; 16]))
        }
        fn opener(&self, h: char) -> Arc<dyn Opener> {
            let mut o = ModelOpener::default();
            for (i, ns) in self.ns.iter().enumerate() {
                o.hosts.insert(
                    PathBuf::from(format!("/dev/{h}{}", i + 1)),
                    ns.host(HostId([h as u8; 16])),
                );
            }
            Arc::new(o)
        }
        /// Runs `stdin` as host `h` would get it from Pacemaker.
        fn run(&self, h: char, stdin: &str) -> Outcome {
            self.run_with(h, stdin, self.opener(h))
        }
        fn run_with(&self, h: char, stdin: &str, opener: Arc<dyn Opener>) -> Outcome {
            let text = format!(
                "{stdin}\ndevices=/dev/{h}1,/dev/{h}2\nstate_file={}/{h}.state\n",
                self.dir.path().display()
            );
            let s = Settings::from_input(&Input::from_stdin_text(&text).unwrap()).unwrap();
            run(&s, &opener)
        }
        fn keys(&self, i: usize) -> Vec<Key> {
            self.ns[i]
                .snapshot()
                .registrants
                .iter()
                .map(|r| r.rkey)
                .collect()
        }
        fn unfence_all(&self) {
            for (h, n) in [('a', "na"), ('b', "nb"), ('c', "nc")] {
                let o = self.run(h, &format!("action=on\nplug={n}"));
                assert_eq!(o.code, 0, "{o}");
            }
        }
    }

    fn k(n: &str) -> Key {
        nvme_resv::key_for_node(n)
    }

    #[test]
    fn on_registers_every_host_and_creates_one_reservation() {
        let c = Cluster::new();
        c.unfence_all();
        for i in 0..2 {
            assert_eq!(c.keys(i), [k("na"), k("nb"), k("nc")]);
            assert_eq!(
                c.ns[i].snapshot().rtype,
                ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS
            );
        }
        let st = LocalState::load(&c.dir.path().join("b.state")).unwrap();
        assert_eq!(st.key, k("nb"));
        assert_eq!(st.node.as_deref(), Some("nb"));
        // Idempotent: a second `on` registers nothing new and keeps the reservation.
        let before = c.ns[0].snapshot();
        assert_eq!(c.run('b', "action=on\nplug=nb").code, 0);
        let after = c.ns[0].snapshot();
        assert_eq!(c.keys(0), [k("na"), k("nb"), k("nc")]);
        assert_eq!((after.rtype, after.registrants.len()), (before.rtype, 3));
    }

    #[test]
    fn off_severs_the_victim_on_every_device_and_status_says_off() {
        let c = Cluster::new();
        c.unfence_all();
        assert_eq!(c.run('a', "action=status\nplug=nc").code, 0);
        c.host('c').check(Access::Write).unwrap();

        let o = c.run('a', "action=off\nplug=nc");
        assert_eq!(o.code, 0, "{o}");
        assert_eq!(o.stdout, ["Success: Powered OFF"]);
        assert_eq!(
            o.stderr
                .iter()
                .filter(|l| l.contains("removed by preempt-and-abort"))
                .count(),
            2,
            "{o}"
        );
        for i in 0..2 {
            assert_eq!(c.keys(i), [k("na"), k("nb")]);
        }
        assert!(
            c.host('c')
                .check(Access::Write)
                .unwrap_err()
                .is_reservation_conflict()
        );
        let st = c.run('b', "action=status\nplug=nc");
        assert_eq!(
            (st.code, st.stdout.as_slice()),
            (2, &["Status: OFF".to_owned()][..])
        );

        // A second off is idempotent: confirmed from the reports, no command sent.
        let generation = c.ns[0].snapshot().generation;
        let o = c.run('b', "action=reboot\nplug=nc");
        assert_eq!(o.code, 0, "{o}");
        assert_eq!(
            o.stderr
                .iter()
                .filter(|l| l.contains("already absent"))
                .count(),
            2,
            "{o}"
        );
        assert_eq!(c.ns[0].snapshot().generation, generation);
    }

    /// Releases the reservation on both namespaces (host A holds the record: it
    /// created it), every host staying registered: issue 26's `nvme resv-release`.
    fn release_all(c: &Cluster) {
        for ns in &c.ns {
            ns.host(HostId([b'a'; 16]))
                .release(&nvme_resv::Release::release(
                    k("na"),
                    ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS,
                ))
                .unwrap();
            assert_eq!(ns.snapshot().rtype, ReservationType::NONE);
        }
    }

    #[test]
    fn off_with_the_reservation_released_acquires_it_and_cuts_the_victim_off() {
        let c = Cluster::new();
        c.unfence_all();
        release_all(&c);
        // No reservation: the victim's absent key would not be "off".
        let st = c.run(
            'b',
            "action=status
plug=nc",
        );
        assert_eq!(st.code, 0, "{st}");
        let o = c.run(
            'b',
            "action=off
plug=nc",
        );
        assert_eq!(o.code, 0, "{o}");
        assert_eq!(
            o.stderr
                .iter()
                .filter(|l| l.contains("acquired before the preempt"))
                .count(),
            2,
            "{o}"
        );
        for ns in &c.ns {
            assert!(
                ns.host(HostId([b'c'; 16]))
                    .check(Access::Write)
                    .unwrap_err()
                    .is_reservation_conflict(),
                "Success printed while the victim writes: {o}"
            );
        }
        assert_eq!(
            c.run(
                'a',
                "action=status
plug=nc"
            )
            .code,
            2
        );
    }

    #[test]
    fn off_with_no_reservation_to_be_had_fails_loudly() {
        let c = Cluster::new();
        c.unfence_all();
        release_all(&c);
        c.ns[1].fail_next(
            Operation::Acquire,
            NvmeStatus::RESERVATION_CONFLICT.with_dnr(),
        );
        let o = c.run(
            'b',
            "action=off
plug=nc",
        );
        assert_eq!(o.code, 1, "{o}");
        assert!(o.stdout.is_empty(), "{o}");
        assert!(
            o.to_string().contains("/dev/b2: no reservation is held")
                && o.to_string().contains("not confirmed on 1 of 2"),
            "{o}"
        );
        // The check companion warns on the device without a reservation.
        let chk = check(
            &c.dir.path().join("b.state"),
            &c.opener('b'),
            Duration::from_secs(5),
        );
        assert_eq!(chk.code, 0, "{chk}");
        assert!(chk.to_string().contains("/dev/b2: warning"), "{chk}");
    }

    #[test]
    fn a_node_never_fences_itself() {
        let c = Cluster::new();
        c.unfence_all();
        for stdin in [
            "action=off\nplug=na",
            format!("action=off\nkey={}", k("na")).as_str(),
            format!("action=off\nplug=other\nkey={}", k("na")).as_str(),
        ] {
            let o = c.run('a', stdin);
            assert_eq!(o.code, 1, "{stdin}: {o}");
            assert!(o.to_string().contains("refusing to fence"), "{o}");
        }
        assert_eq!(c.keys(0), [k("na"), k("nb"), k("nc")]);
    }

    #[test]
    fn off_needs_this_node_unfenced_first() {
        let c = Cluster::new();
        c.unfence_all();
        std::fs::remove_file(c.dir.path().join("a.state")).unwrap();
        let o = c.run('a', "action=off\nplug=nc");
        assert_eq!(o.code, 1);
        assert!(o.to_string().contains("own key is unknown"), "{o}");
        assert_eq!(c.keys(0), [k("na"), k("nb"), k("nc")]);
    }

    #[test]
    fn a_refusing_device_fails_the_fence_and_is_named() {
        let c = Cluster::new();
        c.unfence_all();
        // Every preempt on the second namespace is refused.
        c.ns[1].fail_next(Operation::Acquire, NvmeStatus::RESERVATION_CONFLICT);
        let o = c.run('a', "action=off\nplug=nc");
        assert_eq!(o.code, 1, "{o}");
        let text = o.to_string();
        assert!(
            text.contains("not confirmed on 1 of 2 device(s): /dev/a2"),
            "{text}"
        );
        assert!(
            text.contains("/dev/a2: key") && text.contains("still registered"),
            "{text}"
        );
        assert!(
            text.contains("Reservation Conflict") || text.contains("conflict"),
            "{text}"
        );
        // The first device was still severed.
        assert_eq!(c.keys(0), [k("na"), k("nb")]);
        assert_eq!(c.keys(1), [k("na"), k("nb"), k("nc")]);
        // status: on (still registered somewhere).
        assert_eq!(c.run('a', "action=status\nplug=nc").code, 0);
        // Retried once the cause is gone: completes.
        assert_eq!(c.run('a', "action=off\nplug=nc").code, 0);
        assert_eq!(c.keys(1), [k("na"), k("nb")]);
    }

    #[test]
    fn a_preempt_that_claims_success_but_leaves_the_key_fails() {
        // Under Registrants Only the holder's preempt only changes the type (nvmet, and
        // the model): the command succeeds, the victim stays registered. The report,
        // not the answer, decides.
        let c = Cluster::new();
        let wero = "reservation_type=write-exclusive-registrants-only";
        for (h, n) in [('a', "na"), ('c', "nc")] {
            let o = c.run(h, &format!("action=on\nplug={n}\n{wero}"));
            assert_eq!(o.code, 0, "{o}");
        }
        assert_eq!(c.ns[0].snapshot().holder().map(|h| h.rkey), Some(k("na")));
        let o = c.run('a', &format!("action=off\nplug=nc\n{wero}"));
        assert_eq!(o.code, 1, "{o}");
        let text = o.to_string();
        assert!(
            text.contains("still registered after preempt-and-abort (the device reported success)"),
            "{text}"
        );
        assert_eq!(c.keys(0), [k("na"), k("nc")]);
    }

    #[test]
    fn an_unregistered_fencer_is_refused_before_any_command() {
        let c = Cluster::new();
        c.unfence_all();
        // A's key was preempted on the second namespace by B.
        c.ns[1]
            .host(HostId([b'b'; 16]))
            .acquire(&Acquire::preempt_and_abort(
                k("nb"),
                k("na"),
                ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS,
            ))
            .unwrap();
        let o = c.run('a', "action=off\nplug=nc");
        assert_eq!(o.code, 1);
        assert!(o.to_string().contains("/dev/a2: this node's key"), "{o}");
        assert_eq!(c.keys(1), [k("nb"), k("nc")]);
    }

    #[test]
    fn unreadable_devices_are_errors_never_off() {
        let c = Cluster::new();
        c.unfence_all();
        c.run('a', "action=off\nplug=nc");
        c.ns[0].fail_next(Operation::Report, NvmeStatus::INTERNAL);
        let o = c.run('a', "action=status\nplug=nc");
        assert_eq!(o.code, 1, "{o}");
        assert!(o.to_string().contains("status of node nc"), "{o}");
        // A fence whose re-read fails is not confirmed.
        c.ns[1].fail_next(Operation::Report, NvmeStatus::INTERNAL);
        let o = c.run('b', "action=off\nplug=nc");
        assert_eq!(o.code, 1, "{o}");
        assert!(o.to_string().contains("/dev/b2"), "{o}");
        // A device that does not exist.
        let mut opener = ModelOpener::default();
        opener
            .hosts
            .insert("/dev/a1".into(), c.ns[0].host(HostId([b'a'; 16])));
        let o = c.run_with('a', "action=off\nplug=nb", Arc::new(opener));
        assert_eq!(o.code, 1);
        assert!(o.to_string().contains("/dev/a2: open failed"), "{o}");
    }

    #[test]
    fn a_hung_device_fails_at_the_deadline() {
        let c = Cluster::new();
        c.unfence_all();
        let mut opener = ModelOpener::default();
        for (i, ns) in c.ns.iter().enumerate() {
            opener.hosts.insert(
                format!("/dev/a{}", i + 1).into(),
                ns.host(HostId([b'a'; 16])),
            );
        }
        opener.hang = Some("/dev/a2".into());
        let t0 = Instant::now();
        let o = c.run_with(
            'a',
            "action=off\nplug=nc\npower_timeout=1",
            Arc::new(opener),
        );
        assert!(t0.elapsed() < Duration::from_secs(10));
        assert_eq!(o.code, 1, "{o}");
        assert!(
            o.to_string().contains("/dev/a2: no answer within 1 s"),
            "{o}"
        );
        // The answering device was still fenced.
        assert_eq!(c.keys(0), [k("na"), k("nb")]);
    }

    #[test]
    fn on_refuses_to_register_another_nodes_key() {
        let c = Cluster::new();
        c.unfence_all();
        let o = c.run('a', "action=on\nplug=nb");
        assert_eq!(o.code, 1);
        assert!(
            o.to_string().contains("`on` unfences the node it runs on"),
            "{o}"
        );
    }

    #[test]
    fn on_refuses_a_reservation_of_another_type() {
        let c = Cluster::new();
        let o = c.run(
            'a',
            "action=on\nplug=na\nreservation_type=write-exclusive-registrants-only",
        );
        assert_eq!(o.code, 0, "{o}");
        let o = c.run('b', "action=on\nplug=nb");
        assert_eq!(o.code, 1, "{o}");
        assert!(
            o.to_string()
                .contains("holds Write Exclusive - Registrants Only"),
            "{o}"
        );
        assert!(!c.dir.path().join("b.state").exists());
    }

    #[test]
    fn monitor_and_list() {
        let c = Cluster::new();
        c.unfence_all();
        let o = c.run('a', "action=monitor");
        assert_eq!(o.code, 0, "{o}");
        let o = c.run('a', "action=list");
        assert_eq!(o.code, 0);
        assert_eq!(o.stdout.len(), 6);
        assert!(o.stdout.contains(&format!("{},/dev/a2", k("nc"))));
        let o = c.run_with('a', "action=monitor", Arc::new(ModelOpener::default()));
        assert_eq!(o.code, 1);
        assert!(o.to_string().contains("2 of 2 device(s) unusable"), "{o}");
    }

    #[test]
    fn check_companion() {
        let c = Cluster::new();
        let state = c.dir.path().join("c.state");
        // Not unfenced yet: nothing to guard.
        assert_eq!(
            check(&state, &c.opener('c'), Duration::from_secs(5)).code,
            0
        );
        c.unfence_all();
        assert_eq!(
            check(&state, &c.opener('c'), Duration::from_secs(5)).code,
            0
        );
        // Gone from one device: non-zero, naming it.
        c.ns[1]
            .host(HostId([b'a'; 16]))
            .acquire(&Acquire::preempt_and_abort(
                k("na"),
                k("nc"),
                ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS,
            ))
            .unwrap();
        let o = check(&state, &c.opener('c'), Duration::from_secs(5));
        assert_eq!(o.code, 2, "{o}");
        assert!(o.to_string().contains("/dev/c2: this node's key"), "{o}");
        // Unreadable: 1.
        let none: Arc<dyn Opener> = Arc::new(ModelOpener::default());
        let o = check(&state, &none, Duration::from_secs(5));
        assert_eq!(o.code, 1, "{o}");
    }
}
