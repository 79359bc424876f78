//! Printing objects as tables (like `kubectl get`), JSON or YAML.

use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Wide,
    Json,
    Yaml,
}

pub use crate::types::age;

pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.len());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let n = cells.len();
        for (i, c) in cells.into_iter().enumerate() {
            out.push_str(c);
            if i + 1 < n {
                out.push_str(&" ".repeat(widths[i] - c.len() + 3));
            }
        }
        out.push('\n');
    };
    line(headers.to_vec(), &mut out);
    for r in rows {
        line(r.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

pub fn print_value(v: &Value, f: Format) -> anyhow::Result<()> {
    match f {
        Format::Yaml => print!("{}", serde_yaml_ng::to_string(v)?),
        _ => println!("{}", serde_json::to_string_pretty(v)?),
    }
    Ok(())
}

pub fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_str().unwrap_or("")
}
