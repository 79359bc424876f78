//! `edgevirt strategy`: the install strategy (desired version, per-role settings) and where
//! the rollout to it stands.

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::ClientOpts;
use super::output::{Format, print_value, s, table};
use crate::controller::strategy::Manifest;

#[derive(Args, Debug)]
pub struct StrategyArgs {
    #[command(subcommand)]
    cmd: StrategyCmd,
    #[command(flatten)]
    client: ClientOpts,
}

#[derive(Subcommand, Debug)]
enum StrategyCmd {
    /// The desired version, its identifier, and which nodes and launchers run which version.
    Show {
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
    },
    /// Print the manifest inside the stored install-strategy ConfigMap (gzip + base64), or
    /// inside a ConfigMap file given with -f (JSON or YAML; `-` reads stdin).
    Decode {
        #[arg(short, long)]
        file: Option<std::path::PathBuf>,
    },
    /// Change the desired version (admins).
    SetVersion { version: String },
}

const PATH: &str = "/apis/edgevirt.io/v1/installstrategy";

pub async fn run(a: StrategyArgs) -> anyhow::Result<()> {
    match a.cmd {
        StrategyCmd::Show { output } => {
            let v = a.client.client()?.get(PATH).await?;
            match output {
                Format::Json | Format::Yaml => print_value(&v, output)?,
                _ => print!("{}", show(&v["rollout"])),
            }
        }
        StrategyCmd::Decode { file } => {
            let cm: Value = match file {
                Some(f) => {
                    let text = if f.as_os_str() == "-" {
                        std::io::read_to_string(std::io::stdin())?
                    } else {
                        std::fs::read_to_string(&f)?
                    };
                    serde_yaml_ng::from_str(&text)?
                }
                None => a.client.client()?.get(PATH).await?["configMap"].take(),
            };
            print!("{}", Manifest::from_config_map(&cm)?.to_yaml());
        }
        StrategyCmd::SetVersion { version } => {
            let v = a
                .client
                .client()?
                .put(&format!("{PATH}/version"), &json!({"version": version}))
                .await?;
            print!("{}", show(&v["rollout"]));
        }
    }
    Ok(())
}

/// The rollout as text: a summary line, then nodes and launchers with their versions.
fn show(r: &Value) -> String {
    let mark = |v: &Value| if v["upToDate"] == true { "yes" } else { "no" }.to_string();
    let mut out = format!(
        "desired version {} (identifier {}): {}, {} node(s) and {} launcher(s) pending\n\n",
        s(r, &["desiredVersion"]),
        s(r, &["identifier"]),
        s(r, &["state"]),
        r["nodesPending"],
        r["launchersPending"],
    );
    let empty = vec![];
    let nodes: Vec<Vec<String>> = r["nodes"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|n| {
            vec![
                s(n, &["name"]).to_string(),
                s(n, &["version"]).to_string(),
                if n["ready"] == true { "True" } else { "False" }.into(),
                mark(n),
            ]
        })
        .collect();
    out.push_str(&table(&["NODE", "VERSION", "READY", "UP-TO-DATE"], &nodes));
    let launchers: Vec<Vec<String>> = r["launchers"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|l| {
            vec![
                format!("{}/{}", s(l, &["namespace"]), s(l, &["name"])),
                s(l, &["node"]).to_string(),
                match s(l, &["version"]) {
                    "" => "unknown".to_string(),
                    v => v.to_string(),
                },
                mark(l),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&table(
        &["VMI", "NODE", "LAUNCHER-VERSION", "UP-TO-DATE"],
        &launchers,
    ));
    out
}
