//! `edgevirt node ...`: the hosts of a site. Nodes appear when their agent joins with a token
//! from `node token create`; an administrator cordons them (no new VMs), uncordons them, and
//! deletes them (`--force` when the host is down for good, so its VMs start elsewhere).

use anyhow::bail;
use clap::{Args, Subcommand};
use serde_json::json;

use super::ClientOpts;
use super::output::{Format, age, created_age, decode, items, print_value, s, table};
use crate::rules::drain::Eviction;
use crate::types::Meta;
use crate::types::edgevirt::Node;
use crate::types::kubevirt::{
    ConditionType, MigrationPhase, Phase, VirtualMachineInstance, VirtualMachineInstanceMigration,
    condition,
};

#[derive(Args, Debug)]
pub struct NodeArgs {
    #[command(subcommand)]
    cmd: NodeCmd,
    #[command(flatten)]
    client: ClientOpts,
}

#[derive(Subcommand, Debug)]
enum NodeCmd {
    /// List nodes with their readiness, CPU, accelerator, capacity and version.
    List {
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
    },
    /// Show one node.
    Get {
        name: String,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
    },
    /// Place no new VMs on a node (running ones stay).
    Cordon { name: String },
    /// Cordon a node and move every VM off it, before maintenance, as each VM's
    /// `evictionStrategy` says: `LiveMigrate` (and unset) live-migrate, `LiveMigrateIfPossible`
    /// migrates when the VM is live-migratable and is otherwise treated as `None`, and `None`
    /// stays unless --force, which stops it (its run strategy then decides whether it starts
    /// again on another node). Reports the VMs left on the node (not migratable, no node to
    /// take them, failed, `None` without --force) and exits non-zero if there are any.
    Drain {
        name: String,
        /// Also move VMs whose disks are local, copying the disks (block migration).
        #[arg(long)]
        block: bool,
        /// Stop the VMs whose evictionStrategy is None (or LiveMigrateIfPossible and not
        /// live-migratable) instead of leaving them running.
        #[arg(long)]
        force: bool,
    },
    /// Let the scheduler use a cordoned node again.
    Uncordon { name: String },
    /// Add or remove taints, as `kubectl taint nodes`: `key=value:Effect` or `key:Effect`
    /// adds (or replaces the key's taint of that effect), a trailing `-` removes
    /// (`key:Effect-`, or `key-` for every effect). Effects: NoSchedule (VMs that do not
    /// tolerate it are not placed here), PreferNoSchedule (placed here last), NoExecute
    /// (as NoSchedule, and running VMs that do not tolerate it are stopped, after their
    /// tolerationSeconds if any; their run strategy starts them again elsewhere).
    Taint {
        name: String,
        #[arg(required = true)]
        taints: Vec<String>,
    },
    /// Remove a node and revoke its agent's credential. Refused while VMs are placed on it,
    /// unless --force.
    Delete {
        name: String,
        /// The host is down for good: fail its VM instances so they start on other nodes.
        /// Only when you are sure it is off: a VM must never run on two hosts.
        #[arg(long)]
        force: bool,
    },
    /// Join tokens for adding hosts.
    Token(TokenArgs),
}

#[derive(Args, Debug)]
struct TokenArgs {
    #[command(subcommand)]
    cmd: TokenCmd,
}

#[derive(Subcommand, Debug)]
enum TokenCmd {
    /// Create a one-time join token and print the command that joins a host with it.
    Create {
        /// How long the token stays valid: 90s, 30m, 1h, 2d (from 1m to 7d).
        #[arg(long, default_value = "1h", value_parser = parse_ttl)]
        ttl: i64,
        #[arg(long, default_value = "")]
        description: String,
    },
    /// List join tokens (never their secrets) and who used them.
    List,
    /// Delete a join token that is no longer wanted.
    Delete { id: String },
}

/// `90s`, `30m`, `1h`, `2d` or plain seconds.
fn parse_ttl(s: &str) -> Result<i64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 's')) => (&s[..i], 1),
        Some((i, 'm')) => (&s[..i], 60),
        Some((i, 'h')) => (&s[..i], 3600),
        Some((i, 'd')) => (&s[..i], 86400),
        _ => (s, 1),
    };
    num.parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .map(|n| n * mult)
        .ok_or_else(|| format!("{s:?} is not a duration like 90s, 30m, 1h or 2d"))
}

const NODES: &str = "/apis/edgevirt.io/v1/nodes";

/// Apply one `kubectl taint` argument to a node's taints.
fn apply_taint(taints: &mut Vec<crate::types::edgevirt::Taint>, arg: &str) -> Result<(), String> {
    if let Some(rest) = arg.strip_suffix('-') {
        let (key, effect) = match rest.split_once(':') {
            Some((k, e)) => (k, Some(e)),
            None => (rest, None),
        };
        let before = taints.len();
        taints.retain(|t| !(t.key == key && effect.is_none_or(|e| e == t.effect)));
        if taints.len() == before {
            return Err(format!("taint {rest:?} not found"));
        }
        return Ok(());
    }
    let (kv, effect) = arg
        .split_once(':')
        .ok_or_else(|| format!("{arg:?}: expected key=value:Effect or key:Effect"))?;
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string())),
        None => (kv, None),
    };
    let t = crate::types::edgevirt::Taint {
        key: key.to_string(),
        value,
        effect: effect.to_string(),
        time_added: None,
    };
    crate::rules::placement::check_taints(std::slice::from_ref(&t)).map_err(|e| e.0)?;
    taints.retain(|x| !(x.key == t.key && x.effect == t.effect));
    taints.push(t);
    Ok(())
}

fn ready(n: &Node) -> String {
    let conditions = n.status.as_ref().map_or(&[][..], |s| &s.conditions);
    let r = match condition(conditions, &ConditionType::Ready) {
        Some(c) if c.is_true() => "Ready",
        Some(_) => "NotReady",
        None => "Unknown",
    };
    if n.spec.unschedulable {
        format!("{r},SchedulingDisabled")
    } else {
        r.to_string()
    }
}

fn rows(nodes: &[Node], vmis: &[VirtualMachineInstance], wide: bool) -> Vec<Vec<String>> {
    nodes
        .iter()
        .map(|n| {
            let name = n.name();
            let count = vmis
                .iter()
                .filter(|v| v.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name))
                .count();
            let status = n.status.clone().unwrap_or_default();
            let mut r = vec![
                name.to_string(),
                ready(n),
                status.cpu.vendor.clone(),
                status.accelerator.clone(),
                status.cpu.count.to_string(),
                format!("{}Mi", status.memory_bytes >> 20),
                count.to_string(),
                status.version.clone(),
                created_age(n),
            ];
            if wide {
                r.push(status.cpu.model.clone());
                r.push(
                    status
                        .shared_pool
                        .as_ref()
                        .map_or("<none>", |p| p.name.as_str())
                        .to_string(),
                );
                // `(vlan)`: VLAN filtering is on, so VLAN networks can use it.
                let bridges: Vec<String> = status
                    .bridges
                    .iter()
                    .map(|b| {
                        let vlan = if b.vlan_filtering { "(vlan)" } else { "" };
                        format!("{}{vlan}", b.name)
                    })
                    .collect();
                r.push(if bridges.is_empty() {
                    "<none>".into()
                } else {
                    bridges.join(",")
                });
                r.push(
                    status
                        .last_heartbeat_time
                        .as_deref()
                        .map(age)
                        .unwrap_or_else(|| "never".into()),
                );
                r.push(
                    condition(&status.conditions, &ConditionType::Ready)
                        .and_then(|c| c.reason.clone())
                        .unwrap_or_default(),
                );
            }
            r
        })
        .collect()
}

fn headers(wide: bool) -> Vec<&'static str> {
    let mut h = vec![
        "NAME", "STATUS", "VENDOR", "ACCEL", "CPUS", "MEMORY", "VMIS", "VERSION", "AGE",
    ];
    if wide {
        h.extend(["MODEL", "POOL", "BRIDGES", "HEARTBEAT", "REASON"]);
    }
    h
}

pub async fn run_node(a: NodeArgs) -> anyhow::Result<()> {
    let c = a.client.client()?;
    match a.cmd {
        NodeCmd::List { output } => {
            let list = c.get(NODES).await?;
            match output {
                Format::Json | Format::Yaml => print_value(&list, output)?,
                f => {
                    let vmis = c
                        .get("/apis/kubevirt.io/v1/virtualmachineinstances")
                        .await?;
                    let nodes: Vec<Node> = items(&list)?;
                    let vmis: Vec<VirtualMachineInstance> = items(&vmis)?;
                    let wide = f == Format::Wide;
                    print!("{}", table(&headers(wide), &rows(&nodes, &vmis, wide)));
                }
            }
        }
        NodeCmd::Get { name, output } => {
            let n = c.get(&format!("{NODES}/{name}")).await?;
            match output {
                Format::Json | Format::Yaml => print_value(&n, output)?,
                f => {
                    let vmis = c
                        .get(&format!(
                            "/apis/kubevirt.io/v1/virtualmachineinstances?fieldSelector=status.nodeName%3D{name}"
                        ))
                        .await?;
                    let vmis: Vec<VirtualMachineInstance> = items(&vmis)?;
                    let wide = f == Format::Wide;
                    print!(
                        "{}",
                        table(&headers(wide), &rows(&[decode(n)?], &vmis, wide))
                    );
                }
            }
        }
        NodeCmd::Cordon { name } => {
            c.merge_patch(
                &format!("{NODES}/{name}"),
                &json!({"spec": {"unschedulable": true}}),
            )
            .await?;
            println!("node/{name} cordoned");
        }
        NodeCmd::Drain { name, block, force } => drain(&c, &name, block, force).await?,
        NodeCmd::Taint { name, taints } => {
            let node: Node = decode(c.get(&format!("{NODES}/{name}")).await?)?;
            let mut now = node.spec.taints.clone();
            for t in &taints {
                apply_taint(&mut now, t).map_err(|e| anyhow::anyhow!(e))?;
            }
            c.merge_patch(
                &format!("{NODES}/{name}"),
                &json!({"spec": {"taints": now}}),
            )
            .await?;
            let shown: Vec<String> = now
                .iter()
                .map(crate::rules::placement::taint_text)
                .collect();
            println!(
                "node/{name} tainted: {}",
                if shown.is_empty() {
                    "<none>".to_string()
                } else {
                    shown.join(", ")
                }
            );
        }
        NodeCmd::Uncordon { name } => {
            c.merge_patch(
                &format!("{NODES}/{name}"),
                &json!({"spec": {"unschedulable": false}}),
            )
            .await?;
            println!("node/{name} uncordoned");
        }
        NodeCmd::Delete { name, force } => {
            let q = if force { "?force=true" } else { "" };
            c.send(c.request(reqwest::Method::DELETE, &format!("{NODES}/{name}{q}")))
                .await?;
            println!("node/{name} deleted; its agent's credential is revoked");
        }
        NodeCmd::Token(t) => match t.cmd {
            TokenCmd::Create { ttl, description } => {
                let v = c
                    .post(
                        "/apis/edgevirt.io/v1/jointokens",
                        &json!({"ttlSeconds": ttl, "description": description}),
                    )
                    .await?;
                let token = v["token"].as_str().unwrap_or("");
                if token.is_empty() {
                    bail!("the server's answer has no token");
                }
                println!("{token}");
                eprintln!(
                    "join token {} valid until {} (usable once). On the new host run:\n  \
                     edgevirt serve --role agent --controller {} --join-token {token}",
                    s(&v, &["id"]),
                    s(&v, &["expires"]),
                    c.base()
                );
            }
            TokenCmd::List => {
                let v = c.get("/apis/edgevirt.io/v1/jointokens").await?;
                let rows: Vec<Vec<String>> = v["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|t| {
                        vec![
                            s(t, &["id"]).to_string(),
                            s(t, &["state"]).to_string(),
                            s(t, &["expires"]).to_string(),
                            s(t, &["usedBy"]).to_string(),
                            s(t, &["description"]).to_string(),
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    table(&["ID", "STATE", "EXPIRES", "USED BY", "DESCRIPTION"], &rows)
                );
            }
            TokenCmd::Delete { id } => {
                c.send(c.request(
                    reqwest::Method::DELETE,
                    &format!("/apis/edgevirt.io/v1/jointokens/{id}"),
                ))
                .await?;
                println!("join token {id} deleted");
            }
        },
    }
    Ok(())
}

/// Poll a migration until it succeeds or fails; print each phase when `show`.
pub async fn wait_migration(
    c: &crate::client::Client,
    ns: &str,
    name: &str,
    show: bool,
) -> anyhow::Result<VirtualMachineInstanceMigration> {
    let path =
        format!("/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstancemigrations/{name}");
    let mut last = String::new();
    let start = std::time::Instant::now();
    loop {
        let m: VirtualMachineInstanceMigration = decode(c.get(&path).await?)?;
        let phase = m.status.as_ref().and_then(|s| s.phase.clone());
        let p = phase
            .as_ref()
            .map_or("", MigrationPhase::as_str)
            .to_string();
        if show && p != last {
            eprintln!("{:>6.1}s  {name}: {p}", start.elapsed().as_secs_f64());
            last = p.clone();
        }
        if phase.is_some_and(|p| p.is_final()) {
            return Ok(m);
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

async fn drain(
    c: &crate::client::Client,
    node: &str,
    block: bool,
    force: bool,
) -> anyhow::Result<()> {
    c.merge_patch(
        &format!("{NODES}/{node}"),
        &json!({"spec": {"unschedulable": true}}),
    )
    .await?;
    println!("node/{node} cordoned");
    let vmis = c
        .get(&format!(
            "/apis/kubevirt.io/v1/virtualmachineinstances?fieldSelector=status.nodeName%3D{node}"
        ))
        .await?;
    let mut stuck: Vec<String> = Vec::new();
    let mut started: Vec<(String, String, String)> = Vec::new();
    let mut stopped: Vec<(String, String, String)> = Vec::new();
    for v in items::<VirtualMachineInstance>(&vmis)? {
        let (ns, name) = (v.namespace(), v.name());
        if v.status.as_ref().and_then(|s| s.phase.as_ref()) != Some(&Phase::Running) {
            continue;
        }
        match crate::rules::drain::eviction(&v, block, force) {
            Eviction::Migrate => {}
            Eviction::Stays(why) => {
                println!("{ns}/{name}: {why}: left running (--force stops it)");
                stuck.push(format!("{ns}/{name}"));
                continue;
            }
            Eviction::Stop(why) => {
                c.delete(&format!(
                    "/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{name}"
                ))
                .await?;
                println!("{ns}/{name}: stopping ({why})");
                stopped.push((ns.to_string(), name.to_string(), v.uid().to_string()));
                continue;
            }
        }
        let path = format!(
            "/apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{name}/migrate"
        );
        let opts = if block {
            json!({"blockMigration": true})
        } else {
            json!({})
        };
        match c.put(&path, &opts).await {
            Ok(m) => {
                let mname = decode::<VirtualMachineInstanceMigration>(m)?
                    .name()
                    .to_string();
                println!("{ns}/{name}: migrating ({mname})");
                started.push((ns.to_string(), name.to_string(), mname));
            }
            Err(e) => {
                println!("{ns}/{name}: cannot migrate: {e}");
                stuck.push(format!("{ns}/{name}"));
            }
        }
    }
    for (ns, name, uid) in stopped {
        // Gone when no instance of that name has this uid any more (its VM may have
        // started a new one elsewhere).
        let path = format!("/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{name}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
        loop {
            let now = c.get_opt(&path).await?;
            if now.is_none_or(|v| v["metadata"]["uid"].as_str() != Some(uid.as_str())) {
                println!("{ns}/{name}: stopped");
                break;
            }
            if std::time::Instant::now() > deadline {
                println!("{ns}/{name}: still stopping after 10 minutes");
                stuck.push(format!("{ns}/{name}"));
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    }
    for (ns, name, mname) in started {
        let m = wait_migration(c, &ns, &mname, false).await?;
        let status = m.status.unwrap_or_default();
        let state = status.migration_state.unwrap_or_default();
        if status.phase == Some(MigrationPhase::Succeeded) {
            println!(
                "{ns}/{name}: moved to {}",
                state.target_node.unwrap_or_default()
            );
        } else {
            println!(
                "{ns}/{name}: migration failed: {}",
                state.failure_reason.unwrap_or_default()
            );
            stuck.push(format!("{ns}/{name}"));
        }
    }
    if stuck.is_empty() {
        println!("node/{node} drained");
        Ok(())
    } else {
        bail!(
            "node {node} still runs {} VM(s) that could not move: {}",
            stuck.len(),
            stuck.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn node_rows_read_typed_nodes() {
        let nodes: Vec<Node> = items(&json!({"items": [
            {"metadata": {"name": "n1"}, "spec": {"unschedulable": true},
             "status": {"cpu": {"vendor": "AuthenticAMD", "count": 8, "model": "EPYC"},
                        "accelerator": "kvm", "memoryBytes": 2147483648u64, "version": "1.2",
                        "sharedPool": {"name": "nfs", "path": "/p"},
                        "bridges": [{"name": "br0", "vlanFiltering": true}, {"name": "lan"}],
                        "conditions": [{"type": "Ready", "status": "False",
                                        "reason": "HeartbeatLate"}],
                        "aNewerField": {}}},
            {"metadata": {"name": "n2"}, "spec": {}},
        ]}))
        .unwrap();
        let vmis: Vec<VirtualMachineInstance> = items(&json!({"items": [
            {"metadata": {"name": "a"}, "spec": {"domain": {}}, "status": {"nodeName": "n1"}},
            {"metadata": {"name": "b"}, "spec": {"domain": {}}, "status": {"nodeName": "n2"}},
            {"metadata": {"name": "c"}, "spec": {"domain": {}}, "status": {"nodeName": "n1"}},
        ]}))
        .unwrap();
        let r = rows(&nodes, &vmis, true);
        assert_eq!(
            r[0],
            [
                "n1",
                "NotReady,SchedulingDisabled",
                "AuthenticAMD",
                "kvm",
                "8",
                "2048Mi",
                "2",
                "1.2",
                "<unknown>",
                "EPYC",
                "nfs",
                "br0(vlan),lan",
                "never",
                "HeartbeatLate"
            ]
        );
        assert_eq!(
            r[1],
            [
                "n2",
                "Unknown",
                "",
                "",
                "0",
                "0Mi",
                "1",
                "",
                "<unknown>",
                "",
                "<none>",
                "<none>",
                "never",
                ""
            ]
        );
    }

    #[test]
    fn ttl() {
        assert_eq!(super::parse_ttl("90s"), Ok(90));
        assert_eq!(super::parse_ttl("30m"), Ok(1800));
        assert_eq!(super::parse_ttl("2d"), Ok(172800));
        assert_eq!(super::parse_ttl("600"), Ok(600));
        assert!(super::parse_ttl("-1h").is_err());
        assert!(super::parse_ttl("soon").is_err());
    }
}
