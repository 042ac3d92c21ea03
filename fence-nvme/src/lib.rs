//! `fence_nvme`: a Pacemaker fence agent for NVMe persistent reservations, on
//! [`nvme_resv`].
//!
//! The agent follows the fence agent API as Pacemaker's fencer calls agents
//! (fence-agents' `FenceAgentAPI.md` and `fencing.py` conventions): parameters as
//! `key=value` lines on standard input or the equivalent flags ([`options`]); actions
//! `on` (unfence this node), `off`/`reboot` (fence another), `status`, `monitor`,
//! `metadata`, `validate-all`, `list`; exit status 0 success, 1 failure, and for
//! `status` 2 when the node is off. [`agent`] holds the actions over any
//! [`nvme_resv::Reservations`], [`metadata`] the XML, [`state`] the record `on` leaves
//! for `off` and for the watchdog companions `fence_nvme_check` and
//! `fence_nvme_check_hardreboot` ([`watchdog`]).
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod action;
pub mod agent;
pub mod error;
pub mod metadata;
pub mod options;
pub mod state;
pub mod watchdog;

use std::io::Read;
use std::sync::Arc;

use agent::{NamespaceOpener, Opener, Outcome};
pub use error::{Error, chain};
use options::{Action, Input, Settings};

/// The agent's version, printed by `--version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Runs the agent as the `fence_nvme` binary does: `args` without the program name,
/// `stdin` read only when there are no arguments.
pub fn main_with(
    name: &str,
    args: &[String],
    stdin: &mut dyn Read,
    opener: &Arc<dyn Opener>,
) -> Outcome {
    let mut out = Outcome::default();
    let input = if args.is_empty() {
        let mut text = String::new();
        if let Err(e) = stdin.read_to_string(&mut text) {
            out.code = 1;
            out.stderr.push(format!(
                "Failed: reading parameters from standard input: {e}"
            ));
            return out;
        }
        Input::from_stdin_text(&text)
    } else {
        Input::from_args(args)
    };
    let input = match input {
        Ok(i) => i,
        Err(e) => {
            out.code = 1;
            out.stderr.push(format!("Failed: {e}"));
            return out;
        }
    };
    for w in &input.warnings {
        out.stderr.push(format!("fence_nvme: WARNING: {w}"));
    }
    if input.flag("help") {
        out.stdout.push(options::usage());
        return out;
    }
    if input.flag("version") {
        out.stdout.push(VERSION.to_owned());
        return out;
    }
    // metadata needs no other parameter (Pacemaker asks for it with none).
    if input
        .get("action")
        .and_then(Action::parse)
        .is_some_and(|a| a == Action::Metadata)
    {
        out.stdout.push(metadata::xml(name));
        return out;
    }
    // fence-agents' run_delay: an `off` (or `reboot`) waits its `delay` first, before
    // any check of the other parameters can end it, so no fence from this node starts
    // sooner than configured and upstream's delay check (`delay=10` followed by
    // parameters that are then refused) holds. Nothing is skipped: every check below
    // still runs, after the wait. Other actions are not delayed (status, monitor and
    // unfencing must answer at once).
    if input
        .get("action")
        .map_or(Some(Action::Off), Action::parse)
        .is_some_and(|a| matches!(a, Action::Off | Action::Reboot))
    {
        if let Some(d) = options::delay_of(&input).filter(|d| !d.is_zero()) {
            out.stderr.push(format!(
                "fence_nvme: waiting {} s (delay) before the fence",
                d.as_secs()
            ));
            std::thread::sleep(d);
        }
    }
    let mut settings = match Settings::from_input(&input) {
        Ok(s) => s,
        Err(e) => {
            out.code = 1;
            out.stderr.push(format!("Failed: {}", chain(&e)));
            return out;
        }
    };
    // Served above, before the checks.
    settings.delay = std::time::Duration::ZERO;
    if settings.action == Action::ValidateAll {
        return out;
    }
    let mut res = agent::run(&settings, opener);
    out.stderr.append(&mut res.stderr);
    res.stderr = out.stderr;
    res
}

/// The real devices.
pub fn real_devices() -> Arc<dyn Opener> {
    Arc::new(NamespaceOpener)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str], stdin: &str) -> Outcome {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        main_with("fence_nvme", &args, &mut stdin.as_bytes(), &real_devices())
    }

    #[test]
    fn metadata_needs_nothing_else() {
        for o in [run(&["-o", "metadata"], ""), run(&[], "action=metadata\n")] {
            assert_eq!(o.code, 0, "{o}");
            assert!(o.stdout[0].starts_with("<?xml"));
            assert!(o.stdout[0].contains("<resource-agent name=\"fence_nvme\""));
        }
    }

    #[test]
    fn stdin_is_ignored_when_arguments_are_given() {
        let o = run(&["-o", "validate-all", "-d", "/dev/x"], "action=explode\n");
        assert_eq!(o.code, 0, "{o}");
    }

    #[test]
    fn exit_codes_without_a_device() {
        // validate-all touches no device: 0 for good parameters, 1 for bad.
        assert_eq!(
            run(&[], "action=validate-all\ndevices=/dev/nvme0n1\n").code,
            0
        );
        let o = run(&[], "action=validate-all\ndevices=/dev/nvme0n1\nkey=0\n");
        assert_eq!(o.code, 1);
        assert!(
            o.stderr.last().unwrap().starts_with("Failed: key=\"0\""),
            "{o}"
        );
        // Unknown action, missing devices, unknown flag: 1.
        assert_eq!(run(&[], "action=explode\ndevices=/dev/x\n").code, 1);
        assert_eq!(run(&[], "action=off\nplug=n1\n").code, 1);
        // An unknown flag is warned about and ignored; the missing devices fail.
        let o = run(&["--bogus", "-o", "validate-all"], "");
        assert_eq!(o.code, 1, "{o}");
        assert!(
            o.stderr[0].contains("ignoring unknown option \"--bogus\""),
            "{o}"
        );
        assert!(o.stderr[1].contains("devices is required"), "{o}");
        assert_eq!(
            run(&["--bogus", "-o", "validate-all", "-d", "/dev/x"], "").code,
            0
        );
        // A device path that does not exist: 1 for off (after the own-key check), and
        // status is an error (1), never "off" (2).
        let dir = tempfile::tempdir().unwrap();
        let st = dir.path().join("state");
        state::LocalState {
            node: Some("n1".into()),
            key: nvme_resv::key_for_node("n1"),
            devices: vec!["/nonexistent/nvme9n9".into()],
        }
        .store(&st)
        .unwrap();
        for action in ["off", "status"] {
            let o = run(
                &[],
                &format!(
                    "action={action}\nplug=n2\ndevices=/nonexistent/nvme9n9\nstate_file={}\n",
                    st.display()
                ),
            );
            assert_eq!(o.code, 1, "{action}: {o}");
            assert!(
                o.to_string().contains("/nonexistent/nvme9n9: open failed: cannot open /nonexistent/nvme9n9: No such file or directory"),
                "{o}"
            );
        }
        assert_eq!(run(&["-h"], "").code, 0);
        assert_eq!(run(&["-V"], "").stdout, [VERSION]);
    }

    #[test]
    fn unknown_stdin_parameters_are_warned_about() {
        let o = run(
            &[],
            "action=validate-all\ndevices=/dev/x\npcmk_host_check=none\n",
        );
        assert_eq!(o.code, 0);
        assert!(o.stderr[0].contains("WARNING: ignoring unknown parameter \"pcmk_host_check\""));
    }
}
