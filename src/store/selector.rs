//! Kubernetes label and field selectors, parsed from query strings and matched against
//! stored JSON objects.

use serde_json::Value;

use super::{Error, Result};

#[derive(Clone, Debug, PartialEq)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelSelector(Vec<Req>);

impl LabelSelector {
    /// Parse Kubernetes' label selector grammar: comma-separated requirements, each
    /// `[!]KEY`, `KEY(=|==|!=)VALUE` or `KEY (in|notin) (V1, V2...)`, keys and values with
    /// label syntax. Anything else is an error naming the term.
    pub fn parse(s: &str) -> Result<LabelSelector> {
        let toks = lex(s)?;
        let mut p = Parser {
            toks,
            at: 0,
            src: s,
        };
        let mut reqs = Vec::new();
        if p.peek().is_none() {
            return Ok(LabelSelector(reqs));
        }
        loop {
            reqs.push(p.requirement()?);
            match p.next() {
                None => break,
                Some(Tok::Comma) => continue,
                Some(t) => return Err(p.error(&format!("expected ',' or the end, found {t}"))),
            }
        }
        Ok(LabelSelector(reqs))
    }

    /// Selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::NotEq(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Word(String),
    Eq,
    DoubleEq,
    NotEq,
    Bang,
    Open,
    Close,
    Comma,
}

impl std::fmt::Display for Tok {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tok::Word(w) => write!(f, "{w:?}"),
            Tok::Eq => f.write_str("'='"),
            Tok::DoubleEq => f.write_str("'=='"),
            Tok::NotEq => f.write_str("'!='"),
            Tok::Bang => f.write_str("'!'"),
            Tok::Open => f.write_str("'('"),
            Tok::Close => f.write_str("')'"),
            Tok::Comma => f.write_str("','"),
        }
    }
}

fn lex(s: &str) -> Result<Vec<Tok>> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let two = b.get(i + 1).copied();
        let (tok, len) = match c {
            b' ' | b'\t' => {
                i += 1;
                continue;
            }
            b'=' if two == Some(b'=') => (Tok::DoubleEq, 2),
            b'=' => (Tok::Eq, 1),
            b'!' if two == Some(b'=') => (Tok::NotEq, 2),
            b'!' => (Tok::Bang, 1),
            b'(' => (Tok::Open, 1),
            b')' => (Tok::Close, 1),
            b',' => (Tok::Comma, 1),
            c if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b'/') => {
                let n = b[i..]
                    .iter()
                    .take_while(|c| {
                        c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b'/')
                    })
                    .count();
                (Tok::Word(s[i..i + n].to_string()), n)
            }
            _ => {
                let ch = s[i..].chars().next().unwrap_or('?');
                return Err(Error::BadQuery(format!(
                    "invalid label selector {s:?}: unexpected character {ch:?}"
                )));
            }
        };
        out.push(tok);
        i += len;
    }
    Ok(out)
}

struct Parser<'a> {
    toks: Vec<Tok>,
    at: usize,
    src: &'a str,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at)
    }
    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.at).cloned();
        self.at += 1;
        t
    }
    fn error(&self, why: &str) -> Error {
        Error::BadQuery(format!("invalid label selector {:?}: {why}", self.src))
    }
    fn key(&mut self) -> Result<String> {
        match self.next() {
            Some(Tok::Word(k)) => {
                crate::types::check_label_key("label selector key", &k)
                    .map_err(|e| self.error(&e.0))?;
                Ok(k)
            }
            Some(t) => Err(self.error(&format!("expected a label key, found {t}"))),
            None => Err(self.error("expected a label key, found the end")),
        }
    }
    fn value(&mut self) -> Result<String> {
        match self.peek() {
            // An empty value, as Kubernetes allows (`app=`).
            None | Some(Tok::Comma) | Some(Tok::Close) => Ok(String::new()),
            Some(Tok::Word(_)) => {
                let Some(Tok::Word(v)) = self.next() else {
                    unreachable!("peeked a word")
                };
                crate::types::check_label_value("label selector value", &v)
                    .map_err(|e| self.error(&e.0))?;
                Ok(v)
            }
            Some(t) => Err(self.error(&format!("expected a value, found {t}"))),
        }
    }
    fn requirement(&mut self) -> Result<Req> {
        if self.peek() == Some(&Tok::Bang) {
            self.next();
            let k = self.key()?;
            return match self.peek() {
                None | Some(Tok::Comma) => Ok(Req::NotExists(k)),
                Some(t) => Err(self.error(&format!("'!{k}' takes no operator, found {t}"))),
            };
        }
        let k = self.key()?;
        match self.peek().cloned() {
            None | Some(Tok::Comma) => Ok(Req::Exists(k)),
            Some(Tok::Eq) | Some(Tok::DoubleEq) => {
                self.next();
                Ok(Req::Eq(k, self.value()?))
            }
            Some(Tok::NotEq) => {
                self.next();
                Ok(Req::NotEq(k, self.value()?))
            }
            Some(Tok::Word(op)) if op == "in" || op == "notin" => {
                self.next();
                if self.next() != Some(Tok::Open) {
                    return Err(self.error(&format!("'{op}' needs a list: {k} {op} (a, b)")));
                }
                let mut vals = vec![self.value()?];
                loop {
                    match self.next() {
                        Some(Tok::Comma) => vals.push(self.value()?),
                        Some(Tok::Close) => break,
                        Some(t) => {
                            return Err(self.error(&format!("expected ',' or ')', found {t}")));
                        }
                        None => return Err(self.error("the list is not closed with ')'")),
                    }
                }
                Ok(if op == "in" {
                    Req::In(k, vals)
                } else {
                    Req::NotIn(k, vals)
                })
            }
            Some(t) => Err(self.error(&format!("expected an operator after {k:?}, found {t}"))),
        }
    }
}

/// A parsed `fieldSelector` over the fields edgevirt indexes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

const FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "status.phase",
    "status.nodeName",
    // Events' fields, as Kubernetes selects them (`kubectl describe` finds an object's
    // events by its involvedObject).
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
    // The same, as `events.k8s.io/v1` names them.
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "reportingController",
];

impl FieldSelector {
    /// Parse `KEY(=|==|!=)VALUE` terms separated by commas, over the fields edgevirt
    /// indexes; in values, `\\`, `\,`, `\=` and `\!` escape those characters, as in
    /// Kubernetes, and unescaped ones are an error.
    pub fn parse(s: &str) -> Result<FieldSelector> {
        let mut out = Vec::new();
        for part in split_unescaped(s).into_iter().map(str::trim) {
            if part.is_empty() {
                if s.trim().is_empty() {
                    continue;
                }
                return Err(Error::BadQuery(format!(
                    "invalid field selector {s:?}: an empty term"
                )));
            }
            let bad =
                |why: &str| Error::BadQuery(format!("invalid field selector term {part:?}: {why}"));
            let (k, eq, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (k, true, v)
            } else {
                return Err(bad("expected KEY=VALUE, KEY==VALUE or KEY!=VALUE"));
            };
            let k = k.trim();
            if !FIELDS.contains(&k) {
                return Err(Error::BadQuery(format!(
                    "field selector {k:?} is not supported; use one of {}",
                    FIELDS.join(", ")
                )));
            }
            let v = unescape(v.trim()).map_err(|why| bad(&why))?;
            out.push((k.to_string(), eq, v));
        }
        Ok(FieldSelector(out))
    }

    /// Select objects bound to one node.
    pub fn node(name: &str) -> FieldSelector {
        FieldSelector(vec![("status.nodeName".into(), true, name.into())])
    }

    /// The node an equality term pins, which the store can answer from its index.
    pub fn node_name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, eq, _)| k == "status.nodeName" && *eq)
            .map(|(_, _, v)| v.as_str())
    }

    /// Selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(k, eq, v)| {
            let mut cur = obj;
            // An event's `source` selects its component; `events.k8s.io/v1` names select
            // the core fields they are read from.
            let renamed;
            let k = match k.as_str() {
                "source" => "source.component",
                "reportingController" => "reportingComponent",
                _ => match k.strip_prefix("regarding.") {
                    Some(rest) => {
                        renamed = format!("involvedObject.{rest}");
                        renamed.as_str()
                    }
                    None => k,
                },
            };
            for seg in k.split('.') {
                cur = &cur[seg];
            }
            (cur.as_str().unwrap_or("") == v) == *eq
        })
    }
}

/// Split on commas not escaped with a backslash.
fn split_unescaped(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut escaped) = (0, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            ',' => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn unescape(v: &str) -> std::result::Result<String, String> {
    let mut out = String::with_capacity(v.len());
    let mut it = v.chars();
    while let Some(c) = it.next() {
        match c {
            '\\' => match it.next() {
                Some(e @ ('\\' | ',' | '=' | '!')) => out.push(e),
                Some(e) => return Err(format!("invalid escape sequence \\{e}")),
                None => return Err("a trailing backslash".into()),
            },
            '=' | '!' | ',' => return Err(format!("unescaped {c:?} in the value")),
            c => out.push(c),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let o = json!({"metadata": {"labels": {"app": "web", "tier": "front"}}});
        for (sel, want) in [
            ("app=web", true),
            ("app==web,tier=front", true),
            ("app!=web", false),
            ("app in (db, web)", true),
            ("app notin (web)", false),
            ("tier", true),
            ("!tier", false),
            ("missing", false),
            ("", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&o),
                want,
                "{sel}"
            );
        }
        assert!(LabelSelector::parse("a in b").is_err());
        for bad in [
            "!!",
            "((((!!==",
            "a=b=c",
            "a in (b",
            "=x",
            "a b",
            "!a=b",
            "a,,b",
            ",",
            "a!",
            "a in ()x",
            "-a",
            "a=-b",
            "a=b c",
            "app=web;",
            &"k".repeat(64),
            &format!("a={}", "v".repeat(64)),
        ] {
            assert!(
                matches!(LabelSelector::parse(bad), Err(Error::BadQuery(_))),
                "{bad:?} must be refused"
            );
        }
        for good in [
            "a=",
            "a==",
            "a!=",
            "example.com/app=web",
            "a in (b,)",
            "a notin (b, c),d",
        ] {
            assert!(LabelSelector::parse(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn field_selectors() {
        let o =
            json!({"metadata": {"name": "a"}, "status": {"phase": "Running", "nodeName": "n1"}});
        assert!(
            FieldSelector::parse("status.phase=Running")
                .unwrap()
                .matches(&o)
        );
        assert!(
            !FieldSelector::parse("status.nodeName!=n1")
                .unwrap()
                .matches(&o)
        );
        assert_eq!(
            FieldSelector::parse("status.nodeName=n1")
                .unwrap()
                .node_name(),
            Some("n1")
        );
        assert!(FieldSelector::parse("spec.foo=1").is_err());
        let ev = json!({"involvedObject": {"kind": "VirtualMachineInstance", "name": "web"},
                        "source": {"component": "edgevirt-agent"}, "type": "Warning"});
        let sel = |s: &str| FieldSelector::parse(s).unwrap().matches(&ev);
        assert!(sel(
            "involvedObject.name=web,involvedObject.kind=VirtualMachineInstance"
        ));
        assert!(!sel("involvedObject.name=db"));
        assert!(sel("source=edgevirt-agent,type=Warning"));
        assert!(sel("regarding.name=web,reportingController!=x"));
        assert!(!sel("type=Normal"));
        assert!(FieldSelector::parse("metadata.name==a==b").is_err());
        assert!(FieldSelector::parse("metadata.name=a,").is_err());
        assert!(FieldSelector::parse("metadata.name=a\\q").is_err());
        let f = FieldSelector::parse("metadata.name=a\\=b").unwrap();
        assert!(f.matches(&json!({"metadata": {"name": "a=b"}})));
    }
}
