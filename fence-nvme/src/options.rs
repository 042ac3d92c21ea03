//! The fence agent API's input: `key=value` lines on standard input (how Pacemaker's
//! fencer calls an agent) or the equivalent command-line flags (how a person does),
//! resolved once into typed [`Settings`].
//!
//! The conventions are fence-agents' (`fencing.py`): an agent given any argument reads
//! only its command line, otherwise only standard input; on standard input `#` lines
//! and blank lines are skipped, a value may be wrapped in double quotes, a name may be
//! spelled with `-` or `_`, `port` is the old name of `plug`, and an unknown name is
//! reported and ignored (Pacemaker passes parameters of its own).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use nvme_resv::{InvalidNodeId, Key, NodeId, ReservationType};

pub use crate::action::Action;
use crate::error::Error;

/// A parameter's value type, as the metadata's `<content type=...>` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A flag: on the command line it takes no value; on standard input `1/yes/on/true`
    /// or `0/no/off/false`.
    Boolean,
    /// Free text.
    String,
    /// Whole seconds.
    Second,
    /// One of the listed values.
    Select(&'static [&'static str]),
}

/// One parameter of the agent, with everything its metadata and its parsers need.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    /// The name on standard input and in the metadata.
    pub name: &'static str,
    /// The one-letter flag, if any.
    pub short: Option<char>,
    /// The long flag without `--`.
    pub long: &'static str,
    /// What the value is.
    pub kind: Kind,
    /// Whether the metadata marks it required.
    pub required: bool,
    /// Default value shown in the metadata.
    pub default: Option<&'static str>,
    /// `Some(new)`: a deprecated name of `new` (metadata `deprecated="1"`).
    pub deprecated_for: Option<&'static str>,
    /// `Some(old)`: this name replaces `old` (metadata `obsoletes="old"`).
    pub obsoletes: Option<&'static str>,
    /// The value placeholder in the usage text (`--devices=[devices]`).
    pub placeholder: &'static str,
    /// One-line description.
    pub shortdesc: &'static str,
}

impl Param {
    /// What an entry of [`PARAMS`] does not say: optional, no default, no short flag
    /// or placeholder, neither deprecated nor replacing an older name.
    const OPTIONAL: Param = Param {
        name: "",
        short: None,
        long: "",
        kind: Kind::String,
        required: false,
        default: None,
        deprecated_for: None,
        obsoletes: None,
        placeholder: "",
        shortdesc: "",
    };
}

/// Where `on` records this node's registration; `off` reads our own key from it and
/// `fence_nvme_check` reads the key and the devices.
pub const DEFAULT_STATE_FILE: &str = "/run/fence_nvme/state";

/// The reservation types whose registrants may write (the only ones a cluster of
/// writers can share), by their parameter spelling.
pub const RESERVATION_TYPES: [(&str, ReservationType); 4] = [
    (
        "write-exclusive-all-registrants",
        ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS,
    ),
    (
        "exclusive-access-all-registrants",
        ReservationType::EXCLUSIVE_ACCESS_ALL_REGISTRANTS,
    ),
    (
        "write-exclusive-registrants-only",
        ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY,
    ),
    (
        "exclusive-access-registrants-only",
        ReservationType::EXCLUSIVE_ACCESS_REGISTRANTS_ONLY,
    ),
];
const RESERVATION_TYPE_NAMES: [&str; 4] = [
    RESERVATION_TYPES[0].0,
    RESERVATION_TYPES[1].0,
    RESERVATION_TYPES[2].0,
    RESERVATION_TYPES[3].0,
];

const PLUG_DESC: &str = "Name of the node to fence (or, for \"on\", of the node it runs on). \
Its reservation key is FNV-1a 64 of the name, the key the fenced daemon uses for the same node \
id. Pacemaker sets it from pcmk_host_map or the node name. Ignored when key is given.";

/// Every parameter, in metadata order.
pub const PARAMS: &[Param] = &[
    Param {
        name: "action",
        short: Some('o'),
        long: "action",
        kind: Kind::String,
        required: true,
        default: Some("off"),
        placeholder: "[action]",
        shortdesc: "The action to perform",
        ..Param::OPTIONAL
    },
    Param {
        name: "devices",
        short: Some('d'),
        long: "devices",
        kind: Kind::String,
        required: true,
        placeholder: "[devices]",
        shortdesc: "Comma-separated list of NVMe namespaces shared by the cluster: /dev/nvmeXnY, \
/dev/ngXnY or, best since it names the same namespace on every node, \
/dev/disk/by-id/nvme-eui.* or nvme-uuid.*. Each must support reservations.",
        ..Param::OPTIONAL
    },
    Param {
        name: "key",
        short: Some('k'),
        long: "key",
        kind: Kind::String,
        placeholder: "[key]",
        shortdesc: "Reservation key (hexadecimal, up to 16 digits, not 0) of the node: for \"on\" \
the key this node registers, for \"off\" the key to remove. Default: derived from plug.",
        ..Param::OPTIONAL
    },
    Param {
        name: "plug",
        short: Some('n'),
        long: "plug",
        kind: Kind::String,
        obsoletes: Some("port"),
        placeholder: "[nodename]",
        shortdesc: PLUG_DESC,
        ..Param::OPTIONAL
    },
    Param {
        name: "port",
        short: Some('n'),
        long: "plug",
        kind: Kind::String,
        deprecated_for: Some("plug"),
        placeholder: "[nodename]",
        shortdesc: PLUG_DESC,
        ..Param::OPTIONAL
    },
    Param {
        name: "nodename",
        long: "nodename",
        kind: Kind::String,
        placeholder: "[nodename]",
        shortdesc: "Name of the target node as Pacemaker passes it; used when plug is not given.",
        ..Param::OPTIONAL
    },
    Param {
        name: "reservation_type",
        long: "reservation-type",
        kind: Kind::Select(&RESERVATION_TYPE_NAMES),
        default: Some("write-exclusive-all-registrants"),
        placeholder: "[type]",
        shortdesc: "Reservation type created by \"on\" and required on every device. Write \
Exclusive - All Registrants (the default, as the fenced daemon holds) lets any registrant fence \
any other; under a Registrants Only type the holder's preempt may leave the victim registered.",
        ..Param::OPTIONAL
    },
    Param {
        name: "state_file",
        long: "state-file",
        kind: Kind::String,
        default: Some(DEFAULT_STATE_FILE),
        placeholder: "[path]",
        shortdesc: "Where \"on\" records this node's key and devices: \"off\" fences others with \
that key, fence_nvme_check watches it. Leave the default unless several simulated hosts share \
one machine.",
        ..Param::OPTIONAL
    },
    Param {
        name: "quiet",
        short: Some('q'),
        long: "quiet",
        kind: Kind::Boolean,
        shortdesc: "Print no per-device lines, only the result and errors.",
        ..Param::OPTIONAL
    },
    Param {
        name: "verbose",
        short: Some('v'),
        long: "verbose",
        kind: Kind::Boolean,
        shortdesc: "Also print each device's reservation report.",
        ..Param::OPTIONAL
    },
    Param {
        name: "version",
        short: Some('V'),
        long: "version",
        kind: Kind::Boolean,
        shortdesc: "Print the version and exit",
        ..Param::OPTIONAL
    },
    Param {
        name: "help",
        short: Some('h'),
        long: "help",
        kind: Kind::Boolean,
        shortdesc: "Print the options and exit",
        ..Param::OPTIONAL
    },
    Param {
        name: "delay",
        long: "delay",
        kind: Kind::Second,
        default: Some("0"),
        placeholder: "[seconds]",
        shortdesc: "Seconds to wait before an off starts (staggers nodes that fence each other)",
        ..Param::OPTIONAL
    },
    Param {
        name: "power_timeout",
        long: "power-timeout",
        kind: Kind::Second,
        default: Some("20"),
        placeholder: "[seconds]",
        shortdesc: "Seconds every device has to answer an action; a device silent that long fails it",
        ..Param::OPTIONAL
    },
];

/// Looks a parameter up by a name as given on standard input (`-` or `_`).
fn param_by_name(name: &str) -> Option<&'static Param> {
    let norm = name.replace('-', "_");
    PARAMS
        .iter()
        .find(|p| p.name == norm || p.long.replace('-', "_") == norm)
}

/// The `delay` parameter when it is a valid number of seconds (an invalid one is
/// reported by [`Settings::from_input`]).
pub fn delay_of(input: &Input) -> Option<Duration> {
    match input.get("delay").map(str::trim) {
        None | Some("") => Some(Duration::ZERO),
        Some(v) => v.parse::<u64>().ok().map(Duration::from_secs),
    }
}

/// The key of node `name`: [`nvme_resv::NodeId::key`], so the name must pass the rule
/// `fenced` applies to node ids (1 to 63 characters from `[A-Za-z0-9._-]`, starting
/// with a letter or digit) and a node has the same key under both tools.
pub fn node_key(name: &str) -> Result<Key, InvalidNodeId> {
    NodeId::new(name).map(|id| id.key())
}

/// Parses a reservation key: 1-16 hexadecimal digits, optional `0x`, never 0.
pub fn parse_key(s: &str) -> Option<Key> {
    let t = s.trim();
    let hex = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    if hex.is_empty() || hex.len() > 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    match u64::from_str_radix(hex, 16) {
        Ok(0) | Err(_) => None,
        Ok(v) => Some(Key(v)),
    }
}

/// The raw input: parameter name to value (booleans as `"1"`/`"0"`), after aliases.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Input {
    values: Vec<(&'static str, String)>,
    /// Lines that were ignored, each with the reason (printed as warnings).
    pub warnings: Vec<String>,
}

impl Input {
    /// The value of parameter `name` (the canonical name: `plug` also answers `port`).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether boolean parameter `name` is set.
    pub fn flag(&self, name: &str) -> bool {
        self.get(name) == Some("1")
    }

    fn set(&mut self, p: &'static Param, value: String) {
        self.values
            .push((p.deprecated_for.unwrap_or(p.name), value));
    }

    /// Parses standard input's `key=value` lines.
    pub fn from_stdin_text(text: &str) -> Result<Self, Error> {
        let mut input = Self::default();
        for raw in text.lines() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, value) = line.split_once('=').unwrap_or((line, ""));
            let (name, value) = (name.trim(), value.trim());
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value);
            let Some(p) = param_by_name(name) else {
                input
                    .warnings
                    .push(format!("ignoring unknown parameter {name:?}"));
                continue;
            };
            let value = match p.kind {
                Kind::Boolean => bool_value(p.name, value)?.to_owned(),
                _ => value.to_owned(),
            };
            input.set(p, value);
        }
        Ok(input)
    }

    /// Parses command-line arguments (without the program name), as fence-agents'
    /// `getopt` calls accept them: `-o off`, `-ooff`, `--action off`, `--action=off`
    /// (a name may be spelled with `-` or `_`, `--port` is `--plug`); booleans take no
    /// value and stack (`-vq`). Unknown options and stray words are warned about and
    /// ignored, never fatal (medik8s' Fence Agents Remediation passes `--ip=`,
    /// `--username=` and the like to every agent): an unknown `--name=value` is one
    /// warning, an unknown `--name value` two (the value is a stray word then). `--`
    /// ends the options. Only a known option without its value is an error.
    pub fn from_args<S: AsRef<str>>(args: &[S]) -> Result<Self, Error> {
        let mut input = Self::default();
        let mut i = 0;
        let mut options_ended = false;
        while i < args.len() {
            let arg = args[i].as_ref();
            i += 1;
            if options_ended || arg == "-" || !arg.starts_with('-') {
                input
                    .warnings
                    .push(format!("ignoring unused argument {arg:?}"));
                continue;
            }
            if arg == "--" {
                options_ended = true;
                continue;
            }
            // (parameter, value given in the same word)
            let mut found: Vec<(&'static Param, Option<String>)> = Vec::new();
            if let Some(long) = arg.strip_prefix("--") {
                let (name, inline) = match long.split_once('=') {
                    Some((n, v)) => (n, Some(v.to_owned())),
                    None => (long, None),
                };
                match param_by_flag_name(name) {
                    Some(p) => found.push((p, inline)),
                    None => {
                        input
                            .warnings
                            .push(format!("ignoring unknown option {arg:?}"));
                        continue;
                    }
                }
            } else {
                // -o off, -ooff, -vq, -vo off: booleans stack; the first letter that
                // takes a value takes the rest of the word, or the next argument.
                let mut rest = &arg[1..];
                while let Some(c) = rest.chars().next() {
                    rest = &rest[c.len_utf8()..];
                    let Some(p) = PARAMS
                        .iter()
                        .find(|p| p.short == Some(c) && p.deprecated_for.is_none())
                    else {
                        input
                            .warnings
                            .push(format!("ignoring unknown option -{c} (in {arg:?})"));
                        continue;
                    };
                    if p.kind == Kind::Boolean {
                        found.push((p, None));
                    } else {
                        found.push((p, (!rest.is_empty()).then(|| rest.to_owned())));
                        break;
                    }
                }
            }
            for (p, inline) in found {
                if p.kind == Kind::Boolean {
                    let v = match inline {
                        Some(v) => bool_value(p.name, &v)?,
                        None => "1",
                    };
                    input.set(p, v.to_owned());
                    continue;
                }
                let value = match inline {
                    Some(v) => v,
                    None => {
                        let v = args.get(i).ok_or_else(|| Error::MissingValue {
                            flag: arg.to_owned(),
                        })?;
                        i += 1;
                        v.as_ref().to_owned()
                    }
                };
                input.set(p, value);
            }
        }
        Ok(input)
    }
}

/// Looks a parameter up by a long option's name: its `--flag` name or its parameter
/// name, `-` and `_` alike (`--power-timeout`, `--power_timeout`, `--port`).
fn param_by_flag_name(name: &str) -> Option<&'static Param> {
    let norm = name.replace('_', "-");
    PARAMS
        .iter()
        .find(|p| p.long == norm && p.deprecated_for.is_none())
        .or_else(|| PARAMS.iter().find(|p| p.name.replace('_', "-") == norm))
}

fn bool_value(param: &'static str, value: &str) -> Result<&'static str, Error> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "yes" | "on" | "true" => Ok("1"),
        "0" | "no" | "off" | "false" => Ok("0"),
        _ => Err(Error::NotBoolean {
            param,
            value: value.to_owned(),
        }),
    }
}

/// The node an action is about, and its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The node's name (`plug`, else `nodename`), when one was given.
    pub name: Option<String>,
    /// The key: `key` if given, else derived from the name.
    pub key: Key,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(n) => write!(f, "node {n} (key {})", self.key),
            None => write!(f, "key {}", self.key),
        }
    }
}

/// Everything an action needs, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The action.
    pub action: Action,
    /// The namespaces, in the order given.
    pub devices: Vec<PathBuf>,
    /// The target node (on, off, reboot, status; for validate-all when given).
    pub target: Option<Target>,
    /// The reservation type `on` creates and every device must hold.
    pub rtype: ReservationType,
    /// Where `on` records this node's registration.
    pub state_file: PathBuf,
    /// Wait before fencing.
    pub delay: Duration,
    /// Per-action deadline for every device's answer.
    pub power_timeout: Duration,
    /// Per-device lines suppressed.
    pub quiet: bool,
    /// Reports printed.
    pub verbose: bool,
}

impl Settings {
    /// Validates the input for its action. `metadata` and `--help`/`--version` are
    /// handled before this and need nothing.
    pub fn from_input(input: &Input) -> Result<Self, Error> {
        let action_s = input.get("action").unwrap_or("off");
        let action =
            Action::parse(action_s).ok_or_else(|| Error::UnknownAction(action_s.to_owned()))?;
        let mut devices: Vec<PathBuf> = Vec::new();
        for d in input
            .get("devices")
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
        {
            if !d.starts_with('/') {
                return Err(Error::BadDevice { path: d.to_owned() });
            }
            if devices.iter().any(|x| x.as_os_str() == d) {
                return Err(Error::DuplicateDevice { path: d.to_owned() });
            }
            devices.push(PathBuf::from(d));
        }
        if devices.is_empty() && action != Action::Metadata {
            return Err(Error::MissingParam {
                param: "devices",
                action,
                hint: "a comma-separated list of the shared NVMe namespaces",
            });
        }

        let name = [
            ("plug", input.get("plug")),
            ("nodename", input.get("nodename")),
        ]
        .into_iter()
        .find_map(|(p, v)| v.filter(|v| !v.is_empty()).map(|v| (p, v)));
        let key = match input.get("key").filter(|k| !k.is_empty()) {
            Some(k) => Some(parse_key(k).ok_or_else(|| Error::BadKey {
                value: k.to_owned(),
            })?),
            None => None,
        };
        let target = match (name, key) {
            (name, Some(key)) => Some(Target {
                name: name.map(|(_, n)| n.to_owned()),
                key,
            }),
            (Some((param, n)), None) => Some(Target {
                name: Some(n.to_owned()),
                key: node_key(n).map_err(|source| Error::BadNodeName { param, source })?,
            }),
            (None, None) => None,
        };
        if target.is_none() && action.needs_target() {
            return Err(Error::MissingParam {
                param: "plug",
                action,
                hint: "the node's name (plug, port or nodename) or its key",
            });
        }

        let rtype_s = input
            .get("reservation_type")
            .unwrap_or(RESERVATION_TYPES[0].0);
        let rtype = RESERVATION_TYPES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(rtype_s))
            .map(|(_, t)| *t)
            .ok_or_else(|| Error::BadChoice {
                param: "reservation_type",
                value: rtype_s.to_owned(),
                choices: &RESERVATION_TYPE_NAMES,
            })?;
        let seconds = |param: &'static str, default: u64| -> Result<Duration, Error> {
            match input.get(param) {
                None | Some("") => Ok(Duration::from_secs(default)),
                Some(v) => v
                    .trim()
                    .parse::<u64>()
                    .map(Duration::from_secs)
                    .map_err(|_| Error::BadSeconds {
                        param,
                        value: v.to_owned(),
                    }),
            }
        };
        Ok(Self {
            action,
            devices,
            target,
            rtype,
            state_file: PathBuf::from(
                input
                    .get("state_file")
                    .filter(|s| !s.is_empty())
                    .unwrap_or(DEFAULT_STATE_FILE),
            ),
            delay: delay_of(input).ok_or_else(|| Error::BadSeconds {
                param: "delay",
                value: input.get("delay").unwrap_or_default().to_owned(),
            })?,
            power_timeout: seconds("power_timeout", 20)?,
            quiet: input.flag("quiet"),
            verbose: input.flag("verbose"),
        })
    }
}

/// The `--help` text.
pub fn usage() -> String {
    let mut s = String::from(
        "Usage:\n\tfence_nvme [options]\n\tfence_nvme < key=value lines (as Pacemaker calls it)\nOptions:\n",
    );
    for p in PARAMS.iter().filter(|p| p.deprecated_for.is_none()) {
        let flag = getopt_mixed(p);
        s.push_str(&format!("   {flag:<36} {}\n", p.shortdesc));
    }
    s
}

/// The `<getopt mixed=...>` text of a parameter: `-d, --devices=[devices]`.
pub fn getopt_mixed(p: &Param) -> String {
    let long = if p.placeholder.is_empty() {
        format!("--{}", p.long)
    } else {
        format!("--{}={}", p.long, p.placeholder)
    };
    match p.short {
        Some(c) => format!("-{c}, {long}"),
        None => long,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(stdin: &str) -> Result<Settings, Error> {
        Settings::from_input(&Input::from_stdin_text(stdin).unwrap())
    }

    /// [`Param::OPTIONAL`] leaves these empty: every entry must set them.
    #[test]
    fn every_param_has_a_name_a_flag_and_a_description() {
        for p in PARAMS {
            assert!(
                !p.name.is_empty() && !p.long.is_empty() && !p.shortdesc.is_empty(),
                "{p:?}"
            );
        }
    }

    #[test]
    fn stdin_lines_as_pacemaker_sends_them() {
        let s = settings(
            "# comment\n\naction=off\nplug=node-2\nnodename=node-2\n\
             devices=\"/dev/nvme0n1,/dev/disk/by-id/nvme-eui.0123\"\n\
             power-timeout=7\nreservation_type=write-exclusive-registrants-only\n",
        )
        .unwrap();
        assert_eq!(s.action, Action::Off);
        assert_eq!(
            s.devices,
            [
                PathBuf::from("/dev/nvme0n1"),
                PathBuf::from("/dev/disk/by-id/nvme-eui.0123")
            ]
        );
        let t = s.target.unwrap();
        assert_eq!(t.name.as_deref(), Some("node-2"));
        assert_eq!(t.key, nvme_resv::key_for_node("node-2"));
        assert_eq!(s.power_timeout, Duration::from_secs(7));
        assert_eq!(s.rtype, ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY);
        assert_eq!(s.delay, Duration::ZERO);
        assert_eq!(s.state_file, PathBuf::from(DEFAULT_STATE_FILE));
    }

    #[test]
    fn unknown_stdin_names_warn_and_are_ignored() {
        let input =
            Input::from_stdin_text("action=status\nport=n1\npcmk_host_list=n1\ndevices=/dev/x\n")
                .unwrap();
        assert_eq!(input.warnings.len(), 1, "{:?}", input.warnings);
        assert!(input.warnings[0].contains("pcmk_host_list"));
        // `port` is the old name of `plug`.
        assert_eq!(input.get("plug"), Some("n1"));
        assert_eq!(Settings::from_input(&input).unwrap().action, Action::Status);
    }

    #[test]
    fn flags_mirror_stdin() {
        let from_flags = Settings::from_input(
            &Input::from_args(&[
                "-o",
                "off",
                "--plug=node-2",
                "-d/dev/nvme0n1,/dev/ng1n1",
                "--power-timeout",
                "7",
                "-q",
            ])
            .unwrap(),
        )
        .unwrap();
        let from_stdin = settings(
            "action=off\nplug=node-2\ndevices=/dev/nvme0n1,/dev/ng1n1\npower_timeout=7\nquiet=1\n",
        )
        .unwrap();
        assert_eq!(from_flags, from_stdin);
        assert!(from_flags.quiet);
        // Stacked booleans.
        let i = Input::from_args(&["-vq", "-o", "status"]).unwrap();
        assert!(i.flag("verbose") && i.flag("quiet"));
        assert_eq!(i.get("action"), Some("status"));
    }

    #[test]
    fn unknown_flags_and_stray_words_warn_and_are_ignored() {
        // What medik8s' Fence Agents Remediation passes every agent, beside ours.
        let i = Input::from_args(&[
            "--ip=192.0.2.1",
            "--username",
            "admin",
            "--action=off",
            "--plug=node2",
            "--devics=/dev/x",
            "-a",
            "-x9",
            "--",
            "-o",
            "on",
        ])
        .unwrap();
        assert_eq!(i.get("action"), Some("off"));
        assert_eq!(i.get("plug"), Some("node2"));
        assert_eq!(i.get("devices"), None);
        assert_eq!(
            i.warnings,
            [
                "ignoring unknown option \"--ip=192.0.2.1\"",
                "ignoring unknown option \"--username\"",
                "ignoring unused argument \"admin\"",
                "ignoring unknown option \"--devics=/dev/x\"",
                "ignoring unknown option -a (in \"-a\")",
                "ignoring unknown option -x (in \"-x9\")",
                "ignoring unknown option -9 (in \"-x9\")",
                "ignoring unused argument \"-o\"",
                "ignoring unused argument \"on\"",
            ]
        );
        // A misspelt required parameter still fails, on the parameter.
        let e = Settings::from_input(&i).unwrap_err();
        assert!(
            crate::error::chain(&e).contains("devices is required"),
            "{e}"
        );
        // Only a known option without its value is an error.
        assert!(matches!(
            Input::from_args(&["-o"]),
            Err(Error::MissingValue { flag }) if flag == "-o"
        ));
        assert!(matches!(
            Input::from_args(&["--devices"]),
            Err(Error::MissingValue { flag }) if flag == "--devices"
        ));
        assert!(matches!(
            Input::from_stdin_text("verbose=maybe\n"),
            Err(Error::NotBoolean { .. })
        ));
    }

    #[test]
    fn long_options_by_flag_or_parameter_name() {
        let i = Input::from_args(&[
            "--port=n2",
            "--power_timeout=9",
            "--reservation-type",
            "exclusive-access-all-registrants",
            "--state_file=/tmp/s",
            "--verbose=yes",
            "--quiet=0",
            "--devices=/dev/a,/dev/b",
        ])
        .unwrap();
        assert!(i.warnings.is_empty(), "{:?}", i.warnings);
        let s = Settings::from_input(&i).unwrap();
        assert_eq!(s.target.unwrap().name.as_deref(), Some("n2"));
        assert_eq!(s.power_timeout, Duration::from_secs(9));
        assert_eq!(s.rtype, ReservationType::EXCLUSIVE_ACCESS_ALL_REGISTRANTS);
        assert_eq!(s.state_file, PathBuf::from("/tmp/s"));
        assert!(s.verbose && !s.quiet);
    }

    #[test]
    fn short_options_stack_until_one_takes_a_value() {
        let i = Input::from_args(&["-vqoreboot", "-nnode2", "-k", "beef", "-d/dev/a"]).unwrap();
        assert!(i.warnings.is_empty(), "{:?}", i.warnings);
        let s = Settings::from_input(&i).unwrap();
        assert_eq!(s.action, Action::Reboot);
        assert!(s.verbose && s.quiet);
        assert_eq!(
            s.target,
            Some(Target {
                name: Some("node2".into()),
                key: Key(0xbeef)
            })
        );
        assert_eq!(s.devices, [PathBuf::from("/dev/a")]);
    }

    #[test]
    fn explicit_key_wins_over_the_name() {
        let s = settings("action=off\nplug=node-2\nkey=0xABCD\ndevices=/dev/x\n").unwrap();
        assert_eq!(s.target.unwrap().key, Key(0xabcd));
        let s = settings("action=off\nkey=beef\ndevices=/dev/x\n").unwrap();
        assert_eq!(
            s.target,
            Some(Target {
                name: None,
                key: Key(0xbeef)
            })
        );
        // plug wins over nodename (pcmk_host_map maps the node name to plug).
        let s = settings("action=off\nplug=n7\nnodename=host7.example\ndevices=/dev/x\n").unwrap();
        assert_eq!(s.target.unwrap().key, nvme_resv::key_for_node("n7"));
    }

    #[test]
    fn invalid_values_name_the_parameter() {
        for (stdin, want) in [
            ("action=explode\ndevices=/dev/x\n", "unrecognised action"),
            ("action=off\nplug=n1\n", "devices is required"),
            ("action=off\ndevices=/dev/x\n", "plug is required"),
            (
                "action=off\nplug=n1\ndevices=nvme0n1\n",
                "not an absolute path",
            ),
            (
                "action=off\nplug=n1\ndevices=/dev/a,/dev/a\n",
                "listed twice",
            ),
            (
                "action=off\nkey=0\ndevices=/dev/x\n",
                "not a reservation key",
            ),
            (
                "action=off\nkey=0x12345678901234567\ndevices=/dev/x\n",
                "not a reservation key",
            ),
            (
                "action=off\nkey=xyz\ndevices=/dev/x\n",
                "not a reservation key",
            ),
            (
                "action=off\nplug=a/b\ndevices=/dev/x\n",
                "character '/' not allowed",
            ),
            (
                "action=off\nplug=n1\ndevices=/dev/x\ndelay=soon\n",
                "delay=\"soon\"",
            ),
            (
                "action=off\nplug=n1\ndevices=/dev/x\nreservation_type=write-exclusive\n",
                "is not one of",
            ),
        ] {
            let e = crate::error::chain(&settings(stdin).unwrap_err());
            assert!(e.contains(want), "{stdin:?}: {e}");
        }
    }

    #[test]
    fn validate_all_and_monitor_need_no_target() {
        assert_eq!(
            settings("action=validate-all\ndevices=/dev/x\n")
                .unwrap()
                .target,
            None
        );
        assert_eq!(
            settings("action=monitor\ndevices=/dev/x\n").unwrap().action,
            Action::Monitor
        );
        // But what is given is still checked.
        assert!(settings("action=validate-all\ndevices=/dev/x\nkey=0\n").is_err());
    }

    #[test]
    fn action_aliases() {
        for (s, a) in [
            ("enable", Action::On),
            ("disable", Action::Off),
            ("meta-data", Action::Metadata),
            ("REBOOT", Action::Reboot),
        ] {
            assert_eq!(Action::parse(s), Some(a));
        }
        assert_eq!(Action::parse("list-status"), None);
    }

    #[test]
    fn node_keys_match_fenced() {
        // FNV-1a 64 reference vector: the same function fenced uses.
        assert_eq!(node_key("a").unwrap(), Key(0xaf63_dc4c_8601_ec8c));
        assert_eq!(node_key(""), Err(InvalidNodeId::Empty));
        assert!(matches!(
            node_key(&"x".repeat(64)),
            Err(InvalidNodeId::TooLong { .. })
        ));
        assert!(matches!(
            node_key("-a"),
            Err(InvalidNodeId::BadChar { ch: '-', .. })
        ));
        assert!(node_key("node1.example.com").is_ok());
    }

    #[test]
    fn usage_lists_every_flag_once() {
        let u = usage();
        for p in PARAMS.iter().filter(|p| p.deprecated_for.is_none()) {
            assert_eq!(u.matches(&format!("--{}", p.long)).count(), 1, "{}", p.long);
        }
    }
}
