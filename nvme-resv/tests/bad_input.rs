//! `nvme-resv`'s part of the standing bad-input suite (`fenced/tests/bad_input.rs` has
//! `fenced`'s): every verb with each path that is not an NVMe namespace (a regular
//! file, a FIFO, a directory, `/dev/zero`, a missing path) and with malformed keys,
//! codes and node ids (the node-id rule `fenced` uses).
//!
//! For each: exit status 1 (2 for a usage error, clap's message), no panic, an answer
//! within [`LIMIT`], and the file standing in for the device unchanged. An error is
//! `nvme-resv: error: <what failed>` on the first line, then at most a
//! `  caused by: <OS error>` and a `  hint: <what to do>` line.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use test_support::process::wait_or_kill;

const LIMIT: Duration = Duration::from_secs(15);

#[derive(Debug)]
struct Ran {
    status: ExitStatus,
    stderr: String,
    took: Duration,
}

/// Runs `nvme-resv <args>` with stderr in a file, killing it by pid after [`LIMIT`].
fn run(args: &[&str], dir: &Path) -> Ran {
    let err = tempfile::NamedTempFile::new_in(dir).unwrap();
    let t0 = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_nvme-resv"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err.reopen().unwrap())
        .spawn()
        .unwrap();
    let Some(status) = wait_or_kill(&mut child, t0 + LIMIT) else {
        panic!("nvme-resv {args:?} still running after {LIMIT:?}");
    };
    Ran {
        status,
        stderr: std::fs::read_to_string(err.path()).unwrap(),
        took: t0.elapsed(),
    }
}

fn assert_error(case: &str, r: &Ran, want: &str) {
    let ctx = format!("case {case}: {r:?}");
    assert_eq!(r.status.code(), Some(1), "{ctx}");
    assert!(!r.stderr.contains("panicked at"), "{ctx}");
    assert!(r.took < LIMIT, "{ctx}");
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert!((1..=3).contains(&lines.len()), "{ctx}");
    assert!(lines[0].starts_with("nvme-resv: error: "), "{ctx}");
    for l in &lines[1..] {
        assert!(
            l.starts_with("  caused by: ") || l.starts_with("  hint: "),
            "{ctx}"
        );
    }
    assert!(r.stderr.contains(want), "want {want:?}: {ctx}");
}

fn assert_usage(case: &str, r: &Ran, want: &str) {
    let ctx = format!("case {case}: {r:?}");
    assert_eq!(r.status.code(), Some(2), "{ctx}");
    assert!(r.stderr.starts_with("error: "), "{ctx}");
    assert!(r.stderr.contains(want), "want {want:?}: {ctx}");
    assert!(!r.stderr.contains("panicked at"), "{ctx}");
}

const VERBS: &[&[&str]] = &[
    &["report"],
    &["report", "--regular"],
    &["capabilities"],
    &["register", "--nrkey", "0xaaaa"],
    &["acquire", "--crkey", "1", "--rtype", "we-ar"],
    &[
        "acquire",
        "--crkey",
        "1",
        "--prkey",
        "2",
        "--rtype",
        "we-ar",
        "--racqa",
        "preempt-abort",
    ],
    &["release", "--crkey", "1", "--rrela", "clear"],
];

#[test]
fn every_verb_refuses_paths_that_are_not_namespaces_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("device.img");
    let content: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    std::fs::write(&file, &content).unwrap();
    let fifo = dir.path().join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let missing: PathBuf = dir.path().join("nvme9n9");
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    let paths = [
        ("regular file", s(&file), "is not an NVMe namespace"),
        ("FIFO", s(&fifo), "is not an NVMe namespace"),
        ("directory", s(dir.path()), "Is a directory"),
        (
            "/dev/zero",
            "/dev/zero".to_owned(),
            "is not an NVMe namespace",
        ),
        ("missing", s(&missing), "No such file or directory"),
    ];
    for verb in VERBS {
        for (name, path, want) in &paths {
            let mut args = vec![verb[0], path.as_str()];
            args.extend_from_slice(&verb[1..]);
            let case = format!("{verb:?} on {name}");
            assert_error(&case, &run(&args, dir.path()), want);
            assert!(
                std::fs::read(&file).unwrap() == content,
                "{case}: the file changed"
            );
        }
    }
}

#[test]
fn malformed_keys_and_codes_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    for (args, want) in [
        (
            &["register", "/dev/zero", "--nrkey", "zz"][..],
            "invalid value 'zz'",
        ),
        (
            &["register", "/dev/zero", "--nrkey", "0x1ffffffffffffffff"],
            "0x1ffffffffffffffff",
        ),
        (&["register", "/dev/zero", "--nrkey=-1"], "'-1'"),
        (&["register", "/dev/zero", "--nrkey", ""], "--nrkey"),
        (&["register", "/dev/zero", "--rrega", "9"], "'9'"),
        (
            &["acquire", "/dev/zero", "--crkey", "1", "--rtype", "256"],
            "'256'",
        ),
        (
            &[
                "acquire",
                "/dev/zero",
                "--crkey",
                "1",
                "--rtype",
                "we",
                "--racqa",
                "x",
            ],
            "'x'",
        ),
        (
            &["release", "/dev/zero", "--crkey", "1", "--rrela", "3"],
            "'3'",
        ),
        (&["report"], "DEVICE"),
        (&["key-for-node", "a/b"], "invalid node id \"a/b\""),
        (&["key-for-node", ""], "invalid node id: empty"),
        (
            &["key-for-node", "n1\nforged"],
            "invalid node id \"n1\\nforged\"",
        ),
        (&["register", "/dev/zero", "--cptpl", "1"], "'1'"),
    ] {
        assert_usage(&format!("{args:?}"), &run(args, dir.path()), want);
    }
}
