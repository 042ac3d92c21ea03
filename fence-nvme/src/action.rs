//! The fence agent API's actions (`action=` on standard input, `-o`/`--action`).

use std::fmt;

/// What the agent is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Unfence the local node: register its key on every device (creating the
    /// reservation if none exists). Pacemaker runs it on the target itself.
    On,
    /// Fence the target: preempt-and-abort its key on every device, then require it
    /// gone from every device's report.
    Off,
    /// The same as `off`: storage fencing cuts access, it cannot power-cycle a host.
    Reboot,
    /// Whether the target's key is registered: exit 0 (on), 2 (off), 1 (cannot tell).
    Status,
    /// Whether every device can be used: opens, supports reservations, answers a report.
    Monitor,
    /// Prints the agent's metadata XML.
    Metadata,
    /// Checks the parameters without touching any device.
    ValidateAll,
    /// Prints each key registered on each device (not advertised: keys are not node
    /// names, so Pacemaker must not use it as a dynamic host list).
    List,
}

impl Action {
    /// Parses an action name, with fence-agents' aliases (`enable`/`disable` of fabric
    /// agents, OCF's `meta-data`). Case-insensitive.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.to_ascii_lowercase().as_str() {
            "on" | "enable" => Self::On,
            "off" | "disable" => Self::Off,
            "reboot" => Self::Reboot,
            "status" => Self::Status,
            "monitor" => Self::Monitor,
            "metadata" | "meta-data" => Self::Metadata,
            "validate-all" => Self::ValidateAll,
            "list" => Self::List,
            _ => return None,
        })
    }

    /// The API name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::On => "on",
            Self::Off => "off",
            Self::Reboot => "reboot",
            Self::Status => "status",
            Self::Monitor => "monitor",
            Self::Metadata => "metadata",
            Self::ValidateAll => "validate-all",
            Self::List => "list",
        }
    }

    /// Whether the action names a target node (`plug`, `nodename` or `key`).
    pub const fn needs_target(self) -> bool {
        matches!(self, Self::On | Self::Off | Self::Reboot | Self::Status)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
