//! `fenced etcd-roles`: the etcd roles and grants of a deployment (one per node, the
//! controller's, the operator's), printed as `etcdctl` commands, and with `--apply`
//! created through etcd's auth API (see `fenced::store::roles`).

use std::process::ExitCode;

use fenced::NodeId;
use fenced::keys::Keys;
use fenced::store::roles::{EtcdRole, apply_roles, role_plan};

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

/// The `etcdctl` commands that create `roles` and put `arenas` into the pool (what
/// `--apply` does, minus the seeded generations).
fn commands(keys: &Keys, roles: &[EtcdRole], arenas: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for r in roles {
        out.push(format!("etcdctl role add {}", r.name));
        for g in &r.grants {
            out.push(format!(
                "etcdctl role grant-permission {}{} {} {}",
                r.name,
                if g.prefix { " --prefix" } else { "" },
                if g.write { "readwrite" } else { "read" },
                g.key
            ));
        }
        if let Some(n) = &r.node {
            out.push(format!("etcdctl user add {n} --no-password"));
            out.push(format!("etcdctl user grant-role {n} {}", r.name));
        }
    }
    for a in arenas {
        out.push(format!("etcdctl put {} ''", keys.arena_pool(a)));
    }
    out
}

pub async fn etcd_roles(args: RolesArgs) -> Result<ExitCode, OpError> {
    let nodes = args
        .nodes
        .iter()
        .map(|n| NodeId::new(n))
        .collect::<Result<Vec<_>, _>>()?;
    let file = config::load_file(args.etcd.config.as_deref())?;
    let settings = EtcdSettings::resolve(&args.etcd, &file)?;
    let keys = Keys::new(&settings.root);
    let roles = role_plan(&keys, &nodes, &args.arenas);
    for line in commands(&keys, &roles, &args.arenas) {
        println!("{line}");
    }
    if args.apply {
        let store = super::connect(&args.etcd).await?;
        apply_roles(&store.client(), &keys, &roles, &args.arenas)
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
        let c = commands(&keys, &roles, &arenas);
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
        assert!(c.contains(&"etcdctl put /f/arena_pool/x ''".to_owned()));
    }
}
