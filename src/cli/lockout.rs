//! `edgevirt lockout`: failed dashboard logins and the lockouts they caused, and clearing
//! them (admins), for a user locked out by someone else's guesses.

use clap::{Args, Subcommand};

use super::ClientOpts;
use super::output::{Format, print_value, table};

#[derive(Args, Debug)]
pub struct LockoutArgs {
    #[command(subcommand)]
    cmd: LockoutCmd,
    #[command(flatten)]
    client: ClientOpts,
}

#[derive(Subcommand, Debug)]
enum LockoutCmd {
    /// Users and client addresses with failed logins, and until when each is locked out.
    List {
        #[arg(short, long, value_enum, default_value = "table")]
        output: Format,
    },
    /// Let a user (and/or an address) try again at once; without options, everyone.
    Clear {
        #[arg(long)]
        user: Option<String>,
        #[arg(long)]
        address: Option<std::net::IpAddr>,
    },
}

const PATH: &str = "/apis/edgevirt.io/v1/loginlockouts";

pub async fn run(a: LockoutArgs) -> anyhow::Result<()> {
    let c = a.client.client()?;
    match a.cmd {
        LockoutCmd::List { output } => {
            let v = c.get(PATH).await?;
            match output {
                Format::Json | Format::Yaml => print_value(&v, output)?,
                _ => {
                    let dash = |x: &serde_json::Value| x.as_str().unwrap_or("-").to_string();
                    let rows: Vec<Vec<String>> = v["items"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|i| {
                            vec![
                                dash(&i["user"]),
                                dash(&i["address"]),
                                i["failures"].to_string(),
                                dash(&i["lockedUntil"]),
                            ]
                        })
                        .collect();
                    if rows.is_empty() {
                        println!("no failed logins");
                    } else {
                        print!(
                            "{}",
                            table(&["USER", "ADDRESS", "FAILURES", "LOCKED-UNTIL"], &rows)
                        );
                    }
                }
            }
        }
        LockoutCmd::Clear { user, address } => {
            let mut q: Vec<(&str, String)> = Vec::new();
            if let Some(u) = user {
                q.push(("user", u));
            }
            if let Some(ad) = address {
                q.push(("address", ad.to_string()));
            }
            let query = serde_urlencoded::to_string(&q)?;
            let path = if query.is_empty() {
                PATH.to_string()
            } else {
                format!("{PATH}?{query}")
            };
            let v = c.delete(&path).await?;
            println!("{}", v["message"].as_str().unwrap_or("cleared"));
        }
    }
    Ok(())
}
