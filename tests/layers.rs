//! The import order of `src/`: layers only point down (docs/architecture.md). Reads the
//! `crate::`, `super::` and `self::` paths of every source file (comments and string
//! literals left out) and fails, naming the file and the edge, on
//!
//! - an import of a top-level module from the same or a higher layer, or of a module the
//!   table below does not place (a new module must be given a layer);
//! - a cycle between the submodules of one top-level module (`controller::migration` ⇄
//!   `controller::scheduler`); the module's own `mod.rs` may use its children and they it.
//!
//! Runs in the plain `cargo test`, without root.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first. A module imports only from layers below its own.
const LAYERS: &[(&str, &[&str])] = &[
    ("kinds", &["types"]),
    ("versions", &["version"]),
    ("rules shared by roles", &["rules"]),
    (
        "storage, hypervisor trait, host network, TLS",
        &["store", "hypervisor", "hostnet", "tls"],
    ),
    ("CPU policy, API client", &["cpu", "client"]),
    ("libvirt backend", &["virt"]),
    ("OCI registries", &["registry"]),
    ("launcher", &["launcher"]),
    ("metrics", &["metrics"]),
    ("roles", &["controller", "agent"]),
    ("HTTP plumbing", &["http"]),
    ("API and console proxy", &["api", "vnc"]),
    ("dashboard", &["web"]),
    ("HTTP shell", &["shell"]),
    ("the roles in one process", &["server"]),
    ("command line", &["cli"]),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, ms)| ms.contains(&module))
}

/// Source text with comments and the contents of string and char literals blanked out,
/// so that a path in a doc comment or a message is not an import.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let rest = &src[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            // Block comments nest in Rust.
            let mut depth = 0;
            let mut j = i;
            while j < b.len() {
                if src[j..].starts_with("/*") {
                    depth += 1;
                    j += 2;
                } else if src[j..].starts_with("*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            i = j;
        } else if let Some(hashes) = raw_string_start(src, i) {
            let open = 2 + hashes; // r, hashes, quote
            let close = format!("\"{}", "#".repeat(hashes));
            let end = src[i + open..]
                .find(&close)
                .map_or(b.len(), |e| i + open + e + close.len());
            out.push_str("\"\"");
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i = j + 1;
        } else if b[i] == b'\'' && char_literal_len(rest).is_some() {
            out.push_str("' '");
            i += char_literal_len(rest).unwrap();
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// `r"..."`, `r#"..."#`, `br"..."`: the number of hashes when a raw string starts at `i`.
fn raw_string_start(src: &str, i: usize) -> Option<usize> {
    let b = src.as_bytes();
    if i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_') {
        return None;
    }
    let j = if b[i] == b'b' { i + 1 } else { i };
    if b.get(j) != Some(&b'r') {
        return None;
    }
    let hashes = src[j + 1..].bytes().take_while(|&c| c == b'#').count();
    (b.get(j + 1 + hashes) == Some(&b'"')).then_some(hashes + (j - i))
}

/// The length of a char literal at the start of `s` (`'a'`, `'\n'`, `'\u{1F600}'`), or
/// `None` for a lifetime.
fn char_literal_len(s: &str) -> Option<usize> {
    let mut it = s.char_indices().skip(1);
    let (_, c) = it.next()?;
    if c == '\\' {
        let end = s[2..].find('\'')?;
        return (end <= 10).then_some(end + 3);
    }
    let (j, q) = it.next()?;
    (q == '\'').then_some(j + 1)
}

/// Every module path a source mentions, from `crate::`, `super::` or `self::`, with braces
/// of `use` groups expanded one level (`crate::{api, store::Store}` gives `crate::api` and
/// `crate::store::Store`).
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let b = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        let starts = ["crate::", "super::", "self::"]
            .iter()
            .find(|p| code[i..].starts_with(**p))
            .filter(|_| i == 0 || !(ident(b[i - 1]) || b[i - 1] == b':'));
        if starts.is_none() {
            i += 1;
            continue;
        }
        // Read `seg::seg::...`, stopping at anything else; a `{` opens a group.
        let mut segs = Vec::new();
        let mut j = i;
        loop {
            let s = j;
            while j < b.len() && ident(b[j]) {
                j += 1;
            }
            if s == j {
                break;
            }
            segs.push(code[s..j].to_string());
            if code[j..].starts_with("::") {
                j += 2;
                if b.get(j) == Some(&b'{') {
                    let close = matching_brace(code, j);
                    for item in split_top(&code[j + 1..close]) {
                        let item = item.trim();
                        let head: String = item
                            .bytes()
                            .take_while(|&c| ident(c))
                            .map(char::from)
                            .collect();
                        if head.is_empty() {
                            continue;
                        }
                        let mut p = segs.clone();
                        if head != "self" {
                            p.push(head);
                        }
                        found.push(p);
                    }
                    j = close + 1;
                    segs.clear();
                    break;
                }
            } else {
                break;
            }
        }
        if !segs.is_empty() {
            found.push(segs);
        }
        i = j.max(i + 1);
    }
    found
}

fn matching_brace(s: &str, open: usize) -> usize {
    let mut depth = 0;
    for (k, c) in s[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return open + k;
                }
            }
            _ => {}
        }
    }
    s.len()
}

/// Split a `use` group's contents at its top-level commas.
fn split_top(s: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (k, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// A source file's module path: `src/controller/migration.rs` is `controller::migration`,
/// `src/virt/convert/tests.rs` is `virt::convert::tests`, a `mod.rs` is its directory.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut p: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if p.last().is_some_and(|l| l == "mod") {
        p.pop();
    }
    p
}

/// A path as written in `module`, made absolute (`crate::` dropped).
fn absolute(module: &[String], path: &[String]) -> Vec<String> {
    let mut base: Vec<String> = module.to_vec();
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &path[1..];
        }
        Some("self") => rest = &path[1..],
        _ => {}
    }
    while rest.first().is_some_and(|s| s == "super") {
        base.pop();
        rest = &rest[1..];
    }
    base.extend(rest.iter().cloned());
    base
}

/// The files of `src/`, as (path, module path).
fn sources(src: &Path) -> Vec<(PathBuf, Vec<String>)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let m = module_path(src, &f);
            (f, m)
        })
        .collect()
}

/// Every violation of the import order in the tree under `src`, as readable lines.
fn violations(src: &Path, files: &[(PathBuf, String)]) -> Vec<String> {
    let mut errors = Vec::new();
    // Submodule graphs, per top-level module: child → (child, file).
    let mut children: BTreeMap<String, BTreeMap<String, BTreeSet<(String, String)>>> =
        BTreeMap::new();
    let tops: BTreeSet<String> = files
        .iter()
        .filter_map(|(f, _)| module_path(src, f).first().cloned())
        .collect();
    let is_child = |top: &str, child: &str| {
        src.join(top).join(format!("{child}.rs")).exists()
            || src.join(top).join(child).join("mod.rs").exists()
    };
    for (file, text) in files {
        let module = module_path(src, file);
        let top = module[0].as_str();
        if top == "lib" || top == "main" {
            continue;
        }
        let shown = file.strip_prefix(src.parent().unwrap()).unwrap().display();
        let Some(mine) = layer_of(top) else {
            errors.push(format!(
                "{shown}: module `{top}` has no layer: add it to LAYERS in tests/layers.rs and \
                 to the layer list in README.md and docs/architecture.md"
            ));
            continue;
        };
        for p in paths(&code_only(text)) {
            let abs = absolute(&module, &p);
            let Some(to) = abs.first() else { continue };
            if to == top {
                // Inside one top-level module: an edge between two of its children.
                if let (Some(from_child), Some(to_child)) = (module.get(1), abs.get(1))
                    && from_child != to_child
                    && is_child(top, to_child)
                {
                    children
                        .entry(top.to_string())
                        .or_default()
                        .entry(from_child.clone())
                        .or_default()
                        .insert((to_child.clone(), shown.to_string()));
                }
                continue;
            }
            if !tops.contains(to) {
                continue; // an item of lib.rs, or a path this reader misread
            }
            match layer_of(to) {
                None => errors.push(format!(
                    "{shown}: imports `{to}`, which has no layer in LAYERS"
                )),
                Some(theirs) if theirs >= mine => errors.push(format!(
                    "{shown}: forbidden import {top} → {to} (`{}`): `{top}` is in layer {mine} \
                     ({}) and `{to}` in layer {theirs} ({}); layers import only from below",
                    p.join("::"),
                    LAYERS[mine].0,
                    LAYERS[theirs].0
                )),
                Some(_) => {}
            }
        }
    }
    for (top, graph) in &children {
        if let Some(cycle) = find_cycle(graph) {
            errors.push(format!(
                "cycle between submodules of `{top}`: {}",
                cycle.join(" → ")
            ));
        }
    }
    errors
}

/// A cycle in a child → (child, file) graph, as `a (file) → b (file) → a`.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<(String, String)>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<(String, String)>>,
        stack: &mut Vec<(String, String)>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|(m, _)| m == n) {
            let mut c: Vec<String> = stack[at..]
                .iter()
                .map(|(m, via)| format!("{m} (in {via})"))
                .collect();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        for (to, file) in graph.get(n).into_iter().flatten() {
            stack.push((n.to_string(), file.clone()));
            if let Some(c) = visit(to, graph, stack, done) {
                return Some(c);
            }
            stack.pop();
        }
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

/// Every source file under `src` with its text.
fn read(src: &Path) -> Vec<(PathBuf, String)> {
    sources(src)
        .into_iter()
        .map(|(f, _)| {
            let t = std::fs::read_to_string(&f).unwrap();
            (f, t)
        })
        .collect()
}

#[test]
fn layers_import_only_downward() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = read(&src);
    assert!(files.len() > 50, "read only {} files", files.len());
    let errors = violations(&src, &files);
    assert!(
        errors.is_empty(),
        "the import order is broken:\n  {}",
        errors.join("\n  ")
    );
}

/// The checker itself, on a made-up tree: it must see the edges a real tree could hide in
/// groups, nested paths and relative paths, and ignore those in comments and strings.
#[test]
fn the_checker_names_forbidden_edges_and_cycles() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let write = |rel: &str, text: &str| {
        let p = src.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
    };
    write(
        "lib.rs",
        "pub mod types; pub mod store; pub mod controller; pub mod api;",
    );
    write(
        "types.rs",
        "// crate::api::x in a comment\nconst S: &str = \"crate::store\";",
    );
    write(
        "store/mod.rs",
        "use crate::{types, api::error::ApiError};\nmod a; mod b;",
    );
    write("store/a.rs", "use super::b::thing;");
    write("store/b.rs", "fn f() { crate::store::a::g(); }");
    write(
        "controller/mod.rs",
        "use crate::types::Kind;\nlet c = '\"'; use crate::store;",
    );
    write(
        "api/mod.rs",
        "use crate::controller; fn f() { crate::store::x(); }",
    );
    let errors = violations(&src, &read(&src));
    let all = errors.join("\n");
    assert!(
        all.contains("src/store/mod.rs: forbidden import store → api (`crate::api`)"),
        "{all}"
    );
    assert!(
        all.contains("cycle between submodules of `store`: a"),
        "{all}"
    );
    // Downward edges, and paths in comments or strings, are not reported.
    assert!(!all.contains("types.rs"), "{all}");
    assert!(!all.contains("controller/mod.rs"), "{all}");
    assert!(!all.contains("src/api/mod.rs"), "{all}");
    assert_eq!(errors.len(), 2, "{all}");
}
