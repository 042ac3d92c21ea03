//! The `metadata` action's XML, in the shape fence-agents print and validate against
//! their `metadata.rng` (Debian: `/usr/share/cluster/relaxng/metadata.rng`): every
//! parameter with `unique`, `required`, `<getopt mixed>`, `<content type>` and a
//! `<shortdesc lang="en">`; actions with `on_target="1" automatic="1"` on `on`, which
//! tells Pacemaker to unfence a node (run `on` on it) before it starts resources.

use std::fmt::Write as _;

use crate::options::{Kind, PARAMS, getopt_mixed};

/// One-line description.
pub const SHORTDESC: &str = "Fence agent for NVMe persistent reservations";

/// What the agent does and what it needs, for `pcs stonith describe`.
pub const LONGDESC: &str = "fence_nvme is an I/O fencing agent that uses NVMe persistent \
reservations to cut a node off shared NVMe namespaces (NVMe over Fabrics targets, dual-ported \
SSDs, EBS io2 Multi-Attach volumes). Each node registers its own reservation key on every device \
when Pacemaker unfences it (the \"on\" action runs on the node itself); the first one also creates \
a Write Exclusive - All Registrants reservation, so only registered nodes can write. To fence a \
node, \"off\" removes its key from every device with Reservation Acquire (preempt and abort), \
re-reads every device's reservation report and reports success only when the key is gone from \
all of them. The fenced node's next write fails in the device; it must be rebooted (or its \
watchdog, with fence_nvme_check, reboots it) before it registers again. Keys are derived from \
node names as the fenced daemon derives them (FNV-1a 64), so both can guard the same namespace.";

/// Actions in the order the metadata lists them. `reboot` and `list` work but are not
/// advertised: like fence_scsi, this is fabric fencing, so Pacemaker maps a reboot to
/// `off` (and unfences with `on` when the node rejoins); and `list` prints keys, not
/// node names, so it must not become a dynamic host list.
pub const ADVERTISED_ACTIONS: [&str; 6] =
    ["off", "status", "monitor", "metadata", "validate-all", "on"];

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// The metadata document for an agent installed as `name`.
pub fn xml(name: &str) -> String {
    let mut x = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(x, "<?xml version=\"1.0\" ?>");
    let _ = writeln!(
        x,
        "<resource-agent name=\"{}\" shortdesc=\"{}\" >",
        escape(name),
        escape(SHORTDESC)
    );
    let _ = writeln!(x, "<longdesc>{}</longdesc>", escape(LONGDESC));
    let _ = writeln!(x, "<vendor-url></vendor-url>");
    let _ = writeln!(x, "<parameters>");
    for p in PARAMS {
        let mut attrs = format!(
            "name=\"{}\" unique=\"0\" required=\"{}\"",
            p.name,
            u8::from(p.required)
        );
        if p.deprecated_for.is_some() {
            attrs.push_str(" deprecated=\"1\"");
        }
        if let Some(old) = p.obsoletes {
            let _ = write!(attrs, " obsoletes=\"{old}\"");
        }
        let _ = writeln!(x, "\t<parameter {attrs}>");
        let _ = writeln!(x, "\t\t<getopt mixed=\"{}\" />", escape(&getopt_mixed(p)));
        let default = p
            .default
            .map(|d| format!(" default=\"{}\"", escape(d)))
            .unwrap_or_default();
        match p.kind {
            Kind::Select(choices) => {
                let _ = writeln!(x, "\t\t<content type=\"select\"{default} >");
                for c in choices {
                    let _ = writeln!(x, "\t\t\t<option value=\"{}\" />", escape(c));
                }
                let _ = writeln!(x, "\t\t</content>");
            }
            kind => {
                let t = match kind {
                    Kind::Boolean => "boolean",
                    Kind::Second => "second",
                    _ => "string",
                };
                let _ = writeln!(x, "\t\t<content type=\"{t}\"{default} />");
            }
        }
        let _ = writeln!(
            x,
            "\t\t<shortdesc lang=\"en\">{}</shortdesc>",
            escape(p.shortdesc)
        );
        let _ = writeln!(x, "\t</parameter>");
    }
    let _ = writeln!(x, "</parameters>");
    let _ = writeln!(x, "<actions>");
    for a in ADVERTISED_ACTIONS {
        if a == "on" {
            let _ = writeln!(x, "\t<action name=\"on\" on_target=\"1\" automatic=\"1\"/>");
        } else {
            let _ = writeln!(x, "\t<action name=\"{a}\" />");
        }
    }
    let _ = writeln!(x, "</actions>");
    let _ = writeln!(x, "</resource-agent>");
    x
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Action;

    #[test]
    fn every_parameter_appears_once_with_its_attributes() {
        let x = xml("fence_nvme");
        for p in PARAMS {
            let open = format!("<parameter name=\"{}\" unique=\"0\"", p.name);
            assert_eq!(x.matches(&open).count(), 1, "{}", p.name);
        }
        assert!(x.contains(
            "<parameter name=\"devices\" unique=\"0\" required=\"1\">\n\t\t<getopt mixed=\"-d, --devices=[devices]\" />\n\t\t<content type=\"string\" />"
        ));
        assert!(
            x.contains("<parameter name=\"port\" unique=\"0\" required=\"0\" deprecated=\"1\">")
        );
        assert!(
            x.contains("<parameter name=\"plug\" unique=\"0\" required=\"0\" obsoletes=\"port\">")
        );
        assert!(x.contains("<content type=\"second\" default=\"20\" />"));
        assert!(x.contains(
            "<content type=\"select\" default=\"write-exclusive-all-registrants\" >\n\t\t\t<option value=\"write-exclusive-all-registrants\" />"
        ));
        assert!(x.contains("<content type=\"boolean\" />"));
    }

    #[test]
    fn on_is_unfencing_on_the_target_and_automatic() {
        let x = xml("fence_nvme");
        assert!(x.contains("<action name=\"on\" on_target=\"1\" automatic=\"1\"/>"));
        for a in ["off", "status", "monitor", "metadata", "validate-all"] {
            assert!(x.contains(&format!("<action name=\"{a}\" />")), "{a}");
            assert!(
                Action::parse(a).is_some(),
                "{a} is advertised but not accepted"
            );
        }
        // Fabric fencing: no reboot advertised (Pacemaker maps it to off), no list.
        assert!(!x.contains("<action name=\"reboot\""));
        assert!(!x.contains("<action name=\"list\""));
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(escape("<a & \"b\">"), "&lt;a &amp; &quot;b&quot;&gt;");
        let x = xml("fence_<x>");
        assert!(x.contains("name=\"fence_&lt;x&gt;\""));
        // The only raw '<' and '>' are markup: every text node is escaped.
        assert!(!x.contains("Exclusive - All Registrants\" <"));
    }
}
