//! The protobuf bodies current `kubectl` sends here: `kubectl create namespace`, `create
//! configmap` and `create secret` post built-in kinds as `application/vnd.kubernetes.protobuf`
//! (client-go always does). This reads the `k8s\0` envelope (`runtime.Unknown`), the
//! object's metadata (name, namespace, labels, annotations) and the data of a ConfigMap or
//! Secret — field numbers from Kubernetes' `generated.proto` files — and turns it into the
//! JSON the rest of the API takes, which checks it as any other body. Other kinds are refused
//! with a message asking for JSON.

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

/// `map<string,bytes>` entries (key = 1, value = 2), the value base64 as JSON has it.
fn bytes_entry(b: &[u8]) -> Result<(String, Value), String> {
    use base64::Engine as _;
    let (mut k, mut v) = (String::new(), &[][..]);
    for (n, f) in fields(b)? {
        match n {
            1 => k = text(f)?,
            2 => v = f,
            _ => {}
        }
    }
    Ok((
        k,
        json!(base64::engine::general_purpose::STANDARD.encode(v)),
    ))
}

/// An `ObjectMeta`: name, generateName, namespace, labels and annotations.
fn object_meta(b: &[u8]) -> Result<Map<String, Value>, String> {
    let mut meta = Map::new();
    let (mut labels, mut annotations) = (Map::new(), Map::new());
    for (m, g) in fields(b)? {
        match m {
            // An empty string is proto3's "unset" (client-go sends an empty namespace).
            1..=3 if g.is_empty() => {}
            1 => {
                meta.insert("name".into(), json!(text(g)?));
            }
            2 => {
                meta.insert("generateName".into(), json!(text(g)?));
            }
            3 => {
                meta.insert("namespace".into(), json!(text(g)?));
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
    if !labels.is_empty() {
        meta.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        meta.insert("annotations".into(), Value::Object(annotations));
    }
    Ok(meta)
}

/// How one field of a kind is read: its JSON name and whether it is text, or a map of text
/// or of bytes.
enum Field {
    Text(&'static str),
    TextMap(&'static str),
    BytesMap(&'static str),
}

/// The fields (beyond `metadata`, always 1) of the kinds `kubectl create` sends here, by
/// number from Kubernetes' `core/v1/generated.proto`. A Namespace's spec (finalizers) and
/// status are nothing edgevirt keeps.
fn kind_fields(kind: &str) -> Option<&'static [(u64, Field)]> {
    Some(match kind {
        "Namespace" => &[],
        "ConfigMap" => &[
            (2, Field::TextMap("data")),
            (3, Field::BytesMap("binaryData")),
        ],
        "Secret" => &[
            (2, Field::BytesMap("data")),
            (3, Field::Text("type")),
            (4, Field::TextMap("stringData")),
        ],
        _ => return None,
    })
}

/// Decode a protobuf-encoded object into JSON: Namespaces, ConfigMaps and Secrets.
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
    let known = kind_fields(&kind).filter(|_| api_version == "v1");
    let Some(known) = known else {
        return Err(format!(
            "protobuf bodies are understood for v1 Namespace, ConfigMap and Secret only, not \
             {api_version} {kind}; send JSON or YAML"
        ));
    };
    let mut obj = Map::new();
    obj.insert("apiVersion".into(), json!("v1"));
    obj.insert("kind".into(), json!(kind));
    obj.insert("metadata".into(), json!({}));
    for (n, f) in fields(raw)? {
        if n == 1 {
            obj.insert("metadata".into(), Value::Object(object_meta(f)?));
            continue;
        }
        let Some((_, field)) = known.iter().find(|(m, _)| *m == n) else {
            continue;
        };
        let (name, k, v) = match field {
            Field::Text(name) => {
                obj.insert((*name).into(), json!(text(f)?));
                continue;
            }
            Field::TextMap(name) => {
                let (k, v) = map_entry(f)?;
                (name, k, json!(v))
            }
            Field::BytesMap(name) => {
                let (k, v) = bytes_entry(f)?;
                (name, k, v)
            }
        };
        let map = obj.entry(*name).or_insert_with(|| json!({}));
        map[k.as_str()] = v;
    }
    Ok(Value::Object(obj))
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

    fn envelope(kind: &str, obj: &[u8]) -> Vec<u8> {
        let tm = [ld(1, b"v1"), ld(2, kind.as_bytes())].concat();
        [b"k8s\0".to_vec(), ld(1, &tm), ld(2, obj)].concat()
    }

    /// `kubectl create configmap site --from-literal=mode=edge` and `create secret generic`,
    /// as client-go encodes them: text maps as text, byte maps as base64 in JSON.
    #[test]
    fn decodes_kubectl_create_configmap_and_secret() {
        let meta = ld(1, &[ld(1, b"site"), ld(2, b""), ld(3, b"default")].concat());
        let entry = |k: &[u8], v: &[u8]| [ld(1, k), ld(2, v)].concat();
        let cm = [
            meta.clone(),
            ld(2, &entry(b"mode", b"edge")),
            ld(2, &entry(b"tz", b"UTC")),
            ld(3, &entry(b"blob", &[0, 1])),
        ]
        .concat();
        assert_eq!(
            decode(&envelope("ConfigMap", &cm)).unwrap(),
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "site", "namespace": "default"},
                   "data": {"mode": "edge", "tz": "UTC"}, "binaryData": {"blob": "AAE="}})
        );
        let secret = [
            meta,
            ld(2, &entry(b"key", b"hi")),
            ld(3, b"Opaque"),
            ld(4, &entry(b"plain", b"text")),
        ]
        .concat();
        assert_eq!(
            decode(&envelope("Secret", &secret)).unwrap(),
            json!({"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": "site", "namespace": "default"},
                   "data": {"key": "aGk="}, "type": "Opaque", "stringData": {"plain": "text"}})
        );
    }

    #[test]
    fn refuses_other_kinds_and_garbage() {
        let tm = [ld(1, b"v1"), ld(2, b"Pod")].concat();
        let body = [b"k8s\0".to_vec(), ld(1, &tm)].concat();
        assert!(decode(&body).unwrap_err().contains("Secret only"));
        assert!(decode(b"{}").is_err());
        assert!(decode(b"k8s\0\x0a\xff").is_err());
    }
}
