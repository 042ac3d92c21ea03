//! `nvme-resv`: NVMe persistent reservations from the command line, with the verbs
//! and options of nvme-cli's `resv-*` commands.
//!
//! Exit status: 0 success, 1 error, 2 usage error, 3 reservation conflict.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use nvme_resv::{
    Acquire, AcquireAction, Capabilities, Cptpl, Error, Key, Namespace, NamespaceDescriptors,
    NamespaceIdentity, NodeId, NvmeStatus, Register, RegisterAction, Release, ReleaseAction,
    ReportFormat, ReservationStatus, ReservationType, Reservations,
};

#[derive(Debug, Parser)]
#[command(
    name = "nvme-resv",
    version,
    about = "NVMe persistent reservations over Linux passthrough ioctls",
    long_about = "NVMe persistent reservations over Linux passthrough ioctls.\n\n\
        DEVICE is a namespace: a block device /dev/nvmeXnY or a generic character \
        device /dev/ngXnY. Reservation commands need root (CAP_SYS_ADMIN) or a device \
        node you can open for writing.\n\n\
        Keys accept decimal or 0x-prefixed hexadecimal. Reservation types: 1 we \
        (Write Exclusive), 2 ea (Exclusive Access), 3 we-ro, 4 ea-ro (Registrants \
        Only), 5 we-ar, 6 ea-ar (All Registrants).\n\n\
        Exit status: 0 success, 1 error, 2 usage error, 3 reservation conflict.",
    after_help = "Examples:\n  \
        nvme-resv register /dev/nvme0n1 --nrkey 0xaaaa\n  \
        nvme-resv acquire /dev/nvme0n1 --crkey 0xaaaa --rtype we-ro\n  \
        nvme-resv acquire /dev/nvme1n1 --crkey 0xbbbb --prkey 0xaaaa --rtype 3 --racqa preempt\n  \
        nvme-resv report /dev/nvme0n1 -o json\n  \
        nvme-resv key-for-node node-1"
)]
struct Cli {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Debug, Subcommand)]
enum Verb {
    /// Reservation Register: register, unregister or replace this host's key
    /// (nvme resv-register).
    Register(RegisterArgs),
    /// Reservation Acquire: acquire, preempt or preempt-and-abort (nvme resv-acquire).
    Acquire(AcquireArgs),
    /// Reservation Release: release the reservation or clear every registration
    /// (nvme resv-release).
    Release(ReleaseArgs),
    /// Reservation Report: generation, type held and every registrant
    /// (nvme resv-report --eds).
    Report(ReportArgs),
    /// What the namespace supports, to run before deploying: the ONCS reservations bit,
    /// reservation types (RESCAP), IEKEY, PTPL support and its current state (Get
    /// Features 83h), block size; and which namespace it is (UUID, NGUID, EUI-64 from
    /// Identify Namespace and the descriptor list; vendor id, serial and model number;
    /// subsystem NQN; Linux's wwid) with the identity fenced records for it.
    Capabilities(CapsArgs),
    /// Print the reservation key of a node id (FNV-1a 64; never 0).
    KeyForNode {
        /// The node id: 1-63 characters of A-Z a-z 0-9 . _ -, starting with a letter or
        /// digit (the rule fenced applies).
        node_id: NodeId,
    },
    /// For packaging: write nvme-resv.1 and one page per verb into MAN_DIR, and the
    /// bash completion (nvme-resv.bash) into COMPLETIONS_DIR.
    #[command(hide = true)]
    Generate {
        man_dir: PathBuf,
        completions_dir: PathBuf,
    },
}

/// `nvme-resv generate`: the man pages and the bash completion, from these definitions.
fn generate(man_dir: &std::path::Path, completions_dir: &std::path::Path) -> ExitCode {
    use clap::CommandFactory;
    let result = std::fs::create_dir_all(man_dir)
        .and_then(|()| clap_mangen::generate_to(Cli::command(), man_dir))
        .map_err(|e| (man_dir, e))
        .and_then(|()| {
            std::fs::create_dir_all(completions_dir)
                .and_then(|()| {
                    let shell = clap_complete::Shell::Bash;
                    clap_complete::generate_to(
                        shell,
                        &mut Cli::command(),
                        "nvme-resv",
                        completions_dir,
                    )
                })
                .map(drop)
                .map_err(|e| (completions_dir, e))
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err((dir, e)) => {
            eprintln!("nvme-resv: error: cannot write into {}: {e}", dir.display());
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug, Args)]
struct RegisterArgs {
    /// Namespace device (/dev/nvmeXnY or /dev/ngXnY).
    device: PathBuf,
    /// Reservation Register Action: 0|register, 1|unregister, 2|replace.
    #[arg(short = 'r', long, default_value = "register", value_parser = parse_rrega)]
    rrega: RegisterAction,
    /// Current reservation key (unregister, replace).
    #[arg(short = 'c', long, default_value = "0", value_parser = parse_key)]
    crkey: Key,
    /// New reservation key (register, replace); must not be 0.
    #[arg(short = 'k', long, default_value = "0", value_parser = parse_key)]
    nrkey: Key,
    /// Ignore Existing Key: do not check --crkey.
    #[arg(short = 'i', long)]
    iekey: bool,
    /// Change Persist Through Power Loss State: 0 no change, 2 clear, 3 persist, or
    /// auto: 3 when the namespace reports PTPL support (RESCAP bit 0), else 0 (what
    /// fenced registers with).
    #[arg(short = 'p', long, default_value = "0", value_parser = parse_cptpl)]
    cptpl: CptplArg,
}

/// `--cptpl`: a CPTPL value, or `auto` (decided from the namespace's RESCAP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CptplArg {
    Set(Cptpl),
    Auto,
}

#[derive(Debug, Args)]
struct AcquireArgs {
    /// Namespace device (/dev/nvmeXnY or /dev/ngXnY).
    device: PathBuf,
    /// Current reservation key: this host's registered key.
    #[arg(short = 'c', long, value_parser = parse_key)]
    crkey: Key,
    /// Preempt reservation key: the key to preempt (preempt, preempt-abort).
    #[arg(short = 'p', long, default_value = "0", value_parser = parse_key)]
    prkey: Key,
    /// Reservation type: 1-6 or we, ea, we-ro, ea-ro, we-ar, ea-ar.
    #[arg(short = 't', long, value_parser = parse_rtype)]
    rtype: ReservationType,
    /// Reservation Acquire Action: 0|acquire, 1|preempt, 2|preempt-abort.
    #[arg(short = 'a', long, default_value = "acquire", value_parser = parse_racqa)]
    racqa: AcquireAction,
    /// Ignore Existing Key (reserved since NVMe 1.3; devices refuse it).
    #[arg(short = 'i', long)]
    iekey: bool,
}

#[derive(Debug, Args)]
struct ReleaseArgs {
    /// Namespace device (/dev/nvmeXnY or /dev/ngXnY).
    device: PathBuf,
    /// Current reservation key: this host's registered key.
    #[arg(short = 'c', long, value_parser = parse_key)]
    crkey: Key,
    /// Reservation type held (release must name it); ignored by clear.
    #[arg(short = 't', long, default_value = "0", value_parser = parse_rtype)]
    rtype: ReservationType,
    /// Reservation Release Action: 0|release, 1|clear.
    #[arg(short = 'a', long, default_value = "release", value_parser = parse_rrela)]
    rrela: ReleaseAction,
    /// Ignore Existing Key (reserved since NVMe 1.3; devices refuse it).
    #[arg(short = 'i', long)]
    iekey: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    /// Human readable.
    Normal,
    /// JSON; for `report`, the field names of `nvme resv-report --eds -o json`.
    Json,
}

#[derive(Debug, Args)]
struct ReportArgs {
    /// Namespace device (/dev/nvmeXnY or /dev/ngXnY).
    device: PathBuf,
    /// Output format.
    #[arg(short = 'o', long = "output-format", value_enum, default_value_t = Output::Normal)]
    output: Output,
    /// Request the regular data structure (64-bit host IDs) instead of the extended
    /// one. Fabrics targets refuse it (Host Identifier Inconsistent Format).
    #[arg(long, conflicts_with = "eds")]
    regular: bool,
    /// Request the extended data structure only, without falling back (the default
    /// tries extended, then regular if the device refuses it as an invalid field).
    #[arg(short = 'e', long)]
    eds: bool,
}

#[derive(Debug, Args)]
struct CapsArgs {
    /// Namespace device (/dev/nvmeXnY or /dev/ngXnY).
    device: PathBuf,
    /// Output format.
    #[arg(short = 'o', long = "output-format", value_enum, default_value_t = Output::Normal)]
    output: Output,
}

fn parse_u64(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let r = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    r.map_err(|e| format!("{s:?} is not a number (decimal or 0x-hex): {e}"))
}

fn parse_key(s: &str) -> Result<Key, String> {
    parse_u64(s).map(Key)
}

fn small(s: &str, max: u8) -> Result<Option<u8>, String> {
    match parse_u64(s) {
        Ok(v) if v <= u64::from(max) => Ok(Some(v as u8)),
        Ok(v) => Err(format!("{v} is out of range 0..={max}")),
        Err(_) => Ok(None),
    }
}

fn parse_rtype(s: &str) -> Result<ReservationType, String> {
    if let Some(v) = small(s, 255)? {
        return Ok(ReservationType(v));
    }
    let t = match s.to_ascii_lowercase().replace('_', "-").as_str() {
        "we" | "write-exclusive" => ReservationType::WRITE_EXCLUSIVE,
        "ea" | "exclusive-access" => ReservationType::EXCLUSIVE_ACCESS,
        "we-ro" | "wero" => ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY,
        "ea-ro" | "earo" => ReservationType::EXCLUSIVE_ACCESS_REGISTRANTS_ONLY,
        "we-ar" | "wear" => ReservationType::WRITE_EXCLUSIVE_ALL_REGISTRANTS,
        "ea-ar" | "eaar" => ReservationType::EXCLUSIVE_ACCESS_ALL_REGISTRANTS,
        _ => {
            return Err(format!(
                "unknown reservation type {s:?}: use 1-6 or we, ea, we-ro, ea-ro, we-ar, ea-ar"
            ));
        }
    };
    Ok(t)
}

fn parse_rrega(s: &str) -> Result<RegisterAction, String> {
    let a = match small(s, 7)? {
        Some(v) => RegisterAction::from_rrega(v),
        None => match s {
            "register" => Some(RegisterAction::Register),
            "unregister" => Some(RegisterAction::Unregister),
            "replace" => Some(RegisterAction::Replace),
            _ => None,
        },
    };
    a.ok_or_else(|| format!("{s:?}: use 0|register, 1|unregister, 2|replace"))
}

fn parse_racqa(s: &str) -> Result<AcquireAction, String> {
    let a = match small(s, 7)? {
        Some(v) => AcquireAction::from_racqa(v),
        None => match s {
            "acquire" => Some(AcquireAction::Acquire),
            "preempt" => Some(AcquireAction::Preempt),
            "preempt-abort" | "preempt-and-abort" => Some(AcquireAction::PreemptAndAbort),
            _ => None,
        },
    };
    a.ok_or_else(|| format!("{s:?}: use 0|acquire, 1|preempt, 2|preempt-abort"))
}

fn parse_rrela(s: &str) -> Result<ReleaseAction, String> {
    let a = match small(s, 7)? {
        Some(v) => ReleaseAction::from_rrela(v),
        None => match s {
            "release" => Some(ReleaseAction::Release),
            "clear" => Some(ReleaseAction::Clear),
            _ => None,
        },
    };
    a.ok_or_else(|| format!("{s:?}: use 0|release, 1|clear"))
}

fn parse_cptpl(s: &str) -> Result<CptplArg, String> {
    const USE: &str = "use 0 (no change), 2 (clear), 3 (persist) or auto";
    if s.eq_ignore_ascii_case("auto") {
        return Ok(CptplArg::Auto);
    }
    let v = small(s, 3)?.ok_or_else(|| format!("{s:?}: {USE}"))?;
    Cptpl::from_cptpl(v)
        .map(CptplArg::Set)
        .ok_or_else(|| format!("{v} is reserved: {USE}"))
}

fn print_report(dev: &std::path::Path, ns: &Namespace, st: &ReservationStatus) {
    let held = if st.rtype == ReservationType::NONE {
        "no reservation held".to_string()
    } else {
        format!("reservation held: {}", st.rtype)
    };
    println!(
        "{} (nsid {}): generation {}, {held}, {} registrant(s), PTPL {}, {} data structure",
        dev.display(),
        ns.nsid(),
        st.generation,
        st.regctl,
        if st.ptpls { "on" } else { "off" },
        if st.extended { "extended" } else { "regular" },
    );
    if st.registrants.is_empty() {
        return;
    }
    println!("  {:<8} {:<7} {:<34} rkey", "cntlid", "holder", "hostid");
    for r in &st.registrants {
        println!(
            "  {:<8} {:<7} {:<34} {}",
            format!("{:#06x}", r.cntlid),
            if r.holds_reservation() { "yes" } else { "no" },
            r.hostid.to_string(),
            r.rkey,
        );
    }
}

fn run(cli: Cli) -> Result<(), (Error, Option<PathBuf>)> {
    let with = |dev: &PathBuf| {
        let dev = dev.clone();
        move |e: Error| (e, Some(dev))
    };
    match cli.verb {
        Verb::KeyForNode { node_id } => {
            println!("{}", node_id.key());
        }
        // Handled by `main` before `run`: it writes files, not a device.
        Verb::Generate { .. } => {}
        Verb::Register(a) => {
            let mut cmd = Register {
                rrega: a.rrega,
                crkey: a.crkey,
                nrkey: a.nrkey,
                iekey: a.iekey,
                cptpl: match a.cptpl {
                    CptplArg::Set(c) => c,
                    CptplArg::Auto => Cptpl::NoChange,
                },
            };
            // Refuse a zero key before touching the device.
            cmd.validate().map_err(with(&a.device))?;
            let ns = Namespace::open(&a.device).map_err(with(&a.device))?;
            if a.cptpl == CptplArg::Auto {
                let caps = ns.capabilities().map_err(with(&a.device))?;
                cmd.cptpl = caps.register_cptpl();
                eprintln!(
                    "{}: {}",
                    a.device.display(),
                    if caps.ptpl {
                        "PTPL supported (RESCAP bit 0): registering with CPTPL 3 (persist)"
                    } else {
                        "no PTPL support (RESCAP bit 0 clear): registering with CPTPL 0; \
                         registrations and the reservation are lost when the target restarts"
                    }
                );
            }
            ns.register(&cmd).map_err(with(&a.device))?;
            println!(
                "{}: {:?} done (nsid {})",
                a.device.display(),
                a.rrega,
                ns.nsid()
            );
        }
        Verb::Acquire(a) => {
            let ns = Namespace::open(&a.device).map_err(with(&a.device))?;
            let cmd = Acquire {
                racqa: a.racqa,
                rtype: a.rtype,
                crkey: a.crkey,
                prkey: a.prkey,
                iekey: a.iekey,
            };
            ns.acquire(&cmd).map_err(with(&a.device))?;
            println!(
                "{}: {:?} {} done (nsid {})",
                a.device.display(),
                a.racqa,
                a.rtype,
                ns.nsid()
            );
        }
        Verb::Release(a) => {
            let ns = Namespace::open(&a.device).map_err(with(&a.device))?;
            let cmd = Release {
                rrela: a.rrela,
                rtype: a.rtype,
                crkey: a.crkey,
                iekey: a.iekey,
            };
            ns.release(&cmd).map_err(with(&a.device))?;
            println!(
                "{}: {:?} done (nsid {})",
                a.device.display(),
                a.rrela,
                ns.nsid()
            );
        }
        Verb::Report(a) => {
            let ns = Namespace::open(&a.device).map_err(with(&a.device))?;
            let st = if a.regular {
                ns.report_with(ReportFormat::Regular)
            } else if a.eds {
                ns.report_with(ReportFormat::Extended)
            } else {
                ns.report()
            }
            .map_err(with(&a.device))?;
            match a.output {
                Output::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&st.to_nvme_cli_json())
                        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
                ),
                Output::Normal => print_report(&a.device, &ns, &st),
            }
        }
        Verb::Capabilities(a) => {
            let ns = Namespace::open(&a.device).map_err(with(&a.device))?;
            let c = ns.capabilities().map_err(with(&a.device))?;
            let descs = ns.descriptors().map_err(with(&a.device))?;
            let id = ns.namespace_identity().map_err(with(&a.device))?;
            // A device without the feature (or refusing it) still gets the rest of the
            // answer; the failure is part of it.
            let ptpl_state = ns.ptpl_state();
            match a.output {
                Output::Json => {
                    println!("{:#}", caps_json(&ns, &c, descs.as_ref(), &id, &ptpl_state))
                }
                Output::Normal => print_caps(&a.device, &ns, &c, descs.as_ref(), &id, &ptpl_state),
            }
        }
    }
    Ok(())
}

/// What fenced records for this namespace, in words.
fn fenced_records(id: &NamespaceIdentity) -> String {
    match id.kind() {
        Some(k) => format!("{k}: {id}"),
        None => "nothing: the namespace reports no UUID, NGUID or EUI-64 and its controller no \
                 serial number; fenced refuses it unless --allow-unidentified-namespace"
            .to_owned(),
    }
}

fn caps_json(
    ns: &Namespace,
    c: &Capabilities,
    descs: Option<&NamespaceDescriptors>,
    id: &NamespaceIdentity,
    ptpl_state: &Result<bool, Error>,
) -> serde_json::Value {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let descriptors = descs.map(|d| {
        serde_json::json!({
            "eui64": d.eui64.map(|v| hex(&v)),
            "nguid": d.nguid.map(|v| hex(&v)),
            "uuid": d.uuid.map(|v| nvme_resv::identity::uuid_text(&v)),
            "csi": d.csi,
        })
    });
    let mut v = serde_json::json!({
        "nsid": ns.nsid(),
        "reservations": c.reservations,
        "oncs_reservations": c.oncs_reservations,
        "rescap": c.rescap,
        "rtypes": c.types().iter().map(|t| t.0).collect::<Vec<_>>(),
        "iekey": c.iekey,
        "ptpl": c.ptpl,
        "ptpl_state": ptpl_state.as_ref().ok(),
        "lba_size": c.lba_size,
        "nsze": c.nsze,
        "nguid": id.nguid_hex(),
        "eui64": id.eui64_hex(),
        "uuid": id.uuid_text(),
        "descriptors": descriptors,
        "vid": id.vid,
        "sn": id.serial_text(),
        "mn": id.model_text(),
        "subnqn": id.subnqn,
        "wwid": id.wwid(),
        "ebs_volume_id": id.ebs_volume_id(),
        "fenced_identity": id.kind().map(|k| serde_json::json!({
            "kind": k.as_str(),
            "text": id.to_string(),
        })),
    });
    if let (Err(e), Some(m)) = (ptpl_state, v.as_object_mut()) {
        m.insert("ptpl_state_error".into(), e.to_string().into());
    }
    v
}

fn print_caps(
    dev: &std::path::Path,
    ns: &Namespace,
    c: &Capabilities,
    descs: Option<&NamespaceDescriptors>,
    id: &NamespaceIdentity,
    ptpl_state: &Result<bool, Error>,
) {
    let yes = |b: bool| if b { "yes" } else { "no" };
    println!("{} (nsid {}):", dev.display(), ns.nsid());
    println!("  identity: {id}");
    println!("  fenced records: {}", fenced_records(id));
    println!("  Linux wwid: {}", id.wwid());
    println!(
        "  controller: vid {:#06x}, serial \"{}\", model \"{}\"{}",
        id.vid,
        id.serial_text(),
        id.model_text(),
        id.ebs_volume_id()
            .map(|v| format!(" (EBS volume {v})"))
            .unwrap_or_default()
    );
    match descs {
        None => println!("  descriptor list (CNS 03h): not supported by the controller"),
        Some(d) => {
            let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
            let or_none = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
            println!(
                "  descriptor list (CNS 03h): UUID {}, NGUID {}, EUI-64 {}, CSI {}",
                or_none(d.uuid.map(|v| nvme_resv::identity::uuid_text(&v))),
                or_none(d.nguid.map(|v| hex(&v))),
                or_none(d.eui64.map(|v| hex(&v))),
                or_none(d.csi.map(|v| format!("{v:#x}"))),
            );
        }
    }
    println!(
        "  reservations: {} (ONCS bit 5 {}, RESCAP {:#04x})",
        if c.reservations {
            "supported"
        } else {
            "NOT supported"
        },
        if c.oncs_reservations { "set" } else { "clear" },
        c.rescap
    );
    for t in ReservationType::ALL {
        println!("    {t}: {}", yes(c.supports(t)));
    }
    println!("  IEKEY (1.3 semantics): {}", yes(c.iekey));
    println!("  persist through power loss: {}", yes(c.ptpl));
    match ptpl_state {
        Ok(on) => println!(
            "  persistence now (Get Features 83h): PTPL {}",
            if *on { "on" } else { "off" }
        ),
        Err(e) => println!("  persistence now (Get Features 83h): unknown ({e})"),
    }
    println!(
        "  logical block size: {} bytes, {} blocks",
        c.lba_size, c.nsze
    );
}

/// What to do about an error, when there is something useful to say.
fn hint(e: &Error, dev: Option<&PathBuf>) -> Option<String> {
    if e.is_reservation_conflict() {
        return Some(
            "the device refused with Reservation Conflict: this host is not registered with \
             that key, another host holds the reservation, or this host was preempted; \
             run `nvme-resv report DEVICE` to see the registrants"
                .into(),
        );
    }
    match e {
        Error::PermissionDenied { .. } => Some(
            "run as root (CAP_SYS_ADMIN), or give write access to the device node".into(),
        ),
        Error::NotNvme { .. } => Some(
            "name an NVMe namespace: /dev/nvmeXnY (block) or /dev/ngXnY (generic char); \
             `ls /dev/nvme*n* /dev/ng*` lists them"
                .into(),
        ),
        Error::Open { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            Some("the device node does not exist; `ls /dev/nvme*n* /dev/ng*` lists namespaces".into())
        }
        Error::ZeroKey { .. } => Some("choose a non-zero key with --nrkey".into()),
        Error::Device { status, .. } if status.same_code(NvmeStatus::HOST_ID_INCONSISTENT_FORMAT) => {
            Some("the controller uses 128-bit host IDs: request the extended report (drop --regular)".into())
        }
        Error::Device { status, .. }
            if status.same_code(NvmeStatus::INVALID_OPCODE) || status.same_code(NvmeStatus::INVALID_FIELD) =>
        {
            let dev = dev?;
            let caps = Namespace::open(dev).and_then(|ns| ns.capabilities()).ok()?;
            if caps.reservations {
                Some("check the options: IEKEY is refused by Acquire/Release, and the type must be 1-6".into())
            } else {
                Some(format!(
                    "this namespace does not support reservations (ONCS bit 5 {}, RESCAP {:#04x}); \
                     on a Linux nvmet target, set resv_enable before enabling the namespace",
                    if caps.oncs_reservations { "set" } else { "clear" },
                    caps.rescap
                ))
            }
        }
        _ => None,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Verb::Generate {
        man_dir,
        completions_dir,
    } = &cli.verb
    {
        return generate(man_dir, completions_dir);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err((e, dev)) => {
            eprintln!("nvme-resv: error: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                eprintln!("  caused by: {s}");
                src = s.source();
            }
            if let Some(h) = hint(&e, dev.as_ref()) {
                eprintln!("  hint: {h}");
            }
            if e.is_reservation_conflict() {
                ExitCode::from(3)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_valid() {
        Cli::command().debug_assert();
    }

    #[test]
    fn keys_parse_as_decimal_or_hex() {
        assert_eq!(parse_key("0xaaaa"), Ok(Key(0xaaaa)));
        assert_eq!(parse_key("0XAAAA"), Ok(Key(0xaaaa)));
        assert_eq!(parse_key("43690"), Ok(Key(0xaaaa)));
        assert_eq!(parse_key("18446744073709551615"), Ok(Key(u64::MAX)));
        assert!(parse_key("0x1_0000_0000_0000_0000").is_err());
        assert!(parse_key("-1").is_err());
        assert!(parse_key("").is_err());
    }

    #[test]
    fn types_and_actions_parse_by_number_and_name() {
        assert_eq!(
            parse_rtype("3"),
            Ok(ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY)
        );
        assert_eq!(
            parse_rtype("ea-ar"),
            Ok(ReservationType::EXCLUSIVE_ACCESS_ALL_REGISTRANTS)
        );
        assert_eq!(
            parse_rtype("WE_RO"),
            Ok(ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY)
        );
        // Out-of-spec numbers pass through so the device can judge them.
        assert_eq!(parse_rtype("7"), Ok(ReservationType(7)));
        assert!(parse_rtype("256").is_err() && parse_rtype("exclusive").is_err());
        assert_eq!(parse_racqa("preempt"), Ok(AcquireAction::Preempt));
        assert_eq!(parse_racqa("2"), Ok(AcquireAction::PreemptAndAbort));
        assert!(parse_racqa("3").is_err());
        assert_eq!(parse_rrega("replace"), Ok(RegisterAction::Replace));
        assert_eq!(parse_rrela("1"), Ok(ReleaseAction::Clear));
        assert_eq!(parse_cptpl("3"), Ok(CptplArg::Set(Cptpl::Persist)));
        assert_eq!(parse_cptpl("AUTO"), Ok(CptplArg::Auto));
        assert!(parse_cptpl("1").is_err() && parse_cptpl("persist").is_err());
    }

    #[test]
    fn options_build_the_commands() {
        let cli = Cli::try_parse_from([
            "nvme-resv",
            "acquire",
            "/dev/nvme0n1",
            "-c",
            "0xb",
            "-p",
            "0xa",
            "-t",
            "we-ro",
            "-a",
            "preempt-abort",
        ])
        .unwrap();
        let Verb::Acquire(a) = cli.verb else {
            panic!("not acquire")
        };
        assert_eq!(
            (a.crkey, a.prkey, a.rtype, a.racqa, a.iekey),
            (
                Key(0xb),
                Key(0xa),
                ReservationType::WRITE_EXCLUSIVE_REGISTRANTS_ONLY,
                AcquireAction::PreemptAndAbort,
                false
            )
        );
        let cli = Cli::try_parse_from([
            "nvme-resv",
            "register",
            "/dev/ng0n1",
            "--rrega",
            "unregister",
            "--crkey",
            "5",
            "--iekey",
        ])
        .unwrap();
        let Verb::Register(r) = cli.verb else {
            panic!("not register")
        };
        assert_eq!(
            (r.rrega, r.crkey, r.iekey),
            (RegisterAction::Unregister, Key(5), true)
        );
        // --crkey and --rtype are required for acquire.
        assert!(Cli::try_parse_from(["nvme-resv", "acquire", "/dev/nvme0n1", "-t", "1"]).is_err());
    }
}
