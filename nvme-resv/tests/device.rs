//! Real-device tests: a reservation-capable NVMe namespace named by
//! `NVME_RESV_TEST_DEV` (e.g. `/dev/nvme0n1`), optionally the same namespace through a
//! second controller with another host ID as `NVME_RESV_TEST_DEV2`. The tests remove
//! this host's registration (and clear the namespace) before and after, so never
//! point them at a namespace in use. Run with `--include-ignored --test-threads=1`;
//! `nvme-resv/tests/guest/device-tests.sh` runs them in the nvmet guest
//! (`hwtests/guest/run --scenario`).
//!
//! Each command is also applied to the in-memory model ([`nvme_resv::model`]) with
//! the same host ID, and the outcome, the reservation type, the registrants and the
//! generation step must agree.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use nvme_resv::status::NvmeStatus;
use nvme_resv::{
    Acquire, Error, HostId, Key, Namespace, Register, Release, ReportFormat, ReservationStatus,
    ReservationType, Reservations, model,
};

/// Serializes the tests: they share the namespace's reservation state.
static DEVICE: Mutex<()> = Mutex::new(());

const K1: Key = Key(0x5e5e_0000_0000_0001);
const K2: Key = Key(0x5e5e_0000_0000_0002);
const K3: Key = Key(0x5e5e_0000_0000_0003);

fn dev(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn open_main() -> Namespace {
    let path = dev("NVME_RESV_TEST_DEV").expect(
        "NVME_RESV_TEST_DEV is not set: name a reservation-capable NVMe namespace, \
         e.g. NVME_RESV_TEST_DEV=/dev/nvme0n1",
    );
    Namespace::open(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

/// Removes this host's registration, whatever its key (a conflict means there was
/// none).
fn unregister_self(ns: &Namespace) {
    match ns.register(&Register::unregister(Key(0)).with_iekey(true)) {
        Ok(()) => {}
        Err(e) if e.is_reservation_conflict() => {}
        Err(e) => panic!("unregister with IEKEY: {e}"),
    }
}

/// Registers, reads this host's ID from the report, unregisters.
fn learn_hostid(ns: &Namespace) -> HostId {
    unregister_self(ns);
    ns.register(&Register::register(K3)).expect("register");
    let st = ns.report().expect("report");
    let id = st
        .registrants
        .iter()
        .find(|r| r.rkey == K3)
        .unwrap_or_else(|| panic!("own key missing from {st:?}"))
        .hostid;
    unregister_self(ns);
    id
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ok,
    Conflict,
    Status(u16),
    ZeroKey,
}

fn outcome(r: nvme_resv::Result<()>) -> Outcome {
    match r {
        Ok(()) => Outcome::Ok,
        Err(e) if e.is_reservation_conflict() => Outcome::Conflict,
        Err(Error::ZeroKey { .. }) => Outcome::ZeroKey,
        Err(e) => match e.status() {
            Some(s) => Outcome::Status(s.code()),
            None => panic!("not a device status: {e}"),
        },
    }
}

/// What the device and the model must agree on.
fn shape(st: &ReservationStatus) -> (ReservationType, Vec<(HostId, Key, bool)>) {
    let mut regs: Vec<_> = st
        .registrants
        .iter()
        .map(|r| (r.hostid, r.rkey, r.holds_reservation()))
        .collect();
    regs.sort();
    (st.rtype, regs)
}

#[derive(Debug, Clone, Copy)]
enum Cmd {
    Reg(Register),
    Acq(Acquire),
    Rel(Release),
}

fn apply(r: &dyn Reservations, c: &Cmd) -> nvme_resv::Result<()> {
    match c {
        Cmd::Reg(c) => r.register(c),
        Cmd::Acq(c) => r.acquire(c),
        Cmd::Rel(c) => r.release(c),
    }
}

/// Runs `steps` (host index, command) on the device hosts and on the model twins,
/// comparing after each step.
fn compare(devs: &[&Namespace], twins: &[model::Host], steps: &[(usize, &str, Cmd)]) {
    let mut gen_dev = devs[0].report().expect("report").generation;
    let mut gen_model = twins[0].report().unwrap().generation;
    for (host, what, cmd) in steps {
        let got = outcome(apply(devs[*host], cmd));
        let want = outcome(apply(&twins[*host], cmd));
        let st = devs[0].report().expect("report");
        let m = twins[0].report().unwrap();
        println!(
            "{what}: device {got:?}, model {want:?}; device {:?}",
            shape(&st)
        );
        assert_eq!(got, want, "{what}: outcome");
        assert_eq!(shape(&st), shape(&m), "{what}: state");
        assert_eq!(
            st.generation.wrapping_sub(gen_dev),
            m.generation.wrapping_sub(gen_model),
            "{what}: generation step"
        );
        (gen_dev, gen_model) = (st.generation, m.generation);
    }
}

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set NVME_RESV_TEST_DEV"]
fn capabilities_say_reservations() {
    let _g = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let ns = open_main();
    assert!(ns.nsid() >= 1);
    let caps = ns.require_reservations().expect("reservations supported");
    println!("{}: nsid {} {caps:?}", ns.path().display(), ns.nsid());
    assert!(!caps.types().is_empty());
    assert!(
        caps.lba_size.is_power_of_two() && caps.lba_size >= 512,
        "{caps:?}"
    );
    assert!(caps.nsze > 0);
}

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set NVME_RESV_TEST_DEV"]
fn one_host_command_sequence_matches_the_model() {
    let _g = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let ns = open_main();
    let id = learn_hostid(&ns);
    let twin = model::Namespace::new().host(id);
    let we = ReservationType::WRITE_EXCLUSIVE;
    let ea = ReservationType::EXCLUSIVE_ACCESS;
    let wear = ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS;
    let steps = [
        (0, "register K1", Cmd::Reg(Register::register(K1))),
        (0, "register K1 again", Cmd::Reg(Register::register(K1))),
        (0, "register K2 while K1", Cmd::Reg(Register::register(K2))),
        (0, "register key 0", Cmd::Reg(Register::register(Key(0)))),
        (0, "acquire WE", Cmd::Acq(Acquire::acquire(K1, we))),
        (0, "acquire WE again", Cmd::Acq(Acquire::acquire(K1, we))),
        (0, "acquire EA while WE", Cmd::Acq(Acquire::acquire(K1, ea))),
        (
            0,
            "acquire with IEKEY",
            Cmd::Acq(Acquire::acquire(K1, we).with_iekey(true)),
        ),
        (
            0,
            "acquire rtype 0",
            Cmd::Acq(Acquire::acquire(K1, ReservationType(0))),
        ),
        (
            0,
            "acquire rtype 7",
            Cmd::Acq(Acquire::acquire(K1, ReservationType(7))),
        ),
        (0, "replace K1 -> K2", Cmd::Reg(Register::replace(K1, K2))),
        (
            0,
            "release with stale K1",
            Cmd::Rel(Release::release(K1, we)),
        ),
        (0, "release wrong type", Cmd::Rel(Release::release(K2, ea))),
        (
            0,
            "release with IEKEY",
            Cmd::Rel(Release::release(K2, we).with_iekey(true)),
        ),
        (
            0,
            "preempt self, change type",
            Cmd::Acq(Acquire::preempt(K2, K2, ea)),
        ),
        (0, "release EA", Cmd::Rel(Release::release(K2, ea))),
        (
            0,
            "release with none held",
            Cmd::Rel(Release::release(K2, ea)),
        ),
        (
            0,
            "replace with IEKEY",
            Cmd::Reg(Register::replace(K3, K1).with_iekey(true)),
        ),
        (0, "acquire WE-AR", Cmd::Acq(Acquire::acquire(K1, wear))),
        (
            0,
            "unregister holder of WE-AR",
            Cmd::Reg(Register::unregister(K1)),
        ),
        (
            0,
            "unregister when not registered",
            Cmd::Reg(Register::unregister(K1)),
        ),
        (
            0,
            "replace when not registered",
            Cmd::Reg(Register::replace(K1, K2)),
        ),
        (
            0,
            "replace with IEKEY when not registered",
            Cmd::Reg(Register::replace(K1, K2).with_iekey(true)),
        ),
        (0, "unregister K2", Cmd::Reg(Register::unregister(K2))),
        (0, "register K2", Cmd::Reg(Register::register(K2))),
        (
            0,
            "preempt own key, no reservation",
            Cmd::Acq(Acquire::preempt(K2, K2, we)),
        ),
        (0, "register K1", Cmd::Reg(Register::register(K1))),
        (0, "acquire EA", Cmd::Acq(Acquire::acquire(K1, ea))),
        (0, "clear", Cmd::Rel(Release::clear(K1))),
        (0, "clear when not registered", Cmd::Rel(Release::clear(K1))),
    ];
    compare(&[&ns], &[twin], &steps);
    unregister_self(&ns);
}

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set NVME_RESV_TEST_DEV"]
fn reports_in_both_formats() {
    let _g = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let ns = open_main();
    unregister_self(&ns);
    ns.register(&Register::register(K1)).expect("register");
    let ext = ns
        .report_with(ReportFormat::Extended)
        .expect("extended report");
    assert!(ext.extended && ext.is_registered(K1), "{ext:?}");
    assert_eq!(ext.regctl as usize, ext.registrants.len());
    match ns.report_with(ReportFormat::Regular) {
        Ok(reg) => {
            // A controller with 64-bit host IDs: the same registrants.
            assert!(!reg.extended && reg.is_registered(K1), "{reg:?}");
            assert_eq!(reg.generation, ext.generation);
        }
        Err(e) => {
            // 128-bit host IDs in use (every fabrics target): refused, typed.
            let s = e.status().unwrap_or_else(|| panic!("not a status: {e}"));
            assert!(s.same_code(NvmeStatus::HOST_ID_INCONSISTENT_FORMAT), "{e}");
            println!("regular report refused: {e}");
        }
    }
    // The default report is the extended one (or the fallback).
    assert_eq!(ns.report().expect("report").registrants, ext.registrants);
    unregister_self(&ns);
}

fn cli() -> Command {
    Command::new(
        std::env::var_os("NVME_RESV_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_nvme-resv").into()),
    )
}

fn json_of(cmd: &mut Command) -> Option<serde_json::Value> {
    let out = match cmd.output() {
        Ok(o) => o,
        Err(e) => {
            println!("cannot run {cmd:?}: {e}");
            return None;
        }
    };
    assert!(
        out.status.success(),
        "{cmd:?}: {} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).expect("JSON on stdout"))
}

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set NVME_RESV_TEST_DEV"]
fn cli_json_matches_library_and_nvme_cli() {
    let _g = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let ns = open_main();
    unregister_self(&ns);
    let rtype = ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY;
    // Through the CLI: register, acquire.
    for args in [
        vec!["register".to_string(), "--nrkey".into(), K1.to_string()],
        vec![
            "acquire".into(),
            "--crkey".into(),
            K1.to_string(),
            "--rtype".into(),
            "we-ro".into(),
        ],
    ] {
        let out = cli()
            .arg(&args[0])
            .arg(ns.path())
            .args(&args[1..])
            .output()
            .expect("run nvme-resv");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let lib = ns.report().expect("report");
    assert_eq!(lib.rtype, rtype);
    assert_eq!(lib.holder().map(|h| h.rkey), Some(K1));
    let ours = json_of(cli().arg("report").arg(ns.path()).args(["-o", "json"]))
        .expect("nvme-resv CLI runs");
    assert_eq!(ours, lib.to_nvme_cli_json());
    let nvme = std::env::var_os("NVME_CLI").unwrap_or_else(|| "nvme".into());
    match json_of(
        Command::new(&nvme)
            .arg("resv-report")
            .arg(ns.path())
            .args(["--eds", "-o", "json"]),
    ) {
        Some(theirs) => {
            println!("nvme-cli: {theirs}");
            assert_eq!(ours, theirs, "nvme-resv and nvme-cli JSON differ");
        }
        None => println!("nvme-cli not available: cross-check skipped"),
    }
    // Human output names the holder's key; capabilities list the types.
    let out = cli()
        .arg("report")
        .arg(ns.path())
        .output()
        .expect("run nvme-resv");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("CLI report:\n{text}");
    assert!(out.status.success());
    assert!(
        text.contains("generation") && text.contains(&K1.to_string()),
        "{text}"
    );
    assert!(
        text.contains("Write Exclusive - Registrants Only"),
        "{text}"
    );
    let out = cli()
        .arg("capabilities")
        .arg(ns.path())
        .output()
        .expect("run nvme-resv");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("CLI capabilities:\n{text}");
    assert!(
        out.status.success() && text.contains("reservations: supported"),
        "{text}"
    );
    // A conflict through the CLI exits 3.
    let out = cli()
        .arg("register")
        .arg(ns.path())
        .args(["--nrkey", &K2.to_string()])
        .output()
        .expect("run nvme-resv");
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ns.release(&Release::clear(K1)).expect("clear");
}

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set NVME_RESV_TEST_DEV"]
fn zero_key_never_reaches_the_device() {
    let _g = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let ns = open_main();
    unregister_self(&ns);
    let before = ns.report().expect("report").generation;
    let err = ns.register(&Register::register(Key(0))).unwrap_err();
    assert!(matches!(err, Error::ZeroKey { .. }), "{err:?}");
    assert_eq!(ns.report().expect("report").generation, before);
}

#[test]
#[ignore = "needs the same namespace through two controllers: set NVME_RESV_TEST_DEV and NVME_RESV_TEST_DEV2"]
fn two_hosts_preempt_matches_the_model() {
    let _g = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let a = open_main();
    let path_b = dev("NVME_RESV_TEST_DEV2").expect("NVME_RESV_TEST_DEV2 is not set");
    let b = Namespace::open(&path_b).expect("open B");
    let (ida, idb) = (learn_hostid(&a), learn_hostid(&b));
    assert_ne!(ida, idb, "the two devices must have different host IDs");
    let m = model::Namespace::new();
    let twins = [m.host(ida), m.host(idb)];
    let we = ReservationType::WRITE_EXCLUSIVE;
    let eaar = ReservationType::EXCLUSIVE_ACCESS_ALL_REGISTRANTS;
    let steps = [
        (0, "A register", Cmd::Reg(Register::register(K1))),
        (1, "B register", Cmd::Reg(Register::register(K2))),
        (0, "A acquire WE", Cmd::Acq(Acquire::acquire(K1, we))),
        (
            1,
            "B acquire while A holds",
            Cmd::Acq(Acquire::acquire(K2, we)),
        ),
        (
            1,
            "B release, not holder",
            Cmd::Rel(Release::release(K2, we)),
        ),
        (
            1,
            "B preempt with PRKEY 0",
            Cmd::Acq(Acquire::preempt(K2, Key(0), we)),
        ),
        (1, "B preempt A", Cmd::Acq(Acquire::preempt(K2, K1, we))),
        (
            0,
            "A acquire after preemption",
            Cmd::Acq(Acquire::acquire(K1, we)),
        ),
        (0, "A register again", Cmd::Reg(Register::register(K1))),
        (1, "B release", Cmd::Rel(Release::release(K2, we))),
        (0, "A acquire EA-AR", Cmd::Acq(Acquire::acquire(K1, eaar))),
        (
            1,
            "B acquire EA-AR held by A",
            Cmd::Acq(Acquire::acquire(K2, eaar)),
        ),
        (
            1,
            "B preempt-and-abort PRKEY 0",
            Cmd::Acq(Acquire::preempt_and_abort(K2, Key(0), we)),
        ),
        (0, "A register again", Cmd::Reg(Register::register(K1))),
        (1, "B clear", Cmd::Rel(Release::clear(K2))),
    ];
    compare(&[&a, &b], &twins, &steps);
    unregister_self(&a);
    unregister_self(&b);
}

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set NVME_RESV_TEST_DEV"]
fn generic_char_device_sees_the_same_state() {
    let _g = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let ns = open_main();
    // /dev/nvmeXnY -> /dev/ngXnY (same controller, same namespace).
    let name = ns
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let Some(rest) = name.strip_prefix("nvme") else {
        println!("{name} is not a /dev/nvmeXnY name: skipped");
        return;
    };
    let ng = ns.path().with_file_name(format!("ng{rest}"));
    if !ng.exists() {
        println!("{} does not exist: skipped", ng.display());
        return;
    }
    let g = Namespace::open(&ng).unwrap_or_else(|e| panic!("open {}: {e}", ng.display()));
    assert_eq!(g.nsid(), ns.nsid());
    unregister_self(&ns);
    g.register(&Register::register(K1))
        .expect("register through the char device");
    let st = ns.report().expect("report through the block device");
    assert!(st.is_registered(K1), "{st:?}");
    assert_eq!(g.report().expect("report").registrants, st.registrants);
    assert_eq!(
        g.capabilities().expect("caps"),
        ns.capabilities().expect("caps")
    );
    println!("{} and {} agree", ns.path().display(), ng.display());
    unregister_self(&ns);
}

#[test]
#[ignore = "needs a namespace without reservation support: set NVME_RESV_TEST_NORESV_DEV"]
fn namespace_without_reservations_is_refused_clearly() {
    let path = dev("NVME_RESV_TEST_NORESV_DEV").expect("NVME_RESV_TEST_NORESV_DEV is not set");
    let ns = Namespace::open(&path).expect("open");
    let caps = ns.capabilities().expect("capabilities");
    println!("{}: {caps:?}", path.display());
    assert!(!caps.reservations && caps.types().is_empty(), "{caps:?}");
    let err = ns.require_reservations().unwrap_err();
    assert!(matches!(err, Error::NoReservationSupport { .. }), "{err:?}");
    let err = ns.register(&Register::register(K1)).unwrap_err();
    println!("register: {err}");
    assert!(!err.is_reservation_conflict(), "{err}");
    assert!(err.status().is_some(), "a device status: {err}");
    // The CLI explains it.
    let out = cli()
        .arg("register")
        .arg(&path)
        .args(["--nrkey", &K1.to_string()])
        .output()
        .expect("run nvme-resv");
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("CLI: {stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("does not support reservations"), "{stderr}");
}

/// The kernel's own name for the namespace (`/sys/block/<name>/wwid`), when `path` is
/// a block device the kernel lists.
fn kernel_wwid(path: &std::path::Path) -> Option<String> {
    let real = std::fs::canonicalize(path).ok()?;
    let name = real.file_name()?.to_str()?;
    let w = std::fs::read_to_string(format!("/sys/block/{name}/wwid")).ok()?;
    Some(w.trim_end().to_owned())
}

fn str_of<'a>(v: &'a serde_json::Value, key: &str) -> &'a str {
    v.get(key).and_then(|x| x.as_str()).unwrap_or_default()
}

#[test]
#[ignore = "needs a reservation-capable NVMe namespace: set NVME_RESV_TEST_DEV (and NVME_RESV_TEST_IDENTITY to the kind expected)"]
fn capabilities_identity_matches_nvme_cli_and_the_kernel() {
    let _g = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let ns = open_main();
    let id = ns.namespace_identity().expect("identity");
    let descs = ns.descriptors().expect("descriptor list");
    println!("identity: {id}; descriptors {descs:?}; wwid {}", id.wwid());
    let ours = json_of(
        cli()
            .arg("capabilities")
            .arg(ns.path())
            .args(["-o", "json"]),
    )
    .expect("nvme-resv CLI runs");
    println!("nvme-resv capabilities: {ours}");
    // The CLI says what the library reads.
    assert_eq!(str_of(&ours, "wwid"), id.wwid());
    assert_eq!(str_of(&ours, "uuid"), id.uuid_text());
    assert_eq!(str_of(&ours, "sn"), id.serial_text());
    assert_eq!(ours["vid"], u64::from(id.vid));
    assert_eq!(ours["oncs_reservations"], true);
    let kind = id.kind().map(|k| k.as_str()).unwrap_or("none");
    assert_eq!(
        ours["fenced_identity"]["kind"].as_str().unwrap_or("none"),
        kind
    );
    if let Ok(want) = std::env::var("NVME_RESV_TEST_IDENTITY") {
        assert_eq!(kind, want, "{id}");
    }
    // The kernel names the namespace the same way (its wwid order is ours).
    match kernel_wwid(ns.path()) {
        Some(w) => {
            println!("kernel wwid: {w}");
            assert_eq!(w, id.wwid(), "the kernel's wwid and ours differ");
        }
        None => println!(
            "no /sys/block wwid for {}: kernel cross-check skipped",
            ns.path().display()
        ),
    }
    // nvme-cli, the independent peer: Identify Controller and the descriptor list.
    let nvme = std::env::var_os("NVME_CLI").unwrap_or_else(|| "nvme".into());
    match json_of(
        Command::new(&nvme)
            .arg("id-ctrl")
            .arg(ns.path())
            .args(["-o", "json"]),
    ) {
        Some(ctrl) => {
            println!(
                "nvme-cli id-ctrl: vid {} sn {:?} mn {:?} subnqn {:?}",
                ctrl["vid"],
                str_of(&ctrl, "sn"),
                str_of(&ctrl, "mn"),
                str_of(&ctrl, "subnqn")
            );
            assert_eq!(ctrl["vid"], ours["vid"]);
            assert_eq!(str_of(&ctrl, "sn").trim_end(), str_of(&ours, "sn"));
            assert_eq!(str_of(&ctrl, "mn").trim_end(), str_of(&ours, "mn"));
            assert_eq!(str_of(&ctrl, "subnqn"), str_of(&ours, "subnqn"));
        }
        None => println!("nvme-cli not available: id-ctrl cross-check skipped"),
    }
    match json_of(
        Command::new(&nvme)
            .arg("ns-descs")
            .arg(ns.path())
            .args(["-o", "json"]),
    ) {
        Some(theirs) => {
            println!("nvme-cli ns-descs: {theirs}");
            // nvme-cli 2.x: {"ns-descs": [{"type": "uuid", "uuid": "…", …}, …]}.
            let listed = |key: &str| {
                theirs["ns-descs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|d| d["type"] == key)
                    .and_then(|d| d[key].as_str())
                    .map(str::to_owned)
            };
            let d = &ours["descriptors"];
            for key in ["uuid", "nguid", "eui64"] {
                assert_eq!(
                    d[key].as_str().map(str::to_owned),
                    listed(key),
                    "{key}: nvme-resv {d} nvme-cli {theirs}"
                );
            }
            println!("nvme-cli ns-descs and nvme-resv agree");
        }
        None => println!("nvme-cli not available: ns-descs cross-check skipped"),
    }
    // Persistence now: Get Features 83h through nvme-cli; a device that refuses the
    // feature refuses both.
    let theirs = Command::new(&nvme)
        .arg("get-feature")
        .arg(ns.path())
        .args(["-f", "0x83", "-n", &ns.nsid().to_string()])
        .output();
    match (&ours["ptpl_state"], theirs) {
        (serde_json::Value::Bool(on), Ok(o)) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            println!("nvme-cli get-feature 0x83: {}", text.trim());
            let value = text.rsplit("value:").next().and_then(|v| {
                let v = v.trim().trim_start_matches("0x");
                u32::from_str_radix(v.split_whitespace().next()?, 16).ok()
            });
            assert_eq!(value.map(|v| v & 1 != 0), Some(*on), "{text}");
            println!("persistence now: PTPL {on}, nvme-cli agrees");
        }
        (serde_json::Value::Null, Ok(o)) if !o.status.success() => println!(
            "persistence now: refused by the device ({}); nvme-cli get-feature 0x83 refused too: {}",
            str_of(&ours, "ptpl_state_error"),
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        (state, Ok(o)) => panic!(
            "nvme-resv ptpl_state {state} ({}) but nvme-cli get-feature 0x83 exit {}: {} {}",
            str_of(&ours, "ptpl_state_error"),
            o.status,
            String::from_utf8_lossy(&o.stdout).trim(),
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        (_, Err(e)) => println!("nvme-cli not available ({e}): get-feature cross-check skipped"),
    }
}
