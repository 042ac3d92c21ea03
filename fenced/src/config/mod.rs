//! Settings of `fenced run` and the etcd address of the operator commands, resolved
//! once, before anything touches etcd or a device.
//!
//! Precedence: a flag, then its environment variable (clap folds `FENCED_*` into the
//! flag, so both arrive here as the command-line layer), then the TOML file
//! (`--config`), then the defaults in [`defaults`]. One struct, [`Layer`], is both the
//! flag set and the file schema, so every key is named once.

use std::path::PathBuf;
use std::time::Duration;

use fenced::NodeId;
use fenced::agent::OnFenceConfig;
use fenced::fencer::PreemptMode;

mod approvals;
mod args;
mod check;
pub mod defaults;
mod error;
mod etcd;
mod file;
pub mod limits;

pub use approvals::ApprovalSettings;
pub use args::{EtcdArgs, FencerKind, Layer, PreemptArg, Role, RunArgs};
use check::{check_name, check_path, in_range};
pub use error::ConfigError;
pub use etcd::{EtcdSettings, command_wait};
#[cfg(test)]
use file::parse_file;
pub use file::{file_kind, load_file};

/// The EBS fencer's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EbsSettings {
    /// The shared volume; `None`: no EBS fencer.
    pub volume_id: Option<String>,
    /// Region override.
    pub region: Option<String>,
    /// EC2 endpoint override.
    pub endpoint_url: Option<String>,
}

/// Everything `fenced run` needs, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    pub etcd: EtcdSettings,
    pub node: NodeId,
    pub role: Role,
    /// `None`: ask the host (EC2 instance id, else machine id) when the daemon starts.
    pub instance_id: Option<String>,
    pub block_device: Option<PathBuf>,
    pub fencer: FencerKind,
    pub preempt: PreemptMode,
    pub ebs: EbsSettings,
    pub ttl: Duration,
    pub self_fence_margin: Duration,
    pub claim_ttl: Duration,
    pub sweep: Duration,
    pub arenas: usize,
    pub watchdog_device: Option<PathBuf>,
    /// `None`: wait for etcd as long as it takes.
    pub connect_timeout: Option<Duration>,
    /// `None`: the store's default for the lease TTL.
    pub etcd_keepalive_timeout: Option<Duration>,
    pub seed_arenas: Option<Vec<String>>,
    pub pid_file: Option<PathBuf>,
    /// `None`: no control socket (leave by SIGTERM only).
    pub control_socket: Option<PathBuf>,
    pub log_json: bool,
    /// What to do on a self-fence.
    pub on_fence: OnFenceConfig,
    /// Where this boot's id is read.
    pub boot_id_file: PathBuf,
    pub allow_unidentified_namespace: bool,
    pub metrics_listen: Option<std::net::SocketAddr>,
}

impl Settings {
    /// Resolves `run`'s settings: `cli` (flags, and the env vars clap folded into
    /// them) over `file` over [`defaults`]. Checks everything that can be checked
    /// without I/O: each value's range or rule, and the relations between them.
    pub fn resolve(cli: &RunArgs, file: Layer) -> Result<Self, ConfigError> {
        let etcd = EtcdSettings::resolve(&cli.etcd, &file)?;
        // Not the daemon's, but a bad value in its file fails here too, at start.
        ApprovalSettings::resolve(None, None, &file)?;
        let l = cli.settings.clone();
        let on_fence = on_fence_config(cli, &l, &file)?;
        let pick = |c: Option<u64>, f: Option<u64>| c.or(f);
        let node_id = l
            .node_id
            .or(file.node_id)
            .ok_or(ConfigError::MissingNodeId)?;
        let node = NodeId::new(&node_id)?;
        let instance_id = l.instance_id.or(file.instance_id);
        if let Some(id) = &instance_id {
            fenced::instance::check_instance_id(id)?;
        }
        let block_device = l.block_device.or(file.block_device);
        let ebs = EbsSettings {
            volume_id: l.ebs_volume_id.or(file.ebs_volume_id),
            region: l.ebs_region.or(file.ebs_region),
            endpoint_url: l.ebs_endpoint_url.or(file.ebs_endpoint_url),
        };
        if let Some(v) = &ebs.volume_id {
            check_name("--ebs-volume-id", v)?;
        }
        if let Some(r) = &ebs.region {
            check_name("--ebs-region", r)?;
        }
        let fencer = l.fencer.or(file.fencer).unwrap_or(
            if ebs.volume_id.is_some() && block_device.is_none() {
                FencerKind::Ebs
            } else {
                FencerKind::Nvme
            },
        );
        check_fencer(fencer, block_device.is_some(), ebs.volume_id.is_some())?;
        let role = l.role.or(file.role).unwrap_or_default();
        if role == Role::Controller && fencer == FencerKind::Nvme {
            return Err(ConfigError::NvmeControllerWithoutAgent);
        }
        let preempt = match l.preempt.or(file.preempt) {
            Some(PreemptArg::Preempt) => PreemptMode::Preempt,
            Some(PreemptArg::PreemptAndAbort) | None => PreemptMode::PreemptAndAbort,
        };
        let ttl_secs = pick(l.ttl_secs, file.ttl_secs).unwrap_or(defaults::TTL_SECS);
        let ttl = in_range(
            "--ttl-secs",
            ttl_secs,
            defaults::MIN_TTL_SECS,
            limits::MAX_TTL_SECS,
            "etcd lengthens a shorter lease to 2 s, and a fence starts about one TTL after a death",
        )?;
        let self_fence_margin = match pick(l.self_fence_margin_secs, file.self_fence_margin_secs) {
            None => defaults::SELF_FENCE_MARGIN_TTLS * ttl,
            Some(m) => in_range(
                "--self-fence-margin-secs",
                m,
                ttl_secs,
                limits::MAX_SELF_FENCE_MARGIN_SECS,
                "at least --ttl-secs: a shorter margin self-fences a node whose lease is still valid",
            )?,
        };
        let (min_claim, why_claim) = match (fencer, ebs.volume_id.is_some()) {
            (_, true) if cfg!(feature = "ebs") => (
                fenced::core::ClaimBudget::min_ttl_secs_for(Duration::from_secs(
                    ebs_deadline_secs(),
                )),
                "twice the EBS fence deadline (60 s): a claim's lease may be a quarter TTL old when won, the sever starts up to an eighth later and an eighth is kept as margin, so the fence gets half, and a claim outlives it",
            ),
            (FencerKind::Nvme, _) => (
                limits::MIN_NVME_CLAIM_TTL_SECS,
                "longer than an NVMe preempt and report, so a claim outlives the fence",
            ),
            _ => (
                limits::MIN_CLAIM_TTL_SECS,
                "an etcd lease (2 s) plus a fence's round trips; 0 fences nothing",
            ),
        };
        let claim_ttl = in_range(
            "--claim-ttl-secs",
            pick(l.claim_ttl_secs, file.claim_ttl_secs).unwrap_or(defaults::CLAIM_TTL_SECS),
            min_claim,
            limits::MAX_CLAIM_TTL_SECS,
            why_claim,
        )?;
        let sweep = in_range(
            "--sweep-secs",
            pick(l.sweep_secs, file.sweep_secs).unwrap_or(defaults::SWEEP_SECS),
            limits::MIN_SWEEP_SECS,
            limits::MAX_SWEEP_SECS,
            "each sweep reads every key under the root (at 0 an idle daemon sends thousands of transactions a second)",
        )?;
        let connect_timeout = pick(l.connect_timeout_secs, file.connect_timeout_secs)
            .map(|t| {
                in_range(
                    "--connect-timeout-secs",
                    t,
                    1,
                    limits::MAX_CONNECT_TIMEOUT_SECS,
                    "leave it unset to wait for etcd as long as it takes",
                )
            })
            .transpose()?;
        let etcd_keepalive_timeout = pick(
            l.etcd_keepalive_timeout_secs,
            file.etcd_keepalive_timeout_secs,
        )
        .map(|t| {
            in_range(
                "--etcd-keepalive-timeout-secs",
                t,
                defaults::MIN_ETCD_KEEPALIVE_TIMEOUT_SECS,
                ttl_secs,
                "at most --ttl-secs: a dead connection found later than the lease expires costs the node its membership",
            )
        })
        .transpose()?;
        if std::env::var_os("FENCED_ARENAS").is_some()
            && std::env::var_os("FENCED_ARENA_COUNT").is_none()
        {
            return Err(ConfigError::Renamed {
                old: "FENCED_ARENAS",
                new: "FENCED_ARENA_COUNT",
            });
        }
        let seed_arenas = l.seed_arenas.or(file.seed_arenas);
        let pid_file = l.pid_file.or(file.pid_file);
        let control_socket = l.control_socket.or(file.control_socket).or_else(|| {
            pid_file
                .as_ref()
                .map(|p| p.with_extension("sock"))
                .filter(|s| Some(s) != pid_file.as_ref())
        });
        if let Some(arenas) = &seed_arenas {
            for a in arenas {
                check_name("--seed-arenas", a)?;
            }
        }
        for (setting, p) in [
            ("--pid-file", pid_file.as_deref()),
            ("--control-socket", control_socket.as_deref()),
            ("--watchdog-device", l.watchdog_device.as_deref()),
            ("--block-device", block_device.as_deref()),
        ] {
            if let Some(p) = p {
                check_path(setting, p)?;
            }
        }

        Ok(Self {
            etcd,
            node,
            role,
            instance_id,
            block_device,
            fencer,
            preempt,
            ebs,
            ttl,
            self_fence_margin,
            claim_ttl,
            sweep,
            arenas: l
                .arena_count
                .or(file.arena_count)
                .unwrap_or(defaults::ARENAS),
            watchdog_device: l.watchdog_device.or(file.watchdog_device),
            connect_timeout,
            etcd_keepalive_timeout,
            seed_arenas,
            pid_file,
            control_socket,
            log_json: l.log_json || file.log_json,
            on_fence,
            boot_id_file: cli
                .boot_id_file
                .clone()
                .unwrap_or_else(|| PathBuf::from(fenced::agent::BOOT_ID_FILE)),
            allow_unidentified_namespace: cli.allow_unidentified_namespace,
            metrics_listen: l.metrics_listen.or(file.metrics_listen),
        })
    }
}

/// `--on-fence`, its hook timeout and (tests only) the SysRq file.
fn on_fence_config(cli: &RunArgs, l: &Layer, file: &Layer) -> Result<OnFenceConfig, ConfigError> {
    let mut c = OnFenceConfig::default();
    if let Some(a) = l.on_fence.as_ref().or(file.on_fence.as_ref()) {
        c.action = a.parse()?;
    }
    if let Some(t) = l.on_fence_timeout_secs.or(file.on_fence_timeout_secs) {
        c.hook_timeout = in_range(
            "--on-fence-timeout-secs",
            t,
            1,
            limits::MAX_ON_FENCE_TIMEOUT_SECS,
            "the hook must stop the application quickly; the daemon exits only after it",
        )?;
    }
    if let Some(p) = &cli.sysrq_trigger_file {
        c.sysrq_trigger.clone_from(p);
    }
    Ok(c)
}

/// The EBS fence's deadline in whole seconds (the claim must outlive it).
fn ebs_deadline_secs() -> u64 {
    #[cfg(feature = "ebs")]
    {
        fenced::ebs::DEFAULT_DEADLINE.as_secs()
    }
    #[cfg(not(feature = "ebs"))]
    {
        60
    }
}

/// The fencer's requirements: NVMe needs a device; EBS needs a volume (and the `ebs`
/// feature); single-signal takes no volume.
fn check_fencer(kind: FencerKind, device: bool, volume: bool) -> Result<(), ConfigError> {
    if cfg!(not(feature = "ebs")) && (kind == FencerKind::Ebs || volume) {
        return Err(ConfigError::EbsNotBuilt);
    }
    match kind {
        FencerKind::Ebs if !volume => Err(ConfigError::EbsWithoutVolume),
        FencerKind::None if volume => Err(ConfigError::EbsWithNone),
        FencerKind::Nvme if !device => Err(ConfigError::NvmeWithoutDevice),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    use fenced::store::EtcdSecurity;

    use super::etcd::ETCD_PASSWORD_ENV;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Run {
        #[command(flatten)]
        args: RunArgs,
    }

    fn cli(flags: &[&str]) -> RunArgs {
        Run::try_parse_from(std::iter::once("run").chain(flags.iter().copied()))
            .unwrap()
            .args
    }

    fn file(text: &str) -> Result<Layer, ConfigError> {
        parse_file(Path::new("/etc/fenced.toml"), text)
    }

    #[test]
    fn approvals_come_from_the_flag_else_the_file_and_are_range_checked() {
        let none = Layer::default();
        let d = ApprovalSettings::resolve(None, None, &none).unwrap();
        assert_eq!(
            (d.approvals, d.timeout),
            (
                defaults::APPROVALS,
                Duration::from_secs(defaults::APPROVAL_TIMEOUT_SECS)
            )
        );
        let f = file("approvals = 2\napproval_timeout_secs = 30\n").unwrap();
        let s = ApprovalSettings::resolve(None, None, &f).unwrap();
        assert_eq!((s.approvals, s.timeout), (2, Duration::from_secs(30)));
        let s = ApprovalSettings::resolve(Some(1), Some(5), &f).unwrap();
        assert_eq!((s.approvals, s.timeout), (1, Duration::from_secs(5)));
        for (text, setting) in [
            ("approvals = 3", "--approvals = 3: must be 1..=2"),
            ("approvals = 0", "--approvals = 0: must be 1..=2"),
            (
                "approval_timeout_secs = 0",
                "--approval-timeout-secs = 0: must be 1..=86400",
            ),
        ] {
            let e = ApprovalSettings::resolve(None, None, &file(text).unwrap()).unwrap_err();
            assert!(e.to_string().starts_with(setting), "{text}: {e}");
            // The daemon reads the same file: it refuses it at start.
            let e = Settings::resolve(
                &cli(&["--fencer", "none", "--node-id", "n1"]),
                file(text).unwrap(),
            )
            .unwrap_err();
            assert!(e.to_string().starts_with(setting), "{text}: {e}");
        }
        assert!(matches!(
            file("approvals = \"two\""),
            Err(ConfigError::Key { key, .. }) if key == "approvals"
        ));
    }

    #[test]
    fn flags_beat_the_file_and_the_file_beats_the_defaults() {
        let f = file(
            "node_id = \"from-file\"\nttl_secs = 9\nsweep_secs = 7\nfencer = \"none\"\n\
             etcd_endpoints = [\"http://file:2379\"]\nroot = \"/file/\"\n",
        )
        .unwrap();
        let c = cli(&[
            "--node-id",
            "from-cli",
            "--ttl-secs",
            "3",
            "--root",
            "/cli/",
        ]);
        let s = Settings::resolve(&c, f).unwrap();
        assert_eq!(s.node.as_str(), "from-cli");
        assert_eq!(s.ttl, Duration::from_secs(3));
        assert_eq!(s.self_fence_margin, Duration::from_secs(6), "2 x the TTL");
        assert_eq!(s.sweep, Duration::from_secs(7), "file over default");
        assert_eq!(s.fencer, FencerKind::None);
        assert_eq!(s.etcd.root, "/cli/");
        assert_eq!(s.etcd.endpoints, ["http://file:2379"]);
        assert_eq!(s.claim_ttl, Duration::from_secs(defaults::CLAIM_TTL_SECS));
    }

    #[test]
    fn the_package_config_is_read_when_no_config_is_named() {
        let pkg = Some(PathBuf::from(args::PACKAGE_CONFIG));
        assert_eq!(args::config_path(None, true), pkg);
        assert_eq!(args::config_path(None, false), None);
        let mine = Path::new("/tmp/mine.toml");
        assert_eq!(args::config_path(Some(mine), true), Some(mine.to_owned()));
        assert_eq!(args::config_path(Some(mine), false), Some(mine.to_owned()));
    }

    #[test]
    fn defaults_when_nothing_is_set() {
        let s = Settings::resolve(
            &cli(&["--node-id", "n1", "--fencer", "none"]),
            Layer::default(),
        )
        .unwrap();
        assert_eq!(
            s.etcd,
            EtcdSettings {
                endpoints: vec![defaults::ETCD_ENDPOINT.into()],
                root: defaults::ROOT.into(),
                security: EtcdSecurity {
                    password: std::env::var(ETCD_PASSWORD_ENV).ok(),
                    ..EtcdSecurity::default()
                },
                endpoints_from: s.etcd.endpoints_from.clone(),
            }
        );
        assert!(
            s.etcd.endpoints_from.starts_with("the default"),
            "{}",
            s.etcd.endpoints_from
        );
        assert_eq!(s.ttl, Duration::from_secs(5));
        assert_eq!(s.self_fence_margin, Duration::from_secs(10));
        assert_eq!(s.sweep, Duration::from_secs(30));
        assert_eq!(s.arenas, 0);
        assert_eq!(s.preempt, PreemptMode::PreemptAndAbort);
        assert_eq!(s.connect_timeout, None);
        assert_eq!(s.etcd_keepalive_timeout, None);
        assert_eq!(s.instance_id, None);
        assert_eq!(s.role, Role::Both);
    }

    #[test]
    fn values_out_of_range_are_refused_naming_the_setting() {
        let run = |flags: &[&str]| {
            let mut all = vec!["--node-id", "n1", "--fencer", "none"];
            all.extend_from_slice(flags);
            Settings::resolve(&cli(&all), Layer::default())
        };
        for (flags, setting) in [
            (&["--ttl-secs", "1"][..], "--ttl-secs"),
            (&["--ttl-secs", "0"], "--ttl-secs"),
            (&["--ttl-secs", "18446744073709551615"], "--ttl-secs"),
            (&["--claim-ttl-secs", "0"], "--claim-ttl-secs"),
            (&["--claim-ttl-secs", "2"], "--claim-ttl-secs"),
            (&["--sweep-secs", "0"], "--sweep-secs"),
            (&["--sweep-secs", "99999"], "--sweep-secs"),
            (&["--connect-timeout-secs", "0"], "--connect-timeout-secs"),
            (
                &["--etcd-keepalive-timeout-secs", "0"],
                "--etcd-keepalive-timeout-secs",
            ),
            (
                &["--ttl-secs", "5", "--etcd-keepalive-timeout-secs", "6"],
                "--etcd-keepalive-timeout-secs",
            ),
            (
                &["--ttl-secs", "5", "--self-fence-margin-secs", "4"],
                "--self-fence-margin-secs",
            ),
            (
                &["--self-fence-margin-secs", "18446744073709551615"],
                "--self-fence-margin-secs",
            ),
        ] {
            let e = run(flags).unwrap_err();
            assert!(
                matches!(&e, ConfigError::OutOfRange { setting: s, .. } if *s == setting),
                "{flags:?}: {e}"
            );
            let line = e.to_string();
            assert!(line.starts_with(&format!("{setting} = ")), "{line}");
            assert!(line.contains("must be") && line.contains(": "), "{line}");
        }
        // The NVMe fencer needs a longer claim than single-signal fencing.
        let e = Settings::resolve(
            &cli(&[
                "--node-id",
                "n1",
                "--block-device",
                "/dev/nvme1n1",
                "--claim-ttl-secs",
                "5",
            ]),
            Layer::default(),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("--claim-ttl-secs = 5: must be 10..="),
            "{e}"
        );
        if cfg!(feature = "ebs") {
            // Issue 26, hole 3: with EBS the claim must hold a spare's age, the time
            // before the sever, the 60 s deadline and a margin: 90 s (more than the
            // deadline) is refused at start, 120 s accepted.
            let ebs = |ttl: &str| {
                Settings::resolve(
                    &cli(&[
                        "--node-id",
                        "n1",
                        "--ebs-volume-id",
                        "vol-1",
                        "--claim-ttl-secs",
                        ttl,
                    ]),
                    Layer::default(),
                )
            };
            let e = ebs("90").unwrap_err();
            assert!(
                e.to_string()
                    .starts_with("--claim-ttl-secs = 90: must be 120..="),
                "{e}"
            );
            assert!(ebs("120").is_ok());
        }
        // The boundaries themselves are accepted.
        let s = run(&[
            "--ttl-secs",
            "2",
            "--claim-ttl-secs",
            "3",
            "--sweep-secs",
            "1",
        ])
        .unwrap();
        assert_eq!(s.ttl, Duration::from_secs(2));
        assert_eq!(s.claim_ttl, Duration::from_secs(3));
        assert_eq!(s.sweep, Duration::from_secs(1));
        let f = file("etcd_keepalive_timeout_secs = 1\n").unwrap();
        let s = Settings::resolve(&cli(&["--node-id", "n1", "--fencer", "none"]), f).unwrap();
        assert_eq!(s.etcd_keepalive_timeout, Some(Duration::from_secs(1)));
    }

    #[test]
    fn untrusted_strings_are_refused_naming_the_setting() {
        let run = |flags: &[&str]| {
            let mut all = vec!["--node-id", "n1", "--fencer", "none"];
            all.extend_from_slice(flags);
            Settings::resolve(&cli(&all), Layer::default())
        };
        for (flags, start) in [
            (
                &["--instance-id", "i-1\nforged"][..],
                "--instance-id: invalid instance id \"i-1\\nforged\"",
            ),
            (
                &["--instance-id", ""],
                "--instance-id: invalid instance id: empty",
            ),
            (
                &["--etcd-endpoints", "ftp://h:1"],
                "--etcd-endpoints = \"ftp://h:1\": unsupported scheme",
            ),
            (
                &["--etcd-endpoints", "http://h"],
                "--etcd-endpoints = \"http://h\": not an etcd URL",
            ),
            (
                &["--etcd-endpoints", "http://h:99999"],
                "--etcd-endpoints = \"http://h:99999\"",
            ),
            (
                &["--etcd-endpoints", "http://a b:1"],
                "--etcd-endpoints = \"http://a b:1\"",
            ),
            (&["--etcd-endpoints", ""], "--etcd-endpoints = \"\""),
            (
                &["--root", "fenced"],
                "--root = \"fenced\": a key root starts with /",
            ),
            (&["--root", "/a\nb"], "--root = \"/a\\nb\""),
            (&["--seed-arenas", "a1,a/2"], "--seed-arenas = \"a/2\""),
            (
                &["--pid-file", "/run/x\ny.pid"],
                "--pid-file = \"/run/x\\ny.pid\"",
            ),
        ] {
            let e = run(flags).unwrap_err();
            let line = e.to_string();
            assert!(line.starts_with(start), "{flags:?}: {line}");
            assert!(!line.contains('\n'), "{line}");
        }
        for ok in [
            "http://127.0.0.1:2379",
            "https://etcd-1.example.com:2379/",
            "10.0.0.5:2379",
            "http://[::1]:2379",
        ] {
            run(&["--etcd-endpoints", ok]).unwrap();
        }
    }

    #[test]
    fn the_control_socket_defaults_to_the_pid_files_name() {
        let run = |flags: &[&str]| {
            let mut all = vec!["--node-id", "n1", "--fencer", "none"];
            all.extend_from_slice(flags);
            Settings::resolve(&cli(&all), Layer::default()).unwrap()
        };
        assert_eq!(
            run(&["--pid-file", "/run/fenced.pid"]).control_socket,
            Some(PathBuf::from("/run/fenced.sock"))
        );
        assert_eq!(
            run(&["--pid-file", "/run/f.pid", "--control-socket", "/run/c"]).control_socket,
            Some(PathBuf::from("/run/c"))
        );
        assert_eq!(run(&[]).control_socket, None);
    }

    #[test]
    fn every_file_key_is_accepted() {
        let f = file(
            r#"
            etcd_endpoints = ["http://a:2379", "http://b:2379"]
            root = "/r/"
            node_id = "n1"
            instance_id = "i-1"
            block_device = "/dev/nvme1n1"
            fencer = "nvme"
            preempt = "preempt"
            ebs_volume_id = "vol-1"
            ebs_region = "eu-west-1"
            ebs_endpoint_url = "http://127.0.0.1:5000"
            ttl_secs = 5
            self_fence_margin_secs = 9
            claim_ttl_secs = 150
            sweep_secs = 2
            arenas = 3
            watchdog_device = "/dev/watchdog"
            connect_timeout_secs = 11
            etcd_keepalive_timeout_secs = 5
            "#,
        )
        .unwrap();
        assert_eq!(f.etcd_endpoints.as_ref().map(Vec::len), Some(2));
        assert_eq!(f.preempt, Some(PreemptArg::Preempt));
        assert_eq!(f.etcd_keepalive_timeout_secs, Some(5));
        if cfg!(feature = "ebs") {
            let s = Settings::resolve(&cli(&[]), f).unwrap();
            assert_eq!(s.node.as_str(), "n1");
            assert_eq!(s.preempt, PreemptMode::Preempt);
            assert_eq!(s.self_fence_margin, Duration::from_secs(9));
            assert_eq!(s.connect_timeout, Some(Duration::from_secs(11)));
            assert_eq!(s.ebs.region.as_deref(), Some("eu-west-1"));
        }
    }

    #[test]
    fn unknown_keys_are_errors_naming_the_key() {
        let e = file("node_id = \"n1\"\nttl = 5\n").unwrap_err();
        assert!(
            matches!(&e, ConfigError::Key { key, .. } if key == "ttl"),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("key `ttl`: unknown key; did you mean `ttl_secs`?"),
            "{e}"
        );
        // The nearest key, not the whole list.
        let e = file("ttl_sec = 5\n").unwrap_err().to_string();
        assert!(e.ends_with("unknown key; did you mean `ttl_secs`?"), "{e}");
        let e = file("metrics-listen = \"127.0.0.1:9\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("did you mean `metrics_listen`?"), "{e}");
        let e = file("colour = 1\n").unwrap_err().to_string();
        assert!(!e.contains("did you mean"), "{e}");
        // The file names itself on the command line only.
        assert!(matches!(
            file("config = \"x\""),
            Err(ConfigError::Key { .. })
        ));
    }

    /// README: "every flag has an environment variable and a TOML config key". Over the
    /// whole of `fenced run`'s flags: each has a `FENCED_*` variable named after it, and
    /// each but the deliberate exceptions is a key of the file, listed in
    /// [`Layer::KEYS`] (which the file's misspelling hints use).
    #[test]
    fn every_flag_has_a_variable_and_a_config_key() {
        use clap::CommandFactory;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            run: RunArgs,
        }
        // Command line and environment only, on purpose: the file names itself; two
        // test-only overrides; and an override that weakens a safety check, which a
        // config file shared between hosts must not carry.
        const NOT_IN_FILE: [&str; 4] = [
            "config",
            "boot_id_file",
            "sysrq_trigger_file",
            "allow_unidentified_namespace",
        ];
        let cmd = Cli::command();
        let mut flags = 0;
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if ["help", "version"].contains(&long) {
                continue;
            }
            flags += 1;
            // Every flag says its default (README: `fenced run --help` is the reference).
            let help = [arg.get_help(), arg.get_long_help()]
                .into_iter()
                .flatten()
                .map(|h| h.to_string().to_lowercase())
                .collect::<String>();
            assert!(
                help.contains("default") || help.contains("required"),
                "--{long}'s help names no default: {help}"
            );
            let key = long.replace('-', "_");
            let var = match key.as_str() {
                // Its variable predates the rule; renaming it would break units.
                "watchdog_device" => "FENCED_WATCHDOG".to_owned(),
                _ => format!("FENCED_{}", key.to_uppercase()),
            };
            assert_eq!(
                arg.get_env().and_then(|v| v.to_str()),
                Some(var.as_str()),
                "--{long} has no {var}"
            );
            if NOT_IN_FILE.contains(&key.as_str()) {
                assert!(!Layer::KEYS.contains(&key.as_str()), "{key}");
                continue;
            }
            assert!(
                Layer::KEYS.contains(&key.as_str()),
                "--{long}: no key {key}"
            );
            // Known to the file's schema: any error is about the value, never the key.
            if let Err(e) = file(&format!("{key} = \"x\"\n")) {
                assert!(!e.to_string().contains("unknown key"), "{key}: {e}");
            }
        }
        assert!(flags >= 30, "only {flags} flags seen");
        // And no key without a flag (the etcd and approval keys' flags are declared by
        // EtcdArgs and `fenced attest`).
        for key in Layer::KEYS {
            let long = key.replace('_', "-");
            let flag = cmd.get_arguments().any(|a| a.get_long() == Some(&long))
                || ["approvals", "approval_timeout_secs"].contains(key);
            assert!(flag, "config key {key} has no flag");
        }
    }

    #[test]
    fn bad_values_are_errors_naming_the_key() {
        let e = file("node_id = \"n1\"\nttl_secs = \"five\"\n").unwrap_err();
        assert!(
            matches!(&e, ConfigError::Key { key, .. } if key == "ttl_secs"),
            "{e}"
        );
        assert!(
            e.to_string()
                .starts_with("invalid config /etc/fenced.toml: key `ttl_secs`: ")
        );
        let e = file("fencer = \"scsi\"\n").unwrap_err();
        assert!(
            matches!(&e, ConfigError::Key { key, .. } if key == "fencer"),
            "{e}"
        );
        let e = file("root = \"/r/\"\nthis is not toml\n").unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { line: 2, .. }), "{e}");
        let e = Settings::resolve(
            &cli(&["--fencer", "none"]),
            file("node_id = \"a/b\"").unwrap(),
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("invalid node id \"a/b\""), "{e}");
    }

    /// The commented example installed as /etc/fenced/fenced.toml.
    const EXAMPLE: &str = include_str!("../../../packaging/fenced.toml");

    /// The example's `# key = value` lines, uncommented.
    fn example_assignments() -> Vec<&'static str> {
        EXAMPLE
            .lines()
            .filter_map(|l| l.strip_prefix("# "))
            .filter(|l| {
                l.split_once(" = ").is_some_and(|(k, _)| {
                    !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                })
            })
            .collect()
    }

    #[test]
    fn the_example_config_parses_as_shipped_and_with_every_key_set() {
        let path = Path::new("packaging/fenced.toml");
        assert_eq!(
            parse_file(path, EXAMPLE).unwrap(),
            Layer::default(),
            "shipped with every key commented out"
        );
        let all = example_assignments().join("\n");
        // A misspelt key or a value of the wrong type fails here, naming the key.
        let f = parse_file(path, &all).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f.node_id.as_deref(), Some("db1"));
        if cfg!(feature = "ebs") {
            let s = Settings::resolve(&cli(&[]), f.clone()).unwrap_or_else(|e| panic!("{e}"));
            // "Keys left commented out take the default shown."
            assert_eq!(s.etcd.endpoints, [defaults::ETCD_ENDPOINT]);
            assert_eq!(s.etcd.root, defaults::ROOT);
            assert_eq!(s.ttl, Duration::from_secs(defaults::TTL_SECS));
            assert_eq!(
                s.self_fence_margin,
                defaults::SELF_FENCE_MARGIN_TTLS * s.ttl
            );
            assert_eq!(s.claim_ttl, Duration::from_secs(defaults::CLAIM_TTL_SECS));
            assert_eq!(s.sweep, Duration::from_secs(defaults::SWEEP_SECS));
            assert_eq!(s.arenas, defaults::ARENAS);
            assert_eq!(s.preempt, PreemptMode::PreemptAndAbort);
            assert_eq!(s.fencer, FencerKind::Nvme);
        }
        let approval = ApprovalSettings::resolve(None, None, &f).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(approval.approvals, defaults::APPROVALS);
        assert_eq!(
            approval.timeout,
            Duration::from_secs(defaults::APPROVAL_TIMEOUT_SECS)
        );
    }

    #[test]
    fn the_example_config_shows_every_key() {
        // The parser's own list of the keys it accepts, from serde's unknown-field
        // message ("unknown field `x`, expected one of `a`, `b`, ..."): the same as
        // Layer::KEYS, which the misspelling hints use.
        let message = toml::from_str::<Layer>("not_a_key = 1")
            .unwrap_err()
            .message()
            .to_owned();
        let expected = message
            .split_once("expected one of ")
            .unwrap_or_else(|| panic!("no key list in {message:?}"))
            .1;
        let keys: Vec<&str> = expected.split(", ").map(|k| k.trim_matches('`')).collect();
        assert!(
            keys.contains(&"node_id") && keys.contains(&"root"),
            "{keys:?}"
        );
        let mut schema: Vec<&str> = keys.iter().copied().filter(|k| *k != "arenas").collect();
        let mut listed = Layer::KEYS.to_vec();
        schema.sort_unstable();
        listed.sort_unstable();
        assert_eq!(schema, listed, "Layer::KEYS differs from the file's schema");
        let keys = listed;
        let shown: Vec<&str> = example_assignments()
            .iter()
            .filter_map(|l| l.split_once(" = ").map(|(k, _)| k))
            .collect();
        let missing: Vec<&&str> = keys.iter().filter(|k| !shown.contains(k)).collect();
        assert!(
            missing.is_empty(),
            "packaging/fenced.toml does not show {missing:?}: add a commented `# key = value` line for each"
        );
    }

    #[test]
    fn fencer_requirements_are_checked_before_any_io() {
        let e = Settings::resolve(&cli(&["--node-id", "n1"]), Layer::default()).unwrap_err();
        assert!(matches!(e, ConfigError::NvmeWithoutDevice), "{e}");
        let e = Settings::resolve(&cli(&[]), Layer::default()).unwrap_err();
        assert!(matches!(e, ConfigError::MissingNodeId), "{e}");
        let ebs = cli(&["--node-id", "n1", "--ebs-volume-id", "vol-1"]);
        let none = cli(&[
            "--node-id",
            "n1",
            "--fencer",
            "none",
            "--ebs-volume-id",
            "v",
        ]);
        if cfg!(feature = "ebs") {
            let s = Settings::resolve(&ebs, Layer::default()).unwrap();
            assert_eq!(
                s.fencer,
                FencerKind::Ebs,
                "a volume and no device: EBS alone"
            );
            let e = Settings::resolve(&none, Layer::default()).unwrap_err();
            assert!(matches!(e, ConfigError::EbsWithNone), "{e}");
            let e = Settings::resolve(
                &cli(&["--node-id", "n", "--fencer", "ebs"]),
                Layer::default(),
            )
            .unwrap_err();
            assert!(matches!(e, ConfigError::EbsWithoutVolume), "{e}");
        } else {
            let e = Settings::resolve(&ebs, Layer::default()).unwrap_err();
            assert!(matches!(e, ConfigError::EbsNotBuilt), "{e}");
        }
    }

    /// The config parser and the resolver on any text: never a panic; an error is one
    /// line naming the line (syntax) or the key (unknown key, wrong type) or the
    /// setting (out of range).
    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        /// Every key of the file ([`Layer::KEYS`]), and two it does not take: `ttl`
        /// (unknown) and `arenas` (the schema's alias), so the error paths are fuzzed too.
        fn keys() -> Vec<&'static str> {
            Layer::KEYS
                .iter()
                .copied()
                .chain(["ttl", "arenas"])
                .collect()
        }

        fn value() -> impl Strategy<Value = String> {
            prop_oneof![
                any::<u64>().prop_map(|v| v.to_string()),
                any::<i64>().prop_map(|v| v.to_string()),
                (0u64..200).prop_map(|v| v.to_string()),
                "\"[ -~]{0,24}\"",
                "\"[a-z0-9./:-]{0,12}\"",
                Just("true".to_owned()),
                Just("1.5e300".to_owned()),
                "\\[(\"[a-z0-9:/.]{0,12}\", ?){0,3}\\]",
                "[^\n]{0,12}",
            ]
        }

        fn line() -> impl Strategy<Value = String> {
            prop_oneof![
                4 => (prop::sample::select(keys()), value()).prop_map(|(k, v)| format!("{k} = {v}")),
                1 => "\\[[a-z_.]{0,8}\\]",
                1 => "[^\n]{0,40}",
            ]
        }

        fn check(text: &str) {
            let path = Path::new("/etc/fenced.toml");
            let layer = match parse_file(path, text) {
                Ok(layer) => layer,
                Err(e) => {
                    let msg = e.to_string();
                    assert!(!msg.contains('\n'), "{msg}");
                    match e {
                        ConfigError::Syntax { line, .. } => {
                            assert!(line >= 1 && line <= text.matches('\n').count() + 1, "{msg}");
                        }
                        ConfigError::Key { key, .. } => {
                            // A quoted key may be spelled with escapes.
                            assert!(
                                text.contains(&key) || text.contains('"') || text.contains('\''),
                                "{msg}"
                            );
                        }
                        other => panic!("unexpected error kind: {other}"),
                    }
                    return;
                }
            };
            for flags in [&["--node-id", "n1", "--fencer", "none"][..], &[]] {
                if let Err(e) = Settings::resolve(&cli(flags), layer.clone()) {
                    let msg = e.to_string();
                    assert!(!msg.contains('\n') && !msg.is_empty(), "{msg}");
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            #[test]
            fn any_text(text in "(?s).{0,300}") {
                check(&text);
            }

            #[test]
            fn toml_like_text(lines in prop::collection::vec(line(), 0..14)) {
                check(&lines.join("\n"));
            }
        }
    }
}
