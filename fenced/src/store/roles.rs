//! etcd RBAC for the key layout: which prefixes each actor writes, as etcd roles
//! (`fenced etcd-roles`), and applying them through etcd's auth API.
//!
//! Every role reads the whole root (the watch, the sweep, `status`). Writes:
//!
//! - `fenced-node-<n>`, a node agent: exactly its own `membership/<n>`,
//!   `instance/<n>`, `liveness/<n>` (its record, and the agent's periodic check that
//!   it may still write its own keys: a revoked node self-fences), `departed/<n>`,
//!   `fence_pending/<n>`, `fence_done/<n>` (the join drops its own stale intent and
//!   mark), `boot/<n>` (the join's and a clean leave's boot record), `namespace` (the
//!   first join with a device records its identity), the prefix `arena_node/<n>/`, and
//!   for each arena of the deployment (`--arenas`) its own claim key
//!   `arena_claim/<arena>/<n>`, one grant each: a claim is created only while no key
//!   of that arena's claim range exists (compared by the claim transaction), so a node
//!   can neither create a second owner of an arena nor release or forge another
//!   node's claim. (Out of protocol, a node can still put its own claim key on an
//!   arena another node owns: that reserves the arena for it once the owner lets it go,
//!   which a node may do by claiming anyway; the owner's claim is untouched.)
//!   No `gen/`: the generation of a node is created by `--apply` (below), so an agent
//!   never writes one.
//! - `fenced-controller`: the fence path for every node: `fence_pending/`,
//!   `fence_claim/`, `gen/`, `fence_done/`, `audit/`, and the fenced node's arenas
//!   (`arena_claim/`, `arena_node/`); the pool `arena_pool/` (`--seed-arenas`) and the
//!   older layout's `arena_owner/`, `arena_free/` (which `--seed-arenas` converts); and
//!   `controller/` (its presence, the sweep stamp: who claims first and who sweeps).
//! - `fenced-operator`: `fenced attest` runs the same fence path, so the same writes
//!   as the controller, plus `approval/` (two-person fences, `fenced approve`) and `boot/`
//!   (`fenced unfence`); a separate role so people and daemons are granted apart.

use etcd_client::{Client, Permission, Txn, TxnOp, UserAddOptions};

use super::{Result, StoreError, absent};
use crate::keys::Keys;
use crate::node::NodeId;

/// Read or write access to one key or to every key under a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The key, or the prefix when `prefix`.
    pub key: String,
    /// A prefix (all keys starting with `key`) rather than one key.
    pub prefix: bool,
    /// Write access (read-write); else read only.
    pub write: bool,
}

/// One etcd role and its grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdRole {
    /// Role name (`fenced-node-<n>`, `fenced-controller`, `fenced-operator`).
    pub name: String,
    /// What it may read and write.
    pub grants: Vec<Grant>,
    /// The node this role belongs to (node roles only).
    pub node: Option<NodeId>,
}

/// Name of the controller role.
pub const CONTROLLER_ROLE: &str = "fenced-controller";
/// Name of the operator role.
pub const OPERATOR_ROLE: &str = "fenced-operator";

/// Name of a node's role.
pub fn node_role(node: &NodeId) -> String {
    format!("fenced-node-{node}")
}

fn read_prefix(k: &str) -> Grant {
    Grant {
        key: k.to_owned(),
        prefix: true,
        write: false,
    }
}

fn write_key(k: String) -> Grant {
    Grant {
        key: k,
        prefix: false,
        write: true,
    }
}

fn write_prefix(k: String) -> Grant {
    Grant {
        key: k,
        prefix: true,
        write: true,
    }
}

/// The roles of a deployment under `keys` with `nodes` sharing `arenas`: one per node,
/// then the controller's and the operator's.
pub fn role_plan(keys: &Keys, nodes: &[NodeId], arenas: &[String]) -> Vec<EtcdRole> {
    let mut roles = Vec::with_capacity(nodes.len() + 2);
    for n in nodes {
        let mut grants = vec![
            read_prefix(keys.root()),
            write_key(keys.membership(n)),
            write_key(keys.instance(n)),
            // The liveness record, and the keepalive's write-permission check
            // (a transaction that would put it, whose guard never holds).
            write_key(keys.liveness(n)),
            write_key(keys.departed(n)),
            write_key(keys.pending(n)),
            write_key(keys.done(n)),
            // The join's and the leave's boot record (the restart rules).
            write_key(keys.boot(n)),
            write_prefix(keys.arena_node_prefix(n)),
            // The first join records the shared namespace's identity (create-only in
            // the protocol; etcd cannot grant "create only": a node could rewrite it,
            // which makes fences fail their namespace check, never succeed wrongly).
            write_key(keys.namespace()),
        ];
        // Its own claim of each arena, and nothing of the arena's other claims.
        grants.extend(arenas.iter().map(|a| write_key(keys.arena_claim(a, n))));
        roles.push(EtcdRole {
            name: node_role(n),
            node: Some(n.clone()),
            grants,
        });
    }
    let fence_path = vec![
        read_prefix(keys.root()),
        write_prefix(keys.pending_prefix()),
        write_prefix(keys.claim_prefix()),
        write_prefix(keys.generation_prefix()),
        write_prefix(keys.done_prefix()),
        write_prefix(keys.audit_prefix()),
        write_prefix(keys.arena_claim_prefix()),
        write_prefix(keys.arena_node_all_prefix()),
        write_prefix(keys.arena_pool_prefix()),
        write_prefix(keys.legacy_arena_owner_prefix()),
        write_prefix(keys.legacy_arena_free_prefix()),
    ];
    let mut controller = fence_path.clone();
    // Presence and the sweep stamp (`core::Roster`).
    controller.push(write_prefix(keys.controller_prefix()));
    roles.push(EtcdRole {
        name: CONTROLLER_ROLE.to_owned(),
        node: None,
        grants: controller,
    });
    let mut operator = fence_path;
    // Two-person attested fences (`--approvals 2`).
    operator.push(write_prefix(format!("{}approval/", keys.root())));
    // `fenced unfence` rewrites a fenced node's boot record (audited under `audit/`).
    operator.push(write_prefix(keys.boot_prefix()));
    roles.push(EtcdRole {
        name: OPERATOR_ROLE.to_owned(),
        node: None,
        grants: operator,
    });
    roles
}

/// Whether an auth API error says the thing already exists (applying twice is fine).
fn exists(e: &etcd_client::Error) -> bool {
    e.to_string().contains("already exists")
}

/// One step of setting up a deployment's roles, in the order it is taken: what
/// `fenced etcd-roles --apply` does through etcd's auth API and what it prints, without
/// `--apply`, as `etcdctl` commands, from this one list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoleStep {
    /// Create the role (an existing one is kept).
    RoleAdd(String),
    /// Grant the role this permission.
    Grant(String, Grant),
    /// Create the node's user, identified by its certificate (no password; an
    /// existing one is kept).
    UserAdd(NodeId),
    /// Give the node's user its role.
    UserGrantRole(NodeId, String),
    /// Seed `gen/<node>` at 0 and `fence_done/<node>` at 0, if the generation is absent:
    /// a node known to the sweep (by `gen/`) that is not a member and was never fenced
    /// is owed a fence, but one that never joined has nothing to cut off. Its first
    /// join drops the mark (as any join drops its own stale one).
    SeedGeneration(NodeId),
    /// Put the arena into the free pool, if absent.
    SeedArena(String),
}

/// The steps that create `roles` and seed `arenas`, in order.
pub fn role_steps(roles: &[EtcdRole], arenas: &[String]) -> Vec<RoleStep> {
    let mut out = Vec::new();
    for r in roles {
        out.push(RoleStep::RoleAdd(r.name.clone()));
        for g in &r.grants {
            out.push(RoleStep::Grant(r.name.clone(), g.clone()));
        }
        if let Some(n) = &r.node {
            out.push(RoleStep::UserAdd(n.clone()));
            out.push(RoleStep::UserGrantRole(n.clone(), r.name.clone()));
            out.push(RoleStep::SeedGeneration(n.clone()));
        }
    }
    out.extend(arenas.iter().cloned().map(RoleStep::SeedArena));
    out
}

impl RoleStep {
    /// The step as an `etcdctl` (API v3) command line, for a shell; the endpoint and
    /// credentials come from `ETCDCTL_*` variables.
    pub fn etcdctl(&self, keys: &Keys) -> String {
        match self {
            Self::RoleAdd(name) => format!("etcdctl role add {name}"),
            Self::Grant(role, g) => format!(
                "etcdctl role grant-permission {role}{} {} {}",
                if g.prefix { " --prefix" } else { "" },
                if g.write { "readwrite" } else { "read" },
                g.key
            ),
            Self::UserAdd(n) => format!("etcdctl user add {n} --no-password"),
            Self::UserGrantRole(n, role) => format!("etcdctl user grant-role {n} {role}"),
            // `etcdctl txn`: compares, a blank line, the puts if they hold, a blank
            // line, nothing otherwise.
            Self::SeedGeneration(n) => format!(
                "printf '%s\\n' 'create(\"{g}\") = \"0\"' '' 'put {g} 0' 'put {d} 0' '' '' | etcdctl txn",
                g = keys.generation(n),
                d = keys.done(n)
            ),
            Self::SeedArena(a) => format!(
                "printf '%s\\n' 'create(\"{p}\") = \"0\"' '' 'put {p} \"\"' '' '' | etcdctl txn",
                p = keys.arena_pool(a)
            ),
        }
    }
}

/// Takes `steps` through etcd's auth API, as the client's user (etcd's root for a
/// secured cluster). Idempotent: an existing role or user is kept, a seeded key is
/// not overwritten.
pub async fn apply_roles(client: &Client, keys: &Keys, steps: &[RoleStep]) -> Result<()> {
    let mut c = client.clone();
    let other = |op: &'static str| move |source| StoreError::classify(op, source);
    for step in steps {
        match step {
            RoleStep::RoleAdd(name) => match c.role_add(name.clone()).await {
                Ok(_) => {}
                Err(e) if exists(&e) => {}
                Err(e) => return Err(other("role_add")(e)),
            },
            RoleStep::Grant(role, g) => {
                let mut p = if g.write {
                    Permission::read_write(g.key.clone())
                } else {
                    Permission::read(g.key.clone())
                };
                if g.prefix {
                    p = p.with_prefix();
                }
                c.role_grant_permission(role.clone(), p)
                    .await
                    .map_err(other("role_grant_permission"))?;
            }
            RoleStep::UserAdd(node) => {
                match c
                    .user_add(node.as_str(), "", Some(UserAddOptions::new().with_no_pwd()))
                    .await
                {
                    Ok(_) => {}
                    Err(e) if exists(&e) => {}
                    Err(e) => return Err(other("user_add")(e)),
                }
            }
            RoleStep::UserGrantRole(node, role) => {
                c.user_grant_role(node.as_str(), role.clone())
                    .await
                    .map_err(other("user_grant_role"))?;
            }
            RoleStep::SeedGeneration(node) => {
                let txn = Txn::new()
                    .when(vec![absent(keys.generation(node))])
                    .and_then(vec![
                        TxnOp::put(keys.generation(node), "0", None),
                        TxnOp::put(keys.done(node), "0", None),
                    ]);
                c.txn(txn).await.map_err(other("seed_generation"))?;
            }
            RoleStep::SeedArena(a) => {
                let txn = Txn::new()
                    .when(vec![absent(keys.arena_pool(a))])
                    .and_then(vec![TxnOp::put(keys.arena_pool(a), "", None)]);
                c.txn(txn).await.map_err(other("seed_arena_pool"))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_role_writes_only_its_own_keys_and_never_a_generation() {
        let keys = Keys::new("/f/");
        let a = NodeId::new("a").unwrap();
        let b = NodeId::new("b").unwrap();
        let arenas = ["x".to_owned(), "y".to_owned()];
        let roles = role_plan(&keys, &[a.clone(), b.clone()], &arenas);
        let names: Vec<&str> = roles.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "fenced-node-a",
                "fenced-node-b",
                CONTROLLER_ROLE,
                OPERATOR_ROLE
            ]
        );
        let covers = |r: &EtcdRole, key: &str| {
            r.grants
                .iter()
                .any(|g| g.write && (g.key == key || (g.prefix && key.starts_with(&g.key))))
        };
        let node_a = &roles[0];
        for own in [
            keys.membership(&a),
            keys.departed(&a),
            keys.liveness(&a),
            keys.instance(&a),
            keys.arena_node(&a, "x"),
            keys.arena_claim("x", &a),
            keys.arena_claim("y", &a),
            keys.namespace(),
        ] {
            assert!(covers(node_a, &own), "{own}");
        }
        for other in [
            keys.membership(&b),
            keys.departed(&b),
            keys.liveness(&b),
            keys.arena_node(&b, "x"),
            keys.arena_claim("x", &b),
            keys.arena_claim("z", &a),
            keys.arena_pool("x"),
            keys.legacy_arena_owner("x"),
            keys.legacy_arena_free("x"),
            keys.generation(&a),
            keys.generation(&b),
            keys.claim(&b),
            keys.audit(&b, 1),
        ] {
            assert!(!covers(node_a, &other), "{other}");
        }
        let ctl = &roles[2];
        assert!(covers(ctl, &keys.generation(&b)) && !covers(ctl, &keys.membership(&b)));
        // A fence frees the victim's claims; a controller seeds the pool.
        assert!(covers(ctl, &keys.arena_claim("x", &b)) && covers(ctl, &keys.arena_pool("x")));
        // No grant of a node covers a key of the older arena layout, whose keys are
        // named by arena only.
        for r in &roles[..2] {
            assert!(
                !r.grants.iter().any(|g| g.write
                    && g.prefix
                    && g.key.contains("arena_")
                    && !g.key.starts_with(&keys.arena_node_all_prefix())),
                "{r:?}"
            );
        }
        assert!(covers(ctl, &keys.controller_live("b/i-1")) && covers(ctl, &keys.sweep_done()));
        assert!(!covers(node_a, &keys.controller_live("a/i-1")));
        assert!(!covers(&roles[3], &keys.sweep_done()));
    }
}
