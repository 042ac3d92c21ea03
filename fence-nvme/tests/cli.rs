//! The binaries as Pacemaker and the watchdog daemon run them: parameters on standard
//! input, results in the exit status. No device is needed: these are the paths that
//! end before one (or at a path that is not one).

use std::io::Write;
use std::process::{Command, Output, Stdio};

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

fn check(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fence_nvme_check"))
        .args(args)
        .output()
        .expect("spawn fence_nvme_check")
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
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let s = state.to_str().unwrap();
    // Not unfenced: nothing to guard.
    assert_eq!(check(&["test", "--state-file", s]).status.code(), Some(0));
    // A recorded device that cannot be read: 1.
    std::fs::write(&state, "key=0x1234\ndevice=/nonexistent/nvme9n9\n").unwrap();
    let o = check(&["test", "--state-file", s]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("/nonexistent/nvme9n9"));
    // watchdog's repair call: nothing to repair, the error stands.
    assert_eq!(check(&["repair", "2"]).status.code(), Some(2));
    assert_eq!(check(&["--bogus"]).status.code(), Some(1));
}
