//! Headless chromium driven over WebDriver (Debian's chromium and chromium-driver), shared
//! by the browser tests (`#[path]`-included: each test crate gets its own copy).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use testkit::*;

pub struct Driver {
    child: Child,
    _profile: tempfile::TempDir,
    pub client: Client,
}

impl Drop for Driver {
    /// chromedriver runs in its own process group with the chromium it starts: end them all,
    /// whether the test passed or panicked.
    fn drop(&mut self) {
        let pgid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// chromedriver and a headless chromium session; `extra` adds chromium flags.
pub async fn start_browser(extra: &[&str]) -> Driver {
    let port = free_port();
    use std::os::unix::process::CommandExt;
    let child = Command::new("/usr/bin/chromedriver")
        .arg(format!("--port={port}"))
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting chromedriver (Debian package chromium-driver)");
    let profile = tempfile::tempdir().unwrap();
    let mut caps = json!({
        "browserName": "chrome",
        "unhandledPromptBehavior": "accept",
        "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1280,960",
                format!("--user-data-dir={}", profile.path().display()),
            ],
        },
    });
    for a in extra {
        caps["goog:chromeOptions"]["args"]
            .as_array_mut()
            .unwrap()
            .push(json!(a));
    }
    let caps = caps.as_object().unwrap().clone();
    let url = format!("http://127.0.0.1:{port}");
    let mut last = String::new();
    for _ in 0..100 {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(caps.clone())
            .connect(&url)
            .await
        {
            Ok(client) => {
                return Driver {
                    child,
                    _profile: profile,
                    client,
                };
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("chromedriver did not start a session: {last}");
}

pub fn artifacts() -> PathBuf {
    let dir = std::env::var_os("EDGEVIRT_ARTIFACTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub async fn shot(c: &Client, name: &str) {
    let png = c.screenshot().await.unwrap();
    let path = artifacts().join(format!("{name}.png"));
    std::fs::write(&path, png).unwrap();
    println!("screenshot: {}", path.display());
}

pub async fn text_of(c: &Client, css: &str) -> Option<String> {
    match c.find(Locator::Css(css)).await {
        Ok(e) => e.text().await.ok(),
        Err(_) => None,
    }
}

/// Poll the page until the element's text satisfies `ok` (the page updates itself).
pub async fn wait_text(
    c: &Client,
    css: &str,
    what: &str,
    timeout: Duration,
    ok: impl Fn(&str) -> bool,
) -> String {
    wait_for(what, timeout, || async {
        text_of(c, css).await.filter(|t| ok(t))
    })
    .await
}

/// Click the element with this id.
pub async fn click(c: &Client, id: &str) {
    c.find(Locator::Id(id))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

/// Type `text` into the element with this id.
pub async fn type_into(c: &Client, id: &str, text: &str) {
    c.find(Locator::Id(id))
        .await
        .unwrap()
        .send_keys(text)
        .await
        .unwrap();
}

/// On the login page at `url`: log in as `user` and wait for the overview.
pub async fn log_in(c: &Client, url: &str, user: &str, password: &str) {
    c.goto(&format!("{url}/ui/login")).await.unwrap();
    type_into(c, "username", user).await;
    type_into(c, "password", password).await;
    click(c, "login").await;
    wait_text(c, "h1", "the overview", Duration::from_secs(20), |t| {
        t == "Overview"
    })
    .await;
}

/// Open the serial console of `default/vm` and wait until it is connected; its keyboard.
pub async fn open_serial(c: &Client, url: &str, vm: &str) -> fantoccini::elements::Element {
    c.goto(&format!("{url}/ui/vms/default/{vm}/serial"))
        .await
        .unwrap();
    wait_text(
        c,
        "#state",
        "the serial console to connect",
        Duration::from_secs(30),
        |t| t.starts_with("Connected"),
    )
    .await;
    c.find(Locator::Css(".xterm-helper-textarea"))
        .await
        .unwrap()
}

/// What the serial console's terminal shows.
pub async fn terminal_text(c: &Client) -> Option<String> {
    c.execute(
        "return document.querySelector('.xterm-rows').textContent;",
        vec![],
    )
    .await
    .ok()?
    .as_str()
    .map(str::to_string)
}
