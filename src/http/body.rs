//! Request bodies: the content type decides the parser, every route has a size limit, and
//! parsing untrusted text is bounded in depth, nodes and expansion, and done off the async
//! workers once a body is big enough to take measurable time.
//!
//! - `application/json` (and `+json` types): serde_json, which stops at 128 levels.
//! - `application/yaml`, `application/x-yaml`, `text/yaml`: serde-saphyr with a budget (depth,
//!   nodes, aliases, scalar bytes). It is linear on deep flow nesting, where libyaml (behind
//!   serde_yaml_ng) is quadratic, and it refuses alias "bombs" once they pass the budget.
//! - `application/vnd.kubernetes.protobuf`: the envelope kubectl may send.
//! - No `Content-Type` at all is JSON, as kube-apiserver takes it (kubectl 1.20 sends
//!   none when it creates a namespace); such a body is never tried as YAML.
//! - Anything else is 415: nothing is guessed.

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use serde_json::Value;

use super::error::{ApiError, ApiResult};
use super::throttle::Pool;

/// Object writes: Kubernetes' request limit (3 MiB).
pub const OBJECT_LIMIT: usize = 3 << 20;
/// `POST /join`: a node name, a secret and a version.
pub const JOIN_LIMIT: usize = 64 << 10;
/// The dashboard's login form.
pub const LOGIN_LIMIT: usize = 16 << 10;
/// Bodies up to this size are parsed in place: it takes microseconds.
const INLINE_PARSE: usize = 64 << 10;

/// How deep a YAML document may nest (KubeVirt objects need about 15 levels).
const YAML_MAX_DEPTH: usize = 64;
/// Nodes in one YAML document, aliases expanded.
const YAML_MAX_NODES: usize = 100_000;
/// Scalar bytes in one YAML document, aliases expanded.
const YAML_MAX_SCALAR_BYTES: usize = 8 << 20;
/// Alias uses in one YAML document.
const YAML_MAX_ALIASES: usize = 1_000;

/// The body formats the API reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
    Protobuf,
}

/// The format a request's content type names, or 415 naming what is accepted.
pub fn format_of(headers: &HeaderMap) -> ApiResult<Format> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match essence.as_str() {
        "" | "application/json" => Ok(Format::Json),
        "application/yaml" | "application/x-yaml" | "text/yaml" | "text/x-yaml" => Ok(Format::Yaml),
        e if e == super::protobuf::CONTENT_TYPE => Ok(Format::Protobuf),
        e if e.starts_with("application/") && e.ends_with("+json") => Ok(Format::Json),
        _ => Err(unsupported(ct)),
    }
}

fn unsupported(ct: &str) -> ApiError {
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "UnsupportedMediaType",
        format!(
            "Content-Type {ct:?} is not accepted here; send application/json or \
             application/yaml"
        ),
    )
}

/// Decode a request body into a JSON object, by its content type, off the async workers
/// when it is large.
pub async fn parse_body(headers: &HeaderMap, body: &Bytes) -> ApiResult<Value> {
    let format = format_of(headers)?;
    if body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    if body.len() <= INLINE_PARSE {
        return parse(format, body);
    }
    let body = body.clone();
    Pool::parsing()
        .run(move || parse(format, &body))
        .await
        .map_err(|busy| busy.into_error("parsing request bodies"))?
}

/// Decode a body of a known format, within the limits above.
pub fn parse(format: Format, body: &[u8]) -> ApiResult<Value> {
    let v: Value = match format {
        Format::Protobuf => super::protobuf::decode(body).map_err(|m| {
            ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                m,
            )
        })?,
        Format::Json => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?,
        Format::Yaml => {
            let text = std::str::from_utf8(body)
                .map_err(|_| ApiError::bad_request("the request body is not UTF-8"))?;
            parse_yaml(text).map_err(|e| {
                ApiError::bad_request(format!("the body is not valid YAML or passes a limit: {e}"))
            })?
        }
    };
    if !v.is_object() {
        return Err(ApiError::bad_request("the body must be an object"));
    }
    Ok(v)
}

/// Parse one untrusted YAML document into JSON, within the budget; the error says which
/// limit was passed.
pub fn parse_yaml(text: &str) -> Result<Value, String> {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = YAML_MAX_DEPTH;
    budget.max_nodes = YAML_MAX_NODES;
    budget.max_total_scalar_bytes = YAML_MAX_SCALAR_BYTES;
    budget.max_aliases = YAML_MAX_ALIASES;
    budget.max_documents = 1;
    // Duplicate keys: the last one wins, as in JSON and as kube-apiserver does by default.
    let options = serde_saphyr::options! {
        budget: Some(budget),
        with_snippet: false,
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::LastWins,
    };
    serde_saphyr::from_str_with_options::<Value>(text, options).map_err(|e| {
        let m = e.to_string();
        let m = m.lines().next().unwrap_or("").trim();
        let m = m.strip_prefix("error: ").unwrap_or(m);
        format!(
            "{m} (YAML is read within limits: nesting depth {YAML_MAX_DEPTH}, \
             {YAML_MAX_NODES} nodes, {YAML_MAX_ALIASES} aliases, {} MiB of scalars, \
             aliases expanded)",
            YAML_MAX_SCALAR_BYTES >> 20
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(ct: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        if !ct.is_empty() {
            h.insert(header::CONTENT_TYPE, ct.parse().unwrap());
        }
        h
    }

    #[test]
    fn content_type_decides() {
        assert_eq!(
            format_of(&headers("application/json")).unwrap(),
            Format::Json
        );
        assert_eq!(
            format_of(&headers("application/json; charset=utf-8")).unwrap(),
            Format::Json
        );
        assert_eq!(
            format_of(&headers("application/merge-patch+json")).unwrap(),
            Format::Json
        );
        assert_eq!(
            format_of(&headers("application/yaml")).unwrap(),
            Format::Yaml
        );
        // As kube-apiserver: no type is JSON, and never YAML.
        assert_eq!(format_of(&headers("")).unwrap(), Format::Json);
        assert!(parse(Format::Json, b"metadata:\n  name: a\n").is_err());
        for ct in ["text/plain", "application/x-www-form-urlencoded", "yaml"] {
            let e = format_of(&headers(ct)).unwrap_err();
            assert_eq!(e.code, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{ct}");
        }
    }

    #[test]
    fn yaml_is_parsed_like_kubectl_sends_it() {
        let v = parse_yaml("metadata:\n  name: a\n  labels: {app: web}\nspec:\n  n: 3\n").unwrap();
        assert_eq!(v["metadata"]["labels"]["app"], "web");
        assert_eq!(v["spec"]["n"], 3);
        // A few aliases within the budget are fine.
        let v = parse_yaml("a: &x {b: 1}\nc: *x\n").unwrap();
        assert_eq!(v["c"]["b"], 1);
        let v = parse_yaml("a: 1\nb: 2\na: 3\n").unwrap();
        assert_eq!(v["a"], 3, "the last of duplicate keys wins");
    }

    #[test]
    fn alias_bombs_and_deep_nesting_are_refused_quickly() {
        let t = std::time::Instant::now();
        let items = vec!["x"; 6000].join(",");
        let aliases = vec!["*a"; 6000].join(",");
        let bomb = format!("a: &a [{items}]\nb: [{aliases}]\n");
        assert!(parse_yaml(&bomb).is_err());
        let mut laughs = String::from("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
        for i in 1..10 {
            let refs = vec![format!("*a{}", i - 1); 9].join(", ");
            laughs.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
        }
        assert!(parse_yaml(&laughs).is_err());
        let big = "x".repeat(1 << 20);
        let scalar_bomb = format!("a: &a {big}\nb: [{}]\n", vec!["*a"; 1000].join(","));
        assert!(parse_yaml(&scalar_bomb).is_err());
        let deep = format!("a: {}{}", "[".repeat(120_000), "]".repeat(120_000));
        let e = parse_yaml(&deep).unwrap_err();
        assert!(
            e.contains("depth") || e.contains("recursion") || e.contains("nesting"),
            "{e}"
        );
        let json_deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse(Format::Json, json_deep.as_bytes()).is_err());
        // Generous for a debug build on a busy machine: the old parser took minutes.
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "{:?}",
            t.elapsed()
        );
    }
}
