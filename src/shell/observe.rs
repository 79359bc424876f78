//! Every request counted and timed for `/metrics`: `edgevirt_api_requests_total` by verb,
//! resource and code, and `edgevirt_api_request_duration_seconds` by verb and resource (a
//! watch's duration is its whole life, so watches are counted but not timed, as the
//! Kubernetes API server does). Resources are the kinds' plurals and known subresources,
//! never a name from the path, so the number of series stays bounded whatever clients send.

use std::sync::LazyLock;
use std::time::Instant;

use axum::extract::Request;
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use prometheus::{HistogramVec, IntCounterVec, register_histogram_vec, register_int_counter_vec};

use crate::types::Kind;

static REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "edgevirt_api_requests_total",
        "API requests by verb, resource and HTTP code.",
        &["verb", "resource", "code"]
    )
    .expect("a valid metric")
});

static LATENCY: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "edgevirt_api_request_duration_seconds",
        "Time to answer an API request (to its first byte), by verb and resource.",
        &["verb", "resource"],
        vec![
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0
        ]
    )
    .expect("a valid metric")
});

/// Subresources named as themselves; any other is `other`.
const SUBRESOURCES: &[&str] = &[
    "status",
    "start",
    "stop",
    "restart",
    "pause",
    "unpause",
    "softreboot",
    "migrate",
    "rename",
    "vnc",
    "console",
    "guestosinfo",
    "userlist",
    "filesystemlist",
    "freeze",
    "unfreeze",
    "upload",
    "data",
    "stats",
];

/// The middleware: count and time the request.
pub async fn observe(req: Request, next: Next) -> Response {
    let (verb, resource) = classify(req.method(), req.uri().path(), req.uri().query());
    let start = Instant::now();
    let res = next.run(req).await;
    let code = res.status().as_u16().to_string();
    REQUESTS
        .with_label_values(&[verb, resource.as_str(), code.as_str()])
        .inc();
    if verb != "WATCH" {
        LATENCY
            .with_label_values(&[verb, resource.as_str()])
            .observe(start.elapsed().as_secs_f64());
    }
    res
}

/// The Kubernetes verb (`LIST`, `GET`, `WATCH`, `CREATE`, ...) and the resource of a
/// request, from its path alone.
pub fn classify(method: &Method, path: &str, query: Option<&str>) -> (&'static str, String) {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    // `api/v1/...` or `apis/GROUP/VERSION/...`, then optionally `namespaces/NS`.
    let rest: &[&str] = match segs.as_slice() {
        ["api", _, rest @ ..] => rest,
        ["apis", _, _, rest @ ..] => rest,
        ["metrics"] => return (verb_of(method, false, false), "metrics".into()),
        ["healthz"] | ["readyz"] => return (verb_of(method, false, false), "health".into()),
        ["api"] | ["apis"] | ["apis", _] | ["version"] | ["openapi", ..] => {
            return (verb_of(method, false, false), "discovery".into());
        }
        _ => return (verb_of(method, false, false), "other".into()),
    };
    let rest = match rest {
        ["namespaces", _, more @ ..] if !more.is_empty() => more,
        r => r,
    };
    let Some(plural) = rest.first() else {
        return (verb_of(method, false, false), "discovery".into());
    };
    let known = Kind::ALL.iter().any(|k| k.plural() == *plural);
    let mut resource = if known {
        (*plural).to_string()
    } else {
        "other".to_string()
    };
    if let Some(sub) = rest.get(2) {
        let sub = if SUBRESOURCES.contains(sub) {
            sub
        } else {
            "other"
        };
        resource = format!("{resource}/{sub}");
    }
    let watch = query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    (verb_of(method, rest.len() == 1, watch), resource)
}

fn verb_of(method: &Method, collection: bool, watch: bool) -> &'static str {
    match *method {
        Method::GET if watch => "WATCH",
        Method::GET if collection => "LIST",
        Method::GET | Method::HEAD => "GET",
        Method::POST => "CREATE",
        Method::PUT => "UPDATE",
        Method::PATCH => "PATCH",
        Method::DELETE if collection => "DELETECOLLECTION",
        Method::DELETE => "DELETE",
        _ => "OTHER",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_classified_without_names() {
        let c = |m: Method, p: &str, q: Option<&str>| {
            let (v, r) = classify(&m, p, q);
            (v, r)
        };
        assert_eq!(
            c(
                Method::GET,
                "/apis/kubevirt.io/v1/namespaces/default/virtualmachines",
                None
            ),
            ("LIST", "virtualmachines".into())
        );
        assert_eq!(
            c(
                Method::GET,
                "/apis/kubevirt.io/v1/virtualmachineinstances",
                Some("watch=true&x=1")
            ),
            ("WATCH", "virtualmachineinstances".into())
        );
        assert_eq!(
            c(
                Method::PUT,
                "/apis/subresources.kubevirt.io/v1/namespaces/d/virtualmachines/web/start",
                None
            ),
            ("UPDATE", "virtualmachines/start".into())
        );
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces/d/events/e1", None),
            ("GET", "events".into())
        );
        // A name never becomes a label: unknown plurals and subresources are `other`.
        assert_eq!(
            c(
                Method::GET,
                "/apis/x/v1/namespaces/d/secretsauce/n/evil",
                None
            ),
            ("GET", "other/other".into())
        );
        assert_eq!(c(Method::GET, "/metrics", None), ("GET", "metrics".into()));
        assert_eq!(
            c(Method::GET, "/some/random/page", None),
            ("GET", "other".into())
        );
    }
}
