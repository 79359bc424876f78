//! Consoles end to end: RFB through edgevirt's websocket to a real guest's VNC display, the
//! serial console, and every way a console request must be refused before it reaches QEMU.
//! Needs root, libvirtd and the test guest (`#[ignore]`; scripts/test.sh runs them).

use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use testkit::*;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const BOOT: Duration = Duration::from_secs(120);

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn ticket(a: &Appliance, token: &str, name: &str, kind: &str) -> (u16, Value) {
    let r = a
        .http
        .post(format!("{}/console/tickets", a.url))
        .bearer_auth(token)
        .json(&json!({"namespace": "default", "name": name, "kind": kind}))
        .send()
        .await
        .unwrap();
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(Value::Null))
}

/// Open the websocket at `path`; Err(HTTP status) when refused.
async fn open(a: &Appliance, path: &str, origin: Option<&str>) -> Result<Ws, u16> {
    let url = format!("{}{}", a.url.replacen("http", "ws", 1), path);
    let mut req = url.into_client_request().unwrap();
    if let Some(o) = origin {
        req.headers_mut().insert("origin", o.parse().unwrap());
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
        Err(e) => panic!("websocket to {path}: {e}"),
    }
}

/// A byte stream over websocket binary messages, for the RFB client below.
struct Stream {
    ws: Ws,
    buf: Vec<u8>,
}

impl Stream {
    async fn read(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            let m = tokio::time::timeout(Duration::from_secs(30), self.ws.next())
                .await
                .expect("no data from the VNC server within 30 s")
                .expect("the websocket closed")
                .expect("websocket error");
            if let Message::Binary(b) = m {
                self.buf.extend_from_slice(&b);
            }
        }
        self.buf.drain(..n).collect()
    }
    async fn write(&mut self, b: &[u8]) {
        self.ws
            .send(Message::Binary(b.to_vec().into()))
            .await
            .unwrap();
    }
}

fn be16(b: &[u8]) -> usize {
    u16::from_be_bytes([b[0], b[1]]) as usize
}

/// RFB 3.8 handshake with security None; returns (width, height, bits per pixel, name).
async fn rfb_handshake(s: &mut Stream) -> (usize, usize, usize, String) {
    let version = s.read(12).await;
    assert!(version.starts_with(b"RFB 003.00"), "{version:?}");
    s.write(b"RFB 003.008\n").await;
    let n = s.read(1).await[0] as usize;
    assert!(n > 0, "the server offered no security type");
    let types = s.read(n).await;
    assert!(types.contains(&1), "security None offered: {types:?}");
    s.write(&[1]).await;
    assert_eq!(s.read(4).await, [0, 0, 0, 0], "SecurityResult OK");
    s.write(&[1]).await; // ClientInit, shared
    let init = s.read(24).await;
    let (w, h, bpp) = (be16(&init[0..2]), be16(&init[2..4]), init[4] as usize);
    let name_len = u32::from_be_bytes([init[20], init[21], init[22], init[23]]) as usize;
    let name = String::from_utf8_lossy(&s.read(name_len).await).into_owned();
    (w, h, bpp, name)
}

/// Ask for the whole screen in Raw encoding; count pixels that are not black.
async fn lit_pixels(s: &mut Stream, w: usize, h: usize, bpp: usize) -> usize {
    let mut req = vec![3u8, 0, 0, 0, 0, 0];
    req.extend_from_slice(&(w as u16).to_be_bytes());
    req.extend_from_slice(&(h as u16).to_be_bytes());
    s.write(&req).await;
    loop {
        let head = s.read(1).await;
        match head[0] {
            0 => break,
            2 => continue, // Bell
            3 => {
                let l = s.read(7).await;
                let n = u32::from_be_bytes([l[3], l[4], l[5], l[6]]) as usize;
                s.read(n).await;
            }
            t => panic!("unexpected server message {t}"),
        }
    }
    let hdr = s.read(3).await;
    let rects = be16(&hdr[1..3]);
    let mut lit = 0;
    for _ in 0..rects {
        let r = s.read(12).await;
        let (rw, rh) = (be16(&r[4..6]), be16(&r[6..8]));
        let enc = i32::from_be_bytes([r[8], r[9], r[10], r[11]]);
        match enc {
            0 => {
                let px = s.read(rw * rh * bpp / 8).await;
                lit += px
                    .chunks(bpp / 8)
                    .filter(|p| p.iter().any(|&b| b != 0))
                    .count();
            }
            -223 => {} // DesktopSize pseudo-rectangle
            other => panic!("asked for Raw only, got encoding {other}"),
        }
    }
    lit
}

/// The display size QEMU renders, read independently of edgevirt: a `virsh screenshot`.
fn screenshot_size(dom: &str, dir: &std::path::Path) -> (usize, usize) {
    let file = dir.join("shot.ppm");
    let (ok, out) = virsh(&["screenshot", dom, file.to_str().unwrap()]);
    assert!(ok, "virsh screenshot: {out}");
    let data = std::fs::read(&file).unwrap();
    if data.starts_with(b"\x89PNG") {
        // IHDR: width and height, big-endian, at bytes 16 and 20
        let be32 = |at: usize| u32::from_be_bytes(data[at..at + 4].try_into().unwrap()) as usize;
        return (be32(16), be32(20));
    }
    let text = String::from_utf8_lossy(&data[..64.min(data.len())]).into_owned();
    let mut it = text.split_whitespace();
    assert_eq!(it.next(), Some("P6"), "a PPM or PNG screenshot");
    let w = it.next().unwrap().parse().unwrap();
    let h = it.next().unwrap().parse().unwrap();
    (w, h)
}

fn vnc_clients(dom: &str) -> usize {
    let (ok, out) = virsh(&["qemu-monitor-command", dom, "--hmp", "info vnc"]);
    assert!(ok, "info vnc: {out}");
    out.matches("Client:").count()
}

/// KubeVirt's `userlist` and `filesystemlist`: log root in on the serial console, write a
/// file to the root filesystem (on the guest's disk), and find both in what the guest agent
/// reports.
async fn guest_details(a: &Appliance, ws: &mut Ws) {
    let sub = |what: &str| {
        format!(
            "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/con/{what}"
        )
    };
    ws.send(Message::Binary(
        b"head -c 3000000 /dev/urandom > /root/fill && sync\nlogin -f root\n"
            .to_vec()
            .into(),
    ))
    .await
    .unwrap();
    let users = wait_for("root in the userlist", BOOT, || async {
        let (code, v) = a.get(&sub("userlist")).await;
        (code == 200 && v["items"].as_array().is_some_and(|i| !i.is_empty())).then_some(v)
    })
    .await;
    assert_eq!(users["kind"], "VirtualMachineInstanceGuestOSUserList");
    let root = &users["items"][0];
    assert_eq!(root["userName"], "root", "{users}");
    let login = root["loginTime"].as_f64().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (now - login).abs() < 600.0,
        "logged in at {login}, now {now}"
    );
    let fs = wait_for(
        "the root filesystem in the filesystemlist",
        BOOT,
        || async {
            let (code, v) = a.get(&sub("filesystemlist")).await;
            let items = v["items"].as_array()?.clone();
            let disk = items.into_iter().find(|f| f["mountPoint"] == "/")?;
            (code == 200 && disk["usedBytes"].as_u64()? >= 3_000_000).then_some(disk)
        },
    )
    .await;
    assert_eq!(fs["diskName"], "vda", "{fs}");
    assert_eq!(fs["fileSystemType"], "ext2", "{fs}");
    let total = fs["totalBytes"].as_u64().unwrap();
    assert!((50 << 20..=64 << 20).contains(&total), "{fs}");
    // And in /metrics, with KubeVirt's names.
    let text = a
        .http
        .get(format!("{}/metrics", a.url))
        .bearer_auth(&a.token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let capacity = text
        .lines()
        .find(|l| {
            l.starts_with("kubevirt_vmi_filesystem_capacity_bytes{")
                && l.contains(r#"mount_point="/""#)
                && l.contains(r#"name="con""#)
        })
        .unwrap_or_else(|| panic!("no filesystem capacity in the scrape"));
    assert!(capacity.ends_with(&format!(" {total}")), "{capacity}");
    // Without a guest agent the lists are refused in words, as guestosinfo is.
    let (code, v) = a
        .get("/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/nosuch/userlist")
        .await;
    assert_eq!(code, 404, "{v}");
}

#[tokio::test]
#[ignore = "needs root, libvirtd and the test guest: run scripts/test.sh"]
async fn rfb_and_serial_through_the_websocket_and_every_refusal() {
    let a = Appliance::start(&["--console-ticket-ttl", "3"]).await;
    a.import_guest().await;
    // A blank disk too, which the guest makes its root filesystem at boot (the test guest's
    // `edgevirt.diskroot`): an initramfs root is no block device, which the guest agent's
    // filesystem list leaves out, as it would on a real guest.
    let con = Vm::guest("con").disk_root("root", json!({"emptyDisk": {"capacity": "64Mi"}}));
    let (code, v) = a.post_yaml(VMS, &con.yaml()).await;
    assert_eq!(code, 201, "{v}");
    let vmi = a.wait_running("con", None, BOOT).await;
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    // The display changes mode while the guest boots (firmware 640x480, then the kernel's
    // 720x400 text console): wait for the end of the boot (its guest agent answers), so
    // that ServerInit and the screenshot below see the same mode.
    wait_for("the guest agent", BOOT, || async { guest_uptime(&dom) }).await;

    // --- RFB through the websocket: handshake, ServerInit with the real size, pixels.
    let (code, t) = ticket(&a, &a.token, "con", "vnc").await;
    assert_eq!(code, 201, "{t}");
    let ws = open(&a, t["path"].as_str().unwrap(), None).await.unwrap();
    let mut s = Stream { ws, buf: vec![] };
    let (w, h, bpp, name) = rfb_handshake(&mut s).await;
    assert!(w > 0 && h > 0 && bpp >= 8, "{w}x{h}x{bpp}");
    assert_eq!(
        (w, h),
        screenshot_size(&dom, &a.dir),
        "ServerInit vs virsh screenshot"
    );
    println!("ServerInit: {w}x{h}, {bpp} bpp, name {name:?}");
    s.write(&[2, 0, 0, 1, 0, 0, 0, 0]).await; // SetEncodings: Raw only
    // The guest writes a banner to the VGA console; wait until the screen shows it.
    let start = Instant::now();
    let lit = loop {
        let lit = lit_pixels(&mut s, w, h, bpp).await;
        if lit > 100 || start.elapsed() > BOOT {
            break lit;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        lit > 100,
        "the guest's screen stayed blank ({lit} lit pixels)"
    );
    println!("FramebufferUpdate: {lit} of {} pixels lit", w * h);

    // --- Several viewers: the first holds control, the second watches; control passes.
    let (_, t2) = ticket(&a, &a.token, "con", "vnc").await;
    let ws2 = open(&a, t2["path"].as_str().unwrap(), None).await.unwrap();
    let mut s2 = Stream {
        ws: ws2,
        buf: vec![],
    };
    let (w2, h2, _, _) = rfb_handshake(&mut s2).await;
    assert_eq!((w2, h2), (w, h), "the second viewer sees the same screen");
    // shared flag forced: the first viewer is still connected and served
    assert!(lit_pixels(&mut s, w, h, bpp).await > 100);
    assert_eq!(vnc_clients(&dom), 2, "both viewers are connected to QEMU");
    let (code, st) = a.get("/console/state/default/con").await;
    assert_eq!(code, 200, "{st}");
    let control: Vec<(u64, bool)> = st["viewers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["connection"].as_u64().unwrap(),
                v["control"].as_bool().unwrap(),
            )
        })
        .collect();
    let c1 = t["connection"].as_u64().unwrap();
    let c2 = t2["connection"].as_u64().unwrap();
    assert_eq!(control, vec![(c1, true), (c2, false)]);
    let r = a
        .http
        .post(format!("{}/console/control/default/con", a.url))
        .bearer_auth(&a.token)
        .json(&json!({"connection": c2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let (_, st) = a.get("/console/state/default/con").await;
    assert_eq!(st["viewers"][0]["control"], false);
    assert_eq!(st["viewers"][1]["control"], true);
    drop(s);
    drop(s2);
    wait_for(
        "the viewers to disconnect",
        Duration::from_secs(10),
        || async { (vnc_clients(&dom) == 0).then_some(()) },
    )
    .await;

    // --- Refusals, all before the VM's socket is opened.
    let base = "/console/ws/vnc/default/con";
    assert_eq!(open(&a, base, None).await.err(), Some(401), "no ticket");
    assert_eq!(
        open(&a, &format!("{base}?ticket=0123456789abcdef"), None)
            .await
            .err(),
        Some(401),
        "a made-up ticket"
    );
    // used once, then refused
    let (_, t) = ticket(&a, &a.token, "con", "vnc").await;
    let path = t["path"].as_str().unwrap().to_string();
    let ws = open(&a, &path, None).await.expect("first use");
    drop(ws);
    assert_eq!(
        open(&a, &path, None).await.err(),
        Some(401),
        "a reused ticket"
    );
    // for another VM (and another console kind)
    let (_, t) = ticket(&a, &a.token, "con", "vnc").await;
    let secret = t["ticket"].as_str().unwrap();
    assert_eq!(
        open(
            &a,
            &format!("/console/ws/vnc/default/other?ticket={secret}"),
            None
        )
        .await
        .err(),
        Some(403),
        "a ticket for another VM"
    );
    let (_, t) = ticket(&a, &a.token, "con", "vnc").await;
    let secret = t["ticket"].as_str().unwrap();
    assert_eq!(
        open(
            &a,
            &format!("/console/ws/serial/default/con?ticket={secret}"),
            None
        )
        .await
        .err(),
        Some(403),
        "a VNC ticket for the serial console"
    );
    // from a page of another site
    let (_, t) = ticket(&a, &a.token, "con", "vnc").await;
    assert_eq!(
        open(
            &a,
            t["path"].as_str().unwrap(),
            Some("https://evil.example")
        )
        .await
        .err(),
        Some(403),
        "a foreign Origin"
    );
    // expired
    let (_, t) = ticket(&a, &a.token, "con", "vnc").await;
    let expires = t["expiresInSeconds"].as_u64().unwrap();
    tokio::time::sleep(Duration::from_secs(expires + 1)).await;
    assert_eq!(
        open(&a, t["path"].as_str().unwrap(), None).await.err(),
        Some(401),
        "an expired ticket"
    );
    // a viewer gets no ticket; no token gets none either
    let viewer = a.add_token("watcher", "viewer").await;
    let (code, v) = ticket(&a, &viewer, "con", "vnc").await;
    assert_eq!(code, 403, "{v}");
    let (code, _) = ticket(&a, "not-a-token", "con", "vnc").await;
    assert_eq!(code, 401);
    assert_eq!(vnc_clients(&dom), 0, "no refused request reached QEMU");

    // --- The serial console: a shell prompt with the guest's hostname.
    let (code, t) = ticket(&a, &a.token, "con", "serial").await;
    assert_eq!(code, 201, "{t}");
    let mut ws = open(&a, t["path"].as_str().unwrap(), None).await.unwrap();
    let (code, busy) = ticket(&a, &a.token, "con", "serial").await;
    assert_eq!(code, 409, "one serial connection at a time: {busy}");
    let seen = serial_echo(&mut ws, "serial").await;
    assert!(
        seen.contains("con:"),
        "the prompt names the guest: {seen:?}"
    );
    guest_details(&a, &mut ws).await;

    drop(ws);
    wait_for(
        "the serial console to be free",
        Duration::from_secs(10),
        || async {
            let (_, st) = a.get("/console/state/default/con").await;
            st["viewers"].as_array()?.is_empty().then_some(())
        },
    )
    .await;

    // --- The command line: `vm console` on a pipe, `vm vnc` for a desktop viewer.
    let cli = |args: &[&str]| {
        let mut c = std::process::Command::new(exe());
        c.args(args)
            .env("EDGEVIRT_SERVER", &a.url)
            .env("EDGEVIRT_TOKEN", &a.token)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c
    };
    let mut con = tokio::process::Command::from(cli(&["vm", "console", "con"]))
        .spawn()
        .unwrap();
    let mut stdin = con.stdin.take().unwrap();
    let mut stdout = con.stdout.take().unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stdin.write_all(b"\necho cli-$((6*7))\n").await.unwrap();
    let mut seen = String::new();
    let start = Instant::now();
    while !seen.contains("cli-42") {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "vm console said: {seen:?}"
        );
        let mut buf = [0u8; 4096];
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(5), stdout.read(&mut buf)).await
        {
            assert!(n > 0, "vm console ended early: {seen:?}");
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }
    stdin.write_all(&[0x1d]).await.unwrap(); // Ctrl-] leaves
    let status = tokio::time::timeout(Duration::from_secs(10), con.wait())
        .await
        .expect("vm console left on Ctrl-]")
        .unwrap();
    assert!(status.success());

    let mut vnc = tokio::process::Command::from(cli(&["vm", "vnc", "con"]))
        .spawn()
        .unwrap();
    let mut out = tokio::io::BufReader::new(vnc.stdout.take().unwrap());
    let mut line = String::new();
    use tokio::io::AsyncBufReadExt;
    tokio::time::timeout(Duration::from_secs(10), out.read_line(&mut line))
        .await
        .expect("vm vnc printed its port")
        .unwrap();
    // "VNC of default/con on 127.0.0.1:PORT: point a VNC viewer there ..."
    let addr = line
        .split(" on ")
        .nth(1)
        .and_then(|r| r.split(": ").next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut version = [0u8; 12];
    tcp.read_exact(&mut version).await.unwrap();
    assert_eq!(&version[..8], b"RFB 003.");
    tcp.write_all(b"RFB 003.008\n").await.unwrap();
    let n = tcp.read_u8().await.unwrap() as usize;
    let mut types = vec![0u8; n];
    tcp.read_exact(&mut types).await.unwrap();
    tcp.write_all(&[1]).await.unwrap();
    assert_eq!(tcp.read_u32().await.unwrap(), 0);
    tcp.write_all(&[1]).await.unwrap();
    let (vw, vh) = (
        tcp.read_u16().await.unwrap() as usize,
        tcp.read_u16().await.unwrap() as usize,
    );
    assert_eq!(
        (vw, vh),
        (w, h),
        "a desktop viewer through `vm vnc` sees the same screen"
    );
    drop(tcp);
    vnc.start_kill().unwrap();
    let _ = vnc.wait().await;

    // --- A stopped VM has no console.
    assert_eq!(a.action("con", "stop").await, 202);
    wait_for("the VMI to go", BOOT, || async {
        a.vmi("con").await.is_none().then_some(())
    })
    .await;
    let (code, v) = ticket(&a, &a.token, "con", "vnc").await;
    assert_eq!(code, 409, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("not running"),
        "{v}"
    );
}
