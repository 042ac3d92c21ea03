//! The standing bad-input suite: every `fenced` subcommand (`run`, `status`, `audit`,
//! `check`, `attest`, `probe`, `leave`), as a child process against
//! a real etcd, with each class of careless or hostile input (malformed ids and keys,
//! paths that are not devices, unusable config files, bad URLs, unreachable and hung
//! etcd, settings that cannot work, hostile pid files and control sockets, values in
//! etcd crafted to forge log lines).
//!
//! For each case: a non-zero exit status; exactly one error line on stderr, starting
//! `fenced: ` and naming what was wrong (`run` may log its attempts to reach etcd
//! before it: those are log events, not error lines); no panic; an answer within
//! [`LIMIT`]; and, checked, nothing written to etcd (its revision did not move) and
//! the "device" file unchanged. Usage errors (a flag value of the wrong type) are
//! clap's: exit status 2 and a message starting `error: `. `fenced check`, a
//! monitoring plugin, says `FENCED UNKNOWN - <the same line>` on stdout, exit status 3.
//!
//! `nvme-resv`'s part is `nvme-resv/tests/bad_input.rs`.

mod common;

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::process::{Daemon, wait_within};
use test_support::etcd::Etcd;
use test_support::process::wait_or_kill;

/// Every case must be answered within this.
const LIMIT: Duration = Duration::from_secs(15);

fn fenced() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fenced"));
    c.env_remove("FENCED_LOG")
        .env_remove("FAILPOINTS")
        .env_remove("RUST_BACKTRACE")
        .env_remove("FENCED_PID_FILE")
        .env_remove("FENCED_CONTROL_SOCKET")
        .env_remove("FENCED_CONFIG")
        .env_remove("FENCED_NODE_ID")
        .env_remove("FENCED_ETCD_ENDPOINTS")
        .stdin(Stdio::null());
    c
}

/// What one run of the binary did.
#[derive(Debug)]
struct Ran {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Runs `cmd` with stdout and stderr in files (no pipe can fill), killing it (by its
/// pid) if it outlives [`LIMIT`].
fn run(mut cmd: Command, dir: &Path) -> Ran {
    let out = tempfile::NamedTempFile::new_in(dir).unwrap();
    let err = tempfile::NamedTempFile::new_in(dir).unwrap();
    let t0 = Instant::now();
    let mut child = cmd
        .stdout(out.reopen().unwrap())
        .stderr(err.reopen().unwrap())
        .spawn()
        .unwrap();
    let Some(status) = wait_or_kill(&mut child, t0 + LIMIT) else {
        panic!(
            "{cmd:?} still running after {LIMIT:?}; stderr: {}",
            std::fs::read_to_string(err.path()).unwrap_or_default()
        );
    };
    Ran {
        status,
        stdout: std::fs::read_to_string(out.path()).unwrap(),
        stderr: std::fs::read_to_string(err.path()).unwrap(),
        took: t0.elapsed(),
    }
}

/// A log event of `run` (text format): it starts with an RFC 3339 timestamp.
fn is_log_event(line: &str) -> bool {
    let b = line.as_bytes();
    b.len() > 20 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' && b[10] == b'T'
}

/// The refusal contract: non-zero exit, one error line naming `want`, no panic, in
/// time.
fn assert_refused(case: &str, r: &Ran, want: &str) {
    let ctx = format!("case {case}: {r:?}");
    assert!(!r.status.success(), "{ctx}");
    assert!(r.status.code().is_some(), "killed by a signal: {ctx}");
    for bad in ["panicked at", "RUST_BACKTRACE", "stack backtrace"] {
        assert!(!r.stderr.contains(bad), "{ctx}");
    }
    assert!(r.took < LIMIT, "{ctx}");
    let errors: Vec<&str> = r.stderr.lines().filter(|l| !is_log_event(l)).collect();
    assert_eq!(errors.len(), 1, "exactly one error line: {ctx}");
    assert_eq!(r.stderr.lines().last(), Some(errors[0]), "{ctx}");
    assert!(errors[0].starts_with("fenced: "), "{ctx}");
    assert!(errors[0].contains(want), "want {want:?}: {ctx}");
    // The cause is kept, and said once: no "cannot open X: cannot open X".
    let parts: Vec<&str> = errors[0].split(": ").collect();
    for (i, p) in parts.iter().enumerate() {
        assert!(
            p.len() < 8 || !parts[i + 1..].contains(p),
            "{p:?} repeated: {ctx}"
        );
    }
}

/// `fenced check` is a monitoring plugin: it says UNKNOWN (exit status 3) in one line
/// on stdout, nothing on stderr.
fn assert_plugin_unknown(case: &str, r: &Ran, want: &str) {
    let ctx = format!("case {case}: {r:?}");
    assert_eq!(r.status.code(), Some(3), "{ctx}");
    assert_eq!(r.stdout.lines().count(), 1, "{ctx}");
    assert!(r.stdout.starts_with("FENCED UNKNOWN - "), "{ctx}");
    assert!(r.stdout.contains(want), "want {want:?}: {ctx}");
    assert!(r.stderr.is_empty(), "{ctx}");
    assert!(r.took < LIMIT, "{ctx}");
}

/// The contract of the subcommand `args[0]`.
fn assert_case(case: &str, args: &[OsString], r: &Ran, want: &str) {
    if args.first().is_some_and(|a| a == "check") {
        assert_plugin_unknown(case, r, want);
    } else {
        assert_refused(case, r, want);
    }
}

/// A usage error: clap's message, exit status 2.
fn assert_usage_error(case: &str, r: &Ran, want: &str) {
    let ctx = format!("case {case}: {r:?}");
    assert_eq!(r.status.code(), Some(2), "{ctx}");
    assert!(r.stderr.starts_with("error: "), "{ctx}");
    assert!(r.stderr.contains(want), "{ctx}");
    assert!(!r.stderr.contains("panicked at"), "{ctx}");
}

/// etcd's current revision: it moves with every write.
fn revision(endpoint: &str) -> i64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = etcd_client::Client::connect([endpoint], None)
            .await
            .unwrap();
        c.get("/", None).await.unwrap().header().unwrap().revision()
    })
}

/// Puts, then deletes, `key` = `value` (no lease): a watcher sees a DELETE whose
/// previous value is `value`.
fn put_then_delete(endpoint: &str, key: &str, value: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = etcd_client::Client::connect([endpoint], None)
            .await
            .unwrap();
        c.put(key, value, None).await.unwrap();
        c.delete(key, None).await.unwrap();
    });
}

/// The bad inputs a test shares: files of every kind, an unreachable and a hung etcd.
struct Fixture {
    dir: tempfile::TempDir,
    /// A regular file standing in for the shared device, with known content.
    device: PathBuf,
    device_bytes: Vec<u8>,
    fifo: PathBuf,
    /// A loopback port nothing listens on.
    closed: String,
    /// A loopback listener that accepts connections and never answers.
    hung: String,
    _hung: std::net::TcpListener,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let device = dir.path().join("device.img");
        let device_bytes: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&device, &device_bytes).unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        let hung_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let hung = format!("http://{}", hung_l.local_addr().unwrap());
        Self {
            dir,
            device,
            device_bytes,
            fifo,
            closed,
            hung,
            _hung: hung_l,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn file(&self, name: &str, content: &[u8]) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, content).unwrap();
        p
    }

    fn assert_device_unchanged(&self, case: &str) {
        let now = std::fs::read(&self.device).unwrap();
        assert!(
            now == self.device_bytes,
            "case {case}: the device file changed"
        );
    }
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// Runs each case (`fenced <args>`) and checks the refusal contract, the device file
/// and that etcd's revision did not move.
fn check_cases(fx: &Fixture, etcd: &Etcd, cases: Vec<(String, Vec<OsString>, String)>) {
    let before = revision(&etcd.endpoint());
    for (name, args, want) in cases {
        let mut c = fenced();
        c.args(&args);
        let r = run(c, fx.dir.path());
        assert_case(&name, &args, &r, &want);
        fx.assert_device_unchanged(&name);
        assert_eq!(
            revision(&etcd.endpoint()),
            before,
            "case {name}: something was written to etcd"
        );
    }
}

/// `run` with everything valid except `bad` (whose flags replace the defaults'):
/// every case is refused before etcd is written (the seed arenas would be the first
/// write).
fn run_args(etcd: &Etcd, bad: &[&str]) -> Vec<OsString> {
    let ep = etcd.endpoint();
    let defaults = [
        ("--node-id", "n1"),
        ("--fencer", "none"),
        ("--root", "/bad/"),
        ("--seed-arenas", "a1,a2"),
        ("--instance-id", "i-0123456789abcdef0"),
        ("--connect-timeout-secs", "3"),
        ("--etcd-endpoints", ep.as_str()),
    ];
    let mut a = os(&["run"]);
    for (flag, value) in defaults {
        if !bad.contains(&flag) {
            a.extend(os(&[flag, value]));
        }
    }
    a.extend(os(bad));
    a
}

#[test]
fn run_refuses_settings_that_cannot_work_before_the_first_etcd_write() {
    let fx = Fixture::new();
    let etcd = Etcd::start();
    let missing_dir = fx.path("no/such/dir/fenced.pid");
    let link = fx.path("link.pid");
    std::os::unix::fs::symlink(fx.path("target.pid"), &link).unwrap();
    let taken = fx.file("taken.sock", b"not a socket");
    let missing_device = format!(
        "fenced: cannot open {}: No such file or directory",
        fx.path("nvme9n9").display()
    );
    let long_sock = format!("{}/{}.sock", fx.dir.path().display(), "s".repeat(120));
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    let table: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "claim ttl 0",
            vec!["--claim-ttl-secs".into(), "0".into()],
            "--claim-ttl-secs = 0: must be 3..=",
        ),
        (
            "sweep 0",
            vec!["--sweep-secs".into(), "0".into()],
            "--sweep-secs = 0: must be 1..=",
        ),
        (
            "ttl 1",
            vec!["--ttl-secs".into(), "1".into()],
            "--ttl-secs = 1: must be 2..=",
        ),
        (
            "ttl huge",
            vec!["--ttl-secs".into(), u64::MAX.to_string()],
            "--ttl-secs = 18446744073709551615",
        ),
        (
            "margin < ttl",
            vec!["--self-fence-margin-secs".into(), "1".into()],
            "--self-fence-margin-secs = 1: must be 5..=",
        ),
        (
            "keepalive > ttl",
            vec!["--etcd-keepalive-timeout-secs".into(), "60".into()],
            "--etcd-keepalive-timeout-secs = 60",
        ),
        (
            "connect timeout 0",
            vec!["--connect-timeout-secs".into(), "0".into()],
            "--connect-timeout-secs = 0",
        ),
        (
            "node id slash",
            vec!["--node-id".into(), "a/b".into()],
            "invalid node id \"a/b\"",
        ),
        (
            "node id empty",
            vec!["--node-id".into(), String::new()],
            "invalid node id: empty",
        ),
        (
            "node id newline",
            vec!["--node-id".into(), "n1\nforged".into()],
            "invalid node id \"n1\\nforged\"",
        ),
        (
            "node id too long",
            vec!["--node-id".into(), "n".repeat(64)],
            "longer than 63",
        ),
        (
            "instance id newline",
            vec![
                "--instance-id".into(),
                "i-1\n2026-01-01T00:00:00Z INFO forged".into(),
            ],
            "--instance-id: invalid instance id \"i-1\\n2026",
        ),
        (
            "instance id space",
            vec!["--instance-id".into(), "i 1".into()],
            "invalid instance id \"i 1\"",
        ),
        (
            "arena slash",
            vec!["--seed-arenas".into(), "a1,x/y".into()],
            "--seed-arenas = \"x/y\"",
        ),
        (
            "root relative",
            vec!["--root".into(), "fenced".into()],
            "--root = \"fenced\"",
        ),
        (
            "pid file dir missing",
            vec!["--pid-file".into(), s(&missing_dir)],
            "cannot open pid file",
        ),
        (
            "pid file symlink",
            vec!["--pid-file".into(), s(&link)],
            "is a symbolic link: refusing to follow it",
        ),
        (
            "pid file is a directory",
            vec!["--pid-file".into(), s(fx.dir.path())],
            "cannot open pid file",
        ),
        (
            "pid file is a FIFO",
            vec!["--pid-file".into(), s(&fx.fifo)],
            "is a FIFO, not a regular file",
        ),
        (
            "control socket dir missing",
            vec!["--control-socket".into(), s(&fx.path("no/such/dir/c.sock"))],
            "cannot listen on control socket",
        ),
        (
            "control socket path taken",
            vec!["--control-socket".into(), s(&taken)],
            "exists and is a regular file, not a socket",
        ),
        (
            "control socket too long",
            vec!["--control-socket".into(), long_sock],
            "is longer than 107 bytes",
        ),
        (
            "watchdog missing",
            vec!["--watchdog-device".into(), s(&fx.path("watchdog"))],
            "cannot use watchdog",
        ),
        (
            "watchdog FIFO",
            vec!["--watchdog-device".into(), s(&fx.fifo)],
            "it is a FIFO, not a watchdog character device",
        ),
        (
            "watchdog directory",
            vec!["--watchdog-device".into(), s(fx.dir.path())],
            "it is a directory, not a watchdog character device",
        ),
        (
            "reboot without a SysRq trigger",
            vec![
                "--on-fence".into(),
                "reboot".into(),
                "--sysrq-trigger-file".into(),
                s(&fx.path("no-sysrq")),
            ],
            "cannot use --on-fence reboot",
        ),
        (
            "reboot on a FIFO",
            vec![
                "--on-fence".into(),
                "reboot".into(),
                "--sysrq-trigger-file".into(),
                s(&fx.fifo),
            ],
            "is a FIFO, not the SysRq trigger",
        ),
        (
            "reboot on a directory",
            vec![
                "--on-fence".into(),
                "reboot".into(),
                "--sysrq-trigger-file".into(),
                s(fx.dir.path()),
            ],
            "is a directory, not the SysRq trigger",
        ),
        (
            "nvme on a regular file",
            vec![
                "--fencer".into(),
                "nvme".into(),
                "--claim-ttl-secs".into(),
                "30".into(),
                "--block-device".into(),
                s(&fx.device),
            ],
            "is not an NVMe namespace",
        ),
        (
            "nvme on a FIFO",
            vec![
                "--fencer".into(),
                "nvme".into(),
                "--block-device".into(),
                s(&fx.fifo),
            ],
            "is not an NVMe namespace",
        ),
        (
            "nvme on a directory",
            vec![
                "--fencer".into(),
                "nvme".into(),
                "--block-device".into(),
                s(fx.dir.path()),
            ],
            "cannot open",
        ),
        (
            "nvme on /dev/zero",
            vec![
                "--fencer".into(),
                "nvme".into(),
                "--block-device".into(),
                "/dev/zero".into(),
            ],
            "/dev/zero is not an NVMe namespace",
        ),
        (
            "nvme on a missing path",
            vec![
                "--fencer".into(),
                "nvme".into(),
                "--block-device".into(),
                s(&fx.path("nvme9n9")),
            ],
            &missing_device,
        ),
        (
            "nvme without a device",
            vec!["--fencer".into(), "nvme".into()],
            "--fencer nvme needs --block-device",
        ),
    ];
    let cases = table
        .into_iter()
        .map(|(name, bad, want)| {
            let bad: Vec<&str> = bad.iter().map(String::as_str).collect();
            (name.to_owned(), run_args(&etcd, &bad), want.to_owned())
        })
        .collect();
    check_cases(&fx, &etcd, cases);
    assert!(
        !link.exists() && !fx.path("target.pid").exists(),
        "the symlink was followed"
    );
    assert_eq!(std::fs::read(&taken).unwrap(), b"not a socket");
}

#[test]
fn config_files_that_are_not_small_regular_toml_files_are_refused_fast() {
    let fx = Fixture::new();
    let etcd = Etcd::start();
    let huge = fx.file("huge.toml", &vec![b'#'; (1 << 20) + 1]);
    let not_utf8 = fx.file("latin1.toml", b"node_id = \"n\xe9\"\n");
    let syntax = fx.file("syntax.toml", b"node_id = \"n1\"\nthis is not toml\n");
    let unknown = fx.file("unknown.toml", b"node_id = \"n1\"\nttl = 5\n");
    let wrong_type = fx.file("type.toml", b"sweep_secs = \"often\"\n");
    let range = fx.file("range.toml", b"sweep_secs = 0\n");
    let ep = etcd.endpoint();
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    let files: Vec<(&str, String, &str)> = vec![
        (
            "/dev/zero",
            "/dev/zero".into(),
            "it is a character device, not a regular file",
        ),
        ("FIFO", s(&fx.fifo), "it is a FIFO, not a regular file"),
        (
            "directory",
            s(fx.dir.path()),
            "it is a directory, not a regular file",
        ),
        (
            "missing",
            s(&fx.path("missing.toml")),
            "No such file or directory",
        ),
        ("huge", s(&huge), "larger than 1048576 bytes"),
        ("not UTF-8", s(&not_utf8), "not UTF-8 text"),
        ("syntax", s(&syntax), "line 2"),
        (
            "unknown key",
            s(&unknown),
            "key `ttl`: unknown key; did you mean `ttl_secs`?",
        ),
        ("wrong type", s(&wrong_type), "key `sweep_secs`"),
    ];
    let mut cases = Vec::new();
    for (name, path, want) in &files {
        for cmd in [
            vec![
                "run",
                "--node-id",
                "n1",
                "--fencer",
                "none",
                "--seed-arenas",
                "a1",
            ],
            vec!["status"],
            vec!["audit"],
            vec!["check"],
            vec!["attest", "--node-id", "n1", "--reason", "powered off"],
            vec!["probe", "--node-id", "n1", "--generation", "0"],
        ] {
            let mut a = os(&cmd);
            a.extend(os(&[
                "--etcd-endpoints",
                &ep,
                "--root",
                "/bad/",
                "--config",
                path,
            ]));
            cases.push((format!("{} --config {name}", cmd[0]), a, (*want).to_owned()));
        }
    }
    cases.push((
        "run --config with sweep_secs = 0".into(),
        os(&[
            "run",
            "--node-id",
            "n1",
            "--fencer",
            "none",
            "--etcd-endpoints",
            &ep,
            "--config",
            &s(&range),
        ]),
        "--sweep-secs = 0".into(),
    ));
    check_cases(&fx, &etcd, cases);
}

/// As root every file is readable; elsewhere a mode-000 config is refused.
#[test]
fn an_unreadable_config_file_is_refused() {
    // /proc/self belongs to the effective uid.
    let euid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap());
    if euid == 0 {
        eprintln!("skipped: root reads a mode-000 file");
        return;
    }
    let fx = Fixture::new();
    let etcd = Etcd::start();
    let p = fx.file("secret.toml", b"node_id = \"n1\"\n");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).unwrap();
    let a = os(&[
        "status",
        "--etcd-endpoints",
        &etcd.endpoint(),
        "--config",
        p.to_str().unwrap(),
    ]);
    check_cases(
        &fx,
        &etcd,
        vec![("unreadable".into(), a, "Permission denied".into())],
    );
}

#[test]
fn bad_urls_and_unreachable_or_hung_etcd_get_one_line_in_bounded_time() {
    let fx = Fixture::new();
    let etcd = Etcd::start();
    let mut cases = Vec::new();
    let commands: [&[&str]; 6] = [
        &[
            "run",
            "--node-id",
            "n1",
            "--fencer",
            "none",
            "--seed-arenas",
            "a1",
            "--connect-timeout-secs",
            "3",
        ],
        &["status"],
        &["audit"],
        &["check"],
        &["attest", "--node-id", "n1", "--reason", "powered off"],
        &["probe", "--node-id", "n1", "--generation", "0"],
    ];
    for cmd in commands {
        for (name, ep, want) in [
            ("ftp scheme", "ftp://127.0.0.1:2379", "unsupported scheme"),
            ("no port", "http://127.0.0.1", "not an etcd URL"),
            ("port 0", "http://127.0.0.1:0", "not an etcd URL"),
            ("port too big", "http://127.0.0.1:65536", "not an etcd URL"),
            ("space", "http://etcd one:2379", "not an etcd URL"),
            ("empty", "", "--etcd-endpoints = \"\""),
            (
                "newline",
                "http://a:1\nforged",
                "--etcd-endpoints = \"http://a:1\\nforged\"",
            ),
            ("closed port", fx.closed.as_str(), "etcd unreachable at"),
            ("hung listener", fx.hung.as_str(), "etcd unreachable at"),
        ] {
            let mut a = os(cmd);
            a.extend(os(&["--root", "/bad/", "--etcd-endpoints", ep]));
            cases.push((format!("{} {name}", cmd[0]), a, want.to_owned()));
        }
    }
    // The unreachable cases wait for etcd: run them side by side.
    let (slow, fast): (Vec<_>, Vec<_>) = cases
        .into_iter()
        .partition(|(_, _, want)| want.starts_with("etcd unreachable"));
    check_cases(&fx, &etcd, fast);
    let before = revision(&etcd.endpoint());
    std::thread::scope(|s| {
        for (name, args, want) in &slow {
            let fx = &fx;
            s.spawn(move || {
                let mut c = fenced();
                c.args(args);
                let r = run(c, fx.dir.path());
                assert_case(name, args, &r, want);
                // The operator commands wait 5 s, `run` here 3 s: a hung member
                // cannot stretch one attempt beyond the wait.
                assert!(r.took < Duration::from_secs(9), "{name}: {r:?}");
            });
        }
    });
    assert_eq!(revision(&etcd.endpoint()), before);
}

#[test]
fn malformed_ids_keys_and_device_paths_of_the_operator_commands() {
    let fx = Fixture::new();
    let etcd = Etcd::start();
    let ep = etcd.endpoint();
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    let small = fx.file("small.img", &[7u8; 8192]);
    let mut cases: Vec<(String, Vec<OsString>, String)> = Vec::new();
    for (name, id, want) in [
        ("slash", "a/b", "invalid node id \"a/b\""),
        ("empty", "", "invalid node id: empty"),
        ("newline", "n1\nforged", "invalid node id \"n1\\nforged\""),
        ("leading dash", "-n", "invalid node id \"-n\""),
    ] {
        cases.push((
            format!("attest node id {name}"),
            os(&[
                "attest",
                "--etcd-endpoints",
                &ep,
                &format!("--node-id={id}"),
                "--reason",
                "gone",
            ]),
            want.into(),
        ));
        cases.push((
            format!("probe node id {name}"),
            os(&[
                "probe",
                "--etcd-endpoints",
                &ep,
                &format!("--node-id={id}"),
                "--generation",
                "1",
            ]),
            want.into(),
        ));
    }
    cases.push((
        "attest empty reason".into(),
        os(&[
            "attest",
            "--etcd-endpoints",
            &ep,
            "--node-id",
            "n1",
            "--reason",
            " ",
        ]),
        "--reason must describe".into(),
    ));
    for (name, dev, want) in [
        ("FIFO", s(&fx.fifo), "cannot probe: "),
        ("directory", s(fx.dir.path()), "cannot probe: "),
        (
            "/dev/zero",
            "/dev/zero".into(),
            "/dev/zero does not support O_DIRECT",
        ),
        (
            "missing",
            s(&fx.path("nvme9n9")),
            "No such file or directory",
        ),
    ] {
        cases.push((
            format!("probe device {name}"),
            os(&["probe", "--block-device", &dev]),
            want.into(),
        ));
    }
    for (name, dev, offset) in [
        ("past the end", s(&fx.device), (4u64 << 20).to_string()),
        ("unaligned", s(&fx.device), "1000".into()),
        (
            "file smaller than the offset",
            s(&small),
            (1u64 << 20).to_string(),
        ),
        ("huge offset", s(&fx.device), u64::MAX.to_string()),
    ] {
        cases.push((
            format!("probe offset {name}"),
            os(&["probe", "--block-device", &dev, "--offset", &offset]),
            "choose another --offset".into(),
        ));
    }
    check_cases(&fx, &etcd, cases);
    assert_eq!(
        std::fs::read(&small).unwrap(),
        vec![7u8; 8192],
        "the small file changed"
    );
    for (name, args, want) in [
        (
            "ttl not a number",
            vec!["run", "--ttl-secs", "five"],
            "invalid value 'five'",
        ),
        (
            "negative generation",
            vec!["probe", "--node-id", "n1", "--generation", "-1"],
            "-1",
        ),
        (
            "unknown fencer",
            vec!["run", "--fencer", "scsi"],
            "invalid value 'scsi'",
        ),
        ("leave without a target", vec!["leave"], "--pid-file"),
    ] {
        let mut c = fenced();
        c.args(args);
        assert_usage_error(name, &run(c, fx.dir.path()), want);
    }
}

/// `fenced probe` on a regular file standing in for the device: it reads the block
/// and writes the same bytes back, so the content is unchanged (it used to write
/// 4 KiB of 0x5a at 1 MiB).
#[test]
fn probe_leaves_the_device_content_unchanged() {
    let fx = Fixture::new();
    for offset in ["1048576", "0", "4190208"] {
        let mut c = fenced();
        c.args(["probe", "--block-device"])
            .arg(&fx.device)
            .args(["--offset", offset]);
        let r = run(c, fx.dir.path());
        assert!(r.status.success(), "{r:?}");
        assert!(
            r.stdout.contains(&format!(
                "O_DIRECT write at offset {offset}: ok (the block's own bytes written back)"
            )),
            "{r:?}"
        );
        fx.assert_device_unchanged(&format!("probe at {offset}"));
    }
    let mut c = fenced();
    c.args(["probe", "--help"]);
    let help = run(c, fx.dir.path()).stdout;
    assert!(help.contains("the same bytes are written back"), "{help}");
}

/// `fenced run --fencer none` as `node` under `/bad/` (claim TTL 3 s) with `extra`,
/// logging at info: the child (SIGKILLed by pid on drop) and its log file.
fn daemon(etcd: &Etcd, node: &str, dir: &Path, extra: &[&str]) -> (Daemon, PathBuf) {
    let log = dir.join(format!("{node}.log"));
    let child = fenced()
        .args(common::process::run_args(&etcd.endpoint(), "/bad/", node))
        .args(["--claim-ttl-secs", "3"])
        .args(extra)
        .env("FENCED_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    (Daemon(child), log)
}

/// How long a daemon may take to reach a state a test waits for.
const WAIT: Duration = Duration::from_secs(30);

/// `fenced leave` with pid files that could make it signal the wrong process: `-1`
/// (every process), `0` (its own process group), `1` (init), garbage, a stale pid. It
/// signals nothing: each is refused with one line, and the processes are alive.
///
/// `-1`, `0` and `1` run inside their own PID namespace (`unshare --pid`): had `leave`
/// signalled, only that namespace's shell and `sleep` could have been hit, and the
/// shell reports it.
#[test]
fn leave_signals_no_process_whatever_the_pid_file_says() {
    let fx = Fixture::new();
    let probe = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .status();
    let can_unshare = probe.is_ok_and(|s| s.success());
    let bin = env!("CARGO_BIN_EXE_fenced");
    let script = r#"
        trap 'echo SIGNALLED' TERM HUP INT
        sleep 60 & S=$!
        "$0" leave --pid-file "$1" --timeout-secs 2; rc=$?
        sleep 0.2
        if kill -0 $S 2>/dev/null; then echo ALIVE; fi
        kill -KILL $S
        exit $rc
    "#;
    for content in ["-1\n", "0\n", "1\n", "-1\nstart_time 1\n", "garbage\n", ""] {
        let pid_file = fx.file("ns.pid", content.as_bytes());
        if !can_unshare {
            eprintln!("skipped the pid {content:?} case: unshare --pid is not permitted here");
            continue;
        }
        let mut c = Command::new("unshare");
        c.args(["--pid", "--fork", "--mount-proc", "sh", "-c", script, bin])
            .arg(&pid_file)
            .env_remove("FENCED_CONTROL_SOCKET");
        let r = run(c, fx.dir.path());
        let case = format!("pid file {content:?}");
        assert!(
            r.stdout.contains("ALIVE"),
            "{case}: the sleep was signalled: {r:?}"
        );
        assert!(
            !r.stdout.contains("SIGNALLED"),
            "{case}: the shell was signalled: {r:?}"
        );
        assert_refused(&case, &r, "names no control socket");
    }
    // A stale pid, of a process this test started and owns (and so the only one a
    // signal could reach): refused, and the process lives on.
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = sleeper.id();
    let start = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let start = start
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .nth(19)
        .unwrap()
        .to_owned();
    for (name, content, want) in [
        ("stale pid", format!("{pid}\n"), "names no control socket"),
        (
            "stale pid and start time",
            format!("{pid}\nstart_time {start}\n"),
            "names no control socket",
        ),
        (
            "stale pid naming a vanished socket",
            format!(
                "{pid}\nstart_time {start}\ncontrol_socket {}\n",
                fx.path("gone.sock").display()
            ),
            "no fenced answers on control socket",
        ),
    ] {
        let pid_file = fx.file("stale.pid", content.as_bytes());
        let mut c = fenced();
        c.args(["leave", "--timeout-secs", "2", "--pid-file"])
            .arg(&pid_file);
        let r = run(c, fx.dir.path());
        assert_refused(name, &r, want);
        assert!(
            sleeper.try_wait().unwrap().is_none(),
            "{name}: the unrelated process was signalled"
        );
    }
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    // Pid files that are not regular files, or are missing.
    let real = fx.file(
        "real.pid",
        format!("{pid}\ncontrol_socket /nonexistent.sock\n").as_bytes(),
    );
    let link = fx.path("link.pid");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    for (name, path, want) in [
        (
            "symlink",
            link.clone(),
            "is a symbolic link: refusing to follow it",
        ),
        ("FIFO", fx.fifo.clone(), "is a FIFO, not a regular file"),
        (
            "directory",
            fx.dir.path().to_owned(),
            "is a directory, not a regular file",
        ),
        ("missing", fx.path("missing.pid"), "cannot read pid file"),
    ] {
        let mut c = fenced();
        c.args(["leave", "--timeout-secs", "2", "--pid-file"])
            .arg(&path);
        assert_refused(name, &run(c, fx.dir.path()), want);
    }
}

/// Control sockets that are not a fenced daemon's: a regular file, a socket whose
/// server answers nonsense, one that never answers.
#[test]
fn leave_refuses_a_control_socket_that_is_not_a_daemons() {
    let fx = Fixture::new();
    let plain = fx.file("plain.sock", b"x");
    let bogus = fx.path("bogus.sock");
    let l = std::os::unix::net::UnixListener::bind(&bogus).unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut line = String::new();
            let _ = BufReader::new(&s).read_line(&mut line);
            let _ = s.write_all(b"sure\n2026-01-01T00:00:00Z INFO forged\n");
        }
    });
    let silent = fx.path("silent.sock");
    let silent_l = std::os::unix::net::UnixListener::bind(&silent).unwrap();
    for (name, path, want) in [
        ("regular file", plain, "no fenced answers on control socket"),
        (
            "missing",
            fx.path("missing.sock"),
            "No such file or directory",
        ),
        ("bogus answer", bogus, "refused: sure"),
        ("never answers", silent, "is still leaving after 2s"),
    ] {
        let mut c = fenced();
        c.args(["leave", "--timeout-secs", "2", "--control-socket"])
            .arg(&path);
        assert_refused(name, &run(c, fx.dir.path()), want);
    }
    drop(silent_l);
}

/// A running daemon: its pid file is locked (a second daemon on it is refused before
/// it writes anything), `leave --pid-file` reaches it over the socket the file names
/// and it exits 0, removing both; a SIGKILLed daemon's stale files are taken over.
#[test]
fn the_pid_file_is_locked_while_the_daemon_runs_and_leave_uses_its_socket() {
    let fx = Fixture::new();
    let etcd = Etcd::start();
    let pid_file = fx.path("n1.pid");
    let sock = fx.path("n1.sock");
    let p = pid_file.to_str().unwrap();
    let (mut d1, _log) = daemon(&etcd, "n1", fx.dir.path(), &["--pid-file", p]);
    // The pid file is written (and locked) first, the socket bound just after.
    wait_within("n1's pid file and socket", WAIT, || {
        std::fs::read_to_string(&pid_file).is_ok_and(|t| t.contains("control_socket"))
            && sock.exists()
    });
    let text = std::fs::read_to_string(&pid_file).unwrap();
    assert!(
        text.starts_with(&format!("{}\nstart_time ", d1.0.id())),
        "{text}"
    );
    assert!(
        text.contains(&format!("control_socket {}\n", sock.display())),
        "{text}"
    );
    assert_eq!(
        std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777,
        0o660
    );
    // A second daemon on the same pid file: refused before it joins or seeds.
    let mut c = fenced();
    c.args(run_args(
        &etcd,
        &["--node-id", "n2", "--seed-arenas", "z9", "--pid-file", p],
    ));
    let r = run(c, fx.dir.path());
    assert_refused(
        "second daemon",
        &r,
        &format!("is locked by a running fenced (pid {})", d1.0.id()),
    );
    let keys = {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut c = etcd_client::Client::connect([etcd.endpoint()], None)
                .await
                .unwrap();
            let r = c
                .get("/bad/", Some(etcd_client::GetOptions::new().with_prefix()))
                .await
                .unwrap();
            r.kvs()
                .iter()
                .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
                .collect::<Vec<_>>()
        })
    };
    assert!(
        keys.iter().all(|k| !k.contains("n2") && !k.contains("z9")),
        "{keys:?}"
    );
    // Its own control socket, named explicitly, is refused too (a live daemon answers).
    let mut c = fenced();
    c.args(run_args(
        &etcd,
        &[
            "--node-id",
            "n3",
            "--control-socket",
            sock.to_str().unwrap(),
        ],
    ));
    assert_refused(
        "socket in use",
        &run(c, fx.dir.path()),
        "is answered by a running fenced",
    );
    // Another user (not root, not the daemon's group) cannot ask it to leave: the
    // socket is mode 0660.
    if std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) == 0 {
        std::fs::set_permissions(fx.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut c = fenced();
        std::os::unix::process::CommandExt::uid(&mut c, 65534);
        std::os::unix::process::CommandExt::gid(&mut c, 65534);
        c.args(["leave", "--timeout-secs", "2", "--control-socket"])
            .arg(&sock);
        let r = run(c, fx.dir.path());
        assert_refused("another user", &r, "Permission denied");
        assert!(
            d1.0.try_wait().unwrap().is_none(),
            "the daemon left for another user"
        );
    }
    // leave --pid-file: over the socket; the daemon leaves and removes its files.
    let mut c = fenced();
    c.args(["leave", "--pid-file", p]);
    let r = run(c, fx.dir.path());
    assert!(r.status.success(), "{r:?}");
    assert!(r.stdout.contains("left"), "{r:?}");
    assert!(d1.0.wait().unwrap().success());
    assert!(
        !pid_file.exists() && !sock.exists(),
        "pid file and socket removed on exit"
    );
    // SIGKILL leaves both behind: leave says nobody answers; a new daemon takes them over.
    let (mut d2, _) = daemon(&etcd, "n1", fx.dir.path(), &["--pid-file", p]);
    wait_within("n1's second pid file", WAIT, || sock.exists());
    d2.0.kill().unwrap();
    d2.0.wait().unwrap();
    assert!(pid_file.exists() && sock.exists());
    let mut c = fenced();
    c.args(["leave", "--timeout-secs", "2", "--pid-file", p]);
    assert_refused(
        "stale socket",
        &run(c, fx.dir.path()),
        "no fenced answers on control socket",
    );
    let (_d3, log3) = daemon(&etcd, "n4", fx.dir.path(), &["--pid-file", p]);
    wait_within("the stale files taken over", WAIT, || {
        std::fs::read_to_string(&log3).is_ok_and(|l| l.contains("fenced running"))
    });
}

/// An instance id crafted in etcd to forge a log line: the peers that log it keep
/// it on one line (escaped), and refuse it as an instance id.
#[test]
fn a_crafted_instance_id_in_etcd_cannot_forge_a_log_line() {
    let fx = Fixture::new();
    let etcd = Etcd::start();
    let (_d1, log) = daemon(&etcd, "n1", fx.dir.path(), &[]);
    wait_within("n1 running", WAIT, || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("fenced running"))
    });
    let forged = "2026-01-01T00:00:00.000000Z  INFO fenced::agent: FORGED generation reset";
    put_then_delete(
        &etcd.endpoint(),
        "/bad/membership/n9",
        &format!("i-9\n{forged}\r\u{1b}[2K"),
    );
    wait_within("the DELETE logged", WAIT, || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("not an instance id"))
    });
    std::thread::sleep(Duration::from_millis(500));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.lines().any(|l| l.starts_with("2026-01-01T00:00:00")),
        "a forged line: {text}"
    );
    assert!(
        text.contains("\\n2026-01-01T00:00:00.000000Z"),
        "escaped in place: {text}"
    );
    assert!(!text.contains('\r') && !text.contains('\u{1b}'), "{text}");
}

/// A daemon waiting for an etcd that does not answer can be asked to leave: the
/// wait ends, the daemon exits 0 and removes its pid file and socket.
#[test]
fn leave_while_waiting_for_etcd_ends_the_wait() {
    let fx = Fixture::new();
    let pid_file = fx.path("w.pid");
    let sock = fx.path("w.sock");
    let log = fx.path("w.log");
    let mut d = Daemon(
        fenced()
            .args(["run", "--fencer", "none", "--node-id", "w1"])
            .args(["--etcd-endpoints", &fx.hung, "--pid-file"])
            .arg(&pid_file)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_within("the control socket", WAIT, || sock.exists());
    let mut c = fenced();
    c.args(["leave", "--timeout-secs", "10", "--pid-file"])
        .arg(&pid_file);
    let r = run(c, fx.dir.path());
    assert!(r.status.success(), "{r:?}");
    assert!(d.0.wait().unwrap().success());
    assert!(!pid_file.exists() && !sock.exists());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("leave requested before joining"), "{text}");
}

/// `--on-fence reboot` where the SysRq trigger is read-only (what the shipped unit's
/// `ProtectKernelTunables=yes` does to `/proc/sysrq-trigger`) is refused at start, before
/// etcd is written, not found out when the host must go down. Runs in its own mount
/// namespace (`unshare --mount`) to bind the file read-only.
#[test]
fn reboot_on_a_read_only_sysrq_trigger_is_refused_at_start() {
    let fx = Fixture::new();
    let etcd = Etcd::start();
    let sysrq = fx.file("sysrq-trigger", b"");
    let probe = Command::new("unshare").args(["--mount", "true"]).status();
    if !probe.is_ok_and(|s| s.success()) {
        eprintln!("skipped: unshare --mount is not permitted here");
        return;
    }
    let before = revision(&etcd.endpoint());
    let args = run_args(
        &etcd,
        &[
            "--on-fence",
            "reboot",
            "--sysrq-trigger-file",
            sysrq.to_str().unwrap(),
        ],
    );
    let mut c = Command::new("unshare");
    c.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind -o ro "$1" "$1" && shift && exec "$@""#)
        .arg("sh")
        .arg(&sysrq)
        .arg(env!("CARGO_BIN_EXE_fenced"))
        .args(&args)
        .env_remove("FENCED_LOG")
        .env_remove("FENCED_CONFIG")
        .stdin(Stdio::null());
    let r = run(c, fx.dir.path());
    assert_refused(
        "reboot on a read-only trigger",
        &r,
        "for writing: Read-only file system",
    );
    assert_eq!(revision(&etcd.endpoint()), before, "etcd was written");
    assert_eq!(
        std::fs::read(&sysrq).unwrap(),
        b"",
        "the trigger was written"
    );
}
