//! The binaries as Pacemaker and the watchdog daemon run them: parameters on standard
//! input, results in the exit status. No device is needed: these are the paths that
//! end before one (or at a path that is not one).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn agent(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fence_nvme"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn fence_nvme");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// The watchdog companions. Only outcomes other than 2 are ever produced here (no
/// state, unreadable devices, usage): the hard-reboot variant reboots on a 2, and this
/// runs on the build machine. The 2 and the reboot are tested in `watchdog`'s unit
/// tests (injected reboot) and in the guest (a real one).
fn check_bin(bin: &str, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("spawn {bin}: {e}"))
}

const CHECKS: [&str; 2] = [
    env!("CARGO_BIN_EXE_fence_nvme_check"),
    env!("CARGO_BIN_EXE_fence_nvme_check_hardreboot"),
];

fn check(args: &[&str]) -> Output {
    check_bin(CHECKS[0], args)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn metadata_on_stdin_prints_the_xml() {
    let o = agent(&[], "action=metadata\n");
    assert_eq!(o.status.code(), Some(0));
    let x = text(&o.stdout);
    assert!(x.starts_with("<?xml version=\"1.0\" ?>\n<resource-agent name=\"fence_nvme\""));
    assert!(x.trim_end().ends_with("</resource-agent>"));
    assert!(o.stderr.is_empty(), "{}", text(&o.stderr));
}

#[test]
fn exit_statuses() {
    // The lines pacemaker-fenced sends for a validate.
    let o = agent(
        &[],
        "nodename=node1\naction=validate-all\nport=node1\ndevices=/dev/nvme0n1\n",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let o = agent(&[], "action=validate-all\ndevices=/dev/nvme0n1\nkey=0\n");
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).starts_with("Failed: key=\"0\""));
    // status of a path that is not a device: an error (1), never "off" (2).
    let o = agent(
        &[],
        "nodename=n2\naction=status\nport=n2\ndevices=/nonexistent/nvme9n9\n",
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("/nonexistent/nvme9n9: open failed"));
    assert!(o.stdout.is_empty());
    // off without this node's state: refused before any device is touched.
    let dir = tempfile::tempdir().unwrap();
    let o = agent(
        &[
            "-o",
            "off",
            "-n",
            "n2",
            "-d",
            "/nonexistent/nvme9n9",
            "--state-file",
            dir.path().join("state").to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("this node's own key is unknown"));
}

#[test]
fn watchdog_check_statuses() {
    for bin in CHECKS {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let s = state.to_str().unwrap();
        // Not unfenced: nothing to guard.
        let o = check_bin(bin, &["test", "--state-file", s]);
        assert_eq!(o.status.code(), Some(0), "{bin}");
        // A recorded device that cannot be read: 1 (not a reboot: the key is not known
        // to be gone).
        std::fs::write(&state, "key=0x1234\ndevice=/nonexistent/nvme9n9\n").unwrap();
        let o = check_bin(bin, &["test", "--state-file", s]);
        assert_eq!(o.status.code(), Some(1), "{bin}");
        assert!(text(&o.stderr).contains("/nonexistent/nvme9n9"), "{bin}");
        assert!(!text(&o.stderr).contains("rebooting"), "{bin}");
        // watchdog's repair call: nothing to repair, the error stands.
        assert_eq!(
            check_bin(bin, &["repair", "2"]).status.code(),
            Some(2),
            "{bin}"
        );
        let o = check_bin(bin, &["--bogus"]);
        assert_eq!(o.status.code(), Some(1), "{bin}");
        assert!(text(&o.stderr).contains("usage:"), "{bin}");
    }
    assert!(text(&check(&["--bogus"]).stderr).starts_with("fence_nvme_check: "));
}

/// fence-agents' `xml-check` filter (`AWK_VAL` in their make/agentpycheck.mk): the line
/// after a parameter whose name ends in `_path` or `_file` is kept and the one after
/// that (its `<content ... default=...>`, which differs between systems) dropped. The
/// committed file is the filtered output, as upstream's `xml-upload` writes it.
fn upstream_xml_filter(xml: &str) -> String {
    let mut out = String::new();
    let mut store: i32 = -1;
    for line in xml.lines() {
        if let Some(i) = line.find("name=\"") {
            let rest = &line[i + 6..];
            if rest.contains("_path\"") || rest.contains("_file\"") {
                store = 2;
            }
        }
        if store != 0 {
            out.push_str(line);
            out.push('\n');
        }
        store -= 1;
    }
    out
}

/// upstream's `make check` `xml-check`: the metadata against the committed file. A
/// change to a parameter, a description or an action shows up here, in review.
#[test]
fn metadata_matches_the_committed_file() {
    let committed =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/metadata/fence_nvme.xml");
    let want = std::fs::read_to_string(&committed).unwrap();
    let o = agent(&["-o", "metadata"], "");
    assert_eq!(o.status.code(), Some(0));
    let got = upstream_xml_filter(&text(&o.stdout));
    assert!(
        got == want,
        "fence_nvme -o metadata differs from {} (if the change is meant, regenerate it: \
         fence_nvme -o metadata | awk 'BEGIN {{store=-1}} /name=\".*_path\"/ || /name=\".*_file\"/ \
         {{store=2}} {{if (store!=0) {{print}}; store--}}' > {0})\n--- got\n{got}",
        committed.display()
    );
    // The filter drops exactly the state file's default, the one system-dependent line.
    assert_eq!(
        text(&o.stdout).lines().count(),
        got.lines().count() + 1,
        "the filter should drop one line"
    );
    assert!(!got.contains("default=\"/run/fence_nvme/state\""));
}

/// upstream's test arguments (`FENCE_TEST_ARGS` in agents/Makefile.am, after `printf`:
/// each line after the first starts with a space), with `delay=N` first.
fn upstream_delay_input(delay: u64) -> String {
    format!(
        "delay={delay}\n login=test\n passwd=test\n ipaddr=test\n port=1\n managed=1\n \
         devices=test\n session_url=http://test\n email=test@test.te\n ping_targets=localhost"
    )
}

/// upstream's `make check` `delay-check`, with 2 s instead of 10: the default action
/// (off here, reboot upstream) with `delay=2` takes at least 2 s, although
/// `devices=test` is then refused; with `delay=0` it is refused at once.
#[test]
fn delay_is_served_before_the_parameters_are_refused() {
    let t = Instant::now();
    let o = agent(&[], &upstream_delay_input(2));
    let took = t.elapsed();
    assert!(
        took >= Duration::from_secs(2),
        "took {took:?}: {}",
        text(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(err.contains("waiting 2 s (delay)"), "{err}");
    assert!(
        err.contains("Failed: devices: \"test\" is not an absolute path"),
        "{err}"
    );
    assert!(
        err.contains("ignoring unknown parameter \"login\""),
        "{err}"
    );
    let t = Instant::now();
    let o = agent(&[], &upstream_delay_input(0));
    assert!(t.elapsed() < Duration::from_secs(2));
    assert_eq!(o.status.code(), Some(1));
    // The command-line form (fence-agents' agentccheck.mk: `--delay N ARGS --`).
    let t = Instant::now();
    let o = agent(
        &[
            "--delay", "2", "-o", "reboot", "-n", "1", "-d", "test", "--",
        ],
        "",
    );
    assert!(t.elapsed() >= Duration::from_secs(2));
    assert_eq!(o.status.code(), Some(1));
}

/// Like fence-agents, only a fence waits: status, monitor, unfencing and metadata answer
/// at once whatever the delay.
#[test]
fn only_off_and_reboot_are_delayed() {
    for stdin in [
        "action=status\ndelay=5\nport=n2\ndevices=/nonexistent/nvme9n9\n",
        "action=monitor\ndelay=5\ndevices=/nonexistent/nvme9n9\n",
        "action=metadata\ndelay=5\n",
        "action=validate-all\ndelay=5\ndevices=/dev/nvme0n1\n",
    ] {
        let t = Instant::now();
        let o = agent(&[], stdin);
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "{stdin:?} was delayed"
        );
        assert!(!text(&o.stderr).contains("waiting"), "{stdin:?}");
    }
}

/// A state file for "this node" n1 on a path that is not a device, so an `off` of
/// node2 gets as far as the device and names it: proof every parameter arrived.
fn n1_state(dir: &Path) -> String {
    let st = dir.join("state");
    std::fs::write(&st, "node=n1\nkey=0x1234\ndevice=/nonexistent/nvme9n9\n").unwrap();
    st.to_str().unwrap().to_owned()
}

fn assert_off_reached_the_device(o: &Output) {
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("/nonexistent/nvme9n9: open failed")
            && err.contains("Failed: fence of node node2 (key 0x"),
        "{err}"
    );
}

/// Convention 1: `key=value` lines on standard input (Pacemaker's fencer), unknown
/// names warned about and ignored.
#[test]
fn convention_stdin_key_value() {
    let dir = tempfile::tempdir().unwrap();
    let st = n1_state(dir.path());
    let o = agent(
        &[],
        &format!(
            "nodename=node2\naction=off\nport=node2\ndevices=/nonexistent/nvme9n9\n\
             state_file={st}\npcmk_host_list=node1 node2\n"
        ),
    );
    assert_off_reached_the_device(&o);
    assert!(text(&o.stderr).contains("ignoring unknown parameter \"pcmk_host_list\""));
}

/// Convention 2: `--key=value` long options, as medik8s' Fence Agents Remediation
/// passes them (with parameters meant for power agents, which are ignored).
#[test]
fn convention_long_options() {
    let dir = tempfile::tempdir().unwrap();
    let st = n1_state(dir.path());
    let o = agent(
        &[
            "--ip=192.0.2.10",
            "--username=admin",
            "--password=secret",
            "--lanplus",
            "--action=off",
            "--plug=node2",
            "--devices=/nonexistent/nvme9n9",
            &format!("--state-file={st}"),
        ],
        "",
    );
    assert_off_reached_the_device(&o);
    let err = text(&o.stderr);
    for w in [
        "--ip=192.0.2.10",
        "--username=admin",
        "--password=secret",
        "--lanplus",
    ] {
        assert!(
            err.contains(&format!("ignoring unknown option \"{w}\"")),
            "{w}: {err}"
        );
    }
    // And the space-separated form.
    let o = agent(
        &[
            "--action",
            "validate-all",
            "--plug",
            "node2",
            "--devices",
            "/dev/nvme0n1",
        ],
        "",
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

/// Convention 3: fence-agents' short options (`-o` action, `-n` plug, `-d` devices,
/// `-k` key, `-v`, `-q`), unknown letters warned about and ignored.
#[test]
fn convention_short_options() {
    let dir = tempfile::tempdir().unwrap();
    let st = n1_state(dir.path());
    let o = agent(
        &[
            "-o",
            "off",
            "-n",
            "node2",
            "-d",
            "/nonexistent/nvme9n9",
            "-a",
            "192.0.2.10",
            "--state-file",
            &st,
        ],
        "",
    );
    assert_off_reached_the_device(&o);
    let err = text(&o.stderr);
    assert!(err.contains("ignoring unknown option -a"), "{err}");
    assert!(
        err.contains("ignoring unused argument \"192.0.2.10\""),
        "{err}"
    );
    // -k names the victim by key; -q drops the per-device lines but not the errors.
    let o = agent(
        &[
            "-o",
            "off",
            "-k",
            "beef",
            "-q",
            "-d",
            "/nonexistent/nvme9n9",
            "--state-file",
            &st,
        ],
        "",
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("fence of key 0xbeef not confirmed"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(agent(&["-o", "metadata"], "").status.code(), Some(0));
}
