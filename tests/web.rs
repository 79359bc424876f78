//! The dashboard's security over real HTTP, against `edgevirt serve --role controller` (no
//! libvirt needed): login and sessions, CSRF on forms and on cookie-authenticated API calls,
//! escaping, Content-Security-Policy, roles, and the embedded assets.

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, SET_COOKIE};
use testkit::serve;

/// serve (controller role) on a fresh data dir; killed when dropped.
struct Server {
    url: String,
    http: reqwest::Client,
    _serve: serve::Server,
    dir: tempfile::TempDir,
}

fn start() -> Server {
    start_on("127.0.0.1:0")
}

fn start_on(listen: &str) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = serve::command(testkit::exe(), dir.path());
    cmd.args([
        "--role",
        "controller",
        "--listen",
        listen,
        "--node-name",
        "t",
    ]);
    let s = serve::start(cmd, dir.path());
    // The dashboard's answers are checked as they are: no redirects followed.
    let mut http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
    if s.url.starts_with("https://") {
        let pem = std::fs::read(dir.path().join("tls/server.crt")).unwrap();
        http = http.add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap());
    }
    Server {
        url: s.url.clone(),
        http: http.build().unwrap(),
        _serve: s,
        dir,
    }
}

impl Server {
    fn initial(&self, key: &str) -> String {
        serve::initial_admin(self.dir.path(), key)
    }

    /// An API object as JSON, read with the bearer token `token`.
    async fn api_get(&self, token: &str, path: &str) -> serde_json::Value {
        self.http
            .get(format!("{}{path}", self.url))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

/// `name=value` of a Set-Cookie header, and the whole header line.
fn set_cookie(h: &HeaderMap, name: &str) -> Option<(String, String)> {
    h.get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with(&format!("{name}=")))
        .map(|v| {
            let value = v.split(';').next().unwrap()[name.len() + 1..].to_string();
            (value, v.to_string())
        })
}

fn hidden(html: &str, name: &str) -> String {
    let pat = format!("name=\"{name}\" value=\"");
    let i = html
        .find(&pat)
        .unwrap_or_else(|| panic!("no {name} field in {html}"))
        + pat.len();
    html[i..].split('"').next().unwrap().to_string()
}

/// A logged-in browser: its session cookie and CSRF token.
struct Browser {
    session: String,
    csrf: String,
}

async fn login(s: &Server, user: &str, password: &str) -> Result<Browser, StatusCode> {
    login_with(s, &s.http, user, password)
        .await
        .map_err(|(code, _)| code)
}

/// Log in through `http` (a client bound to another local address, say); on failure, the
/// status and the page.
async fn login_with(
    s: &Server,
    http: &reqwest::Client,
    user: &str,
    password: &str,
) -> Result<Browser, (StatusCode, String)> {
    let r = http
        .get(format!("{}/ui/login", s.url))
        .send()
        .await
        .unwrap();
    let (pre, _) = set_cookie(r.headers(), "edgevirt_prelogin").expect("a pre-login cookie");
    let form_csrf = hidden(&r.text().await.unwrap(), "csrf");
    assert_eq!(
        form_csrf, pre,
        "the login form's token is the cookie's (double submit)"
    );
    let r = http
        .post(format!("{}/ui/login", s.url))
        .header("cookie", format!("edgevirt_prelogin={pre}"))
        .form(&[
            ("csrf", pre.as_str()),
            ("next", "/ui/"),
            ("username", user),
            ("password", password),
        ])
        .send()
        .await
        .unwrap();
    if r.status() != StatusCode::SEE_OTHER {
        let code = r.status();
        let retry = r
            .headers()
            .get("retry-after")
            .map(|v| format!("Retry-After: {}\n", v.to_str().unwrap_or("")))
            .unwrap_or_default();
        return Err((code, retry + &r.text().await.unwrap_or_default()));
    }
    let (session, line) = set_cookie(r.headers(), "edgevirt_session").expect("a session cookie");
    assert!(line.contains("HttpOnly"), "{line}");
    assert!(line.contains("SameSite=Strict"), "{line}");
    let page = http
        .get(format!("{}/ui/", s.url))
        .header("cookie", format!("edgevirt_session={session}"))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let csrf = hidden(&page.text().await.unwrap(), "csrf");
    Ok(Browser { session, csrf })
}

impl Browser {
    fn cookie(&self) -> String {
        format!("edgevirt_session={}", self.session)
    }
    async fn get(&self, s: &Server, path: &str) -> reqwest::Response {
        s.http
            .get(format!("{}{path}", s.url))
            .header("cookie", self.cookie())
            .send()
            .await
            .unwrap()
    }
    /// A page's HTML.
    async fn html(&self, s: &Server, path: &str) -> String {
        self.get(s, path).await.text().await.unwrap()
    }
    async fn post(&self, s: &Server, path: &str, form: &[(&str, &str)]) -> reqwest::Response {
        s.http
            .post(format!("{}{path}", s.url))
            .header("cookie", self.cookie())
            .form(form)
            .send()
            .await
            .unwrap()
    }

    /// As an admin: add the viewer `name` (password `viewer-pass`) on the admin page, and
    /// log it in.
    async fn add_viewer(&self, s: &Server, name: &str) -> Browser {
        let form = [
            ("csrf", self.csrf.as_str()),
            ("name", name),
            ("role", "viewer"),
            ("password", "viewer-pass"),
        ];
        let r = self.post(s, "/ui/admin/users", &form).await;
        assert_eq!(r.status(), 200);
        let page = r.text().await.unwrap();
        assert!(page.contains(&format!("User {name} created.")), "{page}");
        login(s, name, "viewer-pass").await.unwrap()
    }
}

/// `pattern` with `&{lt}`/`&{gt}` as either named or numeric entities is in `html`.
fn escaped(html: &str, pattern: &str) -> bool {
    [("lt;", "gt;"), ("#60;", "#62;")]
        .iter()
        .any(|(lt, gt)| html.contains(&pattern.replace("{lt}", lt).replace("{gt}", gt)))
}

#[tokio::test]
async fn login_sessions_csrf_escaping_and_roles() {
    let s = start();
    let password = s.initial("password");
    let token = s.initial("token");

    // Pages need a session; the login form needs its own token.
    let r = s
        .http
        .get(format!("{}/ui/vms", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()["location"], "/ui/login?next=%2Fui%2Fvms");
    let r = s
        .http
        .get(format!("{}/ui/networks", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::SEE_OTHER,
        "the networks page needs a session"
    );
    let r = s
        .http
        .post(format!("{}/ui/login", s.url))
        .form(&[("username", "admin"), ("password", password.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::FORBIDDEN,
        "a login post without the form's token"
    );
    assert_eq!(
        login(&s, "admin", "not-the-password").await.err(),
        Some(StatusCode::UNAUTHORIZED)
    );
    assert_eq!(
        login(&s, "nobody", "x").await.err(),
        Some(StatusCode::UNAUTHORIZED)
    );

    // A new session id at every login; logout ends the session.
    let first = login(&s, "admin", &password).await.unwrap();
    let b = login(&s, "admin", &password).await.unwrap();
    assert_ne!(first.session, b.session);
    assert_ne!(first.csrf, b.csrf);
    let r = first.post(&s, "/ui/logout", &[("csrf", &first.csrf)]).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        first.get(&s, "/ui/").await.status(),
        StatusCode::SEE_OTHER,
        "logged out"
    );
    assert_eq!(
        b.get(&s, "/ui/").await.status(),
        StatusCode::OK,
        "the other session lives"
    );
    // The overview's Versions section: the desired version and the rollout state.
    let overview = b.html(&s, "/ui/").await;
    assert!(
        overview.contains(r#"<section id="versions">"#),
        "{overview}"
    );
    assert!(
        overview.contains(&format!(
            "Desired version <strong>{}</strong>",
            edgevirt::version::RELEASE
        )),
        "{overview}"
    );
    assert!(
        overview.contains(r#"id="rollout-state">RolledOver<"#),
        "{overview}"
    );
    // In words first; the install strategy and CPU internals only behind their toggles.
    assert!(
        overview.contains("every node and every running VM's launcher runs it"),
        "{overview}"
    );
    let details = overview.find(r#"<details id="rollout-details">"#).unwrap();
    assert!(overview.find("Install strategy <code>").unwrap() > details);
    let cpu_details = overview.find(r#"<details id="cpu-details">"#).unwrap();
    assert!(overview.find("Family/model/stepping").unwrap() > cpu_details);

    // Every page has a CSP without inline scripts, and no framing.
    let r = b.get(&s, "/ui/vms").await;
    let csp = r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe"),
        "{csp}"
    );
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");

    // An image to boot from (raw bytes; a kernel image is not inspected further).
    let r = s
        .http
        .put(format!("{}/apis/edgevirt.io/v1/images/k/upload", s.url))
        .bearer_auth(&token)
        .header("content-type", "application/octet-stream")
        .body(vec![0x55u8; 4096])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);

    // A form without (or with a wrong) CSRF token is refused and changes nothing.
    let vm_form = [
        ("name", "csrf-test"),
        ("cpus", "1"),
        ("memory", "128Mi"),
        ("kernel", "k"),
        ("network", "none"),
    ];
    let r = b.post(&s, "/ui/vms/new", &vm_form).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let mut wrong = vm_form.to_vec();
    wrong.push(("csrf", "0000"));
    assert_eq!(
        b.post(&s, "/ui/vms/new", &wrong).await.status(),
        StatusCode::FORBIDDEN
    );
    let api = |path: &str| {
        s.http
            .get(format!("{}{path}", s.url))
            .bearer_auth(&token)
            .send()
    };
    let vm_url = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/csrf-test";
    assert_eq!(
        api(vm_url).await.unwrap().status(),
        404,
        "nothing was created"
    );
    // With the token the form goes through (to the API's own checks).
    let mut ok = vm_form.to_vec();
    ok.push(("csrf", &b.csrf));
    let r = b.post(&s, "/ui/vms/new", &ok).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()["location"], "/ui/vms/default/csrf-test");
    assert_eq!(api(vm_url).await.unwrap().status(), 200);

    // Everything wrong with a form is said at once, each next to its field, with what was
    // typed kept; a cause only the API finds (a label value Kubernetes refuses) goes next
    // to its field too.
    let r = b
        .post(
            &s,
            "/ui/vms/new",
            &[
                ("csrf", &b.csrf),
                ("name", "Bad_Name"),
                ("cpus", "0"),
                ("memory", "lots"),
                ("labels", "nolabel"),
                ("kernel", "k"),
            ],
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let page = r.text().await.unwrap();
    for field in ["name", "cpus", "memory", "labels"] {
        assert!(
            page.contains(&format!(
                "<span class=\"field-error\" id=\"{field}-error\">"
            )),
            "{field}: {page}"
        );
        assert!(page.contains(&format!("aria-describedby=\"{field}-error\"")));
    }
    assert!(page.contains("value=\"Bad_Name\"") && page.contains("value=\"lots\""));
    let r = b
        .post(
            &s,
            "/ui/vms/new",
            &[
                ("csrf", &b.csrf),
                ("name", "labelled"),
                ("cpus", "1"),
                ("memory", "128Mi"),
                ("labels", "tier=not a valid value!"),
                ("kernel", "k"),
            ],
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let page = r.text().await.unwrap();
    let err = page
        .split("id=\"labels-error\">")
        .nth(1)
        .unwrap_or_else(|| panic!("no error by the labels field: {page}"));
    assert!(err.contains("not a valid value"), "{err}");
    // The YAML box starts from a VM that works: sent back unchanged, it is created.
    let page = b.html(&s, "/ui/vms/new").await;
    let example = page
        .split("id=\"yaml\" rows=\"24\" class=\"code\" aria-label=\"A VirtualMachine as YAML\">")
        .nth(1)
        .and_then(|t| t.split("</textarea>").next())
        .expect("the YAML box")
        .replace("&#34;", "\"")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&");
    assert!(example.contains("kind: VirtualMachine"), "{example}");
    let r = b
        .post(&s, "/ui/vms/yaml", &[("csrf", &b.csrf), ("yaml", &example)])
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER, "{:?}", r.text().await);
    assert_eq!(r.headers()["location"], "/ui/vms/default/example");
    let r = s
        .http
        .delete(format!(
            "{}/apis/kubevirt.io/v1/namespaces/default/virtualmachines/example",
            s.url
        ))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());

    // Scripts calling the API with the cookie need the X-CSRF-Token header for changes.
    let patch = |csrf: Option<&str>| {
        let mut req = s
            .http
            .patch(format!("{}{vm_url}", s.url))
            .header("cookie", b.cookie())
            .header("content-type", "application/merge-patch+json")
            .body(r#"{"metadata":{"labels":{"patched":"yes"}}}"#);
        if let Some(c) = csrf {
            req = req.header("x-csrf-token", c);
        }
        req.send()
    };
    assert_eq!(patch(None).await.unwrap().status(), 403);
    assert_eq!(patch(Some("wrong")).await.unwrap().status(), 403);
    assert_eq!(patch(Some(&b.csrf)).await.unwrap().status(), 200);
    let r = s
        .http
        .get(format!("{}{vm_url}", s.url))
        .header("cookie", b.cookie())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "reads with the cookie need no token");

    // What users typed is escaped: a refused name echoed in the error, an annotation shown.
    let evil = "<script>alert(1)</script>";
    let mut form = vm_form.to_vec();
    form[0] = ("name", evil);
    form.push(("csrf", &b.csrf));
    let r = b.post(&s, "/ui/vms/new", &form).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let html = r.text().await.unwrap();
    assert!(!html.contains(evil), "raw script in the page");
    assert!(
        escaped(&html, "&{lt}script&{gt}alert(1)&{lt}/script&{gt}"),
        "{html}"
    );
    let r = s
        .http
        .patch(format!("{}{vm_url}", s.url))
        .bearer_auth(&token)
        .header("content-type", "application/merge-patch+json")
        .body(format!(
            r#"{{"metadata":{{"annotations":{{"note":"{evil}"}}}}}}"#
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let html = b.html(&s, "/ui/vms/default/csrf-test").await;
    assert!(
        escaped(&html, "note: &{lt}script&{gt}alert(1)&{lt}/script&{gt}"),
        "{html}"
    );
    assert!(!html.contains(evil));

    // Admins add users; a viewer sees but changes nothing and opens no console.
    let v = b.add_viewer(&s, "vera").await;
    let list = v.get(&s, "/ui/vms").await.text().await.unwrap();
    assert!(list.contains("csrf-test"), "viewers see VMs");
    assert!(
        !list.contains("href=\"/ui/vms/new\""),
        "no New VM link for viewers"
    );
    // Nor the forms themselves: refused before they are filled in, not after Save.
    for path in ["/ui/vms/new", "/ui/vms/default/csrf-test/edit"] {
        let r = v.get(&s, path).await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{path}");
        let body = r.text().await.unwrap();
        assert!(
            body.contains("viewers may not") && !body.contains("<form"),
            "{path}: {body}"
        );
    }
    let r = v
        .post(
            &s,
            "/ui/vms/default/csrf-test/action",
            &[("csrf", &v.csrf), ("action", "delete")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(api(vm_url).await.unwrap().status(), 200, "still there");
    assert_eq!(
        v.get(&s, "/ui/vms/default/csrf-test/console")
            .await
            .status(),
        StatusCode::FORBIDDEN
    );
    let r = s
        .http
        .post(format!("{}/console/tickets", s.url))
        .header("cookie", v.cookie())
        .header("x-csrf-token", &v.csrf)
        .json(&serde_json::json!({"name": "csrf-test", "kind": "vnc"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "viewers get no console ticket");
    assert_eq!(v.get(&s, "/ui/admin").await.status(), StatusCode::FORBIDDEN);
    // A stopped VM has no console for anyone.
    let r = s
        .http
        .post(format!("{}/console/tickets", s.url))
        .bearer_auth(&token)
        .json(&serde_json::json!({"name": "csrf-test", "kind": "vnc"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);

    // Edit the VM's YAML on its page: the change lands; a stale copy is refused (409).
    let page = b.html(&s, "/ui/vms/default/csrf-test/edit").await;
    let start = page.find("<textarea name=\"yaml\"").unwrap();
    let start = start + page[start..].find('>').unwrap() + 1;
    let end = start + page[start..].find("</textarea>").unwrap();
    let yaml = page[start..end]
        .replace("&#34;", "\"")
        .replace("&#39;", "'")
        .replace("&quot;", "\"")
        .replace("&#60;", "<")
        .replace("&#62;", ">")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&#38;", "&")
        .replace("&amp;", "&");
    let edited = yaml
        .replace("patched: 'yes'", "patched: edited")
        .replace("patched: \"yes\"", "patched: edited")
        .replace("patched: yes", "patched: edited");
    assert_ne!(edited, yaml, "the label is in the YAML: {yaml}");
    let r = b
        .post(
            &s,
            "/ui/vms/default/csrf-test/edit",
            &[("csrf", &b.csrf), ("yaml", &edited)],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let vm: serde_json::Value = api(vm_url).await.unwrap().json().await.unwrap();
    assert_eq!(vm["metadata"]["labels"]["patched"], "edited");
    let r = b
        .post(
            &s,
            "/ui/vms/default/csrf-test/edit",
            &[("csrf", &b.csrf), ("yaml", &edited)],
        )
        .await;
    assert_eq!(
        r.status(),
        StatusCode::CONFLICT,
        "saving the same stale copy again"
    );
    // A VM made again under a deleted one's name shows only its own changes, not the old
    // one's (they were matched by name once).
    // History rows: (resourceVersion, who, what) of the VM's own changes.
    let vm_rows = |html: &str| -> Vec<(u64, String, String)> {
        let table = html.split("id=\"history\"").nth(1).unwrap_or_default();
        table
            .split("<tr><td>")
            .skip(1)
            .filter_map(|r| {
                let cells: Vec<&str> = r.split("</td><td>").collect();
                if cells.len() < 4 || cells[2] != "VM" {
                    return None;
                }
                let (what, rest) = cells[3].split_once(" <small")?;
                let rv = rest.split("resourceVersion ").nth(1)?.split(')').next()?;
                Some((rv.parse().ok()?, cells[1].to_string(), what.to_string()))
            })
            .collect()
    };
    let old_page = b.html(&s, "/ui/vms/default/csrf-test").await;
    let old_rows = vm_rows(&old_page);
    assert!(
        old_rows.len() >= 2,
        "the old VM's changes are listed: {old_page}"
    );
    // Who made each change, and what it changed, in words: the edit saved above was the
    // dashboard's admin.
    assert!(
        old_rows
            .iter()
            .any(|(_, who, what)| who == "admin" && what == "metadata.labels.patched: yes → edited"),
        "{old_rows:?}"
    );
    assert_eq!(
        old_rows.last().map(|r| r.2.as_str()),
        Some("created"),
        "{old_rows:?}"
    );
    let last_old = old_rows.iter().map(|r| r.0).max().unwrap();
    let r = s
        .http
        .delete(format!("{}{vm_url}", s.url))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let t = std::time::Instant::now();
    while api(vm_url).await.unwrap().status() != 404 {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "the VM was not deleted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let r = b.post(&s, "/ui/vms/new", &ok).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let new_page = b.html(&s, "/ui/vms/default/csrf-test").await;
    let new_rows = vm_rows(&new_page);
    assert!(!new_rows.is_empty(), "{new_page}");
    assert!(
        new_rows
            .iter()
            .all(|(rv, _, what)| *rv > last_old && what != "deleted"),
        "the new VM lists the old one's changes: {new_rows:?} (old up to {last_old})"
    );

    // Started with no node to run it: the VM page says why it cannot start, in the
    // scheduler's words; memory is in units a reader takes in (128 MiB, not 128Mi).
    let r = s
        .http
        .put(format!(
            "{}/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/csrf-test/start",
            s.url
        ))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let t = std::time::Instant::now();
    let page = loop {
        let page = b
            .get(&s, "/ui/vms/default/csrf-test")
            .await
            .text()
            .await
            .unwrap();
        if page.contains(r#"id="vm-why-not""#) {
            break page;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "no reason shown: {page}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(
        page.contains("Cannot start: 0/0 nodes are available: no node has registered"),
        "{page}"
    );
    assert!(page.contains("<dd>128 MiB</dd>"), "{page}");

    // Paste YAML to create a VM.
    let pasted = "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {name: pasted}\nspec:\n  runStrategy: Halted\n  template:\n    spec:\n      domain:\n        memory: {guest: 64Mi}\n        firmware: {kernelBoot: {container: {image: k, kernelPath: k}}}\n";
    let r = b
        .post(&s, "/ui/vms/yaml", &[("csrf", &b.csrf), ("yaml", pasted)])
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()["location"], "/ui/vms/default/pasted");
    let r = b
        .post(
            &s,
            "/ui/vms/yaml",
            &[("csrf", &b.csrf), ("yaml", "kind: [unclosed")],
        )
        .await;
    assert_eq!(
        r.status(),
        StatusCode::BAD_REQUEST,
        "bad YAML is a 400 with the form kept"
    );
    assert!(r.text().await.unwrap().contains("kind: [unclosed"));

    // Admins make API tokens; the secret is shown once and works.
    let r = b
        .post(
            &s,
            "/ui/admin/tokens",
            &[("csrf", &b.csrf), ("user", "vera"), ("description", "ci")],
        )
        .await;
    assert_eq!(r.status(), 200);
    let html = r.text().await.unwrap();
    let i = html.find("id=\"new-token\">").unwrap() + "id=\"new-token\">".len();
    let secret = &html[i..i + html[i..].find('<').unwrap()];
    let r = s
        .http
        .get(format!("{}{vm_url}", s.url))
        .bearer_auth(secret)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the new viewer token reads");
    let r = s
        .http
        .delete(format!("{}{vm_url}", s.url))
        .bearer_auth(secret)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "and only reads");

    // The admin deletes the VM from its page.
    let r = b
        .post(
            &s,
            "/ui/vms/default/csrf-test/action",
            &[("csrf", &b.csrf), ("action", "delete")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
}

/// Failed logins lock the (user, address) pair out, visibly, without locking the real user
/// out from elsewhere; an administrator sees the lockout and clears it on the Admin page.
#[tokio::test]
async fn failed_logins_lock_out_the_address_until_an_admin_clears_it() {
    let s = start();
    let password = s.initial("password");
    for i in 1..=5 {
        let (code, page) = login_with(&s, &s.http, "admin", "wrong-password")
            .await
            .err()
            .expect("a wrong password is refused");
        assert_eq!(code, StatusCode::UNAUTHORIZED, "try {i}: {page}");
        assert!(page.contains("wrong username or password"), "{page}");
    }
    // Locked now: even the right password is not checked from this address.
    let (code, page) = login_with(&s, &s.http, "admin", &password)
        .await
        .err()
        .expect("a locked-out address is refused");
    assert_eq!(code, StatusCode::TOO_MANY_REQUESTS, "{page}");
    assert!(page.contains("too many failed logins"), "{page}");
    let retry: u64 = page
        .strip_prefix("Retry-After: ")
        .and_then(|p| p.lines().next())
        .and_then(|v| v.parse().ok())
        .expect("a Retry-After header");
    assert!((1..=60).contains(&retry), "{retry}");
    // The real admin, from another address of this machine, is not locked out.
    let elsewhere = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    let admin = login_with(&s, &elsewhere, "admin", &password)
        .await
        .unwrap_or_else(|(c, p)| panic!("admin from 127.0.0.2: {c} {p}"));
    let page = admin.get(&s, "/ui/admin").await.text().await.unwrap();
    assert!(page.contains("Failed logins"), "{page}");
    assert!(
        page.contains("127.0.0.1"),
        "the locked address is listed: {page}"
    );
    let r = admin
        .post(
            &s,
            "/ui/admin/lockouts/clear",
            &[
                ("csrf", admin.csrf.as_str()),
                ("user", "admin"),
                ("address", "127.0.0.1"),
            ],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    login_with(&s, &s.http, "admin", &password)
        .await
        .unwrap_or_else(|(c, p)| panic!("admin after the lockout was cleared: {c} {p}"));
}

#[tokio::test]
async fn assets_are_embedded() {
    let s = start();
    for (path, ct) in [
        ("/ui/static/app.js", "javascript"),
        ("/ui/static/app.css", "text/css"),
        ("/ui/static/favicon.svg", "image/svg+xml"),
        ("/ui/vendor/novnc/core/rfb.js", "javascript"),
        (
            "/ui/vendor/novnc/vendor/pako/lib/zlib/inflate.js",
            "javascript",
        ),
        ("/ui/vendor/xterm/lib/xterm.mjs", "javascript"),
        ("/ui/vendor/xterm/css/xterm.css", "text/css"),
    ] {
        let r = s.http.get(format!("{}{path}", s.url)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let got = r.headers()["content-type"].to_str().unwrap().to_string();
        assert!(got.contains(ct), "{path}: {got}");
        assert!(!r.bytes().await.unwrap().is_empty());
    }
    // Every page names the icon, the login page included.
    let login = s
        .http
        .get(format!("{}/ui/login", s.url))
        .send()
        .await
        .unwrap();
    assert!(
        login
            .text()
            .await
            .unwrap()
            .contains(r#"<link rel="icon" href="/ui/static/favicon.svg""#)
    );
    let r = s
        .http
        .get(format!("{}/ui/vendor/novnc/..%2f..%2fCargo.toml", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn cookies_are_secure_over_tls() {
    let s = start_on("0.0.0.0:0");
    let port = s.url.rsplit(':').next().unwrap().to_string();
    let r = s
        .http
        .get(format!("https://127.0.0.1:{port}/ui/login"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, line) = set_cookie(r.headers(), "edgevirt_prelogin").unwrap();
    assert!(line.contains("Secure"), "{line}");
}

/// A site admin's daily work without the CLI: cordon, uncordon, drain and delete a node from
/// its page; a join token for a new host with the command to run; an image uploaded the way
/// the images page's script sends it (session cookie and CSRF header) and deleted. Viewers
/// see none of the forms and are refused each action; forms without the CSRF token are
/// refused.
#[tokio::test]
async fn nodes_hosts_and_images_from_the_dashboard() {
    let s = start_on("0.0.0.0:0");
    let token = s.initial("token");
    let admin = login(&s, "admin", &s.initial("password")).await.unwrap();
    let api = |method: reqwest::Method, path: &str| {
        s.http
            .request(method, format!("{}{path}", s.url))
            .bearer_auth(&token)
    };
    // A node as an agent registers it (an administrator may write one too).
    let r = api(reqwest::Method::POST, "/apis/edgevirt.io/v1/nodes")
        .json(
            &serde_json::json!({"apiVersion": "edgevirt.io/v1", "kind": "Node",
            "metadata": {"name": "shop-2"}, "spec": {}}),
        )
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{:?}", r.text().await);
    let unschedulable = || async {
        let n: serde_json::Value = api(reqwest::Method::GET, "/apis/edgevirt.io/v1/nodes/shop-2")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        n["spec"]["unschedulable"] == serde_json::json!(true)
    };

    // Its storage as its agent reports it, and a VM's disks: the storage view shows both.
    let r = api(
        reqwest::Method::PATCH,
        "/apis/edgevirt.io/v1/nodes/shop-2/status",
    )
    .header("content-type", "application/merge-patch+json")
    .body(
        serde_json::json!({"status": {"storage": [
                {"name": "local", "path": "/var/lib/edgevirt",
                 "capacityBytes": 10u64 << 30, "freeBytes": 512u64 << 20},
                {"name": "nas", "path": "/mnt/nas",
                 "capacityBytes": 1u64 << 40, "freeBytes": 600u64 << 30}]}})
        .to_string(),
    )
    .send()
    .await
    .unwrap();
    assert!(r.status().is_success(), "{:?}", r.text().await);
    let r = api(
        reqwest::Method::POST,
        "/apis/kubevirt.io/v1/namespaces/default/virtualmachines",
    )
    .json(
        &serde_json::json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "filer"},
        "spec": {"runStrategy": "Halted", "template": {"spec": {
            "domain": {"devices": {}, "memory": {"guest": "64Mi"}},
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "filer-data"}},
                        {"name": "ci", "cloudInitNoCloud": {"userData": "#cloud-config"}}]}}}}),
    )
    .send()
    .await
    .unwrap();
    assert!(r.status().is_success(), "{:?}", r.text().await);
    let storage = admin.html(&s, "/ui/storage").await;
    let places = storage.split("id=\"places\"").nth(1).unwrap();
    assert!(
        places.contains("data folder (local)")
            && places.contains("<td>10 GiB</td>")
            && places.contains("512 MiB (running low)"),
        "{places}"
    );
    assert!(places.contains("shared pool nas") && places.contains("<td>1024 GiB</td>"));
    let vols = storage.split("id=\"vm-volumes\"").nth(1).unwrap();
    assert!(
        vols.contains("default/filer")
            && vols.contains("claim (shared pool)")
            && vols.contains("filer-data"),
        "{vols}"
    );
    assert!(
        !vols.contains("<td>ci</td>"),
        "cloud-init holds no disk data: {vols}"
    );

    let page = admin.html(&s, "/ui/nodes/shop-2").await;
    assert!(page.contains("id=\"node-cordon\"") && page.contains("id=\"node-drain\""));
    assert!(
        page.contains("data-poll=\"/ui/nodes/shop-2/vms\""),
        "{page}"
    );
    let path = "/ui/nodes/shop-2/action";
    // Without the form's CSRF token: refused, nothing changes.
    let r = admin.post(&s, path, &[("action", "cordon")]).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(!unschedulable().await);
    let r = admin
        .post(&s, path, &[("csrf", &admin.csrf), ("action", "cordon")])
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let next = r.headers()["location"].to_str().unwrap().to_string();
    assert!(unschedulable().await, "cordoned through the API");
    let page = admin.html(&s, &next).await;
    assert!(page.contains("shop-2 is cordoned: no new VM starts on it."));
    assert!(page.contains("id=\"node-uncordon\"") && !page.contains("id=\"node-cordon\""));
    let r = admin
        .post(&s, path, &[("csrf", &admin.csrf), ("action", "uncordon")])
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(!unschedulable().await);
    // A drain cordons and reports each VM (none here).
    let r = admin
        .post(
            &s,
            path,
            &[("csrf", &admin.csrf), ("action", "drain"), ("block", "1")],
        )
        .await;
    assert_eq!(r.status(), 200);
    let page = r.text().await.unwrap();
    assert!(page.contains("No running VM was on the node."), "{page}");
    assert!(unschedulable().await, "a drain cordons first");
    let live = admin.html(&s, "/ui/nodes/shop-2/vms").await;
    assert!(live.contains("it is drained"), "{live}");
    let r = admin
        .post(&s, path, &[("csrf", &admin.csrf), ("action", "reboot")])
        .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);

    // A viewer: no actions on the node page, each one refused, no upload form.
    let v = admin.add_viewer(&s, "val").await;
    let page = v.html(&s, "/ui/nodes/shop-2").await;
    assert!(page.contains("Node shop-2") && !page.contains("node-actions"));
    for action in ["cordon", "uncordon", "drain", "delete"] {
        let r = v
            .post(&s, path, &[("csrf", &v.csrf), ("action", action)])
            .await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{action}");
    }
    assert!(unschedulable().await, "still as the admin left it");
    let images = v.html(&s, "/ui/images").await;
    assert!(
        !images.contains("id=\"upload\""),
        "viewers get no upload form"
    );

    // An image, sent as the images page's script sends it.
    let disk = vec![0u8; 1 << 20];
    let upload = |who: &Browser, csrf: Option<&str>| {
        let mut r = s
            .http
            .put(format!("{}/apis/edgevirt.io/v1/images/tiny/upload", s.url))
            .header("cookie", who.cookie())
            .header("content-type", "application/octet-stream")
            .body(disk.clone());
        if let Some(c) = csrf {
            r = r.header("x-csrf-token", c);
        }
        r.send()
    };
    assert_eq!(upload(&admin, None).await.unwrap().status(), 403);
    assert_eq!(upload(&v, Some(&v.csrf)).await.unwrap().status(), 403);
    let r = upload(&admin, Some(&admin.csrf)).await.unwrap();
    assert_eq!(r.status(), 201, "{:?}", r.text().await);
    let images = admin.html(&s, "/ui/images?uploaded=tiny").await;
    assert!(
        images.contains("Image tiny uploaded and checked."),
        "{images}"
    );
    assert!(
        images.contains("<td>tiny</td><td>raw</td><td>1 MiB</td>"),
        "{images}"
    );
    assert!(images.contains("id=\"upload-progress\""));
    // Only names the list shows are confirmed: nothing else is echoed.
    let odd = admin.html(&s, "/ui/images?uploaded=nothere").await;
    assert!(!odd.contains("nothere"));
    let r = v
        .post(&s, "/ui/images/tiny/delete", &[("csrf", &v.csrf)])
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = admin
        .post(&s, "/ui/images/tiny/delete", &[("csrf", &admin.csrf)])
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let images = admin
        .html(&s, r.headers()["location"].to_str().unwrap())
        .await;
    assert!(images.contains("Image tiny deleted.") && images.contains("No image yet"));

    // A join token for a new host: the command to run on it, then the token listed.
    let r = admin
        .post(
            &s,
            "/ui/admin/jointokens",
            &[
                ("csrf", &admin.csrf),
                ("hours", "24"),
                ("description", "back office"),
            ],
        )
        .await;
    assert_eq!(r.status(), 200);
    let page = r.text().await.unwrap();
    let host = s.url.trim_start_matches("https://");
    let cmd = format!("edgevirt serve --role agent --controller https://{host} --join-token ev1.");
    assert!(page.contains(&cmd), "{page}");
    assert!(page.contains("<td>valid</td>") && page.contains("back office"));
    let r = admin
        .post(
            &s,
            "/ui/admin/jointokens",
            &[("csrf", &admin.csrf), ("hours", "9999")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r.text().await.unwrap().contains("1 to 168 hours"));
    let list: serde_json::Value = api(reqwest::Method::GET, "/apis/edgevirt.io/v1/jointokens")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = list["items"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let r = admin
        .post(
            &s,
            &format!("/ui/admin/jointokens/{id}/delete"),
            &[("csrf", &admin.csrf)],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let list: serde_json::Value = api(reqwest::Method::GET, "/apis/edgevirt.io/v1/jointokens")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["items"], serde_json::json!([]));

    // Delete the node: the overview confirms it.
    let r = admin
        .post(&s, path, &[("csrf", &admin.csrf), ("action", "delete")])
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let overview = admin
        .html(&s, r.headers()["location"].to_str().unwrap())
        .await;
    assert!(overview.contains("Node shop-2 deleted"), "{overview}");
    assert_eq!(
        api(reqwest::Method::GET, "/apis/edgevirt.io/v1/nodes/shop-2")
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
}

/// The VM list's polls send only what changed: nothing (304) when nothing did, the one row
/// that changed in place, the whole table when a VM comes or goes or the digest is unknown.
/// Other polled fragments answer 304 to their last ETag.
#[tokio::test]
async fn polls_transfer_only_what_changed() {
    let s = start();
    let token = s.initial("token");
    let b = login(&s, "admin", &s.initial("password")).await.unwrap();
    let r = s
        .http
        .put(format!("{}/apis/edgevirt.io/v1/images/k/upload", s.url))
        .bearer_auth(&token)
        .header("content-type", "application/octet-stream")
        .body(vec![0x55u8; 4096])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let vms = format!(
        "{}/apis/kubevirt.io/v1/namespaces/default/virtualmachines",
        s.url
    );
    let create = |name: &'static str| {
        s.http
            .post(&vms)
            .bearer_auth(&token)
            .json(&serde_json::json!({
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                "metadata": {"name": name},
                "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {
                    "devices": {}, "memory": {"guest": "64Mi"},
                    "firmware": {"kernelBoot": {"container": {"image": "k", "kernelPath": "k"}}}}}}},
            }))
            .send()
    };
    for n in ["p1", "p2", "p3"] {
        assert_eq!(create(n).await.unwrap().status(), 201);
    }
    let poll = |have: Option<String>| {
        let mut r = s
            .http
            .get(format!("{}/ui/vms/rows?q=&label=", s.url))
            .header("cookie", b.cookie());
        if let Some(h) = have {
            r = r.header("x-rows-have", h);
        }
        async move {
            let r = r.send().await.unwrap();
            let mode = r.headers()["x-rows"].to_str().unwrap().to_string();
            let digest = r.headers()["x-rows-digest"].to_str().unwrap().to_string();
            let code = r.status();
            (code, mode, digest, r.text().await.unwrap())
        }
    };
    // The controller settles the new VMs' status first: poll until two answers agree.
    let mut last = poll(None).await;
    let settled = loop {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let now = poll(Some(last.2.clone())).await;
        if now.0 == StatusCode::NOT_MODIFIED {
            break now;
        }
        last = poll(None).await;
    };
    assert_eq!((settled.1.as_str(), settled.3.as_str()), ("same", ""));
    let (code, mode, full_digest, body) = poll(None).await;
    assert_eq!((code, mode.as_str()), (StatusCode::OK, "full"));
    assert_eq!(body.matches("<tr ").count(), 3, "{body}");
    assert_eq!(full_digest, settled.2);

    // One VM changes: only its row comes.
    let r = s
        .http
        .patch(format!("{vms}/p2"))
        .bearer_auth(&token)
        .header("content-type", "application/merge-patch+json")
        .body(r#"{"metadata":{"labels":{"tier":"front"}}}"#)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let (code, mode, d2, body) = poll(Some(full_digest.clone())).await;
    assert_eq!((code, mode.as_str()), (StatusCode::OK, "delta"), "{body}");
    assert_eq!(body.matches("<tr ").count(), 1, "{body}");
    assert!(body.contains("data-key=\"default/p2\"") && body.contains("tier=front"));
    assert_ne!(d2, full_digest);
    // A VM added: the whole table, in order. A digest the server never gave: the same.
    assert_eq!(create("p0").await.unwrap().status(), 201);
    let (_, mode, _, body) = poll(Some(d2)).await;
    assert_eq!(mode, "full");
    assert_eq!(body.matches("<tr ").count(), 4);
    assert!(body.find("default/p0") < body.find("default/p1"), "{body}");
    let (_, mode, _, _) = poll(Some("0123456789abcdef".into())).await;
    assert_eq!(mode, "full");

    // The VM page's status fragment: its ETag back is a 304 with no body.
    let url = format!("{}/ui/vms/default/p1/status", s.url);
    let r = s
        .http
        .get(&url)
        .header("cookie", b.cookie())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let tag = r.headers()["etag"].clone();
    let r = s
        .http
        .get(&url)
        .header("cookie", b.cookie())
        .header("if-none-match", tag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
    assert!(r.text().await.unwrap().is_empty());
}

/// Your own account: sessions listed with the current one marked, a password change (the
/// current password checked; every session ends), log out everywhere; API tokens with an
/// expiry and the time they were last used; a node agent's credential is not revocable
/// from the tokens list.
#[tokio::test]
async fn accounts_passwords_sessions_and_token_lifetimes() {
    let s = start_on("0.0.0.0:0");
    let token = s.initial("token");
    let password = s.initial("password");
    let first = login(&s, "admin", &password).await.unwrap();
    let second = login(&s, "admin", &password).await.unwrap();
    let page = first.html(&s, "/ui/account").await;
    let sessions = page.split("id=\"sessions\"").nth(1).unwrap();
    assert_eq!(sessions.matches("<tr><td>").count(), 2, "{sessions}");
    assert_eq!(sessions.matches("this browser").count(), 1);
    assert!(
        page.contains("href=\"/ui/account\""),
        "the header links the account"
    );

    // Wrong current password, too short, not repeated: refused, nothing changes.
    let change = |b: &Browser, cur: &str, new: &str, again: &str| {
        let form = [
            ("csrf", b.csrf.clone()),
            ("current", cur.to_string()),
            ("new", new.to_string()),
            ("again", again.to_string()),
        ];
        let req = s
            .http
            .post(format!("{}/ui/account/password", s.url))
            .header("cookie", b.cookie())
            .form(&form);
        async move { req.send().await.unwrap() }
    };
    let r = change(&first, "not-it", "a-new-password", "a-new-password").await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("the current password is wrong")
    );
    let r = change(&first, &password, "short", "short").await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let r = change(&first, &password, "a-new-password", "another-one").await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        second.get(&s, "/ui/").await.status(),
        200,
        "still logged in"
    );
    // The change: every session ends, the old password no longer works, the new one does.
    let r = change(&first, &password, "a-new-password", "a-new-password").await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()["location"], "/ui/login?changed=1");
    for b in [&first, &second] {
        assert_eq!(b.get(&s, "/ui/").await.status(), StatusCode::SEE_OTHER);
    }
    let r = s
        .http
        .get(format!("{}/ui/login?changed=1", s.url))
        .send()
        .await
        .unwrap();
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("Your password was changed")
    );
    assert!(login(&s, "admin", &password).await.is_err());
    let a = login(&s, "admin", "a-new-password").await.unwrap();
    let b = login(&s, "admin", "a-new-password").await.unwrap();
    let r = a
        .post(&s, "/ui/account/logout-everywhere", &[("csrf", &a.csrf)])
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    for x in [&a, &b] {
        assert_eq!(x.get(&s, "/ui/").await.status(), StatusCode::SEE_OTHER);
    }

    // An API token that expires in 30 days; "never" used until it is.
    let admin = login(&s, "admin", "a-new-password").await.unwrap();
    let r = admin
        .post(
            &s,
            "/ui/admin/tokens",
            &[
                ("csrf", &admin.csrf),
                ("user", "admin"),
                ("description", "ci"),
                ("days", "30"),
            ],
        )
        .await;
    assert_eq!(r.status(), 200);
    let page = r.text().await.unwrap();
    let secret = page
        .split("id=\"new-token\">")
        .nth(1)
        .and_then(|t| t.split('<').next())
        .unwrap()
        .to_string();
    let row = |page: &str| {
        page.split("<tr>")
            .find(|r| r.contains("<td>ci</td>"))
            .and_then(|r| r.split("</tr>").next())
            .unwrap_or_default()
            .to_string()
    };
    let in30 = (chrono::Utc::now() + chrono::Duration::days(30))
        .format("%Y-%m-%d")
        .to_string();
    let ci = row(&page);
    assert!(
        ci.contains(&format!("<td>{in30}</td><td>never</td>")),
        "{ci}"
    );
    let r = s
        .http
        .get(format!("{}/apis/kubevirt.io/v1/virtualmachines", s.url))
        .bearer_auth(&secret)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let ci = row(&admin.html(&s, "/ui/admin").await);
    assert!(
        !ci.contains("<td>never</td><td>"),
        "last used is recorded: {ci}"
    );
    let r = admin
        .post(
            &s,
            "/ui/admin/tokens",
            &[("csrf", &admin.csrf), ("user", "admin"), ("days", "-1")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);

    // A node agent's credential (a host joined with a join token) is listed but not revoked
    // here, even by a forged form.
    let r = s
        .http
        .post(format!("{}/apis/edgevirt.io/v1/jointokens", s.url))
        .bearer_auth(&token)
        .json(&serde_json::json!({"ttlSeconds": 600}))
        .send()
        .await
        .unwrap();
    let join: serde_json::Value = r.json().await.unwrap();
    let secret = join["token"].as_str().unwrap().split('.').nth(1).unwrap();
    let r = s
        .http
        .post(format!("{}/join", s.url))
        .json(&serde_json::json!({"nodeName": "shop-3", "secret": secret}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{:?}", r.text().await);
    let page = admin.html(&s, "/ui/admin").await;
    let agent = page
        .split("<tr>")
        .find(|r| r.contains("<td>agent</td>"))
        .and_then(|r| r.split("</tr>").next())
        .unwrap_or_else(|| panic!("no agent credential listed: {page}"));
    assert!(agent.contains("revoked by deleting its node") && !agent.contains("<form"));
    let id = agent
        .split("<code>")
        .nth(1)
        .and_then(|t| t.split('<').next())
        .unwrap();
    let r = admin
        .post(
            &s,
            &format!("/ui/admin/tokens/{id}/delete"),
            &[("csrf", &admin.csrf)],
        )
        .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert!(
        admin.html(&s, "/ui/admin").await.contains(id),
        "still there"
    );
}

/// A resumable upload (the images page sends parts with Content-Range): each part goes on
/// where the server's copy ends, a part cut short keeps what arrived, a part from the wrong
/// place is refused with where to go on, and the last part makes the image, whole.
#[tokio::test]
async fn image_uploads_resume_where_they_stopped() {
    use sha2::Digest;
    let s = start();
    let token = s.initial("token");
    let url = format!("{}/apis/edgevirt.io/v1/images/parts/upload", s.url);
    let data: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    let put = |range: String, body: Vec<u8>| {
        s.http
            .put(&url)
            .bearer_auth(&token)
            .header("content-type", "application/octet-stream")
            .header("content-range", range)
            .body(body)
            .send()
    };
    let have = || async {
        let v: serde_json::Value = s
            .http
            .get(&url)
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["receivedBytes"].as_u64().unwrap()
    };
    assert_eq!(have().await, 0);
    let r = put("bytes 0-2047/4096".into(), data[..2048].to_vec())
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(have().await, 2048);
    // From the wrong place: 409, and where to go on.
    let r = put("bytes 0-1023/4096".into(), data[..1024].to_vec())
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(r.headers()["upload-offset"], "2048");
    // Cut short: what came is kept.
    let r = put("bytes 2048-4095/4096".into(), data[2048..3048].to_vec())
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(have().await, 3048);
    // Longer than it says: refused, nothing past the range kept.
    let r = put("bytes 3048-3099/4096".into(), data[3048..3200].to_vec())
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(have().await <= 3100);
    let at = have().await as usize;
    for (range, code) in [
        ("bytes 9-3/4096".to_string(), 400),
        ("items 0-1/2".into(), 400),
        (format!("bytes 0-0/{}", 5u64 << 40), 413),
    ] {
        let r = put(range.clone(), vec![0]).await.unwrap();
        assert_eq!(r.status().as_u16(), code, "{range}");
    }
    let r = put(format!("bytes {at}-4095/4096"), data[at..].to_vec())
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED, "{:?}", r.text().await);
    let img: serde_json::Value = r.json().await.unwrap();
    assert_eq!(img["status"]["sizeBytes"], 4096);
    assert_eq!(
        img["status"]["sha256"],
        hex::encode(sha2::Sha256::digest(&data)),
        "the image is the file, whole"
    );
    assert_eq!(have().await, 0, "nothing partial left");
    assert_eq!(img["status"]["iso"], false, "a disk, not an ISO: {img}");

    // An ISO sent in parts with ?type=iso (as the page does when "An ISO" is ticked): its
    // volume descriptor is checked once all of it is here.
    let iso_url = format!("{}/apis/edgevirt.io/v1/images/cd/upload?type=iso", s.url);
    let put_iso = |range: String, body: Vec<u8>| {
        s.http
            .put(&iso_url)
            .bearer_auth(&token)
            .header("content-type", "application/octet-stream")
            .header("content-range", range)
            .body(body)
            .send()
    };
    let mut cd = vec![0u8; 40 << 10];
    let r = put_iso("bytes 0-40959/40960".into(), cd.clone())
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r.text().await.unwrap().contains("not an ISO"));
    cd[32769..32774].copy_from_slice(b"CD001");
    let r = put_iso("bytes 0-20479/40960".into(), cd[..20480].to_vec())
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = put_iso("bytes 20480-40959/40960".into(), cd[20480..].to_vec())
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let img: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        (&img["status"]["iso"], &img["status"]["format"]),
        (&serde_json::json!(true), &serde_json::json!("raw")),
        "{img}"
    );
}

/// The New VM wizard's install from ISOs, through the real server: the ISO selects list
/// only ISOs, the form makes the VM with its CD drives and blank DataVolume, the VM page's
/// hardware list shows them, and "Remove ISO" takes a CD drive out through the API: only
/// CD drives, only with the form's CSRF token, never for a viewer.
#[tokio::test]
async fn the_wizard_installs_from_isos_and_the_iso_comes_out() {
    let s = start();
    let token = s.initial("token");
    let password = s.initial("password");
    let mut cd = vec![0u8; 40 << 10];
    cd[32769..32774].copy_from_slice(b"CD001");
    for (name, body, query) in [
        ("win11", cd.clone(), "?type=iso"),
        ("virtio-win", cd.clone(), "?type=iso"),
        ("plain-disk", vec![1u8; 4096], ""),
    ] {
        let r = s
            .http
            .put(format!(
                "{}/apis/edgevirt.io/v1/images/{name}/upload{query}",
                s.url
            ))
            .bearer_auth(&token)
            .header("content-type", "application/octet-stream")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED, "{name}");
    }
    let b = login(&s, "admin", &password).await.unwrap();
    let html = b.html(&s, "/ui/vms/new").await;
    let iso_select = &html[html.find("id=\"iso\"").unwrap()..];
    let iso_select = &iso_select[..iso_select.find("</select>").unwrap()];
    assert!(
        iso_select.contains("win11") && !iso_select.contains("plain-disk"),
        "{iso_select}"
    );
    let image_select = &html[html.find("id=\"image\"").unwrap()..];
    let image_select = &image_select[..image_select.find("</select>").unwrap()];
    assert!(
        image_select.contains("plain-disk") && !image_select.contains("win11"),
        "{image_select}"
    );
    // A size that is no size is marked on its field, and nothing is created.
    let mut fields = vec![
        ("csrf", b.csrf.as_str()),
        ("name", "win"),
        ("namespace", "default"),
        ("cpus", "2"),
        ("memory", "4Gi"),
        ("os", "windows"),
        ("iso", "win11"),
        ("drivers_iso", "virtio-win"),
        ("disk_gib", "0"),
        ("network", "nat"),
    ];
    let r = b.post(&s, "/ui/vms/new", &fields).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r.text().await.unwrap().contains("id=\"disk_gib-error\""));
    fields.retain(|(k, _)| *k != "disk_gib");
    fields.push(("disk_gib", "40"));
    let r = b.post(&s, "/ui/vms/new", &fields).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let vm = s
        .api_get(
            &token,
            "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/win",
        )
        .await;
    let t = &vm["spec"]["template"]["spec"];
    assert_eq!(
        vm["spec"]["dataVolumeTemplates"][0]["spec"]["storage"]["resources"]["requests"]["storage"],
        "40Gi"
    );
    assert_eq!(t["domain"]["devices"]["disks"][0]["cdrom"]["bus"], "sata");
    assert_eq!(
        t["domain"]["devices"]["tpm"],
        serde_json::json!({"persistent": true})
    );
    let page = b.html(&s, "/ui/vms/default/win").await;
    for want in [
        "UEFI, Secure Boot",
        "TPM 2.0",
        "CD drive",
        "image virtio-win",
    ] {
        assert!(page.contains(want), "{want} not on the VM page");
    }
    assert_eq!(page.matches("Remove ISO").count(), 2, "one per CD drive");

    // Remove ISO: not without the form's token, not the VM's own disk, not for a viewer.
    let eject = "/ui/vms/default/win/eject";
    let r = b.post(&s, eject, &[("disk", "drivers")]).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = b
        .post(&s, eject, &[("csrf", &b.csrf), ("disk", "rootdisk")])
        .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let v = b.add_viewer(&s, "vic").await;
    assert!(
        !v.html(&s, "/ui/vms/default/win")
            .await
            .contains("Remove ISO")
    );
    let r = v
        .post(&s, eject, &[("csrf", &v.csrf), ("disk", "drivers")])
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = b
        .post(&s, eject, &[("csrf", &b.csrf), ("disk", "drivers")])
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let page = b.html(&s, "/ui/vms/default/win?done=eject").await;
    assert!(page.contains("The CD drive was taken out of win"));
    assert_eq!(page.matches("Remove ISO").count(), 1, "the installer stays");
    assert!(!page.contains("image virtio-win"));

    // Grow the disk from the hardware list: its DataVolume's size through the API, which
    // refuses a smaller one; only the VM's own DataVolumes, only for operators.
    assert!(
        page.contains("DataVolume win-rootdisk, 40 GiB"),
        "the disk's size"
    );
    assert!(page.contains("name=\"gib\" type=\"number\" min=\"41\""));
    let grow = "/ui/vms/default/win/grow";
    let r = b
        .post(
            &s,
            grow,
            &[
                ("csrf", &b.csrf),
                ("datavolume", "win-rootdisk"),
                ("gib", "48"),
            ],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let dv = s
        .api_get(
            &token,
            "/apis/cdi.kubevirt.io/v1beta1/namespaces/default/datavolumes/win-rootdisk",
        )
        .await;
    assert_eq!(
        dv["spec"]["storage"]["resources"]["requests"]["storage"],
        "48Gi"
    );
    let page = b.html(&s, "/ui/vms/default/win?done=grow").await;
    assert!(page.contains("The disk of win grows") && page.contains("48 GiB"));
    for (form, code) in [
        (
            [
                ("csrf", b.csrf.as_str()),
                ("datavolume", "win-rootdisk"),
                ("gib", "20"),
            ],
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            [
                ("csrf", b.csrf.as_str()),
                ("datavolume", "win-rootdisk"),
                ("gib", "lots"),
            ],
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            [
                ("csrf", b.csrf.as_str()),
                ("datavolume", "other"),
                ("gib", "60"),
            ],
            StatusCode::CONFLICT,
        ),
        (
            [
                ("csrf", v.csrf.as_str()),
                ("datavolume", "win-rootdisk"),
                ("gib", "60"),
            ],
            StatusCode::FORBIDDEN,
        ),
    ] {
        let who = if form[0].1 == v.csrf { &v } else { &b };
        let r = who.post(&s, grow, &form).await;
        assert_eq!(r.status(), code, "{form:?}");
        if code == StatusCode::UNPROCESSABLE_ENTITY && form[2].1 == "20" {
            assert!(r.text().await.unwrap().contains("can only grow"));
        }
    }
    assert!(
        !v.html(&s, "/ui/vms/default/win")
            .await
            .contains("name=\"gib\"")
    );
}

/// A VM's snapshots from its page: Take snapshot makes one (listed with its state and how
/// it was taken), Restore puts the VM back through a VirtualMachineRestore (StopTarget),
/// Delete removes it. Viewers get no buttons and a 403; a form naming another VM's snapshot
/// gets a 404; a form without its token a 403.
#[tokio::test]
async fn snapshots_from_the_vm_page() {
    let s = start();
    let token = s.initial("token");
    let password = s.initial("password");
    let snaps = "/apis/snapshot.kubevirt.io/v1beta1/namespaces/default/virtualmachinesnapshots";
    halted_vms(&s, &token, &["snappy", "other"]).await;
    let b = login(&s, "admin", &password).await.unwrap();
    let page = "/ui/vms/default/snappy";
    assert!(b.html(&s, page).await.contains("No snapshots."));
    let r = b.post(&s, &format!("{page}/snapshot"), &[]).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN, "no form token");
    let r = b
        .post(&s, &format!("{page}/snapshot"), &[("csrf", &b.csrf)])
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    // A VM with no persistent disk: its spec is the whole snapshot, ready at once.
    let name = {
        let mut found = None;
        for _ in 0..100 {
            let list = s.api_get(&token, snaps).await;
            found = list["items"]
                .as_array()
                .and_then(|l| l.iter().find(|i| i["status"]["readyToUse"] == true))
                .map(|i| i["metadata"]["name"].as_str().unwrap().to_string());
            if found.is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        found.expect("a ready snapshot")
    };
    assert!(name.starts_with("snappy-"), "{name}");
    let html = b.html(&s, page).await;
    let table = &html[html.find("id=\"snapshots\"").unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    assert!(
        table.contains(&name) && table.contains("Ready") && table.contains("VM stopped"),
        "{table}"
    );
    // Not another VM's snapshot, and not for a viewer.
    let r = b
        .post(
            &s,
            "/ui/vms/default/other/restore",
            &[("csrf", &b.csrf), ("snapshot", &name)],
        )
        .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let v = b.add_viewer(&s, "val").await;
    let vhtml = v.html(&s, page).await;
    assert!(vhtml.contains(&name) && !vhtml.contains("Take snapshot"));
    let r = v
        .post(
            &s,
            &format!("{page}/deletesnapshot"),
            &[("csrf", &v.csrf), ("snapshot", &name)],
        )
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // Restore: a VirtualMachineRestore with StopTarget, which completes.
    let r = b
        .post(
            &s,
            &format!("{page}/restore"),
            &[("csrf", &b.csrf), ("snapshot", &name)],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let restores = "/apis/snapshot.kubevirt.io/v1beta1/namespaces/default/virtualmachinerestores";
    let mut complete = false;
    for _ in 0..100 {
        let list = s.api_get(&token, restores).await;
        let r = &list["items"][0];
        assert_eq!(r["spec"]["targetReadinessPolicy"], "StopTarget", "{list}");
        assert_eq!(r["spec"]["virtualMachineSnapshotName"], name.as_str());
        if r["status"]["complete"] == true {
            complete = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(complete, "the restore did not complete");
    // Delete.
    let r = b
        .post(
            &s,
            &format!("{page}/deletesnapshot"),
            &[("csrf", &b.csrf), ("snapshot", &name)],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let list = s.api_get(&token, snaps).await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(0), "{list}");
    assert!(b.html(&s, page).await.contains("No snapshots."));
}

/// The VM page's Backups section: "Back up now" makes a VirtualMachineBackup through the
/// API (here the VM has no persistent disk, so it fails at once and the row says why),
/// Delete removes it; a form without its token, a viewer, and another VM's backup are
/// refused.
#[tokio::test]
async fn backups_from_the_vm_page() {
    let s = start();
    let token = s.initial("token");
    let password = s.initial("password");
    let backups = "/apis/backup.kubevirt.io/v1alpha1/namespaces/default/virtualmachinebackups";
    halted_vms(&s, &token, &["backed", "other"]).await;
    let b = login(&s, "admin", &password).await.unwrap();
    let page = "/ui/vms/default/backed";
    let html = b.html(&s, page).await;
    assert!(html.contains("No backups."), "{html}");
    assert!(
        html.contains("No node mounts a backup target"),
        "without a target the page says how to declare one"
    );
    let r = b
        .post(&s, &format!("{page}/backup"), &[("target", "nas")])
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN, "no form token");
    let r = b
        .post(
            &s,
            &format!("{page}/backup"),
            &[("csrf", &b.csrf), ("target", "nas")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let mut name = None;
    for _ in 0..100 {
        let list = s.api_get(&token, backups).await;
        let item = &list["items"][0];
        assert_eq!(item["spec"]["pvcName"], "nas", "{list}");
        assert_eq!(item["spec"]["source"]["name"], "backed", "{list}");
        if item["status"]["conditions"]
            .as_array()
            .is_some_and(|l| l.iter().any(|c| c["type"] == "Failure"))
        {
            name = item["metadata"]["name"].as_str().map(str::to_string);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let name = name.expect("the backup ends");
    let html = b.html(&s, page).await;
    let table = &html[html.find("id=\"backups\"").unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    assert!(
        table.contains(&name)
            && table.contains("Failed: ")
            && table.contains("no persistent volumes"),
        "{table}"
    );
    // Not another VM's backup, and not for a viewer.
    let r = b
        .post(
            &s,
            "/ui/vms/default/other/deletebackup",
            &[("csrf", &b.csrf), ("backup", &name)],
        )
        .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    for action in ["verifybackup", "restorebackup"] {
        let r = b
            .post(
                &s,
                &format!("/ui/vms/default/other/{action}"),
                &[("csrf", &b.csrf), ("backup", &name), ("as", "x")],
            )
            .await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{action}");
        // A failed backup has nothing to verify or restore, and the page says so.
        let r = b
            .post(
                &s,
                &format!("{page}/{action}"),
                &[("csrf", &b.csrf), ("backup", &name), ("as", "backed2")],
            )
            .await;
        assert_eq!(r.status(), StatusCode::CONFLICT, "{action}");
        assert!(r.text().await.unwrap().contains("has not completed"));
    }
    assert!(
        !table.contains("Restore as new VM"),
        "no restore button for a failed backup: {table}"
    );
    let list = s
        .api_get(
            &token,
            "/apis/kubevirt.io/v1/namespaces/default/virtualmachines",
        )
        .await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(2), "{list}");
    // The Backups page lists it with its VM.
    let site = b.html(&s, "/ui/backups").await;
    let all = &site[site.find("id=\"all-backups\"").unwrap()..];
    assert!(
        all.contains(&name) && all.contains("default/backed"),
        "{all}"
    );
    let v = b.add_viewer(&s, "vera").await;
    let vhtml = v.html(&s, page).await;
    assert!(vhtml.contains(&name) && !vhtml.contains("Back up now"));
    let r = v
        .post(
            &s,
            &format!("{page}/deletebackup"),
            &[("csrf", &v.csrf), ("backup", &name)],
        )
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // Delete.
    let r = b
        .post(
            &s,
            &format!("{page}/deletebackup"),
            &[("csrf", &b.csrf), ("backup", &name)],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let list = s.api_get(&token, backups).await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(0), "{list}");
    assert!(b.html(&s, page).await.contains("No backups."));
}

#[tokio::test]
async fn backup_schedules_and_targets_on_the_backups_page() {
    let s = start();
    let token = s.initial("token");
    let password = s.initial("password");
    let uri = "/apis/edgevirt.io/v1/namespaces/default/backupschedules";
    let b = login(&s, "admin", &password).await.unwrap();
    let html = b.html(&s, "/ui/backups").await;
    assert!(html.contains("No node mounts a backup target"), "{html}");
    assert!(html.contains("No schedule.") && html.contains("id=\"new-schedule\""));
    let form = |name: &'static str, every: &'static str, last: &'static str| {
        vec![
            ("name", name),
            ("namespace", "default"),
            ("target", "nas"),
            ("vms", "web, db"),
            ("every", every),
            ("keep_last", last),
            ("keep_daily", "7"),
            ("keep_weekly", ""),
            ("keep_monthly", "6"),
        ]
    };
    let post = |path: &'static str, f: Vec<(&'static str, &'static str)>| {
        let (b, s) = (&b, &s);
        async move {
            let mut all: Vec<(&str, &str)> = f;
            all.push(("csrf", b.csrf.as_str()));
            b.post(s, path, &all).await
        }
    };
    // Bad input: a duration that is none, a count that is none; nothing is made.
    let r = post("/ui/backups/schedules", form("nightly", "soon", "3")).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r.text().await.unwrap().contains("soon"));
    let r = post("/ui/backups/schedules", form("nightly", "24h", "-1")).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let r = post("/ui/backups/schedules", form("../x", "24h", "3")).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let list = s.api_get(&token, uri).await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(0), "{list}");
    // A schedule from the form.
    let r = post("/ui/backups/schedules", form("nightly", "24h", "3")).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let sched = s.api_get(&token, &format!("{uri}/nightly")).await;
    assert_eq!(
        sched["spec"]["vms"],
        serde_json::json!(["web", "db"]),
        "{sched}"
    );
    assert_eq!(sched["spec"]["target"], "nas");
    assert_eq!(sched["spec"]["keep"]["last"], 3);
    assert_eq!(sched["spec"]["keep"]["daily"], 7);
    assert_eq!(sched["spec"]["keep"]["monthly"], 6);
    let html = b.html(&s, "/ui/backups").await;
    let table = &html[html.find("id=\"schedules\"").unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    assert!(
        table.contains("default/nightly")
            && table.contains("last 3, daily 7, monthly 6")
            && table.contains("web, db")
            && table.contains("Suspend"),
        "{table}"
    );
    // Suspend, resume; a viewer sees the schedule but can change nothing.
    let r = post(
        "/ui/backups/schedules/default/nightly/suspend",
        vec![("suspend", "true")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let sched = s.api_get(&token, &format!("{uri}/nightly")).await;
    assert_eq!(sched["spec"]["suspend"], true, "{sched}");
    assert!(b.html(&s, "/ui/backups").await.contains("(suspended)"));
    let r = post(
        "/ui/backups/schedules/default/nightly/suspend",
        vec![("suspend", "maybe")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let v = b.add_viewer(&s, "vera").await;
    let vhtml = v.html(&s, "/ui/backups").await;
    assert!(vhtml.contains("default/nightly") && !vhtml.contains("id=\"new-schedule\""));
    let r = v
        .post(
            &s,
            "/ui/backups/schedules/default/nightly/delete",
            &[("csrf", &v.csrf)],
        )
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // Delete; a schedule that is not there is 404.
    let r = post("/ui/backups/schedules/default/nightly/delete", vec![]).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let r = post("/ui/backups/schedules/default/nightly/delete", vec![]).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let list = s.api_get(&token, uri).await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(0), "{list}");
}

/// An image `k` and a stopped VM booting from it for each name.
async fn halted_vms(s: &Server, token: &str, names: &[&str]) {
    let r = s
        .http
        .put(format!("{}/apis/edgevirt.io/v1/images/k/upload", s.url))
        .bearer_auth(token)
        .header("content-type", "application/octet-stream")
        .body(vec![7u8; 4096])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    for vm in names {
        let r = s
            .http
            .post(format!(
                "{}/apis/kubevirt.io/v1/namespaces/default/virtualmachines",
                s.url
            ))
            .bearer_auth(token)
            .json(&testkit::Vm::halted(vm, "k").json())
            .send()
            .await
            .unwrap();
        let code = r.status();
        assert_eq!(
            code,
            StatusCode::CREATED,
            "{vm}: {}",
            r.text().await.unwrap()
        );
    }
}
