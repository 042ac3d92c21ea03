//! `fenced etcd-roles`: the etcd roles and grants of a deployment (one per node, the
//! controller's, the operator's), printed as `etcdctl` commands, and with `--apply`
//! created through etcd's auth API (see `fenced::store::roles`).

use std::process::ExitCode;

use fenced::NodeId;
use fenced::keys::Keys;
use fenced::store::roles::{apply_roles, role_plan, role_steps};

use super::OpError;
use crate::config::{self, EtcdArgs, EtcdSettings};

#[derive(Debug, clap::Args)]
pub struct RolesArgs {
    #[command(flatten)]
    pub etcd: EtcdArgs,
    /// The nodes, comma separated: one role `fenced-node-<n>` and one user `<n>` each.
    #[arg(long, value_delimiter = ',', required = true)]
    pub nodes: Vec<String>,
    /// The arenas, comma separated: each node is granted its own claim key of each
    /// (`arena_claim/<arena>/<n>`), and `--apply` puts them into the pool. A node can
    /// claim no arena left out; run again with the longer list to add arenas.
    #[arg(long, value_delimiter = ',', value_parser = arena_name)]
    pub arenas: Vec<String>,
    /// Create the roles, the node users (certificate identity: no password) and each
    /// node's `gen/<n>` in etcd, as etcd's root (its certificate or user). Without
    /// it, only print.
    #[arg(long)]
    pub apply: bool,
}

/// An arena name as the key layout takes it.
fn arena_name(s: &str) -> Result<String, String> {
    fenced::keys::decode_arena_name(s)
        .map(str::to_owned)
        .map_err(|e| e.to_string())
}

/// Shell-quoted `value` (single quotes).
fn quoted(value: &str) -> String {
    format!("'{}'", value.replace('\'', "'\\''"))
}

/// The `ETCDCTL_*` variables that point `etcdctl` at `settings`' etcd with its TLS
/// files and user, as `export` lines (the password is never printed: etcdctl asks).
fn etcdctl_env(settings: &EtcdSettings) -> Vec<String> {
    let mut vars = vec![
        ("ETCDCTL_API", "3".to_owned()),
        ("ETCDCTL_ENDPOINTS", settings.endpoints.join(",")),
    ];
    let sec = &settings.security;
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string());
    for (name, value) in [
        ("ETCDCTL_CACERT", path(&sec.ca)),
        ("ETCDCTL_CERT", path(&sec.cert)),
        ("ETCDCTL_KEY", path(&sec.key)),
        ("ETCDCTL_USER", sec.user.clone()),
    ] {
        if let Some(v) = value {
            vars.push((name, v));
        }
    }
    vars.into_iter()
        .map(|(k, v)| format!("export {k}={}", quoted(&v)))
        .collect()
}

pub async fn etcd_roles(args: RolesArgs) -> Result<ExitCode, OpError> {
    let nodes = args
        .nodes
        .iter()
        .map(|n| NodeId::new(n))
        .collect::<Result<Vec<_>, _>>()?;
    let file = config::load_file(args.etcd.config_path().as_deref())?;
    let settings = EtcdSettings::resolve(&args.etcd, &file)?;
    let keys = Keys::new(&settings.root);
    let roles = role_plan(&keys, &nodes, &args.arenas);
    let steps = role_steps(&roles, &args.arenas);
    if !args.apply {
        println!("# What `fenced etcd-roles --apply` does, step by step, as etcdctl commands run");
        println!("# as etcd's root (its client certificate or user; enable auth afterwards).");
        for line in etcdctl_env(&settings) {
            println!("{line}");
        }
    }
    // With --apply too: the record of what is applied.
    for step in &steps {
        println!("{}", step.etcdctl(&keys));
    }
    if args.apply {
        let store = super::connect(&args.etcd).await?;
        apply_roles(&store.client(), &keys, &steps)
            .await
            .map_err(OpError::store("apply the etcd roles"))?;
        println!(
            "applied {} roles; grant {} to the controllers' users and {} to the operators'",
            roles.len(),
            fenced::store::roles::CONTROLLER_ROLE,
            fenced::store::roles::OPERATOR_ROLE
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_etcdctl_commands() {
        let keys = Keys::new("/f/");
        let arenas = ["x".to_owned()];
        let roles = role_plan(&keys, &[NodeId::new("a").unwrap()], &arenas);
        let c: Vec<String> = role_steps(&roles, &arenas)
            .iter()
            .map(|s| s.etcdctl(&keys))
            .collect();
        assert!(c.contains(&"etcdctl role add fenced-node-a".to_owned()));
        assert!(c.contains(
            &"etcdctl role grant-permission fenced-node-a readwrite /f/membership/a".to_owned()
        ));
        assert!(
            c.contains(
                &"etcdctl role grant-permission fenced-controller --prefix readwrite /f/gen/"
                    .to_owned()
            )
        );
        assert!(c.contains(&"etcdctl user grant-role a fenced-node-a".to_owned()));
        assert!(c.contains(
            &"etcdctl role grant-permission fenced-node-a readwrite /f/arena_claim/x/a".to_owned()
        ));
        // The seeding --apply does, printed too (it was left out).
        assert!(
            c.iter()
                .any(|l| l.contains("put /f/gen/a 0") && l.contains("put /f/fence_done/a 0")),
            "{c:#?}"
        );
        assert!(
            c.iter().any(|l| l.contains("put /f/arena_pool/x")),
            "{c:#?}"
        );
    }

    #[test]
    fn the_environment_names_the_endpoints_and_files_never_a_password() {
        let settings = EtcdSettings {
            endpoints: vec!["https://e1:2379".into(), "https://e2:2379".into()],
            root: "/f/".into(),
            security: fenced::store::EtcdSecurity {
                ca: Some("/etc/ca's.pem".into()),
                user: Some("root".into()),
                password: Some("secret".into()),
                ..Default::default()
            },
            endpoints_from: String::new(),
        };
        let env = etcdctl_env(&settings).join("\n");
        assert!(env.contains("export ETCDCTL_ENDPOINTS='https://e1:2379,https://e2:2379'"));
        assert!(
            env.contains("export ETCDCTL_CACERT='/etc/ca'\\''s.pem'"),
            "{env}"
        );
        assert!(env.contains("export ETCDCTL_USER='root'"));
        assert!(!env.contains("secret"));
    }
}
