//! The dashboard in a real browser: Debian's headless chromium, driven over WebDriver
//! (chromedriver) against the real server with a real guest. Log in, create a VM from the
//! form, watch it reach Running on the list page without a reload, see its screen in the
//! noVNC console (non-blank canvas pixels) and a prompt in the serial console, see the VM's
//! and its node's graphs drawn from real samples, stop it, delete it, and find all of that
//! on the activity page. Screenshots go to `target/test-artifacts/` (or $EDGEVIRT_ARTIFACTS).
//! Needs root, libvirtd, the test guest, chromium and chromedriver (`#[ignore]`).

use std::time::Duration;

use fantoccini::{Client, Locator};
use serde_json::json;
use testkit::*;

#[path = "common/chromium.rs"]
mod chromium;
use chromium::*;

const BOOT: Duration = Duration::from_secs(120);

/// axe-core's serious and critical violations on the current page, one line each.
async fn axe_violations(c: &Client) -> Vec<String> {
    let axe = std::fs::read_to_string(repo_root().join("web/node_modules/axe-core/axe.min.js"))
        .expect("axe-core in web/node_modules (npm ci in web/, which the build runs)");
    c.execute(&axe, vec![]).await.unwrap();
    let v = c
        .execute_async(
            r#"const done = arguments[arguments.length - 1];
            axe.run(document, {resultTypes: ['violations']})
              .then(r => done(r.violations
                .filter(v => v.impact === 'serious' || v.impact === 'critical')
                .map(v => v.impact + ' ' + v.id + ': ' + v.help + ' at ' +
                     v.nodes.slice(0, 3).map(n => n.target.join(' ')).join(', '))))
              .catch(e => done(['axe failed: ' + e]));"#,
            vec![],
        )
        .await
        .unwrap();
    serde_json::from_value(v).unwrap()
}

/// The VM page's visible actions (button values, `console` for the console links), sorted.
async fn visible_actions(c: &Client) -> Vec<String> {
    let v = c
        .execute(
            r#"const els = document.querySelectorAll('#actions button[name=action], main [data-action]');
            return [...new Set([...els].filter(e => !e.hidden && e.offsetParent !== null)
                .map(e => e.value || e.dataset.action))].sort();"#,
            vec![],
        )
        .await
        .unwrap();
    serde_json::from_value(v).unwrap()
}

/// Wait (a few polls) until the VM page offers exactly `want` (sorted).
async fn wait_actions(c: &Client, want: &[&str]) {
    let t = std::time::Instant::now();
    loop {
        let got = visible_actions(c).await;
        if got == want {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the VM page offers {got:?}, not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
#[ignore = "needs root, libvirtd, the test guest and chromium: run scripts/test.sh"]
async fn dashboard_in_chromium_from_login_to_delete() {
    // Node figures every second: the graphs have samples within seconds.
    // A fixed port: the server is restarted at the end, and the open page must find it again.
    let listen = format!("127.0.0.1:{}", free_port());
    let mut a = Appliance::start(&["--stats-interval", "1", "--listen", &listen]).await;
    a.import_guest().await;
    let password = std::fs::read_to_string(a.dir.join("initial-admin"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("password="))
        .unwrap()
        .to_string();
    let d = start_browser(&[]).await;
    let c = &d.client;

    // --- Log in: the dashboard sends us to the login page first.
    c.goto(&format!("{}/ui/", a.url)).await.unwrap();
    let url = c.current_url().await.unwrap();
    assert_eq!(url.path(), "/ui/login", "{url}");
    let login_problems = axe_violations(c).await;
    assert!(
        login_problems.is_empty(),
        "the login page: {login_problems:?}"
    );
    type_into(c, "username", "admin").await;
    type_into(c, "password", "wrong-password").await;
    click(c, "login").await;
    let err = wait_text(
        c,
        "#error",
        "the login error",
        Duration::from_secs(10),
        |_| true,
    )
    .await;
    assert!(err.contains("wrong username or password"), "{err}");
    type_into(c, "password", &password).await;
    click(c, "login").await;
    let h1 = wait_text(c, "h1", "the overview", Duration::from_secs(10), |t| {
        t == "Overview"
    })
    .await;
    assert_eq!(h1, "Overview");
    let node_row = wait_text(
        c,
        "table tbody tr",
        "the node row",
        Duration::from_secs(10),
        |t| t.contains("testnode"),
    )
    .await;
    assert!(
        node_row.contains("Ready") && node_row.contains("qemu"),
        "{node_row}"
    );
    shot(c, "01-overview").await;

    // --- Every `pattern` on the forms compiles as Chromium compiles it (the `v` flag: an
    // invalid one is silently ignored, so nothing was checked before sending), and a bad
    // name is flagged in the browser.
    for (page, field, bad, good) in [
        ("/ui/vms/new", "name", "Bad_Name", "good-name-1"),
        ("/ui/vms/new", "memory", "lots", "1.5Gi"),
        ("/ui/admin", "name", "-bad", "ops.user_1"),
    ] {
        c.goto(&format!("{}{page}", a.url)).await.unwrap();
        let got = c
            .execute(
                r#"const [field, bad, good] = arguments;
                const broken = [];
                for (const el of document.querySelectorAll('[pattern]')) {
                    try { new RegExp(el.pattern, 'v'); } catch (e) { broken.push(el.name + ': ' + e.message); }
                }
                const n = document.querySelector('input[name="' + field + '"][pattern]');
                n.value = bad; const flagged = !n.checkValidity();
                n.value = good; const accepted = n.checkValidity();
                n.value = '';
                return {broken, flagged, accepted};"#,
                vec![json!(field), json!(bad), json!(good)],
            )
            .await
            .unwrap();
        assert_eq!(got["broken"], json!([]), "{page}: {got}");
        assert_eq!(
            got["flagged"], true,
            "{page}: {bad} passes the browser's check: {got}"
        );
        assert_eq!(got["accepted"], true, "{page}: {good} is refused: {got}");
    }

    // --- Create a VM from the form: the test guest, booted from its kernel and initrd.
    c.goto(&format!("{}/ui/vms/new", a.url)).await.unwrap();
    type_into(c, "name", "browser").await;
    let mem = c.find(Locator::Id("memory")).await.unwrap();
    mem.clear().await.unwrap();
    mem.send_keys("192Mi").await.unwrap();
    c.find(Locator::Css("details summary"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.find(Locator::Id("kernel"))
        .await
        .unwrap()
        .select_by_value("test-kernel")
        .await
        .unwrap();
    c.find(Locator::Id("initrd"))
        .await
        .unwrap()
        .select_by_value("test-initrd")
        .await
        .unwrap();
    type_into(c, "kernel_args", "console=ttyS0 edgevirt.hostname=browser").await;
    shot(c, "02-new-vm-form").await;
    click(c, "create").await;
    wait_text(c, "h1", "the VM's page", Duration::from_secs(10), |t| {
        t == "default/browser"
    })
    .await;

    // --- The list page turns Running by itself (polling, no reload).
    c.goto(&format!("{}/ui/vms", a.url)).await.unwrap();
    let marker: bool = c
        .execute("window.__noReload = true; return true;", vec![])
        .await
        .unwrap()
        .as_bool()
        .unwrap();
    assert!(marker);
    wait_text(
        c,
        "tr[data-key='default/browser'] [data-field='status']",
        "Running on the list page",
        BOOT,
        |t| t == "Running",
    )
    .await;
    let ip = wait_text(
        c,
        "tr[data-key='default/browser'] [data-field='ip']",
        "an IP on the list page",
        BOOT,
        |t| t.starts_with(NAT_PREFIX),
    )
    .await;
    println!("list page: browser is Running at {ip}");
    let same_page = c
        .execute("return window.__noReload === true;", vec![])
        .await
        .unwrap();
    assert_eq!(
        same_page,
        json!(true),
        "the status changed without a page reload"
    );
    shot(c, "03-vm-list-running").await;

    // --- The console: noVNC draws the guest's screen.
    c.goto(&format!("{}/ui/vms/default/browser/console", a.url))
        .await
        .unwrap();
    wait_text(
        c,
        "#state",
        "the console to connect",
        Duration::from_secs(30),
        |t| t.starts_with("Connected"),
    )
    .await;
    let count = r#"
        const c = document.querySelector('#screen canvas');
        if (!c || !c.width) return [0, 0, 0];
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let i = 0; i < d.length; i += 4) if (d[i] > 16 || d[i+1] > 16 || d[i+2] > 16) n++;
        return [c.width, c.height, n];
    "#;
    let px = wait_for("non-blank pixels on the console canvas", BOOT, || async {
        let v = c.execute(count, vec![]).await.ok()?;
        let lit = v[2].as_u64()?;
        (lit > 100).then_some(v)
    })
    .await;
    println!("console canvas {}x{}: {} lit pixels", px[0], px[1], px[2]);
    let state = text_of(c, "#state").await.unwrap();
    assert!(state.contains("you have control"), "{state}");
    shot(c, "04-console").await;

    // --- The serial console: a prompt with the guest's name.
    let input = open_serial(c, &a.url, "browser").await;
    input
        .send_keys("echo from-the-browser-$((6*7))\n")
        .await
        .unwrap();
    wait_for(
        "the guest's answer in the terminal",
        Duration::from_secs(30),
        || async {
            terminal_text(c)
                .await
                .filter(|t| t.contains("from-the-browser-42") && t.contains("browser:"))
        },
    )
    .await;
    // Log root in there: the VM page lists who is logged in (from the guest agent).
    input.send_keys("login -f root\n").await.unwrap();
    shot(c, "05-serial").await;
    // The terminal fills its box and stays inside it, on a wide window and on a phone.
    const TERMINAL_FIT: &str = r#"const box = document.getElementById('terminal').getBoundingClientRect();
        const screen = document.querySelector('#terminal .xterm-screen').getBoundingClientRect();
        return {box: box.width, screen: screen.width, vw: document.documentElement.clientWidth,
                page: document.documentElement.scrollWidth};"#;
    let wide = c.execute(TERMINAL_FIT, vec![]).await.unwrap();
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap();
    assert!(
        f(&wide, "screen") <= f(&wide, "box") && f(&wide, "screen") > f(&wide, "box") * 0.8,
        "the terminal does not fill its box: {wide}"
    );
    c.set_window_size(390, 844).await.unwrap();
    let narrow = wait_for(
        "the terminal resized to a phone",
        Duration::from_secs(10),
        || async {
            let v = c.execute(TERMINAL_FIT, vec![]).await.ok()?;
            (f(&v, "screen") <= f(&v, "box") && f(&v, "page") <= f(&v, "vw")).then_some(v)
        },
    )
    .await;
    println!("serial console: {wide} wide, {narrow} on a phone");
    shot(c, "05a-serial-phone").await;
    c.set_window_size(1280, 960).await.unwrap();

    // --- The VM page names the user logged in on the serial console.
    c.goto(&format!("{}/ui/vms/default/browser", a.url))
        .await
        .unwrap();
    wait_text(c, "#vm-users", "root logged in on the VM page", BOOT, |t| {
        t == "root"
    })
    .await;

    // --- Graphs of the VM and of its node, drawn from real samples.
    for (page, name) in [
        ("/ui/vms/default/browser", "08-vm-graphs"),
        ("/ui/nodes/testnode", "09-node-graphs"),
    ] {
        c.goto(&format!("{}{page}", a.url)).await.unwrap();
        for chart in ["cpu", "memory", "net"] {
            let drawn = wait_for(
                &format!("{page}: the {chart} chart drawn"),
                BOOT,
                || async {
                    let v = c.execute(CHART_PIXELS, vec![json!(chart)]).await.ok()?;
                    let (samples, colored) = (v[0].as_u64()?, v[1].as_u64()?);
                    // Reloaded every 15 s: reload sooner while the first samples come in.
                    if samples == 0 {
                        c.refresh().await.ok()?;
                    }
                    (samples > 0 && colored > 10).then_some(v)
                },
            )
            .await;
            println!(
                "{page}: {chart} chart: {} samples, {} series pixels",
                drawn[0], drawn[1]
            );
        }
        shot(c, name).await;
    }

    // --- Accessibility: axe-core (pinned in web/package.json) finds nothing serious or
    // critical on any page, with the VM running.
    let mut problems = Vec::new();
    for page in [
        "/ui/",
        "/ui/vms",
        "/ui/vms/default/browser",
        "/ui/vms/default/browser/console",
        "/ui/vms/default/browser/serial",
        "/ui/vms/default/browser/edit",
        "/ui/vms/new",
        "/ui/networks",
        "/ui/activity",
        "/ui/nodes/testnode",
        "/ui/images",
        "/ui/storage",
        "/ui/backups",
        "/ui/account",
        "/ui/admin",
    ] {
        c.goto(&format!("{}{page}", a.url)).await.unwrap();
        for v in axe_violations(c).await {
            problems.push(format!("{page}: {v}"));
        }
    }
    assert!(
        problems.is_empty(),
        "accessibility:\n{}",
        problems.join("\n")
    );

    // --- The action buttons are exactly those the state allows, and follow it: Running,
    // then Paused, then Running again.
    c.goto(&format!("{}/ui/vms/default/browser", a.url))
        .await
        .unwrap();
    const RUNNING: &[&str] = &[
        "console",
        "delete",
        "pause",
        "restart",
        "softreboot",
        "stop",
    ];
    wait_actions(c, RUNNING).await;
    click(c, "action-pause").await;
    // The page after the action confirms it (wait_text waits for the navigation).
    wait_text(
        c,
        ".notice",
        "the pause confirmed",
        Duration::from_secs(10),
        |t| t == "Pause of browser accepted; the status below follows it.",
    )
    .await;
    wait_text(c, "#vm-status", "Paused on the VM page", BOOT, |t| {
        t == "Paused"
    })
    .await;
    wait_actions(c, &["console", "delete", "restart", "stop", "unpause"]).await;
    shot(c, "05b-paused").await;
    click(c, "action-unpause").await;
    wait_text(c, "#vm-status", "Running again", BOOT, |t| t == "Running").await;
    wait_actions(c, RUNNING).await;

    // --- Stop (a confirmation dialog, accepted), then delete.
    click(c, "action-stop").await;
    wait_text(c, "#vm-status", "Stopped on the VM page", BOOT, |t| {
        t == "Stopped"
    })
    .await;
    wait_actions(c, &["delete", "start"]).await;
    shot(c, "06-stopped").await;
    click(c, "action-delete").await;
    wait_text(
        c,
        "h1",
        "the VM list after delete",
        Duration::from_secs(10),
        |t| t == "Virtual machines",
    )
    .await;
    wait_text(
        c,
        ".notice",
        "the delete confirmed",
        Duration::from_secs(10),
        |t| t.starts_with("Delete of default/browser accepted"),
    )
    .await;
    wait_for("the VM to be gone", BOOT, || async {
        a.vm("browser").await.is_none().then_some(())
    })
    .await;
    c.goto(&format!("{}/ui/vms", a.url)).await.unwrap();
    let body = text_of(c, "#vms tbody").await.unwrap();
    assert!(!body.contains("browser"), "{body}");
    shot(c, "07-deleted").await;
    assert!(a.our_domains().is_empty(), "the domain is gone too");

    // --- An image uploaded from the images page: the progress bar runs to its end, the
    // server checks the image, and the list shows it.
    let upload = tempfile::Builder::new()
        .prefix("evtest-upload-")
        .suffix(".img")
        .tempfile_in("/var/tmp")
        .unwrap();
    upload.as_file().set_len(48 << 20).unwrap();
    // A first part already on the server (an upload cut off earlier): the page resumes
    // after it.
    let r = reqwest::Client::new()
        .put(format!(
            "{}/apis/edgevirt.io/v1/images/uploaded-disk/upload",
            a.url
        ))
        .bearer_auth(&a.token)
        .header("content-type", "application/octet-stream")
        .header(
            "content-range",
            format!("bytes 0-{}/{}", (16 << 20) - 1, 48 << 20),
        )
        .body(vec![0u8; 16 << 20])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    c.goto(&format!("{}/ui/images", a.url)).await.unwrap();
    // Every state the bar and its text show is kept in sessionStorage: the page moves on to
    // the list when the upload is done.
    c.execute(
        r#"sessionStorage.removeItem('seen');
        const s = document.getElementById('upload-status');
        const bar = document.getElementById('upload-progress');
        new MutationObserver(() => {
            const seen = JSON.parse(sessionStorage.getItem('seen') || '[]');
            seen.push(bar.value + ' ' + s.textContent);
            sessionStorage.setItem('seen', JSON.stringify(seen));
        }).observe(s, {childList: true, characterData: true, subtree: true});"#,
        vec![],
    )
    .await
    .unwrap();
    type_into(c, "upload-file", upload.path().to_str().unwrap()).await;
    let name = c.find(Locator::Id("upload-name")).await.unwrap();
    let suggested = name.prop("value").await.unwrap().unwrap_or_default();
    assert!(
        suggested.starts_with("evtest-upload-") && !suggested.contains('.'),
        "a name from the file's: {suggested:?}"
    );
    name.clear().await.unwrap();
    name.send_keys("uploaded-disk").await.unwrap();
    click(c, "upload-start").await;
    wait_text(
        c,
        ".notice",
        "the upload confirmed",
        Duration::from_secs(60),
        |t| t == "Image uploaded-disk uploaded and checked.",
    )
    .await;
    let seen: Vec<String> = serde_json::from_value(
        c.execute(
            "return JSON.parse(sessionStorage.getItem('seen') || '[]');",
            vec![],
        )
        .await
        .unwrap(),
    )
    .unwrap();
    println!("upload progress: {seen:?}");
    assert!(
        seen.iter().any(|s| s.contains("MiB of 48.0 MiB")),
        "the bar counted the bytes: {seen:?}"
    );
    assert!(
        seen.iter()
            .any(|s| s.ends_with("Resuming at 16.0 MiB of 48.0 MiB")),
        "the upload resumed after the server's part: {seen:?}"
    );
    assert!(
        seen.iter()
            .any(|s| s.starts_with("100 Sent; the server is checking")),
        "the bar ran to its end: {seen:?}"
    );
    let rows = text_of(c, "#images tbody").await.unwrap();
    assert!(
        rows.contains("uploaded-disk") && rows.contains("raw") && rows.contains("48 MiB"),
        "{rows}"
    );
    shot(c, "07b-image-uploaded").await;
    // The storage view: the node's own data folder as its agent measured it.
    c.goto(&format!("{}/ui/storage", a.url)).await.unwrap();
    let places = text_of(c, "#places tbody").await.unwrap();
    assert!(
        places.contains("testnode")
            && places.contains("data folder (local)")
            && places.contains("GiB"),
        "{places}"
    );
    shot(c, "07c-storage").await;

    // --- The activity page lists what this test did, newest first, and filters by VM.
    c.goto(&format!("{}/ui/activity?vm=default%2Fbrowser", a.url))
        .await
        .unwrap();
    let rows = wait_text(c, "#activity tbody", "the VM's activity", BOOT, |t| {
        t.contains("SuccessfulDelete")
    })
    .await;
    for want in [
        "SuccessfulCreate",
        "Scheduled",
        "Started",
        "ShuttingDown",
        "Stopped",
        "SuccessfulDelete",
    ] {
        assert!(rows.contains(want), "no {want} in the activity:\n{rows}");
    }
    // Newest first: the stop comes before the start.
    assert!(rows.find("Stopped") < rows.find("Started"), "{rows}");
    shot(c, "10-activity").await;
    c.goto(&format!("{}/ui/activity?node=nosuchnode", a.url))
        .await
        .unwrap();
    let none = text_of(c, "#activity tbody").await.unwrap();
    assert!(none.contains("Nothing happened yet"), "{none}");

    // --- A phone (390 x 844): no page is wider than the screen, and the header still shows
    // the user and Log out. Tables scroll inside their own box.
    c.set_window_size(390, 844).await.unwrap();
    for (page, shot_name) in [
        ("/ui/", "12-phone-overview"),
        ("/ui/vms", "13-phone-vms"),
        ("/ui/vms/new", "14-phone-new-vm"),
        ("/ui/networks", "15-phone-networks"),
        ("/ui/activity", "16-phone-activity"),
        ("/ui/nodes/testnode", "17-phone-node"),
        ("/ui/admin", "18-phone-admin"),
        ("/ui/images", "19-phone-images"),
        ("/ui/account", "20-phone-account"),
        ("/ui/storage", "21-phone-storage"),
        ("/ui/backups", "21a-phone-backups"),
    ] {
        c.goto(&format!("{}{page}", a.url)).await.unwrap();
        let m = c
            .execute(
                r#"const vw = document.documentElement.clientWidth;
                const inside = (e) => { if (!e) return false; const r = e.getBoundingClientRect();
                    return r.width > 0 && r.left >= 0 && r.right <= vw; };
                return {vw, page: document.documentElement.scrollWidth,
                    who: inside(document.querySelector('header .who')),
                    logout: inside(document.querySelector('header form button'))};"#,
                vec![],
            )
            .await
            .unwrap();
        shot(c, shot_name).await;
        assert!(
            m["page"].as_u64() <= m["vw"].as_u64() && m["vw"].as_u64() <= Some(390),
            "{page} is wider than the screen: {m}"
        );
        assert_eq!(
            (m["who"].clone(), m["logout"].clone()),
            (json!(true), json!(true)),
            "{page}: the user or Log out is off screen: {m}"
        );
    }
    c.set_window_size(1280, 960).await.unwrap();

    // --- A VM made again under the deleted one's name: its page shows only its own
    // history (when, who, what), none of the old VM's.
    let (code, v) = a
        .post_yaml(VMS, &Vm::guest("browser").run_strategy("Halted").yaml())
        .await;
    assert_eq!(code, 201, "{v}");
    c.goto(&format!("{}/ui/vms/default/browser", a.url))
        .await
        .unwrap();
    let history = wait_text(c, "#history tbody", "the new VM's history", BOOT, |t| {
        t.contains("status Stopped")
    })
    .await;
    println!("the new VM's history:\n{history}");
    assert!(
        !history.contains("deleted") && !history.contains("Running") && history.contains("created"),
        "the old VM's history shows: {history}"
    );
    assert!(history.contains("admin"), "who created it: {history}");

    // --- A viewer (added on the admin page) is offered no form it could not submit: no
    // New VM link, no actions or Edit on the VM page, and the create form itself refused.
    c.goto(&format!("{}/ui/admin", a.url)).await.unwrap();
    for (id, text) in [
        ("new-user-name", "vic"),
        ("new-user-password", "viewer-pass"),
    ] {
        c.find(Locator::Id(id))
            .await
            .unwrap()
            .send_keys(text)
            .await
            .unwrap();
    }
    click(c, "add-user").await;
    wait_text(
        c,
        ".notice",
        "the user added",
        Duration::from_secs(10),
        |t| t == "User vic created.",
    )
    .await;
    c.find(Locator::Css("header form button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(c, "h1", "the login page", Duration::from_secs(10), |t| {
        t == "edgevirt"
    })
    .await;
    log_in(c, &a.url, "vic", "viewer-pass").await;
    let viewer_sees = r#"return {newVm: !!document.querySelector('a[href="/ui/vms/new"]'),
        actions: !!document.getElementById('actions'), migrate: !!document.getElementById('migrate'),
        edit: !!document.querySelector('a[href$="/edit"]'), forms: document.querySelectorAll('main form').length};"#;
    c.goto(&format!("{}/ui/vms/default/browser", a.url))
        .await
        .unwrap();
    let seen = c.execute(viewer_sees, vec![]).await.unwrap();
    assert_eq!(
        seen,
        json!({"newVm": false, "actions": false, "migrate": false, "edit": false, "forms": 0}),
        "the viewer's VM page"
    );
    c.goto(&format!("{}/ui/vms/new", a.url)).await.unwrap();
    let h1 = text_of(c, "h1").await.unwrap();
    let seen = c.execute(viewer_sees, vec![]).await.unwrap();
    assert_eq!((h1.as_str(), &seen["forms"]), ("403", &json!(0)), "{seen}");
    shot(c, "11a-viewer-refused").await;
    a.delete(&format!("{VMS}/browser")).await;

    // --- A list page open while the server stops: the stale banner shows within two polling
    // intervals (2 s each) and clears once the server answers again; the time of the last
    // refresh is on the page.
    c.goto(&format!("{}/ui/vms", a.url)).await.unwrap();
    wait_text(
        c,
        "#refreshed",
        "the time of the last refresh",
        Duration::from_secs(10),
        |t| t.starts_with("Updated "),
    )
    .await;
    let visible = |id: &'static str| {
        let c = c.clone();
        async move {
            c.execute(
                "const e = document.getElementById(arguments[0]); return !!e && !e.hidden;",
                vec![json!(id)],
            )
            .await
            .unwrap()
                == json!(true)
        }
    };
    assert!(
        !visible("stale").await,
        "no banner while the server answers"
    );
    a.stop();
    let t = std::time::Instant::now();
    while !visible("stale").await {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "no stale banner 5 s after the server stopped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("stale banner after {:?}", t.elapsed());
    let banner = text_of(c, "#stale").await.unwrap();
    assert!(banner.contains("may be stale"), "{banner}");
    shot(c, "11-stale").await;
    a.spawn().await;
    wait_for("the banner to clear", Duration::from_secs(20), || async {
        (!visible("stale").await).then_some(())
    })
    .await;
    d.client.clone().close().await.unwrap();
}

/// A chart's drawn samples (its figure's `data-samples`) and the coloured pixels of its
/// canvas (the series' lines and points; axes, grid and text are grey).
const CHART_PIXELS: &str = r#"
    const fig = document.querySelector('figure[data-chart="' + arguments[0] + '"]');
    const canvas = fig && fig.querySelector('canvas');
    if (!canvas || !canvas.width) return [0, 0];
    const d = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4) {
        const hi = Math.max(d[i], d[i + 1], d[i + 2]), lo = Math.min(d[i], d[i + 1], d[i + 2]);
        if (d[i + 3] > 128 && hi - lo > 60) n++;
    }
    return [Number(fig.dataset.samples || 0), n];
"#;

/// An OS install from the dashboard, as a Proxmox user does it: the installer ISO uploaded
/// on the images page (marked as an ISO, with the progress bar), the New VM wizard's
/// "install from an ISO" onto a 2 GiB disk, the serial console showing the guest the ISO
/// booted (its hostname, `isoboot`), the hardware list with the CD drive, and "Remove ISO",
/// after which a restart boots without it.
#[tokio::test]
#[ignore = "needs root, libvirtd, the test guest and chromium: run scripts/test.sh"]
async fn iso_install_from_the_wizard() {
    let iso = guest_dir().join("installer.iso");
    assert!(
        iso.exists(),
        "tests/guest/build-iso.sh builds {}",
        iso.display()
    );
    let a = Appliance::start(&[]).await;
    let password = serve::initial_admin(&a.dir, "password");
    let d = start_browser(&[]).await;
    let c = &d.client;
    log_in(c, &a.url, "admin", &password).await;

    // --- The ISO, uploaded from the images page and marked as one.
    c.goto(&format!("{}/ui/images", a.url)).await.unwrap();
    type_into(c, "upload-file", iso.to_str().unwrap()).await;
    let name = c.find(Locator::Id("upload-name")).await.unwrap();
    name.clear().await.unwrap();
    name.send_keys("installer").await.unwrap();
    c.find(Locator::Id("upload-iso"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    click(c, "upload-start").await;
    wait_text(
        c,
        ".notice",
        "the ISO upload confirmed",
        Duration::from_secs(120),
        |t| t == "Image installer uploaded and checked.",
    )
    .await;
    let row = wait_text(
        c,
        "#images tbody tr",
        "the ISO listed",
        Duration::from_secs(5),
        |t| t.contains("installer"),
    )
    .await;
    assert!(row.contains("ISO"), "listed as an ISO: {row}");
    let (_, img) = a.get("/apis/edgevirt.io/v1/images/installer").await;
    assert_eq!(img["status"]["iso"], true, "{img}");

    // --- The wizard: install from the ISO onto a blank 2 GiB disk.
    c.goto(&format!("{}/ui/vms/new", a.url)).await.unwrap();
    type_into(c, "name", "isovm").await;
    c.find(Locator::Id("iso"))
        .await
        .unwrap()
        .select_by_value("installer")
        .await
        .unwrap();
    let size = c.find(Locator::Id("disk_gib")).await.unwrap();
    size.clear().await.unwrap();
    size.send_keys("2").await.unwrap();
    shot(c, "20-wizard-iso").await;
    click(c, "create").await;
    wait_text(c, "h1", "the VM's page", Duration::from_secs(10), |t| {
        t == "default/isovm"
    })
    .await;
    let disks = text_of(c, "#disks").await.unwrap();
    assert!(
        disks.contains("CD drive")
            && disks.contains("image installer")
            && disks.contains("DataVolume isovm-rootdisk"),
        "{disks}"
    );
    let vmi = a.wait_running("isovm", None, BOOT).await;

    // --- The serial console shows the guest the ISO booted.
    let input = open_serial(c, &a.url, "isovm").await;
    wait_for("the ISO's guest in the terminal", BOOT, || async {
        input.send_keys("uname -n\n").await.ok()?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        terminal_text(c).await.filter(|t| t.contains("isoboot:"))
    })
    .await;
    shot(c, "21-iso-serial").await;

    // --- A disk added from the hardware list reaches the running guest, and goes again.
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    c.goto(&format!("{}/ui/vms/default/isovm", a.url))
        .await
        .unwrap();
    let gib = c
        .find(Locator::Css("#add-disk input[name=gib]"))
        .await
        .unwrap();
    gib.clear().await.unwrap();
    gib.send_keys("1").await.unwrap();
    press(
        c,
        "#add-disk button",
        "the added disk confirmed",
        "A new disk was added to isovm",
    )
    .await;
    let disks = text_of(c, "#disks").await.unwrap();
    assert!(disks.contains("DataVolume isovm-disk-1"), "{disks}");
    wait_for("the guest to see the added 1 GiB disk", BOOT, || async {
        guest_exec(&dom, "/bin/cat", &["/sys/block/sda/size"]).filter(|s| s.trim() == "2097152")
    })
    .await;
    shot(c, "21b-disk-added").await;
    press(
        c,
        "#disks form[action$='/detach'] button",
        "the detach confirmed",
        "The disk was taken out of isovm",
    )
    .await;
    wait_for("the disk to leave the guest", BOOT, || async {
        guest_exec(&dom, "/bin/sh", &["-c", "ls /sys/block"]).filter(|s| !s.contains("sda"))
    })
    .await;

    // --- The install is done: take the ISO out, restart, and the CD drive is gone.
    c.goto(&format!("{}/ui/vms/default/isovm", a.url))
        .await
        .unwrap();
    press(
        c,
        "#disks button",
        "the ISO removal confirmed",
        "The CD drive was taken out of isovm",
    )
    .await;
    let disks = text_of(c, "#disks").await.unwrap();
    assert!(
        !disks.contains("CD drive") && disks.contains("DataVolume isovm-rootdisk"),
        "{disks}"
    );
    shot(c, "22-iso-removed").await;
    let vm = a.vm("isovm").await.unwrap();
    assert_eq!(
        vm["spec"]["template"]["spec"]["volumes"],
        json!([{"name": "rootdisk", "dataVolume": {"name": "isovm-rootdisk"}}])
    );
    assert_eq!(a.action("isovm", "restart").await, 202);
    let old = vmi["metadata"]["uid"].as_str().unwrap();
    let vmi = a.wait_running("isovm", Some(old), BOOT).await;
    let (_, xml) = virsh(&["dumpxml", vmi["status"]["domainName"].as_str().unwrap()]);
    assert!(!xml.contains("device='cdrom'"), "{xml}");
    a.delete(&format!("{VMS}/isovm")).await;
}

/// Click the button at `css` and wait for the page's notice to start with `notice`.
async fn press(c: &fantoccini::Client, css: &str, what: &str, notice: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(c, ".notice", what, Duration::from_secs(10), |t| {
        t.starts_with(notice)
    })
    .await;
}
