//! The one protobuf body current `kubectl` sends here: `kubectl create namespace NAME` posts a
//! Namespace as `application/vnd.kubernetes.protobuf` (built-in kinds always go as protobuf
//! from client-go). This reads the `k8s\0` envelope (`runtime.Unknown`) and the Namespace's
//! name, labels and annotations — field numbers from Kubernetes' `generated.proto` files —
//! and turns it into the JSON the rest of the API takes. Other kinds are refused with a
//! message asking for JSON.

use serde_json::{Map, Value, json};

pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// Fields of one message: (number, bytes of a length-delimited field). Varints are skipped.
fn fields(mut b: &[u8]) -> Result<Vec<(u64, &[u8])>, String> {
    let mut out = vec![];
    while !b.is_empty() {
        let (key, n) = varint(b)?;
        b = &b[n..];
        match key & 7 {
            0 => {
                let (_, n) = varint(b)?;
                b = &b[n..];
            }
            2 => {
                let (len, n) = varint(b)?;
                let len = len as usize;
                let rest = &b[n..];
                if rest.len() < len {
                    return Err("truncated protobuf field".into());
                }
                out.push((key >> 3, &rest[..len]));
                b = &rest[len..];
            }
            1 => b = b.get(8..).ok_or("truncated protobuf field")?,
            5 => b = b.get(4..).ok_or("truncated protobuf field")?,
            w => return Err(format!("unsupported protobuf wire type {w}")),
        }
    }
    Ok(out)
}

fn varint(b: &[u8]) -> Result<(u64, usize), String> {
    let mut v = 0u64;
    for (i, byte) in b.iter().enumerate().take(10) {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok((v, i + 1));
        }
    }
    Err("bad protobuf varint".into())
}

fn text(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "a protobuf string is not UTF-8".to_string())
}

/// `map<string,string>` entries: key = 1, value = 2.
fn map_entry(b: &[u8]) -> Result<(String, String), String> {
    let (mut k, mut v) = (String::new(), String::new());
    for (n, f) in fields(b)? {
        match n {
            1 => k = text(f)?,
            2 => v = text(f)?,
            _ => {}
        }
    }
    Ok((k, v))
}

/// Decode a protobuf-encoded object into JSON; only Namespaces are understood.
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let inner = body
        .strip_prefix(b"k8s\0")
        .ok_or("a protobuf body must start with the k8s envelope")?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for (n, f) in fields(inner)? {
        match n {
            1 => {
                for (m, g) in fields(f)? {
                    match m {
                        1 => api_version = text(g)?,
                        2 => kind = text(g)?,
                        _ => {}
                    }
                }
            }
            2 => raw = f,
            _ => {}
        }
    }
    if kind != "Namespace" || api_version != "v1" {
        return Err(format!(
            "protobuf bodies are understood for v1 Namespace only, not {api_version} {kind}; send JSON or YAML"
        ));
    }
    let mut meta = Map::new();
    let (mut labels, mut annotations) = (Map::new(), Map::new());
    for (n, f) in fields(raw)? {
        if n != 1 {
            continue; // spec (finalizers) and status: nothing edgevirt keeps
        }
        for (m, g) in fields(f)? {
            match m {
                1 => {
                    meta.insert("name".into(), json!(text(g)?));
                }
                2 => {
                    meta.insert("generateName".into(), json!(text(g)?));
                }
                11 => {
                    let (k, v) = map_entry(g)?;
                    labels.insert(k, json!(v));
                }
                12 => {
                    let (k, v) = map_entry(g)?;
                    annotations.insert(k, json!(v));
                }
                _ => {}
            }
        }
    }
    if !labels.is_empty() {
        meta.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        meta.insert("annotations".into(), Value::Object(annotations));
    }
    Ok(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": meta}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ld(n: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![n << 3 | 2, payload.len() as u8];
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn decodes_kubectl_create_namespace() {
        // ObjectMeta{name: "team1", labels: {a: b}} inside Namespace{metadata}
        let meta = [
            ld(1, b"team1"),
            ld(11, &[ld(1, b"a"), ld(2, b"b")].concat()),
        ]
        .concat();
        let ns = [ld(1, &meta), ld(2, &[]), ld(3, &[])].concat();
        let tm = [ld(1, b"v1"), ld(2, b"Namespace")].concat();
        let body = [b"k8s\0".to_vec(), ld(1, &tm), ld(2, &ns)].concat();
        assert_eq!(
            decode(&body).unwrap(),
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": "team1", "labels": {"a": "b"}}})
        );
    }

    #[test]
    fn refuses_other_kinds_and_garbage() {
        let tm = [ld(1, b"v1"), ld(2, b"Pod")].concat();
        let body = [b"k8s\0".to_vec(), ld(1, &tm)].concat();
        assert!(decode(&body).unwrap_err().contains("Namespace only"));
        assert!(decode(b"{}").is_err());
        assert!(decode(b"k8s\0\x0a\xff").is_err());
    }
}
