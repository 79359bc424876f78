//! Router tests with `oneshot` requests against a real SQLite store (no socket, no libvirt).

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::*;
use crate::store::Store;

const VMS: &str = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines";

struct T {
    _dir: tempfile::TempDir,
    app: Router,
    store: Store,
}

async fn setup() -> T {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("db")).await.unwrap();
    for (tok, role) in [("admin-tok", "admin"), ("viewer-tok", "viewer")] {
        store
            .add_token(&auth::token_hash(tok), role, role, "")
            .await
            .unwrap();
    }
    // An image for specs to name (no file needed for API-level tests).
    store
        .create(
            crate::types::Kind::Image,
            json!({"metadata": {"name": "test-kernel"}, "spec": {}, "status": {"format": "raw", "sizeBytes": 1, "virtualSizeBytes": 1, "file": "x"}}),
            false,
        )
        .await
        .unwrap();
    store.ensure_namespaces().await.unwrap();
    let app = router(AppState::new(
        store.clone(),
        dir.path().to_path_buf(),
        "test".into(),
    ));
    T {
        _dir: dir,
        app,
        store,
    }
}

async fn call(
    t: &T,
    method: &str,
    path: &str,
    token: Option<&str>,
    ct: &str,
    body: &str,
) -> (StatusCode, Value) {
    let mut b = Request::builder().method(method).uri(path);
    if let Some(tok) = token {
        b = b.header("authorization", format!("Bearer {tok}"));
    }
    if !ct.is_empty() {
        b = b.header("content-type", ct);
    }
    let resp = t
        .app
        .clone()
        .oneshot(b.body(Body::from(body.to_string())).unwrap())
        .await
        .unwrap();
    let code = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn vm(name: &str, labels: Value) -> String {
    json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": name, "labels": labels},
        "spec": {"runStrategy": "Halted", "template": {"spec": {
            "domain": {"memory": {"guest": "128Mi"}, "devices": {},
                       "firmware": {"kernelBoot": {"container": {"image": "x", "kernelPath": "test-kernel"}}}}}}}
    })
    .to_string()
}

#[tokio::test]
async fn auth_is_required_except_health() {
    let t = setup().await;
    assert_eq!(
        call(&t, "GET", "/healthz", None, "", "").await.0,
        StatusCode::OK
    );
    let ready = |tok| call(&t, "GET", "/readyz", tok, "", "");
    assert_eq!(ready(None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(ready(Some("viewer-tok")).await.0, StatusCode::OK);
    let (code, v) = call(&t, "GET", VMS, None, "", "").await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    assert_eq!(v["kind"], "Status");
    assert_eq!(
        call(&t, "GET", VMS, Some("wrong"), "", "").await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(&t, "GET", VMS, Some("viewer-tok"), "", "").await.0,
        StatusCode::OK
    );
    let (code, v) = call(
        &t,
        "POST",
        VMS,
        Some("viewer-tok"),
        "application/json",
        &vm("a", json!({})),
    )
    .await;
    assert_eq!(code, StatusCode::FORBIDDEN, "{v}");
}

#[tokio::test]
async fn crud_selectors_paging_conflicts_and_patches() {
    let t = setup().await;
    for (n, app) in [("a", "web"), ("b", "db"), ("c", "web")] {
        let (code, v) = call(
            &t,
            "POST",
            VMS,
            Some("admin-tok"),
            "application/json",
            &vm(n, json!({"app": app})),
        )
        .await;
        assert_eq!(code, StatusCode::CREATED, "{v}");
        assert_eq!(v["metadata"]["finalizers"], json!(["edgevirt.io/volumes"]));
    }
    let (_, l) = call(
        &t,
        "GET",
        &format!("{VMS}?labelSelector=app%3Dweb"),
        Some("admin-tok"),
        "",
        "",
    )
    .await;
    let names: Vec<_> = l["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].clone())
        .collect();
    assert_eq!(names, vec![json!("a"), json!("c")]);
    let (_, p1) = call(
        &t,
        "GET",
        &format!("{VMS}?limit=2"),
        Some("admin-tok"),
        "",
        "",
    )
    .await;
    assert_eq!(p1["items"].as_array().unwrap().len(), 2);
    let cont = p1["metadata"]["continue"].as_str().unwrap();
    let (_, p2) = call(
        &t,
        "GET",
        &format!("{VMS}?limit=2&continue={cont}"),
        Some("admin-tok"),
        "",
        "",
    )
    .await;
    assert_eq!(p2["items"][0]["metadata"]["name"], "c");
    assert!(p2["metadata"].get("continue").is_none());

    let (_, mut a) = call(&t, "GET", &format!("{VMS}/a"), Some("admin-tok"), "", "").await;
    let stale = a.clone();
    a["spec"]["runStrategy"] = json!("Manual");
    let (code, a2) = call(
        &t,
        "PUT",
        &format!("{VMS}/a"),
        Some("admin-tok"),
        "application/json",
        &a.to_string(),
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{a2}");
    let (code, _) = call(
        &t,
        "PUT",
        &format!("{VMS}/a"),
        Some("admin-tok"),
        "application/json",
        &stale.to_string(),
    )
    .await;
    assert_eq!(code, StatusCode::CONFLICT);

    let (code, v) = call(
        &t,
        "PATCH",
        &format!("{VMS}/a"),
        Some("admin-tok"),
        "application/merge-patch+json",
        r#"{"metadata":{"labels":{"tier":"x"}}}"#,
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{v}");
    assert_eq!(v["metadata"]["labels"]["tier"], "x");
    let (code, v) = call(
        &t,
        "PATCH",
        &format!("{VMS}/a"),
        Some("admin-tok"),
        "application/json-patch+json",
        r#"[{"op":"replace","path":"/spec/runStrategy","value":"Halted"}]"#,
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{v}");
    assert_eq!(v["spec"]["runStrategy"], "Halted");
    let (code, v) = call(
        &t,
        "PATCH",
        &format!("{VMS}/a"),
        Some("admin-tok"),
        "application/json-patch+json",
        r#"[{"op":"add","path":"/spec/template/spec/domain/gpus","value":[]}]"#,
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(v["message"].as_str().unwrap().contains("gpus"));
    let (code, _) = call(
        &t,
        "PATCH",
        &format!("{VMS}/a"),
        Some("admin-tok"),
        "text/plain",
        "x",
    )
    .await;
    assert_eq!(code, StatusCode::UNSUPPORTED_MEDIA_TYPE);
}

#[tokio::test]
async fn start_stop_rename_subresources() {
    let t = setup().await;
    call(
        &t,
        "POST",
        VMS,
        Some("admin-tok"),
        "application/json",
        &vm("s", json!({})),
    )
    .await;
    let sub = "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/s";
    let (code, _) = call(&t, "PUT", &format!("{sub}/stop"), Some("admin-tok"), "", "").await;
    assert_eq!(code, StatusCode::CONFLICT, "stopping a stopped VM");
    let (code, _) = call(
        &t,
        "PUT",
        &format!("{sub}/start"),
        Some("admin-tok"),
        "",
        "",
    )
    .await;
    assert_eq!(code, StatusCode::ACCEPTED);
    let (_, v) = call(&t, "GET", &format!("{VMS}/s"), Some("admin-tok"), "", "").await;
    assert_eq!(v["spec"]["runStrategy"], "Always");
    // Older clients' path and the rename body of that era.
    let old = "/apis/subresources.kubevirt.io/v1alpha3/namespaces/default/virtualmachines/s/rename";
    let (code, v) = call(
        &t,
        "PUT",
        old,
        Some("admin-tok"),
        "application/json",
        r#"{"newName":"s2"}"#,
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{v}");
    assert_eq!(v["metadata"]["name"], "s2");
    let (code, _) = call(
        &t,
        "PUT",
        &format!("{sub}/frobnicate"),
        Some("admin-tok"),
        "",
        "",
    )
    .await;
    assert_eq!(code, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn watch_resumes_from_a_resource_version() {
    let t = setup().await;
    let (_, l) = call(&t, "GET", VMS, Some("admin-tok"), "", "").await;
    let rv = l["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    t.store
        .create(
            crate::types::Kind::VirtualMachine,
            serde_json::from_str(&vm("w", json!({}))).unwrap(),
            false,
        )
        .await
        .unwrap();
    let req = Request::builder()
        .uri(format!(
            "{VMS}?watch=true&resourceVersion={rv}&timeoutSeconds=1"
        ))
        .header("authorization", "Bearer admin-tok")
        .body(Body::empty())
        .unwrap();
    let resp = t.app.clone().oneshot(req).await.unwrap();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let first: Value =
        serde_json::from_slice(bytes.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(first["type"], "ADDED");
    assert_eq!(first["object"]["metadata"]["name"], "w");
}

#[tokio::test]
async fn cpu_spec_is_checked_on_admission() {
    let t = setup().await;
    let path = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines";
    let with_cpu = |name: &str, cpu: Value| {
        let mut v: Value = serde_json::from_str(&vm(name, json!({}))).unwrap();
        v["spec"]["template"]["spec"]["domain"]["cpu"] = cpu;
        v.to_string()
    };
    let ct = "application/json";
    // KubeVirt's fields are accepted.
    let body = with_cpu(
        "good",
        json!({"cores": 2, "model": "EPYC", "features": [{"name": "topoext"}, {"name": "svm", "policy": "disable"}]}),
    );
    let (c, v) = call(&t, "POST", path, Some("admin-tok"), ct, &body).await;
    assert_eq!(c, StatusCode::CREATED, "{v}");
    assert_eq!(
        v["spec"]["template"]["spec"]["domain"]["cpu"]["features"][1]["policy"],
        "disable"
    );
    // A policy libvirt does not know, a model name that is not one, and the default's name.
    for (name, cpu, want) in [
        (
            "p",
            json!({"features": [{"name": "aes", "policy": "maybe"}]}),
            "force, require",
        ),
        (
            "m",
            json!({"model": "EPYC'/><x"}),
            "not a valid libvirt CPU name",
        ),
        ("d", json!({"model": "migratable"}), "cluster default"),
    ] {
        let (c, v) = call(
            &t,
            "POST",
            path,
            Some("admin-tok"),
            ct,
            &with_cpu(name, cpu),
        )
        .await;
        assert_eq!(c, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
        assert!(v["message"].as_str().unwrap().contains(want), "{v}");
    }
}

async fn call_as_agent(t: &T, path: &str, protocol: &str) -> (StatusCode, Value) {
    let req = Request::builder()
        .method("GET")
        .uri(path)
        .header("authorization", "Bearer admin-tok")
        .header(crate::version::AGENT_PROTOCOL_HEADER, protocol)
        .header(crate::version::RELEASE_HEADER, "9.9.9-test")
        .body(Body::empty())
        .unwrap();
    let resp = t.app.clone().oneshot(req).await.unwrap();
    let code = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// Agents one minor version apart (either way) are served; others are refused with both
/// versions named, and nothing is written for them.
#[tokio::test]
async fn agent_protocol_skew_window() {
    use crate::version::{AGENT_PROTOCOL, Protocol};
    let t = setup().await;
    let (code, info) = call(
        &t,
        "GET",
        "/apis/edgevirt.io/v1/info",
        Some("admin-tok"),
        "",
        "",
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(info["agentProtocol"], AGENT_PROTOCOL.to_string());
    let at = |minor: u32| {
        Protocol {
            major: AGENT_PROTOCOL.major,
            minor,
        }
        .to_string()
    };
    let n = AGENT_PROTOCOL.minor;
    let mut ok = vec![at(n), at(n + 1)];
    if n > 0 {
        ok.push(at(n - 1));
    }
    for p in &ok {
        let (code, v) = call_as_agent(&t, "/apis/edgevirt.io/v1/nodes", p).await;
        assert_eq!(code, StatusCode::OK, "agent {p}: {v}");
    }
    let far = [
        at(n + 2),
        format!("{}.{n}", AGENT_PROTOCOL.major + 1),
        format!("{}.{n}", AGENT_PROTOCOL.major.wrapping_sub(1)),
    ];
    for p in &far {
        let (code, v) = call_as_agent(&t, "/apis/edgevirt.io/v1/nodes", p).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "agent {p}: {v}");
        assert_eq!(v["reason"], "VersionSkew");
        let m = v["message"].as_str().unwrap();
        assert!(
            m.contains(p.as_str()) && m.contains(&AGENT_PROTOCOL.to_string()),
            "{m}"
        );
        assert!(
            m.contains("9.9.9-test") && m.contains(crate::version::RELEASE),
            "{m}"
        );
    }
    let (code, v) = call_as_agent(&t, "/apis/edgevirt.io/v1/nodes", "one").await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{v}");
    // A refused agent cannot write either.
    let req = Request::builder()
        .method("PUT")
        .uri("/apis/edgevirt.io/v1/nodes/n1")
        .header("authorization", "Bearer admin-tok")
        .header("content-type", "application/json")
        .header(crate::version::AGENT_PROTOCOL_HEADER, &far[0])
        .body(Body::from(
            json!({"apiVersion": "edgevirt.io/v1", "kind": "Node", "metadata": {"name": "n1"}, "spec": {}})
                .to_string(),
        ))
        .unwrap();
    assert_eq!(
        t.app.clone().oneshot(req).await.unwrap().status(),
        StatusCode::BAD_REQUEST
    );
    let (code, _) = call(
        &t,
        "GET",
        "/apis/edgevirt.io/v1/nodes/n1",
        Some("admin-tok"),
        "",
        "",
    )
    .await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    // Without a token the skew check says nothing: authentication comes first.
    let req = Request::builder()
        .uri("/apis/edgevirt.io/v1/nodes")
        .header(crate::version::AGENT_PROTOCOL_HEADER, &far[0])
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        t.app.clone().oneshot(req).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn install_strategy_endpoints() {
    use crate::controller::strategy;
    let t = setup().await;
    let path = "/apis/edgevirt.io/v1/installstrategy";
    let (code, v) = call(&t, "GET", path, Some("viewer-tok"), "", "").await;
    assert_eq!(code, StatusCode::NOT_FOUND, "{v}");
    strategy::ensure(&t.store, Default::default())
        .await
        .unwrap();
    let (code, _) = call(&t, "GET", path, None, "", "").await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    let (code, v) = call(&t, "GET", path, Some("viewer-tok"), "", "").await;
    assert_eq!(code, StatusCode::OK, "{v}");
    let ann = &v["configMap"]["metadata"]["annotations"];
    assert_eq!(ann[strategy::VERSION_ANNOTATION], crate::version::RELEASE);
    assert_eq!(ann[strategy::ENCODING_ANNOTATION], "gzip+base64");
    assert_eq!(v["manifest"]["version"], crate::version::RELEASE);
    assert_eq!(v["rollout"]["state"], "RolledOver");
    // A node on an older release makes the rollout progress.
    t.store
        .create(
            crate::types::Kind::Node,
            json!({"apiVersion": "edgevirt.io/v1", "kind": "Node", "metadata": {"name": "old-node"}, "spec": {},
                "status": {"version": "0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}}),
            false,
        )
        .await
        .unwrap();
    let (code, r) = call(
        &t,
        "GET",
        "/apis/edgevirt.io/v1/rollout",
        Some("viewer-tok"),
        "",
        "",
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(r["state"], "Progressing");
    assert_eq!(r["nodesPending"], 1);
    assert_eq!(r["nodes"][0]["version"], "0.0.1");
    let vpath = "/apis/edgevirt.io/v1/installstrategy/version";
    let body = r#"{"version": "0.0.1"}"#;
    let (code, _) = call(
        &t,
        "PUT",
        vpath,
        Some("viewer-tok"),
        "application/json",
        body,
    )
    .await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    let (code, v) = call(
        &t,
        "PUT",
        vpath,
        Some("admin-tok"),
        "application/json",
        r#"{"version": "latest"}"#,
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert!(v["message"].as_str().unwrap().contains("latest"));
    let (code, v) = call(
        &t,
        "PUT",
        vpath,
        Some("admin-tok"),
        "application/json",
        "{}",
    )
    .await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{v}");
    let (code, v) = call(
        &t,
        "PUT",
        vpath,
        Some("admin-tok"),
        "application/json",
        body,
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{v}");
    assert_eq!(v["rollout"]["state"], "RolledOver", "{v}");
    let (_, v) = call(&t, "GET", path, Some("admin-tok"), "", "").await;
    assert_eq!(
        v["configMap"]["metadata"]["annotations"][strategy::VERSION_ANNOTATION],
        "0.0.1"
    );
}

/// Every refusal is a `Status` with the code its cause deserves: 415 for a body without a
/// JSON or YAML type, 400 for a bad query, 422 for what a patch may not do to identity, 409
/// only for a stale resourceVersion.
#[tokio::test]
async fn refusals_are_status_objects_with_the_right_code() {
    let t = setup().await;
    let tok = Some("admin-tok");
    let (code, v) = call(
        &t,
        "POST",
        VMS,
        tok,
        "application/json",
        &vm("a", json!({})),
    )
    .await;
    assert_eq!(code, StatusCode::CREATED, "{v}");
    let status = |code: StatusCode, v: &Value, want: StatusCode, what: &str| {
        assert_eq!(code, want, "{what}: {v}");
        assert_eq!(v["kind"], "Status", "{what}: {v}");
        assert_eq!(v["code"], want.as_u16(), "{what}: {v}");
        assert!(
            v["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: {v}"
        );
    };
    for ct in ["text/plain", "application/x-www-form-urlencoded"] {
        let (code, v) = call(&t, "POST", VMS, tok, ct, &vm("b", json!({}))).await;
        status(code, &v, StatusCode::UNSUPPORTED_MEDIA_TYPE, ct);
    }
    // No type is JSON (kube-apiserver's rule, which kubectl 1.20 relies on), never YAML.
    let (code, v) = call(&t, "POST", VMS, tok, "", "metadata:\n  name: b\n").await;
    status(code, &v, StatusCode::BAD_REQUEST, "YAML without a type");
    assert!(v["message"].as_str().unwrap().contains("JSON"), "{v}");
    for q in [
        "limit=-1",
        "limit=abc",
        "timeoutSeconds=x",
        "labelSelector=!!",
        "labelSelector=a%3Db%3Dc",
    ] {
        let (code, v) = call(&t, "GET", &format!("{VMS}?{q}"), tok, "", "").await;
        status(code, &v, StatusCode::BAD_REQUEST, q);
    }
    let a = format!("{VMS}/a");
    let merge = "application/merge-patch+json";
    for (patch, want) in [
        (r#"{"metadata": null}"#, StatusCode::UNPROCESSABLE_ENTITY),
        (
            r#"{"metadata": {"name": "b"}}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            r#"{"metadata": {"namespace": "other"}}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            r#"{"metadata": {"resourceVersion": "1"}}"#,
            StatusCode::CONFLICT,
        ),
    ] {
        let (code, v) = call(&t, "PATCH", &a, tok, merge, patch).await;
        status(code, &v, want, patch);
    }
    // Removing the resourceVersion applies to the current one.
    let (code, v) = call(
        &t,
        "PATCH",
        &a,
        tok,
        merge,
        r#"{"metadata": {"resourceVersion": null, "labels": {"x": "y"}}}"#,
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{v}");
    assert_eq!(v["metadata"]["labels"]["x"], "y");
    // A JSON patch whose copies double the object is refused before it grows.
    let mut ops = vec![
        json!({"op": "add", "path": "/metadata/annotations", "value": {"a": "x".repeat(1000)}}),
    ];
    for i in 0..40 {
        ops.push(json!({"op": "copy", "from": "/metadata/annotations", "path": format!("/metadata/annotations/c{i}")}));
    }
    let (code, v) = call(
        &t,
        "PATCH",
        &a,
        tok,
        "application/json-patch+json",
        &serde_json::to_string(&ops).unwrap(),
    )
    .await;
    status(code, &v, StatusCode::UNPROCESSABLE_ENTITY, "copy bomb");
    assert!(
        v["message"].as_str().unwrap().contains("copies more than"),
        "{v}"
    );
    // Labels and annotations follow Kubernetes' syntax and limits.
    for (labels, what) in [
        (json!({"a b": "x"}), "a key with a space"),
        (json!({"k".repeat(64): "x"}), "a 64-character key"),
        (json!({"a": "v".repeat(64)}), "a 64-character value"),
    ] {
        let (code, v) = call(&t, "POST", VMS, tok, "application/json", &vm("c", labels)).await;
        status(code, &v, StatusCode::UNPROCESSABLE_ENTITY, what);
        assert!(
            v["message"].as_str().unwrap().contains("metadata.labels"),
            "{v}"
        );
    }
    let mut big: Value = serde_json::from_str(&vm("d", json!({}))).unwrap();
    big["metadata"]["annotations"] = json!({"a": "x".repeat(300 << 10)});
    let (code, v) = call(&t, "POST", VMS, tok, "application/json", &big.to_string()).await;
    status(
        code,
        &v,
        StatusCode::UNPROCESSABLE_ENTITY,
        "300 KiB annotation",
    );
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("metadata.annotations"),
        "{v}"
    );
    // Counts and quantities never wrap: refused with the field named.
    let domain = |d: Value| {
        let mut o: Value = serde_json::from_str(&vm("e", json!({}))).unwrap();
        let dom = &mut o["spec"]["template"]["spec"]["domain"];
        for (k, v) in d.as_object().unwrap() {
            dom[k] = v.clone();
        }
        o.to_string()
    };
    for (d, field) in [
        (json!({"cpu": {"sockets": 65536, "cores": 65536}}), "cpu"),
        (json!({"cpu": {"sockets": 289}}), "cpu"),
        (
            json!({"memory": {"guest": "18446744073709551616"}}),
            "memory",
        ),
        (json!({"memory": {"guest": "1e400"}}), "memory"),
        (json!({"memory": {"guest": "-1Gi"}}), "memory"),
        (json!({"memory": {"guest": "17Ti"}}), "memory"),
    ] {
        let (code, v) = call(&t, "POST", VMS, tok, "application/json", &domain(d.clone())).await;
        status(code, &v, StatusCode::UNPROCESSABLE_ENTITY, &d.to_string());
        assert!(v["message"].as_str().unwrap().contains(field), "{d}: {v}");
    }
    let (code, v) = call(&t, "GET", VMS, tok, "", "").await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(
        v["items"].as_array().unwrap().len(),
        1,
        "only the first VM was stored"
    );
}

#[tokio::test]
async fn a_status_write_that_does_not_fit_the_typed_status_is_refused_naming_the_field() {
    let t = setup().await;
    let (code, _) = call(
        &t,
        "POST",
        VMS,
        Some("admin-tok"),
        "application/json",
        &vm("s1", json!({})),
    )
    .await;
    assert_eq!(code, StatusCode::CREATED);
    let path = format!("{VMS}/s1/status");
    let (code, body) = call(
        &t,
        "PUT",
        &path,
        Some("admin-tok"),
        "application/json",
        &json!({"metadata": {"name": "s1"}, "status": {"printableStatus": 3}}).to_string(),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let msg = body["message"].as_str().unwrap();
    assert!(
        msg.starts_with("status.printableStatus: invalid type: integer `3`"),
        "{msg}"
    );
    // Nothing was stored.
    let vm = t
        .store
        .get(crate::types::Kind::VirtualMachine, "default", "s1")
        .await
        .unwrap()
        .unwrap();
    assert!(vm["status"]["printableStatus"] != 3, "{vm}");
    // A status that fits is stored, fields this release does not know included.
    let (code, body) = call(
        &t,
        "PUT",
        &path,
        Some("admin-tok"),
        "application/json",
        &json!({"metadata": {"name": "s1"}, "status": {"printableStatus": "Stopped", "fromANewerAgent": 1}}).to_string(),
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(body["status"]["fromANewerAgent"], 1);

    // The issue's own case: a VMI status with "phase": 3.
    t.store
        .create(
            crate::types::Kind::VirtualMachineInstance,
            json!({"metadata": {"name": "i1", "namespace": "default"},
                   "spec": {"domain": {"devices": {}}}, "status": {"phase": "Running"}}),
            false,
        )
        .await
        .unwrap();
    let (code, body) = call(
        &t,
        "PUT",
        "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances/i1/status",
        Some("admin-tok"),
        "application/json",
        &json!({"metadata": {"name": "i1"}, "status": {"phase": 3}}).to_string(),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let msg = body["message"].as_str().unwrap();
    assert!(
        msg.starts_with("status.phase: invalid type: integer `3`"),
        "{msg}"
    );
}

async fn raw_get(t: &T, path: &str) -> (StatusCode, axum::http::HeaderMap, bytes::Bytes) {
    let req = Request::builder()
        .uri(path)
        .header("authorization", "Bearer admin-tok")
        .body(Body::empty())
        .unwrap();
    let resp = t.app.clone().oneshot(req).await.unwrap();
    let (code, headers) = (resp.status(), resp.headers().clone());
    (
        code,
        headers,
        resp.into_body().collect().await.unwrap().to_bytes(),
    )
}

/// A JSON LIST passes the stored JSON through; its bytes are what parsing every object and
/// serializing the list made before (head, items, paging metadata), so clients see no
/// difference.
#[tokio::test]
async fn list_bytes_equal_the_parsed_and_serialized_list() {
    let t = setup().await;
    for i in 0..7 {
        let (code, _) = call(
            &t,
            "POST",
            VMS,
            Some("admin-tok"),
            "application/json",
            &vm(&format!("l{i}"), json!({"n": i.to_string()})),
        )
        .await;
        assert_eq!(code, StatusCode::CREATED);
    }
    let (items, rv) = t
        .store
        .list(
            crate::types::Kind::VirtualMachine,
            Some("default"),
            &crate::store::LabelSelector::default(),
            &crate::store::FieldSelector::default(),
        )
        .await
        .unwrap();
    // What the handler serialized before (its struct, fields in this order).
    #[derive(serde::Serialize)]
    struct List<'a> {
        #[serde(rename = "apiVersion")]
        api_version: &'a str,
        kind: &'a str,
        metadata: Value,
        items: &'a [Value],
    }
    let old = serde_json::to_vec(&List {
        api_version: "kubevirt.io/v1",
        kind: "VirtualMachineList",
        metadata: json!({"resourceVersion": rv.to_string()}),
        items: &items,
    })
    .unwrap();
    let (code, headers, body) = raw_get(&t, VMS).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(
        String::from_utf8_lossy(&body),
        String::from_utf8_lossy(&old)
    );
    assert_eq!(headers["content-length"], old.len().to_string().as_str());
    assert_eq!(headers["content-type"], "application/json");

    // Pages: the same items, each page with the list's resourceVersion and a token.
    let (_, _, p1) = raw_get(&t, &format!("{VMS}?limit=3")).await;
    let p1: Value = serde_json::from_slice(&p1).unwrap();
    assert_eq!(p1["items"], json!(items[..3]));
    assert_eq!(p1["metadata"]["resourceVersion"], rv.to_string());
    let cont = p1["metadata"]["continue"].as_str().unwrap();
    t.store
        .create(
            crate::types::Kind::VirtualMachine,
            serde_json::from_str(&vm("l9", json!({}))).unwrap(),
            false,
        )
        .await
        .unwrap();
    let (_, _, p2) = raw_get(&t, &format!("{VMS}?limit=10&continue={cont}")).await;
    let p2: Value = serde_json::from_slice(&p2).unwrap();
    assert_eq!(p2["metadata"]["resourceVersion"], rv.to_string());
    assert_eq!(p2["items"].as_array().unwrap()[..4], items[3..]);
    assert_eq!(p2["items"][4]["metadata"]["name"], "l9");
    assert!(p2["metadata"].get("continue").is_none());
    let (code, _, _) = raw_get(&t, &format!("{VMS}?limit=1&continue=%21%21")).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);

    // A Table still works (parsed, as before).
    let req = Request::builder()
        .uri(VMS)
        .header("authorization", "Bearer admin-tok")
        .header(
            "accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(Body::empty())
        .unwrap();
    let resp = t.app.clone().oneshot(req).await.unwrap();
    let tb: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(tb["kind"], "Table");
    assert_eq!(tb["rows"].as_array().unwrap().len(), 8);
}

/// Many watchers starting from a full listing at once: each gets every object once, then
/// every change once, in order.
#[tokio::test]
async fn watch_fan_out_reaches_every_watcher() {
    let t = setup().await;
    for i in 0..30 {
        t.store
            .create(
                crate::types::Kind::VirtualMachine,
                serde_json::from_str(&vm(&format!("f{i:02}"), json!({}))).unwrap(),
                false,
            )
            .await
            .unwrap();
    }
    let watchers = 25;
    let mut bodies = Vec::new();
    for w in 0..watchers {
        // Some with a label selector, which must still see only their objects.
        let path = if w % 5 == 0 {
            format!("{VMS}?watch=true&timeoutSeconds=3&labelSelector=pick%3Dyes")
        } else {
            format!("{VMS}?watch=true&timeoutSeconds=3")
        };
        let req = Request::builder()
            .uri(path)
            .header("authorization", "Bearer admin-tok")
            .body(Body::empty())
            .unwrap();
        let resp = t.app.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        bodies.push(tokio::spawn(async move {
            resp.into_body().collect().await.unwrap().to_bytes()
        }));
    }
    for i in 0..10 {
        let labels = if i % 2 == 0 {
            json!({"pick": "yes"})
        } else {
            json!({})
        };
        t.store
            .update(
                crate::types::Kind::VirtualMachine,
                "default",
                "f00",
                move |o| {
                    o["metadata"]["labels"] = labels;
                    o["metadata"]["annotations"] = json!({"i": i.to_string()});
                    Ok(())
                },
            )
            .await
            .unwrap();
    }
    for (w, b) in bodies.into_iter().enumerate() {
        let bytes = b.await.unwrap();
        let lines: Vec<Value> = bytes
            .split(|c| *c == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        let added = lines.iter().filter(|l| l["type"] == "ADDED").count();
        let changes: Vec<&str> = lines
            .iter()
            .filter(|l| l["type"] == "MODIFIED")
            .map(|l| {
                l["object"]["metadata"]["annotations"]["i"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        if w % 5 == 0 {
            assert_eq!(added, 0, "watcher {w}");
            assert_eq!(changes, ["0", "2", "4", "6", "8"], "watcher {w}");
        } else {
            assert_eq!(added, 30, "watcher {w}");
            let all: Vec<String> = (0..10).map(|i| i.to_string()).collect();
            assert_eq!(changes, all, "watcher {w}");
        }
    }
}

#[tokio::test]
async fn one_refusal_names_every_field_at_fault() {
    let t = setup().await;
    let mut v: Value = serde_json::from_str(&vm("three", json!({}))).unwrap();
    let spec = &mut v["spec"]["template"]["spec"];
    spec["dnsPolicy"] = json!("None");
    spec["domain"]["bogusField"] = json!(1);
    spec["domain"]["devices"]["gpus"] = json!([]);
    let (code, s) = call(
        &t,
        "POST",
        VMS,
        Some("admin-tok"),
        "application/json",
        &v.to_string(),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{s}");
    assert_eq!(s["reason"], "Invalid");
    assert_eq!(s["details"]["kind"], "VirtualMachine", "{s}");
    assert_eq!(s["details"]["name"], "three", "{s}");
    assert_eq!(s["details"]["group"], "kubevirt.io", "{s}");
    let mut causes: Vec<(String, String)> = s["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert!(c["message"].as_str().is_some_and(|m| !m.is_empty()), "{c}");
            (
                c["field"].as_str().unwrap().to_string(),
                c["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    causes.sort();
    assert_eq!(
        causes,
        [
            (
                "spec.template.spec.dnsPolicy".into(),
                "FieldValueForbidden".into()
            ),
            (
                "spec.template.spec.domain.bogusField".into(),
                "FieldValueInvalid".into()
            ),
            (
                "spec.template.spec.domain.devices.gpus".into(),
                "FieldValueForbidden".into()
            ),
        ]
    );
    // Each also in the one-line message, for clients that print only that.
    let msg = s["message"].as_str().unwrap();
    for f in ["dnsPolicy", "domain.bogusField", "devices.gpus"] {
        assert!(msg.contains(f), "{f} not in {msg}");
    }
    let stored = t
        .store
        .get(crate::types::Kind::VirtualMachine, "default", "three");
    assert!(stored.await.unwrap().is_none());
}

/// KubeVirt still serves `kubevirt.io/v1alpha3`: an object written or read through it comes
/// back labelled `v1alpha3` (objects, lists, watch events) and is stored as `v1`, and
/// discovery lists both versions, `v1` preferred.
#[tokio::test]
async fn objects_read_through_v1alpha3_come_back_as_v1alpha3() {
    let t = setup().await;
    let old = "/apis/kubevirt.io/v1alpha3/namespaces/default/virtualmachines";
    let body = vm("old", json!({})).replace("kubevirt.io/v1\"", "kubevirt.io/v1alpha3\"");
    assert!(body.contains("v1alpha3"));
    let (code, v) = call(
        &t,
        "POST",
        old,
        Some("admin-tok"),
        "application/json",
        &body,
    )
    .await;
    assert_eq!(code, StatusCode::CREATED, "{v}");
    assert_eq!(v["apiVersion"], "kubevirt.io/v1alpha3");
    let (_, v) = call(&t, "GET", &format!("{VMS}/old"), Some("admin-tok"), "", "").await;
    assert_eq!(v["apiVersion"], "kubevirt.io/v1", "stored as v1");
    let (_, v) = call(&t, "GET", &format!("{old}/old"), Some("admin-tok"), "", "").await;
    assert_eq!(v["apiVersion"], "kubevirt.io/v1alpha3");
    let (_, l) = call(&t, "GET", old, Some("admin-tok"), "", "").await;
    assert_eq!(l["apiVersion"], "kubevirt.io/v1alpha3", "{l}");
    assert_eq!(l["items"][0]["apiVersion"], "kubevirt.io/v1alpha3", "{l}");
    let (code, v) = call(
        &t,
        "PATCH",
        &format!("{old}/old"),
        Some("admin-tok"),
        "application/merge-patch+json",
        r#"{"metadata":{"labels":{"patched":"yes"}}}"#,
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{v}");
    assert_eq!(
        (
            v["apiVersion"].as_str(),
            v["metadata"]["labels"]["patched"].as_str()
        ),
        (Some("kubevirt.io/v1alpha3"), Some("yes"))
    );
    let (_, bytes) = {
        let (c, _, b) = raw_get(&t, &format!("{old}?watch=true&timeoutSeconds=1")).await;
        (c, b)
    };
    let first: Value =
        serde_json::from_slice(bytes.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(first["type"], "ADDED");
    assert_eq!(first["object"]["apiVersion"], "kubevirt.io/v1alpha3");
    // Another group's version is not taken as an alias.
    let body = vm("x", json!({})).replace("kubevirt.io/v1\"", "kubevirt.io/v2\"");
    let (code, _) = call(
        &t,
        "POST",
        VMS,
        Some("admin-tok"),
        "application/json",
        &body,
    )
    .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    // Discovery: both versions, v1 preferred; the alias's resource list names itself.
    let (_, g) = call(&t, "GET", "/apis", Some("admin-tok"), "", "").await;
    let kv = g["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "kubevirt.io")
        .unwrap()
        .clone();
    assert_eq!(kv["preferredVersion"]["version"], "v1");
    assert_eq!(kv["versions"][1]["groupVersion"], "kubevirt.io/v1alpha3");
    let (code, l) = call(
        &t,
        "GET",
        "/apis/kubevirt.io/v1alpha3",
        Some("admin-tok"),
        "",
        "",
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(l["groupVersion"], "kubevirt.io/v1alpha3");
    let (code, _) = call(
        &t,
        "GET",
        "/apis/kubevirt.io/v1beta9",
        Some("admin-tok"),
        "",
        "",
    )
    .await;
    assert_eq!(code, StatusCode::NOT_FOUND);
}

/// DataVolumes through the API: every problem of a spec in one 422 (as kubectl shows it),
/// an immutable spec, VMs naming their templates' DataVolumes before they exist, a name that
/// is neither a DataVolume nor an image refused, and storage classes read-only.
#[tokio::test]
async fn data_volumes_are_checked_whole_and_named_by_vms() {
    let t = setup().await;
    const DVS: &str = "/apis/cdi.kubevirt.io/v1beta1/namespaces/default/datavolumes";
    let dv = |name: &str, spec: Value| {
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
               "metadata": {"name": name}, "spec": spec})
        .to_string()
    };
    let post = |path: &'static str, body: String| {
        let t = &t;
        async move {
            call(
                t,
                "POST",
                path,
                Some("admin-tok"),
                "application/json",
                &body,
            )
            .await
        }
    };
    let (code, s) = post(
        DVS,
        dv(
            "bad",
            json!({"source": {"http": {"url": "ftp://x/y"}},
                   "storage": {"resources": {"requests": {"storage": "0"}}, "storageClassName": "nfs"}}),
        ),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{s}");
    let fields: Vec<&str> = s["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        [
            "spec.source.http.url",
            "spec.storage.resources.requests.storage",
            "spec.storage.storageClassName"
        ],
        "{s}"
    );
    assert_eq!(s["details"]["group"], "cdi.kubevirt.io");
    let msg = s["message"].as_str().unwrap();
    assert!(msg.contains("source.http.url: \"ftp://x/y\""), "{msg}");

    let good = json!({"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}}});
    let (code, s) = post(DVS, dv("disk", good.clone())).await;
    assert_eq!(code, StatusCode::CREATED, "{s}");
    // Only its size may change, and only upwards (as a PVC's expansion).
    let put = |spec: Value| {
        let body = dv("disk", spec);
        let t = &t;
        async move {
            call(
                t,
                "PUT",
                &format!("{DVS}/disk"),
                Some("admin-tok"),
                "application/json",
                &body,
            )
            .await
        }
    };
    let mut other = good.clone();
    other["source"] = json!({"http": {"url": "http://x/y.qcow2"}});
    let (code, s) = put(other).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{s}");
    assert!(s["message"].as_str().unwrap().contains("cannot be changed"));
    let mut smaller = good.clone();
    smaller["storage"]["resources"]["requests"]["storage"] = json!("512Mi");
    let (code, s) = put(smaller).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{s}");
    assert!(
        s["message"].as_str().unwrap().contains("can only grow"),
        "{s}"
    );
    let mut grown = good.clone();
    grown["storage"]["resources"]["requests"]["storage"] = json!("2Gi");
    let (code, s) = put(grown).await;
    assert_eq!(code, StatusCode::OK, "{s}");
    assert_eq!(
        s["spec"]["storage"]["resources"]["requests"]["storage"],
        "2Gi"
    );

    // A VM names an existing DataVolume and one of its own templates.
    let mut v: Value = serde_json::from_str(&vm("user", json!({}))).unwrap();
    v["spec"]["dataVolumeTemplates"] =
        json!([{"metadata": {"name": "user-root"}, "spec": good.clone()}]);
    v["spec"]["template"]["spec"]["domain"]["devices"]["disks"] =
        json!([{"name": "a", "disk": {}}, {"name": "b", "disk": {}}]);
    v["spec"]["template"]["spec"]["volumes"] = json!([
        {"name": "a", "dataVolume": {"name": "disk"}},
        {"name": "b", "dataVolume": {"name": "user-root"}}]);
    let (code, s) = post(VMS, v.to_string()).await;
    assert_eq!(code, StatusCode::CREATED, "{s}");
    v["metadata"]["name"] = json!("other");
    v["spec"]["dataVolumeTemplates"] = json!([]);
    let (code, s) = post(VMS, v.to_string()).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{s}");
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("\"user-root\" does not exist"),
        "{s}"
    );
    // Two templates of one name, and a bad source, in one answer.
    v["spec"]["dataVolumeTemplates"] = json!([
        {"metadata": {"name": "twice"}, "spec": good.clone()},
        {"metadata": {"name": "twice"}, "spec": {"source": {"registry": {"url": "docker://"}}, "storage": good["storage"].clone()}}]);
    let (code, s) = post(VMS, v.to_string()).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{s}");
    assert_eq!(s["details"]["causes"].as_array().unwrap().len(), 2, "{s}");

    // Storage classes: listed, not written.
    let sc = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                    "metadata": {"name": "fast"}, "provisioner": "x"});
    let (code, s) = post("/apis/storage.k8s.io/v1/storageclasses", sc.to_string()).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{s}");
    let (code, l) = call(
        &t,
        "GET",
        "/apis/storage.k8s.io/v1",
        Some("viewer-tok"),
        "",
        "",
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(l["resources"][0]["name"], "storageclasses", "{l}");
    assert_eq!(l["resources"][0]["shortNames"], json!(["sc"]), "{l}");
}

/// `inferFromVolume`: the claim's labels name the instancetype and preference when the VM
/// is created, as KubeVirt's mutating webhook resolves them; a claim without them refuses
/// the VM unless the policy is Ignore, and a volume that is not there always refuses it.
#[tokio::test]
async fn instancetypes_are_inferred_from_the_volumes_labels() {
    let t = setup().await;
    const DVS: &str = "/apis/cdi.kubevirt.io/v1beta1/namespaces/default/datavolumes";
    const VMS: &str = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines";
    let post = |path: &'static str, body: Value| {
        let t = &t;
        async move {
            call(
                t,
                "POST",
                path,
                Some("admin-tok"),
                "application/json",
                &body.to_string(),
            )
            .await
        }
    };
    let blank = json!({"source": {"blank": {}},
                       "storage": {"resources": {"requests": {"storage": "1Gi"}}}});
    let (code, s) = post(
        DVS,
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
               "metadata": {"name": "golden", "labels": {
                   "instancetype.kubevirt.io/default-instancetype": "u1.medium",
                   "instancetype.kubevirt.io/default-preference": "fedora",
                   "instancetype.kubevirt.io/default-preference-kind": "VirtualMachinePreference"}},
               "spec": blank}),
    )
    .await;
    assert_eq!(code, StatusCode::CREATED, "{s}");
    let (code, s) = post(
        DVS,
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
               "metadata": {"name": "plain"}, "spec": blank}),
    )
    .await;
    assert_eq!(code, StatusCode::CREATED, "{s}");
    let vm = |name: &str, matchers: Value, volume: Value, templates: Value| {
        let mut spec = json!({"runStrategy": "Halted", "dataVolumeTemplates": templates,
            "template": {"spec": {"domain": {"devices": {}}, "volumes": [volume]}}});
        for (k, v) in matchers.as_object().unwrap() {
            spec[k] = v.clone();
        }
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
               "metadata": {"name": name}, "spec": spec})
    };
    let infer = |policy: Option<&str>| {
        let mut m = json!({"inferFromVolume": "root"});
        if let Some(p) = policy {
            m["inferFromVolumeFailurePolicy"] = json!(p);
        }
        json!({"instancetype": m.clone(), "preference": m})
    };
    let dv_volume = |dv: &str| json!({"name": "root", "dataVolume": {"name": dv}});

    // From a DataVolume's labels, and through a template cloning it (source.pvc).
    let clone = json!([{"metadata": {"name": "copy"},
        "spec": {"source": {"pvc": {"name": "golden"}},
                 "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}]);
    for (name, volume, templates) in [
        ("direct", dv_volume("golden"), json!([])),
        ("cloned", dv_volume("copy"), clone.clone()),
        (
            "claimed",
            json!({"name": "root", "persistentVolumeClaim": {"claimName": "golden"}}),
            json!([]),
        ),
    ] {
        let (code, s) = post(VMS, vm(name, infer(None), volume, templates)).await;
        assert_eq!(code, StatusCode::CREATED, "{name}: {s}");
        assert_eq!(
            s["spec"]["instancetype"],
            json!({"name": "u1.medium"}),
            "{name}: {s}"
        );
        assert_eq!(
            s["spec"]["preference"],
            json!({"name": "fedora", "kind": "VirtualMachinePreference"}),
            "{name}: {s}"
        );
    }

    // No labels: refused, naming the label and the way out; with Ignore, taken without.
    let (code, s) = post(
        VMS,
        vm("nolabels", infer(None), dv_volume("plain"), json!([])),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{s}");
    let msg = s["message"].as_str().unwrap();
    assert!(
        msg.contains("spec.instancetype.inferFromVolume")
            && msg.contains("instancetype.kubevirt.io/default-instancetype")
            && msg.contains("Ignore"),
        "{msg}"
    );
    // (taken without an instancetype, the template says how much memory)
    let sized = |mut v: Value| {
        v["spec"]["template"]["spec"]["domain"]["memory"] = json!({"guest": "128Mi"});
        v
    };
    let (code, s) = post(
        VMS,
        sized(vm(
            "ignored",
            infer(Some("Ignore")),
            dv_volume("plain"),
            json!([]),
        )),
    )
    .await;
    assert_eq!(code, StatusCode::CREATED, "{s}");
    assert!(s["spec"].get("instancetype").is_none(), "{s}");
    assert!(s["spec"].get("preference").is_none(), "{s}");
    // A template with another source carries no labels: ignorable too.
    let blank_t = json!([{"metadata": {"name": "fresh"}, "spec": blank}]);
    let (code, s) = post(
        VMS,
        sized(vm(
            "blank",
            infer(Some("Ignore")),
            dv_volume("fresh"),
            blank_t.clone(),
        )),
    )
    .await;
    assert_eq!(code, StatusCode::CREATED, "{s}");
    let (code, s) = post(VMS, vm("blank2", infer(None), dv_volume("fresh"), blank_t)).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{s}");
    // Never ignorable: a volume that is not there, a DataVolume that does not exist.
    let mut missing = vm(
        "novolume",
        infer(Some("Ignore")),
        dv_volume("golden"),
        json!([]),
    );
    missing["spec"]["instancetype"]["inferFromVolume"] = json!("data");
    let (code, s) = post(VMS, missing).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{s}");
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("no volume named \"data\""),
        "{s}"
    );
    let (code, s) = post(
        VMS,
        vm("nodv", infer(Some("Ignore")), dv_volume("ghost"), json!([])),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{s}");
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("\"ghost\" not found"),
        "{s}"
    );
    // The policy's spelling, and name with inferFromVolume.
    for (name, m, needle) in [
        (
            "policy",
            json!({"inferFromVolume": "root", "inferFromVolumeFailurePolicy": "Maybe"}),
            "must be Reject or Ignore",
        ),
        (
            "both",
            json!({"inferFromVolume": "root", "name": "u1.small"}),
            "mutually exclusive",
        ),
        (
            "lonepolicy",
            json!({"name": "u1.small", "inferFromVolumeFailurePolicy": "Ignore"}),
            "only with inferFromVolume",
        ),
    ] {
        let (code, s) = post(
            VMS,
            vm(
                name,
                json!({"instancetype": m}),
                dv_volume("golden"),
                json!([]),
            ),
        )
        .await;
        assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{name}: {s}");
        assert!(
            s["message"].as_str().unwrap().contains(needle),
            "{name}: {s}"
        );
    }
}
