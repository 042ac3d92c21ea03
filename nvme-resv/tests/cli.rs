//! The `nvme-resv` binary, run as a process: help, key derivation, option parsing and
//! the error paths that need no NVMe device (exit status and message).

use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_nvme-resv"))
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run nvme-resv")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn help_lists_every_verb() {
    let o = run(bin().arg("--help"));
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    for verb in [
        "register",
        "acquire",
        "release",
        "report",
        "capabilities",
        "key-for-node",
    ] {
        assert!(out.contains(verb), "{verb} missing from --help:\n{out}");
    }
    let o = run(bin().args(["report", "--help"]));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("--output-format") && out.contains("--regular"),
        "{out}"
    );
}

#[test]
fn key_for_node_prints_the_library_key() {
    let o = run(bin().args(["key-for-node", "node-1"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.trim(), nvme_resv::key_for_node("node-1").to_string());
    assert_eq!(out.trim(), "0xe696ecc2207879c3");
}

#[test]
fn key_for_node_refuses_ids_fenced_refuses() {
    for (id, why) in [
        ("a/b", "character '/' not allowed"),
        ("-a", "character '-' not allowed"),
        ("", "empty"),
    ] {
        // `--`: "-a" is a value here, not an option.
        let o = run(bin().args(["key-for-node", "--", id]));
        assert_eq!(o.status.code(), Some(2), "{id:?}: usage error");
        assert!(o.stdout.is_empty(), "{id:?}: no key printed");
        let err = stderr(&o);
        let first = err.lines().next().unwrap_or_default();
        assert!(
            first.contains("invalid node id") && first.contains(why),
            "{id:?}: {err}"
        );
        // The same rule as the library's (and so fenced's) NodeId.
        assert!(nvme_resv::NodeId::new(id).is_err(), "{id:?}");
    }
}

#[test]
fn not_an_nvme_device_fails_clearly() {
    let f = tempfile::NamedTempFile::new().unwrap();
    for verb in [
        vec!["report"],
        vec!["capabilities"],
        vec!["register", "--nrkey", "0xaaaa"],
        vec!["acquire", "--crkey", "1", "--rtype", "we-ro"],
        vec!["release", "--crkey", "1", "--rrela", "clear"],
    ] {
        let o = run(bin().args(&verb[..1]).arg(f.path()).args(&verb[1..]));
        assert_eq!(o.status.code(), Some(1), "{verb:?}");
        let err = stderr(&o);
        assert!(err.contains("is not an NVMe namespace"), "{verb:?}: {err}");
        assert!(err.contains("hint:"), "{verb:?}: {err}");
        assert!(o.stdout.is_empty(), "nothing on stdout on failure");
    }
}

#[test]
fn zero_key_is_refused_before_opening() {
    let o = run(bin().args(["register", "/nonexistent/nvme0n1", "--nrkey", "0"]));
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("key 0 cannot be registered"), "{err}");
}

#[test]
fn missing_device_node() {
    let o = run(bin().args(["report", "/nonexistent/nvme0n1"]));
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("cannot open") && err.contains("No such file"),
        "{err}"
    );
}

#[test]
fn bad_options_are_usage_errors() {
    for args in [
        vec!["acquire", "/dev/null", "--crkey", "1", "--rtype", "bogus"],
        vec!["acquire", "/dev/null", "--crkey", "zz", "--rtype", "1"],
        vec!["register", "/dev/null", "--nrkey", "1", "--rrega", "3"],
        vec!["register", "/dev/null", "--nrkey", "1", "--cptpl", "1"],
        vec!["release", "/dev/null", "--crkey", "1", "--rrela", "2"],
        vec!["report", "/dev/null", "-o", "xml"],
        vec!["report", "/dev/null", "--regular", "--eds"],
    ] {
        let o = run(bin().args(&args));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn unprivileged_user_gets_permission_hint() {
    // Needs root to switch to an unprivileged user; the file is readable but not
    // writable by that user, so the read-write open fails with EACCES.
    if !is_root() || !std::path::Path::new("/usr/bin/setpriv").exists() {
        eprintln!("skipped: needs root and setpriv");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let path = dir.path().join("ns");
    std::fs::write(&path, b"").unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let o = run(Command::new("/usr/bin/setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_nvme-resv"))
        .arg("report")
        .arg(&path));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("permission denied") && err.contains("CAP_SYS_ADMIN"),
        "{err}"
    );
}

/// Whether the effective uid is 0 (from /proc, to keep the test crate free of unsafe).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}
