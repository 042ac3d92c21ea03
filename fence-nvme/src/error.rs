//! The crate's one error type: what a parameter, this node's state record or a device
//! did wrong. Every variant names what it is about (the parameter, the file, the
//! device) and carries the cause (OS error, NVMe status) as its source; [`chain`]
//! prints an error with its causes.

use std::io;
use std::path::PathBuf;

use nvme_resv::{InvalidNodeId, Key, ReservationType};

use crate::action::Action;

/// Why an action could not be done or confirmed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- the input: each names the parameter and says what to give ----
    /// An unknown command-line flag (standard input only warns).
    #[error("unknown option {flag} (see --help)")]
    UnknownFlag {
        /// The flag as given.
        flag: String,
    },
    /// A flag that takes a value was last on the command line.
    #[error("option {flag} needs a value")]
    MissingValue {
        /// The flag as given.
        flag: String,
    },
    /// A boolean given a value that is not one of the accepted spellings.
    #[error("{param}={value:?} is not a boolean (use 1/yes/on/true or 0/no/off/false)")]
    NotBoolean {
        /// The parameter.
        param: &'static str,
        /// The value as given.
        value: String,
    },
    /// An action this agent does not have.
    #[error(
        "unrecognised action {0:?} (use on, off, reboot, status, monitor, metadata, validate-all or list)"
    )]
    UnknownAction(String),
    /// A required parameter is missing or empty.
    #[error("parameter {param} is required for action {action}: {hint}")]
    MissingParam {
        /// The parameter.
        param: &'static str,
        /// The action that needs it.
        action: Action,
        /// What to give.
        hint: &'static str,
    },
    /// A device path that cannot be a device node.
    #[error(
        "devices: {path:?} is not an absolute path (give /dev/nvmeXnY, /dev/ngXnY or /dev/disk/by-id/...)"
    )]
    BadDevice {
        /// The entry as given.
        path: String,
    },
    /// The same device listed twice.
    #[error("devices: {path:?} is listed twice")]
    DuplicateDevice {
        /// The entry as given.
        path: String,
    },
    /// A key that is not 1-16 hexadecimal digits, or is 0.
    #[error(
        "key={value:?} is not a reservation key (1 to 16 hexadecimal digits, optional 0x, not 0)"
    )]
    BadKey {
        /// The value as given.
        value: String,
    },
    /// A node name that `fenced` would refuse, so no key can be derived from it.
    #[error("{param}: no key can be derived from this name (fix it, or give key=)")]
    BadNodeName {
        /// `plug` or `nodename`.
        param: &'static str,
        /// Why.
        #[source]
        source: InvalidNodeId,
    },
    /// Not a whole number of seconds.
    #[error("{param}={value:?} is not a whole number of seconds")]
    BadSeconds {
        /// The parameter.
        param: &'static str,
        /// The value as given.
        value: String,
    },
    /// Not one of a select parameter's values.
    #[error("{param}={value:?} is not one of: {}", choices.join(", "))]
    BadChoice {
        /// The parameter.
        param: &'static str,
        /// The value as given.
        value: String,
        /// The accepted values.
        choices: &'static [&'static str],
    },

    // ---- this node's state record (written by `on`) ----
    /// No record: this node has not been unfenced (`on`) since the host started.
    #[error(
        "{} does not exist: this node has not been unfenced since it started (Pacemaker runs \
         `on` on a node before it starts resources; run `fence_nvme -o on -n <this node> -d ...`)",
        path.display()
    )]
    NotUnfenced {
        /// The path.
        path: PathBuf,
    },
    /// Reading or writing failed.
    #[error("{what} {}", path.display())]
    StateIo {
        /// `reading`, `writing`, ...
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The file is not a record this agent wrote.
    #[error("{} line {line}: {why} (remove the file and run `on` again)", path.display())]
    StateInvalid {
        /// The path.
        path: PathBuf,
        /// 1-based line number (0: the file as a whole).
        line: usize,
        /// What is wrong.
        why: &'static str,
    },

    // ---- a device: each names it ----
    /// A command failed or the device could not be opened.
    #[error("{}: {step} failed", path.display())]
    Command {
        /// The device.
        path: PathBuf,
        /// What was being done.
        step: &'static str,
        /// The cause (OS error or NVMe status).
        #[source]
        source: nvme_resv::Error,
    },
    /// The victim's key is still in the report after the preempt.
    #[error(
        "{}: key {victim} is still registered after preempt-and-abort ({preempt}); {report}",
        path.display()
    )]
    StillRegistered {
        /// The device.
        path: PathBuf,
        /// The key that should be gone.
        victim: Key,
        /// What the preempt answered.
        preempt: String,
        /// The report that still lists it.
        report: String,
    },
    /// `off`: no reservation is held on the device (with none every host may write, so
    /// a preempt cuts nothing) and acquiring one with our key failed.
    #[error(
        "{}: no reservation is held (with none every host may write, so removing key {victim} \
         would cut nothing) and acquiring {rtype} with this node's key {own} failed: {answer}; \
         {report}; not fenced",
        path.display()
    )]
    NoReservation {
        /// The device.
        path: PathBuf,
        /// Our key.
        own: Key,
        /// The victim's key.
        victim: Key,
        /// The type asked for.
        rtype: nvme_resv::ReservationType,
        /// What the acquire answered.
        answer: String,
        /// The report.
        report: String,
    },
    /// `off`: the report after the preempt is no evidence that the victim is cut off
    /// (the evidence rule, `nvme_resv::report::fence_evidence`).
    #[error("{}: key {victim} is not cut off: {why}; {report}; not fenced", path.display())]
    NotCutOff {
        /// The device.
        path: PathBuf,
        /// The victim's key.
        victim: Key,
        /// Why the report is not evidence.
        why: nvme_resv::report::NotCutOff,
        /// The report.
        report: String,
    },
    /// This node's own key is not registered: it cannot fence through this device
    /// (the device would refuse) and its word about the device is worth nothing.
    #[error(
        "{}: this node's key {own} is not registered ({report}): it was fenced itself or was \
         never unfenced on this device; refusing to fence through it",
        path.display()
    )]
    OwnKeyMissing {
        /// The device.
        path: PathBuf,
        /// Our key.
        own: Key,
        /// The report.
        report: String,
    },
    /// `on`: the key is not in the report after registering.
    #[error("{}: key {key} is not in the report after Register ({report})", path.display())]
    NotRegistered {
        /// The device.
        path: PathBuf,
        /// The key.
        key: Key,
        /// The report.
        report: String,
    },
    /// `on`: the device holds a reservation of another type than configured.
    #[error(
        "{}: the device holds {held}, this agent is configured for {want} ({report}); \
         set reservation_type to match, or clear the reservation while the cluster is stopped",
        path.display()
    )]
    WrongType {
        /// The device.
        path: PathBuf,
        /// What the device holds.
        held: ReservationType,
        /// What the agent wants.
        want: ReservationType,
        /// The report.
        report: String,
    },
    /// The device did not answer before the deadline.
    #[error("{}: no answer within {secs} s (power_timeout); the command may still complete", path.display())]
    Timeout {
        /// The device.
        path: PathBuf,
        /// The deadline in seconds.
        secs: u64,
    },
    /// The worker thread died (a bug).
    #[error("{}: worker thread failed", path.display())]
    Worker {
        /// The device.
        path: PathBuf,
    },
}

/// An error with its sources, `: `-separated (the OS or NVMe cause is a source).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}
